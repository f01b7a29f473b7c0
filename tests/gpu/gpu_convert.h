/*
 * gpu_convert.h - test helpers (tests/gpu/gpu_convert.cu): run the inline
 * conversions of ampprobe/numerics.h on the device over device arrays, so
 * tests can compare the device's bits with the host's. Each call launches one
 * kernel, synchronises, and returns the first CUDA error as an int (0 = ok).
 */
#ifndef AMPPROBE_TESTS_GPU_CONVERT_H
#define AMPPROBE_TESTS_GPU_CONVERT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* out(n) <- probe_f16_to_f32(in(n)), bits of the floats */
int gpu_f16_to_f32(uint32_t *out, const uint16_t *in, size_t n);
/* out(n) <- probe_f32_to_f16(in(n)) */
int gpu_f32_to_f16(uint16_t *out, const uint32_t *in, size_t n);
/* out(n) <- probe_f32_to_bf16(in(n)) */
int gpu_f32_to_bf16(uint16_t *out, const uint32_t *in, size_t n);
/* out(n) <- probe_bf16_to_f32(in(n)), bits of the floats */
int gpu_bf16_to_f32(uint32_t *out, const uint16_t *in, size_t n);

#ifdef __cplusplus
}
#endif
#endif
