/* A wrong launch, named (runtime/launch.c): how many tasks the launcher (srun, mpirun, a
 * PMI launcher) says it started, against what MPI can start and the ranks MPI_COMM_WORLD
 * has; and which MPI library the process runs on, for the Open MPI parameters the
 * executor tunes before MPI_Init. Pure functions on the variables' values and the
 * library's version string, testable without MPI; thin wrappers read the environment and
 * the library for sp_exec_init. Private to runtime/ and its tests. */
#ifndef STARPIPE_RUNTIME_LAUNCH_H
#define STARPIPE_RUNTIME_LAUNCH_H

#include <stddef.h>

#include "starpipe/status.h"

/* The launcher's variables, NULL where unset. */
typedef struct {
    const char *slurm_step;  /* SLURM_STEP_ID, else SLURM_STEPID: srun started this task
                                (unset in a batch script itself) */
    const char *slurm_tasks; /* SLURM_STEP_NUM_TASKS, else SLURM_NTASKS: the step's tasks */
    const char *slurm_mpi;   /* SLURM_MPI_TYPE: srun's --mpi plugin (unset for none) */
    const char *pmix;        /* PMIX_RANK, else PMIX_NAMESPACE: a PMIx server is there
                                (srun --mpi=pmix, Open MPI's mpirun) */
    const char *pmi_size;    /* PMI_SIZE: a PMI-1/2 launcher (srun --mpi=pmi2, MPICH's or
                                Intel MPI's mpiexec) */
    const char *ompi_size;   /* OMPI_COMM_WORLD_SIZE: Open MPI's mpirun */
} sp_launch_env;

/* Before MPI starts: can this MPI start under this launch? pmix_only: under srun it
 * starts only through PMIx (Open MPI; without it MPI_Init aborts with its own text). mpi
 * names the library in the message ("Open MPI 4.1.4"). SP_OK, or SP_ERR_RUNTIME with one
 * line in msg naming the likely cause. */
sp_status sp_launch_check_start(const sp_launch_env *e, int pmix_only, const char *mpi,
                                 char *msg, size_t len);

/* After MPI started: world is MPI_COMM_WORLD's size. SP_OK, or SP_ERR_RUNTIME with one
 * line in msg when the launcher started more tasks than MPI sees (every task an MPI of
 * its own, or a launcher of another MPI). */
sp_status sp_launch_check_world(const sp_launch_env *e, int world, const char *mpi,
                                char *msg, size_t len);

/* The environment's values (pointers into it). */
void sp_launch_env_read(sp_launch_env *e);

/* The wrappers sp_exec_init calls: the environment and this build's MPI, the message
 * through sp_set_error. */
sp_status sp_launch_before_mpi(void);
sp_status sp_launch_after_mpi(int world);

/* The MPI library the process runs on (which need not be the one it was built with: Open
 * MPI 4 and 5 share libmpi.so.40). */
typedef struct {
    int open_mpi;              /* 1: Open MPI */
    int major, minor, release; /* Open MPI's version; 0 otherwise */
    char name[64];             /* for messages: "Open MPI 4.1.4", "MPICH 4.1.2", else the
                                  string's first line, cut */
} sp_mpi_library;

/* From MPI_Get_library_version's string: Open MPI's begins "Open MPI vX.Y.Z" (4.x and 5.x:
 * ompi/mpi/c/get_library_version.c), MPICH's "MPICH Version:      X.Y.Z\n..."; anything
 * else is another MPI. */
void sp_launch_parse_mpi(const char *version, sp_mpi_library *lib);

/* The Open MPI parameters (as environment variables) the executor sets before MPI_Init. */
typedef struct {
    const char *yield_when_idle; /* mpi_yield_when_idle (the same name in 4.x and 5.x) */
    const char *eager_limit;     /* the shared-memory BTL's eager limit */
    const char *max_send_size;   /* and its fragment size */
    const char *btl;             /* that BTL: "vader" (4.x), "sm" (5.x) */
    /* 5.x: the old names, still accepted as synonyms; a user who set one of them made
     * the choice, and the new name must not be set beside it (NULL in 4.x) */
    const char *eager_alias, *max_send_alias;
    /* the TCP BTL (between hosts; the same names in 4.x and 5.x): its eager limit, the
     * first fragment of a larger message, its fragment size and its sockets' buffers */
    const char *tcp_eager_limit, *tcp_rndv_eager_limit, *tcp_max_send_size, *tcp_sndbuf,
        *tcp_rcvbuf;
} sp_ompi_tuning;

/* 1 and the names for Open MPI 4.x and 5.x; 0 and all NULL for another MPI or an Open MPI
 * whose names we do not know (the executor then sets nothing). */
int sp_launch_ompi_tuning(const sp_mpi_library *lib, sp_ompi_tuning *t);

/* This process's library (MPI_Get_library_version: MPI-3 allows it before MPI_Init). */
void sp_launch_mpi_library(sp_mpi_library *lib);

#endif
