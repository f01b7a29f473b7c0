/*
 * tests/trainer/test_trainer.c - Check suites of the trainer library:
 * configs (parsing, errors, overrides, round trip), the precision policy,
 * the loss scaler against GradScaler's rules, optimizers and schedules,
 * data sources (generators, CSV, HDF5), and runs (determinism, micro-batches,
 * stopping, the trace). Private headers are used for the scaler, optimizer
 * and data units.
 */
#define _POSIX_C_SOURCE 200809L
#include <check.h>
#include <float.h>
#include <hdf5.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ampprobe/probe.h"
#include "ampprobe/trainer.h"
#include "trainer-impl.h"

static char tmpdir[256];

static void tmp_path(char *buf, size_t n, const char *name) {
  snprintf(buf, n, "%s/%s", tmpdir, name);
}

static void write_file(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  ck_assert_ptr_nonnull(f);
  fputs(text, f);
  fclose(f);
}

static const char *MINI =
    "{\"name\": \"mini\", \"steps\": 5,"
    " \"model\": [{\"type\": \"linear\", \"out\": 4},"
    "             {\"type\": \"relu\"},"
    "             {\"type\": \"linear\", \"name\": \"head\", \"out\": 1}],"
    " \"data\": {\"kind\": \"regression\", \"batch\": 8, \"features\": 3}}";

/* ---- config --------------------------------------------------------------- */

START_TEST(test_every_scenario_parses) {
  ck_assert_uint_ge(probe_scenario_count(), 9);
  for (size_t i = 0; i < probe_scenario_count(); i++) {
    char err[256] = "";
    probe_train_config *c = NULL;
    const char *name = probe_scenario_name(i);
    ck_assert_msg(probe_config_load_scenario(&c, name, err, sizeof err) ==
                      PROBE_OK, "%s: %s", name, err);
    ck_assert_str_eq(probe_config_name(c), name);
    ck_assert_msg(strlen(probe_scenario_description(name)) > 20, "%s", name);
    probe_config_free(c);
  }
  ck_assert_ptr_null(probe_scenario_name(probe_scenario_count()));
  ck_assert_ptr_nonnull(probe_scenario_json(PROBE_DEFAULT_SCENARIO));
}
END_TEST

START_TEST(test_round_trip) {
  for (size_t i = 0; i < probe_scenario_count(); i++) {
    char err[256];
    probe_train_config *a, *b;
    ck_assert_int_eq(probe_config_load_scenario(&a, probe_scenario_name(i),
                                                err, sizeof err), PROBE_OK);
    ck_assert_int_eq(probe_config_set(a, "fp32", "bn,enc.*", err, sizeof err),
                     PROBE_OK);
    char *ja = probe_config_to_json(a);
    ck_assert_ptr_nonnull(ja);
    ck_assert_msg(probe_config_from_json(&b, ja, err, sizeof err) == PROBE_OK,
                  "%s", err);
    char *jb = probe_config_to_json(b);
    ck_assert_str_eq(ja, jb);
    free(ja);
    free(jb);
    probe_config_free(a);
    probe_config_free(b);
  }
}
END_TEST

/* Each bad config must fail with PROBE_ERR_CONFIG and name the key. */
static const struct {
  const char *json;
  const char *needle;
} bad_configs[] = {
    {"{\"model\": [{\"type\": \"linear\", \"out\": 1}], \"fp32\": [\"=\"]}",
     "fp32[0]: expected a kind, a layer-name glob or =NAME"},
    {"{\"model\": [{\"type\": \"linear\", \"out\": 1}], \"fp32\": \"bn, =\"}",
     "fp32: entry '=' names no layer"},
    {"{\"model\": [{\"type\": \"linear\", \"out\": 1}], \"stepz\": 3}",
     "stepz: unknown key"},
    {"{\"model\": [{\"type\": \"linear\", \"outt\": 1}]}", "model[0].outt"},
    {"{\"model\": [{\"type\": \"linear\"}]}", "model[0].out"},
    {"{\"model\": [{\"type\": \"conv\"}]}", "model[0].type: expected linear"},
    {"{\"model\": []}", "model: expected a non-empty list"},
    {"{\"steps\": 3}", "model:"},
    {"{\"model\": [{\"type\": \"linear\", \"out\": 1}], \"steps\": \"ten\"}",
     "steps: expected an integer"},
    {"{\"model\": [{\"type\": \"linear\", \"out\": 1}], \"steps\": 0}",
     "steps: 0 is out of range"},
    {"{\"model\": [{\"type\": \"linear\", \"out\": 1}], \"precision\": \"fp8\"}",
     "precision: expected fp32 | fp16 | bf16"},
    {"{\"model\": [{\"type\": \"linear\", \"out\": 1}], \"scaler\": "
     "{\"backoff\": 2.0}}", "scaler.backoff"},
    {"{\"model\": [{\"type\": \"linear\", \"out\": 4}], \"loss\": "
     "\"cross_entropy\"}", "last module must be softmax"},
    {"{\"model\": [{\"type\": \"linear\", \"out\": 1}], \"data\": "
     "{\"kind\": \"csv\"}}", "data.path: required"},
    {"{\"model\": [{\"type\": \"linear\", \"out\": 1}], \"clip\": "
     "{\"before_unscale\": true}}", "needs clip.max_norm"},
    {"{\"model\": [{\"type\": \"linear\", \"name\": \"a\", \"out\": 1},"
     " {\"type\": \"relu\", \"name\": \"a\"}]}", "'a' is used twice"},
    {"{\"model\": [{\"type\": \"linear\", \"out\": 1}],}", "JSON syntax error at line 1"},
    {"[1, 2]", "expected a JSON object"},
};

START_TEST(test_bad_config) {
  char err[512] = "";
  probe_train_config *c = (probe_train_config *)1;
  probe_status st =
      probe_config_from_json(&c, bad_configs[_i].json, err, sizeof err);
  ck_assert_int_eq(st, PROBE_ERR_CONFIG);
  ck_assert_ptr_null(c);
  ck_assert_msg(strstr(err, bad_configs[_i].needle) != NULL,
                "message '%s' lacks '%s'", err, bad_configs[_i].needle);
}
END_TEST

START_TEST(test_load_errors) {
  char err[512], path[300];
  probe_train_config *c;
  ck_assert_int_eq(probe_config_load_file(&c, "/nonexistent/x.json", err,
                                          sizeof err), PROBE_ERR_NOT_FOUND);
  ck_assert_ptr_nonnull(strstr(err, "/nonexistent/x.json"));
  ck_assert_int_eq(probe_config_load_scenario(&c, "nope", err, sizeof err),
                   PROBE_ERR_NOT_FOUND);
  ck_assert_ptr_nonnull(strstr(err, "unknown scenario 'nope'"));
  ck_assert_ptr_nonnull(strstr(err, "revin-overflow"));
  tmp_path(path, sizeof path, "bad.json");
  write_file(path, "{\n  \"model\": [\n    {\"type\": \"relu\"}\n  ],\n  \"seed\": -1\n}\n");
  ck_assert_int_eq(probe_config_load_file(&c, path, err, sizeof err),
                   PROBE_ERR_CONFIG);
  ck_assert_ptr_nonnull(strstr(err, "bad.json: seed"));
  tmp_path(path, sizeof path, "good.json");
  write_file(path, MINI);
  ck_assert_int_eq(probe_config_load_file(&c, path, err, sizeof err), PROBE_OK);
  ck_assert_int_eq(probe_config_steps(c), 5);
  probe_config_free(c);
}
END_TEST

START_TEST(test_set) {
  char err[256];
  probe_train_config *c;
  ck_assert_int_eq(probe_config_from_json(&c, MINI, err, sizeof err), PROBE_OK);
  ck_assert_int_eq(probe_config_set(c, "steps", "42", err, sizeof err), PROBE_OK);
  ck_assert_int_eq(c->steps, 42);
  ck_assert_int_eq(probe_config_set(c, "precision", "bf16", err, sizeof err), PROBE_OK);
  ck_assert_int_eq(c->precision, PROBE_DTYPE_BF16);
  ck_assert_int_eq(probe_config_set(c, "scaler.init", "1024", err, sizeof err), PROBE_OK);
  ck_assert_double_eq(c->scaler.init, 1024.0);
  ck_assert_int_eq(probe_config_set(c, "scaler.enabled", "false", err, sizeof err), PROBE_OK);
  ck_assert_int_eq(c->scaler.enabled, 0);
  ck_assert_int_eq(probe_config_set(c, "fp32", " bn, enc.* ,softmax", err, sizeof err), PROBE_OK);
  ck_assert_int_eq(c->n_fp32, 3);
  ck_assert_str_eq(c->fp32[1], "enc.*");
  ck_assert_int_eq(probe_config_set(c, "clip.max_norm", "0.5", err, sizeof err), PROBE_OK);
  ck_assert_int_eq(probe_config_set(c, "clip.before_unscale", "1", err, sizeof err), PROBE_OK);
  ck_assert_int_eq(probe_config_set(c, "lr", "0.1", err, sizeof err), PROBE_OK);
  ck_assert_double_eq(c->opt.lr, 0.1);
  /* Errors leave the config unchanged. */
  ck_assert_int_eq(probe_config_set(c, "steps", "12x", err, sizeof err), PROBE_ERR_CONFIG);
  ck_assert_ptr_nonnull(strstr(err, "steps: '12x'"));
  ck_assert_int_eq(probe_config_set(c, "precision", "fp64", err, sizeof err), PROBE_ERR_CONFIG);
  ck_assert_int_eq(probe_config_set(c, "scaler.backoff", "3", err, sizeof err), PROBE_ERR_CONFIG);
  ck_assert_int_eq(probe_config_set(c, "clip.max_norm", "0", err, sizeof err), PROBE_ERR_CONFIG);
  ck_assert_ptr_nonnull(strstr(err, "before_unscale"));
  ck_assert_int_eq(probe_config_set(c, "warp", "9", err, sizeof err), PROBE_ERR_CONFIG);
  ck_assert_ptr_nonnull(strstr(err, "unknown setting 'warp'"));
  ck_assert_int_eq(c->steps, 42);
  ck_assert_int_eq(c->precision, PROBE_DTYPE_BF16);
  ck_assert_double_eq(c->clip_max_norm, 0.5);
  probe_config_free(c);
}
END_TEST

/* ---- policy --------------------------------------------------------------- */

START_TEST(test_policy_match) {
  ck_assert(probe_policy_match("bn", "enc.bn1", PROBE_KIND_BN));
  ck_assert(probe_policy_match("bn", "whatever", PROBE_KIND_BN));
  ck_assert(!probe_policy_match("bn", "enc.bn1", PROBE_KIND_LINEAR));
  ck_assert(probe_policy_match("enc.bn2", "enc.bn2", PROBE_KIND_BN));
  ck_assert(!probe_policy_match("enc.bn2", "enc.bn1", PROBE_KIND_BN));
  ck_assert(probe_policy_match("*.bn*", "enc.bn1", PROBE_KIND_BN));
  ck_assert(probe_policy_match("*.bn*", "dec.bn", PROBE_KIND_BN));
  ck_assert(!probe_policy_match("*.bn*", "bn", PROBE_KIND_LINEAR));
  ck_assert(probe_policy_match("enc.*", "enc.fc1", PROBE_KIND_LINEAR));
  ck_assert(!probe_policy_match("enc.*", "head.fc", PROBE_KIND_LINEAR));
  ck_assert(probe_policy_match("head.soft?ax", "head.softmax", PROBE_KIND_SOFTMAX));
  ck_assert(probe_policy_match("softmax", "head.sm", PROBE_KIND_SOFTMAX));
  ck_assert(!probe_policy_match("softmax", "head.sm", PROBE_KIND_ATTENTION));
  /* =NAME: one layer, its name exactly - never a kind, never a glob (a
   * BatchNorm named "bn" forced as "bn" forced every BatchNorm: bisect's
   * layer-level answer named the wrong layer) */
  ck_assert(probe_policy_match("=bn", "bn", PROBE_KIND_BN));
  ck_assert(!probe_policy_match("=bn", "enc.bn1", PROBE_KIND_BN));
  ck_assert(probe_policy_match("=linear", "linear", PROBE_KIND_BN));
  ck_assert(!probe_policy_match("=linear", "enc.fc1", PROBE_KIND_LINEAR));
  ck_assert(probe_policy_match("=enc.bn2", "enc.bn2", PROBE_KIND_BN));
  ck_assert(!probe_policy_match("=enc.*", "enc.fc1", PROBE_KIND_LINEAR));
  ck_assert(probe_policy_match("=enc.*", "enc.*", PROBE_KIND_LINEAR));
  ck_assert(!probe_policy_match("=l[0]", "l0", PROBE_KIND_LINEAR));
  ck_assert(probe_policy_match("=l[0]", "l[0]", PROBE_KIND_LINEAR));
  ck_assert(!probe_policy_match("=l?", "l0", PROBE_KIND_LINEAR));
  ck_assert(!probe_policy_match("=", "", PROBE_KIND_LINEAR));
  ck_assert(!probe_policy_match("=", "=", PROBE_KIND_LINEAR));
  ck_assert(probe_policy_match("==x", "=x", PROBE_KIND_LINEAR));
}
END_TEST

static probe_dtype prec_of(const probe_layer_desc *l, size_t n,
                               const char *name) {
  for (size_t i = 0; i < n; i++)
    if (!strcmp(l[i].name, name)) return l[i].precision;
  ck_abort_msg("no layer %s", name);
  return PROBE_DTYPE_F32;
}

START_TEST(test_policy_layers) {
  char err[256];
  probe_train_config *c;
  ck_assert_int_eq(probe_config_load_scenario(&c, "bn-overflow", err, sizeof err), PROBE_OK);
  probe_layer_desc l[40];
  size_t n;
  ck_assert_int_eq(probe_config_layers(c, l, 40, &n), PROBE_OK);
  ck_assert_uint_eq(n, 7); /* input + 5 modules + loss */
  ck_assert_str_eq(l[0].name, "input");
  ck_assert_int_eq(l[0].kind, PROBE_KIND_INPUT);
  ck_assert_str_eq(l[1].name, "enc.bn1");
  ck_assert_int_eq(l[1].kind, PROBE_KIND_BN);
  ck_assert_str_eq(l[n - 1].name, "loss");
  ck_assert_int_eq(l[n - 1].precision, PROBE_DTYPE_F32); /* loss in FP32 */
  ck_assert_int_eq(prec_of(l, n, "enc.bn1"), PROBE_DTYPE_F16);
  probe_config_set(c, "fp32", "enc.bn1", err, sizeof err);
  probe_config_layers(c, l, 40, &n);
  ck_assert_int_eq(prec_of(l, n, "enc.bn1"), PROBE_DTYPE_F32);
  ck_assert_int_eq(prec_of(l, n, "enc.bn2"), PROBE_DTYPE_F16);
  probe_config_set(c, "fp32", "bn", err, sizeof err);
  probe_config_layers(c, l, 40, &n);
  ck_assert_int_eq(prec_of(l, n, "enc.bn1"), PROBE_DTYPE_F32);
  ck_assert_int_eq(prec_of(l, n, "enc.bn2"), PROBE_DTYPE_F32);
  ck_assert_int_eq(prec_of(l, n, "enc.fc1"), PROBE_DTYPE_F16);
  probe_config_set(c, "fp32", "enc.*", err, sizeof err);
  probe_config_layers(c, l, 40, &n);
  ck_assert_int_eq(prec_of(l, n, "enc.fc1"), PROBE_DTYPE_F32);
  ck_assert_int_eq(prec_of(l, n, "head.fc"), PROBE_DTYPE_F16);
  ck_assert_int_eq(probe_config_set(c, "fp32", "=enc.bn2, =head.fc", err, sizeof err),
                   PROBE_OK);
  probe_config_layers(c, l, 40, &n);
  ck_assert_int_eq(prec_of(l, n, "enc.bn1"), PROBE_DTYPE_F16);
  ck_assert_int_eq(prec_of(l, n, "enc.bn2"), PROBE_DTYPE_F32);
  ck_assert_int_eq(prec_of(l, n, "head.fc"), PROBE_DTYPE_F32);
  ck_assert_int_eq(prec_of(l, n, "enc.fc1"), PROBE_DTYPE_F16);
  ck_assert_int_eq(probe_config_set(c, "fp32", "bn,=", err, sizeof err),
                   PROBE_ERR_CONFIG);
  ck_assert_ptr_nonnull(strstr(err, "entry '=' names no layer"));
  probe_config_set(c, "fp32", "enc.*", err, sizeof err);
  probe_config_set(c, "precision", "bf16", err, sizeof err);
  probe_config_layers(c, l, 40, &n);
  ck_assert_int_eq(prec_of(l, n, "head.fc"), PROBE_DTYPE_BF16);
  probe_config_set(c, "precision", "fp32", err, sizeof err);
  probe_config_layers(c, l, 40, &n);
  for (size_t i = 0; i < n; i++) ck_assert_int_eq(l[i].precision, PROBE_DTYPE_F32);
  /* count-only call */
  ck_assert_int_eq(probe_config_layers(c, NULL, 0, &n), PROBE_OK);
  ck_assert_uint_eq(n, 7);
  probe_config_free(c);

  /* RevIN's denormalisation is a layer of its own that follows RevIN. */
  ck_assert_int_eq(probe_config_load_scenario(&c, "revin-overflow", err, sizeof err), PROBE_OK);
  probe_config_layers(c, l, 40, &n);
  ck_assert_str_eq(l[n - 2].name, "revin.denorm");
  ck_assert_int_eq(l[n - 2].kind, PROBE_KIND_REVIN);
  ck_assert_int_eq(l[n - 2].precision, PROBE_DTYPE_F16);
  probe_config_set(c, "fp32", "revin", err, sizeof err);
  probe_config_layers(c, l, 40, &n);
  ck_assert_int_eq(l[n - 2].precision, PROBE_DTYPE_F32);
  ck_assert_int_eq(prec_of(l, n, "revin"), PROBE_DTYPE_F32);
  char pol[256];
  ck_assert_int_eq(probe_config_policy_str(c, pol, sizeof pol), PROBE_OK);
  ck_assert_str_eq(pol, "fp16; fp32: revin; loss fp32");
  probe_config_free(c);
}
END_TEST

/* ---- loss scaler ---------------------------------------------------------- */

static pt_scaler_spec scaler_spec(double init, int64_t interval, int hyst,
                                  double min_scale) {
  pt_scaler_spec s = {1, init, 2.0, 0.5, interval, hyst, min_scale};
  return s;
}

/* A scripted sequence: 'o' overflow, '.' clean. Expected scale after each
 * step and the event kind (-1 none), derived by hand from GradScaler's
 * _amp_update_scale_ (growth_interval 3). */
START_TEST(test_scaler_gradscaler) {
  pt_scaler_spec sp = scaler_spec(65536.0, 3, 1, 0.0);
  pt_scaler s;
  pt_scaler_init(&s, &sp);
  const char *seq = "..o...o.o....oo...";
  const double scale[] = {65536, 65536, 32768, 32768, 32768, 65536,
                          32768, 32768, 16384, 16384, 16384, 32768,
                          32768, 16384, 8192,  8192,  8192,  16384};
  const int kind[] = {-1, -1, PROBE_SCALER_BACKOFF, -1, -1, PROBE_SCALER_GROWTH,
                      PROBE_SCALER_BACKOFF, -1, PROBE_SCALER_BACKOFF, -1, -1,
                      PROBE_SCALER_GROWTH, -1, PROBE_SCALER_BACKOFF,
                      PROBE_SCALER_BACKOFF, -1, -1, PROBE_SCALER_GROWTH};
  const int tracker[] = {1, 2, 0, 1, 2, 0, 0, 1, 0, 1, 2, 0, 1, 0, 0, 1, 2, 0};
  for (int i = 0; seq[i]; i++) {
    probe_scaler_event ev;
    float before = s.scale;
    int got = pt_scaler_update(&s, seq[i] == 'o', i, &ev);
    ck_assert_msg(s.scale == (float)scale[i], "step %d: scale %g, want %g", i,
                  s.scale, scale[i]);
    ck_assert_int_eq(s.growth_tracker, tracker[i]);
    ck_assert_int_eq(got ? ev.kind : -1, kind[i]);
    if (got) {
      ck_assert_int_eq(ev.step, i);
      ck_assert(ev.old_scale == before);
      ck_assert(ev.new_scale == s.scale);
    }
  }
}
END_TEST

START_TEST(test_scaler_growth_refused) {
  /* Growth that would overflow FP32 is refused; the tracker still resets. */
  pt_scaler_spec sp = scaler_spec(0x1.0p127, 2, 1, 0.0);
  pt_scaler s;
  pt_scaler_init(&s, &sp);
  probe_scaler_event ev;
  ck_assert_int_eq(pt_scaler_update(&s, 0, 0, &ev), 0);
  ck_assert_int_eq(pt_scaler_update(&s, 0, 1, &ev), 0);
  ck_assert(s.scale == 0x1.0p127f);
  ck_assert_int_eq(s.growth_tracker, 0);
  ck_assert_int_eq(pt_scaler_update(&s, 1, 2, &ev), 1);
  ck_assert(s.scale == 0x1.0p126f);
  /* default interval 2000: no growth before 2000 clean steps */
  sp = scaler_spec(65536.0, 2000, 1, 0.0);
  pt_scaler_init(&s, &sp);
  for (int i = 0; i < 1999; i++) ck_assert_int_eq(pt_scaler_update(&s, 0, i, &ev), 0);
  ck_assert_int_eq(pt_scaler_update(&s, 0, 1999, &ev), 1);
  ck_assert_int_eq(ev.kind, PROBE_SCALER_GROWTH);
  ck_assert(s.scale == 131072.0f);
}
END_TEST

START_TEST(test_scaler_hysteresis) {
  /* Megatron: hysteresis 2 absorbs the first overflow; the tracker is only
   * restored by growth, so later overflows back off at once. */
  pt_scaler_spec sp = scaler_spec(1024.0, 3, 2, 0.0);
  pt_scaler s;
  pt_scaler_init(&s, &sp);
  probe_scaler_event ev;
  ck_assert_int_eq(pt_scaler_update(&s, 1, 0, &ev), 1);
  ck_assert_int_eq(ev.kind, PROBE_SCALER_HYSTERESIS);
  ck_assert(s.scale == 1024.0f);
  ck_assert_int_eq(pt_scaler_update(&s, 0, 1, &ev), 0);
  ck_assert_int_eq(pt_scaler_update(&s, 1, 2, &ev), 1);
  ck_assert_int_eq(ev.kind, PROBE_SCALER_BACKOFF);
  ck_assert(s.scale == 512.0f);
  ck_assert_int_eq(pt_scaler_update(&s, 1, 3, &ev), 1);
  ck_assert_int_eq(ev.kind, PROBE_SCALER_BACKOFF);
  ck_assert(s.scale == 256.0f);
  for (int i = 0; i < 2; i++) ck_assert_int_eq(pt_scaler_update(&s, 0, 4 + i, &ev), 0);
  ck_assert_int_eq(pt_scaler_update(&s, 0, 6, &ev), 1);
  ck_assert_int_eq(ev.kind, PROBE_SCALER_GROWTH);
  ck_assert(s.scale == 512.0f);
  ck_assert_int_eq(pt_scaler_update(&s, 1, 7, &ev), 1); /* absorbed again */
  ck_assert_int_eq(ev.kind, PROBE_SCALER_HYSTERESIS);
  ck_assert(s.scale == 512.0f);
}
END_TEST

START_TEST(test_scaler_min_scale) {
  pt_scaler_spec sp = scaler_spec(4.0, 2000, 1, 1.0);
  pt_scaler s;
  pt_scaler_init(&s, &sp);
  probe_scaler_event ev;
  pt_scaler_update(&s, 1, 0, &ev);
  ck_assert_int_eq(ev.kind, PROBE_SCALER_BACKOFF);
  ck_assert(s.scale == 2.0f);
  pt_scaler_update(&s, 1, 1, &ev);
  ck_assert(s.scale == 1.0f);
  ck_assert_int_eq(pt_scaler_update(&s, 1, 2, &ev), 1);
  ck_assert_int_eq(ev.kind, PROBE_SCALER_MIN_CLAMP);
  ck_assert(s.scale == 1.0f && ev.old_scale == 1.0 && ev.new_scale == 1.0);
  /* disabled scaler: scale 1, no events */
  sp.enabled = 0;
  pt_scaler_init(&s, &sp);
  ck_assert(s.scale == 1.0f);
  ck_assert_int_eq(pt_scaler_update(&s, 1, 0, &ev), 0);
  ck_assert(s.scale == 1.0f);
}
END_TEST

/* ---- optimizers and schedules --------------------------------------------- */

START_TEST(test_sgd_momentum) {
  pt_opt_spec sp = {PT_OPT_SGD, 0.1, 0.9, 0.9, 0.999, 1e-8, 0.0};
  pt_optim o;
  ck_assert_int_eq(pt_optim_init(&o, &sp, 2), PROBE_OK);
  float w[2] = {1.0f, -1.0f};
  const float g[2] = {0.5f, 1.0f};
  pt_optim_step(&o, w, g, 0.1); /* buf = g */
  ck_assert_float_eq_tol(w[0], 1.0f - 0.05f, 1e-7f);
  ck_assert_float_eq_tol(w[1], -1.0f - 0.1f, 1e-7f);
  pt_optim_step(&o, w, g, 0.1); /* buf = 0.9 g + g */
  ck_assert_float_eq_tol(w[0], 0.95f - 0.1f * 0.95f, 1e-6f);
  ck_assert_float_eq_tol(w[1], -1.1f - 0.1f * 1.9f, 1e-6f);
  pt_optim_free(&o);
}
END_TEST

START_TEST(test_adam) {
  pt_opt_spec sp = {PT_OPT_ADAM, 0.01, 0.0, 0.9, 0.999, 1e-8, 0.0};
  pt_optim o;
  pt_optim_init(&o, &sp, 3);
  float w[3] = {1.0f, 1.0f, 1.0f};
  const float g[3] = {1e-3f, -5.0f, 0.0f};
  pt_optim_step(&o, w, g, 0.01);
  /* First step: m_hat / sqrt(v_hat) = sign(g) */
  ck_assert_float_eq_tol(w[0], 0.99f, 1e-6f);
  ck_assert_float_eq_tol(w[1], 1.01f, 1e-6f);
  ck_assert_float_eq(w[2], 1.0f);
  /* Reference second step computed in double. */
  const float g2[3] = {2e-3f, -5.0f, 1.0f};
  double m0 = 0.1 * 1e-3, v0 = 0.001 * 1e-6;
  double m = 0.9 * m0 + 0.1 * 2e-3, v = 0.999 * v0 + 0.001 * 4e-6;
  double want = 0.99 - 0.01 * (m / (1 - 0.81)) / (sqrt(v / (1 - 0.998001)) + 1e-8);
  pt_optim_step(&o, w, g2, 0.01);
  ck_assert_float_eq_tol(w[0], (float)want, 1e-6f);
  pt_optim_free(&o);
  /* AdamW: decoupled decay applied to w before the Adam update. */
  pt_opt_spec spw = {PT_OPT_ADAMW, 0.1, 0.0, 0.9, 0.999, 1e-8, 0.5};
  pt_optim_init(&o, &spw, 1);
  float x = 2.0f;
  const float gz = 0.0f;
  pt_optim_step(&o, &x, &gz, 0.1);
  ck_assert_float_eq_tol(x, 2.0f * (1.0f - 0.05f), 1e-6f);
  pt_optim_free(&o);
  /* Adam with L2 decay: the decay enters the gradient, so the step is lr. */
  pt_opt_spec spl = {PT_OPT_ADAM, 0.1, 0.0, 0.9, 0.999, 1e-8, 0.5};
  pt_optim_init(&o, &spl, 1);
  x = 2.0f;
  pt_optim_step(&o, &x, &gz, 0.1);
  ck_assert_float_eq_tol(x, 1.9f, 1e-6f);
  pt_optim_free(&o);
}
END_TEST

START_TEST(test_schedule) {
  pt_sched_spec s = {PT_SCHED_CONSTANT, 0, 0.0, 0, 0.1};
  ck_assert_double_eq(pt_sched_lr(&s, 0.5, 77, 100), 0.5);
  s.warmup = 10;
  ck_assert_double_eq_tol(pt_sched_lr(&s, 1.0, 0, 100), 0.1, 1e-12);
  ck_assert_double_eq_tol(pt_sched_lr(&s, 1.0, 9, 100), 1.0, 1e-12);
  s.type = PT_SCHED_COSINE;
  s.min_lr = 0.1;
  ck_assert_double_eq_tol(pt_sched_lr(&s, 1.0, 10, 110), 1.0, 1e-12);
  ck_assert_double_eq_tol(pt_sched_lr(&s, 1.0, 109, 110), 0.1, 1e-12);
  double mid = pt_sched_lr(&s, 1.0, 10 + 99 / 2, 110);
  ck_assert(mid > 0.5 && mid < 0.6);
  /* a floor above lr never lifts the rate: lr 0 stays 0, lr 0.05 < 0.1 flat */
  for (int64_t step = 0; step < 110; step++) {
    ck_assert_double_eq(pt_sched_lr(&s, 0.0, step, 110), 0.0);
    ck_assert(pt_sched_lr(&s, 0.05, step, 110) <= 0.05);
  }
  s.type = PT_SCHED_STEP;
  s.warmup = 0;
  s.step_size = 30;
  s.gamma = 0.5;
  ck_assert_double_eq(pt_sched_lr(&s, 1.0, 29, 100), 1.0);
  ck_assert_double_eq(pt_sched_lr(&s, 1.0, 30, 100), 0.5);
  ck_assert_double_eq(pt_sched_lr(&s, 1.0, 95, 100), 0.125);
}
END_TEST

/* ---- data ----------------------------------------------------------------- */

START_TEST(test_generators) {
  char err[256];
  for (int k = 0; k < 3; k++) {
    probe_train_config *c;
    const char *name = k == 0 ? "revin-overflow" : k == 1 ? "softmax-underflow" : "healthy";
    ck_assert_int_eq(probe_config_load_scenario(&c, name, err, sizeof err), PROBE_OK);
    pt_data *d;
    ck_assert_int_eq(pt_data_open(&d, &c->data, c->loss, 7, err, sizeof err), PROBE_OK);
    int64_t B = c->data.batch, F = pt_data_in_dim(d), O = pt_data_out_dim(d);
    float *x1 = calloc((size_t)(B * F), 4), *x2 = calloc((size_t)(B * F), 4);
    float *y1 = calloc((size_t)(B * O), 4), *y2 = calloc((size_t)(B * O), 4);
    int32_t *l1 = calloc((size_t)B, 4), *l2 = calloc((size_t)B, 4);
    pt_data_batch(d, 3, 0, x1, y1, l1);
    pt_data_batch(d, 4, 0, x2, y2, l2);
    ck_assert(memcmp(x1, x2, (size_t)(B * F) * 4) != 0);
    pt_data_batch(d, 3, 0, x2, y2, l2);
    ck_assert(memcmp(x1, x2, (size_t)(B * F) * 4) == 0);
    ck_assert(memcmp(y1, y2, (size_t)(B * O) * 4) == 0);
    ck_assert(memcmp(l1, l2, (size_t)B * 4) == 0);
    if (k == 0) {
      /* large magnitudes: per-series std > 256 (RevIN's FP16 variance
       * overflows), values within FP16 range */
      for (int64_t b = 0; b < B; b++) {
        double s = 0, ss = 0;
        for (int64_t t = 0; t < F; t++) {
          s += x1[b * F + t];
          ck_assert(fabsf(x1[b * F + t]) < 60000.0f);
        }
        for (int64_t t = 0; t < F; t++)
          ss += (x1[b * F + t] - s / F) * (x1[b * F + t] - s / F);
        ck_assert_msg(ss / F > 65504.0, "series %lld variance %g", (long long)b, ss / F);
      }
    }
    if (k == 1)
      for (int64_t b = 0; b < B; b++) ck_assert(l1[b] >= 0 && l1[b] < O);
    free(x1); free(x2); free(y1); free(y2); free(l1); free(l2);
    pt_data_close(d);
    probe_config_free(c);
  }
}
END_TEST

START_TEST(test_nan_step) {
  char err[256];
  probe_train_config *c;
  ck_assert_int_eq(probe_config_load_scenario(&c, "nan-input", err, sizeof err), PROBE_OK);
  ck_assert_int_eq(c->data.nan_step, 50);
  pt_data *d;
  ck_assert_int_eq(pt_data_open(&d, &c->data, c->loss, 1, err, sizeof err), PROBE_OK);
  int64_t B = c->data.batch, F = pt_data_in_dim(d);
  float *x = calloc((size_t)(B * F), 4), *y = calloc((size_t)B, 4);
  for (int64_t step = 48; step <= 52; step++) {
    pt_data_batch(d, step, 0, x, y, NULL);
    int nans = 0;
    for (int64_t i = 0; i < B * F; i++) nans += isnan(x[i]) != 0;
    ck_assert_int_eq(nans, step == 50 ? 1 : 0);
  }
  free(x);
  free(y);
  pt_data_close(d);
  probe_config_free(c);
}
END_TEST

static probe_status open_file_data(const char *json, pt_data **d,
                                   probe_train_config **c, char *err,
                                   size_t n) {
  probe_status st = probe_config_from_json(c, json, err, n);
  if (st) return st;
  st = pt_data_open(d, &(*c)->data, (*c)->loss, 1, err, n);
  if (st) probe_config_free(*c);
  return st;
}

START_TEST(test_csv) {
  char path[300], json[1024], err[512];
  tmp_path(path, sizeof path, "data.csv");
  write_file(path, "a,b,c,target\n1,2,3,0.5\n4,5,6,1.5\n\n7, 8 ,9,2.5\n");
  snprintf(json, sizeof json,
           "{\"model\": [{\"type\": \"linear\", \"out\": 1}], \"data\": "
           "{\"kind\": \"csv\", \"path\": \"%s\", \"batch\": 16}}", path);
  probe_train_config *c;
  pt_data *d;
  ck_assert_msg(open_file_data(json, &d, &c, err, sizeof err) == PROBE_OK, "%s", err);
  ck_assert_int_eq(pt_data_in_dim(d), 3);
  ck_assert_int_eq(pt_data_out_dim(d), 1);
  float x[48], y[16];
  pt_data_batch(d, 0, 0, x, y, NULL);
  for (int b = 0; b < 16; b++) {
    /* every sampled row is one of the file's rows */
    ck_assert(x[b * 3 + 1] == x[b * 3] + 1 && x[b * 3 + 2] == x[b * 3] + 2);
    ck_assert_float_eq(y[b], (x[b * 3] - 1) / 3 + 0.5f);
  }
  pt_data_close(d);
  probe_config_free(c);
  /* classification labels in the last column */
  write_file(path, "0.1,0.2,0\n0.3,0.4,2\n0.5,0.6,1\n");
  snprintf(json, sizeof json,
           "{\"model\": [{\"type\": \"linear\", \"out\": 3}, {\"type\": "
           "\"softmax\"}], \"loss\": \"cross_entropy\", \"data\": "
           "{\"kind\": \"csv\", \"path\": \"%s\", \"batch\": 4}}", path);
  ck_assert_msg(open_file_data(json, &d, &c, err, sizeof err) == PROBE_OK, "%s", err);
  ck_assert_int_eq(pt_data_in_dim(d), 2);
  ck_assert_int_eq(pt_data_out_dim(d), 3); /* classes */
  pt_data_close(d);
  /* and a whole run on it */
  probe_train_result r;
  ck_assert_msg(probe_train(c, NULL, &r, err, sizeof err) == PROBE_OK, "%s", err);
  ck_assert_int_eq(r.steps_run, 100);
  ck_assert(isfinite(r.final_loss));
  probe_config_free(c);
  /* errors: ragged rows, text in a data row, a missing file */
  write_file(path, "1,2,3\n4,5\n");
  snprintf(json, sizeof json,
           "{\"model\": [{\"type\": \"linear\", \"out\": 1}], \"data\": "
           "{\"kind\": \"csv\", \"path\": \"%s\"}}", path);
  ck_assert_int_eq(open_file_data(json, &d, &c, err, sizeof err), PROBE_ERR_CORRUPT);
  ck_assert_ptr_nonnull(strstr(err, "data.csv:2: 2 columns, expected 3"));
  write_file(path, "1,2,3\n4,x,6\n");
  ck_assert_int_eq(open_file_data(json, &d, &c, err, sizeof err), PROBE_ERR_CORRUPT);
  ck_assert_ptr_nonnull(strstr(err, "data.csv:2: column 2 is not a number"));
  snprintf(json, sizeof json,
           "{\"model\": [{\"type\": \"linear\", \"out\": 1}], \"data\": "
           "{\"kind\": \"csv\", \"path\": \"%s/missing.csv\"}}", tmpdir);
  ck_assert_int_eq(open_file_data(json, &d, &c, err, sizeof err), PROBE_ERR_NOT_FOUND);
}
END_TEST

START_TEST(test_hdf5) {
  char path[300], json[1024], err[512];
  tmp_path(path, sizeof path, "data.h5");
  hid_t f = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  ck_assert(f >= 0);
  hsize_t dx[2] = {10, 4}, dy[1] = {10};
  double xv[40];
  int yv[10];
  for (int i = 0; i < 40; i++) xv[i] = i;
  for (int i = 0; i < 10; i++) yv[i] = i % 3;
  hid_t sx = H5Screate_simple(2, dx, NULL), sy = H5Screate_simple(1, dy, NULL);
  hid_t ds = H5Dcreate2(f, "feat", H5T_IEEE_F64LE, sx, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  H5Dwrite(ds, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, xv);
  H5Dclose(ds);
  ds = H5Dcreate2(f, "label", H5T_STD_I32LE, sy, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  H5Dwrite(ds, H5T_NATIVE_INT, H5S_ALL, H5S_ALL, H5P_DEFAULT, yv);
  H5Dclose(ds);
  H5Sclose(sx);
  H5Sclose(sy);
  H5Fclose(f);
  snprintf(json, sizeof json,
           "{\"steps\": 20, \"model\": [{\"type\": \"linear\", \"out\": 3}, "
           "{\"type\": \"softmax\"}], \"loss\": \"cross_entropy\", \"data\": "
           "{\"kind\": \"hdf5\", \"path\": \"%s\", \"x\": \"feat\", \"y\": "
           "\"label\", \"batch\": 8}}", path);
  probe_train_config *c;
  pt_data *d;
  ck_assert_msg(open_file_data(json, &d, &c, err, sizeof err) == PROBE_OK, "%s", err);
  ck_assert_int_eq(pt_data_in_dim(d), 4);
  ck_assert_int_eq(pt_data_out_dim(d), 3);
  float x[32];
  int32_t lab[8];
  pt_data_batch(d, 0, 0, x, NULL, lab);
  for (int b = 0; b < 8; b++) {
    int row = (int)x[b * 4] / 4;
    ck_assert_float_eq(x[b * 4 + 3], (float)(row * 4 + 3));
    ck_assert_int_eq(lab[b], row % 3);
  }
  pt_data_close(d);
  probe_train_result r;
  ck_assert_msg(probe_train(c, NULL, &r, err, sizeof err) == PROBE_OK, "%s", err);
  ck_assert_int_eq(r.steps_run, 20);
  probe_config_free(c);
  /* a dataset that is not there; a file that is not HDF5 */
  snprintf(json, sizeof json,
           "{\"model\": [{\"type\": \"linear\", \"out\": 1}], \"data\": "
           "{\"kind\": \"hdf5\", \"path\": \"%s\", \"x\": \"nope\"}}", path);
  ck_assert_int_eq(open_file_data(json, &d, &c, err, sizeof err), PROBE_ERR_NOT_FOUND);
  ck_assert_ptr_nonnull(strstr(err, "no dataset 'nope'"));
  tmp_path(path, sizeof path, "fake.h5");
  write_file(path, "not hdf5 at all");
  snprintf(json, sizeof json,
           "{\"model\": [{\"type\": \"linear\", \"out\": 1}], \"data\": "
           "{\"kind\": \"hdf5\", \"path\": \"%s\"}}", path);
  ck_assert_int_eq(open_file_data(json, &d, &c, err, sizeof err), PROBE_ERR_NOT_HDF5);
}
END_TEST

/* An HDF5 data file whose "x" has the shape nd/dx (chunked, nothing
 * written: a few KiB whatever the shape) and whose "y" has dy rows. */
static void write_declared(const char *path, int nd, const hsize_t *dx,
                           hsize_t dy) {
  hid_t f = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  ck_assert(f >= 0);
  /* chunks of at most 2^20 values; unlimited maximum shapes, so that an
   * extent of 0 can be chunked */
  hsize_t cx[2] = {nd == 1 ? UINT64_C(1) << 20 : 1024, 1024}, cy[1] = {UINT64_C(1) << 20};
  hsize_t mx[2] = {H5S_UNLIMITED, H5S_UNLIMITED};
  hid_t sx = H5Screate_simple(nd, dx, mx), sy = H5Screate_simple(1, &dy, mx);
  hid_t px = H5Pcreate(H5P_DATASET_CREATE), py = H5Pcreate(H5P_DATASET_CREATE);
  ck_assert(H5Pset_chunk(px, nd, cx) >= 0 && H5Pset_chunk(py, 1, cy) >= 0);
  hid_t ds = H5Dcreate2(f, "x", H5T_IEEE_F32LE, sx, H5P_DEFAULT, px, H5P_DEFAULT);
  ck_assert(ds >= 0);
  H5Dclose(ds);
  ds = H5Dcreate2(f, "y", H5T_IEEE_F32LE, sy, H5P_DEFAULT, py, H5P_DEFAULT);
  ck_assert(ds >= 0);
  H5Dclose(ds);
  H5Pclose(px);
  H5Pclose(py);
  H5Sclose(sx);
  H5Sclose(sy);
  H5Fclose(f);
}

/* A data file's shapes are its word: 2^62 elements in 2 KiB (their byte
 * count wrapped to 0 and HDF5 wrote 2^62 fill values into a 1-byte
 * buffer: run died of SIGSEGV), (2^31, 2^31) (the same wrap), no columns
 * (a model of 0 inputs whose weights started at inf); each refused with
 * one line before anything of its size is allocated, by the loader
 * (PROBE_ERR_CORRUPT) and, in a run, by the memory check first. */
START_TEST(test_hdf5_declared_shapes) {
  static const struct {
    int nd;
    hsize_t x[2], y;
    const char *loader, *run;
  } cases[] = {
      {1, {UINT64_C(1) << 62, 1}, UINT64_C(1) << 62, "too large to load", "needs 32.00 EiB"},
      {2, {UINT64_C(1) << 31, UINT64_C(1) << 31}, UINT64_C(1) << 31, "too large to load",
       "needs 16.00 EiB"},
      {2, {100, 0}, 100, "has shape (100, 0): no values", "has shape (100, 0)"},
      {1, {0, 1}, 0, "has shape (0, 1): no values", "has shape (0, 1)"},
      {2, {UINT64_C(1) << 34, 4}, UINT64_C(1) << 34, NULL, "needs 320.00 GiB"},
  };
  char path[300], json[1024], err[512];
  tmp_path(path, sizeof path, "declared.h5");
  snprintf(json, sizeof json,
           "{\"steps\": 2, \"model\": [{\"type\": \"linear\", \"out\": 1}], "
           "\"data\": {\"kind\": \"hdf5\", \"path\": \"%s\", \"batch\": 4}}",
           path);
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    write_declared(path, cases[i].nd, cases[i].x, cases[i].y);
    probe_train_config *c;
    pt_data *d;
    if (cases[i].loader) {
      err[0] = '\0';
      ck_assert_int_eq(open_file_data(json, &d, &c, err, sizeof err), PROBE_ERR_CORRUPT);
      ck_assert_msg(strstr(err, cases[i].loader), "case %zu: %s", i, err);
    }
    ck_assert_int_eq(probe_config_from_json(&c, json, err, sizeof err), PROBE_OK);
    probe_train_result r;
    err[0] = '\0';
    probe_status st = probe_train(c, NULL, &r, err, sizeof err);
    ck_assert_msg(st == PROBE_ERR_NOMEM || st == PROBE_ERR_CORRUPT, "case %zu: %s", i,
                  probe_status_str(st));
    ck_assert_msg(strstr(err, cases[i].run), "case %zu: %s", i, err);
    ck_assert_ptr_null(strchr(err, '\n'));
    probe_config_free(c);
  }
}
END_TEST

/* ---- runs ----------------------------------------------------------------- */

static void run_scn(const char *name, const char *k1, const char *v1,
                    const probe_train_opts *o, probe_train_result *r) {
  char err[512];
  probe_train_config *c;
  ck_assert_int_eq(probe_config_load_scenario(&c, name, err, sizeof err), PROBE_OK);
  if (k1) ck_assert_msg(probe_config_set(c, k1, v1, err, sizeof err) == PROBE_OK, "%s", err);
  ck_assert_msg(probe_train(c, o, r, err, sizeof err) == PROBE_OK, "%s", err);
  probe_config_free(c);
}

/* Compares two traces record by record (all statistics), step scalars
 * (except wall time) and scaler events. */
static void assert_same_trace(const char *a, const char *b) {
  probe_trace *ta, *tb;
  ck_assert_int_eq(probe_trace_open(&ta, a), PROBE_OK);
  ck_assert_int_eq(probe_trace_open(&tb, b), PROBE_OK);
  const probe_trace_info *ia = probe_trace_get_info(ta), *ib = probe_trace_get_info(tb);
  ck_assert_int_eq(ia->n_records, ib->n_records);
  ck_assert_int_eq(ia->n_steps, ib->n_steps);
  ck_assert_int_eq(ia->n_scaler_events, ib->n_scaler_events);
  ck_assert_str_eq(ia->config_json, ib->config_json);
  ck_assert(ia->n_records > 1000);
  enum { CH = 512 };
  static probe_record ra[CH], rb[CH];
  for (int64_t off = 0; off < ia->n_records;) {
    size_t ga, gb;
    ck_assert_int_eq(probe_trace_read_records(ta, off, CH, ra, &ga), PROBE_OK);
    ck_assert_int_eq(probe_trace_read_records(tb, off, CH, rb, &gb), PROBE_OK);
    ck_assert_uint_eq(ga, gb);
    ck_assert_uint_gt(ga, 0);
    for (size_t i = 0; i < ga; i++)
      ck_assert_msg(memcmp(&ra[i], &rb[i], sizeof ra[i]) == 0,
                    "record %lld differs", (long long)(off + (int64_t)i));
    off += (int64_t)ga;
  }
  static probe_step_scalars sa[CH], sb[CH];
  size_t ga, gb;
  ck_assert_int_eq(probe_trace_read_steps(ta, 0, CH, sa, &ga), PROBE_OK);
  ck_assert_int_eq(probe_trace_read_steps(tb, 0, CH, sb, &gb), PROBE_OK);
  ck_assert_uint_eq(ga, gb);
  for (size_t i = 0; i < ga; i++) {
    sa[i].wall_time = sb[i].wall_time = 0;
    ck_assert(memcmp(&sa[i], &sb[i], sizeof sa[i]) == 0);
  }
  probe_trace_close(ta);
  probe_trace_close(tb);
}

START_TEST(test_determinism) {
  char p1[300], p2[300];
  tmp_path(p1, sizeof p1, "det1.h5");
  tmp_path(p2, sizeof p2, "det2.h5");
  probe_train_opts o;
  probe_train_opts_init(&o);
  o.mode = PROBE_MODE_FULL;
  probe_train_result r1, r2, r3;
  const char *scn = _i == 0 ? "healthy" : "two-culprits";
  o.trace_path = p1;
  run_scn(scn, NULL, NULL, &o, &r1);
  o.trace_path = p2;
  run_scn(scn, NULL, NULL, &o, &r2);
  r1.wall_seconds = r2.wall_seconds = 0;
  r1.loop_seconds = r2.loop_seconds = 0;
  ck_assert(memcmp(&r1, &r2, sizeof r1) == 0);
  assert_same_trace(p1, p2);
  /* tracing does not change the arithmetic */
  run_scn(scn, NULL, NULL, NULL, &r3);
  ck_assert(r3.final_loss == r1.final_loss);
  ck_assert(r3.backoffs == r1.backoffs);
  /* another seed gives another run */
  run_scn(scn, "seed", "2", NULL, &r3);
  ck_assert(r3.final_loss != r1.final_loss);
}
END_TEST

START_TEST(test_trace_contents) {
  char p[300];
  tmp_path(p, sizeof p, "contents.h5");
  probe_train_opts o;
  probe_train_opts_init(&o);
  o.mode = PROBE_MODE_FULL;
  o.trace_path = p;
  o.command_line = "test_trainer";
  probe_train_result r;
  run_scn("revin-overflow", "fp32", "revin", &o, &r);
  probe_trace *t;
  ck_assert_int_eq(probe_trace_open(&t, p), PROBE_OK);
  const probe_trace_info *in = probe_trace_get_info(t);
  ck_assert_int_eq(in->complete, 1);
  ck_assert_int_eq(in->n_steps, r.steps_run);
  ck_assert_int_eq(in->n_scaler_events, r.backoffs + r.growths);
  ck_assert_ptr_nonnull(strstr(in->config_json, "\"revin-overflow\""));
  ck_assert_ptr_nonnull(strstr(in->precision_policy, "fp32: revin"));
  size_t nl;
  const probe_layer_info *L = probe_trace_layers(t, &nl);
  ck_assert_uint_eq(nl, 7); /* input revin fc1 act head revin.denorm loss */
  ck_assert_str_eq(L[0].name, "input");
  ck_assert_str_eq(L[1].name, "revin");
  ck_assert_int_eq(L[1].precision, PROBE_DTYPE_F32);
  ck_assert_int_eq(L[2].precision, PROBE_DTYPE_F16);
  ck_assert_str_eq(L[5].name, "revin.denorm");
  /* Step 0 in execution order: input FWD_OUT, revin FWD_IN WEIGHT
   * FWD_SAVED FWD_OUT, ... and every site of a linear layer once. */
  probe_record rec[64];
  size_t got;
  ck_assert_int_eq(probe_trace_read_records(t, 0, 64, rec, &got), PROBE_OK);
  ck_assert_int_eq(rec[0].layer, 0);
  ck_assert_int_eq(rec[0].site, PROBE_SITE_FWD_OUT);
  ck_assert_int_eq(rec[1].layer, 1);
  ck_assert_int_eq(rec[1].site, PROBE_SITE_FWD_IN);
  ck_assert_int_eq(rec[2].site, PROBE_SITE_WEIGHT);
  ck_assert_int_eq(rec[3].site, PROBE_SITE_FWD_SAVED);
  ck_assert_int_eq(rec[4].site, PROBE_SITE_FWD_OUT);
  int sites[PROBE_SITE_COUNT] = {0};
  size_t per_step = 0;
  for (size_t i = 0; i < got && rec[i].step == 0; i++, per_step++)
    if (rec[i].layer == 2) sites[rec[i].site]++;
  /* every site once but fwd_saved, and the all-reduce sites (one process) */
  for (int s = 0; s < PROBE_SITE_COUNT; s++)
    ck_assert_int_eq(sites[s], s == PROBE_SITE_FWD_SAVED ||
                                       s == PROBE_SITE_GRAD_PRE_ALLREDUCE ||
                                       s == PROBE_SITE_GRAD_POST_ALLREDUCE
                                   ? 0
                                   : 1);
  ck_assert_int_eq(in->n_records, (int64_t)per_step * r.steps_run);
  probe_trace_close(t);
}
END_TEST

static int stop_at_7(int64_t step, double loss, double scale, void *user) {
  (void)loss;
  (void)scale;
  ++*(int *)user;
  return step == 7;
}

START_TEST(test_stopping) {
  probe_train_opts o;
  probe_train_opts_init(&o);
  probe_train_result r;
  int calls = 0;
  o.progress = stop_at_7;
  o.user = &calls;
  run_scn("healthy", NULL, NULL, &o, &r);
  ck_assert_int_eq(r.steps_run, 8);
  ck_assert_int_eq(calls, 8);
  ck_assert_int_eq(r.interrupted, 1);
  /* a raised stop flag ends the run before the next step */
  probe_train_opts_init(&o);
  volatile sig_atomic_t flag = 1;
  o.stop_flag = &flag;
  run_scn("healthy", NULL, NULL, &o, &r);
  ck_assert_int_eq(r.steps_run, 0);
  ck_assert_int_eq(r.interrupted, 1);
  ck_assert_int_eq(r.diverged, 0);
  /* stop K steps after the first non-finite loss */
  probe_train_opts_init(&o);
  o.stop_on_nonfinite = 3;
  run_scn("nan-input", NULL, NULL, &o, &r);
  ck_assert_int_eq(r.first_nonfinite_loss_step, 50);
  ck_assert_int_eq(r.steps_run, 54);
  ck_assert_int_eq(r.interrupted, 1);
  ck_assert_int_eq(r.diverged, 1);
  /* a trace that cannot be created is an error, not a crash */
  probe_train_opts_init(&o);
  o.trace_path = "/nonexistent-dir/x.h5";
  char err[512] = "";
  probe_train_config *c;
  probe_config_load_scenario(&c, "healthy", err, sizeof err);
  ck_assert_int_ne(probe_train(c, &o, &r, err, sizeof err), PROBE_OK);
  ck_assert_ptr_nonnull(strstr(err, "/nonexistent-dir/x.h5"));
  probe_config_free(c);
}
END_TEST

START_TEST(test_micro_batches) {
  /* Two micro-batches of B: twice the data per step, same kind of run. */
  probe_train_result r1, r2;
  run_scn("healthy", NULL, NULL, NULL, &r1);
  run_scn("healthy", "micro_batches", "2", NULL, &r2);
  ck_assert_int_eq(r2.steps_run, r1.steps_run);
  ck_assert(isfinite(r2.final_loss));
  ck_assert(r2.final_loss != r1.final_loss);
  ck_assert(r2.final_loss < 0.5 * r2.first_loss);
  /* in FP32, accumulation of M = 2 micro-batches of data that is the same
   * in both halves equals one batch: checked through a file data source */
  char path[300], json[1024], err[512];
  tmp_path(path, sizeof path, "one.csv");
  write_file(path, "1,2,3\n");
  snprintf(json, sizeof json,
           "{\"steps\": 10, \"precision\": \"fp32\", \"model\": [{\"type\": "
           "\"linear\", \"out\": 4}, {\"type\": \"gelu\"}, {\"type\": \"linear\", "
           "\"out\": 1}], \"optimizer\": {\"type\": \"sgd\", \"lr\": 0.01}, "
           "\"data\": {\"kind\": \"csv\", \"path\": \"%s\", \"batch\": 4}}", path);
  probe_train_config *c;
  ck_assert_int_eq(probe_config_from_json(&c, json, err, sizeof err), PROBE_OK);
  ck_assert_int_eq(probe_train(c, NULL, &r1, err, sizeof err), PROBE_OK);
  probe_config_set(c, "micro_batches", "4", err, sizeof err);
  ck_assert_int_eq(probe_train(c, NULL, &r2, err, sizeof err), PROBE_OK);
  ck_assert_double_eq_tol(r2.last_loss, r1.last_loss, 1e-6 * fabs(r1.last_loss));
  probe_config_free(c);
}
END_TEST

START_TEST(test_clip_ratio) {
  /* clipping after unscaling: ratio = true grad norm / max_norm (small);
   * before unscaling the clipper sees the norm times the loss scale (the
   * healthy scenario: Adam, clipping at 1, a scale of 2^15..2^16). */
  probe_train_result ok, bad;
  run_scn("healthy", NULL, NULL, NULL, &ok);
  run_scn("healthy", "clip.before_unscale", "1", NULL, &bad);
  ck_assert(ok.max_clip_ratio > 1.0 && ok.max_clip_ratio < 100.0);
  ck_assert(bad.max_clip_ratio > 1000.0 * ok.max_clip_ratio);
}
END_TEST

START_TEST(test_attention_model) {
  /* Every module kind in one stack, attention included: it trains in FP32,
   * FP16 and BF16, and the attention layer's scores are its fwd_saved. */
  const char *json =
      "{\"name\": \"all-kinds\", \"steps\": 60, \"model\": ["
      " {\"type\": \"linear\", \"name\": \"emb\", \"out\": 32},"
      " {\"type\": \"attention\", \"name\": \"attn\", \"seq\": 4},"
      " {\"type\": \"layernorm\", \"name\": \"ln\"},"
      " {\"type\": \"gelu\"}, {\"type\": \"bn\"}, {\"type\": \"relu\"},"
      " {\"type\": \"linear\", \"name\": \"head\", \"out\": 3},"
      " {\"type\": \"softmax\"}], \"loss\": \"cross_entropy\","
      " \"data\": {\"kind\": \"clusters\", \"features\": 6, \"classes\": 3,"
      " \"batch\": 16}, \"optimizer\": {\"type\": \"adamw\", \"lr\": 0.01,"
      " \"weight_decay\": 0.01}, \"schedule\": {\"type\": \"step\","
      " \"step_size\": 30, \"gamma\": 0.5}, \"clip\": {\"max_norm\": 1.0}}";
  char err[512], path[300];
  probe_train_config *c;
  ck_assert_msg(probe_config_from_json(&c, json, err, sizeof err) == PROBE_OK, "%s", err);
  const char *precs[3] = {"fp32", "fp16", "bf16"};
  for (int k = 0; k < 3; k++) {
    probe_config_set(c, "precision", precs[k], err, sizeof err);
    probe_train_result r;
    probe_train_opts o;
    probe_train_opts_init(&o);
    tmp_path(path, sizeof path, "attn.h5");
    o.trace_path = path;
    o.mode = PROBE_MODE_FULL;
    ck_assert_msg(probe_train(c, &o, &r, err, sizeof err) == PROBE_OK, "%s", err);
    ck_assert_msg(!r.diverged, "%s diverged", precs[k]);
    ck_assert_msg(r.final_loss < 0.5 * r.first_loss, "%s: %g -> %g", precs[k],
                  r.first_loss, r.final_loss);
    probe_trace *t;
    ck_assert_int_eq(probe_trace_open(&t, path), PROBE_OK);
    probe_record rec[128];
    size_t got;
    ck_assert_int_eq(probe_trace_read_records(t, 0, 128, rec, &got), PROBE_OK);
    int found = 0;
    for (size_t i = 0; i < got; i++)
      if (rec[i].step == 0 && rec[i].layer == 2 && rec[i].site == PROBE_SITE_FWD_SAVED) {
        ck_assert_int_eq(rec[i].stats.count, 16 * 4 * 4); /* (B, T, T) */
        found = 1;
      }
    ck_assert(found);
    probe_trace_close(t);
  }
  /* a width that is not a multiple of seq is a config error at run time */
  probe_config_free(c);
  char bad[1024];
  snprintf(bad, sizeof bad, "%s", json);
  char *q = strstr(bad, "\"seq\": 4");
  q[7] = '5';
  ck_assert_int_eq(probe_config_from_json(&c, bad, err, sizeof err), PROBE_OK);
  probe_train_result r;
  ck_assert_int_eq(probe_train(c, NULL, &r, err, sizeof err), PROBE_ERR_CONFIG);
  ck_assert_ptr_nonnull(strstr(err, "not a multiple of seq 5"));
  probe_config_free(c);
}
END_TEST

static Suite *make_config_suite(void) {
  Suite *s = suite_create("config");
  TCase *tc = tcase_create("core");
  tcase_add_test(tc, test_every_scenario_parses);
  tcase_add_test(tc, test_round_trip);
  tcase_add_loop_test(tc, test_bad_config, 0,
                      (int)(sizeof bad_configs / sizeof bad_configs[0]));
  tcase_add_test(tc, test_load_errors);
  tcase_add_test(tc, test_set);
  suite_add_tcase(s, tc);
  return s;
}

static Suite *make_policy_suite(void) {
  Suite *s = suite_create("policy");
  TCase *tc = tcase_create("core");
  tcase_add_test(tc, test_policy_match);
  tcase_add_test(tc, test_policy_layers);
  suite_add_tcase(s, tc);
  return s;
}

static Suite *make_scaler_suite(void) {
  Suite *s = suite_create("scaler");
  TCase *tc = tcase_create("core");
  tcase_add_test(tc, test_scaler_gradscaler);
  tcase_add_test(tc, test_scaler_growth_refused);
  tcase_add_test(tc, test_scaler_hysteresis);
  tcase_add_test(tc, test_scaler_min_scale);
  suite_add_tcase(s, tc);
  return s;
}

static Suite *make_optim_suite(void) {
  Suite *s = suite_create("optim");
  TCase *tc = tcase_create("core");
  tcase_add_test(tc, test_sgd_momentum);
  tcase_add_test(tc, test_adam);
  tcase_add_test(tc, test_schedule);
  suite_add_tcase(s, tc);
  return s;
}

static Suite *make_data_suite(void) {
  Suite *s = suite_create("data");
  TCase *tc = tcase_create("core");
  tcase_add_test(tc, test_generators);
  tcase_add_test(tc, test_nan_step);
  tcase_add_test(tc, test_csv);
  tcase_add_test(tc, test_hdf5);
  tcase_add_test(tc, test_hdf5_declared_shapes);
  suite_add_tcase(s, tc);
  return s;
}

static Suite *make_train_suite(void) {
  Suite *s = suite_create("train");
  TCase *tc = tcase_create("core");
  tcase_set_timeout(tc, 60);
  tcase_add_loop_test(tc, test_determinism, 0, 2);
  tcase_add_test(tc, test_trace_contents);
  tcase_add_test(tc, test_stopping);
  tcase_add_test(tc, test_micro_batches);
  tcase_add_test(tc, test_clip_ratio);
  tcase_add_test(tc, test_attention_model);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  snprintf(tmpdir, sizeof tmpdir, "/tmp/ampprobe-trainer-test-XXXXXX");
  if (!mkdtemp(tmpdir)) {
    perror("mkdtemp");
    return 1;
  }
  SRunner *sr = srunner_create(make_config_suite());
  srunner_add_suite(sr, make_policy_suite());
  srunner_add_suite(sr, make_scaler_suite());
  srunner_add_suite(sr, make_optim_suite());
  srunner_add_suite(sr, make_data_suite());
  srunner_add_suite(sr, make_train_suite());
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
  if (failed == 0 && system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
  return failed == 0 ? 0 : 1;
}
