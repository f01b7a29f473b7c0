#!/usr/bin/env bash
# Installs, with apt-get, the Debian 12 packages ampprobe needs to build, test
# and benchmark. Idempotent: packages already present are left alone, and
# `apt-get update` runs only when something is missing.
#
#   scripts/install-deps.sh            build + test dependencies, chromium
#                                      included (the report tests); no options
set -euo pipefail

pkgs=(
  build-essential cmake pkg-config
  time                          # /usr/bin/time: peak-RSS checks in tests and benches
  libhdf5-dev hdf5-tools        # trace files (HDF5 C library, h5dump)
  check                         # unit tests (libcheck, pkg-config 'check')
  libjansson-dev                # configs and --json output
  libopenblas-dev               # CPU GEMMs
  python3-h5py python3-numpy    # interop tests read our traces with h5py
  python3-pandas                # ... and load a table the way the docs show
  python3-torch                 # reference gradients for the trainer tests
  python3-pytest                # tests/python: the ampprobe Python package
  chromium                      # report rendering test (headless)
)

missing=()
for p in "${pkgs[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#pkgs[@]} packages present"
  exit 0
fi

echo "install-deps: installing ${missing[*]}"
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
