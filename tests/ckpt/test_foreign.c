/* Foreign and hand-made files: each malformed one is refused with the right code and a
 * message that names the file and what is wrong; a few unusual but valid headers (\u
 * escapes, whitespace, no tensors, a foreign tensor order) are accepted. */
#include "ck.h"

static char dir_path[600];

static const char *at(const char *name)
{
    static char p[700];
    snprintf(p, sizeof p, "%s/%s", dir_path, name);
    return p;
}

/* A file with this header and nd data bytes (zeros). */
static const char *st(const char *json, size_t nd)
{
    static unsigned char zeros[512];
    ck_write_st(at("ckpt.safetensors"), json, zeros, nd);
    return at("ckpt.safetensors");
}

#define T(name, dt, shape, b, e) "\"" name "\":{\"dtype\":\"" dt "\",\"shape\":" shape ",\"data_offsets\":[" #b "," #e "]}"
#define A4 T("a", "F32", "[1]", 0, 4)

int main(void)
{
    snprintf(dir_path, sizeof dir_path, "%s", ck_tmpdir("foreign"));

    /* not safetensors at all */
    ck_write(at("empty"), "", 0);
    CHECK_REFUSED(at("empty"), SP_ERR_FORMAT, "empty file");
    const char *text = "Once upon a time there was a checkpoint that was really a text file.\n";
    ck_write(at("story.txt"), text, strlen(text));
    CHECK_REFUSED(at("story.txt"), SP_ERR_FORMAT, "story.txt: not a safetensors file");
    CHECK_REFUSED(at("story.txt"), SP_ERR_FORMAT, "\"Once upo\"");
    ck_write(at("hi.txt"), "hi\n", 3);
    CHECK_REFUSED(at("hi.txt"), SP_ERR_FORMAT, "truncated: 3 bytes");
    CHECK_REFUSED(at("missing"), SP_ERR_IO, "missing: cannot open");
    CHECK_REFUSED(dir_path, SP_ERR_IO, "not a regular file");
    unsigned char big[16] = {0x10, 0, 0, 0, 0, 0, 0, 0, '{', '}'};
    ck_write(at("short.safetensors"), big, 16);
    CHECK_REFUSED(at("short.safetensors"), SP_ERR_FORMAT,
                  "truncated: the header length is 16, so the file needs at least 24 bytes, but it is 16");

    /* the example of the brief, word for word */
    CHECK_REFUSED(st("{" T("wte", "F32", "[7,13]", 0, 100) "}", 100), SP_ERR_FORMAT,
                  "ckpt.safetensors: tensor 'wte': data_offsets [0,100) hold 100 bytes but shape "
                  "(7,13) F32 needs 364");

    struct { const char *json; size_t nd; const char *want; } bad[] = {
        {"{" T("a", "F17", "[1]", 0, 4) "}", 4, "tensor 'a': unknown dtype 'F17'"},
        {"{" T("a", "F32", "[2]", 0, 8) "," T("b", "F32", "[2]", 4, 12) "}", 12,
         "tensor 'b' data_offsets [4,12) overlap tensor 'a' [0,8)"},
        {"{" T("a", "F32", "[1]", 0, 4) "," T("b", "F32", "[1]", 8, 12) "}", 12,
         "hole in the data section: bytes [4,8) before tensor 'b'"},
        {"{" A4 "}", 8, "hole in the data section: its last 4 bytes belong to no tensor"},
        {"{" A4 "," A4 "}", 4, "duplicate object key near '\"a\"'"},
        {"{" A4 "}", 2, "truncated: the header describes 4 data bytes"},
        {"{" T("a", "F32", "[1]", 8, 4) "}", 4, "data_offsets [8,4) are reversed"},
        {"{" T("a", "F32", "[4611686018427387904,4]", 0, 4) "}", 4, "overflows"},
        {"{" A4 "}x", 4, "'x' after the end of the header object"},
        {"{" A4 "}\n", 4, "byte 0x0a after the end"},
        {"[" A4 "]", 4, "not a safetensors file: the header does not start with '{'"},
        {" {" A4 "}", 4, "does not start with '{'"},
        {"", 0, "does not start with '{'"},
        {"{" A4, 4, "'}' expected near end of file"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4, "negative number"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1.0],\"data_offsets\":[0,4]}}", 4, "fraction"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[01],\"data_offsets\":[0,4]}}", 4, "invalid token near '0'"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[true],\"data_offsets\":[0,4]}}", 4,
         "tensor 'a': shape holds true, not a non-negative integer"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[99999999999999999999],\"data_offsets\":[0,4]}}", 4,
         "too big integer"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":null,\"data_offsets\":[0,4]}}", 4,
         "shape must be an array of non-negative integers"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[[1]],\"data_offsets\":[0,4]}}", 4,
         "nested deeper than a safetensors header"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4,8]}}", 4,
         "data_offsets has 3 entries, not 2"},
        {"{\"a\":{\"dtype\":\"F32\",\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
         "duplicate object key near '\"dtype\"'"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],\"x\":[]}}", 4,
         "tensor 'a': unknown field 'x'"},
        {"{\"a\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", 4, "tensor 'a': missing field 'shape'"},
        {"{\"a\":{}}", 0, "tensor 'a' is an empty object"},
        {"{\"a\":[]}", 0, "tensor 'a' must be an object"},
        {"{\"a\\q\":{}}", 0, "invalid escape near '\"a\\q'"},
        {"{\"a\\ud800\":{}}", 0, "invalid Unicode '\\uD800'"},
        {"{\"a\\udc00\":{}}", 0, "invalid Unicode '\\uDC00'"},
        {"{\"a\\u00\":{}}", 0, "invalid escape"},
        {"{\"a\\u0000\":{}}", 0, "NUL byte in object key not supported"},
        {"{\"a\xff\":{}}", 0, "unable to decode byte 0xff"},
        {"{\"a\xc0\xaf\":{}}", 0, "unable to decode byte 0xc0"},     /* overlong '/' */
        {"{\"a\xed\xa0\x80\":{}}", 0, "unable to decode byte 0xed"}, /* an encoded surrogate */
        {"{\"a\nb\":{}}", 0, "unexpected newline"},
        {"{\"a\":{}", 0, "'}' expected near end of file"},
        {"{\"abc", 0, "premature end of input"},
        {"{\"__metadata__\":{\"k\":1}," A4 "}", 4, "__metadata__ value of 'k' must be a string"},
        {"{\"__metadata__\":{\"k\":{}}}", 0, "__metadata__ value of 'k' must be a string"},
        {"{\"__metadata__\":{\"k\":\"1\",\"k\":\"2\"}}", 0, "duplicate object key near '\"k\"'"},
        {"{\"__metadata__\":{},\"__metadata__\":{}}", 0, "duplicate object key near '\"__metadata__\"'"},
        {"{\"__metadata__\":[]}", 0, "__metadata__ must be an object, found an array"},
        {"{\"__metadata__\":{\"starpipe.crc32\":\"00000000\"}}", 0,
         "checksum entries incomplete: 'starpipe.crc32' without 'starpipe.header_crc32'"},
        {"{\"__metadata__\":{\"starpipe.crc32\":\"0000000\",\"starpipe.header_crc32\":\"x\"}}", 0,
         "malformed starpipe.header_crc32 value 'x'"},
        {"{\"__metadata__\":{\"starpipe.crc32\":\"00000000\",\"starpipe.header_crc32\":\"00000000\"}}",
         0, "checksum mismatch in the header"},
        {"{\"a\":{\"dtype\":\"F4\",\"shape\":[2],\"data_offsets\":[0,1]}}", 1, "unknown dtype 'F4'"},
        /* what jansson accepts and the format does not: checked in formats/safetensors.c */
        {"{" T("a", "F32", "[-0]", 0, 0) "}", 0, "byte 37 of the file: negative number"},
        {"{" T("a", "F32", "[1e0]", 0, 4) "}", 4, "shape holds a number with a fraction"},
        {"{" T("a", "F32", "[{}]", 0, 4) "}", 4, "byte 37 of the file: nested deeper"},
        {"{\"a\":{\"dtype\":32,\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
         "tensor 'a': dtype must be a string, found an integer"},
        {"{" T("a", "F32", "[1]", 0, 9223372036854775808) "}", 4, "too big integer"},
        {"{" T("", "F32", "[1]", 0, 4) "}", 4, "a tensor with an empty name"},
        {"{\"__metadata__\":{\"k\":\"a\\u0000b\"}}", 0, "\\u0000 is not allowed"},
        {"{\"__metadata__\":{\"k\":\"\\ud83d\"}}", 0, "invalid Unicode '\\uD83D'"},
        {"{\"__metadata__\":{\"starpipe.crc32\":\"00000000\",\"starpipe.header\\u005fcrc32\":"
         "\"00000000\"}}", 0, "malformed starpipe.header_crc32 value '00000000'"},
        {"{" A4 "} \t", 4, "byte 0x09 after the end of the header object"},
    };
    for (size_t c = 0; c < sizeof bad / sizeof bad[0]; c++)
        if (!CHECK_REFUSED(st(bad[c].json, bad[c].nd), SP_ERR_FORMAT, bad[c].want))
            fprintf(stderr, "  (case %zu: %s)\n", c, bad[c].json);

    /* a NUL byte after the header object; a shape of 65 dimensions */
    {
        char h[600] = "{" A4 "} ";
        size_t n = strlen(h);
        h[n - 1] = '\0';
        unsigned char b[8 + 600 + 4] = {(unsigned char)n};
        memcpy(b + 8, h, n);
        ck_write(at("nul.safetensors"), b, 8 + n + 4);
        CHECK_REFUSED(at("nul.safetensors"), SP_ERR_FORMAT, "byte 0x00 after the end of the header object");
        strcpy(h, "{\"a\":{\"dtype\":\"U8\",\"data_offsets\":[0,1],\"shape\":[1");
        for (int d = 1; d < 65; d++) strcat(h, ",1");
        CHECK_REFUSED(st(strcat(h, "]}}"), 1), SP_ERR_FORMAT, "shape has 65 entries, more than 64");
    }

    /* REQUIRE_CHECKSUM */
    sp_status s;
    CHECK(!sp_safetensors_open(st("{" A4 "}", 4), SP_ST_REQUIRE_CHECKSUM, &s) &&
              s == SP_ERR_FORMAT && strstr(sp_last_error(), "no starpipe.crc32 checksum"),
          "REQUIRE_CHECKSUM: %s", sp_last_error());

    /* valid, if unusual */
    struct { const char *json; size_t nd; int count; const char *name; } good[] = {
        {"{}", 0, 0, NULL},
        {"{ \"__metadata__\" : { } }", 0, 0, NULL},
        {"{\n\t\"b\" : {\"shape\" : [ 1 ] ,\"data_offsets\":[4,8],\"dtype\":\"I32\"},\r\n" A4 "}  ", 8, 2,
         "b"},
        {"{\"a\\u00e9\\ud83d\\ude00\\n\\/\\\"\":{\"dtype\":\"BF16\",\"shape\":[0],\"data_offsets\":[0,0]}}", 0,
         1, "a\xc3\xa9\xf0\x9f\x98\x80\n/\""},
        {"{" T("z", "F16", "[]", 0, 0) "," T("y", "U8", "[0]", 0, 0) "}", 0, -1, NULL},
        {"{" T("e", "F64", "[0]", 4, 4) "," A4 "}", 4, 2, "e"},
    };
    /* shape [] with F16 needs 2 bytes: that one must fail, so good[4] is checked apart */
    for (size_t c = 0; c < sizeof good / sizeof good[0]; c++) {
        if (good[c].count < 0) {
            CHECK_REFUSED(st(good[c].json, good[c].nd), SP_ERR_FORMAT, "shape () F16 needs 2");
            continue;
        }
        sp_safetensors *f = sp_safetensors_open(st(good[c].json, good[c].nd), 0, &s);
        CHECK(f && sp_safetensors_count(f) == good[c].count, "good case %zu: %s", c, sp_last_error());
        if (f && good[c].name)
            CHECK(sp_safetensors_find(f, good[c].name), "good case %zu: name not found", c);
        sp_safetensors_close(f);
    }
    /* a tensor of a foreign writer at an odd offset still comes back aligned */
    {
        unsigned char d[9] = {7, 1, 0, 0, 0, 0, 0, 0, 0};
        ck_write_st(at("odd.safetensors"),
                    "{" T("u", "U8", "[1]", 0, 1) "," T("l", "I64", "[1]", 1, 9) "}", d, 9);
        sp_safetensors *f = sp_safetensors_open(at("odd.safetensors"), 0, &s);
        const sp_st_tensor *l = sp_safetensors_find(f, "l");
        CHECK(l && (uintptr_t)l->data % 8 == 0 && *(const int64_t *)l->data == 1,
              "misaligned I64: %s", sp_last_error());
        sp_safetensors_close(f);
    }
    /* the header checksum's entry is found in the raw bytes: a tensor of that name and a
     * metadata value that looks like the entry do not confuse the writer or the reader */
    {
        int64_t one = 1;
        float v = 2.5f;
        sp_st_tensor t = {"starpipe.header_crc32", SP_ST_F32, 1, &one, &v};
        sp_st_meta m = {"note", "\"starpipe.header_crc32\":\"12345678\""};
        CHECK(sp_safetensors_write(at("look.safetensors"), &t, 1, &m, 1, SP_ST_CHECKSUM) == SP_OK,
              "%s", sp_last_error());
        sp_safetensors *f = sp_safetensors_open(at("look.safetensors"), SP_ST_REQUIRE_CHECKSUM, &s);
        CHECK(f && sp_safetensors_find(f, "starpipe.header_crc32") &&
                  !strcmp(sp_safetensors_meta(f, "note"), m.value),
              "look-alike names: %s", sp_last_error());
        sp_safetensors_close(f);
    }
    return ck_summary("ckpt.foreign");
}
