/* Choosing a schedule: by name (a built-in, `file:PATH` of the text format, `help`), with
 * STARPIPE_SCHEDULE, STARPIPE_MICROBATCHES and STARPIPE_CHUNKS for what the caller leaves
 * unset (include/starpipe/plan.h, sp_schedule_from_env). */
#include <stdio.h>
#include <string.h>

#include "base/env.h"
#include "sched/sched_impl.h"

sp_status sp_schedule_from_env(const char *name, int p, int m, int v, sp_schedule **out)
{
    *out = NULL;
    sp_env env; /* STARPIPE_SCHEDULE, STARPIPE_MICROBATCHES, STARPIPE_CHUNKS */
    sp_status st = sp_env_read(&env);
    if (st) return st;
    if (!name) name = env.schedule ? env.schedule : SP_SCHEDULE_DEFAULT;
    if (!strcmp(name, "help"))
        return sp_set_error(SP_ERR_ARG, "schedules (STARPIPE_SCHEDULE):\n%s",
                            sp_schedule_help());
    /* "NAME+split": the schedule NAME with its sending backwards split */
    const size_t len = strlen(name);
    if (len > 6 && !strcmp(name + len - 6, "+split")) {
        char base[4096];
        if (len - 6 >= sizeof base)
            return sp_set_error(SP_ERR_ARG, "schedule name too long (%zu bytes)", len);
        memcpy(base, name, len - 6);
        base[len - 6] = '\0';
        if (!strcmp(base, "auto") || !strcmp(base, "help"))
            return sp_set_error(SP_ERR_ARG, "schedule '%s': '+split' applies to a built-in "
                                "or file:PATH, not to '%s'", name, base);
        st = sp_schedule_from_env(base, p, m, v, out);
        if (!st && (st = sp_schedule_split_backward(*out))) {
            sp_schedule_free(*out);
            *out = NULL;
        }
        return st;
    }
    if (m <= 0) m = env.microbatches;
    int v_from_env = 0;
    if (v <= 0) {
        v = env.chunks;
        v_from_env = v > 0;
    }
    if (!strcmp(name, "auto"))
        return sp_set_error(SP_ERR_ARG, "schedule 'auto' is synthesized for the stages' costs "
                            "and a memory cap, which a name alone does not give: "
                            "sp_schedule_auto takes them (the apps measure them first, "
                            "starpipe-plan --schedule auto)");
    if (!strncmp(name, "file:", 5)) {
        sp_schedule *s;
        st = sp_schedule_load(name + 5, &s);
        if (st) return st;
        if (s->nactors != p || (m > 0 && s->nmicro != m)) {
            st = sp_set_error(SP_ERR_ARG, "%s: the file has %d actors and %d microbatches, "
                              "but %d actors and %d microbatches were asked for", name + 5,
                              s->nactors, s->nmicro, p, m > 0 ? m : s->nmicro);
            sp_schedule_free(s);
            return st;
        }
        *out = s;
        return SP_OK;
    }
    if (m <= 0) m = 2 * p;
    st = sp_schedule_builtin(name, p, m, v, out);
    if (st && v_from_env) sp_error_context(st, "STARPIPE_CHUNKS=%d", v);
    return st;
}
