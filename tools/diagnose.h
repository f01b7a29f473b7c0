/*
 * tools/diagnose.h - the CLI's view of the post-mortem engine, which lives
 * in the analysis library (include/ampprobe/analysis.h). The short names
 * below keep the CLI files that predate the library compiling; new code
 * uses the probe_diag_* names directly.
 */
#ifndef AMPPROBE_TOOLS_DIAGNOSE_H
#define AMPPROBE_TOOLS_DIAGNOSE_H

#include <stdio.h>
#include <stdlib.h>

#include "ampprobe/analysis.h"

#define DIAG_TEXT_MAX PROBE_DIAG_TEXT_MAX
#define DIAG_EVENT_NONE PROBE_DIAG_EVENT_NONE
#define DIAG_FINDING_HEALTHY PROBE_DIAG_FINDING_HEALTHY
#define diag_finding probe_diag_finding
#define diag_options probe_diag_options
#define diag_options_init probe_diag_options_init
#define diag_layer_name probe_diag_layer_name
#define diag_event_name probe_diag_event_name
#define diag_finding_name probe_diag_finding_name

/* Writes the text report (probe_diag_render_text) to f. */
static inline void probe_diag_print_text(const probe_diag *d, FILE *f) {
  char *t = NULL;
  if (probe_diag_render_text(d, &t) == PROBE_OK) fputs(t, f);
  probe_free(t);
}

#endif /* AMPPROBE_TOOLS_DIAGNOSE_H */
