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

# ---- build -------------------------------------------------------------------
MODE=cmake
t0=$(t_now)
configured=0
if [ "${FORCE_DIRECT:-0}" = 1 ]; then
  echo "FORCE_DIRECT=1: not using CMake" >"$LOG/configure.log"
elif cmake -S . -B "$BUILD" -DAMPPROBE_CUDA=ON \
     -DAMPPROBE_CUDA_ARCHITECTURES="$CUDA_ARCH" >"$LOG/configure.log" 2>&1; then
  configured=1
fi
if [ $configured = 1 ]; then
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
if [ "${SKIP_BENCH:-0}" != 1 ]; then
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
if [ -n "${OUT:-}" ] && [ -d "$OUT" ]; then cp -r "$LOG" "$OUT/"; fi
exit $FAILED
