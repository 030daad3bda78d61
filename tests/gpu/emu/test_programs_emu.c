/* Training steps with the GPU code on the CPU emulation, against the CPU reference: the
 * trainer's task functions (codelets/tasks.c: stage, local add, combine, copy, AdamW, the
 * same the CPU workers run) on the emulated CUDA device (codelets/cuda/backend.c) inside
 * the reference interpreter itself (graph/interp.c), whose calls of sp_program_run,
 * sp_program_local_add_run, sp_optim_combine, sp_optim_copy_shared and sp_optim_update
 * are linked to the __wrap_ functions here (ld --wrap); they run the task on the CUDA
 * device while on_gpu is set and the CPU code otherwise.
 *
 * Models: the Llama (rotary embeddings, SwiGLU, grouped-query attention at 1, 2 and 4 KV
 * heads; 1 and 2 stages; fp32 and bf16); the GPT on 1 stage (the tied embedding's two uses meet in a local add) and on 2
 * (they meet in a combine, the owner's values go back by copy; BW runs as B then W, as
 * under the zero-bubble schedules), 5 x 64 = 320 positions (the embed backward's scan
 * over earlier positions takes two rounds of 256 threads); the MLP on 2 (ReLU); a small
 * model whose loss adds a sum and a mean, on 3 stages with BW as B then W (the entries of
 * the CUDA backend the others do not reach: sum, sum_dx, and zero for a gradient slot
 * that no op of the stage fills). As on a GPU, a program finds NaN in its scratch, in what it only writes, and in the
 * activations (and activation gradients) of its microbatch when it starts.
 *
 * Each step: loss, parameters, gradients and AdamW moments of every stage within 1e-4,
 * |gpu - cpu| <= 1e-4 (1 + |cpu|), the tolerance of starpipe-gpt --check on a GPU. The
 * GPT in bf16 (cublasGemmEx's products and the tensor-core attention against the CPU's
 * bf16 products and attention): within 2e-2 in L2 norm (compare_norm), its GPU side storing the
 * activations only products read as bf16 (sp_program_set_bf16_activations), bitwise
 * equal to the GPU on fp32 activations. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "codelets/cuda/kernels_cuda.h"
#include "codelets/cuda/backend.h"
#include "codelets/tasks.h"
#include "starpipe/data.h"
#include "starpipe/exec.h"
#include "starpipe/models.h"
#include "starpipe/reference.h"
#include "tests/check.h"

#define TOL 1e-4

static int on_gpu, split_bw;
static long gpu_tasks;
/* CUDA tasks run through each hook: a hook that never runs (ld --wrap no longer reaches
 * the call) would leave that part on the CPU on both sides. */
enum { H_STAGE, H_LOCAL_ADD, H_COMBINE, H_COPY, H_ADAMW, NHOOKS };
static const char *hook_name[NHOOKS] = { "stage", "local add", "combine", "copy", "AdamW" };
static long hook_ran[NHOOKS];
static cudaStream_t stream;
static cublasHandle_t blas;
static sp_cuda_ctx cuda_ctx;
static sp_device gpu; /* what the executor hands a CUDA worker's task: stream and handle */

/* ---- the hooks ------------------------------------------------------------------- */

sp_status __real_sp_program_run(const sp_program *p, int stage, sp_task_kind kind,
                                void *const *bufs, const sp_run_args *args);
void __real_sp_program_local_add_run(const sp_program *p, int stage, float *grads);
void __real_sp_optim_combine(const sp_program *p, int owner, float *owner_grads, int other,
                             const float *other_grads);
void __real_sp_optim_copy_shared(const sp_program *p, int owner, const float *owner_params,
                                 int other, float *other_params);
void __real_sp_optim_update(const sp_program *p, int s, float *params, const float *grads,
                            float *m, float *v, const sp_adamw_config *cfg, float grad_scale,
                            int t);

static void task_ok(int hook, int stage, int rc)
{
    gpu_tasks++;
    hook_ran[hook]++;
    REQUIRE(rc == 0, "%s task of stage %d failed on the emulated GPU: %d", hook_name[hook],
            stage, rc);
}

/* What a program may not rely on: its scratch, what it only writes, and, when its
 * microbatch starts (F; B or BW for the activation gradients), the per-microbatch slabs. */
static void poison(const sp_program *p, int stage, sp_task_kind kind, void *const *bufs)
{
    for (int j = 0; j < sp_program_num_bufs(p, stage, kind); j++) {
        sp_slab_ref r = sp_program_buf(p, stage, kind, j);
        int fresh = r.cls == SP_BUF_SCRATCH || r.mode == SP_ACCESS_W ||
                    (kind == SP_TASK_F && r.cls == SP_BUF_ACT) ||
                    (kind != SP_TASK_W && r.cls == SP_BUF_BGRAD);
        size_t n = (r.cls == SP_BUF_LOSS ? 4 : sp_program_buf_bytes(p, r.cls, r.index)) / 4;
        for (size_t i = 0; fresh && i < n; i++)
            ((float *)bufs[j])[i] = NAN;
    }
}

static sp_status run_task(const sp_program *p, int stage, sp_task_kind kind, void *const *bufs,
                          float dloss)
{
    if (!sp_program_num_ops(p, stage, kind))
        return SP_OK; /* the trainer submits no task */
    poison(p, stage, kind, bufs);
    sp_stage_task_args a = { .prog = p, .stage = stage, .kind = kind, .dloss = dloss };
    int rc = sp_stage_task(&gpu, bufs, NULL, sp_program_num_bufs(p, stage, kind), &a);
    gpu_tasks++;
    hook_ran[H_STAGE]++;
    return rc ? sp_set_error(SP_ERR_RUNTIME, "stage %d task failed on the emulated GPU: %d",
                             stage, rc)
              : SP_OK;
}

/* B and W take BW's buffers in their own order: map them by (class, index). */
static sp_status run_split(const sp_program *p, int stage, sp_task_kind kind,
                           void *const *bw_bufs, float dloss)
{
    void *bufs[64];
    int n = sp_program_num_bufs(p, stage, kind), nbw = sp_program_num_bufs(p, stage, SP_TASK_BW);
    REQUIRE(n <= 64, "stage %d: %d buffers", stage, n);
    for (int j = 0; j < n; j++) {
        sp_slab_ref r = sp_program_buf(p, stage, kind, j);
        bufs[j] = NULL;
        for (int k = 0; k < nbw && !bufs[j]; k++) {
            sp_slab_ref q = sp_program_buf(p, stage, SP_TASK_BW, k);
            if (q.cls == r.cls && q.index == r.index)
                bufs[j] = bw_bufs[k];
        }
        REQUIRE(bufs[j], "stage %d: a buffer of B or W that BW lacks", stage);
    }
    return run_task(p, stage, kind, bufs, dloss);
}

sp_status __wrap_sp_program_run(const sp_program *p, int stage, sp_task_kind kind,
                                void *const *bufs, const sp_run_args *args)
{
    if (!on_gpu)
        return __real_sp_program_run(p, stage, kind, bufs, args);
    float dloss = args ? args->dloss : 1.0f;
    if (kind != SP_TASK_BW || !split_bw)
        return run_task(p, stage, kind, bufs, dloss);
    sp_status st = run_split(p, stage, SP_TASK_B, bufs, dloss);
    return st ? st : run_split(p, stage, SP_TASK_W, bufs, dloss);
}

void __wrap_sp_program_local_add_run(const sp_program *p, int stage, float *grads)
{
    if (!on_gpu) {
        __real_sp_program_local_add_run(p, stage, grads);
        return;
    }
    sp_local_add_task_args a = { .prog = p, .stage = stage };
    void *bufs[1] = { grads };
    if (sp_program_local_adds(p, stage, NULL))
        task_ok(H_LOCAL_ADD, stage, sp_local_add_task(&gpu, bufs, NULL, 1, &a));
}

/* The parameters stages owner and other share, as the trainer's combine and copies see
 * them: (owner offset, other offset, floats). */
static int shared_params(const sp_program *p, int owner, int other, int64_t (*out)[3], int cap)
{
    const sp_graph *g = sp_program_graph(p);
    int n = 0;
    for (int i = 0; i < sp_graph_num_params(g); i++) {
        sp_tensor t = sp_graph_param(g, i);
        int64_t a = sp_program_param_offset(p, owner, t), b = sp_program_param_offset(p, other, t);
        if (a < 0 || b < 0 || sp_program_param_owner(p, t) != owner)
            continue;
        REQUIRE(n < cap, "more than %d shared parameters", cap);
        out[n][0] = a, out[n][1] = b, out[n][2] = sp_tensor_numel(g, t);
        n++;
    }
    return n;
}

void __wrap_sp_optim_combine(const sp_program *p, int owner, float *owner_grads, int other,
                             const float *other_grads)
{
    if (!on_gpu) {
        __real_sp_optim_combine(p, owner, owner_grads, other, other_grads);
        return;
    }
    int64_t sh[16][3];
    void *bufs[2] = { owner_grads, (void *)other_grads };
    for (int k = 0, n = shared_params(p, owner, other, sh, 16); k < n; k++) {
        sp_combine_task_args a = { .dst_off = sh[k][0], .n = sh[k][2] };
        a.src_off[1] = sh[k][1];
        task_ok(H_COMBINE, owner, sp_combine_task(&gpu, bufs, NULL, 2, &a));
    }
}

void __wrap_sp_optim_copy_shared(const sp_program *p, int owner, const float *owner_params,
                                 int other, float *other_params)
{
    if (!on_gpu) {
        __real_sp_optim_copy_shared(p, owner, owner_params, other, other_params);
        return;
    }
    int64_t sh[16][3];
    void *bufs[2] = { other_params, (void *)owner_params };
    for (int k = 0, n = shared_params(p, owner, other, sh, 16); k < n; k++) {
        sp_copy_task_args a = { .dst_off = sh[k][1], .src_off = sh[k][0], .n = sh[k][2] };
        task_ok(H_COPY, other, sp_copy_task(&gpu, bufs, NULL, 2, &a));
    }
}

void __wrap_sp_optim_update(const sp_program *p, int s, float *params, const float *grads,
                            float *m, float *v, const sp_adamw_config *cfg, float grad_scale,
                            int t)
{
    if (!on_gpu) {
        __real_sp_optim_update(p, s, params, grads, m, v, cfg, grad_scale, t);
        return;
    }
    sp_optim_task_args a = { .prog = p, .stage = s, .opt = *cfg, .grad_scale = grad_scale,
                             .t = t };
    void *bufs[4] = { params, (void *)grads, m, v };
    task_ok(H_ADAMW, s, sp_optim_task(&gpu, bufs, NULL, 4, &a));
}

/* ---- the comparison --------------------------------------------------------------- */

static int close_to(double got, double want) { return fabs(got - want) <= TOL * (1 + fabs(want)); }

static void compare_floats(const char *model, int step, int s, const char *what,
                           const float *gpu, const float *cpu, size_t n)
{
    size_t bad = 0, worst_at = 0;
    double worst = 0.0;
    for (size_t j = 0; j < n; j++) {
        double d = fabs((double)gpu[j] - cpu[j]) / (1 + fabs((double)cpu[j]));
        bad += !close_to(gpu[j], cpu[j]);
        if (!(d <= worst))
            worst = d, worst_at = j;
    }
    printf("  step %d stage %d %-6s %7zu floats, worst %.2g\n", step, s, what, n, worst);
    CHECK(!bad, "%s step %d stage %d %s: %zu of %zu floats beyond %g, worst at %zu: gpu %.9g "
          "cpu %.9g", model, step, s, what, bad, n, TOL, worst_at, gpu[worst_at], cpu[worst_at]);
}

/* bf16: a value near a rounding boundary of bfloat16 lands on the other side when the two
 * sides summed it in another order (2^-8 relative), and AdamW turns a tiny gradient of the
 * other sign into a step of the other sign: no per-float bound holds. What must hold is
 * the whole: each slab within BF16_TOL of the CPU's in relative L2 norm, the loss within
 * BF16_TOL. */
#define BF16_TOL 2e-2
static void compare_norm(const char *model, int step, int s, const char *what, const float *gpu,
                         const float *cpu, size_t n)
{
    double d = 0, r = 0;
    for (size_t j = 0; j < n; j++) {
        double e = (double)gpu[j] - cpu[j];
        d += e * e;
        r += (double)cpu[j] * cpu[j];
    }
    double rel = sqrt(d) / (sqrt(r) > 0 ? sqrt(r) : 1);
    printf("  step %d stage %d %-6s %7zu floats, relative L2 %.2g\n", step, s, what, n, rel);
    CHECK(rel <= BF16_TOL, "%s step %d stage %d %s: relative L2 difference %.3g > %g", model,
          step, s, what, rel, BF16_TOL);
}

typedef struct {
    const char *name;
    sp_graph *g;
    int m, gpt, split_bw;
    int B, T, in_dim, classes; /* the inputs of one microbatch */
    int bf16;                  /* bf16 matrix products (the CUDA table's GemmEx path) */
} model;

static void train(const model *md, int steps)
{
    sp_status st;
    REQUIRE(md->g, "%s: %s", md->name, sp_last_error());
    /* the CPU reference keeps every activation in fp32; the GPU runs what a trainer runs:
     * under bf16, the activations only products read stored as bf16 (pg), and, to show
     * that this storage changes no bit on the GPU either, also on fp32 activations (p) */
    sp_precision prec = md->bf16 ? SP_PRECISION_BF16 : SP_PRECISION_FP32;
    sp_program *p = sp_program_build(md->g, &st), *pg = sp_program_build(md->g, &st);
    REQUIRE(p && pg && !sp_program_set_precision(p, prec) && !sp_program_set_precision(pg, prec) &&
                !sp_program_set_bf16_activations(pg, 1),
            "%s: %s", md->name, sp_last_error());
    if (md->bf16)
        for (int s = 0; s < sp_program_num_stages(p); s++)
            REQUIRE(sp_program_buf_bytes(pg, SP_BUF_ACT, s) <
                        sp_program_buf_bytes(p, SP_BUF_ACT, s),
                    "%s stage %d: no activation stored as bf16", md->name, s);
    sp_adamw_config opt;
    sp_adamw_defaults(&opt);
    opt.lr = 1e-3f;
    opt.grad_clip = 1.0f;
    sp_reference *cpu = sp_reference_create(p, md->m, &opt, 1337, &st);
    sp_reference *gpu = sp_reference_create(pg, md->m, &opt, 1337, &st);
    sp_reference *gpu32 = md->bf16 ? sp_reference_create(p, md->m, &opt, 1337, &st) : NULL;
    REQUIRE(cpu && gpu && (gpu32 || !md->bf16), "%s: %s", md->name, sp_last_error());
    REQUIRE(sp_program_num_inputs(p) == 2, "%s: 2 inputs expected", md->name);
    void *in[2 * 8];
    REQUIRE(md->m <= 8, "at most 8 microbatches");
    const size_t n0 = (size_t)md->B * (md->gpt ? md->T : md->in_dim);
    const size_t n1 = (size_t)md->B * (md->gpt ? md->T : 1);
    for (int i = 0; i < md->m; i++)
        in[2 * i] = malloc(n0 * 4), in[2 * i + 1] = malloc(n1 * 4);
    printf("%s: %d stages, %d microbatches%s%s\n", md->name, sp_program_num_stages(p), md->m,
           md->split_bw ? ", BW as B then W" : "", md->bf16 ? ", bf16 matmuls" : "");
    for (int step = 1; step <= steps; step++) {
        for (int i = 0; i < md->m; i++) {
            if (!md->gpt) {
                sp_mlp_batch(7, step, i, md->B, md->in_dim, md->classes, in[2 * i], in[2 * i + 1]);
                continue;
            }
            for (size_t k = 0; k < n0; k++) {
                ((int32_t *)in[2 * i])[k] = (int32_t)(sp_mix64(1000u * step + 100u * i + k) % 256);
                ((int32_t *)in[2 * i + 1])[k] = (int32_t)(sp_mix64(7u * step + 100u * i + k) % 256);
            }
        }
        float lc = NAN, lg = NAN;
        REQUIRE(sp_reference_step(cpu, (const void *const *)in, &lc) == SP_OK, "%s cpu: %s",
                md->name, sp_last_error());
        on_gpu = 1, split_bw = md->split_bw;
        long before = gpu_tasks;
        st = sp_reference_step(gpu, (const void *const *)in, &lg);
        float l32 = lg;
        if (st == SP_OK && gpu32) st = sp_reference_step(gpu32, (const void *const *)in, &l32);
        on_gpu = 0;
        REQUIRE(st == SP_OK, "%s emulated gpu: %s", md->name, sp_last_error());
        CHECK(!memcmp(&l32, &lg, 4), "%s step %d: loss %.9g with bf16 activations, %.9g with "
              "fp32 ones", md->name, step, lg, l32);
        REQUIRE(gpu_tasks > before, "%s: no CUDA task ran: the --wrap hooks are not in effect",
                md->name);
        printf(" step %d loss cpu %.7f gpu %.7f\n", step, lc, lg);
        CHECK(isfinite(lg) && (md->bf16 ? fabs(lg - lc) <= BF16_TOL * fabs(lc) : close_to(lg, lc)),
              "%s step %d: loss gpu %.9g cpu %.9g", md->name, step, lg, lc);
        void (*compare)(const char *, int, int, const char *, const float *, const float *,
                        size_t) = md->bf16 ? compare_norm : compare_floats;
        for (int s = 0; s < sp_program_num_stages(p); s++) {
            size_t np = sp_program_buf_bytes(p, SP_BUF_PARAMS, s) / 4;
            size_t ng = sp_program_buf_bytes(p, SP_BUF_GRADS, s) / 4;
            compare(md->name, step, s, "params", sp_reference_slab(gpu, SP_BUF_PARAMS, s),
                    sp_reference_slab(cpu, SP_BUF_PARAMS, s), np);
            compare(md->name, step, s, "grads", sp_reference_slab(gpu, SP_BUF_GRADS, s),
                    sp_reference_slab(cpu, SP_BUF_GRADS, s), ng);
            compare(md->name, step, s, "adam m", sp_reference_moment(gpu, 0, s),
                    sp_reference_moment(cpu, 0, s), np);
            compare(md->name, step, s, "adam v", sp_reference_moment(gpu, 1, s),
                    sp_reference_moment(cpu, 1, s), np);
            if (!gpu32) continue;
            const float *got[4] = { sp_reference_slab(gpu, SP_BUF_PARAMS, s),
                                    sp_reference_slab(gpu, SP_BUF_GRADS, s),
                                    sp_reference_moment(gpu, 0, s),
                                    sp_reference_moment(gpu, 1, s) };
            const float *want[4] = { sp_reference_slab(gpu32, SP_BUF_PARAMS, s),
                                     sp_reference_slab(gpu32, SP_BUF_GRADS, s),
                                     sp_reference_moment(gpu32, 0, s),
                                     sp_reference_moment(gpu32, 1, s) };
            for (int k = 0; k < 4; k++)
                CHECK(!memcmp(got[k], want[k], 4 * (k == 1 ? ng : np)), "%s step %d stage %d: "
                      "%s differ between bf16 and fp32 activations on the GPU", md->name, step,
                      s, (const char *[]){ "params", "grads", "adam m", "adam v" }[k]);
        }
    }
    for (int i = 0; i < 2 * md->m; i++)
        free(in[i]);
    sp_reference_free(cpu);
    sp_reference_free(gpu);
    sp_reference_free(gpu32);
    sp_program_free(p);
    sp_program_free(pg);
    sp_graph_free(md->g);
}

/* x (B,D) and y (B): the MLP's inputs; 3 stages. b (stage 0) is read by stage 2, which
 * hands its gradient back, and by an op of stage 1 that does not reach the loss: stage 1
 * sends b's gradient slot as zeros, which stage 0 adds. The loss is cross_entropy +
 * mean(relu(logits)) + sum(logits) / 1000. */
static sp_graph *model_sums(int B, int D, int V, sp_status *st)
{
    sp_graph *g = sp_graph_create();
    sp_tensor x = sp_input_f32(g, "x", 2, (int64_t[]){ B, D });
    sp_tensor y = sp_input_i32(g, "y", 1, (int64_t[]){ B });
    sp_tensor w[4];
    for (int k = 0; k < 4; k++) {
        char name[8];
        snprintf(name, sizeof name, "w%d", k);
        w[k] = sp_param(g, name, 2, (int64_t[]){ D, k % 2 ? V : D }, SP_INIT_NORMAL, 0.3f);
    }
    sp_tensor b = sp_matmul(g, x, w[1], 0, 0);
    sp_tensor h = sp_pipeline_yield(g, sp_matmul(g, x, w[0], 0, 0));
    sp_relu(g, b);
    h = sp_pipeline_yield(g, sp_matmul(g, h, w[2], 0, 0));
    sp_tensor logits = sp_add(g, sp_matmul(g, h, w[3], 0, 0), b);
    sp_tensor loss = sp_add(g, sp_add(g, sp_cross_entropy(g, logits, y),
                                      sp_mean(g, sp_relu(g, logits))),
                            sp_scale(g, sp_sum(g, logits), 1e-3f));
    *st = sp_graph_set_loss(g, loss);
    if (*st != SP_OK) {
        sp_graph_free(g);
        return NULL;
    }
    return g;
}

int main(void)
{
    REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess &&
                cublasCreate(&blas) == CUBLAS_STATUS_SUCCESS && !sp_cuda_kernels_init(blas),
            "emulated CUDA setup");
    gpu = sp_device_cuda(&cuda_ctx, stream, blas);
    sp_status st;
    for (int stages = 1; stages <= 2; stages++) {
        sp_gpt_config c = { .vocab = 256, .context = 64, .layers = 2, .heads = 4, .channels = 64,
                            .batch = 5, .stages = stages };
        model md = { .name = "gpt", .g = sp_model_gpt(&c, &st), .m = 2, .gpt = 1,
                     .split_bw = stages == 2, .B = c.batch, .T = c.context };
        train(&md, 3);
        if (stages == 2) { /* bf16: the CPU's rounding against cublasGemmEx's */
            md.g = sp_model_gpt(&c, &st);
            md.bf16 = 1;
            md.name = "gpt-bf16";
            train(&md, 3);
        }
    }
    /* the Llama: rotary embeddings, SwiGLU, grouped-query attention (4 heads sharing 1, 2
     * or 4 KV heads), on 1 stage and on 2 with BW as B then W, and in bf16 */
    static const char *const llama_names[5] = { "", "llama kv 1", "llama kv 2", "",
                                                "llama kv 4" };
    for (int kv = 1; kv <= 4; kv *= 2) {
        sp_llama_config lc = { .vocab = 256, .context = 64, .layers = 2, .heads = 4,
                               .kv_heads = kv, .channels = 64, .hidden = 96, .batch = 3,
                               .stages = kv == 2 ? 2 : 1 };
        model md = { .name = llama_names[kv], .g = sp_model_llama(&lc, &st), .m = 2,
                     .gpt = 1, .split_bw = lc.stages == 2, .B = lc.batch, .T = lc.context };
        train(&md, 3);
        if (kv == 2) {
            md.g = sp_model_llama(&lc, &st);
            md.bf16 = 1;
            md.name = "llama kv 2, bf16";
            train(&md, 3);
        }
    }
    sp_mlp_config mc = { .in_dim = 24, .width = 48, .depth = 2, .classes = 10, .batch = 16,
                         .stages = 2 };
    model mlp = { .name = "mlp", .g = sp_model_mlp(&mc, &st), .m = 3, .B = mc.batch,
                  .in_dim = mc.in_dim, .classes = mc.classes };
    train(&mlp, 3);
    model sums = { .name = "sums", .g = model_sums(12, 16, 10, &st), .m = 2, .split_bw = 1,
                   .B = 12, .in_dim = 16, .classes = 10 };
    train(&sums, 3);
    cublasDestroy(blas);
    cudaStreamDestroy(stream);
    printf("%ld CUDA tasks\n", gpu_tasks);
    for (int k = 0; k < NHOOKS; k++)
        CHECK(hook_ran[k] > 0, "no %s task ran: ld --wrap does not reach that call of "
              "graph/interp.c any more", hook_name[k]);
    return check_summary("gpu_emu.programs");
}
