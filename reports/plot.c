/*
 * reports/plot.c - line plots as inline SVG: linear, log10 and log2 y axes,
 * nice ticks, grid lines, axis labels, reduced (M4) series, markers,
 * reference lines, a legend under the x axis, and non-finite values shown as
 * red marks on the top edge.
 *
 * Layout of one plot (pixels): title row on top, y tick labels and the
 * y-axis label on the left, x ticks, the x-axis label and the legend below
 * the data area. Coordinates are written with one decimal.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ampprobe/report.h"
#include "svg-impl.h"

#define PLOT_ML 84  /* left margin: y tick labels and the rotated y label */
#define PLOT_MR 24
#define PLOT_MT 30  /* title */
#define PLOT_MB 64  /* x ticks, x label, legend */
#define PLOT_MAX_ITEMS 16

typedef enum item_kind { ITEM_LINE, ITEM_MARKERS, ITEM_HLINE, ITEM_VLINE } item_kind;

typedef struct plot_item {
  item_kind kind;
  char color[32];
  char label[96];
  char dash[24];
  char nonfinite_color[32];
  probe_marker marker;
  size_t n;        /* points / markers */
  int64_t *x;
  double *y;
  /* non-finite columns of a line: x positions (column centres) */
  size_t n_nf;
  int64_t *nf_x;
  int64_t nf_count; /* values behind them */
  double ref;       /* hline y / vline x */
} plot_item;

struct probe_plot {
  char title[160];
  char note[160];
  int width, height;
  char xlabel[96], ylabel[96];
  int64_t xlo, xhi;  /* xhi < xlo: fit */
  probe_axis_scale yscale;
  double ylo, yhi;   /* NaN: fit */
  int n_items;
  plot_item items[PLOT_MAX_ITEMS];
};

static void copy_str(char *dst, size_t cap, const char *s) {
  if (!s) s = "";
  size_t n = strlen(s);
  if (n >= cap) n = cap - 1;
  memcpy(dst, s, n);
  dst[n] = '\0';
}

probe_status probe_plot_new(probe_plot **out, const char *title, int width,
                            int height) {
  *out = NULL;
  if (width < PLOT_ML + PLOT_MR + 50 || height < PLOT_MT + PLOT_MB + 40)
    return PROBE_ERR_INVALID_ARG;
  probe_plot *p = calloc(1, sizeof *p);
  if (!p) return PROBE_ERR_NOMEM;
  copy_str(p->title, sizeof p->title, title);
  p->width = width;
  p->height = height;
  p->xlo = 0;
  p->xhi = -1;
  p->ylo = p->yhi = NAN;
  *out = p;
  return PROBE_OK;
}

void probe_plot_free(probe_plot *p) {
  if (!p) return;
  for (int i = 0; i < p->n_items; i++) {
    free(p->items[i].x);
    free(p->items[i].y);
    free(p->items[i].nf_x);
  }
  free(p);
}

probe_status probe_plot_x_axis(probe_plot *p, const char *label, int64_t lo,
                               int64_t hi) {
  copy_str(p->xlabel, sizeof p->xlabel, label);
  p->xlo = lo;
  p->xhi = hi;
  return PROBE_OK;
}

probe_status probe_plot_y_axis(probe_plot *p, probe_axis_scale scale,
                               const char *label, double lo, double hi) {
  copy_str(p->ylabel, sizeof p->ylabel, label);
  p->yscale = scale;
  p->ylo = lo;
  p->yhi = hi;
  return PROBE_OK;
}

int probe_plot_data_width(const probe_plot *p) {
  return p->width - PLOT_ML - PLOT_MR;
}

probe_status probe_plot_set_note(probe_plot *p, const char *note) {
  copy_str(p->note, sizeof p->note, note);
  return PROBE_OK;
}

static plot_item *new_item(probe_plot *p, item_kind k, const char *color,
                           const char *label, const char *dash) {
  if (p->n_items >= PLOT_MAX_ITEMS) return NULL;
  plot_item *it = &p->items[p->n_items++];
  memset(it, 0, sizeof *it);
  it->kind = k;
  copy_str(it->color, sizeof it->color, color ? color : "#1f77b4");
  copy_str(it->label, sizeof it->label, label);
  copy_str(it->dash, sizeof it->dash, dash);
  return it;
}

probe_status probe_plot_add_line(probe_plot *p, const probe_bins *b,
                                 const char *color, const char *label,
                                 const char *dash,
                                 const char *nonfinite_color) {
  plot_item *it = new_item(p, ITEM_LINE, color, label, dash);
  if (!it) return PROBE_ERR_INVALID_ARG;
  size_t cap = 4 * (size_t)b->ncols + 1;
  it->x = malloc(cap * sizeof *it->x);
  it->y = malloc(cap * sizeof *it->y);
  it->nf_x = malloc(((size_t)b->ncols + 1) * sizeof *it->nf_x);
  if (!it->x || !it->y || !it->nf_x) {
    p->n_items--;
    free(it->x); free(it->y); free(it->nf_x);
    return PROBE_ERR_NOMEM;
  }
  it->n = probe_bins_points(b, it->x, it->y, cap);
  if (nonfinite_color) {
    copy_str(it->nonfinite_color, sizeof it->nonfinite_color, nonfinite_color);
    double span = probe__span(b->x0, b->x1);
    for (int c = 0; c < b->ncols; c++) {
      int64_t k = b->bin[c].n_nan + b->bin[c].n_inf;
      if (!k) continue;
      it->nf_x[it->n_nf++] = probe__step_at(
          b->x0, b->x1, floor(((double)c + 0.5) * span / b->ncols));
      it->nf_count += k;
    }
  }
  return PROBE_OK;
}

probe_status probe_plot_add_markers(probe_plot *p, const int64_t *x,
                                    const double *y, size_t n,
                                    probe_marker m, const char *color,
                                    const char *label) {
  plot_item *it = new_item(p, ITEM_MARKERS, color, label, NULL);
  if (!it) return PROBE_ERR_INVALID_ARG;
  it->marker = m;
  if (n) {
    it->x = malloc(n * sizeof *it->x);
    it->y = malloc(n * sizeof *it->y);
    if (!it->x || !it->y) {
      p->n_items--;
      free(it->x); free(it->y);
      return PROBE_ERR_NOMEM;
    }
    memcpy(it->x, x, n * sizeof *x);
    memcpy(it->y, y, n * sizeof *y);
  }
  it->n = n;
  return PROBE_OK;
}

probe_status probe_plot_add_hline(probe_plot *p, double y, const char *color,
                                  const char *label, const char *dash) {
  plot_item *it = new_item(p, ITEM_HLINE, color, label, dash);
  if (!it) return PROBE_ERR_INVALID_ARG;
  it->ref = y;
  return PROBE_OK;
}

probe_status probe_plot_add_vline(probe_plot *p, int64_t x, const char *color,
                                  const char *label, const char *dash) {
  plot_item *it = new_item(p, ITEM_VLINE, color, label, dash);
  if (!it) return PROBE_ERR_INVALID_ARG;
  it->ref = (double)x;
  return PROBE_OK;
}

/* ---- axes ----------------------------------------------------------------- */

static double axis_fwd(probe_axis_scale s, double v) {
  if (s == PROBE_AXIS_LOG10) return log10(v);
  if (s == PROBE_AXIS_LOG2) return log2(v);
  return v;
}

static int usable(probe_axis_scale s, double v) {
  return isfinite(v) && (s == PROBE_AXIS_LINEAR || v > 0);
}

int probe_axis_ticks(probe_axis_scale scale, double lo, double hi,
                     double *ticks, int max) {
  int n = 0;
  if (!(lo <= hi) || !isfinite(lo) || !isfinite(hi) || max <= 0) return 0;
  if (scale == PROBE_AXIS_LINEAR) {
    double span = hi - lo;
    if (span <= 0) span = fabs(lo) > 0 ? fabs(lo) : 1;
    double raw = span / (max > 1 ? max - 1 : 1);
    double mag = pow(10, floor(log10(raw)));
    double step = mag;
    static const double nice[] = {1, 2, 2.5, 5, 10};
    for (int i = 0; i < 5; i++) {
      step = nice[i] * mag;
      if (span / step <= max - 1) break;
    }
    double t = ceil(lo / step - 1e-9) * step;
    for (; t <= hi + step * 1e-9 && n < max; t += step)
      ticks[n++] = fabs(t) < step * 1e-9 ? 0.0 : t;
    return n;
  }
  double b = scale == PROBE_AXIS_LOG10 ? 10.0 : 2.0;
  if (lo <= 0) return 0;
  double e0 = ceil(log(lo) / log(b) - 1e-9);
  double e1 = floor(log(hi) / log(b) + 1e-9);
  if (e1 < e0) {
    /* less than one decade/octave: fall back to linear ticks inside it */
    return probe_axis_ticks(PROBE_AXIS_LINEAR, lo, hi, ticks, max < 4 ? max : 4);
  }
  /* thin to every k-th exponent, k a round number: 1, 2, 4, 8, 16, ...
   * octaves on log2 axes (2^0, 2^8, 2^16), 1, 2, 5, 10, ... decades */
  double count = e1 - e0 + 1;
  int every = 1;
  for (int k = 0; count / every > max && k < 40; k++)
    every = b == 2.0 ? 1 << (k + 1)
                     : (k % 3 == 0 ? 2 : k % 3 == 1 ? 5 : 10) *
                           (int)pow(10, k / 3);
  /* keep the thinned exponents on multiples of `every` */
  double e = ceil(e0 / every) * every;
  for (; e <= e1 && n < max; e += every) ticks[n++] = pow(b, e);
  return n;
}

/* Tick text: linear axes with %g; log10 as 1e-3 / 0.01 ... 1e4; log2 as 2^k. */
static void tick_text(char *s, size_t cap, probe_axis_scale sc, double v) {
  if (sc == PROBE_AXIS_LOG2) {
    double e = log2(v);
    if (fabs(e - round(e)) < 1e-9)
      snprintf(s, cap, "2^%d", (int)round(e));
    else
      snprintf(s, cap, "%.3g", v);
  } else if (sc == PROBE_AXIS_LOG10) {
    double e = log10(v);
    if (fabs(e - round(e)) < 1e-9 && (e < -2 || e > 3))
      snprintf(s, cap, "1e%d", (int)round(e));
    else
      snprintf(s, cap, "%g", v);
  } else {
    snprintf(s, cap, "%.4g", v);
  }
}

/* Integer tick text for steps: 12000 -> "12k" only when divisible. */
void probe__step_text(char *s, size_t cap, int64_t v) {
  if (v != 0 && v % 1000 == 0 && (v >= 10000 || v <= -10000))
    snprintf(s, cap, "%lldk", (long long)(v / 1000));
  else
    snprintf(s, cap, "%lld", (long long)v);
}

/* ---- rendering ------------------------------------------------------------ */

typedef struct frame {
  double x0, x1, y0, y1; /* data area in pixels; y0 top */
  int64_t xlo, xhi;
  double ylo, yhi;       /* in axis space (log applied) */
  probe_axis_scale ys;
} frame;

static double px_x(const frame *f, double x) {
  double span = (double)f->xhi - (double)f->xlo; /* no int64 overflow */
  if (span <= 0) span = 1;
  return f->x0 + (x - (double)f->xlo) / span * (f->x1 - f->x0);
}

/* y in data space -> pixel, clamped into the data area. */
static double px_y(const frame *f, double y) {
  double a;
  if (isnan(y) || y == INFINITY) return f->y0;
  if (y == -INFINITY) return f->y1;
  if (f->ys != PROBE_AXIS_LINEAR && y <= 0) return f->y1;
  a = axis_fwd(f->ys, y);
  double span = f->yhi - f->ylo;
  if (span <= 0) span = 1;
  double py = f->y1 - (a - f->ylo) / span * (f->y1 - f->y0);
  if (py < f->y0) py = f->y0;
  if (py > f->y1) py = f->y1;
  return py;
}

/* Whether point k of a line has a usable next point (the pen goes on). */
static int line_continues(const plot_item *it, probe_axis_scale ys, size_t k) {
  return k + 1 < it->n && usable(ys, it->y[k + 1]);
}

static void marker_path(probe_buf *o, probe_marker m, double x, double y) {
  switch (m) {
  case PROBE_MARKER_TRIANGLE_UP:
    probe_buf_printf(o, "M%.1f %.1fl4 7h-8z", x, y - 4.5);
    break;
  case PROBE_MARKER_TRIANGLE_DOWN:
    probe_buf_printf(o, "M%.1f %.1fl4 -7h-8z", x, y + 4.5);
    break;
  case PROBE_MARKER_CROSS:
    probe_buf_printf(o, "M%.1f %.1fl7 7m0 -7l-7 7", x - 3.5, y - 3.5);
    break;
  case PROBE_MARKER_DIAMOND:
    probe_buf_printf(o, "M%.1f %.1fl4 4l-4 4l-4 -4z", x, y - 4);
    break;
  case PROBE_MARKER_TICK:
    probe_buf_printf(o, "M%.1f %.1fv-9", x, y);
    break;
  case PROBE_MARKER_CIRCLE:
  default:
    probe_buf_printf(o, "M%.1f %.1fa3 3 0 1 0 6 0a3 3 0 1 0 -6 0", x - 3, y);
    break;
  }
}

static int marker_stroked(probe_marker m) {
  return m == PROBE_MARKER_CROSS || m == PROBE_MARKER_TICK;
}

static void fit_y(const probe_plot *p, double *lo, double *hi) {
  probe_axis_scale s = p->yscale;
  double mn = INFINITY, mx = -INFINITY;
  for (int i = 0; i < p->n_items; i++) {
    const plot_item *it = &p->items[i];
    if (it->kind == ITEM_HLINE && usable(s, it->ref)) {
      mn = fmin(mn, it->ref);
      mx = fmax(mx, it->ref);
    }
    if (it->kind != ITEM_LINE && it->kind != ITEM_MARKERS) continue;
    for (size_t k = 0; k < it->n; k++) {
      if (!usable(s, it->y[k])) continue;
      mn = fmin(mn, it->y[k]);
      mx = fmax(mx, it->y[k]);
    }
  }
  if (!isnan(p->ylo)) mn = p->ylo;
  if (!isnan(p->yhi)) mx = p->yhi;
  if (!(mn <= mx)) { /* no data */
    mn = s == PROBE_AXIS_LINEAR ? 0 : 1;
    mx = s == PROBE_AXIS_LINEAR ? 1 : 10;
  }
  double a = axis_fwd(s, mn), b = axis_fwd(s, mx);
  if (a == b) {
    double d = s == PROBE_AXIS_LINEAR ? (fabs(a) > 0 ? fabs(a) * 0.1 : 1) : 1;
    a -= d;
    b += d;
  } else {
    double pad = (b - a) * 0.05;
    if (isnan(p->ylo)) a -= pad;
    if (isnan(p->yhi)) b += pad;
  }
  *lo = a;
  *hi = b;
}

double probe__text_width(const char *s, double font_px) {
  return (double)strlen(s) * font_px * 0.56;
}

/* Label of legend entry `pass` (0: the item, 1: its non-finite marks) of an
 * item; 0 when the entry does not exist. */
static int legend_label(const plot_item *it, int pass, char *label,
                        size_t cap) {
  if (pass == 0) {
    if (!it->label[0]) return 0;
    copy_str(label, cap, it->label);
    return 1;
  }
  if (it->kind != ITEM_LINE || !it->n_nf) return 0;
  snprintf(label, cap, "non-finite %s (%lld steps)",
           it->label[0] ? it->label : "value", (long long)it->nf_count);
  return 1;
}

static double legend_entry_width(const char *label) {
  return 28 + probe__text_width(label, 12) + 18;
}

/* Rows the legend needs when wrapped to the plot width. */
static int legend_rows(const probe_plot *p) {
  double lx = PLOT_ML;
  int rows = 1;
  for (int i = 0; i < p->n_items; i++)
    for (int pass = 0; pass < 2; pass++) {
      char label[128];
      if (!legend_label(&p->items[i], pass, label, sizeof label)) continue;
      double w = legend_entry_width(label);
      if (lx + w > p->width - PLOT_MR && lx > PLOT_ML) {
        lx = PLOT_ML;
        rows++;
      }
      lx += w;
    }
  return rows;
}

probe_status probe_plot_render(const probe_plot *p, probe_buf *o) {
  frame f;
  f.x0 = PLOT_ML;
  f.x1 = p->width - PLOT_MR;
  f.y0 = PLOT_MT;
  f.y1 = p->height - PLOT_MB - 16 * (legend_rows(p) - 1);
  if (f.y1 < f.y0 + 40) f.y1 = f.y0 + 40;
  f.ys = p->yscale;
  f.xlo = p->xlo;
  f.xhi = p->xhi;
  if (f.xhi < f.xlo) { /* fit x to the data */
    int64_t mn = INT64_MAX, mx = INT64_MIN;
    for (int i = 0; i < p->n_items; i++)
      for (size_t k = 0; k < p->items[i].n; k++) {
        if (p->items[i].x[k] < mn) mn = p->items[i].x[k];
        if (p->items[i].x[k] > mx) mx = p->items[i].x[k];
      }
    if (mn > mx) { mn = 0; mx = 1; }
    f.xlo = mn;
    f.xhi = mx;
  }
  if (f.xhi == f.xlo) { /* one step: a range of two, inside int64 */
    if (f.xlo < INT64_MAX) f.xhi = f.xlo + 1;
    else f.xlo = f.xhi - 1;
  }
  fit_y(p, &f.ylo, &f.yhi);

  probe_buf_printf(o,
                   "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"plot\" "
                   "width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" "
                   "role=\"img\">",
                   p->width, p->height, p->width, p->height);
  probe_buf_puts(o, "<title>");
  probe_buf_escape(o, p->title);
  probe_buf_puts(o, "</title>");
  probe_buf_printf(o, "<text class=\"pt\" x=\"%d\" y=\"19\">", PLOT_ML);
  probe_buf_escape(o, p->title);
  probe_buf_puts(o, "</text>");
  probe_buf_printf(o,
                   "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" "
                   "fill=\"#fff\" stroke=\"#888\"/>",
                   f.x0, f.y0, f.x1 - f.x0, f.y1 - f.y0);

  /* y ticks and grid */
  double ticks[24];
  double lo_v = f.ys == PROBE_AXIS_LINEAR ? f.ylo
                : f.ys == PROBE_AXIS_LOG10 ? pow(10, f.ylo) : pow(2, f.ylo);
  double hi_v = f.ys == PROBE_AXIS_LINEAR ? f.yhi
                : f.ys == PROBE_AXIS_LOG10 ? pow(10, f.yhi) : pow(2, f.yhi);
  int max_yt = (int)((f.y1 - f.y0) / 28);
  if (max_yt < 2) max_yt = 2;
  if (max_yt > 12) max_yt = 12;
  int nt = probe_axis_ticks(f.ys, lo_v, hi_v, ticks, max_yt);
  probe_buf_puts(o, "<g class=\"yt\">");
  for (int i = 0; i < nt; i++) {
    double y = px_y(&f, ticks[i]);
    char s[32];
    tick_text(s, sizeof s, f.ys, ticks[i]);
    probe_buf_printf(o,
                     "<path class=\"gr\" d=\"M%.1f %.1fH%.1f\"/>"
                     "<text x=\"%.1f\" y=\"%.1f\">%s</text>",
                     f.x0, y, f.x1, f.x0 - 5, y + 4, s);
  }
  probe_buf_puts(o, "</g>");

  /* x ticks */
  int max_xt = (int)((f.x1 - f.x0) / 90);
  if (max_xt < 2) max_xt = 2;
  if (max_xt > 16) max_xt = 16;
  nt = probe_axis_ticks(PROBE_AXIS_LINEAR, (double)f.xlo, (double)f.xhi,
                        ticks, max_xt);
  probe_buf_puts(o, "<g class=\"xt\">");
  for (int i = 0; i < nt; i++) {
    double t = ticks[i];
    if (t != floor(t)) continue; /* steps are integers */
    double x = px_x(&f, t);
    char s[32];
    probe__step_text(s, sizeof s, probe__step_of(t));
    probe_buf_printf(o,
                     "<path class=\"gr\" d=\"M%.1f %.1fV%.1f\"/>"
                     "<path d=\"M%.1f %.1fv5\" stroke=\"#444\"/>"
                     "<text x=\"%.1f\" y=\"%.1f\">%s</text>",
                     x, f.y0, f.y1, x, f.y1, x, f.y1 + 17, s);
  }
  probe_buf_puts(o, "</g>");

  /* axis labels */
  probe_buf_printf(o, "<text class=\"al\" x=\"%.1f\" y=\"%.1f\">",
                   (f.x0 + f.x1) / 2, f.y1 + 34);
  probe_buf_escape(o, p->xlabel);
  probe_buf_puts(o, "</text>");
  probe_buf_printf(o,
                   "<text class=\"al\" transform=\"translate(16 %.1f) "
                   "rotate(-90)\">",
                   (f.y0 + f.y1) / 2);
  probe_buf_escape(o, p->ylabel);
  probe_buf_puts(o, "</text>");

  /* data */
  for (int i = 0; i < p->n_items; i++) {
    const plot_item *it = &p->items[i];
    if (it->kind == ITEM_HLINE) {
      if (!usable(f.ys, it->ref)) continue;
      probe_buf_printf(o,
                       "<path d=\"M%.1f %.1fH%.1f\" stroke=\"%s\" "
                       "stroke-width=\"1.5\"%s%s%s/>",
                       f.x0, px_y(&f, it->ref), f.x1, it->color,
                       it->dash[0] ? " stroke-dasharray=\"" : "", it->dash,
                       it->dash[0] ? "\"" : "");
    } else if (it->kind == ITEM_VLINE) {
      double x = px_x(&f, it->ref);
      if (x < f.x0 || x > f.x1) continue;
      probe_buf_printf(o,
                       "<path d=\"M%.1f %.1fV%.1f\" stroke=\"%s\" "
                       "stroke-width=\"1.5\"%s%s%s/>",
                       x, f.y0, f.y1, it->color,
                       it->dash[0] ? " stroke-dasharray=\"" : "", it->dash,
                       it->dash[0] ? "\"" : "");
    } else if (it->kind == ITEM_LINE) {
      if (it->n) {
        probe_buf_printf(o,
                         "<path fill=\"none\" stroke=\"%s\" "
                         "stroke-width=\"1.2\" stroke-linejoin=\"round\"%s%s%s "
                         "d=\"",
                         it->color, it->dash[0] ? " stroke-dasharray=\"" : "",
                         it->dash, it->dash[0] ? "\"" : "");
        int pen = 0;
        size_t isolated = 0; /* points with no usable neighbour */
        for (size_t k = 0; k < it->n; k++) {
          if (!usable(f.ys, it->y[k])) { pen = 0; continue; }
          probe_buf_printf(o, "%c%.1f %.1f", pen ? 'L' : 'M',
                           px_x(&f, (double)it->x[k]), px_y(&f, it->y[k]));
          isolated += !pen && !line_continues(it, f.ys, k);
          pen = 1;
        }
        probe_buf_puts(o, "\"/>");
        /* a subpath of one point draws nothing: a dot for each (a series
         * of one step, a value between two gaps) */
        if (isolated) {
          probe_buf_printf(o, "<path fill=\"%s\" d=\"", it->color);
          for (size_t k = 0; k < it->n; k++)
            if (usable(f.ys, it->y[k]) &&
                (k == 0 || !usable(f.ys, it->y[k - 1])) &&
                !line_continues(it, f.ys, k))
              probe_buf_printf(o, "M%.1f %.1fa2 2 0 1 0 4 0a2 2 0 1 0 -4 0",
                               px_x(&f, (double)it->x[k]) - 2, px_y(&f, it->y[k]));
          probe_buf_puts(o, "\"/>");
        }
      }
      if (it->n_nf) {
        probe_buf_printf(o, "<path fill=\"%s\" d=\"", it->nonfinite_color);
        for (size_t k = 0; k < it->n_nf; k++)
          marker_path(o, PROBE_MARKER_TRIANGLE_DOWN,
                      px_x(&f, (double)it->nf_x[k]), f.y0 + 1);
        probe_buf_puts(o, "\"/>");
      }
    } else if (it->kind == ITEM_MARKERS && it->n) {
      int stroked = marker_stroked(it->marker);
      probe_buf_printf(o, stroked ? "<path fill=\"none\" stroke=\"%s\" "
                                    "stroke-width=\"1.6\" d=\""
                                  : "<path fill=\"%s\" fill-opacity=\"0.85\" d=\"",
                       it->color);
      for (size_t k = 0; k < it->n; k++) {
        double x = px_x(&f, (double)it->x[k]);
        double y = it->marker == PROBE_MARKER_TICK ? f.y1 : px_y(&f, it->y[k]);
        marker_path(o, it->marker, x, y);
      }
      probe_buf_puts(o, "\"/>");
    }
  }
  if (p->note[0]) {
    /* on a white band, so that a line under it does not cross the words */
    double nw = probe__text_width(p->note, 14) + 20;
    if (nw > f.x1 - f.x0) nw = f.x1 - f.x0;
    probe_buf_printf(o,
                     "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" "
                     "height=\"22\" fill=\"#fff\" opacity=\"0.85\"/>",
                     (f.x0 + f.x1 - nw) / 2, (f.y0 + f.y1) / 2 - 16, nw);
    probe_buf_printf(o, "<text class=\"note\" x=\"%.1f\" y=\"%.1f\">",
                     (f.x0 + f.x1) / 2, (f.y0 + f.y1) / 2);
    probe_buf_escape(o, p->note);
    probe_buf_puts(o, "</text>");
  }

  /* legend: one row under the x label, wrapping when it is long */
  double lx = f.x0, ly = f.y1 + 54;
  for (int i = 0; i < p->n_items; i++) {
    const plot_item *it = &p->items[i];
    for (int pass = 0; pass < 2; pass++) {
      char label[128];
      if (!legend_label(it, pass, label, sizeof label)) continue;
      double w = legend_entry_width(label);
      if (lx + w > p->width - PLOT_MR && lx > f.x0) {
        lx = f.x0;
        ly += 16;
      }
      if (pass == 1) {
        probe_buf_printf(o, "<path fill=\"%s\" d=\"", it->nonfinite_color);
        marker_path(o, PROBE_MARKER_TRIANGLE_DOWN, lx + 11, ly - 4);
        probe_buf_puts(o, "\"/>");
      } else if (it->kind == ITEM_MARKERS) {
        int stroked = marker_stroked(it->marker);
        probe_buf_printf(o, stroked ? "<path fill=\"none\" stroke=\"%s\" "
                                      "stroke-width=\"1.6\" d=\""
                                    : "<path fill=\"%s\" d=\"",
                         it->color);
        marker_path(o, it->marker, lx + 11,
                    it->marker == PROBE_MARKER_TICK ? ly + 1 : ly - 4);
        probe_buf_puts(o, "\"/>");
      } else {
        probe_buf_printf(o,
                         "<path d=\"M%.1f %.1fh22\" stroke=\"%s\" "
                         "stroke-width=\"2\"%s%s%s/>",
                         lx, ly - 4, it->color,
                         it->dash[0] ? " stroke-dasharray=\"" : "", it->dash,
                         it->dash[0] ? "\"" : "");
      }
      probe_buf_printf(o, "<text class=\"lg\" x=\"%.1f\" y=\"%.1f\">",
                       lx + 28, ly);
      probe_buf_escape(o, label);
      probe_buf_puts(o, "</text>");
      lx += w;
    }
  }
  probe_buf_puts(o, "</svg>\n");
  return o->oom ? PROBE_ERR_NOMEM : PROBE_OK;
}
