/*
 * gpu.h - private: what the writer needs from CUDA beyond the statistics
 * kernels: device-to-host copies for snapshots, NVTX ranges and CUPTI kernel
 * activity. gpu_cuda.c implements it with CUDA; gpu_none.c is the build
 * without CUDA, where every call is a no-op or returns
 * PROBE_ERR_UNSUPPORTED.
 */
#ifndef AMPPROBE_LIBPROBE_GPU_H
#define AMPPROBE_LIBPROBE_GPU_H

#include <stddef.h>
#include <stdint.h>

#include "ampprobe/probe.h"

/* Synchronous copy of `bytes` from device memory src to host memory dst. */
probe_status probe__gpu_copy_to_host(void *dst, const void *src, size_t bytes);

/* NVTX range named `name` on the calling thread (no-op without CUDA). */
void probe__nvtx_push(const char *name);
void probe__nvtx_pop(void);

/* CUPTI activity collection: one collector per process (CUPTI's callbacks
 * carry no user pointer). Start fails with PROBE_ERR_NO_DEVICE without a
 * usable GPU, PROBE_ERR_STATE when a collector is already running. */
typedef struct probe__cupti probe__cupti;
probe_status probe__cupti_start(probe__cupti **out);
/* Attribute kernels launched from now on to `external_id` (nestable). */
void probe__cupti_push(probe__cupti *c, uint64_t external_id);
void probe__cupti_pop(probe__cupti *c);
/* Flushes CUPTI's buffers and hands over the kernels completed so far, as
 * records whose step/layer/site are decoded from the external ids with
 * probe__cupti_decode. *recs is malloc'ed; the caller frees it. */
probe_status probe__cupti_collect(probe__cupti *c, probe_kernel_record **recs,
                                  size_t *n);
void probe__cupti_stop(probe__cupti *c);

/* External id of (step, layer, site): (step+1) << 24 | (layer+1) << 8 |
 * site, so that 0 means "no range". */
static inline uint64_t probe__cupti_encode(int64_t step, int32_t layer,
                                           int32_t site) {
  return ((uint64_t)(step + 1) << 24) | ((uint64_t)(layer + 1) << 8) |
         (uint64_t)(site & 0xff);
}

static inline void probe__cupti_decode(uint64_t id, probe_kernel_record *k) {
  if (id == 0) {
    k->step = -1;
    k->layer = -1;
    k->site = -1;
    return;
  }
  k->step = (int64_t)(id >> 24) - 1;
  k->layer = (int32_t)((id >> 8) & 0xffff) - 1;
  k->site = (int32_t)(id & 0xff);
}

#endif /* AMPPROBE_LIBPROBE_GPU_H */
