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
import collections
import gc
import os
import pickle
import sys
import warnings
import weakref

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


# ---- F2: a child of fork() running the traced model ----------------------------


class _Features(torch.utils.data.Dataset):
    """A dataset that runs a traced submodule under no_grad (features on
    the fly), in the DataLoader's worker."""

    def __init__(self, module, n=8):
        self.module, self.n = module, n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        with torch.no_grad():
            return self.module(torch.randn(8))


class _Plain(torch.utils.data.Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        return torch.randn(8)


@pytest.mark.skipif(not FORK, reason="no fork here")
@pytest.mark.parametrize("emulate", [False, True])
def test_fork_workers_running_a_traced_module_inside_a_step(tmp_path,
                                                             emulate):
    """A DataLoader with fork workers whose dataset runs a traced
    submodule, iterated with a step open (between backward and end_step):
    the worker died of ProbeError "session opened by process X, used in
    process Y", and the job with it. Now the workers record nothing and
    the parent's trace has every step, its own records only."""
    m = _mlp()
    crit = nn.MSELoss()
    opt = torch.optim.SGD(m.parameters(), lr=0.01)
    p = str(tmp_path / "t.h5")
    tr = at.Tracer(m, p, loss_fn=crit, emulate_fp16=emulate)
    feats = []
    for s in range(3):
        loss = _train_step(m, crit, opt)
        dl = torch.utils.data.DataLoader(
            _Features(m[0]), batch_size=4, num_workers=2,
            multiprocessing_context="fork")
        feats += [b.shape for b in dl]
        tr.end_step(loss=loss, optimizer=opt)
    tr.close()
    assert feats == [torch.Size([4, 16])] * 6
    assert _steps(p) == [0, 1, 2]
    c = _counts(p, "fwd_in")
    assert [c[("0", s)] for s in range(3)] == [1, 1, 1]  # the parent's only
    assert ampprobe.verdict(p) == "healthy"


@pytest.mark.skipif(not FORK, reason="no fork here")
def test_fork_workers_that_do_not_touch_the_model_say_nothing(tmp_path,
                                                               strict):
    """The control: fork workers of a plain dataset, inside and between
    steps: no warning, every step recorded."""
    m = _mlp()
    crit = nn.MSELoss()
    opt = torch.optim.SGD(m.parameters(), lr=0.01)
    p = str(tmp_path / "t.h5")
    with at.Tracer(m, p, loss_fn=crit) as tr:
        for s in range(2):
            loss = _train_step(m, crit, opt)
            n = sum(1 for _ in torch.utils.data.DataLoader(
                _Plain(), batch_size=4, num_workers=2,
                multiprocessing_context="fork"))
            tr.end_step(loss=loss, optimizer=opt)
            n += sum(1 for _ in torch.utils.data.DataLoader(
                _Plain(), batch_size=4, num_workers=2,
                multiprocessing_context="fork"))
            assert n == 4
    assert _steps(p) == [0, 1]


def _in_child(fn):
    """Runs fn() in a child of os.fork(); returns (exit status, what fn
    returned). The child runs the at-exit finalizers (the Tracer's and
    its Session's) as a helper leaving by sys.exit would, then os._exit
    (a SystemExit would be caught by pytest, in the child)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover (the child)
        os.close(r)
        code = 0
        try:
            out = fn()
        except BaseException as e:  # noqa: BLE001
            out = ("raised", type(e).__name__, str(e))
            code = 3
        with os.fdopen(w, "wb") as f:
            pickle.dump(out, f)
        try:  # the finalizers sys.exit would run (not raised: pytest
            # would catch it); not every at-exit handler: multiprocessing's
            # would terminate the parent's DataLoader workers from here
            weakref.finalize._exitfunc()
        except BaseException:  # noqa: BLE001
            code = 4
        os._exit(code)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        data = f.read()
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) if hasattr(
        os, "waitstatus_to_exitcode") else status >> 8, (
            pickle.loads(data) if data else None)


@pytest.mark.skipif(not FORK, reason="no fork here")
@pytest.mark.parametrize("open_step", [False, True])
def test_os_fork_child_runs_the_model_forward_and_backward(tmp_path,
                                                           open_step):
    """os.fork() between steps (or with a step open), the child runs the
    model under grad and no_grad, forward and backward, and exits: it
    died of ProbeError at its first forward under grad
    (probe_step_begin). The parent's trace is intact, every step there."""
    m = _mlp()
    crit = nn.MSELoss()
    opt = torch.optim.SGD(m.parameters(), lr=0.01)
    p = str(tmp_path / "t.h5")
    tr = at.Tracer(m, p, loss_fn=crit)

    def child():
        with torch.no_grad():
            m(torch.randn(2, 8))
        out = crit(m(torch.randn(2, 8)), torch.zeros(2, 4))
        out.backward()
        return "ok"

    for s in range(4):
        loss = _train_step(m, crit, opt)
        if s == 1 and open_step:
            assert _in_child(child) == (0, "ok")
        tr.end_step(loss=loss, optimizer=opt)
        if s == 1 and not open_step:
            assert _in_child(child) == (0, "ok")
    tr.close()
    assert _steps(p) == [0, 1, 2, 3]
    c = _counts(p, "fwd_in")
    assert [c[("0", s)] for s in range(4)] == [1, 1, 1, 1]
    assert ampprobe.verdict(p) == "healthy"


@pytest.mark.skipif(not FORK, reason="no fork here")
@pytest.mark.parametrize("open_step", [False, True])
def test_a_fork_the_handler_did_not_see(tmp_path, open_step):
    """A fork made in C (no os.register_at_fork handler run): the tracer
    learns it from libprobe's first refusal (ERR_STATE in another
    process) and goes the child's way there, instead of raising."""
    m = _mlp()
    crit = nn.MSELoss()
    opt = torch.optim.SGD(m.parameters(), lr=0.01)
    p = str(tmp_path / "t.h5")
    tr = at.Tracer(m, p, loss_fn=crit)
    loss = _train_step(m, crit, opt)
    if not open_step:
        tr.end_step(loss=loss, optimizer=opt)

    def child():
        tr._forked = False  # as if the handler had not run
        tr._recording = tr._step is not None
        out = crit(m(torch.randn(2, 8)), torch.zeros(2, 4))
        out.backward()
        return tr._forked

    assert _in_child(child) == (0, True)
    if open_step:
        tr.end_step(loss=loss, optimizer=opt)
    tr.close()
    assert _steps(p) == [0]
    assert ampprobe.verdict(p) == "healthy"


@pytest.mark.skipif(not FORK, reason="no fork here")
def test_a_forked_child_computes_what_the_parent_does_under_emulation(
        tmp_path):
    """Under FP16 emulation the child's hooks keep rounding (inputs,
    outputs and gradients): its output and weight gradients are the
    parent's, bit for bit, for the same input."""
    m = _mlp()
    crit = nn.MSELoss()
    p = str(tmp_path / "t.h5")
    tr = at.Tracer(m, p, loss_fn=crit, emulate_fp16=True)
    torch.manual_seed(1)
    x = torch.randn(4, 8) * 3
    y = torch.randn(4, 4)

    def run():
        m.zero_grad()
        out = m(x)
        crit(out, y).backward()
        return [out.detach().clone()] + [q.grad.clone()
                                         for q in m.parameters()]

    def child():
        return [t.numpy().tobytes() for t in run()]

    code, theirs = _in_child(child)
    assert code == 0, theirs
    mine = run()
    ours = [t.numpy().tobytes() for t in mine]
    tr.end_step()
    tr.close()
    assert theirs == ours
    # and the emulation did round (the control): the output is binary16
    assert torch.equal(mine[0], mine[0].half().float())
    assert not torch.equal(m(x), mine[0])  # untraced: not rounded


@pytest.mark.skipif(not FORK, reason="no fork here")
def test_explicit_calls_in_a_forked_child_say_why(tmp_path):
    """begin_step() and end_step() in the child are refused with
    ProbeError ERR_STATE naming both processes and what to do; close()
    in the child (a `with` block or finally it leaves) gives the child's
    model back and leaves the parent's trace alone."""
    m = _mlp()
    crit = nn.MSELoss()
    opt = torch.optim.SGD(m.parameters(), lr=0.01)
    p = str(tmp_path / "t.h5")
    tr = at.Tracer(m, p, loss_fn=crit, fp32=["2"])
    loss = _train_step(m, crit, opt)
    tr.end_step(loss=loss, optimizer=opt)

    def child():
        out = []
        for call in (lambda: tr.end_step(loss=1.0), lambda: tr.begin_step()):
            try:
                call()
                out.append(None)
            except ampprobe.ProbeError as e:
                out.append((e.name, str(e)))
        tr.close()
        out.append(("closed", "forward" in m[2].__dict__,
                    len(m[0]._forward_hooks)))
        _train_step(m, crit, opt)  # the model untraced, fine
        return out

    code, res = _in_child(child)
    assert code == 0, res
    for name, msg in res[:2]:
        assert name == "ERR_STATE"
        assert "child of fork()" in msg and str(os.getpid()) in msg
        assert "Tracer of its own" in msg
    assert res[2] == ("closed", False, 0)
    # the parent's tracer goes on, its model still traced
    assert "forward" in m[2].__dict__ and len(m[0]._forward_hooks) == 1
    loss = _train_step(m, crit, opt)
    tr.end_step(loss=loss, optimizer=opt)
    tr.close()
    assert _steps(p) == [0, 1]
    assert ampprobe.verdict(p) == "healthy"


@pytest.mark.skipif(not FORK, reason="no fork here")
def test_a_with_block_left_in_a_forked_child(tmp_path):
    """A helper forked inside `with Tracer(...)` that leaves by sys.exit
    closes the tracer in the child (SystemExit passes through __exit__):
    that raised ProbeError there. The parent's trace is unmarked and
    complete."""
    m = _mlp()
    crit = nn.MSELoss()
    opt = torch.optim.SGD(m.parameters(), lr=0.01)
    p = str(tmp_path / "t.h5")
    with at.Tracer(m, p, loss_fn=crit) as tr:
        loss = _train_step(m, crit, opt)
        pid = os.fork()
        if pid == 0:  # pragma: no cover (the child)
            try:
                with tr:
                    m(torch.randn(2, 8)).sum().backward()
                    sys.exit(0)
            except SystemExit:
                os._exit(0)
            except BaseException:  # noqa: BLE001
                os._exit(5)
        _, status = os.waitpid(pid, 0)
        assert status == 0
        tr.end_step(loss=loss, optimizer=opt)
    pm = ampprobe.postmortem(p)
    assert pm["trace"]["complete"] and not pm["trace"].get("aborted")
    assert _steps(p) == [0]


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


# ---- F11: the lock held by a Tracer of this process -----------------------------


def test_a_tracer_left_open_is_named_as_the_lock_holder(tmp_path):
    """A notebook cell re-run after an exception: the first Tracer, still
    referenced, holds the trace; the second was refused as "being
    written by another writer", no word that it was this process's own.
    Closing the first lets the second in."""
    m = _mlp()
    p = str(tmp_path / "t.h5")
    first = at.Tracer(m, p)
    m(torch.randn(2, 8)).sum().backward()
    with pytest.raises(ampprobe.ProbeError) as ei:
        at.Tracer(m, p, overwrite=True)
    msg = str(ei.value)
    assert ei.value.name == "ERR_LOCKED"
    assert "Tracer of this process that was not closed" in msg
    assert "close()" in msg and p in msg
    first.close()
    with at.Tracer(m, p, overwrite=True):
        pass


def test_a_session_left_open_is_named_as_the_lock_holder(tmp_path):
    p = str(tmp_path / "t.h5")
    s = ampprobe.Session(p)
    with pytest.raises(ampprobe.ProbeError) as ei:
        at.Tracer(_mlp(), p, overwrite=True)
    assert "Session of this process that was not closed" in str(ei.value)
    s.close()


def test_a_lock_held_by_another_process_is_not_said_to_be_ours(tmp_path):
    """The control: a writer in another process keeps libprobe's words."""
    import subprocess
    import textwrap
    p = str(tmp_path / "t.h5")
    code = textwrap.dedent("""
        import sys, ampprobe
        s = ampprobe.Session(sys.argv[1])
        print("open", flush=True)
        sys.stdin.read()
        s.close()
    """)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.path.dirname(os.path.dirname(ampprobe.__file__))
    child = subprocess.Popen([sys.executable, "-c", code, p], env=env,
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert child.stdout.readline().strip() == b"open"
        with pytest.raises(ampprobe.ProbeError) as ei:
            at.Tracer(_mlp(), p, overwrite=True)
        assert ei.value.name == "ERR_LOCKED"
        assert "of this process" not in str(ei.value)
    finally:
        child.communicate(b"", timeout=60)


# ---- F12: end_step() twice per iteration ---------------------------------------


def test_end_step_twice_per_iteration_warns_once(tmp_path):
    m = _mlp()
    crit = nn.MSELoss()
    opt = torch.optim.SGD(m.parameters(), lr=0.01)
    p = str(tmp_path / "t.h5")
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        with at.Tracer(m, p, loss_fn=crit) as tr:
            for s in range(4):
                loss = _train_step(m, crit, opt)
                tr.end_step(loss=loss, optimizer=opt)
                tr.end_step(loss=loss.item())  # a logging callback's
    w = _ampprobe_warnings(rec)
    assert len(w) == 1, w
    assert "step 1 ended with nothing traced" in w[0]
    assert "once per iteration" in w[0]
    assert _steps(p) == list(range(8))  # the steps are as they were


def test_an_evaluation_loop_under_no_grad_with_end_step_warns(tmp_path):
    """end_step() after forwards under no_grad alone: no step open, nothing
    recorded (only begin_step() opens one there): said once."""
    m = _mlp()
    p = str(tmp_path / "t.h5")
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        with at.Tracer(m, p) as tr:
            for s in range(3):
                with torch.no_grad():
                    m(torch.randn(2, 8))
                tr.end_step()
    w = _ampprobe_warnings(rec)
    assert len(w) == 1 and "step 0 ended with nothing traced" in w[0], w


def test_accumulation_checkpointing_penalty_and_explicit_steps_say_nothing(
        tmp_path, strict):
    """The controls for F12/F8 (and the merged-step check): gradient
    accumulation (4 micro-batches a step), a checkpointed segment
    (reentrant and not), a gradient penalty's double backward, an
    inference-only job with begin_step()/end_step(), a validation under
    no_grad after end_step(): not one warning."""
    m = _mlp()
    crit = nn.MSELoss()
    opt = torch.optim.SGD(m.parameters(), lr=0.01)
    p = str(tmp_path / "t.h5")
    with at.Tracer(m, p, loss_fn=crit) as tr:
        for s in range(3):
            opt.zero_grad()
            for k in range(4):
                crit(m(torch.randn(2, 8)), torch.randn(2, 4)).backward()
            opt.step()
            tr.end_step(optimizer=opt)
            with torch.no_grad():
                m.eval()
                m(torch.randn(2, 8))
                m.train()
        for reentrant in (True, False):
            x = torch.randn(4, 8, requires_grad=True)
            kw = {} if torch.__version__.startswith("1.") else {
                "use_reentrant": reentrant}
            h = torch.utils.checkpoint.checkpoint(m, x, **kw)
            loss = crit(h, torch.randn(4, 4))
            opt.zero_grad()
            loss.backward()
            opt.step()
            tr.end_step(loss=loss, optimizer=opt)
        x = torch.randn(4, 8, requires_grad=True)
        out = m(x)
        g, = torch.autograd.grad(out.sum(), x, create_graph=True)
        loss = crit(out, torch.randn(4, 4)) + (g.norm() - 1) ** 2
        opt.zero_grad()
        loss.backward()
        opt.step()
        tr.end_step(loss=loss, optimizer=opt)
        for s in range(2):
            tr.begin_step()
            with torch.no_grad():
                m(torch.randn(2, 8))
            tr.end_step()
    assert len(_steps(p)) == 3 + 2 + 1 + 2


def test_a_gan_with_two_networks_says_nothing(tmp_path, strict):
    """The control: G and D traced as one model, each run several times a
    step (D's update on G's output under grad and detached, G's on D),
    with a WGAN critic loop of 3 D updates a step."""
    torch.manual_seed(0)
    G = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 8))
    D = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))

    class GAN(nn.Module):
        def __init__(self):
            super().__init__()
            self.G, self.D = G, D

        def forward(self, z):
            return self.D(self.G(z))

    gan = GAN()
    oG = torch.optim.Adam(G.parameters(), 1e-3)
    oD = torch.optim.Adam(D.parameters(), 1e-3)
    p = str(tmp_path / "t.h5")
    with at.Tracer(gan, p) as tr:
        for s in range(3):
            for k in range(3):
                fake = G(torch.randn(8, 4)).detach()
                ld = D(fake).mean() - D(torch.randn(8, 8)).mean()
                oD.zero_grad()
                ld.backward()
                oD.step()
            lg = -gan(torch.randn(8, 4)).mean()
            oG.zero_grad()
            lg.backward()
            oG.step()
            lg = -gan(torch.randn(8, 4)).mean()  # a second G update
            oG.zero_grad()
            lg.backward()
            oG.step()
            tr.end_step(loss=lg, optimizer=oG)
    assert _steps(p) == [0, 1, 2]


# ---- F8: a validation under grad after end_step() -------------------------------


def _validation_job(tmp_path, where, steps=6):
    m = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(),
                      nn.Linear(16, 4))
    crit = nn.MSELoss()
    opt = torch.optim.SGD(m.parameters(), lr=0.01)
    p = str(tmp_path / "t.h5")
    xv, yv = torch.randn(8, 8), torch.randn(8, 4)

    def validate():
        m.eval()
        if where == "grad":  # the no_grad forgotten
            crit(m(xv), yv).item()
        else:
            with torch.no_grad():
                crit(m(xv), yv).item()
        m.train()

    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        tr = at.Tracer(m, p, loss_fn=crit)
        for s in range(steps):
            loss = _train_step(m, crit, opt, torch.randn(8, 8),
                               torch.randn(8, 4))
            tr.end_step(loss=loss, optimizer=opt)
            if s % 3 == 2:
                validate()
        tr.close()
    return p, _ampprobe_warnings(rec)


def test_a_validation_under_grad_after_end_step_warns(tmp_path):
    """Validation without no_grad after end_step(): its forward opens the
    next step, which the next iteration's training joins (said once, at
    that training forward), and the last one is a step of its own that
    close() ends (said once, there)."""
    p, w = _validation_job(tmp_path, "grad")
    assert len(w) == 2, w
    assert "step 3 began with a forward of the model in eval mode" in w[0]
    assert "step 6, ended by close()" in w[1]
    assert "torch.no_grad()" in w[0] and "torch.no_grad()" in w[1]
    assert _steps(p) == list(range(7))  # the records stay as they were


def test_a_validation_under_no_grad_after_end_step_says_nothing(tmp_path):
    p, w = _validation_job(tmp_path, "no_grad")
    assert w == []
    assert _steps(p) == list(range(6))


def test_training_in_eval_mode_and_adversarial_steps_say_nothing(tmp_path,
                                                                 strict):
    """The controls: a job that trains in eval mode (frozen BatchNorm)
    throughout, and adversarial training (the attack's forward and
    backward in eval mode, then the training forward in train mode, in
    one step)."""
    m = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(),
                      nn.Linear(16, 4))
    crit = nn.MSELoss()
    opt = torch.optim.SGD(m.parameters(), lr=0.01)
    p = str(tmp_path / "t.h5")
    with at.Tracer(m, p, loss_fn=crit) as tr:
        m.eval()
        for s in range(2):
            loss = _train_step(m, crit, opt, torch.randn(8, 8),
                               torch.randn(8, 4))
            tr.end_step(loss=loss, optimizer=opt)
        for s in range(2):
            x, y = torch.randn(8, 8), torch.randn(8, 4)
            m.eval()
            xa = x.clone().requires_grad_(True)
            for k in range(2):  # PGD
                g, = torch.autograd.grad(crit(m(xa), y), xa)
                xa = (xa + 0.01 * g.sign()).detach().requires_grad_(True)
            m.train()
            loss = _train_step(m, crit, opt, xa.detach(), y)
            tr.end_step(loss=loss, optimizer=opt)
    assert _steps(p) == [0, 1, 2, 3]


def test_a_job_that_raises_mid_step_is_not_told_about_validation(tmp_path):
    """close() by an exception (a `with` block) ends a step with a forward
    and no backward: that is the abort, not a forgotten no_grad."""
    m = _mlp()
    p = str(tmp_path / "t.h5")
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        with pytest.raises(KeyError):
            with at.Tracer(m, p):
                m(torch.randn(2, 8))
                raise KeyError("bug")
    assert _ampprobe_warnings(rec) == []


# ---- F9: a Tracer dropped without close() --------------------------------------


def test_a_tracer_dropped_without_close_gives_the_model_back(tmp_path):
    """Its FP32 wrappers stayed on the model (a module forced to FP32 ran
    so for good, also under the next Tracer) and its hooks too; the
    finalizer now removes both, as close() does."""
    m = _mlp()
    m[2].forward = types_forward = m[2].forward  # noqa: F841 (a job's own)
    crit = nn.MSELoss()
    p = str(tmp_path / "a.h5")
    a = at.Tracer(m, p, fp32=["0", "2"], loss_fn=crit)
    assert m[0]._ampprobe_fp32 and "forward" in m[0].__dict__
    m(torch.randn(2, 8)).sum().backward()
    del a
    gc.collect()
    assert not hasattr(m[0], "_ampprobe_fp32")
    assert "forward" not in m[0].__dict__
    assert m[2].__dict__.get("forward") is types_forward  # the job's, back
    assert not hasattr(m[0], "_ampprobe_ref")
    for mod in m.modules():
        assert not mod._forward_hooks and not mod._forward_pre_hooks
    assert ampprobe.read_trace(p)["info"]  # closed, readable
    b = at.Tracer(m, str(tmp_path / "b.h5"))  # B forces nothing
    assert not hasattr(m[0], "_ampprobe_fp32")
    b.close()
    del m[2].forward
    pickle.dumps(m)  # torch.save works (no bound wrapper)


def test_a_second_tracer_keeps_its_wrappers_when_the_first_is_dropped(
        tmp_path):
    """The control: the finalizer of a dropped tracer leaves alone what a
    tracer still open put on the model."""
    m = _mlp()
    a = at.Tracer(m, str(tmp_path / "a.h5"))
    b = at.Tracer(m, str(tmp_path / "b.h5"), fp32=["2"])
    del a
    gc.collect()
    assert m[2]._ampprobe_fp32 and m[2]._ampprobe_ref[0]() is b
    assert m[0]._forward_hooks  # b's
    b.close()
    assert not hasattr(m[2], "_ampprobe_fp32")


@pytest.mark.parametrize("how", ["close", "drop"])
def test_a_wrapper_two_tracers_need_stays_until_the_second_closes(
        tmp_path, how):
    """Two tracers force the same module to FP32 (it is wrapped once, by
    the first): the first's close(), or its collection, hands the wrapper
    to the second instead of undoing it (the module ran in half
    precision under the second from then on); the second's close()
    undoes it."""
    m = _mlp()
    a = at.Tracer(m, str(tmp_path / "a.h5"), fp32=["2"])
    b = at.Tracer(m, str(tmp_path / "b.h5"), fp32=["2"])
    if how == "close":
        a.close()
    else:
        del a
        gc.collect()
    assert m[2]._ampprobe_fp32 and "forward" in m[2].__dict__
    assert b.fp32_modules() == ["2"]
    b.close()
    assert not hasattr(m[2], "_ampprobe_fp32")
    assert "forward" not in m[2].__dict__


def test_a_tracer_left_open_at_interpreter_exit(tmp_path):
    """The at-exit finalizer of a tracer never closed, which forces a
    module to FP32, gives the model back and closes the trace; the
    process exits at once (the wrapper hand-over must not take the
    tracer, alive at exit, for a second one)."""
    from conftest import run_py
    p = str(tmp_path / "t.h5")
    code = ("import sys, torch, torch.nn as nn, ampprobe.torch as at\n"
            "m = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))\n"
            "tr = at.Tracer(m, sys.argv[1], fp32=['1'])\n"
            "m(torch.randn(2, 4)).sum().backward()\n"
            "tr.end_step()\n")
    r = run_py(["-c", code, p], timeout=120)
    assert r.returncode == 0, r.stderr
    assert _steps(p) == [0]
    assert ampprobe.postmortem(p)["trace"]["complete"]
