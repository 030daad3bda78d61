/* One GPU per rank without a GPU: the device each local rank takes and the StarPU
 * variables that make StarPU open only it, for nodes of 0, 1, 4 and 8 GPUs and 1..16
 * local ranks; STARPIPE_GPU overrides (none, a number, a list) and their refusals; the
 * physical name under CUDA_VISIBLE_DEVICES; and the cores each rank gets near its GPU on
 * a two-socket node, by NUMA node, package and physical core (runtime/gpumap.c). */
#define _GNU_SOURCE /* cpu_set_t */
#include <stdlib.h>
#include <string.h>

#include "runtime/gpumap.h"
#include "tests/check.h"

static void automatic(void)
{
    const int nodes[] = { 0, 1, 4, 8 };
    for (int k = 0; k < 4; k++)
        for (int L = 1; L <= 16; L++) {
            int G = nodes[k], used[8] = { 0 };
            for (int r = 0; r < L; r++) {
                sp_gpu_choice c;
                CHECK(sp_gpu_choose(r, L, G, NULL, NULL, &c) == SP_OK, "G %d L %d r %d: %s", G, L,
                      r, sp_last_error());
                if (G == 0) {
                    CHECK(c.device == -1 && !strcmp(c.ncuda, "0") && !c.cudaid[0] &&
                              strstr(c.line, "CPU only"), "G 0: device %d ncuda %s", c.device,
                          c.ncuda);
                    continue;
                }
                CHECK(c.device >= 0 && c.device < G, "G %d L %d r %d: device %d", G, L, r, c.device);
                CHECK(!strcmp(c.ncuda, "1") && atoi(c.cudaid) == c.device,
                      "G %d L %d r %d: STARPU_NCUDA=%s STARPU_WORKERS_CUDAID=%s", G, L, r,
                      c.ncuda, c.cudaid);
                used[c.device]++;
                int want = L / G + (c.device < L % G); /* round robin */
                CHECK(c.sharing == want, "G %d L %d r %d: sharing %d, want %d", G, L, r,
                      c.sharing, want);
                CHECK((c.sharing > 1) == (strstr(c.line, "shared by") != NULL),
                      "G %d L %d: line '%s'", G, L, c.line);
            }
            if (G > 0 && L <= G)
                for (int d = 0; d < G; d++)
                    CHECK(used[d] == (d < L), "G %d L %d: device %d used %d times", G, L, d,
                          used[d]);
        }
}

static void overrides(void)
{
    sp_gpu_choice c;
    CHECK(sp_gpu_choose(0, 4, 8, "none", NULL, &c) == SP_OK && c.device == -1 &&
              !strcmp(c.ncuda, "0"), "none");
    CHECK(sp_gpu_choose(2, 4, 8, "5", NULL, &c) == SP_OK && c.device == 5 && c.sharing == 4,
          "one number: device %d sharing %d", c.device, c.sharing);
    CHECK(sp_gpu_choose(2, 4, 8, "7,6,5,4", NULL, &c) == SP_OK && c.device == 5 && c.sharing == 1,
          "a list: device %d sharing %d", c.device, c.sharing);
    CHECK(sp_gpu_choose(3, 4, 8, "1,1,2,1", NULL, &c) == SP_OK && c.device == 1 && c.sharing == 3,
          "a list with repeats: device %d sharing %d", c.device, c.sharing);
    const char *bad[][2] = { { "8", "sees 8 GPUs" },       { "x", "not a device number" },
                             { "1,2", "lists 2 devices for 4 ranks" }, { "1,", "trailing comma" },
                             { ",1", "expected none" },    { "-1", "not a device number" } };
    for (size_t k = 0; k < sizeof bad / sizeof *bad; k++)
        CHECK(sp_gpu_choose(0, 4, 8, bad[k][0], NULL, &c) == SP_ERR_ARG &&
                  strstr(sp_last_error(), bad[k][1]),
              "STARPIPE_GPU='%s': '%s'", bad[k][0], sp_last_error());
    CHECK(sp_gpu_choose(0, 1, 0, "0", NULL, &c) == SP_ERR_ARG, "device 0 with no GPU accepted");
    /* the physical name under CUDA_VISIBLE_DEVICES */
    CHECK(sp_gpu_choose(1, 2, 2, NULL, "3,7", &c) == SP_OK && c.device == 1 &&
              strstr(c.line, "GPU 7 (CUDA_VISIBLE_DEVICES entry 1)"), "line '%s'", c.line);
}

static void cores(void)
{
    cpu_set_t s;
    CHECK(sp_parse_cpulist("0-3,8,10-11\n", &s) == SP_OK && CPU_COUNT(&s) == 7 &&
              CPU_ISSET(8, &s) && CPU_ISSET(11, &s) && !CPU_ISSET(9, &s), "cpulist");
    CHECK(sp_parse_cpulist("3-1", &s) == SP_ERR_FORMAT, "a backwards range accepted");
    CHECK(sp_parse_cpulist("0,x", &s) == SP_ERR_FORMAT, "garbage accepted");
    /* two sockets of 32 cores, 8 GPUs (0-3 near socket 0), 8 ranks, nothing bound */
    enum { L = 8 };
    cpu_set_t all[L], near[L], sock[2];
    sp_parse_cpulist("0-31", &sock[0]);
    sp_parse_cpulist("32-63", &sock[1]);
    for (int r = 0; r < L; r++) {
        sp_parse_cpulist("0-63", &all[r]);
        near[r] = sock[r / 4];
    }
    for (int r = 0; r < L; r++) {
        int cpus[CPU_SETSIZE], n = sp_binding_split(NULL, 0, all, L, r, near, cpus, NULL);
        CHECK(n == 8 && cpus[0] == 8 * r && cpus[7] == 8 * r + 7, "rank %d: %d cpus from %d", r,
              n, n ? cpus[0] : -1);
    }
    /* GPUs of rank 0..3 on socket 1 instead: those ranks move there */
    for (int r = 0; r < L; r++) near[r] = sock[1 - r / 4];
    int cpus[CPU_SETSIZE], n = sp_binding_split(NULL, 0, all, L, 1, near, cpus, NULL);
    CHECK(n == 8 && cpus[0] == 40, "rank 1 near socket 1: first cpu %d", n ? cpus[0] : -1);
    /* nothing known: an even split; launcher masks that are disjoint are kept */
    n = sp_binding_split(NULL, 0, all, L, 5, NULL, cpus, NULL);
    CHECK(n == 8 && cpus[0] == 40, "even split: rank 5 first cpu %d", cpus[0]);
    for (int r = 0; r < L; r++) {
        CPU_ZERO(&all[r]);
        CPU_SET(63 - r, &all[r]);
    }
    n = sp_binding_split(NULL, 0, all, L, 2, near, cpus, NULL);
    CHECK(n == 1 && cpus[0] == 61, "launcher's mask kept: %d", cpus[0]);
}

/* The node a GPU sits under, from a small PU table (tests/runtime/test_topology.c has real
 * topologies): 2 packages of 2 NUMA nodes of 2 cores of 2 hyperthreads, PU p on core p/2,
 * NUMA node p/4, package p/8. */
static void nodes(void)
{
    enum { N = 16, L = 4 };
    sp_pu pus[N];
    cpu_set_t all[L], near[L];
    for (int p = 0; p < N; p++) pus[p] = (sp_pu){ p, p / 2, p / 4, p / 8 };
    for (int r = 0; r < L; r++) sp_parse_cpulist("0-15", &all[r]);
    /* GPUs under NUMA node 0 (ranks 0, 1) and node 3 (ranks 2, 3): one core each */
    sp_parse_cpulist("0-3", &near[0]), near[1] = near[0];
    sp_parse_cpulist("12-15", &near[2]), near[3] = near[2];
    int cpus[CPU_SETSIZE], numa, n = sp_binding_split(pus, N, all, L, 3, near, cpus, &numa);
    CHECK(n == 2 && cpus[0] == 14 && cpus[1] == 15 && numa == 3, "NUMA node 3: %d cpus from %d, "
          "node %d", n, cpus[0], numa);
    /* a GPU under a package of two NUMA nodes (its CPUs: the package's): the ranks under
     * it share the package, whole cores first */
    sp_parse_cpulist("8-15", &near[2]), near[3] = near[2];
    n = sp_binding_split(pus, N, all, L, 2, near, cpus, &numa);
    CHECK(n == 4 && cpus[0] == 8 && cpus[1] == 10 && cpus[2] == 9 && numa == 2,
          "package 1: %d cpus from %d %d, node %d", n, cpus[0], cpus[1], numa);
    /* NUMA nodes unknown: by package */
    for (int p = 0; p < N; p++) pus[p].numa = -1;
    sp_parse_cpulist("12-13", &near[2]), near[3] = near[2];
    n = sp_binding_split(pus, N, all, L, 3, near, cpus, &numa);
    CHECK(n == 4 && cpus[0] == 12 && cpus[1] == 14 && numa == -1,
          "package unknown NUMA: %d cpus from %d %d, node %d", n, cpus[0], cpus[1], numa);
    /* more ranks than cores: the hyperthreads, one each, first ones first */
    cpu_set_t few[L];
    for (int r = 0; r < L; r++) sp_parse_cpulist("0-3", &few[r]);
    const int spread[L] = { 0, 2, 1, 3 };
    for (int r = 0; r < L; r++) {
        n = sp_binding_split(pus, N, few, L, r, NULL, cpus, NULL);
        CHECK(n == 1 && cpus[0] == spread[r], "4 ranks on 2 cores: rank %d has %d "
              "cpus from %d", r, n, cpus[0]);
    }
    /* more ranks than PUs: none */
    CHECK(sp_binding_split(pus, N, few, 3, 0, NULL, cpus, NULL) == 1, "3 ranks on 4 PUs");
    cpu_set_t two[3];
    for (int r = 0; r < 3; r++) sp_parse_cpulist("0-1", &two[r]);
    CHECK(sp_binding_split(pus, N, two, 3, 0, NULL, cpus, NULL) == 0, "3 ranks on 2 PUs");
}

int main(void)
{
    automatic();
    overrides();
    cores();
    nodes();
    return check_summary("test_gpumap");
}
