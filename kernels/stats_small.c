/*
 * stats_small.c - the AVX-512 path of the statistics kernel for short
 * tensors (a few thousand elements: a trainer's activations, weights and
 * gradients), compiled with -mavx512f -mavx512bw -mavx512vl -mavx512dq
 * -mavx512vbmi2 -mf16c -mfma. stats.c selects it up to PROBE__SMALL_MAX_N elements
 * when the CPU has those extensions.
 *
 * The block path (stats_avx2.c's driver with stats_avx512.c's window mode)
 * is built for throughput on long tensors and pays a fixed set-up and
 * read-out of some 0.6 us per call (its histogram tables and bit-sliced
 * counters); on the 32..1024-element tensors the trainer records per layer
 * that set-up was most of the cost of tracing. This path has none: one loop,
 * 16 elements per step, every element widened to its exact binary32 bits
 * (vcvtph2ps for fp16, a shift for bf16, so that all dtypes share
 * docs/statistics.md's definitions as the portable path does):
 *  - extremes: signed/unsigned max/min of the bits and the smallest
 *    non-zero |x| - 1 (stats_impl.h), over finite lanes;
 *  - counts: f16_subnormal, f16_flush, f16_overflow per lane in vector
 *    counters; zeros are the finite elements not among the non-zero ones,
 *    whose number is that of the bins written below;
 *  - sums: binary32 -> double, two sum and two sum-of-squares accumulators;
 *  - histogram: each non-zero element's bin, as a byte, compressed into a
 *    buffer; at the end, for each bin value between the smallest and the
 *    largest present, one byte compare and popcount per 64 of them (a scalar
 *    count per element cost twice the whole vector loop).
 * Inf and NaN lanes are masked out of all of that and counted by a scalar
 * loop over their step (rare: a tensor that has any is the news).
 * The last partial step uses masked loads; no element is read twice.
 */
#include "stats_impl.h"

#include <string.h>

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512DQ__) && \
    defined(__AVX512VBMI2__) && defined(__F16C__) && defined(__FMA__)
#include <immintrin.h>

enum { NB = PROBE_HIST_BINS };

/* 16 elements (m: which exist) as exact binary32 bit patterns. */
static inline __m512i load16(probe_dtype dt, const unsigned char *p, __mmask16 m) {
  switch (dt) {
  case PROBE_DTYPE_F16:
    return _mm512_castps_si512(_mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p)));
  case PROBE_DTYPE_BF16:
    return _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p)), 16);
  default:
    return _mm512_maskz_loadu_epi32(m, p);
  }
}

void probe__acc_small_avx512(probe__acc *a, probe_dtype dt, const void *data, size_t n) {
  const size_t es = probe_dtype_size(dt);
  const unsigned char *p = data;
  const __m512i mabs = _mm512_set1_epi32(0x7fffffff);
  const __m512i cinf = _mm512_set1_epi32(0x7f800000);
  const __m512i csub = _mm512_set1_epi32(0x38800000);   /* |x| < 2^-14 */
  const __m512i cflush = _mm512_set1_epi32(0x33000001); /* |x| <= 2^-25 */
  const __m512i covf = _mm512_set1_epi32(0x477fefff);   /* |x| >= 65520 */
  const __m512i one = _mm512_set1_epi32(1);
  /* bin = clamp(raw exponent - (127 + MIN_EXP - 1), 0, NB - 1) */
  const __m512i cbias = _mm512_set1_epi32(127 + PROBE_HIST_MIN_EXP - 1);
  const __m512i clast = _mm512_set1_epi32(NB - 1);
  const __m512i z = _mm512_setzero_si512();
  __m512i smax = _mm512_set1_epi32(INT32_MIN), smin = _mm512_set1_epi32(INT32_MAX);
  __m512i umax = z, umin = _mm512_set1_epi32(-1), amin = _mm512_set1_epi32(-1);
  __m512i csb = z, cfl = z, cov = z;
  __m512d s0 = _mm512_setzero_pd(), s1 = s0, q0 = s0, q1 = s0;
  uint8_t bins[PROBE__SMALL_MAX_N + 64]; /* bins of the non-zero elements */
  size_t nb = 0; /* = the number of finite non-zero elements */
  uint64_t nan = 0, posinf = 0, neginf = 0;

  for (size_t i = 0; i < n; i += 16) {
    __mmask16 m = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1u);
    __m512i u = load16(dt, p + i * es, m);
    __m512i ab = _mm512_and_si512(u, mabs);
    __mmask16 fm = _mm512_mask_cmplt_epu32_mask(m, ab, cinf); /* finite */
    if (__builtin_expect(fm != m, 0)) { /* inf or NaN in this step */
      uint32_t w[16];
      _mm512_storeu_si512(w, u);
      for (int k = 0; k < 16; k++) {
        if (!((m & ~fm) >> k & 1)) continue;
        if ((w[k] & 0x7fffffffu) > 0x7f800000u)
          nan++;
        else if (w[k] >> 31)
          neginf++;
        else
          posinf++;
      }
    }
    __mmask16 nz = _mm512_mask_test_epi32_mask(fm, ab, ab);
    smax = _mm512_mask_max_epi32(smax, fm, smax, u);
    smin = _mm512_mask_min_epi32(smin, fm, smin, u);
    umax = _mm512_mask_max_epu32(umax, fm, umax, u);
    umin = _mm512_mask_min_epu32(umin, fm, umin, u);
    amin = _mm512_mask_min_epu32(amin, nz, amin, ab);
    csb = _mm512_mask_add_epi32(csb, _mm512_mask_cmplt_epu32_mask(nz, ab, csub), csb, one);
    cfl = _mm512_mask_add_epi32(cfl, _mm512_mask_cmplt_epu32_mask(nz, ab, cflush), cfl, one);
    cov = _mm512_mask_add_epi32(cov, _mm512_mask_cmpgt_epu32_mask(fm, ab, covf), cov, one);
    __m512 f = _mm512_castsi512_ps(_mm512_maskz_mov_epi32(fm, u));
    __m512d d0 = _mm512_cvtps_pd(_mm512_castps512_ps256(f));
    __m512d d1 = _mm512_cvtps_pd(_mm512_extractf32x8_ps(f, 1));
    s0 = _mm512_add_pd(s0, d0);
    s1 = _mm512_add_pd(s1, d1);
    q0 = _mm512_fmadd_pd(d0, d0, q0);
    q1 = _mm512_fmadd_pd(d1, d1, q1);
    __m512i bin = _mm512_min_epi32(_mm512_max_epi32(_mm512_sub_epi32(_mm512_srli_epi32(ab, 23), cbias), z), clast);
    __m128i b8 = _mm512_cvtepi32_epi8(bin);
    _mm_storeu_si128((__m128i *)(void *)(bins + nb), _mm_maskz_compress_epi8(nz, b8));
    nb += (size_t)__builtin_popcount(nz);
  }

  /* Count the bins: per 64 bins, one byte compare and a popcount for each
   * value between the smallest and the largest present (usually a dozen or
   * two), instead of a load and a store per element. */
  memset(bins + nb, 0xff, 64); /* pad the last vector with no bin */
  size_t nvec = (nb + 63) / 64;
  if (nvec) {
    __m512i lo = _mm512_set1_epi8((char)0xff), hi = _mm512_setzero_si512();
    for (size_t v = 0; v < nvec; v++) {
      __m512i b = _mm512_loadu_si512(bins + 64 * v);
      lo = _mm512_min_epu8(lo, b);
      hi = _mm512_mask_max_epu8(hi, _mm512_cmpneq_epi8_mask(b, _mm512_set1_epi8((char)0xff)), hi, b);
    }
    uint8_t lb[64], hb[64], bmin = 0xff, bmax = 0;
    _mm512_storeu_si512(lb, lo);
    _mm512_storeu_si512(hb, hi);
    for (int k = 0; k < 64; k++) {
      if (lb[k] < bmin) bmin = lb[k];
      if (hb[k] > bmax) bmax = hb[k];
    }
    for (int bv = bmin; bv <= bmax; bv++) {
      const __m512i key = _mm512_set1_epi8((char)bv);
      uint64_t c = 0;
      for (size_t v = 0; v < nvec; v++)
        c += (uint64_t)__builtin_popcountll(
            _cvtmask64_u64(_mm512_cmpeq_epi8_mask(_mm512_loadu_si512(bins + 64 * v), key)));
      a->hist[bv] += c;
    }
  }

  a->count += n;
  a->nan += nan;
  a->posinf += posinf;
  a->neginf += neginf;
  a->zero += (uint64_t)n - nan - posinf - neginf - nb;
  a->sub += (uint64_t)(uint32_t)_mm512_reduce_add_epi32(csb);
  a->flush += (uint64_t)(uint32_t)_mm512_reduce_add_epi32(cfl);
  a->ovf += (uint64_t)(uint32_t)_mm512_reduce_add_epi32(cov);
  a->sum += _mm512_reduce_add_pd(_mm512_add_pd(s0, s1));
  a->sumsq += _mm512_reduce_add_pd(_mm512_add_pd(q0, q1));
  uint32_t am = _mm512_reduce_min_epu32(amin);
  probe__acc_extremes(a, _mm512_reduce_max_epi32(smax), _mm512_reduce_min_epi32(smin),
                      _mm512_reduce_max_epu32(umax), _mm512_reduce_min_epu32(umin),
                      am == UINT32_MAX ? UINT32_MAX : am - 1u);
}

#else /* not compiled for AVX-512: stats.c never selects this path */

void probe__acc_small_avx512(probe__acc *a, probe_dtype dt, const void *data, size_t n) {
  probe__acc_portable(a, dt, data, n);
}

#endif
