/*
 * emu/cuda_runtime.h - device side of the CPU emulation (C++ only): the CUDA
 * keywords and intrinsics stats_cuda.cu and gpu_convert.cu use, and
 * PROBE_LAUNCH, which runs a kernel's blocks one after another on the
 * calling thread, each block's threads as cooperative user-level contexts
 * (ucontext). __syncthreads switches to the next thread; a block barrier is
 * released when every live thread of the block has reached it.
 *
 * Emulated __shfl_down_sync synchronises the whole block (it is built on the
 * barrier), so it is exact only for code in which every thread of the block
 * makes the same shuffles, as the kernels here do. Shared atomics are plain
 * read-modify-writes (one OS thread). What this cannot check: the device
 * memory model, real warp scheduling, nvcc's code generation.
 */
#ifndef AMPPROBE_EMU_CUDA_RUNTIME_H
#define AMPPROBE_EMU_CUDA_RUNTIME_H

#include <stdint.h>
#include <string.h>

#include <algorithm>
#include <cmath>
#include <functional>

#include "cuda_runtime_api.h"

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static

struct emu_dim3 {
  unsigned int x, y, z;
};
extern emu_dim3 threadIdx, blockIdx, blockDim, gridDim;

struct uint4 {
  unsigned int x, y, z, w;
};

using std::max;
using std::min;
using std::fma;

void __syncthreads(void);
/* 64-bit exchange slot of thread t of the running block, in one of two
 * banks; successive shuffles alternate banks, so one barrier per shuffle
 * suffices (a thread cannot reach the shuffle after next, which reuses the
 * bank, before every thread has read this one). */
uint64_t *emu_shfl_slot(unsigned int bank, unsigned int t);
unsigned int emu_shfl_bank(void);

template <class T> T __shfl_down_sync(unsigned int mask, T v, int offset) {
  (void)mask;
  static_assert(sizeof(T) <= 8, "shuffle of at most 64 bits");
  uint64_t bits = 0, r;
  memcpy(&bits, &v, sizeof v);
  unsigned int bank = emu_shfl_bank();
  *emu_shfl_slot(bank, threadIdx.x) = bits;
  __syncthreads();
  unsigned int lane = threadIdx.x % 32;
  r = (lane + (unsigned)offset < 32 && threadIdx.x + offset < blockDim.x)
          ? *emu_shfl_slot(bank, threadIdx.x + offset)
          : bits;
  T out;
  memcpy(&out, &r, sizeof out);
  return out;
}

template <class T> inline T __ldg(const T *p) { return *p; }

/* Blocks run one after another here: every write is already visible. */
inline void __threadfence(void) {}

inline unsigned int atomicAdd(unsigned int *p, unsigned int v) {
  unsigned int old = *p;
  *p = old + v;
  return old;
}
inline unsigned long long atomicAdd(unsigned long long *p,
                                    unsigned long long v) {
  unsigned long long old = *p;
  *p = old + v;
  return old;
}

inline float __uint_as_float(unsigned int u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}
inline unsigned int __float_as_uint(float f) {
  unsigned int u;
  memcpy(&u, &f, sizeof u);
  return u;
}

/* Runs body once per thread of each of grid blocks of block threads. */
void emu_launch(unsigned int grid, unsigned int block,
                const std::function<void()> &body);

#define PROBE_LAUNCH(kernel, grid, block, stream, ...)                         \
  emu_launch((grid), (block), [&]() { kernel(__VA_ARGS__); })

#define cudaOccupancyMaxActiveBlocksPerMultiprocessor                          \
  emu_cudaOccupancyMaxActiveBlocksPerMultiprocessor
template <class F>
emu_cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int *n, F f,
                                                              int threads,
                                                              size_t smem) {
  (void)f;
  (void)threads;
  (void)smem;
  *n = 2;
  return cudaSuccess;
}

#endif
