/* Interop with the Python safetensors package: the C writer's file loads with
 * safetensors.numpy.load_file and holds the expected values (check_interop.py check),
 * and a file written by safetensors.numpy.save_file (its own tensor order, F16 and BOOL
 * too) passes the C reader's validation with the expected values. Exits 77 when python3
 * with safetensors and numpy is not there. Usage: test_interop path/to/check_interop.py */
#include <math.h>

#include "ck.h"
#include "fixture.h"

static double half_to_double(uint16_t h)
{
    int e = (h >> 10) & 31, m = h & 1023;
    double v = e ? ldexp(1024 + m, e - 25) : ldexp(m, -24);
    return (h & 0x8000) ? -v : v;
}

/* Element k of a tensor the Python side wrote, as a double. */
static double element(const sp_st_tensor *t, int64_t k)
{
    switch (t->dtype) {
    case SP_ST_F16: return half_to_double(((const uint16_t *)t->data)[k]);
    case SP_ST_F32: return ((const float *)t->data)[k];
    case SP_ST_F64: return ((const double *)t->data)[k];
    case SP_ST_I32: return ((const int32_t *)t->data)[k];
    case SP_ST_I64: return (double)((const int64_t *)t->data)[k];
    case SP_ST_U8: case SP_ST_BOOL: return ((const uint8_t *)t->data)[k];
    default: return NAN;
    }
}

static void check_python_file(const char *path)
{
    static const fx_spec extra[] = {{"half", SP_ST_F16, 2, {5, 3}, 10},
                                    {"mask", SP_ST_BOOL, 2, {2, 5}, 11}};
    sp_status st;
    sp_safetensors *f = sp_safetensors_open(path, 0, &st);
    REQUIRE(f, "the C reader refuses the Python file: %s", sp_last_error());
    CHECK(sp_safetensors_count(f) == FX_N + 2, "count %d", sp_safetensors_count(f));
    for (int i = 0; i < FX_N + 2; i++) {
        const fx_spec *s = i < FX_N ? &fx_specs[i] : &extra[i - FX_N];
        const sp_st_tensor *t = sp_safetensors_find(f, s->name);
        if (!t) {
            CHECK(0, "'%s' missing", s->name);
            continue;
        }
        CHECK(t->dtype == s->dtype && t->ndim == s->ndim, "'%s': dtype/ndim", s->name);
        int bad = 0;
        for (int d = 0; d < t->ndim && d < s->ndim; d++) bad += t->shape[d] != s->shape[d];
        for (int64_t k = 0; !bad && k < fx_numel(s); k++)
            bad += element(t, k) != fx_value(s->dtype, s->seed, k);
        CHECK(!bad, "'%s': %d mismatches", s->name, bad);
    }
    for (int k = 0; k < FX_NMETA; k++) {
        const char *v = sp_safetensors_meta(f, fx_meta[k].key);
        CHECK(v && !strcmp(v, fx_meta[k].value), "meta '%s'", fx_meta[k].key);
    }
    sp_safetensors_close(f);
}

int main(int argc, char **argv)
{
    REQUIRE(argc == 2, "usage: test_interop path/to/check_interop.py");
    if (system("python3 -c 'import safetensors.numpy, numpy' >/dev/null 2>&1") != 0) {
        printf("SKIP: python3 with the safetensors and numpy packages is not available "
               "(pip install safetensors numpy to run this test)\n");
        return 77;
    }
    const char *dir = ck_tmpdir("interop");
    char cfile[700], pyfile[700], cmd[2400];
    snprintf(cfile, sizeof cfile, "%s/from_c.safetensors", dir);
    snprintf(pyfile, sizeof pyfile, "%s/from_python.safetensors", dir);

    sp_st_tensor t[FX_N];
    fx_make(t);
    REQUIRE(sp_safetensors_write(cfile, t, FX_N, fx_meta, FX_NMETA, SP_ST_CHECKSUM) == SP_OK, "%s",
            sp_last_error());
    fx_free(t);
    snprintf(cmd, sizeof cmd, "python3 '%s' check '%s'", argv[1], cfile);
    fflush(NULL);
    CHECK(system(cmd) == 0, "Python refuses or misreads the C file: %s", cmd);

    snprintf(cmd, sizeof cmd, "python3 '%s' make '%s'", argv[1], pyfile);
    fflush(NULL);
    REQUIRE(system(cmd) == 0, "Python could not write: %s", cmd);
    check_python_file(pyfile);
    return ck_summary("ckpt.interop");
}
