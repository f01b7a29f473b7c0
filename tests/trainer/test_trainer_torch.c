/*
 * tests/trainer/test_trainer_torch.c - the trainer's FP32 model against
 * PyTorch on identical weights and batch: for model stacks covering every
 * module kind and both losses, one forward and backward in the trainer
 * (pt_debug_grad) and in torch_model.py (/usr/bin/python3, Debian's torch);
 * the loss and every parameter block's gradient must agree within 1e-5
 * relative (block L2 norm of the difference over the norm of the reference),
 * except where grad_tolerance() names a scenario and says why.
 * Exits 77 (CTest: skipped) when torch is not importable.
 */
#define _POSIX_C_SOURCE 200809L
#include <check.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ampprobe/trainer.h"
#include "trainer-impl.h"

#ifndef TORCH_MODEL_PY
#error "TORCH_MODEL_PY must name tests/trainer/torch_model.py"
#endif

static int torch_missing = 0;

static json_t *farray(const float *v, size_t n) {
  json_t *a = json_array();
  for (size_t i = 0; i < n; i++) json_array_append_new(a, json_real(v[i]));
  return a;
}

/* Gradient tolerance (relative L2) for a scenario. allreduce-overflow is
 * built to overflow: its targets sit at level 3000 with RevIN's denorm
 * off, so the loss is ~5e8 and enc.fc1's gradient is a batch sum of large
 * terms of both signs that mostly cancel; FP32 rounding then depends on
 * the summation order (trainer vs PyTorch/BLAS). Measured 4.0e-5 on
 * 2026-12-02; 1e-4 keeps a 2.5x margin and still fails on a wrong
 * gradient (those differ by O(1)). */
static double grad_tolerance(const char *label) {
  return strcmp(label, "allreduce-overflow") == 0 ? 1e-4 : 1e-5;
}

/* Runs the comparison for one config text. */
static void compare_config(const char *label, const char *json_text) {
  char err[512];
  probe_train_config *c;
  ck_assert_msg(probe_config_from_json(&c, json_text, err, sizeof err) == PROBE_OK,
                "%s: %s", label, err);
  ck_assert_int_eq(probe_config_set(c, "precision", "fp32", err, sizeof err), PROBE_OK);
  pt_debug_out o;
  ck_assert_msg(pt_debug_grad(c, &o, err, sizeof err) == PROBE_OK, "%s: %s", label, err);
  char *cfg = probe_config_to_json(c);
  json_t *in = json_object();
  json_object_set_new(in, "config", json_loads(cfg, 0, NULL));
  free(cfg);
  json_object_set_new(in, "batch", json_integer(o.batch));
  json_object_set_new(in, "in_dim", json_integer(o.in_dim));
  json_object_set_new(in, "params", farray(o.params, o.n_params));
  json_object_set_new(in, "x", farray(o.x, (size_t)(o.batch * o.in_dim)));
  json_object_set_new(in, "y", farray(o.y, (size_t)(o.batch * o.out_dim)));
  json_t *lab = json_array();
  for (int64_t b = 0; b < o.batch; b++) json_array_append_new(lab, json_integer(o.labels[b]));
  json_object_set_new(in, "labels", lab);
  char inp[] = "/tmp/ampprobe-torch-in-XXXXXX", outp[] = "/tmp/ampprobe-torch-out-XXXXXX";
  close(mkstemp(inp));
  close(mkstemp(outp));
  ck_assert_int_eq(json_dump_file(in, inp, JSON_REAL_PRECISION(9)), 0);
  json_decref(in);
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "/usr/bin/python3 '%s' '%s' '%s'", TORCH_MODEL_PY, inp, outp);
  int rc = system(cmd);
  if (WIFEXITED(rc) && WEXITSTATUS(rc) == 77) {
    torch_missing = 1;
  } else {
    ck_assert_msg(WIFEXITED(rc) && WEXITSTATUS(rc) == 0, "%s: %s failed", label, cmd);
    json_error_t je;
    json_t *res = json_load_file(outp, 0, &je);
    ck_assert_msg(res != NULL, "%s: %s", label, je.text);
    double tl = json_number_value(json_object_get(res, "loss"));
    json_t *g = json_object_get(res, "grads");
    ck_assert_uint_eq(json_array_size(g), o.n_params);
    double lrel = fabs(o.loss - tl) / fabs(tl);
    /* per module parameter block */
    probe_layer_desc layers[40];
    size_t nl;
    probe_config_layers(c, layers, 40, &nl);
    double worst = 0.0;
    size_t off = 0;
    /* block sizes: walk the params the way the trainer lays them out */
    int64_t w = o.in_dim;
    for (int i = 0; i < c->n_modules; i++) {
      const pt_module_spec *m = &c->modules[i];
      size_t n = 0;
      int64_t next = w;
      switch (m->type) {
      case PT_MOD_LINEAR: n = (size_t)(m->out * w + (m->bias ? m->out : 0)); next = m->out; break;
      case PT_MOD_BN: case PT_MOD_LAYERNORM: n = (size_t)(2 * w); break;
      case PT_MOD_REVIN: n = m->affine ? 2 : 0; break;
      case PT_MOD_ATTENTION: {
        int64_t C = w / m->seq;
        n = (size_t)(4 * C * C + 4 * C);
        break;
      }
      default: break;
      }
      double dd = 0, rr = 0;
      for (size_t k = off; k < off + n; k++) {
        double t = json_number_value(json_array_get(g, k));
        dd += (o.grads[k] - t) * (o.grads[k] - t);
        rr += t * t;
      }
      if (n) {
        double rel = rr > 0 ? sqrt(dd / rr) : sqrt(dd);
        if (rel > worst) worst = rel;
        ck_assert_msg(rel <= grad_tolerance(label),
                      "%s: %s gradient differs from PyTorch by %.2e "
                      "(relative L2)", label, m->name, rel);
      }
      off += n;
      w = next;
    }
    ck_assert_uint_eq(off, o.n_params);
    printf("  %-22s loss %.8g vs torch %.8g (rel %.1e), worst gradient block rel %.1e\n",
           label, o.loss, tl, lrel, worst);
    ck_assert_msg(lrel <= 1e-5, "%s: loss %.9g vs torch %.9g", label, o.loss, tl);
    json_decref(res);
  }
  unlink(inp);
  unlink(outp);
  pt_debug_free(&o);
  probe_config_free(c);
}

START_TEST(test_scenarios_vs_torch) {
  /* every scenario's model in FP32 (their data: regression, clusters, time
   * series forecast and classification, RevIN with and without denorm) */
  const char *name = probe_scenario_name((size_t)_i);
  compare_config(name, probe_scenario_json(name));
}
END_TEST

START_TEST(test_all_kinds_vs_torch) {
  const char *json =
      "{\"name\": \"all-kinds\", \"loss_weight\": 0.5, \"model\": ["
      " {\"type\": \"linear\", \"name\": \"emb\", \"out\": 32},"
      " {\"type\": \"attention\", \"name\": \"attn\", \"seq\": 4},"
      " {\"type\": \"layernorm\", \"name\": \"ln\"},"
      " {\"type\": \"gelu\"}, {\"type\": \"bn\"}, {\"type\": \"relu\"},"
      " {\"type\": \"linear\", \"name\": \"head\", \"out\": 3, \"bias\": false},"
      " {\"type\": \"softmax\"}], \"loss\": \"cross_entropy\","
      " \"data\": {\"kind\": \"clusters\", \"features\": 6, \"classes\": 3,"
      " \"batch\": 16}}";
  compare_config("all-kinds", json);
  const char *rev =
      "{\"name\": \"revin-noaffine\", \"model\": ["
      " {\"type\": \"revin\", \"affine\": false},"
      " {\"type\": \"linear\", \"out\": 16}, {\"type\": \"gelu\"},"
      " {\"type\": \"layernorm\"}, {\"type\": \"linear\", \"out\": 4}],"
      " \"data\": {\"kind\": \"timeseries\", \"window\": 12, \"horizon\": 4,"
      " \"batch\": 8, \"level\": 10, \"amplitude\": 3}}";
  compare_config("revin-noaffine", rev);
}
END_TEST

int main(void) {
  Suite *s = suite_create("trainer_torch");
  TCase *tc = tcase_create("fp32");
  tcase_set_timeout(tc, 120);
  tcase_add_loop_test(tc, test_scenarios_vs_torch, 0, (int)probe_scenario_count());
  tcase_add_test(tc, test_all_kinds_vs_torch);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_set_fork_status(sr, CK_NOFORK); /* torch_missing is seen here */
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  if (torch_missing) {
    printf("SKIP: PyTorch is not importable by /usr/bin/python3\n");
    return 77;
  }
  return failed == 0 ? 0 : 1;
}
