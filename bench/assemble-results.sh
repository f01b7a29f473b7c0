#!/usr/bin/env bash
# bench/assemble-results.sh - rebuilds bench/RESULTS.md from the per-area
# sections in bench/results/*.md (each written by the engineer who ran that
# benchmark) under the summary kept in bench/results/00-summary.md.
set -euo pipefail
cd "$(dirname "$0")"
{
  cat results/00-summary.md
  for f in results/*.md; do
    [ "$(basename "$f")" = 00-summary.md ] && continue
    echo
    echo "<!-- from bench/$f -->"
    # demote headings one level so each area is a section of this page
    sed -e 's/^#/##/' "$f"
  done
} > RESULTS.md
echo "wrote bench/RESULTS.md"
