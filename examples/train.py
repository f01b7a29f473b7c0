#!/usr/bin/python3
"""examples/train.py - a small PyTorch job that goes wrong in FP16, traced by
ampprobe and obeying the precision policy of the environment (what
`ampprobe bisect -- python3 examples/train.py` drives).

The model forecasts large-magnitude series (level ~3000, swings ~500) with
RevIN (reversible instance normalisation): RevIN's per-series variance is
~1e5, past FP16's 65504, so in FP16 its saved variance is inf, the
normalised input collapses to 0 and the denormalised forecast is inf: the
loss is non-finite from step 0. Keeping RevIN in FP32 fixes it
(AMPPROBE_FP32=revin).

--task classify adds a second culprit: a classifier head with over-scaled
weights and a softmax whose FP16 probabilities underflow to 0, so -log p is
inf (fix: softmax in FP32); the RevIN overflow then makes the features
vanish. Only AMPPROBE_FP32=revin,softmax trains like FP32.

On a CPU, FP16 is emulated (--precision fp16, the default): every module's
inputs, outputs and gradients are rounded to binary16 (docs/python.md).
--precision bf16 runs under torch.autocast(cpu, bfloat16), which is healthy.

--ddp trains data-parallel with torch.distributed (gloo, CPU processes;
DistributedDataParallel): under torchrun (RANK, WORLD_SIZE, MASTER_* set),
or with --ranks N this script spawns N processes itself. Every rank
draws the same global batch and trains on its slice; each writes its own
trace (run.h5 -> run.rank0.h5, run.rank1.h5, ...) with the gradients
before and after the all-reduce and the weight digest. --nan-rank R
--nan-step S plants a NaN in rank R's slice at step S.

  /usr/bin/python3 examples/train.py --trace run.h5
  ampprobe postmortem run.h5
  ampprobe bisect --fp32-candidates bn,softmax,revin -- /usr/bin/python3 examples/train.py
  torchrun --standalone --nproc_per_node 2 examples/train.py --ddp --precision bf16 --trace out/run.h5
  /usr/bin/python3 examples/train.py --ddp --ranks 2 --nan-rank 1 --nan-step 3 --precision bf16 --trace out/run.h5
  ampprobe postmortem out/
"""
import argparse
import math
import os
import signal
import socket
import sys
import time
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

import ampprobe  # noqa: E402
import ampprobe.torch as at  # noqa: E402


class RevIN(nn.Module):
    """Reversible instance normalisation (Kim et al. 2022) over a series
    (B, T): normalise by the series' own mean and standard deviation, and
    denormalise the model's forecast with the same statistics."""

    def __init__(self, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.gamma = nn.Parameter(torch.ones(1))
        self.beta = nn.Parameter(torch.zeros(1))
        self.stats = None

    def forward(self, x):
        mean = x.mean(dim=1, keepdim=True)
        # The variance is materialised: in FP16 it is inf past 65504.
        var = at.saved(self, ((x - mean) ** 2).mean(dim=1, keepdim=True))
        std = torch.sqrt(var + self.eps)
        self.stats = (mean, std)
        return (x - mean) / std * self.gamma + self.beta

    def denorm(self, y):
        mean, std = self.stats
        return (y - self.beta) / self.gamma * std + mean


class Denorm(nn.Module):
    """The forecast denormalised with RevIN's statistics (its own layer, as
    the C trainer's `<revin>.denorm`)."""

    def __init__(self, revin):
        super().__init__()
        self.revin = [revin]  # not a submodule

    def forward(self, y):
        return self.revin[0].denorm(y)


class Forecaster(nn.Module):
    def __init__(self, window=32, horizon=16, hidden=32):
        super().__init__()
        self.revin = RevIN()
        self.enc = nn.Sequential(nn.Linear(window, hidden), nn.ReLU())
        self.head = nn.Linear(hidden, horizon)
        self.denorm = Denorm(self.revin)

    def forward(self, x):
        return self.denorm(self.head(self.enc(self.revin(x))))


class Classifier(nn.Module):
    def __init__(self, window=32, classes=4, hidden=32, gain=30.0):
        super().__init__()
        self.revin = RevIN()
        self.enc = nn.Sequential(nn.Linear(window, hidden), nn.BatchNorm1d(hidden),
                                 nn.ReLU())
        self.head = nn.Linear(hidden, classes)
        with torch.no_grad():
            self.head.weight.mul_(gain)  # over-scaled: logits tens apart
        self.softmax = nn.Softmax(dim=-1)

    def forward(self, x):
        return self.softmax(self.head(self.enc(self.revin(x))))


class ProbNLL(nn.Module):
    """Cross-entropy on probabilities: -log p[target] (inf when p is 0)."""

    def forward(self, p, y):
        return -torch.log(p.gather(1, y[:, None])).mean()


def batch(gen, task, b=32, window=32, horizon=16, classes=4):
    """Series of level ~N(3000, 1000^2) with a sinusoid of amplitude ~500."""
    t = torch.arange(window + horizon, dtype=torch.float32)
    level = 3000 + 1000 * torch.randn(b, 1, generator=gen)
    if task == "classify":
        cls = torch.randint(0, classes, (b,), generator=gen)
        period = (4 + 3 * cls).float()[:, None]
    else:
        cls = None
        period = 8 + 16 * torch.rand(b, 1, generator=gen)
    phase = 2 * math.pi * torch.rand(b, 1, generator=gen)
    amp = 500 * (0.75 + 0.5 * torch.rand(b, 1, generator=gen))
    s = level + amp * torch.sin(2 * math.pi * t / period + phase)
    s = s + 10 * torch.randn(s.shape, generator=gen)
    if task == "classify":
        return s[:, :window], cls
    return s[:, :window], s[:, window:]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trace", default="run.h5",
                    help="trace path ($AMPPROBE_TRACE overrides it)")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--task", choices=("forecast", "classify"),
                    default="forecast")
    ap.add_argument("--precision", choices=("fp16", "bf16", "fp32"),
                    default="fp16",
                    help="fp16 is emulated on the CPU ($AMPPROBE_PRECISION "
                    "overrides it)")
    ap.add_argument("--mode", choices=("full", "scalars"), default="full")
    ap.add_argument("--on-nonfinite", choices=("record", "warn", "raise"),
                    default="record")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--kill-at", type=int, default=-1,
                    help="SIGKILL this process at that step (tests)")
    ap.add_argument("--fail-at", type=int, default=-1,
                    help="raise an exception at that step (tests)")
    ap.add_argument("--ddp", action="store_true",
                    help="data-parallel (gloo): under torchrun, or --ranks")
    ap.add_argument("--ranks", type=int, default=0,
                    help="with --ddp outside torchrun: spawn N processes")
    ap.add_argument("--nan-rank", type=int, default=-1,
                    help="with --ddp: the rank whose batch gets a NaN")
    ap.add_argument("--nan-step", type=int, default=-1,
                    help="with --ddp: the step of that NaN")
    a = ap.parse_args(argv)
    if a.ddp and "RANK" not in os.environ:
        return spawn(a, argv)
    return train(a)


def _run_rank(rank, world, port, argv):
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    sys.exit(main(argv))


def spawn(a, argv):
    """--ddp --ranks N outside torchrun: N processes on this machine."""
    if a.ranks < 1:
        sys.exit("--ddp outside torchrun needs --ranks N")
    import torch.multiprocessing as mp
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_run_rank, args=(a.ranks, port, argv), nprocs=a.ranks)
    return 0


def train(a):
    seed = ampprobe.env_seed(a.seed)  # bisect's second baseline sets it
    torch.set_num_threads(1)
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed + 1)
    rank, world = 0, 1
    if a.ddp:  # torchrun's (or spawn's) RANK, WORLD_SIZE, MASTER_*
        import torch.distributed as dist
        dist.init_process_group("gloo")
        rank, world = dist.get_rank(), dist.get_world_size()

    if a.task == "forecast":
        model, loss_fn = Forecaster(), nn.MSELoss()
    else:
        model, loss_fn = Classifier(), ProbNLL()
    net = model
    if a.ddp:  # same seed: same initial weights on every rank
        net = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.Adam(model.parameters(), lr=a.lr)
    tracer = at.Tracer(net, a.trace, mode=a.mode, precision=a.precision,
                       emulate_fp16=(a.precision == "fp16"),
                       kinds={RevIN: "revin", Denorm: "revin"},
                       loss_fn=loss_fn, on_nonfinite=a.on_nonfinite,
                       config={"name": "examples/train.py-" + a.task,
                               "steps": a.steps, "seed": seed},
                       weight_digest=a.ddp,  # equal on every rank
                       overwrite=True)  # rerunning replaces the trace
    # Loss scaling for FP16 (GradScaler rules; torch 1.13 disables
    # torch.cuda.amp.GradScaler on a CPU). The scale starts at 1: a forecast
    # of this magnitude already overflows the scaled FP16 gradients above.
    scaler = at.LossScaler(init_scale=1.0,
                           enabled=tracer.precision == "fp16")
    tracer.attach_scaler(scaler)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, a.steps)
    # Skipped steps (loss scaling) make the scheduler warn that it ran
    # before the optimizer; that is expected here.
    warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler")
    loss = None
    for step in range(a.steps):
        if step == a.kill_at:
            # Killed with no warning: what reached the disk is what the
            # writer thread flushed on its own (within flush_seconds, 1 s).
            time.sleep(1.5)
            os.kill(os.getpid(), signal.SIGKILL)
        if step == a.fail_at:
            raise RuntimeError("planted failure at step %d" % step)
        # the global batch (the same on every rank); this rank's slice
        x, y = batch(gen, a.task, b=32 * world)
        x, y = x[32 * rank:32 * (rank + 1)], y[32 * rank:32 * (rank + 1)]
        if rank == a.nan_rank and step == a.nan_step:
            x = x.clone()
            x[0, 0] = float("nan")
        with tracer.autocast():
            loss = loss_fn(net(x), y)
        opt.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        norm = nn.utils.clip_grad_norm_(model.parameters(), 5.0)
        scaler.step(opt)
        scaler.update()
        tracer.end_step(loss=loss, optimizer=opt, grad_norm=norm,
                        max_norm=5.0)
        sched.step()
    tracer.close()
    if a.ddp:
        torch.distributed.destroy_process_group()
    final = float(loss) if loss is not None else float("nan")
    print("%s%s: %d steps, precision %s%s, final loss %.6g, trace %s" % (
        "rank %d/%d " % (rank, world) if a.ddp else "", a.task, a.steps,
        tracer.precision,
        (" (fp32: %s)" % ",".join(tracer.fp32_modules())
         if tracer.fp32_modules() and tracer.precision != "fp32" else ""),
        final, tracer.path))
    return 0


if __name__ == "__main__":
    sys.exit(main())
