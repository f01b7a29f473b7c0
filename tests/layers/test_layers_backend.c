/*
 * test_layers_backend.c - the table of operations (probe_layer_ops) and the
 * backend registry of ampprobe/layers.h.
 *
 *  - every backend this build has is started once and has every entry of its
 *    table filled; one that is not compiled in answers PROBE_ERR_UNSUPPORTED
 *    ("not supported in this build") and leaves the handle zeroed;
 *  - the CPU table reaches the reference function of the same name: each op
 *    through the table is bit-identical to the direct call, on inputs where
 *    a swapped entry (relu for gelu, forward for eval...) would differ;
 *  - the CPU memory entries allocate zeroed memory and copy.
 * The CUDA table's numbers are compared with the CPU reference in
 * tests/gpu/test_gpu_layers.c (on a device, and on the CPU emulation).
 */
#include <check.h>
#include <math.h>
#include <string.h>

#include "ampprobe/layers.h"
#include "testutil.h"

#define OK(call) ck_assert_int_eq((call), PROBE_OK)

/* Every entry of a table, by name. */
#define OPS_ENTRIES(X)                                                         \
  X(destroy) X(sync) X(alloc) X(free) X(copy) X(round) X(linear_forward)       \
  X(linear_backward) X(bn_forward) X(bn_backward) X(bn_forward_eval)            \
  X(layernorm_forward) X(layernorm_backward) X(revin_norm_forward)              \
  X(revin_norm_backward) X(revin_denorm_forward) X(revin_denorm_backward)       \
  X(relu_forward) X(relu_backward) X(gelu_forward) X(gelu_backward)             \
  X(softmax_forward) X(softmax_backward) X(attention_forward)                   \
  X(attention_backward) X(mse_forward) X(mse_backward)                          \
  X(crossentropy_forward) X(crossentropy_backward) X(grads_l2norm)              \
  X(grads_scale)

static void assert_bits_eq(const char *what, const float *a, const float *b,
                           size_t n) {
  ck_assert_msg(memcmp(a, b, n * sizeof(float)) == 0,
                "%s: table and direct call differ", what);
}

START_TEST(every_compiled_backend_is_complete) {
  static const probe_backend kinds[] = {PROBE_BACKEND_CPU, PROBE_BACKEND_CUDA};
  int started = 0;
  for (size_t k = 0; k < sizeof kinds / sizeof *kinds; k++) {
    probe_layers_backend b;
    memset(&b, 0xab, sizeof b);
    probe_status st = probe_layers_backend_init(&b, kinds[k], NULL);
    if (!probe_backend_compiled(kinds[k])) {
      /* "not supported", cleanly: no table, no context */
      ck_assert_int_eq(st, PROBE_ERR_UNSUPPORTED);
      ck_assert_str_eq(probe_status_str(st), "not supported in this build");
      ck_assert_ptr_null(b.ops);
      ck_assert_ptr_null(b.ctx);
      probe_layers_backend_free(&b); /* harmless */
      continue;
    }
    if (st == PROBE_ERR_NO_DEVICE) { /* compiled in, machine without GPU */
      ck_assert_ptr_null(b.ops);
      continue;
    }
    ck_assert_int_eq(st, PROBE_OK);
    ck_assert_ptr_nonnull(b.ops);
    ck_assert_str_eq(b.ops->name, probe_backend_name(kinds[k]));
    ck_assert_int_eq(b.kind, kinds[k]);
#define X(f) ck_assert_msg(b.ops->f != NULL, "%s: no " #f, b.ops->name);
    OPS_ENTRIES(X)
#undef X
    probe_layers_backend_free(&b);
    ck_assert_ptr_null(b.ops);
    started++;
  }
  ck_assert_int_ge(started, 1); /* the CPU at least */
}
END_TEST

START_TEST(registry_names_and_errors) {
  ck_assert_str_eq(probe_backend_name(PROBE_BACKEND_CPU), "cpu");
  ck_assert_str_eq(probe_backend_name(PROBE_BACKEND_CUDA), "cuda");
  ck_assert_str_eq(probe_backend_name((probe_backend)42), "?");
  ck_assert_int_eq(probe_backend_compiled(PROBE_BACKEND_CPU), 1);
  ck_assert_int_eq(probe_backend_compiled((probe_backend)42), 0);
  probe_layers_backend b;
  ck_assert_int_eq(probe_layers_backend_init(&b, (probe_backend)42, NULL),
                   PROBE_ERR_INVALID_ARG);
  ck_assert_int_eq(probe_layers_backend_init(NULL, PROBE_BACKEND_CPU, NULL),
                   PROBE_ERR_INVALID_ARG);
  probe_layers_backend_free(NULL);
}
END_TEST

START_TEST(cpu_memory_entries) {
  probe_layers_backend b;
  OK(probe_layers_backend_init(&b, PROBE_BACKEND_CPU, NULL));
  ck_assert_int_eq(b.ops->device_memory, 0);
  void *p = NULL;
  OK(b.ops->alloc(b.ctx, &p, 1000));
  for (int i = 0; i < 1000; i++)
    ck_assert_int_eq(((unsigned char *)p)[i], 0);
  float src[5] = {1, 2, 3, 4, 5};
  OK(b.ops->copy(b.ctx, p, src, sizeof src));
  ck_assert_int_eq(memcmp(p, src, sizeof src), 0);
  OK(b.ops->sync(b.ctx));
  b.ops->free(b.ctx, p);
  ck_assert_int_eq(b.ops->alloc(b.ctx, NULL, 4), PROBE_ERR_INVALID_ARG);
  probe_layers_backend_free(&b);
}
END_TEST

/* Each op through the CPU table equals the direct call (loop: precision). */
START_TEST(cpu_table_reaches_the_reference) {
  probe_dtype P = (probe_dtype)_i;
  probe_layers_backend b;
  OK(probe_layers_backend_init(&b, PROBE_BACKEND_CPU, NULL));
  const probe_layer_ops *o = b.ops;
  rng_t r = {77 + (uint64_t)_i};
  enum { N = 6, C = 5, OC = 3 };
  float *x = fill_uniform(falloc(N * C), N * C, &r, -3, 3);
  float *w = fill_uniform(falloc(OC * C), OC * C, &r, -1, 1);
  float *bias = fill_uniform(falloc(OC), OC, &r, -1, 1);
  float *g = fill_uniform(falloc(C), C, &r, 0.5f, 1.5f);
  float *be = fill_uniform(falloc(C), C, &r, -1, 1);
  float *a1 = falloc(N * C), *a2 = falloc(N * C), *m1 = falloc(N * C),
        *m2 = falloc(N * C), *v1 = falloc(N * C), *v2 = falloc(N * C),
        *s1 = falloc(N * C), *s2 = falloc(N * C);
  OK(o->linear_forward(b.ctx, a1, x, w, bias, N, C, OC, P));
  OK(probe_linear_forward(a2, x, w, bias, N, C, OC, P));
  assert_bits_eq("linear_forward", a1, a2, N * OC);
  OK(o->bn_forward(b.ctx, a1, m1, v1, NULL, NULL, x, g, be, 0.1f, 1e-5f, N, C,
                   P));
  OK(probe_bn_forward(a2, m2, v2, NULL, NULL, x, g, be, 0.1f, 1e-5f, N, C, P));
  assert_bits_eq("bn_forward", a1, a2, N * C);
  assert_bits_eq("bn var", v1, v2, C);
  OK(o->bn_forward_eval(b.ctx, a1, x, g, be, m2, v2, 1e-5f, N, C, P));
  OK(probe_bn_forward_eval(a2, x, g, be, m2, v2, 1e-5f, N, C, P));
  assert_bits_eq("bn_forward_eval", a1, a2, N * C);
  OK(o->layernorm_forward(b.ctx, a1, m1, s1, v1, x, g, be, 1e-5f, N, C, P));
  OK(probe_layernorm_forward(a2, m2, s2, v2, x, g, be, 1e-5f, N, C, P));
  assert_bits_eq("layernorm_forward", a1, a2, N * C);
  assert_bits_eq("layernorm var", v1, v2, N);
  OK(o->revin_norm_forward(b.ctx, a1, m1, s1, v1, x, g, be, 1e-5f, 2, 3, C,
                           P));
  OK(probe_revin_norm_forward(a2, m2, s2, v2, x, g, be, 1e-5f, 2, 3, C, P));
  assert_bits_eq("revin_norm_forward", a1, a2, N * C);
  assert_bits_eq("revin var", v1, v2, 2 * C);
  OK(o->revin_denorm_forward(b.ctx, a1, x, m2, s2, g, be, 1e-5f, 2, 3, C, P));
  OK(probe_revin_denorm_forward(a2, x, m2, s2, g, be, 1e-5f, 2, 3, C, P));
  assert_bits_eq("revin_denorm_forward", a1, a2, N * C);
  OK(o->relu_forward(b.ctx, a1, x, N * C, P));
  OK(probe_relu_forward(a2, x, N * C, P));
  assert_bits_eq("relu_forward", a1, a2, N * C);
  OK(o->gelu_forward(b.ctx, a1, x, N * C, P));
  OK(probe_gelu_forward(a2, x, N * C, P));
  assert_bits_eq("gelu_forward", a1, a2, N * C);
  OK(o->relu_backward(b.ctx, a1, w, x, OC * C, P));
  OK(probe_relu_backward(a2, w, x, OC * C, P));
  assert_bits_eq("relu_backward", a1, a2, OC * C);
  OK(o->gelu_backward(b.ctx, a1, w, x, OC * C, P));
  OK(probe_gelu_backward(a2, w, x, OC * C, P));
  assert_bits_eq("gelu_backward", a1, a2, OC * C);
  OK(o->softmax_forward(b.ctx, a1, x, N, C, P));
  OK(probe_softmax_forward(a2, x, N, C, P));
  assert_bits_eq("softmax_forward", a1, a2, N * C);
  OK(o->round(b.ctx, a1, x, N * C, P));
  OK(probe_layers_round(a2, x, N * C, P));
  assert_bits_eq("round", a1, a2, N * C);
  float l1, l2;
  OK(o->mse_forward(b.ctx, &l1, x, a2, N * C, P));
  OK(probe_mse_forward(&l2, x, a2, N * C, P));
  assert_bits_eq("mse_forward", &l1, &l2, 1);
  int y[N] = {0, 1, 2, 3, 4, 0};
  OK(probe_softmax_forward(a2, x, N, C, P));
  OK(o->crossentropy_forward(b.ctx, &l1, NULL, a2, y, N, C, P));
  OK(probe_crossentropy_forward(&l2, NULL, a2, y, N, C, P));
  assert_bits_eq("crossentropy_forward", &l1, &l2, 1);
  double n1, n2;
  float *gl[1] = {x};
  size_t gs[1] = {N * C};
  OK(o->grads_l2norm(b.ctx, &n1, gl, gs, 1));
  OK(probe_grads_l2norm(&n2, gl, gs, 1));
  ck_assert(n1 == n2);
  free(x), free(w), free(bias), free(g), free(be), free(a1), free(a2),
      free(m1), free(m2), free(v1), free(v2), free(s1), free(s2);
  probe_layers_backend_free(&b);
}
END_TEST

static Suite *make_backend_suite(void) {
  Suite *s = suite_create("layers_backend");
  TCase *tc = tcase_create("table");
  tcase_add_test(tc, every_compiled_backend_is_complete);
  tcase_add_test(tc, registry_names_and_errors);
  tcase_add_test(tc, cpu_memory_entries);
  tcase_add_loop_test(tc, cpu_table_reaches_the_reference, 0, 3);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  SRunner *sr = srunner_create(make_backend_suite());
  /* CUDA does not survive fork: a CUDA build may start the device here. */
  srunner_set_fork_status(sr, CK_NOFORK);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? 0 : 1;
}
