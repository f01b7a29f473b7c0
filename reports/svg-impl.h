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

#endif /* AMPPROBE_REPORTS_SVG_IMPL_H */
