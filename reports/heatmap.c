/*
 * reports/heatmap.c - layers x steps heatmaps as inline SVG.
 *
 * One row per layer at a fixed row height (at least 10 px, so every layer
 * name stays readable however many layers there are: the plot grows in
 * height instead of thinning labels). Cells are coloured by a colour map
 * quantised to HEAT_LEVELS levels; the cells of one level are drawn as one
 * <path> of run-length merged rectangles, which keeps the SVG small. Cells
 * whose tensors held inf/NaN are black, cells without any record are light
 * grey. Under the grid: step ticks, the x label, a colour bar with its
 * caption and the legend of the two special colours.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ampprobe/report.h"
#include "svg-impl.h"

#define HEAT_LEVELS 48
#define HEAT_MR 24
#define HEAT_MT 30
#define HEAT_MB 96
#define HEAT_LABEL_MAX 44   /* characters of a row label before shortening */
#define HEAT_NONFINITE "#000000"
#define HEAT_EMPTY "#e6e6e6"

uint32_t probe_colormap_at(const probe_colormap *cm, double v) {
  if (cm->n <= 0) return 0x808080;
  if (isnan(v)) return 0x808080;
  if (v <= cm->value[0]) return cm->rgb[0];
  if (v >= cm->value[cm->n - 1]) return cm->rgb[cm->n - 1];
  int i = 0;
  while (i + 1 < cm->n && v > cm->value[i + 1]) i++;
  double t = (v - cm->value[i]) / (cm->value[i + 1] - cm->value[i]);
  uint32_t a = cm->rgb[i], b = cm->rgb[i + 1], out = 0;
  for (int sh = 16; sh >= 0; sh -= 8) {
    double ca = (a >> sh) & 0xFF, cb = (b >> sh) & 0xFF;
    uint32_t c = (uint32_t)lround(ca + (cb - ca) * t);
    out |= (c & 0xFF) << sh;
  }
  return out;
}

/* Level 0..HEAT_LEVELS-1 of v over the colour map's range. */
static int level_of(const probe_colormap *cm, double v) {
  double lo = cm->value[0], hi = cm->value[cm->n - 1];
  if (v <= lo || hi <= lo) return 0;
  if (v >= hi) return HEAT_LEVELS - 1;
  int l = (int)((v - lo) / (hi - lo) * HEAT_LEVELS);
  return l >= HEAT_LEVELS ? HEAT_LEVELS - 1 : l;
}

static double level_value(const probe_colormap *cm, int l) {
  double lo = cm->value[0], hi = cm->value[cm->n - 1];
  return lo + (hi - lo) * ((double)l + 0.5) / HEAT_LEVELS;
}

/* Shortens a label to HEAT_LABEL_MAX characters with "..." in the middle,
 * keeping the end (the leaf name) intact. */
static void short_label(char *dst, size_t cap, const char *s) {
  size_t n = strlen(s);
  if (n <= HEAT_LABEL_MAX || cap < HEAT_LABEL_MAX + 1) {
    snprintf(dst, cap, "%s", s);
    return;
  }
  size_t head = 14, tail = HEAT_LABEL_MAX - head - 3;
  snprintf(dst, cap, "%.*s...%s", (int)head, s, s + n - tail);
}

probe_status probe_heatmap_render(const probe_grid *g,
                                  const probe_heatmap_opts *o,
                                  probe_buf *out) {
  if (!g->val || !o || o->cmap.n < 2) return PROBE_ERR_INVALID_ARG;
  int rh = o->row_height < 10 ? 10 : o->row_height;
  double font = rh >= 13 ? 11.5 : rh - 1.5;

  /* left margin from the longest (shortened) label */
  double label_w = 40;
  for (int r = 0; r < g->rows; r++) {
    char s[HEAT_LABEL_MAX + 8];
    short_label(s, sizeof s, o->row_labels && o->row_labels[r]
                                 ? o->row_labels[r] : "");
    double w = probe__text_width(s, font) * 1.08; /* monospace is wider */
    if (w > label_w) label_w = w;
  }
  double x0 = label_w + 14, x1 = o->width - HEAT_MR;
  if (x1 - x0 < 100) x1 = x0 + 100;
  int width = (int)ceil(x1 + HEAT_MR);
  double y0 = HEAT_MT, y1 = y0 + (double)rh * g->rows;
  int height = (int)ceil(y1 + HEAT_MB);
  double cw = (x1 - x0) / g->cols;

  probe_buf_printf(out,
                   "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"heat\" "
                   "width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" "
                   "role=\"img\"><title>",
                   width, height, width, height);
  probe_buf_escape(out, o->title);
  probe_buf_printf(out, "</title><text class=\"pt\" x=\"%.1f\" y=\"19\">", x0);
  probe_buf_escape(out, o->title);
  probe_buf_puts(out, "</text>");
  probe_buf_printf(out,
                   "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" "
                   "fill=\"%s\"/>",
                   x0, y0, x1 - x0, y1 - y0, HEAT_EMPTY);

  /* cells: per colour level one path of merged runs */
  unsigned char *lev = malloc((size_t)g->rows * (size_t)g->cols);
  if (!lev) return PROBE_ERR_NOMEM;
  const unsigned char EMPTY = 255, NONFIN = 254;
  unsigned used[HEAT_LEVELS] = {0};
  for (int r = 0; r < g->rows; r++)
    for (int c = 0; c < g->cols; c++) {
      size_t i = (size_t)r * g->cols + c;
      if (g->nonfinite[i]) lev[i] = NONFIN;
      else if (g->count[i] == 0 || isnan(g->val[i])) lev[i] = EMPTY;
      else {
        lev[i] = (unsigned char)level_of(&o->cmap, g->val[i]);
        used[lev[i]]++;
      }
    }
  for (int l = -1; l < HEAT_LEVELS; l++) {
    unsigned char want = l < 0 ? NONFIN : (unsigned char)l;
    if (l >= 0 && !used[l]) continue;
    int opened = 0;
    for (int r = 0; r < g->rows; r++) {
      for (int c = 0; c < g->cols;) {
        if (lev[(size_t)r * g->cols + c] != want) { c++; continue; }
        int c1 = c + 1;
        while (c1 < g->cols && lev[(size_t)r * g->cols + c1] == want) c1++;
        if (!opened) {
          if (l < 0)
            probe_buf_printf(out, "<path fill=\"%s\" d=\"", HEAT_NONFINITE);
          else
            probe_buf_printf(out, "<path fill=\"#%06x\" d=\"",
                             probe_colormap_at(&o->cmap,
                                               level_value(&o->cmap, l)));
          opened = 1;
        }
        /* non-finite cells are at least 2 px wide so that one is seen */
        double w = (c1 - c) * cw;
        if (l < 0 && w < 2) w = 2;
        probe_buf_printf(out, "M%.1f %.1fh%.1fv%dh%.1fz", x0 + c * cw,
                         y0 + (double)r * rh, w, rh, -w);
        c = c1;
      }
    }
    if (opened) probe_buf_puts(out, "\"/>");
  }
  free(lev);
  probe_buf_printf(out,
                   "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" "
                   "fill=\"none\" stroke=\"#888\"/>",
                   x0, y0, x1 - x0, y1 - y0);

  if (o->note && o->note[0]) { /* over the grid, on a white band */
    double ny = y0 + (y1 - y0) / 2;
    double nw = probe__text_width(o->note, 14) + 24;
    if (nw > x1 - x0) nw = x1 - x0;
    probe_buf_printf(out,
                     "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" "
                     "height=\"22\" fill=\"#fff\" opacity=\"0.9\"/>"
                     "<text class=\"hn\" x=\"%.1f\" y=\"%.1f\" "
                     "text-anchor=\"middle\" font-size=\"14\" "
                     "fill=\"#b00\">",
                     (x0 + x1 - nw) / 2, ny - 15, nw, (x0 + x1) / 2, ny);
    probe_buf_escape(out, o->note);
    probe_buf_puts(out, "</text>");
  }

  /* row labels, right-aligned against the grid */
  probe_buf_printf(out, "<g class=\"rl\" font-size=\"%.1f\">", font);
  for (int r = 0; r < g->rows; r++) {
    const char *name = o->row_labels && o->row_labels[r] ? o->row_labels[r]
                                                         : "";
    char s[HEAT_LABEL_MAX + 8];
    short_label(s, sizeof s, name);
    probe_buf_printf(out, "<text x=\"%.1f\" y=\"%.1f\">", x0 - 5,
                     y0 + (double)r * rh + rh * 0.5 + font * 0.35);
    if (strcmp(s, name) != 0) { /* full name on hover */
      probe_buf_puts(out, "<title>");
      probe_buf_escape(out, name);
      probe_buf_puts(out, "</title>");
    }
    probe_buf_escape(out, s);
    probe_buf_puts(out, "</text>");
  }
  probe_buf_puts(out, "</g>");

  /* step ticks */
  double ticks[20];
  int max_xt = (int)((x1 - x0) / 90);
  if (max_xt < 2) max_xt = 2;
  if (max_xt > 16) max_xt = 16;
  int nt = probe_axis_ticks(PROBE_AXIS_LINEAR, (double)g->x0, (double)g->x1,
                            ticks, max_xt);
  double span = probe__span(g->x0, g->x1);
  probe_buf_puts(out, "<g class=\"xt\">");
  for (int i = 0; i < nt; i++) {
    if (ticks[i] != floor(ticks[i])) continue;
    /* a step's cell starts at (step - x0) / span of the width */
    double x = x0 + (ticks[i] - (double)g->x0) / span * (x1 - x0);
    char s[32];
    probe__step_text(s, sizeof s, probe__step_of(ticks[i]));
    probe_buf_printf(out,
                     "<path d=\"M%.1f %.1fv5\" stroke=\"#444\"/>"
                     "<text x=\"%.1f\" y=\"%.1f\">%s</text>",
                     x, y1, x, y1 + 17, s);
  }
  probe_buf_puts(out, "</g>");
  probe_buf_printf(out, "<text class=\"al\" x=\"%.1f\" y=\"%.1f\">",
                   (x0 + x1) / 2, y1 + 34);
  probe_buf_escape(out, o->x_label ? o->x_label : "step");
  if (span > g->cols)
    probe_buf_printf(out, " (%.0f steps per column)", ceil(span / g->cols));
  probe_buf_puts(out, "</text>");

  /* colour bar */
  double bx = x0, by = y1 + 50, bw = 300, bh = 12;
  probe_buf_puts(out, "<g>");
  for (int l = 0; l < HEAT_LEVELS; l++)
    probe_buf_printf(out,
                     "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.2f\" height=\"%.0f\""
                     " fill=\"#%06x\"/>",
                     bx + bw * l / HEAT_LEVELS, by, bw / HEAT_LEVELS + 0.3, bh,
                     probe_colormap_at(&o->cmap, level_value(&o->cmap, l)));
  probe_buf_printf(out,
                   "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.0f\" "
                   "fill=\"none\" stroke=\"#888\"/>",
                   bx, by, bw, bh);
  double lo = o->cmap.value[0], hi = o->cmap.value[o->cmap.n - 1];
  double last_x = -1e9;
  for (int i = 0; i < o->cmap.n; i++) {
    double x = bx + (o->cmap.value[i] - lo) / (hi - lo) * bw;
    /* a stop label too close to the one before is left out, except the
     * last one, which then replaces the one before it */
    if (x - last_x < 34 && i != o->cmap.n - 1) continue;
    last_x = x;
    probe_buf_printf(out,
                     "<path d=\"M%.1f %.1fv4\" stroke=\"#444\"/>"
                     "<text class=\"cb\" x=\"%.1f\" y=\"%.1f\">",
                     x, by + bh, x, by + bh + 14);
    if (o->stop_labels) {
      probe_buf_escape(out, o->stop_labels[i] ? o->stop_labels[i] : "");
    } else {
      probe_buf_printf(out, "%s%g%s", i == 0 ? "&#8804;" : "",
                       o->cmap.value[i], i == o->cmap.n - 1 ? "+" : "");
    }
    probe_buf_puts(out, "</text>");
  }
  probe_buf_printf(out, "<text class=\"lg\" x=\"%.1f\" y=\"%.1f\">",
                   bx + bw + 12, by + 10);
  probe_buf_escape(out, o->value_label);
  probe_buf_puts(out, "</text></g>");

  /* special colours */
  double lx = bx + bw + 24 + probe__text_width(o->value_label ? o->value_label
                                                              : "", 12);
  if (lx + 360 > width) { lx = bx; by += 30; }
  probe_buf_printf(out,
                   "<rect x=\"%.1f\" y=\"%.1f\" width=\"14\" height=\"12\" "
                   "fill=\"%s\"/><text class=\"lg\" x=\"%.1f\" y=\"%.1f\">",
                   lx, by, HEAT_NONFINITE, lx + 20, by + 10);
  probe_buf_escape(out, o->nonfinite_label ? o->nonfinite_label : "inf/NaN");
  probe_buf_puts(out, "</text>");
  lx += 40 + probe__text_width(o->nonfinite_label ? o->nonfinite_label
                                                  : "inf/NaN", 12);
  probe_buf_printf(out,
                   "<rect x=\"%.1f\" y=\"%.1f\" width=\"14\" height=\"12\" "
                   "fill=\"%s\" stroke=\"#aaa\"/><text class=\"lg\" x=\"%.1f\" "
                   "y=\"%.1f\">",
                   lx, by, HEAT_EMPTY, lx + 20, by + 10);
  probe_buf_escape(out, o->empty_label ? o->empty_label : "no record");
  probe_buf_puts(out, "</text></svg>\n");
  return out->oom ? PROBE_ERR_NOMEM : PROBE_OK;
}
