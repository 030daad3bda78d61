/* An error's cause survives the context added above it (issue 36, defect 4): the message
 * built by sp_error_context holds every context once and the lowest cause whole, however
 * many levels add context and however long the strings; and the library's own paths that
 * add context (sched/schedule.c, sched/select.c, graph/graph.c) keep the cause. Before the
 * fix they formatted sp_last_error() into itself, and glibc wrote the context over the
 * cause before reading it: "evaluation: evaluation: es out of range: ...". */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "starpipe/graph.h"
#include "starpipe/plan.h"
#include "starpipe/status.h"
#include "tests/check.h"

static int count(const char *s, const char *sub)
{
    int n = 0;
    for (const char *p = s; (p = strstr(p, sub)); p += strlen(sub)) n++;
    return n;
}

static int ends_with(const char *s, const char *tail)
{
    size_t a = strlen(s), b = strlen(tail);
    return a >= b && !strcmp(s + a - b, tail);
}

/* no UTF-8 sequence cut: every lead byte is followed by its continuation bytes */
static int utf8_whole(const char *s)
{
    for (const unsigned char *p = (const unsigned char *)s; *p;) {
        int n = *p < 0x80 ? 0 : (*p & 0xE0) == 0xC0 ? 1 : (*p & 0xF0) == 0xE0 ? 2
              : (*p & 0xF8) == 0xF0 ? 3 : -1;
        if (n < 0) return 0;
        p++;
        for (int k = 0; k < n; k++, p++)
            if ((*p & 0xC0) != 0x80) return 0;
    }
    return 1;
}

static void levels(void)
{
    const char *cause = "trainer: out of memory (4294967360 bytes of host buffers)";
    sp_set_error(SP_ERR_NOMEM, "%s", cause);
    CHECK(sp_error_context(SP_ERR_RUNTIME, "trainer: no buffer ACT[%d] for F mb0 s0", 0)
              == SP_ERR_RUNTIME, "the code is not returned");
    CHECK(!strcmp(sp_last_error(), "trainer: no buffer ACT[0] for F mb0 s0: trainer: out of "
                  "memory (4294967360 bytes of host buffers)"), "one level: '%s'",
          sp_last_error());
    sp_error_context(SP_ERR_RUNTIME, "step %d", 3);
    CHECK(!strcmp(sp_last_error(), "step 3: trainer: no buffer ACT[0] for F mb0 s0: trainer: "
                  "out of memory (4294967360 bytes of host buffers)"), "two levels: '%s'",
          sp_last_error());
    sp_error_context(SP_ERR_RUNTIME, "%s", "run");
    CHECK(!strncmp(sp_last_error(), "run: step 3: trainer: no buffer", 31) &&
              ends_with(sp_last_error(), cause) && count(sp_last_error(), "no buffer") == 1 &&
              count(sp_last_error(), "step 3") == 1, "three levels: '%s'", sp_last_error());
    /* the context may quote the message itself: it is read before anything is written */
    sp_set_error(SP_ERR_IO, "short");
    sp_error_context(SP_ERR_IO, "[%s]", sp_last_error());
    CHECK(!strcmp(sp_last_error(), "[short]: short"), "self-quoting: '%s'", sp_last_error());
    /* nothing recorded: the context alone; an empty context changes nothing */
    sp_clear_error();
    sp_error_context(SP_ERR_ARG, "alone");
    CHECK(!strcmp(sp_last_error(), "alone"), "no previous message: '%s'", sp_last_error());
    sp_error_context(SP_ERR_ARG, "%s", "");
    CHECK(!strcmp(sp_last_error(), "alone"), "empty context: '%s'", sp_last_error());
}

/* Messages that do not fit: at most SP_ERROR_MAX - 1 bytes, the context's head and the
 * cause's tail kept, "..." where something was cut, no UTF-8 character cut in two. */
static void truncation(void)
{
    char big[3000], ctx[3000];
    const char *cause = "the lowest cause, 1234 bytes";
    /* a cause of about 900 bytes in accented characters (2 bytes each), its end plain */
    size_t n = 0;
    while (n < 880) memcpy(big + n, "\xc3\xa9", 2), n += 2;
    snprintf(big + n, sizeof big - n, "%s", cause);
    for (int lc = 1; lc < 2500; lc += 37) {
        for (int i = 0; i < lc; i++) /* whole 3-byte characters, then plain ones */
            ctx[i] = i < lc - lc % 3 ? "\xe2\x9c\x93"[i % 3] : 'c';
        ctx[lc] = '\0';
        sp_set_error(SP_ERR_IO, "%s", big);
        sp_error_context(SP_ERR_IO, "%s", ctx);
        const char *m = sp_last_error();
        size_t len = strlen(m);
        int ok = len < SP_ERROR_MAX && ends_with(m, cause) && utf8_whole(m);
        /* the context's head comes first, and it keeps at least half of the room */
        size_t head = (size_t)lc < SP_ERROR_MAX / 2 - 4 ? (size_t)lc : SP_ERROR_MAX / 2 - 8;
        ok = ok && !strncmp(m, ctx, head);
        /* cut only when it had to be, and then marked */
        size_t whole = (size_t)lc + 2 + strlen(big);
        ok = ok && (whole < SP_ERROR_MAX ? len == whole && !strstr(m, "...")
                                         : len >= SP_ERROR_MAX - 4 && strstr(m, "..."));
        CHECK(ok, "context of %d bytes over a cause of %zu: %zu bytes '%.60s...%s'", lc,
              strlen(big), len, m, len > 60 ? m + len - 60 : m);
    }
    /* a long chain of contexts on a short cause: the outermost and the cause survive */
    sp_set_error(SP_ERR_NOMEM, "%s", cause);
    for (int k = 0; k < 200; k++) sp_error_context(SP_ERR_RUNTIME, "level %03d", k);
    CHECK(strlen(sp_last_error()) < SP_ERROR_MAX && !strncmp(sp_last_error(), "level 199: ", 11) &&
              ends_with(sp_last_error(), cause) && strstr(sp_last_error(), "..."),
          "200 levels: '%s'", sp_last_error());
}

/* The library's own paths that add context to a lower failure. */
static void library(void)
{
    /* sched/schedule.c: an evaluation schedule of 0 microbatches: sp_schedule_create's
     * refusal, under "evaluation" */
    sp_schedule *train = NULL, *fs = NULL;
    REQUIRE(sp_schedule_builtin("1f1b", 2, 4, 1, &train) == SP_OK, "1f1b: %s", sp_last_error());
    sp_status st = sp_schedule_forward(train, 0, &fs);
    const char *m = sp_last_error();
    CHECK(st == SP_ERR_ARG && !fs && !strncmp(m, "evaluation: ", 12) &&
              count(m, "evaluation") == 1 && strstr(m, "schedule sizes out of range") &&
              strstr(m, "microbatches=0"), "sp_schedule_forward: %s '%s'", sp_status_name(st), m);
    sp_schedule_free(train);
    /* sched/select.c: STARPIPE_CHUNKS on a schedule that takes none */
    setenv("STARPIPE_CHUNKS", "2", 1);
    unsetenv("STARPIPE_SCHEDULE");
    unsetenv("STARPIPE_MICROBATCHES");
    st = sp_schedule_from_env("1f1b", 2, 4, 0, &train);
    m = sp_last_error();
    CHECK(st == SP_ERR_ARG && !train && count(m, "STARPIPE_CHUNKS=2") == 1 && strstr(m, "1f1b"),
          "STARPIPE_CHUNKS: '%s'", m);
    char direct[SP_ERROR_MAX];
    unsetenv("STARPIPE_CHUNKS");
    REQUIRE(sp_schedule_builtin("1f1b", 2, 4, 2, &train) != SP_OK, "1f1b with 2 chunks");
    snprintf(direct, sizeof direct, "%s", sp_last_error());
    setenv("STARPIPE_CHUNKS", "2", 1);
    sp_schedule_from_env("1f1b", 2, 4, 0, &train);
    CHECK(ends_with(sp_last_error(), direct), "the builtin's refusal '%s' lost: '%s'", direct,
          sp_last_error());
    unsetenv("STARPIPE_CHUNKS");
    /* graph/graph.c: the loss of a failed op names the op's own failure */
    sp_graph *g = sp_graph_create();
    REQUIRE(g, "sp_graph_create");
    int64_t sa[2] = { 3, 4 }, sb[2] = { 5, 6 };
    sp_tensor a = sp_input_f32(g, "a", 2, sa), b = sp_input_f32(g, "b", 2, sb);
    sp_tensor bad = sp_matmul(g, a, b, 0, 0);
    REQUIRE(bad < 0, "a 3x4 by 5x6 matmul was accepted");
    char why[SP_ERROR_MAX];
    snprintf(why, sizeof why, "%s", sp_last_error());
    st = sp_graph_set_loss(g, bad);
    m = sp_last_error();
    CHECK(st == SP_ERR_GRAPH && count(m, "sp_graph_set_loss") == 1 && ends_with(m, why) &&
              strlen(why) > 10, "sp_graph_set_loss: '%s' (the op said '%s')", m, why);
    sp_graph_free(g);
}

int main(void)
{
    levels();
    truncation();
    library();
    return check_summary("test_errors");
}
