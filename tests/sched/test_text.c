/* The schedule text format and schedule selection: every built-in round-trips through a
 * file to the same plan; malformed files fail with file:line and the offending token;
 * STARPIPE_SCHEDULE / _MICROBATCHES / _CHUNKS select schedules, flags override them, and
 * bad values name themselves. */
#include <string.h>
#include <unistd.h>

#include "test_util.h"

static int same_schedule(const sp_schedule *a, const sp_schedule *b)
{
    if (a->nactors != b->nactors || a->nstages != b->nstages || a->nmicro != b->nmicro
        || strcmp(a->name, b->name))
        return 0;
    if (memcmp(a->stage_actor, b->stage_actor, (size_t)a->nstages * sizeof(int))) return 0;
    for (int q = 0; q < a->nactors; q++)
        if (a->ntasks[q] != b->ntasks[q]
            || memcmp(a->tasks[q], b->tasks[q], (size_t)a->ntasks[q] * sizeof(sp_task)))
            return 0;
    return 1;
}

static int same_plan(const sp_plan *a, const sp_plan *b)
{
    if (a->nactors != b->nactors || a->nmessages != b->nmessages || a->naccess != b->naccess)
        return 0;
    for (int q = 0; q < a->nactors; q++)
        if (a->ninstr[q] != b->ninstr[q]
            || memcmp(a->instr[q], b->instr[q], (size_t)a->ninstr[q] * sizeof(sp_instr))
            || memcmp(&a->peak[q], &b->peak[q], sizeof a->peak[q]))
            return 0;
    return !memcmp(a->access, b->access, a->naccess * sizeof *a->access);
}

/* Parses text named "t.sched" and expects failure with a message containing `want`. */
static void bad(const char *text, const char *want)
{
    sp_schedule *s = NULL;
    sp_status st = sp_schedule_parse(text, "t.sched", &s);
    CHECK(st == SP_ERR_FORMAT && s == NULL, "accepted:\n%s", text);
    CHECK(strstr(sp_last_error(), want) != NULL, "message '%s' lacks '%s'", sp_last_error(),
          want);
    sp_schedule_free(s);
}

int main(void)
{
    char path[] = "/tmp/sp_test_text_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0, "mkstemp");
    close(fd);

    /* 1. Round trip: file -> same schedule -> same plan, byte for byte. */
    struct { const char *name; int p, m, v; } cases[] = {
        { "gpipe", 4, 6, 0 },       { "1f1b", 5, 7, 0 },  { "eager-1f1b", 3, 9, 0 },
        { "interleaved-1f1b", 4, 8, 3 }, { "zb-h1", 6, 10, 0 }, { "zb-v", 4, 9, 2 },
        { "dualpipe-v", 3, 10, 2 },
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        sp_schedule *a, *b;
        MUST(sp_schedule_builtin(cases[c].name, cases[c].p, cases[c].m, cases[c].v, &a));
        MUST(sp_schedule_save(a, path));
        MUST(sp_schedule_load(path, &b));
        CHECK(same_schedule(a, b), "%s: schedule differs after a round trip", cases[c].name);
        sp_stage_model *md = sp_stage_model_chain(a->nstages, 1, 2, 1, 100);
        sp_plan *pa, *pb;
        MUST(sp_plan_build(md, a, &pa));
        MUST(sp_plan_build(md, b, &pb));
        CHECK(same_plan(pa, pb), "%s: plan differs after a round trip", cases[c].name);
        sp_plan_free(pa), sp_plan_free(pb);
        sp_stage_model_free(md);
        sp_schedule_free(a), sp_schedule_free(b);
    }

    /* 2. A hand-written file with comments, split actor lines and a custom placement. */
    const char *ok =
        "# two actors, stages placed 0 1 1 0 (a V)\n"
        "schedule my-v   # a name\n"
        "actors 2\nstages 4\nmicrobatches 1\n"
        "place 0 1 1 0\n"
        "actor 0: F(0,0)\n"
        "actor 1: F(0,1) F(0,2)\n"
        "actor 0: F(0,3) BW(0,3)   # last stage turns around\n"
        "actor 1 : B(0,2) B(0,1) W(0,2) W(0,1)\n"
        "actor 0: BW(0,0)\n";
    sp_schedule *s;
    MUST(sp_schedule_parse(ok, "ok.sched", &s));
    CHECK(!strcmp(s->name, "my-v") && s->stage_actor[3] == 0 && s->ntasks[0] == 4
              && s->ntasks[1] == 6, "hand-written file parsed wrong");
    sp_stage_model *md4 = sp_stage_model_chain(4, 1, 1, 1, 1);
    MUST(sp_schedule_validate(s, md4));
    sp_schedule_free(s);
    sp_stage_model_free(md4);

    /* 3. Errors name file:line and the token. */
    const char *hdr = "actors 2\nstages 2\nmicrobatches 2\n";
    char buf[512];
    bad("actorz 2\n", "t.sched:1: unknown keyword 'actorz'");
    bad("actors two\n", "t.sched:1: not a positive number: 'two'");
    bad("actors 2\nactors 3\n", "t.sched:2: given twice: 'actors'");
    bad("actors 2\nactor 0: F(0,0)\n", "t.sched:2:");
    snprintf(buf, sizeof buf, "%s\nactor 0: F(0,0) X(1,0)\n", hdr);
    bad(buf, "t.sched:5: bad task 'X(1,0)'");
    snprintf(buf, sizeof buf, "%sactor 0: F(0,0) F(0, 0)\n", hdr);
    bad(buf, "t.sched:4: bad task 'F(0,'");
    snprintf(buf, sizeof buf, "%sactor 0: F(2,0)\n", hdr);
    bad(buf, "t.sched:4: microbatch out of range in 'F(2,0)'");
    snprintf(buf, sizeof buf, "%sactor 0: BW(0,5)\n", hdr);
    bad(buf, "t.sched:4: stage out of range in 'BW(0,5)'");
    snprintf(buf, sizeof buf, "%sactor 1: F(0,0)\n", hdr);
    bad(buf, "t.sched:4: task on actor 1: 'F(0,0)': stage 0 is placed on actor 0");
    snprintf(buf, sizeof buf, "%sactor 0: F(0,0)\n# c\nactor 0: F(0,0)\n", hdr);
    bad(buf, "t.sched:6: duplicate task 'F(0,0)' (first listed on line 4)");
    snprintf(buf, sizeof buf, "%splace 0\n", hdr);
    bad(buf, "t.sched:4: wrong length of 'place'");
    /* a second placement would move stages under tasks already checked against the first */
    snprintf(buf, sizeof buf, "%splace 0 1\nplace 1 0\n", hdr);
    bad(buf, "t.sched:5: given twice: 'place' (first given on line 4)");
    snprintf(buf, sizeof buf, "%sactor 0: F(0,0)\nplace 1 0\n", hdr);
    bad(buf, "t.sched:5: must come before 'actor' lines: 'place'");
    snprintf(buf, sizeof buf, "%splace 0 7\n", hdr);
    bad(buf, "t.sched:4: bad actor '7'");
    snprintf(buf, sizeof buf, "%sactor 9: F(0,0)\n", hdr);
    bad(buf, "t.sched:4: bad actor '9:'");
    snprintf(buf, sizeof buf, "%sactor 0 F(0,0)\n", hdr);
    bad(buf, "t.sched:4: expected 'A:'");
    bad("actors 2\nstages 2\n", "t.sched:3: 'actors', 'stages' and 'microbatches' must come "
        "before 'end of file'");
    CHECK(sp_schedule_load("/nonexistent/x.sched", &s) == SP_ERR_IO
              && strstr(sp_last_error(), "/nonexistent/x.sched"), "missing file: %s",
          sp_last_error());

    /* 4. A file that parses but is not a valid schedule is rejected by validation. */
    snprintf(buf, sizeof buf, "%sactor 0: F(0,0) F(1,0) BW(1,0) BW(0,0)\n"
             "actor 1: F(0,1) BW(0,1) F(1,1) BW(1,1)\n", hdr);
    MUST(sp_schedule_parse(buf, "acc.sched", &s));
    sp_stage_model *md2 = sp_stage_model_chain(2, 1, 1, 1, 1);
    CHECK(sp_schedule_validate(s, md2) == SP_ERR_SCHEDULE
              && strstr(sp_last_error(), "BW(1,0) on actor 0 waits for BW(0,0) on actor 0 "
                        "(gradient accumulation order)"), "accumulation order: %s",
          sp_last_error());
    sp_schedule_free(s);
    sp_stage_model_free(md2);

    /* 5. Environment selection; explicit arguments override it. */
    setenv("STARPIPE_SCHEDULE", "zb-h1", 1);
    setenv("STARPIPE_MICROBATCHES", "6", 1);
    unsetenv("STARPIPE_CHUNKS");
    MUST(sp_schedule_from_env(NULL, 3, 0, 0, &s));
    CHECK(!strcmp(s->name, "zb-h1") && s->nmicro == 6 && s->nstages == 3, "env selection");
    sp_schedule_free(s);
    MUST(sp_schedule_from_env("gpipe", 3, 4, 0, &s));
    CHECK(!strcmp(s->name, "gpipe") && s->nmicro == 4, "flags override env");
    sp_schedule_free(s);
    setenv("STARPIPE_SCHEDULE", "interleaved-1f1b", 1);
    setenv("STARPIPE_CHUNKS", "3", 1);
    MUST(sp_schedule_from_env(NULL, 2, 0, 0, &s));
    CHECK(s->nstages == 6 && s->stage_actor[3] == 1, "STARPIPE_CHUNKS");
    sp_schedule_free(s);
    setenv("STARPIPE_MICROBATCHES", "abc", 1);
    CHECK(sp_schedule_from_env(NULL, 2, 0, 0, &s) == SP_ERR_ARG
              && strstr(sp_last_error(), "STARPIPE_MICROBATCHES='abc'"), "non-number: %s",
          sp_last_error());
    setenv("STARPIPE_MICROBATCHES", "3", 1);
    setenv("STARPIPE_SCHEDULE", "dualpipe-v", 1);
    unsetenv("STARPIPE_CHUNKS");
    CHECK(sp_schedule_from_env(NULL, 2, 0, 0, &s) == SP_ERR_ARG
              && strstr(sp_last_error(), "m >= 2p"), "constraint: %s", sp_last_error());
    setenv("STARPIPE_SCHEDULE", "1f1b", 1);
    setenv("STARPIPE_CHUNKS", "2", 1);
    CHECK(sp_schedule_from_env(NULL, 2, 0, 0, &s) == SP_ERR_ARG
              && strstr(sp_last_error(), "STARPIPE_CHUNKS=2"), "chunks on a plain schedule: %s",
          sp_last_error());
    unsetenv("STARPIPE_CHUNKS");
    setenv("STARPIPE_SCHEDULE", "bogus", 1);
    CHECK(sp_schedule_from_env(NULL, 2, 0, 0, &s) == SP_ERR_ARG
              && strstr(sp_last_error(), "'bogus'") && strstr(sp_last_error(), "zb-v"),
          "unknown: %s", sp_last_error());
    setenv("STARPIPE_SCHEDULE", "help", 1);
    CHECK(sp_schedule_from_env(NULL, 2, 0, 0, &s) == SP_ERR_ARG, "help");
    for (int i = 0; i < sp_schedule_builtin_count(); i++)
        CHECK(strstr(sp_last_error(), sp_schedule_builtin_info(i)->name) != NULL,
              "help lacks %s", sp_schedule_builtin_info(i)->name);
    int lines = 0;
    for (const char *c = sp_schedule_help(); *c; c++) lines += *c == '\n';
    CHECK(lines == sp_schedule_builtin_count() + 4 && strstr(sp_schedule_help(), "NAME+split")
              && strstr(sp_schedule_help(), "the default: " SP_SCHEDULE_DEFAULT "\n"),
          "help: one line per schedule + auto + file:PATH + NAME+split + the default");
    /* NAME+split through the environment, on a file too */
    setenv("STARPIPE_SCHEDULE", "1f1b+split", 1);
    MUST(sp_schedule_from_env(NULL, 2, 4, 0, &s));
    CHECK(!strcmp(s->name, "1f1b+split") && s->ntasks[0] == 8 && s->ntasks[1] == 12,
          "1f1b+split from the environment: '%s', %d and %d tasks", s->name, s->ntasks[0],
          s->ntasks[1]);
    sp_schedule_free(s);
    /* file:PATH through the environment */
    sp_schedule *z;
    MUST(sp_schedule_builtin("zb-v", 3, 5, 2, &z));
    MUST(sp_schedule_save(z, path));
    char spec[64];
    snprintf(spec, sizeof spec, "file:%s", path);
    setenv("STARPIPE_SCHEDULE", spec, 1);
    unsetenv("STARPIPE_MICROBATCHES");
    MUST(sp_schedule_from_env(NULL, 3, 0, 0, &s));
    CHECK(same_schedule(s, z), "file: through STARPIPE_SCHEDULE");
    sp_schedule_free(s);
    CHECK(sp_schedule_from_env(NULL, 4, 0, 0, &s) == SP_ERR_ARG, "file with other actor count");
    sp_schedule_free(z);
    /* file:PATH+split: the file's schedule split, as the built-in's */
    MUST(sp_schedule_builtin("gpipe", 2, 3, 0, &z));
    MUST(sp_schedule_save(z, path));
    sp_schedule_free(z);
    snprintf(spec, sizeof spec, "file:%s+split", path);
    MUST(sp_schedule_from_env(spec, 2, 0, 0, &s));
    MUST(sp_schedule_from_env("gpipe+split", 2, 3, 0, &z));
    CHECK(same_schedule(s, z), "file:PATH+split as gpipe+split");
    sp_schedule_free(s);
    sp_schedule_free(z);
    unlink(path);
    return test_done("test_text");
}
