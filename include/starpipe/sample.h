/* Text generation from a trained causal model, in one process on the reference
 * interpreter: a token sampler (temperature, top-k, a seeded counter-based draw) and the
 * generation loop. A pipelined run gathers its parameters (sp_trainer_fetch) into a
 * reference of a one-sequence, one-stage build of the same model and generates there:
 * generation is token by token, far too small to pipeline. */
#ifndef STARPIPE_SAMPLE_H
#define STARPIPE_SAMPLE_H

#include <stdint.h>

#include "starpipe/reference.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    float temperature; /* 0: greedy, the argmax */
    int top_k;         /* 0: the whole vocabulary; k: only the k largest logits (1: greedy) */
    uint64_t seed;     /* token i's draw is a function of (seed, i): same seed, same text */
    int vocab;         /* 0: every column of the logits; else only the first vocab (a
                        * padded vocabulary's tokens, models.h vocab_pad) */
} sp_sample_opts;

/* The uniform draw in [0, 1) of generated token i. */
double sp_sample_uniform(uint64_t seed, uint64_t i);

/* Picks a token from logits (V floats) with the draw u in [0, 1). Greedy (temperature 0
 * or top_k 1): the largest logit, the lowest index among equals. Else the top_k largest
 * (ties to the lower index; all V when top_k is 0 or >= V), weighted by
 * exp((logit - max) / temperature) in double, and the first of them, in descending
 * order, whose running sum exceeds u times the total. -1 if a logit is not finite. */
int sp_sample_token(const float *logits, int V, float temperature, int top_k, double u);

/* Generates n tokens into out after prompt[0..nprompt) (nprompt >= 1) with the model of
 * r, whose graph has an i32 input "tokens" (B,T) and a tensor named "logits" (B,T,V)
 * (sp_graph_name; sp_model_gpt has both); row 0 is used, every other input is zeros.
 * The context of each new token is the last T tokens so far, at positions 0.., padded on
 * the right with token 0: with causal attention the logits at the context's last
 * position do not depend on the padding, so they are exactly the model's next-token
 * logits. Each token is in [0, V). Errors: a missing input or tensor, a prompt token out
 * of range, non-finite logits (naming the token). */
sp_status sp_generate(sp_reference *r, const int32_t *prompt, int nprompt, int n,
                      const sp_sample_opts *o, int32_t *out);

#ifdef __cplusplus
}
#endif
#endif
