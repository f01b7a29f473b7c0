"""Which NaN the post-mortem blames on FP16: a NaN that the records show
FP16 could not have made (inputs finite and within the range, no zero that
flushed, an attention whose scores are bounded below 65504) is
not-precision, as the FP32 run and bisect say; a NaN that FP16 can make (a
score or sum of squares that overflows) keeps force-fp32.

FP16 is emulated (emulate_fp16=True: every traced module's inputs, outputs
and gradients, and the intermediates it marks, rounded to binary16) with
ampprobe's LossScaler, as in test_torch.py. The shapes are the hunt's
(/tmp/hunt_diag2 findings 2, 4, 6: a where over a NaN branch, a fully
masked attention row, LayerNorm(eps=0) on padding) in other models.
"""
import math

import pytest

torch = pytest.importorskip("torch")
import torch.nn as nn  # noqa: E402

import ampprobe  # noqa: E402
import ampprobe.torch as at  # noqa: E402


class LogWhere(nn.Module):
    """where(h > 0, h log h, 0), an entropy term: the forward is finite,
    the backward 0 * (log h + 1) = NaN wherever h <= 0 (the log of a zero
    or of a negative value in the branch not taken), in any precision."""
    def forward(self, h):
        return torch.where(h > 0, h * torch.log(h), torch.zeros_like(h))


class RMSNormNoEps(nn.Module):
    """A hand-written RMS norm without eps: a padding row of zeros is
    0 * rsqrt(0) = NaN in any precision."""
    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True))


class SumSquaresNorm(nn.Module):
    """A hand-written norm that materialises E[x^2] and mean^2 in its
    precision: in FP16 both overflow for |x| >= 256 and inf - inf is NaN."""
    def forward(self, x):
        m = at.materialized(self, x.mean(-1, keepdim=True))
        ms = at.materialized(self, x.pow(2).mean(-1, keepdim=True))
        var = at.materialized(self, ms - at.materialized(self, m * m))
        return (x - m) / torch.sqrt(var + 1e-5)


class MaskedAttn(nn.Module):
    """Single-head attention with a key padding mask; its scores are
    materialised in the module's precision (an FP16 kernel stores them)."""
    def __init__(self, d, scale_w=1.0):
        super().__init__()
        self.q, self.k, self.v = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)
        with torch.no_grad():
            for m in (self.q, self.k):
                m.weight.mul_(scale_w)
        self.d = d

    def forward(self, x, pad):
        s = self.q(x) @ self.k(x).transpose(1, 2) / math.sqrt(self.d)
        s = at.materialized(self, s).masked_fill(pad[:, None, :], float("-inf"))
        return torch.softmax(s, -1) @ self.v(x)


class Net(nn.Module):
    def __init__(self, block, d=16, attn=False):
        super().__init__()
        self.inp = nn.Linear(d, d)
        self.block = block
        self.head = nn.Linear(d, 3)
        self.attn = attn

    def forward(self, x, pad=None):
        h = self.inp(x)
        h = self.block(h, pad) if self.attn else self.block(h)
        return self.head(h.mean(1))


def run(tmp_path, block, make, kinds=None, attn=False, steps=4, fp32=()):
    torch.manual_seed(0)
    model = Net(block, attn=attn)
    path = str(tmp_path / "t.h5")
    crit = nn.CrossEntropyLoss()
    tr = at.Tracer(model, path, emulate_fp16=True, kinds=kinds or {},
                   loss_fn=crit, fp32=fp32)
    scaler = at.LossScaler()
    tr.attach_scaler(scaler)
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    for step in range(steps):
        x, pad, y = make(step)
        opt.zero_grad()
        with tr.autocast():
            out = model(x, pad) if attn else model(x)
            loss = crit(out, y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        tr.end_step(loss=loss, optimizer=opt)
    tr.close()
    return ampprobe.postmortem(path)


def batch(step, scale=1.0, zero_rows=False, pad_all=False):
    g = torch.Generator().manual_seed(step)
    x = torch.randn(4, 6, 16, generator=g) * scale
    pad = torch.zeros(4, 6, dtype=torch.bool)
    pad[:, 5] = True
    if zero_rows and step >= 2:
        x[:, 5] = 0.0
    if pad_all and step >= 2:
        pad[1] = True  # one sequence is all padding: its rows are NaN
    return x, pad, torch.randint(0, 3, (4,), generator=g)


def findings(pm):
    return [(f["id"], f["title"], f.get("next_step", "")) for f in pm["diagnosis"]]


def not_precision(pm):
    fs = findings(pm)
    assert fs, pm
    assert fs[0][0] == "not-precision", fs
    assert "not a precision problem" in fs[0][1], fs
    assert all(f[0] != "force-fp32" for f in fs), fs
    assert "bisect" not in fs[0][2], fs
    assert not any("produced in FP16 upstream" in f[1] for f in fs), fs


def force_fp32(pm, layer):
    fs = findings(pm)
    assert fs and fs[0][0] == "force-fp32", fs
    assert pm["event"]["origin_layer"] == layer, pm["event"]


def test_log_of_a_zero_in_a_where_backward(tmp_path):
    pm = run(tmp_path, LogWhere(), lambda s: batch(s), kinds={LogWhere: "other"})
    assert pm["event"]["origin_layer"] == "block", pm["event"]
    assert pm["event"]["phase"] == "backward", pm["event"]
    not_precision(pm)


def test_where_backward_in_fp32_says_so(tmp_path):
    """The advice followed (the module in FP32, the rest in FP16): the NaN
    stays, and the post-mortem must not say 'produced in FP16 upstream'."""
    pm = run(tmp_path, LogWhere(), lambda s: batch(s), kinds={LogWhere: "other"},
             fp32=("block",))
    not_precision(pm)


def _identity_inp(monkeypatch):
    orig = Net.__init__

    def init(self, *a, **k):
        orig(self, *a, **k)
        self.inp = nn.Linear(16, 16, bias=False)
        with torch.no_grad():
            self.inp.weight.copy_(torch.eye(16))
    monkeypatch.setattr(Net, "__init__", init)


@pytest.mark.parametrize("kind", ["layernorm", "other"])
def test_hand_written_norm_of_a_zero_row(tmp_path, monkeypatch, kind):
    _identity_inp(monkeypatch)
    pm = run(tmp_path, RMSNormNoEps(), lambda s: batch(s, zero_rows=True),
             kinds={RMSNormNoEps: kind})
    assert pm["event"]["origin_layer"] == "block", pm["event"]
    assert pm["event"]["step"] == 2, pm["event"]
    not_precision(pm)


def test_layernorm_eps0_on_padding_rows(tmp_path, monkeypatch):
    _identity_inp(monkeypatch)
    pm = run(tmp_path, nn.LayerNorm(16, eps=0.0), lambda s: batch(s, zero_rows=True))
    assert pm["event"]["origin_layer"] == "block", pm["event"]
    not_precision(pm)


def test_fully_masked_attention_row(tmp_path):
    pm = run(tmp_path, MaskedAttn(16), lambda s: batch(s, pad_all=True),
             kinds={MaskedAttn: "attention"}, attn=True)
    assert pm["event"]["origin_layer"] == "block", pm["event"]
    assert pm["event"]["step"] == 2, pm["event"]
    not_precision(pm)


# ---- counter-cases: FP16 made the NaN ------------------------------------


def test_attention_scores_that_overflow_fp16(tmp_path):
    """Big inputs and weights: the scores pass 65504, a row holding +inf
    is NaN after the softmax; no padding row is all masked."""
    pm = run(tmp_path, MaskedAttn(16, scale_w=30.0), lambda s: batch(s, scale=40.0),
             kinds={MaskedAttn: "attention"}, attn=True)
    force_fp32(pm, "block")


def test_norm_whose_sum_of_squares_overflows_fp16(tmp_path, monkeypatch):
    """Rows of magnitude ~400: E[x^2] and mean^2 are inf in FP16, their
    difference NaN; in FP32 the norm is fine."""
    _identity_inp(monkeypatch)

    def make(s):
        x, pad, y = batch(s, scale=1.0)
        return x + 400.0, pad, y
    pm = run(tmp_path, SumSquaresNorm(), make, kinds={SumSquaresNorm: "layernorm"})
    force_fp32(pm, "block")


# ---- a custom module's NaN with nothing recorded either way ------------------


class SqrtShift(nn.Module):
    """sqrt(h + shift): finite while h + shift >= 0; a shift set below the
    values makes NaN (no inf) from finite, in-range inputs, in any
    precision. A custom module: the tracer cannot tell its op (kind other)."""
    def __init__(self):
        super().__init__()
        self.shift = 10.0

    def forward(self, h):
        return torch.sqrt(h + self.shift)


def _sqrt_shift_run(tmp_path, block, scale=1.0, bad_from=2):
    def make(s):
        block.shift = -10.0 if s >= bad_from else 10.0
        return batch(s, scale=scale)
    return run(tmp_path, block, make, kinds={SqrtShift: "other"})


def test_custom_module_nan_is_weak_evidence(tmp_path):
    """No overflow, no flush in the records: force-fp32 stays (a rounding
    inside an unknown op could make the negative), but says its evidence
    is weak, ranks below 90 and asks for the FP32 check first (the hunt's
    'force-fp32 with full confidence'; failed before the fix)."""
    pm = _sqrt_shift_run(tmp_path, SqrtShift())
    force_fp32(pm, "block")
    f = pm["diagnosis"][0]
    assert "evidence is weak" in f["title"], f
    assert "in FP32 too" in f["next_step"], f
    assert any("no record shows an overflow or an underflow" in e
               for e in f["evidence"]), f


def test_custom_module_nan_after_overflow_is_not_weak(tmp_path, monkeypatch):
    """The same module fed values beyond 65504 (the identity input layer
    hands them over): the overflow is recorded, the finding is the plain
    force-fp32 as before."""
    _identity_inp(monkeypatch)
    pm = _sqrt_shift_run(tmp_path, SqrtShift(), scale=1e5)
    fs = findings(pm)
    assert fs and fs[0][0] == "force-fp32", fs
    assert "evidence is weak" not in fs[0][1], fs


def test_bf16_overflow_past_fp32_is_not_precision(tmp_path):
    """Real BF16 autocast: a Linear whose product (inputs 1e20, weights
    1e19) overflows FP32's range too. BF16 has FP32's range, so the answer
    is not-precision, as the FP32 run's and bisect's; it was "[force-fp32]
    BF16 overflow in '0' (linear): keep it in FP32" with a bisect (hunt
    /tmp/hunt_bf F2). The origin's headroom is BF16's, not 65504's."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 1))
    with torch.no_grad():
        model[0].weight.fill_(1e19)
    loss_fn = nn.MSELoss()
    path = str(tmp_path / "bf16ov.h5")
    tr = at.Tracer(model, path, precision="bf16", loss_fn=loss_fn,
                   config={"name": "bf16-overflow"}, overwrite=True)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    for _ in range(3):
        x = torch.full((16, 8), 1e20)
        with tr.autocast():
            loss = loss_fn(model(x), torch.zeros(16, 1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        tr.end_step(loss=loss, optimizer=opt)
    tr.close()
    pm = ampprobe.postmortem(path)
    not_precision(pm)
    assert "BF16 has FP32's range" in pm["diagnosis"][0]["title"], pm["diagnosis"]
    assert pm["event"]["kind"] == "overflow", pm["event"]
