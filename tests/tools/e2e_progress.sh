#!/usr/bin/env bash
# tests/tools/e2e_progress.sh - the progress line of `ampprobe postmortem
# TRACE` (tools/postmortem.c over probe_trace_open_isolated_progress and
# probe_diag_run_progress): with stderr on a pseudo-terminal it shows
# "checking TRACE: N% (... rows)" and "analysing TRACE: N% ...", erased
# before the report (stdout the same as without it); nothing with -q,
# nothing before its delay (AMPPROBE_PROGRESS_DELAY, 1 s by default: 0 here,
# so that a trace of 60,000 records needs no seconds of work), and nothing
# at all with stderr to a file. The pty checks fail on the CLI before the
# line existed. Given SYNTH_RANKS (bench/synth_ranks), the same for a set
# of 96 rank files (probe_ranks_run_progress): "reading rank files: N% (k
# of 96 files)", then the focus rank's "checking/analysing the focus rank".
# `ampprobe report` the same (tools/report.c): of a trace "checking",
# "analysing" and "plotting TRACE: N% (... rows)"; of a set also "scanning
# rank files: N% (k of 96 files)"; erased before its "wrote" line.
# `ampprobe diff` the same: "checking" A and B, "comparing A and B: N%"; of
# two sets "reading rank files" and "comparing rank R: N%".
#
# usage: e2e_progress.sh AMPPROBE_BINARY MANY_LAYERS_TRACE [SYNTH_RANKS]
set -u
BIN=${1:?usage: e2e_progress.sh AMPPROBE_BINARY MANY_LAYERS_TRACE [SYNTH_RANKS]}
GEN=${2:?usage: e2e_progress.sh AMPPROBE_BINARY MANY_LAYERS_TRACE [SYNTH_RANKS]}
SYNTH=${3:-}
PY=/usr/bin/python3
WORK=$(mktemp -d "${TMPDIR:-/tmp}/ampprobe-e2e-progress.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
FAILS=0
fail() { echo "FAIL: $*"; FAILS=$((FAILS + 1)); }
pass() { echo "ok:   $*"; }
# nothing WHAT FILE: passes when FILE (what stderr got) is empty
nothing() {
  if [ -s "$2" ]; then
    fail "$1: $(head -c 300 "$2" | od -c | head -3)"
  else
    pass "$1: nothing"
  fi
}
# erased FILE: what the terminal got is one self-overwriting line, erased
# at the end
erased() {
  "$PY" -c '
import sys
b = open(sys.argv[1], "rb").read()
sys.exit(0 if b.endswith(b"\r\x1b[K") and b"\n" not in b else 1)' "$1"
}

"$PY" -c 'import pty' 2>/dev/null || { echo "SKIP: no python3 pty module"; exit 0; }
T="$WORK/t.h5"
"$GEN" "$T" 20 3000 >/dev/null || { echo "FAIL: cannot write the trace"; exit 1; }

# pty_run OUT ERR ARGS...: runs ARGS with stderr on a pseudo-terminal (stdin
# /dev/null, stdout to OUT), what the terminal got to ERR; sets RC
pty_run() {
  local out=$1 err=$2
  shift 2
  "$PY" - "$out" "$err" "$@" <<'PYEOF'
import os, pty, subprocess, sys
out, err, argv = sys.argv[1], sys.argv[2], sys.argv[3:]
m, s = pty.openpty()
with open(out, "wb") as o:
    p = subprocess.Popen(argv, stdout=o, stderr=s, stdin=subprocess.DEVNULL)
os.close(s)
got = b""
while True:
    try:
        r = os.read(m, 65536)
    except OSError:  # EIO: the last writer closed the terminal
        break
    if not r:
        break
    got += r
open(err, "wb").write(got)
sys.exit(p.wait())
PYEOF
  RC=$?
}

# on_tty WHAT REF_RC ENDCHECK ERR PATTERN...: after pty_run (RC), the exit
# code is REF_RC, the terminal got every PATTERN (grep -E) and ENDCHECK ERR
# passes (erased, erased_then_wrote)
on_tty() {
  local what=$1 ref=$2 endcheck=$3 err=$4 pat
  shift 4
  if [ "$RC" != "$ref" ]; then
    fail "$what: exit $RC, not $ref"
    return
  fi
  for pat in "$@"; do
    if ! grep -qE "$pat" "$err"; then
      fail "$what: no '$pat': $(head -c 400 "$err" | od -c | head -5)"
      return
    fi
  done
  if ! "$endcheck" "$err"; then
    fail "$what: not one line erased at the end: $(tail -c 200 "$err" | od -c | tail -4)"
    return
  fi
  pass "$what: the line drawn, erased at the end"
}
# same_out WHAT A B: the stdout with a terminal is the one without
same_out() {
  cmp -s "$2" "$3" || fail "$1: stdout differs from the one without a terminal"
}

# the reference: stderr to a file
"$BIN" postmortem "$T" >"$WORK/ref.out" 2>"$WORK/ref.err"
REF_RC=$?
[ "$REF_RC" -le 1 ] || fail "postmortem of the trace: exit $REF_RC: $(cat "$WORK/ref.err")"
nothing "stderr to a file" "$WORK/ref.err"
AMPPROBE_PROGRESS_DELAY=0 "$BIN" postmortem "$T" >"$WORK/ref0.out" 2>"$WORK/ref0.err"
nothing "stderr to a file, delay 0" "$WORK/ref0.err"

# on a terminal, at once
AMPPROBE_PROGRESS_DELAY=0 pty_run "$WORK/tty.out" "$WORK/tty.err" "$BIN" postmortem "$T"
same_out "on a terminal" "$WORK/tty.out" "$WORK/ref.out"
on_tty "on a terminal (checking, analysing)" "$REF_RC" erased "$WORK/tty.err" \
  "checking [^ ]*t\.h5: [0-9]+% \([0-9.kM]+ of [0-9.kM]+ rows\)" \
  "analysing [^ ]*t\.h5: [0-9]+% \("

# -q: nothing
AMPPROBE_PROGRESS_DELAY=0 pty_run "$WORK/q.out" "$WORK/q.err" "$BIN" postmortem -q "$T"
if [ -s "$WORK/q.err" ] || ! cmp -s "$WORK/q.out" "$WORK/ref.out"; then
  fail "-q on a terminal: stderr $(head -c 200 "$WORK/q.err" | od -c | head -3)"
else
  pass "-q on a terminal: nothing"
fi

# not before the delay
AMPPROBE_PROGRESS_DELAY=3600 pty_run "$WORK/d.out" "$WORK/d.err" "$BIN" postmortem "$T"
if grep -q "%" "$WORK/d.err"; then
  fail "before its delay the line was drawn: $(head -c 200 "$WORK/d.err" | od -c | head -3)"
else
  pass "nothing before the delay"
fi

# report: "checking", "analysing" and "plotting t.h5: N% (... rows)", erased
# before the one line that says what was written
# erased_then_wrote FILE: the line erased, then only "ampprobe: report: wrote"
erased_then_wrote() {
  "$PY" -c '
import sys
b = open(sys.argv[1], "rb").read()
head, sep, tail = b.rpartition(b"ampprobe: report: wrote ")
sys.exit(0 if sep and head.endswith(b"\r\x1b[K") and b"\n" not in head
         and tail.count(b"\n") == 1 and tail.endswith(b"\n") else 1)' "$1"
}
"$BIN" report "$T" -o "$WORK/ref.html" >/dev/null 2>"$WORK/rref.err"
RREF_RC=$?
[ "$RREF_RC" -le 1 ] || fail "report of the trace: exit $RREF_RC: $(cat "$WORK/rref.err")"
AMPPROBE_PROGRESS_DELAY=0 pty_run "$WORK/rtty.out" "$WORK/rtty.err" "$BIN" report "$T" -o "$WORK/tty.html"
on_tty "report on a terminal (checking, analysing, plotting)" "$RREF_RC" \
  erased_then_wrote "$WORK/rtty.err" "checking [^ ]*t\.h5: [0-9]+% \(" \
  "analysing [^ ]*t\.h5: [0-9]+% \(" \
  "plotting [^ ]*t\.h5: [0-9]+% \([0-9.kM]+ of [0-9.kM]+ rows\)"
AMPPROBE_PROGRESS_DELAY=0 pty_run "$WORK/rq.out" "$WORK/rq.err" "$BIN" report -q "$T" -o "$WORK/q.html"
nothing "report -q on a terminal" "$WORK/rq.err"
AMPPROBE_PROGRESS_DELAY=0 "$BIN" report "$T" -o "$WORK/f.html" >/dev/null 2>"$WORK/rf.err"
if grep -q "%" "$WORK/rf.err"; then
  fail "report, stderr to a file: a progress line: $(head -c 200 "$WORK/rf.err" | od -c | head -3)"
else
  pass "report, stderr to a file: no progress line"
fi

# diff (2026-12-04; it drew nothing): "checking" each trace, then
# "comparing A and B: N% (... rows)", erased before the result
cp "$T" "$WORK/t2.h5"
"$BIN" diff "$T" "$WORK/t2.h5" >"$WORK/dref.out" 2>"$WORK/dref.err"
DREF_RC=$?
[ "$DREF_RC" -le 1 ] || fail "diff of the traces: exit $DREF_RC: $(cat "$WORK/dref.err")"
AMPPROBE_PROGRESS_DELAY=0 "$BIN" diff "$T" "$WORK/t2.h5" >/dev/null 2>"$WORK/dref0.err"
nothing "diff, stderr to a file, delay 0" "$WORK/dref0.err"
AMPPROBE_PROGRESS_DELAY=0 pty_run "$WORK/dtty.out" "$WORK/dtty.err" "$BIN" diff "$T" "$WORK/t2.h5"
same_out "diff on a terminal" "$WORK/dtty.out" "$WORK/dref.out"
on_tty "diff on a terminal (checking A, checking B, comparing)" "$DREF_RC" erased "$WORK/dtty.err" \
  "checking [^ ]*/t\.h5: [0-9]+% \(" "checking [^ ]*/t2\.h5: [0-9]+% \(" \
  "comparing [^ ]*/t\.h5 and [^ ]*/t2\.h5: [0-9]+% \([0-9.kM]+ of [0-9.kM]+ rows\)"
AMPPROBE_PROGRESS_DELAY=0 pty_run "$WORK/dq.out" "$WORK/dq.err" "$BIN" diff -q "$T" "$WORK/t2.h5"
nothing "diff -q on a terminal" "$WORK/dq.err"

# a rank set
if [ -z "$SYNTH" ]; then
  echo "skip: the rank set (no bench/synth_ranks given: AMPPROBE_BUILD_BENCH off)"
else
  S="$WORK/set"
  "$SYNTH" --out "$S" --ranks 96 --steps 200 --layers 8 --quiet >/dev/null ||
    { echo "FAIL: cannot write the rank set"; exit 1; }
  "$BIN" postmortem "$S" >"$WORK/sref.out" 2>"$WORK/sref.err"
  SREF_RC=$?
  [ "$SREF_RC" -le 1 ] || fail "postmortem of the set: exit $SREF_RC: $(cat "$WORK/sref.err")"
  AMPPROBE_PROGRESS_DELAY=0 "$BIN" postmortem "$S" >/dev/null 2>"$WORK/sref0.err"
  nothing "a set, stderr to a file, delay 0" "$WORK/sref0.err"
  AMPPROBE_PROGRESS_DELAY=0 pty_run "$WORK/stty.out" "$WORK/stty.err" "$BIN" postmortem "$S"
  same_out "a set on a terminal" "$WORK/stty.out" "$WORK/sref.out"
  on_tty "a set on a terminal (files read)" "$SREF_RC" erased "$WORK/stty.err" \
    "reading rank files: [0-9]+% \([0-9]+ of 96 files\)"
  AMPPROBE_PROGRESS_DELAY=0 pty_run "$WORK/sq.out" "$WORK/sq.err" "$BIN" postmortem -q "$S"
  nothing "a set, -q on a terminal" "$WORK/sq.err"
  # report of the set: the files read, then scanned (the chosen rank's
  # checking and plotting take less than the line's 0.1 s between draws)
  "$BIN" report "$S" -o "$WORK/sref.html" >/dev/null 2>"$WORK/srref.err"
  SRREF_RC=$?
  [ "$SRREF_RC" -le 1 ] || fail "report of the set: exit $SRREF_RC: $(cat "$WORK/srref.err")"
  AMPPROBE_PROGRESS_DELAY=0 pty_run "$WORK/srtty.out" "$WORK/srtty.err" "$BIN" report "$S" -o "$WORK/stty.html"
  on_tty "report of a set on a terminal (files read, scanned)" "$SRREF_RC" \
    erased_then_wrote "$WORK/srtty.err" \
    "reading rank files: [0-9]+% \([0-9]+ of 96 files\)" \
    "scanning rank files: [0-9]+% \([0-9]+ of 96 files\)"
  AMPPROBE_PROGRESS_DELAY=0 pty_run "$WORK/srq.out" "$WORK/srq.err" "$BIN" report -q "$S" -o "$WORK/sq.html"
  nothing "report of a set, -q on a terminal" "$WORK/srq.err"
  # diff of two sets: the files of each read, then the ranks compared
  cp -r "$S" "$WORK/set2"
  "$BIN" diff "$S" "$WORK/set2" >"$WORK/sdref.out" 2>"$WORK/sdref.err"
  SDREF_RC=$?
  [ "$SDREF_RC" -le 1 ] || fail "diff of the sets: exit $SDREF_RC: $(cat "$WORK/sdref.err")"
  AMPPROBE_PROGRESS_DELAY=0 pty_run "$WORK/sdtty.out" "$WORK/sdtty.err" "$BIN" diff "$S" "$WORK/set2"
  same_out "diff of sets on a terminal" "$WORK/sdtty.out" "$WORK/sdref.out"
  on_tty "diff of sets on a terminal (files read, ranks compared)" "$SDREF_RC" erased \
    "$WORK/sdtty.err" "reading rank files: [0-9]+% \([0-9]+ of 96 files\)" \
    "comparing rank [0-9]+: [0-9]+% \("
  AMPPROBE_PROGRESS_DELAY=0 pty_run "$WORK/sdq.out" "$WORK/sdq.err" "$BIN" diff -q "$S" "$WORK/set2"
  nothing "diff of sets, -q on a terminal" "$WORK/sdq.err"
fi

[ "$FAILS" = 0 ] || { echo "$FAILS check(s) failed"; exit 1; }
echo "all passed"
