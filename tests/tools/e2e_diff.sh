#!/usr/bin/env bash
# tests/tools/e2e_diff.sh - end-to-end tests of `ampprobe diff`, driving the
# real binary on traces it records itself: FP16 against the FP32 baseline on
# revin-overflow (the error is introduced at RevIN), grad-underflow (the
# gradients that flush to zero), healthy (agreement within tolerance), two
# traces that do not align, and bad input with its exit codes.
#
# usage: e2e_diff.sh AMPPROBE_BINARY
set -u
BIN=${1:?usage: e2e_diff.sh AMPPROBE_BINARY}
BIN=$(cd "$(dirname "$BIN")" && pwd)/$(basename "$BIN") # tests cd elsewhere
PY=/usr/bin/python3
WORK=$(mktemp -d /tmp/ampprobe-e2e-diff.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
FAILS=0
fail() { echo "FAIL: $*"; FAILS=$((FAILS + 1)); }
pass() { echo "ok:   $*"; }
jget() { "$PY" -c "import json,sys; d=json.load(open(sys.argv[1])); print($2)" "$1"; }

record() { # scenario -> $WORK/<scenario>-16.h5 and -32.h5 (full traces)
  "$BIN" run --scenario "$1" --trace -q -o "$WORK/$1-16.h5" >/dev/null 2>&1
  "$BIN" run --scenario "$1" --trace -q --precision fp32 -o "$WORK/$1-32.h5" >/dev/null 2>&1
  [ -f "$WORK/$1-16.h5" ] && [ -f "$WORK/$1-32.h5" ] || fail "$1: could not record the traces"
}

diff_json() { # scenario -> $WORK/<scenario>.json, RC
  "$BIN" diff "$WORK/$1-16.h5" "$WORK/$1-32.h5" --json >"$WORK/$1.json" 2>"$WORK/$1.err"
  RC=$?
}

# revin-overflow: the introduction point is the RevIN layer, a local error
record revin-overflow
diff_json revin-overflow
intro=$(jget "$WORK/revin-overflow.json" "d['divergence']['introduction_point']['layer']")
kind=$(jget "$WORK/revin-overflow.json" "[r['kind'] for r in d['layers'] if r['layer']==d['divergence']['introduction_point']['layer']][0]")
local_=$(jget "$WORK/revin-overflow.json" "d['divergence']['introduction_point']['local']")
if [ "$RC" = 1 ] && [ "$kind" = revin ] && [ "$local_" = True ]; then
  pass "revin-overflow: error introduced at $intro (kind $kind, local)"
else
  fail "revin-overflow: expected the introduction point at a revin layer, got '$intro' ($kind) exit $RC"
fi
first=$(jget "$WORK/revin-overflow.json" "d['layers'][0]['kind']")
[ "$first" = revin ] && pass "revin-overflow: the table starts at RevIN" \
  || fail "revin-overflow: first row is a $first layer"
"$BIN" diff "$WORK/revin-overflow-16.h5" "$WORK/revin-overflow-32.h5" >"$WORK/r.txt"
grep -q "^verdict: DIVERGE" "$WORK/r.txt" && grep -q "error introduced at $intro" "$WORK/r.txt" \
  && pass "revin-overflow: text verdict on top" || fail "revin-overflow: text verdict"

# softmax-underflow: the softmax output underflows to zero; the loss's log
# turns that into inf downstream (carried, not introduced, there)
record softmax-underflow
diff_json softmax-underflow
kind=$(jget "$WORK/softmax-underflow.json" "[r['kind'] for r in d['layers'] if r['layer']==d['divergence']['introduction_point']['layer']][0]")
za=$(jget "$WORK/softmax-underflow.json" "d['divergence']['introduction_point']['zero_frac_a'] > d['divergence']['introduction_point']['zero_frac_b'] + 0.05")
if [ "$RC" = 1 ] && [ "$kind" = softmax ] && [ "$za" = True ]; then
  pass "softmax-underflow: error introduced at the softmax (values underflowed to zero)"
else
  fail "softmax-underflow: introduction point is a $kind layer (zeros A>B: $za), exit $RC"
fi

# grad-underflow: the layers whose gradients flush to zero are named
record grad-underflow
diff_json grad-underflow
flush=$(jget "$WORK/grad-underflow.json" "','.join(sorted({r['layer'] for r in d['layers'] if r['flushes_to_zero']}))")
allgrad=$(jget "$WORK/grad-underflow.json" "all(r['site'] in ('grad_in','grad_out','weight_grad') for r in d['layers'] if r['flushes_to_zero'])")
isite=$(jget "$WORK/grad-underflow.json" "d['divergence']['introduction_point']['site']")
if [ "$RC" = 1 ] && [ -n "$flush" ] && [ "$allgrad" = True ] &&
   jget "$WORK/grad-underflow.json" "d['summary']" | grep -q "flush to zero in A" &&
   case "$isite" in grad_*|weight_grad) true ;; *) false ;; esac; then
  pass "grad-underflow: gradients flush to zero in {$flush}; introduced at $isite"
else
  fail "grad-underflow: expected flushing gradient layers, got {$flush} intro site $isite exit $RC"
fi
# ...and those are the layers where B's gradients are mostly non-zero
zeros=$(jget "$WORK/grad-underflow.json" "min(r['zero_frac_a']-r['zero_frac_b'] for r in d['layers'] if r['flushes_to_zero'])")
"$PY" -c "import sys; sys.exit(0 if float(sys.argv[1]) >= 0.05 else 1)" "$zeros" \
  && pass "grad-underflow: zero fraction A exceeds B by >= 5 points on each ($zeros)" \
  || fail "grad-underflow: zero fractions $zeros"

# healthy: agreement within tolerance, exit 0, -o written
record healthy
"$BIN" diff "$WORK/healthy-16.h5" "$WORK/healthy-32.h5" -o "$WORK/h.json" >"$WORK/h.txt" 2>&1
RC=$?
if [ "$RC" = 0 ] && grep -q "agree within tolerance" "$WORK/h.txt" &&
   [ "$(jget "$WORK/h.json" "d['verdict']")" = agree ]; then
  pass "healthy: agreement within tolerance ($(jget "$WORK/h.json" "round(max(r['max_window_rel'] for r in d['layers']),4)") largest windowed difference)"
else
  fail "healthy: expected agreement, got exit $RC: $(sed -n 6p "$WORK/h.txt")"
fi
# scaled-gradient overflows: normal loss scaling only when the scaler
# recovered (healthy: one backoff early on); revin-overflow's scaler backs
# off at every step to 0 and never does
if grep -q "skipped (normal dynamic loss scaling: it recovered)" "$WORK/h.txt"; then
  pass "healthy: the skipped overflow is normal dynamic loss scaling"
else
  fail "healthy: note on skipped overflows: $(grep "scaler skipped" "$WORK/h.txt")"
fi
ronote=$(jget "$WORK/revin-overflow.json" "' | '.join(n for n in d['alignment']['notes'] if 'scaler skipped' in n)")
if echo "$ronote" | grep -q "did not recover" &&
   ! echo "$ronote" | grep -q "(normal dynamic loss scaling" &&
   [ "$(jget "$WORK/revin-overflow.json" "d['alignment']['trailing_skipped_steps_a']")" = 150 ]; then
  pass "revin-overflow: the collapsed scaler is not called normal"
else
  fail "revin-overflow: note on skipped overflows: $ronote"
fi

# BF16 against FP32 (hunt F4): healthy BF16 runs agree. They were DIVERGE,
# "values underflowed to zero", on 2 exact zeros of a 32-value tensor (on
# the FP32 side in bn-overflow) and on zeros from BF16 rounding p to 1.0
# (softmax-underflow); BF16's coarser rounding needs its own threshold
# (two-culprits 0.38). The FP16 runs of the same scenarios still diverge,
# and so does a BF16 run with a real fault (lr-too-high).
SCN=$(cd "$(dirname "$0")" && pwd)/scenarios
rec_prec() { # name precision [run args...] -> $WORK/<name>-<precision>.h5
  local n=$1 p=$2
  shift 2
  "$BIN" run "$@" --precision "$p" --trace -q -o "$WORK/$n-$p.h5" >/dev/null 2>&1 ||
    [ -f "$WORK/$n-$p.h5" ] || fail "$n: could not record $p"
}
for s in bn-overflow grad-underflow softmax-underflow two-culprits bn-relu-healthy lr-too-high; do
  if [ "$s" = bn-relu-healthy ]; then set -- --config "$SCN/$s.json"; else set -- --scenario "$s"; fi
  for p in bf16 fp16 fp32; do rec_prec "$s" "$p" "$@"; done
  "$BIN" diff "$WORK/$s-bf16.h5" "$WORK/$s-fp32.h5" --json >"$WORK/$s-bf.json" 2>/dev/null
  RCB=$?
  "$BIN" diff "$WORK/$s-fp16.h5" "$WORK/$s-fp32.h5" --json >"$WORK/$s-fp.json" 2>/dev/null
  RCF=$?
  sumb=$(jget "$WORK/$s-bf.json" "d['summary']")
  if [ "$s" = lr-too-high ]; then
    [ "$RCB" = 1 ] && [ "$(jget "$WORK/$s-bf.json" "d['verdict']")" = diverge ] \
      && pass "$s: BF16 against FP32 still diverges (a real fault): ${sumb:0:90}" \
      || fail "$s: BF16 against FP32: exit $RCB: $sumb"
    continue
  fi
  if [ "$RCB" = 0 ] && ! echo "$sumb" | grep -qi "underflow" &&
     [ "$(jget "$WORK/$s-bf.json" "d['threshold_format']")" = BF16 ]; then
    pass "$s: BF16 against FP32 agrees (${sumb:0:100}...)"
  else
    fail "$s: BF16 against FP32: exit $RCB: $sumb"
  fi
  want=1 # each diverges in FP16 (bn-relu-healthy: an inf in enc.bn's FP16
         # grad_in at step 0, as before)
  [ "$RCF" = "$want" ] && pass "$s: FP16 against FP32 exit $RCF, as before" \
    || fail "$s: FP16 against FP32: exit $RCF (expected $want): $(jget "$WORK/$s-fp.json" "d['summary']")"
done
# the FP16 underflow is still called so, with its format
jget "$WORK/softmax-underflow-fp.json" "d['summary']" | grep -q "values underflowed to zero in A (FP16)" \
  && pass "softmax-underflow: FP16's zeros are underflow in A (FP16)" \
  || fail "softmax-underflow FP16: $(jget "$WORK/softmax-underflow-fp.json" "d['summary']")"

# the same trace against itself: zero difference everywhere
"$BIN" diff "$WORK/healthy-16.h5" "$WORK/healthy-16.h5" --json >"$WORK/same.json"
[ "$(jget "$WORK/same.json" "max(r['max_rel_absmax']+r['max_rel_rms'] for r in d['layers'])")" = 0.0 ] \
  && pass "a trace against itself: no difference" || fail "a trace against itself differs"

# traces that do not align: different models and configs, said clearly
"$BIN" diff "$WORK/healthy-16.h5" "$WORK/revin-overflow-32.h5" --json >"$WORK/na.json"
RC=$?
notes=$(jget "$WORK/na.json" "' | '.join(d['alignment']['notes'])")
if [ "$RC" = 1 ] && echo "$notes" | grep -q "layer lists differ" &&
   echo "$notes" | grep -q "beyond the precision policy"; then
  pass "unaligned traces: the layer lists and configs that differ are named"
else
  fail "unaligned traces: exit $RC, notes: $notes"
fi

# no readable configuration (an external job's trace, a key too long to
# read): the config is "not compared", never "identical" (it said identical
# with two notes saying neither config could be read); one side missing too
cp "$WORK/revin-overflow-16.h5" "$WORK/nocfg-a.h5"
cp "$WORK/revin-overflow-32.h5" "$WORK/nocfg-b.h5"
"$PY" -c "
import h5py
for fn in ('$WORK/nocfg-a.h5', '$WORK/nocfg-b.h5'):
    f = h5py.File(fn, 'r+'); f.attrs['config_json'] = ''; f.close()"
for pair in "nocfg-a nocfg-b" "nocfg-a revin-overflow-32"; do
  set -- $pair
  "$BIN" diff "$WORK/$1.h5" "$WORK/$2.h5" >"$WORK/nocfg.txt" 2>&1
  "$BIN" diff "$WORK/$1.h5" "$WORK/$2.h5" --json >"$WORK/nocfg.json" 2>&1
  if grep -q "^  config          not compared (a trace holds no readable configuration" "$WORK/nocfg.txt" &&
     ! grep -q "identical" "$WORK/nocfg.txt" &&
     [ "$(jget "$WORK/nocfg.json" "d['alignment']['config_compared']")" = False ]; then
    pass "$1 vs $2: config not compared, not identical"
  else
    fail "$1 vs $2: $(grep -E '^  (config|note)' "$WORK/nocfg.txt")"
  fi
done
"$BIN" diff "$WORK/revin-overflow-16.h5" "$WORK/revin-overflow-32.h5" --json >"$WORK/cfgc.json"
[ "$(jget "$WORK/cfgc.json" "d['alignment']['config_compared']")" = True ] &&
  pass "readable configs: config_compared true" || fail "readable configs: config_compared not true"

# the same config written by another writer (Python's json.dumps: 1e-05
# where the C trainer wrote 1.0000000000000001e-5) is the same config: diff
# compared values as JSON text ("6 differences beyond the precision
# policy", "the traces may not be comparable") while report --baseline
# called them equal. Both now compare numbers as numbers, and both still
# see a value that really changed.
reserialise() { # SRC DST PYTHON(c) [FROM TO]: DST is SRC, its config
  # edited by PYTHON and re-serialised by json.dumps, then FROM replaced
  # by TO in that text
  cp "$1" "$2"
  "$PY" -c "
import h5py, json, sys
with h5py.File(sys.argv[1], 'r+') as f:
    c = json.loads(f.attrs['config_json'])
    $3
    f.attrs['config_json'] = json.dumps(c).replace(sys.argv[2], sys.argv[3])" "$2" "${4:-@@}" "${5:-@@}"
}
R16=$WORK/revin-overflow-16.h5 R32=$WORK/revin-overflow-32.h5
reserialise "$R16" "$WORK/py16.h5" "pass"
reserialise "$R32" "$WORK/py32.h5" "pass" '1e-05' '0.00001000'
grep -q 1e-05 <("$PY" -c "import h5py; print(h5py.File('$WORK/py16.h5')['/'].attrs['config_json'])") ||
  fail "the re-serialised config does not write 1e-05"
for pair in "py16 revin-overflow-32" "revin-overflow-16 py32" "py16 py32"; do
  set -- $pair
  "$BIN" diff "$WORK/$1.h5" "$WORK/$2.h5" >"$WORK/rs.txt" 2>&1
  "$BIN" diff "$WORK/$1.h5" "$WORK/$2.h5" --json >"$WORK/rs.json" 2>&1
  "$BIN" report "$WORK/$1.h5" --baseline "$WORK/$2.h5" -o "$WORK/rs.html" -q 2>"$WORK/rs.err"
  rows=$(jget "$WORK/rs.json" "','.join(r['key'] for r in d['alignment']['config_differences'])")
  if grep -q "^  config          1 difference (precision policy only)" "$WORK/rs.txt" &&
     ! grep -q "may not be comparable" "$WORK/rs.txt" && [ "$rows" = precision ] &&
     ! grep -q "warning" "$WORK/rs.err"; then
    pass "$1 vs $2 (one config, two writers): diff and report agree, precision only"
  else
    fail "$1 vs $2: diff rows {$rows}, $(grep -E '^  (config|note)' "$WORK/rs.txt" | head -3) report: $(cat "$WORK/rs.err")"
  fi
done
for change in "c['seed'] = c['seed'] + 1" "c['model'][0]['eps'] = 2e-05" "c['optimizer']['lr'] = c['optimizer']['lr'] * (1 + 2**-40)"; do
  reserialise "$R32" "$WORK/chg32.h5" "$change"
  "$BIN" diff "$WORK/py16.h5" "$WORK/chg32.h5" >"$WORK/rs.txt" 2>&1
  "$BIN" report "$WORK/py16.h5" --baseline "$WORK/chg32.h5" -o "$WORK/rs.html" -q 2>"$WORK/rs.err"
  if grep -q "^  config          2 differences (beyond the precision policy)" "$WORK/rs.txt" &&
     grep -q "differ in more than precision" "$WORK/rs.err"; then
    pass "a real change ($change): diff and report both see it"
  else
    fail "a real change ($change): $(grep -E '^  config' "$WORK/rs.txt") report: $(cat "$WORK/rs.err")"
  fi
done

# docs/cli.md's diff sessions are the real output (they showed an older
# wording: "non-finite on one side", "100.00% apart" for an inf loss):
# each example's block, numbers masked (BLAS may move a last digit), equals
# what the command prints on the same scenario
DOC=$(cd "$(dirname "$0")/../.." && pwd)/docs/cli.md
mask() { sed -E 's/[0-9][0-9.e+-]*/N/g; s/ +/ /g'; }
doc_example() { # doc_example 'COMMAND' FILE: the doc's output of COMMAND
  awk -v c="\$ $1" '$0 == c {on = 1; next} on && /^```/ {exit} on' "$DOC" >"$2"
}
(cd "$WORK" && cp revin-overflow-16.h5 fp16.h5 && cp revin-overflow-32.h5 fp32.h5 &&
  cp healthy-16.h5 h16.h5 && cp healthy-32.h5 h32.h5)
for ex in "diff fp16.h5 fp32.h5 --top 8" "diff h16.h5 h32.h5 --top 5"; do
  doc_example "ampprobe $ex" "$WORK/doc.txt"
  (cd "$WORK" && "$BIN" $ex >real.txt 2>&1)
  if [ -s "$WORK/doc.txt" ] && [ "$(mask <"$WORK/doc.txt")" = "$(mask <"$WORK/real.txt")" ]; then
    pass "docs/cli.md's 'ampprobe $ex' is the real output"
  else
    fail "docs/cli.md's 'ampprobe $ex' differs from the real output:
$(diff "$WORK/doc.txt" "$WORK/real.txt" | head -12)"
  fi
done

# nan-input: both runs read a NaN at step 50; A's scaler skips that step,
# the FP32 baseline (no scaler: found_inf without a skip) applies the NaN
# gradients. Only A's skipped step is left out; B's NaN gradients from then
# on diverge from A's finite ones (they were hidden as "normal loss
# scaling" when found_inf alone meant a skip)
record nan-input
diff_json nan-input
left=$(jget "$WORK/nan-input.json" "d['alignment']['scaler_overflow_records']")
hg=$(jget "$WORK/nan-input.json" "[(r['first_divergence_step'], r['first_nonfinite_a'], r['first_nonfinite_b']) for r in d['layers'] if r['layer']=='head.fc' and r['site']=='grad_in'][0]")
side=$(jget "$WORK/nan-input.json" "d['divergence']['introduction_point']['nonfinite_side']")
if [ "$RC" = 1 ] && [ "$hg" = "(51, 50, 50)" ] && [ "$side" = b ] && [ "$left" -gt 0 ] && [ "$left" -le 30 ] &&
   jget "$WORK/nan-input.json" "d['summary']" | grep -q "non-finite in B only"; then
  pass "nan-input: B's unskipped NaN gradients diverge from step 51; $left records of A's skipped step left out; introduced in B"
else
  fail "nan-input: head.fc grad_in (div, nonfin A, nonfin B) $hg, left out $left, side $side, exit $RC: $(jget "$WORK/nan-input.json" "d['summary']")"
fi
fl=$(jget "$WORK/nan-input.json" "d['loss']['final_rel']")
[ "$fl" = None ] && "$BIN" diff "$WORK/nan-input-16.h5" "$WORK/nan-input-32.h5" | grep -q "final .*not comparable" &&
  pass "nan-input: final losses with a NaN are not comparable (not '0% apart')" ||
  fail "nan-input: final_rel $fl"

# the same model with layers renamed: NOT ALIGNED (exit 1), never AGREE
SCEN=$(cd "$(dirname "$0")/../../trainer/scenarios" && pwd)
cp "$SCEN/healthy.json" "$WORK/h.cfg"
if [ -s "$WORK/h.cfg" ]; then
  "$PY" - "$WORK/h.cfg" "$WORK/ren.cfg" <<'PYEOF'
import json, sys
c = json.load(open(sys.argv[1]))
for m in c['model']:
    if m.get('name') == 'head.fc':
        m['name'] = 'head.out'
json.dump(c, open(sys.argv[2], 'w'))
PYEOF
  "$BIN" run --config "$WORK/ren.cfg" --trace -q -o "$WORK/ren-16.h5" >/dev/null 2>&1
  "$BIN" diff "$WORK/healthy-16.h5" "$WORK/ren-16.h5" >"$WORK/ren.txt" 2>&1
  RC=$?
  if [ "$RC" = 1 ] && grep -q "^verdict: NOT ALIGNED" "$WORK/ren.txt" &&
     grep -q "layer lists differ (only in A: head.fc; only in B: head.out)" "$WORK/ren.txt"; then
    pass "a renamed layer: NOT ALIGNED, exit 1, the layers named"
  else
    fail "a renamed layer: exit $RC, $(sed -n 4,6p "$WORK/ren.txt")"
  fi
else
  fail "no healthy config at $SCEN/healthy.json"
fi

# memory bounded: peak RSS of diff on 10x longer traces stays flat
if [ "${AMPPROBE_SANITIZE:-0}" = 1 ]; then
  # AddressSanitizer's quarantine keeps freed memory resident (up to 256 MiB),
  # so peak RSS says nothing about what diff holds.
  echo "skip: sanitizer build, memory check not run"
elif [ -x /usr/bin/time ]; then
  rss() { # steps -> peak RSS in KiB of diffing two traces of that length
    "$BIN" run --scenario healthy --steps "$1" --trace -q -o "$WORK/m16.h5" >/dev/null 2>&1
    "$BIN" run --scenario healthy --steps "$1" --precision fp32 --trace -q -o "$WORK/m32.h5" >/dev/null 2>&1
    /usr/bin/time -f "%M" "$BIN" diff "$WORK/m16.h5" "$WORK/m32.h5" 2>&1 >/dev/null | tail -1
  }
  r1=$(rss 150)
  r2=$(rss 1500)
  if [ "$r2" -lt $((r1 * 5 / 4 + 4096)) ]; then
    pass "memory bounded: peak RSS $r1 KiB at 150 steps, $r2 KiB at 1500"
  else
    fail "peak RSS grows with trace length: $r1 KiB at 150 steps, $r2 KiB at 1500"
  fi
else
  echo "skip: /usr/bin/time not installed, memory check not run"
fi

# bad input
expect_err() { # code what args...
  local code=$1 what=$2
  shift 2
  "$BIN" diff "$@" >"$WORK/e.out" 2>"$WORK/e.err"
  local rc=$?
  if [ "$rc" = "$code" ] && [ "$(grep -c . "$WORK/e.err")" = 1 ] &&
     grep -q "^ampprobe: diff: " "$WORK/e.err"; then
    pass "$what: exit $rc, '$(cat "$WORK/e.err")'"
  else
    fail "$what: expected exit $code and one 'ampprobe: diff:' line, got $rc: $(cat "$WORK/e.err")"
  fi
}
T=$WORK/healthy-16.h5
echo "not a trace" >"$WORK/text.h5"
"$PY" -c "import h5py,sys; h5py.File(sys.argv[1],'w').create_dataset('x',data=[1,2,3])" "$WORK/other.h5"
head -c 3000 "$T" >"$WORK/trunc.h5"
expect_err 2 "no arguments"
expect_err 2 "one trace" "$T"
expect_err 2 "three traces" "$T" "$T" "$T"
expect_err 2 "bad --threshold" "$T" "$T" --threshold -1
expect_err 2 "bad --window" "$T" "$T" --window 0
expect_err 2 "unknown option" "$T" "$T" --frobnicate
expect_err 3 "missing file" "$WORK/none.h5" "$T"
expect_err 3 "not HDF5" "$T" "$WORK/text.h5"
expect_err 3 "HDF5 but not a trace" "$WORK/other.h5" "$T"
expect_err 3 "truncated trace" "$WORK/trunc.h5" "$T"

echo "$FAILS failure(s)"
[ "$FAILS" = 0 ]
