/* Fuzz target: the schedule text format (sp_schedule_parse), then, for schedules small
 * enough to plan in microseconds, validation, cycle search, plan building, the plan's own
 * well-formedness check, the simulator, and a write/parse round trip.
 * Properties: no crash or sanitizer report; a parse error leaves *out NULL with a message;
 * validate, find_cycle and plan_build agree; every plan built passes sp_plan_check and
 * simulates without deadlock; writing and re-reading gives the same schedule. */
#include "fuzz/fuzz_util.h"

#include <ctype.h>

#include "starpipe/plan.h"

/* The input's last byte picks the model: a chain, a chain with a skip edge, or a chain
 * whose first and last stages share a parameter (per step or per microbatch). */
static sp_stage_model *model_for(int S, unsigned variant)
{
    sp_stage_model *m = sp_stage_model_chain(S, 1.0, 1.0, 1.0, 64);
    if (!m) return NULL;
    for (int s = 0; s < S; s++) {
        m->stage[s].param_bytes = 8;
        m->stage[s].opt_bytes = 16;
        m->stage[s].bgrad_bytes = 4;
    }
    if (variant == 1 && S >= 3) {
        sp_stage_edge *e = realloc(m->edge, (size_t)S * sizeof *e);
        if (!e) abort();
        m->edge = e;
        m->edge[m->nedges++] = (sp_stage_edge){ 0, S - 1, 32, 1 };
    } else if (variant >= 2 && S >= 2) {
        m->shared = calloc(1, sizeof *m->shared);
        if (!m->shared) abort();
        m->nshared = 1;
        m->shared[0] = (sp_stage_shared){ .bytes = 128, .nstages = 2, .stages = { 0, S - 1 },
                                          .single_use = variant == 2 };
    }
    return m;
}

static void same_schedule(const sp_schedule *a, const sp_schedule *b)
{
    FZ_CHECK(a->nactors == b->nactors && a->nstages == b->nstages && a->nmicro == b->nmicro,
             "sizes changed in the round trip");
    char name[64];
    snprintf(name, sizeof name, "%s", a->name);
    for (char *c = name; *c; c++)
        if (isspace((unsigned char)*c) || *c == '#') *c = '_';
    FZ_CHECK(!strcmp(name, b->name), "name '%s' came back as '%s'", a->name, b->name);
    for (int s = 0; s < a->nstages; s++)
        FZ_CHECK(a->stage_actor[s] == b->stage_actor[s], "placement of stage %d changed", s);
    for (int q = 0; q < a->nactors; q++) {
        FZ_CHECK(a->ntasks[q] == b->ntasks[q], "actor %d: %d tasks became %d", q, a->ntasks[q],
                 b->ntasks[q]);
        FZ_CHECK(!a->ntasks[q] || !memcmp(a->tasks[q], b->tasks[q],
                                          (size_t)a->ntasks[q] * sizeof(sp_task)),
                 "actor %d: task list changed", q);
    }
}

static void deep(const sp_schedule *s, unsigned variant)
{
    sp_stage_model *model = model_for(s->nstages, variant);
    FZ_CHECK(model, "no model");
    sp_status vst = sp_schedule_validate(s, model);
    sp_task cycle[64];
    int nc = sp_schedule_find_cycle(s, model, cycle, 64);
    FZ_CHECK(vst == SP_OK || vst == SP_ERR_SCHEDULE, "validate returned %d: %s", vst,
             sp_last_error());
    FZ_CHECK((vst == SP_OK) == (nc == 0), "validate %d but find_cycle %d", vst, nc);
    for (int i = 0; i < nc && i < 64; i++)
        FZ_CHECK(cycle[i].stage >= 0 && cycle[i].stage < s->nstages && cycle[i].mb >= 0 &&
                     cycle[i].mb < s->nmicro, "cycle task out of range");
    sp_plan *plan = NULL;
    sp_status pst = sp_plan_build(model, s, &plan);
    FZ_CHECK((pst == SP_OK) == (vst == SP_OK), "plan_build %d but validate %d: %s", pst, vst,
             sp_last_error());
    if (pst == SP_OK) {
        FZ_CHECK(sp_plan_check(plan) == SP_OK, "a built plan fails its check: %s",
                 sp_last_error());
        for (int rv = 0; rv < 2; rv++) {
            sp_sim_config cfg = { .latency = 0.5, .bandwidth = 100, .rendezvous = rv };
            sp_sim_result *res = NULL;
            FZ_CHECK(sp_simulate(plan, model, &cfg, &res) == SP_OK,
                     "a checked plan does not simulate (rendezvous %d): %s", rv,
                     sp_last_error());
            sp_sim_result_free(res);
        }
        char buf[256];
        for (int a = 0; a < plan->nactors; a++)
            for (int i = 0; i < plan->ninstr[a]; i++) sp_instr_format(&plan->instr[a][i], buf, sizeof buf);
        sp_plan_free(plan);
    } else {
        FZ_CHECK(plan == NULL, "failed plan_build left a plan");
    }
    sp_stage_model_free(model);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n)
{
    if (n > 1 << 16) return 0;
    char *text = malloc(n + 1);
    if (!text) return 0;
    memcpy(text, data, n);
    text[n] = 0;
    sp_schedule *s = (sp_schedule *)1;
    sp_status st = sp_schedule_parse(text, "fuzz.sched", &s);
    free(text);
    if (st != SP_OK) {
        FZ_CHECK(s == NULL, "error %d but a schedule returned", st);
        FZ_CHECK(st == SP_ERR_FORMAT || st == SP_ERR_NOMEM || st == SP_ERR_ARG,
                 "unexpected status %d", st);
        FZ_CHECK(sp_last_error()[0], "error without a message");
        return 0;
    }
    FZ_CHECK(s && s->nactors >= 1 && s->nstages >= 1 && s->nmicro >= 1, "bad sizes");
    for (int i = 0; i < s->nstages; i++)
        FZ_CHECK(s->stage_actor[i] >= 0 && s->stage_actor[i] < s->nactors, "bad placement");
    for (int a = 0; a < s->nactors; a++)
        for (int i = 0; i < s->ntasks[a]; i++) {
            sp_task t = s->tasks[a][i];
            FZ_CHECK(t.kind >= 0 && t.kind < SP_NUM_TASK_KINDS && t.mb >= 0 &&
                         t.mb < s->nmicro && t.stage >= 0 && t.stage < s->nstages &&
                         s->stage_actor[t.stage] == a, "bad task on actor %d", a);
        }
    /* Deeper code only where it runs in microseconds: the planner's cost is the size of
     * the unrolled step, not of the text. */
    if ((int64_t)4 * s->nmicro * s->nstages <= 4096 && s->nactors <= 64)
        deep(s, n ? data[n - 1] % 4u : 0);
    if (s->nactors <= 4096) {
        char *buf = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&buf, &len);
        FZ_CHECK(f, "open_memstream");
        FZ_CHECK(sp_schedule_write(s, f) == SP_OK, "write failed: %s", sp_last_error());
        fclose(f);
        sp_schedule *back = NULL;
        st = sp_schedule_parse(buf, "roundtrip", &back);
        FZ_CHECK(st == SP_OK, "written schedule does not parse: %s\n%s", sp_last_error(), buf);
        same_schedule(s, back);
        sp_schedule_free(back);
        free(buf);
    }
    sp_schedule_free(s);
    return 0;
}
