/*
 * ampprobe/analysis.h - the analysis of traces as a library: the
 * post-mortem diagnosis, the comparison of two traces (diff) and delta
 * debugging (ddmin, the core of bisect). `ampprobe postmortem`, `diff`,
 * `bisect` and `report` are thin layers over these functions; a program or
 * the Python package calls them in-process. The library never prints and
 * never exits: every function returns a probe_status (ampprobe/status.h)
 * and fills plain structs; text and JSON renderings are made into malloc'd
 * buffers that the caller releases with probe_free(). An argument refused
 * (PROBE_ERR_INVALID_ARG: NULL, an option out of its range) leaves one
 * line naming it where probe_trace_last_error(NULL) finds it (per thread),
 * as a failed open does - except, for now, probe_diag_run and
 * probe_diag_render_*, whose refusals are NULL arguments only.
 *
 * Quick start (one call, the JSON document `ampprobe postmortem --json`
 * prints):
 *
 *   char *json = NULL;
 *   const char *paths[] = {"fp16.h5"};
 *   if (probe_postmortem_json(paths, 1, &json) == PROBE_OK) {
 *     puts(json);
 *     probe_free(json);
 *   }
 *
 * In C, with the structured result:
 *
 *   probe_trace *t; probe_diag d;
 *   probe_trace_open(&t, "fp16.h5");
 *   probe_diag_run(&d, t, "fp16.h5", NULL);
 *   printf("%s\n", probe_verdict_name(d.verdict));  // healthy/degraded/diverged
 *   probe_diag_free(&d); probe_trace_close(t);
 *
 * Verdicts (docs/precision.md): healthy (exit 0), degraded (exit 1: the loss
 * stayed finite but a forward intermediate held inf/NaN after warm-up, a
 * normalisation's output collapsed, or another problem was diagnosed),
 * diverged (exit 1: the loss went non-finite, the weights did, or the loss
 * scale collapsed).
 *
 * JSON conventions: numbers that are +inf, -inf or NaN are the strings
 * "inf", "-inf", "nan" (JSON has no such numbers); a value that does not
 * exist (no data) is null. Names read from files (layers, configs, paths)
 * are escaped with probe_text_escape() in every text and JSON output.
 *
 * Layer names: probe_diag_layer_name() and every name in the results are
 * the escaped display form; the raw name stays in layers[i].info.name.
 */
#ifndef AMPPROBE_ANALYSIS_H
#define AMPPROBE_ANALYSIS_H

#include <stddef.h>
#include <stdint.h>

#include "ampprobe/export.h"
#include "ampprobe/probe.h"
#include "ampprobe/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ==== shared ================================================================ */

/* Releases a buffer returned by this library (JSON or text renderings). */
AMPPROBE_API void probe_free(void *p);

/* Copies s into out (cap bytes, always NUL-terminated when cap > 0) with
 * every byte that could control a terminal made visible: \n \r \t \e \a
 * \b \f \v, a backslash as \\, C1 controls as \u0080..\u009f, the bidi
 * controls U+061C, U+200E, U+200F, U+202A..U+202E and U+2066..U+2069 (they
 * reorder the text after them) as \u202e, bytes that are not valid UTF-8
 * as \xHH. Printable ASCII and other valid UTF-8 pass unchanged. Returns the length the escaped text needs (as snprintf does),
 * so a caller can size its buffer: probe_text_escape(NULL, 0, s) + 1. A
 * buffer too short holds the longest prefix of whole units: never half an
 * escape or half a UTF-8 character. */
AMPPROBE_API size_t probe_text_escape(char *out, size_t cap, const char *s);
/* 1 when probe_text_escape would change s. */
AMPPROBE_API int probe_text_needs_escape(const char *s);

/* Copies s into out (cap bytes) as one word a POSIX shell reads back as s:
 * s as it is when it is not empty and holds only [A-Za-z0-9,._/=:+-], else
 * in single quotes, each ' written as '"'"' (as Python's shlex.quote: no
 * backslash, which probe_text_escape would double when the command is
 * shown). The one quoting of every command the tools print for a user to
 * paste, and of the command line a run stores in its trace (command_line,
 * read back by the post-mortem with the same rule). Returns the length the
 * quoted word needs (as snprintf does); a buffer too short gets "" (never
 * an unclosed quote). */
AMPPROBE_API size_t probe_shell_quote(char *out, size_t cap, const char *s);

/* x with `digits` significant digits ("%.*g"), or "nan", "inf", "-inf":
 * the one number format of the CLI's text outputs. */
AMPPROBE_API void probe_num_format(char *buf, size_t n, double x, int digits);

/* Verdict of a run (postmortem, run, bisect trials, report). */
typedef enum probe_verdict {
  PROBE_VERDICT_HEALTHY = 0,  /* nothing found; exit 0 */
  PROBE_VERDICT_DEGRADED = 1, /* finite loss, but a silent fault or another
                                 problem; exit 1 */
  PROBE_VERDICT_DIVERGED = 2  /* non-finite loss or weights, or the loss
                                 scale collapsed; exit 1 */
} probe_verdict;

/* "healthy", "degraded", "diverged" ("?" out of range). */
AMPPROBE_API const char *probe_verdict_name(probe_verdict v);

/* ==== post-mortem diagnosis ================================================= *
 *
 * Reads a trace through the chunked reader (memory bounded by the model
 * size, never by the trace length) and fills a probe_diag: the first
 * non-finite event and its origin layer, the kind of event, silent faults
 * (collapsed normalisations, forward inf/NaN with a finite loss), the loss
 * scaler's story, clipping, FP16 underflow of gradients, and a ranked
 * diagnosis made by a table of rules (docs/precision.md), each finding with
 * evidence and one next step.
 */

/* Kinds of first non-finite event. */
#define PROBE_DIAG_EVENT_MAP(XX)                                                     \
  XX(NONE, "none", "no non-finite value")                                      \
  XX(OVERFLOW, "overflow",                                                     \
     "finite values overflowed past the FP16 maximum 65504")                   \
  XX(REDUCTION_OVERFLOW, "reduction-overflow",                                 \
     "a reduction or saved intermediate overflowed while the input was "       \
     "finite")                                                                 \
  XX(UNDERFLOW_TO_INF, "underflow-to-inf",                                     \
     "values underflowed to zero and a log or division turned them into inf")  \
  XX(INF_ARITH_NAN, "inf-arithmetic-nan",                                      \
     "NaN and no inf: the op made it (0/0, inf-inf or 0*inf inside it, a "     \
     "sqrt or log of a negative value)")                                       \
  XX(GRAD_OVERFLOW, "gradient-overflow",                                       \
     "scaled gradients overflowed FP16 in the backward pass")                  \
  XX(INPUT_NAN, "input-nan", "NaN or inf arrived in the input data")           \
  XX(WEIGHT_NONFINITE, "weight-nonfinite", "the weights hold NaN or inf")      \
  XX(LOSS_ONLY, "loss-nonfinite",                                              \
     "the loss was non-finite while no per-layer record of that step held a "  \
     "non-finite value: the loss computation or a module not recorded made "   \
     "it")                                                                     \
  XX(ALLREDUCE, "allreduce-nonfinite",                                         \
     "the gradient all-reduce made or returned inf/NaN while this rank's "     \
     "gradients were finite: its bucket's cast to the all-reduce's dtype, "    \
     "another rank's value, or a sum that overflowed (FP16)")

typedef enum probe_diag_event {
#define PROBE_DIAG_EVENT_ENUM_(name, str, desc) PROBE_DIAG_EVENT_##name,
  PROBE_DIAG_EVENT_MAP(PROBE_DIAG_EVENT_ENUM_)
#undef PROBE_DIAG_EVENT_ENUM_
      PROBE_DIAG_EVENT_COUNT
} probe_diag_event;

/* The event kind's name ("overflow", ...) and a one-line description of it;
 * "?" for a value outside the enum. */
AMPPROBE_API const char *probe_diag_event_name(probe_diag_event e);
AMPPROBE_API const char *probe_diag_event_desc(probe_diag_event e);

/* Ranked findings. */
#define PROBE_DIAG_FINDING_MAP(XX)                                                   \
  XX(HEALTHY, "healthy")                                                       \
  XX(FORCE_FP32, "force-fp32")                                                 \
  XX(ENABLE_LOSS_SCALING, "enable-loss-scaling")                               \
  XX(FIX_CLIP_ORDER, "fix-clip-order")                                         \
  XX(LOWER_LR, "lower-lr")                                                     \
  XX(CLEAN_INPUT, "clean-input")                                               \
  XX(CHECK_WEIGHTS, "check-weights")                                           \
  XX(SCALE_COLLAPSE, "scale-collapse")                                         \
  XX(FIX_ALLREDUCE, "fix-allreduce")                                           \
  XX(NO_STEPS, "no-steps")                                                     \
  XX(NOT_PRECISION, "not-precision")                                           \
  XX(NOT_CLOSED, "not-closed")                                                 \
  XX(DATA_RESOLUTION, "data-resolution")                                       \
  XX(SKIP_STREAK, "skip-streak")                                               \
  XX(WEIGHTS_STAGNANT, "weights-stagnant")

typedef enum probe_diag_finding_id {
#define PROBE_DIAG_FINDING_ENUM_(name, str) PROBE_DIAG_FINDING_##name,
  PROBE_DIAG_FINDING_MAP(PROBE_DIAG_FINDING_ENUM_)
#undef PROBE_DIAG_FINDING_ENUM_
      PROBE_DIAG_FINDING_COUNT
} probe_diag_finding_id;

/* The finding's id as printed and in JSON ("force-fp32", ...); "?" for a
 * value outside the enum. */
AMPPROBE_API const char *probe_diag_finding_name(probe_diag_finding_id f);

#define PROBE_DIAG_MAX_FINDINGS 8
#define PROBE_DIAG_MAX_EVIDENCE 6
#define PROBE_DIAG_TEXT_MAX 320
#define PROBE_DIAG_MAX_PASSED 16
#define PROBE_DIAG_MAX_BACKOFFS 8
#define PROBE_DIAG_MAX_BACKOFF_LAYERS 6
#define PROBE_DIAG_TIME_BUCKETS 10
#define PROBE_DIAG_HISTORY_MAX 64

typedef struct probe_diag_finding {
  probe_diag_finding_id id;
  double score; /* higher ranks first */
  char title[PROBE_DIAG_TEXT_MAX];
  int n_evidence;
  char evidence[PROBE_DIAG_MAX_EVIDENCE][PROBE_DIAG_TEXT_MAX];
  char next_step[PROBE_DIAG_TEXT_MAX * 2];
  /* appended: 1 when the rule marks its own evidence weak (force-fp32 for
   * a custom module's NaN with no overflow or flush recorded:
   * probe_diag.origin_precision_weak), else 0 */
  int weak_evidence;
} probe_diag_finding;

/* One point of the origin layer's history before the event. */
typedef struct probe_diag_history_point {
  int64_t step;
  double absmax;   /* largest finite |x| of the origin's output sites */
  double headroom; /* log2(MAX / absmax), MAX the largest finite value of
                      the origin's reduced precision: 65504 for FP16,
                      ~3.39e38 for BF16 (an FP32 origin: the run's FP16,
                      else BF16) */
} probe_diag_history_point;

/* Per-layer totals (one per layer of the trace). */
/* Silent faults of a normalisation layer (bn, layernorm, revin) whose
 * loss stayed finite; docs/precision.md, "Silent faults". */
typedef struct probe_diag_collapse {
  int64_t steps;        /* steps after warm-up with the evidence below */
  int64_t first_step;   /* -1 none */
  /* the evidence at first_step: */
  int saved_inf;        /* its saved statistic held inf/NaN (a variance or
                           sum of squares that overflowed) */
  int saved_zero_rstd;  /* its saved 1/std held exact zeros: only an
                           infinite variance gives 1/sqrt(var) = 0 */
  uint64_t saved_zero;  /* saved variance values that are exactly 0 while
                           the input varies (precision lost) */
  uint64_t saved_count;
  double out_var, in_var; /* variance of the output / input tensors */
} probe_diag_collapse;

/* Data below the resolution of the precision it enters: the FP32 values
 * entering an FP16/BF16 layer (its fwd_in record) vary (max > min) but
 * their spread is below that precision's spacing at their level, so the
 * layer sees them as (nearly) constant; docs/precision.md, "Data below
 * resolution". Whole-tensor statistics only. */
typedef struct probe_diag_resolution {
  int64_t seen;         /* steps with an FP32 fwd_in the rule could judge */
  int64_t steps;        /* of those, steps below resolution */
  int64_t uncertain;    /* steps the sums' cancellation left undecided */
  int64_t first_step;   /* -1 none */
  /* the evidence at first_step: */
  double mean, std;     /* of the whole tensor (std from sum/sumsq) */
  double min, max;
  double level;         /* smallest magnitude the values reach (0 when
                           they straddle 0) */
  double spacing;       /* the precision's spacing at that level */
  int by_range;         /* decided by max - min < spacing (std unreliable) */
  int from_input;       /* the values are the input layer's fwd_out */
} probe_diag_resolution;

/* Per-layer totals (one per layer of the trace). */
typedef struct probe_diag_layer {
  probe_layer_info info; /* as stored in the trace (raw name) */
  char display[PROBE_NAME_MAX * 4]; /* the name escaped for output */
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
  int64_t fwd_nonfinite_steps; /* steps after warm-up with inf/NaN in its
                                  forward outputs or saved intermediates */
  int64_t fwd_nonfinite_first; /* first such step, -1 none */
  probe_diag_collapse collapse;
  /* steps whose whole incoming gradient (an FP32 layer's grad_in, every
   * nonzero value below FP16's smallest subnormal) flushed to zero at the
   * cast into this FP16 layer; its gradients' zeros then count as flushed
   * in grad_subnormal */
  int64_t entry_flush_steps;
  /* appended: data below resolution at this layer's entry */
  probe_diag_resolution resolution;
} probe_diag_layer;

typedef struct probe_diag_backoff {
  int64_t step;
  int min_clamp; /* 1: a min-scale clamp (Megatron), 0: a backoff */
  double old_scale, new_scale;
  int n_layers;
  int32_t layers[PROBE_DIAG_MAX_BACKOFF_LAYERS]; /* layer ids, execution order */
  int more_layers;                          /* count not listed */
} probe_diag_backoff;

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
  /* ---- the stored run config (structured, docs/config.md); -1 unknown */
  int cfg_found;             /* the trace holds a config that parses */
  char cfg_name[128];        /* "name", escaped */
  char cfg_source[256];      /* --config FILE / --scenario NAME to rerun */
  int64_t cfg_steps, cfg_seed; /* -1 unknown */
  char cfg_fp32[200];        /* "fp32" list, comma-separated, escaped */
  int cfg_clip_before_unscale; /* clip.before_unscale: 1, 0 or -1 */
  int cfg_loss_log;          /* "loss" is cross_entropy (a log): 1, else 0;
                                1 when the config does not say */
  int cfg_external;          /* written by another framework (the config's
                                "framework", e.g. "pytorch"): rerun with
                                its own command, cfg_command */
  char cfg_command[512];     /* that command, each word shell-quoted;
                                "YOUR TRAINING COMMAND" when it would
                                need escaping (it could not be pasted) */
  int64_t warmup_end;        /* first step after warm-up */

  /* ---- losses (steps whose loss was not measured are left out) */
  double first_loss, last_loss;
  int first_loss_seen;
  double min_loss;
  int64_t first_nonfinite_loss_step; /* -1 if none */
  int64_t nonfinite_loss_steps;
  double loss_before_event; /* last finite loss before the event */
  double loss_rise; /* max over steps before the event of loss / (best loss
                       so far): how far the loss climbed back */

  /* ---- the first non-finite event */
  probe_diag_event event;
  char event_evidence[PROBE_DIAG_TEXT_MAX]; /* why that kind (one sentence) */
  int64_t event_step;          /* -1 when none */
  probe_phase event_phase;
  int32_t origin_layer;        /* -1 when none */
  probe_site origin_site;
  probe_stats origin_out;      /* stats of the origin's non-finite output */
  int have_origin_in;
  probe_stats origin_in;       /* what flowed into it */
  int32_t feeder_layer;        /* layer whose output fed the origin, -1 */
  int n_passed;
  int32_t passed[PROBE_DIAG_MAX_PASSED]; /* layers that passed it on */
  int more_passed;
  int32_t nan_from_inf_layer;  /* first layer making NaN out of inf, -1 */
  int n_history;
  probe_diag_history_point history[PROBE_DIAG_HISTORY_MAX]; /* oldest first */
  int64_t first_grad_overflow_step; /* first backward-only non-finite step */
  int64_t unskipped_grad_overflow_step; /* first backward-only non-finite
                                           step the scaler did not skip, -1 */
  /* a backward inf of a custom module (kind other) at no more positions
   * than its forward values hold exact zeros, from a finite incoming
   * gradient: a division by those zeros, not an FP16 overflow
   * (docs/precision.md, "How an event is classified") */
  int origin_divides_zeros;
  uint64_t origin_fwd_zeros; /* those zeros (the record holding the most) */
  /* a NaN-only event (inf-arithmetic-nan) whose records rule out FP16/BF16
   * as its cause: nothing overflowed (finite inputs whose bound stays
   * below the range), nothing flushed, and its op makes that NaN in any
   * precision (docs/precision.md, "Not a precision problem"); the event's
   * evidence says which records showed it. 0: no such evidence. */
  int origin_not_precision;

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
  int64_t trailing_skip_start; /* the first of them, -1 when none */
  int scale_collapsed;
  int never_stepped; /* every step skipped: no optimizer step was taken */
  int n_backoff_detail;
  probe_diag_backoff backoff_detail[PROBE_DIAG_MAX_BACKOFFS];

  /* ---- clipping */
  int clipping_on;
  double clip_threshold;
  int64_t clipped_steps, clip_steps_seen;
  double max_clip_ratio; /* grad_norm / threshold */
  int64_t max_clip_ratio_step;
  double bucket_ratio_mean[PROBE_DIAG_TIME_BUCKETS];
  double bucket_ratio_max[PROBE_DIAG_TIME_BUCKETS];
  int64_t bucket_n[PROBE_DIAG_TIME_BUCKETS];
  int64_t bucket_first_step[PROBE_DIAG_TIME_BUCKETS];
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
  int clip_scaled_signature; /* the clipper saw scaled gradients: the
                                stored config says so, or pass 3's
                                comparison on >= 80% of >= 3 steps, or
                                (neither available) a strong correlation */
  int clip_order;            /* 1 clipped before unscaling, 0 after, -1
                                cannot tell */
  char clip_order_basis[PROBE_DIAG_TEXT_MAX]; /* the evidence, one sentence */

  /* ---- underflow: the layer with most gradient values lost */
  int32_t worst_underflow_layer;
  double worst_underflow_frac; /* (subnormal+flush+zero)/count, all steps */
  double total_grad_zero_frac;
  /* the first step at which the whole gradient handed from an FP32 layer
   * (the loss) to an FP16 one flushed to zero at the cast: those layers,
   * and that gradient's absmax; -1 when never */
  int64_t entry_flush_step;
  int32_t entry_flush_from, entry_flush_to;
  double entry_flush_absmax;

  /* ---- growth of the weights (lr signature): the largest |w| at the
   * first step and the last before the event, as the updates made it (a
   * jump between a step's master weights and the next forward's weights,
   * an edit outside the optimizer, is divided out) */
  double master_absmax_first, master_absmax_last;
  /* the first such edit: its step (-1 none), layer and factor */
  int64_t weights_edit_step;
  int32_t weights_edit_layer;
  double weights_edit_jump;
  /* the first learning-rate spike of the steps table: a step whose lr is
   * >= 4x the step before's and falls back by as much lr_spike_steps steps
   * later (-1 none); its largest lr and the lr before it */
  int64_t lr_spike_step, lr_spike_steps;
  double lr_spike, lr_spike_base;

  /* ---- per layer */
  probe_diag_layer *layers;

  /* ---- silent faults (finite loss): layers with collapse or forward
   * inf/NaN after warm-up; -1 none */
  int32_t silent_layer;     /* the first such layer in execution order */
  int64_t silent_layers;    /* how many layers */

  /* ---- ranked diagnosis */
  probe_verdict verdict;
  int n_findings;
  probe_diag_finding findings[PROBE_DIAG_MAX_FINDINGS];
  char fp32_candidates[256]; /* "revin,softmax": kinds implicated */
  /* appended: the rank left the loop by joining after last_step
   * (probe_trace_info.joined: uneven inputs, DDP's join()) */
  int joined;
  /* appended: the first layer (execution order) whose FP32 input was below
   * its precision's resolution on at least PROBE_DIAG_RESOLUTION_STEP_FRAC
   * of the steps judged; -1 none */
  int32_t resolution_layer;
  /* appended: which call of its layer the origin was, 1-based in the
   * order of the event's phase (the backward runs a module's calls last
   * first), and how many calls that layer made in that phase of the step,
   * as its records tell them (docs/precision.md, "A module called more
   * than once"); 0 and 0 when there is no origin layer */
  int32_t origin_call, origin_calls;
  /* the same for the feeder's record (0 and 0: no feeder). feeder_layer ==
   * origin_layer: an earlier call of the origin's own module fed it */
  int32_t feeder_call, feeder_calls;
  /* appended: the abort mark (probe_trace_info.aborted), escaped with
   * probe_text_escape: "" when the job did not mark an abnormal end; else
   * what ended it, the trace closed by its writer with complete 0 (the
   * finding not-closed says so). aborted_step: the step in progress at
   * the mark, closed half done; -1 none. */
  char aborted[4 * 256];
  int64_t aborted_step;
  /* appended: the loss's trend (docs/precision.md, "A finite loss that
   * diverges"): the running median of the last loss_window finite losses
   * of the steps table; its lowest value (the window ending at
   * loss_best_step), the first step after it whose median passed
   * PROBE_DIAG_DIVERGE_FACTOR times that, and its value at the last step.
   * loss_window is 0 when the rule could not judge (too few losses, or a
   * loss below 0: a ratio of losses means nothing then). */
  int32_t loss_window;
  int loss_diverged;         /* last / best >= PROBE_DIAG_DIVERGE_FACTOR,
                                every loss finite */
  int64_t loss_best_step, loss_rise_step; /* -1 none */
  double loss_best_median, loss_last_median, loss_growth; /* NaN none */
  double loss_best_lr, loss_last_lr; /* the learning rate at those steps
                                        (the last measured), NaN none */
  /* the first layer (earliest step, then execution order) whose forward
   * absmax or unscaled gradient absmax passed
   * PROBE_DIAG_DIVERGE_LAYER_GROWTH times its largest up to
   * loss_best_step, after it; -1 none (or no divergence) */
  int32_t diverge_layer;
  int diverge_layer_bwd;     /* 1: its gradients grew, 0: its activations */
  int64_t diverge_layer_step;
  double diverge_layer_growth;
  /* appended: the longest streak of skipped steps after the first step
   * the scaler did not skip that ended before the trace did (a streak at
   * the end is scale-collapse's), when it held at least
   * PROBE_DIAG_SKIP_STREAK steps (docs/precision.md, "A streak of skipped
   * steps"): its first and last step (-1 none), length, the scale at its first step
   * and at the step after it, and its steps with a non-finite loss;
   * skip_streaks counts such streaks. skip_streak_layer: the layer with
   * non-finite gradients in most of its steps (-1 none recorded). */
  int64_t skip_streak_start, skip_streak_end, skip_streak_len;
  int64_t skip_streak_loss_nf;
  double skip_streak_scale_from, skip_streak_scale_to;
  int64_t skip_streaks;
  int32_t skip_streak_layer;
  int64_t skip_streak_layer_steps;
  /* appended: a NaN-only event in a module of kind other (a custom module
   * the tracer cannot classify) running in FP16/BF16 whose records show
   * neither an overflow nor a flush (its inputs finite, in range, no
   * flushed zeros) and nothing else rules the precision in or out: the
   * force-fp32 finding says its evidence is weak and ranks lower
   * (docs/precision.md, "Not a precision problem"). */
  int origin_precision_weak;
  /* appended: a call records one input (fwd_in; backward: grad_out) per
   * tensor argument, in argument order. origin_in is the one of the
   * origin call that the analysis read (docs/precision.md, "A module
   * called with several inputs": a non-finite one first, then one beyond
   * FP16's range or with flushed zeros, then the largest), origin_in_index
   * its 1-based place among them and origin_in_count how many the call
   * recorded; for an origin that is an input record, its own place. 0 and
   * 0 when not known (no origin layer, a record that is no part of a call,
   * a call with no input recorded). */
  int32_t origin_in_index, origin_in_count;
  /* appended: the largest output magnitude the origin's recorded inputs
   * allow (a Linear's or attention's ||W||_F * (||x||_F + 1), a
   * normalisation's absmax(x)^2), the bound the forward event's evidence
   * quotes; 0 or NaN when there is none (no weight record, a backward
   * event). A BF16 overflow with a bound within FP32's range is the one
   * FP32 would hold (docs/precision.md, "BF16"). */
  double origin_bound;
  /* appended: weights that stopped changing (docs/precision.md, "Weights
   * that stop changing"): parameters (master_weight records) whose
   * statistics were bit-identical from one recorded step to the next for
   * PROBE_DIAG_STAG_MIN_STEPS consecutive steps or more, and on at least
   * PROBE_DIAG_STAG_MIN_FRAC of the steps that could judge them, while the
   * lr was > 0, the step not skipped, their gradient finite and nonzero
   * and lr * its absmax below PROBE_DIAG_STAG_UPDATE_ULPS spacings of the
   * weight format at their absmax. stag_judged: some step could judge a
   * parameter; stag_layers 0: none stopped. stag_layer: the layer with the
   * most such elements (-1 none), stag_dtype the format it stores them in;
   * stag_first_step the earliest step a stopped run began (-1 none),
   * stag_longest the longest run; stag_lr, stag_grad_rms (unscaled),
   * stag_weight_rms, stag_half_ulp (half the spacing at that rms) and
   * stag_ratio (lr * grad rms / stag_half_ulp) are geometric means over
   * the stopped steps (NaN none). */
  int stag_judged;
  int32_t stag_layers, stag_params;
  int64_t stag_elems, stag_total_elems;
  int64_t stag_first_step, stag_longest;
  int32_t stag_layer;
  int32_t stag_dtype;
  double stag_lr, stag_grad_rms, stag_weight_rms, stag_half_ulp, stag_ratio;
} probe_diag;

/* The most rows one chunked read of the analysis takes; a larger
 * chunk_rows is taken as this. */
#define PROBE_CHUNK_ROWS_MAX ((size_t)1 << 20)

typedef struct probe_diag_options {
  int layer_history; /* points of the origin's absmax history (8) */
  size_t chunk_rows; /* rows per chunked read (4096; 0: 4096; at most
                        PROBE_CHUNK_ROWS_MAX) */
} probe_diag_options;

/* Fills o with the defaults (the ones `ampprobe postmortem` uses). */
AMPPROBE_API void probe_diag_options_init(probe_diag_options *o);

/* Analyses an open trace. Returns PROBE_OK or the reader's error (the
 * message in probe_trace_last_error(t)). Every row of every table is read
 * and checked - the kernels and snapshots, which the diagnosis does not
 * use, too (once per handle; a handle of probe_trace_open_isolated was
 * read by its child) - so a trace the isolated open refuses is refused
 * here, with the same status and message. */
AMPPROBE_API probe_status probe_diag_run(probe_diag *d, probe_trace *t, const char *path,
                            const probe_diag_options *opt);
/* probe_diag_run, telling fn (may be NULL: the same as probe_diag_run)
 * how far its passes have read, phase PROBE_PROGRESS_ANALYSING
 * (probe_progress_fn, probe.h): once with done 0 before the first read,
 * then after each chunk of opt->chunk_rows rows; total is the rows the
 * passes read (the steps, the scaler events twice, the records), and the
 * last call of a run that succeeds has done == total. A non-zero return
 * stops the run at that chunk: PROBE_ERR_INTERRUPTED, *d as after a
 * failed read (free it with probe_diag_free). */
AMPPROBE_API probe_status probe_diag_run_progress(probe_diag *d, probe_trace *t,
                                                  const char *path,
                                                  const probe_diag_options *opt,
                                                  probe_progress_fn fn,
                                                  void *user);
AMPPROBE_API void probe_diag_free(probe_diag *d);

/* (internal, for tests) Whether the run a config JSON describes (the text probe_train stores in
 * the trace, probe_trace_info.config_json) had dynamic loss scaling on:
 * 1 or 0, or -1 when the text is absent or does not say (no boolean
 * scaler.enabled). The trainer scales FP16 runs only. */
AMPPROBE_API int probe_diag_config_scaling(const char *config_json);

/* Name of a layer id ("?" when out of range). */
AMPPROBE_API const char *probe_diag_layer_name(const probe_diag *d, int32_t id);

/* 1 when the verdict is not healthy (exit code 1 of postmortem). */
AMPPROBE_API int probe_diag_problem(const probe_diag *d);


/* Text report (what `ampprobe postmortem` prints) and the JSON document
 * (what `ampprobe postmortem --json` prints), malloc'd; free with
 * probe_free. PROBE_ERR_NOMEM when memory runs out. */
AMPPROBE_API probe_status probe_diag_render_text(const probe_diag *d,
                                                 char **text_out);
AMPPROBE_API probe_status probe_diag_render_json(const probe_diag *d,
                                                 char **json_out);

/* Opens each trace, diagnoses it and returns the JSON document: for one
 * path exactly what `ampprobe postmortem --json PATH` prints; for several
 * (the ranks of one job) the cross-rank document of probe_ranks_run /
 * probe_ranks_render_json (a rank file that cannot be read is part of
 * that document, not an error). Several traces none of which has a rank
 * attribute (independent runs) give {"verdict": worst, "traces":
 * [document, ...]} as before. On an open or read error of a single trace
 * (or of every file of a set) *json_out is NULL and the status says why
 * (probe_trace_last_error(NULL) has the message of a failed open or read,
 * the same as the _isolated variant's, or why a set was refused:
 * probe_ranks.error). */
AMPPROBE_API probe_status probe_postmortem_json(const char *const *paths,
                                                size_t n_paths,
                                                char **json_out);

/* The verdict alone (what `ampprobe run` and bisect's trials need): opens
 * and diagnoses the trace at path. */
AMPPROBE_API probe_status probe_postmortem_verdict(const char *path,
                                                   probe_verdict *out);

/* The same two, each trace first read in a child process
 * (probe_trace_open_isolated; a set's rank files through one worker
 * process), so that a malformed file on which HDF5 crashes or hangs is
 * PROBE_ERR_CORRUPT instead of killing the caller. They fork: for callers
 * that accept it (the Python package, tools). */
AMPPROBE_API probe_status probe_postmortem_json_isolated(const char *const *paths,
                                                         size_t n_paths,
                                                         char **json_out);
AMPPROBE_API probe_status probe_postmortem_verdict_isolated(const char *path,
                                                            probe_verdict *out);

/* probe_postmortem_json(_isolated) for paths that are a set: the files a
 * directory or a glob held (probe_trace_set_expand). The one difference:
 * a set of one rank file of a job of several ranks gets the cross-rank
 * document, which names the ranks that are missing, as `ampprobe
 * postmortem DIR` prints it; probe_postmortem_json gives a file named
 * alone the one-process document. */
AMPPROBE_API probe_status probe_postmortem_set_json(const char *const *paths,
                                                    size_t n_paths,
                                                    char **json_out);
AMPPROBE_API probe_status probe_postmortem_set_json_isolated(
    const char *const *paths, size_t n_paths, char **json_out);

/* ==== cross-rank post-mortem (the rank files of one job) ====================
 *
 * A data-parallel job writes one trace per rank (probe_options.rank,
 * world_size, run_id; docs/trace-format.md). probe_ranks_run reads the set
 * and says where the first non-finite value appeared across ranks, and how
 * it spread:
 *
 *   first     the earliest non-finite record of any rank (a step whose
 *             only non-finite values are gradients and that the loss scaler
 *             skipped is a normal backoff, not an event), ordered by
 *             (step, phase, seq); a step with a non-finite loss - the
 *             job's mean, so any rank's - is never a routine backoff;
 *             ties (several ranks at the same point)
 *             go to the lowest rank and every tied rank is "born";
 *   origin    each rank's own first non-finite record (by step, phase,
 *             seq): a GRAD_POST_ALLREDUCE record means the rank received it
 *             through the all-reduce ("carried", at that step or later:
 *             what it sent into that bucket earlier in the step was finite,
 *             or a non-finite GRAD_PRE_ALLREDUCE / WEIGHT_GRAD record would
 *             have come first); a GRAD_PRE_ALLREDUCE record first means its
 *             finite gradients overflowed when cast to the all-reduce's
 *             dtype ("cast"); a rank whose own non-finite values at the
 *             first step are gradients only, while another rank's forward
 *             was non-finite and the all-reduce brought this one a
 *             non-finite value, was reached by it ("carried": its own
 *             overflow there is the scaler's routine); any other site at
 *             the first step means it was born on that rank ("born"; a
 *             rank whose own first comes at a later step is "later"). Born
 *             on no rank: the all-reduce itself made it (a cast or an FP16
 *             sum of finite values overflowed) - or, when ranks could not
 *             be read, most likely one of those;
 *   disagreements  steps where the loss scale, the skipped flag or the
 *             weight digest differ between ranks (never in a correct DDP
 *             job), each compared with the first rank read that has the step;
 *   faults    ranks that world_size says exist but no file covers
 *             (missing), files that cannot be read (reported, the rest
 *             diagnosed), traces not closed (a killed rank: which stopped
 *             first, with the fewest steps).
 *
 * Cost: each file is opened once and only its steps table and the records
 * of its first non-finite step (found by a search on the step column, the
 * trace's /meta/state knows the step) are read; the merge holds one row per
 * step and a small entry per rank (no per-layer data per rank), so memory
 * does not grow with the number of ranks beyond that entry (bench/RESULTS.md:
 * 1,024 ranks). The full single-trace post-mortem (probe_diag_run) then runs
 * on one rank, the focus: the first rank the value was born on (else the
 * first it was carried to, else the first rank read).
 *
 * A file without a rank attribute (rank -1) cannot be part of a set of more
 * than one; files with different run ids, or two files of the same rank,
 * are refused (PROBE_ERR_INVALID_ARG; probe_ranks.error says which).
 */

typedef enum probe_rank_status {
  PROBE_RANK_READ = 0,      /* its file was read */
  PROBE_RANK_MISSING = 1,   /* world_size says it exists; no file is it */
  PROBE_RANK_UNREADABLE = 2 /* its file could not be opened or read */
} probe_rank_status;

/* How a rank's first non-finite record relates to the set's first. */
typedef enum probe_rank_role {
  PROBE_RANK_ROLE_NONE = 0,    /* no non-finite record */
  PROBE_RANK_ROLE_BORN = 1,    /* at the set's first step, before (or
                                  without) the all-reduce: born here */
  PROBE_RANK_ROLE_CARRIED = 2, /* a GRAD_POST_ALLREDUCE record: finite
                                  before the all-reduce, non-finite after */
  PROBE_RANK_ROLE_LATER = 3,   /* its own (not from the all-reduce), at a
                                  later step */
  PROBE_RANK_ROLE_CAST = 4     /* a GRAD_PRE_ALLREDUCE record first: its
                                  gradients were finite, its all-reduce
                                  bucket (cast to the all-reduce's dtype)
                                  was not: born in the all-reduce */
} probe_rank_role;

typedef enum probe_ranks_origin {
  PROBE_RANKS_ORIGIN_NONE = 0,      /* no non-finite value on any rank */
  PROBE_RANKS_ORIGIN_RANK = 1,      /* born on one rank (or several) */
  PROBE_RANKS_ORIGIN_ALLREDUCE = 2, /* born in the all-reduce */
  PROBE_RANKS_ORIGIN_LOSS_ONLY = 3  /* a non-finite loss, no per-layer
                                       record shows where */
} probe_ranks_origin;

/* "none", "rank", "allreduce", "loss-only". */
AMPPROBE_API const char *probe_ranks_origin_name(probe_ranks_origin o);

/* One rank (read, missing or unreadable). */
typedef struct probe_rank_entry {
  int32_t rank;          /* from the file; for an unreadable file the
                            number after the last "rank" in its file name
                            (the naming rule's "t.rank3.h5"), else -1 */
  int rank_from_name;    /* 1: rank guessed from the file name so */
  int32_t status;        /* probe_rank_status */
  char *path;            /* as given (raw: escape it for output); NULL for
                            a missing rank */
  char *error;           /* unreadable: why, one line (raw); else NULL */
  int32_t error_status;  /* unreadable: the probe_status */
  int complete;          /* the writer closed the file */
  int32_t world_size;    /* as the file says */
  int64_t n_steps, last_step; /* rows of /steps; last step recorded, -1 */
  int64_t first_nonfinite_loss_step; /* -1 none */
  int64_t skipped_steps;
  /* its first non-finite record by (step, phase, seq); nf_step -1 none */
  int64_t nf_step;
  int32_t nf_phase, nf_site, nf_layer;
  uint32_t nf_seq;
  char nf_layer_name[PROBE_NAME_MAX * 4]; /* escaped */
  int pre_nonfinite;     /* a GRAD_PRE_ALLREDUCE record non-finite at
                            nf_step (0 when that step was a backoff) */
  /* Normal scaler backoffs before nf_step (only gradients non-finite, on a
   * step the loss scaler skipped): not events, as in the single-trace
   * post-mortem; counted, and the first one's step and site kept. */
  int64_t backoff_nonfinite_steps;
  int64_t first_backoff_step;  /* -1 none */
  int32_t first_backoff_site, first_backoff_phase, first_backoff_layer;
  uint32_t first_backoff_seq;
  char first_backoff_layer_name[PROBE_NAME_MAX * 4]; /* escaped */
  int post_records;      /* records of GRAD_POST_ALLREDUCE seen at nf_step */
  int32_t role;          /* probe_rank_role at the set's first step */
  int nf_forward;        /* a non-finite record outside the backward at
                            nf_step (its own forward or optimizer) */
  int nf_post;           /* bits at nf_step: 1 a GRAD_POST_ALLREDUCE record
                            non-finite (the all-reduce brought one); 2 one
                            of them holds NaN */
  int first_backoff_post; /* the same at first_backoff_step */
  /* appended: its trace carries the join mark (probe_session_mark_joined:
   * the rank ran out of inputs and joined the others after last_step). A
   * joined rank whose trace is closed did not end early; one not closed
   * is still a rank that stopped (killed after joining). */
  int joined;
  /* appended: its trace's abort mark (probe_trace_info.aborted), escaped
   * with probe_text_escape: "" when the job did not mark an abnormal end;
   * else what ended it ("signal SIGTERM"), the trace closed by its writer
   * with complete 0 (so the rank counts as not closed). aborted_step: the
   * step in progress at the mark, closed half done; -1 none. */
  char aborted[4 * PROBE_ABORT_REASON_MAX];
  int64_t aborted_step;
} probe_rank_entry;

/* Per-step values every rank of a DDP job must agree on. */
typedef enum probe_ranks_field {
  PROBE_RANKS_LOSS_SCALE = 0,
  PROBE_RANKS_SKIPPED = 1,
  PROBE_RANKS_WEIGHT_DIGEST = 2,
  PROBE_RANKS_FIELD_COUNT
} probe_ranks_field;

/* "loss_scale", "skipped", "weight_digest". */
AMPPROBE_API const char *probe_ranks_field_name(probe_ranks_field f);

typedef struct probe_ranks_disagreement {
  int found;
  int64_t step;           /* the first step where two ranks differ */
  int32_t rank_a, rank_b; /* rank_a: the reference (the first rank read
                             that has the step), rank_b: the lowest rank
                             that differs from it there */
  double value_a, value_b;   /* loss scale, or skipped as 0/1 */
  uint64_t digest_a, digest_b; /* weight digest */
  int64_t ranks_differing;   /* ranks differing from the reference at some
                                step */
  int64_t steps_compared;    /* (rank, step) pairs compared */
} probe_ranks_disagreement;

#define PROBE_RANKS_TEXT_MAX 1024

typedef struct probe_ranks_options {
  probe_diag_options diag; /* for the focus rank's post-mortem */
  int isolate;      /* 1: read the files in a forked worker process (one
                       for the whole set), so that a crash or hang inside
                       HDF5 on a malformed file marks that rank unreadable
                       (a new worker goes on with the next file) instead of
                       killing the caller; the focus rank is opened with
                       probe_trace_open_isolated. The CLI sets it. (0) */
  int focus_diag;   /* run the full post-mortem on the focus rank (1) */
} probe_ranks_options;

/* Fills o with the defaults. */
AMPPROBE_API void probe_ranks_options_init(probe_ranks_options *o);

typedef struct probe_ranks {
  char run_id[PROBE_NAME_MAX * 4]; /* escaped; "" when none */
  int32_t world_size;  /* the largest any file states */
  size_t n_files;
  /* read and unreadable files, then missing ranks, sorted by rank (an
   * unreadable file, whose rank is unknown, after the ranks) */
  size_t n_entries;
  probe_rank_entry *entries;
  int64_t n_read, n_missing, n_unreadable, n_incomplete;

  /* ---- the first non-finite record over all ranks */
  int32_t first;           /* entry index, -1 none */
  probe_ranks_origin origin;
  int64_t event_step;      /* the step of `first` (or of the first
                              non-finite loss for LOSS_ONLY), -1 none */
  int64_t n_born, n_carried, n_later, n_unreached; /* ranks per role
                                          (unreached: read ranks with no
                                          non-finite record) */
  int64_t carried_first_step, carried_last_step; /* steps at which the
                                          carried ranks got it, -1 none */
  int32_t first_loss;      /* entry with the earliest non-finite loss, -1 */

  /* ---- a killed rank: the incomplete trace with the fewest steps (when
   * every rank read stopped at the same step, the first of them:
   * probe_ranks_stopped_tie says so, and which stopped first cannot be
   * told) */
  int32_t stopped_first;   /* entry index, -1 when every trace is complete */
  int64_t max_last_step;   /* the furthest any rank got */

  probe_ranks_disagreement disagree[PROBE_RANKS_FIELD_COUNT];
  int n_disagreements;

  /* ---- the full post-mortem of one rank */
  int32_t focus;           /* entry index, -1 none */
  probe_status focus_status; /* of its open/diagnosis (PROBE_OK) */
  probe_diag *focus_diag;  /* NULL when not run or failed */

  probe_verdict verdict;   /* the focus rank's, raised to degraded by a
                              disagreement, an event on any rank, or a
                              missing, unreadable or killed rank, and to
                              diverged by a non-finite loss on any rank */
  char origin_text[PROBE_RANKS_TEXT_MAX]; /* one sentence, escaped */
  char fix_text[PROBE_DIAG_TEXT_MAX * 2]; /* the next step, or "" */
  char error[PROBE_RANKS_TEXT_MAX];       /* why a set was refused */
  int unranked; /* refused because a file has no rank attribute */
  int origin_uncertain; /* an origin was found among the ranks read while
                           some rank is missing or unreadable: the value
                           may have been born on one of those */
  int64_t n_cast;       /* ranks of role CAST (their all-reduce bucket
                           non-finite first) */
  int64_t n_ended_early; /* ranks that closed their trace before the
                            furthest rank's last step (an exception, an
                            early exit: they did not crash), without the
                            join mark (those are n_joined) */
  int32_t ended_early;   /* entry index of the one that ended first, -1 */
  int64_t n_read_whole;  /* of the ranks read, those read whole, every row
                            checked: the focus rank when isolate is set (its
                            probe_trace_open_isolated); the others are read
                            in part - their steps table and the records of
                            their first event - so damage elsewhere in their
                            files is not seen */
  /* appended: ranks read whose trace is closed and carries the join mark
   * (uneven inputs: they ran out of inputs and joined the others). Not
   * "ended early" and no problem by themselves: the verdict is not
   * raised for them. */
  int64_t n_joined;
  /* appended: ranks read whose trace carries the abort mark (a signal or
   * an exception ended the job; probe_rank_entry.aborted says what). They
   * are among n_incomplete. */
  int64_t n_aborted;
} probe_ranks;

/* Reads the set (paths in any order; probe_trace_set_expand makes them
 * from a directory or a glob). PROBE_OK when at least one file was read,
 * the problems of the others being in the result; the first file's error
 * when none could be read; PROBE_ERR_INVALID_ARG for a set that is not one
 * job (r->error); PROBE_ERR_NOMEM. Free with probe_ranks_free either way. */
AMPPROBE_API probe_status probe_ranks_run(probe_ranks *r,
                                          const char *const *paths,
                                          size_t n_paths,
                                          const probe_ranks_options *opt);
/* probe_ranks_run, telling fn (may be NULL: the same as probe_ranks_run)
 * how far it is (probe_progress_fn, probe.h): phase PROBE_PROGRESS_RANKS
 * once with done 0, then after each file; PROBE_PROGRESS_RANKS_AGAIN
 * likewise over the files read a second time, if any; then the focus
 * rank's full read and post-mortem, as probe_trace_open_isolated_progress
 * (opt->isolate) and probe_diag_run_progress report them. A non-zero
 * return stops it: PROBE_ERR_INTERRUPTED (free r with probe_ranks_free). */
AMPPROBE_API probe_status probe_ranks_run_progress(probe_ranks *r,
                                                   const char *const *paths,
                                                   size_t n_paths,
                                                   const probe_ranks_options *opt,
                                                   probe_progress_fn fn,
                                                   void *user);
AMPPROBE_API void probe_ranks_free(probe_ranks *r);

/* 1 when more than one rank was read and every one of them stopped at the
 * same step without closing its trace: stopped_first is then only the
 * first of them, not the one that stopped first (which cannot be told). */
AMPPROBE_API int probe_ranks_stopped_tie(const probe_ranks *r);

/* Text (`ampprobe postmortem DIR`) and JSON (`--json`; "verdict" first),
 * malloc'd, free with probe_free. */
AMPPROBE_API probe_status probe_ranks_render_text(const probe_ranks *r,
                                                  char **text_out);
AMPPROBE_API probe_status probe_ranks_render_json(const probe_ranks *r,
                                                  char **json_out);

/* ==== trace diff ============================================================ *
 *
 * Aligns two traces of the same model and seed run under different
 * precision policies (A is usually FP16, B its FP32 baseline) by layer
 * name, site and step, and measures how far A drifts from B.
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
 *                (the threshold of the coarsest format either trace
 *                uses: times PROBE_DIFF_BF16_THRESHOLD_FACTOR when a layer
 *                runs in BF16), or when values underflowed to zero on one
 *                side at that step (see "underflow" below), or when
 *                exactly one side holds a non-finite value (scaled
 *                gradients that overflow on a step that side's loss scaler
 *                skipped are normal backoffs and do not count). RMS, not
 *                absmax: the absmax of a gradient is one element and jumps
 *                from step to step (healthy FP16 runs against FP32 show
 *                single-step absmax differences up to 0.4 and windowed RMS
 *                differences up to 0.05; see docs/cli.md).
 *   underflow: the side with more exact zeros holds them by at least
 *                zero_frac_margin of the tensor AND at least
 *                PROBE_DIFF_ZERO_MIN_VALUES values more, that side's layer
 *                runs in FP16 or BF16, and the other side's smallest
 *                non-zero |x| (at that side's loss scale) is below the
 *                format's smallest normal (FP16 2^-14 ~ 6.1e-5, BF16
 *                2^-126 ~ 1.2e-38). Extra zeros that fail the last two
 *                tests come from rounding (BF16's 8-bit significand rounds
 *                p to 1, so p(1-p) = 0) or exact cancellation: they are
 *                counted (zero_rounding_records) but are no divergence by
 *                themselves (what they change shows in the RMS), unless
 *                the reduced side lost PROBE_DIFF_ZERO_LOST_FRAC of the
 *                tensor or more to them ("values turned to exact zeros").
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

#define PROBE_DIFF_DEFAULT_THRESHOLD 0.1
#define PROBE_DIFF_DEFAULT_WINDOW 10
#define PROBE_DIFF_MAX_WINDOW 256
#define PROBE_DIFF_TEXT_MAX 512
#define PROBE_DIFF_MAX_NOTES 16
/* Exact zeros on one side count as underflow only when they are at least
 * this many values more than the other side's (besides zero_frac_margin of
 * the tensor): 2 of a 32-element tensor are 6%, and no evidence. */
#define PROBE_DIFF_ZERO_MIN_VALUES 8
/* More zeros on the reduced-precision side that are no underflow still
 * diverge when they are this fraction of the tensor or more (a tensor gone
 * to zero where the other side holds ordinary values); BF16's rounding
 * zeros in the scenario zoo stay near 10%. */
#define PROBE_DIFF_ZERO_LOST_FRAC 0.5
/* BF16 keeps 8 significand bits to FP16's 11: its rounding is 8x coarser,
 * and a healthy BF16 run drifts further from FP32 than an FP16 one. The
 * threshold (FP16's, default 0.1) is multiplied by this when either trace
 * has a BF16 layer: healthy FP16 runs stay near 0.05 (half of 0.1), the
 * healthy BF16 runs of the scenario zoo reach 0.38 (two-culprits); 8x
 * (0.8) would pass a factor of 5 in RMS (docs/cli.md, "ampprobe diff"). */
#define PROBE_DIFF_BF16_THRESHOLD_FACTOR 4.0

typedef struct probe_diff_options {
  /* probe_diff_run refuses threshold <= 0 or NaN, window outside 1..256
   * and zero_frac_margin < 0 or NaN with PROBE_ERR_INVALID_ARG (they were
   * clamped or used as given) */
  double threshold;  /* relative difference that counts as divergence */
  int window;        /* steps averaged for divergence (10), 1..256 */
  size_t chunk_rows; /* as in probe_diag_options */
  /* A record diverges when its fractions of zero values differ by at least
   * this much at a step and the zeros underflowed (the other conditions
   * under "underflow" above), and a gradient site "flushes to zero" in A
   * when its overall zero fraction exceeds B's by this much (0.05 = 5
   * points) and its zeros underflowed at some step. */
  double zero_frac_margin;
} probe_diff_options;

/* Fills o with the defaults (PROBE_DIFF_DEFAULT_THRESHOLD, _WINDOW). */
AMPPROBE_API void probe_diff_options_init(probe_diff_options *o);

/* One aligned (layer, site) pair. */
typedef struct probe_diff_entry {
  char layer[PROBE_NAME_MAX];
  int32_t kind;           /* probe_kind */
  int32_t prec_a, prec_b; /* probe_dtype in each trace */
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
  int flushes_to_zero;    /* gradient site, zero fraction A >> B, and A's
                             zeros underflowed (FP16/BF16 layer, B's values
                             below that format's normal range) at some
                             step; not for zeros from rounding */
  int64_t steps_left_out; /* of steps: gradients that overflowed on a step
                             that side's loss scaler skipped; not compared
                             (not in the max_rel_*, windows and means) */
} probe_diff_entry;

typedef struct probe_diff_config_row {
  char key[256];
  char *a, *b;
} probe_diff_config_row;

typedef enum probe_diff_verdict {
  PROBE_DIFF_AGREE = 0,     /* within tolerance everywhere compared */
  PROBE_DIFF_DIVERGE = 1,   /* some record or the loss diverges */
  PROBE_DIFF_NOT_ALIGNED = 2 /* nothing to compare (no common layer or
                                step), or layer lists that differ and no
                                divergence in the part compared */
} probe_diff_verdict;

typedef struct probe_diff_point {
  int found;
  int64_t step;
  char layer[PROBE_NAME_MAX];
  int32_t site;
  uint32_t seq;
  double rel;
  int local;    /* 1: inputs agreed (introduced here) */
  int nonfinite; /* one side only non-finite: 1 A, 2 B; 0 neither/both */
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
  /* where the configs differ, key by key (values as JSON text, NULL where
   * a side lacks the key; keys escaped) */
  size_t n_config_diff;
  probe_diff_config_row *config_diff;
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
  /* (added in 0.2: last, so the fields before keep their offsets) */
  int config_compared;  /* 1: both configs were read and compared; 0: a
                           side holds none readable (no rows: not
                           "identical", nothing was compared) */
  /* (added in 0.3, last for the same reason) the threshold the records
   * and the loss were judged with: opt.threshold, times
   * PROBE_DIFF_BF16_THRESHOLD_FACTOR when a layer of either trace runs in
   * BF16 (threshold_format PROBE_DTYPE_BF16; else PROBE_DTYPE_F16) */
  double threshold_used;
  int32_t threshold_format;
  int64_t zero_underflow_records; /* records that diverged by underflow */
  int64_t zero_rounding_records;  /* more zeros on one side, not underflow
                                     (rounding, cancellation): no divergence */
} probe_diff;

/* Compares two open traces. PROBE_OK with d->verdict set, or a reader error
 * (d->notes[0] then says which side). Every row of both traces' snapshot
 * and kernel tables, which the comparison does not use, is checked first
 * (as probe_diag_run does; once per handle): a trace the isolated open
 * refuses is refused here too, d->notes[0] "trace A: <the reader's
 * message>" (or B), also in probe_trace_last_error(NULL). */
AMPPROBE_API probe_status probe_diff_run(probe_diff *d, probe_trace *a, probe_trace *b,
                            const probe_diff_options *opt);
/* probe_diff_run, telling fn (may be NULL: the same as probe_diff_run) how
 * far it has read, phase PROBE_PROGRESS_COMPARING (probe_progress_fn,
 * probe.h): once with done 0 before the first read, then after each chunk
 * of opt->chunk_rows rows; total is both traces' records and steps rows,
 * and the last call of a run that succeeds has done == total. A non-zero
 * return stops the run at that chunk: PROBE_ERR_INTERRUPTED (free *d with
 * probe_diff_free). */
AMPPROBE_API probe_status probe_diff_run_progress(probe_diff *d, probe_trace *a,
                                                  probe_trace *b,
                                                  const probe_diff_options *opt,
                                                  probe_progress_fn fn,
                                                  void *user);
AMPPROBE_API void probe_diff_free(probe_diff *d);

/* The whole result as a JSON document (malloc'd; free with probe_free).
 * trace_a / trace_b (may be NULL) are stored as "trace_a" / "trace_b". */
AMPPROBE_API probe_status probe_diff_json(const probe_diff *d,
                                          const char *trace_a,
                                          const char *trace_b, char **out);

/* rel() as defined above. */
AMPPROBE_API double probe_diff_rel(double a, double b);


/* ==== delta debugging (bisect's core) ======================================= *
 *
 * Direction. bisect looks for a minimal set S of candidates (module kinds or
 * layers) such that training with S forced to FP32 PASSES. The premises are
 * that the empty set fails (everything in FP16 diverges) and the full set C
 * passes. ddmin (Zeller & Hildebrandt, "Simplifying and Isolating
 * Failure-Inducing Input", TSE 2002) minimises a set while it keeps a
 * property; here the property kept is "passes", so the algorithm is ddmin
 * applied as is, with "pass" in the role ddmin's paper gives to "fail":
 *
 *   S = C, n = 2
 *   while |S| >= 2:
 *     split S (in candidate order) into n near-equal parts D1..Dn
 *     if some Di passes          : S = Di,      n = 2
 *     elif some S\Di passes (n>2): S = S\Di,    n = max(n-1, 2)
 *     elif n < |S|               : n = min(2n, |S|)
 *     else                       : stop
 *   if |S| == 1 and the empty set passes: S = {}
 *
 * The result is 1-minimal: dropping any one element of S makes it fail (the
 * last round tested every S\{i}). Trials are memoised by set, so no set is
 * ever run twice. Trial bound, with the empty set's verdict known (bisect's
 * premise) and counting the full set's trial: for k culprits among n
 * candidates and a monotone oracle (a superset of a passing set passes),
 *   k = 1:  trials <= 1 + 2*ceil(log2 n)
 *   k >= 1: trials <= 1 + 4*k*ceil(log2 n)
 * checked in tests/tools/test_ddmin.c over every placement of k <= 3 culprits
 * among n <= 16 candidates and for every k = 1..16 among 16. Measured worst
 * cases for n = 16: 9 (k=1), 27 (k=2), 47 (k=3), 61 (k=4) trials, against
 * 2^16 subsets. Without monotonicity ddmin's worst case is quadratic,
 * (|C|^2 + 3|C|)/2, never exponential, and the answer is still 1-minimal.
 *
 * Parallelism. Each round's sets are handed to the oracle as one ordered
 * batch [D1..Dn, S\D1..S\Dn] (memoised sets left out). The oracle may run
 * them concurrently; it must answer every set up to and including the first
 * one that passes and may leave the rest PROBE_DDMIN_UNKNOWN. ddmin takes the
 * first passing set in batch order, so the answer does not depend on how many
 * trials ran in parallel (only the count of speculative trials does).
 */

#define PROBE_DDMIN_MAX 64 /* candidates; a set is a uint64_t bit mask */

enum {
  PROBE_DDMIN_UNKNOWN = -1,
  PROBE_DDMIN_FAIL = 0,
  PROBE_DDMIN_PASS = 1,
};

/* Batch oracle: fill verdict[i] for sets[i], i < count, in order, at least up
 * to the first PROBE_DDMIN_PASS. Returns PROBE_OK, or an error (for example
 * PROBE_ERR_INTERRUPTED) which stops ddmin and is returned by it (a value
 * outside probe_status is returned as PROBE_ERR_STATE). Verdicts it did give
 * before an error are still memoised. */
typedef probe_status (*probe_ddmin_oracle)(void *ctx, const uint64_t *sets,
                                           size_t count, int *verdict);

typedef struct probe_ddmin_trial {
  uint64_t set;
  int verdict; /* PROBE_DDMIN_PASS or PROBE_DDMIN_FAIL */
  int seeded;  /* 1 when given by probe_ddmin_seed, not asked of the oracle */
} probe_ddmin_trial;

typedef struct probe_ddmin {
  int n; /* candidates, 1..64 */
  probe_ddmin_oracle oracle;
  void *ctx;
  probe_ddmin_trial *memo; /* every known verdict, in the order learnt */
  size_t n_memo, cap_memo;
  size_t trials;  /* verdicts the oracle gave (seeded ones not counted) */
  size_t rounds;  /* oracle batches */
} probe_ddmin;

/* Prepares d for n candidates (1..PROBE_DDMIN_MAX) judged by oracle(ctx,
 * ...); PROBE_ERR_INVALID_ARG otherwise. probe_ddmin_free releases its
 * memo of judged sets (d itself is the caller's). */
AMPPROBE_API probe_status probe_ddmin_init(probe_ddmin *d, int n, probe_ddmin_oracle oracle,
                              void *ctx);
AMPPROBE_API void probe_ddmin_free(probe_ddmin *d);

/* Records a verdict already known (bisect's premise runs), so ddmin never
 * asks for it again. */
AMPPROBE_API probe_status probe_ddmin_seed(probe_ddmin *d, uint64_t set, int verdict);
/* PROBE_DDMIN_UNKNOWN when the set has not been tried. */
AMPPROBE_API int probe_ddmin_lookup(const probe_ddmin *d, uint64_t set);

/* Runs ddmin from the full set (all n candidates), which must pass: when it
 * is not known yet it is asked of the oracle first, and PROBE_ERR_STATE is
 * returned if it fails. On success *result is a 1-minimal passing set. A d
 * that probe_ddmin_init did not prepare (zeroed: no oracle, n 0) is
 * PROBE_ERR_INVALID_ARG. */
AMPPROBE_API probe_status probe_ddmin_minimize(probe_ddmin *d, uint64_t *result);

/* Helpers. */
static inline int probe_set_count(uint64_t s) {
#if defined(__GNUC__) || defined(__clang__)
  return __builtin_popcountll(s);
#else /* portable (MSVC and others): one iteration per member */
  int n = 0;
  for (; s; s &= s - 1) n++;
  return n;
#endif
}
static inline uint64_t probe_set_full(int n) {
  return n >= 64 ? ~(uint64_t)0 : (((uint64_t)1 << n) - 1);
}


#ifdef __cplusplus
}
#endif
#endif /* AMPPROBE_ANALYSIS_H */
