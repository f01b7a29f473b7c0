/*
 * layers_cpu.c - CPU reference of the trainer's layer kernels (see
 * include/ampprobe/layers.h and docs/precision.md).
 *
 * Every tensor is stored as float. In FP16/BF16 mode a module rounds its
 * inputs and weights on entry (rnd), accumulates in float, and rounds every
 * tensor it materialises; in FP32 mode rnd is the identity. GEMMs go through
 * cblas_sgemm on the rounded operands. This file is the one treated as
 * correct: the CUDA kernels and PyTorch are compared against it.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cblas.h>

#include "ampprobe/layers.h"
#include "ampprobe/numerics.h"
#include "layers-impl.h"

#define CHECK_ARG(cond)                                                        \
  do {                                                                         \
    if (!(cond))                                                               \
      return PROBE_ERR_INVALID_ARG;                                            \
  } while (0)

#define PREC_OK(p)                                                             \
  ((p) == PROBE_DTYPE_F32 || (p) == PROBE_DTYPE_F16 || (p) == PROBE_DTYPE_BF16)

static inline float rnd(float x, probe_dtype p) { return pl_rnd(x, p); }

float probe_layers_round1(float x, probe_dtype prec) {
  return rnd(x, prec);
}

static void round_array(float *out, const float *in, size_t n,
                        probe_dtype p) {
  if (p == PROBE_DTYPE_F32) {
    if (out != in)
      memcpy(out, in, n * sizeof *out);
    return;
  }
  for (size_t i = 0; i < n; i++)
    out[i] = rnd(in[i], p);
}

probe_status probe_layers_round(float *out, const float *in, size_t n,
                                probe_dtype prec) {
  CHECK_ARG((out && in) || n == 0);
  CHECK_ARG(PREC_OK(prec));
  round_array(out, in, n, prec);
  return PROBE_OK;
}

/* Returns `in` itself in FP32 mode, else a malloc'd rounded copy in *tmp
 * (freed by the caller). NULL only when allocation failed. */
static const float *rounded_input(const float *in, size_t n, probe_dtype p,
                                  float **tmp) {
  *tmp = NULL;
  if (p == PROBE_DTYPE_F32)
    return in;
  *tmp = malloc((n ? n : 1) * sizeof(float));
  if (!*tmp)
    return NULL;
  round_array(*tmp, in, n, p);
  return *tmp;
}

/* ---- linear -------------------------------------------------------------- */

probe_status probe_linear_forward(float *out, const float *inp,
                                  const float *weight, const float *bias, int N,
                                  int C, int OC, probe_dtype prec) {
  CHECK_ARG(out && inp && weight && N > 0 && C > 0 && OC > 0);
  CHECK_ARG(PREC_OK(prec));
  float *ti, *tw;
  const float *x = rounded_input(inp, (size_t)N * C, prec, &ti);
  const float *w = rounded_input(weight, (size_t)OC * C, prec, &tw);
  if (!x || !w) {
    free(ti);
    free(tw);
    return PROBE_ERR_NOMEM;
  }
  /* out(N,OC) = x(N,C) @ w(OC,C)^T, FP32 accumulation */
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, OC, C, 1.0f, x, C, w,
              C, 0.0f, out, OC);
  for (int n = 0; n < N; n++) {
    float *o = out + (size_t)n * OC;
    for (int j = 0; j < OC; j++)
      o[j] = pl_bias_round(o[j], bias, j, prec);
  }
  free(ti);
  free(tw);
  return PROBE_OK;
}

probe_status probe_linear_backward(float *dinp, float *dweight, float *dbias,
                                   const float *dout, const float *inp,
                                   const float *weight, int N, int C, int OC,
                                   probe_dtype prec) {
  CHECK_ARG(dout && N > 0 && C > 0 && OC > 0);
  CHECK_ARG(!dinp || weight);
  CHECK_ARG(!dweight || inp);
  CHECK_ARG(PREC_OK(prec));
  probe_status st = PROBE_OK;
  float *td = NULL, *ti = NULL, *tw = NULL, *tg = NULL;
  const float *g = rounded_input(dout, (size_t)N * OC, prec, &td);
  if (!g)
    return PROBE_ERR_NOMEM;
  if (dinp) {
    const float *w = rounded_input(weight, (size_t)OC * C, prec, &tw);
    if (!w) {
      st = PROBE_ERR_NOMEM;
      goto done;
    }
    /* dinp(N,C) = g(N,OC) @ w(OC,C) */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, C, OC, 1.0f, g,
                OC, w, C, 0.0f, dinp, C);
    if (prec != PROBE_DTYPE_F32)
      round_array(dinp, dinp, (size_t)N * C, prec);
  }
  if (dweight) {
    const float *x = rounded_input(inp, (size_t)N * C, prec, &ti);
    if (!x) {
      st = PROBE_ERR_NOMEM;
      goto done;
    }
    if (prec == PROBE_DTYPE_F32) {
      /* dweight(OC,C) += g^T(OC,N) @ x(N,C) */
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, C, N, 1.0f, g,
                  OC, x, C, 1.0f, dweight, C);
    } else {
      tg = malloc((size_t)OC * C * sizeof *tg);
      if (!tg) {
        st = PROBE_ERR_NOMEM;
        goto done;
      }
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, C, N, 1.0f, g,
                  OC, x, C, 0.0f, tg, C);
      for (size_t i = 0; i < (size_t)OC * C; i++)
        dweight[i] += rnd(tg[i], prec);
    }
  }
  if (dbias)
    for (int j = 0; j < OC; j++)
      pl_colsum_acc(dbias, dout, N, OC, j, prec);
done:
  free(td);
  free(ti);
  free(tw);
  free(tg);
  return st;
}

/* ---- batchnorm1d --------------------------------------------------------- */

probe_status probe_bn_forward(float *out, float *mean, float *var,
                              float *running_mean, float *running_var,
                              const float *inp, const float *gamma,
                              const float *beta, float momentum, float eps,
                              int N, int C, probe_dtype prec) {
  CHECK_ARG(out && mean && var && inp && gamma && beta && N >= 2 && C > 0);
  CHECK_ARG(PREC_OK(prec));
  for (int c = 0; c < C; c++)
    pl_bn_forward_col(out, mean, var, running_mean, running_var, inp, gamma,
                      beta, momentum, eps, N, C, c, prec);
  return PROBE_OK;
}

probe_status probe_bn_backward(float *dinp, float *dgamma, float *dbeta,
                               const float *dout, const float *inp,
                               const float *mean, const float *var,
                               const float *gamma, float eps, int N, int C,
                               probe_dtype prec) {
  CHECK_ARG(dinp && dout && inp && mean && var && gamma && N >= 2 && C > 0);
  CHECK_ARG(PREC_OK(prec));
  for (int c = 0; c < C; c++)
    pl_bn_backward_col(dinp, dgamma, dbeta, dout, inp, mean, var, gamma, eps, N,
                       C, c, prec);
  return PROBE_OK;
}

probe_status probe_bn_forward_eval(float *out, const float *inp,
                                   const float *gamma, const float *beta,
                                   const float *running_mean,
                                   const float *running_var, float eps, int N,
                                   int C, probe_dtype prec) {
  CHECK_ARG(out && inp && gamma && beta && running_mean && running_var);
  CHECK_ARG(N > 0 && C > 0 && PREC_OK(prec));
  for (int n = 0; n < N; n++)
    for (int c = 0; c < C; c++) {
      size_t i = (size_t)n * C + c;
      out[i] = pl_bn_eval(inp[i], running_mean[c], running_var[c], gamma[c],
                          beta[c], eps, prec);
    }
  return PROBE_OK;
}

/* ---- layernorm ----------------------------------------------------------- */

probe_status probe_layernorm_forward(float *out, float *mean, float *rstd,
                                     float *var, const float *inp,
                                     const float *weight, const float *bias,
                                     float eps, int N, int C,
                                     probe_dtype prec) {
  CHECK_ARG(out && mean && rstd && inp && weight && bias && N > 0 && C > 0);
  CHECK_ARG(PREC_OK(prec));
  for (int n = 0; n < N; n++)
    pl_ln_forward_row(out + (size_t)n * C, mean + n, rstd + n,
                      var ? var + n : NULL, inp + (size_t)n * C, weight, bias,
                      eps, C, prec);
  return PROBE_OK;
}

probe_status probe_layernorm_backward(float *dinp, float *dweight, float *dbias,
                                      const float *dout, const float *inp,
                                      const float *mean, const float *rstd,
                                      const float *weight, int N, int C,
                                      probe_dtype prec) {
  CHECK_ARG(dinp && dout && inp && mean && rstd && weight && N > 0 && C > 0);
  CHECK_ARG(PREC_OK(prec));
  for (int n = 0; n < N; n++)
    pl_ln_backward_row(dinp + (size_t)n * C, dout + (size_t)n * C,
                       inp + (size_t)n * C, mean[n], rstd[n], weight, C, prec);
  if (dweight || dbias)
    for (int i = 0; i < C; i++)
      pl_ln_backward_col(dweight, dbias, dout, inp, mean, rstd, N, C, i, prec);
  return PROBE_OK;
}

/* ---- RevIN --------------------------------------------------------------- */

probe_status probe_revin_norm_forward(float *out, float *mean, float *stdev,
                                      float *var, const float *inp,
                                      const float *gamma, const float *beta,
                                      float eps, int B, int T, int C,
                                      probe_dtype prec) {
  CHECK_ARG(out && mean && stdev && inp && B > 0 && T > 0 && C > 0);
  CHECK_ARG(!gamma == !beta);
  CHECK_ARG(PREC_OK(prec));
  for (int b = 0; b < B; b++)
    for (int c = 0; c < C; c++)
      pl_revin_norm_series(out, mean, stdev, var, inp, gamma, beta, eps, T, C,
                           b, c, prec);
  return PROBE_OK;
}

probe_status probe_revin_norm_backward(float *dinp, float *dgamma, float *dbeta,
                                       const float *dout, const float *inp,
                                       const float *mean, const float *stdev,
                                       const float *gamma, int B, int T, int C,
                                       probe_dtype prec) {
  CHECK_ARG(dinp && dout && inp && mean && stdev && B > 0 && T > 0 && C > 0);
  CHECK_ARG(PREC_OK(prec));
  for (size_t i = 0; i < (size_t)B * T * C; i++) {
    int c = (int)(i % C), b = (int)(i / ((size_t)T * C));
    dinp[i] =
        pl_revin_norm_dx(dout[i], gamma, stdev[(size_t)b * C + c], c, prec);
  }
  if (gamma && (dgamma || dbeta))
    for (int c = 0; c < C; c++)
      pl_revin_norm_dparams_col(dgamma, dbeta, dout, inp, mean, stdev, B, T, C,
                                c, prec);
  return PROBE_OK;
}

probe_status probe_revin_denorm_forward(float *out, const float *y,
                                        const float *mean, const float *stdev,
                                        const float *gamma, const float *beta,
                                        float eps, int B, int H, int C,
                                        probe_dtype prec) {
  CHECK_ARG(out && y && mean && stdev && B > 0 && H > 0 && C > 0);
  CHECK_ARG(!gamma == !beta);
  CHECK_ARG(PREC_OK(prec));
  for (size_t i = 0; i < (size_t)B * H * C; i++) {
    int c = (int)(i % C), b = (int)(i / ((size_t)H * C));
    size_t s = (size_t)b * C + c;
    out[i] =
        pl_revin_denorm(y[i], mean[s], stdev[s], gamma, beta, c, eps, prec);
  }
  return PROBE_OK;
}

probe_status probe_revin_denorm_backward(float *dy, float *dgamma, float *dbeta,
                                         const float *dout, const float *y,
                                         const float *stdev, const float *gamma,
                                         const float *beta, float eps, int B,
                                         int H, int C, probe_dtype prec) {
  CHECK_ARG(dy && dout && y && stdev && B > 0 && H > 0 && C > 0);
  CHECK_ARG(!gamma == !beta);
  CHECK_ARG(PREC_OK(prec));
  for (size_t i = 0; i < (size_t)B * H * C; i++) {
    int c = (int)(i % C), b = (int)(i / ((size_t)H * C));
    dy[i] = pl_revin_denorm_dy(dout[i], stdev[(size_t)b * C + c], gamma, c, eps,
                               prec);
  }
  if (gamma && (dgamma || dbeta))
    for (int c = 0; c < C; c++)
      pl_revin_denorm_dparams_col(dgamma, dbeta, dout, y, stdev, gamma, beta,
                                  eps, B, H, C, c, prec);
  return PROBE_OK;
}

/* ---- activations --------------------------------------------------------- */

probe_status probe_relu_forward(float *out, const float *inp, size_t n,
                                probe_dtype prec) {
  CHECK_ARG((out && inp) || n == 0);
  CHECK_ARG(PREC_OK(prec));
  for (size_t i = 0; i < n; i++)
    out[i] = pl_relu(inp[i], prec);
  return PROBE_OK;
}

probe_status probe_relu_backward(float *dinp, const float *dout,
                                 const float *inp, size_t n,
                                 probe_dtype prec) {
  CHECK_ARG((dinp && dout && inp) || n == 0);
  CHECK_ARG(PREC_OK(prec));
  for (size_t i = 0; i < n; i++)
    dinp[i] = pl_relu_grad(dout[i], inp[i], prec);
  return PROBE_OK;
}

probe_status probe_gelu_forward(float *out, const float *inp, size_t n,
                                probe_dtype prec) {
  CHECK_ARG((out && inp) || n == 0);
  CHECK_ARG(PREC_OK(prec));
  for (size_t i = 0; i < n; i++)
    out[i] = pl_gelu(inp[i], prec);
  return PROBE_OK;
}

probe_status probe_gelu_backward(float *dinp, const float *dout,
                                 const float *inp, size_t n,
                                 probe_dtype prec) {
  CHECK_ARG((dinp && dout && inp) || n == 0);
  CHECK_ARG(PREC_OK(prec));
  for (size_t i = 0; i < n; i++)
    dinp[i] = pl_gelu_grad(dout[i], inp[i], prec);
  return PROBE_OK;
}

/* ---- softmax ------------------------------------------------------------- */

probe_status probe_softmax_forward(float *probs, const float *logits, int N,
                                   int V, probe_dtype prec) {
  CHECK_ARG(probs && logits && N > 0 && V > 0);
  CHECK_ARG(PREC_OK(prec));
  for (int n = 0; n < N; n++)
    pl_softmax_row(probs + (size_t)n * V, logits + (size_t)n * V, V, prec);
  return PROBE_OK;
}

probe_status probe_softmax_backward(float *dlogits, const float *dprobs,
                                    const float *probs, int N, int V,
                                    probe_dtype prec) {
  CHECK_ARG(dlogits && dprobs && probs && N > 0 && V > 0);
  CHECK_ARG(PREC_OK(prec));
  for (int n = 0; n < N; n++)
    pl_softmax_row_grad(dlogits + (size_t)n * V, dprobs + (size_t)n * V,
                        probs + (size_t)n * V, V, prec);
  return PROBE_OK;
}

/* ---- attention ----------------------------------------------------------- */

probe_status probe_attention_forward(float *out, float *qkv, float *scores,
                                     float *probs, float *atty,
                                     const float *inp, const float *wqkv,
                                     const float *bqkv, const float *wo,
                                     const float *bo, int causal, int B, int T,
                                     int C, probe_dtype prec) {
  CHECK_ARG(out && qkv && scores && probs && atty && inp && wqkv && wo);
  CHECK_ARG(B > 0 && T > 0 && C > 0);
  CHECK_ARG(PREC_OK(prec));
  int N = B * T, C3 = 3 * C;
  probe_status st = probe_linear_forward(qkv, inp, wqkv, bqkv, N, C, C3, prec);
  if (st != PROBE_OK)
    return st;
  float scale = 1.0f / sqrtf((float)C);
  for (int b = 0; b < B; b++) {
    const float *q = qkv + (size_t)b * T * C3;
    const float *k = q + C, *v = q + 2 * C;
    float *sc = scores + (size_t)b * T * T;
    /* sc(T,T) = scale * q(T,C) @ k(T,C)^T (rows of q, k have stride 3C) */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, C, scale, q, C3,
                k, C3, 0.0f, sc, T);
    for (int i = 0; i < T; i++)
      for (int j = 0; j < T; j++) {
        float *e = &sc[(size_t)i * T + j];
        *e = (causal && j > i) ? -INFINITY : rnd(*e, prec);
      }
    float *pb = probs + (size_t)b * T * T;
    st = probe_softmax_forward(pb, sc, T, T, prec);
    if (st != PROBE_OK)
      return st;
    /* atty(T,C) = p(T,T) @ v(T,C) */
    float *y = atty + (size_t)b * T * C;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, C, T, 1.0f, pb, T,
                v, C3, 0.0f, y, C);
  }
  if (prec != PROBE_DTYPE_F32)
    round_array(atty, atty, (size_t)N * C, prec);
  return probe_linear_forward(out, atty, wo, bo, N, C, C, prec);
}

probe_status probe_attention_backward(float *dinp, float *dwqkv, float *dbqkv,
                                      float *dwo, float *dbo, float *dqkv,
                                      float *datty, float *dprobs,
                                      float *dscores, const float *dout,
                                      const float *inp, const float *qkv,
                                      const float *probs, const float *atty,
                                      const float *wqkv, const float *wo, int B,
                                      int T, int C, probe_dtype prec) {
  CHECK_ARG(dinp && dwqkv && dwo && dqkv && datty && dprobs && dscores);
  CHECK_ARG(dout && inp && qkv && probs && atty && wqkv && wo);
  CHECK_ARG(B > 0 && T > 0 && C > 0);
  CHECK_ARG(PREC_OK(prec));
  int N = B * T, C3 = 3 * C;
  float scale = 1.0f / sqrtf((float)C);
  probe_status st =
      probe_linear_backward(datty, dwo, dbo, dout, atty, wo, N, C, C, prec);
  if (st != PROBE_OK)
    return st;
  for (int b = 0; b < B; b++) {
    const float *q = qkv + (size_t)b * T * C3;
    const float *k = q + C, *v = q + 2 * C;
    const float *pb = probs + (size_t)b * T * T;
    const float *dy = datty + (size_t)b * T * C;
    float *dq = dqkv + (size_t)b * T * C3;
    float *dk = dq + C, *dv = dq + 2 * C;
    float *dp = dprobs + (size_t)b * T * T;
    float *ds = dscores + (size_t)b * T * T;
    /* dp(T,T) = dy(T,C) @ v(T,C)^T */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, C, 1.0f, dy, C,
                v, C3, 0.0f, dp, T);
    /* dv(T,C) = p^T(T,T) @ dy(T,C) */
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, C, T, 1.0f, pb, T,
                dy, C, 0.0f, dv, C3);
    if (prec != PROBE_DTYPE_F32)
      round_array(dp, dp, (size_t)T * T, prec);
    st = probe_softmax_backward(ds, dp, pb, T, T, prec);
    if (st != PROBE_OK)
      return st;
    /* dq(T,C) = scale * ds(T,T) @ k(T,C); dk(T,C) = scale * ds^T @ q */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, C, T, scale, ds,
                T, k, C3, 0.0f, dq, C3);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, C, T, scale, ds, T,
                q, C3, 0.0f, dk, C3);
  }
  if (prec != PROBE_DTYPE_F32)
    round_array(dqkv, dqkv, (size_t)N * C3, prec);
  return probe_linear_backward(dinp, dwqkv, dbqkv, dqkv, inp, wqkv, N, C, C3,
                               prec);
}

/* ---- losses -------------------------------------------------------------- */

probe_status probe_mse_forward(float *loss, const float *pred,
                               const float *target, size_t n,
                               probe_dtype prec) {
  CHECK_ARG(loss && pred && target && n > 0);
  CHECK_ARG(PREC_OK(prec));
  float s = 0.0f;
  for (size_t i = 0; i < n; i++)
    s += pl_mse_term(pred[i], target[i], prec);
  *loss = rnd(s / (float)n, prec);
  return PROBE_OK;
}

probe_status probe_mse_backward(float *dpred, const float *pred,
                                const float *target, float dloss, size_t n,
                                probe_dtype prec) {
  CHECK_ARG(dpred && pred && target && n > 0);
  CHECK_ARG(PREC_OK(prec));
  float k = pl_mse_grad_k(dloss, n, prec);
  for (size_t i = 0; i < n; i++)
    dpred[i] = pl_mse_grad(k, pred[i], target[i], prec);
  return PROBE_OK;
}

probe_status probe_crossentropy_forward(float *loss, float *losses,
                                        const float *probs, const int *targets,
                                        int N, int V, probe_dtype prec) {
  CHECK_ARG(loss && probs && targets && N > 0 && V > 0);
  CHECK_ARG(PREC_OK(prec));
  for (int n = 0; n < N; n++)
    CHECK_ARG(targets[n] >= 0 && targets[n] < V);
  float s = 0.0f;
  for (int n = 0; n < N; n++) {
    float l = pl_ce_term(probs[(size_t)n * V + targets[n]], prec);
    if (losses)
      losses[n] = l;
    s += l;
  }
  *loss = rnd(s / (float)N, prec);
  return PROBE_OK;
}

probe_status probe_crossentropy_backward(float *dprobs, const float *probs,
                                         const int *targets, float dloss, int N,
                                         int V, probe_dtype prec) {
  CHECK_ARG(dprobs && probs && targets && N > 0 && V > 0);
  CHECK_ARG(PREC_OK(prec));
  for (int n = 0; n < N; n++)
    CHECK_ARG(targets[n] >= 0 && targets[n] < V);
  float k = pl_ce_grad_k(dloss, N, prec);
  memset(dprobs, 0, (size_t)N * V * sizeof *dprobs);
  for (int n = 0; n < N; n++) {
    size_t i = (size_t)n * V + targets[n];
    dprobs[i] = pl_ce_grad(k, probs[i], prec);
  }
  return PROBE_OK;
}

/* ---- gradient-list helpers ----------------------------------------------- */

probe_status probe_grads_l2norm(double *out, float *const *grads,
                                const size_t *sizes, size_t count) {
  CHECK_ARG(out && (count == 0 || (grads && sizes)));
  double s = 0.0;
  for (size_t t = 0; t < count; t++) {
    CHECK_ARG(grads[t] || sizes[t] == 0);
    for (size_t i = 0; i < sizes[t]; i++) {
      double g = grads[t][i];
      s += g * g;
    }
  }
  *out = sqrt(s);
  return PROBE_OK;
}

probe_status probe_grads_scale(float *const *grads, const size_t *sizes,
                               size_t count, float factor,
                               int *found_nonfinite) {
  CHECK_ARG(count == 0 || (grads && sizes));
  int bad = 0;
  for (size_t t = 0; t < count; t++) {
    CHECK_ARG(grads[t] || sizes[t] == 0);
    float *g = grads[t];
    for (size_t i = 0; i < sizes[t]; i++) {
      g[i] *= factor;
      if (!isfinite(g[i]))
        bad = 1;
    }
  }
  if (found_nonfinite)
    *found_nonfinite = bad;
  return PROBE_OK;
}
