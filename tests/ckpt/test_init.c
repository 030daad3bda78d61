/* What --init (ckpt_load_values) and --load (ckpt_load) refuse in a file that is otherwise
 * well formed (issue 36, defect 9), on a small Llama in Hugging Face's layout written here:
 * a NaN or an infinity in a value (or, for --load, in a moment) is refused naming the file,
 * the tensor and the element, and nothing is set; rotary_emb.inv_freq buffers, which older
 * transformers saved, load when their frequencies are --rope-theta's (the same values as a
 * file without them) and are refused naming both thetas when they are another's. */
#include <math.h>

#include "apps/checkpoint.h"
#include "ck.h"
#include "param_store.h"
#include "starpipe/models.h"

/* The run: a Llama of 2 layers, heads of 8 (inv_freq of 4), its parameters in a store. */
static sp_llama_config cfg = { .vocab = 16, .context = 4, .layers = 2, .heads = 2,
                               .kv_heads = 1, .channels = 16, .hidden = 24, .batch = 1,
                               .stages = 1 };
static int layout(const void *ctx, const sp_graph *gr, sp_tensor p, ckpt_piece *pc)
{
    return ckpt_llama_layout(ctx, gr, p, pc);
}
static ckpt_io io = { .get = get, .set = set, .writer = 1, .layout = layout,
                      .layout_ctx = &cfg };

/* every value of the store to a marker, and the store's values in one array */
static void mark_store(float v)
{
    for (int i = 0; i < sp_graph_num_params(g); i++)
        for (int w = 0; w < 4; w++)
            for (int64_t k = 0; k < sp_param_whole_numel(g, sp_graph_param(g, i)); k++)
                store[i][w][k] = v;
    nsets = 0;
}
static int store_is(float v)
{
    for (int i = 0; i < sp_graph_num_params(g); i++)
        for (int w = 0; w < 4; w++)
            for (int64_t k = 0; k < sp_param_whole_numel(g, sp_graph_param(g, i)); k++)
                if (store[i][w][k] != v) return 0;
    return 1;
}

/* A file in the layout: every stored tensor of every parameter, values by formula, F32;
 * then extra tensors. */
#define MAXT 64
static struct {
    char name[128];
    sp_st_dtype dtype;
    int ndim;
    int64_t shape[4];
    unsigned char *data;
} ft[MAXT];
static int nft;

static void hf_tensors(void)
{
    for (int k = 0; k < nft; k++) free(ft[k].data);
    nft = 0;
    for (int i = 0; i < sp_graph_num_params(g); i++) {
        sp_tensor p = sp_graph_param(g, i);
        ckpt_piece pc[CKPT_MAX_PIECES];
        memset(pc, 0, sizeof pc);
        int n = ckpt_llama_layout(&cfg, g, p, pc);
        if (n == 0) { /* whole, under its name */
            snprintf(pc[0].name, sizeof pc[0].name, "%.95s", sp_tensor_name(g, p));
            pc[0].ndim = sp_tensor_ndim(g, p);
            memcpy(pc[0].shape, sp_param_full_shape(g, p), sizeof(int64_t) * (size_t)pc[0].ndim);
            n = 1;
        }
        for (int q = 0; q < n; q++, nft++) {
            REQUIRE(nft < MAXT, "too many tensors");
            snprintf(ft[nft].name, sizeof ft[nft].name, "%.95s", pc[q].name);
            ft[nft].dtype = SP_ST_F32;
            ft[nft].ndim = pc[q].ndim;
            int64_t numel = 1;
            for (int d = 0; d < pc[q].ndim; d++) numel *= ft[nft].shape[d] = pc[q].shape[d];
            float *v = malloc(4 * (size_t)numel);
            for (int64_t e = 0; e < numel; e++) v[e] = 0.01f * (float)((e * 7 + nft * 13) % 97 - 48);
            ft[nft].data = (unsigned char *)v;
        }
    }
}

static int find_t(const char *name)
{
    for (int k = 0; k < nft; k++)
        if (!strcmp(ft[k].name, name)) return k;
    REQUIRE(0, "no tensor %s in the test's file", name);
    return -1;
}

static uint16_t bf16_of(float f) /* round to nearest even */
{
    uint32_t b;
    memcpy(&b, &f, 4);
    return (uint16_t)((b + 0x7FFFu + ((b >> 16) & 1u)) >> 16);
}

/* inv_freq as transformers computes it, in float32: 1 / base^(arange(0, dim, 2) / dim) */
static void add_inv_freq(int layer, float theta, int bf16)
{
    REQUIRE(nft < MAXT, "too many tensors");
    const int dim = cfg.channels / cfg.heads, n = dim / 2;
    snprintf(ft[nft].name, sizeof ft[nft].name, "model.layers.%d.self_attn.rotary_emb.inv_freq",
             layer);
    ft[nft].dtype = bf16 ? SP_ST_BF16 : SP_ST_F32;
    ft[nft].ndim = 1;
    ft[nft].shape[0] = n;
    ft[nft].data = malloc(4 * (size_t)n);
    for (int i = 0; i < n; i++) {
        float v = 1.0f / powf(theta, (float)(2 * i) / (float)dim);
        if (bf16) {
            uint16_t h = bf16_of(v);
            memcpy(ft[nft].data + 2 * i, &h, 2);
        } else {
            memcpy(ft[nft].data + 4 * i, &v, 4);
        }
    }
    nft++;
}

static void write_file(const char *path)
{
    sp_st_tensor t[MAXT];
    for (int k = 0; k < nft; k++)
        t[k] = (sp_st_tensor){ ft[k].name, ft[k].dtype, ft[k].ndim, ft[k].shape, ft[k].data };
    REQUIRE(sp_safetensors_write(path, t, nft, NULL, 0, 0) == SP_OK, "write %s: %s", path,
            sp_last_error());
}

static void poke_f32(const char *name, int64_t k, uint32_t bits)
{
    memcpy(ft[find_t(name)].data + 4 * k, &bits, 4);
}

/* refused with code, a message holding every string of want (NULL-terminated), and
 * nothing set */
static void refused(const char *what, sp_status st, const char *const *want)
{
    int ok = st == SP_ERR_FORMAT && nsets == 0 && store_is(-7.0f);
    for (const char *const *w = want; ok && *w; w++) ok = strstr(sp_last_error(), *w) != NULL;
    if (getenv("CK_VERBOSE")) printf("  %s\n", sp_last_error());
    CHECK(ok, "%s: %s, %d sets, '%s'", what, sp_status_name(st), nsets, sp_last_error());
}

static void init_nonfinite(void)
{
    /* NaN in one tensor of the layout's own (down_proj), +Inf in a piece of a fused one
     * (q_proj, of qkv_proj), -Inf in the last element of the head */
    struct { const char *name; int64_t k; uint32_t bits; const char *word; } c[] = {
        { "model.layers.1.mlp.down_proj.weight", 5, 0x7FC00000u, "NaN" },
        { "model.layers.0.self_attn.q_proj.weight", 17, 0x7F800000u, "+Inf" },
        { "lm_head.weight", 16 * 16 - 1, 0xFF800000u, "-Inf" },
    };
    for (size_t i = 0; i < sizeof c / sizeof *c; i++) {
        hf_tensors();
        poke_f32(c[i].name, c[i].k, c[i].bits);
        write_file(ck_at("bad.safetensors"));
        mark_store(-7.0f);
        char elem[64];
        snprintf(elem, sizeof elem, "%s at element %lld", c[i].word, (long long)c[i].k);
        const char *want[] = { "bad.safetensors", c[i].name, elem, NULL };
        refused(c[i].word, ckpt_load_values(ck_at("bad.safetensors"), g, &io), want);
    }
    /* a BF16 file with a NaN (its exponent all ones, a payload) */
    hf_tensors();
    int k = find_t("model.norm.weight");
    uint16_t *h = malloc(2 * 16);
    for (int e = 0; e < 16; e++) h[e] = bf16_of(1.0f);
    h[3] = 0x7F81;
    free(ft[k].data);
    ft[k].data = (unsigned char *)h;
    ft[k].dtype = SP_ST_BF16;
    write_file(ck_at("bad_bf16.safetensors"));
    mark_store(-7.0f);
    const char *want[] = { "bad_bf16.safetensors", "'model.norm.weight'", "NaN at element 3", NULL };
    refused("bf16 NaN", ckpt_load_values(ck_at("bad_bf16.safetensors"), g, &io), want);
}

/* the store after loading path, copied into out (the values of every parameter) */
static size_t load_values(const char *path, float *out, size_t cap)
{
    mark_store(-7.0f);
    sp_status st = ckpt_load_values(path, g, &io);
    CHECK(st == SP_OK && nsets == sp_graph_num_params(g), "%s: %s, %d sets: %s", path,
          sp_status_name(st), nsets, sp_last_error());
    size_t n = 0;
    for (int i = 0; i < sp_graph_num_params(g); i++) {
        int64_t m = sp_param_whole_numel(g, sp_graph_param(g, i));
        REQUIRE(n + (size_t)m <= cap, "store too big");
        memcpy(out + n, store[i][0], 4 * (size_t)m);
        n += (size_t)m;
    }
    return n;
}

static void init_inv_freq(void)
{
    static float plain[1 << 16], with[1 << 16];
    hf_tensors();
    write_file(ck_at("plain.safetensors"));
    size_t n = load_values(ck_at("plain.safetensors"), plain, 1 << 16);
    CHECK(n > 0 && plain[0] != -7.0f, "nothing loaded");
    /* the run's theta, 10000 by default and 500000 given, in F32 and in BF16 */
    const float thetas[2] = { 0, 500000 };
    for (int t = 0; t < 2; t++)
        for (int bf = 0; bf < 2; bf++) {
            cfg.rope_theta = thetas[t];
            hf_tensors();
            for (int l = 0; l < cfg.layers; l++) add_inv_freq(l, t ? thetas[t] : 10000.0f, bf);
            write_file(ck_at("with.safetensors"));
            size_t m = load_values(ck_at("with.safetensors"), with, 1 << 16);
            CHECK(m == n && !memcmp(plain, with, 4 * n), "theta %g%s: other values with the "
                  "inv_freq buffers", thetas[t], bf ? " (BF16)" : "");
        }
    /* a file of theta 500000 for a run of 10000 (default or given), and the reverse */
    const float file_theta[3] = { 500000, 500000, 10000 }, run_theta[3] = { 0, 10000, 500000 };
    const char *const implied[3] = { "theta 500000", "theta 500000", "theta 10000" };
    const char *const run[3] = { "--rope-theta 10000", "--rope-theta 10000",
                                 "--rope-theta 500000" };
    for (int c = 0; c < 3; c++) {
        cfg.rope_theta = run_theta[c];
        hf_tensors();
        for (int l = 0; l < cfg.layers; l++) add_inv_freq(l, file_theta[c], 0);
        write_file(ck_at("theta.safetensors"));
        mark_store(-7.0f);
        const char *want[] = { "theta.safetensors", "'model.layers.0.self_attn.rotary_emb.inv_freq'",
                               implied[c], run[c], NULL };
        refused("theta", ckpt_load_values(ck_at("theta.safetensors"), g, &io), want);
    }
    cfg.rope_theta = 0;
    /* a layer the model does not have: an unknown tensor, as before */
    hf_tensors();
    for (int l = 0; l < cfg.layers + 1; l++) add_inv_freq(l, 10000, 0);
    write_file(ck_at("layer.safetensors"));
    mark_store(-7.0f);
    const char *want[] = { "'model.layers.2.self_attn.rotary_emb.inv_freq' is not a parameter",
                           NULL };
    refused("layer 2", ckpt_load_values(ck_at("layer.safetensors"), g, &io), want);
    /* one of another head size */
    hf_tensors();
    add_inv_freq(0, 10000, 0);
    ft[nft - 1].shape[0] = 2;
    write_file(ck_at("shape.safetensors"));
    mark_store(-7.0f);
    const char *want2[] = { "'model.layers.0.self_attn.rotary_emb.inv_freq' is F32 (2)", NULL };
    refused("shape", ckpt_load_values(ck_at("shape.safetensors"), g, &io), want2);
}

/* --load: a starpipe checkpoint with a NaN or an infinity in a value or a moment */
static void load_nonfinite(void)
{
    const char *sig = "llama test";
    mark_store(0.5f);
    REQUIRE(ckpt_save(ck_at("ok.st"), g, sig, NULL, 3, &io) == SP_OK, "save: %s", sp_last_error());
    int steps = -1;
    mark_store(-7.0f);
    CHECK(ckpt_load(ck_at("ok.st"), g, sig, &steps, &io) == SP_OK && steps == 3 &&
              nsets == 3 * sp_graph_num_params(g) && store[0][3][0] == 0.5f,
          "a clean checkpoint: %s", sp_last_error());
    const char *names[3] = { "model.embed_tokens.weight", "model.layers.0.mlp.up_proj.weight.adam_m",
                             "model.layers.1.self_attn.v_proj.weight.adam_v" };
    const uint32_t bits[3] = { 0x7FC00001u, 0x7F800000u, 0xFFC00000u };
    const char *words[3] = { "NaN at element 2", "+Inf at element 2", "NaN at element 2" };
    for (int c = 0; c < 3; c++) {
        sp_safetensors *f = sp_safetensors_open(ck_at("ok.st"), 0, NULL);
        REQUIRE(f, "open: %s", sp_last_error());
        int n = sp_safetensors_count(f), nm = sp_safetensors_meta_count(f);
        sp_st_tensor *t = calloc((size_t)n, sizeof *t);
        unsigned char **data = calloc((size_t)n, sizeof *data);
        sp_st_meta *meta = calloc((size_t)nm, sizeof *meta);
        int found = 0, m = 0;
        for (int k = 0; k < n; k++) {
            t[k] = *sp_safetensors_at(f, k);
            data[k] = malloc(sp_st_nbytes(&t[k]) + 1);
            memcpy(data[k], t[k].data, sp_st_nbytes(&t[k]));
            if (!strcmp(t[k].name, names[c])) memcpy(data[k] + 8, &bits[c], 4), found = 1;
            t[k].data = data[k];
        }
        for (int k = 0; k < nm; k++)
            if (strncmp(sp_safetensors_meta_at(f, k)->key, "starpipe.", 9) ||
                !strstr(sp_safetensors_meta_at(f, k)->key, "crc32"))
                meta[m++] = *sp_safetensors_meta_at(f, k);
        REQUIRE(found, "no tensor %s in the checkpoint", names[c]);
        REQUIRE(sp_safetensors_write(ck_at("bad.st"), t, n, meta, m, SP_ST_CHECKSUM) == SP_OK,
                "write: %s", sp_last_error());
        for (int k = 0; k < n; k++) free(data[k]);
        free(data), free(t), free(meta);
        sp_safetensors_close(f);
        mark_store(-7.0f);
        const char *want[] = { "bad.st", names[c], words[c], NULL };
        refused(names[c], ckpt_load(ck_at("bad.st"), g, sig, &steps, &io), want);
    }
}

int main(void)
{
    ck_tmpdir("init");
    sp_status st;
    g = sp_model_llama(&cfg, &st);
    REQUIRE(g, "sp_model_llama: %s", sp_last_error());
    REQUIRE(sp_graph_num_params(g) <= 64, "too many parameters");
    for (int i = 0; i < sp_graph_num_params(g); i++)
        for (int w = 0; w < 4; w++)
            store[i][w] = malloc(4 * (size_t)sp_param_whole_numel(g, sp_graph_param(g, i)));
    init_nonfinite();
    init_inv_freq();
    load_nonfinite();
    return ck_summary("test_init");
}
