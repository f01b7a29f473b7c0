#!/usr/bin/env bash
# tests/dist/dist.sh - multi-rank end to end (issue 14, contract C6): the
# real `ampprobe run` under the real mpirun (Open MPI, --oversubscribe, so 4
# ranks run on 2 cores), the rank traces read back by the library's reader
# (rank_info) and by h5py, and `ampprobe postmortem` over the set (a
# directory, a glob, a list of files), its text and its --json.
#
#   dist.sh CASE NRANKS AMPPROBE RANK_INFO WORKDIR
#
# CASE: healthy | allreduce_overflow | rank_bad_input | kill | rank_files |
#       sets | launch. One CTest test per (CASE, NRANKS), label `mpi`
#       (tests/dist/CMakeLists.txt). Skips (exit 77, reason printed) when
#       mpirun is not found or the binary was built without MPI. Every
#       command runs under `timeout` (30 s x AMPPROBE_TEST_TIMEOUT_SCALE), in
#       WORKDIR, which is emptied first.
set -u
CASE=${1:?usage: dist.sh CASE NRANKS AMPPROBE RANK_INFO WORKDIR}
N=${2:?}
AMP=${3:?}
INFO=${4:?}
W=${5:?}
PY=/usr/bin/python3
HERE=$(cd "$(dirname "$0")" && pwd)
CHECK="$PY $HERE/check.py"
TMO=$((30 * ${AMPPROBE_TEST_TIMEOUT_SCALE:-1}))
MPIRUN=${AMPPROBE_MPIRUN:-mpirun}
fail=0

ok() { echo "ok   $*"; }
bad() { echo "FAIL $*"; fail=1; }
skip() { echo "SKIP: $*"; exit 77; }
finish() {
  if [ "$fail" = 0 ]; then echo "all checks passed ($CASE, $N ranks)"; exit 0; fi
  echo "some checks failed ($CASE, $N ranks); files kept in $W"
  exit 1
}

command -v "$MPIRUN" >/dev/null 2>&1 || skip "mpirun not found (install openmpi-bin: scripts/install-deps.sh)"
[ -x "$PY" ] || skip "$PY not found (the checks parse JSON with it)"
[ "${AMPPROBE_HAVE_MPI:-0}" = 1 ] || skip "this ampprobe was built without MPI (AMPPROBE_MPI=OFF: no mpi.h/libmpi at configure time)"
rm -rf "$W" && mkdir -p "$W" && cd "$W" || exit 1
# Open MPI refuses root unless told; the ranks inherit this environment.
if [ "$(id -u)" = 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
# One fixed run id per test, unless a case sets its own.
unset AMPPROBE_RUN_ID AMPPROBE_FAULT_KILL_RANK AMPPROBE_FAULT_KILL_STEP

# t NAME -- cmd...: runs cmd under a timeout, stdout to NAME.out, stderr to
# NAME.err; sets rc.
t() {
  local name=$1
  shift 2
  timeout -k 10 "$TMO" "$@" >"$name.out" 2>"$name.err"
  rc=$?
  if [ "$rc" = 124 ]; then bad "$name: timed out after ${TMO}s (a hang): $*"; fi
}

# mpi NAME NP -- ampprobe-args...: the real launcher.
mpi() {
  local name=$1 np=$2
  shift 3
  t "$name" -- "$MPIRUN" --oversubscribe -np "$np" "$AMP" "$@"
}

# expect WANT WHAT: rc must be one of WANT ("0" or "1|3").
expect() {
  if echo "|$1|" | grep -q "|$rc|"; then
    ok "$2 (exit $rc)"
  else
    bad "$2: exit $rc, want $1"
    local f
    for f in "${3:-}".err; do [ -f "$f" ] && sed 's/^/     | /' "$f" | head -8; done
  fi
}

# check WHAT -- check.py args...: one assertion of check.py (it prints the
# evidence); ok or FAIL.
check() {
  local what=$1
  shift 2
  local msg
  if msg=$($CHECK "$@" 2>&1); then ok "$what: $msg"; else bad "$what: $msg"; fi
}

# has FILE TEXT / hasnt FILE TEXT (fixed strings)
has() { if grep -qF -- "$2" "$1"; then ok "$1 has '$2'"; else bad "$1 lacks '$2'"; sed 's/^/     | /' "$1" | head -40; fi; }
hasnt() { if grep -qF -- "$2" "$1"; then bad "$1 has '$2'"; else ok "$1 lacks '$2'"; fi; }

# one_line NAME TEXT: NAME.err is one 'ampprobe: ...' line containing TEXT
one_line() {
  local n
  n=$(wc -l <"$1.err")
  if [ "$n" -ne 1 ] || ! grep -q '^ampprobe: ' "$1.err"; then
    bad "$1: stderr is not one 'ampprobe: ' line ($n lines)"
    sed 's/^/     | /' "$1.err" | head -6
  elif ! grep -qF -- "$2" "$1.err"; then
    bad "$1: stderr lacks '$2': $(cat "$1.err")"
  else
    ok "$1: $(cat "$1.err")"
  fi
}

# files PREFIX NP: the rank files the naming rule gives, in rank order
files() {
  local r
  for ((r = 0; r < $2; r++)); do echo "$1.rank$r.h5"; done
}

# info NAME FILE...: rank_info's JSON of the files -> NAME.json
info() {
  local name=$1
  shift
  timeout -k 10 "$TMO" "$INFO" "$@" >"$name.json" 2>"$name.info.err" ||
    bad "rank_info $name: exit $?: $(cat "$name.info.err")"
}

# pm NAME ARGS...: `ampprobe postmortem ARGS --json` -> NAME.json, its exit
# in PMRC; the text report -> NAME.txt (its exit in rc).
pm() {
  local name=$1
  shift
  t "$name.pmjson" -- "$AMP" postmortem "$@" --json
  PMRC=$rc
  cp "$name.pmjson.out" "$name.json"
  t "$name" -- "$AMP" postmortem "$@"
  cp "$name.out" "$name.txt"
  [ "$rc" = "$PMRC" ] || bad "postmortem $*: exit $rc with text, $PMRC with --json"
}


# ---- the cases ----------------------------------------------------------------
RUNOPT=(--trace -q)

# healthy: N ranks x M micro-batches = one process with N*M micro-batches
case_healthy() {
  local S=12 M=2
  mkdir -p out
  mpi run "$N" -- run --scenario healthy --steps $S --micro-batches $M "${RUNOPT[@]}" -o out/t.h5
  expect 0 "healthy on $N ranks" run
  [ -e out/t.h5 ] && bad "out/t.h5 written: want only the rank files"
  info ranks $(files out/t "$N")
  check "rank attributes" -- ranks ranks.json "$N"
  check "weight digests" -- digests ranks.json
  check "all-reduce sites" -- sites ranks.json
  check "h5py" -- h5 $(files out/t "$N")
  t single -- "$AMP" run --scenario healthy --steps $S --micro-batches $((N * M)) "${RUNOPT[@]}" -o single.h5
  expect 0 "the same global batch in one process" single
  info single single.h5
  check "single process: no rank" -- expr single.json "d[0]['rank'] == -1 and d[0]['world_size'] == 0 and d[0]['run_id'] == ''"
  check "loss vs one process" -- loss ranks.json single.json "$LOSS_TOL"
  pm dir out
  expect 0 "postmortem DIR" dir
  check "verdict" -- expr dir.json "d['verdict'] == 'healthy'" "d['verdict']"
  pm glob 'out/t.rank*.h5'
  expect 0 "postmortem 'GLOB'" glob
  pm list $(files out/t "$N")
  expect 0 "postmortem FILE..." list
  for f in glob list; do
    if cmp -s dir.txt $f.txt; then ok "$f: the same report as DIR"; else bad "$f: report differs from DIR's"; diff dir.txt $f.txt | head -10; fi
  done
}

# allreduce-overflow: every rank finite before the FP16 all-reduce, its sum not
case_allreduce_overflow() {
  mkdir -p out fp32
  mpi run "$N" -- run --scenario allreduce-overflow "${RUNOPT[@]}" -o out/t.h5
  expect 1 "allreduce-overflow on $N ranks" run
  info ranks $(files out/t "$N")
  check "rank attributes" -- ranks ranks.json "$N"
  check "born in the all-reduce (the traces)" -- born_in_allreduce ranks.json
  pm pm out
  expect 1 "postmortem" pm
  check_allreduce_origin pm
  # the fix it names works
  mpi fix "$N" -- run --scenario allreduce-overflow --allreduce-dtype fp32 "${RUNOPT[@]}" -o fp32/t.h5
  expect 0 "the same with an FP32 all-reduce" fix
  if [ "$N" = 2 ]; then
    mkdir -p prediv
    mpi prediv "$N" -- run --scenario allreduce-overflow --allreduce-prediv "${RUNOPT[@]}" -o prediv/t.h5
    expect 0 "the same with pre-division by N" prediv
  fi
}

# rank-bad-input: NaN in one rank's shard at one step, carried by the all-reduce
case_rank_bad_input() {
  mkdir -p out
  mpi run "$N" -- run --scenario rank-bad-input "${RUNOPT[@]}" -o out/t.h5
  expect 1 "rank-bad-input on $N ranks" run
  info ranks $(files out/t "$N")
  check "rank attributes" -- ranks ranks.json "$N"
  check "carried (the traces)" -- carried ranks.json "$BAD_RANK" "$BAD_STEP"
  pm pm out
  expect 1 "postmortem" pm
  check_carried pm "$BAD_RANK" "$BAD_STEP" "$N"
}

# kill: SIGKILL of one rank mid-run; every rank's file readable up to its
# last flush; the post-mortem names the rank that stopped first
case_kill() {
  local K=$((N - 1)) S=40
  mkdir -p out
  AMPPROBE_FAULT_KILL_RANK=$K AMPPROBE_FAULT_KILL_STEP=$S \
    mpi run "$N" -- run --scenario healthy --steps $((2 * S)) "${RUNOPT[@]}" -o out/t.h5
  if [ "$rc" = 0 ] || [ "$rc" = 124 ]; then bad "a job with a killed rank: exit $rc"; else ok "job with rank $K killed: exit $rc"; fi
  info ranks $(files out/t "$N")
  check "every rank readable by the reader" -- ranks ranks.json "$N"
  check "killed rank incomplete, stopped before step $S" -- expr ranks.json "d[$K]['complete'] == 0 and d[$K]['last_step'] < $S" "[(f['rank'], f['complete'], f['last_step']) for f in d]"
  check "h5py reads every rank" -- h5 $(files out/t "$N")
  pm pm out
  expect "1|3" "postmortem of the killed job" pm
  check_stopped_first pm "$K"
}

# rank files: one 4-rank job, then a file missing, truncated, garbage
case_rank_files() {
  mkdir -p run
  mpi run "$N" -- run --scenario rank-bad-input "${RUNOPT[@]}" -o run/t.h5
  expect 1 "rank-bad-input on $N ranks" run
  cp -r run missing && rm missing/t.rank2.h5
  pm missing missing
  expect "$PM_INCOMPLETE_RC" "a rank file missing" missing
  check_missing missing 2
  check_carried missing "$BAD_RANK" "$BAD_STEP" "$N"
  # the culprit's own file missing: nobody may say the all-reduce made it
  cp -r run culprit && rm "culprit/t.rank$BAD_RANK.h5"
  pm culprit culprit
  check_missing culprit "$BAD_RANK"
  check_not_allreduce culprit
  cp -r run trunc && sz=$(stat -c %s trunc/t.rank2.h5) && truncate -s $((sz / 2)) trunc/t.rank2.h5
  pm trunc trunc
  expect "$PM_INCOMPLETE_RC" "a rank file truncated" trunc
  check_unreadable trunc t.rank2.h5
  check_carried trunc "$BAD_RANK" "$BAD_STEP" "$N"
  cp -r run garbage && head -c 65536 /dev/urandom >garbage/t.rank3.h5
  pm garbage garbage
  expect "$PM_INCOMPLETE_RC" "a rank file of garbage" garbage
  check_unreadable garbage t.rank3.h5
  check_carried garbage "$BAD_RANK" "$BAD_STEP" "$N"
}

# sets: mixed run ids refused; a glob that matches nothing; no traces
case_sets() {
  mkdir -p a b empty notraces && echo notes >notraces/readme.txt
  AMPPROBE_RUN_ID=job-A mpi a "$N" -- run --scenario healthy --steps 4 "${RUNOPT[@]}" -o a/t.h5
  expect 0 "job A" a
  AMPPROBE_RUN_ID=job-B mpi b "$N" -- run --scenario healthy --steps 4 "${RUNOPT[@]}" -o b/t.h5
  expect 0 "job B" b
  info a a/t.rank0.h5
  check "AMPPROBE_RUN_ID is the run id" -- expr a.json "d[0]['run_id'] == 'job-A'" "d[0]['run_id']"
  t mixed -- "$AMP" postmortem a/t.rank0.h5 b/t.rank1.h5
  expect "$PM_MIXED_RC" "two jobs' ranks" mixed
  one_line mixed "run id"
  has mixed.err job-A
  has mixed.err job-B
  t nomatch -- "$AMP" postmortem 'nothing-here*.h5'
  expect 3 "a glob that matches nothing" nomatch
  one_line nomatch "nothing-here*.h5"
  t empty -- "$AMP" postmortem empty
  expect 3 "an empty directory" empty
  one_line empty "empty"
  t notraces -- "$AMP" postmortem notraces
  expect 3 "a directory without traces" notraces
  one_line notraces "notraces"
}

# launch: --ranks N re-execs mpirun; {rank} in the path; a path without .h5
case_launch() {
  mkdir -p out plain
  t ranks -- "$AMP" run --ranks "$N" --scenario healthy --steps 4 "${RUNOPT[@]}" -o 'out/r{rank}-of-job.h5'
  expect 0 "run --ranks $N" ranks
  local fs=() r
  for ((r = 0; r < N; r++)); do fs+=("out/r$r-of-job.h5"); done
  info ranks "${fs[@]}"
  check "{rank} in the path" -- ranks ranks.json "$N"
  mpi plain "$N" -- run --scenario healthy --steps 4 "${RUNOPT[@]}" -o plain/trace
  expect 0 "a path without .h5" plain
  info plain $(files plain/trace "$N")
  check "path.rank{r}.h5" -- ranks plain.json "$N"
}

case "$CASE" in
  healthy | allreduce_overflow | rank_bad_input | kill | rank_files | sets | launch)
    "case_$CASE" ;;
  *) echo "unknown case $CASE"; exit 2 ;;
esac
finish
