#!/usr/bin/env bash
# tests/tools/scale_layers.sh - postmortem, diff and report grow linearly
# with the number of layers: the time at 4N layers over the time at N is
# about 4 (some less: start-up), not 16. Each used to be quadratic: the
# post-mortem scanned a step's records once per layer (50,000 layers x 5
# steps: 93 s), diff matched names by a scan of B per layer of A (2^20
# layers: about an hour). A ratio, measured side by side in one run, so
# the check holds on a slow or loaded machine; label timing, run serially.
#
# usage: scale_layers.sh AMPPROBE_BINARY MANY_LAYERS_TRACE
set -u
BIN=${1:?usage: scale_layers.sh AMPPROBE_BINARY MANY_LAYERS_TRACE}
GEN=${2:?usage: scale_layers.sh AMPPROBE_BINARY MANY_LAYERS_TRACE}
WORK=$(mktemp -d /tmp/ampprobe-scale-layers.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
FAILS=0
N=16000
MAX_RATIO=9 # linear: ~4; quadratic: ~16 (times net of the start-up)

secs() { # command... -> wall seconds (3 decimals)
  local t0 t1
  t0=$(date +%s.%N)
  "$@" >/dev/null 2>&1
  t1=$(date +%s.%N)
  echo "$t0 $t1" | awk '{printf "%.3f", $2 - $1}'
}

for n in 10 $N $((4 * N)); do
  "$GEN" "$WORK/a$n.h5" "$n" 3 1 && "$GEN" "$WORK/b$n.h5" "$n" 3 1.01 ||
    { echo "FAIL: could not write $n-layer traces"; exit 1; }
done
check() { # what command-args-with-@N@
  local what=$1 t0 t1 t4
  shift
  local a0=() a1=() a4=()
  for x in "$@"; do
    a0+=("${x//@N@/10}"); a1+=("${x//@N@/$N}"); a4+=("${x//@N@/$((4 * N))}")
  done
  t0=$(secs "$BIN" "${a0[@]}") # the start-up (libraries, CUDA stubs)
  t1=$(secs "$BIN" "${a1[@]}")
  t4=$(secs "$BIN" "${a4[@]}")
  local ratio
  ratio=$(awk -v a="$t4" -v b="$t1" -v z="$t0" \
    'BEGIN { a -= z; b -= z; if (b < 0.05) b = 0.05; printf "%.1f", a / b }')
  if awk -v r="$ratio" -v m="$MAX_RATIO" 'BEGIN { exit !(r <= m) }'; then
    echo "ok:   $what: 10 layers ${t0}s, $N ${t1}s, $((4 * N)) ${t4}s (x$ratio net of the 10)"
  else
    echo "FAIL: $what: 10 layers ${t0}s, $N ${t1}s, $((4 * N)) ${t4}s (x$ratio net of the 10 > $MAX_RATIO: not linear)"
    FAILS=$((FAILS + 1))
  fi
}
check postmortem postmortem "$WORK/a@N@.h5"
check diff diff "$WORK/a@N@.h5" "$WORK/b@N@.h5"
"$BIN" postmortem "$WORK/a$((4 * N)).h5" >/dev/null 2>&1
rc=$?
[ "$rc" = 0 ] && echo "ok:   postmortem of $((4 * N)) layers: healthy, exit 0" ||
  { echo "FAIL: postmortem of $((4 * N)) layers: exit $rc"; FAILS=$((FAILS + 1)); }
echo "$FAILS failure(s)"
[ "$FAILS" = 0 ]
