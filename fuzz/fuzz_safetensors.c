/* Fuzz target: the safetensors reader, sp_safetensors_open on a file holding the input,
 * then every accessor, and a write/read round trip of whatever it accepted.
 * Properties: no crash or sanitizer report; a refusal sets a status and a message; an
 * accepted file's tensors have the bytes their dtype and shape say (all read here, so
 * ASan sees any overrun), names are found by name; what was read writes back (with
 * fresh checksums) and reads again to the same tensors and metadata. */
#include "fuzz/fuzz_util.h"

#include <sys/stat.h>

#include "starpipe/safetensors.h"

#define CRC_KEYS(k) (!strcmp(k, "starpipe.crc32") || !strcmp(k, "starpipe.header_crc32"))

static const char *roundtrip_path(void)
{
    static char path[128];
    if (!path[0]) {
        const char *dir = access("/dev/shm", W_OK) ? "/tmp" : "/dev/shm"; /* fsync is free on tmpfs */
        snprintf(path, sizeof path, "%s/starpipe-fuzz-%d.safetensors", dir, (int)getpid());
    }
    return path;
}

static unsigned sink;

static void walk(const sp_safetensors *f)
{
    int nt = sp_safetensors_count(f), nm = sp_safetensors_meta_count(f);
    FZ_CHECK(nt >= 0 && nm >= 0, "negative counts");
    FZ_CHECK(!sp_safetensors_at(f, nt) && !sp_safetensors_at(f, -1), "at() out of range");
    FZ_CHECK(!sp_safetensors_meta_at(f, nm) && !sp_safetensors_meta_at(f, -1), "meta_at()");
    for (int i = 0; i < nt; i++) {
        const sp_st_tensor *t = sp_safetensors_at(f, i);
        FZ_CHECK(t && t->name && t->ndim >= 0 && (t->ndim == 0 || t->shape), "tensor %d", i);
        FZ_CHECK(sp_st_dtype_name(t->dtype), "tensor %d: dtype %d", i, t->dtype);
        FZ_CHECK(sp_safetensors_find(f, t->name) == t, "find('%s') is not at(%d)", t->name, i);
        size_t nb = sp_st_nbytes(t);
        FZ_CHECK(nb == 0 || t->data, "tensor %d: %zu bytes but no data", i, nb);
        FZ_CHECK(nb == 0 || (uintptr_t)t->data % sp_st_dtype_size(t->dtype) == 0,
                 "tensor %d misaligned", i);
        const unsigned char *d = t->data;
        for (size_t k = 0; k < nb; k++) sink += d[k];
    }
    for (int i = 0; i < nm; i++) {
        const sp_st_meta *m = sp_safetensors_meta_at(f, i);
        FZ_CHECK(m && m->key && m->value, "meta %d", i);
        FZ_CHECK(sp_safetensors_meta(f, m->key) == m->value, "meta('%s')", m->key);
        sink += (unsigned)strlen(m->value);
    }
}

static void roundtrip(const sp_safetensors *f)
{
    int nt = sp_safetensors_count(f), nm = sp_safetensors_meta_count(f), k = 0;
    sp_st_tensor *t = calloc((size_t)nt + 1, sizeof *t);
    sp_st_meta *m = calloc((size_t)nm + 1, sizeof *m);
    FZ_CHECK(t && m, "oom");
    for (int i = 0; i < nt; i++) t[i] = *sp_safetensors_at(f, i);
    for (int i = 0; i < nm; i++)
        if (!CRC_KEYS(sp_safetensors_meta_at(f, i)->key)) m[k++] = *sp_safetensors_meta_at(f, i);
    const char *path = roundtrip_path();
    sp_status st = sp_safetensors_write(path, t, nt, m, k, SP_ST_CHECKSUM);
    FZ_CHECK(st == SP_OK, "a file the reader accepts does not write back: %s", sp_last_error());
    sp_safetensors *g = sp_safetensors_open(path, SP_ST_REQUIRE_CHECKSUM, &st);
    FZ_CHECK(g, "the written file does not read: %s", sp_last_error());
    FZ_CHECK(sp_safetensors_count(g) == nt, "tensor count changed");
    for (int i = 0; i < nt; i++) {
        const sp_st_tensor *a = &t[i], *b = sp_safetensors_find(g, a->name);
        FZ_CHECK(b, "tensor '%s' lost", a->name);
        FZ_CHECK(a->dtype == b->dtype && a->ndim == b->ndim &&
                     (!a->ndim || !memcmp(a->shape, b->shape, (size_t)a->ndim * 8)),
                 "tensor '%s' changed type or shape", a->name);
        size_t nb = sp_st_nbytes(a);
        FZ_CHECK(!nb || !memcmp(a->data, b->data, nb), "tensor '%s' data changed", a->name);
    }
    for (int i = 0; i < k; i++) {
        const char *v = sp_safetensors_meta(g, m[i].key);
        FZ_CHECK(v && !strcmp(v, m[i].value), "metadata '%s' changed", m[i].key);
    }
    FZ_CHECK(sp_safetensors_meta_count(g) == k + 2, "metadata count changed");
    sp_safetensors_close(g);
    unlink(path);
    free(t);
    free(m);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n)
{
    if (n > 1 << 20) return 0;
    const char *path = fz_memfile("st", data, n);
    for (unsigned flags = 0; flags <= SP_ST_REQUIRE_CHECKSUM; flags++) {
        sp_status st = SP_OK;
        sp_safetensors *f = sp_safetensors_open(path, flags, &st);
        if (!f) {
            FZ_CHECK(st == SP_ERR_FORMAT || st == SP_ERR_NOMEM, "status %d: %s", st,
                     sp_last_error());
            FZ_CHECK(sp_last_error()[0], "refusal without a message");
            if (!flags) return 0; /* requiring checksums cannot accept more */
            continue;
        }
        FZ_CHECK(st == SP_OK, "a file but status %d", st);
        walk(f);
        if (!flags) roundtrip(f);
        sp_safetensors_close(f);
    }
    return 0;
}
