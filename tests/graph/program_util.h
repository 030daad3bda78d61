/* Test setups over the graph API; REQUIRE (tests/check.h) ends the test on a failure.
 * test_program: a program of g at a precision, activations in bf16 storage or not
 * (act16), for the storage tests (test_bf16_act.c, test_act_scratch.c).
 * test_gpt_reference: the reference interpreter over a GPT of config c, m microbatches
 * per step, AdamW's defaults at learning rate lr, parameters from seed; its graph and
 * program in *g and *p (test_learns.c, test_sample.c, test_task_times.c). */
#ifndef SP_TESTS_GRAPH_PROGRAM_UTIL_H
#define SP_TESTS_GRAPH_PROGRAM_UTIL_H

#include "starpipe/models.h"
#include "starpipe/program.h"
#include "starpipe/reference.h"
#include "tests/check.h"

static inline sp_program *test_program(const sp_graph *g, sp_precision prec, int act16)
{
    sp_status st;
    sp_program *p = sp_program_build(g, &st);
    REQUIRE(p, "%s", sp_last_error());
    REQUIRE(!sp_program_set_precision(p, prec) && !sp_program_set_bf16_activations(p, act16),
            "%s", sp_last_error());
    return p;
}

static inline sp_reference *test_gpt_reference(const sp_gpt_config *c, int m, float lr,
                                               uint64_t seed, sp_graph **g, sp_program **p)
{
    sp_status st;
    *g = sp_model_gpt(c, &st);
    REQUIRE(*g, "%s", sp_last_error());
    *p = sp_program_build(*g, &st);
    REQUIRE(*p, "%s", sp_last_error());
    sp_adamw_config opt;
    sp_adamw_defaults(&opt);
    opt.lr = lr;
    sp_reference *r = sp_reference_create(*p, m, &opt, seed, &st);
    REQUIRE(r, "%s", sp_last_error());
    return r;
}

#endif
