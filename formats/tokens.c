/* Token shards (include/starpipe/tokens.h), read with pread so that a microbatch touches
 * only its windows. */
#define _GNU_SOURCE
#include "starpipe/tokens.h"

#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/files.h"

typedef struct {
    int fd, width;        /* bytes per token: 2 (uint16) or 4 (uint32) */
    int64_t first, count; /* stream positions [first, first + count) */
    char *path;
} shard;

struct sp_tokens {
    shard *s;
    int n;
    int64_t total;
};

static uint32_t le32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* Token j of a little-endian block of width-byte tokens; a uint32 above INT32_MAX reads as
 * INT32_MAX, outside every vocabulary (the vocabulary check names it). */
static inline int32_t token_at(const unsigned char *b, int width, int64_t j)
{
    const unsigned char *p = b + width * j;
    if (width == 2) return p[0] | p[1] << 8;
    const uint32_t v = le32(p);
    return v > INT32_MAX ? INT32_MAX : (int32_t)v;
}

/* Reads exactly len bytes at off, or fails naming the file. */
static sp_status read_at(int fd, void *buf, size_t len, int64_t off, const char *path)
{
    size_t got = 0;
    while (got < len) {
        ssize_t r = pread(fd, (char *)buf + got, len - got, (off_t)(off + (int64_t)got));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0)
            return sp_set_error(SP_ERR_IO, "token shard '%s': %s at byte %lld", path,
                                r < 0 ? strerror(errno) : "unexpected end",
                                (long long)(off + (int64_t)got));
        got += (size_t)r;
    }
    return SP_OK;
}

int sp_tokens_is_shard(const char *path)
{
    /* only a regular file is looked into: opening a FIFO would wait for a writer */
    struct stat sb;
    if (stat(path, &sb) || !S_ISREG(sb.st_mode)) return 0;
    unsigned char h[8];
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return 0;
    int ok = pread(fd, h, sizeof h, 0) == (ssize_t)sizeof h &&
             (le32(h) == SP_TOKENS_MAGIC || le32(h) == SP_TOKENS_MAGIC32);
    close(fd);
    return ok;
}

void sp_tokens_close(sp_tokens *s)
{
    if (!s) return;
    for (int i = 0; i < s->n; i++) {
        if (s->s[i].fd >= 0) close(s->s[i].fd);
        free(s->s[i].path);
    }
    free(s->s);
    free(s);
}

static sp_status open_shard(shard *sh, const char *path)
{
    sh->fd = -1;
    if (!(sh->path = strdup(path))) return sp_set_error(SP_ERR_NOMEM, "out of memory");
    struct stat sb; /* a FIFO or a device is refused before it is opened (no wait) */
    if (stat(path, &sb) == 0 && !S_ISREG(sb.st_mode))
        return sp_set_error(SP_ERR_IO, "token shard '%s' is not a regular file", path);
    sh->fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (sh->fd < 0)
        return sp_set_error(SP_ERR_IO, "cannot open token shard '%s': %s", path, strerror(errno));
    if (fstat(sh->fd, &sb) || !S_ISREG(sb.st_mode))
        return sp_set_error(SP_ERR_IO, "token shard '%s' is not a regular file", path);
    unsigned char h[SP_TOKENS_HEADER_BYTES];
    if (sb.st_size < SP_TOKENS_HEADER_BYTES)
        return sp_set_error(SP_ERR_FORMAT, "token shard '%s': %lld bytes, shorter than the "
                            "%d-byte header", path, (long long)sb.st_size, SP_TOKENS_HEADER_BYTES);
    sp_status st = read_at(sh->fd, h, sizeof h, 0, path);
    if (st) return st;
    if (le32(h) == SP_TOKENS_MAGIC && le32(h + 4) == SP_TOKENS_VERSION)
        sh->width = 2;
    else if (le32(h) == SP_TOKENS_MAGIC32 && le32(h + 4) == SP_TOKENS_VERSION32)
        sh->width = 4;
    else if (le32(h) == SP_TOKENS_MAGIC || le32(h) == SP_TOKENS_MAGIC32)
        return sp_set_error(SP_ERR_FORMAT, "token shard '%s': magic %u with version %u; read "
                            "are %d version %d (uint16 tokens) and %d version %d (uint32)",
                            path, le32(h), le32(h + 4), SP_TOKENS_MAGIC, SP_TOKENS_VERSION,
                            SP_TOKENS_MAGIC32, SP_TOKENS_VERSION32);
    else
        return sp_set_error(SP_ERR_FORMAT, "token shard '%s': magic %u, expected %d (uint16 "
                            "tokens) or %d (uint32)", path, le32(h), SP_TOKENS_MAGIC,
                            SP_TOKENS_MAGIC32);
    int64_t n = (int32_t)le32(h + 8);
    int64_t want = SP_TOKENS_HEADER_BYTES + sh->width * n;
    if (n < 0 || (int64_t)sb.st_size != want)
        return sp_set_error(SP_ERR_FORMAT, "token shard '%s': the header counts %lld tokens "
                            "(%lld bytes in all) but the file has %lld bytes", path,
                            (long long)n, (long long)want, (long long)sb.st_size);
    sh->count = n;
    return SP_OK;
}

sp_status sp_tokens_open(const char *const *paths, int n, sp_tokens **out)
{
    *out = NULL;
    if (!paths || n < 1 || n > SP_TOKENS_MAX_SHARDS)
        return sp_set_error(SP_ERR_ARG, "token shards: between 1 and %d files, got %d",
                            SP_TOKENS_MAX_SHARDS, n);
    sp_tokens *s = calloc(1, sizeof *s);
    if (!s || !(s->s = calloc((size_t)n, sizeof *s->s))) {
        free(s);
        return sp_set_error(SP_ERR_NOMEM, "out of memory");
    }
    sp_status st = SP_OK;
    for (int i = 0; i < n && st == SP_OK; i++) {
        st = open_shard(&s->s[i], paths[i]);
        s->n = i + 1;
        s->s[i].first = s->total;
        s->total += s->s[i].count;
    }
    if (st) {
        sp_tokens_close(s);
        return st;
    }
    *out = s;
    return SP_OK;
}

sp_status sp_tokens_open_pattern(const char *pattern, sp_tokens **out)
{
    *out = NULL;
    char *copy = strdup(pattern ? pattern : "");
    if (!copy) return sp_set_error(SP_ERR_NOMEM, "out of memory");
    glob_t g = { 0 };
    int flags = 0, bad = 0, entry = 0, empty = 0;
    /* entries split by hand: strtok would pass over an empty one (a stray comma) in silence */
    for (char *part = copy, *next; part && !bad && !empty; part = next) {
        if ((next = strchr(part, ','))) *next++ = 0;
        entry++;
        if (!*part) {
            empty = entry;
            break;
        }
        int rc = glob(part, flags | GLOB_NOCHECK, NULL, &g); /* no match: the name itself */
        bad = rc != 0;
        flags = GLOB_APPEND;
    }
    free(copy);
    sp_status st;
    if (empty)
        st = sp_set_error(SP_ERR_ARG, "token shards '%s': entry %d is empty (a comma-separated "
                          "list of paths or globs, nothing between or around the commas)",
                          pattern, empty);
    else if (bad || g.gl_pathc == 0)
        st = sp_set_error(SP_ERR_ARG, "token shards '%s': no file", pattern ? pattern : "");
    else if (g.gl_pathc > SP_TOKENS_MAX_SHARDS)
        st = sp_set_error(SP_ERR_ARG, "token shards '%s': %zu files, at most %d", pattern,
                          g.gl_pathc, SP_TOKENS_MAX_SHARDS);
    else
        st = sp_tokens_open((const char *const *)g.gl_pathv, (int)g.gl_pathc, out);
    globfree(&g);
    return st;
}

int64_t sp_tokens_count(const sp_tokens *s) { return s ? s->total : 0; }
int sp_tokens_shards(const sp_tokens *s) { return s ? s->n : 0; }

sp_status sp_tokens_read(sp_tokens *s, int64_t pos, int64_t n, int32_t *out)
{
    if (!s || pos < 0 || n < 0 || pos + n > s->total)
        return sp_set_error(SP_ERR_ARG, "sp_tokens_read: [%lld, %lld) outside the %lld tokens",
                            (long long)pos, (long long)(pos + n), (long long)(s ? s->total : 0));
    /* the shard holding pos: binary search over the first positions */
    int lo = 0, hi = s->n - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (s->s[mid].first <= pos) lo = mid;
        else hi = mid - 1;
    }
    unsigned char buf[4 * 4096];
    for (int i = lo; n > 0 && i < s->n; i++) {
        const shard *sh = &s->s[i];
        int64_t at = pos - sh->first, take = sh->count - at < n ? sh->count - at : n;
        for (int64_t done = 0; done < take;) {
            int64_t k = take - done < 4096 ? take - done : 4096;
            sp_status st = read_at(sh->fd, buf, (size_t)(k * sh->width),
                                   SP_TOKENS_HEADER_BYTES + sh->width * (at + done), sh->path);
            if (st) return st;
            for (int64_t j = 0; j < k; j++)
                out[done + j] = token_at(buf, sh->width, j);
            done += k;
        }
        out += take, pos += take, n -= take;
    }
    return SP_OK;
}

/* The largest token of k (a loop the compiler vectorizes: the scan runs at disk speed). */
static int32_t block_max(const unsigned char *b, int width, int64_t k)
{
    int32_t m = 0;
    if (width == 2) {
        uint16_t m16 = 0;
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
        const uint16_t *u = (const uint16_t *)(const void *)b;
        for (int64_t j = 0; j < k; j++) m16 = u[j] > m16 ? u[j] : m16;
#else
        for (int64_t j = 0; j < k; j++)
            m16 = token_at(b, 2, j) > m16 ? (uint16_t)token_at(b, 2, j) : m16;
#endif
        return m16;
    }
    for (int64_t j = 0; j < k; j++)
        m = token_at(b, 4, j) > m ? token_at(b, 4, j) : m;
    return m;
}

/* Streams every shard once in large sequential reads (disk speed, whatever the data
 * set's size): the largest token into *max, and the first one at or above `limit` (when
 * limit > 0) into *bad_shard and *bad_at (its index in that shard); *bad_shard -1: none. */
static sp_status scan(sp_tokens *s, int32_t limit, int32_t *max, int *bad_shard,
                      int64_t *bad_at)
{
    enum { CHUNK = 1 << 21 }; /* tokens per read: 4 or 8 MiB */
    unsigned char *buf = malloc((size_t)CHUNK * 4);
    if (!buf) return sp_set_error(SP_ERR_NOMEM, "out of memory");
    int32_t m = -1;
    *bad_shard = -1;
    for (int i = 0; s && i < s->n && *bad_shard < 0; i++) {
        const shard *sh = &s->s[i];
        posix_fadvise(sh->fd, 0, 0, POSIX_FADV_SEQUENTIAL); /* a larger readahead */
        for (int64_t at = 0; at < sh->count && *bad_shard < 0; at += CHUNK) {
            int64_t k = sh->count - at < CHUNK ? sh->count - at : CHUNK;
            sp_status st = read_at(sh->fd, buf, (size_t)(k * sh->width),
                                   SP_TOKENS_HEADER_BYTES + sh->width * at, sh->path);
            if (st) {
                free(buf);
                return st;
            }
            int32_t bm = block_max(buf, sh->width, k);
            if (bm > m) m = bm;
            for (int64_t j = 0; limit > 0 && bm >= limit && j < k; j++)
                if (token_at(buf, sh->width, j) >= limit) {
                    *bad_shard = i, *bad_at = at + j;
                    break;
                }
        }
    }
    free(buf);
    *max = m;
    return SP_OK;
}

sp_status sp_tokens_max(sp_tokens *s, int32_t *max)
{
    int bad = -1;
    int64_t at = 0;
    return scan(s, 0, max, &bad, &at);
}

sp_status sp_tokens_check_vocab(sp_tokens *s, int32_t vocab)
{
    int bad = -1;
    int64_t at = 0;
    int32_t max;
    sp_status st = scan(s, vocab, &max, &bad, &at);
    if (st || bad < 0) return st;
    const shard *sh = &s->s[bad];
    unsigned char tok[4];
    if ((st = read_at(sh->fd, tok, (size_t)sh->width, SP_TOKENS_HEADER_BYTES + sh->width * at,
                      sh->path)))
        return st;
    return sp_set_error(SP_ERR_FORMAT, "token shard '%s': token %lld at position %lld (byte "
                        "offset %lld) is outside the vocabulary [0,%d)", sh->path,
                        sh->width == 2 ? (long long)(tok[0] | tok[1] << 8) : (long long)le32(tok),
                        (long long)at, (long long)(SP_TOKENS_HEADER_BYTES + sh->width * at),
                        vocab);
}

static sp_status write_shard(const char *path, const void *tokens, int width, int64_t n)
{
    if (n < 0 || n > INT32_MAX || (!tokens && n))
        return sp_set_error(SP_ERR_ARG, "sp_tokens_write: %lld tokens (0 .. %d)", (long long)n,
                            INT32_MAX);
    sp_output o;
    sp_status st = sp_output_open(&o, path, "token shard");
    if (st) return st;
    unsigned char h[SP_TOKENS_HEADER_BYTES] = { 0 };
    const uint32_t fields[3] = { width == 2 ? SP_TOKENS_MAGIC : SP_TOKENS_MAGIC32,
                                 width == 2 ? SP_TOKENS_VERSION : SP_TOKENS_VERSION32,
                                 (uint32_t)n };
    for (int f = 0; f < 3; f++)
        for (int b = 0; b < 4; b++) h[4 * f + b] = (unsigned char)(fields[f] >> (8 * b));
    fwrite(h, 1, sizeof h, o.f);
    for (int64_t i = 0; i < n; i++) {
        const uint32_t v = width == 2 ? ((const uint16_t *)tokens)[i] : ((const uint32_t *)tokens)[i];
        const unsigned char t[4] = { (unsigned char)v, (unsigned char)(v >> 8),
                                     (unsigned char)(v >> 16), (unsigned char)(v >> 24) };
        fwrite(t, 1, (size_t)width, o.f);
    }
    return sp_output_commit(&o, "token shard");
}

sp_status sp_tokens_write(const char *path, const uint16_t *tokens, int64_t n)
{
    return write_shard(path, tokens, 2, n);
}

sp_status sp_tokens_write32(const char *path, const uint32_t *tokens, int64_t n)
{
    return write_shard(path, tokens, 4, n);
}
