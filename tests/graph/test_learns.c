/* The reference GPT learns: over 50 steps on the default corpus the mean loss of the last
 * five steps is at least 1.5 nats below the first step's (ln 256 = 5.545 at the start),
 * and every loss is finite. Guards the whole chain: data, init, gradients, AdamW. */
#include <math.h>
#include <stdlib.h>

#include "starpipe/data.h"
#include "tests/graph/program_util.h"

int main(void)
{
    const int B = 4, T = 32, m = 2, steps = 50;
    sp_status st;
    sp_text *text = sp_text_load(SP_DEFAULT_CORPUS, T, &st);
    REQUIRE(text, "%s", sp_last_error());
    sp_gpt_config c = { .vocab = 256, .context = T, .layers = 2, .heads = 4, .channels = 32,
                        .batch = B, .stages = 2 };
    sp_graph *g;
    sp_program *p;
    sp_reference *r = test_gpt_reference(&c, m, 3e-3f, 1, &g, &p);
    int32_t tok[2][2][4 * 32];
    const void *in[4] = { tok[0][0], tok[0][1], tok[1][0], tok[1][1] };
    double first = 0, tail = 0;
    for (int step = 1; step <= steps; step++) {
        for (int i = 0; i < m; i++) sp_text_batch(text, 1, step, i, B, T, tok[i][0], tok[i][1]);
        float loss;
        REQUIRE(sp_reference_step(r, in, &loss) == SP_OK, "%s", sp_last_error());
        CHECK(isfinite(loss), "step %d: loss %f", step, loss);
        if (step == 1) first = loss;
        if (step > steps - 5) tail += loss / 5;
    }
    printf("loss %.4f -> %.4f (mean of the last 5 steps)\n", first, tail);
    CHECK(fabs(first - log(256.0)) < 0.1, "first loss %.4f is not near ln 256", first);
    CHECK(tail < first - 1.5, "loss fell only from %.4f to %.4f", first, tail);
    sp_reference_free(r);
    sp_program_free(p);
    sp_graph_free(g);
    sp_text_free(text);
    return check_summary("test_learns");
}
