"""`ampprobe bisect -- python3 examples/train.py`: the CLI drives the real
package through AMPPROBE_FP32 / AMPPROBE_PRECISION / AMPPROBE_TRACE /
AMPPROBE_SEED and finds the culprit kinds: revin for the forecaster, and
both revin and softmax for the two-culprit classifier (neither alone).
Skipped when this ampprobe bisect does not run external commands."""
import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")

from conftest import EXAMPLE, PKG  # noqa: E402


def _bisect_supports_commands(cli):
    h = subprocess.run([cli, "bisect", "--help"], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT).stdout.decode()
    return "AMPPROBE_TRACE" in h


@pytest.mark.parametrize("task,want", [("forecast", {"revin"}),
                                       ("classify", {"revin", "softmax"})])
def test_bisect_external_python_job(tmp_path, cli, task, want):
    if not _bisect_supports_commands(cli):
        pytest.skip("this ampprobe bisect does not run external commands")
    env = dict(os.environ)
    env["PYTHONPATH"] = PKG
    r = subprocess.run(
        [cli, "bisect", "--fp32-candidates", "bn,softmax,revin", "--json",
         "-o", str(tmp_path / "bisect.json"), "--", sys.executable, EXAMPLE,
         "--task", task, "--steps", "40"],
        cwd=str(tmp_path), env=env, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, timeout=900)
    out = r.stdout.decode() + r.stderr.decode()
    assert r.returncode == 1, out  # 1: a minimal set was found
    res = json.load(open(str(tmp_path / "bisect.json")))
    assert set(res["minimal_set"]) == want, out
