/* A program of g at a precision, activations in bf16 storage or not (act16), for the
 * storage tests (test_bf16_act.c, test_act_scratch.c); REQUIRE is tests/check.h's. */
#ifndef SP_TESTS_GRAPH_PROGRAM_UTIL_H
#define SP_TESTS_GRAPH_PROGRAM_UTIL_H

#include "starpipe/program.h"
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

#endif
