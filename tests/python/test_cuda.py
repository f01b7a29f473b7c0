"""The Python package on a CUDA device: what the CPU suites can only
emulate. Statistics libprobe computes from device memory against the same
values on the host; FP16 overflows made by real torch.autocast("cuda") named
by the post-mortem; torch's own GradScaler on the device. Skipped, saying
why, where torch sees no CUDA device (every machine but a GPU one:
scripts/gpu-check.sh runs it there)."""
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("torch sees no CUDA device", allow_module_level=True)

import torch.nn as nn  # noqa: E402

import ampprobe  # noqa: E402
import ampprobe.torch as at  # noqa: E402
from ampprobe._lib import DTYPES, SITES  # noqa: E402
from models import PLANTED, Net, ProbNLL, RevINLike, data, train  # noqa: E402

DEV = torch.device("cuda")
COUNTS = ("count", "nan_count", "posinf_count", "neginf_count", "zero_count",
          "f16_subnormal", "f16_flush", "f16_overflow")
EXACT = ("min", "max", "absmax", "absmin_nonzero")
# sums: docs/statistics.md bounds the error of each path by the sum of the
# magnitudes; a relative 1e-5 of that is far above the bound and far below
# any mistake of a whole element
SUM_RTOL = 1e-5


def special_values(n, dtype, seed):
    """n values of dtype on the device: N(0,1) spread over many binades, with
    zeros, subnormals, values near the FP16 limit, inf and NaN mixed in."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g) * torch.exp2(
        torch.randint(-30, 17, (n,), generator=g).float())
    idx = torch.randperm(n, generator=g)
    x[idx[:97]] = 0.0
    x[idx[97:150]] = float("inf")
    x[idx[150:170]] = float("-inf")
    x[idx[170:211]] = float("nan")
    x[idx[211:300]] = 6.0e-8   # FP16 subnormal
    x[idx[300:340]] = 70000.0  # above the FP16 maximum
    return x.to(dtype).to(DEV)


def host_array(t):
    h = t.cpu()
    if t.dtype == torch.bfloat16:
        return h.view(torch.int16).numpy().view(np.uint16), "bf16"
    return h.numpy(), None


@pytest.mark.parametrize("n", [1, 1000, 1 << 20, (1 << 20) + 7])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_device_statistics_equal_the_hosts(tmp_path, dtype, n):
    """A tensor in device memory recorded by pointer: every count and
    extreme equals libprobe's host computation on the same values, the sums
    within the bound."""
    t = special_values(n, dtype, seed=n)
    name = {torch.float32: "fp32", torch.float16: "fp16",
            torch.bfloat16: "bf16"}[dtype]
    path = str(tmp_path / "d.h5")
    with ampprobe.Session(path) as s:
        lid = s.register("x", precision=name)
        s.begin_step(0)
        s.record_ptr(lid, "fwd_out", name, t.data_ptr(), t.numel())
        s.end_step()
    torch.cuda.synchronize()
    r = ampprobe.read_trace(path)["records"]
    assert len(r) == 1
    r = r[0]
    a, dt = host_array(t)
    want = ampprobe.stats(a, dtype=dt)
    for f in COUNTS:
        assert int(r[f]) == int(want[f]), (f, int(r[f]), int(want[f]))
    for f in EXACT:
        assert (float(r[f]) == float(want[f])) or (
            math.isnan(r[f]) and math.isnan(want[f])), (f, r[f], want[f])
    finite = torch.nan_to_num(t.double().abs(), nan=0.0, posinf=0.0, neginf=0.0)
    scale = {"sum": float(finite.sum()), "sumsq": float((finite * finite).sum())}
    for f in ("sum", "sumsq"):
        got, exp = float(r[f]), float(want[f])
        if not math.isfinite(exp):
            assert got == exp or (math.isnan(got) and math.isnan(exp)), (f, got, exp)
        else:
            assert math.isclose(got, exp, rel_tol=SUM_RTOL,
                                abs_tol=SUM_RTOL * scale[f]), (f, got, exp)
    assert list(r["hist"]) == list(want["hist"])


def to_device(make):
    return lambda s: tuple(v.to(DEV) for v in make(s))


@pytest.mark.parametrize("case", ["linear", "nan-input"])
def test_real_autocast_overflow_is_named(tmp_path, case):
    """The planted faults of the emulation suites (models.PLANTED), made by
    real FP16 autocast on the device: the same origin."""
    mk, tweak, want = PLANTED[case]
    torch.manual_seed(0)
    model, loss_fn = Net().to(DEV), ProbNLL()
    if tweak:
        tweak(model)
    path = str(tmp_path / "t.h5")
    tr = at.Tracer(model, path, kinds={RevINLike: "revin"}, loss_fn=loss_fn,
                   precision="fp16", emulate_fp16=False, env=False)
    assert tr.device_type == "cuda"
    train(tr, model, loss_fn, 3, make=to_device(mk))
    tr.close()
    ev = ampprobe.postmortem(path)["event"]
    assert (ev["origin_layer"], ev["origin_kind"], ev["origin_site"],
            ev["phase"], ev["step"]) == want + (0,), ev
    assert ampprobe.verdict(path) in ("degraded", "diverged")


def test_real_autocast_records_fp16_outputs(tmp_path):
    """Under torch.autocast("cuda") a Linear's output is FP16 on the device;
    the trace records it as fp16, and a healthy run (loss scaling on: at
    scale 1 RevIN's FP16 gradients underflow, which the post-mortem says)
    is healthy."""
    torch.manual_seed(0)
    model, loss_fn = Net().to(DEV), ProbNLL()
    path = str(tmp_path / "h.h5")
    tr = at.Tracer(model, path, kinds={RevINLike: "revin"}, loss_fn=loss_fn,
                   precision="fp16", emulate_fp16=False, env=False)
    losses = train(tr, model, loss_fn, 5, make=to_device(data),
                   scaler=at.LossScaler(init_scale=65536.0))
    tr.close()
    assert all(math.isfinite(x) for x in losses)
    t = ampprobe.read_trace(path)
    names = {int(L["id"]): L["name"].decode() if isinstance(L["name"], bytes)
             else L["name"] for L in t["layers"]}
    fc1 = [r for r in t["records"] if names.get(int(r["layer"])) == "fc1"
           and SITES[int(r["site"])] == "fwd_out"]
    assert fc1 and all(DTYPES[int(r["dtype"])] == "fp16" for r in fc1)
    assert ampprobe.verdict(path) == "healthy"


def test_torch_gradscaler_on_the_device(tmp_path):
    """torch's GradScaler on CUDA with a scale that overflows the FP16
    gradients: the step is skipped and the scale halved, the trace says so,
    and the post-mortem calls it the scaler's routine."""
    torch.manual_seed(0)
    model, loss_fn = Net().to(DEV), ProbNLL()
    path = str(tmp_path / "g.h5")
    tr = at.Tracer(model, path, kinds={RevINLike: "revin"}, loss_fn=loss_fn,
                   precision="fp16", emulate_fp16=False, env=False)
    GradScaler = getattr(torch.amp, "GradScaler", None)
    sc = (GradScaler(DEV.type, init_scale=2.0 ** 40, growth_interval=2)
          if GradScaler else torch.cuda.amp.GradScaler(
              init_scale=2.0 ** 40, growth_interval=2))
    # 40 steps: the scale comes down and the run trains (a run whose every
    # step was skipped took no optimizer step: not healthy)
    losses = train(tr, model, loss_fn, 40, scaler=sc, make=to_device(data))
    tr.close()
    assert all(math.isfinite(x) for x in losses)
    st = ampprobe.read_trace(path)["steps"]
    assert st["skipped"][0] == 1 and st["found_inf"][0] == 1
    assert st["loss_scale"][0] == 2.0 ** 40 and st["loss_scale"][1] == 2.0 ** 39
    pm = ampprobe.postmortem(path)
    assert pm["event"]["kind"] == "none"
    assert pm["event"]["first_gradient_overflow_step"] == 0
    assert pm["scaler"]["backoffs"] >= 1
    assert pm["verdict"] == "healthy", pm["verdict"]
