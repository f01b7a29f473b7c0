"""The PyTorch tracer on jobs that a defect hunt (2026-12-04) found it
broke or misread, each case failing before its fix (the sections below):
a tensor given twice, rounded under FP16 emulation into two; forwards
under torch.inference_mode() inside a step; lazy modules not yet
materialised; at.LossScaler with two optimizers; TorchScript modules in
the model; modules added after the Tracer; close() with a step open."""
import collections
import copy
import gc
import math
import warnings

import pytest

torch = pytest.importorskip("torch")
import torch.nn as nn  # noqa: E402

import ampprobe  # noqa: E402
import ampprobe.torch as at  # noqa: E402

torch.set_num_threads(1)

SITES = ampprobe._lib.SITES


def records(path):
    t = ampprobe.read_trace(path)
    names = [n.decode() if isinstance(n, bytes) else n
             for n in t["layers"]["name"]]
    return t, names


def site_counts(path, step=None):
    """Counter of (layer name, site) over the records (of one step)."""
    t, names = records(path)
    r = t["records"]
    if step is not None:
        r = r[r["step"] == step]
    return collections.Counter((names[x["layer"]], SITES[x["site"]])
                               for x in r)


def ampprobe_warnings(w):
    return [str(x.message) for x in w if "ampprobe" in str(x.message)]


# ---- forwards under torch.inference_mode() ------------------------------------

class Teacher(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.act = nn.ReLU(inplace=True)
        self.proj = nn.Linear(8, 4)

    def forward(self, x):
        return self.proj(self.act(self.fc(x)))


class InferDistill(nn.Module):
    def __init__(self, teacher_first):
        super().__init__()
        self.student, self.teacher = Teacher(), Teacher()
        self.teacher_first = teacher_first
        for p in self.teacher.parameters():
            p.requires_grad_(False)

    def forward(self, x):
        if self.teacher_first:
            with torch.inference_mode():
                t = self.teacher(x)
            s = self.student(x)
        else:
            s = self.student(x)
            with torch.inference_mode():
                t = self.teacher(x)
        return ((s - t.clone()) ** 2).mean()


@pytest.mark.parametrize("emulate", [False, True])
@pytest.mark.parametrize("teacher_first", [False, True])
def test_inference_mode_teacher_inside_the_step(tmp_path, teacher_first,
                                                emulate):
    """A teacher run under torch.inference_mode() inside the training
    forward is recorded as a no_grad one (its forward sites, no
    gradients), and on_nonfinite names it; the job died at its first
    output ("Inference tensors do not track version counter")."""
    torch.manual_seed(0)
    m = InferDistill(teacher_first)
    p = str(tmp_path / "d.h5")
    tr = at.Tracer(m, p, emulate_fp16=emulate, on_nonfinite="raise",
                   env=False)
    opt = torch.optim.SGD(m.student.parameters(), 1e-3)
    with pytest.raises(at.NonFiniteError) as e:
        for step in range(3):
            if step == 1:
                with torch.no_grad():
                    m.teacher.fc.weight.fill_(float("inf") if not emulate
                                              else 1e4)
            x = torch.randn(4, 8, generator=torch.Generator().manual_seed(
                step)).abs() + 1
            loss = m(x)
            opt.zero_grad()
            loss.backward()
            opt.step()
            tr.end_step(loss=loss, optimizer=opt)
    v = e.value
    if emulate:  # a finite weight, an output beyond binary16's range
        assert (v.module, v.site, v.step) == ("teacher.fc", "fwd_out", 1), \
            str(v)
    else:  # the inf weight as used
        assert (v.module, v.site, v.step) == ("teacher.fc", "weight", 1), \
            str(v)
    c = site_counts(p, step=0)
    assert c[("teacher.fc", "fwd_out")] == c[("student.fc", "fwd_out")] == 1
    assert c[("teacher.act", "fwd_in")] == 1
    assert not [k for k in c if k[0].startswith("teacher.") and
                k[1] in ("grad_out", "grad_in", "weight_grad")]


@pytest.mark.parametrize("emulate", [False, True])
def test_an_inference_only_job_with_explicit_steps(tmp_path, emulate):
    """begin_step(); with torch.inference_mode(): model(x); end_step():
    the same records as under no_grad, and a NaN in the data at step 1
    named at the input."""
    def run(path, ctx):
        torch.manual_seed(0)
        m = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.LayerNorm(16),
                          nn.Linear(16, 4)).eval()
        tr = at.Tracer(m, path, emulate_fp16=emulate, on_nonfinite="warn",
                       env=False)
        outs = []
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            for s in range(3):
                x = torch.randn(4, 8, generator=torch.Generator().manual_seed(s))
                if s == 1:
                    x[0, 0] = float("nan")
                tr.begin_step()
                with ctx():
                    outs.append(m(x).clone())
                tr.end_step()
        tr.close()
        return outs, [str(x.message) for x in w
                      if issubclass(x.category, at.NonFiniteWarning)]
    a, wa = run(str(tmp_path / "n.h5"), torch.no_grad)
    b, wb = run(str(tmp_path / "i.h5"), torch.inference_mode)
    assert all(torch.equal(u, v) for u, v in zip(a, b) if s_finite(u))
    assert len(wb) == 1 and "step 1" in wb[0] and "module 'input'" in wb[0], wb
    assert wa == wb
    ca, cb = site_counts(str(tmp_path / "n.h5")), site_counts(str(tmp_path / "i.h5"))
    assert ca == cb and ca[("3", "fwd_out")] == 3


def s_finite(t):
    return bool(torch.isfinite(t).all())


@pytest.mark.parametrize("mode", ["full", "scalars_scanned"])
def test_an_inplace_module_under_inference_mode(tmp_path, mode):
    """An in-place ReLU turns the -inf of the Linear before it into 0,
    under inference_mode: the event is still named at the Linear's
    fwd_out with the counts as recorded - by libprobe (full), or, where
    the tracer scans the tensors itself (scalars mode without flight
    recorder or snapshots), from the counts taken before the in-place
    module ran (an inference tensor has no version to tell it changed)."""
    m = nn.Sequential(nn.Linear(3, 3), nn.ReLU(inplace=True), nn.Linear(3, 1))
    with torch.no_grad():
        m[0].weight.copy_(-10 * torch.eye(3))
        m[0].bias.zero_()
    x = torch.tensor([[3e38, 1.0, 1.0], [3e38, 1.0, 1.0]])
    kw = dict(mode="scalars", ring_steps=0, snapshot_on_nonfinite=False) \
        if mode == "scalars_scanned" else {}
    tr = at.Tracer(m, str(tmp_path / "p.h5"), on_nonfinite="raise",
                   env=False, **kw)
    tr.begin_step()
    with torch.inference_mode():
        y = m(x)
    assert bool(torch.isfinite(y).all())
    with pytest.raises(at.NonFiniteError) as e:
        tr.end_step()
    assert e.value.module == "0" and e.value.site == "fwd_out", str(e.value)
    assert "(0 NaN, 0 +inf, 2 -inf of 6)" in str(e.value)


# ---- one rounded copy per distinct tensor -------------------------------------

class Twice(nn.Module):
    """Returns the same tensor twice."""

    def forward(self, h):
        return h, h


class Same(nn.Module):
    """Notes whether its three arguments are one tensor (self-attention's
    `query is key is value`, which MultiheadAttention's fast path and its
    packed projection test)."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def forward(self, q, k, v):
        self.seen.append(q is k and k is v)
        return q + k + v


class IdNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.twice = Twice()
        self.same = Same()
        self.head = nn.Linear(4, 1)
        self.pair = []

    def forward(self, x):
        a, b = self.twice(self.fc(x))
        self.pair.append(a is b)
        return self.head(self.same(a, a, b))


@pytest.mark.parametrize("case", ["grad", "no_grad_between_steps",
                                  "no_grad_inside_the_step",
                                  "inference_mode_inside_the_step",
                                  "copy_of_the_model", "closed_tracer",
                                  "fp32_forced_under_autocast"])
def test_one_rounded_copy_per_tensor(tmp_path, case):
    """A tensor a module gets twice (or returns twice) is one tensor after
    the tracer rounded it (FP16 emulation) or cast it up (a module forced
    to FP32), in every path: the training forward, no_grad and
    inference_mode passes between steps or inside one, an untraced copy.
    Each argument was rounded separately (only the training forward's
    pre-hook kept one handle per tensor), so `q is k is v` failed."""
    torch.manual_seed(0)
    m = IdNet()
    kw = dict(emulate_fp16=True)
    if case == "fp32_forced_under_autocast":
        kw = dict(precision="bf16", fp32="same")
    tr = at.Tracer(m, str(tmp_path / "i.h5"), env=False, **kw)
    x = torch.randn(3, 4)
    run = m
    with tr.autocast():
        if case == "grad":
            m(x).sum().backward()
        elif case == "no_grad_between_steps":
            with torch.no_grad():
                m(x)
        elif case == "no_grad_inside_the_step":
            m(x).sum().backward()
            with torch.no_grad():
                m(x)
        elif case == "inference_mode_inside_the_step":
            m(x).sum().backward()
            with torch.inference_mode():
                m(x)
        elif case == "copy_of_the_model":
            run = copy.deepcopy(m)
            run(x).sum().backward()
        elif case == "closed_tracer":
            tr.close()
            m(x)
        else:
            m(x).float().sum().backward()
    tr.close()
    assert run.pair and all(run.pair), run.pair  # Twice's outputs
    assert run.same.seen and all(run.same.seen), run.same.seen


def _encoder():
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0,
                                       batch_first=True)
    return nn.TransformerEncoder(layer, 2)


@pytest.mark.parametrize("emulate", [False, True])
@pytest.mark.parametrize("where", ["between_steps", "inside_the_step",
                                   "inference_mode_inside_the_step"])
def test_transformer_encoder_evaluation_with_a_padding_mask(tmp_path, where,
                                                            emulate):
    """An eval pass (no_grad or inference_mode, a key padding mask) of a
    TransformerEncoder: torch turns its input into a NestedTensor, which
    only MultiheadAttention's fast path takes, and only for `query is key
    is value`. Under emulation the no_grad pre-hook rounded the three
    into three copies: "MultiheadAttention does not support NestedTensor
    outside of its fast path" (torch 2). The output is the untraced one's
    (the same without emulation; within binary16 rounding with it), and
    inside a step the nested tensors are recorded."""
    x = torch.randn(3, 6, 16, generator=torch.Generator().manual_seed(1))
    pad = torch.zeros(3, 6, dtype=torch.bool)
    pad[1, 4:] = True
    ref = _encoder().eval()
    with torch.no_grad():
        want = ref(x, src_key_padding_mask=pad)
    m = _encoder()
    p = str(tmp_path / "e.h5")
    tr = at.Tracer(m, p, emulate_fp16=emulate, env=False)
    m.train()
    loss = m(x, src_key_padding_mask=pad).square().mean()
    loss.backward()
    if where == "between_steps":
        tr.end_step(loss=loss)
    m.eval()
    ctx = torch.inference_mode() if where.startswith("inference") \
        else torch.no_grad()
    calls = []  # torch 1.13's eval path runs the layer fused, not its MHA
    h = m.layers[0].self_attn.register_forward_pre_hook(
        lambda mod, args: calls.append(1))
    with ctx:
        got = m(x, src_key_padding_mask=pad)
    h.remove()
    if where != "between_steps":
        tr.end_step(loss=loss)
    tr.close()
    got = got.clone() if got.is_inference() else got
    if emulate:
        assert torch.allclose(got, want, atol=2e-2), (got - want).abs().max()
    else:
        assert torch.equal(got, want)
    c = site_counts(p, step=0)
    inside = where != "between_steps"  # the eval pass recorded, nested
    assert c[("input", "fwd_out")] == (2 if inside else 1), c
    assert c[("layers.0.self_attn", "fwd_out")] == 1 + (len(calls) if inside
                                                        else 0), c


# ---- lazy modules -------------------------------------------------------------

class LazyNet(nn.Module):
    def __init__(self, lazy):
        super().__init__()
        L = (lambda n: nn.LazyLinear(n)) if lazy else (lambda n: nn.Linear(8, n))
        self.fc = L(16)
        self.conv = nn.LazyConv1d(4, 3) if lazy else nn.Conv1d(1, 4, 3)
        self.bn = nn.LazyBatchNorm1d() if lazy else nn.BatchNorm1d(4)
        self.head = nn.LazyLinear(1) if lazy else nn.Linear(56, 1)

    def forward(self, x):
        h = torch.relu(self.fc(x)).unsqueeze(1)
        return self.head(self.bn(self.conv(h)).flatten(1))


def _lazy_job(path, lazy, emulate, steps=3, digest=False):
    torch.manual_seed(0)
    m = LazyNet(lazy)
    tr = at.Tracer(m, path, emulate_fp16=emulate, weight_digest=digest,
                   env=False) if path else None
    out = []
    opt = None
    for s in range(steps):
        g = torch.Generator().manual_seed(s)
        x, y = torch.randn(4, 8, generator=g), torch.randn(4, 1, generator=g)
        loss = ((m(x) - y) ** 2).mean()
        if opt is None:  # after the lazy parameters are materialised
            opt = torch.optim.SGD(m.parameters(), 0.05)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if tr is not None:
            tr.end_step(loss=loss, optimizer=opt)
        out.append(float(loss))
    if tr is not None:
        tr.close()
    return out


@pytest.mark.parametrize("emulate", [False, True])
def test_lazy_modules_are_traced_from_their_first_forward(tmp_path, emulate):
    """A Tracer made before the lazy modules' first forward (the usual
    order: build, trace, train): register_hook on an
    UninitializedParameter raised in Tracer(). Their parameters are
    hooked when the first forward materialises them: from step 0 on, the
    same records as an eagerly built twin (weight, weight_grad,
    master_weight of every layer), and the job trains as untraced."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch: lazy modules are new
        untraced = _lazy_job(None, True, False)
        got = _lazy_job(str(tmp_path / "l.h5"), True, emulate, digest=True)
        _lazy_job(str(tmp_path / "e.h5"), False, emulate, digest=True)
    if not emulate:
        assert got == untraced
    lazy, eager = site_counts(str(tmp_path / "l.h5")), \
        site_counts(str(tmp_path / "e.h5"))
    assert lazy == eager
    for layer in ("fc", "conv", "bn", "head"):
        for site in ("weight", "weight_grad", "master_weight"):
            assert site_counts(str(tmp_path / "l.h5"), 0)[(layer, site)] == 2, \
                (layer, site)
    t, _ = records(str(tmp_path / "l.h5"))
    assert (t["steps"]["unmeasured"] & ampprobe._lib.SCALAR_WEIGHT_DIGEST
            == 0).all()


def test_a_lazy_module_first_run_in_a_later_step(tmp_path):
    """A lazy branch the model runs from step 2 on: nothing of it before
    (no master weight of an uninitialised parameter), everything after;
    a no_grad warm-up pass materialising another one between steps gives
    it its gradient hook at its next training forward."""
    class Branchy(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(8, 8)
            self.late = nn.LazyLinear(8)
            self.warm = nn.LazyLinear(1)
            self.use_late = False

        def forward(self, x):
            h = self.a(x)
            if self.use_late:
                h = self.late(h)
            return self.warm(h)
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m = Branchy()
        p = str(tmp_path / "b.h5")
        tr = at.Tracer(m, p, env=False)
        with torch.no_grad():
            m(torch.randn(2, 8))  # warm-up: materialises `warm`
        for step in range(4):
            m.use_late = step >= 2
            loss = m(torch.randn(4, 8)).square().mean()
            loss.backward()  # (no optimizer: the gradients are the point)
            tr.end_step(loss=loss)
        tr.close()
    for step in range(4):
        c = site_counts(p, step)
        assert c[("warm", "weight_grad")] == 2 and c[("warm", "master_weight")] == 2
        n = 2 if step >= 2 else 0
        assert c[("late", "weight_grad")] == n and c[("late", "master_weight")] == n, \
            (step, c)


def test_an_overflow_in_a_lazy_module_is_named(tmp_path):
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m = nn.Sequential(nn.LazyLinear(8), nn.ReLU(), nn.Linear(8, 1))
        tr = at.Tracer(m, str(tmp_path / "o.h5"), emulate_fp16=True,
                       on_nonfinite="raise", env=False)
        with pytest.raises(at.NonFiniteError) as e:
            for step in range(3):
                x = torch.randn(4, 8)
                if step == 2:
                    with torch.no_grad():
                        m[0].weight.fill_(100.0)
                    x = torch.full((4, 8), 100.0)  # 8 * 100 * 100 > 65504
                m(x).square().mean().backward()
                tr.end_step()
    assert (e.value.module, e.value.site, e.value.step) == ("0", "fwd_out", 2), \
        str(e.value)


# ---- at.LossScaler: its state per optimizer -----------------------------------

def _two(scale=1024.0, bad=None):
    """Two Linear heads with their own SGD, the gradients of both scaled
    by the scaler (bad: the head whose gradients get an inf)."""
    torch.manual_seed(0)
    a, b = nn.Linear(4, 1), nn.Linear(4, 1)
    oa = torch.optim.SGD(a.parameters(), lr=0.1)
    ob = torch.optim.SGD(b.parameters(), lr=0.1)
    x = torch.randn(8, 4, generator=torch.Generator().manual_seed(0))
    loss = a(x).square().mean() + b(x).square().mean()
    (loss * scale).backward()
    if bad is not None:
        with torch.no_grad():
            (a, b)[bad].weight.grad[0, 0] = float("inf")
    return a, b, oa, ob


@pytest.mark.parametrize("how", ["step_both", "unscale_one_first",
                                 "unscale_both_first", "three_steps"])
def test_loss_scaler_unscales_each_optimizer(how):
    """Each optimizer steps with its true gradient: the scaler-wide
    'unscaled' flag made the second optimizer's unscale_ a no-op, so it
    stepped with gradient x scale (x1024 here) and its gradients were
    never checked."""
    scale = 1024.0
    for step in range(3 if how == "three_steps" else 1):
        a, b, oa, ob = _two(scale)
        true = [p.grad.clone() / scale for p in (a.weight, b.weight)]
        before = [p.detach().clone() for p in (a.weight, b.weight)]
        if step == 0:
            sc = at.LossScaler(init_scale=scale, growth_interval=100)
        if how == "unscale_one_first":  # clipping of the first only
            sc.unscale_(oa)
        elif how == "unscale_both_first":
            sc.unscale_(oa)
            sc.unscale_(ob)
        sc.step(oa)
        sc.step(ob)
        sc.update()
        for w, w0, g in zip((a.weight, b.weight), before, true):
            assert torch.allclose(w0 - w.detach(), 0.1 * g, rtol=1e-5,
                                  atol=1e-6), how
    assert sc.get_scale() == scale and sc._get_growth_tracker() == (
        3 if how == "three_steps" else 1)


@pytest.mark.parametrize("bad", [0, 1])
def test_loss_scaler_skips_the_optimizer_whose_gradients_overflowed(bad):
    """As GradScaler: the optimizer whose gradients hold inf skips its
    step, the other steps, and update() backs the scale off; the next
    clean iteration counts from 0. Checked against torch.amp.GradScaler
    where it runs on the CPU (torch 2)."""
    def run(make):
        a, b, oa, ob = _two(1024.0, bad)
        before = [p.detach().clone() for p in (a.weight, b.weight)]
        sc = make()
        rets = [sc.step(oa), sc.step(ob)]
        sc.update()
        moved = [not torch.equal(w0, w.detach())
                 for w0, w in zip(before, (a.weight, b.weight))]
        return moved, sc.get_scale(), [a.weight.detach(), b.weight.detach()], rets
    moved, scale, ws, rets = run(lambda: at.LossScaler(init_scale=1024.0))
    assert moved == [bad != 0, bad != 1]
    assert scale == 512.0 and rets == [None, None]
    amp = getattr(torch, "amp", None)
    if amp is not None and hasattr(amp, "GradScaler"):
        try:
            ref = run(lambda: amp.GradScaler("cpu", init_scale=1024.0))
        except (TypeError, RuntimeError, AssertionError):
            ref = None  # (torch 1.13: no CPU GradScaler)
        if ref is not None:
            assert ref[0] == moved and ref[1] == scale
            assert all(torch.equal(u, v) for u, v in zip(ref[2], ws))


def test_loss_scaler_refuses_what_gradscaler_refuses():
    """The same misuses raise the same errors as GradScaler (a job moving
    between the two behaves the same); a disabled scaler checks
    nothing."""
    a, b, oa, ob = _two()
    sc = at.LossScaler(init_scale=1024.0)
    with pytest.raises(AssertionError, match="No inf checks"):
        sc.update()
    sc.unscale_(oa)
    with pytest.raises(RuntimeError, match="already been called"):
        sc.unscale_(oa)
    sc.step(oa)
    with pytest.raises(RuntimeError, match="after step"):
        sc.unscale_(oa)
    with pytest.raises(RuntimeError, match="already been called"):
        sc.step(oa)
    with pytest.raises(RuntimeError, match="Closure"):
        sc.step(ob, closure=lambda: 0.0)
    sc.step(ob)
    sc.update()
    sc.unscale_(oa)  # a new iteration
    off = at.LossScaler(enabled=False)
    off.unscale_(oa)
    off.unscale_(oa)
    off.step(oa)
    off.step(oa)
    off.update()
    assert off.get_scale() == 1.0


class TwoHeads(nn.Module):
    def __init__(self):
        super().__init__()
        self.enc = nn.Sequential(nn.Linear(8, 16), nn.ReLU())
        self.h1 = nn.Linear(16, 1)
        self.h2 = nn.Linear(16, 1)

    def forward(self, x):
        h = self.enc(x)
        return self.h1(h), self.h2(h)


def test_two_optimizers_under_emulation_train_as_with_gradscaler(tmp_path):
    """The hunt's job: two heads, two optimizers, FP16 emulation and one
    at.LossScaler. Its loss went 1.8 -> 59 -> 255 (the second head stepped
    with x scale gradients) and the trace reported gradient overflows;
    now it trains (the loss falls) and is healthy, as with
    torch.amp.GradScaler (torch 2: the same losses)."""
    def run(path, make):
        torch.manual_seed(0)
        m = TwoHeads()
        o1 = torch.optim.SGD(list(m.enc.parameters()) + list(m.h1.parameters()), 0.05)
        o2 = torch.optim.SGD(m.h2.parameters(), 0.05)
        sc = make()
        tr = at.Tracer(m, path, emulate_fp16=True, env=False)
        tr.attach_scaler(sc)
        out = []
        for s in range(8):
            g = torch.Generator().manual_seed(s % 2)
            x, y = torch.randn(16, 8, generator=g), torch.randn(16, 1, generator=g)
            p1, p2 = m(x)
            loss = ((p1 - y) ** 2).mean() + ((p2 - y) ** 2).mean()
            o1.zero_grad()
            o2.zero_grad()
            sc.scale(loss).backward()
            sc.unscale_(o1)  # clipping what o1 steps
            nn.utils.clip_grad_norm_(o1.param_groups[0]["params"], 10.0)
            sc.step(o1)
            sc.step(o2)
            sc.update()
            tr.end_step(loss=loss)
            out.append(float(loss))
        tr.close()
        return out
    got = run(str(tmp_path / "l.h5"), lambda: at.LossScaler(init_scale=2.0 ** 10))
    assert got[-2] < got[0] and got[-1] < got[1], got  # (2 batches)
    assert ampprobe.verdict(str(tmp_path / "l.h5")) == "healthy"
    try:
        ref = run(str(tmp_path / "g.h5"),
                  lambda: torch.amp.GradScaler("cpu", init_scale=2.0 ** 10))
    except (AttributeError, TypeError, RuntimeError):
        return  # torch 1.13: no CPU GradScaler
    assert ref == got


# ---- TorchScript modules ------------------------------------------------------

def _jit_net(how, whole=False):
    torch.manual_seed(0)
    blk = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 16))
    if whole:
        m = nn.Sequential(nn.Linear(8, 16), blk, nn.Linear(16, 1))
        return torch.jit.script(m) if how == "script" else \
            torch.jit.trace(m, torch.randn(2, 8))
    blk = torch.jit.script(blk) if how == "script" else \
        torch.jit.trace(blk, torch.randn(2, 16))
    return nn.Sequential(nn.Linear(8, 16), blk, nn.Linear(16, 1))


def _jit_job(m, path, emulate, steps=2):
    opt = torch.optim.SGD(m.parameters(), 0.01)
    out = []
    tr = None
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        if path:
            tr = at.Tracer(m, path, emulate_fp16=emulate, env=False)
        for s in range(steps):
            x = torch.randn(4, 8, generator=torch.Generator().manual_seed(s))
            loss = m(x).square().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            if tr:
                tr.end_step(loss=loss, optimizer=opt)
            out.append(float(loss))
        if tr:
            tr.close()
    return out, ampprobe_warnings(w)


@pytest.mark.parametrize("emulate", [False, True])
@pytest.mark.parametrize("whole", [False, True])
def test_a_scripted_module_is_one_layer_it_cannot_look_into(tmp_path, whole,
                                                            emulate):
    """torch.jit.script in the model, or as the model: Tracer() raised
    "register_forward_pre_hook is not supported on ScriptModules". Now
    the script module is one layer with its parameters' weight_grad and
    master_weight, no forward site, one warning naming it (and no
    misleading "forward ran without the tracer's hooks"), and the job
    runs as untraced."""
    p = str(tmp_path / "s.h5")
    want, _ = _jit_job(_jit_net("script", whole), None, False)
    got, said = _jit_job(_jit_net("script", whole), p, emulate)
    if not emulate or whole:  # (a whole script model: nothing rounded)
        assert got == want
    name = "1" if not whole else records(p)[1][-1]
    assert len(said) == 1 and "'%s' is TorchScript" % name in said[0], said
    c = site_counts(p, 1)
    assert {s for (n, s) in c if n == name} == {"weight_grad", "master_weight"}
    assert c[(name, "weight_grad")] == (4 if not whole else 8)
    t, names = records(p)
    assert list(t["steps"]["step"]) == [0, 1]
    if not whole:
        assert c[("0", "fwd_out")] == 1 and c[("2", "fwd_in")] == 1
        assert not [n for n in names if n.startswith("1.")]


@pytest.mark.parametrize("whole", [False, True])
def test_a_traced_module_is_one_unit(tmp_path, whole):
    """torch.jit.trace'd: the modules inside have hooks that never run
    (they were listed as layers with gradients and no forward, silently);
    the traced module's own hooks run, so it is one unit, recorded and
    rounded at its boundary, with one warning. An overflow made inside it
    is named there."""
    p = str(tmp_path / "t.h5")
    m = _jit_net("trace", whole)
    got, said = _jit_job(m, p, True)
    unit = "1" if not whole else records(p)[1][-1]
    assert len(said) == 1 and "'%s' is a torch.jit.trace'd module" % unit in \
        said[0], said
    c = site_counts(p, 1)
    have = {s for (n, s) in c if n == unit}
    assert {"fwd_in", "fwd_out", "weight_grad", "master_weight"} <= have, have
    if not whole:
        assert "grad_out" in have and "grad_in" in have
    t, names = records(p)
    inside = [n for n in names if n.startswith(unit + ".")]
    if whole:
        inside += [n for n in names if n in ("0", "1", "2")]
    assert not inside, names
    # an overflow inside the traced module, named at it: 3 x 8 = 24 into
    # it, 16 x 24 = 384 inside (not rounded), 20 x 16 x 384 > 65504 out
    m = _jit_net("trace", whole)
    ps = dict(m.named_parameters())
    with torch.no_grad():
        for n, v in (("0", 1.0), ("1.0", 1.0), ("1.2", 20.0), ("2", 1.0)):
            ps[n + ".weight"].fill_(v)
            ps[n + ".bias"].zero_()
    tr = at.Tracer(m, str(tmp_path / "o.h5"), emulate_fp16=True,
                   on_nonfinite="raise", env=False)
    with pytest.raises(at.NonFiniteError) as e:
        m(torch.full((4, 8), 3.0)).square().mean().backward()
        tr.end_step()
    assert e.value.module == unit and e.value.site == "fwd_out", str(e.value)


# ---- modules added after the Tracer -------------------------------------------

class Growing(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 8), nn.ReLU())
        self.head = nn.Linear(8, 1)
        self.extra = None

    def forward(self, x):
        h = self.body(x)
        if self.extra is not None:
            h = self.extra(h)
        return self.head(h)


@pytest.mark.parametrize("how", ["added", "replaced", "appended", "none",
                                 "parametrized", "lazy", "train_eval"])
def test_modules_added_after_the_tracer_warn_once(tmp_path, how):
    """A module the model gets after the Tracer hooked it has no hooks:
    not recorded, and said once, at the next end_step, naming it (it was
    silent, and a post-mortem named a module 'fed by' the wrong one).
    What changes no traced unit says nothing: a parametrization
    registered on a traced layer, a lazy module materialised, train() and
    eval()."""
    torch.manual_seed(0)
    m = Growing()
    if how == "lazy":
        m.extra = nn.LazyLinear(8)
    p = str(tmp_path / "g.h5")
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        tr = at.Tracer(m, p, env=False)
        for step in range(4):
            if step == 1:
                if how == "added":
                    m.extra = nn.Linear(8, 8)
                elif how == "replaced":
                    m.head = nn.Linear(8, 1)  # fine-tuning's new head
                elif how == "appended":
                    m.body.append(nn.Tanh())
                elif how == "parametrized":
                    nn.utils.parametrize.register_parametrization(
                        m.head, "weight", _Scale())
                elif how == "train_eval":
                    m.eval()
                    m.train()
            m(torch.randn(4, 8)).square().mean().backward()
            tr.end_step()
        tr.close()
    said = [s for s in ampprobe_warnings(w) if "added to the model" in s]
    want = {"added": "extra", "replaced": "head", "appended": "body.2"}.get(how)
    if want is None:
        assert not said, said
    else:
        assert len(said) == 1, said
        assert "step 1: module '%s' is not traced" % want in said[0], said


class _Scale(nn.Module):
    def forward(self, w):
        return w * 1.0


# ---- close() with a step open -------------------------------------------------

@pytest.mark.parametrize("how", ["forward_after_the_last_step",
                                 "exception_in_the_step", "collected",
                                 "explicit_begin_step"])
def test_close_ends_a_step_left_open(tmp_path, how):
    """A step open at close() (a validation forward under grad after the
    last end_step, a job that raised in the middle of a step, a tracer
    collected without close()) is ended with its scalars not measured:
    the steps table has it, as the records do (its records were written
    but its steps row not: a post-mortem named an event at a step the
    table did not have)."""
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 1))
    p = str(tmp_path / "c.h5")
    tr = at.Tracer(m, p, env=False)
    opt = torch.optim.SGD(m.parameters(), 0.1)
    for s in range(2):
        loss = m(torch.randn(3, 4)).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        tr.end_step(loss=loss, optimizer=opt)
    nan = torch.full((3, 4), float("nan"))
    if how == "forward_after_the_last_step":
        m(nan)  # validation without no_grad: opens step 2
        tr.close()
    elif how == "exception_in_the_step":
        with pytest.raises(ZeroDivisionError):
            with tr:
                m(nan).sum().backward()
                1 / 0
    elif how == "explicit_begin_step":
        tr.begin_step(7)
        with torch.no_grad():
            m(nan)
        tr.close()
    else:
        m(nan)
        del tr
        gc.collect()
    last = 7 if how == "explicit_begin_step" else 2
    t, _ = records(p)
    st = t["steps"]
    assert list(st["step"]) == [0, 1, last]
    assert sorted(set(t["records"]["step"].tolist())) == [0, 1, last]
    assert math.isnan(st["loss"][2]) and st["unmeasured"][2] & ampprobe._lib.SCALAR_LOSS
    assert not st["unmeasured"][1] & ampprobe._lib.SCALAR_LOSS
    ev = ampprobe.postmortem(p)["event"]
    assert ev["kind"] == "input-nan" and ev["step"] == last, ev
    if how == "exception_in_the_step":
        # the exception marks the trace aborted, naming the half-done step
        # (it read complete: hunt F1)
        assert t["info"]["complete"] == 0
        assert t["info"]["aborted"] == "exception ZeroDivisionError"
        assert t["info"]["aborted_step"] == last
    else:
        assert t["info"]["complete"] == 1
        assert t["info"]["aborted"] == ""
    m(torch.randn(3, 4)).sum().backward()  # the model runs on


# ---- units whose children are not layers own every parameter under them ----------
# nn.MultiheadAttention is one unit (its children are not walked), and its
# forward uses out_proj's weight and bias without calling out_proj: those
# parameters had no weight, weight_grad or master_weight record, and a NaN
# in them was named elsewhere (found 2026-12-04). The same holds for a class
# the user maps to a kind, whose children are not layers either.

class AttnNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.att = nn.MultiheadAttention(16, 2, batch_first=True)
        self.head = nn.Linear(16, 1)

    def forward(self, x):
        a, _ = self.att(x, x, x)
        return self.head(a).mean()


class Block(nn.Module):  # mapped to a kind: one unit with two children
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(16, 16)
        self.b = nn.Linear(16, 16)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


class BlockNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.blk = Block()
        self.head = nn.Linear(16, 1)

    def forward(self, x):
        return self.head(self.blk(x)).mean()


def _train(m, path, steps=3, poison=None, **kw):
    torch.manual_seed(1)
    opt = torch.optim.SGD(m.parameters(), lr=0.01)
    tr = at.Tracer(m, path, mode="full", env=False, **kw)
    for step in range(steps):
        if poison is not None and step == 2:
            with torch.no_grad():
                poison().view(-1)[0] = float("nan")
        x = torch.randn(4, 5, 16)
        loss = m(x)
        opt.zero_grad()
        loss.backward()
        opt.step()
        tr.end_step(loss=loss, optimizer=opt)
    tr.close()


@pytest.mark.parametrize("net", ["attention", "mapped"])
@pytest.mark.parametrize("emulate", [False, True])
def test_a_unit_owns_its_childrens_parameters(tmp_path, net, emulate):
    torch.manual_seed(0)
    m = AttnNet() if net == "attention" else BlockNet()
    kw = {"kinds": {Block: "attention"}} if net == "mapped" else {}
    p = str(tmp_path / "u.h5")
    _train(m, p, emulate_fp16=emulate, **kw)
    unit = "att" if net == "attention" else "blk"
    c = site_counts(p, step=1)
    n = len(list(getattr(m, unit).parameters()))  # 4 either way
    assert n == 4
    for site in ("weight", "weight_grad", "master_weight"):
        assert c[(unit, site)] == n, (site, c)


@pytest.mark.parametrize("net", ["attention", "mapped"])
def test_a_nan_in_a_childs_parameter_is_named_at_the_unit(tmp_path, net):
    torch.manual_seed(0)
    m = AttnNet() if net == "attention" else BlockNet()
    kw = {"kinds": {Block: "attention"}} if net == "mapped" else {}
    target = (lambda: m.att.out_proj.weight) if net == "attention" else \
        (lambda: m.blk.b.weight)
    p = str(tmp_path / "n.h5")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _train(m, p, steps=4, poison=target, **kw)
    ev = ampprobe.postmortem(p)["event"]
    assert ev["step"] == 2, ev
    assert ev["origin_layer"] == ("att" if net == "attention" else "blk"), ev
    assert ev["origin_site"] in ("weight", "master_weight"), ev
