/*
 * ampprobe/layers.h - the layer kernels of the reference AMP trainer
 * (kernels/layers/): forward and backward of every module on flat float
 * arrays, a CPU reference (layers_cpu.c) and a CUDA version with the same
 * arguments (layers_cuda.cu).
 *
 * Conventions (llm.c style):
 *  - Arguments are ordered outputs, inputs, sizes, then `prec`. Shapes are in
 *    comments: (N,C) is N rows of C contiguous floats, row-major. A (B,T,C)
 *    tensor passed where (N,C) is asked is N = B*T rows.
 *  - Storage is always float (FP32). `prec` says what the module runs in:
 *    PROBE_DTYPE_F32 does plain FP32 arithmetic. PROBE_DTYPE_F16 (BF16 alike)
 *    rounds every input and weight to binary16 on entry, accumulates inside
 *    the operation in FP32 (float accumulators), and rounds every tensor it
 *    materialises (outputs, saved intermediates, gradients) through binary16
 *    (probe_round_f16, round to nearest even, subnormals kept), so the stored
 *    floats are exactly the values an FP16 tensor would hold. docs/precision.md
 *    says, op by op, what is rounded where.
 *  - Backward: activation gradients (dinp) are OVERWRITTEN; parameter gradients
 *    (dweight, dbias, dgamma, dbeta) are ACCUMULATED (+=) in FP32, each call
 *    adding its own contribution after rounding it to the module precision
 *    (PyTorch AMP: the FP16 grad of the cast weight is converted and added to
 *    the FP32 .grad). Zero them before the first micro-batch.
 *  - The gradient arriving at a backward (dout) is an input: it is rounded on
 *    entry in FP16 mode.
 *  - Outputs never alias inputs unless a comment says so.
 *  - Every function returns PROBE_OK, PROBE_ERR_INVALID_ARG (NULL pointer
 *    where one is required, size <= 0, unknown prec), PROBE_ERR_NOMEM (CPU
 *    scratch), or for CUDA PROBE_ERR_CUDA / PROBE_ERR_UNSUPPORTED (build
 *    without CUDA). Nothing exits or aborts.
 */
#ifndef AMPPROBE_LAYERS_H
#define AMPPROBE_LAYERS_H

#include <stddef.h>

#include "ampprobe/probe.h"
#include "ampprobe/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- precision helpers --------------------------------------------------- */

/* out[i] = x[i] rounded to prec (identity for FP32). out may equal in. Used
 * for casting FP32 master weights "as used" (the WEIGHT trace site). */
probe_status probe_layers_round(float *out, const float *in, size_t n,
                                probe_dtype prec);

/* One float rounded to prec. */
float probe_layers_round1(float x, probe_dtype prec);

/* ---- linear: out = inp @ W^T + b ---------------------------------------- */

/* out(N,OC) = inp(N,C) @ weight(OC,C)^T + bias(OC). bias may be NULL.
 * FP16: inp and weight rounded, cblas_sgemm (FP32 accumulation), bias added
 * in FP32 from the rounded bias, out rounded. */
probe_status probe_linear_forward(float *out, const float *inp,
                                  const float *weight, const float *bias, int N,
                                  int C, int OC, probe_dtype prec);

/* dinp(N,C) = dout @ W        (overwritten; may be NULL to skip)
 * dweight(OC,C) += dout^T @ inp (accumulated; NULL to skip)
 * dbias(OC) += sum_n dout     (accumulated; NULL to skip)
 * dout(N,OC). inp, weight are the forward's (rounded again on entry). */
probe_status probe_linear_backward(float *dinp, float *dweight, float *dbias,
                                   const float *dout, const float *inp,
                                   const float *weight, int N, int C, int OC,
                                   probe_dtype prec);

/* ---- batchnorm1d, training mode ------------------------------------------ */

#define PROBE_BN_MOMENTUM 0.1f
#define PROBE_BN_EPS 1e-5f

/* Batch statistics over the N rows for each of C features.
 * mean(C) = sum_n x / N; var(C) = sum_n (x-mean)^2 / N (biased, FP32
 * accumulation, then materialised: rounded in FP16 -> inf past 65504);
 * out(N,C) = (x - mean) / sqrt(var + eps) * gamma + beta, rounded.
 * mean, var are saved for backward. running_mean/running_var (C) are FP32 and
 * updated in place when not NULL: r = (1-momentum)*r + momentum*stat, using
 * the materialised mean and var (unbiased: var * N/(N-1)). N >= 2. */
probe_status probe_bn_forward(float *out, float *mean, float *var,
                              float *running_mean, float *running_var,
                              const float *inp, const float *gamma,
                              const float *beta, float momentum, float eps,
                              int N, int C, probe_dtype prec);

/* dinp(N,C) overwritten; dgamma(C), dbeta(C) accumulated (NULL to skip).
 * Gradient flows through the batch statistics (training mode). */
probe_status probe_bn_backward(float *dinp, float *dgamma, float *dbeta,
                               const float *dout, const float *inp,
                               const float *mean, const float *var,
                               const float *gamma, float eps, int N, int C,
                               probe_dtype prec);

/* Evaluation mode: out(N,C) = (x - running_mean) / sqrt(running_var + eps)
 * * gamma + beta, the FP32 running statistics cast on use like weights.
 * No backward (evaluation only). */
probe_status probe_bn_forward_eval(float *out, const float *inp,
                                   const float *gamma, const float *beta,
                                   const float *running_mean,
                                   const float *running_var, float eps, int N,
                                   int C, probe_dtype prec);

/* ---- layernorm over the last dimension ----------------------------------- */

#define PROBE_LN_EPS 1e-5f

/* Per row n of inp(N,C): mean(N), var(N) materialised (rounded: inf in
 * FP16 past 65504), rstd(N) = 1/sqrt(var + eps) rounded;
 * out(N,C) = (x-mean)*rstd*weight + bias. mean, rstd are saved for backward;
 * var is written when not NULL (the quantity that overflows, for the trace's
 * fwd_saved site; backward does not need it). */
probe_status probe_layernorm_forward(float *out, float *mean, float *rstd,
                                     float *var, const float *inp,
                                     const float *weight, const float *bias,
                                     float eps, int N, int C,
                                     probe_dtype prec);

/* dinp(N,C) overwritten; dweight(C), dbias(C) accumulated (NULL to skip). */
probe_status probe_layernorm_backward(float *dinp, float *dweight, float *dbias,
                                      const float *dout, const float *inp,
                                      const float *mean, const float *rstd,
                                      const float *weight, int N, int C,
                                      probe_dtype prec);

/* ---- RevIN (Kim et al. 2022), reversible instance normalisation ---------- */

#define PROBE_REVIN_EPS 1e-5f

/* inp(B,T,C) (C = 1 for a (B,T) series). Per series (b,c), over T:
 * mean(B,C), var(B,C) = mean of squared deviations (biased, materialised:
 * rounded, -> inf in FP16 past 65504; written when var is not NULL),
 * stdev(B,C) = sqrt(var + eps) rounded.
 * out = (x - mean) / stdev, then if gamma != NULL: out = out*gamma[c] + beta[c]
 * (gamma, beta (C) both given or both NULL). mean, stdev are saved and shared
 * with probe_revin_denorm_*. As in the reference code the statistics are
 * detached: no gradient flows through mean or stdev. */
probe_status probe_revin_norm_forward(float *out, float *mean, float *stdev,
                                      float *var, const float *inp,
                                      const float *gamma, const float *beta,
                                      float eps, int B, int T, int C,
                                      probe_dtype prec);

/* dinp(B,T,C) = dout * gamma / stdev (overwritten); dgamma(C) += sum dout *
 * (x-mean)/stdev, dbeta(C) += sum dout (accumulated; NULL to skip, and
 * ignored when gamma is NULL). */
probe_status probe_revin_norm_backward(float *dinp, float *dgamma, float *dbeta,
                                       const float *dout, const float *inp,
                                       const float *mean, const float *stdev,
                                       const float *gamma, int B, int T, int C,
                                       probe_dtype prec);

/* out(B,H,C) from y(B,H,C) (H: output horizon, may differ from T):
 * if gamma: y = (y - beta[c]) / (gamma[c] + eps*eps); out = y*stdev + mean,
 * with mean, stdev (B,C) from probe_revin_norm_forward. In FP16 an inf stdev
 * gives +-inf (or NaN where y is 0) here. */
probe_status probe_revin_denorm_forward(float *out, const float *y,
                                        const float *mean, const float *stdev,
                                        const float *gamma, const float *beta,
                                        float eps, int B, int H, int C,
                                        probe_dtype prec);

/* dy(B,H,C) overwritten; dgamma, dbeta (C) accumulated (same arrays as the
 * norm's: RevIN's affine parameters are shared). */
probe_status probe_revin_denorm_backward(float *dy, float *dgamma, float *dbeta,
                                         const float *dout, const float *y,
                                         const float *stdev, const float *gamma,
                                         const float *beta, float eps, int B,
                                         int H, int C, probe_dtype prec);

/* ---- elementwise activations (n elements) -------------------------------- */

/* out = max(x, 0). out may equal inp. */
probe_status probe_relu_forward(float *out, const float *inp, size_t n,
                                probe_dtype prec);
/* dinp = dout * (inp > 0) (overwritten). dinp may equal dout. */
probe_status probe_relu_backward(float *dinp, const float *dout,
                                 const float *inp, size_t n,
                                 probe_dtype prec);

/* GELU, tanh approximation (PyTorch approximate='tanh'):
 * 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), evaluated in FP32.
 * out may equal inp. */
probe_status probe_gelu_forward(float *out, const float *inp, size_t n,
                                probe_dtype prec);
/* dinp = dout * gelu'(inp) (overwritten). dinp may equal dout. */
probe_status probe_gelu_backward(float *dinp, const float *dout,
                                 const float *inp, size_t n,
                                 probe_dtype prec);

/* ---- softmax over the last dimension ------------------------------------- */

/* probs(N,V) = softmax(logits(N,V)) per row: max subtracted, FP32 exp and
 * sum, probabilities rounded (FP16: p < 2^-25 becomes exactly 0). -inf
 * logits (masks) give 0. A separate module from the loss: not fused. */
probe_status probe_softmax_forward(float *probs, const float *logits, int N,
                                   int V, probe_dtype prec);

/* dlogits(N,V) = p * (dprobs - sum_v dprobs*p) (overwritten). */
probe_status probe_softmax_backward(float *dlogits, const float *dprobs,
                                    const float *probs, int N, int V,
                                    probe_dtype prec);

/* ---- single-head self-attention block ------------------------------------ */

/* inp(B,T,C) -> out(B,T,C), as torch.nn.MultiheadAttention(C, num_heads=1,
 * batch_first=True) with self-attention (query = key = value = inp):
 *   qkv(B,T,3C) = inp @ wqkv(3C,C)^T + bqkv(3C)  [q | k | v per row]  (saved)
 *   scores(B,T,T) = q k^T / sqrt(C), -inf where causal and j > i      (saved)
 *   probs(B,T,T) = softmax over the last dim                          (saved)
 *   atty(B,T,C) = probs @ v                                           (saved)
 *   out(B,T,C) = atty @ wo(C,C)^T + bo(C)
 * Each saved tensor and out are rounded in FP16; accumulation FP32.
 * bqkv, bo may be NULL. causal: 0 or 1. */
probe_status probe_attention_forward(float *out, float *qkv, float *scores,
                                     float *probs, float *atty,
                                     const float *inp, const float *wqkv,
                                     const float *bqkv, const float *wo,
                                     const float *bo, int causal, int B, int T,
                                     int C, probe_dtype prec);

/* dinp(B,T,C) overwritten; dwqkv(3C,C), dbqkv(3C), dwo(C,C), dbo(C)
 * accumulated (NULL to skip a bias). Scratch, overwritten, each a gradient
 * materialised (rounded) in FP16: dqkv(B,T,3C), datty(B,T,C), dprobs(B,T,T),
 * dscores(B,T,T). inp, qkv, probs, atty are the forward's. */
probe_status probe_attention_backward(float *dinp, float *dwqkv, float *dbqkv,
                                      float *dwo, float *dbo, float *dqkv,
                                      float *datty, float *dprobs,
                                      float *dscores, const float *dout,
                                      const float *inp, const float *qkv,
                                      const float *probs, const float *atty,
                                      const float *wqkv, const float *wo, int B,
                                      int T, int C, probe_dtype prec);

/* ---- losses (autocast runs them in FP32; prec is honoured anyway) -------- */

/* *loss = mean over n of (pred - target)^2, pred, target (n). */
probe_status probe_mse_forward(float *loss, const float *pred,
                               const float *target, size_t n,
                               probe_dtype prec);
/* dpred(n) = dloss * 2 (pred - target) / n (overwritten). dloss is the
 * gradient of the loss: the loss scale for a scaled backward. */
probe_status probe_mse_backward(float *dpred, const float *pred,
                                const float *target, float dloss, size_t n,
                                probe_dtype prec);

/* Cross-entropy on probabilities (the "softmax then log" composition):
 * losses(N) = -log probs[n, targets[n]] (NULL to skip), *loss = mean over n.
 * A zero probability gives +inf. targets in [0, V). */
probe_status probe_crossentropy_forward(float *loss, float *losses,
                                        const float *probs, const int *targets,
                                        int N, int V, probe_dtype prec);
/* dprobs(N,V) = -dloss / (N * p[n,y]) at the target, 0 elsewhere
 * (overwritten). A zero probability gives -inf. */
probe_status probe_crossentropy_backward(float *dprobs, const float *probs,
                                         const int *targets, float dloss, int N,
                                         int V, probe_dtype prec);

/* ---- gradient-list helpers (FP32, for the AMP step) ---------------------- */
/* Provided here; trainer-core owns the scaler and clipping logic around them.
 * grads[i] has sizes[i] floats. */

/* *out = sqrt(sum over all elements of g^2), accumulated in double. inf or NaN
 * when any element is non-finite. */
probe_status probe_grads_l2norm(double *out, float *const *grads,
                                const size_t *sizes, size_t count);

/* g *= factor in FP32, in place. *found_nonfinite (may be NULL) = 1 when any
 * element is inf or NaN after scaling, else 0 (GradScaler's unscale uses
 * factor = (float)(1.0 / scale)). */
probe_status probe_grads_scale(float *const *grads, const size_t *sizes,
                               size_t count, float factor,
                               int *found_nonfinite);

/* ---- backends: one table of operations, chosen once ----------------------- */
/*
 * A backend is a table of function pointers (probe_layer_ops) and a context
 * (ctx) passed as each operation's first argument. Every operation takes the
 * arguments of the CPU function of the same name above, in the same order,
 * on the backend's memory:
 *
 *   cpu   the functions above; memory is host memory (malloc).
 *   cuda  layers_cuda.cu; every array is device memory, from ops->alloc or
 *         cudaMalloc. GEMMs are cublasGemmEx (strided-batched in attention)
 *         with CUBLAS_COMPUTE_32F: in FP16/BF16 mode CUDA_R_16F (CUDA_R_16BF)
 *         operands and output, except a linear forward with bias, whose GEMM
 *         outputs CUDA_R_32F so the bias is added before the single rounding
 *         (as a cuBLASLt bias epilogue does); CUDA_R_32F throughout in FP32
 *         mode (no TF32). Other ops are the shared per-element code of
 *         layers-impl.h, one thread per element/row/column, in the CPU's
 *         order. Calls are asynchronous on the context's stream: call
 *         ops->sync before reading results on the host. Losses write *loss
 *         to device memory; cross-entropy targets are device memory and a
 *         target out of [0, V) gives NaN there instead of
 *         PROBE_ERR_INVALID_ARG. grads_l2norm / grads_scale take HOST arrays
 *         of device pointers and return host values (they synchronise).
 *         A context holds scratch memory: one host thread at a time.
 *
 * Operations return PROBE_OK or the errors listed at the top, plus
 * PROBE_ERR_CUDA for a failed CUDA call.
 */

/* Where the layers run. */
typedef enum probe_backend {
  PROBE_BACKEND_CPU = 0,  /* layers_cpu.c, OpenBLAS */
  PROBE_BACKEND_CUDA = 1, /* layers_cuda.cu, cuBLAS; builds with CUDA */
} probe_backend;

typedef struct probe_layer_ops {
  const char *name;  /* "cpu", "cuda" */
  int device_memory; /* 1: the arrays are not host memory (copy to read) */

  /* ---- context and memory ---- */
  void (*destroy)(void *ctx);
  probe_status (*sync)(void *ctx); /* waits for queued work */
  /* *out = bytes of zeroed backend memory (PROBE_ERR_NOMEM on failure). */
  probe_status (*alloc)(void *ctx, void **out, size_t bytes);
  void (*free)(void *ctx, void *p);
  /* bytes between host and backend memory, either direction; synchronous
   * (waits for queued work first). */
  probe_status (*copy)(void *ctx, void *dst, const void *src, size_t bytes);

  /* ---- operations (arguments as the CPU functions, after ctx) ---- */
  probe_status (*round)(void *ctx, float *out, const float *in, size_t n,
                        probe_dtype prec);
  probe_status (*linear_forward)(void *ctx, float *out, const float *inp,
                                 const float *weight, const float *bias, int N,
                                 int C, int OC, probe_dtype prec);
  probe_status (*linear_backward)(void *ctx, float *dinp, float *dweight,
                                  float *dbias, const float *dout,
                                  const float *inp, const float *weight, int N,
                                  int C, int OC, probe_dtype prec);
  probe_status (*bn_forward)(void *ctx, float *out, float *mean, float *var,
                             float *running_mean, float *running_var,
                             const float *inp, const float *gamma,
                             const float *beta, float momentum, float eps,
                             int N, int C, probe_dtype prec);
  probe_status (*bn_backward)(void *ctx, float *dinp, float *dgamma,
                              float *dbeta, const float *dout,
                              const float *inp, const float *mean,
                              const float *var, const float *gamma, float eps,
                              int N, int C, probe_dtype prec);
  probe_status (*bn_forward_eval)(void *ctx, float *out, const float *inp,
                                  const float *gamma, const float *beta,
                                  const float *running_mean,
                                  const float *running_var, float eps, int N,
                                  int C, probe_dtype prec);
  probe_status (*layernorm_forward)(void *ctx, float *out, float *mean,
                                    float *rstd, float *var, const float *inp,
                                    const float *weight, const float *bias,
                                    float eps, int N, int C,
                                    probe_dtype prec);
  probe_status (*layernorm_backward)(void *ctx, float *dinp, float *dweight,
                                     float *dbias, const float *dout,
                                     const float *inp, const float *mean,
                                     const float *rstd, const float *weight,
                                     int N, int C, probe_dtype prec);
  probe_status (*revin_norm_forward)(void *ctx, float *out, float *mean,
                                     float *stdev, float *var,
                                     const float *inp, const float *gamma,
                                     const float *beta, float eps, int B,
                                     int T, int C, probe_dtype prec);
  probe_status (*revin_norm_backward)(void *ctx, float *dinp, float *dgamma,
                                      float *dbeta, const float *dout,
                                      const float *inp, const float *mean,
                                      const float *stdev, const float *gamma,
                                      int B, int T, int C,
                                      probe_dtype prec);
  probe_status (*revin_denorm_forward)(void *ctx, float *out, const float *y,
                                       const float *mean, const float *stdev,
                                       const float *gamma, const float *beta,
                                       float eps, int B, int H, int C,
                                       probe_dtype prec);
  probe_status (*revin_denorm_backward)(void *ctx, float *dy, float *dgamma,
                                        float *dbeta, const float *dout,
                                        const float *y, const float *stdev,
                                        const float *gamma, const float *beta,
                                        float eps, int B, int H, int C,
                                        probe_dtype prec);
  probe_status (*relu_forward)(void *ctx, float *out, const float *inp,
                               size_t n, probe_dtype prec);
  probe_status (*relu_backward)(void *ctx, float *dinp, const float *dout,
                                const float *inp, size_t n,
                                probe_dtype prec);
  probe_status (*gelu_forward)(void *ctx, float *out, const float *inp,
                               size_t n, probe_dtype prec);
  probe_status (*gelu_backward)(void *ctx, float *dinp, const float *dout,
                                const float *inp, size_t n,
                                probe_dtype prec);
  probe_status (*softmax_forward)(void *ctx, float *probs, const float *logits,
                                  int N, int V, probe_dtype prec);
  probe_status (*softmax_backward)(void *ctx, float *dlogits,
                                   const float *dprobs, const float *probs,
                                   int N, int V, probe_dtype prec);
  probe_status (*attention_forward)(void *ctx, float *out, float *qkv,
                                    float *scores, float *probs, float *atty,
                                    const float *inp, const float *wqkv,
                                    const float *bqkv, const float *wo,
                                    const float *bo, int causal, int B, int T,
                                    int C, probe_dtype prec);
  probe_status (*attention_backward)(
      void *ctx, float *dinp, float *dwqkv, float *dbqkv, float *dwo,
      float *dbo, float *dqkv, float *datty, float *dprobs, float *dscores,
      const float *dout, const float *inp, const float *qkv, const float *probs,
      const float *atty, const float *wqkv, const float *wo, int B, int T,
      int C, probe_dtype prec);
  probe_status (*mse_forward)(void *ctx, float *loss, const float *pred,
                              const float *target, size_t n,
                              probe_dtype prec);
  probe_status (*mse_backward)(void *ctx, float *dpred, const float *pred,
                               const float *target, float dloss, size_t n,
                               probe_dtype prec);
  probe_status (*crossentropy_forward)(void *ctx, float *loss, float *losses,
                                       const float *probs, const int *targets,
                                       int N, int V, probe_dtype prec);
  probe_status (*crossentropy_backward)(void *ctx, float *dprobs,
                                        const float *probs, const int *targets,
                                        float dloss, int N, int V,
                                        probe_dtype prec);
  probe_status (*grads_l2norm)(void *ctx, double *out, float *const *grads,
                               const size_t *sizes, size_t count);
  probe_status (*grads_scale)(void *ctx, float *const *grads,
                              const size_t *sizes, size_t count, float factor,
                              int *found_nonfinite);
} probe_layer_ops;

/* A started backend: its table and its context. */
typedef struct probe_layers_backend {
  const probe_layer_ops *ops;
  void *ctx;
  probe_backend kind;
} probe_layers_backend;

/* Starts a backend (once; then call through b->ops). stream: a cudaStream_t
 * for CUDA (NULL: the legacy default stream), ignored by the CPU.
 * Returns PROBE_OK; PROBE_ERR_UNSUPPORTED when this build has no such backend
 * (CUDA in a build without CUDA: "not supported in this build");
 * PROBE_ERR_NO_DEVICE when the machine has no usable device;
 * PROBE_ERR_INVALID_ARG for an unknown kind. On error *b is zeroed. */
probe_status probe_layers_backend_init(probe_layers_backend *b,
                                       probe_backend kind, void *stream);
/* Why the backend's last init failed, where its status does not say it all
 * (CUDA: cuBLAS, opened at the first init, could not be loaded: "cannot
 * load libcublas.so.13: ..."), or NULL. */
const char *probe_layers_backend_error(probe_backend kind);
/* Frees the context; b may be zeroed or NULL. */
void probe_layers_backend_free(probe_layers_backend *b);
/* "cpu", "cuda", or "?" for an unknown kind. */
const char *probe_backend_name(probe_backend kind);
/* 1 when this build has the backend's code (the machine may still have no
 * device: see probe_layers_backend_init). */
int probe_backend_compiled(probe_backend kind);

#ifdef __cplusplus
}
#endif
#endif /* AMPPROBE_LAYERS_H */
