/* Safetensors files (include/starpipe/safetensors.h): the header parsed by jansson and
 * held to the format's schema and to the checks jansson does not make, the layout
 * validated as the reference implementation does it, CRC-32 checksums by zlib, and the
 * atomic writer (temporary file, fsync, rename, directory fsync). */
#include "starpipe/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "base/files.h"

#define CRC_DATA_KEY "starpipe.crc32"
#define CRC_HEADER_KEY "starpipe.header_crc32"
#define NAME_SHOWN 80 /* at most this many bytes of a name go into a message */
#define MAX_DIMS 64   /* of a shape, in both directions */

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

/* ---- CRC-32: zlib's ---- */

uint32_t sp_crc32(uint32_t crc, const void *buf, size_t n)
{
    return n ? (uint32_t)crc32_z(crc, buf, n) : crc; /* zlib gives 0 for a NULL buf */
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

/* ---- the header: JSON by jansson, then the safetensors schema ---- */

typedef struct {
    const char *name; /* in the header's JSON tree */
    sp_st_dtype dtype;
    int ndim;
    int64_t *shape;
    uint64_t begin, end, nbytes;
    size_t order; /* position in the header, to keep sorts deterministic */
} ptensor;

typedef struct {
    const char *path;
    const unsigned char *s;
    size_t n;
    json_t *root;      /* the header */
    json_t *meta;      /* its __metadata__ object, or NULL */
    ptensor *t;
    size_t nt;
    sp_st_meta *m;     /* keys and values in the tree */
    size_t nm;
    size_t hdr_hex_at; /* offset of the header checksum's digits, or SIZE_MAX */
    sp_status err;     /* SP_ERR_FORMAT or SP_ERR_NOMEM once failed */
} parser;

#define NOWHERE SIZE_MAX /* a message about the header as a whole, not one byte of it */

static int fail(parser *p, size_t at, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(parser *p, size_t at, const char *fmt, ...)
{
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (at == NOWHERE) p->err = sp_set_error(SP_ERR_FORMAT, "%s: header JSON: %s", p->path, msg);
    else
        p->err = sp_set_error(SP_ERR_FORMAT, "%s: header JSON, byte %zu of the file: %s", p->path,
                              8 + at, msg);
    return -1;
}

static int oom(parser *p)
{
    p->err = sp_set_error(SP_ERR_NOMEM, "%s: out of memory while reading the header", p->path);
    return -1;
}

static const char *show(int c)
{
    static _Thread_local char b[16];
    if (c < 0) return "the end of the header";
    if (c >= 0x20 && c < 0x7f) snprintf(b, sizeof b, "'%c'", c);
    else snprintf(b, sizeof b, "byte 0x%02x", c);
    return b;
}

static const char *kind(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return json_integer_value(v) < 0 ? "a negative number" : "an integer";
    case JSON_REAL: return "a number with a fraction or an exponent";
    case JSON_TRUE: return "true";
    case JSON_FALSE: return "false";
    default: return "null";
    }
}

static int is_ws(unsigned char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

/* One pass over the raw bytes for what jansson does not check or cannot tell: nesting
 * deeper than a safetensors header has (the header, a tensor, its shape: 3 levels),
 * refused before jansson builds a tree of it (20 to 80 bytes of memory per byte of
 * input); a '-' outside strings, a negative number (-0 included, which jansson reads as
 * 0); and where the header checksum's digits are, which must be the 8 literal bytes of
 * its value (the checksum is over the raw header). Exact on valid JSON; on invalid JSON
 * it can only say another thing first, jansson refuses it anyway. */
static int scan_header(parser *p)
{
    static const char key[] = "\"" CRC_HEADER_KEY "\"";
    const unsigned char *s = p->s;
    size_t n = p->n;
    int depth = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] == '"') {
            size_t at = i++;
            while (i < n && s[i] != '"') i += s[i] == '\\' ? 2 : 1;
            if (i >= n) break;
            if (i + 1 - at != sizeof key - 1 || memcmp(s + at, key, sizeof key - 1)) continue;
            size_t j = i + 1;
            while (j < n && is_ws(s[j])) j++;
            if (j == n || s[j] != ':') continue; /* a value, not a key */
            for (j++; j < n && is_ws(s[j]); j++) {}
            if (j == n || s[j] != '"') continue; /* a tensor of that name */
            int literal = j + 9 < n && s[j + 9] == '"' && !memchr(s + j + 1, '"', 8) &&
                          !memchr(s + j + 1, '\\', 8);
            p->hdr_hex_at = literal ? j + 1 : SIZE_MAX - 1;
        } else if (s[i] == '{' || s[i] == '[') {
            if (++depth > 3)
                return fail(p, i, "nested deeper than a safetensors header (3 levels: the "
                                  "header, a tensor, its shape)");
        } else if (s[i] == '}' || s[i] == ']')
            depth--;
        else if (s[i] == '-')
            return fail(p, i, "negative number");
    }
    return 0;
}

/* Shows a name in a message, cut to NAME_SHOWN bytes. */
#define NM(s) (int)(strlen(s) < NAME_SHOWN ? strlen(s) : NAME_SHOWN), (s)

/* A shape or data_offsets array of at most max non-negative integers, into out. */
static int read_ints(parser *p, const char *name, const char *what, const json_t *a, size_t max,
                     int64_t *out, size_t *n)
{
    if (!json_is_array(a))
        return fail(p, NOWHERE, "tensor '%.*s': %s must be an array of non-negative integers, "
                                "found %s", NM(name), what, kind(a));
    if ((*n = json_array_size(a)) > max)
        return fail(p, NOWHERE, "tensor '%.*s': %s has %zu entries, more than %zu", NM(name),
                    what, *n, max);
    for (size_t k = 0; k < *n; k++) {
        const json_t *x = json_array_get(a, k);
        if (!json_is_integer(x) || json_integer_value(x) < 0)
            return fail(p, NOWHERE, "tensor '%.*s': %s holds %s, not a non-negative integer",
                        NM(name), what, kind(x));
        out[k] = json_integer_value(x);
    }
    return 0;
}

static int read_tensor(parser *p, const char *name, json_t *v)
{
    if (!json_is_object(v))
        return fail(p, NOWHERE, "tensor '%.*s' must be an object, found %s", NM(name), kind(v));
    if (!json_object_size(v))
        return fail(p, NOWHERE, "tensor '%.*s' is an empty object", NM(name));
    const char *key;
    const json_t *f;
    json_object_foreach(v, key, f)
        if (strcmp(key, "dtype") && strcmp(key, "shape") && strcmp(key, "data_offsets"))
            return fail(p, NOWHERE, "tensor '%.*s': unknown field '%.*s'", NM(name), NM(key));
    const json_t *dt = json_object_get(v, "dtype"), *sh = json_object_get(v, "shape"),
                 *off = json_object_get(v, "data_offsets");
    if (!dt || !sh || !off)
        return fail(p, NOWHERE, "tensor '%.*s': missing field '%s'", NM(name),
                    !dt ? "dtype" : !sh ? "shape" : "data_offsets");
    const char *dn = json_string_value(dt);
    if (!dn)
        return fail(p, NOWHERE, "tensor '%.*s': dtype must be a string, found %s", NM(name),
                    kind(dt));
    int d = 0;
    while (d < SP_ST_NDTYPES && strcmp(dn, dtypes[d].name)) d++;
    if (d == SP_ST_NDTYPES)
        return fail(p, NOWHERE, "tensor '%.*s': unknown dtype '%.*s'", NM(name), NM(dn));
    if (json_is_array(off) && json_array_size(off) != 2)
        return fail(p, NOWHERE, "tensor '%.*s': data_offsets has %zu entries, not 2", NM(name),
                    json_array_size(off));
    int64_t shape[MAX_DIMS], o[2];
    size_t ns, no;
    if (read_ints(p, name, "shape", sh, MAX_DIMS, shape, &ns) ||
        read_ints(p, name, "data_offsets", off, 2, o, &no))
        return -1;
    ptensor *t = &p->t[p->nt++];
    *t = (ptensor){.name = name, .dtype = (sp_st_dtype)d, .ndim = (int)ns,
                   .begin = (uint64_t)o[0], .end = (uint64_t)o[1], .order = p->nt - 1};
    if (ns && !(t->shape = malloc(ns * sizeof *t->shape))) return oom(p);
    if (ns) memcpy(t->shape, shape, ns * sizeof *shape);
    return 0;
}

static int read_metadata(parser *p, json_t *v)
{
    if (!json_is_object(v))
        return fail(p, NOWHERE, "__metadata__ must be an object, found %s", kind(v));
    if (!(p->m = malloc((json_object_size(v) + 1) * sizeof *p->m))) return oom(p);
    const char *key;
    const json_t *s;
    json_object_foreach(v, key, s) {
        if (!json_is_string(s))
            return fail(p, NOWHERE, "__metadata__ value of '%.*s' must be a string, found %s",
                        NM(key), kind(s));
        p->m[p->nm++] = (sp_st_meta){key, json_string_value(s)};
    }
    p->meta = v;
    return 0;
}

/* The header, strictly: it starts with '{' (as the reference wants), is one JSON object
 * with no duplicate key anywhere (jansson: JSON_REJECT_DUPLICATES; it also refuses
 * invalid UTF-8, control characters, bad escapes, lone surrogates, \u0000, integers
 * beyond int64 and leading zeros), followed by nothing but spaces (the writers' padding),
 * and holds only tensors and one __metadata__ object of strings. */
static int parse_header(parser *p)
{
    if (!p->n || p->s[0] != '{')
        return fail(p, 0, "not a safetensors file: the header does not start with '{' (found %s)",
                    show(p->n ? p->s[0] : -1));
    if (scan_header(p)) return -1;
    json_error_t e;
    p->root = json_loadb((const char *)p->s, p->n, JSON_REJECT_DUPLICATES | JSON_DISABLE_EOF_CHECK,
                         &e);
    if (!p->root && json_error_code(&e) == json_error_out_of_memory) return oom(p);
    if (!p->root) return fail(p, (size_t)e.position, "%s", e.text);
    for (size_t i = (size_t)e.position; i < p->n; i++)
        if (p->s[i] != ' ')
            return fail(p, i, "%s after the end of the header object", show(p->s[i]));
    if (!(p->t = malloc((json_object_size(p->root) + 1) * sizeof *p->t))) return oom(p);
    const char *key;
    json_t *v;
    json_object_foreach(p->root, key, v) {
        /* an empty name is refused by the writer too: a file we read must write back */
        int rc = !strcmp(key, "__metadata__") ? read_metadata(p, v)
                 : !*key ? fail(p, NOWHERE, "a tensor with an empty name")
                         : read_tensor(p, key, v);
        if (rc) return -1;
    }
    return 0;
}

static void parser_free(parser *p)
{
    for (size_t k = 0; k < p->nt; k++) free(p->t[k].shape);
    free(p->t);
    free(p->m);
    json_decref(p->root);
}

/* ---- the reader ---- */

struct sp_safetensors {
    json_t *header;            /* names, keys and values point into it */
    json_t *meta;              /* its __metadata__, for sp_safetensors_meta */
    sp_st_tensor *t;           /* by data offset */
    const sp_st_tensor **name; /* by name, for sp_safetensors_find */
    void **copy;               /* aligned copies of misaligned tensors, else NULL */
    size_t nt;
    sp_st_meta *m;             /* header order */
    size_t nm;
    unsigned char *data;       /* the data section */
};

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

static const char *meta_value(const json_t *meta, const char *key)
{
    return json_string_value(json_object_get(meta, key));
}

/* Everything after the JSON parse (names are unique there): checksums, sizes, layout.
 * Returns the sorted order (by offset) in *byoff. */
static sp_status validate(parser *p, const char *path, unsigned flags, const unsigned char len8[8],
                          const unsigned char *hdr, uint64_t hlen, uint64_t avail,
                          ptensor ***byoff)
{
    char sh[128];
    sp_status st = SP_OK;
    ptensor **v = malloc((p->nt ? p->nt : 1) * sizeof *v);
    if (!v) return sp_set_error(SP_ERR_NOMEM, "%s: out of memory while checking the header", path);

    /* checksums first: a corrupt header is best reported as such */
    const char *dcrc = meta_value(p->meta, CRC_DATA_KEY), *hcrc = meta_value(p->meta, CRC_HEADER_KEY);
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
    if (st) free(v), v = NULL;
    *byoff = v;
    return st;
}

void sp_safetensors_close(sp_safetensors *f)
{
    if (!f) return;
    for (size_t k = 0; k < f->nt; k++) {
        free((int64_t *)f->t[k].shape);
        if (f->copy) free(f->copy[k]);
    }
    free(f->t);
    free(f->name);
    free(f->copy);
    free(f->m);
    free(f->data);
    json_decref(f->header);
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
    const char *dcrc = meta_value(p.meta, CRC_DATA_KEY);
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
        !(f->copy = calloc(p.nt ? p.nt : 1, sizeof *f->copy))) {
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
        t->shape = NULL;
        f->nt = k + 1;
        f->name[k] = &f->t[k];
    }
    qsort(f->name, f->nt, sizeof *f->name, cmp_tensor_name);
    f->m = p.m, f->nm = p.nm, f->header = p.root, f->meta = p.meta;
    p.m = NULL, p.root = NULL;
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
    return f && key ? meta_value(f->meta, key) : NULL;
}

/* ---- the writer ---- */

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
        if (t[k].ndim > MAX_DIMS) /* what the reader takes */
            return sp_set_error(SP_ERR_ARG, "%s: tensor '%.*s': %d dimensions, more than %d",
                                path, NM(t[k].name), t[k].ndim, MAX_DIMS);
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
    return SP_OK; /* duplicates: build_header */
}

/* A JSON array of n integers, NULL when out of memory. */
static json_t *int_array(const int64_t *v, int n)
{
    json_t *a = json_array();
    for (int k = 0; a && k < n; k++)
        if (json_array_append_new(a, json_integer(v[k]))) json_decref(a), a = NULL;
    return a;
}

/* The header: the JSON (jansson, compact, tensors in the order given) padded with spaces
 * so that 8 + its length is a multiple of 8, and the 8 length bytes; the header checksum
 * filled in when asked for. */
static sp_status build_header(const char *path, const sp_st_tensor *t, int n, const sp_st_meta *m,
                              int n_meta, unsigned flags, char **out, size_t *len,
                              unsigned char len8[8])
{
    static const char hkey[] = "\"" CRC_HEADER_KEY "\":\"";
    const char *dup = NULL, *what = NULL;
    json_t *h = json_object(), *meta = NULL;
    int bad = !h;
    if (!bad && (n_meta || (flags & SP_ST_CHECKSUM)))
        bad = json_object_set_new(h, "__metadata__", meta = json_object());
    for (int k = 0; !bad && !dup && k < n_meta; k++) {
        if (json_object_get(meta, m[k].key)) dup = m[k].key, what = "metadata key";
        else bad = json_object_set_new(meta, m[k].key, json_string(m[k].value));
    }
    if (!bad && (flags & SP_ST_CHECKSUM)) {
        uint32_t c = 0;
        char hex[16];
        for (int k = 0; k < n; k++) c = sp_crc32(c, t[k].data, sp_st_nbytes(&t[k]));
        snprintf(hex, sizeof hex, "%08x", c);
        bad = json_object_set_new(meta, CRC_DATA_KEY, json_string(hex)) ||
              json_object_set_new(meta, CRC_HEADER_KEY, json_string("00000000"));
    }
    uint64_t off = 0;
    for (int k = 0; !bad && !dup && k < n; k++) {
        uint64_t nb = sp_st_nbytes(&t[k]);
        if (json_object_get(h, t[k].name)) {
            dup = t[k].name, what = "tensor name";
            break;
        }
        bad = json_object_set_new(h, t[k].name,
                                  json_pack("{s:s,s:o,s:[I,I]}", "dtype", dtypes[t[k].dtype].name,
                                            "shape", int_array(t[k].shape, t[k].ndim),
                                            "data_offsets", (json_int_t)off, (json_int_t)(off + nb)));
        off += nb;
    }
    size_t n_json = bad || dup ? 0 : json_dumpb(h, NULL, 0, JSON_COMPACT);
    char *b = n_json ? malloc(n_json + 8) : NULL;
    if (b && json_dumpb(h, b, n_json, JSON_COMPACT) != n_json) free(b), b = NULL;
    json_decref(h);
    if (dup) return sp_set_error(SP_ERR_ARG, "%s: duplicate %s '%.*s'", path, what, NM(dup));
    if (!b) return sp_set_error(SP_ERR_NOMEM, "%s: out of memory building the header", path);
    b[n_json] = '\0'; /* (JSON text holds no NUL byte) */
    /* The entry's: the first such bytes whose opening '"' is not escaped (preceded by an
     * even number of backslashes). Inside a key or value a '"' is always escaped, but the
     * bytes after it may spell the entry's key: a metadata key ending in
     * \"starpipe.header_crc32 matched first, and its value was overwritten (found by
     * fuzz.short_safetensors; the input is in fuzz/corpus/safetensors, replayed by
     * fuzz.replay_safetensors). */
    char *hex_at = NULL;
    for (char *q = (flags & SP_ST_CHECKSUM) ? strstr(b, hkey) : NULL; q && !hex_at;
         q = strstr(q + 1, hkey)) {
        size_t bs = 0;
        while (q - bs > b && *(q - bs - 1) == '\\') bs++;
        if (bs % 2 == 0) hex_at = q + sizeof hkey - 1;
    }
    while ((8 + n_json) % 8) b[n_json++] = ' ';
    *out = b, *len = n_json;
    if (n_json > SP_ST_MAX_HEADER)
        return sp_set_error(SP_ERR_ARG, "%s: the header would be %zu bytes, over the limit of "
                            "%" PRIu64, path, n_json, SP_ST_MAX_HEADER);
    for (int k = 0; k < 8; k++) len8[k] = (unsigned char)((uint64_t)n_json >> (8 * k));
    if (hex_at) {
        char hex[16];
        snprintf(hex, sizeof hex, "%08x",
                 header_crc(len8, (const unsigned char *)b, n_json, (size_t)(hex_at - b)));
        memcpy(hex_at, hex, 8);
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
    char *hdr = NULL;
    size_t hlen = 0;
    unsigned char len8[8];
    if ((st = build_header(path, tensors, n, meta, n_meta, flags, &hdr, &hlen, len8))) {
        free(hdr);
        return st;
    }
    /* the file to replace: path, or the regular file a symbolic link at path names; a
     * directory, FIFO or device there is refused before anything is written */
    char *target = malloc(PATH_MAX);
    size_t tlen = PATH_MAX + 32;
    char *tmp = malloc(tlen);
    if (!tmp || !target) {
        free(hdr), free(tmp), free(target);
        return sp_set_error(SP_ERR_NOMEM, "%s: out of memory", path);
    }
    if ((st = sp_output_target(path, "output file", target, PATH_MAX))) {
        free(hdr), free(tmp), free(target);
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
    if (fwrite(len8, 1, 8, fp) != 8 || fwrite(hdr, 1, hlen, fp) != hlen) goto failed;
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
    if (sp_output_tmp_finish(tmp, target)) goto failed;
    free(hdr);
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
    sp_output_tmp_finish(tmp, NULL);
    goto done;
failed_nofile:
    st = sp_set_error(SP_ERR_IO, "%s: cannot create the temporary file '%s': %s", path, tmp,
                      strerror(errno));
done:
    free(hdr);
    free(tmp);
    free(target);
    return st;
}
