"""What the post-mortem reads from a PyTorch run's course (hunt on unseen
models, 2026-12-04): a loss that explodes while staying finite, and a
streak of skipped steps in the middle of a run, were both called healthy.
Real torch jobs traced with the Tracer (FP16 by emulation, the package's
LossScaler), then diagnosed; the controls are the same jobs without the
fault. The fault cases failed before the fix (loss-diverging, skip-streak:
docs/precision.md)."""
import re

import pytest

torch = pytest.importorskip("torch")
import torch.nn as nn  # noqa: E402

import ampprobe  # noqa: E402
import ampprobe.torch as at  # noqa: E402

torch.set_num_threads(1)


def ids(pm):
    return [f["id"] for f in pm.get("diagnosis") or []]


def texts(f):
    return " | ".join([f.get("title", ""), f.get("next_step", "")] +
                      f.get("evidence", []))


class Boost(torch.autograd.Function):
    """Identity forward; the backward multiplies the gradient by gain (a
    custom op whose backward blows up on some batches)."""

    @staticmethod
    def forward(ctx, x, gain):
        ctx.gain = gain
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return g * ctx.gain, None


class Gate(nn.Module):
    def __init__(self):
        super().__init__()
        self.gain = 1.0

    def forward(self, x):
        return Boost.apply(x, self.gain)


class Regressor(nn.Module):
    def __init__(self):
        super().__init__()
        self.enc = nn.Linear(8, 16)
        self.act = nn.ReLU()
        self.gate = Gate()
        self.head = nn.Linear(16, 1)

    def forward(self, x):
        return self.head(self.gate(self.act(self.enc(x))))


def job(path, steps, precision="fp16", lr=0.01, lr_growth=1.0, clip=None,
        bad_steps=()):
    """A regression y = x @ w with SGD; the lr is multiplied by lr_growth
    every step (an lr range test, or a schedule gone wrong); clip: clip the
    unscaled gradients to that norm; bad_steps: steps whose backward the
    gate multiplies by 1e6 (their scaled gradients overflow: skipped)."""
    torch.manual_seed(0)
    m = Regressor()
    opt = torch.optim.SGD(m.parameters(), lr=lr)
    kw = dict(precision="fp32") if precision == "fp32" else dict(emulate_fp16=True)
    tr = at.Tracer(m, path, env=False, **kw)
    sc = at.LossScaler(enabled=precision != "fp32")
    tr.attach_scaler(sc)
    w = torch.randn(8, 1)
    for s in range(steps):
        g = torch.Generator().manual_seed(s)
        x = torch.randn(32, 8, generator=g)
        y = x @ w
        for group in opt.param_groups:
            group["lr"] = lr * lr_growth ** s
        m.gate.gain = 1e6 if s in bad_steps else 1.0
        opt.zero_grad()
        with tr.autocast():
            loss = nn.functional.mse_loss(m(x).float(), y)
        sc.scale(loss).backward()
        if clip:
            sc.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(m.parameters(), clip)
        sc.step(opt)
        sc.update()
        tr.end_step(loss=loss, optimizer=opt)
    tr.close()
    return ampprobe.postmortem(path)


# ---- a finite loss that diverges ------------------------------------------------


@pytest.mark.parametrize("precision,steps", [("fp32", 100), ("fp16", 80)])
def test_finite_divergence_is_degraded(tmp_path, precision, steps):
    """The lr grows 10% a step, the clipped updates keep every value finite:
    the loss falls to ~0.2, then climbs by 1000x or more. Degraded, with a
    lower-lr finding that names the rise, a layer that grew and the lr."""
    pm = job(str(tmp_path / "t.h5"), steps, precision, lr=0.01, lr_growth=1.1,
             clip=1.0)
    assert pm["verdict"] == "degraded", (pm["verdict"], ids(pm))
    f = pm["diagnosis"][0]
    t = texts(f)
    assert f["id"] == "lower-lr", ids(pm)
    assert "diverged while staying finite" in f["title"], t
    assert "grew first" in t and "learning rate rose" in t, t
    assert "lower the learning rate" in f["next_step"], t
    assert ("not a precision problem" in t) == (precision == "fp32"), t


@pytest.mark.parametrize("lr,clip", [(0.01, 1.0), (0.1, None), (0.3, None)])
def test_converging_or_noisy_loss_is_healthy(tmp_path, lr, clip):
    """The same job at a constant lr: it converges (0.01, 0.1) or wanders
    noisily near its minimum (0.3, up to 50x on single steps, ~4x in the
    median): healthy."""
    pm = job(str(tmp_path / "t.h5"), 100, "fp32", lr=lr, clip=clip)
    assert pm["verdict"] == "healthy", (pm["verdict"], pm["diagnosis"])


# ---- a streak of skipped steps ------------------------------------------------


def test_skip_streak_is_degraded(tmp_path):
    """Steps 40..51: the gate's backward overflows the scaled gradients in
    FP16; the scaler skips 12 steps in a row, halving the scale each time,
    then the run trains again. Degraded, the streak and the gate named."""
    pm = job(str(tmp_path / "t.h5"), 100, bad_steps=set(range(40, 52)))
    assert pm["verdict"] == "degraded", (pm["verdict"], ids(pm))
    f = pm["diagnosis"][0]
    t = texts(f)
    assert f["id"] == "skip-streak", ids(pm)
    assert "12 consecutive steps were skipped" in f["title"], t
    assert "steps 40..51" in f["title"], t
    assert "'gate'" in t, t
    # the scale halved at each of the 12 skips
    m = re.search(r"loss scale ([0-9.e+]+) at step 40, ([0-9.e+]+) when the run "
                  r"stepped again at step 52", t)
    assert m and float(m.group(1)) / float(m.group(2)) == 2 ** 12, t


@pytest.mark.parametrize("bad", [(), (40,), (30, 60), (50, 51)])
def test_isolated_skips_are_healthy(tmp_path, bad):
    """No overflow, one, two apart, or two in a row (hysteresis-like): the
    scaler's routine, healthy."""
    pm = job(str(tmp_path / "t.h5"), 100, bad_steps=set(bad))
    assert pm["verdict"] == "healthy", (pm["verdict"], pm["diagnosis"])
