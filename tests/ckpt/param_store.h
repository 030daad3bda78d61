/* A model's parameters in plain arrays, as ckpt_io's get and set see them: what the tests
 * of apps/checkpoint.c (test_init.c, test_gpt_layout.c) load into and save from. g is the
 * test's graph; store[i][what] parameter i's whole tensor of kind what (value, gradient,
 * AdamW m, v), allocated by the test; nsets counts set's calls (a refused file sets none). */
#ifndef STARPIPE_TEST_PARAM_STORE_H
#define STARPIPE_TEST_PARAM_STORE_H

#include <string.h>

#include "apps/checkpoint.h"
#include "tests/check.h"

static sp_graph *g;
static float *store[64][4]; /* [param][what] */
static int nsets;

static int index_of(sp_tensor p)
{
    for (int i = 0; i < sp_graph_num_params(g); i++)
        if (sp_graph_param(g, i) == p) return i;
    REQUIRE(0, "tensor %d is not a parameter", (int)p);
    return -1;
}
static sp_status get(void *ctx, sp_tensor p, int what, float *dst)
{
    (void)ctx;
    memcpy(dst, store[index_of(p)][what], 4 * (size_t)sp_param_whole_numel(g, p));
    return SP_OK;
}
static sp_status set(void *ctx, sp_tensor p, int what, const float *src)
{
    (void)ctx;
    nsets++;
    memcpy(store[index_of(p)][what], src, 4 * (size_t)sp_param_whole_numel(g, p));
    return SP_OK;
}

#endif
