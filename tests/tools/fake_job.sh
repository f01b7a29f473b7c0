#!/usr/bin/env bash
# tests/tools/fake_job.sh - a stand-in for a user's training script, for the
# tests of `ampprobe bisect -- COMMAND`: it obeys the variables bisect sets,
# as the ampprobe Python package does, by training a scenario of the zoo:
#   AMPPROBE_FP32=<kinds or globs>  -> run --fp32 LIST
#   AMPPROBE_PRECISION=fp32         -> run --precision fp32
#   AMPPROBE_PRECISION=fp16|bf16    -> run --precision P --fp32 LIST
#   AMPPROBE_TRACE=<path>           -> run -o PATH (the trace bisect judges)
#   AMPPROBE_SEED=<n>               -> run --seed N (unless MODE is noseed)
# and appends what it saw to $FAKE_JOB_LOG (one line per trial) when set.
#
# usage: fake_job.sh AMPPROBE_BINARY SCENARIO [MODE] [RUN OPTIONS...]
#   MODE: normal | noseed | notrace (writes no trace, exits 0) |
#         crash (writes no trace, exits 3) | fail-fp16 (exit 1 after a
#         healthy trace when not in FP32: a job that raises at the end)
set -u
BIN=$1 SC=$2 MODE=${3:-normal}
shift 2
[ $# -gt 0 ] && shift
if [ -n "${FAKE_JOB_LOG:-}" ]; then
  printf 'precision=%s fp32=%s seed=%s trace=%s fp32set=%s\n' \
    "${AMPPROBE_PRECISION-<unset>}" "${AMPPROBE_FP32-<unset>}" \
    "${AMPPROBE_SEED-<unset>}" "${AMPPROBE_TRACE-<unset>}" \
    "${AMPPROBE_FP32+yes}" >>"$FAKE_JOB_LOG"
fi
case "$MODE" in
  notrace) echo "training... done (no tracer attached)"; exit 0 ;;
  crash) echo "Traceback: RuntimeError: CUDA out of memory" >&2; exit 3 ;;
esac
args=(run --scenario "$SC" -q -o "${AMPPROBE_TRACE:?AMPPROBE_TRACE is not set}")
if [ "${AMPPROBE_PRECISION-}" = fp32 ]; then
  args+=(--precision fp32)
elif [ -n "${AMPPROBE_PRECISION-}" ]; then # fp16 or bf16 (bisect --precision)
  args+=(--precision "$AMPPROBE_PRECISION" --fp32 "${AMPPROBE_FP32-}")
else
  args+=(--fp32 "${AMPPROBE_FP32-}")
fi
if [ -n "${AMPPROBE_SEED-}" ] && [ "$MODE" != noseed ]; then
  args+=(--seed "$AMPPROBE_SEED")
fi
"$BIN" "${args[@]}" "$@" >/dev/null
rc=$?
if [ "$MODE" = fail-fp16 ] && [ "${AMPPROBE_PRECISION-}" != fp32 ]; then
  exit 1
fi
exit $rc
