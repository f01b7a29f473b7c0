/*
 * gpu_none.c - the gpu.h interface in builds without CUDA: no device
 * memory can exist, NVTX ranges are no-ops, and CUPTI is unavailable.
 */
#include <stdlib.h>

#include "gpu.h"

probe_status probe__gpu_copy_to_host(void *dst, const void *src,
                                     size_t bytes) {
  return PROBE_ERR_UNSUPPORTED;
}

void probe__nvtx_push(const char *name) {}
void probe__nvtx_pop(void) {}

probe_status probe__cupti_start(probe__cupti **out) {
  *out = NULL;
  return PROBE_ERR_UNSUPPORTED;
}
void probe__cupti_push(probe__cupti *c, uint64_t external_id) {}
void probe__cupti_pop(probe__cupti *c) {}
probe_status probe__cupti_collect(probe__cupti *c, probe_kernel_record **recs,
                                  size_t *n) {
  *recs = NULL;
  *n = 0;
  return PROBE_ERR_UNSUPPORTED;
}
void probe__cupti_stop(probe__cupti *c) {}
