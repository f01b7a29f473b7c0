#!/usr/bin/env bash
# tests/trainer/mpi_smoke.sh - data-parallel runs of the reference trainer
# under mpirun (label mpi), 2 and 4 ranks, oversubscribed:
#   - healthy-dp: every rank's step scalars (loss, scale, skips, weight
#     digest) agree, and the loss equals one process with N micro-batches on
#     the same global batch to within the documented tolerance (docs/cli.md:
#     1e-3 relative per step in FP16; bit for bit in FP32, checked too);
#   - allreduce-overflow: every rank's GRAD_PRE_ALLREDUCE finite at step 0,
#     GRAD_POST_ALLREDUCE not; FP32 all-reduce and pre-division both fix it;
#   - rank-bad-input: the first non-finite record of rank 1 is its input at
#     step 30 (forward), the other ranks' is the all-reduced gradient;
#   - a rank killed by AMPPROBE_FAULT_KILL_*: mpirun ends the job, every
#     trace opens, the killed rank's holds fewer steps;
#   - ampprobe run --ranks 2 says what it runs and writes the rank files.
# Usage: mpi_smoke.sh AMPPROBE DIST_CHECK HAVE_MPI(0|1). Exit 77 (skip) with
# the reason when the build has no MPI or mpirun is missing.
set -u
AMPPROBE=$1 CHECK=$2 HAVE_MPI=${3:-0}
if [ "$HAVE_MPI" != 1 ]; then
  echo "SKIP: this build has no MPI (configure found none; install libopenmpi-dev)"
  exit 77
fi
if ! command -v mpirun >/dev/null 2>&1; then
  echo "SKIP: mpirun is not on PATH (install openmpi-bin)"
  exit 77
fi
if [ "$(id -u)" = 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
# Open MPI 4's exit race (a finished rank reported as 'exiting improperly',
# exit 1): taken as run --ranks takes it, docs/multirank.md
export OMPI_MCA_orte_allowed_exit_without_sync=1
# no run id from the environment: rank 0 makes one
unset AMPPROBE_RUN_ID AMPPROBE_FAULT_KILL_RANK AMPPROBE_FAULT_KILL_STEP
TOL=1e-3
dir=$(mktemp -d /tmp/ampprobe-mpi-XXXXXX)
trap 'rm -rf "$dir"' EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
ok() { echo "ok: $*"; }
mpi() { mpirun --oversubscribe -np "$@"; }

for N in 2 4; do
  # ---- healthy-dp against one process with N micro-batches -------------------
  out=$dir/h$N
  if ! mpi "$N" "$AMPPROBE" run --scenario healthy-dp --trace -o "$out.h5" -q \
      >"$dir/log" 2>&1; then
    cat "$dir/log"; fail "healthy-dp, $N ranks: mpirun failed"; continue
  fi
  files=()
  for ((r = 0; r < N; r++)); do files+=("$out.rank$r.h5"); done
  info=$("$CHECK" info "${files[1]}")
  case $info in
    "rank 1 world $N run_id "*" complete 1 "*) ok "healthy-dp $N: $info" ;;
    *) fail "healthy-dp $N: rank file attributes: $info" ;;
  esac
  id0=$("$CHECK" info "${files[0]}" | awk '{print $6}')
  idl=$("$CHECK" info "${files[N-1]}" | awk '{print $6}')
  [ -n "$id0" ] && [ "$id0" = "$idl" ] || fail "healthy-dp $N: run ids differ ($id0, $idl)"
  "$CHECK" agree "${files[@]}" || fail "healthy-dp $N: ranks disagree"
  "$AMPPROBE" run --scenario healthy-dp --micro-batches "$N" --trace \
    -o "$dir/s$N.h5" -q >/dev/null 2>&1
  "$CHECK" loss-close "${files[0]}" "$dir/s$N.h5" "$TOL" ||
    fail "healthy-dp $N: loss differs from one process with $N micro-batches"
  # FP32 precision: the same run bit for bit (same sums in the same order,
  # the same weights: one process measures the digest when asked)
  mpi "$N" "$AMPPROBE" run --scenario healthy-dp --precision fp32 --steps 30 \
    -o "$dir/f$N.h5" -q >/dev/null 2>&1
  "$AMPPROBE" run --scenario healthy-dp --precision fp32 --steps 30 \
    --micro-batches "$N" --weight-digest -o "$dir/g$N.h5" -q >/dev/null 2>&1
  "$CHECK" agree "$dir/f$N.rank0.h5" "$dir/g$N.h5" ||
    fail "healthy-dp fp32 $N: not bit-identical to one process"

  # ---- allreduce-overflow: born in the all-reduce ------------------------------
  mpi "$N" "$AMPPROBE" run --scenario allreduce-overflow --trace \
    -o "$dir/o$N.h5" -q >/dev/null 2>&1
  for ((r = 0; r < N; r++)); do
    f=$dir/o$N.rank$r.h5
    pre=$("$CHECK" site "$f" grad_pre_allreduce 0)
    post=$("$CHECK" site "$f" grad_post_allreduce 0)
    first=$("$CHECK" first-nonfinite "$f")
    if [ "$pre" = finite ] && [ "$post" = nonfinite ] &&
       [ "$first" = "0 grad_post_allreduce head.fc" ]; then
      ok "allreduce-overflow $N rank $r: pre finite, post inf ($first)"
    else
      fail "allreduce-overflow $N rank $r: pre $pre, post $post, first $first"
    fi
  done
  for fix in "--allreduce-dtype fp32" "--allreduce-prediv"; do
    # shellcheck disable=SC2086
    mpi "$N" "$AMPPROBE" run --scenario allreduce-overflow $fix --trace \
      -o "$dir/x$N.h5" --force -q >/dev/null 2>&1
    first=$("$CHECK" first-nonfinite "$dir/x$N.rank0.h5")
    [ "$first" = none ] && ok "allreduce-overflow $N $fix: all finite" ||
      fail "allreduce-overflow $N $fix: $first"
  done

  # ---- rank-bad-input: rank 1's input first ------------------------------------
  mpi "$N" "$AMPPROBE" run --scenario rank-bad-input --trace \
    -o "$dir/b$N.h5" -q >/dev/null 2>&1
  for ((r = 0; r < N; r++)); do
    first=$("$CHECK" first-nonfinite "$dir/b$N.rank$r.h5")
    if [ $r = 1 ]; then want="30 fwd_out input"; else want="30 grad_post_allreduce enc.fc1"; fi
    [ "$first" = "$want" ] && ok "rank-bad-input $N rank $r: $first" ||
      fail "rank-bad-input $N rank $r: first non-finite '$first', want '$want'"
  done
  "$CHECK" agree "$dir"/b$N.rank*.h5 || fail "rank-bad-input $N: ranks disagree"
done

# ---- a killed rank -----------------------------------------------------------
# rank 1 dies at the start of step 20; it flushes by time only (1000 s: never
# before it dies), the others every step, so its trace is behind for sure
C=(run --scenario healthy-dp --trace -o "$dir/k.h5" -q)
AMPPROBE_FAULT_KILL_RANK=1 AMPPROBE_FAULT_KILL_STEP=20 timeout 300 \
  mpirun --oversubscribe -np 1 "$AMPPROBE" "${C[@]}" --flush-steps 1 \
  : -np 1 "$AMPPROBE" "${C[@]}" --flush-seconds 1000 \
  : -np 2 "$AMPPROBE" "${C[@]}" --flush-steps 1 >"$dir/log" 2>&1
rc=$?
[ $rc -ne 0 ] && [ $rc -ne 124 ] && ok "killed rank: mpirun exit $rc" ||
  { cat "$dir/log"; fail "killed rank: mpirun exit $rc"; }
grep -q "rank 1 .*signal 9" "$dir/log" || fail "killed rank: mpirun did not name rank 1"
for r in 0 1 2 3; do
  info=$("$CHECK" info "$dir/k.rank$r.h5") || { fail "killed rank: rank $r unreadable"; continue; }
  steps=$(echo "$info" | awk '{print $10}')
  if [ $r = 1 ]; then
    [ "$steps" -lt 20 ] && ok "killed rank 1: $info" || fail "killed rank 1: $info"
  else
    [ "$steps" = 20 ] && ok "survivor $r: $info" || fail "survivor $r: $info"
  fi
done

# ---- ranks started with different configurations (MPMD) ----------------------------
# one rank with another --steps waited for ever in an all-reduce; another
# scenario on one rank summed buffers of other lengths and said healthy, exit 0.
# Now every rank stops before training, exit 2, no trace left; recording
# options may differ (the killed-rank case above trains with them).
mismatch() { # name, then the second rank's extra arguments
  local name=$1; shift
  rm -f "$dir"/m.rank*.h5
  timeout 120 mpirun --oversubscribe \
    -np 1 "$AMPPROBE" run --scenario healthy-dp --steps 8 -o "$dir/m.h5" -q \
    : -np 1 "$AMPPROBE" run -o "$dir/m.h5" -q "$@" \
    : -np 1 "$AMPPROBE" run --scenario healthy-dp --steps 8 -o "$dir/m.h5" -q \
    >"$dir/out" 2>"$dir/err"
  local rc=$?
  local n
  n=$(grep -c "different configurations" "$dir/err")
  if [ $rc = 2 ] && [ "$n" = 1 ] && ! ls "$dir"/m.rank*.h5 >/dev/null 2>&1; then
    ok "$name: exit 2, $(grep "different configurations" "$dir/err" | cut -c1-110)"
  else
    cat "$dir/err"; fail "$name: exit $rc (124: hung), said $n times"
  fi
}
mismatch "one rank with --steps 5" --scenario healthy-dp --steps 5
mismatch "one rank with another scenario" --scenario healthy --steps 8
mismatch "one rank with another --lr" --scenario healthy-dp --steps 8 --lr 0.01
grep -q "steps 5 to 8" <(mismatch "steps named" --scenario healthy-dp --steps 5; cat "$dir/err") ||
  fail "the steps of the ranks are not named"

# ---- --ranks ---------------------------------------------------------------------
if "$AMPPROBE" run --ranks 2 --scenario healthy-dp --steps 5 -o "$dir/r.h5" \
    -q >"$dir/out" 2>"$dir/err"; then
  grep -q "running .*mpirun -np 2 .* run --scenario healthy-dp" "$dir/err" &&
    [ -s "$dir/r.rank0.h5" ] && [ -s "$dir/r.rank1.h5" ] &&
    ok "--ranks 2: $(head -1 "$dir/err")" || { cat "$dir/err"; fail "--ranks 2"; }
else
  cat "$dir/err"; fail "--ranks 2 failed"
fi
PATH=/nonexistent "$AMPPROBE" run --ranks 2 --steps 1 -o "$dir/n.h5" 2>"$dir/err"
rc=$?
[ $rc = 4 ] && grep -q "mpirun, which is not on PATH" "$dir/err" &&
  ok "--ranks without mpirun: exit 4, $(cat "$dir/err")" ||
  fail "--ranks without mpirun: exit $rc, $(cat "$dir/err")"

echo "mpi_smoke: $fails failure(s)"
[ $fails = 0 ]
