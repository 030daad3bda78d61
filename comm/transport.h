/* The transports: how the pipeline's messages move between ranks, behind one table that
 * the executor (runtime/exec/) drives and never looks past. Three implementations:
 *
 *   sp_transport_starpu_mpi  StarPU-MPI's detached sends (of private copies, stage.h)
 *                            and receives, progressed by its own thread (starpu_mpi.c;
 *                            the default, as specified)
 *   sp_transport_direct      plain MPI requests, posted by the task that wrote the data and
 *                            tested by the rank's idle workers (direct.c)
 *   sp_transport_nccl        NCCL between GPU ranks: a group of messages as one task of
 *                            the rank's order, on a stream of its own (nccl.c)
 *
 * A rank has one host transport (starpu-mpi or direct: every message it posts one by one)
 * and at most one group transport (NCCL: large GPU-to-GPU messages, grouped in the plan's
 * global order). Entries marked optional may be NULL; the executor checks only that.
 * comm/ sits below the runtime: it may use StarPU, StarPU-MPI, MPI, NCCL, the kernels'
 * device (starpipe/backend.h) and base/, never a runtime header. */
#ifndef STARPIPE_COMM_TRANSPORT_H
#define STARPIPE_COMM_TRANSPORT_H

#include <stddef.h>
#include <stdint.h>

#include <mpi.h>
#include <starpu.h>

#include "starpipe/backend.h" /* sp_device, sp_task_fn */
#include "starpipe/stages.h"  /* sp_access_mode */
#include "starpipe/status.h"

/* One message: the buffer h (count elements of elemsize bytes) to (is_send) or from
 * world rank peer, as message msg of the step (the plan's number, the same on both
 * sides; unique within the step for the pair). */
typedef struct {
    starpu_data_handle_t h;
    size_t count, elemsize;
    int peer, is_send;
    uint32_t msg;
} sp_xfer;

/* Runs once per message when it is complete, on the thread that saw it: err is NULL, or
 * one line saying what failed (the buffer is released either way). */
typedef void (*sp_xfer_done)(void *arg, const char *err);

/* A message its producer may post itself (post's held, send_from, drop). */
typedef struct sp_xfer_req sp_xfer_req;

/* A group of messages as one task (the group entry): its function and argument struct
 * (malloc'ed, the caller frees it once submitted), and its buffers: task buffer j is
 * message xfer[j]'s, with access mode[j] (each buffer once: R for sends, W for
 * receives). */
typedef struct {
    sp_task_fn fn;
    void *args;
    size_t args_size;
    int nbufs;
    int *xfer;
    sp_access_mode *mode;
} sp_xfer_group;

/* What every counter counts, since init. */
typedef struct {
    unsigned long long sends, recvs; /* messages posted */
    unsigned long long pieced;       /* direct: sent or received as eager pieces */
    unsigned long long by_producer;  /* sends posted by the task that wrote their data */
    unsigned long long bytes_sent, bytes_received;
} sp_xfer_counts;

typedef struct {
    MPI_Comm world;     /* the ranks; a transport works on a duplicate of its own */
    int pieces;         /* direct: cut large transfers within a node into eager pieces */
    void (*poke)(void); /* wakes parked workers once a request is in flight (direct) */
    int ncuda;          /* CUDA workers of this rank (NCCL needs one on every rank) */
    const char *host;   /* NCCL: the host transport's name, where GPU messages go without it */
} sp_transport_config;

typedef struct sp_transport {
    const char *name; /* "starpu-mpi", "direct", "nccl" */

    /* Collective. *active = 0 when the transport cannot run on these ranks (NCCL without
     * a GPU per rank): notice then says why, the same line on every rank. */
    sp_status (*init)(const sp_transport_config *c, int *active, char *notice, size_t len);
    /* With nothing in flight. */
    void (*shutdown)(void);
    /* A step starts (steps count from 1; a message of step k never meets one of k+1). */
    void (*begin_step)(uint64_t step);

    /* Host transports: a detached send or receive. It starts once h's earlier tasks are
     * done (StarPU's sequential consistency) and holds h until complete, so a later
     * writer cannot overwrite data in flight. Optional held (with send_from): *held is
     * the send, alive until drop, which the task writing its data may post sooner. */
    sp_status (*post)(const sp_xfer *x, sp_xfer_done done, void *arg, sp_xfer_req **held);
    /* Optional: posts a held send now from ptr, h's host memory, which the calling task
     * has just finished writing (the last task writing h submitted before the send). */
    void (*send_from)(sp_xfer_req *r, void *ptr);
    void (*drop)(sp_xfer_req *r);

    /* Group transports: the n messages x as one task, for the caller to submit at its
     * place in the rank's order (every rank submits its groups in one global order). */
    sp_status (*group)(const sp_xfer *x, int n, sp_xfer_group *g);
    /* Optional, collective among the peers listed (symmetric lists): connect now rather
     * than inside the first step. */
    sp_status (*connect)(const int *peers, int n);
    /* Optional: an asynchronous error seen since (NCCL), or NULL. After one, the
     * transport is dead. */
    const char *(*error)(void);

    /* Optional: tests what is in flight and finishes what is complete; returns how many.
     * NULL: the transport progresses by itself (a thread of its own). */
    int (*progress)(void);
    /* Optional: requests the rank's workers must drive (progress), for the policy's idle
     * workers to poll while there are some. */
    int (*inflight)(void);
    /* Messages posted whose done has not returned. */
    int (*pending)(void);
    /* At the end of a step, once the rank's tasks are done: waits for the rest of its
     * messages. Collective for StarPU-MPI (all its requests everywhere). */
    sp_status (*drain)(void);
    /* Optional, collective, with nothing in flight, after a failed step: later messages
     * cannot meet one left over from it (pieces no receive took). */
    sp_status (*renew)(void);

    void (*counts)(sp_xfer_counts *out);
    /* Optional: the tag message msg of this step travels under (StarPU-MPI's tag, or
     * MPI's), for a report on a stalled step. */
    int64_t (*tag)(uint32_t msg);
    /* Optional: bytes of host memory held for messages in flight (copies of sends). */
    size_t (*staging_bytes)(void);
} sp_transport;

extern const sp_transport sp_transport_starpu_mpi;
extern const sp_transport sp_transport_direct;
extern const sp_transport sp_transport_nccl;

/* The host transport of that name ("starpu-mpi", "direct"), or NULL. */
const sp_transport *sp_transport_by_name(const char *name);

/* "file:line: call failed: MPI's text" as an SP_ERR_RUNTIME. */
sp_status sp_comm_mpi_error(const char *file, int line, const char *call, int rc);

/* Messages up to this size go eagerly through shared memory (the executor raises
 * OpenMPI's limit to SP_COMM_EAGER_LIMIT, which counts its header): their sends complete
 * at once. Larger ones go as pieces of this size within a node with the direct transport,
 * and from a private copy to another node. */
#define SP_COMM_EAGER_BYTES 131072
#define SP_COMM_EAGER_LIMIT (SP_COMM_EAGER_BYTES + 1024)
/* The TCP sockets' buffers asked of Open MPI (btl_tcp_sndbuf, _rcvbuf): room for a few
 * eager messages in flight, so that the kernel takes each whole at once. */
#define SP_COMM_TCP_SOCKET_BUFFER (1 << 20)

#endif
