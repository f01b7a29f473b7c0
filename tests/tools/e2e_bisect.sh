#!/usr/bin/env bash
# tests/tools/e2e_bisect.sh - end-to-end tests of `ampprobe bisect` over the
# scenario zoo, driving the real binary: the minimal set of every scenario
# built for it, --granularity layer on bn-overflow, "not a precision
# problem" on lr-too-high, "healthy" on healthy, the -o result file, bad
# input with its exit codes, and Ctrl-C. Trials run with -j 2.
# Groups added for issues 13, 15 and 17: fair (warm-up-shifted loss window,
# noise tolerance, a baseline that does not train, unmatched candidates
# dropped, hints), external (bisect of a command through AMPPROBE_*
# variables, tests/tools/fake_job.sh), safety (outputs, work directory,
# FIFOs, trials dying with bisect, progress lines, no table on errors).
# Issue 14: ranks (multi-rank trials with mpirun; skipped, exit 77, without).
# resume: --resume FILE after Ctrl-C or a finished bisect, refusals.
# bf16: --precision fp16|bf16 (the trials' reduced precision).
#
# usage: e2e_bisect.sh AMPPROBE_BINARY [GROUP]
#   GROUP: zoo | errors | fair | external | safety | ranks | resume | bf16 | all
#   (names: the layer-name part of zoo alone)
set -u
BIN=${1:?usage: e2e_bisect.sh AMPPROBE_BINARY [zoo|errors|fair|external|safety|all]}
BIN=$(cd "$(dirname "$BIN")" && pwd)/$(basename "$BIN") # tests cd elsewhere
HERE=$(cd "$(dirname "$0")" && pwd)
FAKE=$HERE/fake_job.sh
GROUP=${2:-all}
PY=/usr/bin/python3
WORK=$(mktemp -d /tmp/ampprobe-e2e-bisect.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
FAILS=0
fail() { echo "FAIL: $*"; FAILS=$((FAILS + 1)); }
# Waits (in tenths of a second, at most $3) until at least / at most $2
# processes have $1 in their command line.
trials_at_least() {
  local n=0
  while [ $n -lt "$3" ] && [ "$(pgrep -f "$1" | wc -l)" -lt "$2" ]; do sleep 0.1; n=$((n + 1)); done
}
trials_at_most() {
  local n=0
  while [ $n -lt "$3" ] && [ "$(pgrep -f "$1" | wc -l)" -gt "$2" ]; do sleep 0.1; n=$((n + 1)); done
}
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

# --granularity layer names each layer exactly (=NAME) in its trials, its
# reproduce line and its result: a layer named like a kind ("bn", the
# candidate; "linear", another kind of the model) was read as that kind -
# the trial "only layer bn" forced every BatchNorm, passed, and bisect
# answered bn, a harmless layer, for the culprit enc.bn2 (found 2026-12 by a
# defect hunt).
fp32_layers() { # TRACE: the non-loss layers that ran in FP32, sorted, comma
  "$PY" -c "import h5py,sys; L=h5py.File(sys.argv[1],'r')['layers'][:]; print(','.join(sorted(n.decode() for n,k,p in zip(L['name'],L['kind'],L['precision']) if p==0 and k not in (0,8))))" "$1"
}
layer_names_exact() {
  local harmless
  for harmless in bn linear; do
    "$PY" - "$HERE/../../trainer/scenarios/bn-overflow.json" "$WORK/named-$harmless.json" "$harmless" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c["name"] = "bn-named"
c["data"]["feature_scale"] = 1.0
c["model"] = [{"type": "bn", "name": sys.argv[3]},
              {"type": "linear", "name": "enc.fc1", "out": 32, "init_gain": 2000.0},
              {"type": "bn", "name": "enc.bn2"},
              {"type": "relu", "name": "enc.act"},
              {"type": "linear", "name": "head.fc", "out": 1}]
json.dump(c, open(sys.argv[2], "w"))
PY
    "$BIN" bisect --config "$WORK/named-$harmless.json" --fp32-candidates bn --granularity layer \
      -j 2 -q --workdir "$WORK/wd-named-$harmless" --json >"$WORK/named-$harmless.out" 2>"$WORK/named-$harmless.err"
    RC=$?
    local got rep
    got=$(jget "$WORK/named-$harmless.out" "','.join(d['minimal_layers'] or [])")
    rep=$(jget "$WORK/named-$harmless.out" "d['reproduce']")
    if [ "$RC" = 1 ] && [ "$got" = enc.bn2 ] && echo "$rep" | grep -q -- "--fp32 =enc.bn2\$"; then
      pass "a BatchNorm named '$harmless': the culprit enc.bn2 found ($rep)"
    else
      fail "a BatchNorm named '$harmless': got {$got} exit $RC, reproduce $rep: $(cat "$WORK/named-$harmless.err")"
    fi
    # every layer-level trial forced exactly the layers it names
    local t bad= n=0
    for t in $(jget "$WORK/named-$harmless.out" "' '.join('%s:%s' % (x['trace'], ','.join(sorted(n[1:] for n in x['fp32']))) for x in d['trials'] if x['role']=='ddmin-layer')"); do
      [ "$(fp32_layers "${t%%:*}")" = "${t#*:}" ] || bad="$bad ${t#*:}->$(fp32_layers "${t%%:*}")"
      n=$((n + 1))
    done
    [ -z "$bad" ] && [ $n -gt 0 ] && pass "'$harmless': each layer trial forced only its layers" ||
      fail "'$harmless': $n layer trials, some forced other layers:$bad"
    # the reproduce line is the fix: that layer alone, not its kind
    (cd "$WORK" && "$BIN" run --config "named-$harmless.json" --fp32 =enc.bn2 -q --trace -o "fix-$harmless.h5" >/dev/null 2>&1)
    [ "$(fp32_layers "$WORK/fix-$harmless.h5")" = enc.bn2 ] &&
      pass "--fp32 =enc.bn2 forces enc.bn2 alone" || fail "--fp32 =enc.bn2 forced $(fp32_layers "$WORK/fix-$harmless.h5")"
  done
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
  others=$(jget "$WORK/bnl.json" "','.join(sorted({n[1:] for t in d['trials'] if t['role']=='ddmin-layer' for n in t['fp32']} - {'$layer'}))")
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
  layer_names_exact

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
  # options bisect sets in every trial are refused after -- (--precision
  # fp32 there made the all-FP16 trial FP32: "healthy, nothing to bisect")
  local o
  for o in "--precision fp32" "--precision=bf16" "--fp32 softmax,revin" "--scenario healthy" \
           "--config x.json" "--steps 5" "--seed 3" "-o x.h5" "-ox.h5" "--output=x.h5" "--json"; do
    # shellcheck disable=SC2086
    expect_err 2 "run option '$o' after --" --fp32-candidates softmax,revin \
      --scenario two-culprits -q --workdir "$WORK/wd-own" -- $o
    [ -e "$WORK/wd-own" ] && fail "'$o': a trial ran" && rm -rf "$WORK/wd-own"
  done
  # a config whose precision is fp32 has nothing to bisect; a seed of
  # INT64_MAX has no seed + 1 for the noise baseline (it wrapped around)
  mkcfg two-culprits "$WORK/tc32.json" 'precision="fp32"'
  expect_err 2 "config precision fp32" --fp32-candidates softmax,revin --config "$WORK/tc32.json" \
    -q --workdir "$WORK/wd-32"
  grep -q "precision is fp32" "$WORK/e.err" || fail "fp32 config: $(cat "$WORK/e.err")"
  mkcfg two-culprits "$WORK/tcseed.json" 'seed=9223372036854775807'
  expect_err 2 "config seed INT64_MAX" --fp32-candidates softmax,revin --config "$WORK/tcseed.json" \
    -q --workdir "$WORK/wd-seed"
  AMPPROBE_SEED=9223372036854775807 expect_err 2 "AMPPROBE_SEED INT64_MAX" \
    --fp32-candidates bn -q --workdir "$WORK/wd-seed" -- true
  AMPPROBE_SEED=abc expect_err 2 "AMPPROBE_SEED not a number" \
    --fp32-candidates bn -q --workdir "$WORK/wd-seed" -- true
  [ -e "$WORK/wd-32" ] || [ -e "$WORK/wd-seed" ] && fail "a refused plan ran trials"
  # a trial that errors stops bisect: one line on stderr naming the trial
  # and its log, nothing on stdout (no table, no JSON), with -j 1 and -j 2
  for j in 1 2; do
    "$BIN" bisect --fp32-candidates revin --scenario revin-overflow -j $j -q \
      --workdir "$WORK/wd-bad$j" --json -- --bogus >"$WORK/bad$j.json" 2>"$WORK/bad$j.err"
    local rc=$?
    if [ "$rc" = 2 ] && [ ! -s "$WORK/bad$j.json" ] && [ "$(grep -c . "$WORK/bad$j.err")" = 1 ] &&
       grep -q "trial-0[0-9].log" "$WORK/bad$j.err"; then
      pass "-j $j: an erroring trial: exit 2, nothing on stdout, '$(cat "$WORK/bad$j.err")'"
    else
      fail "-j $j: an erroring trial: exit $rc, stdout $(wc -c <"$WORK/bad$j.json") bytes: $(cat "$WORK/bad$j.err")"
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
  trials_at_least "$WORK/wd-int/trial" 1 600 # its handler is in place by then
  kill -INT "$pid"
  local t0=$SECONDS
  wait "$pid"
  local rc=$?
  local left
  left=$(pgrep -f "$WORK/wd-int/trial" | wc -l)
  if [ "$rc" = 130 ] && grep -q "interrupted" "$WORK/int.out" && [ "$left" = 0 ] &&
     [ $((SECONDS - t0)) -lt 60 ]; then # (the trials alone would run for minutes)
    pass "Ctrl-C: exit 130, table printed, no trial left running"
  else
    fail "Ctrl-C: exit $rc, $left trials left: $(tail -3 "$WORK/int.out")"
  fi
  # a usage error leaves the file system as it was: an existing empty work
  # directory (given, or the default ./ampprobe-bisect-<name>/) is the
  # user's and stays, mode included (it was rmdir'ed as if bisect made it)
  mkdir -p "$WORK/mine" "$WORK/cwd/ampprobe-bisect-revin-overflow"
  chmod 700 "$WORK/mine"
  expect_err 2 "-o inside an existing empty --workdir" --scenario revin-overflow \
    --fp32-candidates revin -q --workdir "$WORK/mine" -o "$WORK/mine/res.json"
  [ -d "$WORK/mine" ] && [ "$(stat -c %a "$WORK/mine")" = 700 ] &&
    pass "the existing --workdir is kept, mode 700" ||
    fail "the existing empty --workdir was removed or changed: $(ls -ld "$WORK/mine" 2>&1)"
  (cd "$WORK/cwd" && "$BIN" bisect --scenario revin-overflow --fp32-candidates revin -q \
    -o ampprobe-bisect-revin-overflow/res.json >/dev/null 2>&1)
  RC=$?
  [ "$RC" = 2 ] && [ -d "$WORK/cwd/ampprobe-bisect-revin-overflow" ] &&
    pass "the existing default work directory is kept on a usage error" ||
    fail "default work directory: exit $RC, $(ls -la "$WORK/cwd" 2>&1)"
  # -o inside a work directory that does not exist yet: the same usage
  # error (exit 2), said before anything is created (it was exit 4, "cannot
  # write ...: No such file or directory")
  expect_err 2 "-o inside a --workdir that does not exist yet" --scenario revin-overflow \
    --fp32-candidates revin -q --workdir "$WORK/newwd" -o "$WORK/newwd/res.json"
  grep -q "inside the work directory" "$WORK/e.err" && [ ! -e "$WORK/newwd" ] &&
    pass "-o in a new work directory: refused as inside it, nothing created" ||
    fail "-o in a new work directory: $(cat "$WORK/e.err"); $(ls -d "$WORK/newwd" 2>&1)"
  expect_err 2 "-o inside a new --workdir spelled with .." --scenario revin-overflow \
    --fp32-candidates revin -q --workdir "$WORK/newwd/a/../b" -o "$WORK/newwd/b/x/../r.json"
  # the folders above a new work directory that this bisect made go too on
  # an error before any trial ran (only the work directory itself went:
  # here n1/ and n1/n2/ stayed), and nothing that was there before
  mkdir -p "$WORK/up"
  expect_err 2 "-o is a new --workdir spelled with .." --scenario revin-overflow \
    --fp32-candidates revin -q --workdir "$WORK/up/n1/n2/../../wd" -o "$WORK/up/wd"
  [ -d "$WORK/up" ] && [ -z "$(ls -A "$WORK/up")" ] &&
    pass "-o is the work directory: every folder this bisect made is removed, up/ kept" ||
    fail "-o is the work directory: left $(find "$WORK/up" 2>&1 | tr '\n' ' ')"
  expect_err 4 "a --workdir component longer than NAME_MAX" --scenario revin-overflow \
    --fp32-candidates revin -q --workdir "$WORK/up/n1/n2/$(printf 'x%.0s' $(seq 300))/wd"
  [ -d "$WORK/up" ] && [ -z "$(ls -A "$WORK/up")" ] &&
    pass "a work directory that cannot be made: the folders made above it are removed" ||
    fail "a work directory that cannot be made: left $(find "$WORK/up" 2>&1 | tr '\n' ' ')"
}

# ---- issue 15, class 4: fair trials ------------------------------------------

# mkcfg SCENARIO OUT KEY=VALUE...: a scenario's config with top-level or
# dotted (optimizer.lr) keys changed, written to OUT
mkcfg() {
  local sc=$1 out=$2
  shift 2
  "$PY" - "$HERE/../../trainer/scenarios/$sc.json" "$out" "$@" <<'PYEOF'
import json, sys
cfg = json.load(open(sys.argv[1]))
for kv in sys.argv[3:]:
    k, v = kv.split('=', 1)
    d = cfg
    ks = k.split('.')
    for p in ks[:-1]:
        d = d.setdefault(p, {})
    d[ks[-1]] = json.loads(v)
json.dump(cfg, open(sys.argv[2], 'w'))
PYEOF
}

fair() {
  # (a) the scaler's warm-up: with a large initial scale the first steps are
  # skipped, so a correct fix ends 10-25% above the FP32 baseline at the
  # same step; compared at the same optimizer update it is within the noise
  local c sc cand steps init want
  for c in "revin-overflow revin,linear 40 65536 revin" \
           "revin-overflow revin,linear 60 65536 revin" \
           "revin-overflow revin,linear 80 1048576 revin" \
           "bn-overflow bn,linear 40 16777216 bn"; do
    set -- $c
    sc=$1 cand=$2 steps=$3 init=$4 want=$5
    expect_set "warm-$sc-$steps" "$sc" "$cand" "$want" --steps "$steps" -- --init-scale "$init"
    local sk
    sk=$(jget "$WORK/warm-$sc-$steps.json" "[t['warmup_skips'] for t in d['trials'] if t['fp32']==['$want']][0]")
    [ "${sk:-0}" -gt 0 ] && pass "$sc --steps $steps --init-scale $init: the fix had $sk warm-up skips, shifted out" \
      || fail "$sc --steps $steps: no warm-up skips recorded ($sk)"
  done
  # the shift alone does it, without the noise tolerance
  expect_set warm-nonoise bn-overflow bn,linear bn --steps 40 --no-noise-baseline -- --init-scale 16777216
  # the criterion is stated: tolerance, measured spread, window
  local crit
  crit=$(jget "$WORK/warm-revin-overflow-60.json" "'%s|%s|%s' % (d['criteria']['loss_tolerance_pct'] >= d['criteria']['max_loss_regress_pct'], d['criteria']['baseline_noise_pct'] is not None, 'warm-up' in d['criteria']['text'])")
  [ "$crit" = "True|True|True" ] && pass "criterion in --json: tolerance >= floor, measured noise, window" \
    || fail "criterion in --json: $crit"
  "$BIN" bisect --scenario revin-overflow --steps 60 --fp32-candidates revin -j 2 -q \
    --workdir "$WORK/wd-crit" -- --init-scale 65536 >"$WORK/crit.txt" 2>&1
  grep -q "a trial fails on: .*spread between FP32 baselines of seeds 1 and 2" "$WORK/crit.txt" &&
    grep -q "fp32-noise" "$WORK/crit.txt" && pass "criterion and noise baseline in the table" \
    || fail "criterion line: $(grep 'fails on' "$WORK/crit.txt")"

  # the post-mortem verdict "degraded" is a failed trial, loss criterion or
  # not: with it off, bn-overflow and two-culprits in FP16 keep a finite
  # loss and would pass as healthy
  expect_set degr-bn bn-overflow bn,linear bn --max-loss-regress -1
  jget "$WORK/degr-bn.json" "d['trials'][0]['why']" | grep -q "verdict degraded" &&
    pass "bn-overflow all-FP16 trial: '$(jget "$WORK/degr-bn.json" "d['trials'][0]['why']")'" ||
    fail "bn-overflow all-FP16 why: $(jget "$WORK/degr-bn.json" "d['trials'][0]['why']")"
  expect_set degr-two two-culprits softmax,revin revin,softmax --max-loss-regress -1
  expect_set degr-bnl bn-overflow bn,layernorm,linear bn --max-loss-regress -1 --no-noise-baseline
  "$BIN" bisect --fp32-candidates bn,linear -j 2 -q --workdir "$WORK/wd-xdeg" --json \
    --max-loss-regress -1 -- "$FAKE" "$BIN" bn-overflow >"$WORK/xdeg.json" 2>"$WORK/xdeg.err"
  [ "$(jget "$WORK/xdeg.json" "','.join(d['minimal_set'] or [])")" = bn ] &&
    jget "$WORK/xdeg.json" "d['trials'][0]['why']" | grep -q "verdict degraded" &&
    pass "external job: its trace's post-mortem verdict degraded fails the trial" ||
    fail "external degraded: $(cat "$WORK/xdeg.err") $(jget "$WORK/xdeg.json" "d['summary']")"

  # ...but a degraded verdict from other findings alone (gradients
  # underflowing without loss scaling) does not fail a trial: forcing
  # modules to FP32 cannot cure it; it is noted and left to the loss
  expect_set degr-ls bn-overflow bn,linear bn --trace -- --no-loss-scale
  jget "$WORK/degr-ls.json" "[t['why'] for t in d['trials'] if t['role']=='all-candidates'][0]" |
    grep -q "post-mortem: enable-loss-scaling" &&
    pass "bn-overflow without loss scaling: the fix passes, noted '$(jget "$WORK/degr-ls.json" "[t['why'] for t in d['trials'] if t['role']=='all-candidates'][0]" | sed 's/.*; //')'" ||
    fail "bn-overflow without loss scaling: $(jget "$WORK/degr-ls.json" "d['summary']")"
  bisect degr-h healthy bn,linear --trace -- --no-loss-scale
  [ "$RC" = 0 ] && [ "$(jget "$WORK/degr-h.json" "d['outcome']")" = healthy ] &&
    pass "healthy without loss scaling (post-mortem finding only): nothing to bisect, exit 0" ||
    fail "healthy without loss scaling: exit $RC $(jget "$WORK/degr-h.json" "d['summary']")"

  # (b) an FP32 baseline that survives but does not train: learning rate 0
  for sc in revin-overflow softmax-underflow two-culprits; do
    mkcfg "$sc" "$WORK/lr0-$sc.json" optimizer.lr=0 'schedule={"type":"constant"}'
    "$BIN" bisect --config "$WORK/lr0-$sc.json" --fp32-candidates bn,softmax,revin -j 2 -q \
      --workdir "$WORK/wd-lr0-$sc" --json >"$WORK/lr0-$sc.out" 2>"$WORK/lr0-$sc.err"
    RC=$?
    if [ "$RC" = 5 ] && [ "$(jget "$WORK/lr0-$sc.out" "d['outcome']")" = baseline-does-not-train ] &&
       jget "$WORK/lr0-$sc.out" "d['summary']" | grep -q "^not a precision problem: the FP32 baseline does not train"; then
      pass "$sc with lr 0: 'the FP32 baseline does not train', exit 5"
    else
      fail "$sc with lr 0: exit $RC, $(jget "$WORK/lr0-$sc.out" "d['summary']" 2>&1 | head -c 300)"
    fi
  done
  # ...also with the scenario's own cosine schedule, whose floor (min_lr
  # 3e-4) once lifted --lr 0 back up, so that the baseline trained
  "$BIN" bisect --scenario healthy --fp32-candidates bn -j 2 -q --workdir "$WORK/wd-lr0-cos" \
    --json -- --lr 0 >"$WORK/lr0-cos.out" 2>"$WORK/lr0-cos.err"
  RC=$?
  [ "$RC" = 5 ] && [ "$(jget "$WORK/lr0-cos.out" "d['outcome']")" = baseline-does-not-train ] &&
    pass "healthy with -- --lr 0 and its cosine schedule: exit 5" ||
    fail "healthy --lr 0 (cosine): exit $RC, $(jget "$WORK/lr0-cos.out" "d['summary']" 2>&1 | head -c 300)"
  # ...and with 3 steps the check cannot run: said on stderr and in the
  # criteria (train_check false), not silently passed over
  "$BIN" bisect --scenario two-culprits --fp32-candidates softmax,revin -j 2 -q --steps 3 \
    --workdir "$WORK/wd-short" --json -- --lr 0 >"$WORK/short.json" 2>"$WORK/short.err"
  [ "$(jget "$WORK/short.json" "d['criteria']['train_check']")" = False ] &&
    jget "$WORK/short.json" "d['criteria']['text']" | grep -q "too few steps to tell whether it trains" &&
    grep -q "warning: the FP32 baseline ran 3 steps" "$WORK/short.err" &&
    pass "3 steps: the does-it-train check did not run, and bisect says so" ||
    fail "3 steps: $(jget "$WORK/short.json" "d['criteria']") $(cat "$WORK/short.err")"
  # ...and a baseline that trains is not taken for one (the zoo above)

  # (c) candidates matching no layer are dropped before any trial
  expect_set drop two-culprits bn,layernorm,attention,softmax,revin revin,softmax
  local bad
  bad=$(jget "$WORK/drop.json" "sorted(d['unmatched_candidates']) == ['attention','bn','layernorm'] and not any(set(t['fp32'] or []) & {'bn','layernorm','attention'} for t in d['trials'])")
  [ "$bad" = True ] && pass "unmatched bn,layernorm,attention: dropped, in no trial" \
    || fail "unmatched candidates still tried or not listed"
  grep -q "warning: bn,layernorm,attention match no layer of two-culprits (dropped" "$WORK/drop.err" &&
    pass "warning names the dropped candidates" || fail "warning: $(cat "$WORK/drop.err")"
  expect_set drop2 revin-overflow bn,revin,softmax revin
  [ "$(jget "$WORK/drop2.json" "d['trials_run']")" -le 4 ] && pass "revin-overflow: no trial spent on bn or softmax" \
    || fail "revin-overflow: $(jget "$WORK/drop2.json" "d['trials_run']") trials for one matching candidate"
  # none matches: no all-candidates trial, and the answer says what would
  bisect none revin-overflow bn,softmax,attention
  if [ "$RC" = 1 ] && [ "$(jget "$WORK/none.json" "d['outcome']")" = candidates-insufficient ] &&
     [ "$(jget "$WORK/none.json" "[t['role'] for t in d['trials']].count('all-candidates')")" = 0 ] &&
     jget "$WORK/none.json" "d['hint']" | grep -q revin; then
    pass "no candidate matches: insufficient without an all-candidates trial; hint: $(jget "$WORK/none.json" "d['hint']")"
  else
    fail "no candidate matches: exit $RC $(jget "$WORK/none.json" "d['outcome'], d['hint']")"
  fi

  # (d) "not enough" says what the trials showed
  bisect gu grad-underflow linear -- --no-loss-scale
  jget "$WORK/gu.json" "d['hint'] or ''" | grep -qi "enabl[a-z]* loss scaling" &&
    pass "grad-underflow with --no-loss-scale: hint '$(jget "$WORK/gu.json" "d['hint']")'" ||
    fail "grad-underflow hint: $(jget "$WORK/gu.json" "d['outcome'], d['hint']")"
  bisect h2 two-culprits revin
  jget "$WORK/h2.json" "d['hint'] or ''" | grep -q "add softmax to --fp32-candidates" &&
    pass "two-culprits with revin only: hint '$(jget "$WORK/h2.json" "d['hint']")'" ||
    fail "two-culprits hint: $(jget "$WORK/h2.json" "d['hint']")"
  bisect h3 two-culprits softmax
  jget "$WORK/h3.json" "d['hint'] or ''" | grep -q "revin" &&
    pass "two-culprits with softmax only: hint names revin" ||
    fail "two-culprits (softmax only) hint: $(jget "$WORK/h3.json" "d['hint']")"
  "$BIN" bisect --scenario two-culprits --fp32-candidates revin -j 2 -q --workdir "$WORK/wd-h2t" >"$WORK/h2.txt" 2>&1
  grep -q "^  hint  " "$WORK/h2.txt" && pass "hint line in the text output" || fail "no hint line in the table output"
}

# ---- issue 13, item 5: bisect of an external command ----------------------------

external() {
  export FAKE_JOB_LOG="$WORK/env.log"
  export AMPPROBE_SEED=5
  local c
  for c in "two-culprits bn,softmax,revin revin,softmax" "revin-overflow bn,softmax,revin revin" \
           "softmax-underflow softmax,linear softmax"; do
    set -- $c
    : >"$FAKE_JOB_LOG"
    "$BIN" bisect --fp32-candidates "$2" -j 2 -q --workdir "$WORK/wd-x-$1" --json \
      -- "$FAKE" "$BIN" "$1" >"$WORK/x-$1.json" 2>"$WORK/x-$1.err"
    RC=$?
    local got
    got=$(jget "$WORK/x-$1.json" "','.join(sorted(d['minimal_set'] or []))" 2>/dev/null)
    if [ "$RC" = 1 ] && [ "$got" = "$3" ]; then
      pass "external '$1': minimal set {$got} in $(jget "$WORK/x-$1.json" "d['trials_run']") trials"
    else
      fail "external '$1': expected {$3}, got {$got} exit $RC: $(cat "$WORK/x-$1.err")"
    fi
  done
  # the environment each trial saw (two-culprits' log was overwritten: use the last)
  local env=$FAKE_JOB_LOG
  grep -q "^precision=fp32 fp32=<unset> seed=5 " "$env" && grep -q "^precision=fp32 fp32=<unset> seed=6 " "$env" &&
    pass "baselines: AMPPROBE_PRECISION=fp32, no AMPPROBE_FP32; noise baseline AMPPROBE_SEED=6" ||
    fail "baseline environment: $(grep precision=fp32 "$env")"
  grep -q "^precision=<unset> fp32= seed=5 .*fp32set=yes" "$env" &&
    pass "all-FP16 trial: AMPPROBE_FP32 set and empty, no AMPPROBE_PRECISION" ||
    fail "all-fp16 environment: $(head -1 "$env")"
  [ "$(grep -c "trace=$WORK/wd-x-softmax-underflow/trial-" "$env")" = "$(wc -l <"$env")" ] &&
    pass "AMPPROBE_TRACE: an absolute path in the work directory for every trial" ||
    fail "AMPPROBE_TRACE: $(cut -d' ' -f4 "$env" | head -3)"
  jget "$WORK/x-two-culprits.json" "d['reproduce']" | grep -q "^AMPPROBE_FP32=softmax,revin $FAKE " &&
    pass "reproduce: $(jget "$WORK/x-two-culprits.json" "d['reproduce']")" ||
    fail "external reproduce: $(jget "$WORK/x-two-culprits.json" "d['reproduce']")"
  [ "$(jget "$WORK/x-two-culprits.json" "d['unmatched_candidates']")" = "['bn']" ] &&
    ! jget "$WORK/x-two-culprits.json" "[t['fp32'] for t in d['trials'] if t['role']=='ddmin']" | grep -q "'bn'" &&
    pass "external: bn matched no layer of the job's trace: dropped before ddmin" ||
    fail "external unmatched: $(jget "$WORK/x-two-culprits.json" "d['unmatched_candidates']")"
  # --granularity layer from the job's own layer names
  "$BIN" bisect --fp32-candidates bn --granularity layer -j 2 -q --workdir "$WORK/wd-xl" --json \
    -- "$FAKE" "$BIN" bn-overflow >"$WORK/xl.json" 2>"$WORK/xl.err"
  [ "$(jget "$WORK/xl.json" "','.join(d['minimal_layers'] or [])")" = enc.bn1 ] &&
    pass "external --granularity layer: enc.bn1" || fail "external layer: $(cat "$WORK/xl.err") $(jget "$WORK/xl.json" "d['summary']")"
  # a job that exits nonzero after writing its trace is judged by the trace
  "$BIN" bisect --fp32-candidates revin -j 2 -q --workdir "$WORK/wd-xf" --json \
    -- "$FAKE" "$BIN" revin-overflow fail-fp16 >"$WORK/xf.json" 2>"$WORK/xf.err"
  RC=$?
  [ "$RC" = 1 ] && jget "$WORK/xf.json" "d['outcome']" | grep -q candidates-insufficient &&
    jget "$WORK/xf.json" "d['trials'][3]['why']" | grep -q "exited 1" &&
    pass "a job exiting 1 in FP16 with a healthy trace: judged from trace and exit ('$(jget "$WORK/xf.json" "d['trials'][3]['why']")')" ||
    fail "job exiting 1: exit $RC $(cat "$WORK/xf.err") $(jget "$WORK/xf.json" "d['summary']")"
  # the reproduce line is the whole command, every word as given: a word
  # longer than the old 4,360-byte buffer was printed as
  # '[argument too long]', a command past 5,376 bytes was cut, and a
  # backslash was doubled in the text (another word when pasted)
  local long
  long="X=$(printf 'y%.0s' $(seq 6000))"
  "$BIN" bisect --fp32-candidates revin -j 2 -q --workdir "$WORK/wd-xlong" -o "$WORK/xlong.json" \
    -- env "$long" 'Y=a\b c' "$FAKE" "$BIN" revin-overflow >"$WORK/xlong.txt" 2>"$WORK/xlong.err"
  RC=$?
  sed -n 's/^  reproduce       //p' "$WORK/xlong.txt" >"$WORK/xlong.repro"
  if [ "$RC" = 1 ] && "$PY" - "$WORK/xlong.json" "$WORK/xlong.repro" "$long" "$FAKE" "$BIN" <<'PYEOF'
import json, shlex, sys
want = ['AMPPROBE_FP32=revin', 'env', sys.argv[3], 'Y=a\\b c', sys.argv[4], sys.argv[5],
        'revin-overflow']
j = shlex.split(json.load(open(sys.argv[1]))['reproduce'])
t = shlex.split(open(sys.argv[2]).read())
for name, got in (('json', j), ('text', t)):
    if got != want:
        print(name, [w[:40] for w in got], file=sys.stderr)
sys.exit(0 if j == want and t == want else 1)
PYEOF
  then
    pass "reproduce: a 6,002-byte word and a backslash pasted back as given (text and JSON)"
  else
    fail "reproduce with a long word: exit $RC $(head -c 300 "$WORK/xlong.err")"
  fi
  # a job that writes no trace, one that crashes, one that does not exist: exit 4, one line
  local m
  for m in notrace crash; do
    "$BIN" bisect --fp32-candidates revin -j 2 -q --workdir "$WORK/wd-x$m" \
      -- "$FAKE" "$BIN" revin-overflow $m >"$WORK/x$m.out" 2>"$WORK/x$m.err"
    RC=$?
    [ "$RC" = 4 ] && [ ! -s "$WORK/x$m.out" ] && [ "$(grep -c . "$WORK/x$m.err")" = 1 ] &&
      pass "job mode $m: exit 4, '$(cat "$WORK/x$m.err")'" ||
      fail "job mode $m: exit $RC, $(cat "$WORK/x$m.err")"
  done
  "$BIN" bisect --fp32-candidates revin -j 2 -q --workdir "$WORK/wd-xn" \
    -- "$WORK/no-such-train.py" >"$WORK/xn.out" 2>"$WORK/xn.err"
  RC=$?
  [ "$RC" = 4 ] && grep -q "no-such-train.py: No such file" "$WORK/xn.err" &&
    pass "missing command: exit 4, '$(cat "$WORK/xn.err")'" || fail "missing command: exit $RC, $(cat "$WORK/xn.err")"
  expect_err 2 "--scenario with an external command" --fp32-candidates bn --scenario healthy -- "$FAKE" "$BIN" healthy
  expect_err 2 "--steps with an external command" --fp32-candidates bn --steps 5 -- "$FAKE" "$BIN" healthy
  # AMPPROBE_SEED unset: every trial gets 0, the noise baseline 1 (a job
  # whose own default seed is 1 ran seed 1 in both baselines: a 0% spread)
  unset AMPPROBE_SEED
  : >"$FAKE_JOB_LOG"
  "$BIN" bisect --fp32-candidates revin -j 2 -q --workdir "$WORK/wd-xs" --json \
    -- "$FAKE" "$BIN" revin-overflow >"$WORK/xs.json" 2>"$WORK/xs.err"
  [ "$(grep -c ' seed=1 ' "$FAKE_JOB_LOG")" = 1 ] && grep -q "^precision=fp32 fp32=<unset> seed=1 " "$FAKE_JOB_LOG" &&
    [ "$(grep -c ' seed=0 ' "$FAKE_JOB_LOG")" = "$(($(wc -l <"$FAKE_JOB_LOG") - 1))" ] &&
    [ "$(jget "$WORK/xs.json" "d['criteria']['baseline_noise_pct'] is not None and d['criteria']['baseline_noise_pct'] > 0")" = True ] &&
    pass "AMPPROBE_SEED unset: trials seed 0, noise baseline seed 1, spread $(jget "$WORK/xs.json" "d['criteria']['baseline_noise_pct']")%" ||
    fail "seed unset: $(cat "$FAKE_JOB_LOG") $(cat "$WORK/xs.err")"
  # a job that ignores the seed: the baselines agree step by step, and the
  # criterion says so instead of quoting a 0% spread between two seeds
  "$BIN" bisect --fp32-candidates revin -j 2 -q --workdir "$WORK/wd-xi" --json \
    -- "$FAKE" "$BIN" revin-overflow noseed >"$WORK/xi.json" 2>"$WORK/xi.err"
  [ "$(jget "$WORK/xi.json" "d['criteria']['baselines_identical']")" = True ] &&
    [ "$(jget "$WORK/xi.json" "d['criteria']['baseline_noise_pct']")" = None ] &&
    jget "$WORK/xi.json" "d['criteria']['text']" | grep -q "job ignores the seed" &&
    pass "a job that ignores AMPPROBE_SEED: baselines identical, said in the criterion" ||
    fail "noseed job: $(jget "$WORK/xi.json" "d['criteria']") $(cat "$WORK/xi.err")"
  # a job that hangs: --trial-timeout stops it and bisect ends, exit 4,
  # naming the trial (it waited for ever), and nothing of it is left
  printf '#!/bin/bash\nexec -a ampprobe-e2e-hang-$$ sleep 1000\n' >"$WORK/hang.sh"
  chmod +x "$WORK/hang.sh"
  local t0=$SECONDS
  "$BIN" bisect --fp32-candidates bn -j 2 -q --workdir "$WORK/wd-hang" --trial-timeout 2 \
    -- "$WORK/hang.sh" >"$WORK/hang.out" 2>"$WORK/hang.err"
  RC=$?
  [ "$RC" = 4 ] && grep -q "timed out: still running after 2 s (--trial-timeout)" "$WORK/hang.err" &&
    [ $((SECONDS - t0)) -lt 30 ] && [ -z "$(pgrep -f "ampprobe-e2e-hang-$$")" ] &&
    pass "a hanging job with --trial-timeout 2: exit 4 in $((SECONDS - t0)) s, '$(cat "$WORK/hang.err")'" ||
    fail "hanging job: exit $RC after $((SECONDS - t0)) s: $(cat "$WORK/hang.err")"
  expect_err 2 "--trial-timeout -1" --fp32-candidates bn --trial-timeout -1 -- true
  # processes a job leaves outside its process group (setsid, a daemon's
  # double fork into a new session) or in it (a plain background job) end
  # with the trial: they outlived it, and bisect, before
  cat >"$WORK/leak.sh" <<EOF
#!/bin/bash
setsid -f bash -c 'exec -a ampprobe-e2e-leak-$$-setsid sleep 1000'
( setsid bash -c 'exec -a ampprobe-e2e-leak-$$-daemon sleep 1000' & ) &
bash -c 'exec -a ampprobe-e2e-leak-$$-bg sleep 1000' &
exec "\$@"
EOF
  chmod +x "$WORK/leak.sh"
  "$BIN" bisect --fp32-candidates revin -j 2 -q --workdir "$WORK/wd-leak" --json \
    -- "$WORK/leak.sh" "$FAKE" "$BIN" revin-overflow >"$WORK/leak.json" 2>"$WORK/leak.err"
  RC=$?
  local leaked
  leaked=$(pgrep -f "ampprobe-e2e-leak-$$" | wc -l)
  [ "$RC" = 1 ] && [ "$leaked" = 0 ] &&
    pass "a job's setsid, daemon and background processes end with each trial (exit $RC)" ||
    { fail "leaked processes: $leaked left, exit $RC: $(pgrep -af "ampprobe-e2e-leak-$$" | head -3) $(cat "$WORK/leak.err")"
      pkill -KILL -f "ampprobe-e2e-leak-$$"; }
  # ... and when bisect is killed while such a job runs
  cat >"$WORK/leakhang.sh" <<EOF
#!/bin/bash
setsid -f bash -c 'exec -a ampprobe-e2e-leakk-$$-setsid sleep 1000'
exec -a ampprobe-e2e-leakk-$$-job sleep 1000
EOF
  chmod +x "$WORK/leakhang.sh"
  "$BIN" bisect --fp32-candidates bn -j 2 -q --workdir "$WORK/wd-leakk" \
    -- "$WORK/leakhang.sh" >/dev/null 2>&1 &
  local bpid=$! n=0
  while [ "$(pgrep -f "ampprobe-e2e-leakk-$$-setsid" | wc -l)" -lt 1 ] && [ $n -lt 6000 ]; do
    sleep 0.1; n=$((n + 1))
  done
  kill -KILL "$bpid"
  wait "$bpid" 2>/dev/null
  n=0
  while [ -n "$(pgrep -f "ampprobe-e2e-leakk-$$")" ] && [ $n -lt 3000 ]; do
    sleep 0.1; n=$((n + 1))
  done
  leaked=$(pgrep -f "ampprobe-e2e-leakk-$$" | wc -l)
  [ "$leaked" = 0 ] && pass "SIGKILL of bisect: a trial's setsid process dies too" ||
    { fail "SIGKILL of bisect: $leaked processes of the trial left"; pkill -KILL -f "ampprobe-e2e-leakk-$$"; }
  # --granularity layer with more layers than one ddmin takes (64): the
  # answer stays at kind level, said in the hint and on stderr; it was the
  # first 64 layers, a set that never passed (the culprit was the 70th)
  local many=$HERE/many_layers_job.py pkg
  pkg=$(cd "$HERE/../../python" && pwd)
  PYTHONPATH=$pkg "$BIN" bisect --fp32-candidates linear --granularity layer -j 2 -q \
    --workdir "$WORK/wd-many" --json -- "$PY" "$many" >"$WORK/many.json" 2>"$WORK/many.err"
  RC=$?
  [ "$RC" = 1 ] && [ "$(jget "$WORK/many.json" "d['minimal_set']")" = "['linear']" ] &&
    [ "$(jget "$WORK/many.json" "d.get('minimal_layers')")" = None ] &&
    jget "$WORK/many.json" "d['hint']" | grep -q "70 layers match linear, more than the 64" &&
    grep -q "warning: --granularity layer: 70 layers" "$WORK/many.err" &&
    pass "70 matching layers: the kind-level answer (linear), with the reason" ||
    fail "70 layers: exit $RC $(jget "$WORK/many.json" "d['summary']") $(cat "$WORK/many.err")"
  NLAYERS=60 PYTHONPATH=$pkg "$BIN" bisect --fp32-candidates linear --granularity layer -j 2 -q \
    --workdir "$WORK/wd-many60" --json -- "$PY" "$many" >"$WORK/many60.json" 2>"$WORK/many60.err"
  [ "$(jget "$WORK/many60.json" "d.get('minimal_layers')")" = "['l59']" ] &&
    pass "60 matching layers: searched, the culprit l59 found" ||
    fail "60 layers: $(jget "$WORK/many60.json" "d['summary']") $(cat "$WORK/many60.err")"
  # layer names a bare AMPPROBE_FP32 entry would read as a kind ("linear")
  # or a glob ("l[0]" matches l0, "*" everything): each is =NAME in the
  # trials, so the answer is the culprit l0 (it was the first of them)
  LAYERS='linear|l[0]|*|l0|l?' CULPRIT=l0 PYTHONPATH=$pkg "$BIN" bisect --fp32-candidates linear \
    --granularity layer -j 2 -q --workdir "$WORK/wd-glob" --json -- "$PY" "$many" >"$WORK/glob.json" 2>"$WORK/glob.err"
  RC=$?
  [ "$RC" = 1 ] && [ "$(jget "$WORK/glob.json" "d.get('minimal_layers')")" = "['l0']" ] &&
    jget "$WORK/glob.json" "d['reproduce']" | grep -q "^AMPPROBE_FP32==l0 " &&
    pass "external layers named linear, l[0], *, l?: the culprit l0 ($(jget "$WORK/glob.json" "d['reproduce']" | cut -c1-40)...)" ||
    fail "external glob names: exit $RC $(jget "$WORK/glob.json" "d['summary']") $(cat "$WORK/glob.err")"
  LAYERS='*|l[0]|l0' CULPRIT='l[0]' PYTHONPATH=$pkg "$BIN" bisect --fp32-candidates linear \
    --granularity layer -j 2 -q --workdir "$WORK/wd-glob2" --json -- "$PY" "$many" >"$WORK/glob2.json" 2>"$WORK/glob2.err"
  [ "$(jget "$WORK/glob2.json" "d.get('minimal_layers')")" = "['l[0]']" ] &&
    pass "external: the culprit named l[0] found as itself" ||
    fail "external culprit l[0]: $(jget "$WORK/glob2.json" "d['summary']") $(cat "$WORK/glob2.err")"
  # a name no list can hold (a comma): the answer stays at kind level, said
  LAYERS='a,b|l0' CULPRIT=l0 PYTHONPATH=$pkg "$BIN" bisect --fp32-candidates linear \
    --granularity layer -j 2 -q --workdir "$WORK/wd-comma" --json -- "$PY" "$many" >"$WORK/comma.json" 2>"$WORK/comma.err"
  RC=$?
  [ "$RC" = 1 ] && [ "$(jget "$WORK/comma.json" "d['minimal_set']")" = "['linear']" ] &&
    [ "$(jget "$WORK/comma.json" "d.get('minimal_layers')")" = None ] &&
    grep -q "the layer 'a,b' cannot be written in an --fp32 list" "$WORK/comma.err" &&
    pass "external layer named 'a,b': kind-level answer, with the reason" ||
    fail "external comma name: exit $RC $(jget "$WORK/comma.json" "d['summary']") $(cat "$WORK/comma.err")"
  unset FAKE_JOB_LOG AMPPROBE_SEED
}

# ---- issue 17 (3, 5, 6, 8) and 15.6 for bisect: files, processes, progress ------

safety() {
  # -o --force onto a device, or a symlink: the outputs' rule (docs/cli.md
  # "Outputs"): the device is written in place and stays one, the link
  # stays and its target is replaced (all three became regular files)
  rm -f "$WORK/nul" "$WORK/lnk" "$WORK/lnk-target.json"
  if mknod "$WORK/nul" c 1 3 2>/dev/null; then
    "$BIN" bisect --scenario revin-overflow --fp32-candidates revin -j 2 -q --workdir "$WORK/wd-dev" \
      -o "$WORK/nul" --force >/dev/null 2>"$WORK/dev.err"
    [ -c "$WORK/nul" ] && pass "-o a character device --force: written in place, still a device" ||
      fail "-o device --force: $(ls -l "$WORK/nul") $(cat "$WORK/dev.err")"
  else
    echo "note: mknod not permitted here; the device case is skipped"
  fi
  echo old >"$WORK/lnk-target.json"
  ln -s lnk-target.json "$WORK/lnk"
  "$BIN" bisect --scenario revin-overflow --fp32-candidates revin -j 2 -q --workdir "$WORK/wd-lnk" \
    -o "$WORK/lnk" --force >/dev/null 2>"$WORK/lnk.err"
  [ -L "$WORK/lnk" ] && jget "$WORK/lnk-target.json" "d['command']" | grep -q bisect &&
    pass "-o a symlink --force: the link kept, its target replaced" ||
    fail "-o symlink --force: $(ls -l "$WORK/lnk") $(cat "$WORK/lnk.err")"
  # -o a symlink to nothing, or a loop, --force: refused before any trial
  # runs, in the writer's words (cli_out_check; a loop was let through and
  # refused only after every trial ran), the link kept
  rm -f "$WORK/dang" "$WORK/loopa" "$WORK/loopb"
  ln -s nowhere/x.json "$WORK/dang"
  ln -s loopb "$WORK/loopa"
  ln -s loopa "$WORK/loopb"
  for l in dang loopa; do
    "$BIN" bisect --scenario revin-overflow --fp32-candidates revin -j 2 -q --workdir "$WORK/wd-$l" \
      -o "$WORK/$l" --force >/dev/null 2>"$WORK/$l.err"
    RC=$?
    [ $RC = 4 ] && [ -L "$WORK/$l" ] && [ ! -e "$WORK/wd-$l" ] &&
      grep -q "cannot write .*$l: " "$WORK/$l.err" &&
      pass "-o $l --force: exit 4 before any trial, the link kept" ||
      fail "-o $l --force: exit $RC, $(ls -ld "$WORK/wd-$l" 2>&1) $(cat "$WORK/$l.err")"
  done
  grep -q "a symbolic link to nothing (remove it, or name another output)" "$WORK/dang.err" &&
    pass "-o a symlink to nothing: the writer's words" ||
    fail "-o dangling symlink: $(cat "$WORK/dang.err")"
  # names that are not UTF-8 (and hold an ESC): every key is still in the
  # JSON, escaped (json_string refused such text and the key went missing)
  local odd=$'cfg\xff\e[31m.json' oddwd=$'wd\xff'
  cp "$HERE/../../trainer/scenarios/revin-overflow.json" "$WORK/$odd"
  "$BIN" bisect --config "$WORK/$odd" --fp32-candidates revin -j 2 -q --workdir "$WORK/$oddwd" \
    --json >"$WORK/odd.json" 2>"$WORK/odd.err"
  [ "$(jget "$WORK/odd.json" "all(k in d for k in ('config','workdir','reproduce')) and d['config'].endswith('cfg\\\\xff\\\\e[31m.json') and all('trace' in t for t in d['trials'])")" = True ] &&
    pass "names not UTF-8: config, workdir, reproduce and every trial's trace in the JSON, escaped" ||
    fail "odd names: $(head -c 400 "$WORK/odd.json") $(cat "$WORK/odd.err")"
  "$BIN" run --scenario healthy --steps 3 -q -o "$WORK/$oddwd.h5" --json >"$WORK/oddrun.json" 2>&1
  [ "$(jget "$WORK/oddrun.json" "d['trace'].endswith('wd\\\\xff.h5')")" = True ] &&
    pass "run --json: a trace path that is not UTF-8 is there, escaped" ||
    fail "run --json odd path: $(head -c 300 "$WORK/oddrun.json")"
  # -o inside the work directory (a trial's name, a subfolder): refused
  # before any trial (it ran every trial, then lost the result, or with
  # --force replaced trial 00's trace); a work directory path too long
  # for the trials' names is refused (it was cut to another folder)
  mkdir -p "$WORK/wd-in/sub"
  expect_err 2 "-o a trial's name in the work directory" --scenario revin-overflow \
    --fp32-candidates revin -q --workdir "$WORK/wd-in" -o "$WORK/wd-in/trial-00.h5" --force
  expect_err 2 "-o in a folder inside the work directory" --scenario revin-overflow \
    --fp32-candidates revin -q --workdir "$WORK/wd-in" -o "$WORK/wd-in/sub/r.json"
  [ -z "$(ls "$WORK/wd-in" | grep -v '^sub$')" ] || fail "-o inside: trials ran: $(ls "$WORK/wd-in")"
  expect_err 2 "a work directory path of 950 characters" --scenario revin-overflow \
    --fp32-candidates revin -q --workdir "$WORK/$(printf 'g%.0s' $(seq 1 950))"
  # -o onto the config's data file, even with --force: refused, data intact
  printf 'a,b,y\n1,2,3\n4,5,9\n7,8,15\n2,2,4\n' >"$WORK/data.csv"
  cp "$WORK/data.csv" "$WORK/data.bak"
  printf '{"name": "csvjob", "steps": 20, "model": [{"type": "linear", "name": "fc", "out": 1}],
 "loss": "mse", "data": {"kind": "csv", "path": "data.csv", "targets": 1, "batch": 2}}\n' >"$WORK/csv.json"
  "$BIN" bisect --config "$WORK/csv.json" --fp32-candidates linear -q --workdir "$WORK/wd-data" \
    -o "$WORK/data.csv" --force >/dev/null 2>"$WORK/data.err"
  RC=$?
  [ "$RC" = 2 ] && cmp -s "$WORK/data.csv" "$WORK/data.bak" && [ ! -e "$WORK/wd-data" ] &&
    pass "-o the config's data file --force: exit 2, data untouched" ||
    fail "-o data file: exit $RC $(cat "$WORK/data.err")"
  # -o onto an existing file: refused before any trial, file untouched
  echo precious >"$WORK/keep.json"
  "$BIN" bisect --scenario revin-overflow --fp32-candidates revin -j 2 -q \
    --workdir "$WORK/wd-o1" -o "$WORK/keep.json" >"$WORK/o1.out" 2>"$WORK/o1.err"
  RC=$?
  [ "$RC" = 2 ] && [ "$(cat "$WORK/keep.json")" = precious ] && [ ! -e "$WORK/wd-o1" ] &&
    [ ! -s "$WORK/o1.out" ] && grep -q "already exists.*--force" "$WORK/o1.err" &&
    pass "-o EXISTING: exit 2 before any trial, file kept" || fail "-o EXISTING: exit $RC, $(cat "$WORK/o1.err")"
  "$BIN" bisect --scenario revin-overflow --fp32-candidates revin -j 2 -q \
    --workdir "$WORK/wd-o2" -o "$WORK/keep.json" --force >/dev/null 2>&1
  RC=$?
  [ "$RC" = 1 ] && [ "$(jget "$WORK/keep.json" "d['outcome']")" = minimal-set-found ] &&
    [ -z "$(ls "$WORK" | grep 'keep.json.tmp')" ] &&
    pass "-o EXISTING --force: replaced (atomically, no temporary left)" || fail "-o --force: exit $RC"
  # -o onto the config: refused whatever --force says
  cp "$HERE/../../trainer/scenarios/revin-overflow.json" "$WORK/cfg.json"
  local sum
  sum=$(md5sum <"$WORK/cfg.json")
  for f in "" --force; do
    "$BIN" bisect --config "$WORK/cfg.json" --fp32-candidates revin -j 2 -q \
      --workdir "$WORK/wd-o3" -o "$WORK/cfg.json" $f >/dev/null 2>"$WORK/o3.err"
    RC=$?
    [ "$RC" = 2 ] && [ "$(md5sum <"$WORK/cfg.json")" = "$sum" ] &&
      pass "-o CONFIG $f: exit 2, '$(cat "$WORK/o3.err")'" || fail "-o CONFIG $f: exit $RC"
  done
  ln -s "$WORK/cfg.json" "$WORK/cfg-link.json"
  "$BIN" bisect --config "$WORK/cfg.json" --fp32-candidates revin -j 2 -q \
    --workdir "$WORK/wd-o4" -o "$WORK/cfg-link.json" --force >/dev/null 2>&1
  RC=$?
  [ "$RC" = 2 ] && [ "$(md5sum <"$WORK/cfg.json")" = "$sum" ] &&
    pass "-o a symlink to the config --force: exit 2" || fail "-o symlink to config: exit $RC"

  # --config naming a FIFO, /dev/zero, a directory: refused at once (exit 3)
  mkfifo "$WORK/fifo"
  local t0 what
  for what in "$WORK/fifo" /dev/zero "$WORK"; do
    t0=$SECONDS
    timeout 20 "$BIN" bisect --config "$what" --fp32-candidates bn -q --workdir "$WORK/wd-f" \
      >/dev/null 2>"$WORK/f.err"
    RC=$?
    [ "$RC" = 3 ] && [ $((SECONDS - t0)) -lt 5 ] && grep -q "not a regular file" "$WORK/f.err" &&
      pass "--config $what: exit 3, '$(cat "$WORK/f.err")'" || fail "--config $what: exit $RC $(cat "$WORK/f.err")"
  done

  # the work directory: a symlink is refused, its target untouched
  mkdir "$WORK/victim-dir"
  ln -s "$WORK/victim-dir" "$WORK/wd-link"
  "$BIN" bisect --scenario revin-overflow --fp32-candidates revin -j 2 -q \
    --workdir "$WORK/wd-link" >/dev/null 2>"$WORK/l.err"
  RC=$?
  [ "$RC" = 4 ] && [ -z "$(ls -A "$WORK/victim-dir")" ] && grep -q "symbolic link" "$WORK/l.err" &&
    pass "--workdir a symlink: exit 4, nothing written through it" || fail "--workdir symlink: exit $RC $(cat "$WORK/l.err")"
  # reusing a work directory never replaces an earlier trial's files
  "$BIN" bisect --scenario revin-overflow --fp32-candidates revin -j 2 -q --workdir "$WORK/wd-re" >/dev/null 2>&1
  local before after
  before=$(cat "$WORK"/wd-re/trial-* | md5sum)
  "$BIN" bisect --scenario two-culprits --fp32-candidates revin,softmax -j 2 -q --workdir "$WORK/wd-re" \
    >"$WORK/re.out" 2>"$WORK/re.err"
  RC=$?
  after=$(cat "$WORK"/wd-re/trial-* | md5sum)
  [ "$RC" = 1 ] && [ "$before" = "$after" ] && [ -f "$WORK/wd-re/run-2/trial-00.h5" ] &&
    grep -q "wd-re/run-2" "$WORK/re.err" &&
    pass "reused work directory: earlier trials kept, new ones in run-2" || fail "reused work directory: exit $RC $(cat "$WORK/re.err")"
  # a planted symlink where a trial file would go: its target is not written
  mkdir "$WORK/wd-plant"
  echo victim >"$WORK/victim.txt"
  ln -s "$WORK/victim.txt" "$WORK/wd-plant/trial-00.log"
  ln -s "$WORK/victim.txt" "$WORK/wd-plant/trial-01.h5"
  "$BIN" bisect --scenario revin-overflow --fp32-candidates revin -j 2 -q --workdir "$WORK/wd-plant" \
    >/dev/null 2>&1
  RC=$?
  [ "$RC" = 1 ] && [ "$(cat "$WORK/victim.txt")" = victim ] &&
    pass "planted symlinks in the work directory: their target untouched" || fail "planted symlink: exit $RC, victim: $(head -c 40 "$WORK/victim.txt")"
  # a config name is not a path: x/../../escaped stays in the working directory
  mkdir -p "$WORK/deep/a/b"
  mkcfg revin-overflow "$WORK/deep/a/b/evil.json" 'name="x/../../escaped"'
  (cd "$WORK/deep/a/b" && "$BIN" bisect --config evil.json --fp32-candidates revin -j 2 -q >/dev/null 2>"$WORK/evn.err")
  RC=$?
  # either the trainer refuses the name (exit 2, one line) or bisect
  # sanitises it; never a folder outside the working directory
  [ ! -e "$WORK/deep/escaped" ] && [ ! -e "$WORK/deep/a/escaped" ] &&
    { [ -d "$WORK/deep/a/b/ampprobe-bisect-x_.._.._escaped" ] ||
      { [ "$RC" = 2 ] && [ "$(grep -c . "$WORK/evn.err")" = 1 ]; }; } &&
    pass "config name x/../../escaped: nothing outside the working directory (exit $RC)" ||
    fail "config name escaped: $(ls "$WORK/deep" "$WORK/deep/a" "$WORK/deep/a/b")"

  # hostile names (config name, a layer name with ESC, BEL, newline) are
  # printed escaped: no raw control character, no forged line. (A trainer
  # that refuses such names up front passes too: exit 2, one line.)
  "$PY" - "$HERE/../../trainer/scenarios/bn-overflow.json" "$WORK/evil.json" <<'PYEOF'
import json, sys
c = json.load(open(sys.argv[1]))
c['name'] = 'evil\x1b[2J\nverdict healthy'
for m in c['model']:
    if m.get('name') == 'enc.bn1':
        m['name'] = 'enc.bn1\x07\nFORGED'
json.dump(c, open(sys.argv[2], 'w'))
PYEOF
  "$BIN" bisect --config "$WORK/evil.json" --fp32-candidates bn --granularity layer -j 2 -q \
    --workdir "$WORK/wd-evil" >"$WORK/evil.out" 2>"$WORK/evil.err"
  RC=$?
  if LC_ALL=C grep -q "$(printf '[\033\007]')" "$WORK/evil.out" "$WORK/evil.err" ||
     grep -q "^FORGED\|^verdict healthy" "$WORK/evil.out" "$WORK/evil.err"; then
    fail "hostile names: raw control characters or a forged line (exit $RC)"
  elif [ "$RC" = 1 ] || { [ "$RC" = 2 ] && [ "$(grep -c . "$WORK/evil.err")" = 1 ]; }; then
    pass "hostile names printed escaped (exit $RC): $(grep -m1 'minimal layers\|bisect:' "$WORK/evil.out" "$WORK/evil.err" | head -1)"
  else
    fail "hostile names: exit $RC $(head -2 "$WORK/evil.err")"
  fi

  # SIGKILL of bisect: its trials die with it (process group + PDEATHSIG)
  "$BIN" bisect --scenario revin-overflow --fp32-candidates revin,linear --steps 200000 \
    --no-fail-nonfinite -j 2 -q --workdir "$WORK/wd-kill" >/dev/null 2>&1 &
  local pid=$! left
  # (bounds, not pauses: under ctest -j16 on two cores a start or an exit
  # can take many seconds)
  trials_at_least "$WORK/wd-kill/trial" 2 600
  local had
  had=$(pgrep -f "$WORK/wd-kill/trial" | wc -l)
  kill -KILL "$pid"
  wait "$pid" 2>/dev/null
  trials_at_most "$WORK/wd-kill/trial" 0 300
  left=$(pgrep -f "$WORK/wd-kill/trial" | wc -l)
  [ "$had" -ge 1 ] && [ "$left" = 0 ] && pass "SIGKILL of bisect: $had running trials died with it" ||
    { fail "SIGKILL of bisect: $had trials before, $left left"; pkill -KILL -f "$WORK/wd-kill/trial"; }
  # SIGTERM: trials stopped, table, 130
  "$BIN" bisect --scenario revin-overflow --fp32-candidates revin --steps 200000 \
    --no-fail-nonfinite -j 2 --workdir "$WORK/wd-term" >"$WORK/term.out" 2>&1 &
  pid=$!
  trials_at_least "$WORK/wd-term/trial" 1 600 # its handler is in place by then
  kill -TERM "$pid"
  wait "$pid"
  RC=$?
  left=$(pgrep -f "$WORK/wd-term/trial" | wc -l)
  [ "$RC" = 130 ] && [ "$left" = 0 ] && grep -q interrupted "$WORK/term.out" &&
    pass "SIGTERM: exit 130, table, no trial left" || fail "SIGTERM: exit $RC, $left left"

  # --progress-every: plain lines without a terminal, with the total and ETA
  "$BIN" bisect --scenario two-culprits --fp32-candidates bn,softmax,revin -j 2 \
    --progress-every 0.05 --workdir "$WORK/wd-pr" >/dev/null 2>"$WORK/pr.err"
  grep -Eq "^ampprobe: bisect: [0-9]+ of ~[0-9]+ trials done, [0-9]+ running, elapsed [0-9]+s, ETA ~" "$WORK/pr.err" &&
    pass "--progress-every: $(grep -c 'trials done' "$WORK/pr.err") lines, e.g. '$(grep 'trials done' "$WORK/pr.err" | tail -1)'" ||
    fail "--progress-every: $(head -3 "$WORK/pr.err")"
  "$BIN" bisect --scenario two-culprits --fp32-candidates bn,softmax,revin -j 2 -q \
    --progress-every 0.05 --workdir "$WORK/wd-pq" >/dev/null 2>"$WORK/pq.err"
  ! grep -q "trials done" "$WORK/pq.err" && pass "-q silences --progress-every" || fail "-q with --progress-every printed progress"
  expect_err 2 "--progress-every 0" --fp32-candidates bn --progress-every 0
  # --steps: one wording for both ends of the range
  expect_err 2 "--steps -5" --fp32-candidates bn --steps -5
  local e1
  e1=$(cat "$WORK/e.err")
  expect_err 2 "--steps 200000000" --fp32-candidates bn --steps 200000000
  [ "${e1#*must be in}" = "$(sed 's/.*must be in//' "$WORK/e.err")" ] && echo "$e1" | grep -q "must be in \[1, 100000000\]" &&
    pass "--steps: one wording: '$e1'" || fail "--steps wording differs: '$e1' vs '$(cat "$WORK/e.err")'"
}

# Multi-rank trials (issue 14): --ranks N for the built-in trainer, and an
# external `mpirun -np N` job whose AMPPROBE_TRACE becomes rank files; a
# job that loses a rank's trace. Skipped (exit 77) without mpirun or
# without MPI in this build.
SKIPPED=0
ranks() {
  if ! command -v mpirun >/dev/null 2>&1; then
    echo "skipped: mpirun not found (Open MPI: scripts/install-deps.sh)"
    SKIPPED=1
    return
  fi
  if ! "$BIN" run --help 2>&1 | grep -q -- '--ranks'; then
    echo "skipped: this ampprobe was built without MPI (no 'run --ranks')"
    SKIPPED=1
    return
  fi
  if [ "$(id -u)" = 0 ]; then
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  fi
  # Open MPI 4's exit race (a finished rank reported as 'exiting improperly',
  # exit 1): taken as run --ranks takes it, docs/multirank.md
  export OMPI_MCA_orte_allowed_exit_without_sync=1
  export OMPI_MCA_rmaps_base_oversubscribe=1 # 2 ranks on any machine
  local got tr
  # the built-in trainer on 2 ranks
  bisect rk revin-overflow revin,linear --ranks 2 --steps 40 -j 1
  got=$(jget "$WORK/rk.json" "','.join(sorted(d['minimal_set'] or []))" 2>/dev/null)
  [ "$RC" = 1 ] && [ "$got" = revin ] &&
    pass "--ranks 2: minimal set {$got}" ||
    fail "--ranks 2: expected {revin} and exit 1, got {$got} exit $RC: $(cat "$WORK/rk.err")"
  tr=$(jget "$WORK/rk.json" "(d['ranks'], sorted(set(t['ranks'] for t in d['trials'] if t['verdict'] != 'cancelled')))" 2>/dev/null)
  [ "$tr" = "(2, [2])" ] && pass "--ranks 2: every trial judged on 2 rank files" ||
    fail "--ranks 2: ranks in the JSON: $tr"
  [ -f "$WORK/wd-rk/trial-00.rank0.h5" ] && [ -f "$WORK/wd-rk/trial-00.rank1.h5" ] &&
    [ ! -e "$WORK/wd-rk/trial-00.h5" ] && pass "--ranks 2: trial-00.rank0.h5 and .rank1.h5 written" ||
    fail "--ranks 2: rank files: $(ls "$WORK/wd-rk" | head -5)"
  jget "$WORK/rk.json" "d['reproduce']" | grep -q -- '--ranks 2 --fp32 revin' &&
    pass "--ranks 2: reproduce '$(jget "$WORK/rk.json" "d['reproduce']")'" ||
    fail "--ranks 2: reproduce: $(jget "$WORK/rk.json" "d['reproduce']")"
  # --resume reads a reused trial's rank files back; one with a rank file
  # deleted since runs again (it is no rank that wrote no trace)
  local rk_n
  rk_n=$(jget "$WORK/rk.json" "d['trials_run']")
  rm -f "$(jget "$WORK/rk.json" "[t['dir'] + '/trial-%02d.rank1.h5' % t['file_id'] for t in d['trials'] if t['role']=='ddmin'][0]")"
  bisect rkr revin-overflow revin,linear --ranks 2 --steps 40 -j 1 --workdir "$WORK/wd-rk" --resume "$WORK/rk.json"
  got=$(jget "$WORK/rkr.json" "'%s|%d|%d' % (','.join(d['minimal_set'] or []), d['trials_reused'], d['trials_run'])" 2>/dev/null)
  [ "$RC" = 1 ] && [ "$got" = "revin|$((rk_n - 1))|1" ] && grep -q "1 of its 2 rank files are gone" "$WORK/rkr.err" &&
    pass "--ranks 2 --resume: rank sets reused, the one missing a rank file run again ($got)" ||
    fail "--ranks 2 --resume: exit $RC, $got (ran $rk_n): $(cat "$WORK/rkr.err")"

  # an FP16 all-reduce that overflows: the FP32 baseline fails too, born in
  # the all-reduce: the answer is the all-reduce's dtype (it was "not a
  # precision problem ... check the learning rate, the data and the model")
  bisect ar allreduce-overflow revin,linear --ranks 2 --steps 20 -j 1
  got=$(jget "$WORK/ar.json" "d['outcome']" 2>/dev/null)
  [ "$RC" = 1 ] && [ "$got" = fix-allreduce ] &&
    jget "$WORK/ar.json" "d['summary']" | grep -q -- "--allreduce-dtype fp32" &&
    pass "--ranks 2, allreduce-overflow: outcome $got, '$(jget "$WORK/ar.json" "d['summary'][:90]")...'" ||
    fail "--ranks 2, allreduce-overflow: outcome $got exit $RC: $(jget "$WORK/ar.json" "d['summary']" 2>/dev/null) $(cat "$WORK/ar.err")"

  # an external job under mpirun: its AMPPROBE_TRACE becomes rank files
  "$BIN" bisect --fp32-candidates revin,linear -j 1 -q --json --workdir "$WORK/wd-rx" \
    -- mpirun -np 2 "$FAKE" "$BIN" revin-overflow normal --steps 40 \
    >"$WORK/rx.json" 2>"$WORK/rx.err"
  RC=$?
  got=$(jget "$WORK/rx.json" "','.join(sorted(d['minimal_set'] or []))" 2>/dev/null)
  [ "$RC" = 1 ] && [ "$got" = revin ] &&
    pass "-- mpirun -np 2 JOB: minimal set {$got}" ||
    fail "-- mpirun -np 2 JOB: expected {revin} and exit 1, got {$got} exit $RC: $(cat "$WORK/rx.err")"
  tr=$(jget "$WORK/rx.json" "(d['ranks'], sorted(set(t['ranks'] for t in d['trials'] if t['verdict'] != 'cancelled')))" 2>/dev/null)
  [ "$tr" = "(None, [2])" ] && pass "-- mpirun -np 2 JOB: every trial judged on 2 rank files" ||
    fail "-- mpirun -np 2 JOB: ranks in the JSON: $tr"

  # a job that loses rank 1's trace: every trial fails on it, the baseline
  # first: not a precision problem
  cat >"$WORK/lose_rank.sh" <<SH
#!/usr/bin/env bash
mpirun -np 2 "$FAKE" "$BIN" revin-overflow normal --steps 20
rc=\$?
rm -f "\${AMPPROBE_TRACE%.h5}.rank1.h5"
exit \$rc
SH
  chmod +x "$WORK/lose_rank.sh"
  "$BIN" bisect --fp32-candidates revin -j 1 -q --json --workdir "$WORK/wd-rl" \
    -- "$WORK/lose_rank.sh" >"$WORK/rl.json" 2>"$WORK/rl.err"
  RC=$?
  tr=$(jget "$WORK/rl.json" "d['outcome'] + ' | ' + [t['why'] for t in d['trials'] if t['role'] == 'fp32-baseline'][0]" 2>/dev/null)
  [ "$RC" = 1 ] && echo "$tr" | grep -q "^not-a-precision-problem | rank 1 of 2 wrote no trace" &&
    pass "a job losing rank 1's trace: $tr" ||
    fail "a job losing rank 1's trace: exit $RC, $tr $(cat "$WORK/rl.err")"

  # --ranks is for the built-in trainer
  "$BIN" bisect --fp32-candidates revin --ranks 2 -- "$FAKE" "$BIN" revin-overflow \
    >/dev/null 2>"$WORK/rr.err"
  RC=$?
  [ "$RC" = 2 ] && grep -q -- "-- mpirun -np 2 CMD" "$WORK/rr.err" &&
    pass "--ranks with a command: exit 2, '$(cat "$WORK/rr.err")'" ||
    fail "--ranks with a command: exit $RC, $(cat "$WORK/rr.err")"
  "$BIN" bisect --fp32-candidates revin --ranks 0 >/dev/null 2>"$WORK/r0.err"
  RC=$?
  [ "$RC" = 2 ] && pass "--ranks 0: exit 2, '$(cat "$WORK/r0.err")'" ||
    fail "--ranks 0: exit $RC"
}

# --resume FILE (a bisect killed after hours of trials lost them all): an
# interrupted or finished document goes on, reusing the trials it judged
# whose traces are still there, and gives the answer an uninterrupted
# bisect gives; a document of another bisect (exit 2, naming the setting),
# or no bisect document at all (exit 3), is refused. Trials of 1000 steps
# (~0.2-1 s each) with -j 1, so that SIGINT lands between two trials.
# resume_refused CODE PATTERN WHAT ARGS...: exit CODE and one line matching
# PATTERN (the generic 'ampprobe: bisect:' prefix alone is what an unknown
# option gives too)
resume_refused() {
  local code=$1 pat=$2 what=$3
  shift 3
  "$BIN" bisect "$@" >"$WORK/rr.out" 2>"$WORK/rr.err"
  local rc=$?
  if [ "$rc" = "$code" ] && [ "$(grep -c . "$WORK/rr.err")" = 1 ] &&
     grep -Eq "^ampprobe: bisect: $pat" "$WORK/rr.err"; then
    pass "$what: exit $rc, '$(cat "$WORK/rr.err")'"
  else
    fail "$what: expected exit $code and /$pat/, got $rc: $(cat "$WORK/rr.err")"
  fi
}
# rjget FILE EXPR, "?" when the file is no JSON
rjget() { jget "$1" "$2" 2>/dev/null || echo "?"; }

resume() {
  local R="$WORK/rs" args
  mkdir -p "$R"
  args=(--scenario two-culprits --fp32-candidates linear,softmax,relu,revin --steps 1000 -j 1 -q)
  # the uninterrupted answer
  "$BIN" bisect "${args[@]}" --workdir "$R/wd-full" --json -o "$R/full.json" >/dev/null 2>&1
  RC=$?
  local full_set full_n full_oc
  full_set=$(rjget "$R/full.json" "','.join(d['minimal_set'] or [])")
  full_n=$(rjget "$R/full.json" "d['trials_run']")
  full_oc=$(rjget "$R/full.json" "d['outcome']")
  [ "$RC" = 1 ] && [ "$full_set" = softmax,revin ] ||
    fail "resume: the uninterrupted bisect: exit $RC, set {$full_set}"

  # (1) SIGINT after trial 04 finished (trial 05's files appear when it
  # starts: -j 1), then --resume: the same answer from fewer new trials
  "$BIN" bisect "${args[@]}" --workdir "$R/wd-int" -o "$R/int.json" >/dev/null 2>"$R/int.err" &
  local pid=$! n=0
  while [ $n -lt 600 ] && [ ! -e "$R/wd-int/trial-05.log" ]; do sleep 0.1; n=$((n + 1)); done
  kill -INT "$pid"
  wait "$pid"
  local irc=$? done_int
  done_int=$(rjget "$R/int.json" "sum(t['verdict'] in ('pass','fail') for t in d['trials'])")
  "$BIN" bisect "${args[@]}" --workdir "$R/wd-int" --resume "$R/int.json" --json \
    -o "$R/res.json" >"$R/res.out" 2>"$R/res.err"
  RC=$?
  local got
  got=$(rjget "$R/res.json" "'%s|%s|%d|%d|%s' % (','.join(d['minimal_set'] or []), d['outcome'], d['trials_reused'], d['trials_run'], d['resumed_from'] == sys.argv[1].replace('res.json', 'int.json'))")
  local set oc reused ran from
  IFS='|' read -r set oc reused ran from <<<"$got"
  if [ "$irc" = 130 ] && [ "$RC" = 1 ] && [ "$set" = "$full_set" ] && [ "$oc" = "$full_oc" ] &&
     [ "${reused:-0}" -gt 0 ] && [ "$reused" = "$done_int" ] && [ "$ran" -lt "$full_n" ] &&
     [ "$from" = True ]; then
    pass "Ctrl-C then --resume: {$set} as uninterrupted, $reused trials reused, $ran run (uninterrupted: $full_n)"
  else
    fail "Ctrl-C (exit $irc, $done_int judged) then --resume: exit $RC, got $got (want {$full_set} $full_oc, fewer than $full_n run): $(cat "$R/res.err")"
  fi
  # reused trials keep their old trace paths and mark themselves; new ones
  # go to a fresh run-N folder
  got=$(rjget "$R/res.json" "all(t['trace'].startswith(sys.argv[1].rsplit('/',1)[0] + '/wd-int/trial-') for t in d['trials'] if t['reused']) and all('/wd-int/run-2/trial-' in t['trace'] for t in d['trials'] if not t['reused'])")
  [ "$got" = True ] && pass "--resume: reused traces at their old paths, new ones in run-2/" ||
    fail "--resume: trace paths: $(rjget "$R/res.json" "[(t['reused'], t['trace']) for t in d['trials']]")"

  # ... and that resumed document resumes in turn (its reused trials live
  # in the first folder, its new ones in run-2/), from another folder
  (cd "$R/wd-full" && "$BIN" bisect "${args[@]}" --workdir "$R/wd-int" --resume "$R/res.json" --json \
    >"$R/res2.json" 2>/dev/null)
  got=$(rjget "$R/res2.json" "'%s|%d|%d' % (','.join(d['minimal_set'] or []), d['trials_reused'], d['trials_run'])")
  [ "$got" = "$full_set|$((reused + ran))|0" ] && pass "--resume of a resumed document: all reused ($got)" ||
    fail "--resume of a resumed document: $got (want $full_set|$((reused + ran))|0)"

  # SIGKILL writes no -o: the checkpoint the work directory holds after
  # every trial is resumed instead
  "$BIN" bisect "${args[@]}" --workdir "$R/wd-kill" -o "$R/kill.json" >/dev/null 2>&1 &
  pid=$!
  n=0
  while [ $n -lt 600 ] && [ ! -e "$R/wd-kill/trial-05.log" ]; do sleep 0.1; n=$((n + 1)); done
  kill -KILL "$pid"
  wait "$pid" 2>/dev/null
  "$BIN" bisect "${args[@]}" --workdir "$R/wd-kill" --resume "$R/wd-kill/bisect-checkpoint.json" --json \
    >"$R/kres.json" 2>"$R/kres.err"
  RC=$?
  got=$(rjget "$R/kres.json" "'%s|%d|%d' % (','.join(d['minimal_set'] or []), d['trials_reused'], d['trials_run'])")
  if [ ! -e "$R/kill.json" ] && [ "$RC" = 1 ] && [ "${got%%|*}" = "$full_set" ] &&
     [ "$(echo "$got" | cut -d'|' -f2)" -ge 5 ] && [ "$(echo "$got" | cut -d'|' -f3)" -lt "$full_n" ]; then
    pass "SIGKILL (no -o written) then --resume of the checkpoint: $got"
  else
    fail "SIGKILL then --resume WORKDIR/bisect-checkpoint.json: exit $RC, $got: $(cat "$R/kres.err")"
  fi

  # the checkpoint (and its temporary name) planted as symlinks in a work
  # directory of the user's: replaced, their targets untouched
  mkdir -p "$R/wd-plant"
  echo victim >"$R/victim1"
  echo victim >"$R/victim2"
  ln -s "$R/victim1" "$R/wd-plant/bisect-checkpoint.json"
  ln -s "$R/victim2" "$R/wd-plant/.bisect-checkpoint.json.tmp"
  "$BIN" bisect --scenario revin-overflow --fp32-candidates revin --steps 40 -j 1 -q \
    --workdir "$R/wd-plant" >/dev/null 2>&1
  if [ "$(cat "$R/victim1" "$R/victim2")" = "$(printf 'victim\nvictim')" ] &&
     [ -f "$R/wd-plant/bisect-checkpoint.json" ] && [ ! -L "$R/wd-plant/bisect-checkpoint.json" ] &&
     [ "$(rjget "$R/wd-plant/bisect-checkpoint.json" "d['command']")" = bisect ]; then
    pass "checkpoint: planted symlinks replaced, their targets untouched"
  else
    fail "checkpoint through planted symlinks: $(head -c 80 "$R/victim1" "$R/victim2"; ls -la "$R/wd-plant" | head -5)"
  fi

  # (2) a finished document: nothing runs again, the same answer; the
  # table says 'reused'
  "$BIN" bisect "${args[@]}" --workdir "$R/wd-full" --resume "$R/full.json" >"$R/fin.out" 2>"$R/fin.err"
  RC=$?
  if [ "$RC" = 1 ] && grep -q "minimal set     softmax,revin" "$R/fin.out" &&
     grep -q "trials          0 run, $full_n reused from" "$R/fin.out" &&
     [ "$(grep -c ' reused  ' "$R/fin.out")" = "$full_n" ]; then
    pass "--resume of a finished bisect: 0 trials run, $full_n reused, the same set"
  else
    fail "--resume of a finished bisect: exit $RC: $(grep -E 'minimal|trials ' "$R/fin.out") $(cat "$R/fin.err")"
  fi
  # -o FILE = --resume FILE: only with --force, the input read first
  cp "$R/full.json" "$R/same.json"
  resume_refused 2 ".*same.json already exists: refusing to overwrite it" "-o = --resume without --force" \
    "${args[@]}" --workdir "$R/wd-full" --resume "$R/same.json" -o "$R/same.json"
  cmp -s "$R/full.json" "$R/same.json" && pass "-o = --resume without --force: the document untouched" ||
    fail "-o = --resume without --force changed it"
  "$BIN" bisect "${args[@]}" --workdir "$R/wd-full" --resume "$R/same.json" -o "$R/same.json" --force >/dev/null 2>&1
  RC=$?
  got=$(rjget "$R/same.json" "'%s|%d|%d' % (','.join(d['minimal_set']), d['trials_reused'], d['trials_run'])")
  [ "$RC" = 1 ] && [ "$got" = "softmax,revin|$full_n|0" ] &&
    pass "-o = --resume --force: replaced by the resumed document ($got)" ||
    fail "-o = --resume --force: exit $RC, $got"

  # (3) another bisect's document: exit 2, naming what differs
  local a2=(--fp32-candidates linear,softmax,relu,revin -j 1 -q --workdir "$R/wd-x")
  resume_refused 2 "--resume .*full.json: its candidates are linear,softmax,relu,revin \(this bisect: softmax,linear,relu,revin\)$" \
    "--resume, candidates in another order" --scenario two-culprits --fp32-candidates softmax,linear,relu,revin \
    --steps 1000 -j 1 -q --workdir "$R/wd-x" --resume "$R/full.json"
  resume_refused 2 "--resume .*: its steps are 1000 \(this bisect: 900\)$" "--resume, other --steps" \
    --scenario two-culprits "${a2[@]}" --steps 900 --resume "$R/full.json"
  resume_refused 2 "--resume .*: its steps are 1000 \(this bisect: 150\)$" "--resume, the scenario's own steps" \
    --scenario two-culprits "${a2[@]}" --resume "$R/full.json"
  resume_refused 2 "--resume .*: its scenario is two-culprits \(this bisect: revin-overflow\)$" "--resume, another scenario" \
    --scenario revin-overflow "${a2[@]}" --steps 1000 --resume "$R/full.json"
  resume_refused 2 "--resume .*: its seed is 1 \(this bisect: 7\)$" "--resume, another --seed" \
    --scenario two-culprits "${a2[@]}" --steps 1000 --seed 7 --resume "$R/full.json"
  resume_refused 2 "--resume .*: its --max-loss-regress is 10.0 \(this bisect: 5.0\)$" "--resume, another criterion" \
    --scenario two-culprits "${a2[@]}" --steps 1000 --max-loss-regress 5 --resume "$R/full.json"
  resume_refused 2 "--resume .*: its granularity is kind \(this bisect: layer\)$" "--resume, another granularity" \
    --scenario two-culprits "${a2[@]}" --steps 1000 --granularity layer --resume "$R/full.json"
  resume_refused 2 "--resume .*: its run options are none \(this bisect: --lr 0.01\)$" "--resume, run options after --" \
    --scenario two-culprits "${a2[@]}" --steps 1000 --resume "$R/full.json" -- --lr 0.01
  # a config: its content, not its path, is compared
  "$PY" -c "import json,sys; c=json.load(open(sys.argv[1])); c['steps']=1000; json.dump(c, open(sys.argv[2],'w'))" \
    "$HERE/../../trainer/scenarios/two-culprits.json" "$R/tc.json"
  "$BIN" bisect --config "$R/tc.json" "${a2[@]}" --workdir "$R/wd-cfg" -o "$R/cfg.json" >/dev/null 2>&1
  "$PY" -c "import json,sys; c=json.load(open(sys.argv[1])); c['optimizer']['lr']=0.001; json.dump(c, open(sys.argv[1],'w'))" "$R/tc.json"
  resume_refused 2 "--resume .*cfg.json: its config's content \(digest\) is fnv1a64:[0-9a-f]{16} \(this bisect: fnv1a64:[0-9a-f]{16}\)$" \
    "--resume, the config edited since" --config "$R/tc.json" "${a2[@]}" --resume "$R/cfg.json"
  # names from the document are data: no terminal control reaches stderr
  "$PY" -c "import json,sys; d=json.load(open(sys.argv[1])); d['settings']['candidates'][0]='\x1b]0;pwned\x07linear'; json.dump(d, open(sys.argv[2],'w'))" \
    "$R/full.json" "$R/esc.json"
  resume_refused 2 "--resume .*esc.json: its candidates are .*pwned" "--resume, a control character in the document" \
    --scenario two-culprits "${a2[@]}" --steps 1000 --resume "$R/esc.json"
  if grep -q 'candidates are \\e]0;pwned\\a' "$WORK/rr.err" &&
     ! LC_ALL=C grep -q $'[\x01-\x08\x0b-\x1f\x7f]' "$WORK/rr.err"; then
    pass "--resume: the document's control characters printed escaped"
  else
    fail "--resume: a control character reached stderr (or nothing was said)"
  fi

  # (4) no bisect document: exit 3 (as an unreadable config)
  echo "garbage" >"$R/garbage.json"
  head -c 700 "$R/full.json" >"$R/trunc.json"
  echo '{"command": "run", "trials": []}' >"$R/notbisect.json"
  "$PY" -c "import json,sys; d=json.load(open(sys.argv[1])); del d['settings']; json.dump(d, open(sys.argv[2],'w'))" \
    "$R/full.json" "$R/nosettings.json"
  rm -f "$R/fifo"; mkfifo "$R/fifo"
  truncate -s 65M "$R/huge.json"
  local f what
  for f in "garbage.json|not a bisect document: not JSON" "trunc.json|not a bisect document: not JSON" \
           "notbisect.json|not a bisect document" "nosettings.json|it records no settings" \
           "fifo|not a regular file \(a FIFO\)" "huge.json|larger than 64 MiB" \
           "missing.json|No such file or directory"; do
    what=${f#*|}
    resume_refused 3 "--resume .*${f%%|*}: $what" "--resume ${f%%|*}" \
      --scenario two-culprits "${a2[@]}" --steps 1000 --resume "$R/${f%%|*}"
  done
  resume_refused 3 "--resume /dev/zero: not a regular file \(a character device\)" "--resume /dev/zero" \
    --scenario two-culprits "${a2[@]}" --steps 1000 --resume /dev/zero
  printf '\033]0;pwned\007{' >"$R/ctl.json" # the parser's message quotes it
  resume_refused 3 "--resume .*ctl.json: not a bisect document: not JSON" "--resume, a control character in bad JSON" \
    --scenario two-culprits "${a2[@]}" --steps 1000 --resume "$R/ctl.json"
  if grep -q "near '\\\\e'" "$WORK/rr.err" &&
     ! LC_ALL=C grep -q $'[\x01-\x08\x0b-\x1f\x7f]' "$WORK/rr.err"; then
    pass "--resume: bad JSON's control characters printed escaped"
  else
    fail "--resume: bad JSON's control character reached stderr"
  fi
  [ ! -e "$R/wd-x" ] && pass "--resume refused: no work directory made" ||
    fail "--resume refused, yet $R/wd-x was made"
  # a document naming folders that are no absolute path of its own (a
  # relative or '..' one) reuses nothing there: those trials run again
  "$PY" -c "
import json,sys
d=json.load(open(sys.argv[1]))
for i,t in enumerate(d['trials']): t['dir'] = ['wd-full', '/etc/../' + t['dir']][i % 2]
json.dump(d, open(sys.argv[2],'w'))" "$R/full.json" "$R/baddir.json"
  "$BIN" bisect "${args[@]}" --workdir "$R/wd-bd" --resume "$R/baddir.json" --json >"$R/bd.json" 2>/dev/null
  got=$(rjget "$R/bd.json" "'%d|%s' % (d['trials_reused'], ','.join(d['minimal_set']))")
  [ "$got" = "0|softmax,revin" ] && pass "--resume: relative or '..' folders in the document are not read ($got)" ||
    fail "--resume: folders with '..': $got"

  # (5) traces deleted since: the FP32 baseline's (whose loss series the
  # loss criterion needs) and a ddmin trial's run again, said on stderr
  local base_tr dd_tr
  base_tr=$(rjget "$R/full.json" "[t['trace'] for t in d['trials'] if t['role']=='fp32-baseline'][0]")
  dd_tr=$(rjget "$R/full.json" "[t['trace'] for t in d['trials'] if t['role']=='ddmin'][1]")
  rm -f "$base_tr" "$dd_tr"
  "$BIN" bisect "${args[@]}" --workdir "$R/wd-full" --resume "$R/full.json" --json >"$R/gone.json" 2>"$R/gone.err"
  RC=$?
  got=$(rjget "$R/gone.json" "'%s|%d|%d|%s' % (','.join(d['minimal_set'] or []), d['trials_reused'], d['trials_run'], sorted(t['role'] for t in d['trials'] if not t['reused']))")
  if [ "$RC" = 1 ] && [ "$got" = "softmax,revin|$((full_n - 2))|2|['ddmin', 'fp32-baseline']" ] &&
     grep -q "note: --resume: the earlier fp32-baseline trial is run again: no trace at .*loss series" "$R/gone.err"; then
    pass "--resume with 2 traces deleted: those 2 run again ($got)"
  else
    fail "--resume with traces deleted: exit $RC, $got: $(cat "$R/gone.err")"
  fi

  # (6) an external command (tests/tools/fake_job.sh) resumes too, its
  # all-FP16 trace (which names the model's layers) deleted
  local x=(--fp32-candidates bn,softmax,revin -j 2 -q --workdir "$R/wd-ext")
  AMPPROBE_SEED=5 "$BIN" bisect "${x[@]}" -o "$R/ext.json" -- "$FAKE" "$BIN" two-culprits >/dev/null 2>&1
  local ext_n
  ext_n=$(rjget "$R/ext.json" "d['trials_run']")
  rm -f "$(rjget "$R/ext.json" "[t['trace'] for t in d['trials'] if t['role']=='all-fp16'][0]")"
  AMPPROBE_SEED=5 "$BIN" bisect "${x[@]}" --resume "$R/ext.json" --json -- "$FAKE" "$BIN" two-culprits \
    >"$R/ext2.json" 2>"$R/ext2.err"
  RC=$?
  got=$(rjget "$R/ext2.json" "'%s|%d|%d' % (','.join(sorted(d['minimal_set'] or [])), d['trials_reused'], d['trials_run'])")
  [ "$RC" = 1 ] && [ "$got" = "revin,softmax|$((ext_n - 1))|1" ] &&
    pass "external command: --resume reruns the deleted all-FP16 trial only ($got)" ||
    fail "external command: --resume: exit $RC, $got (full: $ext_n): $(cat "$R/ext2.err")"
  # a trial that could not run (the job crashed: exit 4, no -o) runs again
  # from the checkpoint, once the cause is gone
  cat >"$R/flaky.sh" <<FLAKY
#!/usr/bin/env bash
[ "\${AMPPROBE_FP32-}" = revin ] && [ ! -e "$R/flaky.ok" ] && exit 3
exec "$FAKE" "\$@"
FLAKY
  chmod +x "$R/flaky.sh"
  local fx=(--fp32-candidates bn,softmax,revin -j 1 -q --workdir "$R/wd-flaky")
  "$BIN" bisect "${fx[@]}" -o "$R/flaky.json" -- "$R/flaky.sh" "$BIN" two-culprits >/dev/null 2>&1
  local frc=$?
  touch "$R/flaky.ok"
  "$BIN" bisect "${fx[@]}" --resume "$R/wd-flaky/bisect-checkpoint.json" --json -- "$R/flaky.sh" "$BIN" two-culprits \
    >"$R/flaky2.json" 2>"$R/flaky2.err"
  RC=$?
  got=$(rjget "$R/flaky2.json" "'%s|%d|%s' % (','.join(sorted(d['minimal_set'] or [])), d['trials_reused'], [t['fp32'] for t in d['trials'] if not t['reused']])")
  [ "$frc" = 4 ] && [ ! -e "$R/flaky.json" ] && [ "$RC" = 1 ] && [ "$got" = "revin,softmax|5|[['revin']]" ] &&
    pass "a trial that could not run (exit 4): --resume of the checkpoint runs it alone again ($got)" ||
    fail "crashed trial then --resume: exit $frc then $RC, $got: $(cat "$R/flaky2.err")"
  resume_refused 2 "--resume .*ext.json: its command is .*fake_job.sh .* two-culprits \(this bisect: .*fake_job.sh .* revin-overflow\)$" \
    "--resume, another external command" "${x[@]}" --resume "$R/ext.json" -- "$FAKE" "$BIN" revin-overflow
  AMPPROBE_SEED=6 resume_refused 2 "--resume .*ext.json: its seed is 5 \(this bisect: 6\)$" \
    "--resume, another AMPPROBE_SEED" "${x[@]}" --resume "$R/ext.json" -- "$FAKE" "$BIN" two-culprits
}

# bf16 (hunt F5): bisect --precision fp16|bf16 sets the reduced precision of
# every trial but the FP32 baselines (default: the config's, else fp16), so
# that a 'run --precision bf16' can be bisected (it was refused after --,
# and a BF16 config's trials were labelled all-fp16, "with everything in
# FP16"); the JSON role stays all-fp16 (its "precision" says bf16);
# --resume compares the precision.
trace_prec() { # the precisions of a trace's layers that are not FP32 (0)
  "$PY" -c "import h5py,sys; L=h5py.File(sys.argv[1],'r')['layers'][:]; print(','.join(sorted({str(p) for p in L['precision'] if p})))" "$1"
}
bf16() {
  local W=$WORK/bf
  mkdir -p "$W"
  "$BIN" bisect --scenario bn-overflow --fp32-candidates bn --precision bf16 -j 2 -q \
    --workdir "$W/wd1" -o "$W/b1.json" >"$W/b1.txt" 2>"$W/b1.err"
  RC=$?
  local got
  got=$(jget "$W/b1.json" "(d['outcome'], d['settings']['precision'], [(t['role'], t['precision']) for t in d['trials']][0])")
  if [ "$RC" = 0 ] && [ "$got" = "('healthy', 'bf16', ('all-fp16', 'bf16'))" ] &&
     grep -q "with everything in BF16 the run passes" "$W/b1.txt" &&
     grep -Eq "^  00  all-bf16 " "$W/b1.txt" && ! grep -q "FP16" "$W/b1.txt" &&
     [ "$(trace_prec "$W/wd1/trial-00.h5")" = 2 ]; then
    pass "--precision bf16: BF16 trials (trace precision 2), all-bf16, 'with everything in BF16' ($got)"
  else
    fail "--precision bf16: exit $RC, $got: $(grep -E 'result|00 ' "$W/b1.txt") $(cat "$W/b1.err")"
  fi
  # report --bisect shows that trial as all-bf16 too
  "$BIN" report "$W/wd1/trial-00.h5" --bisect "$W/b1.json" -o "$W/r1.html" -q >/dev/null 2>&1 &&
    grep -q ">all-bf16<" "$W/r1.html" && ! grep -q ">all-fp16<" "$W/r1.html" &&
    pass "report --bisect of a BF16 bisect: all-bf16" ||
    fail "report --bisect of a BF16 bisect: $(grep -o '>all-[a-z0-9]*<' "$W/r1.html" | head -2)"
  # a config whose precision is bf16: the same, without --precision
  mkcfg bn-overflow "$W/bnov-bf16.json" 'precision="bf16"'
  "$BIN" bisect --config "$W/bnov-bf16.json" --fp32-candidates bn -j 2 -q \
    --workdir "$W/wd2" -o "$W/b2.json" >"$W/b2.txt" 2>&1
  RC=$?
  got=$(jget "$W/b2.json" "(d['settings']['precision'], d['trials'][0]['precision'])")
  [ "$RC" = 0 ] && [ "$got" = "('bf16', 'bf16')" ] && grep -q "with everything in BF16" "$W/b2.txt" &&
    grep -Eq "^  00  all-bf16 " "$W/b2.txt" &&
    pass "a bf16 config: BF16 trials, said so ($got)" ||
    fail "a bf16 config: exit $RC, $got: $(grep result "$W/b2.txt")"
  # --precision fp16 is the default's answer, and the reproduce line has it
  "$BIN" bisect --scenario bn-overflow --fp32-candidates bn --precision fp16 -j 2 -q \
    --workdir "$W/wd3" -o "$W/b3.json" >"$W/b3.txt" 2>&1
  RC=$?
  got=$(jget "$W/b3.json" "(d['minimal_set'], d['trials'][0]['precision'], '--precision fp16' in d['reproduce'])")
  [ "$RC" = 1 ] && [ "$got" = "(['bn'], 'fp16', True)" ] &&
    pass "--precision fp16: the FP16 answer, reproduce line with --precision fp16 ($got)" ||
    fail "--precision fp16: exit $RC, $got"
  # the command of a 'run --scenario lr-too-high --precision bf16' (its
  # post-mortem's next step) bisects BF16: not a precision problem
  "$BIN" bisect --scenario lr-too-high --fp32-candidates linear --precision bf16 -j 2 -q \
    --workdir "$W/wd4" -o "$W/b4.json" >"$W/b4.txt" 2>&1
  RC=$?
  got=$(jget "$W/b4.json" "(d['outcome'], d['trials'][0]['precision'])")
  [ "$RC" = 1 ] && [ "$got" = "('not-a-precision-problem', 'bf16')" ] &&
    [ "$(trace_prec "$W/wd4/trial-00.h5")" = 2 ] &&
    pass "lr-too-high --precision bf16: not a precision problem, BF16 trials" ||
    fail "lr-too-high --precision bf16: exit $RC, $got"
  expect_err 2 "--precision fp32" --fp32-candidates bn --scenario bn-overflow --precision fp32 -q \
    --workdir "$W/wd-x"
  grep -q "fp16 or bf16" "$WORK/e.err" || fail "--precision fp32: $(cat "$WORK/e.err")"
  [ -e "$W/wd-x" ] && fail "--precision fp32: a trial ran"
  # an external command: AMPPROBE_PRECISION=bf16 in the trials but the
  # baselines (fp32 there), and in the reproduce line
  : >"$W/job.log"
  FAKE_JOB_LOG=$W/job.log "$BIN" bisect --fp32-candidates bn --precision bf16 -j 2 -q \
    --workdir "$W/wd5" -o "$W/b5.json" -- "$FAKE" "$BIN" two-culprits >/dev/null 2>&1
  RC=$?
  got=$(grep -o "precision=[a-z0-9<>]*" "$W/job.log" | sort | uniq -c | awk '{print $2}' | tr '\n' ' ')
  [ "$RC" != 4 ] && [ "$got" = "precision=bf16 precision=fp32 " ] &&
    [ "$(trace_prec "$W/wd5/trial-00.h5")" = 2 ] &&
    [ "$(jget "$W/b5.json" "d['trials'][0]['precision']")" = bf16 ] &&
    pass "an external command with --precision bf16: AMPPROBE_PRECISION=bf16 in its trials ($got)" ||
    fail "an external command with --precision bf16: exit $RC, $got"
  "$BIN" bisect --fp32-candidates softmax,revin --precision fp16 -j 2 -q \
    --workdir "$W/wd6" -o "$W/b6.json" -- "$FAKE" "$BIN" two-culprits >/dev/null 2>&1
  RC=$?
  got=$(jget "$W/b6.json" "d['reproduce'].split(' ')[:2]")
  [ "$RC" = 1 ] && [ "$got" = "['AMPPROBE_PRECISION=fp16', 'AMPPROBE_FP32=softmax,revin']" ] &&
    pass "an external command's reproduce line with --precision: $got" ||
    fail "an external command's reproduce line with --precision: exit $RC, $got"
  # --resume: the precision is a setting
  resume_refused 2 "--resume .*b1.json: its precision is bf16 \(this bisect: fp16\)$" \
    "--resume of a BF16 bisect without --precision" --scenario bn-overflow --fp32-candidates bn \
    -j 2 -q --workdir "$W/wd1" --resume "$W/b1.json"
  "$BIN" bisect --scenario bn-overflow --fp32-candidates bn --precision bf16 -j 2 -q \
    --workdir "$W/wd1" --resume "$W/b1.json" -o "$W/b1r.json" >/dev/null 2>&1
  RC=$?
  got=$(jget "$W/b1r.json" "(d['outcome'], d['trials_reused'], d['settings']['precision'])")
  [ "$RC" = 0 ] && [ "$got" = "('healthy', 4, 'bf16')" ] &&
    pass "--resume of a BF16 bisect with --precision bf16: every trial reused ($got)" ||
    fail "--resume --precision bf16: exit $RC, $got"
}

case "$GROUP" in
  zoo) zoo ;;
  names) layer_names_exact ;;
  errors) errors ;;
  fair) fair ;;
  external) external ;;
  safety) safety ;;
  ranks) ranks ;;
  resume) resume ;;
  bf16) bf16 ;;
  all) zoo; errors; fair; external; safety; ranks; resume; bf16 ;;
  *) echo "unknown group $GROUP"; exit 2 ;;
esac
echo "$FAILS failure(s)"
[ "$FAILS" = 0 ] || exit 1
[ "$GROUP" = ranks ] && [ "$SKIPPED" = 1 ] && exit 77
exit 0
