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

void probe__acc_portable(probe__acc *a, probe_dtype dt, const void *data,
                         size_t n) {
  a->count += n;
  switch (dt) {
  case PROBE_DTYPE_F32: {
    const unsigned char *p = data;
    for (size_t i = 0; i < n; i++) {
      uint32_t u;
      memcpy(&u, p + 4 * i, 4); /* data may be unaligned */
      acc_one(a, u);
    }
    break;
  }
  case PROBE_DTYPE_F16: {
    const unsigned char *p = data;
    for (size_t i = 0; i < n; i++) {
      uint16_t h;
      memcpy(&h, p + 2 * i, 2);
      acc_one(a, probe_f32_bits(probe_f16_to_f32(h)));
    }
    break;
  }
  case PROBE_DTYPE_BF16: {
    const unsigned char *p = data;
    for (size_t i = 0; i < n; i++) {
      uint16_t h;
      memcpy(&h, p + 2 * i, 2);
      acc_one(a, (uint32_t)h << 16);
    }
    break;
  }
  }
}

void probe__acc_finish(const probe__acc *a, probe_stats *out) {
  probe_stats_init(out);
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
  return s->count - s->nan_count - s->posinf_count - s->neginf_count;
}

uint64_t probe_stats_nonfinite(const probe_stats *s) {
  return s->nan_count + s->posinf_count + s->neginf_count;
}

double probe_stats_mean(const probe_stats *s) {
  uint64_t f = probe_stats_finite(s);
  return f ? s->sum / (double)f : NAN;
}

double probe_stats_rms(const probe_stats *s) {
  uint64_t f = probe_stats_finite(s);
  return f ? sqrt(s->sumsq / (double)f) : NAN;
}

double probe_stats_l2(const probe_stats *s) { return sqrt(s->sumsq); }

/* The one FP16 headroom formula (docs/statistics.md, "Derived values"). */
double probe_fp16_headroom(double absmax) {
  if (isnan(absmax) || absmax < 0) return NAN; /* none finite, or not a magnitude */
  if (absmax == 0) return INFINITY;            /* all zeros: any scale fits */
  if (isinf(absmax)) return -INFINITY;         /* already overflowed */
  return log2((double)PROBE_F16_MAX / absmax);
}

double probe_stats_headroom(const probe_stats *s) { return probe_fp16_headroom(s->absmax); }

double probe_stats_frac_below_exp(const probe_stats *s, int e) {
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
  probe__acc a;
  probe__acc_init(&a);
  probe__acc_portable(&a, dt, data, n);
  probe__acc_finish(&a, out);
  return PROBE_OK;
}
