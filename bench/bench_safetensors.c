/* Safetensors speed: CRC-32 throughput, writing and reading back a large checkpoint with
 * checksums, and opening a header of many small tensors (the JSON parse). Best of 3 runs;
 * what is read is compared byte for byte with what was written (exit 1 on a difference).
 * Usage: bench_safetensors [--mb N (512)] [--tensors K (64)] [--small S (100000)]
 *                          [--dir D (/dev/shm, else /tmp: tmpfs makes fsync free)] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench/bench_util.h"
#include "starpipe/safetensors.h"

static void die(const char *what) { bench_die("bench_safetensors", what); }

/* The best of 3 writes of n tensors to path, with checksums. */
static double best_write(const char *path, const sp_st_tensor *t, int n)
{
    double best = 1e30;
    for (int r = 0; r < 3; r++) {
        double t0 = now();
        if (sp_safetensors_write(path, t, n, NULL, 0, SP_ST_CHECKSUM)) die("write");
        double dt = now() - t0;
        best = dt < best ? dt : best;
    }
    return best;
}

/* The best of 3 opens of path (checksums required and verified), holding want tensors. */
static double best_open(const char *path, int want)
{
    double best = 1e30;
    for (int r = 0; r < 3; r++) {
        sp_status st;
        double t0 = now();
        sp_safetensors *f = sp_safetensors_open(path, SP_ST_REQUIRE_CHECKSUM, &st);
        double dt = now() - t0;
        if (!f || sp_safetensors_count(f) != want) die("open");
        best = dt < best ? dt : best;
        sp_safetensors_close(f);
    }
    return best;
}

int main(int argc, char **argv)
{
    long mb = 512, nt = 64, small = 100000;
    const char *dir = access("/dev/shm", W_OK) ? "/tmp" : "/dev/shm";
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--mb")) mb = atol(argv[i + 1]);
        else if (!strcmp(argv[i], "--tensors")) nt = atol(argv[i + 1]);
        else if (!strcmp(argv[i], "--small")) small = atol(argv[i + 1]);
        else if (!strcmp(argv[i], "--dir")) dir = argv[i + 1];
        else {
            fprintf(stderr, "bench_safetensors: unknown flag %s\n", argv[i]);
            return 2;
        }
    }
    if (mb < 1 || nt < 1 || small < 1 || small > 1 << 30) return 2;
    char path[512];
    snprintf(path, sizeof path, "%s/bench-st-%d.safetensors", dir, (int)getpid());

    /* nt F32 tensors of (rows, 1024) holding mb MB in all */
    size_t per = ((size_t)mb << 20) / (size_t)nt / 4096 * 4096, all = per * (size_t)nt;
    unsigned char *buf = malloc(all + 4 * (size_t)small);
    sp_st_tensor *t = calloc((size_t)(nt > small ? nt : small), sizeof *t);
    int64_t (*shape)[2] = calloc((size_t)nt, sizeof *shape);
    char (*name)[32] = calloc((size_t)(nt > small ? nt : small), sizeof *name);
    if (!buf || !t || !shape || !name || !per) return 1;
    for (size_t k = 0; k < all + 4 * (size_t)small; k++)
        buf[k] = (unsigned char)(k * 2654435761u >> 13);
    for (long k = 0; k < nt; k++) {
        snprintf(name[k], sizeof name[k], "h.%ld.w", k);
        shape[k][0] = (int64_t)(per / 4096), shape[k][1] = 1024;
        t[k] = (sp_st_tensor){name[k], SP_ST_F32, 2, shape[k], buf + (size_t)k * per};
    }
    double total = (double)all, best = 1e30;
    printf("%.0f MB in %ld tensors, files in %s\n", total / (1 << 20), nt, dir);

    uint32_t c = 0;
    for (int r = 0; r < 3; r++) {
        double t0 = now();
        c = sp_crc32(0, buf, all);
        double dt = now() - t0;
        best = dt < best ? dt : best;
    }
    printf("sp_crc32                  %8.1f ms  %6.2f GB/s  (crc %08x)\n", best * 1e3,
           total / best / 1e9, c);

    best = best_write(path, t, (int)nt);
    printf("write, checksums          %8.1f ms  %6.2f GB/s\n", best * 1e3, total / best / 1e9);
    best = best_open(path, (int)nt);
    printf("open, checksums verified  %8.1f ms  %6.2f GB/s\n", best * 1e3, total / best / 1e9);
    sp_status st;
    sp_safetensors *f = sp_safetensors_open(path, SP_ST_REQUIRE_CHECKSUM, &st);
    for (long k = 0; f && k < nt; k++) {
        const sp_st_tensor *g = sp_safetensors_find(f, name[k]);
        if (!g || memcmp(g->data, t[k].data, per)) {
            fprintf(stderr, "bench_safetensors: tensor %s read back differs\n", name[k]);
            return 1;
        }
    }
    sp_safetensors_close(f);
    unlink(path);

    /* many scalars: the header is nearly all of the file */
    for (long k = 0; k < small; k++) {
        snprintf(name[k], sizeof name[k], "layer.%ld.scale", k);
        t[k] = (sp_st_tensor){name[k], SP_ST_F32, 0, NULL, buf + 4 * (size_t)k};
    }
    best = best_write(path, t, (int)small);
    printf("write, %ld scalars   %8.1f ms  %6.2f us per tensor\n", small, best * 1e3,
           best * 1e6 / (double)small);
    best = best_open(path, (int)small);
    printf("open, %ld scalars    %8.1f ms  %6.2f us per tensor\n", small, best * 1e3,
           best * 1e6 / (double)small);
    unlink(path);
    free(buf), free(t), free(shape), free(name);
    return 0;
}
