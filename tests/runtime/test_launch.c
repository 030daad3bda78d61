/* A wrong launch is named (runtime/launch.c), without MPI: the variables srun (with the
 * pmix, pmi2 and no plugin), a batch script, Open MPI's mpirun (alone, inside an
 * allocation, across nodes) and a PMI launcher set, as measured under Slurm 22.05 and
 * Open MPI 4.1, against what must start and what must end with one line naming the
 * cause; then the wrappers on the process's own environment. */
#include <mpi.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/launch.h"
#include "tests/check.h"

static char msg[512];

/* every piece of want (NULL-terminated) is in msg */
static int says(const char *const *want)
{
    for (; *want; want++)
        if (!strstr(msg, *want))
            return 0;
    return 1;
}

#define SAYS(...) says((const char *const[]){ __VA_ARGS__, NULL })

/* srun -n 2 with each --mpi plugin, as the tasks' environments were */
static const sp_launch_env srun_pmix = { .slurm_step = "0", .slurm_tasks = "2",
                                         .slurm_mpi = "pmix", .pmix = "1" };
static const sp_launch_env srun_none = { .slurm_step = "0", .slurm_tasks = "2" };
static const sp_launch_env srun_pmi2 = { .slurm_step = "0", .slurm_tasks = "2",
                                         .slurm_mpi = "pmi2", .pmi_size = "2" };

static void before_mpi(void)
{
    static const sp_launch_env fine[] = {
        { 0 },                                                 /* no launcher */
        { .slurm_step = "0", .slurm_tasks = "2", .slurm_mpi = "pmix", .pmix = "0" },
        { .slurm_step = "3", .slurm_tasks = "8", .slurm_mpi = "pmix_v4", .pmix = "5" },
        { .slurm_tasks = "2" },                                /* a batch script itself */
        { .slurm_tasks = "4", .ompi_size = "2", .pmix = "0" }, /* mpirun -np 2 in it */
        { .slurm_step = "0", .slurm_tasks = "1", .ompi_size = "8", .pmix = "0" }, /* mpirun
                                               across nodes: its daemons are an srun step */
        { .pmi_size = "2" },                                   /* MPICH's mpiexec */
    };
    for (size_t k = 0; k < sizeof fine / sizeof *fine; k++) {
        msg[0] = 0;
        CHECK(sp_launch_check_start(&fine[k], 1, "Open MPI 4.1.4", msg, sizeof msg) == SP_OK,
              "launch %zu refused: %s", k, msg);
    }
    /* an MPI with PMI-1/2 clients (MPICH) starts under any plugin, or as singletons (the
     * world check names that) */
    CHECK(sp_launch_check_start(&srun_none, 0, "MPICH 4.0", msg, sizeof msg) == SP_OK,
          "MPICH under srun --mpi=none refused");
    CHECK(sp_launch_check_start(&srun_pmi2, 0, "MPICH 4.0", msg, sizeof msg) == SP_OK,
          "MPICH under srun --mpi=pmi2 refused");

    CHECK(sp_launch_check_start(&srun_none, 1, "Open MPI 4.1.4", msg, sizeof msg) ==
              SP_ERR_RUNTIME, "srun --mpi=none accepted");
    CHECK(SAYS("launched as 2 tasks by srun without an MPI plugin (--mpi=none), but Open MPI "
               "4.1.4 starts under srun only through PMIx: srun needs --mpi=pmix (srun "
               "--mpi=list shows the plugins), or run mpirun inside the allocation"),
          "srun --mpi=none: '%s'", msg);
    CHECK(!strchr(msg, '\n'), "more than one line: '%s'", msg);
    CHECK(sp_launch_check_start(&srun_pmi2, 1, "Open MPI 4.1.4", msg, sizeof msg) ==
              SP_ERR_RUNTIME, "srun --mpi=pmi2 accepted");
    CHECK(SAYS("launched as 2 tasks by srun --mpi=pmi2, but Open MPI 4.1.4 starts under srun "
               "only through PMIx", "--mpi=pmix"), "srun --mpi=pmi2: '%s'", msg);
    const sp_launch_env one = { .slurm_step = "0", .slurm_tasks = "1" };
    CHECK(sp_launch_check_start(&one, 1, "Open MPI 4.1.4", msg, sizeof msg) == SP_ERR_RUNTIME &&
              SAYS("launched as 1 task by srun"), "srun -n 1 --mpi=none: '%s'", msg);
    const sp_launch_env uncounted = { .slurm_step = "0", .slurm_tasks = "lots" };
    CHECK(sp_launch_check_start(&uncounted, 1, NULL, msg, sizeof msg) == SP_ERR_RUNTIME &&
              SAYS("launched by srun without", "but this program's MPI starts under srun"),
          "no count, no MPI name: '%s'", msg);
    /* a short buffer: still refused, the message cut */
    char small[16];
    CHECK(sp_launch_check_start(&srun_none, 1, "Open MPI 4.1.4", small, sizeof small) ==
              SP_ERR_RUNTIME && strlen(small) == sizeof small - 1, "short buffer");
}

static void after_mpi(void)
{
    /* launches whose ranks all joined, or a count MPI is not told about */
    struct { sp_launch_env e; int world; } fine[] = {
        { srun_pmix, 2 },
        { { .slurm_tasks = "2" }, 1 },                          /* a batch script's singleton */
        { { .slurm_tasks = "4", .ompi_size = "2", .pmix = "0" }, 2 },
        { { .slurm_step = "0", .slurm_tasks = "1", .ompi_size = "8", .pmix = "0" }, 8 },
        { { .ompi_size = "3" }, 3 },
        { { .pmi_size = "2" }, 2 },
        { { .slurm_step = "0", .slurm_tasks = "2x", .pmix = "0" }, 1 }, /* not a number */
        { { .ompi_size = "" }, 1 },
        { { 0 }, 1 },
        { { .slurm_step = "0", .slurm_tasks = "2", .pmix = "0" }, 4 }, /* more ranks: not ours */
    };
    for (size_t k = 0; k < sizeof fine / sizeof *fine; k++) {
        msg[0] = 0;
        CHECK(sp_launch_check_world(&fine[k].e, fine[k].world, "Open MPI 4.1.4", msg,
                                    sizeof msg) == SP_OK, "launch %zu refused: %s", k, msg);
    }

    /* srun's tasks each an MPI of its own (an MPI with singletons under --mpi=none) */
    CHECK(sp_launch_check_world(&srun_none, 1, "MPICH 4.0", msg, sizeof msg) == SP_ERR_RUNTIME,
          "2 srun tasks, 1 rank accepted");
    CHECK(SAYS("launched as 2 tasks by srun without an MPI plugin (--mpi=none), but MPI sees "
               "1 rank: the tasks did not join one MPI job; srun needs --mpi=pmix (srun "
               "--mpi=list shows the plugins)"), "srun singletons: '%s'", msg);
    const sp_launch_env srun4 = { .slurm_step = "1", .slurm_tasks = "4", .slurm_mpi = "pmix",
                                  .pmix = "2" };
    CHECK(sp_launch_check_world(&srun4, 2, NULL, msg, sizeof msg) == SP_ERR_RUNTIME &&
              SAYS("launched as 4 tasks by srun --mpi=pmix, but MPI sees 2 ranks"),
          "4 tasks, 2 ranks: '%s'", msg);
    /* mpirun's count is mpirun's, whatever Slurm's says */
    const sp_launch_env ompi = { .slurm_step = "0", .slurm_tasks = "1", .ompi_size = "2" };
    CHECK(sp_launch_check_world(&ompi, 1, "Open MPI 4.1.4", msg, sizeof msg) == SP_ERR_RUNTIME &&
              SAYS("launched as 2 ranks by mpirun (OMPI_COMM_WORLD_SIZE=2), but MPI sees 1 "
                   "rank:", "(Open MPI 4.1.4)"), "mpirun: '%s'", msg);
    const sp_launch_env pmi = { .pmi_size = "2" };
    CHECK(sp_launch_check_world(&pmi, 1, "Open MPI 4.1.4", msg, sizeof msg) == SP_ERR_RUNTIME &&
              SAYS("launched as 2 ranks by a PMI launcher (PMI_SIZE=2", "but MPI sees 1 rank:",
                   "Open MPI 4.1.4 did not join it", "srun --mpi=pmix"), "PMI: '%s'", msg);
    CHECK(!strchr(msg, '\n'), "more than one line: '%s'", msg);
}

static void environment(void)
{
    const char *vars[] = { "SLURM_STEP_ID", "SLURM_STEPID", "SLURM_STEP_NUM_TASKS",
                           "SLURM_NTASKS", "SLURM_MPI_TYPE", "PMIX_RANK", "PMIX_NAMESPACE",
                           "PMI_SIZE", "OMPI_COMM_WORLD_SIZE" };
    for (size_t k = 0; k < sizeof vars / sizeof *vars; k++)
        unsetenv(vars[k]);
    sp_launch_env e;
    sp_launch_env_read(&e);
    CHECK(!e.slurm_step && !e.slurm_tasks && !e.slurm_mpi && !e.pmix && !e.pmi_size &&
              !e.ompi_size, "an empty environment read as set");
    CHECK(sp_launch_before_mpi() == SP_OK && sp_launch_after_mpi(1) == SP_OK,
          "no launcher refused: %s", sp_last_error());

    /* the older names, and the step's own count before the job's */
    setenv("SLURM_STEPID", "0", 1);
    setenv("SLURM_NTASKS", "4", 1);
    setenv("SLURM_STEP_NUM_TASKS", "2", 1);
    setenv("PMIX_NAMESPACE", "slurm.pmix.3.0", 1);
    setenv("PMI_SIZE", "5", 1);
    setenv("OMPI_COMM_WORLD_SIZE", "6", 1);
    setenv("SLURM_MPI_TYPE", "pmix", 1);
    sp_launch_env_read(&e);
    CHECK(e.slurm_step && !strcmp(e.slurm_step, "0") && !strcmp(e.slurm_tasks, "2") &&
              !strcmp(e.pmix, "slurm.pmix.3.0") && !strcmp(e.pmi_size, "5") &&
              !strcmp(e.ompi_size, "6") && !strcmp(e.slurm_mpi, "pmix"), "variables misread");
    setenv("SLURM_STEP_ID", "7", 1);
    setenv("PMIX_RANK", "1", 1);
    sp_launch_env_read(&e);
    CHECK(!strcmp(e.slurm_step, "7") && !strcmp(e.pmix, "1"), "SLURM_STEP_ID, PMIX_RANK first");

    /* what a task of srun -n 2 --mpi=none sees: refused before MPI with this build's MPI
     * named, and, were MPI up as a singleton, refused after it */
    unsetenv("PMIX_RANK");
    unsetenv("PMIX_NAMESPACE");
    unsetenv("PMI_SIZE");
    unsetenv("OMPI_COMM_WORLD_SIZE");
    unsetenv("SLURM_MPI_TYPE");
    sp_clear_error();
#if defined(OPEN_MPI) && OPEN_MPI
    CHECK(sp_launch_before_mpi() == SP_ERR_RUNTIME && strstr(sp_last_error(), "but Open MPI ") &&
              strstr(sp_last_error(), "srun needs --mpi=pmix"), "before MPI: '%s'",
          sp_last_error());
#else
    CHECK(sp_launch_before_mpi() == SP_OK, "before MPI: %s", sp_last_error());
#endif
    sp_clear_error();
    CHECK(sp_launch_after_mpi(1) == SP_ERR_RUNTIME &&
              strstr(sp_last_error(), "launched as 2 tasks by srun without an MPI plugin"),
          "after MPI: '%s'", sp_last_error());
    CHECK(sp_launch_after_mpi(2) == SP_OK, "2 tasks, 2 ranks: %s", sp_last_error());
}

int main(void)
{
    before_mpi();
    after_mpi();
    environment();
    return check_summary("test_launch");
}
