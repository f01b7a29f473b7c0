/*
 * emu/cublas_v2.h - a CPU stand-in for the part of cuBLAS that
 * kernels/layers/layers_cuda.cu uses (handle, stream, math mode, GemmEx and
 * GemmStridedBatchedEx with 32F/16F/16BF operands and 32F compute), so the
 * CUDA layer code runs on machines without a GPU on top of the CUDA runtime
 * emulation in tests/gpu/emu (test layers_cuda_emu).
 *
 * The GEMM follows cuBLAS's column-major definition exactly:
 * C = alpha op(A) op(B) + beta C, products summed in float in k order, the
 * result converted to C's type with round to nearest even. Every name is
 * mapped to emu_* so nothing clashes with a real libcublas. Also supplies
 * the double atomicAdd the layer kernels use.
 */
#ifndef AMPPROBE_EMU_CUBLAS_V2_H
#define AMPPROBE_EMU_CUBLAS_V2_H

#include "cuda_runtime_api.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
  CUBLAS_STATUS_SUCCESS = 0,
  CUBLAS_STATUS_NOT_INITIALIZED = 1,
  CUBLAS_STATUS_ALLOC_FAILED = 3,
  CUBLAS_STATUS_INVALID_VALUE = 7,
  CUBLAS_STATUS_NOT_SUPPORTED = 15
} cublasStatus_t;
typedef enum { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1 } cublasOperation_t;
typedef enum { CUDA_R_32F = 0, CUDA_R_16F = 2, CUDA_R_16BF = 14 } cudaDataType;
typedef enum { CUBLAS_COMPUTE_32F = 68 } cublasComputeType_t;
typedef enum { CUBLAS_GEMM_DEFAULT = -1 } cublasGemmAlgo_t;
typedef enum { CUBLAS_DEFAULT_MATH = 0, CUBLAS_PEDANTIC_MATH = 2 } cublasMath_t;
typedef struct emu_cublas *cublasHandle_t;

#define cublasCreate emu_cublasCreate
#define cublasDestroy emu_cublasDestroy
#define cublasSetStream emu_cublasSetStream
#define cublasSetMathMode emu_cublasSetMathMode
#define cublasGemmEx emu_cublasGemmEx
#define cublasGemmStridedBatchedEx emu_cublasGemmStridedBatchedEx

cublasStatus_t cublasCreate(cublasHandle_t *h);
cublasStatus_t cublasDestroy(cublasHandle_t h);
cublasStatus_t cublasSetStream(cublasHandle_t h, cudaStream_t s);
cublasStatus_t cublasSetMathMode(cublasHandle_t h, cublasMath_t m);
cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta,
                            cublasOperation_t tb, int m, int n, int k,
                            const void *alpha, const void *A, cudaDataType at,
                            int lda, const void *B, cudaDataType bt, int ldb,
                            const void *beta, void *C, cudaDataType ct, int ldc,
                            cublasComputeType_t compute, cublasGemmAlgo_t algo);
cublasStatus_t cublasGemmStridedBatchedEx(
    cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
    int k, const void *alpha, const void *A, cudaDataType at, int lda,
    long long sA, const void *B, cudaDataType bt, int ldb, long long sB,
    const void *beta, void *C, cudaDataType ct, int ldc, long long sC,
    int batch, cublasComputeType_t compute, cublasGemmAlgo_t algo);

#ifdef __cplusplus
}

/* device atomics on double (one OS thread runs every emulated thread) */
inline double atomicAdd(double *p, double v) {
  double old = *p;
  *p = old + v;
  return old;
}
#endif

#endif
