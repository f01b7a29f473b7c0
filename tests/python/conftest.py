"""pytest setup for the ampprobe Python package (tests/python/).

The package is imported from the repository (python/); libampprobe from
$AMPPROBE_LIB (CTest sets it to the build tree's shared library) or the
package's own search (docs/python.md). Torch runs on one thread.
"""
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
PKG = os.path.join(REPO, "python")
sys.path.insert(0, PKG)
os.environ.setdefault("OMP_NUM_THREADS", "1")
for v in ("AMPPROBE_FP32", "AMPPROBE_PRECISION", "AMPPROBE_TRACE"):
    os.environ.pop(v, None)  # the tests set the policy themselves

try:
    import torch
    torch.set_num_threads(1)
except ImportError:  # the core tests run without torch
    torch = None


def cli_path():
    import ampprobe
    return ampprobe.find_cli()


@pytest.fixture
def cli():
    p = cli_path()
    if p is None:
        pytest.skip("no ampprobe command (set AMPPROBE_CLI)")
    return p


def run_py(args, env=None, timeout=300, **kw):
    """Runs /usr/bin/python3 (this interpreter) with the package on the
    path; returns the CompletedProcess."""
    e = dict(os.environ)
    e["PYTHONPATH"] = PKG + os.pathsep + e.get("PYTHONPATH", "")
    e.update(env or {})
    return subprocess.run([sys.executable] + list(args), env=e,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          timeout=timeout, **kw)


EXAMPLE = os.path.join(REPO, "examples", "train.py")
