/*
 * tools/diffcore.h - the analysis behind `ampprobe diff A.h5 B.h5`: aligns
 * two traces of the same model and seed run under different precision
 * policies (A is usually FP16, B its FP32 baseline) by layer name, site and
 * step, and measures how far A drifts from B. Used by tools/diff.c (text and
 * the CLI) and by the report renderer (JSON via probe_diff_to_json).
 *
 * Definitions (docs/cli.md, "ampprobe diff"):
 *   rel(a, b)  = |a - b| / max(|a|, |b|), 0 when both are 0, 1 when exactly
 *                one side has no finite value. Symmetric, in [0, 1] for the
 *                non-negative absmax, RMS and L2 norm compared here.
 *   gradient sites (GRAD_OUT, GRAD_IN, WEIGHT_GRAD) hold scaled gradients;
 *                they are compared unscaled, divided by each run's loss
 *                scale at that step (steps table).
 *   per step, each (layer, site) gets rel of absmax, RMS and L2; the first
 *                step where any of the three exceeds the threshold is
 *                reported (first_exceed_step).
 *   a record diverges at a step when the mean of its relative RMS difference
 *                over the last W steps (W = window, default 10; steps before
 *                the first count as 0) exceeds the threshold (default 0.1),
 *                or when the fractions of exact zeros on the two sides
 *                differ by zero_frac_margin or more at that step (values
 *                underflowed to zero), or when exactly one side holds a
 *                non-finite value (scaled
 *                gradients that overflow on a step that side's loss scaler
 *                skipped are normal backoffs and do not count). RMS, not
 *                absmax: the absmax of a gradient is one element and jumps
 *                from step to step (healthy FP16 runs against FP32 show
 *                single-step absmax differences up to 0.4 and windowed RMS
 *                differences up to 0.05; see docs/cli.md).
 *   inputs of a record: FWD_IN and WEIGHT for forward outputs (FWD_OUT,
 *                FWD_SAVED); GRAD_OUT and the layer's forward sites for
 *                backward outputs (GRAD_IN, WEIGHT_GRAD); WEIGHT_GRAD for
 *                MASTER_WEIGHT. A layer with no input record at a step takes
 *                the previous output record of the same phase as its input.
 *   local error: the output diverges while its inputs did not (the error was
 *                introduced here); carried: its inputs diverged too.
 *   introduction point: at the first step where any record diverges, the
 *                earliest record in A's execution order that is a local
 *                divergence.
 * Memory: both traces are streamed in chunks in step order; what is held is
 * one step of records per side plus one accumulator per (layer, site).
 */
#ifndef AMPPROBE_TOOLS_DIFFCORE_H
#define AMPPROBE_TOOLS_DIFFCORE_H

#include <stdint.h>

#include <jansson.h>

#include "ampprobe/probe.h"

#ifdef __cplusplus
extern "C" {
#endif

#define PROBE_DIFF_DEFAULT_THRESHOLD 0.1
#define PROBE_DIFF_DEFAULT_WINDOW 10
#define PROBE_DIFF_MAX_WINDOW 256
#define PROBE_DIFF_TEXT_MAX 512
#define PROBE_DIFF_MAX_NOTES 16

typedef struct probe_diff_options {
  double threshold;  /* relative difference that counts as divergence */
  int window;        /* steps averaged for divergence (10), 1..256 */
  size_t chunk_rows; /* rows per chunked read (4096) */
  /* A record diverges when its fractions of zero values differ by at least
   * this much at a step, and a gradient site "flushes to zero" in A when
   * its overall zero fraction exceeds B's by this much (0.05 = 5 points). */
  double zero_frac_margin;
} probe_diff_options;

void probe_diff_options_init(probe_diff_options *o);

/* One aligned (layer, site) pair. */
typedef struct probe_diff_entry {
  char layer[PROBE_NAME_MAX];
  int32_t kind;           /* probe_kind */
  int32_t prec_a, prec_b; /* probe_precision in each trace */
  int32_t site;           /* probe_site */
  int64_t steps;          /* steps where both sides had the record */
  uint32_t first_seq;     /* execution order in A at the first such step */
  double max_rel_absmax, max_rel_rms, max_rel_l2;
  int64_t max_rel_step;   /* step of the largest of the three */
  double mean_rel_rms;    /* mean over steps of rel RMS */
  double max_window_rel;  /* largest windowed mean of rel RMS */
  int64_t first_exceed_step; /* first step any rel > threshold, -1 never */
  int64_t first_div_step; /* first step it diverges, -1 never */
  uint32_t first_div_seq;
  double first_div_rel;   /* windowed rel at that step (1 for non-finite) */
  double absmax_a_at_div, absmax_b_at_div;
  int64_t first_nonfinite_a, first_nonfinite_b; /* -1 never */
  int64_t local_steps;    /* diverging steps with inputs in agreement */
  int64_t carried_steps;  /* diverging steps with inputs diverging too */
  uint64_t count_a, zero_a, count_b, zero_b; /* values, exact zeros */
  int flushes_to_zero;    /* gradient site, zero fraction A >> B */
} probe_diff_entry;

typedef enum probe_diff_verdict {
  PROBE_DIFF_AGREE = 0,     /* within tolerance everywhere compared */
  PROBE_DIFF_DIVERGE = 1,   /* some record or the loss diverges */
  PROBE_DIFF_NOT_ALIGNED = 2 /* nothing to compare: no common layer/step */
} probe_diff_verdict;

typedef struct probe_diff_point {
  int found;
  int64_t step;
  char layer[PROBE_NAME_MAX];
  int32_t site;
  uint32_t seq;
  double rel;
  int local;    /* 1: inputs agreed (introduced here) */
  int nonfinite; /* one side non-finite */
  double zero_a, zero_b; /* fraction of exact zeros on each side there */
} probe_diff_point;

typedef struct probe_diff {
  probe_diff_options opt;
  /* ---- alignment */
  int64_t n_layers_a, n_layers_b, n_layers_common;
  char only_a[PROBE_DIFF_TEXT_MAX]; /* layer names, comma separated */
  char only_b[PROBE_DIFF_TEXT_MAX];
  int64_t steps_a, steps_b;         /* steps holding per-layer records */
  int64_t steps_common;
  int64_t first_common_step, last_common_step;
  int64_t last_step_a, last_step_b; /* from the steps tables */
  int64_t records_unmatched;        /* records present on one side only */
  int64_t scaler_overflow_records;  /* gradient records non-finite on a
                                       step the scaler skipped: ignored */
  int scaler_overflow_sides;        /* where those were: 1 A, 2 B, 3 both */
  int64_t trailing_skips_a;         /* steps skipped at the end of the
                                       steps table (a scaler that never */
  int64_t trailing_skips_b;         /* recovered when > 0) */
  int record_mode_a, record_mode_b;
  json_t *config_diff;  /* array of {key, a, b}: where the configs differ */
  int config_other;     /* differences beyond precision-policy keys */
  char policy_a[256], policy_b[256];
  int n_notes;
  char notes[PROBE_DIFF_MAX_NOTES][PROBE_DIFF_TEXT_MAX];

  /* ---- per (layer, site), sorted by where divergence begins */
  size_t n_entries;
  probe_diff_entry *entries;

  /* ---- divergence */
  int64_t first_div_step; /* -1 when none */
  probe_diff_point first_div;  /* earliest diverging record at that step */
  probe_diff_point intro;      /* the error introduction point */
  probe_diff_point first_nonfinite_a, first_nonfinite_b;

  /* ---- loss curves */
  int64_t loss_steps;         /* steps present in both steps tables */
  int64_t loss_part_step;     /* first step the windowed mean of the loss's
                                 rel exceeds the threshold, or finiteness
                                 differs; -1 never */
  double loss_a_at_part, loss_b_at_part;
  double max_loss_rel;        /* over finite pairs */
  double final_loss_a, final_loss_b; /* mean of the last <= 10 common steps */
  double final_loss_rel;
  int64_t first_nonfinite_loss_a, first_nonfinite_loss_b;

  probe_diff_verdict verdict;
  char verdict_text[1024];
} probe_diff;

/* Compares two open traces. PROBE_OK with d->verdict set, or a reader error
 * (d->notes[0] then says which side). */
probe_status probe_diff_run(probe_diff *d, probe_trace *a, probe_trace *b,
                            const probe_diff_options *opt);
void probe_diff_free(probe_diff *d);

/* The whole result as JSON (new reference). */
json_t *probe_diff_to_json(const probe_diff *d);

/* rel() as defined above. */
double probe_diff_rel(double a, double b);

#ifdef __cplusplus
}
#endif
#endif /* AMPPROBE_TOOLS_DIFFCORE_H */
