#!/usr/bin/env bash
# gpu-bundle.sh - packs what a CUDA build made here needs to run on a GPU
# machine that has the CUDA driver but not this machine's libraries (the
# lent device has no HDF5, Check or Open MPI): the GPU tests, the GPU
# benchmark, the CLI and libampprobe, the shared libraries they load
# (found with ldd, glibc's own excepted), Open MPI's and PMIx's runtime
# trees (for the MPI singleton of the NCCL test), and the Python package
# with its tests. scripts/gpu-check.sh BUNDLE=... runs it there.
#
#   make build && bash scripts/gpu-bundle.sh      # -> build-gpu-bundle/b.tar.xz
#
# Environment: BUILD=build (a CUDA build, AMPPROBE_CUDA_ARCHITECTURES
# covering the device's), DEST=build-gpu-bundle. libnccl (208 MB) and the
# CUDA driver are not packed: gpu-check.sh takes the device's own (the NCCL
# of its PyTorch). Exit 1 when a program is missing from the build.
set -eu
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
DEST=${DEST:-build-gpu-bundle}
STAGE=$(mktemp -d)
trap 'rm -rf "$STAGE"' EXIT
B="$STAGE/b"
mkdir -p "$B/bin" "$B/lib" "$B/lib-cxx"

PROGRAMS="tests/probe/test_gpu_probe tests/gpu/test_gpu_stats tests/gpu/test_gpu_layers
          tests/trainer/test_trainer_gpu tests/trainer/test_nccl bench/bench_stats_gpu
          tools/ampprobe"
for p in $PROGRAMS; do
  [ -x "$BUILD/$p" ] || { echo "gpu-bundle: $BUILD/$p is not built (make build)" >&2; exit 1; }
  cp "$BUILD/$p" "$B/bin/"
done
cp -P "$BUILD"/libprobe/libampprobe.so* "$B/lib/"

# Libraries the loader resolves here, except glibc's and the driver's;
# libstdc++/libgcc_s apart (lib-cxx/), so that a newer C++ runtime of the
# device (PyTorch's) is not replaced in the Python run.
skip='^(linux-vdso|libc\.so|libm\.so|libdl\.so|librt\.so|libpthread\.so|libutil\.so|libresolv\.so|ld-linux|libcuda\.so|libnccl\.so)'
deps() { ldd "$@" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// { print $1, $3 }' | sort -u; }
OMPI_LIB=/usr/lib/x86_64-linux-gnu/openmpi
PMIX=/usr/lib/x86_64-linux-gnu/pmix2
plugins=$(find "$OMPI_LIB/lib/openmpi3" "$PMIX/lib/pmix" -name '*.so' 2>/dev/null || true)
# shellcheck disable=SC2086
deps "$B"/bin/* "$B"/lib/libampprobe.so $plugins /usr/bin/orted 2>/dev/null |
while read -r name path; do
  echo "$name" | grep -Eq "$skip" && continue
  case $name in
    libstdc++* | libgcc_s*) cp -L "$path" "$B/lib-cxx/$name" ;;
    *) cp -L "$path" "$B/lib/$name" ;;
  esac
done

# Open MPI and PMIx, relocated with OPAL_PREFIX / PMIX_INSTALL_PREFIX
if [ -d "$OMPI_LIB" ]; then
  R="$B/mpi/usr"
  mkdir -p "$R/bin" "$R/lib/x86_64-linux-gnu" "$R/share"
  cp /usr/bin/orted "$R/bin/"
  cp -a "$OMPI_LIB" "$R/lib/x86_64-linux-gnu/"
  rm -rf "$R/lib/x86_64-linux-gnu/openmpi/include"
  cp -a /usr/share/openmpi "$R/share/"
  [ -d "$PMIX" ] && cp -a "$PMIX" "$R/lib/x86_64-linux-gnu/"
fi

# The Python package and its tests (they travel with the tree too; here so
# that the bundle is whole)
cp -a python "$B/python"
mkdir -p "$B/tests"
cp -a tests/python "$B/tests/python"
find "$B" -name __pycache__ -prune -exec rm -rf {} +

strip --strip-unneeded "$B"/bin/* 2>/dev/null || true
mkdir -p "$DEST"
tar -C "$STAGE" -cJf "$DEST/b.tar.xz" b
echo "gpu-bundle: $DEST/b.tar.xz ($(du -h "$DEST/b.tar.xz" | cut -f1); unpacked $(du -sh "$B" | cut -f1))"
