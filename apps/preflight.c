/* Before the first step: whether the run fits (apps/preflight.h). The host's memory
 * before MPI starts (the parts of memory_parts against base/hostmem.c's limits), every
 * tensor within the kernels' int indices, and each GPU rank's device memory once the
 * executor runs (device_parts against the device's free memory). */
#include "apps/preflight.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "base/hostmem.h"
#include "starpipe/exec.h"
#include "starpipe/optim.h"
#include "starpipe/plan.h"
#include "starpipe/program.h"

static const char *fmt_bytes(double b, char *buf, size_t len)
{
    if (b >= 1024.0 * 1024 * 1024 * 1024) snprintf(buf, len, "%.1f TiB", b / (1024.0 * 1024 * 1024 * 1024));
    else if (b >= 1024.0 * 1024 * 1024) snprintf(buf, len, "%.2f GiB", b / (1024.0 * 1024 * 1024));
    else snprintf(buf, len, "%.1f MiB", b / (1024.0 * 1024));
    return buf;
}

/* Every tensor within what the kernels index (int element counts): a size a flag allows
 * must end in a message, never in an overflow. */
static int check_tensor_sizes(const sp_app_model *m, const sp_graph *g, char *msg, size_t len)
{
    for (sp_tensor t = 0; t < sp_graph_num_tensors(g); t++) {
        int64_t n = sp_tensor_numel(g, t);
        if (n <= INT32_MAX) continue;
        char shape[128];
        size_t k = (size_t)snprintf(shape, sizeof shape, "(");
        for (int d = 0; d < sp_tensor_ndim(g, t) && k < sizeof shape; d++)
            k += (size_t)snprintf(shape + k, sizeof shape - k, d ? ",%lld" : "%lld",
                                  (long long)sp_tensor_shape(g, t)[d]);
        if (k < sizeof shape) snprintf(shape + k, sizeof shape - k, ")");
        int param = sp_tensor_is_param(g, t);
        char what[160];
        if (param || sp_tensor_is_input(g, t))
            snprintf(what, sizeof what, "%s '%s'", param ? "parameter" : "input",
                     sp_tensor_name(g, t));
        else snprintf(what, sizeof what, "a tensor of stage %d", sp_tensor_stage(g, t));
        const char *flags = param ? m->param_flags : m->act_flags;
        snprintf(msg, len, "%s %s has %lld elements, over the limit of %d per tensor: lower %s",
                 what, shape, (long long)n, INT32_MAX, flags ? flags : "the model's sizes");
        return 1;
    }
    return 0;
}

/* What one actor holds at its peak, by part, in bytes. */
enum { PART_PARAMS, PART_ACTS, PART_BOUNDARY, PART_SCRATCH, PART_INPUTS, PART_TASKS, PART_REF,
       PART_REPLICAS, NPARTS };
static const char *const part_name[NPARTS] = {
    "parameters, gradients and AdamW moments", "saved activations", "boundary tensors",
    "task scratch space", "input batches", "bookkeeping of a step's tasks and transfers",
    "reference interpreter (--check)", "replicas' gradient exchange buffers" };
/* Where each part lives on a rank whose actor runs on a GPU: the device's memory, the
 * host's, or both (the inputs: the host fills them, the tasks read a device copy). On a
 * CPU rank everything is host memory. The host check before MPI (check_memory) counts
 * the parts with PART_ON_HOST on a rank that will run on a GPU (sp_exec_expect_cuda),
 * every part on a CPU rank; the device check (device_parts) those with PART_ON_DEVICE. */
enum { PART_ON_HOST = 1, PART_ON_DEVICE = 2 };
static const unsigned char part_where[NPARTS] = {
    [PART_PARAMS] = PART_ON_DEVICE, [PART_ACTS] = PART_ON_DEVICE,
    [PART_BOUNDARY] = PART_ON_DEVICE, [PART_SCRATCH] = PART_ON_DEVICE,
    [PART_INPUTS] = PART_ON_HOST | PART_ON_DEVICE, [PART_TASKS] = PART_ON_HOST,
    [PART_REF] = PART_ON_HOST, [PART_REPLICAS] = PART_ON_DEVICE };

/* The largest part of na actors' parts (part[a][k] with part_where[k] & where): *wa, *wk. */
static void largest_part(double (*part)[NPARTS], int na, unsigned where, int *wa, int *wk)
{
    *wa = 0, *wk = PART_PARAMS;
    for (int a = 0; a < na; a++)
        for (int k = 0; k < NPARTS; k++)
            if ((part_where[k] & where) && part[a][k] > part[*wa][*wk]) *wa = a, *wk = k;
}

/* What lowers part k, in the flags' words: the host's memory (device 0) or a GPU's
 * (device 1, where more stages and ZeRO-1 are the first levers). */
static const char *part_remedy(const sp_app_model *m, const sp_app_opts *o, int k, int device,
                               char *buf, size_t len)
{
    const char *params = m->param_flags ? m->param_flags : "the model's sizes";
    const char *acts = m->act_flags ? m->act_flags : "the model's sizes";
    if (!device)
        return k == PART_PARAMS ? params
             : k == PART_INPUTS ? "--microbatches or --batch"
             : k == PART_TASKS ? "--microbatches"
             : k == PART_REF ? "the model's sizes, or leave out --check"
             : acts;
    if (k == PART_PARAMS)
        snprintf(buf, len, "more stages (--actors), %s, or a smaller %s",
                 o->shard_optimizer ? "more replicas (--replicas, the AdamW shards shrink)"
                                    : "--shard-optimizer (with --replicas)", params);
    else if (k == PART_ACTS)
        snprintf(buf, len, "more stages (--actors)%s, or a smaller %s",
                 o->recompute ? "" : ", --recompute", acts);
    else if (k == PART_REPLICAS)
        snprintf(buf, len, "more stages (--actors), or a smaller %s", params);
    else if (k == PART_INPUTS)
        snprintf(buf, len, "--microbatches or --batch");
    else
        snprintf(buf, len, "%s", acts);
    return buf;
}
/* What the runtime keeps per instruction of a step (its StarPU task, handles, plan
 * entry), measured: about 3.5 kB. */
#define BYTES_PER_INSTR 4096.0

/* The parts of each actor (na of them) three ways: kind 0 an upper bound (every
 * microbatch in flight), 1 a lower bound (one), 2 exact, from the plan pl. */
static void memory_parts(double (*part)[NPARTS], int na, int kind, const sp_plan *pl,
                         const sp_program *p, const sp_schedule *sch, const double *rpart,
                         double ref, double inputs, int reference, int check)
{
    const sp_stage_model *model = sp_program_stage_model(p);
    int S = sp_program_num_stages(p), nm = sch->nmicro;
    double inflight = kind == 0 ? nm : 1;
#define BB(cls, i) ((double)sp_program_buf_bytes(p, cls, i))
    memset(part, 0, (size_t)na * sizeof *part);
    for (int a = 0; a < na; a++) {
        double *q = part[a];
        if (reference) {
            memcpy(q, rpart, NPARTS * sizeof *q);
        } else if (kind < 2) {
            int mine = 0;
            for (int s = 0; s < S; s++) {
                if (sch->stage_actor[s] != a) continue;
                mine++;
                q[PART_PARAMS] += 3 * BB(SP_BUF_PARAMS, s) + BB(SP_BUF_GRADS, s);
                q[PART_ACTS] += inflight * (BB(SP_BUF_ACT, s) + BB(SP_BUF_BGRAD, s));
                if (BB(SP_BUF_SCRATCH, s) > q[PART_SCRATCH]) q[PART_SCRATCH] = BB(SP_BUF_SCRATCH, s);
            }
            for (int e = 0; kind == 0 && e < model->nedges; e++)
                if (sch->stage_actor[model->edge[e].src_stage] == a ||
                    sch->stage_actor[model->edge[e].dst_stage] == a)
                    q[PART_BOUNDARY] += nm * (BB(SP_BUF_EDGE_FWD, e) + BB(SP_BUF_EDGE_GRAD, e));
            /* per microbatch and stage: at least F and BW; at most four tasks, a few
             * transfers and frees */
            q[PART_TASKS] = BYTES_PER_INSTR * nm * mine * (kind == 0 ? 16 : 2);
        } else {
            const sp_mem_peak *pk = &pl->peak[a];
            q[PART_PARAMS] = (double)pk->params + (double)pk->grads + (double)pk->opt;
            q[PART_ACTS] = (double)pk->acts;
            q[PART_BOUNDARY] = (double)pk->boundary;
            /* the peak of the sum, spread over the parts by their own peaks */
            double sum = q[PART_PARAMS] + q[PART_ACTS] + q[PART_BOUNDARY];
            if (sum > 0)
                for (int k = PART_PARAMS; k <= PART_BOUNDARY; k++) q[k] *= (double)pk->total / sum;
            for (int s = 0; s < S; s++) /* one worker: one task's scratch at a time */
                if (sch->stage_actor[s] == a && BB(SP_BUF_SCRATCH, s) > q[PART_SCRATCH])
                    q[PART_SCRATCH] = BB(SP_BUF_SCRATCH, s);
            q[PART_TASKS] = BYTES_PER_INSTR * pl->ninstr[a];
        }
        if (!reference) q[PART_REF] = check ? ref : 0;
        q[PART_INPUTS] = (reference ? 1 : 2) * nm * inputs; /* the driver's, the trainer's */
    }
#undef BB
}

/* The bytes the ranks on this machine need: all actors, or as many of the largest as the
 * launcher puts here. *worst: the largest actor's. */
static double machine_total(double (*part)[NPARTS], int na, unsigned where, double *worst)
{
    double total = 0;
    *worst = 0;
    for (int a = 0; a < na; a++) {
        double t = 0;
        for (int k = 0; k < NPARTS; k++) t += part_where[k] & where ? part[a][k] : 0;
        total += t;
        if (t > *worst) *worst = t;
    }
    int local = sp_app_launcher_local_size();
    return local < na ? *worst * local : total;
}

/* The memory the run will hold, from the program and the plan (pure C, before StarPU),
 * against what this machine has: 1 and a message naming the largest part, the bytes
 * and the flag to lower when it cannot fit. */
static int check_memory(const sp_app_model *m, const sp_app_opts *o, const sp_schedule *sch,
                        const sp_program *p, int P, int R, int reference, char *msg, size_t len)
{
    char avail_why[PATH_MAX + 128];
    double avail = sp_mem_available(avail_why, sizeof avail_why);
    double mappable = sp_mem_process_left(); /* per process: ulimit -v */
    if (avail <= 0 && mappable < 0) return 0;
    if (avail <= 0) avail = 1e300;
    /* a rank on a GPU keeps only its host parts here (the device's are device_parts') */
    const unsigned where =
        !reference && sp_exec_expect_cuda(sp_app_launcher_local_rank(),
                                          sp_app_launcher_local_size())
            ? PART_ON_HOST : PART_ON_HOST | PART_ON_DEVICE;
    const sp_stage_model *model = sp_program_stage_model(p);
    int S = sp_program_num_stages(p);
#define BB(cls, i) ((double)sp_program_buf_bytes(p, cls, i))
    double inputs = 0, rpart[NPARTS] = { 0 }, ref = 0;
    for (int k = 0; k < sp_program_num_inputs(p); k++) inputs += BB(SP_BUF_INPUT, k);
    /* the reference holds every stage, one microbatch at a time */
    for (int s = 0; s < S; s++) {
        rpart[PART_PARAMS] += 3 * BB(SP_BUF_PARAMS, s) + BB(SP_BUF_GRADS, s);
        rpart[PART_ACTS] += BB(SP_BUF_ACT, s) + BB(SP_BUF_BGRAD, s);
        rpart[PART_SCRATCH] += BB(SP_BUF_SCRATCH, s);
    }
    for (int e = 0; e < model->nedges; e++)
        rpart[PART_BOUNDARY] += BB(SP_BUF_EDGE_FWD, e) + BB(SP_BUF_EDGE_GRAD, e);
#undef BB
    for (int k = 0; k < NPARTS; k++) ref += rpart[k];
    int na = reference ? 1 : P;
    double (*part)[NPARTS] = calloc((size_t)na, sizeof *part);
    if (!part) return 0;
    sp_plan *pl = NULL;
    double worst, total;
    const char *atleast = "";
    /* in doubles, without a plan first: everything in flight fits, or one microbatch
     * does not; the plan (whose byte counts are size_t) only in between */
    memory_parts(part, na, 0, NULL, p, sch, rpart, ref, inputs, reference, o->check);
    total = R * machine_total(part, na, where, &worst); /* R replicas */
    if ((total > avail || (mappable >= 0 && worst > mappable)) && !reference) {
        memory_parts(part, na, 1, NULL, p, sch, rpart, ref, inputs, reference, o->check);
        total = R * machine_total(part, na, where, &worst);
        atleast = "at least ";
        if (total <= avail && !(mappable >= 0 && worst > mappable)) {
            if (sp_plan_build(model, sch, &pl) != SP_OK) { /* reported when the run plans */
                free(part);
                return 0;
            }
            memory_parts(part, na, 2, pl, p, sch, rpart, ref, inputs, reference, o->check);
            total = R * machine_total(part, na, where, &worst);
            atleast = "";
        }
    }
    /* the machine's memory (and the job's cgroup) holds every rank here; a process's
     * address space (RLIMIT_AS) its own actor's */
    int bad = total > avail || (mappable >= 0 && worst > mappable);
    if (bad) {
        int wa, wk;
        largest_part(part, na, where, &wa, &wk);
        char b1[32], b2[32], b3[32], who[32] = "", lower[256], need[PATH_MAX + 512];
        if (!reference) snprintf(who, sizeof who, " of actor %d", wa);
        if (total > avail)
            snprintf(need, sizeof need, "%s%s of memory on this machine but %s is available (%.600s)",
                     atleast, fmt_bytes(total, b1, sizeof b1), fmt_bytes(avail, b2, sizeof b2),
                     avail_why);
        else
            snprintf(need, sizeof need, "%s%s of memory in one process but it may map only %s "
                     "more (RLIMIT_AS: ulimit -v)", atleast, fmt_bytes(worst, b1, sizeof b1),
                     fmt_bytes(mappable, b2, sizeof b2));
        snprintf(msg, len, "this run needs %.700s; the largest part is the %s%s, %s: lower %s",
                 need, part_name[wk], who, fmt_bytes(part[wa][wk], b3, sizeof b3),
                 part_remedy(m, o, wk, 0, lower, sizeof lower));
    }
    sp_plan_free(pl);
    free(part);
    return bad;
}

/* Before any work (before MPI and StarPU start): every tensor within the kernels'
 * limits, and the memory the run will hold within what this machine has. 1 with a
 * message when the run cannot fit; 0 when it fits, or when something else is wrong (a
 * schedule, a data file, a cut), which the run reports the usual way. */
int app_preflight(sp_app_model *m, const sp_app_opts *o, int P, int R, int T, int reference,
                  char *msg, size_t len)
{
    sp_schedule *sch = NULL;
    sp_graph *g = NULL;
    sp_program *p = NULL;
    sp_status st;
    double samples;
    char pmsg[512];
    int bad = 0;
    if (sp_schedule_from_env(o->schedule, P, o->microbatches, o->chunks, &sch) == SP_OK &&
        !m->prepare(m->cfg, &samples, pmsg, sizeof pmsg) &&
        (g = m->build(m->cfg, sch->nstages, T, 0, &st)) && !(bad = check_tensor_sizes(m, g, msg, len)) &&
        (p = sp_program_build(g, &st))) /* a member of each actor's group: T of them */
        bad = check_memory(m, o, sch, p, P, (reference ? 1 : R) * T, reference, msg, len);
    sp_program_free(p);
    sp_graph_free(g);
    sp_schedule_free(sch);
    return bad;
}


/* ---- device memory, before step 1 ---- */

/* What a GPU rank's device gives beside the buffers the plan accounts for (none of it is
 * in use when the check reads the free memory, and StarPU's own 10% is out of the free
 * figure already, sp_exec_device_memory), from the libraries' sources and defaults:
 * - StarPU 1.3.10 suballocates every device buffer of 4 MiB or less from chunks of
 *   32 MiB, in blocks of 16 KiB (src/datawizard/malloc.c, CHUNK_SIZE): the small
 *   buffers take up to one chunk more than their bytes (measured on the fake device:
 *   exactly one chunk beside the large buffers).
 * - cuBLAS 12 and later allocates a workspace from the device at a handle's first
 *   product, 32 MiB on Hopper and Blackwell (4 MiB on older GPUs), one handle per CUDA
 *   worker (starpu_cublas_init); the modules of our kernels and cuBLAS's load on first
 *   launch (a few MiB); bf16 products convert their operands into stream-ordered scratch
 *   (cudaMallocAsync) freed after each product, which CUDA's pool may keep: 64 MiB.
 * - NCCL, when it carries messages (every rank on a GPU of its own), allocates per peer
 *   it connects to buffers of NCCL_BUFFSIZE (4 MiB) per protocol (Simple, LL128 about
 *   4.5 MiB, LL 0.25 MiB), per channel (2 per peer by default) and per direction: about
 *   36 MiB, counted as 40 MiB per peer. */
#define STARPU_CHUNK_RESERVE (32.0 * 1048576)
#define DEVICE_LIBS_RESERVE (64.0 * 1048576)
#define NCCL_PEER_RESERVE (40.0 * 1048576)

/* What actor a of replica c keeps in its GPU's memory at its peak, by part, from the
 * plan pl (and the evaluation's plan epl, if any): the parts of check_memory with
 * part_where & PART_ON_DEVICE, here exact rather than bounds. Parameters, gradients
 * (accumulators of shared parameters included: the plan's own peaks) and the AdamW
 * moments (of the replica's shard only under ZeRO-1), the norm's per-parameter terms;
 * the per-microbatch pool as the runtime packs it (sp_plan_pool_bytes), shared by the
 * step and the evaluation, spread over activations and boundary tensors by their own
 * peaks; each owned stage's scratch (StarPU keeps a scratch buffer per handle); the
 * inputs' device copies of every microbatch slot; the replicas' exchange buffers (a
 * stage's shards for the others, and R shards of its own). */
static void device_parts(double q[NPARTS], const sp_program *p, const sp_plan *pl,
                         const sp_plan *epl, int a, int c, int R, int sharded, int mcap)
{
    const sp_stage_model *model = sp_program_stage_model(p);
    const sp_mem_peak *pk = &pl->peak[a];
    int S = sp_program_num_stages(p);
    int64_t cut[R + 1];
#define BB(cls, i) ((double)sp_program_buf_bytes(p, cls, i))
    memset(q, 0, NPARTS * sizeof *q);
    q[PART_PARAMS] = (double)pk->params + (double)pk->grads;
    for (int s = 0; s < S; s++) {
        if (pl->stage_actor[s] != a) continue;
        double floats = BB(SP_BUF_PARAMS, s) / 4, shard = floats;
        if (R > 1) {
            sp_optim_shards(p, s, R, cut);
            shard = (double)(cut[c + 1] - cut[c]);
            q[PART_REPLICAS] += 4 * (floats + (R - 1) * shard);
        }
        q[PART_PARAMS] += 2 * 4 * (sharded ? shard : floats)
                        + 8.0 * sp_graph_num_params(sp_program_graph(p));
        q[PART_SCRATCH] += BB(SP_BUF_SCRATCH, s);
    }
    size_t pool = 0, epool = 0;
    if (sp_plan_pool_bytes(pl, model, a, &pool) != SP_OK) pool = pk->transient;
    if (epl && sp_plan_pool_bytes(epl, model, a, &epool) == SP_OK && epool > pool) pool = epool;
    double live = (double)pk->acts + (double)pk->boundary;
    if (live > 0) {
        q[PART_ACTS] = (double)pool * (double)pk->acts / live;
        q[PART_BOUNDARY] = (double)pool * (double)pk->boundary / live;
    } else {
        q[PART_ACTS] = (double)pool;
    }
    for (int k = 0; k < sp_program_num_inputs(p); k++)
        q[PART_INPUTS] += mcap * BB(SP_BUF_INPUT, k);
#undef BB
}

/* The ranks' GPUs, gathered: which share one, and whether NCCL can run (every rank with
 * one CUDA worker on a GPU of its own, as sp_exec_groups_init asks). */
typedef struct {
    int ncuda, gpu; /* gpu: 0 without one */
    uint64_t host;
    int64_t bus;
} gpu_key;

static int same_gpu(const gpu_key *x, const gpu_key *y)
{
    return x->gpu && y->gpu && x->host == y->host && x->bus == y->bus;
}

static sp_status gpu_sharing(const sp_exec_devmem *dm, int *sharing, int *nccl)
{
    int P = sp_exec_size();
    gpu_key mine;
    memset(&mine, 0, sizeof mine); /* padding too: the bytes travel */
    mine.ncuda = sp_exec_num_cuda(), mine.gpu = dm->device >= 0;
    mine.host = dm->host, mine.bus = dm->bus;
    gpu_key *all = calloc((size_t)P, sizeof *all);
    if (!all) return sp_set_error(SP_ERR_NOMEM, "out of memory");
    sp_status st = sp_exec_gather(&mine, sizeof mine, all, 0);
    if (st == SP_OK) st = sp_exec_bcast(all, (size_t)P * sizeof *all, 0);
    *sharing = 0, *nccl = 1;
    for (int r = 0; st == SP_OK && r < P; r++) {
        if (all[r].ncuda != 1) *nccl = 0;
        for (int q = r + 1; q < P; q++)
            if (same_gpu(&all[r], &all[q])) *nccl = 0;
        if (same_gpu(&all[r], &mine)) ++*sharing;
    }
    free(all);
    return st;
}

/* The distinct ranks actor a exchanges messages with (its NCCL peers when NCCL runs). */
static int plan_peers(const sp_plan *pl, int a, int R)
{
    int n = 0;
    for (int b = 0; b < pl->nactors; b++) {
        int talks = 0;
        for (int i = 0; b != a && i < pl->ninstr[a] && !talks; i++)
            talks = (pl->instr[a][i].op == SP_OP_SEND || pl->instr[a][i].op == SP_OP_RECV) &&
                    pl->instr[a][i].peer == b;
        n += talks;
    }
    return n + R - 1; /* and the same actor of the other replicas */
}

/* Before anything of the run is placed on the devices (before the trainer): on every
 * rank whose actor runs on a GPU, its buffers at their peak (device_parts) and what
 * cuBLAS and NCCL take beside them, against the device's free memory (shared by the
 * ranks on one GPU). Collective: 1 on every rank when one rank is short, the lowest of
 * them printing the one line. *buffers: this rank's estimate (0 without a GPU). */
int app_device_memory_short(const sp_app_model *m, const sp_app_opts *o, const sp_program *p,
                            const sp_schedule *sch, const sp_layout *lay, int K, int verbose,
                            double *buffers, char *msg, size_t len)
{
    int me = sp_exec_rank(), bad = 0, sharing = 0, nccl = 0;
    msg[0] = 0;
    sp_exec_devmem dm;
    *buffers = 0;
    sp_status st = sp_exec_device_memory(&dm);
    if (st != SP_OK) dm.device = -1;
    /* collective from here on: every rank takes part, with a GPU or not */
    if (gpu_sharing(&dm, &sharing, &nccl) != SP_OK) sp_exec_abort(1, "%s", sp_last_error());
    sp_plan *pl = NULL, *epl = NULL;
    sp_schedule *fs = NULL;
    int R = lay->replicas, rep = 0, a = 0;
    sp_layout_place(lay, me, &rep, &a);
    if (st != SP_OK) {
        snprintf(msg, len, "%s", sp_last_error());
        bad = 1;
    } else if (dm.device >= 0 && p &&
               sp_plan_build(sp_program_stage_model(p), sch, &pl) == SP_OK) {
        /* the evaluation's plan, as the trainer builds it (a bad K is its to report) */
        if (K > 0 && K % R == 0 && sp_schedule_forward(sch, K / R, &fs) == SP_OK &&
            sp_plan_build(sp_program_stage_model(p), fs, &epl) != SP_OK)
            epl = NULL;
        int mcap = K / R > sch->nmicro ? K / R : sch->nmicro;
        double q[NPARTS], need = 0;
        device_parts(q, p, pl, epl, a, rep, R, o->shard_optimizer, mcap);
        for (int k = 0; k < NPARTS; k++) need += q[k];
        *buffers = need;
        int64_t most = 0; /* the tensor group's room (runtime/group.c), made with the group */
        for (int s = 0; lay->tensor > 1 && s < sp_program_num_stages(p); s++)
            if (sp_program_group_floats(p, s) > most) most = sp_program_group_floats(p, s);
        double reserve = STARPU_CHUNK_RESERVE + DEVICE_LIBS_RESERVE +
                         (nccl ? NCCL_PEER_RESERVE * plan_peers(pl, a, R) : 0) +
                         (double)sp_exec_tensor_group_room_bytes(lay->tensor, most);
        double free_b = (double)dm.free / (sharing > 1 ? sharing : 1);
        need += reserve;
        if (verbose >= 1)
            fprintf(stderr, "starpipe: rank %d: device memory: actor %d needs %.0f bytes "
                    "(buffers %.0f bytes, reserve %.0f bytes for StarPU, cuBLAS and NCCL%s) of "
                    "%.0f bytes free on device %d (cudaMemGetInfo %zu of %zu bytes, StarPU's "
                    "cap %zu, %d rank%s)\n",
                    me, a, need, *buffers, reserve, most ? ", the tensor group's room" : "",
                    free_b, dm.device, dm.cuda_free, dm.total,
                    dm.starpu_cap, sharing, sharing > 1 ? "s on it" : "");
        if (need > free_b) {
            double (*one)[NPARTS] = &q;
            int wa, wk;
            largest_part(one, 1, PART_ON_DEVICE, &wa, &wk);
            char b1[32], b2[32], b3[32], b4[32], b5[32], shared[96] = "", lower[256];
            if (sharing > 1)
                snprintf(shared, sizeof shared, " (its share of %s for %d ranks on that GPU)",
                         fmt_bytes((double)dm.free, b5, sizeof b5), sharing);
            snprintf(msg, len, "actor %d needs %s of GPU memory (%s of buffers, %s for "
                     "StarPU, cuBLAS and NCCL%s) but device %d has %s free%s; the largest part "
                     "is the %s, %s: lower it with %s", a, fmt_bytes(need, b1, sizeof b1),
                     fmt_bytes(*buffers, b2, sizeof b2), fmt_bytes(reserve, b3, sizeof b3),
                     most ? ", the tensor group's room" : "",
                     dm.device, fmt_bytes(free_b, b4, sizeof b4), shared, part_name[wk],
                     fmt_bytes(q[wk], b5, sizeof b5),
                     part_remedy(m, o, wk, 1, lower, sizeof lower));
            bad = 1;
        }
    }
    sp_plan_free(epl);
    sp_plan_free(pl);
    sp_schedule_free(fs);
    return bad;
}

/* After the run (STARPIPE_VERBOSE=1): what the device holds now (StarPU keeps every
 * buffer it placed there until the trainer ends), against the estimate before step 1. */
void app_device_memory_used(int step, double buffers)
{
    sp_exec_devmem dm;
    if (sp_exec_device_memory(&dm) != SP_OK || dm.device < 0) return;
    fprintf(stderr, "starpipe: rank %d: device memory: %zu bytes in use on device %d after step "
            "%d (buffers estimated at %.0f bytes before step 1)\n", sp_exec_rank(),
            dm.total - dm.cuda_free, dm.device, step, buffers);
}

/* --save-on-signal's signal when any rank received it, agreed on by all; else 0. */
