/* Numbers in strings and files a user hands us, checked as strictly as flags: files read
 * (regular files only, bounded) and files written (a temporary beside the target, renamed
 * over it; never over a device, a FIFO or a directory; a symbolic link is followed to the
 * regular file it names, which is replaced, and stays a link). Internal to the project
 * (base/, not installed): the library's layers and the apps share it. Pure C + POSIX.
 *
 *   char *text; size_t n;
 *   sp_status st = sp_file_read(path, "schedule file", 1 << 20, &text, &n);
 */
#ifndef STARPIPE_BASE_FILES_H
#define STARPIPE_BASE_FILES_H

#include <limits.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#include "starpipe/status.h"

/* The whole string is one integer in [lo, hi] (no space, nothing after it): 0, else -1. */
int sp_parse_int(const char *s, int64_t lo, int64_t hi, int64_t *out);
/* The whole string is one finite number in [lo, hi] ("nan", "inf" refused): 0, else -1. */
int sp_parse_double(const char *s, double lo, double hi, double *out);
/* Length of the valid UTF-8 sequence at p (at most n bytes), 0 if invalid: no overlong
 * forms, no surrogates, nothing above U+10FFFF. */
size_t sp_utf8_seq(const unsigned char *p, size_t n);

/* "a directory", "a FIFO", ... for messages. */
const char *sp_file_kind(mode_t m);
/* Reads the whole regular file at path, at most max bytes, into *data (NUL-terminated,
 * free() it; *n bytes before the NUL). What is not a regular file (a FIFO, a socket, a
 * device, a directory) is refused without blocking, and so is a file over max bytes,
 * or one that grows past max while read. `what` names the file in messages
 * ("data file"). SP_ERR_IO or SP_ERR_NOMEM. */
sp_status sp_file_read(const char *path, const char *what, size_t max, char **data, size_t *n);

/* Where writing `path` puts the file: path itself when nothing is there or a regular
 * file is, the file a symbolic link names when it names a regular file (the link stays a
 * link). A directory, a FIFO, a device, a socket or a dangling link is refused
 * (SP_ERR_IO, naming `what` and the path): nothing is ever renamed over them. */
sp_status sp_output_target(const char *path, const char *what, char *out, size_t len);
/* Creates the temporary `target.tmp.<pid>` for writing (never opens anything that was
 * there: a stale regular temporary of this pid is removed first). fd, or -1 with errno. */
int sp_output_tmp_open(const char *target, char *tmp, size_t len);
/* Ends a temporary of sp_output_tmp_open: renamed over target (removed if that fails), or
 * removed (target NULL). 0, or -1 with errno. */
int sp_output_tmp_finish(const char *tmp, const char *target);
/* Installs handlers for the signals that end a process (SIGTERM, as scancel and a Slurm
 * time limit send, SIGINT, SIGHUP, ...; those still at their default action) that remove
 * every temporary this process has open, then end it as before: a signal during a save
 * leaves the last complete file and no temporary beside it. */
void sp_output_cleanup_on_signals(void);

/* Whether two paths name one file: the same device and inode where the file exists, the
 * same resolved path otherwise (a file about to be created). */
int sp_same_file(const char *a, const char *b);
/* At start-up, long before the output is written: the target is acceptable
 * (sp_output_target) and a file can be created beside it (one is, and removed). */
sp_status sp_output_check(const char *path, const char *what);

/* A text output written atomically: sp_output_open, write to o.f, sp_output_commit (or
 * sp_output_abort). A crash or a full disk never leaves a half-written file under the
 * name asked for. */
typedef struct {
    FILE *f;
    char target[PATH_MAX], tmp[PATH_MAX + 32];
} sp_output;

sp_status sp_output_open(sp_output *o, const char *path, const char *what);
void sp_output_abort(sp_output *o);
/* Closes the temporary and renames it over the target, checked again just before. */
sp_status sp_output_commit(sp_output *o, const char *what);

#endif
