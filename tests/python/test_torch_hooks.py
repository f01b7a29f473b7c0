"""The tracer's hooks in jobs that step outside the plain loop: a child of
fork() running the traced model (DataLoader fork workers, os.fork), a
network frozen when the Tracer is made and unfrozen inside each step
(CycleGAN), a Tracer of this process left open holding the trace's lock
(a notebook cell re-run), end_step() called twice per iteration, a
validation pass without no_grad after end_step(), a Tracer dropped
without close(). Each case has its negative controls: gradient
accumulation, activation checkpointing, a GAN's two networks, a gradient
penalty's double backward, fork workers that never touch the model - no
warning there (every control runs with warnings turned into errors)."""
import atexit
import collections
import gc
import os
import pickle
import sys
import warnings

import pytest

torch = pytest.importorskip("torch")
import torch.nn as nn  # noqa: E402
import torch.utils.checkpoint  # noqa: E402

import ampprobe  # noqa: E402
import ampprobe.torch as at  # noqa: E402
from ampprobe._lib import SITES  # noqa: E402

FORK = hasattr(os, "fork")


def _mlp(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def _counts(path, site):
    """{(layer name, step): records at site}."""
    t = ampprobe.read_trace(path)
    names = [n.decode() if isinstance(n, bytes) else n
             for n in t["layers"]["name"]]
    r = t["records"]
    r = r[r["site"] == SITES.index(site)]
    return collections.Counter((names[int(l)], int(s))
                               for l, s in zip(r["layer"], r["step"]))


def _steps(path):
    return [int(s) for s in ampprobe.read_trace(path)["steps"]["step"]]


def _train_step(m, crit, opt, x=None, y=None):
    x = torch.randn(4, 8) if x is None else x
    y = torch.randn(4, 4) if y is None else y
    loss = crit(m(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    return loss


@pytest.fixture
def strict():
    """Every warning an error: the negative controls."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        yield


def _ampprobe_warnings(rec):
    return [str(w.message) for w in rec if "ampprobe" in str(w.message)]


# ---- F4: parameters frozen at Tracer(), unfrozen inside each step ---------------


def _set_requires_grad(net, v):
    for q in net.parameters():
        q.requires_grad_(v)


def _cyclegan(tmp_path, made_frozen, steps=4, plant=None):
    """CycleGAN/pix2pix's loop: D frozen for G's update, unfrozen for its
    own, in every step; the Tracer made while D is frozen (made_frozen: a
    Tracer created after a first iteration, or at a resume)."""
    torch.manual_seed(0)
    G = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 8))
    D = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    gan = nn.ModuleDict({"G": G, "D": D})
    mse = nn.MSELoss()
    oG = torch.optim.Adam(G.parameters(), 1e-3)
    oD = torch.optim.Adam(D.parameters(), 1e-3)
    p = str(tmp_path / "t.h5")
    if made_frozen:
        _set_requires_grad(D, False)
    tr = at.Tracer(gan, p, loss_fn=mse)
    for s in range(steps):
        z, real = torch.randn(8, 4), torch.randn(8, 8)
        _set_requires_grad(D, False)
        fake = G(z)
        lg = mse(D(fake), torch.ones(8, 1))
        oG.zero_grad()
        lg.backward()
        oG.step()
        _set_requires_grad(D, True)
        ld = mse(D(real), torch.ones(8, 1)) + mse(D(fake.detach()),
                                                   torch.zeros(8, 1))
        if plant is not None and s == plant:  # sqrt(|w|) with a w at 0
            with torch.no_grad():
                D[0].weight[0, 0] = 0.0
            ld = ld + 1e-3 * torch.sqrt(D[0].weight.abs()).sum()
        oD.zero_grad()
        ld.backward()
        oD.step()
        tr.end_step(loss=lg, optimizer=oG)
    tr.close()
    return p


@pytest.mark.parametrize("made_frozen", [False, True])
def test_a_network_unfrozen_inside_each_step_has_its_gradients(
        tmp_path, made_frozen):
    """D's weight_grad records: 2 a step (weight, bias) whether the
    Tracer was made while D was frozen or not; they were 0 when it was
    (its parameters re-checked at each step's start only, where D is
    always frozen)."""
    p = _cyclegan(tmp_path, made_frozen)
    c = _counts(p, "weight_grad")
    assert [c[("D.0", s)] for s in range(4)] == [2, 2, 2, 2]
    assert [c[("D.2", s)] for s in range(4)] == [2, 2, 2, 2]
    assert [c[("G.0", s)] for s in range(4)] == [2, 2, 2, 2]


def test_an_inf_gradient_of_a_network_unfrozen_in_the_step_is_named(
        tmp_path):
    """The planted inf gradient in D.0 at step 2 is the origin (its
    weight_grad, backward), not blamed on the optimizer step
    (check-weights) as it was with the gradient unrecorded."""
    p = _cyclegan(tmp_path, True, plant=2)
    ev = ampprobe.postmortem(p)["event"]
    assert (ev["origin_layer"], ev["origin_site"], ev["step"]) == (
        "D.0", "weight_grad", 2)


def test_a_parameter_frozen_for_good_gets_no_records(tmp_path, strict):
    """The control: a frozen backbone (fine-tuning a head) stays without
    weight_grad records, the head has its own, and nothing warns."""
    m = _mlp()
    _set_requires_grad(m[0], False)
    crit = nn.MSELoss()
    opt = torch.optim.SGD([q for q in m.parameters() if q.requires_grad],
                          lr=0.01)
    p = str(tmp_path / "t.h5")
    with at.Tracer(m, p, loss_fn=crit) as tr:
        for s in range(3):
            loss = _train_step(m, crit, opt)
            tr.end_step(loss=loss, optimizer=opt)
    c = _counts(p, "weight_grad")
    assert [c[("0", s)] for s in range(3)] == [0, 0, 0]
    assert [c[("2", s)] for s in range(3)] == [2, 2, 2]


def test_a_parameter_frozen_again_then_unfrozen(tmp_path):
    """Frozen at Tracer(), trainable in steps 1 and 3, frozen again in
    step 2 (set before each step's forward): records exactly where it
    trained, 2 a step (the hook registered once, kept through the
    refreeze)."""
    m = _mlp()
    _set_requires_grad(m[0], False)
    crit = nn.MSELoss()
    opt = torch.optim.SGD(m.parameters(), lr=0.01)
    p = str(tmp_path / "t.h5")
    with at.Tracer(m, p, loss_fn=crit) as tr:
        for s, on in enumerate((False, True, False, True)):
            _set_requires_grad(m[0], on)
            loss = _train_step(m, crit, opt)
            tr.end_step(loss=loss, optimizer=opt)
    c = _counts(p, "weight_grad")
    assert [c[("0", s)] for s in range(4)] == [0, 2, 0, 2]
