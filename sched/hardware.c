/* Devices not at hand, described for the planner (include/starpipe/search.h): datasheet
 * rates, memory and links, and the kernel efficiency assumed for them. docs/scaling.md
 * lists the same numbers with their sources; change both together. */
#include <strings.h>

#include "starpipe/search.h"

static const sp_device_spec specs[] = {
    {
        .name = "h100",
        .title = "NVIDIA H100 SXM5 80GB",
        /* H100 datasheet: BF16 tensor core 1,979 TFLOP/s with 2:4 sparsity, half dense */
        .peak_flops = 989e12,
        /* assumed: FlashAttention-3 (Shah et al. 2024) reports 740 TFLOP/s, 75% of this
         * peak, for BF16 attention; large cuBLAS products reach about the same. Not
         * measured here (no H100 at hand) */
        .efficiency = 0.75,
        /* datasheet "80GB" read as 80e9 bytes; the device reports 81559 MiB (85.5e9):
         * the rest is left to what the model does not count (context, workspace) */
        .memory = 80e9,
        .memory_bw = 3.35e12, /* datasheet, HBM3 */
        /* NVLink 4 through NVSwitch: 900 GB/s per GPU both ways together (datasheet) */
        .nvlink_bw = 450e9,
        .nvlink_alpha = 1e-6, /* assumed, as starpipe-plan's tp_alpha */
        /* DGX H100: eight ConnectX-7 at 400 Gb/s, one per GPU (DGX H100 user guide) */
        .network_bw = 50e9,
        .network_alpha = 1e-5, /* assumed, as starpipe-plan's --allreduce alpha */
        .gpus_per_node = 8,
    },
    {
        .name = "h200",
        .title = "NVIDIA H200 SXM 141GB",
        .peak_flops = 989e12, /* H200 datasheet: the H100's tensor cores, 1,979 sparse */
        .efficiency = 0.75,   /* assumed, as the H100's: the same SMs and clocks */
        .memory = 141e9,      /* datasheet, HBM3e */
        .memory_bw = 4.8e12,  /* datasheet */
        .nvlink_bw = 450e9,   /* NVLink 4, 900 GB/s per GPU (datasheet) */
        .nvlink_alpha = 1e-6,
        .network_bw = 50e9,   /* DGX H200: eight 400 Gb/s ConnectX-7, as DGX H100 */
        .network_alpha = 1e-5,
        .gpus_per_node = 8,
    },
};

#define NSPECS ((int)(sizeof specs / sizeof *specs))

int sp_device_spec_count(void) { return NSPECS; }

const sp_device_spec *sp_device_spec_at(int i) { return i >= 0 && i < NSPECS ? &specs[i] : NULL; }

const sp_device_spec *sp_device_spec_find(const char *name)
{
    for (int i = 0; name && i < NSPECS; i++)
        if (!strcasecmp(name, specs[i].name)) return &specs[i];
    sp_set_error(SP_ERR_ARG, "unknown device '%s' (known: h100, h200)", name ? name : "");
    return NULL;
}
