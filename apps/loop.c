/* The run, written once for both engines (engine.h): checkpoints loaded, the banner, the
 * step loop with its progress lines, evaluations (--eval-every), the --log file,
 * checkpoints (--save, --dump-grads), --save-on-signal's stop, the last lines, --sample. */
#include "apps/engine.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "apps/data.h"
#include "apps/outputs.h"
#include "apps/settings.h"
#include "starpipe/reference.h"
#include "starpipe/sample.h"
#include "starpipe/tokenizer.h"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

/* ---- what each step reports: the step line and the --log file ---- */

typedef struct {
    sp_lr_schedule lr;
    app_log log;          /* rank 0's; fd -1 elsewhere and without --log */
    char rate_key[32];    /* the log's name of the throughput, "tokens_per_s" */
    double samples;       /* samples (tokens, rows) per step, every replica's */
    double step_flops;    /* model FLOPs per step (app_step_flops) */
    double peak_total;    /* MFU's denominator: peak x devices in use; 0: no MFU */
    int peak_measured;    /* the CPU peak timed at start-up, not given nor a datasheet's */
    int peak_low_said;    /* a step above 100% MFU has said why */
} run_report;

static const char *fmt_flops(double f, char *buf, size_t len)
{
    const char *unit = "";
    const char *const units[] = { "K", "M", "G", "T", "P" };
    for (int i = 0; i < 5 && f >= 1000; i++) f /= 1000, unit = units[i];
    snprintf(buf, len, "%.3g %sFLOP", f, unit);
    return buf;
}

/* The peak MFU is measured against, and the devices in use (ranks, at most as many per
 * machine as it has cores or GPUs): --peak-tflops, else a known GPU's datasheet figure,
 * else on CPU the engine's (measured at start-up). Fills rr->peak_total and prints the
 * banner line saying so (rank 0). */
static void set_peak(run_report *rr, const app_engine *e)
{
    const sp_app_opts *o = e->o;
    int cuda = e->cuda, ranks = e->ranks;
    app_peak pk = e->cpu_peak;
    int local = e->local, per_node = local;
    if (local < 1) local = per_node = 1;
    if (cuda) {
        int ngpus;
        app_peak_gpu(&pk, e->env->tf32, NULL, &ngpus);
        if (ngpus > 0 && ngpus < per_node) per_node = ngpus;
    } else {
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        if (cores > 0 && cores < per_node) per_node = (int)cores;
    }
    if (o->peak_tflops > 0) {
        pk.flops = o->peak_tflops * 1e12;
        snprintf(pk.source, sizeof pk.source, "given by --peak-tflops");
    }
    int devices = (ranks + local - 1) / local * per_node;
    if (devices > ranks) devices = ranks;
    rr->peak_total = pk.flops * devices;
    rr->peak_measured = !cuda && o->peak_tflops <= 0;
    char f1[32], f2[32];
    if (pk.flops > 0)
        printf("throughput: %s per step (the model's F, B and W tasks, as the program counts "
               "them); MFU against %d %s x %s/s (%s)\n", fmt_flops(rr->step_flops, f1, sizeof f1),
               devices, cuda ? (devices > 1 ? "GPUs" : "GPU") : (devices > 1 ? "cores" : "core"),
               fmt_flops(pk.flops, f2, sizeof f2), pk.source);
    else
        printf("throughput: %s per step; no MFU: the peak is %s\n",
               fmt_flops(rr->step_flops, f1, sizeof f1), pk.source);
}

/* The banner's line on the learning rate, when it is not constant. */
static void describe_lr(const sp_lr_schedule *s)
{
    if (s->warmup <= 0 && s->decay == SP_LR_DECAY_NONE) return;
    char lr[32], lo[32], warm[96] = "";
    app_float_str(s->lr, lr, sizeof lr);
    if (s->warmup > 0) snprintf(warm, sizeof warm, "linear warmup to %s over steps 1..%d", lr, s->warmup);
    if (s->decay == SP_LR_DECAY_NONE)
        printf("learning rate: %s, then %s\n", warm, lr);
    else
        printf("learning rate: %s%s%s decay from %s to %s at step %d\n", warm,
               s->warmup > 0 ? ", then " : "", sp_lr_decay_name(s->decay), lr,
               app_float_str(s->lr_min, lo, sizeof lo), s->total);
}

/* Everything but the peak and the log, which come later on the rank that prints. */
static run_report report_of(const app_engine *e, int start)
{
    sp_app_model *m = e->m;
    const sp_schedule *sch = e->sch;
    int R = e->R, T = e->T;
    double samples = e->samples;
    const sp_program *p = e->p;
    run_report rr = { .lr = app_lr_schedule(e->o, start), .log = APP_LOG_NONE,
                      .samples = samples * R * sch->nmicro,
                      .step_flops = app_step_flops(p, sch, R) };
    if (T > 1) { /* the model's FLOPs, not a member's (its part, and the whole ops again) */
        sp_status st;
        sp_graph *whole = m->build(m->cfg, sch->nstages, 1, 0, &st);
        sp_program *wp = whole ? sp_program_build(whole, &st) : NULL;
        if (wp) rr.step_flops = app_step_flops(wp, sch, R);
        sp_program_free(wp);
        sp_graph_free(whole);
    }
    snprintf(rr.rate_key, sizeof rr.rate_key, "%s_per_s",
             strcmp(m->sample_unit, "tok") ? m->sample_unit : "tokens");
    return rr;
}

/* The final line's ", loss 5.535660 -> 3.078362"; nothing when no step ran (--steps 0). */
static const char *loss_range(char *buf, size_t len, int steps, float first, float last)
{
    if (steps > 0) snprintf(buf, len, ", loss %.6f -> %.6f", first, last);
    else if (len) buf[0] = 0;
    return buf;
}

/* The head of a step's line, "step 3 loss 5.1  lr 1.00e-03  1234 tok/s  MFU 3.1%  12.0 ms",
 * into line, and its --log line into x (the reference: no bubble), written by
 * app_log_write once the step's evaluation, if it has one, has given its eval_loss. */
static void report_step(run_report *rr, const sp_app_model *m, int step, float lr,
                        const app_step_out *s, char *line, size_t len, app_log_line *x)
{
    float loss = s->loss;
    double step_s = s->step_s;
    double rate = rr->samples / step_s, fps = rr->step_flops / step_s;
    double mfu = rr->peak_total > 0 ? fps / rr->peak_total : -1;
    char mfus[32] = "";
    if (mfu >= 0) snprintf(mfus, sizeof mfus, "  MFU %.1f%%", 100 * mfu);
    /* Above 100%, the start-up timing of the peak came out low (other processes on the
     * cores then, or products larger than its 256^3 running faster): said once */
    const char *low = "";
    if (mfu > 1 && rr->peak_measured && !rr->peak_low_said) {
        rr->peak_low_said = 1;
        low = " (above the peak timed at start-up: --peak-tflops sets it)";
    }
    snprintf(line, len, "step %d loss %.6f  lr %.2e  %.0f %s/s%s%s  %.1f ms", step, loss,
             (double)lr, rate, m->sample_unit, mfus, low, 1e3 * step_s);
    *x = (app_log_line){ .step = step, .loss = loss, .lr = lr, .step_s = step_s,
                         .grad_norm = s->grad_norm, .rate_key = rr->rate_key, .rate = rate,
                         .flops_per_s = fps, .mfu = mfu,
                         .bubble = s->has_bubble ? s->bubble : -1,
                         .plan_bubble = s->has_bubble ? s->plan_bubble : -1,
                         .skipped = s->skipped };
}

/* ---- evaluation (--eval-every) and sampling (--sample) ---- */

/* Evaluations come every N steps (counted from the first step of the run that a resume
 * continues) and after the last step; with --steps 0, once, of the loaded state. */
static int eval_due(const sp_app_opts *o, int step, int last)
{
    return o->eval_every && (step % o->eval_every == 0 || step == last);
}

/* "eval step 10 loss 2.5123458 (8 held-out microbatches)": the loss with the digits that
 * read back as the same float, so two runs' lines compare bit for bit. */
static void print_eval(int step, float loss, int K, const char *suffix)
{
    char b[32];
    printf("eval step %d loss %s (%d held-out microbatches)%s\n", step,
           app_float_str(loss, b, sizeof b), K, suffix);
    fflush(stdout);
}

/* One evaluation after `step` (collective), printed with --check's note; its loss into
 * *loss. 1 on failure (said). */
static int evaluate(app_engine *e, int step, float *loss)
{
    int mismatch = 0;
    if (e->ops->eval(e, step, loss, &mismatch) != SP_OK) {
        if (e->speaks)
            fprintf(stderr, "%s: error in the evaluation after step %d: %s\n", e->m->name, step,
                    sp_last_error());
        return 1;
    }
    if (e->speaks) print_eval(step, *loss, e->K, e->same_note && !mismatch ? e->same_note : "");
    return e->same_note ? e->ops->agree(e, mismatch, e->msg) : 0;
}

/* Writes bytes with C escapes for what a terminal would not show (quote: also '"' and
 * '\\' and line breaks, for the one-line prompt). */
static void put_bytes(FILE *f, const unsigned char *b, size_t n, int quote)
{
    for (size_t i = 0; i < n; i++) {
        unsigned c = b[i];
        if (quote && (c == '"' || c == '\\')) fprintf(f, "\\%c", c);
        else if (c == '\n') fputs(quote ? "\\n" : "\n", f);
        else if (c == '\t') fputs(quote ? "\\t" : "\t", f);
        else if (c < 0x20 || c == 0x7f || (quote && c >= 0x80)) fprintf(f, "\\x%02x", c);
        else fputc((int)c, f);
    }
}

/* The header line, then the generated tokens: bytes of a byte-level model, or through
 * the tokenizer's decoder (an id without a token shows as [id N]). */
static void print_sample(const sp_app_opts *o, uint64_t seed, const char *prompt,
                         const int32_t *tokens)
{
    printf("sample (%d %s, temperature %g, top-k %d, seed %llu) after \"", o->sample,
           o->tok ? "tokens" : "bytes", (double)o->temperature, o->top_k,
           (unsigned long long)seed);
    put_bytes(stdout, (const unsigned char *)prompt, strlen(prompt), 1);
    printf("\":\n");
    int last = '\n';
    for (int i = 0; i < o->sample; i++) {
        size_t n = 1;
        unsigned char c = (unsigned char)tokens[i];
        const unsigned char *b = o->tok ? sp_tokenizer_bytes(o->tok, tokens[i], &n) : &c;
        if (!b) {
            printf("[id %d]", tokens[i]);
            last = ']';
            continue;
        }
        if (i == 0 && o->tok && sp_tokenizer_strips_space(o->tok) && n && b[0] == ' ')
            b++, n--; /* SentencePiece's decoder drops the text's first space */
        put_bytes(stdout, b, n, 0);
        if (n) last = b[n - 1];
    }
    if (last != '\n') putchar('\n');
    fflush(stdout);
}

/* --sample: the trained parameters gathered (io->get is collective in a pipelined run:
 * every rank calls it for every parameter, in order) into a reference interpreter of the
 * model's one-sequence build on the writer (rank 0), which generates the bytes and
 * prints them. 1 on failure, with a message in msg. */
static int sample_text(sp_app_model *m, const sp_app_opts *o, const sp_graph *g,
                       const ckpt_io *io, char *msg, size_t len)
{
    sp_status st = SP_OK;
    sp_graph *sg = NULL;
    sp_program *sp = NULL;
    sp_reference *sr = NULL;
    if (io->writer) {
        sg = m->build_sampler(m->cfg, o->tok ? sp_tokenizer_size(o->tok) : 0, &st);
        sp = sg ? sp_program_build(sg, &st) : NULL;
        sr = sp ? sp_reference_create(sp, 1, NULL, 0, &st) : NULL;
    }
    int bad = io->writer && !sr;
    if (bad) snprintf(msg, len, "--sample: %s", sp_last_error());
    int64_t most = 1;
    for (int i = 0; i < sp_graph_num_params(g); i++)
        if (sp_param_whole_numel(g, sp_graph_param(g, i)) > most) /* io->get: whole */
            most = sp_param_whole_numel(g, sp_graph_param(g, i));
    float *buf = malloc((size_t)most * sizeof *buf);
    for (int i = 0; buf && i < sp_graph_num_params(g); i++) {
        sp_tensor p = sp_graph_param(g, i);
        if ((st = io->get(io->ctx, p, 0, buf)) != SP_OK) break; /* the same on every rank */
        sp_tensor q = sr ? sp_graph_find(sg, sp_tensor_name(g, p)) : -1;
        if (sr && !bad && (q < 0 || (st = sp_reference_set_param(sr, q, buf)) != SP_OK)) {
            snprintf(msg, len, "--sample: the model to sample from has no parameter '%s'",
                     sp_tensor_name(g, p));
            bad = 1;
        }
    }
    if (!buf || st != SP_OK) {
        if (!bad) snprintf(msg, len, "--sample: %s", buf ? sp_last_error() : "out of memory");
        bad = 1;
    }
    free(buf);
    /* the prompt: its bytes, or with a tokenizer its <|endoftext|> (or <s>) alone */
    const char *prompt = o->prompt ? o->prompt : "\n";
    int32_t start = -1;
    if (o->tok && (start = sp_tokenizer_added(o->tok, prompt = "<|endoftext|>")) < 0)
        start = sp_tokenizer_added(o->tok, prompt = "<s>");
    size_t np = o->tok ? 1 : strlen(prompt);
    int32_t *tokens = io->writer && !bad ? malloc((np + (size_t)o->sample) * sizeof *tokens) : NULL;
    if (io->writer && !bad) {
        sp_sample_opts so = { .temperature = o->temperature, .top_k = o->top_k,
                              .seed = (uint64_t)(o->sample_seed >= 0 ? o->sample_seed : o->seed),
                              .vocab = m->vocab ? m->vocab(m->cfg) : 0 };
        for (size_t i = 0; tokens && i < np; i++) tokens[i] = o->tok ? start : (unsigned char)prompt[i];
        if (!tokens || (st = sp_generate(sr, tokens, (int)np, o->sample, &so, tokens + np))) {
            snprintf(msg, len, "--sample: %s", tokens ? sp_last_error() : "out of memory");
            bad = 1;
        } else {
            print_sample(o, so.seed, prompt, tokens + np);
        }
    }
    free(tokens);
    sp_reference_free(sr);
    sp_program_free(sp);
    sp_graph_free(sg);
    return bad;
}

/* ---- the run ---- */

/* Whether step (of a run resumed after `start`) ends with a checkpoint: the run's last,
 * every --save-every, and the one a --save-on-signal signal stops at. */
static int save_due(const sp_app_opts *o, int step, int start, int stop)
{
    return o->save && (stop || step == start + o->steps ||
                       (o->save_every && step % o->save_every == 0));
}

static void stopped_by(const sp_app_model *m, const sp_app_opts *o, int sig, int step)
{
    printf("%s: stopped by SIG%s after step %d: saved %s; --resume %s continues the run\n",
           m->name, app_signal_name(sig), step, o->save, o->save);
    fflush(stdout);
}

/* The banner: the engine's first line, the model, the learning rate, MFU's peak, the
 * engine's own lines, the checkpoint resumed. 1 on failure (said). */
static int banner(app_engine *e, run_report *rr, int start)
{
    const sp_app_opts *o = e->o;
    if (e->speaks) {
        printf("%s\n", e->head);
        if (e->m->describe) e->m->describe(e->m->cfg, stdout);
        describe_lr(&rr->lr);
        if (o->steps > 0) set_peak(rr, e);
    }
    if (e->ops->describe && e->ops->describe(e)) return 1;
    if (e->speaks) {
        if (o->load) printf("resumed from %s after step %d\n", o->load, start);
        fflush(stdout);
    }
    return 0;
}

int app_run(app_engine *e)
{
    sp_app_model *m = e->m;
    const sp_app_opts *o = e->o;
    const app_engine_ops *ops = e->ops;
    char sig[256], settings[4096], msg[1024];
    m->signature(m->cfg, sig, sizeof sig);
    run_report rr = { .log = APP_LOG_NONE };
    int code = 1, start = 0;
    sp_status st;
    if (o->init && ops->agree(e, ops->load(e, o->init, NULL, NULL) != SP_OK, sp_last_error()))
        goto out;
    if (o->load && ops->agree(e, ops->load(e, o->load, sig, &start) != SP_OK, sp_last_error()))
        goto out;
    app_settings(m, o, e->sch->nmicro, app_stored_horizon(o, start), settings, sizeof settings);
    rr = report_of(e, start);
    int logs = e->speaks && o->log && o->steps > 0; /* rank 0 writes the --log file */
    if (logs) app_log_open(&rr.log, o->log, o->load ? start : -1);
    if (ops->agree(e, logs && rr.log.fd < 0, sp_last_error())) goto out;
    /* --steps 0 --save F: the loaded (or initial) state, as it is */
    if (o->steps == 0 && o->save &&
        ops->agree(e, ckpt_save(o->save, e->g, sig, settings, start, &e->io) != SP_OK,
                   sp_last_error()))
        goto out;
    if (banner(e, &rr, start)) goto out;
    double t_start = now(), busy = 0;
    float first = 0, last = 0;
    int end = start + o->steps, ran = 0, stop = 0; /* stop: --save-on-signal's signal */
    for (int step = start + 1; step <= end && !stop; step++, ran++) {
        app_inputs_fill(m, o, e->p, e->R * e->sch->nmicro, step, &e->env->fault, e->in);
        float lr = sp_lr_at(&rr.lr, step);
        app_step_out s;
        if (ops->step(e, step, lr, &s) != SP_OK) {
            if (e->speaks)
                fprintf(stderr, "%s: error at step %d: %s\n", m->name, step, sp_last_error());
            goto out;
        }
        if (step == start + 1) first = s.loss;
        last = s.loss;
        busy += s.step_s;
        app_log_line x = { 0 };
        if (e->speaks) {
            char line[256], bubble[64] = "";
            report_step(&rr, m, step, lr, &s, line, sizeof line, &x);
            if (s.has_bubble)
                snprintf(bubble, sizeof bubble, "  bubble %.1f%% (plan %.1f%%)", 100 * s.bubble,
                         100 * s.plan_bubble);
            printf("%s%s%s%s\n", line, bubble, e->same_note && !s.mismatch ? e->same_note : "",
                   s.skipped ? "  update skipped: non-finite loss or gradients" : "");
            fflush(stdout);
        }
        if (e->same_note && ops->agree(e, s.mismatch, e->msg)) goto out;
        /* the step's log line waits for its evaluation, whose loss it carries */
        x.has_eval_loss = eval_due(o, step, end);
        if (x.has_eval_loss && evaluate(e, step, &x.eval_loss)) goto out;
        /* a --log write that failed (rank 0) stops every rank */
        st = e->speaks ? app_log_write(&rr.log, &x) : SP_OK;
        if (o->log && ops->agree(e, st != SP_OK, sp_last_error())) goto out;
        /* a signal may reach some ranks only, or at different steps: they agree (not
         * after the last step: the run is complete) */
        if (o->save_on_signal && step < end) stop = ops->stop(e, step);
        st = SP_OK;
        if (o->dump_grads && step == start + 1)
            st = ckpt_dump_grads(o->dump_grads, e->g, sig, step, &e->io);
        if (st == SP_OK && save_due(o, step, start, stop))
            st = ckpt_save(o->save, e->g, sig, settings, step, &e->io);
        if (ops->agree(e, st != SP_OK, sp_last_error())) goto out;
        if (stop && e->speaks) stopped_by(m, o, stop, step);
    }
    float eval_loss; /* --steps 0: the loaded state's, once (no step, no log line) */
    if (o->steps == 0 && o->eval_every && evaluate(e, start, &eval_loss)) goto out;
    if (ops->finish && ops->finish(e)) goto out;
    if (e->speaks) {
        char range[64], per[32] = "";
        if (e->per_step_ms && ran)
            snprintf(per, sizeof per, " (%.1f ms per step)", 1e3 * busy / ran);
        printf("done: %d steps in %.1f s%s%s%s\n", ran, now() - t_start, per,
               loss_range(range, sizeof range, ran, first, last), e->done_note);
        fputs(e->tail, stdout);
        if (rr.log.fd >= 0 && !e->log_after_sample)
            printf("log: %s (scripts/plot-log draws it)\n", o->log);
        fflush(stdout);
    }
    if (o->sample) {
        int bad = sample_text(m, o, e->g, &e->io, msg, sizeof msg);
        if (ops->agree(e, bad, msg)) goto out;
    }
    if (e->speaks && rr.log.fd >= 0 && e->log_after_sample)
        printf("log: %s (scripts/plot-log draws it)\n", o->log);
    code = 0;
out:
    app_log_close(&rr.log);
    return ops->end(e, code);
}
