/*
 * layers_backend.c - the layer backends behind one table of operations
 * (probe_layer_ops, ampprobe/layers.h): the CPU table, which forwards to the
 * reference functions of layers_cpu.c, and the registry that starts a
 * backend by kind. The CUDA table lives in layers_cuda.cu and is listed here
 * only in builds with CUDA (AMPPROBE_HAVE_CUDA); elsewhere asking for it
 * gives PROBE_ERR_UNSUPPORTED ("not supported in this build"), with no stub
 * functions.
 */
#include <stdlib.h>
#include <string.h>

#include "ampprobe/layers.h"
#include "layers-backend.h"

/* ---- the CPU table: the reference functions, context unused ---------------
 */

static void cpu_destroy(void *ctx) { (void)ctx; }
static probe_status cpu_sync(void *ctx) {
  (void)ctx;
  return PROBE_OK;
}
static probe_status cpu_alloc(void *ctx, void **out, size_t bytes) {
  (void)ctx;
  if (!out)
    return PROBE_ERR_INVALID_ARG;
  *out = calloc(1, bytes ? bytes : 1);
  return *out ? PROBE_OK : PROBE_ERR_NOMEM;
}
static void cpu_free(void *ctx, void *p) {
  (void)ctx;
  free(p);
}
static probe_status cpu_copy(void *ctx, void *dst, const void *src,
                             size_t bytes) {
  (void)ctx;
  if (bytes && (!dst || !src))
    return PROBE_ERR_INVALID_ARG;
  if (dst != src && bytes)
    memmove(dst, src, bytes);
  return PROBE_OK;
}

static probe_status cpu_round(void *ctx, float *out, const float *in, size_t n,
                              probe_dtype prec) {
  (void)ctx;
  return probe_layers_round(out, in, n, prec);
}
static probe_status cpu_linear_forward(void *ctx, float *out, const float *inp,
                                       const float *weight, const float *bias,
                                       int N, int C, int OC,
                                       probe_dtype prec) {
  (void)ctx;
  return probe_linear_forward(out, inp, weight, bias, N, C, OC, prec);
}
static probe_status cpu_linear_backward(void *ctx, float *dinp, float *dweight,
                                        float *dbias, const float *dout,
                                        const float *inp, const float *weight,
                                        int N, int C, int OC,
                                        probe_dtype prec) {
  (void)ctx;
  return probe_linear_backward(dinp, dweight, dbias, dout, inp, weight, N, C,
                               OC, prec);
}
static probe_status cpu_bn_forward(void *ctx, float *out, float *mean,
                                   float *var, float *running_mean,
                                   float *running_var, const float *inp,
                                   const float *gamma, const float *beta,
                                   float momentum, float eps, int N, int C,
                                   probe_dtype prec) {
  (void)ctx;
  return probe_bn_forward(out, mean, var, running_mean, running_var, inp, gamma,
                          beta, momentum, eps, N, C, prec);
}
static probe_status cpu_bn_backward(void *ctx, float *dinp, float *dgamma,
                                    float *dbeta, const float *dout,
                                    const float *inp, const float *mean,
                                    const float *var, const float *gamma,
                                    float eps, int N, int C,
                                    probe_dtype prec) {
  (void)ctx;
  return probe_bn_backward(dinp, dgamma, dbeta, dout, inp, mean, var, gamma,
                           eps, N, C, prec);
}
static probe_status cpu_bn_forward_eval(void *ctx, float *out, const float *inp,
                                        const float *gamma, const float *beta,
                                        const float *running_mean,
                                        const float *running_var, float eps,
                                        int N, int C, probe_dtype prec) {
  (void)ctx;
  return probe_bn_forward_eval(out, inp, gamma, beta, running_mean, running_var,
                               eps, N, C, prec);
}
static probe_status cpu_layernorm_forward(void *ctx, float *out, float *mean,
                                          float *rstd, float *var,
                                          const float *inp, const float *weight,
                                          const float *bias, float eps, int N,
                                          int C, probe_dtype prec) {
  (void)ctx;
  return probe_layernorm_forward(out, mean, rstd, var, inp, weight, bias, eps,
                                 N, C, prec);
}
static probe_status cpu_layernorm_backward(void *ctx, float *dinp,
                                           float *dweight, float *dbias,
                                           const float *dout, const float *inp,
                                           const float *mean, const float *rstd,
                                           const float *weight, int N, int C,
                                           probe_dtype prec) {
  (void)ctx;
  return probe_layernorm_backward(dinp, dweight, dbias, dout, inp, mean, rstd,
                                  weight, N, C, prec);
}
static probe_status cpu_revin_norm_forward(void *ctx, float *out, float *mean,
                                           float *stdev, float *var,
                                           const float *inp, const float *gamma,
                                           const float *beta, float eps, int B,
                                           int T, int C, probe_dtype prec) {
  (void)ctx;
  return probe_revin_norm_forward(out, mean, stdev, var, inp, gamma, beta, eps,
                                  B, T, C, prec);
}
static probe_status
cpu_revin_norm_backward(void *ctx, float *dinp, float *dgamma, float *dbeta,
                        const float *dout, const float *inp, const float *mean,
                        const float *stdev, const float *gamma, int B, int T,
                        int C, probe_dtype prec) {
  (void)ctx;
  return probe_revin_norm_backward(dinp, dgamma, dbeta, dout, inp, mean, stdev,
                                   gamma, B, T, C, prec);
}
static probe_status
cpu_revin_denorm_forward(void *ctx, float *out, const float *y,
                         const float *mean, const float *stdev,
                         const float *gamma, const float *beta, float eps,
                         int B, int H, int C, probe_dtype prec) {
  (void)ctx;
  return probe_revin_denorm_forward(out, y, mean, stdev, gamma, beta, eps, B, H,
                                    C, prec);
}
static probe_status
cpu_revin_denorm_backward(void *ctx, float *dy, float *dgamma, float *dbeta,
                          const float *dout, const float *y, const float *stdev,
                          const float *gamma, const float *beta, float eps,
                          int B, int H, int C, probe_dtype prec) {
  (void)ctx;
  return probe_revin_denorm_backward(dy, dgamma, dbeta, dout, y, stdev, gamma,
                                     beta, eps, B, H, C, prec);
}
static probe_status cpu_relu_forward(void *ctx, float *out, const float *inp,
                                     size_t n, probe_dtype prec) {
  (void)ctx;
  return probe_relu_forward(out, inp, n, prec);
}
static probe_status cpu_relu_backward(void *ctx, float *dinp, const float *dout,
                                      const float *inp, size_t n,
                                      probe_dtype prec) {
  (void)ctx;
  return probe_relu_backward(dinp, dout, inp, n, prec);
}
static probe_status cpu_gelu_forward(void *ctx, float *out, const float *inp,
                                     size_t n, probe_dtype prec) {
  (void)ctx;
  return probe_gelu_forward(out, inp, n, prec);
}
static probe_status cpu_gelu_backward(void *ctx, float *dinp, const float *dout,
                                      const float *inp, size_t n,
                                      probe_dtype prec) {
  (void)ctx;
  return probe_gelu_backward(dinp, dout, inp, n, prec);
}
static probe_status cpu_softmax_forward(void *ctx, float *probs,
                                        const float *logits, int N, int V,
                                        probe_dtype prec) {
  (void)ctx;
  return probe_softmax_forward(probs, logits, N, V, prec);
}
static probe_status cpu_softmax_backward(void *ctx, float *dlogits,
                                         const float *dprobs,
                                         const float *probs, int N, int V,
                                         probe_dtype prec) {
  (void)ctx;
  return probe_softmax_backward(dlogits, dprobs, probs, N, V, prec);
}
static probe_status cpu_attention_forward(
    void *ctx, float *out, float *qkv, float *scores, float *probs, float *atty,
    const float *inp, const float *wqkv, const float *bqkv, const float *wo,
    const float *bo, int causal, int B, int T, int C, probe_dtype prec) {
  (void)ctx;
  return probe_attention_forward(out, qkv, scores, probs, atty, inp, wqkv, bqkv,
                                 wo, bo, causal, B, T, C, prec);
}
static probe_status
cpu_attention_backward(void *ctx, float *dinp, float *dwqkv, float *dbqkv,
                       float *dwo, float *dbo, float *dqkv, float *datty,
                       float *dprobs, float *dscores, const float *dout,
                       const float *inp, const float *qkv, const float *probs,
                       const float *atty, const float *wqkv, const float *wo,
                       int B, int T, int C, probe_dtype prec) {
  (void)ctx;
  return probe_attention_backward(dinp, dwqkv, dbqkv, dwo, dbo, dqkv, datty,
                                  dprobs, dscores, dout, inp, qkv, probs, atty,
                                  wqkv, wo, B, T, C, prec);
}
static probe_status cpu_mse_forward(void *ctx, float *loss, const float *pred,
                                    const float *target, size_t n,
                                    probe_dtype prec) {
  (void)ctx;
  return probe_mse_forward(loss, pred, target, n, prec);
}
static probe_status cpu_mse_backward(void *ctx, float *dpred, const float *pred,
                                     const float *target, float dloss, size_t n,
                                     probe_dtype prec) {
  (void)ctx;
  return probe_mse_backward(dpred, pred, target, dloss, n, prec);
}
static probe_status cpu_crossentropy_forward(void *ctx, float *loss,
                                             float *losses, const float *probs,
                                             const int *targets, int N, int V,
                                             probe_dtype prec) {
  (void)ctx;
  return probe_crossentropy_forward(loss, losses, probs, targets, N, V, prec);
}
static probe_status cpu_crossentropy_backward(void *ctx, float *dprobs,
                                              const float *probs,
                                              const int *targets, float dloss,
                                              int N, int V,
                                              probe_dtype prec) {
  (void)ctx;
  return probe_crossentropy_backward(dprobs, probs, targets, dloss, N, V, prec);
}
static probe_status cpu_grads_l2norm(void *ctx, double *out,
                                     float *const *grads, const size_t *sizes,
                                     size_t count) {
  (void)ctx;
  return probe_grads_l2norm(out, grads, sizes, count);
}
static probe_status cpu_grads_scale(void *ctx, float *const *grads,
                                    const size_t *sizes, size_t count,
                                    float factor, int *found_nonfinite) {
  (void)ctx;
  return probe_grads_scale(grads, sizes, count, factor, found_nonfinite);
}

static const probe_layer_ops cpu_ops = {
    .name = "cpu",
    .device_memory = 0,
    .destroy = cpu_destroy,
    .sync = cpu_sync,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .copy = cpu_copy,
    .round = cpu_round,
    .linear_forward = cpu_linear_forward,
    .linear_backward = cpu_linear_backward,
    .bn_forward = cpu_bn_forward,
    .bn_backward = cpu_bn_backward,
    .bn_forward_eval = cpu_bn_forward_eval,
    .layernorm_forward = cpu_layernorm_forward,
    .layernorm_backward = cpu_layernorm_backward,
    .revin_norm_forward = cpu_revin_norm_forward,
    .revin_norm_backward = cpu_revin_norm_backward,
    .revin_denorm_forward = cpu_revin_denorm_forward,
    .revin_denorm_backward = cpu_revin_denorm_backward,
    .relu_forward = cpu_relu_forward,
    .relu_backward = cpu_relu_backward,
    .gelu_forward = cpu_gelu_forward,
    .gelu_backward = cpu_gelu_backward,
    .softmax_forward = cpu_softmax_forward,
    .softmax_backward = cpu_softmax_backward,
    .attention_forward = cpu_attention_forward,
    .attention_backward = cpu_attention_backward,
    .mse_forward = cpu_mse_forward,
    .mse_backward = cpu_mse_backward,
    .crossentropy_forward = cpu_crossentropy_forward,
    .crossentropy_backward = cpu_crossentropy_backward,
    .grads_l2norm = cpu_grads_l2norm,
    .grads_scale = cpu_grads_scale,
};

static probe_status cpu_create(void **ctx, void *stream) {
  (void)stream;
  *ctx = NULL;
  return PROBE_OK;
}

/* ---- the registry ---------------------------------------------------------
 */

typedef struct backend_entry {
  probe_backend kind;
  const char *name;
  const probe_layer_ops *(*ops)(void); /* NULL: not in this build */
  probe_status (*create)(void **ctx, void *stream);
  const char *(*error)(void); /* NULL: its status says it all */
} backend_entry;

static const probe_layer_ops *cpu_table(void) { return &cpu_ops; }

static const backend_entry registry[] = {
    {PROBE_BACKEND_CPU, "cpu", cpu_table, cpu_create, NULL},
#ifdef AMPPROBE_HAVE_CUDA
    {PROBE_BACKEND_CUDA, "cuda", probe__cuda_layer_ops,
     probe__cuda_layers_create, probe__cuda_layers_error},
#else
    {PROBE_BACKEND_CUDA, "cuda", NULL, NULL, NULL},
#endif
};

static const backend_entry *find(probe_backend kind) {
  for (size_t i = 0; i < sizeof registry / sizeof *registry; i++)
    if (registry[i].kind == kind)
      return &registry[i];
  return NULL;
}

const char *probe_backend_name(probe_backend kind) {
  const backend_entry *e = find(kind);
  return e ? e->name : "?";
}

int probe_backend_compiled(probe_backend kind) {
  const backend_entry *e = find(kind);
  return e && e->ops;
}

probe_status probe_layers_backend_init(probe_layers_backend *b,
                                       probe_backend kind, void *stream) {
  if (!b)
    return PROBE_ERR_INVALID_ARG;
  memset(b, 0, sizeof *b);
  const backend_entry *e = find(kind);
  if (!e)
    return PROBE_ERR_INVALID_ARG;
  if (!e->ops)
    return PROBE_ERR_UNSUPPORTED;
  void *ctx = NULL;
  probe_status st = e->create(&ctx, stream);
  if (st != PROBE_OK)
    return st;
  b->ops = e->ops();
  b->ctx = ctx;
  b->kind = kind;
  return PROBE_OK;
}

const char *probe_layers_backend_error(probe_backend kind) {
  const backend_entry *e = find(kind);
  return e && e->error ? e->error() : NULL;
}

void probe_layers_backend_free(probe_layers_backend *b) {
  if (!b || !b->ops)
    return;
  b->ops->destroy(b->ctx);
  memset(b, 0, sizeof *b);
}
