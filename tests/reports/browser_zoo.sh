#!/usr/bin/env bash
# tests/reports/browser_zoo.sh - renders the reports of two zoo scenarios
# (revin-overflow with its FP32 baseline, and healthy) in headless Chromium
# through browser_test.py. Exit 77 (skipped) without chromium.
# Usage: browser_zoo.sh AMPPROBE WORKDIR BROWSER_TEST.py
set -eu
AMP=$1
W=$2
BT=$3
rm -rf "$W" && mkdir -p "$W" && cd "$W"
"$AMP" run --scenario revin-overflow --trace -o fp16.h5 -q >/dev/null || true
"$AMP" run --scenario revin-overflow --precision fp32 --trace -o fp32.h5 -q >/dev/null
"$AMP" run --scenario healthy --trace -o healthy.h5 -q >/dev/null
"$AMP" report fp16.h5 --baseline fp32.h5 -o revin-overflow.html -q || [ $? -eq 1 ]
"$AMP" report healthy.h5 -o healthy.html -q
exec /usr/bin/python3 "$BT" revin-overflow.html healthy.html
