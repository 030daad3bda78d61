/* Checkpoints of the apps over the safetensors module (see checkpoint.h). */
#include "apps/checkpoint.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "starpipe/safetensors.h"

#define FORMAT_VERSION "1"
static const char *const suffix[4] = { "", ".grad", ".adam_m", ".adam_v" };

/* The stored tensors of parameter p: the layout's pieces, or p whole under its name.
 * Returns their count, or -1 (a message set) when the layout's pieces do not cover p. */
static int pieces_of(const ckpt_io *io, const sp_graph *g, sp_tensor p, ckpt_piece *pc)
{
    const int64_t *shape = sp_param_full_shape(g, p);
    const int ndim = sp_tensor_ndim(g, p);
    const int64_t rows = ndim ? shape[0] : 1;
    /* a padded vocabulary's rows (sp_param_pad_rows) are not stored: files hold the
     * tokens' rows, whatever the padding (and so whatever T) */
    const int64_t valid = sp_param_valid_rows(g, p);
    const int64_t rowlen = sp_param_whole_numel(g, p) / rows, whole = rowlen * valid;
    memset(pc, 0, sizeof *pc * CKPT_MAX_PIECES); /* a layout may leave the rope fields */
    int n = io->layout ? io->layout(io->layout_ctx, g, p, pc) : 0;
    if (n <= 0) {
        memset(pc, 0, sizeof *pc);
        snprintf(pc->name, sizeof pc->name, "%s", sp_tensor_name(g, p));
        pc->ndim = ndim;
        memcpy(pc->shape, shape, sizeof(int64_t) * (size_t)ndim);
        if (ndim) pc->shape[0] = valid;
        pc->rows = pc->stride = valid;
        pc->blocks = 1;
        return 1;
    }
    int64_t covered = 0;
    for (int k = 0; k < n; k++) {
        const ckpt_piece *q = &pc[k];
        int64_t numel = 1;
        for (int d = 0; d < q->ndim; d++) numel *= q->shape[d];
        const int64_t last = q->row0 + (q->blocks - 1) * q->stride + q->rows;
        if (q->rows < 1 || q->blocks < 1 || q->row0 < 0 || last > rows ||
            numel != q->blocks * q->rows * rowlen) {
            sp_set_error(SP_ERR_ARG, "checkpoint layout: piece '%s' of '%s' does not fit its "
                         "rows", q->name, sp_tensor_name(g, p));
            return -1;
        }
        covered += numel;
    }
    if (covered != whole) {
        sp_set_error(SP_ERR_ARG, "checkpoint layout: the pieces of '%s' hold %lld of its %lld "
                     "floats", sp_tensor_name(g, p), (long long)covered, (long long)whole);
        return -1;
    }
    return n;
}

/* Piece q of a whole tensor (rows of rl floats) to or from its packed copy. */
static void move_piece(float *whole, float *packed, const ckpt_piece *q, int64_t rl, int out)
{
    for (int64_t b = 0; b < q->blocks; b++) {
        float *w = whole + (q->row0 + b * q->stride) * rl, *c = packed + b * q->rows * rl;
        memcpy(out ? c : w, out ? w : c, sizeof(float) * (size_t)(q->rows * rl));
    }
}

int ckpt_llama_layout(const sp_llama_config *l, const sp_graph *g, sp_tensor p, ckpt_piece *pc)
{
    const char *name = sp_tensor_name(g, p);
    const char *qkv = strstr(name, "self_attn.qkv_proj.weight");
    const char *gu = strstr(name, "mlp.gate_up_proj.weight");
    if (!qkv && !gu) return 0;
    const int64_t C = l->channels, hs = C / l->heads, KV = l->kv_heads, G = l->heads / KV;
    const int prefix = (int)((qkv ? qkv : gu) - name);
    static const char *const qkv_names[3] = { "q_proj", "k_proj", "v_proj" };
    static const char *const mlp_names[2] = { "gate_proj", "up_proj" };
    const int n = qkv ? 3 : 2;
    for (int k = 0; k < n; k++) {
        ckpt_piece *q = &pc[k];
        memset(q, 0, sizeof *q);
        snprintf(q->name, sizeof q->name, "%.*s%s.%s.weight", prefix, name,
                 qkv ? "self_attn" : "mlp", qkv ? qkv_names[k] : mlp_names[k]);
        q->ndim = 2;
        q->shape[1] = C;
        if (qkv && k == 0) { /* the layer's rotary embedding, which rotates q and k */
            q->rope_head = (int)hs;
            q->rope_theta = l->rope_theta != 0 ? l->rope_theta : 10000.0f;
            snprintf(q->rope_buffer, sizeof q->rope_buffer, "%.*sself_attn.rotary_emb.inv_freq",
                     prefix, name);
        }
        if (qkv) { /* per KV group: G query heads, the key, the value */
            q->rows = k == 0 ? G * hs : hs;
            q->row0 = k == 0 ? 0 : (G + k - 1) * hs;
            q->blocks = KV;
            q->stride = (G + 2) * hs;
        } else {
            q->rows = q->stride = l->hidden;
            q->row0 = k * (int64_t)l->hidden;
            q->blocks = 1;
        }
        q->shape[0] = q->rows * q->blocks;
    }
    return n;
}

int ckpt_gpt_layout(const sp_graph *g, sp_tensor p, ckpt_piece *pc)
{
    static const char *const top[][2] = { { "wte", "wte.weight" }, { "wpe", "wpe.weight" },
                                          { "lnf.g", "ln_f.weight" }, { "lnf.b", "ln_f.bias" } };
    static const char *const block[][2] = {
        { "ln1.g", "ln_1.weight" },         { "ln1.b", "ln_1.bias" },
        { "attn.w", "attn.c_attn.weight" }, { "attn.b", "attn.c_attn.bias" },
        { "proj.w", "attn.c_proj.weight" }, { "proj.b", "attn.c_proj.bias" },
        { "ln2.g", "ln_2.weight" },         { "ln2.b", "ln_2.bias" },
        { "fc.w", "mlp.c_fc.weight" },      { "fc.b", "mlp.c_fc.bias" },
        { "fcproj.w", "mlp.c_proj.weight" }, { "fcproj.b", "mlp.c_proj.bias" } };
    const char *name = sp_tensor_name(g, p);
    char hf[80] = "";
    for (size_t k = 0; !hf[0] && k < sizeof top / sizeof *top; k++)
        if (!strcmp(name, top[k][0])) snprintf(hf, sizeof hf, "%s", top[k][1]);
    int layer, at = 0;
    if (!hf[0] && sscanf(name, "h%d.%n", &layer, &at) == 1 && at > 0)
        for (size_t k = 0; !hf[0] && k < sizeof block / sizeof *block; k++)
            if (!strcmp(name + at, block[k][0]))
                snprintf(hf, sizeof hf, "h.%d.%s", layer, block[k][1]);
    if (!hf[0]) return 0; /* not the GPT's: under its own name */
    const int ndim = sp_tensor_ndim(g, p);
    memset(pc, 0, sizeof *pc);
    snprintf(pc->name, sizeof pc->name, "transformer.%s", hf);
    snprintf(pc->alt[0], sizeof pc->alt[0], "%s", hf);
    snprintf(pc->alt[1], sizeof pc->alt[1], "%s", name);
    if (!strcmp(name, "wte")) snprintf(pc->alias, sizeof pc->alias, "lm_head.weight");
    pc->ndim = ndim;
    memcpy(pc->shape, sp_param_full_shape(g, p), sizeof(int64_t) * (size_t)ndim);
    if (ndim) pc->shape[0] = sp_param_valid_rows(g, p); /* not a padded vocabulary's rest */
    pc->rows = pc->stride = ndim ? pc->shape[0] : 1;
    pc->blocks = 1;
    return 1;
}

/* A stored name: a piece's and a kind's suffix (.adam_m, ...). */
typedef struct {
    char s[sizeof(((ckpt_piece *)0)->name) + 8];
} stored_name;

static stored_name name_of(const ckpt_piece *q, int what)
{
    stored_name n;
    size_t a = strnlen(q->name, sizeof q->name - 1), b = strlen(suffix[what]);
    memcpy(n.s, q->name, a);
    memcpy(n.s + a, suffix[what], b + 1);
    return n;
}

/* Piece q's tensor of kind what in f: under its name, else one of its other spellings
 * (alt); NULL when none. */
static const sp_st_tensor *find_stored(sp_safetensors *f, const ckpt_piece *q, int what)
{
    const sp_st_tensor *t = sp_safetensors_find(f, name_of(q, what).s);
    for (int a = 0; !t && a < 2; a++)
        if (q->alt[a][0]) {
            ckpt_piece o;
            memcpy(o.name, q->alt[a], sizeof o.name);
            t = sp_safetensors_find(f, name_of(&o, what).s);
        }
    return t;
}

/* Whether name is one of piece q's of kind what, in any spelling, or its alias (values). */
static int names_piece(const ckpt_piece *q, int what, const char *name)
{
    if (!strcmp(name_of(q, what).s, name)) return 1;
    for (int a = 0; a < 2; a++)
        if (q->alt[a][0]) {
            ckpt_piece o;
            memcpy(o.name, q->alt[a], sizeof o.name);
            if (!strcmp(name_of(&o, what).s, name)) return 1;
        }
    return what == 0 && q->alias[0] && !strcmp(q->alias, name);
}

static int64_t piece_numel(const ckpt_piece *q)
{
    int64_t n = 1;
    for (int d = 0; d < q->ndim; d++) n *= q->shape[d];
    return n;
}

static int64_t row_floats(const sp_graph *g, sp_tensor p)
{
    return sp_tensor_ndim(g, p) ? sp_param_whole_numel(g, p) / sp_param_full_shape(g, p)[0]
                                : 1;
}

/* Writes the tensors of the given kinds (what values) of every parameter, in io's layout. */
static sp_status save(const char *path, const sp_graph *g, const char *sig,
                      const char *settings, int step, const ckpt_io *io, const int *whats,
                      int nwhat)
{
    const int np = sp_graph_num_params(g);
    sp_status st = SP_OK;
    int total = 0, aliases = 0, values = 0;
    for (int w = 0; w < nwhat; w++) values |= whats[w] == 0;
    ckpt_piece pc[CKPT_MAX_PIECES];
    for (int i = 0; i < np && st == SP_OK; i++) {
        int k = pieces_of(io, g, sp_graph_param(g, i), pc);
        if (k < 0) st = SP_ERR_ARG;
        total += k;
        for (int q = 0; q < k; q++) aliases += values && pc[q].alias[0];
    }
    if (st != SP_OK) return st;
    const int n = total * nwhat + aliases;
    sp_st_tensor *t = calloc((size_t)n + 1, sizeof *t);
    ckpt_piece *pieces = calloc((size_t)n + 1, sizeof *pieces);
    stored_name *names = calloc((size_t)n + 1, sizeof *names);
    float **data = calloc((size_t)n + 1, sizeof *data);
    float *whole = NULL;
    if (!t || !pieces || !names || !data) st = sp_set_error(SP_ERR_NOMEM, "checkpoint: out of memory");
    for (int i = 0, k = 0; st == SP_OK && i < np; i++) {
        sp_tensor p = sp_graph_param(g, i);
        const int npc = pieces_of(io, g, p, pc);
        const int64_t rl = row_floats(g, p);
        free(whole);
        /* whole tensors, whatever the tensor parallelism of the run */
        if (!(whole = malloc((size_t)sp_param_whole_numel(g, p) * sizeof(float)))) {
            st = sp_set_error(SP_ERR_NOMEM, "checkpoint: out of memory");
            break;
        }
        for (int w = 0; st == SP_OK && w < nwhat; w++) {
            st = io->get(io->ctx, p, whats[w], whole); /* collective on every rank */
            for (int q = 0; st == SP_OK && q < npc; q++, k++) {
                pieces[k] = pc[q];
                names[k] = name_of(&pc[q], whats[w] == 1 ? 0 : whats[w]); /* grads: bare */
                if (!(data[k] = malloc((size_t)piece_numel(&pc[q]) * sizeof(float)))) {
                    st = sp_set_error(SP_ERR_NOMEM, "checkpoint: out of memory");
                    break;
                }
                move_piece(whole, data[k], &pc[q], rl, 1);
                t[k] = (sp_st_tensor){ .name = names[k].s, .dtype = SP_ST_F32,
                                       .ndim = pc[q].ndim, .shape = pieces[k].shape,
                                       .data = data[k] };
                if (whats[w] == 0 && pc[q].alias[0]) { /* the same values, its other name */
                    k++;
                    pieces[k] = pc[q];
                    snprintf(names[k].s, sizeof names[k].s, "%s", pc[q].alias);
                    t[k] = t[k - 1];
                    t[k].name = names[k].s, t[k].shape = pieces[k].shape;
                }
            }
        }
    }
    free(whole);
    char stepbuf[32];
    snprintf(stepbuf, sizeof stepbuf, "%d", step);
    sp_st_meta meta[4] = { { "starpipe.format", FORMAT_VERSION },
                           { "starpipe.model", sig },
                           { "starpipe.step", stepbuf },
                           { "starpipe.settings", settings } };
    if (st == SP_OK && io->writer)
        st = sp_safetensors_write(path, t, n, meta, settings ? 4 : 3, SP_ST_CHECKSUM);
    for (int k = 0; data && k < n; k++) free(data[k]);
    free(data), free(names), free(pieces), free(t);
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

char *ckpt_read_meta(const char *path, const char *key)
{
    sp_safetensors *f = sp_safetensors_open(path, SP_ST_REQUIRE_CHECKSUM, NULL);
    const char *s = f ? sp_safetensors_meta(f, key) : NULL;
    char *copy = s ? strdup(s) : NULL;
    sp_safetensors_close(f);
    return copy;
}

/* Signatures are "kind key=value key=value ...": the first word or key=value of one that
 * the other does not have, into a (this checkpoint's) and b (this run's). */
static int same_token(const char *x, const char *y);

/* 1 when the two differ: *a and *b then hold the first word or key=value of one that the
 * other does not have (a: this checkpoint's, b: this run's). */
static int first_difference(const char *fsig, const char *sig, char *a, char *b, size_t len)
{
    char x[256], y[256], *sx = NULL, *sy = NULL;
    snprintf(x, sizeof x, "%s", fsig);
    snprintf(y, sizeof y, "%s", sig);
    char *tx = strtok_r(x, " ", &sx), *ty = strtok_r(y, " ", &sy);
    for (; tx || ty; tx = strtok_r(NULL, " ", &sx), ty = strtok_r(NULL, " ", &sy))
        if (!tx || !ty || !same_token(tx, ty)) {
            snprintf(a, len, "%s", tx ? tx : "(nothing)");
            snprintf(b, len, "%s", ty ? ty : "(nothing)");
            return 1;
        }
    return 0;
}

/* Equal words, or key=value with one key and values that read as the same number:
 * signatures written before rope_theta was stored exactly ("1e+06") keep loading. */
static int same_token(const char *x, const char *y)
{
    if (!strcmp(x, y)) return 1;
    const char *ex = strchr(x, '='), *ey = strchr(y, '=');
    if (!ex || !ey || ex - x != ey - y || strncmp(x, y, (size_t)(ex - x))) return 0;
    char *endx, *endy;
    double vx = strtod(ex + 1, &endx), vy = strtod(ey + 1, &endy);
    return endx != ex + 1 && !*endx && endy != ey + 1 && !*endy && vx == vy;
}

static void shape_of(char *buf, size_t n, int ndim, const int64_t *shape)
{
    size_t k = (size_t)snprintf(buf, n, "(");
    for (int d = 0; d < ndim && k < n; d++)
        k += (size_t)snprintf(buf + k, n - k, d ? ",%lld" : "%lld", (long long)shape[d]);
    if (k < n) snprintf(buf + k, n - k, ")");
}

/* A tensor of the file as float32 values (F32 as stored; BF16 and F16 widened exactly
 * when wide is set), into dst (n floats). */
static float half_to_float(uint16_t h)
{
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 31u, m = h & 0x3FFu;
    uint32_t bits;
    if (e == 31) bits = sign | 0x7F800000u | (m << 13); /* inf, NaN */
    else if (e) bits = sign | ((e + 112) << 23) | (m << 13);
    else if (!m) bits = sign;
    else { /* subnormal: m 2^-24, normalized */
        int k = 0;
        uint32_t mm = m;
        while (!(mm & 0x400u)) mm <<= 1, k++;
        bits = sign | ((uint32_t)(113 - k) << 23) | ((mm & 0x3FFu) << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static void to_f32(float *dst, const sp_st_tensor *t, int64_t n)
{
    const unsigned char *b = t->data;
    for (int64_t i = 0; i < n; i++) {
        uint16_t h;
        if (t->dtype == SP_ST_F32) {
            memcpy(dst + i, b + 4 * i, 4);
            continue;
        }
        memcpy(&h, b + 2 * i, 2);
        if (t->dtype == SP_ST_F16) {
            dst[i] = half_to_float(h);
        } else {
            uint32_t bits = (uint32_t)h << 16;
            memcpy(dst + i, &bits, 4);
        }
    }
}

/* Checks that the file holds every piece of every parameter (names with the suffixes
 * whats[0..nwhat) give; dtype F32, or also BF16/F16 with wide) and nothing else. */
static sp_status check_pieces(sp_safetensors *f, const char *path, const sp_graph *g,
                              const ckpt_io *io, const int *whats, int nwhat, int wide,
                              const char *ctx)
{
    ckpt_piece pc[CKPT_MAX_PIECES];
    int expected = 0;
    for (int i = 0; i < sp_graph_num_params(g); i++) {
        sp_tensor p = sp_graph_param(g, i);
        int npc = pieces_of(io, g, p, pc);
        if (npc < 0) return SP_ERR_ARG;
        for (int q = 0; q < npc; q++)
            for (int w = 0; w < nwhat; w++, expected++) {
                char a[64], b[64];
                const stored_name nm = name_of(&pc[q], whats[w]);
                const sp_st_tensor *t = find_stored(f, &pc[q], whats[w]);
                if (!t)
                    return sp_set_error(SP_ERR_FORMAT, "%s: no tensor '%s'%s", path, nm.s, ctx);
                const char *name = t->name;
                int ok = t->ndim == pc[q].ndim &&
                         (t->dtype == SP_ST_F32 ||
                          (wide && (t->dtype == SP_ST_BF16 || t->dtype == SP_ST_F16)));
                for (int d = 0; ok && d < t->ndim; d++) ok = t->shape[d] == pc[q].shape[d];
                if (!ok) {
                    shape_of(a, sizeof a, t->ndim, t->shape);
                    shape_of(b, sizeof b, pc[q].ndim, pc[q].shape);
                    return sp_set_error(SP_ERR_FORMAT, "%s: tensor '%s' is %s %s in the %s, "
                                        "F32%s %s in this model%s", path, name,
                                        sp_st_dtype_name(t->dtype), a,
                                        wide ? "file" : "checkpoint", wide ? " (or BF16, F16)" : "",
                                        b, ctx);
                }
                /* a tied weight's other name, where the file has it: the same values */
                const sp_st_tensor *al = whats[w] == 0 && pc[q].alias[0]
                                             ? sp_safetensors_find(f, pc[q].alias) : NULL;
                if (!al) continue;
                expected++;
                int same = al->dtype == t->dtype && al->ndim == t->ndim;
                for (int d = 0; same && d < t->ndim; d++) same = al->shape[d] == t->shape[d];
                if (!same || memcmp(al->data, t->data, (size_t)piece_numel(&pc[q]) *
                                                           sp_st_dtype_size(t->dtype)))
                    return sp_set_error(SP_ERR_FORMAT, "%s: tensor '%s' is not '%s' (the two "
                                        "are one weight, tied, in this model)%s", path,
                                        pc[q].alias, name, ctx);
            }
    }
    if (sp_safetensors_count(f) == expected && !wide) return SP_OK;
    /* the names the file has that this model does not: the first one */
    for (int j = 0; j < sp_safetensors_count(f); j++) {
        const char *name = sp_safetensors_at(f, j)->name;
        int known = 0;
        for (int i = 0; !known && i < sp_graph_num_params(g); i++) {
            int npc = pieces_of(io, g, sp_graph_param(g, i), pc);
            for (int q = 0; !known && q < npc; q++) {
                for (int w = 0; !known && w < (wide ? 4 : nwhat); w++) /* values: moments ok */
                    known = names_piece(&pc[q], wide ? w : whats[w], name);
                if (wide && pc[q].rope_head) known = known || !strcmp(pc[q].rope_buffer, name);
            }
        }
        if (!known)
            return sp_set_error(SP_ERR_FORMAT, "%s: tensor '%s' is not a parameter of this "
                                "model%s", path, name, ctx);
    }
    if (wide) return SP_OK; /* values, and perhaps a starpipe checkpoint's moments */
    return sp_set_error(SP_ERR_FORMAT, "%s: %d tensors, this model has %d%s", path,
                        sp_safetensors_count(f), expected, ctx);
}

/* The first element of t (F32, BF16 or F16) that is a NaN or an infinity, or -1: its
 * exponent bits all set. */
static int64_t first_nonfinite(const sp_st_tensor *t, int64_t n)
{
    const unsigned char *b = t->data;
    for (int64_t i = 0; i < n; i++) {
        if (t->dtype == SP_ST_F32) {
            uint32_t x;
            memcpy(&x, b + 4 * i, 4);
            if ((x & 0x7F800000u) == 0x7F800000u) return i;
        } else {
            uint16_t h;
            memcpy(&h, b + 2 * i, 2);
            const uint16_t e = t->dtype == SP_ST_F16 ? 0x7C00u : 0x7F80u;
            if ((h & e) == e) return i;
        }
    }
    return -1;
}

/* Refuses a file whose tensors of kinds whats[] (checked) hold a NaN or an infinity, with
 * the first one's tensor and element: such values load silently and stop the run at its
 * first step ("non-finite gradients") naming neither the file nor the tensor. */
static sp_status check_finite(sp_safetensors *f, const char *path, const sp_graph *g,
                              const ckpt_io *io, const int *whats, int nwhat, const char *ctx)
{
    ckpt_piece pc[CKPT_MAX_PIECES];
    for (int i = 0; i < sp_graph_num_params(g); i++) {
        const int npc = pieces_of(io, g, sp_graph_param(g, i), pc);
        for (int q = 0; q < npc; q++)
            for (int w = 0; w < nwhat; w++) {
                const sp_st_tensor *t = find_stored(f, &pc[q], whats[w]);
                const int64_t k = first_nonfinite(t, piece_numel(&pc[q]));
                if (k < 0) continue;
                float v;
                to_f32(&v, &(sp_st_tensor){ .dtype = t->dtype,
                                            .data = (const unsigned char *)t->data +
                                                    (size_t)k * sp_st_dtype_size(t->dtype) }, 1);
                return sp_set_error(SP_ERR_FORMAT, "%s: tensor '%s' holds %s at element %lld "
                                    "(of %lld): refused, nothing was loaded%s", path, t->name,
                                    isnan(v) ? "NaN" : v > 0 ? "+Inf" : "-Inf", (long long)k,
                                    (long long)piece_numel(&pc[q]), ctx);
            }
    }
    return SP_OK;
}

/* Checks the rotary buffers a file of the layout holds (ckpt_piece's rope_buffer) against
 * the model's: rope_head/2 floats inv_freq[i] = 1/theta^(2i/rope_head), as transformers
 * computes them in float32 (the exponent 2i/rope_head rounded to float32, theta too), to
 * 1e-6 for F32 and a unit in the last place for BF16 and F16. They are derived, not
 * loaded: the model computes its own from --rope-theta, so one of another theta is a file
 * of another model. */
static sp_status check_rope(sp_safetensors *f, const char *path, const sp_graph *g,
                            const ckpt_io *io, const char *ctx)
{
    ckpt_piece pc[CKPT_MAX_PIECES];
    for (int i = 0; i < sp_graph_num_params(g); i++) {
        const int npc = pieces_of(io, g, sp_graph_param(g, i), pc);
        for (int q = 0; q < npc; q++) {
            const ckpt_piece *r = &pc[q];
            const sp_st_tensor *t = r->rope_head ? sp_safetensors_find(f, r->rope_buffer) : NULL;
            if (!t) continue;
            const int64_t n = r->rope_head / 2;
            if (t->ndim != 1 || t->shape[0] != n ||
                (t->dtype != SP_ST_F32 && t->dtype != SP_ST_BF16 && t->dtype != SP_ST_F16)) {
                char a[64];
                shape_of(a, sizeof a, t->ndim, t->shape);
                return sp_set_error(SP_ERR_FORMAT, "%s: tensor '%s' is %s %s in the file, F32 "
                                    "(or BF16, F16) (%lld) for this model's heads of %d%s",
                                    path, t->name, sp_st_dtype_name(t->dtype), a, (long long)n,
                                    r->rope_head, ctx);
            }
            const double rel = t->dtype == SP_ST_F32 ? 1e-6 : t->dtype == SP_ST_BF16 ? 0x1p-7
                                                                                     : 0x1p-10;
            const double tiny = t->dtype == SP_ST_F16 ? 0x1p-24 : 0; /* F16's subnormals */
            const double theta = (float)r->rope_theta;
            for (int64_t k = 0; k < n; k++) {
                float v;
                to_f32(&v, &(sp_st_tensor){ .dtype = t->dtype,
                                            .data = (const unsigned char *)t->data +
                                                    (size_t)k * sp_st_dtype_size(t->dtype) }, 1);
                const float e = (float)(2 * k) / (float)r->rope_head;
                const double want = 1.0 / pow(theta, (double)e);
                if (fabs((double)v - want) <= rel * want + tiny) continue;
                /* the theta the file was written with: its last element, theta^-e with e
                 * nearest 1, tells it best (inv_freq[1]'s error grows by head/2) */
                char implied[64] = "no theta (its first element is not 1)";
                float vl = v;
                const float el = (float)(2 * (n - 1)) / (float)r->rope_head;
                if (n > 1)
                    to_f32(&vl, &(sp_st_tensor){ .dtype = t->dtype,
                                                 .data = (const unsigned char *)t->data +
                                                         (size_t)(n - 1) * sp_st_dtype_size(t->dtype) }, 1);
                const double th = n > 1 && vl > 0 && vl < 1 ? pow(vl, -1.0 / el) : 0;
                if (th > 0 && isfinite(th)) snprintf(implied, sizeof implied, "theta %.6g", th);
                else if (n > 1) snprintf(implied, sizeof implied, "no theta");
                return sp_set_error(SP_ERR_FORMAT, "%s: tensor '%s' holds the rotary "
                                    "frequencies of %s, but this run has --rope-theta %.6g "
                                    "(element %lld is %.9g, not %.9g)%s", path, t->name,
                                    implied, theta, (long long)k, v, want, ctx);
            }
        }
    }
    return SP_OK;
}

/* Sets what w of every parameter from its pieces in f (checked). */
static sp_status set_from(sp_safetensors *f, const sp_graph *g, const ckpt_io *io, int w)
{
    ckpt_piece pc[CKPT_MAX_PIECES];
    sp_status st = SP_OK;
    for (int i = 0; i < sp_graph_num_params(g) && st == SP_OK; i++) {
        sp_tensor p = sp_graph_param(g, i);
        const int npc = pieces_of(io, g, p, pc);
        const int64_t rl = row_floats(g, p);
        int64_t most = 0;
        for (int q = 0; q < npc; q++) most = piece_numel(&pc[q]) > most ? piece_numel(&pc[q]) : most;
        /* zeroed: a padded vocabulary's rows, which files do not hold, load as zeros */
        float *whole = calloc((size_t)sp_param_whole_numel(g, p), sizeof(float));
        float *packed = malloc(sizeof(float) * (size_t)(most ? most : 1));
        if (!whole || !packed) st = sp_set_error(SP_ERR_NOMEM, "checkpoint: out of memory");
        for (int q = 0; q < npc && st == SP_OK; q++) {
            to_f32(packed, find_stored(f, &pc[q], w), piece_numel(&pc[q]));
            move_piece(whole, packed, &pc[q], rl, 0);
        }
        if (st == SP_OK) st = io->set(io->ctx, p, w, whole);
        free(whole), free(packed);
    }
    return st;
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
    char a[128], b[128];
    if (first_difference(fsig, sig, a, b, sizeof a)) {
        st = sp_set_error(SP_ERR_FORMAT, "%s: a checkpoint of another model: %s there, %s in "
                          "this run (checkpoint of '%s', this run is '%s')", path, a, b, fsig,
                          sig);
        goto out;
    }
    /* every parameter with its moments, the right dtype and shape; nothing else */
    char ctx[640];
    snprintf(ctx, sizeof ctx, " (checkpoint of '%s', this run is '%s')", fsig, sig);
    static const int whats[3] = { 0, 2, 3 };
    st = check_pieces(f, path, g, io, whats, 3, 0, ctx);
    if (st == SP_OK) st = check_finite(f, path, g, io, whats, 3, "");
    for (int w = 0; w < 3 && st == SP_OK; w++) st = set_from(f, g, io, whats[w]);
    if (st == SP_OK) *steps_done = (int)step;
out:
    sp_safetensors_close(f);
    return st;
}

sp_status ckpt_load_values(const char *path, const sp_graph *g, const ckpt_io *io)
{
    sp_status st;
    sp_safetensors *f = sp_safetensors_open(path, 0, &st);
    if (!f) return st;
    static const int value[1] = { 0 };
    const char *ctx = " (--init: a file of this model's values)";
    st = check_pieces(f, path, g, io, value, 1, 1, ctx);
    if (st == SP_OK) st = check_finite(f, path, g, io, value, 1, " (--init)");
    if (st == SP_OK) st = check_rope(f, path, g, io, " (--init)");
    if (st == SP_OK) st = set_from(f, g, io, 0);
    sp_safetensors_close(f);
    return st;
}
