"""Cross-check: the same model and data in the C trainer (a JSON config) and
in PyTorch under FP16 emulation give the same step-0 statistics per layer
and site.

The PyTorch side gets the C trainer's exact initial weights and batch: the
trainer's generator (splitmix64 + xoshiro256**, trainer/rng.c) is
reproduced below, as are its draws (weights in module order, CSV rows
sampled with replacement). What may differ, and why (docs/python.md):
- counts (elements, NaN, +-inf) must be equal;
- min/max/absmax agree to a relative 2^-9 (measured: 1.7e-4 at worst): the C FP16 kernels round every
  input and weight to binary16 on entry and every intermediate (mean, var,
  stdev) on materialisation; the emulation rounds module inputs, outputs,
  gradients and the intermediates the module marks (saved/materialized),
  while PyTorch's ops compute with the FP32 weights - differences of a few
  binary16 ulps, amplified where BatchNorm divides by a small deviation;
- with RevIN's variance overflowing (the second case) only the counts are
  compared after fc1: the C BatchNorm of fc1's now constant columns gives
  exactly 0, torch's fused batch_norm +-1e-6 (rounding inside an op, which
  the emulation cannot reach), and what ReLU passes differs from there on;
- sites only the C trainer has (BatchNorm's saved variance: torch's fused
  batch_norm keeps it internal; the gradient to the data, which torch does
  not compute for a tensor that needs none) are not compared, and the C trainer stores
  a module's parameters as one tensor where torch has weight and bias: the
  PyTorch records of a site are merged (counts added, extremes combined).
"""
import json
import math
import subprocess

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.nn as nn  # noqa: E402

import ampprobe  # noqa: E402
import ampprobe.torch as at  # noqa: E402
from ampprobe._lib import SITES  # noqa: E402

M64 = (1 << 64) - 1
B, T, H, C, ROWS, SEED = 32, 16, 12, 4, 200, 5


def splitmix64(state):
    state = (state + 0x9E3779B97F4A7C15) & M64
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return state, z ^ (z >> 31)


def seed_mix(seed, stream):
    x = (seed ^ ((stream * 0xD1B54A32D192ED03) & M64)) & M64
    x, _ = splitmix64(x)
    x, z = splitmix64(x)
    return z


class Xoshiro:
    def __init__(self, seed):
        x, self.s = seed, []
        for _ in range(4):
            x, z = splitmix64(x)
            self.s.append(z)

    def u64(self):
        s = self.s
        rotl = lambda v, k: ((v << k) | (v >> (64 - k))) & M64
        result = (rotl((s[1] * 5) & M64, 7) * 9) & M64
        t = (s[1] << 17) & M64
        s[2] ^= s[0]
        s[3] ^= s[1]
        s[1] ^= s[2]
        s[0] ^= s[3]
        s[2] ^= t
        s[3] = rotl(s[3], 45)
        return result

    def uniform(self):
        return (self.u64() >> 11) * 2.0 ** -53


class RevIN(nn.Module):
    """As the C trainer's RevIN norm (docs/precision.md): mean, var, stdev
    materialised, the variance saved (fwd_saved), affine."""

    def __init__(self):
        super().__init__()
        self.gamma = nn.Parameter(torch.ones(1))
        self.beta = nn.Parameter(torch.zeros(1))

    def forward(self, x):
        mean = at.materialized(self, x.mean(dim=1, keepdim=True))
        var = at.saved(self, ((x - mean) ** 2).mean(dim=1, keepdim=True))
        std = at.materialized(self, torch.sqrt(var + 1e-5))
        return (x - mean) / std * self.gamma + self.beta


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.revin = RevIN()
        self.fc1 = nn.Linear(T, H)
        self.bn = nn.BatchNorm1d(H)
        self.act = nn.ReLU()
        self.head = nn.Linear(H, C)
        self.sm = nn.Softmax(dim=-1)

    def forward(self, x):
        return self.sm(self.head(self.act(self.bn(self.fc1(self.revin(x))))))


class ProbNLL(nn.Module):
    def forward(self, p, y):
        return -torch.log(p.gather(1, y[:, None])).mean()


def c_init(net):
    """The trainer's initialisation (trainer/train.c): one generator, the
    linear layers' W (out, in) then b, each U(-k, k), k = 1/sqrt(in)."""
    r = Xoshiro(seed_mix(SEED, 0x1417))
    with torch.no_grad():
        for lin in (net.fc1, net.head):
            k = 1.0 / math.sqrt(lin.in_features)
            n = lin.weight.numel() + lin.bias.numel()
            v = np.array([(2.0 * r.uniform() - 1.0) * k for _ in range(n)],
                         dtype=np.float64).astype(np.float32)
            lin.weight.copy_(torch.from_numpy(v[:lin.weight.numel()]).view_as(lin.weight))
            lin.bias.copy_(torch.from_numpy(v[lin.weight.numel():]))


def c_batch(xs, ys, step):
    r = Xoshiro(seed_mix(SEED, step * 4096 + 0 + 1))
    rows = [r.u64() % ROWS for _ in range(B)]
    return torch.from_numpy(xs[rows]), torch.from_numpy(ys[rows])


def merged(trace, step=0):
    """{(layer name, site): merged stats} of one step."""
    names = [n.decode() for n in trace["layers"]["name"]]
    out = {}
    for r in trace["records"][trace["records"]["step"] == step]:
        key = (names[r["layer"]], SITES[r["site"]])
        m = out.setdefault(key, {"count": 0, "nan_count": 0, "posinf_count": 0,
                                 "neginf_count": 0, "zero_count": 0,
                                 "min": math.inf, "max": -math.inf,
                                 "absmax": 0.0, "n": 0})
        for k in ("count", "nan_count", "posinf_count", "neginf_count",
                  "zero_count"):
            m[k] += int(r[k])
        if not math.isnan(r["min"]):  # NaN: nothing finite in this one
            m["min"] = min(m["min"], float(r["min"]))
            m["max"] = max(m["max"], float(r["max"]))
            m["absmax"] = max(m["absmax"], float(r["absmax"]))
        m["n"] += 1
    for m in out.values():
        if m["min"] == math.inf:  # nothing finite at all
            m["min"] = m["max"] = m["absmax"] = math.nan
    return out


def close(a, b, rel=2.0 ** -9, abs_=1e-6):
    if math.isnan(a) or math.isnan(b):  # nothing finite: NaN on both sides
        return math.isnan(a) and math.isnan(b)
    return abs(a - b) <= abs_ + rel * max(abs(a), abs(b))


@pytest.mark.parametrize("level,spread", [(5.0, 2.0), (3000.0, 500.0)],
                         ids=["healthy", "revin-overflow"])
def test_c_trainer_and_pytorch_agree_at_step_0(tmp_path, cli, level, spread):
    """healthy: small series; revin-overflow: RevIN's FP16 variance is inf
    on both sides (equal counts of inf and NaN downstream)."""
    rng = np.random.default_rng(11)
    xs = (level + spread * rng.standard_normal((ROWS, T))).astype(np.float32)
    ys = rng.integers(0, C, ROWS)
    csv = tmp_path / "data.csv"
    with open(str(csv), "w") as f:
        for i in range(ROWS):
            f.write(",".join("%.9g" % v for v in xs[i]) + ",%d\n" % ys[i])
    cfg = {
        "name": "crosscheck", "seed": SEED, "steps": 1, "precision": "fp16",
        "model": [{"type": "revin", "name": "revin"},
                  {"type": "linear", "name": "fc1", "out": H},
                  {"type": "bn", "name": "bn"},
                  {"type": "relu", "name": "act"},
                  {"type": "linear", "name": "head", "out": C},
                  {"type": "softmax", "name": "sm"}],
        "loss": "cross_entropy",
        "data": {"kind": "csv", "path": str(csv), "batch": B},
        "optimizer": {"type": "adam", "lr": 1e-3},
        "scaler": {"enabled": False},
    }
    cfgp = tmp_path / "cfg.json"
    cfgp.write_text(json.dumps(cfg))
    ctrace = tmp_path / "c.h5"
    r = subprocess.run([cli, "run", "--config", str(cfgp), "--trace", "-q",
                        "-o", str(ctrace)], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE)
    assert r.returncode in (0, 1), r.stderr.decode()

    torch.manual_seed(0)
    net, loss_fn = Net(), ProbNLL()
    c_init(net)
    ptrace = tmp_path / "py.h5"
    tr = at.Tracer(net, str(ptrace), emulate_fp16=True, kinds={RevIN: "revin"},
                   loss_fn=loss_fn)
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    x, y = c_batch(xs, ys, 0)
    loss = loss_fn(net(x), y)
    loss.backward()
    opt.step()
    tr.end_step(loss=loss, optimizer=opt)
    tr.close()

    ct, pt = ampprobe.read_trace(str(ctrace)), ampprobe.read_trace(str(ptrace))
    cs, ps = merged(ct), merged(pt)
    lc, lp = ct["steps"]["loss"][0], pt["steps"]["loss"][0]
    assert (math.isnan(lc) and math.isnan(lp)) or math.isclose(lc, lp, rel_tol=1e-3)
    overflow = level > 1000
    common = sorted(set(cs) & set(ps))
    only_c = sorted(set(cs) - set(ps))
    # torch keeps BatchNorm's variance inside its fused op, and computes no
    # gradient for the data (the first module's grad_in) that needs none
    assert only_c == [("bn", "fwd_saved"), ("revin", "grad_in")], only_c
    assert len(common) >= 30, common
    # RevIN's gamma/beta gradients are sums over B*T terms that cancel (the
    # BatchNorm downstream makes the gradient sum to ~0): what is left is
    # rounding noise, of either sign, on both sides. Adam's first step
    # moves a parameter by ~lr * sign(g), so RevIN's master values differ
    # in sign too. Those two get bounds instead of a comparison.
    noise = {("revin", "weight_grad"), ("revin", "master_weight")}
    terms = max(cs[("revin", "grad_out")]["absmax"],
                ps[("revin", "grad_out")]["absmax"]) * B * T
    for side in (cs, ps) if not overflow else ():
        assert side[("revin", "weight_grad")]["absmax"] <= 1e-3 * terms
        mw = side[("revin", "master_weight")]
        assert mw["max"] <= 1 + 1.01e-3 and mw["min"] >= -1.01e-3
    bad, compared = [], []
    for key in common:
        a, b = cs[key], ps[key]
        for k in ("count", "nan_count", "posinf_count", "neginf_count"):
            if a[k] != b[k]:
                bad.append((key, k, a[k], b[k]))
        if key in noise:
            continue
        if overflow and not (key[0] in ("input", "revin", "fc1")
                             and key[1] in ("fwd_in", "fwd_out", "fwd_saved",
                                            "weight")):
            # After RevIN's collapse every fc1 output column is constant:
            # the C BatchNorm gives exactly 0, torch's (an FP32 mean of equal
            # values that is not exact) gives +-1e-6, and the gradients
            # that ReLU lets through differ from there on. Counts only.
            continue
        compared.append(key)
        for k in ("min", "max", "absmax"):
            if not close(a[k], b[k]):
                bad.append((key, k, a[k], b[k]))
    assert not bad, "\n".join(map(str, bad))
    # How close: the largest relative difference over the compared extremes
    worst = max([abs(cs[k][f] - ps[k][f]) / max(abs(cs[k][f]), 1e-30)
                 for k in compared
                 for f in ("min", "max", "absmax")
                 if cs[k][f] != 0 and not math.isnan(cs[k][f])] or [0.0])
    if overflow:
        sv = cs[("revin", "fwd_saved")]
        assert sv["posinf_count"] == B and ps[("revin", "fwd_saved")]["posinf_count"] == B
    print("%d (layer, site) pairs, extremes of %d compared; worst relative "
          "difference %.3g" % (len(common), len(compared), worst))
