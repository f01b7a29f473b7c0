#!/usr/bin/env bash
# A Python with torch 2 for the Python package's tests, beside Debian's
# torch 1.13: a venv over /usr/bin/python3 that sees Debian's packages
# (numpy, h5py, pytest) and has PyPI's torch (and transformers, for the
# Hugging Face models of tests/python/test_hf.py) installed over them. Used
# by `make test-nocuda`, whose build runs tests/python with it (the default
# build runs them with Debian's torch 1.13), so both torch generations are
# tested by `make test` where nvcc is found (no CUDA-off stage without it)
# and PyPI can be reached (docs/python.md, "Tested with").
#
#   scripts/torch2-venv.sh [DIR]     DIR: the venv (default: $AMPPROBE_TORCH2_VENV,
#                                    else ~/.cache/ampprobe/venv-torch2)
#
# On success the last line of stdout is the venv's python. The venv is made
# once and kept: a second call checks it and returns at once. PyPI's Linux
# torch is the CUDA build: ~4.5 GB with its nvidia-* wheels, ~2 min. It
# fails (exit 1, the reason on stderr) when PyPI cannot be reached; the
# caller then tests with torch 1.13 only, and says so.
# $AMPPROBE_TORCH2_SPEC: the pip requirements, space-separated (default:
# the versions tested).
set -euo pipefail

SPEC=${AMPPROBE_TORCH2_SPEC:-torch==2.15.0 transformers==5.25.0}
DIR=${1:-${AMPPROBE_TORCH2_VENV:-${XDG_CACHE_HOME:-${HOME:-/tmp}/.cache}/ampprobe/venv-torch2}}
DIR=$(realpath -m -- "$DIR")  # CMake is given the path: absolute
PY="$DIR/bin/python"
BASE=/usr/bin/python3

say() { echo "torch2-venv: $*" >&2; }

# "torch 2.15.0, transformers 5.25.0" when the venv satisfies SPEC (and its
# torch, not Debian's 1.13, is the one imported), else a non-zero status
CHECK='
import sys
from importlib.metadata import version, PackageNotFoundError
try:
    from packaging.requirements import Requirement
except ImportError:
    from pip._vendor.packaging.requirements import Requirement
got = []
for spec in sys.argv[1:]:
    req = Requirement(spec)
    try:
        v = version(req.name)
    except PackageNotFoundError:
        sys.exit(1)
    if not req.specifier.contains(v, prereleases=True):
        sys.exit(1)
    got.append("%s %s" % (req.name, v))
import torch
if not torch.__version__.startswith("2."):
    sys.exit(1)
import h5py, numpy  # the system ones, built for each other: a PyPI numpy 2 broke h5py
if not numpy.__file__.startswith("/usr/lib/python3/"):
    sys.exit(1)
print(", ".join(got))
'
installed() {
  [ -x "$PY" ] || return 1
  # shellcheck disable=SC2086  # SPEC is a list of requirements
  "$PY" -c "$CHECK" $SPEC 2>/dev/null
}

if v=$(installed); then
  say "$DIR has $v"
  echo "$PY"
  exit 0
fi
if [ ! -x "$BASE" ]; then
  say "$BASE not found (Debian's python3): no venv made"
  exit 1
fi
mkdir -p "$(dirname "$DIR")"
if [ -f "$DIR/pyvenv.cfg" ]; then  # a venv of ours that fails the check
  say "remaking $DIR (it does not satisfy $SPEC with Debian's numpy and h5py)"
  rm -rf -- "$DIR"
fi
if [ ! -x "$PY" ]; then
  "$BASE" -m venv --system-site-packages "$DIR" || {
    say "cannot make a venv in $DIR (apt-get install python3-venv)"; exit 1; }
fi
say "installing $SPEC from PyPI into $DIR (~4.5 GB with torch's CUDA wheels, a few minutes) ..."
# Debian's numpy and h5py (visible to the venv) must stay the ones imported:
# its h5py is built for its numpy, and transformers would pull a numpy 2
# (h5py then fails: "numpy.dtype size changed"). The pinned torch is not
# satisfied by Debian's 1.13, so it is installed into the venv over it.
CONS="$DIR/constraints.txt"
"$BASE" -c 'import numpy, h5py; print("numpy==" + numpy.__version__); print("h5py==" + h5py.__version__)' > "$CONS" || {
  say "$BASE cannot import numpy and h5py (apt-get install python3-numpy python3-h5py)"; exit 1; }
# shellcheck disable=SC2086
if ! "$PY" -m pip install --quiet --disable-pip-version-check \
     --constraint "$CONS" $SPEC >&2; then
  say "pip install $SPEC failed (is PyPI reachable?)"
  exit 1
fi
if ! v=$(installed); then
  say "$SPEC installed, but not importable in $PY"
  exit 1
fi
say "$DIR has $v"
echo "$PY"
