/* StarPU's bus model measured by one process of a host at a time: a lock next to its
 * files, held from before starpu_init until the policy's start (startup.c). Relies on
 * StarPU's names for those files only. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "runtime/exec/exec_int.h"

/* ---- StarPU's bus model: measured by one process at a time ----
 * starpu_init measures the bus and writes its files (<home>/.starpu/sampling/bus/<host>.*)
 * when they are missing or describe other hardware, and processes sharing a StarPU home
 * do it at once, truncating and reading each other's files: in a fresh home, a rank read
 * an affinity file another rank was rewriting and aborted (CI; 4 runs in 15 with 8 ranks
 * here, tests/runtime/fresh_home.sh). So each process holds an exclusive lock next to
 * those files from before starpu_init until StarPU has loaded them; StarPU creates the
 * scheduling context right after that (core/workers.c), and our policy then calls the
 * context's sched_policy_init callback, sp_exec_bus_unlock. The lock covers separate jobs on the
 * host too, and the kernel drops it if the process dies. Start-up is serialised only
 * over StarPU's topology discovery and the bus files, before any worker or MPI thread. */
static int bus_lock_fd = -1;

void sp_exec_bus_unlock(unsigned ctx)
{
    (void)ctx;
    if (bus_lock_fd >= 0) {
        close(bus_lock_fd); /* releases the flock */
        bus_lock_fd = -1;
    }
}

/* Creates the folders of path (not its last component), as StarPU would: mode 0700. */
static void make_dirs(char *path)
{
    for (char *c = path + 1; *c; c++)
        if (*c == '/') {
            *c = 0;
            mkdir(path, 0700); /* EEXIST and the rest: open() below tells */
            *c = '/';
        }
}

/* The bus files' folder as StarPU itself names it (its path rules: STARPU_PERF_MODEL_DIR,
 * XDG_CACHE_HOME, STARPU_HOME, HOME, STARPU_HOSTNAME); "" when it cannot be read.
 * StarPU 1.4 names a folder only once some model folder holds a bus config: before that
 * (a fresh home) it prints "INVALID_LOCATION/<host>.affinity", and measures the bus into
 * its first model folder (perfmodel_bus.c, _starpu_bus_force_sampling: location 0), the
 * first that starpu_perfmodel_directory prints ("<folder>codelets/<n>/"); the lock is then
 * made there, where the later processes of the home find it once the config is written. */
static void bus_lock_path(char *path, size_t n)
{
    static const char invalid[] = "INVALID_LOCATION/";
    char *text = NULL, *dirs = NULL;
    size_t len = 0;
    path[0] = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f)
        return;
    starpu_bus_print_filenames(f); /* " affinity: <DIR/HOST.affinity>" among its lines */
    fclose(f);
    const char *a = text ? strstr(text, "affinity: <") : NULL;
    const char *e = a ? strstr(a, ".affinity>") : NULL;
    if (e) {
        a += strlen("affinity: <");
        if (strncmp(a, invalid, strlen(invalid)) != 0) {
            snprintf(path, n, "%.*s.starpipe-lock", (int)(e - a), a);
        } else if ((f = open_memstream(&dirs, &len))) {
            a += strlen(invalid); /* the host */
            starpu_perfmodel_directory(f);
            fclose(f);
            const char *d = dirs ? strstr(dirs, "directory: <") : NULL;
            const char *end = d ? strstr(d, "/>\n") : NULL, *c = NULL;
            if (end) { /* the last "codelets/" before the line's end */
                d += strlen("directory: <");
                for (const char *p = d; (p = strstr(p, "codelets/")) && p < end; p++)
                    c = p;
            }
            if (c) {
                snprintf(path, n, "%.*sbus/%.*s.starpipe-lock", (int)(c - d), d,
                         (int)(e - a), a);
                make_dirs(path);
            }
            free(dirs);
        }
    }
    free(text);
}

void sp_exec_bus_lock(void)
{
    char path[4096];
    bus_lock_path(path, sizeof path);
    if (!path[0])
        return;
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0)
        return; /* a read-only home: StarPU cannot write its files either, nothing races */
    while (flock(fd, LOCK_EX) != 0 && errno == EINTR) {}
    bus_lock_fd = fd;
}
