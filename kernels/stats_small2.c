/*
 * stats_small2.c - the AVX2 path of the statistics kernel for short tensors
 * (up to a few thousand elements: a trainer's activations, weights and
 * gradients), compiled with -mavx2 -mf16c -mfma. stats_dispatch.c selects it
 * up to a length per dtype on CPUs with AVX2 but not AVX-512 (or when
 * AMPPROBE_STATS_PATH=avx2).
 *
 * The block path (stats_block.c) pays a fixed set-up and read-out per call
 * (its window counters or pair table, some 0.5 us on a Zen 3); this path has
 * none. As stats_small.c does with AVX-512: one loop, 8 elements per vector,
 * four vectors per step, each element widened to its exact binary32 bits
 * (vcvtph2ps for fp16, a shift for bf16), so all dtypes share
 * docs/statistics.md's definitions:
 *  - extremes: signed/unsigned max/min of the bits and the smallest
 *    non-zero |x| (as min of (|x| - 1) ^ 0x80000000, signed, so that zero
 *    wraps to the largest);
 *  - counts: f16_subnormal, f16_flush (non-zero, by the same biased
 *    compare), f16_overflow per lane;
 *  - sums: binary32 -> double, two sum and two sum-of-squares accumulators;
 *  - histogram: each element's bin as a byte (0xff for zeros), four vectors
 *    packed into one store; at the end, for each bin value between the
 *    smallest and the largest present, a byte compare and subtract per 32
 *    of them into byte counters (at most 128 per lane: n <= 4096) summed by
 *    vpsadbw.
 * A step that is not 32 finite elements (inf or NaN in it, or the last,
 * partial one, read through a zero-padded copy) takes the same loop with
 * every update masked to its finite elements, and counts its inf and NaN
 * by a scalar loop; no element is read twice.
 */
#include "stats_impl.h"

#include <string.h>

#if defined(__AVX2__) && defined(__F16C__) && defined(__FMA__)
#include <immintrin.h>

enum { NB = PROBE_HIST_BINS };

/* 8 elements at p as exact binary32 bit patterns. */
static inline __m256i load8(probe_dtype dt, const unsigned char *p) {
  switch (dt) {
  case PROBE_DTYPE_F16:
    return _mm256_castps_si256(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)p)));
  case PROBE_DTYPE_BF16:
    return _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(const void *)p)), 16);
  default:
    return _mm256_loadu_si256((const __m256i *)(const void *)p);
  }
}

/* NaN, +inf, -inf among the first k lanes of u. */
static void count_nonfinite(__m256i u, int k, uint64_t *nan, uint64_t *posinf, uint64_t *neginf) {
  uint32_t w[8];
  _mm256_storeu_si256((__m256i *)(void *)w, u);
  for (int j = 0; j < k; j++) {
    if ((w[j] & 0x7fffffffu) < 0x7f800000u) continue;
    if ((w[j] & 0x7fffffffu) > 0x7f800000u)
      ++*nan;
    else if (w[j] >> 31)
      ++*neginf;
    else
      ++*posinf;
  }
}

static inline uint64_t hsum32_u(__m256i v) {
  uint32_t t[8];
  _mm256_storeu_si256((__m256i *)(void *)t, v);
  uint64_t s = 0;
  for (int i = 0; i < 8; i++) s += t[i];
  return s;
}

void probe__acc_small_avx2(probe__acc *a, probe_dtype dt, const void *data, size_t n) {
  const size_t es = probe_dtype_size(dt);
  const unsigned char *p = data;
  const __m256i mabs = _mm256_set1_epi32(0x7fffffff), c7f = mabs;
  const __m256i cinf = _mm256_set1_epi32(0x7f800000);
  /* on y = (|x| - 1) ^ 0x80000000 (signed), which is largest for zero */
  const __m256i ksub = _mm256_set1_epi32((int)(0x387fffffu ^ 0x80000000u)); /* 0 < |x| < 2^-14 */
  const __m256i kfl = _mm256_set1_epi32((int)(0x33000000u ^ 0x80000000u));  /* 0 < |x| <= 2^-25 */
  const __m256i covf = _mm256_set1_epi32(0x477fefff);                       /* |x| >= 65520 */
  const __m256i cbias = _mm256_set1_epi32(127 + PROBE_HIST_MIN_EXP - 1);
  const __m256i clast = _mm256_set1_epi32(NB - 1);
  const __m256i z = _mm256_setzero_si256(), ones = _mm256_set1_epi32(-1);
  __m256i smax = _mm256_set1_epi32(INT32_MIN), smin = _mm256_set1_epi32(INT32_MAX);
  __m256i umax = z, umin = ones, aminb = c7f;
  __m256i csb = z, cfl = z, cov = z;
  __m256d s0 = _mm256_setzero_pd(), s1 = s0, q0 = s0, q1 = s0;
  uint8_t bins[PROBE__SMALL_MAX_N + 32];
  uint64_t nan = 0, posinf = 0, neginf = 0;
  size_t nbv = 0; /* bins written, in vectors of 32 */

  /* One vector u of 8 elements; f: all-ones in its finite lanes (masked
   * form) or NULL-like all ones (fast form). bin_: its bins, 0xff for zeros
   * and for lanes not finite. */
#define ELEM8(u, f, MASKED, bin_)                                              \
  do {                                                                         \
    __m256i ab_ = _mm256_and_si256(u, mabs);                                   \
    __m256i y_ = _mm256_add_epi32(ab_, c7f);                                   \
    if (MASKED) {                                                              \
      smax = _mm256_max_epi32(smax, _mm256_blendv_epi8(_mm256_set1_epi32(INT32_MIN), u, f)); \
      smin = _mm256_min_epi32(smin, _mm256_blendv_epi8(_mm256_set1_epi32(INT32_MAX), u, f)); \
      umax = _mm256_max_epu32(umax, _mm256_and_si256(u, f));                   \
      umin = _mm256_min_epu32(umin, _mm256_or_si256(u, _mm256_xor_si256(f, ones))); \
      y_ = _mm256_or_si256(_mm256_and_si256(y_, f), _mm256_andnot_si256(f, c7f)); \
      ab_ = _mm256_and_si256(ab_, f);                                          \
      u = _mm256_and_si256(u, f);                                              \
    } else {                                                                   \
      smax = _mm256_max_epi32(smax, u);                                        \
      smin = _mm256_min_epi32(smin, u);                                        \
      umax = _mm256_max_epu32(umax, u);                                        \
      umin = _mm256_min_epu32(umin, u);                                        \
    }                                                                          \
    aminb = _mm256_min_epi32(aminb, y_);                                       \
    csb = _mm256_sub_epi32(csb, _mm256_cmpgt_epi32(ksub, y_));                 \
    cfl = _mm256_sub_epi32(cfl, _mm256_cmpgt_epi32(kfl, y_));                  \
    cov = _mm256_sub_epi32(cov, _mm256_cmpgt_epi32(ab_, covf));                \
    __m256d d0_ = _mm256_cvtps_pd(_mm256_castps256_ps128(_mm256_castsi256_ps(u))); \
    __m256d d1_ = _mm256_cvtps_pd(_mm256_extractf128_ps(_mm256_castsi256_ps(u), 1)); \
    s0 = _mm256_add_pd(s0, d0_);                                               \
    s1 = _mm256_add_pd(s1, d1_);                                               \
    q0 = _mm256_fmadd_pd(d0_, d0_, q0);                                        \
    q1 = _mm256_fmadd_pd(d1_, d1_, q1);                                        \
    __m256i b_ = _mm256_min_epi32(_mm256_max_epi32(_mm256_sub_epi32(_mm256_srli_epi32(ab_, 23), cbias), z), clast); \
    bin_ = _mm256_or_si256(b_, _mm256_cmpeq_epi32(ab_, z));                    \
  } while (0)
#define PACK_BINS(b0, b1, b2, b3)                                              \
  _mm256_storeu_si256((__m256i *)(void *)(bins + 32 * nbv++),                  \
                      _mm256_packs_epi16(_mm256_packs_epi32(b0, b1), _mm256_packs_epi32(b2, b3)))

  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const unsigned char *q = p + i * es;
    __m256i u0 = load8(dt, q), u1 = load8(dt, q + 8 * es);
    __m256i u2 = load8(dt, q + 16 * es), u3 = load8(dt, q + 24 * es);
    /* all finite: the largest |x| pattern below that of inf */
    __m256i mx = _mm256_max_epu32(_mm256_max_epu32(_mm256_and_si256(u0, mabs), _mm256_and_si256(u1, mabs)),
                                  _mm256_max_epu32(_mm256_and_si256(u2, mabs), _mm256_and_si256(u3, mabs)));
    __m256i b0, b1, b2, b3;
    if (__builtin_expect(_mm256_movemask_epi8(_mm256_cmpgt_epi32(cinf, mx)) == -1, 1)) {
      ELEM8(u0, ones, 0, b0);
      ELEM8(u1, ones, 0, b1);
      ELEM8(u2, ones, 0, b2);
      ELEM8(u3, ones, 0, b3);
      PACK_BINS(b0, b1, b2, b3);
    } else { /* inf or NaN in the step: masked, and counted one by one */
      __m256i us[4] = {u0, u1, u2, u3}, bs[4];
      for (int k = 0; k < 4; k++) {
        __m256i u = us[k];
        __m256i f = _mm256_cmpgt_epi32(cinf, _mm256_and_si256(u, mabs));
        count_nonfinite(u, 8, &nan, &posinf, &neginf);
        __m256i bk;
        ELEM8(u, f, 1, bk);
        bs[k] = _mm256_or_si256(bk, _mm256_xor_si256(f, ones));
      }
      PACK_BINS(bs[0], bs[1], bs[2], bs[3]);
    }
  }
  if (i < n) { /* the last partial step, through a zero-padded copy */
    unsigned char tail[32 * 4];
    memset(tail, 0, sizeof tail);
    memcpy(tail, p + i * es, (n - i) * es);
    __m256i bs[4];
    for (int k = 0; k < 4; k++) {
      __m256i u = load8(dt, tail + 8 * k * es);
      __m256i lane = _mm256_add_epi32(_mm256_set1_epi32(8 * k), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
      __m256i valid = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(n - i)), lane);
      __m256i f = _mm256_and_si256(valid, _mm256_cmpgt_epi32(cinf, _mm256_and_si256(u, mabs)));
      int left = (int)(n - i) - 8 * k;
      count_nonfinite(u, left < 0 ? 0 : left > 8 ? 8 : left, &nan, &posinf, &neginf);
      __m256i bk;
      ELEM8(u, f, 1, bk);
      bs[k] = _mm256_or_si256(bk, _mm256_xor_si256(f, ones));
    }
    PACK_BINS(bs[0], bs[1], bs[2], bs[3]);
  }
#undef PACK_BINS
#undef ELEM8

  /* Count the bins: for each value between the smallest and the largest
   * present, a compare and subtract per 32 bytes into byte counters. */
  uint64_t nonzero = 0;
  if (nbv) {
    __m256i lo = _mm256_set1_epi8((char)0xff), hi = z;
    const __m256i none = _mm256_set1_epi8((char)0xff);
    for (size_t v = 0; v < nbv; v++) {
      __m256i b = _mm256_loadu_si256((const __m256i *)(const void *)(bins + 32 * v));
      lo = _mm256_min_epu8(lo, b);
      hi = _mm256_max_epu8(hi, _mm256_andnot_si256(_mm256_cmpeq_epi8(b, none), b));
    }
    uint8_t lb[32], hb[32], bmin = 0xff, bmax = 0;
    _mm256_storeu_si256((__m256i *)(void *)lb, lo);
    _mm256_storeu_si256((__m256i *)(void *)hb, hi);
    for (int k = 0; k < 32; k++) {
      if (lb[k] < bmin) bmin = lb[k];
      if (hb[k] > bmax) bmax = hb[k];
    }
    for (int bv = bmin; bv <= bmax && bmin != 0xff; bv++) {
      const __m256i key = _mm256_set1_epi8((char)bv);
      __m256i c = z;
      for (size_t v = 0; v < nbv; v++)
        c = _mm256_sub_epi8(c, _mm256_cmpeq_epi8(_mm256_loadu_si256((const __m256i *)(const void *)(bins + 32 * v)), key));
      __m256i s = _mm256_sad_epu8(c, z);
      uint64_t t[4];
      _mm256_storeu_si256((__m256i *)(void *)t, s);
      uint64_t cnt = t[0] + t[1] + t[2] + t[3];
      a->hist[bv] += cnt;
      nonzero += cnt;
    }
  }

  int32_t t0[8], t1[8], t4[8];
  uint32_t t2[8], t3[8];
  _mm256_storeu_si256((__m256i *)(void *)t0, smax);
  _mm256_storeu_si256((__m256i *)(void *)t1, smin);
  _mm256_storeu_si256((__m256i *)(void *)t2, umax);
  _mm256_storeu_si256((__m256i *)(void *)t3, umin);
  _mm256_storeu_si256((__m256i *)(void *)t4, aminb);
  int32_t sx = INT32_MIN, sn = INT32_MAX, mb = INT32_MAX;
  uint32_t ux = 0, un = UINT32_MAX;
  for (int k = 0; k < 8; k++) {
    if (t0[k] > sx) sx = t0[k];
    if (t1[k] < sn) sn = t1[k];
    if (t2[k] > ux) ux = t2[k];
    if (t3[k] < un) un = t3[k];
    if (t4[k] < mb) mb = t4[k];
  }
  a->count += n;
  a->nan += nan;
  a->posinf += posinf;
  a->neginf += neginf;
  a->zero += (uint64_t)n - nan - posinf - neginf - nonzero;
  a->sub += hsum32_u(csb);
  a->flush += hsum32_u(cfl);
  a->ovf += hsum32_u(cov);
  double ts[4], tq[4];
  _mm256_storeu_pd(ts, _mm256_add_pd(s0, s1));
  _mm256_storeu_pd(tq, _mm256_add_pd(q0, q1));
  a->sum += (ts[0] + ts[1]) + (ts[2] + ts[3]);
  a->sumsq += (tq[0] + tq[1]) + (tq[2] + tq[3]);
  probe__acc_extremes(a, sx, sn, ux, un, (uint32_t)mb ^ 0x80000000u);
}

#else /* not compiled for AVX2: stats_dispatch.c never selects this path */

void probe__acc_small_avx2(probe__acc *a, probe_dtype dt, const void *data, size_t n) {
  probe__acc_portable(a, dt, data, n);
}

#endif
