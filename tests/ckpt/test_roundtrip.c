/* Round trip: the fixture (F32/F64/I32/I64/U8, a scalar, a zero-size tensor, odd names)
 * with metadata, written with and without checksums, reads back bitwise equal, in order,
 * aligned; lookups by index, name and key; bad writer arguments are refused with
 * SP_ERR_ARG and leave no file. */
#include <math.h>
#include <stdint.h>

#include "ck.h"
#include "fixture.h"

static void check_file(const char *path, const sp_st_tensor *want, int n, int nmeta, int checksum)
{
    sp_status st;
    sp_safetensors *f = sp_safetensors_open(path, checksum ? SP_ST_REQUIRE_CHECKSUM : 0, &st);
    REQUIRE(f, "open %s: %s %s", path, sp_status_name(st), sp_last_error());
    CHECK(sp_safetensors_count(f) == n, "count %d, want %d", sp_safetensors_count(f), n);
    for (int i = 0; i < n; i++) {
        const sp_st_tensor *a = sp_safetensors_at(f, i), *b = sp_safetensors_find(f, want[i].name);
        REQUIRE(a && b, "tensor %d '%s' missing", i, want[i].name);
        CHECK(a == b, "at(%d) and find('%s') differ: file order must be the written order", i,
              want[i].name);
        CHECK(!strcmp(a->name, want[i].name), "name '%s', want '%s'", a->name, want[i].name);
        CHECK(a->dtype == want[i].dtype, "'%s': dtype %d, want %d", a->name, a->dtype,
              want[i].dtype);
        CHECK(a->ndim == want[i].ndim, "'%s': ndim %d, want %d", a->name, a->ndim, want[i].ndim);
        for (int d = 0; d < a->ndim && d < want[i].ndim; d++)
            CHECK(a->shape[d] == want[i].shape[d], "'%s': dim %d", a->name, d);
        size_t nb = sp_st_nbytes(a);
        CHECK(nb == sp_st_nbytes(&want[i]), "'%s': %zu bytes", a->name, nb);
        CHECK(!nb || !memcmp(a->data, want[i].data, nb), "'%s': data differs", a->name);
        CHECK((uintptr_t)a->data % sp_st_dtype_size(a->dtype) == 0, "'%s': data misaligned",
              a->name);
    }
    CHECK(!sp_safetensors_at(f, -1) && !sp_safetensors_at(f, n), "at() out of range");
    CHECK(!sp_safetensors_find(f, "nope"), "find of a missing name");
    CHECK(sp_safetensors_meta_count(f) == nmeta + (checksum ? 2 : 0), "meta count %d",
          sp_safetensors_meta_count(f));
    for (int k = 0; k < nmeta; k++) {
        const char *v = sp_safetensors_meta(f, fx_meta[k].key);
        CHECK(v && !strcmp(v, fx_meta[k].value), "meta '%s' = '%s'", fx_meta[k].key, v ? v : "NULL");
        const sp_st_meta *m = sp_safetensors_meta_at(f, k);
        CHECK(m && !strcmp(m->key, fx_meta[k].key), "meta %d out of order", k);
    }
    CHECK(!sp_safetensors_meta(f, "nope"), "meta of a missing key");
    CHECK(!!sp_safetensors_meta(f, "starpipe.crc32") == checksum, "checksum entry");
    sp_safetensors_close(f);

    size_t sz;
    unsigned char *b = ck_read(path, &sz);
    uint64_t hl = 0;
    for (int k = 7; k >= 0; k--) hl = hl << 8 | b[k];
    CHECK((8 + hl) % 8 == 0, "data section starts at %llu, not 8-byte aligned",
          (unsigned long long)(8 + hl));
    CHECK(b[8 + hl - 1] == '}' || b[8 + hl - 1] == ' ', "header padding");
    free(b);
}

int main(void)
{
    const char *dir = ck_tmpdir("roundtrip");
    char path[600], p2[600], p3[600];
    snprintf(path, sizeof path, "%s/ckpt.safetensors", dir);
    sp_st_tensor t[FX_N];
    fx_make(t);
    /* values a text round trip would lose: NaN payloads, -0, inf, a denormal */
    float *wte = (float *)t[0].data;
    uint32_t nanbits = 0x7fc01234u, snan = 0xff800001u;
    memcpy(&wte[0], &nanbits, 4);
    memcpy(&wte[1], &snan, 4);
    wte[2] = -0.0f, wte[3] = INFINITY, wte[4] = -INFINITY, wte[5] = 1e-45f, wte[6] = 3.4e38f;

    REQUIRE(sp_safetensors_write(path, t, FX_N, fx_meta, FX_NMETA, SP_ST_CHECKSUM) == SP_OK,
            "write: %s", sp_last_error());
    check_file(path, t, FX_N, FX_NMETA, 1);
    snprintf(p2, sizeof p2, "%s/plain.safetensors", dir);
    REQUIRE(sp_safetensors_write(p2, t, FX_N, fx_meta, FX_NMETA, 0) == SP_OK, "write: %s",
            sp_last_error());
    check_file(p2, t, FX_N, FX_NMETA, 0);
    sp_status st;
    CHECK(!sp_safetensors_open(p2, SP_ST_REQUIRE_CHECKSUM, &st) && st == SP_ERR_FORMAT &&
              strstr(sp_last_error(), "no starpipe.crc32"),
          "REQUIRE_CHECKSUM on a file without one: %s", sp_last_error());

    /* nothing at all: "{}" and no data, with and without checksums */
    snprintf(p3, sizeof p3, "%s/none.safetensors", dir);
    REQUIRE(sp_safetensors_write(p3, NULL, 0, NULL, 0, 0) == SP_OK, "%s", sp_last_error());
    check_file(p3, NULL, 0, 0, 0);
    size_t sz;
    free(ck_read(p3, &sz));
    CHECK(sz == 16, "empty file is %zu bytes, want 16 ({} padded to 8)", sz);
    REQUIRE(sp_safetensors_write(p3, NULL, 0, NULL, 0, SP_ST_CHECKSUM) == SP_OK, "%s",
            sp_last_error());
    sp_safetensors *f = sp_safetensors_open(p3, SP_ST_REQUIRE_CHECKSUM, &st);
    CHECK(f && sp_safetensors_count(f) == 0, "empty with checksum: %s", sp_last_error());
    sp_safetensors_close(f);

    /* the CRC is the standard one */
    CHECK(sp_crc32(0, "123456789", 9) == 0xcbf43926u, "crc32 check value");

    /* bad arguments: SP_ERR_ARG, and nothing written */
    char bad[600];
    snprintf(bad, sizeof bad, "%s/bad.safetensors", dir);
    int64_t neg[1] = {-1};
    sp_st_tensor dup[2] = {t[0], t[0]};
    sp_st_tensor negt = {"neg", SP_ST_F32, 1, neg, t[0].data};
    sp_st_tensor nodata = {"nodata", SP_ST_F32, 2, t[0].shape, NULL};
    sp_st_tensor baddt = {"baddt", (sp_st_dtype)99, 0, NULL, t[0].data};
    sp_st_tensor meta_name = {"__metadata__", SP_ST_F32, 0, NULL, t[0].data};
    sp_st_tensor badutf = {"a\xff", SP_ST_F32, 0, NULL, t[0].data};
    int64_t ones[65];
    for (int d = 0; d < 65; d++) ones[d] = 1;
    sp_st_tensor dims65 = {"dims65", SP_ST_F32, 65, ones, t[0].data};
    sp_st_meta reserved = {"starpipe.crc32", "00000000"};
    sp_st_meta dupm[2] = {fx_meta[0], fx_meta[0]};
    struct { const sp_st_tensor *t; int n; const sp_st_meta *m; int nm; const char *want; } cases[] = {
        {dup, 2, NULL, 0, "duplicate tensor name 'wte'"},
        {&negt, 1, NULL, 0, "bad shape"},
        {&dims65, 1, NULL, 0, "65 dimensions"},
        {&nodata, 1, NULL, 0, "data is NULL"},
        {&baddt, 1, NULL, 0, "unknown dtype"},
        {&meta_name, 1, NULL, 0, "reserved"},
        {&badutf, 1, NULL, 0, "UTF-8"},
        {t, 1, &reserved, 1, "reserved"},
        {t, 1, dupm, 2, "duplicate metadata key 'step'"},
        {t, -1, NULL, 0, "bad arguments"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        st = sp_safetensors_write(bad, cases[c].t, cases[c].n, cases[c].m, cases[c].nm, 0);
        CHECK(st == SP_ERR_ARG && strstr(sp_last_error(), cases[c].want),
              "case %zu: %s \"%s\", want \"%s\"", c, sp_status_name(st), sp_last_error(),
              cases[c].want);
    }
    const char *keep[] = {"ckpt.safetensors", "plain.safetensors", "none.safetensors", NULL};
    CHECK(ck_stray_files(dir, keep) == 0, "files left behind");
    fx_free(t);
    return ck_summary("ckpt.roundtrip");
}
