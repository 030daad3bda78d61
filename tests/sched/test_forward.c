/* Forward-only plans (evaluation): sp_schedule_forward on the placement of every built-in
 * schedule, p = 1..4, with a tied weight and a skip connection. Each plan is well formed
 * (sp_plan_check, the simulator with rendezvous channels), runs every F once and nothing
 * else, sends each boundary tensor that crosses actors once per microbatch, frees every
 * activation right after its F, never touches a gradient, optimizer or backward buffer,
 * and counts only parameters as persistent memory. The text format keeps the flag, and
 * invalid forward-only schedules are refused with a message (a backward task, a missing
 * F, a cycle); a training schedule of F tasks alone is still refused. */
#include <string.h>

#include "test_util.h"

static int is_training_buf(int cls)
{
    return cls == SP_BUF_BGRAD || cls == SP_BUF_EDGE_GRAD || cls == SP_BUF_GRADS ||
           cls == SP_BUF_OPT || cls == SP_BUF_SHARED_GRAD;
}

/* Stages 0..S-1 in a chain, a skip edge 0 -> 2 (when S > 2), the first and last stage
 * sharing a parameter (the GPT's tied embedding), parameters of 100 bytes per stage. */
static sp_stage_model *model_of(int S)
{
    sp_stage_model *md = sp_stage_model_chain(S, 1, 2, 1, 64);
    for (int s = 0; s < S; s++) md->stage[s].param_bytes = 100, md->stage[s].opt_bytes = 200;
    if (S > 2) {
        md->edge = realloc(md->edge, (size_t)S * sizeof *md->edge);
        md->edge[md->nedges++] = (sp_stage_edge){ 0, 2, 32, 1 };
    }
    if (S > 1) {
        md->shared = calloc(1, sizeof *md->shared);
        md->shared[0] = (sp_stage_shared){ .bytes = 1000, .nstages = 2, .stages = { 0, S - 1 },
                                           .single_use = 1 };
        md->nshared = 1;
    }
    return md;
}

static void check_plan(const sp_plan *pl, const sp_stage_model *md, const sp_schedule *fs,
                       const char *what)
{
    int S = md->nstages, K = fs->nmicro;
    MUST(sp_plan_check(pl));
    sp_sim_result *r;
    sp_sim_config cfg = { .rendezvous = 1, .latency = 0.1 };
    MUST(sp_simulate(pl, md, &cfg, &r));
    int runs = 0, sends = 0, crossing = 0;
    for (int e = 0; e < md->nedges; e++)
        crossing += pl->stage_actor[md->edge[e].src_stage] != pl->stage_actor[md->edge[e].dst_stage];
    for (int a = 0; a < pl->nactors; a++) {
        int last_stage = -1, last_mb = -1;
        size_t params = 0;
        int shared_here = 0;
        for (int s = 0; s < S; s++)
            if (pl->stage_actor[s] == a) {
                params += md->stage[s].param_bytes;
                for (int k = 0; k < md->nshared; k++)
                    for (int q = 0; q < md->shared[k].nstages; q++)
                        shared_here |= md->shared[k].stages[q] == s;
            }
        if (shared_here) params += md->shared[0].bytes;
        for (int j = 0; j < pl->ninstr[a]; j++) {
            const sp_instr *in = &pl->instr[a][j];
            char s1[160];
            sp_instr_format(in, s1, sizeof s1);
            CHECK(in->op == SP_OP_RUN || in->op == SP_OP_SEND || in->op == SP_OP_RECV ||
                      in->op == SP_OP_FREE, "%s actor %d: %s in a forward-only plan", what, a, s1);
            if (in->op == SP_OP_SEND || in->op == SP_OP_RECV || in->op == SP_OP_FREE)
                CHECK(!is_training_buf(in->buf.cls) && in->buf.cls != SP_BUF_SHARED_PARAM,
                      "%s actor %d: %s", what, a, s1);
            sends += in->op == SP_OP_SEND;
            if (in->op != SP_OP_RUN) continue;
            runs++;
            CHECK(in->task.kind == SP_TASK_F, "%s actor %d: %s", what, a, s1);
            /* GPipe's forward: stage by stage, microbatches in order */
            CHECK(in->task.stage > last_stage ||
                      (in->task.stage == last_stage && in->task.mb == last_mb + 1),
                  "%s actor %d: %s out of order", what, a, s1);
            last_stage = in->task.stage, last_mb = in->task.mb;
            for (uint32_t q = 0; q < in->nacc; q++)
                CHECK(!is_training_buf(pl->access[in->acc + q].buf.cls),
                      "%s actor %d: %s touches a %s buffer", what, a, s1,
                      sp_buf_class_name((sp_buf_class)pl->access[in->acc + q].buf.cls));
            /* its activations die at once: the FREE follows the RUN (and its SENDs) */
            int k = j + 1, freed = 0;
            while (k < pl->ninstr[a] && pl->instr[a][k].op != SP_OP_RUN && !freed) {
                const sp_instr *x = &pl->instr[a][k++];
                freed = x->op == SP_OP_FREE && x->buf.cls == SP_BUF_ACT &&
                        x->buf.idx == in->task.stage && x->buf.mb == in->task.mb;
            }
            CHECK(freed, "%s actor %d: the activations of %s are not freed after it", what, a, s1);
        }
        CHECK(pl->peak[a].grads == 0 && pl->peak[a].opt == 0 && pl->peak[a].params == params,
              "%s actor %d: peak grads %zu opt %zu params %zu (want 0 0 %zu)", what, a,
              pl->peak[a].grads, pl->peak[a].opt, pl->peak[a].params, params);
        CHECK(pl->peak[a].act_units <= 1, "%s actor %d: %d activations live", what, a,
              pl->peak[a].act_units);
        CHECK(r->peak[a].total == pl->peak[a].total, "%s actor %d: simulated peak %zu, plan %zu",
              what, a, r->peak[a].total, pl->peak[a].total);
    }
    CHECK(runs == K * S && pl->ntasks == K * S, "%s: %d RUNs for %d x %d", what, runs, K, S);
    CHECK(sends == K * crossing && pl->nmessages == sends, "%s: %d sends, want %d", what, sends,
          K * crossing);
    sp_sim_result_free(r);
}

static void expect_refused(const sp_schedule *s, const sp_stage_model *md, const char *want,
                           const char *what)
{
    sp_plan *pl = NULL;
    sp_status st = sp_plan_build(md, s, &pl);
    CHECK(st == SP_ERR_SCHEDULE && strstr(sp_last_error(), want), "%s: status %d, message '%s' "
          "(want '%s')", what, st, sp_last_error(), want);
    sp_plan_free(pl);
}

int main(void)
{
    static const char *const names[] = { "gpipe", "1f1b", "eager-1f1b", "interleaved-1f1b",
                                         "zb-h1", "zb-v", "dualpipe-v" };
    for (size_t n = 0; n < sizeof names / sizeof *names; n++)
        for (int p = 1; p <= 4; p++) {
            int v = sp_schedule_builtin_stages(names[n], p, 2) / p;
            int m = 2 * p;
            sp_schedule *train;
            if (sp_schedule_builtin(names[n], p, m, v, &train) != SP_OK) continue; /* p = 1 V */
            sp_stage_model *md = model_of(train->nstages);
            const int Ks[] = { 1, 3, 2 * p + 1 };
            for (int q = 0; q < 3; q++) {
                sp_schedule *fs;
                MUST(sp_schedule_forward(train, Ks[q], &fs));
                CHECK(fs->forward_only && fs->nmicro == Ks[q], "flag and count");
                CHECK(!memcmp(fs->stage_actor, train->stage_actor,
                              (size_t)train->nstages * sizeof(int)), "same placement");
                char what[96];
                snprintf(what, sizeof what, "%s p=%d K=%d", names[n], p, Ks[q]);
                MUST(sp_schedule_validate(fs, md));
                sp_plan *pl;
                MUST(sp_plan_build(md, fs, &pl));
                check_plan(pl, md, fs, what);
                /* the text form keeps it forward-only and gives the same plan */
                char *buf = NULL;
                size_t len = 0;
                FILE *f = open_memstream(&buf, &len);
                MUST(sp_schedule_write(fs, f));
                fclose(f);
                sp_schedule *back;
                MUST(sp_schedule_parse(buf, "mem", &back));
                CHECK(back->forward_only == 1 && strstr(buf, "\nforward-only\n"),
                      "%s: text round trip keeps forward-only", what);
                sp_plan *pl2;
                MUST(sp_plan_build(md, back, &pl2));
                for (int a = 0; a < pl->nactors; a++)
                    CHECK(pl2->ninstr[a] == pl->ninstr[a] &&
                              !memcmp(pl2->instr[a], pl->instr[a],
                                      (size_t)pl->ninstr[a] * sizeof(sp_instr)),
                          "%s: the parsed schedule plans differently on actor %d", what, a);
                sp_plan_free(pl2);
                sp_schedule_free(back);
                free(buf);
                sp_plan_free(pl);
                sp_schedule_free(fs);
            }
            /* the training plan of the same schedule still has gradients */
            sp_plan *tp;
            MUST(sp_plan_build(md, train, &tp));
            size_t grads = 0;
            for (int a = 0; a < tp->nactors; a++) grads += tp->peak[a].grads;
            CHECK(grads > 0, "%s p=%d: the training plan counts gradients", names[n], p);
            sp_plan_free(tp);
            sp_stage_model_free(md);
            sp_schedule_free(train);
        }

    /* refusals */
    sp_stage_model *md = model_of(4);
    sp_schedule *train, *fs;
    MUST(sp_schedule_builtin("interleaved-1f1b", 2, 2, 2, &train));
    MUST(sp_schedule_forward(train, 2, &fs));
    {   /* a backward task in a forward-only schedule */
        sp_schedule *x = sp_schedule_clone(fs);
        CHECK(x && x->forward_only, "clone keeps the flag");
        MUST(sp_schedule_append(x, 0, SP_TASK_BW, 0, 0));
        expect_refused(x, md, "forward-only", "BW in a forward-only schedule");
        sp_schedule_free(x);
    }
    {   /* an F missing */
        sp_schedule *x = sp_schedule_clone(fs);
        x->ntasks[1]--;
        expect_refused(x, md, "lists 7 tasks", "one F short");
        MUST(sp_schedule_append(x, 1, SP_TASK_F, 1, 3)); /* back, but another one is gone */
        x->tasks[1][0] = x->tasks[1][1];
        expect_refused(x, md, "appears twice", "duplicate F");
        sp_schedule_free(x);
    }
    {   /* actor 0 runs F(0,2) before F(0,0): F(0,2) waits for F(0,1), which waits for F(0,0) */
        sp_schedule *x = sp_schedule_create(2, 4, 1);
        x->forward_only = 1;
        MUST(sp_schedule_append(x, 0, SP_TASK_F, 0, 2));
        MUST(sp_schedule_append(x, 0, SP_TASK_F, 0, 0));
        MUST(sp_schedule_append(x, 1, SP_TASK_F, 0, 1));
        MUST(sp_schedule_append(x, 1, SP_TASK_F, 0, 3));
        expect_refused(x, md, "a cycle of", "forward cycle");
        sp_schedule_free(x);
    }
    {   /* the same F tasks without the flag: a training schedule missing its backward */
        sp_schedule *x = sp_schedule_clone(fs);
        x->forward_only = 0;
        expect_refused(x, md, "need at least", "training schedule of F tasks only");
        sp_schedule_free(x);
    }
    /* the text format: a bare keyword, before the task lines, once */
    const char *bad[][2] = {
        { "actors 1\nstages 1\nmicrobatches 1\nforward-only yes\nactor 0: F(0,0)\n",
          "nothing may follow 'forward-only'" },
        { "actors 1\nstages 1\nmicrobatches 1\nactor 0: F(0,0)\nforward-only\n",
          "must come before 'actor' lines" },
        { "forward-only\nforward-only\nactors 1\nstages 1\nmicrobatches 1\n", "given twice" },
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        sp_schedule *x = NULL;
        sp_status st = sp_schedule_parse(bad[i][0], "t", &x);
        CHECK(st == SP_ERR_FORMAT && strstr(sp_last_error(), bad[i][1]), "text %zu: '%s'", i,
              sp_last_error());
        sp_schedule_free(x);
    }
    {   /* and a good one, before the header is complete */
        sp_schedule *x;
        MUST(sp_schedule_parse("forward-only\nactors 1\nstages 1\nmicrobatches 2\n"
                               "actor 0: F(0,0) F(1,0)\n", "t", &x));
        sp_stage_model *one = sp_stage_model_chain(1, 1, 1, 1, 8);
        sp_plan *pl;
        CHECK(x->forward_only, "parsed flag");
        MUST(sp_plan_build(one, x, &pl));
        CHECK(pl->ntasks == 2 && pl->nmessages == 0, "one-actor forward plan");
        sp_plan_free(pl);
        sp_stage_model_free(one);
        sp_schedule_free(x);
    }
    sp_schedule_free(fs);
    sp_schedule_free(train);
    sp_stage_model_free(md);
    return test_done("test_forward");
}
