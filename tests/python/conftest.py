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


@pytest.fixture
def group(tmp_path):
    """A one-rank gloo process group for the test (torch.distributed)."""
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method="file://" + str(
        tmp_path / "pg"), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def cpu_fp16_autocast():
    """torch has FP16 CPU kernels under autocast (2.x; not Debian's 1.13),
    so precision="fp16" runs for real on the CPU, without emulation."""
    if torch is None:
        return False
    try:
        with torch.autocast("cpu", dtype=torch.float16):
            return torch.nn.Linear(2, 2)(torch.ones(1, 2)).dtype == \
                torch.float16
    except (RuntimeError, TypeError, ValueError):
        return False
