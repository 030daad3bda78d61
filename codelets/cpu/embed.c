/* Token + position embedding: forward gathers rows of wte and wpe, backward scatters
 * dout into dwte by token and sums it into dwpe, always accumulating, in (b, t) order.
 * The vocab-parallel embedding likewise, for the rows of wte one rank holds. */
#include "codelets/cpu/kernels.h"

/* V is not passed, so tokens cannot be range-checked here: the caller validates them. */
void sp_embed_forward(float *restrict out, const int32_t *restrict tokens,
                      const float *restrict wte, const float *restrict wpe, int B, int T, int C)
{
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            float *o = out + ((int64_t)b * T + t) * C;
            const float *we = wte + (int64_t)tokens[(int64_t)b * T + t] * C;
            const float *wp = wpe + (int64_t)t * C;
            for (int c = 0; c < C; c++)
                o[c] = we[c] + wp[c];
        }
}

/* dwte and dwpe may not alias each other (a tied wpe/wte is not a thing in GPT-2). */
void sp_embed_backward(float *restrict dwte, float *restrict dwpe, const float *restrict dout,
                       const int32_t *restrict tokens, int B, int T, int C)
{
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            const float *d = dout + ((int64_t)b * T + t) * C;
            float *dwe = dwte + (int64_t)tokens[(int64_t)b * T + t] * C;
            float *dwp = dwpe + (int64_t)t * C;
            for (int c = 0; c < C; c++) {
                dwe[c] += d[c];
                dwp[c] += d[c];
            }
        }
}

void sp_embed_vocab_forward(float *restrict out, const int32_t *restrict tokens,
                            const float *restrict wte, int N, int C, int64_t lo, int64_t rows)
{
    for (int64_t i = 0; i < N; i++) {
        float *o = out + i * C;
        int64_t r = (int64_t)tokens[i] - lo;
        if (r < 0 || r >= rows) {
            for (int c = 0; c < C; c++) o[c] = 0.0f;
            continue;
        }
        const float *we = wte + r * C;
        for (int c = 0; c < C; c++) o[c] = we[c];
    }
}

void sp_embed_vocab_backward(float *restrict dwte, const float *restrict dout,
                             const int32_t *restrict tokens, int N, int C, int64_t lo,
                             int64_t rows)
{
    for (int64_t i = 0; i < N; i++) {
        int64_t r = (int64_t)tokens[i] - lo;
        if (r < 0 || r >= rows) continue;
        const float *d = dout + i * C;
        float *dwe = dwte + r * C;
        for (int c = 0; c < C; c++) dwe[c] += d[c];
    }
}
