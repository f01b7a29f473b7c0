"""The PyTorch tracer on usage patterns real jobs have (an audit of
2026-12-03, each case failed before its fix): in-place ops on a traced
module's output (a ResNet block), namedtuple outputs, self-attention's
packed path, sparse gradients, float64 models, copies of a traced model
(EMA, teacher), evaluation under no_grad between steps, close() in the
middle of a step, end_step without a loss, and close() undoing what the
tracer changed in the model."""
import collections
import math
import copy
import io
import json
import re
import subprocess
import threading
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.nn as nn  # noqa: E402

import ampprobe  # noqa: E402
import ampprobe.torch as at  # noqa: E402
from ampprobe._lib import ProbeError  # noqa: E402

torch.set_num_threads(1)


def losses(model, steps, tracer=None, dtype=torch.float32, loss_fn=None, make=None):
    """SGD on fixed batches; the loss of each step."""
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    loss_fn = loss_fn or nn.MSELoss()
    out = []
    for s in range(steps):
        g = torch.Generator().manual_seed(s)
        x, y = make(g) if make else (torch.randn(8, 4, generator=g, dtype=dtype),
                                      torch.randn(8, 1, generator=g, dtype=dtype))
        loss = loss_fn(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if tracer is not None:
            tracer.end_step(loss=loss, optimizer=opt)
        out.append(float(loss))
    return out


def records(path):
    t = ampprobe.read_trace(path)
    names = [n.decode() if isinstance(n, bytes) else n for n in t["layers"]["name"]]
    return t, names


class Block(nn.Module):
    """A ResNet basic block: an in-place add onto a traced module's output."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.bn = nn.BatchNorm1d(4)
        self.head = nn.Linear(4, 1)

    def forward(self, x):
        out = self.bn(self.fc(x))
        out += x
        out = torch.relu_(out)
        return self.head(out)


def test_inplace_on_a_traced_output(tmp_path):
    torch.manual_seed(0)
    ref = Block()
    m = copy.deepcopy(ref)
    want = losses(ref, 5)
    tr = at.Tracer(m, str(tmp_path / "b.h5"), emulate_fp16=False, precision="fp32")
    got = losses(m, 5, tr)
    tr.close()
    assert got == want  # it raised "a view ... modified inplace"
    t, names = records(str(tmp_path / "b.h5"))
    sites = {(names[r["layer"]], ampprobe._lib.SITES[r["site"]]) for r in t["records"]}
    assert ("bn", "grad_out") in sites and ("bn", "grad_in") in sites
    assert ("head", "grad_in") in sites and ("fc", "grad_out") in sites


def test_namedtuple_output_kept(tmp_path):
    NT = collections.namedtuple("NT", "logits feat")

    class Head(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.randn(4, 1))

        def forward(self, x):
            return NT(x @ self.w, x * 2)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.head = Head()

        def forward(self, x):
            return self.head(x).logits  # a plain tuple has no .logits

    m = Net()
    with at.Tracer(m, str(tmp_path / "n.h5")) as tr:
        losses(m, 2, tr)


def test_self_attention_stays_on_its_packed_path(tmp_path, monkeypatch):
    import torch.nn.functional as F
    seen = []
    packed = F._in_projection_packed

    def spy(q, k, v, w, b=None):
        seen.append(q is k and k is v)
        return packed(q, k, v, w, b)
    monkeypatch.setattr(F, "_in_projection_packed", spy)

    class Att(nn.Module):
        def __init__(self):
            super().__init__()
            self.pre = nn.Linear(4, 4)
            self.mha = nn.MultiheadAttention(4, 2, batch_first=True)
            self.out = nn.Linear(4, 1)

        def forward(self, x):
            h = self.pre(x)
            h, _ = self.mha(h, h, h)  # query is key is value
            return self.out(h).mean(1)

    def make(g):
        return torch.randn(8, 3, 4, generator=g), torch.randn(8, 1, generator=g)

    torch.manual_seed(0)
    ref = Att()
    m = copy.deepcopy(ref)
    want = losses(ref, 10, make=make)
    seen.clear()
    tr = at.Tracer(m, str(tmp_path / "a.h5"), emulate_fp16=False, precision="fp32")
    got = losses(m, 10, tr, make=make)
    tr.close()
    # q, k, v became three objects: three GEMMs instead of one
    assert seen and all(seen)
    assert got == want
    for a, b in zip(ref.parameters(), m.parameters()):
        assert torch.equal(a, b)


def test_sparse_gradients(tmp_path):
    class Emb(nn.Module):
        def __init__(self):
            super().__init__()
            self.e = nn.Embedding(10, 4, sparse=True)
            self.fc = nn.Linear(4, 1)

        def forward(self, i):
            return self.fc(self.e(i).mean(1))

    def make(g):
        return torch.randint(0, 10, (8, 3), generator=g), torch.randn(8, 1, generator=g)

    m = Emb()
    with at.Tracer(m, str(tmp_path / "s.h5")) as tr:
        losses(m, 3, tr, make=make)
    t, names = records(str(tmp_path / "s.h5"))
    assert any(names[r["layer"]] == "e" and ampprobe._lib.SITES[r["site"]] == "weight_grad"
               for r in t["records"])


def test_float64_model_stays_float64(tmp_path):
    torch.manual_seed(0)
    ref = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1)).double()
    m = copy.deepcopy(ref)
    want = losses(ref, 5, dtype=torch.float64)
    crit = nn.MSELoss()  # a loss module runs in FP32: float64 was cast down
    tr = at.Tracer(m, str(tmp_path / "d.h5"), loss_fn=crit, emulate_fp16=False,
                   precision="fp32")
    got = losses(m, 5, tr, dtype=torch.float64, loss_fn=crit)
    tr.close()
    assert got == want


@pytest.mark.parametrize("value", [2.7e43, -1e300, 1e39, float("inf"),
                                   float("-inf"), float("nan")])
def test_float64_beyond_float32_range(tmp_path, value):
    """float64 values beyond float32's range are finite values: recorded
    saturated at +-3.4e38, no event, verdict healthy (they were recorded
    as inf: a healthy float64 job raised NonFiniteError); inf and NaN stay
    inf and NaN."""
    m = nn.Linear(4, 4).double()
    path = str(tmp_path / "t.h5")
    tr = at.Tracer(m, path, precision="fp32", on_nonfinite="warn")
    x = torch.randn(2, 4, dtype=torch.float64)
    x[0, 1] = value
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        m(x)
        tr.end_step(loss=1.0)
    tr.close()
    said = [str(x.message) for x in w
            if issubclass(x.category, at.NonFiniteWarning)]
    rec = stats_by_site(path)[(0, "input", "fwd_out")][0]
    if math.isfinite(value):
        assert not said, said
        assert rec[2] == 3.4028234663852886e38 and rec[4:] == (0, 0), rec
        assert ampprobe.postmortem(path)["verdict"] == "healthy"
    else:
        assert len(said) == 1 and "'input'" in said[0], said
        assert rec[4] == (1 if math.isnan(value) else 0), rec


def test_copies_of_a_traced_model(tmp_path):
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4), nn.Linear(4, 1))
    tr = at.Tracer(m, str(tmp_path / "c.h5"), fp32="layernorm", emulate_fp16=True)
    ema = copy.deepcopy(m)  # an EMA / teacher copy, hooks included
    with torch.no_grad():
        for p in ema.parameters():
            p.mul_(3.0)
        x = torch.randn(2, 4)
        # the copy's FP32-forced LayerNorm computes with its own weights
        assert torch.equal(ema[1](x), nn.functional.layer_norm(x, (4,), ema[1].weight, ema[1].bias))
    with torch.enable_grad():
        ema(torch.randn(2, 4)).sum().backward()  # the copy's pass records nothing
    losses(m, 1, tr)
    tr.close()
    t, names = records(str(tmp_path / "c.h5"))
    w0 = [r["absmax"] for r in t["records"] if names[r["layer"]] == "0"
          and ampprobe._lib.SITES[r["site"]] == "weight"]
    assert w0 and max(w0) < 2.0  # the original's weights only, not 3x
    ema(torch.randn(2, 4))  # after close: no error, no record


def test_evaluation_between_steps_is_not_recorded(tmp_path):
    m = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 1))
    tr = at.Tracer(m, str(tmp_path / "e.h5"))
    for epoch in range(2):
        losses(m, 1, tr)
        m.eval()
        with torch.no_grad():
            for _ in range(50):
                m(torch.randn(8, 4))
        m.train()
        assert len(tr._refs) == 0  # every eval batch was held until end_step
    tr.close()
    t, _ = records(str(tmp_path / "e.h5"))
    per_step = [int((t["records"]["step"] == s).sum()) for s in (0, 1)]
    assert per_step[0] == per_step[1]  # the eval records landed in step 1


def test_close_in_the_middle_of_a_step(tmp_path):
    m = nn.Sequential(nn.Linear(4, 1))
    tr = at.Tracer(m, str(tmp_path / "m.h5"))
    loss = m(torch.randn(2, 4)).sum()
    tr.close()  # a step is open
    loss.backward()  # its gradient hooks fire after close: nothing written
    with pytest.raises(ProbeError):
        tr.end_step(loss=loss)  # a clean error, never freed memory
    m(torch.randn(2, 4))  # the model still runs
    assert ampprobe.read_trace(str(tmp_path / "m.h5"))["info"]["complete"] == 1


def test_no_loss_given_is_not_a_nonfinite_loss(tmp_path):
    m = nn.Sequential(nn.Linear(4, 1))
    tr = at.Tracer(m, str(tmp_path / "l.h5"), on_nonfinite="raise")
    for _ in range(3):
        m(torch.randn(2, 4)).sum().backward()
        tr.end_step()  # loss= is optional ("not measured"): it raised
    tr.close()


def test_a_loss_that_is_not_a_scalar(tmp_path):
    m = nn.Sequential(nn.Linear(4, 1))
    tr = at.Tracer(m, str(tmp_path / "v.h5"))
    loss = m(torch.randn(3, 4))
    with pytest.raises(ValueError, match="scalar loss"):
        tr.end_step(loss=loss)
    tr.end_step(loss=loss.mean())  # the step was left as it was
    tr.close()


def test_close_gives_the_model_back(tmp_path):
    m = nn.Sequential(nn.Linear(4, 4), nn.ReLU(inplace=True), nn.LayerNorm(4))
    tr = at.Tracer(m, str(tmp_path / "g.h5"), loss_fn=nn.MSELoss(), fp32="layernorm")
    tr.close()
    assert "forward" not in m[2].__dict__ and m[1].inplace is True
    torch.save(m, io.BytesIO())  # a local closure could not be pickled


def test_layers_glob_on_a_full_path_that_was_cut(tmp_path):
    long = "transformer_encoder_layer_stack_with_a_rather_long_name_" + "x" * 10
    m = nn.Sequential()
    m.add_module(long, nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4)))
    m.add_module("head", nn.Linear(4, 1))
    for layers in (long + ".1", "*.1"):
        tr = at.Tracer(m, str(tmp_path / "g.h5"), overwrite=True, layers=layers)
        m(torch.randn(2, 4)).sum().backward()
        tr.end_step()
        tr.close()
        t, names = records(str(tmp_path / "g.h5"))
        got = {names[i] for i in t["records"]["layer"]}
        assert len(got) == 1 and next(iter(got)).endswith("~2"), got  # it was empty


def test_nested_and_dict_outputs_are_rounded_and_recorded(tmp_path):
    class D(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.ones(4))

        def forward(self, x):
            return {"out": (x * 0 + 1) * self.w * 1.2e5}  # beyond binary16: inf

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.d = D()
            self.rnn = nn.LSTM(4, 4, batch_first=True)

        def forward(self, x):
            h, (hn, cn) = self.rnn(x)
            return self.d(hn[0])["out"]

    m = Net()
    tr = at.Tracer(m, str(tmp_path / "d.h5"), emulate_fp16=True)
    out = m(torch.ones(2, 3, 4))
    assert torch.isinf(out).all()  # rounded: it stayed 1.2e5
    out.sum().backward()
    tr.end_step()
    tr.close()
    t, names = records(str(tmp_path / "d.h5"))
    rnn_outs = [r for r in t["records"] if names[r["layer"]] == "rnn"
                and ampprobe._lib.SITES[r["site"]] == "fwd_out"]
    assert len(rnn_outs) == 3  # output, h and c (h and c were skipped)


def test_two_tracers_and_a_criterion_in_the_model(tmp_path):
    crit = nn.MSELoss()
    m = nn.Sequential(nn.Linear(4, 1))
    m.add_module("crit", crit)  # a child of the model and the loss_fn
    tr = at.Tracer(m[:1], str(tmp_path / "a.h5"))
    tr2 = at.Tracer(m[:1], str(tmp_path / "b.h5"))
    tr.close()  # took the second tracer's module reference with it
    assert m[0]._ampprobe_ref[0]() is tr2
    tr2.close()
    tr3 = at.Tracer(m, str(tmp_path / "c.h5"), loss_fn=crit)
    assert [L.name for L in tr3._layers].count("loss") == 1
    assert "crit" not in [L.name for L in tr3._layers]  # it was two layers
    tr3.close()


def test_unfrozen_later_and_a_dropped_tracer(tmp_path):
    import gc
    m = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 1))
    m[0].requires_grad_(False)
    tr = at.Tracer(m, str(tmp_path / "u.h5"))
    m[0].requires_grad_(True)  # fine-tuning unfreezes the backbone
    m(torch.randn(2, 4)).sum().backward()
    tr.end_step()
    m(torch.randn(2, 4)).sum().backward()
    tr.end_step()
    del tr  # never closed: the hooks held it, and the file stayed locked
    gc.collect()
    t, names = records(str(tmp_path / "u.h5"))
    wg = [r for r in t["records"] if names[r["layer"]] == "0"
          and ampprobe._lib.SITES[r["site"]] == "weight_grad"]
    assert len(wg) >= 2  # hooked from the step after the unfreeze
    at.Tracer(m, str(tmp_path / "u.h5"), overwrite=True).close()


# ---- no_grad inside a training step; activation checkpointing (audit F2, F3) ----

def sites_of(path, step=None):
    """(layer name, site) of each record, in execution order."""
    t, names = records(path)
    r = t["records"]
    if step is not None:
        r = r[r["step"] == step]
    r = r[np.lexsort((r["seq"], r["step"]))]
    return [(names[x["layer"]], ampprobe._lib.SITES[x["site"]]) for x in r]


class Tower(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.act = nn.Tanh()
        self.proj = nn.Linear(8, 4)

    def forward(self, x):
        return self.proj(self.act(self.fc(x)))


class Distill(nn.Module):
    """A student trained against a teacher run under no_grad inside the
    forward (distillation, BYOL/MoCo targets); teacher_first: the teacher
    runs before the student."""

    def __init__(self, teacher_first):
        super().__init__()
        self.student, self.teacher = Tower(), Tower()
        self.teacher_first = teacher_first
        for p in self.teacher.parameters():
            p.requires_grad_(False)

    def forward(self, x):
        if self.teacher_first:
            with torch.no_grad():
                tgt = self.teacher(x)
            return self.student(x), tgt
        s = self.student(x)
        with torch.no_grad():
            tgt = self.teacher(x)
        return s, tgt


def distill_steps(tr, m, steps, bad_step=None, mode=None):
    opt = torch.optim.SGD(m.student.parameters(), 1e-3)
    for step in range(steps):
        if step == bad_step:
            with torch.no_grad():
                m.teacher.fc.weight.mul_(1e5)  # FP16 overflow at its output
        x = torch.randn(4, 8, generator=torch.Generator().manual_seed(step))
        s, t = m(x)
        loss = ((s - t) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        tr.end_step(loss=loss, optimizer=opt)


@pytest.mark.parametrize("teacher_first", [False, True])
@pytest.mark.parametrize("record_input", [True, False])
def test_no_grad_teacher_inside_the_step_is_recorded(tmp_path, teacher_first,
                                                    record_input):
    """A teacher run under no_grad inside the training forward is recorded
    in order (its forward sites, no gradients); raise names it (it was
    never recorded: raise named the student's grad_out, the post-mortem an
    optimizer-phase master weight)."""
    torch.manual_seed(0)
    m = Distill(teacher_first)
    p = str(tmp_path / "d.h5")
    tr = at.Tracer(m, p, emulate_fp16=True, on_nonfinite="raise",
                   record_input=record_input)
    with pytest.raises(at.NonFiniteError) as e:
        distill_steps(tr, m, 3, bad_step=1)
    assert (e.value.module, e.value.site, e.value.phase, e.value.step) == (
        "teacher.fc", "fwd_out", "forward", 1), str(e.value)
    got = sites_of(p, step=0)
    fwd = [(n, s) for n, s in got if s in ("fwd_in", "weight", "fwd_out")]
    teacher = [(n, s) for n, s in fwd if n.startswith("teacher.")]
    student = [(n, s) for n, s in fwd if n.startswith("student.")]
    assert teacher and len(teacher) == len(student)
    assert not [x for x in got if x[0].startswith("teacher.")
                and x[1] in ("grad_out", "grad_in", "weight_grad")]
    first = fwd.index(teacher[0]) < fwd.index(student[0])
    assert first == teacher_first  # in execution order
    assert ampprobe.postmortem(p)["event"]["origin_layer"] == "teacher.fc"


def test_no_grad_submodule_called_from_the_loop_inside_the_step(tmp_path):
    """The job runs a submodule of the traced model under no_grad itself,
    after the training forward and before end_step: inside the step,
    recorded."""
    torch.manual_seed(0)
    m = Distill(False)
    p = str(tmp_path / "l.h5")
    tr = at.Tracer(m, p)
    opt = torch.optim.SGD(m.student.parameters(), 1e-3)
    for step in range(2):
        x = torch.randn(4, 8)
        s = m.student(x)
        with torch.no_grad():
            t = m.teacher(x)
        loss = ((s - t) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        tr.end_step(loss=loss, optimizer=opt)
    tr.close()
    for step in (0, 1):
        got = sites_of(p, step)
        assert ("teacher.proj", "fwd_out") in got and ("teacher.fc", "fwd_in") in got


def test_evaluation_before_the_first_step_starts_no_step(tmp_path):
    """No_grad passes before the first training forward (a validation
    before training, a warm-up) start no step and record nothing; step 0
    is the training step and holds what a run without them holds."""
    def run(path, evaluate):
        torch.manual_seed(0)
        m = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 1))
        tr = at.Tracer(m, path)
        if evaluate:
            with torch.no_grad():
                for _ in range(3):
                    m(torch.randn(8, 4))
            assert tr._step is None and not tr._refs
        losses(m, 2, tr)
        with torch.no_grad():  # between steps: not recorded either
            m(torch.randn(8, 4))
        tr.close()
        return sites_of(path)

    assert run(str(tmp_path / "a.h5"), True) == run(str(tmp_path / "b.h5"), False)
    t, _ = records(str(tmp_path / "a.h5"))
    assert sorted(set(t["records"]["step"].tolist())) == [0, 1]


class Ckpt(nn.Module):
    def __init__(self, how):
        super().__init__()
        self.how = how
        self.inp = nn.Linear(8, 16)
        self.blk = nn.Sequential(nn.Linear(16, 16), nn.GELU(), nn.Linear(16, 16))
        self.norm = nn.LayerNorm(16)
        self.head = nn.Linear(16, 1)

    def forward(self, x):
        h = self.inp(x)
        if self.how == "plain":
            h = self.blk(h)
        else:
            from torch.utils.checkpoint import checkpoint
            h = checkpoint(self.blk, h, use_reentrant=self.how == "reentrant")
        return self.head(self.norm(h))


def ckpt_run(path, how, steps=3, bad_step=None, micro=1, mode="record",
             mul=3e4):
    torch.manual_seed(0)
    m = Ckpt(how)
    crit = nn.MSELoss()
    tr = at.Tracer(m, path, loss_fn=crit, emulate_fp16=True, on_nonfinite=mode)
    sc = at.LossScaler(init_scale=128.0)
    tr.attach_scaler(sc)
    opt = torch.optim.SGD(m.parameters(), 1e-3)
    out = []
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        for step in range(steps):
            if step == bad_step:
                with torch.no_grad():
                    m.blk[0].weight.mul_(mul)
            opt.zero_grad()
            for k in range(micro):
                g = torch.Generator().manual_seed(step * 10 + k)
                x = torch.randn(4, 8, generator=g) * (8.0 if bad_step is not None
                                                      and step >= bad_step else 1.0)
                loss = crit(m(x), torch.randn(4, 1, generator=g))
                sc.scale(loss).backward()
            sc.step(opt)
            sc.update()
            tr.end_step(loss=loss, optimizer=opt)
            out.append(float(loss))
    tr.close()
    warned = [str(x.message) for x in w if issubclass(x.category, at.NonFiniteWarning)]
    return out, warned


@pytest.mark.parametrize("how", ["reentrant", "nonreentrant"])
@pytest.mark.parametrize("micro", [1, 2])
def test_checkpointed_segment_is_recorded_once_in_order(tmp_path, how, micro):
    """torch.utils.checkpoint: the segment's first forward (under no_grad
    when reentrant) is recorded, its recomputation in the backward is not
    recorded again; the records are those of the model without
    checkpointing, in the same order, micro-batches included (the segment
    was recorded only when recomputed, after the loss)."""
    want, _ = ckpt_run(str(tmp_path / "p.h5"), "plain", micro=micro)
    got, _ = ckpt_run(str(tmp_path / "c.h5"), how, micro=micro)
    assert got == want
    assert sites_of(str(tmp_path / "c.h5")) == sites_of(str(tmp_path / "p.h5"))


@pytest.mark.parametrize("how", ["reentrant", "nonreentrant"])
def test_checkpointed_overflow_named_in_the_forward(tmp_path, how):
    """An FP16 overflow inside a checkpointed segment is named at its
    module, forward phase (warn named the LayerNorm's fwd_in), and the
    post-mortem's fed_by is the module before the segment (was: loss)."""
    p = str(tmp_path / "o.h5")
    _, warned = ckpt_run(p, how, bad_step=1, mode="warn")
    assert warned and "step 1, forward phase" in warned[0] \
        and "module 'blk.0'" in warned[0] and "fwd_out" in warned[0], warned
    ev = ampprobe.postmortem(p)["event"]
    assert (ev["origin_layer"], ev["origin_site"]) == ("blk.0", "fwd_out")
    assert ev.get("fed_by") == "inp", ev.get("fed_by")


def test_weights_edited_between_steps_are_not_blamed_on_an_update(tmp_path):
    """Weights multiplied by 1e6 under no_grad between steps (their FP16
    copy overflows, the FP32 masters stay finite): the diagnosis says they
    were changed outside the optimizer (it said "a non-finite update
    reached the weights ... lower the learning rate"; audit F8)."""
    p = str(tmp_path / "e.h5")
    ckpt_run(p, "plain", bad_step=1, mul=1e6)
    pm = ampprobe.postmortem(p)
    assert (pm["event"]["kind"], pm["event"]["origin_layer"],
            pm["event"]["origin_site"]) == ("weight-nonfinite", "blk.0", "weight")
    top = pm["diagnosis"][0]
    assert top["id"] == "check-weights", top
    assert "changed outside the optimizer before step 1" in top["title"], top
    assert "finite after step 0's update" in " ".join(top["evidence"]), top
    text = json.dumps(pm["diagnosis"])
    assert "lower-lr" not in text and "non-finite update reached" not in text, text


def frame_of(name, filename):
    """at._in_backward() asked by a forward hook called from a function
    `name` compiled as if it were in `filename` (a synthetic stack: torch's
    checkpoint hook as some torch version names it), on a thread of its own
    (as a CUDA device thread runs a backward: no backward() frame below)."""
    ns = {}
    exec(compile("def %s(cb):\n    return cb()\n" % name, filename, "exec"), ns)

    def forward_hook():  # _in_backward starts at its caller's caller
        return at._in_backward()

    box = []
    t = threading.Thread(target=lambda: box.append(ns[name](lambda: forward_hook())))
    t.start()
    t.join()
    return box[0]


@pytest.mark.parametrize("name,want", [
    ("unpack", True),        # torch 1.13's _checkpoint_without_reentrant
    ("unpack_hook", True),   # torch 2.x's _checkpoint_hook
    ("pack_hook", False), ("forward", False)])
def test_recomputation_frames_of_every_torch_version(name, want):
    """The non-reentrant checkpoint recomputes inside its unpack hook, named
    `unpack` in torch 1.13 and `unpack_hook` in torch 2.x (only `unpack`
    was known: on a CUDA device thread, where no backward() frame is on
    the stack, torch 2's recomputation was taken for a second forward of
    the step and recorded); only in torch/utils/checkpoint.py."""
    assert frame_of(name, at._CHECKPOINT_FILE) is want
    assert frame_of(name, "/somewhere/else.py") is False


def test_graph_task_says_backward(monkeypatch):
    """Under torch >= 2 the engine's graph task id says whether a backward
    is running, on any thread, whatever the frames are called; -1 (none)
    falls back to the frames."""
    monkeypatch.setattr(at, "_GRAPH_TASK_ID", lambda: 3)
    assert at._in_backward() is True
    monkeypatch.setattr(at, "_GRAPH_TASK_ID", lambda: -1)
    assert at._in_backward() is False


def test_in_backward_with_this_torch():
    """With the installed torch: False in a forward, True in a backward (a
    custom Function's, where reentrant checkpointing recomputes)."""
    seen = []

    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            seen.append(("fwd", at._in_backward()))
            return x * 2

        @staticmethod
        def backward(ctx, g):
            seen.append(("bwd", at._in_backward()))
            return g * 2

    x = torch.ones(2, requires_grad=True)
    F.apply(x).sum().backward()
    assert seen == [("fwd", False), ("bwd", True)]


# ---- gradient accumulation: several micro-batches per step ----------------------

class Accum(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(4, 8)
        self.act = nn.ReLU(inplace=True)
        self.fc2 = nn.Linear(8, 1)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


def accum_run(path, bad_mb, what, bad_step, scale, mode):
    """4 micro-batches per optimizer step, FP16 emulated, a LossScaler;
    micro-batch bad_mb of bad_step makes fc1's output overflow (what
    "fwd") or its loss -inf outside any module (what "loss")."""
    torch.manual_seed(0)
    m = Accum()
    crit = nn.MSELoss()
    tr = at.Tracer(m, path, loss_fn=crit if what == "fwd" else None,
                   emulate_fp16=True, on_nonfinite=mode)
    sc = at.LossScaler(init_scale=scale)
    tr.attach_scaler(sc)
    opt = torch.optim.SGD(m.parameters(), 1e-3)
    for step in range(3):
        opt.zero_grad()
        tot = 0.0
        for mb in range(4):
            g = torch.Generator().manual_seed(step * 10 + mb)
            x, y = torch.randn(2, 4, generator=g), torch.randn(2, 1, generator=g)
            bad = step == bad_step and mb == bad_mb
            if bad and what == "fwd":
                x[0, 0] = 1e6  # finite in FP32, inf once fc1 is in FP16
            loss = crit(m(x), y) / 4
            if bad and what == "loss":
                loss = loss + torch.log(torch.zeros(()))
            tot += float(loss)
            sc.scale(loss).backward()
        sc.step(opt)
        sc.update()
        tr.end_step(loss=tot, optimizer=opt)
    tr.close()


@pytest.mark.parametrize("bad_mb", [0, 2, 3])
@pytest.mark.parametrize("what", ["fwd", "loss"])
@pytest.mark.parametrize("bad_step,scale", [(1, 256.0), (1, 1e35), (0, 1e35)])
def test_gradient_accumulation_names_the_micro_batch_forward(
        tmp_path, cli, bad_mb, what, bad_step, scale):
    """With several micro-batches per step, a non-finite forward in a later
    micro-batch is named (raise and the post-mortem), not the loss: an
    earlier micro-batch's routine gradient overflow (scale 1e35: every
    step's gradients overflow; bad_step 0: the session's first non-finite
    record of the step, bad_step 1: a step after one) came first in the
    step and made raise say "loss, forward" (the loss-outside rule). A loss
    made -inf outside any module is the loss."""
    p = str(tmp_path / "a.h5")
    with pytest.raises(at.NonFiniteError) as e:
        accum_run(p, bad_mb, what, bad_step, scale, "raise")
    want = ("fc1", "fwd_out") if what == "fwd" else ("loss", "loss")
    got = (e.value.module, e.value.site, e.value.phase, e.value.step)
    assert got == want + ("forward", bad_step), str(e.value)
    if what == "fwd":
        assert "(0 NaN, 0 +inf, 0 -inf" not in str(e.value)  # the bad micro-batch's
    p = str(tmp_path / "b.h5")
    accum_run(p, bad_mb, what, bad_step, scale, "record")
    ev = ampprobe.postmortem(p)["event"]
    if what == "fwd":
        assert (ev["origin_layer"], ev["origin_site"], ev["phase"],
                ev["step"]) == ("fc1", "fwd_out", "forward", bad_step), ev
    else:
        assert (ev["kind"], ev["phase"], ev["step"]) == (
            "loss-nonfinite", "forward", bad_step), ev
    out = subprocess.run([cli, "postmortem", "--json", p], stdout=subprocess.PIPE,
                         universal_newlines=True, check=False).stdout
    cev = json.loads(out)["event"]
    assert (cev["kind"], cev["step"], cev.get("origin_layer")) == (
        ev["kind"], ev["step"], ev.get("origin_layer")), out[:400]


# ---- in-place modules stay in place (audit F4) ---------------------------------

INPLACE = {
    "relu": lambda ip: nn.ReLU(inplace=ip),
    "leaky": lambda ip: nn.LeakyReLU(0.1, inplace=ip),
    "relu6": lambda ip: nn.ReLU6(inplace=ip),
    "elu": lambda ip: nn.ELU(inplace=ip),
    "silu": lambda ip: nn.SiLU(inplace=ip),
    "dropout": lambda ip: nn.Dropout(0.3, inplace=ip),
}


class SideEffect(nn.Module):
    """Relies on the in-place module's side effect: its result is dropped
    (older code), or used beside the alias (`h + y`); explicit=True: the
    same computation written out of place."""

    def __init__(self, act, how, explicit=False):
        super().__init__()
        self.fc = nn.Linear(4, 8)
        self.act = act
        self.out = nn.Linear(8, 1)
        self.how, self.explicit = how, explicit

    def forward(self, x):
        h = self.fc(x)
        if self.how == "dropped":
            if self.explicit:
                h = self.act(h)
            else:
                self.act(h)
            return self.out(h)
        y = self.act(h)
        return self.out((y if self.explicit else h) + y)


def seeded_losses(model, steps, tracer=None):
    torch.manual_seed(123)  # dropout's masks
    return losses(model, steps, tracer)


@pytest.mark.parametrize("act", sorted(INPLACE))
@pytest.mark.parametrize("how", ["dropped", "alias"])
def test_inplace_module_keeps_its_side_effect(tmp_path, act, how):
    """A traced model whose forward relies on an in-place module writing
    through its input trains exactly as untraced (the tracer turned
    inplace off: the output differed by 0.53)."""
    torch.manual_seed(0)
    ref = SideEffect(INPLACE[act](True), how)
    m = copy.deepcopy(ref)
    want = seeded_losses(ref, 4)
    tr = at.Tracer(m, str(tmp_path / "i.h5"), precision="fp32")
    got = seeded_losses(m, 4, tr)
    assert m.act.inplace is True  # in place while traced
    tr.close()
    assert got == want


def same_stats(a, b):
    """Equal keys, counts; extremes equal to a relative 1e-6 (torch's
    in-place ELU computes its gradient from its result: an ulp apart)."""
    assert a.keys() == b.keys()
    for k in a:
        assert len(a[k]) == len(b[k]), k
        for x, y in zip(a[k], b[k]):
            assert x[3:] == y[3:], k
            assert x[:3] == pytest.approx(y[:3], rel=1e-6, abs=1e-12), k
    return True


def same_runs(tmp_path, emulate, make):
    """Traces make(False) and make(True), each built from seed 0, for 3
    steps (FP32, or emulated FP16); asserts equal losses and same_stats of
    every site, and returns the two runs' stats_by_site."""
    def run(path, flag):
        torch.manual_seed(0)
        m = make(flag)
        tr = at.Tracer(m, path, emulate_fp16=emulate,
                       precision=None if emulate else "fp32")
        got = seeded_losses(m, 3, tr)
        tr.close()
        return got, stats_by_site(path)

    l_a, s_a = run(str(tmp_path / "a.h5"), False)
    l_b, s_b = run(str(tmp_path / "b.h5"), True)
    assert l_b == pytest.approx(l_a, rel=1e-6)
    assert same_stats(s_b, s_a)
    return s_a, s_b


def stats_by_site(path):
    t, names = records(path)
    out = collections.defaultdict(list)
    for r in t["records"]:
        out[(int(r["step"]), names[r["layer"]], ampprobe._lib.SITES[r["site"]])].append(
            tuple(float(r[f]) for f in ("min", "max", "absmax")) +
            tuple(int(r[f]) for f in ("count", "nan_count", "posinf_count")))
    return dict(out)


@pytest.mark.parametrize("act", ["relu", "leaky", "elu", "dropout"])
@pytest.mark.parametrize("emulate", [False, True])
def test_inplace_module_records_as_out_of_place(tmp_path, act, emulate):
    """Every site of an in-place module (fwd_in before it runs, fwd_out,
    grad_out, grad_in) and of its neighbours has the statistics of the same
    model with the module out of place, FP32 and under FP16 emulation."""
    s_out, s_in = same_runs(tmp_path, emulate, lambda ip: nn.Sequential(
        nn.Linear(4, 8), INPLACE[act](ip), nn.Linear(8, 1)))
    fin = s_in[(0, "1", "fwd_in")][0]
    assert fin[0] < 0  # the input as it was before the module ran
    assert (0, "1", "grad_in") in s_in and (0, "1", "grad_out") in s_in


def test_inplace_under_emulation_keeps_its_side_effect(tmp_path):
    """Under FP16 emulation an in-place module still writes through its
    input: the same losses as the model written out of place (the
    emulation handed it a rounded copy: its effect on `h` was lost)."""
    def run(path, explicit):
        torch.manual_seed(0)
        m = SideEffect(nn.ReLU(inplace=not explicit), "dropped", explicit)
        tr = at.Tracer(m, path, emulate_fp16=True)
        got = losses(m, 3, tr)
        tr.close()
        return got

    assert run(str(tmp_path / "a.h5"), False) == run(str(tmp_path / "b.h5"), True)


class _SavedThenInplace(nn.Module):
    """An op that saves its output for the backward (act: a module, or a
    function such as torch.softmax), then an in-place module on it."""
    def __init__(self, act, inplace_mod):
        super().__init__()
        self.fc, self.ip, self.head = nn.Linear(8, 8), inplace_mod, nn.Linear(8, 4)
        self.act = act

    def forward(self, x):
        return self.head(self.ip(self.act(self.fc(x))))


@pytest.mark.parametrize("act", ["softmax-module", "softmax", "sigmoid", "tanh",
                                 "exp"])
@pytest.mark.parametrize("noop", ["dropout-eval", "dropout-p0"])
def test_inplace_module_on_a_saved_tensor_under_emulation(tmp_path, act, noop):
    """An in-place module that changes nothing (Dropout(inplace=True) in
    eval mode or with p=0) after a function that saved its output for the
    backward: under FP16 emulation the job trains as untraced (the
    in-place rounding bumped the tensor's version: 'one of the variables
    needed for gradient computation has been modified by an inplace
    operation', review of 1f8f8eb), the backward using the rounded
    values."""
    def run(traced):
        torch.manual_seed(0)
        a = {"softmax-module": nn.Softmax(-1),
             "softmax": lambda h: torch.softmax(h, -1), "sigmoid": torch.sigmoid,
             "tanh": torch.tanh, "exp": lambda h: torch.exp(h.clamp(max=4))}[act]
        ip = {"dropout-eval": nn.Dropout(0.5, inplace=True).eval(),
              "dropout-p0": nn.Dropout(0.0, inplace=True)}[noop]
        m = _SavedThenInplace(a, ip)
        tr = at.Tracer(m, str(tmp_path / "t.h5"), emulate_fp16=True,
                       overwrite=True) if traced else None
        got = losses(m, 3, tr, make=lambda g: (torch.randn(8, 8, generator=g),
                                               torch.randn(8, 4, generator=g)))
        if tr:
            tr.close()
        return got

    plain, traced = run(False), run(True)
    assert len(traced) == 3 and all(math.isfinite(v) for v in traced)
    assert traced == pytest.approx(plain, rel=1e-2)  # binary16 rounding only


def test_inplace_under_emulation_outside_a_step(tmp_path):
    """The same between steps (evaluation under no_grad, no step open) and
    in a deep copy (an EMA or teacher model: hooks copied, never recorded):
    the in-place module still writes through its input (it was handed a
    rounded copy there, and the side effect was lost)."""
    import copy

    class Drop(nn.Module):
        def __init__(self):
            super().__init__()
            self.act = nn.ReLU(inplace=True)

        def forward(self, x):
            h = x * 1.0
            self.act(h)  # the result dropped: the side effect is used
            return h.sum(-1, keepdim=True)

    m = Drop()
    x = torch.tensor([[1.0, -2.0, 3.0, -4.0]])  # exact in binary16
    with torch.no_grad():
        want = m(x).item()
    tr = at.Tracer(m, str(tmp_path / "e.h5"), precision="fp16",
                   emulate_fp16=True, record_input=False)
    xg = x.clone().requires_grad_()
    out = m(xg)
    out.sum().backward()
    tr.end_step(loss=out.sum())
    assert out.item() == want
    with torch.no_grad():
        assert m(x).item() == want  # between steps
    twin = copy.deepcopy(m)
    assert twin(x.clone()).item() == want  # a copy, grad on
    with torch.no_grad():
        assert twin(x).item() == want
    tr.close()


class ResBlock(nn.Module):
    """torchvision's pattern: out = relu(bn(fc(x)) + x), ReLU in place."""

    def __init__(self, ip):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.bn = nn.BatchNorm1d(4)
        self.relu = nn.ReLU(inplace=ip)
        self.head = nn.Linear(4, 1)

    def forward(self, x):
        out = self.bn(self.fc(x))
        out *= 0.5  # an in-place op between the traced module and the ReLU
        out += x
        return self.head(self.relu(out))


def test_inplace_after_other_inplace_ops_records_its_gradients(tmp_path):
    """An in-place ReLU on a tensor modified in place after its producer
    (a ResNet's `out += x`; here also `out *= 0.5`): its grad_in is its own
    (that of `out` as it entered), not the producer's node's."""
    def run(path, ip):
        torch.manual_seed(0)
        m = ResBlock(ip)
        tr = at.Tracer(m, path, precision="fp32")
        got = losses(m, 3, tr)
        tr.close()
        return got, stats_by_site(path)

    l_out, s_out = run(str(tmp_path / "o.h5"), False)
    l_in, s_in = run(str(tmp_path / "i.h5"), True)
    assert l_in == l_out and same_stats(s_in, s_out)


# ---- arguments passed by keyword (torch >= 2.0's hooks see them) ----------------

KWARGS_SEEN = at._HOOK_KWARGS  # torch 1.13's forward pre-hooks get args only


class Gate(nn.Module):
    """forward(x, scale): `scale` is a float tensor, by position or name."""

    def forward(self, x, scale):
        return x * scale


class KwNet(nn.Module):
    """The same network calling its modules with positional or keyword
    arguments: a Linear (fc2(input=h)) and a two-input module
    (gate(h, scale=s))."""

    def __init__(self, by_name):
        super().__init__()
        self.by_name = by_name
        self.fc1, self.gate, self.fc2 = nn.Linear(4, 8), Gate(), nn.Linear(8, 1)
        self.scale = nn.Parameter(torch.full((8,), 0.5))

    def forward(self, x):
        h = torch.tanh(self.fc1(x))
        if self.by_name:
            h = self.gate(h, scale=self.scale * 1.0)
            return self.fc2(input=h)
        return self.fc2(self.gate(h, self.scale * 1.0))


class ByName(nn.Module):
    """Calls its inner Linear by keyword: inner(input=x)."""

    def __init__(self):
        super().__init__()
        self.inner = nn.Linear(4, 1)

    def forward(self, x):
        return self.inner(input=x)


@pytest.mark.skipif(not KWARGS_SEEN, reason="torch %s's hooks get no keyword "
                    "arguments (docs/python.md)" % torch.__version__)
@pytest.mark.parametrize("emulate", [False, True])
def test_keyword_arguments_recorded_as_positional(tmp_path, emulate):
    """Every site of a model whose modules are called by keyword has the
    statistics of the same model called by position: fwd_in, grad_in, the
    FP16 rounding of the inputs under emulation, and the model's input."""
    s_pos, s_kw = same_runs(tmp_path, emulate, KwNet)
    for site in ("fwd_in", "grad_in"):
        assert len(s_kw[(0, "fc2", site)]) == 1
        assert len(s_kw[(0, "gate", site)]) == 2  # h and scale


@pytest.mark.skipif(not KWARGS_SEEN, reason="torch %s's hooks get no keyword "
                    "arguments (docs/python.md)" % torch.__version__)
def test_keyword_input_overflows_under_emulation(tmp_path):
    """A value past FP16's range passed by keyword is rounded to inf under
    emulation and recorded, as one passed by position (it went through
    unrounded and unrecorded: the job's output was finite)."""
    torch.manual_seed(0)
    m = ByName()
    path = str(tmp_path / "t.h5")
    tr = at.Tracer(m, path, emulate_fp16=True)
    x = torch.full((2, 4), 70000.0)
    out = m(x)
    assert not torch.isfinite(out).any()
    out.sum().backward()
    tr.end_step()
    tr.close()
    s = stats_by_site(path)
    fin = s[(0, "inner", "fwd_in")]  # recorded as given, before rounding
    assert len(fin) == 1 and fin[0][:4] == (70000.0, 70000.0, 70000.0, 8)
    fout = s[(0, "inner", "fwd_out")][0]
    assert fout[4] + fout[5] == 2  # computed from the rounded (inf) input


@pytest.mark.skipif(not KWARGS_SEEN, reason="torch %s's hooks get no keyword "
                    "arguments (docs/python.md)" % torch.__version__)
def test_model_called_by_keyword_records_its_input(tmp_path):
    """model(x=batch): the batch is the layer `input`, as model(batch)."""
    torch.manual_seed(0)
    m = ByName()
    path = str(tmp_path / "t.h5")
    tr = at.Tracer(m, path, precision="fp32")
    x = torch.randn(2, 4)
    m(x=x).sum().backward()
    tr.end_step()
    tr.close()
    fo = stats_by_site(path)[(0, "input", "fwd_out")]
    assert len(fo) == 1 and fo[0][2] == float(x.abs().max()) and fo[0][3] == 8


def _bf16_criterion_step(tmp_path, crit, call):
    """One step of a Linear under bf16 autocast traced with crit as its
    loss_fn; call(crit, prediction, y) computes the loss. The loss."""
    torch.manual_seed(0)
    m = nn.Linear(4, 1)
    tr = at.Tracer(m, str(tmp_path / "t.h5"), loss_fn=crit, precision="bf16")
    x, y = torch.randn(8, 4), torch.randn(8, 1)
    with tr.autocast():
        p = m(x)
        assert p.dtype == torch.bfloat16
        loss = call(crit, p, y)
    loss.backward()
    tr.end_step(loss=loss)
    tr.close()
    return loss


def test_fp32_module_casts_keyword_inputs(tmp_path, monkeypatch):
    """A module forced to FP32 gets its bf16 inputs as float32 whether they
    come by position or by keyword (a criterion called as
    loss_fn(input=pred, target=y): the keyword stayed bf16)."""
    monkeypatch.setenv("AMPPROBE_FP32", "loss")
    seen = []

    class Crit(nn.Module):
        def forward(self, input, target):
            seen.append(input.dtype)
            return ((input - target) ** 2).mean()

    _bf16_criterion_step(tmp_path, Crit(),
                         lambda crit, p, y: crit(input=p, target=y))
    assert seen == [torch.float32]


def test_fp32_module_casts_nested_and_optional_arguments(tmp_path,
                                                         monkeypatch):
    """A module forced to FP32 gets float32 in nested arguments too (an
    LSTM's (h, c) state: bf16 there, the CPU LSTM failed 'could not create
    a primitive descriptor') and in its masks, which are no inputs."""
    monkeypatch.setenv("AMPPROBE_FP32", "cell")
    seen = []

    class Cell(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.randn(4, 4))

        def forward(self, x, hc=None, attn_mask=None):
            seen.extend([x.dtype, hc[0].dtype, hc[1].dtype, attn_mask.dtype])
            return x @ self.w + hc[0] + hc[1] + attn_mask

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc, self.cell = nn.Linear(4, 4), Cell()

        def forward(self, x):
            h = self.fc(x)
            return self.cell(h, (h * 2, h * 3), h * 0).sum()

    torch.manual_seed(0)
    m = M()
    tr = at.Tracer(m, str(tmp_path / "t.h5"), precision="bf16")
    with tr.autocast():
        loss = m(torch.randn(8, 4))
    loss.backward()
    tr.end_step(loss=loss)
    tr.close()
    assert seen == [torch.float32] * 4


@pytest.mark.parametrize("box", ["dict", "list"])
def test_fp32_criterion_casts_a_dict_or_list_of_predictions(tmp_path, box):
    """A criterion (always FP32) taking its predictions in a dict or list
    (DETR-style, deep supervision) gets them as float32 under autocast:
    with lists and dicts handed on as they are, it ran in bf16 outside
    autocast (review of 37ea9e4: a healthy fp16 job's loss went inf)."""
    seen = []

    class Crit(nn.Module):
        def forward(self, out, y):
            p = out["p"] if box == "dict" else out[0]
            seen.append(p.dtype)
            return ((p - y) ** 2).mean()

    loss = _bf16_criterion_step(
        tmp_path, Crit(),
        lambda crit, p, y: crit({"p": p} if box == "dict" else [p], y))
    assert loss.dtype == torch.float32
    assert seen == [torch.float32]


class _DistLoss(nn.Module):
    """A distance loss whose backward is NaN at zero distance (sqrt'(0)
    = inf, times 0); its prediction in a dict."""

    def forward(self, out, y):
        return torch.sqrt(((out["pred"] - y) ** 2).sum(-1)).mean()


def test_a_loss_given_a_dict_records_its_prediction_gradient(tmp_path):
    """A loss whose prediction comes in a dict gets its grad_in: a NaN
    gradient the loss's backward makes is named at the loss, not at the
    model's last layer (review of 37ea9e4: no grad_in, blamed on 'b')."""
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.act, self.b = nn.Linear(8, 4), nn.Tanh(), nn.Linear(4, 4)

        def forward(self, x):
            return {"pred": self.b(self.act(self.a(x)))}

    torch.manual_seed(0)
    m, crit = Net(), _DistLoss()
    path = str(tmp_path / "t.h5")
    tr = at.Tracer(m, path, loss_fn=crit, precision="fp32")
    out = m(torch.randn(16, 8))
    loss = crit(out, out["pred"].detach().clone())
    loss.backward()
    tr.end_step(loss=float(loss))
    tr.close()
    ev = ampprobe.postmortem(path)["event"]
    assert (ev["origin_layer"], ev["origin_site"]) == ("loss", "grad_in"), ev


# ---- parameters replaced after the Tracer hooked the model ----------------------

def _replace(m, how, sd):
    """Gives m the weights sd by replacing its Parameter objects."""
    if how == "assign":
        m.load_state_dict(sd, assign=True)
    elif how == "meta":
        m.to_empty(device="cpu")
        m.load_state_dict(sd)
    else:  # "setattr"
        for name, t in sd.items():
            mod, _, attr = name.rpartition(".")
            sub = m.get_submodule(mod) if mod else m
            if isinstance(getattr(sub, attr), nn.Parameter):
                setattr(sub, attr, nn.Parameter(t.clone()))
            else:
                getattr(sub, attr).copy_(t)


def _can_replace(how):
    import inspect
    if how == "assign":
        return "assign" in inspect.signature(nn.Module.load_state_dict).parameters
    if how == "meta":
        return hasattr(torch.device("cpu"), "__enter__") and hasattr(
            nn.Module, "to_empty")
    return True


@pytest.mark.parametrize("how", ["setattr", "assign", "meta"])
def test_replaced_parameters_are_traced(tmp_path, how):
    """A Tracer built before the job replaced the Parameter objects
    (load_state_dict(assign=True); to_empty() after building on the meta
    device; module.weight = nn.Parameter(...)) recorded the old ones as
    the master weights (another model's values, or a crash on meta
    tensors), its weight digest never changed, and the new ones had no
    weight_grad. Now the records follow the parameters the modules hold."""
    if not _can_replace(how):
        pytest.skip("torch %s cannot replace parameters by %s"
                    % (torch.__version__, how))
    torch.manual_seed(0)
    if how == "meta":
        with torch.device("meta"):
            m = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    else:
        m = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    path = str(tmp_path / "t.h5")
    tr = at.Tracer(m, path, precision="fp32", weight_digest=True)
    torch.manual_seed(1)
    _replace(m, how, nn.Sequential(nn.Linear(4, 8), nn.Tanh(),
                                   nn.Linear(8, 1)).state_dict())
    losses(m, 3, tr)
    tr.close()
    t, names = records(path)
    r = t["records"]
    last = r[(r["layer"] == names.index("0")) & (r["step"] == 2)]
    site = {s: ampprobe._lib.SITES.index(s) for s in (
        "master_weight", "weight_grad")}
    mw = last[last["site"] == site["master_weight"]]
    assert sorted(mw["sum"]) == pytest.approx(sorted(
        [float(m[0].weight.sum()), float(m[0].bias.sum())]), rel=1e-5)
    assert len(last[last["site"] == site["weight_grad"]]) == 2
    d = list(t["steps"]["weight_digest"])
    assert len(set(d)) == 3  # the weights change every step


# ---- keyword options, parameter lifetimes (review of 2026-12-03) ---------------

@pytest.mark.parametrize("where", ["passed", "inside"])
@pytest.mark.parametrize("mode", ["record", "raise"])
def test_a_causal_mask_by_keyword_is_no_input(tmp_path, where, mode):
    """nn.TransformerEncoderLayer with the -inf causal mask of
    generate_square_subsequent_mask, passed by keyword (src_mask=, and
    attn_mask= to its attention inside): an option, not an input. Traced
    as one (the first keyword change), the healthy job was 'degraded' with
    an event at its input or at self_attn's fwd_in, and raise mode stopped
    it."""
    class Enc(nn.Module):
        def __init__(self):
            super().__init__()
            self.enc = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0,
                                                  batch_first=True)
            self.head = nn.Linear(8, 1)

        def forward(self, x, mask=None):
            if mask is None:
                mask = nn.Transformer.generate_square_subsequent_mask(
                    x.shape[1])
            return self.head(self.enc(x, src_mask=mask))

    torch.manual_seed(0)
    m = Enc()
    path = str(tmp_path / "t.h5")
    tr = at.Tracer(m, path, precision="fp32", on_nonfinite=mode)
    opt = torch.optim.SGD(m.parameters(), lr=0.01)
    mask = nn.Transformer.generate_square_subsequent_mask(6)
    assert torch.isinf(mask).any()
    for s in range(2):
        x = torch.randn(3, 6, 8, generator=torch.Generator().manual_seed(s))
        out = m(x, mask=mask) if where == "passed" else m(x)
        loss = out.pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        tr.end_step(loss=loss, optimizer=opt)
    tr.close()
    assert ampprobe.postmortem(path)["event"]["kind"] == "none"
    assert ampprobe.verdict(path) == "healthy"
    t, names = records(path)
    assert t["records"]["neginf_count"].sum() == 0


class _Attn(nn.Module):
    """Self-attention written by hand, as many jobs do: its additive mask
    is an optional parameter, passed by position."""

    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(8, 24)
        self.proj = nn.Linear(8, 8)

    def forward(self, x, mask=None):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        s = q @ k.transpose(-2, -1) / 8 ** 0.5
        if mask is not None:
            s = s + mask
        return self.proj(s.softmax(-1) @ v)


class _MaskedNet(nn.Module):
    """A model whose forward(x, mask=None) hands the -inf causal mask by
    position to one of: a TransformerEncoderLayer (src_mask), a
    MultiheadAttention (attn_mask, its sixth parameter) or _Attn."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner
        if inner == "encoder":
            self.blk = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0,
                                                  batch_first=True)
        elif inner == "mha":
            self.blk = nn.MultiheadAttention(8, 2, batch_first=True)
        else:
            self.blk = _Attn()
        self.head = nn.Linear(8, 1)

    def forward(self, x, mask=None):
        if self.inner == "mha":
            h = self.blk(x, x, x, None, False, mask)[0]
        else:
            h = self.blk(x, mask)
        return self.head(h)


def _train_masked(m, path, steps=2, **kw):
    tr = at.Tracer(m, path, **kw)
    opt = torch.optim.SGD(m.parameters(), lr=0.01)
    mask = nn.Transformer.generate_square_subsequent_mask(6)
    assert torch.isinf(mask).any()
    for s in range(steps):
        x = torch.randn(3, 6, 8, generator=torch.Generator().manual_seed(s))
        loss = m(x, mask).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        tr.end_step(loss=loss, optimizer=opt)
    tr.close()


@pytest.mark.parametrize("inner", ["encoder", "mha", "hand"])
@pytest.mark.parametrize("mode", ["record", "raise"])
def test_a_causal_mask_by_position_is_no_input(tmp_path, inner, mode):
    """The -inf mask passed by position, to the model and on to a layer,
    where it fills an optional parameter: an option, as by keyword. Before,
    the healthy job was 'degraded' ('NaN or inf arrived in the input
    data', the model's input layer) on both torches, and raise mode
    stopped it at step 0."""
    torch.manual_seed(0)
    path = str(tmp_path / "t.h5")
    _train_masked(_MaskedNet(inner), path, on_nonfinite=mode,
                  precision="fp32")
    assert ampprobe.postmortem(path)["event"]["kind"] == "none"
    assert ampprobe.verdict(path) == "healthy"
    t, names = records(path)
    r = t["records"]
    assert r["neginf_count"].sum() == 0
    # the model's input is x alone: 3*6*8 elements a step
    inp = r[[names[i] == "input" for i in r["layer"]]]
    assert len(inp) == 2 and set(inp["count"]) == {144}


def test_a_mask_by_position_under_fp16_emulation(tmp_path):
    """Under FP16 emulation the mask, an option, is not recorded, and
    the run is as healthy as unmasked: the attention's fwd_in is its
    query, key and value (x) alone. (Its verdict is 'degraded' for another reason, gradients
    underflowing without a loss scaler.)"""
    torch.manual_seed(0)
    path = str(tmp_path / "t.h5")
    _train_masked(_MaskedNet("mha"), path, steps=1, precision="fp16",
                  emulate_fp16=True)
    assert ampprobe.postmortem(path)["event"]["kind"] == "none"
    t, names = records(path)
    r = t["records"]
    fin = r[[names[i] == "blk" and ampprobe._lib.SITES[s] == "fwd_in"
             for i, s in zip(r["layer"], r["site"])]]
    assert list(fin["count"]) == [144] * 3
    assert r["neginf_count"].sum() == 0


def test_the_line_is_the_parameters_name(tmp_path):
    """A mask is an option by its parameter's name, required or not: a
    required `mask` is left out too; a required parameter of another name
    holding -inf is an input (its -inf an event at that module's fwd_in);
    arguments gathered by *args are all inputs."""
    class Required(nn.Module):  # a leaf: hooked as one layer
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.randn(8, 8) / 3)

        def forward(self, x, mask):
            return x @ self.w + mask.clamp(min=-1e4).mean(-1, keepdim=True)

    class Scores(nn.Module):
        def forward(self, x, logits):  # not a mask by its name
            return x + logits.clamp(min=-1e4).mean(-1, keepdim=True)

    class Star(nn.Module):
        def forward(self, *xs):
            return sum(xs)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.req, self.sc, self.star = Required(), Scores(), Star()
            self.head = nn.Linear(8, 1)

        def forward(self, x, mask=None):
            h = self.sc(self.req(x, mask), mask)
            return self.head(self.star(h, x, x))

    torch.manual_seed(0)
    path = str(tmp_path / "t.h5")
    _train_masked(Net(), path, steps=1, precision="fp32")
    t, names = records(path)
    r = t["records"]

    def at_(layer, site):
        return r[[names[i] == layer and ampprobe._lib.SITES[s] == site
                  for i, s in zip(r["layer"], r["site"])]]
    assert list(at_("req", "fwd_in")["count"]) == [144]  # x alone
    assert list(at_("sc", "fwd_in")["neginf_count"]) == [0, 15]
    assert len(at_("star", "fwd_in")) == 3
    assert ampprobe.postmortem(path)["event"]["origin_layer"] == "sc"


class _Cell(nn.Module):
    """A recurrent cell's loop: h = cell(x_t, h), hx optional (GRUCell)."""

    def __init__(self):
        super().__init__()
        self.cell = nn.GRUCell(4, 6)
        self.head = nn.Linear(6, 1)

    def forward(self, x):
        h = None
        for t in range(x.shape[1]):
            h = self.cell(x[:, t], h)
        return self.head(h)


class _Seq(nn.Module):
    """nn.LSTM given its initial state: lstm(x, (h0, c0)), hx optional."""

    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(4, 6, batch_first=True)
        self.head = nn.Linear(6, 1)

    def forward(self, x, h0=None):
        hc = None if h0 is None else (h0, torch.zeros_like(h0))
        return self.head(self.lstm(x, hc)[0][:, -1])


class _Pixels(nn.Module):
    """An HF-style model: every forward parameter optional,
    forward(pixel_values=None, labels=None)."""

    def __init__(self):
        super().__init__()
        self.patch = nn.Linear(4, 6)
        self.head = nn.Linear(6, 1)

    def forward(self, pixel_values=None, labels=None):
        return self.head(self.patch(pixel_values)).mean(1)


def _data_job(tmp_path, model, call, nan=None, name="t.h5", **kw):
    """One traced step of model on x (3, 5, 4); nan: where a NaN goes
    ("x", or "state": the optional state argument). Returns (records,
    layer names, the post-mortem's event)."""
    torch.manual_seed(0)
    path = str(tmp_path / name)
    kw.setdefault("precision", "fp32")
    tr = at.Tracer(model, path, **kw)
    x = torch.randn(3, 5, 4, generator=torch.Generator().manual_seed(0))
    state = torch.randn(1, 3, 6) * 0.1
    if nan == "x":
        x[1, 2, 3] = float("nan")
    if nan == "state":
        state[0, 1, 2] = float("nan")
    out = call(model, x, state)
    out.pow(2).mean().backward()
    tr.end_step(loss=float(out.pow(2).mean()))
    tr.close()
    t, names = records(path)
    return t["records"], names, ampprobe.postmortem(path)["event"]


DATA_CALLS = {
    "gru-cell": (_Cell, lambda m, x, s: m(x)),
    "lstm-state": (_Seq, lambda m, x, s: m(x, s)),
    "pixels-by-position": (_Pixels, lambda m, x, s: m(x)),
    "pixels-by-keyword": (_Pixels, lambda m, x, s: m(pixel_values=x)),
}


@pytest.mark.parametrize("case", sorted(DATA_CALLS))
def test_data_in_an_optional_parameter_is_an_input(tmp_path, case):
    """Data that fills a parameter with a default is an input (the first
    cut of the mask rule, by default rather than by name, left these out):
    a recurrent state (GRUCell's and LSTM's hx), an HF-style model's
    forward(pixel_values=None) by position or keyword (its input was not
    recorded, so a NaN in the data was 'inf-arithmetic-nan' at the first
    layer, not 'input-nan')."""
    if case == "pixels-by-keyword" and not KWARGS_SEEN:
        pytest.skip("torch %s's hooks get no keyword arguments"
                    % torch.__version__)
    mk, call = DATA_CALLS[case]
    r, names, ev = _data_job(tmp_path, mk(), call, nan="x")
    assert ev["kind"] == "input-nan", ev
    assert ev["origin_layer"] == "input", ev
    if case == "lstm-state":
        # the LSTM's fwd_in: x, h0 and c0 (its hx, a tuple); a NaN in the
        # state handed to the model arrives in its input data too
        fin = r[[names[i] == "lstm" and ampprobe._lib.SITES[s] == "fwd_in"
                 for i, s in zip(r["layer"], r["site"])]]
        assert sorted(fin["count"]) == [18, 18, 60]
        r, names, ev = _data_job(tmp_path, mk(), call, nan="state",
                                 name="state.h5")
        assert (ev["kind"], ev["origin_layer"]) == ("input-nan", "input")
    if case == "gru-cell":  # h from the second step on: 2 inputs a call
        fin = r[[names[i] == "cell" and ampprobe._lib.SITES[s] == "fwd_in"
                 for i, s in zip(r["layer"], r["site"])]]
        assert len(fin) == 1 + 2 * 4


@pytest.mark.parametrize("emulate", [False, True])
@pytest.mark.parametrize("how", ["position", "keyword"])
def test_a_module_fills_the_jobs_own_list_and_dict(tmp_path, how, emulate):
    """A traced module that appends to a list or fills a dict it is given
    (a cache, an incremental state) fills the job's own objects: the
    tracer handed it copies (its inputs rebuilt to alias or round the
    tensors in them), and the job saw an empty list (review of
    49479f2). The tensors in them are recorded, not rounded."""
    if how == "keyword" and not KWARGS_SEEN:
        pytest.skip("torch %s's hooks get no keyword arguments"
                    % torch.__version__)

    class Fill(nn.Module):  # a leaf, traced as one layer
        def forward(self, x, store=None, cache=None):
            store.append(float(x.sum()))
            cache["h"] = x
            return x * 2

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc, self.fill = nn.Linear(4, 4), Fill()

        def forward(self, x, store, cache):
            h = self.fc(x)
            return (self.fill(h, store, cache) if how == "position" else
                    self.fill(h, store=store, cache=cache))

    torch.manual_seed(0)
    m = M()
    tr = at.Tracer(m, str(tmp_path / "t.h5"), precision="fp32"
                   if not emulate else "fp16", emulate_fp16=emulate)
    store, cache = [torch.ones(2)], {"old": torch.ones(2)}
    m(torch.randn(3, 4), store, cache).sum().backward()
    tr.end_step()
    tr.close()
    assert len(store) == 2 and sorted(cache) == ["h", "old"]


MASK_NAMES = {
    # name: (an option when it needs no gradient?)
    "attn_mask": True, "key_padding_mask": True, "mask": True,
    "attn_bias": True, "position_bias": True,
    "mask_features": False, "masks": False, "x_masked": False,
}


@pytest.mark.parametrize("name", sorted(MASK_NAMES))
def test_which_names_are_masks(tmp_path, name):
    """A tensor filling a parameter whose name ends in 'mask' or 'bias'
    and that needs no gradient is an option (not recorded: its -inf is no
    event); other names are data: an inf arriving in mask_features or
    masks (Mask2Former, SAM) is named at the module's fwd_in, not blamed
    on the module after it (review of 49479f2, which took every name
    containing 'mask')."""
    ns = {}
    exec("def forward(self, x, %s=None):\n"
         "    return x + %s.clamp(-1e4, 1e4).mean()\n" % (name, name), ns)
    Leaf = type("Leaf", (nn.Module,), {"forward": ns["forward"]})

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc, self.leaf = nn.Linear(4, 4), Leaf()

        def forward(self, x, extra):
            return self.leaf(self.fc(x), extra).sum()

    torch.manual_seed(0)
    m = M()
    path = str(tmp_path / "t.h5")
    tr = at.Tracer(m, path, precision="fp32", record_input=False)
    extra = torch.zeros(3, 4)
    extra[0, 0] = -math.inf
    m(torch.randn(3, 4), extra).backward()
    tr.end_step()
    tr.close()
    ev = ampprobe.postmortem(path)["event"]
    if MASK_NAMES[name]:
        assert ev["kind"] == "none", ev
    else:
        assert (ev["origin_layer"], ev["origin_site"]) == ("leaf", "fwd_in")


def test_a_learned_bias_is_data(tmp_path):
    """A bias that needs a gradient (T5's relative position bias, learned)
    is an input: recorded, given its grad_in."""
    class Leaf(nn.Module):
        def forward(self, x, position_bias=None):
            return x + position_bias

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.rel = nn.Parameter(torch.zeros(4))
            self.leaf = Leaf()

        def forward(self, x):
            return self.leaf(x, self.rel * 2).sum()

    m = M()
    path = str(tmp_path / "t.h5")
    tr = at.Tracer(m, path, precision="fp32")
    m(torch.randn(3, 4)).backward()
    tr.end_step()
    tr.close()
    t, names = records(path)
    r = t["records"]
    fin = r[[names[i] == "leaf" and ampprobe._lib.SITES[s] == "fwd_in"
             for i, s in zip(r["layer"], r["site"])]]
    gin = r[[names[i] == "leaf" and ampprobe._lib.SITES[s] == "grad_in"
             for i, s in zip(r["layer"], r["site"])]]
    assert sorted(fin["count"]) == [4, 12] and 4 in list(gin["count"])


def test_an_option_keeps_its_value_under_emulation(tmp_path):
    """Under FP16 emulation the inputs around a mask are rounded to
    binary16, the mask is not (HF's finfo(float32).min mask would round
    to -inf, and a fully masked row to NaN after the softmax), and an
    optional data argument is rounded as an input."""
    seen = {}

    class Attn(nn.Module):
        def forward(self, q, kv, context=None, attn_mask=None):
            seen.update(q=q.detach().clone(), context=context.detach().clone(),
                        mask=attn_mask.clone())
            return q + context.mean() + attn_mask.clamp(min=-1).mean()

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.attn = Attn()
            self.head = nn.Linear(4, 1)

        def forward(self, x):
            mask = torch.full((5, 5), torch.finfo(torch.float32).min)
            return self.head(self.attn(x, x, x * 1.0001, mask))

    torch.manual_seed(0)
    tr = at.Tracer(M(), str(tmp_path / "t.h5"), precision="fp16",
                   emulate_fp16=True)
    x = torch.full((3, 5, 4), 1.0001)
    tr.model(x).sum().backward()
    tr.end_step()
    tr.close()
    assert (seen["q"] == 1.0).all()  # rounded (1.0001 -> 1 in binary16)
    assert (seen["context"] == 1.0).all()  # an input, though optional
    assert (seen["mask"] == torch.finfo(torch.float32).min).all()


@pytest.mark.skipif(not KWARGS_SEEN, reason="torch %s's hooks get no keyword "
                    "arguments (docs/python.md)" % torch.__version__)
@pytest.mark.parametrize("call", ["position", "input-first", "target-first"])
def test_a_criterion_by_keyword_records_its_prediction(tmp_path, call):
    """crit(target=y, input=p): the loss's fwd_in is the prediction (the
    forward's first parameter), with its grad_in, however the call orders
    its keywords (target first, the target was taken as the prediction)."""
    class Crit(nn.Module):
        def forward(self, input, target):
            return ((input - target) ** 2).mean()

    torch.manual_seed(0)
    m, crit = nn.Linear(4, 1), Crit()
    path = str(tmp_path / "t.h5")
    tr = at.Tracer(m, path, loss_fn=crit, precision="fp32")
    x, y = torch.randn(8, 4), torch.full((8, 1), 100.0)
    p = m(x)
    loss = {"position": lambda: crit(p, y),
            "input-first": lambda: crit(input=p, target=y),
            "target-first": lambda: crit(target=y, input=p)}[call]()
    loss.backward()
    tr.end_step(loss=loss)
    tr.close()
    s = stats_by_site(path)
    assert s[(0, "loss", "fwd_in")][0][2] == pytest.approx(
        float(p.abs().max()))  # absmax of the prediction, not 100
    assert len(s[(0, "loss", "grad_in")]) == 1


def test_parameters_of_each_call_are_not_kept(tmp_path):
    """torch.func.functional_call with new weights at every call (a MAML
    inner loop, an ensemble): each call's weights were kept by the tracer,
    with a hook each, for good (3.4 MB after 50 steps of a small MLP). Now
    only their ids are followed, dropped when they die; replaced
    parameters (load_state_dict(assign=True)) are not kept either."""
    import gc
    import weakref
    functional_call = getattr(getattr(torch, "func", None),
                              "functional_call", None)
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 1))
    tr = at.Tracer(m, str(tmp_path / "t.h5"), precision="fp32")
    base = {k: v.detach().clone().requires_grad_()
            for k, v in m.named_parameters()}
    seen = []
    for step in range(20):
        if functional_call is not None:
            fast = {k: v * 1.0 for k, v in base.items()}
            seen += [weakref.ref(v) for v in fast.values()]
            out = functional_call(m, fast, (torch.randn(4, 16),))
        else:  # torch 1.13: replace the parameters themselves
            for mod in (m[0], m[2]):
                mod.weight = nn.Parameter(mod.weight.detach().clone())
                seen.append(weakref.ref(mod.weight))
            out = m(torch.randn(4, 16))
        out.sum().backward()
        tr.end_step()
        del out
    old = [weakref.ref(p) for p in m.parameters()]
    m.load_state_dict({k: v.detach().clone() for k, v in
                       m.state_dict().items()}, **(
        {"assign": True} if "assign" in __import__("inspect").signature(
            m.load_state_dict).parameters else {}))
    gc.collect()
    assert sum(r() is not None for r in seen[:-8]) == 0
    assert len(tr._late_hooks) <= 8 and len(tr._by_param) <= 16
    if "assign" in __import__("inspect").signature(
            m.load_state_dict).parameters:
        assert all(r() is None for r in old)
    tr.close()


class _KwLoss(nn.Module):
    """A loss that takes only keywords, in whatever order the loop gives."""
    def forward(self, **kw):
        return ((kw["pred"] - kw["target"]) ** 2).mean()


class _TargetFirstLoss(nn.Module):
    """A loss whose first parameter is the target."""
    def forward(self, target, pred):
        return ((pred - target) ** 2).mean()


@pytest.mark.parametrize("how", ["kw-target-first", "kw-pred-first",
                                 "target-first", "no-grad"])
def test_a_losss_recorded_input_is_its_prediction(tmp_path, how):
    """The loss's fwd_in is its prediction wherever the call puts it: the
    first floating input that requires grad (a loss taking only **kwargs,
    called crit(target=y, pred=p), recorded the target); under no_grad,
    where nothing does, the first."""
    if how.startswith("kw") or how == "no-grad":
        if not KWARGS_SEEN:
            pytest.skip("torch %s's hooks get no keyword arguments "
                        "(docs/python.md)" % torch.__version__)
    torch.manual_seed(0)
    m = nn.Linear(4, 1)
    crit = _TargetFirstLoss() if how == "target-first" else _KwLoss()
    path = str(tmp_path / "t.h5")
    tr = at.Tracer(m, path, loss_fn=crit, precision="fp32")
    x, y = torch.randn(8, 4), 100.0 + torch.rand(8, 1)  # y: |y| > |p|
    p = m(x)
    if how == "kw-target-first":
        loss = crit(target=y, pred=p)
    elif how == "kw-pred-first":
        loss = crit(pred=p, target=y)
    elif how == "target-first":
        loss = crit(y, p)
    else:
        with torch.no_grad():
            loss = crit(target=y, pred=p.detach())
    if how != "no-grad":
        loss.backward()
    tr.end_step(loss=float(loss))
    tr.close()
    fi = stats_by_site(path)[(0, "loss", "fwd_in")]
    want = y if how == "no-grad" else p
    assert len(fi) == 1 and fi[0][2] == float(want.abs().max()), (fi, how)


@pytest.mark.parametrize("case", ["mse-nan", "soft-labels-nan",
                                  "target-first-nan", "masked-nan-labels"])
def test_a_bad_target(tmp_path, case):
    """A loss's targets are not recorded (review of e43e6c4: recorded as
    the job's input, NaN labels a loss masks out - missing labels - made a
    healthy job fail). A NaN target the loss does not mask makes its
    output NaN from a finite prediction: the post-mortem's evidence names
    the targets (it said only that the loss made the NaN itself)."""
    torch.manual_seed(0)
    m = nn.Linear(4, 3)

    def masked_mse(p, y):
        ok = ~torch.isnan(y)
        return ((p[ok] - y[ok]) ** 2).mean()

    crit = {"soft-labels-nan": nn.CrossEntropyLoss(),
            "target-first-nan": _TargetFirstLoss(),
            "masked-nan-labels": _FnLoss(masked_mse)}.get(case, nn.MSELoss())
    path = str(tmp_path / "t.h5")
    tr = at.Tracer(m, path, loss_fn=crit, precision="fp32", on_nonfinite="warn")
    y = torch.softmax(torch.randn(8, 3), 1)
    y[2, 1] = float("nan")
    p = m(torch.randn(8, 4))
    loss = crit(y, p) if case == "target-first-nan" else crit(p, y)
    loss.backward()
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        tr.end_step(loss=float(loss))
    tr.close()
    said = [str(x.message) for x in w if issubclass(x.category, at.NonFiniteWarning)]
    assert len(said) == (0 if case == "masked-nan-labels" else 1), said
    assert not said or "targets are not recorded" in said[0], said
    pm = ampprobe.postmortem(path)
    assert not any(k[1] == "input" and k[2] == "fwd_out" and len(v) > 1
                   for k, v in stats_by_site(path).items())
    if case == "masked-nan-labels":
        assert pm["verdict"] == "healthy", pm["event"]
        return
    ev = pm["event"]
    assert (ev["origin_layer"], ev["origin_site"]) == ("loss", "fwd_out"), ev
    assert "targets" in ev["evidence"], ev


class _FnLoss(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, p, y):
        return self.fn(p, y)


def _smoothed(self, input, target):  # a job's own loss forward
    return nn.functional.cross_entropy(input, target, label_smoothing=0.2)


@pytest.mark.parametrize("how", ["loss-bound", "loss-lambda", "fp32-kind",
                                 "deepcopy"])
def test_an_instance_forward_survives_fp32_forcing(tmp_path, how):
    """A module forced to FP32 (the loss always, fp32= kinds) whose forward
    the job set on the instance: that forward runs while traced and is
    back after close() (the wrapper called the class's forward, and
    close() deleted the job's; review of 1f8f8eb)."""
    import types

    def make():
        torch.manual_seed(0)
        m = nn.Sequential(nn.Linear(8, 8), nn.LayerNorm(8), nn.Linear(8, 4))
        crit = nn.CrossEntropyLoss()
        if how == "loss-bound" or how == "deepcopy":
            crit.forward = types.MethodType(_smoothed, crit)
        elif how == "loss-lambda":
            crit.forward = lambda p, t: nn.functional.cross_entropy(
                p, t, label_smoothing=0.2)
        else:  # the LayerNorm forced to FP32, its forward the job's
            ln = m[1]
            ln.forward = lambda h: nn.functional.layer_norm(
                h, ln.normalized_shape, ln.weight, ln.bias, ln.eps) * 2.0
        return m, crit

    x, y = torch.randn(4, 8), torch.randint(0, 4, (4,))
    m, crit = make()
    want = float(crit(m(x), y))
    m, crit = make()
    tr = at.Tracer(m, str(tmp_path / "t.h5"), loss_fn=crit, env=False,
                   fp32="layernorm" if how == "fp32-kind" else None)
    if how == "deepcopy":
        crit2 = copy.deepcopy(crit)
        assert float(crit2(m(x), y)) == want
    assert float(crit(m(x), y)) == want
    tr.end_step()
    tr.close()
    assert float(crit(m(x), y)) == want
    assert "_ampprobe_inner" not in crit.__dict__
    assert ("forward" in crit.__dict__) == (how != "fp32-kind")


class _Table(nn.Module):
    """A leaf whose forward returns its own Parameter (a learned query or
    positional table)."""
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(4, 8))

    def forward(self, x):
        return self.weight


class _UsesTable(nn.Module):
    def __init__(self):
        super().__init__()
        self.table, self.fc = _Table(), nn.Linear(8, 1)

    def forward(self, x):
        return self.fc(x + self.table(x))


def test_a_module_returning_its_parameter_leaks_no_hook(tmp_path):
    """A leaf that returns its own Parameter: no hook is left on the
    Parameter (one more was, each step: 2 -> 6 in 5 steps, recording
    grad_out 1, 2, 3... times a step); its gradient is its weight_grad."""
    torch.manual_seed(0)
    m = _UsesTable()
    path = str(tmp_path / "t.h5")
    tr = at.Tracer(m, path, precision="fp32")
    before = len(m.table.weight._backward_hooks or {})
    losses(m, 5, tr, make=lambda g: (torch.randn(4, 8, generator=g),
                                      torch.randn(4, 1, generator=g)))
    during = len(m.table.weight._backward_hooks or {})
    tr.close()
    assert during <= before + 1, (before, during)
    st = stats_by_site(path)
    for step in range(5):
        assert len(st.get((step, "table", "grad_out"), [])) <= 1
        assert len(st[(step, "table", "weight_grad")]) == 1


@pytest.mark.parametrize("shared", ["leaf", "block"])
def test_a_module_held_by_two_parents_is_one_layer(tmp_path, shared):
    """One module instance held by two parents (a leaf, or a whole block):
    one layer each, named by the first path (as named_modules), each call
    recorded once (it was two layers, every call recorded under both
    names)."""
    torch.manual_seed(0)
    mix = nn.Linear(8, 8)
    blk = nn.Sequential(nn.Linear(8, 8), nn.Tanh())

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            if shared == "leaf":
                self.a = nn.Sequential(nn.Softplus(), mix)
                self.b = nn.Sequential(nn.Identity(), mix)
            else:
                self.a = nn.Sequential(nn.Softplus(), blk)
                self.b = nn.Sequential(nn.Identity(), blk)
            self.head = nn.Linear(8, 1)

        def forward(self, x):
            return self.head(self.b(self.a(x)))

    m = M()
    path = str(tmp_path / "t.h5")
    tr = at.Tracer(m, path, precision="fp32")
    names = tr.layer_names()
    losses(m, 2, tr, make=lambda g: (torch.randn(4, 8, generator=g),
                                      torch.randn(4, 1, generator=g)))
    tr.close()
    one = "a.1" if shared == "leaf" else "a.1.0"
    assert one in names and ("b.1" if shared == "leaf" else "b.1.0") not in names, names
    assert len(names) == len(set(names))
    assert len(stats_by_site(path)[(1, one, "fwd_out")]) == 2  # two calls


@pytest.mark.parametrize("box", ["dataclass", "frozen", "dict-subclass",
                                 "model-output", "nested"])
@pytest.mark.parametrize("emulate", [False, True])
def test_structured_outputs_are_recorded(tmp_path, box, emulate):
    """A module returning a dataclass (frozen or not), a dict subclass or
    an HF-style ModelOutput (a dataclass that is an OrderedDict), or a
    tuple of one: its tensors are recorded, so a NaN it makes is named at
    it, in the forward (it was named at the next module's fwd_in, and the
    post-mortem put it in the backward); under FP16 emulation they are
    rounded like a tuple's, the job getting its own type back."""
    import dataclasses

    @dataclasses.dataclass
    class Out:
        y: torch.Tensor
        note: str = "x"

    @dataclasses.dataclass(frozen=True)
    class Frozen:
        y: torch.Tensor

    class Sub(dict):
        pass

    @dataclasses.dataclass
    class MOut(collections.OrderedDict):
        y: torch.Tensor = None

        def __post_init__(self):
            self["y"] = self.y

    def wrap(t):
        return {"dataclass": lambda: Out(t), "frozen": lambda: Frozen(t),
                "dict-subclass": lambda: Sub(y=t), "model-output": lambda: MOut(t),
                "nested": lambda: (Out(t), 1)}[box]()

    def unwrap(o):
        o = o[0] if box == "nested" else o
        return o["y"] if isinstance(o, dict) else o.y

    class Log(nn.Module):
        def forward(self, x):
            return wrap(torch.log(x))  # NaN where x < 0

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.log, self.fc2 = nn.Linear(8, 8), Log(), nn.Linear(8, 4)

        def forward(self, x):
            o = self.log(self.fc1(x))
            assert type(o) is type(wrap(x))
            y = torch.nan_to_num(unwrap(o))
            assert not emulate or torch.equal(y, y.half().float())  # rounded
            return self.fc2(unwrap(o))

    torch.manual_seed(0)
    m = M()
    path = str(tmp_path / "t.h5")
    tr = at.Tracer(m, path, loss_fn=nn.MSELoss(), emulate_fp16=emulate,
                   precision="fp16" if emulate else "fp32", on_nonfinite="raise")
    with pytest.raises(at.NonFiniteError) as e:
        nn.MSELoss()(m(torch.randn(4, 8)), torch.zeros(4, 4)).backward()
        tr.end_step(loss=1.0)
    assert (e.value.module, e.value.site, e.value.phase) == (
        "log", "fwd_out", "forward"), str(e.value)
    ev = ampprobe.postmortem(path)["event"]
    assert (ev["origin_layer"], ev["origin_site"], ev["phase"]) == (
        "log", "fwd_out", "forward"), ev


class _Scale2(nn.Module):
    def forward(self, w):
        return 2.0 * w


@pytest.mark.parametrize("how", ["custom", "spectral_norm", "weight_norm",
                                 "orthogonal"])
def test_a_parametrized_module_is_one_layer(tmp_path, how):
    """A module with a parametrization (register_parametrization: torch's
    parametrizations.weight_norm, spectral_norm, orthogonal, or the job's)
    is one layer under its own name: its output recorded and its
    parameters' (the originals') gradients and masters too, and a healthy
    job trains as untraced (it was no leaf: only the parametrization's
    modules were hooked, its FP16 overflow named at the next module)."""
    P = getattr(nn.utils, "parametrizations", None)
    if how != "custom" and (P is None or not hasattr(P, how)):
        pytest.skip("torch %s has no parametrizations.%s" % (torch.__version__, how))

    def make():
        torch.manual_seed(0)
        m = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
        if how == "custom":
            nn.utils.parametrize.register_parametrization(m[0], "weight", _Scale2())
        else:
            getattr(P, how)(m[0])
        return m

    want = losses(make(), 3)
    m = make()
    path = str(tmp_path / "t.h5")
    tr = at.Tracer(m, path, precision="fp32")
    names = tr.layer_names()
    got = losses(m, 3, tr)
    tr.close()
    assert got == want
    assert "0" in names and not any("parametrizations" in n for n in names), names
    st = stats_by_site(path)
    n_orig = len(list(m[0].parametrizations.parameters()))
    for step in range(3):
        assert len(st[(step, "0", "fwd_out")]) == 1
        assert len(st[(step, "0", "weight_grad")]) == 1 + n_orig  # bias too
        assert len(st[(step, "0", "master_weight")]) == 1 + n_orig


@pytest.mark.parametrize("case", ["action-mask", "causal-scores", "log-softmax-in",
                                  "cross-entropy", "ce-fully-masked",
                                  "fully-masked-row", "plus-inf", "nan"])
@pytest.mark.parametrize("mode", ["raise", "warn"])
def test_masked_logits_before_a_softmax(tmp_path, case, mode):
    """-inf written into a softmax's input (masked_fill(~valid, -inf)
    before nn.Softmax: RL action masking, hand-written attention), or into
    a cross-entropy's, is masked logits, no event: the job runs on and is healthy (it raised,
    and was called degraded). A row with every logit masked makes the
    softmax's NaN output, an event named there; +inf or NaN in the input
    is one at the input. A LogSoftmax maps masked logits to -inf at its
    output, an event there (the documented limit: only a softmax's input
    is read as masked)."""
    class Policy(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(8, 6)
            self.sm = nn.Softmax(-1) if case != "log-softmax-in" else nn.LogSoftmax(-1)

        def forward(self, obs, valid):
            z = self.fc(obs)
            if case in ("cross-entropy", "ce-fully-masked"):  # to the loss
                return z.masked_fill(~valid, float("-inf"))
            if case == "causal-scores":
                z = z[:, :4].unsqueeze(1).expand(4, 4, 4)
                valid = torch.ones(4, 4, dtype=torch.bool).tril().expand(4, 4, 4)
            if case == "plus-inf":
                return self.sm(z.masked_fill(~valid, float("inf")))
            if case == "nan":
                return self.sm(z.masked_fill(~valid, float("nan")))
            return self.sm(z.masked_fill(~valid, float("-inf")))

    torch.manual_seed(0)
    m = Policy()
    path = str(tmp_path / "t.h5")
    ce = nn.CrossEntropyLoss()
    to_loss = case in ("cross-entropy", "ce-fully-masked")
    tr = at.Tracer(m, path, precision="fp32", on_nonfinite=mode,
                   loss_fn=ce if to_loss else None)
    valid = torch.ones(4, 6, dtype=torch.bool)
    valid[:, 4:] = False
    if case in ("fully-masked-row", "ce-fully-masked"):
        valid[2] = False
    err = None
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        try:
            for _ in range(2):
                p = m(torch.randn(4, 8), valid)
                out = p[..., :4]
                if case in ("cross-entropy", "ce-fully-masked"):
                    loss = ce(p, torch.tensor([0, 1, 2, 3]))
                else:
                    loss = (-out.sum() if case == "log-softmax-in" else
                            -torch.log(out.clamp(min=1e-9)).mean())
                loss.backward()
                tr.end_step(loss=float(loss))
        except at.NonFiniteError as e:
            err = str(e)
    tr.close()
    said = [str(x.message) for x in w if issubclass(x.category, at.NonFiniteWarning)]
    got = [err] if err else said
    pm = ampprobe.postmortem(path)
    if case in ("action-mask", "causal-scores", "cross-entropy"):
        assert got == [], got
        assert pm["verdict"] == "healthy", (pm["verdict"], pm["event"])
        return
    if case == "ce-fully-masked":  # the NaN of a row of -inf: no target
        # is to blame (review 9: the message said to check them)
        assert len(got) >= 1 and "module 'loss' (loss), site fwd_out" in got[0], got
        assert "targets" not in got[0], got
        return
    site = "fwd_out" if case in ("fully-masked-row", "log-softmax-in") else "fwd_in"
    assert len(got) >= 1 and "module 'sm' (softmax), site %s" % site in got[0], got
    ev = pm["event"]
    assert (ev["origin_layer"], ev["origin_site"]) == ("sm", site), ev


def test_dataclass_inputs_masks_and_mutation(tmp_path):
    """A dataclass handed to a module: a field that is an option (an
    additive -inf attention bias, a mask) is not recorded, as an argument
    of that name is not (review of f8be79b: the model's input then held
    -inf, a healthy job was 'input-nan'); its other fields are; and a
    criterion writes into the dataclass the job gave it, not into a copy."""
    import dataclasses

    @dataclasses.dataclass
    class Batch:
        x: torch.Tensor
        attn_bias: torch.Tensor
        notes: list = dataclasses.field(default_factory=list)
        aux: object = None

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(5, 5)

        def forward(self, b):
            return torch.softmax(self.fc(b.x) + b.attn_bias, -1)

    class Crit(nn.Module):
        def forward(self, p, b):
            b.notes.append("seen")
            b.aux = "set"
            return -torch.log(p[:, :3].clamp(min=1e-9)).mean()

    torch.manual_seed(0)
    m, crit = M(), Crit()
    path = str(tmp_path / "t.h5")
    tr = at.Tracer(m, path, loss_fn=crit, precision="fp32", on_nonfinite="raise")
    bias = torch.zeros(4, 5)
    bias[:, 3:] = float("-inf")
    b = Batch(torch.randn(4, 5), bias)
    crit(m(b), b).backward()
    tr.end_step(loss=1.0)
    tr.close()
    assert b.notes == ["seen"] and b.aux == "set"
    st = stats_by_site(path)
    assert len(st[(0, "input", "fwd_out")]) == 1  # x only
    assert ampprobe.postmortem(path)["verdict"] == "healthy"


class _LogParam(nn.Module):
    def forward(self, w):
        return torch.log(w)  # NaN where w < 0


def test_a_parametrized_module_with_children(tmp_path):
    """A parametrized module that also has children is no leaf: its
    children and its parametrizations are traced as before, so a NaN its
    parametrization makes is named there, in the forward (review of
    4656d47: made a leaf only of its parametrizations, nothing of them was
    traced and the NaN was named at the child, later at a master weight)."""
    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.ones(8))
            self.fc = nn.Linear(8, 8)

        def forward(self, x):
            return self.fc(x * self.w)

    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(8, 8), Block())
    nn.utils.parametrize.register_parametrization(m[1], "w", _LogParam())
    path = str(tmp_path / "t.h5")
    tr = at.Tracer(m, path, precision="fp32", on_nonfinite="raise")
    names = tr.layer_names()
    assert "1.fc" in names and "1.parametrizations.w.0" in names, names
    with torch.no_grad():
        m[1].parametrizations.w.original[2] = -1.0
    with pytest.raises(at.NonFiniteError) as e:
        m(torch.randn(4, 8)).sum().backward()
        tr.end_step(loss=1.0)
    assert (e.value.module, e.value.site, e.value.phase) == (
        "1.parametrizations.w.0", "fwd_out", "forward"), str(e.value)


def test_masked_logits_in_the_report_of_a_rank_set(tmp_path, cli):
    """The report of a rank set whose ranks mask logits before a softmax
    and back off once (a routine scaler overflow at step 1, so the writer
    has a first non-finite step and the ranks x steps view reads records
    from it): healthy, and no rank-step marked inf/NaN (review of 3f16129:
    the header said healthy, the view 5 steps of inf/NaN on each rank)."""
    class W(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc, self.sm = nn.Linear(8, 6), nn.Softmax(-1)

        def forward(self, x, valid):
            return self.sm(self.fc(x).masked_fill(~valid, float("-inf")))

    paths = []
    for rank in range(2):
        torch.manual_seed(rank)
        m = W()
        opt = torch.optim.SGD(m.parameters(), 0.01)
        tr = at.Tracer(m, str(tmp_path / "t.h5"), distributed=True, rank=rank,
                       world_size=2, run_id="masked", precision="fp32")
        paths.append(tr.path)
        for step in range(6):
            valid = torch.rand(16, 6) > 0.3
            valid[:, 0] = True
            loss = (m(torch.randn(16, 8), valid) * torch.randn(16, 6)).sum()
            scale = 3e38 if step == 1 else 1024.0
            opt.zero_grad()
            (loss * scale).backward()
            found = any(not torch.isfinite(p.grad).all() for p in m.parameters())
            if not found:
                for p in m.parameters():
                    p.grad /= scale
                opt.step()
            tr.end_step(loss=loss, loss_scale=scale, found_inf=int(found),
                        skipped=int(found))
        tr.close()
    html = str(tmp_path / "set.html")
    r = subprocess.run([cli, "report", *paths, "-o", html, "-q"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    page = open(html, encoding="utf-8").read()
    assert "no inf/NaN on any rank" in page
    assert "inf/NaN on this rank (0 rank-steps)" in page, re.findall(
        r"inf/NaN on this rank \([^)]*\)", page)
