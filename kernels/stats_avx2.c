/*
 * stats_avx2.c - the AVX2/F16C/FMA block functions of the statistics kernel
 * (compiled with -mavx2 -mf16c -mfma; stats_dispatch.c selects this path only
 * when the CPU has them; the driver that cuts blocks and owns the histogram
 * is stats_block.c, the AVX-512 block functions are in stats_avx512.c).
 *
 * Two modes, as on AVX-512 (stats_impl.h, probe__pending.win):
 *  - window mode (below), when the data's exponents are concentrated, as
 *    in nearly every tensor: one vector loop per block counts the histogram
 *    of a 16-value exponent window without scalar work, plus a second loop
 *    for the sums while the block sits in L2;
 *  - pair mode, when no window holds half of the data: three loops over an
 *    L1-resident block (counts and bins; extremes; sums), so every
 *    accumulator stays in one of the 16 registers; bins are written two at a
 *    time as one pair index lo + 66*hi (vpmaddwd) that the driver counts
 *    into its pair table.
 * The vector loops assume finite data; the driver checks each block (fp16:
 * nonfinite, from an OR of masks or the maxima; fp32 and bf16: the
 * |x| >= 65520 count, then a scan) and redoes a block holding inf or NaN
 * with the portable routine. Data may be unaligned (unaligned loads).
 */
#include "stats_impl.h"

#include <string.h>

#if defined(__AVX2__) && defined(__F16C__) && defined(__FMA__)
#include <immintrin.h>

enum { NB = PROBE_HIST_BINS };
/* binary32 raw exponent e8: bin e8 - 94, clamped. */
#define F32_BIAS (127 + PROBE_HIST_MIN_EXP - 1)

typedef probe__blk blk;

/* ---- horizontal reductions ------------------------------------------------ */

static inline uint64_t hsum_epi32(__m256i v) {
  int32_t t[8];
  _mm256_storeu_si256((__m256i *)(void *)t, v);
  int64_t s = 0;
  for (int i = 0; i < 8; i++) s += t[i];
  return (uint64_t)s;
}

/* Counts kept as negated masks summed in 16-bit lanes (<= 256 per lane). */
static inline uint64_t hsum_epi16(__m256i v) {
  return hsum_epi32(_mm256_madd_epi16(v, _mm256_set1_epi16(1)));
}

static inline double hsum_pd(__m256d a, __m256d b, __m256d c, __m256d d) {
  __m256d s = _mm256_add_pd(_mm256_add_pd(a, b), _mm256_add_pd(c, d));
  double t[4];
  _mm256_storeu_pd(t, s);
  return (t[0] + t[1]) + (t[2] + t[3]);
}

/* Extremes pass, 16-bit lanes (fp16 and bf16 alike: raw bit patterns). */
static void extremes16(blk *b, const unsigned char *p, size_t nv, __m256i amin,
                       int is_f16) {
  __m256i smax = _mm256_set1_epi16(INT16_MIN), smin = _mm256_set1_epi16(INT16_MAX);
  __m256i umax = _mm256_setzero_si256(), umin = _mm256_set1_epi16(-1);
  for (size_t v = 0; v < nv; v++) {
    __m256i h = _mm256_loadu_si256((const __m256i *)(const void *)(p + 32 * v));
    smax = _mm256_max_epi16(smax, h);
    smin = _mm256_min_epi16(smin, h);
    umax = _mm256_max_epu16(umax, h);
    umin = _mm256_min_epu16(umin, h);
  }
  int16_t t0[16], t1[16];
  uint16_t t2[16], t3[16], t4[16];
  _mm256_storeu_si256((__m256i *)(void *)t0, smax);
  _mm256_storeu_si256((__m256i *)(void *)t1, smin);
  _mm256_storeu_si256((__m256i *)(void *)t2, umax);
  _mm256_storeu_si256((__m256i *)(void *)t3, umin);
  _mm256_storeu_si256((__m256i *)(void *)t4, amin);
  int16_t a = INT16_MIN, c = INT16_MAX;
  uint16_t u = 0, w = UINT16_MAX, m = UINT16_MAX;
  for (int i = 0; i < 16; i++) {
    if (t0[i] > a) a = t0[i];
    if (t1[i] < c) c = t1[i];
    if (t2[i] > u) u = t2[i];
    if (t3[i] < w) w = t3[i];
    if (t4[i] < m) m = t4[i];
  }
  probe__blk_extremes16(b, a, c, u, w, m, is_f16);
}

/* Sums pass on 16 values given as four vectors of binary64 (SUM16_D) or
 * as two of binary32 (SUM16). */
#define SUM16(f0, f1)                                                          \
  SUM16_D(_mm256_cvtps_pd(_mm256_castps256_ps128(f0)), _mm256_cvtps_pd(_mm256_extractf128_ps(f0, 1)), \
          _mm256_cvtps_pd(_mm256_castps256_ps128(f1)), _mm256_cvtps_pd(_mm256_extractf128_ps(f1, 1)))
#define SUM16_D(d0_, d1_, d2_, d3_)                                            \
  do {                                                                         \
    __m256d d0 = (d0_), d1 = (d1_), d2 = (d2_), d3 = (d3_);                    \
    s0 = _mm256_add_pd(s0, d0);                                                \
    s1 = _mm256_add_pd(s1, d1);                                                \
    s2 = _mm256_add_pd(s2, d2);                                                \
    s3 = _mm256_add_pd(s3, d3);                                                \
    q0 = _mm256_fmadd_pd(d0, d0, q0);                                          \
    q1 = _mm256_fmadd_pd(d1, d1, q1);                                          \
    q2 = _mm256_fmadd_pd(d2, d2, q2);                                          \
    q3 = _mm256_fmadd_pd(d3, d3, q3);                                          \
  } while (0)

static void sums(blk *b, probe_dtype dt, const unsigned char *p, size_t nv) {
  __m256d s0 = _mm256_setzero_pd(), s1 = s0, s2 = s0, s3 = s0;
  __m256d q0 = s0, q1 = s0, q2 = s0, q3 = s0;
  const __m256i z = _mm256_setzero_si256();
  if (dt == PROBE_DTYPE_F16) {
    for (size_t v = 0; v < nv; v++) {
      __m128i h0 = _mm_loadu_si128((const __m128i *)(const void *)(p + 32 * v));
      __m128i h1 = _mm_loadu_si128((const __m128i *)(const void *)(p + 32 * v + 16));
      __m256 f0 = _mm256_cvtph_ps(h0), f1 = _mm256_cvtph_ps(h1);
      SUM16(f0, f1);
    }
  } else if (dt == PROBE_DTYPE_BF16) {
    for (size_t v = 0; v < nv; v++) {
      __m256i h = _mm256_loadu_si256((const __m256i *)(const void *)(p + 32 * v));
      /* (0, h) pairs are the binary32 patterns, lane order permuted. */
      __m256 f0 = _mm256_castsi256_ps(_mm256_unpacklo_epi16(z, h));
      __m256 f1 = _mm256_castsi256_ps(_mm256_unpackhi_epi16(z, h));
      SUM16(f0, f1);
    }
  } else { /* fp32: each half converted from memory, no vextractf128 */
    for (size_t v = 0; v < nv; v++) {
      const float *f = (const float *)(const void *)(p + 64 * v);
      SUM16_D(_mm256_cvtps_pd(_mm_loadu_ps(f)), _mm256_cvtps_pd(_mm_loadu_ps(f + 4)),
              _mm256_cvtps_pd(_mm_loadu_ps(f + 8)), _mm256_cvtps_pd(_mm_loadu_ps(f + 12)));
    }
  }
  b->sum = hsum_pd(s0, s1, s2, s3);
  b->sumsq = hsum_pd(q0, q1, q2, q3);
}

/* ---- counts and histogram bins, per dtype ----------------------------------------- */

static void pair_f16(blk *b, uint32_t *idx, const unsigned char *p, size_t nv,
                    const probe__pending *pd) {
  PROBE__PENDING_LOCALS(pd);
  const __m256i m7fff = _mm256_set1_epi16(0x7fff);
  const __m256i c7bff = _mm256_set1_epi16(0x7bff);
  const __m256i cbias = _mm256_set1_epi16(F32_BIAS);
  const __m256i clast = _mm256_set1_epi16(NB - 1);
  const __m256i pairc = _mm256_set1_epi32(0x00010000 * NB + 1); /* lo + 66*hi */
  const __m256i z = _mm256_setzero_si256();
  __m256i czero = z, nonfin = z, amin = _mm256_set1_epi16(-1);
  for (size_t v = 0; v < nv; v++) {
    __m256i h = _mm256_loadu_si256((const __m256i *)(const void *)(p + 32 * v));
    __m256i a = _mm256_and_si256(h, m7fff);
    __m256i isz = _mm256_cmpeq_epi16(a, z);
    czero = _mm256_sub_epi16(czero, isz);
    nonfin = _mm256_or_si256(nonfin, _mm256_cmpgt_epi16(a, c7bff));
    amin = _mm256_min_epu16(amin, _mm256_or_si256(a, isz));
    /* exact bins, subnormals included (pairs may be of any two elements) */
    __m256i bin = _mm256_min_epu16(_mm256_subs_epu16(probe__f16_exp32_avx2(a), cbias), clast);
    _mm256_storeu_si256((__m256i *)(void *)(idx + 8 * v), _mm256_madd_epi16(bin, pairc));
    PROBE__PENDING_STEP(8);
  }
  PROBE__PENDING_FINISH(pd);
  b->nonfinite = !_mm256_testz_si256(nonfin, nonfin);
  b->zero = hsum_epi16(czero);
  b->flush = 0; /* no binary16 value has 0 < |x| <= 2^-25 */
  b->ovf = 0;   /* nor a finite |x| >= 65520 */
  if (b->nonfinite) return;
  extremes16(b, p, nv, amin, 1);
  sums(b, PROBE_DTYPE_F16, p, nv);
}

static void pair_bf16(blk *b, uint32_t *idx, const unsigned char *p, size_t nv,
                     const probe__pending *pd) {
  PROBE__PENDING_LOCALS(pd);
  const __m256i m7fff = _mm256_set1_epi16(0x7fff);
  const __m256i c3301 = _mm256_set1_epi16(0x3301); /* a <= 0x3300: <= 2^-25 */
  const __m256i c477f = _mm256_set1_epi16(0x477f); /* a >= 0x4780: >= 65520 */
  const __m256i cbias = _mm256_set1_epi16(F32_BIAS);
  const __m256i clast = _mm256_set1_epi16(NB - 1);
  const __m256i pairc = _mm256_set1_epi32(0x00010000 * NB + 1);
  const __m256i z = _mm256_setzero_si256();
  __m256i czero = z, cflush = z, covf = z, amin = _mm256_set1_epi16(-1);
  for (size_t v = 0; v < nv; v++) {
    __m256i h = _mm256_loadu_si256((const __m256i *)(const void *)(p + 32 * v));
    __m256i a = _mm256_and_si256(h, m7fff);
    __m256i isz = _mm256_cmpeq_epi16(a, z);
    czero = _mm256_sub_epi16(czero, isz);
    cflush = _mm256_sub_epi16(cflush, _mm256_cmpgt_epi16(c3301, a));
    covf = _mm256_sub_epi16(covf, _mm256_cmpgt_epi16(a, c477f));
    amin = _mm256_min_epu16(amin, _mm256_or_si256(a, isz));
    __m256i e = _mm256_srli_epi16(a, 7); /* binary32 raw exponent */
    __m256i bin = _mm256_min_epu16(_mm256_subs_epu16(e, cbias), clast);
    _mm256_storeu_si256((__m256i *)(void *)(idx + 8 * v), _mm256_madd_epi16(bin, pairc));
    PROBE__PENDING_STEP(8);
  }
  PROBE__PENDING_FINISH(pd);
  b->nonfinite = 0; /* decided by the caller from ovf */
  b->zero = hsum_epi16(czero);
  b->flush = hsum_epi16(cflush) - b->zero;
  b->ovf = hsum_epi16(covf);
  extremes16(b, p, nv, amin, 0);
  sums(b, PROBE_DTYPE_BF16, p, nv);
}

static void pair_f32(blk *b, uint32_t *idx, const unsigned char *p, size_t nv,
                    const probe__pending *pd) {
  PROBE__PENDING_LOCALS(pd);
  const __m256i mabs = _mm256_set1_epi32(0x7fffffff);
  const __m256i cflush = _mm256_set1_epi32(0x33000001);
  const __m256i covf = _mm256_set1_epi32(0x477fefff);
  const __m256i cbias = _mm256_set1_epi16(F32_BIAS);
  const __m256i clast = _mm256_set1_epi16(NB - 1);
  const __m256i pairc = _mm256_set1_epi32(0x00010000 * NB + 1);
  const __m256i z = _mm256_setzero_si256();
  __m256i nzero = z, nflush = z, novf = z, amin = _mm256_set1_epi32(-1);
  for (size_t v = 0; v < nv; v++) {
    __m256i x0 = _mm256_loadu_si256((const __m256i *)(const void *)(p + 64 * v));
    __m256i x1 = _mm256_loadu_si256((const __m256i *)(const void *)(p + 64 * v + 32));
    __m256i a0 = _mm256_and_si256(x0, mabs), a1 = _mm256_and_si256(x1, mabs);
    __m256i z0 = _mm256_cmpeq_epi32(a0, z), z1 = _mm256_cmpeq_epi32(a1, z);
    nzero = _mm256_sub_epi32(nzero, _mm256_add_epi32(z0, z1));
    nflush = _mm256_sub_epi32(nflush, _mm256_add_epi32(_mm256_cmpgt_epi32(cflush, a0),
                                                       _mm256_cmpgt_epi32(cflush, a1)));
    novf = _mm256_sub_epi32(novf, _mm256_add_epi32(_mm256_cmpgt_epi32(a0, covf),
                                                   _mm256_cmpgt_epi32(a1, covf)));
    amin = _mm256_min_epu32(amin, _mm256_min_epu32(_mm256_or_si256(a0, z0),
                                                   _mm256_or_si256(a1, z1)));
    /* Raw exponents (<= 255) packed to 16-bit lanes, order permuted. */
    __m256i e = _mm256_packus_epi32(_mm256_srli_epi32(a0, 23), _mm256_srli_epi32(a1, 23));
    __m256i bin = _mm256_min_epu16(_mm256_subs_epu16(e, cbias), clast);
    _mm256_storeu_si256((__m256i *)(void *)(idx + 8 * v), _mm256_madd_epi16(bin, pairc));
    PROBE__PENDING_STEP(8);
  }
  PROBE__PENDING_FINISH(pd);
  b->nonfinite = 0;
  b->zero = hsum_epi32(nzero);
  b->flush = hsum_epi32(nflush) - b->zero;
  b->ovf = hsum_epi32(novf);
  __m256i smax = _mm256_set1_epi32(INT32_MIN), smin = _mm256_set1_epi32(INT32_MAX);
  __m256i umax = z, umin = _mm256_set1_epi32(-1);
  for (size_t v = 0; v < 2 * nv; v++) {
    __m256i x = _mm256_loadu_si256((const __m256i *)(const void *)(p + 32 * v));
    smax = _mm256_max_epi32(smax, x);
    smin = _mm256_min_epi32(smin, x);
    umax = _mm256_max_epu32(umax, x);
    umin = _mm256_min_epu32(umin, x);
  }
  int32_t t0[8], t1[8];
  uint32_t t2[8], t3[8], t4[8];
  _mm256_storeu_si256((__m256i *)(void *)t0, smax);
  _mm256_storeu_si256((__m256i *)(void *)t1, smin);
  _mm256_storeu_si256((__m256i *)(void *)t2, umax);
  _mm256_storeu_si256((__m256i *)(void *)t3, umin);
  _mm256_storeu_si256((__m256i *)(void *)t4, amin);
  b->smax = INT32_MIN;
  b->smin = INT32_MAX;
  b->umax = 0;
  b->umin = UINT32_MAX;
  uint32_t am = UINT32_MAX;
  for (int i = 0; i < 8; i++) {
    if (t0[i] > b->smax) b->smax = t0[i];
    if (t1[i] < b->smin) b->smin = t1[i];
    if (t2[i] > b->umax) b->umax = t2[i];
    if (t3[i] < b->umin) b->umin = t3[i];
    if (t4[i] < am) am = t4[i];
  }
  b->amin_m1 = am == UINT32_MAX ? UINT32_MAX : am - 1u;
  sums(b, PROBE_DTYPE_F32, p, nv);
}


/* ---- window mode (AVX2) -------------------------------------------------------- */

/* The same window mode as stats_avx512.c (probe__pending.win, stats_impl.h;
 * docs/statistics.md), for a CPU without AVX-512: the driver cannot tell the
 * two apart. A step is 32 elements. Per step, without branches but one rarely
 * taken:
 *  - the window value of each element (fp16: raw exponent a >> 10; bf16 and
 *    fp32: the binary32 one) packed to bytes (vpackuswb), minus the window
 *    start, saturated to an index whose low nibble vpshufb reads (0x80 -
 *    width + r for r < width, >= 0x80 outside, which vpshufb turns into 0
 *    and whose bit 7 is the outside mask, one vpmovmskb); two
 *    lookups give the low and high bytes of the one-hot word 1 << r and
 *    vpunpck{l,h}bw the two words vectors, in the order of the 16-bit lanes
 *    they came from (AVX2 has no vpsllvw and no vpermw);
 *  - the one-hot words go through a Harley-Seal carry-save tree (five
 *    logic operations per adder: no vpternlog) into bit-sliced counters of
 *    weights 1, 2, 4, 8, each one ymm of 16 lanes; each 16 inputs give one
 *    ymm of weight 16, and two of those make one 32-lane probe__hs.s16
 *    vector, so the driver's counters, folds and read-out are the AVX-512
 *    ones in layout (lanes 16..31 of hs->lo are never written here: the
 *    driver zeroes both copies at the start of a call and the one it
 *    flushes);
 *  - non-zero elements outside the window (bit 7 of the index and a
 *    non-zero byte in the saturated pack of |x|; fp32: a non-zero window
 *    value, the subnormals left to a scan after the loop) set a bit in a
 *    movemask; a step with any is written to outb by a scalar loop over its
 *    bits (fp16/bf16: the pattern; fp32: the window value);
 *  - fp16 sum, exact in integers as on AVX-512: the signed significand
 *    (vpsignw) times the one-hot word, vpmaddwd, 32-bit lanes widened every
 *    16 steps;
 *  - extremes: max of the patterns as signed and as unsigned, and the
 *    smallest non-zero |x| as min of (|x| - 1) ^ 0x8000 signed (zero wraps to
 *    the largest); the minima only when a block has one sign (ext_fix);
 *  - f16_flush (0 < |x| <= 2^-25, fp32/bf16) and f16_overflow: by a scan of
 *    the block only when its smallest |x| or its maxima show it has some.
 * A second loop over the block, which the first has just brought into L2,
 * makes the sums: fp16 the squares of binary64 patterns built from the bits
 * (x * 2^16, as F16_SQ in stats_avx512.c: two shifts, an add and four
 * unpacks per 16 elements instead of two conversions), fp32/bf16 the
 * conversions of sums(). Zeros are not counted per element (the driver takes
 * them from the window counts). */

#define CSA(h_, l_, a_, b_, c_)                                                \
  do {                                                                         \
    __m256i ca_ = (a_), cb_ = (b_), cc_ = (c_);                                \
    __m256i u_ = _mm256_xor_si256(ca_, cb_);                                   \
    h_ = _mm256_or_si256(_mm256_and_si256(ca_, cb_), _mm256_and_si256(u_, cc_)); \
    l_ = _mm256_xor_si256(u_, cc_);                                            \
  } while (0)

/* Sixteen one-hot vectors through a Harley-Seal tree into o_, t_, f_, e_
 * (weights 1, 2, 4, 8); the weight-16 result is left in x_. IN(i, d)
 * yields input i in d. */
#define HS16(IN, o_, t_, f_, e_, x_)                                           \
  do {                                                                         \
    __m256i d0_, d1_, tA_, tB_, fA_, fB_, eA_, eB_;                            \
    IN(0, d0_); IN(1, d1_); CSA(tA_, o_, o_, d0_, d1_);                        \
    IN(2, d0_); IN(3, d1_); CSA(tB_, o_, o_, d0_, d1_);                        \
    CSA(fA_, t_, t_, tA_, tB_);                                                \
    IN(4, d0_); IN(5, d1_); CSA(tA_, o_, o_, d0_, d1_);                        \
    IN(6, d0_); IN(7, d1_); CSA(tB_, o_, o_, d0_, d1_);                        \
    CSA(fB_, t_, t_, tA_, tB_);                                                \
    CSA(eA_, f_, f_, fA_, fB_);                                                \
    IN(8, d0_); IN(9, d1_); CSA(tA_, o_, o_, d0_, d1_);                        \
    IN(10, d0_); IN(11, d1_); CSA(tB_, o_, o_, d0_, d1_);                      \
    CSA(fA_, t_, t_, tA_, tB_);                                                \
    IN(12, d0_); IN(13, d1_); CSA(tA_, o_, o_, d0_, d1_);                      \
    IN(14, d0_); IN(15, d1_); CSA(tB_, o_, o_, d0_, d1_);                      \
    CSA(fB_, t_, t_, tA_, tB_);                                                \
    CSA(eB_, f_, f_, fA_, fB_);                                                \
    CSA(x_, e_, e_, eA_, eB_);                                                 \
  } while (0)

/* Adds one one-hot vector c into the counters; its weight-16 carry is left
 * in c. */
#define RIPPLE(c)                                                              \
  do {                                                                         \
    __m256i t_;                                                                \
    t_ = _mm256_and_si256(ones, c), ones = _mm256_xor_si256(ones, c), c = t_;  \
    t_ = _mm256_and_si256(twos, c), twos = _mm256_xor_si256(twos, c), c = t_;  \
    t_ = _mm256_and_si256(fours, c), fours = _mm256_xor_si256(fours, c), c = t_; \
    t_ = _mm256_and_si256(eights, c), eights = _mm256_xor_si256(eights, c), c = t_; \
  } while (0)

/* The window tables: low and high byte of 1 << r at index nibble
 * (r + 16 - width) & 15 for r < width, in both 128-bit lanes (the index is
 * 0x80 - width + r, so that every r >= width has bit 7 set: ONEHOT). */
static inline void win_tables(int width, __m256i *tlo, __m256i *thi) {
  uint8_t lo[32], hi[32];
  for (int j = 0; j < 32; j++) {
    int r = (j - (16 - width)) & 15;
    lo[j] = (uint8_t)(r < 8 ? 1u << r : 0u);
    hi[j] = (uint8_t)(r >= 8 && r < width ? 1u << (r - 8) : 0u);
  }
  *tlo = _mm256_loadu_si256((const __m256i *)(const void *)lo);
  *thi = _mm256_loadu_si256((const __m256i *)(const void *)hi);
}

/* Element of a step (0..31) whose byte is at position k of
 * vpackuswb(lanes 0..15, lanes 16..31). */
static inline unsigned pack_elem(unsigned k) { return (k & 7) | ((k & 16) >> 1) | ((k & 8) << 1); }

/* Window-mode state of a block function: the window's index offset, the
 * tables, the counters (from hs->lo[hs->cur], lanes 0..15), the s16 fill and
 * the out-of-window pointer. */
#define WIN_DECL2(pd, width)                                                   \
  const __m256i hwin = _mm256_set1_epi8((char)(pd)->win);                      \
  const __m256i c70 = _mm256_set1_epi8((char)(0x80 - (width)));               \
  __m256i tlo, thi;                                                            \
  win_tables((width), &tlo, &thi);                                             \
  probe__hs *const hs_ = (pd)->hs;                                             \
  const uint16_t *lo_ = hs_->lo[hs_->cur];                                     \
  __m256i ones = _mm256_loadu_si256((const __m256i *)(const void *)lo_);       \
  __m256i twos = _mm256_loadu_si256((const __m256i *)(const void *)(lo_ + 32)); \
  __m256i fours = _mm256_loadu_si256((const __m256i *)(const void *)(lo_ + 64)); \
  __m256i eights = _mm256_loadu_si256((const __m256i *)(const void *)(lo_ + 96)); \
  size_t n16 = hs_->n16;                                                       \
  uint16_t *outp = (pd)->outb

/* One-hot words of 32 window values e8 (bytes, vpackuswb order) into ohA
 * (lanes 0..15) and ohB (16..31); om: bits of the elements outside, zeros
 * included (ONEHOT_ALL) or not (ONEHOT; nzb: bytes non-zero exactly for
 * the non-zero elements). */
#define ONEHOT_ALL(e8, ohA, ohB, om)                                           \
  do {                                                                         \
    __m256i ix_ = _mm256_adds_epu8(_mm256_sub_epi8((e8), hwin), c70);          \
    __m256i l_ = _mm256_shuffle_epi8(tlo, ix_), h_ = _mm256_shuffle_epi8(thi, ix_); \
    ohA = _mm256_unpacklo_epi8(l_, h_);                                        \
    ohB = _mm256_unpackhi_epi8(l_, h_);                                        \
    om = (uint32_t)_mm256_movemask_epi8(ix_);                                  \
  } while (0)
#define ONEHOT(e8, nzb, ohA, ohB, om)                                          \
  do {                                                                         \
    ONEHOT_ALL(e8, ohA, ohB, om);                                              \
    om &= ~(uint32_t)_mm256_movemask_epi8(_mm256_cmpeq_epi8((nzb), z));        \
  } while (0)

/* Runs STEP(s, ohA, ohB) over steps 0 .. ns-1: groups of 16 steps through
 * two trees (one s16 vector), the rest rippled in; EVERY16 after each group
 * and once at the end. Writes the counters to hs->lo[!hs->cur] and n16 and
 * nout to b. */
#define WIN_RUN2(STEP, b, pd, ns, EVERY16)                                     \
  do {                                                                         \
    size_t s_ = 0;                                                             \
    __m256i pend_;                                                             \
    for (; s_ + 16 <= (ns); s_ += 16) {                                        \
      __m256i x1_, x2_;                                                        \
      size_t s0_ = s_;                                                         \
      HS16(WIN_IN_, ones, twos, fours, eights, x1_);                           \
      s0_ = s_ + 8;                                                            \
      HS16(WIN_IN_, ones, twos, fours, eights, x2_);                           \
      _mm256_storeu_si256((__m256i *)(void *)(hs_->s16 + 32 * n16), x1_);      \
      _mm256_storeu_si256((__m256i *)(void *)(hs_->s16 + 32 * n16 + 16), x2_); \
      n16++;                                                                   \
      EVERY16;                                                                 \
    }                                                                          \
    for (; s_ < (ns); s_++) {                                                  \
      __m256i cA_, cB_;                                                        \
      STEP(s_, cA_, cB_);                                                      \
      RIPPLE(cA_);                                                             \
      RIPPLE(cB_);                                                             \
      if (!_mm256_testz_si256(_mm256_or_si256(cA_, cB_), _mm256_or_si256(cA_, cB_))) { \
        _mm256_storeu_si256((__m256i *)(void *)(hs_->s16 + 32 * n16), cA_);    \
        _mm256_storeu_si256((__m256i *)(void *)(hs_->s16 + 32 * n16 + 16), cB_); \
        n16++;                                                                 \
      }                                                                        \
    }                                                                          \
    EVERY16;                                                                   \
    uint16_t *lw_ = hs_->lo[!hs_->cur];                                        \
    _mm256_storeu_si256((__m256i *)(void *)lw_, ones);                         \
    _mm256_storeu_si256((__m256i *)(void *)(lw_ + 32), twos);                  \
    _mm256_storeu_si256((__m256i *)(void *)(lw_ + 64), fours);                 \
    _mm256_storeu_si256((__m256i *)(void *)(lw_ + 96), eights);                \
    (b)->n16 = n16;                                                            \
    (b)->nout = (size_t)(outp - (pd)->outb);                                   \
  } while (0)
/* Input i of a tree: even i runs step s0_ + i/2 and yields its first half,
 * odd i the second half of the same step. */
#define WIN_IN_(i_, d_)                                                        \
  do {                                                                         \
    if (((i_) & 1) == 0)                                                       \
      WIN_STEP_(s0_ + (i_) / 2, d_, pend_);                                    \
    else                                                                       \
      d_ = pend_;                                                              \
  } while (0)


/* Reductions of 16-bit lanes, once per block (stats_impl.h): each by one
 * phminposuw, the unsigned horizontal minimum, on the lanes mapped so that
 * the wanted extreme is that minimum. */
static inline uint16_t hmin_u16(__m256i v) {
  __m128i x = _mm_min_epu16(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  return (uint16_t)_mm_cvtsi128_si32(_mm_minpos_epu16(x));
}

void probe__red16_avx2(__m256i smax, __m256i umax, __m256i aminb, int16_t *s, uint16_t *u,
                       uint16_t *amin) {
  const __m256i ones = _mm256_set1_epi16(-1), sflip = _mm256_set1_epi16((short)0x8000);
  /* signed max = ~(unsigned min of ~(x ^ 0x8000)) ^ 0x8000 */
  *s = (int16_t)(uint16_t)(~hmin_u16(_mm256_xor_si256(smax, _mm256_xor_si256(sflip, ones))) ^ 0x8000u);
  *u = (uint16_t)~hmin_u16(_mm256_xor_si256(umax, ones));
  /* aminb: signed min = unsigned min of x ^ 0x8000; it holds (|x| - 1) ^
   * 0x8000, so that min is |x| - 1 of the smallest non-zero |x|, 0xffff:
   * none */
  uint16_t m = hmin_u16(_mm256_xor_si256(aminb, sflip));
  *amin = m == UINT16_MAX ? UINT16_MAX : (uint16_t)(m + 1u);
}

/* (stats_impl.h) A compare per element in 32-bit lanes (fp32) or 16-bit
 * lanes (bf16) into lane counters, emptied before a 16-bit one can wrap; the
 * last n mod 8 (16) one at a time. The scalar loop it replaced cost ~1 ns an
 * element, which blocks of tensors with tiny values (gradients) paid. */
void probe__flush_ovf_avx2(probe_dtype dt, const unsigned char *p, size_t n, uint64_t *flush,
                           uint64_t *ovf) {
  const __m256i z = _mm256_setzero_si256();
  size_t i = 0;
  if (dt == PROBE_DTYPE_F32) {
    const __m256i mabs = _mm256_set1_epi32(0x7fffffff);
    const __m256i cfl = _mm256_set1_epi32(0x33000001), cov = _mm256_set1_epi32(0x477fefff);
    __m256i nf = z, no = z;
    for (; i + 8 <= n; i += 8) {
      __m256i a = _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(const void *)(p + 4 * i)), mabs);
      nf = _mm256_sub_epi32(nf, _mm256_andnot_si256(_mm256_cmpeq_epi32(a, z), _mm256_cmpgt_epi32(cfl, a)));
      no = _mm256_sub_epi32(no, _mm256_cmpgt_epi32(a, cov));
    }
    *flush += hsum_epi32(nf);
    *ovf += hsum_epi32(no);
    for (; i < n; i++) {
      uint32_t w;
      memcpy(&w, p + 4 * i, 4);
      w &= 0x7fffffffu;
      *flush += w != 0 && w <= 0x33000000u;
      *ovf += w > 0x477fefffu;
    }
  } else if (dt == PROBE_DTYPE_BF16) {
    const __m256i mabs = _mm256_set1_epi16(0x7fff);
    const __m256i cfl = _mm256_set1_epi16(0x3301), cov = _mm256_set1_epi16(0x477f);
    while (i + 16 <= n) {
      size_t end = n - i > 16 * 32767u ? i + 16 * 32767u : n; /* lanes <= 32767 */
      __m256i nf = z, no = z;
      for (; i + 16 <= end; i += 16) {
        __m256i a = _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(const void *)(p + 2 * i)), mabs);
        nf = _mm256_sub_epi16(nf, _mm256_andnot_si256(_mm256_cmpeq_epi16(a, z), _mm256_cmpgt_epi16(cfl, a)));
        no = _mm256_sub_epi16(no, _mm256_cmpgt_epi16(a, cov));
      }
      *flush += hsum_epi16(nf);
      *ovf += hsum_epi16(no);
    }
    for (; i < n; i++) {
      uint16_t h;
      memcpy(&h, p + 2 * i, 2);
      h &= 0x7fffu;
      *flush += h != 0 && h <= 0x3300u;
      *ovf += h > 0x477fu;
    }
  }
}

/* The extremes of a window block of 16-bit patterns (see stats_avx512.c's
 * ext16_fix): the minima are needed only when the block has one sign. */
static void ext16_win(blk *b, const unsigned char *p, size_t nv, __m256i smax, __m256i umax,
                      __m256i aminb, int is_f16) {
  int16_t s, smin;
  uint16_t u, m, umin;
  probe__red16_avx2(smax, umax, aminb, &s, &u, &m);
  int zero = 0;
  if (!(s >= 0 && u >= 0x8000u)) { /* one sign: is there a zero? */
    const __m256i m7fff = _mm256_set1_epi16(0x7fff), z = _mm256_setzero_si256();
    for (size_t v = 0; v < nv && !zero; v++) {
      __m256i a = _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(const void *)(p + 32 * v)), m7fff);
      zero = _mm256_movemask_epi8(_mm256_cmpeq_epi16(a, z)) != 0;
    }
  }
  probe__minima16(s, u, m, zero, &smin, &umin);
  probe__blk_extremes16(b, s, smin, u, umin, m, is_f16);
}

/* 2^e for a normal binary64 exponent e. */
static inline double pow2(int e) {
  uint64_t u = (uint64_t)(1023 + e) << 52;
  double d;
  memcpy(&d, &u, sizeof d);
  return d;
}

#ifndef PF16
#define PF16 4096
#endif /* prefetch distance of the window loops, bytes */

/* Squares of 16 |x| patterns built from their bits, added into q0..q3: the
 * binary64 with high 16 bits 0x4000 + (a >> HI) and next 16 bits a << LO,
 * squared by FMA. fp16 (HI 6, LO 10): x * 2^16 for a normal x; a zero gives
 * 2, a subnormal 2 + m/512. bf16 (HI 3, LO 13): see win_half_body. The driver
 * corrects zeros and subnormals. Even dwords are moved up and odd ones
 * masked: no more shuffles. */
#define HALF_SQ2(a_, HI, LO)                                                   \
  do {                                                                         \
    __m256i w3_ = _mm256_add_epi16(_mm256_srli_epi16(a_, HI), c4000);          \
    __m256i w2_ = _mm256_slli_epi16(a_, LO);                                   \
    __m256i p0_ = _mm256_unpacklo_epi16(w2_, w3_), p1_ = _mm256_unpackhi_epi16(w2_, w3_); \
    __m256d sq0_ = _mm256_castsi256_pd(_mm256_slli_epi64(p0_, 32));             \
    __m256d sq1_ = _mm256_castsi256_pd(_mm256_and_si256(p0_, mhi32));           \
    __m256d sq2_ = _mm256_castsi256_pd(_mm256_slli_epi64(p1_, 32));             \
    __m256d sq3_ = _mm256_castsi256_pd(_mm256_and_si256(p1_, mhi32));           \
    q0 = _mm256_fmadd_pd(sq0_, sq0_, q0);                                      \
    q1 = _mm256_fmadd_pd(sq1_, sq1_, q1);                                      \
    q2 = _mm256_fmadd_pd(sq2_, sq2_, q2);                                      \
    q3 = _mm256_fmadd_pd(sq3_, sq3_, q3);                                      \
  } while (0)

/* The fp16/bf16 window steps' elements outside the window (bits of om, in
 * vpackuswb order) copied as patterns from the step at q to outp; zeros
 * among them are skipped one by one unless om is known to hold none
 * (zmask, the window bodies' vector mask). */
#define HALF_OUT(om, q, zmask)                                                 \
  do {                                                                         \
    if (__builtin_expect((om) != 0, 0)) {                                      \
      do {                                                                     \
        uint16_t h_;                                                           \
        memcpy(&h_, (q) + 2 * pack_elem((unsigned)__builtin_ctz(om)), 2);      \
        if ((zmask) || (h_ & 0x7fffu)) *outp++ = h_;                           \
        (om) &= (om) - 1;                                                      \
      } while (om);                                                            \
    }                                                                          \
  } while (0)

/* The window loops' int32 sums of 16-bit formats, widened to int64 every
 * 16 steps (before they could overflow). */
#define HALF_EVERY16                                                           \
  do {                                                                         \
    sum64 = _mm256_add_epi64(sum64, _mm256_cvtepi32_epi64(_mm256_castsi256_si128(msum))); \
    sum64 = _mm256_add_epi64(sum64, _mm256_cvtepi32_epi64(_mm256_extracti128_si256(msum, 1))); \
    msum = z;                                                                  \
  } while (0)

/* The one-hot words of a 16-bit window step (e8: window values, aA/aB:
 * |x| of its two vectors at q) and its elements outside written to outb,
 * the zeros left out by a vector mask (zmask) or one by one. */
#define HALF_ONEHOT_OUT(zmask, e8, aA, aB, ohA, ohB, q)                        \
  do {                                                                         \
    uint32_t om_;                                                              \
    if (zmask)                                                                 \
      ONEHOT(e8, _mm256_packus_epi16(aA, aB), ohA, ohB, om_);                  \
    else                                                                       \
      ONEHOT_ALL(e8, ohA, ohB, om_);                                           \
    HALF_OUT(om_, q, zmask);                                                   \
  } while (0)

/* The 16-bit window blocks, fp16 or bf16 (bf16, known at compile time in
 * each copy win_half makes). zmask: om leaves the zeros out by a pack and
 * compare of |x| (3 vector operations per step); without it the zeros are in
 * om and HALF_OUT skips them, which costs a scalar test per zero: win_half
 * picks this one for a block whose first 64 elements hold no zero.
 *
 * fp16: window values are raw exponents a >> 10, the window holds 15 of
 * them (PROBE__WIN16). sum: an element inside is m * 2^(e - 25), m = 1024 +
 * its 10 mantissa bits, so m * (+-oh) * 2^(win - 25), added exactly by
 * vpmaddwd. sumsq: HALF_SQ2 (HI 6, LO 10), x * 2^16 squared (2^-32).
 *
 * bf16 (the driver knows, blk_ops.bf16_patterns): window values are binary32
 * raw exponents a >> 7, 15 of them from 1, so that the one-hot word oh = 2^r
 * (r < 15) is a positive int16 and bf16 subnormals (raw exponent 0) are
 * outside. sum: m * 2^(e8 - 134), m = 128 + its 7 mantissa bits, so m *
 * (+-oh) * 2^(win - 134), added exactly by vpmaddwd (< 2^23 per pair of
 * lanes). sumsq: x * 2^128 (HALF_SQ2 with HI 3, LO 13), squared (2^-256): a
 * zero counts as 2^2 * 2^-256, a subnormal as (2 + a/64)^2 * 2^-256 (the
 * driver takes both out). f16_flush and f16_overflow are counted by a scan
 * of the block only when its smallest non-zero magnitude or its maxima show
 * that it has any.
 *
 * Both: outb receives the patterns of the elements outside. */
static inline __attribute__((always_inline)) void win_half_body(blk *b, const unsigned char *p,
                                                                size_t nv, const probe__pending *pd,
                                                                const int zmask, const int bf16) {
  const int eshift = bf16 ? 7 : 10;             /* |x| >> eshift: window value */
  const int sq_hi = bf16 ? 3 : 6, sq_lo = bf16 ? 13 : 10; /* HALF_SQ2 */
  const int sum_exp = bf16 ? 134 : 25;          /* sum scale 2^(win - sum_exp) */
  const __m256i m7fff = _mm256_set1_epi16(0x7fff), c7fff = m7fff;
  const __m256i mman = _mm256_set1_epi16(bf16 ? 0x007f : 0x03ff); /* mantissa */
  const __m256i cimp = _mm256_set1_epi16(bf16 ? 0x0080 : 0x0400); /* its implicit bit */
  const __m256i z = _mm256_setzero_si256();
  __m256i smax = _mm256_set1_epi16(INT16_MIN), umax = z, aminb = m7fff;
  __m256i msum = z, sum64 = z;
  const size_t ns = nv / 2;
  const __m256i c4000 = _mm256_set1_epi16(0x4000);
  const __m256i mhi32 = _mm256_set1_epi64x((long long)0xffffffff00000000ull);
  __m256d q0 = _mm256_setzero_pd(), q1 = q0, q2 = q0, q3 = q0;
  WIN_DECL2(pd, PROBE__WIN16);
#define HALF_WSTEP2(s_, ohA, ohB)                                              \
  do {                                                                         \
    const unsigned char *q_ = p + 64 * (s_);                                   \
    _mm_prefetch((const char *)q_ + PF16, _MM_HINT_T0);                        \
    __m256i hA = _mm256_loadu_si256((const __m256i *)(const void *)q_);        \
    __m256i hB = _mm256_loadu_si256((const __m256i *)(const void *)(q_ + 32)); \
    __m256i aA = _mm256_and_si256(hA, m7fff), aB = _mm256_and_si256(hB, m7fff); \
    smax = _mm256_max_epi16(smax, _mm256_max_epi16(hA, hB));                   \
    umax = _mm256_max_epu16(umax, _mm256_max_epu16(hA, hB));                   \
    aminb = _mm256_min_epi16(aminb, _mm256_min_epi16(_mm256_add_epi16(aA, c7fff), \
                                                     _mm256_add_epi16(aB, c7fff))); \
    __m256i e8 = _mm256_packus_epi16(_mm256_srli_epi16(aA, eshift),           \
                                     _mm256_srli_epi16(aB, eshift));           \
    HALF_ONEHOT_OUT(zmask, e8, aA, aB, ohA, ohB, q_);                         \
    __m256i mA = _mm256_sign_epi16(_mm256_or_si256(_mm256_and_si256(hA, mman), cimp), hA); \
    __m256i mB = _mm256_sign_epi16(_mm256_or_si256(_mm256_and_si256(hB, mman), cimp), hB); \
    msum = _mm256_add_epi32(msum, _mm256_add_epi32(_mm256_madd_epi16(mA, ohA),  \
                                                   _mm256_madd_epi16(mB, ohB))); \
    HALF_SQ2(aA, sq_hi, sq_lo);                                                \
    HALF_SQ2(aB, sq_hi, sq_lo);                                                \
  } while (0)
#define WIN_STEP_ HALF_WSTEP2
  WIN_RUN2(HALF_WSTEP2, b, pd, ns, HALF_EVERY16);
#undef WIN_STEP_
#undef HALF_WSTEP2
  b->zero = 0; /* the driver counts them from the window counts */
  b->flush = 0;
  b->ovf = 0;
  ext16_win(b, p, nv, smax, umax, aminb, !bf16);
  if (bf16) {
    b->nonfinite = 0; /* decided by the driver from ovf */
    /* 0 < |x| <= 2^-25 and |x| >= 65520 (inf, NaN included): only if present */
    const int any_flush = b->amin_m1 < 0x33000000u;
    const int any_ovf = b->smax > 0x477fffff || b->umax > 0xc77fffffu;
    if (any_flush || any_ovf) probe__flush_ovf_avx2(PROBE_DTYPE_BF16, p, 16 * nv, &b->flush, &b->ovf);
  } else { /* no binary16 value has 0 < |x| <= 2^-25 or is finite >= 65520 */
    /* inf or NaN: a positive pattern > 0x7bff or a negative one > 0xfbff */
    b->nonfinite = b->smax > (int32_t)0x477fe000 || b->umax > 0xc77fe000u;
  }
  int64_t t[4];
  _mm256_storeu_si256((__m256i *)(void *)t, sum64);
  b->sum = (double)(t[0] + t[1] + t[2] + t[3]) * pow2(pd->win - sum_exp);
  b->sumsq = hsum_pd(q0, q1, q2, q3) * (bf16 ? 0x1p-256 : 0x1p-32);
}

/* 1 if one of the first 64 elements of a window block (nv 16-element
 * groups) lies below the window's first field: a +-0 of fp16/bf16, a zero
 * or subnormal of fp32 (field 0). The window loops then leave those out of
 * their elements outside by vector operations (zmask), else by a scalar
 * test per element outside. */
static int head_has_field0(const unsigned char *p, size_t nv, int f32) {
  const __m256i z = _mm256_setzero_si256();
  const __m256i m = f32 ? _mm256_set1_epi32(0x7f800000) : _mm256_set1_epi16(0x7fff);
  const size_t nvec = f32 ? 2 * nv : nv; /* 32-byte vectors in the block */
  int any = 0;
  for (size_t v = 0; v < nvec && v < (f32 ? 8u : 4u); v++) {
    __m256i x = _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(const void *)(p + 32 * v)), m);
    any |= _mm256_movemask_epi8(f32 ? _mm256_cmpeq_epi32(x, z) : _mm256_cmpeq_epi16(x, z));
  }
  return any != 0;
}

/* The 16-bit window blocks: the body with or without its zero mask (the
 * head check above), fp16 or bf16: four copies, each with its constants. */
static void win_half(blk *b, const unsigned char *p, size_t nv, const probe__pending *pd, int bf16) {
  int zmask = head_has_field0(p, nv, 0);
  if (bf16 && zmask)
    win_half_body(b, p, nv, pd, 1, 1);
  else if (bf16)
    win_half_body(b, p, nv, pd, 0, 1);
  else if (zmask)
    win_half_body(b, p, nv, pd, 1, 0);
  else
    win_half_body(b, p, nv, pd, 0, 0);
}

/* fused: the sums in the same loop (probe__pending.stream: a tensor
 * likely read from DRAM, where a second loop over each block leaves the
 * memory idle while it runs: 128 MiB cold, 0.59-0.61 of the read rate
 * with it, 0.66-0.80 without); else in a second loop over the block in L2
 * (11% faster in cache: the fused loop's eight more registers spill). */
static inline __attribute__((always_inline)) void win_f32_body(blk *b, const unsigned char *p,
                                                               size_t nv, const probe__pending *pd,
                                                               const int fused, const int zmask) {
  const __m256i mabs = _mm256_set1_epi32(0x7fffffff), c7f = mabs;
  const __m256i z = _mm256_setzero_si256();
  __m256i smax = _mm256_set1_epi32(INT32_MIN), umax = z, aminb = mabs;
  __m256d fsA = _mm256_setzero_pd(), fsB = fsA, fqA = fsA, fqB = fsA;
  const size_t ns = nv / 2;
  WIN_DECL2(pd, PROBE__WIN);
#define F32_WSTEP2(s_, ohA, ohB)                                               \
  do {                                                                         \
    const unsigned char *q_ = p + 128 * (s_);                                  \
    _mm_prefetch((const char *)q_ + 2 * PF16, _MM_HINT_T0);                    \
    _mm_prefetch((const char *)q_ + 2 * PF16 + 64, _MM_HINT_T0);               \
    __m256i x0 = _mm256_loadu_si256((const __m256i *)(const void *)q_);        \
    __m256i x1 = _mm256_loadu_si256((const __m256i *)(const void *)(q_ + 32)); \
    __m256i x2 = _mm256_loadu_si256((const __m256i *)(const void *)(q_ + 64)); \
    __m256i x3 = _mm256_loadu_si256((const __m256i *)(const void *)(q_ + 96)); \
    __m256i a0 = _mm256_and_si256(x0, mabs), a1 = _mm256_and_si256(x1, mabs);  \
    __m256i a2 = _mm256_and_si256(x2, mabs), a3 = _mm256_and_si256(x3, mabs);  \
    smax = _mm256_max_epi32(smax, _mm256_max_epi32(_mm256_max_epi32(x0, x1), _mm256_max_epi32(x2, x3))); \
    umax = _mm256_max_epu32(umax, _mm256_max_epu32(_mm256_max_epu32(x0, x1), _mm256_max_epu32(x2, x3))); \
    __m256i y0 = _mm256_add_epi32(a0, c7f), y1 = _mm256_add_epi32(a1, c7f);    \
    __m256i y2 = _mm256_add_epi32(a2, c7f), y3 = _mm256_add_epi32(a3, c7f);    \
    aminb = _mm256_min_epi32(aminb, _mm256_min_epi32(_mm256_min_epi32(y0, y1), _mm256_min_epi32(y2, y3))); \
    if (fused) F32_SUMS(q_);                                                   \
    __m256i e8 = _mm256_packus_epi16(                                          \
        _mm256_packus_epi32(_mm256_srli_epi32(a0, 23), _mm256_srli_epi32(a1, 23)), \
        _mm256_packus_epi32(_mm256_srli_epi32(a2, 23), _mm256_srli_epi32(a3, 23))); \
    uint32_t om; /* subnormals (field 0) not here: after the loop */          \
    if (zmask)                                                                 \
      ONEHOT(e8, e8, ohA, ohB, om);                                            \
    else                                                                       \
      ONEHOT_ALL(e8, ohA, ohB, om);                                            \
    if (__builtin_expect(om != 0, 0)) {                                        \
      uint8_t ev_[32];                                                         \
      _mm256_storeu_si256((__m256i *)(void *)ev_, e8);                         \
      do { /* without zmask, field 0 is skipped here */                        \
        uint8_t f_ = ev_[__builtin_ctz(om)];                                   \
        if (zmask || f_) *outp++ = f_;                                         \
        om &= om - 1;                                                          \
      } while (om);                                                            \
    }                                                                          \
  } while (0)
/* elements 4 k_ .. 4 k_ + 3 of the step at q_ as binary64, converted from
 * memory (no vextractf128 for the high halves) */
#define F32_D(q_, k_) _mm256_cvtps_pd(_mm_loadu_ps((const float *)(const void *)((q_) + 16 * (k_))))
#define F32_SUMS(q_)                                                           \
  do {                                                                         \
    __m256d e0_ = F32_D(q_, 0), e1_ = F32_D(q_, 1), e2_ = F32_D(q_, 2), e3_ = F32_D(q_, 3); \
    fsA = _mm256_add_pd(fsA, _mm256_add_pd(_mm256_add_pd(e0_, e1_), _mm256_add_pd(e2_, e3_))); \
    fqA = _mm256_fmadd_pd(e0_, e0_, _mm256_fmadd_pd(e1_, e1_, _mm256_fmadd_pd(e2_, e2_, _mm256_fmadd_pd(e3_, e3_, fqA)))); \
    __m256d e4_ = F32_D(q_, 4), e5_ = F32_D(q_, 5), e6_ = F32_D(q_, 6), e7_ = F32_D(q_, 7); \
    fsB = _mm256_add_pd(fsB, _mm256_add_pd(_mm256_add_pd(e4_, e5_), _mm256_add_pd(e6_, e7_))); \
    fqB = _mm256_fmadd_pd(e4_, e4_, _mm256_fmadd_pd(e5_, e5_, _mm256_fmadd_pd(e6_, e6_, _mm256_fmadd_pd(e7_, e7_, fqB)))); \
  } while (0)
#define WIN_STEP_ F32_WSTEP2
  WIN_RUN2(F32_WSTEP2, b, pd, ns, (void)0);
#undef WIN_STEP_
#undef F32_WSTEP2
#undef F32_SUMS
#undef F32_D
  b->zero = 0;
  b->nonfinite = 0;
  int32_t t0[8], t2[8];
  uint32_t t1[8];
  _mm256_storeu_si256((__m256i *)(void *)t0, smax);
  _mm256_storeu_si256((__m256i *)(void *)t1, umax);
  _mm256_storeu_si256((__m256i *)(void *)t2, aminb);
  int32_t s = INT32_MIN, mb = INT32_MAX;
  uint32_t u = 0;
  for (int i = 0; i < 8; i++) {
    if (t0[i] > s) s = t0[i];
    if (t1[i] > u) u = t1[i];
    if (t2[i] < mb) mb = t2[i];
  }
  uint32_t am1 = (uint32_t)mb ^ 0x80000000u; /* smallest non-zero |x| - 1; UINT32_MAX: none */
  /* The loop leaves field 0 out of om (zeros and subnormals alike, by their
   * window value): subnormals, when the smallest magnitude shows any, go to
   * outb here, as field 0. */
  if (am1 < 0x007fffffu) {
    for (size_t i = 0; i < 16 * nv; i++) {
      uint32_t a;
      memcpy(&a, p + 4 * i, 4); /* p need not be 4-byte aligned */
      a &= 0x7fffffffu;
      if (a != 0 && a < 0x00800000u) *outp++ = 0;
    }
    b->nout = (size_t)(outp - pd->outb);
  }
  b->smax = s;
  b->umax = u;
  b->smin = INT32_MAX;
  b->umin = UINT32_MAX;
  b->amin_m1 = am1;
  int pos = s >= 0, neg = u >= 0x80000000u;
  if (!(pos && neg)) {
    int zero = 0;
    for (size_t v = 0; v < 2 * nv && !zero; v++) {
      __m256i a = _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(const void *)(p + 32 * v)), mabs);
      zero = _mm256_movemask_epi8(_mm256_cmpeq_epi32(a, z)) != 0;
    }
    probe__minima32(s, u, am1 + 1u, zero, &b->smin, &b->umin);
  }
  /* f16_flush (0 < |x| <= 2^-25) and f16_overflow (|x| >= 65520, inf and
   * NaN included): counted by a scan of the block only when its smallest
   * non-zero magnitude or its maxima show it has some (as win_half_body for bf16); a
   * compare per element in the loop cost 8 of its ~90 operations per 32
   * elements */
  b->flush = 0;
  b->ovf = 0;
  if (am1 < 0x33000000u || s > 0x477fefff || u > 0xc77fefffu)
    probe__flush_ovf_avx2(PROBE_DTYPE_F32, p, 16 * nv, &b->flush, &b->ovf);
  if (fused) {
    b->sum = hsum_pd(fsA, fsB, _mm256_setzero_pd(), _mm256_setzero_pd());
    b->sumsq = hsum_pd(fqA, fqB, _mm256_setzero_pd(), _mm256_setzero_pd());
  } else {
    sums(b, PROBE_DTYPE_F32, p, nv);
  }
}

static void win_f32(blk *b, const unsigned char *p, size_t nv, const probe__pending *pd) {
  if (head_has_field0(p, nv, 1))
    win_f32_body(b, p, nv, pd, 0, 1);
  else
    win_f32_body(b, p, nv, pd, 0, 0);
}

/* Streamed blocks keep the mask: with the head read first, cold 64 MiB ran
 * at 0.48-0.57 of read (median 0.52, 8 runs, Zen 4, AVX2 forced) against
 * 0.46-0.65 (median 0.58) without. */
static void win_f32_stream(blk *b, const unsigned char *p, size_t nv, const probe__pending *pd) {
  win_f32_body(b, p, nv, pd, 1, 1);
}

/* ---- the block functions the driver calls (stats_impl.h) ------------------------ */

void probe__blk_f16_avx2(blk *b, uint32_t *idx, const unsigned char *p, size_t nv,
                         const probe__pending *pd) {
  if (pd->win >= 0)
    win_half(b, p, nv, pd, 0);
  else
    pair_f16(b, idx, p, nv, pd);
}

void probe__blk_bf16_avx2(blk *b, uint32_t *idx, const unsigned char *p, size_t nv,
                          const probe__pending *pd) {
  if (pd->win >= 0)
    win_half(b, p, nv, pd, 1);
  else
    pair_bf16(b, idx, p, nv, pd);
}

void probe__blk_f32_avx2(blk *b, uint32_t *idx, const unsigned char *p, size_t nv,
                         const probe__pending *pd) {
  if (pd->win >= 0 && pd->stream)
    win_f32_stream(b, p, nv, pd);
  else if (pd->win >= 0)
    win_f32(b, p, nv, pd);
  else
    pair_f32(b, idx, p, nv, pd);
}

/* ---- the window counters (probe__hs), AVX2 forms of stats_avx512.c's -------- */

/* 64-bit words of carry-save adders over 16 32-lane vectors (8 words each):
 * called once per 16 weight-16 vectors, so plain C is enough. */
#define CSA64(h_, l_, a_, b_, c_)                                              \
  do {                                                                         \
    uint64_t ca_ = (a_), cb_ = (b_), cc_ = (c_), u_ = ca_ ^ cb_;               \
    h_ = (ca_ & cb_) | (u_ & cc_);                                             \
    l_ = u_ ^ cc_;                                                             \
  } while (0)

void probe__hs_fold16_avx2(probe__hs *h) {
  size_t j = 0;
  for (; j + 16 <= h->n16; j += 16) {
    uint64_t big[8], nonzero = 0;
    for (int w = 0; w < 8; w++) {
      uint64_t o, t, f, e, x, d0, d1, tA, tB, fA, fB, eA, eB;
      memcpy(&o, h->hi + 4 * w, 8);
      memcpy(&t, h->hi + 32 + 4 * w, 8);
      memcpy(&f, h->hi + 64 + 4 * w, 8);
      memcpy(&e, h->hi + 96 + 4 * w, 8);
#define IN64(i_, d_) memcpy(&d_, h->s16 + 32 * (j + (i_)) + 4 * w, 8)
#define W64(i_, k_) IN64(i_, d0); IN64(k_, d1)
      W64(0, 1); CSA64(tA, o, o, d0, d1);
      W64(2, 3); CSA64(tB, o, o, d0, d1);
      CSA64(fA, t, t, tA, tB);
      W64(4, 5); CSA64(tA, o, o, d0, d1);
      W64(6, 7); CSA64(tB, o, o, d0, d1);
      CSA64(fB, t, t, tA, tB);
      CSA64(eA, f, f, fA, fB);
      W64(8, 9); CSA64(tA, o, o, d0, d1);
      W64(10, 11); CSA64(tB, o, o, d0, d1);
      CSA64(fA, t, t, tA, tB);
      W64(12, 13); CSA64(tA, o, o, d0, d1);
      W64(14, 15); CSA64(tB, o, o, d0, d1);
      CSA64(fB, t, t, tA, tB);
      CSA64(eB, f, f, fA, fB);
      CSA64(x, e, e, eA, eB);
#undef W64
#undef IN64
      memcpy(h->hi + 4 * w, &o, 8);
      memcpy(h->hi + 32 + 4 * w, &t, 8);
      memcpy(h->hi + 64 + 4 * w, &f, 8);
      memcpy(h->hi + 96 + 4 * w, &e, 8);
      for (int k = 4; k < 12; k++) { /* weights 256 .. 32768 */
        uint64_t hk;
        memcpy(&hk, h->hi + 32 * k + 4 * w, 8);
        uint64_t nk = hk ^ x;
        memcpy(h->hi + 32 * k + 4 * w, &nk, 8);
        x &= hk;
      }
      big[w] = x;
      nonzero |= x;
    }
    if (nonzero) memcpy(h->big + 32 * h->nbig++, big, 64);
  }
  memmove(h->s16, h->s16 + 32 * j, (h->n16 - j) * 64);
  h->n16 -= j;
}

/* wc[i] += weight * (lanes of the 32-lane vector v with bit i set): one
 * shift and one vpmovmskb give bits i and i + 8 of 16 lanes. */
static inline void hs_count2(uint64_t wc[PROBE__WIN], const uint16_t *v, uint64_t weight) {
  __m256i a = _mm256_loadu_si256((const __m256i *)(const void *)v);
  __m256i b = _mm256_loadu_si256((const __m256i *)(const void *)(v + 16));
  __m256i o = _mm256_or_si256(a, b);
  if (_mm256_testz_si256(o, o)) return;
  for (int i = 0; i < 8; i++) {
    uint32_t ma = (uint32_t)_mm256_movemask_epi8(_mm256_slli_epi16(a, 7 - i));
    uint32_t mb = (uint32_t)_mm256_movemask_epi8(_mm256_slli_epi16(b, 7 - i));
    wc[i] += weight * (uint64_t)(__builtin_popcount(ma & 0x55555555u) +
                                 __builtin_popcount(mb & 0x55555555u));
    wc[i + 8] += weight * (uint64_t)(__builtin_popcount(ma & 0xaaaaaaaau) +
                                     __builtin_popcount(mb & 0xaaaaaaaau));
  }
}

void probe__hs_count_avx2(const probe__hs *h, uint64_t wc[PROBE__WIN]) {
  for (int i = 0; i < PROBE__WIN; i++) wc[i] = 0;
  for (int k = 0; k < 4; k++) hs_count2(wc, h->lo[h->cur] + 32 * k, 1u << k);
  for (size_t j = 0; j < h->n16; j++) hs_count2(wc, h->s16 + 32 * j, 16);
  for (int k = 0; k < 12; k++) hs_count2(wc, h->hi + 32 * k, 16u << k);
  for (size_t j = 0; j < h->nbig; j++) hs_count2(wc, h->big + 32 * j, 65536);
}

#else /* no AVX2 at compile time: stats_dispatch.c never selects this path */

void probe__blk_f32_avx2(probe__blk *b, uint32_t *idx, const unsigned char *p, size_t nv,
                         const probe__pending *pd) {
  (void)b, (void)idx, (void)p, (void)nv, (void)pd;
}
void probe__blk_f16_avx2(probe__blk *b, uint32_t *idx, const unsigned char *p, size_t nv,
                         const probe__pending *pd) {
  (void)b, (void)idx, (void)p, (void)nv, (void)pd;
}
void probe__blk_bf16_avx2(probe__blk *b, uint32_t *idx, const unsigned char *p, size_t nv,
                          const probe__pending *pd) {
  (void)b, (void)idx, (void)p, (void)nv, (void)pd;
}
void probe__hs_fold16_avx2(probe__hs *h) { (void)h; }
void probe__hs_count_avx2(const probe__hs *h, uint64_t wc[PROBE__WIN]) {
  (void)h;
  for (int i = 0; i < PROBE__WIN; i++) wc[i] = 0;
}

#endif
