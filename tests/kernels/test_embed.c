/* Token + position embedding forward and backward against a float64 reference and
 * central finite differences; tokens repeat so the scatter-add is exercised. */
#include "codelets/cpu/kernels.h"
#include "kcheck.h"

/* Forward is one fp32 add per element (error <= u = 6e-8 scaled); backward sums at most
 * B*T = 26 rows per vocabulary entry: bound 26 u = 1.6e-6. 2e-6 covers both. */
#define TOL 2e-6

typedef struct {
    int B, T, C;
    const int32_t *tok;
    double *wte, *wpe, *out;
    const float *r;
} em_ctx;

static void ref_forward(em_ctx *c)
{
    for (int b = 0; b < c->B; b++)
        for (int t = 0; t < c->T; t++)
            for (int i = 0; i < c->C; i++)
                c->out[((int64_t)b * c->T + t) * c->C + i] =
                    c->wte[(int64_t)c->tok[b * c->T + t] * c->C + i] + c->wpe[(int64_t)t * c->C + i];
}
static double ref_loss(void *p)
{
    em_ctx *c = p;
    ref_forward(c);
    return kc_project(c->out, c->r, (int64_t)c->B * c->T * c->C);
}

static void run_case(int B, int T, int C, int V, int Tmax, uint64_t seed)
{
    char what[160];
    int64_t n = (int64_t)B * T * C, nte = (int64_t)V * C, npe = (int64_t)Tmax * C;
    kc_seed(seed);
    int32_t *tok = kc_alloc(sizeof(int32_t) * (size_t)B * T);
    for (int i = 0; i < B * T; i++)
        tok[i] = (int32_t)(kc_next() % (uint64_t)V);
    float *wte = KC_F(nte), *wpe = KC_F(npe), *r = KC_F(n), *out = KC_F(n);
    float *dte = KC_F(nte), *dpe = KC_F(npe), *bte = KC_F(nte), *bpe = KC_F(npe);
    double *ted = KC_D(nte), *ped = KC_D(npe), *od = KC_D(n), *gte = KC_D(nte);
    double *gpe = KC_D(npe), *want = KC_D(nte + npe);
    kc_fill(wte, nte, -1, 1);
    kc_fill(wpe, npe, -1, 1);
    kc_fill(r, n, -1, 1);
    kc_fill(bte, nte, -1, 1);
    kc_fill(bpe, npe, -1, 1);
    kc_to_double(ted, wte, nte);
    kc_to_double(ped, wpe, npe);
    em_ctx c = {B, T, C, tok, ted, ped, od, r};
    ref_forward(&c);
#define TAG(t) (snprintf(what, sizeof what, "embed B%d T%d C%d V%d seed%llu %s", B, T, C, V, \
                         (unsigned long long)seed, t), what)
    kc_fill_nan(out, n);
    sp_embed_forward(out, tok, wte, wpe, B, T, C);
    kc_check(TAG("forward"), out, od, n, TOL);

    kc_fd_grad(gte, ted, nte, ref_loss, &c);
    kc_fd_grad(gpe, ped, npe, ref_loss, &c);
    /* Always accumulates: start from non-zero buffers (wpe rows >= T stay untouched). */
    memcpy(dte, bte, sizeof(float) * (size_t)nte);
    memcpy(dpe, bpe, sizeof(float) * (size_t)npe);
    sp_embed_backward(dte, dpe, r, tok, B, T, C);
    kc_plus(want, bte, gte, nte);
    kc_check(TAG("dwte (accumulated) vs finite differences"), dte, want, nte, TOL);
    kc_plus(want, bpe, gpe, npe);
    kc_check(TAG("dwpe (accumulated) vs finite differences"), dpe, want, npe, TOL);
#undef TAG
    free(tok); free(wte); free(wpe); free(r); free(out); free(dte); free(dpe); free(bte);
    free(bpe); free(ted); free(ped); free(od); free(gte); free(gpe); free(want);
}

int main(void)
{
    kc_start();
    for (uint64_t seed = 1; seed <= 3; seed++) {
        run_case(2, 13, 7, 7, 13, seed);
        run_case(3, 5, 13, 11, 9, seed); /* wpe has more rows than T */
        run_case(1, 1, 33, 3, 1, seed);
    }
    return kc_finish("test_kernels_embed");
}
