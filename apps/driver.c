/* The training driver behind starpipe-gpt and starpipe-mlp (see driver.h): the command
 * line, the environment and a resume's settings, then the run on one of the two engines
 * (engine.h), the reference interpreter or the pipelined trainer, which loop.c drives.
 * Errors: before MPI starts every rank parses the same argv, so only rank 0 prints and
 * every rank exits 2. After, a failure seen by some ranks is agreed on (one allreduce),
 * the lowest failing rank prints, and every rank shuts down and exits non-zero. */
#include "apps/driver.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "apps/checkpoint.h"
#include "apps/engine.h"
#include "apps/options.h"
#include "apps/outputs.h"
#include "apps/settings.h"
#include "base/env.h"
#include "base/files.h"
#include "starpipe/optim.h"
#include "starpipe/plan.h"

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

/* ---- --resume: the settings a checkpoint restores ---- */

/* The driver's flags that app_settings may store; with the model's settings_flags, all
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
    app_settings(m, o, m_given, o->decay_steps, cur, sizeof cur);
    /* which model the file holds: a run of another kind is refused before any of the
     * file's settings of that model are applied (they would be blamed on the user) */
    if (m->kind_flag) {
        char kind[64];
        app_setting_value(stored, m->kind_flag, kind, sizeof kind);
        if (!kind[0] && m->kind_unstored) { /* a file written before the kind was stored */
            snprintf(kind, sizeof kind, "%s", m->kind_unstored);
            if (!sp_app_given(m, o, m->kind_flag)) sp_app_apply(m, o, m->kind_flag, kind);
        }
        app_setting_value(cur, m->kind_flag, now, sizeof now);
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
        app_setting_value(cur, flag, now, sizeof now);
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
    int horizon = app_horizon(o, 0);
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
    app_engine *e = o.reference ? app_engine_reference(m, &o, &env, &opt, &r)
                                : app_engine_pipelined(argc, argv, m, &o, &env, &opt, &r);
    if (e) r = app_run(e);
    free(resumed);
    return r;
}
