/* Shared helpers of the checkpoint tests: CHECK/REQUIRE that count and fail loudly, a
 * scratch directory removed at exit, whole-file read/write, and "is this file refused
 * with this code and this message" checks. */
#ifndef STARPIPE_TEST_CK_H
#define STARPIPE_TEST_CK_H

#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "starpipe/safetensors.h"

#include "tests/check.h"

static inline int ck_summary(const char *name) { return check_summary(name); }

static char ck_dir[512];

/* Removes a tree (the scratch directories hold files and at most a level of folders). */
static void ck_rm_tree(const char *path)
{
    struct stat sb;
    if (lstat(path, &sb)) return;
    if (S_ISDIR(sb.st_mode)) {
        chmod(path, 0700);
        DIR *d = opendir(path);
        for (struct dirent *e; d && (e = readdir(d));) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
            char sub[1024];
            snprintf(sub, sizeof sub, "%s/%s", path, e->d_name);
            ck_rm_tree(sub);
        }
        if (d) closedir(d);
    }
    remove(path);
}

static void ck_rm_dir(void)
{
    if (ck_dir[0]) ck_rm_tree(ck_dir);
}

/* A file in the scratch directory of ck_tmpdir (eight results stay valid at once). */
static inline const char *ck_at(const char *name) { return check_path(ck_dir, name); }

/* A fresh scratch directory, removed at exit. */
static inline const char *ck_tmpdir(const char *tag)
{
    const char *base = getenv("TMPDIR");
    snprintf(ck_dir, sizeof ck_dir, "%s/sp_ckpt_%s_XXXXXX", base && *base ? base : "/tmp", tag);
    REQUIRE(mkdtemp(ck_dir), "mkdtemp %s failed", ck_dir);
    atexit(ck_rm_dir);
    return ck_dir;
}

static inline unsigned char *ck_read(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    REQUIRE(f, "cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc(sz ? (size_t)sz : 1);
    REQUIRE(b && fread(b, 1, (size_t)sz, f) == (size_t)sz, "cannot read %s", path);
    fclose(f);
    *n = (size_t)sz;
    return b;
}

static inline void ck_write(const char *path, const void *b, size_t n)
{
    FILE *f = fopen(path, "wb");
    REQUIRE(f && fwrite(b, 1, n, f) == n && fclose(f) == 0, "cannot write %s", path);
}

/* A file from a header (used as is) and a data section. */
static inline void ck_write_st(const char *path, const char *json, const void *data, size_t nd)
{
    size_t nj = strlen(json);
    unsigned char *b = malloc(8 + nj + nd + 1);
    for (int k = 0; k < 8; k++) b[k] = (unsigned char)((uint64_t)nj >> (8 * k));
    memcpy(b + 8, json, nj);
    if (nd) memcpy(b + 8 + nj, data, nd);
    ck_write(path, b, 8 + nj + nd);
    free(b);
}

/* Checks that opening path fails with code and a message containing want (if given);
 * returns 1 when it does. */
#define CHECK_REFUSED(path, code, want)                                                    \
    ck_refused(__FILE__, __LINE__, (path), (code), (want))
static inline int ck_refused(const char *file, int line, const char *path, sp_status code,
                             const char *want)
{
    sp_status st = SP_OK;
    sp_clear_error();
    sp_safetensors *f = sp_safetensors_open(path, 0, &st);
    const char *msg = sp_last_error();
    int ok = !f && st == code && msg[0] && (!want || strstr(msg, want));
    check_count++;
    if (getenv("CK_VERBOSE")) printf("  %s\n", msg);
    if (!ok) {
        check_failures++;
        fprintf(stderr, "FAIL %s:%d: %s: expected %s with \"%s\", got %s, %s: \"%s\"\n", file,
                line, path, sp_status_name(code), want ? want : "", f ? "a handle" : "NULL",
                sp_status_name(st), msg);
    }
    sp_safetensors_close(f);
    return ok;
}

/* Files in dir other than those named keep (NULL-terminated). */
static inline int ck_stray_files(const char *dir, const char *const *keep)
{
    DIR *d = opendir(dir);
    REQUIRE(d, "cannot list %s", dir);
    int n = 0;
    for (struct dirent *e; (e = readdir(d));) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        int kept = 0;
        for (const char *const *k = keep; *k; k++) kept |= !strcmp(*k, e->d_name);
        if (!kept) {
            fprintf(stderr, "stray file in %s: %s\n", dir, e->d_name);
            n++;
        }
    }
    closedir(d);
    return n;
}

#endif
