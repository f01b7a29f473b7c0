/*
 * tests/trainer/test_trainer_gpu.c - the CUDA backend of the trainer against
 * the CPU one: every scenario for 50 steps on both, losses compared step by
 * step. FP32 within 1e-5 relative; FP16/BF16 within the tolerance of
 * docs/precision.md ("CPU and CUDA backends"). Needs a CUDA build and a
 * device; elsewhere it prints SKIP and exits 77, which CTest counts as
 * skipped (SKIP_RETURN_CODE). Runs without fork (CUDA).
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ampprobe/trainer.h"

/* 60 steps: past every scenario's planted step (nan-input's NaN batch is
 * step 50, and a config refuses a nan_step past its last step) */
#define GPU_STEPS 60
#define GPU_STEPS_STR "60"
#define FP32_RTOL 1e-5
#define FP16_RTOL 2e-2

typedef struct losses {
  int n;
  double v[GPU_STEPS];
} losses;

static int collect(int64_t step, double loss, double scale, void *user) {
  (void)scale;
  losses *l = user;
  if (step < GPU_STEPS) l->v[step] = loss;
  l->n = (int)step + 1;
  return 0;
}

/* The scenario shortened to GPU_STEPS at precision prec; NULL with the
 * reason in err when its config refuses that. */
static probe_train_config *configure(const char *scn, const char *prec,
                                     char *err, size_t cap) {
  probe_train_config *c = NULL;
  if (probe_config_load_scenario(&c, scn, err, cap) != PROBE_OK) return NULL;
  if (probe_config_set(c, "steps", GPU_STEPS_STR, err, cap) != PROBE_OK ||
      probe_config_set(c, "precision", prec, err, cap) != PROBE_OK) {
    probe_config_free(c);
    return NULL;
  }
  return c;
}

static void run_backend(const char *scn, const char *prec, probe_backend b,
                        losses *l, probe_train_result *r) {
  char err[512] = "";
  probe_train_config *c = configure(scn, prec, err, sizeof err);
  ck_assert_msg(c != NULL, "%s %s: %s", scn, prec, err);
  probe_train_opts o;
  probe_train_opts_init(&o);
  o.backend = b;
  o.progress = collect;
  o.user = l;
  memset(l, 0, sizeof *l);
  ck_assert_msg(probe_train(c, &o, r, err, sizeof err) == PROBE_OK, "%s: %s", scn, err);
  probe_config_free(c);
}

static void compare(const char *scn, const char *prec, double rtol,
                    int max_steps) {
  losses a, b;
  probe_train_result ra, rb;
  run_backend(scn, prec, PROBE_BACKEND_CPU, &a, &ra);
  run_backend(scn, prec, PROBE_BACKEND_CUDA, &b, &rb);
  ck_assert_int_eq(a.n, b.n);
  double worst = 0.0;
  for (int s = 0; s < a.n && s < max_steps; s++) {
    int fa = isfinite(a.v[s]), fb = isfinite(b.v[s]);
    ck_assert_msg(fa == fb, "%s %s step %d: cpu %g cuda %g", scn, prec, s,
                  a.v[s], b.v[s]);
    if (!fa) continue;
    double rel = fabs(a.v[s] - b.v[s]) / fmax(fabs(a.v[s]), 1e-30);
    if (rel > worst) worst = rel;
    ck_assert_msg(rel <= rtol, "%s %s step %d: cpu %.9g cuda %.9g (rel %.2e > %.0e)",
                  scn, prec, s, a.v[s], b.v[s], rel, rtol);
  }
  if (max_steps >= GPU_STEPS) { /* over the whole run */
    ck_assert_int_eq(ra.diverged, rb.diverged);
    ck_assert_int_eq(ra.first_nonfinite_loss_step, rb.first_nonfinite_loss_step);
  }
  printf("  %-20s %-5s worst relative loss difference %.2e (%.3f s cpu, %.3f s cuda)\n",
         scn, prec, worst, ra.wall_seconds, rb.wall_seconds);
}

/* lr-too-high grows geometrically, and clip-before-unscale runs away once
 * its loss scale falls below 1 (each backoff doubles the next update):
 * differences are amplified, so only their first steps are compared. */
static int steps_for(const char *scn) {
  if (strcmp(scn, "lr-too-high") == 0) return 5;
  if (strcmp(scn, "clip-before-unscale") == 0) return 20;
  return GPU_STEPS;
}

START_TEST(test_fp32) {
  const char *scn = probe_scenario_name((size_t)_i);
  compare(scn, "fp32", FP32_RTOL, steps_for(scn));
}
END_TEST

START_TEST(test_fp16) {
  const char *scn = probe_scenario_name((size_t)_i);
  compare(scn, "fp16", FP16_RTOL, steps_for(scn));
}
END_TEST

/* Every scenario at both precisions takes this test's configuration: checked
 * on every machine, so that a scenario added with a planted step past
 * GPU_STEPS fails here and not first on a GPU (as nan-input did). */
static int configs_ok(void) {
  int ok = 1;
  const char *precs[] = {"fp32", "fp16"};
  for (size_t i = 0; i < probe_scenario_count(); i++)
    for (int p = 0; p < 2; p++) {
      char err[512] = "";
      probe_train_config *c = configure(probe_scenario_name(i), precs[p], err, sizeof err);
      if (c == NULL) {
        printf("FAIL: %s %s: %s\n", probe_scenario_name(i), precs[p], err);
        ok = 0;
      }
      probe_config_free(c);
    }
  return ok;
}

int main(void) {
  if (!configs_ok()) return 1;
  if (!probe_train_backend_available(PROBE_BACKEND_CUDA)) {
    printf("SKIP: no CUDA backend (build without CUDA or no device); the %zu "
           "scenarios' configurations were checked\n", probe_scenario_count());
    return 77; /* CTest's SKIP_RETURN_CODE */
  }
  setvbuf(stdout, NULL, _IOLBF, 0);
  Suite *s = suite_create("trainer_gpu");
  TCase *tc = tcase_create("backends");
  tcase_set_timeout(tc, 300);
  int n = (int)probe_scenario_count();
  tcase_add_loop_test(tc, test_fp32, 0, n);
  tcase_add_loop_test(tc, test_fp16, 0, n);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_set_fork_status(sr, CK_NOFORK);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? 0 : 1;
}
