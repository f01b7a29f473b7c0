/*
 * tests/reports/test_rankmap.c - Check suite for the ranks x steps view of
 * a trace set (reports/rankmap.c): cells keep the worst state, columns map
 * steps as documented, marks and notes are drawn, names are escaped, and
 * the SVG stays bounded at 1,024 ranks x 1,000 steps whatever the pattern
 * (all healthy, one faulty rank carried to all, random states per cell, a
 * checkerboard), and the page places the view above the rank's panels.
 */
#define _POSIX_C_SOURCE 200809L /* open_memstream */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ampprobe/report.h"

#define BIG_RANKS 1024
#define BIG_STEPS 1000
#define BIG_MAX_BYTES (700 * 1024) /* the bound docs/report.md states */

static int count_substr(const char *hay, const char *needle) {
  int n = 0;
  size_t k = strlen(needle);
  for (const char *p = strstr(hay, needle); p; p = strstr(p + k, needle)) n++;
  return n;
}

static char *render(const probe_rankmap *m, size_t *len, int *merged) {
  probe_buf b;
  probe_buf_init(&b);
  ck_assert_int_eq(probe_rankmap_render(m, "Ranks", 1200, &b, merged),
                   PROBE_OK);
  *len = b.len;
  return b.data;
}

START_TEST(test_rankmap_cells) {
  probe_rankmap *m;
  ck_assert_int_eq(probe_rankmap_new(&m, 0, 10, 0, 99), PROBE_ERR_INVALID_ARG);
  ck_assert_int_eq(probe_rankmap_new(&m, 4, 10, 5, 4), PROBE_ERR_INVALID_ARG);
  ck_assert_int_eq(probe_rankmap_new(&m, 4, 10, 0, 99), PROBE_OK);
  ck_assert_int_eq(probe_rankmap_cols(m), 10);
  /* 10 steps per column: 9 -> 0, 10 -> 1, 99 -> 9 */
  probe_rankmap_add(m, 0, 9, PROBE_RANK_CELL_HEALTHY);
  probe_rankmap_add(m, 0, 10, PROBE_RANK_CELL_SKIPPED);
  probe_rankmap_add(m, 0, 11, PROBE_RANK_CELL_HEALTHY); /* worse kept */
  probe_rankmap_add(m, 0, 99, PROBE_RANK_CELL_NONFINITE);
  probe_rankmap_add(m, 0, 98, PROBE_RANK_CELL_HEALTHY);
  ck_assert_int_eq(probe_rankmap_cell(m, 0, 0), PROBE_RANK_CELL_HEALTHY);
  ck_assert_int_eq(probe_rankmap_cell(m, 0, 1), PROBE_RANK_CELL_SKIPPED);
  ck_assert_int_eq(probe_rankmap_cell(m, 0, 9), PROBE_RANK_CELL_NONFINITE);
  ck_assert_int_eq(probe_rankmap_cell(m, 0, 5), PROBE_RANK_CELL_NONE);
  ck_assert_int_eq(probe_rankmap_cell(m, 1, 0), PROBE_RANK_CELL_NONE);
  ck_assert_int_eq(probe_rankmap_last_step(m, 0), 99);
  ck_assert_int_eq(probe_rankmap_last_step(m, 1), -1);
  /* out of range: ignored, not a crash */
  probe_rankmap_add(m, 4, 0, PROBE_RANK_CELL_NONFINITE);
  probe_rankmap_add(m, -1, 0, PROBE_RANK_CELL_NONFINITE);
  ck_assert_int_eq(probe_rankmap_cell(m, 4, 0), PROBE_RANK_CELL_NONE);
  probe_rankmap_count_add(m, PROBE_RANK_CELL_HEALTHY, 7);
  ck_assert_int_eq(probe_rankmap_count(m, PROBE_RANK_CELL_HEALTHY), 7);
  probe_rankmap_free(m);
  /* fewer steps than columns: one column per step */
  ck_assert_int_eq(probe_rankmap_new(&m, 2, 500, 10, 14), PROBE_OK);
  ck_assert_int_eq(probe_rankmap_cols(m), 5);
  probe_rankmap_add(m, 1, 13, PROBE_RANK_CELL_SKIPPED);
  ck_assert_int_eq(probe_rankmap_cell(m, 1, 3), PROBE_RANK_CELL_SKIPPED);
  probe_rankmap_free(m);
}
END_TEST

/* 4 ranks: 0 healthy, 1 the first inf/NaN at step 12, 2 stopped at 7,
 * 3 missing; and an unreadable 5th row. */
static probe_rankmap *small_map(void) {
  probe_rankmap *m;
  ck_assert_int_eq(probe_rankmap_new(&m, 5, 500, 0, 19), PROBE_OK);
  const char *lab[5] = {"rank 0", "rank 1", "rank 2", "rank 3", "file 4"};
  for (int r = 0; r < 5; r++)
    ck_assert_int_eq(probe_rankmap_set_row(m, r, lab[r],
                                           r == 3   ? PROBE_RANK_ROW_MISSING
                                           : r == 4 ? PROBE_RANK_ROW_UNREADABLE
                                                    : PROBE_RANK_ROW_TRACE,
                                           "t.h5"),
                     PROBE_OK);
  for (int64_t s = 0; s < 20; s++) {
    probe_rankmap_add(m, 0, s, s == 12 ? PROBE_RANK_CELL_SKIPPED
                                       : PROBE_RANK_CELL_HEALTHY);
    probe_rankmap_add(m, 1, s, s == 12 ? PROBE_RANK_CELL_NONFINITE
                                       : PROBE_RANK_CELL_HEALTHY);
    if (s <= 7) probe_rankmap_add(m, 2, s, PROBE_RANK_CELL_HEALTHY);
  }
  probe_rankmap_mark_first(m, 1, 12);
  probe_rankmap_mark_stop(m, 2);
  ck_assert_int_eq(probe_rankmap_note(m, 1, "first inf/NaN: step 12"), PROBE_OK);
  ck_assert_int_eq(probe_rankmap_note(m, 2, "stopped first"), PROBE_OK);
  ck_assert_int_eq(probe_rankmap_note(m, 2, "incomplete"), PROBE_OK);
  ck_assert_int_eq(probe_rankmap_note(m, 3, "missing: no trace file"), PROBE_OK);
  return m;
}

START_TEST(test_rankmap_render_marks) {
  probe_rankmap *m = small_map();
  size_t len;
  int merged = 0;
  char *svg = render(m, &len, &merged);
  ck_assert_int_eq(merged, 1);
  ck_assert_int_eq(count_substr(svg, "<svg"), 1);
  ck_assert_int_eq(count_substr(svg, "</svg>"), 1);
  ck_assert_int_eq(count_substr(svg, "id=\"first-nonfinite\""), 1);
  ck_assert_int_eq(count_substr(svg, "class=\"stop\""), 1);
  /* each state one path: healthy, skipped, non-finite, missing, unreadable */
  ck_assert_int_eq(count_substr(svg, "<path fill=\"#a1d99b\""), 1);
  ck_assert_int_eq(count_substr(svg, "<path fill=\"#fdae6b\""), 1);
  ck_assert_int_eq(count_substr(svg, "<path fill=\"#000000\""), 1);
  ck_assert_int_eq(count_substr(svg, "<path fill=\"#bdbdbd\""), 1);
  ck_assert_int_eq(count_substr(svg, "<path fill=\"#c5b0d5\""), 1);
  ck_assert_ptr_nonnull(strstr(svg, "rank 2: stopped first; incomplete"));
  ck_assert_ptr_nonnull(strstr(svg, "rank 3: missing: no trace file"));
  ck_assert_ptr_nonnull(strstr(svg, "rank 1: first inf/NaN: step 12"));
  ck_assert_ptr_nonnull(strstr(svg, "missing rank (no file)"));
  ck_assert_ptr_nonnull(strstr(svg, "unreadable file"));
  ck_assert_ptr_nonnull(strstr(svg, "each column: 1 step,"));
  /* the first inf/NaN's ring sits over step 12 of 20 in the grid */
  const char *ring = strstr(svg, "id=\"first-nonfinite\" x=\"");
  double x = atof(ring + strlen("id=\"first-nonfinite\" x=\""));
  double gx = 96, gw = 1200 - 96 - 300, want = gx + gw * 12.0 / 20;
  ck_assert_double_eq_tol(x, want, 0.2);
  free(svg);
  probe_rankmap_free(m);
}
END_TEST

START_TEST(test_rankmap_escapes_names) {
  probe_rankmap *m;
  ck_assert_int_eq(probe_rankmap_new(&m, 2, 10, 0, 9), PROBE_OK);
  ck_assert_int_eq(probe_rankmap_set_row(m, 0, "<b>rank\n0\x1b[2J",
                                         PROBE_RANK_ROW_TRACE,
                                         "dir/<script>alert(1)</script>&.h5"),
                   PROBE_OK);
  ck_assert_int_eq(probe_rankmap_set_row(m, 1, "rank 1", PROBE_RANK_ROW_TRACE,
                                         NULL),
                   PROBE_OK);
  ck_assert_int_eq(probe_rankmap_note(m, 0, "layer \"x\"\n<img src=y>"),
                   PROBE_OK);
  probe_rankmap_add(m, 0, 3, PROBE_RANK_CELL_HEALTHY);
  size_t len;
  char *svg = render(m, &len, NULL);
  ck_assert_ptr_null(strstr(svg, "<b>"));
  ck_assert_ptr_null(strstr(svg, "<script"));
  ck_assert_ptr_null(strstr(svg, "<img"));
  ck_assert_ptr_null(strchr(svg, '\x1b'));
  ck_assert_ptr_nonnull(strstr(svg, "&lt;b&gt;rank\\n0\\e[2J"));
  ck_assert_ptr_nonnull(strstr(svg, "&lt;script&gt;alert(1)&lt;/script&gt;&amp;.h5"));
  ck_assert_ptr_nonnull(strstr(svg, "layer &quot;x&quot;\\n&lt;img src=y&gt;"));
  free(svg);
  probe_rankmap_free(m);
}
END_TEST

static uint64_t next(uint64_t *s) { /* xorshift */
  *s ^= *s << 13;
  *s ^= *s >> 7;
  *s ^= *s << 17;
  return *s;
}

/* 1,024 ranks x 1,000 steps, pattern _i: 0 all healthy, 1 rank 517 turns
 * non-finite at step 600 and the all-reduce carries it (others skip), rank
 * 900 stops at 420, 2 random states per cell, 3 a checkerboard. */
START_TEST(test_rankmap_bounded) {
  probe_rankmap *m;
  ck_assert_int_eq(probe_rankmap_new(&m, BIG_RANKS, 500, 0, BIG_STEPS - 1),
                   PROBE_OK);
  uint64_t seed = 0x9e3779b97f4a7c15ull;
  char lab[32];
  for (int r = 0; r < BIG_RANKS; r++) {
    snprintf(lab, sizeof lab, "rank %d", r);
    ck_assert_int_eq(probe_rankmap_set_row(m, r, lab, PROBE_RANK_ROW_TRACE,
                                           "out/t.rank.h5"),
                     PROBE_OK);
    for (int64_t s = 0; s < BIG_STEPS; s++) {
      probe_rank_cell c = PROBE_RANK_CELL_HEALTHY;
      if (_i == 1) {
        if (r == 900 && s > 420) continue;
        if (s >= 600) c = r == 517 ? PROBE_RANK_CELL_NONFINITE
                                   : PROBE_RANK_CELL_SKIPPED;
      } else if (_i == 2) {
        c = (probe_rank_cell)(next(&seed) % 4);
      } else if (_i == 3) {
        c = ((r + s / 8) & 1) ? PROBE_RANK_CELL_SKIPPED
                              : PROBE_RANK_CELL_HEALTHY;
      }
      probe_rankmap_add(m, r, s, c);
    }
  }
  if (_i == 1) {
    probe_rankmap_mark_first(m, 517, 600);
    probe_rankmap_mark_stop(m, 900);
    probe_rankmap_note(m, 517, "first inf/NaN: step 600");
    probe_rankmap_note(m, 900, "stopped first");
  }
  size_t len;
  int merged = 0;
  char *svg = render(m, &len, &merged);
  fprintf(stderr, "rankmap pattern %d: %zu bytes, columns merged by %d\n",
          _i, len, merged);
  ck_assert_uint_lt(len, BIG_MAX_BYTES);
  ck_assert_int_eq(count_substr(svg, "<svg"), count_substr(svg, "</svg>"));
  /* a label at most every few rows: ticks, not 1,024 overlapping texts */
  ck_assert_int_lt(count_substr(svg, "<text"), 200);
  ck_assert_int_ge(count_substr(svg, ">rank 1000<"), 1);
  if (_i == 0) ck_assert_uint_lt(len, 32 * 1024); /* one block */
  if (_i == 1) {
    ck_assert_uint_lt(len, 64 * 1024);
    ck_assert_int_eq(count_substr(svg, "id=\"first-nonfinite\""), 1);
    ck_assert_int_eq(count_substr(svg, "class=\"stop\""), 1);
    ck_assert_ptr_nonnull(strstr(svg, "rank 517: first inf/NaN"));
  }
  if (_i == 2) ck_assert_int_gt(merged, 2); /* random: columns merged */
  /* runs drawn: never more than the bound */
  ck_assert_int_le(count_substr(svg, "z"), PROBE_RANKMAP_MAX_RUNS + 64);
  free(svg);
  probe_rankmap_free(m);
}
END_TEST

START_TEST(test_rankmap_many_notes) {
  probe_rankmap *m;
  ck_assert_int_eq(probe_rankmap_new(&m, BIG_RANKS, 100, 0, 99), PROBE_OK);
  for (int r = 0; r < BIG_RANKS; r++) {
    ck_assert_int_eq(probe_rankmap_set_row(m, r, "r", PROBE_RANK_ROW_MISSING,
                                           NULL),
                     PROBE_OK);
    ck_assert_int_eq(probe_rankmap_note(m, r, "missing: no trace file"),
                     PROBE_OK);
  }
  /* the first inf/NaN's and a stopped rank's notes are drawn whatever
   * their row: rows 640 and 1000 */
  ck_assert_int_eq(probe_rankmap_set_row(m, 640, "rank 640",
                                         PROBE_RANK_ROW_TRACE, NULL),
                   PROBE_OK);
  probe_rankmap_add(m, 640, 50, PROBE_RANK_CELL_NONFINITE);
  probe_rankmap_mark_first(m, 640, 50);
  ck_assert_int_eq(probe_rankmap_set_row(m, 1000, "rank 1000",
                                         PROBE_RANK_ROW_TRACE, NULL),
                   PROBE_OK);
  probe_rankmap_add(m, 1000, 10, PROBE_RANK_CELL_HEALTHY);
  probe_rankmap_mark_stop(m, 1000);
  size_t len;
  char *svg = render(m, &len, NULL);
  ck_assert_int_eq(count_substr(svg, "r: missing: no trace file"), 22);
  ck_assert_ptr_nonnull(strstr(svg, ">rank 640: missing: no trace file"));
  ck_assert_ptr_nonnull(strstr(svg, ">rank 1000: missing: no trace file"));
  ck_assert_ptr_nonnull(strstr(svg, "and 1000 more rows with notes"));
  ck_assert_uint_lt(len, 64 * 1024);
  free(svg);
  probe_rankmap_free(m);
}
END_TEST

START_TEST(test_rankmap_in_page) {
  probe_report *r;
  probe_report_options o;
  probe_report_options_init(&o);
  ck_assert_int_eq(probe_report_new(&r, &o), PROBE_OK);
  ck_assert_int_eq(probe_report_set_range(r, 0, 19), PROBE_OK);
  ck_assert_int_eq(probe_report_add_meta(r, "trace of rank 1", "t.rank1.h5"),
                   PROBE_OK);
  ck_assert_int_eq(probe_report_set_rankmap(r, small_map(), "Ranks x steps: "
                                            "4 ranks", "help <text>"),
                   PROBE_OK);
  const char *hdr[2] = {"rank", "note"};
  int tid;
  ck_assert_int_eq(probe_report_add_table(r, PROBE_REPORT_RANKS, "Ranks", 2,
                                          hdr, &tid),
                   PROBE_OK);
  const char *row[2] = {"rank 3", "missing <no file>"};
  ck_assert_int_eq(probe_report_table_row(r, tid, row), PROBE_OK);
  char *mem = NULL;
  size_t n = 0;
  FILE *f = open_memstream(&mem, &n);
  ck_assert_int_eq(probe_report_write(r, f), PROBE_OK);
  fclose(f);
  const char *view = strstr(mem, "id=\"rankmap\"");
  const char *table = strstr(mem, "missing &lt;no file&gt;");
  const char *trace = strstr(mem, "<h2>Trace</h2>");
  const char *curves = strstr(mem, "<h2>Training curves</h2>");
  ck_assert_ptr_nonnull(view);
  ck_assert_ptr_nonnull(table);
  ck_assert_ptr_nonnull(trace);
  ck_assert(view < table && table < trace && trace < curves);
  ck_assert_ptr_nonnull(strstr(mem, "help &lt;text&gt;"));
  ck_assert_ptr_nonnull(strstr(mem, "<h2 id=\"ranks\">Ranks x steps: 4 ranks"));
  free(mem);
  probe_report_free(r);
}
END_TEST

int main(void) {
  Suite *s = suite_create("rankmap");
  TCase *tc = tcase_create("rankmap");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_rankmap_cells);
  tcase_add_test(tc, test_rankmap_render_marks);
  tcase_add_test(tc, test_rankmap_escapes_names);
  tcase_add_loop_test(tc, test_rankmap_bounded, 0, 4);
  tcase_add_test(tc, test_rankmap_many_notes);
  tcase_add_test(tc, test_rankmap_in_page);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
