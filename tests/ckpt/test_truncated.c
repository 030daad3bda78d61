/* A checkpoint cut at every length from 0 to its size - 1, with and without checksums,
 * is refused with SP_ERR_FORMAT and a message saying it is truncated (or empty), and
 * never crashes; meant to be clean under valgrind as well. */
#include "ck.h"
#include "fixture.h"

static void cut_everywhere(const char *dir, const char *src, const char *tag)
{
    size_t n;
    unsigned char *full = ck_read(src, &n);
    char cut[600];
    snprintf(cut, sizeof cut, "%s/cut_%s.safetensors", dir, tag);
    int refused = 0;
    for (size_t len = 0; len < n; len++) {
        ck_write(cut, full, len);
        refused += CHECK_REFUSED(cut, SP_ERR_FORMAT, len ? "truncated" : "empty file");
    }
    printf("%s: %d of %zu cut lengths refused as truncated\n", tag, refused, n);
    ck_write(cut, full, n); /* and the whole file still reads */
    sp_status st;
    sp_safetensors *f = sp_safetensors_open(cut, 0, &st);
    CHECK(f && sp_safetensors_count(f) == FX_N, "full copy: %s", sp_last_error());
    sp_safetensors_close(f);
    free(full);
}

int main(void)
{
    const char *dir = ck_tmpdir("truncated");
    char a[600], b[600];
    snprintf(a, sizeof a, "%s/sum.safetensors", dir);
    snprintf(b, sizeof b, "%s/plain.safetensors", dir);
    sp_st_tensor t[FX_N];
    fx_make(t);
    REQUIRE(sp_safetensors_write(a, t, FX_N, fx_meta, FX_NMETA, SP_ST_CHECKSUM) == SP_OK, "%s",
            sp_last_error());
    REQUIRE(sp_safetensors_write(b, t, FX_N, NULL, 0, 0) == SP_OK, "%s", sp_last_error());
    cut_everywhere(dir, a, "checksum");
    cut_everywhere(dir, b, "plain");
    fx_free(t);
    return ck_summary("ckpt.truncated");
}
