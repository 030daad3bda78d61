/* How much memory a job may still take on this host: what the machine has free, and the
 * limits a cluster job runs under (a cgroup's memory limit, as Slurm's --mem and systemd
 * set it; the process's RLIMIT_AS, as `ulimit -v` sets it). Internal (base/, not
 * installed). Pure C + POSIX + Linux's /proc and /sys. */
#ifndef STARPIPE_BASE_HOSTMEM_H
#define STARPIPE_BASE_HOSTMEM_H

#include <stddef.h>

/* Bytes this host can still give the job: the least of MemAvailable and, for each cgroup
 * of this process up its hierarchy (v2, or v1's memory controller), its limit less its
 * usage; `why` names the one that binds ("MemAvailable", "the cgroup limit of
 * /sys/fs/cgroup/... less its usage"). 0 when nothing is known. */
double sp_mem_available(char *why, size_t len);

/* The same, cgroups only, from the given /proc/self/cgroup and /proc/self/mountinfo
 * texts' files (tests hand it a made-up hierarchy); -1 when no cgroup limits memory. */
double sp_mem_cgroup_left(const char *cgroup_file, const char *mountinfo_file, char *why,
                          size_t len);

/* Bytes this process may still map: RLIMIT_AS less its current size (VmSize); -1 when
 * unlimited. */
double sp_mem_process_left(void);

#endif
