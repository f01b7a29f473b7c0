/*
 * ampprobe/numerics.h - the numerics library (kernels/): bit-exact FP16/BF16
 * conversion and the fused one-pass tensor statistics record.
 *
 * Conversions are static inline and usable from host C and CUDA device code
 * (PROBE_HD). Every statistic is defined exactly in docs/statistics.md; the
 * comments here are a summary of those definitions.
 */
#ifndef AMPPROBE_NUMERICS_H
#define AMPPROBE_NUMERICS_H

#include "ampprobe/export.h"

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "ampprobe/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__CUDACC__)
#define PROBE_HD __host__ __device__ __forceinline__
#else
#define PROBE_HD static inline
#endif

/* ---- element types -------------------------------------------------------- */

typedef enum probe_dtype {
  PROBE_DTYPE_F32 = 0,  /* IEEE binary32 */
  PROBE_DTYPE_F16 = 1,  /* IEEE binary16 */
  PROBE_DTYPE_BF16 = 2, /* bfloat16 (upper half of a binary32) */
} probe_dtype;

/* "fp32", "fp16", "bf16"; NULL for an unknown value. */
AMPPROBE_API
const char *probe_dtype_name(probe_dtype dt);
/* Bytes per element: 4, 2, 2; 0 for an unknown value. */
AMPPROBE_API
size_t probe_dtype_size(probe_dtype dt);

/* ---- FP16 limits ---------------------------------------------------------- */

#define PROBE_F16_MAX 65504.0f              /* largest finite binary16 */
#define PROBE_F16_OVERFLOW 65520.0f         /* |x| >= this rounds to inf */
#define PROBE_F16_MIN_NORMAL 6.103515625e-05f /* 2^-14 */
#define PROBE_F16_MIN_SUBNORMAL 5.9604644775390625e-08f /* 2^-24 */
#define PROBE_F16_FLUSH 2.98023223876953125e-08f /* 2^-25: |x| <= this -> 0 */

/* ---- bit-exact conversion (round to nearest even, subnormals kept) -------- */

PROBE_HD uint32_t probe_f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

PROBE_HD float probe_f32_from_bits(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* binary16 -> binary32; exact for every one of the 65,536 inputs. */
PROBE_HD float probe_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t man = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0x1fu) { /* inf or NaN: keep payload, force quiet bit like F16C */
    bits = sign | 0x7f800000u | (man << 13) | (man ? 0x00400000u : 0u);
  } else if (exp != 0) { /* normal */
    bits = sign | ((exp + 112u) << 23) | (man << 13);
  } else if (man == 0) { /* +-0 */
    bits = sign;
  } else { /* subnormal: man * 2^-24, a normal binary32, exactly (no loop:
             * tensors of underflowed values are all subnormals). 2^-24 as
             * its exact decimal: a hexadecimal float literal is not C++
             * before C++17. */
    bits = sign | probe_f32_bits((float)man * 5.9604644775390625e-08f);
  }
  return probe_f32_from_bits(bits);
}

/* binary32 -> binary16, round to nearest even; overflow -> inf; NaN stays
 * NaN (quiet, top payload bits kept, as vcvtps2ph does). */
PROBE_HD uint16_t probe_f32_to_f16(float f) {
  uint32_t x = probe_f32_bits(f);
  uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
  uint32_t ax = x & 0x7fffffffu;
  if (ax >= 0x7f800000u) { /* inf or NaN */
    if (ax == 0x7f800000u) return (uint16_t)(sign | 0x7c00u);
    return (uint16_t)(sign | 0x7e00u | ((ax >> 13) & 0x3ffu));
  }
  if (ax >= 0x477ff000u) /* >= 65520: rounds to inf */
    return (uint16_t)(sign | 0x7c00u);
  if (ax >= 0x38800000u) { /* normal binary16 range (>= 2^-14) */
    uint32_t r = ax + 0xfffu + ((ax >> 13) & 1u) - 0x38000000u;
    return (uint16_t)(sign | (r >> 13));
  }
  if (ax > 0x33000000u) { /* subnormal result: 2^-25 < |x| < 2^-14 */
    uint32_t e = ax >> 23;
    uint32_t m = (ax & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126u - e; /* 14..24 */
    uint32_t half = 1u << (shift - 1);
    uint32_t rem = m & ((1u << shift) - 1u);
    uint32_t q = m >> shift;
    if (rem > half || (rem == half && (q & 1u))) q++;
    return (uint16_t)(sign | q);
  }
  return sign; /* |x| <= 2^-25 rounds to zero */
}

/* Round a float through binary16 and back: what an FP16 tensor stores. */
PROBE_HD float probe_round_f16(float f) {
  return probe_f16_to_f32(probe_f32_to_f16(f));
}

/* bfloat16 -> binary32: exact. */
PROBE_HD float probe_bf16_to_f32(uint16_t b) {
  return probe_f32_from_bits((uint32_t)b << 16);
}

/* binary32 -> bfloat16, round to nearest even; NaN stays NaN (quiet). */
PROBE_HD uint16_t probe_f32_to_bf16(float f) {
  uint32_t x = probe_f32_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u)
    return (uint16_t)((x >> 16) | 0x0040u);
  x += 0x7fffu + ((x >> 16) & 1u);
  return (uint16_t)(x >> 16);
}

PROBE_HD float probe_round_bf16(float f) {
  return probe_bf16_to_f32(probe_f32_to_bf16(f));
}

/* Bulk conversions on host arrays (vectorised where the CPU allows). */
AMPPROBE_API
void probe_f32_to_f16_array(uint16_t *out, const float *in, size_t n);
AMPPROBE_API
void probe_f16_to_f32_array(float *out, const uint16_t *in, size_t n);
AMPPROBE_API
void probe_f32_to_bf16_array(uint16_t *out, const float *in, size_t n);
AMPPROBE_API
void probe_bf16_to_f32_array(float *out, const uint16_t *in, size_t n);

/* ---- the statistics record ------------------------------------------------ */

/* Histogram of floor(log2|x|) over finite non-zero x: bin 0 counts exponents
 * below PROBE_HIST_MIN_EXP, bins 1..PROBE_HIST_BINS-2 count exponents
 * PROBE_HIST_MIN_EXP .. PROBE_HIST_MAX_EXP one each, the last bin counts
 * exponents above PROBE_HIST_MAX_EXP. */
#define PROBE_HIST_MIN_EXP (-32)
#define PROBE_HIST_MAX_EXP 31
#define PROBE_HIST_BINS (PROBE_HIST_MAX_EXP - PROBE_HIST_MIN_EXP + 3) /* 66 */

/* One record summarises one tensor. Counts are exact; see
 * docs/statistics.md for how each treats NaN, +-inf, -0 and subnormals. */
typedef struct probe_stats {
  uint64_t count;          /* elements */
  uint64_t nan_count;      /* NaN (any payload, either sign) */
  uint64_t posinf_count;   /* +inf */
  uint64_t neginf_count;   /* -inf */
  uint64_t zero_count;     /* +0 and -0 */
  uint64_t f16_subnormal;  /* finite, 0 < |x| < 2^-14 */
  uint64_t f16_flush;      /* finite, 0 < |x| <= 2^-25 (rounds to 0) */
  uint64_t f16_overflow;   /* finite, |x| >= 65520 (rounds to inf) */
  float min;               /* smallest finite value; NaN if none finite */
  float max;               /* largest finite value; NaN if none finite */
  float absmax;            /* largest finite |x|; NaN if none finite */
  float absmin_nonzero;    /* smallest finite non-zero |x|; NaN if none */
  double sum;              /* sum of finite values, accumulated in double */
  double sumsq;            /* sum of squares of finite values, in double */
  uint64_t hist[PROBE_HIST_BINS];
} probe_stats;

/* The identity record (count 0, extremes NaN): merging it changes nothing. */
AMPPROBE_API
void probe_stats_init(probe_stats *s);

/* dst = dst (+) src. Associative and commutative: counts, extremes and the
 * histogram exactly; sum and sumsq up to double rounding. */
AMPPROBE_API
void probe_stats_merge(probe_stats *dst, const probe_stats *src);

/* Derived values (documented in docs/statistics.md). A NULL record gives
 * 0 for the counts and NaN for the others (init and merge do nothing). */
AMPPROBE_API
uint64_t probe_stats_finite(const probe_stats *s);   /* count - nan - inf */
AMPPROBE_API
uint64_t probe_stats_nonfinite(const probe_stats *s); /* nan + both infs */
AMPPROBE_API
double probe_stats_mean(const probe_stats *s);   /* sum / finite */
AMPPROBE_API
double probe_stats_rms(const probe_stats *s);    /* sqrt(sumsq / finite) */
AMPPROBE_API
double probe_stats_l2(const probe_stats *s);     /* sqrt(sumsq) */
/* FP16 headroom of a magnitude: log2(PROBE_F16_MAX / absmax), the binades
 * a tensor whose largest |x| is absmax can grow before FP16 overflows.
 * 0 at absmax = 65504, negative above it; +inf for absmax = 0; -inf for
 * absmax = +inf; NaN for NaN (nothing finite) or a negative argument. The
 * one copy of this formula: every part of ampprobe calls it. */
AMPPROBE_API double probe_fp16_headroom(double absmax);
/* probe_fp16_headroom(s->absmax) (absmax is NaN when nothing is finite). */
AMPPROBE_API
double probe_stats_headroom(const probe_stats *s);
/* Fraction of finite non-zero values whose exponent floor(log2|x|) < e. */
AMPPROBE_API
double probe_stats_frac_below_exp(const probe_stats *s, int e);

/* Fused one-pass statistics on host memory. `data` may be unaligned; n may be
 * 0. Chooses the AVX-512 or AVX2/F16C path at run time when the CPU has it. */
AMPPROBE_API
probe_status probe_stats_compute(probe_stats *out, probe_dtype dt,
                                 const void *data, size_t n);
/* The portable scalar path, always available (the reference for tests). */
AMPPROBE_API
probe_status probe_stats_compute_portable(probe_stats *out, probe_dtype dt,
                                          const void *data, size_t n);
/* 1 when the vectorised path is in use on this CPU. */
AMPPROBE_API
int probe_stats_have_simd(void);
/* The CPU path family probe_stats_compute uses in this process: "avx512",
 * "avx2" or "portable". Chosen once, at the first call, as the widest the
 * CPU has, or the widest at most the one the environment variable
 * AMPPROBE_STATS_PATH names ("avx512", "avx2", "portable"; anything else:
 * the widest); docs/statistics.md. */
AMPPROBE_API const char *probe_stats_path(void);

/* ---- CUDA statistics (kernels/stats_cuda.cu) ------------------------------ */

/* Opaque context holding a stream, device scratch and pinned host results. */
typedef struct probe_cuda_stats probe_cuda_stats;

/* One tensor of a multi-tensor launch. `data` is device memory. */
typedef struct probe_cuda_tensor {
  const void *data;
  size_t n;
  probe_dtype dtype;
} probe_cuda_tensor;

/* 1 when this build has CUDA and a device is usable. */
AMPPROBE_API
int probe_cuda_available(void);

/* stream is a cudaStream_t (void * here to keep CUDA out of this header);
 * NULL uses a stream the context creates. max_tensors bounds one launch. */
AMPPROBE_API
probe_status probe_cuda_stats_create(probe_cuda_stats **out, void *stream,
                                     size_t max_tensors);
AMPPROBE_API
void probe_cuda_stats_destroy(probe_cuda_stats *ctx);

/* Enqueue statistics of `count` device tensors; no host synchronisation.
 * Results land in `out` (which must stay valid) once probe_cuda_stats_wait
 * returns. Returns PROBE_ERR_UNSUPPORTED in builds without CUDA. */
AMPPROBE_API
probe_status probe_cuda_stats_enqueue(probe_cuda_stats *ctx,
                                      const probe_cuda_tensor *tensors,
                                      size_t count, probe_stats *out);
/* Blocks until every enqueued batch has landed in its host records. */
AMPPROBE_API
probe_status probe_cuda_stats_wait(probe_cuda_stats *ctx);

/* 1 when ptr is CUDA device (or managed) memory; 0 for host or no CUDA. */
AMPPROBE_API
int probe_cuda_is_device_ptr(const void *ptr);

/* The last CUDA failure in this thread as "file:line: call: CUDA message"
 * (set when a call above returns PROBE_ERR_CUDA or PROBE_ERR_NO_DEVICE, or
 * probe_cuda_available finds no device); "" when none; "built without CUDA"
 * in builds without CUDA. Never NULL. */
AMPPROBE_API
const char *probe_cuda_last_error(void);

#ifdef __cplusplus
}
#endif
#endif /* AMPPROBE_NUMERICS_H */
