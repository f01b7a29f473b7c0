/*
 * tests/tools/test_diff.c - Check suite for libprobe/analysis/diff.c: two traces
 * written with the libprobe writer from a small synthetic model
 * (input -> revin -> lin1 -> soft -> loss, forward then backward), where
 * trace A departs from B in controlled ways: agreement within rounding, a
 * local overflow at revin, an error introduced at lin1 and carried on,
 * gradients flushed to zero, different layer lists and configs, runs of
 * different length, and tiny read chunks (streaming gives the same answer).
 */
#define _DEFAULT_SOURCE /* mkdtemp */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ampprobe/probe.h"
#include "ampprobe/analysis.h"
#include <jansson.h>

#define NEL 32
#define N_LAYERS 5

static const char *layer_names[N_LAYERS] = {"input", "revin", "lin1", "soft",
                                            "loss"};
static const probe_kind layer_kinds[N_LAYERS] = {
    PROBE_KIND_INPUT, PROBE_KIND_REVIN, PROBE_KIND_LINEAR, PROBE_KIND_SOFTMAX,
    PROBE_KIND_LOSS};

/* How A departs from B. */
typedef enum variant {
  V_SAME,      /* A = B * (1 + 1e-3): FP16 rounding only */
  V_REVIN_INF, /* from step 5, revin's output overflows in A; downstream
                  non-finite */
  V_LIN1_DRIFT, /* from step 3, lin1 output +30% in A (its input agrees);
                   downstream follows */
  V_GRAD_FLUSH, /* lin1's gradients are all zero in A */
  V_LOSS_PART,  /* only the loss differs, from step 7 */
  V_BACKOFF,    /* step 2: A's scaled gradients overflow, A skips the step */
  V_COLLAPSE,   /* every step: the gradients of revin and lin1 overflow and
                   the step is skipped (a collapsed scale), on either side */
  V_NAN_NOSKIP, /* from step 3 every gradient is NaN and found_inf is set,
                   but no scaler skips (an FP32 run applying NaN grads) */
  V_MASKED,     /* A's softmax gets masked logits (-inf only) at its input
                   from step 4, which are no inf/NaN (probe_record_nonfinite) */
  V_SOME_ZEROS, /* this side's soft GRAD_IN holds nzero exact zeros (its
                   smallest values) at every step */
} variant;

typedef struct spec {
  variant v;
  int side;      /* 0 = A, 1 = B */
  int steps;
  int rename;    /* register "lin1" as "dense1" */
  int seed;      /* config seed */
  int hostile;   /* register "revin" with control characters in its name */
  const char *cfg_extra; /* members added to the config ("\"eps\":1e-05") */
  int bf16;      /* A's layers run in BF16 (not FP16) */
  int nzero;     /* V_SOME_ZEROS: how many */
  double tiny;   /* the gradients of soft and lin1 times this (0: 1): B's
                    values in FP16's underflow range at A's scale 2^16 */
} spec;

/* The value scale of one record, and whether it holds an inf. */
/* *zero: how many of the record's values (its smallest) are exact zeros. */
static double value(const spec *s, int step, int layer, probe_site site,
                    int *inf, int *zero) {
  *inf = 0;
  *zero = 0;
  int gsite = site == PROBE_SITE_GRAD_OUT || site == PROBE_SITE_GRAD_IN ||
              site == PROBE_SITE_WEIGHT_GRAD;
  double base = (1.0 + 0.1 * layer) * (1.0 + 0.01 * step) *
                (gsite ? 1e-3 : 1.0);
  if (s->tiny > 0 && gsite && (layer == 2 || layer == 3))
    base *= s->tiny;
  if (s->v == V_SOME_ZEROS && layer == 3 && site == PROBE_SITE_GRAD_IN)
    *zero = s->nzero;
  if (s->side == 1 && s->v == V_SAME)
    return base;
  int bwd = probe_site_phase(site) == PROBE_PHASE_BACKWARD;
  double f = s->side == 1 ? 1.0 : 1.001; /* B: the baseline's values */
  switch (s->v) {
  case V_SAME:
    return base * f;
  case V_REVIN_INF:
    if (step >= 5 && ((layer == 1 && site != PROBE_SITE_FWD_IN) ||
                      (layer > 1 && !bwd) || bwd))
      *inf = 1;
    return base * f;
  case V_LIN1_DRIFT:
    if (step >= 3 && ((layer == 2 && site == PROBE_SITE_FWD_OUT) ||
                      (layer > 2 && !bwd) || bwd))
      return base * 1.3;
    return base * f;
  case V_GRAD_FLUSH:
    if (layer == 2 && (site == PROBE_SITE_GRAD_IN ||
                       site == PROBE_SITE_WEIGHT_GRAD))
      *zero = NEL;
    return base * f;
  case V_LOSS_PART:
    return base * f;
  case V_BACKOFF:
    if (step == 2 && bwd && layer <= 2)
      *inf = 1;
    return base * f;
  case V_COLLAPSE:
    if (bwd && layer <= 2)
      *inf = 1;
    return base * f;
  case V_NAN_NOSKIP:
    if (step >= 3 && bwd)
      *inf = 1;
    return base * f;
  case V_MASKED:
    if (step >= 4 && layer == 3 && site == PROBE_SITE_FWD_IN)
      *inf = -1;
    return base * f;
  case V_SOME_ZEROS:
    return base * f;
  }
  return base;
}

static void record(probe_session *ps, const spec *s, int step, int32_t id,
                   int layer, probe_site site) {
  float buf[NEL];
  int inf, zero;
  double v = value(s, step, layer, site, &inf, &zero);
  /* A's gradients are scaled by its loss scale (2^16), B's are not */
  if (s->side == 0 && probe_site_phase(site) == PROBE_PHASE_BACKWARD)
    v *= 65536.0;
  for (int i = 0; i < NEL; i++)
    buf[i] = i < zero ? 0.0f : (float)(v * (i + 1) / NEL);
  if (inf)
    buf[NEL / 2] = inf < 0 ? -INFINITY : INFINITY;
  ck_assert_int_eq(probe_tensor_record(ps, id, site, PROBE_DTYPE_F32, buf, NEL),
                   PROBE_OK);
}

static void write_trace(const char *path, const spec *s) {
  probe_options opt;
  probe_options_init(&opt);
  opt.mode = PROBE_MODE_FULL;
  opt.snapshot_on_nonfinite = 0;
  opt.overwrite = 1; /* fixtures are rewritten at one path */
  char cfg[1024];
  snprintf(cfg, sizeof cfg,
           "{\"name\":\"synthetic\",\"seed\":%d,\"precision\":\"%s\",%s%s"
           "\"model\":[{\"kind\":\"revin\"},{\"kind\":\"linear\",\"out\":8}]}",
           s->seed, s->side == 0 ? (s->bf16 ? "bf16" : "fp16") : "fp32",
           s->cfg_extra ? s->cfg_extra : "", s->cfg_extra ? "," : "");
  opt.config_json = cfg;
  opt.precision_policy = s->side == 0 ? (s->bf16 ? "bf16" : "fp16") : "fp32";
  probe_session *ps = NULL;
  ck_assert_int_eq(probe_session_open(&ps, path, &opt), PROBE_OK);
  int32_t ids[N_LAYERS];
  for (int l = 0; l < N_LAYERS; l++) {
    const char *name = layer_names[l];
    if (s->rename && l == 2)
      name = "dense1";
    if (s->hostile && l == 1)
      name = "rev\nverdict AGREE\x1b[2J";
    ck_assert_int_eq(probe_layer_register(ps, name, layer_kinds[l],
                                          s->side == 0 ? (s->bf16 ? PROBE_DTYPE_BF16
                                                                  : PROBE_DTYPE_F16)
                                                       : PROBE_DTYPE_F32,
                                          &ids[l]),
                     PROBE_OK);
  }
  for (int step = 0; step < s->steps; step++) {
    ck_assert_int_eq(probe_step_begin(ps, step), PROBE_OK);
    for (int l = 0; l < N_LAYERS; l++) {
      record(ps, s, step, ids[l], l, PROBE_SITE_FWD_IN);
      if (l == 1)
        record(ps, s, step, ids[l], l, PROBE_SITE_FWD_SAVED);
      if (l == 2)
        record(ps, s, step, ids[l], l, PROBE_SITE_WEIGHT);
      record(ps, s, step, ids[l], l, PROBE_SITE_FWD_OUT);
    }
    for (int l = N_LAYERS - 1; l >= 1; l--) {
      record(ps, s, step, ids[l], l, PROBE_SITE_GRAD_OUT);
      record(ps, s, step, ids[l], l, PROBE_SITE_GRAD_IN);
      if (l == 2)
        record(ps, s, step, ids[l], l, PROBE_SITE_WEIGHT_GRAD);
    }
    probe_step_scalars sc;
    memset(&sc, 0, sizeof sc);
    sc.loss = 2.0 / (1.0 + step);
    if (s->side == 0 && s->v == V_LOSS_PART && step >= 7)
      sc.loss *= 3.0;
    if (s->side == 0 && s->v == V_REVIN_INF && step >= 5)
      sc.loss = NAN;
    sc.loss_scale = s->side == 0 ? 65536.0 : 1.0;
    if (s->side == 0 && s->v == V_BACKOFF && step == 2)
      sc.found_inf = sc.skipped = 1;
    if (s->v == V_COLLAPSE)
      sc.found_inf = sc.skipped = 1;
    if (s->v == V_NAN_NOSKIP && step >= 3)
      sc.found_inf = 1; /* found, but nothing skips: no scaler */
    sc.lr = 1e-3;
    sc.clip_coef = 1.0;
    ck_assert_int_eq(probe_step_set_scalars(ps, &sc), PROBE_OK);
    ck_assert_int_eq(probe_step_end(ps), PROBE_OK);
  }
  ck_assert_int_eq(probe_session_close(ps), PROBE_OK);
}

static char dir[] = "/tmp/ampprobe-test-diff-XXXXXX";
static char path_a[256], path_b[256];

/* Writes A (fp16, variant v) and B (fp32 baseline), runs the diff. */
static void run_diff_w(probe_diff *d, spec a, spec b, size_t chunk,
                       int window) {
  a.side = 0;
  b.side = 1;
  write_trace(path_a, &a);
  write_trace(path_b, &b);
  probe_trace *ta = NULL, *tb = NULL;
  ck_assert_int_eq(probe_trace_open(&ta, path_a), PROBE_OK);
  ck_assert_int_eq(probe_trace_open(&tb, path_b), PROBE_OK);
  probe_diff_options opt;
  probe_diff_options_init(&opt);
  if (chunk)
    opt.chunk_rows = chunk;
  if (window)
    opt.window = window;
  ck_assert_int_eq(probe_diff_run(d, ta, tb, &opt), PROBE_OK);
  probe_trace_close(ta);
  probe_trace_close(tb);
}

static void run_diff(probe_diff *d, spec a, spec b, size_t chunk) {
  run_diff_w(d, a, b, chunk, 0);
}

static const probe_diff_entry *find(const probe_diff *d, const char *layer,
                                    probe_site site) {
  for (size_t i = 0; i < d->n_entries; i++)
    if (!strcmp(d->entries[i].layer, layer) && d->entries[i].site == (int)site)
      return &d->entries[i];
  return NULL;
}

static void setup(void) {
  ck_assert_ptr_nonnull(mkdtemp(dir));
  snprintf(path_a, sizeof path_a, "%s/a.h5", dir);
  snprintf(path_b, sizeof path_b, "%s/b.h5", dir);
}

static void teardown(void) {
  unlink(path_a);
  unlink(path_b);
  rmdir(dir);
}

/* ---- tests ---------------------------------------------------------------- */

/* Masked logits at A's softmax are no inf/NaN for diff, as for the
 * post-mortem (it named A's first non-finite record there, and counted the
 * record as diverging: review 9). */
START_TEST(test_masked_logits_are_finite) {
  probe_diff d;
  run_diff(&d, (spec){.v = V_MASKED, .steps = 12}, (spec){.v = V_MASKED, .steps = 12}, 0);
  ck_assert_int_eq(d.first_nonfinite_a.found, 0);
  ck_assert_int_eq(d.first_nonfinite_b.found, 0);
  const probe_diff_entry *e = find(&d, "soft", PROBE_SITE_FWD_IN);
  ck_assert_ptr_nonnull(e);
  ck_assert_int_eq(e->first_nonfinite_a, -1);
  ck_assert_int_eq(e->first_div_step, -1);
  probe_diff_free(&d);
}
END_TEST

START_TEST(test_rel) {
  ck_assert_double_eq(probe_diff_rel(0, 0), 0);
  ck_assert_double_eq_tol(probe_diff_rel(1.0, 1.1), 0.1 / 1.1, 1e-12);
  ck_assert_double_eq(probe_diff_rel(2.0, 2.0), 0);
  ck_assert_double_eq(probe_diff_rel(0, 1e-7), 1);
  ck_assert_double_eq(probe_diff_rel(NAN, 1), 1);
  ck_assert_double_eq(probe_diff_rel(NAN, NAN), 0);
}
END_TEST

START_TEST(test_agree) {
  probe_diff d;
  run_diff(&d, (spec){.v = V_SAME, .steps = 12},
           (spec){.v = V_SAME, .steps = 12}, 0);
  ck_assert_int_eq(d.verdict, PROBE_DIFF_AGREE);
  ck_assert_int_eq(d.first_div_step, -1);
  ck_assert_int_eq(d.loss_part_step, -1);
  ck_assert_int_eq(d.steps_common, 12);
  ck_assert_int_eq(d.n_layers_common, N_LAYERS);
  ck_assert_int_eq(d.records_unmatched, 0);
  ck_assert_int_eq(d.config_other, 0); /* only "precision" differs */
  ck_assert_uint_eq(d.n_config_diff, 1);
  const probe_diff_entry *e = find(&d, "lin1", PROBE_SITE_FWD_OUT);
  ck_assert_ptr_nonnull(e);
  ck_assert_int_eq(e->steps, 12);
  ck_assert_double_eq_tol(e->max_rel_absmax, 0.001 / 1.001, 1e-5);
  ck_assert_double_lt(e->max_rel_rms, 0.002);
  ck_assert_ptr_nonnull(strstr(d.verdict_text, "agree within tolerance"));
  probe_diff_free(&d);
}
END_TEST

START_TEST(test_local_overflow_at_revin) {
  probe_diff d;
  run_diff(&d, (spec){.v = V_REVIN_INF, .steps = 10},
           (spec){.v = V_SAME, .steps = 10}, 0);
  ck_assert_int_eq(d.verdict, PROBE_DIFF_DIVERGE);
  ck_assert_int_eq(d.first_div_step, 5);
  ck_assert(d.intro.found);
  ck_assert_str_eq(d.intro.layer, "revin");
  ck_assert_int_eq(d.intro.site, PROBE_SITE_FWD_SAVED); /* first in order */
  ck_assert(d.intro.local);
  ck_assert(d.intro.nonfinite);
  ck_assert(d.first_nonfinite_a.found && !d.first_nonfinite_b.found);
  ck_assert_str_eq(d.first_nonfinite_a.layer, "revin");
  ck_assert_int_eq(d.first_nonfinite_a.step, 5);
  /* downstream lin1 output is carried, not local */
  const probe_diff_entry *e = find(&d, "lin1", PROBE_SITE_FWD_OUT);
  ck_assert_int_eq(e->first_div_step, 5);
  ck_assert_int_eq(e->local_steps, 0);
  ck_assert_int_eq(e->carried_steps, 5);
  /* the table starts where divergence begins: revin first */
  ck_assert_str_eq(d.entries[0].layer, "revin");
  ck_assert_int_eq(d.entries[0].first_div_step, 5);
  /* the input layer never diverges and sorts after every diverging one */
  ck_assert_int_eq(find(&d, "input", PROBE_SITE_FWD_OUT)->first_div_step, -1);
  ck_assert_int_eq(d.first_nonfinite_loss_a, 5);
  ck_assert_int_eq(d.loss_part_step, 5);
  ck_assert_ptr_nonnull(strstr(d.verdict_text, "introduced at revin"));
  probe_diff_free(&d);
}
END_TEST

/* Names from files are data (issue 17.5): a layer name with a newline and
 * ESC is escaped in the result, its verdict text and its JSON. */
START_TEST(test_hostile_layer_name) {
  probe_diff d;
  run_diff(&d, (spec){.v = V_REVIN_INF, .steps = 10, .hostile = 1},
           (spec){.v = V_SAME, .steps = 10, .hostile = 1}, 0);
  ck_assert_int_eq(d.verdict, PROBE_DIFF_DIVERGE);
  ck_assert(d.intro.found);
  ck_assert_str_eq(d.intro.layer, "rev\\nverdict AGREE\\e[2J");
  for (const char *q = d.verdict_text; *q; q++)
    ck_assert_msg((unsigned char)*q >= 0x20, "raw control byte in the verdict");
  char *txt = NULL;
  ck_assert_int_eq(probe_diff_json(&d, "a\nb.h5", NULL, &txt), PROBE_OK);
  for (const char *q = txt; *q; q++)
    ck_assert_msg((unsigned char)*q >= 0x20 || *q == '\n' || *q == ' ',
                  "raw control byte in the JSON");
  json_error_t jerr;
  json_t *j = json_loads(txt, 0, &jerr);
  ck_assert_msg(j != NULL, "not JSON: %s", jerr.text);
  ck_assert_str_eq(json_string_value(json_object_get(
                       json_object_get(json_object_get(j, "divergence"),
                                       "introduction_point"),
                       "layer")),
                   "rev\\nverdict AGREE\\e[2J");
  ck_assert_str_eq(json_string_value(json_object_get(j, "trace_a")),
                   "a\\nb.h5");
  json_decref(j);
  probe_free(txt);
  probe_diff_free(&d);
}
END_TEST

START_TEST(test_carried_from_lin1) {
  /* window 1: every step judged on its own */
  probe_diff d;
  run_diff_w(&d, (spec){.v = V_LIN1_DRIFT, .steps = 12},
             (spec){.v = V_SAME, .steps = 12}, 0, 1);
  ck_assert_int_eq(d.verdict, PROBE_DIFF_DIVERGE);
  ck_assert_int_eq(d.first_div_step, 3);
  ck_assert_str_eq(d.intro.layer, "lin1");
  ck_assert_int_eq(d.intro.site, PROBE_SITE_FWD_OUT);
  ck_assert_double_eq_tol(d.intro.rel, 0.3 / 1.3, 1e-4);
  const probe_diff_entry *l1 = find(&d, "lin1", PROBE_SITE_FWD_OUT);
  ck_assert_int_eq(l1->local_steps, 9);
  ck_assert_int_eq(l1->carried_steps, 0);
  ck_assert_int_eq(l1->first_exceed_step, 3);
  const probe_diff_entry *sm = find(&d, "soft", PROBE_SITE_FWD_OUT);
  ck_assert_int_eq(sm->local_steps, 0);
  ck_assert_int_eq(sm->carried_steps, 9);
  ck_assert_int_eq(find(&d, "revin", PROBE_SITE_FWD_OUT)->first_div_step, -1);
  ck_assert(!d.first_nonfinite_a.found);
  probe_diff_free(&d);

  /* default window 10: a sustained 0.23 difference averages past 0.1 after
   * five steps (0.23 * 5 / 10); the per-step first exceedance stays 3 */
  run_diff(&d, (spec){.v = V_LIN1_DRIFT, .steps = 12},
           (spec){.v = V_SAME, .steps = 12}, 0);
  ck_assert_int_eq(d.first_div_step, 7);
  ck_assert_str_eq(d.intro.layer, "lin1");
  l1 = find(&d, "lin1", PROBE_SITE_FWD_OUT);
  ck_assert_int_eq(l1->first_exceed_step, 3);
  ck_assert_int_eq(l1->first_div_step, 7);
  ck_assert_double_eq_tol(l1->max_window_rel, 0.3 / 1.3 * 9 / 10, 1e-4);
  probe_diff_free(&d);
}
END_TEST

START_TEST(test_grad_flush) {
  probe_diff d;
  /* B's gradients there are small enough (2.5e-6 at A's scale 2^16) to
   * underflow FP16's normal range: A's zeros are underflow */
  run_diff(&d, (spec){.v = V_GRAD_FLUSH, .steps = 6, .tiny = 1e-6},
           (spec){.v = V_SAME, .steps = 6, .tiny = 1e-6}, 0);
  ck_assert_int_eq(d.verdict, PROBE_DIFF_DIVERGE);
  const probe_diff_entry *g = find(&d, "lin1", PROBE_SITE_GRAD_IN);
  ck_assert(g->flushes_to_zero);
  ck_assert(find(&d, "lin1", PROBE_SITE_WEIGHT_GRAD)->flushes_to_zero);
  ck_assert(!find(&d, "soft", PROBE_SITE_GRAD_IN)->flushes_to_zero);
  ck_assert(!find(&d, "lin1", PROBE_SITE_FWD_OUT)->flushes_to_zero);
  /* the zeros diverge at once (100% vs 0%), before the windowed RMS */
  ck_assert_int_eq(d.first_div_step, 0);
  ck_assert_double_eq(d.intro.zero_a, 1.0);
  ck_assert_double_eq(d.intro.zero_b, 0.0);
  ck_assert_ptr_nonnull(strstr(d.verdict_text, "underflowed to zero"));
  ck_assert_int_eq(g->first_exceed_step, 0);
  ck_assert_str_eq(d.intro.layer, "lin1");
  ck_assert_int_eq(d.intro.site, PROBE_SITE_GRAD_IN);
  ck_assert_ptr_nonnull(strstr(d.verdict_text, "flush to zero in A: lin1"));
  probe_diff_free(&d);
}
END_TEST

/* hunt F4: exact zeros that are not underflow. BF16 rounds a softmax p to
 * 1.0 and p(1-p) is exactly 0: zeros where FP32 holds values far inside
 * BF16's range (smallest normal 2^-126) are rounding, no divergence. */
START_TEST(test_bf16_rounding_zeros_agree) {
  probe_diff d;
  run_diff(&d, (spec){.v = V_SOME_ZEROS, .nzero = 10, .steps = 12, .bf16 = 1},
           (spec){.v = V_SAME, .steps = 12}, 0);
  ck_assert_msg(d.verdict == PROBE_DIFF_AGREE, "%s", d.verdict_text);
  ck_assert_ptr_null(strstr(d.verdict_text, "underflow"));
  ck_assert(!find(&d, "soft", PROBE_SITE_GRAD_IN)->flushes_to_zero);
  ck_assert_int_eq(d.zero_underflow_records, 0);
  ck_assert_int_eq(d.zero_rounding_records, 12);
  int noted = 0;
  for (int i = 0; i < d.n_notes; i++)
    noted |= strstr(d.notes[i], "no underflow") != NULL;
  ck_assert(noted);
  probe_diff_free(&d);
}
END_TEST

/* The same zeros in FP16 with B's values in FP16's normal range: rounding
 * too, not underflow. */
START_TEST(test_fp16_zeros_in_range_not_underflow) {
  probe_diff d;
  run_diff(&d, (spec){.v = V_SOME_ZEROS, .nzero = 10, .steps = 12},
           (spec){.v = V_SAME, .steps = 12}, 0);
  ck_assert_msg(d.verdict == PROBE_DIFF_AGREE, "%s", d.verdict_text);
  ck_assert_int_eq(d.zero_rounding_records, 12);
  probe_diff_free(&d);
}
END_TEST

/* 2 zeros of a 32-value tensor are 6%, but only 2 values: below
 * PROBE_DIFF_ZERO_MIN_VALUES, no evidence, even where they would be FP16
 * underflow. 8 of them are. */
START_TEST(test_zero_count_floor) {
  probe_diff d;
  run_diff(&d, (spec){.v = V_SOME_ZEROS, .nzero = 2, .steps = 12, .tiny = 1e-9},
           (spec){.v = V_SAME, .steps = 12, .tiny = 1e-9}, 0);
  ck_assert_msg(d.verdict == PROBE_DIFF_AGREE, "%s", d.verdict_text);
  ck_assert_int_eq(d.zero_underflow_records + d.zero_rounding_records, 0);
  probe_diff_free(&d);
  run_diff(&d,
           (spec){.v = V_SOME_ZEROS, .nzero = PROBE_DIFF_ZERO_MIN_VALUES,
                  .steps = 12, .tiny = 1e-9},
           (spec){.v = V_SAME, .steps = 12, .tiny = 1e-9}, 0);
  ck_assert_int_eq(d.verdict, PROBE_DIFF_DIVERGE);
  ck_assert_int_eq(d.first_div_step, 0);
  ck_assert_str_eq(d.intro.layer, "soft");
  ck_assert_ptr_nonnull(strstr(d.verdict_text, "underflowed to zero in A (FP16)"));
  ck_assert(find(&d, "soft", PROBE_SITE_GRAD_IN)->flushes_to_zero);
  probe_diff_free(&d);
}
END_TEST

/* Zeros on the FP32 side (exact cancellation in the baseline) are no
 * underflow of A's: bn-overflow in BF16 was "values underflowed to zero"
 * for B's 2 zeros. */
START_TEST(test_zeros_on_fp32_side) {
  probe_diff d;
  run_diff(&d, (spec){.v = V_SAME, .steps = 12, .tiny = 1e-9},
           (spec){.v = V_SOME_ZEROS, .nzero = 10, .steps = 12, .tiny = 1e-9},
           0);
  ck_assert_msg(d.verdict == PROBE_DIFF_AGREE, "%s", d.verdict_text);
  ck_assert_ptr_null(strstr(d.verdict_text, "underflow"));
  ck_assert_int_eq(d.zero_rounding_records, 12);
  probe_diff_free(&d);
}
END_TEST

/* A BF16 layer whose gradients are all zero where FP32's are tiny: not
 * underflow (BF16 reaches 2^-126), no flush flag, but the whole tensor is
 * gone (>= PROBE_DIFF_ZERO_LOST_FRAC): still DIVERGE, said as such. */
START_TEST(test_bf16_zeroed_tensor_diverges) {
  probe_diff d;
  run_diff(&d, (spec){.v = V_GRAD_FLUSH, .steps = 8, .bf16 = 1, .tiny = 1e-6},
           (spec){.v = V_SAME, .steps = 8, .tiny = 1e-6}, 0);
  ck_assert_int_eq(d.verdict, PROBE_DIFF_DIVERGE);
  ck_assert_ptr_null(strstr(d.verdict_text, "underflowed"));
  ck_assert(!find(&d, "lin1", PROBE_SITE_GRAD_IN)->flushes_to_zero);
  ck_assert_str_eq(d.intro.layer, "lin1");
  ck_assert_int_eq(d.first_div_step, 0); /* the whole tensor: at once */
  ck_assert_ptr_nonnull(strstr(d.verdict_text, "turned to exact zeros in A (BF16)"));
  probe_diff_free(&d);
}
END_TEST

/* BF16's threshold is FP16's times PROBE_DIFF_BF16_THRESHOLD_FACTOR: a
 * steady 23% RMS difference (lin1 +30%) diverges in FP16, not in BF16; a
 * real fault (an overflow) diverges in both. */
START_TEST(test_bf16_threshold) {
  probe_diff d;
  run_diff(&d, (spec){.v = V_LIN1_DRIFT, .steps = 16},
           (spec){.v = V_SAME, .steps = 16}, 0);
  ck_assert_int_eq(d.verdict, PROBE_DIFF_DIVERGE);
  ck_assert_double_eq(d.threshold_used, PROBE_DIFF_DEFAULT_THRESHOLD);
  ck_assert_int_eq(d.threshold_format, PROBE_DTYPE_F16);
  probe_diff_free(&d);
  run_diff(&d, (spec){.v = V_LIN1_DRIFT, .steps = 16, .bf16 = 1},
           (spec){.v = V_SAME, .steps = 16}, 0);
  ck_assert_msg(d.verdict == PROBE_DIFF_AGREE, "%s", d.verdict_text);
  ck_assert_double_eq_tol(d.threshold_used,
                          PROBE_DIFF_DEFAULT_THRESHOLD *
                              PROBE_DIFF_BF16_THRESHOLD_FACTOR, 1e-12);
  ck_assert_int_eq(d.threshold_format, PROBE_DTYPE_BF16);
  ck_assert_ptr_nonnull(strstr(d.verdict_text, "for BF16"));
  probe_diff_free(&d);
  run_diff(&d, (spec){.v = V_REVIN_INF, .steps = 8, .bf16 = 1},
           (spec){.v = V_SAME, .steps = 8}, 0);
  ck_assert_int_eq(d.verdict, PROBE_DIFF_DIVERGE);
  ck_assert_str_eq(d.intro.layer, "revin");
  probe_diff_free(&d);
}
END_TEST

START_TEST(test_loss_part) {
  probe_diff d;
  run_diff(&d, (spec){.v = V_LOSS_PART, .steps = 10},
           (spec){.v = V_SAME, .steps = 10}, 0);
  ck_assert_int_eq(d.verdict, PROBE_DIFF_DIVERGE);
  ck_assert_int_eq(d.first_div_step, -1); /* no layer diverges */
  /* rel 2/3 per step from step 7; windowed over 10: 0.067, then 0.133 */
  ck_assert_int_eq(d.loss_part_step, 8);
  ck_assert_double_eq_tol(d.loss_a_at_part, 3.0 * 2.0 / 9.0, 1e-12);
  ck_assert_ptr_nonnull(strstr(d.verdict_text, "part at step 8"));
  probe_diff_free(&d);
}
END_TEST

START_TEST(test_scaler_backoff_not_divergence) {
  probe_diff d;
  run_diff(&d, (spec){.v = V_BACKOFF, .steps = 6},
           (spec){.v = V_SAME, .steps = 6}, 0);
  ck_assert_int_eq(d.verdict, PROBE_DIFF_AGREE);
  /* lin1 grad_out, grad_in, weight_grad; revin grad_out, grad_in */
  ck_assert_int_eq(d.scaler_overflow_records, 5);
  ck_assert(!d.first_nonfinite_a.found);
  ck_assert_int_eq(find(&d, "lin1", PROBE_SITE_WEIGHT_GRAD)->first_nonfinite_a,
                   2);
  probe_diff_free(&d);
}
END_TEST

START_TEST(test_not_aligned) {
  probe_diff d;
  spec a = {.v = V_SAME, .steps = 4, .rename = 1, .seed = 7};
  spec b = {.v = V_SAME, .steps = 4, .seed = 1};
  run_diff(&d, a, b, 0);
  /* four layers still align; lin1/dense1 do not */
  ck_assert_int_eq(d.n_layers_common, N_LAYERS - 1);
  ck_assert_str_eq(d.only_a, "dense1");
  ck_assert_str_eq(d.only_b, "lin1");
  ck_assert(d.config_other);
  int seed = 0;
  for (size_t i = 0; i < d.n_config_diff; i++)
    seed |= !strcmp(d.config_diff[i].key, "seed");
  ck_assert(seed);
  ck_assert_int_gt(d.records_unmatched, 0);
  ck_assert_int_ge(d.n_notes, 2);
  probe_diff_free(&d);
}
END_TEST

/* Config values are compared as values: the same config written by two
 * writers (the C trainer's jansson, Python's json.dumps) is one config. It
 * was compared as text: 1e-05 against 1.0000000000000001e-5 was a
 * difference "beyond the precision policy", and report disagreed. */
static size_t config_diffs(const char *a, const char *b, int *other) {
  probe_diff d;
  run_diff(&d, (spec){.v = V_SAME, .steps = 2, .cfg_extra = a},
           (spec){.v = V_SAME, .steps = 2, .cfg_extra = b}, 0);
  size_t n = d.n_config_diff; /* "precision" is always one of them */
  *other = d.config_other;
  probe_diff_free(&d);
  return n;
}

START_TEST(test_config_values) {
  int other;
  /* the same values, written differently */
  static const char *const same[][2] = {
      {"\"eps\":1e-05", "\"eps\":1.0000000000000001e-5"},
      {"\"eps\":1e-5", "\"eps\":0.00001"},
      {"\"lr\":0.1", "\"lr\":0.10000000000000001"},
      {"\"lr\":1", "\"lr\":1.0"},
      {"\"lr\":100", "\"lr\":1e2"},
      {"\"x\":-0.0", "\"x\":0"},
      {"\"seed2\":9007199254740993", "\"seed2\":9007199254740993"},
      {"\"d\":\"caf\\u00e9\"", "\"d\":\"caf\xc3\xa9\""},
      {"\"m\":[{\"eps\":1e-05,\"k\":[1,2.0]}]", "\"m\":[{\"eps\":1.0000000000000001e-05,\"k\":[1.0,2]}]"},
      {"\"e\":[]", "\"e\":[ ]"},
  };
  for (size_t i = 0; i < sizeof same / sizeof *same; i++) {
    ck_assert_msg(config_diffs(same[i][0], same[i][1], &other) == 1 && !other,
                  "%s vs %s: counted as a difference", same[i][0], same[i][1]);
  }
  /* different values stay different */
  static const char *const differ[][2] = {
      {"\"eps\":1e-05", "\"eps\":1.00001e-05"},
      {"\"lr\":0.1", "\"lr\":0.10000001"},
      {"\"seed2\":9007199254740993", "\"seed2\":9007199254740992"}, /* one double */
      {"\"seed2\":9007199254740993", "\"seed2\":9007199254740992.0"},
      {"\"seed2\":99999999999999999999", "\"seed2\":99999999999999999998"},
      {"\"x\":1", "\"x\":\"1\""},
      {"\"x\":1", "\"x\":true"},
      {"\"x\":0", "\"x\":null"},
      {"\"x\":0", "\"x\":false"},
      {"\"d\":\"a\"", "\"d\":\"b\""},
      {"\"e\":[]", "\"e\":{}"},
  };
  for (size_t i = 0; i < sizeof differ / sizeof *differ; i++) {
    ck_assert_msg(config_diffs(differ[i][0], differ[i][1], &other) == 2 && other,
                  "%s vs %s: not counted as a difference", differ[i][0],
                  differ[i][1]);
  }
}
END_TEST

START_TEST(test_different_lengths) {
  probe_diff d;
  run_diff(&d, (spec){.v = V_SAME, .steps = 6},
           (spec){.v = V_SAME, .steps = 9}, 0);
  ck_assert_int_eq(d.steps_common, 6);
  ck_assert_int_eq(d.steps_b, 9);
  ck_assert_int_eq(d.last_step_a, 5);
  ck_assert_int_eq(d.last_step_b, 8);
  int said = 0;
  for (int i = 0; i < d.n_notes; i++)
    said |= strstr(d.notes[i], "end at different steps") != NULL;
  ck_assert(said);
  probe_diff_free(&d);
}
END_TEST

START_TEST(test_chunked_same_answer) {
  probe_diff big, small;
  spec a = {.v = V_REVIN_INF, .steps = 9}, b = {.v = V_SAME, .steps = 9};
  run_diff(&big, a, b, 0);
  run_diff(&small, a, b, 3); /* chunks smaller than one step */
  ck_assert_int_eq(big.n_entries, small.n_entries);
  ck_assert_int_eq(big.first_div_step, small.first_div_step);
  ck_assert_str_eq(big.intro.layer, small.intro.layer);
  for (size_t i = 0; i < big.n_entries; i++) {
    ck_assert_str_eq(big.entries[i].layer, small.entries[i].layer);
    ck_assert_int_eq(big.entries[i].site, small.entries[i].site);
    ck_assert_int_eq(big.entries[i].steps, small.entries[i].steps);
    ck_assert_int_eq(big.entries[i].local_steps, small.entries[i].local_steps);
  }
  ck_assert_str_eq(big.verdict_text, small.verdict_text);
  char *txt = NULL;
  ck_assert_int_eq(probe_diff_json(&big, "a.h5", "b.h5", &txt), PROBE_OK);
  json_error_t jerr;
  json_t *j = json_loads(txt, 0, &jerr);
  ck_assert_msg(j != NULL, "not JSON: %s", jerr.text);
  probe_free(txt);
  ck_assert_str_eq(json_string_value(json_object_get(j, "trace_a")), "a.h5");
  ck_assert_str_eq(json_string_value(json_object_get(j, "verdict")), "diverge");
  ck_assert_uint_eq(json_array_size(json_object_get(j, "layers")),
                    big.n_entries);
  json_decref(j);
  probe_diff_free(&big);
  probe_diff_free(&small);
}
END_TEST

/* probe_diff_run_progress: one phase, done never decreasing and reaching
 * total (both traces' records and steps rows), the same result as
 * probe_diff_run; a callback that asks to stop gets PROBE_ERR_INTERRUPTED
 * at that chunk; NULL is probe_diff_run. */
typedef struct dprog {
  int calls, bad, stop_at;
  uint64_t done, total;
} dprog;

static int dprog_cb(const char *phase, uint64_t done, uint64_t total,
                    void *user) {
  dprog *l = user;
  l->calls++;
  if (strcmp(phase, PROBE_PROGRESS_COMPARING) || done > total ||
      (l->calls > 1 && (done < l->done || total != l->total)))
    l->bad = l->calls;
  l->done = done;
  l->total = total;
  return l->stop_at > 0 && l->calls >= l->stop_at;
}

START_TEST(test_progress) {
  probe_diff ref, d;
  spec a = {.v = V_REVIN_INF, .steps = 40}, b = {.v = V_SAME, .steps = 40};
  run_diff(&ref, a, b, 7);
  probe_trace *ta = NULL, *tb = NULL;
  ck_assert_int_eq(probe_trace_open(&ta, path_a), PROBE_OK);
  ck_assert_int_eq(probe_trace_open(&tb, path_b), PROBE_OK);
  const probe_trace_info *ia = probe_trace_get_info(ta), *ib = probe_trace_get_info(tb);
  uint64_t rows = (uint64_t)(ia->n_records + ib->n_records + ia->n_steps + ib->n_steps);
  probe_diff_options opt;
  probe_diff_options_init(&opt);
  opt.chunk_rows = 7;
  dprog l = {0};
  ck_assert_int_eq(probe_diff_run_progress(&d, ta, tb, &opt, dprog_cb, &l), PROBE_OK);
  ck_assert_msg(!l.bad, "call %d broke a rule", l.bad);
  ck_assert_uint_eq(l.total, rows);
  ck_assert_uint_eq(l.done, rows);
  ck_assert_int_gt(l.calls, (int)(rows / 7)); /* a call a chunk */
  ck_assert_int_eq(d.first_div_step, ref.first_div_step);
  ck_assert_str_eq(d.intro.layer, ref.intro.layer);
  ck_assert_str_eq(d.verdict_text, ref.verdict_text);
  probe_diff_free(&d);
  dprog stop = {.stop_at = 5};
  ck_assert_int_eq(probe_diff_run_progress(&d, ta, tb, &opt, dprog_cb, &stop),
                   PROBE_ERR_INTERRUPTED);
  ck_assert_int_eq(stop.calls, 5);
  probe_diff_free(&d);
  ck_assert_int_eq(probe_diff_run_progress(&d, ta, tb, &opt, NULL, NULL), PROBE_OK);
  ck_assert_str_eq(d.verdict_text, ref.verdict_text);
  probe_diff_free(&d);
  probe_diff_free(&ref);
  probe_trace_close(ta);
  probe_trace_close(tb);
}
END_TEST

/* The FP32 baseline finds NaN gradients (found_inf) and, having no scaler,
 * applies them: those records are compared, not left out as a scaler's
 * routine overflow (they were, when found_inf alone meant "skipped"). */
START_TEST(test_nan_without_skip_compared) {
  probe_diff d;
  run_diff(&d, (spec){.v = V_SAME, .steps = 8},
           (spec){.v = V_NAN_NOSKIP, .steps = 8}, 0);
  ck_assert_int_eq(d.verdict, PROBE_DIFF_DIVERGE);
  ck_assert_int_eq(d.scaler_overflow_records, 0);
  const probe_diff_entry *e = find(&d, "lin1", PROBE_SITE_GRAD_IN);
  ck_assert_ptr_nonnull(e);
  ck_assert_int_eq(e->first_div_step, 3);
  ck_assert_int_eq(e->first_nonfinite_b, 3);
  ck_assert_int_eq(e->steps_left_out, 0);
  ck_assert_int_eq(d.first_div_step, 3);
  ck_assert_int_eq(d.first_div.nonfinite, 2); /* B's side */
  ck_assert_ptr_nonnull(strstr(d.verdict_text, "B turns non-finite at step 3"));
  probe_diff_free(&d);
}
END_TEST

/* A skips every step (a collapsed scale): its gradient rows were never
 * compared, so they have no figures (JSON null), not 0 that reads "equal";
 * diffed against itself, the note names both sides. */
START_TEST(test_all_left_out) {
  probe_diff d;
  run_diff(&d, (spec){.v = V_COLLAPSE, .steps = 6},
           (spec){.v = V_SAME, .steps = 6}, 0);
  const probe_diff_entry *e = find(&d, "lin1", PROBE_SITE_WEIGHT_GRAD);
  ck_assert_ptr_nonnull(e);
  ck_assert_int_eq(e->steps, 6);
  ck_assert_int_eq(e->steps_left_out, 6);
  ck_assert_int_eq(e->first_div_step, -1);
  char *txt = NULL;
  ck_assert_int_eq(probe_diff_json(&d, "a", "b", &txt), PROBE_OK);
  json_t *j = json_loads(txt, 0, NULL);
  probe_free(txt);
  ck_assert_ptr_nonnull(j);
  json_t *layers = json_object_get(j, "layers"), *row = NULL;
  for (size_t i = 0; i < json_array_size(layers); i++) {
    json_t *r = json_array_get(layers, i);
    if (!strcmp(json_string_value(json_object_get(r, "layer")), "lin1") &&
        !strcmp(json_string_value(json_object_get(r, "site")), "weight_grad"))
      row = r;
  }
  ck_assert_ptr_nonnull(row);
  ck_assert(json_is_null(json_object_get(row, "max_rel_rms")));
  ck_assert(json_is_null(json_object_get(row, "max_window_rel")));
  ck_assert(json_is_null(json_object_get(row, "mean_rel_rms")));
  ck_assert_int_eq(json_integer_value(json_object_get(row, "steps_left_out")), 6);
  json_decref(j);
  probe_diff_free(&d);

  run_diff(&d, (spec){.v = V_COLLAPSE, .steps = 6},
           (spec){.v = V_COLLAPSE, .steps = 6}, 0);
  int both = 0;
  for (int i = 0; i < d.n_notes; i++)
    both |= strstr(d.notes[i], "of A and the last 6 of B were skipped") != NULL;
  ck_assert_msg(both, "note: %s", d.n_notes ? d.notes[0] : "(none)");
  probe_diff_free(&d);
}
END_TEST

/* Layer lists that differ are not "AGREE" (exit 0): the part compared may
 * agree, the models do not; a divergence with them says so. */
START_TEST(test_layers_differ) {
  probe_diff d;
  run_diff(&d, (spec){.v = V_SAME, .steps = 12, .rename = 1},
           (spec){.v = V_SAME, .steps = 12}, 0);
  ck_assert_int_eq(d.verdict, PROBE_DIFF_NOT_ALIGNED);
  ck_assert_ptr_nonnull(strstr(d.verdict_text, "layer lists differ"));
  ck_assert_ptr_nonnull(strstr(d.verdict_text, "only in A: dense1"));
  probe_diff_free(&d);
  run_diff(&d, (spec){.v = V_REVIN_INF, .steps = 12, .rename = 1},
           (spec){.v = V_SAME, .steps = 12}, 0);
  ck_assert_int_eq(d.verdict, PROBE_DIFF_DIVERGE);
  ck_assert_ptr_nonnull(strstr(d.verdict_text, "The layer lists differ"));
  probe_diff_free(&d);
}
END_TEST

/* Final losses with a non-finite one are not "0% apart"; a step where one
 * loss only is non-finite is the largest difference (1). */
START_TEST(test_final_loss_nonfinite) {
  probe_diff d;
  run_diff(&d, (spec){.v = V_REVIN_INF, .steps = 12},
           (spec){.v = V_SAME, .steps = 12}, 0);
  ck_assert(isnan(d.final_loss_a));
  ck_assert(isnan(d.final_loss_rel));
  ck_assert_double_eq(d.max_loss_rel, 1.0);
  probe_diff_free(&d);
  run_diff(&d, (spec){.v = V_REVIN_INF, .steps = 12},
           (spec){.v = V_REVIN_INF, .steps = 12}, 0);
  ck_assert(isnan(d.final_loss_rel)); /* nan vs nan: not comparable */
  ck_assert(!strstr(d.verdict_text, "apart"));
  probe_diff_free(&d);
}
END_TEST

/* Fewer common steps than the window: said, with the --window to use. */
START_TEST(test_short_trace_note) {
  probe_diff d;
  run_diff(&d, (spec){.v = V_SAME, .steps = 3},
           (spec){.v = V_SAME, .steps = 3}, 0);
  int said = 0;
  for (int i = 0; i < d.n_notes; i++)
    said |= strstr(d.notes[i], "fewer than the window (10)") &&
            strstr(d.notes[i], "--window 3");
  ck_assert(said);
  probe_diff_free(&d);
  run_diff(&d, (spec){.v = V_SAME, .steps = 12},
           (spec){.v = V_SAME, .steps = 12}, 0);
  for (int i = 0; i < d.n_notes; i++)
    ck_assert(!strstr(d.notes[i], "fewer than the window"));
  probe_diff_free(&d);
}
END_TEST

static Suite *make_diff_suite(void) {
  Suite *s = suite_create("diff");
  TCase *tc = tcase_create("core");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_add_test(tc, test_rel);
  tcase_add_test(tc, test_masked_logits_are_finite);
  tcase_add_test(tc, test_agree);
  tcase_add_test(tc, test_local_overflow_at_revin);
  tcase_add_test(tc, test_carried_from_lin1);
  tcase_add_test(tc, test_hostile_layer_name);
  tcase_add_test(tc, test_grad_flush);
  tcase_add_test(tc, test_bf16_rounding_zeros_agree);
  tcase_add_test(tc, test_fp16_zeros_in_range_not_underflow);
  tcase_add_test(tc, test_zero_count_floor);
  tcase_add_test(tc, test_zeros_on_fp32_side);
  tcase_add_test(tc, test_bf16_zeroed_tensor_diverges);
  tcase_add_test(tc, test_bf16_threshold);
  tcase_add_test(tc, test_loss_part);
  tcase_add_test(tc, test_scaler_backoff_not_divergence);
  tcase_add_test(tc, test_not_aligned);
  tcase_add_test(tc, test_config_values);
  tcase_add_test(tc, test_different_lengths);
  tcase_add_test(tc, test_chunked_same_answer);
  tcase_add_test(tc, test_progress);
  tcase_add_test(tc, test_nan_without_skip_compared);
  tcase_add_test(tc, test_all_left_out);
  tcase_add_test(tc, test_layers_differ);
  tcase_add_test(tc, test_final_loss_nonfinite);
  tcase_add_test(tc, test_short_trace_note);
  tcase_set_timeout(tc, 60);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  SRunner *sr = srunner_create(make_diff_suite());
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
