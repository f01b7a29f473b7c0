/*
 * libprobe/analysis/diagnose_rules.c - the post-mortem's ranking: a table
 * of rules, each a condition on the passes' results (diagnose.c), a score
 * and the text of its finding (title, evidence, one next step). Every
 * threshold is a named constant below; docs/precision.md ("The rules")
 * lists the table. Then the verdict: diverged, degraded or healthy.
 *
 * To add a rule: write its `when` and `explain` functions and add a row to
 * RULES. Rules run in table order (a rule may look at the findings made
 * before it: the fallbacks at the end fire only when nothing else did) and
 * the findings are then sorted by score, highest first (stable).
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "analysis-impl.h"
#include "diagnose-impl.h"

/* ---- named thresholds ------------------------------------------------------ */

/* lr signature: the loss climbed this many times above its best before the
 * event, and the largest weight grew this many times. */
#define LR_LOSS_CLIMB 4.0
#define LR_WEIGHT_GROWTH 8.0
/* Gradients underflow when this fraction of an FP16 layer's gradient values
 * are subnormal or flush to zero (without loss scaling). */
#define UNDERFLOW_FRAC 0.01
/* Clipping of scaled gradients, from the norms alone: at least this
 * fraction of steps clipped, with a mean log2(norm / threshold) of at least
 * CLIP_LOG2_RATIO (norms 64x the threshold). */
#define CLIP_CLIPPED_FRAC 0.8
#define CLIP_LOG2_RATIO 6.0
/* Norms compared with the recorded weight gradients (pass 3): at least
 * CLIP_MIN_COMPARED steps, and the scaled norm on CLIP_SCALED_FRAC of them. */
#define CLIP_MIN_COMPARED 3
#define CLIP_SCALED_FRAC 0.8
/* Without a config or comparable steps, "the norms track the scale" needs
 * the scale to have moved (std of log2 scale >= CLIP_SCALE_SPREAD binades)
 * and corr(log norm, log scale) >= CLIP_CORR_MIN. */
#define CLIP_SCALE_SPREAD 0.5
#define CLIP_CORR_MIN 0.5
/* A sensitive FP16 layer (norms, softmax, attention) with less forward
 * headroom than this (binades) is a candidate when the run had an event. */
#define SENSITIVE_HEADROOM 1.0
/* loss-diverging names the learning rate when it rose at least this many
 * times from the step of the loss's lowest median to the last. */
#define DIVERGE_LR_RISE 2.0

/* ---- scores (higher ranks first) ------------------------------------------- */

#define SCORE_CLEAN_INPUT 100
#define SCORE_LR_FP32 95
#define SCORE_CLIP_EVENT 92
#define SCORE_CHECK_WEIGHTS 90
#define SCORE_FORCE_FP32 90
#define SCORE_FIX_ALLREDUCE 90 /* as an FP16 event: the first fault */
#define SCORE_LR 88
#define SCORE_SILENT 85
#define SCORE_DATA_RESOLUTION 86 /* above silent-fault: it says why */
#define SCORE_SCALE_COLLAPSE 85
#define SCORE_LOSS_DIVERGING 87 /* below the lr signature of an event */
#define SCORE_SKIP_STREAK 84    /* below a collapse: the run recovered */
#define SCORE_STAGNANT 83       /* the run trains, worse: a silent loss */
#define SCORE_LOSS_SCALING 80
#define SCORE_FORCE_FP32_AFTER_CLIP 75
#define SCORE_FORCE_FP32_AFTER_LR 70
#define SCORE_FORCE_FP32_WEAK 65 /* a custom module's NaN, nothing
                                    overflowed or flushed */
#define SCORE_CLIP 60
#define SCORE_SCALE_COLLAPSE_EVENT 60
#define SCORE_LOSS_ONLY 50
#define SCORE_LOSS_OUTSIDE 96 /* above the FP32 lr signature: it says why */
#define SCORE_NO_STEPS 100
#define SCORE_NOT_PRECISION 95
#define SCORE_NOT_CLOSED 10 /* a fact about the run, after any fault */
#define SCORE_HEALTHY 0

/* ---- context ---------------------------------------------------------------- */

typedef struct rank_ctx {
  probe_diag *d;
  char args[600];        /* "--scenario X --steps N --seed S", "-- CMD" */
  const char *oname;     /* origin layer's name */
  int has_event;         /* a non-finite event or loss */
  int lr_signature;
  double wgrowth;        /* largest weight, last / first */
  char prior[200];       /* what the run already kept in FP32 */
  char run_fp32[700];    /* how to run the FP32 baseline, quoted */
  char run_same[700];    /* how to run it again, quoted */
} rank_ctx;

static void add_evidence(probe_diag_finding *f, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void add_evidence(probe_diag_finding *f, const char *fmt, ...) {
  if (!f || f->n_evidence >= PROBE_DIAG_MAX_EVIDENCE) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(f->evidence[f->n_evidence++], PROBE_DIAG_TEXT_MAX, fmt, ap);
  va_end(ap);
}

static void set_title(probe_diag_finding *f, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void set_title(probe_diag_finding *f, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(f->title, sizeof f->title, fmt, ap);
  va_end(ap);
}

static void set_next(probe_diag_finding *f, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void set_next(probe_diag_finding *f, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(f->next_step, sizeof f->next_step, fmt, ap);
  va_end(ap);
}

/* "ampprobe bisect --fp32-candidates LIST ARGS": the list holds names from
 * the trace's config ("fp32"), so it is one shell-quoted word (a kind list
 * such as revin,softmax stays as it is); ARGS is quoted already. Those
 * names are escaped (probe__diag_read_config): one that needed it (a
 * control character, a bidi control, a backslash, bytes that are not
 * UTF-8) shows a backslash, and pasted as shown it would ask bisect for
 * other modules ('\e[31m' is a backslash and an e, not ESC). Then no
 * command is given, only why - as source_arg (diagnose.c) gives no
 * --config or --scenario it cannot make pasteable. Kinds and the layer
 * names add_layer_candidate takes hold no backslash. */
static void set_next_bisect(probe_diag_finding *f, const char *cands,
                            const char *args) {
  if (strchr(cands, '\\')) {
    set_next(f, "no bisect command to paste: the candidates '%.300s' hold a "
                "name from the config's fp32 list that is shown escaped (a "
                "control character, a backslash or bytes that are not "
                "UTF-8); pasted, it would name other modules",
             cands);
    return;
  }
  char q[600];
  if (probe_shell_quote(q, sizeof q, cands) >= sizeof q)
    snprintf(q, sizeof q, "KINDS");
  set_next(f, "ampprobe bisect --fp32-candidates %s %s", q, args);
}

static void add_candidate(char *list, size_t len, const char *kind) {
  if (!kind || !*kind) return;
  if (!strcmp(kind, "input") || !strcmp(kind, "loss") ||
      !strcmp(kind, "other"))
    return;
  size_t kl = strlen(kind);
  for (const char *p = list; (p = strstr(p, kind)); p += kl)
    if ((p == list || p[-1] == ',') && (p[kl] == 0 || p[kl] == ','))
      return;
  size_t n = strlen(list);
  snprintf(list + n, len - n, "%s%s", n ? "," : "", kind);
}

static void fmt_loss(char *b, size_t n, double x) { probe_num_format(b, n, x, 4); }

/* A layer name bisect can take as a candidate glob and a shell can take
 * unquoted in the suggested command: [A-Za-z0-9._-], at most 60 bytes. */
static int name_is_candidate(const char *s) {
  size_t n = 0;
  for (; s[n]; n++)
    if (!((s[n] >= 'a' && s[n] <= 'z') || (s[n] >= 'A' && s[n] <= 'Z') ||
          (s[n] >= '0' && s[n] <= '9') || s[n] == '.' || s[n] == '_' ||
          s[n] == '-'))
      return 0;
  return n > 0 && n <= 60;
}

static int layer_is_fp32(const probe_diag *d, int32_t id) {
  return id >= 0 && id < d->n_layers &&
         d->layers[id].info.precision == PROBE_DTYPE_F32;
}

/* "FP16", "BF16" or "FP32": the precision a layer ran in. */
static const char *prec_label(const probe_diag *d, int32_t id) {
  return id >= 0 && id < d->n_layers ? probe__diag_prec_label(d->layers[id].info.precision)
                                     : "FP16";
}

static const char *kind_of(const probe_diag *d, int32_t id) {
  return id >= 0 && id < d->n_layers
             ? probe_kind_name((probe_kind)d->layers[id].info.kind)
             : "?";
}

/* The command that reruns the run: from the structured config. A trace of
 * another framework (the config's "framework", e.g. the Python package's
 * "pytorch") is rerun with its own command: bisect takes it after "--".
 * A run whose reduced layers are BF16 is rerun and bisected in BF16
 * (`--precision bf16`: bisect's trials are FP16 otherwise, another run);
 * its FP32 baseline is the same command in FP32. */
static void run_args(rank_ctx *c) {
  const probe_diag *d = c->d;
  const char *prec = probe__diag_range_prec(d, -1) == PROBE_DTYPE_BF16
                         ? " --precision bf16"
                         : "";
  if (d->cfg_external) {
    snprintf(c->args, sizeof c->args, "%s%s-- %s", prec + (prec[0] != 0),
             prec[0] ? " " : "", d->cfg_command);
    snprintf(c->run_same, sizeof c->run_same, "'%s'", d->cfg_command);
    snprintf(c->run_fp32, sizeof c->run_fp32,
             "'%s' with every module in FP32", d->cfg_command);
    return;
  }
  size_t k = (size_t)snprintf(c->args, sizeof c->args, "%s", d->cfg_source);
  if (k < sizeof c->args && d->cfg_steps >= 0)
    k += (size_t)snprintf(c->args + k, sizeof c->args - k, " --steps %lld",
                          (long long)d->cfg_steps);
  if (k < sizeof c->args && d->cfg_seed >= 0)
    k += (size_t)snprintf(c->args + k, sizeof c->args - k, " --seed %lld",
                          (long long)d->cfg_seed);
  snprintf(c->run_fp32, sizeof c->run_fp32, "'ampprobe run --precision fp32 %s'",
           c->args);
  if (k < sizeof c->args)
    snprintf(c->args + k, sizeof c->args - k, "%s", prec);
  snprintf(c->run_same, sizeof c->run_same, "'ampprobe run %s'", c->args);
}

/* A layer as a candidate: its kind, or for a kind bisect cannot select
 * (`other`: a custom module) its name, when that is a safe glob. */
static void add_layer_candidate(char *cl, size_t cn, const probe_diag *d,
                                int32_t id) {
  if (id < 0 || id >= d->n_layers) return;
  if (d->layers[id].info.kind == PROBE_KIND_OTHER) {
    if (name_is_candidate(d->layers[id].info.name))
      add_candidate(cl, cn, d->layers[id].info.name);
    return;
  }
  add_candidate(cl, cn, kind_of(d, id));
}

/* Data below resolution is a finding (data-resolution) when the values are
 * the input data, or when a normalisation at or after that layer (in
 * execution order) collapsed: its input was then constant in what it
 * normalises before it ran (docs/precision.md, "Data below resolution"). */
static int resolution_fires(const probe_diag *d) {
  int32_t r = d->resolution_layer;
  if (r < 0 || r >= d->n_layers) return 0;
  if (d->layers[r].resolution.from_input) return 1;
  for (int64_t i = r; i < d->n_layers; i++)
    if (d->layers[i].collapse.steps > 0) return 1;
  return 0;
}

static int bf16_overflow(const probe_diag *d);

/* Candidates to keep in FP32: what the run already kept, the origin's kind
 * (or, when the origin already runs in FP32, the FP16 layer that fed it
 * zeros), other layers that were origins, the layer whose input was
 * below resolution (before the collapse it explains), silent-fault layers,
 * and sensitive layers with tight headroom. */
static void candidates(rank_ctx *c) {
  probe_diag *d = c->d;
  char *cl = d->fp32_candidates;
  size_t cn = sizeof d->fp32_candidates;
  cl[0] = 0;
  snprintf(c->prior, sizeof c->prior, "%s", d->cfg_fp32);
  char tmp[200];
  snprintf(tmp, sizeof tmp, "%s", d->cfg_fp32);
  char *save = NULL;
  for (char *tok = strtok_r(tmp, ",", &save); tok;
       tok = strtok_r(NULL, ",", &save))
    add_candidate(cl, cn, tok);
  if (d->origin_layer >= 0) {
    /* the feeder may be the origin's own earlier call: listed once, below */
    if (d->event == PROBE_DIAG_EVENT_UNDERFLOW_TO_INF && d->feeder_layer >= 0 &&
        d->feeder_layer != d->origin_layer && !layer_is_fp32(d, d->feeder_layer))
      add_layer_candidate(cl, cn, d, d->feeder_layer);
    /* not a BF16 overflow's origin: FP32 overflows too */
    if (!layer_is_fp32(d, d->origin_layer) && !bf16_overflow(d))
      add_layer_candidate(cl, cn, d, d->origin_layer);
  }
  for (int64_t i = 0; i < d->n_layers; i++)
    if (d->layers[i].origin_steps > 0 && i != d->origin_layer &&
        !layer_is_fp32(d, (int32_t)i))
      add_layer_candidate(cl, cn, d, (int32_t)i);
  if (resolution_fires(d)) add_layer_candidate(cl, cn, d, d->resolution_layer);
  for (int64_t i = 0; i < d->n_layers; i++)
    if (d->layers[i].collapse.steps > 0 && !layer_is_fp32(d, (int32_t)i))
      add_layer_candidate(cl, cn, d, (int32_t)i);
  for (int64_t i = 0; i < d->n_layers; i++) {
    int k = d->layers[i].info.kind;
    int sensitive = k == PROBE_KIND_BN || k == PROBE_KIND_LAYERNORM ||
                    k == PROBE_KIND_REVIN || k == PROBE_KIND_SOFTMAX ||
                    k == PROBE_KIND_ATTENTION;
    if (!sensitive || d->layers[i].info.precision != PROBE_DTYPE_F16) continue;
    int tight = d->layers[i].min_fwd_headroom < SENSITIVE_HEADROOM;
    int zeros = k == PROBE_KIND_SOFTMAX && d->layers[i].fwd_out_zero > 0;
    if (c->has_event && (tight || zeros))
      add_candidate(cl, cn, probe_kind_name((probe_kind)k));
  }
}

/* The clip order, from the best evidence there is (docs/precision.md,
 * "Clipping before unscaling"): the stored config; else the comparison of
 * the clipper's norm with the recorded (scaled) weight gradients; else,
 * only when the scale moved, a strong correlation of norm and scale; else
 * it cannot tell. Sets d->clip_order, clip_order_basis and
 * clip_scaled_signature. */
static void clip_order(probe_diag *d) {
  char *b = d->clip_order_basis;
  size_t bl = sizeof d->clip_order_basis;
  d->clip_order = -1;
  d->clip_scaled_signature = 0;
  b[0] = 0;
  if (!d->clipping_on) {
    snprintf(b, bl, "clipping off");
    return;
  }
  if (!d->scaling_on) {
    d->clip_order = 0;
    snprintf(b, bl, "no loss scaling: the clipper saw unscaled gradients");
    return;
  }
  if (d->cfg_clip_before_unscale >= 0) {
    d->clip_order = d->cfg_clip_before_unscale;
    d->clip_scaled_signature = d->clip_order == 1;
    snprintf(b, bl, "the run's config says clip.before_unscale: %s",
             d->clip_order ? "true" : "false");
    return;
  }
  if (d->clip_norm_steps >= CLIP_MIN_COMPARED) {
    int scaled = (double)d->clip_norm_scaled_steps >=
                 CLIP_SCALED_FRAC * (double)d->clip_norm_steps;
    d->clip_order = scaled;
    d->clip_scaled_signature = scaled;
    snprintf(b, bl,
             "on %lld of %lld comparable steps the clipper's norm was the "
             "recorded weight gradients' norm %s",
             (long long)(scaled ? d->clip_norm_scaled_steps
                                : d->clip_norm_steps - d->clip_norm_scaled_steps),
             (long long)d->clip_norm_steps,
             scaled ? "(still multiplied by the loss scale)"
                    : "divided by the loss scale (unscaled)");
    return;
  }
  double frac = d->clip_steps_seen
                    ? (double)d->clipped_steps / (double)d->clip_steps_seen
                    : 0;
  int suspicious = d->clip_steps_seen > 0 && frac >= CLIP_CLIPPED_FRAC &&
                   d->clip_log2_ratio_mean >= CLIP_LOG2_RATIO;
  int moved = d->scale_log2_spread >= CLIP_SCALE_SPREAD;
  int tracks = moved && isfinite(d->corr_norm_scale) &&
               d->corr_norm_scale >= CLIP_CORR_MIN &&
               d->norm_resid_var < d->norm_log2_var;
  if (suspicious && tracks) {
    d->clip_order = 1;
    d->clip_scaled_signature = 1;
    snprintf(b, bl,
             "no config and no comparable step; the norms track the loss "
             "scale: corr(log2 grad_norm, log2 loss_scale) = %.2f >= %.2f",
             d->corr_norm_scale, CLIP_CORR_MIN);
    return;
  }
  snprintf(b, bl,
           "cannot tell: the trace holds no clip order, no step where the "
           "clipper's norm could be compared with the recorded gradients "
           "(%lld), and %s",
           (long long)d->clip_norm_steps,
           d->clip_steps_seen == 0 ? "no step with a finite gradient norm to "
                                     "set against the loss scale"
           : moved ? "the norms do not follow the scale"
                   : "the loss scale hardly moved over the steps with a "
                     "finite gradient norm");
}

/* ---- the rules --------------------------------------------------------------- */

typedef struct rule {
  const char *name;       /* documented in docs/precision.md */
  probe_diag_finding_id id;
  int (*when)(const rank_ctx *c);
  double (*score)(const rank_ctx *c);
  void (*explain)(rank_ctx *c, probe_diag_finding *f);
} rule;

/* clean-input: NaN/inf arrived with the data. */
static int when_input(const rank_ctx *c) {
  return c->d->event == PROBE_DIAG_EVENT_INPUT_NAN;
}
static double score_input(const rank_ctx *c) { (void)c; return SCORE_CLEAN_INPUT; }
static void explain_input(rank_ctx *c, probe_diag_finding *f) {
  const probe_diag *d = c->d;
  set_title(f, "NaN/inf arrived in the input data at step %lld",
            (long long)d->event_step);
  add_evidence(f, "layer '%s' (kind input) holds %llu NaN, %llu inf of %llu "
                  "values at step %lld",
               c->oname, (unsigned long long)d->origin_out.nan_count,
               (unsigned long long)(d->origin_out.posinf_count +
                                    d->origin_out.neginf_count),
               (unsigned long long)d->origin_out.count,
               (long long)d->event_step);
  add_evidence(f, "no layer produced it: it was non-finite before the first "
                  "module ran");
  set_next(f, "clean the input data of step %lld (drop or impute NaN/inf "
              "samples, e.g. torch.nan_to_num or a data check); precision "
              "changes will not help",
           (long long)d->event_step);
}

/* Whether the run updated its weights before the event: the event is
 * after the first step the trace holds (at that step no update this trace
 * records had reached them). */
static int before_event_updates(const probe_diag *d) {
  int64_t ev = d->event_step >= 0 ? d->event_step : d->first_nonfinite_loss_step;
  return ev > d->first_step;
}

/* The loss, computed outside the recorded modules, made the first
 * non-finite value (diagnose.c, loss_outside_modules). */
static int loss_outside(const probe_diag *d) {
  if (d->event == PROBE_DIAG_EVENT_LOSS_ONLY) return d->event_evidence[0] != '\0';
  /* underflow-to-inf whose origin output is finite: the log or division
   * of its zeros was the loss's, outside the modules; from an FP32 output
   * (from an FP16 one, fp16-event keeps its producer in FP32) */
  return d->event == PROBE_DIAG_EVENT_UNDERFLOW_TO_INF &&
         d->origin_layer >= 0 && !probe_stats_nonfinite(&d->origin_out) &&
         layer_is_fp32(d, d->origin_layer);
}

/* A forward NaN (no inf) made from a finite input that holds exact zeros
 * with no sign of flushing: a 0/0 on real zeros (a padding row, an
 * all-zero feature divided by its norm), which no precision fixes. Not a
 * normalisation in FP16/BF16, whose E[x^2]-E[x]^2 can round negative. */
static int nan_of_exact_zeros(const probe_diag *d) {
  if (d->event != PROBE_DIAG_EVENT_INF_ARITH_NAN || d->origin_layer < 0 ||
      d->event_phase != PROBE_PHASE_FORWARD || !d->have_origin_in ||
      probe_stats_nonfinite(&d->origin_in) || d->origin_in.zero_count == 0 ||
      d->origin_out.posinf_count + d->origin_out.neginf_count > 0)
    return 0;
  const probe_layer_info *li = &d->layers[d->origin_layer].info;
  int low = li->precision != PROBE_DTYPE_F32;
  /* in FP16/BF16: a normalisation (a variance that rounded negative), a
   * softmax or attention (scores that overflowed: inf-inf is NaN with no
   * inf left), or an input whose squares reach the range (a product that
   * could overflow) may be the precision's doing */
  if (low && (probe__diag_is_norm_kind(li->kind) || li->kind == PROBE_KIND_SOFTMAX ||
              li->kind == PROBE_KIND_ATTENTION))
    return 0;
  double sq = (double)d->origin_in.absmax * (double)d->origin_in.absmax;
  if (low && !(sq < probe__diag_range_max(li->precision))) return 0;
  /* zeros beside flushing values: FP16 made them, in an FP16 layer or in
   * the FP16 layers that fed an FP32 one (BF16 flushes only near 1e-38) */
  return !(li->precision != PROBE_DTYPE_BF16 &&
           probe__diag_zeros_flushed(&d->origin_in));
}

/* FP32's largest finite value (FLT_MAX). */
#define FP32_MAX 3.4028234663852886e38

/* A BF16 origin whose values were within FP32's range but past BF16's:
 * its input (recorded before the cast) held finite values beyond BF16's
 * maximum, or the bound its inputs allow (||W||*(||x||+1), absmax^2) is
 * within FP32's maximum. FP32 holds them; BF16 made them inf. */
static int bf16_within_fp32(const probe_diag *d) {
  if (d->layers[d->origin_layer].info.precision != PROBE_DTYPE_BF16) return 0;
  if (d->have_origin_in && isfinite(d->origin_in.absmax) &&
      d->origin_in.absmax > PROBE__DIAG_BF16_MAX)
    return 1;
  return d->origin_bound > 0 && d->origin_bound <= FP32_MAX;
}

/* An overflow (inf) that FP32 makes too: BF16 has FP32's range (its
 * largest value, ~3.39e38, is within 0.4% of FP32's ~3.40e38), so an
 * overflow made in a BF16 layer, or in an FP32 layer whose inputs came
 * from BF16 layers, is an overflow of FP32 too, unless its values were in
 * the sliver between the two maxima (bf16_within_fp32). Not an inf that
 * arrived at a layer's input or incoming gradient (clean-input, or the
 * cast of a value FP32 held). docs/precision.md, "BF16". */
static int bf16_overflow(const probe_diag *d) {
  if (d->fp32_run || d->origin_layer < 0 || d->origin_layer >= d->n_layers ||
      d->origin_site == PROBE_SITE_FWD_IN || d->origin_site == PROBE_SITE_GRAD_OUT)
    return 0;
  /* A BF16 normalisation or custom op (kind other) makes inf of in-range
   * values through a quantity its 8 bits rounded to zero (a variance
   * E[x^2] - E[x]^2 under its rsqrt, a denominator): a precision problem,
   * which FP32 cures. A range overflow only when its input's square
   * reaches BF16's range. */
  const probe_layer_info *oi = &d->layers[d->origin_layer].info;
  if (oi->precision == PROBE_DTYPE_BF16 &&
      (probe__diag_is_norm_kind(oi->kind) || oi->kind == PROBE_KIND_OTHER) &&
      (!d->have_origin_in ||
       (double)d->origin_in.absmax * (double)d->origin_in.absmax < PROBE__DIAG_BF16_MAX))
    return 0;
  if (d->event != PROBE_DIAG_EVENT_OVERFLOW &&
      d->event != PROBE_DIAG_EVENT_REDUCTION_OVERFLOW &&
      d->event != PROBE_DIAG_EVENT_GRAD_OVERFLOW)
    return 0;
  return probe__diag_range_prec(d, d->origin_layer) == PROBE_DTYPE_BF16 &&
         !bf16_within_fp32(d);
}

/* The records rule out the precision as the event's cause: a NaN of exact
 * zeros (forward or, for a custom module, backward), or a NaN-only event
 * whose inputs could neither overflow nor flush (diagnose.c,
 * rule_out_precision). */
static int no_precision_cause(const probe_diag *d) {
  return nan_of_exact_zeros(d) || d->origin_divides_zeros ||
         (d->origin_not_precision && d->event == PROBE_DIAG_EVENT_INF_ARITH_NAN) ||
         bf16_overflow(d);
}

/* check-weights: a non-finite update reached the weights. */
static int when_weights(const rank_ctx *c) {
  return c->d->event == PROBE_DIAG_EVENT_WEIGHT_NONFINITE;
}
static double score_weights(const rank_ctx *c) { (void)c; return SCORE_CHECK_WEIGHTS; }
static void explain_weights(rank_ctx *c, probe_diag_finding *f) {
  const probe_diag *d = c->d;
  /* master_outgrew (diagnose.c) wrote the evidence: finite FP32 masters
   * the optimizer left within the copy's range (changed since by something
   * else: edited), or beyond FP16's range with an FP16 copy that
   * overflowed (outgrew) */
  int edited = probe__diag_weights_edited(d);
  /* master weights are recorded after the step's update, and the records
   * before them were finite: the update made them non-finite, at any step */
  int updated = probe__diag_weights_updated(d);
  int outgrew = !edited && !updated && d->event_evidence[0] != '\0';
  /* only the weights as the first step's forward used them (before any
   * update) came from the checkpoint or the initialisation */
  int loaded = !updated && d->origin_site == PROBE_SITE_WEIGHT &&
               !before_event_updates(d);
  int grad_seen = updated && strstr(d->event_evidence, "weight_grad") != NULL;
  if (edited)
    set_title(f, "the weights of '%s' were changed outside the optimizer "
                 "before step %lld: non-finite as its forward used them, "
                 "finite after the last update",
              c->oname, (long long)d->event_step);
  else if (outgrew)
    set_title(f, "the weights of '%s' outgrew FP16: their FP16 copy is inf at "
                 "step %lld while the FP32 master weights are finite",
              c->oname, (long long)d->event_step);
  else if (updated)
    set_title(f, "the optimizer step of step %lld made the weights of '%s' "
                 "non-finite%s",
              (long long)d->event_step, c->oname,
              grad_seen ? " from finite weights and gradients" : "");
  else if (loaded)
    set_title(f, "the weights of '%s' were non-finite before any update: at "
                 "step %lld, the first step the trace holds",
              c->oname, (long long)d->event_step);
  else
    set_title(f, "the weights of '%s' are non-finite at step %lld", c->oname,
              (long long)d->event_step);
  add_evidence(f, "site %s of '%s' holds %llu NaN, %llu inf",
               probe_site_name(d->origin_site), c->oname,
               (unsigned long long)d->origin_out.nan_count,
               (unsigned long long)(d->origin_out.posinf_count +
                                    d->origin_out.neginf_count));
  if (edited) {
    add_evidence(f, "%s", d->event_evidence + sizeof PROBE__DIAG_WEIGHTS_EDITED - 1);
    set_next(f, "find what writes to the weights of '%s' between optimizer "
                "steps (an in-place edit under torch.no_grad(), "
                "load_state_dict, a hook, a copy from another model) and "
                "check the values it writes; no update made them non-finite, "
                "so neither the learning rate nor the precision explains it",
             c->oname);
  } else if (outgrew) {
    add_evidence(f, "%s", d->event_evidence);
    set_next(f, "lower the learning rate of '%s' (or add weight decay) so its "
                "weights stay within FP16's range, or keep it in FP32: "
                "ampprobe bisect --fp32-candidates %s %s",
             c->oname, kind_of(d, d->origin_layer), c->args);
  } else if (updated) {
    add_evidence(f, "%s", d->event_evidence + sizeof PROBE__DIAG_WEIGHTS_UPDATED - 1);
    set_next(f, "check the optimizer of '%s' and its hyper-parameters: an eps "
                "of 0 (Adam, AdamW, RMSprop divide by sqrt(v) + eps, 0/0 where "
                "a gradient is exactly 0), a learning rate, momentum or weight "
                "decay that is inf/NaN or so large the update overflows%s; the "
                "weights were finite before the update, so neither the "
                "checkpoint nor the precision explains it",
             c->oname,
             grad_seen ? "" : ", or the gradient it applied (not recorded: "
                              "record its weight_grad)");
  } else if (loaded) {
    add_evidence(f, "no update of this run had reached them: they came "
                    "non-finite from the initialisation or the checkpoint "
                    "they were loaded from");
    set_next(f, "check the checkpoint or initialisation of '%s' (e.g. "
                "torch.isfinite(p).all() for each of its parameters after "
                "loading); neither the learning rate nor the precision "
                "explains it",
             c->oname);
  } else {
    set_next(f, "a non-finite update reached the weights: check that steps "
                "with non-finite gradients are skipped, and lower the learning "
                "rate; compare with %s",
             c->run_fp32);
  }
}

/* fix-allreduce: the all-reduce returned a non-finite gradient bucket that
 * this rank sent finite. */
static int when_allreduce(const rank_ctx *c) {
  return c->d->event == PROBE_DIAG_EVENT_ALLREDUCE;
}
static double score_allreduce(const rank_ctx *c) {
  (void)c;
  return SCORE_FIX_ALLREDUCE;
}
/* "grad_post_allreduce of 'fc' holds 3 NaN, 0 inf of 64 values; <tail>" */
static void allreduce_counts(rank_ctx *c, probe_diag_finding *f,
                             const char *site, const char *tail) {
  const probe_diag *d = c->d;
  add_evidence(f, "%s of '%s' holds %llu NaN, %llu inf of %llu values; %s",
               site, c->oname, (unsigned long long)d->origin_out.nan_count,
               (unsigned long long)(d->origin_out.posinf_count +
                                    d->origin_out.neginf_count),
               (unsigned long long)d->origin_out.count, tail);
}

static void explain_allreduce(rank_ctx *c, probe_diag_finding *f) {
  const probe_diag *d = c->d;
  if (d->origin_site == PROBE_SITE_GRAD_PRE_ALLREDUCE) {
    set_title(f, "the all-reduce bucket of '%s' overflowed when cast to the "
                 "all-reduce's dtype at step %lld: its gradients were finite",
              c->oname, (long long)d->event_step);
    allreduce_counts(c, f, "grad_pre_allreduce",
                     "the gradients before it were finite");
    set_next(f, "%s; keeping layers in FP32 does not change the "
                "all-reduce's dtype", PROBE__ALLREDUCE_FIX);
    return;
  }
  set_title(f, "the gradient all-reduce of '%s' returned inf/NaN at step %lld "
               "while this rank sent finite values",
            c->oname, (long long)d->event_step);
  allreduce_counts(c, f, "grad_post_allreduce",
                   "its grad_pre_allreduce was finite");
  add_evidence(f, "one rank's trace cannot tell another rank's non-finite "
                  "value from a sum that overflowed");
  set_next(f, "run 'ampprobe postmortem' over every rank's trace (the "
              "directory): if every rank sent finite values, all-reduce in "
              "FP32 (--allreduce-dtype fp32) or pre-divide by the world size "
              "(--allreduce-prediv); otherwise fix the rank it was born on");
}

/* fix-clip-order: the clipper saw scaled gradients. */
static int when_clip(const rank_ctx *c) {
  return c->d->clip_scaled_signature;
}
static double score_clip(const rank_ctx *c) {
  return c->has_event ? SCORE_CLIP_EVENT : SCORE_CLIP;
}
static void explain_clip(rank_ctx *c, probe_diag_finding *f) {
  const probe_diag *d = c->d;
  set_title(f, "gradients are clipped while still multiplied by the loss "
               "scale");
  add_evidence(f, "%s", d->clip_order_basis);
  if (d->clip_steps_seen > 0)
    add_evidence(f, "%lld of %lld steps clipped; mean pre-clip norm / "
                    "threshold is 2^%.1f, largest ratio %.3g at step %lld",
                 (long long)d->clipped_steps, (long long)d->clip_steps_seen,
                 d->clip_log2_ratio_mean, d->max_clip_ratio,
                 (long long)d->max_clip_ratio_step);
  if (isfinite(d->norm_over_scale))
    add_evidence(f, "grad_norm / loss_scale = %.3g: that is the real "
                    "(unscaled) gradient norm, against a threshold of %g",
                 d->norm_over_scale, d->clip_threshold);
  if (c->d->cfg_external)
    set_next(f, "unscale before clipping (scaler.unscale_(optimizer) before "
                "clip_grad_norm_), then run %s again",
             c->run_same);
  else
    set_next(f, "unscale before clipping (scaler.unscale_(optimizer) before "
                "clip_grad_norm_); check with %s without "
                "--clip-before-unscale",
             c->run_same);
}

/* lower-lr: the run diverges in FP32 too, or climbed before it overflowed. */
static int when_lr(const rank_ctx *c) { return c->lr_signature; }
static double score_lr(const rank_ctx *c) {
  return c->d->fp32_run ? SCORE_LR_FP32 : SCORE_LR;
}
static void explain_lr(rank_ctx *c, probe_diag_finding *f) {
  const probe_diag *d = c->d;
  char b1[32];
  set_title(f, "%s", d->fp32_run ? "the run diverged in FP32: not a precision "
                                   "problem"
                                 : "the run diverged before it overflowed: the "
                                   "learning rate looks too high");
  if (d->fp32_run)
    add_evidence(f, "every layer ran in FP32 and the loss still went "
                    "non-finite at step %lld",
                 (long long)d->first_nonfinite_loss_step);
  if (isfinite(d->loss_rise)) {
    fmt_loss(b1, sizeof b1, d->loss_before_event);
    add_evidence(f, "the loss climbed %.3gx from its best before the event "
                    "(last finite loss %s)",
                 d->loss_rise, b1);
  }
  if (isfinite(c->wgrowth))
    add_evidence(f, "the largest weight grew %.3gx (|w| %.3g -> %.3g)%s",
                 c->wgrowth, d->master_absmax_first, d->master_absmax_last,
                 d->weights_edit_step >= 0 ? " by the updates" : "");
  if (d->weights_edit_step >= 0)
    add_evidence(f, "the weights of '%s' were also changed outside the "
                    "optimizer before step %lld (x%.3g against the last "
                    "update): not counted",
                 probe_diag_layer_name(d, d->weights_edit_layer),
                 (long long)d->weights_edit_step, d->weights_edit_jump);
  int64_t ev = d->event_step >= 0 ? d->event_step : d->first_nonfinite_loss_step;
  if (d->lr_spike_step >= 0 && d->lr_spike_step <= ev) {
    add_evidence(f, "the learning rate spiked at step %lld: %.4g, %.3gx the "
                    "%.4g of the step before, for %lld step%s",
                 (long long)d->lr_spike_step, d->lr_spike,
                 d->lr_spike / d->lr_spike_base, d->lr_spike_base,
                 (long long)d->lr_spike_steps, d->lr_spike_steps == 1 ? "" : "s");
    set_next(f, "fix the learning-rate schedule at step %lld (lr %.4g against "
                "%.4g before it): the spike, not the base rate, grew the "
                "weights; %s",
             (long long)d->lr_spike_step, d->lr_spike, d->lr_spike_base,
             d->fp32_run ? "forcing layers to FP32 will not help"
                         : "then check the FP32 baseline if it still diverges");
    return;
  }
  if (d->fp32_run)
    set_next(f, "lower the learning rate (and run %s again); forcing layers "
                "to FP32 will not help",
             c->run_same);
  else
    set_next(f, "check the FP32 baseline: %s; if it diverges too, lower the "
                "learning rate",
             c->run_fp32);
}

/* not-precision: every layer ran in FP32, a layer made inf/NaN and the run
 * did not diverge (the lr signature did not fire): the op itself makes it
 * (0/0, sqrt or log of 0, an eps of 0), whatever the precision; in any run,
 * a NaN made of the exact zeros of a layer's input (nan_of_exact_zeros). */
/* A custom module's backward made inf of the exact zeros of its forward
 * values (diagnose.c, classify_backward): a division by 0 in any
 * precision. */
static void explain_divides_zeros(rank_ctx *c, probe_diag_finding *f) {
  const probe_diag *d = c->d;
  int inf = d->origin_out.posinf_count + d->origin_out.neginf_count > 0;
  set_title(f, "'%s' (%s) made %s in its backward from a finite gradient, "
               "where its forward values hold exact zeros (%s): not a "
               "precision problem",
            c->oname, kind_of(d, d->origin_layer), inf ? "inf" : "NaN",
            inf ? "a division by 0" : "0 times an infinite derivative");
  add_evidence(f, "step %lld, %s, %s", (long long)d->event_step,
               probe_phase_name(d->event_phase),
               probe_site_name(d->origin_site));
  add_evidence(f, "%s", d->event_evidence);
  if (d->first_nonfinite_loss_step < 0)
    add_evidence(f, "the loss stayed finite");
  if (inf)
    set_next(f, "look at what the backward of '%s' divides by at step %lld "
                "(its saved output or input, 0 where a ReLU or mask zeroed "
                "it): add an eps or mask those positions; keeping it in FP32 "
                "will not help (if it divides by nothing, check the FP32 "
                "baseline: %s)",
             c->oname, (long long)d->event_step, c->run_fp32);
  else
    set_next(f, "look at what '%s' computes at its zeros at step %lld (a "
                "torch.where whose other branch is NaN or inf there, sqrt or "
                "log of 0: its gradient is NaN even where it is not "
                "selected): clamp the input of that branch (e.g. "
                "sqrt(x.clamp(min=eps))); keeping it in FP32 will not help "
                "(check the FP32 baseline: %s)",
             c->oname, (long long)d->event_step, c->run_fp32);
}

/* An FP32 run whose first non-finite value arrived at a layer's input
 * (fwd_in) or incoming gradient (grad_out) with nothing recorded making
 * it: code no record covers made it (a loss computed outside the modules
 * or a custom autograd.Function's backward, an op between modules). The
 * layer did not make it. */
static void explain_arrived_fp32(rank_ctx *c, probe_diag_finding *f) {
  const probe_diag *d = c->d;
  int bwd = d->origin_site == PROBE_SITE_GRAD_OUT;
  set_title(f, "'%s' (%s) received inf/NaN at its %s from code no record "
               "covers at step %lld: not a precision problem",
            c->oname, kind_of(d, d->origin_layer),
            probe_site_name(d->origin_site), (long long)d->event_step);
  add_evidence(f, "every layer ran in FP32; step %lld, %s: the step's first "
                  "non-finite record is '%s' %s (%llu NaN, %llu inf), and no "
                  "record before it made it",
               (long long)d->event_step, probe_phase_name(d->event_phase),
               c->oname, probe_site_name(d->origin_site),
               (unsigned long long)d->origin_out.nan_count,
               (unsigned long long)(d->origin_out.posinf_count +
                                    d->origin_out.neginf_count));
  if (d->event_evidence[0]) add_evidence(f, "%s", d->event_evidence);
  if (d->weights_edit_step >= 0 && d->weights_edit_step <= d->event_step)
    add_evidence(f, "the weights of '%s' were changed outside the optimizer "
                    "before step %lld (x%.3g against the last update)",
                 probe_diag_layer_name(d, d->weights_edit_layer),
                 (long long)d->weights_edit_step, d->weights_edit_jump);
  set_next(f, "look at what computes the %s of '%s' at step %lld: %s; "
              "forcing layers to FP32 will not help",
           bwd ? "gradient" : "input", c->oname, (long long)d->event_step,
           bwd ? "the loss's backward (a custom autograd.Function's backward, "
                 "a loss written outside the recorded modules) or an op "
                 "between modules (a 0/0, a division by 0)"
               : "the data (entries of a dict batch) or an op between modules");
}

/* not-precision for an overflow in BF16 (bf16_overflow): FP32 overflows
 * too; the cause is what made the values this large. */
static void explain_bf16_overflow(rank_ctx *c, probe_diag_finding *f) {
  const probe_diag *d = c->d;
  if (layer_is_fp32(d, d->origin_layer))
    set_title(f, "'%s' (%s, FP32) overflowed FP32 on values made in BF16: "
                 "not a precision problem (BF16 has FP32's range)",
              c->oname, kind_of(d, d->origin_layer));
  else
    set_title(f, "'%s' (%s) overflowed in BF16: not a precision problem "
                 "(BF16 has FP32's range, so FP32 overflows too)",
              c->oname, kind_of(d, d->origin_layer));
  add_evidence(f, "step %lld, %s, %s: %s", (long long)d->event_step,
               probe_phase_name(d->event_phase),
               probe_site_name(d->origin_site), probe__diag_event_text(d));
  if (d->event_evidence[0]) add_evidence(f, "%s", d->event_evidence);
  add_evidence(f, "BF16's largest value (%.6g) is within 0.4%% of FP32's "
                  "(%.6g): a value past it is past FP32's too, so keeping "
                  "layers in FP32 does not cure this overflow%s",
               PROBE__DIAG_BF16_MAX, FP32_MAX,
               d->origin_bound > FP32_MAX
                   ? " (the bound its inputs allow is past FP32's maximum)"
                   : "");
  if (d->first_nonfinite_loss_step < 0)
    add_evidence(f, "the loss stayed finite");
  set_next(f, "find why the values of '%s' grew past ~3.4e38 by step %lld: "
              "the learning rate (the loss and weights before it), the "
              "inputs' scale, the weights' initialisation; keeping layers in "
              "FP32 will not help (check the FP32 baseline: %s)",
           c->oname, (long long)d->event_step, c->run_fp32);
}

static int when_not_precision(const rank_ctx *c) {
  const probe_diag *d = c->d;
  return (d->fp32_run || no_precision_cause(d)) &&
         c->has_event && !c->lr_signature && d->origin_layer >= 0 &&
         d->event != PROBE_DIAG_EVENT_INPUT_NAN &&
         d->event != PROBE_DIAG_EVENT_WEIGHT_NONFINITE &&
         d->event != PROBE_DIAG_EVENT_NONE && !loss_outside(d);
}
static double score_not_precision(const rank_ctx *c) { (void)c; return SCORE_NOT_PRECISION; }
static void explain_not_precision(rank_ctx *c, probe_diag_finding *f) {
  const probe_diag *d = c->d;
  if (!d->fp32_run && d->origin_divides_zeros) {
    explain_divides_zeros(c, f);
    return;
  }
  if (bf16_overflow(d)) {
    explain_bf16_overflow(c, f);
    return;
  }
  /* a normalisation's NaN that its input's zero rows account for: the
   * exact-zeros wording, with the rule's evidence */
  int zero_rows = d->origin_not_precision && d->have_origin_in &&
                  probe__diag_is_norm_kind(d->layers[d->origin_layer].info.kind) &&
                  d->origin_in.zero_count >= d->origin_out.nan_count;
  if (!d->fp32_run && d->origin_not_precision && !nan_of_exact_zeros(d) &&
      !zero_rows) {
    set_title(f, "'%s' (%s) made NaN from values its precision did not "
                 "spoil: not a precision problem",
              c->oname, kind_of(d, d->origin_layer));
    add_evidence(f, "step %lld, %s, %s: %s", (long long)d->event_step,
                 probe_phase_name(d->event_phase),
                 probe_site_name(d->origin_site), probe__diag_event_text(d));
    add_evidence(f, "%s", d->event_evidence);
    if (d->first_nonfinite_loss_step < 0)
      add_evidence(f, "the loss stayed finite");
    set_next(f, "look at what '%s' computes at step %lld (a row with every "
                "position masked, a 0/0 on a padding row, an eps of 0, a "
                "sqrt or log of a negative value) and guard it; keeping it in "
                "FP32 will not help (check the FP32 baseline: %s)",
             c->oname, (long long)d->event_step, c->run_fp32);
    return;
  }
  if (!d->fp32_run) {
    set_title(f, "'%s' (%s) made NaN of the exact zeros of its input (0/0): "
                 "not a precision problem",
              c->oname, kind_of(d, d->origin_layer));
    add_evidence(f, "step %lld, %s, %s: %s", (long long)d->event_step,
                 probe_phase_name(d->event_phase),
                 probe_site_name(d->origin_site), probe__diag_event_text(d));
    if (zero_rows)
      add_evidence(f, "%s", d->event_evidence);
    else
      add_evidence(f, "its input was finite and held %llu exact zeros of "
                      "%llu, none from underflow (%s); its output holds %llu "
                      "NaN and no inf",
                   (unsigned long long)d->origin_in.zero_count,
                   (unsigned long long)d->origin_in.count,
                   probe__diag_range_prec(d, d->origin_layer) == PROBE_DTYPE_BF16
                       ? "BF16 flushes only below ~1e-38"
                       : "no value near FP16's smallest",
                   (unsigned long long)d->origin_out.nan_count);
    set_next(f, "look at what '%s' divides by at step %lld (a sum or norm of "
                "a row that is all zeros: a padding row, an empty feature): "
                "add an eps or mask those rows; keeping it in FP32 will not "
                "help",
             c->oname, (long long)d->event_step);
    return;
  }
  if (d->origin_site == PROBE_SITE_FWD_IN || d->origin_site == PROBE_SITE_GRAD_OUT) {
    explain_arrived_fp32(c, f);
    return;
  }
  set_title(f, "'%s' (%s) made inf/NaN in FP32: not a precision problem",
            c->oname, kind_of(d, d->origin_layer));
  add_evidence(f, "every layer ran in FP32; step %lld, %s, %s: %s",
               (long long)d->event_step, probe_phase_name(d->event_phase),
               probe_site_name(d->origin_site), probe__diag_event_text(d));
  if (d->first_nonfinite_loss_step < 0)
    add_evidence(f, "the loss stayed finite");
  set_next(f, "look at what '%s' computes at step %lld (a 0/0, a sqrt or log "
              "of 0, an eps that is 0, in its %s); forcing layers to FP32 will "
              "not help",
           c->oname, (long long)d->event_step, probe_phase_name(d->event_phase));
}

/* force-fp32 (event): the first non-finite value was made in FP16. */
static int when_event(const rank_ctx *c) {
  const probe_diag *d = c->d;
  return c->has_event && d->event != PROBE_DIAG_EVENT_INPUT_NAN &&
         d->event != PROBE_DIAG_EVENT_WEIGHT_NONFINITE &&
         d->event != PROBE_DIAG_EVENT_ALLREDUCE &&
         d->event != PROBE_DIAG_EVENT_NONE && !d->fp32_run &&
         d->origin_layer >= 0 && !loss_outside(d) && !no_precision_cause(d);
}
static double score_event(const rank_ctx *c) {
  return c->lr_signature ? SCORE_FORCE_FP32_AFTER_LR
         : c->d->clip_scaled_signature ? SCORE_FORCE_FP32_AFTER_CLIP
         : c->d->origin_precision_weak ? SCORE_FORCE_FP32_WEAK
                                       : SCORE_FORCE_FP32;
}
static void explain_event(rank_ctx *c, probe_diag_finding *f) {
  const probe_diag *d = c->d;
  /* The layer to keep in FP32: the origin, unless it already runs in FP32;
   * then, for underflow-to-inf, the FP16 layer upstream that made the
   * zeros. -1: no such FP16 layer. */
  int32_t target = d->origin_layer;
  if (layer_is_fp32(d, target))
    target = d->event == PROBE_DIAG_EVENT_UNDERFLOW_TO_INF &&
                     d->feeder_layer >= 0 && !layer_is_fp32(d, d->feeder_layer)
                 ? d->feeder_layer
                 : -1;
  const char *okind = kind_of(d, d->origin_layer);
  const char *cands = d->fp32_candidates[0]
                          ? d->fp32_candidates
                          : (target >= 0 ? kind_of(d, target) : NULL);
  /* Two events no precision change fixes: an FP32 loss that made NaN out
   * of a finite prediction (its target is not recorded), and a value that
   * no record produced, first seen at a layer's input (it came from code no
   * module covers: a dict batch, an op between modules). Their finding is
   * clean-input. */
  int loss_target = d->origin_layer >= 0 &&
                    d->layers[d->origin_layer].info.kind == PROBE_KIND_LOSS &&
                    d->have_origin_in && !probe_stats_nonfinite(&d->origin_in) &&
                    d->event == PROBE_DIAG_EVENT_INF_ARITH_NAN;
  int at_input = (d->origin_site == PROBE_SITE_FWD_IN ||
                  d->origin_site == PROBE_SITE_GRAD_OUT) &&
                 !probe__diag_handover(d); /* a record made it: the cast */
  if (loss_target || at_input) f->id = PROBE_DIAG_FINDING_CLEAN_INPUT;
  if (at_input)
    set_title(f, "'%s' (%s) received inf/NaN at its %s from code no record "
                 "covers (a batch passed as a dict or keyword, an op between "
                 "modules, a module not recorded): look there at step %lld",
              c->oname, okind, probe_site_name(d->origin_site),
              (long long)d->event_step);
  else if (loss_target)
    set_title(f, "'%s' (FP32) made NaN from a finite prediction: look at "
                 "what it takes besides it (the targets of step %lld), which "
                 "is not recorded",
              c->oname, (long long)d->event_step);
  else if (target == d->origin_layer && d->origin_precision_weak)
    set_title(f, "%s %s in '%s' (%s): keeping it in FP32 may help, but the "
                 "evidence is weak (nothing overflowed or flushed)",
              prec_label(d, target), probe_diag_event_name(d->event), c->oname, okind);
  else if (target == d->origin_layer)
    set_title(f, "%s %s in '%s' (%s): keep it in FP32",
              prec_label(d, target), probe_diag_event_name(d->event), c->oname, okind);
  else if (target >= 0)
    set_title(f, "%s %s: '%s' (%s) underflowed to zero in %s and '%s' "
                 "(%s, FP32) turned it into inf: keep '%s' in FP32",
              prec_label(d, target), probe_diag_event_name(d->event),
              probe_diag_layer_name(d, target), kind_of(d, target),
              prec_label(d, target), c->oname, okind,
              probe_diag_layer_name(d, target));
  else
    set_title(f, "%s in '%s' (%s), a layer that already runs in FP32: what "
                 "it received was produced in %s upstream",
              probe_diag_event_name(d->event), c->oname, okind,
              probe__diag_prec_label(probe__diag_range_prec(d, d->origin_layer)));
  add_evidence(f, "step %lld, %s: %s", (long long)d->event_step,
               probe_phase_name(d->event_phase),
               probe__diag_event_text(d));
  if (d->event_evidence[0]) add_evidence(f, "%s", d->event_evidence);
  else if (d->have_origin_in && !probe_stats_nonfinite(&d->origin_in))
    add_evidence(f, "its input was finite (absmax %.4g, %llu zeros) and its "
                    "%s holds %llu NaN, %llu inf",
                 d->origin_in.absmax,
                 (unsigned long long)d->origin_in.zero_count,
                 probe_site_name(d->origin_site),
                 (unsigned long long)d->origin_out.nan_count,
                 (unsigned long long)(d->origin_out.posinf_count +
                                      d->origin_out.neginf_count));
  if (d->origin_precision_weak) f->weak_evidence = 1;
  /* the rule held for every input of the call, not only the one read */
  char all[48] = "";
  if (d->origin_in_count > 1)
    snprintf(all, sizeof all, " (all %d of its inputs)", (int)d->origin_in_count);
  if (d->origin_precision_weak &&
      d->layers[d->origin_layer].info.kind != PROBE_KIND_OTHER)
    add_evidence(f, "weak evidence for BF16: '%s' (%s) made NaN and no inf "
                    "from finite values within BF16's range%s, none flushed; "
                    "its op makes NaN of finite values only through an inf, "
                    "and BF16 has FP32's range (~3.39e38 against ~3.40e38): "
                    "only a value in the 0.4%% between them is BF16's doing",
                 c->oname, okind, all);
  else if (d->origin_precision_weak)
    add_evidence(f, "weak evidence for %s: '%s' is a custom module (kind "
                    "other, its op unknown) that made NaN and no inf from "
                    "finite values within %s's range%s, none flushed; no "
                    "record shows an overflow or an underflow, and its op may "
                    "make that NaN in any precision",
                 prec_label(d, d->origin_layer), c->oname,
                 prec_label(d, d->origin_layer), all);
  /* a BF16 overflow that FP32 holds (bf16_within_fp32): by a sliver */
  if (target == d->origin_layer && !d->origin_precision_weak &&
      (d->event == PROBE_DIAG_EVENT_OVERFLOW ||
       d->event == PROBE_DIAG_EVENT_REDUCTION_OVERFLOW ||
       d->event == PROBE_DIAG_EVENT_GRAD_OVERFLOW) &&
      bf16_within_fp32(d))
    add_evidence(f, "the records place its values within FP32's range (%s "
                    "%.6g <= %.6g), which BF16's largest (%.6g) falls short "
                    "of: FP32 holds them, with less than 0.4%% to spare, so "
                    "find why they are this large too (the learning rate, "
                    "the inputs, the weights)",
                 d->have_origin_in && d->origin_in.absmax > PROBE__DIAG_BF16_MAX
                     ? "its input's absmax"
                     : "the bound its inputs allow",
                 d->have_origin_in && d->origin_in.absmax > PROBE__DIAG_BF16_MAX
                     ? (double)d->origin_in.absmax
                     : d->origin_bound,
                 FP32_MAX, PROBE__DIAG_BF16_MAX);
  if (d->n_history >= 2) {
    const probe_diag_history_point *a = &d->history[0];
    const probe_diag_history_point *z = &d->history[d->n_history - 1];
    add_evidence(f, "headroom log2(%s/absmax) went %.2f -> %.2f over steps "
                    "%lld..%lld",
                 probe__diag_range_prec(d, d->origin_layer) == PROBE_DTYPE_BF16
                     ? "3.39e38"
                     : "65504",
                 a->headroom, z->headroom, (long long)a->step,
                 (long long)z->step);
  }
  if (d->event == PROBE_DIAG_EVENT_UNDERFLOW_TO_INF && d->feeder_layer >= 0 &&
      d->have_origin_in && d->origin_in.zero_count > 0) { /* its input's zeros */
    if (d->feeder_layer == d->origin_layer) /* a module called twice */
      add_evidence(f, "its own call %d fed it (call %d) values that had "
                      "underflowed to zero",
                   (int)d->feeder_call, (int)d->origin_call);
    else
      add_evidence(f, "'%s' (%s) fed it values that had underflowed to zero",
                   probe_diag_layer_name(d, d->feeder_layer),
                   kind_of(d, d->feeder_layer));
  }
  if (d->first_nonfinite_loss_step < 0 && d->scaling_on && d->scale_collapsed)
    add_evidence(f, "the loss stayed finite, but the loss scale collapsed: "
                    "the run diverged");
  else if (d->first_nonfinite_loss_step < 0)
    add_evidence(f, "the loss stayed finite: a silent fault, the run is "
                    "degraded, not healthy");
  if (c->prior[0])
    add_evidence(f, "this run already kept '%s' in FP32; the candidates "
                    "include it",
                 c->prior);
  else
    add_evidence(f, "a second culprit can hide behind the first: run "
                    "postmortem again on the fixed run");
  if (loss_target || at_input)
    set_next(f, "check what reached '%s' at step %lld: the data (targets, "
                "entries of a dict batch) and the code between modules; "
                "forcing layers to FP32 will not help",
             c->oname, (long long)d->event_step);
  else if (cands)
    set_next_bisect(f, cands, c->args);
  else
    set_next(f, "find the %s layer upstream of '%s': 'ampprobe diff' this "
                "trace against a full trace of %s",
             probe__diag_prec_label(probe__diag_range_prec(d, d->origin_layer)),
             c->oname, c->run_fp32);
  /* weak evidence: the FP32 run says first whether the precision is it */
  if (cands && !at_input && !loss_target && d->origin_precision_weak) {
    char b[sizeof f->next_step];
    memcpy(b, f->next_step, sizeof b);
    set_next(f, "check first whether '%s' makes NaN in FP32 too (%s): if it "
                "does, fix its op (a sqrt or log of a negative, 0/0); if not, "
                "%s",
             c->oname, c->run_fp32, b);
  }
  /* the recorded data holds the values beyond FP16's range: scale it */
  if (cands && !at_input && !loss_target &&
      strncmp(d->event_evidence, PROBE__DIAG_RAW_INPUT,
              sizeof PROBE__DIAG_RAW_INPUT - 1) == 0) {
    char b[sizeof f->next_step];
    memcpy(b, f->next_step, sizeof b);
    set_next(f, "normalise or scale the input data so it fits FP16 (it "
                "holds values beyond 65504), or keep the layers it reaches "
                "in FP32: %s", b);
  }
}

/* force-fp32 (silent fault): a normalisation collapsed, or a forward
 * intermediate held inf/NaN after warm-up, with no event naming it. */
static int when_silent(const rank_ctx *c) {
  const probe_diag *d = c->d;
  return d->silent_layer >= 0 && d->silent_layer != d->origin_layer;
}
static double score_silent(const rank_ctx *c) { (void)c; return SCORE_SILENT; }
static void explain_silent(rank_ctx *c, probe_diag_finding *f) {
  const probe_diag *d = c->d;
  int32_t s = d->silent_layer;
  const probe_diag_layer *l = &d->layers[s];
  const probe_diag_collapse *k = &l->collapse;
  if (k->steps > 0)
    set_title(f, "'%s' (%s) collapsed in %s after warm-up: its output no "
                 "longer depends on its input (the loss stayed finite)",
              l->display, kind_of(d, s), prec_label(d, s));
  else
    set_title(f, "'%s' (%s) held inf/NaN in the forward pass after warm-up "
                 "while the loss stayed finite",
              l->display, kind_of(d, s));
  if (k->steps > 0) {
    add_evidence(f, "%lld steps after warm-up (step %lld on), first at step "
                    "%lld",
                 (long long)k->steps, (long long)d->warmup_end,
                 (long long)k->first_step);
    if (k->saved_inf)
      add_evidence(f, "its saved statistic (variance / sum of squares) "
                      "overflowed: inf/NaN at step %lld",
                   (long long)k->first_step);
    if (k->saved_zero_rstd)
      add_evidence(f, "its saved statistic holds %llu exact zeros of %llu: a "
                      "1/std of 0 means the variance was inf; a variance of 0 "
                      "that its input does not explain means it was lost",
                   (unsigned long long)k->saved_zero,
                   (unsigned long long)k->saved_count);
    else if (k->saved_zero)
      add_evidence(f, "its %s variance is exactly 0 in %llu of %llu "
                      "features while its input varies: precision lost, "
                      "those outputs are the bias",
                   prec_label(d, s), (unsigned long long)k->saved_zero,
                   (unsigned long long)k->saved_count);
    if (isfinite(k->out_var))
      add_evidence(f, "output variance %.3g against input variance %.3g "
                      "(whole tensors; collapse threshold %.0e of its "
                      "weights' mean square)",
                   k->out_var, k->in_var, PROBE_DIAG_COLLAPSE_VAR_FRAC);
    int32_t r = d->resolution_layer;
    if (resolution_fires(d) && r != s && r < s)
      add_evidence(f, "upstream, the input of '%s' was below %s's resolution "
                      "(data-resolution): what '%s' normalises may be "
                      "constant already; keeping '%s' alone in FP32 will "
                      "not restore it",
                   d->layers[r].display, prec_label(d, r), l->display,
                   l->display);
  } else {
    add_evidence(f, "%lld steps after warm-up with inf/NaN in its forward "
                    "outputs, first at step %lld",
                 (long long)l->fwd_nonfinite_steps,
                 (long long)l->fwd_nonfinite_first);
  }
  if (d->silent_layers > 1)
    add_evidence(f, "%lld layers show silent faults; '%s' is the first in "
                    "execution order",
                 (long long)d->silent_layers, l->display);
  add_evidence(f, "a silent fault: the run is degraded, not healthy ('ampprobe "
                  "diff' against the FP32 run shows how far it drifts)");
  const char *cands = d->fp32_candidates[0] ? d->fp32_candidates : kind_of(d, s);
  set_next_bisect(f, cands, c->args);
}

/* data-resolution: the FP32 values entering an FP16/BF16 layer vary, but
 * by less than that precision's spacing at their level (diagnose.c,
 * below_resolution); the layer computes on (nearly) one value. */
static int when_resolution(const rank_ctx *c) { return resolution_fires(c->d); }
static double score_resolution(const rank_ctx *c) {
  (void)c;
  return SCORE_DATA_RESOLUTION;
}
static void explain_resolution(rank_ctx *c, probe_diag_finding *f) {
  const probe_diag *d = c->d;
  int32_t r = d->resolution_layer;
  const probe_diag_layer *l = &d->layers[r];
  const probe_diag_resolution *rs = &l->resolution;
  const char *p = prec_label(d, r);
  char what[PROBE_NAME_MAX * 4 + 40];
  if (rs->from_input)
    snprintf(what, sizeof what, "the input's variation");
  else
    snprintf(what, sizeof what, "the variation of the input of '%s'", l->display);
  set_title(f, "%s (std %.3g at level %.5g) is below %s's spacing there "
               "(%.3g): '%s' (%s) sees it as constant",
            what, rs->std, fabs(rs->mean), p, rs->spacing, l->display,
            kind_of(d, r));
  add_evidence(f, "the FP32 input of '%s' at step %lld: mean %.6g, std %.3g, "
                  "range %.6g .. %.6g; %s's spacing at %.6g is %.3g",
               l->display, (long long)rs->first_step, rs->mean, rs->std,
               rs->min, rs->max, p, rs->level, rs->spacing);
  add_evidence(f, "below resolution (std < %.1f of the spacing, or max - min "
                  "< the spacing) on %lld of %lld steps",
               PROBE_DIAG_RESOLUTION_STD_FRAC, (long long)rs->steps,
               (long long)rs->seen);
  if (rs->by_range)
    add_evidence(f, "the std from sum/sumsq is unreliable at this level "
                    "(cancellation); the range decided it");
  if (rs->uncertain > 0)
    add_evidence(f, "%lld steps undecided: the sums' cancellation bound "
                    "straddles the threshold",
                 (long long)rs->uncertain);
  for (int64_t i = r; i < d->n_layers; i++)
    if (d->layers[i].collapse.steps > 0) {
      add_evidence(f, "'%s' (%s) collapsed downstream (silent fault): its "
                      "input was constant in what it normalises, this lost "
                      "variation, not its own precision",
                   d->layers[i].display, kind_of(d, (int32_t)i));
      break;
    }
  add_evidence(f, "whole-tensor statistics: a spread within each feature "
                  "below the spacing, with features at unlike levels, is "
                  "not seen");
  char b[PROBE_DIAG_TEXT_MAX * 2];
  const char *cands = d->fp32_candidates[0] ? d->fp32_candidates : kind_of(d, r);
  set_next_bisect(f, cands, c->args);
  snprintf(b, sizeof b, "%s", f->next_step);
  set_next(f, "%s '%s' in FP32: %s",
           rs->from_input ? "centre or normalise the input data (subtract its "
                            "level, or standardise it), or keep"
                          : "remove the offset before it (centre or "
                            "normalise), or keep",
           l->display, b);
}

/* A scale below 1 shrinks the gradients instead of lifting them: loss
 * scaling is then as good as off (or worse). */
static int scale_too_small(const probe_diag *d) {
  return d->scaling_on && isfinite(d->scale_last) && d->scale_last < 1.0;
}

/* enable-loss-scaling: gradients flush to zero without loss scaling, or
 * with a scale below 1. */
static int when_scaling(const rank_ctx *c) {
  const probe_diag *d = c->d;
  return (!d->scaling_on || scale_too_small(d)) && !c->has_event &&
         !d->fp32_run && d->worst_underflow_layer >= 0 &&
         d->worst_underflow_frac >= UNDERFLOW_FRAC;
}
static double score_scaling(const rank_ctx *c) { (void)c; return SCORE_LOSS_SCALING; }
static void explain_scaling(rank_ctx *c, probe_diag_finding *f) {
  const probe_diag *d = c->d;
  const probe_diag_layer *wl = &d->layers[d->worst_underflow_layer];
  char b1[32], b2[32];
  if (scale_too_small(d)) {
    set_title(f, "gradients underflow in FP16: the loss scale is below 1");
    add_evidence(f, "loss scale %.6g at the end (%.6g at the start): it "
                    "shrinks the gradients instead of lifting them",
                 d->scale_last, d->scale_first);
  } else {
    set_title(f, "gradients underflow in FP16 without loss scaling");
    add_evidence(f, "%s", d->scaling_from_config
                              ? "loss scaling is off (the run's config)"
                              : "loss scaling is off (loss_scale 1 at every "
                                "step)");
  }
  uint64_t c0 = wl->grad_count[0], c1 = wl->grad_count[1];
  char f0[16] = "n/a", f1[16] = "n/a";
  if (c0)
    snprintf(f0, sizeof f0, "%.1f%%",
             100.0 * (double)wl->grad_subnormal[0] / (double)c0);
  if (c1)
    snprintf(f1, sizeof f1, "%.1f%%",
             100.0 * (double)wl->grad_subnormal[1] / (double)c1);
  add_evidence(f, "'%s': %.1f%% of its gradient values are subnormal or "
                  "flush to zero in FP16 (first half %s, second half %s)",
               wl->display, 100.0 * d->worst_underflow_frac, f0, f1);
  if (d->entry_flush_step >= 0)
    add_evidence(f, "the gradient '%s' hands to '%s' (absmax %.3g at step "
                    "%lld) is below FP16's smallest subnormal (%.3g): it "
                    "flushes to zero at the cast, in %lld steps, and every "
                    "gradient behind it is 0",
                 d->layers[d->entry_flush_from].display,
                 d->layers[d->entry_flush_to].display, d->entry_flush_absmax,
                 (long long)d->entry_flush_step, PROBE_F16_MIN_SUBNORMAL,
                 (long long)d->layers[d->entry_flush_to].entry_flush_steps);
  fmt_loss(b1, sizeof b1, d->first_loss);
  fmt_loss(b2, sizeof b2, d->last_loss);
  add_evidence(f, "loss %s -> %s over %lld steps", b1, b2,
               (long long)d->n_steps);
  if (d->cfg_external)
    set_next(f, "enable dynamic loss scaling (torch.amp.GradScaler, init "
                "scale 65536) and run %s again",
             c->run_same);
  else
    set_next(f, "enable dynamic loss scaling: %s without --no-loss-scale "
                "(init scale 65536)",
             c->run_same);
}

/* scale-collapse: the scaler cannot keep up (not when the skips follow
 * from non-finite losses: a symptom then). */
static int when_collapse(const rank_ctx *c) {
  const probe_diag *d = c->d;
  /* the steps the scaler found non-finite gradients at: skipped, or (two
   * optimizers, one of which stepped) only found_inf */
  int64_t bad = d->skipped_steps > d->found_inf_steps ? d->skipped_steps
                                                      : d->found_inf_steps;
  return d->scaling_on && d->scale_collapsed &&
         !(c->has_event && 2 * d->nonfinite_loss_steps >= bad);
}
static double score_collapse(const rank_ctx *c) {
  return c->has_event ? SCORE_SCALE_COLLAPSE_EVENT : SCORE_SCALE_COLLAPSE;
}
static void explain_collapse(rank_ctx *c, probe_diag_finding *f) {
  const probe_diag *d = c->d;
  if (d->never_stepped)
    set_title(f, "no optimizer step was taken: all %lld steps were skipped "
                 "(non-finite gradients every step), the weights never changed",
              (long long)d->n_steps);
  else if (d->trailing_skip_run >= PROBE_DIAG_COLLAPSE_TRAILING_SKIPS)
    set_title(f, "the run stopped training: its last %lld steps (from step "
                 "%lld) were all skipped, the loss scale still backing off",
              (long long)d->trailing_skip_run,
              (long long)d->trailing_skip_start);
  else if (d->min_clamps > 0)
    set_title(f, "the loss scale collapsed: %lld backoffs, %lld min-scale "
                 "clamps, %lld skipped steps",
              (long long)d->backoffs, (long long)d->min_clamps,
              (long long)d->skipped_steps);
  else if (d->found_inf_steps > d->skipped_steps)
    set_title(f, "the loss scale collapsed: %lld backoffs, %lld steps with "
                 "non-finite gradients, of which %lld skipped by every "
                 "optimizer (in the others one optimizer skipped while "
                 "another stepped)",
              (long long)d->backoffs, (long long)d->found_inf_steps,
              (long long)d->skipped_steps);
  else
    set_title(f, "the loss scale collapsed: %lld backoffs, %lld skipped steps",
              (long long)d->backoffs, (long long)d->skipped_steps);
  add_evidence(f, "scale %.6g -> %.6g (min %.6g); longest skip run %lld steps "
                  "from step %lld",
               d->scale_first, d->scale_last, d->scale_min,
               (long long)d->longest_skip_run,
               (long long)d->longest_skip_start);
  int32_t top = -1;
  for (int64_t i = 0; i < d->n_layers; i++)
    if (d->layers[i].backoff_steps > 0 &&
        (top < 0 || d->layers[i].backoff_steps > d->layers[top].backoff_steps))
      top = (int32_t)i;
  char cands[128] = "";
  if (top >= 0) {
    add_evidence(f, "'%s' held non-finite gradients in %lld overflow steps",
                 d->layers[top].display,
                 (long long)d->layers[top].backoff_steps);
    add_candidate(cands, sizeof cands, kind_of(d, top));
  }
  /* no layer to keep in FP32: an FP32 run, or skips made by an op in any
   * precision (not-precision's event); bisect would find nothing */
  if (d->fp32_run && d->origin_layer < 0)
    set_next(f, "every layer ran in FP32: find what makes the gradients "
                "non-finite (a 0/0, a log or division of 0); forcing layers "
                "to FP32 will not help");
  else if (d->origin_layer >= 0 && c->has_event &&
           (d->fp32_run || no_precision_cause(d)))
    set_next(f, "fix what makes '%s' non-finite at step %lld (the "
                "not-precision finding): every step it reaches is skipped",
             c->oname, (long long)d->event_step);
  else if (cands[0])
    set_next_bisect(f, cands, c->args);
  else
    set_next(f, "check the FP32 baseline: %s", c->run_fp32);
}

/* loss-diverging: every loss finite, but its running median rose
 * PROBE_DIAG_DIVERGE_FACTOR times or more above the lowest it reached
 * (diagnose_trend.c). Not when the lr signature already said it. */
static int when_loss_diverging(const rank_ctx *c) {
  return c->d->loss_diverged && !c->lr_signature;
}
static double score_loss_diverging(const rank_ctx *c) {
  (void)c;
  return SCORE_LOSS_DIVERGING;
}
/* The layer that grew first, and the weights' growth. */
static void diverging_layers(rank_ctx *c, probe_diag_finding *f) {
  const probe_diag *d = c->d;
  if (d->diverge_layer >= 0)
    add_evidence(f, "'%s' (%s) grew first: its %s reached %.3gx their largest "
                    "up to step %lld at step %lld",
                 probe_diag_layer_name(d, d->diverge_layer),
                 kind_of(d, d->diverge_layer),
                 d->diverge_layer_bwd ? "gradients (unscaled)" : "activations",
                 d->diverge_layer_growth, (long long)d->loss_best_step,
                 (long long)d->diverge_layer_step);
  else if (d->n_records > 0)
    add_evidence(f, "no layer's activations or gradients grew %.3gx past their "
                    "largest up to step %lld in the records",
                 PROBE_DIAG_DIVERGE_LAYER_GROWTH, (long long)d->loss_best_step);
  if (isfinite(c->wgrowth) && c->wgrowth > 1.0)
    add_evidence(f, "the largest weight grew %.3gx (|w| %.3g -> %.3g)",
                 c->wgrowth, d->master_absmax_first, d->master_absmax_last);
}
static void explain_loss_diverging(rank_ctx *c, probe_diag_finding *f) {
  const probe_diag *d = c->d;
  char b1[32], b2[32];
  fmt_loss(b1, sizeof b1, d->loss_best_median);
  fmt_loss(b2, sizeof b2, d->loss_last_median);
  set_title(f, "the loss diverged while staying finite: it rose %.3gx from "
               "step %lld to step %lld (%s -> %s)",
            d->loss_growth, (long long)d->loss_best_step,
            (long long)d->last_step, b1, b2);
  add_evidence(f, "median of the last %d losses: lowest %s at step %lld, "
                  "%.3gx that from step %lld, %s at the last step %lld; no "
                  "inf/NaN in the loss",
               (int)d->loss_window, b1, (long long)d->loss_best_step,
               PROBE_DIAG_DIVERGE_FACTOR, (long long)d->loss_rise_step, b2,
               (long long)d->last_step);
  diverging_layers(c, f);
  if (d->loss_best_lr > 0 && d->loss_last_lr >= DIVERGE_LR_RISE * d->loss_best_lr)
    add_evidence(f, "the learning rate rose %.3gx meanwhile: %.4g at step %lld, "
                    "%.4g at the last step",
                 d->loss_last_lr / d->loss_best_lr, d->loss_best_lr,
                 (long long)d->loss_best_step, d->loss_last_lr);
  if (d->fp32_run)
    add_evidence(f, "every layer ran in FP32: not a precision problem");
  if (d->lr_spike_step >= 0 && d->lr_spike_step <= d->last_step) {
    add_evidence(f, "the learning rate spiked at step %lld: %.4g, %.3gx the "
                    "%.4g of the step before",
                 (long long)d->lr_spike_step, d->lr_spike,
                 d->lr_spike / d->lr_spike_base, d->lr_spike_base);
    set_next(f, "fix the learning-rate schedule at step %lld; then check the "
                "data of steps %lld..%lld and clip the gradients (after "
                "unscaling)",
             (long long)d->lr_spike_step, (long long)d->loss_best_step,
             (long long)d->loss_rise_step);
    return;
  }
  set_next(f, "lower the learning rate (or warm it up), check the data of "
              "steps %lld..%lld (outliers, bad labels), and clip the gradients "
              "by norm (after unscaling)%s",
           (long long)d->loss_best_step, (long long)d->loss_rise_step,
           d->fp32_run ? "; forcing layers to FP32 will not help" : "");
}

/* weights-stagnant: weights the optimizer steps stopped changing
 * (diagnose_trend.c, docs/precision.md "Weights that stop changing"). */
static int when_stagnant(const rank_ctx *c) { return probe__diag_stag_fires(c->d); }
static double score_stagnant(const rank_ctx *c) {
  (void)c;
  return SCORE_STAGNANT;
}
static void explain_stagnant(rank_ctx *c, probe_diag_finding *f) {
  probe__diag_stag_explain(c->d, f);
}

/* skip-streak: a long streak of skipped steps mid-run, the scale backing
 * off at each, after which the run trained again (at the end of the
 * trace it is scale-collapse's). Not when most of its steps had a
 * non-finite loss: the loss's findings say that. */
static int when_skip_streak(const rank_ctx *c) {
  const probe_diag *d = c->d;
  return d->skip_streak_start >= 0 &&
         2 * d->skip_streak_loss_nf < d->skip_streak_len;
}
static double score_skip_streak(const rank_ctx *c) {
  (void)c;
  return SCORE_SKIP_STREAK;
}
static void explain_skip_streak(rank_ctx *c, probe_diag_finding *f) {
  const probe_diag *d = c->d;
  int32_t l = d->skip_streak_layer;
  set_title(f, "%lld consecutive steps were skipped mid-run (steps "
               "%lld..%lld): the weights did not change for that stretch",
            (long long)d->skip_streak_len, (long long)d->skip_streak_start,
            (long long)d->skip_streak_end);
  add_evidence(f, "loss scale %.6g at step %lld, %.6g when the run stepped "
                  "again at step %lld; a routine backoff skips 1 or 2",
               d->skip_streak_scale_from, (long long)d->skip_streak_start,
               d->skip_streak_scale_to, (long long)d->skip_streak_end + 1);
  if (d->skip_streaks > 1)
    add_evidence(f, "%lld streaks of %d or more skipped steps; this is the "
                    "longest", (long long)d->skip_streaks, PROBE_DIAG_SKIP_STREAK);
  char cands[128] = "";
  if (l >= 0) {
    add_evidence(f, "'%s' (%s, %s) made the first non-finite gradient in %lld "
                    "of those steps",
                 probe_diag_layer_name(d, l), kind_of(d, l), prec_label(d, l),
                 (long long)d->skip_streak_layer_steps);
    if (!layer_is_fp32(d, l)) add_layer_candidate(cands, sizeof cands, d, l);
  } else {
    add_evidence(f, "no per-layer record of those steps shows which gradient "
                    "overflowed (record them to see it)");
  }
  if (cands[0])
    set_next(f, "check the data of steps %lld..%lld and whether the "
                "gradients of '%s' grew there (lower the learning rate or clip "
                "after unscaling); if they overflow only in %s: ampprobe "
                "bisect --fp32-candidates %s %s",
             (long long)d->skip_streak_start, (long long)d->skip_streak_end,
             probe_diag_layer_name(d, l), prec_label(d, l), cands, c->args);
  else
    set_next(f, "check the data of steps %lld..%lld (a batch that makes the "
                "gradients non-finite) and whether the gradients grew there "
                "(lower the learning rate, or clip after unscaling)",
             (long long)d->skip_streak_start, (long long)d->skip_streak_end);
}

/* loss-outside: the loss went non-finite while every value its step's
 * forward recorded was finite (diagnose.c, loss_outside_modules wrote the
 * evidence): the loss computation, outside the recorded modules, made it.
 * Not a learning rate and not a module to keep in FP32. */
static int when_loss_outside(const rank_ctx *c) { return loss_outside(c->d); }
static double score_loss_outside(const rank_ctx *c) { (void)c; return SCORE_LOSS_OUTSIDE; }
static void explain_loss_outside(rank_ctx *c, probe_diag_finding *f) {
  const probe_diag *d = c->d;
  int32_t in = d->event == PROBE_DIAG_EVENT_LOSS_ONLY ? d->feeder_layer
                                                       : d->origin_layer;
  int fp32_in = in < 0 || layer_is_fp32(d, in);
  if (!fp32_in && !d->fp32_run) f->id = PROBE_DIAG_FINDING_FORCE_FP32;
  set_title(f, "the loss went non-finite at step %lld outside the recorded "
               "modules: every value the step's forward recorded was finite",
            (long long)d->event_step);
  add_evidence(f, "%s", d->event_evidence);
  set_next(f, "look at how the training loop computes the loss of step %lld "
              "(a log of a probability that is 0: take it from the logits with "
              "log_softmax or cross_entropy; a division by a sum or norm that is "
              "0)%s; the gradients and weights that went non-finite after it "
              "are its consequence",
           (long long)d->event_step,
           fp32_in || d->fp32_run
               ? ""
               : probe__diag_range_prec(d, in) == PROBE_DTYPE_BF16
                   ? "; compute it in FP32 (e.g. loss_fn(out.float(), "
                     "target)), since its input is BF16"
                   : "; compute it in FP32 (e.g. loss_fn(out.float(), "
                     "target)), since its input is FP16");
}

/* lower-lr (fallback): a non-finite loss and no per-layer record. */
static int when_loss_only(const rank_ctx *c) {
  const probe_diag *d = c->d;
  return d->n_findings == 0 && d->event == PROBE_DIAG_EVENT_LOSS_ONLY &&
         !loss_outside(d) && d->first_nonfinite_loss_step >= 0;
}
static double score_loss_only(const rank_ctx *c) { (void)c; return SCORE_LOSS_ONLY; }
static void explain_loss_only(rank_ctx *c, probe_diag_finding *f) {
  const probe_diag *d = c->d;
  set_title(f, "the loss went non-finite at step %lld",
            (long long)d->first_nonfinite_loss_step);
  add_evidence(f, "no per-layer record in the trace shows where (record with "
                  "--trace to see the origin)");
  if (d->cfg_external)
    set_next(f, "re-run %s with per-layer records (a full trace), then check "
                "the FP32 baseline: %s",
             c->run_same, c->run_fp32);
  else
    set_next(f, "re-run with per-layer records: 'ampprobe run --trace %s', "
                "then check the FP32 baseline: %s",
             c->args, c->run_fp32);
}

/* no-steps: a trace without a single step says nothing about the run; an
 * unclosed one is a run that died (or ran out of disk) before its first
 * step reached the file. Not "healthy". */
static int when_no_steps(const rank_ctx *c) { return c->d->n_steps == 0; }
static double score_no_steps(const rank_ctx *c) { (void)c; return SCORE_NO_STEPS; }
static void explain_no_steps(rank_ctx *c, probe_diag_finding *f) {
  set_title(f, "no step recorded: nothing to diagnose");
  if (c->d->complete)
    add_evidence(f, "the trace was closed with 0 steps: the job ended before "
                    "its first step, or never called end_step");
  else if (c->d->aborted[0])
    add_evidence(f, "the job ended by %s before its first step ended; the "
                    "tracer closed the trace with 0 steps", c->d->aborted);
  else
    add_evidence(f, "the trace was not closed and holds 0 steps: the writer "
                    "was killed, or could not write (a full disk?), before its "
                    "first step reached the file");
  set_next(f, "find why the run ended (its exit status and error line), then "
              "run it again");
}

/* not-closed: the writer never closed the trace (killed, crashed, out of
 * disk, or the job still runs). What it holds may be clean, but a run that
 * died is no healthy one: a killed trace said "healthy", exit 0, while the
 * same file in a rank set was degraded (hunt, 2026-12-04). With steps only:
 * no-steps says the rest. */
static int when_not_closed(const rank_ctx *c) {
  return !c->d->complete && c->d->n_steps > 0;
}
static double score_not_closed(const rank_ctx *c) { (void)c; return SCORE_NOT_CLOSED; }
static void explain_not_closed(rank_ctx *c, probe_diag_finding *f) {
  const probe_diag *d = c->d;
  if (d->aborted[0]) /* the abort mark: the writer closed, the job did not end */
    set_title(f, d->aborted_step >= 0
                     ? "the job ended by %s in step %lld (closed half done); "
                       "its trace was closed by the tracer"
                     : "the job ended by %s after step %lld; its trace was "
                       "closed by the tracer",
              d->aborted,
              (long long)(d->aborted_step >= 0 ? d->aborted_step : d->last_step));
  else
    set_title(f, "the trace was not closed: the run stopped after step %lld "
                 "(killed, crashed or out of disk), or it still runs",
              (long long)d->last_step);
  add_evidence(f, "%lld steps recorded (%lld..%lld), %s",
               (long long)d->n_steps, (long long)d->first_step,
               (long long)d->last_step,
               d->aborted[0] ? "then the tracer closed the trace: the run did "
                               "not finish"
                             : "the last one flushed before the writer stopped");
  if (d->event_step < 0 && d->first_nonfinite_loss_step < 0)
    add_evidence(f, "no non-finite value in the steps recorded: what stopped "
                    "the run is not in the trace");
  if (d->aborted[0])
    set_next(f, "find why the job ended (%s), then run it again", d->aborted);
  else
    set_next(f, "if the job still runs, look again when it ends; else find "
                "why it stopped (its exit status, the OOM killer in dmesg, "
                "the scheduler's log)");
}

/* healthy (fallback): nothing else fired. */
static int when_healthy(const rank_ctx *c) {
  return c->d->n_findings == 0 && c->d->silent_layer < 0;
}
static double score_healthy(const rank_ctx *c) { (void)c; return SCORE_HEALTHY; }
static void explain_healthy(rank_ctx *c, probe_diag_finding *f) {
  const probe_diag *d = c->d;
  char b1[32], b2[32];
  set_title(f, "healthy: no problem found");
  fmt_loss(b1, sizeof b1, d->first_loss);
  fmt_loss(b2, sizeof b2, d->last_loss);
  add_evidence(f, "every loss finite; loss %s -> %s over %lld steps", b1, b2,
               (long long)d->n_steps);
  if (d->scaling_on)
    add_evidence(f, "%lld backoffs (%lld after warm-up), %lld skipped steps; "
                    "scale %.6g -> %.6g",
                 (long long)d->backoffs, (long long)d->late_backoffs,
                 (long long)d->skipped_steps, d->scale_first, d->scale_last);
  int32_t tight = -1;
  for (int64_t i = 0; i < d->n_layers; i++)
    if (isfinite(d->layers[i].min_fwd_headroom) &&
        (tight < 0 ||
         d->layers[i].min_fwd_headroom < d->layers[tight].min_fwd_headroom))
      tight = (int32_t)i;
  if (tight >= 0)
    add_evidence(f, "tightest FP16 headroom: '%s' %.2f binades (step %lld)",
                 d->layers[tight].display, d->layers[tight].min_fwd_headroom,
                 (long long)d->layers[tight].min_fwd_headroom_step);
  if (d->clipping_on && d->clip_steps_seen > 0)
    add_evidence(f, "%lld of %lld steps clipped, largest clip ratio %.3g",
                 (long long)d->clipped_steps, (long long)d->clip_steps_seen,
                 d->max_clip_ratio);
  else if (d->clipping_on)
    add_evidence(f, "clipping on (threshold %g), but no step recorded a "
                    "finite gradient norm",
                 d->clip_threshold);
  set_next(f, "nothing to fix");
}

static const rule RULES[] = {
    {"input-nan", PROBE_DIAG_FINDING_CLEAN_INPUT, when_input, score_input,
     explain_input},
    {"weights-nonfinite", PROBE_DIAG_FINDING_CHECK_WEIGHTS, when_weights,
     score_weights, explain_weights},
    {"clip-before-unscale", PROBE_DIAG_FINDING_FIX_CLIP_ORDER, when_clip,
     score_clip, explain_clip},
    {"lr-signature", PROBE_DIAG_FINDING_LOWER_LR, when_lr, score_lr,
     explain_lr},
    {"fp16-event", PROBE_DIAG_FINDING_FORCE_FP32, when_event, score_event,
     explain_event},
    {"fp32-event", PROBE_DIAG_FINDING_NOT_PRECISION, when_not_precision,
     score_not_precision, explain_not_precision},
    {"allreduce-event", PROBE_DIAG_FINDING_FIX_ALLREDUCE, when_allreduce,
     score_allreduce, explain_allreduce},
    {"data-resolution", PROBE_DIAG_FINDING_DATA_RESOLUTION, when_resolution,
     score_resolution, explain_resolution},
    {"silent-fault", PROBE_DIAG_FINDING_FORCE_FP32, when_silent, score_silent,
     explain_silent},
    {"grad-underflow", PROBE_DIAG_FINDING_ENABLE_LOSS_SCALING, when_scaling,
     score_scaling, explain_scaling},
    {"scale-collapse", PROBE_DIAG_FINDING_SCALE_COLLAPSE, when_collapse,
     score_collapse, explain_collapse},
    {"loss-outside", PROBE_DIAG_FINDING_NOT_PRECISION, when_loss_outside,
     score_loss_outside, explain_loss_outside},
    {"loss-only", PROBE_DIAG_FINDING_LOWER_LR, when_loss_only, score_loss_only,
     explain_loss_only},
    {"skip-streak", PROBE_DIAG_FINDING_SKIP_STREAK, when_skip_streak,
     score_skip_streak, explain_skip_streak},
    {"loss-diverging", PROBE_DIAG_FINDING_LOWER_LR, when_loss_diverging,
     score_loss_diverging, explain_loss_diverging},
    {"weights-stagnant", PROBE_DIAG_FINDING_WEIGHTS_STAGNANT, when_stagnant,
     score_stagnant, explain_stagnant},
    {"no-steps", PROBE_DIAG_FINDING_NO_STEPS, when_no_steps, score_no_steps,
     explain_no_steps},
    {"not-closed", PROBE_DIAG_FINDING_NOT_CLOSED, when_not_closed,
     score_not_closed, explain_not_closed},
    {"healthy", PROBE_DIAG_FINDING_HEALTHY, when_healthy, score_healthy,
     explain_healthy},
};

/* diverged: the loss or the weights went non-finite, or the scaler never
 * recovered; degraded: anything else found (silent faults included);
 * healthy: nothing. */
static probe_verdict verdict_of(const probe_diag *d) {
  if (d->first_nonfinite_loss_step >= 0 ||
      d->event == PROBE_DIAG_EVENT_WEIGHT_NONFINITE ||
      (d->scaling_on && d->scale_collapsed))
    return PROBE_VERDICT_DIVERGED;
  if (d->silent_layer >= 0 || d->event != PROBE_DIAG_EVENT_NONE)
    return PROBE_VERDICT_DEGRADED;
  for (int i = 0; i < d->n_findings; i++)
    if (d->findings[i].id != PROBE_DIAG_FINDING_HEALTHY)
      return PROBE_VERDICT_DEGRADED;
  return PROBE_VERDICT_HEALTHY;
}

void probe__diag_rank(probe_diag *d) {
  rank_ctx c;
  memset(&c, 0, sizeof c);
  c.d = d;
  run_args(&c);
  c.oname = probe_diag_layer_name(d, d->origin_layer);
  c.has_event = d->event_step >= 0 || d->first_nonfinite_loss_step >= 0;
  candidates(&c);
  clip_order(d);
  int loss_climb = isfinite(d->loss_rise) && d->loss_rise >= LR_LOSS_CLIMB;
  c.wgrowth = (isfinite(d->master_absmax_first) && d->master_absmax_first > 0 &&
               isfinite(d->master_absmax_last))
                  ? d->master_absmax_last / d->master_absmax_first
                  : NAN;
  int weights_grew = isfinite(c.wgrowth) && c.wgrowth >= LR_WEIGHT_GROWTH;
  /* FP32: a divergence (loss or weights non-finite), not any NaN (a 0/0
   * in FP32 whose loss stayed finite is not-precision); never a NaN of the
   * input data (clean-input says it). */
  int fp32_diverged = d->fp32_run && (d->first_nonfinite_loss_step >= 0 ||
                                      d->event == PROBE_DIAG_EVENT_WEIGHT_NONFINITE);
  /* A learning rate acts through updates: none before the first step the
   * trace holds (its weights came from the initialisation or a
   * checkpoint), and in FP32 the updates must have shown it (the loss
   * climbed or the weights grew; else an op made the value: not-precision,
   * or the loss computation: loss-outside). */
  int updated = before_event_updates(d) && !probe__diag_weights_edited(d);
  /* weights changed between steps by something other than the optimizer
   * before the event: the loss may have climbed by that edit, so only the
   * growth the updates made (the edit divided out) counts */
  int64_t ev = d->event_step >= 0 ? d->event_step : d->first_nonfinite_loss_step;
  if (d->weights_edit_step >= 0 && d->weights_edit_step <= ev) loss_climb = 0;
  c.lr_signature = c.has_event && d->event != PROBE_DIAG_EVENT_INPUT_NAN &&
                   updated &&
                   ((fp32_diverged && !loss_outside(d) &&
                     (loss_climb || weights_grew)) ||
                    (loss_climb && weights_grew));

  d->n_findings = 0;
  for (size_t i = 0; i < sizeof RULES / sizeof RULES[0]; i++) {
    const rule *r = &RULES[i];
    if (d->n_findings >= PROBE_DIAG_MAX_FINDINGS || !r->when(&c)) continue;
    probe_diag_finding *f = &d->findings[d->n_findings++];
    memset(f, 0, sizeof *f);
    f->id = r->id;
    f->score = r->score(&c);
    r->explain(&c, f);
  }
  /* rank: stable sort by score, descending */
  for (int i = 1; i < d->n_findings; i++) {
    probe_diag_finding tmp = d->findings[i];
    int j = i - 1;
    while (j >= 0 && d->findings[j].score < tmp.score) {
      d->findings[j + 1] = d->findings[j];
      j--;
    }
    d->findings[j + 1] = tmp;
  }
  d->verdict = verdict_of(d);
}
