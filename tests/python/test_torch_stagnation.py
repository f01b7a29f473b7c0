"""Weights that stop changing (hunt 2026-12-05, F1): a pure-BF16 job
(model.to(torch.bfloat16): the weights stored in BF16, no FP32 masters)
whose SGD updates lr * |grad| fall below half of BF16's spacing at the
weights (|w| ~ 1..2: spacing 2^-7) trains no more, and the post-mortem
called it healthy. Real torch jobs traced with the Tracer, then diagnosed:
the fault names weights-stagnant (docs/precision.md, "Weights that stop
changing"); the controls - FP32 master weights under BF16 autocast, the
same BF16 job with a learning rate whose updates pass the spacing and a
frozen first layer - stay healthy. The fault case failed before the rule
(healthy, exit 0)."""
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


def job(path, pure, lr, steps=150, freeze_first=False):
    """y = x @ W with a 16-32-1 MLP whose weights are pushed away from 0 by
    1 (|w| ~ 1..2); pure: model.to(bfloat16) (BF16 storage), else FP32
    parameters and the forward under CPU autocast to BF16 (FP32 masters).
    Returns (postmortem document, elements that changed, elements)."""
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1)
    W = torch.randn(16, 1, generator=gen)
    m = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
    with torch.no_grad():
        for p in m.parameters():
            p.add_(torch.sign(p))
    if freeze_first:
        for p in m[0].parameters():
            p.requires_grad_(False)
    if pure:
        m = m.to(torch.bfloat16)
    opt = torch.optim.SGD([p for p in m.parameters() if p.requires_grad], lr=lr)
    tr = at.Tracer(m, path, precision="bf16", env=False, overwrite=True)
    w0 = [p.detach().clone() for p in m.parameters()]
    for _ in range(steps):
        x = torch.randn(32, 16, generator=gen)
        y = x @ W
        if pure:
            out = m(x.to(torch.bfloat16))
        else:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                out = m(x)
        loss = ((out.float() - y) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        tr.end_step(loss=loss, optimizer=opt)
    tr.close()
    changed = sum(int((p.detach() != q).sum()) for p, q in zip(m.parameters(), w0))
    total = sum(p.numel() for p in m.parameters())
    return ampprobe.postmortem(path), changed, total


def test_pure_bf16_stagnation_is_named(tmp_path):
    pm, changed, total = job(str(tmp_path / "t.h5"), pure=True, lr=3e-4)
    assert changed < total / 2  # the fault is there: most weights never moved
    assert pm["verdict"] == "degraded", ids(pm)
    assert ids(pm)[0] == "weights-stagnant", ids(pm)
    t = texts(pm["diagnosis"][0])
    assert "BF16" in t and "keep FP32 master weights" in t, t
    s = pm["weights_stagnant"]
    assert s["stagnant"] is True and s["stored_as"] == "bf16", s
    assert s["share"] >= 0.5 and s["update_ratio"] < 1, s
    assert s["layer"] in ("0", "2"), s


def test_fp32_masters_are_healthy(tmp_path):
    pm, changed, total = job(str(tmp_path / "t.h5"), pure=False, lr=3e-4)
    assert changed == total
    assert pm["verdict"] == "healthy", [(f["id"], f["title"]) for f in pm["diagnosis"]]
    assert pm["weights_stagnant"]["stagnant"] is False


@pytest.mark.parametrize("freeze_first", [False, True])
def test_updates_past_the_spacing_are_healthy(tmp_path, freeze_first):
    """The same BF16 storage with lr 3e-3: lr * |grad| passes half the
    spacing and the weights move; a frozen first layer (requires_grad
    False, no gradient) never moves and is not called stagnant."""
    pm, changed, total = job(str(tmp_path / "t.h5"), pure=True, lr=3e-3,
                             freeze_first=freeze_first)
    assert "weights-stagnant" not in ids(pm), [
        (f["id"], f["title"]) for f in pm["diagnosis"]]
    assert pm["verdict"] == "healthy", [(f["id"], f["title"]) for f in pm["diagnosis"]]
