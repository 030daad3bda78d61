/* Fuzz target: schedule selection, sp_schedule_from_env, with fuzzed STARPIPE_SCHEDULE,
 * STARPIPE_MICROBATCHES and STARPIPE_CHUNKS values, explicit arguments and actor counts.
 * Input: 4 bytes (actors, which of name/env are given, explicit m, explicit v), then
 * NUL-separated fields: explicit name, SCHEDULE, MICROBATCHES, CHUNKS, and the text of the
 * file that a "file:..." name is pointed at.
 * Properties: no crash or sanitizer report; an error leaves *out NULL with a message;
 * a built-in that is returned has the asked actor count, validates against a chain model
 * and lowers to a plan that passes sp_plan_check. */
#include "fuzz/fuzz_util.h"

#include <errno.h>

#include "starpipe/plan.h"

/* Large but valid counts only make the step bigger, not the code paths different. */
static int too_big(const char *s, long limit)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    return end != s && !errno && v > limit;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n)
{
    if (n < 4 || n > 4096) return 0;
    int p = data[0] % 8 + 1;
    unsigned given = data[1];
    int m = data[2] % 40;   /* 0: from the environment */
    int v = data[3] % 10;   /* 0: from the environment */
    if (given & 0x80) m = -(int)(data[2] % 3);   /* negative: same as 0 */
    char *f[5] = { "", "", "", "", "" }, *store = NULL;
    fz_split(data + 4, n - 4, f, 5, &store);
    if (!store) return 0;
    if (too_big(f[2], 40) || too_big(f[3], 16)) {
        free(store);
        return 0;
    }
    /* "file:" names are pointed at the input's fifth field */
    char namebuf[128], envbuf[128];
    const char *path = fz_memfile("sched", (const uint8_t *)f[4], strlen(f[4]));
    const char *name = (given & 1) ? f[0] : NULL;
    if (name && !strncmp(name, "file:", 5)) snprintf(namebuf, sizeof namebuf, "file:%s", path), name = namebuf;
    const char *env = f[1];
    if (!strncmp(env, "file:", 5)) snprintf(envbuf, sizeof envbuf, "file:%s", path), env = envbuf;
    if (given & 2) setenv("STARPIPE_SCHEDULE", env, 1); else unsetenv("STARPIPE_SCHEDULE");
    if (given & 4) setenv("STARPIPE_MICROBATCHES", f[2], 1); else unsetenv("STARPIPE_MICROBATCHES");
    if (given & 8) setenv("STARPIPE_CHUNKS", f[3], 1); else unsetenv("STARPIPE_CHUNKS");
    const char *used = name ? name : (given & 2) && *env ? env : SP_SCHEDULE_DEFAULT;
    int from_file = !strncmp(used, "file:", 5);

    sp_schedule *s = (sp_schedule *)1;
    sp_status st = sp_schedule_from_env(name, p, m, v, &s);
    if (st != SP_OK) {
        FZ_CHECK(s == NULL, "error %d but a schedule returned", st);
        FZ_CHECK(sp_last_error()[0], "error without a message");
    } else {
        FZ_CHECK(s && s->nactors == p, "asked %d actors, got %d", p, s ? s->nactors : -1);
        if (m > 0) FZ_CHECK(s->nmicro == m, "asked m=%d, got %d", m, s->nmicro);
        if (!from_file && (int64_t)s->nmicro * s->nstages <= 2048) {
            sp_stage_model *model = sp_stage_model_chain(s->nstages, 1.0, 2.0, 1.0, 16);
            FZ_CHECK(sp_schedule_validate(s, model) == SP_OK, "built-in %s (p=%d m=%d) invalid: %s",
                     used, p, s->nmicro, sp_last_error());
            sp_plan *plan = NULL;
            FZ_CHECK(sp_plan_build(model, s, &plan) == SP_OK, "plan: %s", sp_last_error());
            FZ_CHECK(sp_plan_check(plan) == SP_OK, "plan check: %s", sp_last_error());
            sp_plan_free(plan);
            sp_stage_model_free(model);
        }
        sp_schedule_free(s);
    }
    free(store);
    return 0;
}
