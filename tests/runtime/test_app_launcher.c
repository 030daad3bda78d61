/* What the apps take from the launcher before MPI starts (apps/options.c): the rank, the
 * rank count and the ranks of this node, which the preflight memory check and rank 0's
 * messages use. Under srun --mpi=pmix Open MPI's variables are absent (PMIX_RANK only),
 * so Slurm's are read; in a batch script itself (no SLURM_STEP_ID) they are not a launch;
 * and mpirun's win inside an allocation. The variable sets are those measured under
 * Slurm 22.05 with Open MPI 4.1 (tests/slurm/slurm.sh). */
#include <stdlib.h>

#include "apps/options.h"
#include "tests/check.h"

static void clear(void)
{
    static const char *const vars[] = {
        "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE",
        "OMPI_COMM_WORLD_LOCAL_RANK", "PMIX_RANK", "PMI_RANK", "PMI_SIZE", "MPI_LOCALNRANKS",
        "MPI_LOCALRANKID", "SLURM_STEP_ID", "SLURM_STEPID", "SLURM_PROCID", "SLURM_NTASKS",
        "SLURM_STEP_NUM_TASKS", "SLURM_LOCALID", "SLURM_NODEID", "SLURM_STEP_TASKS_PER_NODE",
        NULL };
    for (int i = 0; vars[i]; i++) unsetenv(vars[i]);
}

static void expect(const char *what, int rank, int size, int local_size, int local_rank)
{
    CHECK(sp_app_launcher_rank() == rank, "%s: rank %d, expected %d", what,
          sp_app_launcher_rank(), rank);
    CHECK(sp_app_launcher_size() == size, "%s: size %d, expected %d", what,
          sp_app_launcher_size(), size);
    CHECK(sp_app_launcher_local_size() == local_size, "%s: local size %d, expected %d", what,
          sp_app_launcher_local_size(), local_size);
    CHECK(sp_app_launcher_local_rank() == local_rank, "%s: local rank %d, expected %d", what,
          sp_app_launcher_local_rank(), local_rank);
}

int main(void)
{
    /* task lists */
    CHECK(sp_app_slurm_tasks_on_node("4", 0) == 4, "'4' node 0");
    CHECK(sp_app_slurm_tasks_on_node("2(x3),1", 2) == 2, "'2(x3),1' node 2");
    CHECK(sp_app_slurm_tasks_on_node("2(x3),1", 3) == 1, "'2(x3),1' node 3");
    CHECK(sp_app_slurm_tasks_on_node("2(x3),1", 4) == -1, "'2(x3),1' has no node 4");
    CHECK(sp_app_slurm_tasks_on_node("3,2(x2)", 1) == 2, "'3,2(x2)' node 1");
    CHECK(sp_app_slurm_tasks_on_node("2(x", 0) == -1, "'2(x' is malformed");
    CHECK(sp_app_slurm_tasks_on_node("a", 0) == -1, "'a' is malformed");
    CHECK(sp_app_slurm_tasks_on_node(NULL, 0) == -1, "no list");

    clear();
    expect("no launcher", 0, 1, 1, 0);

    /* srun --mpi=pmix -N 2 -n 8: task 5 is the second of node 1 */
    clear();
    setenv("SLURM_STEP_ID", "0", 1), setenv("PMIX_RANK", "5", 1);
    setenv("SLURM_PROCID", "5", 1), setenv("SLURM_NTASKS", "8", 1);
    setenv("SLURM_STEP_NUM_TASKS", "8", 1), setenv("SLURM_LOCALID", "1", 1);
    setenv("SLURM_NODEID", "1", 1), setenv("SLURM_STEP_TASKS_PER_NODE", "4(x2)", 1);
    expect("srun --mpi=pmix -N 2 -n 8", 5, 8, 4, 1);
    /* uneven: 3 tasks on node 0, 1 on node 1 */
    setenv("SLURM_STEP_TASKS_PER_NODE", "3,1", 1), setenv("SLURM_STEP_NUM_TASKS", "4", 1);
    setenv("SLURM_PROCID", "3", 1), setenv("PMIX_RANK", "3", 1), setenv("SLURM_LOCALID", "0", 1);
    expect("srun -n 4 over 3,1", 3, 4, 1, 0);

    /* the batch script itself: the allocation's SLURM_NTASKS is no launch */
    clear();
    setenv("SLURM_NTASKS", "8", 1), setenv("SLURM_PROCID", "0", 1);
    setenv("SLURM_NODEID", "0", 1), setenv("SLURM_LOCALID", "0", 1);
    expect("batch script", 0, 1, 1, 0);

    /* mpirun -np 2 inside the allocation: Open MPI's variables win over Slurm's (its
     * daemons run as a step, so the ranks see SLURM_STEP_ID too) */
    setenv("SLURM_STEP_ID", "1", 1), setenv("SLURM_STEP_NUM_TASKS", "1", 1);
    setenv("OMPI_COMM_WORLD_RANK", "1", 1), setenv("OMPI_COMM_WORLD_SIZE", "2", 1);
    setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "2", 1), setenv("OMPI_COMM_WORLD_LOCAL_RANK", "1", 1);
    setenv("PMIX_RANK", "1", 1);
    expect("mpirun inside an allocation", 1, 2, 2, 1);
    return check_summary("test_app_launcher");
}
