/* sort: a small transformer learns to sort digits, trained pipelined over MPI ranks with
 * starpipe. Each sequence is 8 random digits, a separator, then the same digits sorted;
 * after the separator the model must write the sorted digits, one per position, seeing
 * only what came before (causal attention). Read main() first, then build_model().
 *
 *   mpirun -np 2 ./sort [--steps N] [--check]     (STARPIPE_SCHEDULE=interleaved-1f1b ...)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <starpipe/starpipe.h>

enum {
    DIGITS = 8, T = 2 * DIGITS, SEP = 10, VOCAB = 11, /* tokens: digits 0-9 and SEP */
    BATCH = 16, C = 32, HEADS = 4, BLOCKS = 4          /* sequences per microbatch, model */
};

/* x (..., in) -> x w + b: parameters <block>.<what>.w (in,out) and .b (out). */
static sp_tensor linear(sp_graph *g, sp_tensor x, const char *block, const char *what,
                        int64_t in, int64_t out)
{
    char n[64];
    snprintf(n, sizeof n, "%s.%s.w", block, what);
    sp_tensor w = sp_param(g, n, 2, (int64_t[]){ in, out }, SP_INIT_NORMAL, 0.02f);
    snprintf(n, sizeof n, "%s.%s.b", block, what);
    sp_tensor b = sp_param(g, n, 1, (int64_t[]){ out }, SP_INIT_ZEROS, 0);
    return sp_bias_add(g, sp_matmul(g, x, w, 0, 0), b);
}

/* LayerNorm over C: gain <block>.<what>.g and bias .b */
static sp_tensor norm(sp_graph *g, sp_tensor x, const char *block, const char *what)
{
    char n[64];
    snprintf(n, sizeof n, "%s.%s.g", block, what);
    sp_tensor gain = sp_param(g, n, 1, (int64_t[]){ C }, SP_INIT_ONES, 0);
    snprintf(n, sizeof n, "%s.%s.b", block, what);
    sp_tensor bias = sp_param(g, n, 1, (int64_t[]){ C }, SP_INIT_ZEROS, 0);
    return sp_layernorm(g, x, gain, bias);
}

/* tokens (BATCH,T) -> token + position embedding -> BLOCKS pre-norm transformer blocks
 * (attention, then an MLP with GELU, each added to the residual stream) -> LayerNorm ->
 * logits (BATCH,T,VOCAB) -> cross-entropy with targets (BATCH,T). The blocks are dealt out
 * evenly to `stages` stages; sp_pipeline_yield hands the residual stream to the next. */
static sp_graph *build_model(int stages)
{
    sp_graph *g = sp_graph_create();
    sp_tensor tokens = sp_input_i32(g, "tokens", 2, (int64_t[]){ BATCH, T });
    sp_tensor targets = sp_input_i32(g, "targets", 2, (int64_t[]){ BATCH, T });
    sp_tensor wte = sp_param(g, "wte", 2, (int64_t[]){ VOCAB, C }, SP_INIT_NORMAL, 0.1f);
    sp_tensor wpe = sp_param(g, "wpe", 2, (int64_t[]){ T, C }, SP_INIT_NORMAL, 0.1f);
    sp_tensor x = sp_embed(g, tokens, wte, wpe); /* (BATCH,T,C) */
    for (int l = 0; l < BLOCKS; l++) {
        if (l > 0 && l * stages / BLOCKS != (l - 1) * stages / BLOCKS)
            x = sp_pipeline_yield(g, x);
        char b[16];
        snprintf(b, sizeof b, "b%d", l);
        sp_tensor h = linear(g, norm(g, x, b, "ln1"), b, "qkv", C, 3 * C);
        h = sp_attention(g, h, HEADS); /* (BATCH,T,3C) -> (BATCH,T,C), causal */
        x = sp_add(g, x, linear(g, h, b, "proj", C, C));
        h = sp_gelu(g, linear(g, norm(g, x, b, "ln2"), b, "fc", C, 4 * C));
        x = sp_add(g, x, linear(g, h, b, "fcproj", 4 * C, C));
    }
    sp_tensor logits = linear(g, norm(g, x, "out", "ln"), "out", "head", C, VOCAB);
    if (sp_graph_set_loss(g, sp_cross_entropy(g, logits, targets)) != SP_OK) {
        sp_graph_free(g);
        return NULL;
    }
    return g;
}

/* Microbatch mb of a step, the same on every rank: tokens = 8 digits, SEP, the sorted
 * digits but the last; targets = the next token, except that while the digits are read
 * (nothing can be predicted yet) the answer is SEP: every target can be learned. */
static void make_batch(int step, int mb, int32_t *tokens, int32_t *targets)
{
    uint64_t key = sp_mix64((uint64_t)step << 16 | (uint64_t)mb);
    for (int b = 0; b < BATCH; b++) {
        int32_t *tok = tokens + b * T, *tgt = targets + b * T, count[10] = { 0 };
        for (int i = 0; i < DIGITS; i++) {
            tok[i] = (int32_t)(sp_mix64(key + (uint64_t)(b * DIGITS + i)) % 10);
            count[tok[i]]++;
        }
        tok[DIGITS] = SEP;
        for (int d = 0, i = DIGITS; d < 10; d++) /* counting sort into tgt[DIGITS..] */
            while (count[d]--) tgt[i++] = d;
        for (int i = 0; i < DIGITS; i++) tgt[i] = SEP;
        for (int i = DIGITS + 1; i < T; i++) tok[i] = tgt[i - 1];
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
    if (sp_exec_rank() == 0) fprintf(stderr, "sort: %s: %s\n", what, sp_last_error());
    sp_exec_shutdown();
    return 1;
}

int main(int argc, char **argv)
{
    if (sp_exec_init(&argc, &argv, NULL) != SP_OK) { /* MPI, StarPU, StarPU-MPI */
        fprintf(stderr, "sort: %s\n", sp_last_error());
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
        printf("sort: %d ranks, schedule %s, %d stages, %d microbatches of %d sequences%s\n",
               sp_exec_size(), sch->name, sch->nstages, m, BATCH, check ? ", checked" : "");

    int32_t tokens[m][BATCH * T], targets[m][BATCH * T];
    void *in[m * 2]; /* in[mb * 2 + k]: microbatch mb of graph input k (tokens, targets) */
    float first = 0, loss = 0;
    int code = 0;
    for (int step = 1; step <= steps && !code; step++) {
        for (int mb = 0; mb < m; mb++) {
            make_batch(step, mb, tokens[mb], targets[mb]);
            in[mb * 2] = tokens[mb];
            in[mb * 2 + 1] = targets[mb];
        }
        sp_step_stats stats; /* the same status and stats on every rank */
        if (sp_trainer_step(t, (const void *const *)in, &stats) != SP_OK) {
            if (rank == 0) fprintf(stderr, "sort: step %d: %s\n", step, sp_last_error());
            code = 1;
            break;
        }
        loss = stats.loss;
        first = step == 1 ? loss : first;
        double bad = ref ? differences(t, ref, (const void *const *)in, loss) : 0;
        if (rank == 0)
            printf("step %d loss %.6f%s\n", step, loss, ref && !bad ? "  (= reference)" : "");
        if (bad) {
            if (rank == 0) fprintf(stderr, "sort: step %d differs from the reference\n", step);
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
