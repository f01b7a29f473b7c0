#!/usr/bin/env bash
# Installs, with apt-get, the Debian 12 packages ampprobe needs to build, test
# and benchmark. Idempotent: packages already present are left alone, and
# `apt-get update` runs only when something is missing.
#
#   scripts/install-deps.sh            build + test dependencies, chromium
#                                      included (the report tests); no options
#
# The library alone needs only build-essential, cmake and libhdf5-dev (and
# the CUDA toolkit for its GPU path, not installed here); the rest is for the
# trainer (jansson, OpenBLAS), the tests, the Python package and the benches.
# `optional` packages are installed when apt can get them; without them the
# tests that need them skip (exit 77), so a machine without network access
# that has the required ones still builds and tests.
set -euo pipefail

pkgs=(
  build-essential cmake pkg-config
  time                          # /usr/bin/time: peak-RSS checks in tests and benches
  libhdf5-dev hdf5-tools        # trace files (HDF5 C library, h5dump)
  libdeflate-dev                # the trace writer's chunk compression
  zlib1g-dev                    # the writer's deflate streams checked with zlib
  check                         # unit tests (libcheck, pkg-config 'check')
  libjansson-dev                # configs and --json output
  libopenblas-dev               # CPU GEMMs
  python3-h5py python3-numpy    # interop tests read our traces with h5py
  python3-pandas                # ... and load a table the way the docs show
  python3-torch                 # reference gradients for the trainer tests
  python3-pytest                # the Python package's tests
  python3-venv python3-dev      # torch 2 beside Debian's 1.13 (scripts/torch2-venv.sh);
                                # torch.compile's CPU backend includes Python.h
  chromium                      # report rendering test (headless)
)
optional=(
  openmpi-bin libopenmpi-dev    # data-parallel trainer (AMPPROBE_MPI) and the mpi tests
)

installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }
missing=() missing_opt=()
for p in "${pkgs[@]}"; do installed "$p" || missing+=("$p"); done
for p in "${optional[@]}"; do installed "$p" || missing_opt+=("$p"); done

if [ ${#missing[@]} -eq 0 ] && [ ${#missing_opt[@]} -eq 0 ]; then
  echo "install-deps: all $(( ${#pkgs[@]} + ${#optional[@]} )) packages present"
  exit 0
fi

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
if [ ${#missing[@]} -gt 0 ]; then
  echo "install-deps: installing ${missing[*]}"
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
  updated=1
fi
# Optional packages: bounded tries, and after a failure (no package mirror
# reachable) no new try for a day, so `make test` does not wait each time.
stamp=${TMPDIR:-/tmp}/ampprobe-install-deps-optional.failed
if [ ${#missing_opt[@]} -gt 0 ]; then
  if [ -e "$stamp" ] && [ -z "$(find "$stamp" -mmin +1440)" ]; then
    echo "install-deps: optional ${missing_opt[*]} missing; not retrying" \
         "(failed within a day; rm $stamp to retry); the tests that need them skip"
  else
    echo "install-deps: installing optional ${missing_opt[*]}"
    if { [ -n "${updated:-}" ] || timeout 60 $SUDO apt-get update -qq; } &&
       timeout 600 $SUDO apt-get install -y -qq --no-install-recommends "${missing_opt[@]}"; then
      rm -f "$stamp"
    else
      touch "$stamp"
      echo "install-deps: optional packages not installed (${missing_opt[*]});" \
           "the tests that need them will skip" >&2
    fi
  fi
fi
