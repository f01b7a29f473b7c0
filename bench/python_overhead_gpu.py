#!/usr/bin/env python3
"""bench/python_overhead_gpu.py - the PyTorch tracer's cost per training
step of a GPU job under real FP16 autocast.

Side by side in one run, on one CUDA device:
  untraced   the step alone: forward under torch.autocast("cuda", fp16),
             cross-entropy loss, GradScaler, backward, unscale, clip, AdamW;
  ampprobe   the same step traced by ampprobe.torch.Tracer, full trace of
             every leaf module (fwd_in, fwd_out, weight, grad_out, grad_in,
             weight_grad, master_weight; libprobe computes the statistics on
             the device, many tensors per launch);
  flight     the same with mode="scalars" (the flight recorder: per-layer
             records kept for the last ring_steps steps only);
  anomaly    the untraced step under torch.autograd.set_detect_anomaly(True),
             PyTorch's own NaN finder (an anchor: backward only, NaN only).
Models: "gpt" (a decoder-only transformer, nn.TransformerEncoderLayer with a
causal mask; --layers, --dim, --seq, --batch) and "mlp" (16 Linear+GELU
blocks of 1024: many small records per unit of work).

The variants run interleaved, round after round; each figure is the median
over rounds of the mean step time of a round, timed with the device
synchronised at both ends. Without a CUDA device it says so and exits 0
(--device cpu runs the same code on the CPU, slowly, to check it).

usage: python3 bench/python_overhead_gpu.py [--rounds R] [--steps N]
           [--models gpt,mlp] [--layers L] [--dim D] [--seq S] [--batch B]
           [--device cuda|cpu] [--markdown]
(AMPPROBE_LIB as for the package, docs/python.md)
"""
import argparse
import os
import platform
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

import ampprobe  # noqa: E402
import ampprobe.torch as at  # noqa: E402

VOCAB = 32000
VARIANTS = ("untraced", "ampprobe", "flight", "anomaly")


class GPT(nn.Module):
    def __init__(self, layers, dim, seq):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, dim)
        self.pos = nn.Embedding(seq, dim)
        self.blocks = nn.ModuleList(
            nn.TransformerEncoderLayer(dim, dim // 64, 4 * dim, dropout=0.0,
                                       activation="gelu", batch_first=True,
                                       norm_first=True)
            for _ in range(layers))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, VOCAB, bias=False)
        self.register_buffer("mask", torch.triu(
            torch.full((seq, seq), float("-inf")), diagonal=1), persistent=False)

    def forward(self, x):
        h = self.emb(x) + self.pos(torch.arange(x.shape[1], device=x.device))
        for b in self.blocks:
            h = b(h, src_mask=self.mask, is_causal=True)
        return self.head(self.norm(h))


class MLP(nn.Module):
    def __init__(self, dim=1024, blocks=16):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, dim)
        self.body = nn.Sequential(*[m for _ in range(blocks)
                                    for m in (nn.Linear(dim, dim), nn.GELU())])
        self.head = nn.Linear(dim, VOCAB, bias=False)

    def forward(self, x):
        return self.head(self.body(self.emb(x)))


class Job:
    def __init__(self, name, variant, args, dev, tmp):
        torch.manual_seed(0)
        if name == "gpt":
            self.model = GPT(args.layers, args.dim, args.seq).to(dev)
            shape = (args.batch, args.seq)
        else:
            self.model = MLP().to(dev)
            shape = (args.batch * args.seq // 8,)
        g = torch.Generator().manual_seed(1)
        self.x = torch.randint(0, VOCAB, shape, generator=g).to(dev)
        self.y = torch.randint(0, VOCAB, shape, generator=g).to(dev)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-4)
        self.scaler = torch.amp.GradScaler(dev.type, init_scale=2.0 ** 16)
        self.dev = dev
        self.variant = variant
        self.tracer = None
        if variant in ("ampprobe", "flight"):
            self.tracer = at.Tracer(
                self.model, os.path.join(tmp, "%s-%s.h5" % (name, variant)),
                mode="full" if variant == "ampprobe" else "scalars",
                precision="fp16", env=False, overwrite=True,
                record_input=False)
            self.tracer.attach_scaler(self.scaler)

    def autocast(self):
        if self.tracer is not None:
            return self.tracer.autocast()
        return torch.autocast(self.dev.type, dtype=torch.float16)

    def step(self):
        with self.autocast():
            out = self.model(self.x)
            loss = nn.functional.cross_entropy(
                out.reshape(-1, VOCAB).float(), self.y.reshape(-1))
        self.opt.zero_grad(set_to_none=True)
        self.scaler.scale(loss).backward()
        self.scaler.unscale_(self.opt)
        norm = nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.scaler.step(self.opt)
        self.scaler.update()
        if self.tracer is not None:
            self.tracer.end_step(loss=loss, optimizer=self.opt, grad_norm=norm,
                                 max_norm=1.0)

    def sync(self):
        if self.dev.type == "cuda":
            torch.cuda.synchronize(self.dev)

    def run(self, steps):
        """Seconds per step, the device synchronised before and after."""
        anomaly = self.variant == "anomaly"
        with torch.autograd.set_detect_anomaly(anomaly, check_nan=True) \
                if anomaly else _null():
            self.sync()
            t0 = time.perf_counter()
            for _ in range(steps):
                self.step()
            self.sync()
        return (time.perf_counter() - t0) / steps

    def close(self):
        if self.tracer is not None:
            self.tracer.close()


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def records_per_step(job):
    if job.tracer is None:
        return 0
    return len(ampprobe.read_trace(job.tracer.path)["records"]) / max(1, job.tracer._next)


def bench(name, args, dev, tmp):
    jobs = {v: Job(name, v, args, dev, tmp) for v in VARIANTS}
    for j in jobs.values():  # warm-up: kernels, allocator, autotuning
        j.run(args.warmup)
    times = {v: [] for v in VARIANTS}
    for r in range(args.rounds):
        for v in VARIANTS:
            times[v].append(jobs[v].run(args.steps))
        print("  %s round %d/%d: %s" % (name, r + 1, args.rounds, ", ".join(
            "%s %.2f ms" % (v, 1e3 * times[v][-1]) for v in VARIANTS)),
            file=sys.stderr, flush=True)
    for j in jobs.values():
        j.close()
    recs = records_per_step(jobs["ampprobe"])
    params = sum(p.numel() for p in jobs["untraced"].model.parameters())
    med = {v: statistics.median(times[v]) for v in VARIANTS}
    # paired: each round's traced/untraced ratio (the same minutes of the
    # device), then the median
    paired = {v: statistics.median(t / u for t, u in zip(times[v], times["untraced"])) - 1
              for v in VARIANTS}
    return params, recs, med, paired


def profile(args, dev):
    """The traced gpt's step taken apart: wall and CPU time per step,
    traced and untraced; the Python functions that take the most time
    (cProfile); the CUDA runtime calls of the process (torch.profiler)."""
    import cProfile
    import pstats
    with tempfile.TemporaryDirectory() as tmp:
        jobs = {v: Job("gpt", v, args, dev, tmp) for v in ("untraced", "ampprobe")}
        for v, j in jobs.items():
            j.run(args.warmup)
            c0 = time.process_time()
            w = j.run(args.steps)
            print("%-9s %.2f ms/step wall, %.2f ms/step CPU of the process" % (
                v, 1e3 * w, 1e3 * (time.process_time() - c0) / args.steps))
        j = jobs["ampprobe"]
        pr = cProfile.Profile()
        pr.enable()
        j.run(args.steps)
        pr.disable()
        print("\ncProfile, %d traced steps, by own time:" % args.steps)
        pstats.Stats(pr).sort_stats("tottime").print_stats(22)
        from torch.profiler import ProfilerActivity, profile as tprofile
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
        with tprofile(activities=acts) as prof:
            j.run(3)
        print("torch.profiler, 3 traced steps, by self CPU time:")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))
        for j in jobs.values():
            j.close()
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--models", default="gpt,mlp")
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--dim", type=int, default=1024)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--profile", action="store_true",
                    help="instead: where a traced gpt step's time goes "
                    "(cProfile of the Python side, torch.profiler's CUDA "
                    "runtime calls of the whole process)")
    args = ap.parse_args()
    for k in ("rounds", "steps", "layers", "dim", "seq", "batch"):
        if getattr(args, k) < 1:
            ap.error("--%s must be at least 1" % k)
    if args.warmup < 0:
        ap.error("--warmup must be at least 0")
    if args.dim % 64:
        ap.error("--dim must be a multiple of 64 (heads of 64)")
    models = [m for m in args.models.split(",") if m]
    bad = [m for m in models if m not in ("gpt", "mlp")]
    if bad or not models:
        ap.error("--models: gpt and/or mlp, got %r" % args.models)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("SKIP: torch sees no CUDA device (--device cpu checks the code)")
        return 0
    dev = torch.device(args.device)
    what = torch.cuda.get_device_name(dev) if dev.type == "cuda" else platform.processor() or "cpu"
    print("bench python_overhead_gpu: %s, torch %s, libampprobe %s" % (
        what, torch.__version__, ampprobe.library_path()))
    print("gpt: %d layers, dim %d, seq %d, batch %d; mlp: 16 x Linear 1024 + GELU, "
          "%d tokens; %d rounds x %d steps after %d warm-up steps, variants interleaved\n"
          % (args.layers, args.dim, args.seq, args.batch, args.batch * args.seq // 8,
             args.rounds, args.steps, args.warmup))
    if args.profile:
        return profile(args, dev)
    print("| model | params | records/step | variant | ms/step (median) | overhead (paired median) |")
    print("| --- | ---: | ---: | --- | ---: | ---: |")
    with tempfile.TemporaryDirectory() as tmp:
        for m in models:
            params, recs, med, paired = bench(m, args, dev, tmp)
            for v in VARIANTS:
                print("| %s | %.1fM | %s | %s | %.2f | %+.1f%% |" % (
                    m, params / 1e6, "%.0f" % recs if v == "ampprobe" else "",
                    v, 1e3 * med[v], 100 * paired[v]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
