/*
 * tests/tools/test_diagnose_bf16.c - Check suite for the post-mortem of
 * BF16 layers (libprobe/analysis/diagnose*.c; hunt /tmp/hunt_bf findings
 * F2, F3, F7, F8). BF16 has FP32's range (its largest value ~3.39e38 is
 * within 0.4% of FP32's), so an overflow made in BF16 - or in an FP32
 * layer fed by BF16 layers - overflows FP32 too and is not cured by
 * keeping layers in FP32; the text measures BF16 values against BF16's
 * limits, not FP16's 65504. FP16 controls keep their answers. Each test
 * writes a small trace through the libprobe writer API and reads it back
 * isolated.
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

/* DIAG_N values all v, then the first nan NaN and inf +inf */
static void put(probe_session *s, int32_t id, probe_site site, float v, int nan,
                int inf) {
  diag_put(s, id, site, v, 0, nan, inf, 0);
}
static void end(probe_session *s, double loss) {
  diag_end(s, loss, 1.0, 1e-3, 0, 0);
}

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

/* The post-mortem text holds needle. */
static int report_has(const probe_diag *d, const char *needle) {
  char *t = NULL;
  ck_assert_int_eq(probe_diag_render_text(d, &t), PROBE_OK);
  int has = strstr(t, needle) != NULL;
  probe_free(t);
  return has;
}

/* ---- an overflow in a Linear ------------------------------------------------ */

/* One Linear 'fc' (in `prec`, under `policy`) then an FP32 loss. Steps
 * 0..2 healthy (input 1, weights 0.5); at step 3 its input is x_mag and
 * its weights w_mag (all N values), and its output holds 2 +inf: ||W||_F
 * (||x||_F + 1) = 4 w_mag (4 x_mag + 1). */
static void linear_overflow_trace(const char *p, const char *policy,
                                  probe_dtype prec, float x_mag, float w_mag) {
  probe_session *s = open_s(p, policy);
  int32_t fc = layer(s, "fc", PROBE_KIND_LINEAR, prec);
  int32_t loss = layer(s, "loss", PROBE_KIND_LOSS, PROBE_DTYPE_F32);
  for (int step = 0; step < 4; step++) {
    int bad = step == 3;
    ck_assert_int_eq(probe_step_begin(s, step), PROBE_OK);
    put(s, fc, PROBE_SITE_FWD_IN, bad ? x_mag : 1.0f, 0, 0);
    put(s, fc, PROBE_SITE_WEIGHT, bad ? w_mag : 0.5f, 0, 0);
    put(s, fc, PROBE_SITE_FWD_OUT, bad ? 1e30f : 2.0f + step, 0, bad ? 2 : 0);
    put(s, loss, PROBE_SITE_FWD_IN, bad ? 1e30f : 2.0f + step, 0, bad ? 2 : 0);
    put(s, loss, PROBE_SITE_FWD_OUT, 1.0f, 0, bad ? 1 : 0);
    end(s, bad ? INFINITY : 1.0 - 0.1 * step);
  }
  ck_assert_int_eq(probe_session_close(s), PROBE_OK);
}

/* One BF16 layer 'op' of `kind` (no weight record) then an FP32 loss;
 * at step 3 its input is x_mag and its output holds 2 +inf. */
static void op_inf_trace(const char *p, probe_kind kind, float x_mag) {
  probe_session *s = open_s(p, "bf16");
  int32_t op = layer(s, "op", kind, PROBE_DTYPE_BF16);
  int32_t loss = layer(s, "loss", PROBE_KIND_LOSS, PROBE_DTYPE_F32);
  for (int step = 0; step < 4; step++) {
    int bad = step == 3;
    ck_assert_int_eq(probe_step_begin(s, step), PROBE_OK);
    put(s, op, PROBE_SITE_FWD_IN, bad ? x_mag : 1.0f, 0, 0);
    put(s, op, PROBE_SITE_FWD_OUT, 2.0f + step, 0, bad ? 2 : 0);
    put(s, loss, PROBE_SITE_FWD_IN, 2.0f + step, 0, bad ? 2 : 0);
    put(s, loss, PROBE_SITE_FWD_OUT, 1.0f, 0, bad ? 1 : 0);
    end(s, bad ? INFINITY : 1.0 - 0.1 * step);
  }
  ck_assert_int_eq(probe_session_close(s), PROBE_OK);
}

/* A BF16 custom op or normalisation that makes inf of in-range values
 * (input absmax 300: a variance E[x^2] - E[x]^2 that BF16's 8 bits
 * rounded to 0 under an rsqrt) is BF16's doing, which FP32 cures: not
 * "not a precision problem, FP32 overflows too" (hunt_new F1). With an
 * input whose square passes BF16's range, it is a range overflow again. */
START_TEST(test_bf16_op_inf_of_in_range_values_is_precision) {
  const char *p = tmp_path("bf16op");
  const struct { probe_kind kind; float x; int not_precision; } c[] = {
      {PROBE_KIND_OTHER, 300.0f, 0},
      {PROBE_KIND_LAYERNORM, 300.0f, 0},
      {PROBE_KIND_OTHER, 1e20f, 1},
  };
  for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
    op_inf_trace(p, c[i].kind, c[i].x);
    probe_diag d;
    diag_of(&d, p);
    ck_assert_str_eq(probe_diag_layer_name(&d, d.origin_layer), "op");
    int np = find(&d, PROBE_DIAG_FINDING_NOT_PRECISION) != NULL;
    ck_assert_msg(np == c[i].not_precision, "case %zu: %s: %s", i,
                  probe_diag_finding_name(d.findings[0].id), d.findings[0].title);
    if (!c[i].not_precision)
      ck_assert_msg(find(&d, PROBE_DIAG_FINDING_FORCE_FP32) != NULL, "case %zu: %s", i,
                    d.findings[0].title);
    probe_diag_free(&d);
    unlink(p);
  }
}
END_TEST

/* F2: a BF16 Linear whose inputs bound its output far past FP32's range
 * (1e20 x 1e19, as the hunt's bf16_overflow_step0.py; the FP32 run
 * overflows at the same step) is not-precision, with no bisect and no
 * "keep it in FP32" (was: "[force-fp32] BF16 overflow in 'fc' (linear):
 * keep it in FP32", next: bisect). */
START_TEST(test_bf16_overflow_past_fp32_is_not_precision) {
  const char *p = tmp_path("bf16ov");
  linear_overflow_trace(p, "bf16", PROBE_DTYPE_BF16, 1e20f, 1e19f);
  probe_diag d;
  diag_of(&d, p);
  ck_assert_int_eq(d.event, PROBE_DIAG_EVENT_OVERFLOW);
  ck_assert_str_eq(probe_diag_layer_name(&d, d.origin_layer), "fc");
  ck_assert_msg(d.n_findings > 0 && d.findings[0].id == PROBE_DIAG_FINDING_NOT_PRECISION,
                "%s: %s", probe_diag_finding_name(d.findings[0].id), d.findings[0].title);
  ck_assert_msg(strstr(d.findings[0].title, "BF16 has FP32's range"), "%s",
                d.findings[0].title);
  ck_assert_ptr_null(find(&d, PROBE_DIAG_FINDING_FORCE_FP32));
  ck_assert_msg(!any_text(&d, "bisect"), "a bisect is suggested");
  ck_assert_msg(!any_text(&d, "keep it in FP32"), "keep it in FP32");
  ck_assert_msg(strstr(d.findings[0].next_step, "learning rate"), "%s",
                d.findings[0].next_step);
  /* nor in the JSON's fp32_candidates */
  ck_assert_msg(!strstr(d.fp32_candidates, "linear"), "%s", d.fp32_candidates);
  probe_diag_free(&d);
  unlink(p);
}
END_TEST

/* F2, the edge: values past BF16's largest (3.3895e38) but within FP32's
 * (3.4028e38) are what FP32 holds. Its input holds 3.40e38 (inf once cast
 * to BF16), or the bound of its inputs is 3.3952e38 (16 x 1e19 x
 * 2.122e18): force-fp32 stays, and says how thin FP32's margin is. */
START_TEST(test_bf16_overflow_within_fp32_keeps_force_fp32) {
  const char *p = tmp_path("bf16edge");
  const struct { float x, w; } c[] = {{3.40e38f, 1e-3f}, {2.122e18f, 1e19f}};
  for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
    linear_overflow_trace(p, "bf16", PROBE_DTYPE_BF16, c[i].x, c[i].w);
    probe_diag d;
    diag_of(&d, p);
    ck_assert_str_eq(probe_diag_layer_name(&d, d.origin_layer), "fc");
    ck_assert_msg(d.findings[0].id == PROBE_DIAG_FINDING_FORCE_FP32, "case %zu: %s: %s",
                  i, probe_diag_finding_name(d.findings[0].id), d.findings[0].title);
    ck_assert_ptr_null(find(&d, PROBE_DIAG_FINDING_NOT_PRECISION));
    ck_assert_msg(any_text(&d, "within FP32's"), "case %zu: no edge evidence", i);
    ck_assert_msg(any_text(&d, "less than 0.4% to spare"), "case %zu", i);
    probe_diag_free(&d);
  }
  unlink(p);
}
END_TEST

/* FP16 control: the same Linear in FP16 overflowing 65504 (100 x 100)
 * keeps "keep it in FP32" and its bisect; its text keeps FP16's limits. */
START_TEST(test_fp16_overflow_unchanged) {
  const char *p = tmp_path("fp16ov");
  linear_overflow_trace(p, "fp16", PROBE_DTYPE_F16, 100.0f, 100.0f);
  probe_diag d;
  diag_of(&d, p);
  ck_assert_int_eq(d.event, PROBE_DIAG_EVENT_OVERFLOW);
  ck_assert_msg(d.findings[0].id == PROBE_DIAG_FINDING_FORCE_FP32, "%s",
                d.findings[0].title);
  ck_assert_msg(strstr(d.findings[0].title, "FP16 overflow in 'fc' (linear): keep it in FP32"),
                "%s", d.findings[0].title);
  ck_assert_msg(strstr(d.findings[0].next_step, "bisect"), "%s", d.findings[0].next_step);
  ck_assert_ptr_null(find(&d, PROBE_DIAG_FINDING_NOT_PRECISION));
  ck_assert(report_has(&d, "headroom log2(65504/absmax)"));
  ck_assert(report_has(&d, "would flush in FP16"));
  ck_assert(any_text(&d, "headroom log2(65504/absmax)"));
  probe_diag_free(&d);
  unlink(p);
}
END_TEST

/* F7: the BF16 layer's history is measured against BF16's maximum, not
 * 65504: at step 2 its output absmax 4 has log2(3.3895e38/4) = 126.0
 * binades of headroom (was 14.0, FP16's), and its input's FP16 flush count
 * is not printed. */
START_TEST(test_bf16_headroom_is_bf16s) {
  const char *p = tmp_path("bf16hr");
  linear_overflow_trace(p, "bf16", PROBE_DTYPE_BF16, 1e20f, 1e19f);
  probe_diag d;
  diag_of(&d, p);
  ck_assert_int_ge(d.n_history, 2);
  int seen = 0;
  for (int i = 0; i < d.n_history; i++)
    if (d.history[i].step == 2) {
      ck_assert_double_eq_tol(d.history[i].absmax, 4.0, 1e-9);
      ck_assert_double_eq_tol(d.history[i].headroom, log2(3.3895313892515355e38 / 4.0), 1e-9);
      seen = 1;
    }
  ck_assert(seen);
  ck_assert(!report_has(&d, "65504"));
  ck_assert(!report_has(&d, "would flush in FP16"));
  ck_assert(report_has(&d, "headroom log2(3.39e38 (BF16)/absmax)"));
  probe_diag_free(&d);
  unlink(p);
}
END_TEST

/* ---- F3: an FP32 loss fed by BF16 layers ------------------------------------ */

/* fc1 -> fc2 in `prec`, an FP32 loss; at step 3 fc2's output is finite
 * (out_mag) and the loss overflows FP32 (a square of 1e24). The loss
 * climbs only at the event (no lr signature). */
static void fp32_loss_trace(const char *p, const char *policy, probe_dtype prec,
                            float out_mag) {
  probe_session *s = open_s(p, policy);
  int32_t fc1 = layer(s, "enc.fc1", PROBE_KIND_LINEAR, prec);
  int32_t fc2 = layer(s, "head.fc", PROBE_KIND_LINEAR, prec);
  int32_t loss = layer(s, "loss", PROBE_KIND_LOSS, PROBE_DTYPE_F32);
  for (int step = 0; step < 4; step++) {
    int bad = step == 3;
    ck_assert_int_eq(probe_step_begin(s, step), PROBE_OK);
    put(s, fc1, PROBE_SITE_FWD_IN, 1.0f, 0, 0);
    put(s, fc1, PROBE_SITE_FWD_OUT, 1.0f, 0, 0);
    put(s, fc2, PROBE_SITE_FWD_IN, 1.0f, 0, 0);
    put(s, fc2, PROBE_SITE_FWD_OUT, bad ? out_mag : 1.0f, 0, 0);
    put(s, loss, PROBE_SITE_FWD_IN, bad ? out_mag : 1.0f, 0, 0);
    put(s, loss, PROBE_SITE_FWD_OUT, 1.0f, 0, bad ? 1 : 0);
    end(s, bad ? INFINITY : 1.0 - 0.1 * step);
  }
  ck_assert_int_eq(probe_session_close(s), PROBE_OK);
}

/* In a BF16 run the values an FP32 loss overflowed on were made in BF16,
 * which has FP32's range: not-precision (was: "[force-fp32] overflow in
 * 'loss' (loss), a layer that already runs in FP32: what it received was
 * produced in FP16 upstream", next: bisect). */
START_TEST(test_fp32_loss_after_bf16_is_not_precision) {
  const char *p = tmp_path("bf16loss");
  fp32_loss_trace(p, "bf16", PROBE_DTYPE_BF16, 1e24f);
  probe_diag d;
  diag_of(&d, p);
  ck_assert_int_eq(d.event, PROBE_DIAG_EVENT_OVERFLOW);
  ck_assert_str_eq(probe_diag_layer_name(&d, d.origin_layer), "loss");
  ck_assert_msg(d.findings[0].id == PROBE_DIAG_FINDING_NOT_PRECISION, "%s: %s",
                probe_diag_finding_name(d.findings[0].id), d.findings[0].title);
  ck_assert_msg(strstr(d.findings[0].title, "values made in BF16"), "%s",
                d.findings[0].title);
  ck_assert_ptr_null(find(&d, PROBE_DIAG_FINDING_FORCE_FP32));
  ck_assert(!any_text(&d, "FP16"));
  ck_assert(!any_text(&d, "bisect"));
  ck_assert(!report_has(&d, "65504"));
  ck_assert(!report_has(&d, "would flush in FP16"));
  probe_diag_free(&d);
  unlink(p);
}
END_TEST

/* FP16 control: an FP32 loss that overflowed on FP16 upstream values
 * (60000, finite in FP16) keeps its force-fp32 reading and wording. */
START_TEST(test_fp32_loss_after_fp16_unchanged) {
  const char *p = tmp_path("fp16loss");
  fp32_loss_trace(p, "fp16", PROBE_DTYPE_F16, 60000.0f);
  probe_diag d;
  diag_of(&d, p);
  ck_assert_str_eq(probe_diag_layer_name(&d, d.origin_layer), "loss");
  ck_assert_msg(d.findings[0].id == PROBE_DIAG_FINDING_FORCE_FP32, "%s",
                d.findings[0].title);
  ck_assert_msg(strstr(d.findings[0].title, "produced in FP16 upstream"), "%s",
                d.findings[0].title);
  probe_diag_free(&d);
  unlink(p);
}
END_TEST

/* ---- F8: a NaN-only event of a BF16 Linear ---------------------------------- */

/* One layer 'b' of kind `kind` in `prec`, an FP32 loss; at step 3 its
 * output holds 4 NaN and no inf from a finite input of absmax in_mag (no
 * weight record), as the hunt's mixed_synth.py (3e5 in BF16). */
static void nan_only_trace(const char *p, const char *policy, probe_kind kind,
                           probe_dtype prec, float in_mag) {
  probe_session *s = open_s(p, policy);
  int32_t b = layer(s, "b", kind, prec);
  int32_t loss = layer(s, "loss", PROBE_KIND_LOSS, PROBE_DTYPE_F32);
  for (int step = 0; step < 4; step++) {
    int bad = step == 3;
    ck_assert_int_eq(probe_step_begin(s, step), PROBE_OK);
    put(s, b, PROBE_SITE_FWD_IN, bad ? in_mag : 1.0f, 0, 0);
    if (kind == PROBE_KIND_LAYERNORM) put(s, b, PROBE_SITE_FWD_SAVED, 1.0f, bad ? 4 : 0, 0);
    put(s, b, PROBE_SITE_FWD_OUT, 1.0f, bad ? 4 : 0, 0);
    put(s, loss, PROBE_SITE_FWD_IN, 1.0f, bad ? 4 : 0, 0);
    put(s, loss, PROBE_SITE_FWD_OUT, 1.0f, bad ? 1 : 0, 0);
    end(s, bad ? NAN : 1.0 - 0.1 * step);
  }
  ck_assert_int_eq(probe_session_close(s), PROBE_OK);
}

/* A BF16 Linear makes NaN of finite values only through an inf, past
 * ~3.39e38 (FP32's range too): weak evidence for BF16 (was full-confidence
 * "keep it in FP32"). Controls: the FP16 Linear (an overflow past 65504
 * is FP16's) and the BF16 LayerNorm (a variance can round negative at
 * BF16's 8 bits) stay full force-fp32. */
START_TEST(test_bf16_linear_nan_only_is_weak) {
  const char *p = tmp_path("bf16nan");
  const struct {
    const char *policy;
    probe_kind kind;
    probe_dtype prec;
    float in_mag;
    int weak;
  } c[] = {
      {"bf16", PROBE_KIND_LINEAR, PROBE_DTYPE_BF16, 3e5f, 1},
      {"bf16", PROBE_KIND_ACTIVATION, PROBE_DTYPE_BF16, 3e5f, 1},
      {"fp16", PROBE_KIND_LINEAR, PROBE_DTYPE_F16, 300.0f, 0},
      {"bf16", PROBE_KIND_LAYERNORM, PROBE_DTYPE_BF16, 3e5f, 0},
  };
  for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
    nan_only_trace(p, c[i].policy, c[i].kind, c[i].prec, c[i].in_mag);
    probe_diag d;
    diag_of(&d, p);
    ck_assert_msg(d.event == PROBE_DIAG_EVENT_INF_ARITH_NAN, "case %zu: %s", i,
                  probe_diag_event_name(d.event));
    ck_assert_str_eq(probe_diag_layer_name(&d, d.origin_layer), "b");
    const probe_diag_finding *f = find(&d, PROBE_DIAG_FINDING_FORCE_FP32);
    ck_assert_msg(f != NULL, "case %zu: %s", i, d.findings[0].title);
    ck_assert_msg(f->weak_evidence == c[i].weak, "case %zu: %s", i, f->title);
    ck_assert_msg(d.origin_precision_weak == c[i].weak, "case %zu", i);
    if (c[i].weak) {
      ck_assert_msg(strstr(f->title, "evidence is weak"), "case %zu: %s", i, f->title);
      ck_assert_msg(any_text(&d, "weak evidence for BF16"), "case %zu", i);
      ck_assert_msg(!any_text(&d, "custom module"), "case %zu", i);
      ck_assert_msg(strstr(f->next_step, "in FP32 too"), "case %zu: %s", i, f->next_step);
    } else {
      ck_assert_msg(strstr(f->title, "keep it in FP32"), "case %zu: %s", i, f->title);
    }
    probe_diag_free(&d);
  }
  unlink(p);
}
END_TEST

/* ---- no FP16 in a BF16 run's findings --------------------------------------- */

/* A BF16 run: 'pre' (BF16 linear) feeds 'blk.x' (kind `kind` in `prec`);
 * at step 3 blk.x makes 2 NaN (no inf) from a finite input that holds
 * `zeros` exact zeros (values 1 otherwise). */
static void bf16_nan_trace(const char *p, probe_kind kind, probe_dtype prec, int zeros) {
  probe_session *s = open_s(p, "bf16");
  int32_t pre = layer(s, "pre", PROBE_KIND_LINEAR, PROBE_DTYPE_BF16);
  int32_t x = layer(s, "blk.x", kind, prec);
  int32_t loss = layer(s, "loss", PROBE_KIND_LOSS, PROBE_DTYPE_F32);
  static float in[N];
  for (int step = 0; step < 4; step++) {
    int bad = step == 3;
    ck_assert_int_eq(probe_step_begin(s, step), PROBE_OK);
    for (int i = 0; i < N; i++) in[i] = i < zeros ? 0.0f : 1.0f;
    put(s, pre, PROBE_SITE_FWD_IN, 1.0f, 0, 0);
    put(s, pre, PROBE_SITE_FWD_OUT, 1.0f, 0, 0);
    ck_assert_int_eq(probe_tensor_record(s, x, PROBE_SITE_FWD_IN, PROBE_DTYPE_F32, in, N),
                     PROBE_OK);
    put(s, x, PROBE_SITE_FWD_OUT, 1.0f, bad ? 2 : 0, 0);
    put(s, loss, PROBE_SITE_FWD_IN, 1.0f, bad ? 2 : 0, 0);
    put(s, loss, PROBE_SITE_FWD_OUT, 1.0f, bad ? 1 : 0, 0);
    end(s, bad ? NAN : 1.0 - 0.1 * step);
  }
  ck_assert_int_eq(probe_session_close(s), PROBE_OK);
}

/* The not-precision findings of a BF16 run do not measure it against FP16:
 * an FP32 module's NaN from a finite input (was "nothing beyond FP16's
 * range") and a BF16 Linear's NaN of its input's exact zeros (was "no
 * value near FP16's smallest"). */
START_TEST(test_bf16_not_precision_text_says_bf16) {
  const char *p = tmp_path("bf16np");
  const struct { probe_kind kind; probe_dtype prec; int zeros; const char *says; } c[] = {
      {PROBE_KIND_OTHER, PROBE_DTYPE_F32, 0, "nothing beyond BF16's range"},
      {PROBE_KIND_LINEAR, PROBE_DTYPE_BF16, 4, "BF16 flushes only below"},
  };
  for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
    bf16_nan_trace(p, c[i].kind, c[i].prec, c[i].zeros);
    probe_diag d;
    diag_of(&d, p);
    ck_assert_str_eq(probe_diag_layer_name(&d, d.origin_layer), "blk.x");
    ck_assert_msg(d.findings[0].id == PROBE_DIAG_FINDING_NOT_PRECISION, "case %zu: %s", i,
                  d.findings[0].title);
    ck_assert_msg(any_text(&d, c[i].says), "case %zu: %s", i, d.event_evidence);
    ck_assert_msg(!any_text(&d, "FP16"), "case %zu: FP16 in a BF16 run's findings", i);
    probe_diag_free(&d);
  }
  unlink(p);
}
END_TEST

static Suite *make_suite(void) {
  Suite *s = suite_create("diagnose_bf16");
  TCase *tc = tcase_create("bf16");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_bf16_overflow_past_fp32_is_not_precision);
  tcase_add_test(tc, test_bf16_op_inf_of_in_range_values_is_precision);
  tcase_add_test(tc, test_bf16_overflow_within_fp32_keeps_force_fp32);
  tcase_add_test(tc, test_fp16_overflow_unchanged);
  tcase_add_test(tc, test_bf16_headroom_is_bf16s);
  tcase_add_test(tc, test_fp32_loss_after_bf16_is_not_precision);
  tcase_add_test(tc, test_fp32_loss_after_fp16_unchanged);
  tcase_add_test(tc, test_bf16_linear_nan_only_is_weak);
  tcase_add_test(tc, test_bf16_not_precision_text_says_bf16);
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
