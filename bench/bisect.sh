#!/usr/bin/env bash
# bench/bisect.sh - `ampprobe bisect` on the two-culprits scenario: trials
# run and wall time with -j 1 and -j 2 side by side (median of REPS runs),
# for the three usual candidates and for every module kind of the model;
# then `ampprobe diff` time and peak RSS on full traces of growing length
# (memory must not grow with the trace). Writes markdown to stdout, and to
# FILE with --md FILE.
#
# usage: bench/bisect.sh [BUILD_DIR] [--md FILE] [--reps N]
set -u
build=build
md=
reps=3
while [ $# -gt 0 ]; do
  case "$1" in
    --md) md=$2; shift 2 ;;
    --reps) reps=$2; shift 2 ;;
    *) build=$1; shift ;;
  esac
done
bin=$build/tools/ampprobe
[ -x "$bin" ] || { echo "bench/bisect.sh: $bin not built" >&2; exit 1; }
py=/usr/bin/python3
work=$(mktemp -d /tmp/ampprobe-bench-bisect.XXXXXX)
trap 'rm -rf "$work"' EXIT

# one CANDIDATES JOBS -> "trials ddmin cancelled wall minimal"
one() {
  "$bin" bisect --scenario two-culprits --fp32-candidates "$1" -j "$2" -q \
    --workdir "$work/wd" --json >"$work/r.json" 2>/dev/null
  "$py" -c "import json,sys; d=json.load(open(sys.argv[1])); print(d['trials_run'], d['ddmin_trials'], d['trials_cancelled'], '%.3f' % d['wall_seconds'], ','.join(d['minimal_set'] or []))" "$work/r.json"
}

median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

load0=$(cut -d' ' -f1 /proc/loadavg)
rows=""
for cand in "bn,softmax,revin" "linear,activation,softmax,revin,loss,bn,layernorm"; do
  n=$(echo "$cand" | tr ',' '\n' | grep -c .)
  line="| $n (\`$cand\`) |"
  for j in 1 2; do
    : >"$work/walls"
    for _ in $(seq "$reps"); do
      read -r trials ddmin cancelled wall minimal < <(one "$cand" "$j")
      echo "$wall" >>"$work/walls"
    done
    w=$(median <"$work/walls")
    line="$line $trials ($ddmin ddmin, $cancelled cancelled) | $w s |"
  done
  rows="$rows$line {$minimal} |
"
done

# diff: FP16 vs FP32 traces of the healthy scenario, full per-layer records
drows=""
for steps in 200 1000 4000; do
  "$bin" run --scenario healthy --steps "$steps" --trace -q -o "$work/a.h5" >/dev/null 2>&1
  "$bin" run --scenario healthy --steps "$steps" --precision fp32 --trace -q -o "$work/b.h5" >/dev/null 2>&1
  nrec=$("$py" -c "import h5py,sys; print(h5py.File(sys.argv[1],'r')['records'].shape[0])" "$work/a.h5")
  res=$(/usr/bin/time -f "%e %M" "$bin" diff "$work/a.h5" "$work/b.h5" 2>&1 >/dev/null | tail -1)
  read -r secs rss <<<"$res"
  drows="$drows| $steps | $nrec | $secs s | $((rss / 1024)) MiB |
"
done

cpu=$(grep -m1 "model name" /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')
out=$(cat <<EOF
# bisect and diff benchmark

\`bench/bisect.sh\`, $(date -u +%Y-%m-%d) UTC, $(nproc) CPU(s) ($cpu), CPU
trainer, default failure criteria, trials in flight-recorder mode; wall time
is the median of $reps runs of the whole bisection (premises included).
Load average when it started: $load0 (other work shares these CPUs).

| candidates | trials, -j 1 | wall, -j 1 | trials, -j 2 | wall, -j 2 | minimal set |
| --- | --- | --- | --- | --- | --- |
$rows
Trials = runs that finished (3 premises + ddmin's); with -j 2 a round's sets
run two at a time and the ones after the first passing set are cancelled, so
a parallel bisection may start more trials than a sequential one (speculation)
while returning the same set. On a machine shared with other builds the -j 2
speed-up is below 2x: every trial is a separate \`ampprobe run\` process.

## diff: time and memory against trace length

\`ampprobe diff A.h5 B.h5\` on the healthy scenario's FP16 and FP32 full
traces (9 layers, 50 records per step per trace); time and peak RSS from
GNU time. Both traces are
streamed in chunks in step order, so the peak RSS stays flat while the
trace grows 20-fold.

| steps | records per trace | diff time | peak RSS |
| --- | --- | --- | --- |
$drows
EOF
)
echo "$out"
[ -n "$md" ] && echo "$out" >"$md"
exit 0
