/*
 * libprobe/analysis/diff.c - streaming comparison of two traces (A against its
 * baseline B): layer/site/step alignment, relative differences of absmax,
 * RMS and L2, first divergence, local vs carried-in error and the error
 * introduction point, loss curves, and the configurations key by key.
 * Definitions are in ampprobe/analysis.h. Memory: one step of records per side.
 */
#define _POSIX_C_SOURCE 200809L
#include "analysis-impl.h"
#include "../format.h" /* probe__trace_open_msg, probe__trace_check_unread */

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void probe_diff_options_init(probe_diff_options *o) {
  if (!o) return;
  o->threshold = PROBE_DIFF_DEFAULT_THRESHOLD;
  o->window = PROBE_DIFF_DEFAULT_WINDOW;
  o->chunk_rows = PROBE__CHUNK_ROWS_DEFAULT;
  o->zero_frac_margin = 0.05;
}

double probe_diff_rel(double a, double b) {
  int fa = isfinite(a), fb = isfinite(b);
  if (!fa && !fb)
    return 0.0;
  if (fa != fb)
    return 1.0;
  double m = fmax(fabs(a), fabs(b));
  return m == 0.0 ? 0.0 : fabs(a - b) / m;
}

static void note(probe_diff *d, const char *fmt, ...) {
  if (d->n_notes >= PROBE_DIFF_MAX_NOTES)
    return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(d->notes[d->n_notes++], PROBE_DIFF_TEXT_MAX, fmt, ap);
  va_end(ap);
}

static void append_name(char *buf, size_t len, const char *raw) {
  char name[PROBE_NAME_MAX * 4];
  probe_text_escape(name, sizeof name, raw);
  size_t n = strlen(buf);
  if (n + strlen(name) + 6 >= len) {
    if (n + 4 < len && (n < 3 || strcmp(buf + n - 3, "...")))
      strcat(buf, "...");
    return;
  }
  if (n)
    strcat(buf, ", ");
  strcat(buf, name);
}

/* ---- a trace read one step of records at a time -------------------------- */

typedef struct cursor {
  probe__progress *pg;     /* told of each chunk read (NULL: not counted) */
  probe_trace *t;
  int64_t row;           /* next row of the records table to read */
  probe_record *chunk;
  size_t chunk_n, chunk_pos, chunk_cap;
  probe_record *step;    /* the records of the current step, seq order */
  size_t step_n, step_cap;
  int64_t step_no;       /* -1 at the end */
  int64_t prev_step;
  int64_t skipped;       /* records out of step order, ignored */
} cursor;

static probe_status cursor_init(cursor *c, probe_trace *t, size_t chunk,
                                probe__progress *pg) {
  memset(c, 0, sizeof *c);
  c->t = t;
  c->pg = pg;
  c->chunk_cap = probe__chunk_rows(chunk);
  c->chunk = malloc(c->chunk_cap * sizeof *c->chunk);
  c->step_no = c->prev_step = -1;
  return c->chunk ? PROBE_OK : PROBE_ERR_NOMEM;
}

static void cursor_free(cursor *c) {
  free(c->chunk);
  free(c->step);
}

/* The next record, or NULL at the end. */
static probe_status cursor_peek(cursor *c, const probe_record **r) {
  if (c->chunk_pos == c->chunk_n) {
    size_t got = 0;
    probe_status st =
        probe_trace_read_records(c->t, c->row, c->chunk_cap, c->chunk, &got);
    if (st != PROBE_OK || (got && (st = probe__progress_add(c->pg, got)) != PROBE_OK))
      return st;
    c->row += (int64_t)got;
    c->chunk_n = got;
    c->chunk_pos = 0;
    if (got == 0) {
      *r = NULL;
      return PROBE_OK;
    }
  }
  *r = &c->chunk[c->chunk_pos];
  return PROBE_OK;
}

/* Loads the next step's records; step_no = -1 at the end. Groups whose step
 * is not after the previous one (flight-recorder dumps overlapping) are
 * skipped and counted. */
static probe_status cursor_next(cursor *c) {
  for (;;) {
    const probe_record *r;
    probe_status st = cursor_peek(c, &r);
    if (st != PROBE_OK)
      return st;
    if (!r) {
      c->step_no = -1;
      c->step_n = 0;
      return PROBE_OK;
    }
    int64_t s = r->step;
    c->step_n = 0;
    while (r && r->step == s) {
      if (c->step_n == c->step_cap) {
        size_t cap = c->step_cap ? 2 * c->step_cap : 256;
        probe_record *p = realloc(c->step, cap * sizeof *p);
        if (!p)
          return PROBE_ERR_NOMEM;
        c->step = p;
        c->step_cap = cap;
      }
      c->step[c->step_n++] = *r;
      c->chunk_pos++;
      if ((st = cursor_peek(c, &r)) != PROBE_OK)
        return st;
    }
    if (c->prev_step >= 0 && s <= c->prev_step) {
      c->skipped += (int64_t)c->step_n;
      continue;
    }
    c->prev_step = c->step_no = s;
    return PROBE_OK;
  }
}

/* ---- the loss scale of a step, read along in step order ----------------- */

typedef struct scur {
  probe_trace *t;
  int64_t row;
  probe_step_scalars *buf;
  size_t n, pos, cap;
} scur;

/* The loss scale the step's backward used (1 when the step is not in the
 * steps table or the scale is not a positive finite number). Steps are
 * asked in increasing order. */
static probe_status scale_at(scur *c, int64_t step, double *scale,
                             int *skipped) {
  *scale = 1.0;
  *skipped = 0;
  for (;;) {
    if (c->pos == c->n) {
      size_t got = 0;
      probe_status st = probe_trace_read_steps(c->t, c->row, c->cap, c->buf, &got);
      if (st != PROBE_OK)
        return st;
      c->row += (int64_t)got;
      c->n = got;
      c->pos = 0;
      if (got == 0)
        return PROBE_OK;
    }
    const probe_step_scalars *r = &c->buf[c->pos];
    if (r->step < step) {
      c->pos++;
      continue;
    }
    if (r->step == step && isfinite(r->loss_scale) && r->loss_scale > 0)
      *scale = r->loss_scale;
    if (r->step == step) /* skipped, not found_inf: a run without a scaler
                            (FP32) may find an inf and apply the step */
      *skipped = r->skipped != 0;
    return PROBE_OK;
  }
}

/* ---- site roles ---------------------------------------------------------- */

static int site_is_input(int site) {
  return site == PROBE_SITE_FWD_IN || site == PROBE_SITE_WEIGHT ||
         site == PROBE_SITE_GRAD_OUT;
}

/* Gradient sites hold scaled gradients: compare them unscaled. The
 * all-reduce's two sites are the same scaled gradients as this rank sent
 * them and as the sum returned them (docs/trace-format.md, "Multi-rank
 * traces"): left scaled, an FP16 run (scale 1024) differs from an FP32 one
 * by exactly 1 - 1/1024 there. */
static int site_is_grad(int site) {
  return site == PROBE_SITE_GRAD_IN || site == PROBE_SITE_GRAD_OUT ||
         site == PROBE_SITE_WEIGHT_GRAD ||
         site == PROBE_SITE_GRAD_PRE_ALLREDUCE ||
         site == PROBE_SITE_GRAD_POST_ALLREDUCE;
}

/* ---- exact zeros on one side: underflow or rounding --------------------- */

/* The smallest normal of a reduced format, or 0 for FP32 (and anything
 * else): below it values lose bits and then flush to zero. */
static double format_min_normal(int32_t dtype) {
  switch (dtype) {
  case PROBE_DTYPE_F16: return 6.103515625e-05;        /* 2^-14 */
  case PROBE_DTYPE_BF16: return 1.1754943508222875e-38; /* 2^-126 */
  default: return 0.0;
  }
}

static const char *format_name(int32_t dtype) {
  return dtype == PROBE_DTYPE_BF16 ? "BF16"
         : dtype == PROBE_DTYPE_F16 ? "FP16"
                                    : "FP32";
}

enum { ZEROS_NONE = 0, ZEROS_UNDERFLOW = 1, ZEROS_ROUNDING = 2, ZEROS_LOST = 3 };

/* Whether the exact zeros of a record differ between the sides, and why.
 * The side with more zeros (*side 'A' or 'B') must hold zero_frac_margin
 * of the tensor and PROBE_DIFF_ZERO_MIN_VALUES values more than the other;
 * then they underflowed when that side's layer runs in a reduced format
 * and the other side's smallest non-zero magnitude, brought to this side's
 * loss scale, is below the format's smallest normal; else they are
 * rounding or exact cancellation (BF16 rounds a softmax p to 1.0, and
 * p(1-p) is exactly 0; an FP32 sum cancels exactly), unless the reduced
 * side lost PROBE_DIFF_ZERO_LOST_FRAC of the tensor or more to zeros: a
 * tensor gone to zero where the other holds ordinary values (an overflow
 * upstream) diverges whatever the cause (ZEROS_LOST). */
static int zeros_kind(const probe_stats *sa, const probe_stats *sb,
                      int32_t prec_a, int32_t prec_b, double scale_a,
                      double scale_b, double margin, char *side) {
  *side = 0;
  if (!sa->count || !sb->count)
    return ZEROS_NONE;
  double za = (double)sa->zero_count / (double)sa->count;
  double zb = (double)sb->zero_count / (double)sb->count;
  int a_more = sa->zero_count > sb->zero_count;
  uint64_t more = a_more ? sa->zero_count - sb->zero_count
                         : sb->zero_count - sa->zero_count;
  if (fabs(za - zb) < margin || more < PROBE_DIFF_ZERO_MIN_VALUES)
    return ZEROS_NONE;
  *side = a_more ? 'A' : 'B';
  const probe_stats *other = a_more ? sb : sa;
  double tiny = format_min_normal(a_more ? prec_a : prec_b);
  double to_side = a_more ? scale_a / scale_b : scale_b / scale_a;
  double small = (double)other->absmin_nonzero * to_side;
  if (tiny > 0 && isfinite(small) && small < tiny)
    return ZEROS_UNDERFLOW;
  if (tiny > 0 && fabs(za - zb) >= PROBE_DIFF_ZERO_LOST_FRAC)
    return ZEROS_LOST;
  return ZEROS_ROUNDING;
}

/* ---- the comparison ------------------------------------------------------ */

typedef struct state {
  probe_diff *d;
  const probe_layer_info *la, *lb;
  size_t nla, nlb;
  int32_t *map_ab;      /* A layer id -> B layer id, -1 */
  int32_t *slot_entry;  /* A layer * SITES + site -> entry index, -1 */
  int64_t *entry_last_div; /* per entry: last step it diverged */
  int64_t *entry_uf_a;  /* per entry: steps A's values underflowed */
  /* why the introduction point's zeros differ (ZEROS_*), on which side,
   * and that side's format */
  int intro_zeros;
  char intro_zside;
  int32_t intro_zprec;
  double *entry_rel_sum;
  double *win;          /* per entry: the last W rel RMS values (ring) */
  double *win_sum;
  int32_t *head_b, *next_b; /* B index of one step */
  size_t next_cap;
  /* per layer state in one step; [layer * 3 + phase] */
  unsigned char *seen, *has_in, *in_div, *implied_in;
  unsigned char *fwd_div, *wgrad_div;
  scur sa, sb; /* loss scales of A and B */
  /* a side its writer did not close that ends before the other: 'A' or
   * 'B' (0 none), and the last steps (probe_trace_info) */
  char stopped;
  int64_t stopped_last, other_last;
  /* that side's abort mark (probe_trace_info.aborted), escaped: "" when
   * none (killed?), else what ended it (its writer closed it) */
  char stopped_why[4 * PROBE_ABORT_REASON_MAX];
} state;

/* "was not closed by its writer (killed?)", or for a trace with the abort
 * mark what ended it: the reason is recorded, no guess. */
static const char *stopped_how(const state *s, char *buf, size_t cap) {
  if (!s->stopped_why[0]) return "was not closed by its writer (killed?)";
  snprintf(buf, cap, "was ended by %.200s (marked aborted; the tracer closed "
                     "it)", s->stopped_why);
  return buf;
}

static int32_t entry_for(state *s, int32_t la, int32_t site, uint32_t seq) {
  size_t slot = (size_t)la * PROBE_SITE_COUNT + (size_t)site;
  if (s->slot_entry[slot] >= 0)
    return s->slot_entry[slot];
  probe_diff *d = s->d;
  int32_t i = (int32_t)d->n_entries++;
  probe_diff_entry *e = &d->entries[i];
  memset(e, 0, sizeof *e);
  probe_text_escape(e->layer, sizeof e->layer, s->la[la].name);
  e->kind = s->la[la].kind;
  e->prec_a = s->la[la].precision;
  e->prec_b = s->lb[s->map_ab[la]].precision;
  e->site = site;
  e->first_seq = seq;
  e->first_div_step = e->first_nonfinite_a = e->first_nonfinite_b = -1;
  e->max_rel_step = e->first_exceed_step = -1;
  s->entry_last_div[i] = -1;
  s->slot_entry[slot] = i;
  return i;
}

static void set_point(probe_diff_point *p, int64_t step, const char *layer,
                      int32_t site, uint32_t seq, double rel, int local,
                      int nonfinite) {
  p->found = 1;
  p->step = step;
  snprintf(p->layer, sizeof p->layer, "%s", layer);
  p->site = site;
  p->seq = seq;
  p->rel = rel;
  p->local = local;
  p->nonfinite = nonfinite;
}

/* The precision of a layer of A or B (PROBE_DTYPE_*). */
static int32_t e_prec(const state *s, int32_t layer, char side) {
  return side == 'A' ? s->la[layer].precision : s->lb[layer].precision;
}

static probe_status compare_step(state *s, const cursor *ca,
                                 const cursor *cb) {
  probe_diff *d = s->d;
  double thr = d->threshold_used;
  int64_t step = ca->step_no;
  double scale_a, scale_b;
  int skip_a, skip_b;
  probe_status st = scale_at(&s->sa, step, &scale_a, &skip_a);
  if (st == PROBE_OK)
    st = scale_at(&s->sb, step, &scale_b, &skip_b);
  if (st != PROBE_OK)
    return st;
  /* index B's records by (layer, site), occurrences in order */
  if (cb->step_n > s->next_cap) {
    int32_t *p = realloc(s->next_b, cb->step_n * sizeof *p);
    if (!p)
      return PROBE_ERR_NOMEM;
    s->next_b = p;
    s->next_cap = cb->step_n;
  }
  for (size_t j = cb->step_n; j-- > 0;) {
    const probe_record *r = &cb->step[j];
    if (r->layer < 0 || (size_t)r->layer >= s->nlb || r->site < 0 ||
        r->site >= PROBE_SITE_COUNT) {
      s->next_b[j] = -2;
      continue;
    }
    size_t key = (size_t)r->layer * PROBE_SITE_COUNT + (size_t)r->site;
    s->next_b[j] = s->head_b[key];
    s->head_b[key] = (int32_t)j;
  }
  size_t nst = s->nla * 3;
  memset(s->seen, 0, nst);
  memset(s->has_in, 0, nst);
  memset(s->in_div, 0, nst);
  memset(s->implied_in, 0, nst);
  memset(s->fwd_div, 0, s->nla);
  memset(s->wgrad_div, 0, s->nla);
  unsigned char last_out_div[3] = {0, 0, 0};
  size_t matched = 0;

  for (size_t i = 0; i < ca->step_n; i++) {
    const probe_record *ra = &ca->step[i];
    if (ra->layer < 0 || (size_t)ra->layer >= s->nla || ra->site < 0 ||
        ra->site >= PROBE_SITE_COUNT || s->map_ab[ra->layer] < 0) {
      d->records_unmatched++;
      continue;
    }
    size_t key = (size_t)s->map_ab[ra->layer] * PROBE_SITE_COUNT +
                 (size_t)ra->site;
    int32_t jb = s->head_b[key];
    if (jb < 0) {
      d->records_unmatched++;
      continue;
    }
    s->head_b[key] = s->next_b[jb];
    matched++;
    const probe_record *rb = &cb->step[jb];
    const probe_stats *sa = &ra->stats, *sb = &rb->stats;

    double ua = 1.0, ub = 1.0; /* unscale gradients */
    if (site_is_grad(ra->site))
      ua = 1.0 / scale_a, ub = 1.0 / scale_b;
    double r_abs = probe_diff_rel(ua * sa->absmax, ub * sb->absmax);
    double r_rms =
        probe_diff_rel(ua * probe_stats_rms(sa), ub * probe_stats_rms(sb));
    double r_l2 = probe_diff_rel(ua * probe_stats_l2(sa), ub * probe_stats_l2(sb));
    double inst = fmax(r_abs, fmax(r_rms, r_l2));
    /* inf/NaN as the post-mortem takes them: masked logits are none */
    int nfa = probe_record_nonfinite((probe_kind)s->la[ra->layer].kind,
                                     (probe_site)ra->site, sa);
    int nfb = probe_record_nonfinite((probe_kind)s->lb[rb->layer].kind,
                                     (probe_site)rb->site, sb);
    /* Scaled gradients that overflow on a step the loss scaler skipped are
     * AMP working as designed (backoff), not a divergence. */
    int grad = site_is_grad(ra->site);
    int ov_a = nfa && grad && skip_a, ov_b = nfb && grad && skip_b;
    int left_out = ov_a || ov_b; /* nothing comparable in this record */
    if (left_out) {
      d->scaler_overflow_records++;
      d->scaler_overflow_sides |= ov_a | ov_b << 1;
      nfa &= !ov_a;
      nfb &= !ov_b;
    }
    int32_t ei = entry_for(s, ra->layer, ra->site, ra->seq);
    probe_diff_entry *e = &d->entries[ei];
    /* windowed mean of rel RMS over the steps compared; steps before the
     * first count as 0; a left-out step does not enter it */
    int W = d->opt.window;
    double wrel = 0.0; /* (a left-out record is judged on nothing) */
    if (!left_out) {
      double *ring = &s->win[(size_t)ei * (size_t)W];
      size_t slot = (size_t)((e->steps - e->steps_left_out) % W);
      s->win_sum[ei] += r_rms - ring[slot];
      ring[slot] = r_rms;
      wrel = fmax(0.0, s->win_sum[ei]) / W;
    }
    /* values flushed to zero on one side only: underflow diverges,
     * rounding and cancellation are counted (zeros_kind) */
    double za = sa->count ? (double)sa->zero_count / (double)sa->count : 0.0;
    double zb = sb->count ? (double)sb->zero_count / (double)sb->count : 0.0;
    char zside = 0;
    int zkind = ZEROS_NONE;
    if (!ov_a && !ov_b)
      zkind = zeros_kind(sa, sb, e_prec(s, ra->layer, 'A'),
                         e_prec(s, rb->layer, 'B'), grad ? scale_a : 1.0,
                         grad ? scale_b : 1.0, d->opt.zero_frac_margin,
                         &zside);
    int zdiv = zkind == ZEROS_UNDERFLOW || zkind == ZEROS_LOST;
    if (zkind == ZEROS_UNDERFLOW)
      d->zero_underflow_records++;
    else if (zkind == ZEROS_ROUNDING)
      d->zero_rounding_records++;
    int32_t zprec = zside == 'A' ? e_prec(s, ra->layer, 'A')
                                 : e_prec(s, rb->layer, 'B');
    if (zkind == ZEROS_UNDERFLOW && zside == 'A')
      s->entry_uf_a[ei]++;
    /* a left-out record never diverges: one side holds the gradients its
     * scaler threw away, nothing to hold the other side's against */
    int div = !left_out && (wrel > thr || nfa != nfb || zdiv);
    double rel = nfa != nfb ? 1.0 : wrel;
    e->steps++;
    if (left_out) {
      e->steps_left_out++;
    } else {
      s->entry_rel_sum[ei] += r_rms;
      if (wrel > e->max_window_rel)
        e->max_window_rel = wrel;
      if (inst > thr && e->first_exceed_step < 0)
        e->first_exceed_step = step;
      double prev = fmax(e->max_rel_absmax, fmax(e->max_rel_rms, e->max_rel_l2));
      if (e->max_rel_step < 0 || inst > prev)
        e->max_rel_step = step;
      e->max_rel_absmax = fmax(e->max_rel_absmax, r_abs);
      e->max_rel_rms = fmax(e->max_rel_rms, r_rms);
      e->max_rel_l2 = fmax(e->max_rel_l2, r_l2);
    }
    if ((nfa || ov_a) && e->first_nonfinite_a < 0)
      e->first_nonfinite_a = step;
    if ((nfb || ov_b) && e->first_nonfinite_b < 0)
      e->first_nonfinite_b = step;
    if (!ov_a && !ov_b) { /* zeros of a skipped overflow step mean nothing */
      e->count_a += sa->count;
      e->zero_a += sa->zero_count;
      e->count_b += sb->count;
      e->zero_b += sb->zero_count;
    }
    if (nfa && !d->first_nonfinite_a.found)
      set_point(&d->first_nonfinite_a, step, e->layer, ra->site, ra->seq, 1.0,
                0, 1);
    if (nfb && !d->first_nonfinite_b.found)
      set_point(&d->first_nonfinite_b, step, e->layer, ra->site, rb->seq, 1.0,
                0, 1);

    /* local or carried: what flowed into this record */
    int ph = (int)probe_site_phase((probe_site)ra->site);
    size_t ls = (size_t)ra->layer * 3 + (size_t)ph;
    if (!s->seen[ls]) {
      s->seen[ls] = 1;
      s->implied_in[ls] = last_out_div[ph];
    }
    int inputs_div = 0;
    if (site_is_input(ra->site)) {
      s->has_in[ls] = 1;
      s->in_div[ls] |= (unsigned char)div;
      inputs_div = -1; /* not an output */
    } else if (ph == PROBE_PHASE_OPTIMIZER) {
      inputs_div = s->wgrad_div[ra->layer] || s->entry_last_div[ei] == step - 1;
    } else {
      inputs_div = s->has_in[ls] ? s->in_div[ls] : s->implied_in[ls];
      if (ph == PROBE_PHASE_BACKWARD)
        inputs_div |= s->fwd_div[ra->layer];
      last_out_div[ph] = (unsigned char)div;
    }
    if (ph == PROBE_PHASE_FORWARD && div)
      s->fwd_div[ra->layer] = 1;
    if (ra->site == PROBE_SITE_WEIGHT_GRAD && div)
      s->wgrad_div[ra->layer] = 1;

    if (!div)
      continue;
    s->entry_last_div[ei] = step;
    if (inputs_div == 0)
      e->local_steps++;
    else if (inputs_div > 0)
      e->carried_steps++;
    if (e->first_div_step < 0) {
      e->first_div_step = step;
      e->first_div_seq = ra->seq;
      e->first_div_rel = rel;
      e->absmax_a_at_div = ua * sa->absmax;
      e->absmax_b_at_div = ub * sb->absmax;
    }
    if (d->first_div_step < 0)
      d->first_div_step = step;
    if (d->first_div_step == step) {
      if (!d->first_div.found) {
        set_point(&d->first_div, step, e->layer, ra->site, ra->seq, rel,
                  inputs_div == 0, nfa != nfb ? 1 + nfb : 0);
        d->first_div.zero_a = za, d->first_div.zero_b = zb;
      }
      if (!d->intro.found && inputs_div == 0) {
        set_point(&d->intro, step, e->layer, ra->site, ra->seq, rel, 1,
                  nfa != nfb ? 1 + nfb : 0);
        d->intro.zero_a = za, d->intro.zero_b = zb;
        s->intro_zeros = zkind, s->intro_zside = zside;
        s->intro_zprec = zprec;
      }
    }
  }
  /* unmatched B records; reset the index */
  for (size_t j = 0; j < cb->step_n; j++) {
    const probe_record *r = &cb->step[j];
    if (s->next_b[j] == -2)
      continue;
    size_t key = (size_t)r->layer * PROBE_SITE_COUNT + (size_t)r->site;
    s->head_b[key] = -1;
  }
  d->records_unmatched += (int64_t)(cb->step_n - matched); /* B leftovers */
  return PROBE_OK;
}

/* ---- loss curves --------------------------------------------------------- */

#define FINAL_WINDOW 10

static probe_status compare_losses(probe_diff *d, probe_trace *a,
                                   probe_trace *b, size_t chunk,
                                   probe__progress *pg) {
  probe_step_scalars *ba = malloc(chunk * sizeof *ba);
  probe_step_scalars *bb = malloc(chunk * sizeof *bb);
  probe_status st = PROBE_OK;
  if (!ba || !bb) {
    st = PROBE_ERR_NOMEM;
    goto done;
  }
  int64_t rowa = 0, rowb = 0;
  size_t na = 0, nb = 0, ia = 0, ib = 0;
  double wa[FINAL_WINDOW], wb[FINAL_WINDOW];
  int64_t nw = 0;
  int W = d->opt.window;
  double lring[PROBE_DIFF_MAX_WINDOW] = {0}, lsum = 0;
  d->loss_part_step = d->first_nonfinite_loss_a = d->first_nonfinite_loss_b =
      -1;
  d->last_step_a = d->last_step_b = -1;
  d->trailing_skips_a = d->trailing_skips_b = 0;
  for (;;) {
    if (ia == na) {
      if ((st = probe_trace_read_steps(a, rowa, chunk, ba, &na)) != PROBE_OK ||
          (st = probe__progress_add(pg, na)) != PROBE_OK)
        goto done;
      rowa += (int64_t)na;
      ia = 0;
    }
    if (ib == nb) {
      if ((st = probe_trace_read_steps(b, rowb, chunk, bb, &nb)) != PROBE_OK ||
          (st = probe__progress_add(pg, nb)) != PROBE_OK)
        goto done;
      rowb += (int64_t)nb;
      ib = 0;
    }
    if (na == 0 && nb == 0)
      break;
    const probe_step_scalars *pa = ia < na ? &ba[ia] : NULL;
    const probe_step_scalars *pb = ib < nb ? &bb[ib] : NULL;
    int known_a = pa && !PROBE__UNMEASURED(pa, PROBE__SC_LOSS);
    int known_b = pb && !PROBE__UNMEASURED(pb, PROBE__SC_LOSS);
    if (known_a && !isfinite(pa->loss) && d->first_nonfinite_loss_a < 0)
      d->first_nonfinite_loss_a = pa->step;
    if (known_b && !isfinite(pb->loss) && d->first_nonfinite_loss_b < 0)
      d->first_nonfinite_loss_b = pb->step;
    if (pa && (!pb || pa->step < pb->step)) {
      d->last_step_a = pa->step;
      d->trailing_skips_a = pa->skipped ? d->trailing_skips_a + 1 : 0;
      ia++;
      /* avoid re-counting the non-finite check: done above once per row */
      continue;
    }
    if (pb && (!pa || pb->step < pa->step)) {
      d->last_step_b = pb->step;
      d->trailing_skips_b = pb->skipped ? d->trailing_skips_b + 1 : 0;
      ib++;
      continue;
    }
    /* same step */
    d->last_step_a = pa->step;
    d->last_step_b = pb->step;
    d->trailing_skips_a = pa->skipped ? d->trailing_skips_a + 1 : 0;
    d->trailing_skips_b = pb->skipped ? d->trailing_skips_b + 1 : 0;
    if (!known_a || !known_b) { /* not measured on one side: no comparison */
      ia++;
      ib++;
      continue;
    }
    d->loss_steps++;
    double rel = probe_diff_rel(pa->loss, pb->loss);
    int fa = isfinite(pa->loss), fb = isfinite(pb->loss);
    if (rel > d->max_loss_rel) /* 1 when one side only is non-finite */
      d->max_loss_rel = rel;
    double r_fin = fa && fb ? rel : (fa == fb ? 0.0 : 1.0);
    size_t slot = (size_t)(d->loss_steps - 1) % (size_t)W;
    lsum += r_fin - lring[slot];
    lring[slot] = r_fin;
    double wrel = fmax(0.0, lsum) / W;
    if (d->loss_part_step < 0 && (wrel > d->threshold_used || fa != fb)) {
      d->loss_part_step = pa->step;
      d->loss_a_at_part = pa->loss;
      d->loss_b_at_part = pb->loss;
    }
    wa[nw % FINAL_WINDOW] = pa->loss;
    wb[nw % FINAL_WINDOW] = pb->loss;
    nw++;
    ia++;
    ib++;
  }
  if (nw > 0) {
    int64_t k = nw < FINAL_WINDOW ? nw : FINAL_WINDOW;
    double sa = 0, sb = 0;
    for (int64_t i = 0; i < k; i++)
      sa += wa[i], sb += wb[i];
    d->final_loss_a = sa / (double)k;
    d->final_loss_b = sb / (double)k;
    /* apart only when both means are numbers: nan vs nan is not "0%" */
    d->final_loss_rel = isfinite(d->final_loss_a) && isfinite(d->final_loss_b)
                            ? probe_diff_rel(d->final_loss_a, d->final_loss_b)
                            : NAN;
  } else {
    d->final_loss_a = d->final_loss_b = d->final_loss_rel = NAN;
  }
done:
  free(ba);
  free(bb);
  return st;
}

/* ---- configurations key by key ------------------------------------------- */

/* Keys that belong to the precision policy, expected to differ. */
static int policy_key(const char *k) {
  return strstr(k, "precision") || strstr(k, "fp32") || strstr(k, "fp16") ||
         strstr(k, "bf16") || strstr(k, "policy");
}

static probe_status add_config_row(probe_diff *d, const char *key,
                                   const char *a, const char *b) {
  probe_diff_config_row *rows =
      realloc(d->config_diff, (d->n_config_diff + 1) * sizeof *rows);
  if (!rows) return PROBE_ERR_NOMEM;
  d->config_diff = rows;
  probe_diff_config_row *r = &rows[d->n_config_diff];
  memset(r, 0, sizeof *r);
  probe_text_escape(r->key, sizeof r->key, key);
  r->a = a ? strdup(a) : NULL;
  r->b = b ? strdup(b) : NULL;
  if ((a && !r->a) || (b && !r->b)) {
    free(r->a);
    free(r->b);
    return PROBE_ERR_NOMEM;
  }
  d->n_config_diff++;
  d->config_other |= !policy_key(key);
  return PROBE_OK;
}

/* A JSON number written as an integer (no fraction, no exponent) that
 * fits an int64: *v holds it. */
static int json_int_value(const char *raw, long long *v) {
  if (strpbrk(raw, ".eE")) return 0;
  errno = 0;
  char *end;
  *v = strtoll(raw, &end, 10);
  return errno == 0 && end != raw && *end == '\0';
}

/* 1 when two JSON numbers are the same number: 1e-05 and
 * 1.0000000000000001e-5 (one double, written by two writers: jansson and
 * Python's json), 1 and 1.0; two integers exactly (9007199254740993 and
 * 9007199254740992 are one double, but two seeds); an integer and a real
 * when the real is that integer. The rule of report's config check
 * (tools/report.c, same_json). */
static int same_number(const probe__jleaf *x, const probe__jleaf *y) {
  long long ix, iy;
  int xi = json_int_value(x->raw, &ix), yi = json_int_value(y->raw, &iy);
  if (xi && yi) return ix == iy;
  if (!strpbrk(x->raw, ".eE") && !strpbrk(y->raw, ".eE"))
    return !strcmp(x->raw, y->raw); /* integers beyond int64: as written */
  if (xi != yi) {
    long long i = xi ? ix : iy;
    double r = xi ? y->num : x->num;
    /* r converts back only inside the int64 range (2^63 is not in it) */
    return r == (double)i && r >= -9223372036854775808.0 &&
           r < 9223372036854775808.0 && (long long)r == i;
  }
  if (x->num == y->num && isfinite(x->num)) return 1;
  return !strcmp(x->raw, y->raw); /* 1e999 and 1e999: the same text */
}

/* 1 when two leaves hold the same value: numbers as numbers (same_number),
 * strings as decoded ("caf\u00e9" is "café"), the rest (true, false,
 * null, [] and {}) as written. */
static int same_leaf(const probe__jleaf *x, const probe__jleaf *y) {
  if (x->type != y->type) return 0;
  if (x->type == PROBE__JV_NUM) return same_number(x, y);
  if (x->type == PROBE__JV_STR && x->str && y->str)
    return !strcmp(x->str, y->str);
  if (x->type == PROBE__JV_EMPTY) return x->raw[0] == y->raw[0]; /* [ ] is [] */
  return !strcmp(x->raw, y->raw);
}

/* Where the configs differ, leaf by leaf ("scaler.init", "fp32[0]"): a
 * value is compared as a value (same_leaf), not as written, so the same
 * config stored by two writers (the C trainer, Python's json) is one. */
static probe_status compare_configs(probe_diff *d, const char *ja,
                                    const char *jb) {
  probe__jflat fa, fb;
  int oka = ja && *ja && probe__jflat_parse(&fa, ja) == PROBE_OK;
  int okb = jb && *jb && probe__jflat_parse(&fb, jb) == PROBE_OK;
  probe_status st = PROBE_OK;
  if (!oka || !okb) {
    if (!oka)
      note(d, "trace A holds no readable configuration");
    if (!okb)
      note(d, "trace B holds no readable configuration");
    goto done;
  }
  d->config_compared = 1;
  for (size_t i = 0; i < fa.n && st == PROBE_OK; i++) {
    const probe__jleaf *y = probe__jflat_get(&fb, fa.leaf[i].path);
    if (y && same_leaf(&fa.leaf[i], y))
      continue;
    st = add_config_row(d, fa.leaf[i].path, fa.leaf[i].raw, y ? y->raw : NULL);
  }
  for (size_t i = 0; i < fb.n && st == PROBE_OK; i++)
    if (!probe__jflat_get(&fa, fb.leaf[i].path))
      st = add_config_row(d, fb.leaf[i].path, NULL, fb.leaf[i].raw);
done:
  if (oka)
    probe__jflat_free(&fa);
  if (okb)
    probe__jflat_free(&fb);
  return st;
}

/* ---- ordering and the verdict -------------------------------------------- */

static int entry_cmp(const void *pa, const void *pb) {
  const probe_diff_entry *a = pa, *b = pb;
  int da = a->first_div_step >= 0, db = b->first_div_step >= 0;
  if (da != db)
    return db - da;
  if (da) {
    if (a->first_div_step != b->first_div_step)
      return a->first_div_step < b->first_div_step ? -1 : 1;
    if (a->first_div_seq != b->first_div_seq)
      return a->first_div_seq < b->first_div_seq ? -1 : 1;
    return 0;
  }
  double ma = a->max_window_rel, mb = b->max_window_rel;
  if (ma != mb)
    return ma > mb ? -1 : 1;
  return a->first_seq < b->first_seq ? -1 : a->first_seq > b->first_seq;
}

static void write_verdict(probe_diff *d, const state *s) {
  char *v = d->verdict_text;
  size_t len = sizeof d->verdict_text, n = 0;
#define PUT(...)                                                               \
  do {                                                                         \
    if (n < len)                                                               \
      n += (size_t)snprintf(v + n, len - n, __VA_ARGS__);                      \
  } while (0)
  const int layers_differ = d->only_a[0] || d->only_b[0];
  if (d->verdict == PROBE_DIFF_NOT_ALIGNED) {
    char how[320];
    PUT("A and B do not align: ");
    if (s->stopped && d->n_layers_common > 0 && !layers_differ &&
        (d->steps_common > 0 || d->loss_steps > 0))
      PUT("%c %s and ends at step %lld, "
          "%c at %lld: the steps both reached agree within tolerance, the "
          "rest of %c's run is missing.",
          s->stopped, stopped_how(s, how, sizeof how),
          (long long)s->stopped_last, s->stopped == 'A' ? 'B' : 'A',
          (long long)s->other_last, s->stopped);
    else if (d->n_layers_common == 0)
      PUT("no layer name in common, so nothing was compared.");
    else if (d->steps_common == 0 && d->loss_steps == 0)
      PUT("no step with per-layer records in common (A %lld steps, B %lld), "
          "so nothing was compared.",
          (long long)d->steps_a, (long long)d->steps_b);
    else
      PUT("their layer lists differ (only in A: %.160s; only in B: %.160s), so they "
          "are not the same model; the %lld layers in common agree within "
          "tolerance.",
          d->only_a[0] ? d->only_a : "none", d->only_b[0] ? d->only_b : "none",
          (long long)d->n_layers_common);
    return;
  }
  /* the largest difference, for both verdicts */
  const probe_diff_entry *worst = NULL;
  double wrel = -1;
  for (size_t i = 0; i < d->n_entries; i++) {
    const probe_diff_entry *e = &d->entries[i];
    double m = e->max_window_rel;
    if (m > wrel)
      wrel = m, worst = e;
  }
  if (d->verdict == PROBE_DIFF_AGREE) {
    PUT("A and B agree within tolerance (threshold %.3g%s on the RMS "
        "difference averaged over %d steps)",
        d->threshold_used,
        d->threshold_format == PROBE_DTYPE_BF16 ? " for BF16" : "",
        d->opt.window);
    if (worst)
      PUT(": largest %.3g (%s %s)", wrel, worst->layer,
          probe_site_name((probe_site)worst->site));
    if (d->loss_steps > 0 && isfinite(d->final_loss_rel))
      PUT("; final losses %.6g vs %.6g (%.2f%% apart)", d->final_loss_a,
          d->final_loss_b, 100.0 * d->final_loss_rel);
    PUT(".");
    return;
  }
  PUT("A diverges from B");
  if (d->first_div_step >= 0) {
    PUT(" from step %lld", (long long)d->first_div_step);
    if (d->intro.found)
    {
      PUT(": error introduced at %s (%s, ", d->intro.layer,
          probe_site_name((probe_site)d->intro.site));
      if (d->intro.nonfinite)
        PUT("non-finite in %s only", d->intro.nonfinite == 2 ? "B" : "A");
      else if (s->intro_zeros == ZEROS_UNDERFLOW)
        PUT("zeros %.0f%% vs %.0f%%: values underflowed to zero in %c (%s)",
            100.0 * d->intro.zero_a, 100.0 * d->intro.zero_b,
            s->intro_zside, format_name(s->intro_zprec));
      else if (s->intro_zeros == ZEROS_LOST)
        PUT("zeros %.0f%% vs %.0f%%: values turned to exact zeros in %c "
            "(%s), not by underflow: %c's are within %s's range",
            100.0 * d->intro.zero_a, 100.0 * d->intro.zero_b,
            s->intro_zside, format_name(s->intro_zprec),
            s->intro_zside == 'A' ? 'B' : 'A', format_name(s->intro_zprec));
      else {
        PUT("windowed relative difference %.3g", d->intro.rel);
        if (s->intro_zeros == ZEROS_ROUNDING)
          PUT("; zeros %.0f%% vs %.0f%%, more in %c from rounding or exact "
              "cancellation, not underflow",
              100.0 * d->intro.zero_a, 100.0 * d->intro.zero_b,
              s->intro_zside);
      }
      PUT("), its inputs agreed");
    }
    else if (d->first_div.found)
      PUT(": first at %s (%s); no record of that step differs while its "
          "inputs agree, so the difference was carried in",
          d->first_div.layer, probe_site_name((probe_site)d->first_div.site));
    if (d->intro.found && d->first_div.found &&
        (strcmp(d->intro.layer, d->first_div.layer) ||
         d->intro.site != d->first_div.site))
      PUT("; earlier in that step %s (%s) already differed",
          d->first_div.layer, probe_site_name((probe_site)d->first_div.site));
  }
  PUT(".");
  if (d->first_nonfinite_a.found && !d->first_nonfinite_b.found)
    PUT(" A turns non-finite at step %lld in %s (%s); B stays finite.",
        (long long)d->first_nonfinite_a.step, d->first_nonfinite_a.layer,
        probe_site_name((probe_site)d->first_nonfinite_a.site));
  else if (d->first_nonfinite_b.found && !d->first_nonfinite_a.found)
    PUT(" B turns non-finite at step %lld in %s (%s); A stays finite.",
        (long long)d->first_nonfinite_b.step, d->first_nonfinite_b.layer,
        probe_site_name((probe_site)d->first_nonfinite_b.site));
  if (layers_differ)
    PUT(" The layer lists differ (only in A: %.160s; only in B: %.160s): the "
        "difference may be the models', not the precision's.",
        d->only_a[0] ? d->only_a : "none", d->only_b[0] ? d->only_b : "none");
  if (d->loss_part_step >= 0)
    PUT(" Loss curves part at step %lld (%.6g vs %.6g).",
        (long long)d->loss_part_step, d->loss_a_at_part, d->loss_b_at_part);
  else if (d->loss_steps > 0)
    PUT(" Loss curves stay together (largest windowed difference below "
        "%.3g).",
        d->threshold_used);
  int nflush = 0;
  for (size_t i = 0; i < d->n_entries; i++) {
    const probe_diff_entry *e = &d->entries[i];
    if (!e->flushes_to_zero)
      continue;
    if (nflush == 0)
      PUT(" Gradients flush to zero in A:");
    if (nflush < 6)
      PUT("%s %s %s (zeros %.0f%% vs %.0f%%)", nflush ? "," : "", e->layer,
          probe_site_name((probe_site)e->site),
          100.0 * (double)e->zero_a / (double)e->count_a,
          100.0 * (double)e->zero_b / (double)(e->count_b ? e->count_b : 1));
    nflush++;
  }
  if (nflush > 6)
    PUT(" and %d more", nflush - 6);
  if (nflush)
    PUT(".");
#undef PUT
}

/* ---- entry point, in stages ---------------------------------------------- */

/* Stage 1: options, the two traces' metadata and their configs. */
static probe_status stage_metadata(probe_diff *d, probe_trace *a,
                                   probe_trace *b,
                                   const probe_diff_options *opt) {
  memset(d, 0, sizeof *d);
  if (opt)
    d->opt = *opt;
  else
    probe_diff_options_init(&d->opt);
  d->opt.chunk_rows = probe__chunk_rows(d->opt.chunk_rows);
  d->first_div_step = -1;
  d->loss_part_step = -1;
  d->first_common_step = d->last_common_step = -1;
  const probe_trace_info *ia = probe_trace_get_info(a);
  const probe_trace_info *ib = probe_trace_get_info(b);
  d->record_mode_a = ia->record_mode;
  d->record_mode_b = ib->record_mode;
  probe_text_escape(d->policy_a, sizeof d->policy_a,
                    ia->precision_policy ? ia->precision_policy : "");
  probe_text_escape(d->policy_b, sizeof d->policy_b,
                    ib->precision_policy ? ib->precision_policy : "");
  if (compare_configs(d, ia->config_json, ib->config_json) != PROBE_OK)
    return PROBE_ERR_NOMEM;
  if (d->config_other)
    note(d, "the configurations differ beyond the precision policy (see "
            "config differences): the traces may not be comparable");
  return PROBE_OK;
}

static void state_free(state *s) {
  free(s->map_ab);
  free(s->slot_entry);
  free(s->entry_last_div);
  free(s->entry_uf_a);
  free(s->entry_rel_sum);
  free(s->win);
  free(s->win_sum);
  free(s->head_b);
  free(s->next_b);
  free(s->seen);
  free(s->has_in);
  free(s->in_div);
  free(s->implied_in);
  free(s->fwd_div);
  free(s->wgrad_div);
  free(s->sa.buf);
  free(s->sb.buf);
}

/* Stage 2: the working state, sized by the two layer tables. */
static probe_status stage_state(state *s, probe_diff *d, probe_trace *a,
                                probe_trace *b) {
  memset(s, 0, sizeof *s);
  s->d = d;
  s->la = probe_trace_layers(a, &s->nla);
  s->lb = probe_trace_layers(b, &s->nlb);
  d->n_layers_a = (int64_t)s->nla;
  d->n_layers_b = (int64_t)s->nlb;
  size_t nslots = (s->nla ? s->nla : 1) * PROBE_SITE_COUNT;
  size_t nslots_b = (s->nlb ? s->nlb : 1) * PROBE_SITE_COUNT;
  s->map_ab = malloc((s->nla + 1) * sizeof *s->map_ab);
  s->slot_entry = malloc(nslots * sizeof *s->slot_entry);
  s->entry_last_div = malloc(nslots * sizeof *s->entry_last_div);
  s->entry_rel_sum = calloc(nslots, sizeof *s->entry_rel_sum);
  s->entry_uf_a = calloc(nslots, sizeof *s->entry_uf_a);
  s->win = calloc(nslots * (size_t)d->opt.window, sizeof *s->win);
  s->win_sum = calloc(nslots, sizeof *s->win_sum);
  s->head_b = malloc(nslots_b * sizeof *s->head_b);
  d->entries = malloc(nslots * sizeof *d->entries);
  size_t nst = (s->nla + 1) * 3;
  s->seen = malloc(nst);
  s->has_in = malloc(nst);
  s->in_div = malloc(nst);
  s->implied_in = malloc(nst);
  s->fwd_div = malloc(s->nla + 1);
  s->wgrad_div = malloc(s->nla + 1);
  s->sa.t = a;
  s->sb.t = b;
  s->sa.cap = s->sb.cap = d->opt.chunk_rows;
  s->sa.buf = malloc(s->sa.cap * sizeof *s->sa.buf);
  s->sb.buf = malloc(s->sb.cap * sizeof *s->sb.buf);
  if (!s->map_ab || !s->slot_entry || !s->entry_last_div ||
      !s->entry_rel_sum || !s->entry_uf_a || !s->head_b || !d->entries || !s->win ||
      !s->win_sum || !s->seen || !s->has_in || !s->in_div || !s->implied_in ||
      !s->fwd_div || !s->wgrad_div || !s->sa.buf || !s->sb.buf)
    return PROBE_ERR_NOMEM;
  /* the threshold of the coarsest format either trace uses */
  d->threshold_used = d->opt.threshold;
  d->threshold_format = PROBE_DTYPE_F16;
  for (size_t i = 0; i < s->nla + s->nlb; i++) {
    const probe_layer_info *l = i < s->nla ? &s->la[i] : &s->lb[i - s->nla];
    if (l->precision == PROBE_DTYPE_BF16) {
      d->threshold_used = d->opt.threshold * PROBE_DIFF_BF16_THRESHOLD_FACTOR;
      d->threshold_format = PROBE_DTYPE_BF16;
      break;
    }
  }
  for (size_t i = 0; i < nslots; i++)
    s->slot_entry[i] = -1;
  for (size_t i = 0; i < nslots_b; i++)
    s->head_b[i] = -1;
  return PROBE_OK;
}

/* Stage 3: layers aligned by name, through B's names sorted (a scan of B
 * per layer of A made 2^20 layers take about an hour). */
typedef struct named {
  const char *name;
  int32_t j;
} named;

static int named_cmp(const void *x, const void *y) {
  return strcmp(((const named *)x)->name, ((const named *)y)->name);
}

static probe_status stage_align_layers(state *s) {
  probe_diff *d = s->d;
  named *byname = malloc((s->nlb ? s->nlb : 1) * sizeof *byname);
  unsigned char *in_a = calloc(s->nlb ? s->nlb : 1, 1);
  if (!byname || !in_a) {
    free(byname);
    free(in_a);
    return PROBE_ERR_NOMEM;
  }
  for (size_t j = 0; j < s->nlb; j++)
    byname[j] = (named){s->lb[j].name, (int32_t)j};
  qsort(byname, s->nlb, sizeof *byname, named_cmp);
  for (size_t i = 0; i < s->nla; i++) {
    named key = {s->la[i].name, -1};
    const named *hit =
        s->nlb ? bsearch(&key, byname, s->nlb, sizeof *byname, named_cmp) : NULL;
    s->map_ab[i] = hit ? hit->j : -1;
    if (!hit) {
      append_name(d->only_a, sizeof d->only_a, s->la[i].name);
      continue;
    }
    d->n_layers_common++;
    in_a[hit->j] = 1;
    if (s->la[i].kind != s->lb[hit->j].kind) {
      char esc[PROBE_NAME_MAX * 4];
      probe_text_escape(esc, sizeof esc, s->la[i].name);
      note(d, "layer %s is a %s in A but a %s in B", esc,
           probe_kind_name((probe_kind)s->la[i].kind),
           probe_kind_name((probe_kind)s->lb[hit->j].kind));
    }
  }
  for (size_t j = 0; j < s->nlb; j++)
    if (!in_a[j]) append_name(d->only_b, sizeof d->only_b, s->lb[j].name);
  free(byname);
  free(in_a);
  if (d->only_a[0] || d->only_b[0])
    note(d, "the layer lists differ: only in A: %s; only in B: %s",
         d->only_a[0] ? d->only_a : "(none)",
         d->only_b[0] ? d->only_b : "(none)");
  return PROBE_OK;
}

/* Stage 4: the records, step by step, both traces in step order. */
static probe_status stage_records(state *s, cursor *ca, cursor *cb) {
  probe_diff *d = s->d;
  probe_status st;
  if ((st = cursor_next(ca)) != PROBE_OK || (st = cursor_next(cb)) != PROBE_OK)
    return st;
  while (ca->step_no >= 0 || cb->step_no >= 0) {
    if (cb->step_no < 0 || (ca->step_no >= 0 && ca->step_no < cb->step_no)) {
      d->steps_a++;
      d->records_unmatched += (int64_t)ca->step_n;
      if ((st = cursor_next(ca)) != PROBE_OK)
        return st;
      continue;
    }
    if (ca->step_no < 0 || cb->step_no < ca->step_no) {
      d->steps_b++;
      d->records_unmatched += (int64_t)cb->step_n;
      if ((st = cursor_next(cb)) != PROBE_OK)
        return st;
      continue;
    }
    d->steps_a++;
    d->steps_b++;
    d->steps_common++;
    if (d->first_common_step < 0)
      d->first_common_step = ca->step_no;
    d->last_common_step = ca->step_no;
    if ((st = compare_step(s, ca, cb)) != PROBE_OK)
      return st;
    if ((st = cursor_next(ca)) != PROBE_OK || (st = cursor_next(cb)) != PROBE_OK)
      return st;
  }
  if (ca->skipped || cb->skipped)
    note(d, "records out of step order ignored (overlapping flight-recorder "
            "dumps): %lld in A, %lld in B",
         (long long)ca->skipped, (long long)cb->skipped);
  if (d->records_unmatched)
    note(d, "%lld records have no partner on the other side (steps or sites "
            "recorded on one side only)",
         (long long)d->records_unmatched);
  if (d->record_mode_a != PROBE_MODE_FULL || d->record_mode_b != PROBE_MODE_FULL)
    note(d, "%s recorded per-layer data only around non-finite events "
            "(flight recorder); run with --trace for a step-by-step comparison",
         d->record_mode_a != PROBE_MODE_FULL
             ? (d->record_mode_b != PROBE_MODE_FULL ? "A and B" : "A")
             : "B");
  return PROBE_OK;
}

/* Stage 6: notes on scaled-gradient overflows the scalers skipped and on
 * runs of different length. */
static void stage_scaler_notes(probe_diff *d) {
  if (d->scaler_overflow_records) {
    /* Normal dynamic loss scaling only when the scaler recovered: a side
     * whose last steps were all skipped never did (a collapsed scale). */
    int stuck_a = (d->scaler_overflow_sides & 1) && d->trailing_skips_a > 0;
    int stuck_b = (d->scaler_overflow_sides & 2) && d->trailing_skips_b > 0;
    if (!stuck_a && !stuck_b)
      note(d, "%lld record%s scaled gradients that overflowed on steps the "
              "loss scaler skipped (normal dynamic loss scaling: it "
              "recovered), not counted as divergence",
           (long long)d->scaler_overflow_records,
           d->scaler_overflow_records == 1 ? " holds" : "s hold");
    else {
      char who[96];
      if (stuck_a && stuck_b)
        snprintf(who, sizeof who, "the last %lld step%s of A and the last "
                 "%lld of B were", (long long)d->trailing_skips_a,
                 d->trailing_skips_a == 1 ? "" : "s",
                 (long long)d->trailing_skips_b);
      else {
        int64_t k = stuck_a ? d->trailing_skips_a : d->trailing_skips_b;
        snprintf(who, sizeof who, "the last %lld step%s of %s", (long long)k,
                 k == 1 ? "" : "s",
                 stuck_a ? (k == 1 ? "A was" : "A were") : (k == 1 ? "B was" : "B were"));
      }
      note(d, "%lld record%s scaled gradients that overflowed on steps the "
              "loss scaler skipped, not counted as divergence; the scaler "
              "did not recover (not normal dynamic loss scaling): %s skipped",
           (long long)d->scaler_overflow_records,
           d->scaler_overflow_records == 1 ? " holds" : "s hold", who);
    }
  }
  if (d->last_step_a != d->last_step_b)
    note(d, "the runs end at different steps: A at %lld, B at %lld; compared "
            "the steps both hold",
         (long long)d->last_step_a, (long long)d->last_step_b);
  if (d->steps_common > 0 && d->steps_common < d->opt.window)
    note(d, "only %lld step%s in common, fewer than the window (%d): a "
            "steady RMS difference r counts as divergence only when r x "
            "%lld / %d exceeds the threshold; --window %lld judges these "
            "steps alone",
         (long long)d->steps_common, d->steps_common == 1 ? "" : "s",
         d->opt.window, (long long)d->steps_common, d->opt.window,
         (long long)d->steps_common);
}

/* Stage 7: per-entry summaries, the table's order and the verdict. */
static void stage_verdict(state *s) {
  probe_diff *d = s->d;
  if (d->zero_rounding_records)
    note(d, "%lld record%s more exact zeros on one side (>= %.0f%% and "
            ">= %d values) that are no underflow (the other side's values "
            "are within the format's range, or the zeros are FP32's): "
            "rounding or exact cancellation, not counted as divergence",
         (long long)d->zero_rounding_records,
         d->zero_rounding_records == 1 ? " holds" : "s hold",
         100.0 * d->opt.zero_frac_margin, PROBE_DIFF_ZERO_MIN_VALUES);
  if (d->threshold_format == PROBE_DTYPE_BF16)
    note(d, "a trace has BF16 layers: records and the loss are judged with "
            "threshold %.3g (%.3g x %.0f: BF16 rounds 8x coarser than FP16)",
         d->threshold_used, d->opt.threshold,
         PROBE_DIFF_BF16_THRESHOLD_FACTOR);
  for (size_t i = 0; i < d->n_entries; i++) {
    probe_diff_entry *e = &d->entries[i];
    int64_t compared = e->steps - e->steps_left_out;
    e->mean_rel_rms = compared ? s->entry_rel_sum[i] / (double)compared : 0.0;
    if (site_is_grad(e->site) && e->count_a > 0 && e->count_b > 0) {
      double za = (double)e->zero_a / (double)e->count_a;
      double zb = (double)e->zero_b / (double)e->count_b;
      e->flushes_to_zero = za >= zb + d->opt.zero_frac_margin &&
                           e->zero_a >= e->zero_b + PROBE_DIFF_ZERO_MIN_VALUES &&
                           s->entry_uf_a[i] > 0;
    }
  }
  qsort(d->entries, d->n_entries, sizeof *d->entries, entry_cmp);
  /* AGREE needs the same model: with layers on one side only, agreement of
   * the part compared is NOT_ALIGNED (exit 1); a divergence stays one */
  if (d->n_layers_common == 0 || (d->steps_common == 0 && d->loss_steps == 0))
    d->verdict = PROBE_DIFF_NOT_ALIGNED;
  else if (d->first_div_step >= 0 || d->loss_part_step >= 0)
    d->verdict = PROBE_DIFF_DIVERGE;
  else if (d->only_a[0] || d->only_b[0])
    d->verdict = PROBE_DIFF_NOT_ALIGNED;
  else if (s->stopped) /* a killed run agrees only as far as it went */
    d->verdict = PROBE_DIFF_NOT_ALIGNED;
  else
    d->verdict = PROBE_DIFF_AGREE;
  write_verdict(d, s);
}

probe_status probe_diff_run(probe_diff *d, probe_trace *a, probe_trace *b,
                            const probe_diff_options *opt) {
  return probe_diff_run_progress(d, a, b, opt, NULL, NULL);
}

probe_status probe_diff_run_progress(probe_diff *d, probe_trace *a,
                                     probe_trace *b,
                                     const probe_diff_options *opt,
                                     probe_progress_fn fn, void *user) {
  if (!d || !a || !b) {
    probe__trace_open_msg("probe_diff_run: NULL %s",
                          !d ? "result" : !a ? "trace a" : "trace b");
    return PROBE_ERR_INVALID_ARG;
  }
  /* options out of their documented range are refused, not clamped */
  if (opt && (opt->window < 1 || opt->window > PROBE_DIFF_MAX_WINDOW)) {
    memset(d, 0, sizeof *d);
    probe__trace_open_msg("probe_diff_run: window %d outside 1..%d",
                          opt->window, PROBE_DIFF_MAX_WINDOW);
    return PROBE_ERR_INVALID_ARG;
  }
  if (opt && (!(opt->threshold > 0) || !(opt->zero_frac_margin >= 0))) {
    memset(d, 0, sizeof *d);
    probe__trace_open_msg(
        "probe_diff_run: %s %g (a number %s)",
        !(opt->threshold > 0) ? "threshold" : "zero_frac_margin",
        !(opt->threshold > 0) ? opt->threshold : opt->zero_frac_margin,
        !(opt->threshold > 0) ? "> 0" : ">= 0");
    return PROBE_ERR_INVALID_ARG;
  }
  /* The tables the comparison does not read (snapshots, kernels) are
   * checked too, as probe_diag_run does, so that a file the isolated open
   * refuses is refused on an in-process handle as well (an isolated
   * handle's child read them: no second sweep). */
  probe_trace *bad = a;
  probe_status st = probe__trace_check_unread(a);
  if (st == PROBE_OK) {
    bad = b;
    st = probe__trace_check_unread(b);
  }
  if (st != PROBE_OK) {
    memset(d, 0, sizeof *d);
    note(d, "trace %s: %s", bad == a ? "A" : "B", probe_trace_last_error(bad));
    probe__trace_open_msg("probe_diff_run: %s", d->notes[0]);
    return st;
  }
  st = stage_metadata(d, a, b, opt);
  if (st != PROBE_OK)
    return st;
  const probe_trace_info *ia = probe_trace_get_info(a);
  const probe_trace_info *ib = probe_trace_get_info(b);
  /* both traces' records, then both steps tables */
  probe__progress pg = {fn, user, PROBE_PROGRESS_COMPARING, 0, 0, 0};
  pg.total = (uint64_t)ia->n_records + (uint64_t)ib->n_records +
             (uint64_t)ia->n_steps + (uint64_t)ib->n_steps;
  state s;
  cursor ca, cb;
  memset(&ca, 0, sizeof ca);
  memset(&cb, 0, sizeof cb);
  st = stage_state(&s, d, a, b);
  /* a trace not closed (a killed run) that ends before the other: what it
   * lacks is not "in agreement" (a killed candidate passed a diff gate) */
  if (st == PROBE_OK) {
    s.stopped = !ia->complete && ia->last_step < ib->last_step   ? 'A'
                : !ib->complete && ib->last_step < ia->last_step ? 'B'
                                                                 : 0;
    s.stopped_last = s.stopped == 'A' ? ia->last_step : ib->last_step;
    s.other_last = s.stopped == 'A' ? ib->last_step : ia->last_step;
    const char *why = s.stopped == 'A' ? ia->aborted : ib->aborted;
    probe_text_escape(s.stopped_why, sizeof s.stopped_why,
                      s.stopped && why ? why : "");
    char how[320];
    if (s.stopped)
      note(d, "%c %s and ends at step %lld, %c at %lld", s.stopped,
           stopped_how(&s, how, sizeof how), (long long)s.stopped_last,
           s.stopped == 'A' ? 'B' : 'A', (long long)s.other_last);
  }
  if (st == PROBE_OK && (cursor_init(&ca, a, d->opt.chunk_rows, &pg) != PROBE_OK ||
                         cursor_init(&cb, b, d->opt.chunk_rows, &pg) != PROBE_OK))
    st = PROBE_ERR_NOMEM;
  if (st == PROBE_OK)
    st = probe__progress_add(&pg, 0); /* 0 of total: under way */
  if (st == PROBE_OK) {
    st = stage_align_layers(&s);                    /* stage 3 */
    if (st == PROBE_OK)
      st = stage_records(&s, &ca, &cb);             /* stage 4 */
  }
  if (st == PROBE_OK)                               /* stage 5 */
    st = compare_losses(d, a, b, d->opt.chunk_rows, &pg);
  if (st == PROBE_OK) {
    stage_scaler_notes(d);                          /* stage 6 */
    stage_verdict(&s);                              /* stage 7 */
    if (pg.done < pg.total) { /* rows the info counted and no read gave */
      pg.done = pg.total;
      st = probe__progress_add(&pg, 0);
    }
  }
  cursor_free(&ca);
  cursor_free(&cb);
  state_free(&s);
  return st;
}

void probe_diff_free(probe_diff *d) {
  if (!d)
    return;
  free(d->entries);
  d->entries = NULL;
  for (size_t i = 0; i < d->n_config_diff; i++) {
    free(d->config_diff[i].a);
    free(d->config_diff[i].b);
  }
  free(d->config_diff);
  d->config_diff = NULL;
  d->n_config_diff = 0;
}

/* ---- JSON ---------------------------------------------------------------- */

static void point_json(probe__jw *w, const char *key, const probe_diff_point *p) {
  if (!p->found) {
    probe__jw_null(w, key);
    return;
  }
  probe__jw_obj(w, key);
  probe__jw_int(w, "step", p->step);
  probe__jw_str(w, "layer", p->layer);
  probe__jw_str(w, "site", probe_site_name((probe_site)p->site));
  probe__jw_int(w, "seq", p->seq);
  probe__jw_num(w, "rel", p->rel);
  probe__jw_bool(w, "local", p->local);
  probe__jw_bool(w, "nonfinite", p->nonfinite != 0);
  if (p->nonfinite)
    probe__jw_str(w, "nonfinite_side", p->nonfinite == 2 ? "b" : "a");
  else
    probe__jw_null(w, "nonfinite_side");
  probe__jw_opt(w, "zero_frac_a", p->zero_a);
  probe__jw_opt(w, "zero_frac_b", p->zero_b);
  probe__jw_end(w, '}');
}

static const char *verdict_name(probe_diff_verdict v) {
  return v == PROBE_DIFF_AGREE ? "agree"
         : v == PROBE_DIFF_DIVERGE ? "diverge"
                                   : "not-aligned";
}

static void num_if(probe__jw *w, const char *key, double v, int have) {
  if (have)
    probe__jw_num(w, key, v);
  else
    probe__jw_null(w, key);
}

static void frac_or_null(probe__jw *w, const char *key, uint64_t a, uint64_t n) {
  if (n)
    probe__jw_num(w, key, (double)a / (double)n);
  else
    probe__jw_null(w, key);
}

probe_status probe_diff_json(const probe_diff *d, const char *trace_a,
                             const char *trace_b, char **out) {
  if (!d || !out) {
    probe__trace_open_msg("probe_diff_json: NULL %s", !d ? "diff" : "out");
    return PROBE_ERR_INVALID_ARG;
  }
  probe__jw jw, *w = &jw;
  probe__jw_init(w);
  char esc[1024];
  probe__jw_obj(w, NULL);
  probe__jw_str(w, "verdict", verdict_name(d->verdict));
  probe__jw_str(w, "summary", d->verdict_text);
  if (trace_a) {
    probe_text_escape(esc, sizeof esc, trace_a);
    probe__jw_str(w, "trace_a", esc);
  }
  if (trace_b) {
    probe_text_escape(esc, sizeof esc, trace_b);
    probe__jw_str(w, "trace_b", esc);
  }
  probe__jw_num(w, "threshold", d->opt.threshold);
  probe__jw_num(w, "threshold_used", d->threshold_used);
  probe__jw_str(w, "threshold_format",
                format_name(d->threshold_format));
  probe__jw_int(w, "zero_underflow_records", d->zero_underflow_records);
  probe__jw_int(w, "zero_rounding_records", d->zero_rounding_records);
  probe__jw_int(w, "window", d->opt.window);

  probe__jw_obj(w, "alignment");
  probe__jw_int(w, "layers_a", d->n_layers_a);
  probe__jw_int(w, "layers_b", d->n_layers_b);
  probe__jw_int(w, "layers_common", d->n_layers_common);
  probe__jw_str(w, "only_in_a", d->only_a);
  probe__jw_str(w, "only_in_b", d->only_b);
  probe__jw_int(w, "steps_a", d->steps_a);
  probe__jw_int(w, "steps_b", d->steps_b);
  probe__jw_int(w, "steps_common", d->steps_common);
  probe__jw_step(w, "first_common_step", d->first_common_step);
  probe__jw_step(w, "last_common_step", d->last_common_step);
  probe__jw_int(w, "records_unmatched", d->records_unmatched);
  probe__jw_int(w, "scaler_overflow_records", d->scaler_overflow_records);
  probe__jw_int(w, "trailing_skipped_steps_a", d->trailing_skips_a);
  probe__jw_int(w, "trailing_skipped_steps_b", d->trailing_skips_b);
  probe__jw_str(w, "policy_a", d->policy_a);
  probe__jw_str(w, "policy_b", d->policy_b);
  probe__jw_arr(w, "config_differences");
  for (size_t i = 0; i < d->n_config_diff; i++) {
    probe__jw_obj(w, NULL);
    probe__jw_str(w, "key", d->config_diff[i].key);
    probe__jw_raw(w, "a", d->config_diff[i].a);
    probe__jw_raw(w, "b", d->config_diff[i].b);
    probe__jw_end(w, '}');
  }
  probe__jw_end(w, ']');
  probe__jw_bool(w, "config_differs_beyond_policy", d->config_other);
  probe__jw_bool(w, "config_compared", d->config_compared);
  probe__jw_arr(w, "notes");
  for (int i = 0; i < d->n_notes; i++)
    probe__jw_str(w, NULL, d->notes[i]);
  probe__jw_end(w, ']');
  probe__jw_end(w, '}');

  probe__jw_obj(w, "divergence");
  probe__jw_step(w, "first_step", d->first_div_step);
  point_json(w, "introduction_point", &d->intro);
  point_json(w, "first_diverging_record", &d->first_div);
  point_json(w, "first_nonfinite_a", &d->first_nonfinite_a);
  point_json(w, "first_nonfinite_b", &d->first_nonfinite_b);
  probe__jw_end(w, '}');

  probe__jw_obj(w, "loss");
  probe__jw_int(w, "steps_compared", d->loss_steps);
  probe__jw_step(w, "part_step", d->loss_part_step);
  if (d->loss_part_step >= 0) {
    probe__jw_num(w, "loss_a_at_part", d->loss_a_at_part);
    probe__jw_num(w, "loss_b_at_part", d->loss_b_at_part);
  } else {
    probe__jw_null(w, "loss_a_at_part");
    probe__jw_null(w, "loss_b_at_part");
  }
  probe__jw_opt(w, "max_rel", d->max_loss_rel);
  if (d->loss_steps > 0) {
    probe__jw_num(w, "final_loss_a", d->final_loss_a);
    probe__jw_num(w, "final_loss_b", d->final_loss_b);
  } else {
    probe__jw_null(w, "final_loss_a");
    probe__jw_null(w, "final_loss_b");
  }
  probe__jw_opt(w, "final_rel", d->final_loss_rel);
  probe__jw_step(w, "first_nonfinite_a", d->first_nonfinite_loss_a);
  probe__jw_step(w, "first_nonfinite_b", d->first_nonfinite_loss_b);
  probe__jw_end(w, '}');

  probe__jw_arr(w, "layers");
  for (size_t i = 0; i < d->n_entries; i++) {
    const probe_diff_entry *e = &d->entries[i];
    probe__jw_obj(w, NULL);
    probe__jw_str(w, "layer", e->layer);
    probe__jw_str(w, "kind", probe_kind_name((probe_kind)e->kind));
    probe__jw_str(w, "site", probe_site_name((probe_site)e->site));
    probe__jw_str(w, "precision_a", probe_dtype_name((probe_dtype)e->prec_a));
    probe__jw_str(w, "precision_b", probe_dtype_name((probe_dtype)e->prec_b));
    probe__jw_int(w, "steps", e->steps);
    probe__jw_int(w, "steps_left_out", e->steps_left_out);
    int cmp = e->steps > e->steps_left_out; /* else nothing compared: null */
    num_if(w, "max_rel_absmax", e->max_rel_absmax, cmp);
    num_if(w, "max_rel_rms", e->max_rel_rms, cmp);
    num_if(w, "max_rel_l2", e->max_rel_l2, cmp);
    probe__jw_step(w, "max_rel_step", e->max_rel_step);
    num_if(w, "mean_rel_rms", e->mean_rel_rms, cmp);
    num_if(w, "max_window_rel", e->max_window_rel, cmp);
    probe__jw_step(w, "first_exceed_step", e->first_exceed_step);
    probe__jw_step(w, "first_divergence_step", e->first_div_step);
    if (e->first_div_step >= 0)
      probe__jw_num(w, "first_divergence_rel", e->first_div_rel);
    else
      probe__jw_null(w, "first_divergence_rel");
    probe__jw_step(w, "first_nonfinite_a", e->first_nonfinite_a);
    probe__jw_step(w, "first_nonfinite_b", e->first_nonfinite_b);
    probe__jw_int(w, "local_steps", e->local_steps);
    probe__jw_int(w, "carried_steps", e->carried_steps);
    frac_or_null(w, "zero_frac_a", e->zero_a, e->count_a);
    frac_or_null(w, "zero_frac_b", e->zero_b, e->count_b);
    probe__jw_bool(w, "flushes_to_zero", e->flushes_to_zero);
    probe__jw_end(w, '}');
  }
  probe__jw_end(w, ']');
  probe__jw_end(w, '}');
  *out = probe__jw_finish(w);
  return *out ? PROBE_OK : PROBE_ERR_NOMEM;
}
