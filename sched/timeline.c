/* Pictures of a simulated step: a Chrome trace-event JSON (Perfetto) and an SVG timeline
 * in the style of pipeline papers (a row per actor, a box per task, coloured by kind,
 * lighter for later chunks, labelled with the microbatch). */
#include "sched/sched_impl.h"

#include <math.h>
#include <string.h>

#include "base/files.h"

/* Pictures are written to a temporary beside PATH and renamed over it when complete
 * (base/files.h): a crash or a full disk never leaves a half-written file under the
 * name the user asked for, and a device, a FIFO or a directory at PATH is refused. */

/* Every time a picture prints is finite (JSON has no nan or inf): checked before a byte
 * is written, so a bad result gives an error and no file. */
static sp_status check_finite(const sp_plan *plan, const sp_sim_result *r, const char *path)
{
    if (!isfinite(r->step_time) || !isfinite(r->bubble_fraction))
        return sp_set_error(SP_ERR_ARG, "'%s' not written: the step time or bubble is not "
                            "finite (%g, %g)", path, r->step_time, r->bubble_fraction);
    for (int a = 0; a < plan->nactors; a++)
        for (int j = 0; j < plan->ninstr[a]; j++) {
            double s = r->start[a][j] * 1e6, e = r->end[a][j] * 1e6;
            if (!isfinite(s) || !isfinite(e) || !isfinite(e - s))
                return sp_set_error(SP_ERR_ARG, "'%s' not written: instruction %d of actor %d "
                                    "has a non-finite time (start %g, end %g)", path, j, a,
                                    r->start[a][j], r->end[a][j]);
        }
    return SP_OK;
}

sp_status sp_sim_write_trace(const sp_plan *plan, const sp_sim_result *r, const char *path)
{
    sp_output out;
    sp_status st = check_finite(plan, r, path);
    if (st || (st = sp_output_open(&out, path, "trace"))) return st;
    FILE *f = out.f;
    fprintf(f, "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n");
    int first = 1;
    for (int a = 0; a < plan->nactors; a++) {
        fprintf(f, "%s{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":0,\"tid\":%d,"
                "\"args\":{\"name\":\"actor %d\"}}", first ? "" : ",\n", a, a);
        first = 0;
        for (int j = 0; j < plan->ninstr[a]; j++) {
            const sp_instr *in = &plan->instr[a][j];
            double ts = r->start[a][j] * 1e6, dur = (r->end[a][j] - r->start[a][j]) * 1e6;
            char name[96], bs[64];
            const char *cat;
            if (in->op == SP_OP_RUN) {
                snprintf(name, sizeof name, "%s mb%d s%d", sp_task_kind_name(in->task.kind),
                         in->task.mb, in->task.stage);
                cat = sp_task_kind_name(in->task.kind);
            } else if (in->op == SP_OP_COMBINE || in->op == SP_OP_OPTIMIZER) {
                sp_instr_format(in, name, sizeof name);
                cat = sp_op_name(in->op);
            } else if (r->async_transfers && (in->op == SP_OP_SEND || in->op == SP_OP_RECV)) {
                continue; /* on the actor's transfer row, below */
            } else if (in->op == SP_OP_RECV && dur > 0) { /* time spent waiting */
                snprintf(name, sizeof name, "wait %s", sp_buf_format(in->buf, bs, sizeof bs));
                cat = "wait";
            } else {
                continue;
            }
            fprintf(f, ",\n{\"name\":\"%s\",\"cat\":\"%s\",\"ph\":\"X\",\"pid\":0,\"tid\":%d,"
                    "\"ts\":%.3f,\"dur\":%.3f", name, cat, a, ts, dur);
            if (in->op == SP_OP_RUN)
                fprintf(f, ",\"args\":{\"mb\":%d,\"stage\":%d}", in->task.mb, in->task.stage);
            fputc('}', f);
        }
    }
    /* measured transfers overlap the tasks: one extra row per actor */
    for (int a = 0; r->async_transfers && a < plan->nactors; a++) {
        fprintf(f, ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":0,\"tid\":%d,"
                "\"args\":{\"name\":\"actor %d transfers\"}}", plan->nactors + a, a);
        for (int j = 0; j < plan->ninstr[a]; j++) {
            const sp_instr *in = &plan->instr[a][j];
            if ((in->op != SP_OP_SEND && in->op != SP_OP_RECV) || r->end[a][j] <= r->start[a][j])
                continue;
            char bs[64];
            fprintf(f, ",\n{\"name\":\"%s %s %s %d\",\"cat\":\"%s\",\"ph\":\"X\",\"pid\":0,"
                    "\"tid\":%d,\"ts\":%.3f,\"dur\":%.3f,\"args\":{\"seq\":%lld,\"bytes\":%zu}}",
                    in->op == SP_OP_SEND ? "send" : "recv", sp_buf_format(in->buf, bs, sizeof bs),
                    in->op == SP_OP_SEND ? "to" : "from", in->peer, sp_op_name(in->op),
                    plan->nactors + a, r->start[a][j] * 1e6,
                    (r->end[a][j] - r->start[a][j]) * 1e6, (long long)in->seq, in->bytes);
        }
    }
    /* the replicas' gradient all-reduces run beside compute: one row per actor */
    for (int a = 0; r->ar_end && a < plan->nactors; a++) {
        int any = 0;
        for (int s = 0; s < r->nstages; s++) {
            if (plan->stage_actor[s] != a || r->ar_end[s] <= r->ar_start[s]) continue;
            if (!any++)
                fprintf(f, ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":0,\"tid\":%d,"
                        "\"args\":{\"name\":\"actor %d collectives\"}}", 2 * plan->nactors + a, a);
            fprintf(f, ",\n{\"name\":\"all-reduce s%d\",\"cat\":\"allreduce\",\"ph\":\"X\","
                    "\"pid\":0,\"tid\":%d,\"ts\":%.3f,\"dur\":%.3f}", s, 2 * plan->nactors + a,
                    r->ar_start[s] * 1e6, (r->ar_end[s] - r->ar_start[s]) * 1e6);
        }
    }
    fprintf(f, "\n]}\n");
    return sp_output_commit(&out, "trace");
}

static void colour(int kind, int chunk, int nchunks, char out[8])
{
    static const int base[SP_NUM_TASK_KINDS][3] = {
        { 0x4e, 0x79, 0xa7 }, /* F blue */
        { 0x59, 0xa1, 0x4f }, /* B green */
        { 0xf2, 0x8e, 0x2b }, /* W orange */
        { 0xb0, 0x7a, 0xa1 }, /* BW purple */
    };
    double mix = nchunks > 1 ? 0.45 * chunk / (nchunks - 1) : 0; /* later chunks lighter */
    int rgb[3];
    for (int c = 0; c < 3; c++) rgb[c] = (int)(base[kind][c] + (255 - base[kind][c]) * mix);
    snprintf(out, 8, "#%02x%02x%02x", rgb[0], rgb[1], rgb[2]);
}

sp_status sp_sim_write_svg(const sp_plan *plan, const sp_sim_result *r, const char *path)
{
    sp_output out;
    sp_status st = check_finite(plan, r, path);
    if (st || (st = sp_output_open(&out, path, "SVG"))) return st;
    FILE *f = out.f;
    int p = plan->nactors, S = plan->nstages;
    /* chunk index of each stage on its actor, for shading */
    int *chunk = calloc((size_t)S, sizeof *chunk), *nch = calloc((size_t)p, sizeof *nch);
    if (!chunk || !nch) {
        free(chunk), free(nch), sp_output_abort(&out);
        return sp_set_error(SP_ERR_NOMEM, "out of memory");
    }
    for (int s = 0; s < S; s++) chunk[s] = nch[plan->stage_actor[s]]++;
    int maxch = 1;
    for (int a = 0; a < p; a++)
        if (nch[a] > maxch) maxch = nch[a];
    const double left = 80, width = 1200, row = 26, top = 40;
    double T = r->step_time > 0 ? r->step_time : 1, scale = width / T;
    double height = top + row * p + 50;
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
            "font-family=\"sans-serif\" font-size=\"11\">\n", left + width + 20, height);
    fprintf(f, "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n");
    /* a measured step (a run's timeline: seconds) in ms, like every other output of a run;
     * a simulated one in the cost units starpipe-plan prints it in */
    char span[48];
    if (r->async_transfers) snprintf(span, sizeof span, "%.4g ms", 1e3 * r->step_time);
    else snprintf(span, sizeof span, "%.4g", r->step_time);
    fprintf(f, "<text x=\"%.0f\" y=\"20\" font-size=\"14\">%d actors, %d stages, %d "
            "microbatches: step %s, bubble %.1f%%</text>\n", left, p, S, plan->nmicro, span,
            100 * r->bubble_fraction);
    for (int a = 0; a < p; a++) {
        double y = top + a * row;
        fprintf(f, "<text x=\"8\" y=\"%.1f\">actor %d</text>\n", y + row * 0.65, a);
        fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"#eeeeee\"/>\n",
                left, y + 2, width, row - 4);
        for (int j = 0; j < plan->ninstr[a]; j++) {
            const sp_instr *in = &plan->instr[a][j];
            if (in->op != SP_OP_RUN && in->op != SP_OP_COMBINE && in->op != SP_OP_OPTIMIZER)
                continue;
            double x0 = left + r->start[a][j] * scale, w = (r->end[a][j] - r->start[a][j]) * scale;
            if (w <= 0) continue;
            char fill[8] = "#888888";
            if (in->op == SP_OP_RUN) colour(in->task.kind, chunk[in->task.stage], maxch, fill);
            fprintf(f, "<rect x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" height=\"%.1f\" fill=\"%s\" "
                    "stroke=\"white\" stroke-width=\"0.5\"><title>", x0, y + 2, w, row - 4, fill);
            char t[96];
            fprintf(f, "%s</title></rect>\n", sp_instr_format(in, t, sizeof t));
            if (in->op == SP_OP_RUN && w >= 9)
                fprintf(f, "<text x=\"%.2f\" y=\"%.1f\" text-anchor=\"middle\" fill=\"white\" "
                        "font-size=\"%.0f\">%d</text>\n", x0 + w / 2, y + row * 0.65,
                        w >= 16 ? 11.0 : 8.0, in->task.mb);
        }
    }
    double ly = top + row * p + 20, lx = left;
    for (int k = 0; k < SP_NUM_TASK_KINDS; k++) {
        char fill[8];
        colour(k, 0, 1, fill);
        fprintf(f, "<rect x=\"%.0f\" y=\"%.0f\" width=\"14\" height=\"14\" fill=\"%s\"/>"
                "<text x=\"%.0f\" y=\"%.0f\">%s</text>\n", lx, ly, fill, lx + 18, ly + 11,
                sp_task_kind_name((sp_task_kind)k));
        lx += 60;
    }
    if (maxch > 1)
        fprintf(f, "<text x=\"%.0f\" y=\"%.0f\">lighter: later chunk on the actor</text>\n", lx,
                ly + 11);
    fprintf(f, "</svg>\n");
    free(chunk), free(nch);
    return sp_output_commit(&out, "SVG");
}
