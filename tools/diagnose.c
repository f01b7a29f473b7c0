/*
 * tools/diagnose.c - the post-mortem analysis engine (see diagnose.h).
 *
 * Three streaming passes over a trace, each through the chunked reader so
 * memory depends on the model (layers x sites x history) and never on the
 * number of steps:
 *   1. the steps table: losses, loss-scale range and skip runs, clipping
 *      ratios in DIAG_TIME_BUCKETS windows, corr(log norm, log scale);
 *   2. the scaler events: backoffs, growths, the first few backoffs kept;
 *   3. the per-layer records, one step at a time, walked in execution order
 *      (seq) alongside a second cursor on the steps table: the first
 *      non-finite event, its origin layer and kind, the layers that passed
 *      it on, the origin's absmax history, gradient underflow per layer,
 *      and the layers whose gradients overflowed behind each backoff.
 * Then the findings are ranked (diag_rank).
 */
#define _POSIX_C_SOURCE 200809L
#include "diagnose.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

static const char *event_names[] = {
#define X_(name, str, desc) str,
    DIAG_EVENT_MAP(X_)
#undef X_
};
static const char *event_descs[] = {
#define X_(name, str, desc) desc,
    DIAG_EVENT_MAP(X_)
#undef X_
};
static const char *finding_names[] = {
#define X_(name, str) str,
    DIAG_FINDING_MAP(X_)
#undef X_
};

const char *diag_event_name(diag_event e) {
  return (unsigned)e < DIAG_EVENT_COUNT ? event_names[e] : "?";
}
const char *diag_event_desc(diag_event e) {
  return (unsigned)e < DIAG_EVENT_COUNT ? event_descs[e] : "?";
}
const char *diag_finding_name(diag_finding_id f) {
  return (unsigned)f < DIAG_FINDING_COUNT ? finding_names[f] : "?";
}

void diag_options_init(diag_options *o) {
  o->layer_history = 8;
  o->chunk_rows = 4096;
}

const char *diag_layer_name(const probe_diag *d, int32_t id) {
  if (id < 0 || id >= d->n_layers || !d->layers) return "?";
  return d->layers[id].info.name;
}

/* ---- chunked cursors ------------------------------------------------------ */

typedef struct steps_cursor {
  probe_trace *t;
  probe_step_scalars *buf;
  size_t cap, got, pos;
  int64_t next_row;
  int eof;
  probe_status st;
} steps_cursor;

static int steps_cursor_init(steps_cursor *c, probe_trace *t, size_t cap) {
  memset(c, 0, sizeof *c);
  c->t = t;
  c->cap = cap;
  c->buf = malloc(cap * sizeof *c->buf);
  return c->buf ? 0 : -1;
}

/* Current row or NULL at the end (c->st says whether it was an error). */
static const probe_step_scalars *steps_cursor_peek(steps_cursor *c) {
  if (c->pos < c->got) return &c->buf[c->pos];
  if (c->eof) return NULL;
  c->st = probe_trace_read_steps(c->t, c->next_row, c->cap, c->buf, &c->got);
  c->pos = 0;
  if (c->st < 0 || c->got == 0) {
    c->eof = 1;
    c->got = 0;
    return NULL;
  }
  c->next_row += (int64_t)c->got;
  return &c->buf[0];
}

/* The row of `step`, or NULL; rows before it are skipped. */
static const probe_step_scalars *steps_cursor_find(steps_cursor *c,
                                                   int64_t step) {
  const probe_step_scalars *r;
  while ((r = steps_cursor_peek(c)) && r->step < step) c->pos++;
  return (r && r->step == step) ? r : NULL;
}

/* ---- small helpers -------------------------------------------------------- */

static int stats_nonfinite(const probe_stats *s) {
  return probe_stats_nonfinite(s) > 0;
}
static int stats_has_inf(const probe_stats *s) {
  return s->posinf_count + s->neginf_count > 0;
}
static double headroom_of(double absmax) {
  if (!isfinite(absmax)) return NAN;
  if (absmax <= 0) return INFINITY;
  return log2(65504.0 / absmax);
}
static int is_fwd_out(int site) {
  return site == PROBE_SITE_FWD_OUT || site == PROBE_SITE_FWD_SAVED;
}
static int is_bwd_out(int site) {
  return site == PROBE_SITE_GRAD_IN || site == PROBE_SITE_WEIGHT_GRAD;
}
static int is_weight(int site) {
  return site == PROBE_SITE_WEIGHT || site == PROBE_SITE_MASTER_WEIGHT;
}
static int cmp_seq(const void *a, const void *b) {
  const probe_record *x = a, *y = b;
  return (x->seq > y->seq) - (x->seq < y->seq);
}

static void add_evidence(diag_finding *f, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void add_evidence(diag_finding *f, const char *fmt, ...) {
  if (f->n_evidence >= DIAG_MAX_EVIDENCE) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(f->evidence[f->n_evidence++], DIAG_TEXT_MAX, fmt, ap);
  va_end(ap);
}

static diag_finding *add_finding(probe_diag *d, diag_finding_id id,
                                 double score, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static diag_finding *add_finding(probe_diag *d, diag_finding_id id,
                                 double score, const char *fmt, ...) {
  if (d->n_findings >= DIAG_MAX_FINDINGS) return NULL;
  diag_finding *f = &d->findings[d->n_findings++];
  memset(f, 0, sizeof *f);
  f->id = id;
  f->score = score;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(f->title, sizeof f->title, fmt, ap);
  va_end(ap);
  return f;
}

/* ---- pass 1: the steps table ---------------------------------------------- */

static probe_status pass_steps(probe_diag *d, probe_trace *t, size_t chunk) {
  steps_cursor c;
  if (steps_cursor_init(&c, t, chunk)) return PROBE_ERR_NOMEM;
  d->first_loss = d->last_loss = NAN;
  d->min_loss = INFINITY;
  d->first_nonfinite_loss_step = -1;
  d->loss_before_event = NAN;
  d->scale_min = INFINITY;
  d->scale_max = 0;
  d->scale_first = d->scale_last = NAN;
  /* the largest loss / (best loss so far), before the first non-finite */
  double min_loss_before = INFINITY;
  double max_rise = NAN;
  int64_t run = 0, run_start = -1;
  /* correlation sums over steps with finite positive norm and scale */
  double n = 0, sx = 0, sy = 0, sxx = 0, syy = 0, sxy = 0, sr = 0;
  double log_ratio_sum = 0;
  int64_t n_ratio = 0;
  int64_t span = d->last_step - d->first_step + 1;
  for (int b = 0; b < DIAG_TIME_BUCKETS; b++) d->bucket_first_step[b] = -1;

  const probe_step_scalars *r;
  while ((r = steps_cursor_peek(&c))) {
    c.pos++;
    if (isnan(d->first_loss)) d->first_loss = r->loss;
    d->last_loss = r->loss;
    if (isfinite(r->loss)) {
      if (r->loss < d->min_loss) d->min_loss = r->loss;
      if (d->first_nonfinite_loss_step < 0) {
        d->loss_before_event = r->loss;
        if (r->loss < min_loss_before) min_loss_before = r->loss;
        if (min_loss_before > 0) {
          double rise = r->loss / min_loss_before;
          if (isnan(max_rise) || rise > max_rise) max_rise = rise;
        }
      }
    } else {
      d->nonfinite_loss_steps++;
      if (d->first_nonfinite_loss_step < 0)
        d->first_nonfinite_loss_step = r->step;
    }
    /* loss scale */
    /* A scale other than 1 at any step means a scaler was at work (it may
     * have started at 1 and backed off below it). */
    if (r->loss_scale != 1.0) d->scaling_on = 1;
    if (isfinite(r->loss_scale) && r->loss_scale > 0) {
      if (isnan(d->scale_first)) d->scale_first = r->loss_scale;
      d->scale_last = r->loss_scale;
      if (r->loss_scale < d->scale_min) d->scale_min = r->loss_scale;
      if (r->loss_scale > d->scale_max) d->scale_max = r->loss_scale;
    }
    if (r->found_inf) d->found_inf_steps++;
    if (r->skipped) {
      d->skipped_steps++;
      if (run == 0) run_start = r->step;
      run++;
      if (run > d->longest_skip_run) {
        d->longest_skip_run = run;
        d->longest_skip_start = run_start;
      }
    } else {
      run = 0;
    }
    /* clipping */
    if (r->clip_threshold > 0) {
      d->clipping_on = 1;
      d->clip_threshold = r->clip_threshold;
      if (isfinite(r->grad_norm)) {
        double ratio = r->grad_norm / r->clip_threshold;
        d->clip_steps_seen++;
        if (r->clip_coef < 1.0) d->clipped_steps++;
        if (ratio > d->max_clip_ratio) {
          d->max_clip_ratio = ratio;
          d->max_clip_ratio_step = r->step;
        }
        int b = span > 0 ? (int)((r->step - d->first_step) * DIAG_TIME_BUCKETS /
                                 span)
                         : 0;
        if (b < 0) b = 0;
        if (b >= DIAG_TIME_BUCKETS) b = DIAG_TIME_BUCKETS - 1;
        if (d->bucket_first_step[b] < 0) d->bucket_first_step[b] = r->step;
        d->bucket_ratio_mean[b] += ratio;
        if (ratio > d->bucket_ratio_max[b]) d->bucket_ratio_max[b] = ratio;
        d->bucket_n[b]++;
        if (ratio > 0) {
          log_ratio_sum += log2(ratio);
          n_ratio++;
        }
      }
    }
    if (isfinite(r->grad_norm) && r->grad_norm > 0 &&
        isfinite(r->loss_scale) && r->loss_scale > 0) {
      double x = log2(r->loss_scale), y = log2(r->grad_norm);
      n += 1;
      sx += x;
      sy += y;
      sxx += x * x;
      syy += y * y;
      sxy += x * y;
      sr += y - x;
    }
  }
  d->trailing_skip_run = run;
  probe_status st = c.st;
  free(c.buf);
  if (st < 0) return st;

  for (int b = 0; b < DIAG_TIME_BUCKETS; b++)
    if (d->bucket_n[b]) d->bucket_ratio_mean[b] /= (double)d->bucket_n[b];
  d->corr_norm_scale = NAN;
  d->norm_log2_var = d->norm_resid_var = NAN;
  d->norm_over_scale = NAN;
  d->scale_log2_spread = NAN;
  if (n >= 2) {
    double vx = sxx / n - (sx / n) * (sx / n);
    double vy = syy / n - (sy / n) * (sy / n);
    double cxy = sxy / n - (sx / n) * (sy / n);
    d->scale_log2_spread = vx > 0 ? sqrt(vx) : 0;
    d->norm_log2_var = vy;
    d->norm_resid_var = vy + vx - 2 * cxy;
    if (vx > 1e-12 && vy > 1e-12) d->corr_norm_scale = cxy / sqrt(vx * vy);
    d->norm_over_scale = exp2(sr / n);
  }
  /* Loss rise before the event: how far the loss climbed from its best. */
  d->loss_rise = max_rise;
  if (!isfinite(d->min_loss)) d->min_loss = NAN;
  if (d->scale_max == 0) d->scale_min = d->scale_max = NAN;
  /* Clipping applied to scaled gradients: almost every step clipped, the
   * pre-clip norm orders of magnitude above the threshold, and that norm
   * following the loss scale (high correlation when the scale moved). */
  d->clip_log2_ratio_mean = n_ratio ? log_ratio_sum / (double)n_ratio : NAN;
  if (d->clipping_on && d->scaling_on && d->clip_steps_seen > 0 && n_ratio) {
    double clipped_frac = (double)d->clipped_steps / (double)d->clip_steps_seen;
    double mean_log_ratio = d->clip_log2_ratio_mean;
    /* When the scale hardly moved the norms cannot show that they follow
     * it; when it did, dividing the norms by the scale must make them
     * steadier (var(log norm - log scale) < var(log norm)). */
    int tracks = !(d->scale_log2_spread >= 0.5) ||
                 (isfinite(d->corr_norm_scale) && d->corr_norm_scale > 0 &&
                  d->norm_resid_var < d->norm_log2_var);
    if (clipped_frac >= 0.8 && mean_log_ratio >= 6.0 && tracks)
      d->clip_scaled_signature = 1;
  }
  return PROBE_OK;
}

/* ---- pass 2: scaler events ------------------------------------------------ */

static probe_status pass_scaler(probe_diag *d, probe_trace *t, size_t chunk) {
  probe_scaler_event *buf = malloc(chunk * sizeof *buf);
  if (!buf) return PROBE_ERR_NOMEM;
  int64_t row = 0;
  size_t got = 0;
  probe_status st;
  /* first step that was not skipped: backoffs before it are warm-up */
  while ((st = probe_trace_read_scaler_events(t, row, chunk, buf, &got)) >= 0 &&
         got > 0) {
    for (size_t i = 0; i < got; i++) {
      const probe_scaler_event *e = &buf[i];
      d->scaling_on = 1;
      switch (e->kind) {
      case PROBE_SCALER_BACKOFF:
      case PROBE_SCALER_MIN_CLAMP:
        if (e->kind == PROBE_SCALER_BACKOFF)
          d->backoffs++;
        else
          d->min_clamps++;
        if (d->n_backoff_detail < DIAG_MAX_BACKOFFS) {
          diag_backoff *b = &d->backoff_detail[d->n_backoff_detail++];
          memset(b, 0, sizeof *b);
          b->step = e->step;
          b->old_scale = e->old_scale;
          b->new_scale = e->new_scale;
        }
        break;
      case PROBE_SCALER_GROWTH: d->growths++; break;
      case PROBE_SCALER_HYSTERESIS: d->hysteresis_events++; break;
      default: break;
      }
    }
    row += (int64_t)got;
  }
  free(buf);
  return st < 0 ? st : PROBE_OK;
}

/* Late backoffs: after the first clean step (needs the steps table). */
static probe_status count_late_backoffs(probe_diag *d, probe_trace *t,
                                        size_t chunk) {
  steps_cursor c;
  if (steps_cursor_init(&c, t, chunk)) return PROBE_ERR_NOMEM;
  int64_t first_clean = -1;
  const probe_step_scalars *r;
  while ((r = steps_cursor_peek(&c))) {
    c.pos++;
    if (!r->skipped) {
      first_clean = r->step;
      break;
    }
  }
  /* Warm-up: the steps before the first clean one, and at least the first
   * max(10, n/20) steps, where GradScaler's initial 2^16 is still being
   * brought down to a scale the gradients fit. */
  int64_t warm = d->n_steps / 20 > 10 ? d->n_steps / 20 : 10;
  if (first_clean >= 0 && first_clean < d->first_step + warm)
    first_clean = d->first_step + warm;
  probe_status st = c.st;
  free(c.buf);
  if (st < 0) return st;
  probe_scaler_event *buf = malloc(chunk * sizeof *buf);
  if (!buf) return PROBE_ERR_NOMEM;
  int64_t row = 0;
  size_t got = 0;
  while ((st = probe_trace_read_scaler_events(t, row, chunk, buf, &got)) >= 0 &&
         got > 0) {
    for (size_t i = 0; i < got; i++)
      if ((buf[i].kind == PROBE_SCALER_BACKOFF ||
           buf[i].kind == PROBE_SCALER_MIN_CLAMP) &&
          first_clean >= 0 && buf[i].step > first_clean)
        d->late_backoffs++;
    row += (int64_t)got;
  }
  free(buf);
  return st < 0 ? st : PROBE_OK;
}

/* ---- pass 3: per-layer records -------------------------------------------- */

/* What one layer did in one step (indices into the step's record buffer). */
typedef struct layer_step {
  int fwd_in, fwd_out, fwd_saved, grad_out, grad_in, wgrad, weight, master;
  int first_out_nf; /* first non-finite output record (seq order), -1 */
} layer_step;

typedef struct hist_point {
  int64_t step;
  float fwd_absmax, bwd_absmax;
} hist_point;

typedef struct walker {
  probe_diag *d;
  int hist_len;
  hist_point *hist; /* [n_layers][hist_len] ring */
  int64_t *hist_count;
  layer_step *ls;   /* [n_layers] */
  int64_t mid_step;
  int frozen;       /* history frozen after the event */
  int backoff_i;    /* next backoff_detail to attribute */
  /* The first backward-only overflow, kept in case it becomes the event. */
  int have_bwd;
  probe_diag bwd; /* only the event fields are used */
  int64_t weight_first_step;
} walker;

/* Fills ls[] for the step's records (sorted by seq). */
static void index_step(walker *w, const probe_record *r, size_t n) {
  int64_t nl = w->d->n_layers;
  for (int64_t i = 0; i < nl; i++) {
    layer_step *l = &w->ls[i];
    l->fwd_in = l->fwd_out = l->fwd_saved = l->grad_out = l->grad_in =
        l->wgrad = l->weight = l->master = l->first_out_nf = -1;
  }
  for (size_t i = 0; i < n; i++) {
    if (r[i].layer < 0 || r[i].layer >= nl) continue;
    layer_step *l = &w->ls[r[i].layer];
    int *slot = NULL;
    switch (r[i].site) {
    case PROBE_SITE_FWD_IN: slot = &l->fwd_in; break;
    case PROBE_SITE_FWD_OUT: slot = &l->fwd_out; break;
    case PROBE_SITE_FWD_SAVED: slot = &l->fwd_saved; break;
    case PROBE_SITE_GRAD_OUT: slot = &l->grad_out; break;
    case PROBE_SITE_GRAD_IN: slot = &l->grad_in; break;
    case PROBE_SITE_WEIGHT_GRAD: slot = &l->wgrad; break;
    case PROBE_SITE_WEIGHT: slot = &l->weight; break;
    case PROBE_SITE_MASTER_WEIGHT: slot = &l->master; break;
    default: break;
    }
    /* Several records of one site (e.g. two saved intermediates): keep the
     * first non-finite one, else the first. */
    if (slot && (*slot < 0 || (!stats_nonfinite(&r[*slot].stats) &&
                               stats_nonfinite(&r[i].stats))))
      *slot = (int)i;
    if ((is_fwd_out(r[i].site) || is_bwd_out(r[i].site)) &&
        stats_nonfinite(&r[i].stats) && l->first_out_nf < 0)
      l->first_out_nf = (int)i;
  }
}

static int rec_nf(const probe_record *r, int i) {
  return i >= 0 && stats_nonfinite(&r[i].stats);
}

/* Inputs of a layer for the phase of `site` held a non-finite value. */
static int inputs_nonfinite(const layer_step *l, const probe_record *r,
                            int site) {
  if (is_fwd_out(site)) return rec_nf(r, l->fwd_in) || rec_nf(r, l->weight);
  return rec_nf(r, l->grad_out) || rec_nf(r, l->weight) ||
         rec_nf(r, l->fwd_in);
}

/* Finds the origin of the step's first non-finite value and classifies it.
 * Writes the event fields of `e`. Returns 1 when the step holds one. */
static int analyse_step(walker *w, probe_diag *e, const probe_record *r,
                        size_t n, int64_t step) {
  const probe_diag *d = w->d;
  int origin = -1; /* record index */
  diag_event kind = DIAG_EVENT_NONE;
  for (size_t i = 0; i < n && origin < 0; i++) {
    const probe_record *x = &r[i];
    if (!stats_nonfinite(&x->stats)) continue;
    if (x->layer < 0 || x->layer >= d->n_layers) continue;
    int lkind = d->layers[x->layer].info.kind;
    const layer_step *l = &w->ls[x->layer];
    if (lkind == PROBE_KIND_INPUT) {
      origin = (int)i;
      kind = DIAG_EVENT_INPUT_NAN;
    } else if (is_weight(x->site)) {
      origin = (int)i;
      kind = DIAG_EVENT_WEIGHT_NONFINITE;
    } else if ((is_fwd_out(x->site) || is_bwd_out(x->site)) &&
               !inputs_nonfinite(l, r, x->site)) {
      origin = (int)i;
    }
  }
  if (origin < 0) {
    /* Nothing produced it from finite inputs (its producer was not
     * recorded): blame the first non-finite record. */
    for (size_t i = 0; i < n; i++)
      if (stats_nonfinite(&r[i].stats)) {
        origin = (int)i;
        break;
      }
  }
  if (origin < 0) return 0;

  const probe_record *o = &r[origin];
  const layer_step *l = &w->ls[o->layer];
  int lkind = d->layers[o->layer].info.kind;
  int fwd = !is_bwd_out(o->site) && o->site != PROBE_SITE_GRAD_OUT;
  int in_idx = fwd ? l->fwd_in : l->grad_out;
  if (kind == DIAG_EVENT_NONE) {
    if (!fwd) {
      kind = stats_has_inf(&o->stats) ? DIAG_EVENT_GRAD_OVERFLOW
                                      : DIAG_EVENT_INF_ARITH_NAN;
    } else {
      const probe_stats *in = in_idx >= 0 ? &r[in_idx].stats : NULL;
      int out_inf = rec_nf(r, l->fwd_out) && stats_has_inf(&r[l->fwd_out].stats);
      int saved_inf =
          rec_nf(r, l->fwd_saved) && stats_has_inf(&r[l->fwd_saved].stats);
      int in_zero = in && (in->zero_count > 0 || in->f16_flush > 0);
      double in_head = in ? headroom_of(in->absmax) : NAN;
      if ((out_inf || saved_inf) && in_zero &&
          (lkind == PROBE_KIND_LOSS || !(in_head <= 8.0)))
        kind = DIAG_EVENT_UNDERFLOW_TO_INF;
      else if (saved_inf || rec_nf(r, l->fwd_saved))
        kind = stats_has_inf(&r[l->fwd_saved].stats)
                   ? DIAG_EVENT_REDUCTION_OVERFLOW
                   : DIAG_EVENT_INF_ARITH_NAN;
      else if (out_inf)
        kind = DIAG_EVENT_OVERFLOW;
      else
        kind = DIAG_EVENT_INF_ARITH_NAN;
    }
  }
  e->event = kind;
  e->event_step = step;
  e->event_phase = probe_site_phase((probe_site)o->site);
  e->origin_layer = o->layer;
  e->origin_site = (probe_site)o->site;
  e->origin_out = o->stats;
  e->have_origin_in = in_idx >= 0;
  if (in_idx >= 0) e->origin_in = r[in_idx].stats;

  /* The feeder: the layer whose output came last before the origin's
   * first record of that phase. */
  e->feeder_layer = -1;
  uint32_t first_seq = o->seq;
  int origin_first = fwd ? l->fwd_in : l->grad_out;
  if (origin_first >= 0 && r[origin_first].seq < first_seq)
    first_seq = r[origin_first].seq;
  for (size_t i = 0; i < n && r[i].seq < first_seq; i++) {
    if (r[i].layer == o->layer) continue;
    if ((fwd && r[i].site == PROBE_SITE_FWD_OUT) ||
        (!fwd && r[i].site == PROBE_SITE_GRAD_IN))
      e->feeder_layer = r[i].layer;
  }

  /* Layers that passed it on, and the first that made NaN out of inf. */
  e->n_passed = 0;
  e->more_passed = 0;
  e->nan_from_inf_layer = -1;
  /* The origin itself made NaN out of its own inf (e.g. a saved variance). */
  if (o->stats.nan_count > 0 && kind != DIAG_EVENT_INPUT_NAN &&
             kind != DIAG_EVENT_WEIGHT_NONFINITE &&
             ((l->fwd_saved >= 0 && stats_has_inf(&r[l->fwd_saved].stats)) ||
              stats_has_inf(&o->stats))) {
    e->nan_from_inf_layer = o->layer;
  }
  for (size_t i = (size_t)origin + 1; i < n; i++) {
    const probe_record *x = &r[i];
    if (x->layer == o->layer || x->layer < 0 || x->layer >= d->n_layers)
      continue;
    if (!(is_fwd_out(x->site) || is_bwd_out(x->site))) continue;
    if (!stats_nonfinite(&x->stats)) continue;
    const layer_step *xl = &w->ls[x->layer];
    int in_i = is_fwd_out(x->site) ? xl->fwd_in : xl->grad_out;
    if (e->nan_from_inf_layer < 0 && x->stats.nan_count > 0 && in_i >= 0 &&
        stats_has_inf(&r[in_i].stats) && r[in_i].stats.nan_count == 0)
      e->nan_from_inf_layer = x->layer;
    int dup = 0;
    for (int k = 0; k < e->n_passed; k++)
      if (e->passed[k] == x->layer) dup = 1;
    if (dup) continue;
    if (e->n_passed < DIAG_MAX_PASSED)
      e->passed[e->n_passed++] = x->layer;
    else
      e->more_passed++;
  }

  /* History of the origin's absmax (ring, oldest first). */
  int64_t cnt = w->hist_count[o->layer];
  int h = cnt < w->hist_len ? (int)cnt : w->hist_len;
  e->n_history = 0;
  for (int k = 0; k < h && e->n_history < DIAG_HISTORY_MAX; k++) {
    int64_t idx = (cnt - h + k) % w->hist_len;
    const hist_point *p = &w->hist[(int64_t)o->layer * w->hist_len + idx];
    double a = fwd ? p->fwd_absmax : p->bwd_absmax;
    e->history[e->n_history].step = p->step;
    e->history[e->n_history].absmax = a;
    e->history[e->n_history].headroom = headroom_of(a);
    e->n_history++;
  }
  return 1;
}

static void update_layers(walker *w, const probe_record *r, size_t n,
                          int64_t step) {
  probe_diag *d = w->d;
  int64_t nl = d->n_layers;
  /* history + headroom + underflow, per layer */
  for (int64_t li = 0; li < nl; li++) {
    const layer_step *l = &w->ls[li];
    float fa = NAN, ba = NAN;
    int any = 0;
    for (int s = 0; s < 2; s++) {
      int i = s == 0 ? l->fwd_out : l->fwd_saved;
      if (i < 0) continue;
      any = 1;
      float a = r[i].stats.absmax;
      if (isfinite(a) && (isnan(fa) || a > fa)) fa = a;
    }
    for (int s = 0; s < 2; s++) {
      int i = s == 0 ? l->grad_in : l->wgrad;
      if (i < 0) continue;
      any = 1;
      float a = r[i].stats.absmax;
      if (isfinite(a) && (isnan(ba) || a > ba)) ba = a;
    }
    if (!any) continue;
    diag_layer *dl = &d->layers[li];
    if (!w->frozen) {
      hist_point *p = &w->hist[li * w->hist_len + w->hist_count[li] % w->hist_len];
      p->step = step;
      p->fwd_absmax = fa;
      p->bwd_absmax = ba;
      w->hist_count[li]++;
    }
    double hr = headroom_of(fa);
    if (isfinite(fa) && dl->info.precision == PROBE_PREC_FP16 &&
        hr < dl->min_fwd_headroom) {
      dl->min_fwd_headroom = hr;
      dl->min_fwd_headroom_step = step;
    }
    int half = step > w->mid_step ? 1 : 0;
    for (int s = 0; s < 2 && dl->info.precision == PROBE_PREC_FP16; s++) {
      int i = s == 0 ? l->grad_in : l->wgrad;
      if (i < 0) continue;
      const probe_stats *st = &r[i].stats;
      dl->grad_count[half] += probe_stats_finite(st);
      dl->grad_subnormal[half] += st->f16_subnormal;
      dl->grad_flush[half] += st->f16_flush;
      dl->grad_zero[half] += st->zero_count;
    }
    if (l->fwd_out >= 0) {
      dl->fwd_out_zero += r[l->fwd_out].stats.zero_count;
      dl->fwd_out_count += probe_stats_finite(&r[l->fwd_out].stats);
    }
    int nf = 0;
    for (size_t i = 0; i < n; i++)
      if (r[i].layer == li && stats_nonfinite(&r[i].stats)) nf = 1;
    if (nf) dl->nonfinite_steps++;
  }
  /* weights: largest |w| of any layer at this step */
  double wmax = NAN;
  for (size_t i = 0; i < n; i++)
    if (is_weight(r[i].site) && isfinite(r[i].stats.absmax) &&
        (isnan(wmax) || r[i].stats.absmax > wmax))
      wmax = r[i].stats.absmax;
  if (isfinite(wmax)) {
    if (isnan(d->master_absmax_first)) d->master_absmax_first = wmax;
    if (d->event_step < 0 || step < d->event_step) d->master_absmax_last = wmax;
  }
}

/* Layers with non-finite gradients in this step, execution order. */
static void attribute_backoff(walker *w, const probe_record *r, int64_t step,
                              int found_inf) {
  probe_diag *d = w->d;
  diag_backoff *b = NULL;
  while (w->backoff_i < d->n_backoff_detail &&
         d->backoff_detail[w->backoff_i].step < step)
    w->backoff_i++;
  if (w->backoff_i < d->n_backoff_detail &&
      d->backoff_detail[w->backoff_i].step == step)
    b = &d->backoff_detail[w->backoff_i];
  if (!b && !found_inf) return;
  for (int64_t li = 0; li < d->n_layers; li++) {
    const layer_step *l = &w->ls[li];
    if (!(rec_nf(r, l->grad_in) || rec_nf(r, l->wgrad))) continue;
    if (found_inf) d->layers[li].backoff_steps++;
    if (b) {
      if (b->n_layers < DIAG_MAX_BACKOFF_LAYERS)
        b->layers[b->n_layers++] = (int32_t)li;
      else
        b->more_layers++;
    }
  }
}

/* Which gradients the clipper measured. The weight_grad records hold the
 * gradients as the backward made them, multiplied by the loss scale S; the
 * clipper's grad_norm is their norm divided by S when it ran after
 * unscaling, and their norm itself when it ran before. On steps where S is
 * at least 4 away from 1, every layer's weight gradient was recorded once
 * (not per micro-batch) and all are finite, count the steps whose grad_norm
 * is within 2x of the recorded norm and not of the recorded norm / S, and
 * those where it is the other way round (steps that match neither are left
 * out). This
 * holds whatever the norms do over time, also when a falling scale lets
 * them grow (the divergence that clipping before unscaling causes once S
 * drops below 1), where the correlation test of pass 1 cannot see it.
 * Layers of a kind with parameters must all have their weight gradient in
 * the step (a layer selection leaves the recorded norm partial). */
static void compare_clip_norm(walker *w, const probe_record *r, size_t n,
                              const probe_step_scalars *sc) {
  probe_diag *d = w->d;
  if (!sc || !d->clipping_on || !d->scaling_on || !(sc->grad_norm > 0) ||
      !isfinite(sc->grad_norm) || !(sc->loss_scale > 0) ||
      !isfinite(sc->loss_scale) || fabs(log2(sc->loss_scale)) < 2)
    return;
  double sq = 0;
  int64_t n_wgrad = 0, n_layers_wgrad = 0;
  for (size_t i = 0; i < n; i++) {
    if (r[i].site != PROBE_SITE_WEIGHT_GRAD) continue;
    if (stats_nonfinite(&r[i].stats)) return;
    n_wgrad++;
  }
  for (int64_t l = 0; l < d->n_layers; l++) {
    int k = w->ls[l].wgrad;
    if (k < 0) {
      /* a layer with parameters whose gradient is missing (a layer
       * selection): the recorded norm is not the clipper's whole norm */
      probe_kind kind = d->layers[l].info.kind;
      if (kind == PROBE_KIND_LINEAR || kind == PROBE_KIND_BN ||
          kind == PROBE_KIND_LAYERNORM || kind == PROBE_KIND_REVIN ||
          kind == PROBE_KIND_ATTENTION)
        return;
      continue;
    }
    n_layers_wgrad++;
    sq += r[k].stats.sumsq;
  }
  if (n_wgrad == 0 || n_wgrad != n_layers_wgrad || !(sq > 0)) return;
  double rn = sqrt(sq);
  int scaled = fabs(log2(sc->grad_norm / rn)) < 1;
  int unscaled = fabs(log2(sc->grad_norm * sc->loss_scale / rn)) < 1;
  if (scaled == unscaled) return; /* neither (or, S near 1, both): no answer */
  d->clip_norm_steps++;
  d->clip_norm_scaled_steps += scaled;
}

static void process_step(walker *w, probe_record *r, size_t n, int64_t step,
                         const probe_step_scalars *sc) {
  probe_diag *d = w->d;
  qsort(r, n, sizeof *r, cmp_seq);
  index_step(w, r, n);
  int any_nf = 0, fwd_nf = 0;
  for (size_t i = 0; i < n; i++) {
    if (!stats_nonfinite(&r[i].stats)) continue;
    any_nf = 1;
    if (probe_site_phase((probe_site)r[i].site) == PROBE_PHASE_FORWARD)
      fwd_nf = 1;
    if (r[i].layer >= 0 && r[i].layer < d->n_layers &&
        d->layers[r[i].layer].info.kind == PROBE_KIND_INPUT)
      fwd_nf = 1;
    if (r[i].site == PROBE_SITE_MASTER_WEIGHT) fwd_nf = 1;
  }
  int loss_nf = sc && !isfinite(sc->loss);
  compare_clip_norm(w, r, n, sc);
  update_layers(w, r, n, step);
  attribute_backoff(w, r, step, sc ? sc->found_inf : 0);
  if (!any_nf) return;

  if (fwd_nf || loss_nf) {
    probe_diag e;
    memset(&e, 0, sizeof e);
    if (analyse_step(w, &e, r, n, step)) {
      if (e.origin_layer >= 0) d->layers[e.origin_layer].origin_steps++;
      if (d->event_step < 0) {
        d->event = e.event;
        d->event_step = e.event_step;
        d->event_phase = e.event_phase;
        d->origin_layer = e.origin_layer;
        d->origin_site = e.origin_site;
        d->origin_out = e.origin_out;
        d->have_origin_in = e.have_origin_in;
        d->origin_in = e.origin_in;
        d->feeder_layer = e.feeder_layer;
        d->n_passed = e.n_passed;
        memcpy(d->passed, e.passed, sizeof d->passed);
        d->more_passed = e.more_passed;
        d->nan_from_inf_layer = e.nan_from_inf_layer;
        d->n_history = e.n_history;
        memcpy(d->history, e.history, sizeof d->history);
        w->frozen = 1;
      }
    }
  } else {
    if (d->first_grad_overflow_step < 0) d->first_grad_overflow_step = step;
    if (!w->have_bwd) {
      memset(&w->bwd, 0, sizeof w->bwd);
      if (analyse_step(w, &w->bwd, r, n, step)) w->have_bwd = 1;
    }
  }
}

static probe_status pass_records(probe_diag *d, probe_trace *t, size_t chunk,
                                 int hist_len) {
  probe_status st = PROBE_OK;
  walker w;
  memset(&w, 0, sizeof w);
  w.d = d;
  w.hist_len = hist_len > 0 ? hist_len : 1;
  int64_t nl = d->n_layers > 0 ? d->n_layers : 1;
  w.hist = calloc((size_t)(nl * w.hist_len), sizeof *w.hist);
  w.hist_count = calloc((size_t)nl, sizeof *w.hist_count);
  w.ls = calloc((size_t)nl, sizeof *w.ls);
  probe_record *buf = malloc(chunk * sizeof *buf);
  size_t step_cap = 256, step_n = 0;
  probe_record *step_buf = malloc(step_cap * sizeof *step_buf);
  steps_cursor sc;
  int sc_ok = steps_cursor_init(&sc, t, chunk) == 0;
  if (!w.hist || !w.hist_count || !w.ls || !buf || !step_buf || !sc_ok) {
    st = PROBE_ERR_NOMEM;
    goto done;
  }
  w.mid_step = d->rec_first_step + (d->rec_last_step - d->rec_first_step) / 2;

  int64_t row = 0, cur_step = INT64_MIN;
  size_t got = 0;
  for (;;) {
    st = probe_trace_read_records(t, row, chunk, buf, &got);
    if (st < 0) goto done;
    if (got == 0) break;
    row += (int64_t)got;
    for (size_t i = 0; i < got; i++) {
      if (buf[i].step != cur_step) {
        if (step_n)
          process_step(&w, step_buf, step_n, cur_step,
                       steps_cursor_find(&sc, cur_step));
        step_n = 0;
        cur_step = buf[i].step;
      }
      if (step_n == step_cap) {
        probe_record *nb = realloc(step_buf, 2 * step_cap * sizeof *nb);
        if (!nb) {
          st = PROBE_ERR_NOMEM;
          goto done;
        }
        step_buf = nb;
        step_cap *= 2;
      }
      step_buf[step_n++] = buf[i];
    }
  }
  if (step_n)
    process_step(&w, step_buf, step_n, cur_step,
                 steps_cursor_find(&sc, cur_step));
  if (sc.st < 0) {
    st = sc.st;
    goto done;
  }
  /* A backward-only overflow becomes the event when nothing else did and
   * the scaler did not cope (no scaling, or the scale collapsed). */
  if (d->event_step < 0 && w.have_bwd &&
      (!d->scaling_on || d->scale_collapsed)) {
    d->event = w.bwd.event;
    d->event_step = w.bwd.event_step;
    d->event_phase = w.bwd.event_phase;
    d->origin_layer = w.bwd.origin_layer;
    d->origin_site = w.bwd.origin_site;
    d->origin_out = w.bwd.origin_out;
    d->have_origin_in = w.bwd.have_origin_in;
    d->origin_in = w.bwd.origin_in;
    d->feeder_layer = w.bwd.feeder_layer;
    d->n_passed = w.bwd.n_passed;
    memcpy(d->passed, w.bwd.passed, sizeof d->passed);
    d->more_passed = w.bwd.more_passed;
    d->nan_from_inf_layer = w.bwd.nan_from_inf_layer;
    d->n_history = w.bwd.n_history;
    memcpy(d->history, w.bwd.history, sizeof d->history);
  }
  st = PROBE_OK;
done:
  free(w.hist);
  free(w.hist_count);
  free(w.ls);
  free(buf);
  free(step_buf);
  if (sc_ok) free(sc.buf);
  return st;
}

/* ---- ranking -------------------------------------------------------------- */

/* Value of `--opt X` (or --opt=X) in a stored command line. */
static int cmdline_value(const char *cl, const char *opt, char *out,
                         size_t len) {
  if (!cl) return 0;
  size_t ol = strlen(opt);
  for (const char *p = strstr(cl, opt); p; p = strstr(p + 1, opt)) {
    if (p != cl && p[-1] != ' ') continue;
    const char *v = p + ol;
    if (*v == '=')
      v++;
    else if (*v == ' ')
      while (*v == ' ') v++;
    else
      continue;
    size_t k = 0;
    while (v[k] && v[k] != ' ' && k + 1 < len) {
      out[k] = v[k];
      k++;
    }
    out[k] = 0;
    return k > 0;
  }
  return 0;
}

/* "--scenario X [--steps N] [--seed S]" that reproduces the run. */
static void run_args(const probe_diag *d, const char *cl, const char *cfg_name,
                     char *out, size_t len) {
  char v[200];
  size_t k = 0;
  out[0] = 0;
  if (cmdline_value(cl, "--config", v, sizeof v))
    k += (size_t)snprintf(out + k, len - k, "--config %s", v);
  else if (cmdline_value(cl, "--scenario", v, sizeof v))
    k += (size_t)snprintf(out + k, len - k, "--scenario %s", v);
  else if (cfg_name && *cfg_name)
    k += (size_t)snprintf(out + k, len - k, "--scenario %s", cfg_name);
  else
    k += (size_t)snprintf(out + k, len - k, "--config CONFIG.json");
  if (k < len && cmdline_value(cl, "--steps", v, sizeof v))
    k += (size_t)snprintf(out + k, len - k, " --steps %s", v);
  if (k < len && cmdline_value(cl, "--seed", v, sizeof v))
    k += (size_t)snprintf(out + k, len - k, " --seed %s", v);
  (void)d;
}

static void add_candidate(char *list, size_t len, const char *kind) {
  if (!kind || !*kind) return;
  if (!strcmp(kind, "input") || !strcmp(kind, "loss") ||
      !strcmp(kind, "other"))
    return;
  /* already there? */
  size_t kl = strlen(kind);
  for (const char *p = list; (p = strstr(p, kind)); p += kl)
    if ((p == list || p[-1] == ',') && (p[kl] == 0 || p[kl] == ','))
      return;
  size_t n = strlen(list);
  snprintf(list + n, len - n, "%s%s", n ? "," : "", kind);
}

static void fmt_loss(char *b, size_t n, double x) {
  if (isnan(x))
    snprintf(b, n, "nan");
  else if (isinf(x))
    snprintf(b, n, "%sinf", x < 0 ? "-" : "");
  else
    snprintf(b, n, "%.4g", x);
}

static int layer_is_fp32(const probe_diag *d, int32_t id) {
  return id >= 0 && id < d->n_layers &&
         d->layers[id].info.precision == PROBE_PREC_FP32;
}

static void diag_rank(probe_diag *d, const char *cl, const char *cfg_name) {
  char args[320];
  run_args(d, cl, cfg_name, args, sizeof args);
  const char *oname = diag_layer_name(d, d->origin_layer);
  int has_event = d->event_step >= 0 || d->first_nonfinite_loss_step >= 0;
  char b1[32], b2[32];

  /* Candidates to keep in FP32: the origin's kind, the layer that fed it
   * zeros (underflow), other layers that were origins, sensitive layers
   * with tight headroom. */
  d->fp32_candidates[0] = 0;
  char prior[200], prior_list[200] = "";
  int have_prior = 0;
  if (cmdline_value(cl, "--fp32", prior, sizeof prior)) {
    /* what the run already kept in FP32 stays a candidate */
    have_prior = 1;
    snprintf(prior_list, sizeof prior_list, "%s", prior);
    for (char *tok = strtok(prior, ","); tok; tok = strtok(NULL, ","))
      add_candidate(d->fp32_candidates, sizeof d->fp32_candidates, tok);
  }
  /* A layer that already runs in FP32 is never a candidate to force to
   * FP32: when the origin is one, the underflow came from upstream. */
  if (d->origin_layer >= 0) {
    if (d->event == DIAG_EVENT_UNDERFLOW_TO_INF && d->feeder_layer >= 0 &&
        !layer_is_fp32(d, d->feeder_layer))
      add_candidate(d->fp32_candidates, sizeof d->fp32_candidates,
                    probe_kind_name(d->layers[d->feeder_layer].info.kind));
    if (!layer_is_fp32(d, d->origin_layer))
      add_candidate(d->fp32_candidates, sizeof d->fp32_candidates,
                    probe_kind_name(d->layers[d->origin_layer].info.kind));
  }
  for (int64_t i = 0; i < d->n_layers; i++)
    if (d->layers[i].origin_steps > 0 && i != d->origin_layer &&
        !layer_is_fp32(d, (int32_t)i))
      add_candidate(d->fp32_candidates, sizeof d->fp32_candidates,
                    probe_kind_name(d->layers[i].info.kind));
  for (int64_t i = 0; i < d->n_layers; i++) {
    int k = d->layers[i].info.kind;
    int sensitive = k == PROBE_KIND_BN || k == PROBE_KIND_LAYERNORM ||
                    k == PROBE_KIND_REVIN || k == PROBE_KIND_SOFTMAX ||
                    k == PROBE_KIND_ATTENTION;
    if (!sensitive || d->layers[i].info.precision != PROBE_PREC_FP16) continue;
    int tight = d->layers[i].min_fwd_headroom < 1.0;
    int zeros = k == PROBE_KIND_SOFTMAX && d->layers[i].fwd_out_zero > 0;
    if (has_event && (tight || zeros))
      add_candidate(d->fp32_candidates, sizeof d->fp32_candidates,
                    probe_kind_name(k));
  }

  /* lr signature: the loss climbed and the weights grew before the event. */
  int loss_climb = isfinite(d->loss_rise) && d->loss_rise >= 4.0;
  double wgrowth = (isfinite(d->master_absmax_first) &&
                    d->master_absmax_first > 0 &&
                    isfinite(d->master_absmax_last))
                       ? d->master_absmax_last / d->master_absmax_first
                       : NAN;
  int weights_grew = isfinite(wgrowth) && wgrowth >= 8.0;
  int lr_signature = has_event && (d->fp32_run || (loss_climb && weights_grew));

  diag_finding *f;
  if (d->event == DIAG_EVENT_INPUT_NAN) {
    f = add_finding(d, DIAG_FINDING_CLEAN_INPUT, 100,
                    "NaN/inf arrived in the input data at step %lld",
                    (long long)d->event_step);
    add_evidence(f, "layer '%s' (kind input) holds %llu NaN, %llu inf of %llu "
                    "values at step %lld",
                 oname, (unsigned long long)d->origin_out.nan_count,
                 (unsigned long long)(d->origin_out.posinf_count +
                                      d->origin_out.neginf_count),
                 (unsigned long long)d->origin_out.count,
                 (long long)d->event_step);
    add_evidence(f, "no layer produced it: it was non-finite before the "
                    "first module ran");
    snprintf(f->next_step, sizeof f->next_step,
             "clean the input data of step %lld (drop or impute NaN/inf "
             "samples, e.g. torch.nan_to_num or a data check); precision "
             "changes will not help",
             (long long)d->event_step);
  }
  if (d->event == DIAG_EVENT_WEIGHT_NONFINITE) {
    f = add_finding(d, DIAG_FINDING_CHECK_WEIGHTS, 90,
                    "the weights of '%s' are non-finite at step %lld", oname,
                    (long long)d->event_step);
    add_evidence(f, "site %s of '%s' holds %llu NaN, %llu inf",
                 probe_site_name(d->origin_site), oname,
                 (unsigned long long)d->origin_out.nan_count,
                 (unsigned long long)(d->origin_out.posinf_count +
                                      d->origin_out.neginf_count));
    snprintf(f->next_step, sizeof f->next_step,
             "a non-finite update reached the weights: check that steps with "
             "non-finite gradients are skipped, and lower the learning rate; "
             "compare with 'ampprobe run --precision fp32 %s'",
             args);
  }
  if (d->clip_scaled_signature) {
    f = add_finding(d, DIAG_FINDING_FIX_CLIP_ORDER, has_event ? 92 : 60,
                    "gradients are clipped while still multiplied by the loss "
                    "scale");
    add_evidence(f, "%lld of %lld steps clipped; mean pre-clip norm / "
                    "threshold is 2^%.1f, largest ratio %.3g at step %lld",
                 (long long)d->clipped_steps, (long long)d->clip_steps_seen,
                 d->clip_log2_ratio_mean,
                 d->max_clip_ratio, (long long)d->max_clip_ratio_step);
    if (d->clip_norm_steps > 0 &&
        5 * d->clip_norm_scaled_steps >= 4 * d->clip_norm_steps)
      add_evidence(f, "on %lld of %lld steps the clipper's norm was the norm "
                      "of the recorded weight gradients, which still carry "
                      "the loss scale (not that norm / scale)",
                   (long long)d->clip_norm_scaled_steps,
                   (long long)d->clip_norm_steps);
    else if (isfinite(d->corr_norm_scale))
      add_evidence(f, "corr(log2 grad_norm, log2 loss_scale) = %.2f over the "
                      "steps (the norms track the scale)",
                   d->corr_norm_scale);
    add_evidence(f, "grad_norm / loss_scale = %.3g: that is the real "
                    "(unscaled) gradient norm, against a threshold of %g",
                 d->norm_over_scale, d->clip_threshold);
    snprintf(f->next_step, sizeof f->next_step,
             "unscale before clipping (scaler.unscale_(optimizer) before "
             "clip_grad_norm_); check with 'ampprobe run %s' without "
             "--clip-before-unscale",
             args);
  }
  if (lr_signature) {
    f = add_finding(d, DIAG_FINDING_LOWER_LR, d->fp32_run ? 95 : 88,
                    d->fp32_run ? "the run diverged in FP32: not a precision "
                                  "problem"
                                : "the run diverged before it overflowed: the "
                                  "learning rate looks too high");
    if (d->fp32_run)
      add_evidence(f, "every layer ran in FP32 and the loss still went "
                      "non-finite at step %lld",
                   (long long)d->first_nonfinite_loss_step);
    if (isfinite(d->loss_rise)) {
      fmt_loss(b1, sizeof b1, d->loss_before_event);
      add_evidence(f, "the loss climbed %.3gx from its best before the "
                      "event (last finite loss %s)",
                   d->loss_rise, b1);
    }
    if (isfinite(wgrowth))
      add_evidence(f, "the largest weight grew %.3gx (|w| %.3g -> %.3g)",
                   wgrowth, d->master_absmax_first, d->master_absmax_last);
    snprintf(f->next_step, sizeof f->next_step,
             d->fp32_run
                 ? "lower the learning rate (e.g. 'ampprobe run %s --lr "
                   "<smaller>'); forcing layers to FP32 will not help"
                 : "check the FP32 baseline: 'ampprobe run --precision fp32 "
                   "%s'; if it diverges too, lower the learning rate (--lr)",
             args);
  }
  if (has_event && d->event != DIAG_EVENT_INPUT_NAN &&
      d->event != DIAG_EVENT_WEIGHT_NONFINITE && d->event != DIAG_EVENT_NONE &&
      !d->fp32_run && d->origin_layer >= 0) {
    double score = lr_signature ? 70 : (d->clip_scaled_signature ? 75 : 90);
    /* The layer to keep in FP32: the origin, unless it already runs in
     * FP32; then, for underflow-to-inf, the FP16 layer upstream that
     * produced the zeros. -1: no such FP16 layer. */
    int32_t target = d->origin_layer;
    if (layer_is_fp32(d, target))
      target = d->event == DIAG_EVENT_UNDERFLOW_TO_INF &&
                       d->feeder_layer >= 0 &&
                       !layer_is_fp32(d, d->feeder_layer)
                   ? d->feeder_layer
                   : -1;
    const char *okind = probe_kind_name(d->layers[d->origin_layer].info.kind);
    const char *cands =
        d->fp32_candidates[0]
            ? d->fp32_candidates
            : (target >= 0 ? probe_kind_name(d->layers[target].info.kind)
                           : NULL);
    if (target == d->origin_layer)
      f = add_finding(d, DIAG_FINDING_FORCE_FP32, score,
                      "FP16 %s in '%s' (%s): keep it in FP32",
                      diag_event_name(d->event), oname, okind);
    else if (target >= 0)
      f = add_finding(d, DIAG_FINDING_FORCE_FP32, score,
                      "FP16 %s: '%s' (%s) underflowed to zero in FP16 and "
                      "'%s' (%s, FP32) turned it into inf: keep '%s' in FP32",
                      diag_event_name(d->event), diag_layer_name(d, target),
                      probe_kind_name(d->layers[target].info.kind), oname,
                      okind, diag_layer_name(d, target));
    else
      f = add_finding(d, DIAG_FINDING_FORCE_FP32, score,
                      "%s in '%s' (%s), a layer that already runs in FP32: "
                      "what it received was produced in FP16 upstream",
                      diag_event_name(d->event), oname, okind);
    add_evidence(f, "step %lld, %s: %s", (long long)d->event_step,
                 probe_phase_name(d->event_phase), diag_event_desc(d->event));
    if (d->have_origin_in)
      add_evidence(f, "its input was finite (absmax %.4g, %llu zeros) and "
                      "its %s holds %llu NaN, %llu inf",
                   d->origin_in.absmax,
                   (unsigned long long)d->origin_in.zero_count,
                   probe_site_name(d->origin_site),
                   (unsigned long long)d->origin_out.nan_count,
                   (unsigned long long)(d->origin_out.posinf_count +
                                        d->origin_out.neginf_count));
    if (d->n_history >= 2) {
      const diag_history_point *a = &d->history[0];
      const diag_history_point *z = &d->history[d->n_history - 1];
      add_evidence(f, "headroom log2(65504/absmax) went %.2f -> %.2f over "
                      "steps %lld..%lld",
                   a->headroom, z->headroom, (long long)a->step,
                   (long long)z->step);
    }
    if (d->event == DIAG_EVENT_UNDERFLOW_TO_INF && d->feeder_layer >= 0)
      add_evidence(f, "'%s' (%s) fed it values that had underflowed to zero",
                   diag_layer_name(d, d->feeder_layer),
                   probe_kind_name(d->layers[d->feeder_layer].info.kind));
    if (have_prior)
      add_evidence(f, "this run already kept '%s' in FP32; the candidates "
                      "include it",
                   prior_list);
    else
      add_evidence(f, "a second culprit can hide behind the first: run "
                      "postmortem again on the fixed run");
    if (cands)
      snprintf(f->next_step, sizeof f->next_step,
               "ampprobe bisect --fp32-candidates %s %s", cands, args);
    else
      snprintf(f->next_step, sizeof f->next_step,
               "find the FP16 layer upstream of '%s': 'ampprobe diff' this "
               "trace against 'ampprobe run --precision fp32 %s --trace'",
               oname, args);
  }
  /* Loss scaling off and gradients underflowing. */
  if (!d->scaling_on && !has_event && !d->fp32_run &&
      d->worst_underflow_layer >= 0 && d->worst_underflow_frac >= 0.01) {
    const diag_layer *wl = &d->layers[d->worst_underflow_layer];
    f = add_finding(d, DIAG_FINDING_ENABLE_LOSS_SCALING, has_event ? 50 : 80,
                    "gradients underflow in FP16 without loss scaling");
    add_evidence(f, d->scaling_from_config
                        ? "loss scaling is off (the run's config)"
                        : "loss scaling is off (loss_scale 1 at every step)");
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
                 wl->info.name, 100.0 * d->worst_underflow_frac, f0, f1);
    fmt_loss(b1, sizeof b1, d->first_loss);
    fmt_loss(b2, sizeof b2, d->last_loss);
    add_evidence(f, "loss %s -> %s over %lld steps", b1, b2,
                 (long long)d->n_steps);
    snprintf(f->next_step, sizeof f->next_step,
             "enable dynamic loss scaling: 'ampprobe run %s' without "
             "--no-loss-scale (init scale 65536)",
             args);
  }
  /* The scaler cannot keep up. */
  /* (Not when the skips follow from non-finite losses: a symptom then.) */
  if (d->scaling_on && d->scale_collapsed &&
      !(has_event && 2 * d->nonfinite_loss_steps >= d->skipped_steps)) {
    f = add_finding(d, DIAG_FINDING_SCALE_COLLAPSE, has_event ? 60 : 85,
                    "the loss scale collapsed: %lld backoffs, %lld skipped "
                    "steps",
                    (long long)(d->backoffs + d->min_clamps),
                    (long long)d->skipped_steps);
    add_evidence(f, "scale %.6g -> %.6g (min %.6g); longest skip run %lld "
                    "steps from step %lld",
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
                   d->layers[top].info.name,
                   (long long)d->layers[top].backoff_steps);
      add_candidate(cands, sizeof cands,
                    probe_kind_name(d->layers[top].info.kind));
    }
    if (cands[0])
      snprintf(f->next_step, sizeof f->next_step,
               "ampprobe bisect --fp32-candidates %s %s", cands, args);
    else
      snprintf(f->next_step, sizeof f->next_step,
               "check the FP32 baseline: 'ampprobe run --precision fp32 %s'",
               args);
  }
  if (d->n_findings == 0 && d->event_step < 0 &&
      d->first_nonfinite_loss_step >= 0) {
    f = add_finding(d, DIAG_FINDING_LOWER_LR, 50,
                    "the loss went non-finite at step %lld",
                    (long long)d->first_nonfinite_loss_step);
    add_evidence(f, "no per-layer record in the trace shows where (record "
                    "with --trace to see the origin)");
    snprintf(f->next_step, sizeof f->next_step,
             "re-run with per-layer records: 'ampprobe run --trace %s', then "
             "check the FP32 baseline: 'ampprobe run --precision fp32 %s'",
             args, args);
  }
  if (d->n_findings == 0) {
    f = add_finding(d, DIAG_FINDING_HEALTHY, 0, "healthy: no problem found");
    fmt_loss(b1, sizeof b1, d->first_loss);
    fmt_loss(b2, sizeof b2, d->last_loss);
    add_evidence(f, "every loss finite; loss %s -> %s over %lld steps", b1,
                 b2, (long long)d->n_steps);
    if (d->scaling_on)
      add_evidence(f, "%lld backoffs (%lld after warm-up), %lld skipped "
                      "steps; scale %.6g -> %.6g",
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
                   d->layers[tight].info.name,
                   d->layers[tight].min_fwd_headroom,
                   (long long)d->layers[tight].min_fwd_headroom_step);
    if (d->clipping_on)
      add_evidence(f, "%lld of %lld steps clipped, largest clip ratio %.3g",
                   (long long)d->clipped_steps, (long long)d->clip_steps_seen,
                   d->max_clip_ratio);
    snprintf(f->next_step, sizeof f->next_step, "nothing to fix");
  }
  /* rank: stable sort by score, descending */
  for (int i = 1; i < d->n_findings; i++) {
    diag_finding tmp = d->findings[i];
    int j = i - 1;
    while (j >= 0 && d->findings[j].score < tmp.score) {
      d->findings[j + 1] = d->findings[j];
      j--;
    }
    d->findings[j + 1] = tmp;
  }
}

/* ---- entry point ---------------------------------------------------------- */

static probe_status edge_steps(probe_trace *t, int64_t n, int64_t *first,
                               int64_t *last) {
  *first = *last = -1;
  if (n <= 0) return PROBE_OK;
  probe_step_scalars s;
  size_t got = 0;
  probe_status st = probe_trace_read_steps(t, 0, 1, &s, &got);
  if (st < 0) return st;
  if (got) *first = s.step;
  st = probe_trace_read_steps(t, n - 1, 1, &s, &got);
  if (st < 0) return st;
  if (got) *last = s.step;
  return PROBE_OK;
}

static probe_status edge_records(probe_trace *t, int64_t n, int64_t *first,
                                 int64_t *last) {
  *first = *last = -1;
  if (n <= 0) return PROBE_OK;
  probe_record r;
  size_t got = 0;
  probe_status st = probe_trace_read_records(t, 0, 1, &r, &got);
  if (st < 0) return st;
  if (got) *first = r.step;
  st = probe_trace_read_records(t, n - 1, 1, &r, &got);
  if (st < 0) return st;
  if (got) *last = r.step;
  return PROBE_OK;
}

int diag_config_scaling(const char *config_json) {
  if (!config_json || !*config_json) return -1;
  json_error_t jerr;
  json_t *cfg = json_loads(config_json, 0, &jerr);
  json_t *en = json_object_get(json_object_get(cfg, "scaler"), "enabled");
  int on = -1;
  if (json_is_boolean(en)) {
    /* the trainer scales FP16 runs only; "precision" defaults to fp16 */
    const char *prec = json_string_value(json_object_get(cfg, "precision"));
    on = json_is_true(en) && (!prec || !strcmp(prec, "fp16"));
  }
  json_decref(cfg);
  return on;
}

probe_status probe_diag_run(probe_diag *d, probe_trace *t, const char *path,
                            const diag_options *opt) {
  diag_options defaults;
  if (!opt) {
    diag_options_init(&defaults);
    opt = &defaults;
  }
  size_t chunk = opt->chunk_rows ? opt->chunk_rows : 4096;
  memset(d, 0, sizeof *d);
  snprintf(d->path, sizeof d->path, "%s", path ? path : "");
  const probe_trace_info *info = probe_trace_get_info(t);
  d->complete = info->complete;
  d->record_mode = info->record_mode;
  d->n_steps = info->n_steps;
  d->n_records = info->n_records;
  d->event_step = -1;
  d->origin_layer = -1;
  d->feeder_layer = -1;
  d->nan_from_inf_layer = -1;
  d->first_grad_overflow_step = -1;
  d->worst_underflow_layer = -1;
  d->master_absmax_first = d->master_absmax_last = NAN;
  snprintf(d->precision_policy, sizeof d->precision_policy, "%s",
           info->precision_policy ? info->precision_policy : "");

  size_t nl = 0;
  const probe_layer_info *li = probe_trace_layers(t, &nl);
  d->n_layers = (int64_t)nl;
  d->layers = calloc(nl ? nl : 1, sizeof *d->layers);
  if (!d->layers) return PROBE_ERR_NOMEM;
  d->fp32_run = nl > 0;
  for (size_t i = 0; i < nl; i++) {
    d->layers[i].info = li[i];
    d->layers[i].min_fwd_headroom = INFINITY;
    d->layers[i].min_fwd_headroom_step = -1;
    if (li[i].kind != PROBE_KIND_INPUT && li[i].kind != PROBE_KIND_LOSS &&
        li[i].precision != PROBE_PREC_FP32)
      d->fp32_run = 0;
  }

  probe_status st = edge_steps(t, info->n_steps, &d->first_step, &d->last_step);
  if (st >= 0)
    st = edge_records(t, info->n_records, &d->rec_first_step,
                      &d->rec_last_step);
  if (st >= 0) st = pass_steps(d, t, chunk);
  if (st >= 0) st = pass_scaler(d, t, chunk);
  if (st >= 0) st = count_late_backoffs(d, t, chunk);
  if (st < 0) return st;
  /* The stored config says whether a scaler ran; the steps only guess (a
   * scaler that stays at an initial scale of 1 leaves no trace). */
  int cfg_scaling = diag_config_scaling(info->config_json);
  if (cfg_scaling >= 0) {
    d->scaling_on = cfg_scaling;
    d->scaling_from_config = 1;
  }

  /* Collapse: the scale ended far below where it started and was still
   * backing off (or at its minimum), or the last steps were all skipped. */
  if (d->scaling_on) {
    int64_t tail = d->n_steps / 10 > 20 ? d->n_steps / 10 : 20;
    d->scale_collapsed =
        (isfinite(d->scale_last) && d->scale_last <= 1.0 &&
         d->scale_first > 1.0) ||
        (d->trailing_skip_run >= tail && d->trailing_skip_run >= 10) ||
        (d->min_clamps > 0 && d->trailing_skip_run > 0);
  }
  st = pass_records(d, t, chunk, opt->layer_history > 0 ? opt->layer_history
                                                        : 8);
  if (st < 0) return st;
  /* The comparison of pass 3, where it could be made on 3 steps or more,
   * decides; pass 1's correlation test (which also fires when the true
   * gradient norm is simply far above the threshold and the scale did not
   * move) only where it could not (the flight recorder's traces, a scale
   * that stayed near 1). */
  if (d->clip_norm_steps >= 3)
    d->clip_scaled_signature =
        d->clipping_on && d->scaling_on &&
        5 * d->clip_norm_scaled_steps >= 4 * d->clip_norm_steps;
  if (d->event_step < 0 && d->first_nonfinite_loss_step >= 0) {
    d->event = DIAG_EVENT_LOSS_ONLY;
    d->event_step = d->first_nonfinite_loss_step;
    d->event_phase = PROBE_PHASE_FORWARD;
  }

  /* Worst gradient underflow. */
  uint64_t tot_c = 0, tot_z = 0;
  for (int64_t i = 0; i < d->n_layers; i++) {
    const diag_layer *l = &d->layers[i];
    uint64_t c = l->grad_count[0] + l->grad_count[1];
    tot_c += c;
    tot_z += l->grad_zero[0] + l->grad_zero[1];
    if (!c) continue;
    /* f16_subnormal counts every finite 0 < |x| < 2^-14, flushing ones
     * included */
    double f = (double)(l->grad_subnormal[0] + l->grad_subnormal[1]) /
               (double)c;
    if (d->worst_underflow_layer < 0 || f > d->worst_underflow_frac) {
      d->worst_underflow_layer = (int32_t)i;
      d->worst_underflow_frac = f;
    }
  }
  d->total_grad_zero_frac = tot_c ? (double)tot_z / (double)tot_c : NAN;

  /* scenario name from the stored config */
  char cfg_name[128] = "";
  if (info->config_json && *info->config_json) {
    json_error_t jerr;
    json_t *cfg = json_loads(info->config_json, 0, &jerr);
    const char *nm = cfg ? json_string_value(json_object_get(cfg, "name")) : NULL;
    if (nm) snprintf(cfg_name, sizeof cfg_name, "%s", nm);
    json_decref(cfg);
  }
  diag_rank(d, info->command_line, cfg_name);
  return PROBE_OK;
}

void probe_diag_free(probe_diag *d) {
  free(d->layers);
  d->layers = NULL;
}

int probe_diag_problem(const probe_diag *d) {
  return d->n_findings > 0 && d->findings[0].id != DIAG_FINDING_HEALTHY;
}
