"""The PyTorch tracer: planted FP16 overflows under emulation are named by
the post-mortem and by on_nonfinite; bf16 autocast is healthy; the policy
from the environment; record selection; scalars; what is recorded."""
import math
import os
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.nn as nn  # noqa: E402

import ampprobe  # noqa: E402
import ampprobe.torch as at  # noqa: E402
from ampprobe._lib import SITES  # noqa: E402
from conftest import cpu_fp16_autocast  # noqa: E402
from models import (PLANTED, Net, ProbNLL, RevINLike, big_weights,  # noqa: E402
                    data, train)

torch.set_num_threads(1)


def make(tmp_path, name="t.h5", seed=0, **kw):
    torch.manual_seed(seed)
    model = Net()
    loss_fn = ProbNLL()
    kw.setdefault("emulate_fp16", True)
    tr = at.Tracer(model, str(tmp_path / name), kinds={RevINLike: "revin"},
                   loss_fn=loss_fn, **kw)
    return model, loss_fn, tr, str(tmp_path / name)


CASES = PLANTED  # (data maker, model tweak, expected origin): models.py


@pytest.mark.parametrize("case", sorted(CASES))
def test_planted_overflow_postmortem(tmp_path, case):
    mk, tweak, want = CASES[case]
    model, loss_fn, tr, path = make(tmp_path)
    if tweak:
        tweak(model)
    train(tr, model, loss_fn, 3, make=mk)
    tr.close()
    pm = ampprobe.postmortem(path)
    ev = pm["event"]
    assert (ev["origin_layer"], ev["origin_kind"], ev["origin_site"],
            ev["phase"], ev["step"]) == want + (0,), ev
    assert ampprobe.verdict(path) in ("degraded", "diverged")
    if case == "revin":
        assert ev["origin_output"]["posinf"] > 0
        assert ev["kind"] == "reduction-overflow"
        assert "revin" in pm["diagnosis"][0]["title"] if isinstance(
            pm.get("diagnosis"), list) and pm["diagnosis"] and isinstance(
            pm["diagnosis"][0], dict) and "title" in pm["diagnosis"][0] else True


@pytest.mark.parametrize("case", sorted(CASES))
def test_raise_names_producer(tmp_path, case):
    mk, tweak, want = CASES[case]
    model, loss_fn, tr, path = make(tmp_path, on_nonfinite="raise")
    if tweak:
        tweak(model)
    with pytest.raises(at.NonFiniteError) as e:
        train(tr, model, loss_fn, 3, make=mk)
    err = e.value
    assert (err.module, err.kind, err.site, err.phase, err.step) == want + (0,)
    msg = str(err)
    for part in ("step 0", want[3], "'%s'" % want[0], want[2]):
        assert part in msg, msg
    assert tr._next == 1  # raised at the end of step 0, not later
    # closed by the raise: the trace is complete and the path free for a
    # new tracer in this process (it was locked until garbage collection)
    assert ampprobe.read_trace(path)["info"]["complete"] == 1
    model2, loss_fn2, tr2, path2 = make(tmp_path, on_nonfinite="record", overwrite=True)
    assert path2 == path
    tr2.close()
    tr.close()  # idempotent


def test_warn_once_per_step(tmp_path):
    mk, tweak, want = CASES["revin"]
    model, loss_fn, tr, path = make(tmp_path, on_nonfinite="warn")
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        train(tr, model, loss_fn, 2, make=mk)
    tr.close()
    msgs = [str(x.message) for x in w if issubclass(x.category, at.NonFiniteWarning)]
    assert msgs and "'revin'" in msgs[0] and "fwd_saved" in msgs[0]


def test_gradient_overflow_is_scalers_business(tmp_path):
    """A huge loss scale overflows the FP16 gradients: the step is skipped
    and backed off; raise mode stays quiet (the scaler's routine), and the
    trace has the backoff and the origin in the backward phase. Enough
    steps for the scale to come down and the run to train: a run whose
    steps were all skipped took no optimizer step, which is not healthy
    (its 4 steps at 2^40 were)."""
    model, loss_fn, tr, path = make(tmp_path, on_nonfinite="raise")
    sc = at.LossScaler(init_scale=2.0 ** 40, growth_interval=2)
    losses = train(tr, model, loss_fn, 40, scaler=sc, make=lambda s: data(s))
    tr.close()
    assert all(math.isfinite(x) for x in losses)
    t = ampprobe.read_trace(path)
    st = t["steps"]
    assert st["skipped"][0] == 1 and st["found_inf"][0] == 1
    assert st["loss_scale"][0] == 2.0 ** 40 and st["loss_scale"][1] == 2.0 ** 39
    ev = t["scaler_events"]
    assert ev["kind"][0] == 0 and ev["old_scale"][0] == 2.0 ** 40
    pm = ampprobe.postmortem(path)
    assert pm["event"]["kind"] == "none"  # nothing in forward or weights
    assert pm["event"]["first_gradient_overflow_step"] == 0
    assert pm["scaler"]["backoffs"] >= 1
    assert pm["verdict"] == "healthy", pm["verdict"]


def _silent_fault_run(tmp_path, init_scale, mode, fault_step, again=None,
                      loss_fault=False):
    """FP16 emulation under a LossScaler; at fault_step fc1's output
    overflows (0.3 * 8 * 30000 = 72000 > 65504) and a Hardtanh clamps it,
    so the loss and gradients stay finite (loss_fault: the loss goes NaN
    too, at step again). again: a second such fault. init_scale 2^40: the
    scaler's routine gradient overflow at step
    0 (skipped, backed off by 2^-30, not signalled). The errors and
    warnings of on_nonfinite=mode."""
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(8, 8), nn.Hardtanh(-3, 3), nn.Linear(8, 4))
    crit = nn.CrossEntropyLoss()
    opt = torch.optim.SGD(m.parameters(), lr=0.01)
    with torch.no_grad():
        m[0].weight.fill_(0.3)
        m[0].bias.zero_()
    sc = at.LossScaler(init_scale=init_scale, backoff_factor=2.0 ** -30)
    tr = at.Tracer(m, str(tmp_path / "t.h5"), loss_fn=crit, emulate_fp16=True,
                   env=False, on_nonfinite=mode, overwrite=True)
    tr.attach_scaler(sc)
    g = torch.Generator().manual_seed(0)
    errors = []
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        try:
            for step in range(5):
                x = torch.randn(4, 8, generator=g)
                y = torch.randint(0, 4, (4,), generator=g)
                if step in (fault_step, again):
                    x = torch.full((4, 8), 30000.0)
                loss = crit(m(x), y)
                if step == again and loss_fault:
                    loss = loss * float("nan")
                opt.zero_grad()
                sc.scale(loss).backward()
                sc.step(opt)
                sc.update()
                tr.end_step(loss=loss, optimizer=opt)
        except at.NonFiniteError as e:
            errors.append(e)
    tr.close()
    said = [str(x.message) for x in w if issubclass(x.category, at.NonFiniteWarning)]
    return [str(e) for e in errors] + said


@pytest.mark.parametrize("init_scale", [1.0, 2.0 ** 40])
@pytest.mark.parametrize("mode", ["raise", "warn"])
@pytest.mark.parametrize("fault_step", [1, 3])
def test_a_routine_backoff_does_not_silence_a_later_fault(tmp_path, init_scale,
                                                          mode, fault_step):
    """A forward overflow whose loss stays finite (a clamp after it) is
    signalled at its step, whether or not the loss scaler backed off at
    step 0 before it (the routine backoff was the run's first non-finite
    step, after which only steps with a bad loss or a skip were looked at:
    the fault was never said; review of 1f8f8eb)."""
    got = _silent_fault_run(tmp_path, init_scale, mode, fault_step)
    assert len(got) == 1, got
    assert ("at step %d, forward phase: produced by module '0' (linear), "
            "site fwd_out" % fault_step) in got[0], got[0]


def test_after_an_event_a_finite_step_is_not_said_again(tmp_path):
    """Once an event is signalled, a later step is looked at only when its
    loss or gradients are bad: a step after the event whose forward holds
    inf again is not said again, one whose loss is NaN is."""
    got = _silent_fault_run(tmp_path, 2.0 ** 40, "warn", 1, again=3)
    assert len(got) == 1 and "at step 1," in got[0], got
    got = _silent_fault_run(tmp_path, 2.0 ** 40, "warn", 1, again=3,
                            loss_fault=True)
    assert len(got) == 2 and "at step 3," in got[1], got


def test_raise_on_a_loss_outside_modules(tmp_path):
    """A loss computed by a plain function (no module) that is inf: the
    backward is non-finite and the step skipped, but a non-finite loss is
    no routine scaler overflow - raise names the loss, in the forward (it
    stayed quiet: unseen-model audit, 12 of 20 steps with an inf loss)."""
    torch.manual_seed(0)
    model = Net()
    tr = at.Tracer(model, str(tmp_path / "t.h5"), kinds={RevINLike: "revin"},
                   emulate_fp16=True, on_nonfinite="raise")

    def loss_fn(out, y):
        return -torch.log(out.float() * 0.0).mean()

    with pytest.raises(at.NonFiniteError) as e:
        train(tr, model, loss_fn, 3, scaler=at.LossScaler(init_scale=1024.0),
              make=lambda s: data(s))
    err = e.value
    assert (err.module, err.site, err.phase, err.step) == (
        "loss", "loss", "forward", 0), str(err)
    tr.close()


def _plain_loss_run(tmp_path, loss_of, mode, steps=3, bad_lr=1e-2, bad_step=1):
    """An FP32 job without a loss scaler whose loss is a plain function
    (no module) of a softmax output; loss_of(prob, bad) is the step's loss,
    bad from bad_step on. Returns what on_nonfinite said: the error or the
    first warning."""
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 3),
                      nn.Softmax(-1))
    tr = at.Tracer(m, str(tmp_path / "p.h5"), precision="fp32",
                   on_nonfinite=mode)
    opt = torch.optim.SGD(m.parameters(), 1e-2)
    got = None
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        try:
            for step in range(steps):
                g = torch.Generator().manual_seed(step)
                loss = loss_of(m(torch.randn(8, 4, generator=g)), step >= bad_step)
                if step >= bad_step:
                    opt.param_groups[0]["lr"] = bad_lr
                opt.zero_grad()
                loss.backward()
                opt.step()
                tr.end_step(loss=loss, optimizer=opt)
        except at.NonFiniteError as e:
            got = e
    tr.close()
    if got is None:
        ws = [x.message for x in w if issubclass(x.category, at.NonFiniteWarning)]
        got = ws[0] if ws else None
    assert got is not None, "on_nonfinite said nothing"
    return got


def _nll_underflow(prob, bad):
    """-log(p[0]); when bad, p[0] is 0 for one sample (+inf loss, whose
    backward is inf at the softmax's output)."""
    p0 = prob[:, 0]
    if bad:
        p0 = p0 * (torch.arange(8) != 3)
    return -torch.log(p0).mean()


def test_nonfinite_loss_outside_modules_without_a_scaler(tmp_path):
    """No loss scaler (an FP32 or bf16 job): a loss made non-finite by a
    plain function, whose first non-finite record is a gradient, is the
    loss in the forward - raise named the softmax's grad_out, backward
    (audit F1)."""
    err = _plain_loss_run(tmp_path, _nll_underflow, "raise")
    assert (err.module, err.site, err.phase, err.step) == (
        "loss", "loss", "forward", 1), str(err)


def test_nonfinite_loss_outside_modules_warns_the_loss(tmp_path):
    """The same rule in warn mode, with a NaN loss (0 * inf) whose
    backward is NaN everywhere."""
    def nan_loss(prob, bad):
        loss = (prob[:, 0] - 1.0).pow(2).mean()
        return loss * float("inf") * 0.0 if bad else loss

    w = _plain_loss_run(tmp_path, nan_loss, "warn")
    msg = str(w)
    assert "step 1, forward phase" in msg and "module 'loss'" in msg, msg


def test_nonfinite_loss_first_record_in_the_optimizer_phase(tmp_path):
    """Gradients finite, the master weights non-finite (an inf learning
    rate) and the loss non-finite by a term no module computes: the first
    non-finite record is in the optimizer phase; the loss is named."""
    def const_inf(prob, bad):
        loss = (prob[:, 0] - 1.0).pow(2).mean()
        return loss + torch.log(torch.zeros(())) if bad else loss

    err = _plain_loss_run(tmp_path, const_inf, "raise", bad_lr=float("inf"))
    assert (err.module, err.site, err.phase, err.step) == (
        "loss", "loss", "forward", 1), str(err)


def test_finite_loss_with_an_inf_gradient_names_the_gradient(tmp_path):
    """The control: a finite loss whose backward overflows (no scaler)
    still names the module whose gradient it is, backward phase."""
    class InfGrad(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.clone()

        @staticmethod
        def backward(ctx, g):
            return g * float("inf")

    def loss_of(prob, bad):
        return (InfGrad.apply(prob) if bad else prob)[:, 0].mean()

    err = _plain_loss_run(tmp_path, loss_of, "raise")
    assert err.phase == "backward" and err.module == "3", str(err)


def test_long_names_match_policies_by_their_full_path(tmp_path):
    """Module paths over 60 bytes are cut (and made unique with ~N) for the
    trace; the FP32 policy and layer globs still match the full path (they
    matched only the cut name, so a policy naming the real module silently
    selected nothing: unseen-model audit)."""
    long = "decoder_stack_with_a_rather_long_name"
    model = nn.Sequential()
    stage = nn.Sequential()
    stage.add_module("residual_branch_number_zero", nn.Sequential(
        nn.Linear(4, 4), nn.ReLU()))
    stage.add_module("residual_branch_number_one", nn.Sequential(
        nn.Linear(4, 4), nn.ReLU()))
    model.add_module(long, stage)
    full0 = long + ".residual_branch_number_zero.0"
    full1 = long + ".residual_branch_number_one.0"
    assert len(full0.encode()) > 60 and len(full1.encode()) > 60
    tr = at.Tracer(model, str(tmp_path / "t.h5"), emulate_fp16=True,
                   fp32=[full1], layers="*number_one*," + full0)
    by_full = {}
    for L in tr._layers:
        if L.module is not None and L.kind == "linear":
            by_full[[n for n, m in model.named_modules() if m is L.module][0]] = L
    assert len(by_full[full0].name.encode()) <= 60
    assert by_full[full1].fp32 and not by_full[full0].fp32
    assert by_full[full0].selected and by_full[full1].selected
    tr.close()


def test_bf16_autocast_is_healthy(tmp_path):
    mk = CASES["revin"][0]
    model, loss_fn, tr, path = make(tmp_path, emulate_fp16=False,
                                    precision="bf16")
    losses = train(tr, model, loss_fn, 4, make=mk)
    tr.close()
    assert all(math.isfinite(x) for x in losses)
    t = ampprobe.read_trace(path)
    r = t["records"]
    assert r["nan_count"].sum() == 0 and r["posinf_count"].sum() == 0
    names = [n.decode() for n in t["layers"]["name"]]
    fc1 = names.index("fc1")
    out = r[(r["layer"] == fc1) & (r["site"] == SITES.index("fwd_out"))]
    assert (out["dtype"] == 2).all()  # bf16 outputs recorded as bf16
    assert t["layers"]["precision"][fc1] == 2
    pm = ampprobe.postmortem(path)
    assert pm["event"]["kind"] == "none"
    assert ampprobe.verdict(path) == "healthy"
    assert tr.copies == 0


def test_env_policy_fixes_and_routes(tmp_path, monkeypatch):
    mk = CASES["revin"][0]
    other = str(tmp_path / "from-env.h5")
    monkeypatch.setenv("AMPPROBE_FP32", "revin")
    monkeypatch.setenv("AMPPROBE_TRACE", other)
    model, loss_fn, tr, path = make(tmp_path)
    assert tr.path == other and tr.fp32_modules() == ["revin"]
    losses = train(tr, model, loss_fn, 3, make=mk)
    tr.close()
    assert not os.path.exists(path) and os.path.exists(other)
    assert all(math.isfinite(x) for x in losses)
    t = ampprobe.read_trace(other)
    names = [n.decode() for n in t["layers"]["name"]]
    assert t["layers"]["precision"][names.index("revin")] == 0
    assert t["layers"]["precision"][names.index("fc1")] == 1
    assert t["info"]["precision_policy"] == "fp16; fp32: revin"
    assert t["records"]["posinf_count"].sum() == 0
    monkeypatch.setenv("AMPPROBE_FP32", "fc*,bn")
    monkeypatch.setenv("AMPPROBE_PRECISION", "fp32")
    model, loss_fn, tr, _ = make(tmp_path, overwrite=True)  # same trace
    assert tr.precision == "fp32" and not tr.emulate
    train(tr, model, loss_fn, 1, make=mk)
    tr.close()
    t = ampprobe.read_trace(other)
    assert (t["layers"]["precision"] == 0).all()
    assert t["records"]["posinf_count"].sum() == 0


def test_fp32_modules_run_outside_autocast(tmp_path, monkeypatch):
    monkeypatch.setenv("AMPPROBE_FP32", "linear")
    model, loss_fn, tr, path = make(tmp_path, emulate_fp16=False,
                                    precision="bf16")
    train(tr, model, loss_fn, 1, make=lambda s: data(s))
    tr.close()
    t = ampprobe.read_trace(path)
    names = [n.decode() for n in t["layers"]["name"]]
    r = t["records"]
    fo = SITES.index("fwd_out")
    for n, want in (("fc1", 0), ("head", 0)):
        d = r[(r["layer"] == names.index(n)) & (r["site"] == fo)]["dtype"]
        assert (d == want).all(), (n, d)
    d = r[(r["layer"] == names.index("revin")) & (r["site"] == fo)]["dtype"]
    assert (d == 0).all()  # revin: fp32 elementwise ops under CPU autocast


def test_every_n_and_layer_globs(tmp_path):
    model, loss_fn, tr, path = make(tmp_path, layers="fc1,head", every=2,
                                    emulate_fp16=False)
    train(tr, model, loss_fn, 5, make=lambda s: data(s))
    tr.close()
    t = ampprobe.read_trace(path)
    names = [n.decode() for n in t["layers"]["name"]]
    assert set(names) >= {"input", "revin", "fc1", "bn", "head", "sm", "loss"}
    got = {names[i] for i in np.unique(t["records"]["layer"])}
    assert got == {"fc1", "head"}
    assert sorted(np.unique(t["records"]["step"])) == [0, 2, 4]
    assert len(t["steps"]) == 5  # scalars every step


def test_flight_recorder_keeps_steps_around_event(tmp_path):
    model, loss_fn, tr, path = make(tmp_path, mode="scalars", ring_steps=2)
    mk = lambda s: data(s, level=3000.0 if s == 6 else 0.0,
                        spread=500.0 if s == 6 else 1.0)
    train(tr, model, loss_fn, 12, make=mk)
    tr.close()
    t = ampprobe.read_trace(path)
    steps = sorted(np.unique(t["records"]["step"]))
    assert steps == [4, 5, 6, 7, 8], steps
    assert len(t["steps"]) == 12
    assert ampprobe.postmortem(path)["event"]["step"] == 6


def test_scalars_recorded(tmp_path):
    model, loss_fn, tr, path = make(tmp_path, emulate_fp16=False)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    x, y = data(0)
    loss = loss_fn(model(x), y)
    loss.backward()
    n = nn.utils.clip_grad_norm_(model.parameters(), 0.01)
    opt.step()
    tr.clip(n, 0.01)
    tr.scaler_event("backoff", 8.0, 4.0, 0)
    tr.end_step(loss=loss, optimizer=opt, loss_scale=8.0)
    tr.close()
    t = ampprobe.read_trace(path)
    s = t["steps"][0]
    assert math.isclose(s["loss"], float(loss), rel_tol=1e-6)
    assert s["lr"] == 0.05 and s["loss_scale"] == 8.0
    assert math.isclose(s["grad_norm"], float(n), rel_tol=1e-6)
    assert s["clip_threshold"] == pytest.approx(0.01)
    assert s["clip_coef"] == pytest.approx(0.01 / (float(n) + 1e-6))
    assert s["skipped"] == 1 and s["found_inf"] == 1
    assert t["scaler_events"]["new_scale"][0] == 4.0


def test_sites_and_emulated_rounding(tmp_path):
    model, loss_fn, tr, path = make(tmp_path)
    train(tr, model, loss_fn, 1, make=lambda s: data(s))
    tr.close()
    t = ampprobe.read_trace(path)
    names = [n.decode() for n in t["layers"]["name"]]
    r = t["records"]
    fc1 = names.index("fc1")
    sites = [SITES[s] for s in r[r["layer"] == fc1]["site"]]
    assert sites == ["fwd_in", "weight", "weight", "fwd_out", "grad_out",
                     "weight_grad", "weight_grad", "grad_in",
                     "master_weight", "master_weight"], sites
    # emulated FP16: weights as used are fp16, outputs hold binary16 values
    w = r[(r["layer"] == fc1) & (r["site"] == SITES.index("weight"))]
    assert (w["dtype"] == 1).all()
    assert [SITES[s] for s in r[r["layer"] == names.index("revin")]["site"]][:4] == [
        "fwd_in", "weight", "weight", "fwd_saved"]
    assert tr.copies == 0


def test_emulation_rounds_to_binary16(tmp_path):
    torch.manual_seed(0)
    lin = nn.Linear(2, 3, bias=False)
    with torch.no_grad():
        lin.weight.copy_(torch.tensor([[7e4, 0.0], [1e-8, 0.0], [1.0, 1e-4]]))
    tr = at.Tracer(lin, str(tmp_path / "r.h5"), emulate_fp16=True)
    out = lin(torch.tensor([[1.0, 1.0]]))
    assert out[0, 0] == math.inf and out[0, 1] == 0.0
    assert out[0, 2].item() == torch.tensor(1.0001).half().float().item()
    tr.end_step(loss=0.0)
    tr.close()


def test_kinds_from_classes():
    m = nn.ModuleDict({
        "c": nn.Conv2d(1, 1, 3), "e": nn.Embedding(4, 2), "ln": nn.LayerNorm(2),
        "gn": nn.GroupNorm(1, 2), "bn": nn.BatchNorm2d(2), "mha": nn.MultiheadAttention(4, 1),
        "g": nn.GELU(), "sm": nn.LogSoftmax(-1), "ce": nn.CrossEntropyLoss(),
        "l": nn.Linear(2, 2), "d": nn.Dropout()})
    kinds = {k: at.default_kind(v) for k, v in m.items()}
    assert kinds == {"c": "conv", "e": "embedding", "ln": "layernorm",
                     "gn": "layernorm", "bn": "bn", "mha": "attention",
                     "g": "activation", "sm": "softmax", "ce": "loss",
                     "l": "linear", "d": "other"}
    units = [n for n, _ in at._leaf_units(m, {"GELU": "revin"})]
    assert "mha" in units and "mha.out_proj" not in units


def test_attention_and_conv_model_traces(tmp_path):
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(10, 8)
            self.conv = nn.Conv1d(8, 8, 3, padding=1)
            self.attn = nn.MultiheadAttention(8, 2, batch_first=True)
            self.ln = nn.LayerNorm(8)

        def forward(self, ids):
            h = self.emb(ids)
            h = self.conv(h.transpose(1, 2)).transpose(1, 2)
            a, _ = self.attn(h, h, h)
            return self.ln(a + h)

    torch.manual_seed(0)
    m = M()
    tr = at.Tracer(m, str(tmp_path / "a.h5"), emulate_fp16=True)
    out = m(torch.randint(0, 10, (2, 5)))
    out.sum().backward()
    tr.end_step(loss=float(out.sum()))
    tr.close()
    t = ampprobe.read_trace(str(tmp_path / "a.h5"))
    names = [n.decode() for n in t["layers"]["name"]]
    assert names == ["input", "emb", "conv", "attn", "ln"]
    kinds = [ampprobe.kind_names()[k] for k in t["layers"]["kind"]]
    assert kinds == ["input", "embedding", "conv", "attention", "layernorm"]
    r = t["records"]
    conv = names.index("conv")
    assert SITES.index("fwd_in") in r[r["layer"] == conv]["site"]
    assert tr.copies > 0  # the transposed views were made contiguous


def test_core_session_takes_dlpack_tensors(tmp_path):
    """The torch-free Session records any host DLPack producer by pointer."""
    t = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    with ampprobe.Session(str(tmp_path / "d.h5")) as s:
        lid = s.register("x")
        s.begin_step(0)
        a, copied = s.record(lid, "fwd_out", t)
        assert not copied and a.ctypes.data == t.data_ptr()
        s.end_step()
    r = ampprobe.read_trace(str(tmp_path / "d.h5"))["records"][0]
    assert (r["count"], r["max"], r["zero_count"]) == (12, 11.0, 1)


# ---- hostile input (an audit of 2026-12-03) ------------------------------------


def test_nonfinite_error_escapes_module_names(tmp_path):
    m = nn.Sequential()
    m.add_module("evil\x1b[2J\x07\nFORGED", nn.Linear(4, 3))
    with torch.no_grad():
        m[0].weight.fill_(float("inf"))
    tr = at.Tracer(m, str(tmp_path / "e.h5"), on_nonfinite="raise")
    with pytest.raises(at.NonFiniteError) as e:
        tr.begin_step()
        m(torch.ones(2, 4)).sum().backward()
        tr.end_step()
    tr.close()
    msg = str(e.value)
    assert "evil\\e[2J\\a\\nFORGED" in msg, msg
    assert "\x1b" not in msg and "\n" not in msg


def test_module_names_fit_libprobe_in_bytes(tmp_path):
    for name in ("é" * 32, "日本" * 11, "x" * 200):
        m = nn.Sequential()
        m.add_module(name, nn.Linear(4, 3))
        m.add_module(name[:-1] + "y", nn.ReLU())
        with at.Tracer(m, str(tmp_path / "n.h5"), overwrite=True) as tr:
            tr.begin_step()
            m(torch.ones(2, 4)).sum().backward()
            tr.end_step()
        names = ampprobe.Trace(str(tmp_path / "n.h5")).layer_names()
        assert all(len(n.encode()) < ampprobe._lib.PROBE_NAME_MAX for n in names), names


def test_failed_tracer_leaves_nothing_behind(tmp_path, monkeypatch):
    m = nn.Sequential(nn.Linear(4, 3), nn.ReLU())
    p = str(tmp_path / "f.h5")
    real, calls = ampprobe.Session.register, []

    def failing(self, *a, **k):  # the third layer cannot be registered
        calls.append(a)
        if len(calls) == 3:
            raise ampprobe.ProbeError(-1, "planted", "ERR_INVALID_ARG")
        return real(self, *a, **k)

    monkeypatch.setattr(ampprobe.Session, "register", failing)
    with pytest.raises(ampprobe.ProbeError, match="planted"):
        at.Tracer(m, p)
    monkeypatch.setattr(ampprobe.Session, "register", real)
    assert not m[0]._forward_hooks and not m[0]._forward_pre_hooks
    assert not m._forward_pre_hooks and not hasattr(m[0], "_ampprobe_ref")
    at.Tracer(m, p, overwrite=True).close()  # the file is not locked


def test_bfloat16_tensors_by_dlpack(tmp_path):
    x = torch.tensor([1.0, -2.5, 0.0, 3e38], dtype=torch.bfloat16)
    s = ampprobe.stats(x)
    assert s["absmax"] == float(x.abs().max()) and s["zero_count"] == 1
    assert ampprobe.digest64(x) == ampprobe.digest64(x.view(torch.int16).numpy())
    with ampprobe.Session(str(tmp_path / "b.h5")) as ses:
        L = ses.register("t", precision="bf16")
        ses.begin_step(0)
        a, copied = ses.record(L, "fwd_out", x)
        assert a.dtype == np.uint16 and not copied
        ses.end_step()


# ---- arguments (audit F9) -------------------------------------------------------

def _mlp():
    return nn.Sequential(nn.Linear(3, 3), nn.ReLU())


@pytest.mark.parametrize("args, kw, name", [
    (("model",), {}, "model"),
    ((lambda x: x,), {}, "model"),
    ((None,), {}, "model"),
    ((), {"kinds": {nn.Linear: 5}}, "kinds"),
    ((), {"kinds": [(nn.Linear, "linear")]}, "kinds"),
    ((), {"kinds": {5: "linear"}}, "kinds"),
    ((), {"layers": 5}, "layers"),
    ((), {"layers": ["0", 1]}, "layers"),
])
def test_wrong_argument_types_name_the_argument(tmp_path, args, kw, name):
    """A wrong type is a TypeError naming the argument (was an
    AttributeError from deep inside: 'str' object has no attribute
    'parameters', 'int' object has no attribute 'encode'), and no trace
    file is left behind."""
    p = str(tmp_path / "a.h5")
    model = args[0] if args else _mlp()
    with pytest.raises(TypeError, match=r"\b%s\b" % name):
        at.Tracer(model, p, **kw)
    assert not os.path.exists(p)


@pytest.mark.parametrize("where", ["register", "attach", "comm"])
def test_failed_tracer_removes_its_trace_file(tmp_path, monkeypatch, where):
    """A Tracer whose construction fails after its session was opened
    closes and removes the file it created (the empty trace stayed, and
    the job's rerun failed with ERR_EXISTS)."""
    m = _mlp()
    p = str(tmp_path / "f.h5")

    def boom(*a, **k):
        raise RuntimeError("planted")

    if where == "register":
        real, n = ampprobe.Session.register, []

        def failing(self, *a, **k):
            n.append(a)
            if len(n) == 2:
                boom()
            return real(self, *a, **k)
        monkeypatch.setattr(ampprobe.Session, "register", failing)
    elif where == "attach":
        monkeypatch.setattr(at.Tracer, "_hook_param", boom)  # hooks on
    else:
        monkeypatch.setattr(at._dist, "is_ddp", lambda mod: True)
        m.module = _mlp()  # looks like a DDP wrapper; its hook fails
        monkeypatch.setattr(at._dist, "register", boom)
        monkeypatch.setattr(at._dist, "job_identity",
                            lambda *a: (-1, 0, ""))
    with pytest.raises(RuntimeError, match="planted"):
        at.Tracer(m, p)
    monkeypatch.undo()
    assert not os.path.exists(p)
    at.Tracer(m, p).close()  # no overwrite needed: nothing was left


def test_failed_tracer_removes_only_the_file_it_made(tmp_path, monkeypatch):
    """The clean-up of a failed Tracer removes the file its session made,
    not one that took the path meanwhile (another job's trace renamed onto
    it, a rerun's)."""
    p = str(tmp_path / "f.h5")
    other = str(tmp_path / "other.h5")
    at.Tracer(_mlp(), other).close()

    def boom(*a, **k):  # the path now names another file
        os.replace(other, p)
        raise RuntimeError("planted")

    monkeypatch.setattr(at.Tracer, "_hook_param", boom)
    with pytest.raises(RuntimeError, match="planted"):
        at.Tracer(_mlp(), p)
    monkeypatch.undo()
    assert os.path.exists(p)
    assert ampprobe.read_trace(p)["layers"] is not None


@pytest.mark.parametrize("kw,match", [
    ({"loss_fn": lambda out, y: (out - y).sum()}, "loss_fn=.*function"),
    ({"loss_fn": "mse"}, "loss_fn=.*str"),
    ({"every": "2"}, "every="), ({"step_start": 1.5}, "step_start="),
    ({"step_end": None}, "step_end=")])
def test_tracer_arguments_named_in_their_errors(tmp_path, kw, match):
    """A criterion given as a function (or a name) is a TypeError naming
    loss_fn (was "'function' object has no attribute 'parameters'", raised
    after the trace was opened); every/step_start/step_end that are not
    integers name themselves (int()'s "invalid literal"); no file is left."""
    p = str(tmp_path / "n.h5")
    with pytest.raises(TypeError, match=match):
        at.Tracer(_mlp(), p, **kw)
    assert not os.path.exists(p)


def test_precision_error_names_its_source(tmp_path, monkeypatch):
    with pytest.raises(ValueError) as e:
        at.Tracer(_mlp(), str(tmp_path / "p.h5"), precision="fp8")
    assert "precision='fp8'" in str(e.value)
    assert "AMPPROBE_PRECISION" not in str(e.value)
    monkeypatch.setenv("AMPPROBE_PRECISION", "fp4")
    with pytest.raises(ValueError, match="AMPPROBE_PRECISION='fp4'"):
        at.Tracer(_mlp(), str(tmp_path / "p.h5"), precision="fp16")
    assert not os.path.exists(str(tmp_path / "p.h5"))


@pytest.mark.parametrize("bad", ["nan", b"1.0", [1.0], (1.0,), {"loss": 1.0},
                                 object()])
def test_end_step_rejects_a_loss_that_is_no_number_before_recording(tmp_path, bad):
    """end_step(loss=) takes a tensor or a number: anything else is a
    TypeError raised before the step is touched (a string was stored as a
    NaN loss; a list failed after the master weights were recorded, and the
    retry recorded them twice)."""
    m = _mlp()
    p = str(tmp_path / "l.h5")
    tr = at.Tracer(m, p)
    loss = m(torch.randn(2, 3)).sum()
    loss.backward()
    with pytest.raises(TypeError, match="loss"):
        tr.end_step(loss=bad)
    tr.end_step(loss=loss)  # the retry
    tr.end_step(loss=np.float32(0.5))  # numbers of any kind are fine
    tr.close()
    t = ampprobe.read_trace(p)
    r = t["records"]
    mw = (r["step"] == 0) & (r["site"] == SITES.index("master_weight"))
    assert int(mw.sum()) == 2  # weight and bias of the Linear, once
    assert t["steps"]["loss"][0] == pytest.approx(float(loss))


@pytest.mark.parametrize("arg,bad", [
    ("lr", "1e-3"), ("grad_norm", "x"), ("grad_norm", [1.0]), ("max_norm", "1"),
    ("loss_scale", {"s": 1}), ("found_inf", "0"), ("skipped", [0]),
    ("growth_tracker", "3"), ("found_inf", float("nan")),
    ("grad_norm", torch.ones(2)), ("max_norm", -1.0), ("loss_scale", -2.0),
    ("grad_norm", torch.tensor(-0.5)), ("grad_norm", float("-inf"))])
def test_end_step_rejects_any_bad_scalar_before_recording(tmp_path, arg, bad):
    """Every scalar argument of end_step is checked before the step is
    touched, and the error names it: a bad lr or grad_norm failed after the
    master weights were recorded, the tracer ended its step while libprobe's
    stayed open, and the next end_step failed with 'step 1 begun inside
    step 0'. A negative max_norm, loss_scale or grad_norm was refused by
    libprobe after the master weights were recorded ('probe_step_set_scalars:
    negative clip_threshold', naming neither the argument nor end_step)."""
    m = _mlp()
    p = str(tmp_path / "a.h5")
    tr = at.Tracer(m, p)
    for step in range(2):
        loss = m(torch.randn(2, 3)).sum()
        loss.backward()
        if step == 0:
            with pytest.raises((TypeError, ValueError),
                               match=r"end_step\(%s=" % arg):
                tr.end_step(loss=loss, **{arg: bad})
            assert tr._masters_at != 0  # the step was not touched
        tr.end_step(loss=loss, lr=torch.tensor(0.01), grad_norm=torch.tensor(2.0),
                    max_norm=1.0)
    tr.close()
    t = ampprobe.read_trace(p)
    r = t["records"]
    for s in (0, 1):
        mw = (r["step"] == s) & (r["site"] == SITES.index("master_weight"))
        assert int(mw.sum()) == 2  # weight and bias of the Linear, once
    assert t["steps"]["lr"].tolist() == pytest.approx([0.01, 0.01])
    assert t["steps"]["grad_norm"].tolist() == [2.0, 2.0]


def test_end_step_norms_and_scale_zero_nan_inf_allowed(tmp_path):
    """max_norm, loss_scale and grad_norm refuse only a negative value: 0
    (clipping off, a scale at its floor), NaN and inf (a diverged norm)
    are recorded. clip() refuses a negative one too, before end_step."""
    m = _mlp()
    p = str(tmp_path / "z.h5")
    tr = at.Tracer(m, p)
    for gn, mx, ls in ((0.0, 0.0, 0.0), (float("nan"), 1.0, 1.0),
                       (float("inf"), float("inf"), float("inf"))):
        loss = m(torch.randn(2, 3)).sum()
        loss.backward()
        tr.end_step(loss=loss, grad_norm=gn, max_norm=mx, loss_scale=ls)
    loss = m(torch.randn(2, 3)).sum()
    loss.backward()
    with pytest.raises(ValueError, match=r"clip\(max_norm="):
        tr.clip(1.0, -1.0)
    with pytest.raises(ValueError, match=r"clip\(grad_norm="):
        tr.clip(torch.tensor(-1.0), 1.0)
    tr.clip(2.0, 1.0)
    tr.end_step(loss=loss)
    tr.close()
    st = ampprobe.read_trace(p)["steps"]
    gnr = st["grad_norm"].tolist()
    assert gnr[0] == 0.0 and math.isnan(gnr[1]) and gnr[2] == float("inf")
    assert gnr[3] == 2.0
    assert st["clip_threshold"].tolist()[:3] == [0.0, 1.0, float("inf")]
    assert st["loss_scale"].tolist()[:3] == [0.0, 1.0, float("inf")]


def test_unknown_custom_kind_warns(tmp_path):
    """A kind name libprobe does not know is recorded as "other": a typo
    ("revn") is warned about; known names, the package's own included,
    are not."""
    class Custom(nn.Module):
        def forward(self, x):
            return x * 2

    m = nn.Sequential(nn.Linear(3, 3), Custom())
    with pytest.warns(RuntimeWarning, match="'revn'"):
        at.Tracer(m, str(tmp_path / "k1.h5"), kinds={Custom: "revn"}).close()
    with pytest.warns(RuntimeWarning, match="'scores'"):
        at.Tracer(m, str(tmp_path / "k2.h5"), kinds={"Custom": "scores"}).close()
    for i, k in enumerate(("revin", "conv", "attention")):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            at.Tracer(m, str(tmp_path / ("k%d.h5" % (i + 3))),
                      kinds={Custom: k}).close()


@pytest.mark.parametrize("start, end", [(5, 2), (1, 0)])
def test_empty_step_window_is_an_error(tmp_path, start, end):
    p = str(tmp_path / "w.h5")
    with pytest.raises(ValueError, match="step_start"):
        at.Tracer(_mlp(), p, step_start=start, step_end=end)
    assert not os.path.exists(p)
    at.Tracer(_mlp(), p, step_start=2, step_end=2).close()  # one step: fine


@pytest.mark.parametrize("kw,exc,match", [
    ({"every": 0}, ValueError, r"Tracer\(every=0\).*every takes an integer in \[1, "),
    ({"every": True}, TypeError, r"Tracer\(every=\.\.\.\)"),
    ({"step_start": -1}, ValueError, r"Tracer\(step_start=-1\).*\[0, "),
    ({"step_end": 2**63}, ValueError, r"Tracer\(step_end="),
    ({"ring_steps": -1}, ValueError, r"Tracer\(ring_steps=-1\).*\[0, 1000000\]"),
    ({"ring_steps": 2**32 + 8}, ValueError, r"Tracer\(ring_steps="),
    ({"mode": "ful"}, ValueError, r"Tracer\(mode='ful'\)"),
    ({"flush_seconds": -1.0}, ValueError, r"Tracer\(flush_seconds=-1\.0\).*>= 0"),
    ({"flush_seconds": float("nan")}, ValueError, r"Tracer\(flush_seconds=nan\)"),
    ({"flush_steps": -2}, ValueError, r"Tracer\(flush_steps=-2\)"),
    ({"max_events": -1}, ValueError, r"Tracer\(max_events=-1\).*\[0, 2147483647\]"),
    ({"max_events": 2**31}, ValueError, r"Tracer\(max_events="),
    ({"batch_rows": 0}, ValueError, r"Tracer\(batch_rows=0\).*\[1, "),
    ({"snapshot_max_elems": -1}, ValueError, r"Tracer\(snapshot_max_elems=-1\)"),
    ({"snapshot_on_nonfinite": "yes"}, TypeError, r"Tracer\(snapshot_on_nonfinite="),
])
def test_option_out_of_range_names_the_argument(tmp_path, kw, exc, match):
    """A Tracer argument libprobe takes as an option is checked against the
    option's range (probe.h) and the error names the argument and the
    range (every=0 was libprobe's "option out of range (mode, step_every,
    step_start, ...)"; ring_steps=2**32+8 was stored as 8 by ctypes); no
    file is left."""
    p = str(tmp_path / "o.h5")
    with pytest.raises(exc, match=match):
        at.Tracer(_mlp(), p, **kw)
    assert not os.path.exists(p)
    with pytest.raises(exc):  # the Session says the same in its own name
        ampprobe.Session(p, **{("step_every" if k == "every" else k): v
                               for k, v in kw.items() if k != "mode"}) \
            if "mode" not in kw else ampprobe.Session(p, mode=kw["mode"])
    assert not os.path.exists(p)
    at.Tracer(_mlp(), p, every=1, ring_steps=0, max_events=0,
              flush_seconds=float("inf"), snapshot_on_nonfinite=False).close()


@pytest.mark.parametrize("arg,bad,exc", [
    ("loss", True, TypeError), ("lr", False, TypeError),
    ("grad_norm", True, TypeError), ("max_norm", np.bool_(True), TypeError),
    ("loss_scale", True, TypeError), ("growth_tracker", True, TypeError),
    ("loss", torch.tensor(True), TypeError),
    ("found_inf", 2, ValueError), ("skipped", -1, ValueError)])
def test_end_step_refuses_bools_for_numbers(tmp_path, arg, bad, exc):
    """A bool is an int in Python, so end_step(loss=True) stored a loss of
    1.0: refused for every numeric scalar, naming it, before the step is
    touched. found_inf and skipped are flags: a bool is what they say,
    any value but 0 and 1 is refused (libprobe refused it inside end_step,
    after the master weights were recorded)."""
    m = _mlp()
    p = str(tmp_path / "b.h5")
    tr = at.Tracer(m, p)
    loss = m(torch.randn(2, 3)).sum()
    loss.backward()
    with pytest.raises(exc, match=r"end_step\(%s=" % arg):
        tr.end_step(**dict({"loss": loss}, **{arg: bad}))
    tr.end_step(loss=loss, found_inf=True, skipped=np.bool_(False),
                loss_scale=8.0, growth_tracker=3)
    with pytest.raises(TypeError, match=r"clip\(max_norm="):
        tr.clip(1.0, True)
    with pytest.raises(TypeError, match=r"scaler_event\(new_scale="):
        tr.scaler_event("backoff", 8.0, True)
    with pytest.raises(ValueError, match=r"scaler_event\(kind='bogus'\)"):
        tr.scaler_event("bogus", 8.0, 4.0)
    for a, b, name in ((float("nan"), 4.0, "old_scale"),
                       (8.0, float("inf"), "new_scale"),
                       (8.0, -1.0, "new_scale")):
        with pytest.raises(ValueError, match=r"scaler_event\(%s=" % name):
            tr.scaler_event("backoff", a, b)
    with pytest.raises(ValueError, match=r"scaler_event\(growth_tracker="):
        tr.scaler_event("growth", 8.0, 16.0, -2)
    tr.close()
    st = ampprobe.read_trace(p)["steps"]
    assert st["found_inf"].tolist() == [1] and st["skipped"].tolist() == [0]
    r = ampprobe.read_trace(p)["records"]
    assert int((r["site"] == SITES.index("master_weight")).sum()) == 2


def test_refused_scalars_leave_the_step_open(tmp_path, monkeypatch):
    """libprobe refusing the step's scalars inside end_step leaves its step
    open: so is the tracer's, and a retry of end_step ends it (masters
    recorded once). The tracer ended its step anyway, and the next forward
    was refused with 'step 1 begun inside step 0'."""
    m = _mlp()
    p = str(tmp_path / "s.h5")
    tr = at.Tracer(m, p)
    lib = tr.session._lib
    real = lib.probe_step_set_scalars
    loss = m(torch.randn(2, 3)).sum()
    loss.backward()
    monkeypatch.setattr(lib, "probe_step_set_scalars", lambda *a: -1)
    with pytest.raises(ampprobe.ProbeError, match="probe_step_set_scalars"):
        tr.end_step(loss=loss)
    monkeypatch.setattr(lib, "probe_step_set_scalars", real)
    tr.end_step(loss=loss)  # the retry ends step 0
    loss = m(torch.randn(2, 3)).sum()  # step 1 begins
    loss.backward()
    tr.end_step(loss=loss)
    tr.close()
    t = ampprobe.read_trace(p)
    assert t["steps"]["step"].tolist() == [0, 1]
    r = t["records"]
    for s in (0, 1):
        mw = (r["step"] == s) & (r["site"] == SITES.index("master_weight"))
        assert int(mw.sum()) == 2


_FULL_DISK = r"""
import resource, signal, sys, torch, torch.nn as nn
import ampprobe, ampprobe.torch as at
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (512 << 10, 512 << 10))  # above the open's 256 KiB minimum
m = nn.Sequential(nn.Linear(64, 64), nn.ReLU())
tr = at.Tracer(m, sys.argv[1], flush_steps=1, on_write_error="raise")
err = None
for step in range(4000):  # the first error comes within ~100 steps; lag-proof
    try:
        loss = m(torch.randn(8, 64)).sum()
        loss.backward()
        tr.end_step(loss=loss)
    except ampprobe.ProbeError as e:
        if err is None:
            err = (step, e.name)
        else:
            print("AGAIN", e.name, str(e).replace("\n", " "))
            break
print("FIRST", err)
try:
    tr.close()
except ampprobe.ProbeError as e:
    print("CLOSE", e.name)
"""


def test_full_disk_in_end_step_stays_a_clear_error(tmp_path):
    """A write failure libprobe reports in end_step (the file-size limit,
    as a full disk: sticky) is reported again by the next call, never as a
    step begun inside another one (on_write_error="raise": the default
    stops tracing with a warning, test_torch_write_error.py)."""
    import subprocess
    import sys
    p = str(tmp_path / "full.h5")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [os.path.dirname(ampprobe.__path__[0])] +
        [x for x in [env.get("PYTHONPATH")] if x])
    r = subprocess.run([sys.executable, "-c", _FULL_DISK, p], env=env,
                       capture_output=True, text=True, timeout=120)
    out = r.stdout
    assert r.returncode == 0, r.stderr
    assert "FIRST (" in out and "ERR_NOSPACE" in out, out
    assert "AGAIN ERR_NOSPACE" in out, out
    assert "begun inside" not in out


def _inplace_after_inf():
    m = nn.Sequential(nn.Linear(3, 3), nn.ReLU(inplace=True), nn.Linear(3, 1))
    with torch.no_grad():
        m[0].weight.copy_(-10 * torch.eye(3))
        m[0].bias.zero_()
    x = torch.tensor([[3e38, 1.0, 1.0], [3e38, 1.0, 1.0]])
    return m, x  # m[0] makes -inf, the in-place ReLU turns it into 0


def _first_event(m, x, path):
    """One step of m on x traced with on_nonfinite="raise": the
    NonFiniteError of its end_step."""
    tr = at.Tracer(m, path, on_nonfinite="raise")
    m(x).sum().backward()
    with pytest.raises(at.NonFiniteError) as e:
        tr.end_step()
    return e.value


def test_nonfinite_counts_are_those_recorded_before_an_inplace_op(tmp_path):
    """The counts in the message are those libprobe read at the record,
    not of the tensor after a ReLU(inplace=True) turned its -inf into 0
    (it said '0 NaN, 0 +inf, 0 -inf' for the site it named)."""
    m, x = _inplace_after_inf()
    e = _first_event(m, x, str(tmp_path / "i.h5"))
    assert e.module == "0" and e.site == "fwd_out"
    assert "(0 NaN, 0 +inf, 2 -inf of 6)" in str(e)


def _second_event(m, x, path):
    """Two steps of m on x traced with on_nonfinite="warn": the first an
    event, the second with a NaN loss; the second step's message."""
    tr = at.Tracer(m, path, on_nonfinite="warn")
    with pytest.warns(at.NonFiniteWarning):
        m(x).sum().backward()
        tr.end_step(loss=1.0)  # the run's first event: step 0
    with pytest.warns(at.NonFiniteWarning) as w:
        m(x).sum().backward()
        tr.end_step(loss=float("nan"))
    tr.close()
    return str(w[0].message)


def test_later_scan_reads_what_was_recorded_before_an_inplace_op(tmp_path):
    """After the run's first event, a step with a non-finite loss is
    scanned: the first non-finite forward record is the one libprobe read
    (m[0]'s -inf output), not the live tensor the in-place ReLU had zeroed
    (the loss, outside any module, was named)."""
    m, x = _inplace_after_inf()
    msg = _second_event(m, x, str(tmp_path / "j.h5"))
    assert "step 1" in msg and "module '0'" in msg and "fwd_out" in msg, msg


class _OwnInplace(nn.Module):
    """fc0 makes -inf (as _inplace_after_inf's m[0]); then the forward's
    own in-place op, no module, makes it finite before fc1 reads it."""

    def __init__(self, op):
        super().__init__()
        self.op = op
        self.fc0, self.fc1 = nn.Linear(3, 3), nn.Linear(3, 1)
        with torch.no_grad():
            self.fc0.weight.copy_(-10 * torch.eye(3))
            self.fc0.bias.zero_()

    def forward(self, x):
        h = self.fc0(x)
        if self.op == "relu_":
            h.relu_()
        elif self.op == "nan_to_num_":
            h.nan_to_num_(neginf=0.0)
        else:
            h.masked_fill_(torch.isinf(h), 0.0)
        return self.fc1(h)


_OWN_OPS = ["relu_", "nan_to_num_", "masked_fill_"]


@pytest.mark.parametrize("op", _OWN_OPS)
def test_counts_are_those_recorded_before_the_jobs_own_inplace_op(tmp_path, op):
    """The job's own in-place op (no module: no pre-hook sees it) after a
    record: the message's counts are those libprobe computed at the record
    (probe_session_step_nonfinite), not the zeros of the changed tensor
    ('0 NaN, 0 +inf, 0 -inf of 6' before)."""
    m = _OwnInplace(op)
    x = torch.tensor([[3e38, 1.0, 1.0], [3e38, 1.0, 1.0]])
    e = _first_event(m, x, str(tmp_path / "o.h5"))
    assert e.module == "fc0" and e.site == "fwd_out"
    assert "(0 NaN, 0 +inf, 2 -inf of 6)" in str(e)


@pytest.mark.parametrize("op", _OWN_OPS)
def test_later_step_sees_past_the_jobs_own_inplace_op(tmp_path, op):
    """After the run's first event, a step with a non-finite loss names
    its first non-finite forward record as recorded: fc0's output, which
    the job's own in-place op made finite afterwards (before, the scan of
    the live tensors found none and named the loss; docs/python.md said
    so as a limit)."""
    m = _OwnInplace(op)
    x = torch.tensor([[3e38, 1.0, 1.0], [3e38, 1.0, 1.0]])
    msg = _second_event(m, x, str(tmp_path / "o.h5"))
    assert "step 1" in msg and "module 'fc0'" in msg and "fwd_out" in msg \
        and "2 -inf of 6" in msg, msg


def test_a_step_libprobe_did_not_compute_is_scanned(tmp_path):
    """Scalars mode with neither flight recorder nor snapshots: libprobe
    computes no record (probe_session_step_nonfinite: not measured), so
    the step is judged from the tensors, as before: the event is still
    found and named, with the in-place module's counts taken before it
    ran."""
    m, x = _inplace_after_inf()
    tr = at.Tracer(m, str(tmp_path / "s.h5"), on_nonfinite="raise",
                   mode="scalars", ring_steps=0, snapshot_on_nonfinite=False)
    m(x).sum().backward()
    with pytest.raises(at.NonFiniteError) as e:
        tr.end_step(loss=1.0)
    assert ampprobe.Trace(str(tmp_path / "s.h5")).info["n_records"] == 0
    assert e.value.module == "0" and e.value.site == "fwd_out"
    assert "(0 NaN, 0 +inf, 2 -inf of 6)" in str(e.value)


def test_a_nan_loss_of_an_untraced_step_says_so(tmp_path):
    """every=2: step 1 is not traced (no record); its NaN loss is
    signalled as the loss's, saying the step was not traced (it named
    module 'loss' as if the loss's own code had made it)."""
    m, x = _inplace_after_inf()
    tr = at.Tracer(m, str(tmp_path / "w.h5"), on_nonfinite="warn", every=2)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always", at.NonFiniteWarning)
        for step in range(2):
            m(x.clamp(max=1.0)).sum().backward()
            tr.end_step(loss=float("nan") if step == 1 else 1.0)
    tr.close()
    msgs = [str(x.message) for x in w
            if issubclass(x.category, at.NonFiniteWarning)]
    assert len(msgs) == 1 and "step 1" in msgs[0] and \
        "the step was not traced" in msgs[0], msgs


def _no_step_cases():
    """Gradients that arrive with no step open (a review of 7769554, which
    made them an error): each a job that must run on."""
    x = torch.randn(5, 4)

    def mk():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))

    def attach_mid_step(T):  # graph built before the Tracer
        m = mk()
        loss = m(x).sum()
        tr = T(m)
        loss.backward()
        tr.end_step(loss=1.0)
        return tr

    def penalty_first(T):  # a regulariser's backward before the forward
        m = mk()
        tr = T(m)
        for _ in range(2):
            (m[0].weight ** 2).sum().backward()
            m(x).sum().backward()
            tr.end_step(loss=1.0)
        return tr

    def end_step_first(T):  # end_step() before backward(): each step's
        # gradients land in the next, with its forward: said once
        m = mk()
        tr = T(m)
        for _ in range(2):
            loss = m(x).sum()
            tr.end_step(loss=float(loss))
            loss.backward()
        return tr

    def gan_order(T):  # DCGAN: G's update through the step's old graph,
        # after end_step: G's gradients land in the next step: said once
        G, D = mk(), nn.Linear(1, 1)
        tr = T(G)
        for _ in range(2):
            fake = G(x)
            D(fake.detach()).sum().backward()
            tr.end_step(loss=1.0)
            D(fake).sum().backward()
        return tr

    def functional_weight(T):  # one module's weight used outside it
        m = mk()
        tr = T(m)
        for _ in range(2):
            h = m(x)
            (h.sum() + nn.functional.linear(x, m[0].weight).sum()).backward()
            tr.end_step(loss=1.0)
        return tr

    def heads_one_a_step(T):  # multi-task: one head a step, every
        # parameter a zero gradient (DDP's 0 * sum(p) trick)
        torch.manual_seed(0)
        trunk = nn.Sequential(nn.Linear(4, 8), nn.ReLU())
        heads = nn.ModuleList(nn.Linear(8, 1) for _ in range(4))
        m = nn.ModuleDict({"trunk": trunk, "heads": heads})
        tr = T(m)
        for step in range(3):
            out = heads[step](trunk(x))
            (out.sum() + 0 * sum(p.sum() for p in m.parameters())).backward()
            tr.end_step(loss=1.0)
        return tr

    def eval_under_grad(T):  # a check step under grad, no backward, then
        # training steps: their gradients come after their forward
        m = mk()
        tr = T(m)
        m(x).sum()
        tr.end_step(loss=1.0)
        for _ in range(2):
            m(x).sum().backward()
            tr.end_step(loss=1.0)
        return tr

    def late_every_other(T):  # end_step() before backward() from step 1
        m = mk()
        tr = T(m)
        m(x).sum().backward()
        tr.end_step(loss=1.0)
        for _ in range(3):
            loss = m(x).sum()
            tr.end_step(loss=1.0)
            loss.backward()
        return tr

    # (the no-forward warning, the late-backward one)
    return {"attach-mid-step": (attach_mid_step, (True, False)),
            "heads-one-a-step": (heads_one_a_step, (False, False)),
            "penalty-first": (penalty_first, (False, False)),
            "end-step-first": (end_step_first, (False, True)),
            "late-from-step-1": (late_every_other, (False, True)),
            "eval-under-grad": (eval_under_grad, (False, False)),
            "gan-order": (gan_order, (False, True)),
            "functional-weight": (functional_weight, (False, False))}


def test_a_dropped_tracer_gives_back_dynamos_hook_guards(tmp_path):
    """A Tracer dropped without close(): its finalizer gives back its
    share of the hook guards (the count leaked, and the setting stayed
    for the rest of the process)."""
    import gc
    g = at._HOOK_GUARDS
    before = g["tracers"]
    tr = at.Tracer(nn.Linear(2, 2), str(tmp_path / "t.h5"))
    if at._COMPILER_DISABLE is None:
        tr.close()
        pytest.skip("torch %s has no torch.compile" % torch.__version__)
    assert g["tracers"] == before + 1
    del tr
    gc.collect()
    assert g["tracers"] == before
    tr = at.Tracer(nn.Linear(2, 2), str(tmp_path / "u.h5"))
    tr.close()
    tr.close()  # idempotent: given back once
    assert g["tracers"] == before


@pytest.mark.parametrize("case", sorted(_no_step_cases()))
def test_gradients_with_no_step_open(tmp_path, case):
    """A gradient with no step open opens one (it was libprobe's
    'probe_tensor_record outside a step' from inside the backward at the
    second step, and dropped silently before the first); end_step warns,
    once, when layers got gradients in a step in which no module of the
    model ran a forward hook (the Tracer attached between a forward and
    its backward; compiled code without the hooks: test_torch_compile.py),
    not when one module's weight is used outside its forward nor when a
    step leaves heads out whose weights get zero gradients (review of
    37ea9e4: the first rule, 'most layers', warned there). A gradient
    that comes with no step open right after a step whose forward had no
    backward is warned of once: end_step() was called before backward()
    (each step's gradients land in the next), not after a check step
    under grad that a training step follows."""
    run, (warns, late) = _no_step_cases()[case]
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        tr = run(lambda m: at.Tracer(m, str(tmp_path / "t.h5"),
                                     precision="fp32"))
        tr.close()
    said = [str(x.message) for x in w if "got gradients, but its forward"
            in str(x.message)]
    assert len(said) == (1 if warns else 0), said
    if warns:
        assert "between a forward and its backward" in said[0]
    said = [str(x.message) for x in w if "ended before its backward"
            in str(x.message)]
    assert len(said) == (1 if late else 0), said
    if late:
        assert "after end_step()" in said[0], said[0]
    t = ampprobe.read_trace(tr.path)
    assert (t["records"]["site"] == SITES.index("weight_grad")).any()


@pytest.mark.skipif(not cpu_fp16_autocast(), reason="torch %s has no FP16 "
                    "CPU autocast (emulate_fp16 there)" % torch.__version__)
@pytest.mark.parametrize("planted", [False, True])
def test_real_fp16_autocast_on_the_cpu(tmp_path, planted):
    """Real FP16 on the CPU, no emulation: tracer.autocast() runs the
    policy's fp16, torch.amp.GradScaler("cpu") is read like a CUDA one; an
    over-scaled Linear overflows in its FP16 output for real, named as the
    origin, with the scaler's backoff and skipped steps in the trace."""
    torch.manual_seed(0)
    model, loss_fn = Net(), ProbNLL()
    if planted:
        big_weights(model)
    path = str(tmp_path / "t.h5")
    tr = at.Tracer(model, path, kinds={RevINLike: "revin"}, loss_fn=loss_fn,
                   precision="fp16")
    assert not tr.emulate
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 16)
    train(tr, model, loss_fn, 3, scaler=scaler, make=data, lr=1e-2)
    tr.close()
    t = ampprobe.read_trace(path)
    names = [n.decode() for n in t["layers"]["name"]]
    r = t["records"]
    fo = r[(r["layer"] == names.index("fc1")) &
           (r["site"] == SITES.index("fwd_out"))]
    assert len(fo) == 3 and (fo["dtype"] == 1).all()  # fp16, for real
    st = t["steps"]
    ev = ampprobe.postmortem(path)["event"]
    if not planted:
        assert ev["kind"] == "none" and ampprobe.verdict(path) == "healthy"
        assert list(st["loss_scale"]) == [2.0 ** 16] * 3
        assert not st["skipped"].any() and len(t["scaler_events"]) == 0
        return
    assert (ev["origin_layer"], ev["origin_site"], ev["phase"],
            ev["step"]) == ("fc1", "fwd_out", "forward", 0), ev
    assert fo["posinf_count"][0] + fo["neginf_count"][0] > 0
    assert list(st["loss_scale"]) == [2.0 ** 16, 2.0 ** 15, 2.0 ** 14]
    assert st["found_inf"].all() and st["skipped"].all()
    assert list(t["scaler_events"]["new_scale"]) == [2.0 ** 15, 2.0 ** 14,
                                                     2.0 ** 13]


class _Shared(nn.Module):
    """One Linear 'mix' applied twice in the forward, the second time to
    its own output times 50 (hunt c08 second_call); calls=1: once, to the
    first Linear's output times 2500, as large (the control)."""

    def __init__(self, calls):
        super().__init__()
        self.calls = calls
        self.inp = nn.Linear(8, 16)
        self.mix = nn.Linear(16, 16, bias=False)
        self.out = nn.Linear(16, 2)
        with torch.no_grad():
            self.mix.weight.mul_(60.0)  # call 1 stays in FP16, x50 does not

    def forward(self, x):
        h = self.inp(x)
        if self.calls == 2:
            h = self.mix(h)
        return self.out(self.mix(h * (50.0 if self.calls == 2 else 2500.0)))


@pytest.mark.parametrize("calls", [2, 1])
def test_shared_module_call_that_overflowed_and_its_feeder(tmp_path, calls):
    """A module called twice whose second call overflows in FP16 on what
    its first call made: the post-mortem's fed_by is that module, its own
    call 1 (it said 'inp', the module before the first call), and the
    origin is call 2 of 2. Called once: fed by 'inp', call 1 of 1."""
    torch.manual_seed(0)
    model = _Shared(calls)
    path = str(tmp_path / "s.h5")
    tr = at.Tracer(model, path, emulate_fp16=True)

    def make(s):
        g = torch.Generator().manual_seed(s)
        return torch.randn(32, 8, generator=g), torch.randint(0, 2, (32,), generator=g)

    train(tr, model, nn.CrossEntropyLoss(), 2, make=make)
    tr.close()
    ev = ampprobe.postmortem(path)["event"]
    assert (ev["origin_layer"], ev["origin_site"], ev["phase"], ev["step"],
            ev["kind"]) == ("mix", "fwd_out", "forward", 0, "overflow"), ev
    got = {k: ev.get(k) for k in ("fed_by", "fed_by_call", "fed_by_calls",
                                  "fed_by_own_call", "origin_call",
                                  "origin_calls")}
    if calls == 2:
        assert got == {"fed_by": "mix", "fed_by_call": 1, "fed_by_calls": 2,
                       "fed_by_own_call": True, "origin_call": 2,
                       "origin_calls": 2}, got
    else:
        assert got == {"fed_by": "inp", "fed_by_call": 1, "fed_by_calls": 1,
                       "fed_by_own_call": False, "origin_call": 1,
                       "origin_calls": 1}, got
