/* Checks shared by the trainer tests: a trained rank's stages against the reference
 * interpreter (bitwise), and the executed task order against the plan. Each returns the
 * number of failures and prints them. */
#ifndef STARPIPE_TEST_TRAIN_CHECK_H
#define STARPIPE_TEST_TRAIN_CHECK_H

#include <stdio.h>
#include <string.h>

#include "starpipe/exec.h"
#include "starpipe/reference.h"
#include "starpipe/train.h"

#define FAIL(...)                                                                          \
    do {                                                                                   \
        fprintf(stderr, "FAIL rank %d: ", sp_exec_rank());                                 \
        fprintf(stderr, __VA_ARGS__);                                                      \
        fputc('\n', stderr);                                                               \
        bad++;                                                                             \
    } while (0)

/* The plan's RUN order on this rank against what the trace says ran. */
static inline int check_order(sp_trainer *t, const char *what)
{
    int bad = 0, me = sp_exec_rank();
    const sp_plan *pl = sp_trainer_plan(t);
    const sp_train_event *ev;
    int n;
    sp_trainer_trace(t, &ev, &n);
    int e = 0;
    for (int j = 0; j < pl->ninstr[me]; j++) {
        const sp_instr *in = &pl->instr[me][j];
        if (in->op != SP_OP_RUN) continue;
        while (e < n && ev[e].kind < 0) e++; /* helper tasks: copies, combines */
        if (e == n) {
            FAIL("%s: the trace ends before %s%d s%d", what, sp_task_kind_name(in->task.kind),
                 in->task.mb, in->task.stage);
            return bad;
        }
        if (ev[e].kind != in->task.kind || ev[e].mb != in->task.mb ||
            ev[e].stage != in->task.stage) {
            FAIL("%s: ran '%s' where the plan has %s mb%d s%d", what, ev[e].name,
                 sp_task_kind_name(in->task.kind), in->task.mb, in->task.stage);
            return bad;
        }
        e++;
    }
    return bad;
}

static inline int compare(sp_trainer *t, sp_reference *r, const sp_program *p, const char *what, int step)
{
    int bad = 0;
    for (int s = 0; s < sp_program_num_stages(p); s++) {
        if (!sp_trainer_owns_stage(t, s)) continue;
        size_t bytes = sp_program_buf_bytes(p, SP_SLAB_PARAMS, s);
        const float *a[4] = { sp_trainer_slab(t, SP_SLAB_PARAMS, s), sp_trainer_slab(t, SP_SLAB_GRADS, s),
                              sp_trainer_moment(t, 0, s), sp_trainer_moment(t, 1, s) };
        const float *b[4] = { sp_reference_slab(r, SP_SLAB_PARAMS, s), sp_reference_slab(r, SP_SLAB_GRADS, s),
                              sp_reference_moment(r, 0, s), sp_reference_moment(r, 1, s) };
        const char *names[4] = { "parameters", "gradients", "AdamW m", "AdamW v" };
        for (int k = 0; k < 4; k++)
            if (!a[k] || memcmp(a[k], b[k], bytes))
                FAIL("%s step %d: %s of stage %d differ from the reference", what, step,
                     names[k], s);
    }
    return bad;
}

#endif
