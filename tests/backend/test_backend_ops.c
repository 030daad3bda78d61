/* Every entry of every device kind's kernel table (include/starpipe/backend.h), run through
 * the table on the device's own memory (the kind's alloc and copy, its ctx), against the
 * CPU table (sp_backend_cpu) on the same inputs: bit for bit where the kind promises the
 * CPU's bits (cpu_bits), else within the tolerance stated per entry below. Each device call
 * runs twice from the same state and must give the same bits and code; an output that acc
 * = 0 assigns starts as NaN, so a kernel that reads it shows. Sizes are awkward on purpose:
 * 0, 1, primes, not multiples of a warp, a block or a vector, rows longer than a block,
 * acc 0 and 1, every transpose, every precision (SP_PREC_BF16, A16, B16), grouped-query
 * attention, and the index errors (SP_BACKEND_BAD_INDEX) that the CPU table promises.
 *
 * The kinds: OPS_KINDS(), the registry's (sp_device_kinds, codelets/devices.c) by default;
 * tests/gpu/emu builds this file with its own kind, the CUDA table on the CPU emulation.
 * With no kind that has a device, it exits 77 (skipped) and says so. A failure names the
 * kind, the entry, the sizes, the output and its first differing element. KC_VERBOSE=1
 * prints every comparison's error; OPS_SEED=n other random inputs (37 by default).
 *
 * Tolerances (a kind without cpu_bits), from tests/gpu/test_cuda_kernels.c where these
 * checks were first made: max|dev - cpu| / max(1, max|cpu|) <= TOL = 1e-5 for every
 * entry (each reduction sums at most a few thousand fp32 terms of magnitude <= ~15, so
 * two summation orders differ by ~1e-6; the elementwise entries, embed, AdamW and the
 * cross-entropy's gradient by an ulp (FMA) or not at all, GELU not at all (bitwise); the
 * bf16 products multiply the same bf16 values exactly on both sides); 0 (the same
 * values) for maximum, the vocab-parallel embedding, the rows' maxima and the target
 * logits; bitwise for to_bf16, copy, set, zero and reduce_replicas (the table promises
 * copy and the CUDA kernels the others; set and zero must leave the rest of the buffer
 * as it was); sum_squares within 1e-9 in double; bf16 attention TOL_BF16_OUT, TOL_BF16,
 * TOL_BF16_DX and TOL_BF16_WIDE (see there). */
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codelets/cpu/kernels.h"
#include "starpipe/backend.h"
#include "starpipe/device.h"
#include "tests/kernels/kcheck.h"

/* the kinds under test: the registry's, or a build's own (tests/gpu/emu/emu_kind.c) */
#ifndef OPS_KINDS
#define OPS_KINDS sp_device_kinds
#endif
const sp_device_kind *const *OPS_KINDS(void);

#define TOL 1e-5
#define TOL_BF16_OUT 4e-3
#define TOL_BF16 1e-4
#define TOL_BF16_DX 1e-3
/* bf16 attention with heads wider than a device's bf16 kernels take: the CUDA table runs
 * its fp32 kernels there (codelets/cuda/backend.c), within bf16's rounding of the CPU's
 * bf16 attention, not by its rounding points: a few bf16 ulps (2^-8) of the scores */
#define TOL_BF16_WIDE 2e-2
#define TOL_SUMSQ 1e-9
/* how a buffer is compared, besides a tolerance >= 0 */
#define BITS (-1.0)     /* bit for bit */
#define NAN_BOTH (-2.0) /* NaN on both sides (a loss with a bad target) */
#define NOCMP (-3.0)    /* not by end(): the test compares it itself */

/* ---- the entries under test, by field: adding an entry to sp_backend without adding it
 * here fails check_entry_list (the count), and one listed but never run fails the kind */
#define ENTRY(f) { offsetof(sp_backend, f), #f }
static const struct {
    size_t off;
    const char *name;
} entries[] = {
    ENTRY(matmul),        ENTRY(matmul_bias),       ENTRY(bias_add),          ENTRY(add),           ENTRY(maximum),
    ENTRY(scale),         ENTRY(gelu),              ENTRY(relu),          ENTRY(layernorm),
    ENTRY(rmsnorm),       ENTRY(rope),              ENTRY(swiglu),        ENTRY(embed),
    ENTRY(attention),     ENTRY(cross_entropy),     ENTRY(sum),           ENTRY(embed_vocab),
    ENTRY(vocab_ce_max),  ENTRY(vocab_ce_exp),      ENTRY(vocab_ce_loss), ENTRY(matmul_da),
    ENTRY(matmul_db),     ENTRY(bias_db),           ENTRY(gelu_dx),       ENTRY(relu_dx),
    ENTRY(layernorm_dx),  ENTRY(layernorm_dparams), ENTRY(rmsnorm_dx),    ENTRY(rmsnorm_dweight),
    ENTRY(embed_vocab_dwte), ENTRY(embed_dparams),  ENTRY(attention_dx),  ENTRY(swiglu_dx),
    ENTRY(cross_entropy_dx), ENTRY(sum_dx),         ENTRY(set),           ENTRY(zero),
    ENTRY(to_bf16),       ENTRY(adamw),             ENTRY(sum_squares),   ENTRY(copy),
    ENTRY(reduce_replicas),
};
#define NENTRIES ((int)(sizeof entries / sizeof *entries))

/* ---- the kind under test */
static struct {
    const sp_device_kind *kind;
    void *ctx;
    int bits;                           /* kind->cpu_bits */
    unsigned char hit[sizeof(sp_backend)]; /* entries run on the kind's table, by offset */
    unsigned char cpu_hit[sizeof(sp_backend)];
    struct {
        char what[48];
        double worst;
    } worst[96];
    int nworst;
} D;

static void fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void fail(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "FAIL: %s: ", D.kind ? D.kind->name : "test_backend_ops");
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    kc_failures++;
}
/* a check that counts; its message only on failure */
#define EXPECT(cond, ...) ((void)(kc_checks++), (cond) ? (void)0 : fail(__VA_ARGS__))

/* ---- one call of one entry on both tables: its buffers, each with its contents before
 * the call (init), the CPU table's copy (cpu), device memory (dev) and the device's two
 * results (got) */
enum { T_F32, T_I32, T_U16, T_F64 };
static const size_t type_bytes[] = { 4, 4, 2, 8 };
#define MAXB 16
typedef struct {
    const char *name;
    int type, out; /* out: compared after the call */
    double tol;
    int64_t n;
    size_t bytes;
    void *init, *cpu, *dev, *got[2];
} buf;
typedef struct {
    const char *entry;
    char label[160];
    buf b[MAXB];
    int nb;
    int side;        /* -1 the CPU table, 0 and 1 the device's two runs */
    int rc[3];       /* each side's code */
    int cpu_rc;      /* the code the CPU table must return (0, SP_BACKEND_BAD_INDEX) */
    int cpu_only;    /* an input the kind's table may not be given (an index it cannot check) */
} kcase;

static void *xalloc(size_t bytes) { return kc_alloc(bytes); }
static float *rnd(int64_t n, double lo, double hi)
{
    float *x = xalloc(sizeof(float) * (size_t)n);
    kc_fill(x, n, lo, hi);
    return x;
}
static float uni(double lo, double hi)
{
    return (float)(lo + (hi - lo) * 0.5 * (kc_uniform() + 1.0));
}
/* an output's contents before an acc call: random with acc, NaN without (never read) */
static float *acc_init(int64_t n, int acc)
{
    float *x = acc ? rnd(n, -1, 1) : xalloc(sizeof(float) * (size_t)n);
    if (!acc) kc_fill_nan(x, n);
    return x;
}

static void begin(kcase *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void begin(kcase *c, const char *fmt, ...)
{
    memset(c, 0, sizeof *c);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->label, sizeof c->label, fmt, ap);
    va_end(ap);
}

static int add_buf(kcase *c, const char *name, int type, int out, double tol, const void *init,
                   int64_t n)
{
    if (c->nb >= MAXB) {
        fprintf(stderr, "FATAL: %s: more than %d buffers\n", c->label, MAXB);
        exit(1);
    }
    buf *b = &c->b[c->nb];
    *b = (buf){ .name = name, .type = type, .out = out, .tol = tol, .n = n };
    b->bytes = type_bytes[type] * (size_t)n;
    b->init = xalloc(b->bytes);
    if (init)
        memcpy(b->init, init, b->bytes);
    else if (type == T_F32)
        kc_fill_nan(b->init, n);
    else
        memset(b->init, 0xff, b->bytes); /* NaN as doubles, -1 as integers */
    b->cpu = xalloc(b->bytes);
    for (int r = 0; r < 2 && out; r++)
        b->got[r] = xalloc(b->bytes);
    if (!(b->dev = D.kind->alloc(b->bytes ? b->bytes : 1))) {
        fprintf(stderr, "FATAL: %s: alloc of %zu bytes failed\n", D.kind->name, b->bytes);
        exit(1);
    }
    return c->nb++;
}
/* inputs (never compared), outputs (init: contents before the call, NULL: NaN), scratch */
#define IN_F(c, x, n) add_buf(c, #x, T_F32, 0, 0, x, n)
#define IN_I(c, x, n) add_buf(c, #x, T_I32, 0, 0, x, n)
#define IN_U(c, x, n) add_buf(c, #x, T_U16, 0, 0, x, n)
#define OUT_F(c, name, init, n, tol) add_buf(c, name, T_F32, 1, tol, init, n)
#define SCRATCH(c, n) add_buf(c, "scratch", T_F32, 0, 0, NULL, n)

/* a buffer as the current side's table sees it */
#define P(c, k) ((c)->side < 0 ? (c)->b[k].cpu : (c)->b[k].dev)
#define F(c, k) ((float *)P(c, k))
#define I(c, k) ((int32_t *)P(c, k))
#define U(c, k) ((uint16_t *)P(c, k))
#define SIDE(c, on_cpu, on_dev) ((c)->side < 0 ? (on_cpu) : (on_dev))

/* setup failures end the test: they are not the table's results */
static void copy_dev(void *dst, const void *src, size_t bytes, int to_host)
{
    int rc = bytes ? D.kind->copy(0, dst, src, bytes, to_host) : 0;
    if (rc) {
        fprintf(stderr, "FATAL: %s: copy %s the device (%zu bytes): %s\n", D.kind->name,
                to_host ? "from" : "to", bytes, D.kind->error(rc));
        exit(1);
    }
}
static void upload(kcase *c)
{
    for (int k = 0; k < c->nb; k++)
        copy_dev(c->b[k].dev, c->b[k].init, c->b[k].bytes, 0);
}
static void download(kcase *c, int r)
{
    int rc = D.kind->sync(D.ctx);
    if (rc) fail("%s %s: sync after the call: %s", c->entry, c->label, D.kind->error(rc));
    for (int k = 0; k < c->nb; k++)
        if (c->b[k].out) copy_dev(c->b[k].got[r], c->b[k].dev, c->b[k].bytes, 1);
}
/* The sides in turn: the CPU table on host copies of init, then the kind's twice, each from
 * init uploaded afresh. */
static int side_next(kcase *c)
{
    if (c->side == -2) {
        for (int k = 0; k < c->nb; k++)
            memcpy(c->b[k].cpu, c->b[k].init, c->b[k].bytes);
        c->side = -1;
        return 1;
    }
    if (c->side >= 0) download(c, c->side);
    if (c->side == 1 || c->cpu_only) {
        c->side = 2;
        return 0;
    }
    upload(c);
    c->side++;
    return 1;
}
static const sp_backend *table(const kcase *c, size_t off)
{
    (c->side < 0 ? D.cpu_hit : D.hit)[off] = 1;
    return c->side < 0 ? sp_backend_cpu() : D.kind->kernels;
}
/* Runs entry f with these arguments on every side: the CPU table's, then the kind's twice. */
#define RUN(c, f, ...)                                                                         \
    for ((c)->entry = #f, (c)->side = -2; side_next(c);)                                      \
    (c)->rc[(c)->side + 1] =                                                                  \
        table(c, offsetof(sp_backend, f))->f((c)->side < 0 ? NULL : D.ctx, __VA_ARGS__)

/* ---- comparisons */
static void note_worst(const kcase *c, const char *name, double e)
{
    char what[48];
    snprintf(what, sizeof what, "%s(%s)", c->entry, name);
    int i = 0;
    while (i < D.nworst && strcmp(D.worst[i].what, what)) i++;
    if (i == D.nworst) {
        if (D.nworst == (int)(sizeof D.worst / sizeof *D.worst)) return;
        strcpy(D.worst[D.nworst++].what, what);
    }
    if (!(e <= D.worst[i].worst)) D.worst[i].worst = e;
}
static double elem(int type, const void *p, int64_t i)
{
    switch (type) {
    case T_F32: return ((const float *)p)[i];
    case T_I32: return ((const int32_t *)p)[i];
    case T_U16: return ((const uint16_t *)p)[i];
    default: return ((const double *)p)[i];
    }
}
static void hex(char *s, size_t n, int type, const void *p, int64_t i)
{
    uint64_t u = 0;
    memcpy(&u, (const char *)p + type_bytes[type] * (size_t)i, type_bytes[type]);
    snprintf(s, n, "0x%0*llx (%.9g)", 2 * (int)type_bytes[type], (unsigned long long)u,
             elem(type, p, i));
}
/* got (n elements from element off of buffer k) against want: bits, or the scaled error */
static void compare(const kcase *c, const buf *b, const char *name, int64_t off, int64_t n,
                    const void *got, const void *want, double tol, const char *against)
{
    const size_t eb = type_bytes[b->type];
    got = (const char *)got + eb * (size_t)off;
    want = (const char *)want + eb * (size_t)off;
    char g[64], w[64];
    kc_checks++;
    if (tol == NAN_BOTH) {
        for (int64_t i = 0; i < n; i++)
            if (!isnan(elem(b->type, got, i)) || !isnan(elem(b->type, want, i))) {
                hex(g, sizeof g, b->type, got, i), hex(w, sizeof w, b->type, want, i);
                fail("%s %s: %s: element %lld: got %s and %s: NaN on both sides wanted",
                     c->entry, c->label, name, (long long)(off + i), g, w);
                return;
            }
        return;
    }
    if (tol == BITS || b->type == T_I32 || b->type == T_U16) {
        for (int64_t i = 0; i < n; i++)
            if (memcmp((const char *)got + eb * (size_t)i, (const char *)want + eb * (size_t)i,
                       eb)) {
                hex(g, sizeof g, b->type, got, i), hex(w, sizeof w, b->type, want, i);
                fail("%s %s: %s %s: element %lld of %lld: got %s, want %s: bits differ", c->entry,
                     c->label, name, against, (long long)(off + i), (long long)b->n, g, w);
                return;
            }
        return;
    }
    double e = 0.0, m = 1.0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs(elem(b->type, got, i) - elem(b->type, want, i));
        if (!(d <= e)) e = isnan(d) ? INFINITY : d;
        if (fabs(elem(b->type, want, i)) > m) m = fabs(elem(b->type, want, i));
    }
    note_worst(c, name, e / m);
    if (kc_verbose)
        printf("  %s %s: %s: error %.3g (tol %.0e)\n", c->entry, c->label, name, e / m, tol);
    if (e / m <= tol) return;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs(elem(b->type, got, i) - elem(b->type, want, i));
        if (!(d <= tol * m)) {
            hex(g, sizeof g, b->type, got, i), hex(w, sizeof w, b->type, want, i);
            fail("%s %s: %s %s: element %lld of %lld: got %s, want %s: |got - want| %.3g > "
                 "tol %.0e x max(1, max|want|) %.3g (worst scaled error %.3g)", c->entry,
                 c->label, name, against, (long long)(off + i), (long long)b->n, g, w, d, tol, m,
                 e / m);
            return;
        }
    }
}
/* the tolerance a buffer is held to on this kind */
static double held_to(double tol) { return D.bits && tol != NOCMP ? BITS : tol; }
/* Part of output k (n elements from off, named name) against the CPU table's. */
static void check_part(const kcase *c, int k, int64_t off, int64_t n, double tol, const char *name)
{
    compare(c, &c->b[k], name, off, n, c->b[k].got[0], c->b[k].cpu, held_to(tol),
            "vs the CPU table");
}

/* The codes, the two runs' bits, and each output against the CPU table's; frees the case. */
static void end(kcase *c)
{
    const int cpu = c->rc[0], d0 = c->rc[1], d1 = c->rc[2];
    EXPECT(cpu == c->cpu_rc, "%s %s: the CPU table returned %d (%s), not %d", c->entry, c->label,
           cpu, sp_backend_cpu()->status_string(cpu), c->cpu_rc);
    int cmp = !c->cpu_only;
    if (cmp) {
        EXPECT(d0 == d1, "%s %s: the two runs returned %d and %d", c->entry, c->label, d0, d1);
        /* a kind without the CPU's bits may leave an index unchecked (backend.h) */
        int ok = D.bits ? d0 == cpu : d0 == 0 || (d0 == cpu && cpu == SP_BACKEND_BAD_INDEX);
        EXPECT(ok, "%s %s: returned %d (%s), the CPU table %d", c->entry, c->label, d0,
               D.kind->kernels->status_string(d0), cpu);
        cmp = ok && (D.bits || d0 == 0);
    }
    for (int k = 0; cmp && k < c->nb; k++) {
        buf *b = &c->b[k];
        if (!b->out) continue;
        compare(c, b, b->name, 0, b->n, b->got[1], b->got[0], BITS, "in the second run");
        if (b->tol != NOCMP) check_part(c, k, 0, b->n, b->tol, b->name);
    }
    for (int k = 0; k < c->nb; k++) {
        buf *b = &c->b[k];
        D.kind->free(b->dev);
        free(b->init), free(b->cpu), free(b->got[0]), free(b->got[1]);
    }
    c->nb = 0;
}
/* copies of a result, kept past end() */
static void *dup_of(const void *p, size_t bytes) { return memcpy(xalloc(bytes), p, bytes); }
#define GOT(c, k) dup_of((c)->b[k].got[0], (c)->b[k].bytes)
#define CPU(c, k) dup_of((c)->b[k].cpu, (c)->b[k].bytes)
/* the kind's own result of two calls that must agree bit for bit */
static void same_bits(const kcase *c, const void *a, const void *b, size_t bytes, const char *what)
{
    EXPECT(!memcmp(a, b, bytes), "%s %s: %s", c->entry, c->label, what);
}

/* ------------------------------------------------------------------ matmul */
static const char *prec_name(int prec)
{
    static const char *names[] = { "fp32", "bf16", "?", "bf16|a16", "?", "bf16|b16", "?",
                                   "bf16|a16|b16" };
    return names[prec & 7];
}

/* The operands of the products at one size: a (M,K), b (K,Nc), dout (M,Nc), bias (Nc), and
 * a and b in bf16 storage. */
typedef struct {
    int M, Nc, K;
    float *a, *b, *dout, *bias;
    uint16_t *a16, *b16;
} mm_operands;

/* Product `which` (0 matmul, 1 matmul_da, 2 matmul_db, 3 matmul_bias: acc 0) at prec, from
 * init; a stored
 * operand (A16, B16) must give the kind's bits of the same product on the fp32 operand,
 * *plain (the kind's SP_PREC_BF16 result, kept here). */
static void mm_case(int which, int prec, const mm_operands *p, int ta, int tb, int acc,
                    const float *init, float **plain)
{
    static const char *names[] = { "out", "da", "db", "out" };
    const int M = p->M, Nc = p->Nc, K = p->K;
    const int64_t na = (int64_t)M * K, nb = (int64_t)K * Nc, nd = (int64_t)M * Nc;
    const int64_t n = which == 0 || which == 3 ? nd : which == 1 ? na : nb;
    kcase c[1];
    begin(c, "M=%d Nc=%d K=%d ta=%d tb=%d acc=%d prec=%s", M, Nc, K, ta, tb, acc,
          prec_name(prec));
    int o = OUT_F(c, names[which], init, n, TOL), d = IN_F(c, p->dout, nd);
    int x = prec & SP_PREC_A16 ? IN_U(c, p->a16, na) : IN_F(c, p->a, na);
    int y = prec & SP_PREC_B16 ? IN_U(c, p->b16, nb) : IN_F(c, p->b, nb);
    if (which == 0)
        RUN(c, matmul, F(c, o), P(c, x), P(c, y), M, Nc, K, ta, tb, acc, prec);
    else if (which == 3) {
        int ib = IN_F(c, p->bias, Nc);
        RUN(c, matmul_bias, F(c, o), P(c, x), P(c, y), F(c, ib), M, Nc, K, ta, tb, prec);
    }
    else if (which == 1)
        RUN(c, matmul_da, F(c, o), F(c, d), P(c, y), M, Nc, K, ta, tb, acc, prec);
    else
        RUN(c, matmul_db, F(c, o), F(c, d), P(c, x), M, Nc, K, ta, tb, acc, prec);
    if (prec == SP_PREC_BF16)
        *plain = GOT(c, o);
    else if (prec)
        same_bits(c, c->b[o].got[0], *plain, sizeof(float) * (size_t)n,
                  "operands in bf16 storage: the bits of the fp32 ones");
    end(c);
}

/* The three products and matmul_bias (acc 0), every transpose and acc, fp32 and bf16 with
 * each operand it reads stored in bf16 or not. */
static void test_matmul(void)
{
    static const int sz[][3] = { { 7, 13, 33 }, { 37, 7, 13 }, { 33, 37, 64 }, { 1, 5, 1 },
                                 { 5, 7, 0 },   { 1, 1, 1 },   { 3, 1031, 67 }, { 129, 17, 257 } };
    static const int precs[4][5] = {
        { 0, SP_PREC_BF16, SP_PREC_BF16 | SP_PREC_A16, SP_PREC_BF16 | SP_PREC_B16,
          SP_PREC_BF16 | SP_PREC_A16 | SP_PREC_B16 },
        { 0, SP_PREC_BF16, SP_PREC_BF16 | SP_PREC_B16, -1 },
        { 0, SP_PREC_BF16, SP_PREC_BF16 | SP_PREC_A16, -1 },
        { 0, SP_PREC_BF16, SP_PREC_BF16 | SP_PREC_A16, SP_PREC_BF16 | SP_PREC_B16,
          SP_PREC_BF16 | SP_PREC_A16 | SP_PREC_B16 } };
    for (size_t s = 0; s < sizeof sz / sizeof *sz; s++) {
        mm_operands p = { .M = sz[s][0], .Nc = sz[s][1], .K = sz[s][2] };
        const int64_t na = (int64_t)p.M * p.K, nb = (int64_t)p.K * p.Nc, nd = (int64_t)p.M * p.Nc;
        p.a = rnd(na, -1, 1), p.b = rnd(nb, -1, 1), p.dout = rnd(nd, -1, 1);
        p.bias = rnd(p.Nc, -1, 1);
        p.a16 = xalloc(2 * (size_t)na), p.b16 = xalloc(2 * (size_t)nb);
        sp_to_bf16(p.a16, p.a, na);
        sp_to_bf16(p.b16, p.b, nb);
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++)
                for (int acc = 0; acc < 2; acc++)
                    for (int which = 0; which < 4 - acc; which++) { /* matmul_bias: acc 0 */
                        float *init = acc_init(which == 1 ? na : which == 2 ? nb : nd, acc);
                        float *plain = NULL;
                        for (int k = 0; k < 5 && precs[which][k] >= 0; k++)
                            mm_case(which, precs[which][k], &p, ta, tb, acc, init, &plain);
                        free(init), free(plain);
                    }
        free(p.a), free(p.b), free(p.dout), free(p.bias), free(p.a16), free(p.b16);
    }
}

/* ------------------------------------------------------------------ elementwise */
static void test_bias(void)
{
    static const int sz[][2] = { { 7, 13 }, { 37, 33 }, { 333, 65 }, { 1, 1 }, { 64, 12 },
                                 { 3, 4099 } };
    for (size_t s = 0; s < sizeof sz / sizeof *sz; s++) {
        const int N = sz[s][0], C = sz[s][1];
        const int64_t n = (int64_t)N * C;
        float *x = rnd(n, -1, 1), *bias = rnd(C, -1, 1), *dout = rnd(n, -1, 1);
        kcase c[1];
        begin(c, "N=%d C=%d", N, C);
        int o = OUT_F(c, "out", NULL, n, TOL), ix = IN_F(c, x, n), ib = IN_F(c, bias, C);
        RUN(c, bias_add, F(c, o), F(c, ix), F(c, ib), N, C);
        end(c);
        begin(c, "N=%d C=%d in place", N, C);
        o = OUT_F(c, "out", x, n, TOL), ib = IN_F(c, bias, C);
        RUN(c, bias_add, F(c, o), F(c, o), F(c, ib), N, C);
        end(c);
        for (int acc = 0; acc < 2; acc++) {
            float *init = acc_init(C, acc);
            begin(c, "N=%d C=%d acc=%d", N, C, acc);
            o = OUT_F(c, "dbias", init, C, TOL);
            int id = IN_F(c, dout, n);
            RUN(c, bias_db, F(c, o), F(c, id), N, C, acc);
            end(c);
            free(init);
        }
        free(x), free(bias), free(dout);
    }
}

/* add, maximum, scale, gelu, relu and their gradients: GELU's inputs over [-6, 6] (tanh
 * saturates), a few far out, and exact zeros of both signs. GELU and its gradient are
 * bit for bit: codelets/gelu.h writes every multiply-add as fmaf and leaves nvcc nothing
 * to contract, so a GPU runs the CPU's roundings. */
static void test_pointwise(void)
{
    static const int64_t sizes[] = { 0, 1, 7, 37, 1025, 1048579 };
    for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
        const int64_t n = sizes[s];
        float *a = rnd(n, -6, 6), *b = rnd(n, -1, 1), *dout = rnd(n, -1, 1);
        if (n > 0) a[0] = 0.0f;
        if (n > 3) a[1] = 50.0f, a[2] = -50.0f, a[3] = -0.0f;
        kcase c[1];
        int o, ia, ib, id;
        begin(c, "n=%lld", (long long)n);
        o = OUT_F(c, "out", NULL, n, TOL), ia = IN_F(c, a, n), ib = IN_F(c, b, n);
        RUN(c, add, F(c, o), F(c, ia), F(c, ib), n);
        end(c);
        begin(c, "n=%lld in place", (long long)n);
        o = OUT_F(c, "out", a, n, TOL), ib = IN_F(c, b, n);
        RUN(c, add, F(c, o), F(c, o), F(c, ib), n);
        end(c);
        begin(c, "n=%lld in place", (long long)n); /* the tensor group's use: out == a */
        o = OUT_F(c, "out", b, n, 0), ia = IN_F(c, a, n);
        RUN(c, maximum, F(c, o), F(c, o), F(c, ia), n);
        end(c);
        begin(c, "n=%lld", (long long)n);
        o = OUT_F(c, "out", NULL, n, BITS), ia = IN_F(c, a, n);
        RUN(c, gelu, F(c, o), F(c, ia), n);
        end(c);
        begin(c, "n=%lld in place", (long long)n);
        o = OUT_F(c, "out", a, n, BITS);
        RUN(c, gelu, F(c, o), F(c, o), n);
        end(c);
        begin(c, "n=%lld", (long long)n);
        o = OUT_F(c, "out", NULL, n, TOL), ia = IN_F(c, a, n);
        RUN(c, relu, F(c, o), F(c, ia), n);
        end(c);
        static const float scales[] = { 1.0f, -1.5f, 0.37f };
        for (int acc = 0; acc < 2; acc++) {
            float *init = acc_init(n, acc);
            for (int si = 0; si < 3; si++) {
                begin(c, "n=%lld s=%g acc=%d", (long long)n, scales[si], acc);
                o = OUT_F(c, "out", init, n, TOL), id = IN_F(c, dout, n);
                RUN(c, scale, F(c, o), F(c, id), scales[si], n, acc);
                end(c);
                begin(c, "n=%lld s=%g acc=%d in place", (long long)n, scales[si], acc);
                o = OUT_F(c, "out", dout, n, TOL);
                RUN(c, scale, F(c, o), F(c, o), scales[si], n, acc);
                end(c);
            }
            begin(c, "n=%lld acc=%d", (long long)n, acc);
            o = OUT_F(c, "dx", init, n, BITS), ia = IN_F(c, a, n), id = IN_F(c, dout, n);
            RUN(c, gelu_dx, F(c, o), F(c, ia), F(c, id), n, acc);
            end(c);
            begin(c, "n=%lld acc=%d", (long long)n, acc);
            o = OUT_F(c, "dx", init, n, TOL), ia = IN_F(c, a, n), id = IN_F(c, dout, n);
            RUN(c, relu_dx, F(c, o), F(c, ia), F(c, id), n, acc);
            end(c);
            free(init);
        }
        free(a), free(b), free(dout);
    }
}

/* ------------------------------------------------------------------ norms */
/* LayerNorm (x around 3: the two-pass variance matters) and RMSNorm; each backward gets the
 * CPU table's saved statistics on both sides. */
static void test_norms(void)
{
    static const int sz[][2] = { { 7, 13 }, { 37, 33 }, { 13, 770 }, { 5, 1 }, { 64, 12 },
                                 { 1, 31 }, { 2, 4099 } };
    for (size_t s = 0; s < sizeof sz / sizeof *sz; s++) {
        const int N = sz[s][0], C = sz[s][1];
        const int64_t n = (int64_t)N * C;
        float *x = rnd(n, 2, 4), *gamma = rnd(C, -1.5, 1.5), *beta = rnd(C, -1, 1);
        float *dout = rnd(n, -1, 1), *xr = rnd(n, -2, 3);
        kcase c[1];
        begin(c, "N=%d C=%d", N, C);
        int o = OUT_F(c, "out", NULL, n, TOL), om = OUT_F(c, "mean", NULL, N, TOL);
        int orr = OUT_F(c, "rstd", NULL, N, TOL);
        int ix = IN_F(c, x, n), ig = IN_F(c, gamma, C), ib = IN_F(c, beta, C);
        RUN(c, layernorm, F(c, o), F(c, om), F(c, orr), F(c, ix), F(c, ig), F(c, ib), N, C);
        float *mean = CPU(c, om), *rstd = CPU(c, orr);
        end(c);
        begin(c, "N=%d C=%d", N, C);
        o = OUT_F(c, "out", NULL, n, TOL), orr = OUT_F(c, "rstd", NULL, N, TOL);
        ix = IN_F(c, xr, n), ig = IN_F(c, gamma, C);
        RUN(c, rmsnorm, F(c, o), F(c, orr), F(c, ix), F(c, ig), N, C);
        float *rrstd = CPU(c, orr);
        end(c);
        for (int acc = 0; acc < 2; acc++) {
            float *in = acc_init(n, acc), *ic = acc_init(C, acc), *ic2 = acc_init(C, acc);
            begin(c, "N=%d C=%d acc=%d", N, C, acc);
            o = OUT_F(c, "dx", in, n, TOL);
            int id = IN_F(c, dout, n), im = IN_F(c, mean, N), ir = IN_F(c, rstd, N);
            ix = IN_F(c, x, n), ig = IN_F(c, gamma, C);
            RUN(c, layernorm_dx, F(c, o), F(c, id), F(c, ix), F(c, im), F(c, ir), F(c, ig), N, C,
                acc);
            end(c);
            begin(c, "N=%d C=%d acc=%d", N, C, acc);
            o = OUT_F(c, "dgamma", ic, C, TOL);
            int o2 = OUT_F(c, "dbeta", ic2, C, TOL);
            id = IN_F(c, dout, n), ix = IN_F(c, x, n), im = IN_F(c, mean, N);
            ir = IN_F(c, rstd, N);
            RUN(c, layernorm_dparams, F(c, o), F(c, o2), F(c, id), F(c, ix), F(c, im), F(c, ir),
                N, C, acc);
            end(c);
            begin(c, "N=%d C=%d acc=%d", N, C, acc);
            o = OUT_F(c, "dx", in, n, TOL);
            id = IN_F(c, dout, n), ix = IN_F(c, xr, n), ir = IN_F(c, rrstd, N);
            ig = IN_F(c, gamma, C);
            RUN(c, rmsnorm_dx, F(c, o), F(c, id), F(c, ix), F(c, ir), F(c, ig), N, C, acc);
            end(c);
            begin(c, "N=%d C=%d acc=%d", N, C, acc);
            o = OUT_F(c, "dweight", ic, C, TOL);
            id = IN_F(c, dout, n), ix = IN_F(c, xr, n), ir = IN_F(c, rrstd, N);
            RUN(c, rmsnorm_dweight, F(c, o), F(c, id), F(c, ix), F(c, ir), N, C, acc);
            end(c);
            free(in), free(ic), free(ic2);
        }
        free(x), free(gamma), free(beta), free(dout), free(xr), free(mean), free(rstd),
            free(rrstd);
    }
}

/* ------------------------------------------------------------------ embeddings */
/* The tokens out of range (below 0, V, beyond) where there are three: the CPU table's
 * SP_BACKEND_BAD_INDEX; on a kind that promises the CPU's bits too. A kind that does not
 * may leave the check to the host (sp_program_check_inputs): embed then reads out of
 * bounds, so it is not given them. */
static int spoil_tokens(int32_t *tok, int64_t n, int64_t V)
{
    if (n < 3) return 0;
    tok[0] = -1, tok[n / 2] = (int32_t)V, tok[n - 1] = (int32_t)(V + 5);
    return 1;
}

static void test_embed(void)
{
    static const int sz[][4] = { { 3, 5, 12, 7 }, { 2, 64, 33, 13 }, { 4, 37, 13, 1000 },
                                 { 1, 1, 1, 1 },  { 1, 3, 1031, 5 } };
    for (size_t s = 0; s < sizeof sz / sizeof *sz; s++) {
        const int B = sz[s][0], T = sz[s][1], C = sz[s][2], V = sz[s][3], Tmax = T + 3;
        const int64_t BT = (int64_t)B * T, n = BT * C;
        int32_t *tok = xalloc(sizeof(int32_t) * (size_t)BT);
        for (int64_t i = 0; i < BT; i++) /* small V: many repeats, exercising the scatter */
            tok[i] = (int32_t)(kc_next() % (uint64_t)V);
        float *wte = rnd((int64_t)V * C, -1, 1), *wpe = rnd((int64_t)Tmax * C, -1, 1);
        float *dout = rnd(n, -1, 1), *gte = rnd((int64_t)V * C, -1, 1);
        float *gpe = rnd((int64_t)T * C, -1, 1);
        kcase c[1];
        begin(c, "B=%d T=%d C=%d V=%d", B, T, C, V);
        int o = OUT_F(c, "out", NULL, n, TOL), it = IN_I(c, tok, BT);
        int iw = IN_F(c, wte, (int64_t)V * C), ip = IN_F(c, wpe, (int64_t)Tmax * C);
        RUN(c, embed, F(c, o), I(c, it), F(c, iw), F(c, ip), B, T, C, (int64_t)V);
        end(c);
        begin(c, "B=%d T=%d C=%d V=%d", B, T, C, V); /* always accumulates */
        o = OUT_F(c, "dwte", gte, (int64_t)V * C, TOL);
        int o2 = OUT_F(c, "dwpe", gpe, (int64_t)T * C, TOL);
        int id = IN_F(c, dout, n);
        it = IN_I(c, tok, BT);
        RUN(c, embed_dparams, F(c, o), F(c, o2), F(c, id), I(c, it), B, T, C);
        end(c);
        if (spoil_tokens(tok, BT, V)) {
            begin(c, "B=%d T=%d C=%d V=%d tokens out of range", B, T, C, V);
            c->cpu_rc = SP_BACKEND_BAD_INDEX;
            c->cpu_only = !D.bits;
            o = OUT_F(c, "out", NULL, n, TOL), it = IN_I(c, tok, BT);
            iw = IN_F(c, wte, (int64_t)V * C), ip = IN_F(c, wpe, (int64_t)Tmax * C);
            RUN(c, embed, F(c, o), I(c, it), F(c, iw), F(c, ip), B, T, C, (int64_t)V);
            end(c);
        }
        free(tok), free(wte), free(wpe), free(dout), free(gte), free(gpe);
    }
}

/* The vocab-parallel embedding on rank `rank` of T, rows [lo, lo + V/T): tokens over the
 * whole vocabulary, most of them another rank's. Out of range: a kind without the CPU's
 * bits may return 0 (a token outside the rows gives zeros there), its output then unlike
 * the CPU's, which stops. */
static void test_embed_vocab(void)
{
    static const int sz[][5] = { { 15, 12, 14, 2, 1 }, { 37, 33, 1000, 4, 2 },
                                 { 64, 17, 50, 5, 4 }, { 9, 7, 6, 3, 0 }, { 1, 1, 1, 1, 0 },
                                 { 3, 1031, 9, 3, 2 } };
    for (size_t s = 0; s < sizeof sz / sizeof *sz; s++) {
        const int N = sz[s][0], C = sz[s][1], V = sz[s][2], T = sz[s][3], rank = sz[s][4];
        const int64_t rows = V / T, lo = (int64_t)rank * rows, n = (int64_t)N * C;
        int32_t *tok = xalloc(sizeof(int32_t) * (size_t)N);
        for (int i = 0; i < N; i++)
            tok[i] = (int32_t)(kc_next() % (uint64_t)V);
        tok[0] = (int32_t)lo; /* at least one of this rank's, repeated when room */
        if (N > 2) tok[N - 1] = (int32_t)lo;
        float *wte = rnd(rows * C, -1, 1), *dout = rnd(n, -1, 1), *g = rnd(rows * C, -1, 1);
        kcase c[1];
        begin(c, "N=%d C=%d V=%d T=%d rank=%d", N, C, V, T, rank);
        int o = OUT_F(c, "out", NULL, n, 0), it = IN_I(c, tok, N), iw = IN_F(c, wte, rows * C);
        RUN(c, embed_vocab, F(c, o), I(c, it), F(c, iw), N, C, lo, rows, (int64_t)V);
        end(c);
        begin(c, "N=%d C=%d V=%d T=%d rank=%d", N, C, V, T, rank); /* always accumulates */
        o = OUT_F(c, "dwte", g, rows * C, 0);
        int id = IN_F(c, dout, n);
        it = IN_I(c, tok, N);
        RUN(c, embed_vocab_dwte, F(c, o), F(c, id), I(c, it), N, C, lo, rows);
        end(c);
        if (spoil_tokens(tok, N, V)) {
            begin(c, "N=%d C=%d V=%d T=%d rank=%d tokens out of range", N, C, V, T, rank);
            c->cpu_rc = SP_BACKEND_BAD_INDEX;
            o = OUT_F(c, "out", NULL, n, D.bits ? BITS : NOCMP), it = IN_I(c, tok, N);
            iw = IN_F(c, wte, rows * C);
            RUN(c, embed_vocab, F(c, o), I(c, it), F(c, iw), N, C, lo, rows, (int64_t)V);
            end(c);
        }
        free(tok), free(wte), free(dout), free(g);
    }
}

/* ------------------------------------------------------------------ rope, swiglu */
/* Rotary embeddings, forward and inverse, acc 0 and 1, and in place. */
static void test_rope(void)
{
    static const struct {
        int B, T, D, hs, period, rotated;
        float theta;
    } sz[] = { { 2, 7, 64, 16, 1, 1, 10000.0f },   { 3, 37, 96, 32, 4, 3, 10000.0f },
               { 1, 70, 384, 64, 4, 3, 500000.0f }, { 2, 5, 24, 8, 3, 0, 10000.0f },
               { 1, 1, 8, 8, 1, 1, 10000.0f },      { 2, 300, 256, 128, 2, 1, 10000.0f },
               { 2, 33, 72, 6, 5, 2, 1.5f },        { 1, 3, 2, 2, 1, 1, 10000.0f } };
    for (size_t s = 0; s < sizeof sz / sizeof *sz; s++) {
        const int B = sz[s].B, T = sz[s].T, Dm = sz[s].D, hs = sz[s].hs, Pd = sz[s].period;
        const int R = sz[s].rotated;
        const float th = sz[s].theta;
        const int64_t n = (int64_t)B * T * Dm;
        float *x = rnd(n, -2, 2);
        for (int inv = 0; inv < 2; inv++) {
            kcase c[1];
            for (int acc = 0; acc < 2; acc++) {
                float *init = acc_init(n, acc);
                begin(c, "B=%d T=%d D=%d hs=%d period=%d rotated=%d theta=%g inverse=%d acc=%d",
                      B, T, Dm, hs, Pd, R, th, inv, acc);
                int o = OUT_F(c, "out", init, n, TOL), ix = IN_F(c, x, n);
                RUN(c, rope, F(c, o), F(c, ix), B, T, Dm, hs, Pd, R, th, inv, acc);
                end(c);
                free(init);
            }
            begin(c, "B=%d T=%d D=%d hs=%d period=%d rotated=%d theta=%g inverse=%d in place", B,
                  T, Dm, hs, Pd, R, th, inv);
            int o = OUT_F(c, "out", x, n, TOL);
            RUN(c, rope, F(c, o), F(c, o), B, T, Dm, hs, Pd, R, th, inv, 0);
            end(c);
        }
        free(x);
    }
}

/* SwiGLU: a over [-6, 6] and far out (the sigmoid's clamp at 87, both signs, zeros), b
 * over [-1, 1] */
static void test_swiglu(void)
{
    static const int sz[][2] = { { 7, 13 }, { 37, 33 }, { 333, 65 }, { 1, 1 }, { 64, 1031 },
                                 { 2, 4099 } };
    static const float far[] = { 0.0f, -0.0f, 50.0f, -50.0f, 100.0f, -100.0f, 1e-30f };
    for (size_t s = 0; s < sizeof sz / sizeof *sz; s++) {
        const int N = sz[s][0], In = sz[s][1];
        const int64_t n = (int64_t)N * In;
        float *x = xalloc(sizeof(float) * 2 * (size_t)n);
        for (int r = 0; r < N; r++)
            for (int i = 0; i < In; i++) {
                x[(int64_t)r * 2 * In + i] = uni(-6, 6);
                x[(int64_t)r * 2 * In + In + i] = uni(-1, 1);
            }
        for (int k = 0; k < (int)(sizeof far / sizeof *far) && k < In; k++)
            x[k] = far[k];
        float *dout = rnd(n, -1, 1);
        kcase c[1];
        begin(c, "N=%d I=%d", N, In);
        int o = OUT_F(c, "out", NULL, n, TOL), ix = IN_F(c, x, 2 * n);
        RUN(c, swiglu, F(c, o), F(c, ix), N, In);
        end(c);
        for (int acc = 0; acc < 2; acc++) {
            float *init = acc_init(2 * n, acc);
            begin(c, "N=%d I=%d acc=%d", N, In, acc);
            o = OUT_F(c, "dx", init, 2 * n, TOL), ix = IN_F(c, x, 2 * n);
            int id = IN_F(c, dout, n);
            RUN(c, swiglu_dx, F(c, o), F(c, ix), F(c, id), N, In, acc);
            end(c);
            free(init);
        }
        free(x), free(dout);
    }
}

/* ------------------------------------------------------------------ attention */
/* A row of qkv: 3C in GPT's layout (group 0), (NH/G)(G+2) hs grouped (kernels.h). */
static int64_t qkv_width(int C, int NH, int G)
{
    return G ? (int64_t)(NH / G) * (G + 2) * (C / NH) : 3 * (int64_t)C;
}
/* Column of query head h's q (part 0), its KV head's k (1) or v (2) in a row of qkv. */
static int64_t qkv_col(int part, int h, int C, int NH, int G)
{
    const int hs = C / NH;
    if (!G) return (int64_t)part * C + (int64_t)h * hs;
    const int64_t kv = (int64_t)(h / G) * (G + 2) * hs;
    return kv + (part ? (int64_t)(G + part - 1) * hs : (int64_t)(h % G) * hs);
}
/* GPT's layout (B,T,3C) holding the same attention as the grouped qkv (B,T,W): each query
 * head with a copy of its KV head's k and v. */
static float *qkv_ungroup(const float *qkv, int B, int T, int C, int NH, int G)
{
    const int hs = C / NH;
    const int64_t W = qkv_width(C, NH, G);
    float *m = xalloc(sizeof(float) * (size_t)((int64_t)B * T * 3 * C));
    for (int64_t r = 0; r < (int64_t)B * T; r++)
        for (int part = 0; part < 3; part++)
            for (int h = 0; h < NH; h++)
                memcpy(m + r * 3 * C + qkv_col(part, h, C, NH, 0),
                       qkv + r * W + qkv_col(part, h, C, NH, G), sizeof(float) * (size_t)hs);
    return m;
}
/* What the interpreter gives every table (graph/layout.c, attention_need): the CPU's need
 * in either precision, and B NH T (a GPU's D = rowsum(dout * out)). */
static int64_t attention_scratch(int B, int T, int C, int NH)
{
    int64_t a = sp_attention_scratch_floats(B, T, C, NH);
    int64_t b = sp_attention_scratch_floats_bf16(B, T, C, NH), g = (int64_t)B * NH * T;
    return a > b ? (a > g ? a : g) : (b > g ? b : g);
}

/* One precision's attention at {B, T, C, NH, G}: the forward (out, lse) and the backward,
 * acc 0 and 1, given the CPU table's out and lse on both sides. For a group G >= 1, two
 * checks of the index math against group 0 on the kind: the forward of the same heads laid
 * out as GPT's, each query head with a copy of its KV head, gives the same bits; and at
 * G = 1 (one query head per KV head: a permutation of GPT's columns) so does the backward,
 * column for column. */
static void check_attention(int prec, double tol_out, double tol_lse, double tol_dx, int B, int T,
                            int C, int NH, int G)
{
    const int64_t W = qkv_width(C, NH, G), nqkv = (int64_t)B * T * W;
    const int64_t nout = (int64_t)B * T * C, nlse = (int64_t)B * NH * T;
    const int64_t nscr = attention_scratch(B, T, C, NH);
    const float range = prec ? 2.0f : 1.0f;
    float *qkv = rnd(nqkv, -range, range), *dout = rnd(nout, -1, 1);
    float *mha = G ? qkv_ungroup(qkv, B, T, C, NH, G) : NULL;
#define AT_LABEL(c, what)                                                                        \
    begin(c, "B=%d T=%d C=%d NH=%d group=%d prec=%s%s", B, T, C, NH, G, prec_name(prec), what)
    kcase c[1];
    AT_LABEL(c, "");
    int o = OUT_F(c, "out", NULL, nout, tol_out), ol = OUT_F(c, "lse", NULL, nlse, tol_lse);
    int sc = SCRATCH(c, nscr), iq = IN_F(c, qkv, nqkv);
    RUN(c, attention, F(c, o), F(c, ol), F(c, sc), F(c, iq), B, T, C, NH, G, prec);
    float *out = CPU(c, o), *lse = CPU(c, ol), *gout = GOT(c, o), *glse = GOT(c, ol);
    end(c);
    if (G) {
        AT_LABEL(c, " in GPT's layout");
        o = OUT_F(c, "out", NULL, nout, tol_out), ol = OUT_F(c, "lse", NULL, nlse, tol_lse);
        sc = SCRATCH(c, nscr), iq = IN_F(c, mha, (int64_t)B * T * 3 * C);
        RUN(c, attention, F(c, o), F(c, ol), F(c, sc), F(c, iq), B, T, C, NH, 0, prec);
        same_bits(c, c->b[o].got[0], gout, sizeof(float) * (size_t)nout,
                  "out: the bits of the grouped layout on the same heads");
        same_bits(c, c->b[ol].got[0], glse, sizeof(float) * (size_t)nlse,
                  "lse: the bits of the grouped layout on the same heads");
        end(c);
    }
    for (int acc = 0; acc < 2; acc++) {
        float *init = acc_init(nqkv, acc);
        char what[16];
        snprintf(what, sizeof what, " acc=%d", acc);
        AT_LABEL(c, what);
        int og = OUT_F(c, "dqkv", init, nqkv, tol_dx);
        sc = SCRATCH(c, nscr);
        int id = IN_F(c, dout, nout), io = IN_F(c, out, nout), il = IN_F(c, lse, nlse);
        iq = IN_F(c, qkv, nqkv);
        RUN(c, attention_dx, F(c, og), F(c, sc), F(c, id), F(c, iq), F(c, io), F(c, il), B, T, C,
            NH, G, acc, prec);
        float *mine = G == 1 ? qkv_ungroup(c->b[og].got[0], B, T, C, NH, 1) : NULL;
        end(c);
        if (G == 1) { /* the same gradients as GPT's layout gives, moved back */
            float *minit = qkv_ungroup(init, B, T, C, NH, 1);
            begin(c, "B=%d T=%d C=%d NH=%d group=1 prec=%s acc=%d in GPT's layout", B, T, C, NH,
                  prec_name(prec), acc);
            og = OUT_F(c, "dqkv", minit, nqkv, tol_dx);
            sc = SCRATCH(c, nscr);
            id = IN_F(c, dout, nout), io = IN_F(c, out, nout), il = IN_F(c, lse, nlse);
            iq = IN_F(c, mha, nqkv);
            RUN(c, attention_dx, F(c, og), F(c, sc), F(c, id), F(c, iq), F(c, io), F(c, il), B,
                T, C, NH, 0, acc, prec);
            same_bits(c, c->b[og].got[0], mine, sizeof(float) * (size_t)nqkv,
                      "dq, dk, dv: the bits of group 1 on the same heads");
            end(c);
            free(minit);
        }
        free(mine), free(init);
    }
#undef AT_LABEL
    free(qkv), free(dout), free(mha), free(out), free(lse), free(gout), free(glse);
}

/* {B, T, C, NH, G} of grouped-query attention: G = 1, 2, 3, 4 (also NH/G = 1 KV head),
 * heads of 4, 16, 22 and 64 columns, T = 1 and T across the 64-row tiles and the bf16
 * backward's 16-query steps (37, 65, 70, 130). */
#define GQA_SIZES                                                                                \
    { 2, 37, 64, 4, 1 }, { 2, 37, 64, 4, 2 }, { 1, 65, 64, 4, 4 }, { 2, 70, 256, 4, 2 },         \
        { 1, 130, 512, 8, 4 }, { 2, 5, 24, 6, 3 }, { 1, 1, 32, 4, 2 }, { 1, 67, 128, 2, 1 },     \
        { 1, 67, 44, 2, 2 }

/* fp32: GPT's layout, head sizes 4 .. 200 (8, 16, 32, 64, 128 among them; 11 and 200 are
 * not multiples of 16-column groups, 200 spans two 128-column slices), T below, at and
 * across 64-row tiles (1, 63, 64, 65, 130), B and NH > 1; then grouped-query attention, and
 * a head of 200 grouped. bf16 (the CPU's rounding points, codelets/cpu/kernels.h): a
 * device's forward may round exp(s - m) against a running max where the CPU has the row's
 * max: where a row spans key tiles its P~ rounds other values, ~2^-9 relative per term (up
 * to 1e-3 on the emulator): TOL_BF16_OUT. lse differs by fp32 orders of summation:
 * TOL_BF16. The backward (given the CPU's out and lse) too, and by a dS next to a bf16
 * boundary now and then, which rounds to the other side there: one bf16 ulp of dS (2^-8
 * relative) times k and the scale moves a dq element by up to ~5e-4 in a short row (T = 37,
 * t = 2: three terms; 3.6e-4 scaled, on the emulator): TOL_BF16_DX (test_cuda_kernels.c
 * had 1e-4, the CPU test's 4e-6 worst times 25, which other inputs than its own exceed).
 * Heads of 200 in bf16: TOL_BF16_WIDE. */
static void test_attention(void)
{
    static const int fp32[][5] = {
        { 2, 5, 12, 3, 0 },   { 3, 64, 12, 3, 0 },  { 1, 13, 33, 3, 0 },  { 2, 37, 64, 4, 0 },
        { 1, 64, 128, 2, 0 }, { 1, 1, 12, 3, 0 },   { 2, 65, 32, 4, 0 },  { 1, 130, 64, 4, 0 },
        { 2, 63, 128, 4, 0 }, { 1, 67, 128, 1, 0 }, { 1, 70, 256, 2, 0 }, { 2, 1, 64, 1, 0 },
        { 1, 66, 400, 2, 0 }, GQA_SIZES,            { 1, 66, 400, 2, 2 } };
    static const int bf16[][5] = { { 2, 5, 12, 3, 0 },   { 1, 13, 33, 3, 0 },  { 2, 37, 64, 4, 0 },
                                   { 1, 64, 128, 1, 0 }, { 1, 1, 12, 3, 0 },   { 2, 65, 32, 4, 0 },
                                   { 1, 130, 64, 4, 0 }, { 1, 67, 128, 1, 0 }, { 1, 70, 22, 2, 0 },
                                   GQA_SIZES };
    for (size_t s = 0; s < sizeof fp32 / sizeof *fp32; s++)
        check_attention(0, TOL, TOL, TOL, fp32[s][0], fp32[s][1], fp32[s][2], fp32[s][3],
                        fp32[s][4]);
    for (size_t s = 0; s < sizeof bf16 / sizeof *bf16; s++)
        check_attention(SP_PREC_BF16, TOL_BF16_OUT, TOL_BF16, TOL_BF16_DX, bf16[s][0],
                        bf16[s][1], bf16[s][2], bf16[s][3], bf16[s][4]);
    check_attention(SP_PREC_BF16, TOL_BF16_WIDE, TOL_BF16_WIDE, TOL_BF16_WIDE, 1, 66, 400, 2, 0);
    check_attention(SP_PREC_BF16, TOL_BF16_WIDE, TOL_BF16_WIDE, TOL_BF16_WIDE, 1, 66, 400, 2, 2);
}

/* ------------------------------------------------------------------ losses */
/* The cross-entropy's gradient, acc 0 and 1, from the CPU table's probabilities; dloss in
 * the table's memory. */
static void check_ce_dx(const float *probs, const int32_t *tg, float dloss, int N, int V,
                        const char *what)
{
    const int64_t n = (int64_t)N * V;
    for (int acc = 0; acc < 2; acc++) {
        float *init = acc_init(n, acc);
        kcase c[1];
        begin(c, "N=%d V=%d acc=%d%s", N, V, acc, what);
        int og = OUT_F(c, "dlogits", init, n, TOL), ip = IN_F(c, probs, n);
        int idl = IN_F(c, &dloss, 1), it = IN_I(c, tg, N);
        RUN(c, cross_entropy_dx, F(c, og), F(c, ip), I(c, it), F(c, idl), N, V, acc);
        end(c);
        free(init);
    }
}

/* The cross-entropy and its gradient; with bad targets (-3 and the first padding column,
 * or V) the CPU table returns SP_BACKEND_BAD_INDEX and a NaN loss; a kind that leaves the
 * check to the host returns 0 and a NaN loss (backend.h), its probabilities still the
 * CPU's. Each size also with padding: only the first `valid` columns are tokens (GPT-2's
 * 50257 of 50304). */
static void test_cross_entropy(void)
{
    static const int sz[][3] = { { 7, 13, 9 }, { 37, 33, 33 }, { 5, 1000, 999 },
                                 { 64, 50304, 50257 }, { 3, 1, 1 }, { 1, 7, 1 } };
    for (size_t s = 0; s < sizeof sz / sizeof *sz; s++)
        for (int k = 0; k < 4; k++) {
            const int bad = k & 1, N = sz[s][0], V = sz[s][1], valid = k & 2 ? sz[s][2] : V;
            if (k & 2 && valid == V) continue;
            const int64_t n = (int64_t)N * V;
            float *logits = rnd(n, -4, 4);
            int32_t *tg = xalloc(sizeof(int32_t) * (size_t)N);
            for (int i = 0; i < N; i++)
                tg[i] = (int32_t)(kc_next() % (uint64_t)valid);
            if (bad) tg[0] = -3, tg[N - 1] = valid;
            kcase c[1];
            begin(c, "N=%d V=%d valid=%d%s", N, V, valid, bad ? " bad targets" : "");
            c->cpu_rc = bad ? SP_BACKEND_BAD_INDEX : 0;
            int ol = OUT_F(c, "loss", NULL, 1, bad ? NAN_BOTH : TOL);
            int op = OUT_F(c, "probs", NULL, n, TOL), il = IN_F(c, logits, n);
            int it = IN_I(c, tg, N), sc = SCRATCH(c, 2 * (int64_t)N + 2);
            RUN(c, cross_entropy, F(c, ol), F(c, op), F(c, il), I(c, it), N, V, valid,
                F(c, sc));
            float *probs = CPU(c, op);
            end(c);
            check_ce_dx(probs, tg, 0.73f * 2.5f, N, V, bad ? " bad targets" : "");
            free(logits), free(tg), free(probs);
        }
}

/* The vocab-parallel cross-entropy's steps on rank `rank` of T (slices of V columns): the
 * group's all-reduces between them stood in for by raising some rows' maxima and sums, as
 * other ranks' slices would; then the plain gradient on the slice, targets outside it -1.
 * A target outside [0,Vall): SP_BACKEND_BAD_INDEX on the CPU table; a kind that leaves the
 * check to the host returns 0 and makes that row's target logit NaN (backend.h). */
static void test_vocab_ce(void)
{
    /* N, the slice's V, T, rank, and the padding at the end of the whole vocabulary: none,
     * part of this rank's slice, all of it */
    static const int sz[][5] = { { 7, 13, 2, 1, 0 }, { 37, 33, 3, 0, 0 }, { 5, 1000, 4, 3, 0 },
                                 { 64, 2000, 2, 1, 0 }, { 3, 1, 2, 0, 0 }, { 1, 1031, 3, 2, 0 },
                                 { 7, 13, 2, 1, 5 }, { 64, 2000, 2, 1, 47 },
                                 { 5, 1000, 4, 3, 1000 }, { 6, 96, 4, 3, 130 } };
    for (size_t s = 0; s < sizeof sz / sizeof *sz; s++)
        for (int bad = 0; bad < 2; bad++) {
            const int N = sz[s][0], V = sz[s][1], T = sz[s][2], rank = sz[s][3];
            const int64_t n = (int64_t)N * V, lo = (int64_t)rank * V;
            const int64_t Vall = (int64_t)V * T - sz[s][4]; /* the tokens */
            const int valid = Vall - lo >= V ? V : Vall - lo > 0 ? (int)(Vall - lo) : 0;
            float *logits = rnd(n, -4, 4);
            int32_t *tg = xalloc(sizeof(int32_t) * (size_t)N);
            for (int i = 0; i < N; i++)
                tg[i] = (int32_t)(kc_next() % (uint64_t)Vall);
            if (valid) tg[0] = (int32_t)(lo + valid - 1); /* one in the slice, its last token */
            if (bad) tg[N - 1] = (int32_t)Vall;
            kcase c[1];
            begin(c, "N=%d V=%d valid=%d", N, V, valid);
            int om = OUT_F(c, "rowmax", NULL, N, BITS), il = IN_F(c, logits, n); /* exact */
            RUN(c, vocab_ce_max, F(c, om), F(c, il), N, V, valid);
            float *gmax = CPU(c, om);
            end(c);
            for (int i = 0; i < N; i++) /* the group's maxima, some raised (all finite) */
                gmax[i] = valid ? gmax[i] + (i % 2 ? uni(0, 2) : 0.0f) : uni(-1, 1);
            begin(c, "N=%d V=%d T=%d rank=%d%s", N, V, T, rank, bad ? " bad target" : "");
            c->cpu_rc = bad ? SP_BACKEND_BAD_INDEX : 0;
            int oe = OUT_F(c, "exps", NULL, n, TOL), os = OUT_F(c, "stats", NULL, 2 * N, NOCMP);
            int ot = add_buf(c, "ltargets", T_I32, 1, BITS, NULL, N);
            int it = IN_I(c, tg, N), ix = IN_F(c, gmax, N);
            il = IN_F(c, logits, n);
            RUN(c, vocab_ce_exp, F(c, oe), F(c, os), I(c, ot), F(c, il), I(c, it), F(c, ix), N, V,
                lo, Vall);
            if (!c->rc[1] || D.bits) { /* the sums; the target logits, NaN for a bad one */
                check_part(c, os, 0, N, TOL, "stats(sums)");
                check_part(c, os, N, N - bad, 0, "stats(target logits)");
                if (bad && !D.bits)
                    compare(c, &c->b[os], "stats(the bad target's logit)", 2 * N - 1, 1,
                            c->b[os].got[0], c->b[os].got[0], NAN_BOTH, "");
                else if (bad)
                    check_part(c, os, 2 * N - 1, 1, 0, "stats(the bad target's logit)");
            }
            float *exps = CPU(c, oe), *stats = CPU(c, os);
            int32_t *ltg = CPU(c, ot);
            end(c);
            for (int i = 0; i < N; i++) /* the group's sums, some raised (all positive) */
                stats[i] += i % 3 || !valid ? uni(0.5f, 3) : 0.0f;
            begin(c, "N=%d V=%d T=%d", N, V, T);
            int ol = OUT_F(c, "loss", NULL, 1, TOL);
            oe = OUT_F(c, "exps", exps, n, TOL);
            ix = IN_F(c, gmax, N);
            int is = IN_F(c, stats, 2 * N);
            RUN(c, vocab_ce_loss, F(c, ol), F(c, oe), F(c, ix), F(c, is), N, V);
            float *probs = CPU(c, oe);
            end(c);
            check_ce_dx(probs, ltg, 0.61f, N, V, " on a slice"); /* -1 outside it */
            free(logits), free(tg), free(gmax), free(exps), free(stats), free(ltg), free(probs);
        }
}

/* ------------------------------------------------------------------ sums, optimizer */
static void test_sum(void)
{
    static const int64_t sizes[] = { 0, 1, 7, 37, 100003 };
    for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
        const int64_t n = sizes[s];
        float *x = rnd(n, -1, 1);
        kcase c[1];
        begin(c, "n=%lld", (long long)n);
        int o = OUT_F(c, "out", NULL, 1, TOL), ix = IN_F(c, x, n);
        RUN(c, sum, F(c, o), F(c, ix), n);
        end(c);
        const float dout = -0.61f, mult = n > 0 ? 1.0f / (float)n : 1.0f;
        for (int acc = 0; acc < 2; acc++) {
            float *init = acc_init(n, acc);
            begin(c, "n=%lld s=%g acc=%d", (long long)n, mult, acc);
            o = OUT_F(c, "dx", init, n, TOL);
            int id = IN_F(c, &dout, 1);
            RUN(c, sum_dx, F(c, o), F(c, id), mult, n, acc);
            end(c);
            free(init);
        }
        free(x);
    }
    static const int64_t ssq[] = { 0, 1, 37, 1048581 };
    for (size_t s = 0; s < sizeof ssq / sizeof *ssq; s++) {
        const int64_t n = ssq[s];
        float *x = rnd(n, -1, 1);
        kcase c[1];
        begin(c, "n=%lld", (long long)n);
        int o = add_buf(c, "out", T_F64, 1, TOL_SUMSQ, NULL, 1), ix = IN_F(c, x, n);
        RUN(c, sum_squares, (double *)P(c, o), F(c, ix), n);
        end(c);
        free(x);
    }
}

static void test_adamw(void)
{
    static const int64_t sizes[] = { 1, 37, 1025, 10007 };
    static const int steps[] = { 1, 10 };
    for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++)
        for (int k = 0; k < 2; k++) {
            const int64_t n = sizes[s];
            const int t = steps[k];
            float *p = rnd(n, -1, 1), *m = rnd(n, -0.1, 0.1), *v = rnd(n, 0, 0.01);
            float *grad = rnd(n, -1, 1);
            kcase c[1];
            begin(c, "n=%lld t=%d", (long long)n, t);
            int op = OUT_F(c, "param", p, n, TOL), om = OUT_F(c, "m", m, n, TOL);
            int ov = OUT_F(c, "v", v, n, TOL), ig = IN_F(c, grad, n);
            RUN(c, adamw, F(c, op), F(c, om), F(c, ov), F(c, ig), n, 3e-4f, 0.9f, 0.95f, 1e-8f,
                0.1f, 0.5f, t);
            end(c);
            free(p), free(m), free(v), free(grad);
        }
}

/* ------------------------------------------------------------------ helpers */
/* set and zero inside a larger buffer (nothing else written, +0 bits); copy bit for bit,
 * NaN payloads and signed zeros included; to_bf16 the CPU's bits (NaN, ties, overflow). */
static void test_helpers(void)
{
    static const float special[] = { NAN, INFINITY, -INFINITY, -0.0f, 3.4028235e38f, 0x1.01p0f,
                                     0x1.03p0f, 1.401298464e-45f, 0x1.0101p0f, -0x1.fep-127f };
    float *x = rnd(1031, -3, 3);
    memcpy(x, special, sizeof special);
    uint32_t payload = 0x7fa12345u; /* a NaN with a payload */
    memcpy(x + 11, &payload, 4);
    kcase c[1];
    begin(c, "at element 5 of 37");
    int o = OUT_F(c, "x", x, 37, BITS);
    RUN(c, set, F(c, o) + 5, 0.125f);
    end(c);
    static const int64_t zs[][2] = { { 0, 1 }, { 0, 37 }, { 3, 1025 } }; /* {offset, n} of 1031 */
    for (size_t s = 0; s < sizeof zs / sizeof *zs; s++) {
        begin(c, "n=%lld from element %lld of 1031", (long long)zs[s][1], (long long)zs[s][0]);
        o = OUT_F(c, "x", x, 1031, BITS);
        RUN(c, zero, F(c, o) + zs[s][0], zs[s][1]);
        end(c);
    }
    static const int64_t ns[] = { 0, 1, 37, 1031 };
    for (size_t s = 0; s < sizeof ns / sizeof *ns; s++) {
        const int64_t n = ns[s];
        begin(c, "n=%lld", (long long)n);
        o = OUT_F(c, "out", NULL, n, BITS);
        int ix = IN_F(c, x, n);
        RUN(c, copy, F(c, o), F(c, ix), n);
        end(c);
        begin(c, "n=%lld", (long long)n);
        o = add_buf(c, "out", T_U16, 1, BITS, NULL, n);
        ix = IN_F(c, x, n);
        RUN(c, to_bf16, U(c, o), F(c, ix), n);
        end(c);
    }
    free(x);
}

/* The replicas' sum, ((x0 + x1) + x2) + ... in replica order, own values anywhere, R past
 * one launch's 8 sources: the CPU table's bits (the same adds), and the CPU table's against
 * that sum written out here. */
static void test_reduce(void)
{
    static const int cases[][2] = { { 2, 0 }, { 2, 1 }, { 3, 1 }, { 9, 0 }, { 9, 8 }, { 12, 10 } };
    static const int64_t ns[] = { 1, 1037 };
    for (size_t z = 0; z < sizeof ns / sizeof *ns; z++)
        for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
            const int R = cases[k][0], own = cases[k][1];
            const int64_t n = ns[z];
            float *mine = rnd(n, -1, 1), *x[12], *want = xalloc(sizeof(float) * (size_t)n);
            kcase c[1];
            begin(c, "R=%d own=%d n=%lld", R, own, (long long)n);
            int o = OUT_F(c, "dst", mine, n, BITS), ix[12];
            const float *on_cpu[12], *on_dev[12];
            for (int q = 0; q < R - 1; q++) {
                x[q] = rnd(n, -1, 1);
                ix[q] = IN_F(c, x[q], n);
                on_cpu[q] = c->b[ix[q]].cpu, on_dev[q] = c->b[ix[q]].dev;
            }
            RUN(c, reduce_replicas, F(c, o), SIDE(c, on_cpu, on_dev), R, own, n);
            for (int64_t i = 0; i < n; i++) { /* x_q: own values at q == own, else the next */
                float acc = 0.0f;
                for (int q = 0, j = 0; q < R; q++) {
                    float v = q == own ? mine[i] : x[j++][i];
                    acc = q == 0 ? v : acc + v;
                }
                want[i] = acc;
            }
            compare(c, &c->b[o], "dst", 0, n, c->b[o].cpu, want, BITS,
                    "of the CPU table vs the sum in replica order");
            end(c);
            for (int q = 0; q < R - 1; q++)
                free(x[q]);
            free(mine), free(want);
        }
}

/* ------------------------------------------------------------------ the table itself */
static void test_status_string(void)
{
    static const int codes[] = { 0, 1, -1, SP_BACKEND_BAD_INDEX, SP_BACKEND_NO_GROUP, 2, 100, 700,
                                 100013, 999999, INT_MIN, INT_MAX };
    const sp_backend *be = D.kind->kernels;
    for (size_t i = 0; i < sizeof codes / sizeof *codes; i++) {
        const char *s = be->status_string(codes[i]);
        EXPECT(s && *s, "status_string(%d): %s, not a name", codes[i], s ? "empty" : "NULL");
    }
}

/* Every offset of sp_backend but name and status_string, once: an entry added to the table
 * without its test here fails. */
static int check_entry_list(void)
{
    const int slots = (int)(sizeof(sp_backend) / sizeof(void *)) - 2;
    int bad = 0;
    if (NENTRIES != slots) {
        fprintf(stderr, "FAIL: sp_backend has %d kernel entries, this test lists %d: test the "
                        "new entry here (entries[] and a test_* function)\n", slots, NENTRIES);
        bad = 1;
    }
    for (int i = 0; i < NENTRIES; i++) {
        int dup = 0;
        for (int j = 0; j < i; j++)
            dup |= entries[j].off == entries[i].off;
        if (dup || entries[i].off == offsetof(sp_backend, name) ||
            entries[i].off == offsetof(sp_backend, status_string)) {
            fprintf(stderr, "FAIL: entries[]: %s listed twice or not a kernel entry\n",
                    entries[i].name);
            bad = 1;
        }
    }
    return bad;
}

/* Each entry ran on both tables, and none of the kind's is NULL. */
static void check_entries_ran(void)
{
    for (int i = 0; i < NENTRIES; i++) {
        void *fn = NULL;
        memcpy(&fn, (const char *)D.kind->kernels + entries[i].off, sizeof fn);
        EXPECT(fn, "entry %s is NULL", entries[i].name);
        EXPECT(D.hit[entries[i].off] && D.cpu_hit[entries[i].off],
               "entry %s never ran through the table in this test", entries[i].name);
    }
}

static int test_kind(const sp_device_kind *k)
{
    memset(&D, 0, sizeof D);
    D.kind = k;
    D.bits = k->cpu_bits;
    const int ndev = k->count ? k->count() : 0;
    if (ndev < 1) {
        printf("%s: no device visible: not tested\n", k->name);
        return 0;
    }
    if (!k->kernels || !k->ctx_create || !k->ctx_destroy || !k->alloc || !k->free || !k->copy ||
        !k->sync || !k->error) {
        fail("the kind lacks its kernels or an entry for use outside StarPU (ctx_create, "
             "ctx_destroy, alloc, free, copy, sync, error)");
        return 1;
    }
    int rc = k->ctx_create(0, &D.ctx);
    if (rc) {
        fail("ctx_create on device 0: %s", k->error(rc));
        return 1;
    }
    printf("%s: table '%s' on device 0 of %d, against the CPU table %s\n", k->name,
           k->kernels->name, ndev,
           D.bits ? "bit for bit (cpu_bits)" : "within the tolerances stated per entry");
    const int checks0 = kc_checks, failures0 = kc_failures;
    const char *seed = getenv("OPS_SEED"); /* every kind sees the same inputs */
    kc_seed(seed ? strtoull(seed, NULL, 0) : 37);
    test_matmul();
    test_bias();
    test_pointwise();
    test_norms();
    test_embed();
    test_embed_vocab();
    test_rope();
    test_swiglu();
    test_attention();
    test_cross_entropy();
    test_vocab_ce();
    test_sum();
    test_adamw();
    test_helpers();
    test_reduce();
    test_status_string();
    check_entries_ran();
    if (kc_verbose || !D.bits) {
        printf("%s: worst error vs the CPU table, per entry and output:\n", k->name);
        for (int i = 0; i < D.nworst; i++)
            printf("  %-34s %.3g\n", D.worst[i].what, D.worst[i].worst);
    }
    printf("%s: %d entries of the table: %d checks, %d failed\n", k->name, NENTRIES,
           kc_checks - checks0, kc_failures - failures0);
    k->ctx_destroy(D.ctx);
    return 1;
}

int main(void)
{
    kc_start();
    sp_kernels_init();
    if (check_entry_list()) return 1;
    int tested = 0;
    for (const sp_device_kind *const *k = OPS_KINDS(); *k; k++)
        tested += test_kind(*k);
    if (!tested) {
        printf("SKIP: no device kind with a device in this build (sp_device_kinds): no table "
               "to compare with the CPU's\n");
        return 77;
    }
    printf("test_backend_ops: %d kind%s tested, %d checks, %d failed\n", tested,
           tested == 1 ? "" : "s", kc_checks, kc_failures);
    return kc_failures ? 1 : 0;
}
