/*
 * reports/report.c - the HTML report builder behind `ampprobe report`.
 *
 * A probe_report is fed a trace in chunks and reduces it as it goes:
 *   - step scalars into probe_bins (min/max per pixel column) for the loss,
 *     the baseline's loss, the loss scale, the gradient norm, the clip
 *     threshold and the clip coefficient; skipped steps and clipped steps
 *     into bins of their own (one marker per column that has any);
 *   - scaler events into bins per kind (backoff, growth, minimum clamp);
 *   - per-layer records into two layers x steps grids: FP16 headroom
 *     log2(65504/absmax) (a cell keeps the smallest, the worst) and the
 *     fraction of gradient values that are subnormal or flush to zero in
 *     FP16 (a cell keeps the largest).
 * Memory is fixed by the plot width and the layer count. probe_report_write
 * then draws everything as inline SVG into one HTML page with inline CSS:
 * nothing is loaded from anywhere else.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ampprobe/analysis.h" /* probe_text_escape */
#include "ampprobe/report.h"

#define REPORT_MAX_META 24
#define REPORT_MAX_SECTIONS 24

/* Site names without linking libprobe (reports/ depends on kernels/ only). */
static const char *const site_names[] = {
#define SITE_NAME_(name, str, phase) str,
    PROBE_SITE_MAP(SITE_NAME_)
#undef SITE_NAME_
};

/* A name read from a trace as shown on the page: escaped by
 * probe_text_escape (ampprobe/analysis.h) as on the terminal, so a newline
 * cannot start a line of its own in preformatted text and both outputs
 * read the same. */
static void escape_name(char *dst, size_t n, const char *name) {
  probe_text_escape(dst, n, name);
}

static const char *site_str(int s) {
  return s >= 0 && s < PROBE_SITE_COUNT ? site_names[s] : "?";
}

/* Per layer: where its records first held inf/NaN, and which of its sites
 * were non-finite or finite at that step, to tell whether the layer made
 * the inf/NaN (born there) or received it (passed on to it). */
typedef struct layer_nonfinite {
  int64_t step;         /* first step with a non-finite record; -1: none */
  int first_site;       /* the first such record's site, execution order */
  int64_t first_seq;    /* and its sequence number within the trace */
  uint32_t nf_sites;    /* bit per site non-finite at that step */
  uint32_t fin_sites;   /* bit per site finite at that step */
  int64_t n_records;    /* non-finite records over the whole trace */
  int64_t cur_step;     /* before the first: the step being read */
  uint32_t cur_fin;     /* ... and its sites seen finite so far */
} layer_nonfinite;

typedef struct report_section {
  probe_report_place at;
  char *title;
  char *body;     /* preformatted text, may be NULL */
  int folded;     /* body inside a closed <details> */
  int ncols;      /* 0: no table */
  char **headers; /* (ncols) */
  char **cells;   /* (nrows, ncols) */
  size_t nrows, cap_rows;
} report_section;

struct probe_report {
  probe_report_options opt;
  char *title;
  int n_meta;
  char *meta_key[REPORT_MAX_META], *meta_val[REPORT_MAX_META];
  probe_report_verdict verdict;
  char *headline, *diag_body;

  probe_layer_info *layers;
  size_t n_layers;
  /* The grids hold a row per layer with a record only, in the order of
   * their first record (a row per registered layer took 2.7 GB for a trace
   * of 2^20 layers, 9 of them recorded): row_of (n_layers, -1 none) and its
   * inverse layer_of_row (cap_rows). */
  int32_t *row_of, *layer_of_row;
  int n_rows, cap_rows;

  int have_range;
  int64_t x0, x1;
  int ready; /* bins and grids allocated */
  int plot_cols;
  probe_bins loss, base_loss, scale, gnorm, clip_thr, clip_coef;
  probe_bins skipped, clipped, backoff, growth, clamp;
  probe_grid headroom, underflow;
  unsigned formats; /* formats of the layers with records: FMT_* bits */
  layer_nonfinite *lnf; /* (n_layers) */
  int64_t n_skipped, n_clipped, n_backoff, n_growth, n_clamp, n_hysteresis;
  int have_clip;      /* some step had clipping on */
  int64_t n_gnorm_finite;   /* steps with a finite gradient norm */
  int64_t n_gnorm_unmeasured; /* steps whose norm was not measured */
  int64_t n_clip_nonfinite; /* clipping on, norm inf/NaN: no coefficient */
  int64_t n_clip_finite;    /* clipping on, finite norm: a coefficient */
  int64_t n_clip_unmeasured; /* clipping on, norm not measured */
  int have_scaling;   /* some step had a scale other than 1 */
  int scaling_set;    /* probe_report_set_scaling was called: */
  int scaling_on;     /* ... its answer replaces have_scaling */
  int64_t part_step;  /* -1 when not set */
  char *baseline_label;
  probe_rankmap *rankmap; /* a trace set's ranks x steps view, or NULL */
  char *rank_title, *rank_help;

  int n_sections;
  report_section sections[REPORT_MAX_SECTIONS];

  probe_report_counts counts;
};

/* Plot geometry: the data area is width - 84 - 24 pixels wide. */
#define REPORT_PLOT_MARGINS (84 + 24)

static char *dup_str(const char *s) {
  if (!s) return NULL;
  size_t n = strlen(s) + 1;
  char *p = malloc(n);
  if (p) memcpy(p, s, n);
  return p;
}

void probe_report_options_init(probe_report_options *o) {
  memset(o, 0, sizeof *o);
  o->title = "ampprobe report";
  o->width = 1200;
  o->heat_cols = 400;
}

probe_status probe_report_new(probe_report **out,
                              const probe_report_options *o) {
  *out = NULL;
  probe_report_options def;
  if (!o) {
    probe_report_options_init(&def);
    o = &def;
  }
  if (o->width < 400 || o->width > 10000 || o->heat_cols < 1 ||
      o->heat_cols > 10000)
    return PROBE_ERR_INVALID_ARG;
  probe_report *r = calloc(1, sizeof *r);
  if (!r) return PROBE_ERR_NOMEM;
  r->opt = *o;
  r->title = dup_str(o->title ? o->title : "ampprobe report");
  r->opt.title = NULL;
  r->part_step = -1;
  r->plot_cols = o->width - REPORT_PLOT_MARGINS;
  if (!r->title) {
    free(r);
    return PROBE_ERR_NOMEM;
  }
  *out = r;
  return PROBE_OK;
}

static void free_bins_grids(probe_report *r) {
  probe_bins *all[] = {&r->loss,    &r->base_loss, &r->scale,   &r->gnorm,
                       &r->clip_thr, &r->clip_coef, &r->skipped, &r->clipped,
                       &r->backoff, &r->growth,    &r->clamp};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) probe_bins_free(all[i]);
  probe_grid_free(&r->headroom);
  probe_grid_free(&r->underflow);
  free(r->lnf);
  free(r->row_of);
  free(r->layer_of_row);
  r->lnf = NULL;
  r->row_of = r->layer_of_row = NULL;
  r->n_rows = r->cap_rows = 0;
}

/* The grids' row of a layer with a record, given one at its first record
 * (the grids grown by doubling); -1 out of memory. */
static int grid_row(probe_report *r, int32_t layer) {
  if (r->row_of[layer] >= 0) return r->row_of[layer];
  if (r->n_rows == r->cap_rows) {
    int cap = r->cap_rows ? 2 * r->cap_rows : 16;
    if ((size_t)cap > r->n_layers) cap = (int)r->n_layers;
    int32_t *l = realloc(r->layer_of_row, (size_t)cap * sizeof *l);
    if (!l) return -1;
    r->layer_of_row = l;
    if (probe_grid_resize_rows(&r->headroom, cap) != PROBE_OK ||
        probe_grid_resize_rows(&r->underflow, cap) != PROBE_OK)
      return -1;
    r->cap_rows = cap;
  }
  r->layer_of_row[r->n_rows] = layer;
  r->row_of[layer] = r->n_rows;
  return r->n_rows++;
}

void probe_report_free(probe_report *r) {
  if (!r) return;
  free(r->title);
  for (int i = 0; i < r->n_meta; i++) {
    free(r->meta_key[i]);
    free(r->meta_val[i]);
  }
  free(r->headline);
  free(r->diag_body);
  free(r->layers);
  free(r->baseline_label);
  probe_rankmap_free(r->rankmap);
  free(r->rank_title);
  free(r->rank_help);
  free_bins_grids(r);
  for (int i = 0; i < r->n_sections; i++) {
    report_section *s = &r->sections[i];
    free(s->title);
    free(s->body);
    for (int c = 0; c < s->ncols; c++) free(s->headers[c]);
    free(s->headers);
    for (size_t k = 0; k < s->nrows * (size_t)s->ncols; k++) free(s->cells[k]);
    free(s->cells);
  }
  free(r);
}

probe_status probe_report_add_meta(probe_report *r, const char *key,
                                   const char *value) {
  if (!key) return PROBE_ERR_INVALID_ARG;
  if (r->n_meta >= REPORT_MAX_META) return PROBE_ERR_INVALID_ARG;
  char *k = dup_str(key), *v = dup_str(value ? value : "");
  if (!k || !v) {
    free(k);
    free(v);
    return PROBE_ERR_NOMEM;
  }
  r->meta_key[r->n_meta] = k;
  r->meta_val[r->n_meta] = v;
  r->n_meta++;
  return PROBE_OK;
}

probe_status probe_report_set_diagnosis(probe_report *r,
                                        probe_report_verdict v,
                                        const char *headline,
                                        const char *body) {
  free(r->headline);
  free(r->diag_body);
  r->verdict = v;
  r->headline = dup_str(headline ? headline : "");
  r->diag_body = dup_str(body);
  if (!r->headline || (body && !r->diag_body)) return PROBE_ERR_NOMEM;
  return PROBE_OK;
}

probe_status probe_report_set_layers(probe_report *r,
                                     const probe_layer_info *layers,
                                     size_t n) {
  if (r->ready) return PROBE_ERR_STATE;
  if (n && !layers) return PROBE_ERR_INVALID_ARG;
  free(r->layers);
  r->layers = NULL;
  r->n_layers = 0;
  if (n) {
    r->layers = malloc(n * sizeof *layers);
    if (!r->layers) return PROBE_ERR_NOMEM;
    memcpy(r->layers, layers, n * sizeof *layers);
    for (size_t i = 0; i < n; i++) r->layers[i].name[PROBE_NAME_MAX - 1] = '\0';
  }
  r->n_layers = n;
  return PROBE_OK;
}

probe_status probe_report_set_range(probe_report *r, int64_t first_step,
                                    int64_t last_step) {
  if (r->ready) return PROBE_ERR_STATE;
  if (last_step < first_step) return PROBE_ERR_INVALID_ARG;
  r->x0 = first_step;
  r->x1 = last_step;
  r->have_range = 1;
  return PROBE_OK;
}

/* Allocates the reductions on the first data call. */
static probe_status ensure_ready(probe_report *r) {
  if (r->ready) return PROBE_OK;
  if (!r->have_range) return PROBE_ERR_STATE;
  probe_bins *line[] = {&r->loss,    &r->base_loss, &r->scale,   &r->gnorm,
                        &r->clip_thr, &r->clip_coef, &r->skipped, &r->clipped,
                        &r->backoff, &r->growth,    &r->clamp};
  probe_status st = PROBE_OK;
  for (size_t i = 0; i < sizeof line / sizeof line[0] && st == PROBE_OK; i++)
    st = probe_bins_init(line[i], r->plot_cols, r->x0, r->x1);
  if (st == PROBE_OK && r->n_layers) {
    r->lnf = malloc(r->n_layers * sizeof *r->lnf);
    if (!r->lnf) st = PROBE_ERR_NOMEM;
    for (size_t i = 0; st == PROBE_OK && i < r->n_layers; i++)
      r->lnf[i] = (layer_nonfinite){-1, -1, -1, 0, 0, 0, -1, 0};
  }
  if (st == PROBE_OK && r->n_layers) {
    r->row_of = malloc(r->n_layers * sizeof *r->row_of);
    if (!r->row_of) st = PROBE_ERR_NOMEM;
    for (size_t i = 0; st == PROBE_OK && i < r->n_layers; i++) r->row_of[i] = -1;
    /* one row to start with; grid_row grows them */
    if (st == PROBE_OK)
      st = probe_grid_init(&r->headroom, 1, r->opt.heat_cols, r->x0, r->x1,
                           PROBE_GRID_MIN);
    if (st == PROBE_OK)
      st = probe_grid_init(&r->underflow, 1, r->opt.heat_cols, r->x0, r->x1,
                           PROBE_GRID_MAX);
    if (st == PROBE_OK && (r->layer_of_row = malloc(sizeof *r->layer_of_row)))
      r->cap_rows = 1;
    else if (st == PROBE_OK)
      st = PROBE_ERR_NOMEM;
  }
  if (st != PROBE_OK) {
    free_bins_grids(r);
    return st;
  }
  r->ready = 1;
  return PROBE_OK;
}

probe_status probe_report_add_steps(probe_report *r,
                                    const probe_step_scalars *s, size_t n) {
  probe_status st = ensure_ready(r);
  if (st != PROBE_OK) return st;
  for (size_t i = 0; i < n; i++) {
    const probe_step_scalars *p = &s[i];
    probe_bins_add(&r->loss, p->step, p->loss);
    probe_bins_add(&r->scale, p->step, p->loss_scale);
    if (p->loss_scale != 1.0) r->have_scaling = 1;
    /* A scalar the trainer did not measure is stored as NaN with its bit in
     * `unmeasured` (libprobe); only a NaN without the bit is non-finite. */
#ifdef PROBE_SCALAR_GRAD_NORM
    int norm_measured = !(p->unmeasured & PROBE_SCALAR_GRAD_NORM);
    int clip_measured = !(p->unmeasured & PROBE_SCALAR_CLIP);
#else
    int norm_measured = 1, clip_measured = 1;
#endif
    if (norm_measured)
      probe_bins_add(&r->gnorm, p->step, p->grad_norm);
    else
      r->n_gnorm_unmeasured++;
    int norm_ok = norm_measured && isfinite(p->grad_norm);
    r->n_gnorm_finite += norm_ok;
    if (clip_measured && p->clip_threshold > 0) {
      r->have_clip = 1;
      probe_bins_add(&r->clip_thr, p->step, p->clip_threshold);
      /* min(1, threshold / norm) is only defined for a finite norm: the
       * coefficient stored for an inf/NaN norm (1, nothing applied since
       * the step was skipped) is not drawn as if it had been computed */
      if (norm_ok) {
        r->n_clip_finite++;
        probe_bins_add(&r->clip_coef, p->step, p->clip_coef);
        if (p->clip_coef < 1.0) {
          probe_bins_add(&r->clipped, p->step, p->clip_coef);
          r->n_clipped++;
        }
      } else if (!norm_measured) {
        r->n_clip_unmeasured++;
      } else {
        r->n_clip_nonfinite++;
      }
    }
    if (p->skipped) {
      probe_bins_add(&r->skipped, p->step, p->loss_scale);
      r->n_skipped++;
    }
  }
  r->counts.steps += (int64_t)n;
  return PROBE_OK;
}

probe_status probe_report_add_baseline_steps(probe_report *r,
                                             const probe_step_scalars *s,
                                             size_t n) {
  probe_status st = ensure_ready(r);
  if (st != PROBE_OK) return st;
  for (size_t i = 0; i < n; i++)
    probe_bins_add(&r->base_loss, s[i].step, s[i].loss);
  r->counts.baseline_steps += (int64_t)n;
  return PROBE_OK;
}

probe_status probe_report_add_scaler_events(probe_report *r,
                                            const probe_scaler_event *e,
                                            size_t n) {
  probe_status st = ensure_ready(r);
  if (st != PROBE_OK) return st;
  for (size_t i = 0; i < n; i++) {
    switch (e[i].kind) {
    case PROBE_SCALER_BACKOFF:
      probe_bins_add(&r->backoff, e[i].step, e[i].new_scale);
      r->n_backoff++;
      break;
    case PROBE_SCALER_GROWTH:
      probe_bins_add(&r->growth, e[i].step, e[i].new_scale);
      r->n_growth++;
      break;
    case PROBE_SCALER_MIN_CLAMP:
      probe_bins_add(&r->clamp, e[i].step, e[i].new_scale);
      r->n_clamp++;
      break;
    default:
      r->n_hysteresis++;
      break;
    }
  }
  r->counts.scaler_events += (int64_t)n;
  return PROBE_OK;
}

/* A layer's format: its largest finite value, the headroom of its
 * records is measured against (an FP16 ceiling on a BF16 layer painted a
 * healthy 1e5 red). */
enum { FMT_F16 = 1, FMT_BF16 = 2, FMT_F32 = 4 };

static unsigned fmt_bit(int32_t dtype) {
  return dtype == PROBE_DTYPE_F16 ? FMT_F16
         : dtype == PROBE_DTYPE_BF16 ? FMT_BF16
                                     : FMT_F32;
}

static double fmt_max(int32_t dtype) {
  return dtype == PROBE_DTYPE_F16 ? (double)PROBE_F16_MAX
         : dtype == PROBE_DTYPE_BF16 ? 3.3895313892515355e38
                                     : 3.4028234663852886e38;
}

/* log2(the format's maximum / absmax): +inf for an all-zero tensor, NaN
 * when nothing is finite */
static double fmt_headroom(int32_t dtype, const probe_stats *s) {
  double a = (double)s->absmax;
  if (isnan(a)) return NAN;
  if (a == 0) return INFINITY;
  return log2(fmt_max(dtype) / a);
}

static int is_grad_site(int32_t site) {
  return site == PROBE_SITE_GRAD_OUT || site == PROBE_SITE_GRAD_IN ||
         site == PROBE_SITE_WEIGHT_GRAD;
}

probe_status probe_report_add_records(probe_report *r, const probe_record *rec,
                                      size_t n) {
  probe_status st = ensure_ready(r);
  if (st != PROBE_OK) return st;
  for (size_t i = 0; i < n; i++) {
    const probe_record *p = &rec[i];
    if (p->layer < 0 || (size_t)p->layer >= r->n_layers) {
      r->counts.records_dropped++;
      continue;
    }
    const probe_stats *s = &p->stats;
    uint64_t bad = probe_stats_nonfinite(s);
    uint64_t finite = probe_stats_finite(s);
    /* headroom log2(max/absmax) in the layer's own format (FP16 65504,
     * BF16 3.39e38, FP32 3.40e38): +inf for all-zero tensors, NaN (no
     * value) when nothing is finite (the cell is then marked non-finite) */
    int32_t prec = r->layers[p->layer].precision;
    r->formats |= fmt_bit(prec);
    double h = fmt_headroom(prec, s);
    int row = grid_row(r, p->layer);
    if (row < 0) return PROBE_ERR_NOMEM;
    probe_grid_add(&r->headroom, row, p->step, h, bad > 0);
    /* the layers table's first inf/NaN, as the post-mortem takes them:
     * masked logits are none (probe_record_nonfinite); the plots show
     * every value as it is */
    layer_nonfinite *L = &r->lnf[p->layer];
    uint32_t bit = p->site >= 0 && p->site < 32 ? 1u << p->site : 0;
    bad = probe_record_nonfinite((probe_kind)r->layers[p->layer].kind,
                                 (probe_site)p->site, s) ? bad : 0;
    if (bad > 0) L->n_records++;
    if (L->step < 0) { /* nothing non-finite yet: the current step's sites */
      if (p->step != L->cur_step) {
        L->cur_step = p->step;
        L->cur_fin = 0;
      }
      if (bad > 0) {
        L->step = p->step;
        L->first_site = p->site;
        L->first_seq = p->seq;
        L->nf_sites = bit;
        L->fin_sites = L->cur_fin;
      } else {
        L->cur_fin |= bit;
      }
    } else if (L->step == p->step) {
      if (bad > 0) L->nf_sites |= bit;
      else L->fin_sites |= bit;
    }
    if (is_grad_site(p->site) && prec == PROBE_DTYPE_F16) {
      /* FP16 layers only: BF16 and FP32 reach down to 2^-126 */
      /* f16_subnormal counts every finite 0 < |x| < 2^-14, which includes
       * the values that flush to zero (|x| <= 2^-25) */
      double f = finite > 0 ? (double)s->f16_subnormal / (double)finite : NAN;
      probe_grid_add(&r->underflow, row, p->step, f,
                     probe_stats_nonfinite(s) > 0);
    }
  }
  r->counts.records += (int64_t)n;
  return PROBE_OK;
}

probe_status probe_report_set_scaling(probe_report *r, int on) {
  r->scaling_set = 1;
  r->scaling_on = on != 0;
  return PROBE_OK;
}

probe_status probe_report_set_part_step(probe_report *r, int64_t step) {
  r->part_step = step;
  return PROBE_OK;
}

probe_status probe_report_set_baseline_label(probe_report *r,
                                             const char *label) {
  free(r->baseline_label);
  r->baseline_label = dup_str(label);
  return label && !r->baseline_label ? PROBE_ERR_NOMEM : PROBE_OK;
}

probe_status probe_report_set_rankmap(probe_report *r, probe_rankmap *m,
                                      const char *title, const char *help) {
  if (!m) return PROBE_ERR_INVALID_ARG;
  probe_rankmap_free(r->rankmap);
  free(r->rank_title);
  free(r->rank_help);
  r->rankmap = m;
  r->rank_title = dup_str(title ? title : "Ranks x steps");
  r->rank_help = dup_str(help);
  return !r->rank_title || (help && !r->rank_help) ? PROBE_ERR_NOMEM
                                                   : PROBE_OK;
}

static report_section *new_section(probe_report *r, probe_report_place at,
                                   const char *title) {
  if (r->n_sections >= REPORT_MAX_SECTIONS) return NULL;
  report_section *s = &r->sections[r->n_sections];
  memset(s, 0, sizeof *s);
  s->at = at;
  s->title = dup_str(title ? title : "");
  if (!s->title) return NULL;
  r->n_sections++;
  return s;
}

probe_status probe_report_add_text(probe_report *r, probe_report_place at,
                                   const char *title, const char *body) {
  report_section *s = new_section(r, at, title);
  if (!s) return PROBE_ERR_NOMEM;
  s->body = dup_str(body);
  return body && !s->body ? PROBE_ERR_NOMEM : PROBE_OK;
}

probe_status probe_report_add_folded_text(probe_report *r,
                                          probe_report_place at,
                                          const char *title,
                                          const char *body) {
  probe_status st = probe_report_add_text(r, at, title, body);
  if (st == PROBE_OK) r->sections[r->n_sections - 1].folded = 1;
  return st;
}

probe_status probe_report_add_table(probe_report *r, probe_report_place at,
                                    const char *title, int ncols,
                                    const char *const *headers,
                                    int *table_id) {
  if (ncols <= 0 || ncols > 64 || !headers) return PROBE_ERR_INVALID_ARG;
  report_section *s = new_section(r, at, title);
  if (!s) return PROBE_ERR_NOMEM;
  s->headers = calloc((size_t)ncols, sizeof *s->headers);
  if (!s->headers) return PROBE_ERR_NOMEM;
  s->ncols = ncols;
  for (int c = 0; c < ncols; c++) {
    s->headers[c] = dup_str(headers[c] ? headers[c] : "");
    if (!s->headers[c]) return PROBE_ERR_NOMEM;
  }
  if (table_id) *table_id = r->n_sections - 1;
  return PROBE_OK;
}

probe_status probe_report_table_row(probe_report *r, int table_id,
                                    const char *const *cells) {
  if (table_id < 0 || table_id >= r->n_sections || !cells)
    return PROBE_ERR_INVALID_ARG;
  report_section *s = &r->sections[table_id];
  if (s->ncols == 0) return PROBE_ERR_INVALID_ARG;
  if (s->nrows == s->cap_rows) {
    size_t cap = s->cap_rows ? s->cap_rows * 2 : 16;
    char **p = realloc(s->cells, cap * (size_t)s->ncols * sizeof *p);
    if (!p) return PROBE_ERR_NOMEM;
    s->cells = p;
    s->cap_rows = cap;
  }
  char **row = s->cells + s->nrows * (size_t)s->ncols;
  for (int c = 0; c < s->ncols; c++) {
    row[c] = dup_str(cells[c] ? cells[c] : "");
    if (!row[c]) {
      while (c-- > 0) free(row[c]);
      return PROBE_ERR_NOMEM;
    }
  }
  s->nrows++;
  return PROBE_OK;
}

void probe_report_get_counts(const probe_report *r, probe_report_counts *c) {
  *c = r->counts;
}

/* ---- writing -------------------------------------------------------------- */

static const char *CSS =
    "body{font-family:sans-serif;margin:20px 28px;color:#222;"
    "background:#fafafa;max-width:1260px}"
    "h1{font-size:22px;margin:0 0 8px}"
    "h2{font-size:17px;margin:26px 0 6px;border-bottom:1px solid #ccc;"
    "padding-bottom:3px}"
    "h3{font-size:14.5px;margin:14px 0 4px}"
    "p.help{margin:2px 0 6px;font-size:13px;color:#444;max-width:1100px}"
    "table{border-collapse:collapse;font-size:13px;margin:4px 0 10px}"
    "th,td{border:1px solid #ccc;padding:3px 8px;text-align:left;"
    "vertical-align:top}"
    "th{background:#eee}"
    "table.meta td:first-child{font-weight:bold;background:#f0f0f0}"
    "pre{background:#fff;border:1px solid #ddd;padding:8px 10px;"
    "font-size:12.5px;white-space:pre-wrap;max-width:1180px}"
    "details{margin:4px 0 8px}summary{cursor:pointer;font-size:13.5px;"
    "color:#333}"
    ".verdict{padding:10px 14px;border-radius:4px;font-size:16px;"
    "font-weight:bold;margin:10px 0}"
    ".v0{background:#eee;border-left:6px solid #888}"
    ".v1{background:#e6f4e6;border-left:6px solid #2ca02c}"
    ".v2{background:#fdeaea;border-left:6px solid #d62728}"
    "svg{display:block;background:#fff;margin:4px 0 8px}"
    "svg text{font-family:sans-serif;font-size:12px;fill:#222}"
    "svg .pt{font-size:14px;font-weight:bold}"
    "svg .al{text-anchor:middle;font-size:12.5px}"
    "svg .yt text,svg .rl text{text-anchor:end}"
    "svg .rl text{font-family:monospace}"
    "svg .xt text,svg .cb{text-anchor:middle}"
    "svg .gr{stroke:#e4e4e4}"
    "svg .note{text-anchor:middle;fill:#888;font-size:14px}"
    "svg .rn{font-size:12px}";

static void put_escaped(probe_buf *o, const char *s) { probe_buf_escape(o, s); }

static void put_help(probe_buf *o, const char *text) {
  probe_buf_puts(o, "<p class=\"help\">");
  put_escaped(o, text);
  probe_buf_puts(o, "</p>\n");
}

static void put_sections(probe_buf *o, const probe_report *r,
                         probe_report_place at) {
  for (int i = 0; i < r->n_sections; i++) {
    const report_section *s = &r->sections[i];
    if (s->at != at) continue;
    if (s->folded) {
      probe_buf_puts(o, "<details><summary>");
      put_escaped(o, s->title[0] ? s->title : "details");
      probe_buf_puts(o, "</summary><pre>");
      put_escaped(o, s->body ? s->body : "");
      probe_buf_puts(o, "</pre></details>\n");
      continue;
    }
    if (s->title[0]) {
      probe_buf_puts(o, at == PROBE_REPORT_TOP ? "<h2>" : "<h3>");
      put_escaped(o, s->title);
      probe_buf_puts(o, at == PROBE_REPORT_TOP ? "</h2>\n" : "</h3>\n");
    }
    if (s->body) {
      probe_buf_puts(o, "<pre>");
      put_escaped(o, s->body);
      probe_buf_puts(o, "</pre>\n");
    }
    if (s->ncols) {
      probe_buf_puts(o, "<table><tr>");
      for (int c = 0; c < s->ncols; c++) {
        probe_buf_puts(o, "<th>");
        put_escaped(o, s->headers[c]);
        probe_buf_puts(o, "</th>");
      }
      probe_buf_puts(o, "</tr>\n");
      for (size_t k = 0; k < s->nrows; k++) {
        probe_buf_puts(o, "<tr>");
        for (int c = 0; c < s->ncols; c++) {
          probe_buf_puts(o, "<td>");
          put_escaped(o, s->cells[k * (size_t)s->ncols + c]);
          probe_buf_puts(o, "</td>");
        }
        probe_buf_puts(o, "</tr>\n");
      }
      if (s->nrows == 0)
        probe_buf_printf(o, "<tr><td colspan=\"%d\">(none)</td></tr>\n",
                         s->ncols);
      probe_buf_puts(o, "</table>\n");
    }
  }
}

static int has_sections(const probe_report *r, probe_report_place at) {
  for (int i = 0; i < r->n_sections; i++)
    if (r->sections[i].at == at) return 1;
  return 0;
}

/* Markers at the first step of every column of b that holds a value. */
static probe_status add_bin_markers(probe_plot *p, const probe_bins *b,
                                    probe_marker m, const char *color,
                                    const char *label, int at_bottom) {
  int64_t *x = malloc(((size_t)b->ncols + 1) * sizeof *x);
  double *y = malloc(((size_t)b->ncols + 1) * sizeof *y);
  if (!x || !y) {
    free(x);
    free(y);
    return PROBE_ERR_NOMEM;
  }
  size_t n = 0;
  for (int c = 0; c < b->ncols; c++) {
    const probe_bin *k = &b->bin[c];
    if (k->n == 0) continue;
    x[n] = k->first_x;
    y[n] = at_bottom ? 0 : k->first;
    n++;
  }
  probe_status st = probe_plot_add_markers(p, x, y, n, m, color, label);
  free(x);
  free(y);
  return st;
}

static probe_status render_plot(probe_buf *o, probe_plot *p) {
  probe_status st = probe_plot_render(p, o);
  probe_plot_free(p);
  return st;
}

static probe_status write_loss(probe_report *r, probe_buf *o) {
  probe_plot *p;
  probe_status st = probe_plot_new(&p, "Loss", r->opt.width, 330);
  if (st != PROBE_OK) return st;
  probe_plot_x_axis(p, "step", r->x0, r->x1);
  /* a loss that spans more than three decades (a blow-up that stays finite)
   * is drawn on a log axis, where the healthy part stays readable */
  double mn = INFINITY, mx = -INFINITY;
  const probe_bins *both[2] = {&r->loss, &r->base_loss};
  for (int k = 0; k < 2; k++)
    for (int c = 0; c < both[k]->ncols; c++)
      if (both[k]->bin[c].n) {
        mn = fmin(mn, both[k]->bin[c].min);
        mx = fmax(mx, both[k]->bin[c].max);
      }
  if (mn > 0 && mx / mn > 1000)
    probe_plot_y_axis(p, PROBE_AXIS_LOG10, "loss (unscaled, log10 axis)", NAN,
                      NAN);
  else
    probe_plot_y_axis(p, PROBE_AXIS_LINEAR, "loss (unscaled)", NAN, NAN);
  int base = r->counts.baseline_steps > 0;
  if (base)
    probe_plot_add_line(p, &r->base_loss, "#7f7f7f",
                        r->baseline_label ? r->baseline_label : "baseline",
                        "5 3", "#9467bd");
  probe_plot_add_line(p, &r->loss, "#1f77b4", "loss", NULL, "#d62728");
  if (base && r->part_step >= 0) {
    char label[96];
    snprintf(label, sizeof label, "curves part at step %lld",
             (long long)r->part_step);
    probe_plot_add_vline(p, r->part_step, "#ff7f0e", label, "3 3");
  }
  if (r->counts.steps == 0) probe_plot_set_note(p, "no steps recorded");
  return render_plot(o, p);
}

static probe_status write_scale(probe_report *r, probe_buf *o) {
  probe_plot *p;
  probe_status st = probe_plot_new(&p, "Loss scale", r->opt.width, 300);
  if (st != PROBE_OK) return st;
  probe_plot_x_axis(p, "step", r->x0, r->x1);
  probe_plot_y_axis(p, PROBE_AXIS_LOG2, "loss scale (log2 axis)", NAN, NAN);
  probe_plot_add_line(p, &r->scale, "#1f77b4", "loss scale", NULL, NULL);
  char label[96];
  snprintf(label, sizeof label, "backoff (%lld)", (long long)r->n_backoff);
  add_bin_markers(p, &r->backoff, PROBE_MARKER_TRIANGLE_DOWN, "#d62728",
                  label, 0);
  if (r->n_growth) {
    snprintf(label, sizeof label, "growth (%lld)", (long long)r->n_growth);
    add_bin_markers(p, &r->growth, PROBE_MARKER_TRIANGLE_UP, "#2ca02c", label,
                    0);
  }
  if (r->n_clamp) {
    snprintf(label, sizeof label, "at minimum scale (%lld)",
             (long long)r->n_clamp);
    add_bin_markers(p, &r->clamp, PROBE_MARKER_DIAMOND, "#8c564b", label, 0);
  }
  snprintf(label, sizeof label, "skipped step (%lld)", (long long)r->n_skipped);
  add_bin_markers(p, &r->skipped, PROBE_MARKER_TICK, "#ff7f0e", label, 1);
  if (r->counts.steps == 0) probe_plot_set_note(p, "no steps recorded");
  else if (r->scaling_set ? !r->scaling_on : !r->have_scaling)
    probe_plot_set_note(p, r->scaling_set
                               ? "loss scaling off"
                               : "loss scaling off (scale 1 throughout)");
  return render_plot(o, p);
}

static probe_status write_gnorm(probe_report *r, probe_buf *o) {
  probe_plot *p;
  probe_status st = probe_plot_new(&p, "Gradient norm before clipping",
                                   r->opt.width, 300);
  if (st != PROBE_OK) return st;
  probe_plot_x_axis(p, "step", r->x0, r->x1);
  probe_plot_y_axis(p, PROBE_AXIS_LOG10, "global L2 norm (log10 axis)", NAN,
                    NAN);
  char label[160];
  if (r->n_gnorm_unmeasured > 0 && r->n_gnorm_unmeasured < r->counts.steps)
    snprintf(label, sizeof label, "gradient norm (not measured at %lld step%s)",
             (long long)r->n_gnorm_unmeasured,
             r->n_gnorm_unmeasured > 1 ? "s" : "");
  else
    snprintf(label, sizeof label, "gradient norm");
  probe_plot_add_line(p, &r->gnorm, "#1f77b4", label, NULL, "#d62728");
  if (r->have_clip)
    probe_plot_add_line(p, &r->clip_thr, "#d62728", "clip threshold", "6 3",
                        NULL);
  if (r->counts.steps == 0)
    probe_plot_set_note(p, "no steps recorded");
  else if (r->n_gnorm_unmeasured == r->counts.steps)
    probe_plot_set_note(p, "gradient norm not measured in this run");
  else if (r->n_gnorm_finite == 0)
    probe_plot_set_note(p, "no finite gradient norm: it was inf or NaN at "
                           "every step it was measured (triangles on the "
                           "top edge)");
  st = render_plot(o, p);
  if (st != PROBE_OK || !r->have_clip) return st;

  st = probe_plot_new(&p, "Clip coefficient applied", r->opt.width, 220);
  if (st != PROBE_OK) return st;
  probe_plot_x_axis(p, "step", r->x0, r->x1);
  probe_plot_y_axis(p, PROBE_AXIS_LINEAR,
                    "min(1, threshold / norm)", 0.0, 1.05);
  if (r->n_clip_finite == 0) {
    /* nothing was computed: a flat line at 1 would say "never clipped" */
    probe_plot_set_note(p, r->n_clip_nonfinite > 0
                               ? "no finite gradient norm: no clip "
                                 "coefficient was computed at any step"
                               : "gradient norm not measured: no clip "
                                 "coefficient to show");
    return render_plot(o, p);
  }
  if (r->n_clip_nonfinite > 0)
    snprintf(label, sizeof label,
             "clip coefficient (none at %lld step%s with an inf/NaN norm)",
             (long long)r->n_clip_nonfinite, r->n_clip_nonfinite > 1 ? "s" : "");
  else
    snprintf(label, sizeof label, "clip coefficient");
  probe_plot_add_line(p, &r->clip_coef, "#9467bd", label, NULL, NULL);
  snprintf(label, sizeof label, "clipped step (%lld)", (long long)r->n_clipped);
  add_bin_markers(p, &r->clipped, PROBE_MARKER_TICK, "#ff7f0e", label, 1);
  return render_plot(o, p);
}

/* 1 when the grid has data and every cell with data held inf/NaN. */
static int grid_all_nonfinite(const probe_grid *g) {
  size_t n = (size_t)g->rows * (size_t)g->cols, data = 0;
  for (size_t i = 0; i < n; i++) {
    if (!g->count[i]) continue;
    if (!g->nonfinite[i]) return 0;
    data++;
  }
  return data > 0;
}

#define SITE_BIT(x) (1u << PROBE_SITE_##x)

/* Whether a layer made its first inf/NaN or received it, from the sites
 * that were non-finite and finite at its first non-finite step. */
static const char *nonfinite_story(const layer_nonfinite *L) {
  uint32_t nf = L->nf_sites, fin = L->fin_sites;
  if (nf & SITE_BIT(FWD_IN))
    return "passed on: its input was already inf/NaN";
  if (nf & SITE_BIT(WEIGHT))
    return "passed on: its weights were already inf/NaN";
  if (nf & (SITE_BIT(FWD_OUT) | SITE_BIT(FWD_SAVED)))
    return fin & SITE_BIT(FWD_IN)
               ? "born here: forward, from a finite input"
               : "born here: forward (no input recorded for this layer)";
  if (nf & SITE_BIT(GRAD_OUT))
    return "passed on: the gradient arriving at its output was inf/NaN";
  if (nf & (SITE_BIT(GRAD_IN) | SITE_BIT(WEIGHT_GRAD)))
    return fin & SITE_BIT(GRAD_OUT)
               ? "born here: backward, from a finite incoming gradient"
               : "born here: backward (no incoming gradient recorded)";
  if (nf & SITE_BIT(MASTER_WEIGHT))
    return "born here: the optimizer update made its weights inf/NaN";
  return "-";
}

/* The layers the heatmaps and their table show (their rows, in
 * registration order): those with a record, at most HEAT_ROWS_MAX - the
 * ones whose records held inf/NaN, then the least headroom. A page of a row
 * per registered layer grew 340 bytes a layer, recorded or not: 94 MB for
 * 2^20 layers of which 2 were recorded. */
#define HEAT_ROWS_MAX 1000

typedef struct row_rank {
  int row;
  int bad;        /* a cell held inf/NaN */
  int64_t first;  /* its first non-finite step and the seq there (bad
                     rows: the earliest, the layer first in the run
                     among them, stay) */
  int64_t seq;
  float least;    /* smallest headroom over its cells (NaN: none) */
} row_rank;

static int row_rank_cmp(const void *pa, const void *pb) {
  const row_rank *a = pa, *b = pb;
  if (a->bad != b->bad) return b->bad - a->bad;
  if (a->bad && a->first != b->first) return a->first < b->first ? -1 : 1;
  if (a->bad && a->seq != b->seq) return a->seq < b->seq ? -1 : 1;
  int na = isnan(a->least), nb = isnan(b->least);
  if (na != nb) return na - nb;
  if (!na && a->least != b->least) return a->least < b->least ? -1 : 1;
  return a->row - b->row;
}

static int int_cmp(const void *pa, const void *pb) {
  int a = *(const int *)pa, b = *(const int *)pb;
  return (a > b) - (a < b);
}

/* rows: r->n_rows entries (grid rows); returns how many are shown, in the
 * layers' registration order, and in *recorded how many layers have a
 * record. */
static size_t select_rows(const probe_report *r, int *rows, size_t *recorded,
                          row_rank *tmp) {
  const probe_grid *h = &r->headroom, *u = &r->underflow;
  size_t n = 0;
  for (int i = 0; i < r->n_rows; i++) {
    const layer_nonfinite *L = &r->lnf[r->layer_of_row[i]];
    row_rank k = {i, 0, L->step, L->first_seq, NAN};
    int any = 0;
    for (int c = 0; c < h->cols; c++) {
      size_t at = (size_t)i * (size_t)h->cols + (size_t)c;
      any |= h->count[at] > 0 || (u->count && u->count[at] > 0);
      k.bad |= h->nonfinite[at] > 0 || (u->nonfinite && u->nonfinite[at] > 0);
      if (!isnan(h->val[at]) && (isnan(k.least) || h->val[at] < k.least))
        k.least = h->val[at];
    }
    if (any) tmp[n++] = k;
  }
  *recorded = n;
  if (n > HEAT_ROWS_MAX) {
    qsort(tmp, n, sizeof *tmp, row_rank_cmp);
    n = HEAT_ROWS_MAX;
  }
  /* registration order: the layers in order, those whose row is shown */
  for (size_t i = 0; i < n; i++) rows[i] = tmp[i].row;
  qsort(rows, n, sizeof *rows, int_cmp); /* by row, then mapped to layers */
  size_t k = 0;
  for (size_t l = 0; l < r->n_layers && k < n; l++) {
    int row = r->row_of[l];
    if (row >= 0 && bsearch(&row, rows, n, sizeof *rows, int_cmp))
      tmp[k++].row = row;
  }
  for (size_t i = 0; i < n; i++) rows[i] = tmp[i].row;
  return n;
}

/* The grid of g's rows[0..n), in that order. */
static probe_status grid_rows(const probe_grid *g, const int *rows, size_t n,
                              probe_grid *out) {
  probe_status st = probe_grid_init(out, (int)n, g->cols, g->x0, g->x1, g->agg);
  if (st != PROBE_OK) return st;
  size_t w = (size_t)g->cols;
  for (size_t i = 0; i < n; i++) {
    size_t from = (size_t)rows[i] * w, to = i * w;
    memcpy(out->val + to, g->val + from, w * sizeof *g->val);
    memcpy(out->count + to, g->count + from, w * sizeof *g->count);
    memcpy(out->nonfinite + to, g->nonfinite + from, w * sizeof *g->nonfinite);
  }
  return PROBE_OK;
}

/* Per layer: the first step whose records held inf/NaN, the site, and
 * whether the layer made it or received it. */
static void write_nonfinite_table(const probe_report *r, const int *rows,
                                  size_t n_rows, probe_buf *o) {
  int64_t first = -1; /* the layer whose record was non-finite first */
  for (size_t i = 0; i < r->n_layers; i++) {
    const layer_nonfinite *L = &r->lnf[i];
    if (L->step < 0) continue;
    if (first < 0 || L->step < r->lnf[first].step ||
        (L->step == r->lnf[first].step && L->first_seq < r->lnf[first].first_seq))
      first = (int64_t)i;
  }
  if (first < 0) return;
  probe_buf_puts(o, "<h3>Where each layer first held inf/NaN</h3>\n");
  put_help(o, "Per layer (heatmap order): the first step at which any of "
              "its recorded tensors held inf or NaN, the first such site in "
              "execution order, and whether the layer made the inf/NaN "
              "(born here: its input or incoming gradient was finite) or "
              "received it (passed on). The layer whose record turned "
              "non-finite first in the run is marked.");
  probe_buf_puts(o, "<table id=\"nonfinite\"><tr><th>layer</th><th>first "
                    "non-finite step</th><th>site</th><th>there</th>"
                    "<th>non-finite records</th></tr>\n");
  for (size_t k = 0; k < n_rows; k++) {
    size_t i = (size_t)r->layer_of_row[rows[k]];
    const layer_nonfinite *L = &r->lnf[i];
    char label[PROBE_NAME_MAX * 4];
    escape_name(label, sizeof label, r->layers[i].name);
    probe_buf_puts(o, "<tr><td>");
    put_escaped(o, label);
    if (L->step < 0) {
      probe_buf_puts(o, "</td><td>never</td><td></td><td></td><td>0</td>"
                        "</tr>\n");
      continue;
    }
    probe_buf_printf(o, "</td><td>%lld%s</td><td>", (long long)L->step,
                     (int64_t)i == first ? " (first in the run)" : "");
    put_escaped(o, site_str(L->first_site));
    probe_buf_puts(o, "</td><td>");
    put_escaped(o, nonfinite_story(L));
    probe_buf_printf(o, "</td><td>%lld</td></tr>\n", (long long)L->n_records);
  }
  probe_buf_puts(o, "</table>\n");
}

static probe_status write_heatmaps(probe_report *r, probe_buf *o) {
  if (!r->n_layers || !r->headroom.val) {
    put_help(o, "This trace has no layers table, so there is nothing to "
                "draw per layer.");
    return PROBE_OK;
  }
  size_t nr = r->n_rows ? (size_t)r->n_rows : 1;
  const char **labels = malloc(nr * sizeof *labels);
  char (*names)[PROBE_NAME_MAX * 4] =
      malloc((nr < HEAT_ROWS_MAX ? nr : HEAT_ROWS_MAX) * sizeof *names);
  int *rows = malloc(nr * sizeof *rows);
  row_rank *tmp = malloc(nr * sizeof *tmp);
  probe_grid hg, ug;
  memset(&hg, 0, sizeof hg);
  memset(&ug, 0, sizeof ug);
  probe_status st = labels && names && rows && tmp ? PROBE_OK : PROBE_ERR_NOMEM;
  size_t recorded = 0, n = 0;
  if (st == PROBE_OK) n = select_rows(r, rows, &recorded, tmp);
  if (st == PROBE_OK && n == 0) {
    put_help(o, "No layer has a record in the steps shown: nothing to draw "
                "per layer.");
    goto done;
  }
  if (st == PROBE_OK) st = grid_rows(&r->headroom, rows, n, &hg);
  if (st == PROBE_OK) st = grid_rows(&r->underflow, rows, n, &ug);
  if (st != PROBE_OK) goto done;
  for (size_t i = 0; i < n; i++) {
    escape_name(names[i], sizeof names[i], r->layers[r->layer_of_row[rows[i]]].name);
    labels[i] = names[i];
  }
  int rh = n > 60 ? 11 : 14;

  probe_heatmap_opts h;
  memset(&h, 0, sizeof h);
  h.x_label = "step";
  h.row_labels = labels;
  h.width = r->opt.width;
  h.row_height = rh;
  h.empty_label = "no record";

  /* the formats of the layers with records: one named, or each its own */
  unsigned fm = r->formats ? r->formats : FMT_F16;
  unsigned red = fm & (FMT_F16 | FMT_BF16); /* the reduced formats */
  const char *fname = red == FMT_F16 ? "FP16" : red == FMT_BF16 ? "BF16"
                      : red == 0 ? "FP32" : NULL;
  const char *fmax = red == FMT_F16 ? "65504" : red == FMT_BF16 ? "3.39e38"
                     : "3.40e38";
  /* FP32 layers of an FP16 or BF16 run (the loss) against FP32's maximum */
  const char *f32_too = red && (fm & FMT_F32)
                            ? " (FP32 layers: against FP32's 3.40e38)" : "";
  char title[200], help[900];
  if (fname) {
    snprintf(title, sizeof title, "<h2>%s headroom per layer</h2>\n", fname);
    probe_buf_puts(o, title);
    snprintf(help, sizeof help,
             "Each row is a layer (in registration order), each column a range "
             "of steps. The colour is the smallest headroom log2(%s / absmax) "
             "over the layer's recorded tensors (all sites) in those steps: the "
             "number of doublings left before the largest value overflows %s, "
             "the layers' format%s. Red means close to overflow; at 0 the "
             "largest value is %s. Black cells held inf or NaN.",
             fmax, fname, f32_too, fmax);
    put_help(o, help);
    snprintf(title, sizeof title,
             "%s headroom: log2(%s / absmax)%s, worst tensor per cell", fname,
             fmax, f32_too);
  } else {
    probe_buf_puts(o, "<h2>Headroom per layer, in each layer's format</h2>\n");
    put_help(o,
             "Each row is a layer (in registration order), each column a range "
             "of steps. The colour is the smallest headroom log2(max / absmax) "
             "over the layer's recorded tensors (all sites) in those steps, "
             "where max is the largest finite value of the layer's own format "
             "(FP16 65504, BF16 3.39e38, FP32 3.40e38): the number of "
             "doublings left before the largest value overflows that format. "
             "Red means close to overflow. Black cells held inf or NaN.");
    snprintf(title, sizeof title,
             "Headroom in each layer's format: log2(max / absmax) (FP16 "
             "65504, BF16 3.39e38, FP32 3.40e38), worst tensor per cell");
  }
  h.title = title;
  h.value_label = "headroom [binades]";
  h.nonfinite_label = "inf/NaN in a tensor";
  h.cmap = (probe_colormap){6,
                            {0, 2, 4, 8, 14, 24},
                            {0xa50026, 0xf46d43, 0xfee090, 0xe0f3f8, 0x74add1,
                             0x313695}};
  if (n < r->n_layers) {
    char said[300];
    if (n < recorded)
      snprintf(said, sizeof said, "Shown: %zu of the %zu layers with records "
               "(those whose records held inf/NaN, then the least headroom; "
               "ampprobe postmortem --json has every layer)%s.", n, recorded,
               recorded < r->n_layers ? "; layers without records are left out"
                                      : "");
    else
      snprintf(said, sizeof said, "Shown: the %zu layers with records; the "
               "%zu registered layers without any are left out.", n,
               r->n_layers - n);
    put_help(o, said);
  }
  int all_bad = grid_all_nonfinite(&hg);
  h.note = all_bad ? "every record held inf/NaN: no headroom to show; see "
                     "the table below"
                   : NULL;
  st = probe_heatmap_render(&hg, &h, o);
  if (st == PROBE_OK) write_nonfinite_table(r, rows, n, o);
  if (st == PROBE_OK && !(fm & FMT_F16)) {
    probe_buf_puts(o, "<h2>FP16 underflow of gradients per layer</h2>\n");
    put_help(o, "No layer runs in FP16: BF16 and FP32 share FP32's exponent "
                "range (smallest normal 2^-126, about 1.2e-38), so FP16's "
                "underflow below 2^-14 does not apply; nothing to draw.");
  } else if (st == PROBE_OK) {
    probe_buf_puts(o, "<h2>FP16 underflow of gradients per layer</h2>\n");
    snprintf(help, sizeof help,
             "The colour is the largest fraction, over the layer's gradient "
             "tensors (gradient at the output, gradient to the input, weight "
             "gradient) in those steps, of finite values whose magnitude is "
             "below 2^-14: subnormal in FP16, or so small (at most 2^-25) "
             "that FP16 flushes them to zero. Values already stored as FP16 "
             "zeros are not counted. Grey rows have no gradient records%s.",
             fm != FMT_F16 ? ", or are BF16 or FP32 layers (whose range "
                             "reaches 2^-126: FP16's underflow does not "
                             "apply)" : "");
    put_help(o, help);
    h.title = "Fraction of gradient values subnormal or flushed to zero in "
              "FP16, worst tensor per cell";
    h.value_label = "fraction of finite values";
    h.nonfinite_label = "inf/NaN in a gradient";
    h.cmap = (probe_colormap){5,
                              {0, 0.05, 0.2, 0.5, 1},
                              {0xffffe5, 0xfee391, 0xfe9929, 0xcc4c02,
                               0x662506}};
    /* a fraction is within [0, 1]: no "<=" or "+" at the ends */
    static const char *const pct[5] = {"0%", "5%", "20%", "50%", "100%"};
    h.stop_labels = pct;
    h.note = grid_all_nonfinite(&ug)
                 ? "every gradient record held inf/NaN: no underflow "
                   "fraction to show; see the table above"
                 : NULL;
    st = probe_heatmap_render(&ug, &h, o);
  }
done:
  probe_grid_free(&hg);
  probe_grid_free(&ug);
  free(labels);
  free(names);
  free(rows);
  free(tmp);
  return st;
}

probe_status probe_report_write(probe_report *r, FILE *f) {
  if (!f) return PROBE_ERR_INVALID_ARG;
  if (!r->have_range) probe_report_set_range(r, 0, 0);
  probe_status st = ensure_ready(r);
  if (st != PROBE_OK) return st;
  probe_buf o;
  probe_buf_init(&o);

  probe_buf_puts(&o, PROBE_REPORT_HEAD "<title>");
  put_escaped(&o, r->title);
  probe_buf_printf(&o, "</title>\n<style>%s</style>\n</head>\n<body>\n<h1>",
                   CSS);
  put_escaped(&o, r->title);
  probe_buf_puts(&o, "</h1>\n");

  /* diagnosis first */
  probe_buf_printf(&o, "<div class=\"verdict v%d\" id=\"verdict\">",
                   (int)r->verdict);
  put_escaped(&o, r->headline ? r->headline : "no diagnosis available");
  probe_buf_puts(&o, "</div>\n");
  if (r->diag_body) {
    probe_buf_puts(&o, "<h2>Post-mortem diagnosis</h2>\n<pre id=\"diagnosis\">");
    put_escaped(&o, r->diag_body);
    probe_buf_puts(&o, "</pre>\n");
  }
  put_sections(&o, r, PROBE_REPORT_TOP);
  if (r->rankmap) {
    probe_buf_puts(&o, "<h2 id=\"ranks\">");
    put_escaped(&o, r->rank_title);
    probe_buf_puts(&o, "</h2>\n");
    if (r->rank_help) put_help(&o, r->rank_help);
    st = probe_rankmap_render(r->rankmap, "Ranks x steps: one row per rank",
                              r->opt.width, &o, NULL);
    put_sections(&o, r, PROBE_REPORT_RANKS);
  }

  if (r->n_meta) {
    probe_buf_puts(&o, "<h2>Trace</h2>\n<table class=\"meta\">\n");
    for (int i = 0; i < r->n_meta; i++) {
      probe_buf_puts(&o, "<tr><td>");
      put_escaped(&o, r->meta_key[i]);
      probe_buf_puts(&o, "</td><td>");
      put_escaped(&o, r->meta_val[i]);
      probe_buf_puts(&o, "</td></tr>\n");
    }
    probe_buf_puts(&o, "</table>\n");
  }

  probe_buf_puts(&o, "<h2>Training curves</h2>\n");
  put_help(&o,
           "Long traces are reduced to at most four points per pixel column "
           "(first, smallest, largest, last), so a spike in a single step is "
           "still drawn. Red triangles on the top edge mark steps whose value "
           "was inf or NaN.");
  if (st == PROBE_OK) st = write_loss(r, &o);
  if (st == PROBE_OK) st = write_scale(r, &o);
  if (st == PROBE_OK) st = write_gnorm(r, &o);
  if (st == PROBE_OK) st = write_heatmaps(r, &o);

  if (st == PROBE_OK && has_sections(r, PROBE_REPORT_DIFF)) {
    probe_buf_puts(&o, "<h2>Comparison with the baseline</h2>\n");
    put_sections(&o, r, PROBE_REPORT_DIFF);
  }
  if (st == PROBE_OK && has_sections(r, PROBE_REPORT_BISECT)) {
    probe_buf_puts(&o, "<h2>Bisect: modules to keep in FP32</h2>\n");
    put_sections(&o, r, PROBE_REPORT_BISECT);
  }
  if (st == PROBE_OK) put_sections(&o, r, PROBE_REPORT_END);
  probe_buf_printf(&o,
                   "<p class=\"help\">%lld steps, %lld layer records, %lld "
                   "scaler events",
                   (long long)r->counts.steps, (long long)r->counts.records,
                   (long long)r->counts.scaler_events);
  if (r->counts.baseline_steps)
    probe_buf_printf(&o, ", %lld baseline steps",
                     (long long)r->counts.baseline_steps);
  probe_buf_puts(&o, ". Written by ampprobe report.</p>\n</body></html>\n");

  if (st == PROBE_OK && o.oom) st = PROBE_ERR_NOMEM;
  if (st == PROBE_OK && fwrite(o.data, 1, o.len, f) != o.len) st = PROBE_ERR_IO;
  if (st == PROBE_OK && fflush(f) != 0) st = PROBE_ERR_IO;
  probe_buf_free(&o);
  return st;
}
