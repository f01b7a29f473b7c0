/*
 * tools/diagnose.h - the post-mortem analysis engine: reads a trace through
 * the chunked reader (memory bounded by the model size, never by the trace
 * length) and fills a probe_diag with the findings: the first non-finite
 * event and its origin layer, the kind of event, the loss scaler's story,
 * clipping, FP16 underflow of gradients, and a ranked diagnosis with
 * evidence and one next step each.
 *
 * Used by `ampprobe postmortem` and `ampprobe report`. Rendering is separate
 * (diagnose_render.c): text for people, JSON through jansson.
 */
#ifndef AMPPROBE_TOOLS_DIAGNOSE_H
#define AMPPROBE_TOOLS_DIAGNOSE_H

#include <stdint.h>
#include <stdio.h>

#include <jansson.h>

#include "ampprobe/probe.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Kinds of first non-finite event. */
#define DIAG_EVENT_MAP(XX)                                                     \
  XX(NONE, "none", "no non-finite value")                                      \
  XX(OVERFLOW, "overflow",                                                     \
     "finite values overflowed past the FP16 maximum 65504")                   \
  XX(REDUCTION_OVERFLOW, "reduction-overflow",                                 \
     "a reduction or saved intermediate overflowed while the input was "       \
     "finite")                                                                 \
  XX(UNDERFLOW_TO_INF, "underflow-to-inf",                                     \
     "values underflowed to zero and a log or division turned them into inf")  \
  XX(INF_ARITH_NAN, "inf-arithmetic-nan",                                      \
     "inf-inf or 0*inf produced NaN")                                          \
  XX(GRAD_OVERFLOW, "gradient-overflow",                                       \
     "scaled gradients overflowed FP16 in the backward pass")                  \
  XX(INPUT_NAN, "input-nan", "NaN or inf arrived in the input data")           \
  XX(WEIGHT_NONFINITE, "weight-nonfinite", "the weights hold NaN or inf")      \
  XX(LOSS_ONLY, "loss-nonfinite",                                              \
     "the loss was non-finite but no per-layer record shows where")

typedef enum diag_event {
#define DIAG_EVENT_ENUM_(name, str, desc) DIAG_EVENT_##name,
  DIAG_EVENT_MAP(DIAG_EVENT_ENUM_)
#undef DIAG_EVENT_ENUM_
      DIAG_EVENT_COUNT
} diag_event;

const char *diag_event_name(diag_event e);
const char *diag_event_desc(diag_event e);

/* Ranked findings. */
#define DIAG_FINDING_MAP(XX)                                                   \
  XX(HEALTHY, "healthy")                                                       \
  XX(FORCE_FP32, "force-fp32")                                                 \
  XX(ENABLE_LOSS_SCALING, "enable-loss-scaling")                               \
  XX(FIX_CLIP_ORDER, "fix-clip-order")                                         \
  XX(LOWER_LR, "lower-lr")                                                     \
  XX(CLEAN_INPUT, "clean-input")                                               \
  XX(CHECK_WEIGHTS, "check-weights")                                           \
  XX(SCALE_COLLAPSE, "scale-collapse")

typedef enum diag_finding_id {
#define DIAG_FINDING_ENUM_(name, str) DIAG_FINDING_##name,
  DIAG_FINDING_MAP(DIAG_FINDING_ENUM_)
#undef DIAG_FINDING_ENUM_
      DIAG_FINDING_COUNT
} diag_finding_id;

const char *diag_finding_name(diag_finding_id f);

#define DIAG_MAX_FINDINGS 8
#define DIAG_MAX_EVIDENCE 6
#define DIAG_TEXT_MAX 320
#define DIAG_MAX_PASSED 16
#define DIAG_MAX_BACKOFFS 8
#define DIAG_MAX_BACKOFF_LAYERS 6
#define DIAG_TIME_BUCKETS 10
#define DIAG_HISTORY_MAX 64

typedef struct diag_finding {
  diag_finding_id id;
  double score; /* higher ranks first */
  char title[DIAG_TEXT_MAX];
  int n_evidence;
  char evidence[DIAG_MAX_EVIDENCE][DIAG_TEXT_MAX];
  char next_step[DIAG_TEXT_MAX * 2];
} diag_finding;

/* One point of the origin layer's history before the event. */
typedef struct diag_history_point {
  int64_t step;
  double absmax;   /* largest finite |x| of the origin's output sites */
  double headroom; /* log2(65504 / absmax) */
} diag_history_point;

/* Per-layer totals (one per layer of the trace). */
typedef struct diag_layer {
  probe_layer_info info;
  double min_fwd_headroom; /* tightest FP16 headroom of forward outputs
                              (layers running in FP16; +inf otherwise) */
  int64_t min_fwd_headroom_step;
  /* Gradient sites (GRAD_IN, WEIGHT_GRAD): finite non-zero counts and
   * subnormal / flushed / zero counts, for the first and second half of
   * the recorded steps (index 0, 1). */
  uint64_t grad_count[2], grad_subnormal[2], grad_flush[2], grad_zero[2];
  /* (FP16 layers only; grad_subnormal includes the flushing values) */
  int64_t origin_steps;    /* steps in which this layer was the origin */
  int64_t backoff_steps;   /* backoff steps where its grads were non-finite */
  int64_t nonfinite_steps; /* steps with any non-finite record */
  uint64_t fwd_out_zero, fwd_out_count; /* forward-output zeros (underflow) */
} diag_layer;

typedef struct diag_backoff {
  int64_t step;
  double old_scale, new_scale;
  int n_layers;
  int32_t layers[DIAG_MAX_BACKOFF_LAYERS]; /* layer ids, execution order */
  int more_layers;                          /* count not listed */
} diag_backoff;

typedef struct probe_diag {
  /* ---- the trace */
  char path[512];
  int complete;
  int record_mode;
  int64_t n_steps, n_records, n_layers;
  int64_t first_step, last_step; /* of the steps table; -1 when empty */
  int64_t rec_first_step, rec_last_step; /* of per-layer records */
  int fp32_run; /* every layer ran in FP32 */
  char precision_policy[128];

  /* ---- losses */
  double first_loss, last_loss;
  double min_loss;
  int64_t first_nonfinite_loss_step; /* -1 if none */
  int64_t nonfinite_loss_steps;
  double loss_before_event; /* last finite loss before the event */
  double loss_rise; /* max over steps before the event of loss / (best loss
                       so far): how far the loss climbed back */

  /* ---- the first non-finite event */
  diag_event event;
  int64_t event_step;          /* -1 when none */
  probe_phase event_phase;
  int32_t origin_layer;        /* -1 when none */
  probe_site origin_site;
  probe_stats origin_out;      /* stats of the origin's non-finite output */
  int have_origin_in;
  probe_stats origin_in;       /* what flowed into it */
  int32_t feeder_layer;        /* layer whose output fed the origin, -1 */
  int n_passed;
  int32_t passed[DIAG_MAX_PASSED]; /* layers that passed it on */
  int more_passed;
  int32_t nan_from_inf_layer;  /* first layer making NaN out of inf, -1 */
  int n_history;
  diag_history_point history[DIAG_HISTORY_MAX]; /* oldest first */
  int64_t first_grad_overflow_step; /* first backward-only non-finite step */

  /* ---- loss scaler */
  int scaling_on;          /* a dynamic loss scaler ran */
  int scaling_from_config; /* scaling_on read from the trace's stored config
                              (else guessed: a scale other than 1 or a
                              scaler event) */
  double scale_first, scale_last, scale_min, scale_max;
  int64_t backoffs, growths, hysteresis_events, min_clamps;
  int64_t late_backoffs; /* after warm-up: the first clean step and at
                           least the first max(10, n/20) steps */
  int64_t skipped_steps, found_inf_steps;
  int64_t longest_skip_run, longest_skip_start;
  int64_t trailing_skip_run; /* skipped steps at the end of the trace */
  int scale_collapsed;
  int n_backoff_detail;
  diag_backoff backoff_detail[DIAG_MAX_BACKOFFS];

  /* ---- clipping */
  int clipping_on;
  double clip_threshold;
  int64_t clipped_steps, clip_steps_seen;
  double max_clip_ratio; /* grad_norm / threshold */
  int64_t max_clip_ratio_step;
  double bucket_ratio_mean[DIAG_TIME_BUCKETS];
  double bucket_ratio_max[DIAG_TIME_BUCKETS];
  int64_t bucket_n[DIAG_TIME_BUCKETS];
  int64_t bucket_first_step[DIAG_TIME_BUCKETS];
  double corr_norm_scale;   /* corr(log grad_norm, log loss_scale); NaN */
  double norm_over_scale;   /* geometric mean of grad_norm / loss_scale */
  double scale_log2_spread; /* std of log2(loss_scale) over those steps */
  double norm_log2_var;     /* var(log2 grad_norm) */
  double norm_resid_var;    /* var(log2 grad_norm - log2 loss_scale) */
  double clip_log2_ratio_mean; /* mean log2(grad_norm / threshold) */
  /* Steps whose grad_norm could be compared with the recorded (scaled)
   * weight gradients' norm (loss scale >= 4 away from 1), and of those the
   * steps where grad_norm was that scaled norm (pass 3). */
  int64_t clip_norm_steps, clip_norm_scaled_steps;
  int clip_scaled_signature; /* pass 1's correlation test, or pass 3's
                                comparison on >= 80% of >= 3 steps */

  /* ---- underflow: the layer with most gradient values lost */
  int32_t worst_underflow_layer;
  double worst_underflow_frac; /* (subnormal+flush+zero)/count, all steps */
  double total_grad_zero_frac;

  /* ---- growth of the weights (lr signature) */
  double master_absmax_first, master_absmax_last;

  /* ---- per layer */
  diag_layer *layers;

  /* ---- ranked diagnosis */
  int n_findings;
  diag_finding findings[DIAG_MAX_FINDINGS];
  char fp32_candidates[256]; /* "revin,softmax": kinds implicated */
} probe_diag;

typedef struct diag_options {
  int layer_history; /* points of the origin's absmax history (8) */
  size_t chunk_rows; /* rows per chunked read (4096) */
} diag_options;

void diag_options_init(diag_options *o);

/* Analyses an open trace. Returns PROBE_OK or the reader's error. */
probe_status probe_diag_run(probe_diag *d, probe_trace *t, const char *path,
                            const diag_options *opt);
void probe_diag_free(probe_diag *d);

/* Whether the run a config JSON describes (the text probe_train stores in
 * the trace, probe_trace_info.config_json) had dynamic loss scaling on:
 * 1 or 0, or -1 when the text is absent or does not say (no boolean
 * scaler.enabled). The trainer scales FP16 runs only. */
int diag_config_scaling(const char *config_json);

/* Name of a layer id ("?" when out of range). */
const char *diag_layer_name(const probe_diag *d, int32_t id);

/* 1 when the trace shows a problem (exit code 1 of postmortem). */
int probe_diag_problem(const probe_diag *d);

/* Renderers (diagnose_render.c). */
void probe_diag_print_text(const probe_diag *d, FILE *f);
json_t *probe_diag_to_json(const probe_diag *d);

#ifdef __cplusplus
}
#endif
#endif /* AMPPROBE_TOOLS_DIAGNOSE_H */
