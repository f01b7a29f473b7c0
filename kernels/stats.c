/*
 * stats.c - the fused one-pass statistics record on host memory: the
 * portable path, the record's identity, merge and derived values (which
 * path probe_stats_compute takes is stats_dispatch.c's).
 *
 * Every element is widened to its exact binary32 value first (fp16 and bf16
 * convert exactly), so all three dtypes share one definition of every field
 * (docs/statistics.md). Extremes are tracked as integer reductions over the
 * binary32 bits (see stats_impl.h), which makes -0 < +0 and the result
 * independent of the order elements are visited in.
 */
#include <math.h>
#include <stdint.h>

#include "stats_impl.h"

/* ---- accumulator ------------------------------------------------------------ */

void probe__acc_init(probe__acc *a) {
  memset(a, 0, sizeof *a);
  a->smax = INT32_MIN;
  a->smin = INT32_MAX;
  a->umax = 0;
  a->umin = UINT32_MAX;
  a->amin_m1 = UINT32_MAX;
}

void probe__acc_extremes(probe__acc *a, int32_t smax, int32_t smin,
                         uint32_t umax, uint32_t umin, uint32_t amin_m1) {
  if (smax > a->smax) a->smax = smax;
  if (smin < a->smin) a->smin = smin;
  if (umax > a->umax) a->umax = umax;
  if (umin < a->umin) a->umin = umin;
  if (amin_m1 < a->amin_m1) a->amin_m1 = amin_m1;
}

/* One element, given as exact binary32 bits. */
static inline void acc_one(probe__acc *a, uint32_t u) {
  uint32_t ab = u & 0x7fffffffu;
  if (ab >= 0x7f800000u) {
    if (ab > 0x7f800000u)
      a->nan++;
    else if (u >> 31)
      a->neginf++;
    else
      a->posinf++;
    return;
  }
  int32_t s = (int32_t)u;
  if (s > a->smax) a->smax = s;
  if (s < a->smin) a->smin = s;
  if (u > a->umax) a->umax = u;
  if (u < a->umin) a->umin = u;
  if (ab == 0) {
    a->zero++;
    return; /* adds nothing to sum, sumsq, histogram */
  }
  if (ab - 1u < a->amin_m1) a->amin_m1 = ab - 1u;
  if (ab < 0x38800000u) a->sub++;   /* |x| < 2^-14 */
  if (ab <= 0x33000000u) a->flush++; /* |x| <= 2^-25 */
  if (ab >= 0x477ff000u) a->ovf++;   /* |x| >= 65520 */
  a->hist[probe__hist_bin(ab)]++;
  double d = (double)probe_f32_from_bits(u);
  a->sum += d;
  a->sumsq += d * d;
}

/* ---- the portable loop --------------------------------------------------------- */

/* Elements per chunk: each chunk is first checked for inf and NaN (a max
 * over its magnitudes); a finite one runs the loop below, one with inf or
 * NaN acc_one per element. */
enum { PCHUNK = 256, NB = PROBE_HIST_BINS };

/* A finite binary16 pattern as exact binary32 bits, without branches (the
 * loop below takes finite chunks only; a chunk with zeros mixed in made
 * probe_f16_to_f32's branches miss): a normal value is its exponent and
 * significand moved up and rebiased; a zero or subnormal, man * 2^-24, is
 * (2^-14 + man * 2^-24) - 2^-14 in binary32, exactly. */
static inline uint32_t f16_finite_bits(uint16_t h) {
  uint32_t o = (uint32_t)(h & 0x7fffu) << 13;
  uint32_t sub = probe_f32_bits(probe_f32_from_bits(o + 0x38800000u) - 0x1p-14f);
  /* a mask, not ?: (which compilers turn into a branch) */
  uint32_t normal = 0u - (uint32_t)((o & 0x0f800000u) != 0);
  return ((o + 0x38000000u) & normal) | (sub & ~normal) | (uint32_t)(h & 0x8000u) << 16;
}

/* Element i at p (dtype dt) as exact binary32 bits; fp16: finite only. */
static inline uint32_t load_bits(probe_dtype dt, const unsigned char *p, size_t i) {
  uint16_t h;
  uint32_t u;
  switch (dt) {
  case PROBE_DTYPE_F16:
    memcpy(&h, p + 2 * i, 2);
    return f16_finite_bits(h);
  case PROBE_DTYPE_BF16:
    memcpy(&h, p + 2 * i, 2);
    return (uint32_t)h << 16;
  default:
    memcpy(&u, p + 4 * i, 4); /* data may be unaligned */
    return u;
  }
}

/* The same for any element, inf and NaN included (for acc_one). */
static inline uint32_t load_any_bits(probe_dtype dt, const unsigned char *p, size_t i) {
  uint16_t h;
  if (dt != PROBE_DTYPE_F16) return load_bits(dt, p, i);
  memcpy(&h, p + 2 * i, 2);
  return probe_f32_bits(probe_f16_to_f32(h));
}

/* 1 when the n elements at p are all finite: the largest magnitude pattern
 * (a 16-bit one in the top half of a word) below that of inf. */
static inline int chunk_finite(probe_dtype dt, const unsigned char *p, size_t n) {
  const uint32_t inf = dt == PROBE_DTYPE_F16 ? 0x7c000000u : 0x7f800000u;
  uint32_t m = 0;
  for (size_t i = 0; i < n; i++) {
    uint32_t u;
    uint16_t h;
    if (dt == PROBE_DTYPE_F32) {
      memcpy(&u, p + 4 * i, 4);
    } else {
      memcpy(&h, p + 2 * i, 2);
      u = (uint32_t)h << 16;
    }
    u &= 0x7fffffffu;
    m = u > m ? u : m;
  }
  return m < inf;
}

/* The running values of the finite chunks, kept apart from the
 * accumulator (which the chunks with inf or NaN update one element at a
 * time). hist: four copies (element i counts into copy i % 4, so that
 * neighbours in one bin do not wait on each other's increment). The
 * minima, f16_subnormal and most of f16_flush/f16_overflow are not tracked
 * per element but derived at the end (port_loop). */
typedef struct port_run {
  int32_t smax;
  uint32_t umax, amin_m1;
  uint64_t flush_edge, ovf_edge; /* elements exactly 2^-25, in [65520, 2^16) */
  uint64_t zeros;                /* (counted in bin 0 of hist as well) */
  uint64_t hist[4][NB];
} port_run;

/* Bins wholly inside f16_flush (|x| < 2^-25) and f16_overflow (|x| >=
 * 2^16), and the bins that hold their edges, 2^-25 and 65520. */
enum { FLUSH_BINS = -25 - PROBE_HIST_MIN_EXP + 1, OVF_EDGE_BIN = 15 - PROBE_HIST_MIN_EXP + 1 };

/* Bin b of r, its four copies together. */
static inline uint64_t run_bin(const port_run *r, int b) {
  return (r->hist[0][b] + r->hist[1][b]) + (r->hist[2][b] + r->hist[3][b]);
}

/* n finite elements at p into r and a's sums, without a branch per
 * element: zeros count into bin 0 (and zeros) and add +0 to the sums; the
 * smallest magnitude is the min of |x| - 1, where a zero wraps to the
 * largest; the sums in four pairs of accumulators. */
static inline __attribute__((always_inline)) void run_finite(probe__acc *a, port_run *r,
                                                           probe_dtype dt,
                                                           const unsigned char *p, size_t n) {
  int32_t smax = r->smax;
  uint32_t umax = r->umax, am1 = r->amin_m1;
  uint64_t zeros = 0;
  double s[4] = {0, 0, 0, 0}, q[4] = {0, 0, 0, 0};
  const uint64_t flush_edge = run_bin(r, FLUSH_BINS), ovf_edge = run_bin(r, OVF_EDGE_BIN);
#define PORT_ELEM(k, i)                                                         \
  do {                                                                          \
    uint32_t u = load_bits(dt, p, (i));                                         \
    uint32_t ab = u & 0x7fffffffu;                                              \
    int32_t si = (int32_t)u;                                                    \
    smax = si > smax ? si : smax;                                               \
    umax = u > umax ? u : umax;                                                 \
    uint32_t m1 = ab - 1u; /* zero: UINT32_MAX */                               \
    am1 = m1 < am1 ? m1 : am1;                                                  \
    int b = (int)(ab >> 23) - (127 + PROBE_HIST_MIN_EXP - 1);                    \
    b = b < 0 ? 0 : b;                                                          \
    b = b > NB - 1 ? NB - 1 : b;                                                \
    r->hist[k][b]++; /* a zero too, in bin 0: taken out at the end */          \
    zeros += ab == 0;                                                           \
    double d = (double)probe_f32_from_bits(u);                                  \
    s[k] += d;                                                                  \
    q[k] += d * d;                                                              \
  } while (0)
  size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    PORT_ELEM(0, i);
    PORT_ELEM(1, i + 1);
    PORT_ELEM(2, i + 2);
    PORT_ELEM(3, i + 3);
  }
  for (; i < n; i++) PORT_ELEM(0, i);
#undef PORT_ELEM
  r->smax = smax;
  r->umax = umax;
  r->amin_m1 = am1;
  r->zeros += zeros;
  a->sum += (s[0] + s[1]) + (s[2] + s[3]);
  a->sumsq += (q[0] + q[1]) + (q[2] + q[3]);
  /* The two edge bins hold values on both sides of f16_flush's and
   * f16_overflow's bounds: when the chunk added to one, count the chunk's
   * elements of exactly 2^-25 and of 65520 <= |x| < 2^16 (rare: tensors
   * with values there). */
  if (run_bin(r, FLUSH_BINS) != flush_edge || run_bin(r, OVF_EDGE_BIN) != ovf_edge)
    for (size_t j = 0; j < n; j++) {
      uint32_t ab = load_bits(dt, p, j) & 0x7fffffffu;
      r->flush_edge += ab == 0x33000000u;
      r->ovf_edge += ab >= 0x477ff000u && ab < 0x47800000u;
    }
}

static inline __attribute__((always_inline)) void port_loop(probe__acc *a, probe_dtype dt,
                                                          const unsigned char *p, size_t n) {
  port_run r;
  memset(&r, 0, sizeof r);
  r.smax = INT32_MIN;
  r.amin_m1 = UINT32_MAX;
  const size_t es = probe_dtype_size(dt);
  for (size_t i = 0; i < n; i += PCHUNK) {
    size_t k = n - i < PCHUNK ? n - i : PCHUNK;
    const unsigned char *q = p + i * es;
    if (chunk_finite(dt, q, k))
      run_finite(a, &r, dt, q, k);
    else /* inf or NaN: one at a time, on a itself */
      for (size_t j = 0; j < k; j++) acc_one(a, load_any_bits(dt, q, j));
  }
  /* the bins present lie between those of the smallest and the largest
   * non-zero magnitude (binary32 bits: amin_m1 + 1; the larger of the
   * largest positive and largest negative pattern) */
  uint32_t amax = r.smax > 0 ? (uint32_t)r.smax : 0;
  if (r.umax >= 0x80000000u && (r.umax & 0x7fffffffu) > amax) amax = r.umax & 0x7fffffffu;
  uint64_t nonzero = 0;
  if (amax) {
    const int lo = probe__hist_bin(r.amin_m1 + 1u), hi = probe__hist_bin(amax);
    for (int b = lo; b <= hi; b++) {
      uint64_t h = run_bin(&r, b);
      if (b == 0) h -= r.zeros;
      a->hist[b] += h;
      nonzero += h;
      a->sub += b < PROBE__SUB_BINS ? h : 0;
      a->flush += b < FLUSH_BINS ? h : 0;
      a->ovf += b > OVF_EDGE_BIN ? h : 0;
    }
  }
  a->zero += r.zeros;
  a->flush += r.flush_edge;
  a->ovf += r.ovf_edge;
  if (nonzero + r.zeros) { /* the finite chunks' extremes; their minima follow */
    int32_t smin;
    uint32_t umin;
    probe__minima32(r.smax, r.umax, r.amin_m1 + 1u, r.zeros > 0, &smin, &umin);
    probe__acc_extremes(a, r.smax, smin, r.umax, umin, r.amin_m1);
  }
}

void probe__acc_portable(probe__acc *a, probe_dtype dt, const void *data, size_t n) {
  a->count += n;
  switch (dt) { /* one copy of the loop per dtype */
  case PROBE_DTYPE_F32:
    port_loop(a, PROBE_DTYPE_F32, data, n);
    break;
  case PROBE_DTYPE_F16:
    port_loop(a, PROBE_DTYPE_F16, data, n);
    break;
  case PROBE_DTYPE_BF16:
    port_loop(a, PROBE_DTYPE_BF16, data, n);
    break;
  }
}

void probe__acc_finish(const probe__acc *a, probe_stats *out) {
  /* every field is written below (not probe_stats_init's memset first: on
   * a trainer's short tensors that and the copy of hist were a fifth of
   * the statistics' time) */
  out->min = out->max = out->absmax = out->absmin_nonzero = NAN;
  out->count = a->count;
  out->nan_count = a->nan;
  out->posinf_count = a->posinf;
  out->neginf_count = a->neginf;
  out->zero_count = a->zero;
  out->f16_subnormal = a->sub;
  out->f16_flush = a->flush;
  out->f16_overflow = a->ovf;
  out->sum = a->sum;
  out->sumsq = a->sumsq;
  memcpy(out->hist, a->hist, sizeof out->hist);
  if (a->count - a->nan - a->posinf - a->neginf == 0) return; /* extremes NaN */
  int has_pos = a->smax >= 0;        /* some finite value has sign 0 */
  int has_neg = a->umax >= 0x80000000u; /* some finite value has sign 1 */
  uint32_t maxb = has_pos ? (uint32_t)a->smax : (uint32_t)a->smin;
  uint32_t minb = has_neg ? a->umax : a->umin;
  uint32_t amax = 0;
  if (has_pos) amax = (uint32_t)a->smax;
  if (has_neg && (a->umax & 0x7fffffffu) > amax) amax = a->umax & 0x7fffffffu;
  out->max = probe_f32_from_bits(maxb);
  out->min = probe_f32_from_bits(minb);
  out->absmax = probe_f32_from_bits(amax);
  if (a->amin_m1 != UINT32_MAX)
    out->absmin_nonzero = probe_f32_from_bits(a->amin_m1 + 1u);
}

/* ---- public API --------------------------------------------------------------- */

void probe_stats_init(probe_stats *s) {
  if (!s) return;
  memset(s, 0, sizeof *s);
  s->min = NAN;
  s->max = NAN;
  s->absmax = NAN;
  s->absmin_nonzero = NAN;
}

/* Total order on floats restricted to non-NaN values: -0 < +0. */
static int32_t order_key(float f) {
  uint32_t u = probe_f32_bits(f);
  return (int32_t)((u >> 31) ? (u ^ 0x7fffffffu) : u);
}

void probe_stats_merge(probe_stats *dst, const probe_stats *src) {
  if (!dst || !src) return;
  dst->count += src->count;
  dst->nan_count += src->nan_count;
  dst->posinf_count += src->posinf_count;
  dst->neginf_count += src->neginf_count;
  dst->zero_count += src->zero_count;
  dst->f16_subnormal += src->f16_subnormal;
  dst->f16_flush += src->f16_flush;
  dst->f16_overflow += src->f16_overflow;
  if (!isnan(src->min) && (isnan(dst->min) || order_key(src->min) < order_key(dst->min)))
    dst->min = src->min;
  if (!isnan(src->max) && (isnan(dst->max) || order_key(src->max) > order_key(dst->max)))
    dst->max = src->max;
  if (!isnan(src->absmax) && (isnan(dst->absmax) || src->absmax > dst->absmax))
    dst->absmax = src->absmax;
  if (!isnan(src->absmin_nonzero) &&
      (isnan(dst->absmin_nonzero) || src->absmin_nonzero < dst->absmin_nonzero))
    dst->absmin_nonzero = src->absmin_nonzero;
  dst->sum += src->sum;
  dst->sumsq += src->sumsq;
  for (int i = 0; i < PROBE_HIST_BINS; i++) dst->hist[i] += src->hist[i];
}

uint64_t probe_stats_finite(const probe_stats *s) {
  if (!s) return 0;
  return s->count - s->nan_count - s->posinf_count - s->neginf_count;
}

uint64_t probe_stats_nonfinite(const probe_stats *s) {
  if (!s) return 0;
  return s->nan_count + s->posinf_count + s->neginf_count;
}

double probe_stats_mean(const probe_stats *s) {
  if (!s) return NAN;
  uint64_t f = probe_stats_finite(s);
  return f ? s->sum / (double)f : NAN;
}

double probe_stats_rms(const probe_stats *s) {
  if (!s) return NAN;
  uint64_t f = probe_stats_finite(s);
  return f ? sqrt(s->sumsq / (double)f) : NAN;
}

double probe_stats_l2(const probe_stats *s) { return s ? sqrt(s->sumsq) : NAN; }

/* The one FP16 headroom formula (docs/statistics.md, "Derived values"). */
double probe_fp16_headroom(double absmax) {
  if (isnan(absmax) || absmax < 0) return NAN; /* none finite, or not a magnitude */
  if (absmax == 0) return INFINITY;            /* all zeros: any scale fits */
  if (isinf(absmax)) return -INFINITY;         /* already overflowed */
  return log2((double)PROBE_F16_MAX / absmax);
}

double probe_stats_headroom(const probe_stats *s) {
  return s ? probe_fp16_headroom(s->absmax) : NAN;
}

double probe_stats_frac_below_exp(const probe_stats *s, int e) {
  if (!s) return NAN;
  uint64_t total = 0, below = 0;
  for (int i = 0; i < PROBE_HIST_BINS; i++) total += s->hist[i];
  /* Bin 0 holds exponents below PROBE_HIST_MIN_EXP, bin i (1..BINS-2) the
   * exponent PROBE_HIST_MIN_EXP + i - 1, the last bin those above
   * PROBE_HIST_MAX_EXP; so the answer is exact for MIN_EXP <= e <= MAX_EXP+1
   * and not known outside that range. */
  if (total == 0 || e < PROBE_HIST_MIN_EXP || e > PROBE_HIST_MAX_EXP + 1)
    return NAN;
  for (int i = 0; i <= e - PROBE_HIST_MIN_EXP; i++) below += s->hist[i];
  return (double)below / (double)total;
}

probe_status probe_stats_compute_portable(probe_stats *out, probe_dtype dt,
                                          const void *data, size_t n) {
  if (!out || probe_dtype_size(dt) == 0 || (n && !data))
    return PROBE_ERR_INVALID_ARG;
  unsigned fp = dt == PROBE_DTYPE_F16 ? 0 : probe__fp_exact_enter();
  probe__acc a;
  probe__acc_init(&a);
  probe__acc_portable(&a, dt, data, n);
  probe__acc_finish(&a, out);
  probe__fp_exact_leave(fp);
  return PROBE_OK;
}
