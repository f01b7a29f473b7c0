"""ampprobe - numerical diagnostics for mixed-precision training, from Python.

The core (this package without torch) writes and reads libprobe traces and
runs the post-mortem: Session, Trace, read_trace, postmortem, stats.
The PyTorch tracer is ampprobe.torch (imports torch when imported).
libampprobe is found as docs/python.md says (AMPPROBE_LIB, AMPPROBE_PREFIX,
the loader, the build tree); nothing is compiled at install time.
"""
from ._lib import ProbeError, library_path, kind_names
from .core import (Session, Trace, read_trace, postmortem, verdict, stats,
                   find_cli, rank_trace_path, trace_set, digest64,
                   DIGEST64_INIT,
                   RECORD_DTYPE, STEP_DTYPE, SCALER_EVENT_DTYPE, LAYER_DTYPE,
                   SNAPSHOT_DTYPE)
from .policy import Policy, env_seed

__version__ = "0.3.0"  # = project(ampprobe VERSION) (tests/python/test_core.py)

__all__ = ["ProbeError", "library_path", "kind_names", "Session", "Trace",
           "read_trace", "postmortem", "verdict", "stats", "find_cli", "Policy", "env_seed",
           "rank_trace_path", "trace_set", "digest64", "DIGEST64_INIT",
           "RECORD_DTYPE", "STEP_DTYPE", "SCALER_EVENT_DTYPE", "LAYER_DTYPE",
           "SNAPSHOT_DTYPE"]
