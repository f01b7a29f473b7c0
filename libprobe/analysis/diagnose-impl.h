/*
 * libprobe/analysis/diagnose-impl.h - what the post-mortem's passes
 * (diagnose.c) hand to its rules (diagnose_rules.c) and renderers
 * (diagnose_render.c). Internal.
 */
#ifndef AMPPROBE_DIAGNOSE_IMPL_H
#define AMPPROBE_DIAGNOSE_IMPL_H

#include <math.h>
#include <string.h>

#include "ampprobe/analysis.h"
#include "analysis-impl.h"

/* Named thresholds of the passes (the rules' own are in diagnose_rules.c);
 * docs/precision.md lists them all. */
/* A normalisation collapsed when its output's variance is below this
 * fraction of its weights' mean square (gamma ~ 1: an output that should
 * have variance ~1) while its input's variance is above it. */
#define PROBE_DIAG_COLLAPSE_VAR_FRAC 1e-3
/* The loss scale collapsed when the steps from some step to the end were
 * all skipped and this many or more came after a step the scaler did not
 * skip (it had found a scale that worked: a routine backoff skips one step,
 * two with hysteresis), or when every step was skipped (no optimizer step
 * was taken: the run did not train, however short). */
#define PROBE_DIAG_COLLAPSE_TRAILING_SKIPS 3
/* Data below resolution (docs/precision.md): FP32 values entering an
 * FP16/BF16 layer whose standard deviation is below this fraction of that
 * precision's spacing at their level (half an ulp: nearly every value
 * rounds to the same one or two neighbours), or whose range max - min is
 * below one spacing (then std <= range / 2 is below half of it, whatever
 * the sums' cancellation). */
#define PROBE_DIAG_RESOLUTION_STD_FRAC 0.5
/* ... on at least this fraction of the steps the rule could judge (one
 * narrow batch is no property of the data). */
#define PROBE_DIAG_RESOLUTION_STEP_FRAC 0.5

/* A finite loss that diverges (docs/precision.md, "A finite loss that
 * diverges"): the running median of the last W finite losses, W =
 * (losses / PROBE_DIAG_DIVERGE_WINDOW_DIV) clamped to
 * [PROBE_DIAG_DIVERGE_WINDOW_MIN, PROBE_DIAG_DIVERGE_WINDOW_MAX] (a median
 * of several steps: one noisy batch moves it little); judged when the
 * steps table holds at least 2 W finite losses, none below 0. The loss
 * diverged when the median at the last step is PROBE_DIAG_DIVERGE_FACTOR
 * times or more the lowest running median before it: not a warm-up that
 * doubles the loss, nor a loss that starts high and falls. */
#define PROBE_DIAG_DIVERGE_WINDOW_DIV 10
#define PROBE_DIAG_DIVERGE_WINDOW_MIN 5
#define PROBE_DIAG_DIVERGE_WINDOW_MAX 25
#define PROBE_DIAG_DIVERGE_FACTOR 10.0
/* The layer that grew first: the first (step, then activations before
 * gradients, then layer order) whose forward absmax, or gradient absmax
 * divided by the step's loss scale, passed this many times its largest up
 * to the step of the lowest median. */
#define PROBE_DIAG_DIVERGE_LAYER_GROWTH 10.0
/* A streak of skipped steps (docs/precision.md, "A streak of skipped
 * steps"): this many consecutive skipped steps after the first step the
 * scaler did not skip, ended by a step it did not skip (at the end of the
 * trace, PROBE_DIAG_COLLAPSE_TRAILING_SKIPS already make a collapse). A
 * routine growth probe skips one step (two with hysteresis); a warm-up's
 * backoffs come before the first clean step. */
#define PROBE_DIAG_SKIP_STREAK 10

/* Pass 1's trackers of the loss trend and of skip streaks
 * (diagnose_trend.c): init before the first row, one call per row of the
 * steps table in order, end after the last. */
typedef struct probe__loss_trend {
  int32_t w;                                  /* window; 0: not judged */
  double ring[PROBE_DIAG_DIVERGE_WINDOW_MAX]; /* last w finite losses */
  int64_t seen;                               /* finite losses so far */
  int negative;                               /* a loss below 0 */
  double lr;                                  /* the last measured lr */
  double first;                               /* the first window's median */
} probe__loss_trend;
void probe__diag_trend_init(probe__loss_trend *t, probe_diag *d);
void probe__diag_trend_row(probe__loss_trend *t, probe_diag *d,
                           const probe_step_scalars *r);
void probe__diag_trend_end(probe__loss_trend *t, probe_diag *d);

typedef struct probe__skip_streak {
  int clean_seen;          /* a step the scaler did not skip came before */
  int64_t start, last, len, loss_nf; /* the streak under way; len 0: none */
  double scale_from;
} probe__skip_streak;
void probe__diag_streak_init(probe__skip_streak *s, probe_diag *d);
void probe__diag_streak_row(probe__skip_streak *s, probe_diag *d,
                            const probe_step_scalars *r);

/* Pass 3's part: each layer's largest forward and unscaled gradient
 * absmax up to d->loss_best_step (base[2 li], base[2 li + 1]), then the
 * first to grow past PROBE_DIAG_DIVERGE_LAYER_GROWTH times it; fa, ba: the
 * layer's absmax at this step (NaN: none). */
void probe__diag_growth_layer(probe_diag *d, double *base, int32_t li,
                              int64_t step, double fa, double ba);

/* Weights that stop changing (docs/precision.md, "Weights that stop
 * changing"): a parameter (one master_weight record of a layer: the
 * weights as the optimizer step left them, in the format they are stored
 * in) is stopped at a step when its statistics are bit-identical to the
 * step before's (the record of step - 1: sparse records judge nothing)
 * while the step could have moved it - an lr > 0, the step not skipped
 * and found no inf, its gradient (the layer's weight_grad records of the
 * same element count) finite and nonzero - and lr * the gradient's
 * unscaled absmax is below PROBE_DIAG_STAG_UPDATE_ULPS spacings of the
 * weight format at the weights' absmax (the precision explains it; a
 * parameter no optimizer holds, with updates that would show, is not
 * this). It stopped when it was so for PROBE_DIAG_STAG_MIN_STEPS
 * consecutive steps or more and on PROBE_DIAG_STAG_MIN_FRAC of the steps
 * that could judge it; the finding wants the stopped elements to be
 * PROBE_DIAG_STAG_MIN_SHARE of all recorded weight elements. At most
 * PROBE_DIAG_STAG_PARAMS parameters of a layer are followed. */
#define PROBE_DIAG_STAG_MIN_STEPS 20
#define PROBE_DIAG_STAG_MIN_FRAC 0.5
#define PROBE_DIAG_STAG_MIN_SHARE 0.01
#define PROBE_DIAG_STAG_UPDATE_ULPS 1.0
#define PROBE_DIAG_STAG_PARAMS 8

/* A parameter's statistics compared from step to step (all but the
 * histogram, which sum and sumsq already pin). */
typedef struct probe__stag_sig {
  uint64_t count, nan, posinf, neginf, zero;
  float min, max, absmax, absmin_nonzero;
  double sum, sumsq;
} probe__stag_sig;

typedef struct probe__stag_param {
  int64_t prev_step;        /* the step of prev; -1 none */
  probe__stag_sig prev;
  int32_t dtype;            /* the format it is stored in */
  int64_t count;            /* elements */
  int64_t run, run_start;   /* the stopped steps under way */
  int64_t best, best_start; /* the longest run */
  int64_t eligible, stopped; /* steps that could judge it; stopped ones */
  double log_lr, log_g, log_w, log_h; /* sums of logs over stopped steps */
  int64_t nlog;             /* ...and their number */
} probe__stag_param;

/* Pass 3's tracker: one call per recorded step (records sorted by seq,
 * sc the step's scalars or NULL), then end. */
typedef struct probe__stag {
  int64_t n_layers;
  probe__stag_param *p; /* [n_layers * PROBE_DIAG_STAG_PARAMS] */
  int32_t *ord;         /* [n_layers]: master records seen in ord_step */
  int64_t *ord_step;    /* [n_layers] */
} probe__stag;
int probe__diag_stag_init(probe__stag *t, probe_diag *d);
void probe__diag_stag_step(probe__stag *t, const probe_record *r, size_t n,
                           int64_t step, const probe_step_scalars *sc);
void probe__diag_stag_end(probe__stag *t, probe_diag *d);
void probe__diag_stag_free(probe__stag *t);

/* The weights-stagnant finding's text (diagnose_trend.c): its rule's row
 * is in diagnose_rules.c's table. */
int probe__diag_stag_fires(const probe_diag *d);
void probe__diag_stag_explain(const probe_diag *d, probe_diag_finding *f);

/* Ranks the findings with the rules table and sets d->verdict. */
void probe__diag_rank(probe_diag *d);

/* Reads the stored run config (structured keys, docs/config.md) and the
 * stored command line's --config/--scenario argument into d->cfg_*. */
void probe__diag_read_config(probe_diag *d, const char *config_json,
                             const char *command_line);

/* Writes the post-mortem JSON document of d (diagnose_render.c) as the
 * member `key` of the open object (NULL: a top-level or array value). */
void probe__diag_json(probe__jw *w, const char *key, const probe_diag *d);

/* FP16 headroom of a magnitude: log2(65504 / absmax); +inf for 0, NaN for
 * a non-finite absmax. */
double probe__diag_headroom(double absmax);

/* How the passes and the rules name a layer's precision: "FP16", "BF16"
 * or "FP32". */
static inline const char *probe__diag_prec_label(int dtype) {
  return dtype == PROBE_DTYPE_BF16 ? "BF16" : dtype == PROBE_DTYPE_F32 ? "FP32" : "FP16";
}

/* The normalisations (BatchNorm, LayerNorm, RevIN): a variance, a sum of
 * squares, 1/sqrt of it. */
static inline int probe__diag_is_norm_kind(int k) {
  return k == PROBE_KIND_BN || k == PROBE_KIND_LAYERNORM || k == PROBE_KIND_REVIN;
}

/* The largest finite value of the range a layer's values are judged
 * against: BF16's for a BF16 layer (FP32's range), else FP16's (an FP32
 * layer's input came from the FP16 layers). */
#define PROBE__DIAG_BF16_MAX 3.3895313892515355e38 /* largest finite bfloat16 */
static inline double probe__diag_range_max(int dtype) {
  return dtype == PROBE_DTYPE_BF16 ? PROBE__DIAG_BF16_MAX : (double)PROBE_F16_MAX;
}

/* The reduced precision a layer's values are measured against (headroom,
 * flushing, what an overflow means): its own when it runs in FP16 or BF16;
 * for an FP32 layer the one its inputs came from - FP16 when any layer of
 * the run is FP16, else BF16 when some is, else FP16 (an FP32 run: how far
 * its values are from FP16's range). */
static inline int probe__diag_range_prec(const probe_diag *d, int32_t id) {
  if (id >= 0 && id < d->n_layers && d->layers &&
      d->layers[id].info.precision != PROBE_DTYPE_F32)
    return d->layers[id].info.precision == PROBE_DTYPE_BF16 ? PROBE_DTYPE_BF16
                                                           : PROBE_DTYPE_F16;
  int bf16 = 0;
  for (int64_t i = 0; d->layers && i < d->n_layers; i++) {
    if (d->layers[i].info.precision == PROBE_DTYPE_F16) return PROBE_DTYPE_F16;
    if (d->layers[i].info.precision == PROBE_DTYPE_BF16) bf16 = 1;
  }
  return bf16 ? PROBE_DTYPE_BF16 : PROBE_DTYPE_F16;
}

/* The headroom of a magnitude in a reduced precision: log2(MAX / absmax),
 * MAX 65504 (FP16, probe_fp16_headroom) or BF16's ~3.39e38; the same edge
 * cases (+inf for 0, NaN for NaN). */
static inline double probe__diag_headroom_in(double absmax, int dtype) {
  if (dtype != PROBE_DTYPE_BF16) return probe_fp16_headroom(absmax);
  if (isnan(absmax) || absmax < 0) return NAN;
  if (absmax == 0) return INFINITY;
  return log2(PROBE__DIAG_BF16_MAX / absmax);
}

/* How a weight-nonfinite event's evidence (d->event_evidence, written by
 * the walker's master_outgrew) opens when the weights the forward used were
 * non-finite while the FP32 masters the previous step's update left were
 * finite and their copy could not overflow: changed between the steps by
 * something other than the optimizer (explain_weights words its finding
 * from this opening; the "outgrew FP16" evidence opens otherwise). */
#define PROBE__DIAG_WEIGHTS_EDITED "changed outside the optimizer: "
static inline int probe__diag_weights_edited(const probe_diag *d) {
  return d->event == PROBE_DIAG_EVENT_WEIGHT_NONFINITE &&
         strncmp(d->event_evidence, PROBE__DIAG_WEIGHTS_EDITED,
                 sizeof PROBE__DIAG_WEIGHTS_EDITED - 1) == 0;
}

/* How a weight-nonfinite event's evidence opens when the first
 * non-finite record is a master_weight, taken after the step's optimizer
 * update, with every record before it in the step finite: the update made
 * it (diagnose.c, master_updated). */
#define PROBE__DIAG_WEIGHTS_UPDATED "made by the optimizer step: "
static inline int probe__diag_weights_updated(const probe_diag *d) {
  return d->event == PROBE_DIAG_EVENT_WEIGHT_NONFINITE &&
         strncmp(d->event_evidence, PROBE__DIAG_WEIGHTS_UPDATED,
                 sizeof PROBE__DIAG_WEIGHTS_UPDATED - 1) == 0;
}

/* How a gradient-overflow event's evidence opens when the overflow is the
 * cast of a finite gradient, recorded by the layer that handed it over,
 * at an FP16 layer's entry (grad_out; diagnose.c, handover_overflow): a
 * record covers the value, so it is no "code between modules". */
#define PROBE__DIAG_HANDOVER "overflowed at the hand-over: "
static inline int probe__diag_handover(const probe_diag *d) {
  return d->event == PROBE_DIAG_EVENT_GRAD_OVERFLOW &&
         strncmp(d->event_evidence, PROBE__DIAG_HANDOVER,
                 sizeof PROBE__DIAG_HANDOVER - 1) == 0;
}

/* How an overflow event's evidence opens when the values beyond FP16's
 * range are in the recorded input data (the input layer's fwd_out), not
 * made between modules (diagnose.c, classify_forward). */
#define PROBE__DIAG_RAW_INPUT "the input data holds values beyond FP16's range: "

/* Zeros of an input that the statistics alone show came from flushing in
 * FP16: values at or below 2^-25 in it, or subnormals beside the zeros. */
static inline int probe__diag_zeros_flushed(const probe_stats *in) {
  return in->f16_flush > 0 ||
         (in->zero_count > 0 && isfinite(in->absmin_nonzero) &&
          in->absmin_nonzero < PROBE_F16_MIN_NORMAL);
}

/* The event's one-line description: probe_diag_event_desc(d->event), but a
 * gradient overflow in a run without loss scaling is not of "scaled"
 * gradients. */
const char *probe__diag_event_text(const probe_diag *d);

#endif /* AMPPROBE_DIAGNOSE_IMPL_H */
