/*
 * stats_gpu.cu - benchmark of the CUDA statistics path (kernels/stats_cuda.cu).
 *
 * Part 1, bandwidth, for buffers of 1 MiB .. 1 GiB and each dtype, all in
 * one run on one stream, timed with CUDA events:
 *   stats  probe_cuda_stats_enqueue of one tensor (the full record), GB/s of
 *          tensor bytes read;
 *   read   a plain read kernel summing the same buffer as 64-bit words
 *          (16-byte loads, grid-stride), GB/s of bytes read;
 *   d2d    cudaMemcpyAsync device->device of the same size, GB/s counting
 *          read + write (2x size), the figure comparable with "read".
 * Part 2, launch overhead: a layer of 64 small tensors (1K..64K elements,
 * mixed dtypes) as one multi-tensor enqueue vs 64 one-tensor enqueues, each
 * followed by probe_cuda_stats_wait; host wall time per layer.
 * Before timing, the GPU record of a 1 MiB buffer is checked against the CPU
 * kernel (counts and histogram exact). Without a device: prints SKIP, exits 0.
 */
#include <cuda_runtime.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ampprobe/numerics.h"

#define CHECK(call)                                                            \
  do {                                                                         \
    cudaError_t e_ = (call);                                                   \
    if (e_ != cudaSuccess) {                                                   \
      fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call,            \
              cudaGetErrorString(e_));                                         \
      exit(1);                                                                 \
    }                                                                          \
  } while (0)

#define PCHECK(call)                                                           \
  do {                                                                         \
    probe_status s_ = (call);                                                  \
    if (s_ != PROBE_OK) {                                                      \
      fprintf(stderr, "%s:%d: %s: %s [%s]\n", __FILE__, __LINE__, #call,       \
              probe_status_str(s_), probe_cuda_last_error());                  \
      exit(1);                                                                 \
    }                                                                          \
  } while (0)

/* Fill (n) elements of dtype dt with roughly N(0, 8) values from a hash. */
__global__ void fill_kernel(void *p, size_t n, int dt) {
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x) {
    unsigned long long z = (i + 1) * 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    float u = 0.0f;
    for (int k = 0; k < 4; k++) u += (float)((z >> (16 * k)) & 0xffff) / 65536.0f;
    float f = (u - 2.0f) * 8.0f;
    if (dt == PROBE_DTYPE_F32) ((float *)p)[i] = f;
    else if (dt == PROBE_DTYPE_F16) ((uint16_t *)p)[i] = probe_f32_to_f16(f);
    else ((uint16_t *)p)[i] = probe_f32_to_bf16(f);
  }
}

/* Plain read baseline: sum of 64-bit words, one atomic per block. */
__global__ void read_kernel(const uint4 *__restrict__ p, size_t nvec,
                            unsigned long long *out) {
  unsigned long long s = 0;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < nvec;
       i += (size_t)gridDim.x * blockDim.x) {
    uint4 v = __ldg(p + i);
    s += ((unsigned long long)v.y << 32 | v.x) + ((unsigned long long)v.w << 32 | v.z);
  }
  for (int o = 16; o > 0; o >>= 1) s += __shfl_down_sync(0xffffffffu, s, o);
  if (threadIdx.x % 32 == 0) atomicAdd(out, s);
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int reps_for(size_t bytes) { /* about 4 GiB of traffic, 5..200 reps */
  size_t r = (4ull << 30) / bytes;
  return r < 5 ? 5 : (r > 200 ? 200 : (int)r);
}

static void check_small(probe_cuda_stats *ctx, void *d, probe_dtype dt) {
  size_t bytes = 1u << 20, n = bytes / probe_dtype_size(dt);
  void *h = malloc(bytes);
  CHECK(cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost));
  probe_stats g, c;
  probe_cuda_tensor t = {d, n, dt};
  PCHECK(probe_cuda_stats_enqueue(ctx, &t, 1, &g));
  PCHECK(probe_cuda_stats_wait(ctx));
  PCHECK(probe_stats_compute(&c, dt, h, n));
  int ok = g.count == c.count && g.nan_count == c.nan_count &&
           g.zero_count == c.zero_count && g.f16_subnormal == c.f16_subnormal &&
           g.min == c.min && g.max == c.max &&
           memcmp(g.hist, c.hist, sizeof g.hist) == 0;
  printf("check %s 1 MiB vs CPU: %s\n", probe_dtype_name(dt),
         ok ? "ok" : "MISMATCH");
  free(h);
  if (!ok) exit(1);
}

int main(void) {
  int ndev = 0;
  cudaError_t err = cudaGetDeviceCount(&ndev);
  if (err != cudaSuccess || ndev == 0) {
    printf("SKIP: no usable CUDA device: %s\n",
           err != cudaSuccess ? cudaGetErrorString(err) : "0 devices");
    return 0;
  }
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, 0));
  int sms = prop.multiProcessorCount;
  printf("device: %s, sm_%d%d, %d SMs, %.1f GiB\n", prop.name, prop.major,
         prop.minor, sms, (double)prop.totalGlobalMem / (1u << 30));

  const size_t max_bytes = 1ull << 30;
  void *src = NULL, *dst = NULL;
  unsigned long long *dsum = NULL;
  CHECK(cudaMalloc(&src, max_bytes));
  CHECK(cudaMalloc(&dst, max_bytes));
  CHECK(cudaMalloc((void **)&dsum, sizeof *dsum));
  cudaStream_t st;
  CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  cudaEvent_t e0, e1;
  CHECK(cudaEventCreate(&e0));
  CHECK(cudaEventCreate(&e1));
  probe_cuda_stats *ctx = NULL;
  PCHECK(probe_cuda_stats_create(&ctx, (void *)st, 64));

  static const probe_dtype dts[3] = {PROBE_DTYPE_F32, PROBE_DTYPE_F16,
                                     PROBE_DTYPE_BF16};
  printf("\n%10s %5s %10s %10s %10s %11s %10s\n", "size", "dtype",
         "stats GB/s", "read GB/s", "d2d GB/s", "stats/read", "stats/d2d");
  for (int k = 0; k < 3; k++) {
    probe_dtype dt = dts[k];
    size_t esz = probe_dtype_size(dt);
    fill_kernel<<<sms * 16, 256, 0, st>>>(src, max_bytes / esz, dt);
    CHECK(cudaGetLastError());
    CHECK(cudaStreamSynchronize(st));
    check_small(ctx, src, dt);
    for (size_t bytes = 1u << 20; bytes <= max_bytes; bytes *= 4) {
      int reps = reps_for(bytes);
      float ms;
      /* stats */
      probe_stats rec[200];
      probe_cuda_tensor t = {src, bytes / esz, dt};
      PCHECK(probe_cuda_stats_enqueue(ctx, &t, 1, rec));
      PCHECK(probe_cuda_stats_wait(ctx));
      CHECK(cudaEventRecord(e0, st));
      for (int r = 0; r < reps; r++)
        PCHECK(probe_cuda_stats_enqueue(ctx, &t, 1, &rec[r]));
      CHECK(cudaEventRecord(e1, st));
      PCHECK(probe_cuda_stats_wait(ctx));
      CHECK(cudaEventElapsedTime(&ms, e0, e1));
      double gb_stats = (double)bytes * reps / (ms * 1e-3) / 1e9;
      /* read */
      size_t nvec = bytes / 16;
      unsigned int grid = (unsigned int)sms * 8;
      read_kernel<<<grid, 256, 0, st>>>((const uint4 *)src, nvec, dsum);
      CHECK(cudaEventRecord(e0, st));
      for (int r = 0; r < reps; r++)
        read_kernel<<<grid, 256, 0, st>>>((const uint4 *)src, nvec, dsum);
      CHECK(cudaEventRecord(e1, st));
      CHECK(cudaGetLastError());
      CHECK(cudaEventSynchronize(e1));
      CHECK(cudaEventElapsedTime(&ms, e0, e1));
      double gb_read = (double)bytes * reps / (ms * 1e-3) / 1e9;
      /* d2d */
      CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, st));
      CHECK(cudaEventRecord(e0, st));
      for (int r = 0; r < reps; r++)
        CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, st));
      CHECK(cudaEventRecord(e1, st));
      CHECK(cudaEventSynchronize(e1));
      CHECK(cudaEventElapsedTime(&ms, e0, e1));
      double gb_d2d = 2.0 * (double)bytes * reps / (ms * 1e-3) / 1e9;
      printf("%7zu MiB %5s %10.1f %10.1f %10.1f %11.2f %10.2f\n", bytes >> 20,
             probe_dtype_name(dt), gb_stats, gb_read, gb_d2d,
             gb_stats / gb_read, gb_stats / gb_d2d);
    }
  }

  /* Part 2: 64 small tensors, one launch vs one launch per tensor. */
  enum { NT = 64, LAYERS = 200 };
  probe_cuda_tensor ts[NT];
  probe_stats out[NT];
  size_t off = 0, elems = 0;
  for (int i = 0; i < NT; i++) {
    size_t n = (size_t)1024 << (i % 7); /* 1K .. 64K elements */
    probe_dtype dt = dts[i % 3];
    ts[i].data = (const char *)src + off;
    ts[i].n = n;
    ts[i].dtype = dt;
    off += (n * probe_dtype_size(dt) + 255) & ~(size_t)255;
    elems += n;
  }
  double best_multi = 1e30, best_single = 1e30;
  for (int trial = 0; trial < 3; trial++) {
    double t0 = now_s();
    for (int l = 0; l < LAYERS; l++) {
      PCHECK(probe_cuda_stats_enqueue(ctx, ts, NT, out));
      PCHECK(probe_cuda_stats_wait(ctx));
    }
    double t1 = now_s();
    for (int l = 0; l < LAYERS; l++) {
      for (int i = 0; i < NT; i++)
        PCHECK(probe_cuda_stats_enqueue(ctx, &ts[i], 1, &out[i]));
      PCHECK(probe_cuda_stats_wait(ctx));
    }
    double t2 = now_s();
    if ((t1 - t0) < best_multi) best_multi = t1 - t0;
    if ((t2 - t1) < best_single) best_single = t2 - t1;
  }
  printf("\n%d tensors (%zu elements, %.1f MiB) per layer, enqueue + wait:\n",
         NT, elems, (double)off / (1u << 20));
  printf("  one multi-tensor launch : %8.1f us/layer\n",
         1e6 * best_multi / LAYERS);
  printf("  %d one-tensor launches  : %8.1f us/layer\n", NT,
         1e6 * best_single / LAYERS);
  printf("  speed-up                : %8.2fx\n", best_single / best_multi);

  probe_cuda_stats_destroy(ctx);
  CHECK(cudaEventDestroy(e0));
  CHECK(cudaEventDestroy(e1));
  CHECK(cudaStreamDestroy(st));
  CHECK(cudaFree(src));
  CHECK(cudaFree(dst));
  CHECK(cudaFree(dsum));
  return 0;
}
