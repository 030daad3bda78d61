/* The transports' selection, and the MPI error text they and the executor share. */
#include "comm/transport.h"

#include <stdio.h>
#include <string.h>

const sp_transport *sp_transport_by_name(const char *name)
{
    static const sp_transport *const host[] = { &sp_transport_starpu_mpi, &sp_transport_direct };
    for (size_t i = 0; name && i < sizeof host / sizeof *host; i++)
        if (!strcmp(host[i]->name, name)) return host[i];
    return NULL;
}

sp_status sp_comm_mpi_error(const char *file, int line, const char *call, int rc)
{
    char s[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, s, &len) != MPI_SUCCESS)
        snprintf(s, sizeof s, "MPI error %d", rc);
    return sp_set_error(SP_ERR_RUNTIME, "%s:%d: %s failed: %s", file, line, call, s);
}
