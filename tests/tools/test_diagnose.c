/*
 * tests/tools/test_diagnose.c - Check suite for the post-mortem engine
 * (libprobe/analysis/diagnose*.c). Each test writes a small trace through the libprobe
 * writer API with a known anomaly (a 5-layer model input -> lin1 -> bn1 ->
 * sm -> loss, 16-element tensors), reads it back with the isolated reader
 * and checks the origin layer, the kind of event and the top diagnosis.
 */
#define _POSIX_C_SOURCE 200809L
#include <check.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ampprobe/probe.h"
#include "ampprobe/analysis.h"
#include <jansson.h>

#define N 16
enum { L_INPUT, L_LIN, L_BN, L_SM, L_LOSS, N_LAYERS };

typedef struct tb {
  probe_session *s;
  int32_t id[N_LAYERS];
  float buf[64][N];
  int nb;
} tb;

/* What goes wrong in one step. */
typedef struct spec {
  float in_mag;     /* input magnitude */
  float bn_saved;   /* magnitude of bn's saved variance */
  float grad_mag;   /* magnitude of the gradients */
  int input_nan;    /* NaN in the input batch */
  int bn_var_inf;   /* bn's variance overflows: saved inf, output NaN */
  int lin_out_inf;  /* lin1's output overflows */
  int sm_zeros;     /* softmax output underflows to zero, loss is inf */
  int grad_inf;     /* lin1's weight gradient overflows (backward only) */
  float weight_mag; /* |w| of lin1 */
  int keep_loss;    /* the loss stays finite whatever flows (a NaN that
                       does not reach it) */
} spec;

typedef struct scal {
  double loss, scale, grad_norm, clip_threshold, clip_coef;
  int skipped, found_inf;
} scal;

/* The library's JSON document, parsed back with jansson (an independent
 * reader: the document must be valid JSON). */
static json_t *diag_json(const probe_diag *d) {
  char *txt = NULL;
  ck_assert_int_eq(probe_diag_render_json(d, &txt), PROBE_OK);
  json_error_t err;
  json_t *j = json_loads(txt, 0, &err);
  ck_assert_msg(j != NULL, "not JSON: %s", err.text);
  probe_free(txt);
  return j;
}

/* The traces of one test process go in TMPDIR (or /tmp)/ampprobe-test-diag-PID/,
 * removed with all it holds when that process exits (atexit; Check runs
 * each test in a forked child, which gets its own folder): a test run
 * leaves /tmp as it found it. */
static pid_t tmp_owner;
static int tmp_registered;
static char tmp_dir[128];

static void tmp_remove(void) {
  if (getpid() != tmp_owner || !tmp_dir[0]) return;
  char cmd[200];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp_dir);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmp_dir);
  tmp_dir[0] = '\0';
}

static char path_buf[256];
static const char *tmp_path(const char *tag) {
  if (tmp_owner != getpid()) {
    const char *dir = getenv("TMPDIR");
    snprintf(tmp_dir, sizeof tmp_dir, "%.64s/ampprobe-test-diag-%d",
             dir ? dir : "/tmp", (int)getpid());
    mkdir(tmp_dir, 0700);
    tmp_owner = getpid();
    if (!tmp_registered) atexit(tmp_remove);
    tmp_registered = 1;
  }
  snprintf(path_buf, sizeof path_buf, "%s/%s.h5", tmp_dir, tag);
  return path_buf;
}

/* Layers in fp32_mask (bit per layer) run in FP32; input and loss always
 * do. config_json is the stored config (NULL: {"name": "unit"}). */
static void tb_open_ex(tb *t, const char *path, int all_fp32, unsigned fp32_mask,
                       const char *config_json) {
  probe_options o;
  probe_options_init(&o);
  o.mode = PROBE_MODE_FULL;
  o.command_line = "ampprobe run --scenario unit --trace --steps 40";
  o.config_json = config_json ? config_json : "{\"name\": \"unit\"}";
  o.precision_policy = all_fp32 ? "fp32" : "fp16";
  memset(t, 0, sizeof *t);
  ck_assert_int_eq(probe_session_open(&t->s, path, &o), PROBE_OK);
  static const char *names[N_LAYERS] = {"input", "enc.lin1", "enc.bn1",
                                        "head.sm", "loss"};
  static const probe_kind kinds[N_LAYERS] = {PROBE_KIND_INPUT,
                                             PROBE_KIND_LINEAR, PROBE_KIND_BN,
                                             PROBE_KIND_SOFTMAX,
                                             PROBE_KIND_LOSS};
  for (int i = 0; i < N_LAYERS; i++) {
    probe_dtype p =
        (all_fp32 || i == L_INPUT || i == L_LOSS || (fp32_mask >> i & 1))
            ? PROBE_DTYPE_F32
            : PROBE_DTYPE_F16;
    ck_assert_int_eq(probe_layer_register(t->s, names[i], kinds[i], p,
                                          &t->id[i]),
                     PROBE_OK);
  }
}

static void tb_open(tb *t, const char *path, int all_fp32) {
  tb_open_ex(t, path, all_fp32, 0, NULL);
}

/* Records N values: mag * (0.5 + i/N), with nan/inf/zeros at the start. */
static void rec(tb *t, int layer, probe_site site, float mag, int n_nan,
                int n_inf, int n_zero) {
  ck_assert_int_lt(t->nb, 64);
  float *b = t->buf[t->nb++];
  for (int i = 0; i < N; i++) b[i] = mag * (0.5f + (float)i / N);
  int k = 0;
  for (int i = 0; i < n_nan; i++) b[k++] = NAN;
  for (int i = 0; i < n_inf; i++) b[k++] = INFINITY;
  for (int i = 0; i < n_zero; i++) b[k++] = 0.0f;
  ck_assert_int_eq(probe_tensor_record(t->s, t->id[layer], site,
                                       PROBE_DTYPE_F32, b, N),
                   PROBE_OK);
}

static void tb_step(tb *t, int64_t step, const spec *sp, const scal *sc) {
  t->nb = 0;
  ck_assert_int_eq(probe_step_begin(t->s, step), PROBE_OK);
  int bad = 0; /* a non-finite value flows forward */
  float x = sp->in_mag > 0 ? sp->in_mag : 1.0f;
  rec(t, L_INPUT, PROBE_SITE_FWD_OUT, x, sp->input_nan ? 2 : 0, 0, 0);
  bad = sp->input_nan;
  rec(t, L_LIN, PROBE_SITE_FWD_IN, x, bad ? 2 : 0, 0, 0);
  rec(t, L_LIN, PROBE_SITE_WEIGHT, sp->weight_mag > 0 ? sp->weight_mag : 0.5f,
      0, 0, 0);
  rec(t, L_LIN, PROBE_SITE_FWD_OUT, x * 2, bad ? 2 : 0,
      sp->lin_out_inf ? 3 : 0, 0);
  bad = bad || sp->lin_out_inf;
  rec(t, L_BN, PROBE_SITE_FWD_IN, x * 2, sp->input_nan ? 2 : 0,
      sp->lin_out_inf ? 3 : 0, 0);
  rec(t, L_BN, PROBE_SITE_FWD_SAVED, sp->bn_saved > 0 ? sp->bn_saved : 1.0f,
      bad ? 1 : 0, sp->bn_var_inf ? 1 : 0, 0);
  rec(t, L_BN, PROBE_SITE_FWD_OUT, 1.0f, (bad || sp->bn_var_inf) ? 4 : 0, 0, 0);
  bad = bad || sp->bn_var_inf;
  rec(t, L_SM, PROBE_SITE_FWD_IN, 1.0f, bad ? 4 : 0, 0, 0);
  rec(t, L_SM, PROBE_SITE_FWD_OUT, 0.1f, bad ? 4 : 0, 0,
      sp->sm_zeros ? 5 : 0);
  rec(t, L_LOSS, PROBE_SITE_FWD_IN, 0.1f, bad ? 4 : 0, 0,
      sp->sm_zeros ? 5 : 0);
  rec(t, L_LOSS, PROBE_SITE_FWD_OUT, 1.0f, bad ? N : 0, sp->sm_zeros ? N : 0,
      0);
  bad = bad || sp->sm_zeros;
  /* backward, in reverse */
  float g = sp->grad_mag > 0 ? sp->grad_mag : 1.0f;
  int gn = bad ? N : 0;
  rec(t, L_LOSS, PROBE_SITE_GRAD_OUT, (float)sc->scale, 0, 0, 0);
  rec(t, L_LOSS, PROBE_SITE_GRAD_IN, g, gn, 0, 0);
  rec(t, L_SM, PROBE_SITE_GRAD_OUT, g, gn, 0, 0);
  rec(t, L_SM, PROBE_SITE_GRAD_IN, g, gn, 0, 0);
  rec(t, L_BN, PROBE_SITE_GRAD_OUT, g, gn, 0, 0);
  rec(t, L_BN, PROBE_SITE_GRAD_IN, g, gn, 0, 0);
  rec(t, L_BN, PROBE_SITE_WEIGHT_GRAD, g, gn, 0, 0);
  rec(t, L_LIN, PROBE_SITE_GRAD_OUT, g, gn, 0, 0);
  rec(t, L_LIN, PROBE_SITE_WEIGHT_GRAD, g, gn, sp->grad_inf ? 2 : 0, 0);
  probe_step_scalars s;
  memset(&s, 0, sizeof s);
  s.loss = sp->keep_loss ? sc->loss : sp->sm_zeros ? INFINITY : (bad ? NAN : sc->loss);
  s.loss_scale = sc->scale;
  s.found_inf = sc->found_inf || bad || sp->grad_inf;
  s.skipped = sc->skipped || s.found_inf;
  s.lr = 1e-3;
  s.grad_norm = sc->grad_norm;
  s.clip_threshold = sc->clip_threshold;
  s.clip_coef = sc->clip_coef > 0 ? sc->clip_coef : 1.0;
  ck_assert_int_eq(probe_step_set_scalars(t->s, &s), PROBE_OK);
  ck_assert_int_eq(probe_step_end(t->s), PROBE_OK);
}

static void scaler_event(tb *t, int64_t step, probe_scaler_kind k, double old,
                         double nw) {
  probe_scaler_event e = {.step = step, .kind = k, .old_scale = old,
                          .new_scale = nw, .growth_tracker = 0};
  ck_assert_int_eq(probe_scaler_transition(t->s, &e), PROBE_OK);
}

static void probe_diag_of(probe_diag *d, const char *path) {
  probe_trace *tr = NULL;
  char err[256];
  ck_assert_int_eq(probe_trace_open_isolated(&tr, path, err, sizeof err),
                   PROBE_OK);
  probe_diag_options o;
  probe_diag_options_init(&o);
  o.chunk_rows = 7; /* small chunks: exercise chunk boundaries */
  ck_assert_int_eq(probe_diag_run(d, tr, path, &o), PROBE_OK);
  probe_trace_close(tr);
}

static scal clean(double loss, double scale) {
  scal s = {.loss = loss, .scale = scale, .grad_norm = 0.5,
            .clip_threshold = 0, .clip_coef = 1};
  return s;
}

/* ---- tests ---------------------------------------------------------------- */

START_TEST(test_healthy) {
  const char *p = tmp_path("healthy");
  tb t;
  tb_open(&t, p, 0);
  spec sp = {0};
  for (int s = 0; s < 30; s++) {
    scal sc = clean(2.0 - 0.05 * s, 65536);
    tb_step(&t, s, &sp, &sc);
  }
  ck_assert_int_eq(probe_session_close(t.s), PROBE_OK);
  probe_diag d;
  probe_diag_of(&d, p);
  ck_assert_int_eq(d.event, PROBE_DIAG_EVENT_NONE);
  ck_assert_int_eq(d.findings[0].id, PROBE_DIAG_FINDING_HEALTHY);
  ck_assert_int_eq(probe_diag_problem(&d), 0);
  ck_assert_int_eq(d.complete, 1);
  ck_assert_int_eq(d.n_steps, 30);
  probe_diag_free(&d);
  unlink(p);
}
END_TEST

START_TEST(test_bn_reduction_overflow) {
  const char *p = tmp_path("bn");
  tb t;
  tb_open(&t, p, 0);
  for (int s = 0; s < 12; s++) {
    spec sp = {.in_mag = 100.0f * (float)(s + 1),
               .bn_saved = 2000.0f * (float)(1 << (s < 10 ? s / 2 : 5))};
    sp.bn_var_inf = s >= 10;
    scal sc = clean(1.0, 65536);
    tb_step(&t, s, &sp, &sc);
    if (s >= 10) scaler_event(&t, s, PROBE_SCALER_BACKOFF, 65536, 32768);
  }
  ck_assert_int_eq(probe_session_close(t.s), PROBE_OK);
  probe_diag d;
  probe_diag_of(&d, p);
  ck_assert_int_eq(d.event, PROBE_DIAG_EVENT_REDUCTION_OVERFLOW);
  ck_assert_int_eq(d.event_step, 10);
  ck_assert_int_eq(d.event_phase, PROBE_PHASE_FORWARD);
  ck_assert_str_eq(probe_diag_layer_name(&d, d.origin_layer), "enc.bn1");
  ck_assert_int_eq(d.feeder_layer, L_LIN);
  /* passed on: sm and loss (forward), then backward layers */
  ck_assert_int_ge(d.n_passed, 2);
  ck_assert_str_eq(probe_diag_layer_name(&d, d.passed[0]), "head.sm");
  ck_assert_str_eq(probe_diag_layer_name(&d, d.passed[1]), "loss");
  /* the history shrinks toward the event */
  ck_assert_int_ge(d.n_history, 4);
  ck_assert(d.history[0].headroom > d.history[d.n_history - 2].headroom);
  ck_assert_int_eq(d.findings[0].id, PROBE_DIAG_FINDING_FORCE_FP32);
  ck_assert_ptr_nonnull(strstr(d.findings[0].next_step,
                               "ampprobe bisect --fp32-candidates bn"));
  ck_assert_ptr_nonnull(strstr(d.findings[0].next_step, "--scenario unit"));
  ck_assert_int_eq(probe_diag_problem(&d), 1);
  probe_diag_free(&d);
  unlink(p);
}
END_TEST

START_TEST(test_softmax_underflow_to_inf) {
  const char *p = tmp_path("sm");
  tb t;
  tb_open(&t, p, 0);
  for (int s = 0; s < 8; s++) {
    spec sp = {.sm_zeros = s >= 5};
    scal sc = clean(1.0, 65536);
    tb_step(&t, s, &sp, &sc);
  }
  ck_assert_int_eq(probe_session_close(t.s), PROBE_OK);
  probe_diag d;
  probe_diag_of(&d, p);
  ck_assert_int_eq(d.event, PROBE_DIAG_EVENT_UNDERFLOW_TO_INF);
  ck_assert_int_eq(d.event_step, 5);
  ck_assert_str_eq(probe_diag_layer_name(&d, d.origin_layer), "loss");
  ck_assert_str_eq(probe_diag_layer_name(&d, d.feeder_layer), "head.sm");
  ck_assert_int_eq(d.findings[0].id, PROBE_DIAG_FINDING_FORCE_FP32);
  ck_assert_str_eq(d.fp32_candidates, "softmax");
  ck_assert_int_eq(d.first_nonfinite_loss_step, 5);
  /* the loss runs in FP32: the finding names the FP16 softmax upstream,
   * never the loss */
  ck_assert_msg(strstr(d.findings[0].title, "keep 'head.sm' in FP32"),
                "title: %s", d.findings[0].title);
  ck_assert_ptr_null(strstr(d.findings[0].title, "keep it in FP32"));
  probe_diag_free(&d);
  unlink(p);
}
END_TEST

/* The same, with the softmax already in FP32 too: no FP16 layer fed the
 * zeros, so nothing already in FP32 may be recommended. */
START_TEST(test_underflow_from_fp32_layers) {
  const char *p = tmp_path("sm32");
  tb t;
  tb_open_ex(&t, p, 0, 1u << L_SM, NULL);
  for (int s = 0; s < 8; s++) {
    spec sp = {.sm_zeros = s >= 5};
    scal sc = clean(1.0, 65536);
    tb_step(&t, s, &sp, &sc);
  }
  ck_assert_int_eq(probe_session_close(t.s), PROBE_OK);
  probe_diag d;
  probe_diag_of(&d, p);
  ck_assert_int_eq(d.event, PROBE_DIAG_EVENT_UNDERFLOW_TO_INF);
  ck_assert_str_eq(probe_diag_layer_name(&d, d.origin_layer), "loss");
  ck_assert_ptr_null(strstr(d.fp32_candidates, "softmax"));
  for (int i = 0; i < d.n_findings; i++) {
    ck_assert_msg(!strstr(d.findings[i].title, "keep it in FP32") &&
                      !strstr(d.findings[i].title, "keep 'head.sm'") &&
                      !strstr(d.findings[i].title, "keep 'loss'"),
                  "finding %d: %s", i, d.findings[i].title);
    ck_assert_ptr_null(strstr(d.findings[i].next_step, "softmax"));
  }
  probe_diag_free(&d);
  unlink(p);
}
END_TEST

/* probe_diag_config_scaling reads scaler.enabled (and an fp16 precision). */
START_TEST(test_config_scaling) {
  ck_assert_int_eq(probe_diag_config_scaling(NULL), -1);
  ck_assert_int_eq(probe_diag_config_scaling(""), -1);
  ck_assert_int_eq(probe_diag_config_scaling("not json"), -1);
  ck_assert_int_eq(probe_diag_config_scaling("{\"name\": \"unit\"}"), -1);
  ck_assert_int_eq(probe_diag_config_scaling("{\"scaler\": {\"init\": 1}}"), -1);
  ck_assert_int_eq(
      probe_diag_config_scaling("{\"scaler\": {\"enabled\": true, \"init\": 1}}"),
      1);
  ck_assert_int_eq(probe_diag_config_scaling("{\"precision\": \"fp16\", "
                                       "\"scaler\": {\"enabled\": false}}"),
                   0);
  ck_assert_int_eq(probe_diag_config_scaling("{\"precision\": \"bf16\", "
                                       "\"scaler\": {\"enabled\": true}}"),
                   0);
  ck_assert_int_eq(probe_diag_config_scaling("{\"precision\": \"fp32\", "
                                       "\"scaler\": {\"enabled\": true}}"),
                   0);
}
END_TEST

/* A scaler that stays at an initial scale of 1 (no event) is on: the stored
 * config says so, and the post-mortem must not call scaling off. */
START_TEST(test_scaler_at_scale_one_is_on) {
  static const char *cfg[2] = {
      "{\"name\": \"unit\", \"precision\": \"fp16\", "
      "\"scaler\": {\"enabled\": true, \"init\": 1}}",
      "{\"name\": \"unit\", \"precision\": \"fp16\", "
      "\"scaler\": {\"enabled\": false, \"init\": 1}}"};
  for (int on = 1; on >= 0; on--) {
    const char *p = tmp_path(on ? "one-on" : "one-off");
    tb t;
    tb_open_ex(&t, p, 0, 0, cfg[on ? 0 : 1]);
    for (int s = 0; s < 20; s++) {
      spec sp = {.grad_mag = 1e-6f};
      scal sc = clean(1.0, 1.0);
      tb_step(&t, s, &sp, &sc);
    }
    ck_assert_int_eq(probe_session_close(t.s), PROBE_OK);
    probe_diag d;
    probe_diag_of(&d, p);
    ck_assert_int_eq(d.scaling_on, on);
    ck_assert_int_eq(d.scaling_from_config, 1);
    char *text = NULL;
    ck_assert_int_eq(probe_diag_render_text(&d, &text), PROBE_OK);
    if (on) {
      ck_assert_ptr_null(strstr(text, "loss scaling off"));
      ck_assert_ptr_nonnull(strstr(text, "scale       1 -> 1"));
      ck_assert_int_ne(d.findings[0].id, PROBE_DIAG_FINDING_ENABLE_LOSS_SCALING);
    } else {
      ck_assert_ptr_nonnull(strstr(text, "loss scaling off"));
      ck_assert_int_eq(d.findings[0].id, PROBE_DIAG_FINDING_ENABLE_LOSS_SCALING);
    }
    json_t *j = diag_json(&d);
    json_t *sc = json_object_get(j, "scaler");
    ck_assert(json_boolean_value(json_object_get(sc, "enabled")) == on);
    ck_assert_str_eq(json_string_value(json_object_get(sc, "enabled_source")),
                     "config");
    json_decref(j);
    probe_free(text);
    probe_diag_free(&d);
    unlink(p);
  }
}
END_TEST

START_TEST(test_input_nan) {
  const char *p = tmp_path("nanin");
  tb t;
  tb_open(&t, p, 0);
  for (int s = 0; s < 6; s++) {
    spec sp = {.input_nan = s == 3};
    scal sc = clean(1.0, 65536);
    tb_step(&t, s, &sp, &sc);
  }
  ck_assert_int_eq(probe_session_close(t.s), PROBE_OK);
  probe_diag d;
  probe_diag_of(&d, p);
  ck_assert_int_eq(d.event, PROBE_DIAG_EVENT_INPUT_NAN);
  ck_assert_int_eq(d.event_step, 3);
  ck_assert_str_eq(probe_diag_layer_name(&d, d.origin_layer), "input");
  ck_assert_int_eq(d.findings[0].id, PROBE_DIAG_FINDING_CLEAN_INPUT);
  probe_diag_free(&d);
  unlink(p);
}
END_TEST

START_TEST(test_linear_overflow_nan_downstream) {
  const char *p = tmp_path("lin");
  tb t;
  tb_open(&t, p, 0);
  for (int s = 0; s < 6; s++) {
    spec sp = {.in_mag = 1000.0f * (float)(s + 1), .lin_out_inf = s == 4};
    scal sc = clean(1.0, 65536);
    tb_step(&t, s, &sp, &sc);
  }
  ck_assert_int_eq(probe_session_close(t.s), PROBE_OK);
  probe_diag d;
  probe_diag_of(&d, p);
  ck_assert_int_eq(d.event, PROBE_DIAG_EVENT_OVERFLOW);
  ck_assert_str_eq(probe_diag_layer_name(&d, d.origin_layer), "enc.lin1");
  ck_assert_int_eq(d.origin_site, PROBE_SITE_FWD_OUT);
  ck_assert_int_eq(d.have_origin_in, 1);
  ck_assert_uint_eq(d.origin_out.posinf_count, 3);
  /* bn received inf and produced NaN: inf arithmetic */
  ck_assert_str_eq(probe_diag_layer_name(&d, d.nan_from_inf_layer), "enc.bn1");
  probe_diag_free(&d);
  unlink(p);
}
END_TEST

/* Forward inf/NaN in steps whose loss is non-finite is the event spreading,
 * not a silent fault ("held inf/NaN while the loss stayed finite" was said
 * of runs whose loss was NaN at every such step: unseen-model audit). */
START_TEST(test_nonfinite_loss_steps_are_not_silent) {
  const char *p = tmp_path("notsilent");
  tb t;
  tb_open(&t, p, 0);
  for (int s = 0; s < 40; s++) {
    spec sp = {.lin_out_inf = s >= 25};
    scal sc = clean(1.0, 1024);
    tb_step(&t, s, &sp, &sc);
  }
  ck_assert_int_eq(probe_session_close(t.s), PROBE_OK);
  probe_diag d;
  probe_diag_of(&d, p);
  ck_assert_int_eq(d.event_step, 25);
  ck_assert_int_eq(d.silent_layer, -1);
  ck_assert_int_eq(d.silent_layers, 0);
  for (int i = 0; i < d.n_findings; i++)
    ck_assert_msg(!strstr(d.findings[i].title, "silent") &&
                      !strstr(d.findings[i].title, "stayed finite"),
                  "finding %d: %s", i, d.findings[i].title);
  ck_assert_int_eq(d.verdict, PROBE_VERDICT_DIVERGED);
  probe_diag_free(&d);
  unlink(p);
}
END_TEST

static int has_finding(const probe_diag *d, probe_diag_finding_id id) {
  for (int i = 0; i < d->n_findings; i++)
    if (d->findings[i].id == id) return 1;
  return 0;
}

/* An FP16 layer whose input arrives (recorded before the cast) already
 * beyond FP16's range: the overflow was upstream, between modules, not in
 * the layer's product (a residual stream that grew: unseen-model audit). */
START_TEST(test_input_beyond_fp16_range) {
  const char *p = tmp_path("beyond");
  tb t;
  tb_open(&t, p, 0);
  for (int s = 0; s < 6; s++) {
    spec sp = {.in_mag = s == 4 ? 70000.0f : 10.0f, .lin_out_inf = s == 4};
    scal sc = clean(1.0, 65536);
    tb_step(&t, s, &sp, &sc);
  }
  ck_assert_int_eq(probe_session_close(t.s), PROBE_OK);
  probe_diag d;
  probe_diag_of(&d, p);
  ck_assert_int_eq(d.event_step, 4);
  ck_assert_int_eq(d.event, PROBE_DIAG_EVENT_OVERFLOW);
  ck_assert_str_eq(probe_diag_layer_name(&d, d.origin_layer), "enc.lin1");
  /* this trace's input layer records the 70000 itself: the data, not code
   * between modules (test_diagnose_cause.c has both shapes) */
  ck_assert_msg(strstr(d.event_evidence, "input data holds values beyond FP16's range") &&
                    !strstr(d.event_evidence, "between modules"),
                "%s", d.event_evidence);
  probe_diag_free(&d);
  unlink(p);
}
END_TEST

/* FP32 runs: a NaN whose loss stays finite is "not-precision", not a
 * divergence at "step -1"; an input NaN is clean-input alone, not also
 * lower-lr (unseen-model audit: two wrong FP32 controls). */
START_TEST(test_fp32_events) {
  const char *p = tmp_path("fp32ev");
  for (int c = 0; c < 2; c++) {
    tb t;
    tb_open(&t, p, 1);
    for (int s = 0; s < 40; s++) {
      spec sp = {.lin_out_inf = c == 0 && s >= 30, .keep_loss = c == 0,
                 .input_nan = c == 1 && s == 20};
      scal sc = clean(1.0, 1.0);
      tb_step(&t, s, &sp, &sc);
    }
    ck_assert_int_eq(probe_session_close(t.s), PROBE_OK);
    probe_diag d;
    probe_diag_of(&d, p);
    ck_assert_int_eq(d.fp32_run, 1);
    ck_assert(!has_finding(&d, PROBE_DIAG_FINDING_LOWER_LR));
    if (c == 0) {
      ck_assert_int_eq(d.first_nonfinite_loss_step, -1);
      ck_assert_int_eq(d.findings[0].id, PROBE_DIAG_FINDING_NOT_PRECISION);
      ck_assert_msg(strstr(d.findings[0].title, "enc.lin1") &&
                        strstr(d.findings[0].title, "not a precision problem"),
                    "%s", d.findings[0].title);
      ck_assert_int_eq(d.verdict, PROBE_VERDICT_DEGRADED);
    } else {
      ck_assert_int_eq(d.findings[0].id, PROBE_DIAG_FINDING_CLEAN_INPUT);
      ck_assert(!has_finding(&d, PROBE_DIAG_FINDING_NOT_PRECISION));
    }
    for (int i = 0; i < d.n_findings; i++)
      for (int k = 0; k < PROBE_DIAG_MAX_EVIDENCE; k++)
        ck_assert_msg(!strstr(d.findings[i].evidence[k], "step -1"), "%s",
                      d.findings[i].evidence[k]);
    probe_diag_free(&d);
    unlink(p);
  }
}
END_TEST

/* Hand-built traces, layer by layer (the tests below): a full-mode session
 * at p (overwriting) under `policy`, a layer, a float32 record, and the
 * step's loss with its end. */
static probe_session *hb_open(const char *p, const char *policy) {
  probe_options o;
  probe_options_init(&o);
  o.mode = PROBE_MODE_FULL;
  o.overwrite = 1;
  o.precision_policy = policy;
  probe_session *s = NULL;
  ck_assert_int_eq(probe_session_open(&s, p, &o), PROBE_OK);
  return s;
}

static int32_t hb_layer(probe_session *s, const char *name, probe_kind kind, probe_dtype prec) {
  int32_t id;
  ck_assert_int_eq(probe_layer_register(s, name, kind, prec, &id), PROBE_OK);
  return id;
}

static void hb_rec(probe_session *s, int32_t id, probe_site site, const float *x, size_t n) {
  ck_assert_int_eq(probe_tensor_record(s, id, site, PROBE_DTYPE_F32, x, n), PROBE_OK);
}

static void hb_end(probe_session *s, double loss, double scale) {
  probe_step_scalars sc = {.loss = loss, .loss_scale = scale};
  ck_assert_int_eq(probe_step_set_scalars(s, &sc), PROBE_OK);
  ck_assert_int_eq(probe_step_end(s), PROBE_OK);
}

/* An origin whose recorded input holds NaN (nothing upstream recorded it
 * being made) is not described as having a finite input. */
START_TEST(test_nonfinite_input_not_called_finite) {
  const char *p = tmp_path("nfin");
  probe_session *s = hb_open(p, NULL);
  int32_t id = hb_layer(s, "fc", PROBE_KIND_LINEAR, PROBE_DTYPE_F16);
  float x[N];
  for (int step = 0; step < 3; step++) {
    ck_assert_int_eq(probe_step_begin(s, step), PROBE_OK);
    for (int i = 0; i < N; i++) x[i] = 0.5f + (float)i;
    if (step == 2) x[0] = x[1] = NAN;
    hb_rec(s, id, PROBE_SITE_FWD_IN, x, N);
    hb_rec(s, id, PROBE_SITE_FWD_OUT, x, N);
    hb_end(s, step == 2 ? NAN : 1.0, 1.0);
  }
  ck_assert_int_eq(probe_session_close(s), PROBE_OK);
  probe_diag d;
  probe_diag_of(&d, p);
  ck_assert_int_eq(d.have_origin_in, 1);
  ck_assert_uint_eq(d.origin_in.nan_count, 2);
  char *text = NULL;
  ck_assert_int_eq(probe_diag_render_text(&d, &text), PROBE_OK);
  ck_assert_msg(!strstr(text, "its input   finite"), "%s", text);
  ck_assert_msg(strstr(text, "its input   2 NaN"), "%s", text);
  for (int i = 0; i < d.n_findings; i++)
    for (int k = 0; k < PROBE_DIAG_MAX_EVIDENCE; k++)
      ck_assert_msg(!strstr(d.findings[i].evidence[k], "its input was finite"), "%s",
                    d.findings[i].evidence[k]);
  /* no record produced it: the data or code between modules, not FP32 */
  ck_assert_int_eq(d.findings[0].id, PROBE_DIAG_FINDING_CLEAN_INPUT);
  ck_assert_msg(strstr(d.findings[0].title, "from code no record covers"), "%s",
                d.findings[0].title);
  ck_assert_msg(strstr(d.findings[0].next_step, "check what reached 'fc'"), "%s",
                d.findings[0].next_step);
  probe_free(text);
  probe_diag_free(&d);
  unlink(p);
}
END_TEST

/* Weights that go non-finite after a first event of another kind are a
 * divergence (docs/precision.md: "the loss went non-finite, the weights
 * did, or the loss scale collapsed"), whether the loss was measured or not:
 * with the loss not measured such a run was "degraded" (hunt, 2026-12-04;
 * only a first event at the weights counted). Controls: the same without
 * the weights' NaN is degraded; a measured NaN loss is diverged as before. */
static void weights_later_trace(const char *p, int weights_nf, int loss_measured) {
  probe_session *s = hb_open(p, NULL);
  int32_t id = hb_layer(s, "fc", PROBE_KIND_LINEAR, PROBE_DTYPE_F16);
  float x[N], y[N], w[N];
  for (int step = 0; step < 10; step++) {
    ck_assert_int_eq(probe_step_begin(s, step), PROBE_OK);
    for (int i = 0; i < N; i++) x[i] = y[i] = w[i] = 0.5f + (float)i / N;
    if (step >= 3) y[0] = INFINITY; /* fc overflows from finite inputs */
    if (weights_nf && step >= 6) w[2] = NAN;
    hb_rec(s, id, PROBE_SITE_FWD_IN, x, N);
    hb_rec(s, id, PROBE_SITE_WEIGHT, w, N);
    hb_rec(s, id, PROBE_SITE_FWD_OUT, y, N);
    hb_rec(s, id, PROBE_SITE_MASTER_WEIGHT, w, N);
    probe_step_scalars sc = {.loss = 1.0, .loss_scale = 1.0};
    if (!loss_measured) {
      sc.loss = NAN;
      sc.unmeasured = PROBE_SCALAR_LOSS;
    } else if (step >= 3) {
      sc.loss = NAN;
    }
    ck_assert_int_eq(probe_step_set_scalars(s, &sc), PROBE_OK);
    ck_assert_int_eq(probe_step_end(s), PROBE_OK);
  }
  ck_assert_int_eq(probe_session_close(s), PROBE_OK);
}

/* A trace its writer never closed (killed) is not healthy: the not-closed
 * finding, verdict degraded (it was healthy, exit 0, while the same file in
 * a rank set was degraded: hunt, 2026-12-04); after a fault it comes last;
 * a closed trace has none. */
static void killed_trace(const char *p, int nan_at, int close_it) {
  pid_t pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) {
    probe_session *s = hb_open(p, NULL);
    int32_t id = hb_layer(s, "fc", PROBE_KIND_LINEAR, PROBE_DTYPE_F16);
    float x[N];
    for (int step = 0; step < 12; step++) {
      if (probe_step_begin(s, step) != PROBE_OK) _exit(10);
      for (int i = 0; i < N; i++) x[i] = 0.5f + (float)i / N;
      hb_rec(s, id, PROBE_SITE_FWD_IN, x, N);
      if (step == nan_at) x[1] = NAN;
      hb_rec(s, id, PROBE_SITE_FWD_OUT, x, N);
      probe_step_scalars sc = {.loss = step >= nan_at && nan_at >= 0 ? NAN : 1.0,
                               .loss_scale = 1.0};
      if (probe_step_set_scalars(s, &sc) != PROBE_OK || probe_step_end(s) != PROBE_OK)
        _exit(11);
    }
    if (close_it) _exit(probe_session_close(s) == PROBE_OK ? 0 : 12);
    _exit(probe_session_flush(s) == PROBE_OK ? 0 : 13); /* killed: no close */
  }
  int wst = 0;
  ck_assert_int_eq(waitpid(pid, &wst, 0), pid);
  ck_assert(WIFEXITED(wst) && WEXITSTATUS(wst) == 0);
}

START_TEST(test_not_closed) {
  static const struct {
    int nan_at, close_it;
    probe_verdict want;
    int not_closed_at; /* index of the finding, -1 none */
  } cases[] = {
      {-1, 0, PROBE_VERDICT_DEGRADED, 0},
      {5, 0, PROBE_VERDICT_DIVERGED, 1},
      {-1, 1, PROBE_VERDICT_HEALTHY, -1},
      {5, 1, PROBE_VERDICT_DIVERGED, -1},
  };
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    const char *p = tmp_path("killed");
    unlink(p);
    killed_trace(p, cases[c].nan_at, cases[c].close_it);
    probe_diag d;
    probe_diag_of(&d, p);
    ck_assert_int_eq(d.complete, cases[c].close_it);
    ck_assert_msg(d.verdict == cases[c].want, "case %zu: verdict %s", c,
                  probe_verdict_name(d.verdict));
    int at = -1;
    for (int i = 0; i < d.n_findings; i++)
      if (d.findings[i].id == PROBE_DIAG_FINDING_NOT_CLOSED) at = i;
    ck_assert_msg(at == cases[c].not_closed_at, "case %zu: not-closed at %d", c, at);
    if (at >= 0)
      ck_assert_msg(strstr(d.findings[at].title, "the run stopped after step 11"),
                    "%s", d.findings[at].title);
    probe_diag_free(&d);
    unlink(p);
  }
}
END_TEST

/* A trace its writer closed with the abort mark (an exception, a signal)
 * is not a finished run: not-closed first, degraded (postmortem exit 1),
 * the finding naming what ended the job, escaped (the reason is data);
 * the step in progress at the mark is named; JSON trace.aborted and
 * aborted_step. It read "healthy", exit 0 (hunt F1, F2). */
START_TEST(test_aborted_trace) {
  static const struct {
    const char *reason, *shown;
    int in_step; /* marked inside step 12, else after step 11 */
    const char *title;
  } cases[] = {
      {"signal SIGTERM", "signal SIGTERM", 0,
       "the job ended by signal SIGTERM after step 11; its trace was closed "
       "by the tracer"},
      {"RuntimeError\n\x1b[2Jfake", "RuntimeError\\n\\e[2Jfake", 1,
       "the job ended by RuntimeError\\n\\e[2Jfake in step 12 (closed half "
       "done); its trace was closed by the tracer"},
  };
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    const char *p = tmp_path("aborted");
    unlink(p);
    tb t;
    tb_open(&t, p, 0);
    for (int st = 0; st < 12; st++) {
      spec sp = {0};
      scal sc = clean(1.0, 65536);
      tb_step(&t, st, &sp, &sc);
    }
    if (cases[c].in_step) {
      ck_assert_int_eq(probe_step_begin(t.s, 12), PROBE_OK);
      rec(&t, L_INPUT, PROBE_SITE_FWD_OUT, 1.0f, 0, 0, 0);
    }
    ck_assert_int_eq(probe_session_mark_aborted(t.s, cases[c].reason), PROBE_OK);
    ck_assert_int_eq(probe_session_close(t.s), PROBE_OK);
    probe_diag d;
    probe_diag_of(&d, p);
    ck_assert_int_eq(d.complete, 0);
    ck_assert_str_eq(d.aborted, cases[c].shown);
    ck_assert_int_eq(d.aborted_step, cases[c].in_step ? 12 : -1);
    ck_assert_int_eq(d.verdict, PROBE_VERDICT_DEGRADED);
    ck_assert_int_eq(probe_diag_problem(&d), 1);
    ck_assert_int_ge(d.n_findings, 1);
    ck_assert_int_eq(d.findings[0].id, PROBE_DIAG_FINDING_NOT_CLOSED);
    ck_assert_str_eq(d.findings[0].title, cases[c].title);
    for (int i = 0; i < d.n_findings; i++)
      ck_assert_int_ne(d.findings[i].id, PROBE_DIAG_FINDING_HEALTHY);
    char *text = NULL;
    ck_assert_int_eq(probe_diag_render_text(&d, &text), PROBE_OK);
    ck_assert_msg(strstr(text, "status      ABORTED"), "%s", text);
    ck_assert_msg(strstr(text, cases[c].shown), "%s", text);
    ck_assert_msg(!strchr(text, '\x1b'), "a raw escape in the text");
    probe_free(text);
    json_t *j = diag_json(&d);
    json_t *tr = json_object_get(j, "trace");
    ck_assert(json_is_false(json_object_get(tr, "complete")));
    ck_assert_str_eq(json_string_value(json_object_get(tr, "aborted")),
                     cases[c].shown);
    json_t *as = json_object_get(tr, "aborted_step");
    if (cases[c].in_step) ck_assert_int_eq(json_integer_value(as), 12);
    else ck_assert(json_is_null(as));
    ck_assert_str_eq(json_string_value(json_object_get(j, "verdict")),
                     "degraded");
    json_decref(j);
    probe_diag_free(&d);
    unlink(p);
  }
  /* never marked: the JSON says aborted null */
  const char *p = tmp_path("not-aborted");
  tb t;
  tb_open(&t, p, 0);
  spec sp = {0};
  scal sc = clean(1.0, 65536);
  tb_step(&t, 0, &sp, &sc);
  ck_assert_int_eq(probe_session_close(t.s), PROBE_OK);
  probe_diag d;
  probe_diag_of(&d, p);
  ck_assert_str_eq(d.aborted, "");
  json_t *j = diag_json(&d);
  ck_assert(json_is_null(json_object_get(json_object_get(j, "trace"), "aborted")));
  json_decref(j);
  probe_diag_free(&d);
  unlink(p);
}
END_TEST

/* A non-finite loss at a step with no per-layer record (records kept every
 * 4th step) is said so, with the recorded steps around it, in the JSON and
 * the text: it read "no per-layer record of that step held a non-finite
 * value: the loss computation ... made it" (hunt, 2026-12-04). */
START_TEST(test_loss_at_unrecorded_step) {
  static const int64_t bad[] = {50, 49, 3};
  static const char *around[] = {"at steps 48 and 52 around it",
                                 "at steps 48 and 52 around it",
                                 "at steps 0 and 4 around it"};
  for (size_t c = 0; c < 3; c++) {
    const char *p = tmp_path("every4");
    probe_session *s = hb_open(p, NULL);
    int32_t id = hb_layer(s, "fc", PROBE_KIND_LINEAR, PROBE_DTYPE_F16);
    float x[N];
    for (int i = 0; i < N; i++) x[i] = 0.5f + (float)i / N;
    for (int step = 0; step < 60; step++) {
      ck_assert_int_eq(probe_step_begin(s, step), PROBE_OK);
      if (step % 4 == 0) {
        hb_rec(s, id, PROBE_SITE_FWD_IN, x, N);
        hb_rec(s, id, PROBE_SITE_FWD_OUT, x, N);
      }
      hb_end(s, step == bad[c] ? NAN : 1.0, 1.0);
    }
    ck_assert_int_eq(probe_session_close(s), PROBE_OK);
    probe_diag d;
    probe_diag_of(&d, p);
    ck_assert_int_eq(d.event, PROBE_DIAG_EVENT_LOSS_ONLY);
    ck_assert_int_eq(d.event_step, bad[c]);
    char want[64];
    snprintf(want, sizeof want, "step %lld has no per-layer record", (long long)bad[c]);
    ck_assert_msg(strstr(d.event_evidence, want) && strstr(d.event_evidence, around[c]),
                  "case %zu: %s", c, d.event_evidence);
    char *text = NULL;
    ck_assert_int_eq(probe_diag_render_text(&d, &text), PROBE_OK);
    ck_assert_msg(strstr(text, "  evidence    step"), "%s", text);
    probe_free(text);
    probe_diag_free(&d);
    unlink(p);
  }
}
END_TEST

START_TEST(test_weights_nonfinite_later) {
  static const struct {
    int weights_nf, loss_measured;
    probe_verdict want;
  } cases[] = {
      {1, 0, PROBE_VERDICT_DIVERGED},
      {0, 0, PROBE_VERDICT_DEGRADED},
      {1, 1, PROBE_VERDICT_DIVERGED},
      {0, 1, PROBE_VERDICT_DIVERGED},
  };
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    const char *p = tmp_path("wlater");
    weights_later_trace(p, cases[c].weights_nf, cases[c].loss_measured);
    probe_diag d;
    probe_diag_of(&d, p);
    ck_assert_int_eq(d.event_step, 3);
    ck_assert_int_eq(d.origin_site, PROBE_SITE_FWD_OUT);
    ck_assert_msg(d.verdict == cases[c].want, "case %zu: verdict %s", c,
                  probe_verdict_name(d.verdict));
    /* a loss never measured reads so (it read "nan -> nan") */
    char *text = NULL;
    ck_assert_int_eq(probe_diag_render_text(&d, &text), PROBE_OK);
    ck_assert_msg(!strstr(text, "nan -> nan"), "%s", text);
    if (!cases[c].loss_measured)
      ck_assert_msg(strstr(text, "loss        not measured"), "%s", text);
    probe_free(text);
    probe_diag_free(&d);
    unlink(p);
  }
}
END_TEST

/* An FP32 loss whose recorded input (the prediction) is finite and whose
 * output is NaN: the NaN came with the target, which is not recorded - not
 * "produced in FP16 upstream" (unseen-model audit: a NaN target). */
START_TEST(test_loss_nan_from_a_finite_prediction) {
  const char *p = tmp_path("target");
  probe_session *s = hb_open(p, "fp16");
  int32_t fc = hb_layer(s, "fc", PROBE_KIND_LINEAR, PROBE_DTYPE_F16);
  int32_t loss = hb_layer(s, "loss", PROBE_KIND_LOSS, PROBE_DTYPE_F32);
  float x[N], one = 1.0f, nan1 = NAN;
  for (int i = 0; i < N; i++) x[i] = 0.25f * (float)(i + 1);
  for (int step = 0; step < 4; step++) {
    ck_assert_int_eq(probe_step_begin(s, step), PROBE_OK);
    hb_rec(s, fc, PROBE_SITE_FWD_OUT, x, N);
    hb_rec(s, loss, PROBE_SITE_FWD_IN, x, N);
    hb_rec(s, loss, PROBE_SITE_FWD_OUT, step == 3 ? &nan1 : &one, 1);
    hb_end(s, step == 3 ? NAN : 1.0, 1.0);
  }
  ck_assert_int_eq(probe_session_close(s), PROBE_OK);
  probe_diag d;
  probe_diag_of(&d, p);
  ck_assert_str_eq(probe_diag_layer_name(&d, d.origin_layer), "loss");
  ck_assert_int_eq(d.findings[0].id, PROBE_DIAG_FINDING_CLEAN_INPUT);
  ck_assert_msg(strstr(d.findings[0].title, "targets of step 3") &&
                    !strstr(d.findings[0].title, "produced in FP16"),
                "%s", d.findings[0].title);
  ck_assert_msg(!strstr(d.findings[0].next_step, "bisect"), "%s", d.findings[0].next_step);
  probe_diag_free(&d);
  unlink(p);
}
END_TEST

/* A loss computed outside any module (-log(p[y]) in the training loop, no
 * loss layer): the FP16 softmax's output held probabilities that underflowed
 * to 0, the loss was inf, and the first non-finite record is the gradient
 * arriving at the softmax. The event is the forward log of 0 at the
 * softmax's output (underflow-to-inf, keep it in FP32), not "received inf
 * at its grad_out from code no record covers" (unseen-model audit c13).
 * Controls keep their old diagnosis: no zeros in the output (a linear
 * head), a softmax already in FP32, a loss layer that is recorded, and a
 * finite loss (a scaled-gradient overflow). */
static void outside_loss_trace(const char *p, probe_kind head_kind, probe_dtype head_prec,
                               int with_loss_layer, int loss_inf) {
  probe_session *s = hb_open(p, "fp16");
  int32_t fc = hb_layer(s, "fc", PROBE_KIND_LINEAR, PROBE_DTYPE_F16);
  int32_t head = hb_layer(s, "sm", head_kind, head_prec);
  int32_t loss = with_loss_layer ? hb_layer(s, "loss", PROBE_KIND_LOSS, PROBE_DTYPE_F32) : -1;
  float x[N], prob[N], g[N];
  for (int i = 0; i < N; i++) {
    x[i] = 0.25f * (float)(i + 1);
    prob[i] = head_kind == PROBE_KIND_SOFTMAX ? (i < 4 ? 0.0f : 1.0f / 12.0f) : x[i];
  }
  for (int step = 0; step < 4; step++) {
    int bad = step == 2;
    ck_assert_int_eq(probe_step_begin(s, step), PROBE_OK);
    hb_rec(s, fc, PROBE_SITE_FWD_IN, x, N);
    hb_rec(s, fc, PROBE_SITE_FWD_OUT, x, N);
    hb_rec(s, head, PROBE_SITE_FWD_IN, x, N);
    hb_rec(s, head, PROBE_SITE_FWD_OUT, prob, N);
    float lv = bad && loss_inf ? INFINITY : 1.0f;
    if (loss >= 0) {
      hb_rec(s, loss, PROBE_SITE_FWD_IN, prob, N);
      hb_rec(s, loss, PROBE_SITE_FWD_OUT, &lv, 1);
    }
    for (int i = 0; i < N; i++) g[i] = bad && i < 4 ? -INFINITY : 0.01f;
    hb_rec(s, head, PROBE_SITE_GRAD_OUT, g, N);
    hb_rec(s, head, PROBE_SITE_GRAD_IN, g, N);
    hb_rec(s, fc, PROBE_SITE_GRAD_OUT, g, N);
    hb_end(s, bad && loss_inf ? INFINITY : 1.0, 1024.0);
  }
  ck_assert_int_eq(probe_session_close(s), PROBE_OK);
}

START_TEST(test_loss_outside_modules) {
  const char *p = tmp_path("outside");
  probe_diag d;
  outside_loss_trace(p, PROBE_KIND_SOFTMAX, PROBE_DTYPE_F16, 0, 1);
  probe_diag_of(&d, p);
  ck_assert_int_eq(d.event, PROBE_DIAG_EVENT_UNDERFLOW_TO_INF);
  ck_assert_int_eq(d.event_phase, PROBE_PHASE_FORWARD);
  ck_assert_int_eq(d.event_step, 2);
  ck_assert_int_eq(d.origin_site, PROBE_SITE_FWD_OUT);
  ck_assert_str_eq(probe_diag_layer_name(&d, d.origin_layer), "sm");
  ck_assert_int_eq(d.findings[0].id, PROBE_DIAG_FINDING_FORCE_FP32);
  ck_assert_msg(strstr(d.event_evidence, "outside any recorded module") &&
                    strstr(d.event_evidence, "4 exact zeros"),
                "%s", d.event_evidence);
  for (int k = 0; k < d.findings[0].n_evidence; k++) /* sm made the zeros, not fc */
    ck_assert_msg(!strstr(d.findings[0].evidence[k], "fed it values that had underflowed"),
                  "%s", d.findings[0].evidence[k]);
  ck_assert_msg(strstr(d.findings[0].next_step, "--fp32-candidates") &&
                    strstr(d.findings[0].next_step, "softmax"), "%s",
                d.findings[0].next_step);
  probe_diag_free(&d);

  /* controls: a loss layer that recorded the inf (its own event), and a
   * finite loss (a scaled-gradient overflow, backward) */
  struct { probe_kind k; probe_dtype prec; int loss_layer, loss_inf; } ctl[] = {
      {PROBE_KIND_SOFTMAX, PROBE_DTYPE_F16, 1, 1}, /* a recorded loss layer */
      {PROBE_KIND_SOFTMAX, PROBE_DTYPE_F16, 0, 0}, /* a finite loss */
  };
  for (size_t c = 0; c < sizeof ctl / sizeof ctl[0]; c++) {
    outside_loss_trace(p, ctl[c].k, ctl[c].prec, ctl[c].loss_layer, ctl[c].loss_inf);
    probe_diag_of(&d, p);
    ck_assert_msg(!strstr(d.event_evidence, "outside any recorded module") &&
                      !strstr(d.event_evidence, "outside the recorded modules"),
                  "control %zu: %s", c, d.event_evidence);
    if (!ctl[c].loss_layer) /* still the gradient record (or no event) */
      ck_assert_msg(d.event_step < 0 || d.event_phase == PROBE_PHASE_BACKWARD,
                    "control %zu: %s at %s, step %lld", c, probe_diag_event_name(d.event),
                    probe_site_name(d.origin_site), (long long)d.event_step);
    probe_diag_free(&d);
  }
  unlink(p);
}
END_TEST

/* The loss went non-finite while every value its step's forward recorded
 * was finite, in any precision, with a scaler or without: the loss
 * computation (outside the recorded modules) made it - forward, the
 * loss-outside finding - not the gradient, the optimizer or the learning
 * rate (Python audit F1: an FP32 job without a scaler whose -log(p) went
 * inf was "weights non-finite in the optimizer, lower the lr"). Cases:
 * an FP32 softmax with underflowed probabilities (underflow-to-inf at its
 * output), a linear head with no zeros in FP16 and in FP32 (loss-nonfinite,
 * fed_by the head), each with the NaN gradients and master weights that
 * follow in the step, with and without a skipped step. */
static void loss_after_trace(const char *p, probe_kind head_kind, probe_dtype prec,
                             int skipped, int unrecorded) {
  probe_session *s = hb_open(p, prec == PROBE_DTYPE_F32 ? "fp32" : "fp16");
  int32_t fc = hb_layer(s, "fc", PROBE_KIND_LINEAR, prec);
  int32_t head = hb_layer(s, "head", head_kind, prec);
  if (unrecorded) /* registered, never recorded (a layers= selection) */
    hb_layer(s, "skipped.lin", PROBE_KIND_LINEAR, prec);
  float x[N], out[N], g[N], w[N];
  for (int i = 0; i < N; i++) {
    x[i] = 0.25f * (float)(i + 1);
    out[i] = head_kind == PROBE_KIND_SOFTMAX ? (i < 4 ? 0.0f : 1.0f / 12.0f) : x[i];
  }
  for (int step = 0; step < 5; step++) {
    int bad = step == 3;
    ck_assert_int_eq(probe_step_begin(s, step), PROBE_OK);
    hb_rec(s, fc, PROBE_SITE_FWD_IN, x, N);
    hb_rec(s, fc, PROBE_SITE_WEIGHT, x, N);
    hb_rec(s, fc, PROBE_SITE_FWD_OUT, x, N);
    hb_rec(s, head, PROBE_SITE_FWD_IN, x, N);
    hb_rec(s, head, PROBE_SITE_FWD_OUT, out, N);
    for (int i = 0; i < N; i++) g[i] = bad ? NAN : 0.01f;
    hb_rec(s, head, PROBE_SITE_GRAD_OUT, g, N);
    hb_rec(s, head, PROBE_SITE_GRAD_IN, g, N);
    hb_rec(s, fc, PROBE_SITE_GRAD_OUT, g, N);
    hb_rec(s, fc, PROBE_SITE_WEIGHT_GRAD, g, N);
    for (int i = 0; i < N; i++) w[i] = bad && !skipped ? NAN : x[i];
    hb_rec(s, fc, PROBE_SITE_MASTER_WEIGHT, w, N);
    probe_step_scalars sc = {.loss = bad ? INFINITY : 1.0, .loss_scale = 1024.0,
                             .found_inf = bad && skipped, .skipped = bad && skipped};
    ck_assert_int_eq(probe_step_set_scalars(s, &sc), PROBE_OK);
    ck_assert_int_eq(probe_step_end(s), PROBE_OK);
    if (bad && !skipped) break; /* the weights are NaN: the run is over */
  }
  ck_assert_int_eq(probe_session_close(s), PROBE_OK);
}

START_TEST(test_loss_outside_every_precision) {
  const char *p = tmp_path("lossafter");
  struct { probe_kind k; probe_dtype prec; probe_diag_event ev; } c[] = {
      {PROBE_KIND_SOFTMAX, PROBE_DTYPE_F32, PROBE_DIAG_EVENT_UNDERFLOW_TO_INF},
      {PROBE_KIND_LINEAR, PROBE_DTYPE_F32, PROBE_DIAG_EVENT_LOSS_ONLY},
      {PROBE_KIND_LINEAR, PROBE_DTYPE_F16, PROBE_DIAG_EVENT_LOSS_ONLY},
  };
  for (size_t i = 0; i < sizeof c / sizeof c[0]; i++)
    for (int skipped = 0; skipped < 3; skipped++) {
      int unrec = skipped == 2; /* a third pass: a layer left unrecorded */
      loss_after_trace(p, c[i].k, c[i].prec, skipped == 1, unrec);
      probe_diag d;
      probe_diag_of(&d, p);
      ck_assert_msg(d.event == c[i].ev && d.event_step == 3 &&
                        d.event_phase == PROBE_PHASE_FORWARD,
                    "case %zu/%d: %s step %lld %s", i, skipped,
                    probe_diag_event_name(d.event), (long long)d.event_step,
                    probe_phase_name(d.event_phase));
      if (c[i].ev == PROBE_DIAG_EVENT_LOSS_ONLY) {
        ck_assert_int_eq(d.origin_layer, -1);
        ck_assert_str_eq(probe_diag_layer_name(&d, d.feeder_layer), "head");
        ck_assert_int_eq(d.nan_from_inf_layer, -1); /* nothing passed on */
        ck_assert_int_eq(d.n_passed, 0);
        /* a module the step did not record may have made it: said */
        ck_assert_msg(unrec == (strstr(d.event_evidence, "did not record") != NULL),
                      "case %zu/%d: %s", i, skipped, d.event_evidence);
        ck_assert_msg(strlen(d.event_evidence) < 300, "%s", d.event_evidence);
      } else {
        ck_assert_str_eq(probe_diag_layer_name(&d, d.origin_layer), "head");
      }
      ck_assert_int_eq(d.findings[0].id, c[i].prec == PROBE_DTYPE_F32
                                             ? PROBE_DIAG_FINDING_NOT_PRECISION
                                             : PROBE_DIAG_FINDING_FORCE_FP32);
      ck_assert_msg(strstr(d.findings[0].title, "outside the recorded modules"),
                    "case %zu/%d: %s", i, skipped, d.findings[0].title);
      ck_assert_msg(strstr(d.findings[0].next_step, "computes the loss of step 3") &&
                        !strstr(d.findings[0].next_step, "bisect"),
                    "case %zu/%d: %s", i, skipped, d.findings[0].next_step);
      ck_assert_msg((c[i].prec == PROBE_DTYPE_F16) ==
                        (strstr(d.findings[0].next_step, "in FP32") != NULL),
                    "case %zu/%d: %s", i, skipped, d.findings[0].next_step);
      for (int k = 0; k < d.n_findings; k++) { /* not the weights, not the lr */
        ck_assert_int_ne(d.findings[k].id, PROBE_DIAG_FINDING_CHECK_WEIGHTS);
        ck_assert_int_ne(d.findings[k].id, PROBE_DIAG_FINDING_LOWER_LR);
      }
      ck_assert_int_eq(d.verdict, PROBE_VERDICT_DIVERGED);
      char *text = NULL;
      ck_assert_int_eq(probe_diag_render_text(&d, &text), PROBE_OK);
      probe_free(text);
      probe_diag_free(&d);
    }
  unlink(p);
}
END_TEST

/* A weight non-finite at the first step the trace holds: no update had
 * reached it (a checkpoint, the initialisation), so neither "lower the
 * learning rate" nor "a non-finite update reached the weights" (Python
 * audit F5); the same weight going non-finite after updates keeps that
 * finding. In FP32 and FP16 runs. */
START_TEST(test_weights_nonfinite_before_any_update) {
  const char *p = tmp_path("loaded");
  for (int prec = 0; prec < 2; prec++)
    for (int at = 0; at < 2; at++) { /* the bad step: 0, then 3 */
      int bad_step = at ? 3 : 0;
      probe_session *s = hb_open(p, prec ? "fp16" : "fp32");
      int32_t fc = hb_layer(s, "backbone", PROBE_KIND_LINEAR,
                            prec ? PROBE_DTYPE_F16 : PROBE_DTYPE_F32);
      float x[N], w[N];
      for (int i = 0; i < N; i++) x[i] = 0.25f * (float)(i + 1);
      for (int step = 0; step <= bad_step; step++) {
        ck_assert_int_eq(probe_step_begin(s, step), PROBE_OK);
        memcpy(w, x, sizeof w);
        if (step == bad_step) w[2] = INFINITY;
        hb_rec(s, fc, PROBE_SITE_FWD_IN, x, N);
        hb_rec(s, fc, PROBE_SITE_WEIGHT, w, N);
        hb_rec(s, fc, PROBE_SITE_FWD_OUT, w, N);
        hb_end(s, step == bad_step ? INFINITY : 1.0, 1.0);
      }
      ck_assert_int_eq(probe_session_close(s), PROBE_OK);
      probe_diag d;
      probe_diag_of(&d, p);
      ck_assert_int_eq(d.event, PROBE_DIAG_EVENT_WEIGHT_NONFINITE);
      ck_assert_int_eq(d.findings[0].id, PROBE_DIAG_FINDING_CHECK_WEIGHTS);
      int loaded = strstr(d.findings[0].title, "before any update") != NULL;
      ck_assert_msg(loaded == !at, "prec %d at %d: %s", prec, at, d.findings[0].title);
      if (!at) {
        ck_assert_msg(strstr(d.findings[0].next_step, "checkpoint") &&
                          !strstr(d.findings[0].next_step, "lower the learning rate"),
                      "%s", d.findings[0].next_step);
        for (int k = 0; k < d.n_findings; k++)
          ck_assert_int_ne(d.findings[k].id, PROBE_DIAG_FINDING_LOWER_LR);
      }
      probe_diag_free(&d);
    }
  unlink(p);
}
END_TEST

/* Weights whose FP16 copy is inf while the FP32 master the previous step
 * left is finite but beyond 65504: they outgrew FP16 (a learning rate too
 * large for them); no non-finite update reached them, which the finding
 * said (unseen-model audit c07). Controls: no master recorded, or one
 * within FP16's range, keep the old wording. */
static const char *weights_title(const char *p, float master0) {
  probe_session *s = hb_open(p, "fp16");
  int32_t emb = hb_layer(s, "emb", PROBE_KIND_EMBEDDING, PROBE_DTYPE_F16);
  float w[N], m[N];
  for (int step = 0; step < 3; step++) {
    ck_assert_int_eq(probe_step_begin(s, step), PROBE_OK);
    for (int i = 0; i < N; i++) w[i] = m[i] = 0.5f;
    if (step == 1) w[0] = INFINITY;           /* the FP16 copy overflowed */
    hb_rec(s, emb, PROBE_SITE_WEIGHT, w, N);
    hb_rec(s, emb, PROBE_SITE_FWD_OUT, w, N);
    if (step == 0) m[0] = master0;            /* after step 0's update */
    if (isfinite(master0)) /* NaN: no master recorded */
      hb_rec(s, emb, PROBE_SITE_MASTER_WEIGHT, m, N);
    hb_end(s, step == 1 ? INFINITY : 1.0, 1.0);
  }
  ck_assert_int_eq(probe_session_close(s), PROBE_OK);
  static probe_diag d;
  static char title[PROBE_DIAG_TEXT_MAX];
  probe_diag_of(&d, p);
  ck_assert_int_eq(d.event, PROBE_DIAG_EVENT_WEIGHT_NONFINITE);
  ck_assert_int_eq(d.event_step, 1);
  snprintf(title, sizeof title, "%s", d.findings[0].title);
  probe_diag_free(&d);
  return title;
}

START_TEST(test_weights_outgrew_fp16) {
  const char *p = tmp_path("outgrew");
  const char *t = weights_title(p, 2.0e5f);
  ck_assert_msg(strstr(t, "outgrew FP16") && strstr(t, "master weights are finite"), "%s", t);
  t = weights_title(p, NAN);
  ck_assert_msg(!strstr(t, "outgrew") && strstr(t, "non-finite at step 1"), "%s", t);
  t = weights_title(p, 1000.0f);
  ck_assert_msg(!strstr(t, "outgrew"), "%s", t);
  unlink(p);
}
END_TEST

/* Weights changed between steps by something other than the optimizer
 * (Python audit F8: `w.mul_(1e6)` under no_grad between steps): the FP32
 * masters the previous step's update left were finite and within the
 * copy's range, and the weights the next forward used are non-finite. The
 * finding said "a non-finite update reached the weights ... lower the
 * learning rate". The loss climbs and the masters grow (the edit), which
 * made the lr signature too. prec: the layer's; gap: the trace skips the
 * step before the event (a sampled trace: updates unseen, not claimed). */
static void weights_edited_case(probe_diag *d, const char *p, probe_dtype prec,
                                int gap) {
  probe_session *s = hb_open(p, prec == PROBE_DTYPE_F16 ? "fp16" : "fp32");
  int32_t fc = hb_layer(s, "fc", PROBE_KIND_LINEAR, prec);
  float w[N], m[N];
  const int bad = 4;
  for (int step = 0; step <= bad + 1; step++) {
    if (gap && step == bad - 1) continue;
    ck_assert_int_eq(probe_step_begin(s, step), PROBE_OK);
    for (int i = 0; i < N; i++) w[i] = m[i] = 0.5f;
    if (step >= bad) { /* edited: x1e6 in FP32, inf in the FP16 copy */
      for (int i = 0; i < N; i++) m[i] = 5.0e5f;
      for (int i = 0; i < N; i++) w[i] = prec == PROBE_DTYPE_F16 ? INFINITY : 5.0e5f;
      if (prec != PROBE_DTYPE_F16) w[3] = INFINITY; /* FP32: the edit's inf */
    }
    hb_rec(s, fc, PROBE_SITE_WEIGHT, w, N);
    hb_rec(s, fc, PROBE_SITE_FWD_OUT, w, N);
    hb_rec(s, fc, PROBE_SITE_MASTER_WEIGHT, m, N);
    hb_end(s, step >= bad ? INFINITY : 1.0 + 2.0 * step, 1.0);
  }
  ck_assert_int_eq(probe_session_close(s), PROBE_OK);
  probe_diag_of(d, p);
  ck_assert_int_eq(d->event, PROBE_DIAG_EVENT_WEIGHT_NONFINITE);
  ck_assert_int_eq(d->event_step, bad);
}

START_TEST(test_weights_changed_outside_the_optimizer) {
  const char *p = tmp_path("edited");
  probe_dtype precs[] = {PROBE_DTYPE_F16, PROBE_DTYPE_F32};
  for (int k = 0; k < 2; k++) {
    probe_diag d;
    weights_edited_case(&d, p, precs[k], 0);
    const probe_diag_finding *f = &d.findings[0];
    ck_assert_int_eq(f->id, PROBE_DIAG_FINDING_CHECK_WEIGHTS);
    ck_assert_msg(strstr(f->title, "changed outside the optimizer before step 4"),
                  "%d: %s", k, f->title);
    ck_assert_msg(strstr(f->next_step, "between optimizer steps") &&
                      !strstr(f->next_step, "lower the learning rate") &&
                      !strstr(f->next_step, "non-finite update reached"),
                  "%d: %s", k, f->next_step);
    ck_assert_int_eq(f->n_evidence, 2);
    ck_assert_msg(strstr(f->evidence[1], "finite after step 3's update (absmax 0.5") &&
                      strstr(f->evidence[1], "after step 4's update they are absmax 5e+05") &&
                      strstr(f->evidence[1], k ? "FP32 copy" : "FP16 copy"),
                  "%d: %s", k, f->evidence[1]);
    ck_assert_msg(strncmp(d.event_evidence, "changed outside the optimizer: ", 31) == 0,
                  "%s", d.event_evidence);
    for (int i = 0; i < d.n_findings; i++)
      ck_assert_int_ne(d.findings[i].id, PROBE_DIAG_FINDING_LOWER_LR);
    probe_diag_free(&d);
    /* a gap before the event: the updates in it are not in the trace */
    weights_edited_case(&d, p, precs[k], 1);
    for (int i = 0; i < d.n_findings; i++)
      ck_assert_msg(!strstr(d.findings[i].title, "outside the optimizer"), "%d: %s",
                    k, d.findings[i].title);
    ck_assert_msg(!strstr(d.event_evidence, "outside the optimizer"), "%s",
                  d.event_evidence);
    probe_diag_free(&d);
  }
  unlink(p);
}
END_TEST

/* A backward overflow in a run without loss scaling: the gradients were
 * not scaled, and the event no longer says "scaled gradients" (in the
 * text, the JSON and the finding's evidence). */
START_TEST(test_unscaled_gradient_overflow) {
  const char *p = tmp_path("unscaled");
  probe_session *s = hb_open(p, "fp16");
  int32_t fc = hb_layer(s, "fc", PROBE_KIND_LINEAR, PROBE_DTYPE_F16);
  float x[N], g[N];
  for (int i = 0; i < N; i++) x[i] = g[i] = 0.5f;
  for (int step = 0; step < 4; step++) {
    ck_assert_int_eq(probe_step_begin(s, step), PROBE_OK);
    hb_rec(s, fc, PROBE_SITE_FWD_IN, x, N);
    hb_rec(s, fc, PROBE_SITE_FWD_OUT, x, N);
    g[0] = step >= 2 ? INFINITY : 0.5f;
    hb_rec(s, fc, PROBE_SITE_GRAD_OUT, x, N);
    hb_rec(s, fc, PROBE_SITE_GRAD_IN, g, N);
    hb_end(s, 1.0, 1.0); /* a scale of 1 throughout, no scaler events */
  }
  ck_assert_int_eq(probe_session_close(s), PROBE_OK);
  probe_diag d;
  probe_diag_of(&d, p);
  ck_assert_int_eq(d.scaling_on, 0);
  ck_assert_int_eq(d.event, PROBE_DIAG_EVENT_GRAD_OVERFLOW);
  char *text = NULL, *json = NULL;
  ck_assert_int_eq(probe_diag_render_text(&d, &text), PROBE_OK);
  ck_assert_int_eq(probe_diag_render_json(&d, &json), PROBE_OK);
  ck_assert_msg(!strstr(text, "scaled gradients") && strstr(text, "no loss scaling"), "%s", text);
  ck_assert_msg(!strstr(json, "scaled gradients"), "%s", json);
  probe_free(text);
  probe_free(json);
  probe_diag_free(&d);
  unlink(p);
}
END_TEST

/* Every gradient the FP32 loss hands to the FP16 network is below FP16's
 * smallest subnormal (a tiny loss weight, no loss scaling): it flushes to
 * zero at the cast and every FP16 gradient is an exact 0, which looked
 * like legitimate zeros - "healthy" (unseen-model audit c05c). Now
 * enable-loss-scaling, naming the hand-over. Control: the same zeros behind
 * a loss gradient that does not flush stay healthy. */
static probe_diag_finding_id entry_flush_finding(const char *p, float loss_grad, char *ev,
                                                 size_t evl) {
  probe_session *s = hb_open(p, "fp16");
  int32_t fc = hb_layer(s, "fc", PROBE_KIND_LINEAR, PROBE_DTYPE_F16);
  int32_t loss = hb_layer(s, "loss", PROBE_KIND_LOSS, PROBE_DTYPE_F32);
  float x[N], lg[N], zero[N] = {0}, one = 1.0f;
  for (int i = 0; i < N; i++) {
    x[i] = 0.5f + 0.01f * (float)i;
    lg[i] = loss_grad * (1.0f + 0.01f * (float)i);
  }
  for (int step = 0; step < 20; step++) {
    ck_assert_int_eq(probe_step_begin(s, step), PROBE_OK);
    hb_rec(s, fc, PROBE_SITE_FWD_IN, x, N);
    hb_rec(s, fc, PROBE_SITE_FWD_OUT, x, N);
    hb_rec(s, loss, PROBE_SITE_FWD_IN, x, N);
    hb_rec(s, loss, PROBE_SITE_FWD_OUT, &one, 1);
    hb_rec(s, loss, PROBE_SITE_GRAD_IN, lg, N);
    hb_rec(s, fc, PROBE_SITE_GRAD_OUT, zero, N);
    hb_rec(s, fc, PROBE_SITE_GRAD_IN, zero, N);
    hb_rec(s, fc, PROBE_SITE_WEIGHT_GRAD, zero, N);
    hb_end(s, 1e-8, 1.0);
  }
  ck_assert_int_eq(probe_session_close(s), PROBE_OK);
  probe_diag d;
  probe_diag_of(&d, p);
  probe_diag_finding_id id = d.findings[0].id;
  ev[0] = 0;
  for (int k = 0; k < d.findings[0].n_evidence; k++)
    if (strstr(d.findings[0].evidence[k], "smallest subnormal"))
      snprintf(ev, evl, "%s", d.findings[0].evidence[k]);
  probe_diag_free(&d);
  return id;
}

START_TEST(test_gradient_flushed_at_the_handover) {
  const char *p = tmp_path("entryflush");
  char ev[PROBE_DIAG_TEXT_MAX];
  ck_assert_int_eq(entry_flush_finding(p, 1.5e-8f, ev, sizeof ev),
                   PROBE_DIAG_FINDING_ENABLE_LOSS_SCALING);
  ck_assert_msg(strstr(ev, "'loss' hands to 'fc'") && strstr(ev, "in 20 steps"), "%s", ev);
  ck_assert_int_eq(entry_flush_finding(p, 1e-3f, ev, sizeof ev), PROBE_DIAG_FINDING_HEALTHY);
  unlink(p);
}
END_TEST

/* A custom module (kind other) that overflows is a bisect candidate by its
 * name - bisect cannot select the kind `other` - when the name is a safe
 * glob; it was dropped, and bisect got only the other kinds, which could
 * not fix it (unseen-model audit). */
START_TEST(test_custom_module_is_a_candidate_by_name) {
  const char *p = tmp_path("custom");
  static const char *const names[] = {"enc.act_1", "my act;rm -rf"};
  for (int c = 0; c < 2; c++) {
    probe_session *s = hb_open(p, "fp16");
    int32_t lin = hb_layer(s, "fc", PROBE_KIND_LINEAR, PROBE_DTYPE_F16);
    int32_t act = hb_layer(s, names[c], PROBE_KIND_OTHER, PROBE_DTYPE_F16);
    float x[N], y[N];
    for (int step = 0; step < 4; step++) {
      ck_assert_int_eq(probe_step_begin(s, step), PROBE_OK);
      for (int i = 0; i < N; i++) x[i] = y[i] = 1.0f + (float)i;
      if (step == 3) y[0] = y[1] = INFINITY; /* exp() of a finite input */
      hb_rec(s, lin, PROBE_SITE_FWD_OUT, x, N);
      hb_rec(s, act, PROBE_SITE_FWD_IN, x, N);
      hb_rec(s, act, PROBE_SITE_FWD_OUT, y, N);
      hb_end(s, step == 3 ? INFINITY : 1.0, 1024.0);
    }
    ck_assert_int_eq(probe_session_close(s), PROBE_OK);
    probe_diag d;
    probe_diag_of(&d, p);
    ck_assert_str_eq(probe_diag_layer_name(&d, d.origin_layer), names[c]);
    if (c == 0)
      ck_assert_msg(strstr(d.fp32_candidates, "enc.act_1"), "'%s'", d.fp32_candidates);
    else
      ck_assert_msg(!strstr(d.fp32_candidates, "rm"), "'%s'", d.fp32_candidates);
    ck_assert_msg(!strstr(d.fp32_candidates, "other"), "'%s'", d.fp32_candidates);
    probe_diag_free(&d);
    unlink(p);
  }
}
END_TEST

/* One layer of kind `kind` in `prec`, input finite (absmax ~16), whose
 * output (and saved value, for a norm) holds NaN and no inf at step 3. */
static void nan_only_trace(const char *p, probe_kind kind, probe_dtype prec) {
  probe_session *s = hb_open(p, prec == PROBE_DTYPE_BF16 ? "bf16" : "fp16");
  int32_t id = hb_layer(s, "blk.norm", kind, prec);
  float x[N], y[N];
  for (int step = 0; step < 4; step++) {
    ck_assert_int_eq(probe_step_begin(s, step), PROBE_OK);
    for (int i = 0; i < N; i++) x[i] = y[i] = 1.0f + (float)i;
    if (step == 3) y[0] = y[5] = NAN;
    hb_rec(s, id, PROBE_SITE_FWD_IN, x, N);
    if (kind == PROBE_KIND_LAYERNORM)
      hb_rec(s, id, PROBE_SITE_FWD_SAVED, y, N);
    hb_rec(s, id, PROBE_SITE_FWD_OUT, y, N);
    hb_end(s, step == 3 ? NAN : 1.0, 1.0);
  }
  ck_assert_int_eq(probe_session_close(s), PROBE_OK);
}

/* A BF16 layer is judged against BF16's range and named BF16 (a bf16
 * cancellation was "FP16 ...: absmax^2 >= 65504 can overflow FP16"); a
 * NaN-only output from a finite input is a NaN the op made, not "the
 * values overflowed" (unseen-model audit). */
START_TEST(test_precision_and_nan_only_evidence) {
  const char *p = tmp_path("bf16nan");
  const struct { probe_kind kind; probe_dtype prec; const char *label; } cases[] = {
      {PROBE_KIND_LAYERNORM, PROBE_DTYPE_BF16, "BF16"},
      {PROBE_KIND_OTHER, PROBE_DTYPE_F16, "FP16"},
      {PROBE_KIND_LAYERNORM, PROBE_DTYPE_F16, "FP16"}};
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    nan_only_trace(p, cases[c].kind, cases[c].prec);
    probe_diag d;
    probe_diag_of(&d, p);
    ck_assert_int_eq(d.event_step, 3);
    ck_assert_int_eq(d.event, PROBE_DIAG_EVENT_INF_ARITH_NAN);
    ck_assert_msg(strncmp(d.findings[0].title, cases[c].label, 4) == 0, "case %zu: %s", c,
                  d.findings[0].title);
    ck_assert_msg(!strstr(d.event_evidence, "overflowed"), "case %zu: %s", c, d.event_evidence);
    if (cases[c].prec == PROBE_DTYPE_BF16)
      ck_assert_msg(!strstr(d.event_evidence, "FP16") && !strstr(d.event_evidence, "65504"),
                    "%s", d.event_evidence);
    ck_assert_msg(strstr(d.event_evidence, "made the NaN itself"), "case %zu: %s", c,
                  d.event_evidence);
    probe_diag_free(&d);
    unlink(p);
  }
}
END_TEST

/* A NaN (no inf) made of the exact zeros of a layer's finite input - a
 * padding row of zeros divided by its norm, in a BF16 or FP16 run - is not
 * a precision problem: not-precision, no bisect (Python audit F6: "keep it
 * in FP32"). Controls keep force-fp32: zeros that came from flushing
 * (values near FP16's smallest beside them), a low-precision
 * normalisation (its variance can round negative), an input without zeros
 * (a sqrt or log of a negative value). */
static void zeros_nan_trace(const char *p, probe_kind kind, probe_dtype prec,
                            float zero_or_tiny, int zeros) {
  probe_session *s = hb_open(p, prec == PROBE_DTYPE_BF16   ? "bf16"
                                : prec == PROBE_DTYPE_F32 ? "fp32"
                                                          : "fp16");
  int32_t id = hb_layer(s, "enc.norm", kind, prec);
  float x[N], y[N];
  for (int step = 0; step < 4; step++) {
    ck_assert_int_eq(probe_step_begin(s, step), PROBE_OK);
    for (int i = 0; i < N; i++) x[i] = y[i] = 1.0f + (float)i;
    if (zeros == 2) x[3] = 0.0f; /* one zero: fewer than the 4 NaN */
    else if (zeros && zero_or_tiny > 1.0f) x[0] = zero_or_tiny, x[3] = 0.0f;
    else if (zeros) x[0] = x[1] = x[2] = zero_or_tiny, x[3] = 0.0f;
    if (step == 3) y[0] = y[1] = y[2] = y[3] = NAN;
    hb_rec(s, id, PROBE_SITE_FWD_IN, x, N);
    hb_rec(s, id, PROBE_SITE_FWD_OUT, y, N);
    hb_end(s, step == 3 ? NAN : 1.0, 1.0);
  }
  ck_assert_int_eq(probe_session_close(s), PROBE_OK);
}

START_TEST(test_nan_of_exact_zeros_is_not_precision) {
  const char *p = tmp_path("zeronan");
  const struct { probe_kind k; probe_dtype prec; float z; int zeros; int np; } c[] = {
      {PROBE_KIND_OTHER, PROBE_DTYPE_BF16, 0.0f, 1, 1},
      {PROBE_KIND_OTHER, PROBE_DTYPE_F16, 0.0f, 1, 1},
      {PROBE_KIND_SOFTMAX, PROBE_DTYPE_F16, 0.0f, 1, 0},    /* may overflow */
      {PROBE_KIND_ATTENTION, PROBE_DTYPE_BF16, 0.0f, 1, 0}, /* may overflow */
      {PROBE_KIND_OTHER, PROBE_DTYPE_F16, 300.0f, 1, 0}, /* 300^2 >= 65504 */
      {PROBE_KIND_OTHER, PROBE_DTYPE_F32, 0.0f, 1, 1},   /* FP32 run: np */
      {PROBE_KIND_OTHER, PROBE_DTYPE_F16, 1e-7f, 1, 0},     /* flushed */
      /* a norm: more NaN than zeros (a variance that rounded negative) */
      {PROBE_KIND_LAYERNORM, PROBE_DTYPE_BF16, 0.0f, 2, 0},
      {PROBE_KIND_OTHER, PROBE_DTYPE_F16, 0.0f, 0, 0},      /* no zeros */
      /* a norm whose NaN fit in its input's exact zeros: rows of zeros
       * (0/sqrt(0) with an eps of 0), in any precision (hunt d12) */
      {PROBE_KIND_LAYERNORM, PROBE_DTYPE_BF16, 0.0f, 1, 1},
      {PROBE_KIND_LAYERNORM, PROBE_DTYPE_F16, 0.0f, 1, 1},
      {PROBE_KIND_BN, PROBE_DTYPE_F16, 0.0f, 1, 1},
      {PROBE_KIND_LAYERNORM, PROBE_DTYPE_F16, 1e-7f, 1, 0}, /* flushed */
      {PROBE_KIND_LAYERNORM, PROBE_DTYPE_F16, 300.0f, 1, 0}, /* 300^2 */
  };
  for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
    zeros_nan_trace(p, c[i].k, c[i].prec, c[i].z, c[i].zeros);
    probe_diag d;
    probe_diag_of(&d, p);
    ck_assert_int_eq(d.event, PROBE_DIAG_EVENT_INF_ARITH_NAN);
    probe_diag_finding_id want = c[i].np ? PROBE_DIAG_FINDING_NOT_PRECISION
                                         : PROBE_DIAG_FINDING_FORCE_FP32;
    ck_assert_msg(d.findings[0].id == want, "case %zu: %s: %s", i,
                  probe_diag_finding_name(d.findings[0].id), d.findings[0].title);
    if (c[i].np) {
      ck_assert_msg((c[i].prec == PROBE_DTYPE_F32 || strstr(d.findings[0].title, "exact zeros")) &&
                        !strstr(d.findings[0].next_step, "bisect"),
                    "case %zu: %s / %s", i, d.findings[0].title, d.findings[0].next_step);
      for (int k = 0; k < d.n_findings; k++)
        ck_assert_int_ne(d.findings[k].id, PROBE_DIAG_FINDING_FORCE_FP32);
    }
    ck_assert_msg(!strstr(probe_diag_event_desc(d.event), "inf-inf or 0*inf produced"),
                  "%s", probe_diag_event_desc(d.event));
    probe_diag_free(&d);
  }
  unlink(p);
}
END_TEST

/* A module called twice in a step (weight sharing) whose first call
 * overflows: its second call's input is that inf. The first call's output
 * is the origin, in the forward - it was read as the second call's input
 * against the first call's output, rejected, and the NaN master weight
 * after the step blamed ("weight-nonfinite, phase optimizer": unseen-model
 * audit). */
START_TEST(test_shared_module_first_call_overflows) {
  const char *p = tmp_path("shared");
  probe_session *s = hb_open(p, "fp16");
  int32_t id = hb_layer(s, "shared", PROBE_KIND_LINEAR, PROBE_DTYPE_F16);
  float x[N], w[N], y[N], bad[N];
  for (int i = 0; i < N; i++) x[i] = w[i] = y[i] = 0.5f + (float)i / N;
  for (int i = 0; i < N; i++) bad[i] = i < 3 ? INFINITY : 1.0f;
  for (int step = 0; step < 3; step++) {
    int ov = step == 2;
    ck_assert_int_eq(probe_step_begin(s, step), PROBE_OK);
    /* call 1 */
    hb_rec(s, id, PROBE_SITE_FWD_IN, x, N);
    hb_rec(s, id, PROBE_SITE_WEIGHT, w, N);
    hb_rec(s, id, PROBE_SITE_FWD_OUT, ov ? bad : y, N);
    /* call 2, fed the first call's output */
    hb_rec(s, id, PROBE_SITE_FWD_IN, ov ? bad : y, N);
    hb_rec(s, id, PROBE_SITE_WEIGHT, w, N);
    hb_rec(s, id, PROBE_SITE_FWD_OUT, ov ? bad : y, N);
    /* the optimizer made the master weights NaN afterwards */
    hb_rec(s, id, PROBE_SITE_MASTER_WEIGHT, ov ? bad : w, N);
    hb_end(s, ov ? NAN : 1.0, 1.0);
  }
  ck_assert_int_eq(probe_session_close(s), PROBE_OK);
  probe_diag d;
  probe_diag_of(&d, p);
  ck_assert_int_eq(d.event_step, 2);
  ck_assert_int_eq(d.origin_site, PROBE_SITE_FWD_OUT);
  ck_assert_int_eq(d.event_phase, PROBE_PHASE_FORWARD);
  ck_assert_int_eq(d.event, PROBE_DIAG_EVENT_OVERFLOW);
  ck_assert_int_eq(d.have_origin_in, 1);
  ck_assert_uint_eq(probe_stats_nonfinite(&d.origin_in), 0); /* call 1's input */
  probe_diag_free(&d);
  unlink(p);
}
END_TEST

/* A module called more than once in a step (hunt c08 second_call: h =
 * mix(h); h = mix(h * 50)), whose later call overflows on what an earlier
 * call made: that earlier call is its feeder, not the module before the
 * first call (the feeder search skipped every record of the origin's own
 * layer: "fed by inp"), and the origin says which call it was. The trace:
 * input -> inp -> mix x `calls` -> loss; at step 2 the call `bad_call`
 * (1-based, forward order) overflows in the forward (bwd 0) or in the
 * backward (bwd 1: the backward runs mix's calls last first, and its call
 * `bad_call` of the backward overflows). */
static void shared_calls_trace(const char *p, int calls, int bad_call, int bwd) {
  probe_session *s = hb_open(p, "fp16");
  int32_t in = hb_layer(s, "input", PROBE_KIND_INPUT, PROBE_DTYPE_F32);
  int32_t inp = hb_layer(s, "inp", PROBE_KIND_LINEAR, PROBE_DTYPE_F16);
  int32_t mix = hb_layer(s, "mix", PROBE_KIND_LINEAR, PROBE_DTYPE_F16);
  int32_t loss = hb_layer(s, "loss", PROBE_KIND_LOSS, PROBE_DTYPE_F32);
  float x[N], w[N], big[N], bad[N], one[1] = {1.0f}, nan1[1] = {NAN};
  for (int i = 0; i < N; i++) {
    x[i] = w[i] = 0.5f + (float)i / N;
    big[i] = 4000.0f * x[i]; /* finite, but W*big overflows FP16 */
    bad[i] = i < 3 ? INFINITY : 1.0f;
  }
  for (int step = 0; step < 3; step++) {
    int ov = step == 2;
    ck_assert_int_eq(probe_step_begin(s, step), PROBE_OK);
    hb_rec(s, in, PROBE_SITE_FWD_OUT, x, N);
    hb_rec(s, inp, PROBE_SITE_FWD_IN, x, N);
    hb_rec(s, inp, PROBE_SITE_WEIGHT, w, N);
    hb_rec(s, inp, PROBE_SITE_FWD_OUT, x, N);
    int fwd_bad = 0; /* an inf flows forward */
    for (int c = 1; c <= calls; c++) {
      int here = ov && !bwd && c == bad_call;
      /* its input: the call before's output times 50 (an op between) */
      hb_rec(s, mix, PROBE_SITE_FWD_IN, fwd_bad ? bad : here ? big : x, N);
      hb_rec(s, mix, PROBE_SITE_WEIGHT, w, N);
      hb_rec(s, mix, PROBE_SITE_FWD_OUT, fwd_bad || here ? bad : x, N);
      fwd_bad = fwd_bad || here;
    }
    hb_rec(s, loss, PROBE_SITE_FWD_IN, fwd_bad ? bad : x, N);
    hb_rec(s, loss, PROBE_SITE_FWD_OUT, fwd_bad ? nan1 : one, 1);
    /* backward, in reverse: mix's last forward call first */
    hb_rec(s, loss, PROBE_SITE_GRAD_OUT, one, 1);
    hb_rec(s, loss, PROBE_SITE_GRAD_IN, fwd_bad ? bad : x, N);
    int bwd_bad = fwd_bad;
    for (int c = 1; c <= calls; c++) { /* c: the backward's call */
      int here = ov && bwd && c == bad_call;
      int fed_big = ov && bwd && c == bad_call - 1;
      hb_rec(s, mix, PROBE_SITE_GRAD_OUT, bwd_bad ? bad : here ? big : x, N);
      hb_rec(s, mix, PROBE_SITE_GRAD_IN, bwd_bad || here ? bad : fed_big ? big : x, N);
      bwd_bad = bwd_bad || here;
    }
    hb_rec(s, mix, PROBE_SITE_WEIGHT_GRAD, bwd_bad ? bad : x, N);
    hb_rec(s, inp, PROBE_SITE_GRAD_OUT, bwd_bad ? bad : x, N);
    hb_rec(s, inp, PROBE_SITE_WEIGHT_GRAD, bwd_bad ? bad : x, N);
    hb_rec(s, inp, PROBE_SITE_GRAD_IN, bwd_bad ? bad : x, N);
    hb_end(s, fwd_bad ? NAN : 1.0, 1.0);
  }
  ck_assert_int_eq(probe_session_close(s), PROBE_OK);
}

/* The post-mortem of shared_calls_trace: the origin mix at `site` in
 * `phase`, its call `call` of `calls`, fed by mix's call `feeder_call`;
 * `call_line` and `fed_line` are in the text; the JSON says the same. */
static void check_shared_call(const char *p, probe_site site, probe_phase phase,
                              int call, int calls, int feeder_call,
                              const char *call_line, const char *fed_line) {
  probe_diag d;
  probe_diag_of(&d, p);
  ck_assert_int_eq(d.event_step, 2);
  ck_assert_str_eq(probe_diag_layer_name(&d, d.origin_layer), "mix");
  ck_assert_int_eq(d.origin_site, site);
  ck_assert_int_eq(d.event_phase, phase);
  ck_assert_msg(d.feeder_layer == d.origin_layer, "fed by %s",
                d.feeder_layer >= 0 ? probe_diag_layer_name(&d, d.feeder_layer)
                                    : "nothing");
  ck_assert_int_eq(d.origin_call, call);
  ck_assert_int_eq(d.origin_calls, calls);
  ck_assert_int_eq(d.feeder_call, feeder_call);
  ck_assert_int_eq(d.feeder_calls, calls);
  char *text = NULL;
  ck_assert_int_eq(probe_diag_render_text(&d, &text), PROBE_OK);
  ck_assert_msg(strstr(text, call_line), "no '%s' in:\n%s", call_line, text);
  ck_assert_msg(strstr(text, fed_line), "no '%s' in:\n%s", fed_line, text);
  probe_free(text);
  json_t *j = diag_json(&d);
  json_t *ev = json_object_get(j, "event");
  ck_assert_str_eq(json_string_value(json_object_get(ev, "fed_by")), "mix");
  ck_assert_int_eq(json_integer_value(json_object_get(ev, "fed_by_call")),
                   feeder_call);
  ck_assert_int_eq(json_integer_value(json_object_get(ev, "fed_by_calls")), calls);
  ck_assert(json_is_true(json_object_get(ev, "fed_by_own_call")));
  ck_assert_int_eq(json_integer_value(json_object_get(ev, "origin_call")), call);
  ck_assert_int_eq(json_integer_value(json_object_get(ev, "origin_calls")), calls);
  json_decref(j);
  probe_diag_free(&d);
  unlink(p);
}

START_TEST(test_shared_module_second_call_fed_by_first) {
  const char *p = tmp_path("call2");
  shared_calls_trace(p, 2, 2, 0);
  check_shared_call(p, PROBE_SITE_FWD_OUT, PROBE_PHASE_FORWARD, 2, 2, 1,
                    "  call        2 of 2 of mix in this step's forward\n",
                    "  fed by      mix (linear), its own call 1 of 2 in this "
                    "step's forward\n");
}
END_TEST

/* The backward's call 2 (the forward's call 1) overflows on the gradient
 * the backward's call 1 (the forward's call 2) handed it. */
START_TEST(test_shared_module_backward_call_fed_by_previous) {
  const char *p = tmp_path("bcall2");
  shared_calls_trace(p, 2, 2, 1);
  check_shared_call(p, PROBE_SITE_GRAD_IN, PROBE_PHASE_BACKWARD, 2, 2, 1,
                    "  call        2 of 2 of mix in this step's backward (the "
                    "backward runs the calls last first)\n",
                    "  fed by      mix (linear), its own call 1 of 2 in this "
                    "step's backward\n");
}
END_TEST

START_TEST(test_shared_module_third_call_fed_by_second) {
  const char *p = tmp_path("call3");
  shared_calls_trace(p, 3, 3, 0);
  check_shared_call(p, PROBE_SITE_FWD_OUT, PROBE_PHASE_FORWARD, 3, 3, 2,
                    "  call        3 of 3 of mix in this step's forward\n",
                    "  fed by      mix (linear), its own call 2 of 3 in this "
                    "step's forward\n");
}
END_TEST

/* Control: a module called once - the text is as it was (no call line, the
 * feeder by name and kind only). */
START_TEST(test_single_call_text_unchanged) {
  const char *p = tmp_path("call1");
  shared_calls_trace(p, 1, 1, 0);
  probe_diag d;
  probe_diag_of(&d, p);
  ck_assert_int_eq(d.event_step, 2);
  ck_assert_str_eq(probe_diag_layer_name(&d, d.origin_layer), "mix");
  ck_assert_int_eq(d.origin_site, PROBE_SITE_FWD_OUT);
  ck_assert_str_eq(probe_diag_layer_name(&d, d.feeder_layer), "inp");
  char *text = NULL;
  ck_assert_int_eq(probe_diag_render_text(&d, &text), PROBE_OK);
  ck_assert_msg(strstr(text, "  fed by      inp (linear)\n"), "%s", text);
  ck_assert_msg(!strstr(text, "  call        "), "%s", text);
  ck_assert_msg(!strstr(text, "its own call"), "%s", text);
  probe_free(text);
  json_t *j = diag_json(&d);
  json_t *ev = json_object_get(j, "event");
  ck_assert_str_eq(json_string_value(json_object_get(ev, "fed_by")), "inp");
  json_decref(j);
  probe_diag_free(&d);
  unlink(p);
}
END_TEST

START_TEST(test_warmup_backoffs_are_healthy) {
  const char *p = tmp_path("warm");
  tb t;
  tb_open(&t, p, 0);
  double scale = 65536;
  for (int s = 0; s < 20; s++) {
    spec sp = {.grad_inf = s < 3};
    scal sc = clean(2.0 - 0.01 * s, scale);
    tb_step(&t, s, &sp, &sc);
    if (s < 3) {
      scaler_event(&t, s, PROBE_SCALER_BACKOFF, scale, scale / 2);
      scale /= 2;
    }
  }
  ck_assert_int_eq(probe_session_close(t.s), PROBE_OK);
  probe_diag d;
  probe_diag_of(&d, p);
  ck_assert_int_eq(d.event, PROBE_DIAG_EVENT_NONE);
  ck_assert_int_eq(d.first_grad_overflow_step, 0);
  ck_assert_int_eq(d.backoffs, 3);
  ck_assert_int_eq(d.late_backoffs, 0);
  ck_assert_int_eq(d.skipped_steps, 3);
  ck_assert_int_eq(d.longest_skip_run, 3);
  ck_assert_int_eq(d.n_backoff_detail, 3);
  ck_assert_int_eq(d.backoff_detail[0].n_layers, 1);
  ck_assert_str_eq(probe_diag_layer_name(&d, d.backoff_detail[0].layers[0]),
                   "enc.lin1");
  ck_assert_int_eq(d.findings[0].id, PROBE_DIAG_FINDING_HEALTHY);
  probe_diag_free(&d);
  unlink(p);
}
END_TEST

START_TEST(test_scale_collapse) {
  const char *p = tmp_path("collapse");
  tb t;
  tb_open(&t, p, 0);
  double scale = 65536;
  for (int s = 0; s < 40; s++) {
    spec sp = {.grad_inf = s >= 5};
    scal sc = clean(1.0, scale);
    tb_step(&t, s, &sp, &sc);
    if (s >= 5) {
      scaler_event(&t, s, PROBE_SCALER_BACKOFF, scale, scale / 2);
      scale /= 2;
    }
  }
  ck_assert_int_eq(probe_session_close(t.s), PROBE_OK);
  probe_diag d;
  probe_diag_of(&d, p);
  ck_assert_int_eq(d.scale_collapsed, 1);
  ck_assert_int_eq(d.event, PROBE_DIAG_EVENT_GRAD_OVERFLOW);
  ck_assert_int_eq(d.event_step, 5);
  ck_assert_int_eq(d.event_phase, PROBE_PHASE_BACKWARD);
  ck_assert_str_eq(probe_diag_layer_name(&d, d.origin_layer), "enc.lin1");
  ck_assert_int_eq(d.longest_skip_run, 35);
  ck_assert_int_eq(d.layers[L_LIN].backoff_steps, 35);
  ck_assert_int_eq(probe_diag_problem(&d), 1);
  probe_diag_free(&d);
  unlink(p);
}
END_TEST

START_TEST(test_clip_before_unscale_signature) {
  const char *p = tmp_path("clip");
  tb t;
  tb_open(&t, p, 0);
  double scale = 65536;
  for (int s = 0; s < 40; s++) {
    spec sp = {0};
    /* the clipper sees scaled norms: norm = scale * 0.7 */
    scal sc = {.loss = 1.0 + 0.1 * s, .scale = scale,
               .grad_norm = scale * 0.7, .clip_threshold = 1.0,
               .clip_coef = 1.0 / (scale * 0.7)};
    tb_step(&t, s, &sp, &sc);
    if (s % 8 == 7) {
      scaler_event(&t, s, PROBE_SCALER_GROWTH, scale, scale * 2);
      scale *= 2;
    }
  }
  ck_assert_int_eq(probe_session_close(t.s), PROBE_OK);
  probe_diag d;
  probe_diag_of(&d, p);
  ck_assert_int_eq(d.clipping_on, 1);
  ck_assert_int_eq(d.clip_scaled_signature, 1);
  ck_assert(d.corr_norm_scale > 0.99);
  ck_assert_double_eq_tol(d.norm_over_scale, 0.7, 1e-6);
  ck_assert_int_eq(d.findings[0].id, PROBE_DIAG_FINDING_FIX_CLIP_ORDER);
  probe_diag_free(&d);
  unlink(p);
}
END_TEST

/* The norm the clipper saw against the recorded weight gradients (which
 * carry the loss scale): a scale below 1 that keeps falling while the
 * gradients grow, as when clipping before unscaling lets updates through
 * 1/scale times the threshold. The norms do not track the scale (their
 * correlation is negative), but each equals the recorded norm: clipping saw
 * scaled gradients. With grad_norm = recorded norm / scale (unscaled first)
 * the same trace has no signature. */
static double wgrad_norm(float g) { /* two weight_grad records of rec() */
  double sq = 0;
  for (int i = 0; i < N; i++) {
    double v = (double)(float)(g * (0.5f + (float)i / N));
    sq += v * v;
  }
  return sqrt(2 * sq);
}

START_TEST(test_clip_norm_against_records) {
  for (int misordered = 1; misordered >= 0; misordered--) {
    const char *p = tmp_path(misordered ? "clipcmp1" : "clipcmp0");
    tb t;
    tb_open(&t, p, 0);
    double scale = 0.25, truth = 1e4;
    for (int s = 0; s < 30; s++) {
      if (s > 0 && s % 5 == 0) {
        scaler_event(&t, s, PROBE_SCALER_BACKOFF, scale, scale / 2);
        scale /= 2;
        truth *= 4;
      }
      spec sp = {0};
      sp.grad_mag = (float)(scale * truth); /* recorded: scaled gradients */
      double rn = wgrad_norm(sp.grad_mag);
      double norm = misordered ? rn : rn / scale;
      scal sc = {.loss = 1.0, .scale = scale, .grad_norm = norm,
                 .clip_threshold = 1.0, .clip_coef = 1.0 / norm};
      tb_step(&t, s, &sp, &sc);
    }
    ck_assert_int_eq(probe_session_close(t.s), PROBE_OK);
    probe_diag d;
    probe_diag_of(&d, p);
    ck_assert_int_eq(d.clip_norm_steps, 30);
    ck_assert_int_eq(d.clip_norm_scaled_steps, misordered ? 30 : 0);
    ck_assert_int_eq(d.clip_scaled_signature, misordered);
    if (misordered) {
      ck_assert(d.corr_norm_scale < 0); /* pass 1 alone would miss it */
      ck_assert_int_eq(d.findings[0].id, PROBE_DIAG_FINDING_FIX_CLIP_ORDER);
    } else {
      for (int i = 0; i < d.n_findings; i++)
        ck_assert_int_ne(d.findings[i].id, PROBE_DIAG_FINDING_FIX_CLIP_ORDER);
    }
    probe_diag_free(&d);
    unlink(p);
  }
}
END_TEST

START_TEST(test_correct_clip_order_no_signature) {
  const char *p = tmp_path("clipok");
  tb t;
  tb_open(&t, p, 0);
  for (int s = 0; s < 30; s++) {
    spec sp = {0};
    double norm = 0.5 + 1.0 * (s % 3);
    scal sc = {.loss = 1.0, .scale = 65536.0 * (s < 15 ? 1 : 2),
               .grad_norm = norm, .clip_threshold = 1.0,
               .clip_coef = norm > 1 ? 1.0 / norm : 1.0};
    tb_step(&t, s, &sp, &sc);
  }
  ck_assert_int_eq(probe_session_close(t.s), PROBE_OK);
  probe_diag d;
  probe_diag_of(&d, p);
  ck_assert_int_eq(d.clip_scaled_signature, 0);
  ck_assert_double_eq_tol(d.max_clip_ratio, 2.5, 1e-9);
  ck_assert_int_eq(d.findings[0].id, PROBE_DIAG_FINDING_HEALTHY);
  probe_diag_free(&d);
  unlink(p);
}
END_TEST

START_TEST(test_no_loss_scale_underflow) {
  const char *p = tmp_path("uflow");
  tb t;
  tb_open(&t, p, 0);
  for (int s = 0; s < 20; s++) {
    spec sp = {.grad_mag = 1e-6f}; /* below 2^-14: subnormal in FP16 */
    scal sc = clean(1.0, 1.0);
    tb_step(&t, s, &sp, &sc);
  }
  ck_assert_int_eq(probe_session_close(t.s), PROBE_OK);
  probe_diag d;
  probe_diag_of(&d, p);
  ck_assert_int_eq(d.scaling_on, 0);
  ck_assert(d.worst_underflow_frac > 0.5);
  ck_assert_int_eq(d.findings[0].id, PROBE_DIAG_FINDING_ENABLE_LOSS_SCALING);
  probe_diag_free(&d);
  unlink(p);
}
END_TEST

/* A loss scale below 1 shrinks the gradients: underflow with such a
 * scale is reported like underflow without scaling (it said "healthy,
 * nothing to fix" with 85-97% of the gradients subnormal: unseen-model
 * audit); a scale of 2^10 with the same gradients is not. */
START_TEST(test_scale_below_one_underflow) {
  const char *p = tmp_path("uflow_small");
  const double scales[2] = {0x1p-6, 1024.0};
  for (int c = 0; c < 2; c++) {
    tb t;
    tb_open(&t, p, 0);
    for (int s = 0; s < 20; s++) {
      spec sp = {.grad_mag = c == 0 ? 1e-6f : 0.01f};
      scal sc = clean(1.0, scales[c]);
      tb_step(&t, s, &sp, &sc);
    }
    ck_assert_int_eq(probe_session_close(t.s), PROBE_OK);
    probe_diag d;
    probe_diag_of(&d, p);
    ck_assert_int_eq(d.scaling_on, 1);
    if (c == 0) {
      ck_assert_int_eq(d.findings[0].id, PROBE_DIAG_FINDING_ENABLE_LOSS_SCALING);
      ck_assert_msg(strstr(d.findings[0].title, "below 1"), "%s", d.findings[0].title);
      ck_assert_int_eq(d.verdict, PROBE_VERDICT_DEGRADED);
    } else {
      ck_assert_int_eq(d.verdict, PROBE_VERDICT_HEALTHY);
    }
    probe_diag_free(&d);
    unlink(p);
  }
}
END_TEST

START_TEST(test_fp32_divergence_is_lr) {
  const char *p = tmp_path("lr");
  tb t;
  tb_open(&t, p, 1);
  for (int s = 0; s < 10; s++) {
    spec sp = {.weight_mag = 0.5f * (float)(1 << s), .lin_out_inf = s == 9};
    scal sc = clean(1.0 * (1 << s), 1.0);
    tb_step(&t, s, &sp, &sc);
  }
  ck_assert_int_eq(probe_session_close(t.s), PROBE_OK);
  probe_diag d;
  probe_diag_of(&d, p);
  ck_assert_int_eq(d.fp32_run, 1);
  ck_assert_int_eq(d.findings[0].id, PROBE_DIAG_FINDING_LOWER_LR);
  probe_diag_free(&d);
  unlink(p);
}
END_TEST

/* A loss that fell 10x and then met an overflow is not an lr problem. */
START_TEST(test_falling_loss_is_not_lr) {
  const char *p = tmp_path("fall");
  tb t;
  tb_open(&t, p, 0);
  for (int s = 0; s < 12; s++) {
    spec sp = {.bn_var_inf = s == 11, .weight_mag = 0.5f + 0.1f * (float)s};
    scal sc = clean(10.0 / (1.0 + (double)s), 65536);
    tb_step(&t, s, &sp, &sc);
  }
  ck_assert_int_eq(probe_session_close(t.s), PROBE_OK);
  probe_diag d;
  probe_diag_of(&d, p);
  ck_assert_double_eq_tol(d.loss_rise, 1.0, 1e-12);
  ck_assert_int_eq(d.findings[0].id, PROBE_DIAG_FINDING_FORCE_FP32);
  for (int i = 0; i < d.n_findings; i++)
    ck_assert_int_ne(d.findings[i].id, PROBE_DIAG_FINDING_LOWER_LR);
  probe_diag_free(&d);
  unlink(p);
}
END_TEST

START_TEST(test_killed_writer) {
  const char *p = tmp_path("killed");
  pid_t pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) {
    tb t;
    tb_open(&t, p, 0);
    for (int s = 0; s < 25; s++) {
      spec sp = {.bn_var_inf = s >= 20};
      scal sc = clean(1.0, 65536);
      tb_step(&t, s, &sp, &sc);
    }
    probe_session_flush(t.s);
    raise(SIGKILL);
    _exit(0);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  ck_assert(WIFSIGNALED(status));
  probe_diag d;
  probe_diag_of(&d, p);
  ck_assert_int_eq(d.complete, 0);
  ck_assert_int_eq(d.last_step, 24);
  ck_assert_int_eq(d.event, PROBE_DIAG_EVENT_REDUCTION_OVERFLOW);
  ck_assert_int_eq(d.event_step, 20);
  ck_assert_str_eq(probe_diag_layer_name(&d, d.origin_layer), "enc.bn1");
  probe_diag_free(&d);
  unlink(p);
}
END_TEST

/* A trace with no step is "no-steps", degraded, not healthy: closed with
 * none, and killed (flushed, unclosed) before the first step ended (a run
 * out of disk left such a trace, which read "healthy ... over 0 steps"). */
START_TEST(test_no_steps_is_not_healthy) {
  const char *p = tmp_path("nosteps");
  for (int killed = 0; killed < 2; killed++) {
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
      tb t;
      tb_open(&t, p, 0);
      probe_session_flush(t.s);
      if (killed) raise(SIGKILL);
      _exit(probe_session_close(t.s) == PROBE_OK ? 0 : 1);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    ck_assert(killed ? WIFSIGNALED(status) : WIFEXITED(status) && WEXITSTATUS(status) == 0);
    probe_diag d;
    probe_diag_of(&d, p);
    ck_assert_int_eq(d.complete, !killed);
    ck_assert_int_eq(d.n_steps, 0);
    ck_assert_int_eq(d.verdict, PROBE_VERDICT_DEGRADED);
    ck_assert_int_ge(d.n_findings, 1);
    ck_assert_int_eq(d.findings[0].id, PROBE_DIAG_FINDING_NO_STEPS);
    for (int i = 0; i < d.n_findings; i++)
      ck_assert_int_ne(d.findings[i].id, PROBE_DIAG_FINDING_HEALTHY);
    ck_assert_ptr_nonnull(strstr(d.findings[0].evidence[0], killed ? "not closed" : "closed with 0"));
    probe_diag_free(&d);
    unlink(p);
  }
}
END_TEST

START_TEST(test_json_has_no_nan) {
  const char *p = tmp_path("json");
  tb t;
  tb_open(&t, p, 0);
  for (int s = 0; s < 6; s++) {
    spec sp = {.bn_var_inf = s >= 2};
    scal sc = clean(1.0, 65536);
    tb_step(&t, s, &sp, &sc);
  }
  ck_assert_int_eq(probe_session_close(t.s), PROBE_OK);
  probe_diag d;
  probe_diag_of(&d, p);
  json_t *j = diag_json(&d);
  char *txt = json_dumps(j, 0);
  ck_assert_ptr_nonnull(txt);
  json_error_t err;
  json_t *back = json_loads(txt, 0, &err);
  ck_assert_ptr_nonnull(back);
  ck_assert_str_eq(json_string_value(json_object_get(
                       json_object_get(back, "event"), "origin_layer")),
                   "enc.bn1");
  ck_assert_str_eq(json_string_value(json_object_get(
                       json_array_get(json_object_get(back, "diagnosis"), 0),
                       "id")),
                   "force-fp32");
  free(txt);
  json_decref(j);
  json_decref(back);
  probe_diag_free(&d);
  unlink(p);
}
END_TEST


/* Names from files are data (issue 17.5): the escaping helper. */
START_TEST(test_text_escape) {
  char b[64];
  ck_assert_uint_eq(probe_text_escape(b, sizeof b, "enc.fc1"), 7);
  ck_assert_str_eq(b, "enc.fc1");
  probe_text_escape(b, sizeof b, "a\nb\rc\td\a\x1b[2J\\");
  ck_assert_str_eq(b, "a\\nb\\rc\\td\\a\\e[2J\\\\");
  probe_text_escape(b, sizeof b, "caf\xc3\xa9"); /* valid UTF-8 passes */
  ck_assert_str_eq(b, "caf\xc3\xa9");
  probe_text_escape(b, sizeof b, "x\xff\xc3"); /* invalid bytes */
  ck_assert_str_eq(b, "x\\xff\\xc3");
  probe_text_escape(b, sizeof b, "\xc2\x9b" "2J"); /* C1 CSI */
  ck_assert_str_eq(b, "\\u009b2J");
  /* bidi controls reorder the text after them: escaped like C1 (they
   * passed as valid UTF-8, "enc.fc1" U+202E "1cf.daeh" showed reversed) */
  probe_text_escape(b, sizeof b, "fc1\xe2\x80\xae" "1cf");
  ck_assert_str_eq(b, "fc1\\u202e1cf");
  probe_text_escape(b, sizeof b, "\xe2\x80\xaa\xe2\x80\xab\xe2\x80\xac\xe2\x80\xad");
  ck_assert_str_eq(b, "\\u202a\\u202b\\u202c\\u202d");
  probe_text_escape(b, sizeof b, "a\xe2\x81\xa6" "b\xe2\x81\xa7\xe2\x81\xa8\xe2\x81\xa9");
  ck_assert_str_eq(b, "a\\u2066b\\u2067\\u2068\\u2069");
  probe_text_escape(b, sizeof b, "\xe2\x80\x8e\xe2\x80\x8f\xd8\x9c");
  ck_assert_str_eq(b, "\\u200e\\u200f\\u061c");
  ck_assert(probe_text_needs_escape("x\xe2\x80\x8f"));
  /* their neighbours are characters: kept (U+2010 hyphen, U+2030 per
   * mille, U+2065, U+206A, U+061B Arabic semicolon, U+200D ZWJ) */
  const char *kept = "\xe2\x80\x90\xe2\x80\xb0\xe2\x81\xa5\xe2\x81\xaa\xd8\x9b\xe2\x80\x8d";
  ck_assert_uint_eq(probe_text_escape(b, sizeof b, kept), strlen(kept));
  ck_assert_str_eq(b, kept);
  /* truncation keeps the terminator and reports the full length */
  char s[5];
  ck_assert_uint_eq(probe_text_escape(s, sizeof s, "\n\n\n"), 6);
  ck_assert_uint_eq(strlen(s), 4);
  /* ... and cuts between whole units: never half a character or escape */
  ck_assert_uint_eq(probe_text_escape(s, 4, "ab\xc3\xa9"), 4);
  ck_assert_str_eq(s, "ab");
  ck_assert_uint_eq(probe_text_escape(s, 5, "ab\xc3\xa9\xc3\xa9"), 6);
  ck_assert_str_eq(s, "ab\xc3\xa9");
  probe_text_escape(s, 4, "a\x01");
  ck_assert_str_eq(s, "a");
  probe_text_escape(s, 5, "a\xe2\x82\xac"); /* a 3-byte character */
  ck_assert_str_eq(s, "a\xe2\x82\xac");
  probe_text_escape(s, 4, "a\xe2\x82\xac");
  ck_assert_str_eq(s, "a");
  probe_text_escape(s, 4, "ab\xe2\x82\xac");
  ck_assert_str_eq(s, "ab");
  probe_text_escape(s, 5, "a\xc2\x9b"); /* a C1 escape is 6 bytes */
  ck_assert_str_eq(s, "a");
  ck_assert(probe_text_needs_escape("a\x1b"));
  ck_assert(!probe_text_needs_escape("enc.bn1"));
}
END_TEST

/* The one shell quoting of printed commands and stored command lines. */
START_TEST(test_shell_quote) {
  char b[64];
  ck_assert_uint_eq(probe_shell_quote(b, sizeof b, "revin,softmax"), 13);
  ck_assert_str_eq(b, "revin,softmax"); /* a safe word stays as it is */
  probe_shell_quote(b, sizeof b, "my cfg.json");
  ck_assert_str_eq(b, "'my cfg.json'");
  probe_shell_quote(b, sizeof b, "it's");
  ck_assert_str_eq(b, "'it'\"'\"'s'"); /* no backslash: escaping keeps it */
  probe_shell_quote(b, sizeof b, "");
  ck_assert_str_eq(b, "''");
  probe_shell_quote(b, sizeof b, "$(touch x)");
  ck_assert_str_eq(b, "'$(touch x)'");
  probe_shell_quote(b, sizeof b, "*.h5");
  ck_assert_str_eq(b, "'*.h5'");
  /* too short: "" (never an unclosed quote), and the length it needs */
  ck_assert_uint_eq(probe_shell_quote(b, 5, "a b c"), 7);
  ck_assert_str_eq(b, "");
  ck_assert_uint_eq(probe_shell_quote(NULL, 0, "it's"), 10);
}
END_TEST

/* libprobe/analysis/diagnose-impl.h (internal): the rerun command's parts
 * from a trace's config and stored command line. */
void probe__diag_read_config(probe_diag *d, const char *config_json,
                             const char *command_line);

/* The stored command line is read back word by word as a shell reads it
 * (run stores each argument quoted; the Python package stores shlex.join),
 * and what is printed from it is quoted again: a config file with a space
 * stays whole, a $(...) from a crafted trace is a quoted word, not a
 * substitution. A line of an older run (unquoted) reads as before. */
START_TEST(test_stored_command_is_data) {
  static probe_diag d; /* large */
  const char *cfg = "{\"name\": \"revin-overflow\", \"steps\": 150, \"seed\": 1}";
  probe__diag_read_config(&d, cfg, "ampprobe run --config 'my cfg.json' -q");
  ck_assert_str_eq(d.cfg_source, "--config 'my cfg.json'");
  probe__diag_read_config(&d, cfg, "ampprobe run --config=\"it's.json\"");
  ck_assert_str_eq(d.cfg_source, "--config 'it'\"'\"'s.json'");
  probe__diag_read_config(&d, cfg, "ampprobe run --config old.json --trace");
  ck_assert_str_eq(d.cfg_source, "--config old.json");
  probe__diag_read_config(&d, cfg,
                          "ampprobe run --scenario $(touch${IFS}/tmp/PWNED) --trace");
  ck_assert_str_eq(d.cfg_source, "--scenario '$(touch${IFS}/tmp/PWNED)'");
  /* a value that cannot be pasted as text (a control character): left out */
  probe__diag_read_config(&d, cfg, "ampprobe run --config 'a\nb.json'");
  ck_assert_str_eq(d.cfg_source, "--config CONFIG.json");
  /* no option: the config's name, quoted too */
  probe__diag_read_config(&d, "{\"name\": \"a b;c\"}", "ampprobe run");
  ck_assert_str_eq(d.cfg_source, "--scenario 'a b;c'");
  /* an external job's command: shlex.join's words kept, anything else a
   * quoted word (no substitution, no second command) */
  probe__diag_read_config(&d, "{\"framework\": \"pytorch\", \"command\": "
                              "\"/usr/bin/python3 'my train.py' --lr 0.1\"}", NULL);
  ck_assert_str_eq(d.cfg_command, "/usr/bin/python3 'my train.py' --lr 0.1");
  probe__diag_read_config(&d, "{\"framework\": \"pytorch\", \"command\": "
                              "\"python t.py; touch x $(id)\"}", NULL);
  ck_assert_str_eq(d.cfg_command, "python 't.py;' touch x '$(id)'");
  /* a word that would be shown escaped (an ESC, a newline, a backslash,
   * bytes that are not UTF-8): pasted as shown it is another argument, so
   * the placeholder, as for a --config that cannot be pasted */
  static const char *const unpasteable[] = {
      "{\"framework\": \"pytorch\", \"command\": \"python t.py \\u001b[2J\"}",
      "{\"framework\": \"pytorch\", \"command\": \"python 'a\\nb.py'\"}",
      "{\"framework\": \"pytorch\", \"command\": \"python 'a\\\\b.py'\"}",
      "{\"framework\": \"pytorch\", \"command\": \"python \\u202ey.py\"}",
  };
  for (size_t i = 0; i < sizeof unpasteable / sizeof unpasteable[0]; i++) {
    probe__diag_read_config(&d, unpasteable[i], NULL);
    ck_assert_msg(!strcmp(d.cfg_command, "YOUR TRAINING COMMAND"), "%s: %s",
                  unpasteable[i], d.cfg_command);
  }
  /* the stored command line, when the config has none: the same rule */
  probe__diag_read_config(&d, "{\"framework\": \"pytorch\"}",
                          "python t.py --name '\x1b[31m'");
  ck_assert_str_eq(d.cfg_command, "YOUR TRAINING COMMAND");
  /* longer than cfg_command: whole words that fit, never a cut one */
  char cmd[1400] = "{\"framework\": \"pytorch\", \"command\": \"python";
  for (int i = 0; i < 100; i++) strcat(cmd, " 'a b c d e'");
  strcat(cmd, "\"}");
  probe__diag_read_config(&d, cmd, NULL);
  size_t n = strlen(d.cfg_command);
  ck_assert_uint_lt(n, sizeof d.cfg_command);
  ck_assert_msg(n >= 12 && !strcmp(d.cfg_command + n - 12, " 'a b c d e'"),
                "cut: ...%s", d.cfg_command + (n > 20 ? n - 20 : 0));
}
END_TEST

/* steps and seed are read only as whole numbers a run can have: a double
 * past int64's range was cast (undefined), 1.9 became --steps 1, a
 * negative seed was passed on. */
START_TEST(test_config_counts_are_whole_numbers) {
  static probe_diag d; /* large */
  static const struct {
    const char *json;
    long long steps, seed;
  } cases[] = {
      {"{\"steps\": 150, \"seed\": 7}", 150, 7},
      {"{\"steps\": 0, \"seed\": 0}", 0, 0},
      {"{\"steps\": 9007199254740992, \"seed\": 1}", 9007199254740992LL, 1},
      {"{\"steps\": 1.9, \"seed\": 2.5}", -1, -1},
      {"{\"steps\": 1e300, \"seed\": -1e300}", -1, -1},
      {"{\"steps\": 9223372036854775808, \"seed\": 18446744073709551616}", -1, -1},
      {"{\"steps\": -3, \"seed\": -1}", -1, -1},
      {"{\"steps\": \"150\", \"seed\": true}", -1, -1},
      {"{\"steps\": 1.0e2, \"seed\": 3e0}", 100, 3},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    probe__diag_read_config(&d, cases[i].json, "ampprobe run --scenario unit");
    ck_assert_msg(d.cfg_steps == cases[i].steps && d.cfg_seed == cases[i].seed,
                  "%s: steps %lld seed %lld", cases[i].json,
                  (long long)d.cfg_steps, (long long)d.cfg_seed);
  }
}
END_TEST

/* A layer name holding a newline, ESC, BEL and CR: printed escaped in the
 * text and the JSON, and a newline cannot forge a "verdict" line. */
START_TEST(test_hostile_names) {
  const char *p = tmp_path("hostile");
  static const char *names[4] = {"input", "enc.fc\nverdict     healthy",
                                 "bn\x1b[2J\a\rX", "loss"};
  static const probe_kind kinds[4] = {PROBE_KIND_INPUT, PROBE_KIND_LINEAR,
                                      PROBE_KIND_BN, PROBE_KIND_LOSS};
  probe_options o;
  probe_options_init(&o);
  o.mode = PROBE_MODE_FULL;
  o.config_json = "{\"name\": \"evil\\nverdict healthy\"}";
  o.precision_policy = "fp16";
  probe_session *ss = NULL;
  ck_assert_int_eq(probe_session_open(&ss, p, &o), PROBE_OK);
  int32_t id[4];
  for (int i = 0; i < 4; i++) {
    probe_status st = probe_layer_register(
        ss, names[i], kinds[i], i == 0 || i == 3 ? PROBE_DTYPE_F32 : PROBE_DTYPE_F16,
        &id[i]);
    if (st != PROBE_OK) {
      /* a writer that refuses such names is fine too: nothing to print */
      fprintf(stderr, "test_hostile_names: the writer refuses '%s' (%s); "
                      "the reader side is not exercised\n",
              i == 1 ? "enc.fc\\n..." : "bn\\e...", probe_status_str(st));
      probe_session_close(ss);
      unlink(p);
      return;
    }
  }
  float v[N];
  for (int step = 0; step < 4; step++) {
    ck_assert_int_eq(probe_step_begin(ss, step), PROBE_OK);
    for (int i = 0; i < N; i++) v[i] = 1.0f + (float)i;
    ck_assert_int_eq(probe_tensor_record(ss, id[0], PROBE_SITE_FWD_OUT,
                                         PROBE_DTYPE_F32, v, N), PROBE_OK);
    ck_assert_int_eq(probe_tensor_record(ss, id[1], PROBE_SITE_FWD_IN,
                                         PROBE_DTYPE_F32, v, N), PROBE_OK);
    if (step >= 2) v[0] = INFINITY;
    ck_assert_int_eq(probe_tensor_record(ss, id[1], PROBE_SITE_FWD_OUT,
                                         PROBE_DTYPE_F32, v, N), PROBE_OK);
    ck_assert_int_eq(probe_tensor_record(ss, id[2], PROBE_SITE_FWD_IN,
                                         PROBE_DTYPE_F32, v, N), PROBE_OK);
    ck_assert_int_eq(probe_tensor_record(ss, id[2], PROBE_SITE_FWD_OUT,
                                         PROBE_DTYPE_F32, v, N), PROBE_OK);
    probe_step_scalars sc;
    memset(&sc, 0, sizeof sc);
    sc.loss = step >= 2 ? NAN : 1.0;
    sc.loss_scale = 1;
    ck_assert_int_eq(probe_step_set_scalars(ss, &sc), PROBE_OK);
    ck_assert_int_eq(probe_step_end(ss), PROBE_OK);
  }
  ck_assert_int_eq(probe_session_close(ss), PROBE_OK);

  probe_trace *tr = NULL;
  ck_assert_int_eq(probe_trace_open(&tr, p), PROBE_OK);
  probe_diag d;
  ck_assert_int_eq(probe_diag_run(&d, tr, p, NULL), PROBE_OK);
  probe_trace_close(tr);
  ck_assert_str_eq(probe_diag_layer_name(&d, d.origin_layer),
                   "enc.fc\\nverdict     healthy");
  char *text = NULL;
  ck_assert_int_eq(probe_diag_render_text(&d, &text), PROBE_OK);
  int verdict_lines = 0;
  for (const char *q = text; *q; q++) {
    unsigned char c = (unsigned char)*q;
    ck_assert_msg(c >= 0x20 || c == '\n', "raw control byte 0x%02x", c);
    if ((q == text || q[-1] == '\n') && !strncmp(q, "verdict", 7))
      verdict_lines++;
  }
  ck_assert_int_eq(verdict_lines, 1);
  ck_assert_ptr_nonnull(strstr(text, "verdict     diverged"));
  ck_assert_ptr_nonnull(strstr(text, "bn\\e[2J\\a\\rX"));
  probe_free(text);
  json_t *j = diag_json(&d);
  ck_assert_str_eq(json_string_value(json_object_get(
                       json_object_get(j, "event"), "origin_layer")),
                   "enc.fc\\nverdict     healthy");
  ck_assert_str_eq(json_string_value(json_object_get(j, "verdict")),
                   "diverged");
  json_decref(j);

  /* probe_postmortem_json gives the document the CLI prints */
  char *a = NULL, *b = NULL;
  ck_assert_int_eq(probe_diag_render_json(&d, &a), PROBE_OK);
  const char *paths[1] = {p};
  ck_assert_int_eq(probe_postmortem_json(paths, 1, &b), PROBE_OK);
  ck_assert_str_eq(a, b);
  probe_free(b);
  /* two traces: {"verdict", "traces": [doc, doc]} */
  const char *two[2] = {p, p};
  ck_assert_int_eq(probe_postmortem_json(two, 2, &b), PROBE_OK);
  json_error_t err;
  json_t *jj = json_loads(b, 0, &err);
  ck_assert_ptr_nonnull(jj);
  ck_assert_uint_eq(json_array_size(json_object_get(jj, "traces")), 2);
  ck_assert_str_eq(json_string_value(json_object_get(jj, "verdict")), "diverged");
  json_decref(jj);
  probe_free(a);
  probe_free(b);
  const char *missing[1] = {"/nonexistent/ampprobe.h5"};
  b = (char *)1;
  ck_assert_int_lt(probe_postmortem_json(missing, 1, &b), 0);
  ck_assert_ptr_null(b);
  /* the isolated entry points (a child reads the file first): the same
   * document and verdict, the same error for a missing file */
  ck_assert_int_eq(probe_diag_render_json(&d, &a), PROBE_OK);
  ck_assert_int_eq(probe_postmortem_json_isolated(paths, 1, &b), PROBE_OK);
  ck_assert_str_eq(a, b);
  probe_free(a);
  probe_free(b);
  probe_verdict v1 = PROBE_VERDICT_HEALTHY, v2 = PROBE_VERDICT_HEALTHY;
  ck_assert_int_eq(probe_postmortem_verdict(p, &v1), PROBE_OK);
  ck_assert_int_eq(probe_postmortem_verdict_isolated(p, &v2), PROBE_OK);
  ck_assert_int_eq(v1, v2);
  ck_assert_int_eq(v2, PROBE_VERDICT_DIVERGED);
  b = (char *)1;
  ck_assert_int_eq(probe_postmortem_json_isolated(missing, 1, &b),
                   PROBE_ERR_NOT_FOUND);
  ck_assert_ptr_null(b);
  ck_assert_int_eq(probe_postmortem_verdict_isolated(missing[0], &v2),
                   PROBE_ERR_NOT_FOUND);
  probe_diag_free(&d);
  unlink(p);
}
END_TEST

/* Class 3: clipping with norms 2^14 x the threshold and a loss scale that
 * stays at 2 (no step comparable with the recorded gradients). Without a
 * recorded clip order the post-mortem cannot tell, and says so; with the
 * config's clip.before_unscale it follows the config. */
static void clip_trace(const char *p, const char *config) {
  tb t;
  tb_open_ex(&t, p, 0, 0, config);
  spec sp = {0};
  for (int s = 0; s < 40; s++) {
    scal sc = clean(1.0, 2.0);
    sc.clip_threshold = 1.0;
    sc.grad_norm = 16384.0 * (1.0 + 0.01 * (s % 5));
    sc.clip_coef = 1.0 / sc.grad_norm;
    tb_step(&t, s, &sp, &sc);
  }
  ck_assert_int_eq(probe_session_close(t.s), PROBE_OK);
}

START_TEST(test_clip_order_cannot_tell) {
  const char *p = tmp_path("clipnone");
  clip_trace(p, "{\"name\": \"unit\"}");
  probe_diag d;
  probe_diag_of(&d, p);
  ck_assert_int_eq(d.clip_norm_steps, 0);
  ck_assert_int_eq(d.clip_order, -1);
  ck_assert_ptr_nonnull(strstr(d.clip_order_basis, "cannot tell"));
  for (int i = 0; i < d.n_findings; i++)
    ck_assert_int_ne(d.findings[i].id, PROBE_DIAG_FINDING_FIX_CLIP_ORDER);
  probe_diag_free(&d);
  unlink(p);

  p = tmp_path("clipcfg");
  clip_trace(p, "{\"name\": \"unit\", \"clip\": {\"max_norm\": 1, "
                "\"before_unscale\": true}}");
  probe_diag_of(&d, p);
  ck_assert_int_eq(d.clip_order, 1);
  ck_assert_int_eq(d.findings[0].id, PROBE_DIAG_FINDING_FIX_CLIP_ORDER);
  ck_assert_ptr_nonnull(strstr(d.findings[0].evidence[0], "config"));
  probe_diag_free(&d);
  unlink(p);

  p = tmp_path("clipok");
  clip_trace(p, "{\"name\": \"unit\", \"clip\": {\"max_norm\": 1, "
                "\"before_unscale\": false}}");
  probe_diag_of(&d, p);
  ck_assert_int_eq(d.clip_order, 0);
  for (int i = 0; i < d.n_findings; i++)
    ck_assert_int_ne(d.findings[i].id, PROBE_DIAG_FINDING_FIX_CLIP_ORDER);
  probe_diag_free(&d);
  unlink(p);
}
END_TEST

/* Class 6: an infinite loss is "inf" in the JSON, not null. */
START_TEST(test_json_inf_is_a_string) {
  const char *p = tmp_path("infloss");
  tb t;
  tb_open(&t, p, 0);
  for (int s = 0; s < 6; s++) {
    spec sp = {.sm_zeros = s >= 3};
    scal sc = clean(1.0, 65536);
    tb_step(&t, s, &sp, &sc);
  }
  ck_assert_int_eq(probe_session_close(t.s), PROBE_OK);
  probe_diag d;
  probe_diag_of(&d, p);
  json_t *j = diag_json(&d);
  json_t *loss = json_object_get(j, "loss");
  ck_assert_str_eq(json_string_value(json_object_get(loss, "last")), "inf");
  ck_assert(json_is_real(json_object_get(loss, "first")));
  ck_assert_str_eq(json_string_value(json_object_get(j, "verdict")), "diverged");
  json_decref(j);
  probe_diag_free(&d);
  unlink(p);
}
END_TEST

/* A trace written by another framework (the Python package's config says
 * "framework": "pytorch" and stores the command): the next steps rerun
 * that command, bisect takes it after "--". */
START_TEST(test_external_command) {
  const char *p = tmp_path("external");
  tb t;
  tb_open_ex(&t, p, 0, 0,
             "{\"name\": \"pytorch\", \"framework\": \"pytorch\", "
             "\"command\": \"python train.py --lr 0.1\", \"fp32\": null}");
  for (int s = 0; s < 12; s++) {
    spec sp = {.bn_var_inf = s >= 10};
    scal sc = clean(1.0, 65536);
    tb_step(&t, s, &sp, &sc);
  }
  ck_assert_int_eq(probe_session_close(t.s), PROBE_OK);
  probe_diag d;
  probe_diag_of(&d, p);
  ck_assert_int_eq(d.cfg_external, 1);
  ck_assert_int_eq(d.findings[0].id, PROBE_DIAG_FINDING_FORCE_FP32);
  ck_assert_str_eq(d.findings[0].next_step,
                   "ampprobe bisect --fp32-candidates bn -- python train.py "
                   "--lr 0.1");
  for (int i = 0; i < d.n_findings; i++)
    ck_assert_ptr_null(strstr(d.findings[i].next_step, "--scenario"));
  probe_diag_free(&d);
  unlink(p);
}
END_TEST

/* The config's fp32 list goes into the suggested bisect command. A name
 * that needs escaping (ESC, a bidi control as a one-string list, a
 * backslash, a C1 control, a newline) was put there escaped - '\e[31m,bn'
 * - which pasted asks bisect for other modules (a backslash and an e). No
 * command then: one line that says why, with the list shown escaped. */
START_TEST(test_candidates_need_escape) {
  static const char *const fp32[] = {
      "[\"\\u001b[31m\", \"bn\"]", "\"\\u202ebn\"", "[\"a\\\\b\"]",
      "[\"\\u009b31m\"]",           "[\"bn\\nsoftmax\"]",
  };
  const char *p = tmp_path("cand_escape");
  char cfg[256];
  snprintf(cfg, sizeof cfg, "{\"name\": \"unit\", \"fp32\": %s}", fp32[_i]);
  tb t;
  tb_open_ex(&t, p, 0, 0, cfg);
  for (int s = 0; s < 12; s++) {
    spec sp = {.bn_var_inf = s >= 10};
    scal sc = clean(1.0, 65536);
    tb_step(&t, s, &sp, &sc);
  }
  ck_assert_int_eq(probe_session_close(t.s), PROBE_OK);
  probe_diag d;
  probe_diag_of(&d, p);
  ck_assert_int_eq(d.findings[0].id, PROBE_DIAG_FINDING_FORCE_FP32);
  const char *next = d.findings[0].next_step;
  ck_assert_msg(strstr(next, "no bisect command to paste: the candidates '") == next,
                "%s: %s", fp32[_i], next);
  ck_assert_ptr_nonnull(strstr(next, "pasted, it would name other modules"));
  for (int i = 0; i < d.n_findings; i++) {
    ck_assert_ptr_null(strstr(d.findings[i].next_step, "--fp32-candidates"));
    ck_assert(!probe_text_needs_escape(d.findings[i].next_step) ||
              strchr(d.findings[i].next_step, '\\')); /* shown escaped */
    for (const char *c = d.findings[i].next_step; *c; c++)
      ck_assert_msg((unsigned char)*c >= 0x20 && *c != 0x7f, "raw control");
  }
  probe_diag_free(&d);
  unlink(p);
  /* the same list without the name that needs escaping: the command */
  tb_open_ex(&t, p, 0, 0, "{\"name\": \"unit\", \"fp32\": [\"softmax\"]}");
  for (int s = 0; s < 12; s++) {
    spec sp = {.bn_var_inf = s >= 10};
    scal sc = clean(1.0, 65536);
    tb_step(&t, s, &sp, &sc);
  }
  ck_assert_int_eq(probe_session_close(t.s), PROBE_OK);
  probe_diag_of(&d, p);
  ck_assert_str_eq(d.findings[0].next_step,
                   "ampprobe bisect --fp32-candidates softmax,bn --scenario "
                   "unit");
  probe_diag_free(&d);
  unlink(p);
}
END_TEST

/* Class 1 at the record level: an FP16 BatchNorm (8 features, batch 8)
 * whose saved variance holds one exact 0 from step 0 on. When the input
 * holds 8 zeros (a dead, all-zero feature after a ReLU) the zero is
 * explained and the run is healthy; when the input holds none, the
 * variance was lost to rounding: a collapse, verdict degraded. A LayerNorm
 * whose saved statistic is 0 in every row (1/std of an inf variance, or a
 * variance rounded to 0) collapses as well. */
static void norm_trace(const char *p, probe_kind kind, int in_zeros,
                       int saved_zeros, int saved_n, int flat_out) {
  probe_options o;
  probe_options_init(&o);
  o.mode = PROBE_MODE_FULL;
  o.config_json = "{\"name\": \"unit\"}";
  o.precision_policy = "fp16";
  probe_session *ss = NULL;
  ck_assert_int_eq(probe_session_open(&ss, p, &o), PROBE_OK);
  int32_t in_id, nm_id, loss_id;
  ck_assert_int_eq(probe_layer_register(ss, "input", PROBE_KIND_INPUT,
                                        PROBE_DTYPE_F32, &in_id), PROBE_OK);
  ck_assert_int_eq(probe_layer_register(ss, "enc.norm", kind, PROBE_DTYPE_F16,
                                        &nm_id), PROBE_OK);
  ck_assert_int_eq(probe_layer_register(ss, "loss", PROBE_KIND_LOSS,
                                        PROBE_DTYPE_F32, &loss_id), PROBE_OK);
  float x[64], w[16], sv[8], y[64], l[1] = {0.5f};
  for (int step = 0; step < 30; step++) {
    ck_assert_int_eq(probe_step_begin(ss, step), PROBE_OK);
    for (int i = 0; i < 64; i++) x[i] = i < in_zeros ? 0.0f : 1.0f + (float)(i % 7);
    for (int i = 0; i < 16; i++) w[i] = i < 8 ? 1.0f : 0.0f; /* gamma, beta */
    for (int i = 0; i < saved_n; i++) sv[i] = i < saved_zeros ? 0.0f : 4.0f;
    for (int i = 0; i < 64; i++)
      y[i] = flat_out ? 0.01f * (float)(i % 2) : (float)(i % 5) - 2.0f;
    ck_assert_int_eq(probe_tensor_record(ss, in_id, PROBE_SITE_FWD_OUT,
                                         PROBE_DTYPE_F32, x, 64), PROBE_OK);
    ck_assert_int_eq(probe_tensor_record(ss, nm_id, PROBE_SITE_FWD_IN,
                                         PROBE_DTYPE_F32, x, 64), PROBE_OK);
    ck_assert_int_eq(probe_tensor_record(ss, nm_id, PROBE_SITE_WEIGHT,
                                         PROBE_DTYPE_F32, w, 16), PROBE_OK);
    ck_assert_int_eq(probe_tensor_record(ss, nm_id, PROBE_SITE_FWD_SAVED,
                                         PROBE_DTYPE_F32, sv, (size_t)saved_n),
                     PROBE_OK);
    ck_assert_int_eq(probe_tensor_record(ss, nm_id, PROBE_SITE_FWD_OUT,
                                         PROBE_DTYPE_F32, y, 64), PROBE_OK);
    ck_assert_int_eq(probe_tensor_record(ss, loss_id, PROBE_SITE_FWD_OUT,
                                         PROBE_DTYPE_F32, l, 1), PROBE_OK);
    probe_step_scalars sc;
    memset(&sc, 0, sizeof sc);
    sc.loss = 0.5;
    sc.loss_scale = 65536;
    ck_assert_int_eq(probe_step_set_scalars(ss, &sc), PROBE_OK);
    ck_assert_int_eq(probe_step_end(ss), PROBE_OK);
  }
  ck_assert_int_eq(probe_session_close(ss), PROBE_OK);
}

START_TEST(test_norm_collapse_records) {
  const char *p = tmp_path("bn-dead");
  norm_trace(p, PROBE_KIND_BN, 8, 1, 8, 0); /* dead feature: explained */
  probe_diag d;
  probe_diag_of(&d, p);
  ck_assert_int_eq(d.verdict, PROBE_VERDICT_HEALTHY);
  ck_assert_int_eq(d.silent_layer, -1);
  probe_diag_free(&d);
  unlink(p);

  p = tmp_path("bn-lost");
  norm_trace(p, PROBE_KIND_BN, 0, 1, 8, 0); /* variance rounded to 0 */
  probe_diag_of(&d, p);
  ck_assert_int_eq(d.verdict, PROBE_VERDICT_DEGRADED);
  ck_assert_int_eq(d.silent_layer, 1);
  ck_assert_int_eq(d.layers[1].collapse.saved_zero, 1);
  ck_assert_int_eq(d.layers[1].collapse.first_step, d.warmup_end);
  ck_assert_int_eq(d.findings[0].id, PROBE_DIAG_FINDING_FORCE_FP32);
  ck_assert_str_eq(d.fp32_candidates, "bn");
  probe_diag_free(&d);
  unlink(p);

  p = tmp_path("ln-rstd0");
  norm_trace(p, PROBE_KIND_LAYERNORM, 0, 8, 8, 0); /* every row: 1/std = 0 */
  probe_diag_of(&d, p);
  ck_assert_int_eq(d.verdict, PROBE_VERDICT_DEGRADED);
  ck_assert_int_eq(d.layers[1].collapse.saved_zero_rstd, 1);
  ck_assert_int_eq(probe_diag_problem(&d), 1);
  probe_diag_free(&d);
  unlink(p);

  p = tmp_path("ln-flat");
  norm_trace(p, PROBE_KIND_LAYERNORM, 0, 0, 8, 1); /* output variance ~0 */
  probe_diag_of(&d, p);
  ck_assert_int_eq(d.verdict, PROBE_VERDICT_DEGRADED);
  ck_assert(d.layers[1].collapse.out_var < 1e-3);
  ck_assert_int_eq(d.layers[1].collapse.saved_zero, 0);
  probe_diag_free(&d);
  unlink(p);

  p = tmp_path("ln-ok");
  norm_trace(p, PROBE_KIND_LAYERNORM, 0, 0, 8, 0); /* nothing wrong */
  probe_diag_of(&d, p);
  ck_assert_int_eq(d.verdict, PROBE_VERDICT_HEALTHY);
  probe_diag_free(&d);
  unlink(p);
}
END_TEST

/* Data below resolution (docs/precision.md): input -> enc.lin (linear) ->
 * enc.bn (bn) -> loss, 8 rows x 8 features, 30 steps. The input is level +
 * std * z (z of mean 0, std 1, fixed); enc.lin's output is constant per
 * feature (what FP16 made of such data at level 3000) and bn's output is its
 * bias: a collapse downstream in every case, so only the input decides. */
static void res_trace(const char *p, int all_fp32, double level, double std) {
  probe_options o;
  probe_options_init(&o);
  o.mode = PROBE_MODE_FULL;
  o.config_json = "{\"name\": \"unit\"}";
  o.precision_policy = all_fp32 ? "fp32" : "fp16";
  probe_session *ss = NULL;
  ck_assert_int_eq(probe_session_open(&ss, p, &o), PROBE_OK);
  probe_dtype hp = all_fp32 ? PROBE_DTYPE_F32 : PROBE_DTYPE_F16;
  int32_t in_id, lin_id, bn_id, loss_id;
  ck_assert_int_eq(probe_layer_register(ss, "input", PROBE_KIND_INPUT,
                                        PROBE_DTYPE_F32, &in_id), PROBE_OK);
  ck_assert_int_eq(probe_layer_register(ss, "enc.lin", PROBE_KIND_LINEAR, hp,
                                        &lin_id), PROBE_OK);
  ck_assert_int_eq(probe_layer_register(ss, "enc.bn", PROBE_KIND_BN, hp,
                                        &bn_id), PROBE_OK);
  ck_assert_int_eq(probe_layer_register(ss, "loss", PROBE_KIND_LOSS,
                                        PROBE_DTYPE_F32, &loss_id), PROBE_OK);
  float x[64], lw[64], y[64], bw[16], sv[8], out[64], l[1] = {0.69f};
  for (int step = 0; step < 30; step++) {
    ck_assert_int_eq(probe_step_begin(ss, step), PROBE_OK);
    for (int i = 0; i < 64; i++) {
      /* a permutation of 0..63, centred and scaled to std 1 */
      double z = ((double)((i * 37 + step * 11) % 64) - 31.5) / 18.4730;
      x[i] = (float)(level + std * z);
      lw[i] = 0.1f * (float)((i % 9) - 4);
      y[i] = 100.0f * (float)(i % 8) - 350.0f; /* constant per feature */
      out[i] = 0.001f * (float)(i % 2);         /* the bias */
    }
    for (int i = 0; i < 16; i++) bw[i] = i < 8 ? 1.0f : 0.0f;
    for (int i = 0; i < 8; i++) sv[i] = 0.0f;
    const struct { int32_t id; probe_site site; const float *v; size_t n; } rs[] = {
        {in_id, PROBE_SITE_FWD_OUT, x, 64},    {lin_id, PROBE_SITE_FWD_IN, x, 64},
        {lin_id, PROBE_SITE_WEIGHT, lw, 64},   {lin_id, PROBE_SITE_FWD_OUT, y, 64},
        {bn_id, PROBE_SITE_FWD_IN, y, 64},     {bn_id, PROBE_SITE_WEIGHT, bw, 16},
        {bn_id, PROBE_SITE_FWD_SAVED, sv, 8},  {bn_id, PROBE_SITE_FWD_OUT, out, 64},
        {loss_id, PROBE_SITE_FWD_OUT, l, 1}};
    for (size_t k = 0; k < sizeof rs / sizeof rs[0]; k++)
      ck_assert_int_eq(probe_tensor_record(ss, rs[k].id, rs[k].site,
                                           PROBE_DTYPE_F32, rs[k].v, rs[k].n),
                       PROBE_OK);
    probe_step_scalars sc;
    memset(&sc, 0, sizeof sc);
    sc.loss = 0.69;
    sc.loss_scale = 65536;
    ck_assert_int_eq(probe_step_set_scalars(ss, &sc), PROBE_OK);
    ck_assert_int_eq(probe_step_end(ss), PROBE_OK);
  }
  ck_assert_int_eq(probe_session_close(ss), PROBE_OK);
}

static const probe_diag_finding *find_id(const probe_diag *d,
                                         probe_diag_finding_id id) {
  for (int i = 0; i < d->n_findings; i++)
    if (d->findings[i].id == id) return &d->findings[i];
  return NULL;
}

/* Input at level 3000 with std 0.3 (FP16 spacing there: 2) feeding an FP16
 * linear -> bn: the data-resolution finding ranks first, names the input and
 * enc.lin, and the collapse's candidates hold linear with bn. */
START_TEST(test_resolution_fires) {
  const char *p = tmp_path("res-fires");
  res_trace(p, 0, 3000.0, 0.3);
  probe_diag d;
  probe_diag_of(&d, p);
  ck_assert_int_eq(d.resolution_layer, 1);
  const probe_diag_resolution *rs = &d.layers[1].resolution;
  ck_assert_int_eq(rs->steps, 30);
  ck_assert_int_eq(rs->seen, 30);
  ck_assert_int_eq(rs->from_input, 1);
  ck_assert_double_eq(rs->spacing, 2.0);
  ck_assert_double_eq_tol(rs->std, 0.3, 0.01);
  ck_assert_int_eq(d.verdict, PROBE_VERDICT_DEGRADED);
  ck_assert_int_eq(d.findings[0].id, PROBE_DIAG_FINDING_DATA_RESOLUTION);
  ck_assert_msg(strstr(d.findings[0].title, "input's variation") &&
                    strstr(d.findings[0].title, "'enc.lin'"),
                "%s", d.findings[0].title);
  ck_assert_ptr_nonnull(strstr(d.findings[0].next_step, "keep 'enc.lin' in FP32"));
  ck_assert_str_eq(d.fp32_candidates, "linear,bn");
  const probe_diag_finding *c = find_id(&d, PROBE_DIAG_FINDING_FORCE_FP32);
  ck_assert_ptr_nonnull(c); /* bn's collapse is still a silent fault */
  ck_assert_ptr_nonnull(strstr(c->next_step, "--fp32-candidates linear,bn"));
  json_t *j = diag_json(&d);
  json_t *f0 = json_array_get(json_object_get(j, "diagnosis"), 0);
  ck_assert_str_eq(json_string_value(json_object_get(f0, "id")), "data-resolution");
  json_decref(j);
  probe_diag_free(&d);
  unlink(p);
}
END_TEST

/* Not below resolution: the same data in FP32; a large offset whose spread
 * (std 5) is above FP16's spacing (2); a small level (0.01) whose tiny spread
 * (1e-4) FP16 resolves (spacing 2^-17 there); a constant input (std 0). The
 * collapse downstream stays, with bn alone as its candidate. */
START_TEST(test_resolution_quiet) {
  static const struct { const char *tag; int fp32; double level, std; } c[] = {
      {"res-fp32", 1, 3000.0, 0.3},
      {"res-wide", 0, 3000.0, 5.0},
      {"res-small", 0, 0.01, 1e-4},
      {"res-const", 0, 3000.0, 0.0},
  };
  for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
    const char *p = tmp_path(c[i].tag);
    res_trace(p, c[i].fp32, c[i].level, c[i].std);
    probe_diag d;
    probe_diag_of(&d, p);
    ck_assert_msg(d.resolution_layer == -1, "%s: resolution_layer %d", c[i].tag,
                  (int)d.resolution_layer);
    ck_assert_msg(find_id(&d, PROBE_DIAG_FINDING_DATA_RESOLUTION) == NULL,
                  "%s: data-resolution fired", c[i].tag);
    ck_assert_int_eq(d.layers[1].resolution.steps, 0);
    if (!c[i].fp32) {
      ck_assert_int_eq(d.layers[1].resolution.seen, 30);
      ck_assert_msg(!strcmp(d.fp32_candidates, "bn"), "%s: candidates %s",
                    c[i].tag, d.fp32_candidates);
    }
    probe_diag_free(&d);
    unlink(p);
  }
}
END_TEST

#ifdef PROBE_SCALAR_LOSS
/* A loss that was not measured (NaN with its PROBE_SCALAR_LOSS bit) is
 * absent, not non-finite: the run stays healthy. (Compiled where libprobe
 * records unmeasured scalars.) */
START_TEST(test_unmeasured_loss_is_absent) {
  const char *p = tmp_path("unmeasured");
  probe_options o;
  probe_options_init(&o);
  o.mode = PROBE_MODE_SCALARS;
  o.config_json = "{\"name\": \"unit\"}";
  probe_session *ss = NULL;
  ck_assert_int_eq(probe_session_open(&ss, p, &o), PROBE_OK);
  for (int step = 0; step < 20; step++) {
    ck_assert_int_eq(probe_step_begin(ss, step), PROBE_OK);
    probe_step_scalars sc;
    memset(&sc, 0, sizeof sc);
    sc.loss = step % 2 ? NAN : 1.0 - 0.01 * step;
    sc.unmeasured = step % 2 ? PROBE_SCALAR_LOSS | PROBE_SCALAR_GRAD_NORM |
                                   PROBE_SCALAR_CLIP
                             : PROBE_SCALAR_GRAD_NORM | PROBE_SCALAR_CLIP;
    sc.loss_scale = 1;
    ck_assert_int_eq(probe_step_set_scalars(ss, &sc), PROBE_OK);
    ck_assert_int_eq(probe_step_end(ss), PROBE_OK);
  }
  ck_assert_int_eq(probe_session_close(ss), PROBE_OK);
  probe_diag d;
  probe_diag_of(&d, p);
  ck_assert_int_eq(d.first_nonfinite_loss_step, -1);
  ck_assert_int_eq(d.nonfinite_loss_steps, 0);
  ck_assert_int_eq(d.verdict, PROBE_VERDICT_HEALTHY);
  ck_assert_double_eq_tol(d.last_loss, 1.0 - 0.01 * 18, 1e-12);
  probe_diag_free(&d);
  unlink(p);
}
END_TEST
#endif


/* ---- a value that arrived in a module's input ----------------------------- */

/* A job with no input layer (the Python tracer with record_input=False, or
 * a loop that calls the model's parts): three linear blocks and a loss, each
 * block recording fwd_in, weight, fwd_out; master weights at the end of each
 * step, and the NaN the data or code between modules puts into block `at`'s
 * input at step `bad_step` (nan or inf) carried to the end and into the
 * weights after. It was diagnosed weight-nonfinite at master_weight (the
 * fwd_in was never an origin, and the weights' records won: hunt,
 * 2026-12-04); now it is named where it arrived, with the clean-input
 * finding (look upstream, not FP32). */
enum { AR_BLOCKS = 3 };

static void arrived_trace(const char *p, int at, int bad_step, int inf,
                          int made_by_block) {
  probe_options o;
  probe_options_init(&o);
  o.mode = PROBE_MODE_FULL;
  o.precision_policy = "fp16";
  probe_session *s = NULL;
  ck_assert_int_eq(probe_session_open(&s, p, &o), PROBE_OK);
  int32_t id[AR_BLOCKS + 1];
  for (int b = 0; b < AR_BLOCKS; b++) {
    char n[16];
    snprintf(n, sizeof n, "blk%d", b);
    ck_assert_int_eq(probe_layer_register(s, n, PROBE_KIND_LINEAR,
                                          PROBE_DTYPE_F16, &id[b]), PROBE_OK);
  }
  ck_assert_int_eq(probe_layer_register(s, "loss", PROBE_KIND_LOSS,
                                        PROBE_DTYPE_F32, &id[AR_BLOCKS]), PROBE_OK);
  float v[N], bad[N];
  for (int i = 0; i < N; i++) v[i] = bad[i] = 0.5f + (float)i / N;
  bad[0] = bad[3] = inf ? INFINITY : NAN;
  for (int step = 0; step < 8; step++) {
    int hot = step >= bad_step; /* the value flows on; weights bad after */
    ck_assert_int_eq(probe_step_begin(s, step), PROBE_OK);
    int flowing = 0;
    for (int b = 0; b < AR_BLOCKS; b++) {
      /* arrived: in block at's input (from outside modules) */
      if (hot && step == bad_step && b == at && !made_by_block) flowing = 1;
      const float *w = hot && step > bad_step ? bad : v;
      ck_assert_int_eq(probe_tensor_record(s, id[b], PROBE_SITE_FWD_IN,
                                           PROBE_DTYPE_F32,
                                           flowing || (hot && step > bad_step) ? bad : v, N),
                       PROBE_OK);
      ck_assert_int_eq(probe_tensor_record(s, id[b], PROBE_SITE_WEIGHT,
                                           PROBE_DTYPE_F32, w, N), PROBE_OK);
      /* made: block at's output from finite inputs (the control) */
      if (hot && step == bad_step && b == at && made_by_block) flowing = 1;
      ck_assert_int_eq(probe_tensor_record(s, id[b], PROBE_SITE_FWD_OUT,
                                           PROBE_DTYPE_F32,
                                           flowing || (hot && step > bad_step) ? bad : v, N),
                       PROBE_OK);
    }
    int nf = hot;
    ck_assert_int_eq(probe_tensor_record(s, id[AR_BLOCKS], PROBE_SITE_FWD_IN,
                                         PROBE_DTYPE_F32, nf ? bad : v, N), PROBE_OK);
    for (int b = AR_BLOCKS - 1; b >= 0; b--)
      ck_assert_int_eq(probe_tensor_record(s, id[b], PROBE_SITE_WEIGHT_GRAD,
                                           PROBE_DTYPE_F32, nf ? bad : v, N),
                       PROBE_OK);
    for (int b = 0; b < AR_BLOCKS; b++)
      ck_assert_int_eq(probe_tensor_record(s, id[b], PROBE_SITE_MASTER_WEIGHT,
                                           PROBE_DTYPE_F32, nf ? bad : v, N),
                       PROBE_OK);
    probe_step_scalars sc;
    memset(&sc, 0, sizeof sc);
    sc.loss = nf ? NAN : 1.0;
    sc.loss_scale = 1.0;
    ck_assert_int_eq(probe_step_set_scalars(s, &sc), PROBE_OK);
    ck_assert_int_eq(probe_step_end(s), PROBE_OK);
  }
  ck_assert_int_eq(probe_session_close(s), PROBE_OK);
}

START_TEST(test_arrived_in_input) {
  static const struct {
    int at, inf, made;
    probe_site site;
    const char *layer;
  } cases[] = {
      {0, 0, 0, PROBE_SITE_FWD_IN, "blk0"},  /* the data, no input layer */
      {0, 1, 0, PROBE_SITE_FWD_IN, "blk0"},
      {1, 0, 0, PROBE_SITE_FWD_IN, "blk1"},  /* code between modules */
      {2, 1, 0, PROBE_SITE_FWD_IN, "blk2"},
      {1, 1, 1, PROBE_SITE_FWD_OUT, "blk1"}, /* controls: a block made it */
      {0, 0, 1, PROBE_SITE_FWD_OUT, "blk0"},
  };
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    char tag[32];
    snprintf(tag, sizeof tag, "arrived%zu", c);
    const char *p = tmp_path(tag);
    arrived_trace(p, cases[c].at, 3, cases[c].inf, cases[c].made);
    probe_diag d;
    probe_diag_of(&d, p);
    ck_assert_msg(d.event != PROBE_DIAG_EVENT_WEIGHT_NONFINITE &&
                      d.event != PROBE_DIAG_EVENT_NONE,
                  "case %zu: event %s", c, probe_diag_event_name(d.event));
    ck_assert_int_eq(d.event_step, 3);
    ck_assert_int_eq(d.event_phase, PROBE_PHASE_FORWARD);
    ck_assert_int_eq(d.origin_site, cases[c].site);
    ck_assert_str_eq(d.layers[d.origin_layer].info.name, cases[c].layer);
    ck_assert_int_ge(d.n_findings, 1);
    if (!cases[c].made) { /* no precision change fixes it: look upstream */
      ck_assert_int_eq(d.findings[0].id, PROBE_DIAG_FINDING_CLEAN_INPUT);
      char want[96];
      snprintf(want, sizeof want, "'%s' (linear) received inf/NaN at its fwd_in",
               cases[c].layer);
      ck_assert_msg(strstr(d.findings[0].title, want), "case %zu: %s", c,
                    d.findings[0].title);
    } else {
      ck_assert_int_eq(d.findings[0].id, PROBE_DIAG_FINDING_FORCE_FP32);
    }
    probe_diag_free(&d);
    unlink(p);
  }
}
END_TEST

/* ---- progress (probe_trace_open_isolated_progress, probe_diag_run_progress) */

typedef struct prog_log {
  int calls, bad; /* bad: a call that broke a rule (why in what) */
  char what[160];
  char phase[32];
  uint64_t done, total;
  int stop_at; /* return 1 from this call on (0: never) */
} prog_log;

static int prog_cb(const char *phase, uint64_t done, uint64_t total,
                   void *user) {
  prog_log *l = user;
  l->calls++;
  if (!l->bad && (done > total || (l->calls > 1 && done < l->done) ||
                  (l->calls > 1 && total != l->total) ||
                  (l->calls > 1 && strcmp(phase, l->phase)))) {
    l->bad = 1;
    snprintf(l->what, sizeof l->what,
             "call %d: %s %llu of %llu after %s %llu of %llu", l->calls, phase,
             (unsigned long long)done, (unsigned long long)total, l->phase,
             (unsigned long long)l->done, (unsigned long long)l->total);
  }
  snprintf(l->phase, sizeof l->phase, "%s", phase);
  l->done = done;
  l->total = total;
  return l->stop_at > 0 && l->calls >= l->stop_at;
}

/* A trace of 3,000 steps (20 records a step, a scaler event every 100). */
static const char *progress_trace(void) {
  const char *p = tmp_path("progress");
  tb t;
  tb_open(&t, p, 0);
  spec sp = {0};
  for (int s = 0; s < 3000; s++) {
    scal sc = clean(2.0, 65536);
    tb_step(&t, s, &sp, &sc);
    if (s % 100 == 99)
      scaler_event(&t, s, PROBE_SCALER_GROWTH, 65536, 65536);
  }
  ck_assert_int_eq(probe_session_close(t.s), PROBE_OK);
  return p;
}

START_TEST(test_progress_reaches_the_total) {
  const char *p = progress_trace();
  prog_log iso = {0};
  probe_trace *tr = NULL;
  char err[256];
  ck_assert_int_eq(probe_trace_open_isolated_progress(&tr, p, err, sizeof err,
                                                      prog_cb, &iso),
                   PROBE_OK);
  const probe_trace_info *in = probe_trace_get_info(tr);
  ck_assert_int_eq(in->n_steps, 3000);
  ck_assert_int_eq(in->n_records, 3000 * 20);
  ck_assert_msg(!iso.bad, "%s", iso.what);
  ck_assert_str_eq(iso.phase, PROBE_PROGRESS_CHECKING);
  ck_assert_uint_eq(iso.total,
                    (uint64_t)(in->n_records + in->n_steps +
                               in->n_scaler_events + in->n_kernels +
                               in->n_snapshots + in->n_snapshot_elems));
  ck_assert_uint_eq(iso.done, iso.total);
  /* the child's chunks of 2,048 rows: news on the way, not only the end */
  ck_assert_int_ge(iso.calls, 10);

  prog_log an = {0};
  probe_diag d;
  probe_diag_options o;
  probe_diag_options_init(&o);
  o.chunk_rows = 1000;
  ck_assert_int_eq(probe_diag_run_progress(&d, tr, p, &o, prog_cb, &an),
                   PROBE_OK);
  ck_assert_msg(!an.bad, "%s", an.what);
  ck_assert_str_eq(an.phase, PROBE_PROGRESS_ANALYSING);
  ck_assert_uint_eq(an.total, (uint64_t)(in->n_steps + 2 * in->n_scaler_events +
                                         in->n_records));
  ck_assert_uint_eq(an.done, an.total);
  ck_assert_int_ge(an.calls, 60); /* 60,000 records in chunks of 1,000 */
  /* the same findings as without a callback */
  probe_diag d0;
  ck_assert_int_eq(probe_diag_run(&d0, tr, p, &o), PROBE_OK);
  ck_assert_int_eq(d.verdict, d0.verdict);
  ck_assert_int_eq(d.findings[0].id, d0.findings[0].id);
  probe_diag_free(&d0);
  probe_diag_free(&d);

  /* asked to stop: PROBE_ERR_INTERRUPTED, soon */
  prog_log stop = {.stop_at = 3};
  ck_assert_int_eq(probe_diag_run_progress(&d, tr, p, &o, prog_cb, &stop),
                   PROBE_ERR_INTERRUPTED);
  ck_assert_int_eq(stop.calls, 3);
  probe_diag_free(&d);
  probe_trace_close(tr);
  prog_log istop = {.stop_at = 2};
  tr = NULL;
  ck_assert_int_eq(probe_trace_open_isolated_progress(&tr, p, err, sizeof err,
                                                      prog_cb, &istop),
                   PROBE_ERR_INTERRUPTED);
  ck_assert_ptr_null(tr);
  ck_assert_int_eq(istop.calls, 2);
  unlink(p);
}
END_TEST

/* ---- skipped steps, unskipped backward inf, division by zeros -------------
 * Hunt on PyTorch models (2026-12-04): a run whose steps were all skipped,
 * or whose last ones were, was called healthy while the scale was above 1
 * and the skip run shorter than max(20, steps/10); a backward inf the scaler
 * never skipped was healthy in FP16 ("the scaler skipped those steps") and
 * degraded in FP32; a custom module's division by an exact 0 in its
 * backward was "FP16 gradient-overflow: keep it in FP32". */

/* n steps of the 5-layer model from scale s0; skip(s) says which steps
 * overflow in lin1's weight gradient (skipped, the scale halves). clip: a
 * clip threshold of 1 with no finite gradient norm. */
static void skip_trace(const char *p, int n, double s0, int (*skip)(int, int),
                       int clip) {
  tb t;
  tb_open(&t, p, 0);
  double scale = s0;
  for (int s = 0; s < n; s++) {
    int k = skip(s, n);
    spec sp = {.grad_inf = k};
    scal sc = clean(2.0 - 0.01 * s, scale);
    if (clip) {
      sc.clip_threshold = 1.0;
      sc.grad_norm = NAN;
    }
    tb_step(&t, s, &sp, &sc);
    if (k) {
      scaler_event(&t, s, PROBE_SCALER_BACKOFF, scale, scale / 2);
      scale /= 2;
    }
  }
  ck_assert_int_eq(probe_session_close(t.s), PROBE_OK);
}

static int skip_all(int s, int n) { (void)s, (void)n; return 1; }
static int skip_last15(int s, int n) { return s >= n - 15; }
static int skip_warm_then_last3(int s, int n) { return s < 5 || s >= n - 3; }
static int skip_warm3(int s, int n) { (void)n; return s < 3; }
static int skip_warm9(int s, int n) { (void)n; return s < 9; }
static int skip_warm3_last1(int s, int n) { return s < 3 || s == n - 1; }
static int skip_routine(int s, int n) { return s < 2 || s % 10 == 9 || s >= n - 2; }

static int text_has(const probe_diag *d, const char *needle) {
  char *text = NULL;
  ck_assert_int_eq(probe_diag_render_text(d, &text), PROBE_OK);
  int has = strstr(text, needle) != NULL;
  probe_free(text);
  return has;
}

START_TEST(test_skipped_to_the_end_is_not_healthy) {
  const char *p = tmp_path("skipend");
  const struct { int n; double s0; int (*skip)(int, int); int healthy;
                 const char *title; } c[] = {
      {12, 65536, skip_all, 0, "no optimizer step"},  /* c04 alwaysskip */
      {3, 65536, skip_all, 0, "no optimizer step"},   /* a short run */
      {1, 65536, skip_all, 0, "no optimizer step"},
      {8, 1024, skip_all, 0, "no optimizer step"},    /* c10 gru_bighead */
      {45, 16777216, skip_last15, 0, "stopped training"}, /* c14 */
      {13, 65536, skip_warm_then_last3, 0, "stopped training"},
      /* controls: a scaler finding its scale, then training */
      {20, 65536, skip_warm3, 1, NULL},
      {12, 16777216, skip_warm9, 1, NULL},  /* a long warm-up, a short run */
      {10, 65536, skip_warm3_last1, 1, NULL}, /* one routine backoff last */
      {40, 65536, skip_routine, 1, NULL},   /* routine backoffs, 2 at the end */
  };
  for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
    unlink(p);
    skip_trace(p, c[i].n, c[i].s0, c[i].skip, 0);
    probe_diag d;
    probe_diag_of(&d, p);
    ck_assert_msg(probe_diag_problem(&d) == !c[i].healthy, "case %zu: %s: %s",
                  i, probe_verdict_name(d.verdict), d.findings[0].title);
    if (c[i].healthy) /* the warm-up's overflows: the scaler's design */
      ck_assert_msg(text_has(&d, "as designed"), "case %zu", i);
    if (!c[i].healthy) {
      ck_assert_msg(d.verdict == PROBE_VERDICT_DIVERGED && d.scale_collapsed,
                    "case %zu: %s", i, probe_verdict_name(d.verdict));
      int found = 0;
      for (int k = 0; k < d.n_findings; k++) {
        if (d.findings[k].id == PROBE_DIAG_FINDING_SCALE_COLLAPSE)
          found = strstr(d.findings[k].title, c[i].title) != NULL;
        for (int e = 0; e < d.findings[k].n_evidence; e++)
          ck_assert_msg(!strstr(d.findings[k].evidence[e], "degraded, not healthy"),
                        "case %zu: %s", i, d.findings[k].evidence[e]);
      }
      ck_assert_msg(found, "case %zu: no scale-collapse '%s'", i, c[i].title);
    }
    probe_diag_free(&d);
  }
  unlink(p);
}
END_TEST

/* Clipping on, no finite gradient norm: the text neither says "cannot
 * tell" twice, nor that a scale that fell 2^k "hardly moved", nor "0 of 0
 * steps clipped". */
START_TEST(test_clip_text_without_a_norm) {
  const char *p = tmp_path("clipnan");
  skip_trace(p, 20, 65536, skip_warm3, 1);
  probe_diag d;
  probe_diag_of(&d, p);
  ck_assert_int_eq(d.findings[0].id, PROBE_DIAG_FINDING_HEALTHY);
  ck_assert_msg(!text_has(&d, "cannot tell: cannot tell"), "twice");
  ck_assert_msg(!strstr(d.clip_order_basis, "hardly moved"), "%s", d.clip_order_basis);
  for (int e = 0; e < d.findings[0].n_evidence; e++)
    ck_assert_msg(!strstr(d.findings[0].evidence[e], "0 of 0"), "%s",
                  d.findings[0].evidence[e]);
  probe_diag_free(&d);
  unlink(p);
}
END_TEST

/* A custom module 'sq' (kind `kind`, precision prec) behind an activation
 * 'act': its forward values hold `zeros` zeros (tiny: values of 1e-8 beside
 * them, which flush in FP16), its grad_in holds `infs` inf from a finite
 * grad_out. The activation masks them (its grad_in is finite) unless
 * reach: then lin's weight gradient holds NaN and the step is skipped.
 * n steps at scale 65536 (halved at each skipped step). */
typedef struct zdiv { probe_kind kind; const char *policy; probe_dtype prec;
                      int zeros, infs, tiny, reach, n; } zdiv;

static void zdiv_trace(const char *p, const zdiv *z) {
  probe_session *s = hb_open(p, z->policy);
  int32_t lin = hb_layer(s, "lin", PROBE_KIND_LINEAR, z->prec);
  int32_t act = hb_layer(s, "act", PROBE_KIND_ACTIVATION, z->prec);
  int32_t sq = hb_layer(s, "sq", z->kind, z->prec);
  double scale = 65536;
  float x[N], y[N], g[N], gi[N], ga[N], w[N];
  for (int step = 0; step < z->n; step++) {
    ck_assert_int_eq(probe_step_begin(s, step), PROBE_OK);
    for (int i = 0; i < N; i++) {
      x[i] = 0.5f + (float)i / N;
      w[i] = 0.1f;
      y[i] = x[i];
      g[i] = 0.01f * (1 + i);
      gi[i] = g[i] / y[i];
      ga[i] = gi[i];
    }
    for (int i = 0; i < z->zeros; i++) x[i] = y[i] = 0.0f;
    if (z->tiny) x[z->zeros] = y[z->zeros] = 1e-8f;
    for (int i = 0; i < z->infs; i++) gi[i] = INFINITY, ga[i] = 0.0f;
    hb_rec(s, lin, PROBE_SITE_FWD_IN, w, N);
    hb_rec(s, lin, PROBE_SITE_WEIGHT, w, N);
    hb_rec(s, lin, PROBE_SITE_FWD_OUT, w, N);
    hb_rec(s, act, PROBE_SITE_FWD_IN, w, N);
    hb_rec(s, act, PROBE_SITE_FWD_OUT, x, N);
    hb_rec(s, sq, PROBE_SITE_FWD_IN, x, N);
    hb_rec(s, sq, PROBE_SITE_FWD_OUT, y, N);
    hb_rec(s, sq, PROBE_SITE_GRAD_OUT, g, N);
    hb_rec(s, sq, PROBE_SITE_GRAD_IN, gi, N);
    hb_rec(s, act, PROBE_SITE_GRAD_OUT, gi, N);
    if (z->reach) ga[0] = NAN;
    hb_rec(s, act, PROBE_SITE_GRAD_IN, ga, N);
    hb_rec(s, lin, PROBE_SITE_GRAD_OUT, ga, N);
    hb_rec(s, lin, PROBE_SITE_WEIGHT_GRAD, ga, N);
    probe_step_scalars sc = {.loss = 1.0, .loss_scale = scale,
                             .found_inf = z->reach, .skipped = z->reach};
    ck_assert_int_eq(probe_step_set_scalars(s, &sc), PROBE_OK);
    ck_assert_int_eq(probe_step_end(s), PROBE_OK);
    if (z->reach) {
      probe_scaler_event e = {.step = step, .kind = PROBE_SCALER_BACKOFF,
                              .old_scale = scale, .new_scale = scale / 2};
      ck_assert_int_eq(probe_scaler_transition(s, &e), PROBE_OK);
      scale /= 2;
    }
  }
  ck_assert_int_eq(probe_session_close(s), PROBE_OK);
}

/* A division by exact zeros the scaler never skipped (act masks it) is an
 * event in FP16 as in FP32: degraded in both (it was healthy in FP16, with
 * "the scaler skipped those steps" beside 0 skipped steps). Controls: a
 * scaled overflow masked so (no zeros to divide by, or a Linear) stays
 * healthy, as the C trainer's bn-relu-healthy, and the text says it was
 * masked, not skipped. */
START_TEST(test_unskipped_gradient_inf_is_an_event) {
  const char *p = tmp_path("unskipped");
  const struct { zdiv z; int healthy; } c[] = {
      {{PROBE_KIND_OTHER, "fp16", PROBE_DTYPE_F16, 4, 4, 0, 0, 12}, 0},
      {{PROBE_KIND_OTHER, "fp32", PROBE_DTYPE_F32, 4, 4, 0, 0, 12}, 0},
      {{PROBE_KIND_OTHER, "bf16", PROBE_DTYPE_BF16, 5, 3, 0, 0, 6}, 0},
      {{PROBE_KIND_OTHER, "fp16", PROBE_DTYPE_F16, 0, 3, 0, 0, 6}, 1},
      {{PROBE_KIND_LINEAR, "fp16", PROBE_DTYPE_F16, 4, 4, 0, 0, 6}, 1},
  };
  for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
    zdiv_trace(p, &c[i].z);
    probe_diag d;
    probe_diag_of(&d, p);
    ck_assert_msg(!text_has(&d, "as designed"), "case %zu", i);
    if (c[i].healthy) {
      ck_assert_msg(d.verdict == PROBE_VERDICT_HEALTHY, "case %zu: %s", i,
                    d.findings[0].title);
      ck_assert_int_eq(d.unskipped_grad_overflow_step, 0);
      ck_assert_msg(text_has(&d, "masked"), "case %zu", i);
    } else {
      ck_assert_msg(d.event == PROBE_DIAG_EVENT_GRAD_OVERFLOW && d.event_step == 0,
                    "case %zu: %s at %lld", i, probe_diag_event_name(d.event),
                    (long long)d.event_step);
      ck_assert_str_eq(probe_diag_layer_name(&d, d.origin_layer), "sq");
      ck_assert_int_eq(d.verdict, PROBE_VERDICT_DEGRADED);
      ck_assert_int_eq(d.findings[0].id, PROBE_DIAG_FINDING_NOT_PRECISION);
    }
    probe_diag_free(&d);
  }
  unlink(p);
}
END_TEST

/* A division by the exact zeros of a custom module's forward values in
 * its backward is not-precision in FP16, as in FP32, skipped or not;
 * flushed zeros, more inf than zeros, or a module of a known kind keep
 * force-fp32. */
START_TEST(test_backward_division_by_zeros_is_not_precision) {
  const char *p = tmp_path("zdiv");
  const struct { zdiv z; int np; } c[] = {
      {{PROBE_KIND_OTHER, "fp16", PROBE_DTYPE_F16, 4, 4, 0, 0, 12}, 1},
      {{PROBE_KIND_OTHER, "fp16", PROBE_DTYPE_F16, 6, 2, 0, 0, 12}, 1},
      {{PROBE_KIND_OTHER, "fp16", PROBE_DTYPE_F16, 4, 4, 0, 1, 12}, 1}, /* skipped */
      {{PROBE_KIND_OTHER, "fp16", PROBE_DTYPE_F16, 4, 4, 0, 1, 40}, 1},
      {{PROBE_KIND_OTHER, "fp32", PROBE_DTYPE_F32, 4, 4, 0, 1, 12}, 1},
      /* controls, every step skipped (the event: the first overflow) */
      {{PROBE_KIND_OTHER, "fp16", PROBE_DTYPE_F16, 4, 4, 1, 1, 12}, 0}, /* flushed */
      {{PROBE_KIND_OTHER, "fp16", PROBE_DTYPE_F16, 2, 5, 0, 1, 12}, 0}, /* more inf */
      {{PROBE_KIND_OTHER, "fp16", PROBE_DTYPE_F16, 0, 3, 0, 1, 12}, 0}, /* no zeros */
      {{PROBE_KIND_LINEAR, "fp16", PROBE_DTYPE_F16, 4, 4, 0, 1, 12}, 0},
  };
  for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
    zdiv_trace(p, &c[i].z);
    probe_diag d;
    probe_diag_of(&d, p);
    ck_assert_msg(probe_diag_problem(&d), "case %zu: healthy", i);
    ck_assert_msg(d.findings[0].id == (c[i].np ? PROBE_DIAG_FINDING_NOT_PRECISION
                                               : PROBE_DIAG_FINDING_FORCE_FP32),
                  "case %zu: %s: %s", i, probe_diag_finding_name(d.findings[0].id),
                  d.findings[0].title);
    for (int k = 0; c[i].np && k < d.n_findings; k++) {
      ck_assert_int_ne(d.findings[k].id, PROBE_DIAG_FINDING_FORCE_FP32);
      ck_assert_msg(!strstr(d.findings[k].next_step, "bisect"), "case %zu: %s",
                    i, d.findings[k].next_step);
    }
    if (c[i].np && c[i].z.prec != PROBE_DTYPE_F32)
      ck_assert_msg(strstr(d.findings[0].title, "division by 0"), "%s",
                    d.findings[0].title);
    probe_diag_free(&d);
  }
  unlink(p);
}
END_TEST


/* A NaN (no inf) that the records show FP16 could not have made: nothing
 * its op received could overflow (finite, inside the range, an attention's
 * scores bounded by ||W||^2 (||x||+1)^2 below it) or had flushed, and its
 * op makes the NaN in any precision. The hunt (/tmp/hunt_diag2, findings
 * 2, 4, 6) saw "keep it in FP32" for a fully masked attention row, a
 * LayerNorm(eps=0) of padding rows and a where(x>0, sqrt(x), 0) backward;
 * FP32 and bisect both said not-precision. Counter-cases, where FP16 can
 * be the cause, keep force-fp32. */
typedef struct npnan {
  probe_kind kind;
  const char *policy;
  probe_dtype prec; /* the layer under test's */
  int fwd;          /* NaN in its forward output, else in its grad_in */
  float in_mag;     /* its input's (forward) magnitude */
  int zeros;        /* exact zeros in its input and output */
  int tiny;         /* an FP16 subnormal beside the zeros (flushing) */
  int n_weights;    /* weight records of its call (q, k, v, o ...) */
  int nans;         /* NaN it makes */
  int np;           /* expected: not-precision (else force-fp32) */
} npnan;

static void npnan_trace(const char *p, const npnan *z) {
  probe_session *s = hb_open(p, z->policy);
  int32_t pre = hb_layer(s, "pre", PROBE_KIND_LINEAR,
                         z->prec == PROBE_DTYPE_BF16 ? PROBE_DTYPE_BF16 : PROBE_DTYPE_F16);
  int32_t x_id = hb_layer(s, "blk.x", z->kind, z->prec);
  int32_t loss = hb_layer(s, "loss", PROBE_KIND_LOSS, PROBE_DTYPE_F32);
  float x[N], y[N], w[N], g[N], gi[N], one[1] = {1.0f};
  for (int step = 0; step < 4; step++) {
    int bad = step == 3;
    ck_assert_int_eq(probe_step_begin(s, step), PROBE_OK);
    for (int i = 0; i < N; i++) {
      x[i] = z->in_mag * (0.5f + (float)i / N);
      y[i] = 0.5f + (float)i / N;
      w[i] = 0.1f;
      g[i] = 0.01f * (1 + i);
      gi[i] = 0.02f * (1 + i);
    }
    for (int i = 0; i < z->zeros; i++) x[N - 1 - i] = y[N - 1 - i] = 0.0f;
    if (z->tiny) x[0] = y[0] = 1e-6f; /* an FP16 subnormal */
    hb_rec(s, pre, PROBE_SITE_FWD_IN, w, N);
    hb_rec(s, pre, PROBE_SITE_WEIGHT, w, N);
    hb_rec(s, pre, PROBE_SITE_FWD_OUT, x, N);
    hb_rec(s, x_id, PROBE_SITE_FWD_IN, x, N);
    for (int k = 0; k < z->n_weights; k++) hb_rec(s, x_id, PROBE_SITE_WEIGHT, w, N);
    for (int i = 0; bad && z->fwd && i < z->nans; i++) y[N - 1 - i] = NAN;
    hb_rec(s, x_id, PROBE_SITE_FWD_OUT, y, N);
    hb_rec(s, loss, PROBE_SITE_FWD_IN, y, N);
    one[0] = bad && z->fwd ? NAN : 1.0f;
    hb_rec(s, loss, PROBE_SITE_FWD_OUT, one, 1);
    for (int i = 0; bad && z->fwd && i < N; i++) g[i] = NAN;
    hb_rec(s, loss, PROBE_SITE_GRAD_IN, g, N);
    hb_rec(s, x_id, PROBE_SITE_GRAD_OUT, g, N);
    for (int i = 0; bad && i < (z->fwd ? N : z->nans); i++) gi[N - 1 - i] = NAN;
    hb_rec(s, x_id, PROBE_SITE_GRAD_IN, gi, N);
    hb_rec(s, pre, PROBE_SITE_GRAD_OUT, gi, N);
    hb_rec(s, pre, PROBE_SITE_WEIGHT_GRAD, gi, N);
    hb_end(s, bad && z->fwd ? NAN : 1.0, 1.0);
  }
  ck_assert_int_eq(probe_session_close(s), PROBE_OK);
}

START_TEST(test_nan_without_precision_evidence) {
  const char *p = tmp_path("npnan");
  const npnan c[] = {
      /* an attention row with every position masked: small inputs and
       * weights (4 records, q k v o) bound the scores far below 65504 */
      {PROBE_KIND_ATTENTION, "fp16", PROBE_DTYPE_F16, 1, 1.0f, 0, 0, 4, 4, 1},
      /* the same with big inputs: the scores can overflow (inf - inf) */
      {PROBE_KIND_ATTENTION, "fp16", PROBE_DTYPE_F16, 1, 100.0f, 0, 0, 4, 4, 0},
      /* no weight recorded: no bound, the precision reading stays */
      {PROBE_KIND_ATTENTION, "fp16", PROBE_DTYPE_F16, 1, 1.0f, 0, 0, 0, 4, 0},
      /* big inputs in BF16, judged against BF16's range */
      {PROBE_KIND_ATTENTION, "bf16", PROBE_DTYPE_BF16, 1, 100.0f, 0, 0, 4, 4, 1},
      /* an FP32 module of a mixed run, from a finite input without zeros
       * (a sqrt of a negative value): its op does it in FP32 too */
      {PROBE_KIND_OTHER, "fp16", PROBE_DTYPE_F32, 1, 1.0f, 0, 0, 0, 2, 1},
      /* ... but with zeros beside an FP16 subnormal: FP16 upstream can
       * have flushed them */
      {PROBE_KIND_OTHER, "fp16", PROBE_DTYPE_F32, 1, 1.0f, 3, 1, 0, 2, 0},
      /* LayerNorm with padding rows (zeros >= NaN) */
      {PROBE_KIND_LAYERNORM, "fp16", PROBE_DTYPE_F16, 1, 1.0f, 8, 0, 1, 8, 1},
      /* LayerNorm whose input can overflow its FP16 variance */
      {PROBE_KIND_LAYERNORM, "fp16", PROBE_DTYPE_F16, 1, 300.0f, 8, 0, 1, 8, 0},
      /* LayerNorm whose input overflows FP16 on entry */
      {PROBE_KIND_LAYERNORM, "fp16", PROBE_DTYPE_F16, 1, 70000.0f, 8, 0, 1, 8, 0},
      /* LayerNorm with more NaN than zero values: not only zero rows */
      {PROBE_KIND_LAYERNORM, "fp16", PROBE_DTYPE_F16, 1, 1.0f, 2, 0, 1, 8, 0},
      /* a custom backward's NaN at its forward zeros: 0 times sqrt'(0)
       * of a where's masked-out branch (hunt d01) */
      {PROBE_KIND_OTHER, "fp16", PROBE_DTYPE_F16, 0, 1.0f, 5, 0, 0, 5, 1},
      /* more NaN than zeros, or flushed zeros: FP16 may be the cause */
      {PROBE_KIND_OTHER, "fp16", PROBE_DTYPE_F16, 0, 1.0f, 2, 0, 0, 5, 0},
      {PROBE_KIND_OTHER, "fp16", PROBE_DTYPE_F16, 0, 1.0f, 5, 1, 0, 5, 0},
      /* an FP32 custom module's backward NaN from a finite gradient */
      {PROBE_KIND_OTHER, "fp16", PROBE_DTYPE_F32, 0, 1.0f, 0, 0, 0, 5, 1},
  };
  for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
    npnan_trace(p, &c[i]);
    probe_diag d;
    probe_diag_of(&d, p);
    ck_assert_msg(d.origin_layer >= 0 &&
                      !strcmp(probe_diag_layer_name(&d, d.origin_layer), "blk.x"),
                  "case %zu: origin %s", i, probe_diag_layer_name(&d, d.origin_layer));
    ck_assert_msg(d.n_findings > 0, "case %zu: no finding", i);
    probe_diag_finding_id want = c[i].np ? PROBE_DIAG_FINDING_NOT_PRECISION
                                         : PROBE_DIAG_FINDING_FORCE_FP32;
    ck_assert_msg(d.findings[0].id == want, "case %zu: %s: %s (%s)", i,
                  probe_diag_finding_name(d.findings[0].id), d.findings[0].title,
                  d.event_evidence);
    for (int k = 0; c[i].np && k < d.n_findings; k++) {
      ck_assert_int_ne(d.findings[k].id, PROBE_DIAG_FINDING_FORCE_FP32);
      ck_assert_msg(!strstr(d.findings[k].next_step, "bisect"), "case %zu: %s", i,
                    d.findings[k].next_step);
    }
    if (c[i].np) {
      ck_assert_msg(strstr(d.findings[0].title, "not a precision problem"),
                    "case %zu: %s", i, d.findings[0].title);
      /* no "produced in FP16 upstream" beside a finite input */
      ck_assert_msg(!text_has(&d, "produced in FP16 upstream"), "case %zu", i);
    }
    probe_diag_free(&d);
  }
  unlink(p);
}
END_TEST


/* A NaN in a custom module (kind other: the tracer cannot tell its op)
 * in FP16/BF16 where no record shows an overflow or a flush was "keep it
 * in FP32" at full confidence (hunt, 2026-12-04): nothing rules the
 * precision in, nor out. Its force-fp32 finding now says the evidence is
 * weak, ranks below SCORE_FORCE_FP32 (90) and asks for the FP32 check
 * first; with an overflow or a flush in the records, or a kind whose op is
 * known, it stays as it was. */
static const struct {
  npnan z;
  int weak;
} weak_cases[] = {
    /* weak: finite, in range, nothing flushed */
    {{PROBE_KIND_OTHER, "fp16", PROBE_DTYPE_F16, 1, 1.0f, 0, 0, 0, 2, 0}, 1},
    {{PROBE_KIND_OTHER, "fp16", PROBE_DTYPE_F16, 1, 100.0f, 0, 0, 0, 4, 0}, 1},
    {{PROBE_KIND_OTHER, "bf16", PROBE_DTYPE_BF16, 1, 1000.0f, 0, 0, 0, 3, 0}, 1},
    /* its backward: more NaN than its forward's exact zeros */
    {{PROBE_KIND_OTHER, "fp16", PROBE_DTYPE_F16, 0, 1.0f, 2, 0, 0, 5, 0}, 1},
    /* not weak: zeros beside an FP16 subnormal (flushing recorded) */
    {{PROBE_KIND_OTHER, "fp16", PROBE_DTYPE_F16, 1, 1.0f, 3, 1, 0, 2, 0}, 0},
    {{PROBE_KIND_OTHER, "fp16", PROBE_DTYPE_F16, 0, 1.0f, 5, 1, 0, 5, 0}, 0},
    /* not weak: an input beyond FP16's range */
    {{PROBE_KIND_OTHER, "fp16", PROBE_DTYPE_F16, 1, 70000.0f, 0, 0, 0, 2, 0}, 0},
    /* not weak: a kind whose op is known (a linear or an activation makes
     * NaN of finite values only through an overflow) */
    {{PROBE_KIND_LINEAR, "fp16", PROBE_DTYPE_F16, 1, 1.0f, 0, 0, 1, 2, 0}, 0},
    {{PROBE_KIND_ACTIVATION, "fp16", PROBE_DTYPE_F16, 1, 1.0f, 0, 0, 0, 2, 0}, 0},
};

/* postmortem --json: the force-fp32 finding's weak_evidence is WEAK (1/0)
 * and every other finding's false, read with /usr/bin/python3's json. */
static void weak_json_check(const probe_diag *d, size_t i, int weak) {
  char *js = NULL;
  ck_assert_int_eq(probe_diag_render_json(d, &js), PROBE_OK);
  char jp[320], cmd[800];
  snprintf(jp, sizeof jp, "%s.json", tmp_path("weaknan"));
  FILE *fj = fopen(jp, "w");
  ck_assert(fj != NULL);
  fputs(js, fj);
  fclose(fj);
  free(js);
  snprintf(cmd, sizeof cmd,
           "/usr/bin/python3 -c \"import json,sys; f=json.load(open(sys.argv[1]))"
           "['diagnosis']; w=[x['weak_evidence'] for x in f if x['id']=="
           "'force-fp32']; o=[x['weak_evidence'] for x in f if x['id']!="
           "'force-fp32']; sys.exit(0 if w and w[0] is %s and not any(o) "
           "else 1)\" '%s'",
           weak ? "True" : "False", jp);
  int rc = system(cmd);
  unlink(jp);
  ck_assert_msg(rc == 0, "case %zu: weak_evidence is not %s in the JSON", i,
                weak ? "true" : "false");
}

START_TEST(test_custom_nan_is_weak_evidence) {
  const char *p = tmp_path("weaknan");
  size_t i = (size_t)_i;
  npnan_trace(p, &weak_cases[i].z);
  probe_diag d;
  probe_diag_of(&d, p);
  const probe_diag_finding *f = find_id(&d, PROBE_DIAG_FINDING_FORCE_FP32);
  ck_assert_msg(f != NULL, "case %zu: no force-fp32; first %s: %s", i,
                probe_diag_finding_name(d.findings[0].id), d.findings[0].title);
  int weak = strstr(f->title, "evidence is weak") != NULL;
  ck_assert_msg(weak == weak_cases[i].weak, "case %zu: %s (score %g)", i,
                f->title, f->score);
  if (weak_cases[i].weak) {
    ck_assert_msg(f->score < 90, "case %zu: score %g", i, f->score);
    ck_assert_msg(strstr(f->next_step, "in FP32 too") &&
                      strstr(f->next_step, "--precision fp32"),
                  "case %zu: %s", i, f->next_step);
    ck_assert_msg(text_has(&d, "no record shows an overflow or an underflow"),
                  "case %zu", i);
  } else {
    ck_assert_msg(f->score >= 90 && strstr(f->title, "keep it in FP32"),
                  "case %zu: %s (score %g)", i, f->title, f->score);
  }
  weak_json_check(&d, i, weak_cases[i].weak);
  probe_diag_free(&d);
  unlink(p);
}
END_TEST

static Suite *make_diagnose_suite(void) {
  Suite *s = suite_create("diagnose");
  TCase *tc = tcase_create("engine");
  tcase_set_timeout(tc, 30);
  tcase_add_test(tc, test_healthy);
  tcase_add_test(tc, test_arrived_in_input);
  tcase_add_test(tc, test_weights_nonfinite_later);
  tcase_add_test(tc, test_not_closed);
  tcase_add_test(tc, test_aborted_trace);
  tcase_add_test(tc, test_loss_at_unrecorded_step);
  tcase_add_test(tc, test_bn_reduction_overflow);
  tcase_add_test(tc, test_softmax_underflow_to_inf);
  tcase_add_test(tc, test_underflow_from_fp32_layers);
  tcase_add_test(tc, test_config_scaling);
  tcase_add_test(tc, test_scaler_at_scale_one_is_on);
  tcase_add_test(tc, test_input_nan);
  tcase_add_test(tc, test_linear_overflow_nan_downstream);
  tcase_add_test(tc, test_warmup_backoffs_are_healthy);
  tcase_add_test(tc, test_nonfinite_loss_steps_are_not_silent);
  tcase_add_test(tc, test_input_beyond_fp16_range);
  tcase_add_test(tc, test_fp32_events);
  tcase_add_test(tc, test_nonfinite_input_not_called_finite);
  tcase_add_test(tc, test_custom_module_is_a_candidate_by_name);
  tcase_add_test(tc, test_precision_and_nan_only_evidence);
  tcase_add_test(tc, test_shared_module_first_call_overflows);
  tcase_add_test(tc, test_shared_module_second_call_fed_by_first);
  tcase_add_test(tc, test_shared_module_backward_call_fed_by_previous);
  tcase_add_test(tc, test_shared_module_third_call_fed_by_second);
  tcase_add_test(tc, test_single_call_text_unchanged);
  tcase_add_test(tc, test_loss_nan_from_a_finite_prediction);
  tcase_add_test(tc, test_loss_outside_modules);
  tcase_add_test(tc, test_loss_outside_every_precision);
  tcase_add_test(tc, test_nan_of_exact_zeros_is_not_precision);
  tcase_add_test(tc, test_nan_without_precision_evidence);
  tcase_add_loop_test(tc, test_custom_nan_is_weak_evidence, 0,
                      (int)(sizeof weak_cases / sizeof weak_cases[0]));
  tcase_add_test(tc, test_weights_nonfinite_before_any_update);
  tcase_add_test(tc, test_weights_outgrew_fp16);
  tcase_add_test(tc, test_weights_changed_outside_the_optimizer);
  tcase_add_test(tc, test_unscaled_gradient_overflow);
  tcase_add_test(tc, test_gradient_flushed_at_the_handover);
  tcase_add_test(tc, test_scale_collapse);
  tcase_add_test(tc, test_clip_before_unscale_signature);
  tcase_add_test(tc, test_clip_norm_against_records);
  tcase_add_test(tc, test_correct_clip_order_no_signature);
  tcase_add_test(tc, test_no_loss_scale_underflow);
  tcase_add_test(tc, test_scale_below_one_underflow);
  tcase_add_test(tc, test_fp32_divergence_is_lr);
  tcase_add_test(tc, test_falling_loss_is_not_lr);
  tcase_add_test(tc, test_killed_writer);
  tcase_add_test(tc, test_no_steps_is_not_healthy);
  tcase_add_test(tc, test_json_has_no_nan);
  tcase_add_test(tc, test_text_escape);
  tcase_add_test(tc, test_shell_quote);
  tcase_add_test(tc, test_stored_command_is_data);
  tcase_add_test(tc, test_config_counts_are_whole_numbers);
  tcase_add_test(tc, test_hostile_names);
  tcase_add_test(tc, test_clip_order_cannot_tell);
  tcase_add_test(tc, test_json_inf_is_a_string);
  tcase_add_test(tc, test_external_command);
  tcase_add_loop_test(tc, test_candidates_need_escape, 0, 5);
  tcase_add_test(tc, test_norm_collapse_records);
  tcase_add_test(tc, test_resolution_fires);
  tcase_add_test(tc, test_resolution_quiet);
  tcase_add_test(tc, test_progress_reaches_the_total);
  tcase_add_test(tc, test_skipped_to_the_end_is_not_healthy);
  tcase_add_test(tc, test_clip_text_without_a_norm);
  tcase_add_test(tc, test_unskipped_gradient_inf_is_an_event);
  tcase_add_test(tc, test_backward_division_by_zeros_is_not_precision);
#ifdef PROBE_SCALAR_LOSS
  tcase_add_test(tc, test_unmeasured_loss_is_absent);
#endif
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  SRunner *sr = srunner_create(make_diagnose_suite());
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
