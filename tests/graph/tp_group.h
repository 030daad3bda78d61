/* A tensor group of T references in one process, as `--reference --tensor T` runs it:
 * member r builds its graph (rank r of T), its program and reference, and runs in a
 * thread of its own, joined to the others by the in-process group (sp_tp_local). A member
 * that fails aborts the group, so the others leave their next all-reduce. tp_whole
 * assembles a parameter's whole tensor from the members' parts (sp_param_part_to_whole).
 * Used by test_tensor_parallel.c and test_tp_models.c. */
#ifndef SP_TESTS_GRAPH_TP_GROUP_H
#define SP_TESTS_GRAPH_TP_GROUP_H

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "starpipe/graph.h"
#include "starpipe/program.h"
#include "starpipe/reference.h"
#include "tests/check.h"

#define TP_MAX_GROUP 4

/* Member `rank` of a group of T; the graph is freed by tp_free_group. */
typedef sp_graph *(*tp_build_fn)(int T, int rank, const void *ctx);

/* What every member runs: `steps` optimizer steps (0: one forward-backward only) over
 * `microbatches` microbatches of inputs (sp_reference_forward_backward's layout). */
typedef struct {
    int microbatches, steps;
    const void *const *inputs;
    sp_adamw_config opt;
    uint64_t seed;
} tp_run;

typedef struct {
    int T, rank;
    const tp_run *run;
    sp_tp_local *local;
    sp_graph *g;
    sp_program *p;
    sp_reference *r;
    float loss;
    sp_status st;
    char err[256];
} tp_member;

typedef struct {
    int T;
    tp_member m[TP_MAX_GROUP];
    sp_tp_local *local;
    tp_run run;
} tp_group;

static void *tp_member_main(void *arg)
{
    tp_member *m = arg;
    const tp_run *run = m->run;
    m->r = sp_reference_create(m->p, run->microbatches, &run->opt, run->seed, &m->st);
    if (m->r) {
        sp_reference_set_group(m->r, m->T > 1 ? sp_tp_local_member(m->local, m->rank) : NULL);
        m->st = run->steps ? SP_OK : sp_reference_forward_backward(m->r, run->inputs, &m->loss);
        for (int k = 0; k < run->steps && m->st == SP_OK; k++)
            m->st = sp_reference_step(m->r, run->inputs, &m->loss);
    }
    if (m->st) {
        snprintf(m->err, sizeof m->err, "%s", sp_last_error());
        sp_tp_local_abort(m->local);
    }
    return NULL;
}

/* Runs the T members of `build` to the end; a member's failure ends the test. */
static void tp_run_group(tp_group *G, int T, tp_build_fn build, const void *ctx,
                         const tp_run *run)
{
    REQUIRE(T >= 1 && T <= TP_MAX_GROUP, "a group of %d", T);
    memset(G, 0, sizeof *G);
    G->T = T;
    G->run = *run;
    G->local = sp_tp_local_create(T);
    REQUIRE(G->local, "sp_tp_local_create: %s", sp_last_error());
    pthread_t th[TP_MAX_GROUP];
    for (int r = 0; r < T; r++) {
        tp_member *m = &G->m[r];
        *m = (tp_member){ .T = T, .rank = r, .run = &G->run, .local = G->local };
        sp_status st;
        m->g = build(T, r, ctx);
        REQUIRE(m->g, "build T=%d rank %d: %s", T, r, sp_last_error());
        m->p = sp_program_build(m->g, &st);
        REQUIRE(m->p, "program T=%d rank %d: %s", T, r, sp_last_error());
    }
    for (int r = 0; r < T; r++)
        REQUIRE(pthread_create(&th[r], NULL, tp_member_main, &G->m[r]) == 0, "no thread");
    for (int r = 0; r < T; r++) pthread_join(th[r], NULL);
    for (int r = 0; r < T; r++)
        REQUIRE(G->m[r].st == SP_OK, "T=%d member %d: %s", T, r, G->m[r].err);
}

static void tp_free_group(tp_group *G)
{
    for (int r = 0; r < G->T; r++) {
        sp_reference_free(G->m[r].r);
        sp_program_free(G->m[r].p);
        sp_graph_free(G->m[r].g);
    }
    sp_tp_local_free(G->local);
    memset(G, 0, sizeof *G);
}

static int64_t tp_whole_numel(const tp_group *G, const char *name)
{
    return sp_param_whole_numel(G->m[0].g, sp_graph_find(G->m[0].g, name));
}

/* Parameter `name`'s whole tensor from the members' parts: its values (grad 0) or its
 * gradients of the last step (grad 1); tp_whole_numel floats, the caller frees them. */
static float *tp_whole(const tp_group *G, const char *name, int grad)
{
    int64_t n = tp_whole_numel(G, name);
    REQUIRE(n > 0, "no parameter '%s'", name);
    float *w = malloc(sizeof(float) * (size_t)n);
    REQUIRE(w, "out of memory");
    for (int64_t j = 0; j < n; j++) w[j] = NAN; /* any element no part fills shows */
    for (int r = 0; r < G->T; r++) {
        const tp_member *m = &G->m[r];
        sp_tensor t = sp_graph_find(m->g, name);
        const float *v = grad ? sp_reference_grad(m->r, t) : sp_reference_param(m->r, t);
        REQUIRE(v && sp_param_part_to_whole(m->g, t, r, v, w) == SP_OK, "'%s' of member %d: %s",
                name, r, sp_last_error());
    }
    return w;
}

#endif
