/* A wrong launch, named: srun without PMIx, or a launcher whose task count MPI does not
 * see, ends the run with one line naming the likely cause instead of Open MPI's raw
 * abort text or P copies of a one-rank run. The launcher's variables are its own (SLURM_,
 * PMIX_, PMI_, OMPI_), read here directly; no STARPIPE_* variable is involved. And the
 * MPI library found at run time, with the names of the Open MPI parameters we tune. */
#include "runtime/launch.h"

#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A launcher's count: a whole number 1..2^24, else 0 (unset or not a number: these come
 * from the launcher, and a value we cannot read is no evidence). */
static int count_of(const char *s)
{
    if (!s || *s < '0' || *s > '9')
        return 0;
    char *end;
    long v = strtol(s, &end, 10);
    return *end || v < 1 || v > (1L << 24) ? 0 : (int)v;
}

static int set(const char *s) { return s && *s; }

/* srun, as the user launched it: the plugin SLURM_MPI_TYPE names, or none. */
static const char *srun_how(const sp_launch_env *e, char *buf, size_t len)
{
    if (set(e->slurm_mpi))
        snprintf(buf, len, "srun --mpi=%s", e->slurm_mpi);
    else
        snprintf(buf, len, "srun without an MPI plugin (--mpi=none)");
    return buf;
}

static const char *mpi_or(const char *mpi) { return mpi && *mpi ? mpi : "this program's MPI"; }

/* srun started this task itself (not a batch script, not mpirun's daemons). */
static int srun_task(const sp_launch_env *e) { return set(e->slurm_step) && !set(e->ompi_size); }

sp_status sp_launch_check_start(const sp_launch_env *e, int pmix_only, const char *mpi,
                                 char *msg, size_t len)
{
    if (!pmix_only || !srun_task(e) || set(e->pmix))
        return SP_OK;
    char how[96], tasks[48] = "";
    int n = count_of(e->slurm_tasks);
    if (n)
        snprintf(tasks, sizeof tasks, " as %d task%s", n, n == 1 ? "" : "s");
    snprintf(msg, len, "launched%s by %s, but %s starts under srun only through PMIx: srun "
             "needs --mpi=pmix (srun --mpi=list shows the plugins), or run mpirun inside the "
             "allocation", tasks, srun_how(e, how, sizeof how), mpi_or(mpi));
    return SP_ERR_RUNTIME;
}

sp_status sp_launch_check_world(const sp_launch_env *e, int world, const char *mpi,
                                char *msg, size_t len)
{
    char how[96];
    /* the launcher's count: mpirun's own variable first (inside an allocation the
     * job's SLURM_NTASKS need not be mpirun's -np), then srun's, then PMI's */
    int n = count_of(e->ompi_size);
    if (n) {
        if (n <= world)
            return SP_OK;
        snprintf(msg, len, "launched as %d ranks by mpirun (OMPI_COMM_WORLD_SIZE=%d), but MPI "
                 "sees %d rank%s: that mpirun is not of the MPI this program was built with "
                 "(%s); launch it with that MPI's mpirun", n, n, world, world == 1 ? "" : "s",
                 mpi_or(mpi));
        return SP_ERR_RUNTIME;
    }
    if (srun_task(e) && (n = count_of(e->slurm_tasks))) {
        if (n <= world)
            return SP_OK;
        snprintf(msg, len, "launched as %d tasks by %s, but MPI sees %d rank%s: the tasks did "
                 "not join one MPI job; srun needs --mpi=pmix (srun --mpi=list shows the "
                 "plugins), or run mpirun inside the allocation", n, srun_how(e, how, sizeof how),
                 world, world == 1 ? "" : "s");
        return SP_ERR_RUNTIME;
    }
    if ((n = count_of(e->pmi_size)) && n > world) {
        snprintf(msg, len, "launched as %d ranks by a PMI launcher (PMI_SIZE=%d: MPICH's or "
                 "Intel MPI's mpiexec, or srun --mpi=pmi2), but MPI sees %d rank%s: %s did not "
                 "join it; launch with the mpirun of the MPI this program was built with, or "
                 "srun --mpi=pmix", n, n, world, world == 1 ? "" : "s", mpi_or(mpi));
        return SP_ERR_RUNTIME;
    }
    return SP_OK;
}

static const char *first(const char *a, const char *b)
{
    const char *v = getenv(a);
    return v ? v : getenv(b);
}

void sp_launch_env_read(sp_launch_env *e)
{
    e->slurm_step = first("SLURM_STEP_ID", "SLURM_STEPID");
    e->slurm_tasks = first("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS");
    e->slurm_mpi = getenv("SLURM_MPI_TYPE");
    e->pmix = first("PMIX_RANK", "PMIX_NAMESPACE");
    e->pmi_size = getenv("PMI_SIZE");
    e->ompi_size = getenv("OMPI_COMM_WORLD_SIZE");
}

/* This build's MPI, and whether it starts under srun through PMIx alone: Open MPI does
 * (5 has nothing else; Debian's 4.1 and most builds of 4 carry no PMI-1/2 client, and
 * abort in MPI_Init under srun --mpi=none or --mpi=pmi2). */
#if defined(OPEN_MPI) && OPEN_MPI
#define PMIX_ONLY 1
#define STR_(x) #x
#define STR(x) STR_(x)
#define MPI_NAME "Open MPI " STR(OMPI_MAJOR_VERSION) "." STR(OMPI_MINOR_VERSION) "." \
                 STR(OMPI_RELEASE_VERSION)
#elif defined(MPICH_VERSION)
#define PMIX_ONLY 0
#define MPI_NAME "MPICH " MPICH_VERSION
#else
#define PMIX_ONLY 0
#define MPI_NAME "this program's MPI"
#endif

sp_status sp_launch_before_mpi(void)
{
    sp_launch_env e;
    char msg[512];
    sp_launch_env_read(&e);
    sp_status st = sp_launch_check_start(&e, PMIX_ONLY, MPI_NAME, msg, sizeof msg);
    return st ? sp_set_error(st, "%s", msg) : SP_OK;
}

sp_status sp_launch_after_mpi(int world)
{
    sp_launch_env e;
    char msg[512];
    sp_launch_env_read(&e);
    sp_status st = sp_launch_check_world(&e, world, MPI_NAME, msg, sizeof msg);
    return st ? sp_set_error(st, "%s", msg) : SP_OK;
}

/* ---- the MPI library at run time ---- */

void sp_launch_parse_mpi(const char *v, sp_mpi_library *lib)
{
    memset(lib, 0, sizeof *lib);
    if (!v)
        v = "";
    static const char ompi[] = "Open MPI v", mpich[] = "MPICH Version:";
    int maj = 0, min = 0, rel = 0;
    if (!strncmp(v, ompi, sizeof ompi - 1) &&
        sscanf(v + sizeof ompi - 1, "%d.%d.%d", &maj, &min, &rel) >= 2 && maj > 0) {
        lib->open_mpi = 1, lib->major = maj, lib->minor = min, lib->release = rel;
        snprintf(lib->name, sizeof lib->name, "Open MPI %d.%d.%d", maj, min, rel);
        return;
    }
    if (!strncmp(v, mpich, sizeof mpich - 1)) {
        const char *s = v + sizeof mpich - 1;
        s += strspn(s, " \t");
        snprintf(lib->name, sizeof lib->name, "MPICH %.*s", (int)strcspn(s, " \t\r\n"), s);
        return;
    }
    int n = (int)strcspn(v, "\r\n");
    while (n > 0 && (v[n - 1] == ' ' || v[n - 1] == '\t')) n--;
    if (n)
        snprintf(lib->name, sizeof lib->name, "%.*s", n, v);
    else
        snprintf(lib->name, sizeof lib->name, "an unknown MPI");
}

/* Open MPI 4 names its shared-memory BTL vader; 5.0 renamed it sm (vader is an alias there,
 * "a legacy transition device" that "will likely disappear": docs/tuning-apps/networking/
 * shared-memory.rst of v5.0.x; opal/mca/btl/base/btl_base_frame.c registers it).
 * mpi_yield_when_idle is registered under that name by both (ompi_mpi_params.c). */
int sp_launch_ompi_tuning(const sp_mpi_library *lib, sp_ompi_tuning *t)
{
    memset(t, 0, sizeof *t);
    if (!lib->open_mpi || (lib->major != 4 && lib->major != 5))
        return 0;
    int five = lib->major == 5;
    t->yield_when_idle = "OMPI_MCA_mpi_yield_when_idle";
    t->eager_limit = five ? "OMPI_MCA_btl_sm_eager_limit" : "OMPI_MCA_btl_vader_eager_limit";
    t->max_send_size = five ? "OMPI_MCA_btl_sm_max_send_size" : "OMPI_MCA_btl_vader_max_send_size";
    t->btl = five ? "sm" : "vader";
    t->eager_alias = five ? "OMPI_MCA_btl_vader_eager_limit" : NULL;
    t->max_send_alias = five ? "OMPI_MCA_btl_vader_max_send_size" : NULL;
    t->tcp_eager_limit = "OMPI_MCA_btl_tcp_eager_limit";
    t->tcp_rndv_eager_limit = "OMPI_MCA_btl_tcp_rndv_eager_limit";
    t->tcp_max_send_size = "OMPI_MCA_btl_tcp_max_send_size";
    t->tcp_sndbuf = "OMPI_MCA_btl_tcp_sndbuf";
    t->tcp_rcvbuf = "OMPI_MCA_btl_tcp_rcvbuf";
    return 1;
}

void sp_launch_mpi_library(sp_mpi_library *lib)
{
    char v[MPI_MAX_LIBRARY_VERSION_STRING] = "";
    int n = 0;
    if (MPI_Get_library_version(v, &n) != MPI_SUCCESS)
        v[0] = '\0';
    v[sizeof v - 1] = '\0';
    sp_launch_parse_mpi(v, lib);
}
