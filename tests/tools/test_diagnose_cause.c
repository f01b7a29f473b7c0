/*
 * tests/tools/test_diagnose_cause.c - Check suite for where the post-mortem
 * places the cause of a first non-finite value (libprobe/analysis/
 * diagnose*.c): a value first seen after the optimizer update (born in the
 * update, or in the gradient it applied), a gradient that overflowed at an
 * FP16 layer's entry from a record, raw input data beyond FP16's range,
 * weights edited between steps and a learning-rate spike (the lr
 * signature), and steps where one optimizer of two skipped (hunt
 * /tmp/hunt_diag2 findings 1, 3, 7, 8, 9). Each test writes a small trace
 * through the libprobe writer API and reads it back isolated.
 */
#define _POSIX_C_SOURCE 200809L
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "diag_testutil.h"

#define N DIAG_N

static const char *tmp_path(const char *tag) { return diag_tmp_path(tag); }
#define open_s(...) diag_open(__VA_ARGS__)
#define layer(...) diag_layer(__VA_ARGS__)

/* DIAG_N values v * (0.5 + i/N), then the first nan NaN, inf +inf, zeros 0 */
static void put(probe_session *s, int32_t id, probe_site site, float v, int nan,
                int inf, int zeros) {
  diag_put(s, id, site, v, 1, nan, inf, zeros);
}
#define end(...) diag_end(__VA_ARGS__)

static const probe_diag_finding *find(const probe_diag *d, probe_diag_finding_id id) {
  for (int i = 0; i < d->n_findings; i++)
    if (d->findings[i].id == id) return &d->findings[i];
  return NULL;
}

static int any_text(const probe_diag *d, const char *needle) {
  for (int i = 0; i < d->n_findings; i++) {
    const probe_diag_finding *f = &d->findings[i];
    if (strstr(f->title, needle) || strstr(f->next_step, needle)) return 1;
    for (int k = 0; k < f->n_evidence; k++)
      if (strstr(f->evidence[k], needle)) return 1;
  }
  return 0;
}

/* ---- 1: born in the optimizer step ----------------------------------------- */

/* A two-layer model, fc1 -> fc2, one step per iteration; at step `bad` the
 * update writes NaN into fc1's masters while the step's weights and
 * gradients are finite (Adam's eps = 0 on a zero gradient), or, with
 * grad_nan, the gradient arrives NaN at fc2's grad_out (a loss Function's
 * backward) and the update carries it into both layers' masters. with_grad:
 * the weight gradients are recorded. */
static void update_trace(const char *p, const char *policy, int bad,
                         int grad_nan, int with_grad) {
  probe_dtype prec = strcmp(policy, "fp32") ? PROBE_DTYPE_F16 : PROBE_DTYPE_F32;
  probe_session *s = open_s(p, policy);
  int32_t fc1 = layer(s, "fc1", PROBE_KIND_LINEAR, prec);
  int32_t fc2 = layer(s, "fc2", PROBE_KIND_LINEAR, prec);
  for (int step = 0; step <= bad + 2; step++) {
    int after = step > bad; /* the forward runs on NaN weights */
    int now = step == bad;
    ck_assert_int_eq(probe_step_begin(s, step), PROBE_OK);
    put(s, fc1, PROBE_SITE_FWD_IN, 1.0f, 0, 0, 0);
    put(s, fc1, PROBE_SITE_WEIGHT, 0.5f, after ? 3 : 0, 0, 0);
    put(s, fc1, PROBE_SITE_FWD_OUT, 1.0f, after ? 3 : 0, 0, 0);
    put(s, fc2, PROBE_SITE_FWD_IN, 1.0f, after ? 3 : 0, 0, 0);
    put(s, fc2, PROBE_SITE_WEIGHT, 0.5f, 0, 0, 0);
    put(s, fc2, PROBE_SITE_FWD_OUT, 1.0f, after ? 3 : 0, 0, 0);
    int gn = (now && grad_nan) || after ? 4 : 0;
    put(s, fc2, PROBE_SITE_GRAD_OUT, 0.1f, gn, 0, 0);
    if (with_grad) put(s, fc2, PROBE_SITE_WEIGHT_GRAD, 0.1f, gn, 0, 0);
    put(s, fc2, PROBE_SITE_GRAD_IN, 0.1f, gn, 0, 0);
    put(s, fc1, PROBE_SITE_GRAD_OUT, 0.1f, gn, 0, 0);
    if (with_grad) put(s, fc1, PROBE_SITE_WEIGHT_GRAD, 0.1f, gn, 0, 4);
    put(s, fc1, PROBE_SITE_MASTER_WEIGHT, 0.5f, now || after ? 3 : 0, 0, 0);
    put(s, fc2, PROBE_SITE_MASTER_WEIGHT, 0.5f, (now && grad_nan) || after ? 3 : 0,
        0, 0);
    end(s, after ? NAN : 1.0 - 0.01 * step, 1.0, 1e-3, 0, 0);
  }
  ck_assert_int_eq(probe_session_close(s), PROBE_OK);
}

/* d02 (Adam eps = 0): the first non-finite record is a master weight,
 * recorded after the update, with the step's weights and gradients finite:
 * the optimizer step made it, at step 0 as at a later step, FP32 or FP16;
 * never "from the initialisation or the checkpoint". */
START_TEST(test_master_nonfinite_is_born_in_the_update) {
  const char *pol[] = {"fp32", "fp16"};
  for (int k = 0; k < 2; k++)
    for (int bad = 0; bad <= 3; bad += 3)
      for (int wg = 0; wg < 2; wg++) {
        const char *p = tmp_path("upd");
        update_trace(p, pol[k], bad, 0, wg);
        probe_diag d;
        diag_of(&d, p);
        ck_assert_int_eq(d.event, PROBE_DIAG_EVENT_WEIGHT_NONFINITE);
        ck_assert_int_eq(d.event_step, bad);
        ck_assert_int_eq(d.origin_site, PROBE_SITE_MASTER_WEIGHT);
        const probe_diag_finding *f = find(&d, PROBE_DIAG_FINDING_CHECK_WEIGHTS);
        ck_assert_ptr_nonnull(f);
        ck_assert_msg(strstr(f->title, "optimizer step") && strstr(f->title, "'fc1'"),
                      "%s bad %d wg %d: %s", pol[k], bad, wg, f->title);
        ck_assert_msg(!strstr(f->title, "before any update"), "%s", f->title);
        ck_assert_msg(!any_text(&d, "checkpoint or initialisation") &&
                          !any_text(&d, "came non-finite from the initialisation"),
                      "%s bad %d: a checkpoint named", pol[k], bad);
        ck_assert_msg(strstr(f->next_step, "eps of 0"), "%s", f->next_step);
        /* the gradient's magnitude and zeros when recorded; else it says
         * the gradient was not recorded */
        ck_assert_msg(wg ? (strstr(f->title, "finite weights and gradients") != NULL)
                         : (strstr(f->next_step, "not recorded") != NULL),
                      "wg %d: %s / %s", wg, f->title, f->next_step);
        ck_assert_int_eq(d.verdict, PROBE_VERDICT_DIVERGED);
        probe_diag_free(&d);
        unlink(p);
      }
}
END_TEST

/* A weight non-finite as the first step's forward used it is still "before
 * any update" (the checkpoint): the control of the test above. */
START_TEST(test_weight_used_at_first_step_is_still_loaded) {
  const char *p = tmp_path("loaded");
  probe_session *s = open_s(p, "fp32");
  int32_t fc = layer(s, "fc", PROBE_KIND_LINEAR, PROBE_DTYPE_F32);
  for (int step = 0; step < 3; step++) {
    ck_assert_int_eq(probe_step_begin(s, step), PROBE_OK);
    put(s, fc, PROBE_SITE_FWD_IN, 1.0f, 0, 0, 0);
    put(s, fc, PROBE_SITE_WEIGHT, 0.5f, 2, 0, 0);
    put(s, fc, PROBE_SITE_FWD_OUT, 1.0f, 2, 0, 0);
    put(s, fc, PROBE_SITE_MASTER_WEIGHT, 0.5f, 2, 0, 0);
    end(s, NAN, 1.0, 1e-3, 0, 0);
  }
  ck_assert_int_eq(probe_session_close(s), PROBE_OK);
  probe_diag d;
  diag_of(&d, p);
  ck_assert_int_eq(d.origin_site, PROBE_SITE_WEIGHT);
  ck_assert_msg(strstr(d.findings[0].title, "before any update"), "%s",
                d.findings[0].title);
  probe_diag_free(&d);
  unlink(p);
}
END_TEST

/* d13 (a loss Function whose backward is NaN): the step's first non-finite
 * record is fc2's grad_out in the backward; the update then carries it into
 * the masters. The origin is that gradient, not the master weights, at
 * step 0 or later, with or without weight gradients recorded. FP32: not a
 * precision problem, "received ... from code no record covers", and the
 * update named; FP16 without a scaler: clean-input at the grad_out. */
START_TEST(test_gradient_before_the_masters_is_the_origin) {
  const char *pol[] = {"fp32", "fp16"};
  for (int k = 0; k < 2; k++)
    for (int bad = 0; bad <= 2; bad += 2)
      for (int wg = 0; wg < 2; wg++) {
        const char *p = tmp_path("gradfirst");
        update_trace(p, pol[k], bad, 1, wg);
        probe_diag d;
        diag_of(&d, p);
        ck_assert_msg(d.event != PROBE_DIAG_EVENT_WEIGHT_NONFINITE,
                      "%s bad %d: %s", pol[k], bad, probe_diag_event_name(d.event));
        ck_assert_int_eq(d.event_step, bad);
        ck_assert_int_eq(d.event_phase, PROBE_PHASE_BACKWARD);
        ck_assert_int_eq(d.origin_site, PROBE_SITE_GRAD_OUT);
        ck_assert_str_eq(probe_diag_layer_name(&d, d.origin_layer), "fc2");
        ck_assert_msg(strstr(d.event_evidence, "optimizer update applied it"), "%s",
                      d.event_evidence);
        const probe_diag_finding *f = &d.findings[0];
        ck_assert_msg(strstr(f->title, "received inf/NaN at its grad_out from code "
                                       "no record covers"),
                      "%s: %s", pol[k], f->title);
        ck_assert_int_eq(f->id, k ? PROBE_DIAG_FINDING_CLEAN_INPUT
                                  : PROBE_DIAG_FINDING_NOT_PRECISION);
        ck_assert_msg(!any_text(&d, "checkpoint"), "%s", f->title);
        ck_assert_ptr_null(find(&d, PROBE_DIAG_FINDING_FORCE_FP32));
        probe_diag_free(&d);
        unlink(p);
      }
}
END_TEST

/* ---- 7: an overflow at an FP16 layer's entry from a recorded gradient ------ */

/* The FP32 loss hands fc (FP16) a gradient whose scaled values exceed
 * 65504: fc's grad_out is inf. handed: the loss's grad_in records those
 * finite values (d09); else it is finite and small (no record made it). */
static void handover_trace(const char *p, int handed) {
  probe_session *s = open_s(p, "fp16");
  int32_t fc = layer(s, "fc", PROBE_KIND_LINEAR, PROBE_DTYPE_F16);
  int32_t loss = layer(s, "loss", PROBE_KIND_LOSS, PROBE_DTYPE_F32);
  for (int step = 0; step < 12; step++) {
    int bad = step >= 4;
    ck_assert_int_eq(probe_step_begin(s, step), PROBE_OK);
    put(s, fc, PROBE_SITE_FWD_IN, 1.0f, 0, 0, 0);
    put(s, fc, PROBE_SITE_WEIGHT, 0.5f, 0, 0, 0);
    put(s, fc, PROBE_SITE_FWD_OUT, 1.0f, 0, 0, 0);
    put(s, loss, PROBE_SITE_FWD_IN, 1.0f, 0, 0, 0);
    put(s, loss, PROBE_SITE_FWD_OUT, 1.0f, 0, 0, 0);
    put(s, loss, PROBE_SITE_GRAD_OUT, 1.0f, 0, 0, 0);
    put(s, loss, PROBE_SITE_GRAD_IN, bad && handed ? 1.0e6f : 1.0f, 0, 0, 0);
    put(s, fc, PROBE_SITE_GRAD_OUT, 1.0f, 0, bad ? 5 : 0, 0);
    put(s, fc, PROBE_SITE_WEIGHT_GRAD, 1.0f, 0, bad ? 5 : 0, 0);
    put(s, fc, PROBE_SITE_MASTER_WEIGHT, 0.5f, 0, 0, 0);
    double scale = 65536.0 / (double)(1 << (step > 4 ? step - 4 : 0));
    end(s, 1.0, scale, 1e-3, bad, bad);
    if (bad) {
      probe_scaler_event e = {.step = step, .kind = PROBE_SCALER_BACKOFF,
                              .old_scale = scale, .new_scale = scale / 2};
      ck_assert_int_eq(probe_scaler_transition(s, &e), PROBE_OK);
    }
  }
  ck_assert_int_eq(probe_session_close(s), PROBE_OK);
}

START_TEST(test_handover_overflow_is_not_uncovered_code) {
  const char *p = tmp_path("handover");
  for (int handed = 1; handed >= 0; handed--) {
    handover_trace(p, handed);
    probe_diag d;
    diag_of(&d, p);
    ck_assert_int_eq(d.event, PROBE_DIAG_EVENT_GRAD_OVERFLOW);
    ck_assert_int_eq(d.origin_site, PROBE_SITE_GRAD_OUT);
    int uncovered = any_text(&d, "code no record covers");
    if (handed) {
      ck_assert_msg(strstr(d.event_evidence, "'loss' (FP32) handed 'fc'") &&
                        strstr(d.event_evidence, "16 values >= 65520"),
                    "%s", d.event_evidence);
      ck_assert_msg(!uncovered, "%s", d.findings[0].title);
      ck_assert_ptr_null(find(&d, PROBE_DIAG_FINDING_CLEAN_INPUT));
    } else { /* control: no record made it */
      ck_assert_msg(uncovered, "%s", d.findings[0].title);
      ck_assert_msg(!strstr(d.event_evidence, "hand-over"), "%s", d.event_evidence);
    }
    probe_diag_free(&d);
  }
  unlink(p);
}
END_TEST

/* ---- 8: raw input data beyond FP16's range ---------------------------------- */

START_TEST(test_raw_input_beyond_fp16_is_the_data) {
  const char *p = tmp_path("rawin");
  for (int via_input = 1; via_input >= 0; via_input--) {
    probe_session *s = open_s(p, "fp16");
    int32_t in = layer(s, "input", PROBE_KIND_INPUT, PROBE_DTYPE_F32);
    int32_t pre = layer(s, "pre", PROBE_KIND_OTHER, PROBE_DTYPE_F32);
    int32_t fc = layer(s, "fc", PROBE_KIND_LINEAR, PROBE_DTYPE_F16);
    for (int step = 0; step < 3; step++) {
      ck_assert_int_eq(probe_step_begin(s, step), PROBE_OK);
      /* via_input: the data holds 1e5; else the data is small and an
       * FP32 module between made the large values */
      put(s, in, PROBE_SITE_FWD_OUT, via_input ? 1.0e5f : 1.0f, 0, 0, 0);
      if (!via_input) {
        put(s, pre, PROBE_SITE_FWD_IN, 1.0f, 0, 0, 0);
        put(s, pre, PROBE_SITE_FWD_OUT, 1.0e5f, 0, 0, 0);
      }
      put(s, fc, PROBE_SITE_FWD_IN, 1.0e5f, 0, 0, 0);
      put(s, fc, PROBE_SITE_WEIGHT, 0.5f, 0, 0, 0);
      put(s, fc, PROBE_SITE_FWD_OUT, 1.0f, 0, 4, 0);
      end(s, INFINITY, 1.0, 1e-3, 0, 0);
    }
    ck_assert_int_eq(probe_session_close(s), PROBE_OK);
    probe_diag d;
    diag_of(&d, p);
    ck_assert_int_eq(d.event, PROBE_DIAG_EVENT_OVERFLOW);
    ck_assert_str_eq(probe_diag_layer_name(&d, d.origin_layer), "fc");
    int data = strstr(d.event_evidence, "input data holds values beyond") != NULL;
    ck_assert_msg(data == via_input, "%d: %s", via_input, d.event_evidence);
    if (via_input) {
      ck_assert_msg(!strstr(d.event_evidence, "between modules"), "%s", d.event_evidence);
      ck_assert_msg(strstr(d.findings[0].next_step, "normalise or scale the input data"),
                    "%s", d.findings[0].next_step);
    }
    probe_diag_free(&d);
  }
  unlink(p);
}
END_TEST

/* ---- 9 and 7: what the lr signature reads ------------------------------------ */

/* FP32, fc -> loss; the loss climbs and the run diverges at step 8.
 * edit: fc's weights are multiplied by 300 between steps 5 and 6 (the
 * masters after step 5 are 0.5, the forward of step 6 uses 150), then the
 * updates barely move them; else the updates grow them geometrically. */
static void lr_trace(const char *p, int edit, int spike) {
  probe_session *s = open_s(p, "fp32");
  int32_t fc = layer(s, "fc", PROBE_KIND_LINEAR, PROBE_DTYPE_F32);
  float wv = 0.5f;
  for (int step = 0; step <= 8; step++) {
    ck_assert_int_eq(probe_step_begin(s, step), PROBE_OK);
    if (edit && step == 6) wv *= 300.0f;
    put(s, fc, PROBE_SITE_FWD_IN, 1.0f, 0, 0, 0);
    put(s, fc, PROBE_SITE_WEIGHT, wv, 0, 0, 0);
    put(s, fc, PROBE_SITE_FWD_OUT, 1.0f, 0, step == 8 ? 3 : 0, 0);
    if (!edit) wv *= 2.0f; /* the update */
    put(s, fc, PROBE_SITE_MASTER_WEIGHT, wv, 0, 0, 0);
    double lr = spike && step == 4 ? 20.0 : 0.02;
    end(s, step == 8 ? INFINITY : (step >= 6 ? 1.0 * step * step : 1.0), 1.0, lr, 0, 0);
  }
  ck_assert_int_eq(probe_session_close(s), PROBE_OK);
}

START_TEST(test_lr_signature_not_from_an_edit) {
  const char *p = tmp_path("lredit");
  lr_trace(p, 1, 0);
  probe_diag d;
  diag_of(&d, p);
  ck_assert_int_eq(d.weights_edit_step, 6);
  ck_assert_msg(d.weights_edit_jump > 200 && d.weights_edit_jump < 400, "%g",
                d.weights_edit_jump);
  ck_assert_ptr_null(find(&d, PROBE_DIAG_FINDING_LOWER_LR));
  probe_diag_free(&d);
  /* control: the updates grew the weights 2x a step: the lr signature */
  lr_trace(p, 0, 0);
  diag_of(&d, p);
  ck_assert_int_eq(d.weights_edit_step, -1);
  const probe_diag_finding *f = find(&d, PROBE_DIAG_FINDING_LOWER_LR);
  ck_assert_ptr_nonnull(f);
  ck_assert_msg(strstr(f->next_step, "lower the learning rate"), "%s", f->next_step);
  probe_diag_free(&d);
  unlink(p);
}
END_TEST

START_TEST(test_lr_spike_is_named) {
  const char *p = tmp_path("lrspike");
  lr_trace(p, 0, 1);
  probe_diag d;
  diag_of(&d, p);
  ck_assert_int_eq(d.lr_spike_step, 4);
  ck_assert_int_eq(d.lr_spike_steps, 1);
  const probe_diag_finding *f = find(&d, PROBE_DIAG_FINDING_LOWER_LR);
  ck_assert_ptr_nonnull(f);
  ck_assert_msg(any_text(&d, "spiked at step 4: 20, 1e+03x the 0.02"), "%s",
                f->evidence[0]);
  ck_assert_msg(strstr(f->next_step, "schedule at step 4"), "%s", f->next_step);
  probe_diag_free(&d);
  /* a warm-up that rises and stays is no spike */
  probe_session *s = open_s(p, "fp32");
  int32_t fc = layer(s, "fc", PROBE_KIND_LINEAR, PROBE_DTYPE_F32);
  for (int step = 0; step < 6; step++) {
    ck_assert_int_eq(probe_step_begin(s, step), PROBE_OK);
    put(s, fc, PROBE_SITE_FWD_OUT, 1.0f, 0, 0, 0);
    end(s, 1.0, 1.0, step == 0 ? 1e-5 : 1e-3, 0, 0);
  }
  ck_assert_int_eq(probe_session_close(s), PROBE_OK);
  diag_of(&d, p);
  ck_assert_int_eq(d.lr_spike_step, -1);
  probe_diag_free(&d);
  unlink(p);
}
END_TEST

/* ---- 3: one optimizer of two skipped ---------------------------------------- */

/* Every step found non-finite gradients and backed off, but another
 * optimizer stepped (found_inf 1, skipped 0): the collapse is said with
 * both counts, never "no optimizer step was taken". */
START_TEST(test_partial_skips_are_not_never_stepped) {
  const char *p = tmp_path("partial");
  for (int all = 0; all < 2; all++) {
    probe_session *s = open_s(p, "fp16");
    int32_t fc = layer(s, "fc", PROBE_KIND_LINEAR, PROBE_DTYPE_F16);
    double scale = 65536.0;
    for (int step = 0; step < 30; step++) {
      ck_assert_int_eq(probe_step_begin(s, step), PROBE_OK);
      put(s, fc, PROBE_SITE_FWD_OUT, 1.0f, 0, 0, 0);
      put(s, fc, PROBE_SITE_WEIGHT_GRAD, 1.0f, 2, 0, 0);
      put(s, fc, PROBE_SITE_MASTER_WEIGHT, 0.5f - 0.01f * (float)step, 0, 0, 0);
      end(s, 1.0 - 0.02 * step, scale, 1e-3, 1, all);
      probe_scaler_event e = {.step = step, .kind = PROBE_SCALER_BACKOFF,
                              .old_scale = scale, .new_scale = scale / 2};
      ck_assert_int_eq(probe_scaler_transition(s, &e), PROBE_OK);
      scale /= 2;
    }
    ck_assert_int_eq(probe_session_close(s), PROBE_OK);
    probe_diag d;
    diag_of(&d, p);
    const probe_diag_finding *f = find(&d, PROBE_DIAG_FINDING_SCALE_COLLAPSE);
    ck_assert_ptr_nonnull(f);
    ck_assert_int_eq(d.never_stepped, all);
    if (all)
      ck_assert_msg(strstr(f->title, "no optimizer step was taken"), "%s", f->title);
    else
      ck_assert_msg(!strstr(f->title, "no optimizer step") &&
                        strstr(f->title, "30 steps with non-finite gradients, of "
                                         "which 0 skipped"),
                    "%s", f->title);
    probe_diag_free(&d);
  }
  unlink(p);
}
END_TEST

static Suite *make_suite(void) {
  Suite *s = suite_create("diagnose_cause");
  TCase *tc = tcase_create("cause");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_master_nonfinite_is_born_in_the_update);
  tcase_add_test(tc, test_weight_used_at_first_step_is_still_loaded);
  tcase_add_test(tc, test_gradient_before_the_masters_is_the_origin);
  tcase_add_test(tc, test_handover_overflow_is_not_uncovered_code);
  tcase_add_test(tc, test_raw_input_beyond_fp16_is_the_data);
  tcase_add_test(tc, test_lr_signature_not_from_an_edit);
  tcase_add_test(tc, test_lr_spike_is_named);
  tcase_add_test(tc, test_partial_skips_are_not_never_stepped);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  SRunner *sr = srunner_create(make_suite());
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
