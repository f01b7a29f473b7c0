/*
 * test_gpu_layers.c - every CUDA layer kernel (kernels/layers/layers_cuda.cu)
 * against the CPU reference (layers_cpu.c), in FP32, FP16 and BF16.
 *
 * Built twice: as gpu_layers against the real CUDA runtime and cuBLAS (skips
 * with 77 where no device is usable), and as layers_cuda_emu against the CPU
 * emulation (tests/gpu/emu + tests/layers/emu), which runs the same host code
 * and kernels without a GPU. Runs without fork (CUDA does not survive fork).
 *
 * Measure: per tensor, max|gpu - cpu| / max|cpu| over finite elements; a
 * non-finite element must be non-finite of the same kind on both sides.
 * Tolerances: FP32 1e-5 (GEMM summation order only). FP16 4e-3 and BF16
 * 3e-2: a different FP32 summation order inside a GEMM can move a result
 * across a rounding boundary, changing it by one unit in the last place
 * (2^-11 relative in FP16, 2^-8 in BF16), and that difference can be carried
 * through the few ops after it (attention); a formula error gives O(1).
 */
#include <check.h>
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ampprobe/layers.h"
#include "ampprobe/numerics.h"
#include "testutil.h"

/* The CUDA backend, started once in main; every call goes through its
 * table of operations, as the trainer's do. */
static probe_layers_backend cu;
#define CU(op, ...) cu.ops->op(cu.ctx, __VA_ARGS__)

#define OK(call) ck_assert_int_eq((call), PROBE_OK)

static const double tols[3] = {1e-5, 4e-3, 3e-2}; /* by probe_dtype */
static const char *pname[3] = {"fp32", "fp16", "bf16"};

/* A device copy of host array h (n floats). */
static float *dev_from(const float *h, size_t n) {
  void *d = NULL;
  ck_assert_int_eq(cudaMalloc(&d, (n ? n : 1) * sizeof(float)), cudaSuccess);
  ck_assert_int_eq(cudaMemcpy(d, h, n * sizeof(float), cudaMemcpyHostToDevice),
                   cudaSuccess);
  return (float *)d;
}

static int *dev_ints(const int *h, size_t n) {
  void *d = NULL;
  ck_assert_int_eq(cudaMalloc(&d, n * sizeof(int)), cudaSuccess);
  ck_assert_int_eq(cudaMemcpy(d, h, n * sizeof(int), cudaMemcpyHostToDevice),
                   cudaSuccess);
  return (int *)d;
}

/* Compares device tensor d with the CPU's c. */
static void cmp(const char *what, const float *c, const float *d, size_t n,
                probe_dtype p) {
  OK(cu.ops->sync(cu.ctx));
  float *g = falloc(n);
  ck_assert_int_eq(cudaMemcpy(g, d, n * sizeof(float), cudaMemcpyDeviceToHost),
                   cudaSuccess);
  double num = 0.0, den = 0.0;
  size_t same = 0;
  for (size_t i = 0; i < n; i++) {
    if (probe_f32_bits(c[i]) == probe_f32_bits(g[i]))
      same++;
    if (!isfinite(c[i]) || !isfinite(g[i])) {
      int ok = (isnan(c[i]) && isnan(g[i])) || (c[i] == g[i]);
      ck_assert_msg(ok, "%s %s[%zu]: cpu %g gpu %g", pname[p], what, i,
                    (double)c[i], (double)g[i]);
      continue;
    }
    double e = fabs((double)g[i] - c[i]);
    if (e > num)
      num = e;
    if (fabs(c[i]) > den)
      den = fabs(c[i]);
  }
  double rel = num / (den > 1e-30 ? den : 1e-30);
  printf("  %s %-22s rel %.2e  bit-identical %5.1f%%\n", pname[p], what, rel,
         100.0 * same / (n ? n : 1));
  ck_assert_msg(rel <= tols[p], "%s %s: relative error %.3e > %.1e", pname[p],
                what, rel, tols[p]);
  free(g);
}

#define DEV(h, n) dev_from((h), (n))
#define DFREE(d) cudaFree(d)

/* ---- per-module comparisons ---------------------------------------------- */

START_TEST(gpu_linear) {
  probe_dtype p = (probe_dtype)(_i % 3);
  int with_bias = _i / 3;
  rng_t r = {100 + (uint64_t)_i};
  int N = 33, C = 24, OC = 17;
  float *x = fill_uniform(falloc(N * C), N * C, &r, -2, 2);
  float *w = fill_uniform(falloc(OC * C), OC * C, &r, -1, 1);
  float *b = fill_uniform(falloc(OC), OC, &r, -1, 1);
  float *go = fill_uniform(falloc(N * OC), N * OC, &r, -1, 1);
  float *out = falloc(N * OC), *dx = falloc(N * C);
  float *dw = fill_uniform(falloc(OC * C), OC * C, &r, -1, 1); /* accumulate */
  float *db = fill_uniform(falloc(OC), OC, &r, -1, 1);
  float *d_x = DEV(x, N * C), *d_w = DEV(w, OC * C), *d_b = DEV(b, OC),
        *d_go = DEV(go, N * OC), *d_out = DEV(out, N * OC),
        *d_dx = DEV(dx, N * C), *d_dw = DEV(dw, OC * C), *d_db = DEV(db, OC);
  const float *bias = with_bias ? b : NULL, *d_bias = with_bias ? d_b : NULL;
  OK(probe_linear_forward(out, x, w, bias, N, C, OC, p));
  OK(CU(linear_forward, d_out, d_x, d_w, d_bias, N, C, OC, p));
  cmp("linear out", out, d_out, N * OC, p);
  OK(probe_linear_backward(dx, dw, db, go, x, w, N, C, OC, p));
  OK(CU(linear_backward, d_dx, d_dw, d_db, d_go, d_x, d_w, N, C, OC, p));
  cmp("linear dx", dx, d_dx, N * C, p);
  cmp("linear dw (+=)", dw, d_dw, OC * C, p);
  cmp("linear db (+=)", db, d_db, OC, p);
  DFREE(d_x), DFREE(d_w), DFREE(d_b), DFREE(d_go), DFREE(d_out), DFREE(d_dx),
      DFREE(d_dw), DFREE(d_db);
  free(x), free(w), free(b), free(go), free(out), free(dx), free(dw), free(db);
}
END_TEST

/* BatchNorm; loop index >= 3 uses features with std 400 (FP16 overflow). */
START_TEST(gpu_bn) {
  probe_dtype p = (probe_dtype)(_i % 3);
  float spread = _i >= 3 ? 400.0f : 2.0f;
  rng_t r = {200 + (uint64_t)_i};
  int N = 32, C = 12;
  float *x = falloc(N * C);
  for (int i = 0; i < N * C; i++)
    x[i] = (float)(i % C) + spread * rng_uniform(&r, -1.7f, 1.7f);
  float *g = fill_uniform(falloc(C), C, &r, 0.5f, 1.5f);
  float *be = fill_uniform(falloc(C), C, &r, -1, 1);
  float *rm = fill_uniform(falloc(C), C, &r, -1, 1);
  float *rv = fill_uniform(falloc(C), C, &r, 0.5f, 1.5f);
  float *go = fill_uniform(falloc(N * C), N * C, &r, -1, 1);
  float *out = falloc(N * C), *mean = falloc(C), *var = falloc(C),
        *dx = falloc(N * C), *dg = falloc(C), *db = falloc(C);
  float *d_x = DEV(x, N * C), *d_g = DEV(g, C), *d_be = DEV(be, C),
        *d_rm = DEV(rm, C), *d_rv = DEV(rv, C), *d_go = DEV(go, N * C),
        *d_out = DEV(out, N * C), *d_mean = DEV(mean, C), *d_var = DEV(var, C),
        *d_dx = DEV(dx, N * C), *d_dg = DEV(dg, C), *d_db = DEV(db, C);
  OK(probe_bn_forward(out, mean, var, rm, rv, x, g, be, 0.1f, 1e-5f, N, C, p));
  OK(CU(bn_forward, d_out, d_mean, d_var, d_rm, d_rv, d_x, d_g, d_be, 0.1f,
        1e-5f, N, C, p));
  cmp("bn out", out, d_out, N * C, p);
  cmp("bn mean", mean, d_mean, C, p);
  cmp("bn var", var, d_var, C, p);
  cmp("bn running_mean", rm, d_rm, C, p);
  cmp("bn running_var", rv, d_rv, C, p);
  if (_i == 4)
    ck_assert(isinf(var[0])); /* the FP16 overflow case */
  float *eo = falloc(N * C), *d_eo = DEV(eo, N * C);
  OK(probe_bn_forward_eval(eo, go, g, be, rm, rv, 1e-5f, N, C, p));
  OK(CU(bn_forward_eval, d_eo, d_go, d_g, d_be, d_rm, d_rv, 1e-5f, N, C, p));
  cmp("bn eval out", eo, d_eo, N * C, p);
  DFREE(d_eo);
  free(eo);
  OK(probe_bn_backward(dx, dg, db, go, x, mean, var, g, 1e-5f, N, C, p));
  OK(CU(bn_backward, d_dx, d_dg, d_db, d_go, d_x, d_mean, d_var, d_g, 1e-5f, N,
        C, p));
  cmp("bn dx", dx, d_dx, N * C, p);
  cmp("bn dgamma", dg, d_dg, C, p);
  cmp("bn dbeta", db, d_db, C, p);
  DFREE(d_x), DFREE(d_g), DFREE(d_be), DFREE(d_rm), DFREE(d_rv), DFREE(d_go),
      DFREE(d_out), DFREE(d_mean), DFREE(d_var), DFREE(d_dx), DFREE(d_dg),
      DFREE(d_db);
  free(x), free(g), free(be), free(rm), free(rv), free(go), free(out),
      free(mean), free(var), free(dx), free(dg), free(db);
}
END_TEST

START_TEST(gpu_layernorm) {
  probe_dtype p = (probe_dtype)_i;
  rng_t r = {300 + (uint64_t)_i};
  int N = 20, C = 24;
  float *x = fill_uniform(falloc(N * C), N * C, &r, -3, 4);
  float *w = fill_uniform(falloc(C), C, &r, 0.5f, 1.5f);
  float *b = fill_uniform(falloc(C), C, &r, -1, 1);
  float *go = fill_uniform(falloc(N * C), N * C, &r, -1, 1);
  float *out = falloc(N * C), *mean = falloc(N), *rstd = falloc(N),
        *dx = falloc(N * C), *dw = falloc(C), *db = falloc(C);
  float *d_x = DEV(x, N * C), *d_w = DEV(w, C), *d_b = DEV(b, C),
        *d_go = DEV(go, N * C), *d_out = DEV(out, N * C),
        *d_mean = DEV(mean, N), *d_rstd = DEV(rstd, N), *d_dx = DEV(dx, N * C),
        *d_dw = DEV(dw, C), *d_db = DEV(db, C);
  float *var = falloc(N), *d_var = DEV(var, N);
  OK(probe_layernorm_forward(out, mean, rstd, var, x, w, b, 1e-5f, N, C, p));
  OK(CU(layernorm_forward, d_out, d_mean, d_rstd, d_var, d_x, d_w, d_b, 1e-5f,
        N, C, p));
  cmp("ln out", out, d_out, N * C, p);
  cmp("ln mean", mean, d_mean, N, p);
  cmp("ln rstd", rstd, d_rstd, N, p);
  cmp("ln var", var, d_var, N, p);
  DFREE(d_var);
  free(var);
  OK(probe_layernorm_backward(dx, dw, db, go, x, mean, rstd, w, N, C, p));
  OK(CU(layernorm_backward, d_dx, d_dw, d_db, d_go, d_x, d_mean, d_rstd, d_w, N,
        C, p));
  cmp("ln dx", dx, d_dx, N * C, p);
  cmp("ln dw", dw, d_dw, C, p);
  cmp("ln db", db, d_db, C, p);
  DFREE(d_x), DFREE(d_w), DFREE(d_b), DFREE(d_go), DFREE(d_out), DFREE(d_mean),
      DFREE(d_rstd), DFREE(d_dx), DFREE(d_dw), DFREE(d_db);
  free(x), free(w), free(b), free(go), free(out), free(mean), free(rstd),
      free(dx), free(dw), free(db);
}
END_TEST

/* RevIN norm + denorm; loop index >= 3: series around 1e3 with std ~300. */
START_TEST(gpu_revin) {
  probe_dtype p = (probe_dtype)(_i % 3);
  float level = _i >= 3 ? 1000.0f : 5.0f, spread = _i >= 3 ? 520.0f : 3.0f;
  rng_t r = {400 + (uint64_t)_i};
  int B = 4, T = 24, C = 3, H = 8;
  size_t nx = (size_t)B * T * C, ny = (size_t)B * H * C;
  float *x = falloc(nx);
  for (size_t i = 0; i < nx; i++)
    x[i] = level * (1 + i % C) + spread * rng_uniform(&r, -1, 1);
  float *y = fill_uniform(falloc(ny), ny, &r, -2, 2);
  float *g = fill_uniform(falloc(C), C, &r, 0.5f, 1.5f);
  float *be = fill_uniform(falloc(C), C, &r, -1, 1);
  float *gxn = fill_uniform(falloc(nx), nx, &r, -1, 1);
  float *gyd = fill_uniform(falloc(ny), ny, &r, -1, 1);
  float *xn = falloc(nx), *yd = falloc(ny), *mean = falloc(B * C),
        *sd = falloc(B * C), *dx = falloc(nx), *dy = falloc(ny),
        *dg = falloc(C), *db = falloc(C);
  float *d_x = DEV(x, nx), *d_y = DEV(y, ny), *d_g = DEV(g, C),
        *d_be = DEV(be, C), *d_gxn = DEV(gxn, nx), *d_gyd = DEV(gyd, ny),
        *d_xn = DEV(xn, nx), *d_yd = DEV(yd, ny), *d_mean = DEV(mean, B * C),
        *d_sd = DEV(sd, B * C), *d_dx = DEV(dx, nx), *d_dy = DEV(dy, ny),
        *d_dg = DEV(dg, C), *d_db = DEV(db, C);
  float *var = falloc(B * C), *d_var = DEV(var, B * C);
  OK(probe_revin_norm_forward(xn, mean, sd, var, x, g, be, 1e-5f, B, T, C, p));
  OK(CU(revin_norm_forward, d_xn, d_mean, d_sd, d_var, d_x, d_g, d_be, 1e-5f, B,
        T, C, p));
  cmp("revin norm out", xn, d_xn, nx, p);
  cmp("revin mean", mean, d_mean, B * C, p);
  cmp("revin stdev", sd, d_sd, B * C, p);
  cmp("revin var", var, d_var, B * C, p);
  if (_i == 4)
    ck_assert(isinf(var[0])); /* fwd_saved records this, not the stdev */
  DFREE(d_var);
  free(var);
  if (_i == 4)
    ck_assert(isinf(sd[0]));
  OK(probe_revin_denorm_forward(yd, y, mean, sd, g, be, 1e-5f, B, H, C, p));
  OK(CU(revin_denorm_forward, d_yd, d_y, d_mean, d_sd, d_g, d_be, 1e-5f, B, H,
        C, p));
  cmp("revin denorm out", yd, d_yd, ny, p);
  OK(probe_revin_denorm_backward(dy, dg, db, gyd, y, sd, g, be, 1e-5f, B, H, C,
                                 p));
  OK(CU(revin_denorm_backward, d_dy, d_dg, d_db, d_gyd, d_y, d_sd, d_g, d_be,
        1e-5f, B, H, C, p));
  cmp("revin denorm dy", dy, d_dy, ny, p);
  OK(probe_revin_norm_backward(dx, dg, db, gxn, x, mean, sd, g, B, T, C, p));
  OK(CU(revin_norm_backward, d_dx, d_dg, d_db, d_gxn, d_x, d_mean, d_sd, d_g, B,
        T, C, p));
  cmp("revin norm dx", dx, d_dx, nx, p);
  cmp("revin dgamma (both)", dg, d_dg, C, p);
  cmp("revin dbeta (both)", db, d_db, C, p);
  DFREE(d_x), DFREE(d_y), DFREE(d_g), DFREE(d_be), DFREE(d_gxn), DFREE(d_gyd),
      DFREE(d_xn), DFREE(d_yd), DFREE(d_mean), DFREE(d_sd), DFREE(d_dx),
      DFREE(d_dy), DFREE(d_dg), DFREE(d_db);
  free(x), free(y), free(g), free(be), free(gxn), free(gyd), free(xn), free(yd),
      free(mean), free(sd), free(dx), free(dy), free(dg), free(db);
}
END_TEST

START_TEST(gpu_activations) {
  probe_dtype p = (probe_dtype)_i;
  rng_t r = {500 + (uint64_t)_i};
  size_t n = 1000;
  float *x = fill_uniform(falloc(n), n, &r, -6, 6);
  float *go = fill_uniform(falloc(n), n, &r, -1, 1);
  float *o = falloc(n), *dx = falloc(n);
  float *d_x = DEV(x, n), *d_go = DEV(go, n), *d_o = DEV(o, n),
        *d_dx = DEV(dx, n);
  OK(probe_relu_forward(o, x, n, p));
  OK(CU(relu_forward, d_o, d_x, n, p));
  cmp("relu out", o, d_o, n, p);
  OK(probe_relu_backward(dx, go, x, n, p));
  OK(CU(relu_backward, d_dx, d_go, d_x, n, p));
  cmp("relu dx", dx, d_dx, n, p);
  OK(probe_gelu_forward(o, x, n, p));
  OK(CU(gelu_forward, d_o, d_x, n, p));
  cmp("gelu out", o, d_o, n, p);
  OK(probe_gelu_backward(dx, go, x, n, p));
  OK(CU(gelu_backward, d_dx, d_go, d_x, n, p));
  cmp("gelu dx", dx, d_dx, n, p);
  /* rounding helper */
  x[0] = 70000.0f, x[1] = 1e-9f;
  float *d_x2 = DEV(x, n);
  OK(probe_layers_round(o, x, n, p));
  OK(CU(round, d_o, d_x2, n, p));
  cmp("round", o, d_o, n, p);
  DFREE(d_x), DFREE(d_x2), DFREE(d_go), DFREE(d_o), DFREE(d_dx);
  free(x), free(go), free(o), free(dx);
}
END_TEST

/* softmax + cross-entropy; logits spread over 40 so that some FP16
 * probabilities underflow to 0 (and the loss is inf) on both sides. */
START_TEST(gpu_softmax_ce) {
  probe_dtype p = (probe_dtype)_i;
  rng_t r = {600 + (uint64_t)_i};
  int N = 16, V = 40, y[16];
  float *x = fill_uniform(falloc(N * V), N * V, &r, -20, 20);
  float *go = fill_uniform(falloc(N * V), N * V, &r, -1, 1);
  for (int n = 0; n < N; n++)
    y[n] = (int)(rng_u64(&r) % V);
  float *pr = falloc(N * V), *dl = falloc(N * V), *dp = falloc(N * V);
  float loss, losses[16];
  float *d_x = DEV(x, N * V), *d_go = DEV(go, N * V), *d_pr = DEV(pr, N * V),
        *d_dl = DEV(dl, N * V), *d_dp = DEV(dp, N * V), *d_loss = DEV(&loss, 1),
        *d_losses = DEV(losses, N);
  int *d_y = dev_ints(y, N);
  OK(probe_softmax_forward(pr, x, N, V, p));
  OK(CU(softmax_forward, d_pr, d_x, N, V, p));
  cmp("softmax out", pr, d_pr, N * V, p);
  OK(probe_softmax_backward(dl, go, pr, N, V, p));
  OK(CU(softmax_backward, d_dl, d_go, d_pr, N, V, p));
  cmp("softmax dx", dl, d_dl, N * V, p);
  OK(probe_crossentropy_forward(&loss, losses, pr, y, N, V, p));
  OK(CU(crossentropy_forward, d_loss, d_losses, d_pr, d_y, N, V, p));
  cmp("ce losses", losses, d_losses, N, p);
  cmp("ce loss", &loss, d_loss, 1, p);
  OK(probe_crossentropy_backward(dp, pr, y, 2.5f, N, V, p));
  OK(CU(crossentropy_backward, d_dp, d_pr, d_y, 2.5f, N, V, p));
  cmp("ce dprobs", dp, d_dp, N * V, p);
  if (p == PROBE_DTYPE_F16) {
    int zeros = 0;
    for (int i = 0; i < N * V; i++)
      zeros += pr[i] == 0.0f;
    ck_assert_int_gt(zeros, 0);
  }
  DFREE(d_x), DFREE(d_go), DFREE(d_pr), DFREE(d_dl), DFREE(d_dp), DFREE(d_loss),
      DFREE(d_losses), cudaFree(d_y);
  free(x), free(go), free(pr), free(dl), free(dp);
}
END_TEST

START_TEST(gpu_mse) {
  probe_dtype p = (probe_dtype)_i;
  rng_t r = {700 + (uint64_t)_i};
  size_t n = 777;
  float *a = fill_uniform(falloc(n), n, &r, -3, 3);
  float *t = fill_uniform(falloc(n), n, &r, -3, 3);
  float *dp = falloc(n), loss;
  float *d_a = DEV(a, n), *d_t = DEV(t, n), *d_dp = DEV(dp, n),
        *d_loss = DEV(&loss, 1);
  OK(probe_mse_forward(&loss, a, t, n, p));
  OK(CU(mse_forward, d_loss, d_a, d_t, n, p));
  cmp("mse loss", &loss, d_loss, 1, p);
  OK(probe_mse_backward(dp, a, t, 1024.0f, n, p));
  OK(CU(mse_backward, d_dp, d_a, d_t, 1024.0f, n, p));
  cmp("mse dpred", dp, d_dp, n, p);
  DFREE(d_a), DFREE(d_t), DFREE(d_dp), DFREE(d_loss);
  free(a), free(t), free(dp);
}
END_TEST

START_TEST(gpu_attention) {
  probe_dtype p = (probe_dtype)(_i % 3);
  int causal = _i / 3;
  rng_t r = {800 + (uint64_t)_i};
  int B = 3, T = 12, C = 16, BT = B * T;
  size_t nx = (size_t)BT * C, nq = nx * 3, ns = (size_t)B * T * T;
  float *x = fill_uniform(falloc(nx), nx, &r, -1, 1);
  float *wqkv = fill_uniform(falloc(3 * C * C), 3 * C * C, &r, -0.5f, 0.5f);
  float *bqkv = fill_uniform(falloc(3 * C), 3 * C, &r, -0.2f, 0.2f);
  float *wo = fill_uniform(falloc(C * C), C * C, &r, -0.5f, 0.5f);
  float *bo = fill_uniform(falloc(C), C, &r, -0.2f, 0.2f);
  float *go = fill_uniform(falloc(nx), nx, &r, -1, 1);
  float *out = falloc(nx), *qkv = falloc(nq), *sc = falloc(ns),
        *pr = falloc(ns), *at = falloc(nx), *dx = falloc(nx),
        *dwqkv = falloc(3 * C * C), *dbqkv = falloc(3 * C),
        *dwo = falloc(C * C), *dbo = falloc(C), *dqkv = falloc(nq),
        *dat = falloc(nx), *dpr = falloc(ns), *dsc = falloc(ns);
  float *d_x = DEV(x, nx), *d_wqkv = DEV(wqkv, 3 * C * C),
        *d_bqkv = DEV(bqkv, 3 * C), *d_wo = DEV(wo, C * C), *d_bo = DEV(bo, C),
        *d_go = DEV(go, nx), *d_out = DEV(out, nx), *d_qkv = DEV(qkv, nq),
        *d_sc = DEV(sc, ns), *d_pr = DEV(pr, ns), *d_at = DEV(at, nx),
        *d_dx = DEV(dx, nx), *d_dwqkv = DEV(dwqkv, 3 * C * C),
        *d_dbqkv = DEV(dbqkv, 3 * C), *d_dwo = DEV(dwo, C * C),
        *d_dbo = DEV(dbo, C), *d_dqkv = DEV(dqkv, nq), *d_dat = DEV(dat, nx),
        *d_dpr = DEV(dpr, ns), *d_dsc = DEV(dsc, ns);
  OK(probe_attention_forward(out, qkv, sc, pr, at, x, wqkv, bqkv, wo, bo,
                             causal, B, T, C, p));
  OK(CU(attention_forward, d_out, d_qkv, d_sc, d_pr, d_at, d_x, d_wqkv, d_bqkv,
        d_wo, d_bo, causal, B, T, C, p));
  cmp("attn qkv", qkv, d_qkv, nq, p);
  cmp("attn scores", sc, d_sc, ns, p);
  cmp("attn probs", pr, d_pr, ns, p);
  cmp("attn atty", at, d_at, nx, p);
  cmp("attn out", out, d_out, nx, p);
  OK(probe_attention_backward(dx, dwqkv, dbqkv, dwo, dbo, dqkv, dat, dpr, dsc,
                              go, x, qkv, pr, at, wqkv, wo, B, T, C, p));
  OK(CU(attention_backward, d_dx, d_dwqkv, d_dbqkv, d_dwo, d_dbo, d_dqkv, d_dat,
        d_dpr, d_dsc, d_go, d_x, d_qkv, d_pr, d_at, d_wqkv, d_wo, B, T, C, p));
  cmp("attn datty", dat, d_dat, nx, p);
  cmp("attn dprobs", dpr, d_dpr, ns, p);
  cmp("attn dscores", dsc, d_dsc, ns, p);
  cmp("attn dqkv", dqkv, d_dqkv, nq, p);
  cmp("attn dx", dx, d_dx, nx, p);
  cmp("attn dwqkv", dwqkv, d_dwqkv, 3 * C * C, p);
  cmp("attn dbqkv", dbqkv, d_dbqkv, 3 * C, p);
  cmp("attn dwo", dwo, d_dwo, C * C, p);
  cmp("attn dbo", dbo, d_dbo, C, p);
  float *dev[] = {d_x,   d_wqkv, d_bqkv, d_wo,  d_bo,  d_go,    d_out,
                  d_qkv, d_sc,   d_pr,   d_at,  d_dx,  d_dwqkv, d_dbqkv,
                  d_dwo, d_dbo,  d_dqkv, d_dat, d_dpr, d_dsc};
  for (size_t i = 0; i < sizeof dev / sizeof *dev; i++)
    DFREE(dev[i]);
  float *host[] = {x,  wqkv, bqkv,  wo,    bo,  go,  out,  qkv, sc,  pr,
                   at, dx,   dwqkv, dbqkv, dwo, dbo, dqkv, dat, dpr, dsc};
  for (size_t i = 0; i < sizeof host / sizeof *host; i++)
    free(host[i]);
}
END_TEST

START_TEST(gpu_grads_helpers) {
  rng_t r = {900};
  size_t sz[3] = {1000, 17, 0};
  float *h[3], *d[3];
  for (int i = 0; i < 3; i++) {
    h[i] = fill_uniform(falloc(sz[i]), sz[i], &r, -1, 1);
    d[i] = DEV(h[i], sz[i]);
  }
  double nc, ng;
  OK(probe_grads_l2norm(&nc, h, sz, 3));
  OK(CU(grads_l2norm, &ng, d, sz, 3));
  ck_assert_double_eq_tol(ng, nc, 1e-12 * nc);
  int bc = -1, bg = -1;
  OK(probe_grads_scale(h, sz, 3, 0.125f, &bc));
  OK(CU(grads_scale, d, sz, 3, 0.125f, &bg));
  ck_assert_int_eq(bc, 0);
  ck_assert_int_eq(bg, 0);
  cmp("grads scaled", h[0], d[0], sz[0], PROBE_DTYPE_F32);
  h[1][3] = INFINITY;
  DFREE(d[1]);
  d[1] = DEV(h[1], sz[1]);
  OK(CU(grads_scale, d, sz, 3, 1.0f, &bg));
  ck_assert_int_eq(bg, 1);
  OK(CU(grads_l2norm, &ng, d, sz, 3));
  ck_assert(isinf(ng));
  for (int i = 0; i < 3; i++)
    DFREE(d[i]), free(h[i]);
}
END_TEST

static Suite *make_gpu_layers_suite(void) {
  Suite *s = suite_create("gpu_layers");
  TCase *tc = tcase_create("cuda_vs_cpu");
  tcase_set_timeout(tc, 300);
  tcase_add_loop_test(tc, gpu_linear, 0, 6);
  tcase_add_loop_test(tc, gpu_bn, 0, 6);
  tcase_add_loop_test(tc, gpu_layernorm, 0, 3);
  tcase_add_loop_test(tc, gpu_revin, 0, 6);
  tcase_add_loop_test(tc, gpu_activations, 0, 3);
  tcase_add_loop_test(tc, gpu_softmax_ce, 0, 3);
  tcase_add_loop_test(tc, gpu_mse, 0, 3);
  tcase_add_loop_test(tc, gpu_attention, 0, 6);
  tcase_add_test(tc, gpu_grads_helpers);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  probe_status st = probe_layers_backend_init(&cu, PROBE_BACKEND_CUDA, NULL);
  if (st != PROBE_OK) {
    printf("SKIP: no usable CUDA device for the layer kernels (%s)\n",
           probe_status_str(st));
    return 77;
  }
  SRunner *sr = srunner_create(make_gpu_layers_suite());
  srunner_set_fork_status(sr, CK_NOFORK);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  probe_layers_backend_free(&cu);
  return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
