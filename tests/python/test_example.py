"""End-to-end through examples/train.py in its own process: the policy
variables bisect sets, a SIGKILLed job, a job that raises."""
import math
import signal

import pytest

pytest.importorskip("torch")

import ampprobe  # noqa: E402
from conftest import EXAMPLE, run_py  # noqa: E402


def test_env_policy_drives_the_job(tmp_path):
    bad = tmp_path / "fp16.h5"
    r = run_py([EXAMPLE, "--steps", "6", "--trace", str(bad)])
    assert r.returncode == 0, r.stderr.decode()
    assert "final loss inf" in r.stdout.decode()
    ev = ampprobe.postmortem(str(bad))["event"]
    assert (ev["origin_layer"], ev["origin_kind"], ev["origin_site"]) == (
        "revin", "revin", "fwd_saved")
    good = tmp_path / "trial.h5"
    r = run_py([EXAMPLE, "--steps", "6", "--trace", str(tmp_path / "x.h5")],
               env={"AMPPROBE_FP32": "revin", "AMPPROBE_TRACE": str(good),
                    "AMPPROBE_SEED": "7"})
    assert r.returncode == 0, r.stderr.decode()
    assert not (tmp_path / "x.h5").exists()
    t = ampprobe.read_trace(str(good))
    assert all(math.isfinite(x) for x in t["steps"]["loss"])
    assert '"seed": 7' in t["info"]["config_json"]
    assert t["info"]["precision_policy"] == "fp16; fp32: revin"


def test_sigkilled_job_leaves_a_readable_trace(tmp_path):
    p = tmp_path / "killed.h5"
    r = run_py([EXAMPLE, "--steps", "50", "--kill-at", "8", "--trace", str(p)])
    assert r.returncode == -signal.SIGKILL
    with ampprobe.Trace(str(p)) as t:
        assert t.info["complete"] == 0
        # step 0 (a forward event) was flushed at once; later steps by the
        # writer thread's 1 s timer, so most of the 8 are usually there
        assert t.info["n_steps"] >= 1
    pm = ampprobe.postmortem(str(p))
    assert pm["trace"]["complete"] is False
    assert pm["event"]["origin_layer"] == "revin"
    assert pm["event"]["step"] == 0


def test_job_that_raises_still_closes_its_trace(tmp_path):
    p = tmp_path / "raised.h5"
    r = run_py([EXAMPLE, "--steps", "50", "--fail-at", "4", "--trace", str(p)])
    assert r.returncode == 1 and b"planted failure" in r.stderr
    with ampprobe.Trace(str(p)) as t:
        # closed by the finalizer at exit, marked aborted by the exception
        # (it read complete, and the post-mortem healthy: hunt F1)
        assert t.info["complete"] == 0
        assert t.info["aborted"] == "uncaught exception RuntimeError"
        assert t.info["aborted_step"] == -1  # raised between steps
        assert t.info["n_steps"] == 4
    pm = ampprobe.postmortem(str(p))
    assert pm["verdict"] != "healthy" and pm["trace"]["aborted"] == "uncaught exception RuntimeError"


def test_raise_mode_stops_the_job_at_step_0(tmp_path):
    p = tmp_path / "r.h5"
    r = run_py([EXAMPLE, "--steps", "50", "--on-nonfinite", "raise",
                "--trace", str(p)])
    assert r.returncode == 1
    err = r.stderr.decode()
    assert "NonFiniteError" in err and "step 0" in err and "'revin'" in err \
        and "fwd_saved" in err, err
    assert ampprobe.read_trace(str(p))["info"]["complete"] == 1
