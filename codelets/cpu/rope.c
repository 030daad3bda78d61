/* Rotary position embeddings (kernels.h: sp_rope_forward). The angles of one position are
 * made once per row of positions, in double, and shared by the batch and the heads. */
#include "codelets/cpu/kernels.h"

#include <math.h>

void sp_rope_forward(float *out, const float *x, int B, int T, int D, int hs, int period,
                     int rotated, float theta, int inverse, int acc)
{
    if (B <= 0 || T <= 0 || D <= 0 || hs <= 1) return;
    const int half = hs / 2, nh = D / hs;
    float cs[SP_ROPE_MAX_HEAD]; /* cos then sin of one position's angles */
    for (int t = 0; t < T; t++) {
        for (int i = 0; i < half; i++) {
            const double a = (double)t * pow((double)theta, -2.0 * i / hs);
            cs[i] = (float)cos(a);
            cs[half + i] = inverse ? -(float)sin(a) : (float)sin(a);
        }
        for (int b = 0; b < B; b++) {
            const float *xr = x + ((int64_t)b * T + t) * D;
            float *o = out + ((int64_t)b * T + t) * D;
            for (int j = 0; j < nh; j++) {
                const float *u = xr + (int64_t)j * hs, *w = u + half;
                float *ou = o + (int64_t)j * hs, *ow = ou + half;
                if (j % period >= rotated) {
                    for (int i = 0; i < hs; i++) ou[i] = acc ? ou[i] + u[i] : u[i];
                    continue;
                }
                for (int i = 0; i < half; i++) {
                    const float c = cs[i], s = cs[half + i];
                    const float ru = u[i] * c - w[i] * s, rw = w[i] * c + u[i] * s;
                    ou[i] = acc ? ou[i] + ru : ru;
                    ow[i] = acc ? ow[i] + rw : rw;
                }
            }
        }
    }
}
