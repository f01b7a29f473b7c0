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
 *  - counts: f16_subnormal read off the histogram (bins below 2^-14);
 *    f16_flush and f16_overflow by a scalar pass over the tensor only when
 *    its smallest non-zero magnitude or its largest finite one shows it has
 *    some (never for fp16; per-lane counters of them cost a sixth of a
 *    step);
 *  - sums: binary32 -> double, two sum and two sum-of-squares accumulators;
 *  - histogram: each element's bin as a byte (0xff for zeros), four vectors
 *    packed into one store; at the end (count_bins) the eight bins ending at
 *    the largest present (known from the extremes) by a byte compare and add
 *    per 32 of them into byte counters summed by vpsadbw, the few elements
 *    below those one at a time (or, when there are many, a compare per bin
 *    value as before).
 * A step that is not 32 finite elements (inf or NaN in it, or the last,
 * partial one, read through a zero-padded copy) takes the same loop with
 * every update masked to its finite elements, and counts its inf and NaN
 * by a scalar loop; no element is read twice.
 */
#include "stats_impl.h"

#include <string.h>

#if defined(__AVX2__) && defined(__F16C__) && defined(__FMA__)
#include <immintrin.h>

enum { NB = PROBE_HIST_BINS,
       F32_BIAS16 = 127 + PROBE_HIST_MIN_EXP - 1 }; /* binary32 field e8: bin e8 - this */

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

/* One pass over bins[0 .. 32 nbv): cnt[k] = bytes equal to key + k, k = 0 ..
 * 7 (the byte less key compared with 0 .. 7 and subtracted into eight byte
 * counters, at most 128 per lane for n <= 4096, summed by vpsadbw; two
 * sweeps of four, which fit in the 16 vector registers), cnt[8] = bytes >=
 * key, and below[v] = the mask of the bytes below key in vector v. */
static void count8(const uint8_t *bins, size_t nbv, int key, uint64_t cnt[9], uint32_t *below) {
  const __m256i z = _mm256_setzero_si256();
  const __m256i ck = _mm256_set1_epi8((char)key);
  __m256i c0 = z, c1 = z, c2 = z, c3 = z, c4 = z, c5 = z, c6 = z, c7 = z, ckeep = z;
  for (size_t v = 0; v < nbv; v++) {
    __m256i b = _mm256_loadu_si256((const __m256i *)(const void *)(bins + 32 * v));
    __m256i t = _mm256_sub_epi8(b, ck);
    c0 = _mm256_add_epi8(c0, _mm256_cmpeq_epi8(t, _mm256_set1_epi8(0)));
    c1 = _mm256_add_epi8(c1, _mm256_cmpeq_epi8(t, _mm256_set1_epi8(1)));
    c2 = _mm256_add_epi8(c2, _mm256_cmpeq_epi8(t, _mm256_set1_epi8(2)));
    c3 = _mm256_add_epi8(c3, _mm256_cmpeq_epi8(t, _mm256_set1_epi8(3)));
    __m256i keep = _mm256_cmpeq_epi8(_mm256_max_epu8(b, ck), b); /* b >= key */
    ckeep = _mm256_add_epi8(ckeep, keep);
    below[v] = ~(uint32_t)_mm256_movemask_epi8(keep);
  }
  for (size_t v = 0; v < nbv; v++) {
    __m256i t = _mm256_sub_epi8(_mm256_loadu_si256((const __m256i *)(const void *)(bins + 32 * v)), ck);
    c4 = _mm256_add_epi8(c4, _mm256_cmpeq_epi8(t, _mm256_set1_epi8(4)));
    c5 = _mm256_add_epi8(c5, _mm256_cmpeq_epi8(t, _mm256_set1_epi8(5)));
    c6 = _mm256_add_epi8(c6, _mm256_cmpeq_epi8(t, _mm256_set1_epi8(6)));
    c7 = _mm256_add_epi8(c7, _mm256_cmpeq_epi8(t, _mm256_set1_epi8(7)));
  }
  /* the counters went down by one per element (-1 from the compare) */
  const __m256i cs[9] = {c0, c1, c2, c3, c4, c5, c6, c7, ckeep};
  for (int k = 0; k < 9; k++) {
    uint64_t t[4];
    _mm256_storeu_si256((__m256i *)(void *)t, _mm256_sad_epu8(_mm256_sub_epi8(z, cs[k]), z));
    cnt[k] = t[0] + t[1] + t[2] + t[3];
  }
}

/* Adds the bins bins[0 .. 32 nbv) (0xff: none) into a->hist, bmax being the
 * largest present (the bin of the largest finite |x|; -1: none). *nonzero
 * and *sub receive the elements counted and those below 2^-14.
 * Passes of eight bins go down from bmax (count8): the first, key .. bmax
 * with key = bmax - 7, holds nearly every element of most tensors (below
 * the largest binade the elements thin out geometrically: N(0,1) leaves
 * ~1.3% of them below key). When at most n/16 are left below a pass's key
 * they are added one at a time from its masks; else the next eight bins
 * get a pass (a trainer's fp32 gradients leave 5-19% below the first eight
 * and spread over many more bins, where a compare per bin value and vector
 * cost more). */
static void count_bins(probe__acc *a, const uint8_t *bins, size_t nbv, int bmax, uint64_t *nonzero,
                       uint64_t *sub) {
  if (!nbv || bmax < 0) return;
  uint32_t below[PROBE__SMALL_MAX_N / 32 + 1];
  int top = bmax;
  for (;;) {
    const int key = top >= 7 ? top - 7 : 0;
    uint64_t cnt[9];
    count8(bins, nbv, key, cnt, below);
    for (int k = 0; k <= top - key; k++) {
      a->hist[key + k] += cnt[k];
      *nonzero += cnt[k];
      if (key + k < PROBE__SUB_BINS) *sub += cnt[k];
    }
    /* (bytes above top, 0xff or bins of an earlier pass, are >= key too) */
    const size_t nbelow = 32 * nbv - cnt[8];
    if (!nbelow) return;
    if (nbelow <= 2 * nbv) { /* few: one at a time */
      *nonzero += nbelow;
      for (size_t v = 0; v < nbv; v++)
        for (uint32_t m = below[v]; m; m &= m - 1) {
          int bv = bins[32 * v + (size_t)__builtin_ctz(m)];
          a->hist[bv]++;
          *sub += bv < PROBE__SUB_BINS;
        }
      return;
    }
    top = key - 1;
  }
}

/* The bins of n finite fp16 elements at p, exact for subnormals too (the
 * binary32 exponent of the F16C conversion), in vectors of 32 bytes as
 * small16 writes them (zeros 0xff; the last vector padded with zeros; the
 * order within a vector differs, which counting ignores). Run only when a
 * tensor has subnormals below 2^-15: one pass of some 15 operations per 32
 * elements, where a scalar fix-up of every element cost ~1.4 ns each. */
static void exact_f16_bins(uint8_t *bins, const unsigned char *p, size_t n) {
  const __m256i m7fff = _mm256_set1_epi16(0x7fff), cb = _mm256_set1_epi16(F32_BIAS16);
  const __m256i z = _mm256_setzero_si256();
#define EXACT16(h_, out_)                                                      \
  do {                                                                         \
    __m256i e_ = probe__f16_exp32_avx2(_mm256_and_si256((h_), m7fff));         \
    out_ = _mm256_or_si256(_mm256_subs_epu16(e_, cb), _mm256_cmpeq_epi16(e_, z)); \
  } while (0)
  size_t v = 0;
  for (; 32 * (v + 1) <= n; v++) {
    const unsigned char *q = p + 64 * v;
    __m256i bA, bB;
    EXACT16(_mm256_loadu_si256((const __m256i *)(const void *)q), bA);
    EXACT16(_mm256_loadu_si256((const __m256i *)(const void *)(q + 32)), bB);
    _mm256_storeu_si256((__m256i *)(void *)(bins + 32 * v), _mm256_packs_epi16(bA, bB));
  }
  if (32 * v < n) {
    uint16_t t[32] = {0};
    memcpy(t, p + 64 * v, 2 * (n - 32 * v));
    __m256i bA, bB;
    EXACT16(_mm256_loadu_si256((const __m256i *)(void *)t), bA);
    EXACT16(_mm256_loadu_si256((const __m256i *)(void *)(t + 16)), bB);
    _mm256_storeu_si256((__m256i *)(void *)(bins + 32 * v), _mm256_packs_epi16(bA, bB));
  }
#undef EXACT16
}

/* fp16 and bf16 tensors without inf or NaN, in 16-bit lanes: 32 elements
 * per step as two vectors of raw patterns, about half the work of the
 * binary32 loop below (which a tensor with inf or NaN takes instead: this
 * returns 0 then, having changed nothing). Per step: the signed and the
 * unsigned maximum and the smallest non-zero |x| of the patterns (the
 * largest |x| and, for a tensor of one sign, the minima follow from them
 * at the end: probe__minima16); each element's bin in a 16-bit lane (fp16:
 * raw exponent + 18, so subnormals land in bin 18 and get their
 * exact bins afterwards, only when the smallest |x| shows there are some;
 * bf16: the binary32 bin, clamped), zeros 0xffff, packed to bytes; the sums
 * converted to double (vcvtph2ps or an unpack, vcvtps2pd). The last partial
 * step reads a copy padded with +0 for the bins and sums and with its own
 * first element for the extremes. */
static int small16(probe__acc *a, probe_dtype dt, const unsigned char *p, size_t n) {
  const int f16 = dt == PROBE_DTYPE_F16;
  const __m256i m7fff = _mm256_set1_epi16(0x7fff), c7fff = m7fff;
  const __m256i z = _mm256_setzero_si256();
  const __m256i cb = _mm256_set1_epi16(f16 ? 18 : F32_BIAS16), clast = _mm256_set1_epi16(NB - 1);
  __m256i smax = _mm256_set1_epi16(INT16_MIN), umax = z, aminb = c7fff;
  __m256d s0 = _mm256_setzero_pd(), s1 = s0, s2 = s0, s3 = s0, q0 = s0, q1 = s0, q2 = s0, q3 = s0;
  uint8_t bins[PROBE__SMALL_MAX_N + 32];
  size_t nbv = 0;
  /* eight binary32 lanes each of fa_ and fb_ into the sums (sa_, sb_) and
   * the four sum-of-squares accumulators */
#define S16_SUMS2(fa_, fb_, sa_, sb_)                                          \
  do {                                                                         \
    __m256d d0_ = _mm256_cvtps_pd(_mm256_castps256_ps128(fa_));                \
    __m256d d1_ = _mm256_cvtps_pd(_mm256_extractf128_ps(fa_, 1));              \
    __m256d d2_ = _mm256_cvtps_pd(_mm256_castps256_ps128(fb_));                \
    __m256d d3_ = _mm256_cvtps_pd(_mm256_extractf128_ps(fb_, 1));              \
    sa_ = _mm256_add_pd(sa_, _mm256_add_pd(d0_, d1_));                         \
    sb_ = _mm256_add_pd(sb_, _mm256_add_pd(d2_, d3_));                         \
    q0 = _mm256_fmadd_pd(d0_, d0_, q0);                                        \
    q1 = _mm256_fmadd_pd(d1_, d1_, q1);                                        \
    q2 = _mm256_fmadd_pd(d2_, d2_, q2);                                        \
    q3 = _mm256_fmadd_pd(d3_, d3_, q3);                                        \
  } while (0)
#define S16_SUMS(f0_, f1_, f2_, f3_)                                           \
  do {                                                                         \
    S16_SUMS2(f0_, f1_, s0, s1);                                               \
    S16_SUMS2(f2_, f3_, s2, s3);                                               \
  } while (0)
  /* hA, hB: 32 patterns for the extremes; zA, zB (at zp_): the same or,
   * in the padded last step, +0 past the end, for the bins and sums */
#define S16_STEP(hA, hB, zA, zB, zp_)                                          \
  do {                                                                         \
    smax = _mm256_max_epi16(smax, _mm256_max_epi16(hA, hB));                   \
    umax = _mm256_max_epu16(umax, _mm256_max_epu16(hA, hB));                   \
    __m256i xA_ = _mm256_and_si256(hA, m7fff), xB_ = _mm256_and_si256(hB, m7fff); \
    aminb = _mm256_min_epi16(aminb, _mm256_min_epi16(_mm256_add_epi16(xA_, c7fff), \
                                                     _mm256_add_epi16(xB_, c7fff))); \
    __m256i aA_ = _mm256_and_si256(zA, m7fff), aB_ = _mm256_and_si256(zB, m7fff); \
    __m256i bA_, bB_;                                                          \
    if (f16) {                                                                 \
      bA_ = _mm256_add_epi16(_mm256_srli_epi16(aA_, 10), cb);                  \
      bB_ = _mm256_add_epi16(_mm256_srli_epi16(aB_, 10), cb);                  \
    } else {                                                                   \
      bA_ = _mm256_min_epu16(_mm256_subs_epu16(_mm256_srli_epi16(aA_, 7), cb), clast); \
      bB_ = _mm256_min_epu16(_mm256_subs_epu16(_mm256_srli_epi16(aB_, 7), cb), clast); \
    }                                                                          \
    bA_ = _mm256_or_si256(bA_, _mm256_cmpeq_epi16(aA_, z));                    \
    bB_ = _mm256_or_si256(bB_, _mm256_cmpeq_epi16(aB_, z));                    \
    _mm256_storeu_si256((__m256i *)(void *)(bins + 32 * nbv++), _mm256_packs_epi16(bA_, bB_)); \
    if (f16) {                                                                 \
      const __m128i *m_ = (const __m128i *)(const void *)(zp_);                \
      S16_SUMS(_mm256_cvtph_ps(_mm_loadu_si128(m_)), _mm256_cvtph_ps(_mm_loadu_si128(m_ + 1)), \
               _mm256_cvtph_ps(_mm_loadu_si128(m_ + 2)), _mm256_cvtph_ps(_mm_loadu_si128(m_ + 3))); \
    } else {                                                                   \
      S16_SUMS(_mm256_castsi256_ps(_mm256_unpacklo_epi16(z, zA)),              \
               _mm256_castsi256_ps(_mm256_unpackhi_epi16(z, zA)),              \
               _mm256_castsi256_ps(_mm256_unpacklo_epi16(z, zB)),              \
               _mm256_castsi256_ps(_mm256_unpackhi_epi16(z, zB)));             \
    }                                                                          \
  } while (0)
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const unsigned char *q = p + 2 * i;
    __m256i hA = _mm256_loadu_si256((const __m256i *)(const void *)q);
    __m256i hB = _mm256_loadu_si256((const __m256i *)(const void *)(q + 32));
    S16_STEP(hA, hB, hA, hB, q);
  }
  if (i < n) {
    uint16_t tz[32] = {0}, td[32];
    memcpy(tz, p + 2 * i, 2 * (n - i));
    for (int k = 0; k < 32; k++) td[k] = (size_t)k < n - i ? tz[k] : tz[0];
    __m256i hA = _mm256_loadu_si256((const __m256i *)(void *)td);
    __m256i hB = _mm256_loadu_si256((const __m256i *)(void *)(td + 16));
    __m256i zA = _mm256_loadu_si256((const __m256i *)(void *)tz);
    __m256i zB = _mm256_loadu_si256((const __m256i *)(void *)(tz + 16));
    S16_STEP(hA, hB, zA, zB, tz);
  }
#undef S16_STEP
#undef S16_SUMS
#undef S16_SUMS2
  int16_t sx, sn;
  uint16_t ux, un, amin; /* amin: smallest non-zero |x| pattern (UINT16_MAX: none) */
  probe__red16_avx2(smax, umax, aminb, &sx, &ux, &amin);
  /* the largest |x| pattern: the largest positive or the largest negative one */
  uint16_t ax = sx > 0 ? (uint16_t)sx : 0;
  if (ux >= 0x8000u && (uint16_t)(ux & 0x7fffu) > ax) ax = ux & 0x7fffu;
  if (ax >= (f16 ? 0x7c00u : 0x7f80u)) return 0; /* inf or NaN: the binary32 loop */
  /* the largest bin present, that of the largest |x| */
  int bmax = ax == 0 ? -1 : f16 ? (ax >> 10) + 18 : ax >> 7 <= F32_BIAS16 ? 0 : (ax >> 7) - F32_BIAS16;
  if (bmax > NB - 1) bmax = NB - 1;
  uint64_t nonzero = 0, sub = 0;
  /* fp16 subnormals, all binned at 18 (exponent -15), where only those of
   * magnitude >= 2^-15 (patterns >= 0x200) belong: the bins again, exact */
  if (f16 && amin < 0x0200u) exact_f16_bins(bins, p, n);
  count_bins(a, bins, nbv, bmax, &nonzero, &sub);
  a->count += n;
  a->zero += (uint64_t)n - nonzero;
  a->sub += sub;
  if (!f16 && (amin <= 0x3300u || ax >= 0x4780u)) /* f16_flush, f16_overflow */
    probe__flush_ovf_avx2(dt, p, n, &a->flush, &a->ovf); /* (no inf or NaN here) */
  double ts[4], tq[4];
  _mm256_storeu_pd(ts, _mm256_add_pd(_mm256_add_pd(s0, s1), _mm256_add_pd(s2, s3)));
  _mm256_storeu_pd(tq, _mm256_add_pd(_mm256_add_pd(q0, q1), _mm256_add_pd(q2, q3)));
  a->sum += (ts[0] + ts[1]) + (ts[2] + ts[3]);
  a->sumsq += (tq[0] + tq[1]) + (tq[2] + tq[3]);
  probe__minima16(sx, ux, amin, nonzero < (uint64_t)n, &sn, &un);
  probe__blk ex;
  probe__blk_extremes16(&ex, sx, sn, ux, un, amin, f16);
  probe__acc_extremes(a, ex.smax, ex.smin, ex.umax, ex.umin, ex.amin_m1);
  return 1;
}

void probe__acc_small_avx2(probe__acc *a, probe_dtype dt, const void *data, size_t n) {
  const size_t es = probe_dtype_size(dt);
  const unsigned char *p = data;
  if (dt != PROBE_DTYPE_F32 && n > 0 && small16(a, dt, p, n)) return;
  const __m256i mabs = _mm256_set1_epi32(0x7fffffff), c7f = mabs;
  const __m256i cinf = _mm256_set1_epi32(0x7f800000);
  const __m256i cbias = _mm256_set1_epi32(127 + PROBE_HIST_MIN_EXP - 1);
  const __m256i clast = _mm256_set1_epi32(NB - 1);
  const __m256i z = _mm256_setzero_si256(), ones = _mm256_set1_epi32(-1);
  const __m256i cb16 = _mm256_set1_epi16(F32_BIAS16), clast16 = _mm256_set1_epi16(NB - 1);
  __m256i smax = _mm256_set1_epi32(INT32_MIN), umax = z, aminb = c7f;
  __m256d s0 = _mm256_setzero_pd(), s1 = s0, q0 = s0, q1 = s0;
  uint8_t bins[PROBE__SMALL_MAX_N + 32];
  uint64_t nan = 0, posinf = 0, neginf = 0;
  size_t nbv = 0; /* bins written, in vectors of 32 */

  /* Extremes: the signed and the unsigned maximum of the bits and the
   * smallest non-zero |x| (as min of (|x| - 1) ^ 0x80000000, signed, so that
   * zero wraps to the largest); the minima follow at the end
   * (probe__minima32). */
  /* The sums of 8 elements given as two vectors of 4 binary64 (SUMS_D); of
   * the 8 binary32 lanes of u (non-finite lanes zeroed: SUMS8); of 8
   * binary32 elements at f_, each half converted by vcvtps2pd from memory
   * (fp32: no vextractf128 per vector: SUMS4X2). */
#define SUMS_D(d0e_, d1e_)                                                     \
  do {                                                                         \
    __m256d d0_ = (d0e_), d1_ = (d1e_);                                        \
    s0 = _mm256_add_pd(s0, d0_);                                               \
    s1 = _mm256_add_pd(s1, d1_);                                               \
    q0 = _mm256_fmadd_pd(d0_, d0_, q0);                                        \
    q1 = _mm256_fmadd_pd(d1_, d1_, q1);                                        \
  } while (0)
#define SUMS8(u)                                                               \
  SUMS_D(_mm256_cvtps_pd(_mm256_castps256_ps128(_mm256_castsi256_ps(u))),      \
         _mm256_cvtps_pd(_mm256_extractf128_ps(_mm256_castsi256_ps(u), 1)))
#define SUMS4X2(f_) SUMS_D(_mm256_cvtps_pd(_mm_loadu_ps(f_)), _mm256_cvtps_pd(_mm_loadu_ps((f_) + 4)))
  /* One vector u of 8 elements of a step with inf or NaN (or the last,
   * partial one); f: all-ones in its finite lanes. bin_: its bins in
   * 32-bit lanes, 0xff for zeros and for lanes not finite. */
#define ELEM8_MASKED(u, f, bin_)                                               \
  do {                                                                         \
    __m256i ab_ = _mm256_and_si256(_mm256_and_si256(u, mabs), f);              \
    __m256i y_ = _mm256_or_si256(_mm256_and_si256(_mm256_add_epi32(ab_, c7f), f), \
                                 _mm256_andnot_si256(f, c7f));                 \
    smax = _mm256_max_epi32(smax, _mm256_blendv_epi8(_mm256_set1_epi32(INT32_MIN), u, f)); \
    umax = _mm256_max_epu32(umax, _mm256_and_si256(u, f));                     \
    aminb = _mm256_min_epi32(aminb, y_);                                       \
    u = _mm256_and_si256(u, f);                                                \
    SUMS8(u);                                                                  \
    __m256i b_ = _mm256_min_epi32(_mm256_max_epi32(_mm256_sub_epi32(_mm256_srli_epi32(ab_, 23), cbias), z), clast); \
    bin_ = _mm256_or_si256(b_, _mm256_cmpeq_epi32(ab_, z));                    \
  } while (0)
  /* The bins of two vectors of |x| (a_, b_) in 16-bit lanes: the binary32
   * exponent field less the bias, clamped to 0 .. NB - 1 (one saturating
   * subtraction and a min, half the work of 32-bit lanes), 0xffff for
   * zeros. The lanes come out in packus order, which a histogram ignores. */
#define BINS16(a_, b_)                                                         \
  _mm256_or_si256(_mm256_min_epu16(_mm256_subs_epu16(_mm256_packus_epi32(     \
                                       _mm256_srli_epi32(a_, 23), _mm256_srli_epi32(b_, 23)), cb16), \
                                   clast16),                                   \
                  _mm256_packs_epi32(_mm256_cmpeq_epi32(a_, z), _mm256_cmpeq_epi32(b_, z)))
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
    if (__builtin_expect(_mm256_movemask_epi8(_mm256_cmpgt_epi32(cinf, mx)) == -1, 1)) {
      const __m256i a0 = _mm256_and_si256(u0, mabs), a1 = _mm256_and_si256(u1, mabs);
      const __m256i a2 = _mm256_and_si256(u2, mabs), a3 = _mm256_and_si256(u3, mabs);
      smax = _mm256_max_epi32(smax, _mm256_max_epi32(_mm256_max_epi32(u0, u1), _mm256_max_epi32(u2, u3)));
      umax = _mm256_max_epu32(umax, _mm256_max_epu32(_mm256_max_epu32(u0, u1), _mm256_max_epu32(u2, u3)));
      aminb = _mm256_min_epi32(aminb, _mm256_min_epi32(
                                          _mm256_min_epi32(_mm256_add_epi32(a0, c7f), _mm256_add_epi32(a1, c7f)),
                                          _mm256_min_epi32(_mm256_add_epi32(a2, c7f), _mm256_add_epi32(a3, c7f))));
      if (dt == PROBE_DTYPE_F32) { /* converted from memory: no extracts */
        SUMS4X2((const float *)(const void *)q);
        SUMS4X2((const float *)(const void *)(q + 32));
        SUMS4X2((const float *)(const void *)(q + 64));
        SUMS4X2((const float *)(const void *)(q + 96));
      } else {
        SUMS8(u0);
        SUMS8(u1);
        SUMS8(u2);
        SUMS8(u3);
      }
      _mm256_storeu_si256((__m256i *)(void *)(bins + 32 * nbv++),
                          _mm256_packs_epi16(BINS16(a0, a1), BINS16(a2, a3)));
    } else { /* inf or NaN in the step: masked, and counted one by one */
      __m256i us[4] = {u0, u1, u2, u3}, bs[4];
      for (int k = 0; k < 4; k++) {
        __m256i u = us[k];
        __m256i f = _mm256_cmpgt_epi32(cinf, _mm256_and_si256(u, mabs));
        count_nonfinite(u, 8, &nan, &posinf, &neginf);
        __m256i bk;
        ELEM8_MASKED(u, f, bk);
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
      ELEM8_MASKED(u, f, bk);
      bs[k] = _mm256_or_si256(bk, _mm256_xor_si256(f, ones));
    }
    PACK_BINS(bs[0], bs[1], bs[2], bs[3]);
  }
#undef PACK_BINS
#undef BINS16
#undef ELEM8_MASKED
#undef SUMS8
#undef SUMS4X2
#undef SUMS_D


  int32_t t0[8], t4[8];
  uint32_t t2[8];
  _mm256_storeu_si256((__m256i *)(void *)t0, smax);
  _mm256_storeu_si256((__m256i *)(void *)t2, umax);
  _mm256_storeu_si256((__m256i *)(void *)t4, aminb);
  int32_t sx = INT32_MIN, mb = INT32_MAX;
  uint32_t ux = 0;
  for (int k = 0; k < 8; k++) {
    if (t0[k] > sx) sx = t0[k];
    if (t2[k] > ux) ux = t2[k];
    if (t4[k] < mb) mb = t4[k];
  }
  /* the largest finite |x|: the largest positive pattern (smax) or the
   * largest negative one (umax) */
  uint32_t amx = sx >= 0 ? (uint32_t)sx : 0;
  if (ux >= 0x80000000u && (ux & 0x7fffffffu) > amx) amx = ux & 0x7fffffffu;
  uint64_t nonzero = 0, sub = 0;
  count_bins(a, bins, nbv, amx ? probe__hist_bin(amx) : -1, &nonzero, &sub);
  a->count += n;
  a->nan += nan;
  a->posinf += posinf;
  a->neginf += neginf;
  a->zero += (uint64_t)n - nan - posinf - neginf - nonzero;
  a->sub += sub;
  /* f16_flush and f16_overflow: only when the extremes show some (never for
   * fp16: no binary16 value is in either range; rarely elsewhere) */
  uint32_t am1 = (uint32_t)mb ^ 0x80000000u; /* smallest non-zero |x| - 1 */
  if (dt != PROBE_DTYPE_F16 && (am1 < 0x33000000u || sx > 0x477fefff || ux > 0xc77fefffu)) {
    uint64_t big = 0; /* |x| >= 65520, inf and NaN included (the extremes
                       * above are of the finite elements) */
    probe__flush_ovf_avx2(dt, p, n, &a->flush, &big);
    a->ovf += big - nan - posinf - neginf;
  }
  double ts[4], tq[4];
  _mm256_storeu_pd(ts, _mm256_add_pd(s0, s1));
  _mm256_storeu_pd(tq, _mm256_add_pd(q0, q1));
  a->sum += (ts[0] + ts[1]) + (ts[2] + ts[3]);
  a->sumsq += (tq[0] + tq[1]) + (tq[2] + tq[3]);
  const uint64_t finite = (uint64_t)n - nan - posinf - neginf;
  int32_t sn = INT32_MAX;
  uint32_t un = UINT32_MAX;
  if (finite)
    probe__minima32(sx, ux, am1 + 1u, nonzero < finite, &sn, &un);
  probe__acc_extremes(a, sx, sn, ux, un, am1);
}

#else /* not compiled for AVX2: stats_dispatch.c never selects this path */

void probe__acc_small_avx2(probe__acc *a, probe_dtype dt, const void *data, size_t n) {
  probe__acc_portable(a, dt, data, n);
}

#endif
