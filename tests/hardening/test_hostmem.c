/* What memory a job may take (base/hostmem.c) and whether two paths are one file
 * (base/files.c), on made-up cgroup hierarchies: v2 with a limit on an ancestor tighter
 * than the job's own, v1's memory controller among others with a mount root that is not
 * "/", "max" and v1's near-2^63 "no limit", and none at all. */
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/files.h"
#include "base/hostmem.h"
#include "tests/check.h"
#include "tests/hardening/scratch.h"

static void put(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    REQUIRE(f && fputs(text, f) >= 0 && fclose(f) == 0, "writing %s", path);
}

static void mkdirs(const char *path)
{
    char cmd[700];
    snprintf(cmd, sizeof cmd, "mkdir -p '%s'", path);
    REQUIRE(system(cmd) == 0, "%s", cmd);
}

int main(void)
{
    scratch_open("hostmem");
    char line[2048], why[4096];

    /* cgroup v2: /job (memory.max 8 GB, 5 GB used) holds /job/step (max, 1 GB used) */
    mkdirs(at("v2/job/step"));
    put(at("v2/job/memory.max"), "8000000000\n");
    put(at("v2/job/memory.current"), "5000000000\n");
    put(at("v2/job/step/memory.max"), "max\n");
    put(at("v2/job/step/memory.current"), "1000000000\n");
    put(at("cg2"), "0::/job/step\n");
    snprintf(line, sizeof line, "30 23 0:26 / %s rw,nosuid - cgroup2 cgroup2 rw\n", at("v2"));
    put(at("mi2"), line);
    double left = sp_mem_cgroup_left(at("cg2"), at("mi2"), why, sizeof why);
    CHECK(left == 3e9, "v2: %.0f bytes left, want 3e9 (the ancestor binds)", left);
    CHECK(strstr(why, "/v2/job (memory.max)") != NULL, "v2: why '%s'", why);

    /* the step's own limit tighter than its ancestor's room */
    put(at("v2/job/step/memory.max"), "1500000000\n");
    left = sp_mem_cgroup_left(at("cg2"), at("mi2"), why, sizeof why);
    CHECK(left == 5e8, "v2: %.0f bytes left, want 5e8 (the step binds)", left);
    CHECK(strstr(why, "/v2/job/step (memory.max)") != NULL, "v2: why '%s'", why);

    /* cgroup v1: the memory controller mounted with root /slurm, among cpu's */
    mkdirs(at("v1mem/uid_0/job_7"));
    put(at("v1mem/uid_0/job_7/memory.limit_in_bytes"), "2147483648\n");
    put(at("v1mem/uid_0/job_7/memory.usage_in_bytes"), "1073741824\n");
    put(at("v1mem/uid_0/memory.limit_in_bytes"), "9223372036854771712\n"); /* no limit */
    put(at("v1mem/uid_0/memory.usage_in_bytes"), "4000000000\n");
    put(at("cg1"), "5:cpu,cpuacct:/slurm/uid_0/job_7\n4:memory:/slurm/uid_0/job_7\n0::/\n");
    snprintf(line, sizeof line,
             "31 23 0:27 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu,cpuacct\n"
             "32 23 0:28 /slurm %s rw - cgroup cgroup rw,memory\n", at("v1mem"));
    put(at("mi1"), line);
    left = sp_mem_cgroup_left(at("cg1"), at("mi1"), why, sizeof why);
    CHECK(left == 1073741824.0, "v1: %.0f bytes left, want 1 GiB", left);
    CHECK(strstr(why, "/v1mem/uid_0/job_7 (memory.limit_in_bytes)") != NULL, "v1: why '%s'", why);

    /* no limit anywhere, or no hierarchy: unknown (-1), never 0 */
    put(at("v2/job/memory.max"), "max\n");
    put(at("v2/job/step/memory.max"), "max\n");
    CHECK(sp_mem_cgroup_left(at("cg2"), at("mi2"), why, sizeof why) == -1, "v2 without limits");
    CHECK(sp_mem_cgroup_left(at("none"), at("mi2"), why, sizeof why) == -1, "no cgroup file");
    CHECK(sp_mem_available(why, sizeof why) > 0, "this machine has memory (%s)", why);

    /* one file under two names; a file not there yet by its resolved path */
    put(at("f"), "x");
    REQUIRE(symlink("f", at("l")) == 0, "symlink");
    REQUIRE(link(at("f"), at("h")) == 0, "hard link");
    mkdirs(at("d"));
    char dotted[600];
    snprintf(dotted, sizeof dotted, "%s/d/../f", dir);
    CHECK(sp_same_file(at("f"), at("l")), "a symbolic link is its file");
    CHECK(sp_same_file(at("f"), at("h")), "a hard link is its file");
    CHECK(sp_same_file(at("f"), dotted), "d/../f is f");
    snprintf(dotted, sizeof dotted, "%s/d/../new", dir);
    CHECK(sp_same_file(at("new"), dotted), "a file to be created, by its resolved path");
    CHECK(!sp_same_file(at("new"), at("f")), "two files are two");
    CHECK(!sp_same_file(at("new"), at("d/new")), "same name, other folder");

    scratch_close();
    return check_summary("hardening.test_hostmem");
}
