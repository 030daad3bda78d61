/* What STARPIPE_VERBOSE prints of a pipelined run (describe.h): the plan, the ranks of
 * each pipeline, each rank's memory as predicted, allocated and used, its transfers. */
#include "apps/describe.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "apps/preflight.h"
#include "starpipe/exec.h"
#include "starpipe/optim.h"

void app_describe_plan(const sp_plan *pl, const sp_program *p, int verbose)
{
    const sp_stage_model *model = sp_program_stage_model(p);
    sp_sim_result *r = NULL;
    sp_sim_config cfg = { 0 };
    int simulated = sp_simulate(pl, model, &cfg, &r) == SP_OK;
    printf("plan: %d tasks, %lld messages per step; with FLOP-proportional task times the "
           "simulated bubble is %.1f%%\n", pl->ntasks, (long long)pl->nmessages,
           simulated ? 100 * r->bubble_fraction : 0.0);
    for (int a = 0; a < pl->nactors; a++)
        printf("  actor %d: %d instructions, peak %.2f MiB (activations %.2f, boundary %.2f, "
               "parameters %.2f, %d stage activations live)\n", a, pl->ninstr[a],
               pl->peak[a].total / 1048576.0, pl->peak[a].acts / 1048576.0,
               pl->peak[a].boundary / 1048576.0, pl->peak[a].params / 1048576.0,
               pl->peak[a].act_units);
    for (int s = 0; s < model->nstages; s++)
        printf("  stage %d: activations %zu bytes per microbatch, activation gradients kept "
               "for W %zu, task scratch %zu bytes\n", s, model->stage[s].act_bytes,
               model->stage[s].bgrad_bytes, sp_program_buf_bytes(p, SP_BUF_SCRATCH, s));
    if (simulated) sp_sim_result_free(r);
    if (verbose >= 2) sp_plan_write(pl, stdout);
}

void app_describe_layout(const sp_layout *l)
{
    printf("ranks (%s-major): ", sp_rank_order_name(l->order));
    for (int r = 0; r < l->replicas; r++) {
        printf("%sreplica %d = ranks", r ? "; " : "", r);
        for (int a = 0; a < l->actors; a++) printf(" %d", sp_layout_rank(l, r, a));
    }
    printf(" (actor order)\n");
}

int app_describe_memory(sp_trainer *t, const sp_program *p, int R, int sharded)
{
    int P = sp_exec_size(), me = sp_exec_rank();
    double *v = calloc(3 * (size_t)P, sizeof *v);
    if (!v) return 1;
    double pred = 0;
    for (int s = 0; s < sp_program_num_stages(p); s++)
        if (sp_trainer_owns_stage(t, s))
            pred += 2.0 * (double)sp_program_buf_bytes(p, SP_BUF_PARAMS, s) / (sharded ? R : 1);
    sp_train_memory mem = sp_trainer_memory(t);
    v[3 * me] = pred, v[3 * me + 1] = (double)mem.optimizer, v[3 * me + 2] = (double)mem.persistent;
    int bad = sp_exec_allreduce_sum(v, 3 * (size_t)P, 1) != SP_OK;
    sp_layout l = sp_trainer_layout(t);
    for (int k = 0; !bad && me == 0 && k < P; k++) {
        int r, a;
        sp_layout_place(&l, k, &r, &a);
        printf("  rank %d (replica %d, actor %d): AdamW state %.3f MiB (predicted %.3f MiB%s), "
               "persistent buffers %.3f MiB\n", k, r, a, v[3 * k + 1] / 1048576.0,
               v[3 * k] / 1048576.0, sharded ? ", 1/R" : "", v[3 * k + 2] / 1048576.0);
    }
    free(v);
    return bad;
}

/* The per-link counters: the bytes of the messages this rank sent in the last step to
 * each other host (counted where it posted them: the pipeline's and the replicas'; the
 * tensor groups' all-reduces are not among them), beside the plan's: its SENDs, each to
 * the rank of its peer actor in this rank's replica and tensor place, and per stage it
 * holds and other replica c, shard c of the gradients and its own shard back (of the
 * gradients, or of the parameters with ZeRO-1: the same floats). Silent where every rank
 * is on this host. */
static void describe_links(sp_trainer *t, const sp_plan *pl, int actor)
{
    int me = sp_exec_rank(), n = sp_exec_size();
    sp_layout l = sp_trainer_layout(t);
    int rep, a, tt;
    sp_layout_place_t(&l, me, &rep, &a, &tt);
    unsigned long long *plan = calloc((size_t)n, sizeof *plan);
    if (!plan) return;
    for (int i = 0; i < pl->ninstr[actor]; i++) {
        const sp_instr *in = &pl->instr[actor][i];
        int r = in->op == SP_OP_SEND ? sp_layout_rank_t(&l, rep, in->peer, tt) : -1;
        if (r >= 0 && r < n) plan[r] += sp_trainer_send_bytes(t, in);
    }
    if (sp_trainer_replica_bytes(t, plan) != SP_OK) {
        free(plan);
        return;
    }
    char line[1024];
    int k = 0, shown = 0;
    unsigned long long sent = 0, planned = 0;
    const char *mine = sp_exec_hostname(me);
    for (int r = 0; r < n; r++) { /* per host, in the order of its first rank */
        const char *h = sp_exec_hostname(r);
        int first = strcmp(h, mine) != 0;
        for (int q = 0; first && q < r; q++)
            first = strcmp(sp_exec_hostname(q), h) != 0;
        if (!first) continue;
        unsigned long long hs = 0, hp = 0;
        for (int q = r; q < n; q++)
            if (!strcmp(sp_exec_hostname(q), h))
                hs += sp_trainer_bytes_sent_to(t, q), hp += plan[q];
        sent += hs, planned += hp, shown++;
        if (k < (int)sizeof line)
            k += snprintf(line + k, sizeof line - (size_t)k, "%s%s %llu", shown > 1 ? ", " : "",
                          h, hs);
    }
    free(plan);
    if (shown)
        fprintf(stderr, "starpipe: rank %d: messages to other hosts in the last step: %llu bytes (%s); "
                "the plan's: %llu%s%s\n", me, sent, line, planned,
                sent == planned ? "" : " (not equal)",
                sp_trainer_scatter_gather_peers(t) ? "; boundary tensors scatter-gathered" : "");
}

void app_describe_use(sp_trainer *t, const sp_program *p, int actor, int step,
                      double dev_buffers)
{
    int me = sp_exec_rank();
    app_device_memory_used(step, dev_buffers);
    sp_train_memory mem = sp_trainer_memory(t);
    const sp_plan *pl = sp_trainer_plan(t);
    const sp_mem_peak *k = &pl->peak[actor]; /* every replica of an actor: the same plan */
    size_t packed = 0; /* the plan's pool as the runtime packs it */
    if (sp_plan_pool_bytes(pl, sp_program_stage_model(p), actor, &packed) != SP_OK)
        packed = 0;
    fprintf(stderr, "starpipe: rank %d: per-microbatch buffers %.2f MiB at their peak "
            "(plan %.2f MiB as whole buffers, %.2f MiB live at their peak: activations, "
            "boundary tensors and their gradients); copies of sends in flight %.2f "
            "MiB at their peak; persistent buffers %.2f MiB (of which AdamW moments "
            "%.2f MiB; host memory %.2f MiB)\n", me, mem.transient / 1048576.0,
            packed / 1048576.0, (double)k->transient / 1048576.0, mem.staging / 1048576.0,
            mem.persistent / 1048576.0, mem.optimizer / 1048576.0, mem.host / 1048576.0);
    sp_exec_transfers tr = sp_exec_transfer_counts();
    fprintf(stderr, "starpipe: rank %d: transfers over %s: %llu sends (%llu bytes), %llu "
            "receives (%llu bytes); %llu in eager pieces; %llu sends posted by their "
            "producing task; %llu sends and %llu receives in groups\n", me, tr.transport,
            tr.sends, tr.bytes_sent, tr.recvs, tr.bytes_received, tr.pieced, tr.by_producer,
            tr.group_sends, tr.group_recvs);
    describe_links(t, pl, actor);
}
