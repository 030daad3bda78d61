/* Numbers in strings, and files a user hands us: inputs read (regular files only,
 * bounded, never blocking on a FIFO) and outputs written atomically (a temporary beside
 * the target, renamed over it). Pure C + POSIX. */
#include "base/files.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ------------------------------------------------------------------ numbers */

/* The whole string is one integer in [lo, hi] (no space, nothing after it): 0, else -1. */
int sp_parse_int(const char *s, int64_t lo, int64_t hi, int64_t *out)
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
int sp_parse_double(const char *s, double lo, double hi, double *out)
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
size_t sp_utf8_seq(const unsigned char *p, size_t n)
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

/* ------------------------------------------------------------------ files read */

const char *sp_file_kind(mode_t m)
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
sp_status sp_file_read(const char *path, const char *what, size_t max,
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
sp_status sp_output_target(const char *path, const char *what, char *out,
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

/* The temporaries this process has open, for the signal handler below: a slot's path is
 * written before it is marked live, and a handler only reads live slots. */
enum { LIVE_TMPS = 8 };
static char live_tmp[LIVE_TMPS][PATH_MAX + 32];
static volatile sig_atomic_t live[LIVE_TMPS];

static void tmp_forget(const char *tmp)
{
    for (int i = 0; i < LIVE_TMPS; i++)
        if (live[i] && !strcmp(live_tmp[i], tmp)) live[i] = 0;
}

/* Creates the temporary `target.tmp.<pid>` for writing (never opens anything that was
 * there: a stale regular temporary of this pid is removed first). fd, or -1 with errno. */
int sp_output_tmp_open(const char *target, char *tmp, size_t len)
{
    if ((size_t)snprintf(tmp, len, "%s.tmp.%ld", target, (long)getpid()) >= len ||
        strlen(tmp) >= sizeof live_tmp[0])
        return errno = ENAMETOOLONG, -1;
    for (int tries = 0; tries < 2; tries++) {
        int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0666);
        if (fd >= 0) {
            for (int i = 0; i < LIVE_TMPS; i++)
                if (!live[i]) {
                    snprintf(live_tmp[i], sizeof live_tmp[i], "%s", tmp);
                    live[i] = 1;
                    break;
                }
            return fd;
        }
        if (errno != EEXIST) return fd;
        struct stat sb;
        if (lstat(tmp, &sb) || !S_ISREG(sb.st_mode) || unlink(tmp)) return errno = EEXIST, -1;
    }
    return errno = EEXIST, -1;
}

int sp_output_tmp_finish(const char *tmp, const char *target)
{
    int rc = target ? rename(tmp, target) : unlink(tmp);
    int e = errno;
    if (rc && target) unlink(tmp);
    tmp_forget(tmp);
    errno = e;
    return rc;
}

/* ------------------------------------------------------------------ signals */

static struct sigaction previous[NSIG];

/* Removes every live temporary (unlink is async-signal-safe), then lets the signal do
 * what it did before: end the process. */
static void remove_tmps_and_raise(int sig)
{
    for (int i = 0; i < LIVE_TMPS; i++)
        if (live[i]) unlink(live_tmp[i]);
    sigaction(sig, &previous[sig], NULL);
    raise(sig);
}

void sp_output_cleanup_on_signals(void)
{
    static const int sigs[] = { SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGALRM, SIGXCPU, SIGPIPE };
    for (size_t i = 0; i < sizeof sigs / sizeof *sigs; i++) {
        struct sigaction now, sa = { .sa_handler = remove_tmps_and_raise };
        sigemptyset(&sa.sa_mask);
        /* a signal someone else handles or ignores is left to them */
        if (sigaction(sigs[i], NULL, &now) || now.sa_handler != SIG_DFL ||
            (now.sa_flags & SA_SIGINFO))
            continue;
        previous[sigs[i]] = now;
        sigaction(sigs[i], &sa, NULL);
    }
}

/* ------------------------------------------------------------------ identity */

/* dev:ino of the file at path (following links), or its absolute path with its directory
 * resolved when nothing is there yet: two names of one file give the same key. */
static void file_key(const char *path, char *key, size_t len)
{
    struct stat sb;
    if (!stat(path, &sb)) {
        snprintf(key, len, "inode %llu:%llu", (unsigned long long)sb.st_dev,
                 (unsigned long long)sb.st_ino);
        return;
    }
    char dir[PATH_MAX], *slash = strrchr(path, '/'), *real;
    snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash - path) + 1 : 1, slash ? path : ".");
    const char *base = slash ? slash + 1 : path;
    if ((real = realpath(dir, NULL))) {
        snprintf(key, len, "path %s/%s", real, base);
        free(real);
    } else {
        snprintf(key, len, "path %s", path);
    }
}

int sp_same_file(const char *a, const char *b)
{
    char ka[PATH_MAX + 64], kb[PATH_MAX + 64];
    file_key(a, ka, sizeof ka);
    file_key(b, kb, sizeof kb);
    return !strcmp(ka, kb);
}

/* At start-up, long before the output is written: the target is acceptable
 * (sp_output_target) and a file can be created beside it (one is, and removed). */
sp_status sp_output_check(const char *path, const char *what)
{
    char target[PATH_MAX], tmp[PATH_MAX + 32];
    sp_status st = sp_output_target(path, what, target, sizeof target);
    if (st) return st;
    int fd = sp_output_tmp_open(target, tmp, sizeof tmp);
    if (fd < 0)
        return sp_set_error(SP_ERR_IO, "cannot write %s '%s': %s", what, path, strerror(errno));
    close(fd);
    sp_output_tmp_finish(tmp, NULL);
    return SP_OK;
}

sp_status sp_output_open(sp_output *o, const char *path, const char *what)
{
    o->f = NULL;
    o->tmp[0] = 0;
    sp_status st = sp_output_target(path, what, o->target, sizeof o->target);
    if (st) return st;
    int fd = sp_output_tmp_open(o->target, o->tmp, sizeof o->tmp);
    if (fd < 0 || !(o->f = fdopen(fd, "w"))) {
        int e = errno;
        if (fd >= 0) close(fd), sp_output_tmp_finish(o->tmp, NULL);
        return sp_set_error(SP_ERR_IO, "cannot write %s '%s': %s", what, path, strerror(e));
    }
    return SP_OK;
}

void sp_output_abort(sp_output *o)
{
    if (!o->f) return;
    fclose(o->f);
    sp_output_tmp_finish(o->tmp, NULL);
    o->f = NULL;
}

/* Closes the temporary and renames it over the target, checked again just before. */
sp_status sp_output_commit(sp_output *o, const char *what)
{
    int bad = ferror(o->f) != 0;
    bad |= fclose(o->f) != 0;
    o->f = NULL;
    struct stat sb;
    if (!bad && !lstat(o->target, &sb) && !S_ISREG(sb.st_mode)) {
        sp_output_tmp_finish(o->tmp, NULL);
        return sp_set_error(SP_ERR_IO, "%s '%s' became %s while it was written: not replaced",
                            what, o->target, sp_file_kind(sb.st_mode));
    }
    if (!bad && sp_output_tmp_finish(o->tmp, o->target) == 0) return SP_OK;
    int e = errno;
    if (bad) sp_output_tmp_finish(o->tmp, NULL);
    return sp_set_error(SP_ERR_IO, "writing %s '%s' failed%s%s", what, o->target,
                        bad ? "" : ": ", bad ? "" : strerror(e));
}
