/*
 * tests/tools/test_diagnose_stag.c - Check suite for weights-stagnant
 * (libprobe/analysis/diagnose_trend.c, docs/precision.md "Weights that
 * stop changing"): weights the optimizer steps no longer move because
 * lr * |grad| is below half the spacing of the format they are stored in.
 * A hunt (2026-12-05, F1) found a pure-BF16 job (model.to(bfloat16), no
 * FP32 masters) whose 382 of 577 weights never changed in 150 steps called
 * healthy.
 *
 * Each case writes a trace of a 3-layer model (enc.fc1 -> head.fc2 ->
 * loss) through the libprobe writer: per step the forward, the weight
 * gradients and the master_weight records (the weights as the optimizer
 * step left them, in the format they are stored in), then reads it back
 * isolated. The table holds the cases that must fire (BF16 weights that
 * stay bit-identical under SGD's tiny updates; FP32 weights below FP32's
 * own spacing) and the ones that must not (FP32 masters that move, frozen
 * layers, lr 0, a skip streak, zero gradients, short runs, sparse records,
 * a flight recorder, weights no optimizer holds).
 */
#define _POSIX_C_SOURCE 200809L
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ampprobe/analysis.h"
#include "ampprobe/probe.h"
#include "probe_testutil.h"
#include "diag_testutil.h"

#define N 64 /* elements of each weight (and of its gradient) */

static char path_buf[256];
static const char *tmp_path(const char *tag) {
  pt_path(path_buf, sizeof path_buf, tag);
  return path_buf;
}

/* bfloat16's bits of x (x exact in bfloat16: the upper half of binary32) */
static uint16_t bf16_bits(float x) {
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  return (uint16_t)(u >> 16);
}

typedef struct stag_case {
  const char *tag;
  int n;              /* steps */
  int master_dtype;   /* PROBE_DTYPE_BF16: pure BF16; F32: FP32 masters */
  double delta;       /* what each optimizer step adds to every weight
                         (0: the weights do not change) */
  double lr;          /* the learning rate of every step */
  int lr_zero_until;  /* lr is 0 before this step (a warm-up from 0) */
  double grad;        /* the unscaled weight gradient's values (0: zero) */
  int frozen;         /* no weight_grad records (requires_grad False) */
  int skip_from, skip_to; /* skipped steps [from, to), the weights as they
                             were (skip_to 0: none) */
  int every;          /* record every N-th step (0: 1) */
  int ring;           /* a flight recorder of this depth, a NaN loss at
                         the last step (0: full trace) */
  int stag_to;        /* the weights move by delta from this step on (0:
                         never, as delta says) */
  /* expected */
  const char *finding; /* the first finding (NULL: healthy only; "!": any
                          verdict, but no weights-stagnant finding) */
  const char *text[3]; /* in that finding's text */
} stag_case;

static void write_case(const char *p, const stag_case *c) {
  probe_options o;
  probe_options_init(&o);
  o.mode = c->ring ? PROBE_MODE_SCALARS : PROBE_MODE_FULL;
  if (c->ring) o.ring_steps = c->ring;
  if (c->every) o.step_every = c->every;
  o.overwrite = 1;
  int pure = c->master_dtype == PROBE_DTYPE_BF16;
  o.precision_policy = "bf16";
  o.command_line = "python train.py";
  o.config_json = "{\"name\": \"unit-stag\"}";
  probe_session *s = NULL;
  ck_assert_int_eq(probe_session_open(&s, p, &o), PROBE_OK);
  int32_t fc1, fc2, loss;
  ck_assert_int_eq(probe_layer_register(s, "enc.fc1", PROBE_KIND_LINEAR, PROBE_DTYPE_BF16, &fc1), PROBE_OK);
  ck_assert_int_eq(probe_layer_register(s, "head.fc2", PROBE_KIND_LINEAR, PROBE_DTYPE_BF16, &fc2), PROBE_OK);
  ck_assert_int_eq(probe_layer_register(s, "loss", PROBE_KIND_LOSS, PROBE_DTYPE_F32, &loss), PROBE_OK);
  /* each record its own buffer, valid until probe_step_end */
  static float x[N], y[N], g1[N], g2[N], m1[N], m2[N], lv[1];
  static uint16_t b1[N], b2[N];
  for (int i = 0; i < N; i++) {
    x[i] = 0.25f + (float)i / N;
    y[i] = 0.5f - (float)i / N;
  }
  for (int step = 0; step < c->n; step++) {
    int skip = c->skip_to > 0 && step >= c->skip_from && step < c->skip_to;
    double lr = step < c->lr_zero_until ? 0.0 : c->lr;
    /* the weights after this step's update: 1 + i/64 (exact in BF16,
     * |w| in [1, 2): spacing 2^-7), moved by delta per step that moved
     * them */
    int moved = step;
    if (c->skip_to > 0) moved -= (step >= c->skip_to ? c->skip_to : step) -
                                 (step >= c->skip_from ? c->skip_from : step);
    double shift = c->stag_to ? (step >= c->stag_to ? (step - c->stag_to + 1) * c->delta : 0)
                              : moved * c->delta;
    for (int i = 0; i < N; i++) {
      double base = 1.0 + (double)i / N;
      m1[i] = (float)(base + shift);
      m2[i] = (float)(-(base + shift));
      b1[i] = bf16_bits(m1[i]);
      b2[i] = bf16_bits(m2[i]);
      g1[i] = (float)(c->grad * (0.5 + (double)i / N));
      g2[i] = (float)(-c->grad * (0.5 + (double)i / N));
    }
    int last = step == c->n - 1;
    lv[0] = c->ring && last ? NAN : 1.0f;
    ck_assert_int_eq(probe_step_begin(s, step), PROBE_OK);
    ck_assert_int_eq(probe_tensor_record(s, fc1, PROBE_SITE_FWD_IN, PROBE_DTYPE_F32, x, N), PROBE_OK);
    ck_assert_int_eq(probe_tensor_record(s, fc1, PROBE_SITE_FWD_OUT, PROBE_DTYPE_F32, y, N), PROBE_OK);
    ck_assert_int_eq(probe_tensor_record(s, fc2, PROBE_SITE_FWD_IN, PROBE_DTYPE_F32, y, N), PROBE_OK);
    ck_assert_int_eq(probe_tensor_record(s, fc2, PROBE_SITE_FWD_OUT, PROBE_DTYPE_F32, x, N), PROBE_OK);
    ck_assert_int_eq(probe_tensor_record(s, loss, PROBE_SITE_FWD_OUT, PROBE_DTYPE_F32, lv, 1), PROBE_OK);
    if (!c->frozen) {
      ck_assert_int_eq(probe_tensor_record(s, fc2, PROBE_SITE_WEIGHT_GRAD, PROBE_DTYPE_F32, g2, N), PROBE_OK);
      ck_assert_int_eq(probe_tensor_record(s, fc1, PROBE_SITE_WEIGHT_GRAD, PROBE_DTYPE_F32, g1, N), PROBE_OK);
    }
    if (pure) {
      ck_assert_int_eq(probe_tensor_record(s, fc1, PROBE_SITE_MASTER_WEIGHT, PROBE_DTYPE_BF16, b1, N), PROBE_OK);
      ck_assert_int_eq(probe_tensor_record(s, fc2, PROBE_SITE_MASTER_WEIGHT, PROBE_DTYPE_BF16, b2, N), PROBE_OK);
    } else {
      ck_assert_int_eq(probe_tensor_record(s, fc1, PROBE_SITE_MASTER_WEIGHT, PROBE_DTYPE_F32, m1, N), PROBE_OK);
      ck_assert_int_eq(probe_tensor_record(s, fc2, PROBE_SITE_MASTER_WEIGHT, PROBE_DTYPE_F32, m2, N), PROBE_OK);
    }
    probe_step_scalars sc = {.loss = lv[0], .loss_scale = 1.0, .lr = lr,
                             .found_inf = skip, .skipped = skip};
    ck_assert_int_eq(probe_step_set_scalars(s, &sc), PROBE_OK);
    ck_assert_int_eq(probe_step_end(s), PROBE_OK);
  }
  ck_assert_int_eq(probe_session_close(s), PROBE_OK);
}

/* the diagnosis over several chunks of 64 rows */
#define diag_of(d, p) diag_of_rows((d), (p), 64)

#define finding_has(f, needle) diag_finding_has(f, needle)

/* ---- 1: the cases ------------------------------------------------------------ */

static const stag_case cases[] = {
    /* pure BF16, |w| in [1, 2) (spacing 2^-7), SGD lr 3e-4, grads ~1:
     * lr*|g| ~ 4e-4, far below 2^-8: nothing moves */
    {"bf16_stagnant", 150, PROBE_DTYPE_BF16, 0, 3e-4, 0, 1.0, 0, 0, 0, 0, 0, 0,
     "weights-stagnant",
     {"2 layers (100% of the weight elements) stopped changing from step 1",
      "stored in BF16", "keep FP32 master weights"}},
    /* FP32 weights with lr*|g| below FP32's own spacing: stagnation too,
     * said as FP32's (no lower precision involved) */
    {"fp32_tiny_lr", 100, PROBE_DTYPE_F32, 0, 1e-9, 0, 1.0, 0, 0, 0, 0, 0, 0,
     "weights-stagnant",
     {"half the spacing of FP32", "no lower precision is involved", NULL}},
    /* FP32 masters that move every step */
    {"fp32_masters_move", 150, PROBE_DTYPE_F32, 3e-4, 3e-4, 0, 1.0, 0, 0, 0, 0, 0, 0,
     NULL, {NULL}},
    /* BF16 weights that move (updates above the spacing) */
    {"bf16_moves", 150, PROBE_DTYPE_BF16, 0.015625, 3e-2, 0, 1.0, 0, 0, 0, 0, 0, 0,
     NULL, {NULL}},
    /* frozen: requires_grad False, no weight_grad */
    {"frozen", 150, PROBE_DTYPE_BF16, 0, 3e-4, 0, 1.0, 1, 0, 0, 0, 0, 0,
     NULL, {NULL}},
    /* lr 0 throughout */
    {"lr_zero", 150, PROBE_DTYPE_BF16, 0, 0, 0, 1.0, 0, 0, 0, 0, 0, 0,
     NULL, {NULL}},
    /* a warm-up from lr 0 for 100 steps, then the weights move */
    {"warmup_lr_zero", 150, PROBE_DTYPE_BF16, 0.015625, 3e-2, 100, 1.0, 0, 0, 0, 0, 0, 100,
     NULL, {NULL}},
    /* zero gradients: the optimizer legitimately does nothing */
    {"zero_grad", 150, PROBE_DTYPE_BF16, 0, 3e-4, 0, 0, 0, 0, 0, 0, 0, 0,
     NULL, {NULL}},
    /* the weights move, but a streak of 60 skipped steps keeps them */
    {"skipped", 150, PROBE_DTYPE_F32, 3e-4, 3e-4, 0, 1.0, 0, 40, 100, 0, 0, 0,
     "!", {NULL}},
    /* too short: 15 steps */
    {"short", 15, PROBE_DTYPE_BF16, 0, 3e-4, 0, 1.0, 0, 0, 0, 0, 0, 0,
     NULL, {NULL}},
    /* sparse records: every 2nd step, no two consecutive */
    {"sparse", 150, PROBE_DTYPE_BF16, 0, 3e-4, 0, 1.0, 0, 0, 0, 2, 0, 0,
     NULL, {NULL}},
    /* a flight recorder (8 steps before a NaN loss) */
    {"flight_recorder", 150, PROBE_DTYPE_BF16, 0, 3e-4, 0, 1.0, 0, 0, 0, 0, 8, 0,
     "!", {NULL}},
    /* weights no optimizer holds, with gradients whose update would show
     * (lr*|g| = 3e-2 x 1 > the spacing): not the precision */
    {"not_in_optimizer", 150, PROBE_DTYPE_BF16, 0, 3e-2, 0, 1.0, 0, 0, 0, 0, 0, 0,
     NULL, {NULL}},
};

START_TEST(test_case) {
  const stag_case *c = &cases[_i];
  const char *p = tmp_path(c->tag);
  write_case(p, c);
  probe_diag d;
  diag_of(&d, p);
  int stag = -1;
  for (int i = 0; i < d.n_findings; i++)
    if (d.findings[i].id == PROBE_DIAG_FINDING_WEIGHTS_STAGNANT) stag = i;
  if (!c->finding) {
    ck_assert_msg(d.verdict == PROBE_VERDICT_HEALTHY && d.n_findings == 1 &&
                      d.findings[0].id == PROBE_DIAG_FINDING_HEALTHY,
                  "%s: verdict %s, %d findings, first %s: %s", c->tag,
                  probe_verdict_name(d.verdict), d.n_findings,
                  probe_diag_finding_name(d.findings[0].id), d.findings[0].title);
  } else if (!strcmp(c->finding, "!")) {
    ck_assert_msg(stag < 0, "%s: %s", c->tag, stag >= 0 ? d.findings[stag].title : "");
  } else {
    ck_assert_msg(d.verdict == PROBE_VERDICT_DEGRADED && stag == 0,
                  "%s: verdict %s, first finding %s: %s", c->tag,
                  probe_verdict_name(d.verdict),
                  probe_diag_finding_name(d.findings[0].id), d.findings[0].title);
    const probe_diag_finding *f = &d.findings[0];
    for (int k = 0; k < 3 && c->text[k]; k++)
      ck_assert_msg(finding_has(f, c->text[k]), "%s: no '%s' in '%s' / '%s' / '%s' / '%s'",
                    c->tag, c->text[k], f->title,
                    f->n_evidence > 0 ? f->evidence[0] : "",
                    f->n_evidence > 1 ? f->evidence[1] : "", f->next_step);
  }
  probe_diag_free(&d);
  unlink(p);
}
END_TEST

/* A run that trains 40 steps and then stops: the first step of the run
 * is named, and the share is that of the parameters that stopped. */
START_TEST(test_stops_late) {
  /* one BF16 layer whose weights move by 2^-7 per step up to step 39,
   * then stay (SGD lr 3e-4, gradients ~1) */
  const char *p = tmp_path("stops_at_40");
  probe_options o;
  probe_options_init(&o);
  o.mode = PROBE_MODE_FULL;
  o.overwrite = 1;
  o.precision_policy = "bf16";
  probe_session *s = NULL;
  ck_assert_int_eq(probe_session_open(&s, p, &o), PROBE_OK);
  int32_t fc1;
  ck_assert_int_eq(probe_layer_register(s, "enc.fc1", PROBE_KIND_LINEAR, PROBE_DTYPE_BF16, &fc1), PROBE_OK);
  static float g[N];
  static uint16_t b[N];
  for (int step = 0; step < 150; step++) {
    int moved = step < 40 ? step : 39;
    for (int i = 0; i < N; i++) {
      b[i] = bf16_bits((float)(1.0 + (double)i / N + moved * 0.0078125));
      g[i] = (float)(0.5 + (double)i / N);
    }
    ck_assert_int_eq(probe_step_begin(s, step), PROBE_OK);
    ck_assert_int_eq(probe_tensor_record(s, fc1, PROBE_SITE_WEIGHT_GRAD, PROBE_DTYPE_F32, g, N), PROBE_OK);
    ck_assert_int_eq(probe_tensor_record(s, fc1, PROBE_SITE_MASTER_WEIGHT, PROBE_DTYPE_BF16, b, N), PROBE_OK);
    probe_step_scalars sc = {.loss = 1.0, .loss_scale = 1.0, .lr = 3e-4};
    ck_assert_int_eq(probe_step_set_scalars(s, &sc), PROBE_OK);
    ck_assert_int_eq(probe_step_end(s), PROBE_OK);
  }
  ck_assert_int_eq(probe_session_close(s), PROBE_OK);
  probe_diag d;
  diag_of(&d, p);
  ck_assert_int_eq(d.findings[0].id, PROBE_DIAG_FINDING_WEIGHTS_STAGNANT);
  ck_assert_int_eq(d.stag_first_step, 40);
  ck_assert_int_eq(d.stag_longest, 110);
  ck_assert_int_eq(d.stag_layer, fc1);
  ck_assert_int_eq(d.stag_dtype, PROBE_DTYPE_BF16);
  probe_diag_free(&d);
  unlink(p);
}
END_TEST

/* ---- 2: the numbers in `postmortem --json` ------------------------------------ */

static void json_case(const stag_case *c, const char *check) {
  const char *p = tmp_path(c->tag);
  write_case(p, c);
  probe_diag d;
  diag_of(&d, p);
  char *js = NULL;
  ck_assert_int_eq(probe_diag_render_json(&d, &js), PROBE_OK);
  char jp[300], sp[300], cmd[700];
  snprintf(jp, sizeof jp, "%s.json", tmp_path(c->tag));
  snprintf(sp, sizeof sp, "%s.py", tmp_path(c->tag));
  FILE *fj = fopen(jp, "w");
  ck_assert(fj != NULL);
  fputs(js, fj);
  fclose(fj);
  free(js);
  FILE *fs = fopen(sp, "w");
  ck_assert(fs != NULL);
  fprintf(fs,
          "import json, sys\n"
          "d = json.load(open(sys.argv[1], encoding='utf-8'))\n"
          "s, f = d['weights_stagnant'], d['diagnosis']\n"
          "ok = (%s)\n"
          "if not ok:\n"
          "    print(json.dumps(s, indent=1), file=sys.stderr)\n"
          "sys.exit(0 if ok else 1)\n",
          check);
  fclose(fs);
  snprintf(cmd, sizeof cmd, "/usr/bin/python3 '%s' '%s'", sp, jp);
  int rc = system(cmd);
  unlink(jp);
  unlink(sp);
  probe_diag_free(&d);
  unlink(p);
  ck_assert_msg(rc == 0, "%s: %s", c->tag, check);
}

START_TEST(test_json_stagnant) {
  json_case(&cases[0],
            "set(s) == {'stagnant','layers','params','elements',"
            "'total_elements','share','first_step','longest','layer',"
            "'stored_as','lr','grad_rms','weight_rms','half_spacing',"
            "'update_ratio'} and s['stagnant'] is True and s['layers'] == 2 "
            "and s['params'] == 2 and s['elements'] == 128 and "
            "s['total_elements'] == 128 and s['share'] == 1.0 and "
            "s['first_step'] == 1 and s['longest'] == 149 and "
            "s['layer'] == 'enc.fc1' and s['stored_as'] == 'bf16' and "
            "abs(s['lr'] - 3e-4) < 1e-12 and 0.5 < s['grad_rms'] < 1.5 and "
            "1 < s['weight_rms'] < 2 and abs(s['half_spacing'] - 2**-8) < 1e-12 and "
            "abs(s['update_ratio'] - s['lr'] * s['grad_rms'] / "
            "s['half_spacing']) < 1e-9 and s['update_ratio'] < 1 and "
            "f[0]['id'] == 'weights-stagnant' and d['verdict'] == 'degraded'");
}
END_TEST

START_TEST(test_json_moving) {
  json_case(&cases[2], /* fp32_masters_move: judged, nothing stopped */
            "s['stagnant'] is False and s['layers'] == 0 and "
            "s['elements'] == 0 and s['total_elements'] == 128 and "
            "s['first_step'] is None and s['layer'] is None and "
            "s['stored_as'] is None and s['update_ratio'] is None and "
            "d['verdict'] == 'healthy'");
}
END_TEST

START_TEST(test_json_not_judged) {
  json_case(&cases[4], /* frozen: no step could judge */
            "s is None and d['verdict'] == 'healthy'");
}
END_TEST

static Suite *make_suite(void) {
  Suite *s = suite_create("diagnose_stag");
  TCase *tc = tcase_create("stag");
  tcase_set_timeout(tc, 60);
  tcase_add_loop_test(tc, test_case, 0, (int)(sizeof cases / sizeof cases[0]));
  tcase_add_test(tc, test_stops_late);
  tcase_add_test(tc, test_json_stagnant);
  tcase_add_test(tc, test_json_moving);
  tcase_add_test(tc, test_json_not_judged);
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
