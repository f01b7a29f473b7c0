/*
 * tests/tools/test_diagnose_multiin.c - Check suite for the post-mortem of
 * a module called with several inputs (an RNN cell's x and h, an
 * attention's query and memory, a custom two-input block): every input
 * record of the origin call is read, not only the last one (hunt
 * /tmp/hunt_py finding F3). A non-finite input first, then one that
 * overflows or flushes in FP16, then the largest; the rules that need
 * "inputs finite and in range" hold for all of them. Each test writes a
 * small trace through the libprobe writer API and reads it back isolated.
 */
#define _POSIX_C_SOURCE 200809L
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ampprobe/analysis.h"
#include "ampprobe/probe.h"
#include "probe_testutil.h"
#include <jansson.h>

#define N 16

/* a path in this process's test folder, removed with it (pt_path) */
static char path_buf[256];
static const char *tmp_path(const char *tag) {
  pt_path(path_buf, sizeof path_buf, tag);
  return path_buf;
}

static probe_session *open_s(const char *p) {
  probe_options o;
  probe_options_init(&o);
  o.mode = PROBE_MODE_FULL;
  o.overwrite = 1;
  o.precision_policy = "fp16";
  probe_session *s = NULL;
  ck_assert_int_eq(probe_session_open(&s, p, &o), PROBE_OK);
  return s;
}

static int32_t layer(probe_session *s, const char *name, probe_kind kind) {
  int32_t id;
  ck_assert_int_eq(probe_layer_register(s, name, kind, PROBE_DTYPE_F16, &id),
                   PROBE_OK);
  return id;
}

/* What one record holds: N values v * (0.5 + i/N), then the first nan
 * NaN, inf +inf and zeros 0. */
typedef struct rec {
  float v;
  int nan, inf, zeros;
} rec;

/* The data must stay valid until probe_step_end (probe.h): each record of
 * a step gets its own buffer. */
#define PUT_BUFFERS 64
static void put(probe_session *s, int32_t id, probe_site site, rec q) {
  static float pool[PUT_BUFFERS][N];
  static unsigned next;
  float *x = pool[next++ % PUT_BUFFERS];
  for (int i = 0; i < N; i++) x[i] = q.v * (0.5f + (float)i / N);
  int k = 0;
  for (int i = 0; i < q.nan; i++) x[k++] = NAN;
  for (int i = 0; i < q.inf; i++) x[k++] = INFINITY;
  for (int i = 0; i < q.zeros; i++) x[k++] = 0.0f;
  ck_assert_int_eq(probe_tensor_record(s, id, site, PROBE_DTYPE_F32, x, N),
                   PROBE_OK);
}

static void end(probe_session *s, double loss) {
  probe_step_scalars sc = {.loss = loss, .loss_scale = 1.0, .lr = 1e-3};
  ck_assert_int_eq(probe_step_set_scalars(s, &sc), PROBE_OK);
  ck_assert_int_eq(probe_step_end(s), PROBE_OK);
}

/* pre (linear) -> cell (kind, k inputs) -> out (linear), every layer in
 * FP16. Steps 0-2 are clean; at step 3 the cell's inputs are in[0..k-1]
 * (recorded in that order, as the tracer records a call's arguments),
 * its weight and bias w, and its output `out`, which the out layer passes
 * on to a non-finite loss. */
static void multi_trace(const char *p, probe_kind kind, int k, const rec *in,
                        float w, rec out) {
  probe_session *s = open_s(p);
  int32_t pre = layer(s, "pre", PROBE_KIND_LINEAR);
  int32_t cell = layer(s, "cell", kind);
  int32_t fc = layer(s, "out", PROBE_KIND_LINEAR);
  const rec one = {1.0f, 0, 0, 0}, half = {0.5f, 0, 0, 0};
  for (int step = 0; step < 4; step++) {
    int bad = step == 3;
    ck_assert_int_eq(probe_step_begin(s, step), PROBE_OK);
    put(s, pre, PROBE_SITE_FWD_IN, one);
    put(s, pre, PROBE_SITE_WEIGHT, half);
    put(s, pre, PROBE_SITE_FWD_OUT, one);
    for (int i = 0; i < k; i++) put(s, cell, PROBE_SITE_FWD_IN, bad ? in[i] : one);
    put(s, cell, PROBE_SITE_WEIGHT, (rec){w, 0, 0, 0});
    put(s, cell, PROBE_SITE_WEIGHT, (rec){w, 0, 0, 0}); /* the bias */
    put(s, cell, PROBE_SITE_FWD_OUT, bad ? out : one);
    rec o = {1.0f, bad ? out.nan : 0, bad ? out.inf : 0, 0};
    put(s, fc, PROBE_SITE_FWD_IN, o);
    put(s, fc, PROBE_SITE_WEIGHT, half);
    put(s, fc, PROBE_SITE_FWD_OUT, o);
    end(s, bad ? NAN : 1.0);
  }
  ck_assert_int_eq(probe_session_close(s), PROBE_OK);
}

static void diag_of(probe_diag *d, const char *p) {
  probe_trace *tr = NULL;
  char err[256];
  ck_assert_int_eq(probe_trace_open_isolated(&tr, p, err, sizeof err), PROBE_OK);
  probe_diag_options o;
  probe_diag_options_init(&o);
  ck_assert_int_eq(probe_diag_run(d, tr, p, &o), PROBE_OK);
  probe_trace_close(tr);
}

static const probe_diag_finding *find(const probe_diag *d, probe_diag_finding_id id) {
  for (int i = 0; i < d->n_findings; i++)
    if (d->findings[i].id == id) return &d->findings[i];
  return NULL;
}

static const char *kind_name(probe_kind k) { return probe_kind_name(k); }

/* The input the analysis read is input `index` of `count` (1-based,
 * argument order), in the struct, the text report ("its input   2 of 3:")
 * and postmortem --json (origin_input_index, origin_inputs). */
static void check_input_named(const probe_diag *d, int index, int count) {
  ck_assert_int_eq(d->origin_in_index, index);
  ck_assert_int_eq(d->origin_in_count, count);
  char *text = NULL, *js = NULL, line[64];
  ck_assert_int_eq(probe_diag_render_text(d, &text), PROBE_OK);
  snprintf(line, sizeof line, "its input   %d of %d: ", index, count);
  ck_assert_msg(strstr(text, line), "no '%s' in:\n%s", line, text);
  probe_free(text);
  ck_assert_int_eq(probe_diag_render_json(d, &js), PROBE_OK);
  json_error_t err;
  json_t *j = json_loads(js, 0, &err);
  ck_assert_msg(j != NULL, "%s", err.text);
  json_t *ev = json_object_get(j, "event");
  ck_assert_int_eq(json_integer_value(json_object_get(ev, "origin_input_index")),
                   index);
  ck_assert_int_eq(json_integer_value(json_object_get(ev, "origin_inputs")), count);
  ck_assert(json_is_object(json_object_get(ev, "origin_input")));
  json_decref(j);
  probe_free(js);
}

/* ---- an input beyond FP16's range, first, middle or last ------------------- */

/* The kinds the rules treat apart: a custom module (weak evidence), an
 * attention (a bound on its scores), a normalisation (its zero rows), a
 * linear (NaN of exact zeros). */
static const probe_kind KINDS[] = {PROBE_KIND_OTHER, PROBE_KIND_ATTENTION,
                                   PROBE_KIND_LAYERNORM, PROBE_KIND_LINEAR};
#define N_KINDS (int)(sizeof KINDS / sizeof KINDS[0])
/* (k, position) pairs: 2 inputs, the big one first or last; 3, first,
 * middle or last */
static const int SHAPES[][2] = {{2, 0}, {2, 1}, {3, 0}, {3, 1}, {3, 2}};
#define N_SHAPES (int)(sizeof SHAPES / sizeof SHAPES[0])

/* One input of the cell arrives finite but beyond FP16's range (x * 1e6
 * between modules: 1e5 here), the others finite and small, with `zeros`
 * exact zeros each; the cell's output holds 4 NaN and no inf (an RNN
 * cell's gates turn the inf of the cast into NaN). Whatever the kind and
 * wherever the big input is: an overflow upstream, named at that input,
 * force-fp32 with full evidence - never "not a precision problem" or
 * "nothing overflowed". The old code read the call's last input only. */
START_TEST(test_input_beyond_fp16_anywhere) {
  int kind_i = _i / (2 * N_SHAPES), rest = _i % (2 * N_SHAPES);
  int zeros = rest / N_SHAPES ? 4 : 0;
  int k = SHAPES[rest % N_SHAPES][0], pos = SHAPES[rest % N_SHAPES][1];
  probe_kind kind = KINDS[kind_i];
  rec in[3];
  for (int i = 0; i < k; i++) in[i] = (rec){0.9f, 0, 0, zeros};
  in[pos] = (rec){1.0e5f, 0, 0, 0};
  const char *p = tmp_path("bigin");
  multi_trace(p, kind, k, in, 0.01f, (rec){1.0f, 4, 0, 0});
  probe_diag d;
  diag_of(&d, p);
  const char *what = kind_name(kind);
  ck_assert_msg(d.origin_layer >= 0 &&
                    !strcmp(probe_diag_layer_name(&d, d.origin_layer), "cell"),
                "%s k=%d pos=%d: origin %d", what, k, pos, (int)d.origin_layer);
  ck_assert_int_eq(d.origin_site, PROBE_SITE_FWD_OUT);
  ck_assert_msg(d.event == PROBE_DIAG_EVENT_OVERFLOW,
                "%s k=%d pos=%d zeros=%d: event %s, evidence: %s", what, k, pos,
                zeros, probe_diag_event_name(d.event), d.event_evidence);
  ck_assert_msg(strstr(d.event_evidence, "beyond FP16's range when it arrived"),
                "%s k=%d pos=%d: %s", what, k, pos, d.event_evidence);
  ck_assert_msg(!d.origin_not_precision && !d.origin_precision_weak,
                "%s k=%d pos=%d: not_precision %d weak %d", what, k, pos,
                d.origin_not_precision, d.origin_precision_weak);
  ck_assert(d.have_origin_in);
  ck_assert_msg(d.origin_in.f16_overflow > 0 && d.origin_in.absmax > 65504.0f,
                "%s k=%d pos=%d: origin_in absmax %g", what, k, pos,
                (double)d.origin_in.absmax);
  ck_assert_int_gt(d.n_findings, 0);
  ck_assert_msg(d.findings[0].id == PROBE_DIAG_FINDING_FORCE_FP32 &&
                    !d.findings[0].weak_evidence,
                "%s k=%d pos=%d: first finding %s: %s", what, k, pos,
                probe_diag_finding_name(d.findings[0].id), d.findings[0].title);
  ck_assert_msg(!find(&d, PROBE_DIAG_FINDING_NOT_PRECISION), "%s k=%d pos=%d",
                what, k, pos);
  char named[32];
  snprintf(named, sizeof named, "its input %d of %d was", pos + 1, k);
  ck_assert_msg(strstr(d.event_evidence, named), "%s: %s", named, d.event_evidence);
  check_input_named(&d, pos + 1, k);
  probe_diag_free(&d);
  unlink(p);
}
END_TEST

/* ---- an input whose zeros flushed in FP16 ---------------------------------- */

/* One input holds values at or below 2^-25 beside its zeros (they flushed
 * to 0 in FP16, and 0/0 made the NaN), the others are finite and in
 * range with as many exact zeros as the output has NaN. A normalisation's
 * zero rows, an attention's bound, a linear's NaN of exact zeros: none
 * holds for every input, so none may clear the precision; the old code
 * cleared it from the last input when the flushed one came before. */
START_TEST(test_flushed_input_anywhere) {
  int kind_i = _i / N_SHAPES;
  int k = SHAPES[_i % N_SHAPES][0], pos = SHAPES[_i % N_SHAPES][1];
  probe_kind kind = KINDS[kind_i];
  rec in[3];
  for (int i = 0; i < k; i++) in[i] = (rec){0.9f, 0, 0, 4};
  in[pos] = (rec){1.0e-8f, 0, 0, 4};
  const char *p = tmp_path("flushin");
  multi_trace(p, kind, k, in, 0.01f, (rec){1.0f, 4, 0, 0});
  probe_diag d;
  diag_of(&d, p);
  const char *what = kind_name(kind);
  ck_assert_str_eq(probe_diag_layer_name(&d, d.origin_layer), "cell");
  ck_assert_int_eq(d.event, PROBE_DIAG_EVENT_INF_ARITH_NAN);
  ck_assert_msg(!d.origin_not_precision && !d.origin_precision_weak,
                "%s k=%d pos=%d: not_precision %d weak %d: %s", what, k, pos,
                d.origin_not_precision, d.origin_precision_weak,
                d.event_evidence);
  ck_assert_msg(!find(&d, PROBE_DIAG_FINDING_NOT_PRECISION), "%s k=%d pos=%d: %s",
                what, k, pos, d.findings[0].title);
  const probe_diag_finding *f = find(&d, PROBE_DIAG_FINDING_FORCE_FP32);
  ck_assert_msg(f && !f->weak_evidence, "%s k=%d pos=%d", what, k, pos);
  ck_assert_msg(d.have_origin_in && d.origin_in.f16_flush > 0,
                "%s k=%d pos=%d: origin_in flush %llu", what, k, pos,
                (unsigned long long)d.origin_in.f16_flush);
  check_input_named(&d, pos + 1, k);
  probe_diag_free(&d);
  unlink(p);
}
END_TEST

/* ---- an attention's bound takes its largest input --------------------------- */

/* A cross-attention whose query is large but within FP16's range (2e4)
 * and whose memory holds flushed zeros; weights 2.0; the output holds inf.
 * The scores can overflow (||W||(||q||+1) is past 65504): an overflow,
 * not the underflow-to-inf the old code read from the memory alone when
 * it came last. big_last: the query last (the old code was right). */
START_TEST(test_attention_bound_takes_the_largest_input) {
  int big_last = _i;
  rec in[2] = {{2.0e4f, 0, 0, 0}, {1.0e-8f, 0, 0, 4}};
  if (big_last) {
    rec t = in[0];
    in[0] = in[1];
    in[1] = t;
  }
  const char *p = tmp_path("attbound");
  multi_trace(p, PROBE_KIND_ATTENTION, 2, in, 2.0f, (rec){1.0f, 0, 4, 0});
  probe_diag d;
  diag_of(&d, p);
  ck_assert_str_eq(probe_diag_layer_name(&d, d.origin_layer), "cell");
  ck_assert_msg(d.event == PROBE_DIAG_EVENT_OVERFLOW, "big_last %d: %s: %s",
                big_last, probe_diag_event_name(d.event), d.event_evidence);
  ck_assert_msg(strstr(d.event_evidence, "magnitudes can overflow"),
                "big_last %d: %s", big_last, d.event_evidence);
  /* the input read is the flushed one (it ranks above the largest), the
   * bound is the largest's */
  check_input_named(&d, big_last ? 1 : 2, 2);
  probe_diag_free(&d);
  unlink(p);
}
END_TEST

/* ---- controls: every input in range, the verdict as before ----------------- */

/* Three inputs, all finite and in range. An attention with small weights
 * whose inputs hold as many zeros as its NaN: not a precision problem
 * (the bound holds for all of them); a custom module with no zeros:
 * force-fp32 on weak evidence. Both as before the change; the input read
 * is the largest. */
START_TEST(test_inputs_in_range_keep_the_verdict) {
  int attention = _i;
  rec in[3] = {{0.9f, 0, 0, 4}, {3.0f, 0, 0, 4}, {0.5f, 0, 0, 4}};
  if (!attention)
    for (int i = 0; i < 3; i++) in[i].zeros = 0;
  const char *p = tmp_path("inrange");
  multi_trace(p, attention ? PROBE_KIND_ATTENTION : PROBE_KIND_OTHER, 3, in,
              0.01f, (rec){1.0f, 4, 0, 0});
  probe_diag d;
  diag_of(&d, p);
  ck_assert_str_eq(probe_diag_layer_name(&d, d.origin_layer), "cell");
  ck_assert_int_eq(d.event, PROBE_DIAG_EVENT_INF_ARITH_NAN);
  if (attention) {
    ck_assert_msg(d.origin_not_precision, "%s", d.event_evidence);
    ck_assert_int_eq(d.findings[0].id, PROBE_DIAG_FINDING_NOT_PRECISION);
  } else {
    ck_assert(d.origin_precision_weak);
    ck_assert_int_eq(d.findings[0].id, PROBE_DIAG_FINDING_FORCE_FP32);
    ck_assert(d.findings[0].weak_evidence);
    ck_assert_msg(strstr(d.event_evidence, "all 3 of its inputs are finite"), "%s",
                  d.event_evidence);
  }
  /* the largest of the three, as every one is in range */
  check_input_named(&d, 2, 3);
  probe_diag_free(&d);
  unlink(p);
}
END_TEST

/* A non-finite input in the middle of three: the step's first non-finite
 * record, so the input record is the origin (code no record covers made
 * it), as before. */
START_TEST(test_nonfinite_input_is_the_origin) {
  rec in[3] = {{0.9f, 0, 0, 0}, {0.9f, 0, 4, 0}, {0.9f, 0, 0, 0}};
  const char *p = tmp_path("nfin");
  multi_trace(p, PROBE_KIND_OTHER, 3, in, 0.01f, (rec){1.0f, 4, 0, 0});
  probe_diag d;
  diag_of(&d, p);
  ck_assert_str_eq(probe_diag_layer_name(&d, d.origin_layer), "cell");
  ck_assert_int_eq(d.origin_site, PROBE_SITE_FWD_IN);
  ck_assert_int_eq(d.findings[0].id, PROBE_DIAG_FINDING_CLEAN_INPUT);
  check_input_named(&d, 2, 3); /* the origin is that input */
  probe_diag_free(&d);
  unlink(p);
}
END_TEST

/* ---- fed_by: the producer of the input read -------------------------------- */

/* pre and mem (linears) each make one input of cell (kind other); at step
 * 3 cell's output holds 4 NaN. mode 0: pre's output (3.0) is the largest
 * input, handed over unchanged: fed by pre, though mem's output came last
 * before the call (the old code's feeder); 1: mem's (3.0) is: fed by mem;
 * 2: cell's first input is pre's output x 1e5, made between modules: no
 * record fed it (the old code said mem, which fed the other input). */
START_TEST(test_fed_by_is_the_producer_of_the_input_read) {
  int mode = _i;
  const char *p = tmp_path("fedby");
  probe_session *s = open_s(p);
  int32_t pre = layer(s, "pre", PROBE_KIND_LINEAR);
  int32_t mem = layer(s, "mem", PROBE_KIND_LINEAR);
  int32_t cell = layer(s, "cell", PROBE_KIND_OTHER);
  const rec one = {1.0f, 0, 0, 0}, three = {3.0f, 0, 0, 0}, half = {0.5f, 0, 0, 0};
  for (int step = 0; step < 4; step++) {
    int bad = step == 3;
    rec a = mode == 0 ? three : one, b = mode == 1 ? three : one;
    ck_assert_int_eq(probe_step_begin(s, step), PROBE_OK);
    put(s, pre, PROBE_SITE_FWD_IN, one);
    put(s, pre, PROBE_SITE_WEIGHT, half);
    put(s, pre, PROBE_SITE_FWD_OUT, a);
    put(s, mem, PROBE_SITE_FWD_IN, one);
    put(s, mem, PROBE_SITE_WEIGHT, half);
    put(s, mem, PROBE_SITE_FWD_OUT, b);
    put(s, cell, PROBE_SITE_FWD_IN, bad && mode == 2 ? (rec){1.0e5f, 0, 0, 0} : a);
    put(s, cell, PROBE_SITE_FWD_IN, b);
    put(s, cell, PROBE_SITE_WEIGHT, half);
    put(s, cell, PROBE_SITE_FWD_OUT, (rec){1.0f, bad ? 4 : 0, 0, 0});
    end(s, bad ? NAN : 1.0);
  }
  ck_assert_int_eq(probe_session_close(s), PROBE_OK);
  probe_diag d;
  diag_of(&d, p);
  ck_assert_str_eq(probe_diag_layer_name(&d, d.origin_layer), "cell");
  ck_assert_int_eq(d.origin_in_index, mode == 1 ? 2 : 1);
  const char *want = mode == 0 ? "pre" : mode == 1 ? "mem" : NULL;
  const char *got = d.feeder_layer >= 0 ? probe_diag_layer_name(&d, d.feeder_layer)
                                        : NULL;
  ck_assert_msg(want ? got && !strcmp(got, want) : !got, "mode %d: fed by %s",
                mode, got ? got : "nothing");
  char *js = NULL;
  ck_assert_int_eq(probe_diag_render_json(&d, &js), PROBE_OK);
  json_t *j = json_loads(js, 0, NULL);
  json_t *fb = json_object_get(json_object_get(j, "event"), "fed_by");
  if (want)
    ck_assert_str_eq(json_string_value(fb), want);
  else
    ck_assert(json_is_null(fb));
  json_decref(j);
  probe_free(js);
  probe_diag_free(&d);
  unlink(p);
}
END_TEST

static Suite *make_suite(void) {
  Suite *s = suite_create("diagnose_multiin");
  TCase *tc = tcase_create("multiin");
  tcase_set_timeout(tc, 60);
  tcase_add_loop_test(tc, test_input_beyond_fp16_anywhere, 0,
                      N_KINDS * 2 * N_SHAPES);
  tcase_add_loop_test(tc, test_flushed_input_anywhere, 0, N_KINDS * N_SHAPES);
  tcase_add_loop_test(tc, test_attention_bound_takes_the_largest_input, 0, 2);
  tcase_add_loop_test(tc, test_inputs_in_range_keep_the_verdict, 0, 2);
  tcase_add_test(tc, test_nonfinite_input_is_the_origin);
  tcase_add_loop_test(tc, test_fed_by_is_the_producer_of_the_input_read, 0, 3);
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
