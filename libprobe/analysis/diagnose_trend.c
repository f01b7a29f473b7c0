/*
 * libprobe/analysis/diagnose_trend.c - what the post-mortem reads from the
 * steps table besides non-finite values: a finite loss that diverges (its
 * running median against the lowest it reached) and a streak of skipped
 * steps in the middle of a run; and, in the records pass, the layer whose
 * values grew first. The thresholds are in diagnose-impl.h
 * (PROBE_DIAG_DIVERGE_*, PROBE_DIAG_SKIP_STREAK); docs/precision.md says
 * what the findings made of them mean.
 *
 * Memory is fixed: a ring of at most PROBE_DIAG_DIVERGE_WINDOW_MAX losses,
 * whatever the number of steps.
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
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
