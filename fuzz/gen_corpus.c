/* Writes the seed corpora of the fuzz targets (fuzz/corpus/<target>/): every built-in
 * schedule in the text format, hand-made broken schedules, schedule-selection and
 * command-line inputs, and small safetensors files (ours, and foreign-style ones).
 * Usage: gen_corpus fuzz/corpus. Deterministic: rerunning rewrites the same files. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "starpipe/plan.h"
#include "starpipe/safetensors.h"

static const char *root;

static void put(const char *target, const char *name, const void *data, size_t n)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", root, target);
    mkdir(path, 0755);
    snprintf(path, sizeof path, "%s/%s/%s", root, target, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, n, f) != n || fclose(f)) {
        fprintf(stderr, "gen_corpus: cannot write %s\n", path);
        exit(1);
    }
}
static void puts_(const char *target, const char *name, const char *text)
{
    put(target, name, text, strlen(text));
}

/* schedule_env input: 4 bytes, then NUL-separated name, SCHEDULE, MICROBATCHES, CHUNKS, file */
static void env_seed(const char *name, int p, int given, int m, int v, const char *f0,
                     const char *f1, const char *f2, const char *f3, const char *f4)
{
    char buf[2048];
    size_t n = 0;
    buf[n++] = (char)(p - 1), buf[n++] = (char)given, buf[n++] = (char)m, buf[n++] = (char)v;
    const char *f[5] = { f0, f1, f2, f3, f4 };
    for (int i = 0; i < 5; i++) {
        size_t l = strlen(f[i]);
        memcpy(buf + n, f[i], l);
        n += l;
        if (i < 4) buf[n++] = 0;
    }
    put("schedule_env", name, buf, n);
}

/* app_args input: byte 0 (1 = mlp), then the arguments separated by NUL */
static void args_seed(const char *name, int mlp, const char *const *args)
{
    char buf[1024];
    size_t n = 0;
    buf[n++] = (char)mlp;
    for (int i = 0; args[i]; i++) {
        size_t l = strlen(args[i]);
        memcpy(buf + n, args[i], l);
        n += l;
        if (args[i + 1]) buf[n++] = 0;
    }
    put("app_args", name, buf, n);
}

static void schedules(void)
{
    const int shapes[][3] = { { 2, 4, 2 }, { 3, 6, 2 }, { 4, 8, 2 }, { 1, 1, 1 } };
    for (int b = 0; b < sp_schedule_builtin_count(); b++) {
        const char *nm = sp_schedule_builtin_info(b)->name;
        for (size_t k = 0; k < sizeof shapes / sizeof *shapes; k++) {
            sp_schedule *s;
            if (sp_schedule_builtin(nm, shapes[k][0], shapes[k][1], shapes[k][2], &s) &&
                sp_schedule_builtin(nm, shapes[k][0], shapes[k][1], 1, &s))
                continue;
            char *text = NULL, file[128];
            size_t len = 0;
            FILE *f = open_memstream(&text, &len);
            sp_schedule_write(s, f);
            fclose(f);
            snprintf(file, sizeof file, "%s-p%d-m%d.sched", nm, shapes[k][0], shapes[k][1]);
            put("schedule_text", file, text, len);
            free(text);
            sp_schedule_free(s);
        }
    }
    const char *T = "schedule_text";
    puts_(T, "doc-example.sched",
          "# 1F1B on 2 actors, 2 microbatches\nschedule my-1f1b\nactors 2\nstages 2\n"
          "microbatches 2\nplace 0 1\nactor 0: F(0,0) F(1,0) BW(0,0) BW(1,0)\n"
          "actor 1: F(0,1) BW(0,1)\nactor 1: F(1,1) BW(1,1)   # repeated\n");
    puts_(T, "bad-cycle.sched", "actors 2\nstages 2\nmicrobatches 2\n"
          "actor 0: F(0,0) BW(0,0) F(1,0) BW(1,0)\nactor 1: F(1,1) BW(1,1) F(0,1) BW(0,1)\n"
          "# reorder to get a cycle\nactor 1:\n");
    puts_(T, "bad-cycle2.sched", "actors 2\nstages 2\nmicrobatches 2\n"
          "actor 0: F(0,0) BW(1,0) F(1,0) BW(0,0)\nactor 1: F(0,1) BW(0,1) F(1,1) BW(1,1)\n");
    puts_(T, "bad-duplicate.sched", "actors 1\nstages 1\nmicrobatches 1\nactor 0: F(0,0) F(0,0)\n");
    puts_(T, "bad-missing-header.sched", "actors 2\nactor 0: F(0,0)\n");
    puts_(T, "bad-task.sched", "actors 1\nstages 1\nmicrobatches 1\nactor 0: X(0,0) F(0 ,0)\n");
    puts_(T, "bad-range.sched", "actors 2\nstages 2\nmicrobatches 2\nplace 1 0\n"
          "actor 0: F(0,1) F(5,0) F(0,9)\n");
    puts_(T, "bad-numbers.sched", "actors 99999999999999999999\nstages -1\nmicrobatches 0x10\n");
    puts_(T, "bad-header-after.sched", "actors 1\nstages 1\nmicrobatches 1\nactor 0: F(0,0)\n"
          "stages 2\nschedule late\n");
    puts_(T, "bw-split-crlf.sched", "schedule\tsplit\r\nactors 2\r\nstages 2\r\nmicrobatches 1\r\n"
          "actor 0 : F(0,0) B(0,0) W(0,0)\r\nactor 1: F(0,1) B(0,1) W(0,1)\r\n");
    puts_(T, "v-shape.sched", "actors 2\nstages 4\nmicrobatches 1\nplace 0 1 1 0\n"
          "actor 0: F(0,0) F(0,3) BW(0,3) BW(0,0)\nactor 1: F(0,1) F(0,2) BW(0,2) BW(0,1)\n");
    puts_(T, "incomplete.sched", "actors 2\nstages 2\nmicrobatches 2\nactor 0: F(0,0)\n");
    puts_(T, "empty.sched", "");
}

static void envs(void)
{
    for (int b = 0; b < sp_schedule_builtin_count(); b++) {
        const char *nm = sp_schedule_builtin_info(b)->name;
        char file[96];
        snprintf(file, sizeof file, "name-%s", nm);
        env_seed(file, 2, 1, 4, 2, nm, "", "", "", "");
        snprintf(file, sizeof file, "env-%s", nm);
        env_seed(file, 3, 2 | 4 | 8, 0, 0, "", nm, "6", "2", "");
    }
    env_seed("help", 2, 2, 0, 0, "", "help", "", "", "");
    env_seed("unknown", 2, 1, 0, 0, "2f2b", "", "", "", "");
    env_seed("bad-m", 2, 4, 0, 0, "", "", "4x", "", "");
    env_seed("bad-m2", 2, 4, 0, 0, "", "", " -3 ", "", "");
    env_seed("bad-m3", 2, 4, 0, 0, "", "", "99999999999999999999", "", "");
    env_seed("bad-v", 2, 2 | 8, 0, 0, "", "interleaved-1f1b", "", "3 ", "");
    env_seed("constraint", 2, 1, 1, 2, "dualpipe-v", "", "", "", "");
    env_seed("file", 2, 1, 2, 0, "file:x", "", "", "",
             "actors 2\nstages 2\nmicrobatches 2\nactor 0: F(0,0) F(1,0) BW(0,0) BW(1,0)\n"
             "actor 1: F(0,1) BW(0,1) F(1,1) BW(1,1)\n");
    env_seed("file-env", 2, 2, 0, 0, "", "file:y", "", "", "actors 3\nstages 3\nmicrobatches 1\n");
}

static void args(void)
{
    const char *const *sets[] = {
        (const char *const[]){ "--layers", "2", "--channels", "16", "--heads", "2", "--context",
                               "16", "--batch", "2", "--steps", "3", "--schedule", "zb-h1",
                               "--check", NULL },
        (const char *const[]){ "--reference", "--steps", "2", "--lr", "3e-4", "--clip", "0",
                               "--seed", "7", NULL },
        (const char *const[]){ "--save", "a.safetensors", "--save-every", "2", "--load",
                               "b.safetensors", "--dump-grads", "g.safetensors", NULL },
        (const char *const[]){ "--microbatches", "4", "--chunks", "2", "--actors", "2",
                               "--resume", "c", NULL },
        (const char *const[]){ "--steps", "12x", NULL },
        (const char *const[]){ "--bogus", "1", NULL },
        (const char *const[]){ "--layers", NULL },
        (const char *const[]){ "--save-every", "3", NULL },
        (const char *const[]){ "--lr", "nan", "--clip", "1e40", NULL },
        (const char *const[]){ "--help", NULL },
        (const char *const[]){ "--data", "/dev/null", "--context", "65536", NULL },
        (const char *const[]){ "--layers", "4", "--stage-layers", "0,2,2,0", NULL },
        (const char *const[]){ "--stage-layers", "1,,2", "--stage-layers", "-1", NULL },
        (const char *const[]){ "--warmup", "10", "--lr-decay", "cosine", "--lr-min", "1e-4",
                               "--decay-steps", "100", "--log", "run.jsonl", "--peak-tflops",
                               "67", NULL },
        (const char *const[]){ "--lr-decay", "exp", "--warmup", "-1", "--peak-tflops", "0",
                               "--decay-steps", "0", "--lr-min", "11", NULL },
    };
    char name[32];
    for (size_t i = 0; i < sizeof sets / sizeof *sets; i++) {
        snprintf(name, sizeof name, "gpt-%zu", i);
        args_seed(name, 0, sets[i]);
    }
    args_seed("mlp-0", 1, (const char *const[]){ "--steps", "3", "--schedule",
                                                 "interleaved-1f1b", "--microbatches", "4",
                                                 "--check", NULL });
    args_seed("mlp-1", 1, (const char *const[]){ "--in", "8", "--width", "16", "--depth", "4",
                                                 "--classes", "3", "--batch", "5", NULL });
    args_seed("mlp-2", 1, (const char *const[]){ "--classes", "1", "--depth", "0", NULL });
    args_seed("mlp-3", 1, (const char *const[]){ "--depth", "4", "--stage-layers", "3,1,0",
                                                 NULL });
}

static void raw_st(const char *name, const char *json, const void *data, size_t n)
{
    size_t h = strlen(json);
    unsigned char *buf = malloc(8 + h + n);
    for (int k = 0; k < 8; k++) buf[k] = (unsigned char)((uint64_t)h >> (8 * k));
    memcpy(buf + 8, json, h);
    memcpy(buf + 8 + h, data, n);
    put("safetensors", name, buf, 8 + h + n);
    free(buf);
}

static void safetensors(const char *tmp)
{
    float a[6] = { 1, 2, 3, 4, 5, 6 }, m1[6] = { 0 };
    int64_t s23[2] = { 2, 3 }, s0[1] = { 0 }, s4[1] = { 4 };
    double d = 3.5;
    uint16_t h[4] = { 0x3c00, 0x4000, 0xbc00, 0 };
    uint8_t b[4] = { 1, 0, 1, 1 };
    struct { const char *file; sp_st_tensor t[5]; int n; sp_st_meta m[3]; int nm; unsigned fl; } f[] = {
        { "one-f32-crc", { { "w", SP_ST_F32, 2, s23, a } }, 1, { { "step", "1" } }, 1, SP_ST_CHECKSUM },
        { "dtypes", { { "x", SP_ST_F64, 0, NULL, &d }, { "h", SP_ST_F16, 1, s4, h },
                      { "bf", SP_ST_BF16, 1, s4, h }, { "b", SP_ST_BOOL, 1, s4, b },
                      { "empty", SP_ST_I32, 1, s0, NULL } }, 5, { { "k", "v" } }, 1, 0 },
        { "ckpt-style", { { "wte", SP_ST_F32, 2, s23, a }, { "wte.adam_m", SP_ST_F32, 2, s23, m1 },
                          { "wte.adam_v", SP_ST_F32, 2, s23, m1 } }, 3,
          { { "starpipe.format", "1" }, { "starpipe.model", "mlp in=2 width=3" },
            { "starpipe.step", "7" } }, 3, SP_ST_CHECKSUM },
        { "utf8-names", { { "\xc3\xa9t\xc3\xa9", SP_ST_U8, 1, s4, b } }, 1,
          { { "\xe2\x82\xac", "quote \" backslash \\ tab \t" } }, 1, SP_ST_CHECKSUM },
        /* the header checksum's key as a tensor name and inside a value (formats/ finds the
         * entry in the raw bytes) */
        { "crc-lookalike", { { "starpipe.header_crc32", SP_ST_U8, 1, s4, b } }, 1,
          { { "note", "\"starpipe.header_crc32\":\"0badf00d\"" } }, 1, SP_ST_CHECKSUM },
    };
    for (size_t i = 0; i < sizeof f / sizeof *f; i++) {
        char path[512];
        snprintf(path, sizeof path, "%s/%s.safetensors", tmp, f[i].file);
        if (sp_safetensors_write(path, f[i].t, f[i].n, f[i].m, f[i].nm, f[i].fl)) {
            fprintf(stderr, "gen_corpus: %s\n", sp_last_error());
            exit(1);
        }
        FILE *in = fopen(path, "rb");
        unsigned char buf[4096];
        size_t n = fread(buf, 1, sizeof buf, in);
        fclose(in);
        remove(path);
        snprintf(path, sizeof path, "%s.safetensors", f[i].file);
        put("safetensors", path, buf, n);
    }
    /* foreign style: unpadded header, so the data is misaligned; escapes; no metadata */
    raw_st("foreign-misaligned.safetensors",
           "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
           "\"b\\u00e9\":{\"dtype\":\"I64\",\"shape\":[1],\"data_offsets\":[8,16]}}",
           "\0\0\x80?\0\0\0@\x01\0\0\0\0\0\0\0", 16);
    raw_st("bad-overlap.safetensors",
           "{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]},"
           "\"b\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[2,6]}}", "abcdef", 6);
    raw_st("bad-shape.safetensors",
           "{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", "12345678", 8);
    raw_st("bad-json.safetensors", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1,\"data_offsets\"", "", 0);
    raw_st("empty-header.safetensors", "{}", "", 0);
    /* valid JSON that the format refuses (jansson reads -0 as 0; nesting is bounded) */
    raw_st("bad-negative-zero.safetensors",
           "{\"a\":{\"dtype\":\"F32\",\"shape\":[-0],\"data_offsets\":[0,0]}}", "", 0);
    raw_st("bad-nested.safetensors",
           "{\"a\":{\"dtype\":\"F32\",\"shape\":[[1]],\"data_offsets\":[0,4]}}", "1234", 4);
    put("safetensors", "short", "\x05\0\0", 3);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: gen_corpus CORPUS_DIR\n");
        return 2;
    }
    root = argv[1];
    mkdir(root, 0755);
    schedules();
    envs();
    args();
    safetensors(root);
    return 0;
}
