#!/usr/bin/env bash
# tests/tools/e2e_run.sh - end-to-end tests of `ampprobe run`'s output and
# input rules (issue 17.3/5/6) and progress lines (issue 15.6), driving the
# real binary: an existing -o is refused unless --force; an input (the
# config, a symlink to it, the data file) is refused as -o whatever the
# flags; a planted (dangling) symlink is not followed; --config naming a
# FIFO, /dev/zero or a folder is refused at once; a config name is no path;
# --progress-every writes plain lines without a terminal; --steps has one
# range wording; a write failure (file-size limit) ends with exit 4.
#
# usage: e2e_run.sh AMPPROBE_BINARY
set -u
BIN=${1:?usage: e2e_run.sh AMPPROBE_BINARY}
BIN=$(cd "$(dirname "$BIN")" && pwd)/$(basename "$BIN")
HERE=$(cd "$(dirname "$0")" && pwd)
PY=/usr/bin/python3
WORK=$(mktemp -d /tmp/ampprobe-e2e-run.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
cd "$WORK" || exit 1
FAILS=0
fail() { echo "FAIL: $*"; FAILS=$((FAILS + 1)); }
pass() { echo "ok:   $*"; }

# run_rc EXPECTED DESCRIPTION ARGS...: exit code, one-line error when not 0/1
run_rc() {
  local want=$1 what=$2
  shift 2
  timeout 60 "$BIN" run "$@" >"$WORK/o.out" 2>"$WORK/o.err"
  local rc=$?
  if [ "$rc" = "$want" ] && { [ "$want" -le 1 ] || { [ "$(grep -c . "$WORK/o.err")" = 1 ] &&
       grep -q "^ampprobe: run: " "$WORK/o.err" && [ ! -s "$WORK/o.out" ]; }; }; then
    pass "$what: exit $rc${2:+ }$(head -c 160 "$WORK/o.err")"
  else
    fail "$what: expected $want, got $rc: $(cat "$WORK/o.err")"
  fi
}

# a --fp32 entry that selects no layer (a typo) is named in a warning; the
# entries that select layers are not; -q keeps it quiet
timeout 60 "$BIN" run --scenario revin-overflow --steps 3 --fp32 'revnorm, revin,enc.*' \
  -o fp32w.h5 >o.out 2>o.err
if grep -q "warning: --fp32 revnorm selects no layer" o.err &&
   [ "$(grep -c 'selects no layer' o.err)" = 1 ]; then
  pass "--fp32 typo named: $(head -c 120 o.err)"
else
  fail "--fp32 typo: '$(cat o.err)'"
fi
timeout 60 "$BIN" run --scenario revin-overflow --steps 3 --fp32 revnorm -q \
  -o fp32q.h5 >o.out 2>o.err
[ ! -s o.err ] && pass "-q: no --fp32 warning" || fail "-q: '$(cat o.err)'"

# -o onto an existing file: refused, the file untouched; --force replaces
echo "not a trace" >t.h5
run_rc 2 "-o EXISTING" --steps 3 -q -o t.h5
[ "$(cat t.h5)" = "not a trace" ] && pass "existing file untouched" || fail "existing file changed"
grep -q -- "--force" o.err && pass "the message names --force" || fail "no --force in '$(cat o.err)'"
run_rc 0 "-o EXISTING --force" --steps 3 -q -o t.h5 --force
"$BIN" postmortem t.h5 >/dev/null 2>&1 && pass "--force wrote a readable trace" || fail "--force trace unreadable"
: >empty.h5
run_rc 2 "-o an existing empty file" --steps 3 -q -o empty.h5
run_rc 0 "-o a new file" --steps 3 -q -o new.h5
run_rc 2 "-o the trace just written (second run)" --steps 3 -q -o new.h5
# a dangling symlink planted at -o: not followed, its target not created;
# refused with the reason --force would get (it cannot help there), exit 4
ln -s "$WORK/planted-target.h5" planted.h5
run_rc 4 "-o a dangling symlink" --steps 3 -q -o planted.h5
grep -q "cannot create trace planted.h5: a symbolic link to nothing" o.err &&
  ! grep -q -- "--force" o.err && pass "the dangling symlink named as such, no --force advice" ||
  fail "dangling symlink message: '$(cat o.err)'"
[ ! -e planted-target.h5 ] && pass "symlink target not created" || fail "symlink followed"

# an input as output: refused whatever --force says
cp "$HERE/../../trainer/scenarios/healthy.json" cfg.json
sum=$(md5sum <cfg.json)
for f in "" --force; do
  run_rc 2 "--config X -o X $f" --config cfg.json -o cfg.json -q --steps 3 $f
done
ln -s cfg.json cfg-link.h5
run_rc 2 "-o a symlink to the config --force" --config cfg.json -o cfg-link.h5 -q --steps 3 --force
mkdir sub && ln cfg.json sub/hard.h5
run_rc 2 "-o a hard link to the config --force" --config cfg.json -o sub/hard.h5 -q --steps 3 --force
[ "$(md5sum <cfg.json)" = "$sum" ] && pass "config untouched" || fail "config changed"
grep -q "refusing to write" o.err && pass "message: '$(cat o.err)'" || fail "message: $(cat o.err)"
# the data file (CSV, relative to the config's folder or the working directory)
mkdir data
"$PY" - <<'PYEOF'
import json, random
random.seed(1)
with open('data/d.csv', 'w') as f:
    for i in range(64):
        x = [random.gauss(0, 1) for _ in range(4)]
        f.write(','.join('%.4f' % v for v in x + [sum(x)]) + '\n')
json.dump({"name": "csvrun", "steps": 3, "model": [{"type": "linear", "out": 1}],
           "loss": "mse", "data": {"kind": "csv", "path": "d.csv", "batch": 8}},
          open('data/cfg.json', 'w'))
PYEOF
dsum=$(md5sum <data/d.csv)
run_rc 2 "-o the data file --force" --config data/cfg.json -o data/d.csv -q --force
[ "$(md5sum <data/d.csv)" = "$dsum" ] && pass "data file untouched" || fail "data file changed"

# inputs that are not regular files: refused at once
mkfifo fifo
for what in fifo /dev/zero "$WORK"; do
  t0=$SECONDS
  run_rc 3 "--config $what" --config "$what" -q -o "x-$RANDOM.h5"
  [ $((SECONDS - t0)) -lt 5 ] || fail "--config $what took $((SECONDS - t0)) s"
done

# a data.path naming a FIFO (relative to the config's folder): refused, no hang
mkfifo data/pipe
"$PY" -c "
import json; c = json.load(open('data/cfg.json')); c['data']['path'] = 'pipe'
json.dump(c, open('data/cfg-fifo.json', 'w'))"
t0=$SECONDS
run_rc 3 "data.path a FIFO" --config data/cfg-fifo.json -q -o fifo-data.h5
[ $((SECONDS - t0)) -lt 5 ] || fail "data.path FIFO took $((SECONDS - t0)) s"

# a data file that is missing, not HDF5, malformed or declares a shape too
# large or of no values: one line, exit 3 (bad input; it was exit 4, and a
# 2 KiB HDF5 file declaring 2^62 values killed run with SIGSEGV), no trace
# left behind; one too large for memory: exit 4, one line
"$PY" - <<'PYEOF'
import json, h5py
c = json.load(open('data/cfg.json'))
def cfg(name, **data):
    d = dict(c); d['data'] = dict(c['data'], **data)
    json.dump(d, open('data/cfg-%s.json' % name, 'w'))
cfg('missing', path='nope.csv')
open('data/text.h5', 'w').write('not HDF5\n')
cfg('nothdf5', kind='hdf5', path='text.h5')
open('data/bad.csv', 'w').write('1,2,3,4,5\n1,x,3,4,5\n')
cfg('badcsv', path='bad.csv')
open('data/ragged.csv', 'w').write('1,2,3,4,5\n1,2,3\n')
cfg('ragged', path='ragged.csv')
def declared(name, x, y):
    with h5py.File('data/%s.h5' % name, 'w') as f:
        for k, shape in (('x', x), ('y', y)):
            f.create_dataset(k, shape=shape, maxshape=(None,) * len(shape),
                             dtype='f4', chunks=tuple(min(s, 1024) or 1 for s in shape))
    cfg(name, kind='hdf5', path='%s.h5' % name)
declared('cols0', (100, 0), (100,))
declared('rows0', (0, 4), (0,))
declared('huge62', (2**62,), (2**62,))
declared('huge31', (2**31, 2**31), (2**31,))
declared('big', (2**34, 4), (2**34,))
PYEOF
for case in missing:3 nothdf5:3 badcsv:3 ragged:3 cols0:3 rows0:3 huge62:4 huge31:4 big:4; do
  name=${case%:*}
  run_rc "${case#*:}" "data file $name" --config "data/cfg-$name.json" -q -o "data-$name.h5"
  [ ! -e "data-$name.h5" ] || fail "data file $name: a trace was left behind"
done

# a config name is not a path
mkdir -p deep/a/b
"$PY" -c "
import json; c = json.load(open('$HERE/../../trainer/scenarios/healthy.json'))
c['name'] = 'x/../../escaped'; c['steps'] = 3; json.dump(c, open('deep/a/b/evil.json', 'w'))"
(cd deep/a/b && "$BIN" run --config evil.json -q >/dev/null 2>"$WORK/evn.err")
rc=$?
# the trainer refuses such a name (exit 2) or run sanitises it; never a
# file outside the working directory
[ ! -e deep/escaped.h5 ] && [ ! -e deep/a/escaped.h5 ] &&
  { [ -f "deep/a/b/ampprobe-x_.._.._escaped.h5" ] || { [ "$rc" = 2 ] && [ "$(grep -c . "$WORK/evn.err")" = 1 ]; }; } &&
  pass "config name x/../../escaped: nothing outside the working directory (exit $rc)" ||
  fail "config name: $(ls deep deep/a deep/a/b)"

# hostile names (config and layer) are printed escaped by run's summary
"$PY" - "$HERE/../../trainer/scenarios/bn-overflow.json" evil2.json <<'PYEOF'
import json, sys
c = json.load(open(sys.argv[1]))
c['name'] = 'evil\x1b[2J\nverdict healthy'
c['steps'] = 5
for m in c['model']:
    if m.get('name') == 'enc.bn1':
        m['name'] = 'enc.bn1\x07\nFORGED'
json.dump(c, open(sys.argv[2], 'w'))
PYEOF
"$BIN" run --config evil2.json -q -o evil2.h5 >evil2.out 2>evil2.err
rc=$?
if LC_ALL=C grep -q "$(printf '[\033\007]')" evil2.out evil2.err || grep -q "^FORGED\|^verdict healthy" evil2.out; then
  fail "run: hostile names reach the terminal raw (exit $rc)"
else
  pass "run: hostile names printed escaped (exit $rc)"
fi

# --progress-every: plain lines on stderr without a terminal
"$BIN" run --steps 300 --progress-every 0.01 -o prog.h5 >/dev/null 2>prog.err
n=$(grep -Ec "^ampprobe: run: step [0-9]+ of 300 \([0-9]+%\), [0-9.]+ steps/s, elapsed [0-9]+s, ETA [0-9a-z]+, loss [0-9.e+-]+, scale " prog.err)
[ "$n" -ge 2 ] && grep -q "step 300 of 300 (100%)" prog.err &&
  pass "--progress-every: $n lines, last '$(tail -1 prog.err)'" || fail "--progress-every: $(head -3 prog.err)"
"$BIN" run --steps 50 -o prog2.h5 >/dev/null 2>prog2.err
[ ! -s prog2.err ] && pass "no progress without a terminal by default" || fail "progress without a terminal: $(head -2 prog2.err)"
"$BIN" run --steps 50 -q --progress-every 0.01 -o prog3.h5 >/dev/null 2>prog3.err
[ ! -s prog3.err ] && pass "-q silences --progress-every" || fail "-q with --progress-every: $(head -2 prog3.err)"
run_rc 2 "--progress-every 0" --progress-every 0

# --steps: one wording at both ends
run_rc 2 "--steps -5" --steps -5
e1=$(cat o.err)
run_rc 2 "--steps 200000000" --steps 200000000
e2=$(cat o.err)
[ "${e1#*for --steps: }" = "${e2#*for --steps: }" ] && pass "--steps: '${e1#*run: }' / '${e2#*run: }'" ||
  fail "--steps wording: '$e1' vs '$e2'"

# a write failure (file-size limit) ends with the one-line error and exit 4
(ulimit -f 20; "$BIN" run --trace --steps 300 -q -o fsize.h5 >/dev/null 2>fsize.err; echo $? >fsize.rc)
rc=$(cat fsize.rc)
[ "$rc" = 4 ] && [ "$(grep -c . fsize.err)" = 1 ] && pass "file-size limit: exit 4, '$(cat fsize.err)'" ||
  fail "file-size limit: exit $rc, $(head -3 fsize.err)"

# Commands printed for the user to paste are shell words (F4, F10): an
# argument keeps its spaces and quotes, and text from a trace is never a
# $(...) substitution. pasted CMDLINE prints the words a shell makes of it.
pasted() { bash -c 'for a in "$@"; do printf "<%s>" "$a"; done' _ "$@"; }
cp "$HERE/../../trainer/scenarios/revin-overflow.json" "my cfg.json"
"$BIN" run --config "my cfg.json" -o "it's here.h5" >sp.out 2>&1
nextl=$(sed -n 's/^  next            //p' sp.out)
[ "$nextl" = "ampprobe postmortem 'it'\"'\"'s here.h5'" ] &&
  [ "$(eval "pasted $nextl")" = "<ampprobe><postmortem><it's here.h5>" ] &&
  pass "run's next line is pasteable: $nextl" || fail "run's next line: '$nextl'"
# a backslash in the path: one backslash in the pasted word (it was doubled
# by the display escaping, and the pasted path named another file)
"$BIN" run --scenario revin-overflow -o 'x\y z.h5' >bs.out 2>&1
nextl=$(sed -n 's/^  next            //p' bs.out)
[ "$(eval "pasted $nextl")" = "<ampprobe><postmortem><x\y z.h5>" ] &&
  pass "a backslash survives the paste: $nextl" || fail "backslash path: '$nextl'"
"$BIN" postmortem "it's here.h5" >pm.out 2>&1
nextl=$(sed -n 's/^     next: //p' pm.out | head -1)
[ "$(eval "pasted $nextl")" = "<ampprobe><bisect><--fp32-candidates><revin><--config><my cfg.json><--steps><150><--seed><1>" ] &&
  pass "postmortem's next keeps --config 'my cfg.json' whole: $nextl" ||
  fail "postmortem's next after --config 'my cfg.json': '$nextl'"
# a crafted trace: its command line and its config's fp32 list are data
cp "it's here.h5" crafted.h5
"$PY" - <<'PY'
import h5py, json
f = h5py.File('crafted.h5', 'r+')
f.attrs['command_line'] = 'ampprobe run --scenario $(touch${IFS}PWNED1) --trace'
c = json.loads(f.attrs['config_json']); c['fp32'] = ['$(touch PWNED2)']
f.attrs['config_json'] = json.dumps(c); f.close()
PY
"$BIN" postmortem crafted.h5 >cr.out 2>&1
nextl=$(sed -n 's/^     next: //p' cr.out | head -1)
(eval "pasted $nextl") >cr.words
[ ! -e PWNED1 ] && [ ! -e PWNED2 ] &&
  grep -qF '<--scenario><$(touch${IFS}PWNED1)>' cr.words &&
  grep -qF '<--fp32-candidates><$(touch PWNED2),revin>' cr.words &&
  pass "a crafted trace's command line and fp32 list stay quoted words: $nextl" ||
  fail "crafted trace: next '$nextl' (words $(cat cr.words)); $(ls PWNED* 2>/dev/null)"

# --max-memory SIZE (2026-12-04): the trainer's refusal said "raise
# max_memory", a library field no flag set. Units, bad values, the refusal
# naming the flag, and a run it lets through.
cat >mm.json <<'JSON'
{"name": "mm", "steps": 2, "precision": "fp16",
 "model": [{"type": "linear", "name": "fc1", "out": 65536},
           {"type": "linear", "name": "fc2", "out": 1}],
 "data": {"kind": "regression", "batch": 32, "features": 16, "outputs": 1}}
JSON
run_rc 4 "--max-memory 32M on a larger model" --config mm.json --max-memory 32M -q -o mm1.h5
grep -q 'more than the limit of 32.00 MiB (max_memory).*raise max_memory (--max-memory SIZE)$' o.err &&
  pass "the refusal names the limit and the flag" || fail "refusal: '$(cat o.err)'"
[ ! -e mm1.h5 ] && pass "no trace left by a refused run" || fail "mm1.h5 left behind"
for v in 1G 1g 1GiB 1024MiB 1048576K 1073741824 0.5T 1.5G; do
  run_rc 0 "--max-memory $v" --config mm.json --max-memory "$v" -q -o "mm-$v.h5"
done
for v in "" 1x -1G 1e9 1.2.3G "1 G" 0x10M nanG G . 15M 2048T; do
  run_rc 2 "--max-memory '$v'" --config mm.json --max-memory "$v" -q -o mm2.h5
done
grep -q "must be in \[16 MiB, 1024 TiB\]" o.err && pass "the range is named" ||
  fail "range: '$(cat o.err)'"
[ ! -e mm2.h5 ] && pass "no trace after a bad --max-memory" || fail "mm2.h5 left behind"

# A long -o (2026-12-04): a path over 1023 bytes was cut there, and the
# trace (with --force: replacing it) went to the file that prefix named.
# The exact path is written, or one over PATH_MAX refused; the prefix's
# file is untouched either way.
long=$WORK/$(printf 'd%.0s' $(seq 200))
for k in 1 2 3 4; do long=$long/$(printf 'e%.0s' $(seq 200)); done
mkdir -p "$long"
name="$long/precious.csv.and-a-longer-suffix-for-the-trace.h5"
cut=$(printf '%s' "$name" | head -c 1023)
echo "precious" >"$cut"
run_rc 0 "-o of ${#name} bytes --force" --steps 3 -q -o "$name" --force
[ "$(cat "$cut")" = precious ] && pass "the file a 1023-byte prefix names is untouched" ||
  fail "the prefix's file was replaced"
"$BIN" postmortem "$name" >/dev/null 2>&1 && pass "the trace is at the path named" ||
  fail "no trace at the path named"
huge=$long
for k in 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20; do huge=$huge/$(printf 'f%.0s' $(seq 200)); done
run_rc 2 "-o of ${#huge} bytes" --steps 3 -q -o "$huge/t.h5"
grep -q "the path is too long" o.err && pass "named too long" || fail "'$(cat o.err)'"
# ... and their errors keep the reason: a message cut at 1,023 bytes (the
# CLI's) or 511 (the reader's) was the path alone
head -c 100 /dev/zero | tr '\0' 'x' >"$long/bad.h5"
"$BIN" postmortem "$long/bad.h5" >o.out 2>o.err
rc=$?
[ $rc = 3 ] && grep -q "bad.h5: .*HDF5" o.err && [ "$(wc -l <o.err)" = 1 ] &&
  pass "postmortem of a ${#long}-byte path: the reason kept ($(sed -E 's/[ed]{20,}/<.>/g' o.err | head -c 160))" ||
  fail "postmortem of a long path: rc $rc, '$(head -c 300 o.err)'"
"$BIN" report "$name" -o "$huge/r.html" >o.out 2>o.err
rc=$?
[ $rc = 4 ] && grep -q "^ampprobe: report: cannot write .*: File name too long$" o.err &&
  pass "report -o a path over PATH_MAX: File name too long" ||
  fail "report -o huge: rc $rc, '$(head -c 300 o.err | sed -E 's/[def]{20,}/<.>/g')'"

echo "$FAILS failure(s)"
[ "$FAILS" = 0 ]
