#!/usr/bin/env bash
# tests/tools/e2e_bisect.sh - end-to-end tests of `ampprobe bisect` over the
# scenario zoo, driving the real binary: the minimal set of every scenario
# built for it, --granularity layer on bn-overflow, "not a precision
# problem" on lr-too-high, "healthy" on healthy, the -o result file, bad
# input with its exit codes, and Ctrl-C. Trials run with -j 2.
#
# usage: e2e_bisect.sh AMPPROBE_BINARY [GROUP]   GROUP: zoo | errors | all
set -u
BIN=${1:?usage: e2e_bisect.sh AMPPROBE_BINARY [zoo|errors|all]}
GROUP=${2:-all}
PY=/usr/bin/python3
WORK=$(mktemp -d /tmp/ampprobe-e2e-bisect.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
FAILS=0
fail() { echo "FAIL: $*"; FAILS=$((FAILS + 1)); }
pass() { echo "ok:   $*"; }

# jq-like reads with Debian's python: jget FILE EXPR (EXPR uses d)
jget() { "$PY" -c "import json,sys; d=json.load(open(sys.argv[1])); print($2)" "$1"; }

# bisect SCENARIO CANDIDATES [extra args...]: runs with -j 2 and --json,
# leaves $WORK/<tag>.json, returns the exit code in RC.
bisect() {
  local tag=$1 sc=$2 cand=$3
  shift 3
  "$BIN" bisect --scenario "$sc" --fp32-candidates "$cand" -j 2 -q \
    --workdir "$WORK/wd-$tag" --json "$@" >"$WORK/$tag.json" 2>"$WORK/$tag.err"
  RC=$?
}

expect_set() { # tag scenario candidates expected(sorted, comma) [args]
  local tag=$1 sc=$2 cand=$3 want=$4
  shift 4
  bisect "$tag" "$sc" "$cand" "$@"
  local got
  got=$(jget "$WORK/$tag.json" "','.join(sorted(d['minimal_set'] or []))" 2>/dev/null)
  if [ "$RC" = 1 ] && [ "$got" = "$want" ]; then
    pass "$sc: minimal set {$got} ($(jget "$WORK/$tag.json" "d['trials_run']") trials)"
  else
    fail "$sc: expected {$want} and exit 1, got {$got} exit $RC: $(cat "$WORK/$tag.err")"
  fi
}

zoo() {
  expect_set revin revin-overflow bn,softmax,revin revin
  expect_set bn bn-overflow bn,softmax,revin bn
  expect_set softmax softmax-underflow bn,softmax,revin softmax
  expect_set two two-culprits bn,softmax,revin revin,softmax
  # the trial count on two-culprits, recorded (ddmin bound for k=2, n=3:
  # 1 + 4*2*2 = 17 trials, the full set being a premise here)
  local n nd
  n=$(jget "$WORK/two.json" "d['trials_run']")
  nd=$(jget "$WORK/two.json" "d['ddmin_trials']")
  echo "two-culprits: $n trials run ($nd in ddmin) with -j 2"
  if [ "$nd" -le 17 ] && [ "$n" -le 20 ]; then pass "two-culprits trial count within the bound"
  else fail "two-culprits: $nd ddmin trials exceed the bound"; fi
  # every trial of the answer's 1-minimality was run and failed: dropping
  # revin or softmax alone fails
  local minimal_ok
  minimal_ok=$(jget "$WORK/two.json" "all(any(t['fp32']==[x] and t['verdict']=='fail' for t in d['trials']) for x in ['revin','softmax'])")
  [ "$minimal_ok" = True ] && pass "two-culprits: {revin} and {softmax} alone fail" \
    || fail "two-culprits: missing the trials that show 1-minimality"

  # --granularity layer: the one BN layer that needs FP32
  bisect bnl bn-overflow bn --granularity layer
  local layer kind
  layer=$(jget "$WORK/bnl.json" "','.join(d['minimal_layers'] or [])")
  if [ "$RC" = 1 ] && [ -n "$layer" ] && [ "${layer#*,}" = "$layer" ]; then
    pass "bn-overflow --granularity layer: {$layer}"
  else
    fail "bn-overflow --granularity layer: expected one layer, got {$layer} exit $RC"
  fi
  # ...and it is the one: every other BN layer alone is not enough
  local others
  others=$(jget "$WORK/bnl.json" "','.join(sorted({n for t in d['trials'] if t['role']=='ddmin-layer' for n in t['fp32']} - {'$layer'}))")
  if [ -z "$others" ]; then
    others=$("$BIN" run --scenario bn-overflow --steps 1 --json -q -o "$WORK/l.h5" >/dev/null 2>&1; \
      "$PY" -c "import h5py,sys; f=h5py.File(sys.argv[1],'r'); L=f['layers'][:]; print(','.join(n.decode() for n,k in zip(L['name'],L['kind']) if k==2 and n.decode()!=sys.argv[2]))" "$WORK/l.h5" "$layer")
  fi
  for o in ${others//,/ }; do
    bisect other bn-overflow "$o"
    local oc
    oc=$(jget "$WORK/other.json" "d['outcome']")
    [ "$oc" = candidates-insufficient ] && pass "bn-overflow: $o alone is not enough" \
      || fail "bn-overflow: $o alone should not be enough, got $oc"
  done

  # not a precision problem
  bisect lr lr-too-high bn,softmax,revin
  if [ "$RC" = 1 ] && [ "$(jget "$WORK/lr.json" "d['outcome']")" = not-a-precision-problem ] &&
     jget "$WORK/lr.json" "d['summary']" | grep -q "not a precision problem"; then
    pass "lr-too-high: not a precision problem"
  else
    fail "lr-too-high: expected 'not a precision problem', exit $RC"
  fi
  # healthy: nothing to bisect, exit 0, text output
  "$BIN" bisect --scenario healthy --fp32-candidates bn,layernorm -j 2 -q \
    --workdir "$WORK/wd-h" -o "$WORK/h.json" >"$WORK/h.txt" 2>&1
  RC=$?
  if [ "$RC" = 0 ] && grep -q "healthy, nothing to bisect" "$WORK/h.txt" &&
     [ "$(jget "$WORK/h.json" "d['outcome']")" = healthy ]; then
    pass "healthy: nothing to bisect (exit 0, -o written)"
  else
    fail "healthy: expected 'healthy, nothing to bisect' exit 0, got $RC"
  fi
  # each trial's trace is kept in the work directory
  [ -f "$WORK/wd-revin/trial-00.h5" ] && [ -f "$WORK/wd-revin/trial-00.json" ] \
    && pass "trial traces kept in the work directory" \
    || fail "trial traces missing from the work directory"
  # the reproduce command really fixes the run
  local repro
  repro=$(jget "$WORK/two.json" "d['reproduce']")
  case "$repro" in
    "ampprobe run --scenario two-culprits --fp32 "*) pass "reproduce: $repro" ;;
    *) fail "reproduce command: '$repro'" ;;
  esac
  # shellcheck disable=SC2086
  "$BIN" ${repro#ampprobe } -q -o "$WORK/fixed.h5" --json >"$WORK/fixed.json" 2>&1
  [ "$(jget "$WORK/fixed.json" "d['diverged']")" = False ] && pass "the reproduced fixed run is healthy" \
    || fail "the reproduced fixed run diverged"
}

# expect_err CODE DESCRIPTION args...: one-line error on stderr and CODE
expect_err() {
  local code=$1 what=$2
  shift 2
  "$BIN" bisect "$@" >"$WORK/e.out" 2>"$WORK/e.err"
  local rc=$? lines
  lines=$(grep -c . "$WORK/e.err")
  if [ "$rc" = "$code" ] && [ "$lines" -ge 1 ] && grep -q "^ampprobe: bisect: " "$WORK/e.err"; then
    pass "$what: exit $rc, '$(tail -1 "$WORK/e.err")'"
  else
    fail "$what: expected exit $code with an 'ampprobe: bisect:' line, got $rc: $(cat "$WORK/e.err")"
  fi
}

errors() {
  expect_err 2 "missing --fp32-candidates" --scenario revin-overflow
  expect_err 2 "empty candidates" --fp32-candidates , --scenario revin-overflow
  expect_err 2 "unknown scenario" --fp32-candidates bn --scenario no-such-thing
  expect_err 2 "bad -j" --fp32-candidates bn -j 0
  expect_err 2 "bad --granularity" --fp32-candidates bn --granularity module
  expect_err 2 "bad --max-loss-regress" --fp32-candidates bn --max-loss-regress ten
  expect_err 2 "unknown option" --fp32-candidates bn --frobnicate
  expect_err 2 "stray argument" --fp32-candidates bn extra
  expect_err 2 "--scenario with --config" --fp32-candidates bn --scenario healthy --config x.json
  expect_err 3 "missing config file" --fp32-candidates bn --config "$WORK/none.json"
  expect_err 2 "run option the trials reject" --fp32-candidates revin \
    --scenario revin-overflow -j 2 -q --workdir "$WORK/wd-bad" -- --bogus
  # the trials left are labelled as not run because one errored, not passed
  for j in 1 2; do
    "$BIN" bisect --fp32-candidates revin --scenario revin-overflow -j $j -q \
      --workdir "$WORK/wd-bad$j" --json -- --bogus >"$WORK/bad$j.json" 2>/dev/null
    local whys
    whys=$(jget "$WORK/bad$j.json" "' | '.join(t['why'] for t in d['trials'] if t['verdict'] != 'error')")
    if [ -n "$whys" ] && ! echo "$whys" | grep -q "passed" &&
       echo "$whys" | grep -q "errored"; then
      pass "-j $j: trials after an ERROR: $whys"
    else
      fail "-j $j: trials after an ERROR labelled: $whys"
    fi
  done
  echo '{"name": "x", "steps": "many"}' >"$WORK/bad.json"
  expect_err 2 "invalid config" --fp32-candidates bn --config "$WORK/bad.json"
  : >"$WORK/ro" # a file where the work directory should go
  expect_err 4 "work directory not creatable" --fp32-candidates revin \
    --scenario revin-overflow --workdir "$WORK/ro/sub"

  # Ctrl-C: long trials, SIGINT to bisect -> children stopped, exit 130, table
  "$BIN" bisect --scenario revin-overflow --fp32-candidates revin --steps 200000 \
    --no-fail-nonfinite -j 2 --workdir "$WORK/wd-int" >"$WORK/int.out" 2>&1 &
  local pid=$!
  sleep 1
  kill -INT "$pid"
  local t0=$SECONDS
  wait "$pid"
  local rc=$?
  local left
  left=$(pgrep -f "$WORK/wd-int/trial" | wc -l)
  if [ "$rc" = 130 ] && grep -q "interrupted" "$WORK/int.out" && [ "$left" = 0 ] &&
     [ $((SECONDS - t0)) -lt 20 ]; then
    pass "Ctrl-C: exit 130, table printed, no trial left running"
  else
    fail "Ctrl-C: exit $rc, $left trials left: $(tail -3 "$WORK/int.out")"
  fi
}

case "$GROUP" in
  zoo) zoo ;;
  errors) errors ;;
  all) zoo; errors ;;
  *) echo "unknown group $GROUP"; exit 2 ;;
esac
echo "$FAILS failure(s)"
[ "$FAILS" = 0 ]
