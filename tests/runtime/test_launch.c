/* A wrong launch is named (runtime/launch.c), without MPI: the variables srun (with the
 * pmix, pmi2 and no plugin), a batch script, Open MPI's mpirun (alone, inside an
 * allocation, across nodes) and a PMI launcher set, as measured under Slurm 22.05 and
 * Open MPI 4.1, against what must start and what must end with one line naming the
 * cause; then the wrappers on the process's own environment. And the MPI library read from
 * MPI_Get_library_version's string (Open MPI 4 and 5, MPICH, Intel MPI, as they print it),
 * with the Open MPI parameter names the executor sets for it. */
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

/* MPI_Get_library_version's strings: Debian 12's Open MPI 4.1.4 (this machine, before
 * MPI_Init); Open MPI 5.0.x's format (ompi/mpi/c/get_library_version.c: "Open MPI
 * v%d.%d.%d", the greek suffix, ", package: ", ", ident: ", ", repo rev: ", ", date");
 * MPICH's (MPIR_Get_library_version_impl: "MPICH Version:      %s\n" and more lines);
 * Intel MPI's one line. */
static const char *ompi414 = "Open MPI v4.1.4, package: Debian OpenMPI, ident: 4.1.4, repo "
                             "rev: v4.1.4, May 26, 2022";
static const char *ompi503 = "Open MPI v5.0.3, package: Open MPI builder@host Distribution, "
                             "ident: 5.0.3, repo rev: v5.0.3, Apr 08, 2024";
static const char *ompi5rc = "Open MPI v5.0.0rc12, package: Open MPI user@node Distribution, "
                             "ident: 5.0.0rc12, repo rev: v5.0.0rc12, Jun 14, 2023";
static const char *ompi3 = "Open MPI v3.1.6, package: Debian OpenMPI, ident: 3.1.6, repo rev: "
                           "v3.1.6, Mar 18, 2020";
static const char *ompi6 = "Open MPI v6.0.0a1, package: Open MPI user@node Distribution, ident: "
                           "6.0.0a1, repo rev: v2.x-dev-12345-gabcdef, Unreleased developer copy";
static const char *mpich = "MPICH Version:      4.1.2\nMPICH Release date: Wed Jun  7 15:22:45 "
                           "CDT 2023\nMPICH ABI:          15:1:3\nMPICH Device:       ch4:ofi\n"
                           "MPICH configure:    --prefix=/usr\nMPICH CC:           gcc -O2\n";
static const char *impi = "Intel(R) MPI Library 2021.10 for Linux* OS\n";

static void library(void)
{
    sp_mpi_library lib;
    sp_ompi_tuning t;
    sp_launch_parse_mpi(ompi414, &lib);
    CHECK(lib.open_mpi && lib.major == 4 && lib.minor == 1 && lib.release == 4 &&
              !strcmp(lib.name, "Open MPI 4.1.4"), "4.1.4: %d %d.%d.%d '%s'", lib.open_mpi,
          lib.major, lib.minor, lib.release, lib.name);
    CHECK(sp_launch_ompi_tuning(&lib, &t) == 1 &&
              !strcmp(t.yield_when_idle, "OMPI_MCA_mpi_yield_when_idle") &&
              !strcmp(t.eager_limit, "OMPI_MCA_btl_vader_eager_limit") &&
              !strcmp(t.max_send_size, "OMPI_MCA_btl_vader_max_send_size") &&
              !strcmp(t.btl, "vader") && !t.eager_alias && !t.max_send_alias &&
              !strcmp(t.tcp_eager_limit, "OMPI_MCA_btl_tcp_eager_limit") &&
              !strcmp(t.tcp_rndv_eager_limit, "OMPI_MCA_btl_tcp_rndv_eager_limit") &&
              !strcmp(t.tcp_max_send_size, "OMPI_MCA_btl_tcp_max_send_size") &&
              !strcmp(t.tcp_sndbuf, "OMPI_MCA_btl_tcp_sndbuf") &&
              !strcmp(t.tcp_rcvbuf, "OMPI_MCA_btl_tcp_rcvbuf"),
          "4.x: vader's names, tcp's");

    sp_launch_parse_mpi(ompi503, &lib);
    CHECK(lib.open_mpi && lib.major == 5 && lib.minor == 0 && lib.release == 3 &&
              !strcmp(lib.name, "Open MPI 5.0.3"), "5.0.3: '%s'", lib.name);
    CHECK(sp_launch_ompi_tuning(&lib, &t) == 1 &&
              !strcmp(t.yield_when_idle, "OMPI_MCA_mpi_yield_when_idle") &&
              !strcmp(t.eager_limit, "OMPI_MCA_btl_sm_eager_limit") &&
              !strcmp(t.max_send_size, "OMPI_MCA_btl_sm_max_send_size") &&
              !strcmp(t.btl, "sm") && !strcmp(t.eager_alias, "OMPI_MCA_btl_vader_eager_limit") &&
              !strcmp(t.max_send_alias, "OMPI_MCA_btl_vader_max_send_size") &&
              !strcmp(t.tcp_eager_limit, "OMPI_MCA_btl_tcp_eager_limit") &&
              !strcmp(t.tcp_sndbuf, "OMPI_MCA_btl_tcp_sndbuf"),
          "5.x: sm's names, vader's as the aliases a user may have set, tcp's");
    sp_launch_parse_mpi(ompi5rc, &lib);
    CHECK(lib.open_mpi && lib.major == 5 && lib.release == 0 && sp_launch_ompi_tuning(&lib, &t),
          "5.0.0rc12: '%s'", lib.name);

    /* an Open MPI whose names we do not know, and other MPIs: nothing set */
    sp_launch_parse_mpi(ompi3, &lib);
    CHECK(lib.open_mpi && lib.major == 3 && sp_launch_ompi_tuning(&lib, &t) == 0 &&
              !t.eager_limit && !t.yield_when_idle, "3.1.6 tuned");
    sp_launch_parse_mpi(ompi6, &lib);
    CHECK(lib.open_mpi && lib.major == 6 && sp_launch_ompi_tuning(&lib, &t) == 0, "6.0 tuned");
    sp_launch_parse_mpi(mpich, &lib);
    CHECK(!lib.open_mpi && !lib.major && !strcmp(lib.name, "MPICH 4.1.2") &&
              sp_launch_ompi_tuning(&lib, &t) == 0 && !t.btl, "MPICH: '%s'", lib.name);
    sp_launch_parse_mpi(impi, &lib);
    CHECK(!lib.open_mpi && !strcmp(lib.name, "Intel(R) MPI Library 2021.10 for Linux* OS") &&
              sp_launch_ompi_tuning(&lib, &t) == 0, "Intel MPI: '%s'", lib.name);
    const char *odd[] = { "", "Open MPI", "Open MPI vX", "Open MPI v0.1.2", "open mpi v4.1.4" };
    for (size_t k = 0; k < sizeof odd / sizeof *odd; k++) {
        sp_launch_parse_mpi(odd[k], &lib);
        CHECK(!lib.open_mpi && lib.name[0] && sp_launch_ompi_tuning(&lib, &t) == 0,
              "'%s' taken for Open MPI 4 or 5", odd[k]);
    }
    sp_launch_parse_mpi(NULL, &lib);
    CHECK(!lib.open_mpi && !strcmp(lib.name, "an unknown MPI"), "NULL: '%s'", lib.name);

    /* this process, before MPI_Init (MPI-3 allows it): the library it runs on */
    int up = 1;
    MPI_Initialized(&up);
    sp_launch_mpi_library(&lib);
    CHECK(!up && lib.name[0], "MPI_Get_library_version before MPI_Init: '%s'", lib.name);
#if defined(OPEN_MPI) && OPEN_MPI
    CHECK(lib.open_mpi && lib.major == OMPI_MAJOR_VERSION && lib.minor == OMPI_MINOR_VERSION,
          "this Open MPI read as '%s'", lib.name);
#endif
}

int main(void)
{
    before_mpi();
    after_mpi();
    environment();
    library();
    return check_summary("test_launch");
}
