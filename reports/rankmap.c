/*
 * reports/rankmap.c - the ranks x steps view of a trace set (the ranks of
 * one data-parallel job) as inline SVG.
 *
 * One row per rank, one column per range of steps; a cell is the worst
 * state of the rank's steps in it: non-finite (black, as in the layer
 * heatmaps) > skipped step (orange) > healthy (green) > no step (white).
 * Ranks the set should hold but does not (missing files) and unreadable
 * files are whole rows of their own colour. The job's first non-finite
 * cell is ringed in red; a rank that stopped first gets a red bar after its
 * last step; rows with notes are labelled at the right with leader lines.
 *
 * Size is bounded whatever the rank and step counts: cells of one state
 * are merged into runs along a row, identical neighbouring rows into one
 * block, each state drawn as one <path>; when the runs still exceed
 * PROBE_RANKMAP_MAX_RUNS, columns are merged in pairs (worst state kept)
 * until they fit. Rows shrink to 2 px from 360 ranks on, with rank ticks
 * instead of a label per row.
 *
 * The cells live in shared anonymous memory (mmap MAP_SHARED): a worker
 * process the caller forks to read traces (so that a crash inside HDF5
 * does not take the caller down) fills them for the caller to draw.
 */
#define _DEFAULT_SOURCE /* MAP_ANONYMOUS */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "ampprobe/analysis.h" /* probe_text_escape */
#include "ampprobe/report.h"
#include "svg-impl.h"

#define RM_ML 96        /* left margin: row labels */
#define RM_MR 300       /* right margin: notes */
#define RM_MT 30        /* title */
#define RM_GRID_PX 720  /* target grid height for many rows */
#define RM_ROW_MAX 14   /* row height with few rows */
#define RM_ROW_MIN 2    /* ... and with many */
#define RM_LABEL_ROW 10 /* rows at least this tall get a label each */
#define RM_MIN_CELL_PX 2.0 /* columns are merged until cells are this wide */
#define RM_MAX_NOTES 24 /* notes drawn at the right; the rest counted */
#define RM_NOTE_GAP 13  /* vertical pixels between note lines */
#define RM_LABEL_MAX 96 /* bytes of a row label as shown */
#define RM_TOOLTIP_ROWS 512 /* rows with a hover tooltip at most */

static const char *const cell_color[4] = {NULL, "#a1d99b", "#fdae6b",
                                          "#000000"};
static const char *const row_color[3] = {NULL, "#bdbdbd", "#c5b0d5"};

typedef struct rm_row {
  char *label, *tooltip, *note;
  probe_rank_row kind;
  int64_t last;  /* last step added, -1 none */
  int stop;      /* stopped first */
} rm_row;

struct probe_rankmap {
  int rows, cols;
  int64_t x0, x1;
  unsigned char *cell; /* (rows, cols) probe_rank_cell, shared memory */
  size_t cell_bytes;
  rm_row *row;
  int first_row;       /* -1: no first non-finite mark */
  int64_t first_step;
  int64_t count[4];
};

probe_status probe_rankmap_new(probe_rankmap **out, int rows, int cols,
                               int64_t x0, int64_t x1) {
  *out = NULL;
  if (rows < 1 || rows > PROBE_RANKMAP_MAX_ROWS || cols < 1 || x1 < x0)
    return PROBE_ERR_INVALID_ARG;
  cols = probe__cols_for(cols, x0, x1);
  probe_rankmap *m = calloc(1, sizeof *m);
  if (!m) return PROBE_ERR_NOMEM;
  m->rows = rows;
  m->cols = cols;
  m->x0 = x0;
  m->x1 = x1;
  m->first_row = -1;
  m->cell_bytes = (size_t)rows * (size_t)cols;
  void *cells = mmap(NULL, m->cell_bytes, PROT_READ | PROT_WRITE,
                     MAP_SHARED | MAP_ANONYMOUS, -1, 0); /* zero-filled */
  m->cell = cells == MAP_FAILED ? NULL : cells;
  m->row = calloc((size_t)rows, sizeof *m->row);
  if (!m->cell || !m->row) {
    probe_rankmap_free(m);
    return PROBE_ERR_NOMEM;
  }
  for (int r = 0; r < rows; r++) m->row[r].last = -1;
  *out = m;
  return PROBE_OK;
}

void probe_rankmap_free(probe_rankmap *m) {
  if (!m) return;
  for (int r = 0; m->row && r < m->rows; r++) {
    free(m->row[r].label);
    free(m->row[r].tooltip);
    free(m->row[r].note);
  }
  free(m->row);
  if (m->cell) munmap(m->cell, m->cell_bytes);
  free(m);
}

static char *shown(const char *s) { /* escaped as on the terminal */
  size_t cap = strlen(s) * 6 + 1;
  char *d = malloc(cap);
  if (d) probe_text_escape(d, cap, s);
  return d;
}

probe_status probe_rankmap_set_row(probe_rankmap *m, int row,
                                   const char *label, probe_rank_row kind,
                                   const char *tooltip) {
  if (row < 0 || row >= m->rows || !label || kind < PROBE_RANK_ROW_TRACE ||
      kind > PROBE_RANK_ROW_UNREADABLE)
    return PROBE_ERR_INVALID_ARG;
  rm_row *R = &m->row[row];
  free(R->label);
  free(R->tooltip);
  R->label = shown(label);
  R->tooltip = tooltip ? shown(tooltip) : NULL;
  R->kind = kind;
  return !R->label || (tooltip && !R->tooltip) ? PROBE_ERR_NOMEM : PROBE_OK;
}

probe_status probe_rankmap_note(probe_rankmap *m, int row, const char *note) {
  if (row < 0 || row >= m->rows || !note) return PROBE_ERR_INVALID_ARG;
  rm_row *R = &m->row[row];
  char *add = shown(note);
  if (!add) return PROBE_ERR_NOMEM;
  if (!R->note) {
    R->note = add;
    return PROBE_OK;
  }
  size_t n = strlen(R->note) + strlen(add) + 3;
  char *both = malloc(n);
  if (!both) {
    free(add);
    return PROBE_ERR_NOMEM;
  }
  snprintf(both, n, "%s; %s", R->note, add);
  free(R->note);
  free(add);
  R->note = both;
  return PROBE_OK;
}

static int col_of(const probe_rankmap *m, int64_t step) {
  return probe__col_of(step, m->x0, m->x1, m->cols);
}

void probe_rankmap_add(probe_rankmap *m, int row, int64_t step,
                       probe_rank_cell c) {
  if (row < 0 || row >= m->rows || c < PROBE_RANK_CELL_NONE ||
      c > PROBE_RANK_CELL_NONFINITE)
    return;
  unsigned char *p = &m->cell[(size_t)row * (size_t)m->cols + (size_t)col_of(m, step)];
  if (c > *p) *p = (unsigned char)c;
  if (step > m->row[row].last) m->row[row].last = step;
}

void probe_rankmap_count_add(probe_rankmap *m, probe_rank_cell c, int64_t n) {
  if (c >= PROBE_RANK_CELL_NONE && c <= PROBE_RANK_CELL_NONFINITE && n > 0)
    m->count[c] += n;
}

void probe_rankmap_set_last(probe_rankmap *m, int row, int64_t step) {
  if (row >= 0 && row < m->rows) m->row[row].last = step;
}

void probe_rankmap_mark_first(probe_rankmap *m, int row, int64_t step) {
  if (row < 0 || row >= m->rows) return;
  m->first_row = row;
  m->first_step = step;
}

void probe_rankmap_mark_stop(probe_rankmap *m, int row) {
  if (row >= 0 && row < m->rows) m->row[row].stop = 1;
}

probe_rank_cell probe_rankmap_cell(const probe_rankmap *m, int row, int col) {
  if (row < 0 || row >= m->rows || col < 0 || col >= m->cols)
    return PROBE_RANK_CELL_NONE;
  return (probe_rank_cell)m->cell[(size_t)row * (size_t)m->cols + (size_t)col];
}

int probe_rankmap_cols(const probe_rankmap *m) { return m->cols; }

int64_t probe_rankmap_last_step(const probe_rankmap *m, int row) {
  return row >= 0 && row < m->rows ? m->row[row].last : -1;
}

int64_t probe_rankmap_count(const probe_rankmap *m, probe_rank_cell c) {
  return c >= PROBE_RANK_CELL_NONE && c <= PROBE_RANK_CELL_NONFINITE
             ? m->count[c]
             : 0;
}

/* ---- drawing -------------------------------------------------------------- */

/* State of merged column c (original columns c*f .. c*f+f-1), worst kept. */
static int merged_cell(const probe_rankmap *m, int row, int c, int f) {
  const unsigned char *p = &m->cell[(size_t)row * (size_t)m->cols];
  int v = 0;
  for (int k = c * f; k < (c + 1) * f && k < m->cols; k++)
    if (p[k] > v) v = p[k];
  return v;
}

/* Whether two rows draw the same: same kind, and for traces the same cells
 * at merge factor f. */
static int same_row(const probe_rankmap *m, int a, int b, int f, int ncols) {
  if (m->row[a].kind != m->row[b].kind) return 0;
  if (m->row[a].kind != PROBE_RANK_ROW_TRACE) return 1;
  for (int c = 0; c < ncols; c++)
    if (merged_cell(m, a, c, f) != merged_cell(m, b, c, f)) return 0;
  return 1;
}

/* Runs the grid needs at merge factor f: per block of identical rows, the
 * runs of one non-empty state (missing/unreadable blocks are one each). */
static long count_runs(const probe_rankmap *m, int f) {
  int ncols = (m->cols + f - 1) / f;
  long runs = 0;
  for (int r = 0; r < m->rows;) {
    int e = r + 1;
    while (e < m->rows && same_row(m, r, e, f, ncols)) e++;
    if (m->row[r].kind != PROBE_RANK_ROW_TRACE) {
      runs++;
    } else {
      int prev = -1;
      for (int c = 0; c < ncols; c++) {
        int v = merged_cell(m, r, c, f);
        if (v != prev && v != PROBE_RANK_CELL_NONE) runs++;
        prev = v;
      }
    }
    r = e;
  }
  return runs;
}

typedef struct rm_geom {
  double gx, gy, gw; /* grid origin and width */
  int rh;            /* row height */
  int f, ncols;      /* merge factor, merged columns */
} rm_geom;

static double col_x(const probe_rankmap *m, const rm_geom *g, int c) {
  int oc = c * g->f;
  if (oc > m->cols) oc = m->cols;
  return g->gx + g->gw * oc / m->cols;
}

static double step_x(const probe_rankmap *m, const rm_geom *g, int64_t s) {
  double span = probe__span(m->x0, m->x1);
  return g->gx + g->gw * (((double)s - (double)m->x0) / span);
}

/* One <path> per state: the runs of every block of identical rows. */
static void draw_cells(const probe_rankmap *m, const rm_geom *g,
                       probe_buf *out) {
  for (int state = 1; state <= 5; state++) {
    int is_row = state >= 4; /* 4 missing, 5 unreadable */
    const char *color = is_row ? row_color[state - 3] : cell_color[state];
    int opened = 0;
    for (int r = 0; r < m->rows;) {
      int e = r + 1;
      while (e < m->rows && same_row(m, r, e, g->f, g->ncols)) e++;
      double y = g->gy + (double)r * g->rh, h = (double)(e - r) * g->rh;
      int kind = m->row[r].kind;
      if (is_row ? kind == state - 3 : kind == PROBE_RANK_ROW_TRACE) {
        int c = 0;
        while (c < g->ncols) {
          int v = is_row ? state : merged_cell(m, r, c, g->f);
          int c1 = c + 1;
          if (!is_row)
            while (c1 < g->ncols && merged_cell(m, r, c1, g->f) == v) c1++;
          else
            c1 = g->ncols;
          if (v == state) {
            if (!opened) {
              probe_buf_printf(out, "<path fill=\"%s\" d=\"", color);
              opened = 1;
            }
            double x0 = col_x(m, g, c), x1 = col_x(m, g, c1);
            probe_buf_printf(out, "M%.1f %.0fh%.1fv%.0fh%.1fz", x0, y,
                             x1 - x0, h, x0 - x1);
          }
          c = c1;
        }
      }
      r = e;
    }
    if (opened) probe_buf_puts(out, "\"/>\n");
  }
}

/* Rank ticks for many rows: every k-th row labelled, k a 1-2-5 step such
 * that labels are at least 14 px apart. */
static int tick_every(int rh) {
  static const int nice[] = {1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000};
  for (size_t i = 0; i < sizeof nice / sizeof nice[0]; i++)
    if (nice[i] * rh >= 14) return nice[i];
  return 5000;
}

static void draw_row_labels(const probe_rankmap *m, const rm_geom *g,
                            probe_buf *out) {
  probe_buf_puts(out, "<g class=\"rl\">");
  int every = g->rh >= RM_LABEL_ROW ? 1 : tick_every(g->rh);
  double font = g->rh >= 13 ? 11.5 : 10.5;
  for (int r = 0; r < m->rows; r += every) {
    double yc = g->gy + (r + 0.5) * g->rh;
    if (every > 1)
      probe_buf_printf(out, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" "
                            "y2=\"%.1f\" stroke=\"#888\"/>",
                       g->gx - 5, yc, g->gx, yc);
    probe_buf_printf(out, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"%.1f\">",
                     g->gx - 7, yc + font * 0.35, font);
    char lab[RM_LABEL_MAX];
    snprintf(lab, sizeof lab, "%s", m->row[r].label ? m->row[r].label : "?");
    probe_buf_escape(out, lab);
    probe_buf_puts(out, "</text>");
  }
  probe_buf_puts(out, "</g>\n");
  if (m->rows > RM_TOOLTIP_ROWS || g->rh < 4) return;
  /* hover: the row's file */
  probe_buf_puts(out, "<g fill=\"transparent\">");
  for (int r = 0; r < m->rows; r++) {
    const rm_row *R = &m->row[r];
    probe_buf_printf(out, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" "
                          "height=\"%d\"><title>",
                     g->gx, g->gy + (double)r * g->rh, g->gw, g->rh);
    probe_buf_escape(out, R->label ? R->label : "");
    if (R->tooltip) {
      probe_buf_puts(out, ": ");
      probe_buf_escape(out, R->tooltip);
    }
    probe_buf_puts(out, "</title></rect>");
  }
  probe_buf_puts(out, "</g>\n");
}

/* s cut to fit px pixels at the notes' font, "..." at the end. */
static void fit_text(char *dst, size_t cap, const char *s, double px) {
  snprintf(dst, cap, "%s", s);
  size_t n = strlen(dst);
  if (probe__text_width(dst, 12) <= px) return;
  while (n > 4) {
    n--;
    while (n > 0 && ((unsigned char)dst[n] & 0xC0) == 0x80) n--; /* UTF-8 */
    memcpy(dst + n, "...", 4);
    if (probe__text_width(dst, 12) <= px) return;
  }
}

/* The first non-finite cell ringed, stop bars, and the notes at the right
 * (label positions pushed down so that they never overlap). Returns the
 * lowest y used. */
static double draw_marks(const probe_rankmap *m, const rm_geom *g,
                         probe_buf *out) {
  if (m->first_row >= 0) {
    int c = col_of(m, m->first_step) / g->f; /* centred on its cell */
    double x = (col_x(m, g, c) + col_x(m, g, c + 1)) / 2;
    double cw = col_x(m, g, c + 1) - col_x(m, g, c), sz = cw > 10 ? cw : 10;
    double rs = g->rh > 10 ? g->rh : 10;
    double yc = g->gy + (m->first_row + 0.5) * g->rh;
    probe_buf_printf(out, "<rect id=\"first-nonfinite\" x=\"%.1f\" "
                          "y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" "
                          "fill=\"none\" stroke=\"#e41a1c\" "
                          "stroke-width=\"2.5\"/>\n",
                     x - sz / 2, yc - rs / 2, sz, rs);
  }
  for (int r = 0; r < m->rows; r++) {
    const rm_row *R = &m->row[r];
    if (!R->stop || R->last < 0) continue;
    double x = step_x(m, g, R->last + 1);
    double y = g->gy + (double)r * g->rh, h = g->rh > 6 ? g->rh : 6;
    probe_buf_printf(out, "<rect class=\"stop\" x=\"%.1f\" y=\"%.1f\" "
                          "width=\"3\" height=\"%.1f\" fill=\"#e41a1c\"/>\n",
                     x, y + g->rh / 2.0 - h / 2, h);
  }
  /* which notes: the first inf/NaN's and the stopped rows' always, then
   * the others in row order, RM_MAX_NOTES in all; drawn in row order */
  int n_notes = 0, picked = 0, extra = 0;
  for (int r = 0; r < m->rows; r++)
    n_notes += m->row[r].note || r == m->first_row;
  unsigned char *pick = calloc((size_t)m->rows, 1);
  for (int pass = 0; pick && pass < 2; pass++)
    for (int r = 0; r < m->rows && picked < RM_MAX_NOTES; r++) {
      const rm_row *R = &m->row[r];
      int key = r == m->first_row || R->stop;
      if (pick[r] || !(R->note || r == m->first_row) || (pass == 0 && !key))
        continue;
      pick[r] = 1;
      picked++;
    }
  extra = n_notes - picked;
  double ny = g->gy + 4, nx = g->gx + g->gw + 14, bottom = g->gy;
  for (int r = 0; pick && r < m->rows; r++) {
    const rm_row *R = &m->row[r];
    if (!pick[r]) continue;
    double yc = g->gy + (r + 0.5) * g->rh;
    double y = yc > ny ? yc : ny;
    probe_buf_printf(out, "<polyline fill=\"none\" stroke=\"#999\" "
                          "points=\"%.1f,%.1f %.1f,%.1f %.1f,%.1f\"/>",
                     g->gx + g->gw + 1, yc, nx - 6, y, nx - 2, y);
    probe_buf_printf(out, "<text class=\"rn\" x=\"%.1f\" y=\"%.1f\">", nx,
                     y + 4);
    char lab[RM_LABEL_MAX + 200], cut[RM_LABEL_MAX + 200];
    snprintf(lab, sizeof lab, "%s: %.180s", R->label ? R->label : "?",
             R->note ? R->note : "first inf/NaN");
    fit_text(cut, sizeof cut, lab, RM_MR - 24);
    probe_buf_escape(out, cut);
    if (strcmp(cut, lab)) { /* the whole note on hover */
      probe_buf_puts(out, "<title>");
      probe_buf_escape(out, lab);
      probe_buf_puts(out, "</title>");
    }
    probe_buf_puts(out, "</text>\n");
    ny = y + RM_NOTE_GAP;
    bottom = y + 6;
  }
  free(pick);
  if (extra) {
    probe_buf_printf(out, "<text class=\"rn\" x=\"%.1f\" y=\"%.1f\">and %d "
                          "more rows with notes (the table below)</text>\n",
                     nx, ny + 4, extra);
    bottom = ny + 6;
  }
  return bottom;
}

/* One legend entry: a swatch (fill, or a red ring / bar) and its text,
 * wrapped to a new line at the right edge. */
static void legend_item(probe_buf *out, const rm_geom *g, double *x,
                        double *y, const char *fill, int kind,
                        const char *text) {
  double w = 16 + probe__text_width(text, 12) + 22;
  if (*x + w > g->gx + g->gw + RM_MR - 10 && *x > g->gx) {
    *x = g->gx;
    *y += 18;
  }
  if (kind == 0)
    probe_buf_printf(out, "<rect x=\"%.1f\" y=\"%.1f\" width=\"12\" "
                          "height=\"12\" fill=\"%s\" stroke=\"#888\"/>",
                     *x, *y, fill);
  else if (kind == 1)
    probe_buf_printf(out, "<rect x=\"%.1f\" y=\"%.1f\" width=\"12\" "
                          "height=\"12\" fill=\"none\" stroke=\"#e41a1c\" "
                          "stroke-width=\"2.5\"/>",
                     *x, *y);
  else
    probe_buf_printf(out, "<rect x=\"%.1f\" y=\"%.1f\" width=\"3\" "
                          "height=\"12\" fill=\"#e41a1c\"/>",
                     *x + 4, *y);
  probe_buf_printf(out, "<text x=\"%.1f\" y=\"%.1f\">", *x + 16, *y + 10.5);
  probe_buf_escape(out, text);
  probe_buf_puts(out, "</text>");
  *x += w;
}

/* Step ticks, the x label and the legend under the grid; returns the
 * lowest y used. */
static double draw_axis_legend(const probe_rankmap *m, const rm_geom *g,
                               double y0, probe_buf *out) {
  double ticks[16];
  int nt = probe_axis_ticks(PROBE_AXIS_LINEAR, (double)m->x0,
                            (double)m->x1, ticks, 10);
  probe_buf_puts(out, "<g class=\"xt\">");
  for (int i = 0; i < nt; i++) {
    double x = step_x(m, g, (int64_t)ticks[i]) +
               g->gw / ((double)(m->x1 - m->x0) + 1.0) / 2;
    char s[32];
    probe__step_text(s, sizeof s, (int64_t)ticks[i]);
    probe_buf_printf(out, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" "
                          "y2=\"%.1f\" stroke=\"#888\"/><text x=\"%.1f\" "
                          "y=\"%.1f\">%s</text>",
                     x, y0, x, y0 + 5, x, y0 + 18, s);
  }
  probe_buf_puts(out, "</g>\n");
  int64_t per = ((m->x1 - m->x0 + 1) + g->ncols - 1) / g->ncols;
  probe_buf_printf(out, "<text class=\"al\" x=\"%.1f\" y=\"%.1f\">step "
                        "(each column: %lld step%s, worst state shown)"
                        "</text>\n",
                   g->gx + g->gw / 2, y0 + 36, (long long)per,
                   per == 1 ? "" : "s");
  int missing = 0, unreadable = 0, stop = 0;
  for (int r = 0; r < m->rows; r++) {
    missing |= m->row[r].kind == PROBE_RANK_ROW_MISSING;
    unreadable |= m->row[r].kind == PROBE_RANK_ROW_UNREADABLE;
    stop |= m->row[r].stop;
  }
  static const char *const what[4] = {NULL, "healthy", "skipped step",
                                      "inf/NaN on this rank"};
  double x = g->gx, y = y0 + 50;
  char text[96];
  for (int c = 1; c <= 3; c++) {
    snprintf(text, sizeof text, "%s (%lld rank-steps)", what[c],
             (long long)m->count[c]);
    legend_item(out, g, &x, &y, cell_color[c], 0, text);
  }
  legend_item(out, g, &x, &y, "#ffffff", 0, "no step recorded");
  if (missing)
    legend_item(out, g, &x, &y, row_color[1], 0, "missing rank (no file)");
  if (unreadable)
    legend_item(out, g, &x, &y, row_color[2], 0, "unreadable file");
  if (m->first_row >= 0)
    legend_item(out, g, &x, &y, NULL, 1, "first inf/NaN of the job");
  if (stop)
    legend_item(out, g, &x, &y, NULL, 2, "stopped first (after its last step)");
  probe_buf_puts(out, "\n");
  return y + 16;
}

probe_status probe_rankmap_render(const probe_rankmap *m, const char *title,
                                  int width, probe_buf *out, int *merged) {
  if (!m || !out || width < RM_ML + RM_MR + 100) return PROBE_ERR_INVALID_ARG;
  rm_geom g;
  g.gx = RM_ML;
  g.gy = RM_MT;
  g.gw = width - RM_ML - RM_MR;
  int rh = RM_GRID_PX / m->rows;
  g.rh = m->rows <= 48 ? RM_ROW_MAX
                       : rh > RM_ROW_MAX ? RM_ROW_MAX
                                         : rh < RM_ROW_MIN ? RM_ROW_MIN : rh;
  /* merge columns until cells are wide enough and the runs fit */
  g.f = 1;
  while ((double)g.f * g.gw / m->cols < RM_MIN_CELL_PX && g.f < m->cols)
    g.f *= 2;
  while (g.f < m->cols && count_runs(m, g.f) > PROBE_RANKMAP_MAX_RUNS)
    g.f *= 2;
  g.ncols = (m->cols + g.f - 1) / g.f;
  if (merged) *merged = g.f;

  double gh = (double)m->rows * g.rh;
  probe_buf body; /* drawn first: the height depends on the notes */
  probe_buf_init(&body);
  probe_buf_printf(&body, "<text class=\"pt\" x=\"%.1f\" y=\"18\">", g.gx);
  probe_buf_escape(&body, title ? title : "Ranks x steps");
  probe_buf_puts(&body, "</text>\n");
  probe_buf_printf(&body, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" "
                          "height=\"%.1f\" fill=\"#ffffff\" "
                          "stroke=\"#bbb\"/>\n",
                   g.gx, g.gy, g.gw, gh);
  draw_cells(m, &g, &body);
  draw_row_labels(m, &g, &body);
  double bottom = draw_marks(m, &g, &body);
  double lb = draw_axis_legend(m, &g, g.gy + gh, &body);
  double h = lb + 8;
  if (bottom + 10 > h) h = bottom + 10;
  probe_buf_printf(out, "<svg xmlns=\"http://www.w3.org/2000/svg\" "
                        "id=\"rankmap\" width=\"%d\" height=\"%d\" "
                        "viewBox=\"0 0 %d %d\" role=\"img\">\n",
                   width, (int)ceil(h), width, (int)ceil(h));
  if (body.len) probe_buf_append(out, body.data, body.len);
  probe_buf_puts(out, "</svg>\n");
  int oom = body.oom;
  probe_buf_free(&body);
  if (oom || out->oom) return PROBE_ERR_NOMEM;
  return PROBE_OK;
}
