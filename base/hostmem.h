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

/* Large host buffers on transparent huge pages. Weights and activations of megabytes are
 * read a panel at a time across rows a few KB apart: on 4 KB pages each row is a TLB
 * miss. A buffer of SP_MEM_HUGE_MIN bytes or more starts on a 2 MB boundary
 * (SP_MEM_HUGE_PAGE) and asks for huge pages over its whole length before its first
 * touch: the runtime's host buffers (sp_exec_host_alloc) and bench_kernels' alike. */
#define SP_MEM_HUGE_PAGE ((size_t)2 << 20)
#define SP_MEM_HUGE_MIN ((size_t)4 << 20)

/* madvise(MADV_HUGEPAGE) on the 2 MB pages inside [p, p + bytes), for bytes >=
 * SP_MEM_HUGE_MIN. Where THP is "never", or the memory is a driver's pinned memory, the
 * call fails and nothing changes. */
void sp_mem_want_huge_pages(void *p, size_t bytes);

#endif
