/*
 * tests/trainer/test_scenarios.c - behaviour of every scenario of the zoo
 * through the library API: each fails (or trains) the way its config says,
 * for the stated reason, and the stated fix works. Prints each run's wall
 * time (the zoo must stay fast: bisect runs many trials).
 */
#define _POSIX_C_SOURCE 200809L
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ampprobe/probe.h"
#include "ampprobe/trainer.h"

/* Runs scenario `name` with up to two overrides; trace to `trace` if set. */
static probe_train_result run2(const char *name, const char *k1,
                               const char *v1, const char *k2, const char *v2,
                               const char *trace) {
  char err[512];
  probe_train_config *c;
  ck_assert_msg(probe_config_load_scenario(&c, name, err, sizeof err) == PROBE_OK,
                "%s", err);
  if (k1) ck_assert_msg(probe_config_set(c, k1, v1, err, sizeof err) == PROBE_OK, "%s", err);
  if (k2) ck_assert_msg(probe_config_set(c, k2, v2, err, sizeof err) == PROBE_OK, "%s", err);
  probe_train_opts o;
  probe_train_opts_init(&o);
  o.trace_path = trace;
  o.mode = PROBE_MODE_FULL;
  probe_train_result r;
  ck_assert_msg(probe_train(c, &o, &r, err, sizeof err) == PROBE_OK, "%s", err);
  char pol[128];
  probe_config_policy_str(c, pol, sizeof pol);
  printf("  %-20s %-34s %s%s%s steps %4lld final %-12.5g skipped %3lld "
         "diverged %d  %.3f s\n", name, pol, k1 ? k1 : "", k1 ? "=" : "",
         k1 ? v1 : "", (long long)r.steps_run, r.final_loss,
         (long long)r.skipped_steps, r.diverged, r.wall_seconds);
  probe_config_free(c);
  return r;
}

static probe_train_result run(const char *name, const char *k1,
                              const char *v1) {
  return run2(name, k1, v1, NULL, NULL, NULL);
}

static void assert_close(double a, double b, double rel, const char *what) {
  ck_assert_msg(isfinite(a) && isfinite(b) && fabs(a - b) <= rel * fabs(b),
                "%s: %g vs %g (allowed %g%%)", what, a, b, 100 * rel);
}

START_TEST(test_healthy) {
  probe_train_result h = run("healthy", NULL, NULL);
  probe_train_result f = run("healthy", "precision", "fp32");
  ck_assert(!h.diverged && !f.diverged);
  ck_assert(h.final_loss < 0.2 * h.first_loss);
  assert_close(h.final_loss, f.final_loss, 0.02, "healthy fp16 vs fp32");
  ck_assert_int_le(h.longest_skip_run, 2);
  ck_assert(h.min_scale >= 1024.0);
  probe_train_result b = run("healthy", "precision", "bf16");
  ck_assert(!b.diverged);
  ck_assert(b.final_loss < 0.2 * b.first_loss);
}
END_TEST

START_TEST(test_revin_overflow) {
  probe_train_result h = run("revin-overflow", NULL, NULL);
  ck_assert(h.diverged);
  ck_assert_int_eq(h.first_nonfinite_loss_step, 0);
  /* the first non-finite tensor is RevIN's saved statistic (its stdev,
   * from the variance that overflowed) at step 0 */
  ck_assert_int_eq(h.first_nonfinite_step, 0);
  ck_assert_str_eq(h.first_nonfinite_layer, "revin");
  ck_assert_int_eq(h.first_nonfinite_site, PROBE_SITE_FWD_SAVED);
  ck_assert_int_eq(h.skipped_steps, h.steps_run);
  probe_train_result fix = run("revin-overflow", "fp32", "revin");
  probe_train_result f = run("revin-overflow", "precision", "fp32");
  ck_assert(!fix.diverged && !f.diverged);
  ck_assert(f.final_loss < 0.7 * f.first_loss);
  assert_close(fix.final_loss, f.final_loss, 0.05, "revin fp32 vs fp32");
  ck_assert_int_le(fix.skipped_steps, 2);
  /* the result says what was configured, not what the numbers suggest:
   * clipping at 5 with no finite norm in the failing run; the scaler on
   * (at its initial scale 1) in the fixed one; off in FP32 */
  ck_assert(h.clip_max_norm == 5.0);
  ck_assert_int_eq(h.clip_norms_seen, 0);
  ck_assert(h.max_clip_ratio == 0.0);
  ck_assert_int_eq(h.scaler_enabled, 1);
  ck_assert_int_eq(fix.scaler_enabled, 1);
  ck_assert(fix.min_scale == 1.0 && fix.max_scale == 1.0);
  ck_assert_int_eq(fix.clip_norms_seen, fix.steps_run);
  ck_assert_int_eq(f.scaler_enabled, 0);
  /* the other kinds do not help */
  probe_train_result no = run("revin-overflow", "fp32", "bn,softmax,linear");
  ck_assert(no.diverged);
}
END_TEST

START_TEST(test_bn_overflow) {
  probe_train_result h = run("bn-overflow", NULL, NULL);
  probe_train_result f = run("bn-overflow", "precision", "fp32");
  /* enc.bn1's FP16 variance is inf: the layer outputs zeros and training
   * stalls (the loss stays finite; the inf is in the saved variance). */
  ck_assert_int_eq(h.first_nonfinite_step, 0);
  ck_assert_str_eq(h.first_nonfinite_layer, "enc.bn1");
  ck_assert_int_eq(h.first_nonfinite_site, PROBE_SITE_FWD_SAVED);
  ck_assert(isfinite(h.final_loss));
  ck_assert(h.final_loss > 3.0 * f.final_loss);
  probe_train_result one = run("bn-overflow", "fp32", "enc.bn1");
  assert_close(one.final_loss, f.final_loss, 0.05, "enc.bn1 fp32 vs fp32");
  probe_train_result all = run("bn-overflow", "fp32", "bn");
  assert_close(all.final_loss, f.final_loss, 0.05, "bn fp32 vs fp32");
  /* the second BatchNorm is not the culprit */
  probe_train_result two = run("bn-overflow", "fp32", "enc.bn2");
  ck_assert(two.final_loss > 3.0 * f.final_loss);
}
END_TEST

START_TEST(test_softmax_underflow) {
  probe_train_result h = run("softmax-underflow", NULL, NULL);
  ck_assert(h.diverged);
  ck_assert_int_eq(h.first_nonfinite_loss_step, 0);
  /* the probabilities are finite zeros; the first non-finite tensor is the
   * loss (-log 0) */
  ck_assert_str_eq(h.first_nonfinite_layer, "loss");
  ck_assert_int_eq(h.first_nonfinite_site, PROBE_SITE_FWD_OUT);
  probe_train_result fix = run("softmax-underflow", "fp32", "softmax");
  probe_train_result f = run("softmax-underflow", "precision", "fp32");
  ck_assert(!fix.diverged && !f.diverged);
  ck_assert(f.final_loss < 0.05 * f.first_loss);
  assert_close(fix.final_loss, f.final_loss, 0.05, "softmax fp32 vs fp32");
  probe_train_result g = run("softmax-underflow", "fp32", "head.soft*");
  ck_assert(!g.diverged);
}
END_TEST

START_TEST(test_two_culprits) {
  probe_train_result f = run("two-culprits", "precision", "fp32");
  ck_assert(!f.diverged);
  ck_assert(f.final_loss < 0.1 * f.first_loss);
  probe_train_result none = run("two-culprits", NULL, NULL);
  probe_train_result rev = run("two-culprits", "fp32", "revin");
  probe_train_result sm = run("two-culprits", "fp32", "softmax");
  probe_train_result both = run("two-culprits", "fp32", "revin,softmax");
  /* all FP16: RevIN's overflow zeroes the features, the classifier is at
   * chance (log 4) */
  ck_assert(none.final_loss > 10.0 * f.final_loss);
  ck_assert_str_eq(none.first_nonfinite_layer, "revin");
  /* RevIN fixed: the softmax underflows, infinite loss */
  ck_assert(rev.diverged);
  ck_assert_int_eq(rev.first_nonfinite_loss_step, 0);
  /* softmax fixed: RevIN still zeroes the features */
  ck_assert(sm.final_loss > 10.0 * f.final_loss);
  ck_assert_str_eq(sm.first_nonfinite_layer, "revin");
  /* both: trains like FP32 */
  ck_assert(!both.diverged);
  assert_close(both.final_loss, f.final_loss, 0.15, "both fp32 vs fp32");
}
END_TEST

/* Fraction of zeros in enc.fc1's weight gradient over the last 50 steps of
 * a trace. */
static double fc1_grad_zero_fraction(const char *path) {
  probe_trace *t;
  ck_assert_int_eq(probe_trace_open(&t, path), PROBE_OK);
  size_t nl;
  const probe_layer_info *L = probe_trace_layers(t, &nl);
  int32_t fc1 = -1;
  for (size_t i = 0; i < nl; i++)
    if (!strcmp(L[i].name, "enc.fc1")) fc1 = L[i].id;
  ck_assert_int_ge(fc1, 0);
  const probe_trace_info *in = probe_trace_get_info(t);
  static probe_record rec[1024];
  uint64_t zeros = 0, count = 0;
  for (int64_t off = 0; off < in->n_records;) {
    size_t got;
    ck_assert_int_eq(probe_trace_read_records(t, off, 1024, rec, &got), PROBE_OK);
    if (!got) break;
    for (size_t i = 0; i < got; i++)
      if (rec[i].layer == fc1 && rec[i].site == PROBE_SITE_WEIGHT_GRAD &&
          rec[i].step >= in->last_step - 50) {
        zeros += rec[i].stats.zero_count;
        count += rec[i].stats.count;
      }
    off += (int64_t)got;
  }
  probe_trace_close(t);
  return count ? (double)zeros / (double)count : -1.0;
}

START_TEST(test_grad_underflow) {
  char a[] = "/tmp/ampprobe-gu-a-XXXXXX", b[] = "/tmp/ampprobe-gu-b-XXXXXX";
  close(mkstemp(a));
  close(mkstemp(b));
  probe_train_result h = run2("grad-underflow", NULL, NULL, NULL, NULL, a);
  probe_train_result s = run2("grad-underflow", "scaler.enabled", "1", NULL, NULL, b);
  probe_train_result f = run("grad-underflow", "precision", "fp32");
  ck_assert(!h.diverged && !s.diverged && !f.diverged);
  /* without loss scaling training stalls: final loss at least 3x FP32's */
  ck_assert_msg(h.final_loss > 3.0 * f.final_loss, "%g vs %g", h.final_loss,
                f.final_loss);
  assert_close(s.final_loss, f.final_loss, 0.02, "scaled fp16 vs fp32");
  /* why: enc.fc1's FP16 weight gradients are (almost) all zero unscaled */
  double zh = fc1_grad_zero_fraction(a), zs = fc1_grad_zero_fraction(b);
  printf("  grad-underflow: enc.fc1 weight_grad zero fraction %.3f unscaled, "
         "%.3f scaled\n", zh, zs);
  ck_assert(zh > 0.9);
  ck_assert(zs < 0.1);
  unlink(a);
  unlink(b);
}
END_TEST

START_TEST(test_clip_before_unscale) {
  probe_train_result h = run("clip-before-unscale", NULL, NULL);
  probe_train_result ok = run("clip-before-unscale", "clip.before_unscale", "0");
  probe_train_result f = run("clip-before-unscale", "precision", "fp32");
  /* Raw features of scale ~3000: the FP16 gradients exceed 65504 and the
   * loss scale falls below 1 in both orders. */
  ck_assert(ok.min_scale < 1.0);
  /* The correct order trains: the loss falls more than 100x, to within 1.5x
   * of FP32's. */
  ck_assert(!ok.diverged && !f.diverged);
  ck_assert_msg(ok.final_loss < ok.first_loss / 100, "%g from %g", ok.final_loss,
                ok.first_loss);
  ck_assert_msg(ok.final_loss < 1.5 * f.final_loss, "%g vs fp32 %g",
                ok.final_loss, f.final_loss);
  /* Misordered, the clipper sees the norm times a scale below 1 and lets
   * through updates 1/scale times the threshold: the weights grow, the
   * gradients overflow, the scale falls further, until the FP16 forward
   * overflows and the loss is non-finite; the scale then collapses. */
  ck_assert(h.diverged);
  ck_assert_int_ge(h.first_nonfinite_loss_step, 0);
  ck_assert(h.min_scale < 1e-3);
  /* in FP32 there is no loss scale, so the order does not matter */
  probe_train_result f2 = run2("clip-before-unscale", "precision", "fp32",
                               "clip.before_unscale", "0", NULL);
  ck_assert(f2.final_loss == f.final_loss);
}
END_TEST

START_TEST(test_lr_too_high) {
  probe_train_result h = run("lr-too-high", NULL, NULL);
  probe_train_result f = run("lr-too-high", "precision", "fp32");
  ck_assert(h.diverged);
  ck_assert(f.diverged); /* not a precision problem */
  ck_assert_int_ge(f.first_nonfinite_loss_step, 1);
  probe_train_result all = run("lr-too-high", "fp32", "linear,activation");
  ck_assert(all.diverged);
  probe_train_result low = run("lr-too-high", "lr", "0.01");
  ck_assert(!low.diverged);
}
END_TEST

START_TEST(test_nan_input) {
  probe_train_result h = run("nan-input", NULL, NULL);
  ck_assert(h.diverged);
  ck_assert_int_eq(h.first_nonfinite_loss_step, 50);
  ck_assert_int_eq(h.first_nonfinite_step, 50);
  ck_assert_str_eq(h.first_nonfinite_layer, "input");
  ck_assert_int_eq(h.first_nonfinite_site, PROBE_SITE_FWD_OUT);
  /* the FP16 scaler skips that step and training goes on */
  ck_assert_int_ge(h.skipped_steps, 1);
  ck_assert(isfinite(h.final_loss));
  /* without a scaler (FP32) the NaN reaches the weights for good */
  probe_train_result f = run("nan-input", "precision", "fp32");
  ck_assert(f.diverged);
  ck_assert(isnan(f.final_loss));
  ck_assert_str_eq(f.first_nonfinite_layer, "input");
  probe_train_result clean = run("nan-input", "data.nan_step", "-1");
  ck_assert(!clean.diverged);
}
END_TEST

START_TEST(test_zoo_speed) {
  /* every scenario (its default config) in well under a second of CPU time:
   * process CPU time, not wall time, so that a loaded machine (ctest -j16 on
   * two cores) does not fail it (issue #12.7); the run is single-threaded
   * (OpenBLAS set to one thread, no trace) */
  for (size_t i = 0; i < probe_scenario_count(); i++) {
    clock_t c0 = clock();
    run(probe_scenario_name(i), NULL, NULL);
    double cpu = (double)(clock() - c0) / CLOCKS_PER_SEC;
    ck_assert_msg(cpu < 1.0, "%s took %.3f s of CPU time",
                  probe_scenario_name(i), cpu);
  }
}
END_TEST

/* The first non-finite tensor comes from the trainer's own scan when there
 * is no trace, and from the probe session's statistics when there is one
 * (full trace or flight recorder): both must name the same tensor. */
static probe_train_result run_mode(const char *name, const char *trace,
                                   probe_record_mode mode) {
  char err[512];
  probe_train_config *c;
  ck_assert_msg(probe_config_load_scenario(&c, name, err, sizeof err) == PROBE_OK,
                "%s", err);
  probe_train_opts o;
  probe_train_opts_init(&o);
  o.trace_path = trace;
  o.mode = mode;
  probe_train_result r;
  ck_assert_msg(probe_train(c, &o, &r, err, sizeof err) == PROBE_OK, "%s", err);
  probe_config_free(c);
  return r;
}

START_TEST(test_first_nonfinite_scan_matches_probe) {
  char trace[64];
  snprintf(trace, sizeof trace, "/tmp/test_scn_nf_%ld.h5", (long)getpid());
  int seen = 0;
  for (size_t i = 0; i < probe_scenario_count(); i++) {
    const char *name = probe_scenario_name(i);
    probe_train_result scan = run_mode(name, NULL, PROBE_MODE_FULL);
    for (int m = 0; m < 2; m++) {
      probe_train_result r = run_mode(
          name, trace, m ? PROBE_MODE_FULL : PROBE_MODE_SCALARS);
      ck_assert_msg(r.first_nonfinite_step == scan.first_nonfinite_step,
                    "%s mode %d: step %lld vs scan %lld", name, m,
                    (long long)r.first_nonfinite_step,
                    (long long)scan.first_nonfinite_step);
      if (scan.first_nonfinite_step < 0) continue;
      ck_assert_str_eq(r.first_nonfinite_layer, scan.first_nonfinite_layer);
      ck_assert_int_eq(r.first_nonfinite_site, scan.first_nonfinite_site);
    }
    seen += scan.first_nonfinite_step >= 0;
  }
  ck_assert_int_ge(seen, 5); /* the comparison is not vacuous */
  unlink(trace);
}
END_TEST

static Suite *make_scenario_suite(void) {
  Suite *s = suite_create("scenarios");
  TCase *tc = tcase_create("zoo");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_healthy);
  tcase_add_test(tc, test_revin_overflow);
  tcase_add_test(tc, test_bn_overflow);
  tcase_add_test(tc, test_softmax_underflow);
  tcase_add_test(tc, test_two_culprits);
  tcase_add_test(tc, test_grad_underflow);
  tcase_add_test(tc, test_clip_before_unscale);
  tcase_add_test(tc, test_lr_too_high);
  tcase_add_test(tc, test_nan_input);
  tcase_add_test(tc, test_first_nonfinite_scan_matches_probe);
  suite_add_tcase(s, tc);
  /* Wall-clock checks: a case of their own, which CTest runs alone
   * (trainer_scenarios.timing, label timing, RUN_SERIAL). */
  TCase *tt = tcase_create("timing");
  tcase_set_tags(tt, "timing"); /* CK_EXCLUDE_TAGS, tests/trainer/CMakeLists.txt */
  tcase_set_timeout(tt, 120);
  tcase_add_test(tt, test_zoo_speed);
  suite_add_tcase(s, tt);
  return s;
}

int main(void) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  SRunner *sr = srunner_create(make_scenario_suite());
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? 0 : 1;
}
