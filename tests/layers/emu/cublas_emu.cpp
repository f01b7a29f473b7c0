/*
 * emu/cublas_emu.cpp - the CPU cuBLAS stand-in declared in emu/cublas_v2.h.
 */
#include "cublas_v2.h"

#include <stdint.h>
#include <stdlib.h>

#include "ampprobe/numerics.h"

struct emu_cublas {
  int math;
};

extern "C" {

cublasStatus_t emu_cublasCreate(cublasHandle_t *h) {
  if (!h)
    return CUBLAS_STATUS_INVALID_VALUE;
  *h = (cublasHandle_t)calloc(1, sizeof(struct emu_cublas));
  return *h ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_ALLOC_FAILED;
}

cublasStatus_t emu_cublasDestroy(cublasHandle_t h) {
  free(h);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t emu_cublasSetStream(cublasHandle_t h, cudaStream_t s) {
  (void)s;
  return h ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_NOT_INITIALIZED;
}

cublasStatus_t emu_cublasSetMathMode(cublasHandle_t h, cublasMath_t m) {
  if (!h)
    return CUBLAS_STATUS_NOT_INITIALIZED;
  h->math = (int)m;
  return CUBLAS_STATUS_SUCCESS;
}

static int imax1(int a) { return a > 1 ? a : 1; }

static float load(const void *p, cudaDataType t, long long i) {
  switch (t) {
  case CUDA_R_16F:
    return probe_f16_to_f32(((const uint16_t *)p)[i]);
  case CUDA_R_16BF:
    return probe_bf16_to_f32(((const uint16_t *)p)[i]);
  default:
    return ((const float *)p)[i];
  }
}

static void store(void *p, cudaDataType t, long long i, float v) {
  switch (t) {
  case CUDA_R_16F:
    ((uint16_t *)p)[i] = probe_f32_to_f16(v);
    break;
  case CUDA_R_16BF:
    ((uint16_t *)p)[i] = probe_f32_to_bf16(v);
    break;
  default:
    ((float *)p)[i] = v;
  }
}

cublasStatus_t emu_cublasGemmStridedBatchedEx(
    cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
    int k, const void *alpha, const void *A, cudaDataType at, int lda,
    long long sA, const void *B, cudaDataType bt, int ldb, long long sB,
    const void *beta, void *C, cudaDataType ct, int ldc, long long sC,
    int batch, cublasComputeType_t compute, cublasGemmAlgo_t algo) {
  (void)algo;
  if (!h)
    return CUBLAS_STATUS_NOT_INITIALIZED;
  if (m < 0 || n < 0 || k < 0 || batch < 0 || !alpha || !beta ||
      compute != CUBLAS_COMPUTE_32F || at != bt)
    return CUBLAS_STATUS_INVALID_VALUE;
  int ra = ta == CUBLAS_OP_N ? m : k, rb = tb == CUBLAS_OP_N ? k : n;
  if (ldc < imax1(m) || lda < imax1(ra) || ldb < imax1(rb))
    return CUBLAS_STATUS_INVALID_VALUE;
  float al = *(const float *)alpha, be = *(const float *)beta;
  for (int b = 0; b < batch; b++)
    for (int j = 0; j < n; j++)
      for (int i = 0; i < m; i++) {
        float acc = 0.0f;
        for (int l = 0; l < k; l++) {
          long long ia = ta == CUBLAS_OP_N ? i + (long long)l * lda
                                           : l + (long long)i * lda;
          long long ib = tb == CUBLAS_OP_N ? l + (long long)j * ldb
                                           : j + (long long)l * ldb;
          acc += load(A, at, b * sA + ia) * load(B, bt, b * sB + ib);
        }
        long long ic = b * sC + i + (long long)j * ldc;
        float v = al * acc;
        if (be != 0.0f)
          v += be * load(C, ct, ic);
        store(C, ct, ic, v);
      }
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t
emu_cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb,
                 int m, int n, int k, const void *alpha, const void *A,
                 cudaDataType at, int lda, const void *B, cudaDataType bt,
                 int ldb, const void *beta, void *C, cudaDataType ct, int ldc,
                 cublasComputeType_t compute, cublasGemmAlgo_t algo) {
  return emu_cublasGemmStridedBatchedEx(h, ta, tb, m, n, k, alpha, A, at, lda,
                                        0, B, bt, ldb, 0, beta, C, ct, ldc, 0,
                                        1, compute, algo);
}

} /* extern "C" */
