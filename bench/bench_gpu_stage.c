/* bench_gpu_stage: the achieved TFLOP/s of a whole stage task on the GPU. One GPT stage
 * (all layers, the embedding and the head) runs its F and BW programs through
 * sp_program_run_on with the CUDA table on one stream, timed with CUDA events; the FLOPs are the program's
 * own count (sp_program_flops). fp32, then with TF32 tensor cores, then bf16 operands
 * (--precision bf16: cublasGemmEx with fp32 accumulation, attention on the mma.sync
 * kernels for heads up to 128 columns). No StarPU: this is the
 * kernels' speed, the ceiling for a task. Then the gradient norm's sum of squares over
 * the stage's gradients (sp_optim_param_sumsq_on, one call per parameter tensor, as the
 * sumsq task runs it): its time, bandwidth and share of one microbatch's bf16 F + BW.
 * Exits 77 without a GPU.
 *   bench_gpu_stage [layers channels heads context batch]   (default GPT-2 small, T=1024, B=8) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "codelets/cuda/kernels_cuda.h"
#include "codelets/cuda/backend.h"
#include "starpipe/program.h"
#include "starpipe/data.h"
#include "starpipe/models.h"
#include "starpipe/optim.h"

#define CK(call)                                                                           \
    do {                                                                                   \
        cudaError_t e_ = (call);                                                           \
        if (e_ != cudaSuccess) {                                                           \
            fprintf(stderr, "bench_gpu_stage: %s:%d: %s: %s\n", __FILE__, __LINE__, #call, \
                    cudaGetErrorString(e_));                                               \
            exit(1);                                                                       \
        }                                                                                  \
    } while (0)

/* One device buffer per (class, index) the programs name; inputs filled, params drawn.
 * A buffer the program needs larger after a change of precision (bf16's scratch) is
 * allocated again, zeroed (parameters and inputs keep their sizes). */
typedef struct {
    sp_buf_class cls[64];
    int index[64];
    void *dev[64];
    size_t bytes[64];
    int n;
} dbufs;

static void *dbuf(dbufs *d, const sp_program *p, sp_buf_class cls, int index)
{
    size_t bytes = sp_program_buf_bytes(p, cls, index);
    for (int j = 0; j < d->n; j++)
        if (d->cls[j] == cls && d->index[j] == index) {
            if (bytes > d->bytes[j]) {
                CK(cudaFree(d->dev[j]));
                CK(cudaMalloc(&d->dev[j], bytes));
                CK(cudaMemset(d->dev[j], 0, bytes));
                d->bytes[j] = bytes;
            }
            return d->dev[j];
        }
    void *x;
    CK(cudaMalloc(&x, bytes ? bytes : 4));
    CK(cudaMemset(x, 0, bytes ? bytes : 4));
    d->cls[d->n] = cls;
    d->index[d->n] = index;
    d->bytes[d->n] = bytes;
    d->dev[d->n++] = x;
    return x;
}

static double run(const sp_program *p, sp_task_kind kind, dbufs *d, cudaStream_t s,
                  cublasHandle_t h, int reps)
{
    void *bufs[64];
    int nb = sp_program_num_bufs(p, 0, kind);
    for (int j = 0; j < nb; j++) {
        sp_slab_ref r = sp_program_buf(p, 0, kind, j);
        bufs[j] = dbuf(d, p, r.cls, r.index);
    }
    sp_run_args args = { .dloss = 1.0f };
    sp_cuda_ctx c = { s, h };
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    if (sp_program_run_on(p, 0, kind, bufs, &args, sp_backend_cuda(), &c) != SP_OK) { /* warm-up */
        fprintf(stderr, "bench_gpu_stage: %s\n", sp_last_error());
        exit(1);
    }
    CK(cudaEventRecord(a, s));
    for (int r = 0; r < reps; r++) sp_program_run_on(p, 0, kind, bufs, &args, sp_backend_cuda(), &c);
    CK(cudaEventRecord(b, s));
    CK(cudaEventSynchronize(b));
    float ms;
    CK(cudaEventElapsedTime(&ms, a, b));
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    return ms / 1e3 / reps;
}

int main(int argc, char **argv)
{
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        printf("SKIP: no CUDA device\n");
        return 77;
    }
    sp_gpt_config c = { .vocab = 256, .layers = argc > 1 ? atoi(argv[1]) : 12,
                        .channels = argc > 2 ? atoi(argv[2]) : 768,
                        .heads = argc > 3 ? atoi(argv[3]) : 12,
                        .context = argc > 4 ? atoi(argv[4]) : 1024,
                        .batch = argc > 5 ? atoi(argv[5]) : 8, .stages = 1 };
    sp_status st;
    sp_graph *g = sp_model_gpt(&c, &st);
    sp_program *p = g ? sp_program_build(g, &st) : NULL;
    if (!p) {
        fprintf(stderr, "bench_gpu_stage: %s\n", sp_last_error());
        return 1;
    }
    cudaStream_t s;
    cublasHandle_t h;
    CK(cudaStreamCreate(&s));
    if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS || cublasSetStream(h, s) != CUBLAS_STATUS_SUCCESS ||
        sp_cuda_kernels_init(h) != 0) {
        fprintf(stderr, "bench_gpu_stage: cuBLAS setup failed\n");
        return 1;
    }
    dbufs d = { .n = 0 };
    /* parameters and tokens: real values, so no kernel sees garbage */
    size_t pb = sp_program_buf_bytes(p, SP_BUF_PARAMS, 0);
    float *host = calloc(pb / 4 + 1, sizeof(float));
    for (int i = 0; i < sp_graph_num_params(g); i++) {
        sp_tensor t = sp_graph_param(g, i);
        sp_param_init_values(g, t, 1, host + sp_program_param_offset(p, 0, t));
    }
    CK(cudaMemcpy(dbuf(&d, p, SP_BUF_PARAMS, 0), host, pb, cudaMemcpyHostToDevice));
    free(host);
    for (int k = 0; k < sp_program_num_inputs(p); k++) {
        size_t bytes = sp_program_buf_bytes(p, SP_BUF_INPUT, k);
        int32_t *x = malloc(bytes);
        for (size_t j = 0; j < bytes / 4; j++) x[j] = (int32_t)(sp_mix64(j * 2 + (size_t)k) % 256);
        CK(cudaMemcpy(dbuf(&d, p, SP_BUF_INPUT, k), x, bytes, cudaMemcpyHostToDevice));
        free(x);
    }
    printf("GPT stage: %d layers, %d channels, %d heads, context %d, batch %d "
           "(%lld parameters)\n", c.layers, c.channels, c.heads, c.context, c.batch,
           (long long)sp_graph_param_count(g));
    printf("| task | GFLOP | fp32 ms | fp32 TFLOP/s | TF32 ms | TF32 TFLOP/s | bf16 ms | "
           "bf16 TFLOP/s |\n|---|---|---|---|---|---|---|---|\n");
    sp_task_kind kinds[2] = { SP_TASK_F, SP_TASK_BW };
    double bf16_step = 0.0;
    for (int k = 0; k < 2; k++) {
        double flops = sp_program_flops(p, 0, kinds[k]);
        sp_cuda_set_tf32(h, 0);
        double t32 = run(p, kinds[k], &d, s, h, 5);
        sp_cuda_set_tf32(h, 1);
        double ttf = run(p, kinds[k], &d, s, h, 5);
        sp_cuda_set_tf32(h, 0);
        sp_program_set_precision(p, SP_PRECISION_BF16); /* cublasGemmEx on bf16 operands */
        double tbf = run(p, kinds[k], &d, s, h, 5);
        sp_program_set_precision(p, SP_PRECISION_FP32);
        bf16_step += tbf;
        printf("| %s | %.1f | %.2f | %.1f | %.2f | %.1f | %.2f | %.1f |\n",
               kinds[k] == SP_TASK_F ? "F" : "BW", flops / 1e9, t32 * 1e3, flops / t32 / 1e12,
               ttf * 1e3, flops / ttf / 1e12, tbf * 1e3, flops / tbf / 1e12);
    }
    { /* the gradient norm's sum of squares: the BW runs left real gradients */
        const int np = sp_graph_num_params(g);
        const float *grads = dbuf(&d, p, SP_BUF_GRADS, 0);
        double *sumsq;
        CK(cudaMalloc((void **)&sumsq, sizeof(double) * (size_t)(np > 0 ? np : 1)));
        sp_cuda_ctx cx = { s, h };
        cudaEvent_t a, b;
        CK(cudaEventCreate(&a));
        CK(cudaEventCreate(&b));
        const int reps = 10;
        for (int r = -1; r < reps; r++) { /* r = -1: warm-up */
            if (r == 0) CK(cudaEventRecord(a, s));
            if (sp_optim_param_sumsq_on(p, 0, 0, INT64_MAX, grads, sumsq, sp_backend_cuda(),
                                        &cx) != SP_OK) {
                fprintf(stderr, "bench_gpu_stage: %s\n", sp_last_error());
                exit(1);
            }
        }
        CK(cudaEventRecord(b, s));
        CK(cudaEventSynchronize(b));
        float ms;
        CK(cudaEventElapsedTime(&ms, a, b));
        const double t = ms / 1e3 / reps, bytes = 4.0 * (double)sp_graph_param_count(g);
        printf("grad sumsq: %.3f ms over %d tensors (%lld floats), %.2f TB/s; %.1f%% of one "
               "microbatch's bf16 F + BW (%.2f ms)\n", t * 1e3, np,
               (long long)sp_graph_param_count(g), bytes / t / 1e12, 100.0 * t / bf16_step,
               bf16_step * 1e3);
        cudaEventDestroy(a);
        cudaEventDestroy(b);
        CK(cudaFree(sumsq));
    }
    for (int j = 0; j < d.n; j++) cudaFree(d.dev[j]);
    cublasDestroy(h);
    cudaStreamDestroy(s);
    sp_program_free(p);
    sp_graph_free(g);
    return 0;
}
