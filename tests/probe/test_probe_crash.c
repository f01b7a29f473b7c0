/*
 * test_probe_crash.c - Check suite "crash": the writer survives its own
 * death and the file-size limit.
 *
 * SIGKILL: a child writes a full trace continuously, flushing every 1-4
 * steps, and after each flush reports the step through a pipe; the parent
 * kills it at a random moment, then opens the trace and checks that every
 * record and step up to the last reported flush is there, each equal to what
 * the child computed (values derive from step and seq), and that nothing
 * past the committed rows is torn. Repeated KILLS times with random seeds.
 *
 * The first NaN activation or loss after the loss scaler's routine
 * overflows is on disk when probe_step_end returns (a kill then keeps it).
 *
 * RLIMIT_FSIZE: a child with a small file-size limit writes until the API
 * returns PROBE_ERR_NOSPACE; it must not be killed by SIGXFSZ, and the
 * trace must still open with every step flushed before the error.
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>

#include "probe_testutil.h"

enum { KILLS = 24, LAYERS = 4, SITES = 2, N = 96 };

/* The writer loop of the child: never returns. It flushes explicitly every
 * 1-4 steps and reports each flushed step through wfd; with timer, it
 * flushes and reports step 0 only, and then only the writer thread's timer
 * flushes (every 5-20 ms). */
static void crash_child(const char *path, int wfd, unsigned seed, int timer) {
  probe_options o;
  probe_options_init(&o);
  o.mode = PROBE_MODE_FULL;
  o.flush_seconds = timer ? 0.005 * (1 + seed % 4) : 1e9;
  o.batch_rows = 1 + seed % 50;
  o.overwrite = 1; /* one path for every kill */
  int every = timer ? 1 << 30 : 1 + (int)(seed % 4);
  probe_session *s;
  if (probe_session_open(&s, path, &o) != PROBE_OK) _exit(2);
  static const char *const names[LAYERS] = {"in", "enc.lin", "enc.bn",
                                            "head"};
  for (int l = 0; l < LAYERS; l++)
    if (probe_layer_register(s, names[l], PROBE_KIND_OTHER, PROBE_DTYPE_F16,
                             NULL) != PROBE_OK)
      _exit(3);
  float x[LAYERS * SITES][N];
  for (int64_t step = 0; step < 1000000; step++) {
    if (probe_step_begin(s, step) != PROBE_OK) _exit(4);
    uint32_t seq = 0;
    for (int l = 0; l < LAYERS; l++)
      for (int k = 0; k < SITES; k++, seq++) {
        pt_tensor(x[seq], N, step, seq);
        if (probe_tensor_record(s, l, k ? PROBE_SITE_GRAD_IN
                                        : PROBE_SITE_FWD_OUT,
                                PROBE_DTYPE_F32, x[seq], N) != PROBE_OK)
          _exit(5);
      }
    probe_step_scalars sc = {.loss = (double)step * 0.5,
                             .loss_scale = 1024.0,
                             .growth_tracker = (int32_t)(step % 7)};
    if (probe_step_set_scalars(s, &sc) != PROBE_OK) _exit(6);
    if (step % 10 == 3) {
      probe_scaler_event ev = {.kind = PROBE_SCALER_GROWTH,
                               .old_scale = (double)step,
                               .new_scale = 2.0 * (double)step};
      if (probe_scaler_transition(s, &ev) != PROBE_OK) _exit(7);
    }
    if (probe_step_end(s) != PROBE_OK) _exit(8);
    if ((step + 1) % every == 0 || (timer && step == 0)) {
      if (probe_session_flush(s) != PROBE_OK) _exit(9);
      if (write(wfd, &step, sizeof step) != (ssize_t)sizeof step) _exit(10);
    }
  }
  _exit(11);
}

/* Checks the killed writer's trace: everything up to last_flushed. */
static void verify_trace(const char *path, int64_t last_flushed) {
  probe_trace *t = NULL;
  probe_status st = probe_trace_open(&t, path);
  ck_assert_msg(st == PROBE_OK, "open after kill: %s",
                probe_trace_last_error(NULL));
  const probe_trace_info *in = probe_trace_get_info(t);
  ck_assert_int_eq(in->complete, 0);
  ck_assert_int_eq(in->n_layers, LAYERS);
  ck_assert_int_ge(in->last_step, last_flushed);
  ck_assert_int_ge(in->n_steps, last_flushed + 1);
  ck_assert_int_ge(in->n_records, (last_flushed + 1) * LAYERS * SITES);
  ck_assert_int_eq(in->n_records % (LAYERS * SITES), 0);
  /* Every committed record, in order, equal to what the child wrote. */
  probe_record buf[64];
  size_t got;
  int64_t row = 0;
  do {
    st = probe_trace_read_records(t, row, 64, buf, &got);
    ck_assert_msg(st == PROBE_OK, "%s", probe_trace_last_error(t));
    for (size_t i = 0; i < got; i++, row++) {
      int64_t step = row / (LAYERS * SITES);
      uint32_t seq = (uint32_t)(row % (LAYERS * SITES));
      ck_assert_int_eq(buf[i].step, step);
      ck_assert_uint_eq(buf[i].seq, seq);
      ck_assert_int_eq(buf[i].layer, (int)(seq / SITES));
      probe_stats want;
      pt_expected(&want, N, step, seq);
      ck_assert_msg(memcmp(&want, &buf[i].stats, sizeof want) == 0,
                    "record row %lld differs", (long long)row);
    }
  } while (got > 0);
  ck_assert_int_eq(row, in->n_records);
  probe_step_scalars sc[64];
  row = 0;
  do {
    PT_CHECK(probe_trace_read_steps(t, row, 64, sc, &got));
    for (size_t i = 0; i < got; i++, row++) {
      ck_assert_int_eq(sc[i].step, row);
      ck_assert_double_eq(sc[i].loss, (double)row * 0.5);
      ck_assert_int_eq(sc[i].growth_tracker, (int)(row % 7));
    }
  } while (got > 0);
  probe_scaler_event ev[64];
  row = 0;
  do {
    PT_CHECK(probe_trace_read_scaler_events(t, row, 64, ev, &got));
    for (size_t i = 0; i < got; i++, row++) {
      ck_assert_int_eq(ev[i].step, 10 * row + 3);
      ck_assert_double_eq(ev[i].new_scale, 2.0 * (double)ev[i].step);
    }
  } while (got > 0);
  ck_assert_int_ge(row, (last_flushed + 7) / 10);
  probe_trace_close(t);
}

/* Reads every complete int64 the child sent; returns the last or -1. */
static int64_t drain(int fd, int wait_first_ms) {
  int64_t last = -1, v;
  struct pollfd p = {fd, POLLIN, 0};
  if (wait_first_ms > 0) poll(&p, 1, wait_first_ms);
  for (;;) {
    if (poll(&p, 1, 0) <= 0) break;
    ssize_t r = read(fd, &v, sizeof v);
    if (r != (ssize_t)sizeof v) break;
    last = v;
  }
  return last;
}

START_TEST(test_crash_sigkill) {
  char path[256];
  pt_path(path, sizeof path, "crash");
  unsigned seed = (unsigned)time(NULL);
  srand(seed);
  int verified = 0;
  for (int k = 0; k < KILLS; k++) {
    unsigned cs = (unsigned)rand();
    int fds[2];
    ck_assert_int_eq(pipe(fds), 0);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
      close(fds[0]);
      crash_child(path, fds[1], cs, 0);
    }
    close(fds[1]);
    /* Wait for a first flush, then kill after 0-40 ms more writing. */
    int64_t last = drain(fds[0], 5000);
    struct timespec ts = {0, (long)(rand() % 40) * 1000000L};
    nanosleep(&ts, NULL);
    kill(pid, SIGKILL);
    int wst;
    waitpid(pid, &wst, 0);
    ck_assert_msg(WIFSIGNALED(wst) && WTERMSIG(wst) == SIGKILL,
                  "child ended by itself (status %d), seed %u", wst, seed);
    int64_t later = drain(fds[0], 0);
    if (later > last) last = later;
    close(fds[0]);
    ck_assert_msg(last >= 0, "child never flushed (seed %u)", seed);
    verify_trace(path, last);
    verified++;
  }
  ck_assert_int_ge(verified, 20);
  unlink(path);
}
END_TEST

/* The child of the file-size test: exit status 0 when the API reported
 * PROBE_ERR_NOSPACE; with wfd >= 0 it flushes every 5 steps (synchronous)
 * and the last flushed step goes to the pipe; with wfd < 0 only the writer
 * thread's timer flushes, and its error must come back at a later call. */
static void fsize_child(const char *path, int wfd) {
  struct rlimit rl = {2 << 20, 2 << 20};
  if (setrlimit(RLIMIT_FSIZE, &rl) != 0) _exit(20);
  probe_options o;
  probe_options_init(&o);
  o.mode = PROBE_MODE_FULL;
  o.flush_steps = wfd >= 0 ? 5 : 0;
  o.flush_seconds = wfd >= 0 ? 1e9 : 0.002;
  probe_session *s;
  if (probe_session_open(&s, path, &o) != PROBE_OK) _exit(21);
  for (int l = 0; l < LAYERS; l++) {
    char name[16];
    snprintf(name, sizeof name, "layer%d", l);
    if (probe_layer_register(s, name, PROBE_KIND_OTHER, PROBE_DTYPE_F16,
                             NULL) != PROBE_OK)
      _exit(22);
  }
  float x[LAYERS * SITES][N];
  probe_status st = PROBE_OK;
  for (int64_t step = 0; step < 100000 && st == PROBE_OK; step++) {
    if ((st = probe_step_begin(s, step)) != PROBE_OK) break;
    uint32_t seq = 0;
    for (int l = 0; l < LAYERS && st == PROBE_OK; l++)
      for (int k = 0; k < SITES && st == PROBE_OK; k++, seq++) {
        pt_tensor(x[seq], N, step, seq);
        st = probe_tensor_record(s, l,
                                 k ? PROBE_SITE_GRAD_IN : PROBE_SITE_FWD_OUT,
                                 PROBE_DTYPE_F32, x[seq], N);
      }
    probe_step_scalars sc = {.loss = (double)step * 0.5, .loss_scale = 1024.0,
                             .growth_tracker = (int32_t)(step % 7)};
    if (st == PROBE_OK) st = probe_step_set_scalars(s, &sc);
    if (st == PROBE_OK && step % 10 == 3) {
      probe_scaler_event ev = {.kind = PROBE_SCALER_GROWTH,
                               .old_scale = (double)step,
                               .new_scale = 2.0 * (double)step};
      st = probe_scaler_transition(s, &ev);
    }
    if (st == PROBE_OK) st = probe_step_end(s);
    if (st == PROBE_OK && wfd >= 0 && (step + 1) % 5 == 0)
      if (write(wfd, &step, sizeof step) != (ssize_t)sizeof step) _exit(23);
    /* timer-only: one explicit flush first, so that the trace surely
     * holds the layers and 20 steps however late the writer thread runs
     * (a writer behind by megabytes hits the limit check sooner) */
    if (st == PROBE_OK && wfd < 0 && step == 19) st = probe_session_flush(s);
  }
  int msg_ok = strstr(probe_session_last_error(s), "limit") != NULL;
  probe_status cst = probe_session_close(s);
  if (st != PROBE_ERR_NOSPACE) _exit(24);
  if (cst != PROBE_ERR_NOSPACE) _exit(25);
  if (!msg_ok) _exit(26);
  _exit(0);
}

START_TEST(test_fsize_limit) {
  char path[256];
  pt_path(path, sizeof path, "fsize");
  int fds[2];
  ck_assert_int_eq(pipe(fds), 0);
  pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    signal(SIGXFSZ, SIG_DFL); /* as a fresh host program has it */
    fsize_child(path, fds[1]);
  }
  close(fds[1]);
  int wst;
  waitpid(pid, &wst, 0);
  int64_t last = drain(fds[0], 0);
  close(fds[0]);
  ck_assert_msg(!WIFSIGNALED(wst), "writer killed by signal %d",
                WIFSIGNALED(wst) ? WTERMSIG(wst) : 0);
  ck_assert_msg(WIFEXITED(wst) && WEXITSTATUS(wst) == 0, "writer exit %d",
                WEXITSTATUS(wst));
  ck_assert_int_gt(last, 10);
  verify_trace(path, last);
  unlink(path);
}
END_TEST

/* A limit below what creating a trace needs: probe_session_open returns
 * before the writer thread has created the file (the path itself is
 * writable), and the writer refuses to start under such a limit
 * (PROBE_ERR_NOSPACE, "too small for a trace"): the session's sticky
 * error, returned by the next calls and by close. SIGXFSZ is at its
 * default action and nothing past the limit is written, so it never
 * comes. */
START_TEST(test_fsize_limit_at_open) {
  char path[256];
  pt_path(path, sizeof path, "fsize0");
  pid_t pid = fork();
  if (pid == 0) {
    signal(SIGXFSZ, SIG_DFL);
    struct rlimit rl = {2048, 2048};
    if (setrlimit(RLIMIT_FSIZE, &rl) != 0) _exit(20);
    probe_session *s = NULL;
    probe_status st = probe_session_open(&s, path, NULL);
    if (st != PROBE_OK || s == NULL) _exit(21);
    /* a synchronous flush waits for the writer thread, which has failed */
    st = probe_session_flush(s);
    if (st != PROBE_ERR_NOSPACE) _exit(22);
    if (strstr(probe_session_last_error(s), "too small for a trace") == NULL)
      _exit(23);
    int32_t id;
    if (probe_layer_register(s, "l", PROBE_KIND_LINEAR, PROBE_DTYPE_F16, &id) !=
        PROBE_ERR_NOSPACE)
      _exit(24);
    if (probe_session_close(s) != PROBE_ERR_NOSPACE) _exit(25);
    _exit(0);
  }
  int wst;
  waitpid(pid, &wst, 0);
  ck_assert_msg(!WIFSIGNALED(wst), "killed by signal %d",
                WIFSIGNALED(wst) ? WTERMSIG(wst) : 0);
  ck_assert_msg(WIFEXITED(wst) && WEXITSTATUS(wst) == 0, "child exit %d",
                WEXITSTATUS(wst));
  unlink(path);
}
END_TEST

/* SIGKILL with only the writer thread's timer flushing (after a first
 * explicit flush of step 0): whatever it had committed is there and whole.
 * (That the timer flushes at all: test_probe's idle timer test.) */
START_TEST(test_crash_sigkill_timer) {
  char path[256];
  pt_path(path, sizeof path, "crasht");
  unsigned seed = (unsigned)time(NULL);
  srand(seed);
  for (int k = 0; k < 8; k++) {
    unsigned cs = (unsigned)rand();
    int fds[2];
    ck_assert_int_eq(pipe(fds), 0);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
      close(fds[0]);
      crash_child(path, fds[1], cs, 1);
    }
    close(fds[1]);
    int64_t first = drain(fds[0], 5000);
    struct timespec ts = {0, (20 + (long)(rand() % 100)) * 1000000L};
    nanosleep(&ts, NULL);
    kill(pid, SIGKILL);
    int wst;
    waitpid(pid, &wst, 0);
    close(fds[0]);
    ck_assert_msg(WIFSIGNALED(wst) && WTERMSIG(wst) == SIGKILL,
                  "child ended by itself (status %d), seed %u", wst, seed);
    ck_assert_msg(first == 0, "child never flushed (seed %u)", seed);
    verify_trace(path, 0);
  }
  unlink(path);
}
END_TEST

/* The file-size limit hit by a timer flush of the writer thread: the error
 * comes back to the caller at a later call and at close. */
START_TEST(test_fsize_limit_async) {
  char path[256];
  pt_path(path, sizeof path, "fsizea");
  pid_t pid = fork();
  if (pid == 0) {
    signal(SIGXFSZ, SIG_DFL);
    fsize_child(path, -1);
  }
  int wst;
  waitpid(pid, &wst, 0);
  ck_assert_msg(!WIFSIGNALED(wst), "writer killed by signal %d",
                WIFSIGNALED(wst) ? WTERMSIG(wst) : 0);
  ck_assert_msg(WIFEXITED(wst) && WEXITSTATUS(wst) == 0, "writer exit %d",
                WEXITSTATUS(wst));
  verify_trace(path, 19);
  probe_trace *t;
  PT_CHECK(probe_trace_open(&t, path));
  ck_assert_int_ge(probe_trace_get_info(t)->n_steps, 20);
  probe_trace_close(t);
  unlink(path);
}
END_TEST

/* The first real NaN after routine scaler overflows (2026-12-03: a crash
 * within a second of it lost the diagnosis). A child with no timer flush
 * writes gradient-only overflows (at steps 0 and, with max_events 1, 9:
 * the first opens a quiet window, the second is past max_events), then at
 * step `bad` a NaN activation (or a NaN loss); as soon as probe_step_end
 * of that step returns it says so and waits to be killed. The trace must
 * hold that step's NaN. */
enum { QW_FWD = 0, QW_LOSS = 1 };

static void quiet_child(const char *path, int wfd, probe_record_mode mode, int what,
                        int max_events, int64_t bad) {
  probe_options o;
  probe_options_init(&o);
  o.mode = mode;
  o.flush_seconds = 1e9; /* no timer: only events and close flush */
  o.overwrite = 1;
  o.max_events = max_events;
  probe_session *s;
  if (probe_session_open(&s, path, &o) != PROBE_OK) _exit(2);
  if (probe_layer_register(s, "fc", PROBE_KIND_LINEAR, PROBE_DTYPE_F16, NULL) != PROBE_OK)
    _exit(3);
  float x[N], g[N];
  for (int64_t step = 0; step <= bad; step++) {
    if (probe_step_begin(s, step) != PROBE_OK) _exit(4);
    pt_tensor(x, N, step, 0);
    pt_tensor(g, N, step, 1);
    if (what == QW_FWD && step == bad) x[5] = NAN;
    if (step == 0 || step == 9) g[7] = INFINITY; /* the scaler's overflow */
    if (probe_tensor_record(s, 0, PROBE_SITE_FWD_OUT, PROBE_DTYPE_F32, x, N) != PROBE_OK ||
        probe_tensor_record(s, 0, PROBE_SITE_GRAD_IN, PROBE_DTYPE_F32, g, N) != PROBE_OK)
      _exit(5);
    probe_step_scalars sc = {.loss = what == QW_LOSS && step == bad ? NAN : 1.0,
                             .loss_scale = 1024.0, .found_inf = step == 0 || step == 9,
                             .skipped = step == 0 || step == 9};
    if (probe_step_set_scalars(s, &sc) != PROBE_OK) _exit(6);
    if (probe_step_end(s) != PROBE_OK) _exit(8);
  }
  if (write(wfd, &bad, sizeof bad) != (ssize_t)sizeof bad) _exit(10);
  for (;;) pause();
}

START_TEST(test_first_nan_in_quiet_window) {
  char path[256];
  pt_path(path, sizeof path, "quiet");
  const probe_record_mode modes[2] = {PROBE_MODE_FULL, PROBE_MODE_SCALARS};
  /* (max_events, bad step): inside the window of step 0's overflow; past
   * max_events, inside the window of step 9's */
  const int64_t cases[2][2] = {{16, 3}, {1, 12}};
  for (int m = 0; m < 2; m++)
    for (int what = 0; what < 2; what++)
      for (int c = 0; c < 2; c++) {
        int fds[2];
        ck_assert_int_eq(pipe(fds), 0);
        pid_t pid = fork();
        ck_assert_int_ge(pid, 0);
        if (pid == 0) {
          close(fds[0]);
          quiet_child(path, fds[1], modes[m], what, (int)cases[c][0], cases[c][1]);
        }
        close(fds[1]);
        int64_t got = drain(fds[0], 20000);
        kill(pid, SIGKILL);
        int wst;
        waitpid(pid, &wst, 0);
        close(fds[0]);
        ck_assert_int_eq(got, cases[c][1]);
        probe_trace *t = NULL;
        PT_CHECK(probe_trace_open(&t, path));
        int found = 0;
        if (what == QW_LOSS) {
          probe_step_scalars sc[32];
          size_t n = 0;
          PT_CHECK(probe_trace_read_steps(t, 0, 32, sc, &n));
          for (size_t i = 0; i < n; i++)
            if (sc[i].step == got && isnan(sc[i].loss)) found = 1;
        } else {
          probe_record r[64];
          size_t n = 0;
          PT_CHECK(probe_trace_read_records(t, 0, 64, r, &n));
          for (size_t i = 0; i < n; i++)
            if (r[i].step == got && r[i].site == PROBE_SITE_FWD_OUT &&
                probe_stats_nonfinite(&r[i].stats) > 0)
              found = 1;
        }
        probe_trace_close(t);
        ck_assert_msg(found, "%s mode, NaN %s at step %lld (max_events %lld): "
                      "not in the trace after the kill",
                      m ? "scalars" : "full", what ? "loss" : "activation",
                      (long long)got, (long long)cases[c][0]);
      }
  unlink(path);
}
END_TEST

static Suite *make_crash_suite(void) {
  Suite *s = suite_create("crash");
  TCase *tc = tcase_create("crash");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_crash_sigkill);
  tcase_add_test(tc, test_crash_sigkill_timer);
  tcase_add_test(tc, test_first_nan_in_quiet_window);
  tcase_add_test(tc, test_fsize_limit);
  tcase_add_test(tc, test_fsize_limit_async);
  tcase_add_test(tc, test_fsize_limit_at_open);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  SRunner *sr = srunner_create(make_crash_suite());
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? 0 : 1;
}
