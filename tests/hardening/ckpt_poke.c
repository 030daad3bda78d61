/* ckpt_poke IN OUT: copies the checkpoint IN to OUT with the first floats of every
 * tensor set to values that must survive any path exactly: -0.0, the smallest
 * denormal, a large denormal, FLT_MAX and -FLT_MAX (AdamW's v, read under a square root,
 * gets their absolute values). Tensors, metadata and their order are kept, so a run that
 * loads OUT and saves it again unchanged must write the same bytes.
 * ckpt_poke IN OUT KEY VALUE: the same copy with the tensors unchanged and metadata KEY
 * set to VALUE (added when absent), checksums recomputed: a checkpoint that loads, with
 * whatever its metadata says (a tampered starpipe.settings). */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "starpipe/safetensors.h"

int main(int argc, char **argv)
{
    if (argc != 3 && argc != 5) {
        fprintf(stderr, "usage: ckpt_poke IN OUT [KEY VALUE]\n");
        return 2;
    }
    const char *key = argc == 5 ? argv[3] : NULL;
    sp_status st;
    sp_safetensors *f = sp_safetensors_open(argv[1], SP_ST_REQUIRE_CHECKSUM, &st);
    if (!f) {
        fprintf(stderr, "ckpt_poke: %s\n", sp_last_error());
        return 1;
    }
    int n = sp_safetensors_count(f), nm = 0;
    sp_st_tensor *t = calloc((size_t)n, sizeof *t);
    sp_st_meta *m = calloc((size_t)sp_safetensors_meta_count(f) + 2, sizeof *m);
    float **copy = calloc((size_t)n, sizeof *copy);
    if (!t || !m || !copy) return 1;
    const float special[5] = { -0.0f, 0x1p-149f, 0x1.fffffcp-127f, FLT_MAX, -FLT_MAX };
    for (int i = 0; i < n; i++) {
        t[i] = *sp_safetensors_at(f, i);
        size_t bytes = sp_st_nbytes(&t[i]), count = bytes / sizeof(float);
        if (t[i].dtype != SP_ST_F32 || !(copy[i] = malloc(bytes ? bytes : 1))) return 1;
        memcpy(copy[i], t[i].data, bytes);
        int v = strstr(t[i].name, ".adam_v") != NULL;
        for (size_t k = 0; !key && k < count && k < 5; k++)
            copy[i][k] = v ? fabsf(special[k]) : special[k];
        t[i].data = copy[i];
    }
    for (int i = 0; i < sp_safetensors_meta_count(f); i++) {
        const sp_st_meta *e = sp_safetensors_meta_at(f, i);
        if (strncmp(e->key, "starpipe.", 9) || !strstr(e->key, "crc32")) m[nm++] = *e;
    }
    int set = 0;
    for (int i = 0; key && i < nm; i++)
        if (!strcmp(m[i].key, key)) m[i].value = argv[4], set = 1;
    if (key && !set) m[nm++] = (sp_st_meta){ .key = key, .value = argv[4] };
    st = sp_safetensors_write(argv[2], t, n, m, nm, SP_ST_CHECKSUM);
    if (st) fprintf(stderr, "ckpt_poke: %s\n", sp_last_error());
    for (int i = 0; i < n; i++) free(copy[i]);
    free(copy), free(m), free(t);
    sp_safetensors_close(f);
    return st ? 1 : 0;
}
