/*
 * libprobe/analysis/diagnose_trend.c - what the post-mortem reads from the
 * steps table besides non-finite values: a finite loss that diverges (its
 * running median against the lowest it reached) and a streak of skipped
 * steps in the middle of a run; and, in the records pass, the layer whose
 * values grew first and the weights that stopped changing (updates below
 * half the spacing of the format the weights are stored in). The
 * thresholds are in diagnose-impl.h (PROBE_DIAG_DIVERGE_*,
 * PROBE_DIAG_SKIP_STREAK, PROBE_DIAG_STAG_*); docs/precision.md says what
 * the findings made of them mean.
 *
 * Memory is fixed: a ring of at most PROBE_DIAG_DIVERGE_WINDOW_MAX losses,
 * whatever the number of steps; a few words per parameter followed.
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "diagnose-impl.h"

/* ---- the loss's trend ----------------------------------------------------- */

void probe__diag_trend_init(probe__loss_trend *t, probe_diag *d) {
  memset(t, 0, sizeof *t);
  int64_t w = d->n_steps / PROBE_DIAG_DIVERGE_WINDOW_DIV;
  if (w < PROBE_DIAG_DIVERGE_WINDOW_MIN) w = PROBE_DIAG_DIVERGE_WINDOW_MIN;
  if (w > PROBE_DIAG_DIVERGE_WINDOW_MAX) w = PROBE_DIAG_DIVERGE_WINDOW_MAX;
  t->w = (int32_t)w;
  d->loss_window = 0;
  d->loss_diverged = 0;
  d->loss_best_step = d->loss_rise_step = -1;
  d->loss_best_median = INFINITY;
  d->loss_last_median = d->loss_growth = NAN;
  d->loss_best_lr = d->loss_last_lr = NAN;
  t->lr = NAN;
  d->diverge_layer = -1;
  d->diverge_layer_step = -1;
  d->diverge_layer_growth = NAN;
}

/* Median of the n values of v (n <= PROBE_DIAG_DIVERGE_WINDOW_MAX): the
 * mean of the two middle ones when n is even. */
static double median_of(const double *v, int32_t n) {
  double s[PROBE_DIAG_DIVERGE_WINDOW_MAX];
  memcpy(s, v, (size_t)n * sizeof *s);
  for (int32_t i = 1; i < n; i++) { /* insertion sort: n is small */
    double x = s[i];
    int32_t j = i - 1;
    while (j >= 0 && s[j] > x) {
      s[j + 1] = s[j];
      j--;
    }
    s[j + 1] = x;
  }
  return n % 2 ? s[n / 2] : 0.5 * (s[n / 2 - 1] + s[n / 2]);
}

void probe__diag_trend_row(probe__loss_trend *t, probe_diag *d,
                           const probe_step_scalars *r) {
  if (!PROBE__UNMEASURED(r, PROBE__SC_LR) && isfinite(r->lr)) t->lr = r->lr;
  if (PROBE__UNMEASURED(r, PROBE__SC_LOSS) || !isfinite(r->loss)) return;
  if (r->loss < 0) t->negative = 1;
  t->ring[t->seen % t->w] = r->loss;
  t->seen++;
  if (t->seen < t->w) return;
  double m = median_of(t->ring, t->w);
  if (t->seen == t->w) t->first = m;
  d->loss_last_median = m;
  d->loss_last_lr = t->lr;
  if (m < d->loss_best_median) {
    d->loss_best_median = m;
    d->loss_best_step = r->step;
    d->loss_best_lr = t->lr;
    d->loss_rise_step = -1; /* a rise is counted from the lowest median */
  } else if (d->loss_rise_step < 0 &&
             m >= PROBE_DIAG_DIVERGE_FACTOR * d->loss_best_median) {
    d->loss_rise_step = r->step;
  }
}

void probe__diag_trend_end(probe__loss_trend *t, probe_diag *d) {
  int judged = t->seen >= 2 * (int64_t)t->w && !t->negative &&
               d->loss_best_median > 0 && isfinite(d->loss_best_median);
  if (!judged) {
    d->loss_best_step = d->loss_rise_step = -1;
    d->loss_best_median = d->loss_last_median = NAN;
    d->loss_best_lr = d->loss_last_lr = NAN;
    return;
  }
  d->loss_window = t->w;
  d->loss_growth = d->loss_last_median / d->loss_best_median;
  /* ...and ends above where it started: a loss that fell to ~0 and
   * drifts up by decades there (1e-6 to 1e-4 near convergence) is not a
   * run that came apart */
  d->loss_diverged = d->loss_growth >= PROBE_DIAG_DIVERGE_FACTOR &&
                     d->loss_last_median > t->first &&
                     d->first_nonfinite_loss_step < 0;
}

/* ---- skip streaks --------------------------------------------------------- */

void probe__diag_streak_init(probe__skip_streak *s, probe_diag *d) {
  memset(s, 0, sizeof *s);
  d->skip_streak_start = d->skip_streak_end = -1;
  d->skip_streak_len = d->skip_streak_loss_nf = d->skip_streaks = 0;
  d->skip_streak_scale_from = d->skip_streak_scale_to = NAN;
  d->skip_streak_layer = -1;
  d->skip_streak_layer_steps = 0;
}

/* A streak ends at a step the scaler did not skip (scale_to: that step's
 * scale, the one the backoffs left); the longest is kept. */
static void streak_close(probe__skip_streak *s, probe_diag *d,
                         const probe_step_scalars *r) {
  if (s->len < PROBE_DIAG_SKIP_STREAK) return;
  d->skip_streaks++;
  if (s->len <= d->skip_streak_len) return;
  d->skip_streak_start = s->start;
  d->skip_streak_end = s->last;
  d->skip_streak_len = s->len;
  d->skip_streak_loss_nf = s->loss_nf;
  d->skip_streak_scale_from = s->scale_from;
  d->skip_streak_scale_to =
      PROBE__UNMEASURED(r, PROBE__SC_SCALE) ? NAN : r->loss_scale;
}

void probe__diag_streak_row(probe__skip_streak *s, probe_diag *d,
                            const probe_step_scalars *r) {
  if (PROBE__UNMEASURED(r, PROBE__SC_SCALER)) return;
  if (!r->skipped) {
    streak_close(s, d, r);
    s->len = 0;
    s->clean_seen = 1;
    return;
  }
  if (!s->clean_seen) return; /* warm-up: the scaler finding its scale */
  if (s->len == 0) {
    s->start = r->step;
    s->loss_nf = 0;
    s->scale_from = PROBE__UNMEASURED(r, PROBE__SC_SCALE) ? NAN : r->loss_scale;
  }
  s->len++;
  s->last = r->step;
  if (!PROBE__UNMEASURED(r, PROBE__SC_LOSS) && !isfinite(r->loss)) s->loss_nf++;
}

/* ---- the layer that grew first -------------------------------------------- */

void probe__diag_growth_layer(probe_diag *d, double *base, int32_t li,
                              int64_t step, double fa, double ba) {
  if (!d->loss_diverged) return;
  for (int k = 0; k < 2; k++) {
    double v = k ? ba : fa;
    double *b = &base[2 * (size_t)li + (size_t)k];
    if (!isfinite(v)) continue;
    if (step <= d->loss_best_step) {
      if (v > *b) *b = v;
      continue;
    }
    if (!(*b > 0) || v < PROBE_DIAG_DIVERGE_LAYER_GROWTH * *b) continue;
    /* earliest step; in one step the activations before the gradients,
     * then the first layer (the caller goes in layer order) */
    if (d->diverge_layer >= 0 &&
        (step > d->diverge_layer_step ||
         (step == d->diverge_layer_step && (!d->diverge_layer_bwd || k == 1))))
      continue;
    d->diverge_layer = li;
    d->diverge_layer_bwd = k;
    d->diverge_layer_step = step;
    d->diverge_layer_growth = v / *b;
  }
}

/* ---- weights that stop changing ------------------------------------------- */

/* The bits of a format's significand, the implicit one included. */
static int stag_sig_bits(int32_t dtype) {
  return dtype == PROBE_DTYPE_BF16 ? 8 : dtype == PROBE_DTYPE_F16 ? 11 : 24;
}

/* The spacing of the format's values at |x| (x > 0, finite): 2^(e - p)
 * for x in [2^(e-1), 2^e). */
static double stag_ulp(double x, int32_t dtype) {
  int e;
  frexp(x, &e);
  return ldexp(1.0, e - stag_sig_bits(dtype));
}

static const char *stag_dtype_label(int32_t dtype) {
  return dtype == PROBE_DTYPE_BF16 ? "BF16" : dtype == PROBE_DTYPE_F16 ? "FP16" : "FP32";
}

static void stag_sig_of(probe__stag_sig *g, const probe_stats *s) {
  memset(g, 0, sizeof *g); /* no padding is compared unset */
  g->count = s->count;
  g->nan = s->nan_count;
  g->posinf = s->posinf_count;
  g->neginf = s->neginf_count;
  g->zero = s->zero_count;
  g->min = s->min;
  g->max = s->max;
  g->absmax = s->absmax;
  g->absmin_nonzero = s->absmin_nonzero;
  g->sum = s->sum;
  g->sumsq = s->sumsq;
}

void probe__diag_stag_free(probe__stag *t) {
  free(t->p);
  free(t->ord);
  free(t->ord_step);
  t->p = NULL;
  t->ord = NULL;
  t->ord_step = NULL;
}

int probe__diag_stag_init(probe__stag *t, probe_diag *d) {
  t->n_layers = d->n_layers;
  size_t n = (size_t)(t->n_layers > 0 ? t->n_layers : 1) * PROBE_DIAG_STAG_PARAMS;
  t->p = calloc(n, sizeof *t->p);
  t->ord = calloc(n / PROBE_DIAG_STAG_PARAMS, sizeof *t->ord);
  t->ord_step = malloc(n / PROBE_DIAG_STAG_PARAMS * sizeof *t->ord_step);
  if (!t->p || !t->ord || !t->ord_step) {
    probe__diag_stag_free(t);
    return -1;
  }
  for (size_t i = 0; i < n / PROBE_DIAG_STAG_PARAMS; i++) t->ord_step[i] = INT64_MIN;
  for (size_t i = 0; i < n; i++) t->p[i].prev_step = -1;
  d->stag_judged = 0;
  d->stag_layers = d->stag_params = 0;
  d->stag_elems = d->stag_total_elems = 0;
  d->stag_first_step = -1;
  d->stag_longest = 0;
  d->stag_layer = -1;
  d->stag_dtype = PROBE_DTYPE_F32;
  d->stag_lr = d->stag_grad_rms = d->stag_weight_rms = NAN;
  d->stag_half_ulp = d->stag_ratio = NAN;
  return 0;
}


/* The gradient of a parameter of count elements: the layer's weight_grad
 * records of that count in the step (one per backward: accumulation),
 * every one finite and nonzero; their largest absmax and rms. 0: none, or
 * one is non-finite or all zeros (nothing to move the weights by). */
static int stag_grad(const probe_record *r, size_t n, int32_t layer,
                     uint64_t count, double *gmax, double *grms) {
  int found = 0;
  *gmax = *grms = 0;
  for (size_t i = 0; i < n; i++) {
    const probe_stats *s = &r[i].stats;
    if (r[i].layer != layer || r[i].site != PROBE_SITE_WEIGHT_GRAD ||
        s->count != count)
      continue;
    if (probe_stats_nonfinite(s) || !(s->absmax > 0)) return 0;
    found = 1;
    if (s->absmax > *gmax) *gmax = s->absmax;
    double rms = probe_stats_rms(s);
    if (rms > *grms) *grms = rms;
  }
  return found;
}

static void stag_reset_run(probe__stag_param *p) { p->run = 0; }

void probe__diag_stag_step(probe__stag *t, const probe_record *r, size_t n,
                           int64_t step, const probe_step_scalars *sc) {
  if (!t->p) return;
  /* what the step could do to any weight: an lr > 0, not skipped, no
   * inf found (two optimizers: one of them may not have stepped) */
  int can_move = sc && !PROBE__UNMEASURED(sc, PROBE__SC_LR) &&
                 isfinite(sc->lr) && sc->lr > 0 &&
                 (PROBE__UNMEASURED(sc, PROBE__SC_SCALER) ||
                  (!sc->skipped && !sc->found_inf));
  double unscale = 1.0;
  if (sc && !PROBE__UNMEASURED(sc, PROBE__SC_SCALE) && isfinite(sc->loss_scale) &&
      sc->loss_scale > 0)
    unscale = 1.0 / sc->loss_scale;
  for (size_t i = 0; i < n; i++) {
    if (r[i].site != PROBE_SITE_MASTER_WEIGHT || r[i].layer < 0 ||
        r[i].layer >= t->n_layers)
      continue;
    int32_t li = r[i].layer;
    /* the k-th master record of the layer in the step: its k-th parameter */
    if (t->ord_step[li] != step) {
      t->ord_step[li] = step;
      t->ord[li] = 0;
    }
    int32_t k = t->ord[li]++;
    if (k >= PROBE_DIAG_STAG_PARAMS) continue;
    probe__stag_param *p = &t->p[(size_t)li * PROBE_DIAG_STAG_PARAMS + (size_t)k];
    const probe_stats *s = &r[i].stats;
    probe__stag_sig sig;
    stag_sig_of(&sig, s);
    int consecutive = p->prev_step >= 0 && p->prev_step == step - 1 &&
                      p->prev.count == sig.count && p->dtype == r[i].dtype;
    double gmax = 0, grms = 0;
    int finite = s->count > 0 && probe_stats_nonfinite(s) == 0 &&
                 isfinite(s->absmax) && s->absmax > 0;
    int eligible = consecutive && can_move && finite &&
                   stag_grad(r, n, li, s->count, &gmax, &grms);
    if (!eligible) {
      stag_reset_run(p);
    } else {
      p->eligible++;
      double lr = sc->lr;
      double upd = lr * gmax * unscale;
      int same = memcmp(&sig, &p->prev, sizeof sig) == 0;
      if (same && upd < PROBE_DIAG_STAG_UPDATE_ULPS * stag_ulp(s->absmax, r[i].dtype)) {
        if (p->run == 0) p->run_start = step;
        p->run++;
        p->stopped++;
        if (p->run > p->best) {
          p->best = p->run;
          p->best_start = p->run_start;
        }
        double wrms = probe_stats_rms(s);
        double g = grms * unscale;
        if (wrms > 0 && g > 0) {
          p->nlog++;
          p->log_lr += log(lr);
          p->log_g += log(g);
          p->log_w += log(wrms);
          p->log_h += log(0.5 * stag_ulp(wrms, r[i].dtype));
        }
      } else {
        stag_reset_run(p);
      }
    }
    p->prev = sig;
    p->prev_step = step;
    p->dtype = r[i].dtype;
    p->count = (int64_t)s->count;
  }
}

void probe__diag_stag_end(probe__stag *t, probe_diag *d) {
  if (!t->p) return;
  double llr = 0, lg = 0, lw = 0, lh = 0;
  int64_t nlog = 0, best_layer_elems = 0;
  for (int64_t li = 0; li < t->n_layers; li++) {
    int64_t layer_elems = 0;
    int32_t layer_dtype = PROBE_DTYPE_F32;
    int64_t layer_biggest = 0;
    for (int k = 0; k < PROBE_DIAG_STAG_PARAMS; k++) {
      const probe__stag_param *p = &t->p[(size_t)li * PROBE_DIAG_STAG_PARAMS + (size_t)k];
      if (p->prev_step < 0) continue;
      d->stag_total_elems += p->count;
      if (p->eligible) d->stag_judged = 1;
      if (p->best < PROBE_DIAG_STAG_MIN_STEPS ||
          (double)p->stopped < PROBE_DIAG_STAG_MIN_FRAC * (double)p->eligible)
        continue;
      d->stag_params++;
      d->stag_elems += p->count;
      layer_elems += p->count;
      if (p->count > layer_biggest) {
        layer_biggest = p->count;
        layer_dtype = p->dtype;
      }
      if (d->stag_first_step < 0 || p->best_start < d->stag_first_step)
        d->stag_first_step = p->best_start;
      if (p->best > d->stag_longest) d->stag_longest = p->best;
      llr += p->log_lr;
      lg += p->log_g;
      lw += p->log_w;
      lh += p->log_h;
      nlog += p->nlog;
    }
    if (layer_elems == 0) continue;
    d->stag_layers++;
    if (layer_elems > best_layer_elems) {
      best_layer_elems = layer_elems;
      d->stag_layer = (int32_t)li;
      d->stag_dtype = layer_dtype;
    }
  }
  if (nlog > 0) {
    d->stag_lr = exp(llr / (double)nlog);
    d->stag_grad_rms = exp(lg / (double)nlog);
    d->stag_weight_rms = exp(lw / (double)nlog);
    d->stag_half_ulp = exp(lh / (double)nlog);
    d->stag_ratio = d->stag_lr * d->stag_grad_rms / d->stag_half_ulp;
  }
}

/* ---- the weights-stagnant finding ------------------------------------------ */

int probe__diag_stag_fires(const probe_diag *d) {
  return d->stag_layers > 0 && d->stag_total_elems > 0 &&
         (double)d->stag_elems >=
             PROBE_DIAG_STAG_MIN_SHARE * (double)d->stag_total_elems;
}

static void stag_evidence(probe_diag_finding *f, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void stag_evidence(probe_diag_finding *f, const char *fmt, ...) {
  if (f->n_evidence >= PROBE_DIAG_MAX_EVIDENCE) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(f->evidence[f->n_evidence++], PROBE_DIAG_TEXT_MAX, fmt, ap);
  va_end(ap);
}

void probe__diag_stag_explain(const probe_diag *d, probe_diag_finding *f) {
  const char *fmt = stag_dtype_label(d->stag_dtype);
  double share = 100.0 * (double)d->stag_elems / (double)d->stag_total_elems;
  int32_t l = d->stag_layer;
  snprintf(f->title, sizeof f->title,
           "the weights of %d layer%s (%.3g%% of the weight elements) stopped "
           "changing from step %lld: each update is below half the spacing "
           "of %s at the weights, so it rounds back to the same value",
           (int)d->stag_layers, d->stag_layers == 1 ? "" : "s", share,
           (long long)d->stag_first_step, fmt);
  stag_evidence(f, "%d parameter%s (%lld of the %lld weight elements "
                   "recorded) did not change at all over runs of %lld or "
                   "more consecutive optimizer steps (the longest %lld), and "
                   "on most of the steps that could move them: each with an "
                   "lr > 0, not skipped, and a finite, nonzero gradient",
                (int)d->stag_params, d->stag_params == 1 ? "" : "s",
                (long long)d->stag_elems, (long long)d->stag_total_elems,
                (long long)PROBE_DIAG_STAG_MIN_STEPS, (long long)d->stag_longest);
  if (l >= 0)
    stag_evidence(f, "the most of them in '%s' (%s), whose weights are stored "
                     "in %s", probe_diag_layer_name(d, l),
                  probe_kind_name((probe_kind)d->layers[l].info.kind), fmt);
  if (isfinite(d->stag_ratio))
    stag_evidence(f, "typical update lr * rms|grad| = %.3g * %.3g = %.3g, half "
                     "of %s's spacing at the weights' rms |w| %.3g is %.3g: "
                     "the update is %.2gx of it (SGD's update; an adaptive "
                     "optimizer's is about lr)",
                  d->stag_lr, d->stag_grad_rms, d->stag_lr * d->stag_grad_rms,
                  fmt, d->stag_weight_rms, d->stag_half_ulp, d->stag_ratio);
  if (d->stag_dtype == PROBE_DTYPE_F32)
    snprintf(f->next_step, sizeof f->next_step,
             "the updates are below FP32's own resolution at these weights "
             "(no lower precision is involved): raise the learning rate (or "
             "the schedule's floor), or accumulate the updates with Kahan "
             "summation");
  else
    snprintf(f->next_step, sizeof f->next_step,
             "keep FP32 master weights: leave the parameters in FP32 and run "
             "the forward under autocast(dtype=torch.%s) instead of "
             "model.to(torch.%s); or update the %s weights with Kahan "
             "summation or stochastic rounding; a larger learning rate moves "
             "only the weights whose update then passes half a spacing",
             d->stag_dtype == PROBE_DTYPE_BF16 ? "bfloat16" : "float16",
             d->stag_dtype == PROBE_DTYPE_BF16 ? "bfloat16" : "float16", fmt);
}
