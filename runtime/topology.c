/* The host's topology from hwloc (runtime/topology.h): PUs, the CPUs near a PCI device,
 * logical numbering. */
#define _GNU_SOURCE
#include "runtime/topology.h"

#include <stdio.h>
#include <stdlib.h>

#include <hwloc.h>

struct sp_topo {
    hwloc_topology_t h;
    int io; /* loaded with its PCI devices */
};

static sp_status load(const char *xml, int io, sp_topo **out)
{
    *out = NULL;
    sp_topo *t = calloc(1, sizeof *t);
    if (!t) return sp_set_error(SP_ERR_NOMEM, "%s:%d: out of memory", __FILE__, __LINE__);
    if (hwloc_topology_init(&t->h) != 0) {
        free(t);
        return sp_set_error(SP_ERR_RUNTIME, "%s:%d: hwloc_topology_init failed", __FILE__,
                            __LINE__);
    }
    /* PCI devices and their bridges (dropped by default): a GPU's place on the host */
    if (io) hwloc_topology_set_io_types_filter(t->h, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
    t->io = io;
    if ((xml && hwloc_topology_set_xml(t->h, xml) != 0) || hwloc_topology_load(t->h) != 0) {
        hwloc_topology_destroy(t->h);
        free(t);
        return xml ? sp_set_error(SP_ERR_IO, "%s: hwloc cannot load this XML topology", xml)
                   : sp_set_error(SP_ERR_RUNTIME, "%s:%d: hwloc topology discovery failed",
                                  __FILE__, __LINE__);
    }
    *out = t;
    return SP_OK;
}

sp_status sp_topo_load(const char *xml, sp_topo **out)
{
    return load(xml, 1, out);
}

void sp_topo_free(sp_topo *t)
{
    if (!t) return;
    hwloc_topology_destroy(t->h);
    free(t);
}

sp_status sp_topo_host(int io, sp_topo **out)
{
    static sp_topo *host;
    sp_status st = SP_OK;
    if (host && io && !host->io) { /* not the executor's order: GPU first, then cores */
        sp_topo_free(host);
        host = NULL;
    }
    if (!host) st = load(NULL, io, &host);
    *out = host;
    return st;
}

static int os_of(hwloc_obj_t o)
{
    return o && o->os_index != HWLOC_UNKNOWN_INDEX ? (int)o->os_index : -1;
}

int sp_topo_pus(const sp_topo *t, sp_pu *pus, int max)
{
    int n = 0;
    for (hwloc_obj_t pu = hwloc_get_next_obj_by_type(t->h, HWLOC_OBJ_PU, NULL); pu && n < max;
         pu = hwloc_get_next_obj_by_type(t->h, HWLOC_OBJ_PU, pu)) {
        hwloc_obj_t core = hwloc_get_ancestor_obj_by_type(t->h, HWLOC_OBJ_CORE, pu);
        hwloc_obj_t pack = hwloc_get_ancestor_obj_by_type(t->h, HWLOC_OBJ_PACKAGE, pu);
        /* NUMA nodes are memory children, no ancestor of a PU: the one node covering it */
        hwloc_obj_t numa = NULL;
        int nodes = 0;
        for (hwloc_obj_t m = hwloc_get_next_obj_by_type(t->h, HWLOC_OBJ_NUMANODE, NULL); m;
             m = hwloc_get_next_obj_by_type(t->h, HWLOC_OBJ_NUMANODE, m))
            if (m->cpuset && hwloc_bitmap_isset(m->cpuset, pu->os_index)) numa = m, nodes++;
        pus[n++] = (sp_pu){
            .os = (int)pu->os_index,
            /* no Core object (some exports): the PU is its own core */
            .core = core ? (int)core->logical_index : -1 - (int)pu->os_index,
            .numa = nodes == 1 ? os_of(numa) : -1,
            .package = os_of(pack),
        };
    }
    return n;
}

int sp_topo_pci_cpus(const sp_topo *t, const char *busid, cpu_set_t *set, char *where,
                     size_t len)
{
    CPU_ZERO(set);
    if (where && len) where[0] = '\0';
    hwloc_obj_t dev = hwloc_get_pcidev_by_busidstring(t->h, busid);
    hwloc_obj_t anc = dev ? hwloc_get_non_io_ancestor_obj(t->h, dev) : NULL;
    if (!anc || !anc->cpuset) return 0;
    int c = hwloc_bitmap_first(anc->cpuset);
    for (; c >= 0 && c < CPU_SETSIZE; c = hwloc_bitmap_next(anc->cpuset, c)) CPU_SET(c, set);
    if (where && len) {
        char type[32];
        hwloc_obj_type_snprintf(type, sizeof type, anc, 0);
        snprintf(where, len, "%s L#%u", type, anc->logical_index);
    }
    return CPU_COUNT(set) > 0;
}

int sp_topo_logical(const sp_topo *t, int os)
{
    hwloc_obj_t pu = hwloc_get_pu_obj_by_os_index(t->h, (unsigned)os);
    return pu ? (int)pu->logical_index : -1;
}
