/* Split parameters' parts against the whole tensor (starpipe/graph.h): for a whole
 * parameter, sp_param_split along each dimension and sp_param_split_view (the GPT's qkv
 * weight and bias split by heads), at T = 1, 2, 3, 4 and every rank:
 *   - the part's shape, the whole shape, the view and sp_param_whole_numel;
 *   - its initial values are, bit for bit, the T = 1 tensor's at the indices an
 *     independent mapping (multi-index through the view) gives, and for the qkv weight
 *     the columns of q, k and v of the rank's heads in that order;
 *   - sp_param_whole_to_part reads those elements; sp_param_part_to_whole of every rank's
 *     part fills each element of the whole tensor exactly once and gives it back;
 *   - every parameter of the GPT and the MLP at T = 2, 3 starts at the part of T = 1's;
 *   - refusals: a view that does not refine the shape, a T not dividing the view's
 *     dimension, a rank outside the group, a tensor that is not a parameter. */
#include <math.h>
#include <string.h>

#include "starpipe/graph.h"
#include "starpipe/models.h"
#include "tests/check.h"

enum { C = 5, NH = 12, HS = 2, NPARAM = 7 };

typedef struct {
    const char *name;
    int ndim, vndim, dim; /* vndim 0: sp_param_split (dim >= 0) or sp_param (dim -1) */
    int64_t shape[4], view[4];
    sp_init init;
} spec;

static const spec specs[NPARAM] = {
    { "whole", 2, 0, -1, { 3, 5 }, { 0 }, SP_INIT_NORMAL },
    { "rows", 2, 0, 0, { 12, 5 }, { 0 }, SP_INIT_NORMAL },
    { "cols", 2, 0, 1, { 5, 12 }, { 0 }, SP_INIT_NORMAL },
    { "mid", 3, 0, 1, { 2, 12, 3 }, { 0 }, SP_INIT_NORMAL },
    { "qkv.w", 2, 4, 2, { C, 3 * NH * HS }, { C, 3, NH, HS }, SP_INIT_NORMAL },
    { "qkv.b", 1, 3, 1, { 3 * NH * HS }, { 3, NH, HS }, SP_INIT_NORMAL },
    { "ones", 2, 3, 1, { 4, 24 }, { 4, 12, 2 }, SP_INIT_ONES },
};

static sp_graph *build(int T, int rank)
{
    sp_graph *g = sp_graph_create();
    REQUIRE(g && sp_graph_set_tensor(g, T, rank) == SP_OK, "%s", sp_last_error());
    for (int i = 0; i < NPARAM; i++) {
        const spec *s = &specs[i];
        sp_tensor t = s->vndim ? sp_param_split_view(g, s->name, s->ndim, s->shape, s->vndim,
                                                     s->view, s->dim, s->init, 0.5f)
                    : s->dim >= 0 ? sp_param_split(g, s->name, s->ndim, s->shape, s->dim, s->init,
                                                   0.5f)
                                  : sp_param(g, s->name, s->ndim, s->shape, s->init, 0.5f);
        REQUIRE(t >= 0, "T=%d rank %d %s: %s", T, rank, s->name, sp_last_error());
    }
    REQUIRE(sp_input_f32(g, "x", 1, (int64_t[]){ 3 }) >= 0, "%s", sp_last_error());
    return g;
}

static int64_t prod(const int64_t *d, int n)
{
    int64_t p = 1;
    for (int k = 0; k < n; k++) p *= d[k];
    return p;
}

/* Element k of part `rank`'s, in the whole tensor: k's multi-index in the part's view (the
 * view with dimension dim divided by T), shifted by rank parts along dim, flattened in the
 * whole view. */
static int64_t whole_index(const spec *s, int T, int rank, int64_t k)
{
    if (s->dim < 0 || T == 1) return k;
    int vn = s->vndim ? s->vndim : s->ndim;
    const int64_t *view = s->vndim ? s->view : s->shape;
    int64_t idx[4], part[4];
    for (int d = 0; d < vn; d++) part[d] = view[d] / (d == s->dim ? T : 1);
    for (int d = vn - 1; d >= 0; d--) idx[d] = k % part[d], k /= part[d];
    idx[s->dim] += rank * part[s->dim];
    int64_t j = 0;
    for (int d = 0; d < vn; d++) j = j * view[d] + idx[d];
    return j;
}

static void check_parts(int T, const float *const *whole1)
{
    for (int rank = 0; rank < T; rank++) {
        sp_graph *g = build(T, rank);
        for (int i = 0; i < NPARAM; i++) {
            const spec *s = &specs[i];
            sp_tensor t = sp_graph_find(g, s->name);
            int64_t n = prod(s->shape, s->ndim), np = sp_tensor_numel(g, t);
            int split = s->dim >= 0 && T > 1;
            CHECK(sp_param_whole_numel(g, t) == n && np == n / (split ? T : 1),
                  "T=%d %s: %lld of %lld elements", T, s->name, (long long)np,
                  (long long)sp_param_whole_numel(g, t));
            CHECK(!memcmp(sp_param_full_shape(g, t), s->shape, sizeof(int64_t) * s->ndim),
                  "T=%d %s: the whole shape", T, s->name);
            CHECK(sp_param_split_dim(g, t) == (split ? s->dim : -1), "T=%d %s: split dim %d", T,
                  s->name, sp_param_split_dim(g, t));
            int vn;
            const int64_t *view = sp_param_view(g, t, &vn);
            if (split)
                CHECK(view && vn == (s->vndim ? s->vndim : s->ndim) &&
                          !memcmp(view, s->vndim ? s->view : s->shape, sizeof(int64_t) * vn),
                      "T=%d %s: the view", T, s->name);
            else
                CHECK(!view && vn == 0, "T=%d %s: a view of a whole parameter", T, s->name);
            if (!strcmp(s->name, "qkv.w") && split)
                CHECK(sp_tensor_shape(g, t)[0] == C && sp_tensor_shape(g, t)[1] == 3 * NH * HS / T,
                      "T=%d qkv.w: part (%lld,%lld)", T, (long long)sp_tensor_shape(g, t)[0],
                      (long long)sp_tensor_shape(g, t)[1]);

            float *init = malloc(sizeof(float) * (size_t)np), *part = malloc(sizeof(float) * (size_t)np);
            float *w = malloc(sizeof(float) * (size_t)n), *back = malloc(sizeof(float) * (size_t)n);
            REQUIRE(init && part && w && back, "out of memory");
            REQUIRE(sp_param_init_values(g, t, 7, init) == SP_OK, "%s", sp_last_error());
            int bad = 0;
            for (int64_t k = 0; k < np; k++)
                bad += memcmp(&init[k], &whole1[i][whole_index(s, T, rank, k)], 4) != 0;
            CHECK(!bad, "T=%d rank %d %s: %d initial values not the whole tensor's", T, rank,
                  s->name, bad);
            if (!strcmp(s->name, "qkv.w")) { /* row c: q, k, v of this rank's heads */
                int64_t hp = NH / T, cw = 3 * hp * HS;
                bad = 0;
                for (int64_t c = 0; c < C; c++)
                    for (int64_t q = 0; q < 3; q++)
                        for (int64_t h = 0; h < hp; h++)
                            for (int64_t e = 0; e < HS; e++) {
                                int64_t jp = c * cw + (q * hp + h) * HS + e;
                                int64_t jw = c * 3 * NH * HS + q * NH * HS + (rank * hp + h) * HS + e;
                                bad += memcmp(&init[jp], &whole1[i][jw], 4) != 0;
                            }
                CHECK(!bad, "T=%d rank %d qkv.w: %d elements not q, k, v of its heads", T, rank,
                      bad);
            }
            /* whole -> part reads the mapped elements */
            for (int64_t j = 0; j < n; j++) w[j] = (float)j + 0.25f;
            CHECK(sp_param_whole_to_part(g, t, rank, w, part) == SP_OK, "%s", sp_last_error());
            bad = 0;
            for (int64_t k = 0; k < np; k++)
                bad += part[k] != (float)whole_index(s, T, rank, k) + 0.25f;
            CHECK(!bad, "T=%d rank %d %s: whole_to_part read %d wrong elements", T, rank,
                  s->name, bad);
            /* every rank's part, through this rank's graph (any member assembles all) */
            int *hits = calloc((size_t)n, sizeof *hits);
            REQUIRE(hits, "out of memory");
            for (int64_t j = 0; j < n; j++) back[j] = NAN;
            for (int r = 0; r < T; r++) {
                CHECK(sp_param_whole_to_part(g, t, r, w, part) == SP_OK, "%s", sp_last_error());
                CHECK(sp_param_part_to_whole(g, t, r, part, back) == SP_OK, "%s", sp_last_error());
                for (int64_t k = 0; k < np; k++) hits[whole_index(s, split ? T : 1, r, k)]++;
            }
            bad = 0;
            for (int64_t j = 0; j < n; j++)
                bad += back[j] != w[j] || hits[j] != (split ? 1 : T);
            CHECK(!bad, "T=%d %s: the round trip through the parts misses %d elements", T,
                  s->name, bad);
            free(hits), free(init), free(part), free(w), free(back);
        }
        sp_graph_free(g);
    }
}

/* Every parameter of a model at T starts at its part of the T = 1 model's values. */
static void check_model(const char *what, sp_graph *(*make)(int T, int rank), int T)
{
    sp_graph *one = make(1, 0);
    for (int rank = 0; rank < T; rank++) {
        sp_graph *g = make(T, rank);
        CHECK(sp_graph_num_params(g) == sp_graph_num_params(one), "%s T=%d: %d parameters", what,
              T, sp_graph_num_params(g));
        int nsplit = 0;
        for (int i = 0; i < sp_graph_num_params(g); i++) {
            sp_tensor t = sp_graph_param(g, i), t1 = sp_graph_param(one, i);
            const char *name = sp_tensor_name(g, t);
            CHECK(!strcmp(name, sp_tensor_name(one, t1)), "%s T=%d: parameter %d is '%s'", what,
                  T, i, name);
            int64_t n = sp_param_whole_numel(g, t), np = sp_tensor_numel(g, t);
            CHECK(n == sp_tensor_numel(one, t1), "%s T=%d %s: whole size", what, T, name);
            nsplit += np < n;
            float *w = malloc(sizeof(float) * (size_t)n), *a = malloc(sizeof(float) * (size_t)np),
                  *b = malloc(sizeof(float) * (size_t)np);
            REQUIRE(w && a && b, "out of memory");
            REQUIRE(!sp_param_init_values(one, t1, 11, w) && !sp_param_init_values(g, t, 11, a) &&
                        !sp_param_whole_to_part(g, t, rank, w, b), "%s", sp_last_error());
            CHECK(!memcmp(a, b, sizeof(float) * (size_t)np), "%s T=%d rank %d: %s does not start "
                  "at its part of T=1's", what, T, rank, name);
            free(w), free(a), free(b);
        }
        CHECK(nsplit > 0, "%s T=%d: no parameter is split", what, T);
        sp_graph_free(g);
    }
    sp_graph_free(one);
}

static sp_graph *gpt(int T, int rank)
{
    sp_gpt_config c = { .vocab = 36, .context = 5, .layers = 2, .heads = 6, .channels = 18,
                        .batch = 2, .stages = 2, .tensor = T, .tensor_rank = rank };
    sp_status st;
    sp_graph *g = sp_model_gpt(&c, &st);
    REQUIRE(g, "gpt T=%d: %s", T, sp_last_error());
    return g;
}

static sp_graph *mlp(int T, int rank)
{
    sp_mlp_config c = { .in_dim = 7, .width = 12, .depth = 3, .classes = 4, .batch = 3,
                        .stages = 2, .tensor = T, .tensor_rank = rank };
    sp_status st;
    sp_graph *g = sp_model_mlp(&c, &st);
    REQUIRE(g, "mlp T=%d: %s", T, sp_last_error());
    return g;
}

int main(void)
{
    sp_graph *g1 = build(1, 0);
    float *whole1[NPARAM];
    for (int i = 0; i < NPARAM; i++) {
        sp_tensor t = sp_graph_find(g1, specs[i].name);
        whole1[i] = malloc(sizeof(float) * (size_t)sp_tensor_numel(g1, t));
        REQUIRE(whole1[i] && sp_param_init_values(g1, t, 7, whole1[i]) == SP_OK, "%s",
                sp_last_error());
    }
    for (int T = 1; T <= 4; T++) check_parts(T, (const float *const *)whole1);
    for (int T = 2; T <= 3; T++) check_model("gpt", gpt, T), check_model("mlp", mlp, T);

    /* refusals */
    sp_graph *g = sp_graph_create();
    REQUIRE(g && sp_graph_set_tensor(g, 3, 1) == SP_OK, "%s", sp_last_error());
    sp_tensor t = sp_param_split_view(g, "w", 2, (int64_t[]){ 6, 4 }, 2, (int64_t[]){ 4, 6 }, 1,
                                      SP_INIT_NORMAL, 0.1f);
    CHECK(t == -(int)SP_ERR_SHAPE && strstr(sp_last_error(), "'w': the view does not refine"),
          "a view (4,6) of (6,4): %d %s", t, sp_last_error());
    t = sp_param_split_view(g, "w", 2, (int64_t[]){ C, 24 }, 4, (int64_t[]){ C, 3, 4, 2 }, 2,
                            SP_INIT_NORMAL, 0.1f);
    CHECK(t == -(int)SP_ERR_SHAPE &&
              strstr(sp_last_error(), "tensor parallelism of 3 does not divide dimension 2 (4) "
                     "of the parameter's view"), "T=3 of 4 heads: %d %s", t, sp_last_error());
    t = sp_param_split(g, "w", 2, (int64_t[]){ 4, 6 }, 0, SP_INIT_NORMAL, 0.1f);
    CHECK(t == -(int)SP_ERR_SHAPE &&
              strstr(sp_last_error(), "tensor parallelism of 3 does not divide dimension 0 (4) "
                     "of the parameter"), "T=3 of 4 rows: %d %s", t, sp_last_error());
    t = sp_param_split(g, "w", 2, (int64_t[]){ 3, 6 }, 0, SP_INIT_NORMAL, 0.1f);
    REQUIRE(t >= 0, "%s", sp_last_error());
    float part[6], whole[18];
    CHECK(sp_param_part_to_whole(g, t, 3, part, whole) == SP_ERR_ARG &&
              strstr(sp_last_error(), "rank 3 is not in the group of 3"), "rank 3: %s",
          sp_last_error());
    CHECK(sp_param_whole_to_part(g, t, -1, whole, part) == SP_ERR_ARG, "rank -1 accepted");
    sp_tensor x = sp_input_f32(g, "x", 1, (int64_t[]){ 3 });
    CHECK(sp_param_whole_to_part(g, x, 0, whole, part) == SP_ERR_ARG &&
              strstr(sp_last_error(), "not a parameter"), "an input: %s", sp_last_error());
    CHECK(sp_param_whole_numel(g, x) == 0, "an input's whole size");
    sp_graph_free(g);
    g = sp_graph_create(); /* a bad view is refused at T = 1 too */
    t = sp_param_split_view(g, "w", 1, (int64_t[]){ 24 }, 2, (int64_t[]){ 5, 5 }, 0,
                            SP_INIT_NORMAL, 0.1f);
    CHECK(t == -(int)SP_ERR_SHAPE, "T=1: a view (5,5) of (24) accepted");
    sp_graph_free(g);

    for (int i = 0; i < NPARAM; i++) free(whole1[i]);
    sp_graph_free(g1);
    return check_summary("test_param_parts");
}
