/* The float64 side of the gradient tests (test_model_grad.c, test_rmsnorm.c,
 * test_llama_ops.c, test_llama_model.c): a float64 copy of a reference's parameters,
 * looked up by name, and the check of a float32 gradient against central finite
 * differences of a float64 loss. */
#ifndef SP_TESTS_GRAPH_GRAD64_H
#define SP_TESTS_GRAPH_GRAD64_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "starpipe/reference.h"
#include "tests/check.h"

typedef struct {
    const sp_graph *g;
    double **val; /* per tensor id, NULL if not a param */
} params64;

static inline params64 copy_params(const sp_graph *g, const sp_reference *r)
{
    params64 P = { g, calloc((size_t)sp_graph_num_tensors(g), sizeof(double *)) };
    for (int i = 0; i < sp_graph_num_params(g); i++) {
        sp_tensor t = sp_graph_param(g, i);
        int64_t n = sp_tensor_numel(g, t);
        const float *src = sp_reference_param(r, t);
        P.val[t] = malloc((size_t)n * sizeof(double));
        for (int64_t j = 0; j < n; j++) P.val[t][j] = src[j];
    }
    return P;
}

/* The parameter named fmt (with %d the layer l) */
static inline double *PP(const params64 *P, const char *fmt, int l)
{
    char name[96];
    snprintf(name, sizeof name, fmt, l);
    sp_tensor t = sp_graph_find(P->g, name);
    REQUIRE(t >= 0 && P->val[t], "no parameter %s", name);
    return P->val[t];
}

static inline void free_params(params64 *P)
{
    for (int t = 0; t < sp_graph_num_tensors(P->g); t++) free(P->val[t]);
    free(P->val);
}

/* grad (float32) of the count entries of val (entry[k], or k itself when entry is NULL)
 * against central differences, step 1e-5 max(1, |v|), of loss(ctx), which reads val:
 * the largest error within 2e-3 of the largest |difference| (at least 1e-4), so that
 * float32's rounding through a few layers (~1e-5 relative) passes and a wrong VJP or a
 * lost contribution (errors of order 1) cannot. A NaN fails. */
static inline void fd_check(const char *what, double *val, const int64_t *entry, int64_t count,
                            const float *grad, double (*loss)(void *), void *ctx)
{
    double maxfd = 0, maxerr = 0;
    for (int64_t k = 0; k < count; k++) {
        const int64_t j = entry ? entry[k] : k;
        double *v = &val[j], keep = *v, h = 1e-5 * fmax(1.0, fabs(keep));
        *v = keep + h;
        double lp = loss(ctx);
        *v = keep - h;
        double lm = loss(ctx);
        *v = keep;
        double fd = (lp - lm) / (2 * h), err = fabs(grad[j] - fd);
        maxfd = fmax(maxfd, fabs(fd));
        if (!(err <= maxerr)) maxerr = isnan(err) ? INFINITY : err;
    }
    double tol = 2e-3 * fmax(maxfd, 1e-4);
    CHECK(maxerr <= tol, "%s: max error %.3g over %lld entries (largest |fd| %.3g, tolerance "
          "%.3g)", what, maxerr, (long long)count, maxfd, tol);
}

#endif
