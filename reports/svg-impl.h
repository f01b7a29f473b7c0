/*
 * reports/svg-impl.h - helpers shared by the plot and heatmap renderers
 * (internal to the reports library; names probe__).
 */
#ifndef AMPPROBE_REPORTS_SVG_IMPL_H
#define AMPPROBE_REPORTS_SVG_IMPL_H

#include <stddef.h>
#include <stdint.h>

/* Step number as tick text: 12000 -> "12k" (only for round thousands). */
void probe__step_text(char *s, size_t cap, int64_t v);
/* Approximate width in pixels of s in the report's sans-serif font. */
double probe__text_width(const char *s, double font_px);

/* Step ranges onto columns. Steps are int64 in [0, 2^63): x1 - x0 + 1, and
 * (x - x0) * ncols, overflow int64 on a trace whose steps reach 2^62 (a
 * heap overflow in the binning, once), so these are the one place a step
 * becomes a column. All take an inclusive range x0 <= x1. */
/* x1 - x0 + 1 as a double (2^64 at most; exact below 2^53). */
double probe__span(int64_t x0, int64_t x1);
/* ncols, or x1 - x0 + 1 when that is fewer (one step a column). */
int probe__cols_for(int ncols, int64_t x0, int64_t x1);
/* Column of x: floor((x - x0) * ncols / (x1 - x0 + 1)), exact while that
 * product fits 64 bits (in double past it), clamped to [0, ncols - 1]. */
int probe__col_of(int64_t x, int64_t x0, int64_t x1, int ncols);
/* x0 + off clamped to [x0, x1] (off a pixel's offset in steps, >= 0). */
int64_t probe__step_at(int64_t x0, int64_t x1, double off);
/* A tick value as a step: rounded towards zero, clamped to int64. */
int64_t probe__step_of(double v);

#endif /* AMPPROBE_REPORTS_SVG_IMPL_H */
