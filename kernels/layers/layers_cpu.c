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

#define CHECK_ARG(cond)                                                        \
  do {                                                                         \
    if (!(cond))                                                               \
      return PROBE_ERR_INVALID_ARG;                                            \
  } while (0)

#define PREC_OK(p)                                                             \
  ((p) == PROBE_PREC_FP32 || (p) == PROBE_PREC_FP16 || (p) == PROBE_PREC_BF16)

static inline float rnd(float x, probe_precision p) {
  if (p == PROBE_PREC_FP16)
    return probe_round_f16(x);
  if (p == PROBE_PREC_BF16)
    return probe_round_bf16(x);
  return x;
}

float probe_layers_round1(float x, probe_precision prec) {
  return rnd(x, prec);
}

static void round_array(float *out, const float *in, size_t n,
                        probe_precision p) {
  if (p == PROBE_PREC_FP32) {
    if (out != in)
      memcpy(out, in, n * sizeof *out);
    return;
  }
  for (size_t i = 0; i < n; i++)
    out[i] = rnd(in[i], p);
}

probe_status probe_layers_round(float *out, const float *in, size_t n,
                                probe_precision prec) {
  CHECK_ARG((out && in) || n == 0);
  CHECK_ARG(PREC_OK(prec));
  round_array(out, in, n, prec);
  return PROBE_OK;
}

/* Returns `in` itself in FP32 mode, else a malloc'd rounded copy in *tmp
 * (freed by the caller). NULL only when allocation failed. */
static const float *rounded_input(const float *in, size_t n, probe_precision p,
                                  float **tmp) {
  *tmp = NULL;
  if (p == PROBE_PREC_FP32)
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
                                  int C, int OC, probe_precision prec) {
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
      o[j] = rnd(bias ? o[j] + rnd(bias[j], prec) : o[j], prec);
  }
  free(ti);
  free(tw);
  return PROBE_OK;
}

probe_status probe_linear_backward(float *dinp, float *dweight, float *dbias,
                                   const float *dout, const float *inp,
                                   const float *weight, int N, int C, int OC,
                                   probe_precision prec) {
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
    if (prec != PROBE_PREC_FP32)
      round_array(dinp, dinp, (size_t)N * C, prec);
  }
  if (dweight) {
    const float *x = rounded_input(inp, (size_t)N * C, prec, &ti);
    if (!x) {
      st = PROBE_ERR_NOMEM;
      goto done;
    }
    if (prec == PROBE_PREC_FP32) {
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
  if (dbias) {
    for (int j = 0; j < OC; j++) {
      float s = 0.0f;
      for (int n = 0; n < N; n++)
        s += g[(size_t)n * OC + j];
      dbias[j] += rnd(s, prec);
    }
  }
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
                              int N, int C, probe_precision prec) {
  CHECK_ARG(out && mean && var && inp && gamma && beta && N >= 2 && C > 0);
  CHECK_ARG(PREC_OK(prec));
  for (int c = 0; c < C; c++) {
    float s = 0.0f;
    for (int n = 0; n < N; n++)
      s += rnd(inp[(size_t)n * C + c], prec);
    float m = rnd(s / N, prec);
    float ss = 0.0f;
    for (int n = 0; n < N; n++) {
      float d = rnd(inp[(size_t)n * C + c], prec) - m;
      ss += d * d;
    }
    float v = rnd(ss / N, prec); /* FP16: >= 65520 becomes inf */
    mean[c] = m;
    var[c] = v;
    float rstd = 1.0f / sqrtf(v + eps);
    float g = rnd(gamma[c], prec), b = rnd(beta[c], prec);
    for (int n = 0; n < N; n++) {
      size_t i = (size_t)n * C + c;
      out[i] = rnd((rnd(inp[i], prec) - m) * rstd * g + b, prec);
    }
    if (running_mean)
      running_mean[c] = (1.0f - momentum) * running_mean[c] + momentum * m;
    if (running_var)
      running_var[c] = (1.0f - momentum) * running_var[c] +
                       momentum * (v * (float)N / (float)(N - 1));
  }
  return PROBE_OK;
}

probe_status probe_bn_backward(float *dinp, float *dgamma, float *dbeta,
                               const float *dout, const float *inp,
                               const float *mean, const float *var,
                               const float *gamma, float eps, int N, int C,
                               probe_precision prec) {
  CHECK_ARG(dinp && dout && inp && mean && var && gamma && N >= 2 && C > 0);
  CHECK_ARG(PREC_OK(prec));
  for (int c = 0; c < C; c++) {
    float m = rnd(mean[c], prec);
    float rstd = 1.0f / sqrtf(rnd(var[c], prec) + eps);
    float g = rnd(gamma[c], prec);
    float sum_d = 0.0f, sum_dx = 0.0f, sum_go = 0.0f, sum_goxh = 0.0f;
    for (int n = 0; n < N; n++) {
      size_t i = (size_t)n * C + c;
      float go = rnd(dout[i], prec);
      float xh = (rnd(inp[i], prec) - m) * rstd;
      float dxh = go * g;
      sum_d += dxh;
      sum_dx += dxh * xh;
      sum_go += go;
      sum_goxh += go * xh;
    }
    float mean_d = sum_d / N, mean_dx = sum_dx / N;
    for (int n = 0; n < N; n++) {
      size_t i = (size_t)n * C + c;
      float go = rnd(dout[i], prec);
      float xh = (rnd(inp[i], prec) - m) * rstd;
      dinp[i] = rnd(rstd * (go * g - mean_d - xh * mean_dx), prec);
    }
    if (dgamma)
      dgamma[c] += rnd(sum_goxh, prec);
    if (dbeta)
      dbeta[c] += rnd(sum_go, prec);
  }
  return PROBE_OK;
}

probe_status probe_bn_forward_eval(float *out, const float *inp,
                                   const float *gamma, const float *beta,
                                   const float *running_mean,
                                   const float *running_var, float eps, int N,
                                   int C, probe_precision prec) {
  CHECK_ARG(out && inp && gamma && beta && running_mean && running_var);
  CHECK_ARG(N > 0 && C > 0 && PREC_OK(prec));
  for (int c = 0; c < C; c++) {
    float m = rnd(running_mean[c], prec);
    float rstd = 1.0f / sqrtf(rnd(running_var[c], prec) + eps);
    float g = rnd(gamma[c], prec), b = rnd(beta[c], prec);
    for (int n = 0; n < N; n++) {
      size_t i = (size_t)n * C + c;
      out[i] = rnd((rnd(inp[i], prec) - m) * rstd * g + b, prec);
    }
  }
  return PROBE_OK;
}

/* ---- layernorm ----------------------------------------------------------- */

probe_status probe_layernorm_forward(float *out, float *mean, float *rstd,
                                     const float *inp, const float *weight,
                                     const float *bias, float eps, int N, int C,
                                     probe_precision prec) {
  CHECK_ARG(out && mean && rstd && inp && weight && bias && N > 0 && C > 0);
  CHECK_ARG(PREC_OK(prec));
  for (int n = 0; n < N; n++) {
    const float *x = inp + (size_t)n * C;
    float *o = out + (size_t)n * C;
    float s = 0.0f;
    for (int i = 0; i < C; i++)
      s += rnd(x[i], prec);
    float m = rnd(s / C, prec);
    float ss = 0.0f;
    for (int i = 0; i < C; i++) {
      float d = rnd(x[i], prec) - m;
      ss += d * d;
    }
    float v = rnd(ss / C, prec); /* materialised variance */
    float r = rnd(1.0f / sqrtf(v + eps), prec);
    for (int i = 0; i < C; i++)
      o[i] = rnd((rnd(x[i], prec) - m) * r * rnd(weight[i], prec) +
                     rnd(bias[i], prec),
                 prec);
    mean[n] = m;
    rstd[n] = r;
  }
  return PROBE_OK;
}

probe_status probe_layernorm_backward(float *dinp, float *dweight, float *dbias,
                                      const float *dout, const float *inp,
                                      const float *mean, const float *rstd,
                                      const float *weight, int N, int C,
                                      probe_precision prec) {
  CHECK_ARG(dinp && dout && inp && mean && rstd && weight && N > 0 && C > 0);
  CHECK_ARG(PREC_OK(prec));
  float *tdw = NULL, *tdb = NULL;
  if (dweight || dbias) {
    tdw = calloc((size_t)C, sizeof *tdw);
    tdb = calloc((size_t)C, sizeof *tdb);
    if (!tdw || !tdb) {
      free(tdw);
      free(tdb);
      return PROBE_ERR_NOMEM;
    }
  }
  for (int n = 0; n < N; n++) {
    const float *x = inp + (size_t)n * C;
    const float *go = dout + (size_t)n * C;
    float *dx = dinp + (size_t)n * C;
    float m = rnd(mean[n], prec), r = rnd(rstd[n], prec);
    float sum_d = 0.0f, sum_dx = 0.0f;
    for (int i = 0; i < C; i++) {
      float g = rnd(go[i], prec);
      float xh = (rnd(x[i], prec) - m) * r;
      float dn = g * rnd(weight[i], prec);
      sum_d += dn;
      sum_dx += dn * xh;
      if (tdw) {
        tdw[i] += g * xh;
        tdb[i] += g;
      }
    }
    float mean_d = sum_d / C, mean_dx = sum_dx / C;
    for (int i = 0; i < C; i++) {
      float g = rnd(go[i], prec);
      float xh = (rnd(x[i], prec) - m) * r;
      float dn = g * rnd(weight[i], prec);
      dx[i] = rnd(r * (dn - mean_d - xh * mean_dx), prec);
    }
  }
  for (int i = 0; i < C && tdw; i++) {
    if (dweight)
      dweight[i] += rnd(tdw[i], prec);
    if (dbias)
      dbias[i] += rnd(tdb[i], prec);
  }
  free(tdw);
  free(tdb);
  return PROBE_OK;
}

/* ---- RevIN --------------------------------------------------------------- */

probe_status probe_revin_norm_forward(float *out, float *mean, float *stdev,
                                      const float *inp, const float *gamma,
                                      const float *beta, float eps, int B,
                                      int T, int C, probe_precision prec) {
  CHECK_ARG(out && mean && stdev && inp && B > 0 && T > 0 && C > 0);
  CHECK_ARG(!gamma == !beta);
  CHECK_ARG(PREC_OK(prec));
  for (int b = 0; b < B; b++) {
    for (int c = 0; c < C; c++) {
      const float *x = inp + (size_t)b * T * C + c; /* stride C */
      float *o = out + (size_t)b * T * C + c;
      float s = 0.0f;
      for (int t = 0; t < T; t++)
        s += rnd(x[(size_t)t * C], prec);
      float m = rnd(s / T, prec);
      float ss = 0.0f;
      for (int t = 0; t < T; t++) {
        float d = rnd(x[(size_t)t * C], prec) - m;
        ss += d * d;
      }
      float v = rnd(ss / T, prec); /* FP16: inf when std > ~256 */
      float sd = rnd(sqrtf(v + eps), prec);
      float g = gamma ? rnd(gamma[c], prec) : 1.0f;
      float be = beta ? rnd(beta[c], prec) : 0.0f;
      for (int t = 0; t < T; t++) {
        float xh = (rnd(x[(size_t)t * C], prec) - m) / sd;
        o[(size_t)t * C] = rnd(gamma ? xh * g + be : xh, prec);
      }
      mean[(size_t)b * C + c] = m;
      stdev[(size_t)b * C + c] = sd;
    }
  }
  return PROBE_OK;
}

probe_status probe_revin_norm_backward(float *dinp, float *dgamma, float *dbeta,
                                       const float *dout, const float *inp,
                                       const float *mean, const float *stdev,
                                       const float *gamma, int B, int T, int C,
                                       probe_precision prec) {
  CHECK_ARG(dinp && dout && inp && mean && stdev && B > 0 && T > 0 && C > 0);
  CHECK_ARG(PREC_OK(prec));
  for (int c = 0; c < C; c++) {
    float g = gamma ? rnd(gamma[c], prec) : 1.0f;
    float sg = 0.0f, sgx = 0.0f;
    for (int b = 0; b < B; b++) {
      float m = rnd(mean[(size_t)b * C + c], prec);
      float sd = rnd(stdev[(size_t)b * C + c], prec);
      for (int t = 0; t < T; t++) {
        size_t i = ((size_t)b * T + t) * C + c;
        float go = rnd(dout[i], prec);
        dinp[i] = rnd(go * g / sd, prec);
        sg += go;
        sgx += go * ((rnd(inp[i], prec) - m) / sd);
      }
    }
    if (gamma && dgamma)
      dgamma[c] += rnd(sgx, prec);
    if (gamma && dbeta)
      dbeta[c] += rnd(sg, prec);
  }
  return PROBE_OK;
}

probe_status probe_revin_denorm_forward(float *out, const float *y,
                                        const float *mean, const float *stdev,
                                        const float *gamma, const float *beta,
                                        float eps, int B, int H, int C,
                                        probe_precision prec) {
  CHECK_ARG(out && y && mean && stdev && B > 0 && H > 0 && C > 0);
  CHECK_ARG(!gamma == !beta);
  CHECK_ARG(PREC_OK(prec));
  for (int b = 0; b < B; b++) {
    for (int c = 0; c < C; c++) {
      float m = rnd(mean[(size_t)b * C + c], prec);
      float sd = rnd(stdev[(size_t)b * C + c], prec);
      float g = gamma ? rnd(gamma[c], prec) : 1.0f;
      float be = beta ? rnd(beta[c], prec) : 0.0f;
      for (int t = 0; t < H; t++) {
        size_t i = ((size_t)b * H + t) * C + c;
        float v = rnd(y[i], prec);
        if (gamma)
          v = (v - be) / (g + eps * eps);
        out[i] = rnd(v * sd + m, prec);
      }
    }
  }
  return PROBE_OK;
}

probe_status probe_revin_denorm_backward(float *dy, float *dgamma, float *dbeta,
                                         const float *dout, const float *y,
                                         const float *stdev, const float *gamma,
                                         const float *beta, float eps, int B,
                                         int H, int C, probe_precision prec) {
  CHECK_ARG(dy && dout && y && stdev && B > 0 && H > 0 && C > 0);
  CHECK_ARG(!gamma == !beta);
  CHECK_ARG(PREC_OK(prec));
  for (int c = 0; c < C; c++) {
    float g = gamma ? rnd(gamma[c], prec) + eps * eps : 1.0f;
    float be = beta ? rnd(beta[c], prec) : 0.0f;
    float sdb = 0.0f, sdg = 0.0f;
    for (int b = 0; b < B; b++) {
      float sd = rnd(stdev[(size_t)b * C + c], prec);
      for (int t = 0; t < H; t++) {
        size_t i = ((size_t)b * H + t) * C + c;
        float go = rnd(dout[i], prec);
        float dv = go * sd; /* gradient of the de-affined value */
        dy[i] = rnd(dv / g, prec);
        if (gamma) {
          float yy = rnd(y[i], prec) - be;
          sdb += -dv / g;
          sdg += -dv * yy / (g * g);
        }
      }
    }
    if (gamma && dgamma)
      dgamma[c] += rnd(sdg, prec);
    if (gamma && dbeta)
      dbeta[c] += rnd(sdb, prec);
  }
  return PROBE_OK;
}

/* ---- activations --------------------------------------------------------- */

probe_status probe_relu_forward(float *out, const float *inp, size_t n,
                                probe_precision prec) {
  CHECK_ARG((out && inp) || n == 0);
  CHECK_ARG(PREC_OK(prec));
  for (size_t i = 0; i < n; i++) {
    float x = rnd(inp[i], prec);
    out[i] = x <= 0.0f ? 0.0f : x; /* NaN propagates, as in PyTorch */
  }
  return PROBE_OK;
}

probe_status probe_relu_backward(float *dinp, const float *dout,
                                 const float *inp, size_t n,
                                 probe_precision prec) {
  CHECK_ARG((dinp && dout && inp) || n == 0);
  CHECK_ARG(PREC_OK(prec));
  for (size_t i = 0; i < n; i++)
    dinp[i] = rnd(inp[i], prec) <= 0.0f ? 0.0f : rnd(dout[i], prec);
  return PROBE_OK;
}

#define GELU_SCALE 0.7978845608028654f /* sqrt(2/pi) */
#define GELU_K 0.044715f

probe_status probe_gelu_forward(float *out, const float *inp, size_t n,
                                probe_precision prec) {
  CHECK_ARG((out && inp) || n == 0);
  CHECK_ARG(PREC_OK(prec));
  for (size_t i = 0; i < n; i++) {
    float x = rnd(inp[i], prec);
    float u = GELU_SCALE * (x + GELU_K * x * x * x);
    out[i] = rnd(0.5f * x * (1.0f + tanhf(u)), prec);
  }
  return PROBE_OK;
}

probe_status probe_gelu_backward(float *dinp, const float *dout,
                                 const float *inp, size_t n,
                                 probe_precision prec) {
  CHECK_ARG((dinp && dout && inp) || n == 0);
  CHECK_ARG(PREC_OK(prec));
  for (size_t i = 0; i < n; i++) {
    float x = rnd(inp[i], prec);
    float u = GELU_SCALE * (x + GELU_K * x * x * x);
    float th = tanhf(u);
    float local = 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) *
                                           GELU_SCALE *
                                           (1.0f + 3.0f * GELU_K * x * x);
    dinp[i] = rnd(rnd(dout[i], prec) * local, prec);
  }
  return PROBE_OK;
}

/* ---- softmax ------------------------------------------------------------- */

probe_status probe_softmax_forward(float *probs, const float *logits, int N,
                                   int V, probe_precision prec) {
  CHECK_ARG(probs && logits && N > 0 && V > 0);
  CHECK_ARG(PREC_OK(prec));
  for (int n = 0; n < N; n++) {
    const float *x = logits + (size_t)n * V;
    float *p = probs + (size_t)n * V;
    float mx = -INFINITY;
    for (int i = 0; i < V; i++) {
      float v = rnd(x[i], prec);
      if (v > mx)
        mx = v;
    }
    float s = 0.0f;
    for (int i = 0; i < V; i++) {
      p[i] = expf(rnd(x[i], prec) - mx); /* FP32 exp, not yet materialised */
      s += p[i];
    }
    for (int i = 0; i < V; i++)
      p[i] = rnd(p[i] / s, prec);
  }
  return PROBE_OK;
}

probe_status probe_softmax_backward(float *dlogits, const float *dprobs,
                                    const float *probs, int N, int V,
                                    probe_precision prec) {
  CHECK_ARG(dlogits && dprobs && probs && N > 0 && V > 0);
  CHECK_ARG(PREC_OK(prec));
  for (int n = 0; n < N; n++) {
    const float *dp = dprobs + (size_t)n * V;
    const float *p = probs + (size_t)n * V;
    float *dl = dlogits + (size_t)n * V;
    float s = 0.0f;
    for (int i = 0; i < V; i++)
      s += rnd(dp[i], prec) * rnd(p[i], prec);
    for (int i = 0; i < V; i++)
      dl[i] = rnd(rnd(p[i], prec) * (rnd(dp[i], prec) - s), prec);
  }
  return PROBE_OK;
}

/* ---- attention ----------------------------------------------------------- */

probe_status probe_attention_forward(float *out, float *qkv, float *scores,
                                     float *probs, float *atty,
                                     const float *inp, const float *wqkv,
                                     const float *bqkv, const float *wo,
                                     const float *bo, int causal, int B, int T,
                                     int C, probe_precision prec) {
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
  if (prec != PROBE_PREC_FP32)
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
                                      int T, int C, probe_precision prec) {
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
    if (prec != PROBE_PREC_FP32)
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
  if (prec != PROBE_PREC_FP32)
    round_array(dqkv, dqkv, (size_t)N * C3, prec);
  return probe_linear_backward(dinp, dwqkv, dbqkv, dqkv, inp, wqkv, N, C, C3,
                               prec);
}

/* ---- losses -------------------------------------------------------------- */

probe_status probe_mse_forward(float *loss, const float *pred,
                               const float *target, size_t n,
                               probe_precision prec) {
  CHECK_ARG(loss && pred && target && n > 0);
  CHECK_ARG(PREC_OK(prec));
  float s = 0.0f;
  for (size_t i = 0; i < n; i++) {
    float d = rnd(pred[i], prec) - rnd(target[i], prec);
    s += d * d;
  }
  *loss = rnd(s / (float)n, prec);
  return PROBE_OK;
}

probe_status probe_mse_backward(float *dpred, const float *pred,
                                const float *target, float dloss, size_t n,
                                probe_precision prec) {
  CHECK_ARG(dpred && pred && target && n > 0);
  CHECK_ARG(PREC_OK(prec));
  float k = 2.0f * rnd(dloss, prec) / (float)n;
  for (size_t i = 0; i < n; i++)
    dpred[i] = rnd(k * (rnd(pred[i], prec) - rnd(target[i], prec)), prec);
  return PROBE_OK;
}

probe_status probe_crossentropy_forward(float *loss, float *losses,
                                        const float *probs, const int *targets,
                                        int N, int V, probe_precision prec) {
  CHECK_ARG(loss && probs && targets && N > 0 && V > 0);
  CHECK_ARG(PREC_OK(prec));
  for (int n = 0; n < N; n++)
    CHECK_ARG(targets[n] >= 0 && targets[n] < V);
  float s = 0.0f;
  for (int n = 0; n < N; n++) {
    float l = rnd(-logf(rnd(probs[(size_t)n * V + targets[n]], prec)), prec);
    if (losses)
      losses[n] = l;
    s += l;
  }
  *loss = rnd(s / (float)N, prec);
  return PROBE_OK;
}

probe_status probe_crossentropy_backward(float *dprobs, const float *probs,
                                         const int *targets, float dloss, int N,
                                         int V, probe_precision prec) {
  CHECK_ARG(dprobs && probs && targets && N > 0 && V > 0);
  CHECK_ARG(PREC_OK(prec));
  for (int n = 0; n < N; n++)
    CHECK_ARG(targets[n] >= 0 && targets[n] < V);
  float k = -rnd(dloss, prec) / (float)N;
  memset(dprobs, 0, (size_t)N * V * sizeof *dprobs);
  for (int n = 0; n < N; n++) {
    size_t i = (size_t)n * V + targets[n];
    dprobs[i] = rnd(k / rnd(probs[i], prec), prec);
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
