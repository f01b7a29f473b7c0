/*
 * stats_cuda.cu - the fused statistics record of include/ampprobe/numerics.h
 * computed on a CUDA device, many tensors per launch.
 *
 * One batch (up to max_tensors device tensors) is, on one stream, one
 * launch of stats_chunk_kernel, grid = chunks of all tensors of the batch:
 * block b maps to (tensor t, chunk c) through the batch's descriptor table
 * (in the launch's parameters for up to STATS_INLINE tensors, else copied
 * with cudaMemcpyAsync from pinned memory), reads its part of the tensor
 * once (16-byte loads, grid-stride within the tensor) and writes one
 * partial record (warp shuffles, then shared memory); the last block of a
 * tensor to finish (an arrival counter per tensor, __threadfence before it)
 * folds the tensor's partials in a fixed order into its probe_stats,
 * written straight into mapped pinned host memory. So a batch of one tensor
 * (a hook's record) costs one launch and no copy: the four runtime calls of
 * a launch, a separate merge launch and two copies took ~31 us a record on
 * an H200's host (2026-12-04, torch.profiler), ~40% of a traced GPT step.
 * probe_cuda_stats_wait records an event, waits for it and copies the
 * records into the callers' arrays: no host synchronisation per tensor or
 * per batch. The
 * statistics are those of the CPU reference (probe_stats_compute_portable in
 * kernels/stats.c, defined in docs/statistics.md); docs/cuda.md describes
 * this file. Counts, extremes and the histogram are exact; sum and sumsq are
 * double sums in a fixed (deterministic) order that differs from the CPU's.
 * A context is not thread-safe: one host thread drives it.
 */
#include <cuda_runtime.h>
#include <nvtx3/nvToolsExt.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ampprobe/numerics.h"

/* ---- error reporting: never exit, record where it failed ------------------ */

static thread_local char cuda_err_[320];

static probe_status cuda_fail_(cudaError_t err, const char *call,
                               const char *file, int line) {
  const char *base = strrchr(file, '/');
  snprintf(cuda_err_, sizeof cuda_err_, "%s:%d: %s: %s (%s)",
           base ? base + 1 : file, line, call, cudaGetErrorString(err),
           cudaGetErrorName(err));
  if (err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver)
    return PROBE_ERR_NO_DEVICE;
  return PROBE_ERR_CUDA;
}

/* Evaluate a CUDA call; on failure record file/line and return the status. */
#define CUDA_CHECK(call)                                                       \
  do {                                                                         \
    cudaError_t cuda_e_ = (call);                                              \
    if (cuda_e_ != cudaSuccess)                                                \
      return cuda_fail_(cuda_e_, #call, __FILE__, __LINE__);                   \
  } while (0)

extern "C" const char *probe_cuda_last_error(void) { return cuda_err_; }

/* NVTX range for the lifetime of a scope (named after the launcher). */
struct nvtx_scope {
  explicit nvtx_scope(const char *name) { nvtxRangePushA(name); }
  ~nvtx_scope() { nvtxRangePop(); }
};

/* Makes ctx's device current for a scope and restores the caller's. */
struct device_scope {
  int prev = -1;
  cudaError_t err = cudaSuccess;
  explicit device_scope(int dev) {
    err = cudaGetDevice(&prev);
    if (err == cudaSuccess && prev != dev) err = cudaSetDevice(dev);
    else prev = -1;
  }
  ~device_scope() {
    if (prev >= 0) cudaSetDevice(prev);
  }
};

/* ---- launch geometry ------------------------------------------------------- */

#define STATS_THREADS 256
#define STATS_WARPS (STATS_THREADS / 32)
/* Descriptors passed in the launch's parameters (320 bytes) */
#define STATS_INLINE 8
/* A tensor gets one block per CHUNK_MIN_ELEMS elements at most, and at least
 * one per CHUNK_MAX_ELEMS, so that no thread sees more than 2^23 / 256 + 10
 * elements (its vectors, at most one more vector, the head and tail
 * elements): its 16-bit histogram counters cannot wrap. */
#define CHUNK_MIN_ELEMS (STATS_THREADS * 32ull)
#define CHUNK_MAX_ELEMS (1ull << 23)
#define FULL_MASK 0xffffffffu

/* Kernel launch. tests/gpu/emu/ defines it to run the kernels on the CPU. */
#ifndef PROBE_LAUNCH
#define PROBE_LAUNCH(kernel, grid, block, stream, ...)                         \
  kernel<<<(grid), (block), 0, (stream)>>>(__VA_ARGS__)
#endif

/* One tensor of a batch, as the kernels see it. The tensor is split into a
 * scalar head (elements before the first 16-byte boundary), nvec 16-byte
 * vectors, and a scalar tail (fewer than one vector). */
struct stats_desc {
  const void *data;
  unsigned long long n;    /* elements */
  unsigned long long nvec; /* 16-byte vectors in the aligned body */
  unsigned int head;       /* scalar elements before the body */
  unsigned int dtype;      /* probe_dtype */
  unsigned int chunk_first; /* first block (and partial) of this tensor */
  unsigned int nchunks;     /* blocks; 0 when n == 0 */
};

/* A batch's table when it is short enough to travel as a launch parameter. */
struct stats_desc_inline {
  stats_desc d[STATS_INLINE];
};

/* What one block leaves for the merge: its chunk's record. */
struct stats_partial {
  unsigned long long nan, posinf, neginf, zero, sub, flush, ovf;
  unsigned int minkey, maxkey; /* order-preserving keys of finite min/max */
  unsigned int absmax, absmin; /* bits of finite |x| max, non-zero |x| min */
  double sum, sumsq;
  unsigned long long hist[PROBE_HIST_BINS];
};

/* Per-thread accumulator (counts fit 32 bits: a chunk is <= 2^23 elements). */
struct stats_acc {
  unsigned int nan, posinf, neginf, zero, sub, flush, ovf;
  unsigned int minkey, maxkey, absmax, absmin;
  double sum, sumsq;
};

/* Merge-side accumulator, 64-bit counts. */
struct merge_acc {
  unsigned long long nan, posinf, neginf, zero, sub, flush, ovf;
  unsigned int minkey, maxkey, absmax, absmin;
  double sum, sumsq;
};

#define KEY_NONE_MIN 0xffffffffu /* above every finite key */
#define KEY_NONE_MAX 0u          /* below every finite key */
#define ABSMIN_NONE 0xffffffffu  /* above every finite magnitude */

/* Order-preserving map float bits -> unsigned: a < b as floats (with
 * -0 < +0) iff key(a) < key(b). */
__device__ __forceinline__ unsigned int f32_key(unsigned int u) {
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
__device__ __forceinline__ unsigned int f32_unkey(unsigned int k) {
  return (k & 0x80000000u) ? (k & 0x7fffffffu) : ~k;
}

/* ---- the per-element step -------------------------------------------------- */

/* The empty accumulator (both kinds: per thread and merge-side). */
template <typename A> __device__ __forceinline__ void acc_init(A &a) {
  a.nan = a.posinf = a.neginf = a.zero = a.sub = a.flush = a.ovf = 0;
  a.minkey = KEY_NONE_MIN;
  a.maxkey = KEY_NONE_MAX;
  a.absmax = 0;
  a.absmin = ABSMIN_NONE;
  a.sum = 0.0;
  a.sumsq = 0.0;
}

/* Classify one value (as binary32) and fold it in. hcol is this thread's
 * column of the block's histogram in shared memory: bin b's counter is
 * hcol[b * STATS_THREADS] (16 bits, private to the thread: no atomics, and
 * the 32 lanes of a warp always hit 16 distinct words in 16 banks).
 * Bit thresholds: 2^-14 = 0x38800000, 2^-25 = 0x33000000,
 * 65520 = 0x477ff000. For fp16 input the last two cannot be reached (finite
 * fp16 values are <= 65504 and non-zero ones >= 2^-24), so they are skipped. */
template <int DT>
__device__ __forceinline__ void acc_add(stats_acc &a, float x,
                                        unsigned short *hcol) {
  unsigned int u = __float_as_uint(x);
  unsigned int ax = u & 0x7fffffffu;
  if (ax >= 0x7f800000u) { /* not finite: counted, nothing else */
    if (ax > 0x7f800000u) a.nan++;
    else if (u >> 31) a.neginf++;
    else a.posinf++;
    return;
  }
  unsigned int key = f32_key(u);
  a.minkey = min(a.minkey, key);
  a.maxkey = max(a.maxkey, key);
  a.absmax = max(a.absmax, ax);
  if (ax == 0) { /* zeros add nothing to the sums or the histogram */
    a.zero++;
    return;
  }
  double d = (double)x;
  a.sum += d;
  a.sumsq = fma(d, d, a.sumsq); /* d*d is exact in double: same as mul+add */
  a.absmin = min(a.absmin, ax);
  a.sub += ax < 0x38800000u;
  if (DT != PROBE_DTYPE_F16) {
    a.flush += ax <= 0x33000000u;
    a.ovf += ax >= 0x477ff000u;
  }
  /* floor(log2|x|) from the biased exponent; binary32 subnormals give -127,
   * which lands in the underflow bin as their true exponent would. */
  int e = (int)(ax >> 23) - 127;
  int bin = e - PROBE_HIST_MIN_EXP + 1;
  bin = bin < 0 ? 0 : (bin > PROBE_HIST_BINS - 1 ? PROBE_HIST_BINS - 1 : bin);
  hcol[bin * STATS_THREADS]++;
}

/* Element bits -> binary32, through numerics.h's conversions. */
template <int DT> __device__ __forceinline__ float elem_f32(unsigned int raw);
template <> __device__ __forceinline__ float elem_f32<PROBE_DTYPE_F32>(
    unsigned int raw) {
  return __uint_as_float(raw);
}
template <> __device__ __forceinline__ float elem_f32<PROBE_DTYPE_F16>(
    unsigned int raw) {
  return probe_f16_to_f32((uint16_t)raw);
}
template <> __device__ __forceinline__ float elem_f32<PROBE_DTYPE_BF16>(
    unsigned int raw) {
  return probe_bf16_to_f32((uint16_t)raw);
}

template <int DT> struct dt_size { static const unsigned int v = 2; };
template <> struct dt_size<PROBE_DTYPE_F32> { static const unsigned int v = 4; };

template <int DT>
__device__ __forceinline__ unsigned int load_scalar(const void *p,
                                                    unsigned long long i) {
  if (DT == PROBE_DTYPE_F32) return __ldg((const unsigned int *)p + i);
  return __ldg((const unsigned short *)p + i);
}

/* Fold one 16-byte vector: 4 binary32 or 8 16-bit elements. */
template <int DT>
__device__ __forceinline__ void acc_vec(stats_acc &a, uint4 v,
                                        unsigned short *hcol) {
  unsigned int w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int k = 0; k < 4; k++) {
    if (DT == PROBE_DTYPE_F32) {
      acc_add<DT>(a, elem_f32<DT>(w[k]), hcol);
    } else { /* little-endian: element 2k in the low half */
      acc_add<DT>(a, elem_f32<DT>(w[k] & 0xffffu), hcol);
      acc_add<DT>(a, elem_f32<DT>(w[k] >> 16), hcol);
    }
  }
}

/* Chunk c of tensor d: vectors c*T + tid, then every nchunks*T; chunk 0
 * also takes the scalar head and tail. */
template <int DT>
__device__ void chunk_run(const stats_desc &d, unsigned int c, stats_acc &a,
                          unsigned short *hcol) {
  const unsigned int esz = dt_size<DT>::v;
  const unsigned int vecw = 16u / esz;
  const uint4 *body =
      (const uint4 *)((const char *)d.data + (size_t)d.head * esz);
  const unsigned long long stride = (unsigned long long)d.nchunks * STATS_THREADS;
  unsigned long long i = (unsigned long long)c * STATS_THREADS + threadIdx.x;
  for (; i + 3 * stride < d.nvec; i += 4 * stride) { /* 4 loads in flight */
    uint4 v0 = __ldg(body + i);
    uint4 v1 = __ldg(body + i + stride);
    uint4 v2 = __ldg(body + i + 2 * stride);
    uint4 v3 = __ldg(body + i + 3 * stride);
    acc_vec<DT>(a, v0, hcol);
    acc_vec<DT>(a, v1, hcol);
    acc_vec<DT>(a, v2, hcol);
    acc_vec<DT>(a, v3, hcol);
  }
  for (; i < d.nvec; i += stride) acc_vec<DT>(a, __ldg(body + i), hcol);
  if (c == 0) {
    unsigned long long tail0 = d.head + d.nvec * vecw;
    if (threadIdx.x < d.head)
      acc_add<DT>(a, elem_f32<DT>(load_scalar<DT>(d.data, threadIdx.x)), hcol);
    if (tail0 + threadIdx.x < d.n)
      acc_add<DT>(a,
                  elem_f32<DT>(load_scalar<DT>(d.data, tail0 + threadIdx.x)),
                  hcol);
  }
}

template <typename A> __device__ __forceinline__ void acc_warp_reduce(A &a) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    a.nan += __shfl_down_sync(FULL_MASK, a.nan, o);
    a.posinf += __shfl_down_sync(FULL_MASK, a.posinf, o);
    a.neginf += __shfl_down_sync(FULL_MASK, a.neginf, o);
    a.zero += __shfl_down_sync(FULL_MASK, a.zero, o);
    a.sub += __shfl_down_sync(FULL_MASK, a.sub, o);
    a.flush += __shfl_down_sync(FULL_MASK, a.flush, o);
    a.ovf += __shfl_down_sync(FULL_MASK, a.ovf, o);
    a.minkey = min(a.minkey, __shfl_down_sync(FULL_MASK, a.minkey, o));
    a.maxkey = max(a.maxkey, __shfl_down_sync(FULL_MASK, a.maxkey, o));
    a.absmax = max(a.absmax, __shfl_down_sync(FULL_MASK, a.absmax, o));
    a.absmin = min(a.absmin, __shfl_down_sync(FULL_MASK, a.absmin, o));
    a.sum += __shfl_down_sync(FULL_MASK, a.sum, o);
    a.sumsq += __shfl_down_sync(FULL_MASK, a.sumsq, o);
  }
}

/* dst (+)= src, field by field (both accumulator kinds). */
template <typename D, typename S>
__device__ __forceinline__ void acc_fold(D &dst, const S &src) {
  dst.nan += src.nan;
  dst.posinf += src.posinf;
  dst.neginf += src.neginf;
  dst.zero += src.zero;
  dst.sub += src.sub;
  dst.flush += src.flush;
  dst.ovf += src.ovf;
  dst.minkey = min(dst.minkey, src.minkey);
  dst.maxkey = max(dst.maxkey, src.maxkey);
  dst.absmax = max(dst.absmax, src.absmax);
  dst.absmin = min(dst.absmin, src.absmin);
  dst.sum += src.sum;
  dst.sumsq += src.sumsq;
}

/* ---- kernels ---------------------------------------------------------------- */

/* The whole block folds the nchunks partials at p of tensor d, in a fixed
 * order (so the record is reproducible), into *o. wred: shared, one entry
 * per warp. Called by every thread of a block (it has barriers). */
__device__ void merge_tensor(const stats_desc &d,
                             const stats_partial *__restrict__ p,
                             probe_stats *__restrict__ o, merge_acc *wred) {
  const unsigned int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  merge_acc m;
  acc_init(m);
  for (unsigned int i = threadIdx.x; i < d.nchunks; i += STATS_THREADS)
    acc_fold(m, p[i]);
  acc_warp_reduce(m);
  if (lane == 0) wred[warp] = m;
  for (unsigned int bin = threadIdx.x; bin < PROBE_HIST_BINS;
       bin += STATS_THREADS) {
    unsigned long long s = 0;
    for (unsigned int i = 0; i < d.nchunks; i++) s += p[i].hist[bin];
    o->hist[bin] = s;
  }
  __syncthreads();

  if (threadIdx.x == 0) {
    for (int w = 1; w < STATS_WARPS; w++) acc_fold(wred[0], wred[w]);
    const merge_acc &r = wred[0];
    const float qnan = __uint_as_float(0x7fc00000u);
    unsigned long long finite = d.n - r.nan - r.posinf - r.neginf;
    o->count = d.n;
    o->nan_count = r.nan;
    o->posinf_count = r.posinf;
    o->neginf_count = r.neginf;
    o->zero_count = r.zero;
    o->f16_subnormal = r.sub;
    o->f16_flush = r.flush;
    o->f16_overflow = r.ovf;
    o->min = finite ? __uint_as_float(f32_unkey(r.minkey)) : qnan;
    o->max = finite ? __uint_as_float(f32_unkey(r.maxkey)) : qnan;
    o->absmax = finite ? __uint_as_float(r.absmax) : qnan;
    o->absmin_nonzero =
        r.absmin != ABSMIN_NONE ? __uint_as_float(r.absmin) : qnan;
    o->sum = r.sum;
    o->sumsq = r.sumsq;
  }
}

/* grid = total chunks of the batch, block = STATS_THREADS.
 * The batch's descriptors: inl.d when ntensors <= STATS_INLINE, else gdesc
 * (device memory). part: (gridDim.x) partial records, one per block;
 * arrived: (ntensors) counters, zero at launch and left zero; out:
 * (ntensors) records (mapped host memory). Tensors with no element have no
 * block: the host writes their records. */
__global__ void __launch_bounds__(STATS_THREADS)
    stats_chunk_kernel(stats_desc_inline inl,
                       const stats_desc *__restrict__ gdesc,
                       unsigned int ntensors,
                       stats_partial *__restrict__ part,
                       unsigned int *__restrict__ arrived,
                       probe_stats *__restrict__ out) {
  /* (PROBE_HIST_BINS, STATS_THREADS) 16-bit counters: one column per
   * thread, 33 KiB */
  __shared__ unsigned short hist[PROBE_HIST_BINS * STATS_THREADS];
  __shared__ stats_acc wred[STATS_WARPS];
  __shared__ merge_acc mred[STATS_WARPS];
  __shared__ stats_desc s_desc;
  __shared__ unsigned int s_tensor, s_last;
  const unsigned int b = blockIdx.x;
  const unsigned int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  unsigned short *hcol = hist + threadIdx.x;

  for (int bin = 0; bin < PROBE_HIST_BINS; bin++) /* own column only */
    hcol[bin * STATS_THREADS] = 0;
  if (threadIdx.x == 0) { /* last tensor whose first chunk is <= b */
    const stats_desc *desc = ntensors <= STATS_INLINE ? inl.d : gdesc;
    unsigned int lo = 0, hi = ntensors - 1;
    while (lo < hi) {
      unsigned int mid = lo + (hi - lo + 1) / 2;
      if (desc[mid].chunk_first <= b) lo = mid;
      else hi = mid - 1;
    }
    s_tensor = lo;
    s_desc = desc[lo];
  }
  __syncthreads();

  const stats_desc d = s_desc;
  const unsigned int t = s_tensor;
  const unsigned int c = b - d.chunk_first;
  stats_acc a;
  acc_init(a);
  switch (d.dtype) {
  case PROBE_DTYPE_F32: chunk_run<PROBE_DTYPE_F32>(d, c, a, hcol); break;
  case PROBE_DTYPE_F16: chunk_run<PROBE_DTYPE_F16>(d, c, a, hcol); break;
  default: chunk_run<PROBE_DTYPE_BF16>(d, c, a, hcol); break;
  }

  acc_warp_reduce(a);
  if (lane == 0) wred[warp] = a;
  __syncthreads();

  stats_partial *p = &part[b];
  if (threadIdx.x == 0) {
    merge_acc m;
    acc_init(m);
    for (int w = 0; w < STATS_WARPS; w++) acc_fold(m, wred[w]);
    p->nan = m.nan;
    p->posinf = m.posinf;
    p->neginf = m.neginf;
    p->zero = m.zero;
    p->sub = m.sub;
    p->flush = m.flush;
    p->ovf = m.ovf;
    p->minkey = m.minkey;
    p->maxkey = m.maxkey;
    p->absmax = m.absmax;
    p->absmin = m.absmin;
    p->sum = m.sum;
    p->sumsq = m.sumsq;
  }
  /* Histogram: warp w sums bins w, w + 8, ...; lane l adds columns l,
   * l + 32, ... (conflict-free), then the warp adds its lanes. Every warp
   * makes the same number of shuffles. */
  for (int r = 0; r < (PROBE_HIST_BINS + STATS_WARPS - 1) / STATS_WARPS; r++) {
    const int bin = (int)warp + r * STATS_WARPS;
    unsigned int s = 0;
    if (bin < PROBE_HIST_BINS)
      for (int k = 0; k < STATS_THREADS / 32; k++)
        s += hist[bin * STATS_THREADS + k * 32 + (int)lane];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) s += __shfl_down_sync(FULL_MASK, s, o);
    if (lane == 0 && bin < PROBE_HIST_BINS) p->hist[bin] = s;
  }

  /* Arrival: every thread's writes of the partial are visible device-wide
   * before the counter moves; the block that brings it to nchunks merges. */
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0)
    s_last = atomicAdd(&arrived[t], 1u) + 1u == d.nchunks;
  __syncthreads();
  if (s_last) {
    __threadfence();
    merge_tensor(d, part + d.chunk_first, &out[t], mred);
    if (threadIdx.x == 0) arrived[t] = 0; /* ready for the next batch */
  }
}

/* ---- host side -------------------------------------------------------------- */

/* A batch whose records are on their way to pinned memory. */
struct stats_pending {
  probe_stats *out; /* the caller's array */
  size_t off;       /* first record in the arena */
  size_t count;
};

struct probe_cuda_stats {
  int device;
  cudaStream_t stream;
  int own_stream;
  cudaEvent_t done;     /* recorded by wait after the batches */
  size_t max_tensors;   /* tensors per launch */
  unsigned int target;  /* blocks one launch aims for (one full wave) */
  /* arena of descriptor/record slots, reset by wait: (arena) entries each */
  size_t arena, used;
  stats_desc *h_desc, *d_desc;
  probe_stats *h_res, *d_res; /* mapped pinned records: host and device view */
  unsigned int *d_arrived;    /* (arena) arrival counters, zero between launches */
  stats_partial *d_part; /* (part_cap) partials, reused launch after launch */
  size_t part_cap;
  stats_pending *pend;
  size_t npend;
};

extern "C" int probe_cuda_available(void) {
  int n = 0;
  cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    (void)cudaGetLastError(); /* leave no error behind */
    cuda_fail_(err, "cudaGetDeviceCount(&n)", __FILE__, __LINE__);
    return 0;
  }
  return n > 0;
}

static int device_seen_ = 0;

/* Whether this process sees a CUDA device, asked once: the device count
 * cannot change within a process (the runtime reads CUDA_VISIBLE_DEVICES
 * when it starts). Without one, no pointer is a device pointer, and a
 * record skips cudaPointerGetAttributes and the cudaGetLastError that
 * clears its failure (some 170 instructions a record). 0 = not asked yet,
 * 1 = none, 2 = some; two threads that ask at once store the same answer. */
static int sees_device(void) {
  int known = __atomic_load_n(&device_seen_, __ATOMIC_ACQUIRE);
  if (known == 0) {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) {
      (void)cudaGetLastError();
      count = 0;
    }
    known = count > 0 ? 2 : 1;
    __atomic_store_n(&device_seen_, known, __ATOMIC_RELEASE);
  }
  return known == 2;
}

extern "C" int probe_cuda_is_device_ptr(const void *ptr) {
  if (!ptr || !sees_device()) return 0;
  cudaPointerAttributes attr;
  cudaError_t err = cudaPointerGetAttributes(&attr, ptr);
  if (err != cudaSuccess) { /* no device, or a pointer CUDA does not know */
    (void)cudaGetLastError();
    return 0;
  }
  return attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged;
}

static probe_status ctx_alloc(probe_cuda_stats *c, void *stream) {
  CUDA_CHECK(cudaGetDevice(&c->device));
  if (stream) {
    c->stream = (cudaStream_t)stream;
  } else {
    /* A blocking stream: it waits for work on the legacy default stream, so
     * a tensor produced there is complete before the statistics read it. */
    CUDA_CHECK(cudaStreamCreateWithFlags(&c->stream, cudaStreamDefault));
    c->own_stream = 1;
  }
  CUDA_CHECK(cudaEventCreateWithFlags(&c->done, cudaEventDisableTiming));
  int sms = 0, per_sm = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount,
                                    c->device));
  CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
      &per_sm, stats_chunk_kernel, STATS_THREADS, 0));
  c->target = (unsigned int)(sms > 0 ? sms : 1) * (per_sm > 0 ? per_sm : 1);
  c->arena = 4 * c->max_tensors;
  c->part_cap = c->max_tensors + c->target;
  CUDA_CHECK(cudaMallocHost((void **)&c->h_desc, c->arena * sizeof *c->h_desc));
  /* the kernel writes the records into host memory: no copy back */
  CUDA_CHECK(cudaHostAlloc((void **)&c->h_res, c->arena * sizeof *c->h_res,
                           cudaHostAllocMapped));
  CUDA_CHECK(cudaHostGetDevicePointer((void **)&c->d_res, c->h_res, 0));
  CUDA_CHECK(cudaMalloc((void **)&c->d_desc, c->arena * sizeof *c->d_desc));
  CUDA_CHECK(cudaMalloc((void **)&c->d_arrived, c->arena * sizeof *c->d_arrived));
  CUDA_CHECK(cudaMemset(c->d_arrived, 0, c->arena * sizeof *c->d_arrived));
  CUDA_CHECK(cudaMalloc((void **)&c->d_part, c->part_cap * sizeof *c->d_part));
  c->pend = (stats_pending *)calloc(c->arena, sizeof *c->pend);
  if (!c->pend) return PROBE_ERR_NOMEM;
  return PROBE_OK;
}

extern "C" probe_status probe_cuda_stats_create(probe_cuda_stats **out,
                                                void *stream,
                                                size_t max_tensors) {
  nvtx_scope range("probe_cuda_stats_create");
  if (!out) return PROBE_ERR_INVALID_ARG;
  *out = NULL;
  if (max_tensors == 0 || max_tensors > (1u << 20)) return PROBE_ERR_INVALID_ARG;
  int ndev = 0;
  cudaError_t err = cudaGetDeviceCount(&ndev);
  if (err != cudaSuccess || ndev == 0) {
    (void)cudaGetLastError();
    if (err == cudaSuccess) err = cudaErrorNoDevice;
    cuda_fail_(err, "cudaGetDeviceCount(&ndev)", __FILE__, __LINE__);
    return PROBE_ERR_NO_DEVICE;
  }
  probe_cuda_stats *c = (probe_cuda_stats *)calloc(1, sizeof *c);
  if (!c) return PROBE_ERR_NOMEM;
  c->max_tensors = max_tensors;
  probe_status st = ctx_alloc(c, stream);
  if (st != PROBE_OK) {
    probe_cuda_stats_destroy(c);
    return st;
  }
  *out = c;
  return PROBE_OK;
}

extern "C" void probe_cuda_stats_destroy(probe_cuda_stats *c) {
  if (!c) return;
  nvtx_scope range("probe_cuda_stats_destroy");
  /* Work in flight still writes into our buffers: let it finish first. */
  if (c->stream && c->npend) cudaStreamSynchronize(c->stream);
  if (c->d_part) cudaFree(c->d_part);
  if (c->d_arrived) cudaFree(c->d_arrived);
  if (c->d_desc) cudaFree(c->d_desc);
  if (c->h_res) cudaFreeHost(c->h_res);
  if (c->h_desc) cudaFreeHost(c->h_desc);
  if (c->done) cudaEventDestroy(c->done);
  if (c->own_stream && c->stream) cudaStreamDestroy(c->stream);
  (void)cudaGetLastError();
  free(c->pend);
  free(c);
}

/* Waits for every batch and hands the records to their callers. */
static probe_status ctx_drain(probe_cuda_stats *c) {
  if (c->npend == 0) return PROBE_OK;
  cudaError_t err = cudaEventRecord(c->done, c->stream);
  if (err == cudaSuccess) err = cudaEventSynchronize(c->done);
  if (err == cudaSuccess) {
    for (size_t i = 0; i < c->npend; i++)
      memcpy(c->pend[i].out, c->h_res + c->pend[i].off,
             c->pend[i].count * sizeof *c->h_res);
  }
  c->npend = 0; /* on failure the records are lost, and said to be */
  c->used = 0;
  if (err != cudaSuccess)
    return cuda_fail_(err, "cudaEventRecord/Synchronize(c->done)", __FILE__, __LINE__);
  return PROBE_OK;
}

/* Chunks per tensor: about the tensor's share of one full wave of blocks,
 * at most one per CHUNK_MIN_ELEMS, at least one per CHUNK_MAX_ELEMS. The sum
 * over a batch is at most count + target unless the batch holds more than
 * target * 2^23 elements. */
static unsigned long long chunks_for(unsigned long long n,
                                     unsigned long long total,
                                     unsigned int target) {
  if (n == 0) return 0;
  unsigned long long want = (n + CHUNK_MIN_ELEMS - 1) / CHUNK_MIN_ELEMS;
  /* ceil(target * n / total) without overflow: n / total <= 1 */
  unsigned long long share =
      (unsigned long long)((double)target * ((double)n / (double)total)) + 1;
  unsigned long long k = want < share ? want : share;
  unsigned long long floor_k = (n + CHUNK_MAX_ELEMS - 1) / CHUNK_MAX_ELEMS;
  return k > floor_k ? k : floor_k;
}

/* A tensor's dtype as the integer the C caller stored: reading an enum
 * object that holds a value outside the enumerators is undefined in C++, and
 * C callers may pass any int. */
static unsigned int tensor_dtype(const probe_cuda_tensor *t) {
  int v;
  static_assert(sizeof v == sizeof t->dtype, "probe_dtype is int-sized");
  memcpy(&v, &t->dtype, sizeof v);
  return (unsigned int)v;
}

/* Bytes per element of a dtype code; 0 when it is not one. */
static unsigned int dtype_bytes(unsigned int dt) {
  return dt == PROBE_DTYPE_F32 ? 4u
         : (dt == PROBE_DTYPE_F16 || dt == PROBE_DTYPE_BF16) ? 2u : 0u;
}

/* The record of a tensor with no element, as the merge would write it. */
static void empty_record(probe_stats *o) {
  const uint32_t qnan_bits = 0x7fc00000u;
  float qnan;
  memcpy(&qnan, &qnan_bits, sizeof qnan);
  memset(o, 0, sizeof *o);
  o->min = o->max = o->absmax = o->absmin_nonzero = qnan;
}

/* One launch for tensors[0..count), count <= max_tensors. */
static probe_status stats_launch(probe_cuda_stats *c,
                                 const probe_cuda_tensor *tensors, size_t count,
                                 probe_stats *out) {
  nvtx_scope range("probe_cuda_stats_launch");
  if (c->used + count > c->arena) { /* arena full: settle earlier batches */
    probe_status st = ctx_drain(c);
    if (st != PROBE_OK) return st;
  }
  const size_t off = c->used;
  stats_desc *hd = c->h_desc + off;
  unsigned long long total = 0, blocks = 0;
  for (size_t i = 0; i < count; i++) total += tensors[i].n;
  for (size_t i = 0; i < count; i++) {
    const probe_cuda_tensor *t = &tensors[i];
    unsigned int esz = dtype_bytes(tensor_dtype(t));
    unsigned long long n = t->n;
    uintptr_t addr = (uintptr_t)t->data;
    unsigned long long head = ((16u - (addr & 15u)) & 15u) / esz;
    if (head > n) head = n;
    unsigned long long k = chunks_for(n, total, c->target);
    hd[i].data = t->data;
    hd[i].n = n;
    hd[i].head = (unsigned int)head;
    hd[i].nvec = (n - head) / (16u / esz);
    hd[i].dtype = tensor_dtype(t);
    hd[i].chunk_first = (unsigned int)blocks;
    hd[i].nchunks = (unsigned int)k;
    blocks += k;
  }
  if (blocks > 0x7fffffffull) return PROBE_ERR_INVALID_ARG;
  if (blocks > c->part_cap) { /* only past target * 2^23 elements */
    CUDA_CHECK(cudaStreamSynchronize(c->stream));
    CUDA_CHECK(cudaFree(c->d_part));
    c->d_part = NULL;
    c->part_cap = 0;
    CUDA_CHECK(cudaMalloc((void **)&c->d_part, blocks * sizeof *c->d_part));
    c->part_cap = blocks;
  }
  for (size_t i = 0; i < count; i++)
    if (hd[i].nchunks == 0) empty_record(&c->h_res[off + i]); /* no block */
  if (blocks > 0) {
    stats_desc_inline inl;
    memset(&inl, 0, sizeof inl);
    if (count <= STATS_INLINE) {
      memcpy(inl.d, hd, count * sizeof *hd);
    } else {
      CUDA_CHECK(cudaMemcpyAsync(c->d_desc + off, hd, count * sizeof *hd,
                                 cudaMemcpyHostToDevice, c->stream));
    }
    PROBE_LAUNCH(stats_chunk_kernel, (unsigned int)blocks, STATS_THREADS,
                 c->stream, inl, c->d_desc + off, (unsigned int)count,
                 c->d_part, c->d_arrived + off, c->d_res + off);
    CUDA_CHECK(cudaGetLastError());
  }
  c->pend[c->npend].out = out;
  c->pend[c->npend].off = off;
  c->pend[c->npend].count = count;
  c->npend++;
  c->used += count;
  return PROBE_OK;
}

extern "C" probe_status probe_cuda_stats_enqueue(probe_cuda_stats *c,
                                                 const probe_cuda_tensor *tensors,
                                                 size_t count,
                                                 probe_stats *out) {
  nvtx_scope range("probe_cuda_stats_enqueue");
  if (!c) return PROBE_ERR_INVALID_ARG;
  if (count == 0) return PROBE_OK;
  if (!tensors || !out) return PROBE_ERR_INVALID_ARG;
  for (size_t i = 0; i < count; i++) {
    size_t esz = dtype_bytes(tensor_dtype(&tensors[i]));
    if (esz == 0) return PROBE_ERR_INVALID_ARG;
    if (tensors[i].n > 0 &&
        (!tensors[i].data || (uintptr_t)tensors[i].data % esz != 0))
      return PROBE_ERR_INVALID_ARG;
  }
  device_scope dev(c->device);
  if (dev.err != cudaSuccess)
    return cuda_fail_(dev.err, "cudaSetDevice(c->device)", __FILE__, __LINE__);
  for (size_t i = 0; i < count; i += c->max_tensors) {
    size_t k = count - i < c->max_tensors ? count - i : c->max_tensors;
    probe_status st = stats_launch(c, tensors + i, k, out + i);
    if (st != PROBE_OK) return st;
  }
  return PROBE_OK;
}

extern "C" probe_status probe_cuda_stats_wait(probe_cuda_stats *c) {
  nvtx_scope range("probe_cuda_stats_wait");
  if (!c) return PROBE_ERR_INVALID_ARG;
  return ctx_drain(c);
}
