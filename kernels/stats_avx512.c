/*
 * stats_avx512.c - the AVX-512 (F, BW, VL, DQ, VBMI2, VNNI) block functions
 * of the statistics kernel, compiled with -mavx512f -mavx512bw -mavx512vl
 * -mavx512dq -mavx512vbmi2 -mavx512vnni -mavx2 -mf16c -mfma. stats_avx2.c's
 * driver calls them (cutting blocks, checking for inf/NaN, counting the pair
 * indices into the histogram, the portable tail); stats_dispatch.c selects this path
 * when the CPU has those extensions.
 *
 * Pair mode (pd->win < 0): the same work as the AVX2 block functions, in
 * one pass per block, 32 fp16 or bf16 elements, or 2 x 16 fp32 elements,
 * per step; the pair indices (lo + 66*hi, vpmaddwd) and the meaning of every
 * output are exactly those of stats_avx2.c.
 *
 * Window mode (pd->win >= 0, chosen by the driver when the exponents are
 * concentrated, as they are in almost every tensor; docs/statistics.md):
 * per step of 32 elements, without branches except one rarely taken:
 *  - extremes: smax and umax of the raw patterns, the smallest non-zero |x|
 *    (smin and umin only when a block has one sign: ext16_fix);
 *  - sums: fp32 and bf16 by binary32 -> double conversions, two sum and
 *    four sum-of-squares accumulators; fp16 without conversions (the sum
 *    exactly, in integers, for the elements inside the window; squares of
 *    binary64 values built from the bits: see F16_SQ);
 *  - histogram: the 16-bit one-hot word 1 << (exponent field - win) of each
 *    non-zero element (fp16: vpermw from a 32-entry table; fp32/bf16:
 *    vpsllvw, which gives 0 past 15), summed by positional popcount: a
 *    Harley-Seal carry-save tree of 16 steps into bit-sliced counters of
 *    weights 1..8 whose weight-16 outputs go to hs->s16 (probe__hs, which
 *    persists across blocks; the driver folds them further with
 *    probe__hs_fold16 and reads them with probe__hs_count only when the
 *    window moves or the call ends). Non-zero elements outside the window
 *    (fp16: their pattern, so subnormals get exact bins and the driver
 *    their exact sums; fp32/bf16: their exponent field) are compressed
 *    (vpcompressw) to pd->outb;
 *  - counts: zeros are not counted per element (the driver takes them as
 *    the elements neither inside nor outside the window); fp32/bf16
 *    f16_flush by a masked compare; f16_overflow and fp16 inf/NaN detected
 *    from smax/umax at the end of the block and only then counted.
 * Nothing per element goes through scalar code; what is left per block is
 * a few horizontal reductions.
 */
#include "stats_impl.h"

#include <string.h>

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512DQ__) && defined(__AVX512VBMI2__) && \
    defined(__AVX512VNNI__) && defined(__F16C__) && defined(__FMA__)
#include <immintrin.h>

enum { NB = PROBE_HIST_BINS };
/* Window mode runs fast enough that the hardware prefetcher alone leaves it
 * waiting on memory; it also prefetches this far ahead (bytes; measured best
 * of 1-8 KiB on Zen 5: fp32 +15-25%; fp16, since its sums stopped
 * converting, 16 KiB: 30.5 GB/s against 28.7 with 4 KiB at 64 MiB). */
enum { PREFETCH = 6144, PREFETCH16 = 16384 };
#define F32_BIAS (127 + PROBE_HIST_MIN_EXP - 1)

static inline uint64_t hsum16(__m512i v) { /* 16-bit lane counts */
  return (uint64_t)(int64_t)_mm512_reduce_add_epi32(_mm512_madd_epi16(v, _mm512_set1_epi16(1)));
}

static inline uint64_t hsum32(__m512i v) {
  return (uint64_t)(int64_t)_mm512_reduce_add_epi32(v);
}

/* The elements of a window block with |x| >= 65520, inf and NaN included
 * (fp32: n a multiple of 16; bf16: of 32): a compare and a mask popcount per
 * vector, run only when the block's maxima show some. A scalar loop here
 * cost ~0.3 ns an element, which every block of a tensor with an inf or NaN
 * here and there, or with large finite values, paid. */
static uint64_t count_big32(const unsigned char *p, size_t n) {
  const __m512i mabs = _mm512_set1_epi32(0x7fffffff), covf = _mm512_set1_epi32(0x477fefff);
  uint64_t c = 0;
  for (size_t i = 0; i < n; i += 16)
    c += (uint64_t)__builtin_popcount(_mm512_cmpgt_epu32_mask(
        _mm512_and_si512(_mm512_loadu_si512(p + 4 * i), mabs), covf));
  return c;
}

static uint64_t count_big16(const unsigned char *p, size_t n) {
  const __m512i mabs = _mm512_set1_epi16(0x7fff), covf = _mm512_set1_epi16(0x477f);
  uint64_t c = 0;
  for (size_t i = 0; i < n; i += 32)
    c += (uint64_t)__builtin_popcount(_mm512_cmpgt_epu16_mask(
        _mm512_and_si512(_mm512_loadu_si512(p + 2 * i), mabs), covf));
  return c;
}

/* 32 binary32 values (two vectors) into the double sums: two sum and four
 * sum-of-squares accumulators, one addition or FMA each per step, so that no
 * chain of dependent FMAs (4 cycles each) bounds a step (with two
 * sum-of-squares accumulators, two FMAs each, that was 8 cycles). */
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
    q2 = _mm512_fmadd_pd(d2, d2, q2);                                          \
    q3 = _mm512_fmadd_pd(d3, d3, q3);                                          \
  } while (0)

/* Smallest unsigned 16-bit lane of v (phminposuw on the folded halves). */
static inline uint16_t hmin_epu16(__m512i v) {
  __m256i y = _mm256_min_epu16(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1));
  __m128i x = _mm_min_epu16(_mm256_castsi256_si128(y), _mm256_extracti128_si256(y, 1));
  return (uint16_t)_mm_cvtsi128_si32(_mm_minpos_epu16(x));
}

/* Reduces 16-bit extreme vectors (raw patterns) into b. Signed lanes are
 * mapped to unsigned by flipping the sign bit; maxima are minima of the
 * complement. */
static void finish16(probe__blk *b, __m512i smax, __m512i smin, __m512i umax, __m512i umin,
                     __m512i amin, int is_f16) {
  const __m512i ones = _mm512_set1_epi16(-1), sign = _mm512_set1_epi16(INT16_MIN);
  int16_t a = (int16_t)(hmin_epu16(_mm512_xor_si512(smax, _mm512_set1_epi16(INT16_MAX))) ^ 0x7fff);
  int16_t c = (int16_t)(hmin_epu16(_mm512_xor_si512(smin, sign)) ^ 0x8000);
  uint16_t u = (uint16_t)~hmin_epu16(_mm512_xor_si512(umax, ones));
  uint16_t w = hmin_epu16(umin), m = hmin_epu16(amin);
  probe__blk_extremes16(b, a, c, u, w, m, is_f16);
}

/* The window loops keep only smax and umax of the extremes (and amin, the
 * smallest non-zero |x| pattern): smin is needed (stats_impl.h) only when
 * no value has sign 0 (every lane of smax < 0), umin only when no value has
 * sign 1 (every lane of umax < 0x8000); otherwise they stay at their
 * identities, which is exact, as the record never reads them. Without sign 1
 * the smallest pattern is +0 if the block has a zero, else amin; without
 * sign 0 the smallest signed pattern is -0 if it has a zero, else
 * 0x8000 | amin. Whether it has a zero takes a scan of the L1-resident
 * block that stops at the first. */
static int has_zero16(const unsigned char *p, size_t nv) {
  const __m512i m = _mm512_set1_epi16(0x7fff);
  for (size_t v = 0; v < nv / 2; v++)
    if (_mm512_testn_epi16_mask(_mm512_loadu_si512(p + 64 * v), m)) return 1;
  return 0;
}

static void ext16_fix(const unsigned char *p, size_t nv, __m512i smax, __m512i umax,
                      __m512i amin, __m512i *smin, __m512i *umin) {
  int pos = _mm512_cmpge_epi16_mask(smax, _mm512_setzero_si512()) != 0;
  int neg = _mm512_movepi16_mask(umax) != 0;
  if (pos && neg) return;
  int zero = has_zero16(p, nv);
  uint16_t m = hmin_epu16(amin);
  if (!pos) *smin = _mm512_set1_epi16((short)(zero ? 0x8000 : (m | 0x8000)));
  if (!neg) *umin = _mm512_set1_epi16((short)(zero ? 0 : m));
}

static void ext32_fix(const unsigned char *p, size_t nv, __m512i smax, __m512i umax,
                      __m512i amin, __m512i *smin, __m512i *umin) {
  int pos = _mm512_cmpge_epi32_mask(smax, _mm512_setzero_si512()) != 0;
  int neg = _mm512_movepi32_mask(umax) != 0;
  if (pos && neg) return;
  const __m512i m7 = _mm512_set1_epi32(0x7fffffff);
  int zero = 0;
  for (size_t v = 0; v < nv && !zero; v++)
    zero = _mm512_testn_epi32_mask(_mm512_loadu_si512(p + 64 * v), m7) != 0;
  uint32_t m = _mm512_reduce_min_epu32(amin);
  if (!pos) *smin = _mm512_set1_epi32((int)(zero ? 0x80000000u : (m | 0x80000000u)));
  if (!neg) *umin = _mm512_set1_epi32((int)(zero ? 0u : m));
}

/* ---- window mode: a 16-bin window counted by positional popcount -------- */

/* Window values: fp16 raw exponent (a >> 10, 0..31); fp32 and bf16 raw
 * binary32 exponent (0..255). For each non-zero element (mask nz_; zeros are
 * counted apart and never enter the histogram here) with r = value - win,
 * the one-hot word 1 << r (vpsllvw gives 0 for r >= 16, which with the
 * unsigned wrap covers every value outside the window); the elements outside
 * write ov_ (the value), compressed, to outb. fp32 and bf16 only: the fp16
 * step has its own (a table lookup, and a window of 15). */
#define HOT(e_, nz_, ov_, oh_)                                                 \
  do {                                                                         \
    __m512i r_ = _mm512_sub_epi16((e_), hwin);                                 \
    oh_ = _mm512_maskz_sllv_epi16((nz_), hone, r_);                            \
    __mmask32 o_ = _mm512_mask_cmpge_epu16_mask((nz_), r_, h16);               \
    if (__builtin_expect(o_ != 0, 0)) {                                        \
      _mm512_storeu_si512(outp, _mm512_maskz_compress_epi16(o_, (ov_)));       \
      outp += __builtin_popcount(o_);                                          \
    }                                                                          \
  } while (0)

/* Carry-save adder over 16-bit one-hot words (Harley-Seal): h, l = the carry
 * and sum bits of a + b + c, bitwise. */
#define CSA(h_, l_, a_, b_, c_)                                                \
  do {                                                                         \
    __m512i ca_ = (a_), cb_ = (b_), cc_ = (c_);                                   \
    h_ = _mm512_ternarylogic_epi32(ca_, cb_, cc_, 0xe8);                          \
    l_ = _mm512_ternarylogic_epi32(ca_, cb_, cc_, 0x96);                          \
  } while (0)

/* Sixteen one-hot (or weight-w) vectors through a Harley-Seal tree into the
 * counters o_, t_, f_, e_ (weights w, 2w, 4w, 8w); the result, of weight
 * 16w, is left in x_. IN(i, d) yields input i (0..15) in d. */
#define HS16(IN, o_, t_, f_, e_, x_)                                           \
  do {                                                                         \
    __m512i d0_, d1_, tA_, tB_, fA_, fB_, eA_, eB_;                            \
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

/* wc[i] += weight * (number of 16-bit lanes of v with bit i set). */
static inline void hs_count(uint64_t wc[PROBE__WIN], __m512i v, uint64_t weight) {
  for (int i = 0; i < PROBE__WIN; i++)
    wc[i] += weight * (uint64_t)__builtin_popcount(
                          _mm512_test_epi16_mask(v, _mm512_set1_epi16((short)(1 << i))));
}

void probe__hs_fold16_avx512(probe__hs *h) {
  __m512i o = _mm512_loadu_si512(h->hi), t = _mm512_loadu_si512(h->hi + 32);
  __m512i f = _mm512_loadu_si512(h->hi + 64), e = _mm512_loadu_si512(h->hi + 96);
  size_t j = 0;
  for (; j + 16 <= h->n16; j += 16) {
    __m512i x;
#define IN16(i_, d_) d_ = _mm512_loadu_si512(h->s16 + 32 * (j + (i_)))
    HS16(IN16, o, t, f, e, x);
#undef IN16
    for (int k = 4; k < 12; k++) { /* weights 256 .. 32768 */
      __m512i hk = _mm512_loadu_si512(h->hi + 32 * k);
      _mm512_storeu_si512(h->hi + 32 * k, _mm512_xor_si512(hk, x));
      x = _mm512_and_si512(hk, x);
    }
    if (_mm512_test_epi16_mask(x, x)) _mm512_storeu_si512(h->big + 32 * h->nbig++, x);
  }
  _mm512_storeu_si512(h->hi, o);
  _mm512_storeu_si512(h->hi + 32, t);
  _mm512_storeu_si512(h->hi + 64, f);
  _mm512_storeu_si512(h->hi + 96, e);
  memmove(h->s16, h->s16 + 32 * j, (h->n16 - j) * 64);
  h->n16 -= j;
}

void probe__hs_count_avx512(const probe__hs *h, uint64_t wc[PROBE__WIN]) {
  for (int i = 0; i < PROBE__WIN; i++) wc[i] = 0;
  for (int k = 0; k < 4; k++) hs_count(wc, _mm512_loadu_si512(h->lo[h->cur] + 32 * k), 1u << k);
  for (size_t j = 0; j < h->n16; j++) hs_count(wc, _mm512_loadu_si512(h->s16 + 32 * j), 16);
  for (int k = 0; k < 12; k++) hs_count(wc, _mm512_loadu_si512(h->hi + 32 * k), 16u << k);
  for (size_t j = 0; j < h->nbig; j++) hs_count(wc, _mm512_loadu_si512(h->big + 32 * j), 65536);
}

/* Window-mode locals of a block function: the window, the counters of
 * weights 1, 2, 4, 8 (from hs->lo[hs->cur]), the number of weight-16
 * vectors in hs->s16 and the out-of-window pointer. */
#define WIN_DECL(pd)                                                           \
  const __m512i hwin = _mm512_set1_epi16((short)(pd)->win);                    \
  const __m512i hone = _mm512_set1_epi16(1), h16 = _mm512_set1_epi16(16);      \
  probe__hs *const hs_ = (pd)->hs;                                             \
  const uint16_t *lo_ = hs_->lo[hs_->cur];                                     \
  __m512i ones = _mm512_loadu_si512(lo_), twos = _mm512_loadu_si512(lo_ + 32); \
  __m512i fours = _mm512_loadu_si512(lo_ + 64), eights = _mm512_loadu_si512(lo_ + 96); \
  size_t n16 = hs_->n16;                                                       \
  uint16_t *outp = (pd)->outb

/* Runs STEP over bin vectors 0 .. nbv-1 (groups of 16 through the tree,
 * the rest added one by one), writes the counters to hs->lo[!hs->cur] and
 * leaves n16 and nout in b. */
#define WIN_RUN(STEP, IN, b, pd, nbv) WIN_RUN_EVERY16(STEP, IN, b, pd, nbv, (void)0)
/* The same, running EVERY16 after each group of 16 steps and once after the
 * rest (the fp16 step's 32-bit sum counters hold 16 steps). */
#define WIN_RUN_EVERY16(STEP, IN, b, pd, nbv, EVERY16)                         \
  do {                                                                         \
    size_t v_ = 0;                                                             \
    for (; v_ + 16 <= (nbv); v_ += 16) {                                       \
      __m512i x_;                                                              \
      HS16(IN, ones, twos, fours, eights, x_);                                 \
      _mm512_storeu_si512(hs_->s16 + 32 * n16++, x_);                          \
      EVERY16;                                                                 \
    }                                                                          \
    for (; v_ < (nbv); v_++) {                                                 \
      __m512i c_, t_;                                                          \
      STEP(v_, c_);                                                            \
      t_ = _mm512_and_si512(ones, c_), ones = _mm512_xor_si512(ones, c_), c_ = t_;   \
      t_ = _mm512_and_si512(twos, c_), twos = _mm512_xor_si512(twos, c_), c_ = t_;   \
      t_ = _mm512_and_si512(fours, c_), fours = _mm512_xor_si512(fours, c_), c_ = t_; \
      t_ = _mm512_and_si512(eights, c_), eights = _mm512_xor_si512(eights, c_), c_ = t_; \
      if (_mm512_test_epi16_mask(c_, c_)) _mm512_storeu_si512(hs_->s16 + 32 * n16++, c_); \
    }                                                                          \
    EVERY16;                                                                   \
    uint16_t *lw_ = hs_->lo[!hs_->cur];                                        \
    _mm512_storeu_si512(lw_, ones);                                            \
    _mm512_storeu_si512(lw_ + 32, twos);                                       \
    _mm512_storeu_si512(lw_ + 64, fours);                                      \
    _mm512_storeu_si512(lw_ + 96, eights);                                     \
    (b)->n16 = n16;                                                            \
    (b)->nout = (size_t)(outp - (pd)->outb);                                   \
  } while (0)

/* 32 binary32 values at q (128 bytes) into the double sums. */
#define SUM32M(q_)                                                             \
  do {                                                                         \
    __m512d d0 = _mm512_cvtps_pd(_mm256_loadu_ps((const float *)(const void *)(q_))); \
    __m512d d1 = _mm512_cvtps_pd(_mm256_loadu_ps((const float *)(const void *)((q_) + 32))); \
    __m512d d2 = _mm512_cvtps_pd(_mm256_loadu_ps((const float *)(const void *)((q_) + 64))); \
    __m512d d3 = _mm512_cvtps_pd(_mm256_loadu_ps((const float *)(const void *)((q_) + 96))); \
    s0 = _mm512_add_pd(s0, _mm512_add_pd(d0, d2));                             \
    s1 = _mm512_add_pd(s1, _mm512_add_pd(d1, d3));                             \
    q0 = _mm512_fmadd_pd(d0, d0, q0);                                          \
    q1 = _mm512_fmadd_pd(d1, d1, q1);                                          \
    q2 = _mm512_fmadd_pd(d2, d2, q2);                                          \
    q3 = _mm512_fmadd_pd(d3, d3, q3);                                          \
  } while (0)

/* 2^e for a normal binary64 exponent e (ldexp is a library call). */
static inline double pow2(int e) {
  uint64_t u = (uint64_t)(1023 + e) << 52;
  double d;
  memcpy(&d, &u, sizeof d);
  return d;
}

/* fp16 window mode computes its sums without converting (the conversions,
 * vcvtph2ps and vcvtps2pd, share two of Zen 5's four vector pipes with the
 * double additions and took most of a step):
 *  - sum: an element of raw exponent e >= 1 in the window is
 *    +-m * 2^(e - 25) with m = 1024 + mantissa, and its one-hot word is
 *    oh = 2^(e - win), so it is m * (+-oh) * 2^(win - 25). A second table
 *    lookup (vpermt2w on sign and exponent, 64 entries) gives +-oh, and
 *    vpdpwssd adds m * (+-oh) exactly in 32-bit lanes. Each product is
 *    below 2^25 (oh <= 2^14: fp16 windows hold 15 values), two per lane per
 *    step, so the counters are widened to 64 bits every 16 steps. Elements
 *    outside the window (+-oh = 0) are added by the driver from outb, which
 *    holds their patterns, sign included.
 *  - sum of squares: each lane becomes the binary64 pattern
 *    (|x| bits << 42) | (1024 << 52), which is x * 2^16 for a normal x
 *    (the raw exponent e lands in the low five bits of the binary64 exponent
 *    e + 1024), by a 64-bit shift and a ternary-logic merge per quarter of
 *    the lanes; squared by FMA, all of it exact but the accumulation. A zero
 *    becomes 2.0 and a subnormal with mantissa m becomes 2 + m/512 (raw
 *    exponent 0 reads as 1024): the driver takes (2^-15)^2 = 2^-30 per zero
 *    back out at the flush and replaces each subnormal's term from outb;
 *    those terms are exact, and below 2^-27, so the accumulation error
 *    stays within the bound the tests hold every path to. */
#define F16_SQ(h_)                                                             \
  do {                                                                         \
    __m512d e0_ = _mm512_castsi512_pd(_mm512_ternarylogic_epi64(_mm512_srli_epi64(h_, 6), mexp, cexp, 0xea)); \
    __m512d e1_ = _mm512_castsi512_pd(_mm512_ternarylogic_epi64(_mm512_slli_epi64(h_, 10), mexp, cexp, 0xea)); \
    __m512d e2_ = _mm512_castsi512_pd(_mm512_ternarylogic_epi64(_mm512_slli_epi64(h_, 26), mexp, cexp, 0xea)); \
    __m512d e3_ = _mm512_castsi512_pd(_mm512_ternarylogic_epi64(_mm512_slli_epi64(h_, 42), mexp, cexp, 0xea)); \
    q0 = _mm512_fmadd_pd(e0_, e0_, q0);                                        \
    q1 = _mm512_fmadd_pd(e1_, e1_, q1);                                        \
    q2 = _mm512_fmadd_pd(e2_, e2_, q2);                                        \
    q3 = _mm512_fmadd_pd(e3_, e3_, q3);                                        \
  } while (0)

void probe__blk_f16_avx512(probe__blk *b, uint32_t *idx, const unsigned char *p, size_t nv,
                           const probe__pending *pd) {
  PROBE__PENDING_LOCALS(pd);
  const __m512i m7fff = _mm512_set1_epi16(0x7fff);
  const __m512i c7bff = _mm512_set1_epi16(0x7bff);
  const __m512i one = _mm512_set1_epi16(1);
  const __m512i cbias = _mm512_set1_epi16(F32_BIAS), clast = _mm512_set1_epi16(NB - 1);
  const __m512i pairc = _mm512_set1_epi32(0x00010000 * NB + 1);
  const __m512i z = _mm512_setzero_si512();
  __m512i cnt = z; /* zeros, <= 128 per lane per block */
  __m512i amin = _mm512_set1_epi16(-1);
  __m512i smax = _mm512_set1_epi16(INT16_MIN), smin = _mm512_set1_epi16(INT16_MAX);
  __m512i umax = z, umin = _mm512_set1_epi16(-1);
  __m512d s0 = _mm512_setzero_pd(), s1 = s0, q0 = s0, q1 = s0, q2 = s0, q3 = s0;
  __mmask32 nonfin = 0;
#define F16_STEP(v_, bin_)                                                            \
  do {                                                                                \
    __m512i h = _mm512_loadu_si512(p + 64 * (v_));                                    \
    __m512i a = _mm512_and_si512(h, m7fff);                                           \
    __mmask32 nz = _mm512_test_epi16_mask(a, a); /* non-zero lanes */                 \
    cnt = _mm512_mask_add_epi16(cnt, ~nz, cnt, one);                                  \
    nonfin |= _mm512_cmpgt_epu16_mask(a, c7bff);                                      \
    amin = _mm512_mask_min_epu16(amin, nz, amin, a);                                  \
    smax = _mm512_max_epi16(smax, h);                                                 \
    smin = _mm512_min_epi16(smin, h);                                                 \
    umax = _mm512_max_epu16(umax, h);                                                 \
    umin = _mm512_min_epu16(umin, h);                                                 \
    __m512 f0 = _mm512_cvtph_ps(_mm512_castsi512_si256(h));                           \
    __m512 f1 = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(h, 1));                     \
    SUM32(f0, f1);                                                                    \
    /* exact bins, subnormals included: the binary32 exponent fields (order     \
     * permuted by the pack: pairs may be of any two elements) */                    \
    __m512i e_ = _mm512_packus_epi32(                                                 \
        _mm512_srli_epi32(_mm512_slli_epi32(_mm512_castps_si512(f0), 1), 24),         \
        _mm512_srli_epi32(_mm512_slli_epi32(_mm512_castps_si512(f1), 1), 24));        \
    bin_ = _mm512_min_epu16(_mm512_subs_epu16(e_, cbias), clast);                     \
  } while (0)
  if (pd->win < 0) { /* pair indices */
    for (size_t v = 0; v < nv / 2; v++) {
      __m512i bv;
      F16_STEP(v, bv);
      _mm512_storeu_si512(idx + 16 * v, _mm512_madd_epi16(bv, pairc));
      PROBE__PENDING_STEP(16);
    }
    b->zero = hsum16(cnt);
    b->nonfinite = nonfin != 0;
  } else { /* window mode: 32 elements per step */
    WIN_DECL(pd);
    (void)hwin, (void)hone, (void)h16;
    uint16_t tab[32]; /* raw exponent -> one-hot word (0 outside the window) */
    for (int v = 0; v < 32; v++)
      tab[v] = (uint16_t)(v >= pd->win && v < pd->win + PROBE__WIN16 ? 1u << (v - pd->win) : 0);
    const __m512i otab = _mm512_loadu_si512(tab);
    /* Sum: significands (implicit bit set) times the signed one-hot word
     * (sign and raw exponent -> +-oh, 64 entries), exactly, in 32-bit lanes;
     * see the comment above F16_SQ. */
    int16_t stab[64];
    for (int v = 0; v < 64; v++)
      stab[v] = (int16_t)(v & 32 ? -(int)tab[v & 31] : (int)tab[v & 31]);
    const __m512i stlo = _mm512_loadu_si512(stab), sthi = _mm512_loadu_si512(stab + 32);
    const __m512i m3ff = _mm512_set1_epi16(0x03ff), c400 = _mm512_set1_epi16(0x0400);
    const __m512i mexp = _mm512_set1_epi64(0x7fffll << 42), cexp = _mm512_set1_epi64(0x4000ll << 48);
    __m512i msum = z, sum64 = z;
#define F16_WSTEP(v_, oh_)                                                            \
  do {                                                                                \
    const unsigned char *q_ = p + 64 * (v_);                                          \
    __m512i h = _mm512_loadu_si512(q_);                                               \
    _mm_prefetch((const char *)q_ + PREFETCH16, _MM_HINT_T0);                         \
    __m512i a = _mm512_and_si512(h, m7fff);                                           \
    __mmask32 nz = _mm512_test_epi16_mask(a, a);                                      \
    amin = _mm512_mask_min_epu16(amin, nz, amin, a);                                  \
    smax = _mm512_max_epi16(smax, h);                                                 \
    umax = _mm512_max_epu16(umax, h);                                                 \
    /* one-hot word of the raw exponent (vpermw reads the low 5 bits) */              \
    __m512i e_ = _mm512_srli_epi16(h, 10); /* sign and raw exponent */                \
    oh_ = _mm512_permutexvar_epi16(e_, otab);                                         \
    __mmask32 o_ = _mm512_mask_testn_epi16_mask(nz, oh_, oh_);                        \
    if (__builtin_expect(o_ != 0, 0)) {                                               \
      _mm512_storeu_si512(outp, _mm512_maskz_compress_epi16(o_, h));                  \
      outp += __builtin_popcount(o_);                                                 \
    }                                                                                 \
    __m512i m_ = _mm512_ternarylogic_epi32(a, m3ff, c400, 0xea);                      \
    msum = _mm512_dpwssd_epi32(msum, m_, _mm512_permutex2var_epi16(stlo, e_, sthi));  \
    F16_SQ(h);                                                                        \
  } while (0)
#define F16_IN(i_, d_) F16_WSTEP(v_ + (i_), d_)
#define F16_EVERY16                                                                   \
  do {                                                                                \
    sum64 = _mm512_add_epi64(sum64, _mm512_cvtepi32_epi64(_mm512_castsi512_si256(msum))); \
    sum64 = _mm512_add_epi64(sum64, _mm512_cvtepi32_epi64(_mm512_extracti64x4_epi64(msum, 1))); \
    msum = z;                                                                         \
  } while (0)
    WIN_RUN_EVERY16(F16_WSTEP, F16_IN, b, pd, nv / 2, F16_EVERY16);
#undef F16_EVERY16
#undef F16_IN
#undef F16_WSTEP
    b->zero = 0; /* the driver counts them from the window counts */
    ext16_fix(p, nv, smax, umax, amin, &smin, &umin);
    /* inf or NaN: a positive pattern > 0x7bff or a negative one > 0xfbff */
    b->nonfinite = _mm512_cmpgt_epi16_mask(smax, c7bff) ||
                   _mm512_cmpgt_epu16_mask(umax, _mm512_set1_epi16((short)0xfbff));
    /* |sum64| < 2^39 per block, so both are exact; the driver adds the
     * elements outside the window (and takes out what zeros and subnormals
     * put into the squares). */
    b->sum = (double)_mm512_reduce_add_epi64(sum64) * pow2(pd->win - 25);
    b->sumsq = _mm512_reduce_add_pd(_mm512_add_pd(_mm512_add_pd(q0, q1), _mm512_add_pd(q2, q3))) * 0x1p-32;
  }
#undef F16_STEP
  PROBE__PENDING_FINISH(pd);
  b->flush = 0; /* no binary16 value has 0 < |x| <= 2^-25 */
  b->ovf = 0;   /* nor a finite |x| >= 65520 */
  if (pd->win < 0) {
    b->sum = _mm512_reduce_add_pd(_mm512_add_pd(s0, s1));
    b->sumsq = _mm512_reduce_add_pd(_mm512_add_pd(_mm512_add_pd(q0, q1), _mm512_add_pd(q2, q3)));
  }
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
  __m512d s0 = _mm512_setzero_pd(), s1 = s0, q0 = s0, q1 = s0, q2 = s0, q3 = s0;
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
    const __m512i m8 = _mm512_set1_epi16(0xff);
    b->zero = hsum16(_mm512_and_si512(cnt, m8));
    b->flush = hsum16(_mm512_srli_epi16(cnt, 8)) - b->zero;
    b->ovf = hsum16(covf);
  } else { /* window mode: 32 elements per step; raw binary32 exponents */
    WIN_DECL(pd);
#define BF16_WSTEP(v_, oh_)                                                                 \
  do {                                                                                      \
    __m512i h = _mm512_loadu_si512(p + 64 * (v_));                                          \
    _mm_prefetch((const char *)p + 64 * (v_) + PREFETCH16, _MM_HINT_T0);                    \
    __m512i a = _mm512_and_si512(h, m7fff);                                                 \
    __mmask32 nz = _mm512_test_epi16_mask(a, a);                                            \
    cnt = _mm512_mask_add_epi16(cnt, _mm512_mask_cmplt_epu16_mask(nz, a, c3301), cnt, one); \
    amin = _mm512_mask_min_epu16(amin, nz, amin, a);                                        \
    smax = _mm512_max_epi16(smax, h);                                                       \
    umax = _mm512_max_epu16(umax, h);                                                       \
    __m512 f0 = _mm512_castsi512_ps(_mm512_unpacklo_epi16(z, h));                           \
    __m512 f1 = _mm512_castsi512_ps(_mm512_unpackhi_epi16(z, h));                           \
    SUM32(f0, f1);                                                                          \
    __m512i e_ = _mm512_srli_epi16(a, 7);                                                   \
    HOT(e_, nz, e_, oh_);                                                                   \
  } while (0)
#define BF16_IN(i_, d_) BF16_WSTEP(v_ + (i_), d_)
    WIN_RUN(BF16_WSTEP, BF16_IN, b, pd, nv / 2);
#undef BF16_IN
#undef BF16_WSTEP
    b->zero = 0; /* the driver counts them from the window counts */
    b->flush = hsum16(cnt);
    ext16_fix(p, nv, smax, umax, amin, &smin, &umin);
    b->ovf = 0; /* |x| >= 65520 (inf, NaN included): counted only if present,
                   i.e. a positive pattern > 0x477f or a negative one > 0xc77f */
    if (_mm512_cmpgt_epi16_mask(smax, c477f) ||
        _mm512_cmpgt_epu16_mask(umax, _mm512_set1_epi16((short)0xc77f)))
      b->ovf = count_big16(p, 16 * nv);
  }
#undef BF16_STEP
  PROBE__PENDING_FINISH(pd);
  b->nonfinite = 0; /* decided by the driver from ovf */
  b->sum = _mm512_reduce_add_pd(_mm512_add_pd(s0, s1));
  b->sumsq = _mm512_reduce_add_pd(_mm512_add_pd(_mm512_add_pd(q0, q1), _mm512_add_pd(q2, q3)));
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
  __m512d s0 = _mm512_setzero_pd(), s1 = s0, q0 = s0, q1 = s0, q2 = s0, q3 = s0;
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
    SUM32M(p + 128 * (v_)); /* from memory, as the window loops */                           \
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
    const __m512i m10 = _mm512_set1_epi32(0x3ff);
    b->zero = hsum32(_mm512_and_si512(cnt, m10));
    b->flush = hsum32(_mm512_and_si512(_mm512_srli_epi32(cnt, 10), m10)) - b->zero;
    b->ovf = hsum32(_mm512_srli_epi32(cnt, 20));
  } else { /* window mode: 32 elements per step; raw binary32 exponents */
    WIN_DECL(pd);
    /* the high 16-bit halves of a0's then a1's lanes */
    const __m512i hix = _mm512_set_epi16(63, 61, 59, 57, 55, 53, 51, 49, 47, 45, 43, 41, 39, 37, 35, 33,
                                         31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
#define F32_WSTEP(v_, oh_)                                                                    \
  do {                                                                                        \
    const unsigned char *q_ = p + 128 * (v_);                                                 \
    __m512i x0 = _mm512_loadu_si512(q_);                                                      \
    __m512i x1 = _mm512_loadu_si512(q_ + 64);                                                 \
    _mm_prefetch((const char *)q_ + PREFETCH, _MM_HINT_T0);                                   \
    _mm_prefetch((const char *)q_ + PREFETCH + 64, _MM_HINT_T0);                              \
    __m512i a0 = _mm512_and_si512(x0, mabs), a1 = _mm512_and_si512(x1, mabs);                 \
    __mmask16 nz0 = _mm512_test_epi32_mask(a0, a0), nz1 = _mm512_test_epi32_mask(a1, a1);     \
    cnt = _mm512_mask_add_epi32(cnt, _mm512_mask_cmplt_epu32_mask(nz0, a0, cflush), cnt, one); \
    cnt = _mm512_mask_add_epi32(cnt, _mm512_mask_cmplt_epu32_mask(nz1, a1, cflush), cnt, one); \
    amin = _mm512_mask_min_epu32(amin, nz0, amin, a0);                                        \
    amin = _mm512_mask_min_epu32(amin, nz1, amin, a1);                                        \
    smax = _mm512_max_epi32(smax, _mm512_max_epi32(x0, x1));                                  \
    umax = _mm512_max_epu32(umax, _mm512_max_epu32(x0, x1));                                  \
    SUM32M(q_);                                                                               \
    __m512i e_ = _mm512_srli_epi16(_mm512_permutex2var_epi16(a0, hix, a1), 7);                \
    HOT(e_, (__mmask32)nz0 | (__mmask32)nz1 << 16, e_, oh_);                                  \
  } while (0)
#define F32_IN(i_, d_) F32_WSTEP(v_ + (i_), d_)
    WIN_RUN(F32_WSTEP, F32_IN, b, pd, nv / 2);
#undef F32_IN
#undef F32_WSTEP
    b->zero = 0; /* the driver counts them from the window counts */
    b->flush = hsum32(cnt);
    ext32_fix(p, nv, smax, umax, amin, &smin, &umin);
    b->ovf = 0; /* |x| >= 65520 (inf, NaN included): counted only if present,
                   i.e. a positive pattern > 0x477fefff or a negative one > 0xc77fefff */
    if (_mm512_reduce_max_epi32(smax) > 0x477fefff || _mm512_reduce_max_epu32(umax) > 0xc77fefffu)
      b->ovf = count_big32(p, 16 * nv);
  }
#undef F32_STEP
  PROBE__PENDING_FINISH(pd);
  b->nonfinite = 0;
  b->sum = _mm512_reduce_add_pd(_mm512_add_pd(s0, s1));
  b->sumsq = _mm512_reduce_add_pd(_mm512_add_pd(_mm512_add_pd(q0, q1), _mm512_add_pd(q2, q3)));
  b->smax = _mm512_reduce_max_epi32(smax);
  b->smin = _mm512_reduce_min_epi32(smin);
  b->umax = _mm512_reduce_max_epu32(umax);
  b->umin = _mm512_reduce_min_epu32(umin);
  uint32_t am = _mm512_reduce_min_epu32(amin);
  b->amin_m1 = am == UINT32_MAX ? UINT32_MAX : am - 1u;
}

#else /* not compiled for AVX-512: stats_dispatch.c never selects this path */

void probe__hs_fold16_avx512(probe__hs *h) { (void)h; }
void probe__hs_count_avx512(const probe__hs *h, uint64_t wc[PROBE__WIN]) {
  (void)h;
  for (int i = 0; i < PROBE__WIN; i++) wc[i] = 0;
}

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
