/*
 * stats_avx512.c - the AVX-512 (F, BW, VL, DQ, VBMI2) block functions of
 * the statistics kernel, compiled with -mavx512f -mavx512bw -mavx512vl
 * -mavx512dq -mavx512vbmi2 -mavx2 -mf16c -mfma. stats_avx2.c's driver calls them (cutting
 * blocks, checking for inf/NaN, counting the pair indices into the
 * histogram, the portable tail); stats.c selects this path when the CPU has
 * those extensions.
 *
 * Same work as the AVX2 block functions, in one pass per block: 32 fp16 or
 * bf16 elements, or 2 x 16 fp32 elements, per step (two steps at a time in
 * window mode). With 32 vector registers
 * every accumulator stays in a register; compares go to mask registers and
 * counts are masked adds of one. The pair indices (lo + 66*hi, vpmaddwd)
 * and the meaning of every output are exactly those of stats_avx2.c.
 *
 * Window mode (pd->win >= 0, chosen by the driver when the data's bins are
 * concentrated, as they are in almost every tensor): instead of pair
 * indices, 64 bin values per step are packed to bytes, the eight bins
 * win .. win+7 are counted with byte compares into eight vector byte
 * counters (at most 64 per lane per block), and the bin values of the
 * elements outside the window are compressed (vpcompressb, VBMI2) into
 * pd->outb for the driver to count one by one. This takes the histogram off
 * the scalar store path, which otherwise costs about half the time.
 */
#include "stats_impl.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512DQ__) && defined(__AVX512VBMI2__) && \
    defined(__F16C__) && defined(__FMA__)
#include <immintrin.h>

enum { NB = PROBE_HIST_BINS };
#define F32_BIAS (127 + PROBE_HIST_MIN_EXP - 1)

static inline uint64_t hsum16(__m512i v) { /* 16-bit lane counts */
  return (uint64_t)(int64_t)_mm512_reduce_add_epi32(_mm512_madd_epi16(v, _mm512_set1_epi16(1)));
}

static inline uint64_t hsum32(__m512i v) {
  return (uint64_t)(int64_t)_mm512_reduce_add_epi32(v);
}

/* 32 binary32 values (two vectors) into the double sums: two sum and two
 * sum-of-squares accumulators, which leaves registers for the rest. */
#define SUM32(f0, f1)                                                          \
  do {                                                                         \
    __m512d d0 = _mm512_cvtps_pd(_mm512_castps512_ps256(f0));                  \
    __m512d d1 = _mm512_cvtps_pd(_mm512_extractf32x8_ps(f0, 1));               \
    __m512d d2 = _mm512_cvtps_pd(_mm512_castps512_ps256(f1));                  \
    __m512d d3 = _mm512_cvtps_pd(_mm512_extractf32x8_ps(f1, 1));               \
    s0 = _mm512_add_pd(s0, _mm512_add_pd(d0, d2));                             \
    s1 = _mm512_add_pd(s1, _mm512_add_pd(d1, d3));                             \
    q0 = _mm512_fmadd_pd(d0, d0, q0);                                          \
    q1 = _mm512_fmadd_pd(d1, d1, q1);                                          \
    q0 = _mm512_fmadd_pd(d2, d2, q0);                                          \
    q1 = _mm512_fmadd_pd(d3, d3, q1);                                          \
  } while (0)

/* Reduces 16-bit extreme vectors (raw patterns) into b. */
static void finish16(probe__blk *b, __m512i smax, __m512i smin, __m512i umax, __m512i umin,
                     __m512i amin, int is_f16) {
  int16_t t0[32], t1[32];
  uint16_t t2[32], t3[32], t4[32];
  _mm512_storeu_si512(t0, smax);
  _mm512_storeu_si512(t1, smin);
  _mm512_storeu_si512(t2, umax);
  _mm512_storeu_si512(t3, umin);
  _mm512_storeu_si512(t4, amin);
  int16_t a = INT16_MIN, c = INT16_MAX;
  uint16_t u = 0, w = UINT16_MAX, m = UINT16_MAX;
  for (int i = 0; i < 32; i++) {
    if (t0[i] > a) a = t0[i];
    if (t1[i] < c) c = t1[i];
    if (t2[i] > u) u = t2[i];
    if (t3[i] < w) w = t3[i];
    if (t4[i] < m) m = t4[i];
  }
  probe__blk_extremes16(b, a, c, u, w, m, is_f16);
}

/* Window counting state: eight byte counters (a register each). */
#define WIN_DECL(pd)                                                           \
  const __m512i wbase = _mm512_set1_epi8((char)(pd)->win);                     \
  const __m512i c8 = _mm512_set1_epi8(8);                                      \
  __m512i w0 = _mm512_setzero_si512(), w1 = w0, w2 = w0, w3 = w0;              \
  __m512i w4 = w0, w5 = w0, w6 = w0, w7 = w0;                                  \
  uint8_t *outp = (pd)->outb

/* Counts 64 byte bin values bb into the window or out to outp. */
#define WIN_STEP(bb)                                                           \
  do {                                                                         \
    __m512i r_ = _mm512_sub_epi8((bb), wbase); /* outside: >= 8 unsigned */    \
    const __m512i m1_ = _mm512_set1_epi8(-1);                                  \
    w0 = _mm512_mask_sub_epi8(w0, _mm512_cmpeq_epi8_mask(r_, _mm512_set1_epi8(0)), w0, m1_); \
    w1 = _mm512_mask_sub_epi8(w1, _mm512_cmpeq_epi8_mask(r_, _mm512_set1_epi8(1)), w1, m1_); \
    w2 = _mm512_mask_sub_epi8(w2, _mm512_cmpeq_epi8_mask(r_, _mm512_set1_epi8(2)), w2, m1_); \
    w3 = _mm512_mask_sub_epi8(w3, _mm512_cmpeq_epi8_mask(r_, _mm512_set1_epi8(3)), w3, m1_); \
    w4 = _mm512_mask_sub_epi8(w4, _mm512_cmpeq_epi8_mask(r_, _mm512_set1_epi8(4)), w4, m1_); \
    w5 = _mm512_mask_sub_epi8(w5, _mm512_cmpeq_epi8_mask(r_, _mm512_set1_epi8(5)), w5, m1_); \
    w6 = _mm512_mask_sub_epi8(w6, _mm512_cmpeq_epi8_mask(r_, _mm512_set1_epi8(6)), w6, m1_); \
    w7 = _mm512_mask_sub_epi8(w7, _mm512_cmpeq_epi8_mask(r_, _mm512_set1_epi8(7)), w7, m1_); \
    __mmask64 out_ = _mm512_cmpge_epu8_mask(r_, c8);                           \
    _mm512_storeu_si512(outp, _mm512_maskz_compress_epi8(out_, (bb)));         \
    outp += __builtin_popcountll(out_);                                        \
  } while (0)

static inline uint64_t hsum8(__m512i v) {
  return (uint64_t)_mm512_reduce_add_epi64(_mm512_sad_epu8(v, _mm512_setzero_si512()));
}

#define WIN_FINISH(b, pd)                                                      \
  do {                                                                         \
    (b)->wcount[0] = hsum8(w0);                                                \
    (b)->wcount[1] = hsum8(w1);                                                \
    (b)->wcount[2] = hsum8(w2);                                                \
    (b)->wcount[3] = hsum8(w3);                                                \
    (b)->wcount[4] = hsum8(w4);                                                \
    (b)->wcount[5] = hsum8(w5);                                                \
    (b)->wcount[6] = hsum8(w6);                                                \
    (b)->wcount[7] = hsum8(w7);                                                \
    (b)->nout = (size_t)(outp - (pd)->outb);                                   \
  } while (0)

void probe__blk_f16_avx512(probe__blk *b, uint32_t *idx, const unsigned char *p, size_t nv,
                           const probe__pending *pd) {
  PROBE__PENDING_LOCALS(pd);
  const __m512i m7fff = _mm512_set1_epi16(0x7fff);
  const __m512i c0400 = _mm512_set1_epi16(0x0400);
  const __m512i c7bff = _mm512_set1_epi16(0x7bff);
  const __m512i one = _mm512_set1_epi16(1);
  const __m512i pairc = _mm512_set1_epi32(0x00010000 * NB + 1);
  const __m512i z = _mm512_setzero_si512();
  /* Two counts in one register, a byte each (<= 128 per lane per block):
   * zeros, and |x| < 2^-14 (zeros included). */
  const __m512i csb = _mm512_set1_epi16(1 << 8);
  __m512i cnt = z, amin = _mm512_set1_epi16(-1);
  __m512i smax = _mm512_set1_epi16(INT16_MIN), smin = _mm512_set1_epi16(INT16_MAX);
  __m512i umax = z, umin = _mm512_set1_epi16(-1);
  __m512d s0 = _mm512_setzero_pd(), s1 = s0, q0 = s0, q1 = s0;
  __mmask32 nonfin = 0;
#define F16_STEP(v_, bin_)                                                            \
  do {                                                                                \
    __m512i h = _mm512_loadu_si512(p + 64 * (v_));                                    \
    __m512i a = _mm512_and_si512(h, m7fff);                                           \
    __mmask32 nz = _mm512_test_epi16_mask(a, a); /* non-zero lanes */                 \
    cnt = _mm512_mask_add_epi16(cnt, ~nz, cnt, one);                                  \
    cnt = _mm512_mask_add_epi16(cnt, _mm512_cmplt_epu16_mask(a, c0400), cnt, csb);    \
    nonfin |= _mm512_cmpgt_epu16_mask(a, c7bff);                                      \
    amin = _mm512_mask_min_epu16(amin, nz, amin, a);                                  \
    smax = _mm512_max_epi16(smax, h);                                                 \
    smin = _mm512_min_epi16(smin, h);                                                 \
    umax = _mm512_max_epu16(umax, h);                                                 \
    umin = _mm512_min_epu16(umin, h);                                                 \
    __m512 f0 = _mm512_cvtph_ps(_mm512_castsi512_si256(h));                           \
    __m512 f1 = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(h, 1));                     \
    SUM32(f0, f1);                                                                    \
    bin_ = _mm512_srli_epi16(a, 10); /* raw exponent 0..31 */                         \
  } while (0)
  if (pd->win < 0) { /* pair indices */
    for (size_t v = 0; v < nv / 2; v++) {
      __m512i bv;
      F16_STEP(v, bv);
      _mm512_storeu_si512(idx + 16 * v, _mm512_madd_epi16(bv, pairc));
      PROBE__PENDING_STEP(16);
    }
  } else { /* window: 64 elements, one byte vector of bins, per step */
    WIN_DECL(pd);
    for (size_t v = 0; v < nv / 2; v += 2) {
      __m512i bv0, bv1;
      F16_STEP(v, bv0);
      F16_STEP(v + 1, bv1);
      WIN_STEP(_mm512_packus_epi16(bv0, bv1));
    }
    WIN_FINISH(b, pd);
  }
#undef F16_STEP
  PROBE__PENDING_FINISH(pd);
  b->nonfinite = nonfin != 0;
  const __m512i m8 = _mm512_set1_epi16(0xff);
  b->zero = hsum16(_mm512_and_si512(cnt, m8));
  b->sub = hsum16(_mm512_srli_epi16(cnt, 8)) - b->zero;
  b->flush = 0; /* no binary16 value has 0 < |x| <= 2^-25 */
  b->ovf = 0;   /* nor a finite |x| >= 65520 */
  b->sum = _mm512_reduce_add_pd(_mm512_add_pd(s0, s1));
  b->sumsq = _mm512_reduce_add_pd(_mm512_add_pd(q0, q1));
  finish16(b, smax, smin, umax, umin, amin, 1);
}

void probe__blk_bf16_avx512(probe__blk *b, uint32_t *idx, const unsigned char *p, size_t nv,
                            const probe__pending *pd) {
  PROBE__PENDING_LOCALS(pd);
  const __m512i m7fff = _mm512_set1_epi16(0x7fff);
  const __m512i c3301 = _mm512_set1_epi16(0x3301); /* a <= 0x3300: <= 2^-25 */
  const __m512i c477f = _mm512_set1_epi16(0x477f); /* a >= 0x4780: >= 65520 */
  const __m512i cbias = _mm512_set1_epi16(F32_BIAS);
  const __m512i clast = _mm512_set1_epi16(NB - 1);
  const __m512i one = _mm512_set1_epi16(1);
  const __m512i pairc = _mm512_set1_epi32(0x00010000 * NB + 1);
  const __m512i z = _mm512_setzero_si512();
  /* zeros and |x| <= 2^-25 (zeros included), a byte each (<= 128 per lane
   * per block), in one register; |x| >= 65520 in another. */
  const __m512i cfl = _mm512_set1_epi16(1 << 8);
  __m512i cnt = z, covf = z, amin = _mm512_set1_epi16(-1);
  __m512i smax = _mm512_set1_epi16(INT16_MIN), smin = _mm512_set1_epi16(INT16_MAX);
  __m512i umax = z, umin = _mm512_set1_epi16(-1);
  __m512d s0 = _mm512_setzero_pd(), s1 = s0, q0 = s0, q1 = s0;
#define BF16_STEP(v_, bin_)                                                                 \
  do {                                                                                      \
    __m512i h = _mm512_loadu_si512(p + 64 * (v_));                                          \
    __m512i a = _mm512_and_si512(h, m7fff);                                                 \
    __mmask32 nz = _mm512_test_epi16_mask(a, a);                                            \
    cnt = _mm512_mask_add_epi16(cnt, ~nz, cnt, one);                                        \
    cnt = _mm512_mask_add_epi16(cnt, _mm512_cmplt_epu16_mask(a, c3301), cnt, cfl);          \
    covf = _mm512_mask_add_epi16(covf, _mm512_cmpgt_epu16_mask(a, c477f), covf, one);       \
    amin = _mm512_mask_min_epu16(amin, nz, amin, a);                                        \
    smax = _mm512_max_epi16(smax, h);                                                       \
    smin = _mm512_min_epi16(smin, h);                                                       \
    umax = _mm512_max_epu16(umax, h);                                                       \
    umin = _mm512_min_epu16(umin, h);                                                       \
    /* (0, h) pairs are the binary32 patterns, lane order permuted. */                      \
    __m512 f0 = _mm512_castsi512_ps(_mm512_unpacklo_epi16(z, h));                           \
    __m512 f1 = _mm512_castsi512_ps(_mm512_unpackhi_epi16(z, h));                           \
    SUM32(f0, f1);                                                                          \
    __m512i e = _mm512_srli_epi16(a, 7); /* binary32 raw exponent */                        \
    bin_ = _mm512_min_epu16(_mm512_subs_epu16(e, cbias), clast);                            \
  } while (0)
  if (pd->win < 0) { /* pair indices */
    for (size_t v = 0; v < nv / 2; v++) {
      __m512i bv;
      BF16_STEP(v, bv);
      _mm512_storeu_si512(idx + 16 * v, _mm512_madd_epi16(bv, pairc));
      PROBE__PENDING_STEP(16);
    }
  } else { /* window: 64 elements, one byte vector of bins, per step */
    WIN_DECL(pd);
    for (size_t v = 0; v < nv / 2; v += 2) {
      __m512i bv0, bv1;
      BF16_STEP(v, bv0);
      BF16_STEP(v + 1, bv1);
      WIN_STEP(_mm512_packus_epi16(bv0, bv1));
    }
    WIN_FINISH(b, pd);
  }
#undef BF16_STEP
  PROBE__PENDING_FINISH(pd);
  b->nonfinite = 0; /* decided by the driver from ovf */
  const __m512i m8 = _mm512_set1_epi16(0xff);
  b->zero = hsum16(_mm512_and_si512(cnt, m8));
  b->flush = hsum16(_mm512_srli_epi16(cnt, 8)) - b->zero;
  b->ovf = hsum16(covf);
  b->sub = 0; /* read off the histogram at the fold */
  b->sum = _mm512_reduce_add_pd(_mm512_add_pd(s0, s1));
  b->sumsq = _mm512_reduce_add_pd(_mm512_add_pd(q0, q1));
  finish16(b, smax, smin, umax, umin, amin, 0);
}

void probe__blk_f32_avx512(probe__blk *b, uint32_t *idx, const unsigned char *p, size_t nv,
                           const probe__pending *pd) {
  PROBE__PENDING_LOCALS(pd);
  const __m512i mabs = _mm512_set1_epi32(0x7fffffff);
  const __m512i cflush = _mm512_set1_epi32(0x33000001);
  const __m512i covf = _mm512_set1_epi32(0x477fefff);
  const __m512i cbias = _mm512_set1_epi16(F32_BIAS);
  const __m512i clast = _mm512_set1_epi16(NB - 1);
  const __m512i one = _mm512_set1_epi32(1);
  const __m512i pairc = _mm512_set1_epi32(0x00010000 * NB + 1);
  const __m512i z = _mm512_setzero_si512();
  /* Three counts in one register, 10 bits each (<= 256 per lane per
   * block): zeros, |x| <= 2^-25 (zeros included), |x| >= 65520. */
  const __m512i cfl = _mm512_set1_epi32(1 << 10), cov = _mm512_set1_epi32(1 << 20);
  __m512i cnt = z, amin = _mm512_set1_epi32(-1);
  __m512i smax = _mm512_set1_epi32(INT32_MIN), smin = _mm512_set1_epi32(INT32_MAX);
  __m512i umax = z, umin = _mm512_set1_epi32(-1);
  __m512d s0 = _mm512_setzero_pd(), s1 = s0, q0 = s0, q1 = s0;
#define F32_STEP(v_, bin_)                                                                    \
  do {                                                                                        \
    __m512i x0 = _mm512_loadu_si512(p + 128 * (v_));                                          \
    __m512i x1 = _mm512_loadu_si512(p + 128 * (v_) + 64);                                     \
    __m512i a0 = _mm512_and_si512(x0, mabs), a1 = _mm512_and_si512(x1, mabs);                 \
    __mmask16 nz0 = _mm512_test_epi32_mask(a0, a0), nz1 = _mm512_test_epi32_mask(a1, a1);     \
    cnt = _mm512_mask_add_epi32(cnt, (__mmask16)~nz0, cnt, one);                              \
    cnt = _mm512_mask_add_epi32(cnt, (__mmask16)~nz1, cnt, one);                              \
    cnt = _mm512_mask_add_epi32(cnt, _mm512_cmplt_epu32_mask(a0, cflush), cnt, cfl);          \
    cnt = _mm512_mask_add_epi32(cnt, _mm512_cmplt_epu32_mask(a1, cflush), cnt, cfl);          \
    cnt = _mm512_mask_add_epi32(cnt, _mm512_cmpgt_epu32_mask(a0, covf), cnt, cov);            \
    cnt = _mm512_mask_add_epi32(cnt, _mm512_cmpgt_epu32_mask(a1, covf), cnt, cov);            \
    amin = _mm512_mask_min_epu32(amin, nz0, amin, a0);                                        \
    amin = _mm512_mask_min_epu32(amin, nz1, amin, a1);                                        \
    smax = _mm512_max_epi32(smax, _mm512_max_epi32(x0, x1));                                  \
    smin = _mm512_min_epi32(smin, _mm512_min_epi32(x0, x1));                                  \
    umax = _mm512_max_epu32(umax, _mm512_max_epu32(x0, x1));                                  \
    umin = _mm512_min_epu32(umin, _mm512_min_epu32(x0, x1));                                  \
    SUM32(_mm512_castsi512_ps(x0), _mm512_castsi512_ps(x1));                                  \
    /* Raw exponents (<= 255) packed to 16-bit lanes, order permuted. */                      \
    __m512i e = _mm512_packus_epi32(_mm512_srli_epi32(a0, 23), _mm512_srli_epi32(a1, 23));    \
    bin_ = _mm512_min_epu16(_mm512_subs_epu16(e, cbias), clast);                              \
  } while (0)
  if (pd->win < 0) { /* pair indices */
    for (size_t v = 0; v < nv / 2; v++) {
      __m512i bv;
      F32_STEP(v, bv);
      _mm512_storeu_si512(idx + 16 * v, _mm512_madd_epi16(bv, pairc));
      PROBE__PENDING_STEP(16);
    }
  } else { /* window: 64 elements, one byte vector of bins, per step */
    WIN_DECL(pd);
    for (size_t v = 0; v < nv / 2; v += 2) {
      __m512i bv0, bv1;
      F32_STEP(v, bv0);
      F32_STEP(v + 1, bv1);
      WIN_STEP(_mm512_packus_epi16(bv0, bv1));
    }
    WIN_FINISH(b, pd);
  }
#undef F32_STEP
  PROBE__PENDING_FINISH(pd);
  b->nonfinite = 0;
  const __m512i m10 = _mm512_set1_epi32(0x3ff);
  b->zero = hsum32(_mm512_and_si512(cnt, m10));
  b->flush = hsum32(_mm512_and_si512(_mm512_srli_epi32(cnt, 10), m10)) - b->zero;
  b->ovf = hsum32(_mm512_srli_epi32(cnt, 20));
  b->sub = 0;
  b->sum = _mm512_reduce_add_pd(_mm512_add_pd(s0, s1));
  b->sumsq = _mm512_reduce_add_pd(_mm512_add_pd(q0, q1));
  b->smax = _mm512_reduce_max_epi32(smax);
  b->smin = _mm512_reduce_min_epi32(smin);
  b->umax = _mm512_reduce_max_epu32(umax);
  b->umin = _mm512_reduce_min_epu32(umin);
  uint32_t am = _mm512_reduce_min_epu32(amin);
  b->amin_m1 = am == UINT32_MAX ? UINT32_MAX : am - 1u;
}

#else /* not compiled for AVX-512: stats.c never selects this path */

void probe__blk_f32_avx512(probe__blk *b, uint32_t *idx, const unsigned char *p, size_t nv,
                           const probe__pending *pd) {
  PROBE__PENDING_LOCALS(pd);
  (void)b, (void)idx, (void)p, (void)nv, (void)pd;
}
void probe__blk_f16_avx512(probe__blk *b, uint32_t *idx, const unsigned char *p, size_t nv,
                           const probe__pending *pd) {
  PROBE__PENDING_LOCALS(pd);
  (void)b, (void)idx, (void)p, (void)nv, (void)pd;
}
void probe__blk_bf16_avx512(probe__blk *b, uint32_t *idx, const unsigned char *p, size_t nv,
                            const probe__pending *pd) {
  PROBE__PENDING_LOCALS(pd);
  (void)b, (void)idx, (void)p, (void)nv, (void)pd;
}

#endif
