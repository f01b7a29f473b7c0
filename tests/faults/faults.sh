#!/usr/bin/env bash
# tests/faults/faults.sh - fault injection for the `ampprobe` tools (#17):
# what happens when writing fails (file-size limit, full file system,
# /dev/full, /dev/null), when two writers share an output, when an output
# is an input, when an input is a FIFO or a device, when names in a trace
# are hostile, when a bisect work directory holds planted symlinks, and
# when bisect is SIGKILLed.
#
#   faults.sh CASE AMPPROBE HOSTILE_TRACE WORKDIR [CLOSED_FDS_READER]
#
# One CASE per CTest test (tests/faults/CMakeLists.txt, label `faults`).
# Every command runs under `timeout`, so a regression that hangs fails
# instead of blocking the suite. A case whose fix is not in this tree yet is
# registered with PENDING=<what it needs>: its failures are then printed
# and the case exits 77 (skipped) naming that fix; when it passes anyway it
# says the mark can go. Cases that need something the machine lacks (a
# mount namespace) print why and exit 77.
set -u
CASE=$1
AMP=$2
HOSTILE=$3
W=$4
CLOSED_FDS=${5:-}
rm -rf "$W" && mkdir -p "$W" && cd "$W" || exit 1
TMO=${FAULTS_TIMEOUT:-60}
fail=0

ok() { echo "ok   $*"; }
bad() { echo "FAIL $*"; fail=1; }
skip() { echo "SKIP: $*"; exit 77; }

# t [LIMIT_KB] -- cmd...: runs cmd with a timeout (and a file-size limit in
# KiB when given), stdout to out.txt, stderr to err.txt; sets rc.
t() {
  local lim=
  if [ "$1" != "--" ]; then lim=$1; shift; fi
  shift
  if [ -n "$lim" ]; then
    # the limit applies to every regular file the command writes, so its
    # stdout and stderr go through pipes to writers outside the limit
    rm -f .o.fifo .e.fifo && mkfifo .o.fifo .e.fifo
    cat .o.fifo >out.txt & local co=$!
    cat .e.fifo >err.txt & local ce=$!
    (ulimit -f "$lim"; exec timeout -k 5 "$TMO" "$@") >.o.fifo 2>.e.fifo
    rc=$?
    wait $co $ce
    rm -f .o.fifo .e.fifo
    return
  else
    timeout -k 5 "$TMO" "$@" >out.txt 2>err.txt
  fi
  rc=$?
}

# expect WANT DESC: rc must be one of WANT ("4" or "0|1").
expect() {
  if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
    bad "$2: timed out after ${TMO}s (a hang)"
  elif echo "|$1|" | grep -q "|$rc|"; then
    ok "$2 (exit $rc)"
  else
    bad "$2: exit $rc, want $1"; sed 's/^/     | /' err.txt | head -5
  fi
}

# one_line WHAT [TEXT]: err.txt is exactly one 'ampprobe: ...' line
# (no raw HDF5 error stack), containing TEXT when given.
one_line() {
  local n
  n=$(wc -l <err.txt)
  if [ "$n" -ne 1 ] || ! head -1 err.txt | grep -q '^ampprobe: '; then
    bad "$1: stderr is not one 'ampprobe: ' line ($n lines)"
    sed 's/^/     | /' err.txt | head -6
  elif [ $# -ge 2 ] && ! grep -qF -- "$2" err.txt; then
    bad "$1: stderr lacks '$2': $(cat err.txt)"
  else
    ok "$1: one line: $(cat err.txt)"
  fi
}

has() { if grep -qF -- "$2" "$1"; then ok "$1 has '$2'"; else bad "$1 lacks '$2'"; fi; }
hasnt() { if grep -qF -- "$2" "$1"; then bad "$1 has '$2'"; else ok "$1 lacks '$2'"; fi; }
absent() { if [ -e "$1" ]; then bad "$1 exists ($2)"; else ok "$1 absent ($2)"; fi; }
no_temps() { # no temporary files left in a directory
  local left
  left=$(find "$1" -maxdepth 1 -name '.*.tmp-*' | head -3)
  if [ -n "$left" ]; then bad "temporary files left in $1: $left"; else ok "no temporary files left in $1"; fi
}
unchanged() { # unchanged FILE SUM WHAT
  if [ "$(cksum <"$1")" = "$2" ]; then ok "$1 unchanged ($3)"; else bad "$1 was modified ($3)"; fi
}
sum() { cksum <"$1"; }

# Fixtures: a problem run with its FP32 baseline.
fixtures() {
  "$AMP" run --scenario revin-overflow --trace -q -o fp16.h5 >/dev/null 2>&1
  "$AMP" run --scenario revin-overflow --precision fp32 --trace -q -o fp32.h5 >/dev/null 2>&1
  [ -s fp16.h5 ] && [ -s fp32.h5 ] || { echo "cannot make the fixture traces"; exit 1; }
}

# The file a trace writer left must open (exit 0 or 1, never 3/4).
trace_opens() {
  t -- "$AMP" postmortem "$1"
  expect "0|1" "$2: the trace left behind opens"
}

case_fsize_report() {
  fixtures
  "$AMP" report fp32.h5 -o old.html -q # an earlier page, which report may replace
  local s; s=$(sum old.html)
  for lim in 0 4 16; do
    t "$lim" -- "$AMP" report fp16.h5 --baseline fp32.h5 -o new$lim.html
    expect 4 "report under ulimit -f $lim"
    one_line "report under ulimit -f $lim" "cannot write new$lim.html: File too large"
    absent new$lim.html "no truncated report"
    t "$lim" -- "$AMP" report fp16.h5 -o old.html -q
    expect 4 "report over an existing file under ulimit -f $lim"
    unchanged old.html "$s" "the earlier report survives a failed write"
  done
  no_temps .
  t -- "$AMP" report fp16.h5 -o fine.html -q
  expect 1 "report without a limit"
}

case_fsize_diff() {
  fixtures
  for lim in 0 2; do
    t "$lim" -- "$AMP" diff fp16.h5 fp32.h5 -q --top 3 -o d$lim.json
    expect 4 "diff -o under ulimit -f $lim"
    has err.txt "File too large"
    absent d$lim.json "no truncated JSON"
  done
  no_temps .
}

case_fsize_postmortem() {
  fixtures
  # stdout to a regular file is limited too
  t 0 -- sh -c "exec \"$AMP\" postmortem fp16.h5 >pm.txt"
  expect 4 "postmortem > file under ulimit -f 0"
  one_line "postmortem > file" "File too large"
  t 0 -- sh -c "exec \"$AMP\" postmortem --json fp16.h5 >pm.json"
  expect 4 "postmortem --json > file under ulimit -f 0"
  one_line "postmortem --json > file" "File too large"
  if "$AMP" postmortem --help 2>&1 | grep -q -- '-o, --output'; then
    t 0 -- "$AMP" postmortem fp16.h5 -o pm-o.txt
    expect 4 "postmortem -o under ulimit -f 0"
    has err.txt "File too large"
    absent pm-o.txt "no truncated output"
  else
    echo "note postmortem has no -o option: only its stdout is checked"
  fi
}

case_fsize_run() {
  for lim in 0 100 300; do
    t "$lim" -- "$AMP" run --scenario healthy --trace -q -o r$lim.h5
    expect 4 "run --trace under ulimit -f $lim"
    one_line "run --trace under ulimit -f $lim"
    # the errno text, or libprobe's own words for the limit it checks first
    if grep -qiE "File too large|file-size limit" err.txt; then ok "names the limit"
    else bad "the message does not name the file-size limit"; fi
    if [ "$lim" -gt 100 ] && [ -e r$lim.h5 ]; then trace_opens r$lim.h5 "run under ulimit -f $lim"; fi
  done
}

# A small tmpfs in a private mount namespace (needs root and unshare).
in_small_fs() { # in_small_fs SIZE SCRIPT
  unshare -m sh -c "mount -t tmpfs -o size=$1 tmpfs \"$W/fs\" && cd \"$W/fs\" && $2"
}

need_mount_ns() {
  mkdir -p fs
  local why
  why=$(unshare -m sh -c "mount -t tmpfs -o size=64k tmpfs \"$W/fs\"" 2>&1) ||
    skip "no small file system can be made here (unshare -m + mount tmpfs: ${why:-failed}; needs root and CAP_SYS_ADMIN)"
}

case_full_fs_report() {
  need_mount_ns
  fixtures
  in_small_fs 24k "\"$AMP\" report ../fp16.h5 -o r.html >../out.txt 2>../err.txt; echo \$? >../rc.txt; ls -A >../ls.txt"
  rc=$(cat rc.txt)
  expect 4 "report into a full file system"
  one_line "report into a full file system" "cannot write r.html: No space left on device"
  hasnt ls.txt "r.html"
  hasnt ls.txt ".tmp-"
  in_small_fs 1m "mount -o remount,ro \"$W/fs\" && \"$AMP\" report ../fp16.h5 -o r.html >../out.txt 2>../err.txt; echo \$? >../rc.txt"
  rc=$(cat rc.txt)
  expect 4 "report into a read-only file system"
  one_line "report into a read-only file system" "Read-only file system"
}

case_full_fs_diff() {
  need_mount_ns
  fixtures
  in_small_fs 4k "head -c 2048 /dev/zero >pad; \"$AMP\" diff ../fp16.h5 ../fp32.h5 -q -o d.json >../out.txt 2>../err.txt; echo \$? >../rc.txt; ls -A >../ls.txt"
  rc=$(cat rc.txt)
  expect 4 "diff -o into a full file system"
  has err.txt "No space left on device"
  hasnt ls.txt "d.json"
}

case_full_fs_run() {
  need_mount_ns
  in_small_fs 96k "\"$AMP\" run --scenario healthy --trace -q -o t.h5 >../out.txt 2>../err.txt; echo \$? >../rc.txt; cp t.h5 ../t-full.h5 2>/dev/null; true"
  rc=$(cat rc.txt)
  expect 4 "run --trace into a full file system"
  one_line "run --trace into a full file system"
  if grep -qi "no space left" err.txt; then ok "names the full disk"
  else bad "the message does not say the disk is full"; fi
}

case_devices_report() {
  fixtures
  t -- "$AMP" report fp16.h5 -o /dev/full
  expect 4 "report -o /dev/full"
  one_line "report -o /dev/full" "cannot write /dev/full: No space left on device"
  t -- "$AMP" report fp16.h5 -o /dev/null -q
  expect "1" "report -o /dev/null"
  [ -c /dev/null ] && ok "/dev/null is still a device" || bad "/dev/null was replaced"
  # stdout lost: every command checks it at exit
  for cmd in "--help" "--version" "report --help" "run --list-scenarios" "run --help"; do
    t -- sh -c "exec \"$AMP\" $cmd >/dev/full"
    expect 4 "ampprobe $cmd >/dev/full"
    one_line "ampprobe $cmd >/dev/full" "cannot write standard output: No space left on device"
  done
  t -- sh -c "exec \"$AMP\" --version >&-"
  expect 4 "ampprobe --version with stdout closed"
  one_line "stdout closed" "Bad file descriptor"
}

case_devices_analysis() {
  fixtures
  t -- "$AMP" diff fp16.h5 fp32.h5 -q -o /dev/full
  expect 4 "diff -o /dev/full"
  one_line "diff -o /dev/full" "No space left on device"
  t -- "$AMP" diff fp16.h5 fp32.h5 -q -o /dev/null
  expect 1 "diff -o /dev/null"
  [ -c /dev/null ] && ok "/dev/null is still a device" || bad "/dev/null was replaced"
  for cmd in "postmortem fp16.h5" "postmortem --json fp16.h5" "diff fp16.h5 fp32.h5" "diff --json fp16.h5 fp32.h5"; do
    t -- sh -c "exec \"$AMP\" $cmd >/dev/full"
    expect 4 "ampprobe $cmd >/dev/full"
    one_line "ampprobe $cmd >/dev/full" "No space left on device"
  done
}

case_devices_run() {
  for dev in /dev/null /dev/full; do
    # an existing path: refused as such (exit 2) unless --force, then the
    # writer refuses a file that is not a regular file (exit 4)
    t -- "$AMP" run --scenario healthy --trace -q -o $dev
    expect "2|4" "run --trace -o $dev"
    one_line "run --trace -o $dev"
    t -- "$AMP" run --scenario healthy --trace -q --force -o $dev
    expect 4 "run --trace --force -o $dev"
    one_line "run --trace --force -o $dev"
    [ -c $dev ] && ok "$dev is still a device" || bad "$dev was replaced"
  done
}

# Two writers, one output: at most one succeeds, the file stays a trace.
case_concurrent_run() {
  local pairs=5 i
  for i in $(seq $pairs); do
    rm -f same.h5
    (timeout -k 5 "$TMO" "$AMP" run --scenario healthy --trace -q -o same.h5 >a.out 2>a.err; echo $? >a.rc) &
    (timeout -k 5 "$TMO" "$AMP" run --scenario healthy --trace -q -o same.h5 >b.out 2>b.err; echo $? >b.rc) &
    wait
    local ra rb
    ra=$(cat a.rc); rb=$(cat b.rc)
    # the loser finds the trace locked (exit 4) or already there (exit 2:
    # run refuses an existing trace without --force)
    if { [ "$ra" -le 1 ] && { [ "$rb" = 4 ] || [ "$rb" = 2 ]; }; } ||
       { [ "$rb" -le 1 ] && { [ "$ra" = 4 ] || [ "$ra" = 2 ]; }; }; then
      ok "pair $i: one writer won, the other exit $ra/$rb ($(cat a.err b.err | head -1))"
    else
      bad "pair $i: exits $ra and $rb (want one 0/1 and one 2 or 4)"
      cat a.err b.err | sed 's/^/     | /' | head -6
    fi
    trace_opens same.h5 "pair $i"
  done
}

case_input_output_report() {
  fixtures
  local s16 s32
  s16=$(sum fp16.h5); s32=$(sum fp32.h5)
  t -- "$AMP" report fp16.h5 -o fp16.h5
  expect 2 "report T -o T"; one_line "report T -o T" "also an input"
  t -- "$AMP" report fp16.h5 --baseline fp32.h5 -o fp32.h5
  expect 2 "report T --baseline X -o X"
  t -- "$AMP" report fp16.h5 -o ./././fp16.h5
  expect 2 "report T -o ./././T"
  ln fp16.h5 hard.h5
  t -- "$AMP" report fp16.h5 -o hard.h5
  expect 2 "report T -o HARDLINK-TO-T"; one_line "hard link" "same file as the input fp16.h5"
  ln -s fp32.h5 sym.h5
  t -- "$AMP" report fp16.h5 --baseline fp32.h5 -o sym.h5
  expect 2 "report T --baseline X -o SYMLINK-TO-X"
  mkdir -p sub
  t -- "$AMP" report fp16.h5 --baseline sub/../fp32.h5 -o fp32.h5
  expect 2 "report T --baseline sub/../X -o X"
  "$AMP" bisect --scenario revin-overflow --fp32-candidates revin -q --workdir bw -o b.json >/dev/null 2>&1
  local sb; sb=$(sum b.json)
  t -- "$AMP" report fp16.h5 --bisect b.json -o b.json
  expect 2 "report T --bisect B -o B"
  unchanged fp16.h5 "$s16" "inputs survive"
  unchanged fp32.h5 "$s32" "inputs survive"
  unchanged b.json "$sb" "inputs survive"
  t -- "$AMP" report fp16.h5 -o sym-new.html -q
  expect 1 "an ordinary output is still written"
}

case_input_output_diff() {
  fixtures
  local s16 s32
  s16=$(sum fp16.h5); s32=$(sum fp32.h5)
  t -- "$AMP" diff fp16.h5 fp32.h5 -q -o fp16.h5
  expect 2 "diff A B -o A"
  t -- "$AMP" diff fp16.h5 fp32.h5 -q -o fp32.h5
  expect 2 "diff A B -o B"
  ln -s fp16.h5 link.h5
  t -- "$AMP" diff fp16.h5 fp32.h5 -q -o link.h5
  expect 2 "diff A B -o SYMLINK-TO-A"
  unchanged fp16.h5 "$s16" "inputs survive"
  unchanged fp32.h5 "$s32" "inputs survive"
}

case_input_output_run_bisect() {
  "$AMP" run --scenario healthy --trace -q -o keep.h5 >/dev/null 2>&1
  cat >cfg.json <<'JSON'
{"name": "io", "steps": 5, "model": [{"type": "linear", "name": "fc", "out": 4}],
 "loss": "mse", "data": {"kind": "regression", "batch": 8, "features": 4, "outputs": 4}}
JSON
  local sc sk
  sc=$(sum cfg.json); sk=$(sum keep.h5)
  t -- "$AMP" run --config cfg.json -q -o cfg.json
  expect "2|4" "run --config X -o X"
  unchanged cfg.json "$sc" "the config survives"
  t -- "$AMP" run --scenario healthy --trace -q -o keep.h5
  expect "2|4" "run -o onto an existing trace"
  unchanged keep.h5 "$sk" "the earlier trace survives"
  t -- "$AMP" bisect --config cfg.json --fp32-candidates linear -q -o cfg.json
  expect "2|4" "bisect --config X -o X"
  unchanged cfg.json "$sc" "the config survives"
}

# FIFOs and devices as inputs: refused at once, never read forever.
case_fifo_report() {
  TMO=15 # an answer takes well under a second; a hang is cut short
  fixtures
  mkfifo pipe
  echo '{}' >empty.json
  for args in "pipe" "fp16.h5 --baseline pipe" "fp16.h5 --bisect pipe" \
              "/dev/zero" "fp16.h5 --baseline /dev/zero" "fp16.h5 --bisect /dev/zero" \
              "fp16.h5 --bisect /dev/stdin"; do
    t -- "$AMP" report $args -o x.html
    expect 3 "report $args"
    one_line "report $args" "not a regular file"
  done
  # a directory is a trace set (its *.h5 files): one without any is refused
  mkdir nothing
  t -- "$AMP" report nothing -o x.html
  expect 3 "report nothing/ (a trace set without a trace)"
  one_line "report nothing/" "no .h5 file"
  absent x.html "nothing written"
}

case_fifo_analysis() {
  TMO=15
  fixtures
  mkfifo pipe
  for args in "postmortem pipe" "postmortem /dev/zero" "diff pipe fp32.h5" \
              "diff fp16.h5 pipe" "diff fp16.h5 /dev/zero"; do
    t -- "$AMP" $args
    expect 3 "$args"
    one_line "$args" "not a regular file"
  done
}

case_fifo_run_bisect() {
  TMO=15
  mkfifo pipe
  cat >cfg.json <<JSON
{"name": "fifo", "steps": 5, "model": [{"type": "linear", "name": "fc", "out": 4}],
 "loss": "mse", "data": {"kind": "csv", "path": "$W/pipe", "targets": 1}}
JSON
  for args in "run --config pipe -q -o a.h5" "run --config /dev/zero -q -o b.h5" \
              "run --config cfg.json -q -o c.h5" \
              "bisect --config pipe --fp32-candidates linear -q" ; do
    t -- "$AMP" $args
    expect "2|3|4" "$args"
    one_line "$args"
  done
  # the data file's refusal names the config key, as docs/config.md says
  t -- "$AMP" run --config cfg.json -q -o d.h5
  expect 3 "data.path a FIFO"
  one_line "data.path a FIFO" "data.path $W/pipe: a FIFO; only regular files are read"
}

# Layer names with ESC[2J, a newline forging a line, BEL and CR.
check_no_raw() { # check_no_raw FILE WHAT
  if LC_ALL=C grep -q "$(printf '[\033\007\r]')" "$1"; then
    bad "$2: raw control characters in the output"
    LC_ALL=C grep -n "$(printf '[\033\007\r]')" "$1" | cat -v | head -3 | sed 's/^/     | /'
  else
    ok "$2: no raw ESC, BEL or CR"
  fi
  if grep -q '^FORGED' "$1"; then
    bad "$2: a name forged a line: $(grep '^FORGED' "$1" | head -1)"
  else
    ok "$2: no forged line"
  fi
}

hostile_fixtures() {
  "$HOSTILE" h16.h5 fp16 && "$HOSTILE" h32.h5 fp32 || { echo "cannot write the hostile traces"; exit 1; }
}

case_hostile_postmortem_diff() {
  hostile_fixtures
  for args in "postmortem h16.h5" "postmortem --json h16.h5" "diff h16.h5 h32.h5 --top 0" \
              "diff --json h16.h5 h32.h5"; do
    t -- "$AMP" $args
    expect "0|1|3" "$args"
    cat out.txt err.txt >all.txt
    check_no_raw all.txt "$args"
  done
}

case_hostile_report() {
  hostile_fixtures
  t -- "$AMP" report h16.h5 --baseline h32.h5 -o h.html
  expect "0|1|3" "report of a hostile trace"
  check_no_raw err.txt "report's stderr"
  [ "$rc" = 3 ] && return # refused as corrupt: nothing is shown
  # the page's own parts (everything but the post-mortem's full text,
  # folded in <details>, which case hostile_report_fulltext checks)
  /usr/bin/python3 -c '
import re, sys
page = open(sys.argv[1], encoding="utf-8", errors="replace").read()
sys.stdout.write(re.sub(r"<details>.*?</details>", "", page, flags=re.S))
' h.html >own.html
  check_no_raw own.html "report's page (its own parts)"
  # names are shown, escaped as on the terminal
  has own.html '>fc\nFORGED verdict healthy</text>'
  has own.html '<td>loss\a\a\rOVERWRITTEN</td>'
  has own.html 'in\e[2Jput'
  # root attributes with controls (hostile_trace), escaped the same way
  has own.html 'fp16\e[2J\a'
  has own.html '2026-12-03\nampprobe: FORGED line\r'
  has own.html 'hostile_trace\e[7mREVERSE'
}

case_hostile_report_fulltext() {
  hostile_fixtures
  t -- "$AMP" report h16.h5 --baseline h32.h5 -o h.html
  expect "0|1|3" "report of a hostile trace"
  [ "$rc" = 3 ] || check_no_raw h.html "report's whole page"
}

# Layer names and root attributes with Unicode bidi controls (U+202E and
# others: valid UTF-8 that shows the rest of a line reversed, a name as
# another). Found 2026-12 by a defect hunt: C0, C1 and invalid UTF-8 were
# escaped, these were printed raw.
check_no_bidi() { # check_no_bidi FILE WHAT
  local raw
  raw=$(/usr/bin/python3 -c '
import sys
t = open(sys.argv[1], "rb").read().decode("utf-8", "replace")
bidi = {0x61c, 0x200e, 0x200f} | set(range(0x202a, 0x202f)) | set(range(0x2066, 0x206a))
print(",".join("U+%04X" % ord(c) for c in sorted(set(t)) if ord(c) in bidi))
' "$1")
  if [ -n "$raw" ]; then bad "$2: raw bidi controls in the output: $raw"; else ok "$2: no raw bidi control"; fi
}

case_hostile_bidi() {
  "$HOSTILE" b16.h5 bidi16 && "$HOSTILE" b32.h5 bidi32 || { echo "cannot write the bidi traces"; exit 1; }
  t -- "$AMP" postmortem b16.h5
  expect 1 "postmortem of a trace with bidi names"
  cat out.txt err.txt >all.txt
  check_no_bidi all.txt "postmortem"
  has out.txt 'origin      enc.fc1\u202e1cf.daeh (linear, fp16)'
  has out.txt 'fed by      in\u2066put\u2069 (input)'
  has out.txt 'passed on   loss\u200f\u061c\u202a\u200e'
  has out.txt 'precision   fp16\u202b23pf'
  t -- "$AMP" postmortem --json b16.h5
  expect 1 "postmortem --json"
  check_no_bidi out.txt "postmortem --json"
  if /usr/bin/python3 -m json.tool out.txt >/dev/null 2>&1; then ok "postmortem --json is valid JSON"; else bad "postmortem --json is not valid JSON"; fi
  has out.txt 'enc.fc1\\u202e1cf.daeh'
  for args in "diff b16.h5 b32.h5 --top 0" "diff --json b16.h5 b32.h5"; do
    t -- "$AMP" $args
    expect 1 "$args"
    cat out.txt err.txt >all.txt
    check_no_bidi all.txt "$args"
  done
  if /usr/bin/python3 -m json.tool out.txt >/dev/null 2>&1; then ok "diff --json is valid JSON"; else bad "diff --json is not valid JSON"; fi
  t -- "$AMP" report b16.h5 --baseline b32.h5 -o b.html -q
  expect 1 "report of a trace with bidi names"
  check_no_bidi b.html "report's page"
  check_no_bidi err.txt "report's stderr"
  has b.html 'enc.fc1\u202e1cf.daeh'
  has b.html 'in\u2066put\u2069'
  has b.html 'loss\u200f\u061c\u202a\u200e'
  has b.html 'hostile_trace\u2067RTL'
  # a bidi control in an error line (a name the message quotes unescaped)
  t -- "$AMP" postmortem "$(printf 'no\342\200\256pe.h5')"
  expect 3 "postmortem of a missing file whose name holds U+202E"
  check_no_bidi err.txt "the error line"
  has err.txt 'no\u202epe.h5'
}

# Planted symlinks in bisect's work directory must not be followed.
case_bisect_symlinks() {
  mkdir victim
  echo "precious 1" >victim/a; echo "precious 2" >victim/b; echo "precious 3" >victim/c
  local sa sb sc
  sa=$(sum victim/a); sb=$(sum victim/b); sc=$(sum victim/c)
  mkdir wd
  ln -s "$W/victim/a" wd/trial-00.h5
  ln -s "$W/victim/b" wd/trial-00.log
  ln -s "$W/victim/c" wd/trial-01.json
  t -- "$AMP" bisect --scenario revin-overflow --fp32-candidates revin -q --workdir wd
  echo "     bisect with planted trial files: exit $rc"
  unchanged victim/a "$sa" "trial-00.h5 -> victim/a"
  unchanged victim/b "$sb" "trial-00.log -> victim/b"
  unchanged victim/c "$sc" "trial-01.json -> victim/c"
  ln -s "$W/victim" wdlink
  t -- "$AMP" bisect --scenario revin-overflow --fp32-candidates revin -q --workdir wdlink
  echo "     bisect with the work directory a symlink: exit $rc"
  if [ "$(ls victim | wc -l)" -eq 3 ]; then ok "nothing written through the linked work directory"
  else bad "files created through the symlinked work directory: $(ls victim | tr '\n' ' ')"; fi
}

# SIGKILL of bisect: its running trials die with it.
case_bisect_sigkill() {
  local tag="$W/kill-wd" pid i left
  "$AMP" bisect --scenario two-culprits --fp32-candidates revin,softmax -j 2 \
    --steps 200000 -q --workdir "$tag" >/dev/null 2>&1 &
  pid=$!
  # (bounds, not pauses: under ctest -j16 on two cores a start or an exit
  # can take many seconds)
  for i in $(seq 300); do # until trials run (at most 60 s)
    left=$(pgrep -f -- "$tag/trial-" || true)
    [ -n "$left" ] && break
    sleep 0.2
  done
  [ -n "$left" ] || { kill -9 $pid 2>/dev/null; bad "no trial started within 60 s"; return; }
  ok "trials running: $(echo $left | wc -w)"
  kill -9 $pid
  wait $pid 2>/dev/null
  for i in $(seq 150); do # until they are gone (at most 30 s)
    left=$(pgrep -f -- "$tag/trial-" || true)
    [ -z "$left" ] && break
    sleep 0.2
  done
  if [ -n "$left" ]; then
    bad "orphan trials after SIGKILL of bisect: pids $(echo $left)"
    for p in $left; do kill -9 "$p" 2>/dev/null; done # only the trials this case started
  else
    ok "no trial outlived bisect"
  fi
  # an external command that is a wrapper: what it started (a shell's
  # background job, a launcher's workers) dies with bisect too; only the
  # wrapper itself did (its death signal), the grandchild ran on
  local mark="ampprobe-faults-grandchild-$$"
  printf '#!/bin/bash\nexec -a %s sleep 1000 &\nwait\n' "$mark" >wrap.sh
  chmod +x wrap.sh
  "$AMP" bisect --fp32-candidates bn -j 2 -q --workdir "$W/kill-ext" -- ./wrap.sh >/dev/null 2>&1 &
  pid=$!
  for i in $(seq 300); do
    left=$(pgrep -f -- "$mark" || true)
    [ -n "$left" ] && break
    sleep 0.2
  done
  [ -n "$left" ] || { kill -9 $pid 2>/dev/null; bad "the wrapper's job did not start within 60 s"; return; }
  kill -9 $pid
  wait $pid 2>/dev/null
  for i in $(seq 150); do
    left=$(pgrep -f -- "$mark" || true)
    [ -z "$left" ] && break
    sleep 0.2
  done
  if [ -n "$left" ]; then
    bad "a wrapper's job outlived the SIGKILL of bisect: pids $(echo $left)"
    for p in $left; do kill -9 "$p" 2>/dev/null; done
  else
    ok "no process of an external trial (the wrapper's job too) outlived bisect"
  fi
}

# Strict numbers (#17.8): the whole argument is a decimal number, one
# wording for every range error.
case_numbers() {
  local v
  for v in " 5" "5 " "0x10" "+" "" "1e3" "5x" "٣"; do
    t -- "$AMP" run --scenario healthy -q -o n.h5 --steps "$v"
    expect 2 "--steps '$v'"; one_line "--steps '$v'" "expected an integer"
  done
  for v in " 0.1" "0.1 " "0x1p3" "inf" "nan" "-inf" "1e" ".e1" "1.2.3" "1,5"; do
    t -- "$AMP" run --scenario healthy -q -o n.h5 --lr "$v"
    expect 2 "--lr '$v'"; one_line "--lr '$v'" "expected a decimal number"
  done
  for v in -5 0 200000000 99999999999999999999; do
    t -- "$AMP" run --scenario healthy -q -o n.h5 --steps "$v"
    expect 2 "--steps $v"; one_line "--steps $v" "invalid value '$v' for --steps: must be in [1, 100000000]"
  done
  t -- "$AMP" run --scenario healthy -q -o n.h5 --lr 1e400
  expect 2 "--lr 1e400"; one_line "--lr 1e400" "must be in [0, 1e+06]"
  rm -f n.h5
  # accepted, not a usage error (2): both steps overflow at that scale and
  # are skipped, and a run that took no optimizer step is not healthy (1)
  t -- "$AMP" run --scenario healthy -q --steps 2 --init-scale 3e38 -o big.h5
  expect 1 "--init-scale 3e38 (the config maximum; no step taken: diverged)"
  t -- "$AMP" run --scenario healthy -q --steps 2 --init-scale 3.1e38 -o big2.h5
  expect 2 "--init-scale 3.1e38"; one_line "--init-scale 3.1e38" "must be in [1e-30, 3e+38]"
  t -- "$AMP" run --scenario healthy -q --steps 2 --micro-batches 2048 -o mb.h5
  expect 2 "--micro-batches 2048"; one_line "--micro-batches 2048" "must be in [1, 1024]"
  "$AMP" run --scenario healthy --trace -q --steps 20 -o a.h5 >/dev/null 2>&1
  "$AMP" run --scenario healthy --trace -q --steps 20 --precision fp32 -o b.h5 >/dev/null 2>&1
  for v in 1e-300 1 0.5 4.9e-324; do
    t -- "$AMP" diff a.h5 b.h5 -q --threshold "$v"
    expect "0|1" "diff --threshold $v (in (0, 1])"
  done
  for v in 0 -0.1 1.0000001 1e-400; do
    t -- "$AMP" diff a.h5 b.h5 -q --threshold "$v"
    expect 2 "diff --threshold $v"; one_line "diff --threshold $v" "must be in (0, 1]"
  done
  t -- "$AMP" report a.h5 -o r.html --width " 800"
  expect 2 "report --width ' 800'"
}

# Trace sets (#17.4, found 2026-12-03 by a hostile-input audit): diff's -o
# is none of the files of either set, also when the other side is missing.
case_set_output_is_input() {
  mkdir A B && "$HOSTILE" A ranks && "$HOSTILE" B ranks || { echo "cannot write the sets"; exit 1; }
  local sa sb
  sa=$(sum A/t.rank0.h5); sb=$(sum B/t.rank1.h5)
  t -- "$AMP" diff A B -o B/t.rank1.h5
  expect 2 "diff A B -o B/t.rank1.h5"; one_line "diff of sets, -o a member of B" "refusing to write"
  unchanged B/t.rank1.h5 "$sb" "a member of B named by -o"
  t -- "$AMP" diff A missing.h5 -o A/t.rank0.h5
  expect 2 "diff A missing.h5 -o A/t.rank0.h5"; one_line "diff, -o a member of A, B missing" "refusing to write"
  unchanged A/t.rank0.h5 "$sa" "a member of A named by -o"
  t -- "$AMP" diff A B -q -o d.json
  expect "0|1" "diff A B -o d.json (a new file)"
  [ -s d.json ] && ok "d.json written" || bad "d.json not written"
}

# What report -o and diff -o replace (found 2026-12 by a defect hunt: they
# replaced any file, a trace too, silently): their own earlier output and
# an empty file, yes; an HDF5 file (signature at 0 or after a user block),
# a text, another JSON, another program's page, the same through a
# symlink: refused, exit 2, one line naming --force, the file unchanged and
# nothing on stdout; with --force, replaced.
case_output_not_ours() {
  fixtures
  cp fp32.h5 precious.h5
  echo "my notes" >notes.txt
  echo '{"verdict": "mine", "summary": "not a diff"}' >other.json
  printf '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">\n<title>mine</title></head></html>\n' >mine.html
  /usr/bin/python3 -c "
import h5py
with h5py.File('ub.h5', 'w', userblock_size=512) as f: f['x'] = [1, 2, 3]
with open('ub.h5', 'rb') as f: assert f.read(8) != b'\x89HDF\r\n\x1a\n'" ||
    { echo "cannot write an HDF5 file with a user block"; exit 1; }
  ln -s precious.h5 link.html
  "$AMP" diff fp16.h5 fp32.h5 -q -o own.json >/dev/null 2>&1
  "$AMP" report fp16.h5 -q -o own.html 2>/dev/null
  for target in precious.h5 ub.h5 notes.txt other.json mine.html link.html own.json; do
    local s; s=$(sum "$target")
    t -- "$AMP" report fp16.h5 -q -o "$target"
    expect 2 "report -o $target (not a page of report)"
    one_line "report -o $target" "add --force to replace it"
    unchanged "$target" "$s" "report -o $target refused"
  done
  t -- "$AMP" report fp16.h5 -q -o precious.h5
  one_line "report -o a trace" "refusing to replace precious.h5: it is an HDF5 file (a trace?), not a page that 'ampprobe report' wrote"
  t -- "$AMP" report fp16.h5 -q -o notes.txt
  one_line "report -o a text" "refusing to replace notes.txt: it is not a page that 'ampprobe report' wrote"
  for target in precious.h5 ub.h5 notes.txt other.json mine.html link.html own.html; do
    local s; s=$(sum "$target")
    t -- "$AMP" diff fp16.h5 fp32.h5 -o "$target"
    expect 2 "diff -o $target (not a result of diff)"
    one_line "diff -o $target" "add --force to replace it"
    unchanged "$target" "$s" "diff -o $target refused"
    [ -s out.txt ] && bad "diff -o $target refused, yet printed a result" || ok "nothing on stdout"
  done
  # their own earlier output: replaced without --force, also the other
  # kind of diff result (a set's over a pair's) and a page written before
  # the generator tag
  t -- "$AMP" report fp16.h5 -q -o own.html --title "second run"
  expect 1 "report -o its own earlier page"; has own.html "<title>second run</title>"
  grep -v '<meta name="generator"' own.html >legacy.html
  t -- "$AMP" report fp16.h5 -q -o legacy.html --title "over a legacy page"
  expect 1 "report -o a page written before the generator tag"; has legacy.html "<title>over a legacy page</title>"
  # such a page with a --title longer than the head read (1,100 '<', 4,400
  # bytes escaped: its style sheet beyond the first 4 KiB; review 9)
  t -- "$AMP" report fp16.h5 -q -o long.html --title "$(printf '<%.0s' $(seq 1100))"
  grep -v '<meta name="generator"' long.html >legacy-long.html
  t -- "$AMP" report fp16.h5 -q -o legacy-long.html --title "over a long legacy page"
  expect 1 "report -o a page before the tag with a 4 KiB title"; has legacy-long.html "<title>over a long legacy page</title>"
  mkdir -p A B && "$HOSTILE" A ranks && "$HOSTILE" B ranks || { echo "cannot write the sets"; exit 1; }
  t -- "$AMP" diff A B -q -o own.json
  expect "0|1" "diff of sets -o a pair's earlier result"; has own.json '"kind": "ranks"'
  t -- "$AMP" diff fp16.h5 fp32.h5 -q -o own.json
  expect 1 "diff -o a set's earlier result"; has own.json '"summary"'
  : >empty.html; : >empty.json
  t -- "$AMP" report fp16.h5 -q -o empty.html; expect 1 "report -o an empty file"
  t -- "$AMP" diff fp16.h5 fp32.h5 -q -o empty.json; expect 1 "diff -o an empty file"
  t -- "$AMP" report fp16.h5 -q -o /dev/null; expect 1 "report -o /dev/null"
  # --force replaces anything
  t -- "$AMP" report fp16.h5 -q -o notes.txt --force
  expect 1 "report --force -o notes.txt"; has notes.txt '<meta name="generator" content="ampprobe report">'
  t -- "$AMP" diff fp16.h5 fp32.h5 -q -o precious.h5 --force
  expect 1 "diff --force -o precious.h5"; has precious.h5 '"verdict": "diverge"'
  t -- "$AMP" report fp16.h5 -q -o link.html --force
  expect 1 "report --force -o a symlink to a trace"
  [ -L link.html ] && grep -q 'ampprobe report' precious.h5 && ok "the link kept, its target replaced" || bad "link.html: $(ls -l link.html)"
  # --force never makes an input an output
  t -- "$AMP" report fp16.h5 -q -o fp16.h5 --force
  expect 2 "report --force -o its own trace"; one_line "report -o its input" "it is also an input"
  no_temps .
}

# -o as a name (8c, 8d) and -o joining a set it reads (8f): usage errors,
# exit 2, whatever the flags; the set is not changed.
case_output_names() {
  fixtures
  mkdir -p rs && "$HOSTILE" rs ranks || { echo "cannot write the set"; exit 1; }
  mkdir -p adir
  for cmd in "report fp16.h5 -q" "diff fp16.h5 fp32.h5"; do
    t -- "$AMP" $cmd -o ''
    expect 2 "$cmd -o ''"; one_line "$cmd -o ''" "-o '': an empty path names no file"
    for o in x.html/ adir/ fp16.h5/; do
      t -- "$AMP" $cmd -o "$o"
      expect 2 "$cmd -o $o"; one_line "$cmd -o $o" "a path ending in '/' names a directory, not the file to write"
    done
  done
  absent x.html "no file for -o x.html/"
  local before; before=$(ls rs | tr '\n' ' ')
  for args in "report rs -q -o rs/page.h5" "report rs -q -o ./rs/../rs/page.h5 --force" \
              "report rs/*.h5 -q -o rs/page.h5" "diff rs rs -o rs/d.h5" "diff fp16.h5 rs -o rs/d.h5 --force"; do
    set -f; t -- "$AMP" $args; set +f
    expect 2 "$args"; one_line "$args" "it would join the trace set"
  done
  [ "$(ls rs | tr '\n' ' ')" = "$before" ] && ok "the set is unchanged: $before" || bad "the set changed: $(ls rs)"
  # outside the set's pattern or folder: written
  set -f; t -- "$AMP" report 'rs/t.rank*.h5' -q -o rs/page.h5; set +f
  expect "0|1" "report 'rs/t.rank*.h5' -o rs/page.h5 (no member of that glob)"
  rm -f rs/page.h5
  t -- "$AMP" report rs -q -o rs/page.html
  expect "0|1" "report rs -o rs/page.html (not *.h5)"
  t -- "$AMP" report rs -q -o page.h5
  expect "0|1" "report rs -o page.h5 (another folder)"
}

# Messages (8a, 8e): a typo'd file among several names the typo; a set's
# unreadable file is named once.
case_message_names() {
  fixtures
  for cmd in "postmortem fp16.h5 missing.h5" "postmortem missing.h5 fp16.h5" \
             "report fp16.h5 missing.h5 -q -o r.html"; do
    t -- "$AMP" $cmd
    expect 3 "$cmd"; one_line "$cmd" "ampprobe: ${cmd%% *}: missing.h5: no such file"
  done
  absent r.html "no page"
  mkdir -p A && "$HOSTILE" A ranks || { echo "cannot write the set"; exit 1; }
  echo junk >A/extra.h5
  t -- "$AMP" diff A A
  expect 3 "diff of sets holding an unreadable file"
  has out.txt "UNREADABLE A: A/extra.h5: not an HDF5 file"
  hasnt out.txt "A/extra.h5: A/extra.h5"
}

# A rank file whose world_size claims 2^31 - 1 ranks: the set is refused
# (exit 3, one line) instead of listing 2^31 missing ranks (memory without
# bound, a hang).
case_set_world_size() {
  mkdir S && "$HOSTILE" S world || { echo "cannot write the set"; exit 1; }
  t -- "$AMP" postmortem S
  expect 3 "postmortem of a set claiming 2^31-1 ranks"; one_line "postmortem, huge world" "world size 2147483647"
  t -- "$AMP" postmortem --json S
  expect 3 "postmortem --json of it"; one_line "postmortem --json, huge world" "world size 2147483647"
  t -- "$AMP" report S -q -o r.html
  expect 3 "report of it"; one_line "report, huge world" "world size 2147483647"
  absent r.html "no report of a refused set"
}

# An input that exists but cannot be read is unreadable input (exit 3, as
# a missing or corrupt one), not a runtime error (4).
case_unreadable_inputs() {
  fixtures
  ln -s loop2 loop1 && ln -s loop1 loop2 && : >notdir
  local long
  long=$(printf 'a%.0s' $(seq 300)).h5
  for p in loop1 notdir/x.h5 "$long"; do
    t -- "$AMP" postmortem "$p"
    expect 3 "postmortem of ${p:0:20}"; one_line "postmortem of ${p:0:20}"
    t -- "$AMP" diff "$p" fp32.h5
    expect 3 "diff of ${p:0:20}"; one_line "diff of ${p:0:20}"
    t -- "$AMP" report "$p" -q -o u.html
    expect 3 "report of ${p:0:20}"; one_line "report of ${p:0:20}"
  done
  if [ "$(id -u)" = 0 ] && command -v setpriv >/dev/null; then
    cp fp16.h5 noperm.h5 && chmod 000 noperm.h5 && chmod 755 . 
    t -- setpriv --reuid=65534 --regid=65534 --clear-groups "$AMP" postmortem "$PWD/noperm.h5"
    expect 3 "postmortem of a file without read permission"; one_line "no permission" "Permission denied"
  else
    echo "note: permission case not run (needs root and setpriv)"
  fi
  absent u.html "no report of an unreadable input"
}

# Standard output lost (/dev/full) in the commands that flush it
# themselves, and with more output than one stdio buffer: exit 4 and one
# line naming the real cause.
case_stdout_lost() {
  fixtures
  mkdir A B && "$HOSTILE" A ranks && "$HOSTILE" B ranks || { echo "cannot write the sets"; exit 1; }
  for cmd in "run --list-scenarios --json" "run --scenario healthy --steps 3 -q --force -o a.h5" \
             "run --scenario healthy --steps 3 -q --json --force -o a.h5" \
             "diff A B" "diff --json A B" "diff fp16.h5 fp32.h5 --top 0" "diff --json fp16.h5 fp32.h5" \
             "postmortem --json fp16.h5" \
             "bisect --scenario two-culprits --fp32-candidates softmax,revin --steps 30 -q --force -o b.json"; do
    t -- sh -c "exec \"$AMP\" $cmd >/dev/full"
    expect 4 "ampprobe $cmd >/dev/full"
    one_line "ampprobe $cmd >/dev/full" "cannot write standard output: No space left on device"
  done
  local n
  n=$("$AMP" diff --json fp16.h5 fp32.h5 | wc -c)
  [ "$n" -gt 8192 ] && ok "diff --json prints $n bytes (more than one stdio buffer)" \
                    || bad "diff --json prints only $n bytes: the case does not test a lost early write"
}

# SIGINT/SIGTERM end the commands that only read with exit 130 and one line,
# and leave no output or temporary file behind. The signal is sent once
# /proc shows the command catching it (so never before main() ran).
case_interrupt_readers() {
  "$AMP" run --scenario healthy --trace --steps 3000 -q -o big.h5 >/dev/null 2>&1 || { echo "cannot make the trace"; exit 1; }
  /usr/bin/python3 - "$AMP" <<'PY' >py.txt 2>&1
import os, signal, subprocess, sys, time
amp = sys.argv[1]
fail = 0
def caught(pid):
    try:
        for line in open("/proc/%d/status" % pid):
            if line.startswith("SigCgt:"):
                m = int(line.split()[1], 16)
                return (m >> 1) & 1 and (m >> 14) & 1
    except OSError:
        return False
    return False
for args, out in ((["postmortem", "big.h5"], None), (["diff", "big.h5", "big.h5", "-o", "d.json"], "d.json"),
                  (["report", "big.h5", "-q", "-o", "r.html"], "r.html")):
    for sig in (signal.SIGTERM, signal.SIGINT):
        p = subprocess.Popen([amp] + args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        t0 = time.time()
        while not caught(p.pid) and p.poll() is None and time.time() - t0 < 30:
            time.sleep(0.001)
        if p.poll() is not None:
            print("FAIL %s: finished before the signal could be sent" % args[0]); fail = 1; continue
        p.send_signal(sig)
        _, err = p.communicate(timeout=60)
        err = err.decode(errors="replace").strip().splitlines()
        name = "%s %s" % (args[0], sig.name)
        if p.returncode != 130:
            print("FAIL %s: exit %d, want 130" % (name, p.returncode)); fail = 1
        elif err != ["ampprobe: %s: interrupted" % args[0]]:
            print("FAIL %s: stderr %r" % (name, err)); fail = 1
        else:
            print("ok   %s: exit 130, one line" % name)
        left = [f for f in os.listdir(".") if ".tmp-" in f or (out and f == out)]
        if left:
            print("FAIL %s: left behind %s" % (name, left)); fail = 1
            for f in left: os.unlink(f)
sys.exit(fail)
PY
  local prc=$?
  cat py.txt
  [ $prc -eq 0 ] || bad "interrupted readers (above)"
}

# A signal while `run` checks its finished trace (the post-mortem after the
# last step, seconds on a long run): exit 130 at once, one line saying the
# trace is complete; the trace reads as complete. It was ignored: "healthy",
# exit 0, seconds later.
case_interrupt_run_check() {
  /usr/bin/python3 - "$AMP" <<'PY' >py.txt 2>&1
import os, signal, subprocess, sys, time
amp = sys.argv[1]
p = subprocess.Popen([amp, "run", "--scenario", "healthy", "--trace", "--steps", "8000",
                      "--progress-every", "0.2", "-o", "long.h5"],
                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
seen = False
lines = []
for raw in p.stderr:
    line = raw.decode(errors="replace").rstrip("\n")
    lines.append(line)
    if "checking the trace" in line:
        seen = True
        t0 = time.time()
        p.send_signal(signal.SIGINT)
        break
rest = p.stderr.read().decode(errors="replace").strip().splitlines()
rc = p.wait(timeout=120)
took = time.time() - t0 if seen else -1
if not seen:
    print("FAIL: no 'checking the trace' line: %r" % lines[-3:]); sys.exit(1)
if rc != 130 or took > 10:
    print("FAIL: exit %d after %.1f s, want 130 at once" % (rc, took)); sys.exit(1)
if len(rest) != 1 or "interrupted (while checking the trace; it is complete: ampprobe postmortem long.h5)" not in rest[0]:
    print("FAIL: stderr after the signal %r" % rest); sys.exit(1)
pm = subprocess.run([amp, "postmortem", "long.h5"], capture_output=True, text=True)
if "status      complete" not in pm.stdout:
    print("FAIL: the trace is not complete: %s" % pm.stdout[:300]); sys.exit(1)
print("ok   run interrupted while checking its trace: exit 130 in %.2f s, %r" % (took, rest[0]))
PY
  local prc=$?
  cat py.txt
  [ $prc -eq 0 ] || bad "interrupted run check (above)"
}

# sig_run SIG SECONDS OUT ARGS...: `ampprobe run ARGS -o OUT` in the
# background, sent SIG (TERM, INT, KILL) SECONDS after OUT appears (the
# handlers are installed before the trace is made); its exit in rc, its
# stdout in OUT.run.txt.
sig_run() {
  local sig=$1 secs=$2 out=$3 waited=0 pid
  shift 3
  rm -f "$out"
  timeout -k 5 "$TMO" "$AMP" run "$@" -o "$out" >"$out.run.txt" 2>"$out.err.txt" &
  pid=$!
  while [ ! -s "$out" ] && [ $waited -lt 300 ] && kill -0 $pid 2>/dev/null; do
    sleep 0.1; waited=$((waited + 1))
  done
  sleep "$secs"
  kill -"$sig" $pid 2>/dev/null
  wait $pid
  rc=$?
}

# A run stopped by SIGTERM (Slurm's time limit, preemption, docker stop) or
# SIGINT ends with exit 130 and INTERRUPTED, and its trace, closed by the
# writer, is marked aborted: postmortem says ABORTED, names the signal,
# degraded, exit 1, JSON trace.aborted; diff against a finished run of the
# same command says what it says of a killed (unclosed) trace, never AGREE.
# Every interrupted run read back complete and healthy, exit 0 from
# postmortem, report and diff (hunt F2).
case_interrupt_run_abort() {
  local sig
  for sig in TERM INT; do
    sig_run $sig 1 $sig.h5 --steps 100000
    expect 130 "run --steps 100000 sent SIG$sig after 1 s"
    has $sig.h5.run.txt "INTERRUPTED"
    t -- "$AMP" postmortem $sig.h5
    expect 1 "postmortem of the run SIG$sig stopped"
    cp out.txt pm-$sig.txt
    has pm-$sig.txt "status      ABORTED"
    has pm-$sig.txt "[not-closed] the job ended by signal SIG$sig after step"
    has pm-$sig.txt "verdict     degraded"
    t -- "$AMP" postmortem --json $sig.h5
    expect 1 "postmortem --json of the run SIG$sig stopped"
    if /usr/bin/python3 -c 'import json, sys; t = json.load(open(sys.argv[1]))["trace"]; sys.exit(not (t["aborted"] == "signal SIG" + sys.argv[2] and t["complete"] is False and t["aborted_step"] is None))' out.txt $sig; then
      ok "JSON trace.aborted is 'signal SIG$sig', complete false, aborted_step null"
    else
      bad "JSON trace of the SIG$sig run: $(head -c 300 out.txt)"
    fi
  done
  # diff: the same command, stopped by SIGTERM, killed by SIGKILL (after a
  # flush), and run to its end. The signals come 1 and 1.5 s after the
  # trace appears, so the run must last longer than that: 4000 steps took
  # 1.4 s on an idle Zen 3 and ended before the SIGKILL. The baseline is
  # timed and, when it took under STEADY_MS, run again with the steps
  # scaled to take about that long here (at most 10^6).
  local n=4000 t0 ms
  t0=$(date +%s%N)
  t -- "$AMP" run --steps $n -q -o base.h5
  ms=$((($(date +%s%N) - t0) / 1000000))
  local STEADY_MS=8000
  if [ "$rc" = 0 ] && [ $ms -lt $STEADY_MS ]; then
    n=$((n * STEADY_MS / (ms > 0 ? ms : 1)))
    [ $n -le 1000000 ] || n=1000000
    rm -f base.h5
    t -- "$AMP" run --steps $n -q -o base.h5
  fi
  expect 0 "run --steps $n (the baseline; 4000 steps took $ms ms)"
  sig_run TERM 1 ab.h5 --steps $n
  expect 130 "run --steps $n sent SIGTERM after 1 s"
  sig_run KILL 1.5 kd.h5 --steps $n 2>/dev/null
  # (expect reads 137 as a timeout)
  [ "$rc" = 137 ] && ok "run --steps $n sent SIGKILL after 1.5 s (exit 137)" ||
    bad "run --steps $n sent SIGKILL after 1.5 s: exit $rc, want 137"
  local what v_ab= v_kd= rc_ab= rc_kd=
  for what in ab kd; do
    t -- "$AMP" diff --json $what.h5 base.h5
    cp out.txt diff-$what.json
    local v
    v=$(/usr/bin/python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["verdict"])' diff-$what.json 2>/dev/null)
    if [ $what = ab ]; then v_ab=$v; rc_ab=$rc; else v_kd=$v; rc_kd=$rc; fi
  done
  if [ "$v_ab" = "$v_kd" ] && [ "$rc_ab" = "$rc_kd" ] && [ "$v_ab" != agree ] && [ "$rc_ab" != 0 ]; then
    ok "diff of the aborted trace: $v_ab, exit $rc_ab, as of the killed one"
  else
    bad "diff: aborted $v_ab exit $rc_ab, killed $v_kd exit $rc_kd (want the same, not agree/0)"
  fi
  t -- "$AMP" diff ab.h5 base.h5
  has out.txt "verdict: NOT ALIGNED"
}

# The same SIGTERM/SIGINT delivered twice, as timeout(1) delivers it (to
# the command, then to its process group), as a terminal's Ctrl-C reaches
# every process of its group: one request to stop, and the trace is marked.
# The second one killed `run` by the signal, unmarked (CI, 2026-12-04: one
# run in a few under timeout). A signal a second or more after the first,
# while a long step still runs, ends the process by the signal at once.
case_interrupt_repeat() {
  local sig pid waited i killed
  for sig in TERM INT; do
    killed=0 # back to back, the second came after the first was handled one time in 3
    for i in 1 2 3 4 5 6; do
      rm -f rep-$sig.h5
      "$AMP" run --steps 100000 -o rep-$sig.h5 >rep-$sig.txt 2>rep-$sig.err &
      pid=$!
      waited=0
      while [ ! -s rep-$sig.h5 ] && [ $waited -lt 300 ]; do sleep 0.1; waited=$((waited + 1)); done
      sleep 0.3
      kill -$sig $pid; kill -$sig $pid 2>/dev/null
      waited=0 # a hang is a failure, not a stuck suite
      while kill -0 $pid 2>/dev/null && [ $waited -lt $((TMO * 10)) ]; do sleep 0.1; waited=$((waited + 1)); done
      kill -KILL $pid 2>/dev/null
      wait $pid
      rc=$?
      [ $rc = 130 ] || { killed=$((killed + 1)); bad "run sent SIG$sig twice at once (try $i): exit $rc, want 130"; }
    done
    [ $killed = 0 ] && ok "run sent SIG$sig twice at once, 6 times: exit 130 each time"
    has rep-$sig.txt "INTERRUPTED"
    t -- "$AMP" postmortem rep-$sig.h5
    has out.txt "[not-closed] the job ended by signal SIG$sig after step"
  done
  # under timeout(1), which sends each signal twice itself
  sig_run TERM 1 tmo.h5 --steps 100000
  expect 130 "run under timeout(1) sent SIGTERM"
  t -- "$AMP" postmortem tmo.h5
  has out.txt "[not-closed] the job ended by signal SIGTERM after step"
  # a later signal ends a step that takes seconds (64 micro-batches of a
  # 1024-wide MLP: ~5 s a step here) by the signal
  cat >slow.json <<'JSON'
{"name": "slow-steps", "steps": 1000, "micro_batches": 64,
 "model": [{"type": "linear", "name": "fc1", "out": 1024},
           {"type": "gelu", "name": "act"},
           {"type": "linear", "name": "fc2", "out": 1024},
           {"type": "linear", "name": "head", "out": 1}],
 "data": {"batch": 256}}
JSON
  "$AMP" run --config slow.json -o slow.h5 >slow.txt 2>slow.err &
  pid=$!
  waited=0
  while [ ! -s slow.h5 ] && [ $waited -lt 300 ]; do sleep 0.1; waited=$((waited + 1)); done
  kill -TERM $pid; sleep 1.5
  if kill -0 $pid 2>/dev/null; then
    local t0=$SECONDS
    kill -TERM $pid
    waited=0
    while kill -0 $pid 2>/dev/null && [ $waited -lt 100 ]; do sleep 0.1; waited=$((waited + 1)); done
    kill -KILL $pid 2>/dev/null
    wait $pid
    rc=$?
    [ "$rc" = 143 ] && ok "a second SIGTERM 1.5 s later ended the step by the signal (exit 143, $((SECONDS - t0)) s)" ||
      bad "a second SIGTERM 1.5 s later: exit $rc, want 143 (killed by it, at once)"
  else
    wait $pid
    echo "note: the slow run ended its step within 1.5 s of the first SIGTERM (exit $?): the later signal is not checked on this machine"
  fi
}

# The closing check cannot read the trace (removed while the run ran): one
# line saying so, verdict DEGRADED naming the check (not "the loss stayed
# finite"), exit 1, JSON check_failed true. It said healthy, exit 0 (hunt F4).
case_run_check_unreadable() {
  local waited=0 pid
  timeout -k 5 "$TMO" "$AMP" run --steps 3000 -o rm.h5 >out.txt 2>err.txt &
  pid=$!
  while [ ! -s rm.h5 ] && [ $waited -lt 300 ]; do sleep 0.1; waited=$((waited + 1)); done
  sleep 0.5; rm -f rm.h5
  wait $pid; rc=$?
  expect 1 "run whose trace was removed before its closing check"
  one_line "the closing check" "the closing check could not read the trace rm.h5"
  has out.txt "DEGRADED (the closing check could not read the trace"
  hasnt out.txt "the loss stayed finite"
  waited=0
  timeout -k 5 "$TMO" "$AMP" run --steps 3000 --json -o rm2.h5 >out.txt 2>err.txt &
  pid=$!
  while [ ! -s rm2.h5 ] && [ $waited -lt 300 ]; do sleep 0.1; waited=$((waited + 1)); done
  sleep 0.5; rm -f rm2.h5
  wait $pid; rc=$?
  expect 1 "run --json whose trace was removed"
  if /usr/bin/python3 -c 'import json, sys; d = json.load(open("out.txt")); sys.exit(not (d["check_failed"] is True and d["verdict"] == "degraded"))'; then
    ok "JSON check_failed true, verdict degraded"
  else
    bad "JSON: $(head -c 300 out.txt)"
  fi
}

# A long read says on a terminal what it reads (a 297 MB trace took a
# minute with nothing on the screen): one line on stderr, cleared before
# the output; nothing without a terminal or with report -q.
case_busy_note() {
  "$AMP" run --scenario healthy --trace --steps 7000 -q -o big.h5 >/dev/null 2>&1 ||
    { echo "cannot make the trace"; exit 1; }
  /usr/bin/python3 - "$AMP" <<'PY' >py.txt 2>&1
import os, pty, subprocess, sys
amp = sys.argv[1]
size = os.path.getsize("big.h5")
if size < 16 << 20:
    print("FAIL: big.h5 is only %d bytes" % size); sys.exit(1)
def on_tty(args):
    m, s = pty.openpty()
    p = subprocess.Popen([amp] + args, stdin=s, stdout=s, stderr=s, close_fds=True)
    os.close(s)
    out = b""
    while True:
        try:
            d = os.read(m, 65536)
        except OSError:
            break
        if not d:
            break
        out += d
    p.wait()
    return p.returncode, out.decode(errors="replace")
fail = 0
for args, first in ((["postmortem", "big.h5"], "trace       big.h5"),
                    (["diff", "big.h5", "big.h5"], "ampprobe diff: A = big.h5"),
                    (["report", "big.h5", "-o", "r.html"], "ampprobe: report: wrote r.html")):
    rc, out = on_tty(args)
    note = out.find("ampprobe: %s: reading big.h5 (" % args[0])
    clear = out.find("\r\x1b[K", note + 1)
    text = out.find(first)
    if note < 0 or clear < 0 or text < clear:
        print("FAIL %s: note %d, cleared %d, output %d: %r" % (args[0], note, clear, text, out[:300]))
        fail = 1
    else:
        print("ok   %s on a terminal: %r, cleared before the output" % (
            args[0], out[note:out.find(" ...", note) + 4]))
    if os.path.exists("r.html"):
        os.unlink("r.html")
rc, out = on_tty(["report", "big.h5", "-q", "-o", "q.html"])
if "reading" in out:
    print("FAIL report -q on a terminal: %r" % out[:200]); fail = 1
else:
    print("ok   report -q: no note")
p = subprocess.run([amp, "postmortem", "big.h5"], capture_output=True, text=True)
if "reading" in p.stderr:
    print("FAIL without a terminal: %r" % p.stderr[:200]); fail = 1
else:
    print("ok   no terminal: no note")
sys.exit(fail)
PY
  local prc=$?
  cat py.txt
  [ $prc -eq 0 ] || bad "a long read's note (above)"
}

# Empty TRACE arguments are usage errors (exit 2) in every reading command,
# and names from the command line are escaped too.
# A SIGINT/SIGTERM that arrives while the libraries initialise, before main
# (raised by a preloaded constructor, so at a known moment): every command
# ends with its one "interrupted" line and exit 130, writes nothing, and is
# never killed by the signal.
case_interrupt_startup() {
  if ldd "$AMP" 2>/dev/null | grep -q 'libasan'; then
    skip "AddressSanitizer must be the first library loaded: no LD_PRELOAD shim here"
  fi
  [ -n "${RAISE_AT_LOAD_SO:-}" ] && [ -f "$RAISE_AT_LOAD_SO" ] || { bad "no RAISE_AT_LOAD_SO"; return; }
  "$AMP" run --scenario healthy --steps 5 -q -o in.h5 >/dev/null 2>&1 || { bad "cannot make the input"; return; }
  local sig args sub
  for sig in TERM INT; do
    while IFS='|' read -r sub args; do
      rm -f out.h5 out.html out.json
      # env, so that timeout itself runs without the shim
      # shellcheck disable=SC2086
      t -- env RAISE_AT_LOAD=$sig LD_PRELOAD="$RAISE_AT_LOAD_SO" "$AMP" $args
      if [ $rc != 130 ]; then bad "$sub SIG$sig at load: exit $rc, want 130"; continue; fi
      if [ "$(cat err.txt)" != "ampprobe: ${sub}interrupted" ]; then
        bad "$sub SIG$sig at load: stderr '$(head -c 200 err.txt)'"; continue
      fi
      if [ -s out.txt ] || [ -e out.h5 ] || [ -e out.html ] || [ -e out.json ]; then
        bad "$sub SIG$sig at load: wrote output"; continue
      fi
      ok "$sub SIG$sig at load: exit 130, one line, nothing written"
    done <<'CMDS'
run: |run --scenario healthy --steps 50 --trace -o out.h5
bisect: |bisect --scenario healthy --steps 20 -o out.json
postmortem: |postmortem in.h5
diff: |diff in.h5 in.h5 -o out.json
report: |report in.h5 -q -o out.html
|--version
CMDS
  done
  ls .tmp-* 2>/dev/null | grep -q . && bad "temporary files left: $(ls .tmp-*)"
}

case_empty_args() {
  t -- "$AMP" postmortem ''
  expect 2 "postmortem ''"; one_line "postmortem ''" "an empty argument is not a trace"
  t -- "$AMP" diff '' x.h5
  expect 2 "diff '' x.h5"; one_line "diff ''" "an empty argument is not a trace"
  t -- "$AMP" report '' -q -o e.html
  expect 2 "report ''"; one_line "report ''" "an empty argument is not a trace"
  t -- "$AMP" run --scenario "$(printf 'x\033[7mREVERSE')" -q -o e.h5
  expect 2 "run --scenario with an ESC"
  one_line "run --scenario with an ESC" 'unknown scenario'
  check_no_raw err.txt "run --scenario with an ESC"
}

# Configs (a third audit, 2026-12-03): a key, a too-long fp32 entry or a
# JSON token holding terminal controls reached stderr raw; bytes after a
# NUL were ignored. Every error line is free of controls, whatever put them
# there (cli_error escapes what a caller did not).
case_hostile_config() {
  # (JSON escapes: a raw control inside a JSON string is a syntax error)
  printf '%s' '{"name": "h", "\u001b]0;pwned\u0007\u001b[2J": 1}' >key.json
  printf '{"name": "h", "fp32": "\\u001b]0;pwned\\u0007%s"}' "$(printf 'a%.0s' $(seq 80))" >fp32.json
  printf '{"name": "h", "seed": \033]0;pwn\007}' >tok.json
  printf '\033[2J{"name": "h"}' >lead.json
  printf '{"name": "h", "seed": 1\177}' >del.json
  "$AMP" run --scenario healthy --steps 3 -q -o base.h5 >/dev/null 2>&1
  for f in key fp32 tok lead del; do
    t -- "$AMP" run --config $f.json --steps 3 -q -o $f.h5
    expect 2 "run --config $f.json"; one_line "run --config $f.json"
    if LC_ALL=C grep -q "$(printf '[\001-\011\013-\037\177]')" err.txt; then
      bad "$f.json: raw control characters on stderr: $(cat -v err.txt)"
    else
      ok "$f.json: no raw control on stderr"
    fi
  done
  has err.txt '\x7f'
  # a valid config followed by a NUL and garbage is not a valid config
  "$AMP" run --scenario healthy --steps 3 -q -o ok.h5 >/dev/null 2>&1
  printf '{"name": "healthy-ish", "steps": 3}\000garbage {{{' >nul.json
  t -- "$AMP" run --config nul.json -q -o nul.h5
  expect 2 "run --config with a NUL and garbage after the JSON"
  one_line "a NUL in the config" "a NUL byte at offset"
  absent nul.h5 "no trace from a refused config"
}

# Memory limits (2026-12-03): under `ulimit -v` a little above what the
# program's libraries map, every command hung for ever at exit (OpenBLAS's
# load-time worker retries its buffer allocation without end and exit joins
# it), run ignored SIGTERM meanwhile, and a config the memory check passed
# could still end in "trainer: out of memory" (the check did not count the
# libraries). A ladder of limits: each command ends in time, and run either
# trains or is refused up front with the figures, never fails half-way.
case_memory_limits() {
  if ldd "$AMP" 2>/dev/null | grep -q 'libasan'; then
    skip "AddressSanitizer reserves terabytes of address space: no ulimit -v here"
  fi
  cat >big.json <<'JSON'
{"name": "big", "steps": 2, "precision": "fp16",
 "model": [{"type": "linear", "name": "fc1", "out": 262144},
           {"type": "linear", "name": "fc2", "out": 1}],
 "data": {"kind": "regression", "batch": 32, "features": 16, "outputs": 1}}
JSON
  local kib refused=0 trained=0
  for kib in 393216 $(seq 786432 65536 3014656); do
    (ulimit -v $kib; exec timeout -k 5 20 "$AMP" --version) >out.txt 2>err.txt
    rc=$?
    if [ $rc = 124 ] || [ $rc = 137 ]; then bad "--version under ulimit -v $kib: a hang"; fi
    for what in "--scenario healthy --steps 3" "--config big.json"; do
      rm -f m.h5
      # shellcheck disable=SC2086
      (ulimit -v $kib; exec timeout -k 5 60 "$AMP" run $what -q -o m.h5) >out.txt 2>err.txt
      rc=$?
      case $rc in
        0) trained=$((trained + 1)) ;;
        4) if grep -q 'is left under' err.txt; then refused=$((refused + 1))
           else bad "run $what under ulimit -v $kib: exit 4 after the check: $(head -c 200 err.txt)"; fi ;;
        127) ;; # the dynamic loader cannot map the libraries: before our code
        *) bad "run $what under ulimit -v $kib: exit $rc: $(head -c 200 err.txt)" ;;
      esac
    done
  done
  if [ $refused -gt 0 ] && [ $trained -gt 0 ]; then
    ok "memory ladder: $refused runs refused up front, $trained trained, none failed half-way or hung"
  else
    bad "memory ladder: $refused refused, $trained trained (want both)"
  fi
}

# Hostile HDF5 structure (found 2026-12-04 by a hostile-input hunt), made by
# hostile_h5.py with /usr/bin/python3's h5py; each file consistent but for
# the one thing it makes hostile.
H5ED="$(cd "$(dirname "$0")" && pwd)/hostile_h5.py"
h5ed() { /usr/bin/python3 "$H5ED" "$@" >/dev/null 2>h5ed.err || { echo "cannot make $2: $(cat h5ed.err)"; exit 1; }; }
have_h5py() { /usr/bin/python3 -c "import h5py" 2>/dev/null || skip "/usr/bin/python3 has no h5py"; }

# Steps of 2^61, 2^62 and 2^63 - 1 (increasing, /meta/state consistent):
# the report's binning computed (step - x0) * columns and x1 - x0 + 1 in
# int64, which overflowed - signed overflow, a negative column, heap
# corruption (exit 134) or SIGSEGV (139). Every command draws or reads them.
case_hostile_steps() {
  have_h5py
  "$AMP" run --trace --steps 60 -q -o healthy.h5 >/dev/null 2>&1 || { echo "cannot make healthy.h5"; exit 1; }
  h5ed healthy.h5 huge.h5 steps $((1 << 61)) $((1 << 62))
  h5ed healthy.h5 max.h5 steps 9223372036854775806 9223372036854775807
  h5ed healthy.h5 wide.h5 steps 58 $((1 << 62)) # steps 0..58, then 2^62
  for f in huge max wide; do
    t -- "$AMP" report $f.h5 -q -o $f.html
    expect "0|1" "report of $f.h5"
    [ -s $f.html ] && ok "$f.html written" || bad "$f.html not written"
    hasnt $f.html "nan"
    t -- "$AMP" postmortem $f.h5
    expect "0|1" "postmortem $f.h5"
    t -- "$AMP" postmortem --json $f.h5
    expect "0|1" "postmortem --json $f.h5"
    t -- "$AMP" diff -q $f.h5 healthy.h5
    expect "0|1" "diff $f.h5 healthy.h5"
    t -- "$AMP" diff -q healthy.h5 $f.h5
    expect "0|1" "diff healthy.h5 $f.h5"
  done
}

# Tables that are not plain datasets of the trace: an external link (to a
# copy of the trace: a valid table elsewhere), a virtual dataset, external
# raw-data storage (a side file, /dev/zero, a FIFO). The reader followed
# them past its "a regular file" check (read /etc/passwd; /dev/zero made a
# command take 40-54 s; a FIFO stalled it 10 s): refused before any data is
# read, exit 3, one line naming the dataset.
case_hostile_links() {
  have_h5py
  fixtures
  cp fp16.h5 other.h5
  local p n=0
  for p in /steps /records /layers /scaler_events /snapshots/index /snapshots/data /kernels /meta/state /meta /snapshots; do
    n=$((n + 1))
    h5ed fp16.h5 el$n.h5 extlink $p "$PWD/other.h5"
    t -- "$AMP" postmortem el$n.h5
    expect 3 "postmortem of $p an external link"
    one_line "external link at $p" "$p is a link to another file (an external link)"
  done
  h5ed fp16.h5 elrel.h5 extlink /layers other.h5
  t -- "$AMP" report elrel.h5 -q -o elrel.html
  expect 3 "report of /layers a relative external link"
  one_line "relative external link" "/layers is a link to another file"
  for p in /records /steps; do
    h5ed fp16.h5 vds.h5 vds $p "$PWD/other.h5"
    t -- "$AMP" postmortem vds.h5
    expect 3 "postmortem of $p a virtual dataset"
    one_line "virtual $p" "$p is a virtual dataset"
  done
  head -c 100000 /dev/zero >side.bin
  h5ed fp16.h5 eflside.h5 efl "$PWD/side.bin"
  h5ed fp16.h5 eflzero.h5 efl /dev/zero $((1 << 36))
  rm -f fifo && mkfifo fifo
  h5ed fp16.h5 eflfifo.h5 efl "$PWD/fifo"
  h5ed fp16.h5 eflpasswd.h5 efl /etc/passwd
  local f s0 s1
  for f in eflside eflzero eflfifo eflpasswd; do
    s0=$(date +%s)
    t -- "$AMP" postmortem $f.h5
    s1=$(date +%s)
    expect 3 "postmortem of /snapshots/data stored in a file ($f)"
    one_line "$f" "/snapshots/data stores its data in external files"
    [ $((s1 - s0)) -le 5 ] && ok "$f refused in $((s1 - s0)) s" || bad "$f took $((s1 - s0)) s (read what it named?)"
  done
  t -- "$AMP" diff -q fp16.h5 eflzero.h5
  expect 3 "diff against /snapshots/data stored in /dev/zero"
  t -- "$AMP" report eflfifo.h5 -q -o fifo.html
  expect 3 "report of /snapshots/data stored in a FIFO"
  absent fifo.html "report refused"
}

# /scaler_events rows no loss scaler makes: a step past the trace's last
# (INT64_MAX where the last step is 149), rows out of step order, a NaN,
# -inf or negative scale, a negative growth tracker. They were read as facts
# ("backoff step 9223372036854775807: 2.8e-45 -> -inf"): exit 3 naming the
# row. The trace as written reads (exit 1).
case_hostile_scaler() {
  have_h5py
  fixtures
  t -- "$AMP" postmortem fp16.h5
  expect 1 "postmortem of the trace as written"
  local e
  for e in step_max past_last reversed nan neginf negative tracker; do
    h5ed fp16.h5 sc_$e.h5 scaler $e
    t -- "$AMP" postmortem sc_$e.h5
    expect 3 "postmortem of scaler events: $e"
    one_line "scaler events: $e" "corrupt trace: /scaler_events row"
    t -- "$AMP" report sc_$e.h5 -q -o sc_$e.html
    expect 3 "report of scaler events: $e"
    t -- "$AMP" diff -q fp16.h5 sc_$e.h5
    expect 3 "diff against scaler events: $e"
  done
  t -- "$AMP" postmortem sc_step_max.h5
  one_line "scaler event at INT64_MAX" "is at step 9223372036854775807, after the last step"
  t -- "$AMP" postmortem sc_reversed.h5
  one_line "scaler events reversed" "is before row"
}

# Tables through a compression filter this HDF5 lacks (found 2026-12-04,
# F7.1): h5py's LZF (id 32000, name "lzf" stored with it) and an id no HDF5
# has (305, of the range HDF5 keeps for tests; no name), mandatory for the
# chunks written. The message named HDF5's plugin directory ("can't open
# directory: /usr/lib/.../hdf5/serial/plugins", or another HDF5 error): it
# names the table and the filter now, still exit 3. A table that needs no
# decoding - no rows, or chunks that all skipped an optional filter - reads.
case_hostile_filters() {
  have_h5py
  fixtures
  mkdir -p noplugins
  export HDF5_PLUGIN_PATH="$PWD/noplugins" # no LZF plugin, whatever is installed
  t -- "$AMP" postmortem fp16.h5
  expect 1 "postmortem of the trace as written"
  local spec p how want n=0
  for spec in "/records lzf" "/steps lzf" "/layers lzf" "/snapshots/data lzf" \
              "/records 305" "/scaler_events 305" "/meta/state 305" \
              "/snapshots/index 305"; do
    p=${spec% *} how=${spec#* } n=$((n + 1))
    h5ed fp16.h5 flt$n.h5 filter "$p" "$how"
    if [ "$how" = lzf ]; then want="(id 32000, lzf)"; else want="(id $how)"; fi
    t -- "$AMP" postmortem flt$n.h5
    expect 3 "postmortem of $p through filter $how"
    one_line "$p through filter $how" "$p is compressed with a filter this HDF5 does not have $want"
    hasnt err.txt "plugins"
  done
  t -- "$AMP" report flt1.h5 -q -o flt1.html
  expect 3 "report of /records through LZF"
  one_line "report of /records through LZF" "/records is compressed with a filter this HDF5 does not have (id 32000, lzf)"
  absent flt1.html "report refused"
  t -- "$AMP" diff -q fp16.h5 flt5.h5
  expect 3 "diff against /records through filter 305"
  one_line "diff against /records through filter 305" "/records is compressed with a filter this HDF5 does not have (id 305)"
  for spec in "/kernels lzf" "/records skipped:305"; do
    p=${spec% *} how=${spec#* } n=$((n + 1))
    h5ed fp16.h5 flt$n.h5 filter "$p" "$how"
    t -- "$AMP" postmortem flt$n.h5
    expect 1 "postmortem of $p through $how (nothing to decode): read"
  done
}

# Root attributes of another type or size (found 2026-12-04, F7.2, F7.3,
# F7.5): a "format" that is not a string was "corrupt HDF5 file (root
# attributes: HDF5 error)" - it is another program's file, as one whose
# format is another string; a string attribute over 64 MiB was "HDF5 crashed
# reading it: signal 13" (the parent refused the child's report and the
# child died writing it); an integer attribute of another type (record_mode
# a string) was accepted.
case_hostile_attrs() {
  have_h5py
  fixtures
  local k a n=0
  for k in "int 7" "float 1.5" "ints" "strs" "str something-else" "none"; do
    n=$((n + 1))
    # shellcheck disable=SC2086
    h5ed fp16.h5 fmt$n.h5 attr format $k
    t -- "$AMP" postmortem fmt$n.h5
    expect 3 "postmortem of format: $k"
    one_line "format: $k" "HDF5 file but not an ampprobe trace"
  done
  t -- "$AMP" report fmt1.h5 -q -o fmt1.html
  expect 3 "report of format: int"
  one_line "report of format: int" "HDF5 file but not an ampprobe trace"
  t -- "$AMP" diff -q fp16.h5 fmt4.h5
  expect 3 "diff against format: strs"
  one_line "diff against format: strs" "HDF5 file but not an ampprobe trace"
  for a in record_mode ring_steps hist_min_exp hist_bins; do
    for k in "str 1" "float 1.0" "ints"; do
      n=$((n + 1))
      # shellcheck disable=SC2086
      h5ed fp16.h5 int$n.h5 attr $a $k
      t -- "$AMP" postmortem int$n.h5
      expect 3 "postmortem of $a: $k"
      one_line "$a: $k" "corrupt trace (attribute $a)"
    done
  done
  h5ed fp16.h5 nomode.h5 attr record_mode none
  t -- "$AMP" postmortem nomode.h5
  expect 1 "postmortem without record_mode (tolerated, as before)"
  # 64 MiB: what the isolated reader's child may send its parent
  h5ed fp16.h5 big.h5 attr config_json big 70000000
  t -- "$AMP" postmortem big.h5
  expect 3 "postmortem of a 70 MB config_json"
  one_line "a 70 MB config_json" "root attribute config_json is larger than 64 MiB"
  hasnt err.txt "signal"
  t -- "$AMP" diff -q big.h5 fp16.h5
  expect 3 "diff of a 70 MB config_json"
  one_line "diff of a 70 MB config_json" "root attribute config_json is larger than 64 MiB"
  h5ed fp16.h5 big.h5 attr command_line big $(((64 << 20) + 1))
  t -- "$AMP" postmortem big.h5
  expect 3 "postmortem of a command_line of 64 MiB + 1"
  one_line "a command_line of 64 MiB + 1" "root attribute command_line is larger than 64 MiB"
  h5ed fp16.h5 big1.h5 attr config_json big 40000000
  h5ed big1.h5 big.h5 attr created big 30000000
  t -- "$AMP" postmortem big.h5
  expect 3 "postmortem of 70 MB of strings in two attributes"
  one_line "70 MB in two attributes" "root attributes larger than 64 MiB together (config_json alone 38.1 MiB)"
  hasnt err.txt "signal"
  h5ed fp16.h5 big.h5 attr config_json big 30000000
  t -- "$AMP" postmortem big.h5
  expect 1 "postmortem of a 30 MB config_json (under the limit: read)"
  rm -f big.h5 big1.h5
}

# Names from the config's fp32 list that need escaping (found 2026-12-04,
# F7.4): they were put, escaped, into the bisect command the user is told
# to paste ("--fp32-candidates '\e[31m,bn,revin'"), which pasted names other
# modules (a backslash and an e). No command then, but why, in one line, as
# for a --config or --scenario that cannot be pasted; an external job's
# command that would need escaping is the placeholder.
case_hostile_candidates() {
  have_h5py
  fixtures
  local c n=0
  for c in '{"name": "revin-overflow", "fp32": ["\u001b[31m", "bn"]}' \
           '{"name": "revin-overflow", "fp32": "\u202ebn"}' \
           '{"name": "revin-overflow", "fp32": ["a\\b"]}' \
           '{"name": "revin-overflow", "fp32": ["\u009b31m", "bn"]}' \
           '{"name": "revin-overflow", "fp32": ["bn\nrevin"]}'; do
    n=$((n + 1))
    h5ed fp16.h5 cand$n.h5 attr config_json str "$c"
    t -- "$AMP" postmortem cand$n.h5
    expect 1 "postmortem with fp32 list $n"
    check_no_raw out.txt "fp32 list $n"
    hasnt out.txt "ampprobe bisect --fp32-candidates"
    has out.txt "next: no bisect command to paste: the candidates '"
    t -- "$AMP" postmortem --json cand$n.h5
    expect 1 "postmortem --json with fp32 list $n"
    hasnt out.txt "ampprobe bisect --fp32-candidates"
  done
  h5ed fp16.h5 clean.h5 attr config_json str '{"name": "revin-overflow", "fp32": ["bn"]}'
  t -- "$AMP" postmortem clean.h5
  expect 1 "postmortem with a plain fp32 list"
  has out.txt "next: ampprobe bisect --fp32-candidates bn,revin --scenario revin-overflow"
  h5ed fp16.h5 ext.h5 attr config_json str \
    '{"name": "x", "framework": "pytorch", "command": "python t.py \u001b[2J --lr 0.1", "fp32": ["bn"]}'
  t -- "$AMP" postmortem ext.h5
  expect 1 "postmortem of an external job whose command holds an ESC"
  check_no_raw out.txt "external command with an ESC"
  has out.txt "next: ampprobe bisect --fp32-candidates bn,revin -- YOUR TRAINING COMMAND"
  h5ed fp16.h5 ext2.h5 attr config_json str \
    '{"name": "x", "framework": "pytorch", "command": "python t.py --lr 0.1", "fp32": ["bn"]}'
  t -- "$AMP" postmortem ext2.h5
  expect 1 "postmortem of an external job"
  has out.txt "next: ampprobe bisect --fp32-candidates bn,revin -- python t.py --lr 0.1"
}

# A good trace read with stdin, stdout and/or stderr closed (a daemon, cron,
# a supervisor) is still good: the forked reader's pipe used to land on fd
# 2, the child's dup2 of /dev/null onto 2 overwrote it, and the trace was
# "corrupt" (exit 3). Every combination, through the CLI and through the
# library alone (closed_fds: no CLI start-up to fill the descriptors).
case_closed_fds() {
  fixtures
  mkdir A && "$HOSTILE" A ranks || { echo "cannot write the set"; exit 1; }
  local c redir
  for c in 0 1 2 01 02 12 012; do
    redir=
    case $c in *0*) redir="$redir <&-";; esac
    case $c in *1*) redir="$redir >&-";; esac
    case $c in *2*) redir="$redir 2>&-";; esac
    rm -f r.html d.json pm.json lib.txt
    t -- sh -c "\"$AMP\" report fp16.h5 -q -o r.html $redir; echo \$? >rc.txt"
    rc=$(cat rc.txt)
    expect 1 "report with fd(s) $c closed"
    if [ -s r.html ] && ! grep -q "^ampprobe:" r.html; then ok "r.html written, no message in it (fds $c closed)"
    else bad "r.html missing or holds a message (fds $c closed)"; fi
    t -- sh -c "\"$AMP\" diff fp16.h5 fp32.h5 -q -o d.json $redir; echo \$? >rc.txt"
    rc=$(cat rc.txt)
    case $c in
      *1*) expect 4 "diff -o with fd(s) $c closed: its verdict line is lost, not the input corrupt";;
      *) expect "0|1" "diff -o with fd(s) $c closed";;
    esac
    [ -s d.json ] && ok "d.json written (fds $c closed)" || bad "d.json not written (fds $c closed)"
    for x in fp16.h5:1 A:0; do
      t -- sh -c "\"$AMP\" postmortem --json ${x%:*} $redir >pm.json; echo \$? >rc.txt"
      rc=$(cat rc.txt)
      expect "${x#*:}" "postmortem --json ${x%:*} with fd(s) $c closed but stdout"
      has pm.json '"verdict"'
    done
    case $c in *1*)
      t -- sh -c "\"$AMP\" postmortem fp16.h5 $redir; echo \$? >rc.txt"
      rc=$(cat rc.txt)
      expect 4 "postmortem with stdout closed (fds $c): the output is lost, not the input corrupt";;
    esac
    if [ -n "$CLOSED_FDS" ]; then
      t -- sh -c "\"$CLOSED_FDS\" lib.txt fp16.h5 A/* $redir"
      expect 0 "library readers with fd(s) $c closed"
      if [ "$(grep -c 'status=0 json=yes' lib.txt 2>/dev/null)" = 2 ]; then ok "library: trace and set read (fds $c closed)"
      else bad "library with fds $c closed: $(tr '\n' ' ' <lib.txt 2>/dev/null)"; fi
    fi
  done
}

# A -o that cannot be written at the end does not lose the result: bisect
# and diff still print it on stdout (table or JSON), then one error line,
# exit 4. A bisect stopped by SIGINT writes its "interrupted" result to -o
# as it prints it with --json.
case_output_kept() {
  fixtures
  mkdir A && "$HOSTILE" A ranks || { echo "cannot write the set"; exit 1; }
  local cmd
  for cmd in "bisect --scenario two-culprits --fp32-candidates softmax,revin --steps 30 -q --workdir bw1 --force -o /dev/full:minimal set" \
             "bisect --json --scenario two-culprits --fp32-candidates softmax,revin --steps 30 -q --workdir bw2 --force -o /dev/full:\"outcome\": \"minimal-set-found\"" \
             "diff fp16.h5 fp32.h5 -q -o /dev/full:verdict: " \
             "diff --json fp16.h5 fp32.h5 -q -o /dev/full:\"verdict\": " \
             "diff A A -q -o /dev/full:verdict: AGREE" \
             "diff --json A A -q -o /dev/full:\"verdict\": \"agree\""; do
    t -- sh -c "exec \"$AMP\" ${cmd%%:*}"
    expect 4 "ampprobe ${cmd%%:*}"
    one_line "ampprobe ${cmd%%:*}" "cannot write /dev/full: No space left on device"
    has out.txt "${cmd#*:}"
  done
  local tag="$W/int-wd" pid i left
  "$AMP" bisect --scenario two-culprits --fp32-candidates revin,softmax -j 2 \
    --steps 200000 -q --workdir "$tag" -o bi.json >bi.out 2>bi.err &
  pid=$!
  for i in $(seq 300); do # until trials run (at most 60 s)
    left=$(pgrep -f -- "$tag/trial-" || true)
    [ -n "$left" ] && break
    sleep 0.2
  done
  [ -n "$left" ] || { kill -9 $pid 2>/dev/null; bad "no trial started within 60 s"; return; }
  kill -INT $pid
  wait $pid
  rc=$?
  expect 130 "bisect -o stopped by SIGINT"
  if [ -s bi.json ]; then
    has bi.json '"outcome": "interrupted"'
    has bi.json '"trials"'
  else
    bad "bi.json not written by the interrupted bisect"
  fi
  has bi.out "interrupted"
}

# An output replaced through a temporary file keeps the mode (and, where
# the user may give it, the owner) of the file it replaces: a page made
# 0600 became 0644 on the next report. A new file is 0666 minus the umask.
case_modes_kept() {
  fixtures
  umask 022
  mode() { stat -c %a "$1"; }
  want_mode() { # FILE MODE WHAT
    if [ "$(mode "$1")" = "$2" ]; then ok "$3: $1 is $2"; else bad "$3: $1 is $(mode "$1"), want $2"; fi
  }
  t -- "$AMP" report fp16.h5 -q -o p.html
  want_mode p.html 644 "a new page"
  local m
  for m in 600 640 604; do
    chmod $m p.html
    t -- "$AMP" report fp16.h5 -q -o p.html
    expect 1 "report over a $m page"
    want_mode p.html $m "report over a $m page"
  done
  ln -s p.html l.html && chmod 600 p.html
  t -- "$AMP" report fp16.h5 -q -o l.html
  want_mode p.html 600 "report through a symlink"
  t -- "$AMP" diff fp16.h5 fp32.h5 -q -o d.json
  chmod 600 d.json
  t -- "$AMP" diff fp16.h5 fp32.h5 -q -o d.json
  want_mode d.json 600 "diff -o over a 600 result"
  echo '{}' >b.json && chmod 640 b.json
  t -- "$AMP" bisect --scenario two-culprits --fp32-candidates softmax,revin --steps 30 -q --workdir bw --force -o b.json
  want_mode b.json 640 "bisect --force -o over a 640 file"
  if [ "$(id -u)" = 0 ]; then
    chown 65534:65534 d.json
    t -- "$AMP" diff fp16.h5 fp32.h5 -q -o d.json
    if [ "$(stat -c %u:%g d.json)" = 65534:65534 ]; then ok "diff -o keeps the owner (root)"
    else bad "diff -o changed the owner to $(stat -c %u:%g d.json)"; fi
  fi
  no_temps .
}

# run -o / bisect -o at what can never hold the output (hunt F10): a
# directory, a device, a FIFO, a symlink to nothing or to a directory, a
# missing folder. The reason is said at once, exit 4, in the same words
# with and without --force, with no "use --force" advice (it cannot help),
# and nothing there is touched; an existing regular file is still refused
# (exit 2, naming --force).
case_run_o_not_file() {
  TMO=30
  mkdir adir && mkfifo ff && ln -s nowhere dang.h5 && ln -s adir dlink.h5
  local o f e1
  for o in adir /dev/null ff dang.h5 dlink.h5 nodir/x.h5; do
    for f in "" --force; do
      t -- "$AMP" run -q --steps 3 $f -o "$o"
      expect 4 "run -o $o $f"
      one_line "run -o $o $f" "cannot create trace $o: "
      hasnt err.txt "--force"
      [ -z "$f" ] && e1=$(cat err.txt)
      [ -n "$f" ] && { [ "$e1" = "$(cat err.txt)" ] && ok "run -o $o: the same line with --force" ||
                         bad "run -o $o: '$e1' without --force, '$(cat err.txt)' with it"; }
    done
  done
  [ -d adir ] && [ -p ff ] && [ -L dang.h5 ] && [ ! -e nowhere ] && [ -L dlink.h5 ] &&
    [ -z "$(ls -A adir)" ] && [ ! -e nodir ] && ok "nothing there was touched" ||
    bad "an -o target was changed: $(ls -la . adir)"
  has err.txt "No such file or directory"
  t -- "$AMP" run -q --steps 3 -o adir; has err.txt "Is a directory"
  t -- "$AMP" run -q --steps 3 -o ff; has err.txt "not a regular file (a FIFO)"
  t -- "$AMP" run -q --steps 3 -o dang.h5; has err.txt "a symbolic link to nothing"
  # an existing regular file: refused, --force named, and --force works
  echo "keep" >keep.h5
  t -- "$AMP" run -q --steps 3 -o keep.h5
  expect 2 "run -o an existing file"
  one_line "run -o an existing file" "already exists: refusing to overwrite it (use --force"
  [ "$(cat keep.h5)" = keep ] && ok "keep.h5 untouched" || bad "keep.h5 changed"
  t -- "$AMP" run -q --steps 3 --force -o new.h5
  expect 0 "run --force -o a new file"
  trace_opens new.h5 "run --force -o a new file"
  # bisect -o: a directory or a dangling symlink, said before any trial
  for o in adir dlink.h5 dang.h5; do
    for f in "" --force; do
      t -- "$AMP" bisect --scenario two-culprits --fp32-candidates softmax,revin --steps 30 -q \
        --workdir bw $f -o "$o"
      expect 4 "bisect -o $o $f"
      one_line "bisect -o $o $f" "cannot write $o: "
      hasnt err.txt "--force"
      absent bw "bisect -o $o $f: no trial ran"
    done
  done
}

# -o a FIFO (hunt F11): written in place when a reader has it open; with
# no reader, one line at once (exit 4), never a wait for ever.
case_fifo_no_reader() {
  TMO=10 # an answer takes seconds; a hang is cut short
  fixtures
  mkfifo ff
  local what
  for what in "report fp16.h5 -q -o ff" "report fp16.h5 -q --force -o ff" \
              "diff fp16.h5 fp32.h5 -q -o ff"; do
    t -- "$AMP" $what
    expect 4 "$what, no reader"
    one_line "$what, no reader" "cannot write ff: a FIFO with no reader"
  done
  t -- "$AMP" bisect --scenario two-culprits --fp32-candidates softmax,revin --steps 30 -q \
    --workdir bw --force -o ff
  expect 4 "bisect --force -o ff, no reader"
  has err.txt "cannot write ff: a FIFO with no reader"
  [ -p ff ] && ok "ff is still a FIFO" || bad "ff was replaced: $(ls -l ff)"
  no_temps .
  # a reader there: the output goes through the FIFO, whole
  local cp
  cat ff >got.html & cp=$!
  sleep 0.5
  t -- "$AMP" report fp16.h5 -q -o ff
  wait $cp
  expect 1 "report -o ff, a reader there"
  has got.html "ampprobe report"
  has got.html "</html>"
  cat ff >got.json & cp=$!
  sleep 0.5
  t -- "$AMP" diff fp16.h5 fp32.h5 -q -o ff
  wait $cp
  expect "0|1" "diff -o ff, a reader there"
  has got.json '"verdict"'
  [ -p ff ] && ok "ff is still a FIFO" || bad "ff was replaced: $(ls -l ff)"
}

# A writer killed while it creates the trace (hunt F8) leaves an empty file
# or a bare HDF5 superblock (48 bytes, stored EOF past the end). The bare
# superblock reads as a trace not closed with 0 steps (exit 1, no-steps,
# a note saying the writer was killed before it wrote anything); an empty
# file, which need not be ours, is "empty file: no trace was written",
# exit 3; a file killed later in the creation, before SWMR mode, which
# HDF5 will not open, says so (exit 3). None is "corrupt" or "not an HDF5
# file"; what only looks like them (truncated, with more bytes, text, a
# live writer) is not them.
bare_sb() { # bare_sb FILE: H5Fcreate (libver latest), killed before a flush
  /usr/bin/python3 -c "import h5py, os, sys
f = h5py.File(sys.argv[1], 'w', libver='latest'); os._exit(0)" "$1"
}
case_kill_at_create() {
  TMO=30
  have_h5py
  local killed="the writer was killed before it wrote anything (no step recorded)"
  local empty="empty file: no trace was written (a writer killed at its creation leaves this)"
  bare_sb bare.h5
  [ "$(stat -c %s bare.h5)" = 48 ] || { bad "the fixture is $(stat -c %s bare.h5) bytes, not 48"; return; }
  "$AMP" run --scenario healthy --trace -q -o good.h5 >/dev/null 2>&1
  local sb; sb=$(sum bare.h5)
  t -- "$AMP" postmortem -q bare.h5
  expect 1 "postmortem of a bare superblock"
  has out.txt "INCOMPLETE (writer did not close it)"
  has out.txt "0 steps"
  has out.txt "[no-steps]"
  one_line "postmortem of a bare superblock: the note" "$killed"
  t -- "$AMP" postmortem --json bare.h5
  expect 1 "postmortem --json of a bare superblock"
  has out.txt '"complete": false'
  has out.txt '"no-steps"'
  t -- "$AMP" report bare.h5 -q -o r.html
  expect 1 "report of a bare superblock"
  has r.html "ampprobe report"
  t -- "$AMP" diff bare.h5 good.h5 -q
  expect 1 "diff of a bare superblock and a trace"
  has err.txt "$killed"
  unchanged bare.h5 "$sb" "read, never written"
  # an empty file: not necessarily ours, so no verdict
  : >empty.h5
  for what in "postmortem -q empty.h5" "report empty.h5 -q -o e.html" \
              "diff empty.h5 good.h5 -q"; do
    t -- "$AMP" $what
    expect 3 "$what"
    one_line "$what" "empty.h5: $empty"
  done
  absent e.html "no page of an empty file"
  # look-alikes stay what they are (exit 3, not "killed")
  head -c 40 bare.h5 >short.h5
  { cat bare.h5; head -c 16 /dev/zero; } >longer.h5
  printf '%048d' 0 >text.h5
  head -c 48 good.h5 >cut.h5 # a closed trace cut: not marked open for write
  for f in short.h5 longer.h5 text.h5 cut.h5; do
    t -- "$AMP" postmortem -q "$f"
    expect 3 "postmortem $f (a look-alike)"
    hasnt err.txt "killed before"
  done
  # killed later in the creation, before SWMR mode: HDF5 refuses it (still
  # "open for write"); said as such, exit 3, not "corrupt or truncated"
  /usr/bin/python3 -c "import h5py, os, sys
f = h5py.File(sys.argv[1], 'w', libver='latest'); f.create_dataset('a', data=[1, 2])
f.flush(); os._exit(0)" openw.h5
  t -- "$AMP" postmortem -q openw.h5
  expect 3 "postmortem of an HDF5 file killed before SWMR mode"
  one_line "killed before SWMR mode" "a trace writer killed while it created the file leaves this (no step recorded)"
  # one a live writer holds (its lock): being created, not killed
  cp bare.h5 live.h5 && : >live0.h5
  /usr/bin/python3 -c "import fcntl, sys, time
fs = [open(p, 'r+') for p in sys.argv[1:]]
[fcntl.lockf(f, fcntl.LOCK_EX) for f in fs]; time.sleep(8)" live.h5 live0.h5 & local lp=$!
  sleep 1
  t -- "$AMP" postmortem -q live.h5
  expect 3 "postmortem of a bare superblock a writer holds"
  hasnt err.txt "killed before"
  t -- "$AMP" postmortem -q live0.h5
  expect 3 "postmortem of an empty file a writer holds"
  one_line "an empty file a writer holds" "empty file: a writer is creating it now"
  kill $lp 2>/dev/null; wait $lp 2>/dev/null
  # a rank file of a set: unreadable, in these words, after the rest
  if command -v mpirun >/dev/null; then
    mkdir rs
    "$AMP" run --ranks 2 --scenario healthy --steps 5 --trace -q -o rs/t.h5 >/dev/null 2>&1
    cp bare.h5 rs/t.rank1.h5
    t -- "$AMP" postmortem -q rs
    expect 3 "postmortem of a set whose rank 1 is a bare superblock"
    has out.txt "rs/t.rank1.h5 (rank 1 by its name): an HDF5 superblock and nothing else: $killed"
  else
    echo "note: no mpirun: the rank-set check is not run"
  fi
  # real kills in the creation window: whatever is left opens or is the
  # empty file, never "corrupt" nor "not an HDF5 file"
  local i d f n=0
  for i in $(seq 1 12); do
    d=$(awk -v i="$i" 'BEGIN{printf "%.3f", 0.02 + i*0.01}')
    f=k_$i.h5
    "$AMP" run -q --trace --steps 3000 -o "$f" >/dev/null 2>&1 & local rp=$!
    sleep "$d"; kill -KILL $rp 2>/dev/null; wait $rp 2>/dev/null
    [ -e "$f" ] || continue
    n=$((n + 1))
    t -- "$AMP" postmortem -q "$f"
    if [ "$rc" = 0 ] || [ "$rc" = 1 ] ||
       { [ "$rc" = 3 ] && [ ! -s "$f" ] && grep -qF "$empty" err.txt; } ||
       { [ "$rc" = 3 ] && grep -qF "killed while it created the file" err.txt; }; then
      ok "killed after ${d}s ($(stat -c %s "$f") bytes): exit $rc"
    else
      bad "killed after ${d}s ($(stat -c %s "$f") bytes): exit $rc: $(head -1 err.txt)"
    fi
  done
  echo "note: $n of 12 kills left a file"
}

"case_$CASE" || true
if [ "$fail" -ne 0 ] && [ -n "${PENDING:-}" ]; then
  echo "SKIP: this case needs $PENDING, which is not in this tree yet; the failures above are expected until it lands"
  exit 77
fi
if [ "$fail" -eq 0 ] && [ -n "${PENDING:-}" ]; then
  echo "NOTE: passes although marked pending on '$PENDING': drop the mark in tests/faults/CMakeLists.txt"
fi
[ "$fail" -eq 0 ] && echo "PASS $CASE" || echo "FAILED $CASE"
exit $fail
