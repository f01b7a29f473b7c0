/*
 * test_layers.c - Check suites for the CPU layer kernels (kernels/layers/).
 *
 *  - gradcheck: every module's backward (FP32) against central finite
 *    differences of an independent double-precision forward written here,
 *    and every FP32 forward against that double forward.
 *  - fp16: the precision semantics of docs/precision.md: materialised tensors
 *    are FP16 values, rounding on entry, FP32 accumulation, and the failure
 *    modes (variance overflow in BN/LayerNorm/RevIN, softmax underflow,
 *    gradient flush to zero).
 *  - helpers: gradient-list norm and scaling, argument checks.
 *
 * Tolerances. The finite differences are taken in double with step
 * h = 1e-6 max(1,|x|): truncation error O(h^2) ~ 1e-12 and cancellation
 * ~ 1e-16 |L| / h ~ 1e-9 relative, negligible. What remains is the FP32
 * rounding of the analytic gradient (and of the FP32 forward): each element
 * is a sum of at most ~60 products here, so its relative error is bounded by
 * ~60 * 2^-24 = 3.6e-6 of the magnitudes summed. Errors are measured per
 * tensor as max|a - ref| / max|ref|; the bound is 2e-5, which leaves margin
 * for the cancellation inside the normalisation backwards, while a wrong
 * term in any formula gives errors of order 1e-2 or more.
 */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ampprobe/layers.h"
#include "ampprobe/numerics.h"
#include "testutil.h"

#define TOL 2e-5
#define F32 PROBE_DTYPE_F32
#define F16 PROBE_DTYPE_F16
#define BF16 PROBE_DTYPE_BF16
#define OK(call) ck_assert_int_eq((call), PROBE_OK)

/* ---- double-precision reference forwards --------------------------------- */

typedef struct fdcase fdcase;
struct fdcase {
  int d[4];      /* module sizes, meaning per module */
  int flag;      /* causal for attention */
  double *in[8]; /* inputs (perturbed one element at a time) */
  size_t n[8];
  const double *x0; /* RevIN: the unperturbed input the statistics come from */
  const int *targets;
  double *r; /* upstream gradient (dout), n_out elements */
  size_t n_out;
  void (*fwd)(const fdcase *, double *out);
};

static void ref_linear(const fdcase *c, double *out) {
  int N = c->d[0], C = c->d[1], OC = c->d[2];
  const double *x = c->in[0], *w = c->in[1], *b = c->in[2];
  for (int n = 0; n < N; n++)
    for (int o = 0; o < OC; o++) {
      double s = b[o];
      for (int i = 0; i < C; i++)
        s += x[n * C + i] * w[o * C + i];
      out[n * OC + o] = s;
    }
}

static void ref_bn(const fdcase *c, double *out) {
  int N = c->d[0], C = c->d[1];
  const double *x = c->in[0], *g = c->in[1], *b = c->in[2];
  for (int k = 0; k < C; k++) {
    double m = 0, v = 0;
    for (int n = 0; n < N; n++)
      m += x[n * C + k];
    m /= N;
    for (int n = 0; n < N; n++)
      v += (x[n * C + k] - m) * (x[n * C + k] - m);
    v /= N;
    for (int n = 0; n < N; n++)
      out[n * C + k] = (x[n * C + k] - m) / sqrt(v + 1e-5) * g[k] + b[k];
  }
}

static void ref_ln(const fdcase *c, double *out) {
  int N = c->d[0], C = c->d[1];
  const double *x = c->in[0], *w = c->in[1], *b = c->in[2];
  for (int n = 0; n < N; n++) {
    double m = 0, v = 0;
    for (int i = 0; i < C; i++)
      m += x[n * C + i];
    m /= C;
    for (int i = 0; i < C; i++)
      v += (x[n * C + i] - m) * (x[n * C + i] - m);
    v /= C;
    for (int i = 0; i < C; i++)
      out[n * C + i] = (x[n * C + i] - m) / sqrt(v + 1e-5) * w[i] + b[i];
  }
}

/* Statistics of series (b,c) of x (B,T,C), biased variance. */
static void ref_series_stats(const double *x, int b, int c, int T, int C,
                             double *mean, double *sd) {
  double m = 0, v = 0;
  for (int t = 0; t < T; t++)
    m += x[(b * T + t) * C + c];
  m /= T;
  for (int t = 0; t < T; t++) {
    double dd = x[(b * T + t) * C + c] - m;
    v += dd * dd;
  }
  *mean = m;
  *sd = sqrt(v / T + 1e-5);
}

/* RevIN norm with detached statistics (taken from x0, not the perturbed x). */
static void ref_revin_norm(const fdcase *c, double *out) {
  int B = c->d[0], T = c->d[1], C = c->d[2];
  const double *x = c->in[0], *g = c->in[1], *be = c->in[2];
  for (int b = 0; b < B; b++)
    for (int k = 0; k < C; k++) {
      double m, sd;
      ref_series_stats(c->x0, b, k, T, C, &m, &sd);
      for (int t = 0; t < T; t++) {
        int i = (b * T + t) * C + k;
        out[i] = (x[i] - m) / sd * g[k] + be[k];
      }
    }
}

/* RevIN denorm of y (B,H,C) with mean in[3], stdev in[4] (B,C). */
static void ref_revin_denorm(const fdcase *c, double *out) {
  int B = c->d[0], H = c->d[1], C = c->d[2];
  const double *y = c->in[0], *g = c->in[1], *be = c->in[2];
  const double *m = c->in[3], *sd = c->in[4];
  for (int b = 0; b < B; b++)
    for (int k = 0; k < C; k++)
      for (int t = 0; t < H; t++) {
        int i = (b * H + t) * C + k;
        out[i] = (y[i] - be[k]) / (g[k] + 1e-10) * sd[b * C + k] + m[b * C + k];
      }
}

static void ref_relu(const fdcase *c, double *out) {
  for (size_t i = 0; i < c->n[0]; i++)
    out[i] = c->in[0][i] > 0 ? c->in[0][i] : 0;
}

static void ref_gelu(const fdcase *c, double *out) {
  for (size_t i = 0; i < c->n[0]; i++) {
    double x = c->in[0][i];
    out[i] = 0.5 * x *
             (1 + tanh(sqrt(2 / 3.14159265358979323846) *
                       (x + 0.044715 * x * x * x)));
  }
}

static void softmax_rows(double *p, const double *x, int N, int V) {
  for (int n = 0; n < N; n++) {
    double mx = -INFINITY, s = 0;
    for (int i = 0; i < V; i++)
      mx = fmax(mx, x[n * V + i]);
    for (int i = 0; i < V; i++)
      s += (p[n * V + i] = exp(x[n * V + i] - mx));
    for (int i = 0; i < V; i++)
      p[n * V + i] /= s;
  }
}

static void ref_softmax(const fdcase *c, double *out) {
  softmax_rows(out, c->in[0], c->d[0], c->d[1]);
}

static void ref_attention(const fdcase *c, double *out) {
  int B = c->d[0], T = c->d[1], C = c->d[2];
  const double *x = c->in[0], *wqkv = c->in[1], *bqkv = c->in[2],
               *wo = c->in[3], *bo = c->in[4];
  double *qkv = dalloc((size_t)B * T * 3 * C), *s = dalloc((size_t)T * T),
         *p = dalloc((size_t)T * T), *y = dalloc((size_t)C);
  for (int n = 0; n < B * T; n++)
    for (int o = 0; o < 3 * C; o++) {
      double a = bqkv[o];
      for (int i = 0; i < C; i++)
        a += x[n * C + i] * wqkv[o * C + i];
      qkv[n * 3 * C + o] = a;
    }
  for (int b = 0; b < B; b++) {
    const double *q = qkv + (size_t)b * T * 3 * C;
    for (int i = 0; i < T; i++)
      for (int j = 0; j < T; j++) {
        double a = 0;
        for (int k = 0; k < C; k++)
          a += q[i * 3 * C + k] * q[j * 3 * C + C + k];
        s[i * T + j] = (c->flag && j > i) ? -INFINITY : a / sqrt((double)C);
      }
    softmax_rows(p, s, T, T);
    for (int i = 0; i < T; i++) {
      for (int k = 0; k < C; k++) {
        y[k] = 0;
        for (int j = 0; j < T; j++)
          y[k] += p[i * T + j] * q[j * 3 * C + 2 * C + k];
      }
      for (int o = 0; o < C; o++) {
        double a = bo[o];
        for (int k = 0; k < C; k++)
          a += y[k] * wo[o * C + k];
        out[((size_t)b * T + i) * C + o] = a;
      }
    }
  }
  free(qkv), free(s), free(p), free(y);
}

static void ref_mse(const fdcase *c, double *out) {
  double s = 0;
  for (size_t i = 0; i < c->n[0]; i++) {
    double d = c->in[0][i] - c->in[1][i];
    s += d * d;
  }
  out[0] = s / (double)c->n[0];
}

static void ref_ce(const fdcase *c, double *out) {
  int N = c->d[0], V = c->d[1];
  double s = 0;
  for (int n = 0; n < N; n++)
    s -= log(c->in[0][n * V + c->targets[n]]);
  out[0] = s / N;
}

/* ---- finite-difference machinery ----------------------------------------- */

static double *to_double(const float *a, size_t n) {
  double *d = dalloc(n);
  for (size_t i = 0; i < n; i++)
    d[i] = a[i];
  return d;
}

static double fd_loss(const fdcase *c) {
  double *out = dalloc(c->n_out), s = 0;
  c->fwd(c, out);
  for (size_t i = 0; i < c->n_out; i++)
    s += out[i] * c->r[i];
  free(out);
  return s;
}

/* Relative error of `analytic` against the central difference of the loss
 * with respect to input k. */
static double fd_check(fdcase *c, int k, const float *analytic) {
  double *g = dalloc(c->n[k]);
  for (size_t i = 0; i < c->n[k]; i++) {
    double v = c->in[k][i], h = 1e-6 * fmax(1.0, fabs(v));
    c->in[k][i] = v + h;
    double lp = fd_loss(c);
    c->in[k][i] = v - h;
    double lm = fd_loss(c);
    c->in[k][i] = v;
    g[i] = (lp - lm) / (2 * h);
  }
  double e = rel_err_fd(analytic, g, c->n[k]);
  free(g);
  return e;
}

/* FP32 forward output against the double forward. */
static double fwd_check(const fdcase *c, const float *out) {
  double *ref = dalloc(c->n_out);
  c->fwd(c, ref);
  double e = rel_err_fd(out, ref, c->n_out);
  free(ref);
  return e;
}

static void expect_close(const char *what, double e) {
  printf("  %-22s rel err %.3e\n", what, e);
  ck_assert_msg(e <= TOL, "%s: relative error %.3e > %.1e", what, e, TOL);
}
#define EXPECT_CLOSE(what, e) expect_close((what), (e))

static void fd_free(fdcase *c) {
  for (int i = 0; i < 8; i++)
    free(c->in[i]);
  free(c->r);
}

/* ---- gradcheck suite ----------------------------------------------------- */

START_TEST(grad_linear) {
  rng_t r = {11};
  int N = 5, C = 6, OC = 4;
  float *x = fill_uniform(falloc(N * C), N * C, &r, -1, 1);
  float *w = fill_uniform(falloc(OC * C), OC * C, &r, -1, 1);
  float *b = fill_uniform(falloc(OC), OC, &r, -1, 1);
  float *dout = fill_uniform(falloc(N * OC), N * OC, &r, -1, 1);
  float *out = falloc(N * OC), *dx = falloc(N * C), *dw = falloc(OC * C),
        *db = falloc(OC);
  OK(probe_linear_forward(out, x, w, b, N, C, OC, F32));
  OK(probe_linear_backward(dx, dw, db, dout, x, w, N, C, OC, F32));
  fdcase c = {.d = {N, C, OC}, .fwd = ref_linear, .n_out = N * OC};
  c.in[0] = to_double(x, c.n[0] = N * C);
  c.in[1] = to_double(w, c.n[1] = OC * C);
  c.in[2] = to_double(b, c.n[2] = OC);
  c.r = to_double(dout, N * OC);
  EXPECT_CLOSE("linear out", fwd_check(&c, out));
  EXPECT_CLOSE("linear dx", fd_check(&c, 0, dx));
  EXPECT_CLOSE("linear dw", fd_check(&c, 1, dw));
  EXPECT_CLOSE("linear db", fd_check(&c, 2, db));
  fd_free(&c);
  free(x), free(w), free(b), free(dout), free(out), free(dx), free(dw),
      free(db);
}
END_TEST

START_TEST(grad_bn) {
  rng_t r = {12};
  int N = 7, C = 4;
  float *x = falloc(N * C);
  for (int i = 0; i < N * C; i++)
    x[i] = 2.0f * (i % C) + rng_uniform(&r, -1, 2);
  float *g = fill_uniform(falloc(C), C, &r, 0.5f, 1.5f);
  float *be = fill_uniform(falloc(C), C, &r, -1, 1);
  float *dout = fill_uniform(falloc(N * C), N * C, &r, -1, 1);
  float *out = falloc(N * C), *mean = falloc(C), *var = falloc(C),
        *dx = falloc(N * C), *dg = falloc(C), *db = falloc(C);
  OK(probe_bn_forward(out, mean, var, NULL, NULL, x, g, be, PROBE_BN_MOMENTUM,
                      PROBE_BN_EPS, N, C, F32));
  OK(probe_bn_backward(dx, dg, db, dout, x, mean, var, g, PROBE_BN_EPS, N, C,
                       F32));
  fdcase c = {.d = {N, C}, .fwd = ref_bn, .n_out = N * C};
  c.in[0] = to_double(x, c.n[0] = N * C);
  c.in[1] = to_double(g, c.n[1] = C);
  c.in[2] = to_double(be, c.n[2] = C);
  c.r = to_double(dout, N * C);
  EXPECT_CLOSE("bn out", fwd_check(&c, out));
  EXPECT_CLOSE("bn dx", fd_check(&c, 0, dx));
  EXPECT_CLOSE("bn dgamma", fd_check(&c, 1, dg));
  EXPECT_CLOSE("bn dbeta", fd_check(&c, 2, db));
  fd_free(&c);
  free(x), free(g), free(be), free(dout), free(out), free(mean), free(var),
      free(dx), free(dg), free(db);
}
END_TEST

START_TEST(grad_layernorm) {
  rng_t r = {13};
  int N = 5, C = 8;
  float *x = fill_uniform(falloc(N * C), N * C, &r, -2, 3);
  float *w = fill_uniform(falloc(C), C, &r, 0.5f, 1.5f);
  float *b = fill_uniform(falloc(C), C, &r, -1, 1);
  float *dout = fill_uniform(falloc(N * C), N * C, &r, -1, 1);
  float *out = falloc(N * C), *mean = falloc(N), *rstd = falloc(N),
        *dx = falloc(N * C), *dw = falloc(C), *db = falloc(C);
  OK(probe_layernorm_forward(out, mean, rstd, NULL, x, w, b, PROBE_LN_EPS, N, C,
                             F32));
  OK(probe_layernorm_backward(dx, dw, db, dout, x, mean, rstd, w, N, C, F32));
  fdcase c = {.d = {N, C}, .fwd = ref_ln, .n_out = N * C};
  c.in[0] = to_double(x, c.n[0] = N * C);
  c.in[1] = to_double(w, c.n[1] = C);
  c.in[2] = to_double(b, c.n[2] = C);
  c.r = to_double(dout, N * C);
  EXPECT_CLOSE("ln out", fwd_check(&c, out));
  EXPECT_CLOSE("ln dx", fd_check(&c, 0, dx));
  EXPECT_CLOSE("ln dw", fd_check(&c, 1, dw));
  EXPECT_CLOSE("ln db", fd_check(&c, 2, db));
  fd_free(&c);
  free(x), free(w), free(b), free(dout), free(out), free(mean), free(rstd),
      free(dx), free(dw), free(db);
}
END_TEST

START_TEST(grad_revin) {
  rng_t r = {14};
  int B = 3, T = 9, C = 2, H = 4;
  float *x = falloc(B * T * C);
  for (int i = 0; i < B * T * C; i++)
    x[i] = 20.0f * (i % C) + (1 + i % 3) * rng_uniform(&r, -3, 3);
  float *y = fill_uniform(falloc(B * H * C), B * H * C, &r, -2, 2);
  float *g = fill_uniform(falloc(C), C, &r, 0.5f, 1.5f);
  float *be = fill_uniform(falloc(C), C, &r, -1, 1);
  float *dxn = fill_uniform(falloc(B * T * C), B * T * C, &r, -1, 1);
  float *dyd = fill_uniform(falloc(B * H * C), B * H * C, &r, -1, 1);
  float *xn = falloc(B * T * C), *yd = falloc(B * H * C), *mean = falloc(B * C),
        *sd = falloc(B * C), *dx = falloc(B * T * C), *dy = falloc(B * H * C),
        *dg = falloc(C), *db = falloc(C), *dg2 = falloc(C), *db2 = falloc(C);
  OK(probe_revin_norm_forward(xn, mean, sd, NULL, x, g, be, PROBE_REVIN_EPS, B, T, C,
                              F32));
  OK(probe_revin_norm_backward(dx, dg, db, dxn, x, mean, sd, g, B, T, C, F32));
  OK(probe_revin_denorm_forward(yd, y, mean, sd, g, be, PROBE_REVIN_EPS, B, H,
                                C, F32));
  OK(probe_revin_denorm_backward(dy, dg2, db2, dyd, y, sd, g, be,
                                 PROBE_REVIN_EPS, B, H, C, F32));
  fdcase c = {.d = {B, T, C}, .fwd = ref_revin_norm, .n_out = B * T * C};
  c.in[0] = to_double(x, c.n[0] = B * T * C);
  c.in[1] = to_double(g, c.n[1] = C);
  c.in[2] = to_double(be, c.n[2] = C);
  c.r = to_double(dxn, B * T * C);
  double *x0 = to_double(x, B * T * C);
  c.x0 = x0;
  EXPECT_CLOSE("revin norm out", fwd_check(&c, xn));
  EXPECT_CLOSE("revin norm dx", fd_check(&c, 0, dx));
  EXPECT_CLOSE("revin norm dgamma", fd_check(&c, 1, dg));
  EXPECT_CLOSE("revin norm dbeta", fd_check(&c, 2, db));
  /* saved statistics match the double ones */
  for (int b = 0; b < B; b++)
    for (int k = 0; k < C; k++) {
      double m, s;
      ref_series_stats(x0, b, k, T, C, &m, &s);
      ck_assert_double_eq_tol(mean[b * C + k], m, 1e-5 * fabs(m) + 1e-6);
      ck_assert_double_eq_tol(sd[b * C + k], s, 1e-5 * s);
    }
  fd_free(&c);
  fdcase d = {.d = {B, H, C}, .fwd = ref_revin_denorm, .n_out = B * H * C};
  d.in[0] = to_double(y, d.n[0] = B * H * C);
  d.in[1] = to_double(g, d.n[1] = C);
  d.in[2] = to_double(be, d.n[2] = C);
  d.in[3] = to_double(mean, d.n[3] = B * C);
  d.in[4] = to_double(sd, d.n[4] = B * C);
  d.r = to_double(dyd, B * H * C);
  EXPECT_CLOSE("revin denorm out", fwd_check(&d, yd));
  EXPECT_CLOSE("revin denorm dy", fd_check(&d, 0, dy));
  EXPECT_CLOSE("revin denorm dgamma", fd_check(&d, 1, dg2));
  EXPECT_CLOSE("revin denorm dbeta", fd_check(&d, 2, db2));
  fd_free(&d);
  free(x0);
  free(x), free(y), free(g), free(be), free(dxn), free(dyd), free(xn), free(yd),
      free(mean), free(sd), free(dx), free(dy), free(dg), free(db), free(dg2),
      free(db2);
}
END_TEST

static void check_elementwise(int gelu) {
  rng_t r = {15};
  size_t n = 50;
  float *x = falloc(n), *dout = fill_uniform(falloc(n), n, &r, -1, 1),
        *out = falloc(n), *dx = falloc(n);
  for (size_t i = 0; i < n; i++) {
    x[i] = rng_uniform(&r, -5, 5);
    if (fabsf(x[i]) < 1e-2f)
      x[i] = 0.25f; /* away from relu's kink */
  }
  OK((gelu ? probe_gelu_forward : probe_relu_forward)(out, x, n, F32));
  OK((gelu ? probe_gelu_backward : probe_relu_backward)(dx, dout, x, n, F32));
  fdcase c = {.fwd = gelu ? ref_gelu : ref_relu, .n_out = n};
  c.in[0] = to_double(x, c.n[0] = n);
  c.r = to_double(dout, n);
  EXPECT_CLOSE(gelu ? "gelu out" : "relu out", fwd_check(&c, out));
  EXPECT_CLOSE(gelu ? "gelu dx" : "relu dx", fd_check(&c, 0, dx));
  fd_free(&c);
  free(x), free(dout), free(out), free(dx);
}

START_TEST(grad_relu) { check_elementwise(0); }
END_TEST
START_TEST(grad_gelu) { check_elementwise(1); }
END_TEST

START_TEST(grad_softmax) {
  rng_t r = {16};
  int N = 4, V = 9;
  float *x = fill_uniform(falloc(N * V), N * V, &r, -4, 4);
  float *dout = fill_uniform(falloc(N * V), N * V, &r, -1, 1);
  float *p = falloc(N * V), *dx = falloc(N * V);
  OK(probe_softmax_forward(p, x, N, V, F32));
  OK(probe_softmax_backward(dx, dout, p, N, V, F32));
  fdcase c = {.d = {N, V}, .fwd = ref_softmax, .n_out = N * V};
  c.in[0] = to_double(x, c.n[0] = N * V);
  c.r = to_double(dout, N * V);
  EXPECT_CLOSE("softmax out", fwd_check(&c, p));
  EXPECT_CLOSE("softmax dx", fd_check(&c, 0, dx));
  fd_free(&c);
  free(x), free(dout), free(p), free(dx);
}
END_TEST

START_TEST(grad_attention) {
  int causal = _i; /* loop test: 0 and 1 */
  rng_t r = {17 + (uint64_t)causal};
  int B = 2, T = 5, C = 4, BT = B * T;
  float *x = fill_uniform(falloc(BT * C), BT * C, &r, -1, 1);
  float *wqkv = fill_uniform(falloc(3 * C * C), 3 * C * C, &r, -0.7f, 0.7f);
  float *bqkv = fill_uniform(falloc(3 * C), 3 * C, &r, -0.3f, 0.3f);
  float *wo = fill_uniform(falloc(C * C), C * C, &r, -0.7f, 0.7f);
  float *bo = fill_uniform(falloc(C), C, &r, -0.3f, 0.3f);
  float *dout = fill_uniform(falloc(BT * C), BT * C, &r, -1, 1);
  float *out = falloc(BT * C), *qkv = falloc(BT * 3 * C),
        *sc = falloc(B * T * T), *pr = falloc(B * T * T),
        *atty = falloc(BT * C), *dx = falloc(BT * C),
        *dwqkv = falloc(3 * C * C), *dbqkv = falloc(3 * C),
        *dwo = falloc(C * C), *dbo = falloc(C), *dqkv = falloc(BT * 3 * C),
        *datty = falloc(BT * C), *dp = falloc(B * T * T),
        *ds = falloc(B * T * T);
  OK(probe_attention_forward(out, qkv, sc, pr, atty, x, wqkv, bqkv, wo, bo,
                             causal, B, T, C, F32));
  OK(probe_attention_backward(dx, dwqkv, dbqkv, dwo, dbo, dqkv, datty, dp, ds,
                              dout, x, qkv, pr, atty, wqkv, wo, B, T, C, F32));
  if (causal) { /* masked scores are -inf and their probabilities exactly 0 */
    ck_assert(isinf(sc[1]) && sc[1] < 0);
    ck_assert_float_eq(pr[1], 0.0f);
    ck_assert_float_eq(pr[0], 1.0f);
  }
  fdcase c = {
      .d = {B, T, C}, .flag = causal, .fwd = ref_attention, .n_out = BT * C};
  c.in[0] = to_double(x, c.n[0] = BT * C);
  c.in[1] = to_double(wqkv, c.n[1] = 3 * C * C);
  c.in[2] = to_double(bqkv, c.n[2] = 3 * C);
  c.in[3] = to_double(wo, c.n[3] = C * C);
  c.in[4] = to_double(bo, c.n[4] = C);
  c.r = to_double(dout, BT * C);
  EXPECT_CLOSE("attention out", fwd_check(&c, out));
  EXPECT_CLOSE("attention dx", fd_check(&c, 0, dx));
  EXPECT_CLOSE("attention dwqkv", fd_check(&c, 1, dwqkv));
  EXPECT_CLOSE("attention dbqkv", fd_check(&c, 2, dbqkv));
  EXPECT_CLOSE("attention dwo", fd_check(&c, 3, dwo));
  EXPECT_CLOSE("attention dbo", fd_check(&c, 4, dbo));
  fd_free(&c);
  free(x), free(wqkv), free(bqkv), free(wo), free(bo), free(dout), free(out),
      free(qkv), free(sc), free(pr), free(atty), free(dx), free(dwqkv),
      free(dbqkv), free(dwo), free(dbo), free(dqkv), free(datty), free(dp),
      free(ds);
}
END_TEST

START_TEST(grad_mse) {
  rng_t r = {19};
  size_t n = 30;
  float dloss = 0.8f, loss;
  float *p = fill_uniform(falloc(n), n, &r, -2, 2);
  float *t = fill_uniform(falloc(n), n, &r, -2, 2);
  float *dp = falloc(n);
  OK(probe_mse_forward(&loss, p, t, n, F32));
  OK(probe_mse_backward(dp, p, t, dloss, n, F32));
  fdcase c = {.fwd = ref_mse, .n_out = 1};
  c.in[0] = to_double(p, c.n[0] = n);
  c.in[1] = to_double(t, c.n[1] = n);
  c.r = to_double(&dloss, 1);
  EXPECT_CLOSE("mse loss", fwd_check(&c, &loss));
  EXPECT_CLOSE("mse dpred", fd_check(&c, 0, dp));
  fd_free(&c);
  free(p), free(t), free(dp);
}
END_TEST

START_TEST(grad_crossentropy) {
  rng_t r = {20};
  int N = 6, V = 5, y[6];
  float dloss = 1.7f, loss, losses[6];
  float *x = fill_uniform(falloc(N * V), N * V, &r, -3, 3);
  float *p = falloc(N * V), *dp = falloc(N * V);
  for (int n = 0; n < N; n++)
    y[n] = (int)(rng_u64(&r) % V);
  OK(probe_softmax_forward(p, x, N, V, F32));
  OK(probe_crossentropy_forward(&loss, losses, p, y, N, V, F32));
  OK(probe_crossentropy_backward(dp, p, y, dloss, N, V, F32));
  for (int n = 0; n < N; n++)
    ck_assert_float_eq_tol(losses[n], -logf(p[n * V + y[n]]), 1e-6f);
  fdcase c = {.d = {N, V}, .targets = y, .fwd = ref_ce, .n_out = 1};
  c.in[0] = to_double(p, c.n[0] = N * V);
  c.r = to_double(&dloss, 1);
  EXPECT_CLOSE("ce loss", fwd_check(&c, &loss));
  EXPECT_CLOSE("ce dprobs", fd_check(&c, 0, dp));
  fd_free(&c);
  free(x), free(p), free(dp);
}
END_TEST

/* softmax + cross-entropy composed equal the textbook fused gradient
 * (p - onehot) * dloss / N. */
START_TEST(grad_softmax_ce_composition) {
  rng_t r = {21};
  int N = 4, V = 6, y[4] = {0, 5, 2, 2};
  float *x = fill_uniform(falloc(N * V), N * V, &r, -3, 3);
  float *p = falloc(N * V), *dp = falloc(N * V), *dx = falloc(N * V);
  float loss;
  OK(probe_softmax_forward(p, x, N, V, F32));
  OK(probe_crossentropy_forward(&loss, NULL, p, y, N, V, F32));
  OK(probe_crossentropy_backward(dp, p, y, 1.0f, N, V, F32));
  OK(probe_softmax_backward(dx, dp, p, N, V, F32));
  for (int n = 0; n < N; n++)
    for (int v = 0; v < V; v++)
      ck_assert_float_eq_tol(dx[n * V + v], (p[n * V + v] - (v == y[n])) / N,
                             1e-6f);
  free(x), free(p), free(dp), free(dx);
}
END_TEST

static Suite *make_gradcheck_suite(void) {
  Suite *s = suite_create("gradcheck");
  TCase *tc = tcase_create("fp32_vs_double_fd");
  tcase_add_test(tc, grad_linear);
  tcase_add_test(tc, grad_bn);
  tcase_add_test(tc, grad_layernorm);
  tcase_add_test(tc, grad_revin);
  tcase_add_test(tc, grad_relu);
  tcase_add_test(tc, grad_gelu);
  tcase_add_test(tc, grad_softmax);
  tcase_add_loop_test(tc, grad_attention, 0, 2);
  tcase_add_test(tc, grad_mse);
  tcase_add_test(tc, grad_crossentropy);
  tcase_add_test(tc, grad_softmax_ce_composition);
  suite_add_tcase(s, tc);
  return s;
}

/* ---- fp16 suite ---------------------------------------------------------- */

/* Every element is a value of the precision (NaN allowed): rounding it again
 * changes nothing. */
static void expect_representable(const char *what, const float *a, size_t n,
                                 probe_dtype p) {
  for (size_t i = 0; i < n; i++) {
    if (isnan(a[i]))
      continue;
    float rr = p == F16 ? probe_round_f16(a[i]) : probe_round_bf16(a[i]);
    ck_assert_msg(probe_f32_bits(rr) == probe_f32_bits(a[i]),
                  "%s[%zu] = %.9g is not a %s value", what, i, (double)a[i],
                  p == F16 ? "fp16" : "bf16");
  }
}

/* Every module in FP16 and BF16 (loop index 0, 1): all materialised tensors
 * are values of that precision. */
START_TEST(fp16_materialised_values) {
  probe_dtype P = _i == 0 ? F16 : BF16;
  rng_t r = {30};
  int N = 6, C = 5, OC = 3;
  /* inputs that are NOT representable, so rounding on entry matters */
  float *x = fill_uniform(falloc(N * C), N * C, &r, -3, 3);
  float *w = fill_uniform(falloc(OC * C), OC * C, &r, -1, 1);
  float *b = fill_uniform(falloc(OC), OC, &r, -1, 1);
  float *g = fill_uniform(falloc(C), C, &r, 0.5f, 1.5f);
  float *be = fill_uniform(falloc(C), C, &r, -1, 1);
  float *dout = fill_uniform(falloc(N * C), N * C, &r, -1, 1);
  float *o1 = falloc(N * C), *o2 = falloc(N * C), *s1 = falloc(N * C),
        *s2 = falloc(N * C), *s3 = falloc(N * C), *dx = falloc(N * C),
        *dw = falloc(OC * C),
        *db = falloc(C), *dg = falloc(C);
  /* linear */
  OK(probe_linear_forward(o1, x, w, b, N, C, OC, P));
  expect_representable("linear out", o1, N * OC, P);
  OK(probe_linear_backward(dx, dw, db, dout, x, w, N, C, OC, P));
  expect_representable("linear dx", dx, N * C, P);
  expect_representable("linear dw", dw, OC * C, P); /* from zero: one term */
  expect_representable("linear db", db, OC, P);
  /* batchnorm */
  memset(dg, 0, C * sizeof *dg), memset(db, 0, C * sizeof *db);
  OK(probe_bn_forward(o1, s1, s2, NULL, NULL, x, g, be, 0.1f, 1e-5f, N, C, P));
  expect_representable("bn out", o1, N * C, P);
  expect_representable("bn mean", s1, C, P);
  expect_representable("bn var", s2, C, P);
  OK(probe_bn_forward_eval(o2, x, g, be, s1, s2, 1e-5f, N, C, P));
  expect_representable("bn eval out", o2, N * C, P);
  OK(probe_bn_backward(dx, dg, db, dout, x, s1, s2, g, 1e-5f, N, C, P));
  expect_representable("bn dx", dx, N * C, P);
  expect_representable("bn dgamma", dg, C, P);
  expect_representable("bn dbeta", db, C, P);
  /* layernorm */
  memset(dg, 0, C * sizeof *dg), memset(db, 0, C * sizeof *db);
  OK(probe_layernorm_forward(o1, s1, s2, s3, x, g, be, 1e-5f, N, C, P));
  expect_representable("ln out", o1, N * C, P);
  expect_representable("ln var", s3, N, P);
  expect_representable("ln mean", s1, N, P);
  expect_representable("ln rstd", s2, N, P);
  OK(probe_layernorm_backward(dx, dg, db, dout, x, s1, s2, g, N, C, P));
  expect_representable("ln dx", dx, N * C, P);
  expect_representable("ln dw", dg, C, P);
  /* revin: (B,T,C) = (2,3,5) */
  memset(dg, 0, C * sizeof *dg), memset(db, 0, C * sizeof *db);
  OK(probe_revin_norm_forward(o1, s1, s2, s3, x, g, be, 1e-5f, 2, 3, C, P));
  expect_representable("revin out", o1, N * C, P);
  expect_representable("revin var", s3, 2 * C, P);
  expect_representable("revin mean", s1, 2 * C, P);
  expect_representable("revin stdev", s2, 2 * C, P);
  OK(probe_revin_norm_backward(dx, dg, db, dout, x, s1, s2, g, 2, 3, C, P));
  expect_representable("revin dx", dx, N * C, P);
  expect_representable("revin dgamma", dg, C, P);
  OK(probe_revin_denorm_forward(o2, x, s1, s2, g, be, 1e-5f, 2, 3, C, P));
  expect_representable("revin denorm out", o2, N * C, P);
  memset(dg, 0, C * sizeof *dg);
  OK(probe_revin_denorm_backward(dx, dg, db, dout, x, s2, g, be, 1e-5f, 2, 3, C,
                                 P));
  expect_representable("revin denorm dy", dx, N * C, P);
  expect_representable("revin denorm dgamma", dg, C, P);
  /* activations */
  OK(probe_relu_forward(o1, x, N * C, P));
  expect_representable("relu out", o1, N * C, P);
  OK(probe_relu_backward(dx, dout, x, N * C, P));
  expect_representable("relu dx", dx, N * C, P);
  OK(probe_gelu_forward(o1, x, N * C, P));
  expect_representable("gelu out", o1, N * C, P);
  OK(probe_gelu_backward(dx, dout, x, N * C, P));
  expect_representable("gelu dx", dx, N * C, P);
  /* softmax and cross-entropy */
  int y[6] = {0, 1, 2, 3, 4, 0};
  float loss, losses[6];
  OK(probe_softmax_forward(o1, x, N, C, P));
  expect_representable("softmax out", o1, N * C, P);
  OK(probe_softmax_backward(dx, dout, o1, N, C, P));
  expect_representable("softmax dx", dx, N * C, P);
  OK(probe_crossentropy_forward(&loss, losses, o1, y, N, C, P));
  expect_representable("ce loss", &loss, 1, P);
  expect_representable("ce losses", losses, N, P);
  OK(probe_crossentropy_backward(dx, o1, y, 3.0f, N, C, P));
  expect_representable("ce dprobs", dx, N * C, P);
  OK(probe_mse_forward(&loss, x, dout, N * C, P));
  expect_representable("mse loss", &loss, 1, P);
  OK(probe_mse_backward(dx, x, dout, 3.0f, N * C, P));
  expect_representable("mse dpred", dx, N * C, P);
  /* attention: B=1, T=3, C=2 on x (6 floats) */
  {
    int T = 3, AC = 2;
    float *wqkv = fill_uniform(falloc(12), 12, &r, -1, 1);
    float *wo = fill_uniform(falloc(4), 4, &r, -1, 1);
    float *bq = fill_uniform(falloc(6), 6, &r, -1, 1);
    float qkv[18], sc[9], pr[9], at[6], out[6], din[6],
        dwqkv[12] = {0}, dbqkv[6] = {0}, dwo[4] = {0}, dbo[2] = {0}, dqkv[18],
        dat[6], dpr[9], dsc[9];
    OK(probe_attention_forward(out, qkv, sc, pr, at, x, wqkv, bq, wo, bq, 0, 1,
                               T, AC, P));
    expect_representable("attn qkv", qkv, 18, P);
    expect_representable("attn scores", sc, 9, P);
    expect_representable("attn probs", pr, 9, P);
    expect_representable("attn atty", at, 6, P);
    expect_representable("attn out", out, 6, P);
    OK(probe_attention_backward(din, dwqkv, dbqkv, dwo, dbo, dqkv, dat, dpr,
                                dsc, dout, x, qkv, pr, at, wqkv, wo, 1, T, AC,
                                P));
    expect_representable("attn dx", din, 6, P);
    expect_representable("attn dqkv", dqkv, 18, P);
    expect_representable("attn dprobs", dpr, 9, P);
    expect_representable("attn dscores", dsc, 9, P);
    expect_representable("attn dwqkv", dwqkv, 12, P);
    expect_representable("attn dwo", dwo, 4, P);
    free(wqkv), free(wo), free(bq);
  }
  free(x), free(w), free(b), free(g), free(be), free(dout), free(o1), free(o2),
      free(s1), free(s2), free(s3), free(dx), free(dw), free(db), free(dg);
}
END_TEST

/* Weights are cast on use; the GEMM accumulates in FP32. */
START_TEST(fp16_round_on_entry_and_fp32_accumulation) {
  /* 1 + 2^-12 is not a binary16 value: it rounds to 1 on entry. */
  float x = 1.0f, w = 1.0f + 0x1p-12f, out;
  OK(probe_linear_forward(&out, &x, &w, NULL, 1, 1, 1, F16));
  ck_assert_float_eq(out, 1.0f);
  OK(probe_linear_forward(&out, &x, &w, NULL, 1, 1, 1, F32));
  ck_assert_float_eq(out, 1.0f + 0x1p-12f);
  /* 3000 products of 1 * 1: an FP16 accumulator stalls at 2048 (2048 + 1
   * rounds back to 2048); the FP32 accumulator reaches 3000 exactly. */
  int C = 3000;
  float *ones = falloc(C);
  for (int i = 0; i < C; i++)
    ones[i] = 1.0f;
  OK(probe_linear_forward(&out, ones, ones, NULL, 1, C, 1, F16));
  ck_assert_float_eq(out, 3000.0f);
  /* an FP32 module's output 70000 handed to an FP16 relu becomes inf */
  float big = 70000.0f;
  OK(probe_relu_forward(&out, &big, 1, F16));
  ck_assert(isinf(out) && out > 0);
  OK(probe_relu_forward(&out, &big, 1, F32));
  ck_assert_float_eq(out, 70000.0f);
  free(ones);
}
END_TEST

/* Features with std 400 (var 160000 > 65504): FP16 var is +inf, the output
 * collapses to beta, the running variance becomes inf; FP32 is finite. */
START_TEST(fp16_bn_variance_overflow) {
  int N = 8, C = 2;
  float x[16], g[2] = {1, 1}, be[2] = {0.25f, -0.5f}, out[16], mean[2], var[2];
  float rm[2] = {0, 0}, rv[2] = {1, 1};
  for (int n = 0; n < N; n++) {
    x[n * C + 0] = (n % 2 ? 400.0f : -400.0f) + 7.0f; /* std 400 */
    x[n * C + 1] = (n % 2 ? 1.0f : -1.0f);            /* std 1 */
  }
  OK(probe_bn_forward(out, mean, var, rm, rv, x, g, be, 0.1f, 1e-5f, N, C,
                      F16));
  ck_assert(isinf(var[0]) && var[0] > 0);
  ck_assert_float_eq(var[1], 1.0f);
  ck_assert(isinf(rv[0]));
  ck_assert_float_eq(mean[0], 7.0f);
  for (int n = 0; n < N; n++)
    ck_assert_float_eq(out[n * C], 0.25f);
  float dout[16], dx[16], dg[2] = {0}, db[2] = {0};
  for (int i = 0; i < 16; i++)
    dout[i] = (i % 3) - 1.0f;
  OK(probe_bn_backward(dx, dg, db, dout, x, mean, var, g, 1e-5f, N, C, F16));
  for (int n = 0; n < N; n++)
    ck_assert_float_eq(dx[n * C], 0.0f);
  rv[0] = rv[1] = 1;
  OK(probe_bn_forward(out, mean, var, rm, rv, x, g, be, 0.1f, 1e-5f, N, C,
                      F32));
  ck_assert_float_eq_tol(var[0], 160000.0f, 1e-2f);
  ck_assert(isfinite(rv[0]));
  ck_assert_float_eq_tol(out[1 * C], 1.0f + 0.25f, 1e-5f);
}
END_TEST

START_TEST(fp16_layernorm_variance_overflow) {
  float x[4] = {-300, 300, -300, 300}, w[4] = {1, 1, 1, 1},
        b[4] = {0.5f, 0.5f, 0.5f, 0.5f}, out[4], mean, rstd, var = 0.0f;
  OK(probe_layernorm_forward(out, &mean, &rstd, &var, x, w, b, 1e-5f, 1, 4,
                             F16));
  ck_assert_float_eq(rstd, 0.0f); /* 1/sqrt(inf) */
  ck_assert(isinf(var) && var > 0); /* the quantity that overflowed */
  for (int i = 0; i < 4; i++)
    ck_assert_float_eq(out[i], 0.5f);
  OK(probe_layernorm_forward(out, &mean, &rstd, &var, x, w, b, 1e-5f, 1, 4,
                             F32));
  ck_assert_float_eq_tol(rstd, 1.0f / 300.0f, 1e-7f);
  ck_assert_float_eq_tol(var, 90000.0f, 1e-2f);
  ck_assert_float_eq_tol(out[1], 1.5f, 1e-5f);
}
END_TEST

/* A series around 1e3 with std ~300: FP16 stdev is inf and the
 * denormalisation is non-finite; FP32 round-trips. */
START_TEST(fp16_revin_variance_overflow) {
  int B = 1, T = 16, C = 1;
  float x[16], xn[16], y[16], mean, sd, var = 0.0f;
  for (int t = 0; t < T; t++)
    x[t] = 1000.0f + (t % 2 ? 300.0f : -300.0f);
  OK(probe_revin_norm_forward(xn, &mean, &sd, &var, x, NULL, NULL, 1e-5f, B, T,
                              C, F16));
  ck_assert_float_eq(mean, 1000.0f);
  ck_assert(isinf(sd) && sd > 0);
  ck_assert(isinf(var) && var > 0);
  for (int t = 0; t < T; t++)
    ck_assert_float_eq(xn[t], 0.0f);
  OK(probe_revin_denorm_forward(y, xn, &mean, &sd, NULL, NULL, 1e-5f, B, T, C,
                                F16));
  for (int t = 0; t < T; t++)
    ck_assert(!isfinite(y[t])); /* 0 * inf = NaN */
  OK(probe_revin_norm_forward(xn, &mean, &sd, NULL, x, NULL, NULL, 1e-5f, B, T, C,
                              F32));
  ck_assert_float_eq_tol(sd, 300.0f, 1e-3f);
  OK(probe_revin_denorm_forward(y, xn, &mean, &sd, NULL, NULL, 1e-5f, B, T, C,
                                F32));
  for (int t = 0; t < T; t++)
    ck_assert_float_eq_tol(y[t], x[t], 1e-3f);
}
END_TEST

/* Logits 20 apart: p = e^-20 = 2.1e-9 <= 2^-25 is exactly 0 in FP16, the
 * cross-entropy is +inf, its gradient -inf and the softmax backward NaN. */
/* Precision loss without any inf (issue #15.1): values 2048 +- 0.5 are all
 * 2048 in FP16 (spacing 2 there), so each normalisation's materialised
 * variance is exactly 0 - the quantity the trainer records in fwd_saved -
 * while the FP32 variance is 0.25. Loop: 0 batchnorm, 1 layernorm, 2 revin,
 * each with a second, healthy group (values +-300 around 0) that keeps a
 * non-zero FP16 variance. */
START_TEST(fp16_normalisation_variance_rounds_to_zero) {
  enum { N = 8, C = 2 };
  float x[N * C], out[N * C], g[C] = {1, 1}, b[C] = {0, 0};
  for (int n = 0; n < N; n++) {
    x[n * C + 0] = 2048.0f + (n % 2 ? 0.5f : -0.5f); /* group 0: collapses */
    x[n * C + 1] = n % 2 ? 3.0f : -3.0f;             /* group 1: healthy */
  }
  float v16[N * C], v32[N * C], s1[N * C], s2[N * C];
  int groups = 0;
  for (int pass = 0; pass < 2; pass++) {
    probe_dtype P = pass ? F32 : F16;
    float *v = pass ? v32 : v16;
    switch (_i) {
    case 0: /* bn: per feature over N rows */
      OK(probe_bn_forward(out, s1, v, NULL, NULL, x, g, b, 0.1f, 1e-5f, N, C,
                          P));
      groups = 2;
      break;
    case 1: { /* layernorm: per row; rows of 2048+-0.5 only, then +-3 */
      float xr[2 * 4] = {2047.5f, 2048.5f, 2047.5f, 2048.5f, -3, 3, -3, 3};
      float w4[4] = {1, 1, 1, 1}, b4[4] = {0, 0, 0, 0};
      OK(probe_layernorm_forward(out, s1, s2, v, xr, w4, b4, 1e-5f, 2, 4, P));
      groups = 2;
      break;
    }
    default: { /* revin (B,T,C) = (2,4,1): series 0 collapses, series 1 not */
      float xs[2 * 4] = {2047.5f, 2048.5f, 2047.5f, 2048.5f, -3, 3, -3, 3};
      OK(probe_revin_norm_forward(out, s1, s2, v, xs, NULL, NULL, 1e-5f, 2, 4,
                                  1, P));
      groups = 2;
      break;
    }
    }
  }
  ck_assert_msg(v16[0] == 0.0f, "kind %d: fp16 variance %g, expected 0", _i,
                (double)v16[0]);
  ck_assert_float_eq_tol(v32[0], 0.25f, 1e-6f);
  for (int k = 1; k < groups; k++) {
    ck_assert_float_eq_tol(v16[k], 9.0f, 1e-3f);
    ck_assert_float_eq_tol(v32[k], 9.0f, 1e-5f);
  }
}
END_TEST

START_TEST(fp16_softmax_underflow) {
  float logits[2] = {0.0f, -20.0f}, p[2], loss, dp[2], dl[2];
  int y = 1;
  OK(probe_softmax_forward(p, logits, 1, 2, F16));
  ck_assert_float_eq(p[0], 1.0f);
  ck_assert(p[1] == 0.0f && !signbit(p[1]));
  OK(probe_crossentropy_forward(&loss, NULL, p, &y, 1, 2, F32));
  ck_assert(isinf(loss) && loss > 0);
  OK(probe_crossentropy_backward(dp, p, &y, 1.0f, 1, 2, F32));
  ck_assert(isinf(dp[1]) && dp[1] < 0);
  OK(probe_softmax_backward(dl, dp, p, 1, 2, F16));
  ck_assert(isnan(dl[0]) && isnan(dl[1]));
  /* FP32: p ~ 2.06e-9, loss ~ 20 */
  OK(probe_softmax_forward(p, logits, 1, 2, F32));
  ck_assert(p[1] > 0.0f);
  OK(probe_crossentropy_forward(&loss, NULL, p, &y, 1, 2, F32));
  ck_assert_float_eq_tol(loss, 20.0f, 1e-4f);
  /* the edge: e^-17 = 4.1e-8 > 2^-25 survives as an FP16 subnormal */
  logits[1] = -17.0f;
  OK(probe_softmax_forward(p, logits, 1, 2, F16));
  ck_assert(p[1] > 0.0f && p[1] < PROBE_F16_MIN_NORMAL);
}
END_TEST

/* Without loss scaling a gradient of 1e-8 per element flushes to 0 in FP16;
 * scaled by 2^16 it survives and unscales to the FP32 value. */
START_TEST(fp16_gradient_underflow_and_scaling) {
  int N = 4, C = 3, OC = 2;
  float x[12], w[6], dout[8], dx[12], dw[6] = {0}, db[2] = {0};
  for (int i = 0; i < 12; i++)
    x[i] = 0.5f;
  for (int i = 0; i < 6; i++)
    w[i] = 0.25f;
  for (int i = 0; i < 8; i++)
    dout[i] = 1e-8f; /* rounds to 0 in FP16 */
  OK(probe_linear_backward(dx, dw, db, dout, x, w, N, C, OC, F16));
  for (int i = 0; i < 6; i++)
    ck_assert_float_eq(dw[i], 0.0f);
  for (int i = 0; i < 8; i++)
    dout[i] = 1e-8f * 65536.0f;
  OK(probe_linear_backward(dx, dw, db, dout, x, w, N, C, OC, F16));
  float *gl[2] = {dw, db};
  size_t sz[2] = {6, 2};
  int bad = -1;
  OK(probe_grads_scale(gl, sz, 2, 1.0f / 65536.0f, &bad));
  ck_assert_int_eq(bad, 0);
  for (int i = 0; i < 6; i++)
    ck_assert_float_eq_tol(dw[i], 4 * 0.5f * 1e-8f, 2e-3f * 2e-8f);
}
END_TEST

/* Parameter gradients accumulate (+=) in FP32 across calls; activation
 * gradients are overwritten. */
START_TEST(accumulation_semantics) {
  float x[2] = {1.5f, -2.0f}, w[2] = {0.5f, 0.25f}, dout = 2.0f;
  float dx[2] = {99, 99}, dw[2] = {1, 1}, db = 10;
  OK(probe_linear_backward(dx, dw, &db, &dout, x, w, 1, 2, 1, F32));
  OK(probe_linear_backward(dx, dw, &db, &dout, x, w, 1, 2, 1, F32));
  ck_assert_float_eq(dx[0], 1.0f); /* overwritten: 2 * 0.5 */
  ck_assert_float_eq(dw[0], 1.0f + 2 * 3.0f);
  ck_assert_float_eq(dw[1], 1.0f - 2 * 4.0f);
  ck_assert_float_eq(db, 14.0f);
  /* In FP16 the accumulated sum stays FP32: 2048 + 1 = 2049 although 2049
   * is not an FP16 value (an FP16 accumulator would stay at 2048). */
  float one = 1.0f, acc = 2048.0f;
  OK(probe_linear_backward(NULL, NULL, &acc, &one, &one, &one, 1, 1, 1, F16));
  ck_assert_float_eq(acc, 2049.0f);
}
END_TEST

static Suite *make_fp16_suite(void) {
  Suite *s = suite_create("fp16");
  TCase *tc = tcase_create("semantics");
  tcase_add_loop_test(tc, fp16_materialised_values, 0, 2);
  tcase_add_test(tc, fp16_round_on_entry_and_fp32_accumulation);
  tcase_add_test(tc, fp16_bn_variance_overflow);
  tcase_add_test(tc, fp16_layernorm_variance_overflow);
  tcase_add_test(tc, fp16_revin_variance_overflow);
  tcase_add_loop_test(tc, fp16_normalisation_variance_rounds_to_zero, 0, 3);
  tcase_add_test(tc, fp16_softmax_underflow);
  tcase_add_test(tc, fp16_gradient_underflow_and_scaling);
  tcase_add_test(tc, accumulation_semantics);
  suite_add_tcase(s, tc);
  return s;
}

/* ---- helpers suite ------------------------------------------------------- */

START_TEST(helpers_grads) {
  float a[3] = {3, 0, 0}, b[2] = {0, 4};
  float *gl[2] = {a, b};
  size_t sz[2] = {3, 2};
  double norm;
  OK(probe_grads_l2norm(&norm, gl, sz, 2));
  ck_assert_double_eq(norm, 5.0);
  int bad = -1;
  OK(probe_grads_scale(gl, sz, 2, 0.5f, &bad));
  ck_assert_int_eq(bad, 0);
  ck_assert_float_eq(a[0], 1.5f);
  ck_assert_float_eq(b[1], 2.0f);
  b[0] = INFINITY;
  OK(probe_grads_l2norm(&norm, gl, sz, 2));
  ck_assert(isinf(norm));
  OK(probe_grads_scale(gl, sz, 2, 1.0f, &bad));
  ck_assert_int_eq(bad, 1);
  b[0] = NAN;
  OK(probe_grads_l2norm(&norm, gl, sz, 2));
  ck_assert(isnan(norm));
  OK(probe_grads_l2norm(&norm, NULL, NULL, 0));
  ck_assert_double_eq(norm, 0.0);
}
END_TEST

START_TEST(helpers_round) {
  float in[3] = {1.0f + 0x1p-12f, 70000.0f, 1e-9f}, out[3];
  OK(probe_layers_round(out, in, 3, F16));
  ck_assert_float_eq(out[0], 1.0f);
  ck_assert(isinf(out[1]));
  ck_assert_float_eq(out[2], 0.0f);
  OK(probe_layers_round(out, in, 3, F32));
  ck_assert_float_eq(out[0], in[0]);
  ck_assert_float_eq(probe_layers_round1(70000.0f, BF16), 70144.0f);
}
END_TEST

START_TEST(helpers_invalid_args) {
  float a[4] = {0}, b[4] = {0};
  ck_assert_int_eq(probe_linear_forward(NULL, a, a, NULL, 1, 1, 1, F32),
                   PROBE_ERR_INVALID_ARG);
  ck_assert_int_eq(probe_linear_forward(b, a, a, NULL, 0, 1, 1, F32),
                   PROBE_ERR_INVALID_ARG);
  ck_assert_int_eq(probe_softmax_forward(b, a, 1, 4, (probe_dtype)7),
                   PROBE_ERR_INVALID_ARG);
  ck_assert_int_eq(
      probe_bn_forward(b, a, a, NULL, NULL, a, a, a, 0.1f, 1e-5f, 1, 4, F32),
      PROBE_ERR_INVALID_ARG); /* N = 1: no unbiased variance */
  int y = 4;
  float loss;
  ck_assert_int_eq(probe_crossentropy_forward(&loss, NULL, a, &y, 1, 4, F32),
                   PROBE_ERR_INVALID_ARG);
  ck_assert_int_eq(
      probe_revin_norm_forward(b, a, a, NULL, a, a, NULL, 1e-5f, 1, 4, 1, F32),
      PROBE_ERR_INVALID_ARG); /* gamma without beta */
}
END_TEST

/* PyTorch's relu keeps NaN (relu(nan) = nan) and its backward passes the
 * gradient where the input is NaN (threshold_backward tests x <= 0). */
START_TEST(relu_propagates_nan) {
  float in[3] = {NAN, -1.0f, 2.0f}, out[3], dout[3] = {5.0f, 5.0f, 5.0f},
        dinp[3];
  OK(probe_relu_forward(out, in, 3, F16));
  ck_assert_float_nan(out[0]);
  ck_assert_float_eq(out[1], 0.0f);
  ck_assert_float_eq(out[2], 2.0f);
  OK(probe_relu_backward(dinp, dout, in, 3, F16));
  ck_assert_float_eq(dinp[0], 5.0f);
  ck_assert_float_eq(dinp[1], 0.0f);
  ck_assert_float_eq(dinp[2], 5.0f);
}
END_TEST

static Suite *make_helpers_suite(void) {
  Suite *s = suite_create("helpers");
  TCase *tc = tcase_create("helpers");
  tcase_add_test(tc, helpers_grads);
  tcase_add_test(tc, helpers_round);
  tcase_add_test(tc, helpers_invalid_args);
  tcase_add_test(tc, relu_propagates_nan);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  SRunner *sr = srunner_create(make_gradcheck_suite());
  srunner_add_suite(sr, make_fp16_suite());
  srunner_add_suite(sr, make_helpers_suite());
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
