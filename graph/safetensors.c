/* Safetensors files (include/starpipe/safetensors.h): a strict parser for the header's
 * JSON subset, layout validation as the reference implementation does it, CRC-32
 * checksums, and the atomic writer (temporary file, fsync, rename, directory fsync). */
#include "starpipe/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <threads.h>
#include <unistd.h>

#include "starpipe/env.h"

#define CRC_DATA_KEY "starpipe.crc32"
#define CRC_HEADER_KEY "starpipe.header_crc32"
#define NAME_SHOWN 80 /* at most this many bytes of a name go into a message */

/* ---- dtypes ---- */

static const struct {
    const char *name;
    size_t size;
} dtypes[SP_ST_NDTYPES] = {
    [SP_ST_BOOL] = {"BOOL", 1}, [SP_ST_U8] = {"U8", 1},   [SP_ST_I8] = {"I8", 1},
    [SP_ST_F8_E5M2] = {"F8_E5M2", 1}, [SP_ST_F8_E4M3] = {"F8_E4M3", 1},
    [SP_ST_I16] = {"I16", 2},   [SP_ST_U16] = {"U16", 2}, [SP_ST_F16] = {"F16", 2},
    [SP_ST_BF16] = {"BF16", 2}, [SP_ST_I32] = {"I32", 4}, [SP_ST_U32] = {"U32", 4},
    [SP_ST_F32] = {"F32", 4},   [SP_ST_I64] = {"I64", 8}, [SP_ST_U64] = {"U64", 8},
    [SP_ST_F64] = {"F64", 8},
};

const char *sp_st_dtype_name(sp_st_dtype d)
{
    return (unsigned)d < SP_ST_NDTYPES ? dtypes[d].name : NULL;
}

size_t sp_st_dtype_size(sp_st_dtype d) { return (unsigned)d < SP_ST_NDTYPES ? dtypes[d].size : 0; }

/* Element count times dtype size, 0 on overflow or a bad argument (callers that must
 * tell a true 0 from an error use shape_bytes). */
static int shape_bytes(sp_st_dtype d, int ndim, const int64_t *shape, uint64_t *out)
{
    uint64_t b = sp_st_dtype_size(d);
    if (!b || ndim < 0 || (ndim > 0 && !shape)) return -1;
    for (int k = 0; k < ndim; k++) {
        if (shape[k] < 0) return -1;
        if (__builtin_mul_overflow(b, (uint64_t)shape[k], &b)) return -1;
    }
    if (b > SIZE_MAX) return -1;
    *out = b;
    return 0;
}

size_t sp_st_nbytes(const sp_st_tensor *t)
{
    uint64_t b;
    return t && shape_bytes(t->dtype, t->ndim, t->shape, &b) == 0 ? (size_t)b : 0;
}

/* ---- CRC-32, slicing by 8 (a few GB/s: checkpoints are large) ---- */

static uint32_t crc_table[8][256];
static once_flag crc_once = ONCE_FLAG_INIT;

static void crc_init(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        crc_table[0][i] = c;
    }
    for (int s = 1; s < 8; s++)
        for (int i = 0; i < 256; i++)
            crc_table[s][i] = (crc_table[s - 1][i] >> 8) ^ crc_table[0][crc_table[s - 1][i] & 0xff];
}

uint32_t sp_crc32(uint32_t crc, const void *buf, size_t n)
{
    call_once(&crc_once, crc_init);
    const unsigned char *p = buf;
    uint32_t (*t)[256] = crc_table;
    crc = ~crc;
    for (; n >= 8; n -= 8, p += 8) {
        uint32_t lo = crc ^ ((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                             (uint32_t)p[3] << 24);
        uint32_t hi = (uint32_t)p[4] | (uint32_t)p[5] << 8 | (uint32_t)p[6] << 16 |
                      (uint32_t)p[7] << 24;
        crc = t[7][lo & 0xff] ^ t[6][(lo >> 8) & 0xff] ^ t[5][(lo >> 16) & 0xff] ^ t[4][lo >> 24] ^
              t[3][hi & 0xff] ^ t[2][(hi >> 8) & 0xff] ^ t[1][(hi >> 16) & 0xff] ^ t[0][hi >> 24];
    }
    while (n--) crc = t[0][(crc ^ *p++) & 0xff] ^ (crc >> 8);
    return ~crc;
}

/* CRC of the 8 length bytes and the header, with the 8 digits at hex_at read as '0'. */
static uint32_t header_crc(const unsigned char len8[8], const unsigned char *h, size_t n,
                           size_t hex_at)
{
    uint32_t c = sp_crc32(0, len8, 8);
    c = sp_crc32(c, h, hex_at);
    c = sp_crc32(c, "00000000", 8);
    return sp_crc32(c, h + hex_at + 8, n - hex_at - 8);
}

static int parse_hex8(const char *s, uint32_t *out)
{
    uint32_t v = 0;
    for (int k = 0; k < 8; k++) {
        char c = s[k];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (d < 0) return -1;
        v = v << 4 | (uint32_t)d;
    }
    if (s[8]) return -1;
    *out = v;
    return 0;
}

/* ---- UTF-8 ---- */

static int utf8_valid(const char *s)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t n = strlen(s);
    while (n) {
        size_t l = sp_utf8_seq(p, n);
        if (!l) return 0;
        p += l, n -= l;
    }
    return 1;
}

/* ---- the header parser: exactly the safetensors subset of JSON ---- */

typedef struct {
    char *name;
    sp_st_dtype dtype;
    int ndim;
    int64_t *shape;
    uint64_t begin, end, nbytes;
    size_t order; /* position in the header, to keep sorts deterministic */
} ptensor;

typedef struct {
    const char *path;
    const unsigned char *s;
    size_t n, i;
    ptensor *t;
    size_t nt, cap_t;
    sp_st_meta *m;
    size_t nm, cap_m;
    int have_meta;
    size_t hdr_hex_at; /* offset of the header checksum's digits, or SIZE_MAX */
    sp_status err;     /* SP_ERR_FORMAT or SP_ERR_NOMEM once failed */
} parser;

static int fail(parser *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(parser *p, const char *fmt, ...)
{
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    p->err = sp_set_error(SP_ERR_FORMAT, "%s: header JSON, byte %zu of the file: %s", p->path,
                          8 + p->i, msg);
    return -1;
}

static int oom(parser *p)
{
    p->err = sp_set_error(SP_ERR_NOMEM, "%s: out of memory while reading the header", p->path);
    return -1;
}

static void skip_ws(parser *p)
{
    while (p->i < p->n && (p->s[p->i] == ' ' || p->s[p->i] == '\t' || p->s[p->i] == '\n' ||
                           p->s[p->i] == '\r'))
        p->i++;
}

static int peek(parser *p) { return p->i < p->n ? p->s[p->i] : -1; }

static const char *show(int c)
{
    static _Thread_local char b[16];
    if (c < 0) return "the end of the header";
    if (c >= 0x20 && c < 0x7f) snprintf(b, sizeof b, "'%c'", c);
    else snprintf(b, sizeof b, "byte 0x%02x", c);
    return b;
}

static int expect(parser *p, char c)
{
    skip_ws(p);
    if (peek(p) != c) return fail(p, "expected '%c', found %s", c, show(peek(p)));
    p->i++;
    return 0;
}

static int hexval(int c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static int read_u4(parser *p, unsigned *out)
{
    if (p->n - p->i < 4) return fail(p, "truncated \\u escape");
    unsigned v = 0;
    for (int k = 0; k < 4; k++) {
        int h = hexval(p->s[p->i + k]);
        if (h < 0) return fail(p, "bad \\u escape: %s is not a hex digit", show(p->s[p->i + k]));
        v = v << 4 | (unsigned)h;
    }
    p->i += 4;
    *out = v;
    return 0;
}

/* A string: decoded into a new NUL-terminated buffer; raw_at/raw_len give its content's
 * bytes in the header, for the header checksum. NUL characters are refused (names are C
 * strings). */
static int parse_string(parser *p, char **out, size_t *raw_at, size_t *raw_len)
{
    skip_ws(p);
    if (peek(p) != '"') return fail(p, "expected a string, found %s", show(peek(p)));
    size_t start = ++p->i;
    size_t end = start; /* the decoded string is never longer than its raw form */
    while (end < p->n && p->s[end] != '"') end += (p->s[end] == '\\' && end + 1 < p->n) ? 2 : 1;
    if (end >= p->n) return fail(p, "unterminated string");
    char *d = malloc(end - start + 1);
    if (!d) return oom(p);
    size_t k = 0;
    while (p->s[p->i] != '"') {
        unsigned char c = p->s[p->i];
        if (c < 0x20) {
            free(d);
            return fail(p, "control character 0x%02x in a string (must be escaped)", c);
        }
        if (c != '\\') {
            size_t l = sp_utf8_seq(p->s + p->i, p->n - p->i);
            if (!l) {
                free(d);
                return fail(p, "invalid UTF-8 in a string");
            }
            memcpy(d + k, p->s + p->i, l);
            k += l, p->i += l;
            continue;
        }
        p->i++;
        int e = p->s[p->i++];
        switch (e) {
        case '"': d[k++] = '"'; break;
        case '\\': d[k++] = '\\'; break;
        case '/': d[k++] = '/'; break;
        case 'b': d[k++] = '\b'; break;
        case 'f': d[k++] = '\f'; break;
        case 'n': d[k++] = '\n'; break;
        case 'r': d[k++] = '\r'; break;
        case 't': d[k++] = '\t'; break;
        case 'u': {
            unsigned u, u2;
            if (read_u4(p, &u)) goto bad;
            if (u >= 0xdc00 && u <= 0xdfff) {
                fail(p, "lone low surrogate \\u%04x", u);
                goto bad;
            }
            if (u >= 0xd800 && u <= 0xdbff) {
                if (p->n - p->i < 2 || p->s[p->i] != '\\' || p->s[p->i + 1] != 'u') {
                    fail(p, "high surrogate \\u%04x not followed by a low one", u);
                    goto bad;
                }
                p->i += 2;
                if (read_u4(p, &u2)) goto bad;
                if (u2 < 0xdc00 || u2 > 0xdfff) {
                    fail(p, "high surrogate \\u%04x followed by \\u%04x", u, u2);
                    goto bad;
                }
                u = 0x10000 + ((u - 0xd800) << 10) + (u2 - 0xdc00);
            }
            if (u == 0) {
                fail(p, "\\u0000 in a string");
                goto bad;
            }
            /* 6 raw bytes (or 12 for a pair) always cover the at most 4 encoded ones */
            if (u < 0x80) d[k++] = (char)u;
            else if (u < 0x800) {
                d[k++] = (char)(0xc0 | u >> 6);
                d[k++] = (char)(0x80 | (u & 0x3f));
            } else if (u < 0x10000) {
                d[k++] = (char)(0xe0 | u >> 12);
                d[k++] = (char)(0x80 | ((u >> 6) & 0x3f));
                d[k++] = (char)(0x80 | (u & 0x3f));
            } else {
                d[k++] = (char)(0xf0 | u >> 18);
                d[k++] = (char)(0x80 | ((u >> 12) & 0x3f));
                d[k++] = (char)(0x80 | ((u >> 6) & 0x3f));
                d[k++] = (char)(0x80 | (u & 0x3f));
            }
            break;
        }
        default:
            p->i--;
            fail(p, "unknown escape \\%s", show(e));
            goto bad;
        }
    }
    d[k] = '\0';
    if (raw_at) *raw_at = start;
    if (raw_len) *raw_len = p->i - start;
    p->i++;
    *out = d;
    return 0;
bad:
    free(d);
    return -1;
}

static int parse_uint(parser *p, uint64_t *out)
{
    skip_ws(p);
    int c = peek(p);
    if (c == '-') return fail(p, "negative number");
    if (c < '0' || c > '9') return fail(p, "expected a non-negative integer, found %s", show(c));
    uint64_t v = 0;
    size_t start = p->i;
    while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9') {
        if (p->i > start && p->s[start] == '0') return fail(p, "integer with a leading zero");
        if (__builtin_mul_overflow(v, 10, &v) ||
            __builtin_add_overflow(v, (uint64_t)(p->s[p->i] - '0'), &v))
            return fail(p, "integer too large");
        p->i++;
    }
    c = peek(p);
    if (c == '.' || c == 'e' || c == 'E') return fail(p, "expected an integer, found a fraction");
    *out = v;
    return 0;
}

static int parse_uint_array(parser *p, const char *what, uint64_t **out, size_t *n)
{
    skip_ws(p);
    if (peek(p) != '[')
        return fail(p, "%s must be an array of non-negative integers, found %s", what,
                    show(peek(p)));
    p->i++;
    uint64_t *a = NULL;
    size_t na = 0, cap = 0;
    skip_ws(p);
    if (peek(p) == ']') {
        p->i++;
        *out = NULL, *n = 0;
        return 0;
    }
    for (;;) {
        uint64_t v = 0;
        if (parse_uint(p, &v)) goto bad;
        if (na == cap) {
            cap = cap ? 2 * cap : 4;
            uint64_t *g = realloc(a, cap * sizeof *a);
            if (!g) {
                oom(p);
                goto bad;
            }
            a = g;
        }
        a[na++] = v;
        skip_ws(p);
        if (peek(p) == ']') break;
        if (peek(p) != ',') {
            fail(p, "expected ',' or ']' in %s, found %s", what, show(peek(p)));
            goto bad;
        }
        p->i++;
    }
    p->i++;
    *out = a, *n = na;
    return 0;
bad:
    free(a);
    return -1;
}

/* Shows a name in a message, cut to NAME_SHOWN bytes. */
#define NM(s) (int)(strlen(s) < NAME_SHOWN ? strlen(s) : NAME_SHOWN), (s)

static int parse_tensor(parser *p, char *name)
{
    if (p->nt == p->cap_t) {
        size_t cap = p->cap_t ? 2 * p->cap_t : 16;
        ptensor *g = realloc(p->t, cap * sizeof *g);
        if (!g) return free(name), oom(p);
        p->t = g, p->cap_t = cap;
    }
    ptensor *t = &p->t[p->nt++];
    memset(t, 0, sizeof *t);
    t->name = name;
    t->order = p->nt - 1;
    int have_dtype = 0, have_shape = 0, have_off = 0;
    skip_ws(p);
    if (peek(p) != '{')
        return fail(p, "tensor '%.*s' must be an object, found %s", NM(name), show(peek(p)));
    p->i++;
    skip_ws(p);
    if (peek(p) == '}') return fail(p, "tensor '%.*s' is an empty object", NM(name));
    for (;;) {
        char *key;
        if (parse_string(p, &key, NULL, NULL)) return -1;
        int rc = expect(p, ':');
        if (!rc && !strcmp(key, "dtype")) {
            char *dt;
            if (have_dtype++) rc = fail(p, "tensor '%.*s': duplicate field 'dtype'", NM(name));
            else if (!(rc = parse_string(p, &dt, NULL, NULL))) {
                int d = 0;
                while (d < SP_ST_NDTYPES && strcmp(dt, dtypes[d].name)) d++;
                if (d == SP_ST_NDTYPES)
                    rc = fail(p, "tensor '%.*s': unknown dtype '%.*s'", NM(name), NM(dt));
                t->dtype = (sp_st_dtype)d;
                free(dt);
            }
        } else if (!rc && !strcmp(key, "shape")) {
            uint64_t *s;
            size_t ns;
            if (have_shape++) rc = fail(p, "tensor '%.*s': duplicate field 'shape'", NM(name));
            else if (!(rc = parse_uint_array(p, "shape", &s, &ns))) {
                if (ns > 64) rc = fail(p, "tensor '%.*s': %zu dimensions", NM(name), ns);
                else if (ns && !(t->shape = malloc(ns * sizeof *t->shape))) rc = oom(p);
                for (size_t k = 0; !rc && k < ns; k++) {
                    if (s[k] > INT64_MAX)
                        rc = fail(p, "tensor '%.*s': dimension too large", NM(name));
                    else
                        t->shape[k] = (int64_t)s[k];
                }
                t->ndim = (int)ns;
                free(s);
            }
        } else if (!rc && !strcmp(key, "data_offsets")) {
            uint64_t *o;
            size_t no;
            if (have_off++)
                rc = fail(p, "tensor '%.*s': duplicate field 'data_offsets'", NM(name));
            else if (!(rc = parse_uint_array(p, "data_offsets", &o, &no))) {
                if (no != 2)
                    rc = fail(p, "tensor '%.*s': data_offsets has %zu entries, not 2", NM(name),
                              no);
                else
                    t->begin = o[0], t->end = o[1];
                free(o);
            }
        } else if (!rc) {
            rc = fail(p, "tensor '%.*s': unknown field '%.*s'", NM(name), NM(key));
        }
        free(key);
        if (rc) return -1;
        skip_ws(p);
        if (peek(p) == '}') break;
        if (peek(p) != ',')
            return fail(p, "expected ',' or '}' in tensor '%.*s', found %s", NM(name),
                        show(peek(p)));
        p->i++;
    }
    p->i++;
    if (!have_dtype || !have_shape || !have_off)
        return fail(p, "tensor '%.*s': missing field '%s'", NM(name),
                    !have_dtype ? "dtype" : !have_shape ? "shape" : "data_offsets");
    return 0;
}

static int parse_metadata(parser *p)
{
    if (p->have_meta++) return fail(p, "duplicate key '__metadata__'");
    if (expect(p, '{')) return -1;
    skip_ws(p);
    if (peek(p) == '}') return p->i++, 0;
    for (;;) {
        char *key, *val;
        size_t at, len;
        if (parse_string(p, &key, NULL, NULL)) return -1;
        if (expect(p, ':')) return free(key), -1;
        skip_ws(p);
        if (peek(p) != '"') {
            fail(p, "__metadata__ value of '%.*s' must be a string, found %s", NM(key),
                 show(peek(p)));
            return free(key), -1;
        }
        if (parse_string(p, &val, &at, &len)) return free(key), -1;
        if (p->nm == p->cap_m) {
            size_t cap = p->cap_m ? 2 * p->cap_m : 8;
            sp_st_meta *g = realloc(p->m, cap * sizeof *g);
            if (!g) return free(key), free(val), oom(p);
            p->m = g, p->cap_m = cap;
        }
        p->m[p->nm++] = (sp_st_meta){key, val};
        /* the header checksum is computed over raw bytes: its digits must be literal */
        if (!strcmp(key, CRC_HEADER_KEY)) p->hdr_hex_at = len == 8 ? at : SIZE_MAX - 1;
        skip_ws(p);
        if (peek(p) == '}') break;
        if (peek(p) != ',') return fail(p, "expected ',' or '}' in __metadata__, found %s", show(peek(p)));
        p->i++;
    }
    p->i++;
    return 0;
}

static int parse_header(parser *p)
{
    if (peek(p) != '{')
        return fail(p, "not a safetensors file: the header does not start with '{' (found %s)",
                    show(peek(p)));
    p->i++;
    skip_ws(p);
    if (peek(p) != '}') {
        for (;;) {
            char *key;
            if (parse_string(p, &key, NULL, NULL)) return -1;
            if (expect(p, ':')) return free(key), -1;
            int rc;
            if (!strcmp(key, "__metadata__")) {
                free(key);
                rc = parse_metadata(p);
            } else if (!*key) {
                free(key); /* the writer refuses these too: a file we read must write back */
                return fail(p, "a tensor with an empty name");
            } else
                rc = parse_tensor(p, key); /* takes key */
            if (rc) return -1;
            skip_ws(p);
            if (peek(p) == '}') break;
            if (peek(p) != ',') return fail(p, "expected ',' or '}', found %s", show(peek(p)));
            p->i++;
        }
    }
    p->i++;
    while (p->i < p->n && p->s[p->i] == ' ') p->i++;
    if (p->i < p->n) return fail(p, "%s after the end of the header object", show(peek(p)));
    return 0;
}

static void parser_free(parser *p)
{
    for (size_t k = 0; k < p->nt; k++) free(p->t[k].name), free(p->t[k].shape);
    for (size_t k = 0; k < p->nm; k++) free((char *)p->m[k].key), free((char *)p->m[k].value);
    free(p->t);
    free(p->m);
}

/* ---- the reader ---- */

struct sp_safetensors {
    sp_st_tensor *t;           /* by data offset */
    const sp_st_tensor **name; /* by name, for sp_safetensors_find */
    void **copy;               /* aligned copies of misaligned tensors, else NULL */
    size_t nt;
    sp_st_meta *m;             /* header order */
    const sp_st_meta **key;    /* by key */
    size_t nm;
    unsigned char *data;       /* the data section */
};

static int cmp_ptensor_name(const void *a, const void *b)
{
    return strcmp((*(ptensor *const *)a)->name, (*(ptensor *const *)b)->name);
}

static int cmp_ptensor_offset(const void *a, const void *b)
{
    const ptensor *x = *(ptensor *const *)a, *y = *(ptensor *const *)b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return x->order < y->order ? -1 : x->order > y->order;
}

static int cmp_tensor_name(const void *a, const void *b)
{
    return strcmp((*(const sp_st_tensor *const *)a)->name, (*(const sp_st_tensor *const *)b)->name);
}

static int cmp_meta_key(const void *a, const void *b)
{
    return strcmp((*(const sp_st_meta *const *)a)->key, (*(const sp_st_meta *const *)b)->key);
}

/* "(7,13)", "()" for a scalar; cut with "..." when long. */
static const char *fmt_shape(char *buf, size_t cap, const int64_t *shape, int ndim)
{
    size_t k = (size_t)snprintf(buf, cap, "(");
    for (int d = 0; d < ndim && k < cap; d++)
        k += (size_t)snprintf(buf + k, cap - k, "%s%" PRId64, d ? "," : "", shape[d]);
    if (k < cap) snprintf(buf + k, cap - k, ")");
    else if (cap > 4) strcpy(buf + cap - 4, "...");
    return buf;
}

/* 0 when all n bytes at off were read, 1 when the file ended first, -1 on an error. */
static int read_at(int fd, uint64_t off, void *buf, size_t n)
{
    unsigned char *b = buf;
    while (n) {
        size_t chunk = n < ((size_t)1 << 30) ? n : (size_t)1 << 30;
        ssize_t r = pread(fd, b, chunk, (off_t)off);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return -1;
        if (r == 0) return 1;
        b += r, off += (uint64_t)r, n -= (size_t)r;
    }
    return 0;
}

static const char *find_meta(const parser *p, const char *key)
{
    for (size_t k = 0; k < p->nm; k++)
        if (!strcmp(p->m[k].key, key)) return p->m[k].value;
    return NULL;
}

/* Everything after the JSON parse: names, checksums, sizes, layout. Returns the sorted
 * order (by offset) in *byoff. */
static sp_status validate(parser *p, const char *path, unsigned flags, const unsigned char len8[8],
                          const unsigned char *hdr, uint64_t hlen, uint64_t avail,
                          ptensor ***byoff)
{
    char sh[128];
    sp_status st = SP_OK;
    ptensor **v = malloc((p->nt ? p->nt : 1) * sizeof *v);
    const sp_st_meta **mv = malloc((p->nm ? p->nm : 1) * sizeof *mv);
    if (!v || !mv) {
        st = sp_set_error(SP_ERR_NOMEM, "%s: out of memory while checking the header", path);
        goto out;
    }
    for (size_t k = 0; k < p->nm; k++) mv[k] = &p->m[k];
    qsort(mv, p->nm, sizeof *mv, cmp_meta_key);
    for (size_t k = 1; k < p->nm; k++)
        if (!strcmp(mv[k]->key, mv[k - 1]->key)) {
            st = sp_set_error(SP_ERR_FORMAT, "%s: duplicate __metadata__ key '%.*s'", path,
                              NM(mv[k]->key));
            goto out;
        }
    for (size_t k = 0; k < p->nt; k++) v[k] = &p->t[k];
    qsort(v, p->nt, sizeof *v, cmp_ptensor_name);
    for (size_t k = 1; k < p->nt; k++)
        if (!strcmp(v[k]->name, v[k - 1]->name)) {
            st = sp_set_error(SP_ERR_FORMAT, "%s: duplicate tensor name '%.*s'", path,
                              NM(v[k]->name));
            goto out;
        }

    /* checksums first: a corrupt header is best reported as such */
    const char *dcrc = find_meta(p, CRC_DATA_KEY), *hcrc = find_meta(p, CRC_HEADER_KEY);
    uint32_t want;
    if (hcrc) {
        if (p->hdr_hex_at >= hlen || parse_hex8(hcrc, &want)) {
            st = sp_set_error(SP_ERR_FORMAT,
                              "%s: malformed %s value '%.*s' (8 lowercase hex digits expected)",
                              path, CRC_HEADER_KEY, NM(hcrc));
            goto out;
        }
        uint32_t got = header_crc(len8, hdr, hlen, p->hdr_hex_at);
        if (got != want) {
            st = sp_set_error(SP_ERR_FORMAT,
                              "%s: checksum mismatch in the header (%s says %08x, the header "
                              "hashes to %08x): the header is corrupt",
                              path, CRC_HEADER_KEY, want, got);
            goto out;
        }
    }
    if (!dcrc != !hcrc) {
        st = sp_set_error(SP_ERR_FORMAT, "%s: checksum entries incomplete: '%s' without '%s' "
                                         "(a corrupt header?)",
                          path, dcrc ? CRC_DATA_KEY : CRC_HEADER_KEY,
                          dcrc ? CRC_HEADER_KEY : CRC_DATA_KEY);
        goto out;
    }
    if (dcrc && parse_hex8(dcrc, &want)) {
        st = sp_set_error(SP_ERR_FORMAT,
                          "%s: malformed %s value '%.*s' (8 lowercase hex digits expected)", path,
                          CRC_DATA_KEY, NM(dcrc));
        goto out;
    }
    if ((flags & SP_ST_REQUIRE_CHECKSUM) && !dcrc) {
        st = sp_set_error(SP_ERR_FORMAT, "%s: no %s checksum, and SP_ST_REQUIRE_CHECKSUM was given",
                          path, CRC_DATA_KEY);
        goto out;
    }

    for (size_t k = 0; k < p->nt; k++) {
        ptensor *t = &p->t[k];
        fmt_shape(sh, sizeof sh, t->shape, t->ndim);
        if (shape_bytes(t->dtype, t->ndim, t->shape, &t->nbytes)) {
            st = sp_set_error(SP_ERR_FORMAT, "%s: tensor '%.*s': shape %s %s overflows", path,
                              NM(t->name), sh, dtypes[t->dtype].name);
            goto out;
        }
        if (t->end < t->begin) {
            st = sp_set_error(SP_ERR_FORMAT,
                              "%s: tensor '%.*s': data_offsets [%" PRIu64 ",%" PRIu64 ") are reversed",
                              path, NM(t->name), t->begin, t->end);
            goto out;
        }
        if (t->end - t->begin != t->nbytes) {
            st = sp_set_error(SP_ERR_FORMAT,
                              "%s: tensor '%.*s': data_offsets [%" PRIu64 ",%" PRIu64 ") hold %" PRIu64
                              " bytes but shape %s %s needs %" PRIu64,
                              path, NM(t->name), t->begin, t->end, t->end - t->begin, sh,
                              dtypes[t->dtype].name, t->nbytes);
            goto out;
        }
    }

    /* as the reference: sorted by offset, each tensor starts where the previous ended */
    for (size_t k = 0; k < p->nt; k++) v[k] = &p->t[k];
    qsort(v, p->nt, sizeof *v, cmp_ptensor_offset);
    uint64_t pos = 0;
    for (size_t k = 0; k < p->nt; k++) {
        const ptensor *t = v[k];
        if (t->begin > pos) {
            st = sp_set_error(SP_ERR_FORMAT,
                              "%s: hole in the data section: bytes [%" PRIu64 ",%" PRIu64
                              ") before tensor '%.*s' belong to no tensor",
                              path, pos, t->begin, NM(t->name));
            goto out;
        }
        if (t->begin < pos) {
            const ptensor *q = v[k - 1];
            st = sp_set_error(SP_ERR_FORMAT,
                              "%s: tensor '%.*s' data_offsets [%" PRIu64 ",%" PRIu64
                              ") overlap tensor '%.*s' [%" PRIu64 ",%" PRIu64 ")",
                              path, NM(t->name), t->begin, t->end, NM(q->name), q->begin, q->end);
            goto out;
        }
        pos = t->end;
    }
    if (pos > avail) {
        st = sp_set_error(SP_ERR_FORMAT,
                          "%s: truncated: the header describes %" PRIu64 " data bytes, so the file "
                          "should be %" PRIu64 " bytes, but it is %" PRIu64 " bytes",
                          path, pos, 8 + hlen + pos, 8 + hlen + avail);
        goto out;
    }
    if (pos < avail) {
        st = sp_set_error(SP_ERR_FORMAT,
                          "%s: hole in the data section: its last %" PRIu64 " bytes belong to no "
                          "tensor (tensors cover %" PRIu64 " of %" PRIu64 " bytes)",
                          path, avail - pos, pos, avail);
        goto out;
    }
out:
    free(mv);
    if (st) free(v), v = NULL;
    *byoff = v;
    return st;
}

void sp_safetensors_close(sp_safetensors *f)
{
    if (!f) return;
    for (size_t k = 0; k < f->nt; k++) {
        free((char *)f->t[k].name);
        free((int64_t *)f->t[k].shape);
        if (f->copy) free(f->copy[k]);
    }
    for (size_t k = 0; k < f->nm; k++) free((char *)f->m[k].key), free((char *)f->m[k].value);
    free(f->t);
    free(f->name);
    free(f->copy);
    free(f->m);
    free(f->key);
    free(f->data);
    free(f);
}

sp_safetensors *sp_safetensors_open(const char *path, unsigned flags, sp_status *status)
{
    sp_status st = SP_OK;
    sp_safetensors *f = NULL;
    unsigned char len8[8], *hdr = NULL, *data = NULL;
    ptensor **byoff = NULL;
    parser p = {.path = path, .hdr_hex_at = SIZE_MAX};
    int fd = -1, r;
    struct stat sb;

    if (!path || (flags & ~SP_ST_REQUIRE_CHECKSUM)) {
        st = sp_set_error(SP_ERR_ARG, "sp_safetensors_open: %s", path ? "unknown flags" : "no path");
        goto out;
    }
    /* O_NONBLOCK: a FIFO must not hang the open; it is refused below as not regular */
    if ((fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK)) < 0) {
        st = sp_set_error(SP_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
        goto out;
    }
    if (fstat(fd, &sb)) {
        st = sp_set_error(SP_ERR_IO, "%s: cannot stat: %s", path, strerror(errno));
        goto out;
    }
    if (!S_ISREG(sb.st_mode)) {
        st = sp_set_error(SP_ERR_IO, "%s: not a regular file (it is %s)", path,
                          sp_file_kind(sb.st_mode));
        goto out;
    }
    uint64_t size = (uint64_t)sb.st_size;
    if (size < 8) {
        st = sp_set_error(SP_ERR_FORMAT,
                          size ? "%s: truncated: %" PRIu64 " bytes, but a safetensors file "
                                 "starts with an 8-byte header length"
                               : "%s: empty file (%" PRIu64 " bytes), not a safetensors file",
                          path, size);
        goto out;
    }
    if ((r = read_at(fd, 0, len8, 8))) goto read_failed;
    uint64_t hlen = 0;
    for (int k = 7; k >= 0; k--) hlen = hlen << 8 | len8[k];
    if (hlen > SP_ST_MAX_HEADER) {
        char seen[9] = {0};
        int text = 1;
        for (int k = 0; k < 8; k++) {
            text &= len8[k] >= 0x20 && len8[k] < 0x7f;
            seen[k] = (char)len8[k];
        }
        st = sp_set_error(SP_ERR_FORMAT,
                          "%s: not a safetensors file: its first 8 bytes%s%s%s give a header "
                          "length of %" PRIu64 ", over the limit of %" PRIu64,
                          path, text ? " (\"" : "", text ? seen : "", text ? "\")" : "", hlen,
                          SP_ST_MAX_HEADER);
        goto out;
    }
    if (hlen > size - 8) {
        st = sp_set_error(SP_ERR_FORMAT,
                          "%s: truncated: the header length is %" PRIu64 ", so the file needs at "
                          "least %" PRIu64 " bytes, but it is %" PRIu64 " bytes",
                          path, hlen, 8 + hlen, size);
        goto out;
    }
    if (!(hdr = malloc(hlen ? hlen : 1))) {
        st = sp_set_error(SP_ERR_NOMEM, "%s: cannot allocate %" PRIu64 " header bytes", path, hlen);
        goto out;
    }
    if ((r = read_at(fd, 8, hdr, hlen))) goto read_failed;
    p.s = hdr, p.n = hlen;
    if (parse_header(&p)) {
        st = p.err;
        goto out;
    }
    uint64_t avail = size - 8 - hlen;
    if ((st = validate(&p, path, flags, len8, hdr, hlen, avail, &byoff))) goto out;
    if (avail > SIZE_MAX || !(data = malloc(avail ? avail : 1))) {
        st = sp_set_error(SP_ERR_NOMEM, "%s: cannot allocate %" PRIu64 " data bytes", path, avail);
        goto out;
    }
    if ((r = read_at(fd, 8 + hlen, data, avail))) goto read_failed;
    const char *dcrc = find_meta(&p, CRC_DATA_KEY);
    uint32_t want, got;
    if (dcrc && !parse_hex8(dcrc, &want) && (got = sp_crc32(0, data, avail)) != want) {
        st = sp_set_error(SP_ERR_FORMAT,
                          "%s: checksum mismatch in the data section (%s says %08x, the data "
                          "hashes to %08x): the data is corrupt",
                          path, CRC_DATA_KEY, want, got);
        goto out;
    }

    /* all checked: move what was parsed into the handle */
    if (!(f = calloc(1, sizeof *f)) || !(f->t = calloc(p.nt ? p.nt : 1, sizeof *f->t)) ||
        !(f->name = malloc((p.nt ? p.nt : 1) * sizeof *f->name)) ||
        !(f->copy = calloc(p.nt ? p.nt : 1, sizeof *f->copy)) ||
        !(f->key = malloc((p.nm ? p.nm : 1) * sizeof *f->key))) {
        st = sp_set_error(SP_ERR_NOMEM, "%s: out of memory", path);
        goto out;
    }
    for (size_t k = 0; k < p.nt; k++) {
        ptensor *t = byoff[k];
        const unsigned char *at = data + t->begin;
        size_t es = dtypes[t->dtype].size;
        if (t->begin % es) { /* only foreign files: our writer's offsets stay aligned */
            if (!(f->copy[k] = malloc(t->nbytes))) {
                st = sp_set_error(SP_ERR_NOMEM, "%s: out of memory", path);
                goto out;
            }
            memcpy(f->copy[k], at, t->nbytes);
            at = f->copy[k];
        }
        f->t[k] = (sp_st_tensor){t->name, t->dtype, t->ndim, t->shape, at};
        t->name = NULL, t->shape = NULL;
        f->nt = k + 1;
        f->name[k] = &f->t[k];
    }
    qsort(f->name, f->nt, sizeof *f->name, cmp_tensor_name);
    f->m = p.m, f->nm = p.nm;
    p.m = NULL, p.nm = 0;
    for (size_t k = 0; k < f->nm; k++) f->key[k] = &f->m[k];
    qsort(f->key, f->nm, sizeof *f->key, cmp_meta_key);
    f->data = data;
    data = NULL;
    goto out;

read_failed:
    st = r < 0 ? sp_set_error(SP_ERR_IO, "%s: read error: %s", path, strerror(errno))
               : sp_set_error(SP_ERR_FORMAT, "%s: truncated while reading (the file shrank?)", path);
out:
    if (st) sp_safetensors_close(f), f = NULL;
    if (fd >= 0) close(fd);
    parser_free(&p);
    free(byoff);
    free(hdr);
    free(data);
    if (status) *status = st;
    return f;
}

int sp_safetensors_count(const sp_safetensors *f) { return f ? (int)f->nt : 0; }

const sp_st_tensor *sp_safetensors_at(const sp_safetensors *f, int i)
{
    return f && i >= 0 && (size_t)i < f->nt ? &f->t[i] : NULL;
}

const sp_st_tensor *sp_safetensors_find(const sp_safetensors *f, const char *name)
{
    if (!f || !name) return NULL;
    sp_st_tensor k = {.name = name};
    const sp_st_tensor *kp = &k, **hit = bsearch(&kp, f->name, f->nt, sizeof *f->name, cmp_tensor_name);
    return hit ? *hit : NULL;
}

int sp_safetensors_meta_count(const sp_safetensors *f) { return f ? (int)f->nm : 0; }

const sp_st_meta *sp_safetensors_meta_at(const sp_safetensors *f, int i)
{
    return f && i >= 0 && (size_t)i < f->nm ? &f->m[i] : NULL;
}

const char *sp_safetensors_meta(const sp_safetensors *f, const char *key)
{
    if (!f || !key) return NULL;
    sp_st_meta k = {.key = key};
    const sp_st_meta *kp = &k, **hit = bsearch(&kp, f->key, f->nm, sizeof *f->key, cmp_meta_key);
    return hit ? (*hit)->value : NULL;
}

/* ---- the writer ---- */

typedef struct {
    char *p;
    size_t n, cap;
    int oom;
} sbuf;

static void sb_put(sbuf *b, const char *s, size_t n)
{
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1) cap *= 2;
        char *g = realloc(b->p, cap);
        if (!g) {
            b->oom = 1;
            return;
        }
        b->p = g, b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
}

static void sb_str(sbuf *b, const char *s) { sb_put(b, s, strlen(s)); }

static void sb_u64(sbuf *b, uint64_t v)
{
    char t[24];
    sb_put(b, t, (size_t)snprintf(t, sizeof t, "%" PRIu64, v));
}

/* A JSON string; s is valid UTF-8, only '"', '\\' and control characters need escapes. */
static void sb_json(sbuf *b, const char *s)
{
    sb_put(b, "\"", 1);
    for (const char *r = s; *r; r++) {
        unsigned char c = (unsigned char)*r;
        char e[8];
        if (c == '"' || c == '\\') {
            e[0] = '\\', e[1] = (char)c;
            sb_put(b, e, 2);
        } else if (c < 0x20) {
            const char *short_esc = c == '\n' ? "\\n" : c == '\t' ? "\\t" : c == '\r' ? "\\r" : NULL;
            if (short_esc) sb_str(b, short_esc);
            else sb_put(b, e, (size_t)snprintf(e, sizeof e, "\\u%04x", c));
        } else
            sb_put(b, r, 1);
    }
    sb_put(b, "\"", 1);
}

static int cmp_cstr(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* The first duplicate among n strings, or NULL (-1 when out of memory). */
static int find_dup(const char **s, size_t n, const char **dup)
{
    const char **v = malloc((n ? n : 1) * sizeof *v);
    if (!v) return -1;
    memcpy(v, s, n * sizeof *v);
    qsort(v, n, sizeof *v, cmp_cstr);
    *dup = NULL;
    for (size_t k = 1; k < n && !*dup; k++)
        if (!strcmp(v[k], v[k - 1])) *dup = v[k];
    free(v);
    return 0;
}

static sp_status check_args(const char *path, const sp_st_tensor *t, int n, const sp_st_meta *m,
                            int n_meta, unsigned flags)
{
    if (!path || !*path) return sp_set_error(SP_ERR_ARG, "sp_safetensors_write: no path");
    if (n < 0 || n_meta < 0 || (n && !t) || (n_meta && !m) || (flags & ~SP_ST_CHECKSUM))
        return sp_set_error(SP_ERR_ARG, "%s: bad arguments (n %d, n_meta %d, flags %#x)", path, n,
                            n_meta, flags);
    for (int k = 0; k < n; k++) {
        uint64_t nb;
        if (!t[k].name || !*t[k].name)
            return sp_set_error(SP_ERR_ARG, "%s: tensor %d has no name", path, k);
        if (!utf8_valid(t[k].name))
            return sp_set_error(SP_ERR_ARG, "%s: tensor %d: name is not valid UTF-8", path, k);
        if (!strcmp(t[k].name, "__metadata__"))
            return sp_set_error(SP_ERR_ARG, "%s: tensor name '__metadata__' is reserved", path);
        if (!sp_st_dtype_name(t[k].dtype))
            return sp_set_error(SP_ERR_ARG, "%s: tensor '%.*s': unknown dtype %d", path,
                                NM(t[k].name), (int)t[k].dtype);
        if (shape_bytes(t[k].dtype, t[k].ndim, t[k].shape, &nb))
            return sp_set_error(SP_ERR_ARG,
                                "%s: tensor '%.*s': bad shape (ndim %d: a negative dimension, "
                                "no shape array or a size overflow)",
                                path, NM(t[k].name), t[k].ndim);
        if (nb && !t[k].data)
            return sp_set_error(SP_ERR_ARG, "%s: tensor '%.*s': data is NULL", path, NM(t[k].name));
    }
    for (int k = 0; k < n_meta; k++) {
        if (!m[k].key || !m[k].value)
            return sp_set_error(SP_ERR_ARG, "%s: metadata entry %d has a NULL key or value", path, k);
        if (!utf8_valid(m[k].key) || !utf8_valid(m[k].value))
            return sp_set_error(SP_ERR_ARG, "%s: metadata entry %d is not valid UTF-8", path, k);
        if (!strcmp(m[k].key, CRC_DATA_KEY) || !strcmp(m[k].key, CRC_HEADER_KEY))
            return sp_set_error(SP_ERR_ARG, "%s: metadata key '%s' is reserved (use SP_ST_CHECKSUM)",
                                path, m[k].key);
    }
    const char **s = malloc(((size_t)n + (size_t)n_meta + 1) * sizeof *s), *dup = NULL;
    if (!s) return sp_set_error(SP_ERR_NOMEM, "%s: out of memory", path);
    for (int k = 0; k < n; k++) s[k] = t[k].name;
    for (int k = 0; k < n_meta; k++) s[n + k] = m[k].key;
    int rc = find_dup(s, (size_t)n, &dup);
    if (!rc && dup) {
        free(s);
        return sp_set_error(SP_ERR_ARG, "%s: duplicate tensor name '%.*s'", path, NM(dup));
    }
    if (!rc) rc = find_dup(s + n, (size_t)n_meta, &dup);
    free(s);
    if (rc) return sp_set_error(SP_ERR_NOMEM, "%s: out of memory", path);
    if (dup) return sp_set_error(SP_ERR_ARG, "%s: duplicate metadata key '%.*s'", path, NM(dup));
    return SP_OK;
}

/* The header JSON padded so that 8 + its length is a multiple of 8, and the 8 length
 * bytes; the header checksum filled in when asked for. */
static sp_status build_header(const char *path, const sp_st_tensor *t, int n, const sp_st_meta *m,
                              int n_meta, unsigned flags, sbuf *b, unsigned char len8[8])
{
    size_t hex_at = 0;
    sb_str(b, "{");
    if (n_meta || (flags & SP_ST_CHECKSUM)) {
        sb_str(b, "\"__metadata__\":{");
        for (int k = 0; k < n_meta; k++) {
            if (k) sb_str(b, ",");
            sb_json(b, m[k].key);
            sb_str(b, ":");
            sb_json(b, m[k].value);
        }
        if (flags & SP_ST_CHECKSUM) {
            uint32_t c = 0;
            char hex[16];
            for (int k = 0; k < n; k++) c = sp_crc32(c, t[k].data, sp_st_nbytes(&t[k]));
            snprintf(hex, sizeof hex, "%08x", c);
            sb_str(b, n_meta ? ",\"" CRC_DATA_KEY "\":\"" : "\"" CRC_DATA_KEY "\":\"");
            sb_str(b, hex);
            sb_str(b, "\",\"" CRC_HEADER_KEY "\":\"");
            hex_at = b->n;
            sb_str(b, "00000000\"");
        }
        sb_str(b, n ? "}," : "}");
    }
    uint64_t off = 0;
    for (int k = 0; k < n; k++) {
        uint64_t nb = sp_st_nbytes(&t[k]);
        if (k) sb_str(b, ",");
        sb_json(b, t[k].name);
        sb_str(b, ":{\"dtype\":\"");
        sb_str(b, dtypes[t[k].dtype].name);
        sb_str(b, "\",\"shape\":[");
        for (int d = 0; d < t[k].ndim; d++) {
            if (d) sb_str(b, ",");
            sb_u64(b, (uint64_t)t[k].shape[d]);
        }
        sb_str(b, "],\"data_offsets\":[");
        sb_u64(b, off);
        sb_str(b, ",");
        sb_u64(b, off + nb);
        sb_str(b, "]}");
        off += nb;
    }
    sb_str(b, "}");
    while ((8 + b->n) % 8) sb_str(b, " ");
    if (b->oom) return sp_set_error(SP_ERR_NOMEM, "%s: out of memory building the header", path);
    if (b->n > SP_ST_MAX_HEADER)
        return sp_set_error(SP_ERR_ARG, "%s: the header would be %zu bytes, over the limit of %" PRIu64,
                            path, b->n, SP_ST_MAX_HEADER);
    for (int k = 0; k < 8; k++) len8[k] = (unsigned char)((uint64_t)b->n >> (8 * k));
    if (flags & SP_ST_CHECKSUM) {
        char hex[16];
        snprintf(hex, sizeof hex, "%08x",
                 header_crc(len8, (const unsigned char *)b->p, b->n, hex_at));
        memcpy(b->p + hex_at, hex, 8);
    }
    return SP_OK;
}

/* Directory fsync, so the rename itself survives a crash. */
static int fsync_dir_of(const char *path)
{
    const char *slash = strrchr(path, '/');
    char *dir = slash ? strndup(path, slash == path ? 1 : (size_t)(slash - path)) : strdup(".");
    if (!dir) return errno = ENOMEM, -1;
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC), rc = -1;
    free(dir);
    if (fd < 0) return -1;
    rc = fsync(fd);
    if (rc && errno == EINVAL) rc = 0; /* file systems that cannot sync a directory */
    int e = errno;
    close(fd);
    errno = e;
    return rc;
}

sp_status sp_safetensors_write(const char *path, const sp_st_tensor *tensors, int n,
                               const sp_st_meta *meta, int n_meta, unsigned flags)
{
    sp_status st = check_args(path, tensors, n, meta, n_meta, flags);
    if (st) return st;
    sbuf b = {0};
    unsigned char len8[8];
    if ((st = build_header(path, tensors, n, meta, n_meta, flags, &b, len8))) {
        free(b.p);
        return st;
    }
    /* the file to replace: path, or the regular file a symbolic link at path names; a
     * directory, FIFO or device there is refused before anything is written */
    char *target = malloc(PATH_MAX);
    size_t tlen = PATH_MAX + 32;
    char *tmp = malloc(tlen);
    if (!tmp || !target) {
        free(b.p), free(tmp), free(target);
        return sp_set_error(SP_ERR_NOMEM, "%s: out of memory", path);
    }
    if ((st = sp_output_target(path, "output file", target, PATH_MAX))) {
        free(b.p), free(tmp), free(target);
        return st;
    }

    const char *step = "create";
    FILE *fp = NULL;
    int fd = sp_output_tmp_open(target, tmp, tlen);
    if (fd < 0) goto failed_nofile;
    if (!(fp = fdopen(fd, "wb"))) {
        int e = errno;
        close(fd);
        errno = e;
        goto failed;
    }
    step = "write";
    if (fwrite(len8, 1, 8, fp) != 8 || fwrite(b.p, 1, b.n, fp) != b.n) goto failed;
    for (int k = 0; k < n; k++) {
        size_t nb = sp_st_nbytes(&tensors[k]);
        if (nb && fwrite(tensors[k].data, 1, nb, fp) != nb) goto failed;
    }
    if (fflush(fp)) goto failed;
    step = "fsync";
    if (fsync(fileno(fp))) goto failed;
    step = "close";
    int rc = fclose(fp);
    fp = NULL;
    if (rc) goto failed;
    step = "rename";
    struct stat sb; /* something else put there meanwhile is never replaced */
    if (!lstat(target, &sb) && !S_ISREG(sb.st_mode)) {
        errno = S_ISDIR(sb.st_mode) ? EISDIR : EEXIST;
        goto failed;
    }
    if (rename(tmp, target)) goto failed;
    free(b.p);
    free(tmp);
    int synced = fsync_dir_of(target);
    free(target);
    if (synced)
        return sp_set_error(SP_ERR_IO, "%s: written, but the directory fsync failed: %s", path,
                            strerror(errno));
    return SP_OK;

failed:
    st = sp_set_error(SP_ERR_IO, "%s: cannot %s the temporary file '%s': %s", path, step, tmp,
                      strerror(errno ? errno : EIO));
    if (fp) fclose(fp);
    unlink(tmp);
    goto done;
failed_nofile:
    st = sp_set_error(SP_ERR_IO, "%s: cannot create the temporary file '%s': %s", path, tmp,
                      strerror(errno));
done:
    free(b.p);
    free(tmp);
    free(target);
    return st;
}
