"""torch.compile (torch >= 2): a traced model compiled before the Tracer,
after it, or in place (Module.compile) records what the same job records
eagerly, under the same layer names; a planted FP16 overflow is named at
the same origin; a policy's FP32 modules stay FP32; and the hooks make no
module recompile (they run as graph breaks, ampprobe.torch._eager).
Skipped, saying so, where torch has no torch.compile (Debian's 1.13)."""
import math
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
if not hasattr(torch, "compile") or not hasattr(torch, "compiler"):
    pytest.skip("torch %s has no torch.compile (torch >= 2.1 needed)"
                % torch.__version__, allow_module_level=True)
import torch._dynamo  # noqa: E402
import torch.nn as nn  # noqa: E402

import ampprobe  # noqa: E402
import ampprobe.torch as at  # noqa: E402
from ampprobe._lib import SITES  # noqa: E402
from models import PLANTED, Net, ProbNLL, RevINLike, data, train  # noqa: E402

torch.set_num_threads(1)

# what must agree exactly between an eager and a compiled run: the element
# counts (a compiled kernel may round the sums differently, not the counts
# of non-finite elements); zeros too, except in a tensor of rounding noise
# (fc1's bias gradient, which the BatchNorm after it cancels: ~1e-9, some
# of it exactly 0 in one run and not in the other)
EXACT = ("count", "dtype", "nan_count", "posinf_count", "neginf_count",
         "f16_overflow")
NOISE = 1e-6
STEPS = 3


@pytest.fixture(autouse=True)
def fresh_dynamo(monkeypatch):
    """Each test compiles from nothing, and a frame that reaches dynamo's
    recompile limit is an error, not a silent fall back to eager (a hook
    read as a guard made every hooked module recompile at each call, up to
    that limit). A few recompiles are dynamo's own (a frame first seen
    with inputs that need no gradient)."""
    torch._dynamo.reset()
    cfg = torch._dynamo.config
    if hasattr(cfg, "skip_nnmodule_hook_guards"):  # a Tracer sets it
        monkeypatch.setattr(cfg, "skip_nnmodule_hook_guards",
                            cfg.skip_nnmodule_hook_guards)
    for name in ("fail_on_recompile_limit_hit", "fail_on_cache_limit_hit"):
        if hasattr(cfg, name):
            monkeypatch.setattr(cfg, name, True)
            break
    else:
        pytest.skip("torch %s's dynamo cannot fail at its recompile limit"
                    % torch.__version__)
    yield
    torch._dynamo.reset()


def _run(tmp_path, name, how, steps=STEPS, make=data, tweak=None, **kw):
    """A 3-step job on the Net; how: "eager", "compile-first" (the Tracer
    gets torch.compile(model)), "tracer-first" (compiled after the Tracer
    hooked it) or "in-place" (model.compile())."""
    torch.manual_seed(0)
    model, loss_fn = Net(), ProbNLL()
    if tweak:
        tweak(model)
    path = str(tmp_path / name)
    kw.setdefault("precision", "fp32")
    kw.update(kinds={RevINLike: "revin"}, loss_fn=loss_fn)
    if how == "compile-first":
        job = torch.compile(model)
        tr = at.Tracer(job, path, **kw)
    else:
        tr = at.Tracer(model, path, **kw)
        job = model
        if how == "tracer-first":
            job = torch.compile(model)
        elif how == "in-place":
            model.compile()
    losses = train(tr, job, loss_fn, steps, make=make,
                   autocast=kw["precision"] != "fp32")
    tr.close()
    return ampprobe.read_trace(path), losses, tr


def _keyed(t):
    """The records as {(step, layer name, site): [rows]} (several rows
    where a parameter's gradient or an input is recorded more than once)."""
    names = [n.decode() for n in t["layers"]["name"]]
    out = {}
    for row in t["records"]:
        k = (int(row["step"]), names[row["layer"]], SITES[row["site"]])
        out.setdefault(k, []).append(row)
    return out


@pytest.mark.parametrize("how", ["compile-first", "tracer-first", "in-place"])
def test_compiled_job_records_as_eager(tmp_path, how):
    ref, ref_losses, _ = _run(tmp_path, "eager.h5", "eager")
    t, losses, tr = _run(tmp_path, "compiled.h5", how)
    assert list(t["layers"]["name"]) == list(ref["layers"]["name"])
    assert "fc1" in [n.decode() for n in t["layers"]["name"]]  # no _orig_mod.
    assert tr.model is not None and not hasattr(tr.model, "_orig_mod")
    a, b = _keyed(ref), _keyed(t)
    assert sorted(a) == sorted(b)
    assert len(a) > 40  # every layer's forward and gradient sites, 3 steps
    for k in a:
        assert len(a[k]) == len(b[k]), k
        for x, y in zip(sorted(a[k], key=lambda r: (r["count"], r["sum"])),
                        sorted(b[k], key=lambda r: (r["count"], r["sum"]))):
            for f in EXACT:
                assert x[f] == y[f], (k, f)
            if x["absmax"] > NOISE:
                assert x["zero_count"] == y["zero_count"], k
            for f in ("sum", "absmax"):
                np.testing.assert_allclose(y[f], x[f], rtol=1e-4, atol=1e-5,
                                           err_msg="%s %s" % (k, f))
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-5)


def _seq():
    """bench/python_overhead.py's healthy model, as a Softmax classifier: a
    class whose compiled code dynamo shares between instances."""
    return nn.Sequential(nn.Linear(16, 32), nn.LayerNorm(32), nn.GELU(),
                         nn.Linear(32, 32), nn.BatchNorm1d(32), nn.ReLU(),
                         nn.Linear(32, 4), nn.Softmax(-1))


def _seq_step(job):
    x, y = data(0)
    loss = ProbNLL()(job(x), y)
    loss.backward()
    return loss


@pytest.mark.parametrize("how", ["copy-first", "copy-after",
                                 "copy-first-reset"])
def test_a_compiled_copy_of_the_models_class(tmp_path, how):
    """An untraced compiled copy of the model's class, run before the
    traced compiled model: dynamo reused its code, compiled without hooks,
    for the traced model (it does not guard on module hooks by default),
    so no forward hook ran and the backward was a ProbeError
    'probe_tensor_record outside a step' (bench/python_overhead.py
    --compiled hit it). The Tracer now turns dynamo's hook guards on
    while it is open: a copy run after the Tracer was made is harmless
    ("copy-after"); after one run before it the job goes on and end_step
    warns, naming the cause and the fix ("copy-first"), and the fix,
    torch._dynamo.reset() after the Tracer, works ("copy-first-reset")."""
    if how != "copy-after":
        _seq_step(torch.compile(_seq()))
    torch.manual_seed(0)
    job = torch.compile(_seq())
    tr = at.Tracer(job, str(tmp_path / "t.h5"))  # the default precision
    if how == "copy-after":
        _seq_step(torch.compile(_seq()))
    elif how == "copy-first-reset":
        torch._dynamo.reset()
    if how == "copy-first":
        loss = _seq_step(job)
        with pytest.warns(RuntimeWarning, match=r"got gradients, but its "
                          r"forward ran without.*torch\._dynamo\.reset\(\)"):
            tr.end_step(loss=loss)
        tr.close()
        assert ampprobe.read_trace(tr.path)["records"].size > 0  # grads
        return
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # none of ours
        for _ in range(2):
            tr.end_step(loss=_seq_step(job))
    tr.close()
    t = ampprobe.read_trace(tr.path)
    k = _keyed(t)
    # the input and the 8 modules' outputs, both steps
    assert sum(1 for s, _, site in k if site == "fwd_out") == 2 * 9
    cfg = torch._dynamo.config  # put back as the Tracer found it
    assert cfg.skip_nnmodule_hook_guards is True


# planted FP16 overflows under emulation (models.PLANTED, as test_torch.py)
CASES = {k: PLANTED[k] for k in ("revin", "linear")}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("how", ["compile-first", "tracer-first"])
def test_compiled_overflow_named_at_its_origin(tmp_path, case, how):
    mk, tweak, want = CASES[case]
    t, _, tr = _run(tmp_path, "t.h5", how, make=mk, tweak=tweak,
                    precision="fp16", emulate_fp16=True)
    ev = ampprobe.postmortem(tr.path)["event"]
    assert (ev["origin_layer"], ev["origin_kind"], ev["origin_site"],
            ev["phase"], ev["step"]) == want + (0,), ev


def test_compiled_raise_names_the_module(tmp_path):
    mk, tweak, want = CASES["linear"]
    with pytest.raises(at.NonFiniteError) as e:
        _run(tmp_path, "t.h5", "compile-first", make=mk, tweak=tweak,
             precision="fp16", emulate_fp16=True, on_nonfinite="raise")
    err = e.value
    assert (err.module, err.kind, err.site, err.step) == (
        want[0], want[1], want[2], 0)


def test_compiled_policy_keeps_fp32_modules(tmp_path, monkeypatch):
    """AMPPROBE_FP32 (what bisect sets) names modules as eager runs do, and
    the forced module runs in FP32 inside the compiled job: RevIN's
    overflow is gone, the other modules still emulate FP16."""
    monkeypatch.setenv("AMPPROBE_FP32", "revin")
    mk = CASES["revin"][0]
    t, losses, tr = _run(tmp_path, "t.h5", "compile-first", make=mk,
                         precision="fp16", emulate_fp16=True)
    assert tr.fp32_modules() == ["revin"]
    assert all(math.isfinite(x) for x in losses)
    names = [n.decode() for n in t["layers"]["name"]]
    prec = t["layers"]["precision"]
    assert prec[names.index("revin")] == 0 and prec[names.index("fc1")] == 1
    assert t["records"]["posinf_count"].sum() == 0
    assert ampprobe.postmortem(tr.path)["event"]["kind"] == "none"


@pytest.mark.parametrize("order", ["compile-of-ddp", "ddp-of-compiled"])
def test_compiled_ddp_records_the_buckets(tmp_path, group, order):
    # group: a one-rank gloo group (conftest.py)
    """DDP and torch.compile in either order: the DDP wrapper is found (its
    comm hook records each bucket before and after the all-reduce), the
    layers are named without "module." or "_orig_mod.", and one rank's
    all-reduced gradient is its own weight gradient."""
    DDP = torch.nn.parallel.DistributedDataParallel
    torch.manual_seed(0)
    model, loss_fn = Net(), ProbNLL()
    job = (torch.compile(DDP(model)) if order == "compile-of-ddp"
           else DDP(torch.compile(model)))
    tr = at.Tracer(job, str(tmp_path / "t.h5"), kinds={RevINLike: "revin"},
                   loss_fn=loss_fn, precision="fp32")
    assert tr.ddp is not None and tr.model is model
    train(tr, job, loss_fn, 2, make=data, lr=1e-2, autocast=False)
    tr.close()
    assert tr.comm_recorder.buckets >= 2  # one bucket a step at least
    t = ampprobe.read_trace(tr.path)
    names = [n.decode() for n in t["layers"]["name"]]
    assert "fc1" in names and not any(
        n.startswith(("module.", "_orig_mod.")) for n in names), names
    r = t["records"]
    pre = SITES.index("grad_pre_allreduce")
    post = SITES.index("grad_post_allreduce")
    wg = SITES.index("weight_grad")
    fc1 = names.index("fc1")
    for step in range(2):
        rows = r[(r["layer"] == fc1) & (r["step"] == step)]
        a = sorted(rows[rows["site"] == pre]["sum"])
        assert len(a) == 2  # weight and bias
        assert a == sorted(rows[rows["site"] == post]["sum"])
        np.testing.assert_allclose(a, sorted(rows[rows["site"] == wg]["sum"]),
                                   rtol=1e-6, atol=1e-9)
