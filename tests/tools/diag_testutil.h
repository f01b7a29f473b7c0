/*
 * tests/tools/diag_testutil.h - what the post-mortem's Check suites share
 * to write a small trace through the libprobe writer API and read it back
 * isolated: a path in the test folder, a full-trace session, a layer, a
 * record of N constant (or ramped) values with planted NaN/inf/zeros, a
 * step's end with its scalars, the diagnosis of a trace and a search of a
 * finding's text. Static inline: each suite is its own program and takes
 * what it needs.
 */
#ifndef AMPPROBE_TESTS_DIAG_TESTUTIL_H
#define AMPPROBE_TESTS_DIAG_TESTUTIL_H

#include <check.h>
#include <math.h>
#include <string.h>

#include "ampprobe/analysis.h"
#include "ampprobe/probe.h"
#include "probe_testutil.h"

#define DIAG_N 16           /* values in a record */
#define DIAG_PUT_BUFFERS 64 /* records of one step, at most */

/* a path in this process's test folder, removed with it (pt_path) */
static inline const char *diag_tmp_path(const char *tag) {
  static char path_buf[256];
  pt_path(path_buf, sizeof path_buf, tag);
  return path_buf;
}

static inline probe_session *diag_open(const char *p, const char *policy) {
  probe_options o;
  probe_options_init(&o);
  o.mode = PROBE_MODE_FULL;
  o.overwrite = 1;
  o.precision_policy = policy;
  probe_session *s = NULL;
  ck_assert_int_eq(probe_session_open(&s, p, &o), PROBE_OK);
  return s;
}

static inline int32_t diag_layer(probe_session *s, const char *name, probe_kind kind,
                          probe_dtype prec) {
  int32_t id;
  ck_assert_int_eq(probe_layer_register(s, name, kind, prec, &id), PROBE_OK);
  return id;
}

/* DIAG_N values v (ramp: v * (0.5 + i/DIAG_N)), then the first nan NaN,
 * inf +inf, zeros 0. The data must stay valid until probe_step_end (the
 * session may snapshot it then: probe.h), so each record of a step gets
 * its own buffer. */
static inline void diag_put(probe_session *s, int32_t id, probe_site site, float v,
                     int ramp, int nan, int inf, int zeros) {
  static float pool[DIAG_PUT_BUFFERS][DIAG_N];
  static unsigned next;
  float *x = pool[next++ % DIAG_PUT_BUFFERS];
  for (int i = 0; i < DIAG_N; i++)
    x[i] = ramp ? v * (0.5f + (float)i / DIAG_N) : v;
  int k = 0;
  for (int i = 0; i < nan; i++) x[k++] = NAN;
  for (int i = 0; i < inf; i++) x[k++] = INFINITY;
  for (int i = 0; i < zeros; i++) x[k++] = 0.0f;
  ck_assert_int_eq(probe_tensor_record(s, id, site, PROBE_DTYPE_F32, x, DIAG_N),
                   PROBE_OK);
}

static inline void diag_end(probe_session *s, double loss, double scale, double lr,
                     int found_inf, int skipped) {
  probe_step_scalars sc = {.loss = loss, .loss_scale = scale, .lr = lr,
                           .found_inf = found_inf, .skipped = skipped};
  ck_assert_int_eq(probe_step_set_scalars(s, &sc), PROBE_OK);
  ck_assert_int_eq(probe_step_end(s), PROBE_OK);
}

/* the post-mortem of the trace at p, read isolated; chunk_rows 0: the
 * default, else that many rows a chunk (several chunks on a small trace) */
static inline void diag_of_rows(probe_diag *d, const char *p, size_t chunk_rows) {
  probe_trace *tr = NULL;
  char err[256];
  ck_assert_int_eq(probe_trace_open_isolated(&tr, p, err, sizeof err), PROBE_OK);
  probe_diag_options o;
  probe_diag_options_init(&o);
  if (chunk_rows) o.chunk_rows = chunk_rows;
  ck_assert_int_eq(probe_diag_run(d, tr, p, &o), PROBE_OK);
  probe_trace_close(tr);
}

static inline void diag_of(probe_diag *d, const char *p) { diag_of_rows(d, p, 0); }

/* 1 when the finding's title, next step or an evidence line holds needle */
static inline int diag_finding_has(const probe_diag_finding *f, const char *needle) {
  if (strstr(f->title, needle) || strstr(f->next_step, needle)) return 1;
  for (int k = 0; k < f->n_evidence; k++)
    if (strstr(f->evidence[k], needle)) return 1;
  return 0;
}

#endif
