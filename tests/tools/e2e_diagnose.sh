#!/usr/bin/env bash
# tests/tools/e2e_diagnose.sh - the post-mortem on models the zoo does not
# have (issue 15, classes 1, 2, 3 and 6), driving the real trainer and the
# real `ampprobe postmortem` on the configs of tests/tools/scenarios/.
#
#   class 1  silent faults: a LayerNorm whose FP16 variance overflows (three
#            models), a BatchNorm whose FP16 variance rounds to 0, the zoo's
#            bn-overflow: verdict degraded (exit 1), never "healthy"; the
#            FP16 loss is checked to be well above the FP32 run's (the fault
#            is real). Controls (ln-healthy, bn-relu-healthy) stay healthy.
#   class 2  overflow, not underflow-to-inf: Linear layers fed by ReLU/GELU
#            (zeros in their input, absmax < 256) whose product overflows.
#   class 3  clipping after unscaling with nothing comparable: no
#            fix-clip-order; the clip order comes from the stored config.
#   class 6  clamps are not backoffs; inf/nan are strings in --json.
#   class 7  BF16 (FP32's range): its overflows are not-precision, its
#            values not measured against FP16's limits; FP16 unchanged.
# Each expectation failed on the tree before this change (see the report
# in the commit message); the zoo's answers are tests/tools/test_e2e.c's.
#
# usage: e2e_diagnose.sh AMPPROBE_BINARY SCENARIO_DIR
set -u
BIN=${1:?usage: e2e_diagnose.sh AMPPROBE_BINARY SCENARIO_DIR}
DIR=${2:?usage: e2e_diagnose.sh AMPPROBE_BINARY SCENARIO_DIR}
PY=/usr/bin/python3
WORK=$(mktemp -d /tmp/ampprobe-e2e-diag.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
FAILS=0
fail() { echo "FAIL: $*"; FAILS=$((FAILS + 1)); }
pass() { echo "ok:   $*"; }
jget() { "$PY" -c "import json,sys; d=json.load(open(sys.argv[1])); print($2)" "$1"; }

# record NAME [PRECISION] -> $WORK/NAME-PRECISION.h5 (full trace)
record() {
  local p=${2:-fp16}
  "$BIN" run --config "$DIR/$1.json" --precision "$p" --trace -q \
    -o "$WORK/$1-$p.h5" --json >"$WORK/$1-$p.run.json" 2>"$WORK/$1-$p.err"
  [ -f "$WORK/$1-$p.h5" ] || fail "$1 ($p): no trace: $(cat "$WORK/$1-$p.err")"
}

# pm NAME -> $WORK/NAME.json (+ .txt), RC
pm() {
  "$BIN" postmortem "$WORK/$1-fp16.h5" --json >"$WORK/$1.json" 2>"$WORK/$1.pmerr"
  RC=$?
  "$BIN" postmortem "$WORK/$1-fp16.h5" >"$WORK/$1.txt" 2>&1
}

# ---- class 1: silent faults --------------------------------------------------
silent() { # NAME LAYER KIND [TOP: the first finding, force-fp32 unless said]
  local want=${4:-force-fp32}
  record "$1" fp16
  record "$1" fp32
  pm "$1"
  local v top first cand ratio
  v=$(jget "$WORK/$1.json" "d['verdict']")
  top=$(jget "$WORK/$1.json" "d['diagnosis'][0]['id']")
  first=$(jget "$WORK/$1.json" "d['silent_faults']['first_layer']")
  cand=$(jget "$WORK/$1.json" "d['fp32_candidates']")
  ratio=$("$PY" -c "import json,sys; a=json.load(open(sys.argv[1]))['final_loss']; b=json.load(open(sys.argv[2]))['final_loss']; print('%.2f' % (a/b))" \
    "$WORK/$1-fp16.run.json" "$WORK/$1-fp32.run.json")
  if [ "$RC" = 1 ] && [ "$v" = degraded ] && [ "$top" = "$want" ] &&
     [ "$first" = "$2" ] && [ "$cand" = "$3" ] &&
     ! grep -qE "^verdict +healthy|\[healthy\]" "$WORK/$1.txt" &&
     "$PY" -c "import sys; sys.exit(0 if float(sys.argv[1]) >= 1.5 else 1)" "$ratio"; then
    pass "$1: degraded (exit 1), silent fault at $first, candidates $cand; FP16 loss ${ratio}x FP32"
  else
    fail "$1: verdict '$v' exit $RC top '$top' layer '$first' candidates '$cand' loss ratio $ratio (expected degraded/$want at $2, $3, ratio >= 1.5)"
  fi
}
silent ln-overflow-raw enc.ln0 layernorm
silent ln-overflow-deep enc.ln1 layernorm
silent ln-overflow-classify stem.ln layernorm
# its series vary by less than FP16's spacing at their level: data-resolution
# names the data and enc.bn0 (the first FP16 layer) above the collapse
silent bn-var-zero-series enc.bn0 bn data-resolution

# the zoo's bn-overflow: the inf is in the saved variance, the loss finite
"$BIN" run --scenario bn-overflow --trace -q -o "$WORK/bn-overflow-fp16.h5" >/dev/null 2>&1
pm bn-overflow
v=$(jget "$WORK/bn-overflow.json" "d['verdict']")
if [ "$RC" = 1 ] && [ "$v" = degraded ] && grep -q "^verdict     degraded" "$WORK/bn-overflow.txt"; then
  pass "bn-overflow: verdict degraded"
else
  fail "bn-overflow: verdict '$v' exit $RC"
fi

for c in ln-healthy bn-relu-healthy; do
  record "$c" fp16
  pm "$c"
  v=$(jget "$WORK/$c.json" "d['verdict']")
  if [ "$RC" = 0 ] && [ "$v" = healthy ]; then
    pass "$c: healthy (control)"
  else
    fail "$c: verdict '$v' exit $RC; expected healthy: $(jget "$WORK/$c.json" "d['diagnosis'][0]['title']")"
  fi
done

# ---- class 2: overflow is not underflow-to-inf --------------------------------
overflow() { # NAME LAYER KIND
  record "$1" fp16
  pm "$1"
  local k o
  k=$(jget "$WORK/$1.json" "d['event']['kind']")
  o=$(jget "$WORK/$1.json" "d['event'].get('origin_layer')")
  if [ "$k" = "$3" ] && [ "$o" = "$2" ]; then
    pass "$1: $k at $o ($(jget "$WORK/$1.json" "d['event']['evidence']"))"
  else
    fail "$1: event '$k' at '$o', expected $3 at $2"
  fi
}
overflow relu-linear-overflow enc.fc1 overflow
overflow gelu-linear-overflow blk.fc1 overflow
overflow relu-linear-deep mlp.fc2 overflow
overflow relu-attention-overflow enc.attn reduction-overflow

# ---- class 3: no clip-order finding without evidence ---------------------------
for c in clip-order-ok-scale2 clip-order-ok-scale3 clip-order-ok-classify; do
  record "$c" fp16
  pm "$c"
  ids=$(jget "$WORK/$c.json" "','.join(x['id'] for x in d['diagnosis'])")
  order=$(jget "$WORK/$c.json" "d['clipping']['clip_order']")
  cmp=$(jget "$WORK/$c.json" "d['clipping']['norm_compared_steps']")
  if [ "$order" = after-unscale ] && [ "$cmp" = 0 ] && [[ "$ids" != *fix-clip-order* ]] &&
     ! grep -q "track the scale" "$WORK/$c.txt"; then
    pass "$c: clip order from the config (after unscaling), no fix-clip-order ($ids)"
  else
    fail "$c: findings '$ids', clip order '$order', compared steps $cmp"
  fi
done

# ---- class 6: clamps vs backoffs, inf in JSON -----------------------------------
"$BIN" run --scenario softmax-underflow --min-scale 1 --trace -q -o "$WORK/smu-fp16.h5" >/dev/null 2>&1
pm smu
b=$(jget "$WORK/smu.json" "d['scaler']['backoffs']")
c=$(jget "$WORK/smu.json" "d['scaler']['min_clamps']")
shown=$(grep -c "^  backoff     step" "$WORK/smu.txt")
more=$(grep "^  \.\.\. " "$WORK/smu.txt")
last=$(jget "$WORK/smu.json" "repr(d['loss']['last'])")
if [ "$c" -gt 0 ] && [[ "$more" == *"$((b - shown)) more backoffs, $c more min-scale clamps"* ]]; then
  pass "softmax-underflow --min-scale 1: $b backoffs and $c clamps told apart ($more)"
else
  fail "softmax-underflow --min-scale 1: $b backoffs, $c clamps, $shown shown, line '$more'"
fi
if [ "$last" = "'inf'" ]; then
  pass "an infinite loss is \"inf\" in --json"
else
  fail "final loss in --json is $last, expected 'inf'"
fi

# ---- class 7: BF16 has FP32's range (hunt /tmp/hunt_bf F2, F3, F7) -------------
# An overflow in BF16 is an overflow of FP32 too: not-precision, never
# "keep it in FP32" or a bisect; BF16 values are not measured against
# FP16's 65504. The FP16 run of the same config keeps force-fp32.
record gelu-linear-overflow bf16
"$BIN" postmortem "$WORK/gelu-linear-overflow-bf16.h5" --json >"$WORK/glo-bf16.json" 2>/dev/null
"$BIN" postmortem "$WORK/gelu-linear-overflow-bf16.h5" >"$WORK/glo-bf16.txt" 2>&1
ids=$(jget "$WORK/glo-bf16.json" "','.join(x['id'] for x in d['diagnosis'])")
np=$(jget "$WORK/glo-bf16.json" "[x['title'] for x in d['diagnosis'] if x['id'] == 'not-precision'][:1]")
# its weights grew before the overflow (the lr signature): lower-lr says
# it; else not-precision must
if { [[ "$ids" == lower-lr* ]] || [[ "$np" == *"BF16 has FP32's range"* ]]; } &&
   [[ ",$ids," != *,force-fp32,* ]] && ! grep -q "bisect" "$WORK/glo-bf16.txt" &&
   ! grep -q "keep it in FP32" "$WORK/glo-bf16.txt"; then
  pass "gelu-linear-overflow (bf16): no force-fp32, no bisect ($ids)"
else
  fail "gelu-linear-overflow (bf16): findings '$ids', not-precision title '$np'"
fi
if ! grep -q "65504" "$WORK/glo-bf16.txt" && ! grep -q "would flush in FP16" "$WORK/glo-bf16.txt" &&
   grep -q "headroom log2(3.39e38 (BF16)/absmax)" "$WORK/glo-bf16.txt"; then
  pass "gelu-linear-overflow (bf16): headroom against BF16's maximum, no FP16 flush count"
else
  fail "gelu-linear-overflow (bf16): FP16's limits in the text: $(grep -E '65504|flush in FP16' "$WORK/glo-bf16.txt" | head -3)"
fi
"$BIN" postmortem "$WORK/gelu-linear-overflow-fp16.h5" --json >"$WORK/glo-fp16.json" 2>/dev/null
top=$(jget "$WORK/glo-fp16.json" "d['diagnosis'][0]['id']")
if [ "$top" = force-fp32 ]; then
  pass "gelu-linear-overflow (fp16): force-fp32 as before"
else
  fail "gelu-linear-overflow (fp16): top finding '$top', expected force-fp32"
fi
"$BIN" run --scenario lr-too-high --precision bf16 --trace -q -o "$WORK/lrh-bf16.h5" >/dev/null 2>&1
"$BIN" postmortem "$WORK/lrh-bf16.h5" --json >"$WORK/lrh-bf16.json" 2>/dev/null
"$BIN" postmortem "$WORK/lrh-bf16.h5" >"$WORK/lrh-bf16.txt" 2>&1
ids=$(jget "$WORK/lrh-bf16.json" "','.join(x['id'] for x in d['diagnosis'])")
if [[ "$ids" == lower-lr* ]] && [[ ",$ids," != *,force-fp32,* ]] &&
   ! grep -q "FP16 upstream" "$WORK/lrh-bf16.txt" && ! grep -q "bisect" "$WORK/lrh-bf16.txt" &&
   ! grep -q "65504" "$WORK/lrh-bf16.txt"; then
  pass "lr-too-high (bf16): lower-lr, no force-fp32, no 'FP16 upstream' ($ids)"
else
  fail "lr-too-high (bf16): findings '$ids'; $(grep -E 'FP16 upstream|bisect|65504' "$WORK/lrh-bf16.txt" | head -3)"
fi

# A BF16 run's commands to paste rerun and bisect it in BF16: bisect's
# trials are FP16 without --precision bf16, another run (hunt_bf F5). Its
# FP32 baseline carries one --precision only. The FP16 run's do not change.
record bn-var-zero-series bf16
"$BIN" postmortem "$WORK/bn-var-zero-series-bf16.h5" >"$WORK/bvz-bf16.txt" 2>&1
bis=$(grep -o "ampprobe bisect [^;']*" "$WORK/bvz-bf16.txt" | head -1)
b32=$(grep -o "'ampprobe run --precision fp32 [^']*'" "$WORK/bvz-bf16.txt" | head -1)
bis16=$(grep -o "ampprobe bisect [^;']*" "$WORK/bn-var-zero-series.txt" | head -1)
if [[ "$bis" == *" --precision bf16"* ]] && [[ "$b32" != *bf16* ]] &&
   [ -n "$bis16" ] && [[ "$bis16" != *--precision* ]]; then
  pass "bn-var-zero-series (bf16): '$bis'; the FP16 run's has no --precision"
else
  fail "bn-var-zero-series (bf16): bisect '$bis', FP32 baseline '$b32', FP16 run's bisect '$bis16'"
fi

echo
if [ "$FAILS" -gt 0 ]; then
  echo "$FAILS check(s) failed"
  exit 1
fi
echo "all checks passed"
