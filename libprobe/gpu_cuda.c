/*
 * gpu_cuda.c - the gpu.h interface with CUDA: snapshot copies with
 * cudaMemcpy, NVTX ranges (NVTX3, header-only), and kernel activity from
 * CUPTI's activity API.
 *
 * CUPTI: kernels (CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) carry a correlation
 * id; external-correlation records map it to the id pushed with
 * cuptiActivityPushExternalCorrelationId while a probe range was open, which
 * encodes (step, layer, site) (gpu.h). CUPTI writes an external-correlation
 * record only before an API record (cupti_activity.h), so the runtime and
 * driver API kinds are enabled too and their records dropped: without them
 * no kernel had a range (seen on an H200, 2026-12-04, test_gpu_probe).
 * CUPTI hands completed buffers to a
 * callback on its own thread with no user pointer, so the collector is one
 * process-wide object guarded by a mutex.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>
#include <cupti.h>
#include <nvtx3/nvToolsExt.h>

#include "gpu.h"

probe_status probe__gpu_copy_to_host(void *dst, const void *src,
                                     size_t bytes) {
  if (cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost) != cudaSuccess)
    return PROBE_ERR_CUDA;
  return PROBE_OK;
}

void probe__nvtx_push(const char *name) { nvtxRangePushA(name); }
void probe__nvtx_pop(void) { nvtxRangePop(); }

/* ---- CUPTI ---------------------------------------------------------------- */

typedef struct corr_pair {
  uint32_t correlation;
  uint64_t external;
} corr_pair;

typedef struct raw_kernel {
  probe_kernel_record rec; /* step/layer/site filled at collect */
  uint32_t correlation;
} raw_kernel;

struct probe__cupti {
  raw_kernel *k; /* (nk) */
  size_t nk, capk;
  corr_pair *c; /* (nc) */
  size_t nc, capc;
};

/* The one collector, or NULL; g_mu guards it and its contents. */
static probe__cupti *g_cupti;
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;

#define PROBE__CUPTI_BUF (1u << 20)
#define PROBE__CUPTI_KEEP 4096

static void CUPTIAPI buffer_requested(uint8_t **buffer, size_t *size,
                                      size_t *max_records) {
  *buffer = aligned_alloc(8, PROBE__CUPTI_BUF);
  *size = *buffer ? PROBE__CUPTI_BUF : 0;
  *max_records = 0;
}

static void add_kernel(probe__cupti *c, const CUpti_ActivityKernel10 *k) {
  if (c->nk == c->capk) {
    size_t cap = c->capk ? c->capk * 2 : 256;
    raw_kernel *p = realloc(c->k, cap * sizeof *p);
    if (p == NULL) return;
    c->k = p;
    c->capk = cap;
  }
  raw_kernel *r = &c->k[c->nk++];
  memset(r, 0, sizeof *r);
  if (k->name) {
    strncpy(r->rec.name, k->name, PROBE_KERNEL_NAME_MAX - 1);
  }
  r->rec.start_ns = k->start;
  r->rec.end_ns = k->end;
  r->rec.device = (int32_t)k->deviceId;
  r->rec.stream = k->streamId;
  r->correlation = k->correlationId;
}

static void add_corr(probe__cupti *c,
                     const CUpti_ActivityExternalCorrelation *e) {
  if (c->nc == c->capc) {
    size_t cap = c->capc ? c->capc * 2 : 256;
    corr_pair *p = realloc(c->c, cap * sizeof *p);
    if (p == NULL) return;
    c->c = p;
    c->capc = cap;
  }
  c->c[c->nc++] = (corr_pair){e->correlationId, e->externalId};
}

static void CUPTIAPI buffer_completed(CUcontext ctx, uint32_t stream,
                                      uint8_t *buffer, size_t size,
                                      size_t valid) {
  CUpti_Activity *rec = NULL;
  pthread_mutex_lock(&g_mu);
  probe__cupti *c = g_cupti;
  while (c && cuptiActivityGetNextRecord(buffer, valid, &rec) ==
                  CUPTI_SUCCESS) {
    if (rec->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL ||
        rec->kind == CUPTI_ACTIVITY_KIND_KERNEL)
      add_kernel(c, (const CUpti_ActivityKernel10 *)rec);
    else if (rec->kind == CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION)
      add_corr(c, (const CUpti_ActivityExternalCorrelation *)rec);
  }
  pthread_mutex_unlock(&g_mu);
  free(buffer);
}

probe_status probe__cupti_start(probe__cupti **out) {
  *out = NULL;
  if (g_cupti) return PROBE_ERR_STATE;
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0)
    return PROBE_ERR_NO_DEVICE;
  probe__cupti *c = calloc(1, sizeof *c);
  if (c == NULL) return PROBE_ERR_NOMEM;
  pthread_mutex_lock(&g_mu);
  g_cupti = c;
  pthread_mutex_unlock(&g_mu);
  if (cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed) !=
          CUPTI_SUCCESS ||
      cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) !=
          CUPTI_SUCCESS ||
      cuptiActivityEnable(CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION) !=
          CUPTI_SUCCESS ||
      cuptiActivityEnable(CUPTI_ACTIVITY_KIND_RUNTIME) != CUPTI_SUCCESS ||
      cuptiActivityEnable(CUPTI_ACTIVITY_KIND_DRIVER) != CUPTI_SUCCESS) {
    probe__cupti_stop(c);
    return PROBE_ERR_CUDA;
  }
  *out = c;
  return PROBE_OK;
}

void probe__cupti_push(probe__cupti *c, uint64_t external_id) {
  if (c)
    cuptiActivityPushExternalCorrelationId(
        CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0, external_id);
}

void probe__cupti_pop(probe__cupti *c) {
  uint64_t id = 0;
  if (c)
    cuptiActivityPopExternalCorrelationId(
        CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0, &id);
}

static int corr_cmp(const void *a, const void *b) {
  uint32_t x = ((const corr_pair *)a)->correlation;
  uint32_t y = ((const corr_pair *)b)->correlation;
  return (x > y) - (x < y);
}

probe_status probe__cupti_collect(probe__cupti *c, probe_kernel_record **recs,
                                  size_t *n) {
  *recs = NULL;
  *n = 0;
  if (c == NULL) return PROBE_ERR_STATE;
  cuptiActivityFlushAll(0);
  pthread_mutex_lock(&g_mu);
  probe_status st = PROBE_OK;
  probe_kernel_record *out = c->nk ? malloc(c->nk * sizeof *out) : NULL;
  uint8_t *used = c->nc ? calloc(c->nc, 1) : NULL;
  if ((c->nk && out == NULL) || (c->nc && used == NULL)) {
    st = PROBE_ERR_NOMEM;
    free(out);
    out = NULL;
  } else {
    qsort(c->c, c->nc, sizeof *c->c, corr_cmp);
    for (size_t i = 0; i < c->nk; i++) {
      out[i] = c->k[i].rec;
      corr_pair key = {c->k[i].correlation, 0};
      corr_pair *hit =
          c->nc ? bsearch(&key, c->c, c->nc, sizeof *c->c, corr_cmp) : NULL;
      if (hit) used[hit - c->c] = 1;
      probe__cupti_decode(hit ? hit->external : 0, &out[i]);
    }
    *recs = out;
    *n = c->nk;
  }
  /* A kernel's correlation record may arrive in an earlier batch than the
   * kernel: keep the unmatched pairs (most are API calls that launch
   * nothing), at most the newest PROBE__CUPTI_KEEP. */
  size_t keep = 0;
  for (size_t i = 0; used && i < c->nc; i++)
    if (!used[i]) c->c[keep++] = c->c[i];
  if (keep > PROBE__CUPTI_KEEP) {
    memmove(c->c, c->c + (keep - PROBE__CUPTI_KEEP),
            PROBE__CUPTI_KEEP * sizeof *c->c);
    keep = PROBE__CUPTI_KEEP;
  }
  c->nc = keep;
  c->nk = 0;
  free(used);
  pthread_mutex_unlock(&g_mu);
  return st;
}

void probe__cupti_stop(probe__cupti *c) {
  if (c == NULL) return;
  cuptiActivityFlushAll(0);
  cuptiActivityDisable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
  cuptiActivityDisable(CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION);
  cuptiActivityDisable(CUPTI_ACTIVITY_KIND_RUNTIME);
  cuptiActivityDisable(CUPTI_ACTIVITY_KIND_DRIVER);
  pthread_mutex_lock(&g_mu);
  g_cupti = NULL;
  pthread_mutex_unlock(&g_mu);
  free(c->k);
  free(c->c);
  free(c);
}
