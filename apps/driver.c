/* The training driver behind starpipe-gpt and starpipe-mlp (see driver.h).
 * Errors: before MPI starts every rank parses the same argv, so only rank 0 prints and
 * every rank exits 2. After, a failure seen by some ranks is agreed on (one allreduce),
 * the lowest failing rank prints, and every rank shuts down and exits non-zero. */
#include "apps/driver.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "apps/checkpoint.h"
#include "apps/reference.h"
#include "apps/metrics.h"
#include "apps/options.h"
#include "apps/outputs.h"
#include "apps/preflight.h"
#include "base/env.h"
#include "base/files.h"
#include "starpipe/data.h"
#include "starpipe/exec.h"
#include "starpipe/optim.h"
#include "starpipe/plan.h"
#include "starpipe/program.h"
#include "starpipe/reference.h"
#include "starpipe/sample.h"
#include "starpipe/tokens.h"
#include "starpipe/train.h"

/* ---- the STARPIPE_* variables, read once before any work, as strictly as the flags
 * (base/env.c: each is checked there; the planner, executor and trainer take theirs) ---- */
static sp_env env;

static sp_status read_env(void)
{
    sp_status st = sp_env_read(&env);
    if (st) return st;
    /* STARPIPE_RANK_ORDER's word, for any rank count */
    sp_layout l;
    int r = env.replicas > 0 ? env.replicas : 1;
    return sp_layout_from_env(r, r, 1, 1, NULL, &l);
}

/* How the ranks are laid out: the flags, else STARPIPE_REPLICAS / STARPIPE_RANK_ORDER. */
static sp_status layout_of(const sp_app_opts *o, int nranks, sp_layout *l)
{
    return sp_layout_from_env(nranks, o->replicas, o->actors, o->tensor, o->rank_order, l);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

/* Per-step inputs: [mb * ninputs + k], each sized by the program. */
static void **alloc_inputs(const sp_program *p, int m)
{
    int nin = sp_program_num_inputs(p);
    void **in = calloc((size_t)m * nin, sizeof *in);
    for (int i = 0; in && i < m * nin; i++)
        if (!(in[i] = malloc(sp_program_buf_bytes(p, SP_BUF_INPUT, i % nin) + 4))) return NULL;
    return in;
}

static void fill_inputs(sp_app_model *m, const sp_app_opts *o, const sp_program *p, int nmb,
                        int step, void **in)
{
    int nin = sp_program_num_inputs(p);
    for (int i = 0; i < nmb; i++) m->batch(m->cfg, (uint64_t)o->seed, step, i, in + (size_t)i * nin);
    /* STARPIPE_FAULT=nan@STEP: a NaN in microbatch 0's first float input */
    if (env.fault.kind == SP_FAULT_NAN && env.fault.step == step)
        for (int k = 0; k < nin; k++)
            if (sp_tensor_dtype(sp_program_graph(p), sp_program_input(p, k)) == SP_F32) {
                ((float *)in[k])[0] = NAN;
                break;
            }
}

/* ---- checkpoint access to the reference and to the trainer ---- */
static sp_status tr_get(void *ctx, sp_tensor p, int what, float *dst)
{
    return sp_trainer_fetch(ctx, p, what, dst);
}
static sp_status tr_set(void *ctx, sp_tensor p, int what, const float *src)
{
    return sp_trainer_store(ctx, p, what, src);
}

/* ---- before the first step: outputs, settings, sizes ---- */

/* The learning-rate schedule's horizon: the step at which the decay reaches --lr-min.
 * --decay-steps when given or stored in the checkpoint being resumed (so a resumed run
 * keeps the horizon of the run it continues, however many steps it runs itself), else the
 * last step of this run: its --steps after the checkpoint's step `start`. */
static int horizon_of(const sp_app_opts *o, int start)
{
    return o->decay_steps > 0 ? o->decay_steps : start + o->steps;
}

static sp_lr_schedule lr_schedule_of(const sp_app_opts *o, int start)
{
    return (sp_lr_schedule){ .lr = o->lr, .lr_min = o->lr_min, .warmup = o->warmup,
                             .total = horizon_of(o, start), .decay = o->lr_decay };
}

/* The horizon a checkpoint stores: the run's when it decays, else only a --decay-steps
 * given (a constant rate has none, and runs without a schedule keep equal settings
 * however they are cut into resumed pieces). */
static int stored_horizon(const sp_app_opts *o, int start)
{
    return o->lr_decay != SP_LR_DECAY_NONE ? horizon_of(o, start) : o->decay_steps;
}

/* The driver's flags that settings_of may store; with the model's settings_flags, all
 * that a resume restores from a checkpoint. */
static const char *const stored_flags[] = { "--microbatches", "--seed", "--lr", "--clip",
                                            "--warmup", "--lr-decay", "--lr-min",
                                            "--decay-steps", "--precision", "--eval-every",
                                            "--eval-batches", "--data-format", NULL };

static int in_list(const char *const *list, const char *s)
{
    for (; list && *list; list++)
        if (!strcmp(*list, s)) return 1;
    return 0;
}

/* The flags that continue this run from a checkpoint ("--flag value" lines): those that
 * change the computation and are not in the model's signature, the learning-rate
 * schedule with its horizon (stored_horizon, or 0 for none) among them. Floats with as
 * many digits as they need to read back as the same float (app_float_str). */
static void settings_of(const sp_app_model *m, const sp_app_opts *o, int nmicro, int horizon,
                        char *buf, size_t len)
{
    char lr[32], clip[32], lr_min[32];
    int k = snprintf(buf, len, "--microbatches %d\n--seed %d\n--lr %s\n--clip %s\n--warmup %d\n"
                     "--lr-decay %s\n--lr-min %s\n", nmicro, o->seed,
                     app_float_str(o->lr, lr, sizeof lr), app_float_str(o->clip, clip, sizeof clip),
                     o->warmup, sp_lr_decay_name(o->lr_decay),
                     app_float_str(o->lr_min, lr_min, sizeof lr_min));
    if (horizon > 0 && k > 0 && (size_t)k < len)
        k += snprintf(buf + k, len - (size_t)k, "--decay-steps %d\n", horizon);
    if (k > 0 && (size_t)k < len)
        k += snprintf(buf + k, len - (size_t)k, "--precision %s\n", o->bf16 ? "bf16" : "fp32");
    /* evaluation holds out data, which changes the training batches: a resume keeps it */
    if (k > 0 && (size_t)k < len && (o->eval_every || sp_app_given(m, o, "--eval-every")))
        k += snprintf(buf + k, len - (size_t)k, "--eval-every %d\n", o->eval_every);
    if (k > 0 && (size_t)k < len && o->eval_every && o->eval_batches)
        k += snprintf(buf + k, len - (size_t)k, "--eval-batches %d\n", o->eval_batches);
    /* how the data is read: a resume must accept the data the run trained on */
    if (k > 0 && (size_t)k < len &&
        (o->data_format != SP_APP_DATA_AUTO || sp_app_given(m, o, "--data-format")))
        k += snprintf(buf + k, len - (size_t)k, "--data-format %s\n",
                      sp_app_data_format_name(o->data_format));
    if (m->settings && k > 0 && (size_t)k < len) m->settings(m->cfg, buf + k, len - k);
}

/* The value of `flag` in a settings text, into out ("" when absent). */
static void setting_value(const char *text, const char *flag, char *out, size_t len)
{
    size_t fl = strlen(flag);
    out[0] = 0;
    for (const char *l = text; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL)
        if (!strncmp(l, flag, fl) && l[fl] == ' ') {
            const char *e = strchr(l, '\n');
            size_t n = e ? (size_t)(e - l - fl - 1) : strlen(l + fl + 1);
            snprintf(out, len, "%.*s", (int)(n < len ? n : len - 1), l + fl + 1);
            return;
        }
}

/* --resume FILE continues the run that wrote FILE: its stored settings apply wherever the
 * command line (or STARPIPE_MICROBATCHES) says nothing, and a setting given that differs
 * is said in one line. Only the settings that define the computation are restored
 * (stored_flags, the model's settings_flags): a checkpoint is data from elsewhere, and one
 * that stores any other flag (--save, --log, --steps...) is refused naming it, as is one
 * of another model kind than --arch gives. Returns the stored text, which the model's
 * options may point into (free it at the end), or NULL: no settings stored, or a file
 * ckpt_load will refuse. *bad: refused (the message printed on rank 0). */
static char *resume_settings(const sp_app_model *m, sp_app_opts *o, int *bad)
{
    char *stored = ckpt_read_meta(o->load, "starpipe.settings");
    if (!stored) return NULL;
    int m_given = o->microbatches > 0 ? o->microbatches : env.microbatches;
    int speak = sp_app_launcher_rank() == 0;
    char cur[4096], now[1024], changed[1024] = "";
    settings_of(m, o, m_given, o->decay_steps, cur, sizeof cur);
    /* which model the file holds: a run of another kind is refused before any of the
     * file's settings of that model are applied (they would be blamed on the user) */
    if (m->kind_flag) {
        char kind[64];
        setting_value(stored, m->kind_flag, kind, sizeof kind);
        if (!kind[0] && m->kind_unstored) { /* a file written before the kind was stored */
            snprintf(kind, sizeof kind, "%s", m->kind_unstored);
            if (!sp_app_given(m, o, m->kind_flag)) sp_app_apply(m, o, m->kind_flag, kind);
        }
        setting_value(cur, m->kind_flag, now, sizeof now);
        if (sp_app_given(m, o, m->kind_flag) && kind[0] && strcmp(kind, now)) {
            if (speak)
                fprintf(stderr, "%s: error: %s is a checkpoint of another model (%s %s), not "
                        "of the %s %s that this run builds: resume it with %s %s\n", m->name,
                        o->load, m->kind_flag, kind, m->kind_flag, now, m->kind_flag, kind);
            *bad = 1;
            return stored;
        }
    }
    size_t nc = 0;
    for (char *line = stored, *next; line && *line && !*bad; line = next) {
        if ((next = strchr(line, '\n'))) *next++ = 0;
        char *sp = strchr(line, ' ');
        if (!sp) continue;
        *sp = 0;
        const char *flag = line, *value = sp + 1;
        if (!in_list(stored_flags, flag) && !in_list(m->settings_flags, flag)) {
            if (speak)
                fprintf(stderr, "%s: error: %s stores the setting '%.64s', which a checkpoint "
                        "does not set (it restores only the settings that define the "
                        "computation): a file altered or from another program\n", m->name,
                        o->load, flag);
            *bad = 1;
            break;
        }
        if (!sp_app_given(m, o, flag) && !(!strcmp(flag, "--microbatches") && m_given)) {
            *bad = sp_app_apply(m, o, flag, value) != 1;
            continue;
        }
        setting_value(cur, flag, now, sizeof now);
        if (strcmp(now, value) && nc < sizeof changed)
            nc += (size_t)snprintf(changed + nc, sizeof changed - nc, "%s%s %s (was %s)",
                                   nc ? ", " : "", flag, now, value);
    }
    if (nc && !*bad && speak) {
        printf("%s: resuming %s with changed settings: %s\n", m->name, o->load, changed);
        fflush(stdout);
    }
    return stored;
}

/* ---- the data file, as --data-format says it is read ---- */

/* The model's data file (its --data, as its settings name it) into path; "" for none. */
static void data_path(const sp_app_model *m, char *path, size_t len)
{
    char set[2 * PATH_MAX + 1024];
    path[0] = 0;
    if (!m->settings) return;
    m->settings(m->cfg, set, sizeof set);
    setting_value(set, "--data", path, len);
}

/* Every file the run writes, checked at start-up on the rank that writes it: a path that
 * cannot be written, or that is another output or an input, is refused before any step,
 * not after the work (outputs.c). */
static sp_status check_outputs(const sp_app_model *m, const sp_app_opts *o)
{
    char data[PATH_MAX];
    data_path(m, data, sizeof data);
    return app_check_outputs(o, env.trace, data[0] ? data : NULL);
}

/* The offset of the first byte that is not UTF-8 text (a NUL, or an invalid sequence), n
 * when there is none; *what says which. */
static size_t first_non_text(const unsigned char *b, size_t n, const char **what)
{
    for (size_t i = 0; i < n;) {
        size_t k = b[i] ? sp_utf8_seq(b + i, n - i) : 0;
        if (!k) {
            *what = b[i] ? "invalid UTF-8" : "a NUL byte";
            return i;
        }
        i += k;
    }
    return n;
}

/* The model's data file (its --data, as its settings name it) against --data-format,
 * before prepare loads it. sp_text_load reads a pattern (a list, a glob) or a file that
 * begins with the shard magic as token shards, and anything else as bytes: auto lets
 * bytes through only when they are UTF-8 text (a damaged shard, binary data are refused,
 * naming the file), text and shard insist on one, raw skips the text check. A file that
 * cannot be read is left to prepare, which says why. SP_ERR_FORMAT when refused. */
static sp_status check_data(const sp_app_model *m, const sp_app_opts *o)
{
    char path[PATH_MAX];
    data_path(m, path, sizeof path);
    if (!path[0]) return SP_OK; /* a model without a file */
    int fmt = o->data_format;
    const char *name = sp_app_data_format_name(fmt);
    int pattern = strpbrk(path, "*?,") != NULL, shard = !pattern && sp_tokens_is_shard(path);
    if (pattern || shard) {
        if (fmt != SP_APP_DATA_TEXT && fmt != SP_APP_DATA_RAW) return SP_OK; /* the shards' own checks */
        return sp_set_error(SP_ERR_FORMAT, "--data-format %s: '%s' is %s, read as tokens: use "
                            "--data-format shard or auto", name, path,
                            pattern ? "a list or glob of token shards" : "a token shard");
    }
    if (fmt == SP_APP_DATA_SHARD) { /* the shard reader's own words on what is wrong */
        sp_tokens *t = NULL;
        sp_status st = sp_tokens_open_pattern(path, &t);
        sp_tokens_close(t);
        return st ? sp_error_context(SP_ERR_FORMAT, "--data-format shard")
                  : sp_set_error(SP_ERR_FORMAT, "--data-format shard: not a token shard");
    }
    if (fmt == SP_APP_DATA_RAW) return SP_OK;
    char *bytes = NULL;
    size_t n = 0;
    if (sp_file_read(path, "data file", SP_TEXT_MAX_BYTES, &bytes, &n) != SP_OK) return SP_OK;
    const unsigned char *b = (const unsigned char *)bytes;
    const char *what = "";
    size_t at = first_non_text(b, n, &what);
    sp_status st = SP_OK;
    if (at < n && fmt == SP_APP_DATA_TEXT)
        st = sp_set_error(SP_ERR_FORMAT, "--data-format text: data file '%s' is not UTF-8 text "
                          "(byte %zu: %s)", path, at, what);
    else if (at < n) {
        char head[128] = "";
        if (n >= 4)
            snprintf(head, sizeof head, "; a token shard begins with the magic %d, this file "
                     "with %u", SP_TOKENS_MAGIC,
                     (unsigned)b[0] | (unsigned)b[1] << 8 | (unsigned)b[2] << 16 |
                         (unsigned)b[3] << 24);
        st = sp_set_error(SP_ERR_FORMAT, "data file '%s' is neither UTF-8 text nor a token "
                          "shard (byte %zu: %s%s): --data-format raw trains on its bytes",
                          path, at, what, head);
    }
    free(bytes);
    return st;
}

/* The model's scan of its whole data set (scan_data), timed for STARPIPE_VERBOSE=1:
 * 1 with a message when a value is refused. */
static int scan_data(const sp_app_model *m, char *msg, size_t len)
{
    if (!m->scan_data) return 0;
    double t0 = now(), bytes = 0;
    int bad = m->scan_data(m->cfg, &bytes, msg, len);
    double dt = now() - t0;
    if (!bad && env.verbose >= 1 && bytes > 0)
        printf("data: %.0f bytes of tokens checked against the vocabulary in %.2f s (%.0f MB/s)\n",
               bytes, dt, dt > 0 ? bytes / dt / 1e6 : 0.0);
    return bad;
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
 * else on CPU `cpu` (measured at start-up). Fills rr->peak_total and prints the banner
 * line saying so (rank 0). */
static void set_peak(run_report *rr, const sp_app_opts *o, int cuda, int ranks, int reference,
                     const app_peak *cpu)
{
    app_peak pk = *cpu;
    int local = reference ? 1 : sp_app_launcher_local_size(), per_node = local;
    if (local < 1) local = per_node = 1;
    if (cuda) {
        int ngpus;
        app_peak_gpu(&pk, env.tf32, NULL, &ngpus);
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
static run_report report_of(sp_app_model *m, const sp_app_opts *o, const sp_program *p,
                            const sp_schedule *sch, int R, int T, double samples, int start)
{
    run_report rr = { .lr = lr_schedule_of(o, start), .log = APP_LOG_NONE,
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

/* The final line's ", loss 5.535660 -> 3.077937"; nothing when no step ran (--steps 0). */
static const char *loss_range(char *buf, size_t len, int steps, float first, float last)
{
    if (steps > 0) snprintf(buf, len, ", loss %.6f -> %.6f", first, last);
    else if (len) buf[0] = 0;
    return buf;
}

/* The head of a step's line, "step 3 loss 5.1  lr 1.00e-03  1234 tok/s  MFU 3.1%  12.0 ms",
 * into line, and its --log line into x (stats NULL: the reference, no bubble), written by
 * app_log_write once the step's evaluation, if it has one, has given its eval_loss. */
static void report_step(run_report *rr, const sp_app_model *m, int step, float loss, float lr,
                        double step_s, double grad_norm, const sp_step_stats *stats,
                        int skipped, char *line, size_t len, app_log_line *x)
{
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
                         .grad_norm = grad_norm, .rate_key = rr->rate_key, .rate = rate,
                         .flops_per_s = fps, .mfu = mfu, .bubble = stats ? stats->bubble : -1,
                         .plan_bubble = stats ? stats->plan_bubble : -1, .skipped = skipped };
}

/* ---- evaluation (--eval-every) and sampling (--sample), shared by both runs ---- */

/* After prepare: the held-out data set aside, when evaluation is asked for (only then:
 * runs without it train on the data as they always did). 0 ok, else a message. */
static int hold_out(sp_app_model *m, const sp_app_opts *o, char *msg, size_t len)
{
    return o->eval_every && m->hold_out ? m->hold_out(m->cfg, msg, len) : 0;
}

/* The K held-out microbatches, filled once: every evaluation reads the same ones. */
static void **eval_inputs(sp_app_model *m, const sp_app_opts *o, const sp_program *p, int K)
{
    void **in = alloc_inputs(p, K);
    int nin = sp_program_num_inputs(p);
    for (int k = 0; in && k < K; k++)
        m->eval_batch(m->cfg, (uint64_t)o->seed, k, K, in + (size_t)k * nin);
    return in;
}

static void free_inputs(void **in, int n, const sp_program *p)
{
    for (int i = 0; in && i < n * sp_program_num_inputs(p); i++) free(in[i]);
    free(in);
}

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

/* The header line, then the generated bytes (tokens of a byte-level model). */
static void print_sample(const sp_app_opts *o, uint64_t seed, const char *prompt,
                         const int32_t *tokens)
{
    printf("sample (%d bytes, temperature %g, top-k %d, seed %llu) after \"", o->sample,
           (double)o->temperature, o->top_k, (unsigned long long)seed);
    put_bytes(stdout, (const unsigned char *)prompt, strlen(prompt), 1);
    printf("\":\n");
    for (int i = 0; i < o->sample; i++) {
        unsigned char c = (unsigned char)tokens[i];
        put_bytes(stdout, &c, 1, 0);
    }
    if (!o->sample || tokens[o->sample - 1] != '\n') putchar('\n');
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
        sg = m->build_sampler(m->cfg, &st);
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
    const char *prompt = o->prompt ? o->prompt : "\n";
    size_t np = strlen(prompt);
    int32_t *tokens = io->writer && !bad ? malloc((np + (size_t)o->sample) * sizeof *tokens) : NULL;
    if (io->writer && !bad) {
        sp_sample_opts so = { .temperature = o->temperature, .top_k = o->top_k,
                              .seed = (uint64_t)(o->sample_seed >= 0 ? o->sample_seed : o->seed) };
        for (size_t i = 0; tokens && i < np; i++) tokens[i] = (unsigned char)prompt[i];
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

/* ---- the reference interpreter alone ---- */

/* One evaluation of the reference run, printed; its loss into *loss. 1 on failure
 * (message printed). */
static int eval_reference(sp_app_model *m, app_ref *r, void **in, int K, int step,
                          float *loss)
{
    if (app_ref_eval(r, K, (const void *const *)in, loss) != SP_OK) {
        fprintf(stderr, "%s: error in the evaluation after step %d: %s\n", m->name, step,
                sp_last_error());
        return 1;
    }
    print_eval(step, *loss, K, "");
    return 0;
}

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

static int run_reference(sp_app_model *m, const sp_app_opts *o, sp_adamw_config *opt)
{
    sp_schedule *sch = NULL;
    char msg[1024];
    double samples = 0;
    int T0 = o->tensor > 0 ? o->tensor : env.tensor > 0 ? env.tensor : 1;
    if (app_preflight(m, o, o->actors ? o->actors : 1, 1, T0, 1, msg, sizeof msg)) {
        fprintf(stderr, "%s: error: %s\n", m->name, msg);
        return 2;
    }
    if (sp_schedule_from_env(o->schedule, o->actors ? o->actors : 1, o->microbatches, o->chunks,
                             &sch) != SP_OK) {
        fprintf(stderr, "%s: error: %s\n", m->name, sp_last_error());
        return 2;
    }
    if (check_data(m, o) != SP_OK) {
        fprintf(stderr, "%s: error: %s\n", m->name, sp_last_error());
        return 1;
    }
    if (m->prepare(m->cfg, &samples, msg, sizeof msg) || hold_out(m, o, msg, sizeof msg) ||
        scan_data(m, msg, sizeof msg)) {
        fprintf(stderr, "%s: error: %s\n", m->name, msg);
        return 1;
    }
    sp_status st;
    int nmb = sch->nmicro;
    /* replicas: the same R x m microbatches a replicated run trains on; tensor
     * parallelism: the T members of each actor's group, in threads */
    sp_layout lay;
    if (layout_of(o, (o->actors ? o->actors : 1) * (o->replicas ? o->replicas : 1) * T0, &lay)) {
        fprintf(stderr, "%s: error: %s\n", m->name, sp_last_error());
        return 2;
    }
    int R = lay.replicas, T = sp_layout_tensor(&lay);
    app_ref *r = app_ref_create(m, o, sch->nstages, T, nmb, R, opt, &st);
    const sp_graph *g = r ? app_ref_graph(r, 0) : NULL;
    const sp_program *p = r ? app_ref_program(r, 0) : NULL;
    void **in = p ? alloc_inputs(p, R * nmb) : NULL;
    int K = o->eval_batches ? o->eval_batches : R * nmb; /* held-out microbatches */
    void **ev = p && o->eval_every ? eval_inputs(m, o, p, K) : NULL;
    if (!r || !in || (o->eval_every && !ev)) {
        fprintf(stderr, "%s: error: %s\n", m->name, st ? sp_last_error() : "out of memory");
        return 1;
    }
    char sig[256], settings[4096];
    m->signature(m->cfg, sig, sizeof sig);
    ckpt_io io = app_ref_io(r, 1);
    io.layout = m->ckpt_layout, io.layout_ctx = m->cfg;
    int start = 0;
    if (check_outputs(m, o) != SP_OK) {
        fprintf(stderr, "%s: error: %s\n", m->name, sp_last_error());
        return 1;
    }
    if (o->init && ckpt_load_values(o->init, g, &io) != SP_OK) {
        fprintf(stderr, "%s: error: %s\n", m->name, sp_last_error());
        return 1;
    }
    if (o->load) {
        if (ckpt_load(o->load, g, sig, &start, &io) != SP_OK) {
            fprintf(stderr, "%s: error: %s\n", m->name, sp_last_error());
            return 1;
        }
        app_ref_set_steps_done(r, start);
    }
    settings_of(m, o, nmb, stored_horizon(o, start), settings, sizeof settings);
    run_report rr = report_of(m, o, p, sch, R, T, samples, start);
    if (o->log && o->steps > 0 && app_log_open(&rr.log, o->log, o->load ? start : -1) != SP_OK) {
        fprintf(stderr, "%s: error: %s\n", m->name, sp_last_error());
        return 1;
    }
    /* --steps 0 --save F: the loaded (or initial) state, as it is */
    if (o->steps == 0 && o->save && ckpt_save(o->save, g, sig, settings, start, &io) != SP_OK) {
        fprintf(stderr, "%s: error: %s\n", m->name, sp_last_error());
        return 1;
    }
    char group[64] = "";
    if (T > 1) snprintf(group, sizeof group, ", a tensor group of %d in threads", T);
    if (R > 1)
        printf("%s: reference interpreter, %d stages, %d replicas x %d microbatches%s%s\n",
               m->name, sch->nstages, R, nmb, o->bf16 ? ", bf16 matmuls" : "", group);
    else
        printf("%s: reference interpreter, %d stages, %d microbatches%s%s\n", m->name,
               sch->nstages, nmb, o->bf16 ? ", bf16 matmuls" : "", group);
    if (m->describe) m->describe(m->cfg, stdout);
    describe_lr(&rr.lr);
    if (o->steps > 0) {
        app_peak cpu = { 0 };
        if (o->peak_tflops <= 0) app_peak_cpu(&cpu);
        set_peak(&rr, o, 0, 1, 1, &cpu);
    }
    if (o->load) printf("resumed from %s after step %d\n", o->load, start);
    fflush(stdout);
    double t_start = now();
    float first = 0, last = 0;
    int ran = 0, stop = 0; /* stop: the signal of --save-on-signal that ended the run */
    for (int step = start + 1; step <= start + o->steps && !stop; step++, ran++) {
        fill_inputs(m, o, p, R * nmb, step, in);
        float loss, lr = sp_lr_at(&rr.lr, step);
        app_ref_set_lr(r, lr);
        double t0 = now();
        if (app_ref_step(r, (const void *const *)in, &loss) != SP_OK) {
            fprintf(stderr, "%s: error at step %d: %s\n", m->name, step, sp_last_error());
            return 1;
        }
        double dt = now() - t0;
        if (step == start + 1) first = loss;
        last = loss;
        char line[256];
        int skipped = sp_reference_last_skipped(app_ref_member(r, 0));
        app_log_line x;
        report_step(&rr, m, step, loss, lr, dt, sp_reference_grad_norm(app_ref_member(r, 0)), NULL,
                    skipped, line,
                    sizeof line, &x);
        printf("%s%s\n", line, skipped ? "  update skipped: non-finite loss or gradients" : "");
        fflush(stdout);
        if (eval_due(o, step, start + o->steps) &&
            eval_reference(m, r, ev, K, step, &x.eval_loss))
            return 1;
        x.has_eval_loss = eval_due(o, step, start + o->steps);
        /* a signal during the last step stops nothing: the run is complete */
        stop = o->save_on_signal && step < start + o->steps ? app_stop_requested() : 0;
        sp_status cst = app_log_write(&rr.log, &x);
        if (cst == SP_OK && o->dump_grads && step == start + 1)
            cst = ckpt_dump_grads(o->dump_grads, g, sig, step, &io);
        if (cst == SP_OK && save_due(o, step, start, stop))
            cst = ckpt_save(o->save, g, sig, settings, step, &io);
        if (cst != SP_OK) {
            fprintf(stderr, "%s: error: %s\n", m->name, sp_last_error());
            return 1;
        }
        if (stop) stopped_by(m, o, stop, step);
    }
    float eval_loss; /* --steps 0: the loaded state's, once (no step, no log line) */
    if (o->steps == 0 && o->eval_every && eval_reference(m, r, ev, K, start, &eval_loss)) return 1;
    char range[64];
    printf("done: %d steps in %.1f s%s\n", ran, now() - t_start,
           loss_range(range, sizeof range, ran, first, last));
    if (o->sample && sample_text(m, o, g, &io, msg, sizeof msg)) {
        fprintf(stderr, "%s: error: %s\n", m->name, msg);
        return 1;
    }
    free_inputs(ev, K, p);
    if (rr.log.fd >= 0) printf("log: %s (scripts/plot-log draws it)\n", o->log);
    app_log_close(&rr.log);
    for (int i = 0; i < R * nmb * sp_program_num_inputs(p); i++) free(in[i]);
    free(in);
    app_ref_free(r);
    sp_schedule_free(sch);
    return 0;
}

/* STARPIPE_VERBOSE=1: what the planner predicts, per actor; 2 adds every instruction. */
static void describe_plan(const sp_plan *pl, const sp_program *p)
{
    const sp_stage_model *model = sp_program_stage_model(p);
    sp_sim_result *r = NULL;
    sp_sim_config cfg = { 0 };
    int simulated = sp_simulate(pl, model, &cfg, &r) == SP_OK;
    printf("plan: %d tasks, %lld messages per step; with FLOP-proportional task times the "
           "simulated bubble is %.1f%%\n", pl->ntasks, (long long)pl->nmessages,
           simulated ? 100 * r->bubble_fraction : 0.0);
    for (int a = 0; a < pl->nactors; a++)
        printf("  actor %d: %d instructions, peak %.2f MiB (activations %.2f, boundary %.2f, "
               "parameters %.2f, %d stage activations live)\n", a, pl->ninstr[a],
               pl->peak[a].total / 1048576.0, pl->peak[a].acts / 1048576.0,
               pl->peak[a].boundary / 1048576.0, pl->peak[a].params / 1048576.0,
               pl->peak[a].act_units);
    for (int s = 0; s < model->nstages; s++)
        printf("  stage %d: activations %zu bytes per microbatch, activation gradients kept "
               "for W %zu, task scratch %zu bytes\n", s, model->stage[s].act_bytes,
               model->stage[s].bgrad_bytes, sp_program_buf_bytes(p, SP_BUF_SCRATCH, s));
    if (simulated) sp_sim_result_free(r);
    if (env.verbose >= 2) sp_plan_write(pl, stdout);
}

/* STARPIPE_VERBOSE=1 with replicas: which ranks form each pipeline. */
static void describe_layout(const sp_layout *l)
{
    printf("ranks (%s-major): ", sp_rank_order_name(l->order));
    for (int r = 0; r < l->replicas; r++) {
        printf("%sreplica %d = ranks", r ? "; " : "", r);
        for (int a = 0; a < l->actors; a++) printf(" %d", sp_layout_rank(l, r, a));
    }
    printf(" (actor order)\n");
}

/* STARPIPE_VERBOSE=1 with replicas: each rank's AdamW state, predicted from the stage
 * sizes (2 moments of the parameters it owns, an even 1/R of them when sharded) and as
 * the trainer allocated it, and all its persistent buffers. Collective. 1 on failure. */
static int describe_memory(sp_trainer *t, const sp_program *p, int R, int sharded)
{
    int P = sp_exec_size(), me = sp_exec_rank();
    double *v = calloc(3 * (size_t)P, sizeof *v);
    if (!v) return 1;
    double pred = 0;
    for (int s = 0; s < sp_program_num_stages(p); s++)
        if (sp_trainer_owns_stage(t, s))
            pred += 2.0 * (double)sp_program_buf_bytes(p, SP_BUF_PARAMS, s) / (sharded ? R : 1);
    sp_train_memory mem = sp_trainer_memory(t);
    v[3 * me] = pred, v[3 * me + 1] = (double)mem.optimizer, v[3 * me + 2] = (double)mem.persistent;
    int bad = sp_exec_allreduce_sum(v, 3 * (size_t)P, 1) != SP_OK;
    sp_layout l = sp_trainer_layout(t);
    for (int k = 0; !bad && me == 0 && k < P; k++) {
        int r, a;
        sp_layout_place(&l, k, &r, &a);
        printf("  rank %d (replica %d, actor %d): AdamW state %.3f MiB (predicted %.3f MiB%s), "
               "persistent buffers %.3f MiB\n", k, r, a, v[3 * k + 1] / 1048576.0,
               v[3 * k] / 1048576.0, sharded ? ", 1/R" : "", v[3 * k + 2] / 1048576.0);
    }
    free(v);
    return bad;
}

/* ---- the pipelined run ---- */

static int nmb_or_zero(const sp_schedule *s) { return s ? s->nmicro : 0; }

/* Collective: 1 if any rank is bad; the lowest bad rank prints its message. */
static int any_failed(int bad, const char *name, const char *msg)
{
    int P = sp_exec_size(), me = sp_exec_rank();
    double *v = calloc((size_t)P, sizeof *v);
    if (!v) sp_exec_abort(1, "out of memory");
    v[me] = bad ? 1.0 : 0.0;
    if (sp_exec_allreduce_sum(v, (size_t)P, 1) != SP_OK) sp_exec_abort(1, "%s", sp_last_error());
    int first = -1;
    for (int r = 0; r < P && first < 0; r++)
        if (v[r] > 0) first = r;
    free(v);
    if (first == me) {
        if (P > 1) fprintf(stderr, "%s: error (rank %d): %s\n", name, me, msg);
        else fprintf(stderr, "%s: error: %s\n", name, msg);
        fflush(stderr);
    }
    return first >= 0;
}

/* One evaluation of the pipelined run: forward only through the pipeline, checked against
 * the reference's under --check; rank 0 prints; its loss into *out. Collective; 1 on
 * failure (every rank). */
static int eval_pipelined(sp_app_model *m, sp_trainer *t, app_ref *ref, double tol,
                          void **in, int K, int step, float *out)
{
    float loss = 0, want = 0;
    if (sp_trainer_eval(t, (const void *const *)in, &loss) != SP_OK) {
        if (!sp_exec_usable()) /* lost on this rank only: it ends them all */
            sp_exec_abort(1, "%s: error in the evaluation after step %d: %s", m->name, step,
                          sp_last_error());
        if (sp_exec_rank() == 0)
            fprintf(stderr, "%s: error in the evaluation after step %d: %s\n", m->name, step,
                    sp_last_error());
        return 1;
    }
    char msg[SP_ERROR_MAX + 64] = "";
    int mismatch = 0;
    if (ref && app_ref_eval(ref, K, (const void *const *)in, &want) != SP_OK) {
        snprintf(msg, sizeof msg, "reference: %s", sp_last_error());
        mismatch = 1;
    } else if (ref && (tol > 0 ? !(fabs(want - loss) <= tol * (1 + fabs(want)))
                               : memcmp(&want, &loss, 4) != 0)) {
        snprintf(msg, sizeof msg, "the evaluation after step %d differs from the reference: "
                 "loss %.9g vs reference %.9g", step, loss, want);
        mismatch = 1;
    }
    if (sp_exec_rank() == 0)
        print_eval(step, loss, K, !ref || mismatch ? "" : tol > 0 ? "  (~ reference)"
                                                               : "  (= reference)");
    *out = loss;
    return ref ? any_failed(mismatch, m->name, msg) : 0;
}

static sp_status agree_stop(const sp_app_opts *o, int *stop)
{
    double v = app_stop_requested() != 0;
    sp_status st = sp_exec_allreduce_sum(&v, 1, 1);
    *stop = st == SP_OK && v > 0 ? o->save_on_signal : 0;
    return st;
}

static int run_pipelined(int argc, char **argv, sp_app_model *m, const sp_app_opts *o,
                         sp_adamw_config *opt)
{
    const char *trace_path = env.trace;
    int verbose = env.verbose;
    char msg[SP_ERROR_MAX + 64] = "";
    /* a run that cannot fit says so before StarPU and MPI start; every rank sees the
     * same sizes, and one per machine prints */
    /* a layout that does not fit the ranks is reported once MPI runs, by the ranks in
     * agreement (a rank exiting first could take rank 0's message with it) */
    sp_layout lay;
    int fits = layout_of(o, sp_app_launcher_size(), &lay) == SP_OK;
    if (fits && app_preflight(m, o, lay.actors, lay.replicas, sp_layout_tensor(&lay), 0, msg,
                          sizeof msg)) {
        if (sp_app_launcher_local_rank() == 0) fprintf(stderr, "%s: error: %s\n", m->name, msg);
        return 2;
    }
    /* MFU's CPU peak: one core's sgemm, timed before StarPU's workers and MPI's progress
     * thread start (a CUDA run does not use it) */
    app_peak cpu_peak = { 0 };
    if (o->steps > 0 && o->peak_tflops <= 0 && sp_app_launcher_rank() == 0) app_peak_cpu(&cpu_peak);
    sp_exec_opts eo = { .trace = 1, .watchdog_s = env.step_timeout, .verbose = verbose >= 1 };
    if (sp_exec_init(&argc, &argv, &eo) != SP_OK) {
        if (sp_app_launcher_rank() == 0) fprintf(stderr, "%s: error: %s\n", m->name, sp_last_error());
        return 1;
    }
    int me = sp_exec_rank(), P = sp_exec_size(), R = 1, T = 1, replica = 0, actor = 0, trank = 0;
    int bad = 0;
    sp_schedule *sch = NULL;
    if (layout_of(o, P, &lay) != SP_OK) {
        snprintf(msg, sizeof msg, "%s", sp_last_error());
        bad = 1;
    } else if ((R = lay.replicas, P = lay.actors, T = sp_layout_tensor(&lay),
                sp_layout_place_t(&lay, me, &replica, &actor, &trank),
                o->shard_optimizer && R == 1)) {
        snprintf(msg, sizeof msg, "--shard-optimizer needs --replicas R > 1");
        bad = 1;
    } else if (sp_schedule_from_env(o->schedule, P, o->microbatches, o->chunks, &sch) != SP_OK) {
        snprintf(msg, sizeof msg, "%s", sp_last_error());
        bad = 1;
    }
    for (int k = 0; !bad && k < o->nrecompute; k++)
        if (o->recompute_stages[k] >= sch->nstages) {
            snprintf(msg, sizeof msg, "--recompute-stages: there is no stage %d (the schedule has "
                     "%d stages)", o->recompute_stages[k], sch->nstages);
            bad = 1;
        }
    if (!bad && (env.fault.kind == SP_FAULT_FAIL || env.fault.kind == SP_FAULT_HANG) &&
        env.fault.stage >= sch->nstages) {
        snprintf(msg, sizeof msg, "STARPIPE_FAULT=%s@%d:%d: there is no stage %d (the "
                 "schedule has %d stages)", env.fault.kind == SP_FAULT_FAIL ? "fail" : "hang",
                 env.fault.step, env.fault.stage, env.fault.stage, sch->nstages);
        bad = 1;
    }
    /* rank 0 writes checkpoints, dumps and traces: it checks them now, before step 1 */
    if (!bad && me == 0 && check_outputs(m, o) != SP_OK) {
        snprintf(msg, sizeof msg, "%s", sp_last_error());
        bad = 1;
    }
    double samples = 0;
    if (!bad && check_data(m, o) != SP_OK) {
        snprintf(msg, sizeof msg, "%s", sp_last_error());
        bad = 1;
    }
    if (!bad && (m->prepare(m->cfg, &samples, msg, sizeof msg) || hold_out(m, o, msg, sizeof msg)))
        bad = 1;
    if (!bad && me == 0 && scan_data(m, msg, sizeof msg)) bad = 1; /* one reader of the data */
    sp_status st = SP_OK;
    sp_graph *g = NULL;
    sp_program *p = NULL;
    sp_trainer *t = NULL;
    app_ref *ref = NULL; /* --check: the reference of the run (its T members) */
    void **in = NULL, **ev = NULL;
    int code = 0, K = 0; /* K: held-out microbatches of an evaluation */
    double *bound_ratio = NULL, dev_buffers = 0;
    run_report rr = { .log = APP_LOG_NONE };
    /* creating the trainer is collective (the NCCL bootstrap): agree first, so that a
     * rank that found bad input does not leave the others in a collective of their own */
    if (any_failed(bad, m->name, msg)) {
        code = 1;
        goto out;
    }
    {
        K = o->eval_every ? (o->eval_batches ? o->eval_batches : R * sch->nmicro) : 0;
        sp_train_opts to = { .opt = *opt, .seed = (uint64_t)o->seed, .trace = 1, .replicas = R,
                             .rank_order = lay.order, .shard_optimizer = o->shard_optimizer,
                             .eval_microbatches = K, .tensor = T };
        g = m->build(m->cfg, sch->nstages, T, trank, &st); /* this rank's member */
        p = g ? app_program(g, o, 1, &st) : NULL;
        /* collective: every rank takes part, with a GPU or not */
        if (any_failed(app_device_memory_short(m, o, p, sch, &lay, K, verbose, &dev_buffers,
                                               msg, sizeof msg), m->name, msg)) {
            code = 1;
            goto out;
        }
        t = p ? sp_trainer_create(p, sch, &to, &st) : NULL;
        in = t ? alloc_inputs(p, R * sch->nmicro) : NULL;
        if (in && K && !(ev = eval_inputs(m, o, p, K))) in = (free_inputs(in, R * sch->nmicro, p), NULL);
        /* the reference runs a program of its own: every activation in fp32 */
        if (t && o->check) ref = app_ref_create(m, o, sch->nstages, T, sch->nmicro, R, opt, &st);
        if (!in || (o->check && !ref)) {
            snprintf(msg, sizeof msg, "%s", st ? sp_last_error() : "out of memory");
            bad = 1;
        }
    }
    if (any_failed(bad, m->name, msg)) {
        code = 1;
        goto out;
    }
    int nmb = sch->nmicro;
    /* a GPU run is checked against the CPU reference within a tolerance, not bitwise */
    /* (bf16: a float near a bfloat16 rounding boundary falls on either side depending on
     * the order of summation, and AdamW turns a tiny gradient of the other sign into a
     * step of the other sign: 2e-2 per float; tests/gpu/emu checks bf16 by L2 norm) */
    double tol = sp_exec_num_cuda() > 0 ? (o->bf16 ? 2e-2 : 1e-4) : 0.0;
    char sig[256], settings[4096];
    m->signature(m->cfg, sig, sizeof sig);
    ckpt_io io = { .ctx = t, .get = tr_get, .set = tr_set, .writer = me == 0,
                   .layout = m->ckpt_layout, .layout_ctx = m->cfg };
    ckpt_io rio = ref ? app_ref_io(ref, 0) : io;
    rio.layout = m->ckpt_layout, rio.layout_ctx = m->cfg;
    int start = 0;
    if (o->init) {
        st = ckpt_load_values(o->init, g, &io);
        if (st == SP_OK && ref) st = ckpt_load_values(o->init, app_ref_graph(ref, 0), &rio);
        if (any_failed(st != SP_OK, m->name, sp_last_error())) {
            code = 1;
            goto out;
        }
    }
    if (o->load) {
        int rstart = 0;
        st = ckpt_load(o->load, g, sig, &start, &io);
        if (st == SP_OK && ref) st = ckpt_load(o->load, app_ref_graph(ref, 0), sig, &rstart, &rio);
        if (any_failed(st != SP_OK, m->name, sp_last_error())) {
            code = 1;
            goto out;
        }
        sp_trainer_set_steps_done(t, start);
        if (ref) app_ref_set_steps_done(ref, start);
    }
    settings_of(m, o, nmb, stored_horizon(o, start), settings, sizeof settings);
    rr = report_of(m, o, p, sch, R, T, samples, start);
    if (me == 0 && o->log && o->steps > 0) st = app_log_open(&rr.log, o->log, o->load ? start : -1);
    if (any_failed(me == 0 && o->log && o->steps > 0 && rr.log.fd < 0, m->name, sp_last_error())) {
        code = 1;
        goto out;
    }
    /* --steps 0 --save F: the loaded (or initial) state, as it is */
    if (o->steps == 0 && o->save &&
        any_failed(ckpt_save(o->save, g, sig, settings, start, &io) != SP_OK, m->name,
                   sp_last_error())) {
        code = 1;
        goto out;
    }
    if (me == 0) {
        char reps[128] = "";
        int k = 0;
        if (T > 1) k = snprintf(reps, sizeof reps, " of %d ranks (tensor parallelism)", T);
        if (R > 1)
            snprintf(reps + k, sizeof reps - (size_t)k, " x %d replicas (%s-major ranks%s)", R,
                     sp_rank_order_name(lay.order), o->shard_optimizer ? ", sharded AdamW" : "");
        printf("%s: %d actors%s, schedule %s, %d stages, %d microbatches, %s%s%s\n", m->name, P,
               reps, sch->name, sch->nstages, nmb,
               sp_exec_num_cuda() > 0 ? "CUDA" : "CPU", o->bf16 ? ", bf16 matmuls" : "",
               !o->check ? "" : tol > 0 ? (o->bf16 ? ", checked against the reference within 2e-2"
                                                   : ", checked against the reference within 1e-4")
                                        : ", checked against the reference");
        if (m->describe) m->describe(m->cfg, stdout);
        describe_lr(&rr.lr);
        if (o->steps > 0) set_peak(&rr, o, sp_exec_num_cuda() > 0, sp_exec_size(), 0, &cpu_peak);
        if (sp_exec_num_cuda() > 0) printf("transfers: %s\n", sp_trainer_notice(t));
        if (verbose >= 1) describe_plan(sp_trainer_plan(t), p);
        if (verbose >= 1 && R > 1) describe_layout(&lay);
        fflush(stdout);
    }
    if (verbose >= 1 && R > 1 && describe_memory(t, p, R, o->shard_optimizer)) {
        code = 1;
        goto out;
    }
    if (me == 0) {
        if (o->load) printf("resumed from %s after step %d\n", o->load, start);
        fflush(stdout);
    }
    double t_start = now(), busy_steps = 0;
    float first = 0, last = 0;
    /* each step's pipeline span over what its schedule allows with the same tasks */
    bound_ratio = calloc((size_t)o->steps + 1, sizeof *bound_ratio);
    int nratio = 0;
    if (any_failed(!bound_ratio, m->name, "out of memory")) {
        code = 1;
        goto out;
    }
    int ran = 0, stop = 0; /* stop: the signal of --save-on-signal that ended the run */
    for (int step = start + 1; step <= start + o->steps && !stop; step++, ran++) {
        fill_inputs(m, o, p, R * nmb, step, in);
        float lr = sp_lr_at(&rr.lr, step);
        sp_trainer_set_lr(t, lr);
        if (ref) app_ref_set_lr(ref, lr);
        sp_step_stats stats;
        if (sp_trainer_step(t, (const void *const *)in, &stats) != SP_OK) {
            /* lost on this rank only (watchdog, submission): its peers may be waiting for
             * it, so this rank ends them all with its own message */
            if (!sp_exec_usable())
                sp_exec_abort(1, "%s: error at step %d: %s", m->name, step, sp_last_error());
            if (me == 0) fprintf(stderr, "%s: error at step %d: %s\n", m->name, step, sp_last_error());
            code = 1;
            goto out;
        }
        if (step == start + 1) first = stats.loss;
        last = stats.loss;
        busy_steps += stats.step_s;
        if (stats.plan_span_s > 0) bound_ratio[nratio++] = stats.span_s / stats.plan_span_s;
        char where[256] = "";
        double mismatch = 0;
        float ref_loss = 0;
        if (ref) {
            if (app_ref_step(ref, (const void *const *)in, &ref_loss) != SP_OK) {
                snprintf(msg, sizeof msg, "reference: %s", sp_last_error());
                mismatch = 1;
            } else { /* this rank against its member of the reference */
                mismatch = sp_trainer_compare(t, app_ref_member(ref, trank), tol, where,
                                              sizeof where);
                if (tol > 0 ? !(fabs(ref_loss - stats.loss) <= tol * (1 + fabs(ref_loss)))
                            : memcmp(&ref_loss, &stats.loss, 4) != 0) {
                    snprintf(where, sizeof where, "loss %.9g vs reference %.9g", stats.loss,
                             ref_loss);
                    mismatch += 1;
                }
                snprintf(msg, sizeof msg, "step %d differs from the reference: %s", step, where);
            }
        }
        app_log_line x = { 0 };
        if (me == 0) {
            char line[256];
            report_step(&rr, m, step, stats.loss, lr, stats.step_s, stats.grad_norm, &stats,
                        stats.skipped, line, sizeof line, &x);
            printf("%s  bubble %.1f%% (plan %.1f%%)%s%s\n", line, 100 * stats.bubble,
                   100 * stats.plan_bubble,
                   ref && !mismatch ? (tol > 0 ? "  (~ reference)" : "  (= reference)") : "",
                   stats.skipped ? "  update skipped: non-finite loss or gradients" : "");
            fflush(stdout);
        }
        if (ref && any_failed(mismatch > 0, m->name, msg)) {
            code = 1;
            goto out;
        }
        /* the step's log line waits for its evaluation, whose loss it carries */
        x.has_eval_loss = eval_due(o, step, start + o->steps);
        if (x.has_eval_loss &&
            eval_pipelined(m, t, ref, tol, ev, K, step, &x.eval_loss)) {
            code = 1;
            goto out;
        }
        /* a --log write that failed (rank 0) stops every rank */
        st = me == 0 ? app_log_write(&rr.log, &x) : SP_OK;
        if (o->log && any_failed(st != SP_OK, m->name, sp_last_error())) {
            code = 1;
            goto out;
        }
        /* a signal may reach some ranks only, or at different steps: they agree (not
         * after the last step: the run is complete) */
        if (o->save_on_signal && step < start + o->steps &&
            (st = agree_stop(o, &stop)) != SP_OK) {
            sp_exec_abort(1, "%s: error at step %d: %s", m->name, step, sp_last_error());
        }
        st = SP_OK;
        if (o->dump_grads && step == start + 1)
            st = ckpt_dump_grads(o->dump_grads, g, sig, step, &io);
        if (st == SP_OK && save_due(o, step, start, stop))
            st = ckpt_save(o->save, g, sig, settings, step, &io);
        if (any_failed(st != SP_OK, m->name, sp_last_error())) {
            code = 1;
            goto out;
        }
        if (stop && me == 0) stopped_by(m, o, stop, step);
    }
    float eval_loss; /* --steps 0: the loaded state's, once (no step, no log line) */
    if (o->steps == 0 && o->eval_every &&
        eval_pipelined(m, t, ref, tol, ev, K, start, &eval_loss)) {
        code = 1;
        goto out;
    }
    if (trace_path && o->steps > 0) {
        char svg[4096];
        snprintf(svg, sizeof svg, "%s.svg", trace_path);
        st = sp_trainer_write_timeline(t, trace_path, svg);
        if (any_failed(st != SP_OK, m->name, sp_last_error())) {
            code = 1;
            goto out;
        }
    }
    if (me == 0) {
        char range[64], per[32] = "";
        if (ran) snprintf(per, sizeof per, " (%.1f ms per step)", 1e3 * busy_steps / ran);
        printf("done: %d steps in %.1f s%s%s%s\n", ran, now() - t_start, per,
               loss_range(range, sizeof range, ran, first, last),
               !ref ? "" : tol > 0 ? (o->bf16 ? ", every step within 2e-2 of the reference"
                                              : ", every step within 1e-4 of the reference")
                                   : ", every step bitwise equal to the reference");
        if (nratio > 0) {
            /* the first step allocates buffers: leave it out when there are others */
            int skip = nratio > 1;
            qsort(bound_ratio + skip, (size_t)(nratio - skip), sizeof *bound_ratio, cmp_double);
            printf("pipeline: %.2fx the schedule's bound (median step; the bound replays the "
                   "plan with the run's own task times and instant messages)\n",
                   bound_ratio[skip + (nratio - skip) / 2]);
        }
        if (trace_path && o->steps > 0)
            printf("trace of the last step: %s (open in https://ui.perfetto.dev), picture: %s.svg\n",
                   trace_path, trace_path);
        if (rr.log.fd >= 0) printf("log: %s (scripts/plot-log draws it)\n", o->log);
        fflush(stdout);
    }
    if (o->sample && any_failed(sample_text(m, o, g, &io, msg, sizeof msg), m->name, msg)) {
        code = 1;
        goto out;
    }
    if (verbose >= 1 && o->steps > 0) { /* measured against planned, per rank */
        app_device_memory_used(start + ran, dev_buffers);
        sp_train_memory mem = sp_trainer_memory(t);
        const sp_plan *pl = sp_trainer_plan(t);
        const sp_mem_peak *k = &pl->peak[actor]; /* every replica of an actor: the same plan */
        size_t packed = 0; /* the plan's pool as the runtime packs it */
        if (sp_plan_pool_bytes(pl, sp_program_stage_model(p), actor, &packed) != SP_OK)
            packed = 0;
        fprintf(stderr, "starpipe: rank %d: per-microbatch buffers %.2f MiB at their peak "
                "(plan %.2f MiB as whole buffers, %.2f MiB live at their peak: activations, "
                "boundary tensors and their gradients); copies of sends in flight %.2f "
                "MiB at their peak; persistent buffers %.2f MiB (of which AdamW moments "
                "%.2f MiB; host memory %.2f MiB)\n", me, mem.transient / 1048576.0,
                packed / 1048576.0, (double)k->transient / 1048576.0, mem.staging / 1048576.0,
                mem.persistent / 1048576.0, mem.optimizer / 1048576.0, mem.host / 1048576.0);
        sp_exec_transfers tr = sp_exec_transfer_counts();
        fprintf(stderr, "starpipe: rank %d: transfers over %s: %llu sends (%llu bytes), %llu "
                "receives (%llu bytes); %llu in eager pieces; %llu sends posted by their "
                "producing task; %llu sends and %llu receives in groups\n", me, tr.transport,
                tr.sends, tr.bytes_sent, tr.recvs, tr.bytes_received, tr.pieced, tr.by_producer,
                tr.group_sends, tr.group_recvs);
    }
out:
    app_log_close(&rr.log);
    free_inputs(ev, K, p);
    free(bound_ratio);
    for (int i = 0; in && i < R * nmb_or_zero(sch) * sp_program_num_inputs(p); i++) free(in[i]);
    free(in);
    app_ref_free(ref);
    sp_trainer_free(t);
    sp_program_free(p);
    sp_graph_free(g);
    sp_schedule_free(sch);
    /* a peer gone after the last step fails the shutdown's barrier (under a watchdog): a
     * run that had succeeded must not exit 0 and leave the job hanging */
    if (sp_exec_shutdown() != SP_OK && code == 0 && sp_exec_size() > 1)
        sp_exec_abort(1, "%s: %s", m->name, sp_last_error());
    return code;
}

/* A refusal before MPI starts (exit 2) is printed by rank 0 only; the other ranks wait a
 * moment before they exit, or the launcher, seeing one of them end first, could tear the
 * job down before rank 0's message is out (seen on loaded machines). */
static int refused(int code)
{
    if (code == 2 && sp_app_launcher_rank() != 0) usleep(1000 * 1000);
    return code;
}

/* A decay whose horizon comes before the warmup's end would never run (the rate would
 * fall from the peak to the floor in one step): refused, on rank 0's word, after a resume
 * has filled in the stored schedule. The horizon of a resume without a stored one counts
 * from the checkpoint's step, unknown here: that run is not checked. 1 when refused. */
static int warmup_past_horizon(const sp_app_model *m, const sp_app_opts *o)
{
    if (o->lr_decay == SP_LR_DECAY_NONE || o->warmup <= 0) return 0;
    if (!o->decay_steps && (o->load || o->steps == 0)) return 0;
    int horizon = horizon_of(o, 0);
    if (o->warmup <= horizon) return 0;
    if (sp_app_launcher_rank() == 0) {
        char what[64];
        if (o->decay_steps) snprintf(what, sizeof what, "--decay-steps");
        else snprintf(what, sizeof what, "the run's last step, --steps %d", o->steps);
        fprintf(stderr, "%s: error: --warmup %d ends after the decay's horizon, step %d (%s): "
                "the %s decay would never run; give a --warmup of at most %d or a later "
                "--decay-steps\n", m->name, o->warmup, horizon, what,
                sp_lr_decay_name(o->lr_decay), horizon);
    }
    return 1;
}

/* --total-steps N: the steps from the checkpoint being resumed (its starpipe.step; one
 * ckpt_load refuses counts as 0) to N, none when it is past N. */
static int steps_left(const sp_app_opts *o)
{
    char *step = o->load ? ckpt_read_meta(o->load, "starpipe.step") : NULL;
    int64_t done = 0;
    if (step && sp_parse_int(step, 0, 1 << 30, &done)) done = 0;
    free(step);
    return done < o->total_steps ? o->total_steps - (int)done : 0;
}

static int app_main(int argc, char **argv, sp_app_model *m);

int sp_app_main(int argc, char **argv, sp_app_model *m) { return refused(app_main(argc, argv, m)); }

static int app_main(int argc, char **argv, sp_app_model *m)
{
    sp_app_opts o;
    int r = sp_app_parse(argc, argv, m, &o);
    if (r <= 0) return r == 0 ? 0 : 2;
    /* before MPI starts every rank reads the same environment: rank 0 says, all exit 2 */
    if (read_env() != SP_OK) {
        if (sp_app_launcher_rank() == 0) fprintf(stderr, "%s: error: %s\n", m->name, sp_last_error());
        return 2;
    }
    const char *sched = o.schedule ? o.schedule : env.schedule;
    if (sched && !strcmp(sched, "help")) {
        if (sp_app_launcher_rank() == 0) fputs(sp_schedule_help(), stdout);
        return 0;
    }
    int bad = 0;
    char *resumed = o.load ? resume_settings(m, &o, &bad) : NULL;
    if (!bad && o.lr_min > o.lr) { /* after a resume: either may come from the checkpoint */
        if (sp_app_launcher_rank() == 0)
            fprintf(stderr, "%s: error: --lr-min %g is above --lr %g: the floor of the decay "
                    "must not exceed its peak\n", m->name, (double)o.lr_min, (double)o.lr);
        bad = 1;
    }
    if (!bad && o.total_steps) o.steps = steps_left(&o);
    if (!bad && warmup_past_horizon(m, &o)) bad = 1;
    if (bad) {
        free(resumed);
        return 2;
    }
    sp_adamw_config opt;
    sp_adamw_defaults(&opt);
    opt.lr = o.lr;
    opt.grad_clip = o.clip;
    opt.skip_nonfinite = o.skip_nonfinite;
    app_signals_arm(o.save_on_signal);
    r = o.reference ? run_reference(m, &o, &opt) : run_pipelined(argc, argv, m, &o, &opt);
    free(resumed);
    return r;
}
