#!/usr/bin/env bash
# tests/reports/report_cli.sh - `ampprobe report` end to end on zoo runs:
# exit codes (0 healthy, 1 problem, 2 usage, 3 bad input, 4 cannot write),
# the page's contents for a run with a baseline and a bisect result, and
# bad input. Usage: report_cli.sh AMPPROBE WORKDIR
set -u
AMP=$1
W=$2
rm -rf "$W" && mkdir -p "$W" && cd "$W" || exit 1
fail=0
expect() { # expect CODE DESCRIPTION -- command...
  local want=$1 what=$2
  shift 3
  "$@" >out.txt 2>err.txt
  local got=$?
  if [ "$got" -ne "$want" ]; then
    echo "FAIL $what: exit $got, want $want"; cat err.txt; fail=1
  else
    echo "ok   $what (exit $got)"
  fi
}
has() { # has FILE TEXT
  if grep -qF -- "$2" "$1"; then echo "ok   $1 has '$2'"
  else echo "FAIL $1 lacks '$2'"; fail=1; fi
}

"$AMP" run --scenario revin-overflow --trace -o fp16.h5 -q >/dev/null
"$AMP" run --scenario revin-overflow --precision fp32 --trace -o fp32.h5 -q >/dev/null
"$AMP" run --scenario healthy --trace -o healthy.h5 -q >/dev/null
for f in fp16.h5 fp32.h5 healthy.h5; do
  [ -s $f ] || { echo "FAIL: ampprobe run did not write $f"; exit 1; }
done
cat > bisect.json <<'JSON'
{"command": "bisect", "scenario": "revin-overflow",
 "criteria": {"fail_nonfinite": true, "max_consecutive_skips": 20},
 "outcome": "minimal-set-found", "minimal_set": ["revin"],
 "reproduce": "ampprobe run --scenario revin-overflow --fp32 revin",
 "trials": [{"id": 0, "fp32": [], "verdict": "fail", "why": "non-finite loss",
             "seconds": 0.25713055599999279},
            {"id": 1, "fp32": ["revin"], "verdict": "pass", "why": "",
             "seconds": 0.1}]}
JSON

# a real bisect result (ampprobe bisect --json) rendered too
"$AMP" bisect --fp32-candidates revin,bn --scenario revin-overflow \
  --workdir "$W/bisect-work" --json -q > bisect-real.json 2>/dev/null
expect 1 "revin-overflow with a real bisect result" -- \
  "$AMP" report fp16.h5 --bisect bisect-real.json -o revin-real.html -q
has revin-real.html "minimal_set"
has revin-real.html "<th>verdict</th>"
has revin-real.html "ampprobe run --scenario revin-overflow --fp32 revin"

expect 0 "healthy run" -- "$AMP" report healthy.h5 -o healthy.html -q
expect 1 "revin-overflow with baseline and bisect" -- \
  "$AMP" report fp16.h5 --baseline fp32.h5 --bisect bisect.json -o revin.html
has err.txt "wrote revin.html"
has revin.html "PROBLEM"
has revin.html "Post-mortem diagnosis"
has revin.html "FIRST NON-FINITE EVENT"       # the diagnosis engine's text
has revin.html "Comparison with the baseline"
has revin.html "curves part at step"
has revin.html "Bisect: modules to keep in FP32"
has revin.html "<td>revin</td>"
has revin.html "<td>0.2571</td>"             # reals at 4 digits
has revin.html "{&quot;fail_nonfinite&quot;:true" # objects as compact JSON
has revin.html ">revin</text>"                # a heatmap row label
has healthy.html "HEALTHY"

# the loss-scale plot's "loss scaling off" follows the post-mortem (the
# stored config), not the scale: revin-overflow's scaler stays at its
# initial 1 once RevIN is in FP32, and is still on
hasnt() { # hasnt FILE TEXT
  if grep -qF -- "$2" "$1"; then echo "FAIL $1 has '$2'"; fail=1
  else echo "ok   $1 lacks '$2'"; fi
}
"$AMP" run --scenario revin-overflow --fp32 revin --trace -o scale1.h5 -q >/dev/null
"$AMP" run --scenario revin-overflow --fp32 revin --no-loss-scale --trace -o noscale.h5 -q >/dev/null
expect 0 "scaler on at scale 1" -- "$AMP" report scale1.h5 -o scale1.html -q
expect 0 "scaler off" -- "$AMP" report noscale.h5 -o noscale.html -q
hasnt scale1.html "loss scaling off"
has noscale.html "loss scaling off"

expect 2 "missing -o" -- "$AMP" report healthy.h5
expect 2 "missing TRACE" -- "$AMP" report -o x.html
expect 2 "bad --width" -- "$AMP" report healthy.h5 -o x.html --width 12
expect 2 "unknown option" -- "$AMP" report healthy.h5 -o x.html --frobnicate
expect 3 "missing trace" -- "$AMP" report nosuch.h5 -o x.html
echo "not a trace" > junk.h5
expect 3 "not HDF5" -- "$AMP" report junk.h5 -o x.html
expect 3 "bad baseline" -- "$AMP" report healthy.h5 --baseline junk.h5 -o x.html
echo "{ not json" > bad.json
expect 3 "bad bisect JSON" -- "$AMP" report healthy.h5 --bisect bad.json -o x.html
expect 4 "unwritable output" -- "$AMP" report healthy.h5 -o /nonexistent-dir/x.html
exit $fail
