/*
 * layers_cuda.cu - the CUDA backend of the trainer's layer kernels: the
 * table of operations probe__cuda_layer_ops() (ampprobe/layers.h, reached
 * through probe_layers_backend_init), same arguments as the CPU reference in
 * layers_cpu.c after a context; every array is device memory. The
 * per-element math is the shared code of layers-impl.h, called from one
 * thread per element/row/column. See docs/precision.md.
 *
 * GEMMs: cublasGemmEx / cublasGemmStridedBatchedEx with CUBLAS_COMPUTE_32F.
 * In FP16 (BF16) mode the operands are converted to CUDA_R_16F (CUDA_R_16BF)
 * scratch buffers - the conversion is the rounding on entry - and the result
 * is CUDA_R_16F where it is the materialised tensor itself; where an FP32
 * epilogue follows before the single rounding (the bias of a linear forward)
 * the result is CUDA_R_32F and the epilogue kernel rounds. FP32 mode uses
 * CUDA_R_32F throughout (no TF32). Other ops are kernels doing the CPU's
 * per-element rounding; reductions run one thread per row/column/series in
 * the CPU's order, so with -fmad=false they agree with the CPU to the last
 * bit except where a GEMM's summation order differs.
 *
 * cuBLAS is opened (dlopen) when the first context is created, not linked:
 * loading libcublas and libcublasLt costs ~0.3 s and ~210 MB of resident
 * memory, which every run of the ampprobe CLI paid, postmortem and --help
 * included. Its six functions are called through blas_api. A build against
 * an emulated cuBLAS (tests/layers/emu, AMPPROBE_CUBLAS_LINKED) links them.
 */
#include <cublas_v2.h>
#include <cuda_runtime.h>
#ifndef AMPPROBE_CUBLAS_LINKED
#include <dlfcn.h>
#endif
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ampprobe/layers.h"
#include "ampprobe/numerics.h"
#include "layers-backend.h"
#include "layers-impl.h"

/* ---- cuBLAS, opened on first use ------------------------------------------ */

typedef struct blas_api {
  decltype(&cublasCreate) create;
  decltype(&cublasDestroy) destroy;
  decltype(&cublasSetStream) set_stream;
  decltype(&cublasSetMathMode) set_math_mode;
  /* spelt out: in C++ the header overloads both (cudaDataType compute) */
  cublasStatus_t (*gemm)(cublasHandle_t, cublasOperation_t, cublasOperation_t,
                         int, int, int, const void *, const void *,
                         cudaDataType, int, const void *, cudaDataType, int,
                         const void *, void *, cudaDataType, int,
                         cublasComputeType_t, cublasGemmAlgo_t);
  cublasStatus_t (*gemm_batched)(cublasHandle_t, cublasOperation_t,
                                 cublasOperation_t, int, int, int,
                                 const void *, const void *, cudaDataType, int,
                                 long long, const void *, cudaDataType, int,
                                 long long, const void *, void *, cudaDataType,
                                 int, long long, int, cublasComputeType_t,
                                 cublasGemmAlgo_t);
} blas_api;

#define BLAS_STR_(x) #x
#define BLAS_STR(x) BLAS_STR_(x)

static blas_api blas;        /* all set, or all NULL */
static char blas_why[200];   /* why the load failed: "" when it did not */

/* Fills blas (once; the C++ static's initialisation is thread-safe).
 * Returns 1 when every function is there. */
static int blas_load(void) {
  static const int ok = [] {
#ifdef AMPPROBE_CUBLAS_LINKED
    blas.create = &cublasCreate;
    blas.destroy = &cublasDestroy;
    blas.set_stream = &cublasSetStream;
    blas.set_math_mode = &cublasSetMathMode;
    blas.gemm = &cublasGemmEx; /* the overload of the member's type */
    blas.gemm_batched = &cublasGemmStridedBatchedEx;
    return 1;
#else
    /* the major version this file was compiled against, as the runtime's
     * loader names it; then the file configure found, for a library
     * outside the loader's search path */
    const char *names[] = {"libcublas.so." BLAS_STR(CUBLAS_VER_MAJOR),
#ifdef AMPPROBE_CUBLAS_PATH
                           AMPPROBE_CUBLAS_PATH,
#endif
                           NULL};
    void *h = NULL;
    const char *name = names[0]; /* the one loaded, or the first tried */
    for (int i = 0; names[i] && !h; i++) {
      h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
      if (h) {
        name = names[i];
      } else if (i == 0) {
        const char *d = dlerror();
        snprintf(blas_why, sizeof blas_why, "cannot load %s: %.150s", names[0],
                 d ? d : "not found");
      }
    }
    if (!h) return 0;
    /* the fallback file may be another toolkit's: its major version must be
     * the headers' (the functions' types and enums are theirs) */
    typedef cublasStatus_t (*get_property_fn)(libraryPropertyType, int *);
    void *gp = dlsym(h, "cublasGetProperty");
    get_property_fn get_property;
    memcpy(&get_property, &gp, sizeof gp);
    int major = -1;
    if (!get_property || get_property(MAJOR_VERSION, &major) != CUBLAS_STATUS_SUCCESS ||
        major != CUBLAS_VER_MAJOR) {
      snprintf(blas_why, sizeof blas_why, "%.120s is cuBLAS %d, built for %d", name,
               major, CUBLAS_VER_MAJOR);
      dlclose(h);
      return 0;
    }
    blas_api a;
    int all = 1;
#define BLAS_SYM(field, sym)                                                   \
  do {                                                                         \
    void *f_ = dlsym(h, sym);                                                  \
    if (!f_ && all) {                                                          \
      snprintf(blas_why, sizeof blas_why, "%.120s has no %s", name, sym);      \
      all = 0;                                                                 \
    }                                                                          \
    memcpy(&a.field, &f_, sizeof f_);                                          \
  } while (0)
    BLAS_SYM(create, "cublasCreate_v2");
    BLAS_SYM(destroy, "cublasDestroy_v2");
    BLAS_SYM(set_stream, "cublasSetStream_v2");
    BLAS_SYM(set_math_mode, "cublasSetMathMode");
    BLAS_SYM(gemm, "cublasGemmEx");
    BLAS_SYM(gemm_batched, "cublasGemmStridedBatchedEx");
#undef BLAS_SYM
    if (!all) {
      dlclose(h);
      return 0;
    }
    blas_why[0] = '\0'; /* a later name loaded */
    blas = a;            /* kept open for the process's life; a failed
                            load is not retried (the answer is kept) */
    return 1;
#endif
  }();
  return ok;
}

extern "C" const char *probe__cuda_layers_error(void) {
  return blas_why[0] ? blas_why : NULL;
}

extern "C" int probe__cuda_blas_loadable(void) { return blas_load(); }

typedef struct cuda_ctx {
  cudaStream_t stream;
  cublasHandle_t blas;
  char *scratch; /* device bump allocator, grown on demand */
  size_t cap, used;
  double *d_acc; /* device accumulator for l2norm */
  int *d_flag;   /* device flag for grads_scale */
} cuda_ctx;

#define CUDA_TRY(call)                                                         \
  do {                                                                         \
    if ((call) != cudaSuccess)                                                 \
      return PROBE_ERR_CUDA;                                                   \
  } while (0)
#define CUBLAS_TRY(call)                                                       \
  do {                                                                         \
    if ((call) != CUBLAS_STATUS_SUCCESS)                                       \
      return PROBE_ERR_CUDA;                                                   \
  } while (0)
#define TRY(call)                                                              \
  do {                                                                         \
    probe_status st_ = (call);                                                 \
    if (st_ != PROBE_OK)                                                       \
      return st_;                                                              \
  } while (0)
#define CHECK_ARG(cond)                                                        \
  do {                                                                         \
    if (!(cond))                                                               \
      return PROBE_ERR_INVALID_ARG;                                            \
  } while (0)
#define PREC_OK(p)                                                             \
  ((p) == PROBE_DTYPE_F32 || (p) == PROBE_DTYPE_F16 || (p) == PROBE_DTYPE_BF16)
#define LAUNCHED() CUDA_TRY(cudaGetLastError())

/* Kernel launch; the CPU emulation used by the tests (tests/gpu/emu) defines
 * its own PROBE_LAUNCH before including this file. */
#ifndef PROBE_LAUNCH
#define PROBE_LAUNCH(kernel, grid, block, stream, ...)                         \
  kernel<<<(grid), (block), 0, (stream)>>>(__VA_ARGS__)
#endif

static const int TPB = 256;
static inline unsigned blocks(size_t n) {
  return (unsigned)((n + TPB - 1) / TPB);
}

/* ---- device helpers ------------------------------------------------------ */

__device__ __forceinline__ float drnd(float x, int p) { return pl_rnd(x, p); }

/* 16-bit encodings of the module precision */
__device__ __forceinline__ uint16_t denc(float x, int p) {
  return p == PROBE_DTYPE_BF16 ? probe_f32_to_bf16(x) : probe_f32_to_f16(x);
}
__device__ __forceinline__ float ddec(uint16_t h, int p) {
  return p == PROBE_DTYPE_BF16 ? probe_bf16_to_f32(h) : probe_f16_to_f32(h);
}

__global__ void k_round(float *out, const float *in, size_t n, int p) {
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (i < n)
    out[i] = drnd(in[i], p);
}

__global__ void k_encode(uint16_t *out, const float *in, size_t n, int p) {
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (i < n)
    out[i] = denc(in[i], p);
}

/* out(rows,cols) with leading dimension ld (=, or += when acc) from a 16-bit
 * matrix with the same layout. */
__global__ void k_decode(float *out, const uint16_t *in, int rows, int cols,
                         int ld, int acc, int p) {
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (i >= (size_t)rows * cols)
    return;
  size_t e = (i / cols) * (size_t)ld + i % cols;
  float v = ddec(in[e], p);
  out[e] = acc ? out[e] + v : v;
}

/* out(N,OC) = rnd(t + rnd(bias)) (bias may be NULL); out may equal t. */
__global__ void k_bias_round(float *out, const float *t, const float *bias,
                             int N, int OC, int p) {
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (i >= (size_t)N * OC)
    return;
  out[i] = pl_bias_round(t[i], bias, (int)(i % OC), p);
}

/* dst[j] += rnd(sum_n rnd(g[n,j])), one thread per column */
__global__ void k_colsum_acc(float *dst, const float *g, int N, int OC, int p) {
  int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= OC)
    return;
  pl_colsum_acc(dst, g, N, OC, j, p);
}

/* ---- context and scratch ------------------------------------------------- */

static void cuda_destroy(void *ctx) {
  cuda_ctx *c = (cuda_ctx *)ctx;
  if (!c)
    return;
  cudaStreamSynchronize(c->stream);
  if (c->blas)
    blas.destroy(c->blas);
  cudaFree(c->scratch);
  cudaFree(c->d_acc);
  cudaFree(c->d_flag);
  free(c);
}

extern "C" probe_status probe__cuda_layers_create(void **out, void *stream) {
  CHECK_ARG(out);
  *out = NULL;
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    cudaGetLastError();
    return PROBE_ERR_NO_DEVICE;
  }
  if (!blas_load())
    return PROBE_ERR_CUDA; /* probe__cuda_layers_error says why */
  cuda_ctx *c = (cuda_ctx *)calloc(1, sizeof *c);
  if (!c)
    return PROBE_ERR_NOMEM;
  c->stream = (cudaStream_t)stream;
  if (blas.create(&c->blas) != CUBLAS_STATUS_SUCCESS) {
    free(c);
    return PROBE_ERR_CUDA;
  }
  if (blas.set_stream(c->blas, c->stream) != CUBLAS_STATUS_SUCCESS ||
      blas.set_math_mode(c->blas, CUBLAS_PEDANTIC_MATH) !=
          CUBLAS_STATUS_SUCCESS ||
      cudaMalloc((void **)&c->d_acc, sizeof(double)) != cudaSuccess ||
      cudaMalloc((void **)&c->d_flag, sizeof(int)) != cudaSuccess) {
    cuda_destroy(c);
    return PROBE_ERR_CUDA;
  }
  *out = c;
  return PROBE_OK;
}

static probe_status cuda_sync(void *ctx) {
  cuda_ctx *c = (cuda_ctx *)ctx;
  CHECK_ARG(c);
  CUDA_TRY(cudaStreamSynchronize(c->stream));
  CUDA_TRY(cudaGetLastError());
  return PROBE_OK;
}

/* Zeroed device memory. */
static probe_status cuda_alloc(void *ctx, void **out, size_t bytes) {
  cuda_ctx *c = (cuda_ctx *)ctx;
  CHECK_ARG(c && out);
  *out = NULL;
  void *p = NULL;
  if (cudaMalloc(&p, bytes ? bytes : 1) != cudaSuccess) {
    cudaGetLastError();
    return PROBE_ERR_NOMEM;
  }
  if (cudaMemsetAsync(p, 0, bytes ? bytes : 1, c->stream) != cudaSuccess ||
      cudaStreamSynchronize(c->stream) != cudaSuccess) {
    cudaFree(p);
    return PROBE_ERR_CUDA;
  }
  *out = p;
  return PROBE_OK;
}

static void cuda_free(void *ctx, void *p) {
  (void)ctx;
  cudaFree(p);
}

/* Synchronous copy in either direction (unified addressing infers it). */
static probe_status cuda_copy(void *ctx, void *dst, const void *src,
                              size_t bytes) {
  cuda_ctx *c = (cuda_ctx *)ctx;
  CHECK_ARG(c && ((dst && src) || bytes == 0));
  if (bytes == 0)
    return PROBE_OK;
  CUDA_TRY(cudaStreamSynchronize(c->stream));
  CUDA_TRY(cudaMemcpy(dst, src, bytes, cudaMemcpyDefault));
  return PROBE_OK;
}

/* Makes room for `bytes` of scratch and resets the cursor. Ops reserve once,
 * before carving; a nested op (attention calling linear) runs only while the
 * caller holds no live scratch. */
static probe_status scratch_reserve(cuda_ctx *c, size_t bytes) {
  bytes += 8 * 256; /* alignment slack */
  if (bytes > c->cap) {
    CUDA_TRY(cudaStreamSynchronize(c->stream));
    cudaFree(c->scratch);
    c->scratch = NULL;
    c->cap = 0;
    size_t cap = bytes + bytes / 2;
    CUDA_TRY(cudaMalloc((void **)&c->scratch, cap));
    c->cap = cap;
  }
  c->used = 0;
  return PROBE_OK;
}

static void *scratch_take(cuda_ctx *c, size_t bytes) {
  void *p = c->scratch + c->used;
  c->used += (bytes + 255) & ~(size_t)255;
  return p;
}

/* ---- GEMM ---------------------------------------------------------------- */

static cudaDataType ab_type(probe_dtype p) {
  return p == PROBE_DTYPE_F32   ? CUDA_R_32F
         : p == PROBE_DTYPE_BF16 ? CUDA_R_16BF
                                : CUDA_R_16F;
}
static size_t esize(probe_dtype p) { return p == PROBE_DTYPE_F32 ? 4 : 2; }

/* Row-major C(M,N) = alpha op(A) op(B) + beta C, `batch` times with the given
 * element strides, like cblas_sgemm(CblasRowMajor, ...): computed as the
 * column-major C^T = op(B)^T op(A)^T. */
static probe_status gemm(cuda_ctx *c, int ta, int tb, int M, int N, int K,
                         float alpha, const void *A, int lda, long long sA,
                         const void *B, int ldb, long long sB, float beta,
                         void *C, int ldc, long long sC, int batch,
                         cudaDataType abt, cudaDataType ct) {
  cublasOperation_t opA = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  cublasOperation_t opB = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  if (batch == 1)
    CUBLAS_TRY(blas.gemm(c->blas, opB, opA, N, M, K, &alpha, B, abt, ldb, A,
                            abt, lda, &beta, C, ct, ldc, CUBLAS_COMPUTE_32F,
                            CUBLAS_GEMM_DEFAULT));
  else
    CUBLAS_TRY(blas.gemm_batched(
        c->blas, opB, opA, N, M, K, &alpha, B, abt, ldb, sB, A, abt, lda, sA,
        &beta, C, ct, ldc, sC, batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  return PROBE_OK;
}

/* In FP32 returns x itself; else encodes x into a 16-bit scratch buffer. */
static const void *operand(cuda_ctx *c, const float *x, size_t n,
                           probe_dtype p) {
  if (p == PROBE_DTYPE_F32)
    return x;
  uint16_t *h = (uint16_t *)scratch_take(c, n * 2);
  PROBE_LAUNCH(k_encode, blocks(n), TPB, c->stream, h, x, n, p);
  return h;
}

static probe_status decode(cuda_ctx *c, float *out, const void *h, int rows,
                           int cols, int ld, int acc, probe_dtype p) {
  PROBE_LAUNCH(k_decode, blocks((size_t)rows * cols), TPB, c->stream, out,
               (const uint16_t *)h, rows, cols, ld, acc, p);
  LAUNCHED();
  return PROBE_OK;
}

/* ---- round --------------------------------------------------------------- */

static probe_status cuda_round(void *ctx, float *out, const float *in, size_t n,
                               probe_dtype p) {
  cuda_ctx *c = (cuda_ctx *)ctx;
  CHECK_ARG(c && ((out && in) || n == 0) && PREC_OK(p));
  if (n == 0)
    return PROBE_OK;
  if (p == PROBE_DTYPE_F32 && out == in)
    return PROBE_OK;
  PROBE_LAUNCH(k_round, blocks(n), TPB, c->stream, out, in, n, p);
  LAUNCHED();
  return PROBE_OK;
}

/* ---- linear -------------------------------------------------------------- */

static probe_status cuda_linear_forward(void *ctx, float *out, const float *inp,
                                        const float *weight, const float *bias,
                                        int N, int C, int OC,
                                        probe_dtype p) {
  cuda_ctx *c = (cuda_ctx *)ctx;
  CHECK_ARG(c && out && inp && weight && N > 0 && C > 0 && OC > 0);
  CHECK_ARG(PREC_OK(p));
  size_t nx = (size_t)N * C, nw = (size_t)OC * C, no = (size_t)N * OC;
  TRY(scratch_reserve(c, p == PROBE_DTYPE_F32 ? 0 : 2 * (nx + nw + no)));
  const void *x = operand(c, inp, nx, p);
  const void *w = operand(c, weight, nw, p);
  if (p == PROBE_DTYPE_F32 || bias) {
    /* FP32 result, then the epilogue adds the bias and rounds once */
    TRY(gemm(c, 0, 1, N, OC, C, 1.0f, x, C, 0, w, C, 0, 0.0f, out, OC, 0, 1,
             ab_type(p), CUDA_R_32F));
    if (bias || p != PROBE_DTYPE_F32) {
      PROBE_LAUNCH(k_bias_round, blocks(no), TPB, c->stream, out, out, bias, N,
                   OC, p);
      LAUNCHED();
    }
  } else {
    void *o = scratch_take(c, no * 2);
    TRY(gemm(c, 0, 1, N, OC, C, 1.0f, x, C, 0, w, C, 0, 0.0f, o, OC, 0, 1,
             ab_type(p), ab_type(p)));
    TRY(decode(c, out, o, N, OC, OC, 0, p));
  }
  return PROBE_OK;
}

static probe_status cuda_linear_backward(void *ctx, float *dinp, float *dweight,
                                         float *dbias, const float *dout,
                                         const float *inp, const float *weight,
                                         int N, int C, int OC,
                                         probe_dtype p) {
  cuda_ctx *c = (cuda_ctx *)ctx;
  CHECK_ARG(c && dout && N > 0 && C > 0 && OC > 0);
  CHECK_ARG(!dinp || weight);
  CHECK_ARG(!dweight || inp);
  CHECK_ARG(PREC_OK(p));
  size_t nx = (size_t)N * C, nw = (size_t)OC * C, ng = (size_t)N * OC;
  int f32 = p == PROBE_DTYPE_F32;
  TRY(scratch_reserve(c, f32 ? 0 : 2 * (ng + 2 * nx + 2 * nw)));
  const void *g = operand(c, dout, ng, p);
  if (dinp) {
    const void *w = operand(c, weight, nw, p);
    void *o = f32 ? (void *)dinp : scratch_take(c, nx * 2);
    TRY(gemm(c, 0, 0, N, C, OC, 1.0f, g, OC, 0, w, C, 0, 0.0f, o, C, 0, 1,
             ab_type(p), ab_type(p)));
    if (!f32)
      TRY(decode(c, dinp, o, N, C, C, 0, p));
  }
  if (dweight) {
    const void *x = operand(c, inp, nx, p);
    void *o = f32 ? (void *)dweight : scratch_take(c, nw * 2);
    TRY(gemm(c, 1, 0, OC, C, N, 1.0f, g, OC, 0, x, C, 0, f32 ? 1.0f : 0.0f, o,
             C, 0, 1, ab_type(p), ab_type(p)));
    if (!f32)
      TRY(decode(c, dweight, o, OC, C, C, 1, p));
  }
  if (dbias) {
    PROBE_LAUNCH(k_colsum_acc, blocks(OC), TPB, c->stream, dbias, dout, N, OC,
                 p);
    LAUNCHED();
  }
  return PROBE_OK;
}

/* ---- batchnorm1d --------------------------------------------------------- */

__global__ void k_bn_forward(float *out, float *mean, float *var, float *rmean,
                             float *rvar, const float *x, const float *gamma,
                             const float *beta, float momentum, float eps,
                             int N, int C, int p) {
  int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C)
    return;
  pl_bn_forward_col(out, mean, var, rmean, rvar, x, gamma, beta, momentum, eps,
                    N, C, c, p);
}

__global__ void k_bn_backward(float *dinp, float *dgamma, float *dbeta,
                              const float *dout, const float *x,
                              const float *mean, const float *var,
                              const float *gamma, float eps, int N, int C,
                              int p) {
  int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C)
    return;
  pl_bn_backward_col(dinp, dgamma, dbeta, dout, x, mean, var, gamma, eps, N, C,
                     c, p);
}

static probe_status cuda_bn_forward(void *ctx, float *out, float *mean,
                                    float *var, float *running_mean,
                                    float *running_var, const float *inp,
                                    const float *gamma, const float *beta,
                                    float momentum, float eps, int N, int C,
                                    probe_dtype p) {
  cuda_ctx *c = (cuda_ctx *)ctx;
  CHECK_ARG(c && out && mean && var && inp && gamma && beta && N >= 2 && C > 0);
  CHECK_ARG(PREC_OK(p));
  PROBE_LAUNCH(k_bn_forward, blocks(C), TPB, c->stream, out, mean, var,
               running_mean, running_var, inp, gamma, beta, momentum, eps, N, C,
               p);
  LAUNCHED();
  return PROBE_OK;
}

static probe_status cuda_bn_backward(void *ctx, float *dinp, float *dgamma,
                                     float *dbeta, const float *dout,
                                     const float *inp, const float *mean,
                                     const float *var, const float *gamma,
                                     float eps, int N, int C,
                                     probe_dtype p) {
  cuda_ctx *c = (cuda_ctx *)ctx;
  CHECK_ARG(c && dinp && dout && inp && mean && var && gamma && N >= 2 &&
            C > 0);
  CHECK_ARG(PREC_OK(p));
  PROBE_LAUNCH(k_bn_backward, blocks(C), TPB, c->stream, dinp, dgamma, dbeta,
               dout, inp, mean, var, gamma, eps, N, C, p);
  LAUNCHED();
  return PROBE_OK;
}

__global__ void k_bn_eval(float *out, const float *x, const float *gamma,
                          const float *beta, const float *rmean,
                          const float *rvar, float eps, int N, int C, int p) {
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (i >= (size_t)N * C)
    return;
  int c = (int)(i % C);
  out[i] = pl_bn_eval(x[i], rmean[c], rvar[c], gamma[c], beta[c], eps, p);
}

static probe_status cuda_bn_forward_eval(void *ctx, float *out,
                                         const float *inp, const float *gamma,
                                         const float *beta,
                                         const float *running_mean,
                                         const float *running_var, float eps,
                                         int N, int C, probe_dtype p) {
  cuda_ctx *c = (cuda_ctx *)ctx;
  CHECK_ARG(c && out && inp && gamma && beta && running_mean && running_var);
  CHECK_ARG(N > 0 && C > 0 && PREC_OK(p));
  PROBE_LAUNCH(k_bn_eval, blocks((size_t)N * C), TPB, c->stream, out, inp,
               gamma, beta, running_mean, running_var, eps, N, C, p);
  LAUNCHED();
  return PROBE_OK;
}

/* ---- layernorm ----------------------------------------------------------- */

__global__ void k_ln_forward(float *out, float *mean, float *rstd, float *var,
                             const float *inp, const float *w, const float *b,
                             float eps, int N, int C, int p) {
  int n = blockIdx.x * blockDim.x + threadIdx.x;
  if (n >= N)
    return;
  pl_ln_forward_row(out + (size_t)n * C, mean + n, rstd + n,
                    var ? var + n : NULL, inp + (size_t)n * C, w, b, eps, C, p);
}

__global__ void k_ln_backward_dx(float *dinp, const float *dout,
                                 const float *inp, const float *mean,
                                 const float *rstd, const float *w, int N,
                                 int C, int p) {
  int n = blockIdx.x * blockDim.x + threadIdx.x;
  if (n >= N)
    return;
  pl_ln_backward_row(dinp + (size_t)n * C, dout + (size_t)n * C,
                     inp + (size_t)n * C, mean[n], rstd[n], w, C, p);
}

__global__ void k_ln_backward_dw(float *dw, float *db, const float *dout,
                                 const float *inp, const float *mean,
                                 const float *rstd, int N, int C, int p) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= C)
    return;
  pl_ln_backward_col(dw, db, dout, inp, mean, rstd, N, C, i, p);
}

static probe_status cuda_layernorm_forward(void *ctx, float *out, float *mean,
                                           float *rstd, float *var,
                                           const float *inp,
                                           const float *weight,
                                           const float *bias, float eps, int N,
                                           int C, probe_dtype p) {
  cuda_ctx *c = (cuda_ctx *)ctx;
  CHECK_ARG(c && out && mean && rstd && inp && weight && bias && N > 0 &&
            C > 0);
  CHECK_ARG(PREC_OK(p));
  PROBE_LAUNCH(k_ln_forward, blocks(N), TPB, c->stream, out, mean, rstd, var,
               inp, weight, bias, eps, N, C, p);
  LAUNCHED();
  return PROBE_OK;
}

static probe_status
cuda_layernorm_backward(void *ctx, float *dinp, float *dweight, float *dbias,
                        const float *dout, const float *inp, const float *mean,
                        const float *rstd, const float *weight, int N, int C,
                        probe_dtype p) {
  cuda_ctx *c = (cuda_ctx *)ctx;
  CHECK_ARG(c && dinp && dout && inp && mean && rstd && weight && N > 0 &&
            C > 0);
  CHECK_ARG(PREC_OK(p));
  PROBE_LAUNCH(k_ln_backward_dx, blocks(N), TPB, c->stream, dinp, dout, inp,
               mean, rstd, weight, N, C, p);
  LAUNCHED();
  if (dweight || dbias) {
    PROBE_LAUNCH(k_ln_backward_dw, blocks(C), TPB, c->stream, dweight, dbias,
                 dout, inp, mean, rstd, N, C, p);
    LAUNCHED();
  }
  return PROBE_OK;
}

/* ---- RevIN --------------------------------------------------------------- */

__global__ void k_revin_norm(float *out, float *mean, float *stdev, float *var,
                             const float *inp, const float *gamma,
                             const float *beta, float eps, int B, int T, int C,
                             int p) {
  int s = blockIdx.x * blockDim.x + threadIdx.x;
  if (s >= B * C)
    return;
  pl_revin_norm_series(out, mean, stdev, var, inp, gamma, beta, eps, T, C,
                       s / C, s % C, p);
}

__global__ void k_revin_norm_dx(float *dinp, const float *dout,
                                const float *stdev, const float *gamma, int B,
                                int T, int C, int p) {
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (i >= (size_t)B * T * C)
    return;
  int c = (int)(i % C), b = (int)(i / ((size_t)T * C));
  dinp[i] = pl_revin_norm_dx(dout[i], gamma, stdev[(size_t)b * C + c], c, p);
}

__global__ void k_revin_norm_dparams(float *dgamma, float *dbeta,
                                     const float *dout, const float *inp,
                                     const float *mean, const float *stdev,
                                     int B, int T, int C, int p) {
  int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C)
    return;
  pl_revin_norm_dparams_col(dgamma, dbeta, dout, inp, mean, stdev, B, T, C, c,
                            p);
}

__global__ void k_revin_denorm(float *out, const float *y, const float *mean,
                               const float *stdev, const float *gamma,
                               const float *beta, float eps, int B, int H,
                               int C, int p) {
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (i >= (size_t)B * H * C)
    return;
  int c = (int)(i % C), b = (int)(i / ((size_t)H * C));
  size_t s = (size_t)b * C + c;
  out[i] = pl_revin_denorm(y[i], mean[s], stdev[s], gamma, beta, c, eps, p);
}

__global__ void k_revin_denorm_dy(float *dy, const float *dout,
                                  const float *stdev, const float *gamma,
                                  float eps, int B, int H, int C, int p) {
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (i >= (size_t)B * H * C)
    return;
  int c = (int)(i % C), b = (int)(i / ((size_t)H * C));
  dy[i] =
      pl_revin_denorm_dy(dout[i], stdev[(size_t)b * C + c], gamma, c, eps, p);
}

__global__ void k_revin_denorm_dparams(float *dgamma, float *dbeta,
                                       const float *dout, const float *y,
                                       const float *stdev, const float *gamma,
                                       const float *beta, float eps, int B,
                                       int H, int C, int p) {
  int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C)
    return;
  pl_revin_denorm_dparams_col(dgamma, dbeta, dout, y, stdev, gamma, beta, eps,
                              B, H, C, c, p);
}

static probe_status cuda_revin_norm_forward(void *ctx, float *out, float *mean,
                                            float *stdev, float *var,
                                            const float *inp,
                                            const float *gamma,
                                            const float *beta, float eps, int B,
                                            int T, int C, probe_dtype p) {
  cuda_ctx *c = (cuda_ctx *)ctx;
  CHECK_ARG(c && out && mean && stdev && inp && B > 0 && T > 0 && C > 0);
  CHECK_ARG(!gamma == !beta);
  CHECK_ARG(PREC_OK(p));
  PROBE_LAUNCH(k_revin_norm, blocks((size_t)B * C), TPB, c->stream, out, mean,
               stdev, var, inp, gamma, beta, eps, B, T, C, p);
  LAUNCHED();
  return PROBE_OK;
}

static probe_status
cuda_revin_norm_backward(void *ctx, float *dinp, float *dgamma, float *dbeta,
                         const float *dout, const float *inp, const float *mean,
                         const float *stdev, const float *gamma, int B, int T,
                         int C, probe_dtype p) {
  cuda_ctx *c = (cuda_ctx *)ctx;
  CHECK_ARG(c && dinp && dout && inp && mean && stdev && B > 0 && T > 0 &&
            C > 0);
  CHECK_ARG(PREC_OK(p));
  size_t n = (size_t)B * T * C;
  PROBE_LAUNCH(k_revin_norm_dx, blocks(n), TPB, c->stream, dinp, dout, stdev,
               gamma, B, T, C, p);
  LAUNCHED();
  if (gamma && (dgamma || dbeta)) {
    PROBE_LAUNCH(k_revin_norm_dparams, blocks(C), TPB, c->stream, dgamma, dbeta,
                 dout, inp, mean, stdev, B, T, C, p);
    LAUNCHED();
  }
  return PROBE_OK;
}

static probe_status
cuda_revin_denorm_forward(void *ctx, float *out, const float *y,
                          const float *mean, const float *stdev,
                          const float *gamma, const float *beta, float eps,
                          int B, int H, int C, probe_dtype p) {
  cuda_ctx *c = (cuda_ctx *)ctx;
  CHECK_ARG(c && out && y && mean && stdev && B > 0 && H > 0 && C > 0);
  CHECK_ARG(!gamma == !beta);
  CHECK_ARG(PREC_OK(p));
  size_t n = (size_t)B * H * C;
  PROBE_LAUNCH(k_revin_denorm, blocks(n), TPB, c->stream, out, y, mean, stdev,
               gamma, beta, eps, B, H, C, p);
  LAUNCHED();
  return PROBE_OK;
}

static probe_status cuda_revin_denorm_backward(
    void *ctx, float *dy, float *dgamma, float *dbeta, const float *dout,
    const float *y, const float *stdev, const float *gamma, const float *beta,
    float eps, int B, int H, int C, probe_dtype p) {
  cuda_ctx *c = (cuda_ctx *)ctx;
  CHECK_ARG(c && dy && dout && y && stdev && B > 0 && H > 0 && C > 0);
  CHECK_ARG(!gamma == !beta);
  CHECK_ARG(PREC_OK(p));
  size_t n = (size_t)B * H * C;
  PROBE_LAUNCH(k_revin_denorm_dy, blocks(n), TPB, c->stream, dy, dout, stdev,
               gamma, eps, B, H, C, p);
  LAUNCHED();
  if (gamma && (dgamma || dbeta)) {
    PROBE_LAUNCH(k_revin_denorm_dparams, blocks(C), TPB, c->stream, dgamma,
                 dbeta, dout, y, stdev, gamma, beta, eps, B, H, C, p);
    LAUNCHED();
  }
  return PROBE_OK;
}

/* ---- activations --------------------------------------------------------- */

__global__ void k_relu_fwd(float *out, const float *x, size_t n, int p) {
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (i < n)
    out[i] = pl_relu(x[i], p);
}
__global__ void k_relu_bwd(float *dx, const float *dout, const float *x,
                           size_t n, int p) {
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (i < n)
    dx[i] = pl_relu_grad(dout[i], x[i], p);
}
__global__ void k_gelu_fwd(float *out, const float *x, size_t n, int p) {
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (i < n)
    out[i] = pl_gelu(x[i], p);
}
__global__ void k_gelu_bwd(float *dx, const float *dout, const float *x,
                           size_t n, int p) {
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (i < n)
    dx[i] = pl_gelu_grad(dout[i], x[i], p);
}

#define ELEMENTWISE(name, kern, ...)                                           \
  CHECK_ARG(c &&PREC_OK(p));                                                   \
  if (n == 0)                                                                  \
    return PROBE_OK;                                                           \
  PROBE_LAUNCH(kern, blocks(n), TPB, c->stream, __VA_ARGS__, n, p);            \
  LAUNCHED();                                                                  \
  return PROBE_OK;

static probe_status cuda_relu_forward(void *ctx, float *out, const float *inp,
                                      size_t n, probe_dtype p) {
  cuda_ctx *c = (cuda_ctx *)ctx;
  CHECK_ARG((out && inp) || n == 0);
  ELEMENTWISE(relu_fwd, k_relu_fwd, out, inp)
}
static probe_status cuda_relu_backward(void *ctx, float *dinp,
                                       const float *dout, const float *inp,
                                       size_t n, probe_dtype p) {
  cuda_ctx *c = (cuda_ctx *)ctx;
  CHECK_ARG((dinp && dout && inp) || n == 0);
  ELEMENTWISE(relu_bwd, k_relu_bwd, dinp, dout, inp)
}
static probe_status cuda_gelu_forward(void *ctx, float *out, const float *inp,
                                      size_t n, probe_dtype p) {
  cuda_ctx *c = (cuda_ctx *)ctx;
  CHECK_ARG((out && inp) || n == 0);
  ELEMENTWISE(gelu_fwd, k_gelu_fwd, out, inp)
}
static probe_status cuda_gelu_backward(void *ctx, float *dinp,
                                       const float *dout, const float *inp,
                                       size_t n, probe_dtype p) {
  cuda_ctx *c = (cuda_ctx *)ctx;
  CHECK_ARG((dinp && dout && inp) || n == 0);
  ELEMENTWISE(gelu_bwd, k_gelu_bwd, dinp, dout, inp)
}

/* ---- softmax ------------------------------------------------------------- */

__global__ void k_softmax_fwd(float *probs, const float *logits, int N, int V,
                              int p) {
  int n = blockIdx.x * blockDim.x + threadIdx.x;
  if (n < N)
    pl_softmax_row(probs + (size_t)n * V, logits + (size_t)n * V, V, p);
}

__global__ void k_softmax_bwd(float *dlogits, const float *dprobs,
                              const float *probs, int N, int V, int p) {
  int n = blockIdx.x * blockDim.x + threadIdx.x;
  if (n < N)
    pl_softmax_row_grad(dlogits + (size_t)n * V, dprobs + (size_t)n * V,
                        probs + (size_t)n * V, V, p);
}

static probe_status cuda_softmax_forward(void *ctx, float *probs,
                                         const float *logits, int N, int V,
                                         probe_dtype p) {
  cuda_ctx *c = (cuda_ctx *)ctx;
  CHECK_ARG(c && probs && logits && N > 0 && V > 0 && PREC_OK(p));
  PROBE_LAUNCH(k_softmax_fwd, blocks(N), TPB, c->stream, probs, logits, N, V,
               p);
  LAUNCHED();
  return PROBE_OK;
}

static probe_status cuda_softmax_backward(void *ctx, float *dlogits,
                                          const float *dprobs,
                                          const float *probs, int N, int V,
                                          probe_dtype p) {
  cuda_ctx *c = (cuda_ctx *)ctx;
  CHECK_ARG(c && dlogits && dprobs && probs && N > 0 && V > 0 && PREC_OK(p));
  PROBE_LAUNCH(k_softmax_bwd, blocks(N), TPB, c->stream, dlogits, dprobs, probs,
               N, V, p);
  LAUNCHED();
  return PROBE_OK;
}

/* ---- attention ----------------------------------------------------------- */

/* scores(B,T,T) from the GEMM result: -inf above the diagonal when causal,
 * else the (already rounded) value; src is float or 16-bit. */
__global__ void k_scores_mask(float *scores, const void *src, int B, int T,
                              int causal, int p) {
  size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (e >= (size_t)B * T * T)
    return;
  int j = (int)(e % T), i = (int)((e / T) % T);
  float v = p == PROBE_DTYPE_F32 ? ((const float *)src)[e]
                                 : ddec(((const uint16_t *)src)[e], p);
  scores[e] = (causal && j > i) ? -INFINITY : v;
}

static probe_status cuda_attention_forward(
    void *ctx, float *out, float *qkv, float *scores, float *probs, float *atty,
    const float *inp, const float *wqkv, const float *bqkv, const float *wo,
    const float *bo, int causal, int B, int T, int C, probe_dtype p) {
  cuda_ctx *c = (cuda_ctx *)ctx;
  CHECK_ARG(c && out && qkv && scores && probs && atty && inp && wqkv && wo);
  CHECK_ARG(B > 0 && T > 0 && C > 0 && PREC_OK(p));
  int N = B * T, C3 = 3 * C;
  int f32 = p == PROBE_DTYPE_F32;
  cudaDataType t = ab_type(p);
  size_t es = esize(p);
  TRY(cuda_linear_forward(c, qkv, inp, wqkv, bqkv, N, C, C3, p));
  size_t nqkv = (size_t)N * C3, nss = (size_t)B * T * T, ny = (size_t)N * C;
  TRY(scratch_reserve(c, f32 ? 0 : 2 * (nqkv + 2 * nss + ny)));
  const char *q = (const char *)operand(c, qkv, nqkv, p);
  const char *k = q + C * es, *v = q + 2 * C * es;
  float scale = 1.0f / sqrtf((float)C);
  /* scores_b(T,T) = scale * q_b k_b^T */
  void *s = f32 ? (void *)scores : scratch_take(c, nss * 2);
  TRY(gemm(c, 0, 1, T, T, C, scale, q, C3, (long long)T * C3, k, C3,
           (long long)T * C3, 0.0f, s, T, (long long)T * T, B, t, t));
  PROBE_LAUNCH(k_scores_mask, blocks(nss), TPB, c->stream, scores, s, B, T,
               causal, p);
  LAUNCHED();
  TRY(cuda_softmax_forward(c, probs, scores, N, T, p));
  /* atty_b(T,C) = probs_b v_b */
  const void *pr = operand(c, probs, nss, p);
  void *y = f32 ? (void *)atty : scratch_take(c, ny * 2);
  TRY(gemm(c, 0, 0, T, C, T, 1.0f, pr, T, (long long)T * T, v, C3,
           (long long)T * C3, 0.0f, y, C, (long long)T * C, B, t, t));
  if (!f32)
    TRY(decode(c, atty, y, N, C, C, 0, p));
  return cuda_linear_forward(c, out, atty, wo, bo, N, C, C, p);
}

static probe_status
cuda_attention_backward(void *ctx, float *dinp, float *dwqkv, float *dbqkv,
                        float *dwo, float *dbo, float *dqkv, float *datty,
                        float *dprobs, float *dscores, const float *dout,
                        const float *inp, const float *qkv, const float *probs,
                        const float *atty, const float *wqkv, const float *wo,
                        int B, int T, int C, probe_dtype p) {
  cuda_ctx *c = (cuda_ctx *)ctx;
  CHECK_ARG(c && dinp && dwqkv && dwo && dqkv && datty && dprobs && dscores);
  CHECK_ARG(dout && inp && qkv && probs && atty && wqkv && wo);
  CHECK_ARG(B > 0 && T > 0 && C > 0 && PREC_OK(p));
  int N = B * T, C3 = 3 * C;
  int f32 = p == PROBE_DTYPE_F32;
  cudaDataType t = ab_type(p);
  size_t es = esize(p);
  float scale = 1.0f / sqrtf((float)C);
  TRY(cuda_linear_backward(c, datty, dwo, dbo, dout, atty, wo, N, C, C, p));
  size_t nqkv = (size_t)N * C3, nss = (size_t)B * T * T, ny = (size_t)N * C;
  TRY(scratch_reserve(c, f32 ? 0 : 2 * (2 * nqkv + 3 * nss + ny)));
  const char *q = (const char *)operand(c, qkv, nqkv, p);
  const char *k = q + C * es, *v = q + 2 * C * es;
  const void *dy = operand(c, datty, ny, p);
  const void *pr = operand(c, probs, nss, p);
  char *dq = f32 ? (char *)dqkv : (char *)scratch_take(c, nqkv * 2);
  char *dk = dq + C * es, *dv = dq + 2 * C * es;
  long long sq = (long long)T * C3, ss = (long long)T * T,
            sy = (long long)T * C;
  /* dprobs_b(T,T) = datty_b v_b^T */
  void *dp = f32 ? (void *)dprobs : scratch_take(c, nss * 2);
  TRY(gemm(c, 0, 1, T, T, C, 1.0f, dy, C, sy, v, C3, sq, 0.0f, dp, T, ss, B, t,
           t));
  if (!f32)
    TRY(decode(c, dprobs, dp, N, T, T, 0, p));
  /* dv_b(T,C) = probs_b^T datty_b */
  TRY(gemm(c, 1, 0, T, C, T, 1.0f, pr, T, ss, dy, C, sy, 0.0f, dv, C3, sq, B, t,
           t));
  TRY(cuda_softmax_backward(c, dscores, dprobs, probs, N, T, p));
  const void *ds = operand(c, dscores, nss, p);
  /* dq_b = scale dscores_b k_b ; dk_b = scale dscores_b^T q_b */
  TRY(gemm(c, 0, 0, T, C, T, scale, ds, T, ss, k, C3, sq, 0.0f, dq, C3, sq, B,
           t, t));
  TRY(gemm(c, 1, 0, T, C, T, scale, ds, T, ss, q, C3, sq, 0.0f, dk, C3, sq, B,
           t, t));
  if (!f32)
    TRY(decode(c, dqkv, dq, N, C3, C3, 0, p));
  return cuda_linear_backward(c, dinp, dwqkv, dbqkv, dqkv, inp, wqkv, N, C, C3,
                              p);
}

/* ---- losses -------------------------------------------------------------- */

/* One block of TPB threads: strided partial sums, then a tree in shared
 * memory. */
__device__ float block_sum(float v) {
  __shared__ float sh[256];
  sh[threadIdx.x] = v;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s)
      sh[threadIdx.x] += sh[threadIdx.x + s];
    __syncthreads();
  }
  return sh[0];
}

__global__ void k_mse_fwd(float *loss, const float *pred, const float *target,
                          size_t n, int p) {
  float s = 0.0f;
  for (size_t i = threadIdx.x; i < n; i += blockDim.x)
    s += pl_mse_term(pred[i], target[i], p);
  s = block_sum(s);
  if (threadIdx.x == 0)
    *loss = drnd(s / (float)n, p);
}

__global__ void k_mse_bwd(float *dpred, const float *pred, const float *target,
                          float dloss, size_t n, int p) {
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (i >= n)
    return;
  dpred[i] = pl_mse_grad(pl_mse_grad_k(dloss, n, p), pred[i], target[i], p);
}

__global__ void k_ce_fwd(float *loss, float *losses, const float *probs,
                         const int *targets, int N, int V, int p) {
  float s = 0.0f;
  for (int n = threadIdx.x; n < N; n += blockDim.x) {
    int y = targets[n];
    float l = (y >= 0 && y < V) ? pl_ce_term(probs[(size_t)n * V + y], p) : NAN;
    if (losses)
      losses[n] = l;
    s += l;
  }
  s = block_sum(s);
  if (threadIdx.x == 0)
    *loss = drnd(s / (float)N, p);
}

__global__ void k_ce_bwd(float *dprobs, const float *probs, const int *targets,
                         float dloss, int N, int V, int p) {
  size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (e >= (size_t)N * V)
    return;
  int n = (int)(e / V), v = (int)(e % V);
  int y = targets[n];
  dprobs[e] = (y < 0 || y >= V) ? NAN
              : v == y ? pl_ce_grad(pl_ce_grad_k(dloss, N, p), probs[e], p)
                       : 0.0f;
}

static probe_status cuda_mse_forward(void *ctx, float *loss, const float *pred,
                                     const float *target, size_t n,
                                     probe_dtype p) {
  cuda_ctx *c = (cuda_ctx *)ctx;
  CHECK_ARG(c && loss && pred && target && n > 0 && PREC_OK(p));
  PROBE_LAUNCH(k_mse_fwd, 1, TPB, c->stream, loss, pred, target, n, p);
  LAUNCHED();
  return PROBE_OK;
}

static probe_status cuda_mse_backward(void *ctx, float *dpred,
                                      const float *pred, const float *target,
                                      float dloss, size_t n,
                                      probe_dtype p) {
  cuda_ctx *c = (cuda_ctx *)ctx;
  CHECK_ARG(c && dpred && pred && target && n > 0 && PREC_OK(p));
  PROBE_LAUNCH(k_mse_bwd, blocks(n), TPB, c->stream, dpred, pred, target, dloss,
               n, p);
  LAUNCHED();
  return PROBE_OK;
}

/* Targets out of range cannot be checked on the host without a copy: they
 * give NaN losses and gradients instead of PROBE_ERR_INVALID_ARG. */
static probe_status cuda_crossentropy_forward(void *ctx, float *loss,
                                              float *losses, const float *probs,
                                              const int *targets, int N, int V,
                                              probe_dtype p) {
  cuda_ctx *c = (cuda_ctx *)ctx;
  CHECK_ARG(c && loss && probs && targets && N > 0 && V > 0 && PREC_OK(p));
  PROBE_LAUNCH(k_ce_fwd, 1, TPB, c->stream, loss, losses, probs, targets, N, V,
               p);
  LAUNCHED();
  return PROBE_OK;
}

static probe_status cuda_crossentropy_backward(void *ctx, float *dprobs,
                                               const float *probs,
                                               const int *targets, float dloss,
                                               int N, int V,
                                               probe_dtype p) {
  cuda_ctx *c = (cuda_ctx *)ctx;
  CHECK_ARG(c && dprobs && probs && targets && N > 0 && V > 0 && PREC_OK(p));
  PROBE_LAUNCH(k_ce_bwd, blocks((size_t)N * V), TPB, c->stream, dprobs, probs,
               targets, dloss, N, V, p);
  LAUNCHED();
  return PROBE_OK;
}

/* ---- gradient-list helpers ----------------------------------------------- */

__global__ void k_sumsq(double *acc, const float *g, size_t n) {
  __shared__ double sh[256];
  double s = 0.0;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x) {
    double v = g[i];
    s += v * v;
  }
  sh[threadIdx.x] = s;
  __syncthreads();
  for (int k = blockDim.x / 2; k > 0; k >>= 1) {
    if (threadIdx.x < k)
      sh[threadIdx.x] += sh[threadIdx.x + k];
    __syncthreads();
  }
  if (threadIdx.x == 0)
    atomicAdd(acc, sh[0]);
}

__global__ void k_scale(float *g, size_t n, float f, int *flag) {
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (i >= n)
    return;
  float v = g[i] * f;
  g[i] = v;
  if (!isfinite(v))
    *flag = 1;
}

static probe_status cuda_grads_l2norm(void *ctx, double *out,
                                      float *const *grads, const size_t *sizes,
                                      size_t count) {
  cuda_ctx *c = (cuda_ctx *)ctx;
  CHECK_ARG(c && out && (count == 0 || (grads && sizes)));
  CUDA_TRY(cudaMemsetAsync(c->d_acc, 0, sizeof(double), c->stream));
  for (size_t t = 0; t < count; t++) {
    CHECK_ARG(grads[t] || sizes[t] == 0);
    if (sizes[t] == 0)
      continue;
    unsigned nb = blocks(sizes[t]);
    PROBE_LAUNCH(k_sumsq, nb < 1024 ? nb : 1024, TPB, c->stream, c->d_acc,
                 grads[t], sizes[t]);
    LAUNCHED();
  }
  double s = 0.0;
  CUDA_TRY(cudaMemcpyAsync(&s, c->d_acc, sizeof s, cudaMemcpyDeviceToHost,
                           c->stream));
  CUDA_TRY(cudaStreamSynchronize(c->stream));
  *out = sqrt(s);
  return PROBE_OK;
}

static probe_status cuda_grads_scale(void *ctx, float *const *grads,
                                     const size_t *sizes, size_t count,
                                     float factor, int *found_nonfinite) {
  cuda_ctx *c = (cuda_ctx *)ctx;
  CHECK_ARG(c && (count == 0 || (grads && sizes)));
  CUDA_TRY(cudaMemsetAsync(c->d_flag, 0, sizeof(int), c->stream));
  for (size_t t = 0; t < count; t++) {
    CHECK_ARG(grads[t] || sizes[t] == 0);
    if (sizes[t] == 0)
      continue;
    PROBE_LAUNCH(k_scale, blocks(sizes[t]), TPB, c->stream, grads[t], sizes[t],
                 factor, c->d_flag);
    LAUNCHED();
  }
  int flag = 0;
  CUDA_TRY(cudaMemcpyAsync(&flag, c->d_flag, sizeof flag,
                           cudaMemcpyDeviceToHost, c->stream));
  CUDA_TRY(cudaStreamSynchronize(c->stream));
  if (found_nonfinite)
    *found_nonfinite = flag;
  return PROBE_OK;
}

/* ---- the table ------------------------------------------------------------
 */

static probe_layer_ops make_ops(void) {
  probe_layer_ops o;
  memset(&o, 0, sizeof o);
  o.name = "cuda";
  o.device_memory = 1;
  o.destroy = cuda_destroy;
  o.sync = cuda_sync;
  o.alloc = cuda_alloc;
  o.free = cuda_free;
  o.copy = cuda_copy;
  o.round = cuda_round;
  o.linear_forward = cuda_linear_forward;
  o.linear_backward = cuda_linear_backward;
  o.bn_forward = cuda_bn_forward;
  o.bn_backward = cuda_bn_backward;
  o.bn_forward_eval = cuda_bn_forward_eval;
  o.layernorm_forward = cuda_layernorm_forward;
  o.layernorm_backward = cuda_layernorm_backward;
  o.revin_norm_forward = cuda_revin_norm_forward;
  o.revin_norm_backward = cuda_revin_norm_backward;
  o.revin_denorm_forward = cuda_revin_denorm_forward;
  o.revin_denorm_backward = cuda_revin_denorm_backward;
  o.relu_forward = cuda_relu_forward;
  o.relu_backward = cuda_relu_backward;
  o.gelu_forward = cuda_gelu_forward;
  o.gelu_backward = cuda_gelu_backward;
  o.softmax_forward = cuda_softmax_forward;
  o.softmax_backward = cuda_softmax_backward;
  o.attention_forward = cuda_attention_forward;
  o.attention_backward = cuda_attention_backward;
  o.mse_forward = cuda_mse_forward;
  o.mse_backward = cuda_mse_backward;
  o.crossentropy_forward = cuda_crossentropy_forward;
  o.crossentropy_backward = cuda_crossentropy_backward;
  o.grads_l2norm = cuda_grads_l2norm;
  o.grads_scale = cuda_grads_scale;
  return o;
}

extern "C" const probe_layer_ops *probe__cuda_layer_ops(void) {
  static const probe_layer_ops ops = make_ops();
  return &ops;
}
