/*
 * test_probe_live.c - Check suite "live": a process reads the traces it is
 * writing while it writes them (a monitoring or early-stopping loop), and
 * gets what a reader in another process gets at the same moment.
 *
 * Every isolated read (all of the Python package's) failed: HDF5 took the reader's open of a file this
 * process already had open (the writer's, same device and inode) for that
 * file and read through the writer's state - in the isolated open's child
 * through the writer's descriptor, pointed there at an empty memory file -
 * so a healthy live trace was "corrupt HDF5 file (root attributes: bad
 * object header version number)" (hunt F5, 2026-12-05). The cases: a full
 * trace, a flight recorder, and both written at once by two sessions;
 * every LV_EVERY steps each is flushed and read in-process (plain and
 * isolated open, every row, the post-mortem verdict and JSON), the rows
 * compared with those of a trace of the same steps written without reads,
 * and the JSON with what a fresh process (this program, exec'd with
 * --read) prints. The finished traces equal those written without reads.
 * And a reader left open while the trace grows: a later open of the file
 * is refused, saying why, not read through that reader's stale view.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <sys/wait.h>

#include "ampprobe/analysis.h"
#include "probe_testutil.h"

enum { LV_LAYERS = 6, LV_N = 128, LV_STEPS = 48, LV_EVERY = 8, LV_NAN_STEP = 27 };

/* Steps a..b-1: LV_LAYERS records each, a NaN in layer 2's output at
 * LV_NAN_STEP (the verdict turns during the run). */
static void lv_write(probe_session *s, int64_t a, int64_t b) {
  float x[LV_N];
  for (int64_t k = a; k < b; k++) {
    PT_CHECK(probe_step_begin(s, k));
    for (int l = 0; l < LV_LAYERS; l++) {
      pt_tensor(x, LV_N, k, (uint32_t)l);
      if (k == LV_NAN_STEP && l == 2) x[5] = NAN;
      PT_CHECK(probe_tensor_record(s, l, PROBE_SITE_FWD_OUT, PROBE_DTYPE_F32, x, LV_N));
    }
    probe_step_scalars sc = {.loss = k >= LV_NAN_STEP ? NAN : 1.0 / (double)(k + 1),
                             .loss_scale = 1.0};
    PT_CHECK(probe_step_set_scalars(s, &sc));
    PT_CHECK(probe_step_end(s));
  }
}

static probe_session *lv_session(const char *path, probe_record_mode mode) {
  probe_session *s = pt_open(path, mode);
  for (int l = 0; l < LV_LAYERS; l++) {
    char n[16];
    snprintf(n, sizeof n, "l%d", l);
    PT_CHECK(probe_layer_register(s, n, PROBE_KIND_LINEAR, PROBE_DTYPE_F16, NULL));
  }
  return s;
}

/* The rows of a table, n of them from row 0, into a zeroed buffer (the
 * padding compares equal). */
#define LV_READ_(fn, T)                                                        \
  static T *lv_##fn(probe_trace *t, int64_t n) {                               \
    T *b = calloc((size_t)n + 1, sizeof *b);                                   \
    size_t got = 0;                                                            \
    for (int64_t at = 0; at < n; at += (int64_t)got) {                         \
      PT_CHECK(probe_trace_read_##fn(t, at, (size_t)(n - at), b + at, &got));  \
      ck_assert_uint_gt(got, 0);                                               \
    }                                                                          \
    return b;                                                                  \
  }
LV_READ_(records, probe_record)
LV_READ_(steps, probe_step_scalars)
LV_READ_(snapshots, probe_snapshot_info)
#undef LV_READ_

/* t's rows equal the first rows of ref's (steps but for wall_time). */
static void lv_rows_match(probe_trace *t, probe_trace *ref, const char *what) {
  const probe_trace_info *a = probe_trace_get_info(t), *r = probe_trace_get_info(ref);
  ck_assert_msg(a->n_records <= r->n_records && a->n_steps <= r->n_steps &&
                    a->n_snapshots <= r->n_snapshots,
                "%s: more rows than the whole trace written without reads", what);
  probe_record *ra = lv_records(t, a->n_records), *rr = lv_records(ref, a->n_records);
  ck_assert_msg(memcmp(ra, rr, (size_t)a->n_records * sizeof *ra) == 0,
                "%s: /records differ from the trace written without reads", what);
  probe_step_scalars *sa = lv_steps(t, a->n_steps), *sr = lv_steps(ref, a->n_steps);
  for (int64_t i = 0; i < a->n_steps; i++) {
    ck_assert_int_eq(sa[i].step, i);
    sa[i].wall_time = sr[i].wall_time = 0;
  }
  ck_assert_msg(memcmp(sa, sr, (size_t)a->n_steps * sizeof *sa) == 0,
                "%s: /steps differ from the trace written without reads", what);
  probe_snapshot_info *na = lv_snapshots(t, a->n_snapshots),
                      *nr = lv_snapshots(ref, a->n_snapshots);
  ck_assert_msg(memcmp(na, nr, (size_t)a->n_snapshots * sizeof *na) == 0,
                "%s: /snapshots/index differs", what);
  free(ra), free(rr), free(sa), free(sr), free(na), free(nr);
  ck_assert_int_eq(pt_read_all(t), PROBE_OK);
}

/* What `probe_postmortem_json` gives for path in a fresh process: this
 * program exec'd with --read (main). */
static char *lv_json_elsewhere(const char *path) {
  int p[2];
  ck_assert_int_eq(pipe(p), 0);
  fflush(NULL);
  pid_t pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) {
    dup2(p[1], 1);
    close(p[0]);
    close(p[1]);
    execl("/proc/self/exe", "test_probe_live", "--read", path, (char *)NULL);
    _exit(127);
  }
  close(p[1]);
  size_t cap = 1 << 16, len = 0;
  char *buf = malloc(cap);
  for (ssize_t n; (n = read(p[0], buf + len, cap - len - 1)) != 0;) {
    if (n < 0 && errno == EINTR) continue;
    ck_assert_int_gt(n, 0);
    len += (size_t)n;
    if (cap - len < 2) buf = realloc(buf, cap *= 2);
  }
  buf[len] = '\0';
  close(p[0]);
  int wst = 0;
  ck_assert_int_eq(waitpid(pid, &wst, 0), pid);
  ck_assert_msg(WIFEXITED(wst) && WEXITSTATUS(wst) == 0,
                "the reader in another process: status 0x%x: %.300s",
                (unsigned)wst, buf);
  return buf;
}

/* The trace at path, written up to step k (steps 0..k-1) and flushed,
 * read in this process: every way of reading it works and says what a
 * fresh process says; its rows are those of ref's (the same steps
 * written without reads). The isolated reads come first, as in the
 * Python package (all of whose reads are isolated): a plain read before
 * them filled the writer's metadata cache, which the isolated child then
 * answered from, and hid the fault. */
static void lv_read_live(const char *path, const char *ref, int64_t k, int full,
                         const char *mode) {
  char what[160], err[512] = "";
  snprintf(what, sizeof what, "%s, read at step %lld", mode, (long long)k);
  char *other = lv_json_elsewhere(path);
  const char *paths[] = {path};
  for (int iso = 1; iso >= 0; iso--) {
    char *json = NULL;
    probe_status st = iso ? probe_postmortem_json_isolated(paths, 1, &json)
                          : probe_postmortem_json(paths, 1, &json);
    ck_assert_msg(st == PROBE_OK, "%s: postmortem_json%s: %s: %s", what,
                  iso ? "_isolated" : "", probe_status_name(st),
                  probe_trace_last_error(NULL));
    ck_assert_msg(strcmp(json, other) == 0,
                  "%s: postmortem_json%s here differs from another process's:"
                  "\n%.400s\n---\n%.400s", what, iso ? "_isolated" : "", json, other);
    probe_free(json);
    probe_verdict v = PROBE_VERDICT_HEALTHY;
    st = iso ? probe_postmortem_verdict_isolated(path, &v)
             : probe_postmortem_verdict(path, &v);
    ck_assert_msg(st == PROBE_OK, "%s: postmortem_verdict%s: %s", what,
                  iso ? "_isolated" : "", probe_status_name(st));
    /* the NaN loss is on disk from step LV_NAN_STEP on (before it, the
     * fp16 layers' over- and underflows: degraded) */
    ck_assert_msg((v == PROBE_VERDICT_DIVERGED) == (k > LV_NAN_STEP),
                  "%s: verdict %d", what, (int)v);
  }
  free(other);

  probe_trace *r = NULL;
  PT_CHECK(probe_trace_open(&r, ref));
  for (int iso = 1; iso >= 0; iso--) {
    probe_trace *t = NULL;
    probe_status st = iso ? probe_trace_open_isolated(&t, path, err, sizeof err)
                          : probe_trace_open(&t, path);
    ck_assert_msg(st == PROBE_OK, "%s, %s open: %s: %s", what,
                  iso ? "isolated" : "plain", probe_status_name(st),
                  iso ? err : probe_trace_last_error(NULL));
    const probe_trace_info *in = probe_trace_get_info(t);
    ck_assert_msg(!in->complete, "%s: a live trace reads as complete", what);
    ck_assert_int_eq(in->n_steps, k);
    ck_assert_int_eq(in->last_step, k - 1);
    if (full) ck_assert_int_eq(in->n_records, k * LV_LAYERS);
    size_t nl = 0;
    probe_trace_layers(t, &nl);
    ck_assert_uint_eq(nl, LV_LAYERS);
    lv_rows_match(t, r, what);
    probe_trace_close(t);
  }
  probe_trace_close(r);
}

/* The finished trace at path equals ref (both complete, same rows). */
static void lv_same_trace(const char *path, const char *ref, const char *what) {
  probe_trace *t = NULL, *r = NULL;
  PT_CHECK(probe_trace_open(&t, path));
  PT_CHECK(probe_trace_open(&r, ref));
  const probe_trace_info *a = probe_trace_get_info(t), *b = probe_trace_get_info(r);
  ck_assert_msg(a->complete && b->complete, "%s: not complete", what);
  ck_assert_int_eq(a->n_steps, b->n_steps);
  ck_assert_int_eq(a->n_records, b->n_records);
  ck_assert_int_eq(a->n_snapshots, b->n_snapshots);
  ck_assert_int_eq(a->n_snapshot_elems, b->n_snapshot_elems);
  ck_assert_int_eq(a->n_events, b->n_events);
  ck_assert_int_eq(a->last_step, b->last_step);
  ck_assert_int_eq(a->first_nonfinite_step, b->first_nonfinite_step);
  ck_assert_int_eq(a->n_steps, LV_STEPS);
  lv_rows_match(t, r, what);
  probe_trace_close(t);
  probe_trace_close(r);
  probe_verdict va, vb;
  PT_CHECK(probe_postmortem_verdict(path, &va));
  PT_CHECK(probe_postmortem_verdict(ref, &vb));
  ck_assert_int_eq(va, vb);
}

/* Writes ref (no reads), then path with reads every LV_EVERY steps; with
 * two, a second session writes path2 in the other mode meanwhile, read as
 * well. */
static void lv_case(probe_record_mode mode, int two) {
  probe_record_mode mode2 = mode == PROBE_MODE_FULL ? PROBE_MODE_SCALARS : PROBE_MODE_FULL;
  const char *name[2] = {"flight recorder", "full"};
  char ref[256], ref2[256], path[256], path2[256], what[96];
  pt_path(ref, sizeof ref, "live-ref");
  pt_path(ref2, sizeof ref2, "live-ref2");
  pt_path(path, sizeof path, "live");
  pt_path(path2, sizeof path2, "live2");
  for (int i = 0; i < 1 + two; i++) {
    probe_session *s = lv_session(i ? ref2 : ref, i ? mode2 : mode);
    lv_write(s, 0, LV_STEPS);
    PT_CHECK(probe_session_close(s));
  }
  probe_session *a = lv_session(path, mode);
  probe_session *b = two ? lv_session(path2, mode2) : NULL;
  for (int64_t k = 0; k < LV_STEPS; k += LV_EVERY) {
    lv_write(a, k, k + LV_EVERY);
    if (b) lv_write(b, k, k + LV_EVERY);
    PT_CHECK(probe_session_flush(a));
    if (b) PT_CHECK(probe_session_flush(b));
    snprintf(what, sizeof what, "%s%s", name[mode], two ? " (of two sessions)" : "");
    lv_read_live(path, ref, k + LV_EVERY, mode == PROBE_MODE_FULL, what);
    if (b) {
      snprintf(what, sizeof what, "%s (the second session)", name[mode2]);
      lv_read_live(path2, ref2, k + LV_EVERY, mode2 == PROBE_MODE_FULL, what);
    }
  }
  PT_CHECK(probe_session_close(a));
  if (b) PT_CHECK(probe_session_close(b));
  lv_same_trace(path, ref, name[mode]);
  if (b) lv_same_trace(path2, ref2, name[mode2]);
  unlink(ref), unlink(ref2), unlink(path), unlink(path2);
}

START_TEST(live_read_full) { lv_case(PROBE_MODE_FULL, 0); }
END_TEST

START_TEST(live_read_flight_recorder) { lv_case(PROBE_MODE_SCALARS, 0); }
END_TEST

START_TEST(live_read_two_sessions) { lv_case(PROBE_MODE_FULL, 1); }
END_TEST

/* A reader left open in the process pins HDF5's view of its file: a later
 * open of the same file shares that reader's HDF5 state, stale once the
 * writer has flushed more (HDF5 hands an open of a file already open
 * through the same driver that open's state). It was "corrupt trace:
 * /meta/state counts 16 rows of /steps, the table has 8"; it is refused,
 * saying why, and reads again once the other reader is closed. A reader
 * of a file that has not changed since it opened it does not stand in the
 * way (a finished trace opened twice). */
START_TEST(live_read_with_a_reader_held_open) {
  char path[256], ref[256], err[512] = "";
  pt_path(path, sizeof path, "held");
  pt_path(ref, sizeof ref, "held-ref");
  probe_session *r0 = lv_session(ref, PROBE_MODE_FULL);
  lv_write(r0, 0, 2 * LV_EVERY);
  PT_CHECK(probe_session_close(r0));
  probe_session *s = lv_session(path, PROBE_MODE_FULL);
  lv_write(s, 0, LV_EVERY);
  PT_CHECK(probe_session_flush(s));
  probe_trace *held = NULL, *t = NULL;
  PT_CHECK(probe_trace_open(&held, path));
  lv_write(s, LV_EVERY, 2 * LV_EVERY);
  PT_CHECK(probe_session_flush(s));
  const char *paths[] = {path};
  char *json = NULL;
  probe_verdict v;
  for (int how = 0; how < 4; how++) {
    probe_status st = how == 0   ? probe_trace_open(&t, path)
                      : how == 1 ? probe_trace_open_isolated(&t, path, err, sizeof err)
                      : how == 2 ? probe_postmortem_json_isolated(paths, 1, &json)
                                 : probe_postmortem_verdict_isolated(path, &v);
    const char *msg = how == 1 ? err : probe_trace_last_error(NULL);
    ck_assert_msg(st == PROBE_ERR_STATE, "read %d with a reader held: %s: %s",
                  how, probe_status_name(st), msg);
    ck_assert_msg(strstr(msg, "open in this process by a reader not closed"),
                  "read %d: '%s'", how, msg);
    ck_assert_msg(!strstr(msg, "corrupt"), "read %d: '%s'", how, msg);
  }
  /* the held reader still reads what it opened */
  ck_assert_int_eq(probe_trace_get_info(held)->n_steps, LV_EVERY);
  ck_assert_int_eq(pt_read_all(held), PROBE_OK);
  probe_trace_close(held);
  lv_read_live(path, ref, 2 * LV_EVERY, 1, "after the held reader closed");
  PT_CHECK(probe_session_close(s));
  /* a finished trace: two readers at once */
  PT_CHECK(probe_trace_open(&held, path));
  PT_CHECK(probe_trace_open_isolated(&t, path, err, sizeof err));
  ck_assert_int_eq(probe_trace_get_info(t)->n_steps, 2 * LV_EVERY);
  PT_CHECK(probe_postmortem_verdict_isolated(path, &v));
  probe_trace_close(t);
  probe_trace_close(held);
  unlink(path), unlink(ref);
}
END_TEST

/* --read PATH: the reader in another process (lv_json_elsewhere). */
static int read_elsewhere(const char *path) {
  const char *paths[] = {path};
  char *json = NULL;
  probe_status st = probe_postmortem_json(paths, 1, &json);
  if (st != PROBE_OK) {
    printf("%s: %s", probe_status_name(st), probe_trace_last_error(NULL));
    return 3;
  }
  fputs(json, stdout);
  probe_free(json);
  return 0;
}

int main(int argc, char **argv) {
  if (argc == 3 && strcmp(argv[1], "--read") == 0) return read_elsewhere(argv[2]);
  Suite *su = suite_create("live");
  TCase *tc = tcase_create("live");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, live_read_full);
  tcase_add_test(tc, live_read_flight_recorder);
  tcase_add_test(tc, live_read_two_sessions);
  tcase_add_test(tc, live_read_with_a_reader_held_open);
  suite_add_tcase(su, tc);
  SRunner *sr = srunner_create(su);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
