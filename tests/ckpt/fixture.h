/* The tensors the checkpoint tests write: awkward shapes (a scalar, a zero-size tensor, a
 * U8 of odd length that leaves the next F64 misaligned in the file) with values given by
 * a formula, so every reader (C or check_interop.py) recomputes what it must find. */
#ifndef STARPIPE_TEST_FIXTURE_H
#define STARPIPE_TEST_FIXTURE_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "starpipe/safetensors.h"

typedef struct {
    const char *name;
    sp_st_dtype dtype;
    int ndim;
    int64_t shape[4];
    int seed;
} fx_spec;

/* Keep in step with SPECS in check_interop.py. */
static const fx_spec fx_specs[] = {
    {"wte", SP_ST_F32, 2, {7, 13}, 1},
    {"h.0.ln.bias", SP_ST_F64, 3, {3, 1, 5}, 2},
    {"tokens", SP_ST_I32, 1, {37}, 3},
    {"scale", SP_ST_F32, 0, {0}, 4},
    {"empty", SP_ST_F32, 2, {0, 4}, 5},
    {"h.1/qkv \"\xc3\xbc\"\n", SP_ST_I32, 4, {2, 3, 2, 1}, 6},
    {"bytes", SP_ST_U8, 1, {3}, 7},
    {"late.f64", SP_ST_F64, 1, {4}, 8},
    {"steps", SP_ST_I64, 2, {1, 5}, 9},
};
#define FX_N ((int)(sizeof fx_specs / sizeof fx_specs[0]))

static inline int64_t fx_numel(const fx_spec *s)
{
    int64_t n = 1;
    for (int d = 0; d < s->ndim; d++) n *= s->shape[d];
    return n;
}

/* Element k of a tensor with this seed, as a double (exact in every dtype used). */
static inline double fx_value(sp_st_dtype d, int seed, int64_t k)
{
    switch (d) {
    case SP_ST_F16: case SP_ST_F32: case SP_ST_F64: return (double)(k % 17 - 8) * 0.375 + seed;
    case SP_ST_I32: case SP_ST_I64: return (double)(k * 7 - 100 + seed);
    case SP_ST_U8: return (double)((k * 13 + seed) & 255);
    case SP_ST_BOOL: return (double)((k + seed) % 3 == 0);
    default: return 0;
    }
}

static inline void fx_fill(const fx_spec *s, void *buf)
{
    for (int64_t k = 0; k < fx_numel(s); k++) {
        double v = fx_value(s->dtype, s->seed, k);
        switch (s->dtype) {
        case SP_ST_F32: ((float *)buf)[k] = (float)v; break;
        case SP_ST_F64: ((double *)buf)[k] = v; break;
        case SP_ST_I32: ((int32_t *)buf)[k] = (int32_t)v; break;
        case SP_ST_I64: ((int64_t *)buf)[k] = (int64_t)v; break;
        case SP_ST_U8: case SP_ST_BOOL: ((uint8_t *)buf)[k] = (uint8_t)v; break;
        default: break;
        }
    }
}

/* The fixture as writer input; fx_free releases the buffers. */
static inline void fx_make(sp_st_tensor t[FX_N])
{
    for (int i = 0; i < FX_N; i++) {
        const fx_spec *s = &fx_specs[i];
        size_t nb = (size_t)fx_numel(s) * sp_st_dtype_size(s->dtype);
        void *buf = malloc(nb ? nb : 1);
        fx_fill(s, buf);
        t[i] = (sp_st_tensor){s->name, s->dtype, s->ndim, s->shape, buf};
    }
}

static inline void fx_free(sp_st_tensor t[FX_N])
{
    for (int i = 0; i < FX_N; i++) free((void *)t[i].data);
}

static const sp_st_meta fx_meta[] = {
    {"step", "1200"},
    {"note", "line\nwith \"quotes\", a tab\t and \xc3\xbc"},
    {"empty", ""},
};
#define FX_NMETA 3

#endif
