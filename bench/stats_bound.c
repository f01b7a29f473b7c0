/*
 * bench/stats_bound.c - what bounds the fused statistics kernel on fp16 data
 * on one core: the double-precision sums alone, measured.
 *
 *   bench_stats_bound [--markdown] [--path portable|avx2|avx512]
 *
 * On an L2-resident 1 MiB fp16 buffer (N(0,1) values), all in one run:
 *  - read: the read baseline of bench_stats (sum of 64-bit words) and
 *    the same N(0,1) data (both from stats_data.h);
 *  - fused: probe_stats_compute, the whole record;
 *  - sums (convert): only sum and sum of squares in double, the way the
 *    kernel's conversion-based paths compute them (vcvtph2ps, vcvtps2pd,
 *    add, FMA; 4+4 accumulators), with AVX2 and (where the CPU has it)
 *    AVX-512;
 *  - sums (built): the same sums with each binary64 pattern built from the
 *    fp16 bits by integer shifts and unpacks instead of the two conversions
 *    (exact for normal numbers, which is all this data has but zeros);
 *  - everything but the sums is not timed apart (it would need a second
 *    kernel); fused minus the cheaper sums is a lower bound for it only if
 *    the two overlapped perfectly, which they do not.
 * Cycles per 32 elements use the core clock measured by a chain of
 * dependent additions. This is how the fp16 bound was found: the two
 * conversions per element (vcvtph2ps, vcvtps2pd) share two of Zen 5's four
 * vector pipes with the double additions, and the convert loop alone took
 * about 7 of the fused kernel's 10 cycles per 32 elements. The kernel's fp16
 * window mode has since stopped converting (an exact integer sum by
 * vpdpwssd, squares of binary64 patterns built from the bits:
 * stats_avx512.c); the two loops here stay as the reference for what
 * converting costs, which fp32, bf16 and fp16 pair mode still do.
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ampprobe/numerics.h"
#include "stats_data.h"

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static volatile double g_sink;

#if defined(__x86_64__)
#include <immintrin.h>

/* Core clock in GHz: 4 dependent 1-cycle additions per iteration. */
static double clock_ghz(void) {
  double best = 0;
  for (int r = 0; r < 3; r++) {
    uint64_t x = 1, n = 200000000ull;
    double t0 = now_s();
    for (uint64_t i = 0; i < n; i++)
      __asm__ volatile("add $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\tadd $1, %0" : "+r"(x));
    double g = 4.0 * (double)n / (now_s() - t0) / 1e9;
    if (g > best) best = g;
  }
  return best;
}

#define AVX512 __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,f16c,fma,avx2")))

#define ACC8(d0, d1, d2, d3, e0, e1, e2, e3)                                   \
  s0 = _mm512_add_pd(s0, _mm512_add_pd(d0, d2));                               \
  s1 = _mm512_add_pd(s1, _mm512_add_pd(d1, d3));                               \
  s2 = _mm512_add_pd(s2, _mm512_add_pd(e0, e2));                               \
  s3 = _mm512_add_pd(s3, _mm512_add_pd(e1, e3));                               \
  q0 = _mm512_fmadd_pd(d0, d0, q0);                                            \
  q1 = _mm512_fmadd_pd(d1, d1, q1);                                            \
  q2 = _mm512_fmadd_pd(d2, d2, q2);                                            \
  q3 = _mm512_fmadd_pd(d3, d3, q3);                                            \
  q4 = _mm512_fmadd_pd(e0, e0, q4);                                            \
  q5 = _mm512_fmadd_pd(e1, e1, q5);                                            \
  q6 = _mm512_fmadd_pd(e2, e2, q6);                                            \
  q7 = _mm512_fmadd_pd(e3, e3, q7)

#define ACC_DECL                                                               \
  __m512d s0 = _mm512_setzero_pd(), s1 = s0, s2 = s0, s3 = s0, q0 = s0, q1 = s0, \
          q2 = s0, q3 = s0, q4 = s0, q5 = s0, q6 = s0, q7 = s0
#define ACC_RESULT                                                             \
  _mm512_reduce_add_pd(_mm512_add_pd(_mm512_add_pd(s0, s1), _mm512_add_pd(s2, s3))) + \
      _mm512_reduce_add_pd(_mm512_add_pd(                                      \
          _mm512_add_pd(_mm512_add_pd(q0, q1), _mm512_add_pd(q2, q3)),         \
          _mm512_add_pd(_mm512_add_pd(q4, q5), _mm512_add_pd(q6, q7))))

AVX512 static double sums_convert(const uint16_t *p, size_t n) {
  ACC_DECL;
  for (size_t i = 0; i + 64 <= n; i += 64) {
#define CV(k) _mm512_cvtps_pd(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(p + i + 8 * (k)))))
    __m512d d0 = CV(0), d1 = CV(1), d2 = CV(2), d3 = CV(3);
    __m512d e0 = CV(4), e1 = CV(5), e2 = CV(6), e3 = CV(7);
#undef CV
    ACC8(d0, d1, d2, d3, e0, e1, e2, e3);
  }
  return ACC_RESULT;
}

/* binary64 of the normal fp16 values among the 32 in h (zeros and
 * subnormals give +-0 here; N(0,1) data has a few dozen subnormals in 2^19
 * values, so this sum differs from the kernel's by about 1e-9 relative):
 * high 16 bits sign | (|h| >> 6) + ((1023 - 15) << 4), next 16 bits
 * h << 10, low 32 bits zero. */
AVX512 static inline void build4(__m512i h, __m512d *d0, __m512d *d1, __m512d *d2, __m512d *d3) {
  const __m512i m7fff = _mm512_set1_epi16(0x7fff), bias = _mm512_set1_epi16((1023 - 15) << 4);
  const __m512i sign = _mm512_set1_epi16(INT16_MIN), z = _mm512_setzero_si512();
  __m512i a = _mm512_and_si512(h, m7fff);
  __mmask32 nz = _mm512_cmpge_epu16_mask(a, _mm512_set1_epi16(0x0400));
  __m512i hi = _mm512_ternarylogic_epi32(sign, h, _mm512_maskz_add_epi16(nz, _mm512_srli_epi16(a, 6), bias), 0xca);
  __m512i mid = _mm512_maskz_slli_epi16(nz, h, 10);
  __m512i w0 = _mm512_unpacklo_epi16(mid, hi), w1 = _mm512_unpackhi_epi16(mid, hi);
  *d0 = _mm512_castsi512_pd(_mm512_unpacklo_epi32(z, w0));
  *d1 = _mm512_castsi512_pd(_mm512_unpackhi_epi32(z, w0));
  *d2 = _mm512_castsi512_pd(_mm512_unpacklo_epi32(z, w1));
  *d3 = _mm512_castsi512_pd(_mm512_unpackhi_epi32(z, w1));
}

AVX512 static double sums_built(const uint16_t *p, size_t n) {
  ACC_DECL;
  for (size_t i = 0; i + 64 <= n; i += 64) {
    __m512d d0, d1, d2, d3, e0, e1, e2, e3;
    build4(_mm512_loadu_si512(p + i), &d0, &d1, &d2, &d3);
    build4(_mm512_loadu_si512(p + i + 32), &e0, &e1, &e2, &e3);
    ACC8(d0, d1, d2, d3, e0, e1, e2, e3);
  }
  return ACC_RESULT;
}

/* The same two loops with AVX2 (4 doubles per vector): what the AVX2 path
 * would pay for its fp16 sums by converting, and what building the binary64
 * patterns costs there (stats_avx2.c's HALF_SQ2, signed here). */
#define AVX2T __attribute__((target("avx2,f16c,fma")))
#define ACC2_DECL                                                              \
  __m256d s0 = _mm256_setzero_pd(), s1 = s0, s2 = s0, s3 = s0, q0 = s0, q1 = s0, q2 = s0, q3 = s0
#define ACC2(d0, d1, d2, d3)                                                   \
  s0 = _mm256_add_pd(s0, d0);                                                  \
  s1 = _mm256_add_pd(s1, d1);                                                  \
  s2 = _mm256_add_pd(s2, d2);                                                  \
  s3 = _mm256_add_pd(s3, d3);                                                  \
  q0 = _mm256_fmadd_pd(d0, d0, q0);                                            \
  q1 = _mm256_fmadd_pd(d1, d1, q1);                                            \
  q2 = _mm256_fmadd_pd(d2, d2, q2);                                            \
  q3 = _mm256_fmadd_pd(d3, d3, q3)
AVX2T static double acc2_result(__m256d s0, __m256d s1, __m256d s2, __m256d s3, __m256d q0,
                                __m256d q1, __m256d q2, __m256d q3) {
  double t[4], u[4];
  _mm256_storeu_pd(t, _mm256_add_pd(_mm256_add_pd(s0, s1), _mm256_add_pd(s2, s3)));
  _mm256_storeu_pd(u, _mm256_add_pd(_mm256_add_pd(q0, q1), _mm256_add_pd(q2, q3)));
  return (t[0] + t[1]) + (t[2] + t[3]) + (u[0] + u[1]) + (u[2] + u[3]);
}

AVX2T static double sums_convert2(const uint16_t *p, size_t n) {
  ACC2_DECL;
  for (size_t i = 0; i + 16 <= n; i += 16) {
    __m256 f0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(p + i)));
    __m256 f1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(p + i + 8)));
    __m256d d0 = _mm256_cvtps_pd(_mm256_castps256_ps128(f0));
    __m256d d1 = _mm256_cvtps_pd(_mm256_extractf128_ps(f0, 1));
    __m256d d2 = _mm256_cvtps_pd(_mm256_castps256_ps128(f1));
    __m256d d3 = _mm256_cvtps_pd(_mm256_extractf128_ps(f1, 1));
    ACC2(d0, d1, d2, d3);
  }
  return acc2_result(s0, s1, s2, s3, q0, q1, q2, q3);
}

/* Normal values only (zeros and subnormals give +-2^-15 * ..., as in
 * build4 the sum differs from the kernel's by about 1e-9 relative). */
AVX2T static double sums_built2(const uint16_t *p, size_t n) {
  ACC2_DECL;
  const __m256i m7fff = _mm256_set1_epi16(0x7fff), sign = _mm256_set1_epi16(INT16_MIN);
  const __m256i bias = _mm256_set1_epi16((1023 - 15) << 4), z = _mm256_setzero_si256();
  const __m256i mhi = _mm256_set1_epi64x((long long)0xffffffff00000000ull);
  for (size_t i = 0; i + 16 <= n; i += 16) {
    __m256i h = _mm256_loadu_si256((const __m256i *)(const void *)(p + i));
    __m256i a = _mm256_and_si256(h, m7fff);
    __m256i nz = _mm256_cmpgt_epi16(a, _mm256_set1_epi16(0x03ff));
    __m256i w3 = _mm256_or_si256(_mm256_and_si256(h, sign),
                                 _mm256_and_si256(nz, _mm256_add_epi16(_mm256_srli_epi16(a, 6), bias)));
    __m256i w2 = _mm256_and_si256(nz, _mm256_slli_epi16(h, 10));
    __m256i p0 = _mm256_unpacklo_epi16(w2, w3), p1 = _mm256_unpackhi_epi16(w2, w3);
    __m256d d0 = _mm256_castsi256_pd(_mm256_slli_epi64(p0, 32));
    __m256d d1 = _mm256_castsi256_pd(_mm256_and_si256(p0, mhi));
    __m256d d2 = _mm256_castsi256_pd(_mm256_slli_epi64(p1, 32));
    __m256d d3 = _mm256_castsi256_pd(_mm256_and_si256(p1, mhi));
    (void)z;
    ACC2(d0, d1, d2, d3);
  }
  return acc2_result(s0, s1, s2, s3, q0, q1, q2, q3);
}

static double read_words(const uint16_t *p, size_t n) {
  return (double)bench_sum_words(p, n * sizeof *p);
}

static double fused(const uint16_t *p, size_t n) {
  probe_stats s;
  probe_stats_compute(&s, PROBE_DTYPE_F16, p, n);
  return s.sum;
}

typedef double (*kernel_fn)(const uint16_t *, size_t);

/* Best of 7 batches of 200 passes: seconds per pass. */
static double best_pass(kernel_fn f, const uint16_t *p, size_t n) {
  double best = 1e30;
  for (int r = 0; r < 7; r++) {
    double t0 = now_s();
    for (int k = 0; k < 200; k++) g_sink = f(p, n);
    double t = (now_s() - t0) / 200;
    if (t < best) best = t;
  }
  return best;
}

int main(int argc, char **argv) {
  int md = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--markdown"))
      md = 1;
    else if (!strcmp(argv[i], "--path") && i + 1 < argc)
      setenv("AMPPROBE_STATS_PATH", argv[++i], 1); /* read at the first statistics call */
    else {
      fprintf(stderr, "usage: %s [--markdown] [--path portable|avx2|avx512]\n", argv[0]);
      return 2;
    }
  }
  __builtin_cpu_init();
  int avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("f16c");
  int avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c") &&
             __builtin_cpu_supports("fma");
  if (!avx2) {
    printf("bench_stats_bound: skipped, this CPU has no AVX2 + F16C + FMA\n");
    return 0;
  }
  const size_t n = (size_t)1 << 19; /* 1 MiB of fp16: in L2 */
  uint16_t *buf = aligned_alloc(64, n * 2);
  if (!buf) return 1;
  bench_fill((unsigned char *)buf, PROBE_DTYPE_F16, n);
  double ghz = clock_ghz();
  /* the sum loops must agree with the kernel (to 1e-6: see build4) */
  probe_stats st;
  probe_stats_compute(&st, PROBE_DTYPE_F16, buf, n);
  double ref = st.sum + st.sumsq;
  double chk[4] = {sums_convert2(buf, n), sums_built2(buf, n), ref, ref};
  if (avx512) chk[2] = sums_convert(buf, n), chk[3] = sums_built(buf, n);
  for (int k = 0; k < 4; k++)
    if (fabs(chk[k] - ref) > (k % 2 ? 1e-6 : 1e-9) * fabs(ref)) {
      fprintf(stderr, "bench_stats_bound: sum loop %d disagrees (%.17g vs %.17g)\n", k, chk[k], ref);
      return 1;
    }
  static const char *names[] = {"read (64-bit words)", "fused (whole record)",
                                "sums only (AVX2, convert)", "sums only (AVX2, built)",
                                "sums only (AVX-512, convert)", "sums only (AVX-512, built)"};
  kernel_fn fns[] = {read_words, fused, sums_convert2, sums_built2, sums_convert, sums_built};
  char cpu[128];
  printf("bench_stats_bound: fp16, %zu elements (1 MiB, in L2), core clock %.2f GHz, "
         "fused on the %s path\ncpu: %s\n\n",
         n, ghz, probe_stats_path(), bench_cpu_model(cpu, sizeof cpu));
  if (md)
    printf("| loop | GB/s | cycles per 32 elements |\n|---|---:|---:|\n");
  else
    printf("%-30s %8s %12s\n", "loop", "GB/s", "cyc/32 el");
  for (int k = 0; k < (avx512 ? 6 : 4); k++) {
    double t = best_pass(fns[k], buf, n);
    double gbs = (double)n * 2 / t / 1e9, cyc = t * ghz * 1e9 / ((double)n / 32);
    if (md)
      printf("| %s | %.1f | %.2f |\n", names[k], gbs, cyc);
    else
      printf("%-30s %8.1f %12.2f\n", names[k], gbs, cyc);
  }
  free(buf);
  return 0;
}

#else
int main(void) {
  printf("bench_stats_bound: skipped, not an x86-64 build\n");
  return 0;
}
#endif
