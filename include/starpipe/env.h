/* What a user hands us besides flags, checked as strictly as flags: numbers in strings,
 * STARPIPE_* variables, files read (regular files only, bounded) and files written
 * (a temporary beside the target, renamed over it; never over a device, a FIFO or a
 * directory; a symbolic link is followed to the regular file it names, which is
 * replaced, and stays a link). Header-only (static inline) so that graph/, sched/ and
 * the apps share it without a link dependency between the libraries. Pure C + POSIX.
 *
 *   int64_t v = 0;                                   // unset: v stays 0
 *   if (sp_env_int("STARPIPE_VERBOSE", 0, 2, &v)) fprintf(stderr, "%s\n", sp_last_error());
 *   char *text; size_t n;
 *   sp_status st = sp_file_read(path, "schedule file", 1 << 20, &text, &n);
 */
#ifndef STARPIPE_ENV_H
#define STARPIPE_ENV_H

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "starpipe/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------ numbers */

/* The whole string is one integer in [lo, hi] (no space, nothing after it): 0, else -1. */
static inline int sp_parse_int(const char *s, int64_t lo, int64_t hi, int64_t *out)
{
    if (!s || !*s || isspace((unsigned char)*s)) return -1;
    char *end = NULL;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (*end || errno || v < lo || v > hi) return -1;
    *out = (int64_t)v;
    return 0;
}

/* The whole string is one finite number in [lo, hi] ("nan", "inf" refused): 0, else -1. */
static inline int sp_parse_double(const char *s, double lo, double hi, double *out)
{
    if (!s || !*s || isspace((unsigned char)*s)) return -1;
    char *end = NULL;
    errno = 0;
    double v = strtod(s, &end);
    if (*end || (errno && errno != ERANGE) || !isfinite(v) || !(v >= lo && v <= hi)) return -1;
    *out = v;
    return 0;
}

/* Length of the valid UTF-8 sequence at p (at most n bytes), 0 if invalid: no overlong
 * forms, no surrogates, nothing above U+10FFFF. */
static inline size_t sp_utf8_seq(const unsigned char *p, size_t n)
{
    unsigned char c = p[0];
    if (c < 0x80) return 1;
    size_t len;
    unsigned char lo = 0x80, hi = 0xbf;
    if (c >= 0xc2 && c <= 0xdf) len = 2;
    else if (c >= 0xe0 && c <= 0xef) {
        len = 3;
        if (c == 0xe0) lo = 0xa0;
        if (c == 0xed) hi = 0x9f;
    } else if (c >= 0xf0 && c <= 0xf4) {
        len = 4;
        if (c == 0xf0) lo = 0x90;
        if (c == 0xf4) hi = 0x8f;
    } else
        return 0;
    if (n < len || p[1] < lo || p[1] > hi) return 0;
    for (size_t k = 2; k < len; k++)
        if ((p[k] & 0xc0) != 0x80) return 0;
    return len;
}

/* ------------------------------------------------------------------ variables */

/* *out = the value of variable `name`, NULL when unset. Set but empty is an error: an
 * empty value is a mistake, never a way to ask for the default. */
static inline sp_status sp_env_string(const char *name, const char **out)
{
    const char *v = getenv(name);
    *out = NULL;
    if (v && !*v)
        return sp_set_error(SP_ERR_ARG, "%s is set but empty: unset it, or give a value", name);
    *out = v;
    return SP_OK;
}

/* An integer variable in [lo, hi]; *out is left as it is when the variable is unset. */
static inline sp_status sp_env_int(const char *name, int64_t lo, int64_t hi, int64_t *out)
{
    const char *v;
    sp_status st = sp_env_string(name, &v);
    if (st || !v) return st;
    if (sp_parse_int(v, lo, hi, out))
        return sp_set_error(SP_ERR_ARG, "%s='%s' is not an integer in [%lld, %lld]", name, v,
                            (long long)lo, (long long)hi);
    return SP_OK;
}

/* A finite number variable in [lo, hi]; *out is left as it is when unset. */
static inline sp_status sp_env_double(const char *name, double lo, double hi, double *out)
{
    const char *v;
    sp_status st = sp_env_string(name, &v);
    if (st || !v) return st;
    if (sp_parse_double(v, lo, hi, out))
        return sp_set_error(SP_ERR_ARG, "%s='%s' is not a number in [%g, %g]", name, v, lo, hi);
    return SP_OK;
}

/* STARPIPE_NCCL_THRESHOLD: bytes, at most 1 TiB (above it nothing goes through NCCL). */
#define SP_NCCL_THRESHOLD_MAX ((int64_t)1 << 40)

/* STARPIPE_FAULT, fault injection for tests: nan@STEP (a NaN in the first float input of
 * microbatch 0), fail@STEP:STAGE (that stage's first task of the step fails),
 * hang@STEP:STAGE (it never finishes). Kinds: */
enum { SP_FAULT_NONE = 0, SP_FAULT_FAIL = 1, SP_FAULT_HANG = 2, SP_FAULT_NAN = 3 };
typedef struct {
    int kind, step, stage; /* stage -1 for nan@ */
} sp_fault;

#define SP_FAULT_FORMS "nan@STEP, fail@STEP:STAGE or hang@STEP:STAGE (STEP >= 1, STAGE >= 0)"

static inline sp_status sp_env_fault(sp_fault *f)
{
    const char *v;
    *f = (sp_fault){ SP_FAULT_NONE, 0, -1 };
    sp_status st = sp_env_string("STARPIPE_FAULT", &v);
    if (st || !v) return st;
    static const struct { const char *prefix; int kind; } kinds[] = {
        { "nan@", SP_FAULT_NAN }, { "fail@", SP_FAULT_FAIL }, { "hang@", SP_FAULT_HANG } };
    for (size_t k = 0; k < sizeof kinds / sizeof *kinds; k++) {
        size_t n = strlen(kinds[k].prefix);
        if (strncmp(v, kinds[k].prefix, n)) continue;
        char buf[64];
        snprintf(buf, sizeof buf, "%s", v + n);
        char *colon = strchr(buf, ':');
        int64_t step = 0, stage = -1;
        int staged = kinds[k].kind != SP_FAULT_NAN;
        if (strlen(v + n) < sizeof buf && (colon != NULL) == staged) {
            if (colon) *colon = 0;
            if (!sp_parse_int(buf, 1, 1 << 30, &step) &&
                (!colon || !sp_parse_int(colon + 1, 0, 1 << 20, &stage))) {
                *f = (sp_fault){ kinds[k].kind, (int)step, (int)stage };
                return SP_OK;
            }
        }
        break;
    }
    return sp_set_error(SP_ERR_ARG, "STARPIPE_FAULT='%s' is not one of " SP_FAULT_FORMS, v);
}

/* ------------------------------------------------------------------ files read */

static inline const char *sp_file_kind(mode_t m)
{
    return S_ISDIR(m) ? "a directory" : S_ISFIFO(m) ? "a FIFO" : S_ISCHR(m) ? "a character device"
         : S_ISBLK(m) ? "a block device" : S_ISSOCK(m) ? "a socket" : S_ISLNK(m) ? "a symbolic link"
         : S_ISREG(m) ? "a regular file" : "not a regular file";
}

/* Reads the whole regular file at path, at most max bytes, into *data (NUL-terminated,
 * free() it; *n bytes before the NUL). What is not a regular file (a FIFO, a socket, a
 * device, a directory) is refused without blocking, and so is a file over max bytes,
 * or one that grows past max while read. `what` names the file in messages
 * ("data file"). SP_ERR_IO or SP_ERR_NOMEM. */
static inline sp_status sp_file_read(const char *path, const char *what, size_t max,
                                     char **data, size_t *n)
{
    *data = NULL;
    *n = 0;
    if (!path || !*path) return sp_set_error(SP_ERR_IO, "no %s given (an empty path)", what);
    /* O_NONBLOCK: opening a FIFO with no writer must not wait for one */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0)
        return sp_set_error(SP_ERR_IO, "cannot open %s '%s': %s", what, path, strerror(errno));
    struct stat sb;
    sp_status st = SP_OK;
    char *buf = NULL;
    size_t got = 0;
    if (fstat(fd, &sb)) {
        st = sp_set_error(SP_ERR_IO, "cannot stat %s '%s': %s", what, path, strerror(errno));
        goto out;
    }
    if (!S_ISREG(sb.st_mode)) {
        st = sp_set_error(SP_ERR_IO, "%s '%s' is %s, not a regular file: refusing to read it",
                          what, path, sp_file_kind(sb.st_mode));
        goto out;
    }
    if ((uint64_t)sb.st_size > max) {
        st = sp_set_error(SP_ERR_IO, "%s '%s' is %lld bytes, over the limit of %zu bytes", what,
                          path, (long long)sb.st_size, max);
        goto out;
    }
    size_t cap = (size_t)sb.st_size + 1;
    if (!(buf = malloc(cap + 1))) {
        st = sp_set_error(SP_ERR_NOMEM, "out of memory reading %s '%s'", what, path);
        goto out;
    }
    for (;;) {
        if (got == cap) { /* it grew since fstat: go on, up to max + 1 bytes */
            if (cap > max) {
                st = sp_set_error(SP_ERR_IO, "%s '%s' grew past the limit of %zu bytes while "
                                  "being read", what, path, max);
                goto out;
            }
            size_t ncap = cap > max / 2 ? max + 1 : 2 * cap;
            char *nb = realloc(buf, ncap + 1);
            if (!nb) {
                st = sp_set_error(SP_ERR_NOMEM, "out of memory reading %s '%s'", what, path);
                goto out;
            }
            buf = nb;
            cap = ncap;
        }
        ssize_t r = read(fd, buf + got, cap - got);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            st = sp_set_error(SP_ERR_IO, "error reading %s '%s': %s", what, path, strerror(errno));
            goto out;
        }
        if (r == 0) break;
        got += (size_t)r;
    }
    if (got > max) {
        st = sp_set_error(SP_ERR_IO, "%s '%s' grew past the limit of %zu bytes while being read",
                          what, path, max);
        goto out;
    }
    buf[got] = 0;
    *data = buf;
    *n = got;
    buf = NULL;
out:
    free(buf);
    close(fd);
    return st;
}

/* ------------------------------------------------------------------ files written */

/* Where writing `path` puts the file: path itself when nothing is there or a regular
 * file is, the file a symbolic link names when it names a regular file (the link stays a
 * link). A directory, a FIFO, a device, a socket or a dangling link is refused
 * (SP_ERR_IO, naming `what` and the path): nothing is ever renamed over them. */
static inline sp_status sp_output_target(const char *path, const char *what, char *out,
                                         size_t len)
{
    struct stat sb;
    if (!path || !*path) return sp_set_error(SP_ERR_IO, "no %s path given (an empty path)", what);
    if (lstat(path, &sb)) {
        if (errno != ENOENT && errno != ENOTDIR)
            return sp_set_error(SP_ERR_IO, "cannot write %s '%s': %s", what, path,
                                strerror(errno));
        sb.st_mode = S_IFREG; /* nothing there: it will be created (or fail to be) */
    } else if (S_ISLNK(sb.st_mode)) {
        char *real = realpath(path, NULL);
        if (!real)
            return sp_set_error(SP_ERR_IO, "cannot write %s '%s': it is a symbolic link to "
                                "nothing (%s); a link is followed only to a regular file",
                                what, path, strerror(errno));
        int bad = stat(real, &sb) || !S_ISREG(sb.st_mode) || strlen(real) >= len;
        if (!bad) snprintf(out, len, "%s", real);
        free(real);
        if (!bad) return SP_OK;
        if (!S_ISREG(sb.st_mode))
            return sp_set_error(SP_ERR_IO, "cannot write %s '%s': it is a symbolic link to %s; "
                                "a link is followed only to a regular file", what, path,
                                sp_file_kind(sb.st_mode));
        return sp_set_error(SP_ERR_IO, "cannot write %s '%s': the path it links to is too long",
                            what, path);
    }
    if (!S_ISREG(sb.st_mode))
        return sp_set_error(SP_ERR_IO, "%s '%s' is %s: cannot rename a file over it (only a "
                            "regular file, or a symbolic link to one, is replaced)", what, path,
                            sp_file_kind(sb.st_mode));
    if (strlen(path) >= len)
        return sp_set_error(SP_ERR_IO, "cannot write %s '%s': path too long", what, path);
    snprintf(out, len, "%s", path);
    return SP_OK;
}

/* Creates the temporary `target.tmp.<pid>` for writing (never opens anything that was
 * there: a stale regular temporary of this pid is removed first). fd, or -1 with errno. */
static inline int sp_output_tmp_open(const char *target, char *tmp, size_t len)
{
    if ((size_t)snprintf(tmp, len, "%s.tmp.%ld", target, (long)getpid()) >= len)
        return errno = ENAMETOOLONG, -1;
    for (int tries = 0; tries < 2; tries++) {
        int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0666);
        if (fd >= 0 || errno != EEXIST) return fd;
        struct stat sb;
        if (lstat(tmp, &sb) || !S_ISREG(sb.st_mode) || unlink(tmp)) return errno = EEXIST, -1;
    }
    return errno = EEXIST, -1;
}

/* At start-up, long before the output is written: the target is acceptable
 * (sp_output_target) and a file can be created beside it (one is, and removed). */
static inline sp_status sp_output_check(const char *path, const char *what)
{
    char target[PATH_MAX], tmp[PATH_MAX + 32];
    sp_status st = sp_output_target(path, what, target, sizeof target);
    if (st) return st;
    int fd = sp_output_tmp_open(target, tmp, sizeof tmp);
    if (fd < 0)
        return sp_set_error(SP_ERR_IO, "cannot write %s '%s': %s", what, path, strerror(errno));
    close(fd);
    unlink(tmp);
    return SP_OK;
}

/* A text output written atomically: sp_output_open, write to o.f, sp_output_commit (or
 * sp_output_abort). A crash or a full disk never leaves a half-written file under the
 * name asked for. */
typedef struct {
    FILE *f;
    char target[PATH_MAX], tmp[PATH_MAX + 32];
} sp_output;

static inline sp_status sp_output_open(sp_output *o, const char *path, const char *what)
{
    o->f = NULL;
    o->tmp[0] = 0;
    sp_status st = sp_output_target(path, what, o->target, sizeof o->target);
    if (st) return st;
    int fd = sp_output_tmp_open(o->target, o->tmp, sizeof o->tmp);
    if (fd < 0 || !(o->f = fdopen(fd, "w"))) {
        int e = errno;
        if (fd >= 0) close(fd), unlink(o->tmp);
        return sp_set_error(SP_ERR_IO, "cannot write %s '%s': %s", what, path, strerror(e));
    }
    return SP_OK;
}

static inline void sp_output_abort(sp_output *o)
{
    if (!o->f) return;
    fclose(o->f);
    unlink(o->tmp);
    o->f = NULL;
}

/* Closes the temporary and renames it over the target, checked again just before. */
static inline sp_status sp_output_commit(sp_output *o, const char *what)
{
    int bad = ferror(o->f) != 0;
    bad |= fclose(o->f) != 0;
    o->f = NULL;
    struct stat sb;
    if (!bad && !lstat(o->target, &sb) && !S_ISREG(sb.st_mode)) {
        unlink(o->tmp);
        return sp_set_error(SP_ERR_IO, "%s '%s' became %s while it was written: not replaced",
                            what, o->target, sp_file_kind(sb.st_mode));
    }
    if (!bad && rename(o->tmp, o->target) == 0) return SP_OK;
    int e = errno;
    unlink(o->tmp);
    return sp_set_error(SP_ERR_IO, "writing %s '%s' failed%s%s", what, o->target,
                        bad ? "" : ": ", bad ? "" : strerror(e));
}

#ifdef __cplusplus
}
#endif
#endif
