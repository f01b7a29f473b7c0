/*
 * test_layers_torch.c - every layer kernel in FP32 against PyTorch.
 *
 * Builds one case per module kind from a seeded generator, runs the CPU
 * kernels (forward, then backward with a random upstream gradient), writes
 * the inputs to a tensor archive, runs tests/layers/torch_ref.py (torch.nn
 * modules / functional ops in float64 on the same values) and compares every
 * output and gradient. Measure: per tensor, max|c - t| / max(max|t|, 1e-30)
 * with t the PyTorch value; pass when <= 1e-5. Exits 77 (skip) when
 * /usr/bin/python3 cannot import torch.
 */
#define _XOPEN_SOURCE 700
#include <check.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ampprobe/layers.h"
#include "testutil.h"

#ifndef TORCH_REF_SCRIPT
#error "TORCH_REF_SCRIPT must name tests/layers/torch_ref.py"
#endif
#define PYTHON "/usr/bin/python3"
#define TOL 1e-5
#define F32 PROBE_DTYPE_F32

/* ---- a tiny named-tensor archive (format in torch_ref.py) ---------------- */

enum { DT_F32 = 0, DT_I32 = 1, DT_F64 = 2 };

typedef struct {
  char name[64];
  uint32_t dtype, ndim;
  uint64_t dims[4];
  size_t n;
  void *data; /* owned */
} tensor;

typedef struct {
  tensor t[128];
  size_t count;
} archive;

static size_t dt_size(uint32_t dt) { return dt == DT_F64 ? 8 : 4; }

static void ar_add(archive *a, const char *name, uint32_t dtype,
                   const void *data, uint32_t ndim, const uint64_t *dims) {
  ck_assert_uint_lt(a->count, 128);
  tensor *t = &a->t[a->count++];
  snprintf(t->name, sizeof t->name, "%s", name);
  t->dtype = dtype;
  t->ndim = ndim;
  t->n = 1;
  for (uint32_t i = 0; i < ndim; i++) {
    t->dims[i] = dims[i];
    t->n *= dims[i];
  }
  t->data = xcalloc(t->n, dt_size(dtype));
  memcpy(t->data, data, t->n * dt_size(dtype));
}

/* Add a float tensor with up to 3 dims (0 ends the list). */
static void ar_f32(archive *a, const char *name, const float *data, uint64_t d0,
                   uint64_t d1, uint64_t d2) {
  uint64_t dims[3] = {d0, d1, d2};
  uint32_t nd = d2 ? 3 : d1 ? 2 : 1;
  ar_add(a, name, DT_F32, data, nd, dims);
}

static const tensor *ar_find(const archive *a, const char *name) {
  for (size_t i = 0; i < a->count; i++)
    if (strcmp(a->t[i].name, name) == 0)
      return &a->t[i];
  return NULL;
}

static void ar_free(archive *a) {
  for (size_t i = 0; i < a->count; i++)
    free(a->t[i].data);
  a->count = 0;
}

static int ar_write(const archive *a, const char *path) {
  FILE *f = fopen(path, "wb");
  if (!f)
    return -1;
  uint32_t c = (uint32_t)a->count;
  fwrite("AMPLTEN1", 1, 8, f);
  fwrite(&c, 4, 1, f);
  for (size_t i = 0; i < a->count; i++) {
    const tensor *t = &a->t[i];
    uint32_t nl = (uint32_t)strlen(t->name);
    fwrite(&nl, 4, 1, f);
    fwrite(t->name, 1, nl, f);
    fwrite(&t->dtype, 4, 1, f);
    fwrite(&t->ndim, 4, 1, f);
    fwrite(t->dims, 8, t->ndim, f);
    fwrite(t->data, dt_size(t->dtype), t->n, f);
  }
  return fclose(f);
}

static int ar_read(archive *a, const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f)
    return -1;
  char magic[8];
  uint32_t c;
  int ok = fread(magic, 1, 8, f) == 8 && memcmp(magic, "AMPLTEN1", 8) == 0 &&
           fread(&c, 4, 1, f) == 1 && c <= 128;
  for (uint32_t i = 0; ok && i < c; i++) {
    tensor *t = &a->t[a->count];
    uint32_t nl;
    ok = fread(&nl, 4, 1, f) == 1 && nl < sizeof t->name &&
         fread(t->name, 1, nl, f) == nl && fread(&t->dtype, 4, 1, f) == 1 &&
         fread(&t->ndim, 4, 1, f) == 1 && t->ndim <= 4 &&
         fread(t->dims, 8, t->ndim, f) == t->ndim && t->dtype <= DT_F64;
    if (!ok)
      break;
    t->name[nl] = '\0';
    t->n = 1;
    for (uint32_t k = 0; k < t->ndim; k++)
      t->n *= t->dims[k];
    t->data = xcalloc(t->n, dt_size(t->dtype));
    ok = fread(t->data, dt_size(t->dtype), t->n, f) == t->n;
    a->count++;
  }
  fclose(f);
  return ok ? 0 : -1;
}

/* ---- the cases ----------------------------------------------------------- */

#define OK(call) ck_assert_int_eq((call), PROBE_OK)

static void build_cases(archive *in, archive *res) {
  rng_t r = {0x9e3779b97f4a7c15ULL};

  { /* linear */
    int N = 6, C = 5, OC = 4;
    float *x = fill_uniform(falloc(N * C), N * C, &r, -1, 1);
    float *w = fill_uniform(falloc(OC * C), OC * C, &r, -0.5f, 0.5f);
    float *b = fill_uniform(falloc(OC), OC, &r, -0.5f, 0.5f);
    float *dout = fill_uniform(falloc(N * OC), N * OC, &r, -1, 1);
    float *out = falloc(N * OC), *dx = falloc(N * C), *dw = falloc(OC * C),
          *db = falloc(OC);
    OK(probe_linear_forward(out, x, w, b, N, C, OC, F32));
    OK(probe_linear_backward(dx, dw, db, dout, x, w, N, C, OC, F32));
    ar_f32(in, "linear.x", x, N, C, 0);
    ar_f32(in, "linear.w", w, OC, C, 0);
    ar_f32(in, "linear.b", b, OC, 0, 0);
    ar_f32(in, "linear.dout", dout, N, OC, 0);
    ar_f32(res, "linear.out", out, N, OC, 0);
    ar_f32(res, "linear.dx", dx, N, C, 0);
    ar_f32(res, "linear.dw", dw, OC, C, 0);
    ar_f32(res, "linear.db", db, OC, 0, 0);
    free(x), free(w), free(b), free(dout), free(out), free(dx), free(dw),
        free(db);
  }
  { /* batchnorm1d, features with offsets and different scales */
    int N = 8, C = 5;
    float *x = falloc(N * C);
    for (int n = 0; n < N; n++)
      for (int c = 0; c < C; c++)
        x[n * C + c] = 3.0f * c - 2.0f + (1.0f + c) * rng_uniform(&r, -1, 1);
    float *g = fill_uniform(falloc(C), C, &r, 0.5f, 1.5f);
    float *be = fill_uniform(falloc(C), C, &r, -0.5f, 0.5f);
    float *rm = fill_uniform(falloc(C), C, &r, -0.1f, 0.1f);
    float *rv = fill_uniform(falloc(C), C, &r, 0.9f, 1.1f);
    float *dout = fill_uniform(falloc(N * C), N * C, &r, -1, 1);
    float *out = falloc(N * C), *mean = falloc(C), *var = falloc(C),
          *dx = falloc(N * C), *dg = falloc(C), *db = falloc(C);
    ar_f32(in, "bn.rmean_in", rm, C, 0, 0);
    ar_f32(in, "bn.rvar_in", rv, C, 0, 0);
    OK(probe_bn_forward(out, mean, var, rm, rv, x, g, be, PROBE_BN_MOMENTUM,
                        PROBE_BN_EPS, N, C, F32));
    OK(probe_bn_backward(dx, dg, db, dout, x, mean, var, g, PROBE_BN_EPS, N, C,
                         F32));
    float *x2 = fill_uniform(falloc(N * C), N * C, &r, -3, 3);
    float *out2 = falloc(N * C);
    OK(probe_bn_forward_eval(out2, x2, g, be, rm, rv, PROBE_BN_EPS, N, C, F32));
    ar_f32(in, "bn.x2", x2, N, C, 0);
    ar_f32(res, "bn.eval_out", out2, N, C, 0);
    free(x2), free(out2);
    ar_f32(in, "bn.x", x, N, C, 0);
    ar_f32(in, "bn.gamma", g, C, 0, 0);
    ar_f32(in, "bn.beta", be, C, 0, 0);
    ar_f32(in, "bn.dout", dout, N, C, 0);
    ar_f32(res, "bn.out", out, N, C, 0);
    ar_f32(res, "bn.dx", dx, N, C, 0);
    ar_f32(res, "bn.dgamma", dg, C, 0, 0);
    ar_f32(res, "bn.dbeta", db, C, 0, 0);
    ar_f32(res, "bn.rmean", rm, C, 0, 0);
    ar_f32(res, "bn.rvar", rv, C, 0, 0);
    free(x), free(g), free(be), free(rm), free(rv), free(dout), free(out),
        free(mean), free(var), free(dx), free(dg), free(db);
  }
  { /* layernorm */
    int N = 6, C = 7;
    float *x = fill_uniform(falloc(N * C), N * C, &r, -2, 3);
    float *w = fill_uniform(falloc(C), C, &r, 0.5f, 1.5f);
    float *b = fill_uniform(falloc(C), C, &r, -0.5f, 0.5f);
    float *dout = fill_uniform(falloc(N * C), N * C, &r, -1, 1);
    float *out = falloc(N * C), *mean = falloc(N), *rstd = falloc(N),
          *dx = falloc(N * C), *dw = falloc(C), *db = falloc(C);
    OK(probe_layernorm_forward(out, mean, rstd, NULL, x, w, b, PROBE_LN_EPS, N, C,
                               F32));
    OK(probe_layernorm_backward(dx, dw, db, dout, x, mean, rstd, w, N, C, F32));
    ar_f32(in, "ln.x", x, N, C, 0);
    ar_f32(in, "ln.w", w, C, 0, 0);
    ar_f32(in, "ln.b", b, C, 0, 0);
    ar_f32(in, "ln.dout", dout, N, C, 0);
    ar_f32(res, "ln.out", out, N, C, 0);
    ar_f32(res, "ln.dx", dx, N, C, 0);
    ar_f32(res, "ln.dw", dw, C, 0, 0);
    ar_f32(res, "ln.db", db, C, 0, 0);
    free(x), free(w), free(b), free(dout), free(out), free(mean), free(rstd),
        free(dx), free(dw), free(db);
  }
  { /* RevIN: norm of x (B,T,C), denorm of an independent y (B,H,C) */
    int B = 3, T = 10, C = 2, H = 4;
    float *x = falloc(B * T * C);
    for (int i = 0; i < B * T * C; i++)
      x[i] = 50.0f * (i % C) + (1.0f + i % 3) * rng_uniform(&r, -4, 4);
    float *y = fill_uniform(falloc(B * H * C), B * H * C, &r, -2, 2);
    float *g = fill_uniform(falloc(C), C, &r, 0.5f, 1.5f);
    float *be = fill_uniform(falloc(C), C, &r, -0.5f, 0.5f);
    float *dxn = fill_uniform(falloc(B * T * C), B * T * C, &r, -1, 1);
    float *dyd = fill_uniform(falloc(B * H * C), B * H * C, &r, -1, 1);
    float *xn = falloc(B * T * C), *yd = falloc(B * H * C),
          *mean = falloc(B * C), *sd = falloc(B * C), *dx = falloc(B * T * C),
          *dy = falloc(B * H * C), *dg = falloc(C), *db = falloc(C);
    OK(probe_revin_norm_forward(xn, mean, sd, NULL, x, g, be, PROBE_REVIN_EPS, B, T,
                                C, F32));
    OK(probe_revin_denorm_forward(yd, y, mean, sd, g, be, PROBE_REVIN_EPS, B, H,
                                  C, F32));
    OK(probe_revin_denorm_backward(dy, dg, db, dyd, y, sd, g, be,
                                   PROBE_REVIN_EPS, B, H, C, F32));
    OK(probe_revin_norm_backward(dx, dg, db, dxn, x, mean, sd, g, B, T, C,
                                 F32));
    ar_f32(in, "revin.x", x, B, T, C);
    ar_f32(in, "revin.y", y, B, H, C);
    ar_f32(in, "revin.gamma", g, C, 0, 0);
    ar_f32(in, "revin.beta", be, C, 0, 0);
    ar_f32(in, "revin.dxn", dxn, B, T, C);
    ar_f32(in, "revin.dyd", dyd, B, H, C);
    ar_f32(res, "revin.xn", xn, B, T, C);
    ar_f32(res, "revin.yd", yd, B, H, C);
    ar_f32(res, "revin.mean", mean, B * C, 0, 0);
    ar_f32(res, "revin.stdev", sd, B * C, 0, 0);
    ar_f32(res, "revin.dx", dx, B, T, C);
    ar_f32(res, "revin.dy", dy, B, H, C);
    ar_f32(res, "revin.dgamma", dg, C, 0, 0);
    ar_f32(res, "revin.dbeta", db, C, 0, 0);
    free(x), free(y), free(g), free(be), free(dxn), free(dyd), free(xn),
        free(yd), free(mean), free(sd), free(dx), free(dy), free(dg), free(db);
  }
  { /* relu and gelu */
    int n = 40;
    float *x = falloc(n), *dout = falloc(n), *out = falloc(n), *dx = falloc(n);
    for (int i = 0; i < n; i++) {
      x[i] = rng_uniform(&r, -4, 4);
      if (fabsf(x[i]) < 1e-2f)
        x[i] = 0.5f; /* keep away from relu's kink */
    }
    fill_uniform(dout, n, &r, -1, 1);
    OK(probe_relu_forward(out, x, n, F32));
    OK(probe_relu_backward(dx, dout, x, n, F32));
    ar_f32(in, "relu.x", x, n, 0, 0);
    ar_f32(in, "relu.dout", dout, n, 0, 0);
    ar_f32(res, "relu.out", out, n, 0, 0);
    ar_f32(res, "relu.dx", dx, n, 0, 0);
    OK(probe_gelu_forward(out, x, n, F32));
    OK(probe_gelu_backward(dx, dout, x, n, F32));
    ar_f32(in, "gelu.x", x, n, 0, 0);
    ar_f32(in, "gelu.dout", dout, n, 0, 0);
    ar_f32(res, "gelu.out", out, n, 0, 0);
    ar_f32(res, "gelu.dx", dx, n, 0, 0);
    free(x), free(dout), free(out), free(dx);
  }
  { /* softmax */
    int N = 5, V = 7;
    float *x = fill_uniform(falloc(N * V), N * V, &r, -5, 5);
    float *dout = fill_uniform(falloc(N * V), N * V, &r, -1, 1);
    float *p = falloc(N * V), *dx = falloc(N * V);
    OK(probe_softmax_forward(p, x, N, V, F32));
    OK(probe_softmax_backward(dx, dout, p, N, V, F32));
    ar_f32(in, "softmax.x", x, N, V, 0);
    ar_f32(in, "softmax.dout", dout, N, V, 0);
    ar_f32(res, "softmax.out", p, N, V, 0);
    ar_f32(res, "softmax.dx", dx, N, V, 0);
    free(x), free(dout), free(p), free(dx);
  }
  for (int causal = 0; causal <= 1; causal++) { /* attention */
    int B = 2, T = 5, C = 4, BT = B * T;
    const char *nm = causal ? "attnc" : "attn";
    char key[64];
    float *x = fill_uniform(falloc(BT * C), BT * C, &r, -1, 1);
    float *wqkv = fill_uniform(falloc(3 * C * C), 3 * C * C, &r, -0.6f, 0.6f);
    float *bqkv = fill_uniform(falloc(3 * C), 3 * C, &r, -0.2f, 0.2f);
    float *wo = fill_uniform(falloc(C * C), C * C, &r, -0.6f, 0.6f);
    float *bo = fill_uniform(falloc(C), C, &r, -0.2f, 0.2f);
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
                                dout, x, qkv, pr, atty, wqkv, wo, B, T, C,
                                F32));
#define KEY(s) (snprintf(key, sizeof key, "%s.%s", nm, s), key)
    ar_f32(in, KEY("x"), x, B, T, C);
    ar_f32(in, KEY("wqkv"), wqkv, 3 * C, C, 0);
    ar_f32(in, KEY("bqkv"), bqkv, 3 * C, 0, 0);
    ar_f32(in, KEY("wo"), wo, C, C, 0);
    ar_f32(in, KEY("bo"), bo, C, 0, 0);
    ar_f32(in, KEY("dout"), dout, B, T, C);
    ar_f32(res, KEY("out"), out, B, T, C);
    ar_f32(res, KEY("probs"), pr, B, T, T);
    ar_f32(res, KEY("dx"), dx, B, T, C);
    ar_f32(res, KEY("dwqkv"), dwqkv, 3 * C, C, 0);
    ar_f32(res, KEY("dbqkv"), dbqkv, 3 * C, 0, 0);
    ar_f32(res, KEY("dwo"), dwo, C, C, 0);
    ar_f32(res, KEY("dbo"), dbo, C, 0, 0);
#undef KEY
    free(x), free(wqkv), free(bqkv), free(wo), free(bo), free(dout), free(out),
        free(qkv), free(sc), free(pr), free(atty), free(dx), free(dwqkv),
        free(dbqkv), free(dwo), free(dbo), free(dqkv), free(datty), free(dp),
        free(ds);
  }
  { /* mse */
    int n = 20;
    float dloss = 0.75f, loss;
    float *p = fill_uniform(falloc(n), n, &r, -2, 2);
    float *t = fill_uniform(falloc(n), n, &r, -2, 2);
    float *dp = falloc(n);
    OK(probe_mse_forward(&loss, p, t, n, F32));
    OK(probe_mse_backward(dp, p, t, dloss, n, F32));
    ar_f32(in, "mse.pred", p, n, 0, 0);
    ar_f32(in, "mse.target", t, n, 0, 0);
    ar_f32(in, "mse.dloss", &dloss, 1, 0, 0);
    ar_f32(res, "mse.loss", &loss, 1, 0, 0);
    ar_f32(res, "mse.dpred", dp, n, 0, 0);
    free(p), free(t), free(dp);
  }
  { /* cross-entropy on probabilities from a softmax */
    int N = 6, V = 5;
    float dloss = 1.3f, loss;
    float *x = fill_uniform(falloc(N * V), N * V, &r, -3, 3);
    float *p = falloc(N * V), *dp = falloc(N * V);
    int y[6];
    for (int n = 0; n < N; n++)
      y[n] = (int)(rng_u64(&r) % V);
    OK(probe_softmax_forward(p, x, N, V, F32));
    OK(probe_crossentropy_forward(&loss, NULL, p, y, N, V, F32));
    OK(probe_crossentropy_backward(dp, p, y, dloss, N, V, F32));
    uint64_t dims[1] = {(uint64_t)N};
    ar_f32(in, "ce.probs", p, N, V, 0);
    ar_add(in, "ce.targets", DT_I32, y, 1, dims);
    ar_f32(in, "ce.dloss", &dloss, 1, 0, 0);
    ar_f32(res, "ce.loss", &loss, 1, 0, 0);
    ar_f32(res, "ce.dprobs", dp, N, V, 0);
    free(x), free(p), free(dp);
  }
}

START_TEST(test_against_torch) {
  static archive in, res, ref;
  char dir[] = "/tmp/ampprobe-layers-XXXXXX";
  ck_assert_ptr_nonnull(mkdtemp(dir));
  char pin[128], pout[128], cmd[512];
  snprintf(pin, sizeof pin, "%s/in.bin", dir);
  snprintf(pout, sizeof pout, "%s/out.bin", dir);
  build_cases(&in, &res);
  ck_assert_int_eq(ar_write(&in, pin), 0);
  snprintf(cmd, sizeof cmd, "%s %s %s %s", PYTHON, TORCH_REF_SCRIPT, pin, pout);
  int rc = system(cmd);
  ck_assert_msg(rc == 0, "torch_ref.py failed (status %d): %s", rc, cmd);
  ck_assert_int_eq(ar_read(&ref, pout), 0);

  printf("%-14s %8s %12s\n", "tensor", "n", "max rel err");
  double worst = 0.0;
  int failed = 0;
  for (size_t i = 0; i < res.count; i++) {
    const tensor *c = &res.t[i];
    const tensor *t = ar_find(&ref, c->name);
    ck_assert_msg(t != NULL, "PyTorch gave no %s", c->name);
    ck_assert_msg(t->dtype == DT_F64 && t->n == c->n, "%s: shape %zu vs %zu",
                  c->name, c->n, t->n);
    double e =
        rel_err_fd((const float *)c->data, (const double *)t->data, c->n);
    printf("%-14s %8zu %12.3e%s\n", c->name, c->n, e, e <= TOL ? "" : "  FAIL");
    if (!(e <= TOL))
      failed++;
    if (e > worst || isnan(e))
      worst = e;
  }
  printf("worst %.3e (tolerance %.0e)\n", worst, TOL);
  ck_assert_msg(failed == 0, "%d tensors differ from PyTorch by more than %g",
                failed, TOL);
  ar_free(&in);
  ar_free(&res);
  ar_free(&ref);
  unlink(pin);
  unlink(pout);
  rmdir(dir);
}
END_TEST

static Suite *make_torch_suite(void) {
  Suite *s = suite_create("layers_torch");
  TCase *tc = tcase_create("fp32_vs_torch");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_against_torch);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  if (system(PYTHON " -c 'import torch' >/dev/null 2>&1") != 0) {
    printf("SKIP: %s cannot import torch (python3-torch not installed)\n",
           PYTHON);
    return 77;
  }
  SRunner *sr = srunner_create(make_torch_suite());
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
