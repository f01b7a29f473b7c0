/*
 * reports/bins.c - the text buffer, the min/max-per-column reduction of long
 * series (probe_bins, "M4": first, min, max, last of each pixel column) and
 * the layers x steps grid (probe_grid) the heatmaps are drawn from.
 *
 * Both reductions are streaming: values are added one at a time, in any
 * number of chunks, and memory is fixed by the column count.
 */
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "ampprobe/analysis.h" /* probe_text_escape */
#include "ampprobe/report.h"
#include "svg-impl.h"

/* ---- probe_buf ------------------------------------------------------------ */

void probe_buf_init(probe_buf *b) { memset(b, 0, sizeof *b); }

void probe_buf_free(probe_buf *b) {
  free(b->data);
  memset(b, 0, sizeof *b);
}

static int buf_reserve(probe_buf *b, size_t extra) {
  if (b->oom) return 0;
  if (b->len + extra + 1 <= b->cap) return 1;
  size_t cap = b->cap ? b->cap : 4096;
  while (cap < b->len + extra + 1) cap *= 2;
  char *p = realloc(b->data, cap);
  if (!p) {
    b->oom = 1;
    return 0;
  }
  b->data = p;
  b->cap = cap;
  return 1;
}

probe_status probe_buf_append(probe_buf *b, const char *s, size_t n) {
  if (!buf_reserve(b, n)) return PROBE_ERR_NOMEM;
  memcpy(b->data + b->len, s, n);
  b->len += n;
  b->data[b->len] = '\0';
  return PROBE_OK;
}

probe_status probe_buf_puts(probe_buf *b, const char *s) {
  return probe_buf_append(b, s, strlen(s));
}

probe_status probe_buf_printf(probe_buf *b, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  char small[256];
  int n = vsnprintf(small, sizeof small, fmt, ap);
  va_end(ap);
  if (n < 0) return PROBE_ERR_INVALID_ARG;
  if ((size_t)n < sizeof small) return probe_buf_append(b, small, (size_t)n);
  if (!buf_reserve(b, (size_t)n)) return PROBE_ERR_NOMEM;
  va_start(ap, fmt);
  vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
  va_end(ap);
  b->len += (size_t)n;
  return PROBE_OK;
}

/* Length of the valid UTF-8 sequence at s (1..4), or 0 when invalid. */
static size_t utf8_len(const unsigned char *s) {
  if (s[0] < 0x80) return 1;
  size_t n;
  uint32_t cp;
  if ((s[0] & 0xE0) == 0xC0) { n = 2; cp = s[0] & 0x1F; }
  else if ((s[0] & 0xF0) == 0xE0) { n = 3; cp = s[0] & 0x0F; }
  else if ((s[0] & 0xF8) == 0xF0) { n = 4; cp = s[0] & 0x07; }
  else return 0;
  for (size_t i = 1; i < n; i++) {
    if ((s[i] & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (s[i] & 0x3F);
  }
  static const uint32_t min_cp[5] = {0, 0, 0x80, 0x800, 0x10000};
  if (cp < min_cp[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
    return 0;
  if (cp == 0xFFFE || cp == 0xFFFF) return 0;
  return n;
}

probe_status probe_buf_escape(probe_buf *b, const char *s) {
  if (!s) return PROBE_OK;
  const unsigned char *p = (const unsigned char *)s;
  probe_status st = PROBE_OK;
  while (*p && st == PROBE_OK) {
    const unsigned char *run = p;
    /* copy plain runs in one go */
    while (*p && *p >= 0x20 && *p < 0x7f && *p != '&' && *p != '<' &&
           *p != '>' && *p != '"' && *p != '\'')
      p++;
    if (p > run) st = probe_buf_append(b, (const char *)run, (size_t)(p - run));
    if (!*p || st != PROBE_OK) break;
    switch (*p) {
    case '&': st = probe_buf_puts(b, "&amp;"); p++; continue;
    case '<': st = probe_buf_puts(b, "&lt;"); p++; continue;
    case '>': st = probe_buf_puts(b, "&gt;"); p++; continue;
    case '"': st = probe_buf_puts(b, "&quot;"); p++; continue;
    case '\'': st = probe_buf_puts(b, "&#39;"); p++; continue;
    case '\n': case '\t': case '\r':
      st = probe_buf_append(b, (const char *)p, 1); p++; continue;
    default: break;
    }
    /* a control character (C0 but newline, tab, CR; DEL; C1 U+0080..
     * U+009F; a bidi control such as U+202E, which reorders the text after
     * it) or a byte that is not UTF-8: shown as on the terminal, by the
     * project's one escaping (\e, \x7f, \u009b, \u202e, \xHH:
     * probe_text_escape, asked unit by unit), never raw (C0 is not allowed
     * in XML 1.0; DEL, C1 and bidi controls are controls) */
    size_t n = *p < 0x80 ? 1 : utf8_len(p);
    char unit[5] = {0}, e[16];
    memcpy(unit, p, n ? n : 1);
    if (probe_text_escape(e, sizeof e, unit) != (n ? n : 1)) {
      st = probe_buf_puts(b, e);
      p += n ? n : 1;
    } else {
      st = probe_buf_append(b, (const char *)p, n);
      p += n;
    }
  }
  return b->oom ? PROBE_ERR_NOMEM : st;
}

/* ---- steps onto columns (svg-impl.h) ------------------------------------- */

/* x1 - x0 as unsigned: exact for any x0 <= x1 (the difference of two int64
 * is below 2^64; in int64 it overflows). */
static uint64_t step_diff(int64_t x0, int64_t x1) {
  return (uint64_t)x1 - (uint64_t)x0;
}

double probe__span(int64_t x0, int64_t x1) {
  return (double)step_diff(x0, x1) + 1.0;
}

int probe__cols_for(int ncols, int64_t x0, int64_t x1) {
  uint64_t d = step_diff(x0, x1); /* steps - 1 */
  return d < (uint64_t)ncols ? (int)(d + 1) : ncols;
}

int probe__col_of(int64_t x, int64_t x0, int64_t x1, int ncols) {
  if (ncols <= 1 || x <= x0) return 0;
  if (x >= x1) return ncols - 1;
  uint64_t d = step_diff(x0, x), w = step_diff(x0, x1) + 1; /* w 0: 2^64 */
  uint64_t c;
  if (w != 0 && d <= UINT64_MAX / (uint64_t)ncols) {
    c = d * (uint64_t)ncols / w;
  } else { /* past 2^64 / ncols steps: a column is then > 2^32 steps, and
            * the double moves it by one at most */
    double f = (double)d / (w ? (double)w : 18446744073709551616.0) * ncols;
    c = f >= (double)ncols ? (uint64_t)ncols : (uint64_t)f;
  }
  return c >= (uint64_t)ncols ? ncols - 1 : (int)c;
}

int64_t probe__step_at(int64_t x0, int64_t x1, double off) {
  uint64_t w = step_diff(x0, x1);
  if (!(off > 0)) return x0;
  if (off >= (double)w) return x1;
  return (int64_t)((uint64_t)x0 + (uint64_t)off); /* <= x1: fits */
}

int64_t probe__step_of(double v) {
  if (isnan(v)) return 0;
  if (v >= 9223372036854775807.0) return INT64_MAX; /* 2^63 */
  if (v <= -9223372036854775808.0) return INT64_MIN;
  return (int64_t)v;
}

/* ---- probe_bins ----------------------------------------------------------- */

probe_status probe_bins_init(probe_bins *b, int ncols, int64_t x0,
                             int64_t x1) {
  memset(b, 0, sizeof *b);
  if (ncols <= 0 || x1 < x0) return PROBE_ERR_INVALID_ARG;
  /* never more columns than steps: each step then has its own column */
  ncols = probe__cols_for(ncols, x0, x1);
  b->bin = calloc((size_t)ncols, sizeof *b->bin);
  if (!b->bin) return PROBE_ERR_NOMEM;
  b->ncols = ncols;
  b->x0 = x0;
  b->x1 = x1;
  return PROBE_OK;
}

void probe_bins_free(probe_bins *b) {
  free(b->bin);
  memset(b, 0, sizeof *b);
}

int probe_bins_col(const probe_bins *b, int64_t x) {
  return probe__col_of(x, b->x0, b->x1, b->ncols);
}

void probe_bins_add(probe_bins *b, int64_t x, double y) {
  if (!b->bin) return;
  probe_bin *c = &b->bin[probe_bins_col(b, x)];
  if (isnan(y)) { c->n_nan++; return; }
  if (isinf(y)) { c->n_inf++; return; }
  if (c->n == 0) {
    c->first = c->last = c->min = c->max = y;
    c->first_x = c->last_x = c->min_x = c->max_x = x;
  } else {
    c->last = y;
    c->last_x = x;
    if (y < c->min) { c->min = y; c->min_x = x; }
    if (y > c->max) { c->max = y; c->max_x = x; }
  }
  c->n++;
}

size_t probe_bins_points(const probe_bins *b, int64_t *xs, double *ys,
                         size_t max) {
  size_t k = 0;
  for (int i = 0; i < b->ncols; i++) {
    const probe_bin *c = &b->bin[i];
    if (c->n == 0) continue;
    int64_t px[4];
    double py[4];
    px[0] = c->first_x; py[0] = c->first;
    if (c->min_x <= c->max_x) {
      px[1] = c->min_x; py[1] = c->min;
      px[2] = c->max_x; py[2] = c->max;
    } else {
      px[1] = c->max_x; py[1] = c->max;
      px[2] = c->min_x; py[2] = c->min;
    }
    px[3] = c->last_x; py[3] = c->last;
    for (int j = 0; j < 4; j++) {
      /* drop a point equal to the one before (same step, same value) */
      if (k > 0 && xs[k - 1] == px[j] && ys[k - 1] == py[j]) continue;
      if (k >= max) return k;
      xs[k] = px[j];
      ys[k] = py[j];
      k++;
    }
  }
  return k;
}

/* ---- probe_grid ----------------------------------------------------------- */

probe_status probe_grid_init(probe_grid *g, int rows, int cols, int64_t x0,
                             int64_t x1, probe_grid_agg agg) {
  memset(g, 0, sizeof *g);
  if (rows <= 0 || cols <= 0 || x1 < x0) return PROBE_ERR_INVALID_ARG;
  cols = probe__cols_for(cols, x0, x1);
  size_t n = (size_t)rows * (size_t)cols;
  g->val = malloc(n * sizeof *g->val);
  g->count = calloc(n, sizeof *g->count);
  g->nonfinite = calloc(n, sizeof *g->nonfinite);
  if (!g->val || !g->count || !g->nonfinite) {
    probe_grid_free(g);
    return PROBE_ERR_NOMEM;
  }
  for (size_t i = 0; i < n; i++) g->val[i] = NAN;
  g->rows = rows;
  g->cols = cols;
  g->x0 = x0;
  g->x1 = x1;
  g->agg = agg;
  return PROBE_OK;
}

probe_status probe_grid_resize_rows(probe_grid *g, int rows) {
  if (rows <= 0 || !g->val) return PROBE_ERR_INVALID_ARG;
  size_t w = (size_t)g->cols, had = (size_t)g->rows * w, n = (size_t)rows * w;
  float *v = realloc(g->val, n * sizeof *v);
  if (!v) return PROBE_ERR_NOMEM;
  g->val = v;
  uint32_t *c = realloc(g->count, n * sizeof *c);
  if (!c) return PROBE_ERR_NOMEM;
  g->count = c;
  uint32_t *f = realloc(g->nonfinite, n * sizeof *f);
  if (!f) return PROBE_ERR_NOMEM;
  g->nonfinite = f;
  for (size_t i = had; i < n; i++) {
    v[i] = NAN;
    c[i] = f[i] = 0;
  }
  g->rows = rows;
  return PROBE_OK;
}

void probe_grid_free(probe_grid *g) {
  free(g->val);
  free(g->count);
  free(g->nonfinite);
  memset(g, 0, sizeof *g);
}

void probe_grid_add(probe_grid *g, int row, int64_t x, double value,
                    int nonfinite) {
  if (!g->val || row < 0 || row >= g->rows) return;
  int col = probe__col_of(x, g->x0, g->x1, g->cols);
  size_t i = (size_t)row * (size_t)g->cols + (size_t)col;
  if (g->count[i] < UINT32_MAX) g->count[i]++;
  if (nonfinite && g->nonfinite[i] < UINT32_MAX) g->nonfinite[i]++;
  if (isnan(value)) return;
  float v = (float)value;
  float *cell = &g->val[i];
  if (isnan(*cell) || (g->agg == PROBE_GRID_MIN ? v < *cell : v > *cell))
    *cell = v;
}

float probe_grid_val(const probe_grid *g, int row, int col) {
  return g->val[(size_t)row * (size_t)g->cols + (size_t)col];
}
