/* Which ranks NCCL refuses to put in one communicator (comm/nccl_peers.c): two ranks on
 * the same GPU of the same host. Host and GPU are identified as NCCL identifies them, so
 * that the transport turns NCCL off exactly where ncclCommInitRank would fail, and never
 * between nodes whose GPUs merely have the same bus ids. Pure functions, no MPI or CUDA;
 * one reader of this process's identity. For comm/ (the NCCL transport), its tests, and the
 * runtime's device memory check (runtime/devmem.c: ranks NCCL would see on one GPU share
 * its memory). */
#ifndef STARPIPE_COMM_NCCL_PEERS_H
#define STARPIPE_COMM_NCCL_PEERS_H

#include <stddef.h>
#include <stdint.h>

/* NCCL's own buffer for the host string (getHostHashOnce: char hostHash[1024]), so that a
 * long NCCL_HOSTID is cut where NCCL cuts it. */
#define SP_NCCL_HOST_KEY 1024

/* One rank's GPU as NCCL sees it. */
typedef struct {
    char key[SP_NCCL_HOST_KEY]; /* the string NCCL hashes into its host hash */
    char host[64];              /* for messages: the hostname, or NCCL_HOSTID's value */
    char bus[32];               /* the PCI bus id (cudaDeviceGetPCIBusId) */
} sp_nccl_peer;

/* NCCL's host string: NCCL_HOSTID's value alone when it is set (hostid non-NULL, even
 * empty), else the whole hostname followed by the first word of boot_id (NULL or empty:
 * the hostname alone), cut to len - 1 characters. */
void sp_nccl_host_key(const char *hostname, const char *boot_id, const char *hostid, char *key,
                      size_t len);

/* A bus id as NCCL compares it (busIdToInt64): its hex digits as one number, ':' and '.'
 * skipped, up to the first other character; so "0000:FA:01.0" and "00000000:fa:01.0" are
 * the same GPU. */
int64_t sp_nccl_bus_number(const char *bus);

/* The first pair of the n ranks (a < b) with the same host key and the same bus number:
 * returns 1 and sets *a and *b; 0 when NCCL accepts them all. */
int sp_nccl_duplicate(const sp_nccl_peer *peer, int n, int *a, int *b);

/* The value of name in an NCCL configuration file (lines NAME=VALUE, '#' comments), as
 * NCCL reads it: 1 and the value in out, or 0 (no file, or no such line). */
int sp_nccl_conf_value(const char *path, const char *name, char *out, size_t len);

/* This process: its hostname, /proc/sys/kernel/random/boot_id and NCCL_HOSTID (the
 * environment, else NCCL's configuration files), with bus its GPU's bus id. */
void sp_nccl_peer_local(const char *bus, sp_nccl_peer *out);

#endif
