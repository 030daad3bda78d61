#!/usr/bin/env python3
"""PyTorch peer of starpipe-gpt: the same GPT, data and AdamW step, pipelined with
torch.distributed.pipelining (PipelineStage + ScheduleGPipe / Schedule1F1B) over gloo on
the CPU, one process per stage, one thread per process.

It reproduces starpipe's parameter initialisation (graph/graph.c, sp_param_init_values)
and its data windows (graph/data.c, sp_text_batch) bit for bit, so with the same --seed
its per-step losses follow starpipe-gpt's (to float rounding: kernels differ).

  python3 bench/peer/gpt_pipe.py --schedule 1f1b --steps 13 --warmup 3
  python3 bench/peer/gpt_pipe.py --selfcheck     # pipelined step vs one process, then exit

Prints one line per step (`step K loss X  T ms  (pipeline P ms, update U ms)`) and, with
--json, a last line `{"median_ms": ..., ...}`. The step time of a step is the largest over
the ranks of the wall time from the start of schedule.step to the end of the optimizer
step; the median is taken over the steps after --warmup.
"""
import argparse
import json
import math
import os
import socket
import statistics
import sys
import time

# One thread per rank: set before torch (and its OpenMP / MKL) loads, here and in the
# spawned children, which inherit the environment.
for _v in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import numpy as np  # noqa: E402

M64 = (1 << 64) - 1


# ---- starpipe's counter-based generators (graph/graph.c, graph/data.c) -------------------

def mix64_int(x):
    x = (x + 0x9E3779B97F4A7C15) & M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & M64
    return x ^ (x >> 31)


def mix64_np(x):
    with np.errstate(over="ignore"):
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def fnv1a(s):
    h = 0xCBF29CE484222325
    for c in s.encode():
        h = ((h ^ c) * 0x100000001B3) & M64
    return h


def init_normal(name, numel, std, seed):
    """sp_param_init_values for SP_INIT_NORMAL: Box-Muller on splitmix64 counters."""
    key = mix64_int((seed ^ fnv1a(name)) & M64)
    j = np.arange(0, numel, 2, dtype=np.uint64)
    with np.errstate(over="ignore"):
        r1 = mix64_np(j + np.uint64(key))
        r2 = mix64_np(j + np.uint64(key) + np.uint64(1))
    u1 = ((r1 >> np.uint64(11)).astype(np.float64) + 1.0) * 2.0 ** -53
    u2 = (r2 >> np.uint64(11)).astype(np.float64) * 2.0 ** -53
    rad = np.sqrt(-2.0 * np.log(u1))
    th = 2.0 * math.pi * u2
    std = float(np.float32(std))
    out = np.empty(numel, dtype=np.float32)
    out[0::2] = (std * rad * np.cos(th)).astype(np.float32)
    out[1::2] = (std * rad * np.sin(th)).astype(np.float32)[: numel // 2]
    return out


def text_batch(data, seed, step, m, B, T):
    """sp_text_batch for microbatches 0..m-1, stacked: tokens and targets (m*B, T)."""
    windows = len(data) - T
    offs = []
    for mb in range(m):
        for b in range(B):
            k = mix64_int(mix64_int(mix64_int(mix64_int(seed) ^ step) ^ mb) ^ b)
            offs.append(k % windows)
    idx = np.asarray(offs, dtype=np.int64)[:, None] + np.arange(T + 1, dtype=np.int64)[None, :]
    w = data[idx].astype(np.int64)
    return w[:, :T], w[:, 1:]


# ---- the model (graph/models.c, sp_model_gpt) ------------------------------------------

def param_specs(a):
    """(name, shape, init, std) in sp_model_gpt's order; init in normal/ones/zeros."""
    V, T, C, L = 256, a.context, a.channels, a.layers
    std = np.float32(0.02)
    std_res = np.float32(np.float32(0.02) / np.sqrt(np.float32(2.0 * L), dtype=np.float32))
    specs = [("wte", (V, C), "normal", std), ("wpe", (T, C), "normal", std)]
    for l in range(L):
        specs += [
            (f"h{l}.ln1.g", (C,), "ones", 0), (f"h{l}.ln1.b", (C,), "zeros", 0),
            (f"h{l}.attn.w", (C, 3 * C), "normal", std), (f"h{l}.attn.b", (3 * C,), "zeros", 0),
            (f"h{l}.proj.w", (C, C), "normal", std_res), (f"h{l}.proj.b", (C,), "zeros", 0),
            (f"h{l}.ln2.g", (C,), "ones", 0), (f"h{l}.ln2.b", (C,), "zeros", 0),
            (f"h{l}.fc.w", (C, 4 * C), "normal", std), (f"h{l}.fc.b", (4 * C,), "zeros", 0),
            (f"h{l}.fcproj.w", (4 * C, C), "normal", std_res),
            (f"h{l}.fcproj.b", (C,), "zeros", 0),
        ]
    specs += [("lnf.g", (C,), "ones", 0), ("lnf.b", (C,), "zeros", 0)]
    return specs


def init_values(a):
    vals = {}
    for name, shape, kind, std in param_specs(a):
        n = int(np.prod(shape))
        if kind == "normal":
            v = init_normal(name, n, std, a.seed)
        else:
            v = np.full(n, 1.0 if kind == "ones" else 0.0, dtype=np.float32)
        vals[name] = v.reshape(shape)
    return vals


def layer_stage(l, L, S):
    return l * S // L  # models.c layer_stage, even cut


def build_module(a, vals, stage, nstages):
    """The GPT part of `stage` of `nstages` (nstages 1: the whole model). Parameters keep
    starpipe's names ('.' -> '_' for torch) and (in, out) layout, used as x @ W."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    C, H, L = a.channels, a.heads, a.layers
    first, last = stage == 0, stage == nstages - 1
    layers = [l for l in range(L) if layer_stage(l, L, nstages) == stage]

    class Part(nn.Module):
        def __init__(self):
            super().__init__()
            self.names = []
            for name, shape, _, _ in param_specs(a):
                want = (name == "wte" and (first or last)) or (name == "wpe" and first) or \
                       (name.startswith("lnf.") and last) or \
                       (name.startswith("h") and int(name[1:].split(".")[0]) in layers)
                if want:
                    self.register_parameter(name.replace(".", "_"),
                                            nn.Parameter(torch.from_numpy(vals[name].copy())))
                    self.names.append(name)

        def p(self, name):
            return getattr(self, name.replace(".", "_"))

        def block(self, l, x):
            B, T, _ = x.shape
            h = F.layer_norm(x, (C,), self.p(f"h{l}.ln1.g"), self.p(f"h{l}.ln1.b"), 1e-5)
            qkv = torch.addmm(self.p(f"h{l}.attn.b"), h.reshape(B * T, C), self.p(f"h{l}.attn.w"))
            q, k, v = qkv.view(B, T, 3, H, C // H).permute(2, 0, 3, 1, 4)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # scale 1/sqrt(hs)
            y = y.transpose(1, 2).reshape(B * T, C)
            x = x + torch.addmm(self.p(f"h{l}.proj.b"), y, self.p(f"h{l}.proj.w")).view(B, T, C)
            h = F.layer_norm(x, (C,), self.p(f"h{l}.ln2.g"), self.p(f"h{l}.ln2.b"), 1e-5)
            h = torch.addmm(self.p(f"h{l}.fc.b"), h.reshape(B * T, C), self.p(f"h{l}.fc.w"))
            h = F.gelu(h, approximate="tanh")
            h = torch.addmm(self.p(f"h{l}.fcproj.b"), h, self.p(f"h{l}.fcproj.w"))
            return x + h.view(B, T, C)

        def forward(self, x):
            if first:
                x = F.embedding(x, self.p("wte")) + self.p("wpe")[: x.shape[1]]
            for l in layers:
                x = self.block(l, x)
            if last:
                x = F.layer_norm(x, (C,), self.p("lnf.g"), self.p("lnf.b"), 1e-5)
                x = F.linear(x, self.p("wte"))  # tied head: x @ wte^T
            return x

    return Part()


def loss_fn(logits, targets):
    import torch.nn.functional as F
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


# ---- training ----------------------------------------------------------------------------

class Update:
    """starpipe's update (include/starpipe/optim.h): combine the tied wte gradient of the
    first and last stage (an all-reduce, so both copies stay equal), clip the global norm
    (an all-reduce of the per-rank sums of squares, wte counted once), AdamW with weight
    decay on 2-D parameters only."""

    def __init__(self, a, part, rank, nranks, tie_group):
        import torch
        self.torch, self.a, self.part, self.rank, self.nranks = torch, a, part, rank, nranks
        self.tie_group = tie_group
        self.params = [part.p(n) for n in part.names]
        self.wte = part.p("wte") if "wte" in part.names else None
        # wte is owned (counted in the norm) by the first stage only
        self.owned = [part.p(n) for n in part.names if not (n == "wte" and rank != 0)]
        decay = [p for p in self.params if p.dim() >= 2]
        no_decay = [p for p in self.params if p.dim() < 2]
        kw = {}
        if a.optim == "fused":
            kw["fused"] = True
        elif a.optim == "foreach":
            kw["foreach"] = True
        elif a.optim == "loop":
            kw["foreach"] = False
        self.opt = torch.optim.AdamW(
            [{"params": decay, "weight_decay": a.weight_decay},
             {"params": no_decay, "weight_decay": 0.0}],
            lr=a.lr, betas=(0.9, 0.95), eps=1e-8, **kw)

    def combine(self):
        import torch.distributed as dist
        if self.wte is not None and self.tie_group is not None:
            dist.all_reduce(self.wte.grad, group=self.tie_group)

    def step(self):
        import torch.distributed as dist
        torch = self.torch
        self.combine()
        if self.a.clip > 0:
            grads = [p.grad for p in self.owned if p.grad is not None]
            ss = torch.zeros(1, dtype=torch.float64)
            for g in grads:
                ss += g.double().pow(2).sum()
            if self.nranks > 1:
                dist.all_reduce(ss)
            norm = math.sqrt(ss.item())
            scale = min(1.0, self.a.clip / norm) if norm > 0 else 1.0
            if scale < 1.0:
                torch._foreach_mul_([p.grad for p in self.params if p.grad is not None], scale)
        self.opt.step()
        self.opt.zero_grad(set_to_none=False)


def worker(rank, a, port):
    if a.pin and hasattr(os, "sched_setaffinity"):
        cpus = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cpus[rank % len(cpus)]})
    import torch
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    torch.set_num_threads(a.threads)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass
    P = a.ranks
    dist.init_process_group("gloo", rank=rank, world_size=P,
                            init_method=f"tcp://127.0.0.1:{port}")
    tie_group = dist.new_group([0, P - 1]) if P > 1 else None
    first, last = rank == 0, rank == P - 1

    data = np.fromfile(a.data, dtype=np.uint8)
    vals = init_values(a)
    part = build_module(a, vals, rank, P)
    upd = Update(a, part, rank, P, tie_group)
    stage = PipelineStage(part, rank, P, torch.device("cpu"))
    Sched = Schedule1F1B if a.schedule == "1f1b" else ScheduleGPipe
    sched = Sched(stage, n_microbatches=a.microbatches, loss_fn=loss_fn, scale_grads=True)

    def pipeline_step(step):
        tok, tgt = text_batch(data, a.seed, step, a.microbatches, a.batch, a.context)
        losses = []
        if first and last:
            sched.step(torch.from_numpy(tok), target=torch.from_numpy(tgt), losses=losses,
                       return_outputs=False)
        elif first:
            sched.step(torch.from_numpy(tok), return_outputs=False)
        elif last:
            sched.step(target=torch.from_numpy(tgt), losses=losses, return_outputs=False)
        else:
            sched.step(return_outputs=False)
        return float(torch.stack([l.detach() for l in losses]).mean()) if losses else float("nan")

    if a.selfcheck:
        ok = selfcheck(a, data, vals, part, upd, pipeline_step, rank, P)
        dist.destroy_process_group()
        if not ok:
            sys.exit(1)
        return

    rec = []  # (loss, total s, pipeline s, update s)
    dist.barrier()
    for step in range(1, a.steps + 1):
        t0 = time.perf_counter()
        loss = pipeline_step(step)
        t1 = time.perf_counter()
        upd.step()
        t2 = time.perf_counter()
        rec.append((loss, t2 - t0, t1 - t0, t2 - t1))
    every = [None] * P
    dist.all_gather_object(every, rec)
    if rank == 0:
        report(a, every)
    dist.destroy_process_group()


def report(a, every):
    P = len(every)
    times = []
    for k in range(a.steps):
        loss = every[P - 1][k][0]
        tot = max(r[k][1] for r in every)
        pipe = max(r[k][2] for r in every)
        up = max(r[k][3] for r in every)
        times.append((tot, pipe, up))
        print(f"step {k + 1} loss {loss:.6f}  {1e3 * tot:.1f} ms  "
              f"(pipeline {1e3 * pipe:.1f} ms, update {1e3 * up:.1f} ms)", flush=True)
    timed = times[a.warmup:] or times
    med = statistics.median(t[0] for t in timed)
    out = {"median_ms": 1e3 * med, "min_ms": 1e3 * min(t[0] for t in timed),
           "median_pipeline_ms": 1e3 * statistics.median(t[1] for t in timed),
           "median_update_ms": 1e3 * statistics.median(t[2] for t in timed),
           "timed_steps": len(timed), "first_loss": every[P - 1][0][0],
           "last_loss": every[P - 1][-1][0], "schedule": a.schedule,
           "microbatches": a.microbatches, "torch": __import__("torch").__version__}
    print(f"median {out['median_ms']:.1f} ms over {len(timed)} steps (after {a.warmup} "
          f"warm-up)", flush=True)
    if a.json:
        print(json.dumps(out), flush=True)


def selfcheck(a, data, vals, part, upd, pipeline_step, rank, P):
    """One pipelined step against the same step in one process on the whole model: the
    loss, every gradient after the tied-weight combine (before clipping), every parameter
    after the update. Each rank checks its own parameters; the verdict is all-reduced."""
    import torch
    import torch.distributed as dist

    full = build_module(a, vals, 0, 1)
    ref_upd = Update(a, full, 0, 1, None)
    tok, tgt = text_batch(data, a.seed, 1, a.microbatches, a.batch, a.context)
    tok, tgt = torch.from_numpy(tok), torch.from_numpy(tgt)
    ref_losses = []
    for mb in range(a.microbatches):
        sl = slice(mb * a.batch, (mb + 1) * a.batch)
        l = loss_fn(full(tok[sl]), tgt[sl])
        (l / a.microbatches).backward()
        ref_losses.append(l.detach())
    ref_loss = float(torch.stack(ref_losses).mean())
    ref_grads = {n: full.p(n).grad.clone() for n in full.names}
    ref_upd.step()

    loss = pipeline_step(1)
    upd.combine()
    gerr = 0.0
    for n in part.names:
        g, r = part.p(n).grad, ref_grads[n]
        gerr = max(gerr, float((g - r).abs().max()) / max(float(r.abs().max()), 1e-30))
    upd.combine = lambda: None  # already combined
    upd.step()
    perr = 0.0
    for n in part.names:
        perr = max(perr, float((part.p(n).detach() - full.p(n).detach()).abs().max()))
    lerr = abs(loss - ref_loss) / abs(ref_loss) if rank == P - 1 else 0.0
    v = torch.tensor([lerr, gerr, perr], dtype=torch.float64)
    dist.all_reduce(v, op=dist.ReduceOp.MAX)
    lerr, gerr, perr = v.tolist()
    ok = lerr < 1e-5 and gerr < 1e-4 and perr < 1e-5
    if rank == P - 1:
        print(f"selfcheck: {P} stages, {a.schedule}, {a.microbatches} microbatches: loss "
              f"pipelined {loss:.6f} vs one process {ref_loss:.6f} (rel {lerr:.1e}); "
              f"gradients max rel {gerr:.1e}; parameters after AdamW max abs {perr:.1e}: "
              f"{'ok' if ok else 'MISMATCH'}", flush=True)
    return ok


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--channels", type=int, default=64)
    ap.add_argument("--context", type=int, default=64)
    ap.add_argument("--batch", type=int, default=4, help="sequences per microbatch")
    ap.add_argument("--microbatches", type=int, default=0, help="per step (default 2p)")
    ap.add_argument("--ranks", type=int, default=2, help="processes = stages (p)")
    ap.add_argument("--schedule", choices=["1f1b", "gpipe"], default="1f1b")
    ap.add_argument("--steps", type=int, default=13)
    ap.add_argument("--warmup", type=int, default=3, help="steps left out of the median")
    ap.add_argument("--lr", type=float, default=1e-3)  # starpipe-gpt's default
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--clip", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=1337)
    ap.add_argument("--data", default="/usr/share/common-licenses/GPL-3")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    ap.add_argument("--optim", choices=["default", "fused", "foreach", "loop"],
                    default="fused", help="torch AdamW implementation (fused: the fastest "
                    "on the CPU)")
    ap.add_argument("--no-pin", dest="pin", action="store_false",
                    help="do not pin rank r to core r")
    ap.add_argument("--selfcheck", action="store_true")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    if a.microbatches <= 0:
        a.microbatches = 2 * a.ranks
    if a.channels % a.heads or a.layers < a.ranks:
        ap.error("heads must divide channels, and layers >= ranks")
    import torch.multiprocessing as mp
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(worker, args=(a, port), nprocs=a.ranks, join=True)


if __name__ == "__main__":
    main()
