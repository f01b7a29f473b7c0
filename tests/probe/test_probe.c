/*
 * test_probe.c - Check suites for libprobe: api (names, options, argument
 * and state errors), writer (round trips of every table, dtypes, layer
 * selection, step windows, the flight recorder and snapshots, flush
 * visibility) and reader (every kind of bad input, range checks).
 */
#define _POSIX_C_SOURCE 200809L
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <sys/stat.h>
#include <time.h>
#include <sys/wait.h>

#include <hdf5.h>

#include "ampprobe/analysis.h"
#include "probe_testutil.h"

/* ---- api ------------------------------------------------------------------ */

START_TEST(test_names_roundtrip) {
  for (int k = 0; k < PROBE_KIND_COUNT; k++) {
    probe_kind out;
    const char *n = probe_kind_name((probe_kind)k);
    ck_assert_ptr_nonnull(n);
    PT_CHECK(probe_kind_parse(n, &out));
    ck_assert_int_eq(out, k);
  }
  for (int s = 0; s < PROBE_SITE_COUNT; s++) {
    probe_site out;
    PT_CHECK(probe_site_parse(probe_site_name((probe_site)s), &out));
    ck_assert_int_eq(out, s);
  }
  for (int p = 0; p < 3; p++) {
    probe_dtype out;
    PT_CHECK(probe_dtype_parse(probe_dtype_name((probe_dtype)p),
                                   &out));
    ck_assert_int_eq(out, p);
  }
  probe_kind k;
  ck_assert_int_eq(probe_kind_parse("conv9d", &k), PROBE_ERR_NOT_FOUND);
  ck_assert_str_eq(probe_kind_name(PROBE_KIND_REVIN), "revin");
  ck_assert_str_eq(probe_site_name(PROBE_SITE_GRAD_OUT), "grad_out");
  ck_assert_int_eq(probe_site_phase(PROBE_SITE_FWD_SAVED), PROBE_PHASE_FORWARD);
  ck_assert_int_eq(probe_site_phase(PROBE_SITE_WEIGHT_GRAD),
                   PROBE_PHASE_BACKWARD);
  ck_assert_int_eq(probe_site_phase(PROBE_SITE_MASTER_WEIGHT),
                   PROBE_PHASE_OPTIMIZER);
  ck_assert_str_eq(probe_phase_name(PROBE_PHASE_BACKWARD), "backward");
  ck_assert_str_eq(probe_scaler_kind_name(PROBE_SCALER_BACKOFF), "backoff");
  ck_assert_ptr_null(probe_kind_name(PROBE_KIND_COUNT));
}
END_TEST

START_TEST(test_options_defaults) {
  probe_options o;
  memset(&o, 0x5a, sizeof o);
  probe_options_init(&o);
  ck_assert_int_eq(o.mode, PROBE_MODE_SCALARS);
  ck_assert_ptr_null(o.layer_select);
  ck_assert_int_eq(o.step_start, 0);
  ck_assert_int_eq(o.step_end, -1);
  ck_assert_int_eq(o.step_every, 1);
  ck_assert_int_eq(o.ring_steps, 8);
  ck_assert_double_eq(o.flush_seconds, 1.0);
  ck_assert_int_eq(o.flush_steps, 0);
  ck_assert_int_eq(o.snapshot_on_nonfinite, 1);
  ck_assert_uint_eq(o.snapshot_max_elems, 1u << 20);
  ck_assert_int_eq(o.cupti, 0);
  ck_assert_int_eq(o.max_events, 16);
  ck_assert_int_eq(o.rank, -1);
  ck_assert_int_eq(o.world_size, 0);
  ck_assert_ptr_null(o.run_id);
}
END_TEST

START_TEST(test_api_errors) {
  char path[256];
  pt_path(path, sizeof path, "api");
  probe_session *s = NULL;
  probe_options o;
  probe_options_init(&o);
  ck_assert_int_eq(probe_session_open(&s, NULL, &o), PROBE_ERR_INVALID_ARG);
  o.step_every = 0;
  ck_assert_int_eq(probe_session_open(&s, path, &o), PROBE_ERR_CONFIG);
  ck_assert_ptr_null(s);
  probe_options_init(&o);
  probe_status st = probe_session_open(&s, "/nonexistent-dir/x/t.h5", &o);
  ck_assert_int_eq(st, PROBE_ERR_IO);
  ck_assert_ptr_null(s);
  ck_assert_ptr_nonnull(
      strstr(probe_session_last_error(NULL), "cannot create trace"));

  PT_CHECK(probe_session_open(&s, path, &o));
  int32_t id = -1;
  char longname[100];
  memset(longname, 'a', sizeof longname - 1);
  longname[sizeof longname - 1] = '\0';
  ck_assert_int_eq(probe_layer_register(s, longname, PROBE_KIND_LINEAR,
                                        PROBE_DTYPE_F16, &id),
                   PROBE_ERR_INVALID_ARG);
  ck_assert_int_eq(
      probe_layer_register(s, "", PROBE_KIND_LINEAR, PROBE_DTYPE_F16, &id),
      PROBE_ERR_INVALID_ARG);
  PT_CHECK(probe_layer_register(s, "a", PROBE_KIND_LINEAR, PROBE_DTYPE_F16,
                                &id));
  ck_assert_int_eq(id, 0);
  ck_assert_int_eq(
      probe_layer_register(s, "a", PROBE_KIND_BN, PROBE_DTYPE_F16, &id),
      PROBE_ERR_INVALID_ARG);
  ck_assert_str_ne(probe_session_last_error(s), "no error");
  float x[4] = {1, 2, 3, 4};
  ck_assert_int_eq(probe_tensor_record(s, 0, PROBE_SITE_FWD_OUT,
                                       PROBE_DTYPE_F32, x, 4),
                   PROBE_ERR_STATE);
  ck_assert_int_eq(probe_step_end(s), PROBE_ERR_STATE);
  PT_CHECK(probe_step_begin(s, 3));
  ck_assert_int_eq(probe_step_begin(s, 4), PROBE_ERR_STATE);
  ck_assert_int_eq(probe_tensor_record(s, 7, PROBE_SITE_FWD_OUT,
                                       PROBE_DTYPE_F32, x, 4),
                   PROBE_ERR_INVALID_ARG);
  ck_assert_int_eq(probe_tensor_record(s, 0, PROBE_SITE_COUNT,
                                       PROBE_DTYPE_F32, x, 4),
                   PROBE_ERR_INVALID_ARG);
  ck_assert_int_eq(
      probe_tensor_record(s, 0, PROBE_SITE_FWD_OUT, PROBE_DTYPE_F32, NULL, 4),
      PROBE_ERR_INVALID_ARG);
  PT_CHECK(probe_step_end(s));
  ck_assert_int_eq(probe_step_begin(s, 3), PROBE_ERR_STATE); /* not after 3 */
  probe_scaler_event ev = {.step = 0, .kind = 9};
  ck_assert_int_eq(probe_scaler_transition(s, &ev), PROBE_ERR_INVALID_ARG);
  /* Argument errors are not sticky: the session still closes cleanly. */
  PT_CHECK(probe_session_close(s));
  probe_trace *t;
  PT_CHECK(probe_trace_open(&t, path));
  ck_assert_int_eq(probe_trace_get_info(t)->last_step, 3);
  ck_assert_int_eq(probe_trace_get_info(t)->complete, 1);
  probe_trace_close(t);
  unlink(path);
}
END_TEST

/* A session closed in the middle of a step keeps that step's scalars. */
START_TEST(test_close_in_step) {
  char path[256];
  pt_path(path, sizeof path, "instep");
  probe_options o;
  probe_options_init(&o);
  o.mode = PROBE_MODE_FULL;
  probe_session *s;
  int32_t id;
  PT_CHECK(probe_session_open(&s, path, &o));
  PT_CHECK(probe_layer_register(s, "l", PROBE_KIND_LINEAR, PROBE_DTYPE_F32,
                                &id));
  PT_CHECK(probe_step_begin(s, 0));
  float x[8];
  pt_tensor(x, 8, 0, 0);
  PT_CHECK(probe_tensor_record(s, id, PROBE_SITE_FWD_OUT, PROBE_DTYPE_F32, x,
                               8));
  probe_step_scalars sc = {.loss = 2.5, .loss_scale = 1024};
  PT_CHECK(probe_step_set_scalars(s, &sc));
  PT_CHECK(probe_session_close(s));
  probe_trace *t;
  PT_CHECK(probe_trace_open(&t, path));
  ck_assert_int_eq(probe_trace_get_info(t)->n_steps, 1);
  ck_assert_int_eq(probe_trace_get_info(t)->n_records, 1);
  probe_trace_close(t);
  unlink(path);
}
END_TEST

static Suite *make_api_suite(void) {
  Suite *s = suite_create("api");
  TCase *tc = tcase_create("api");
  tcase_add_test(tc, test_names_roundtrip);
  tcase_add_test(tc, test_options_defaults);
  tcase_add_test(tc, test_api_errors);
  tcase_add_test(tc, test_close_in_step);
  suite_add_tcase(s, tc);
  return s;
}

/* ---- writer --------------------------------------------------------------- */

enum { RT_LAYERS = 3, RT_STEPS = 20, RT_N = 257 };
static const probe_site rt_sites[3] = {PROBE_SITE_FWD_IN, PROBE_SITE_FWD_OUT,
                                       PROBE_SITE_GRAD_OUT};

START_TEST(test_writer_roundtrip) {
  char path[256];
  pt_path(path, sizeof path, "rt");
  probe_options o;
  probe_options_init(&o);
  o.mode = PROBE_MODE_FULL;
  o.batch_rows = 7; /* many H5Dwrite calls */
  o.command_line = "ampprobe run --trace";
  o.config_json = "{\"steps\": 20, \"name\": \"\xc3\xa9t\xc3\xa9\"}";
  o.precision_policy = "fp16; fp32: bn";
  probe_session *s;
  PT_CHECK(probe_session_open(&s, path, &o));
  static const char *names[RT_LAYERS] = {"encoder.lin1", "encoder.bn2",
                                         "head"};
  static const probe_kind kinds[RT_LAYERS] = {PROBE_KIND_LINEAR, PROBE_KIND_BN,
                                              PROBE_KIND_LOSS};
  for (int l = 0; l < RT_LAYERS; l++) {
    int32_t id;
    PT_CHECK(probe_layer_register(s, names[l], kinds[l],
                                  l == 1 ? PROBE_DTYPE_F32 : PROBE_DTYPE_F16,
                                  &id));
    ck_assert_int_eq(id, l);
  }
  float *x = malloc(RT_LAYERS * 3 * RT_N * sizeof *x);
  for (int64_t step = 0; step < RT_STEPS; step++) {
    PT_CHECK(probe_step_begin(s, step));
    uint32_t seq = 0;
    for (int l = 0; l < RT_LAYERS; l++)
      for (int k = 0; k < 3; k++, seq++) {
        float *t = x + seq * RT_N;
        pt_tensor(t, RT_N, step, seq);
        PT_CHECK(probe_tensor_record(s, l, rt_sites[k], PROBE_DTYPE_F32, t,
                                     RT_N));
      }
    probe_step_scalars sc = {.loss = 1.0 / (double)(step + 1),
                             .loss_scale = 65536.0 / (double)(1 + step % 2),
                             .growth_tracker = (int32_t)step,
                             .found_inf = (int32_t)(step % 2),
                             .skipped = (int32_t)(step % 2),
                             .lr = 1e-3,
                             .grad_norm = 2.0 * (double)step,
                             .clip_threshold = 1.0,
                             .clip_coef = 0.5};
    PT_CHECK(probe_step_set_scalars(s, &sc));
    if (step % 5 == 4) {
      probe_scaler_event ev = {.kind = PROBE_SCALER_BACKOFF,
                               .old_scale = 65536,
                               .new_scale = 32768,
                               .growth_tracker = 0};
      PT_CHECK(probe_scaler_transition(s, &ev));
    }
    PT_CHECK(probe_step_end(s));
  }
  free(x);
  PT_CHECK(probe_session_close(s));

  probe_trace *t;
  PT_CHECK(probe_trace_open(&t, path));
  const probe_trace_info *in = probe_trace_get_info(t);
  ck_assert_int_eq(in->version, PROBE_TRACE_VERSION);
  ck_assert_int_eq(in->complete, 1);
  ck_assert_int_eq(in->record_mode, PROBE_MODE_FULL);
  ck_assert_int_eq(in->n_layers, RT_LAYERS);
  ck_assert_int_eq(in->n_steps, RT_STEPS);
  ck_assert_int_eq(in->n_records, RT_STEPS * RT_LAYERS * 3);
  ck_assert_int_eq(in->n_scaler_events, RT_STEPS / 5);
  ck_assert_int_eq(in->n_snapshots, 0);
  ck_assert_int_eq(in->last_step, RT_STEPS - 1);
  ck_assert_int_eq(in->first_nonfinite_step, -1);
  ck_assert_str_eq(in->command_line, o.command_line);
  ck_assert_str_eq(in->config_json, o.config_json);
  ck_assert_str_eq(in->precision_policy, o.precision_policy);
  ck_assert_int_eq((int)strlen(in->created), 20);
  ck_assert_ptr_nonnull(strstr(in->library_versions, "hdf5 1."));
  size_t nl;
  const probe_layer_info *L = probe_trace_layers(t, &nl);
  ck_assert_uint_eq(nl, RT_LAYERS);
  for (int l = 0; l < RT_LAYERS; l++) {
    ck_assert_str_eq(L[l].name, names[l]);
    ck_assert_int_eq(L[l].kind, kinds[l]);
    ck_assert_int_eq(L[l].id, l);
  }
  ck_assert_int_eq(L[1].precision, PROBE_DTYPE_F32);

  /* Records in chunks of 5: every one equals what was written. */
  probe_record buf[5];
  size_t got;
  int64_t row = 0;
  for (;;) {
    PT_CHECK(probe_trace_read_records(t, row, 5, buf, &got));
    if (got == 0) break;
    for (size_t i = 0; i < got; i++, row++) {
      int64_t step = row / (RT_LAYERS * 3);
      uint32_t seq = (uint32_t)(row % (RT_LAYERS * 3));
      ck_assert_int_eq(buf[i].step, step);
      ck_assert_uint_eq(buf[i].seq, seq);
      ck_assert_int_eq(buf[i].layer, (int)(seq / 3));
      ck_assert_int_eq(buf[i].site, rt_sites[seq % 3]);
      ck_assert_int_eq(buf[i].dtype, PROBE_DTYPE_F32);
      probe_stats want;
      pt_expected(&want, RT_N, step, seq);
      ck_assert_int_eq(memcmp(&want, &buf[i].stats, sizeof want), 0);
    }
  }
  ck_assert_int_eq(row, in->n_records);

  probe_step_scalars sc[RT_STEPS];
  PT_CHECK(probe_trace_read_steps(t, 0, RT_STEPS, sc, &got));
  ck_assert_uint_eq(got, RT_STEPS);
  for (int i = 0; i < RT_STEPS; i++) {
    ck_assert_int_eq(sc[i].step, i);
    ck_assert_double_eq(sc[i].loss, 1.0 / (double)(i + 1));
    ck_assert_double_eq(sc[i].loss_scale, 65536.0 / (double)(1 + i % 2));
    ck_assert_int_eq(sc[i].growth_tracker, i);
    ck_assert_int_eq(sc[i].skipped, i % 2);
    ck_assert_double_eq(sc[i].grad_norm, 2.0 * i);
    ck_assert_double_eq(sc[i].clip_coef, 0.5);
    ck_assert(sc[i].wall_time >= 0 && sc[i].wall_time < 60);
    if (i) ck_assert(sc[i].wall_time >= sc[i - 1].wall_time);
  }
  PT_CHECK(probe_trace_read_steps(t, RT_STEPS, 4, sc, &got));
  ck_assert_uint_eq(got, 0);
  probe_scaler_event ev[8];
  PT_CHECK(probe_trace_read_scaler_events(t, 0, 8, ev, &got));
  ck_assert_uint_eq(got, 4);
  for (int i = 0; i < 4; i++) {
    ck_assert_int_eq(ev[i].step, 5 * i + 4);
    ck_assert_int_eq(ev[i].kind, PROBE_SCALER_BACKOFF);
    ck_assert_double_eq(ev[i].new_scale, 32768);
  }
  probe_trace_close(t);
  unlink(path);
}
END_TEST

/* fp16 and bf16 tensors: the records are the kernel's statistics of them. */
START_TEST(test_writer_dtypes) {
  char path[256];
  pt_path(path, sizeof path, "dt");
  probe_options o;
  probe_options_init(&o);
  o.mode = PROBE_MODE_FULL;
  probe_session *s;
  int32_t id;
  PT_CHECK(probe_session_open(&s, path, &o));
  PT_CHECK(probe_layer_register(s, "l", PROBE_KIND_LINEAR, PROBE_DTYPE_F16,
                                &id));
  enum { N = 1000 };
  float f[N];
  uint16_t h[N], b[N];
  pt_tensor(f, N, 7, 1);
  for (int i = 0; i < N; i++) {
    h[i] = probe_f32_to_f16(f[i] * 1000.0f); /* some overflow to inf */
    b[i] = probe_f32_to_bf16(f[i]);
  }
  PT_CHECK(probe_step_begin(s, 0));
  PT_CHECK(probe_tensor_record(s, id, PROBE_SITE_FWD_OUT, PROBE_DTYPE_F16, h,
                               N));
  PT_CHECK(probe_tensor_record(s, id, PROBE_SITE_GRAD_IN, PROBE_DTYPE_BF16, b,
                               N));
  PT_CHECK(probe_tensor_record(s, id, PROBE_SITE_WEIGHT, PROBE_DTYPE_F32, f, 0));
  PT_CHECK(probe_step_end(s));
  PT_CHECK(probe_session_close(s));
  probe_trace *t;
  PT_CHECK(probe_trace_open(&t, path));
  probe_record r[3];
  size_t got;
  PT_CHECK(probe_trace_read_records(t, 0, 3, r, &got));
  ck_assert_uint_eq(got, 3);
  probe_stats w;
  probe_stats_compute(&w, PROBE_DTYPE_F16, h, N);
  ck_assert_int_eq(memcmp(&w, &r[0].stats, sizeof w), 0);
  ck_assert_uint_gt(r[0].stats.posinf_count + r[0].stats.neginf_count, 0);
  ck_assert_int_eq(r[0].dtype, PROBE_DTYPE_F16);
  probe_stats_compute(&w, PROBE_DTYPE_BF16, b, N);
  ck_assert_int_eq(memcmp(&w, &r[1].stats, sizeof w), 0);
  ck_assert_uint_eq(r[2].stats.count, 0);
  /* The inf in step 0 made it the first non-finite step, and (full mode
   * too) the layer's three tensors were stored, widened to float32. */
  ck_assert_int_eq(probe_trace_get_info(t)->first_nonfinite_step, 0);
  probe_snapshot_info sn[3];
  PT_CHECK(probe_trace_read_snapshots(t, 0, 3, sn, &got));
  ck_assert_uint_eq(got, 3);
  ck_assert_int_eq(sn[0].dtype, PROBE_DTYPE_F16);
  ck_assert_int_eq(sn[1].dtype, PROBE_DTYPE_BF16);
  ck_assert_int_eq(sn[2].n, 0);
  float v[N];
  PT_CHECK(probe_trace_read_snapshot_data(t, &sn[0], v));
  for (int i = 0; i < N; i++) {
    float e = probe_f16_to_f32(h[i]);
    ck_assert_int_eq(memcmp(&e, &v[i], 4), 0);
  }
  PT_CHECK(probe_trace_read_snapshot_data(t, &sn[1], v));
  for (int i = 0; i < N; i++) {
    float e = probe_bf16_to_f32(b[i]);
    ck_assert_int_eq(memcmp(&e, &v[i], 4), 0);
  }
  probe_trace_close(t);
  unlink(path);
}
END_TEST

/* Helper: a full-mode session over layers, recording two sites per layer
 * for steps 0..nsteps-1; returns the trace opened. */
static probe_trace *write_selected(const char *path, const probe_options *o,
                                   const char *const *names, int nl,
                                   int nsteps) {
  probe_session *s;
  PT_CHECK(probe_session_open(&s, path, o));
  for (int l = 0; l < nl; l++)
    PT_CHECK(probe_layer_register(s, names[l], PROBE_KIND_OTHER,
                                  PROBE_DTYPE_F16, NULL));
  float x[16];
  for (int step = 0; step < nsteps; step++) {
    PT_CHECK(probe_step_begin(s, step));
    for (int l = 0; l < nl; l++) {
      pt_tensor(x, 16, step, (uint32_t)l);
      PT_CHECK(probe_tensor_record(s, l, PROBE_SITE_FWD_OUT, PROBE_DTYPE_F32,
                                   x, 16));
      PT_CHECK(probe_tensor_record(s, l, PROBE_SITE_GRAD_IN, PROBE_DTYPE_F32,
                                   x, 16));
    }
    probe_step_scalars sc = {.loss = 1.0, .loss_scale = 1.0};
    PT_CHECK(probe_step_set_scalars(s, &sc));
    PT_CHECK(probe_step_end(s));
  }
  PT_CHECK(probe_session_close(s));
  probe_trace *t;
  PT_CHECK(probe_trace_open(&t, path));
  return t;
}

START_TEST(test_writer_layer_select) {
  char path[256];
  pt_path(path, sizeof path, "sel");
  static const char *const names[4] = {"enc.a", "enc.b", "dec.a", "head"};
  probe_options o;
  probe_options_init(&o);
  o.mode = PROBE_MODE_FULL;
  o.layer_select = " enc.* , head";
  probe_trace *t = write_selected(path, &o, names, 4, 3);
  probe_record r[32];
  size_t got;
  PT_CHECK(probe_trace_read_records(t, 0, 32, r, &got));
  ck_assert_uint_eq(got, 3 * 3 * 2);
  for (size_t i = 0; i < got; i++) {
    ck_assert_int_ne(r[i].layer, 2); /* dec.a not selected */
    ck_assert_uint_eq(r[i].seq, i % 6); /* seq counts recorded tensors */
  }
  ck_assert_int_eq(probe_trace_get_info(t)->n_layers, 4); /* all registered */
  probe_trace_close(t);
  unlink(path);
}
END_TEST

START_TEST(test_writer_step_window) {
  char path[256];
  pt_path(path, sizeof path, "win");
  static const char *const names[2] = {"a", "b"};
  probe_options o;
  probe_options_init(&o);
  o.mode = PROBE_MODE_FULL;
  o.step_start = 2;
  o.step_end = 10;
  o.step_every = 3;
  probe_trace *t = write_selected(path, &o, names, 2, 15);
  probe_record r[64];
  size_t got;
  PT_CHECK(probe_trace_read_records(t, 0, 64, r, &got));
  ck_assert_uint_eq(got, 3 * 4); /* steps 2, 5, 8 */
  for (size_t i = 0; i < got; i++)
    ck_assert_int_eq(r[i].step, 2 + 3 * (int64_t)(i / 4));
  /* Step scalars are kept for every step. */
  ck_assert_int_eq(probe_trace_get_info(t)->n_steps, 15);
  probe_trace_close(t);
  unlink(path);
}
END_TEST

/* probe_session_first_nonfinite: the first record with NaN/inf in execution
 * order, over completed steps, and whether the session sees every record. */
START_TEST(test_session_first_nonfinite) {
  char path[256];
  pt_path(path, sizeof path, "firstnf");
  probe_options o;
  probe_options_init(&o);
  probe_session *s;
  PT_CHECK(probe_session_open(&s, path, &o));
  int32_t a, b;
  PT_CHECK(probe_layer_register(s, "a", PROBE_KIND_LINEAR, PROBE_DTYPE_F16, &a));
  PT_CHECK(probe_layer_register(s, "b", PROBE_KIND_BN, PROBE_DTYPE_F16, &b));
  int64_t step;
  int32_t layer;
  probe_site site;
  int all = -1;
  float ok[4] = {1, 2, 3, 4}, bad[4] = {1, NAN, 3, 4}, inf[4] = {INFINITY, 0, 0, 0};
  for (int64_t k = 0; k < 3; k++) {
    PT_CHECK(probe_step_begin(s, k));
    PT_CHECK(probe_tensor_record(s, a, PROBE_SITE_FWD_OUT, PROBE_DTYPE_F32, ok, 4));
    PT_CHECK(probe_tensor_record(s, b, PROBE_SITE_FWD_SAVED, PROBE_DTYPE_F32,
                                 k == 1 ? inf : ok, 4));
    PT_CHECK(probe_tensor_record(s, a, PROBE_SITE_GRAD_IN, PROBE_DTYPE_F32,
                                 k >= 1 ? bad : ok, 4));
    PT_CHECK(probe_session_first_nonfinite(s, &step, &layer, &site, &all));
    ck_assert_int_eq(step, k <= 1 ? -1 : 1); /* steps in progress do not count */
    PT_CHECK(probe_step_end(s));
  }
  PT_CHECK(probe_session_first_nonfinite(s, &step, &layer, &site, &all));
  ck_assert_int_eq(step, 1);
  ck_assert_int_eq(layer, b);
  ck_assert_int_eq(site, PROBE_SITE_FWD_SAVED);
  ck_assert_int_eq(all, 1); /* defaults: flight recorder, every layer */
  PT_CHECK(probe_session_close(s));

  o.layer_select = "a";
  o.overwrite = 1; /* the same path again */
  PT_CHECK(probe_session_open(&s, path, &o));
  PT_CHECK(probe_session_first_nonfinite(s, &step, &layer, &site, &all));
  ck_assert_int_eq(all, 0);
  ck_assert_int_eq(step, -1);
  ck_assert_int_eq(layer, -1);
  PT_CHECK(probe_session_close(s));
  o.layer_select = NULL;
  o.mode = PROBE_MODE_FULL;
  o.step_every = 2;
  PT_CHECK(probe_session_open(&s, path, &o));
  PT_CHECK(probe_session_first_nonfinite(s, &step, &layer, &site, &all));
  ck_assert_int_eq(all, 0);
  PT_CHECK(probe_session_close(s));
  ck_assert_int_eq(probe_session_first_nonfinite(NULL, &step, &layer, &site, NULL),
                   PROBE_ERR_INVALID_ARG);
  unlink(path);
}
END_TEST

/* probe_session_step_nonfinite: the step ended last, its first non-finite
 * record and its first at a forward site, with their counts as recorded
 * (the caller's later in-place change is not seen), and measured 0 when a
 * record was left out. */
/* A full-mode session at pt_path(tag) with two FP16 layers. */
static probe_session *open_full_two(const char *tag, char *path, size_t n,
                                    const char *na, probe_kind ka, int32_t *a,
                                    const char *nb, probe_kind kb, int32_t *b) {
  pt_path(path, n, tag);
  probe_options o;
  probe_options_init(&o);
  o.mode = PROBE_MODE_FULL;
  probe_session *s;
  PT_CHECK(probe_session_open(&s, path, &o));
  PT_CHECK(probe_layer_register(s, na, ka, PROBE_DTYPE_F16, a));
  PT_CHECK(probe_layer_register(s, nb, kb, PROBE_DTYPE_F16, b));
  return s;
}

/* Masked logits - a softmax's or a loss's input holding -inf and nothing
 * else non-finite (masked_fill(mask, -inf) before nn.Softmax or the
 * cross-entropy) - are no event:
 * not for the predicate, the writer (first non-finite step, the step's
 * records) nor the post-mortem, which called such a healthy job degraded;
 * +inf or NaN there, -inf anywhere else, and a fully masked row's NaN
 * output are events. */
START_TEST(test_masked_logits_are_no_event) {
  probe_stats st;
  float neg[4] = {-INFINITY, 1, 2, -INFINITY}, pos[4] = {INFINITY, 1, 2, 3},
        nan[4] = {NAN, 1, 2, -INFINITY}, fin[4] = {1, 2, 3, 4};
  static const struct {
    probe_kind kind;
    probe_site site;
    int which; /* 0 neg, 1 pos, 2 nan, 3 finite */
    int want;
  } cases[] = {
      {PROBE_KIND_SOFTMAX, PROBE_SITE_FWD_IN, 0, 0},
      {PROBE_KIND_SOFTMAX, PROBE_SITE_FWD_IN, 1, 1},
      {PROBE_KIND_SOFTMAX, PROBE_SITE_FWD_IN, 2, 1},
      {PROBE_KIND_SOFTMAX, PROBE_SITE_FWD_IN, 3, 0},
      {PROBE_KIND_SOFTMAX, PROBE_SITE_FWD_OUT, 0, 1},
      {PROBE_KIND_SOFTMAX, PROBE_SITE_GRAD_IN, 0, 1},
      {PROBE_KIND_LINEAR, PROBE_SITE_FWD_IN, 0, 1},
      {PROBE_KIND_ATTENTION, PROBE_SITE_FWD_IN, 0, 1},
      {PROBE_KIND_LOSS, PROBE_SITE_FWD_IN, 0, 0},
      {PROBE_KIND_LOSS, PROBE_SITE_FWD_IN, 2, 1},
      {PROBE_KIND_LOSS, PROBE_SITE_FWD_OUT, 0, 1},
  };
  const float *data[4] = {neg, pos, nan, fin};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    PT_CHECK(probe_stats_compute(&st, PROBE_DTYPE_F32, data[cases[i].which], 4));
    ck_assert_msg(probe_record_nonfinite(cases[i].kind, cases[i].site, &st) ==
                      cases[i].want, "case %zu", i);
  }
  ck_assert_int_eq(probe_record_nonfinite(PROBE_KIND_LINEAR, PROBE_SITE_FWD_IN, NULL), 0);

  /* a run: steps 0-2 masked logits only, step 3 a fully masked row (the
   * softmax's output NaN), step 4 masked logits again */
  char path[256];
  int32_t lin, sm;
  probe_session *s = open_full_two("masked", path, sizeof path, "fc",
                                   PROBE_KIND_LINEAR, &lin, "sm",
                                   PROBE_KIND_SOFTMAX, &sm);
  float row[4] = {NAN, NAN, NAN, NAN};
  for (int64_t k = 0; k < 5; k++) {
    PT_CHECK(probe_step_begin(s, k));
    PT_CHECK(probe_tensor_record(s, lin, PROBE_SITE_FWD_OUT, PROBE_DTYPE_F32, fin, 4));
    PT_CHECK(probe_tensor_record(s, sm, PROBE_SITE_FWD_IN, PROBE_DTYPE_F32, neg, 4));
    PT_CHECK(probe_tensor_record(s, sm, PROBE_SITE_FWD_OUT, PROBE_DTYPE_F32,
                                 k == 3 ? row : fin, 4));
    probe_step_scalars sc = {.loss = k == 3 ? NAN : 0.5, .loss_scale = 1,
                             .unmeasured = PROBE_SCALAR_GRAD_NORM |
                                           PROBE_SCALAR_CLIP};
    PT_CHECK(probe_step_set_scalars(s, &sc));
    PT_CHECK(probe_step_end(s));
    int64_t step, first;
    probe_nonfinite_record any, fwd;
    int measured;
    PT_CHECK(probe_session_step_nonfinite(s, &step, &any, &fwd, &measured));
    ck_assert_int_eq(any.layer, k == 3 ? sm : -1);
    if (k == 3) ck_assert_int_eq(any.site, PROBE_SITE_FWD_OUT);
    int32_t fl;
    probe_site fs;
    int all;
    PT_CHECK(probe_session_first_nonfinite(s, &first, &fl, &fs, &all));
    ck_assert_int_eq(first, k < 3 ? -1 : 3);
  }
  PT_CHECK(probe_session_close(s));
  probe_trace *t;
  PT_CHECK(probe_trace_open(&t, path));
  probe_diag d;
  PT_CHECK(probe_diag_run(&d, t, path, NULL));
  ck_assert_int_eq(d.event_step, 3);
  ck_assert_int_eq(d.origin_layer, sm);
  ck_assert_int_eq(d.origin_site, PROBE_SITE_FWD_OUT);
  probe_diag_free(&d);
  probe_trace_close(t);
}
END_TEST

START_TEST(test_session_step_nonfinite) {
  char path[256];
  int32_t a, b;
  probe_session *s = open_full_two("stepnf", path, sizeof path, "a",
                                   PROBE_KIND_LINEAR, &a, "b", PROBE_KIND_BN, &b);
  probe_options o;
  probe_options_init(&o);
  o.mode = PROBE_MODE_FULL;
  int64_t step;
  probe_nonfinite_record any, fwd;
  int measured = -1;
  PT_CHECK(probe_session_step_nonfinite(s, &step, &any, &fwd, &measured));
  ck_assert_int_eq(step, -1);
  ck_assert_int_eq(any.layer, -1);
  ck_assert_int_eq(fwd.layer, -1);
  ck_assert_int_eq(measured, 0);
  float ok[4] = {1, 2, 3, 4};
  /* step 0: all finite; step 1: a gradient first, then b's output;
   * step 2: a's gradient only; step 3: b's weight, changed after. */
  for (int64_t k = 0; k < 4; k++) {
    float g[4] = {1, NAN, -INFINITY, 4}, h[4] = {INFINITY, INFINITY, 0, 0};
    PT_CHECK(probe_step_begin(s, k));
    PT_CHECK(probe_tensor_record(s, a, PROBE_SITE_GRAD_IN, PROBE_DTYPE_F32,
                                 k == 1 || k == 2 ? g : ok, 4));
    PT_CHECK(probe_tensor_record(s, b, k == 3 ? PROBE_SITE_WEIGHT
                                              : PROBE_SITE_FWD_OUT,
                                 PROBE_DTYPE_F32, k == 1 || k == 3 ? h : ok, 4));
    h[0] = h[1] = 0; /* the caller's own in-place op, after the record */
    PT_CHECK(probe_session_step_nonfinite(s, &step, &any, &fwd, &measured));
    ck_assert_int_eq(step, k - 1); /* the step in progress is not it */
    PT_CHECK(probe_step_end(s));
    PT_CHECK(probe_session_step_nonfinite(s, &step, &any, &fwd, &measured));
    ck_assert_int_eq(step, k);
    ck_assert_int_eq(measured, 1);
    switch (k) {
    case 0:
      ck_assert_int_eq(any.layer, -1);
      ck_assert_int_eq(fwd.layer, -1);
      break;
    case 2: /* nothing left of step 1's forward record */
      ck_assert_int_eq(any.layer, a);
      ck_assert_int_eq(fwd.layer, -1);
      ck_assert_int_eq(fwd.site, PROBE_SITE_FWD_IN);
      ck_assert_uint_eq(fwd.count + fwd.posinf_count, 0);
      break;
    case 1:
      ck_assert_int_eq(any.layer, a);
      ck_assert_int_eq(any.site, PROBE_SITE_GRAD_IN);
      ck_assert_uint_eq(any.count, 4);
      ck_assert_uint_eq(any.nan_count, 1);
      ck_assert_uint_eq(any.posinf_count, 0);
      ck_assert_uint_eq(any.neginf_count, 1);
      ck_assert_int_eq(fwd.layer, b);
      ck_assert_int_eq(fwd.site, PROBE_SITE_FWD_OUT);
      ck_assert_uint_eq(fwd.posinf_count, 2); /* as recorded */
      break;
    default:
      ck_assert_int_eq(any.layer, b);
      ck_assert_int_eq(any.site, PROBE_SITE_WEIGHT);
      ck_assert_int_eq(fwd.layer, b); /* a weight is a forward site */
      ck_assert_uint_eq(fwd.posinf_count, 2);
    }
  }
  PT_CHECK(probe_session_close(s));

  /* Left out: a layer outside layer_select, then a step outside the
   * window; a step given no record at all is measured. */
  o.layer_select = "a";
  o.overwrite = 1;
  o.step_every = 2;
  PT_CHECK(probe_session_open(&s, path, &o));
  PT_CHECK(probe_layer_register(s, "a", PROBE_KIND_LINEAR, PROBE_DTYPE_F16, &a));
  PT_CHECK(probe_layer_register(s, "b", PROBE_KIND_BN, PROBE_DTYPE_F16, &b));
  for (int64_t k = 0; k < 3; k++) {
    PT_CHECK(probe_step_begin(s, k));
    PT_CHECK(probe_tensor_record(s, a, PROBE_SITE_FWD_OUT, PROBE_DTYPE_F32, ok, 4));
    if (k == 0)
      PT_CHECK(probe_tensor_record(s, b, PROBE_SITE_FWD_OUT, PROBE_DTYPE_F32, ok, 4));
    PT_CHECK(probe_step_end(s));
    PT_CHECK(probe_session_step_nonfinite(s, &step, &any, &fwd, &measured));
    ck_assert_int_eq(step, k);
    ck_assert_int_eq(measured, k == 2); /* 0: b left out; 1: off-window */
  }
  PT_CHECK(probe_step_begin(s, 3)); /* off-window, but nothing given */
  PT_CHECK(probe_step_end(s));
  PT_CHECK(probe_session_step_nonfinite(s, &step, &any, &fwd, NULL));
  ck_assert_int_eq(step, 3);
  PT_CHECK(probe_session_step_nonfinite(s, &step, &any, &fwd, &measured));
  ck_assert_int_eq(measured, 1);
  PT_CHECK(probe_session_close(s));
  ck_assert_int_eq(probe_session_step_nonfinite(NULL, &step, &any, &fwd, NULL),
                   PROBE_ERR_INVALID_ARG);
  unlink(path);
}
END_TEST

/* The flight recorder: steps 0..19, layers a, b, c; at step 10 layer b's
 * output holds a NaN. With ring_steps 3 the trace holds the records of
 * steps 7..13 only, and a snapshot of b's tensors of step 10. */
START_TEST(test_writer_flight_recorder) {
  char path[256];
  pt_path(path, sizeof path, "ring");
  probe_options o;
  probe_options_init(&o);
  o.ring_steps = 3;
  o.snapshot_max_elems = 50;
  probe_session *s;
  PT_CHECK(probe_session_open(&s, path, &o));
  static const char *const names[3] = {"a", "b", "c"};
  for (int l = 0; l < 3; l++)
    PT_CHECK(probe_layer_register(s, names[l], PROBE_KIND_LINEAR,
                                  PROBE_DTYPE_F16, NULL));
  enum { N = 64 };
  float in[3][N], out[3][N];
  uint16_t w16[3][N]; /* valid until probe_step_end, per the contract */
  float w_at10[N], out_at10[N], in_at10[N];
  for (int step = 0; step < 20; step++) {
    PT_CHECK(probe_step_begin(s, step));
    for (int l = 0; l < 3; l++) {
      pt_tensor(in[l], N, step, (uint32_t)(10 * l));
      pt_tensor(out[l], N, step, (uint32_t)(10 * l + 1));
      if (step == 10 && l == 1) out[l][5] = NAN;
      for (int i = 0; i < N; i++)
        w16[l][i] = probe_f32_to_f16(ldexpf(in[l][i], -6)); /* finite */
      PT_CHECK(probe_tensor_record(s, l, PROBE_SITE_FWD_IN, PROBE_DTYPE_F32,
                                   in[l], N));
      PT_CHECK(probe_tensor_record(s, l, PROBE_SITE_WEIGHT, PROBE_DTYPE_F16,
                                   w16[l], N));
      PT_CHECK(probe_tensor_record(s, l, PROBE_SITE_FWD_OUT, PROBE_DTYPE_F32,
                                   out[l], N));
      if (step == 10 && l == 1) {
        memcpy(in_at10, in[l], sizeof in_at10);
        memcpy(out_at10, out[l], sizeof out_at10);
        for (int i = 0; i < N; i++) w_at10[i] = probe_f16_to_f32(w16[l][i]);
      }
    }
    probe_step_scalars sc = {.loss = 0.5, .loss_scale = 1.0};
    PT_CHECK(probe_step_set_scalars(s, &sc));
    PT_CHECK(probe_step_end(s));
  }
  PT_CHECK(probe_session_close(s));

  probe_trace *t;
  PT_CHECK(probe_trace_open(&t, path));
  const probe_trace_info *info = probe_trace_get_info(t);
  ck_assert_int_eq(info->record_mode, PROBE_MODE_SCALARS);
  ck_assert_int_eq(info->first_nonfinite_step, 10);
  ck_assert_int_eq(info->n_events, 1);
  ck_assert_int_eq(info->n_steps, 20);
  ck_assert_int_eq(info->n_records, 7 * 9);
  probe_record r[7 * 9];
  size_t got;
  PT_CHECK(probe_trace_read_records(t, 0, 7 * 9, r, &got));
  ck_assert_uint_eq(got, 7 * 9);
  for (size_t i = 0; i < got; i++) {
    ck_assert_int_eq(r[i].step, 7 + (int64_t)(i / 9));
    ck_assert_uint_eq(r[i].seq, i % 9);
    int bad = r[i].step == 10 && r[i].layer == 1 &&
              r[i].site == PROBE_SITE_FWD_OUT;
    ck_assert_uint_eq(r[i].stats.nan_count, bad ? 1 : 0);
  }
  /* Snapshot: layer b's three tensors of step 10, capped at 50 values. */
  ck_assert_int_eq(info->n_snapshots, 3);
  probe_snapshot_info sn[3];
  PT_CHECK(probe_trace_read_snapshots(t, 0, 3, sn, &got));
  ck_assert_uint_eq(got, 3);
  const float *want[3] = {in_at10, w_at10, out_at10};
  static const int sites[3] = {PROBE_SITE_FWD_IN, PROBE_SITE_WEIGHT,
                               PROBE_SITE_FWD_OUT};
  for (int k = 0; k < 3; k++) {
    ck_assert_int_eq(sn[k].step, 10);
    ck_assert_int_eq(sn[k].layer, 1);
    ck_assert_int_eq(sn[k].site, sites[k]);
    ck_assert_uint_eq(sn[k].seq, 3 + (uint32_t)k);
    ck_assert_int_eq(sn[k].dtype, k == 1 ? PROBE_DTYPE_F16 : PROBE_DTYPE_F32);
    ck_assert_int_eq(sn[k].n, 50);
    ck_assert_int_eq(sn[k].n_total, N);
    ck_assert_int_eq(sn[k].offset, 50 * k);
    float v[50];
    PT_CHECK(probe_trace_read_snapshot_data(t, &sn[k], v));
    for (int i = 0; i < 50; i++) {
      if (k == 2 && i == 5) ck_assert_float_nan(v[i]);
      else ck_assert_int_eq(memcmp(&v[i], &want[k][i], 4), 0);
    }
  }
  probe_trace_close(t);
  unlink(path);
}
END_TEST

/* A non-finite loss alone is an event; max_events bounds the dumps. */
START_TEST(test_writer_max_events) {
  char path[256];
  pt_path(path, sizeof path, "maxev");
  probe_options o;
  probe_options_init(&o);
  o.ring_steps = 2;
  o.max_events = 1;
  probe_session *s;
  int32_t id;
  PT_CHECK(probe_session_open(&s, path, &o));
  PT_CHECK(probe_layer_register(s, "a", PROBE_KIND_LINEAR, PROBE_DTYPE_F16,
                                &id));
  float x[8];
  for (int step = 0; step < 30; step++) {
    PT_CHECK(probe_step_begin(s, step));
    pt_tensor(x, 8, step, 0);
    PT_CHECK(probe_tensor_record(s, id, PROBE_SITE_FWD_OUT, PROBE_DTYPE_F32, x,
                                 8));
    probe_step_scalars sc = {
        .loss = (step == 5 || step == 20) ? INFINITY : 1.0, .loss_scale = 1};
    PT_CHECK(probe_step_set_scalars(s, &sc));
    PT_CHECK(probe_step_end(s));
  }
  PT_CHECK(probe_session_close(s));
  probe_trace *t;
  PT_CHECK(probe_trace_open(&t, path));
  const probe_trace_info *info = probe_trace_get_info(t);
  ck_assert_int_eq(info->n_events, 2);
  ck_assert_int_eq(info->first_nonfinite_step, 5);
  ck_assert_int_eq(info->n_records, 5); /* steps 3..7, none after step 20 */
  ck_assert_int_eq(info->n_snapshots, 0); /* no non-finite tensor */
  probe_record r[5];
  size_t got;
  PT_CHECK(probe_trace_read_records(t, 0, 5, r, &got));
  for (int i = 0; i < 5; i++) ck_assert_int_eq(r[i].step, 3 + i);
  probe_trace_close(t);
  unlink(path);
}
END_TEST

/* A run of non-finite steps is one event every ring_steps + 1 steps, and
 * (flight recorder) every step of the run is written. */
START_TEST(test_writer_event_spacing) {
  char path[256];
  pt_path(path, sizeof path, "spacing");
  probe_options o;
  probe_options_init(&o);
  o.ring_steps = 2;
  probe_session *s;
  int32_t id;
  PT_CHECK(probe_session_open(&s, path, &o));
  PT_CHECK(probe_layer_register(s, "a", PROBE_KIND_LINEAR, PROBE_DTYPE_F16,
                                &id));
  float x[4] = {1, NAN, 2, 3};
  for (int step = 0; step < 10; step++) {
    PT_CHECK(probe_step_begin(s, step));
    PT_CHECK(probe_tensor_record(s, id, PROBE_SITE_GRAD_IN, PROBE_DTYPE_F32, x,
                                 4));
    PT_CHECK(probe_step_end(s));
  }
  PT_CHECK(probe_session_close(s));
  probe_trace *t;
  PT_CHECK(probe_trace_open(&t, path));
  const probe_trace_info *info = probe_trace_get_info(t);
  ck_assert_int_eq(info->n_events, 4); /* steps 0, 3, 6, 9 */
  ck_assert_int_eq(info->n_records, 10);
  ck_assert_int_eq(info->n_snapshots, 4);
  ck_assert_int_eq(info->n_steps, 0); /* no scalars were set */
  probe_trace_close(t);
  unlink(path);
}
END_TEST

/* Rows a separate reader process sees: only what has been flushed. The
 * reader is this executable started afresh (`--count-steps PATH`), since a
 * forked child would share this process's open HDF5 file. */
static int count_steps_main(const char *path) {
  probe_trace *t;
  if (probe_trace_open(&t, path) != PROBE_OK) return 255;
  int64_t n = probe_trace_get_info(t)->n_steps;
  probe_trace_close(t);
  return n > 200 ? 254 : (int)n;
}

static int64_t child_count_steps(const char *path) {
  pid_t pid = fork();
  if (pid == 0) {
    execl("/proc/self/exe", "test_probe", "--count-steps", path, (char *)NULL);
    _exit(253);
  }
  int st;
  waitpid(pid, &st, 0);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* Polls child_count_steps every interval_ms, at most tries times, until it
 * sees want steps; returns the last count. */
static int64_t wait_for_steps(const char *path, int64_t want, int tries, long interval_ms) {
  int64_t seen = 0;
  for (int k = 0; k < tries && seen < want; k++) {
    struct timespec ts = {0, interval_ms * 1000000L};
    nanosleep(&ts, NULL);
    seen = child_count_steps(path);
  }
  return seen;
}

START_TEST(test_writer_flush_visibility) {
  char path[256];
  pt_path(path, sizeof path, "flush");
  probe_options o;
  probe_options_init(&o);
  o.flush_steps = 1;
  o.flush_seconds = 1e9;
  probe_session *s;
  PT_CHECK(probe_session_open(&s, path, &o));
  /* The writer thread creates the file after the open has returned; a flush
   * waits for that. Then a reader opens it, before any step. */
  PT_CHECK(probe_session_flush(s));
  ck_assert_int_eq(child_count_steps(path), 0);
  probe_step_scalars sc = {.loss = 1.0, .loss_scale = 1.0};
  for (int step = 0; step < 5; step++) {
    PT_CHECK(probe_step_begin(s, step));
    PT_CHECK(probe_step_set_scalars(s, &sc));
    PT_CHECK(probe_step_end(s));
    ck_assert_int_eq(child_count_steps(path), step + 1);
  }
  probe_session_close(s);

  /* Same again without periodic flushes: nothing new until the flush. */
  o.flush_steps = 0;
  o.overwrite = 1;
  PT_CHECK(probe_session_open(&s, path, &o));
  /* As above: the writer thread replaces the file after the open has
   * returned, so a reader that came before it saw the old file or none
   * (under load: 255, the child's failure to open it). The flush waits. */
  PT_CHECK(probe_session_flush(s));
  ck_assert_int_eq(child_count_steps(path), 0);
  for (int step = 0; step < 5; step++) {
    PT_CHECK(probe_step_begin(s, step));
    PT_CHECK(probe_step_set_scalars(s, &sc));
    PT_CHECK(probe_step_end(s));
  }
  ck_assert_int_eq(child_count_steps(path), 0);
  PT_CHECK(probe_session_flush(s));
  ck_assert_int_eq(child_count_steps(path), 5);
  PT_CHECK(probe_session_close(s));
  unlink(path);
}
END_TEST

/* Holds libprobe's process-wide HDF5 lock for 300 ms, so that the writer
 * thread cannot finish a flush meanwhile. */
void probe__h5_lock(void);
void probe__h5_unlock(void);
static atomic_int h5_held;
static void *hold_h5_lock(void *arg) {
  (void)arg;
  probe__h5_lock();
  atomic_store(&h5_held, 1);
  struct timespec ts = {0, 300 * 1000000L};
  nanosleep(&ts, NULL);
  probe__h5_unlock();
  return NULL;
}

static double mono_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The hand-over queue (session.h, pqueue): each step's rows go to the
 * writer as the caller's buffer itself. With the writer held back (the
 * HDF5 lock taken, flushes by time off) 100 steps queue up, past the 32
 * buffers the queue holds (the rest are copied behind the last one); then
 * the writer runs with batches of 64 rows, taking queues of any length,
 * while 200 more steps come. Every row comes back once and in order:
 * records (of tensors whose length also changes each step), steps and
 * scaler events; and nothing leaks (the spares: ASan build). */
START_TEST(test_writer_handover_queue) {
  enum { HQ_HELD = 100, HQ_STEPS = 300, HQ_PER = 3, HQ_MAXN = 97 };
  char path[256];
  pt_path(path, sizeof path, "hq");
  probe_options o;
  probe_options_init(&o);
  o.mode = PROBE_MODE_FULL;
  o.flush_seconds = 1e9;
  o.batch_rows = 64;
  probe_session *s;
  probe__h5_lock(); /* the writer cannot even create the file */
  PT_CHECK(probe_session_open(&s, path, &o));
  int32_t id;
  PT_CHECK(probe_layer_register(s, "l", PROBE_KIND_LINEAR, PROBE_DTYPE_F32, &id));
  float x[HQ_MAXN];
  for (int64_t step = 0; step < HQ_STEPS; step++) {
    if (step == HQ_HELD) probe__h5_unlock();
    PT_CHECK(probe_step_begin(s, step));
    for (uint32_t k = 0; k < HQ_PER; k++) {
      size_t n = 1 + (size_t)(step * HQ_PER + k) % HQ_MAXN;
      pt_tensor(x, n, step, k);
      PT_CHECK(probe_tensor_record(s, id, PROBE_SITE_FWD_OUT, PROBE_DTYPE_F32, x, n));
    }
    probe_step_scalars sc = {.loss = (double)step};
    PT_CHECK(probe_step_set_scalars(s, &sc));
    if (step % 7 == 0) {
      probe_scaler_event ev = {.kind = PROBE_SCALER_GROWTH, .old_scale = (double)step,
                               .new_scale = 2.0 * (double)step};
      PT_CHECK(probe_scaler_transition(s, &ev));
    }
    PT_CHECK(probe_step_end(s));
  }
  PT_CHECK(probe_session_close(s));

  probe_trace *t;
  PT_CHECK(probe_trace_open(&t, path));
  const probe_trace_info *in = probe_trace_get_info(t);
  ck_assert_int_eq(in->complete, 1);
  ck_assert_int_eq(in->n_records, HQ_STEPS * HQ_PER);
  ck_assert_int_eq(in->n_steps, HQ_STEPS);
  ck_assert_int_eq(in->n_scaler_events, (HQ_STEPS + 6) / 7);
  probe_record r[HQ_PER];
  size_t got;
  for (int64_t step = 0; step < HQ_STEPS; step++) {
    PT_CHECK(probe_trace_read_records(t, step * HQ_PER, HQ_PER, r, &got));
    ck_assert_uint_eq(got, HQ_PER);
    for (uint32_t k = 0; k < HQ_PER; k++) {
      size_t n = 1 + (size_t)(step * HQ_PER + k) % HQ_MAXN;
      ck_assert_int_eq(r[k].step, step);
      ck_assert_uint_eq(r[k].seq, k);
      probe_stats want;
      pt_expected(&want, n, step, k);
      ck_assert_int_eq(memcmp(&want, &r[k].stats, sizeof want), 0);
    }
  }
  probe_step_scalars sc[HQ_STEPS];
  PT_CHECK(probe_trace_read_steps(t, 0, HQ_STEPS, sc, &got));
  ck_assert_uint_eq(got, HQ_STEPS);
  for (int i = 0; i < HQ_STEPS; i++) {
    ck_assert_int_eq(sc[i].step, i);
    ck_assert_double_eq(sc[i].loss, (double)i);
  }
  probe_scaler_event ev[(HQ_STEPS + 6) / 7];
  PT_CHECK(probe_trace_read_scaler_events(t, 0, (HQ_STEPS + 6) / 7, ev, &got));
  ck_assert_uint_eq(got, (HQ_STEPS + 6) / 7);
  for (size_t i = 0; i < got; i++) ck_assert_int_eq(ev[i].step, 7 * (int64_t)i);
  probe_trace_close(t);
  unlink(path);
}
END_TEST

/* Flushes at events (flush_seconds and flush_steps off): a non-finite
 * forward value is durable when probe_step_end returns (it waits for the
 * flush: with the HDF5 lock held for 300 ms it takes that long); a
 * non-finite gradient alone (the loss scaler's routine overflow) is flushed
 * at once but not waited for (probe_step_end returns while the lock is
 * held), and becomes visible shortly after with no further call into the
 * session. */
START_TEST(test_writer_event_flush) {
  char path[256];
  pt_path(path, sizeof path, "evflush");
  probe_options o;
  probe_options_init(&o);
  o.mode = PROBE_MODE_FULL;
  o.flush_seconds = 1e9;
  o.overwrite = 1; /* one path, two sessions */
  probe_step_scalars sc = {.loss = 1.0, .loss_scale = 1.0};
  float x[64];
  for (int kind = 0; kind < 2; kind++) {
    probe_session *s;
    PT_CHECK(probe_session_open(&s, path, &o));
    int32_t id;
    PT_CHECK(probe_layer_register(s, "l", PROBE_KIND_LINEAR, PROBE_DTYPE_F16, &id));
    for (int step = 0; step < 3; step++) { /* clean steps: not flushed */
      PT_CHECK(probe_step_begin(s, step));
      pt_tensor(x, 64, step, 0);
      PT_CHECK(probe_tensor_record(s, id, PROBE_SITE_FWD_OUT, PROBE_DTYPE_F32, x, 64));
      PT_CHECK(probe_tensor_record(s, id, PROBE_SITE_WEIGHT_GRAD, PROBE_DTYPE_F32, x, 64));
      PT_CHECK(probe_step_set_scalars(s, &sc));
      PT_CHECK(probe_step_end(s));
    }
    PT_CHECK(probe_step_begin(s, 3));
    pt_tensor(x, 64, 3, 0);
    x[7] = kind == 0 ? NAN : INFINITY;
    PT_CHECK(probe_tensor_record(s, id, kind == 0 ? PROBE_SITE_FWD_OUT : PROBE_SITE_WEIGHT_GRAD,
                                 PROBE_DTYPE_F32, x, 64));
    PT_CHECK(probe_step_set_scalars(s, &sc));
    PT_CHECK(probe_session_flush(s)); /* the clean steps: the file exists */
    ck_assert_int_eq(child_count_steps(path), 3);
    pthread_t holder;
    atomic_store(&h5_held, 0);
    ck_assert_int_eq(pthread_create(&holder, NULL, hold_h5_lock, NULL), 0);
    while (!atomic_load(&h5_held)) sched_yield();
    double t0 = mono_s();
    PT_CHECK(probe_step_end(s));
    double took = mono_s() - t0;
    pthread_join(holder, NULL);
    if (kind == 0) {
      ck_assert_msg(took >= 0.25, "a forward event returned after %.3f s", took);
      ck_assert_int_eq(child_count_steps(path), 4); /* synchronous */
    } else {
      ck_assert_msg(took < 0.2, "a gradient-only event waited %.3f s", took);
      ck_assert_int_eq(wait_for_steps(path, 4, 50, 50), 4);
    }
    PT_CHECK(probe_session_close(s));
  }
  unlink(path);
}
END_TEST

/* The writer thread flushes on its own timer: rows become visible
 * flush_seconds after they were handed over even when the caller makes no
 * further call (it may be busy in a long step, or stopped). */
START_TEST(test_writer_idle_timer_flush) {
  char path[256];
  pt_path(path, sizeof path, "idle");
  probe_options o;
  probe_options_init(&o);
  o.mode = PROBE_MODE_FULL;
  o.flush_seconds = 0.2;
  probe_session *s;
  PT_CHECK(probe_session_open(&s, path, &o));
  int32_t id;
  PT_CHECK(probe_layer_register(s, "l", PROBE_KIND_OTHER, PROBE_DTYPE_F16, &id));
  float x[64];
  probe_step_scalars sc = {.loss = 1.0, .loss_scale = 1.0};
  for (int step = 0; step < 5; step++) {
    PT_CHECK(probe_step_begin(s, step));
    pt_tensor(x, 64, step, 0);
    PT_CHECK(probe_tensor_record(s, id, PROBE_SITE_FWD_OUT, PROBE_DTYPE_F32, x,
                                 64));
    PT_CHECK(probe_step_set_scalars(s, &sc));
    PT_CHECK(probe_step_end(s));
  }
  /* no call into the session from here on */
  ck_assert_int_eq(wait_for_steps(path, 5, 30, 100), 5);
  PT_CHECK(probe_session_close(s));
  unlink(path);
}
END_TEST

/* Sessions on several threads at once, and a reader on another: libprobe
 * serialises every HDF5 call (the serial build) and each trace comes out
 * whole. */
typedef struct thread_job {
  char path[256];
  int64_t steps;
  probe_status st;
} thread_job;

static void *thread_writer(void *arg) {
  thread_job *j = arg;
  probe_options o;
  probe_options_init(&o);
  o.mode = PROBE_MODE_FULL;
  o.flush_seconds = 0.0005; /* flushes while the others write */
  o.batch_rows = 7;
  probe_session *s;
  if ((j->st = probe_session_open(&s, j->path, &o)) != PROBE_OK) return NULL;
  int32_t id[4];
  static const char *const names[4] = {"a", "b.c", "b.d", "e"};
  for (int l = 0; l < 4; l++)
    if ((j->st = probe_layer_register(s, names[l], PROBE_KIND_OTHER,
                                      PROBE_DTYPE_F16, &id[l])) != PROBE_OK)
      return NULL;
  float x[4][96];
  for (int64_t step = 0; step < j->steps && j->st == PROBE_OK; step++) {
    j->st = probe_step_begin(s, step);
    for (uint32_t q = 0; q < 4 && j->st == PROBE_OK; q++) {
      pt_tensor(x[q], 96, step, q);
      j->st = probe_tensor_record(s, id[q], PROBE_SITE_GRAD_IN, PROBE_DTYPE_F32,
                                  x[q], 96);
    }
    probe_step_scalars sc = {.loss = (double)step, .loss_scale = 2.0};
    if (j->st == PROBE_OK) j->st = probe_step_set_scalars(s, &sc);
    if (j->st == PROBE_OK) j->st = probe_step_end(s);
  }
  probe_status cst = probe_session_close(s);
  if (j->st == PROBE_OK) j->st = cst;
  return NULL;
}

static void check_thread_trace(const thread_job *j) {
  probe_trace *t;
  PT_CHECK(probe_trace_open(&t, j->path));
  const probe_trace_info *in = probe_trace_get_info(t);
  ck_assert_int_eq(in->complete, 1);
  ck_assert_int_eq(in->n_steps, j->steps);
  ck_assert_int_eq(in->n_records, j->steps * 4);
  probe_record r[50];
  size_t got;
  int64_t row = 0;
  do {
    PT_CHECK(probe_trace_read_records(t, row, 50, r, &got));
    for (size_t i = 0; i < got; i++, row++) {
      probe_stats want;
      pt_expected(&want, 96, row / 4, (uint32_t)(row % 4));
      ck_assert_int_eq(r[i].step, row / 4);
      ck_assert_msg(memcmp(&want, &r[i].stats, sizeof want) == 0,
                    "%s: record %lld differs", j->path, (long long)row);
    }
  } while (got > 0);
  ck_assert_int_eq(row, j->steps * 4);
  probe_trace_close(t);
}

static atomic_int writers_left;

static void *thread_writer_counted(void *arg) {
  thread_writer(arg);
  atomic_fetch_sub(&writers_left, 1);
  return NULL;
}

START_TEST(test_writer_threads) {
  enum { NT = 4 };
  thread_job jobs[NT];
  pthread_t th[NT];
  for (int k = 0; k < NT; k++) {
    char tag[16];
    snprintf(tag, sizeof tag, "thr%d", k);
    pt_path(jobs[k].path, sizeof jobs[k].path, tag);
    jobs[k].steps = 1500 + 100 * k;
    jobs[k].st = PROBE_OK;
  }
  /* one finished trace for the reader to read while the others write */
  thread_writer(&jobs[0]);
  PT_CHECK(jobs[0].st);
  atomic_store(&writers_left, NT - 1);
  for (int k = 1; k < NT; k++)
    ck_assert_int_eq(
        pthread_create(&th[k], NULL, thread_writer_counted, &jobs[k]), 0);
  int reads = 0;
  while (atomic_load(&writers_left) > 0 || reads < 2) {
    check_thread_trace(&jobs[0]);
    reads++;
  }
  for (int k = 1; k < NT; k++) {
    pthread_join(th[k], NULL);
    ck_assert_msg(jobs[k].st == PROBE_OK, "thread %d: %s", k,
                  probe_status_name(jobs[k].st));
  }
  for (int k = 0; k < NT; k++) {
    check_thread_trace(&jobs[k]);
    unlink(jobs[k].path);
  }
}
END_TEST

static Suite *make_writer_suite(void) {
  Suite *s = suite_create("writer");
  TCase *tc = tcase_create("writer");
  tcase_set_timeout(tc, 30);
  tcase_add_test(tc, test_writer_roundtrip);
  tcase_add_test(tc, test_writer_dtypes);
  tcase_add_test(tc, test_writer_layer_select);
  tcase_add_test(tc, test_writer_step_window);
  tcase_add_test(tc, test_writer_flight_recorder);
  tcase_add_test(tc, test_session_first_nonfinite);
  tcase_add_test(tc, test_session_step_nonfinite);
  tcase_add_test(tc, test_masked_logits_are_no_event);
  tcase_add_test(tc, test_writer_max_events);
  tcase_add_test(tc, test_writer_event_spacing);
  tcase_add_test(tc, test_writer_threads);
  tcase_add_test(tc, test_writer_handover_queue);
  suite_add_tcase(s, tc);
  /* Checks with deadlines (rows visible within a bounded wait, a flush
   * that must outlast a 300 ms lock): a case of their own, which CTest runs
   * alone (test_probe.timing, label timing, RUN_SERIAL). */
  TCase *tt = tcase_create("writer_timing");
  tcase_set_tags(tt, "timing"); /* CK_EXCLUDE_TAGS, tests/probe/CMakeLists.txt */
  tcase_set_timeout(tt, 30);
  tcase_add_test(tt, test_writer_flush_visibility);
  tcase_add_test(tt, test_writer_idle_timer_flush);
  tcase_add_test(tt, test_writer_event_flush);
  suite_add_tcase(s, tt);
  return s;
}

/* ---- reader --------------------------------------------------------------- */

/* Both opens give `want`, with a one-line message. */
static void expect_open_error(const char *path, probe_status want) {
  probe_trace *t = NULL;
  probe_status st = probe_trace_open(&t, path);
  ck_assert_msg(st == want, "%s: got %s, want %s (%s)", path,
                probe_status_name(st), probe_status_name(want),
                probe_trace_last_error(NULL));
  ck_assert_ptr_null(t);
  const char *m = probe_trace_last_error(NULL);
  ck_assert_msg(m[0] && strchr(m, '\n') == NULL, "message '%s'", m);
  char err[512];
  st = probe_trace_open_isolated(&t, path, err, sizeof err);
  ck_assert_msg(st == want, "isolated %s: got %s (%s)", path,
                probe_status_name(st), err);
  ck_assert_ptr_null(t);
  ck_assert_msg(err[0] && strchr(err, '\n') == NULL, "message '%s'", err);
}

static void write_file(const char *path, const void *data, size_t n) {
  FILE *f = fopen(path, "wb");
  ck_assert_ptr_nonnull(f);
  if (n) ck_assert_uint_eq(fwrite(data, 1, n, f), n);
  fclose(f);
}

START_TEST(test_reader_not_found) {
  expect_open_error("/nonexistent/trace.h5", PROBE_ERR_NOT_FOUND);
  ck_assert_ptr_nonnull(strstr(probe_trace_last_error(NULL), "no such file"));
}
END_TEST

START_TEST(test_reader_not_hdf5) {
  char path[256];
  pt_path(path, sizeof path, "text");
  write_file(path, "", 0);
  expect_open_error(path, PROBE_ERR_NOT_HDF5);
  const char *txt = "step,loss\n0,1.5\n1,1.2\n";
  write_file(path, txt, strlen(txt));
  expect_open_error(path, PROBE_ERR_NOT_HDF5);
  expect_open_error("/tmp", PROBE_ERR_NOT_HDF5);
  unlink(path);
}
END_TEST

/* An HDF5 file with optional root attributes format / version. */
static void write_h5(const char *path, const char *format, int version,
                     int with_tables) {
  hid_t f = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  ck_assert_int_ge(f, 0);
  hid_t sp = H5Screate(H5S_SCALAR);
  if (format) {
    hid_t st = H5Tcopy(H5T_C_S1);
    H5Tset_size(st, H5T_VARIABLE);
    hid_t a = H5Acreate2(f, "format", st, sp, H5P_DEFAULT, H5P_DEFAULT);
    H5Awrite(a, st, &format);
    H5Aclose(a);
    H5Tclose(st);
  }
  if (version) {
    hid_t a =
        H5Acreate2(f, "version", H5T_STD_I32LE, sp, H5P_DEFAULT, H5P_DEFAULT);
    H5Awrite(a, H5T_NATIVE_INT, &version);
    H5Aclose(a);
  }
  hsize_t dims[1] = {4};
  hid_t ds = H5Screate_simple(1, dims, NULL);
  hid_t d = H5Dcreate2(f, with_tables ? "records" : "data", H5T_IEEE_F64LE, ds,
                       H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  double v[4] = {1, 2, 3, 4};
  H5Dwrite(d, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, v);
  H5Dclose(d);
  H5Sclose(ds);
  H5Sclose(sp);
  H5Fclose(f);
}

START_TEST(test_reader_not_trace) {
  char path[256];
  pt_path(path, sizeof path, "h5");
  write_h5(path, NULL, 0, 0);
  expect_open_error(path, PROBE_ERR_NOT_TRACE);
  write_h5(path, "something-else", 1, 0);
  expect_open_error(path, PROBE_ERR_NOT_TRACE);
  unlink(path);
}
END_TEST

START_TEST(test_reader_newer_version) {
  char path[256];
  pt_path(path, sizeof path, "ver");
  write_h5(path, PROBE_TRACE_FORMAT, PROBE_TRACE_VERSION + 1, 0);
  expect_open_error(path, PROBE_ERR_VERSION);
  ck_assert_ptr_nonnull(strstr(probe_trace_last_error(NULL), "newer"));
  unlink(path);
}
END_TEST

/* Format and version right, but a table with the wrong type and others
 * missing: corrupt, not a crash. */
START_TEST(test_reader_missing_tables) {
  char path[256];
  pt_path(path, sizeof path, "tabs");
  write_h5(path, PROBE_TRACE_FORMAT, PROBE_TRACE_VERSION, 1);
  expect_open_error(path, PROBE_ERR_CORRUPT);
  unlink(path);
}
END_TEST

static void small_trace(const char *path, int steps) {
  static const char *const names[3] = {"a", "b", "c"};
  probe_options o;
  probe_options_init(&o);
  o.mode = PROBE_MODE_FULL;
  probe_trace *t = write_selected(path, &o, names, 3, steps);
  probe_trace_close(t);
}

START_TEST(test_reader_truncated) {
  char path[256], cut[256];
  pt_path(path, sizeof path, "full");
  pt_path(cut, sizeof cut, "cut");
  small_trace(path, 40);
  FILE *f = fopen(path, "rb");
  fseek(f, 0, SEEK_END);
  long size = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *data = malloc((size_t)size);
  ck_assert_uint_eq(fread(data, 1, (size_t)size, f), (size_t)size);
  fclose(f);
  long lens[] = {4, 8, 100, 1000, size / 3, size / 2, size - 100, size - 1};
  for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++) {
    write_file(cut, data, (size_t)lens[i]);
    expect_open_error(cut, lens[i] < 8 ? PROBE_ERR_NOT_HDF5 : PROBE_ERR_CORRUPT);
  }
  free(data);
  unlink(path);
  unlink(cut);
}
END_TEST

/* A record whose site is out of range is found by the range checks. */
START_TEST(test_reader_range_checks) {
  char path[256];
  pt_path(path, sizeof path, "range");
  small_trace(path, 4);
  hid_t f = H5Fopen(path, H5F_ACC_RDWR, H5P_DEFAULT);
  ck_assert_int_ge(f, 0);
  hid_t d = H5Dopen2(f, "/records", H5P_DEFAULT);
  hid_t mt = H5Tcreate(H5T_COMPOUND, sizeof(int32_t));
  H5Tinsert(mt, "site", 0, H5T_NATIVE_INT32);
  hid_t fs = H5Dget_space(d);
  hsize_t start[1] = {13}, count[1] = {1};
  H5Sselect_hyperslab(fs, H5S_SELECT_SET, start, NULL, count, NULL);
  hid_t ms = H5Screate_simple(1, count, NULL);
  int32_t bad = 99;
  ck_assert_int_ge(H5Dwrite(d, mt, ms, fs, H5P_DEFAULT, &bad), 0);
  H5Sclose(ms);
  H5Sclose(fs);
  H5Tclose(mt);
  H5Dclose(d);
  H5Fclose(f);

  probe_trace *t;
  PT_CHECK(probe_trace_open(&t, path)); /* metadata is fine */
  probe_record r[8];
  size_t got;
  PT_CHECK(probe_trace_read_records(t, 0, 8, r, &got));
  ck_assert_int_eq(probe_trace_read_records(t, 8, 8, r, &got),
                   PROBE_ERR_CORRUPT);
  ck_assert_uint_eq(got, 0);
  ck_assert_ptr_nonnull(strstr(probe_trace_last_error(t), "row 13"));
  probe_trace_close(t);
  char err[256];
  ck_assert_int_eq(probe_trace_open_isolated(&t, path, err, sizeof err),
                   PROBE_ERR_CORRUPT);
  ck_assert_ptr_nonnull(strstr(err, "row 13"));
  unlink(path);
}
END_TEST

START_TEST(test_reader_isolated_ok) {
  char path[256];
  pt_path(path, sizeof path, "iso");
  small_trace(path, 10);
  probe_trace *t;
  char err[256];
  PT_CHECK(probe_trace_open_isolated(&t, path, err, sizeof err));
  ck_assert_int_eq(probe_trace_get_info(t)->n_records, 60);
  probe_trace_close(t);
  unlink(path);
}
END_TEST

static Suite *make_reader_suite(void) {
  Suite *s = suite_create("reader");
  TCase *tc = tcase_create("reader");
  tcase_set_timeout(tc, 30);
  tcase_add_test(tc, test_reader_not_found);
  tcase_add_test(tc, test_reader_not_hdf5);
  tcase_add_test(tc, test_reader_not_trace);
  tcase_add_test(tc, test_reader_newer_version);
  tcase_add_test(tc, test_reader_missing_tables);
  tcase_add_test(tc, test_reader_truncated);
  tcase_add_test(tc, test_reader_range_checks);
  tcase_add_test(tc, test_reader_isolated_ok);
  suite_add_tcase(s, tc);
  return s;
}

int main(int argc, char **argv) {
  if (argc == 3 && strcmp(argv[1], "--count-steps") == 0)
    return count_steps_main(argv[2]);
  SRunner *sr = srunner_create(make_api_suite());
  srunner_add_suite(sr, make_writer_suite());
  srunner_add_suite(sr, make_reader_suite());
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? 0 : 1;
}
