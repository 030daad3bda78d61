/* Paths that are not regular files, through every reader and writer of the library:
 * writers (checkpoints, traces, SVGs, schedule files) never replace or write into a FIFO,
 * a device node or a directory, follow a symbolic link to the regular file it names
 * (the link stays a link) and refuse one to anything else; readers (data, schedules,
 * checkpoints) refuse a FIFO without waiting for a writer, a device without reading it,
 * and a file over their limit without reading it. An alarm turns a hang into a failure.
 * Run as root (CI is) for the device node; otherwise that part is skipped. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "starpipe/data.h"
#include "starpipe/plan.h"
#include "starpipe/safetensors.h"
#include "tests/check.h"
#include "tests/hardening/scratch.h"


static mode_t kind_of(const char *path)
{
    struct stat sb;
    return lstat(path, &sb) ? 0 : (sb.st_mode & S_IFMT);
}

static void on_alarm(int sig)
{
    (void)sig;
    static const char msg[] = "FAIL: a read or write of a special file hung (alarm)\n";
    if (write(2, msg, sizeof msg - 1)) {}
    _exit(1);
}

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    REQUIRE(f && fputs(text, f) >= 0 && !fclose(f), "cannot write %s", path);
}

/* The writers, each aimed at `path`: SP_OK or an error. */
typedef sp_status (*writer)(const char *path);
static sp_plan *plan;
static sp_sim_result *res;
static sp_schedule *sched;
static sp_status w_ckpt(const char *path)
{
    static const int64_t shape[1] = { 3 };
    static const float v[3] = { 1, 2, 3 };
    sp_st_tensor t = { "w", SP_ST_F32, 1, shape, v };
    return sp_safetensors_write(path, &t, 1, NULL, 0, SP_ST_CHECKSUM);
}
static sp_status w_trace(const char *path) { return sp_sim_write_trace(plan, res, path); }
static sp_status w_svg(const char *path) { return sp_sim_write_svg(plan, res, path); }
static sp_status w_sched(const char *path) { return sp_schedule_save(sched, path); }

/* No file of ours left beside a target (temporaries are removed on failure). */
static int strays(void)
{
    char cmd[600];
    snprintf(cmd, sizeof cmd, "ls -a '%s' | grep -c '\\.tmp\\.' >/dev/null", dir);
    return system(cmd) == 0;
}

int main(void)
{
    signal(SIGALRM, on_alarm);
    alarm(20);
    scratch_open("paths");
    REQUIRE(mkfifo(at("fifo"), 0600) == 0, "mkfifo");
    REQUIRE(mkdir(at("dir"), 0700) == 0, "mkdir");
    int have_dev = mknod(at("dev"), S_IFCHR | 0600, makedev(1, 3)) == 0; /* like /dev/null */
    if (!have_dev) printf("SKIP part: mknod needs root (%s)\n", strerror(errno));
    write_file(at("real"), "old\n");
    REQUIRE(symlink("real", at("link")) == 0, "symlink");
    REQUIRE(symlink("fifo", at("link_fifo")) == 0, "symlink");
    REQUIRE(symlink("dir", at("link_dir")) == 0, "symlink");
    REQUIRE(symlink("nowhere", at("dangling")) == 0, "symlink");

    sp_stage_model *model = sp_stage_model_chain(2, 1, 1, 1, 16);
    REQUIRE(model && sp_schedule_builtin("1f1b", 2, 4, 0, &sched) == SP_OK &&
                sp_plan_build(model, sched, &plan) == SP_OK &&
                sp_simulate(plan, model, NULL, &res) == SP_OK,
            "setup: %s", sp_last_error());

    /* 1. writers */
    const struct { const char *name; writer w; } writers[] = {
        { "checkpoint", w_ckpt }, { "trace", w_trace }, { "svg", w_svg }, { "schedule", w_sched } };
    const struct { const char *target; mode_t kind; } bad[] = {
        { "fifo", S_IFIFO }, { "dir", S_IFDIR }, { "dev", S_IFCHR }, { "link_fifo", S_IFLNK },
        { "link_dir", S_IFLNK }, { "dangling", S_IFLNK } };
    for (size_t w = 0; w < sizeof writers / sizeof *writers; w++) {
        for (size_t b = 0; b < sizeof bad / sizeof *bad; b++) {
            if (!have_dev && bad[b].kind == S_IFCHR) continue;
            sp_status st = writers[w].w(at(bad[b].target));
            CHECK(st == SP_ERR_IO, "%s to %s: %s, not refused (%s)", writers[w].name,
                  bad[b].target, sp_status_name(st), sp_last_error());
            CHECK(kind_of(at(bad[b].target)) == bad[b].kind, "%s to %s: the %s was replaced",
                  writers[w].name, bad[b].target, bad[b].target);
        }
        CHECK(kind_of(at("fifo")) == S_IFIFO && kind_of(at("link_fifo")) == S_IFLNK,
              "%s: the FIFO or the link to it changed", writers[w].name);
        /* a link to a regular file is followed: the file is replaced, the link stays */
        write_file(at("real"), "old\n");
        sp_status st = writers[w].w(at("link"));
        CHECK(st == SP_OK, "%s through a link: %s", writers[w].name, sp_last_error());
        CHECK(kind_of(at("link")) == S_IFLNK, "%s: the link became a regular file",
              writers[w].name);
        struct stat sb;
        CHECK(!stat(at("real"), &sb) && sb.st_size > 4, "%s: the linked file was not written",
              writers[w].name);
        CHECK(!strays(), "%s: a temporary file left behind", writers[w].name);
    }
    if (have_dev) {
        struct stat sb;
        CHECK(!stat(at("dev"), &sb) && S_ISCHR(sb.st_mode) && major(sb.st_rdev) == 1 &&
                  minor(sb.st_rdev) == 3, "the device node was replaced");
    }

    /* 2. readers: a FIFO with no writer, devices that never end, a directory */
    const char *sources[] = { at("fifo"), "/dev/zero", "/dev/urandom", at("dir"), at("link_fifo") };
    for (size_t k = 0; k < sizeof sources / sizeof *sources; k++) {
        sp_status st;
        sp_text *t = sp_text_load(sources[k], 8, &st);
        CHECK(!t && st == SP_ERR_IO && strstr(sp_last_error(), "not a regular file"),
              "data file %s: %s", sources[k], sp_last_error());
        sp_text_free(t);
        sp_schedule *s = NULL;
        st = sp_schedule_load(sources[k], &s);
        CHECK(!s && st == SP_ERR_IO && strstr(sp_last_error(), "not a regular file"),
              "schedule file %s: %s", sources[k], sp_last_error());
        sp_safetensors *f = sp_safetensors_open(sources[k], 0, &st);
        CHECK(!f && st == SP_ERR_IO, "checkpoint %s: %s", sources[k], sp_last_error());
        sp_safetensors_close(f);
    }
    /* files over the limit are refused by their size, before a byte is read (sparse) */
    FILE *big = fopen(at("big"), "w");
    REQUIRE(big && !ftruncate(fileno(big), (off_t)SP_TEXT_MAX_BYTES + 1) && !fclose(big),
            "sparse file");
    sp_status st;
    sp_text *t = sp_text_load(at("big"), 8, &st);
    CHECK(!t && st == SP_ERR_IO && strstr(sp_last_error(), "over the limit"), "big data: %s",
          sp_last_error());
    sp_schedule *s = NULL;
    st = sp_schedule_load(at("big"), &s);
    CHECK(!s && st == SP_ERR_IO && strstr(sp_last_error(), "over the limit"),
          "big schedule: %s", sp_last_error());
    /* a data file through a link to a regular file is read */
    write_file(at("text"), "0123456789abcdef0123456789abcdef");
    REQUIRE(symlink("text", at("link_text")) == 0, "symlink");
    t = sp_text_load(at("link_text"), 8, &st);
    CHECK(t && sp_text_size(t) == 32, "data through a link: %s", sp_last_error());
    sp_text_free(t);

    sp_sim_result_free(res);
    sp_plan_free(plan);
    sp_schedule_free(sched);
    sp_stage_model_free(model);
    scratch_close();
    return check_summary("hardening.paths");
}
