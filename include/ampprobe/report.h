/*
 * ampprobe/report.h - the report library: a small SVG plotting library of our
 * own and the builder of the self-contained HTML report (`ampprobe report`).
 *
 * Plotting: text goes into a growable probe_buf; long series are reduced to
 * at most four points per pixel column by probe_bins (first, min, max, last
 * of each column: the "M4" reduction, so a one-step spike always survives);
 * layers x steps values go into a probe_grid whose cells keep the worst value
 * (min or max) of what fell into them. probe_plot draws line plots with
 * linear, log10 or log2 axes, markers, reference lines and a legend;
 * probe_heatmap_render draws a grid with row labels and a colour bar.
 *
 * Report: a probe_report is fed in chunks (steps, records, scaler events of
 * a trace, the baseline's steps) and bins them as they come, so its memory is
 * bounded by the plot sizes, not by the trace length. Text sections and
 * tables (diagnosis, diff, bisect) are added as given by the tools that
 * computed them. probe_report_write emits one HTML file with inline CSS and
 * inline SVG: no network, scripts, fonts or stylesheets from outside.
 *
 * Every call returns a probe_status and never exits.
 */
#ifndef AMPPROBE_REPORT_H
#define AMPPROBE_REPORT_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "ampprobe/probe.h"
#include "ampprobe/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- text buffer ---------------------------------------------------------- */

typedef struct probe_buf {
  char *data; /* NUL-terminated when len > 0 */
  size_t len;
  size_t cap;
  int oom;    /* sticky: an allocation failed, the text is incomplete */
} probe_buf;

void probe_buf_init(probe_buf *b);
void probe_buf_free(probe_buf *b);
probe_status probe_buf_append(probe_buf *b, const char *s, size_t n);
probe_status probe_buf_puts(probe_buf *b, const char *s);
probe_status probe_buf_printf(probe_buf *b, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
/* Appends s with &, <, >, " and ' escaped for HTML/XML text and attributes;
 * newline, tab and CR are kept (text blocks are lines); any other control
 * character (C0, DEL, C1 U+0080..U+009F, a bidi control such as U+202E)
 * and bytes that are not UTF-8 are written as on the terminal by
 * probe_text_escape (\e, \x7f, \u009b, \u202e, \xHH), so the page never
 * holds a raw control nor a byte invalid in XML. */
probe_status probe_buf_escape(probe_buf *b, const char *s);

/* ---- downsampling: min and max per pixel column (M4) ---------------------- */

/* One column: the first, last, smallest and largest finite value that fell
 * in it, with the x (step) of each; non-finite values are only counted. */
typedef struct probe_bin {
  int64_t n;           /* finite values */
  int64_t n_nan;
  int64_t n_inf;
  double first, last, min, max;
  int64_t first_x, last_x, min_x, max_x;
} probe_bin;

typedef struct probe_bins {
  int ncols;
  int64_t x0, x1;      /* inclusive x (step) range mapped onto the columns */
  probe_bin *bin;      /* (ncols) */
} probe_bins;

probe_status probe_bins_init(probe_bins *b, int ncols, int64_t x0, int64_t x1);
void probe_bins_free(probe_bins *b);
/* Column of x: floor((x - x0) * ncols / (x1 - x0 + 1)), clamped. */
int probe_bins_col(const probe_bins *b, int64_t x);
void probe_bins_add(probe_bins *b, int64_t x, double y);
/* Writes the reduced polyline, in x order: per column its first, min and max
 * (in the order they occurred) and last point, duplicates dropped. At most
 * 4*ncols points; returns how many were written (max bounds the writes). */
size_t probe_bins_points(const probe_bins *b, int64_t *xs, double *ys,
                         size_t max);

/* ---- layers x steps grid -------------------------------------------------- */

typedef enum probe_grid_agg {
  PROBE_GRID_MIN = 0, /* a cell keeps the smallest value (headroom) */
  PROBE_GRID_MAX = 1, /* a cell keeps the largest value (fractions) */
} probe_grid_agg;

typedef struct probe_grid {
  int rows, cols;
  int64_t x0, x1;      /* inclusive step range over the columns */
  probe_grid_agg agg;
  float *val;          /* (rows, cols); NaN where no finite value came */
  uint32_t *count;     /* (rows, cols) values that fell in the cell */
  uint32_t *nonfinite; /* (rows, cols) of them flagged non-finite */
} probe_grid;

probe_status probe_grid_init(probe_grid *g, int rows, int cols, int64_t x0,
                             int64_t x1, probe_grid_agg agg);
/* Gives g `rows` rows, keeping the cells of those it has (new rows empty:
 * NaN, counts 0); fewer rows drop the last ones. PROBE_ERR_NOMEM leaves g
 * as it was, or with larger buffers and the same rows. */
probe_status probe_grid_resize_rows(probe_grid *g, int rows);
void probe_grid_free(probe_grid *g);
/* Adds one value at (row, step). nonfinite marks the cell (the tensor held
 * inf/NaN); value may be NaN when there is no finite value to keep. */
void probe_grid_add(probe_grid *g, int row, int64_t x, double value,
                    int nonfinite);
/* Cell accessors, (row, col) in range. */
float probe_grid_val(const probe_grid *g, int row, int col);

/* ---- plots ---------------------------------------------------------------- */

typedef enum probe_axis_scale {
  PROBE_AXIS_LINEAR = 0,
  PROBE_AXIS_LOG10 = 1, /* ticks at powers of ten */
  PROBE_AXIS_LOG2 = 2,  /* ticks at powers of two, labelled 2^k */
} probe_axis_scale;

typedef enum probe_marker {
  PROBE_MARKER_CIRCLE = 0,
  PROBE_MARKER_TRIANGLE_UP = 1,
  PROBE_MARKER_TRIANGLE_DOWN = 2,
  PROBE_MARKER_CROSS = 3,
  PROBE_MARKER_DIAMOND = 4,
  PROBE_MARKER_TICK = 5, /* short vertical bar at the bottom edge */
} probe_marker;

typedef struct probe_plot probe_plot;

/* width, height: the whole SVG in pixels, margins included. */
probe_status probe_plot_new(probe_plot **out, const char *title, int width,
                            int height);
void probe_plot_free(probe_plot *p);
/* Axis labels should carry units ("step", "loss scale (log2)"). lo/hi NaN:
 * fitted to the data. */
probe_status probe_plot_x_axis(probe_plot *p, const char *label, int64_t lo,
                               int64_t hi);
probe_status probe_plot_y_axis(probe_plot *p, probe_axis_scale scale,
                               const char *label, double lo, double hi);
/* Width in pixels of the data area: the column count to bin series with. */
int probe_plot_data_width(const probe_plot *p);
/* A series reduced by probe_bins (copied). Non-finite values of the bins are
 * drawn as markers on the top edge of the plot in nonfinite_color when that
 * is not NULL. dash: NULL for solid, else an SVG dash array ("6 3"). */
probe_status probe_plot_add_line(probe_plot *p, const probe_bins *b,
                                 const char *color, const char *label,
                                 const char *dash,
                                 const char *nonfinite_color);
/* Markers at (x, y) (copied). Non-finite y: drawn on the top edge. */
probe_status probe_plot_add_markers(probe_plot *p, const int64_t *x,
                                    const double *y, size_t n,
                                    probe_marker m, const char *color,
                                    const char *label);
/* Horizontal / vertical reference lines with a legend entry. */
probe_status probe_plot_add_hline(probe_plot *p, double y, const char *color,
                                  const char *label, const char *dash);
probe_status probe_plot_add_vline(probe_plot *p, int64_t x, const char *color,
                                  const char *label, const char *dash);
/* A one-line note drawn in the plot (e.g. "no data"). */
probe_status probe_plot_set_note(probe_plot *p, const char *note);
/* Appends <svg>...</svg>. */
probe_status probe_plot_render(const probe_plot *p, probe_buf *out);

/* Tick positions of an axis over [lo, hi]: at most max ticks, "nice" values
 * (1, 2, 5 x 10^k on linear axes; powers of 10 or 2 on log axes, thinned).
 * Returns the count. Exposed for tests. */
int probe_axis_ticks(probe_axis_scale scale, double lo, double hi,
                     double *ticks, int max);

/* ---- heatmaps ------------------------------------------------------------- */

/* A colour scale: stops in increasing value order, colours 0xRRGGBB. */
typedef struct probe_colormap {
  int n;
  double value[8];
  uint32_t rgb[8];
} probe_colormap;

uint32_t probe_colormap_at(const probe_colormap *cm, double v);

typedef struct probe_heatmap_opts {
  const char *title;
  const char *x_label;        /* "step" */
  const char *value_label;    /* colour bar caption, with units */
  const char *const *row_labels; /* (rows); long ones are shortened */
  probe_colormap cmap;        /* values clamped to the first/last stop */
  const char *nonfinite_label; /* legend of non-finite cells */
  const char *empty_label;     /* legend of cells without data */
  int width;                  /* whole SVG; the height follows the rows */
  int row_height;             /* pixels per layer row; >= 10 keeps labels
                                 readable whatever the layer count */
  /* Labels of the colour bar's stops (cmap.n of them). NULL: the stop
   * values, the first marked <= and the last + (values beyond the ends are
   * clamped: right for headroom in binades, wrong for a fraction, which
   * passes e.g. {"0%", "5%", ..., "100%"}). */
  const char *const *stop_labels;
  /* A line drawn over the grid (NULL: none), e.g. when every cell is
   * non-finite and the colours say nothing. */
  const char *note;
} probe_heatmap_opts;

probe_status probe_heatmap_render(const probe_grid *g,
                                  const probe_heatmap_opts *o,
                                  probe_buf *out);

/* ---- ranks x steps (a trace set: the ranks of one job) -------------------- */

/* What a cell of the ranks x steps view shows: the worst of the steps of
 * the rank that fell in its column (NONFINITE > SKIPPED > HEALTHY > NONE). */
typedef enum probe_rank_cell {
  PROBE_RANK_CELL_NONE = 0,      /* no step of this rank in the column */
  PROBE_RANK_CELL_HEALTHY = 1,   /* recorded, finite, optimizer step taken */
  PROBE_RANK_CELL_SKIPPED = 2,   /* optimizer step skipped (found_inf), with
                                    nothing of this rank's inf/NaN */
  PROBE_RANK_CELL_NONFINITE = 3, /* a record, the loss or the gradient norm
                                    of this rank held inf/NaN */
} probe_rank_cell;

/* A row: a readable trace, or a rank the set should hold but does not. */
typedef enum probe_rank_row {
  PROBE_RANK_ROW_TRACE = 0,
  PROBE_RANK_ROW_MISSING = 1,    /* the world size says so; no file */
  PROBE_RANK_ROW_UNREADABLE = 2, /* a file that cannot be read */
} probe_rank_row;

/* Rows of a map at most, and the SVG runs it draws at most: columns are
 * merged (worst state) until the cells fit, so the page stays bounded
 * (docs/report.md). */
#define PROBE_RANKMAP_MAX_ROWS 4096
#define PROBE_RANKMAP_MAX_RUNS 12000

typedef struct probe_rankmap probe_rankmap;

/* rows x cols cells over the inclusive step range [x0, x1]; cols is
 * clamped to the number of steps. The cells are in shared anonymous
 * memory: probe_rankmap_add in a child forked after this call fills the
 * parent's map (the rest of the map is not shared). */
probe_status probe_rankmap_new(probe_rankmap **out, int rows, int cols,
                               int64_t x0, int64_t x1);
void probe_rankmap_free(probe_rankmap *m);
/* A row's short label ("rank 3"), kind, and a tooltip (the file; may be
 * NULL). Copied; shown escaped. */
probe_status probe_rankmap_set_row(probe_rankmap *m, int row,
                                   const char *label, probe_rank_row kind,
                                   const char *tooltip);
/* A note on a row, drawn at the right of the grid with a leader line
 * ("stopped first: last step 41"); at most a few are drawn, the rest are
 * counted. Appended to any earlier note of the row. */
probe_status probe_rankmap_note(probe_rankmap *m, int row, const char *note);
/* One step of a row: its cell keeps the worst state. */
void probe_rankmap_add(probe_rankmap *m, int row, int64_t step,
                       probe_rank_cell c);
/* The (rank, step) pairs in a state, for the legend: a step is added to
 * its cell once per record that says something of it, so the caller, who
 * knows each step's final state, counts them. */
void probe_rankmap_count_add(probe_rankmap *m, probe_rank_cell c, int64_t n);
/* The last step of a row (probe_rankmap_add keeps it in this process; a
 * caller whose worker process filled the cells says it here). */
void probe_rankmap_set_last(probe_rankmap *m, int row, int64_t step);
/* Marks the cell of the job's first non-finite value (ringed in red). */
void probe_rankmap_mark_first(probe_rankmap *m, int row, int64_t step);
/* Marks a row whose rank stopped first: a red bar after its last step. */
void probe_rankmap_mark_stop(probe_rankmap *m, int row);
/* Cell and row accessors (for tests and the tool): the state of (row, col)
 * at the map's own column count, the last step added to a row (-1: none),
 * and the (rank, step) pairs counted per state. */
probe_rank_cell probe_rankmap_cell(const probe_rankmap *m, int row, int col);
int probe_rankmap_cols(const probe_rankmap *m);
int64_t probe_rankmap_last_step(const probe_rankmap *m, int row);
int64_t probe_rankmap_count(const probe_rankmap *m, probe_rank_cell c);
/* Appends <svg>...</svg>: width the whole SVG in pixels; the height follows
 * the rows (14 px each up to 48 rows, down to 2 px at 360+ rows, with rank
 * ticks instead of a label per row). The column merge factor used is
 * returned in *merged (may be NULL). */
probe_status probe_rankmap_render(const probe_rankmap *m, const char *title,
                                  int width, probe_buf *out, int *merged);

/* ---- the HTML report ------------------------------------------------------ */

typedef struct probe_report probe_report;

typedef struct probe_report_options {
  const char *title;   /* page title ("ampprobe report: run.h5") */
  int width;           /* plot width in pixels (1200) */
  int heat_cols;       /* step columns of the heatmaps (400) */
} probe_report_options;

void probe_report_options_init(probe_report_options *o);

typedef enum probe_report_verdict {
  PROBE_REPORT_UNKNOWN = 0,
  PROBE_REPORT_HEALTHY = 1,
  PROBE_REPORT_PROBLEM = 2,
} probe_report_verdict;

/* Where a text/table section goes on the page. */
typedef enum probe_report_place {
  PROBE_REPORT_TOP = 0,    /* under the diagnosis, above the plots */
  PROBE_REPORT_DIFF = 1,   /* the baseline comparison */
  PROBE_REPORT_BISECT = 2, /* the bisect trials */
  PROBE_REPORT_END = 3,    /* notes at the end */
  PROBE_REPORT_RANKS = 4,  /* under the ranks x steps view */
} probe_report_place;

probe_status probe_report_new(probe_report **out,
                              const probe_report_options *o);
void probe_report_free(probe_report *r);

/* A key/value line of the header (trace path, created, policy, ...). */
probe_status probe_report_add_meta(probe_report *r, const char *key,
                                   const char *value);
/* The post-mortem diagnosis shown first: a one-line headline and the body
 * (preformatted text). */
probe_status probe_report_set_diagnosis(probe_report *r,
                                        probe_report_verdict v,
                                        const char *headline,
                                        const char *body);
/* Layers of the run (rows of the heatmaps, in this order). Copied. */
probe_status probe_report_set_layers(probe_report *r,
                                     const probe_layer_info *layers,
                                     size_t n);
/* Inclusive step range of the x axes; must be set before any data is added
 * (use the union of the run's and the baseline's ranges). */
probe_status probe_report_set_range(probe_report *r, int64_t first_step,
                                    int64_t last_step);

/* Streaming input, any chunk size; steps and records in step order. */
probe_status probe_report_add_steps(probe_report *r,
                                    const probe_step_scalars *s, size_t n);
probe_status probe_report_add_baseline_steps(probe_report *r,
                                             const probe_step_scalars *s,
                                             size_t n);
probe_status probe_report_add_scaler_events(probe_report *r,
                                            const probe_scaler_event *e,
                                            size_t n);
probe_status probe_report_add_records(probe_report *r, const probe_record *rec,
                                      size_t n);
/* The step where the run's loss curve parts from the baseline's (from the
 * diff engine); drawn on the loss plot. */
probe_status probe_report_set_part_step(probe_report *r, int64_t step);
/* Whether the run had dynamic loss scaling on, as the caller knows it
 * (ampprobe report passes the post-mortem's answer, read from the trace's
 * stored config). Without it the loss-scale plot guesses from the data: off
 * when the scale was 1 at every step. */
probe_status probe_report_set_scaling(probe_report *r, int on);
/* A label for the baseline series ("FP32 baseline"). */
probe_status probe_report_set_baseline_label(probe_report *r,
                                             const char *label);

/* A section of preformatted text (body may be NULL) at a place. */
probe_status probe_report_add_text(probe_report *r, probe_report_place at,
                                   const char *title, const char *body);
/* The same, folded: shown as a <details> element the reader opens. */
probe_status probe_report_add_folded_text(probe_report *r,
                                          probe_report_place at,
                                          const char *title, const char *body);
/* A table section: headers (ncols strings), then rows added one at a time.
 * *table_id identifies it for probe_report_table_row. */
probe_status probe_report_add_table(probe_report *r, probe_report_place at,
                                    const char *title, int ncols,
                                    const char *const *headers,
                                    int *table_id);
probe_status probe_report_table_row(probe_report *r, int table_id,
                                    const char *const *cells);

/* A trace set: the ranks x steps view, drawn under the diagnosis with the
 * PROBE_REPORT_RANKS sections, above the chosen rank's panels. The report
 * takes m (freed with it); help is the text above the view. */
probe_status probe_report_set_rankmap(probe_report *r, probe_rankmap *m,
                                      const char *title, const char *help);

/* Writes the whole page. It starts with exactly PROBE_REPORT_HEAD, whose
 * generator tag tells a page of ours from any other file (`report -o`
 * replaces its own earlier page, and refuses anything else without
 * --force). */
probe_status probe_report_write(probe_report *r, FILE *f);
#define PROBE_REPORT_HEAD                                                      \
  "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n"        \
  "<meta name=\"generator\" content=\"ampprobe report\">\n"

/* How many records were added and how many fell outside the layers or the
 * step range (clamped or dropped). For tests and the tool's summary. */
typedef struct probe_report_counts {
  int64_t steps, baseline_steps, records, scaler_events;
  int64_t records_dropped; /* unknown layer id */
} probe_report_counts;
void probe_report_get_counts(const probe_report *r, probe_report_counts *c);

#ifdef __cplusplus
}
#endif
#endif /* AMPPROBE_REPORT_H */
