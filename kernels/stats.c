/*
 * stats.c - the fused one-pass statistics record on host memory: the
 * portable path, run-time dispatch to the AVX2 path (stats_avx2.c), the
 * record's identity, merge and derived values.
 *
 * Every element is widened to its exact binary32 value first (fp16 and bf16
 * convert exactly), so all three dtypes share one definition of every field
 * (docs/statistics.md). Extremes are tracked as integer reductions over the
 * binary32 bits (see stats_impl.h), which makes -0 < +0 and the result
 * independent of the order elements are visited in.
 */
#include <math.h>
#include <stdatomic.h>
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

double probe_stats_headroom(const probe_stats *s) {
  if (isnan(s->absmax)) return NAN;
  if (s->absmax == 0.0f) return INFINITY;
  return log2(65504.0 / (double)s->absmax);
}

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

/* Compiled without -mavx2, so that this test itself runs on any x86-64. */
int probe__cpu_avx2(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c") &&
         __builtin_cpu_supports("fma");
#else
  return 0;
#endif
}

int probe__cpu_avx512(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  return probe__cpu_avx2() && __builtin_cpu_supports("avx512f") &&
         __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
         __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vbmi2") &&
         __builtin_cpu_supports("avx512vnni");
#else
  return 0;
#endif
}

/* The path probe_stats_compute takes: the widest this CPU has. Threads
 * racing to set it all store the same value. */
static atomic_int best_path = -1;

static int stats_path(void) {
  int p = atomic_load_explicit(&best_path, memory_order_relaxed);
  if (p < 0) {
    p = probe__cpu_avx512() ? PROBE__PATH_AVX512
        : probe__cpu_avx2() ? PROBE__PATH_AVX2
                            : PROBE__PATH_PORTABLE;
    atomic_store_explicit(&best_path, p, memory_order_relaxed);
  }
  return p;
}

int probe_stats_have_simd(void) { return stats_path() != PROBE__PATH_PORTABLE; }

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

probe_status probe__stats_compute_path(probe_stats *out, probe_dtype dt,
                                       const void *data, size_t n, int path) {
  if (!out || probe_dtype_size(dt) == 0 || (n && !data))
    return PROBE_ERR_INVALID_ARG;
  probe__acc a;
  probe__acc_init(&a);
  switch (path) {
  case PROBE__PATH_PORTABLE:
    probe__acc_portable(&a, dt, data, n);
    break;
  case PROBE__PATH_AVX2:
    if (!probe__cpu_avx2()) return PROBE_ERR_UNSUPPORTED;
    probe__acc_avx2(&a, dt, data, n);
    break;
  case PROBE__PATH_AVX512:
    if (!probe__cpu_avx512()) return PROBE_ERR_UNSUPPORTED;
    probe__acc_avx512(&a, dt, data, n);
    break;
  case PROBE__PATH_SMALL512:
    if (!probe__cpu_avx512()) return PROBE_ERR_UNSUPPORTED;
    if (n > PROBE__SMALL_MAX_N) return PROBE_ERR_UNSUPPORTED;
    probe__acc_small_avx512(&a, dt, data, n);
    break;
  default:
    return PROBE_ERR_INVALID_ARG;
  }
  probe__acc_finish(&a, out);
  return PROBE_OK;
}

/* Below these lengths a narrower path is faster: the block paths pay a
 * fixed set-up (histogram tables, the AVX-512 exponent window) of roughly
 * 0.2 us (AVX2) and 0.65 us (AVX-512) per call, while the portable loop
 * costs about 2 ns per element and the short-tensor AVX-512 path
 * (stats_small.c) about 0.06 us plus 0.25-0.3 ns per element. Measured on
 * the project machine (Zen 5; bench/results/stats.md, "Short tensors"):
 * the two AVX-512 paths cost the same at about 3000 fp32, 2048 fp16 (693
 * against 691 ns) and 2900 bf16 elements (2560: 938 against 856 ns; 3072:
 * 980 against 1003). Trainer tensors are mostly 32..1024 elements. */
#define STATS_MIN_N_AVX2 112
#define STATS_MAX_N_SMALL_F32 3072
#define STATS_MAX_N_SMALL_F16 2048
#define STATS_MAX_N_SMALL_BF16 2560

probe_status probe_stats_compute(probe_stats *out, probe_dtype dt,
                                 const void *data, size_t n) {
  int path = stats_path();
  if (path == PROBE__PATH_AVX512 &&
      n <= (dt == PROBE_DTYPE_F32   ? STATS_MAX_N_SMALL_F32
            : dt == PROBE_DTYPE_F16 ? STATS_MAX_N_SMALL_F16
                                    : STATS_MAX_N_SMALL_BF16))
    path = PROBE__PATH_SMALL512;
  if (path == PROBE__PATH_AVX2 && n < STATS_MIN_N_AVX2)
    path = PROBE__PATH_PORTABLE;
  return probe__stats_compute_path(out, dt, data, n, path);
}
