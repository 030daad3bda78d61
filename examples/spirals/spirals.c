/* spirals: an MLP classifier trained pipelined over MPI ranks with starpipe. The data are
 * 2-D points on three interleaved spiral arms, generated on the fly; a point's class is
 * its arm. Read main() first, then build_model() and make_batch().
 *
 *   mpirun -np 2 ./spirals [--steps N] [--check]     (STARPIPE_SCHEDULE=zb-h1 ./spirals ...)
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <starpipe/starpipe.h>

enum { BATCH = 64, WIDTH = 64, LAYERS = 4, ARMS = 3 }; /* BATCH points per microbatch */

/* x (BATCH,2) -> LAYERS x [linear, relu] -> linear -> ARMS logits -> cross-entropy with
 * y (BATCH). The hidden layers are dealt out evenly to `stages` stages: each
 * sp_pipeline_yield ends a stage, and what follows it runs in the next. */
static sp_graph *build_model(int stages)
{
    sp_graph *g = sp_graph_create();
    sp_tensor x = sp_input_f32(g, "x", 2, (int64_t[]){ BATCH, 2 });
    sp_tensor y = sp_input_i32(g, "y", 1, (int64_t[]){ BATCH });
    sp_tensor h = x;
    int64_t in = 2;
    char name[32];
    for (int l = 0; l < LAYERS; l++) {
        if (l > 0 && l * stages / LAYERS != (l - 1) * stages / LAYERS)
            h = sp_pipeline_yield(g, h);
        snprintf(name, sizeof name, "l%d.w", l);
        sp_tensor w = sp_param(g, name, 2, (int64_t[]){ in, WIDTH }, SP_INIT_NORMAL,
                               sqrtf(2.0f / in)); /* He initialisation, for relu */
        snprintf(name, sizeof name, "l%d.b", l);
        sp_tensor b = sp_param(g, name, 1, (int64_t[]){ WIDTH }, SP_INIT_ZEROS, 0);
        h = sp_relu(g, sp_bias_add(g, sp_matmul(g, h, w, 0, 0), b));
        in = WIDTH;
    }
    sp_tensor w = sp_param(g, "head.w", 2, (int64_t[]){ WIDTH, ARMS }, SP_INIT_NORMAL, 0.1f);
    sp_tensor b = sp_param(g, "head.b", 1, (int64_t[]){ ARMS }, SP_INIT_ZEROS, 0);
    sp_tensor logits = sp_bias_add(g, sp_matmul(g, h, w, 0, 0), b);
    if (sp_graph_set_loss(g, sp_cross_entropy(g, logits, y)) != SP_OK) {
        sp_graph_free(g);
        return NULL;
    }
    return g;
}

/* Microbatch mb of a step: a pure function of (step, mb), so every rank makes the same
 * one without communicating. Point i lies on arm i % ARMS at radius r in [0, 1), which
 * winds 1.5 turns from the centre out; the angle has a little noise. */
static void make_batch(int step, int mb, float *x, int32_t *y)
{
    uint64_t key = sp_mix64((uint64_t)step << 16 | (uint64_t)mb);
    for (int i = 0; i < BATCH; i++) {
        float r = (sp_mix64(key + 2 * i) >> 40) * 0x1p-24f;
        float noise = (sp_mix64(key + 2 * i + 1) >> 40) * 0x1p-24f - 0.5f;
        float angle = 6.2831853f * ((float)(i % ARMS) / ARMS + 1.5f * r) + 0.3f * noise;
        x[2 * i] = r * cosf(angle);
        x[2 * i + 1] = r * sinf(angle);
        y[i] = i % ARMS;
    }
}

/* --check: the reference interpreter (one process, no pipeline) runs the same step; the
 * loss and this rank's stages (parameters, gradients, AdamW moments) must be bitwise
 * equal to it. Collective: returns the number of differences over all ranks. */
static double differences(sp_trainer *t, sp_reference *ref, const void *const *in, float loss)
{
    float ref_loss;
    double bad = sp_reference_step(ref, in, &ref_loss) != SP_OK || memcmp(&loss, &ref_loss, 4);
    bad += sp_trainer_compare(t, ref, 0, NULL, 0); /* 0: identical bits */
    sp_exec_allreduce_sum(&bad, 1, 1);
    return bad;
}

/* Every rank meets the same errors (same arguments, collective calls): rank 0 says it. */
static int fail(const char *what)
{
    if (sp_exec_rank() == 0) fprintf(stderr, "spirals: %s: %s\n", what, sp_last_error());
    sp_exec_shutdown();
    return 1;
}

int main(int argc, char **argv)
{
    if (sp_exec_init(&argc, &argv, NULL) != SP_OK) { /* MPI, StarPU, StarPU-MPI */
        fprintf(stderr, "spirals: %s\n", sp_last_error());
        return 1;
    }
    int steps = 150, check = 0, rank = sp_exec_rank();
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--check")) check = 1;
        else if (!strcmp(argv[i], "--steps") && i + 1 < argc) steps = atoi(argv[++i]);
        else {
            if (rank == 0)
                fprintf(stderr, "usage: mpirun -np P %s [--steps N] [--check]\n", argv[0]);
            sp_exec_shutdown();
            return 2;
        }
    }
    /* STARPIPE_SCHEDULE (default 1f1b), STARPIPE_MICROBATCHES, STARPIPE_CHUNKS; one actor
     * per rank. The schedule says how many stages the model must have. */
    sp_schedule *sch;
    if (sp_schedule_from_env(NULL, sp_exec_size(), 0, 0, &sch) != SP_OK) return fail("schedule");
    sp_status st = SP_OK;
    sp_graph *g = build_model(sch->nstages);
    sp_program *prog = g ? sp_program_build(g, &st) : NULL; /* stages cut, differentiated */
    if (!prog) return fail("model");
    sp_train_opts opts = { .seed = 1 };
    sp_adamw_defaults(&opts.opt);
    opts.opt.lr = 1e-2f;
    sp_trainer *t = sp_trainer_create(prog, sch, &opts, &st); /* plans the schedule */
    if (!t) return fail("trainer");
    int m = sch->nmicro;
    sp_reference *ref = check ? sp_reference_create(prog, m, &opts.opt, opts.seed, &st) : NULL;
    if (check && !ref) return fail("reference");
    if (rank == 0)
        printf("spirals: %d ranks, schedule %s, %d stages, %d microbatches of %d points%s\n",
               sp_exec_size(), sch->name, sch->nstages, m, BATCH, check ? ", checked" : "");

    float x[m][BATCH * 2];
    int32_t y[m][BATCH];
    void *in[m * 2]; /* in[mb * 2 + k]: microbatch mb of graph input k (x, then y) */
    float first = 0, loss = 0;
    int code = 0;
    for (int step = 1; step <= steps && !code; step++) {
        for (int mb = 0; mb < m; mb++) {
            make_batch(step, mb, x[mb], y[mb]);
            in[mb * 2] = x[mb];
            in[mb * 2 + 1] = y[mb];
        }
        sp_step_stats stats; /* the same status and stats on every rank */
        if (sp_trainer_step(t, (const void *const *)in, &stats) != SP_OK) {
            if (rank == 0) fprintf(stderr, "spirals: step %d: %s\n", step, sp_last_error());
            code = 1;
            break;
        }
        loss = stats.loss;
        first = step == 1 ? loss : first;
        double bad = ref ? differences(t, ref, (const void *const *)in, loss) : 0;
        if (rank == 0)
            printf("step %d loss %.6f%s\n", step, loss, ref && !bad ? "  (= reference)" : "");
        if (bad) {
            if (rank == 0) fprintf(stderr, "spirals: step %d differs from the reference\n", step);
            code = 1;
        }
    }
    if (rank == 0 && !code)
        printf("done: loss %.6f -> %.6f%s\n", first, loss,
               check ? ", every step bitwise equal to the reference" : "");
    sp_reference_free(ref);
    sp_trainer_free(t);
    sp_program_free(prog);
    sp_graph_free(g);
    sp_schedule_free(sch);
    return sp_exec_shutdown() != SP_OK || code;
}
