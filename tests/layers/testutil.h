/*
 * testutil.h - small helpers shared by the layer-kernel tests: a seeded
 * random generator (xorshift64*), array fill and compare, checked malloc.
 * Header-only; every function is static.
 */
#ifndef AMPPROBE_TESTS_LAYERS_TESTUTIL_H
#define AMPPROBE_TESTS_LAYERS_TESTUTIL_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

typedef struct {
  uint64_t s;
} rng_t;

static inline uint64_t rng_u64(rng_t *r) {
  r->s ^= r->s >> 12;
  r->s ^= r->s << 25;
  r->s ^= r->s >> 27;
  return r->s * 2685821657736338717ULL;
}

/* uniform in [lo, hi) */
static inline float rng_uniform(rng_t *r, float lo, float hi) {
  return lo + (hi - lo) * (float)((rng_u64(r) >> 40) * (1.0 / 16777216.0));
}

static inline float *fill_uniform(float *a, size_t n, rng_t *r, float lo,
                                  float hi) {
  for (size_t i = 0; i < n; i++)
    a[i] = rng_uniform(r, lo, hi);
  return a;
}

static inline void *xcalloc_(size_t n, size_t sz, const char *file, int line) {
  void *p = calloc(n ? n : 1, sz);
  if (!p) {
    fprintf(stderr, "%s:%d: out of memory\n", file, line);
    exit(2);
  }
  return p;
}
#define xcalloc(n, sz) xcalloc_((n), (sz), __FILE__, __LINE__)
#define falloc(n) ((float *)xcalloc((n), sizeof(float)))
#define dalloc(n) ((double *)xcalloc((n), sizeof(double)))

/* max |a - b| / max(max |b|, tiny): the relative error of a tensor as a
 * whole, measured against the reference b. NaN in either gives NaN. */
static inline double rel_err_fd(const float *a, const double *b, size_t n) {
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < n; i++) {
    double d = fabs((double)a[i] - b[i]);
    if (isnan(d))
      return NAN;
    if (d > num)
      num = d;
    if (fabs(b[i]) > den)
      den = fabs(b[i]);
  }
  return num / (den > 1e-30 ? den : 1e-30);
}

#endif
