/* Text, variables and numbers handed to the library, refused when anything is off:
 * a schedule is parsed to its last byte (a NUL byte or invalid UTF-8 after a valid
 * schedule names file:line); STARPIPE_* variables are parsed like flags (garbage, empty
 * values, out of range); the simulator refuses non-finite or overflowing costs, and no
 * trace it writes holds nan or inf. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/env.h"
#include "base/files.h"
#include "starpipe/plan.h"
#include "tests/check.h"
#include "tests/hardening/scratch.h"


static void write_bytes(const char *path, const char *bytes, size_t n)
{
    FILE *f = fopen(path, "wb");
    REQUIRE(f && fwrite(bytes, 1, n, f) == n && !fclose(f), "cannot write %s", path);
}

#define VALID "actors 1\nstages 1\nmicrobatches 1\nactor 0: F(0,0) BW(0,0)\n"

static void schedule_text(void)
{
    sp_schedule *s = NULL;
    /* the valid prefix alone parses */
    static const char ok[] = VALID "# caf\xc3\xa9 \xe2\x9c\x93\n";
    write_bytes(at("ok.sched"), ok, sizeof ok - 1);
    CHECK(sp_schedule_load(at("ok.sched"), &s) == SP_OK, "valid UTF-8: %s", sp_last_error());
    sp_schedule_free(s);
    s = NULL;
    /* a NUL byte after it, then anything: refused, naming line 5 */
    static const char nul[] = VALID "\0actor 0: F(0,0)\n";
    write_bytes(at("nul.sched"), nul, sizeof nul - 1);
    sp_status st = sp_schedule_load(at("nul.sched"), &s);
    CHECK(st == SP_ERR_FORMAT && !s && strstr(sp_last_error(), "nul.sched:5:") &&
              strstr(sp_last_error(), "NUL"), "NUL byte: %s %s", sp_status_name(st),
          sp_last_error());
    /* a NUL inside a line of tasks */
    static const char nul2[] = "actors 1\nstages 1\nmicrobatches 1\nactor 0: F(0,0)\0 BW(0,0)\n";
    write_bytes(at("nul2.sched"), nul2, sizeof nul2 - 1);
    st = sp_schedule_load(at("nul2.sched"), &s);
    CHECK(st == SP_ERR_FORMAT && strstr(sp_last_error(), "nul2.sched:4:"), "NUL in a line: %s",
          sp_last_error());
    /* invalid UTF-8 in a comment after the schedule, and an overlong form in a name */
    static const char bad[] = VALID "# \xff\n";
    write_bytes(at("bad.sched"), bad, sizeof bad - 1);
    st = sp_schedule_load(at("bad.sched"), &s);
    CHECK(st == SP_ERR_FORMAT && strstr(sp_last_error(), "bad.sched:5:") &&
              strstr(sp_last_error(), "UTF-8"), "invalid UTF-8: %s", sp_last_error());
    CHECK(sp_schedule_parse("schedule \xc0\xaf\n" VALID, "text", &s) == SP_ERR_FORMAT &&
              strstr(sp_last_error(), "text:1:"), "overlong: %s", sp_last_error());
    /* trailing garbage after the tasks */
    CHECK(sp_schedule_parse(VALID "garbage\n", "text", &s) == SP_ERR_FORMAT &&
              strstr(sp_last_error(), "text:5:"), "trailing garbage: %s", sp_last_error());
    CHECK(sp_schedule_parse("actors 1\nstages 1\nmicrobatches 1x\n", "text", &s) == SP_ERR_FORMAT,
          "number with a tail");
    /* a long name is cut at a character boundary: it stays valid UTF-8 */
    char text[512];
    snprintf(text, sizeof text, "schedule %s\n" VALID,
             "\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9"
             "\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9"
             "\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9"
             "\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9");
    REQUIRE(sp_schedule_parse(text, "text", &s) == SP_OK, "long name: %s", sp_last_error());
    size_t n = strlen(s->name), k = 0;
    while (k < n && sp_utf8_seq((const unsigned char *)s->name + k, n - k))
        k += sp_utf8_seq((const unsigned char *)s->name + k, n - k);
    CHECK(k == n && n > 0, "the cut name is not valid UTF-8");
    REQUIRE(sp_schedule_save(s, at("name.sched")) == SP_OK, "save: %s", sp_last_error());
    sp_schedule *back = NULL;
    CHECK(sp_schedule_load(at("name.sched"), &back) == SP_OK && !strcmp(back->name, s->name),
          "the name does not read back: %s", sp_last_error());
    sp_schedule_free(back);
    sp_schedule_free(s);
}

static void variables(void)
{
    int64_t v = 7;
    double d = 7;
    const char *s;
    unsetenv("STARPIPE_T");
    CHECK(sp_env_int("STARPIPE_T", 0, 2, &v) == SP_OK && v == 7, "unset leaves the value");
    const char *bad_ints[] = { "", "abc", "-1", "3", "1x", " 1", "1 ", "0x1", "99999999999999999999" };
    for (size_t k = 0; k < sizeof bad_ints / sizeof *bad_ints; k++) {
        setenv("STARPIPE_T", bad_ints[k], 1);
        CHECK(sp_env_int("STARPIPE_T", 0, 2, &v) == SP_ERR_ARG && strstr(sp_last_error(),
              "STARPIPE_T"), "integer '%s' accepted", bad_ints[k]);
    }
    const char *bad_doubles[] = { "", "abc", "-1", "nan", "inf", "-inf", "1e400", "1s", "0x" };
    for (size_t k = 0; k < sizeof bad_doubles / sizeof *bad_doubles; k++) {
        setenv("STARPIPE_T", bad_doubles[k], 1);
        CHECK(sp_env_double("STARPIPE_T", 0, 1e6, &d) == SP_ERR_ARG, "number '%s' accepted",
              bad_doubles[k]);
    }
    setenv("STARPIPE_T", "2.5", 1);
    CHECK(sp_env_double("STARPIPE_T", 0, 1e6, &d) == SP_OK && d == 2.5, "2.5");
    setenv("STARPIPE_T", "", 1);
    CHECK(sp_env_string("STARPIPE_T", &s) == SP_ERR_ARG, "an empty string accepted");
    const char *bad_faults[] = { "", "nan", "nan@", "nan@0", "nan@x", "nan@2:1", "fail@2",
                                 "fail@2:", "fail@:1", "fail@2:-1", "hang@2:1x", "boom@1:1",
                                 "fail@2:1:3", "late@", "late@-1", "late@1:0", "late@x" };
    sp_fault f;
    for (size_t k = 0; k < sizeof bad_faults / sizeof *bad_faults; k++) {
        setenv("STARPIPE_FAULT", bad_faults[k], 1);
        CHECK(sp_env_fault(&f) == SP_ERR_ARG, "STARPIPE_FAULT='%s' accepted", bad_faults[k]);
    }
    setenv("STARPIPE_FAULT", "hang@3:1", 1);
    CHECK(sp_env_fault(&f) == SP_OK && f.kind == SP_FAULT_HANG && f.step == 3 && f.stage == 1,
          "hang@3:1");
    setenv("STARPIPE_FAULT", "late@0", 1);
    CHECK(sp_env_fault(&f) == SP_OK && f.kind == SP_FAULT_LATE && f.step == 0 && f.stage == -1,
          "late@0");
    unsetenv("STARPIPE_FAULT");
    /* the planner's variables: set means a value, as the flags */
    sp_schedule *sch = NULL;
    unsetenv("STARPIPE_CHUNKS");
    const char *vars[][2] = { { "STARPIPE_SCHEDULE", "" }, { "STARPIPE_MICROBATCHES", "" },
                              { "STARPIPE_MICROBATCHES", "4 " }, { "STARPIPE_MICROBATCHES", "-2" },
                              { "STARPIPE_CHUNKS", "" }, { "STARPIPE_CHUNKS", "2x" } };
    for (size_t k = 0; k < sizeof vars / sizeof *vars; k++) {
        setenv(vars[k][0], vars[k][1], 1);
        CHECK(sp_schedule_from_env(NULL, 2, 0, 0, &sch) == SP_ERR_ARG && !sch &&
                  strstr(sp_last_error(), vars[k][0]), "%s='%s' accepted", vars[k][0],
              vars[k][1]);
        unsetenv(vars[k][0]);
    }
}

static void nonfinite(void)
{
    sp_stage_model *model = sp_stage_model_chain(2, 1, 1, 1, 16);
    sp_schedule *sch = NULL;
    sp_plan *plan = NULL;
    sp_sim_result *r = NULL;
    REQUIRE(model && sp_schedule_builtin("1f1b", 2, 4, 0, &sch) == SP_OK &&
                sp_plan_build(model, sch, &plan) == SP_OK, "setup: %s", sp_last_error());
    /* costs and channel parameters: nan, inf, negative, or so large a sum overflows */
    const double bad[] = { NAN, INFINITY, -1, 1e300 };
    for (size_t k = 0; k < sizeof bad / sizeof *bad; k++) {
        model->stage[1].cost[SP_TASK_F] = bad[k];
        CHECK(sp_simulate(plan, model, NULL, &r) == SP_ERR_ARG && !r, "cost %g accepted", bad[k]);
        model->stage[1].cost[SP_TASK_F] = 1;
        sp_sim_config cfg = { .latency = bad[k] };
        CHECK(sp_simulate(plan, model, &cfg, &r) == SP_ERR_ARG && !r, "latency %g accepted",
              bad[k]);
        cfg = (sp_sim_config){ .bandwidth = bad[k] };
        CHECK(sp_simulate(plan, model, &cfg, &r) == SP_ERR_ARG && !r, "bandwidth %g accepted",
              bad[k]);
    }
    sp_sim_config tiny = { .bandwidth = 1e-300 }; /* bytes / bandwidth would be inf */
    CHECK(sp_simulate(plan, model, &tiny, &r) == SP_ERR_ARG, "bandwidth 1e-300 accepted");
    /* a trace of a result holding a nan is refused, and nothing is written */
    REQUIRE(sp_simulate(plan, model, NULL, &r) == SP_OK, "simulate: %s", sp_last_error());
    REQUIRE(sp_sim_write_trace(plan, r, at("ok.json")) == SP_OK, "trace: %s", sp_last_error());
    FILE *f = fopen(at("ok.json"), "r");
    char buf[65536];
    size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
    if (f) fclose(f);
    buf[n] = 0;
    CHECK(n > 0 && !strstr(buf, "nan") && !strstr(buf, "inf"), "a finite trace holds nan/inf");
    r->end[1][2] = NAN;
    CHECK(sp_sim_write_trace(plan, r, at("nan.json")) == SP_ERR_ARG &&
              access(at("nan.json"), F_OK) != 0, "a trace with a nan written: %s", sp_last_error());
    CHECK(sp_sim_write_svg(plan, r, at("nan.svg")) == SP_ERR_ARG, "an SVG with a nan written");
    r->end[1][2] = r->start[1][2];
    r->step_time = INFINITY;
    CHECK(sp_sim_write_trace(plan, r, at("inf.json")) == SP_ERR_ARG, "infinite step time");
    sp_sim_result_free(r);
    sp_plan_free(plan);
    sp_schedule_free(sch);
    sp_stage_model_free(model);
}

int main(void)
{
    scratch_open("inputs");
    schedule_text();
    variables();
    nonfinite();
    scratch_close();
    return check_summary("hardening.inputs");
}
