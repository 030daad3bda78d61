/* The emulated mma.sync m16n8k16 bf16 (simt.cpp) against a plain matrix product: random
 * bf16 A (16 x 16), B (16 x 8) and fp32 C are dealt to the 32 lanes by the inverse of the
 * PTX ISA's fragment maps (which lane and register holds element (r, c)), the warp runs
 * sp_mma_bf16 (codelets/cuda/common.cuh), and every lane's d is put back at its (r, c).
 * Products of bf16 values are exact in fp32, so only the fp32 sum of 16 terms differs
 * from the float64 product: 1e-6 relative. Blocks of 32 and 64 threads (two warps, each
 * its own product). And a warp with a lane that skips the mma ends the process with a
 * message naming the kernel, as a GPU would hang or compute garbage. Then the emulated
 * ldmatrix .x4 (and .trans): four 8 x 8 bf16 matrices whose 32 rows lie scattered in
 * shared memory, each lane's registers against the PTX ISA's map read the other way
 * (element (r, c) of matrix i: lane 4 r + c / 2, half c % 2; transposed, lane 4 c + r / 2,
 * half r % 2). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "codelets/cuda/common.cuh"

struct warp_case {
    uint32_t a[32][4], b[32][2];
    float c[32][4], d[32][4];
};

static __global__ void mma_kernel(warp_case *w)
{
    warp_case &x = w[threadIdx.x / 32];
    const int lane = threadIdx.x % 32;
    sp_mma_bf16(x.d[lane], x.a[lane], x.b[lane], x.c[lane]);
}

static __global__ void mma_skip_kernel(warp_case *w)
{
    const int lane = threadIdx.x % 32;
    if (lane == 5)
        return;
    sp_mma_bf16(w->d[lane], w->a[lane], w->b[lane], w->c[lane]);
}

/* The skipping kernel in a child, its stderr read back: killed, naming kernel and mma. */
static int skip_aborts(void)
{
    int fd[2];
    if (pipe(fd))
        return 0;
    const pid_t pid = fork();
    if (pid == 0) {
        dup2(fd[1], 2);
        close(fd[0]);
        static warp_case w;
        SP_LAUNCH(mma_skip_kernel, dim3(1), dim3(32))(&w);
        cudaDeviceSynchronize();
        _exit(0);
    }
    close(fd[1]);
    char msg[1024] = "";
    size_t n = 0;
    ssize_t r;
    while (n + 1 < sizeof msg && (r = read(fd[0], msg + n, sizeof msg - 1 - n)) > 0)
        n += (size_t)r;
    msg[n] = 0;
    close(fd[0]);
    int st = 0;
    waitpid(pid, &st, 0);
    const int ok = !(WIFEXITED(st) && WEXITSTATUS(st) == 0) && strstr(msg, "mma_skip_kernel") &&
                   strstr(msg, "mma.sync") && strstr(msg, "31 of the 32 lanes");
    printf("%s: a lane skipping the mma: %s", ok ? "ok" : "FAIL", n ? msg : "(no message)\n");
    return ok;
}

static float bf16_of(uint16_t h)
{
    const uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static uint64_t rng = 88172645463325252ull;
static uint64_t next(void)
{
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return rng;
}
/* a random bf16 in [-2, 2), never NaN or infinite */
static uint16_t rand_bf16(void)
{
    float f = (float)((double)(next() >> 11) * 0x1.0p-53 * 4.0 - 2.0);
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)(u >> 16);
}
static void put16(uint32_t *reg, int half, uint16_t h)
{
    *reg = (*reg & (half ? 0x0000ffffu : 0xffff0000u)) | (uint32_t)h << (16 * half);
}

struct ldsm_case {
    alignas(16) uint16_t rows[64][8]; /* the matrices' rows, in a shuffled order */
    int where[4][8];                  /* row j of matrix i is rows[where[i][j]] */
    uint32_t r[2][32][4];             /* [trans][lane][register] */
};

static __global__ void ldsm_kernel(ldsm_case *x)
{
    const int l = threadIdx.x % 32;
    sp_ldmatrix_x4(x->r[0][l], x->rows[x->where[l / 8][l % 8]]);
    sp_ldmatrix_x4_trans(x->r[1][l], x->rows[x->where[l / 8][l % 8]]);
}

static int ldmatrix_ok(void)
{
    static ldsm_case x;
    int perm[64], bad = 0;
    for (int i = 0; i < 64; i++)
        perm[i] = i;
    for (int i = 63; i > 0; i--) {
        const int j = (int)(next() % (uint64_t)(i + 1)), t = perm[i];
        perm[i] = perm[j], perm[j] = t;
    }
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 8; j++)
            x.where[i][j] = perm[8 * i + j];
    for (int k = 0; k < 64; k++)
        for (int c = 0; c < 8; c++)
            x.rows[k][c] = rand_bf16();
    SP_LAUNCH(ldsm_kernel, dim3(1), dim3(32))(&x);
    if (cudaDeviceSynchronize() != cudaSuccess)
        return 0;
    for (int i = 0; i < 4; i++)
        for (int r = 0; r < 8; r++)
            for (int c = 0; c < 8; c++) {
                const uint16_t want = x.rows[x.where[i][r]][c];
                const uint32_t plain = x.r[0][4 * r + c / 2][i], tr = x.r[1][4 * c + r / 2][i];
                if ((uint16_t)(plain >> (16 * (c % 2))) != want ||
                    (uint16_t)(tr >> (16 * (r % 2))) != want)
                    bad++;
            }
    printf("%s: emulated ldmatrix .x4 and .x4.trans (%d of 512 elements misplaced)\n",
           bad ? "FAIL" : "ok", bad);
    return !bad;
}

int main(void)
{
    int bad = 0;
    for (int threads = 32; threads <= 64; threads += 32)
        for (int rep = 0; rep < 20; rep++) {
            const int nw = threads / 32;
            warp_case *w = (warp_case *)calloc((size_t)nw, sizeof *w);
            static double A[2][16][16], B[2][16][8], Cm[2][16][8];
            for (int k = 0; k < nw; k++) {
                for (int r = 0; r < 16; r++)
                    for (int c = 0; c < 16; c++) { /* lane 4 groupID + tig holds row groupID
                                                    (+8), columns 2 tig, 2 tig + 1 (+8) */
                        const uint16_t h = rand_bf16();
                        A[k][r][c] = bf16_of(h);
                        put16(&w[k].a[4 * (r % 8) + (c % 8) / 2][(r >= 8) + 2 * (c >= 8)],
                              c & 1, h);
                    }
                for (int r = 0; r < 16; r++)
                    for (int n = 0; n < 8; n++) { /* lane 4 n + tig: rows 2 tig, 2 tig + 1 (+8) */
                        const uint16_t h = rand_bf16();
                        B[k][r][n] = bf16_of(h);
                        put16(&w[k].b[4 * n + (r % 8) / 2][r >= 8], r & 1, h);
                    }
                for (int r = 0; r < 16; r++)
                    for (int n = 0; n < 8; n++) {
                        const float f = (float)((double)(next() >> 11) * 0x1.0p-53 - 0.5);
                        Cm[k][r][n] = f;
                        w[k].c[4 * (r % 8) + n / 2][2 * (r >= 8) + (n & 1)] = f;
                    }
            }
            SP_LAUNCH(mma_kernel, dim3(1), dim3((unsigned)threads))(w);
            if (cudaDeviceSynchronize() != cudaSuccess) {
                printf("FAIL: launch\n");
                return 1;
            }
            for (int k = 0; k < nw; k++)
                for (int r = 0; r < 16; r++)
                    for (int n = 0; n < 8; n++) {
                        double want = Cm[k][r][n];
                        for (int j = 0; j < 16; j++)
                            want += A[k][r][j] * B[k][j][n];
                        const float got = w[k].d[4 * (r % 8) + n / 2][2 * (r >= 8) + (n & 1)];
                        if (!(fabs(got - want) <= 1e-6 * (1 + fabs(want)))) {
                            if (bad++ < 5)
                                printf("FAIL: warp %d D[%d][%d] = %.9g, want %.9g\n", k, r, n,
                                       got, want);
                        }
                    }
            free(w);
        }
    printf(bad ? "FAIL: %d elements of D wrong\n" : "ok: emulated mma m16n8k16 bf16 = A B + C "
                                                    "(40 products, 1 and 2 warps)\n", bad);
    const int ldsm = ldmatrix_ok();
    return bad != 0 || !skip_aborts() || !ldsm;
}
