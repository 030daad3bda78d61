/* What a run writes: every output checked on the rank that writes it before step 1, no
 * two outputs one file, no output an input (nothing a user owns is overwritten by a
 * mistyped flag); and the signals: --save-on-signal's request to stop at a step
 * boundary, and the temporaries of saves removed when a signal ends the process. */
#define _GNU_SOURCE
#include "apps/outputs.h"

#include <glob.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/files.h"

typedef struct {
    const char *what, *path;
} named_file;

/* The inputs a run reads (free() them; NULL: out of memory): --load, --init, --calibrate, the
 * schedule file and each data file (the paths in g, which the caller frees). */
static named_file *run_inputs(const sp_app_opts *o, const char *data, int *n, glob_t *g)
{
    char *copy = data ? strdup(data) : NULL;
    int flags = 0;
    for (char *part = copy, *next; part; part = next) { /* as sp_tokens_open_pattern splits */
        if ((next = strchr(part, ','))) *next++ = 0;
        if (*part && !glob(part, flags | GLOB_NOCHECK, NULL, g)) flags = GLOB_APPEND;
    }
    free(copy);
    size_t ndata = flags ? g->gl_pathc : 0;
    named_file *in = malloc((4 + ndata) * sizeof *in);
    *n = 0;
    if (!in) return NULL;
    if (o->load) in[(*n)++] = (named_file){ "--load file", o->load };
    if (o->init) in[(*n)++] = (named_file){ "--init file", o->init };
    if (o->calibrate) in[(*n)++] = (named_file){ "--calibrate file", o->calibrate };
    if (o->schedule && !strncmp(o->schedule, "file:", 5))
        in[(*n)++] = (named_file){ "schedule file", o->schedule + 5 };
    for (size_t i = 0; i < ndata; i++) in[(*n)++] = (named_file){ "data file", g->gl_pathv[i] };
    return in;
}

sp_status app_check_outputs(const sp_app_opts *o, const char *trace, const char *data)
{
    char svg[PATH_MAX + 8] = "";
    if (trace) snprintf(svg, sizeof svg, "%s.svg", trace);
    int run = o->steps > 0;
    named_file out[6];
    int nout = 0;
    if (o->save) out[nout++] = (named_file){ "--save file", o->save };
    if (run && o->dump_grads) out[nout++] = (named_file){ "--dump-grads file", o->dump_grads };
    if (run && o->log) out[nout++] = (named_file){ "--log file", o->log };
    if (run && o->profile) out[nout++] = (named_file){ "--profile file", o->profile };
    if (run && trace) {
        out[nout++] = (named_file){ "STARPIPE_TRACE file", trace };
        out[nout++] = (named_file){ "STARPIPE_TRACE picture", svg };
    }
    sp_status st;
    for (int i = 0; i < nout; i++)
        if ((st = sp_output_check(out[i].path, out[i].what))) return st;
    for (int i = 0; i < nout; i++)
        for (int j = i + 1; j < nout; j++)
            if (sp_same_file(out[i].path, out[j].path))
                return sp_set_error(SP_ERR_IO, "the %s '%s' and the %s '%s' are one file: each "
                                    "output needs a path of its own", out[i].what, out[i].path,
                                    out[j].what, out[j].path);
    glob_t g = { 0 };
    int nin;
    named_file *in = run_inputs(o, data, &nin, &g);
    st = in ? SP_OK : sp_set_error(SP_ERR_NOMEM, "out of memory");
    for (int i = 0; i < nout && !st; i++)
        for (int j = 0; j < nin && !st; j++)
            if (!(out[i].path == o->save && in[j].path == o->load) &&
                sp_same_file(out[i].path, in[j].path))
                st = sp_set_error(SP_ERR_IO, "the %s '%s' is the %s '%s': the run would "
                                  "overwrite its own input; give the output another path",
                                  out[i].what, out[i].path, in[j].what, in[j].path);
    free(in);
    globfree(&g);
    return st;
}

static const struct {
    const char *name;
    int sig;
} stop_signals[] = { { "USR1", SIGUSR1 }, { "USR2", SIGUSR2 }, { "TERM", SIGTERM },
                     { "INT", SIGINT },   { "HUP", SIGHUP } };

int app_signal_parse(const char *name)
{
    if (!strncmp(name, "SIG", 3)) name += 3;
    for (size_t i = 0; i < sizeof stop_signals / sizeof *stop_signals; i++)
        if (!strcmp(name, stop_signals[i].name)) return stop_signals[i].sig;
    return -1;
}

const char *app_signal_name(int sig)
{
    for (size_t i = 0; i < sizeof stop_signals / sizeof *stop_signals; i++)
        if (stop_signals[i].sig == sig) return stop_signals[i].name;
    return "?";
}

static volatile sig_atomic_t stop_sig;

static void ask_stop(int sig) { stop_sig = sig; }

void app_signals_arm(int sig)
{
    if (sig > 0) {
        struct sigaction sa = { .sa_handler = ask_stop, .sa_flags = SA_RESTART };
        sigemptyset(&sa.sa_mask);
        sigaction(sig, &sa, NULL);
    }
    sp_output_cleanup_on_signals(); /* the others: at their default action still */
}

int app_stop_requested(void) { return stop_sig; }
