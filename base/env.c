/* The STARPIPE_* variables, read here and nowhere else (base/env.h). */
#include "base/env.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/files.h"

/* *out = the value of variable `name`, NULL when unset. Set but empty is an error: an
 * empty value is a mistake, never a way to ask for the default. */
sp_status sp_env_string(const char *name, const char **out)
{
    const char *v = getenv(name);
    *out = NULL;
    if (v && !*v)
        return sp_set_error(SP_ERR_ARG, "%s is set but empty: unset it, or give a value", name);
    *out = v;
    return SP_OK;
}

/* An integer variable in [lo, hi]; *out is left as it is when the variable is unset. */
sp_status sp_env_int(const char *name, int64_t lo, int64_t hi, int64_t *out)
{
    const char *v;
    sp_status st = sp_env_string(name, &v);
    if (st || !v) return st;
    if (sp_parse_int(v, lo, hi, out))
        return sp_set_error(SP_ERR_ARG, "%s='%s' is not an integer in [%lld, %lld]", name, v,
                            (long long)lo, (long long)hi);
    return SP_OK;
}

/* A finite number variable in [lo, hi]; *out is left as it is when unset. */
sp_status sp_env_double(const char *name, double lo, double hi, double *out)
{
    const char *v;
    sp_status st = sp_env_string(name, &v);
    if (st || !v) return st;
    if (sp_parse_double(v, lo, hi, out))
        return sp_set_error(SP_ERR_ARG, "%s='%s' is not a number in [%g, %g]", name, v, lo, hi);
    return SP_OK;
}


sp_status sp_env_fault(sp_fault *f)
{
    const char *v;
    *f = (sp_fault){ SP_FAULT_NONE, 0, -1 };
    sp_status st = sp_env_string("STARPIPE_FAULT", &v);
    if (st || !v) return st;
    static const struct { const char *prefix; int kind; } kinds[] = {
        { "nan@", SP_FAULT_NAN }, { "fail@", SP_FAULT_FAIL }, { "hang@", SP_FAULT_HANG },
        { "late@", SP_FAULT_LATE }, { "group@", SP_FAULT_GROUP } };
    for (size_t k = 0; k < sizeof kinds / sizeof *kinds; k++) {
        size_t n = strlen(kinds[k].prefix);
        if (strncmp(v, kinds[k].prefix, n)) continue;
        char buf[64];
        snprintf(buf, sizeof buf, "%s", v + n);
        char *colon = strchr(buf, ':');
        int64_t step = 0, stage = -1;
        int staged = kinds[k].kind != SP_FAULT_NAN && kinds[k].kind != SP_FAULT_LATE;
        int least = kinds[k].kind == SP_FAULT_LATE ? 0 : 1; /* a rank, or a step */
        if (strlen(v + n) < sizeof buf && (colon != NULL) == staged) {
            if (colon) *colon = 0;
            if (!sp_parse_int(buf, least, 1 << 30, &step) &&
                (!colon || !sp_parse_int(colon + 1, 0, 1 << 20, &stage))) {
                *f = (sp_fault){ kinds[k].kind, (int)step, (int)stage };
                return SP_OK;
            }
        }
        break;
    }
    return sp_set_error(SP_ERR_ARG, "STARPIPE_FAULT='%s' is not one of " SP_FAULT_FORMS, v);
}

sp_status sp_env_read(sp_env *e)
{
    static const sp_env none = { .nccl_threshold = -1, .shm_pieces = -1, .scatter_gather = -1,
                                 .fault = { SP_FAULT_NONE, 0, -1 } };
    *e = none;
    int64_t m = 0, v = 0, r = 0, tp = 0, verbose = 0, th = -1, tf32 = 0, pieces = -1, sg = -1;
    sp_status st;
    if ((st = sp_env_string("STARPIPE_SCHEDULE", &e->schedule)) ||
        (st = sp_env_int("STARPIPE_MICROBATCHES", 1, SP_ENV_MAX_COUNT, &m)) ||
        (st = sp_env_int("STARPIPE_CHUNKS", 1, SP_ENV_MAX_CHUNKS, &v)) ||
        (st = sp_env_int("STARPIPE_REPLICAS", 1, 1 << 16, &r)) ||
        (st = sp_env_int("STARPIPE_TENSOR", 1, 64, &tp)) ||
        (st = sp_env_string("STARPIPE_RANK_ORDER", &e->rank_order)) ||
        (st = sp_env_string("STARPIPE_TRACE", &e->trace)) ||
        (st = sp_env_double("STARPIPE_STEP_TIMEOUT", 0, 1e6, &e->step_timeout)) ||
        (st = sp_env_int("STARPIPE_VERBOSE", 0, 2, &verbose)) ||
        (st = sp_env_fault(&e->fault)) ||
        (st = sp_env_int("STARPIPE_NCCL_THRESHOLD", 0, SP_NCCL_THRESHOLD_MAX, &th)) ||
        (st = sp_env_int("STARPIPE_TF32", 0, 1, &tf32)) ||
        (st = sp_env_string("STARPIPE_TRANSPORT", &e->transport)) ||
        (st = sp_env_int("STARPIPE_SHM_PIECES", 0, 1, &pieces)) ||
        (st = sp_env_int("STARPIPE_SCATTER_GATHER", 0, 1, &sg)) ||
        (st = sp_env_string("STARPIPE_GPU", &e->gpu)) ||
        (st = sp_env_string("STARPIPE_DEVICE", &e->device))) {
        *e = none;
        return st; /* the message names the variable */
    }
    const char *ar = NULL;
    if ((st = sp_env_string("STARPIPE_ALLREDUCE", &ar))) {
        *e = none;
        return st;
    }
    int64_t per = 0;
    if (ar && strcmp(ar, "auto") && strcmp(ar, "flat") &&
        (strncmp(ar, "hosts:", 6) || sp_parse_int(ar + 6, 1, 1 << 16, &per))) {
        st = sp_set_error(SP_ERR_ARG, "STARPIPE_ALLREDUCE=%s: expected \"auto\", \"flat\" or "
                          "\"hosts:K\" (K >= 1 replicas a host)", ar);
        *e = none;
        return st;
    }
    e->allreduce = ar && !strcmp(ar, "flat") ? -1 : (int)per;
    if (e->transport && strcmp(e->transport, "direct") && strcmp(e->transport, "starpu-mpi")) {
        st = sp_set_error(SP_ERR_ARG, "STARPIPE_TRANSPORT=%s: expected \"starpu-mpi\" or "
                          "\"direct\"", e->transport);
        *e = none;
        return st;
    }
    e->microbatches = (int)m;
    e->chunks = (int)v;
    e->replicas = (int)r;
    e->tensor = (int)tp;
    e->verbose = (int)verbose;
    e->nccl_threshold = th;
    e->tf32 = (int)tf32;
    e->shm_pieces = (int)pieces;
    e->scatter_gather = (int)sg;
    return SP_OK;
}
