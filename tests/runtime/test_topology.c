/* Each rank's GPU locality and cores on real node shapes, without the hardware: hwloc XML
 * topologies (tests/runtime/topo/) of a 2-socket 8-GPU node (DGX H100 layout, Intel
 * numbering: a core's hyperthreads are PUs c and c+112) and a 2-socket 4-GPU node (IBM
 * POWER8 Minsky, a real export: a core's hyperthreads are adjacent PUs). For 2 ranks, one
 * rank per GPU, two per GPU, any count in between, and more ranks than cores: each
 * rank's GPU CPU set is its socket's, its cores are on its GPU's NUMA node, no two ranks
 * share a core, no thread takes a core's second hyperthread while a core of the rank is
 * free, the ranks under one node get equal shares of its cores;
 * and runtime_gpumap's cases (STARPIPE_GPU overrides, nothing known, launcher masks) on
 * these nodes. OS-order splitting fails it on both nodes. Usage: test_topology TOPO_DIR */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/gpumap.h"
#include "runtime/topology.h"
#include "tests/check.h"

typedef struct {
    const char *file;
    int gpus;
    const char *bus[8]; /* CUDA's order: PCI order */
    int cores;          /* physical cores per socket */
} node;

static const node NODES[] = {
    { "dgx-8gpu.xml", 8,
      { "0000:1b:00.0", "0000:43:00.0", "0000:52:00.0", "0000:61:00.0", "0000:9D:00.0",
        "0000:c3:00.0", "0000:d1:00.0", "0000:df:00.0" }, 56 },
    { "power8-4gpu.xml", 4, { "0002:01:00.0", "0003:01:00.0", "000a:01:00.0", "000b:01:00.0" },
      4 },
};

static sp_pu pus[CPU_SETSIZE];
static int npus;

static const sp_pu *pu_of(int os)
{
    for (int i = 0; i < npus; i++)
        if (pus[i].os == os) return &pus[i];
    return NULL;
}

static void package_cpus(int p, cpu_set_t *s)
{
    CPU_ZERO(s);
    for (int i = 0; i < npus; i++)
        if (pus[i].package == p) CPU_SET(pus[i].os, s);
}

/* Every rank's share for one launch, and what must hold of it. near[r]: the CPUs near
 * rank r's GPU (empty: none). */
static void check_shares(const char *what, int L, const cpu_set_t *masks, const cpu_set_t *near)
{
    static int cpus[64][CPU_SETSIZE];
    int n[64], numa[64];
    for (int r = 0; r < L; r++)
        n[r] = sp_binding_split(pus, npus, masks, L, r, near, cpus[r], &numa[r]);
    /* ranks per NUMA node of their GPU (every rank of these nodes has one) */
    int per_node[8] = { 0 }, cores_node[8] = { 0 };
    for (int i = 0; i < npus; i++) {
        int first = 1;
        for (int j = 0; j < i; j++) first &= pus[j].core != pus[i].core;
        if (first && pus[i].numa >= 0 && pus[i].numa < 8) cores_node[pus[i].numa]++;
    }
    int gpu_numa[64];
    for (int r = 0; r < L; r++) {
        gpu_numa[r] = -1;
        if (CPU_COUNT(&near[r]))
            for (int c = 0; c < CPU_SETSIZE; c++)
                if (CPU_ISSET(c, &near[r])) {
                    gpu_numa[r] = pu_of(c)->numa;
                    break;
                }
        if (gpu_numa[r] >= 0) per_node[gpu_numa[r]]++;
    }
    for (int r = 0; r < L; r++) {
        int q = 0; /* the first rank under the same node */
        while (gpu_numa[q] != gpu_numa[r]) q++;
        CHECK(n[r] > 0 && n[r] == n[q], "%s, %d ranks: rank %d has %d cpus, rank %d %d", what,
              L, r, n[r], q, n[q]);
        if (n[r] <= 0) continue;
        /* on its GPU's NUMA node, and said so */
        if (gpu_numa[r] >= 0) {
            int off = 0;
            for (int i = 0; i < n[r]; i++) off += pu_of(cpus[r][i])->numa != gpu_numa[r];
            CHECK(off == 0 && numa[r] == gpu_numa[r], "%s, %d ranks: rank %d has %d cpus off its "
                  "GPU's NUMA node %d (says node %d)", what, L, r, off, gpu_numa[r], numa[r]);
        }
        /* whole cores first: the first k PUs sit on k distinct cores, k the rank's cores */
        int distinct = 0;
        for (int i = 0; i < n[r]; i++) {
            int fresh = 1;
            for (int j = 0; j < i; j++) fresh &= pu_of(cpus[r][j])->core != pu_of(cpus[r][i])->core;
            if (fresh) {
                CHECK(distinct == i, "%s, %d ranks: rank %d's PU %d (cpu %d) is a core's second "
                      "hyperthread while core of cpu %d is free", what, L, r, distinct, cpus[r][distinct],
                      cpus[r][i]);
                distinct++;
            }
        }
        /* balanced: each rank an even share of its node's cores (or of its hyperthreads) */
        if (gpu_numa[r] >= 0) {
            int g = per_node[gpu_numa[r]], c = cores_node[gpu_numa[r]];
            int want = g <= c ? c / g : 1;
            CHECK(distinct == want, "%s, %d ranks: rank %d has %d cores, want %d (%d ranks on "
                  "%d cores)", what, L, r, distinct, want, g, c);
        }
    }
    /* no two ranks on one core (on one PU, when ranks outnumber a node's cores) */
    for (int r = 0; r < L; r++)
        for (int q = r + 1; q < L; q++) {
            int crowded = gpu_numa[r] >= 0 && per_node[gpu_numa[r]] > cores_node[gpu_numa[r]];
            int shared = 0;
            for (int i = 0; i < n[r]; i++)
                for (int j = 0; j < n[q]; j++)
                    shared += crowded ? cpus[r][i] == cpus[q][j]
                                      : pu_of(cpus[r][i])->core == pu_of(cpus[q][j])->core;
            CHECK(shared == 0, "%s, %d ranks: ranks %d and %d share %d %s", what, L, r, q, shared,
                  crowded ? "PUs" : "cores");
        }
}

/* near[r] from hwloc for the GPU STARPIPE_GPU (override) gives local rank r of L */
static void gpu_cpus(const sp_topo *t, const node *nd, int L, const char *override, cpu_set_t *near)
{
    for (int r = 0; r < L; r++) {
        sp_gpu_choice c;
        CPU_ZERO(&near[r]);
        REQUIRE(sp_gpu_choose(r, L, nd->gpus, override, NULL, &c) == SP_OK, "%s", sp_last_error());
        if (c.device < 0) continue;
        char where[64];
        CHECK(sp_topo_pci_cpus(t, nd->bus[c.device], &near[r], where, sizeof where) == 1,
              "%s: GPU %s not found", nd->file, nd->bus[c.device]);
        cpu_set_t sock;
        int p = c.device / (nd->gpus / 2); /* half the GPUs under each package */
        package_cpus(p, &sock);
        CHECK(CPU_EQUAL(&near[r], &sock) && !strncmp(where, "Package", 7),
              "%s: GPU %d's CPUs (%d, under '%s') are not package %d's (%d)", nd->file,
              c.device, CPU_COUNT(&near[r]), where, p, CPU_COUNT(&sock));
    }
}

static void one_node(const char *dir, const node *nd)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, nd->file);
    sp_topo *t;
    REQUIRE(sp_topo_load(path, &t) == SP_OK, "%s", sp_last_error());
    npus = sp_topo_pus(t, pus, CPU_SETSIZE);
    REQUIRE(npus == 2 * nd->cores * 2, "%s: %d PUs, want %d", nd->file, npus, 4 * nd->cores);
    for (int i = 0; i < npus; i++)
        REQUIRE(pus[i].numa == pus[i].package && pus[i].numa >= 0 && pus[i].core >= 0 &&
                    sp_topo_logical(t, pus[i].os) == i,
                "%s: PU %d: core %d numa %d package %d", nd->file, pus[i].os, pus[i].core,
                pus[i].numa, pus[i].package);
    CHECK(sp_topo_pci_cpus(t, "0000:ee:00.0", &(cpu_set_t){ 0 }, NULL, 0) == 0,
          "%s: a device that is not there found", nd->file);

    enum { MAXL = 64 };
    static cpu_set_t all[MAXL], near[MAXL];
    cpu_set_t host;
    CPU_ZERO(&host);
    for (int i = 0; i < npus; i++) CPU_SET(pus[i].os, &host);
    /* 1 .. 2 ranks per GPU, and 4 */
    for (int L = 1; L <= 4 * nd->gpus; L += L < 2 * nd->gpus ? 1 : 2 * nd->gpus) {
        for (int r = 0; r < L; r++) all[r] = host; /* mpirun --bind-to none */
        gpu_cpus(t, nd, L, NULL, near);
        char what[128];
        snprintf(what, sizeof what, "%s, one GPU each, round robin", nd->file);
        check_shares(what, L, all, near);
    }

    /* runtime_gpumap's cases: one rank per GPU, GPUs of ranks 0..G/2-1 on socket 1 instead
     * (STARPIPE_GPU=4,5,6,7,0,1,2,3): those ranks move there */
    int G = nd->gpus, cpus[CPU_SETSIZE], numa, per = nd->cores / (G / 2);
    char list[64] = "";
    for (int r = 0; r < G; r++)
        snprintf(list + strlen(list), sizeof list - strlen(list), "%s%d", r ? "," : "",
                 (r + G / 2) % G);
    gpu_cpus(t, nd, G, list, near);
    check_shares(nd->file, G, all, near);
    int n = sp_binding_split(pus, npus, all, G, 1, near, cpus, &numa);
    CHECK(n == 2 * per && numa == 1 && pu_of(cpus[0])->package == 1,
          "%s, STARPIPE_GPU=%s: rank 1 has %d cpus on NUMA node %d", nd->file, list, n, numa);
    /* STARPIPE_GPU=none: nothing known, the host's cores split evenly in logical order
     * (rank G-1 on socket 1, whole cores first) */
    gpu_cpus(t, nd, G, "none", near);
    n = sp_binding_split(pus, npus, all, G, G - 1, near, cpus, &numa);
    CHECK(n == 2 * (2 * nd->cores / G) && numa == 1 && pu_of(cpus[0])->core != pu_of(cpus[1])->core,
          "%s, no GPU: rank %d has %d cpus, NUMA node %d", nd->file, G - 1, n, numa);
    n = sp_binding_split(pus, npus, all, G, 0, NULL, cpus, &numa);
    CHECK(n == 2 * (2 * nd->cores / G) && numa == 0, "%s, near unknown: rank 0 has %d cpus, "
          "NUMA node %d", nd->file, n, numa);
    /* launcher masks that are disjoint are kept: mpirun --bind-to core gives rank r the
     * last cores, the core's first hyperthread first */
    gpu_cpus(t, nd, G, NULL, near);
    for (int r = 0; r < G; r++) {
        CPU_ZERO(&all[r]);
        const sp_pu *last = &pus[npus - 1 - 2 * r];
        for (int i = 0; i < npus; i++)
            if (pus[i].core == last->core) CPU_SET(pus[i].os, &all[r]);
    }
    n = sp_binding_split(pus, npus, all, G, 2, near, cpus, &numa);
    CHECK(n == 2 && CPU_ISSET(cpus[0], &all[2]) && CPU_ISSET(cpus[1], &all[2]) &&
              pu_of(cpus[0]) < pu_of(cpus[1]) && numa == 1,
          "%s: launcher's mask not kept: %d cpus (%d, %d) numa %d", nd->file, n, cpus[0],
          cpus[1], numa);
    /* a launcher mask of two cores (--map-by ppr:..:PE=2): whole cores first */
    for (int r = 0; r < G / 2; r++) {
        CPU_ZERO(&all[r]);
        for (int i = 0; i < npus; i++)
            if (pus[i].core == pus[4 * r].core || pus[i].core == pus[4 * r + 2].core)
                CPU_SET(pus[i].os, &all[r]);
    }
    n = sp_binding_split(pus, npus, all, G / 2, 1, near, cpus, &numa);
    CHECK(n == 4 && pu_of(cpus[0])->core != pu_of(cpus[1])->core, "%s: a 2-core mask: %d cpus, "
          "first two %d %d", nd->file, n, cpus[0], cpus[1]);
    sp_topo_free(t);
}

int main(int argc, char **argv)
{
    REQUIRE(argc == 2, "usage: test_topology TOPO_DIR");
    for (size_t k = 0; k < sizeof NODES / sizeof *NODES; k++) one_node(argv[1], &NODES[k]);
    sp_topo *t;
    CHECK(sp_topo_load("/nonexistent.xml", &t) == SP_ERR_IO && !t, "a missing XML loaded");
    return check_summary("test_topology");
}
