/*
 * half.c - bulk FP16/BF16 <-> FP32 conversion on host arrays, and the dtype
 * helpers (probe_dtype_name / probe_dtype_size).
 *
 * The scalar conversions are the bit-exact inline functions of
 * ampprobe/numerics.h. Binary16 arrays use the CPU's F16C unit
 * (vcvtps2ph / vcvtph2ps, round to nearest even) when __builtin_cpu_supports
 * says it is there, chosen once per call; otherwise, and for the tails, the
 * scalar functions, which give the same bits. BF16 arrays are plain integer
 * code the compiler vectorises. Arrays may be unaligned and of any length.
 */
#include <stdatomic.h>

#include "ampprobe/numerics.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define PROBE_HALF_X86 1
#endif

const char *probe_dtype_name(probe_dtype dt) {
  switch (dt) {
  case PROBE_DTYPE_F32:
    return "fp32";
  case PROBE_DTYPE_F16:
    return "fp16";
  case PROBE_DTYPE_BF16:
    return "bf16";
  }
  return NULL;
}

size_t probe_dtype_size(probe_dtype dt) {
  switch (dt) {
  case PROBE_DTYPE_F32:
    return 4;
  case PROBE_DTYPE_F16:
  case PROBE_DTYPE_BF16:
    return 2;
  }
  return 0;
}

#ifdef PROBE_HALF_X86
static int have_f16c(void) {
  static atomic_int cached = -1; /* racing threads all store the same */
  int c = atomic_load_explicit(&cached, memory_order_relaxed);
  if (c < 0) {
    __builtin_cpu_init();
    c = __builtin_cpu_supports("f16c") && __builtin_cpu_supports("avx") ? 1 : 0;
    atomic_store_explicit(&cached, c, memory_order_relaxed);
  }
  return c;
}

/* out(n) <- in(n); F16C, 8 at a time; returns how many were done. */
__attribute__((target("avx,f16c"))) static size_t
f32_to_f16_f16c(uint16_t *out, const float *in, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 v = _mm256_loadu_ps(in + i);
    __m128i h = _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128((__m128i *)(void *)(out + i), h);
  }
  return i;
}

__attribute__((target("avx,f16c"))) static size_t
f16_to_f32_f16c(float *out, const uint16_t *in, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m128i h = _mm_loadu_si128((const __m128i *)(const void *)(in + i));
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(h));
  }
  return i;
}
#endif

void probe_f32_to_f16_array(uint16_t *out, const float *in, size_t n) {
  size_t i = 0;
#ifdef PROBE_HALF_X86
  if (have_f16c()) i = f32_to_f16_f16c(out, in, n);
#endif
  for (; i < n; i++) out[i] = probe_f32_to_f16(in[i]);
}

void probe_f16_to_f32_array(float *out, const uint16_t *in, size_t n) {
  size_t i = 0;
#ifdef PROBE_HALF_X86
  if (have_f16c()) i = f16_to_f32_f16c(out, in, n);
#endif
  for (; i < n; i++) out[i] = probe_f16_to_f32(in[i]);
}

void probe_f32_to_bf16_array(uint16_t *out, const float *in, size_t n) {
  for (size_t i = 0; i < n; i++) out[i] = probe_f32_to_bf16(in[i]);
}

void probe_bf16_to_f32_array(float *out, const uint16_t *in, size_t n) {
  for (size_t i = 0; i < n; i++) out[i] = probe_bf16_to_f32(in[i]);
}
