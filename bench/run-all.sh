#!/usr/bin/env bash
# bench/run-all.sh BUILD_DIR - runs every benchmark program found built in
# BUILD_DIR (called by `make bench`). Add a line per benchmark below; one
# that is not built is reported and skipped.
set -u
build=${1:-build}
status=0

run() { # run NAME ARGS... : BUILD_DIR/bench/NAME
  local exe="$build/bench/$1"
  shift
  if [ -x "$exe" ]; then
    echo "== $(basename "$exe") $*"
    "$exe" "$@" || status=1
  else
    echo "== $(basename "$exe"): not built, skipped"
  fi
}

run bench_stats
run bench_stats --cold --min-kib 65536
run bench_stats --threads 2 --min-kib 65536
run bench_stats --short
run bench_stats_bound
run bench_probe
run bench_postmortem
# 64/256/1,024 synthetic ranks (writing the sets takes ~6 min the first time;
# they are kept in /tmp/ampprobe-bench-ranks)
run bench_postmortem_ranks
run bench_trainer
run bench_trainer --reps 9 --steps 300 --calls

# bisect on two-culprits, -j 1 and -j 2 (a script: it drives the ampprobe binary)
if [ -x "$build/tools/ampprobe" ]; then
  echo "== bisect.sh"
  bash "$(dirname "$0")/bisect.sh" "$build" || status=1
else
  echo "== bisect.sh: ampprobe not built, skipped"
fi

exit $status
