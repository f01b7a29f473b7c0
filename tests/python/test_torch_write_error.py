"""Tracer(on_write_error=): a trace that cannot be written (a full disk, a
file-size limit) never kills the job it watches from inside a module hook.
"warn" (the default) stops tracing with one warning and lets the job
train on; "raise" raises the write error from end_step() and close() only.
The trace keeps what was written and reads as not closed.

The disk is made "full" in-process: a file-size limit (RLIMIT_FSIZE) at
the trace's current size, SIGXFSZ ignored so that the write fails with
EFBIG (ERR_NOSPACE) as on a full file system (tests/faults/faults.sh does
the same with `ulimit -f`), put back after each case. Where the tracer
first meets the error is chosen by failing the writer just before that
point (probe_session_flush, whose failure is sticky: libprobe's writer
failing in the background between two calls): in a forward hook, in a
backward hook, in end_step (its own flush, flush_steps=1) or in close()
(the final flush)."""
import contextlib
import json
import os
import resource
import signal
import subprocess
import warnings

import pytest

torch = pytest.importorskip("torch")
import torch.nn as nn  # noqa: E402

import ampprobe  # noqa: E402
import ampprobe.torch as at  # noqa: E402

HEALTHY = 2  # steps written before the disk fills
AFTER = 4    # steps the job trains after it


@contextlib.contextmanager
def full_disk(path):
    """No byte more fits in the trace's file system (for this process)."""
    sig = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    old = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (os.path.getsize(path), old[1]))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, old)
        signal.signal(signal.SIGXFSZ, sig)


def fail_writer(tr):
    """libprobe's writer fails now, unseen by the tracer (its next call
    to libprobe returns the sticky error)."""
    assert tr._lib.probe_session_flush(tr.session.handle) == -4  # NOSPACE


def _model(emulate=False):
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))


class Job:
    """A small training job around a Tracer: every ProbeError that reaches
    it is noted (where, status name) and the job goes on, as one that
    catches them would; a job that does not catch them died there."""

    def __init__(self, tmp_path, mode, model=None, ddp=None, **kw):
        self.path = str(tmp_path / "t.h5")
        self.m = model if model is not None else _model()
        self.run = ddp if ddp is not None else self.m
        self.opt = torch.optim.SGD(self.m.parameters(), lr=0.01)
        if mode is not None:
            kw["on_write_error"] = mode
        kw.setdefault("precision", "fp16" if kw.get("emulate_fp16")
                      else "fp32")
        self.tr = at.Tracer(ddp if ddp is not None else self.m, self.path,
                            flush_seconds=1e9, **kw)
        self.path = self.tr.path  # (a rank's: t.rank0.h5)
        self.raised = []
        self.trained = 0
        self.out = None

    def _do(self, where, fn):
        try:
            return fn()
        except ampprobe.ProbeError as e:
            self.raised.append((where, e.name))
            return None

    def step(self, fail_at=None):
        x = torch.randn(4, 8)
        if fail_at == "forward":
            fail_writer(self.tr)
        out = self._do("forward", lambda: self.run(x))
        if out is None:  # the job died in model(x): it closes the tracer
            self._do("close", self.tr.close)  # and trains on, untraced
            out = self.run(x)
        self.out = out.detach()
        loss = out.square().mean()
        if fail_at == "backward":
            fail_writer(self.tr)
        self.opt.zero_grad()
        self._do("backward", loss.backward)
        self.opt.step()
        self.trained += 1
        self._do("end_step", lambda: self.tr.end_step(loss=loss,
                                                      optimizer=self.opt))

    def close(self):
        self._do("close", self.tr.close)


def _run(tmp_path, mode, where, **kw):
    """HEALTHY steps, then the disk is full and the job trains AFTER more
    steps, the writer failing where `where` says; returns (job, the
    warnings about the trace)."""
    j = Job(tmp_path, mode, flush_steps=1 if where == "end_step" else 0,
            **kw)
    for _ in range(HEALTHY):
        j.step()
    j.tr.session.flush()
    with warnings.catch_warnings(record=True) as w, full_disk(j.path):
        warnings.simplefilter("always")
        for i in range(AFTER):
            j.step(fail_at=where if i == 0 and where in (
                "forward", "backward") else None)
        w0 = len(w)
        j.close()
        j.warned_at_close = len(w) - w0
    said = [x for x in w if j.path in str(x.message)]
    return j, said


def _postmortem(path):
    cli = ampprobe.find_cli()
    if cli is None:
        return None
    p = subprocess.run([cli, "postmortem", "--json", path],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    return json.loads(p.stdout)


def _check_trace(path):
    """The trace keeps the healthy steps and reads as not closed."""
    d = _postmortem(path)
    if d is None:
        return
    assert d["trace"]["complete"] is False, d["trace"]
    assert d["trace"].get("steps", HEALTHY) >= HEALTHY, d["trace"]


WHERE = ("forward", "backward", "end_step", "close")


@pytest.mark.parametrize("where", WHERE)
@pytest.mark.parametrize("mode", [None, "warn"])
def test_warn_stops_tracing_and_the_job_trains_on(tmp_path, mode, where):
    """The default: no ProbeError reaches the job anywhere (model(x),
    backward, end_step, close), one warning names the trace and the
    reason, the job trains every step, the trace reads as not closed."""
    j, said = _run(tmp_path, mode, where)
    assert j.raised == [], j.raised
    assert j.trained == HEALTHY + AFTER
    assert len(said) == 1, [str(x.message) for x in said]
    msg = str(said[0].message)
    assert issubclass(said[0].category, RuntimeWarning)
    assert "no space left" in msg and "ERR_NOSPACE" in msg, msg
    assert "stopped" in msg, msg
    assert j.warned_at_close == (1 if where == "close" else 0)
    assert j.tr.write_error is not None
    assert j.tr.write_error.name == "ERR_NOSPACE"
    _check_trace(j.path)


@pytest.mark.parametrize("where", WHERE)
def test_raise_comes_from_end_step_or_close_never_a_hook(tmp_path, where):
    """on_write_error="raise": the write error is raised by end_step() of
    the step where it was met, again by each later end_step (it is
    sticky) and by close(); never by model(x) nor backward()."""
    j, said = _run(tmp_path, "raise", where)
    assert said == []
    assert j.trained == HEALTHY + AFTER
    places = [w for w, _ in j.raised]
    assert all(n == "ERR_NOSPACE" for _, n in j.raised), j.raised
    assert "forward" not in places and "backward" not in places, j.raised
    if where == "close":
        assert places == ["close"], j.raised
    else:
        assert places == ["end_step"] * AFTER + ["close"], j.raised
    assert j.tr.write_error is not None
    _check_trace(j.path)


def test_warn_once_however_long_the_job_runs(tmp_path):
    """Steps after the stop record nothing and warn nothing more; a second
    close() is quiet."""
    j, said = _run(tmp_path, "warn", "forward")
    assert len(said) == 1
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        j.close()
    assert [x for x in w if j.path in str(x.message)] == []
    assert j.raised == []


def test_emulation_goes_on_after_the_stop(tmp_path):
    """The stop ends the recording, not the job's numerics: a model run
    under FP16 emulation keeps being rounded to binary16 (its precision
    does not change in the middle of the run)."""
    j, said = _run(tmp_path, "warn", "forward", emulate_fp16=True)
    assert len(said) == 1 and j.raised == []
    assert torch.equal(j.out, j.out.half().float())


def test_on_write_error_is_checked(tmp_path):
    with pytest.raises(ValueError, match="on_write_error"):
        at.Tracer(_model(), str(tmp_path / "x.h5"), on_write_error="ignore")
    assert not os.path.exists(str(tmp_path / "x.h5"))


@pytest.mark.parametrize("mode", ["warn", "raise"])
def test_ddp_comm_hook_on_a_full_disk(tmp_path, group, mode):
    """The DDP wrapper's recording communication hook runs inside the
    backward: it does not raise there either."""
    m = _model()
    ddp = nn.parallel.DistributedDataParallel(m)
    j = Job(tmp_path, mode, model=m, ddp=ddp)
    assert j.tr.comm_recorder is not None
    for _ in range(HEALTHY):
        j.step()
    j.tr.session.flush()
    with warnings.catch_warnings(record=True) as w, full_disk(j.path):
        warnings.simplefilter("always")
        for i in range(AFTER):
            j.step(fail_at="backward" if i == 0 else None)
        j.close()
    said = [x for x in w if j.path in str(x.message)]
    assert j.trained == HEALTHY + AFTER
    places = [p for p, _ in j.raised]
    assert "forward" not in places and "backward" not in places, j.raised
    if mode == "warn":
        assert j.raised == [] and len(said) == 1
    else:
        assert places == ["end_step"] * AFTER + ["close"], j.raised
