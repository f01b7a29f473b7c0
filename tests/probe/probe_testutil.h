/*
 * probe_testutil.h - helpers shared by the libprobe tests: deterministic
 * tensors derived from (step, seq) so a reader can recompute what a writer
 * recorded, temporary paths, and a small trace writer.
 */
#ifndef AMPPROBE_TESTS_PROBE_TESTUTIL_H
#define AMPPROBE_TESTS_PROBE_TESTUTIL_H

#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ampprobe/probe.h"

#define PT_CHECK(call)                                                         \
  do {                                                                         \
    probe_status st_ = (call);                                                 \
    ck_assert_msg(st_ == PROBE_OK, "%s -> %s", #call, probe_status_name(st_)); \
  } while (0)

/* Fills x (n floats) with values that depend on step and seq only. */
static inline void pt_tensor(float *x, size_t n, int64_t step, uint32_t seq) {
  uint32_t h = (uint32_t)(step * 2654435761u) ^ (seq * 40503u + 12345u);
  for (size_t i = 0; i < n; i++) {
    h = h * 1664525u + 1013904223u;
    /* exponents spread over about +-20 binades, both signs, some zeros */
    int e = (int)((h >> 8) % 41) - 20;
    float m = 1.0f + (float)((h >> 16) & 0xff) / 256.0f;
    x[i] = (h & 1u) ? ldexpf(m, e) : -ldexpf(m, e);
    if (((h >> 4) & 31u) == 0) x[i] = 0.0f;
  }
}

/* The statistics a reader must find for the tensor of (step, seq). */
static inline void pt_expected(probe_stats *st, size_t n, int64_t step,
                               uint32_t seq) {
  float *x = malloc(n * sizeof *x);
  pt_tensor(x, n, step, seq);
  probe_stats_compute(st, PROBE_DTYPE_F32, x, n);
  free(x);
}

/* A fresh path under TMPDIR (or /tmp), unique per process and tag. */
static inline void pt_path(char *buf, size_t len, const char *tag) {
  const char *dir = getenv("TMPDIR");
  snprintf(buf, len, "%s/ampprobe-test-%d-%s.h5", dir ? dir : "/tmp",
           (int)getpid(), tag);
}

#endif /* AMPPROBE_TESTS_PROBE_TESTUTIL_H */
