/*
 * layers_nocuda.c - the CUDA entry points of ampprobe/layers.h in a build
 * without CUDA: every call returns PROBE_ERR_UNSUPPORTED (destroy does
 * nothing), so code calling them links and fails politely.
 */
#include "ampprobe/layers.h"

probe_status probe_cuda_layers_create(probe_cuda_layers **out, void *stream) {
  if (out)
    *out = NULL;
  return PROBE_ERR_UNSUPPORTED;
}

void probe_cuda_layers_destroy(probe_cuda_layers *ctx) { (void)ctx; }

probe_status probe_cuda_layers_sync(probe_cuda_layers *ctx) {
  return PROBE_ERR_UNSUPPORTED;
}

probe_status probe_cuda_layers_round(probe_cuda_layers *ctx, float *out,
                                     const float *in, size_t n,
                                     probe_precision prec) {
  return PROBE_ERR_UNSUPPORTED;
}

probe_status probe_cuda_linear_forward(probe_cuda_layers *ctx, float *out,
                                       const float *inp, const float *weight,
                                       const float *bias, int N, int C, int OC,
                                       probe_precision prec) {
  return PROBE_ERR_UNSUPPORTED;
}

probe_status probe_cuda_linear_backward(probe_cuda_layers *ctx, float *dinp,
                                        float *dweight, float *dbias,
                                        const float *dout, const float *inp,
                                        const float *weight, int N, int C,
                                        int OC, probe_precision prec) {
  return PROBE_ERR_UNSUPPORTED;
}

probe_status probe_cuda_bn_forward(probe_cuda_layers *ctx, float *out,
                                   float *mean, float *var, float *running_mean,
                                   float *running_var, const float *inp,
                                   const float *gamma, const float *beta,
                                   float momentum, float eps, int N, int C,
                                   probe_precision prec) {
  return PROBE_ERR_UNSUPPORTED;
}

probe_status probe_cuda_bn_backward(probe_cuda_layers *ctx, float *dinp,
                                    float *dgamma, float *dbeta,
                                    const float *dout, const float *inp,
                                    const float *mean, const float *var,
                                    const float *gamma, float eps, int N, int C,
                                    probe_precision prec) {
  return PROBE_ERR_UNSUPPORTED;
}

probe_status probe_cuda_bn_forward_eval(probe_cuda_layers *ctx, float *out,
                                        const float *inp, const float *gamma,
                                        const float *beta,
                                        const float *running_mean,
                                        const float *running_var, float eps,
                                        int N, int C, probe_precision prec) {
  return PROBE_ERR_UNSUPPORTED;
}

probe_status probe_cuda_layernorm_forward(probe_cuda_layers *ctx, float *out,
                                          float *mean, float *rstd,
                                          const float *inp, const float *weight,
                                          const float *bias, float eps, int N,
                                          int C, probe_precision prec) {
  return PROBE_ERR_UNSUPPORTED;
}

probe_status probe_cuda_layernorm_backward(probe_cuda_layers *ctx, float *dinp,
                                           float *dweight, float *dbias,
                                           const float *dout, const float *inp,
                                           const float *mean, const float *rstd,
                                           const float *weight, int N, int C,
                                           probe_precision prec) {
  return PROBE_ERR_UNSUPPORTED;
}

probe_status probe_cuda_revin_norm_forward(probe_cuda_layers *ctx, float *out,
                                           float *mean, float *stdev,
                                           const float *inp, const float *gamma,
                                           const float *beta, float eps, int B,
                                           int T, int C, probe_precision prec) {
  return PROBE_ERR_UNSUPPORTED;
}

probe_status probe_cuda_revin_norm_backward(
    probe_cuda_layers *ctx, float *dinp, float *dgamma, float *dbeta,
    const float *dout, const float *inp, const float *mean, const float *stdev,
    const float *gamma, int B, int T, int C, probe_precision prec) {
  return PROBE_ERR_UNSUPPORTED;
}

probe_status probe_cuda_revin_denorm_forward(
    probe_cuda_layers *ctx, float *out, const float *y, const float *mean,
    const float *stdev, const float *gamma, const float *beta, float eps, int B,
    int H, int C, probe_precision prec) {
  return PROBE_ERR_UNSUPPORTED;
}

probe_status probe_cuda_revin_denorm_backward(
    probe_cuda_layers *ctx, float *dy, float *dgamma, float *dbeta,
    const float *dout, const float *y, const float *stdev, const float *gamma,
    const float *beta, float eps, int B, int H, int C, probe_precision prec) {
  return PROBE_ERR_UNSUPPORTED;
}

probe_status probe_cuda_relu_forward(probe_cuda_layers *ctx, float *out,
                                     const float *inp, size_t n,
                                     probe_precision prec) {
  return PROBE_ERR_UNSUPPORTED;
}

probe_status probe_cuda_relu_backward(probe_cuda_layers *ctx, float *dinp,
                                      const float *dout, const float *inp,
                                      size_t n, probe_precision prec) {
  return PROBE_ERR_UNSUPPORTED;
}

probe_status probe_cuda_gelu_forward(probe_cuda_layers *ctx, float *out,
                                     const float *inp, size_t n,
                                     probe_precision prec) {
  return PROBE_ERR_UNSUPPORTED;
}

probe_status probe_cuda_gelu_backward(probe_cuda_layers *ctx, float *dinp,
                                      const float *dout, const float *inp,
                                      size_t n, probe_precision prec) {
  return PROBE_ERR_UNSUPPORTED;
}

probe_status probe_cuda_softmax_forward(probe_cuda_layers *ctx, float *probs,
                                        const float *logits, int N, int V,
                                        probe_precision prec) {
  return PROBE_ERR_UNSUPPORTED;
}

probe_status probe_cuda_softmax_backward(probe_cuda_layers *ctx, float *dlogits,
                                         const float *dprobs,
                                         const float *probs, int N, int V,
                                         probe_precision prec) {
  return PROBE_ERR_UNSUPPORTED;
}

probe_status probe_cuda_attention_forward(probe_cuda_layers *ctx, float *out,
                                          float *qkv, float *scores,
                                          float *probs, float *atty,
                                          const float *inp, const float *wqkv,
                                          const float *bqkv, const float *wo,
                                          const float *bo, int causal, int B,
                                          int T, int C, probe_precision prec) {
  return PROBE_ERR_UNSUPPORTED;
}

probe_status probe_cuda_attention_backward(
    probe_cuda_layers *ctx, float *dinp, float *dwqkv, float *dbqkv, float *dwo,
    float *dbo, float *dqkv, float *datty, float *dprobs, float *dscores,
    const float *dout, const float *inp, const float *qkv, const float *probs,
    const float *atty, const float *wqkv, const float *wo, int B, int T, int C,
    probe_precision prec) {
  return PROBE_ERR_UNSUPPORTED;
}

probe_status probe_cuda_mse_forward(probe_cuda_layers *ctx, float *loss,
                                    const float *pred, const float *target,
                                    size_t n, probe_precision prec) {
  return PROBE_ERR_UNSUPPORTED;
}

probe_status probe_cuda_mse_backward(probe_cuda_layers *ctx, float *dpred,
                                     const float *pred, const float *target,
                                     float dloss, size_t n,
                                     probe_precision prec) {
  return PROBE_ERR_UNSUPPORTED;
}

probe_status probe_cuda_crossentropy_forward(probe_cuda_layers *ctx,
                                             float *loss, float *losses,
                                             const float *probs,
                                             const int *targets, int N, int V,
                                             probe_precision prec) {
  return PROBE_ERR_UNSUPPORTED;
}

probe_status probe_cuda_crossentropy_backward(probe_cuda_layers *ctx,
                                              float *dprobs, const float *probs,
                                              const int *targets, float dloss,
                                              int N, int V,
                                              probe_precision prec) {
  return PROBE_ERR_UNSUPPORTED;
}

probe_status probe_cuda_grads_l2norm(probe_cuda_layers *ctx, double *out,
                                     float *const *grads, const size_t *sizes,
                                     size_t count) {
  return PROBE_ERR_UNSUPPORTED;
}

probe_status probe_cuda_grads_scale(probe_cuda_layers *ctx, float *const *grads,
                                    const size_t *sizes, size_t count,
                                    float factor, int *found_nonfinite) {
  return PROBE_ERR_UNSUPPORTED;
}
