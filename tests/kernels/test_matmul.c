/* sp_matmul_forward / backward_a / backward_b against a float64 reference and central
 * finite differences, for all four transpose combinations, awkward sizes, acc 0 and 1. */
#include "codelets/cpu/gemm_impl.h"
#include "codelets/cpu/kernels.h"
#include "codelets/cpu/vec_impl.h"
#include "kcheck.h"

/* fp32 sums of K <= 37 products of values in [-1,1): the worst-case rounding bound is
 * K u = 37 * 6e-8 = 2.2e-6 (observed: 3e-7). 5e-6 stays above the bound on any BLAS
 * blocking, yet any wrong index or missing term gives errors of order 1e-2..1. */
#define TOL 5e-6

typedef struct {
    int M, Nc, K, ta, tb;
    double *a, *b, *out;
    const float *r;
} mm_ctx;

static void ref_forward(mm_ctx *c)
{
    for (int i = 0; i < c->M; i++)
        for (int j = 0; j < c->Nc; j++) {
            double s = 0.0;
            for (int k = 0; k < c->K; k++) {
                double av = c->ta ? c->a[(int64_t)k * c->M + i] : c->a[(int64_t)i * c->K + k];
                double bv = c->tb ? c->b[(int64_t)j * c->K + k] : c->b[(int64_t)k * c->Nc + j];
                s += av * bv;
            }
            c->out[(int64_t)i * c->Nc + j] = s;
        }
}

static double ref_loss(void *p)
{
    mm_ctx *c = p;
    ref_forward(c);
    return kc_project(c->out, c->r, (int64_t)c->M * c->Nc);
}

static void run_case(int M, int Nc, int K, int ta, int tb, uint64_t seed)
{
    char what[160];
    int64_t na = (int64_t)M * K, nb = (int64_t)K * Nc, no = (int64_t)M * Nc;
    kc_seed(seed);
    float *a = KC_F(na), *b = KC_F(nb), *r = KC_F(no), *out = KC_F(no);
    float *base_o = KC_F(no), *da = KC_F(na), *db = KC_F(nb);
    float *base_a = KC_F(na), *base_b = KC_F(nb);
    double *ad = KC_D(na), *bd = KC_D(nb), *outd = KC_D(no), *want = KC_D(no + na + nb);
    double *ga = KC_D(na), *gb = KC_D(nb);
    kc_fill(a, na, -1, 1);
    kc_fill(b, nb, -1, 1);
    kc_fill(r, no, -1, 1);
    kc_fill(base_o, no, -1, 1);
    kc_fill(base_a, na, -1, 1);
    kc_fill(base_b, nb, -1, 1);
    kc_to_double(ad, a, na);
    kc_to_double(bd, b, nb);
    mm_ctx c = {M, Nc, K, ta, tb, ad, bd, outd, r};
    ref_forward(&c);
#define TAG(s) (snprintf(what, sizeof what, "matmul M%d N%d K%d ta%d tb%d seed%llu %s", M, Nc, \
                         K, ta, tb, (unsigned long long)seed, s), what)

    kc_fill_nan(out, no); /* acc=0 must not read the old contents */
    sp_matmul_forward(out, a, b, M, Nc, K, ta, tb, 0);
    kc_check(TAG("forward"), out, outd, no, TOL);
    memcpy(out, base_o, sizeof(float) * (size_t)no);
    sp_matmul_forward(out, a, b, M, Nc, K, ta, tb, 1);
    kc_plus(want, base_o, outd, no);
    kc_check(TAG("forward acc=1"), out, want, no, TOL);

    kc_fd_grad(ga, ad, na, ref_loss, &c);
    kc_fd_grad(gb, bd, nb, ref_loss, &c);

    kc_fill_nan(da, na);
    sp_matmul_backward_a(da, r, b, M, Nc, K, ta, tb, 0);
    kc_check(TAG("backward_a vs finite differences"), da, ga, na, TOL);
    memcpy(da, base_a, sizeof(float) * (size_t)na);
    sp_matmul_backward_a(da, r, b, M, Nc, K, ta, tb, 1);
    kc_plus(want, base_a, ga, na);
    kc_check(TAG("backward_a acc=1"), da, want, na, TOL);

    kc_fill_nan(db, nb);
    sp_matmul_backward_b(db, r, a, M, Nc, K, ta, tb, 0);
    kc_check(TAG("backward_b vs finite differences"), db, gb, nb, TOL);
    memcpy(db, base_b, sizeof(float) * (size_t)nb);
    sp_matmul_backward_b(db, r, a, M, Nc, K, ta, tb, 1);
    kc_plus(want, base_b, gb, nb);
    kc_check(TAG("backward_b acc=1"), db, want, nb, TOL);
#undef TAG
    free(a); free(b); free(r); free(out); free(base_o); free(da); free(db);
    free(base_a); free(base_b); free(ad); free(bd); free(outd); free(want); free(ga); free(gb);
}

/* The contract's exact bits (gemm_impl.h): out[i][j] is the sequential chain of fmaf over
 * k from out (acc) or 0. Sizes past a block of K (256, 768) and of rows (384),
 * tiles of every height (4, 6, 8, 24) and width (8, 16, 32), and the narrow tile. */
static SP_NOFMA void naive(float *out, const float *a, const float *b, int M, int Nc, int K,
                           int ta, int tb, int acc)
{
    for (int i = 0; i < M; i++)
        for (int j = 0; j < Nc; j++) {
            float s = acc ? out[(int64_t)i * Nc + j] : 0.0f;
            for (int k = 0; k < K; k++) {
                float av = ta ? a[(int64_t)k * M + i] : a[(int64_t)i * K + k];
                float bv = tb ? b[(int64_t)j * K + k] : b[(int64_t)k * Nc + j];
                s = fmaf(av, bv, s);
            }
            out[(int64_t)i * Nc + j] = s;
        }
}

/* combos: bit ta * 4 + tb * 2 + acc set for each layout checked */
static void exact_bits_of(int M, int Nc, int K, unsigned combos)
{
    float *a = KC_F((int64_t)M * K), *b = KC_F((int64_t)K * Nc);
    float *got = KC_F((int64_t)M * Nc), *want = KC_F((int64_t)M * Nc);
    kc_seed((uint64_t)(M * 1000 + Nc * 10 + K));
    kc_fill(a, (int64_t)M * K, -1, 1);
    kc_fill(b, (int64_t)K * Nc, -1, 1);
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++)
            for (int acc = 0; acc < 2; acc++) {
                if (!(combos >> (ta * 4 + tb * 2 + acc) & 1)) continue;
                char what[128];
                kc_fill(got, (int64_t)M * Nc, -1, 1);
                memcpy(want, got, sizeof(float) * (size_t)M * Nc);
                sp_matmul_forward(got, a, b, M, Nc, K, ta, tb, acc);
                naive(want, a, b, M, Nc, K, ta, tb, acc);
                snprintf(what, sizeof what, "matmul %dx%dx%d ta%d tb%d acc%d: the bits of the "
                         "sequential sum", M, Nc, K, ta, tb, acc);
                kc_expect(memcmp(got, want, sizeof(float) * (size_t)M * Nc) == 0, what);
            }
    free(a), free(b), free(got), free(want);
}

static void exact_bits(int M, int Nc, int K) { exact_bits_of(M, Nc, K, 0xffu); }

/* sp_matmul_forward_bias against the naive chain, then + bias in a second pass, on every
 * sgemm path this CPU has: the bias is added as each tile is stored (full tiles in the
 * micro-kernel, edge tiles as they are copied out, the few-rows product as it is
 * transposed back), only after the last block of k. */
static SP_NOFMA void add_bias(float *out, const float *bias, int M, int Nc)
{
    for (int i = 0; i < M; i++)
        for (int j = 0; j < Nc; j++) out[(int64_t)i * Nc + j] = out[(int64_t)i * Nc + j] + bias[j];
}

static void bias_bits(int M, int Nc, int K)
{
    float *a = KC_F((int64_t)M * K + 1), *b = KC_F((int64_t)K * Nc + 1), *bias = KC_F(Nc);
    float *got = KC_F((int64_t)M * Nc), *want = KC_F((int64_t)M * Nc);
    kc_seed((uint64_t)(M * 7919 + Nc * 31 + K));
    kc_fill(a, (int64_t)M * K, -1, 1);
    kc_fill(b, (int64_t)K * Nc, -1, 1);
    kc_fill(bias, Nc, -1, 1);
    bias[0] = -0.0f; /* 0 + -0 is +0: the add happens even on an empty product */
    const int path = sp_gemm_path();
    for (int p = 0; p < SP_GEMM_NPATHS; p++) {
        if (sp_gemm_set_path(p) != 0) continue;
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++) {
                char what[160];
                kc_fill_nan(got, (int64_t)M * Nc);
                sp_matmul_forward_bias(got, a, b, bias, M, Nc, K, ta, tb);
                naive(want, a, b, M, Nc, K, ta, tb, 0);
                add_bias(want, bias, M, Nc);
                snprintf(what, sizeof what, "matmul + bias %dx%dx%d ta%d tb%d on the %s path: "
                         "the bits of the product, then the bias add", M, Nc, K, ta, tb,
                         sp_gemm_path_name(p));
                kc_expect(memcmp(got, want, sizeof(float) * (size_t)M * Nc) == 0, what);
            }
    }
    sp_gemm_set_path(path);
    free(a), free(b), free(bias), free(got), free(want);
}

int main(void)
{
    kc_start();
    sp_kernels_init();
    static const int sizes[][3] = {{7, 13, 33}, {13, 37, 7}, {33, 7, 13}, {1, 1, 1},
                                   {1, 37, 13}, {37, 1, 5}};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++)
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++)
                for (uint64_t seed = 1; seed <= 3; seed++)
                    run_case(sizes[s][0], sizes[s][1], sizes[s][2], ta, tb, seed);

    /* Each shape's exact bits, and with a bias added in the product's last store. Large
     * enough for the packed path (gemm.c: a and b packed by 8 x 8 transposes): two blocks
     * of k (256 deep; 768 on AVX-512 where a is not packed), edges of every kind, the narrow tile (24 x 16 on
     * AVX-512) packed; few rows against a wide transposed b, which gemm.c runs as c^T =
     * b a^T (m <= 96, n >= 4 m, k >= 64), for every tile edge and two blocks of k; an
     * empty product. Past 1.5 blocks of rows (MC 384), b's panels are packed once for
     * all of them, NC_SHARED_BYTES (1 MB) of them at a time: two blocks of rows; two blocks
     * of rows and of k. Two such chunks, the second an edge, take 150M multiply-adds:
     * only the layers' forward (tb) and dW (ta, acc) layouts there, 1060 columns 260 deep
     * (992, then 68; with a packed 256 deep, 1024, then 36). */
    static const int shapes[][3] = {{37, 45, 300}, {50, 13, 61},   {25, 70, 9},
                                    {397, 203, 263}, {397, 75, 781}, {61, 40, 1000},
                                    {397, 13, 781}, {64, 300, 300}, {13, 520, 129},
                                    {90, 803, 70},  {37, 45, 30},   {3, 5, 0},
                                    {580, 1060, 40}, {590, 40, 800}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        exact_bits(shapes[s][0], shapes[s][1], shapes[s][2]);
        bias_bits(shapes[s][0], shapes[s][1], shapes[s][2]);
    }
    exact_bits_of(580, 1060, 260, 1u << 2 | 1u << 5);

    /* K = 0: the product is empty; acc=0 gives zeros, acc=1 leaves out unchanged. */
    float out[6], keep[6];
    kc_fill_nan(out, 6);
    sp_matmul_forward(out, NULL, NULL, 2, 3, 0, 0, 0, 0);
    double zeros[6] = {0};
    kc_check("matmul K=0 acc=0 gives zeros", out, zeros, 6, 0.0);
    kc_fill(out, 6, -1, 1);
    memcpy(keep, out, sizeof out);
    sp_matmul_forward(out, NULL, NULL, 2, 3, 0, 1, 1, 1);
    kc_expect(memcmp(out, keep, sizeof out) == 0, "matmul K=0 acc=1 leaves out unchanged");
    return kc_finish("test_kernels_matmul");
}
