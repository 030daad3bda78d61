/* Atomic writes: a failed write (directory not writable, target is a directory, the file
 * size limit hit mid-write, bad arguments) returns an error, leaves the previous file
 * byte for byte and no temporary behind; a successful overwrite replaces the file. As
 * root the unwritable-directory case runs in a child that drops to uid/gid 65534, since
 * root writes anywhere. */
#include <errno.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>

#include "ck.h"
#include "fixture.h"

static char path[700];
static const char *keep[] = {"ckpt.safetensors", "sub", NULL};

static void write_version(sp_st_tensor *t, int version)
{
    char step[16];
    snprintf(step, sizeof step, "%d", version);
    sp_st_meta m = {"step", step};
    REQUIRE(sp_safetensors_write(path, t, FX_N, &m, 1, SP_ST_CHECKSUM) == SP_OK, "v%d: %s",
            version, sp_last_error());
}

static int version_of(const char *p)
{
    sp_status st;
    sp_safetensors *f = sp_safetensors_open(p, SP_ST_REQUIRE_CHECKSUM, &st);
    const char *s = f ? sp_safetensors_meta(f, "step") : NULL;
    int v = s ? atoi(s) : -1;
    sp_safetensors_close(f);
    return v;
}

/* Runs fn in a child; its exit code (77 means it could not set itself up). */
static int in_child(int (*fn)(sp_st_tensor *), sp_st_tensor *t)
{
    fflush(NULL);
    pid_t pid = fork();
    REQUIRE(pid >= 0, "fork failed");
    if (pid == 0) _exit(fn(t));
    int ws;
    REQUIRE(waitpid(pid, &ws, 0) == pid, "waitpid failed");
    return WIFEXITED(ws) ? WEXITSTATUS(ws) : 128 + WTERMSIG(ws);
}

static int unwritable_dir_child(sp_st_tensor *t)
{
    if (geteuid() == 0 && (setgid(65534) || setuid(65534))) return 77;
    sp_st_meta m = {"step", "3"};
    sp_status st = sp_safetensors_write(path, t, FX_N, &m, 1, SP_ST_CHECKSUM);
    if (st != SP_ERR_IO || !strstr(sp_last_error(), "cannot create the temporary file")) {
        fprintf(stderr, "unwritable dir: %s \"%s\"\n", sp_status_name(st), sp_last_error());
        return 1;
    }
    return 0;
}

static int fsize_limit_child(sp_st_tensor *t)
{
    /* the header fits, the data does not: the failure comes mid-write */
    struct rlimit rl = {600, 600};
    signal(SIGXFSZ, SIG_IGN);
    if (setrlimit(RLIMIT_FSIZE, &rl)) return 77;
    sp_st_meta m = {"step", "4"};
    sp_status st = sp_safetensors_write(path, t, FX_N, &m, 1, SP_ST_CHECKSUM);
    if (st != SP_ERR_IO || !strstr(sp_last_error(), "temporary file")) {
        fprintf(stderr, "file size limit: %s \"%s\"\n", sp_status_name(st), sp_last_error());
        return 1;
    }
    return 0;
}

int main(void)
{
    const char *dir = ck_tmpdir("atomic");
    snprintf(path, sizeof path, "%s/ckpt.safetensors", dir);
    sp_st_tensor t[FX_N];
    fx_make(t);

    write_version(t, 1);
    CHECK(version_of(path) == 1, "first write");
    write_version(t, 2);
    CHECK(version_of(path) == 2, "a successful overwrite replaces the file");
    CHECK(ck_stray_files(dir, keep) == 0, "temporary left after success");
    size_t n2;
    unsigned char *v2 = ck_read(path, &n2);

    /* 1. the directory is not writable */
    REQUIRE(chmod(dir, 0555) == 0, "chmod");
    int rc = in_child(unwritable_dir_child, t);
    REQUIRE(chmod(dir, 0700) == 0, "chmod");
    if (rc == 77)
        printf("SKIP part: running as root and cannot drop to uid 65534, so no unwritable "
               "directory to test\n");
    else
        CHECK(rc == 0, "unwritable directory: child exit %d", rc);

    /* 2. the temporary is written, then the rename fails: the target is a directory */
    char sub[800];
    snprintf(sub, sizeof sub, "%s/sub", dir);
    REQUIRE(mkdir(sub, 0700) == 0, "mkdir");
    char inner[900];
    snprintf(inner, sizeof inner, "%s/keep", sub);
    ck_write(inner, "x", 1);
    sp_status st = sp_safetensors_write(sub, t, FX_N, NULL, 0, 0);
    CHECK(st == SP_ERR_IO && strstr(sp_last_error(), "cannot rename"), "rename over a directory: %s %s",
          sp_status_name(st), sp_last_error());
    struct stat sb;
    CHECK(stat(sub, &sb) == 0 && S_ISDIR(sb.st_mode), "the directory must survive");

    /* 3. the file size limit stops the write half way */
    rc = in_child(fsize_limit_child, t);
    if (rc == 77) printf("SKIP part: cannot set RLIMIT_FSIZE\n");
    else CHECK(rc == 0, "mid-write failure: child exit %d", rc);

    /* 4. a missing directory, and bad arguments */
    char nodir[800];
    snprintf(nodir, sizeof nodir, "%s/no/such/dir.safetensors", dir);
    st = sp_safetensors_write(nodir, t, FX_N, NULL, 0, 0);
    CHECK(st == SP_ERR_IO && strstr(sp_last_error(), "No such file"), "missing dir: %s",
          sp_last_error());
    sp_st_tensor twice[2] = {t[0], t[0]};
    CHECK(sp_safetensors_write(path, twice, 2, NULL, 0, 0) == SP_ERR_ARG, "duplicate names");

    /* after all that, version 2 is there byte for byte, and nothing else */
    size_t n;
    unsigned char *now = ck_read(path, &n);
    CHECK(n == n2 && !memcmp(now, v2, n), "the previous file changed after failed writes");
    CHECK(version_of(path) == 2, "the previous file must still read as version 2");
    CHECK(ck_stray_files(dir, keep) == 0, "temporary left after a failure");
    const char *sub_keep[] = {"keep", NULL};
    CHECK(ck_stray_files(sub, sub_keep) == 0, "stray file in the directory target");
    free(now);
    free(v2);

    write_version(t, 5);
    CHECK(version_of(path) == 5, "a write after failures succeeds");
    CHECK(ck_stray_files(dir, keep) == 0, "temporary left after success");
    fx_free(t);
    return ck_summary("ckpt.atomic");
}
