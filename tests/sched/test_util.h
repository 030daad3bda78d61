/* Helpers for the planner tests: loud failures and a seeded generator. */
#ifndef SP_TEST_UTIL_H
#define SP_TEST_UTIL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "starpipe/plan.h"

static int sp_test_failures;

#define CHECK(cond, ...)                                                      \
    do {                                                                      \
        if (!(cond)) {                                                        \
            fprintf(stderr, "%s:%d: CHECK(%s) failed: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                     \
            fprintf(stderr, "\n");                                            \
            if (++sp_test_failures > 20) exit(1);                             \
        }                                                                     \
    } while (0)

/* A library call that must succeed; on failure prints sp_last_error and exits. */
#define MUST(call)                                                            \
    do {                                                                      \
        sp_status st_ = (call);                                               \
        if (st_ != SP_OK) {                                                   \
            fprintf(stderr, "%s:%d: %s failed: %s: %s\n", __FILE__, __LINE__, #call, \
                    sp_status_name(st_), sp_last_error());                    \
            exit(1);                                                          \
        }                                                                     \
    } while (0)

static inline int test_done(const char *name)
{
    if (sp_test_failures) {
        fprintf(stderr, "%s: %d failure(s)\n", name, sp_test_failures);
        return 1;
    }
    printf("%s: ok\n", name);
    return 0;
}

/* A chain of S stages (unit costs, 4096-byte edges) with a weight tied between the first
 * and the last stage, as the GPT's embedding is: the model of the NCCL order tests. */
static inline sp_stage_model *sp_test_tied_chain(int S)
{
    sp_stage_model *md = sp_stage_model_chain(S, 1, 1, 1, 4096);
    md->nshared = 1;
    md->shared = calloc(1, sizeof *md->shared);
    md->shared[0] = (sp_stage_shared){ .bytes = 100, .nstages = 2, .stages = { 0, S - 1 },
                                       .single_use = 1 };
    return md;
}

/* The stages per actor a built-in schedule is tested with: 2 where it takes chunks. */
static inline int sp_test_chunks(const char *name)
{
    return !strcmp(name, "interleaved-1f1b") || !strcmp(name, "zb-v") ||
                   !strcmp(name, "dualpipe-v")
               ? 2
               : 1;
}

/* splitmix64: small, seeded, the same on every platform. */
typedef struct { uint64_t s; } rng;
static inline uint64_t rng_next(rng *r)
{
    uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static inline int rng_int(rng *r, int n) { return (int)(rng_next(r) % (uint64_t)n); } /* 0..n-1 */

#endif
