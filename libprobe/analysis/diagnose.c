/*
 * libprobe/analysis/diagnose.c - the post-mortem passes (ampprobe/analysis.h).
 *
 * Three streaming passes over a trace, each through the chunked reader so
 * memory depends on the model (layers x sites x history) and never on the
 * number of steps:
 *   1. the steps table: losses, loss-scale range and skip runs, clipping
 *      ratios in PROBE_DIAG_TIME_BUCKETS windows, corr(log norm, log scale);
 *   2. the scaler events: backoffs, growths, the first few backoffs kept;
 *   3. the per-layer records, one step at a time, walked in execution order
 *      (seq) alongside a second cursor on the steps table: the first
 *      non-finite event, its origin layer and kind, the layers that passed
 *      it on, the origin's absmax history, gradient underflow per layer,
 *      and the layers whose gradients overflowed behind each backoff.
 * Then the findings are ranked (probe_diag_rank).
 */
#define _POSIX_C_SOURCE 200809L
#include "../format.h" /* probe__trace_check_unread */
#include "analysis-impl.h"
#include "diagnose-impl.h"

#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *event_names[] = {
#define X_(name, str, desc) str,
    PROBE_DIAG_EVENT_MAP(X_)
#undef X_
};
static const char *event_descs[] = {
#define X_(name, str, desc) desc,
    PROBE_DIAG_EVENT_MAP(X_)
#undef X_
};
static const char *finding_names[] = {
#define X_(name, str) str,
    PROBE_DIAG_FINDING_MAP(X_)
#undef X_
};

const char *probe_diag_event_name(probe_diag_event e) {
  return (unsigned)e < PROBE_DIAG_EVENT_COUNT ? event_names[e] : "?";
}
const char *probe_diag_event_desc(probe_diag_event e) {
  return (unsigned)e < PROBE_DIAG_EVENT_COUNT ? event_descs[e] : "?";
}

/* The event's description in the words of the origin's precision: the
 * map's text says FP16, the common case; an FP32 or BF16 origin has
 * another maximum (and in FP32 a finite input turned inf is more often a
 * log or division of 0 than an overflow). */
const char *probe__diag_event_text(const probe_diag *d) {
  int prec = d->origin_layer >= 0 && d->origin_layer < d->n_layers && d->layers
                 ? d->layers[d->origin_layer].info.precision
                 : PROBE_DTYPE_F16;
  if (d->event == PROBE_DIAG_EVENT_OVERFLOW && prec == PROBE_DTYPE_F32)
    return "a finite input became inf: an overflow past FP32's maximum "
           "(~3.4e38), or an op that makes inf of a finite value (a log or "
           "division of 0, an exp)";
  if (d->event == PROBE_DIAG_EVENT_OVERFLOW && prec == PROBE_DTYPE_BF16)
    return "finite values overflowed past the BF16 maximum ~3.39e38";
  if (d->event == PROBE_DIAG_EVENT_GRAD_OVERFLOW && prec == PROBE_DTYPE_F32)
    return "gradients became inf/NaN in the backward pass of an FP32 layer";
  if (d->event == PROBE_DIAG_EVENT_GRAD_OVERFLOW && prec == PROBE_DTYPE_BF16)
    return "gradients overflowed BF16 in the backward pass";
  if (d->event == PROBE_DIAG_EVENT_GRAD_OVERFLOW && !d->scaling_on)
    return "gradients overflowed FP16 in the backward pass (no loss scaling: "
           "they were not scaled)";
  return probe_diag_event_desc(d->event);
}
const char *probe_diag_finding_name(probe_diag_finding_id f) {
  return (unsigned)f < PROBE_DIAG_FINDING_COUNT ? finding_names[f] : "?";
}

void probe_diag_options_init(probe_diag_options *o) {
  if (!o) return;
  o->layer_history = 8;
  o->chunk_rows = PROBE__CHUNK_ROWS_DEFAULT;
}

const char *probe_diag_layer_name(const probe_diag *d, int32_t id) {
  if (!d || id < 0 || id >= d->n_layers || !d->layers) return "?";
  return d->layers[id].display;
}

/* ---- progress -------------------------------------------------------------- */

/* The passes' progress (probe__progress, analysis-impl.h): total is the
 * rows they read (the steps once, the scaler events twice, the records). */
typedef probe__progress diag_progress;

probe_status probe__progress_add(probe__progress *p, size_t n) {
  if (!p || !p->fn) return PROBE_OK;
  if (p->stopped) return PROBE_ERR_INTERRUPTED;
  p->done += n;
  if (p->done > p->total) p->done = p->total;
  if (p->fn(p->phase, p->done, p->total, p->user) != 0) {
    p->stopped = 1;
    return PROBE_ERR_INTERRUPTED;
  }
  return PROBE_OK;
}

static probe_status progress_add(diag_progress *p, size_t n) {
  return probe__progress_add(p, n);
}

/* ---- chunked cursors ------------------------------------------------------ */

typedef struct steps_cursor {
  diag_progress *pg; /* told of each chunk (NULL: not counted) */
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
  if ((c->st = progress_add(c->pg, c->got)) < 0) {
    c->eof = 1;
    c->got = 0;
    return NULL;
  }
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
/* Weights the forward used more than this times the masters the step
 * before left were changed between the steps (an FP16 or BF16 copy rounds
 * by at most 2^-8 relative). */
#define EDIT_JUMP 1.01
/* A learning rate this many times the step before's, falling back by as
 * much later, is a spike (docs/precision.md, lr-signature). */
#define LR_SPIKE 4.0


static int stats_nonfinite(const probe_stats *s) {
  return probe_stats_nonfinite(s) > 0;
}
/* A record holds inf or NaN as the event search takes it: a softmax's
 * masked logits (-inf at its input and nothing else) are no event
 * (probe_record_nonfinite, probe.h); the explanations read the
 * statistics as they are. */
static int rec_event_nf(const probe_diag *d, const probe_record *r) {
  int32_t kind = r->layer >= 0 && r->layer < d->n_layers
                     ? d->layers[r->layer].info.kind
                     : (int32_t)PROBE_KIND_OTHER;
  return probe_record_nonfinite((probe_kind)kind, (probe_site)r->site, &r->stats);
}
static int stats_has_inf(const probe_stats *s) {
  return s->posinf_count + s->neginf_count > 0;
}
/* The one FP16 headroom formula (numerics.h; its edge cases are in
 * docs/statistics.md). A record's absmax is finite or NaN. */
double probe__diag_headroom(double absmax) { return probe_fp16_headroom(absmax); }
#define headroom_of probe__diag_headroom

/* Variance of a tensor's finite values (whole tensor), NaN when empty. */
static double stats_var(const probe_stats *s) {
  uint64_t n = probe_stats_finite(s);
  if (!n) return NAN;
  double m = s->sum / (double)n;
  double v = s->sumsq / (double)n - m * m;
  return v > 0 ? v : 0;
}

#define is_norm_kind probe__diag_is_norm_kind

/* Kinds whose forward can make inf out of a zero: a log (the loss's
 * cross-entropy), a division or 1/sqrt (normalisations, softmax and
 * attention's softmax). A Linear or an activation cannot. */
static int can_make_inf_from_zero(const probe_diag *d, int kind) {
  switch (kind) {
  case PROBE_KIND_LOSS: return d->cfg_loss_log;
  case PROBE_KIND_BN:
  case PROBE_KIND_LAYERNORM:
  case PROBE_KIND_REVIN:
  case PROBE_KIND_SOFTMAX:
  case PROBE_KIND_ATTENTION: return 1;
  default: return 0;
  }
}
static int is_fwd_out(int site) {
  return site == PROBE_SITE_FWD_OUT || site == PROBE_SITE_FWD_SAVED;
}
static int is_bwd_out(int site) {
  return site == PROBE_SITE_GRAD_IN || site == PROBE_SITE_WEIGHT_GRAD;
}
/* A gradient bucket sent into (PRE) or returned by (POST) the all-reduce
 * of a data-parallel job. */
static int is_allreduce(int site) {
  return site == PROBE_SITE_GRAD_PRE_ALLREDUCE ||
         site == PROBE_SITE_GRAD_POST_ALLREDUCE;
}
static int is_weight(int site) {
  return site == PROBE_SITE_WEIGHT || site == PROBE_SITE_MASTER_WEIGHT;
}
static int cmp_seq(const void *a, const void *b) {
  const probe_record *x = a, *y = b;
  return (x->seq > y->seq) - (x->seq < y->seq);
}

/* ---- pass 1: the steps table ---------------------------------------------- */

static probe_status pass_steps(probe_diag *d, probe_trace *t, size_t chunk,
                               diag_progress *pg) {
  steps_cursor c;
  if (steps_cursor_init(&c, t, chunk)) return PROBE_ERR_NOMEM;
  c.pg = pg;
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
  /* the learning-rate spike being followed: the step it rose (-1 none),
   * the lr before it and its largest lr */
  int64_t lr_rise = -1;
  double prev_lr = 0, lr_base = 0, lr_peak = 0;
  d->lr_spike_step = -1;
  d->lr_spike_steps = 0;
  d->lr_spike = d->lr_spike_base = NAN;
  /* in double: steps may be anywhere in int64 (a difference of two would
   * overflow) */
  double span = (double)d->last_step - (double)d->first_step + 1.0;
  for (int b = 0; b < PROBE_DIAG_TIME_BUCKETS; b++) d->bucket_first_step[b] = -1;
  probe__loss_trend trend;
  probe__skip_streak streak;
  probe__diag_trend_init(&trend, d);
  probe__diag_streak_init(&streak, d);

  const probe_step_scalars *r;
  while ((r = steps_cursor_peek(&c))) {
    c.pos++;
    probe__diag_trend_row(&trend, d, r);
    probe__diag_streak_row(&streak, d, r);
    int loss_known = !PROBE__UNMEASURED(r, PROBE__SC_LOSS);
    int scale_known = !PROBE__UNMEASURED(r, PROBE__SC_SCALE);
    if (loss_known && isnan(d->first_loss) && !d->first_loss_seen) {
      d->first_loss = r->loss;
      d->first_loss_seen = 1;
    }
    if (loss_known) d->last_loss = r->loss;
    if (!loss_known) {
      /* not measured: neither a loss nor a non-finite one */
    } else if (isfinite(r->loss)) {
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
    if (scale_known && r->loss_scale != 1.0) d->scaling_on = 1;
    if (scale_known && isfinite(r->loss_scale) && r->loss_scale > 0) {
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
    /* a learning-rate spike: a step whose lr is >= LR_SPIKE times the step
     * before's, which falls back by as much later (a warm-up or a step-up
     * never falls back); the first such spike */
    if (!PROBE__UNMEASURED(r, PROBE__SC_LR) && isfinite(r->lr) && r->lr > 0) {
      if (d->lr_spike_step < 0 && lr_rise < 0 && prev_lr > 0 &&
          r->lr >= LR_SPIKE * prev_lr) {
        lr_rise = r->step;
        lr_base = prev_lr;
        lr_peak = r->lr;
      } else if (lr_rise >= 0 && r->lr > lr_peak) {
        lr_peak = r->lr;
      } else if (lr_rise >= 0 && r->lr * LR_SPIKE <= lr_peak) {
        d->lr_spike_step = lr_rise;
        d->lr_spike_steps = r->step - lr_rise;
        d->lr_spike = lr_peak;
        d->lr_spike_base = lr_base;
        lr_rise = -1;
      }
      prev_lr = r->lr;
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
        int b = span > 0 ? (int)(((double)r->step - (double)d->first_step) *
                                 PROBE_DIAG_TIME_BUCKETS / span)
                         : 0;
        if (b < 0) b = 0;
        if (b >= PROBE_DIAG_TIME_BUCKETS) b = PROBE_DIAG_TIME_BUCKETS - 1;
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
  d->trailing_skip_start = run > 0 ? run_start : -1;
  probe__diag_trend_end(&trend, d);
  probe_status st = c.st;
  free(c.buf);
  if (st < 0) return st;

  for (int b = 0; b < PROBE_DIAG_TIME_BUCKETS; b++)
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
  /* Whether the clipper saw scaled gradients is decided by the rules
   * (diagnose_rules.c, clip_order) from the config, pass 3's comparison or
   * these statistics. */
  d->clip_log2_ratio_mean = n_ratio ? log_ratio_sum / (double)n_ratio : NAN;
  return PROBE_OK;
}

/* ---- pass 2: scaler events ------------------------------------------------ */

static probe_status pass_scaler(probe_diag *d, probe_trace *t, size_t chunk,
                                diag_progress *pg) {
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
        if (d->n_backoff_detail < PROBE_DIAG_MAX_BACKOFFS) {
          probe_diag_backoff *b = &d->backoff_detail[d->n_backoff_detail++];
          memset(b, 0, sizeof *b);
          b->step = e->step;
          b->min_clamp = e->kind == PROBE_SCALER_MIN_CLAMP;
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
    if ((st = progress_add(pg, got)) < 0) break;
  }
  free(buf);
  return st < 0 ? st : PROBE_OK;
}

/* Late backoffs: after the first clean step (needs the steps table). */
static probe_status count_late_backoffs(probe_diag *d, probe_trace *t,
                                        size_t chunk, diag_progress *pg) {
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
  d->warmup_end = first_clean >= 0 ? first_clean : d->first_step + warm;
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
    if ((st = progress_add(pg, got)) < 0) break;
  }
  free(buf);
  return st < 0 ? st : PROBE_OK;
}

/* ---- pass 3: per-layer records -------------------------------------------- */

/* What one layer did in one step (indices into the step's record buffer). */
typedef struct layer_step {
  int fwd_in, fwd_out, fwd_saved, grad_out, grad_in, wgrad, weight, master;
  int first_out_nf; /* first non-finite output record (seq order), -1 */
  int grad_feed;    /* the other layer's grad_in just before grad_out, -1 */
  /* One call's view (call_of; index_step leaves call_first -1 and the
   * counts 0): the call's first record, how many input records it holds
   * (forward: fwd_in, backward: grad_out; one per tensor argument), and
   * which of them, 1-based in recording order, fwd_in or grad_out is. */
  int call_first;
  int32_t in_n, in_pos;
} layer_step;

typedef struct hist_point {
  int64_t step;
  float fwd_absmax, bwd_absmax;
} hist_point;

typedef struct master_seen {
  int64_t step; /* -1: none yet */
  float absmax; /* the largest finite magnitude */
  int finite;
} master_seen;

enum { BWD_FIRST, BWD_LATE, BWD_UNSKIPPED, BWD_COUNT };

typedef struct walker {
  probe_diag *d;
  int hist_len;
  hist_point *hist; /* [n_layers][hist_len] ring */
  int64_t *hist_count;
  layer_step *ls;   /* [n_layers] */
  int64_t *nf_at;   /* [n_layers]: the last step with a non-finite record */
  int64_t mid_step;
  int frozen;       /* history frozen after the event */
  int backoff_i;    /* next backoff_detail to attribute */
  /* Backward-only overflows kept in case one becomes the event (only
   * their event fields are used; on the heap, 3 probe_diag are ~90 KiB):
   * the first; the first in the skip run that ends the trace (a collapse's,
   * not a warm-up backoff's); the first in a step the scaler did not skip
   * (masked before the parameter gradients: the scaler never saw it). */
  probe_diag *bwd; /* [BWD_COUNT] */
  int have_bwd[BWD_COUNT];
  int64_t weight_first_step;
  master_seen *masters; /* [n_layers] as the last step left them */
  double *edit_gain;    /* [n_layers]: product of the jumps edits made */
  double *wstep;        /* [n_layers]: largest |w| used this step, -1 */
  int64_t weights_nf_step; /* first step a weight or master weight held
                              inf/NaN, -1 none (the verdict: diverged) */
  /* the recorded steps around the first non-finite loss's (-1 none): equal
   * to it when that step has records */
  int64_t loss_rec_before, loss_rec_after;
  double *growth_base;  /* [2 n_layers]: probe__diag_growth_layer's */
  int64_t *streak_nf;   /* [n_layers]: steps of the skip streak in which
                           it made the backward's first non-finite
                           gradient */
  probe__stag stag;     /* weights that stop changing (diagnose_trend.c) */
} walker;

/* Fills ls[] for the step's records (sorted by seq). */
static void index_step(walker *w, const probe_record *r, size_t n) {
  int64_t nl = w->d->n_layers;
  for (int64_t i = 0; i < nl; i++) {
    layer_step *l = &w->ls[i];
    l->fwd_in = l->fwd_out = l->fwd_saved = l->grad_out = l->grad_in =
        l->wgrad = l->weight = l->master = l->first_out_nf = l->grad_feed =
            l->call_first = -1;
    l->in_n = l->in_pos = 0;
  }
  int last_grad_in = -1; /* the backward hands each layer the last one */
  for (size_t i = 0; i < n; i++) {
    if (r[i].layer < 0 || r[i].layer >= nl) continue;
    layer_step *l = &w->ls[r[i].layer];
    if (r[i].site == PROBE_SITE_GRAD_OUT && l->grad_out < 0 && last_grad_in >= 0 &&
        r[last_grad_in].layer != r[i].layer)
      l->grad_feed = last_grad_in;
    if (r[i].site == PROBE_SITE_GRAD_IN) last_grad_in = (int)i;
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

/* A site's part in a call of its layer, in the forward (fwd) or the
 * backward: 1 an input (forward: fwd_in, weight; backward: grad_out), 2 an
 * output (forward: fwd_out, fwd_saved; backward: grad_in, weight_grad), 0
 * neither (a site of the other phase, master weights, all-reduce buckets). */
static int call_role(int site, int fwd) {
  if (fwd)
    return site == PROBE_SITE_FWD_IN || site == PROBE_SITE_WEIGHT ? 1
           : is_fwd_out(site)                                      ? 2
                                                                   : 0;
  return site == PROBE_SITE_GRAD_OUT ? 1 : is_bwd_out(site) ? 2 : 0;
}

/* How strongly one input record of a call speaks for the range of the
 * layer's precision `prec`: 3 non-finite, 2 finite values beyond FP16's
 * range in an FP16 layer (inf once cast), 1 zeros that came from flushing,
 * 0 none of these (finite and in range: in_range below). */
static int input_class(const probe_stats *s, int prec) {
  if (stats_nonfinite(s)) return 3;
  if (prec == PROBE_DTYPE_F16 && s->f16_overflow > 0) return 2;
  if (probe__diag_zeros_flushed(s)) return 1;
  return 0;
}

/* The first record of the call of its layer that record i belongs to, in
 * the phase fwd (calls_of's rule, read backwards: a call starts at an
 * input record that follows one of the layer's outputs of that phase).
 * The call's input records may come before i or, i an input, after it. */
static int call_start(const probe_record *r, size_t i, int fwd) {
  int first = (int)i, seen_in = call_role(r[i].site, fwd) == 1;
  for (size_t k = i; k-- > 0;) {
    if (r[k].layer != r[i].layer) continue;
    int role = call_role(r[k].site, fwd);
    if (role == 2 && seen_in) break;
    if (role == 1) {
      seen_in = 1;
      first = (int)k;
    }
  }
  return first;
}

/* The records of the call of a layer that record i (an output) belongs to.
 * A module called more than once in a step (weight sharing) has one
 * fwd_in/weight/fwd_out group per call, and index_step keeps one record
 * per site: the output of the first call was compared with the input of
 * the second (an inf), and the real origin rejected. A call with several
 * inputs (an RNN cell's x and h, an attention's query and memory) records
 * one fwd_in each, in argument order: the one that speaks for the event is
 * taken, whichever it is - a non-finite one first, then one beyond FP16's
 * range (an FP16 layer) or with flushed zeros, then the largest (absmax);
 * reading only the last input called an overflowing first input "finite"
 * (docs/precision.md, "A module called with several inputs"). Since a
 * finite, in-range input is taken only when every input is, a rule that
 * needs "its input finite and in range" holds for all of them. The
 * weight: the first non-finite weight record of the call, else its last.
 * prec: the layer's precision. */
static layer_step call_of(const layer_step *l, const probe_record *r, size_t i,
                          int prec) {
  layer_step c = *l;
  int fwd = is_fwd_out(r[i].site);
  int in_site = fwd ? PROBE_SITE_FWD_IN : PROBE_SITE_GRAD_OUT;
  int first = call_start(r, i, fwd);
  int in = -1, cls = -1, wt = -1;
  c.call_first = first;
  c.in_n = c.in_pos = 0;
  for (int k = first; k < (int)i; k++) {
    if (r[k].layer != r[i].layer) continue;
    if (r[k].site == in_site) {
      c.in_n++;
      int ck = input_class(&r[k].stats, prec);
      if (ck > cls || (ck == cls && ck < 3 &&
                       r[k].stats.absmax > r[in].stats.absmax)) {
        in = k;
        cls = ck;
        c.in_pos = c.in_n;
      }
    }
    if (fwd && r[k].site == PROBE_SITE_WEIGHT && (wt < 0 || !rec_nf(r, wt)))
      wt = k;
  }
  /* the backward's weights are the forward's: the last record before it */
  for (size_t k = i; !fwd && k-- > 0 && wt < 0;)
    if (r[k].layer == r[i].layer && r[k].site == PROBE_SITE_WEIGHT) wt = (int)k;
  if (in >= 0) {
    if (fwd) c.fwd_in = in;
    else c.grad_out = in;
  }
  if (wt >= 0) c.weight = wt;
  return c;
}

/* Input record `at` (a fwd_in or grad_out) of its call: its 1-based place
 * among the call's input records of that site (*pos) and how many there
 * are (*n). */
static void input_place(const probe_record *r, size_t n_rec, size_t at,
                        int32_t *pos, int32_t *n) {
  int fwd = r[at].site == PROBE_SITE_FWD_IN;
  *pos = *n = 0;
  for (size_t k = (size_t)call_start(r, at, fwd); k < n_rec; k++) {
    if (r[k].layer != r[at].layer) continue;
    if (call_role(r[k].site, fwd) == 2) break;
    if (r[k].site != r[at].site) continue;
    (*n)++;
    if (k == at) *pos = *n;
  }
}

/* The calls of `layer` in one phase of the step's records (fwd: the
 * forward, else the backward), as its records tell them: a call starts at
 * the layer's first record of that phase and at each input record that
 * follows one of its outputs. Returns how many; *call gets the call that
 * record `at` belongs to (1-based; 0 when `at` is none of them) and *first
 * (may be NULL) that call's first record (-1 when none). Records cannot
 * tell two calls that record outputs only (no input, no weight) from one
 * call with two outputs: they count as one. The backward runs a module's
 * calls last first: its call 1 is the forward's last. */
static int32_t calls_of(const probe_record *r, size_t n, int32_t layer,
                        int fwd, size_t at, int32_t *call, int *first) {
  int32_t calls = 0;
  int prev = 0, start = -1; /* role of the layer's previous record; the
                               current call's first record */
  *call = 0;
  if (first) *first = -1;
  for (size_t i = 0; i < n; i++) {
    if (r[i].layer != layer) continue;
    int role = call_role(r[i].site, fwd);
    if (!role) continue;
    if (prev == 0 || (prev == 2 && role == 1)) {
      calls++;
      start = (int)i;
    }
    prev = role;
    if (i == at) {
      *call = calls;
      if (first) *first = start;
    }
  }
  return calls;
}

/* The feeder of a call of `layer` that starts at record `first`: the last
 * output of the phase (forward: fwd_out, backward: grad_in) recorded
 * before it in the same pass (a record of the other phase between them -
 * one micro-batch's backward before the next one's forward - ends the
 * search). An earlier call of the same layer feeds it too (h = mix(mix(h)
 * * 50): call 2 is fed by call 1; in the backward, call 1 of the forward
 * is fed by call 2) when `first` is known to start the call (own); else
 * the layer's records before it may be the call's own, and are skipped.
 * Returns the record's index, -1 when none. */
static int feeder_of(const probe_diag *d, const probe_record *r, int first,
                     int32_t layer, int fwd, int own) {
  int out_site = fwd ? PROBE_SITE_FWD_OUT : PROBE_SITE_GRAD_IN;
  probe_phase other = fwd ? PROBE_PHASE_BACKWARD : PROBE_PHASE_FORWARD;
  for (int i = first; i-- > 0;) {
    if (probe_site_phase((probe_site)r[i].site) == other) break;
    if (r[i].layer < 0 || r[i].layer >= d->n_layers) continue;
    if (r[i].layer == layer && !own) continue;
    if (r[i].site == out_site) return i;
  }
  return -1;
}

/* Two records hold the same values as far as their statistics tell: the
 * same counts and extremes, sums equal to 1e-6 (their accumulation order
 * may differ). */
static int same_values(const probe_stats *a, const probe_stats *b) {
  double ds = fabs(a->sum - b->sum), dq = fabs(a->sumsq - b->sumsq);
  return a->count == b->count && a->nan_count == b->nan_count &&
         a->posinf_count == b->posinf_count &&
         a->neginf_count == b->neginf_count && a->zero_count == b->zero_count &&
         a->f16_overflow == b->f16_overflow && a->f16_flush == b->f16_flush &&
         a->min == b->min && a->max == b->max && a->absmax == b->absmax &&
         ds <= 1e-6 * fabs(a->sum) + 1e-30 && dq <= 1e-6 * a->sumsq + 1e-30;
}

/* The feeder of input record `in` of a call with several inputs, which
 * starts at record `first`: the last output of the phase before it in the
 * same pass (feeder_of's search, the layer's own earlier calls included)
 * that holds the same values - the record that handed this input over
 * unchanged. -1 when none does: the input was made between modules (x *
 * 1e6, a slice of the batch), and the last output before the call fed
 * another of its inputs, not this one. */
static int input_feeder(const probe_diag *d, const probe_record *r, int first,
                        int in, int fwd) {
  int out_site = fwd ? PROBE_SITE_FWD_OUT : PROBE_SITE_GRAD_IN;
  probe_phase other = fwd ? PROBE_PHASE_BACKWARD : PROBE_PHASE_FORWARD;
  for (int i = first; i-- > 0;) {
    if (probe_site_phase((probe_site)r[i].site) == other) break;
    if (r[i].layer < 0 || r[i].layer >= d->n_layers) continue;
    if (r[i].site == out_site && same_values(&r[i].stats, &r[in].stats))
      return i;
  }
  return -1;
}

/* Inputs of a layer for the phase of `site` held a non-finite value. */
static int inputs_nonfinite(const layer_step *l, const probe_record *r,
                            int site) {
  if (is_fwd_out(site)) return rec_nf(r, l->fwd_in) || rec_nf(r, l->weight);
  return rec_nf(r, l->grad_out) || rec_nf(r, l->weight) ||
         rec_nf(r, l->fwd_in);
}

/* The sum of squares of the weights the call whose output is r[origin]
 * used: every weight record of its layer in the call (an attention
 * records q, k, v and out projections, weights and biases, as several
 * records; a Linear its weight and bias), else the call's one weight
 * record. NaN when none. */
static double call_weight_sumsq(const probe_record *r, int origin,
                                const layer_step *l) {
  double s = 0;
  int any = 0;
  int lo = l->call_first >= 0 ? l->call_first : l->fwd_in;
  for (int k = origin - 1; k >= lo && k >= 0; k--)
    if (r[k].layer == r[origin].layer && r[k].site == PROBE_SITE_WEIGHT) {
      s += r[k].stats.sumsq;
      any = 1;
    }
  if (!any && l->weight >= 0) return r[l->weight].stats.sumsq;
  return any ? s : NAN;
}

/* The largest sum of squares and absmax among the input records (fwd_in)
 * of the call whose output is r[origin]: a bound on what the call computes
 * must hold for each of its inputs (an attention's query and its memory),
 * not only the one `in` the analysis reads. `in`'s own when the call is
 * not known. */
static void call_in_max(const probe_record *r, int origin, const layer_step *l,
                        const probe_stats *in, double *sumsq, double *absmax) {
  *sumsq = in ? in->sumsq : NAN;
  *absmax = in ? (double)in->absmax : NAN;
  for (int k = l->call_first; k >= 0 && k < origin; k++) {
    if (r[k].layer != r[origin].layer || r[k].site != PROBE_SITE_FWD_IN) continue;
    if (r[k].stats.sumsq > *sumsq) *sumsq = r[k].stats.sumsq;
    if ((double)r[k].stats.absmax > *absmax) *absmax = r[k].stats.absmax;
  }
}

/* How the evidence names the input it read: "its input", or in a call
 * with several, "its input 2 of 3" (argument order). */
static const char *input_label(char *buf, size_t n, const layer_step *l) {
  if (l->in_n > 1 && l->in_pos > 0)
    snprintf(buf, n, "its input %d of %d", (int)l->in_pos, (int)l->in_n);
  else
    snprintf(buf, n, "its input");
  return buf;
}

/* The kind of a forward event at layer `l` (docs/precision.md, "How an
 * event is classified"). Underflow-to-inf needs specific evidence: the op
 * can make inf out of a zero (log, division, 1/sqrt), its input holds
 * zeros that came from flushing (values at or below FP16's smallest
 * subnormal in the input, subnormals beside the zeros, or a feeder -
 * softmax, attention - whose outputs are never zero in exact arithmetic),
 * and the magnitudes could not have overflowed in the product (for a
 * Linear/attention ||W||_F * (||x||_F + 1) < 65504, the bound on any
 * output; for a normalisation absmax(x)^2 < 65504, its sum of squares per
 * element). Otherwise the inf is an overflow of the product or of the
 * saved reduction. */

static double call_weight_sumsq(const probe_record *r, int origin,
                                const layer_step *l);

static void classify_forward(walker *w, probe_diag *e, const probe_record *r,
                             const probe_record *o,
                             const layer_step *l, int lkind,
                             const probe_stats *in, int out_inf, int saved_inf,
                             int feeder, probe_diag_event *kind) {
  const probe_diag *d = w->d;
  char *ev = e->event_evidence;
  size_t evl = sizeof e->event_evidence;
  /* the feeder's kind: the last forward output before this call's input
   * (feeder_of; an earlier call of the same module counts) */
  int feeder_kind = feeder >= 0 ? d->layers[r[feeder].layer].info.kind : -1;
  int in_zero = in && in->zero_count > 0;
  int flushed =
      in && (probe__diag_zeros_flushed(in) ||
             (in_zero && (feeder_kind == PROBE_KIND_SOFTMAX ||
                          feeder_kind == PROBE_KIND_ATTENTION)));
  char lab[48];
  input_label(lab, sizeof lab, l);
  /* largest output magnitude the inputs allow: every input of the call
   * bounded, and every weight record of it (a Linear's bias too) */
  double bound = NAN, in_sq = NAN, in_max = NAN;
  int origin = (int)(o - r);
  call_in_max(r, origin, l, in, &in_sq, &in_max);
  if (in && (lkind == PROBE_KIND_LINEAR || lkind == PROBE_KIND_ATTENTION) &&
      l->weight >= 0)
    bound = sqrt(call_weight_sumsq(r, origin, l)) * (sqrt(in_sq) + 1.0);
  else if (in && is_norm_kind(lkind) && isfinite(in_max))
    bound = in_max * in_max;
  /* the range the bound is judged against: BF16's for a BF16 layer (it
   * has FP32's range, so what overflows FP16 may not overflow it), else
   * FP16's (an FP32 layer's input came from the FP16 layers) */
  int prec = d->layers[o->layer].info.precision;
  int range = prec == PROBE_DTYPE_BF16 ? PROBE_DTYPE_BF16 : PROBE_DTYPE_F16;
  double pmax = probe__diag_range_max(range);
  const char *plabel = probe__diag_prec_label(range);
  /* the bound over every weight record of the call (a Linear's weight
   * and bias are two records; l->weight is the last of them) */
  e->origin_bound = bound;
  if (in && (lkind == PROBE_KIND_LINEAR || lkind == PROBE_KIND_ATTENTION) &&
      l->weight >= 0)
    e->origin_bound = sqrt(call_weight_sumsq(r, (int)(o - r), l)) *
                      (sqrt(in->sumsq) + 1.0);
  int can_overflow = !(bound < pmax); /* NaN: cannot tell */
  if (lkind == PROBE_KIND_LOSS) can_overflow = 0; /* FP32, probabilities */
  /* An FP16 layer whose input (recorded as it arrived, before the cast)
   * holds finite values beyond FP16's range: they are inf once cast. The
   * overflow happened upstream, in code between modules that no record
   * covers (a residual add, a matmul outside a module). */
  if (in && in->f16_overflow > 0 && prec == PROBE_DTYPE_F16) {
    *kind = PROBE_DIAG_EVENT_OVERFLOW;
    /* the recorded data itself holds them: no code between modules */
    if (feeder_kind == PROBE_KIND_INPUT && r[feeder].stats.f16_overflow > 0) {
      snprintf(ev, evl,
               PROBE__DIAG_RAW_INPUT "%llu finite values >= 65520 (absmax "
               "%.6g), inf once cast to FP16 by '%.60s'; normalise or scale "
               "the data (or keep the layers it reaches in FP32)",
               (unsigned long long)r[feeder].stats.f16_overflow,
               (double)r[feeder].stats.absmax, d->layers[o->layer].display);
      return;
    }
    snprintf(ev, evl,
             "%s was already beyond FP16's range when it arrived: "
             "%llu finite values >= 65520 (absmax %.6g) are inf once cast to "
             "FP16; they were made upstream, in code between modules that is "
             "not recorded (a residual add, an op outside any module)",
             lab, (unsigned long long)in->f16_overflow, (double)in->absmax);
    return;
  }
  if ((out_inf || saved_inf) && in_zero && flushed &&
      can_make_inf_from_zero(d, lkind) && !can_overflow) {
    *kind = PROBE_DIAG_EVENT_UNDERFLOW_TO_INF;
    snprintf(ev, evl,
             "%s held %llu zeros that came from flushing (%s) and a "
             "%s can turn a zero into inf; its inputs' magnitudes cannot "
             "overflow %s (bound %.3g < %.6g)",
             lab, (unsigned long long)in->zero_count,
             in->f16_flush > 0 ? "values at or below 2^-25 in its input"
             : (feeder_kind == PROBE_KIND_SOFTMAX ||
                feeder_kind == PROBE_KIND_ATTENTION)
                 ? "fed by a softmax, whose outputs are zero only by underflow"
                 : "subnormal values beside the zeros",
             lkind == PROBE_KIND_LOSS ? "log" : "division or 1/sqrt", plabel,
             isfinite(bound) ? bound : 0.0, pmax);
    return;
  }
  if (saved_inf || rec_nf(r, l->fwd_saved)) {
    *kind = stats_has_inf(&r[l->fwd_saved].stats)
                ? PROBE_DIAG_EVENT_REDUCTION_OVERFLOW
                : PROBE_DIAG_EVENT_INF_ARITH_NAN;
  } else if (out_inf) {
    *kind = PROBE_DIAG_EVENT_OVERFLOW;
  } else {
    *kind = PROBE_DIAG_EVENT_INF_ARITH_NAN;
  }
  if (isfinite(bound) && can_overflow)
    snprintf(ev, evl,
             "its inputs' magnitudes can overflow %s: %s %.3g >= %.6g%s", plabel,
             is_norm_kind(lkind) ? "absmax(x)^2 =" : "||W||*(||x||+1) =", bound,
             pmax, in_zero ? " (the zeros in its input do not explain it)" : "");
  else if (!out_inf && !saved_inf && *kind == PROBE_DIAG_EVENT_INF_ARITH_NAN &&
           in && !probe_stats_nonfinite(in) && l->in_n > 1)
    /* the input read is finite: so is every input of the call */
    snprintf(ev, evl,
             "its output holds NaN and no inf while all %d of its inputs are "
             "finite (input %d: absmax %.4g): its op made the NaN itself (0/0, "
             "inf-inf, or a sqrt or log of a negative value)",
             (int)l->in_n, (int)l->in_pos, (double)in->absmax);
  else if (!out_inf && !saved_inf && *kind == PROBE_DIAG_EVENT_INF_ARITH_NAN &&
           in && !probe_stats_nonfinite(in))
    snprintf(ev, evl,
             "its output holds NaN and no inf while its input is finite "
             "(absmax %.4g): its op made the NaN itself (0/0, inf-inf, or a "
             "sqrt or log of a negative value)",
             (double)in->absmax);
  else if (in_zero && lkind == PROBE_KIND_OTHER)
    snprintf(ev, evl,
             "%s holds %llu zeros; whether this custom module (kind "
             "other) can make inf from a zero (a division, a log) is unknown",
             lab, (unsigned long long)in->zero_count);
  else if (in_zero && !can_make_inf_from_zero(d, lkind))
    snprintf(ev, evl,
             "a %s cannot turn the %llu zeros of %s into inf: the "
             "values overflowed",
             probe_kind_name((probe_kind)lkind),
             (unsigned long long)in->zero_count, lab);
  else if (in_zero && !flushed)
    snprintf(ev, evl,
             "the %llu zeros of %s are exact (no flushing evidence): "
             "not an underflow",
             (unsigned long long)in->zero_count, lab);
}

/* A backward inf of a custom module (kind other: what its backward does
 * is unknown) from a finite incoming gradient, at no more positions than
 * one of its forward values (input, output, saved) holds exact zeros with
 * no sign of flushing (no value that flushes in FP16, no subnormal beside
 * them): a division by those zeros (g / y, g / sqrt(x) of a ReLU's zeros),
 * which makes inf in any precision and at any loss scale. A module of a
 * known kind, a non-finite incoming gradient, or more inf than zeros keep
 * the gradient-overflow reading. Sets e->origin_divides_zeros and its
 * evidence. */
static void classify_backward(probe_diag *e, const probe_record *r,
                              const probe_record *o, const layer_step *l,
                              int lkind) {
  if (lkind != PROBE_KIND_OTHER || !is_bwd_out(o->site) || l->grad_out < 0 ||
      probe_stats_nonfinite(&r[l->grad_out].stats))
    return;
  const int fwd[3] = {l->fwd_in, l->fwd_out, l->fwd_saved};
  const probe_stats *z = NULL;
  for (int k = 0; k < 3; k++) {
    if (fwd[k] < 0) continue;
    const probe_stats *st = &r[fwd[k]].stats;
    if (probe_stats_nonfinite(st) || probe__diag_zeros_flushed(st)) continue;
    if (!z || st->zero_count > z->zero_count) z = st;
  }
  uint64_t nf = o->stats.nan_count + o->stats.posinf_count +
                o->stats.neginf_count;
  if (!z || z->zero_count == 0 || nf > z->zero_count) return;
  e->origin_divides_zeros = 1;
  e->origin_fwd_zeros = z->zero_count;
  if (stats_has_inf(&o->stats))
    snprintf(e->event_evidence, sizeof e->event_evidence,
             "its grad_out was finite (absmax %.4g), its %s holds %llu "
             "inf/NaN, no more than the %llu exact zeros (not flushed) of its "
             "forward values: a division by 0 (g/y), inf in any precision",
             (double)r[l->grad_out].stats.absmax,
             probe_site_name((probe_site)o->site), (unsigned long long)nf,
             (unsigned long long)z->zero_count);
  else
    snprintf(e->event_evidence, sizeof e->event_evidence,
             "its grad_out was finite (absmax %.4g), its %s holds %llu NaN "
             "and no inf, no more than the %llu exact zeros (not flushed) of "
             "its forward values: a 0 times an infinite or NaN derivative at "
             "those zeros (the masked-out branch of a where, sqrt' or log' "
             "at 0), NaN in any precision",
             (double)r[l->grad_out].stats.absmax,
             probe_site_name((probe_site)o->site), (unsigned long long)nf,
             (unsigned long long)z->zero_count);
}

/* A value the origin received shows no sign of the range of FP16: finite,
 * nothing that overflows when an FP16 layer casts it, no zeros that came
 * from flushing. */
static int in_range(const probe_stats *s, int prec) {
  return !stats_nonfinite(s) &&
         !(prec == PROBE_DTYPE_F16 && s->f16_overflow > 0) &&
         !probe__diag_zeros_flushed(s);
}

/* Every record of `site` of `layer` in [lo, hi) is in range (in_range);
 * lo < 0: none checked. */
static int inputs_in_range(const probe_record *r, int lo, int hi, int32_t layer,
                           int site, int prec) {
  for (int k = lo; k >= 0 && k < hi; k++)
    if (r[k].layer == layer && r[k].site == site && !in_range(&r[k].stats, prec))
      return 0;
  return 1;
}

/* A NaN-only event (no inf in the origin's output) whose records rule out
 * the precision (docs/precision.md, "Not a precision problem"): FP16 makes
 * a NaN out of finite values only through an inf (an overflow, then
 * inf-inf or 0*inf), a zero that flushed (0/0), or a rounding that turns a
 * small positive into a negative (a variance E[x^2]-E[x]^2). Ruled out:
 *  - the origin runs in FP32 (in a mixed run) and what it received was
 *    finite and in range: its op does the same in the FP32 run;
 *  - an attention whose inputs bound every score and output below the
 *    range: ||W||^2 (||x||+1)^2 (each of q, k is at most ||W||_F (||x||_F
 *    + 1), the bias counted in W, so |q.k| is at most their product; the
 *    output projection of a convex mix of v rows stays below it too); the
 *    NaN is then a row with every position masked (softmax of all -inf);
 *  - a normalisation whose NaN are no more than the exact zeros of its
 *    finite input, with absmax^2 below the range: rows of zeros (variance
 *    exactly 0 in any precision, 0/sqrt(0) with an eps of 0).
 * A NaN from an unknown op (kind other) with no zeros to explain it keeps
 * the precision reading: a rounding inside it can make a negative. Sets
 * e->origin_not_precision and writes the evidence. */
static void rule_out_precision(walker *w, probe_diag *e, const probe_record *r,
                               int origin, const layer_step *l, int lkind,
                               int fwd) {
  const probe_diag *d = w->d;
  const probe_record *o = &r[origin];
  if (stats_has_inf(&o->stats) || o->stats.nan_count == 0 ||
      lkind == PROBE_KIND_LOSS || lkind == PROBE_KIND_INPUT)
    return;
  int prec = d->layers[o->layer].info.precision;
  int range = prec == PROBE_DTYPE_BF16 ? PROBE_DTYPE_BF16 : PROBE_DTYPE_F16;
  double pmax = probe__diag_range_max(range);
  const char *plabel = probe__diag_prec_label(range);
  char *ev = e->event_evidence;
  size_t evl = sizeof e->event_evidence;
  unsigned long long nan = (unsigned long long)o->stats.nan_count;
  /* forward values the op used: its input (forward), or its incoming
   * gradient and its forward values (backward) */
  const int need[3] = {fwd ? l->fwd_in : l->grad_out, fwd ? -1 : l->fwd_in,
                       fwd ? -1 : l->fwd_out};
  if (need[0] < 0) return;
  for (int k = 0; k < 3; k++)
    if (need[k] >= 0 && !in_range(&r[need[k]].stats, prec)) return;
  /* ... and so were the call's other inputs (an RNN cell's x beside h,
   * an attention's query beside its memory): every input record of the
   * call, and backward every forward input of the layer in the step (the
   * records do not say which forward call a backward call undoes) */
  if (!inputs_in_range(r, l->call_first, origin, o->layer,
                       fwd ? PROBE_SITE_FWD_IN : PROBE_SITE_GRAD_OUT, prec) ||
      (!fwd && !inputs_in_range(r, 0, origin, o->layer, PROBE_SITE_FWD_IN, prec)))
    return;
  const probe_stats *in = &r[need[0]].stats;
  if (prec == PROBE_DTYPE_F32 && l->in_n > 1) {
    e->origin_not_precision = 1;
    snprintf(ev, evl,
             "it runs in FP32 and its %s made %llu NaN (no inf) from %d "
             "finite %s (largest absmax %.4g), none flushed, nothing beyond "
             "FP16's range: its op makes that NaN in an FP32 run too (0/0, "
             "0*inf, a sqrt or log of a negative value, a fully masked row)",
             fwd ? "forward" : "backward", nan, (int)(l->in_n % 1000),
             fwd ? "inputs" : "gradients", (double)in->absmax);
    return;
  }
  if (prec == PROBE_DTYPE_F32) {
    e->origin_not_precision = 1;
    snprintf(ev, evl,
             "it runs in FP32 and its %s made %llu NaN (no inf) from a finite "
             "%s (absmax %.4g, %llu zeros, none flushed, nothing beyond "
             "%s's range): its op makes that NaN in an FP32 run too (0/0, "
             "0*inf, a sqrt or log of a negative value, a fully masked row)",
             fwd ? "forward" : "backward", nan, fwd ? "input" : "gradient",
             (double)in->absmax, (unsigned long long)in->zero_count,
             probe__diag_prec_label(probe__diag_range_prec(d, o->layer)));
    return;
  }
  /* A custom module (kind other: its op is unknown) from values in range:
   * no overflow, no flush recorded. Nothing rules FP16 in or out (a
   * rounding inside the op can make a negative; the op can make the NaN
   * in any precision): the force-fp32 reading stands, as weak evidence
   * (explain_event says so). */
  if (lkind == PROBE_KIND_OTHER) {
    e->origin_precision_weak = 1;
    return;
  }
  if (!fwd) return;
  /* the bounds take the largest of the call's inputs */
  double in_sq, in_max;
  call_in_max(r, origin, l, in, &in_sq, &in_max);
  double sq = in_max * in_max;
  if (probe__diag_is_norm_kind(lkind) && in->zero_count >= o->stats.nan_count &&
      sq < pmax) {
    e->origin_not_precision = 1;
    if (l->in_n > 1)
      snprintf(ev, evl,
               "its %llu NaN are no more than the %llu exact zeros of its "
               "input %d of %d (all finite, none flushed): rows of zeros, "
               "whose variance is exactly 0 in any precision; largest "
               "absmax^2 = %.3g < %.6g, so its %s variance did not overflow",
               nan, (unsigned long long)in->zero_count, (int)(l->in_pos % 1000),
               (int)(l->in_n % 1000), sq, pmax, plabel);
    else
      snprintf(ev, evl,
               "its %llu NaN are no more than the %llu exact zeros of its finite "
               "input (none flushed): rows of zeros, whose variance is exactly 0 "
               "in any precision (0/sqrt(0 + eps), an eps of 0); absmax^2 = %.3g "
               "< %.6g, so its %s variance did not overflow",
               nan, (unsigned long long)in->zero_count, sq, pmax, plabel);
    return;
  }
  /* A BF16 op of a known kind, not a normalisation (whose variance can
   * round negative at BF16's 8 bits): it makes NaN of finite values only
   * through an inf, a value past BF16's ~3.39e38, which FP32 overflows too
   * but for the 0.4% between the two maxima. Nothing recorded rules BF16
   * in: weak evidence, as for a custom module (an attention whose scores
   * are bounded below is ruled out just below). */
  if (prec == PROBE_DTYPE_BF16 && !probe__diag_is_norm_kind(lkind))
    e->origin_precision_weak = 1;
  if (lkind == PROBE_KIND_ATTENTION) {
    double xn = sqrt(in_sq) + 1.0;
    double bound = call_weight_sumsq(r, origin, l) * xn * xn;
    if (!(bound < pmax)) return; /* NaN: no weights recorded */
    e->origin_not_precision = 1;
    if (l->in_n > 1)
      snprintf(ev, evl,
               "%d finite inputs (largest absmax %.4g, none flushed); its "
               "weights and largest input bound every score and output below "
               "%s's max (||W||^2 (||x||+1)^2 = %.3g < %.6g): nothing "
               "overflowed, its %llu NaN are its op's in any precision (a "
               "fully masked softmax row)",
               (int)(l->in_n % 1000), in_max, plabel, bound, pmax, nan);
    else
      snprintf(ev, evl,
               "finite input (absmax %.4g, none flushed); its weights and "
               "input bound every score and output below %s's max "
               "(||W||^2 (||x||+1)^2 = %.3g < %.6g): nothing overflowed, its "
               "%llu NaN are its op's in any precision (a fully masked softmax "
               "row)",
               in_max, plabel, bound, pmax, nan);
  }
}

/* Finds the origin of the step's first non-finite value and classifies it.
 * Writes the event fields of `e`. Returns 1 when the step holds one. */
/* Weights that are non-finite as the forward used them (their copy in the
 * layer's precision, record r[origin]) while the FP32 master weights the
 * previous step left were finite. Says which of two things the records
 * show in the event's evidence (explain_weights words its finding from
 * it; no evidence: neither):
 *  - the masters were beyond FP16's range: not a non-finite update but
 *    weights that outgrew FP16 (a learning rate too large for them, no
 *    weight decay);
 *  - the masters were within the copy's range after the step just before
 *    (no update comes between them and this forward): the weights were
 *    changed in between by something other than the optimizer (an in-place
 *    edit under no_grad, a load_state_dict, a hook); opens with
 *    PROBE__DIAG_WEIGHTS_EDITED, and gives this step's masters (after its
 *    update) when recorded. */
static void master_outgrew(walker *w, probe_diag *e, const probe_record *r,
                           size_t n, int origin) {
  const probe_diag *d = w->d;
  const probe_record *o = &r[origin];
  if (o->site != PROBE_SITE_WEIGHT || o->layer < 0 || o->layer >= d->n_layers)
    return;
  int prec = d->layers[o->layer].info.precision;
  const master_seen *m = &w->masters[o->layer];
  if (m->step < 0 || m->step >= o->step || !m->finite) return;
  if (prec == PROBE_DTYPE_F16 && m->absmax > (double)PROBE_F16_MAX) {
    snprintf(e->event_evidence, sizeof e->event_evidence,
             "its FP32 master weights were finite after step %lld's update "
             "(absmax %.4g), beyond FP16's %g: their FP16 copy, which the "
             "forward uses, is inf - the weights outgrew FP16, no non-finite "
             "update reached them",
             (long long)m->step, (double)m->absmax, (double)PROBE_F16_MAX);
    return;
  }
  /* the copy of finite masters within its range is finite; a gap in the
   * steps (a sampled trace) may hide updates */
  double copy_max = prec == PROBE_DTYPE_F32 ? (double)FLT_MAX
                                            : probe__diag_range_max(prec);
  if (m->step != o->step - 1 || !(m->absmax <= copy_max)) return;
  float after = -1;
  int after_nf = 0;
  for (size_t i = (size_t)origin + 1; i < n; i++)
    if (r[i].site == PROBE_SITE_MASTER_WEIGHT && r[i].layer == o->layer) {
      if (stats_nonfinite(&r[i].stats)) after_nf = 1;
      else if (r[i].stats.absmax > after) after = r[i].stats.absmax;
    }
  char now[96] = "";
  if (after >= 0 && !after_nf)
    snprintf(now, sizeof now, "; after step %lld's update they are absmax %.4g",
             (long long)o->step, (double)after);
  snprintf(e->event_evidence, sizeof e->event_evidence,
           PROBE__DIAG_WEIGHTS_EDITED "its FP32 masters were finite after "
           "step %lld's update (absmax %.4g, within %s's range), their %s copy "
           "is non-finite in step %lld's forward, before any update of it%s",
           (long long)m->step, (double)m->absmax, probe__diag_prec_label(prec),
           probe__diag_prec_label(prec), (long long)o->step, now);
}

/* Whether a value the step's forward made or used is non-finite: a
 * forward-phase record (the weights' copy included) or the input's. A
 * step whose first non-finite record is a gradient the all-reduce
 * returned counts as one too: the value came from another rank or the
 * sum, and a rank's logged loss may be the mean over the ranks. */
static int forward_nonfinite(const probe_diag *d, const probe_record *r, size_t n) {
  int seen = 0;
  for (size_t i = 0; i < n; i++) {
    if (!rec_event_nf(d, &r[i])) continue;
    if (r[i].site == PROBE_SITE_GRAD_POST_ALLREDUCE && !seen) return 1;
    seen = 1;
    if (probe_site_phase((probe_site)r[i].site) == PROBE_PHASE_FORWARD) return 1;
    if (r[i].layer >= 0 && r[i].layer < d->n_layers &&
        d->layers[r[i].layer].info.kind == PROBE_KIND_INPUT)
      return 1;
  }
  return 0;
}

/* The output the loss was computed from: the forward output of the layer
 * whose incoming gradient (grad_out) is the step's first non-finite
 * record, the gradient the loss sent back; else the step's last forward
 * output. -1 when the step has none. */
static int loss_input_record(const walker *w, const probe_record *r, size_t n) {
  const probe_diag *d = w->d;
  int last_out = -1;
  for (size_t i = 0; i < n; i++) {
    int valid = r[i].layer >= 0 && r[i].layer < d->n_layers;
    if (valid && r[i].site == PROBE_SITE_FWD_OUT &&
        d->layers[r[i].layer].info.kind != PROBE_KIND_INPUT)
      last_out = (int)i;
    if (!rec_event_nf(d, &r[i])) continue;
    if (valid && r[i].site == PROBE_SITE_GRAD_OUT && w->ls[r[i].layer].fwd_out >= 0)
      return w->ls[r[i].layer].fwd_out;
    break;
  }
  return last_out;
}

/* Whether a layer of the trace (not the input) has no forward record in
 * this step: a selection (layers=, sampled sites) left it out, and a value
 * it made would not show. */
static int unrecorded_layers(const walker *w) {
  const probe_diag *d = w->d;
  for (int64_t i = 0; i < d->n_layers; i++) {
    if (d->layers[i].info.kind == PROBE_KIND_INPUT) continue;
    const layer_step *l = &w->ls[i];
    if (l->fwd_out < 0 && l->fwd_in < 0) return 1;
  }
  return 0;
}

/* The step's loss was non-finite while every value its forward recorded
 * was finite: the loss computation, outside the recorded modules (a loss
 * written as a plain function in the training loop, or code after the loss
 * module), made it; the non-finite gradients and weights of the step came
 * from it. When the loss's input holds exact zeros that can only be
 * underflow (a softmax or attention output, or values flushed in FP16), the
 * event is the log or division of 0 in the loss: underflow-to-inf at that
 * output, whose record index is returned. Otherwise the event is
 * loss-nonfinite with no origin layer (fed_by: the loss's input) and the
 * return is -1. */
static int loss_outside_modules(walker *w, probe_diag *e, const probe_record *r,
                                size_t n, int64_t step) {
  const probe_diag *d = w->d;
  int in = loss_input_record(w, r, n);
  const probe_stats *out = in >= 0 ? &r[in].stats : NULL;
  int lkind = in >= 0 ? d->layers[r[in].layer].info.kind : -1;
  int prec = in >= 0 ? d->layers[r[in].layer].info.precision : -1;
  int probs = lkind == PROBE_KIND_SOFTMAX || lkind == PROBE_KIND_ATTENTION;
  int by_underflow = probs || (prec != PROBE_DTYPE_F32 && out && out->f16_flush > 0);
  if (out && out->zero_count > 0 && by_underflow) {
    e->event = PROBE_DIAG_EVENT_UNDERFLOW_TO_INF;
    snprintf(e->event_evidence, sizeof e->event_evidence,
             "the loss, computed outside any recorded module from this "
             "output, was non-finite at step %lld while the output was "
             "finite: it held %llu exact zeros (%s) and a log or division of "
             "0 is inf; a loss taken from the logits (log_softmax, "
             "cross_entropy)%s avoids it",
             (long long)step, (unsigned long long)out->zero_count,
             probs ? "probabilities that underflowed" : "values flushed to zero",
             prec == PROBE_DTYPE_F32 ? "" : " in FP32");
    return in;
  }
  e->event = PROBE_DIAG_EVENT_LOSS_ONLY;
  e->event_step = step;
  e->event_phase = PROBE_PHASE_FORWARD;
  e->origin_layer = -1;
  e->origin_site = PROBE_SITE_FWD_OUT;
  e->feeder_layer = in >= 0 ? r[in].layer : -1;
  e->feeder_call = e->feeder_calls = 0;
  e->origin_call = e->origin_calls = 0;
  e->origin_in_index = e->origin_in_count = 0;
  if (in >= 0)
    e->feeder_calls = calls_of(r, n, r[in].layer, 1, (size_t)in,
                               &e->feeder_call, NULL);
  e->nan_from_inf_layer = -1;
  e->n_passed = 0;
  e->more_passed = 0;
  e->n_history = 0;
  char from[200] = "";
  if (out)
    snprintf(from, sizeof from, " (its input '%.120s': absmax %.4g, %llu zeros)",
             d->layers[r[in].layer].display, (double)out->absmax,
             (unsigned long long)out->zero_count);
  snprintf(e->event_evidence, sizeof e->event_evidence,
           "loss non-finite at step %lld, every forward value recorded "
           "finite%s: made by the loss computation%s",
           (long long)step, from,
           unrecorded_layers(w) ? " or by a module this step did not record"
                                      : " (a log or division of 0)");
  return -1;
}

/* A weight-nonfinite event at a master_weight record, which is taken
 * after the step's optimizer update: every record before it in the step
 * was finite (analyse_step), so the update made the value - from the
 * finite weights and gradient the step recorded, or from a gradient the
 * step did not record. Writes the evidence, opening with
 * PROBE__DIAG_WEIGHTS_UPDATED (explain_weights words its finding from it). */
static void master_updated(walker *w, probe_diag *e, const probe_record *r,
                           int origin) {
  const probe_record *o = &r[origin];
  if (o->site != PROBE_SITE_MASTER_WEIGHT || o->layer < 0 ||
      o->layer >= w->d->n_layers)
    return;
  const layer_step *l = &w->ls[o->layer];
  char wt[96] = "", gr[160];
  if (l->weight >= 0 && l->weight < origin)
    snprintf(wt, sizeof wt, "its weights as the forward used them (absmax "
             "%.4g) and ", (double)r[l->weight].stats.absmax);
  if (l->wgrad >= 0 && l->wgrad < origin)
    snprintf(gr, sizeof gr, "%sits gradient (weight_grad, absmax %.4g, %llu "
             "exact zeros) were finite", wt, (double)r[l->wgrad].stats.absmax,
             (unsigned long long)r[l->wgrad].stats.zero_count);
  else
    snprintf(gr, sizeof gr, "%severy record of the step before it was finite; "
             "its gradient was not recorded", wt);
  snprintf(e->event_evidence, sizeof e->event_evidence,
           PROBE__DIAG_WEIGHTS_UPDATED "step %lld's update wrote %llu NaN, "
           "%llu inf into the master weights, which are recorded after it; "
           "%s",
           (long long)o->step, (unsigned long long)o->stats.nan_count,
           (unsigned long long)(o->stats.posinf_count + o->stats.neginf_count),
           gr);
}

/* A gradient overflow first seen at an FP16 layer's grad_out, handed over
 * by a layer whose grad_in (recorded as it left, before the cast) was
 * finite but held values >= 65520: inf once cast to FP16 at the entry -
 * the backward twin of the forward's "overflow upstream", a record covers
 * it (the FP32 loss's own gradient, times the loss scale). Writes the
 * evidence, opening with PROBE__DIAG_HANDOVER. */
static void handover_overflow(walker *w, probe_diag *e, const probe_record *r,
                              const probe_record *o, const layer_step *l) {
  const probe_diag *d = w->d;
  if (l->grad_feed < 0 || d->layers[o->layer].info.precision != PROBE_DTYPE_F16)
    return;
  const probe_record *f = &r[l->grad_feed];
  if (f->layer < 0 || f->layer >= d->n_layers || stats_nonfinite(&f->stats) ||
      f->stats.f16_overflow == 0)
    return;
  snprintf(e->event_evidence, sizeof e->event_evidence,
           PROBE__DIAG_HANDOVER "'%.40s' (%s) handed '%.40s' a finite "
           "gradient with %llu values >= 65520 (absmax %.4g): inf once cast "
           "to FP16 at its entry; a record made it, "
           "not code between modules",
           d->layers[f->layer].display,
           probe__diag_prec_label(d->layers[f->layer].info.precision),
           d->layers[o->layer].display,
           (unsigned long long)f->stats.f16_overflow, (double)f->stats.absmax);
}

/* A gradient first non-finite at a grad_out whose update the step applied:
 * the master weights recorded after the update are non-finite. Appends
 * that to the evidence (the finding names the gradient, the weights are
 * where it ended). */
static void update_applied(walker *w, probe_diag *e, const probe_record *r,
                           size_t n, int origin) {
  const probe_diag *d = w->d;
  for (size_t i = (size_t)origin + 1; i < n; i++) {
    if (r[i].site != PROBE_SITE_MASTER_WEIGHT || !stats_nonfinite(&r[i].stats) ||
        r[i].layer < 0 || r[i].layer >= d->n_layers)
      continue;
    size_t at = strlen(e->event_evidence);
    snprintf(e->event_evidence + at, sizeof e->event_evidence - at,
             "%sthe step's optimizer update applied it: the master weights "
             "of '%.120s' are non-finite after it",
             at ? "; " : "", d->layers[r[i].layer].display);
    return;
  }
}

static int analyse_step(walker *w, probe_diag *e, const probe_record *r,
                        size_t n, int64_t step, int loss_nf) {
  const probe_diag *d = w->d;
  int origin = -1; /* record index */
  probe_diag_event kind = PROBE_DIAG_EVENT_NONE;
  int from_loss = loss_nf && !forward_nonfinite(d, r, n);
  if (from_loss) {
    origin = loss_outside_modules(w, e, r, n, step);
    if (origin < 0) return 1; /* loss-nonfinite, no origin layer */
    kind = e->event;
  }
  int seen_nf = 0; /* a non-finite record came before x in the step */
  for (size_t i = 0; i < n && origin < 0; i++) {
    const probe_record *x = &r[i];
    if (!rec_event_nf(d, x)) continue;
    if (x->layer < 0 || x->layer >= d->n_layers) continue;
    int lkind = d->layers[x->layer].info.kind;
    const layer_step *l = &w->ls[x->layer];
    int after_nf = seen_nf;
    seen_nf = 1;
    if (lkind == PROBE_KIND_INPUT) {
      origin = (int)i;
      kind = PROBE_DIAG_EVENT_INPUT_NAN;
    } else if (x->site == PROBE_SITE_MASTER_WEIGHT && after_nf) {
      /* master weights are recorded after the update: a non-finite
       * record before them in the step (a gradient that arrived
       * non-finite at a grad_out: a loss Function's backward, code no
       * record covers) is what the update applied; the first such record
       * is the origin (below), the master weights are where it ended */
      break;
    } else if (is_weight(x->site)) {
      origin = (int)i;
      kind = PROBE_DIAG_EVENT_WEIGHT_NONFINITE;
    } else if (x->site == PROBE_SITE_GRAD_POST_ALLREDUCE) {
      /* what this rank sent (PRE, earlier in the step) was finite, or it
       * would have come first */
      origin = (int)i;
      kind = PROBE_DIAG_EVENT_ALLREDUCE;
    } else if (x->site == PROBE_SITE_GRAD_PRE_ALLREDUCE) {
      /* the cast to the all-reduce's dtype overflowed: the gradients
       * before it were finite, or they would have come first; keeping a
       * layer in FP32 does not change that cast */
      origin = (int)i;
      kind = PROBE_DIAG_EVENT_ALLREDUCE;
    } else if (x->site == PROBE_SITE_FWD_IN) {
      /* the step's first non-finite value arrived in a module's input:
       * nothing recorded before made it (a forward output that did would
       * have come first): the data with no input layer recorded, or code
       * between modules (the clean-input finding says so). A weight or
       * master weight later in the step, made non-finite by it, is not
       * the origin (it was: weight-nonfinite at master_weight) */
      origin = (int)i;
    } else if (is_fwd_out(x->site) || is_bwd_out(x->site)) {
      layer_step call = call_of(l, r, i, d->layers[x->layer].info.precision);
      if (!inputs_nonfinite(&call, r, x->site)) origin = (int)i;
    }
  }
  if (origin < 0) {
    /* Nothing produced it from finite inputs (its producer was not
     * recorded): blame the first non-finite record. */
    for (size_t i = 0; i < n; i++)
      if (rec_event_nf(d, &r[i])) {
        origin = (int)i;
        break;
      }
  }
  if (origin < 0) return 0;
  if (!from_loss) e->event_evidence[0] = '\0';
  if (kind == PROBE_DIAG_EVENT_WEIGHT_NONFINITE) {
    master_outgrew(w, e, r, n, origin);
    master_updated(w, e, r, origin);
  }

  const probe_record *o = &r[origin];
  layer_step call = w->ls[o->layer];
  if (is_fwd_out(o->site) || is_bwd_out(o->site))
    call = call_of(&w->ls[o->layer], r, (size_t)origin,
                   d->layers[o->layer].info.precision);
  else if (o->site == PROBE_SITE_FWD_IN || o->site == PROBE_SITE_GRAD_OUT)
    input_place(r, n, (size_t)origin, &call.in_pos, &call.in_n);
  const layer_step *l = &call;
  int lkind = d->layers[o->layer].info.kind;
  int fwd = !is_bwd_out(o->site) && o->site != PROBE_SITE_GRAD_OUT &&
            !is_allreduce(o->site);
  int in_idx = fwd ? l->fwd_in : l->grad_out;
  /* Which call of its module the origin was, and the feeder: the layer
   * whose output came last before the origin call's first record of that
   * phase - an earlier call of the same module too (h = mix(mix(h) * 50)).
   * A record that is no part of a call (master weights, an all-reduce
   * bucket): before the origin's input, or the origin, the same layer's
   * records skipped. */
  int call_first = -1;
  e->origin_calls = calls_of(r, n, o->layer, fwd, (size_t)origin,
                             &e->origin_call, &call_first);
  if (!e->origin_call) e->origin_calls = 0;
  int first = call_first;
  if (first < 0) {
    first = origin;
    int origin_first = fwd ? l->fwd_in : l->grad_out;
    if (origin_first >= 0 && origin_first < first) first = origin_first;
  }
  int feeder = feeder_of(d, r, first, o->layer, fwd, call_first >= 0);
  /* a call with several inputs: the feeder of the input read (origin_in),
   * none when no record handed it over (docs/precision.md, "A module
   * called with several inputs") */
  if (l->in_n > 1 && in_idx >= 0 && call_first >= 0)
    feeder = input_feeder(d, r, call_first, in_idx, fwd);
  e->feeder_layer = feeder >= 0 ? r[feeder].layer : -1;
  e->feeder_call = e->feeder_calls = 0;
  if (feeder >= 0)
    e->feeder_calls = calls_of(r, n, r[feeder].layer, fwd, (size_t)feeder,
                               &e->feeder_call, NULL);
  if (kind == PROBE_DIAG_EVENT_NONE) {
    if (!fwd) {
      kind = stats_has_inf(&o->stats) ? PROBE_DIAG_EVENT_GRAD_OVERFLOW
                                      : PROBE_DIAG_EVENT_INF_ARITH_NAN;
      classify_backward(e, r, o, l, lkind);
      if (kind == PROBE_DIAG_EVENT_GRAD_OVERFLOW && o->site == PROBE_SITE_GRAD_OUT)
        handover_overflow(w, e, r, o, l);
      if (o->site == PROBE_SITE_GRAD_OUT) update_applied(w, e, r, n, origin);
    } else {
      const probe_stats *in = in_idx >= 0 ? &r[in_idx].stats : NULL;
      int out_inf = rec_nf(r, l->fwd_out) && stats_has_inf(&r[l->fwd_out].stats);
      int saved_inf =
          rec_nf(r, l->fwd_saved) && stats_has_inf(&r[l->fwd_saved].stats);
      classify_forward(w, e, r, o, l, lkind, in, out_inf, saved_inf, feeder,
                       &kind);
    }
    if (kind == PROBE_DIAG_EVENT_INF_ARITH_NAN && !e->origin_divides_zeros)
      rule_out_precision(w, e, r, origin, l, lkind, fwd);
  }
  e->event = kind;
  e->event_step = step;
  e->event_phase = probe_site_phase((probe_site)o->site);
  e->origin_layer = o->layer;
  e->origin_site = (probe_site)o->site;
  e->origin_out = o->stats;
  e->have_origin_in = in_idx >= 0;
  if (in_idx >= 0) e->origin_in = r[in_idx].stats;
  /* which input record of the call origin_in is (or the origin is, an
   * input itself), of how many; 0 of 0 when not known */
  e->origin_in_index = l->in_pos;
  e->origin_in_count = l->in_pos > 0 ? l->in_n : 0;
  /* A loss made NaN from a finite prediction: its targets are not
   * recorded (the trainer and the tracer record the prediction only), and
   * a NaN among them does the same. */
  if (lkind == PROBE_KIND_LOSS && o->site == PROBE_SITE_FWD_OUT &&
      o->stats.nan_count > 0 && in_idx >= 0 &&
      !stats_nonfinite(&r[in_idx].stats)) {
    size_t at = strlen(e->event_evidence);
    snprintf(e->event_evidence + at, sizeof e->event_evidence - at,
             "%sa loss's targets are not recorded: a NaN among them (the "
             "data) does this too - check step %lld's targets",
             at ? "; or " : "", (long long)step);
  }

  /* Layers that passed it on, and the first that made NaN out of inf. */
  e->n_passed = 0;
  e->more_passed = 0;
  e->nan_from_inf_layer = -1;
  /* The origin itself made NaN out of its own inf (e.g. a saved variance). */
  if (o->stats.nan_count > 0 && kind != PROBE_DIAG_EVENT_INPUT_NAN &&
             kind != PROBE_DIAG_EVENT_WEIGHT_NONFINITE &&
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
    if (e->n_passed < PROBE_DIAG_MAX_PASSED)
      e->passed[e->n_passed++] = x->layer;
    else
      e->more_passed++;
  }

  /* History of the origin's absmax (ring, oldest first). */
  int64_t cnt = w->hist_count[o->layer];
  int h = cnt < w->hist_len ? (int)cnt : w->hist_len;
  e->n_history = 0;
  for (int k = 0; k < h && e->n_history < PROBE_DIAG_HISTORY_MAX; k++) {
    int64_t idx = (cnt - h + k) % w->hist_len;
    const hist_point *p = &w->hist[(int64_t)o->layer * w->hist_len + idx];
    double a = fwd ? p->fwd_absmax : p->bwd_absmax;
    e->history[e->n_history].step = p->step;
    e->history[e->n_history].absmax = a;
    e->history[e->n_history].headroom =
        probe__diag_headroom_in(a, probe__diag_range_prec(w->d, o->layer));
    e->n_history++;
  }
  return 1;
}

/* Silent faults of one layer at one step after warm-up (docs/precision.md,
 * "Silent faults"): a forward output or saved intermediate holding inf/NaN,
 * and for a normalisation running in FP16/BF16 a collapse - its saved
 * statistic overflowed (inf/NaN), its saved 1/std holds exact zeros (only
 * an infinite variance gives 1/sqrt(var) = 0), its saved variance holds
 * exact zeros that the input's own zeros cannot explain (a variance that
 * rounded to 0: fewer zero input values than the zero-variance rows or
 * features would need), or its output's variance fell below
 * PROBE_DIAG_COLLAPSE_VAR_FRAC of its weights' mean square while its
 * input's variance did not. */
static void silent_faults(walker *w, probe_diag_layer *dl, const layer_step *l,
                          const probe_record *r, int64_t step) {
  int fwd_nf = rec_nf(r, l->fwd_out) || rec_nf(r, l->fwd_saved);
  if (fwd_nf && dl->info.kind != PROBE_KIND_INPUT) {
    if (dl->fwd_nonfinite_steps++ == 0) dl->fwd_nonfinite_first = step;
  }
  (void)w;
  if (!is_norm_kind(dl->info.kind) || dl->info.precision == PROBE_DTYPE_F32)
    return;
  if (l->fwd_in < 0 || rec_nf(r, l->fwd_in)) return; /* a carried fault */
  const probe_stats *in = &r[l->fwd_in].stats;
  double in_var = stats_var(in);
  if (!(in_var > 0)) return; /* a constant input collapses legitimately */
  const probe_stats *sv = l->fwd_saved >= 0 ? &r[l->fwd_saved].stats : NULL;
  int saved_inf = sv && stats_nonfinite(sv);
  int zero_rstd = 0, zero_var = 0;
  if (sv && sv->zero_count > 0 && sv->count > 0 && in->count >= sv->count) {
    /* per saved value (a row or a feature), in->count / sv->count inputs */
    double per = (double)in->count / (double)sv->count;
    int explained = (double)in->zero_count >= (double)sv->zero_count * per;
    if (dl->info.kind == PROBE_KIND_LAYERNORM && !explained) zero_rstd = 1;
    if (dl->info.kind == PROBE_KIND_BN && !explained) zero_var = 1;
  }
  double out_var = l->fwd_out >= 0 ? stats_var(&r[l->fwd_out].stats) : NAN;
  double w_ms = 1.0;
  if (l->weight >= 0 && probe_stats_finite(&r[l->weight].stats))
    w_ms = r[l->weight].stats.sumsq /
           (double)probe_stats_finite(&r[l->weight].stats);
  int var_collapse = isfinite(out_var) && w_ms > 0 &&
                     out_var < PROBE_DIAG_COLLAPSE_VAR_FRAC * w_ms &&
                     in_var > PROBE_DIAG_COLLAPSE_VAR_FRAC * w_ms;
  if (!(saved_inf || zero_rstd || zero_var || var_collapse)) return;
  probe_diag_collapse *c = &dl->collapse;
  if (c->steps++ == 0) {
    c->first_step = step;
    c->saved_inf = saved_inf;
    c->saved_zero_rstd = zero_rstd;
    c->saved_zero = (zero_rstd || zero_var) ? sv->zero_count : 0;
    c->saved_count = sv ? sv->count : 0;
    c->out_var = out_var;
    c->in_var = in_var;
  }
}

/* The spacing (ulp) of FP16, or BF16 for a BF16 layer, at magnitude x:
 * 2^(e - 10) (2^(e - 7)) in the binade [2^e, 2^(e+1)), the subnormal
 * spacing below the smallest normal. */
static double spacing_at(double x, int dtype) {
  int mant = dtype == PROBE_DTYPE_BF16 ? 7 : 10;
  int emin = dtype == PROBE_DTYPE_BF16 ? -126 : -14;
  if (!(x >= ldexp(1.0, emin))) return ldexp(1.0, emin - mant);
  int e;
  frexp(x, &e); /* x = f * 2^e, f in [0.5, 1) */
  return ldexp(1.0, e - 1 - mant);
}

/* Data below resolution (docs/precision.md): the FP32 values entering FP16
 * (BF16) layer dl at this step vary (max > min) but their spread is below
 * the precision's spacing at their level - the smallest magnitude they
 * reach, where the spacing is finest: std < PROBE_DIAG_RESOLUTION_STD_FRAC
 * of it, or max - min below one spacing. The std comes from sum and sumsq,
 * whose var = sumsq/n - mean^2 cancels at a level far above the spread;
 * with the n-term summation bound of docs/statistics.md its error is at
 * most 2n eps (sumsq/n + 2 |mean| absmax). A step the bound leaves on
 * either side of the threshold (and the range does not decide) counts as
 * uncertain, not as below. */
static void below_resolution(walker *w, probe_diag_layer *dl,
                             const layer_step *l, const probe_record *r,
                             int64_t step) {
  const probe_diag *d = w->d;
  int prec = dl->info.precision;
  if (prec == PROBE_DTYPE_F32 || dl->info.kind == PROBE_KIND_INPUT ||
      dl->info.kind == PROBE_KIND_LOSS || l->fwd_in < 0)
    return;
  const probe_record *x = &r[l->fwd_in];
  const probe_stats *s = &x->stats;
  uint64_t n = probe_stats_finite(s);
  if (x->dtype != PROBE_DTYPE_F32 || stats_nonfinite(s) || n < 2 ||
      !(s->absmax <= probe__diag_range_max(prec)))
    return;
  probe_diag_resolution *rs = &dl->resolution;
  rs->seen++;
  if (!(s->max > s->min)) return; /* constant in FP32: nothing to lose */
  double lo = fabs((double)s->min), hi = fabs((double)s->max);
  double level = s->min <= 0 && s->max >= 0 ? 0.0 : (lo < hi ? lo : hi);
  double sp = spacing_at(level, prec);
  double m = s->sum / (double)n, q = s->sumsq / (double)n;
  double var = q - m * m;
  if (var < 0) var = 0;
  double err = 2.0 * (double)n * DBL_EPSILON * (q + 2.0 * fabs(m) * s->absmax);
  double thr = PROBE_DIAG_RESOLUTION_STD_FRAC * sp;
  int by_range = (double)s->max - (double)s->min < sp;
  int by_std = var + err < thr * thr;
  if (!by_range && !by_std) {
    if (var - err < thr * thr) rs->uncertain++;
    return;
  }
  if (rs->steps++ > 0) return;
  rs->first_step = step;
  rs->mean = m;
  rs->std = sqrt(var);
  rs->min = s->min;
  rs->max = s->max;
  rs->level = level;
  rs->spacing = sp;
  rs->by_range = by_range && !by_std;
  rs->from_input = 0;
  for (int64_t k = 0; k < d->n_layers; k++) {
    int o = w->ls[k].fwd_out;
    if (d->layers[k].info.kind != PROBE_KIND_INPUT || o < 0) continue;
    const probe_stats *t = &r[o].stats;
    if (t->count == s->count && t->sum == s->sum && t->sumsq == s->sumsq &&
        t->min == s->min && t->max == s->max)
      rs->from_input = 1;
  }
}

/* loss_nf: the step's loss is not finite; its layers' faults are then not
 * silent (they reached the loss) and are not counted as such. */
/* Whether the whole gradient an FP32 layer (the loss) handed to FP16
 * layer li at this step flushed to zero at the cast: every nonzero value
 * of the feeder's grad_in is below FP16's smallest subnormal (f16_flush)
 * and li's grad_out is all zeros. Then nothing learns behind it, yet its
 * zeros look like exact zeros, not underflow (a tiny loss weight without
 * loss scaling was "healthy"). Counts the step and keeps the first. */
static int entry_flushed(walker *w, const probe_record *r, const layer_step *l,
                         int32_t li, int64_t step) {
  probe_diag *d = w->d;
  if (l->grad_out < 0 || l->grad_feed < 0 ||
      d->layers[li].info.precision != PROBE_DTYPE_F16)
    return 0;
  const probe_record *feed = &r[l->grad_feed];
  const probe_stats *fs = &feed->stats, *gs = &r[l->grad_out].stats;
  if (feed->layer < 0 || feed->layer >= d->n_layers ||
      d->layers[feed->layer].info.precision != PROBE_DTYPE_F32 ||
      stats_nonfinite(fs) || fs->f16_flush == 0 ||
      fs->f16_flush + fs->zero_count != fs->count || gs->count == 0 ||
      gs->zero_count != gs->count)
    return 0;
  d->layers[li].entry_flush_steps++;
  if (d->entry_flush_step < 0) {
    d->entry_flush_step = step;
    d->entry_flush_from = feed->layer;
    d->entry_flush_to = li;
    d->entry_flush_absmax = fs->absmax;
  }
  return 1;
}

/* A layer's largest finite forward absmax (outputs, saved intermediates)
 * and gradient absmax (grad_in, weight_grad) in the step, NaN when none;
 * whether it has any of those records. */
static int layer_absmax(const layer_step *l, const probe_record *r, float *fa,
                        float *ba) {
  int any = 0;
  *fa = *ba = NAN;
  for (int s = 0; s < 4; s++) {
    int i = s == 0 ? l->fwd_out : s == 1 ? l->fwd_saved : s == 2 ? l->grad_in : l->wgrad;
    if (i < 0) continue;
    any = 1;
    float a = r[i].stats.absmax, *m = s < 2 ? fa : ba;
    if (isfinite(a) && (isnan(*m) || a > *m)) *m = a;
  }
  return any;
}

static void update_layers(walker *w, const probe_record *r, size_t n,
                          int64_t step, int loss_nf) {
  probe_diag *d = w->d;
  int64_t nl = d->n_layers;
  /* the layers with a non-finite record, in one pass (a scan of the step
   * per layer made a step cost layers x records) */
  for (size_t i = 0; i < n; i++)
    if (r[i].layer >= 0 && r[i].layer < nl && rec_event_nf(d, &r[i]))
      w->nf_at[r[i].layer] = step;
  /* history + headroom + underflow, per layer */
  for (int64_t li = 0; li < nl; li++) {
    const layer_step *l = &w->ls[li];
    float fa, ba;
    if (!layer_absmax(l, r, &fa, &ba)) continue;
    probe_diag_layer *dl = &d->layers[li];
    if (!w->frozen) {
      hist_point *p = &w->hist[li * w->hist_len + w->hist_count[li] % w->hist_len];
      p->step = step;
      p->fwd_absmax = fa;
      p->bwd_absmax = ba;
      w->hist_count[li]++;
    }
    double hr = headroom_of(fa);
    if (isfinite(fa) && dl->info.precision == PROBE_DTYPE_F16 &&
        hr < dl->min_fwd_headroom) {
      dl->min_fwd_headroom = hr;
      dl->min_fwd_headroom_step = step;
    }
    int half = step > w->mid_step ? 1 : 0;
    int entry = entry_flushed(w, r, l, (int32_t)li, step);
    for (int s = 0; s < 2 && dl->info.precision == PROBE_DTYPE_F16; s++) {
      int i = s == 0 ? l->grad_in : l->wgrad;
      if (i < 0) continue;
      const probe_stats *st = &r[i].stats;
      dl->grad_count[half] += probe_stats_finite(st);
      /* after an entry flush its zeros are flushed values too */
      dl->grad_subnormal[half] += st->f16_subnormal + (entry ? st->zero_count : 0);
      dl->grad_flush[half] += st->f16_flush + (entry ? st->zero_count : 0);
      dl->grad_zero[half] += st->zero_count;
    }
    if (l->fwd_out >= 0) {
      dl->fwd_out_zero += r[l->fwd_out].stats.zero_count;
      dl->fwd_out_count += probe_stats_finite(&r[l->fwd_out].stats);
    }
    if (w->nf_at[li] == step) dl->nonfinite_steps++;
    if (step >= d->warmup_end && !loss_nf) silent_faults(w, dl, l, r, step);
    below_resolution(w, dl, l, r, step);
  }
  /* weights as the updates made them: a layer whose forward used weights
   * larger than the FP32 masters the step just before left (by more than
   * its copy's rounding) was changed between the steps by something else
   * (an in-place edit under no_grad, load_state_dict); that jump is
   * divided out of its |w| from then on, so the lr signature reads only
   * the growth the updates made */
  for (int64_t li = 0; li < nl; li++) w->wstep[li] = -1;
  for (size_t i = 0; i < n; i++)
    if (r[i].site == PROBE_SITE_WEIGHT && r[i].layer >= 0 && r[i].layer < nl &&
        !stats_nonfinite(&r[i].stats) && r[i].stats.absmax > w->wstep[r[i].layer])
      w->wstep[r[i].layer] = r[i].stats.absmax;
  for (int64_t li = 0; li < nl; li++) {
    const master_seen *m = &w->masters[li];
    if (w->wstep[li] < 0 || m->step != step - 1 || !m->finite || !(m->absmax > 0) ||
        !(w->wstep[li] > EDIT_JUMP * m->absmax))
      continue;
    double jump = w->wstep[li] / m->absmax;
    w->edit_gain[li] *= jump;
    if (d->weights_edit_step < 0) {
      d->weights_edit_step = step;
      d->weights_edit_layer = (int32_t)li;
      d->weights_edit_jump = jump;
    }
  }
  /* the largest |w| of any layer at this step, edits divided out */
  double wmax = NAN;
  for (size_t i = 0; i < n; i++) {
    if (!is_weight(r[i].site) || !isfinite(r[i].stats.absmax)) continue;
    double a = r[i].stats.absmax;
    if (r[i].layer >= 0 && r[i].layer < nl) a /= w->edit_gain[r[i].layer];
    if (isnan(wmax) || a > wmax) wmax = a;
  }
  if (isfinite(wmax)) {
    if (isnan(d->master_absmax_first)) d->master_absmax_first = wmax;
    if (d->event_step < 0 || step < d->event_step) d->master_absmax_last = wmax;
  }
}

/* Layers with non-finite gradients in this step, execution order. */
static void attribute_backoff(walker *w, const probe_record *r, int64_t step,
                              int found_inf) {
  probe_diag *d = w->d;
  probe_diag_backoff *b = NULL;
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
      if (b->n_layers < PROBE_DIAG_MAX_BACKOFF_LAYERS)
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

/* The event fields of `from` (the first event, or the backward-only one)
 * into `to`. */
static void event_copy(probe_diag *to, const probe_diag *from) {
  to->event = from->event;
  to->event_step = from->event_step;
  to->event_phase = from->event_phase;
  to->origin_layer = from->origin_layer;
  to->origin_site = from->origin_site;
  to->origin_out = from->origin_out;
  to->have_origin_in = from->have_origin_in;
  to->origin_in = from->origin_in;
  to->origin_in_index = from->origin_in_index;
  to->origin_in_count = from->origin_in_count;
  to->feeder_layer = from->feeder_layer;
  to->feeder_call = from->feeder_call;
  to->feeder_calls = from->feeder_calls;
  to->origin_call = from->origin_call;
  to->origin_calls = from->origin_calls;
  to->n_passed = from->n_passed;
  memcpy(to->passed, from->passed, sizeof to->passed);
  to->more_passed = from->more_passed;
  to->nan_from_inf_layer = from->nan_from_inf_layer;
  to->origin_divides_zeros = from->origin_divides_zeros;
  to->origin_fwd_zeros = from->origin_fwd_zeros;
  to->origin_not_precision = from->origin_not_precision;
  to->origin_precision_weak = from->origin_precision_weak;
  to->origin_bound = from->origin_bound;
  memcpy(to->event_evidence, from->event_evidence, sizeof to->event_evidence);
  to->n_history = from->n_history;
  memcpy(to->history, from->history, sizeof to->history);
}

/* The step's backward-only overflow into slot k, unless it holds one. */
static int keep_bwd(walker *w, int k, probe_record *r, size_t n, int64_t step) {
  if (w->have_bwd[k]) return 0;
  memset(&w->bwd[k], 0, sizeof w->bwd[k]);
  w->have_bwd[k] = analyse_step(w, &w->bwd[k], r, n, step, 0);
  return w->have_bwd[k];
}

/* A step holding a non-finite record: the first event (forward, the loss)
 * or the first backward-only overflow, kept in case it becomes one. */
static void event_of_step(walker *w, probe_record *r, size_t n, int64_t step,
                          int fwd_nf, int loss_nf, int unskipped) {
  probe_diag *d = w->d;
  if (fwd_nf || loss_nf) {
    probe_diag e;
    memset(&e, 0, sizeof e);
    if (analyse_step(w, &e, r, n, step, loss_nf)) {
      if (e.origin_layer >= 0) d->layers[e.origin_layer].origin_steps++;
      if (d->event_step < 0) {
        event_copy(d, &e);
        w->frozen = 1;
      }
    }
  } else {
    if (d->first_grad_overflow_step < 0) d->first_grad_overflow_step = step;
    keep_bwd(w, BWD_FIRST, r, n, step);
    if (d->trailing_skip_start >= 0 && step >= d->trailing_skip_start)
      keep_bwd(w, BWD_LATE, r, n, step);
    if (unskipped && keep_bwd(w, BWD_UNSKIPPED, r, n, step) &&
        d->unskipped_grad_overflow_step < 0)
      d->unskipped_grad_overflow_step = step;
  }
}

/* A step a scaler ran at and did not skip, as its scalars say (not
 * measured: cannot tell, 0). */
static int step_unskipped(const probe_diag *d, const probe_step_scalars *sc) {
  return d->scaling_on && sc && !PROBE__UNMEASURED(sc, PROBE__SC_SCALER) &&
         !sc->skipped && !sc->found_inf;
}

/* Each layer's FP32 master weights as the step left them (all its master
 * records: the largest absmax, finite only when all are), for the next
 * step's forward, which runs on their copy. */
static void note_masters(walker *w, const probe_record *r, size_t n, int64_t step) {
  for (size_t i = 0; i < n; i++) {
    if (r[i].site != PROBE_SITE_MASTER_WEIGHT || r[i].layer < 0 ||
        r[i].layer >= w->d->n_layers)
      continue;
    master_seen *m = &w->masters[r[i].layer];
    int finite = !stats_nonfinite(&r[i].stats);
    if (m->step != step) {
      m->step = step;
      m->absmax = 0;
      m->finite = 1;
    }
    if (finite && r[i].stats.absmax > m->absmax) m->absmax = r[i].stats.absmax;
    m->finite &= finite;
  }
}

/* A finite loss that diverged: each layer's activations and unscaled
 * gradients against their largest before the loss's lowest median
 * (probe__diag_growth_layer). The gradients are recorded scaled: divided
 * by the step's scale when the steps table gives one. */
static void track_growth(walker *w, const probe_record *r, int64_t step,
                         const probe_step_scalars *sc) {
  probe_diag *d = w->d;
  if (!d->loss_diverged) return;
  double unscale = 1.0;
  if (sc && !PROBE__UNMEASURED(sc, PROBE__SC_SCALE) && isfinite(sc->loss_scale) &&
      sc->loss_scale > 0)
    unscale = 1.0 / sc->loss_scale;
  for (int64_t li = 0; li < d->n_layers; li++) {
    float fa, ba;
    /* the loss's own values are the loss: not a layer that grew */
    if (d->layers[li].info.kind == PROBE_KIND_LOSS ||
        !layer_absmax(&w->ls[li], r, &fa, &ba))
      continue;
    probe__diag_growth_layer(d, w->growth_base, (int32_t)li, step, fa,
                             (double)ba * unscale);
  }
}

/* The steps of the skip streak (pass 1): the layer whose gradient was
 * the first non-finite one of the step's backward (execution order: the
 * layers behind it only passed it on). */
static void track_streak(walker *w, const probe_record *r, size_t n,
                         int64_t step) {
  const probe_diag *d = w->d;
  if (d->skip_streak_start < 0 || step < d->skip_streak_start ||
      step > d->skip_streak_end)
    return;
  for (size_t i = 0; i < n; i++) {
    if (!is_bwd_out(r[i].site) || r[i].layer < 0 || r[i].layer >= d->n_layers ||
        !rec_event_nf(d, &r[i]))
      continue;
    w->streak_nf[r[i].layer]++;
    return;
  }
}

/* The layer with non-finite gradients in most of the streak's steps, the
 * first (layer order) of equals. */
static void streak_layer(walker *w) {
  probe_diag *d = w->d;
  for (int64_t li = 0; li < d->n_layers; li++)
    if (w->streak_nf[li] > d->skip_streak_layer_steps) {
      d->skip_streak_layer = (int32_t)li;
      d->skip_streak_layer_steps = w->streak_nf[li];
    }
}

static void process_step(walker *w, probe_record *r, size_t n, int64_t step,
                         const probe_step_scalars *sc) {
  probe_diag *d = w->d;
  qsort(r, n, sizeof *r, cmp_seq);
  index_step(w, r, n);
  int64_t ls = d->first_nonfinite_loss_step;
  if (ls >= 0 && step <= ls) w->loss_rec_before = step;
  if (ls >= 0 && step >= ls && w->loss_rec_after < 0) w->loss_rec_after = step;
  int any_nf = 0, fwd_nf = 0;
  for (size_t i = 0; i < n; i++) {
    if (!rec_event_nf(d, &r[i])) continue;
    any_nf = 1;
    if (is_weight(r[i].site) && w->weights_nf_step < 0) w->weights_nf_step = step;
    if (probe_site_phase((probe_site)r[i].site) == PROBE_PHASE_FORWARD)
      fwd_nf = 1;
    if (r[i].layer >= 0 && r[i].layer < d->n_layers &&
        d->layers[r[i].layer].info.kind == PROBE_KIND_INPUT)
      fwd_nf = 1;
    if (r[i].site == PROBE_SITE_MASTER_WEIGHT) fwd_nf = 1;
  }
  int loss_nf = sc && !PROBE__UNMEASURED(sc, PROBE__SC_LOSS) &&
                !isfinite(sc->loss);
  compare_clip_norm(w, r, n, sc);
  update_layers(w, r, n, step, loss_nf);
  track_growth(w, r, step, sc);
  track_streak(w, r, n, step);
  probe__diag_stag_step(&w->stag, r, n, step, sc);
  attribute_backoff(w, r, step, sc ? sc->found_inf : 0);
  if (any_nf)
    event_of_step(w, r, n, step, fwd_nf, loss_nf, step_unskipped(d, sc));
  note_masters(w, r, n, step);
}

/* The evidence of a non-finite loss at a step with no per-layer record:
 * the recorded steps around it (-1 none). */
static void loss_step_unrecorded(probe_diag *d, int64_t before, int64_t after) {
  char around[96];
  if (before >= 0 && after >= 0)
    snprintf(around, sizeof around, "at steps %lld and %lld around it",
             (long long)before, (long long)after);
  else if (before >= 0)
    snprintf(around, sizeof around, "up to step %lld", (long long)before);
  else
    snprintf(around, sizeof around, "from step %lld", (long long)after);
  snprintf(d->event_evidence, sizeof d->event_evidence,
           "step %lld has no per-layer record: the trace holds them %s (kept "
           "every few steps, or in a window), so where the loss went "
           "non-finite is not in it; record every step (--trace; the Python "
           "tracer's every=1)",
           (long long)d->event_step, around);
}

/* What the records pass found for the run function beside d. */
typedef struct pass_out {
  int64_t weights_nf_step;
  int64_t loss_rec_before, loss_rec_after;
} pass_out;

static probe_status pass_records(probe_diag *d, probe_trace *t, size_t chunk,
                                 int hist_len, diag_progress *pg,
                                 pass_out *out) {
  probe_status st = PROBE_OK;
  walker w;
  memset(&w, 0, sizeof w);
  w.d = d;
  w.weights_nf_step = w.loss_rec_before = w.loss_rec_after = -1;
  w.hist_len = hist_len > 0 ? hist_len : 1;
  int64_t nl = d->n_layers > 0 ? d->n_layers : 1;
  w.hist = calloc((size_t)(nl * w.hist_len), sizeof *w.hist);
  w.hist_count = calloc((size_t)nl, sizeof *w.hist_count);
  w.ls = calloc((size_t)nl, sizeof *w.ls);
  w.nf_at = malloc((size_t)nl * sizeof *w.nf_at);
  for (int64_t i = 0; w.nf_at && i < nl; i++) w.nf_at[i] = INT64_MIN;
  w.masters = calloc((size_t)nl, sizeof *w.masters);
  w.edit_gain = malloc((size_t)nl * sizeof *w.edit_gain);
  w.wstep = malloc((size_t)nl * sizeof *w.wstep);
  for (int64_t i = 0; w.edit_gain && i < nl; i++) w.edit_gain[i] = 1.0;
  w.bwd = calloc(BWD_COUNT, sizeof *w.bwd);
  w.growth_base = calloc(2 * (size_t)nl, sizeof *w.growth_base);
  w.streak_nf = calloc((size_t)nl, sizeof *w.streak_nf);
  for (int64_t i = 0; w.masters && i < nl; i++) w.masters[i].step = -1;
  int stag_ok = probe__diag_stag_init(&w.stag, d) == 0;
  probe_record *buf = malloc(chunk * sizeof *buf);
  size_t step_cap = 256, step_n = 0;
  probe_record *step_buf = malloc(step_cap * sizeof *step_buf);
  steps_cursor sc;
  int sc_ok = steps_cursor_init(&sc, t, chunk) == 0;
  if (!w.hist || !w.hist_count || !w.ls || !w.nf_at || !w.masters || !w.edit_gain || !w.wstep || !w.bwd || !w.growth_base || !w.streak_nf || !stag_ok || !buf || !step_buf || !sc_ok) {
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
    if ((st = progress_add(pg, got)) < 0) goto done;
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
  streak_layer(&w);
  probe__diag_stag_end(&w.stag, d);
  /* A backward-only overflow becomes the event when nothing else did and
   * the scaler did not cope (no scaling, or the scale collapsed). */
  if (d->event_step < 0 && w.have_bwd[BWD_FIRST] &&
      (!d->scaling_on || d->scale_collapsed))
    /* a collapse after clean steps: the overflow of its own skip run, not
     * a warm-up backoff's (with no clean step: the first) */
    event_copy(d, &w.bwd[d->scaling_on && !d->never_stepped &&
                                 w.have_bwd[BWD_LATE]
                             ? BWD_LATE
                             : BWD_FIRST]);
  /* Or a division by exact zeros (classify_backward) in a step the scaler
   * let through: masked before the parameter gradients this time, but an
   * op that makes inf in any precision (the FP32 run's event too). A
   * scaled overflow masked so (a ReLU's backward zeroes those positions:
   * their gradient is 0 anyway) stays the scaler's business. */
  else if (d->event_step < 0 && w.have_bwd[BWD_UNSKIPPED] &&
           w.bwd[BWD_UNSKIPPED].origin_divides_zeros)
    event_copy(d, &w.bwd[BWD_UNSKIPPED]);
  st = PROBE_OK;
done:
  out->weights_nf_step = w.weights_nf_step;
  out->loss_rec_before = w.loss_rec_before;
  out->loss_rec_after = w.loss_rec_after;
  free(w.hist);
  free(w.hist_count);
  free(w.ls);
  free(w.nf_at);
  free(w.masters);
  free(w.edit_gain);
  free(w.wstep);
  free(w.bwd);
  free(w.growth_base);
  free(w.streak_nf);
  probe__diag_stag_free(&w.stag);
  free(buf);
  free(step_buf);
  if (sc_ok) free(sc.buf);
  return st;
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

int probe_diag_config_scaling(const char *config_json) {
  probe__jflat f;
  if (!config_json || !*config_json ||
      probe__jflat_parse(&f, config_json) != PROBE_OK)
    return -1;
  const probe__jleaf *en = probe__jflat_get(&f, "scaler.enabled");
  int on = -1;
  if (en && en->type == PROBE__JV_BOOL) {
    /* the trainer scales FP16 runs only; "precision" defaults to fp16 */
    const probe__jleaf *prec = probe__jflat_get(&f, "precision");
    on = en->boolean && (!prec || prec->type != PROBE__JV_STR ||
                         !strcmp(prec->str, "fp16"));
  }
  probe__jflat_free(&f);
  return on;
}

/* The next word of a stored command line, read as a POSIX shell reads it
 * back: `run` stores each argument shell-quoted (probe_shell_quote) and the
 * Python package stores shlex.join(argv), so an argument with a space or a
 * quote survives. Spaces and tabs separate words; '...' is literal; "..."
 * keeps its text, a backslash before " \ $ or ` dropped; outside quotes a
 * backslash keeps the next character. A line of an older run (argv joined
 * by spaces, unquoted) reads as before unless an argument held a quote or
 * a backslash (then it reads as the shell would have: such a line did not
 * paste as typed either). The word goes to out; *cut is set
 * when it did not fit. *pp moves past it. Returns 0 at the end. */
static int next_word(const char **pp, char *out, size_t cap, int *cut) {
  const char *p = *pp;
  size_t o = 0;
  *cut = 0;
  while (*p == ' ' || *p == '\t') p++;
  if (!*p) {
    *pp = p;
    return 0;
  }
#define PUTC(ch)                                                               \
  do {                                                                         \
    if (o + 1 < cap) out[o++] = (ch); else *cut = 1;                           \
  } while (0)
  while (*p && *p != ' ' && *p != '\t') {
    if (*p == '\'') {
      for (p++; *p && *p != '\''; p++) PUTC(*p);
      if (*p) p++;
    } else if (*p == '"') {
      for (p++; *p && *p != '"'; p++) {
        if (*p == '\\' && p[1] && strchr("\"\\$`", p[1])) p++;
        PUTC(*p);
      }
      if (*p) p++;
    } else {
      if (*p == '\\' && p[1]) p++;
      PUTC(*p);
      p++;
    }
  }
#undef PUTC
  out[o] = 0;
  *pp = p;
  return 1;
}

/* The value of `--opt X` or `--opt=X` among the stored command line's
 * words (a word is matched whole), raw; 0 when absent or too long. */
static int argv_value(const char *cl, const char *opt, char *out, size_t len) {
  if (!cl) return 0;
  size_t ol = strlen(opt);
  char w[1024];
  int cut;
  while (next_word(&cl, w, sizeof w, &cut)) {
    if (cut) continue;
    if (!strcmp(w, opt)) {
      if (!next_word(&cl, out, len, &cut)) return 0;
      return !cut && out[0];
    }
    if (!strncmp(w, opt, ol) && w[ol] == '=' && w[ol + 1]) {
      if (strlen(w + ol + 1) >= len) return 0;
      snprintf(out, len, "%s", w + ol + 1);
      return 1;
    }
  }
  return 0;
}

/* " --opt VALUE" for a command the user pastes, VALUE shell-quoted; 0 (and
 * nothing written) when VALUE cannot be pasted as text (a control
 * character, a backslash, bytes that are not UTF-8: shown escaped, it
 * would name another file) or does not fit. */
static int source_arg(char *out, size_t cap, const char *opt, const char *v) {
  char q[256];
  if (!v[0] || probe_text_needs_escape(v) ||
      probe_shell_quote(q, sizeof q, v) >= sizeof q)
    return 0;
  return (size_t)snprintf(out, cap, "%s %s", opt, q) < cap;
}

/* A configuration's whole number (steps, seed) in [0, 2^53]: 0 and *out
 * set, or -1 and *out untouched for anything else (a string, 1.9, 1e300:
 * a cast of a double past int64's range is undefined, and 1.9 became
 * --steps 1 in the suggested command). */
static int json_count(const probe__jleaf *x, int64_t *out) {
  const double max = 9007199254740992.0; /* 2^53: every integer exact */
  if (!x || x->type != PROBE__JV_NUM || !(x->num >= 0 && x->num <= max) ||
      x->num != floor(x->num))
    return -1;
  *out = (int64_t)x->num;
  return 0;
}

/* A command line re-quoted word by word (probe_shell_quote): what the
 * post-mortem prints for an external job to be pasted after "--". The
 * stored line is data: "$(cmd)" or "a;b" in it becomes one quoted word,
 * never a substitution or a second command. */
static void requote_command(char *out, size_t cap, const char *line) {
  char w[1024], q[1100];
  size_t o = 0;
  int cut;
  if (cap) out[0] = 0;
  while (next_word(&line, w, sizeof w, &cut)) {
    if (cut || probe_shell_quote(q, sizeof q, w) >= sizeof q ||
        o + 1 + strlen(q) >= cap)
      break; /* a cut word would be another argument: stop before it */
    o += (size_t)snprintf(out + o, cap - o, "%s%s", o ? " " : "", q);
  }
}

void probe__diag_read_config(probe_diag *d, const char *config_json,
                             const char *command_line) {
  d->cfg_found = 0;
  d->cfg_external = 0;
  d->cfg_name[0] = d->cfg_fp32[0] = d->cfg_source[0] = d->cfg_command[0] = 0;
  d->cfg_steps = d->cfg_seed = -1;
  d->cfg_clip_before_unscale = -1;
  d->cfg_loss_log = 1;
  char raw_name[200] = ""; /* the config's "name", as stored */
  probe__jflat f;
  if (config_json && *config_json &&
      probe__jflat_parse(&f, config_json) == PROBE_OK) {
    d->cfg_found = 1;
    const probe__jleaf *x = probe__jflat_get(&f, "name");
    if (x && x->type == PROBE__JV_STR) {
      probe_text_escape(d->cfg_name, sizeof d->cfg_name, x->str);
      if (strlen(x->str) < sizeof raw_name) /* a cut name is another one */
        snprintf(raw_name, sizeof raw_name, "%s", x->str);
    }
    (void)json_count(probe__jflat_get(&f, "steps"), &d->cfg_steps);
    (void)json_count(probe__jflat_get(&f, "seed"), &d->cfg_seed);
    if ((x = probe__jflat_get(&f, "clip.before_unscale")) &&
        x->type == PROBE__JV_BOOL)
      d->cfg_clip_before_unscale = x->boolean;
    /* "fp32": a list of strings, or one comma-separated string */
    if ((x = probe__jflat_get(&f, "fp32")) && x->type == PROBE__JV_STR) {
      probe_text_escape(d->cfg_fp32, sizeof d->cfg_fp32, x->str);
    } else {
      for (int i = 0; i < 64; i++) {
        char key[16], esc[128];
        snprintf(key, sizeof key, "fp32[%d]", i);
        if (!(x = probe__jflat_get(&f, key)) || x->type != PROBE__JV_STR) break;
        probe_text_escape(esc, sizeof esc, x->str);
        size_t n = strlen(d->cfg_fp32);
        snprintf(d->cfg_fp32 + n, sizeof d->cfg_fp32 - n, "%s%s", n ? "," : "",
                 esc);
      }
    }
    if ((x = probe__jflat_get(&f, "loss")) && x->type == PROBE__JV_STR)
      d->cfg_loss_log = !strcmp(x->str, "cross_entropy");
    if ((x = probe__jflat_get(&f, "framework")) && x->type == PROBE__JV_STR &&
        strcmp(x->str, "ampprobe") != 0) {
      d->cfg_external = 1;
      const probe__jleaf *cmd = probe__jflat_get(&f, "command");
      const char *line = cmd && cmd->type == PROBE__JV_STR ? cmd->str
                         : command_line                    ? command_line
                                                           : "";
      /* pasted after "--": whole words that fit (escaping cannot cut
       * one), and none shown escaped (as source_arg: pasted as shown, an
       * escaped word would be another argument), else the placeholder */
      char rq[sizeof d->cfg_command];
      requote_command(rq, sizeof rq, line);
      snprintf(d->cfg_command, sizeof d->cfg_command, "%s",
               rq[0] && !probe_text_needs_escape(rq) ? rq
                                                     : "YOUR TRAINING COMMAND");
    }
    probe__jflat_free(&f);
  }
  /* How to run it again: the file or scenario it came from, each a word
   * the shell reads back as it was (a name from the trace is data: never
   * split at a space, never a $(...) substitution), else a placeholder. */
  char v[200];
  char *src = d->cfg_source;
  size_t sn = sizeof d->cfg_source;
  int ok;
  if (argv_value(command_line, "--config", v, sizeof v))
    ok = source_arg(src, sn, "--config", v);
  else if (argv_value(command_line, "--scenario", v, sizeof v))
    ok = source_arg(src, sn, "--scenario", v);
  else
    ok = raw_name[0] && source_arg(src, sn, "--scenario", raw_name);
  if (!ok)
    snprintf(src, sn, "--config CONFIG.json");
}

probe_status probe_diag_run(probe_diag *d, probe_trace *t, const char *path,
                            const probe_diag_options *opt) {
  return probe_diag_run_progress(d, t, path, opt, NULL, NULL);
}

probe_status probe_diag_run_progress(probe_diag *d, probe_trace *t,
                                     const char *path,
                                     const probe_diag_options *opt,
                                     probe_progress_fn fn, void *user) {
  probe_diag_options defaults;
  if (!opt) {
    probe_diag_options_init(&defaults);
    opt = &defaults;
  }
  if (!d) return PROBE_ERR_INVALID_ARG;
  memset(d, 0, sizeof *d);
  if (!t) return PROBE_ERR_INVALID_ARG;
  size_t chunk = probe__chunk_rows(opt->chunk_rows);
  probe_text_escape(d->path, sizeof d->path, path ? path : "");
  const probe_trace_info *info = probe_trace_get_info(t);
  d->complete = info->complete;
  d->joined = info->joined;
  probe_text_escape(d->aborted, sizeof d->aborted,
                    info->aborted ? info->aborted : "");
  d->aborted_step = info->aborted[0] ? info->aborted_step : -1;
  d->record_mode = info->record_mode;
  d->n_steps = info->n_steps;
  d->n_records = info->n_records;
  d->event_step = -1;
  d->origin_layer = -1;
  d->resolution_layer = -1;
  d->feeder_layer = -1;
  d->nan_from_inf_layer = -1;
  d->first_grad_overflow_step = -1;
  d->unskipped_grad_overflow_step = -1;
  d->worst_underflow_layer = -1;
  d->entry_flush_step = -1;
  d->entry_flush_from = d->entry_flush_to = -1;
  d->master_absmax_first = d->master_absmax_last = NAN;
  d->weights_edit_step = -1;
  d->weights_edit_layer = -1;
  d->weights_edit_jump = NAN;
  probe_text_escape(d->precision_policy, sizeof d->precision_policy,
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
    d->layers[i].fwd_nonfinite_first = -1;
    d->layers[i].collapse.first_step = -1;
    d->layers[i].resolution.first_step = -1;
    probe_text_escape(d->layers[i].display, sizeof d->layers[i].display,
                      li[i].name);
    if (li[i].kind != PROBE_KIND_INPUT && li[i].kind != PROBE_KIND_LOSS &&
        li[i].precision != PROBE_DTYPE_F32)
      d->fp32_run = 0;
  }

  /* The tables the passes below do not read (kernels, snapshots) are
   * checked too: a file the isolated open refuses is refused here (F6). */
  probe_status st = probe__trace_check_unread(t);
  if (st >= 0)
    st = edge_steps(t, info->n_steps, &d->first_step, &d->last_step);
  if (st >= 0)
    st = edge_records(t, info->n_records, &d->rec_first_step,
                      &d->rec_last_step);
  diag_progress pg = {fn, user, PROBE_PROGRESS_ANALYSING, 0, 0, 0};
  pg.total = (uint64_t)info->n_steps + 2 * (uint64_t)info->n_scaler_events +
             (uint64_t)info->n_records;
  if (st >= 0) st = progress_add(&pg, 0); /* 0 of total: under way */
  if (st >= 0) st = pass_steps(d, t, chunk, &pg);
  if (st >= 0) st = pass_scaler(d, t, chunk, &pg);
  if (st >= 0) st = count_late_backoffs(d, t, chunk, &pg);
  if (st < 0) return st;
  /* The stored config says whether a scaler ran; the steps only guess (a
   * scaler that stays at an initial scale of 1 leaves no trace). */
  probe__diag_read_config(d, info->config_json, info->command_line);
  /* a rank of a data-parallel run of the built-in trainer: what reruns it
   * is a run (or bisect) of as many ranks (it suggested one process, which
   * may be healthy where the job is not) */
  if (!d->cfg_external && info->world_size > 1) {
    size_t k = strlen(d->cfg_source);
    snprintf(d->cfg_source + k, sizeof d->cfg_source - k, " --ranks %d",
             (int)info->world_size);
  }
  int cfg_scaling = probe_diag_config_scaling(info->config_json);
  if (cfg_scaling >= 0) {
    d->scaling_on = cfg_scaling;
    d->scaling_from_config = 1;
  }

  /* Collapse: the scale ended far below where it started and was still
   * backing off (or at its minimum), or the last steps were all skipped:
   * every step, or PROBE_DIAG_COLLAPSE_TRAILING_SKIPS after a clean one
   * (docs/precision.md, "Verdicts"). */
  d->never_stepped = d->n_steps > 0 && d->skipped_steps == d->n_steps;
  if (d->scaling_on) {
    d->scale_collapsed =
        (isfinite(d->scale_last) && d->scale_last <= 1.0 &&
         d->scale_first > 1.0) ||
        d->never_stepped ||
        d->trailing_skip_run >= PROBE_DIAG_COLLAPSE_TRAILING_SKIPS ||
        (d->min_clamps > 0 && d->trailing_skip_run > 0);
  }
  pass_out po;
  st = pass_records(d, t, chunk,
                    opt->layer_history > 0 ? opt->layer_history : 8, &pg, &po);
  if (st < 0) return st;
  /* done == total (count_late_backoffs stops at the first clean step) */
  if (pg.done < pg.total && (st = progress_add(&pg, pg.total - pg.done)) < 0)
    return st;
  if (d->event_step < 0 && d->first_nonfinite_loss_step >= 0) {
    d->event = PROBE_DIAG_EVENT_LOSS_ONLY;
    d->event_step = d->first_nonfinite_loss_step;
    d->event_phase = PROBE_PHASE_FORWARD;
    /* its step has no record at all (records kept every few steps or in a
     * window): not "no record of that step held a non-finite value" */
    if (po.loss_rec_before != d->event_step && d->n_records > 0)
      loss_step_unrecorded(d, po.loss_rec_before, po.loss_rec_after);
  }

  /* Silent faults: the first layer (execution order) with a collapse or
   * forward inf/NaN after warm-up. */
  d->silent_layer = -1;
  d->silent_layers = 0;
  for (int64_t i = 0; i < d->n_layers; i++) {
    const probe_diag_layer *l = &d->layers[i];
    if (l->collapse.steps == 0 && l->fwd_nonfinite_steps == 0) continue;
    if (d->silent_layer < 0) d->silent_layer = (int32_t)i;
    d->silent_layers++;
  }

  /* Data below resolution: the first layer (execution order) whose FP32
   * input was below it on enough of the steps judged. */
  d->resolution_layer = -1;
  for (int64_t i = 0; i < d->n_layers && d->resolution_layer < 0; i++) {
    const probe_diag_resolution *rs = &d->layers[i].resolution;
    if (rs->steps > 0 &&
        (double)rs->steps >= PROBE_DIAG_RESOLUTION_STEP_FRAC * (double)rs->seen)
      d->resolution_layer = (int32_t)i;
  }

  /* Worst gradient underflow. */
  uint64_t tot_c = 0, tot_z = 0;
  for (int64_t i = 0; i < d->n_layers; i++) {
    const probe_diag_layer *l = &d->layers[i];
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

  probe__diag_rank(d);
  /* weights that went non-finite after a first event of another kind (an
   * activation overflow) are a divergence too (docs/precision.md), the
   * loss's say or not: a loss not measured left such a run "degraded" */
  if (po.weights_nf_step >= 0) d->verdict = PROBE_VERDICT_DIVERGED;
  return PROBE_OK;
}

void probe_diag_free(probe_diag *d) {
  if (!d) return;
  free(d->layers);
  d->layers = NULL;
}

int probe_diag_problem(const probe_diag *d) {
  return d && d->verdict != PROBE_VERDICT_HEALTHY;
}

const char *probe_verdict_name(probe_verdict v) {
  switch (v) {
  case PROBE_VERDICT_HEALTHY: return "healthy";
  case PROBE_VERDICT_DEGRADED: return "degraded";
  case PROBE_VERDICT_DIVERGED: return "diverged";
  }
  return "?";
}

void probe_free(void *p) { free(p); }
