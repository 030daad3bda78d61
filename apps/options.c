/* The apps' command line: the flags every app shares, and the model's own through its
 * sp_app_model. Strict: an unknown flag, a missing value or a number out of range is one
 * line on rank 0's stderr (every rank parses the same argv) and a refusal. */
#include "apps/options.h"

#include <stdlib.h>
#include <string.h>

#include "apps/outputs.h"
#include "apps/parse.h"
#include "base/files.h"
#include "starpipe/optim.h"
#include "starpipe/plan.h"
#include "starpipe/tokenizer.h"

/* The first of the launcher's variables that is set, as an int (def when none is, or
 * when it is not a number: these come from mpirun, not from the user). */
static int launcher_var(const char *const *vars, int def)
{
    for (; *vars; vars++) {
        int64_t v;
        if (getenv(*vars)) return sp_parse_int(getenv(*vars), 0, 1 << 24, &v) ? def : (int)v;
    }
    return def;
}

/* The rank as the launcher tells it, before MPI is up: only rank 0 prints. */
/* srun started this task (SLURM_STEP_ID; unset in a batch script itself, whose
 * SLURM_NTASKS is the allocation's, not a launch): Slurm's variables describe the launch
 * when Open MPI's do not (srun --mpi=pmix sets PMIX_RANK but no size). */
static int srun_task(void) { return getenv("SLURM_STEP_ID") || getenv("SLURM_STEPID"); }

/* A rank the launcher's size does not hold (a PMI_RANK=1 left over in a shell, a
 * SLURM_PROCID of another step) describes no launch of this process: it is rank 0, so
 * that a refusal before MPI starts is printed (only rank 0 prints). */
int sp_app_launcher_rank(void)
{
    static const char *const vars[] = { "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", NULL };
    static const char *const slurm[] = { "SLURM_PROCID", NULL };
    int rank = launcher_var(vars, srun_task() ? launcher_var(slurm, 0) : 0);
    return rank < sp_app_launcher_size() ? rank : 0;
}

int sp_app_launcher_size(void)
{
    static const char *const vars[] = { "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", NULL };
    static const char *const slurm[] = { "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", NULL };
    return launcher_var(vars, srun_task() ? launcher_var(slurm, 1) : 1);
}

int sp_app_slurm_tasks_on_node(const char *spec, int node)
{
    /* "2(x3),1": 2 tasks on each of nodes 0-2, 1 on node 3 (SLURM_STEP_TASKS_PER_NODE) */
    for (const char *p = spec; p && *p && node >= 0;) {
        char *end;
        long n = strtol(p, &end, 10), times = 1;
        if (end == p || n < 0) return -1;
        if (strncmp(end, "(x", 2) == 0) {
            const char *q = end + 2;
            times = strtol(q, &end, 10);
            if (end == q || *end != ')' || times < 1) return -1;
            end++;
        }
        if (node < times) return (int)n;
        node -= (int)times;
        if (*end != ',' && *end) return -1;
        p = *end ? end + 1 : end;
    }
    return -1;
}

int sp_app_launcher_local_size(void)
{
    static const char *const vars[] = { "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", NULL };
    static const char *const node[] = { "SLURM_NODEID", NULL };
    int def = sp_app_launcher_size();
    if (srun_task()) {
        int n = sp_app_slurm_tasks_on_node(getenv("SLURM_STEP_TASKS_PER_NODE"),
                                           launcher_var(node, 0));
        if (n > 0) def = n;
    }
    return launcher_var(vars, def);
}

int sp_app_launcher_local_rank(void)
{
    static const char *const vars[] = { "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", NULL };
    static const char *const slurm[] = { "SLURM_LOCALID", NULL };
    int def = sp_app_launcher_rank();
    int rank = launcher_var(vars, srun_task() ? launcher_var(slurm, def) : def);
    return rank < sp_app_launcher_local_size() ? rank : 0; /* as sp_app_launcher_rank */
}

static const char *const data_formats[] = { "auto", "text", "shard", "raw" };

const char *sp_app_data_format_name(int format)
{
    return format >= SP_APP_DATA_AUTO && format <= SP_APP_DATA_RAW ? data_formats[format] : "?";
}

/* Whether the model reads a --data file (its own flag, not a common one). */
static int reads_data(const sp_app_model *m);

static void usage(const sp_app_model *m, FILE *f)
{
    fprintf(f,
            "usage: [mpirun -np P] %s [options]\n%s%s"
            "training:\n"
            "  --steps N           optimizer steps (50)\n"
            "  --microbatches N    microbatches per step, m (STARPIPE_MICROBATCHES; 2 per\n"
            "                      actor: 4 on 2 ranks)\n"
            "  --lr X              AdamW learning rate, the peak of a schedule (1e-3)\n"
            "  --warmup N          linear warmup from 0 to --lr over steps 1..N (0)\n"
            "  --lr-decay K        after warmup: cosine, linear (to --lr-min at the horizon)\n"
            "                      or none (constant --lr; default)\n"
            "  --lr-min X          the floor the decay ends at (0)\n"
            "  --decay-steps N     the horizon: the step at which the decay reaches --lr-min\n"
            "                      (default: the run's last step; stored in checkpoints, so a\n"
            "                      resumed run keeps the horizon of the run it continues)\n"
            "  --total-steps N     end at step N instead of after --steps: a resumed run\n"
            "                      (--resume) runs what is left, so a requeued job can give\n"
            "                      the same flags every time\n"
            "  --clip X            clip the global gradient norm to X, 0 = off (1.0)\n"
            "  --seed N            initialisation and data seed (1337)\n"
            "  --skip-nonfinite    skip the update of a step whose loss or gradients are not\n"
            "                      finite (default: stop, naming the step and stage)\n"
            "checkpoints (safetensors):\n"
            "  --save FILE         write parameters, AdamW state and step at the end\n"
            "  --save-every N      also every N steps (needs --save)\n"
            "  --save-on-signal S  on signal S (USR1, USR2, TERM, INT, HUP; e.g. sbatch\n"
            "                      --signal=USR1@120) save --save at the next step boundary\n"
            "                      and exit 0; --resume continues the run bit for bit\n"
            "  --load FILE         start from a checkpoint (--resume FILE is the same);\n"
            "                      --steps more steps follow it, with the settings stored in\n"
            "                      FILE where no flag says otherwise (--steps 0: save it)\n"
            "  --init FILE         start from the parameter values of FILE, any safetensors\n"
            "                      file in the model's layout (Hugging Face's save_pretrained\n"
            "                      of the same config: the Llama), F32, BF16 or F16; a fresh\n"
            "                      optimizer from step 0\n"
            "  --dump-grads FILE   write the first step's gradients (before clipping)\n"
            "metrics:\n"
            "  --log FILE          one JSON line per step (loss, lr, throughput, MFU, bubble,\n"
            "                      step time, gradient norm), each line flushed to disk;\n"
            "                      scripts/plot-log draws it. A resumed run keeps the lines\n"
            "                      up to its checkpoint's step and appends\n"
            "  --peak-tflops X     the peak TFLOP/s of one device for MFU (default: one core's\n"
            "                      FMA peak measured at start-up on CPU, the datasheet figure\n"
            "                      of a known GPU)\n"
            "  --profile FILE      write what the steps after the first measured: task, op,\n"
            "                      message and update times, memory per rank (a cost model\n"
            "                      of this machine for --calibrate and starpipe-plan)\n"
            "  --calibrate FILE    predict this run's step time and memory per rank from\n"
            "                      FILE (another run's --profile), print it before step 1\n"
            "                      and its error against the measured median at the end\n"
            "  --link BW[,LAT]     --calibrate's messages over a link of BW bytes/s and LAT\n"
            "                      seconds each (else the wire's, from the profile's link\n"
            "                      probe): a network other than the profiled run's\n"
            "evaluation and sampling:\n"
            "  --eval-every N      the loss on held-out data every N steps and at the end,\n"
            "                      forward only through the pipeline (0: off; 0)\n"
            "  --eval-batches K    held-out microbatches per evaluation (replicas x m)\n"
            "  --sample N          after training, generate N tokens from the trained model\n"
            "  --prompt TEXT       what the sample continues (a newline; its bytes)\n"
            "  --tokenizer FILE    a tokenizer.json (scripts/make-shards --bpe writes one)\n"
            "                      that decodes the sample of a subword model; it starts\n"
            "                      at the tokenizer's <|endoftext|> (or <s>)\n"
            "  --temperature X     sampling temperature, 0 = greedy (1.0)\n"
            "  --top-k K           sample among the K most likely bytes only, 0 = all (0)\n"
            "  --sample-seed N     seed of the sample's draws (--seed)\n"
            "pipeline:\n"
            "  --schedule NAME     gpipe, 1f1b, eager-1f1b, interleaved-1f1b, zb-h1, zb-v,\n"
            "                      dualpipe-v, auto or file:PATH (STARPIPE_SCHEDULE;\n"
            "                      1f1b+split);\n"
            "                      'help' lists them. auto: synthesized for this run's task\n"
            "                      times (two probe steps first, or --calibrate's profile);\n"
            "                      NAME+split: a stage's backward that sends its input\n"
            "                      gradient runs as B then W, the gradient sent first\n"
            "  --memory-cap N      auto: at most N microbatches' activations per actor\n"
            "                      (1F1B's by default)\n"
            "  --chunks V          stages per actor for interleaved and V-shaped schedules\n"
            "                      (STARPIPE_CHUNKS; 2)\n"
            "  --actors P          expected number of actors per replica (with --reference:\n"
            "                      the actors whose run it stands for, 1 by default)\n"
            "  --replicas R        R copies of the pipeline on R x P ranks, each training on\n"
            "                      its own m microbatches; gradients summed over replicas in\n"
            "                      replica order (STARPIPE_REPLICAS; 1)\n"
            "  --tensor T          tensor parallelism: each actor a group of T ranks holding\n"
            "                      1/T of its stages' heads and MLP columns (STARPIPE_TENSOR; 1)\n"
            "  --rank-order O      pipeline: a pipeline's ranks consecutive (default, keeps\n"
            "                      its traffic in a node); replica: a stage's replicas\n"
            "                      consecutive (STARPIPE_RANK_ORDER)\n"
            "  --precision P       fp32 (default) or bf16: matrix products on bfloat16 operands\n"
            "                      with fp32 accumulation; weights, AdamW state in fp32\n"
            "  --recompute         activation recomputation: each stage keeps only its inputs\n"
            "                      between F and B and runs F again in B (same bits, less\n"
            "                      activation memory, one more forward)\n"
            "  --recompute-stages L  the same for the listed stages only, e.g. 0,1\n"
            "  --shard-optimizer   ZeRO-1: each replica keeps the AdamW state of 1/R of the\n"
            "                      parameters (same results, less memory)\n"
            "  --reference         run the single-process reference interpreter instead; with\n"
            "                      --actors P and --replicas R, the bytes of that run's\n"
            "                      R x m microbatches and sum order\n"
            "  --check             also run the reference; fail unless losses, gradients,\n"
            "                      parameters and AdamW state are bitwise identical\n"
            "  STARPIPE_TRACE=F    write F (Chrome trace JSON) and F.svg of the last step\n"
            "  STARPIPE_VERBOSE=N  1: the plan's predictions and each rank's cores; 2: also\n"
            "                      every instruction of the plan\n"
            "  STARPIPE_STEP_TIMEOUT=S  end the run on every rank when no task finishes for\n"
            "                      S seconds while some are pending (a lost message, a hang;\n"
            "                      0: off)\n"
            "  STARPIPE_FAULT=K@STEP[:STAGE]  fault injection for tests: nan@STEP (a NaN in\n"
            "                      the first float input), fail@STEP:STAGE, hang@STEP:STAGE\n"
            "  --help              this text\n",
            m->name, m->defaults,
            !reads_data(m) ? "" :
            "  --data-format F     how --data is read: auto (default) takes UTF-8 text as\n"
            "                      bytes and token shards with a valid header, and refuses\n"
            "                      anything else (a damaged shard, binary data) naming the\n"
            "                      file; text or shard insist on one; raw trains on the\n"
            "                      bytes of a file that is neither (stored in checkpoints)\n");
}

static const char *const common[] = { "--steps", "--microbatches", "--chunks", "--actors",
                                      "--seed", "--lr", "--clip", "--schedule", "--save",
                                      "--load", "--resume", "--dump-grads", "--save-every",
                                      "--replicas", "--rank-order", "--warmup", "--lr-min",
                                      "--lr-decay", "--decay-steps", "--log", "--peak-tflops",
                                      "--precision", "--recompute-stages", "--eval-every",
                                      "--eval-batches", "--sample",
                                      "--prompt", "--temperature", "--top-k", "--sample-seed",
                                      "--data-format", "--tensor", "--init",
                                      "--save-on-signal", "--total-steps", "--profile",
                                      "--calibrate", "--memory-cap", "--link", "--tokenizer",
                                      NULL };
enum { MODEL_BITS = 41 }; /* the model's flags' bits start here (a common flag's end before) */

/* The bit of a flag that takes a value in sp_app_opts.given: common flags first, then
 * the model's; -1 for none. */
static int flag_bit(const sp_app_model *m, const char *a)
{
    int i = 0;
    for (const char *const *f = common; *f; f++, i++)
        if (!strcmp(a, *f)) return i;
    i = MODEL_BITS;
    for (const char *const *f = m->flags; f && *f && i < 64; f++, i++)
        if (!strcmp(a, *f)) return i;
    return -1;
}

static int takes_value(const sp_app_model *m, const char *a) { return flag_bit(m, a) >= 0; }

static int reads_data(const sp_app_model *m) { return flag_bit(m, "--data") >= MODEL_BITS; }

int sp_app_given(const sp_app_model *m, const sp_app_opts *o, const char *flag)
{
    int b = flag_bit(m, flag);
    return b >= 0 && (o->given >> b & 1);
}

/* One flag that takes a value: 1 taken, 0 a bad value (message on stderr). */
static int apply(const sp_app_model *m, sp_app_opts *o, const char *a, const char *v)
{
    int ok = 1;
    if (!strcmp(a, "--steps")) ok = app_parse_int(a, v, 0, 1 << 30, &o->steps);
    else if (!strcmp(a, "--microbatches"))
        ok = app_parse_int(a, v, 1, SP_SCHEDULE_MAX_COUNT, &o->microbatches);
    else if (!strcmp(a, "--chunks")) ok = app_parse_int(a, v, 1, 64, &o->chunks);
    else if (!strcmp(a, "--actors")) ok = app_parse_int(a, v, 1, 1 << 16, &o->actors);
    else if (!strcmp(a, "--seed")) ok = app_parse_int(a, v, 0, INT_MAX, &o->seed);
    else if (!strcmp(a, "--lr")) ok = app_parse_float(a, v, 0.0, 10.0, &o->lr);
    else if (!strcmp(a, "--clip")) ok = app_parse_float(a, v, 0.0, 1e30, &o->clip);
    else if (!strcmp(a, "--schedule")) o->schedule = v;
    else if (!strcmp(a, "--save")) o->save = v;
    else if (!strcmp(a, "--load") || !strcmp(a, "--resume")) o->load = v;
    else if (!strcmp(a, "--init")) o->init = v;
    else if (!strcmp(a, "--dump-grads")) o->dump_grads = v;
    else if (!strcmp(a, "--save-every")) ok = app_parse_int(a, v, 1, 1 << 30, &o->save_every);
    else if (!strcmp(a, "--replicas")) ok = app_parse_int(a, v, 1, 1 << 16, &o->replicas);
    else if (!strcmp(a, "--tensor")) ok = app_parse_int(a, v, 1, SP_MAX_TENSOR, &o->tensor);
    else if (!strcmp(a, "--recompute-stages"))
        ok = app_parse_int_list(a, v, 0, 1023, o->recompute_stages, 1024, &o->nrecompute);
    else if (!strcmp(a, "--precision")) {
        ok = !strcmp(v, "fp32") || !strcmp(v, "bf16");
        if (ok) o->bf16 = !strcmp(v, "bf16");
        else fprintf(stderr, "error: --precision '%s': use fp32 or bf16\n", v);
    }
    else if (!strcmp(a, "--warmup")) ok = app_parse_int(a, v, 0, 1 << 30, &o->warmup);
    else if (!strcmp(a, "--lr-min")) ok = app_parse_float(a, v, 0.0, 10.0, &o->lr_min);
    else if (!strcmp(a, "--decay-steps")) ok = app_parse_int(a, v, 1, 1 << 30, &o->decay_steps);
    else if (!strcmp(a, "--peak-tflops")) {
        float x = 0;
        if ((ok = app_parse_float(a, v, 0.0, 1e9, &x)) && !(ok = x > 0))
            fprintf(stderr, "error: --peak-tflops expects a number above 0, got '%s'\n", v);
        if (ok) o->peak_tflops = x;
    }
    else if (!strcmp(a, "--log")) o->log = v;
    else if (!strcmp(a, "--profile")) o->profile = v;
    else if (!strcmp(a, "--calibrate")) o->calibrate = v;
    else if (!strcmp(a, "--link")) {
        char bw[64], *lat;
        snprintf(bw, sizeof bw, "%s", v);
        if ((lat = strchr(bw, ','))) *lat++ = 0;
        float b = 0, l = -1; /* no latency: the profile's */
        ok = strlen(v) < sizeof bw && app_parse_float(a, bw, 1.0, 1e15, &b) &&
             (!lat || app_parse_float(a, lat, 0.0, 10.0, &l));
        o->link_bw = b, o->link_lat = l;
    }
    else if (!strcmp(a, "--memory-cap")) ok = app_parse_int(a, v, 1, SP_SCHEDULE_MAX_COUNT, &o->memory_cap);
    else if (!strcmp(a, "--total-steps")) ok = app_parse_int(a, v, 0, 1 << 30, &o->total_steps);
    else if (!strcmp(a, "--save-on-signal")) {
        ok = (o->save_on_signal = app_signal_parse(v)) > 0;
        if (!ok) fprintf(stderr, "error: --save-on-signal '%s': use USR1, USR2, TERM, INT or HUP\n", v);
    }
    else if (!strcmp(a, "--lr-decay")) {
        int d = sp_lr_decay_parse(v);
        ok = d >= 0;
        if (ok) o->lr_decay = d;
        else fprintf(stderr, "error: --lr-decay '%s': use cosine, linear or none\n", v);
    }
    else if (!strcmp(a, "--eval-every")) ok = app_parse_int(a, v, 0, 1 << 30, &o->eval_every);
    else if (!strcmp(a, "--eval-batches")) ok = app_parse_int(a, v, 1, 65536, &o->eval_batches);
    else if (!strcmp(a, "--sample")) ok = app_parse_int(a, v, 0, 1 << 20, &o->sample);
    else if (!strcmp(a, "--temperature")) ok = app_parse_float(a, v, 0.0, 100.0, &o->temperature);
    else if (!strcmp(a, "--top-k")) ok = app_parse_int(a, v, 0, 1 << 20, &o->top_k);
    else if (!strcmp(a, "--sample-seed")) ok = app_parse_int(a, v, 0, INT_MAX, &o->sample_seed);
    else if (!strcmp(a, "--tokenizer")) ok = (o->tokenizer = v)[0] != 0;
    else if (!strcmp(a, "--prompt")) {
        ok = v[0] != 0;
        if (ok) o->prompt = v;
        else fprintf(stderr, "error: --prompt needs at least one byte\n");
    }
    else if (!strcmp(a, "--data-format")) {
        int d = SP_APP_DATA_RAW;
        while (d >= 0 && strcmp(v, data_formats[d])) d--;
        ok = d >= 0;
        if (ok) o->data_format = d;
        else fprintf(stderr, "error: --data-format '%s': use auto, text, shard or raw\n", v);
    }
    else if (!strcmp(a, "--rank-order")) {
        ok = !strcmp(v, "pipeline") || !strcmp(v, "replica");
        if (ok) o->rank_order = v;
        else fprintf(stderr, "error: --rank-order '%s': use pipeline or replica\n", v);
    }
    else ok = m->flag(m->cfg, a, v) > 0;
    return ok;
}

/* apply, with its message (app_parse_* print to stderr) caught and written to err, if
 * any, after the program's name like every other error. */
static int apply_named(const sp_app_model *m, sp_app_opts *o, const char *a, const char *v,
                       FILE *err)
{
    char *msg = NULL;
    size_t len = 0;
    FILE *mem = open_memstream(&msg, &len), *saved = stderr;
    if (!mem) return apply(m, o, a, v); /* out of memory: the message as it comes */
    stderr = mem;
    int ok = apply(m, o, a, v);
    stderr = saved;
    fclose(mem);
    if (len && err) fprintf(err, "%s: %s", m->name, msg);
    free(msg);
    return ok;
}

int sp_app_apply(const sp_app_model *m, sp_app_opts *o, const char *flag, const char *value)
{
    if (!takes_value(m, flag)) return -1;
    return apply_named(m, o, flag, value, sp_app_launcher_rank() == 0 ? stderr : NULL);
}

/* The evaluation and sampling flags against each other and the app, and --tokenizer read
 * (into o->tok): 1 fine, else -1 with one message. */
static int check_eval_sample(const sp_app_model *m, sp_app_opts *o, FILE *err)
{
    const char *alone = NULL, *needs = NULL;
    if (sp_app_given(m, o, "--eval-batches") && !o->eval_every)
        alone = "--eval-batches", needs = "--eval-every N";
    static const char *const sampling[] = { "--prompt", "--temperature", "--top-k",
                                            "--sample-seed", "--tokenizer" };
    for (int i = 0; i < 5 && !alone; i++)
        if (sp_app_given(m, o, sampling[i]) && !o->sample) alone = sampling[i], needs = "--sample N";
    if (alone) {
        fprintf(err, "%s: error: %s needs %s\n", m->name, alone, needs);
        return -1;
    }
    if (o->eval_every && !m->eval_batch) {
        fprintf(err, "%s: error: --eval-every: this model has no held-out data\n", m->name);
        return -1;
    }
    if (sp_app_given(m, o, "--data-format") && !reads_data(m)) {
        fprintf(err, "%s: error: --data-format: %s reads no data file\n", m->name, m->name);
        return -1;
    }
    if (o->sample && !m->build_sampler) {
        fprintf(err, "%s: error: --sample: this model does not generate text\n", m->name);
        return -1;
    }
    if (o->tokenizer) { /* every rank reads it: each stops here on a bad file */
        if (sp_tokenizer_load(o->tokenizer, &o->tok) != SP_OK) {
            fprintf(err, "%s: error: --tokenizer: %s\n", m->name, sp_last_error());
            return -1;
        }
        if (o->prompt) {
            fprintf(err, "%s: error: --prompt is bytes, and starpipe does not encode text "
                    "with a tokenizer: with --tokenizer the sample starts at its "
                    "<|endoftext|> (or <s>)\n", m->name);
            return -1;
        }
        if (sp_tokenizer_added(o->tok, "<|endoftext|>") < 0 && sp_tokenizer_added(o->tok, "<s>") < 0) {
            fprintf(err, "%s: error: --tokenizer %s has neither <|endoftext|> nor <s> among "
                    "its added tokens: nothing to start a sample from\n", m->name, o->tokenizer);
            return -1;
        }
    }
    if (o->init && o->load) {
        fprintf(err, "%s: error: --init and --load both set the parameters: one of them\n",
                m->name);
        return -1;
    }
    return 1;
}

/* 1 run, 0 exit 0 (help), -1 bad command line (message printed on rank 0). */
int sp_app_parse(int argc, char **argv, const sp_app_model *m, sp_app_opts *o)
{
    *o = (sp_app_opts){ .steps = 50, .seed = 1337, .lr = 1e-3f, .clip = 1.0f,
                        .temperature = 1.0f, .sample_seed = -1 };
    int quiet = sp_app_launcher_rank() != 0;
    FILE *err = quiet ? fopen("/dev/null", "w") : stderr;
    if (!err) err = stderr;
    FILE *saved = stderr;
    stderr = err; /* app_parse_* print to stderr */
    int rc = 1;
    for (int i = 1; i < argc && rc == 1; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int ok = 1, takes = 1;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            if (!quiet) usage(m, stdout);
            rc = 0;
            break;
        } else if (!strcmp(a, "--reference")) {
            o->reference = 1;
            takes = 0;
        } else if (!strcmp(a, "--check")) {
            o->check = 1;
            takes = 0;
        } else if (!strcmp(a, "--skip-nonfinite")) {
            o->skip_nonfinite = 1;
            takes = 0;
        } else if (!strcmp(a, "--shard-optimizer")) {
            o->shard_optimizer = 1;
            takes = 0;
        } else if (!strcmp(a, "--recompute")) {
            o->recompute = 1;
            takes = 0;
        } else if (!takes_value(m, a)) {
            fprintf(err, "%s: error: unknown option '%s' (see --help)\n", m->name, a);
            rc = -1;
            break;
        } else if (!v) {
            fprintf(err, "%s: error: %s needs a value (see --help)\n", m->name, a);
            rc = -1;
            break;
        } else {
            ok = apply_named(m, o, a, v, err);
            o->given |= 1ull << flag_bit(m, a);
        }
        if (!ok) rc = -1;
        i += takes;
    }
    if (rc == 1 && (o->save_every || o->save_on_signal) && !o->save) {
        fprintf(err, "%s: error: %s needs --save FILE\n", m->name,
                o->save_every ? "--save-every" : "--save-on-signal");
        rc = -1;
    }
    if (rc == 1 && sp_app_given(m, o, "--total-steps") && sp_app_given(m, o, "--steps")) {
        fprintf(err, "%s: error: --steps counts this run's steps, --total-steps the step the "
                "run ends at: give one of them\n", m->name);
        rc = -1;
    }
    if (rc == 1 && o->link_bw > 0 && !o->calibrate) {
        fprintf(err, "%s: error: --link prices the messages of --calibrate's prediction: give "
                "--calibrate FILE too\n", m->name);
        rc = -1;
    }
    if (rc == 1 && o->reference && (o->profile || o->calibrate)) {
        fprintf(err, "%s: error: %s times the pipelined run; --reference has no pipeline\n",
                m->name, o->profile ? "--profile" : "--calibrate");
        rc = -1;
    }
    if (rc == 1) rc = check_eval_sample(m, o, err);
    stderr = saved;
    if (err != saved) fclose(err);
    return rc;
}

