/*
 * test_probe_misuse.c - Check suite "misuse": the public API used in ways
 * a careless or hostile caller might, each of which once crashed, hung,
 * overflowed a buffer or wrote a trace the reader then refused (an audit
 * of 2026-12-03). Each test names the way; every one ends in a status from
 * the enum, in time (Check's per-test timeout catches a hang).
 */
#define _GNU_SOURCE
#include <math.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "ampprobe/analysis.h"
#include "probe_testutil.h"

/* small_trace at a fresh path under tag, opened for reading. */
static probe_trace *small_trace_open(char *path, size_t len, const char *tag, int steps) {
  pt_path(path, len, tag);
  pt_small_trace(path, steps, NULL);
  probe_trace *t = NULL;
  PT_CHECK(probe_trace_open(&t, path));
  return t;
}

/* A trace path that is a symbolic link to nothing: O_EXCL refuses it and a
 * plain open cannot follow it (it recursed without end). */
START_TEST(dangling_symlink) {
  char path[256], target[300];
  pt_path(path, sizeof path, "dangling");
  snprintf(target, sizeof target, "%s.nowhere", path);
  unlink(path);
  unlink(target);
  ck_assert_int_eq(symlink(target, path), 0);
  probe_session *s = NULL;
  for (int overwrite = 0; overwrite < 2; overwrite++) {
    probe_options o;
    probe_options_init(&o);
    o.overwrite = overwrite;
    probe_status st = probe_session_open(&s, path, &o);
    ck_assert_msg(st == PROBE_ERR_IO, "overwrite %d: %s", overwrite, probe_status_name(st));
    ck_assert_ptr_null(s);
    ck_assert_ptr_nonnull(strstr(probe_session_last_error(NULL), "link"));
  }
  ck_assert_int_ne(access(target, F_OK), 0); /* nothing created through it */
  unlink(path);
}
END_TEST

/* flush_seconds NaN passed the range check and its deadline (UB: NaN to
 * time_t) spun the writer holding the lock: every later call blocked. */
START_TEST(flush_seconds_not_a_number) {
  char path[256];
  pt_path(path, sizeof path, "fsnan");
  const double bad[] = {NAN, -NAN, -INFINITY, -1e-300};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    probe_options o;
    probe_options_init(&o);
    o.overwrite = 1;
    o.flush_seconds = bad[i];
    probe_session *s = NULL;
    probe_status st = probe_session_open(&s, path, &o);
    ck_assert_msg(st == PROBE_ERR_CONFIG, "flush_seconds %g: %s", bad[i], probe_status_name(st));
  }
  /* +inf is "never by time": a session that works */
  probe_options o;
  probe_options_init(&o);
  o.flush_seconds = INFINITY;
  pt_small_trace(path, 3, &o);
  probe_verdict v;
  PT_CHECK(probe_postmortem_verdict(path, &v));
  unlink(path);
}
END_TEST

/* Values the reader calls corrupt were written with PROBE_OK, which made
 * the whole trace unreadable. */
START_TEST(values_the_reader_refuses) {
  char path[256];
  pt_path(path, sizeof path, "refused");
  probe_session *s = pt_open(path, PROBE_MODE_SCALARS);
  int32_t id;
  PT_CHECK(probe_layer_register(s, "l", PROBE_KIND_LINEAR, PROBE_DTYPE_F16, &id));
  probe_scaler_event ev = {.step = -1, .kind = PROBE_SCALER_BACKOFF};
  ck_assert_int_eq(probe_scaler_transition(s, &ev), PROBE_ERR_INVALID_ARG);
  ev.step = 0;
  PT_CHECK(probe_scaler_transition(s, &ev)); /* outside a step, step 0: fine */
  /* the scales and tracker the reader refuses since 2026-12-04 (a NaN, inf or
   * negative scale, a negative tracker), and an event before the one
   * before it (the reader takes them in step order) */
  const double bad_scale[] = {NAN, INFINITY, -INFINITY, -1.0};
  for (size_t i = 0; i < sizeof bad_scale / sizeof bad_scale[0]; i++) {
    probe_scaler_event e = {.step = 0, .kind = PROBE_SCALER_BACKOFF,
                            .old_scale = bad_scale[i], .new_scale = 1.0};
    ck_assert_int_eq(probe_scaler_transition(s, &e), PROBE_ERR_INVALID_ARG);
    e.old_scale = 1.0;
    e.new_scale = bad_scale[i];
    ck_assert_int_eq(probe_scaler_transition(s, &e), PROBE_ERR_INVALID_ARG);
  }
  probe_scaler_event neg = {.step = 0, .kind = PROBE_SCALER_GROWTH,
                            .growth_tracker = -1};
  ck_assert_int_eq(probe_scaler_transition(s, &neg), PROBE_ERR_INVALID_ARG);
  ev.step = 1;
  PT_CHECK(probe_scaler_transition(s, &ev));
  ev.step = 0;
  ck_assert_int_eq(probe_scaler_transition(s, &ev), PROBE_ERR_INVALID_ARG);
  PT_CHECK(probe_step_begin(s, 0));
  ck_assert_int_eq(probe_scaler_transition(s, &ev), PROBE_ERR_INVALID_ARG);
  PT_CHECK(probe_step_end(s));
  PT_CHECK(probe_step_begin(s, 1));
  const int32_t bad[][2] = {{2, 0}, {0, 2}, {-1, 0}, {0, INT32_MIN}};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    probe_step_scalars sc = {.loss = 1.0, .loss_scale = 1.0,
                             .found_inf = bad[i][0], .skipped = bad[i][1]};
    ck_assert_int_eq(probe_step_set_scalars(s, &sc), PROBE_ERR_INVALID_ARG);
  }
  probe_step_scalars sc = {.loss = 1.0, .loss_scale = 1.0, .found_inf = 1, .skipped = 1};
  PT_CHECK(probe_step_set_scalars(s, &sc));
  PT_CHECK(probe_step_end(s));
  PT_CHECK(probe_session_close(s));
  probe_verdict v;
  PT_CHECK(probe_postmortem_verdict(path, &v)); /* the trace reads back */
  unlink(path);
}
END_TEST

/* A cross-rank post-mortem of one trace without a rank looped for ever
 * (its rank -1 sized a table as SIZE_MAX + 1). */
START_TEST(ranks_of_one_unranked_trace) {
  char path[256];
  pt_path(path, sizeof path, "unranked");
  pt_small_trace(path, 3, NULL);
  const char *paths[1] = {path};
  probe_ranks r;
  probe_status st = probe_ranks_run(&r, paths, 1, NULL);
  ck_assert_msg(st >= 0 || st == PROBE_ERR_INVALID_ARG, "%s: %s", probe_status_name(st), r.error);
  probe_ranks_free(&r);
  char *json = NULL;
  PT_CHECK(probe_postmortem_json(paths, 1, &json));
  ck_assert_ptr_nonnull(json);
  probe_free(json);
  unlink(path);
}
END_TEST

/* A rank number far past the files of the set: refused as corrupt before
 * anything is sized by it (8 bytes per rank number: 16 GiB here). */
START_TEST(rank_number_far_past_the_set) {
  char path[256];
  pt_path(path, sizeof path, "farrank");
  probe_options o;
  probe_options_init(&o);
  o.rank = INT32_MAX - 1;
  o.world_size = INT32_MAX;
  pt_small_trace(path, 2, &o);
  const char *paths[1] = {path};
  probe_ranks r;
  probe_status st = probe_ranks_run(&r, paths, 1, NULL);
  ck_assert_msg(st == PROBE_ERR_CORRUPT, "%s", probe_status_name(st));
  ck_assert_ptr_nonnull(strstr(r.error, "corrupt trace set"));
  probe_ranks_free(&r);
  unlink(path);
}
END_TEST

/* chunk_rows large enough that rows x row size wraps: the buffer was
 * allocated small and HDF5 wrote past it. Now taken as the maximum: the
 * same results as the default. */
START_TEST(chunk_rows_that_wrap) {
  char path[256];
  probe_trace *t = small_trace_open(path, sizeof path, "chunk", 5);
  const size_t huge[] = {(size_t)1 << 61, SIZE_MAX, PROBE_CHUNK_ROWS_MAX + 1};
  probe_diag ref;
  PT_CHECK(probe_diag_run(&ref, t, path, NULL));
  for (size_t i = 0; i < sizeof huge / sizeof huge[0]; i++) {
    probe_diag_options o;
    probe_diag_options_init(&o);
    o.chunk_rows = huge[i];
    probe_diag d;
    PT_CHECK(probe_diag_run(&d, t, path, &o));
    ck_assert_int_eq(d.verdict, ref.verdict);
    ck_assert_int_eq(d.n_steps, ref.n_steps);
    probe_diag_free(&d);
    probe_diff_options fo;
    probe_diff_options_init(&fo);
    fo.chunk_rows = huge[i];
    probe_diff df;
    PT_CHECK(probe_diff_run(&df, t, t, &fo));
    ck_assert_int_eq(df.steps_common, 5);
    probe_diff_free(&df);
  }
  probe_diag_free(&ref);
  probe_trace_close(t);
  unlink(path);
}
END_TEST

/* NULL where probe_diag_run needs a handle: a status, as for diff/ranks. */
START_TEST(diag_run_null) {
  char path[256];
  probe_trace *t = small_trace_open(path, sizeof path, "dnull", 2);
  probe_diag d;
  ck_assert_int_eq(probe_diag_run(NULL, t, path, NULL), PROBE_ERR_INVALID_ARG);
  ck_assert_int_eq(probe_diag_run(&d, NULL, path, NULL), PROBE_ERR_INVALID_ARG);
  probe_diag_free(&d); /* zeroed: freeing it is fine */
  probe_trace_close(t);
  unlink(path);
}
END_TEST

/* A close that fails frees the handle: its message is where
 * probe_session_last_error(NULL) finds it (it said "no error"). */
START_TEST(close_failure_has_its_text) {
  char path[256];
  pt_path(path, sizeof path, "closemsg");
  signal(SIGXFSZ, SIG_IGN);
  struct rlimit rl = {.rlim_cur = 256 * 1024, .rlim_max = RLIM_INFINITY};
  probe_options o;
  probe_options_init(&o);
  o.overwrite = 1;
  o.mode = PROBE_MODE_FULL;
  o.flush_seconds = 1e9; /* nothing written before close */
  probe_session *s = NULL;
  PT_CHECK(probe_session_open(&s, path, &o));
  ck_assert_int_eq(setrlimit(RLIMIT_FSIZE, &rl), 0);
  int32_t id[8];
  char name[8];
  for (int l = 0; l < 8; l++) {
    snprintf(name, sizeof name, "l%d", l);
    PT_CHECK(probe_layer_register(s, name, PROBE_KIND_LINEAR, PROBE_DTYPE_F16, &id[l]));
  }
  static float x[4096];
  probe_status st = PROBE_OK;
  for (int step = 0; step < 2000 && st == PROBE_OK; step++) {
    st = probe_step_begin(s, step);
    for (int l = 0; l < 8 && st == PROBE_OK; l++) {
      pt_tensor(x, 4096, step, (uint32_t)l);
      st = probe_tensor_record(s, id[l], PROBE_SITE_FWD_OUT, PROBE_DTYPE_F32, x, 4096);
    }
    if (st == PROBE_OK) st = probe_step_end(s);
  }
  probe_status cst = probe_session_close(s);
  ck_assert_msg(cst == PROBE_ERR_NOSPACE || cst == PROBE_ERR_IO, "close: %s",
                probe_status_name(cst));
  const char *msg = probe_session_last_error(NULL);
  ck_assert_msg(strcmp(msg, "no error") != 0 && msg[0], "close's text: '%s'", msg);
  unlink(path);
}
END_TEST

/* libprobe's own children (isolated readers) inherited a session's writer
 * lock: after the parent closed its trace, re-opening it was
 * PROBE_ERR_LOCKED while such a child lived. A child that has run
 * probe__child_detach holds no lock, and its stderr is /dev/null. */
void probe__child_detach(void); /* libprobe/format.h */

START_TEST(child_holds_no_lock) {
  char path[256];
  pt_path(path, sizeof path, "childlock");
  probe_options o;
  probe_options_init(&o);
  o.overwrite = 1;
  probe_session *s = NULL;
  /* the hazard: a child that keeps what it inherited keeps the lock */
  PT_CHECK(probe_session_open(&s, path, &o));
  int hold[2];
  ck_assert_int_eq(pipe(hold), 0);
  pid_t keeper = fork();
  ck_assert_int_ge(keeper, 0);
  if (keeper == 0) {
    char c;
    close(hold[1]);
    if (read(hold[0], &c, 1) < 0) _exit(3);
    _exit(0);
  }
  close(hold[0]);
  PT_CHECK(probe_session_close(s));
  s = NULL;
  ck_assert_int_eq(probe_session_open(&s, path, &o), PROBE_ERR_LOCKED);
  close(hold[1]);
  waitpid(keeper, NULL, 0);
  /* the same with a child that let go of its descriptors */
  PT_CHECK(probe_session_open(&s, path, &o));
  int up[2], down[2];
  ck_assert_int_eq(pipe(up), 0);
  ck_assert_int_eq(pipe(down), 0);
  pid_t pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) {
    close(up[0]);
    close(down[1]);
    probe__child_detach();
    struct stat a, b;
    int quiet = fstat(2, &a) == 0 && stat("/dev/null", &b) == 0 && a.st_rdev == b.st_rdev;
    char c = quiet ? 'y' : 'n';
    if (write(up[1], &c, 1) != 1) _exit(2);
    if (read(down[0], &c, 1) < 0) _exit(3); /* alive until the parent is done */
    _exit(0);
  }
  close(up[1]);
  close(down[0]);
  char c = 0;
  ck_assert_int_eq(read(up[0], &c, 1), 1);
  ck_assert_msg(c == 'y', "the child's stderr is not /dev/null");
  PT_CHECK(probe_session_close(s));
  s = NULL;
  probe_status st = probe_session_open(&s, path, &o); /* the child lives */
  ck_assert_msg(st == PROBE_OK, "re-open while the child lives: %s", probe_status_name(st));
  PT_CHECK(probe_session_close(s));
  close(down[1]);
  int wst;
  waitpid(pid, &wst, 0);
  ck_assert(WIFEXITED(wst) && WEXITSTATUS(wst) == 0);
  close(up[0]);
  unlink(path);
}
END_TEST

/* Steps far apart in int64 (the writer takes any increasing steps): the
 * diagnosis subtracted them in int64, undefined behaviour (UBSan in the
 * sanitizer build aborts on it). */
START_TEST(steps_far_apart) {
  char path[256];
  pt_path(path, sizeof path, "bigstep");
  const int64_t steps[2][2] = {{0, INT64_MAX}, {INT64_MIN / 2 + 1, INT64_MAX / 2}};
  for (int c = 0; c < 2; c++) {
    probe_session *s = pt_open(path, PROBE_MODE_FULL);
    int32_t id;
    PT_CHECK(probe_layer_register(s, "l", PROBE_KIND_LINEAR, PROBE_DTYPE_F16, &id));
    float x[16];
    int wrote = 0;
    for (int k = 0; k < 2; k++) {
      if (probe_step_begin(s, steps[c][k]) != PROBE_OK) continue; /* refused: fine */
      pt_tensor(x, 16, k, 0);
      PT_CHECK(probe_tensor_record(s, id, PROBE_SITE_FWD_OUT, PROBE_DTYPE_F32, x, 16));
      probe_step_scalars sc = {.loss = 1.0, .loss_scale = 1024.0, .grad_norm = 2.0,
                               .clip_threshold = 1.0, .clip_coef = 0.5};
      PT_CHECK(probe_step_set_scalars(s, &sc));
      PT_CHECK(probe_step_end(s));
      wrote++;
    }
    PT_CHECK(probe_session_close(s));
    if (wrote < 2) continue;
    probe_verdict v;
    PT_CHECK(probe_postmortem_verdict(path, &v));
    char *json = NULL;
    const char *paths[1] = {path};
    PT_CHECK(probe_postmortem_json(paths, 1, &json));
    probe_free(json);
  }
  unlink(path);
}
END_TEST

/* An oracle that answers outside probe_status: ddmin returned that value,
 * which a caller's st < 0 took for success. */
static probe_status bad_oracle(void *ctx, const uint64_t *sets, size_t count, int *verdict) {
  (void)ctx, (void)sets;
  for (size_t i = 0; i < count; i++) verdict[i] = PROBE_DDMIN_FAIL;
  return (probe_status)42;
}

START_TEST(oracle_outside_the_status_list) {
  probe_ddmin d;
  PT_CHECK(probe_ddmin_init(&d, 4, bad_oracle, NULL));
  uint64_t result = 0;
  probe_status st = probe_ddmin_minimize(&d, &result);
  ck_assert_msg(st == PROBE_ERR_STATE, "%d", (int)st);
  probe_ddmin_free(&d);
}
END_TEST

/* NULL where a helper takes a pointer: a neutral answer, no crash (17 such
 * calls crashed); a NULL open names what was NULL (it said "no error"). */
/* Layer names: invalid UTF-8 is refused (the format promises UTF-8, and
 * h5py's .decode() of the name would fail), a refused name is shown
 * escaped in the message, a name registered twice is refused. */
START_TEST(layer_names_refused) {
  char p[256];
  pt_path(p, sizeof p, "names");
  probe_session *s = pt_open(p, PROBE_MODE_SCALARS);
  int32_t id = -1;
  static const char *bad[] = {"x\xff", "caf\xc3", "\xc0\xaf", "\xed\xa0\x80",
                              "a\xf4\x90\x80\x80"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    ck_assert_int_eq(probe_layer_register(s, bad[i], PROBE_KIND_LINEAR, PROBE_DTYPE_F16, &id),
                     PROBE_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(probe_session_last_error(s), "not valid UTF-8"));
  }
  PT_CHECK(probe_layer_register(s, "caf\xc3\xa9.\xe2\x82\xac", PROBE_KIND_LINEAR,
                                PROBE_DTYPE_F16, &id));
  ck_assert_int_eq(probe_layer_register(s, "caf\xc3\xa9.\xe2\x82\xac", PROBE_KIND_BN,
                                        PROBE_DTYPE_F16, &id),
                   PROBE_ERR_INVALID_ARG);
  ck_assert_ptr_nonnull(strstr(probe_session_last_error(s), "registered twice"));
  ck_assert_int_eq(probe_layer_register(s, "a\x1b[2J", 999, PROBE_DTYPE_F16, &id),
                   PROBE_ERR_INVALID_ARG);
  ck_assert_ptr_null(strchr(probe_session_last_error(s), 0x1b));
  ck_assert_ptr_nonnull(strstr(probe_session_last_error(s), "a\\e[2J"));
  PT_CHECK(probe_session_close(s));
  unlink(p);
}
END_TEST

/* Every refusal with a session sets its own message: a negative step (or
 * one that wrapped past INT64_MAX) and NULL arguments said nothing, and
 * probe_session_last_error gave the previous, unrelated error. */
START_TEST(refusals_say_why) {
  char p[256];
  pt_path(p, sizeof p, "refusals");
  probe_session *s = pt_open(p, PROBE_MODE_SCALARS);
  int32_t id = -1;
  ck_assert_int_eq(probe_layer_register(s, "", PROBE_KIND_LINEAR, PROBE_DTYPE_F16, &id),
                   PROBE_ERR_INVALID_ARG); /* a first, unrelated message */
  ck_assert_int_eq(probe_step_begin(s, -1), PROBE_ERR_INVALID_ARG);
  ck_assert_msg(strstr(probe_session_last_error(s), "step -1 is negative"), "%s",
                probe_session_last_error(s));
  ck_assert_int_eq(probe_step_begin(s, INT64_MIN), PROBE_ERR_INVALID_ARG);
  ck_assert_msg(strstr(probe_session_last_error(s), "negative"), "%s",
                probe_session_last_error(s));
  ck_assert_int_eq(probe_layer_register(s, NULL, PROBE_KIND_LINEAR, PROBE_DTYPE_F16, &id),
                   PROBE_ERR_INVALID_ARG);
  ck_assert_msg(strstr(probe_session_last_error(s), "NULL name"), "%s",
                probe_session_last_error(s));
  PT_CHECK(probe_step_begin(s, 0));
  ck_assert_int_eq(probe_step_set_scalars(s, NULL), PROBE_ERR_INVALID_ARG);
  ck_assert_msg(strstr(probe_session_last_error(s), "NULL scalars"), "%s",
                probe_session_last_error(s));
  ck_assert_int_eq(probe_scaler_transition(s, NULL), PROBE_ERR_INVALID_ARG);
  ck_assert_msg(strstr(probe_session_last_error(s), "NULL event"), "%s",
                probe_session_last_error(s));
  PT_CHECK(probe_step_end(s));
  PT_CHECK(probe_session_close(s));
  unlink(p);
}
END_TEST

/* PROBE_LAYERS_MAX layers: all registered (in linear time: the duplicate
 * check was quadratic, ~5e11 comparisons here), one more refused, and the
 * reader opens the trace (it stopped at 2^20 while the writer went on to
 * 2^30). */
START_TEST(as_many_layers_as_the_reader_takes) {
  char p[256];
  pt_path(p, sizeof p, "layers-max");
  probe_session *s = pt_open(p, PROBE_MODE_SCALARS);
  char name[32];
  int32_t id = -1;
  for (int i = 0; i < PROBE_LAYERS_MAX; i++) {
    snprintf(name, sizeof name, "m%d.fc", i);
    probe_status st = probe_layer_register(s, name, PROBE_KIND_LINEAR, PROBE_DTYPE_F16, &id);
    if (st != PROBE_OK) ck_abort_msg("layer %d: %s", i, probe_session_last_error(s));
  }
  ck_assert_int_eq(id, PROBE_LAYERS_MAX - 1);
  ck_assert_int_eq(probe_layer_register(s, "one.more", PROBE_KIND_LINEAR, PROBE_DTYPE_F16, &id),
                   PROBE_ERR_INVALID_ARG);
  ck_assert_ptr_nonnull(strstr(probe_session_last_error(s), "too many layers"));
  ck_assert_int_eq(probe_layer_register(s, "m77.fc", PROBE_KIND_LINEAR, PROBE_DTYPE_F16, &id),
                   PROBE_ERR_INVALID_ARG); /* a duplicate is still found */
  PT_CHECK(probe_step_begin(s, 0));
  probe_step_scalars sc = {.loss = 1.0, .loss_scale = 1.0};
  PT_CHECK(probe_step_set_scalars(s, &sc));
  PT_CHECK(probe_step_end(s));
  PT_CHECK(probe_session_close(s));
  probe_trace *t = NULL;
  PT_CHECK(probe_trace_open(&t, p));
  size_t n = 0;
  ck_assert_ptr_nonnull(probe_trace_layers(t, &n));
  ck_assert_uint_eq(n, PROBE_LAYERS_MAX);
  probe_trace_close(t);
  unlink(p);
}
END_TEST

START_TEST(null_helpers) {
  probe_stats_init(NULL);
  probe_stats s;
  probe_stats_init(&s);
  probe_stats_merge(NULL, &s);
  probe_stats_merge(&s, NULL);
  ck_assert_uint_eq(probe_stats_finite(NULL), 0);
  ck_assert_uint_eq(probe_stats_nonfinite(NULL), 0);
  ck_assert(isnan(probe_stats_mean(NULL)) && isnan(probe_stats_rms(NULL)) &&
            isnan(probe_stats_l2(NULL)) && isnan(probe_stats_headroom(NULL)) &&
            isnan(probe_stats_frac_below_exp(NULL, 0)));
  probe_options_init(NULL);
  probe_diag_options_init(NULL);
  probe_diff_options_init(NULL);
  probe_ranks_options_init(NULL);
  probe_diag_free(NULL);
  ck_assert_str_eq(probe_diag_layer_name(NULL, 0), "?");
  ck_assert_int_eq(probe_diag_problem(NULL), 0);
  ck_assert_int_eq(probe_ddmin_lookup(NULL, 1), PROBE_DDMIN_UNKNOWN);
  probe_trace *t = NULL;
  ck_assert_int_eq(probe_trace_open(NULL, "x.h5"), PROBE_ERR_INVALID_ARG);
  ck_assert_ptr_nonnull(strstr(probe_trace_last_error(NULL), "out is NULL"));
  ck_assert_int_eq(probe_trace_open(&t, NULL), PROBE_ERR_INVALID_ARG);
  ck_assert_ptr_nonnull(strstr(probe_trace_last_error(NULL), "path is NULL"));
}
END_TEST

/* A zeroed probe_ddmin (never prepared by probe_ddmin_init): minimize
 * called its NULL oracle (SIGSEGV at pc 0). Refused, with a line. */
START_TEST(ddmin_not_prepared) {
  probe_ddmin d;
  memset(&d, 0, sizeof d);
  uint64_t res = 0;
  ck_assert_int_eq(probe_ddmin_minimize(&d, &res), PROBE_ERR_INVALID_ARG);
  ck_assert_ptr_nonnull(strstr(probe_trace_last_error(NULL), "oracle"));
  ck_assert_int_eq(probe_ddmin_seed(&d, 0, PROBE_DDMIN_PASS),
                   PROBE_ERR_INVALID_ARG);
  ck_assert_ptr_nonnull(strstr(probe_trace_last_error(NULL), "probe_ddmin_init"));
  ck_assert_int_eq(probe_ddmin_init(&d, 3, NULL, NULL), PROBE_ERR_INVALID_ARG);
  ck_assert_ptr_nonnull(strstr(probe_trace_last_error(NULL), "NULL oracle"));
}
END_TEST

/* ring_steps has a documented maximum: 2^30 had the open allocate 24 GiB
 * (ERR_NOMEM at best). Refused as the other options are, naming it. */
START_TEST(ring_steps_bounded) {
  char path[256];
  pt_path(path, sizeof path, "ring");
  const int bad[] = {1 << 30, PROBE_RING_STEPS_MAX + 1, INT32_MAX, -1};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    probe_options o;
    probe_options_init(&o);
    o.overwrite = 1;
    o.ring_steps = bad[i];
    probe_session *s = NULL;
    ck_assert_int_eq(probe_session_open(&s, path, &o), PROBE_ERR_CONFIG);
    ck_assert_ptr_null(s);
    ck_assert_msg(strstr(probe_session_last_error(NULL), "ring_steps") != NULL,
                  "'%s'", probe_session_last_error(NULL));
  }
  probe_options o;
  probe_options_init(&o);
  o.overwrite = 1;
  o.ring_steps = 1000; /* within: accepted */
  probe_session *s = NULL;
  PT_CHECK(probe_session_open(&s, path, &o));
  PT_CHECK(probe_session_close(s));
  unlink(path);
}
END_TEST

/* probe_diff_options outside the header's ranges were clamped (window) or
 * used as given (a NaN threshold: nothing ever diverges), with PROBE_OK.
 * Refused, naming the option. */
START_TEST(diff_options_refused) {
  char path[256];
  probe_trace *t = small_trace_open(path, sizeof path, "diffopt", 3);
  struct {
    int window;
    double threshold, margin;
    const char *says;
  } bad[] = {
      {0, 0.1, 0.05, "window 0"},          {257, 0.1, 0.05, "window 257"},
      {100000, 0.1, 0.05, "window 100000"}, {10, NAN, 0.05, "threshold"},
      {10, -1.0, 0.05, "threshold"},        {10, 0.0, 0.05, "threshold"},
      {10, 0.1, NAN, "zero_frac_margin"},   {10, 0.1, -0.5, "zero_frac_margin"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    probe_diff_options o;
    probe_diff_options_init(&o);
    o.window = bad[i].window;
    o.threshold = bad[i].threshold;
    o.zero_frac_margin = bad[i].margin;
    probe_diff d;
    ck_assert_int_eq(probe_diff_run(&d, t, t, &o), PROBE_ERR_INVALID_ARG);
    ck_assert_msg(strstr(probe_trace_last_error(NULL), bad[i].says) != NULL,
                  "case %zu: '%s'", i, probe_trace_last_error(NULL));
    probe_diff_free(&d);
  }
  probe_diff_options o;
  probe_diff_options_init(&o);
  o.window = PROBE_DIFF_MAX_WINDOW;
  probe_diff d;
  PT_CHECK(probe_diff_run(&d, t, t, &o));
  probe_diff_free(&d);
  probe_trace_close(t);
  unlink(path);
}
END_TEST

/* A refused argument leaves a line saying which: probe_trace_last_error(t)
 * said "no error" after a negative start row, and the analysis entry
 * points left no text anywhere. */
START_TEST(invalid_args_have_text) {
  char path[256];
  probe_trace *t = small_trace_open(path, sizeof path, "argtext", 3);
  probe_record r[2];
  probe_step_scalars sc[2];
  size_t got = 0;
  ck_assert_int_eq(probe_trace_read_records(t, -1, 2, r, &got),
                   PROBE_ERR_INVALID_ARG);
  ck_assert_ptr_nonnull(strstr(probe_trace_last_error(t), "negative start"));
  ck_assert_int_eq(probe_trace_read_steps(t, 0, 2, NULL, &got),
                   PROBE_ERR_INVALID_ARG);
  ck_assert_ptr_nonnull(strstr(probe_trace_last_error(t), "NULL buf"));
  ck_assert_int_eq(probe_trace_read_steps(t, 0, 2, sc, NULL),
                   PROBE_ERR_INVALID_ARG);
  ck_assert_ptr_nonnull(strstr(probe_trace_last_error(t), "NULL got"));
  ck_assert_int_eq(probe_trace_read_snapshot_data(t, NULL, NULL),
                   PROBE_ERR_INVALID_ARG);
  ck_assert_ptr_nonnull(strstr(probe_trace_last_error(t), "NULL snapshot"));
  ck_assert_int_eq(probe_trace_read_records(NULL, 0, 2, r, &got),
                   PROBE_ERR_INVALID_ARG);
  ck_assert_ptr_nonnull(strstr(probe_trace_last_error(NULL), "NULL trace"));

  char *json = NULL;
  ck_assert_int_eq(probe_postmortem_json(NULL, 0, &json), PROBE_ERR_INVALID_ARG);
  ck_assert_ptr_nonnull(strstr(probe_trace_last_error(NULL), "no paths"));
  const char *paths[2] = {path, NULL};
  ck_assert_int_eq(probe_postmortem_json(paths, 2, &json), PROBE_ERR_INVALID_ARG);
  ck_assert_ptr_nonnull(strstr(probe_trace_last_error(NULL), "path 1 is NULL"));
  probe_verdict v;
  ck_assert_int_eq(probe_postmortem_verdict(NULL, &v), PROBE_ERR_INVALID_ARG);
  ck_assert_ptr_nonnull(strstr(probe_trace_last_error(NULL), "NULL path"));
  probe_ranks rk;
  ck_assert_int_eq(probe_ranks_run(&rk, NULL, 0, NULL), PROBE_ERR_INVALID_ARG);
  ck_assert_ptr_nonnull(strstr(rk.error, "no paths"));
  ck_assert_ptr_nonnull(strstr(probe_trace_last_error(NULL), "no paths"));
  probe_ranks_free(&rk);
  probe_diff d;
  ck_assert_int_eq(probe_diff_run(&d, t, NULL, NULL), PROBE_ERR_INVALID_ARG);
  ck_assert_ptr_nonnull(strstr(probe_trace_last_error(NULL), "trace b"));
  char *out = NULL;
  ck_assert_int_eq(probe_diff_json(NULL, "a", "b", &out), PROBE_ERR_INVALID_ARG);
  ck_assert_ptr_nonnull(strstr(probe_trace_last_error(NULL), "probe_diff_json"));
  ck_assert_int_eq(probe_ranks_render_json(NULL, &out), PROBE_ERR_INVALID_ARG);
  ck_assert_ptr_nonnull(strstr(probe_trace_last_error(NULL), "probe_ranks_render_json"));
  probe_trace_close(t);
  unlink(path);
}
END_TEST

static Suite *misuse_suite(void) {
  Suite *su = suite_create("misuse");
  TCase *tc = tcase_create("misuse");
  tcase_set_timeout(tc, 30);
  tcase_add_test(tc, dangling_symlink);
  tcase_add_test(tc, flush_seconds_not_a_number);
  tcase_add_test(tc, values_the_reader_refuses);
  tcase_add_test(tc, ranks_of_one_unranked_trace);
  tcase_add_test(tc, rank_number_far_past_the_set);
  tcase_add_test(tc, chunk_rows_that_wrap);
  tcase_add_test(tc, diag_run_null);
  tcase_add_test(tc, close_failure_has_its_text);
  tcase_add_test(tc, child_holds_no_lock);
  tcase_add_test(tc, steps_far_apart);
  tcase_add_test(tc, oracle_outside_the_status_list);
  tcase_add_test(tc, null_helpers);
  tcase_add_test(tc, layer_names_refused);
  tcase_add_test(tc, refusals_say_why);
  tcase_add_test(tc, as_many_layers_as_the_reader_takes);
  tcase_add_test(tc, ddmin_not_prepared);
  tcase_add_test(tc, ring_steps_bounded);
  tcase_add_test(tc, diff_options_refused);
  tcase_add_test(tc, invalid_args_have_text);
  suite_add_tcase(su, tc);
  return su;
}

int main(void) {
  SRunner *sr = srunner_create(misuse_suite());
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
