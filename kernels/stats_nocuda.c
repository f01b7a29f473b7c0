/*
 * stats_nocuda.c - the CUDA section of include/ampprobe/numerics.h for builds
 * without CUDA (-DAMPPROBE_CUDA=OFF or no nvcc). Nothing is available: the
 * queries answer 0 and the statistics calls return PROBE_ERR_UNSUPPORTED, so
 * callers fall back to the host kernels. kernels/stats_cuda.cu replaces this
 * file when CUDA is built.
 */
#include "ampprobe/numerics.h"

int probe_cuda_available(void) { return 0; }

int probe_cuda_is_device_ptr(const void *ptr) {
  (void)ptr;
  return 0;
}

probe_status probe_cuda_stats_create(probe_cuda_stats **out, void *stream,
                                     size_t max_tensors) {
  (void)stream;
  (void)max_tensors;
  if (out) *out = NULL;
  return PROBE_ERR_UNSUPPORTED;
}

void probe_cuda_stats_destroy(probe_cuda_stats *ctx) { (void)ctx; }

probe_status probe_cuda_stats_enqueue(probe_cuda_stats *ctx,
                                      const probe_cuda_tensor *tensors,
                                      size_t count, probe_stats *out) {
  (void)ctx;
  (void)tensors;
  (void)count;
  (void)out;
  return PROBE_ERR_UNSUPPORTED;
}

probe_status probe_cuda_stats_wait(probe_cuda_stats *ctx) {
  (void)ctx;
  return PROBE_ERR_UNSUPPORTED;
}

const char *probe_cuda_last_error(void) { return "built without CUDA"; }
