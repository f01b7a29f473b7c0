"""ampprobe.torch.stop_on_signals: a job stopped by SIGTERM (Slurm's time
limit, preemption, Kubernetes, `docker stop`) has its trace closed and
marked aborted "signal SIGTERM", and exits 128 + signum; without the
opt-in, Python's default SIGTERM kills the interpreter and the trace is
left not closed. Real jobs in their own process, signalled by the test."""
import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from conftest import PKG

torch = pytest.importorskip("torch")
import ampprobe.torch as at  # noqa: E402

# argv: trace path, "with" / "nowith", the signals to opt in to ("" none),
# and a variant: "" plain; "again" sends itself the same signal while the
# SignalExit is on its way (a repeat during the close); "survive" catches
# the SignalExit and carries on (for a later signal to end it)
JOB = r"""
import os, signal, sys, time, torch
import ampprobe.torch as at
path, how, sigs, variant = sys.argv[1:5]
if sigs:
    prev = at.stop_on_signals([getattr(signal, s) for s in sigs.split(",")])
torch.manual_seed(0)
m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))
opt = torch.optim.SGD(m.parameters(), lr=0.01)
def loop(tr):
    i = 0
    while True:
        opt.zero_grad()
        loss = m(torch.randn(8, 4)).pow(2).mean()
        loss.backward()
        opt.step()
        tr.end_step(loss=loss)
        i += 1
        if i == 3:
            print("ready", flush=True)
        time.sleep(0.01)
def body(tr):
    try:
        loop(tr)
    except at.SignalExit as e:
        if variant == "again":
            os.kill(os.getpid(), e.signum)  # handled at once: a repeat
            time.sleep(0.2)
            print("closing", flush=True)
            raise
        if variant == "survive":
            print("caught", flush=True)
            while True:
                time.sleep(0.05)
        raise
if how == "with":
    with at.Tracer(m, path, mode="full") as tr:
        body(tr)
else:
    tr = at.Tracer(m, path, mode="full")
    body(tr)
"""


def postmortem(cli, path):
    p = subprocess.run([cli, "postmortem", "--json", path],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    return p.returncode, json.loads(p.stdout)


def start(path, how, sigs, variant="", wait=0.2):
    e = dict(os.environ)
    e["PYTHONPATH"] = PKG + os.pathsep + e.get("PYTHONPATH", "")
    pr = subprocess.Popen([sys.executable, "-c", JOB, path, how, sigs, variant],
                          env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    line = pr.stdout.readline().strip()
    if line != b"ready":
        pr.kill()
        out, err = pr.communicate()
        pytest.fail("job not ready: %r %r" % (line, err[-2000:]))
    time.sleep(wait)
    return pr


def finish(pr):
    out, err = pr.communicate(timeout=120)
    return pr.returncode, out, err


def assert_marked(cli, path, reason):
    rc, d = postmortem(cli, path)
    assert d["trace"]["aborted"] == reason, d["trace"]
    assert d["trace"]["complete"] is False
    assert rc == 1 and d["verdict"] == "degraded", d["verdict"]
    assert "not-closed" in [f["id"] for f in d["diagnosis"]]


@pytest.mark.parametrize("how", ["with", "nowith"])
def test_sigterm_marks_and_exits_143(tmp_path, cli, how):
    p = str(tmp_path / "t.h5")
    pr = start(p, how, "SIGTERM")
    pr.send_signal(signal.SIGTERM)
    rc, out, err = finish(pr)
    assert rc == 128 + signal.SIGTERM, err[-2000:]
    assert b"Traceback" not in err, err[-2000:]  # a SystemExit: no trace
    assert_marked(cli, p, "signal SIGTERM")


@pytest.mark.parametrize("how", ["with", "nowith"])
def test_double_sigterm_back_to_back(tmp_path, cli, how):
    p = str(tmp_path / "d.h5")
    pr = start(p, how, "SIGTERM")
    pr.send_signal(signal.SIGTERM)
    pr.send_signal(signal.SIGTERM)
    rc, out, err = finish(pr)
    assert rc == 128 + signal.SIGTERM, err[-2000:]
    assert_marked(cli, p, "signal SIGTERM")


@pytest.mark.parametrize("how", ["with", "nowith"])
def test_repeat_during_the_close_is_ignored(tmp_path, cli, how):
    p = str(tmp_path / "r.h5")
    pr = start(p, how, "SIGTERM", "again")
    pr.send_signal(signal.SIGTERM)
    rc, out, err = finish(pr)
    assert b"closing" in out  # the repeat was handled before the close
    assert rc == 128 + signal.SIGTERM, err[-2000:]
    assert_marked(cli, p, "signal SIGTERM")


def test_a_later_signal_ends_the_process(tmp_path, cli):
    p = str(tmp_path / "l.h5")
    pr = start(p, "with", "SIGTERM", "survive")
    pr.send_signal(signal.SIGTERM)
    assert pr.stdout.readline().strip() == b"caught"
    time.sleep(1.5)  # past the repeat window
    pr.send_signal(signal.SIGTERM)
    rc, out, err = finish(pr)
    assert rc == -signal.SIGTERM  # killed by the default action


@pytest.mark.parametrize("sent", ["SIGTERM", "SIGINT"])
def test_sigint_in_the_list(tmp_path, cli, sent):
    p = str(tmp_path / "i.h5")
    pr = start(p, "with", "SIGTERM,SIGINT")
    num = getattr(signal, sent)
    pr.send_signal(num)
    rc, out, err = finish(pr)
    assert rc == 128 + num, err[-2000:]
    assert_marked(cli, p, "signal " + sent)


@pytest.mark.parametrize("how", ["with", "nowith"])
def test_without_opt_in_sigterm_kills_unclosed(tmp_path, cli, how):
    """The default, documented: Python's SIGTERM kills the interpreter at
    once; the trace is left not closed and carries no reason."""
    p = str(tmp_path / "n.h5")
    pr = start(p, how, "", wait=1.5)  # the writer's 1 s flush: a header
    pr.send_signal(signal.SIGTERM)
    rc, out, err = finish(pr)
    assert rc == -signal.SIGTERM
    rc, d = postmortem(cli, p)
    assert d["trace"]["complete"] is False and d["trace"]["aborted"] is None, d["trace"]
    assert rc == 1 and d["verdict"] == "degraded"


def test_refused_off_the_main_thread():
    box = []

    def f():
        try:
            at.stop_on_signals()
        except ValueError as e:
            box.append(e)
    t = threading.Thread(target=f)
    t.start()
    t.join()
    assert box and "main thread" in str(box[0])


def test_returns_the_previous_handlers_and_refuses_all_or_nothing():
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGUSR1)}
    try:
        with pytest.raises(ValueError):
            at.stop_on_signals([signal.SIGUSR1, signal.SIGKILL])
        assert signal.getsignal(signal.SIGUSR1) is before[signal.SIGUSR1]
        with pytest.raises(TypeError):
            at.stop_on_signals(["SIGTERM"])
        prev = at.stop_on_signals((signal.SIGTERM, signal.SIGUSR1))
        assert prev == before
        assert signal.getsignal(signal.SIGTERM) is at._on_stop_signal
    finally:
        for s, h in before.items():
            signal.signal(s, h)
    assert signal.getsignal(signal.SIGTERM) is before[signal.SIGTERM]


def test_signal_exit_reason():
    e = at.SignalExit(signal.SIGTERM)
    assert isinstance(e, SystemExit) and e.code == 143 and e.signum == 15
    assert at._exception_reason(type(e), e) == "signal SIGTERM"
    assert at._signal_reason(signal.SIGINT) == "signal SIGINT"
