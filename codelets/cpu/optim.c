/* Optimizer kernels: AdamW (PyTorch's definition, decoupled weight decay) and the sum
 * of squares used for the global gradient norm. */
#include "codelets/cpu/kernels.h"

#include <math.h>

#include "codelets/cpu/vec_impl.h"

/* Per element, in PyTorch's order: g = grad * grad_scale; p -= lr wd p;
 * m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
 * p -= (lr / bc1) m / (sqrt(v) / sqrt(bc2) + eps), bc_i = 1 - beta_i^t. */
/* Vectorized (every operation rounds per element as in scalar C: the same bits in every
 * clone); without errno, which no square root here can set (v >= 0), since sqrtf's errno
 * path kept GCC from vectorizing the loop at all: 3.5% of a large-config step in scalar
 * square roots and divisions. */
SP_VEC_FN
void sp_adamw_update(float *restrict param, float *restrict m, float *restrict v,
                     const float *restrict grad, int64_t n, float lr, float beta1, float beta2,
                     float eps, float weight_decay, float grad_scale, int t)
{
    /* Bias corrections in double: 1 - beta^t loses digits in float for beta2 near 1. */
    const float step = (float)((double)lr / (1.0 - pow((double)beta1, (double)t)));
    const float rbc2 = (float)(1.0 / sqrt(1.0 - pow((double)beta2, (double)t)));
    const float decay = 1.0f - lr * weight_decay;
    for (int64_t i = 0; i < n; i++) {
        float g = grad[i] * grad_scale;
        float mi = beta1 * m[i] + (1.0f - beta1) * g;
        float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
        m[i] = mi;
        v[i] = vi;
        param[i] = param[i] * decay - step * mi / (sqrtf(vi) * rbc2 + eps);
    }
}

double sp_sum_squares(const float *restrict x, int64_t n)
{
    /* Four partial sums in a fixed order: deterministic, and vectorizable. */
    double s[4] = {0, 0, 0, 0};
    int64_t i = 0;
    for (; i + 4 <= n; i += 4)
        for (int j = 0; j < 4; j++)
            s[j] += (double)x[i + j] * (double)x[i + j];
    double r = (s[0] + s[2]) + (s[1] + s[3]);
    for (; i < n; i++)
        r += (double)x[i] * (double)x[i];
    return r;
}
