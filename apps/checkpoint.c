/* Checkpoints of the apps over the safetensors module (see checkpoint.h). */
#include "apps/checkpoint.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "starpipe/safetensors.h"

#define FORMAT_VERSION "1"
static const char *const suffix[4] = { "", ".grad", ".adam_m", ".adam_v" };

/* Writes the tensors of the given kinds (what values) of every parameter. */
static sp_status save(const char *path, const sp_graph *g, const char *sig,
                      const char *settings, int step, const ckpt_io *io, const int *whats,
                      int nwhat)
{
    int np = sp_graph_num_params(g), n = np * nwhat;
    sp_st_tensor *t = calloc((size_t)n + 1, sizeof *t);
    char (*names)[80] = calloc((size_t)n + 1, sizeof *names);
    int64_t (*shapes)[SP_MAX_DIMS] = calloc((size_t)n + 1, sizeof *shapes);
    float **data = calloc((size_t)n + 1, sizeof *data);
    sp_status st = (!t || !names || !shapes || !data)
                       ? sp_set_error(SP_ERR_NOMEM, "checkpoint: out of memory") : SP_OK;
    for (int i = 0; st == SP_OK && i < np; i++) {
        sp_tensor p = sp_graph_param(g, i);
        for (int w = 0; st == SP_OK && w < nwhat; w++) {
            int k = i * nwhat + w;
            /* whole tensors, whatever the tensor parallelism of the run */
            if (!(data[k] = malloc((size_t)sp_param_whole_numel(g, p) * sizeof(float)))) {
                st = sp_set_error(SP_ERR_NOMEM, "checkpoint: out of memory");
                break;
            }
            st = io->get(io->ctx, p, whats[w], data[k]); /* collective on every rank */
            snprintf(names[k], sizeof names[k], "%s%s", sp_tensor_name(g, p),
                     whats[w] == 1 ? "" : suffix[whats[w]]);
            memcpy(shapes[k], sp_param_full_shape(g, p), sizeof shapes[k]);
            t[k] = (sp_st_tensor){ .name = names[k], .dtype = SP_ST_F32,
                                   .ndim = sp_tensor_ndim(g, p), .shape = shapes[k],
                                   .data = data[k] };
        }
    }
    char stepbuf[32];
    snprintf(stepbuf, sizeof stepbuf, "%d", step);
    sp_st_meta meta[4] = { { "starpipe.format", FORMAT_VERSION },
                           { "starpipe.model", sig },
                           { "starpipe.step", stepbuf },
                           { "starpipe.settings", settings } };
    if (st == SP_OK && io->writer)
        st = sp_safetensors_write(path, t, n, meta, settings ? 4 : 3, SP_ST_CHECKSUM);
    for (int k = 0; data && k < n; k++) free(data[k]);
    free(data), free(shapes), free(names), free(t);
    return st;
}

sp_status ckpt_save(const char *path, const sp_graph *g, const char *sig, const char *settings,
                    int steps_done, const ckpt_io *io)
{
    static const int whats[3] = { 0, 2, 3 };
    return save(path, g, sig, settings, steps_done, io, whats, 3);
}

sp_status ckpt_dump_grads(const char *path, const sp_graph *g, const char *sig, int step,
                          const ckpt_io *io)
{
    static const int whats[1] = { 1 };
    return save(path, g, sig, NULL, step, io, whats, 1);
}

char *ckpt_read_settings(const char *path)
{
    sp_safetensors *f = sp_safetensors_open(path, SP_ST_REQUIRE_CHECKSUM, NULL);
    const char *s = f ? sp_safetensors_meta(f, "starpipe.settings") : NULL;
    char *copy = s ? strdup(s) : NULL;
    sp_safetensors_close(f);
    return copy;
}

/* Signatures are "kind key=value key=value ...": the first word or key=value of one that
 * the other does not have, into a (this checkpoint's) and b (this run's). */
static void first_difference(const char *fsig, const char *sig, char *a, char *b, size_t len)
{
    char x[256], y[256], *sx = NULL, *sy = NULL;
    snprintf(x, sizeof x, "%s", fsig);
    snprintf(y, sizeof y, "%s", sig);
    char *tx = strtok_r(x, " ", &sx), *ty = strtok_r(y, " ", &sy);
    for (; tx || ty; tx = strtok_r(NULL, " ", &sx), ty = strtok_r(NULL, " ", &sy))
        if (!tx || !ty || strcmp(tx, ty)) {
            snprintf(a, len, "%s", tx ? tx : "(nothing)");
            snprintf(b, len, "%s", ty ? ty : "(nothing)");
            return;
        }
    snprintf(a, len, "?");
    snprintf(b, len, "?");
}

static int same_shape(const sp_st_tensor *t, const sp_graph *g, sp_tensor p)
{
    if (t->ndim != sp_tensor_ndim(g, p)) return 0; /* the whole tensor's shape */
    for (int d = 0; d < t->ndim; d++)
        if (t->shape[d] != sp_param_full_shape(g, p)[d]) return 0;
    return 1;
}

static void shape_str(char *buf, size_t n, int ndim, const int64_t *shape)
{
    size_t k = (size_t)snprintf(buf, n, "(");
    for (int d = 0; d < ndim && k < n; d++)
        k += (size_t)snprintf(buf + k, n - k, d ? ",%lld" : "%lld", (long long)shape[d]);
    if (k < n) snprintf(buf + k, n - k, ")");
}

sp_status ckpt_load(const char *path, const sp_graph *g, const char *sig, int *steps_done,
                    const ckpt_io *io)
{
    sp_status st;
    sp_safetensors *f = sp_safetensors_open(path, SP_ST_REQUIRE_CHECKSUM, &st);
    if (!f) return st;
    const char *fmt = sp_safetensors_meta(f, "starpipe.format");
    const char *fsig = sp_safetensors_meta(f, "starpipe.model");
    const char *fstep = sp_safetensors_meta(f, "starpipe.step");
    char *end = NULL;
    long step = fstep ? strtol(fstep, &end, 10) : -1;
    if (!fmt || strcmp(fmt, FORMAT_VERSION) || !fsig || !fstep || end == fstep || *end || step < 0 ||
        step > 1L << 30) {
        st = sp_set_error(SP_ERR_FORMAT, "%s: not a starpipe checkpoint (metadata "
                          "starpipe.format/model/step missing or malformed)", path);
        goto out;
    }
    /* the signature holds everything that changes the computation (heads, context,
     * vocabulary, sizes), even when every tensor name and shape would agree */
    if (strcmp(fsig, sig)) {
        char a[128], b[128];
        first_difference(fsig, sig, a, b, sizeof a);
        st = sp_set_error(SP_ERR_FORMAT, "%s: a checkpoint of another model: %s there, %s in "
                          "this run (checkpoint of '%s', this run is '%s')", path, a, b, fsig,
                          sig);
        goto out;
    }
    /* every parameter with its moments, the right dtype and shape; nothing else */
    int np = sp_graph_num_params(g), expected = 3 * np;
    for (int i = 0; i < np; i++) {
        sp_tensor p = sp_graph_param(g, i);
        for (int w = 0; w < 4; w++) {
            if (w == 1) continue;
            char name[80], a[64], b[64];
            snprintf(name, sizeof name, "%s%s", sp_tensor_name(g, p), suffix[w]);
            const sp_st_tensor *t = sp_safetensors_find(f, name);
            if (!t) {
                st = sp_set_error(SP_ERR_FORMAT, "%s: no tensor '%s' (checkpoint of '%s', this "
                                  "run is '%s')", path, name, fsig, sig);
                goto out;
            }
            if (t->dtype != SP_ST_F32 || !same_shape(t, g, p)) {
                shape_str(a, sizeof a, t->ndim, t->shape);
                shape_str(b, sizeof b, sp_tensor_ndim(g, p), sp_param_full_shape(g, p));
                st = sp_set_error(SP_ERR_FORMAT, "%s: tensor '%s' is %s %s in the checkpoint, "
                                  "F32 %s in this model (checkpoint of '%s', this run is '%s')",
                                  path, name, sp_st_dtype_name(t->dtype), a, b, fsig, sig);
                goto out;
            }
        }
    }
    if (sp_safetensors_count(f) != expected) {
        for (int j = 0; j < sp_safetensors_count(f); j++) {
            const char *name = sp_safetensors_at(f, j)->name;
            char base[80];
            snprintf(base, sizeof base, "%s", name);
            size_t len = strlen(base);
            if (len > 7 && (!strcmp(base + len - 7, ".adam_m") || !strcmp(base + len - 7, ".adam_v")))
                base[len - 7] = '\0';
            sp_tensor p = sp_graph_find(g, base);
            if (p < 0 || !sp_tensor_is_param(g, p)) {
                st = sp_set_error(SP_ERR_FORMAT, "%s: tensor '%s' is not a parameter of this "
                                  "model (checkpoint of '%s', this run is '%s')", path, name,
                                  fsig, sig);
                goto out;
            }
        }
    }
    for (int i = 0; i < np && st == SP_OK; i++) {
        sp_tensor p = sp_graph_param(g, i);
        for (int w = 0; w < 4 && st == SP_OK; w++) {
            if (w == 1) continue;
            char name[80];
            snprintf(name, sizeof name, "%s%s", sp_tensor_name(g, p), suffix[w]);
            st = io->set(io->ctx, p, w, sp_safetensors_find(f, name)->data);
        }
    }
    if (st == SP_OK) *steps_done = (int)step;
out:
    sp_safetensors_close(f);
    return st;
}
