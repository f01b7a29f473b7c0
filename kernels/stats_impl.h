/*
 * stats_impl.h - private to kernels/stats*.c: the accumulator every CPU
 * statistics path fills, and the portable block routine the SIMD path falls
 * back to.
 *
 * The accumulator keeps extremes as four integer reductions over the binary32
 * bit patterns of the finite values (signed/unsigned max/min). Those four are
 * associative and commutative, work the same on 16-bit lanes, and give min,
 * max and absmax in the total order (-0 < +0) without building sort keys:
 *   smax = max over bits as int32    smin = min over bits as int32
 *   umax = max over bits as uint32   umin = min over bits as uint32
 *   max   = smax if some value has sign 0, else smin
 *   min   = umax if some value has sign 1, else umin
 *   absmax = larger |.| of those two candidates.
 */
#ifndef AMPPROBE_STATS_IMPL_H
#define AMPPROBE_STATS_IMPL_H

#include "ampprobe/numerics.h"

typedef struct probe__acc {
  uint64_t count, nan, posinf, neginf, zero, sub, flush, ovf;
  int32_t smax, smin;  /* identities INT32_MIN, INT32_MAX */
  uint32_t umax, umin; /* identities 0, UINT32_MAX */
  uint32_t amin_m1;    /* min over finite x of (|x| bits - 1), wrapping: zero
                          gives UINT32_MAX, which is also the identity */
  double sum, sumsq;
  uint64_t hist[PROBE_HIST_BINS];
} probe__acc;

/* The caller's floating-point mode may flush subnormals (x86 MXCSR FTZ and
 * DAZ: torch.set_flush_denormal(True)); the sums must not (a tensor of
 * fp32/bf16 subnormals summed to 0 beside its non-zero counts). enter
 * clears those bits for one pass and returns the caller's MXCSR; leave
 * puts it back. Elsewhere no-ops (the portable C of other CPUs follows the
 * platform's default, which keeps subnormals). */
#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#define PROBE__MXCSR_FLUSH 0x8040u /* FTZ (bit 15) | DAZ (bit 6) */
static inline unsigned probe__fp_exact_enter(void) {
  unsigned c = _mm_getcsr();
  if (c & PROBE__MXCSR_FLUSH) _mm_setcsr(c & ~PROBE__MXCSR_FLUSH);
  return c;
}
static inline void probe__fp_exact_leave(unsigned c) {
  if (c & PROBE__MXCSR_FLUSH) _mm_setcsr(c);
}
#else
static inline unsigned probe__fp_exact_enter(void) { return 0; }
static inline void probe__fp_exact_leave(unsigned c) { (void)c; }
#endif

void probe__acc_init(probe__acc *a);
/* Fold the extremes of one more set of finite binary32 bit patterns. */
void probe__acc_extremes(probe__acc *a, int32_t smax, int32_t smin,
                         uint32_t umax, uint32_t umin, uint32_t amin_m1);
void probe__acc_finish(const probe__acc *a, probe_stats *out);
/* Adds data[0..n) (dtype dt) into a, one element at a time. */
void probe__acc_portable(probe__acc *a, probe_dtype dt, const void *data,
                         size_t n);

/* Bins 0 .. PROBE__SUB_BINS - 1 hold the non-zero |x| < 2^-14, which
 * f16_subnormal counts: every path reads that count off the histogram. */
enum { PROBE__SUB_BINS = -14 - PROBE_HIST_MIN_EXP + 1 };

/* Histogram bin of a finite non-zero binary32 magnitude (|x| bits). */
static inline int probe__hist_bin(uint32_t abits) {
  int e = (int)(abits >> 23); /* 0 for binary32 subnormals: bin 0 */
  int b = e - 127 - PROBE_HIST_MIN_EXP + 1;
  return b < 0 ? 0 : (b > PROBE_HIST_BINS - 1 ? PROBE_HIST_BINS - 1 : b);
}

/* ---- the vectorised paths (stats_block.c drives stats_avx2.c, stats_avx512.c) */

enum { PROBE__BLOCK = 4096, /* elements per checked block */
       PROBE__WBLOCK = 16384, /* the same in window mode, which has no 8-bit
                                 counters to overflow: fewer blocks, less
                                 per-block work (reductions, folds) */
       PROBE__WIN = 16,     /* bins per window (window mode) */
       PROBE__WIN16 = 15,   /* values an fp16 window holds: its sums weight
                               each element by its one-hot word, which must
                               stay a positive int16 (stats_avx512.c) */
       PROBE__S16 = 64,     /* see probe__hs */
       PROBE__BIG = 16 };

/* What one block's vector loops found, before the driver accepts it (all of
 * it describes only the block's finite data; see stats_avx2.c). */
typedef struct probe__blk {
  uint64_t zero, flush, ovf; /* (f16_subnormal: read off the histogram) */
  int nonfinite;             /* fp16: 1 when an inf or NaN was seen */
  int32_t smax, smin;        /* extremes as binary32 bits */
  uint32_t umax, umin, amin_m1;
  double sum, sumsq;
  /* Window mode (AVX-512 only, see probe__pending.win): the new number of
   * weight-16 vectors in hs->s16, and how many elements were written to
   * outb. (zero is 0 then: the driver counts zeros from the window counts.) */
  size_t n16;
  size_t nout;
} probe__blk;

/* Window mode: the elements inside the window are counted in
 * bit-sliced counters, vectors of 32 16-bit lanes in which bit k of a lane
 * stands for window value win + k, that persist across blocks:
 * lo[cur][0..3] have weights 1, 2, 4, 8; s16[0 .. n16) weight 16 each;
 * hi[0..11] weights 16, 32, .., 32768; big[0 .. nbig) 65536 each. A block
 * function reads lo[cur] and n16, writes lo[!cur] and appends to s16 from
 * n16 on (at most 47 vectors: 32 from the groups of 16 steps of a
 * 16384-element block, 15 from its last steps; n16 < 16 when it starts, as
 * the driver folds every group of 16); the driver accepts the block by
 * flipping cur and taking its n16, so a discarded block changes nothing. */
typedef struct probe__hs {
  uint16_t lo[2][4 * 32];
  int cur;
  uint16_t s16[PROBE__S16 * 32];
  size_t n16;
  uint16_t hi[12 * 32];
  uint16_t big[PROBE__BIG * 32];
  size_t nbig;
} probe__hs;

/* Pair indices of the previous accepted block, still to be counted into the
 * four 16-bit pair tables (copy i % 4 for index i). A block function counts
 * them in steps inside its vector loop, so that the scalar increments run
 * alongside the vector work, and finishes them before it returns. */
typedef struct probe__pending {
  const uint32_t *idx;
  size_t n; /* pairs, a multiple of 16 */
  uint16_t *t[4];
  /* The AVX-512 block functions have a second way of counting bins: with
   * win >= 0 they count the non-zero elements whose window value (the raw
   * exponent field: fp16 1..31, fp32/bf16 the binary32 one, 0..255) is
   * win .. win+15 (fp16: win .. win+14, PROBE__WIN16) into *hs (positional
   * popcount of one-hot words; an fp16 window never holds 0), write the
   * other non-zero elements to outb (PROBE__WBLOCK + 32 entries; fp16: the
   * pattern, sign included, fp32/bf16: the window value), count no zeros,
   * and write no pair indices. An fp16 window block's sum covers only the
   * elements inside, and its sum of squares counts every zero as 2^-30 and
   * every subnormal wrongly (stats_avx512.c): the driver corrects both from
   * outb and the zero count. win < 0: pair indices. A path whose
   * blk_ops.bf16_patterns is set (AVX2) treats bf16 window blocks like fp16
   * ones: the window holds 15 values from 1 (never 0, so bf16 subnormals are
   * outside), outb receives the patterns, the sum covers only the elements
   * inside, and the sum of squares counts each zero as 2^-254 and each
   * subnormal wrongly (stats_avx2.c, win_bf16). */
  int win;
  uint16_t *outb;
  probe__hs *hs; /* window mode: the counters of the elements inside */
  /* 1 when the tensor has at least probe__stream_bytes bytes, so that it
   * likely comes from DRAM: a block function may then favour one pass over
   * memory over its speed in cache (AVX2 fp32 window blocks make their sums
   * in the same loop). The statistics are the same but for the rounding of
   * the sums. */
  int stream;
} probe__pending;

/* PROBE__STREAM_BYTES (the size of a large last-level cache), or what a
 * test sets to run the streaming block functions on small tensors. */
#define PROBE__STREAM_BYTES ((size_t)32 << 20)
extern size_t probe__stream_bytes;

/* wc[k] = the number of elements with window value win + k that h holds
 * (stats_avx512.c, stats_avx2.c). */
void probe__hs_count_avx512(const probe__hs *h, uint64_t wc[PROBE__WIN]);
void probe__hs_count_avx2(const probe__hs *h, uint64_t wc[PROBE__WIN]);
/* Folds each complete group of 16 weight-16 vectors of h->s16 into h->hi
 * (and h->big). */
void probe__hs_fold16_avx512(probe__hs *h);
void probe__hs_fold16_avx2(probe__hs *h);

static inline void probe__pending_count(const probe__pending *pd, size_t from, size_t to) {
  uint16_t *t0 = pd->t[0], *t1 = pd->t[1], *t2 = pd->t[2], *t3 = pd->t[3];
  const uint32_t *ix = pd->idx;
  for (size_t i = from; i < to; i += 8) {
    t0[ix[i]]++;
    t1[ix[i + 1]]++;
    t2[ix[i + 2]]++;
    t3[ix[i + 3]]++;
    t0[ix[i + 4]]++;
    t1[ix[i + 5]]++;
    t2[ix[i + 6]]++;
    t3[ix[i + 7]]++;
  }
}

/* Inside a block function's vector loop: count the next k (8 or 16; pn_ is
 * a multiple of 16) pending pairs, if any are left. Uses locals set up by
 * PROBE__PENDING_LOCALS, so the compiler keeps them in registers. */
#define PROBE__PENDING_LOCALS(pd)                                              \
  uint16_t *const pt0_ = (pd)->t[0], *const pt1_ = (pd)->t[1];                 \
  uint16_t *const pt2_ = (pd)->t[2], *const pt3_ = (pd)->t[3];                 \
  const uint32_t *const pix_ = (pd)->idx;                                      \
  const size_t pn_ = (pd)->n;                                                  \
  size_t pj_ = 0
#define PROBE__PENDING_8()                                                     \
  do {                                                                         \
    const uint32_t *ix_ = pix_ + pj_;                                          \
    pt0_[ix_[0]]++;                                                            \
    pt1_[ix_[1]]++;                                                            \
    pt2_[ix_[2]]++;                                                            \
    pt3_[ix_[3]]++;                                                            \
    pt0_[ix_[4]]++;                                                            \
    pt1_[ix_[5]]++;                                                            \
    pt2_[ix_[6]]++;                                                            \
    pt3_[ix_[7]]++;                                                            \
    pj_ += 8;                                                                  \
  } while (0)
#define PROBE__PENDING_STEP(k)                                                 \
  do {                                                                         \
    if (pj_ < pn_) {                                                           \
      PROBE__PENDING_8();                                                      \
      if ((k) == 16) PROBE__PENDING_8();                                       \
    }                                                                          \
  } while (0)
#define PROBE__PENDING_FINISH(pd) probe__pending_count((pd), pj_, pn_)

/* One block: p holds nv groups of 16 elements; writes nv*8 pair indices to
 * idx (fp16: raw exponents e_lo + 66*e_hi; fp32/bf16: bins lo + 66*hi) and
 * counts all of pd's pending pairs. */
typedef void (*probe__blk_fn)(probe__blk *b, uint32_t *idx, const unsigned char *p,
                              size_t nv, const probe__pending *pd);
/* AVX2 block functions (stats_avx2.c); nv must be even. */
void probe__blk_f32_avx2(probe__blk *b, uint32_t *idx, const unsigned char *p, size_t nv,
                         const probe__pending *pd);
void probe__blk_f16_avx2(probe__blk *b, uint32_t *idx, const unsigned char *p, size_t nv,
                         const probe__pending *pd);
void probe__blk_bf16_avx2(probe__blk *b, uint32_t *idx, const unsigned char *p, size_t nv,
                          const probe__pending *pd);
/* AVX-512 block functions (stats_avx512.c); nv must be even. */
void probe__blk_f32_avx512(probe__blk *b, uint32_t *idx, const unsigned char *p, size_t nv,
                           const probe__pending *pd);
void probe__blk_f16_avx512(probe__blk *b, uint32_t *idx, const unsigned char *p, size_t nv,
                           const probe__pending *pd);
void probe__blk_bf16_avx512(probe__blk *b, uint32_t *idx, const unsigned char *p, size_t nv,
                            const probe__pending *pd);

/* Extremes of a block of 16-bit patterns (fp16 or bf16), reduced to scalars
 * (amin: smallest non-zero |x| pattern, UINT16_MAX for none), widened. */
static inline void probe__blk_extremes16(probe__blk *b, int16_t smax, int16_t smin,
                                         uint16_t umax, uint16_t umin, uint16_t amin,
                                         int is_f16) {
#define W16(h) (is_f16 ? probe_f32_bits(probe_f16_to_f32(h)) : (uint32_t)(h) << 16)
  b->smax = (int32_t)W16((uint16_t)smax);
  b->smin = (int32_t)W16((uint16_t)smin);
  b->umax = W16(umax);
  b->umin = W16(umin);
  b->amin_m1 = amin == UINT16_MAX ? UINT32_MAX : W16(amin) - 1u;
#undef W16
}

/* The minima of 16-bit patterns from the maxima, for the loops that keep
 * only smax (signed) and umax (unsigned): with both signs present the
 * minimum value is the largest-magnitude negative (umax) and nothing else
 * is needed (INT16_MAX / UINT16_MAX: none); with one sign it is the pattern
 * of the smallest magnitude of that sign: the zero of that sign if the
 * data has a zero (all of its zeros then carry that sign), else amin (the
 * smallest non-zero |x| pattern) with the sign put on. */
static inline void probe__minima16(int16_t smax, uint16_t umax, uint16_t amin, int has_zero,
                                   int16_t *smin, uint16_t *umin) {
  const int pos = smax >= 0, neg = umax >= 0x8000u;
  *smin = INT16_MAX;
  *umin = UINT16_MAX;
  if (!pos) *smin = (int16_t)(has_zero ? 0x8000u : (amin | 0x8000u));
  if (!neg) *umin = has_zero ? 0 : amin;
}

/* The same for binary32 patterns (the AVX2 short loop's fp32 tensors and
 * fp32 window blocks), over the finite elements only: call it only when
 * there is one. */
static inline void probe__minima32(int32_t smax, uint32_t umax, uint32_t amin, int has_zero,
                                   int32_t *smin, uint32_t *umin) {
  const int pos = smax >= 0, neg = umax >= 0x80000000u;
  *smin = INT32_MAX;
  *umin = UINT32_MAX;
  if (!pos) *smin = (int32_t)(has_zero ? 0x80000000u : (amin | 0x80000000u));
  if (!neg) *umin = has_zero ? 0 : amin;
}

/* What the block driver (stats_block.c) runs for one path: the block
 * function by dtype, the window counters' fold and read-out, the elements
 * per vector step (block lengths are multiples of it; the rest of a tensor
 * goes through the portable routine) and whether window mode is allowed. */
typedef struct probe__blk_ops {
  probe__blk_fn blk[3]; /* by probe_dtype: fp32, fp16, bf16 */
  void (*hs_fold16)(probe__hs *h);
  void (*hs_count)(const probe__hs *h, uint64_t wc[PROBE__WIN]);
  size_t group;
  int window;
  int bf16_patterns; /* bf16 window blocks like fp16 ones (probe__pending.win) */
  /* A block holding inf or NaN is discarded and redone by this, in pieces of
   * at most PROBE__SMALL_MAX_N: the path's short-tensor routine, which masks
   * non-finite lanes (the portable loop took ~3.5 ns an element, 15-60
   * times a clean block, on tensors with a NaN or inf here and there). */
  void (*redo)(probe__acc *a, probe_dtype dt, const void *data, size_t n);
} probe__blk_ops;

/* Whole tensors on the AVX2 path and on the AVX-512 path (stats_block.c);
 * call only when probe__cpu_avx2() / probe__cpu_avx512() say the CPU has
 * them. */
void probe__acc_avx2(probe__acc *a, probe_dtype dt, const void *data, size_t n);
void probe__acc_avx512(probe__acc *a, probe_dtype dt, const void *data, size_t n);
#if defined(__AVX2__)
#include <immintrin.h>
/* stats_avx2.c: the horizontal signed max of smax, unsigned max of umax and
 * the smallest non-zero |x| pattern from aminb (lanes (|x| - 1) ^ 0x8000,
 * signed min; UINT16_MAX: none) of 16-bit lanes. */
void probe__red16_avx2(__m256i smax, __m256i umax, __m256i aminb, int16_t *s, uint16_t *u,
                       uint16_t *amin);
/* The binary32 exponent fields of 16 fp16 |x| patterns (sign cleared) in
 * 16-bit lanes, from the F16C conversion: exact for subnormals too (0 for a
 * zero). The pack permutes the order within each 128-bit half; counting
 * ignores it. (AVX2 pair blocks, the AVX2 short path's exact fp16 bins.) */
static inline __m256i probe__f16_exp32_avx2(__m256i a) {
  return _mm256_packus_epi32(
      _mm256_srli_epi32(_mm256_castps_si256(_mm256_cvtph_ps(_mm256_castsi256_si128(a))), 23),
      _mm256_srli_epi32(_mm256_castps_si256(_mm256_cvtph_ps(_mm256_extracti128_si256(a, 1))), 23));
}
/* stats_avx2.c: f16_flush (0 < |x| <= 2^-25) and the elements with |x| >=
 * 65520, inf and NaN included, of n fp32 or bf16 elements at p (fp16: both
 * 0), added to *flush and *ovf. Called only when the extremes show some:
 * a compare per element in the main loops cost more than this scan. */
void probe__flush_ovf_avx2(probe_dtype dt, const unsigned char *p, size_t n, uint64_t *flush,
                           uint64_t *ovf);
#endif

/* The short-tensor paths, AVX-512 (stats_small.c) and AVX2 (stats_small2.c),
 * for n <= PROBE__SMALL_MAX_N. */
enum { PROBE__SMALL_MAX_N = 4096 };
void probe__acc_small_avx512(probe__acc *a, probe_dtype dt, const void *data, size_t n);
void probe__acc_small_avx2(probe__acc *a, probe_dtype dt, const void *data, size_t n);
int probe__cpu_avx2(void);
int probe__cpu_avx512(void);

/* The paths, for tests and benchmarks that want one in particular. */
enum {
  PROBE__PATH_PORTABLE = 0,
  PROBE__PATH_AVX2 = 1,
  PROBE__PATH_AVX512 = 2,
  PROBE__PATH_SMALL512 = 3, /* stats_small.c; n <= PROBE__SMALL_MAX_N only */
  PROBE__PATH_SMALL2 = 4,   /* stats_small2.c; n <= PROBE__SMALL_MAX_N only */
  PROBE__PATH_COUNT
};
/* Like probe_stats_compute on the given path; PROBE_ERR_UNSUPPORTED when
 * this CPU cannot run it or the path does not take n elements
 * (stats_dispatch.c). */
probe_status probe__stats_compute_path(probe_stats *out, probe_dtype dt,
                                       const void *data, size_t n, int path);
/* "portable", "avx2", "avx512", "small512", "small2"; NULL past the end. */
const char *probe__stats_path_name(int path);
/* The family AMPPROBE_STATS_PATH's value v (NULL: unset) selects on this
 * CPU: 0 portable, 1 avx2, 2 avx512 (stats_dispatch.c; for tests). */
int probe__stats_family_from_env(const char *v);
/* The short-tensor path (PROBE__PATH_*) probe_stats_compute takes for dt in
 * this process, and up to how many elements (*max_n; past it the block
 * path); for benchmarks that print what they ran. */
int probe__stats_short_path(probe_dtype dt, size_t *max_n);

#endif /* AMPPROBE_STATS_IMPL_H */
