/*
 * kernels/layers/layers-impl.h - the per-element and per-row math of the
 * layer kernels, written once and compiled for both backends: layers_cpu.c
 * calls these functions in loops, layers_cuda.cu calls the same functions
 * from one thread per element / row / column / series. PROBE_HD (from
 * ampprobe/numerics.h) makes them `static inline` in C and
 * `__host__ __device__` under nvcc, as the FP16/BF16 conversions are.
 *
 * Conventions: `p` is a probe_dtype passed as int (device code takes
 * plain ints); pl_rnd(x, p) rounds x to the module precision (identity in
 * FP32). Each function keeps the exact order of operations of the CPU
 * reference, so the CUDA kernels (built with -fmad=false) round the same way
 * to the last bit; only GEMM summation orders differ between backends. Shapes
 * as in ampprobe/layers.h: (N,C) is N rows of C floats, row-major.
 */
#ifndef AMPPROBE_LAYERS_IMPL_H
#define AMPPROBE_LAYERS_IMPL_H

#include <math.h>
#include <stddef.h>

#include "ampprobe/layers.h"
#include "ampprobe/numerics.h"

#define PL_GELU_SCALE 0.7978845608028654f /* sqrt(2/pi) */
#define PL_GELU_K 0.044715f

PROBE_HD float pl_rnd(float x, int p) {
  if (p == PROBE_DTYPE_F16)
    return probe_round_f16(x);
  if (p == PROBE_DTYPE_BF16)
    return probe_round_bf16(x);
  return x;
}

/* ---- linear epilogues ---------------------------------------------------- */

/* The single rounding of a linear output element t (FP32 GEMM result) after
 * adding the rounded bias b (NULL: no bias). */
PROBE_HD float pl_bias_round(float t, const float *bias, int j, int p) {
  return pl_rnd(bias ? t + pl_rnd(bias[j], p) : t, p);
}

/* dst[j] += r(sum_n r(g[n,j])): column j of g(N,OC). */
PROBE_HD void pl_colsum_acc(float *dst, const float *g, int N, int OC, int j,
                            int p) {
  float s = 0.0f;
  for (int n = 0; n < N; n++)
    s += pl_rnd(g[(size_t)n * OC + j], p);
  dst[j] += pl_rnd(s, p);
}

/* ---- batchnorm1d: one feature column c of (N,C) -------------------------- */

PROBE_HD void pl_bn_forward_col(float *out, float *mean, float *var,
                                float *rmean, float *rvar, const float *x,
                                const float *gamma, const float *beta,
                                float momentum, float eps, int N, int C, int c,
                                int p) {
  float s = 0.0f;
  for (int n = 0; n < N; n++)
    s += pl_rnd(x[(size_t)n * C + c], p);
  float m = pl_rnd(s / N, p);
  float ss = 0.0f;
  for (int n = 0; n < N; n++) {
    float d = pl_rnd(x[(size_t)n * C + c], p) - m;
    ss += d * d;
  }
  float v = pl_rnd(ss / N, p); /* FP16: >= 65520 becomes inf */
  mean[c] = m;
  var[c] = v;
  float rstd = 1.0f / sqrtf(v + eps);
  float g = pl_rnd(gamma[c], p), b = pl_rnd(beta[c], p);
  for (int n = 0; n < N; n++) {
    size_t i = (size_t)n * C + c;
    out[i] = pl_rnd((pl_rnd(x[i], p) - m) * rstd * g + b, p);
  }
  if (rmean)
    rmean[c] = (1.0f - momentum) * rmean[c] + momentum * m;
  if (rvar)
    rvar[c] = (1.0f - momentum) * rvar[c] +
              momentum * (v * (float)N / (float)(N - 1));
}

PROBE_HD void pl_bn_backward_col(float *dinp, float *dgamma, float *dbeta,
                                 const float *dout, const float *x,
                                 const float *mean, const float *var,
                                 const float *gamma, float eps, int N, int C,
                                 int c, int p) {
  float m = pl_rnd(mean[c], p);
  float rstd = 1.0f / sqrtf(pl_rnd(var[c], p) + eps);
  float g = pl_rnd(gamma[c], p);
  float sum_d = 0.0f, sum_dx = 0.0f, sum_go = 0.0f, sum_goxh = 0.0f;
  for (int n = 0; n < N; n++) {
    size_t i = (size_t)n * C + c;
    float go = pl_rnd(dout[i], p);
    float xh = (pl_rnd(x[i], p) - m) * rstd;
    float dxh = go * g;
    sum_d += dxh;
    sum_dx += dxh * xh;
    sum_go += go;
    sum_goxh += go * xh;
  }
  float mean_d = sum_d / N, mean_dx = sum_dx / N;
  for (int n = 0; n < N; n++) {
    size_t i = (size_t)n * C + c;
    float go = pl_rnd(dout[i], p);
    float xh = (pl_rnd(x[i], p) - m) * rstd;
    dinp[i] = pl_rnd(rstd * (go * g - mean_d - xh * mean_dx), p);
  }
  if (dgamma)
    dgamma[c] += pl_rnd(sum_goxh, p);
  if (dbeta)
    dbeta[c] += pl_rnd(sum_go, p);
}

/* Evaluation mode, one element x of feature c. */
PROBE_HD float pl_bn_eval(float x, float rmean, float rvar, float gamma,
                          float beta, float eps, int p) {
  float m = pl_rnd(rmean, p);
  float rstd = 1.0f / sqrtf(pl_rnd(rvar, p) + eps);
  return pl_rnd((pl_rnd(x, p) - m) * rstd * pl_rnd(gamma, p) + pl_rnd(beta, p),
                p);
}

/* ---- layernorm: one row of C ------------------------------------------- */

/* Writes out(C) and *mean, *rstd, and *var when var is not NULL (the
 * materialised variance: inf in FP16 past 65504). */
PROBE_HD void pl_ln_forward_row(float *o, float *mean, float *rstd, float *var,
                                const float *x, const float *w, const float *b,
                                float eps, int C, int p) {
  float s = 0.0f;
  for (int i = 0; i < C; i++)
    s += pl_rnd(x[i], p);
  float m = pl_rnd(s / C, p);
  float ss = 0.0f;
  for (int i = 0; i < C; i++) {
    float d = pl_rnd(x[i], p) - m;
    ss += d * d;
  }
  float v = pl_rnd(ss / C, p); /* materialised variance */
  float r = pl_rnd(1.0f / sqrtf(v + eps), p);
  for (int i = 0; i < C; i++)
    o[i] = pl_rnd((pl_rnd(x[i], p) - m) * r * pl_rnd(w[i], p) + pl_rnd(b[i], p),
                  p);
  *mean = m;
  *rstd = r;
  if (var)
    *var = v;
}

/* dx(C) of one row (overwritten). */
PROBE_HD void pl_ln_backward_row(float *dx, const float *go, const float *x,
                                 float mean, float rstd, const float *w, int C,
                                 int p) {
  float m = pl_rnd(mean, p), r = pl_rnd(rstd, p);
  float sum_d = 0.0f, sum_dx = 0.0f;
  for (int i = 0; i < C; i++) {
    float xh = (pl_rnd(x[i], p) - m) * r;
    float dn = pl_rnd(go[i], p) * pl_rnd(w[i], p);
    sum_d += dn;
    sum_dx += dn * xh;
  }
  float mean_d = sum_d / C, mean_dx = sum_dx / C;
  for (int i = 0; i < C; i++) {
    float xh = (pl_rnd(x[i], p) - m) * r;
    float dn = pl_rnd(go[i], p) * pl_rnd(w[i], p);
    dx[i] = pl_rnd(r * (dn - mean_d - xh * mean_dx), p);
  }
}

/* dw[i], db[i] += (either may be NULL) for column i, summed over the N rows. */
PROBE_HD void pl_ln_backward_col(float *dw, float *db, const float *dout,
                                 const float *inp, const float *mean,
                                 const float *rstd, int N, int C, int i,
                                 int p) {
  float sw = 0.0f, sb = 0.0f;
  for (int n = 0; n < N; n++) {
    size_t e = (size_t)n * C + i;
    float g = pl_rnd(dout[e], p);
    float xh = (pl_rnd(inp[e], p) - pl_rnd(mean[n], p)) * pl_rnd(rstd[n], p);
    sw += g * xh;
    sb += g;
  }
  if (dw)
    dw[i] += pl_rnd(sw, p);
  if (db)
    db[i] += pl_rnd(sb, p);
}

/* ---- RevIN: series s = b*C + c of inp(B,T,C) ------------------------------
 */

PROBE_HD void pl_revin_norm_series(float *out, float *mean, float *stdev,
                                   float *var, const float *inp,
                                   const float *gamma, const float *beta,
                                   float eps, int T, int C, int b, int c,
                                   int p) {
  const float *x = inp + (size_t)b * T * C + c; /* stride C */
  float *o = out + (size_t)b * T * C + c;
  float s = 0.0f;
  for (int t = 0; t < T; t++)
    s += pl_rnd(x[(size_t)t * C], p);
  float m = pl_rnd(s / T, p);
  float ss = 0.0f;
  for (int t = 0; t < T; t++) {
    float d = pl_rnd(x[(size_t)t * C], p) - m;
    ss += d * d;
  }
  float v = pl_rnd(ss / T, p); /* FP16: inf when std > ~256 */
  float sd = pl_rnd(sqrtf(v + eps), p);
  float g = gamma ? pl_rnd(gamma[c], p) : 1.0f;
  float be = beta ? pl_rnd(beta[c], p) : 0.0f;
  for (int t = 0; t < T; t++) {
    float xh = (pl_rnd(x[(size_t)t * C], p) - m) / sd;
    o[(size_t)t * C] = pl_rnd(gamma ? xh * g + be : xh, p);
  }
  size_t si = (size_t)b * C + c;
  mean[si] = m;
  stdev[si] = sd;
  if (var)
    var[si] = v;
}

/* dinp of one element: r(dout gamma / stdev) (gamma NULL: 1). */
PROBE_HD float pl_revin_norm_dx(float dout, const float *gamma, float stdev,
                                int c, int p) {
  float g = gamma ? pl_rnd(gamma[c], p) : 1.0f;
  return pl_rnd(pl_rnd(dout, p) * g / pl_rnd(stdev, p), p);
}

/* dgamma[c], dbeta[c] += (either may be NULL) over all b, t. */
PROBE_HD void pl_revin_norm_dparams_col(float *dgamma, float *dbeta,
                                        const float *dout, const float *inp,
                                        const float *mean, const float *stdev,
                                        int B, int T, int C, int c, int p) {
  float sg = 0.0f, sgx = 0.0f;
  for (int b = 0; b < B; b++) {
    float m = pl_rnd(mean[(size_t)b * C + c], p);
    float sd = pl_rnd(stdev[(size_t)b * C + c], p);
    for (int t = 0; t < T; t++) {
      size_t i = ((size_t)b * T + t) * C + c;
      float go = pl_rnd(dout[i], p);
      sg += go;
      sgx += go * ((pl_rnd(inp[i], p) - m) / sd);
    }
  }
  if (dgamma)
    dgamma[c] += pl_rnd(sgx, p);
  if (dbeta)
    dbeta[c] += pl_rnd(sg, p);
}

/* One denormalised element: y de-affined (when gamma), times stdev, + mean. */
PROBE_HD float pl_revin_denorm(float y, float mean, float stdev,
                               const float *gamma, const float *beta, int c,
                               float eps, int p) {
  float m = pl_rnd(mean, p);
  float sd = pl_rnd(stdev, p);
  float v = pl_rnd(y, p);
  if (gamma)
    v = (v - pl_rnd(beta[c], p)) / (pl_rnd(gamma[c], p) + eps * eps);
  return pl_rnd(v * sd + m, p);
}

PROBE_HD float pl_revin_denorm_dy(float dout, float stdev, const float *gamma,
                                  int c, float eps, int p) {
  float g = gamma ? pl_rnd(gamma[c], p) + eps * eps : 1.0f;
  float dv = pl_rnd(dout, p) * pl_rnd(stdev, p);
  return pl_rnd(dv / g, p);
}

PROBE_HD void pl_revin_denorm_dparams_col(float *dgamma, float *dbeta,
                                          const float *dout, const float *y,
                                          const float *stdev,
                                          const float *gamma, const float *beta,
                                          float eps, int B, int H, int C, int c,
                                          int p) {
  float g = pl_rnd(gamma[c], p) + eps * eps;
  float be = pl_rnd(beta[c], p);
  float sdb = 0.0f, sdg = 0.0f;
  for (int b = 0; b < B; b++) {
    float sd = pl_rnd(stdev[(size_t)b * C + c], p);
    for (int t = 0; t < H; t++) {
      size_t i = ((size_t)b * H + t) * C + c;
      float dv = pl_rnd(dout[i], p) * sd;
      float yy = pl_rnd(y[i], p) - be;
      sdb += -dv / g;
      sdg += -dv * yy / (g * g);
    }
  }
  if (dgamma)
    dgamma[c] += pl_rnd(sdg, p);
  if (dbeta)
    dbeta[c] += pl_rnd(sdb, p);
}

/* ---- activations: one element ------------------------------------------- */

PROBE_HD float pl_relu(float x, int p) {
  float v = pl_rnd(x, p);
  return v <= 0.0f ? 0.0f : v; /* NaN propagates, as in PyTorch */
}

PROBE_HD float pl_relu_grad(float dout, float x, int p) {
  return pl_rnd(x, p) <= 0.0f ? 0.0f : pl_rnd(dout, p);
}

PROBE_HD float pl_gelu(float x, int p) {
  float v = pl_rnd(x, p);
  float u = PL_GELU_SCALE * (v + PL_GELU_K * v * v * v);
  return pl_rnd(0.5f * v * (1.0f + tanhf(u)), p);
}

PROBE_HD float pl_gelu_grad(float dout, float x, int p) {
  float v = pl_rnd(x, p);
  float u = PL_GELU_SCALE * (v + PL_GELU_K * v * v * v);
  float th = tanhf(u);
  float local = 0.5f * (1.0f + th) + 0.5f * v * (1.0f - th * th) *
                                         PL_GELU_SCALE *
                                         (1.0f + 3.0f * PL_GELU_K * v * v);
  return pl_rnd(pl_rnd(dout, p) * local, p);
}

/* ---- softmax: one row of V ----------------------------------------------- */

PROBE_HD void pl_softmax_row(float *pr, const float *x, int V, int p) {
  float mx = -INFINITY;
  for (int i = 0; i < V; i++) {
    float v = pl_rnd(x[i], p);
    if (v > mx)
      mx = v;
  }
  float s = 0.0f;
  for (int i = 0; i < V; i++) {
    pr[i] = expf(pl_rnd(x[i], p) - mx); /* FP32 exp, not yet materialised */
    s += pr[i];
  }
  for (int i = 0; i < V; i++)
    pr[i] = pl_rnd(pr[i] / s, p);
}

PROBE_HD void pl_softmax_row_grad(float *dl, const float *dp, const float *pr,
                                  int V, int p) {
  float s = 0.0f;
  for (int i = 0; i < V; i++)
    s += pl_rnd(dp[i], p) * pl_rnd(pr[i], p);
  for (int i = 0; i < V; i++)
    dl[i] = pl_rnd(pl_rnd(pr[i], p) * (pl_rnd(dp[i], p) - s), p);
}

/* ---- losses: one element ------------------------------------------------- */

/* (pred - target)^2 of one element, to be summed in FP32. */
PROBE_HD float pl_mse_term(float pred, float target, int p) {
  float d = pl_rnd(pred, p) - pl_rnd(target, p);
  return d * d;
}

/* The factor 2 dloss / n of the MSE gradient. */
PROBE_HD float pl_mse_grad_k(float dloss, size_t n, int p) {
  return 2.0f * pl_rnd(dloss, p) / (float)n;
}

PROBE_HD float pl_mse_grad(float k, float pred, float target, int p) {
  return pl_rnd(k * (pl_rnd(pred, p) - pl_rnd(target, p)), p);
}

/* -log p of the target's probability (inf for p = 0). */
PROBE_HD float pl_ce_term(float prob, int p) {
  return pl_rnd(-logf(pl_rnd(prob, p)), p);
}

/* The factor -dloss / N of the cross-entropy gradient. */
PROBE_HD float pl_ce_grad_k(float dloss, int N, int p) {
  return -pl_rnd(dloss, p) / (float)N;
}

PROBE_HD float pl_ce_grad(float k, float prob, int p) {
  return pl_rnd(k / pl_rnd(prob, p), p);
}

#endif /* AMPPROBE_LAYERS_IMPL_H */
