#!/usr/bin/env bash
# gpu-check.sh - the one prepared run for a machine with a CUDA GPU: configure
# and build with CUDA, run every CTest test labelled `gpu`, run the GPU
# benchmarks, and end with a short table (step, result, seconds).
#
#   bash scripts/gpu-check.sh            # from the repository root
#
# Environment:
#   BUILD=build-gpu          build directory
#   JOBS=$(nproc)            parallel build jobs
#   CUDA_ARCH=90             AMPPROBE_CUDA_ARCHITECTURES
#   GPU_TARGETS="..."        targets to build; by default the executables of
#                            every CTest test labelled gpu (found after
#                            configuring) plus GPU_BENCH_TARGETS
#   GPU_BENCH_TARGETS="..."  benchmark targets (default bench_stats_gpu)
#   GPU_BENCHES="..."        benchmark programs to run, relative to $BUILD
#   SKIP_BENCH=1             do not run the benchmarks
#   FORCE_DIRECT=1           skip CMake, use the direct nvcc/gcc build below
#   OUT                      when set (the device runner's folder), the logs
#                            ($BUILD-logs/) are copied there
#   BUNDLE=b.tar.xz          run a bundle of scripts/gpu-bundle.sh (the build
#                            made on another machine, with its libraries)
#                            instead of building: for a GPU machine without
#                            HDF5, Check or MPI (the lent device). Runs the
#                            five GPU test programs, tests/python/test_cuda.py
#                            with the machine's python3 and torch, and the
#                            GPU benchmark.
#
# When CMake cannot configure (a dependency such as HDF5 missing on the GPU
# machine), it falls back to building the statistics test and benchmark
# directly with nvcc/gcc (only libcheck is needed for the test), so the CUDA
# kernels are still checked. Exit status: 0 only when every step passed.
set -u
cd "$(dirname "$0")/.."

BUILD=${BUILD:-build-gpu}
JOBS=${JOBS:-$(nproc)}
CUDA_ARCH=${CUDA_ARCH:-90}
GPU_TARGETS=${GPU_TARGETS:-} # empty: every test labelled gpu + GPU_BENCH_TARGETS
GPU_BENCH_TARGETS=${GPU_BENCH_TARGETS:-"bench_stats_gpu"}
GPU_BENCHES=${GPU_BENCHES:-"bench/bench_stats_gpu"}
NVCC=${NVCC:-/usr/local/cuda/bin/nvcc}
[ -x "$NVCC" ] || NVCC=$(command -v nvcc || echo nvcc)
CUDA_LIB=$(dirname "$(dirname "$(readlink -f "$(command -v "$NVCC")")")")/lib64

LOG="$BUILD-logs" # configure/build/ctest logs
mkdir -p "$LOG"
declare -a ROWS=()
FAILED=0
row() { ROWS+=("$(printf '%-42s %-8s %7s' "$1" "$2" "$3")"); [ "$2" = FAIL ] && FAILED=1; return 0; }
t_now() { date +%s.%N; }
t_since() { awk -v a="$1" -v b="$(t_now)" 'BEGIN { printf "%.1f", b - a }'; }

echo "== gpu-check: $(date -u '+%Y-%m-%d %H:%M:%S UTC') on $(hostname)"
# A GPU test that skips where nvidia-smi sees a GPU is a failure (driver
# mismatch, invisible device): say so rather than report a quiet SKIP.
SKIP_RESULT=SKIP
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  nvidia-smi -L 2>/dev/null | grep -q '^GPU' && SKIP_RESULT=FAIL
else
  echo "nvidia-smi not found"
fi
"$NVCC" --version | tail -1

# ---- a prebuilt bundle (scripts/gpu-bundle.sh) ---------------------------------
# Each program runs with CK_FORK=no (CUDA does not survive fork); 77 is a
# skip. The loader path: the bundle's libraries, then the directories of the
# machine's own libcublas/libnccl (its CUDA toolkit or its PyTorch's wheels).
# One benchmark of the bundle: name, loader path, time limit, command; its
# output shown and kept in $LOG/name.log, a row for the table.
bundle_bench() {
  local name=$1 libs=$2 limit=$3 t0 rc
  shift 3
  echo "== $name"
  t0=$(t_now)
  LD_LIBRARY_PATH="$libs" timeout "$limit" "$@" >"$LOG/$name.log" 2>&1
  rc=$?
  cat "$LOG/$name.log"
  if [ $rc = 0 ]; then row "bench $name" ok "$(t_since "$t0")"
  else row "bench $name (exit $rc)" FAIL "$(t_since "$t0")"; fi
}

run_bundle() {
  local dir=/tmp/ampprobe-gpu-bundle t0 rc p
  rm -rf "$dir" && mkdir -p "$dir"
  t0=$(t_now)
  # tar without xz: Python's tarfile reads it too
  if ! tar -C "$dir" -xJf "$BUNDLE" 2>/dev/null &&
     ! python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' \
       "$BUNDLE" "$dir"; then
    row "unpack $BUNDLE" FAIL "$(t_since "$t0")"
    return
  fi
  row "unpack bundle" ok "$(t_since "$t0")"
  local b=$dir/b sys=""
  for lib in libcublas.so.13 libnccl.so.2; do
    p=$(find /usr/local /opt /usr/lib -name "$lib" 2>/dev/null | head -1)
    [ -n "$p" ] && sys="$sys:$(dirname "$p")"
    echo "$lib: ${p:-not found}"
  done
  local pylibs="$b/lib$sys" clibs="$b/lib:$b/lib-cxx$sys"
  local mpi=$b/mpi/usr pmix=$b/mpi/usr/lib/x86_64-linux-gnu/pmix2
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  export OPAL_PREFIX=$mpi PMIX_PREFIX=$pmix
  export PMIX_MCA_mca_base_component_path=$pmix/lib/pmix
  for prog in test_gpu_stats test_gpu_probe test_gpu_layers test_trainer_gpu test_nccl; do
    echo "== $prog"
    t0=$(t_now)
    (cd "$LOG" && CK_FORK=no LD_LIBRARY_PATH="$clibs" timeout 300 "$b/bin/$prog") \
      >"$LOG/$prog.log" 2>&1
    rc=$?
    tail -15 "$LOG/$prog.log"
    case $rc in
      0) row "test $prog" ok "$(t_since "$t0")" ;;
      77) row "test $prog" "$SKIP_RESULT" "$(t_since "$t0")" ;;
      *) row "test $prog (exit $rc)" FAIL "$(t_since "$t0")" ;;
    esac
  done
  # compute-sanitizer on the statistics kernels (memcheck: out-of-bounds
  # and misaligned accesses; racecheck: the shared-memory reductions), when
  # the machine has it; SANITIZE=0 skips
  local cs
  cs=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null || true)
  if [ "${SANITIZE:-1}" = 1 ] && [ -n "$cs" ]; then
    for tool in memcheck racecheck; do
      echo "== compute-sanitizer --tool $tool test_gpu_stats"
      t0=$(t_now)
      (cd "$LOG" && CK_FORK=no LD_LIBRARY_PATH="$clibs" timeout 240 "$cs" --tool "$tool" \
         --error-exitcode 9 "$b/bin/test_gpu_stats") >"$LOG/sanitizer_$tool.log" 2>&1
      rc=$?
      tail -6 "$LOG/sanitizer_$tool.log"
      case $rc in
        0) row "compute-sanitizer $tool test_gpu_stats" ok "$(t_since "$t0")" ;;
        124) row "compute-sanitizer $tool (timed out)" SKIP "$(t_since "$t0")" ;;
        *) row "compute-sanitizer $tool (exit $rc)" FAIL "$(t_since "$t0")" ;;
      esac
    done
  fi
  echo "== python tests/python/test_cuda.py"
  t0=$(t_now)
  (cd "$b/tests/python" && PYTHONPATH="$b/python" LD_LIBRARY_PATH="$pylibs" \
     AMPPROBE_LIB="$b/lib/libampprobe.so" AMPPROBE_CLI="$b/bin/ampprobe" \
     timeout 300 python3 -m pytest -q -p no:cacheprovider -rs test_cuda.py) \
     >"$LOG/python_cuda.log" 2>&1
  rc=$?
  tail -25 "$LOG/python_cuda.log"
  case $rc in
    0) if grep -q ' passed' "$LOG/python_cuda.log"; then row "python test_cuda.py" ok "$(t_since "$t0")"
       else row "python test_cuda.py (all skipped)" "$SKIP_RESULT" "$(t_since "$t0")"; fi ;;
    5) row "python test_cuda.py (no test ran)" "$SKIP_RESULT" "$(t_since "$t0")" ;;
    *) row "python test_cuda.py (exit $rc)" FAIL "$(t_since "$t0")" ;;
  esac
  if [ "${SKIP_BENCH:-0}" != 1 ]; then
    bundle_bench bench_stats_gpu "$clibs" 200 "$b/bin/bench_stats_gpu"
    # the Python tracer's cost on a GPU training step (this tree's package
    # and bench, the bundle's library, the machine's torch)
    PYTHONPATH="$b/python" AMPPROBE_LIB="$b/lib/libampprobe.so" \
      bundle_bench python_overhead_gpu "$pylibs" 400 python3 bench/python_overhead_gpu.py
  fi
}

# ---- build -------------------------------------------------------------------
MODE=cmake
[ -n "${BUNDLE:-}" ] && MODE=bundle
t0=$(t_now)
configured=0
if [ "$MODE" = bundle ]; then
  run_bundle
elif [ "${FORCE_DIRECT:-0}" = 1 ]; then
  echo "FORCE_DIRECT=1: not using CMake" >"$LOG/configure.log"
elif cmake -S . -B "$BUILD" -DAMPPROBE_CUDA=ON \
     -DAMPPROBE_CUDA_ARCHITECTURES="$CUDA_ARCH" >"$LOG/configure.log" 2>&1; then
  configured=1
fi
if [ "$MODE" = bundle ]; then
  :
elif [ $configured = 1 ]; then
  if grep -q 'ampprobe: CUDA' "$LOG/configure.log"; then
    row "configure (cmake, CUDA on)" ok "$(t_since "$t0")"
  else
    row "configure (cmake, CUDA on)" FAIL "$(t_since "$t0")"
    echo "CMake did not enable CUDA:"; grep 'ampprobe:' "$LOG/configure.log"
  fi
  if [ -z "$GPU_TARGETS" ]; then
    # Executables of tests labelled gpu, read from the generated CTest files
    # (ctest --show-only omits tests whose executable is not built yet).
    GPU_TARGETS=$(/usr/bin/python3 - "$BUILD" <<'PY'
import os, re, sys
cmd, gpu = {}, set()
for root, _, files in os.walk(sys.argv[1]):
    if "CTestTestfile.cmake" not in files:
        continue
    text = open(os.path.join(root, "CTestTestfile.cmake")).read()
    for name, exe in re.findall(r'add_test\(\[=\[(.+?)\]=\] "([^"]+)"', text):
        cmd[name] = os.path.basename(exe)
    for name, props in re.findall(r'set_tests_properties\(\[=\[(.+?)\]=\] PROPERTIES (.*)\)', text):
        m = re.search(r'LABELS "([^"]*)"', props)
        if m and "gpu" in m.group(1).split(";"):
            gpu.add(name)
print(" ".join(sorted({cmd[n] for n in gpu if n in cmd})))
PY
)
    if [ -z "$GPU_TARGETS" ]; then
      echo "could not list the gpu tests' executables: building everything"
      GPU_TARGETS=all
    else
      GPU_TARGETS="$GPU_TARGETS $GPU_BENCH_TARGETS"
    fi
  fi
  echo "== building: $GPU_TARGETS"
  t0=$(t_now)
  # shellcheck disable=SC2086
  if cmake --build "$BUILD" -j "$JOBS" --target $GPU_TARGETS >"$LOG/build.log" 2>&1; then
    row "build ($(echo $GPU_TARGETS | wc -w) targets)" ok "$(t_since "$t0")"
  else
    tail -40 "$LOG/build.log"
    row "build ($(echo $GPU_TARGETS | wc -w) targets)" FAIL "$(t_since "$t0")"
  fi
else
  tail -20 "$LOG/configure.log"
  row "configure (cmake)" fallback "$(t_since "$t0")"
  MODE=direct
fi

if [ "$MODE" = direct ]; then
  echo "== cmake configure failed: building the CUDA statistics test and benchmark directly"
  D="$BUILD-direct"
  mkdir -p "$D"
  t0=$(t_now)
  ok=1
  CFLAGS="-std=c11 -O2 -Wall -Wextra -Wshadow -Wno-unused-parameter -Iinclude"
  NVFLAGS="-std=c++17 -O2 -arch=sm_$CUDA_ARCH -Iinclude"
  LIBOBJS=""
  for src in kernels/*.c; do # the library's C sources, as kernels/CMakeLists.txt
    f=$(basename "$src" .c)
    case $f in
      stats_nocuda) continue ;;
      stats_avx512 | stats_small)
        isa="-mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512vbmi2 -mavx512vnni -mavx2 -mf16c -mfma" ;;
      stats_avx2 | stats_block | stats_small2) isa="-mavx2 -mf16c -mfma" ;;
      *) isa="" ;;
    esac
    gcc $CFLAGS $isa -c "$src" -o "$D/$f.o" || ok=0
    LIBOBJS="$LIBOBJS $D/$f.o"
  done
  "$NVCC" $NVFLAGS -c kernels/stats_cuda.cu -o "$D/stats_cuda.o" || ok=0
  LIBOBJS="$LIBOBJS $D/stats_cuda.o"
  mkdir -p "$D/bench"
  "$NVCC" $NVFLAGS bench/stats_gpu.cu $LIBOBJS -o "$D/bench/bench_stats_gpu" || ok=0
  [ $ok = 1 ] && row "build: kernels + bench (direct)" ok "$(t_since "$t0")" \
              || row "build: kernels + bench (direct)" FAIL "$(t_since "$t0")"
  t0=$(t_now)
  if "$NVCC" $NVFLAGS -c tests/gpu/gpu_convert.cu -o "$D/gpu_convert.o" &&
     gcc $CFLAGS -I/usr/local/cuda/include -Itests/gpu -c tests/gpu/test_gpu_stats.c \
       -o "$D/test_gpu_stats.o" &&
     g++ "$D/test_gpu_stats.o" "$D/gpu_convert.o" $LIBOBJS -o "$D/test_gpu_stats" \
       -L"$CUDA_LIB" -lcudart $(pkg-config --libs check 2>/dev/null || echo -lcheck) -lm; then
    row "build: test_gpu_stats (direct)" ok "$(t_since "$t0")"
  else
    row "build: test_gpu_stats (direct)" FAIL "$(t_since "$t0")"
  fi
  BUILD=$D
fi

# ---- tests -------------------------------------------------------------------
t0=$(t_now)
if [ "$MODE" = cmake ]; then
  ctest --test-dir "$BUILD" -L gpu --output-on-failure --timeout 600 2>&1 | tee "$LOG/ctest.log"
  # One row per test: "N/M Test #K: name .... Passed 1.23 sec"
  while read -r line; do
    name=$(echo "$line" | sed -E 's/.*Test +#[0-9]+: ([^ ]+).*/\1/')
    secs=$(echo "$line" | sed -E 's/.* ([0-9.]+) sec.*/\1/')
    case "$line" in
      *Passed*) row "test $name" ok "$secs" ;;
      *Skipped*) row "test $name" "$SKIP_RESULT" "$secs" ;;
      *"Not Run"*) row "test $name (not built)" FAIL "$secs" ;;
      *) row "test $name" FAIL "$secs" ;;
    esac
  done < <(grep -E 'Test +#[0-9]+:' "$LOG/ctest.log")
  grep -q 'No tests were found' "$LOG/ctest.log" && row "ctest -L gpu" FAIL "$(t_since "$t0")"
elif [ -x "$BUILD/test_gpu_stats" ]; then
  CK_FORK=no "$BUILD/test_gpu_stats"
  rc=$?
  case $rc in
    0) row "test gpu_stats (direct)" ok "$(t_since "$t0")" ;;
    77) row "test gpu_stats (direct)" "$SKIP_RESULT" "$(t_since "$t0")" ;;
    *) row "test gpu_stats (direct)" FAIL "$(t_since "$t0")" ;;
  esac
fi

# ---- benchmarks --------------------------------------------------------------
if [ "${SKIP_BENCH:-0}" != 1 ] && [ "$MODE" != bundle ]; then
  for b in $GPU_BENCHES; do
    exe="$BUILD/$b"
    t0=$(t_now)
    if [ -x "$exe" ]; then
      echo "== $b"
      if "$exe"; then row "bench $(basename "$b")" ok "$(t_since "$t0")"
      else row "bench $(basename "$b")" FAIL "$(t_since "$t0")"; fi
    else
      row "bench $(basename "$b")" FAIL "-"
      echo "missing $exe"
    fi
  done
fi

{
  echo
  echo "== gpu-check summary"
  printf '%-42s %-8s %7s\n' step result seconds
  for r in "${ROWS[@]}"; do echo "$r"; done
} | tee "$LOG/summary.txt"
# On the lent machine, bring the logs back.
# (one archive and the summary: the runner brings back at most 8 files)
if [ -n "${OUT:-}" ] && [ -d "$OUT" ]; then
  tar -czf "$OUT/gpu-check-logs.tar.gz" "$LOG" && cp "$LOG/summary.txt" "$OUT/"
fi
exit $FAILED
