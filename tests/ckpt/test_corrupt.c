/* Corruption: every byte of the length field and the header flipped with several masks,
 * and every byte of the data section flipped, is refused (SP_ERR_FORMAT) when the file
 * carries the starpipe.crc32 checksums; data flips say "checksum mismatch". Without the
 * checksums a data flip goes unseen, which shows the checks above are not vacuous. */
#include "ck.h"
#include "fixture.h"

int main(void)
{
    const char *dir = ck_tmpdir("corrupt");
    char src[600], bad[600];
    snprintf(src, sizeof src, "%s/ckpt.safetensors", dir);
    snprintf(bad, sizeof bad, "%s/flipped.safetensors", dir);
    sp_st_tensor t[FX_N];
    fx_make(t);
    REQUIRE(sp_safetensors_write(src, t, FX_N, fx_meta, FX_NMETA, SP_ST_CHECKSUM) == SP_OK, "%s",
            sp_last_error());
    size_t n;
    unsigned char *b = ck_read(src, &n);
    uint64_t hl = 0;
    for (int k = 7; k >= 0; k--) hl = hl << 8 | b[k];
    size_t data_at = 8 + (size_t)hl;

    static const unsigned char masks[] = {0x01, 0x02, 0x20, 0x80, 0xff};
    int tried = 0, refused = 0, as_checksum = 0;
    for (size_t pos = 0; pos < data_at; pos++)
        for (size_t m = 0; m < sizeof masks; m++) {
            b[pos] ^= masks[m];
            ck_write(bad, b, n);
            b[pos] ^= masks[m];
            tried++;
            if (CHECK_REFUSED(bad, SP_ERR_FORMAT, NULL)) refused++;
            as_checksum += strstr(sp_last_error(), "checksum") != NULL;
        }
    printf("header: %d of %d flips refused (%d by a checksum, the rest by the parser)\n",
           refused, tried, as_checksum);

    tried = refused = 0;
    for (size_t pos = data_at; pos < n; pos++)
        for (size_t m = 0; m < 2; m++) {
            unsigned char mask = m ? 0x80 : 0x01;
            b[pos] ^= mask;
            ck_write(bad, b, n);
            b[pos] ^= mask;
            tried++;
            refused += CHECK_REFUSED(bad, SP_ERR_FORMAT, "checksum mismatch in the data section");
        }
    printf("data: %d of %d flips refused\n", refused, tried);
    free(b);

    /* the same data flip in a file without checksums is (knowingly) not seen */
    REQUIRE(sp_safetensors_write(src, t, FX_N, fx_meta, FX_NMETA, 0) == SP_OK, "%s",
            sp_last_error());
    b = ck_read(src, &n);
    b[n - 1] ^= 0x01;
    ck_write(bad, b, n);
    sp_status st;
    sp_safetensors *f = sp_safetensors_open(bad, 0, &st);
    CHECK(f, "a data flip without checksums should read: %s", sp_last_error());
    sp_safetensors_close(f);
    free(b);
    fx_free(t);
    return ck_summary("ckpt.corrupt");
}
