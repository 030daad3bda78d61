/* main() for a fuzz target built without libFuzzer (any compiler): runs
 * LLVMFuzzerTestOneInput once on every file named, or in the folders named, so the seed
 * corpus and saved crashes are regression tests in the ordinary build. A failed property
 * aborts; exit 0 means every input ran clean. */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n);

static int run_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "replay: cannot open %s\n", path);
        return -1;
    }
    size_t cap = 1 << 12, n = 0, r;
    uint8_t *buf = malloc(cap);
    while (buf && (r = fread(buf + n, 1, cap - n, f)) > 0)
        if ((n += r) == cap) buf = realloc(buf, cap *= 2);
    fclose(f);
    if (!buf) return -1;
    /* an exact-size copy, so ASan sees a read past the input's end */
    uint8_t *exact = malloc(n ? n : 1);
    memcpy(exact, buf, n);
    free(buf);
    LLVMFuzzerTestOneInput(exact, n);
    free(exact);
    return 0;
}

static int cmp(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

int main(int argc, char **argv)
{
    int runs = 0, bad = 0;
    for (int i = 1; i < argc; i++) {
        struct stat sb;
        if (stat(argv[i], &sb)) {
            fprintf(stderr, "replay: no such file or folder: %s\n", argv[i]);
            return 1;
        }
        if (!S_ISDIR(sb.st_mode)) {
            bad |= run_file(argv[i]) != 0, runs++;
            continue;
        }
        DIR *d = opendir(argv[i]);
        struct dirent *e;
        char **names = NULL;
        size_t nn = 0;
        while (d && (e = readdir(d)))
            if (e->d_name[0] != '.') {
                names = realloc(names, (nn + 1) * sizeof *names);
                names[nn] = malloc(strlen(argv[i]) + strlen(e->d_name) + 2);
                sprintf(names[nn++], "%s/%s", argv[i], e->d_name);
            }
        if (d) closedir(d);
        qsort(names, nn, sizeof *names, cmp);
        for (size_t k = 0; k < nn; k++) {
            bad |= run_file(names[k]) != 0, runs++;
            free(names[k]);
        }
        free(names);
    }
    printf("replay: %d inputs ran clean\n", runs - bad);
    if (!runs) fprintf(stderr, "replay: no inputs\n");
    return bad || !runs;
}
