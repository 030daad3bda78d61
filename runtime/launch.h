/* A wrong launch, named (runtime/launch.c): how many tasks the launcher (srun, mpirun, a
 * PMI launcher) says it started, against what MPI can start and the ranks MPI_COMM_WORLD
 * has. Pure functions on the variables' values, testable without MPI; two thin wrappers
 * read the environment for sp_exec_init. Private to runtime/ and its tests. */
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

#endif
