/*
 * bench/stats_data.h - what bench_stats and bench_stats_bound share: the
 * test data (N(0,1), or another distribution for bench_stats --dist) stored
 * in a dtype, and the read-bandwidth baseline (the
 * sum of a buffer's 64-bit words). Header-only: each benchmark is one file.
 */
#ifndef AMPPROBE_BENCH_STATS_DATA_H
#define AMPPROBE_BENCH_STATS_DATA_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "ampprobe/numerics.h"

/* ---- read-bandwidth baseline ---------------------------------------------------- */

#if defined(__x86_64__)
__attribute__((target("avx2"))) static uint64_t bench_sum_words_avx2(const uint64_t *p, size_t n) {
  __m256i a = _mm256_setzero_si256(), b = a, c = a, d = a;
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    a = _mm256_add_epi64(a, _mm256_loadu_si256((const __m256i *)(const void *)(p + i)));
    b = _mm256_add_epi64(b, _mm256_loadu_si256((const __m256i *)(const void *)(p + i + 4)));
    c = _mm256_add_epi64(c, _mm256_loadu_si256((const __m256i *)(const void *)(p + i + 8)));
    d = _mm256_add_epi64(d, _mm256_loadu_si256((const __m256i *)(const void *)(p + i + 12)));
  }
  a = _mm256_add_epi64(_mm256_add_epi64(a, b), _mm256_add_epi64(c, d));
  uint64_t t[4];
  _mm256_storeu_si256((__m256i *)(void *)t, a);
  uint64_t s = t[0] + t[1] + t[2] + t[3];
  for (; i < n; i++) s += p[i];
  return s;
}
#endif

/* Sum of the 64-bit words: the fastest plain read this CPU does. */
static uint64_t bench_sum_words(const void *data, size_t bytes) {
  const uint64_t *p = data;
  size_t n = bytes / 8;
#if defined(__x86_64__)
  if (__builtin_cpu_supports("avx2")) return bench_sum_words_avx2(p, n);
#endif
  uint64_t s = 0;
  for (size_t i = 0; i < n; i++) s += p[i];
  return s;
}

/* The CPU model (/proc/cpuinfo's "model name"), or "unknown". */
static const char *bench_cpu_model(char *buf, size_t len) {
  snprintf(buf, len, "unknown");
  FILE *f = fopen("/proc/cpuinfo", "r");
  if (!f) return buf;
  char line[256];
  while (fgets(line, sizeof line, f)) {
    char *c = strchr(line, ':');
    if (strncmp(line, "model name", 10) || !c) continue;
    c++;
    while (*c == ' ' || *c == '\t') c++;
    c[strcspn(c, "\n")] = 0;
    snprintf(buf, len, "%s", c);
    break;
  }
  fclose(f);
  return buf;
}

/* ---- data ---------------------------------------------------------------------------- */

/* The data bench_stats --dist offers: x = N(0,1) * scale * 2^-U(0, spread),
 * or max(N(0,1), 0). Only "normal" is what the targets are measured on; the
 * others show how the time per element holds on other data. */
typedef struct bench_dist {
  const char *name, *what;
  double scale, spread;
  int relu;
} bench_dist;
static const bench_dist bench_dists[] = {
    {"normal", "N(0,1)", 1, 0, 0},
    {"grad", "N(0,1) * 2^-U(0,8), spread like a layer's gradients", 1, 8, 0},
    {"relu", "max(N(0,1), 0), half zeros", 1, 0, 1},
    {"wide", "N(0,1) * 1e-3 * 2^-U(0,20): fp16 mostly subnormal or zero, fp32/bf16 with f16_flush values",
     1e-3, 20, 0},
    {"underflow", "N(0,1) * 1e-5: fp16 nearly all subnormal", 1e-5, 0, 0},
    {"spread", "N(0,1) * 2^-U(0,40), 40 binades", 1, 40, 0},
};
enum { BENCH_NDISTS = sizeof bench_dists / sizeof bench_dists[0] };
static const bench_dist *g_bench_dist = &bench_dists[0];

/* The distribution named name, or NULL. */
static inline const bench_dist *bench_find_dist(const char *name) {
  for (int i = 0; i < BENCH_NDISTS; i++)
    if (!strcmp(bench_dists[i].name, name)) return &bench_dists[i];
  return NULL;
}

static void bench_fill(unsigned char *buf, probe_dtype dt, size_t n) {
  /* 1M values of g_bench_dist (Box-Muller on an LCG), repeated over the buffer. */
  size_t pat = n < (1u << 20) ? n : (1u << 20);
  float *x = malloc(pat * sizeof *x);
  uint64_t s = 0x853c49e6748fea9bull;
  const bench_dist *bd = g_bench_dist;
  for (size_t i = 0; i < pat; i++) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    double u = ((double)(s >> 11) + 0.5) * 0x1p-53;
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    double v = (double)(s >> 11) * 0x1p-53;
    double g = sqrt(-2 * log(u)) * cos(6.283185307179586 * v);
    if (bd->spread > 0) {
      s = s * 6364136223846793005ull + 1442695040888963407ull;
      g *= exp2(-bd->spread * ((double)(s >> 11) * 0x1p-53));
    }
    if (bd->relu && g < 0) g = 0;
    x[i] = (float)(g * bd->scale);
  }
  size_t es = probe_dtype_size(dt);
  if (dt == PROBE_DTYPE_F32)
    memcpy(buf, x, pat * es);
  else if (dt == PROBE_DTYPE_F16)
    probe_f32_to_f16_array((uint16_t *)(void *)buf, x, pat);
  else
    probe_f32_to_bf16_array((uint16_t *)(void *)buf, x, pat);
  for (size_t done = pat; done < n;) {
    size_t c = n - done < pat ? n - done : pat;
    memcpy(buf + done * es, buf, c * es);
    done += c;
  }
  free(x);
}

#endif /* AMPPROBE_BENCH_STATS_DATA_H */
