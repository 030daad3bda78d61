/* Transfers: comm/ moves the data, the executor posts, numbers and traces every message
 * of the step, and keeps the list a stall report reads (stall.c). Relies on state.c,
 * trace.c and sends.c (a send its producer posts). */
#include <stdio.h>
#include <stdlib.h>

#include "runtime/exec/exec_int.h"

transfer_info **sp_exec_xfers_;
size_t sp_exec_nxfers_;
static size_t xfers_cap;

static void release_transfer(transfer_info *t)
{
    if (atomic_fetch_sub(&t->refs, 1) == 1)
        free(t);
}

void sp_exec_free_transfers(void)
{
    for (size_t i = 0; i < sp_exec_nxfers_; i++)
        release_transfer(sp_exec_xfers_[i]);
    sp_exec_nxfers_ = 0;
}

/* Completion of a transfer: a failed one fails the step (StarPU-MPI has no error path:
 * the direct transport's failures); with tracing on, its record from posting to
 * completion. */
static void transfer_finish(void *arg, const char *err)
{
    transfer_info *t = arg;
    if (err)
        sp_exec_fail_step("rank %d: %s", sp_exec_rank_, err);
    atomic_fetch_add(&sp_exec_tasks_done_, 1); /* progress, for the watchdog */
    sp_exec_progress();
    if (!t)
        return;
    atomic_store(&t->done, 1);
    if (X.opts.trace) {
        char name[32];
        snprintf(name, sizeof name, "%s #%u %s %d", t->is_send ? "send" : "recv", t->msg,
                 t->is_send ? "to" : "from", t->peer);
        sp_exec_trace_add(name, t->msg, t->posted, starpu_timing_now(), t->is_send ? 1 : 2,
                          t->peer);
    }
    release_transfer(t);
}

static sp_status post(sp_exec_buf *b, int peer, uint32_t msg, int is_send)
{
    const char *what = is_send ? "sp_exec_send" : "sp_exec_recv";
    if (!X.started || !X.in_step)
        return sp_set_error(SP_ERR_ARG, "%s: not inside a step", what);
    if (!b)
        return sp_set_error(SP_ERR_ARG, "%s: NULL buffer", what);
    if (peer < 0 || peer >= sp_exec_size_ || peer == sp_exec_rank_)
        return sp_set_error(SP_ERR_ARG, "%s: rank %d cannot exchange with rank %d of %d",
                            what, sp_exec_rank_, peer, sp_exec_size_);
    /* not kept (out of memory): the message goes untraced and unreported */
    transfer_info *info = NULL;
    if (sp_exec_nxfers_ < xfers_cap ||
        grow_array((void **)&sp_exec_xfers_, &xfers_cap, sizeof *sp_exec_xfers_)) {
        if ((info = malloc(sizeof *info))) {
            *info = (transfer_info){ is_send, peer, msg, X.opts.trace ? starpu_timing_now() : 0,
                                     b->handle, X.posted++, 0, 2 };
            sp_exec_xfers_[sp_exec_nxfers_++] = info;
        }
    }
    /* a send of data a task of this step writes: that task may post it (sp_exec_send_early) */
    struct task_args *producer = is_send && b->writer_step == sp_exec_step_ ? b->writer : NULL;
    sp_xfer_req *held = NULL;
    sp_xfer x = { b->handle, b->count, b->elemsize, peer, is_send, msg };
    sp_status st = X.host->post(&x, transfer_finish, info,
                                producer && X.host->send_from ? &held : NULL);
    if (st && info)
        free(sp_exec_xfers_[--sp_exec_nxfers_]);
    if (!st && is_send)
        X.sent_to[peer] += (unsigned long long)b->count * b->elemsize;
    if (held) {
        sp_exec_attach_early(producer, held, b->handle);
        X.host->drop(held);
    }
    if (!is_send)
        b->writer = NULL; /* written by the message now, not by a task */
    return st;
}

sp_status sp_exec_send(sp_exec_buf *b, int dst, uint32_t msg) { return post(b, dst, msg, 1); }

sp_status sp_exec_recv(sp_exec_buf *b, int src, uint32_t msg) { return post(b, src, msg, 0); }

sp_exec_transfers sp_exec_transfer_counts(void)
{
    sp_xfer_counts c = { 0 }, g = { 0 };
    if (X.started) X.host->counts(&c);
    if (X.started && X.group) X.group->counts(&g);
    return (sp_exec_transfers){ X.started ? X.host->name : "none", c.sends, c.recvs, c.pieced,
                                c.by_producer, c.bytes_sent, c.bytes_received, g.sends,
                                g.recvs };
}

unsigned long long sp_exec_bytes_sent_to(int rank)
{
    return X.started && X.sent_to && rank >= 0 && rank < sp_exec_size_ ? X.sent_to[rank] : 0;
}

const char *sp_exec_hostname(int rank) { return sp_exec_host_of(rank); }

size_t sp_exec_staging_bytes(void)
{
    return X.started && X.host->staging_bytes ? X.host->staging_bytes() : 0;
}

void sp_exec_transfers_shutdown(void)
{
    sp_exec_free_transfers();
    free(sp_exec_xfers_);
    sp_exec_xfers_ = NULL;
    xfers_cap = 0;
}

/* Messages posted and not yet done, of every transport. */
int sp_exec_transfers_pending(void)
{
    return X.host->pending() + (X.group ? X.group->pending() : 0);
}
