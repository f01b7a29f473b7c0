"""The abort mark from the Python tracer: a job that ends by an exception,
a KeyboardInterrupt or an uncaught exception at exit has its trace closed
but marked aborted (the post-mortem: not-closed, degraded, exit 1); a job
that finishes is still healthy."""
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from conftest import PKG, run_py

torch = pytest.importorskip("torch")
import ampprobe.torch as at  # noqa: E402
from ampprobe import _lib  # noqa: E402

SCRIPT = """
import sys, time, torch
import ampprobe.torch as at
torch.manual_seed(0)
m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))
opt = torch.optim.SGD(m.parameters(), lr=0.01)
tr = at.Tracer(m, sys.argv[1], mode="full")
def step(i):
    opt.zero_grad()
    loss = m(torch.randn(8, 4)).pow(2).mean()
    loss.backward()
    opt.step()
    tr.end_step(loss=loss)
for i in range(3):
    step(i)
"""


def postmortem(cli, path):
    p = subprocess.run([cli, "postmortem", "--json", path],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    return p.returncode, json.loads(p.stdout)


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(),
                               torch.nn.Linear(4, 1))


def steps(tr, m, n):
    for _ in range(n):
        m(torch.randn(8, 4)).pow(2).mean().backward()
        tr.end_step(loss=1.0)


def test_normal_close_healthy(tmp_path, cli):
    p = str(tmp_path / "ok.h5")
    m = model()
    with at.Tracer(m, p, mode="full") as tr:
        steps(tr, m, 3)
    rc, d = postmortem(cli, p)
    assert d["trace"]["complete"] is True and d["trace"]["aborted"] is None
    assert rc == 0 and d["verdict"] == "healthy", d["verdict"]


def test_exception_leaving_with(tmp_path, cli):
    p = str(tmp_path / "exc.h5")
    m = model()
    with pytest.raises(RuntimeError):
        with at.Tracer(m, p, mode="full") as tr:
            steps(tr, m, 3)
            m(torch.randn(8, 4))  # a forward, no backward: half done
            raise RuntimeError("CUDA out of memory (simulated)")
    rc, d = postmortem(cli, p)
    assert rc == 1 and d["verdict"] == "degraded"
    assert d["trace"]["complete"] is False
    assert d["trace"]["aborted"] == "exception RuntimeError"
    assert d["trace"]["aborted_step"] == 3
    ids = [f["id"] for f in d["diagnosis"]]
    assert "not-closed" in ids, ids


def test_close_aborted_explicit(tmp_path, cli):
    p = str(tmp_path / "expl.h5")
    m = model()
    tr = at.Tracer(m, p, mode="full")
    steps(tr, m, 2)
    tr.close(aborted="preempted by the scheduler\x1b[31m")
    rc, d = postmortem(cli, p)
    assert rc == 1 and d["trace"]["aborted_step"] is None
    assert "\x1b" not in d["trace"]["aborted"]  # data: escaped


def test_uncaught_exception_no_close(tmp_path, cli):
    p = str(tmp_path / "unc.h5")
    r = run_py(["-c", SCRIPT + "\nraise ValueError('boom')\n", p])
    assert r.returncode == 1 and b"ValueError" in r.stderr  # the user's hook ran
    rc, d = postmortem(cli, p)
    assert rc == 1 and d["trace"]["aborted"] == "uncaught exception ValueError", d["trace"]


def test_normal_exit_no_close_healthy(tmp_path, cli):
    p = str(tmp_path / "end.h5")
    r = run_py(["-c", SCRIPT, p])
    assert r.returncode == 0, r.stderr
    rc, d = postmortem(cli, p)
    assert rc == 0 and d["trace"]["aborted"] is None


def test_keyboard_interrupt_sigint(tmp_path, cli):
    p = str(tmp_path / "kbd.h5")
    e = dict(os.environ)
    e["PYTHONPATH"] = PKG + os.pathsep + e.get("PYTHONPATH", "")
    code = SCRIPT + "\nprint('ready', flush=True)\nwhile True:\n    step(0)\n    time.sleep(0.01)\n"
    pr = subprocess.Popen([sys.executable, "-c", code, p], env=e,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert pr.stdout.readline().strip() == b"ready"
    time.sleep(0.5)
    pr.send_signal(signal.SIGINT)
    pr.communicate(timeout=60)
    rc, d = postmortem(cli, p)
    assert rc == 1 and d["trace"]["aborted"] == "uncaught KeyboardInterrupt", d["trace"]
