#!/usr/bin/env bash
# tests/tmp_clean.sh - runs a test program with TMPDIR set to a fresh
# folder and fails when it leaves anything there: a test run leaves /tmp
# as it found it (its files were left behind: NAME.h5, NAME.h5.bad.h5,
# ... of every run). The program's exit code otherwise (77 stays a skip).
#   tmp_clean.sh PROGRAM [ARGS...]
set -u
dir=$(mktemp -d "${TMPDIR:-/tmp}/ampprobe-tmpclean.XXXXXX") || exit 1
TMPDIR=$dir "$@"
rc=$?
left=$(cd "$dir" && ls -A | head -20 | tr '\n' ' ')
rm -rf "$dir"
if [ -n "$left" ]; then
  echo "FAIL: $(basename "$1") left in its TMPDIR: $left"
  [ "$rc" = 0 ] && rc=1
fi
exit "$rc"
