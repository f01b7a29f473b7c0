/*
 * gpu_convert.cu - device kernels for the conversion tests: each thread
 * applies one inline conversion of ampprobe/numerics.h (PROBE_HD) to one
 * element. Arrays are device memory; see gpu_convert.h.
 */
#include <cuda_runtime.h>

#include "ampprobe/numerics.h"
#include "gpu_convert.h"

__global__ void k_f16_to_f32(uint32_t *out, const uint16_t *in, size_t n) {
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = probe_f32_bits(probe_f16_to_f32(in[i]));
}

__global__ void k_bf16_to_f32(uint32_t *out, const uint16_t *in, size_t n) {
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = probe_f32_bits(probe_bf16_to_f32(in[i]));
}

__global__ void k_f32_to_f16(uint16_t *out, const uint32_t *in, size_t n) {
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = probe_f32_to_f16(probe_f32_from_bits(in[i]));
}

__global__ void k_f32_to_bf16(uint16_t *out, const uint32_t *in, size_t n) {
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = probe_f32_to_bf16(probe_f32_from_bits(in[i]));
}

static int finish(void) {
  cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) e = cudaDeviceSynchronize();
  return (int)e;
}

/* Kernel launch; tests/gpu/emu/ defines it to run on the CPU. */
#ifndef PROBE_LAUNCH
#define PROBE_LAUNCH(kernel, grid, block, stream, ...)                         \
  kernel<<<(grid), (block), 0, (stream)>>>(__VA_ARGS__)
#endif
#define GRID(n) (unsigned int)(((n) + 255) / 256)

extern "C" int gpu_f16_to_f32(uint32_t *out, const uint16_t *in, size_t n) {
  if (n) PROBE_LAUNCH(k_f16_to_f32, GRID(n), 256, 0, out, in, n);
  return finish();
}

extern "C" int gpu_bf16_to_f32(uint32_t *out, const uint16_t *in, size_t n) {
  if (n) PROBE_LAUNCH(k_bf16_to_f32, GRID(n), 256, 0, out, in, n);
  return finish();
}

extern "C" int gpu_f32_to_f16(uint16_t *out, const uint32_t *in, size_t n) {
  if (n) PROBE_LAUNCH(k_f32_to_f16, GRID(n), 256, 0, out, in, n);
  return finish();
}

extern "C" int gpu_f32_to_bf16(uint16_t *out, const uint32_t *in, size_t n) {
  if (n) PROBE_LAUNCH(k_f32_to_bf16, GRID(n), 256, 0, out, in, n);
  return finish();
}
