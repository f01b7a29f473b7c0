/*
 * tests/reports/test_report.c - Check suites for the report library: the
 * text buffer and escaping, the min/max-per-column reduction (a one-step
 * spike must survive 10,000 steps -> 500 columns), the heatmap grid, axis
 * ticks, the SVG plot and heatmap renderers, and the HTML report builder
 * (self-contained, sections in order, bounded size).
 */
#define _POSIX_C_SOURCE 200809L /* open_memstream */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ampprobe/report.h"

static int count_substr(const char *hay, const char *needle) {
  int n = 0;
  size_t k = strlen(needle);
  for (const char *p = strstr(hay, needle); p; p = strstr(p + k, needle)) n++;
  return n;
}

/* ---- buffer --------------------------------------------------------------- */

START_TEST(test_buf_escape) {
  probe_buf b;
  probe_buf_init(&b);
  ck_assert_int_eq(probe_buf_escape(&b, "a<b>&\"c'd"), PROBE_OK);
  ck_assert_str_eq(b.data, "a&lt;b&gt;&amp;&quot;c&#39;d");
  b.len = 0;
  /* invalid UTF-8 (lone continuation, overlong) and a control byte: shown
   * as on the terminal (probe_text_escape) */
  ck_assert_int_eq(probe_buf_escape(&b, "x\x80y\xC0\xAFz\x01"), PROBE_OK);
  ck_assert_str_eq(b.data, "x\\x80y\\xc0\\xafz\\x01");
  b.len = 0;
  /* ESC, DEL and the C1 CSI (U+009B) are controls: never raw (they were:
   * DEL and C1 passed through, a C0 became U+FFFD); newline and tab stay */
  ck_assert_int_eq(probe_buf_escape(&b, "a\x1b[2J\x7f\xC2\x9b" "31m\n\tb"), PROBE_OK);
  ck_assert_str_eq(b.data, "a\\e[2J\\x7f\\u009b31m\n\tb");
  b.len = 0;
  ck_assert_int_eq(probe_buf_escape(&b, "\xC3\xA9\xE2\x80\x96"), PROBE_OK);
  ck_assert_str_eq(b.data, "\xC3\xA9\xE2\x80\x96"); /* valid UTF-8 kept */
  b.len = 0;
  /* bidi controls (U+202E, U+2066..U+2069, U+200E/F, U+061C) reorder the
   * text after them on the page: escaped as on the terminal, never raw */
  ck_assert_int_eq(probe_buf_escape(&b, "fc1\xE2\x80\xAE<1cf>\xE2\x81\xA6x"
                                        "\xE2\x81\xA9\xE2\x80\x8F\xD8\x9C"), PROBE_OK);
  ck_assert_str_eq(b.data, "fc1\\u202e&lt;1cf&gt;\\u2066x\\u2069\\u200f\\u061c");
  probe_buf_free(&b);
}
END_TEST

START_TEST(test_buf_printf_long) {
  probe_buf b;
  probe_buf_init(&b);
  char big[5000];
  memset(big, 'q', sizeof big - 1);
  big[sizeof big - 1] = '\0';
  ck_assert_int_eq(probe_buf_printf(&b, "<%s>", big), PROBE_OK);
  ck_assert_uint_eq(b.len, sizeof big + 1);
  ck_assert_int_eq(b.data[0], '<');
  ck_assert_int_eq(b.data[b.len - 1], '>');
  probe_buf_free(&b);
}
END_TEST

/* ---- downsampling ----------------------------------------------------------- */

/* The spike: one step of 10,000 at loop position _i, up or down. */
START_TEST(test_bins_spike_survives) {
  const int64_t N = 10000;
  const int64_t spike_at[] = {0, 1, 137, 4999, 5000, 7777, 9998, 9999};
  int64_t at = spike_at[_i % 8];
  double sign = _i < 8 ? 1.0 : -1.0;
  probe_bins b;
  ck_assert_int_eq(probe_bins_init(&b, 500, 0, N - 1), PROBE_OK);
  ck_assert_int_eq(b.ncols, 500);
  for (int64_t s = 0; s < N; s++) {
    double y = 1.0 + 0.01 * sin((double)s * 0.37); /* noise in [0.99, 1.01] */
    if (s == at) y = 1.0 + sign * 1000.0;
    probe_bins_add(&b, s, y);
  }
  int64_t xs[2000];
  double ys[2000];
  size_t n = probe_bins_points(&b, xs, ys, 2000);
  ck_assert_uint_le(n, 2000);
  ck_assert_uint_ge(n, 500); /* at least one point per column */
  int found = 0;
  for (size_t k = 0; k < n; k++) {
    if (k) ck_assert_int_ge(xs[k], xs[k - 1]); /* in step order */
    if (xs[k] == at && ys[k] == 1.0 + sign * 1000.0) found = 1;
  }
  ck_assert_msg(found, "spike at step %lld lost", (long long)at);

  /* what plain striding (every 20th step) would do: it loses the spike
   * unless it happens to land on it; this proves the test can fail */
  if (at % 20 != 0) {
    int strided = 0;
    for (int64_t s = 0; s < N; s += 20) strided |= (s == at);
    ck_assert(!strided);
  }
  probe_bins_free(&b);
}
END_TEST

START_TEST(test_bins_columns_and_nonfinite) {
  probe_bins b;
  /* fewer steps than columns: one column per step */
  ck_assert_int_eq(probe_bins_init(&b, 500, 10, 19), PROBE_OK);
  ck_assert_int_eq(b.ncols, 10);
  ck_assert_int_eq(probe_bins_col(&b, 10), 0);
  ck_assert_int_eq(probe_bins_col(&b, 19), 9);
  ck_assert_int_eq(probe_bins_col(&b, 5), 0);    /* clamped */
  ck_assert_int_eq(probe_bins_col(&b, 1000), 9); /* clamped */
  probe_bins_add(&b, 12, NAN);
  probe_bins_add(&b, 13, INFINITY);
  probe_bins_add(&b, 14, 2.0);
  ck_assert_int_eq(b.bin[2].n_nan, 1);
  ck_assert_int_eq(b.bin[3].n_inf, 1);
  ck_assert_int_eq(b.bin[2].n, 0);
  int64_t xs[64];
  double ys[64];
  ck_assert_uint_eq(probe_bins_points(&b, xs, ys, 64), 1); /* only finite */
  probe_bins_free(&b);

  /* a constant series reduces to at most 2 points per column */
  ck_assert_int_eq(probe_bins_init(&b, 100, 0, 9999), PROBE_OK);
  for (int64_t s = 0; s < 10000; s++) probe_bins_add(&b, s, 3.0);
  size_t n = probe_bins_points(&b, xs, ys, 64);
  ck_assert_uint_eq(n, 64); /* bounded by max */
  int64_t *xb = malloc(400 * sizeof *xb);
  double *yb = malloc(400 * sizeof *yb);
  n = probe_bins_points(&b, xb, yb, 400);
  ck_assert_uint_eq(n, 200);
  free(xb);
  free(yb);
  /* columns partition the range evenly: 100 steps each */
  ck_assert_int_eq(b.bin[0].n, 100);
  ck_assert_int_eq(b.bin[99].n, 100);
  ck_assert_int_eq(b.bin[0].first_x, 0);
  ck_assert_int_eq(b.bin[0].last_x, 99);
  probe_bins_free(&b);
  ck_assert_int_eq(probe_bins_init(&b, 0, 0, 10), PROBE_ERR_INVALID_ARG);
  ck_assert_int_eq(probe_bins_init(&b, 10, 5, 4), PROBE_ERR_INVALID_ARG);
}
END_TEST

/* ---- grid ----------------------------------------------------------------- */

START_TEST(test_grid_aggregates) {
  probe_grid g;
  ck_assert_int_eq(probe_grid_init(&g, 3, 10, 0, 999, PROBE_GRID_MIN),
                   PROBE_OK);
  for (int64_t s = 0; s < 1000; s++) probe_grid_add(&g, 1, s, 10.0, 0);
  probe_grid_add(&g, 1, 555, 0.5, 0); /* one low step in column 5 */
  probe_grid_add(&g, 2, 42, NAN, 1);  /* all non-finite */
  probe_grid_add(&g, 7, 42, 1.0, 0);  /* unknown row: ignored */
  ck_assert_float_eq(probe_grid_val(&g, 1, 5), 0.5f);
  ck_assert_float_eq(probe_grid_val(&g, 1, 4), 10.0f);
  ck_assert(isnan(probe_grid_val(&g, 0, 0)));
  ck_assert_uint_eq(g.count[0], 0);
  ck_assert_uint_eq(g.count[1 * 10 + 5], 101);
  ck_assert_uint_eq(g.nonfinite[2 * 10 + 0], 1);
  ck_assert(isnan(probe_grid_val(&g, 2, 0)));
  probe_grid_free(&g);

  ck_assert_int_eq(probe_grid_init(&g, 1, 4, 0, 3, PROBE_GRID_MAX), PROBE_OK);
  probe_grid_add(&g, 0, 2, 0.1, 0);
  probe_grid_add(&g, 0, 2, 0.7, 0);
  probe_grid_add(&g, 0, 2, 0.3, 0);
  ck_assert_float_eq(probe_grid_val(&g, 0, 2), 0.7f);
  probe_grid_free(&g);
}
END_TEST

/* Steps up to 2^63 - 1 (a trace's steps are int64 >= 0; the reader takes any
 * increasing ones): x1 - x0 + 1 and (x - x0) * columns overflowed int64 -
 * a negative column, heap corruption in `report` (found 2026-12-04 by a
 * hostile-input hunt). Columns stay in range and in step order, the ends
 * land in the first and last column, and the plot and heatmap render. */
START_TEST(test_bins_huge_steps) {
  static const int64_t hi[] = {INT64_C(1) << 62, INT64_MAX, INT64_MAX - 1};
  static const int64_t lo[] = {0, 0, INT64_C(1) << 61};
  for (size_t k = 0; k < 3; k++) {
    probe_bins b;
    ck_assert_int_eq(probe_bins_init(&b, 1092, lo[k], hi[k]), PROBE_OK);
    ck_assert_int_eq(b.ncols, 1092);
    int prev = 0;
    for (int i = 0; i <= 64; i++) { /* lo .. hi in 64 steps, and past hi */
      /* in double: lo + (hi - lo) * i / 64 overflows int64 near the top */
      double xd = (double)lo[k] + ((double)hi[k] - (double)lo[k]) / 64.0 * i;
      int64_t x = i == 64 || xd >= (double)hi[k] ? hi[k] : (int64_t)xd;
      int c = probe_bins_col(&b, x);
      ck_assert_int_ge(c, prev);
      ck_assert_int_lt(c, b.ncols);
      prev = c;
      probe_bins_add(&b, x, (double)i);
    }
    ck_assert_int_eq(probe_bins_col(&b, lo[k]), 0);
    ck_assert_int_eq(probe_bins_col(&b, hi[k] - 1), b.ncols - 1);
    ck_assert_int_eq(probe_bins_col(&b, hi[k]), b.ncols - 1);
    probe_bins_add(&b, hi[k] - 1, NAN);

    probe_plot *p = NULL;
    ck_assert_int_eq(probe_plot_new(&p, "huge steps", 1200, 300), PROBE_OK);
    probe_plot_x_axis(p, "step", lo[k], hi[k]);
    probe_plot_y_axis(p, PROBE_AXIS_LINEAR, "v", NAN, NAN);
    ck_assert_int_eq(probe_plot_add_line(p, &b, NULL, "v", NULL, "#d62728"),
                     PROBE_OK);
    probe_buf o;
    probe_buf_init(&o);
    ck_assert_int_eq(probe_plot_render(p, &o), PROBE_OK);
    ck_assert_ptr_null(strstr(o.data, "nan"));
    ck_assert_ptr_null(strstr(o.data, "x=\"-"));
    probe_buf_free(&o);
    probe_plot_free(p);
    probe_bins_free(&b);

    probe_grid g;
    ck_assert_int_eq(probe_grid_init(&g, 2, 600, lo[k], hi[k], PROBE_GRID_MAX),
                     PROBE_OK);
    probe_grid_add(&g, 0, lo[k], 1.0, 0);
    probe_grid_add(&g, 1, hi[k] - 1, 2.0, 0);
    probe_grid_add(&g, 1, lo[k] + (hi[k] - lo[k]) / 2, 3.0, 0);
    ck_assert_float_eq(probe_grid_val(&g, 0, 0), 1.0f);
    ck_assert_float_eq(probe_grid_val(&g, 1, 599), 2.0f);
    /* the middle: column 299 or 300 (past 2^64 / columns steps the
     * column is computed in double, a pixel then being 2^52 steps) */
    ck_assert(probe_grid_val(&g, 1, 299) == 3.0f ||
              probe_grid_val(&g, 1, 300) == 3.0f);
    static const char *const rows[2] = {"a", "b"};
    probe_heatmap_opts h;
    memset(&h, 0, sizeof h);
    h.title = "t";
    h.row_labels = rows;
    h.width = 800;
    h.row_height = 12;
    h.cmap = (probe_colormap){2, {0, 4}, {0xffffff, 0}};
    probe_buf_init(&o);
    ck_assert_int_eq(probe_heatmap_render(&g, &h, &o), PROBE_OK);
    ck_assert_ptr_nonnull(strstr(o.data, "steps per column"));
    ck_assert_ptr_null(strstr(o.data, "(-"));
    probe_buf_free(&o);
    probe_grid_free(&g);
  }
}
END_TEST

/* ---- ticks ---------------------------------------------------------------- */

START_TEST(test_ticks) {
  double t[32];
  int n = probe_axis_ticks(PROBE_AXIS_LINEAR, 0, 10000, t, 11);
  ck_assert_int_ge(n, 5);
  ck_assert_int_le(n, 11);
  ck_assert_double_eq(t[0], 0);
  for (int i = 1; i < n; i++) {
    double step = t[1] - t[0];
    ck_assert_double_eq_tol(t[i] - t[i - 1], step, 1e-9);
    double m = step / pow(10, floor(log10(step)));
    ck_assert(fabs(m - 1) < 1e-9 || fabs(m - 2) < 1e-9 ||
              fabs(m - 2.5) < 1e-9 || fabs(m - 5) < 1e-9);
  }
  n = probe_axis_ticks(PROBE_AXIS_LINEAR, -0.3, 0.7, t, 6);
  for (int i = 0; i < n; i++) {
    ck_assert(t[i] >= -0.3 - 1e-12 && t[i] <= 0.7 + 1e-12);
  }
  /* log10: powers of ten inside the range */
  n = probe_axis_ticks(PROBE_AXIS_LOG10, 0.003, 2e4, t, 12);
  ck_assert_int_eq(n, 7); /* 0.01 .. 1e4 */
  ck_assert_double_eq_tol(t[0], 0.01, 1e-15);
  ck_assert_double_eq_tol(t[6], 1e4, 1e-9);
  /* log2 over 2^0..2^24 with at most 7 ticks: thinned, powers of two */
  n = probe_axis_ticks(PROBE_AXIS_LOG2, 1, 16777216, t, 7);
  ck_assert_int_le(n, 7);
  ck_assert_int_ge(n, 4);
  for (int i = 0; i < n; i++) {
    double e = log2(t[i]);
    ck_assert_double_eq_tol(e, round(e), 1e-12);
  }
  ck_assert_int_eq(probe_axis_ticks(PROBE_AXIS_LOG10, -1, 10, t, 5), 0);
  ck_assert_int_eq(probe_axis_ticks(PROBE_AXIS_LINEAR, NAN, 10, t, 5), 0);
}
END_TEST

/* ---- plot ----------------------------------------------------------------- */

START_TEST(test_plot_render) {
  probe_plot *p;
  ck_assert_int_eq(probe_plot_new(&p, "Loss <&>", 900, 300), PROBE_OK);
  int cols = probe_plot_data_width(p);
  ck_assert_int_eq(cols, 900 - 108);
  probe_bins b;
  ck_assert_int_eq(probe_bins_init(&b, cols, 0, 9999), PROBE_OK);
  for (int64_t s = 0; s < 10000; s++)
    probe_bins_add(&b, s, s == 3000 ? NAN : 1.0 + (s == 6000 ? 50.0 : 0.0));
  probe_plot_x_axis(p, "step", 0, 9999);
  probe_plot_y_axis(p, PROBE_AXIS_LINEAR, "loss (nats)", NAN, NAN);
  ck_assert_int_eq(probe_plot_add_line(p, &b, "#1f77b4", "loss", NULL,
                                       "#d62728"),
                   PROBE_OK);
  ck_assert_int_eq(probe_plot_add_hline(p, 2.0, "#d62728", "threshold", "4 2"),
                   PROBE_OK);
  int64_t mx[2] = {100, 200};
  double my[2] = {1.0, INFINITY};
  ck_assert_int_eq(probe_plot_add_markers(p, mx, my, 2,
                                          PROBE_MARKER_TRIANGLE_DOWN,
                                          "#d62728", "backoff"),
                   PROBE_OK);
  probe_buf o;
  probe_buf_init(&o);
  ck_assert_int_eq(probe_plot_render(p, &o), PROBE_OK);
  ck_assert_ptr_nonnull(strstr(o.data, "<svg"));
  ck_assert_ptr_nonnull(strstr(o.data, "</svg>"));
  ck_assert_ptr_nonnull(strstr(o.data, "Loss &lt;&amp;&gt;")); /* escaped */
  ck_assert_ptr_nonnull(strstr(o.data, ">step<"));
  ck_assert_ptr_nonnull(strstr(o.data, ">loss (nats)<"));
  ck_assert_ptr_nonnull(strstr(o.data, ">threshold<"));
  ck_assert_ptr_nonnull(strstr(o.data, ">backoff<"));
  ck_assert_ptr_nonnull(strstr(o.data, "non-finite loss (1 steps)"));
  ck_assert_ptr_null(strstr(o.data, "nan"));
  ck_assert_ptr_null(strstr(o.data, "inf"));
  ck_assert_ptr_nonnull(strstr(o.data, ">8000<")); /* step ticks */
  probe_buf_free(&o);
  probe_plot_free(p);
  probe_bins_free(&b);
}
END_TEST

START_TEST(test_plot_log_axes) {
  probe_plot *p;
  ck_assert_int_eq(probe_plot_new(&p, "Loss scale", 600, 260), PROBE_OK);
  probe_bins b;
  ck_assert_int_eq(probe_bins_init(&b, probe_plot_data_width(p), 0, 99),
                   PROBE_OK);
  for (int s = 0; s < 100; s++) probe_bins_add(&b, s, ldexp(1.0, 16 - s / 10));
  probe_plot_x_axis(p, "step", 0, 99);
  probe_plot_y_axis(p, PROBE_AXIS_LOG2, "loss scale (log2 axis)", NAN, NAN);
  probe_plot_add_line(p, &b, "#1f77b4", "loss scale", NULL, NULL);
  probe_buf o;
  probe_buf_init(&o);
  ck_assert_int_eq(probe_plot_render(p, &o), PROBE_OK);
  ck_assert_ptr_nonnull(strstr(o.data, ">2^16<"));
  ck_assert_ptr_nonnull(strstr(o.data, ">2^8<"));
  probe_buf_free(&o);
  probe_plot_free(p);
  probe_bins_free(&b);
}
END_TEST

/* A line's lone points - a series of one step, a value between two gaps -
 * are drawn as dots: a path of a single "M x y" draws nothing (a report of
 * a one-step trace had axes and legends and no curve). Counted by the
 * dots' arc command. */
static int dots_of_line(int64_t x1, const double *ys, int n,
                        probe_axis_scale scale) {
  probe_plot *p;
  ck_assert_int_eq(probe_plot_new(&p, "dots", 600, 260), PROBE_OK);
  probe_bins b;
  ck_assert_int_eq(probe_bins_init(&b, probe_plot_data_width(p), 0, x1),
                   PROBE_OK);
  for (int s = 0; s < n; s++) probe_bins_add(&b, s, ys[s]);
  probe_plot_x_axis(p, "step", 0, x1);
  probe_plot_y_axis(p, scale, "y", NAN, NAN);
  probe_plot_add_line(p, &b, "#1f77b4", "y", NULL, NULL);
  probe_buf o;
  probe_buf_init(&o);
  ck_assert_int_eq(probe_plot_render(p, &o), PROBE_OK);
  int dots = 0;
  for (const char *q = o.data; (q = strstr(q, "a2 2 0 1 0 4 0")); q++) dots++;
  probe_buf_free(&o);
  probe_plot_free(p);
  probe_bins_free(&b);
  return dots;
}

START_TEST(test_plot_lone_points) {
  double one[1] = {0.5};
  ck_assert_int_eq(dots_of_line(0, one, 1, PROBE_AXIS_LINEAR), 1);
  ck_assert_int_eq(dots_of_line(0, one, 1, PROBE_AXIS_LOG10), 1);
  /* on a log axis a zero cannot be drawn: a gap in the line */
  double gaps[5] = {1.0, 0.0, 2.0, 0.0, 3.0}; /* three lone points */
  ck_assert_int_eq(dots_of_line(4, gaps, 5, PROBE_AXIS_LOG10), 3);
  double joined[4] = {1.0, 2.0, 0.0, 3.0}; /* a segment and one lone point */
  ck_assert_int_eq(dots_of_line(3, joined, 4, PROBE_AXIS_LOG2), 1);
  double line[3] = {1.0, 2.0, 3.0};
  ck_assert_int_eq(dots_of_line(2, line, 3, PROBE_AXIS_LINEAR), 0);
}
END_TEST

/* ---- heatmap -------------------------------------------------------------- */

START_TEST(test_heatmap_many_layers) {
  const int L = 150;
  probe_grid g;
  ck_assert_int_eq(probe_grid_init(&g, L, 200, 0, 9999, PROBE_GRID_MIN),
                   PROBE_OK);
  char (*names)[80] = malloc((size_t)L * sizeof *names);
  const char **labels = malloc((size_t)L * sizeof *labels);
  for (int l = 0; l < L; l++) {
    snprintf(names[l], sizeof names[l], "blocks.%d.mlp.fc%d", l, l % 2);
    labels[l] = names[l];
    for (int64_t s = 0; s < 10000; s += 7)
      probe_grid_add(&g, l, s, 2.0 + (double)(l % 20), 0);
  }
  /* a very long name is shortened, with the full name kept as a tooltip */
  snprintf(names[3], sizeof names[3],
           "encoder.layers.11.self_attention.output.dense.norm_final");
  probe_grid_add(&g, 77, 5000, NAN, 1);
  probe_heatmap_opts h;
  memset(&h, 0, sizeof h);
  h.title = "FP16 headroom";
  h.x_label = "step";
  h.value_label = "headroom [binades]";
  h.row_labels = labels;
  h.cmap = (probe_colormap){2, {0, 24}, {0xff0000, 0x0000ff}};
  h.width = 1200;
  h.row_height = 4; /* asks for too little: raised to 10 */
  probe_buf o;
  probe_buf_init(&o);
  ck_assert_int_eq(probe_heatmap_render(&g, &h, &o), PROBE_OK);
  for (int l = 0; l < L; l++) {
    if (l == 3) continue;
    char needle[96];
    snprintf(needle, sizeof needle, ">%s</text>", names[l]);
    ck_assert_msg(strstr(o.data, needle), "label %s missing", names[l]);
  }
  ck_assert_ptr_nonnull(strstr(o.data, "<title>encoder.layers.11.self_attention"
                                       ".output.dense.norm_final</title>"));
  ck_assert_ptr_nonnull(strstr(o.data, "...")); /* shortened form */
  /* every row gets at least 10 px: height >= 30 + 150*10 + margins */
  int height = 0;
  ck_assert_int_eq(sscanf(strstr(o.data, "height=\"") + 8, "%d", &height), 1);
  ck_assert_int_ge(height, 30 + L * 10);
  ck_assert_ptr_nonnull(strstr(o.data, "fill=\"#000000\"")); /* inf/NaN */
  ck_assert_ptr_nonnull(strstr(o.data, ">headroom [binades]<"));
  ck_assert_ptr_nonnull(strstr(o.data, "steps per column"));
  /* merged runs keep it small: one colour per row here */
  ck_assert_uint_lt(o.len, 120000);
  probe_buf_free(&o);
  probe_grid_free(&g);
  free(names);
  free(labels);
}
END_TEST

START_TEST(test_colormap) {
  probe_colormap cm = {3, {0, 1, 2}, {0x000000, 0xff0000, 0xffffff}};
  ck_assert_uint_eq(probe_colormap_at(&cm, -5), 0x000000);
  ck_assert_uint_eq(probe_colormap_at(&cm, 1), 0xff0000);
  ck_assert_uint_eq(probe_colormap_at(&cm, 9), 0xffffff);
  ck_assert_uint_eq(probe_colormap_at(&cm, 1.5), 0xff8080);
  ck_assert_uint_eq(probe_colormap_at(&cm, INFINITY), 0xffffff);
}
END_TEST

/* ---- report --------------------------------------------------------------- */

/* A synthetic run: steps, layers, records, scaler events, optionally blowing
 * up at step `blow` (-1: healthy). */
static void feed_run(probe_report *r, int64_t steps, int layers, int64_t blow) {
  probe_step_scalars sc[256];
  size_t k = 0;
  double scale = 65536;
  for (int64_t s = 0; s < steps; s++) {
    probe_step_scalars *p = &sc[k++];
    memset(p, 0, sizeof *p);
    p->step = s;
    p->loss = 2.0 * exp(-(double)s / 500.0) + 0.1;
    p->loss_scale = scale;
    p->grad_norm = 3.0 * scale / 65536;
    p->clip_threshold = 1.0;
    p->clip_coef = fmin(1.0, 1.0 / p->grad_norm);
    if (blow >= 0 && s >= blow) {
      p->loss = NAN;
      p->skipped = 1;
      p->found_inf = 1;
      p->grad_norm = INFINITY;
      probe_scaler_event ev = {s, PROBE_SCALER_BACKOFF, scale, scale / 2, 0};
      ck_assert_int_eq(probe_report_add_scaler_events(r, &ev, 1), PROBE_OK);
      scale /= 2;
    }
    if (k == 256 || s == steps - 1) {
      ck_assert_int_eq(probe_report_add_steps(r, sc, k), PROBE_OK);
      k = 0;
    }
  }
  probe_record rec[64];
  for (int64_t s = 0; s < steps; s++) {
    size_t n = 0;
    for (int l = 0; l < layers; l++) {
      probe_record *p = &rec[n++];
      memset(p, 0, sizeof *p);
      p->step = s;
      p->layer = l;
      p->site = l % 2 ? PROBE_SITE_GRAD_IN : PROBE_SITE_FWD_OUT;
      p->stats.count = 1000;
      p->stats.absmax = (float)(4.0 * (l + 1));
      p->stats.f16_subnormal = (uint64_t)(l * 10);
      if (blow >= 0 && s >= blow && l == 2) {
        p->stats.posinf_count = 3;
        p->stats.absmax = 70000.0f;
      }
    }
    ck_assert_int_eq(probe_report_add_records(r, rec, n), PROBE_OK);
  }
}

static char *write_report(probe_report *r, size_t *len) {
  char *mem = NULL;
  size_t n = 0;
  FILE *f = open_memstream(&mem, &n);
  ck_assert_ptr_nonnull(f);
  ck_assert_int_eq(probe_report_write(r, f), PROBE_OK);
  fclose(f);
  *len = n;
  return mem;
}

/* A report over FP16 layers (the runs these tests draw: headroom against
 * 65504, FP16 underflow), or over layers of the given formats. */
static probe_report *new_report_prec(int64_t steps, int layers,
                                     const probe_dtype *prec);

static probe_report *new_report(int64_t steps, int layers) {
  return new_report_prec(steps, layers, NULL);
}

static probe_report *new_report_prec(int64_t steps, int layers,
                                     const probe_dtype *prec) {
  probe_report *r;
  probe_report_options o;
  probe_report_options_init(&o);
  o.title = "ampprobe report: test <run>";
  ck_assert_int_eq(probe_report_new(&r, &o), PROBE_OK);
  probe_layer_info *li = calloc((size_t)layers, sizeof *li);
  for (int l = 0; l < layers; l++) {
    li[l].id = l;
    snprintf(li[l].name, sizeof li[l].name, "block%d.%s", l / 3,
             l % 3 == 0 ? "linear" : l % 3 == 1 ? "bn" : "revin");
    li[l].precision = prec ? prec[l] : PROBE_DTYPE_F16;
  }
  ck_assert_int_eq(probe_report_set_layers(r, li, (size_t)layers), PROBE_OK);
  free(li);
  ck_assert_int_eq(probe_report_set_range(r, 0, steps - 1), PROBE_OK);
  return r;
}

START_TEST(test_report_self_contained) {
  probe_report *r = new_report(2000, 12);
  ck_assert_int_eq(probe_report_set_diagnosis(r, PROBE_REPORT_PROBLEM,
                                              "overflow in block0.revin",
                                              "first non-finite: step 1500"),
                   PROBE_OK);
  ck_assert_int_eq(probe_report_add_meta(r, "trace", "run.h5"), PROBE_OK);
  feed_run(r, 2000, 12, 1500);
  probe_report_counts c;
  probe_report_get_counts(r, &c);
  ck_assert_int_eq(c.steps, 2000);
  ck_assert_int_eq(c.records, 2000 * 12);
  ck_assert_int_eq(c.scaler_events, 500);
  ck_assert_int_eq(probe_report_set_range(r, 0, 10), PROBE_ERR_STATE);
  size_t len;
  char *html = write_report(r, &len);
  ck_assert_uint_eq(strlen(html), len);
  /* self-contained: no scripts, links, images or fetches from elsewhere */
  ck_assert_ptr_null(strstr(html, "<script"));
  ck_assert_ptr_null(strstr(html, "<link"));
  ck_assert_ptr_null(strstr(html, "<img"));
  ck_assert_ptr_null(strstr(html, "url("));
  ck_assert_ptr_null(strstr(html, "@import"));
  ck_assert_int_eq(count_substr(html, "http"),
                   count_substr(html, "xmlns=\"http://www.w3.org/2000/svg\""));
  ck_assert_int_eq(count_substr(html, "<svg"), count_substr(html, "</svg>"));
  ck_assert_int_eq(count_substr(html, "<svg"), 6); /* 4 plots + 2 heatmaps */
  /* order: diagnosis first, then the curves, then the heatmaps */
  const char *v = strstr(html, "overflow in block0.revin");
  const char *loss = strstr(html, ">Loss<");
  const char *scale = strstr(html, ">Loss scale<");
  const char *gn = strstr(html, ">Gradient norm before clipping<");
  const char *head = strstr(html, "FP16 headroom per layer");
  const char *under = strstr(html, "FP16 underflow of gradients");
  ck_assert(v && loss && scale && gn && head && under);
  ck_assert(v < loss && loss < scale && scale < gn && gn < head &&
            head < under);
  ck_assert_ptr_nonnull(strstr(html, "test &lt;run&gt;"));
  ck_assert_ptr_nonnull(strstr(html, "backoff (500)"));
  ck_assert_ptr_nonnull(strstr(html, "skipped step (500)"));
  ck_assert_ptr_nonnull(strstr(html, "non-finite loss (500 steps)"));
  ck_assert_ptr_nonnull(strstr(html, ">clip threshold<"));
  ck_assert_ptr_nonnull(strstr(html, "fill=\"#000000\""));
  ck_assert_ptr_nonnull(strstr(html, ">block0.revin</text>"));
  ck_assert_ptr_null(strstr(html, "Comparison with the baseline"));
  ck_assert_ptr_null(strstr(html, "Bisect"));
  ck_assert_uint_lt(len, 1500000);
  free(html);
  probe_report_free(r);
}
END_TEST

START_TEST(test_report_baseline_diff_bisect) {
  probe_report *r = new_report(300, 6);
  ck_assert_int_eq(probe_report_set_baseline_label(r, "FP32 baseline"),
                   PROBE_OK);
  feed_run(r, 300, 6, 200);
  probe_step_scalars b[300];
  memset(b, 0, sizeof b);
  for (int s = 0; s < 300; s++) {
    b[s].step = s;
    b[s].loss = 2.0 * exp(-(double)s / 500.0) + 0.1;
  }
  ck_assert_int_eq(probe_report_add_baseline_steps(r, b, 300), PROBE_OK);
  probe_report_set_part_step(r, 200);
  int t;
  const char *hdr[3] = {"layer", "site", "first diverging step"};
  ck_assert_int_eq(probe_report_add_table(r, PROBE_REPORT_DIFF, "Diff", 3, hdr,
                                          &t),
                   PROBE_OK);
  const char *row[3] = {"block0.revin", "fwd_out", "200"};
  ck_assert_int_eq(probe_report_table_row(r, t, row), PROBE_OK);
  int t2;
  const char *bh[2] = {"FP32 set", "verdict"};
  ck_assert_int_eq(probe_report_add_table(r, PROBE_REPORT_BISECT, "Trials", 2,
                                          bh, &t2),
                   PROBE_OK);
  for (int i = 0; i < 40; i++) { /* grows past the first allocation */
    const char *br[2] = {i % 2 ? "revin" : "bn", i % 2 ? "pass" : "fail"};
    ck_assert_int_eq(probe_report_table_row(r, t2, br), PROBE_OK);
  }
  ck_assert_int_eq(probe_report_add_text(r, PROBE_REPORT_BISECT,
                                         "Minimal set", "revin"),
                   PROBE_OK);
  ck_assert_int_eq(probe_report_table_row(r, 99, row), PROBE_ERR_INVALID_ARG);
  size_t len;
  char *html = write_report(r, &len);
  ck_assert_ptr_nonnull(strstr(html, ">FP32 baseline<"));
  ck_assert_ptr_nonnull(strstr(html, "curves part at step 200"));
  const char *diff = strstr(html, "Comparison with the baseline");
  const char *bis = strstr(html, "Bisect: modules to keep in FP32");
  ck_assert(diff && bis && diff < bis);
  ck_assert_ptr_nonnull(strstr(html, "<td>block0.revin</td>"));
  ck_assert_int_eq(count_substr(html, "<td>pass</td>"), 20);
  ck_assert_ptr_nonnull(strstr(html, "Minimal set"));
  free(html);
  probe_report_free(r);
}
END_TEST

START_TEST(test_report_states) {
  probe_report *r;
  ck_assert_int_eq(probe_report_new(&r, NULL), PROBE_OK);
  probe_step_scalars s = {0};
  /* data before the range is an error, not a crash */
  ck_assert_int_eq(probe_report_add_steps(r, &s, 1), PROBE_ERR_STATE);
  /* an empty report still writes a page with "no steps recorded" */
  size_t len;
  char *html = write_report(r, &len);
  ck_assert_ptr_nonnull(strstr(html, "no steps recorded"));
  ck_assert_ptr_nonnull(strstr(html, "no layers table"));
  free(html);
  probe_report_free(r);

  r = new_report(10, 2);
  probe_record rec;
  memset(&rec, 0, sizeof rec);
  rec.layer = 5; /* no such layer */
  ck_assert_int_eq(probe_report_add_records(r, &rec, 1), PROBE_OK);
  probe_report_counts c;
  probe_report_get_counts(r, &c);
  ck_assert_int_eq(c.records_dropped, 1);
  probe_report_free(r);

  probe_report_options o;
  probe_report_options_init(&o);
  o.width = 10;
  ck_assert_int_eq(probe_report_new(&r, &o), PROBE_ERR_INVALID_ARG);
}
END_TEST

/* A finite blow-up over more than three decades switches the loss axis to
 * log10; a loss within one decade stays linear. */
START_TEST(test_report_loss_axis) {
  for (int blowup = 0; blowup < 2; blowup++) {
    probe_report *r = new_report(100, 3);
    probe_step_scalars s[100];
    memset(s, 0, sizeof s);
    for (int i = 0; i < 100; i++) {
      s[i].step = i;
      s[i].loss = blowup && i > 80 ? 1e5 : 1.0 + 0.01 * i;
      s[i].loss_scale = 1;
    }
    ck_assert_int_eq(probe_report_add_steps(r, s, 100), PROBE_OK);
    size_t len;
    char *html = write_report(r, &len);
    if (blowup) {
      ck_assert_ptr_nonnull(strstr(html, ">loss (unscaled, log10 axis)<"));
    } else {
      ck_assert_ptr_nonnull(strstr(html, ">loss (unscaled)<"));
    }
    ck_assert_ptr_nonnull(strstr(html, "loss scaling off"));
    free(html);
    probe_report_free(r);
  }
}
END_TEST

/* Scale 1 at every step: without a caller's answer the page guesses
 * "loss scaling off"; probe_report_set_scaling(1) (a scaler that stayed at
 * an initial scale of 1) removes the note, set_scaling(0) keeps it. */
START_TEST(test_report_scaling_source) {
  for (int mode = 0; mode < 3; mode++) { /* 0 unset, 1 on, 2 off */
    probe_report *r = new_report(20, 2);
    if (mode) ck_assert_int_eq(probe_report_set_scaling(r, mode == 1), PROBE_OK);
    probe_step_scalars s[20];
    memset(s, 0, sizeof s);
    for (int i = 0; i < 20; i++) {
      s[i].step = i;
      s[i].loss = 1.0;
      s[i].loss_scale = 1;
    }
    ck_assert_int_eq(probe_report_add_steps(r, s, 20), PROBE_OK);
    size_t len;
    char *html = write_report(r, &len);
    if (mode == 1)
      ck_assert_ptr_null(strstr(html, "loss scaling off"));
    else
      ck_assert_ptr_nonnull(strstr(html, "loss scaling off"));
    free(html);
    probe_report_free(r);
  }
}
END_TEST

/* 10,000 steps x 30 layers: the page stays small. */
START_TEST(test_report_long_trace_size) {
  probe_report *r = new_report(10000, 30);
  feed_run(r, 10000, 30, -1);
  size_t len;
  char *html = write_report(r, &len);
  ck_assert_uint_lt(len, 1000000);
  free(html);
  probe_report_free(r);
}
END_TEST

/* #15.5: the clip-coefficient panel draws only coefficients computed from
 * a finite gradient norm; with none it says so instead of a flat 1.0. */
START_TEST(test_report_clip_without_finite_norm) {
  /* 0 every norm NaN, 1 every norm inf, 2 half NaN, 3 all finite */
  for (int mode = 0; mode < 4; mode++) {
    probe_report *r = new_report(100, 2);
    probe_step_scalars s[100];
    memset(s, 0, sizeof s);
    for (int i = 0; i < 100; i++) {
      s[i].step = i;
      s[i].loss = 1.0;
      s[i].loss_scale = 1024;
      s[i].clip_threshold = 5;
      s[i].clip_coef = 1.0; /* what the trainer stores for a skipped step */
      s[i].grad_norm = mode == 0   ? NAN
                       : mode == 1 ? INFINITY
                       : mode == 2 && i % 2 ? NAN
                                            : 2.0;
    }
    ck_assert_int_eq(probe_report_add_steps(r, s, 100), PROBE_OK);
    size_t len;
    char *html = write_report(r, &len);
    const char *none = "no finite gradient norm: no clip coefficient was "
                       "computed at any step";
    if (mode <= 1) {
      ck_assert_ptr_nonnull(strstr(html, none));
      ck_assert_ptr_nonnull(strstr(html, "no finite gradient norm: it was inf "
                                         "or NaN at every step"));
      ck_assert_ptr_null(strstr(html, ">clip coefficient"));
    } else if (mode == 2) {
      ck_assert_ptr_null(strstr(html, none));
      ck_assert_ptr_nonnull(strstr(
          html, ">clip coefficient (none at 50 steps with an inf/NaN norm)<"));
    } else {
      ck_assert_ptr_null(strstr(html, none));
      ck_assert_ptr_nonnull(strstr(html, ">clip coefficient<"));
    }
    free(html);
    probe_report_free(r);
  }
}
END_TEST

/* With libprobe's `unmeasured` bits: a gradient norm that was not measured
 * is not "non-finite", and the panels say which it was. */
START_TEST(test_report_clip_not_measured) {
#ifdef PROBE_SCALAR_GRAD_NORM
  for (int mode = 0; mode < 3; mode++) { /* 0 none measured, 1 half, 2 half + NaN */
    probe_report *r = new_report(40, 2);
    probe_step_scalars s[40];
    memset(s, 0, sizeof s);
    for (int i = 0; i < 40; i++) {
      s[i].step = i;
      s[i].loss = 1.0;
      s[i].loss_scale = 1024;
      s[i].clip_threshold = 5;
      s[i].clip_coef = 1.0;
      s[i].grad_norm = mode == 2 ? NAN : 2.0;
      if (mode == 0 || i % 2) {
        s[i].grad_norm = NAN;
        s[i].unmeasured = PROBE_SCALAR_GRAD_NORM;
      }
    }
    ck_assert_int_eq(probe_report_add_steps(r, s, 40), PROBE_OK);
    size_t len;
    char *html = write_report(r, &len);
    if (mode == 0) {
      ck_assert_ptr_nonnull(strstr(html, "gradient norm not measured in this run"));
      ck_assert_ptr_nonnull(strstr(html, "gradient norm not measured: no clip"));
      ck_assert_ptr_null(strstr(html, "no finite gradient norm"));
    } else if (mode == 1) {
      ck_assert_ptr_nonnull(strstr(html, ">gradient norm (not measured at 20 steps)<"));
      ck_assert_ptr_nonnull(strstr(html, ">clip coefficient<"));
      ck_assert_ptr_null(strstr(html, "no finite gradient norm"));
    } else {
      ck_assert_ptr_nonnull(strstr(html, "no finite gradient norm: it was inf or "
                                         "NaN at every step it was measured"));
      ck_assert_ptr_nonnull(strstr(html, "no finite gradient norm: no clip"));
    }
    free(html);
    probe_report_free(r);
  }
#else
  printf("test_report_clip_not_measured: libprobe has no `unmeasured` bits "
         "yet; nothing to check\n");
#endif
}
END_TEST

static probe_record nf_rec(int64_t step, int layer, int site, int bad) {
  probe_record p;
  memset(&p, 0, sizeof p);
  p.step = step;
  p.layer = layer;
  p.site = site;
  p.stats.count = 100;
  p.stats.absmax = 3.0f;
  if (bad) p.stats.nan_count = 100;
  return p;
}

/* The row of the "first held inf/NaN" table for a layer name. */
static const char *nf_row(const char *html, const char *name) {
  const char *t = strstr(html, "<table id=\"nonfinite\">");
  if (!t) return NULL;
  char key[80];
  snprintf(key, sizeof key, "<tr><td>%s</td>", name);
  return strstr(t, key);
}

static int row_has(const char *row, const char *text) {
  const char *end = row ? strstr(row, "</tr>") : NULL;
  const char *hit = row ? strstr(row, text) : NULL;
  return hit && end && hit < end;
}

/* Many registered layers: the heatmaps and their table show only layers
 * with records, at most 1,000, those with inf/NaN and the least headroom
 * first (a row per registered layer made 94 MB pages); a note says so. */
START_TEST(test_report_rows_capped) {
  const int L = 6000, REC = 1500;
  probe_report *r = new_report(3, L);
  for (int64_t st = 0; st < 3; st++)
    for (int l = 0; l < REC; l++) {
      probe_record p = nf_rec(st, l, PROBE_SITE_FWD_OUT, l == 1234 && st == 2);
      /* headroom log2(65504/absmax): layer 40 the tightest of the finite */
      p.stats.absmax = l == 40 ? 60000.0f : 3.0f + (float)(l % 97);
      p.seq = (uint32_t)l;
      ck_assert_int_eq(probe_report_add_records(r, &p, 1), PROBE_OK);
    }
  size_t len;
  char *html = write_report(r, &len);
  ck_assert_msg(strstr(html, "Shown: 1000 of the 1500 layers with records"),
                "no note");
  ck_assert_ptr_nonnull(nf_row(html, "block411.bn")); /* 1234: NaN */
  ck_assert_ptr_nonnull(nf_row(html, "block13.bn"));      /* 40: tightest */
  ck_assert_ptr_null(nf_row(html, "block1999.linear"));   /* 5997: no record */
  int rows = 0;
  for (const char *q = strstr(html, "<table id=\"nonfinite\">");
       q && (q = strstr(q + 1, "<tr><td>"));)
    rows++;
  ck_assert_int_eq(rows, 1000);
  ck_assert_msg(len < 2000000, "%zu bytes", len);
  free(html);
  probe_report_free(r);

  /* more than 1,000 layers with inf/NaN (a NaN spread through the model):
   * the layer first in the run is kept, whatever its headroom */
  r = new_report(3, L);
  for (int64_t st = 0; st < 3; st++)
    for (int l = 0; l < REC; l++) {
      int bad = st == 2 || (l == 1400 && st >= 1);
      probe_record p = nf_rec(st, l, PROBE_SITE_FWD_OUT, bad);
      p.stats.absmax = 3.0f;
      p.seq = (uint32_t)l;
      ck_assert_int_eq(probe_report_add_records(r, &p, 1), PROBE_OK);
    }
  html = write_report(r, &len);
  ck_assert(row_has(nf_row(html, "block466.revin"), "(first in the run)"));
  free(html);
  probe_report_free(r);
}
END_TEST

/* The grids hold a row per layer with a record, not per registered layer:
 * 2^20 layers of which 9 were recorded took 2.7 GB (4,000 heat columns:
 * over 12 GB) for a 2.3 MB trace (hunt, 2026-12-04). Here 2^18 layers,
 * four recorded out of order, 4,000 columns, under a 1 GiB address-space
 * limit (the old grids needed 2^18 x 4,000 x 24 bytes, 24 GiB): the
 * report is written, its rows in registration order, named right. */
START_TEST(test_report_rows_of_recorded_layers) {
  pid_t pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) {
#if !defined(__SANITIZE_ADDRESS__) /* ASan reserves terabytes of address space */
    struct rlimit rl = {(rlim_t)1 << 30, (rlim_t)1 << 30};
    if (setrlimit(RLIMIT_AS, &rl) != 0) _exit(10);
#endif
    const int L = 1 << 18;
    probe_report *r;
    probe_report_options o;
    probe_report_options_init(&o);
    o.heat_cols = 4000;
    if (probe_report_new(&r, &o) != PROBE_OK) _exit(11);
    probe_layer_info *li = calloc((size_t)L, sizeof *li);
    if (!li) _exit(12);
    for (int l = 0; l < L; l++) {
      li[l].id = l;
      snprintf(li[l].name, sizeof li[l].name, "layer%d", l);
    }
    if (probe_report_set_layers(r, li, (size_t)L) != PROBE_OK) _exit(13);
    free(li);
    if (probe_report_set_range(r, 0, 9999) != PROBE_OK) _exit(14);
    static const int rec[] = {200000, 7, 150000, 7, 99};
    for (int64_t st = 0; st < 10000; st += 37)
      for (size_t k = 0; k < sizeof rec / sizeof rec[0]; k++) {
        probe_record p = nf_rec(st, rec[k], PROBE_SITE_FWD_OUT, rec[k] == 150000 && st > 5000);
        if (probe_report_add_records(r, &p, 1) != PROBE_OK) _exit(15);
      }
    char *mem = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&mem, &n);
    if (!f || probe_report_write(r, f) != PROBE_OK) _exit(16);
    fclose(f);
    /* the first-non-finite table lists the recorded layers in registration
     * order: 7, 99, 150000, 200000 */
    const char *a = nf_row(mem, "layer7"), *b = nf_row(mem, "layer99"),
               *c = nf_row(mem, "layer150000"), *d = nf_row(mem, "layer200000");
    if (!a || !b || !c || !d) _exit(17);
    if (!(a < b && b < c && c < d)) _exit(18);
    if (nf_row(mem, "layer8")) _exit(19);
    if (!row_has(c, "5032")) _exit(20); /* its first NaN: step 37 x 136 */
    free(mem);
    probe_report_free(r);
    _exit(0);
  }
  int wst = 0;
  ck_assert_int_eq(waitpid(pid, &wst, 0), pid);
  ck_assert_msg(WIFEXITED(wst) && WEXITSTATUS(wst) == 0,
                "child status 0x%x (exit 15: out of memory adding records)",
                (unsigned)wst);
}
END_TEST

/* #15.5: when every record is non-finite the heatmaps say so, and per layer
 * the first non-finite step and whether it was born or passed there. */
START_TEST(test_report_nonfinite_story) {
  /* every record of every layer NaN from step 0: block0.linear has only an
   * output (the data), the others receive it through their inputs */
  probe_report *r = new_report(20, 3);
  for (int64_t st = 0; st < 20; st++) {
    probe_record rec[5] = {nf_rec(st, 0, PROBE_SITE_FWD_OUT, 1),
                           nf_rec(st, 1, PROBE_SITE_FWD_IN, 1),
                           nf_rec(st, 1, PROBE_SITE_FWD_OUT, 1),
                           nf_rec(st, 2, PROBE_SITE_FWD_IN, 1),
                           nf_rec(st, 2, PROBE_SITE_GRAD_IN, 1)};
    for (int i = 0; i < 5; i++) rec[i].seq = (uint32_t)i;
    ck_assert_int_eq(probe_report_add_records(r, rec, 5), PROBE_OK);
  }
  size_t len;
  char *html = write_report(r, &len);
  ck_assert_ptr_nonnull(strstr(html, "every record held inf/NaN: no headroom"));
  ck_assert_ptr_nonnull(strstr(html, "every gradient record held inf/NaN"));
  const char *r0 = nf_row(html, "block0.linear");
  const char *r1 = nf_row(html, "block0.bn");
  const char *r2 = nf_row(html, "block0.revin");
  ck_assert(row_has(r0, "<td>0 (first in the run)</td>"));
  ck_assert(row_has(r0, "born here: forward (no input recorded"));
  ck_assert(row_has(r1, "passed on: its input was already inf/NaN"));
  ck_assert(!row_has(r1, "first in the run"));
  ck_assert(row_has(r2, "passed on: its input was already inf/NaN"));
  ck_assert(row_has(r2, "<td>40</td>")); /* 2 records x 20 steps */
  free(html);
  probe_report_free(r);

  /* finite until step 7, where block0.revin's saved variance overflows
   * from a finite input, the next layer's input follows, and block0.bn's
   * weight gradient goes non-finite from a finite incoming gradient at 9;
   * block0.linear never */
  r = new_report(20, 4);
  for (int64_t st = 0; st < 20; st++) {
    int b7 = st >= 7, b9 = st >= 9;
    probe_record rec[8] = {nf_rec(st, 0, PROBE_SITE_FWD_OUT, 0),
                           nf_rec(st, 2, PROBE_SITE_FWD_IN, 0),
                           nf_rec(st, 2, PROBE_SITE_FWD_SAVED, b7),
                           nf_rec(st, 2, PROBE_SITE_FWD_OUT, b7),
                           nf_rec(st, 3, PROBE_SITE_FWD_IN, b7),
                           nf_rec(st, 3, PROBE_SITE_FWD_OUT, b7),
                           nf_rec(st, 1, PROBE_SITE_GRAD_OUT, 0),
                           nf_rec(st, 1, PROBE_SITE_WEIGHT_GRAD, b9)};
    for (int i = 0; i < 8; i++) rec[i].seq = (uint32_t)i;
    ck_assert_int_eq(probe_report_add_records(r, rec, 8), PROBE_OK);
  }
  html = write_report(r, &len);
  ck_assert_ptr_null(strstr(html, "every record held inf/NaN"));
  ck_assert(row_has(nf_row(html, "block0.linear"), "<td>never</td>"));
  const char *rv = nf_row(html, "block0.revin");
  ck_assert(row_has(rv, "<td>7 (first in the run)</td>"));
  ck_assert(row_has(rv, "<td>fwd_saved</td>"));
  ck_assert(row_has(rv, "born here: forward, from a finite input"));
  const char *l3 = nf_row(html, "block1.linear");
  ck_assert(row_has(l3, "<td>7</td>"));
  ck_assert(row_has(l3, "passed on: its input was already inf/NaN"));
  const char *bn = nf_row(html, "block0.bn");
  ck_assert(row_has(bn, "<td>9</td>"));
  ck_assert(row_has(bn, "born here: backward, from a finite incoming gradient"));
  free(html);
  probe_report_free(r);

  /* a healthy run: no table at all */
  r = new_report(50, 3);
  feed_run(r, 50, 3, -1);
  html = write_report(r, &len);
  ck_assert_ptr_null(strstr(html, "<table id=\"nonfinite\">"));
  free(html);
  probe_report_free(r);
}
END_TEST

/* Masked logits (-inf alone at a softmax's input) are no inf/NaN in the
 * layers table, as in the post-mortem (it listed the softmax "first in the
 * run" on the page of a healthy run); +inf there is. */
START_TEST(test_report_masked_logits) {
  for (int plus = 0; plus < 2; plus++) {
    probe_report *r;
    probe_report_options o;
    probe_report_options_init(&o);
    ck_assert_int_eq(probe_report_new(&r, &o), PROBE_OK);
    probe_layer_info li[2];
    memset(li, 0, sizeof li);
    li[0] = (probe_layer_info){.id = 0, .kind = PROBE_KIND_LINEAR};
    li[1] = (probe_layer_info){.id = 1, .kind = PROBE_KIND_SOFTMAX};
    snprintf(li[0].name, sizeof li[0].name, "fc");
    snprintf(li[1].name, sizeof li[1].name, "sm");
    ck_assert_int_eq(probe_report_set_layers(r, li, 2), PROBE_OK);
    ck_assert_int_eq(probe_report_set_range(r, 0, 9), PROBE_OK);
    for (int64_t st = 0; st < 10; st++) {
      probe_record rec[3] = {nf_rec(st, 0, PROBE_SITE_FWD_OUT, 0),
                             nf_rec(st, 1, PROBE_SITE_FWD_IN, 0),
                             nf_rec(st, 1, PROBE_SITE_FWD_OUT, 0)};
      if (plus)
        rec[1].stats.posinf_count = 20;
      else
        rec[1].stats.neginf_count = 20;
      for (int i = 0; i < 3; i++) rec[i].seq = (uint32_t)i;
      ck_assert_int_eq(probe_report_add_records(r, rec, 3), PROBE_OK);
    }
    size_t len;
    char *html = write_report(r, &len);
    if (plus)
      ck_assert(row_has(nf_row(html, "sm"), "<td>0 (first in the run)</td>"));
    else
      ck_assert_ptr_null(strstr(html, "<table id=\"nonfinite\">"));
    free(html);
    probe_report_free(r);
  }
}
END_TEST

/* The headroom section of a report: from its heading to the next one. */
static char *headroom_section(const char *html, const char *h2) {
  const char *a = strstr(html, h2);
  if (!a) return NULL;
  const char *b = strstr(a + 4, "<h2>");
  size_t n = b ? (size_t)(b - a) : strlen(a);
  char *out = malloc(n + 1);
  memcpy(out, a, n);
  out[n] = 0;
  return out;
}

static void feed_absmax(probe_report *r, int layer, int site, float absmax) {
  for (int64_t st = 0; st < 50; st++) {
    probe_record p;
    memset(&p, 0, sizeof p);
    p.step = st;
    p.layer = layer;
    p.site = site;
    p.stats.count = 100;
    p.stats.absmax = absmax;
    ck_assert_int_eq(probe_report_add_records(r, &p, 1), PROBE_OK);
  }
}

/* hunt F6: a BF16 trace's headroom is measured against BF16's 3.39e38,
 * not FP16's 65504: a healthy BF16 layer at 1e5 (RevIN's variance) is at
 * the blue end (24+ binades), not painted red as past FP16's range; the
 * FP16 underflow map does not apply to BF16 layers. */
START_TEST(test_report_bf16_headroom) {
  const probe_dtype prec[2] = {PROBE_DTYPE_BF16, PROBE_DTYPE_BF16};
  probe_report *r = new_report_prec(50, 2, prec);
  feed_absmax(r, 0, PROBE_SITE_FWD_OUT, 1e5f);
  feed_absmax(r, 1, PROBE_SITE_GRAD_IN, 1e5f);
  size_t len;
  char *html = write_report(r, &len);
  ck_assert_ptr_null(strstr(html, "FP16 headroom"));
  ck_assert_ptr_null(strstr(html, "65504"));
  char *h = headroom_section(html, "<h2>BF16 headroom per layer</h2>");
  ck_assert_ptr_nonnull(h);
  ck_assert_ptr_nonnull(strstr(h, "BF16 headroom: log2(3.39e38 / absmax)"));
  /* one colour of cells, the top level (24+ binades), none red */
  ck_assert_int_eq(count_substr(h, "<path fill="), 1);
  ck_assert_ptr_nonnull(strstr(h, "<path fill=\"#333997\""));
  free(h);
  ck_assert_ptr_nonnull(strstr(html, "No layer runs in FP16"));
  free(html);
  probe_report_free(r);
}
END_TEST

/* FP16 and BF16 layers in one trace: each against its own format, the
 * title says so; the FP16 layer near 65504 is red, the BF16 one blue. */
START_TEST(test_report_mixed_formats_headroom) {
  const probe_dtype prec[2] = {PROBE_DTYPE_F16, PROBE_DTYPE_BF16};
  probe_report *r = new_report_prec(50, 2, prec);
  feed_absmax(r, 0, PROBE_SITE_FWD_OUT, 65000.0f);
  feed_absmax(r, 1, PROBE_SITE_FWD_OUT, 1e5f);
  size_t len;
  char *html = write_report(r, &len);
  char *h = headroom_section(html, "<h2>Headroom per layer, in each layer's format</h2>");
  ck_assert_ptr_nonnull(h);
  ck_assert_ptr_nonnull(strstr(h, "FP16 65504, BF16 3.39e38"));
  ck_assert_int_eq(count_substr(h, "<path fill="), 2);
  ck_assert_ptr_nonnull(strstr(h, "<path fill=\"#333997\"")); /* BF16 */
  ck_assert_ptr_nonnull(strstr(h, "<path fill=\"#a"));  /* FP16: the red end */
  free(h);
  /* the FP16 underflow map is drawn, BF16 rows grey */
  ck_assert_ptr_nonnull(strstr(html, "or are BF16 or FP32 layers"));
  free(html);
  probe_report_free(r);
}
END_TEST

/* #15.5: the underflow colour bar is a fraction: 0% .. 100%, no "<=0" or
 * "1+"; headroom keeps its open ends (values beyond are clamped). */
START_TEST(test_report_colour_bar_labels) {
  probe_report *r = new_report(300, 6);
  feed_run(r, 300, 6, -1);
  size_t len;
  char *html = write_report(r, &len);
  const char *under = strstr(html, "FP16 underflow of gradients per layer");
  ck_assert_ptr_nonnull(under);
  ck_assert_ptr_nonnull(strstr(under, ">0%<"));
  ck_assert_ptr_nonnull(strstr(under, ">100%<"));
  ck_assert_ptr_null(strstr(under, ">1+<"));
  ck_assert_ptr_null(strstr(under, "&#8804;"));
  /* the headroom bar, before it, keeps <=0 and 24+ */
  const char *le = strstr(html, ">&#8804;0<");
  ck_assert(le && le < under);
  const char *p24 = strstr(html, ">24+<");
  ck_assert(p24 && p24 < under);
  free(html);
  probe_report_free(r);

  /* stop labels given to the renderer are escaped and replace the values */
  probe_grid g;
  ck_assert_int_eq(probe_grid_init(&g, 1, 4, 0, 3, PROBE_GRID_MAX), PROBE_OK);
  probe_grid_add(&g, 0, 1, 0.5, 0);
  static const char *const lab[3] = {"none", "half <", "all"};
  static const char *const rows[1] = {"x"};
  probe_heatmap_opts o;
  memset(&o, 0, sizeof o);
  o.title = "t";
  o.row_labels = rows;
  o.width = 800;
  o.row_height = 12;
  o.cmap = (probe_colormap){3, {0, 0.5, 1}, {0xffffff, 0x888888, 0}};
  o.stop_labels = lab;
  o.note = "a note & more";
  probe_buf b;
  probe_buf_init(&b);
  ck_assert_int_eq(probe_heatmap_render(&g, &o, &b), PROBE_OK);
  ck_assert_ptr_nonnull(strstr(b.data, ">half &lt;<"));
  ck_assert_ptr_nonnull(strstr(b.data, ">a note &amp; more<"));
  ck_assert_ptr_null(strstr(b.data, "1+"));
  probe_buf_free(&b);
  probe_grid_free(&g);
}
END_TEST

static Suite *make_report_suite(void) {
  Suite *s = suite_create("report");
  TCase *tc = tcase_create("buf");
  tcase_add_test(tc, test_buf_escape);
  tcase_add_test(tc, test_buf_printf_long);
  suite_add_tcase(s, tc);
  tc = tcase_create("bins");
  tcase_add_loop_test(tc, test_bins_spike_survives, 0, 16);
  tcase_add_test(tc, test_bins_columns_and_nonfinite);
  tcase_add_test(tc, test_grid_aggregates);
  tcase_add_test(tc, test_bins_huge_steps);
  suite_add_tcase(s, tc);
  tc = tcase_create("svg");
  tcase_add_test(tc, test_ticks);
  tcase_add_test(tc, test_plot_render);
  tcase_add_test(tc, test_plot_log_axes);
  tcase_add_test(tc, test_plot_lone_points);
  tcase_add_test(tc, test_heatmap_many_layers);
  tcase_add_test(tc, test_colormap);
  suite_add_tcase(s, tc);
  tc = tcase_create("html");
  tcase_set_timeout(tc, 30);
  tcase_add_test(tc, test_report_self_contained);
  tcase_add_test(tc, test_report_baseline_diff_bisect);
  tcase_add_test(tc, test_report_states);
  tcase_add_test(tc, test_report_loss_axis);
  tcase_add_test(tc, test_report_scaling_source);
  tcase_add_test(tc, test_report_long_trace_size);
  tcase_add_test(tc, test_report_clip_without_finite_norm);
  tcase_add_test(tc, test_report_clip_not_measured);
  tcase_add_test(tc, test_report_nonfinite_story);
  tcase_add_test(tc, test_report_masked_logits);
  tcase_add_test(tc, test_report_rows_capped);
  tcase_add_test(tc, test_report_rows_of_recorded_layers);
  tcase_add_test(tc, test_report_colour_bar_labels);
  tcase_add_test(tc, test_report_bf16_headroom);
  tcase_add_test(tc, test_report_mixed_formats_headroom);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  SRunner *sr = srunner_create(make_report_suite());
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
