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
# a killed run's trace (not closed): healthy only so far, the grey bar, not
# the green one of a finished run (it was "HEALTHY", green)
(AMPPROBE_FAULT_KILL_RANK=0 AMPPROBE_FAULT_KILL_STEP=30 "$AMP" run --scenario healthy \
  --trace --flush-steps 1 -o killed.h5 -q) >/dev/null 2>&1
"$AMP" report killed.h5 -o killed.html -q >/dev/null 2>&1
has killed.html 'class="verdict v0" id="verdict">HEALTHY SO FAR: the trace was not closed'
for f in fp16.h5 fp32.h5 healthy.h5; do
  [ -s $f ] || { echo "FAIL: ampprobe run did not write $f"; exit 1; }
done
cat > bisect.json <<'JSON'
{"command": "bisect", "scenario": "revin-overflow", "candidates": ["revin"],
 "granularity": "kind",
 "criteria": {"fail_nonfinite": true, "max_consecutive_skips": 20},
 "outcome": "minimal-set-found", "summary": "keep revin in FP32",
 "minimal_set": ["revin"],
 "reproduce": "ampprobe run --scenario revin-overflow --fp32 revin",
 "trials": [{"id": 0, "role": "all-fp16", "fp32": [], "verdict": "fail",
             "why": "non-finite loss", "steps_run": 1, "steps_planned": 150,
             "seconds": 0.25713055599999279},
            {"id": 1, "role": "fp32-baseline", "fp32": null,
             "verdict": "pass", "why": "final loss 8.1e4", "steps_run": 150,
             "steps_planned": 150, "seconds": 0.1},
            {"id": 2, "role": "ddmin", "fp32": ["revin"], "verdict": "pass",
             "why": "", "steps_run": 150, "steps_planned": 150,
             "seconds": 0.1}],
 "trials_run": 3, "trials_cancelled": 0, "ddmin_trials": 1, "jobs": 1,
 "wall_seconds": 0.5, "workdir": "./w"}
JSON

# a real bisect result (ampprobe bisect --json) rendered too
"$AMP" bisect --fp32-candidates revin,bn --scenario revin-overflow \
  --workdir "$W/bisect-work" --json -q > bisect-real.json 2>/dev/null
expect 1 "revin-overflow with a real bisect result" -- \
  "$AMP" report fp16.h5 --bisect bisect-real.json -o revin-real.html -q
has revin-real.html "minimal_set"
has revin-real.html "<th>forced to FP32</th>"
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
# the bisect section is the CLI's trial table, not a key/value dump
has revin.html "<th>#</th><th>trial</th><th>forced to FP32</th><th>verdict</th><th>steps</th><th>time</th><th>why</th>"
has revin.html "<td>00</td><td>all-fp16</td><td>(nothing)</td><td>FAIL</td><td>1/150</td><td>0.26s</td>"
has revin.html "<td>01</td><td>fp32-baseline</td><td>(all: --precision fp32)</td><td>PASS</td>"
has revin.html "<td>02</td><td>ddmin</td><td>revin</td><td>PASS</td>"
has revin.html "a trial fails on: non-finite loss; &gt; 20 consecutive skipped steps"
has revin.html "result: keep revin in FP32"
has revin.html "  minimal set     revin"
has revin.html "  trials          3 run (1 in ddmin), 0 cancelled"
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
# a --bisect file that is not there: said so, not "line -1"
expect 3 "missing bisect JSON" -- "$AMP" report healthy.h5 --bisect nosuch.json -o x.html
has err.txt "--bisect nosuch.json: No such file or directory"
hasnt err.txt "line -1"
expect 4 "unwritable output" -- "$AMP" report healthy.h5 -o /nonexistent-dir/x.html
has err.txt "cannot write /nonexistent-dir/x.html: No such file or directory"

# the criteria as the command words them ("text"), and its hint
cat > bisect-text.json <<'JSON'
{"command": "bisect", "scenario": "revin-overflow",
 "criteria": {"fail_nonfinite": true, "loss_window": "the last 15 steps",
              "text": "non-finite loss; final loss > 12.5% above the FP32 baseline (noise 2.5%)"},
 "outcome": "candidates-insufficient", "summary": "the candidates are not enough",
 "hint": "enable loss scaling",
 "trials": [{"id": 0, "role": "all-fp16", "fp32": [], "verdict": "fail", "why": ""}]}
JSON
expect 1 "bisect result with criteria text and a hint" -- \
  "$AMP" report fp16.h5 --bisect bisect-text.json -o text.html -q
has text.html "a trial fails on: non-finite loss; final loss &gt; 12.5% above the FP32 baseline (noise 2.5%)"
hasnt text.html "loss_window the last"
has text.html "  hint            enable loss scaling"

# strings of a bisect result are data: a C1 control (U+009B, CSI), DEL, ESC
# and a newline are shown as on the terminal, in the result lines, the
# table and the raw JSON; none reaches the page raw (C1 and DEL did, and a
# C0 control became U+FFFD); names bisect stored escaped are not escaped twice
/usr/bin/python3 - <<'PY'
import json
b = json.load(open('bisect.json'))
b['hint'] = '\u009b31m\x7f\nforged'
b['minimal_set'] = ['\x1b]0;t\x07']
b['trials'][0]['why'] = 'w\x1bhy'
b['workdir'] = 'wd\\e[31m'
json.dump(b, open('bisect-ctl.json', 'w'))
PY
expect 1 "a bisect result holding controls" -- \
  "$AMP" report fp16.h5 --bisect bisect-ctl.json -o ctl.html -q
has ctl.html '  hint            \u009b31m\x7f\nforged'
has ctl.html '  minimal set     \e]0;t\a'
has ctl.html '<td>w\ehy</td>'
has ctl.html '  workdir         wd\e[31m ('
if LC_ALL=C grep -q -P '[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]|\xc2[\x80-\x9f]' ctl.html; then
  echo "FAIL ctl.html holds a raw control character"; fail=1
else
  echo "ok   ctl.html holds no raw control character"
fi
hasnt ctl.html "$(printf '\xef\xbf\xbd')"

# a --bisect file of the wrong shape is bad input (exit 3), not a page
printf '{"a": 1}\n' > shape1.json
printf '[1, 2]\n' > shape2.json
printf '{"command": "diff", "outcome": "x", "trials": []}\n' > shape3.json
printf '{"outcome": "healthy", "trials": {"id": 0}}\n' > shape4.json
printf '{"outcome": "healthy", "trials": [{"id": 0, "verdict": "pass"}]}\n' > shape5.json
for k in 1 2 3 4 5; do
  expect 3 "bisect JSON of the wrong shape ($k)" -- \
    "$AMP" report healthy.h5 --bisect shape$k.json -o shape.html
  has err.txt "shape$k.json: not a bisect result"
  [ -e shape.html ] && { echo "FAIL shape$k: a page was written"; fail=1; }
done

# inputs of another config: a warning on stderr and on the page, exit as usual
"$AMP" run --scenario two-culprits --precision fp32 --trace -o tc32.h5 -q >/dev/null
"$AMP" run --scenario revin-overflow --precision fp32 --seed 7 --trace -o seed7.h5 -q >/dev/null
cat > bisect-other.json <<'JSON'
{"command": "bisect", "scenario": "two-culprits", "outcome": "minimal-set-found",
 "trials": [{"id": 0, "role": "all-fp16", "fp32": [], "verdict": "fail", "why": ""}]}
JSON
expect 1 "baseline of another config" -- \
  "$AMP" report fp16.h5 --baseline tc32.h5 -o other.html -q
has err.txt "warning: the baseline tc32.h5 is a run of config 'two-culprits', the trace fp16.h5 of 'revin-overflow'"
has other.html "these inputs do not belong together"
expect 1 "bisect of another config" -- \
  "$AMP" report fp16.h5 --bisect bisect-other.json -o other2.html -q
has err.txt "warning: the bisect result bisect-other.json is of config 'two-culprits', the trace fp16.h5 of 'revin-overflow'"
expect 1 "baseline with another seed" -- \
  "$AMP" report fp16.h5 --baseline seed7.h5 -o other3.html -q
has err.txt "differ in more than precision (seed)"
# a config key from a file is data: a newline in it is shown escaped, on
# the one warning line (it was split there and forged a second
# 'ampprobe: report:' line); the same for the paths in the warning and
# for -o in the 'wrote' line
cp fp16.h5 k16.h5 && cp fp32.h5 k32.h5
/usr/bin/python3 - <<'PY'
import h5py, json
for fn, v in (('k16.h5', 1), ('k32.h5', 2)):
    f = h5py.File(fn, 'r+'); c = json.loads(f.attrs['config_json'])
    c['x\nampprobe: report: FORGED LINE'] = v
    f.attrs['config_json'] = json.dumps(c); f.close()
PY
cp k32.h5 "$(printf 'k\nb.h5')"
expect 1 "a newline in a config key" -- \
  "$AMP" report k16.h5 --baseline "$(printf 'k\nb.h5')" -o "$(printf 'k\nk.html')"
if [ "$(grep -c '^ampprobe: ' err.txt)" = 2 ] && [ "$(wc -l <err.txt)" = 2 ]; then
  echo "ok   one warning line and one 'wrote' line"
else
  echo "FAIL a newline in a key or path forged stderr lines:"; cat -A err.txt; fail=1
fi
has err.txt "the baseline k\nb.h5 and the trace k16.h5 are of config 'revin-overflow' but differ in more than precision (x\nampprobe: report: FORGED LINE)"
has err.txt "ampprobe: report: wrote k\nk.html ("
hasnt err.txt "warning: ampprobe: report: FORGED"
expect 1 "matching baseline and bisect: no warning" -- \
  "$AMP" report fp16.h5 --baseline fp32.h5 --bisect bisect.json -o same.html -q
hasnt err.txt "warning"
hasnt same.html "do not belong together"

# extreme data (#15.5): no finite gradient norm, every gradient non-finite
has revin.html "no finite gradient norm: no clip coefficient was computed at any step"
hasnt revin.html ">clip coefficient<"
has revin.html "every gradient record held inf/NaN"
has revin.html "<td>revin</td><td>0 (first in the run)</td><td>fwd_saved</td><td>born here: forward, from a finite input</td>"
has revin.html "<td>loss</td><td>0</td><td>fwd_in</td><td>passed on: its input was already inf/NaN</td>"
has revin.html ">100%<"
hasnt revin.html ">1+<"
has healthy.html ">clip coefficient"
hasnt healthy.html "no clip coefficient was computed"
exit $fail
