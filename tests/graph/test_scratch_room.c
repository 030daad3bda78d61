/* SCRATCH holds the kernels' own floats (attention's, from offset 0) and, past them, the
 * values and gradients packed there by lifetime. The packed ones must start past what
 * attention takes under the program's precision: bf16 attention takes more scratch than
 * fp32, and the layout is measured at build in fp32, so a value live across an attention
 * would otherwise be overwritten by it in bf16 runs. Checked from the layout itself
 * (graph/program_impl.h) against sp_attention_scratch_floats[_bf16] and the CUDA kernels'
 * need, for the GPT at both precisions, one and two stages. */
#include "codelets/cpu/kernels.h"
#include "graph/program_impl.h"
#include "starpipe/models.h"
#include "tests/check.h"
#include "tests/graph/program_util.h"

static int64_t attention_floats(const sp_node *n, int bf16)
{
    int B = (int)n->shape[0], T = (int)n->shape[1], C = (int)n->shape[2];
    int64_t cpu = bf16 ? sp_attention_scratch_floats_bf16(B, T, C, n->heads)
                       : sp_attention_scratch_floats(B, T, C, n->heads);
    int64_t cuda = (int64_t)B * n->heads * T; /* the CUDA backward's rowsum(dout * out) */
    return cpu > cuda ? cpu : cuda;
}

static void check(const char *name, const sp_gpt_config *cfg)
{
    sp_status st;
    sp_graph *g = sp_model_gpt(cfg, &st);
    REQUIRE(g, "%s", sp_last_error());
    for (int h = 0; h < 2; h++) {
        sp_program *p = test_program(g, h ? SP_PRECISION_BF16 : SP_PRECISION_FP32, h);
        int npacked = 0;
        for (int s = 0; s < p->nstages; s++) {
            int64_t need = 0;
            for (int t = 0; t < g->n; t++)
                if (g->node[t].stage == s && g->node[t].op == SP_OP_ATTENTION) {
                    int64_t a = attention_floats(&g->node[t], h);
                    if (a > need) need = a;
                }
            for (int t = 0; t < g->n; t++) {
                if (g->node[t].stage != s) continue;
                const int64_t off[3] = { p->scr_off[t], p->aux_scr_off[t],
                                         p->gscr_off ? p->gscr_off[t] : -1 };
                for (int k = 0; k < 3; k++) {
                    if (off[k] < 0) continue;
                    npacked++;
                    CHECK(off[k] >= need, "%s, %s, stage %d: tensor %d's %s at float %lld "
                          "of SCRATCH, inside attention's %lld", name, h ? "bf16" : "fp32",
                          s, t, k == 0 ? "value" : k == 1 ? "aux floats" : "gradient",
                          (long long)off[k], (long long)need);
                }
            }
        }
        CHECK(npacked > 0, "%s: nothing packed in SCRATCH (the check would be empty)", name);
        sp_program_free(p);
    }
    sp_graph_free(g);
}

int main(void)
{
    sp_gpt_config d = { .vocab = 256, .context = 64, .layers = 4, .heads = 4, .channels = 64,
                        .batch = 4, .stages = 2 };
    check("gpt defaults, 2 stages", &d);
    d.stages = 1;
    check("gpt defaults, 1 stage", &d);
    sp_gpt_config wide = { .vocab = 96, .context = 48, .layers = 2, .heads = 2,
                           .channels = 256, .batch = 2, .stages = 2 }; /* heads of 128 */
    check("gpt heads of 128, 2 stages", &wide);
    return check_summary("test_scratch_room");
}
