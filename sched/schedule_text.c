/* The schedule text format (docs/planner.md): a header, the placement, then each
 * actor's tasks as F(mb,stage) tokens. Every error names file:line and the token. */
#include "sched/sched_impl.h"

#include <ctype.h>
#include <errno.h>
#include <string.h>

#include "base/files.h"

/* The largest schedule file read: SP_MAX_SLOTS (4M) (microbatch, stage) pairs of at most
 * three tasks each (F, B, W), a task token of at most 20 bytes, is 240 MB. */
#define SP_SCHEDULE_TEXT_MAX ((size_t)256 << 20)

typedef struct {
    const char *src;
    int line;
    sp_schedule *s;
    int p, S, m;      /* 0 until given */
    char name[64];
    int *seen_line;   /* [4 m S] line where each task was listed, 0 if not yet */
    int place_line;   /* line of the 'place' line, 0 if none yet */
    int tasks_seen;   /* an 'actor' line came: the placement is fixed */
    int forward_only; /* a 'forward-only' line came */
} parser;

static sp_status perr(const parser *ps, const char *tok, const char *fmt, const char *detail)
{
    return sp_set_error(SP_ERR_FORMAT, "%s:%d: %s '%s'%s", ps->src, ps->line, fmt, tok,
                        detail ? detail : "");
}

static int parse_int(const char *t, int *out)
{
    char *end;
    errno = 0;
    long v = strtol(t, &end, 10);
    if (end == t || *end || errno || v < 0 || v > SP_MAX_INDEX) return -1;
    *out = (int)v;
    return 0;
}

/* KIND(mb,stage), nothing else in the token. */
static int parse_task(const char *t, sp_task *out)
{
    int kind;
    if (!strncmp(t, "BW(", 3)) kind = SP_TASK_BW, t += 3;
    else if (!strncmp(t, "F(", 2)) kind = SP_TASK_F, t += 2;
    else if (!strncmp(t, "B(", 2)) kind = SP_TASK_B, t += 2;
    else if (!strncmp(t, "W(", 2)) kind = SP_TASK_W, t += 2;
    else return -1;
    if (!isdigit((unsigned char)*t)) return -1;
    char *end;
    long mb = strtol(t, &end, 10);
    if (*end != ',' || !isdigit((unsigned char)end[1])) return -1;
    long st = strtol(end + 1, &end, 10);
    if (*end != ')' || end[1] || mb > SP_MAX_INDEX || st > SP_MAX_INDEX) return -1;
    *out = (sp_task){ kind, (int)mb, (int)st };
    return 0;
}

static const char *KEYWORDS = " (expected schedule, actors, stages, microbatches, "
                              "forward-only, place or actor)";

static sp_status header_done(parser *ps, const char *tok)
{
    if (ps->s) return SP_OK;
    if (!ps->p || !ps->S || !ps->m)
        return perr(ps, tok, "'actors', 'stages' and 'microbatches' must come before", NULL);
    ps->s = sp_schedule_create(ps->p, ps->S, ps->m);
    if (!ps->s) return SP_ERR_NOMEM;
    /* an unnamed schedule is known by its file, so messages can say which one */
    snprintf(ps->s->name, sizeof ps->s->name, "%s", ps->name[0] ? ps->name : ps->src);
    ps->s->forward_only = ps->forward_only;
    size_t n = (size_t)4 * ps->m * ps->S;
    ps->seen_line = calloc(n, sizeof *ps->seen_line);
    if (!ps->seen_line) return sp_set_error(SP_ERR_NOMEM, "out of memory reading a schedule");
    return SP_OK;
}

static sp_status parse_line(parser *ps, char **tok, int nt)
{
    char detail[96];
    const char *kw = tok[0];
    if (!strcmp(kw, "schedule")) {
        if (nt != 2) return perr(ps, nt > 2 ? tok[2] : kw, "expected one name after", NULL);
        if (ps->s) return perr(ps, kw, "must come before 'place' and 'actor' lines:", NULL);
        /* cut a long name at a character boundary: it stays valid UTF-8 */
        size_t n = strlen(tok[1]), k = 0;
        while (k < n) {
            size_t l = sp_utf8_seq((const unsigned char *)tok[1] + k, n - k);
            if (!l || k + l >= sizeof ps->name) break;
            k += l;
        }
        memcpy(ps->name, tok[1], k);
        ps->name[k] = 0;
        return SP_OK;
    }
    if (!strcmp(kw, "actors") || !strcmp(kw, "stages") || !strcmp(kw, "microbatches")) {
        int *field = kw[0] == 'a' ? &ps->p : kw[0] == 's' ? &ps->S : &ps->m, v;
        if (nt != 2) return perr(ps, nt > 2 ? tok[2] : kw, "expected one number after", NULL);
        if (ps->s) return perr(ps, kw, "must come before 'place' and 'actor' lines:", NULL);
        if (*field) return perr(ps, kw, "given twice:", NULL);
        if (parse_int(tok[1], &v) || v < 1) return perr(ps, tok[1], "not a positive number:", NULL);
        *field = v;
        return SP_OK;
    }
    if (!strcmp(kw, "forward-only")) { /* an evaluation schedule: F tasks only */
        if (nt != 1) return perr(ps, tok[1], "nothing may follow 'forward-only', got", NULL);
        if (ps->tasks_seen) return perr(ps, kw, "must come before 'actor' lines:", NULL);
        if (ps->forward_only) return perr(ps, kw, "given twice:", NULL);
        ps->forward_only = 1;
        if (ps->s) ps->s->forward_only = 1;
        return SP_OK;
    }
    if (!strcmp(kw, "place")) {
        sp_status st = header_done(ps, kw);
        if (st) return st;
        /* tasks were checked against the placement in force when they were read */
        if (ps->tasks_seen) return perr(ps, kw, "must come before 'actor' lines:", NULL);
        if (ps->place_line) {
            snprintf(detail, sizeof detail, " (first given on line %d)", ps->place_line);
            return perr(ps, kw, "given twice:", detail);
        }
        ps->place_line = ps->line;
        if (nt - 1 != ps->S) {
            snprintf(detail, sizeof detail, ": %d actors listed for %d stages", nt - 1, ps->S);
            return perr(ps, kw, "wrong length of", detail);
        }
        for (int s = 0; s < ps->S; s++) {
            int a;
            if (parse_int(tok[s + 1], &a) || a >= ps->p) {
                snprintf(detail, sizeof detail, " (stage %d; actors are 0..%d)", s, ps->p - 1);
                return perr(ps, tok[s + 1], "bad actor", detail);
            }
            ps->s->stage_actor[s] = a;
        }
        return SP_OK;
    }
    if (!strcmp(kw, "actor")) {
        sp_status st = header_done(ps, kw);
        if (st) return st;
        if (nt < 2) return perr(ps, kw, "expected 'actor A:' in", NULL);
        ps->tasks_seen = 1;
        /* "actor 3:" or "actor 3 :" */
        char num[32];
        int first = 2, a;
        size_t len = strlen(tok[1]);
        if (len && tok[1][len - 1] == ':' && len < sizeof num) {
            memcpy(num, tok[1], len - 1);
            num[len - 1] = 0;
        } else if (nt >= 3 && !strcmp(tok[2], ":") && len < sizeof num) {
            memcpy(num, tok[1], len + 1);
            first = 3;
        } else {
            return perr(ps, tok[1], "expected 'A:' (actor number and colon), got", NULL);
        }
        if (parse_int(num, &a) || a >= ps->p) {
            snprintf(detail, sizeof detail, " (actors are 0..%d)", ps->p - 1);
            return perr(ps, tok[1], "bad actor", detail);
        }
        for (int j = first; j < nt; j++) {
            sp_task t;
            if (parse_task(tok[j], &t))
                return perr(ps, tok[j], "bad task", " (expected KIND(mb,stage), KIND one of "
                            "F, B, W, BW)");
            if (t.mb >= ps->m) {
                snprintf(detail, sizeof detail, " (microbatches are 0..%d)", ps->m - 1);
                return perr(ps, tok[j], "microbatch out of range in", detail);
            }
            if (t.stage >= ps->S) {
                snprintf(detail, sizeof detail, " (stages are 0..%d)", ps->S - 1);
                return perr(ps, tok[j], "stage out of range in", detail);
            }
            if (ps->s->stage_actor[t.stage] != a) {
                snprintf(detail, sizeof detail, ": stage %d is placed on actor %d", t.stage,
                         ps->s->stage_actor[t.stage]);
                char where[48];
                snprintf(where, sizeof where, "task on actor %d:", a);
                return perr(ps, tok[j], where, detail);
            }
            int sl = sp_slot(t.kind, t.mb, t.stage, ps->S);
            if (ps->seen_line[sl]) {
                snprintf(detail, sizeof detail, " (first listed on line %d)", ps->seen_line[sl]);
                return perr(ps, tok[j], "duplicate task", detail);
            }
            ps->seen_line[sl] = ps->line;
            st = sp_schedule_append(ps->s, a, (sp_task_kind)t.kind, t.mb, t.stage);
            if (st) return st;
        }
        return SP_OK;
    }
    return perr(ps, kw, "unknown keyword", KEYWORDS);
}

/* A schedule is text to its last byte: a NUL byte or an invalid UTF-8 sequence anywhere,
 * even after a valid schedule, is an error naming the line. */
static sp_status check_text(const char *text, size_t n, const char *src)
{
    const unsigned char *p = (const unsigned char *)text;
    int line = 1;
    size_t col0 = 0;
    for (size_t i = 0; i < n;) {
        size_t l = p[i] ? sp_utf8_seq(p + i, n - i) : 0;
        if (!l && !p[i])
            return sp_set_error(SP_ERR_FORMAT, "%s:%d: a NUL byte at column %zu: a schedule "
                                "is UTF-8 text to its last byte", src, line, i - col0 + 1);
        if (!l)
            return sp_set_error(SP_ERR_FORMAT, "%s:%d: invalid UTF-8 (byte 0x%02x) at column "
                                "%zu: a schedule is UTF-8 text to its last byte", src, line,
                                p[i], i - col0 + 1);
        if (p[i] == '\n') line++, col0 = i + 1;
        i += l;
    }
    return SP_OK;
}

sp_status sp_schedule_parse(const char *text, const char *source, sp_schedule **out)
{
    *out = NULL;
    parser ps = { .src = source ? source : "<text>" };
    size_t len = strlen(text);
    sp_status cst = check_text(text, len, ps.src);
    if (cst) return cst;
    char *copy = malloc(len + 1);
    if (copy) memcpy(copy, text, len + 1);
    size_t cap = 64;
    char **tok = malloc(cap * sizeof *tok);
    sp_status st = SP_OK;
    if (!copy || !tok) {
        free(copy), free(tok);
        return sp_set_error(SP_ERR_NOMEM, "out of memory reading a schedule");
    }
    char *line = copy;
    while (line && st == SP_OK) {
        char *nl = strchr(line, '\n');
        if (!nl && !*line) break; /* the empty rest after a final newline is no line */
        if (nl) *nl = 0;
        ps.line++;
        char *hash = strchr(line, '#');
        if (hash) *hash = 0;
        int nt = 0;
        for (char *t = line; st == SP_OK;) {
            while (*t == ' ' || *t == '\t' || *t == '\r') t++;
            if (!*t) break;
            if ((size_t)nt == cap) {
                char **nt2 = realloc(tok, 2 * cap * sizeof *tok);
                if (!nt2) {
                    st = sp_set_error(SP_ERR_NOMEM, "out of memory reading a schedule");
                    break;
                }
                tok = nt2;
                cap *= 2;
            }
            tok[nt++] = t;
            while (*t && *t != ' ' && *t != '\t' && *t != '\r') t++;
            if (*t) *t++ = 0;
        }
        if (st == SP_OK && nt) st = parse_line(&ps, tok, nt);
        line = nl ? nl + 1 : NULL;
    }
    if (st == SP_OK && !ps.s) {
        ps.line++;
        st = header_done(&ps, "end of file");
    }
    free(copy), free(tok), free(ps.seen_line);
    if (st) {
        sp_schedule_free(ps.s);
        return st;
    }
    *out = ps.s;
    return SP_OK;
}

sp_status sp_schedule_load(const char *path, sp_schedule **out)
{
    *out = NULL;
    char *text;
    size_t n;
    sp_status st = sp_file_read(path, "schedule file", SP_SCHEDULE_TEXT_MAX, &text, &n);
    if (st) return st;
    if (!(st = check_text(text, n, path))) st = sp_schedule_parse(text, path, out);
    free(text);
    return st;
}

sp_status sp_schedule_write(const sp_schedule *s, FILE *f)
{
    char t[48];
    fprintf(f, "# starpipe schedule (docs/planner.md): %d actors, %d stages, %d microbatches\n",
            s->nactors, s->nstages, s->nmicro);
    if (s->name[0]) {
        /* names are single tokens in the format */
        char name[64];
        snprintf(name, sizeof name, "%s", s->name);
        for (char *c = name; *c; c++)
            if (isspace((unsigned char)*c) || *c == '#') *c = '_';
        fprintf(f, "schedule %s\n", name);
    }
    fprintf(f, "actors %d\nstages %d\nmicrobatches %d\n%splace", s->nactors, s->nstages,
            s->nmicro, s->forward_only ? "forward-only\n" : "");
    for (int st = 0; st < s->nstages; st++) fprintf(f, " %d", s->stage_actor[st]);
    fputc('\n', f);
    for (int a = 0; a < s->nactors; a++) {
        if (!s->ntasks[a]) fprintf(f, "actor %d:\n", a);
        for (int j = 0; j < s->ntasks[a]; j += 16) {
            fprintf(f, "actor %d:", a);
            for (int q = j; q < j + 16 && q < s->ntasks[a]; q++)
                fprintf(f, " %s", sp_task_format(s->tasks[a][q], t, sizeof t));
            fputc('\n', f);
        }
    }
    return ferror(f) ? sp_set_error(SP_ERR_IO, "writing a schedule failed") : SP_OK;
}

sp_status sp_schedule_save(const sp_schedule *s, const char *path)
{
    sp_output o;
    sp_status st = sp_output_open(&o, path, "schedule file");
    if (st) return st;
    if ((st = sp_schedule_write(s, o.f))) {
        sp_output_abort(&o);
        return st;
    }
    return sp_output_commit(&o, "schedule file");
}
