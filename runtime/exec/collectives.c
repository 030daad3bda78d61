/* Collectives between steps (sp_exec_allreduce_sum, sp_exec_bcast, sp_exec_gather):
 * checked, cut into MPI-sized chunks, and run by sp_exec_collective under the watchdog
 * (watchdog.c). Relies on state.c and watchdog.c. */
#include "runtime/exec/exec_int.h"

/* MPI counts are ints: large buffers go in chunks. */
#define SP_MPI_CHUNK ((size_t)1 << 28)

sp_status sp_exec_between_steps(const char *what)
{
    if (!X.started)
        return sp_set_error(SP_ERR_ARG, "%s: sp_exec_init has not been called", what);
    if (X.broken)
        return sp_exec_broken_error(what);
    if (X.in_step)
        return sp_set_error(SP_ERR_ARG, "%s: only between steps", what);
    return SP_OK;
}

sp_status sp_exec_allreduce_sum_named(void *buf, size_t count, int is_double, const char *what)
{
    sp_status st = sp_exec_between_steps("sp_exec_allreduce_sum");
    if (st)
        return st;
    size_t elem = is_double ? sizeof(double) : sizeof(float);
    for (size_t off = 0; off < count && !st; off += SP_MPI_CHUNK) {
        size_t n = count - off < SP_MPI_CHUNK ? count - off : SP_MPI_CHUNK;
        st = sp_exec_collective(&(sp_exec_coll){
            .kind = SP_COLL_ALLREDUCE, .send = MPI_IN_PLACE, .recv = (char *)buf + off * elem,
            .count = (int)n, .type = is_double ? MPI_DOUBLE : MPI_FLOAT, .op = MPI_SUM,
            .comm = X.comm, .what = what });
    }
    return st;
}

sp_status sp_exec_allreduce_sum(void *buf, size_t count, int is_double)
{
    return sp_exec_allreduce_sum_named(buf, count, is_double,
                                       "an all-reduce between steps (sp_exec_allreduce_sum)");
}

sp_status sp_exec_bcast_named(void *buf, size_t bytes, int root, const char *what)
{
    sp_status st = sp_exec_between_steps("sp_exec_bcast");
    if (st)
        return st;
    for (size_t off = 0; off < bytes && !st; off += SP_MPI_CHUNK) {
        size_t n = bytes - off < SP_MPI_CHUNK ? bytes - off : SP_MPI_CHUNK;
        st = sp_exec_collective(&(sp_exec_coll){
            .kind = SP_COLL_BCAST, .recv = (char *)buf + off, .count = (int)n,
            .type = MPI_BYTE, .root = root, .comm = X.comm, .what = what });
    }
    return st;
}

sp_status sp_exec_bcast(void *buf, size_t bytes, int root)
{
    return sp_exec_bcast_named(buf, bytes, root, "a broadcast between steps (sp_exec_bcast)");
}

sp_status sp_exec_gather(const void *send, size_t bytes, void *recv, int root)
{
    sp_status st = sp_exec_between_steps("sp_exec_gather");
    if (st)
        return st;
    if (bytes > (size_t)INT32_MAX)
        return sp_set_error(SP_ERR_ARG, "sp_exec_gather: %zu bytes is more than one message",
                            bytes);
    return sp_exec_collective(&(sp_exec_coll){
        .kind = SP_COLL_GATHER, .send = send, .recv = recv, .count = (int)bytes,
        .type = MPI_BYTE, .root = root, .comm = X.comm,
        .what = "a gather between steps (sp_exec_gather)" });
}
