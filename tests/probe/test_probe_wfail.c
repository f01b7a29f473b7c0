/*
 * test_probe_wfail.c - Check suites "wfail" and "claim": write failures
 * end in one clean error, and a trace has one writer.
 *
 * wfail: a child process writes a trace under a file-size limit, on a full
 * file system, or onto /dev/null and /dev/full, and then returns from its
 * work through exit() - so that atexit handlers run, where HDF5's clean-up
 * crashed after a failed write (SIGSEGV in H5F__close_cb, issue 17.1). The
 * parent checks: no signal, the status the child saw (PROBE_ERR_NOSPACE or
 * PROBE_ERR_IO, sticky to close), a one-line message, nothing at all on
 * stderr (no HDF5 error stack), and that the trace opens with every step
 * the child saw flushed.
 *
 * claim: traces are created exclusively (PROBE_ERR_EXISTS unless
 * overwrite), must be regular files, and a trace being written is locked
 * (PROBE_ERR_LOCKED for a second writer, in this process or another, at
 * once; released at close and when the writer dies).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>

#include "probe_testutil.h"

enum { N = 256, LAYERS = 3 };

/* ---- a child that writes until the API fails ---------------------------- */

typedef struct wjob {
  const char *path;
  long long fsize;  /* RLIMIT_FSIZE in bytes, -1: none */
  int sigxfsz_ign;  /* 1: SIGXFSZ ignored (as the CLI does), 0: default */
  int overwrite;
  int flush_steps;
  int max_steps;
} wjob;

/* What the child tells the parent, through a pipe, at its end. */
typedef struct wresult {
  int32_t open_st, loop_st, close_st;
  int64_t last_flushed; /* last step of a completed synchronous flush */
  int64_t last_ended;   /* last step whose probe_step_end succeeded */
  char msg[300];
} wresult;

/* Child: returns the exit code; the result goes to rfd. */
static int wchild(const wjob *j, int rfd) {
  wresult r;
  memset(&r, 0, sizeof r);
  r.last_flushed = -1;
  r.last_ended = -1;
  signal(SIGXFSZ, j->sigxfsz_ign ? SIG_IGN : SIG_DFL);
  if (j->fsize >= 0) {
    struct rlimit rl = {(rlim_t)j->fsize, (rlim_t)j->fsize};
    if (setrlimit(RLIMIT_FSIZE, &rl) != 0) return 20;
  }
  probe_options o;
  probe_options_init(&o);
  o.mode = PROBE_MODE_FULL;
  o.flush_steps = j->flush_steps;
  o.flush_seconds = 1e9;
  o.overwrite = j->overwrite;
  probe_session *s = NULL;
  r.open_st = probe_session_open(&s, j->path, &o);
  probe_status st = (probe_status)r.open_st;
  if (st != PROBE_OK) {
    snprintf(r.msg, sizeof r.msg, "%s", probe_session_last_error(NULL));
  } else {
    for (int l = 0; l < LAYERS && st == PROBE_OK; l++) {
      char name[16];
      snprintf(name, sizeof name, "layer%d", l);
      st = probe_layer_register(s, name, PROBE_KIND_LINEAR, PROBE_DTYPE_F16,
                                NULL);
    }
    float x[LAYERS][N];
    for (int64_t step = 0; step < j->max_steps && st == PROBE_OK; step++) {
      st = probe_step_begin(s, step);
      for (int l = 0; l < LAYERS && st == PROBE_OK; l++) {
        pt_tensor(x[l], N, step, (uint32_t)l);
        st = probe_tensor_record(s, l, PROBE_SITE_FWD_OUT, PROBE_DTYPE_F32,
                                 x[l], N);
      }
      probe_step_scalars sc = {.loss = (double)step, .loss_scale = 1.0};
      if (st == PROBE_OK) st = probe_step_set_scalars(s, &sc);
      if (st == PROBE_OK) st = probe_step_end(s);
      if (st == PROBE_OK) r.last_ended = step;
      if (st == PROBE_OK && j->flush_steps > 0 &&
          (step + 1) % j->flush_steps == 0)
        r.last_flushed = step;
    }
    r.loop_st = st;
    snprintf(r.msg, sizeof r.msg, "%s", probe_session_last_error(s));
    r.close_st = probe_session_close(s);
  }
  if (write(rfd, &r, sizeof r) != (ssize_t)sizeof r) return 21;
  return 0;
}

typedef struct wrun {
  int signaled, sig, code;
  wresult r;
  char err[4096]; /* the child's stderr */
} wrun;

/* Runs the job in a child that ends with exit() (atexit handlers run). */
static void wrun_job(const wjob *j, wrun *out) {
  memset(out, 0, sizeof *out);
  int rp[2], ep[2];
  ck_assert_int_eq(pipe(rp), 0);
  ck_assert_int_eq(pipe(ep), 0);
  fflush(NULL);
  pid_t pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) {
    close(rp[0]);
    close(ep[0]);
    dup2(ep[1], 2);
    exit(wchild(j, rp[1])); /* exit, not _exit: HDF5's atexit runs */
  }
  close(rp[1]);
  close(ep[1]);
  size_t have = 0;
  for (;;) {
    ssize_t n = read(ep[0], out->err + have, sizeof out->err - 1 - have);
    if (n <= 0) break;
    have += (size_t)n;
    if (have == sizeof out->err - 1) break;
  }
  out->err[have] = '\0';
  ssize_t got = read(rp[0], &out->r, sizeof out->r);
  close(rp[0]);
  close(ep[0]);
  int wst;
  waitpid(pid, &wst, 0);
  out->signaled = WIFSIGNALED(wst);
  out->sig = out->signaled ? WTERMSIG(wst) : 0;
  out->code = WIFEXITED(wst) ? WEXITSTATUS(wst) : -1;
  if (!out->signaled && out->code == 0)
    ck_assert_int_eq(got, (ssize_t)sizeof out->r);
}

/* The common verdict: no signal, clean exit, nothing on stderr, one line. */
static void wrun_clean(const wrun *w, const char *what) {
  ck_assert_msg(!w->signaled, "%s: child killed by signal %d", what, w->sig);
  ck_assert_msg(w->code == 0, "%s: child exit %d", what, w->code);
  ck_assert_msg(w->err[0] == '\0', "%s: stderr not empty: '%s'", what,
                w->err);
  ck_assert_msg(w->r.msg[0] && strchr(w->r.msg, '\n') == NULL,
                "%s: message '%s'", what, w->r.msg);
}

/* The trace holds every step up to last_flushed (when >= 0). */
static void trace_holds(const char *path, int64_t last_flushed) {
  if (last_flushed < 0) return;
  probe_trace *t = NULL;
  char err[512];
  probe_status st = probe_trace_open_isolated(&t, path, err, sizeof err);
  ck_assert_msg(st == PROBE_OK, "%s: %s", path, err);
  ck_assert_int_ge(probe_trace_get_info(t)->n_steps, last_flushed + 1);
  ck_assert_int_ge(probe_trace_get_info(t)->last_step, last_flushed);
  probe_step_scalars sc[8];
  size_t got = 0;
  PT_CHECK(probe_trace_read_steps(t, last_flushed, 1, sc, &got));
  ck_assert_uint_eq(got, 1);
  ck_assert_int_eq(sc[0].step, last_flushed);
  ck_assert(sc[0].loss == (double)last_flushed);
  probe_trace_close(t);
}

/* The file-size limit, SIGXFSZ ignored as the CLI does: limits below what
 * a trace needs (0, 100 KiB: `ulimit -f 0`, `ulimit -f 100`) and above. */
START_TEST(test_wfail_fsize) {
  static const long long limits[] = {0, 4096, 100 << 10, 300 << 10,
                                     700 << 10, 1500 << 10};
  for (size_t k = 0; k < sizeof limits / sizeof limits[0]; k++) {
    char path[256], what[64];
    snprintf(what, sizeof what, "fsize%lld", limits[k]);
    pt_path(path, sizeof path, what);
    unlink(path);
    wjob j = {path, limits[k], 1, 0, 3, 1000000};
    wrun w;
    wrun_job(&j, &w);
    wrun_clean(&w, what);
    ck_assert_int_eq(w.r.open_st, PROBE_OK);
    ck_assert_msg(w.r.loop_st == PROBE_ERR_NOSPACE, "%s: %s (%s)", what,
                  probe_status_name(w.r.loop_st), w.r.msg);
    ck_assert_int_eq(w.r.close_st, PROBE_ERR_NOSPACE);
    ck_assert_msg(strstr(w.r.msg, "limit") != NULL, "%s: '%s'", what,
                  w.r.msg);
    if (limits[k] >= (700 << 10)) ck_assert_int_gt(w.r.last_flushed, 10);
    trace_holds(path, w.r.last_flushed);
    unlink(path);
  }
}
END_TEST

/* Only the writer thread's own flushes (none within the run: flush_seconds
 * is huge, flush_steps 0): at the limit, what was written is committed
 * (the pending step scalars too), so the trace holds every step ended but
 * at most one batch of /steps rows, not the none of its last flush. */
START_TEST(test_wfail_fsize_commit_at_limit) {
  /* several limits, so that the limit falls in different places: inside a
   * /records chunk, inside a /steps chunk (where the commit must leave the
   * half-written table alone: "offset exceeds dimensions" under ASan's
   * timing before), between batches */
  static const long long limits[] = {600 << 10, 700 << 10, 800 << 10,
                                     1 << 20, 1536 << 10, 3 << 20};
  for (size_t k = 0; k < sizeof limits / sizeof limits[0]; k++) {
    char path[256], what[64];
    snprintf(what, sizeof what, "fsizec%lld", limits[k]);
    pt_path(path, sizeof path, what);
    unlink(path);
    wjob j = {path, limits[k], 1, 0, 0, 1000000};
    wrun w;
    wrun_job(&j, &w);
    wrun_clean(&w, what);
    ck_assert_int_eq(w.r.loop_st, PROBE_ERR_NOSPACE);
    ck_assert_int_gt(w.r.last_ended, 500);
    probe_trace *t;
    char err[512];
    ck_assert_msg(probe_trace_open_isolated(&t, path, err, sizeof err) ==
                      PROBE_OK,
                  "%s: %s", what, err);
    int64_t n = probe_trace_get_info(t)->n_steps;
    /* all but, at most, the /steps rows of one batch (4 chunks of 256)
     * and a tail chunk, when the limit falls inside a /steps write */
    ck_assert_msg(n >= w.r.last_ended + 1 - 1280 && n >= 100,
                  "%s: %lld steps committed of %lld ended", what,
                  (long long)n, (long long)w.r.last_ended + 1);
    ck_assert_int_gt(probe_trace_get_info(t)->n_records, 0);
    probe_trace_close(t);
    unlink(path);
  }
}
END_TEST

/* The same with SIGXFSZ at its default action: the library installs no
 * handler, and its checks stop it short of the limit, so the signal never
 * comes. The disposition is left as it was. */
START_TEST(test_wfail_fsize_sigdfl) {
  static const long long limits[] = {0, 100 << 10, 600 << 10, 2 << 20};
  for (size_t k = 0; k < sizeof limits / sizeof limits[0]; k++) {
    char path[256], what[64];
    snprintf(what, sizeof what, "fsized%lld", limits[k]);
    pt_path(path, sizeof path, what);
    unlink(path);
    wjob j = {path, limits[k], 0, 0, 4, 1000000};
    wrun w;
    wrun_job(&j, &w);
    wrun_clean(&w, what);
    ck_assert_int_eq(w.r.loop_st, PROBE_ERR_NOSPACE);
    trace_holds(path, w.r.last_flushed);
    unlink(path);
  }
  /* the library leaves SIGXFSZ alone */
  struct sigaction old, now;
  signal(SIGXFSZ, SIG_DFL);
  sigaction(SIGXFSZ, NULL, &old);
  char path[256];
  pt_path(path, sizeof path, "sigxfsz");
  unlink(path);
  probe_session *s;
  PT_CHECK(probe_session_open(&s, path, NULL));
  PT_CHECK(probe_session_close(s));
  sigaction(SIGXFSZ, NULL, &now);
  ck_assert(now.sa_handler == SIG_DFL);
  unlink(path);
}
END_TEST

/* /dev/null and /dev/full (`-o /dev/null`, `-o /dev/full`), a directory,
 * and a symlink to /dev/full: refused at open, with or without overwrite,
 * one line, nothing written anywhere. */
START_TEST(test_wfail_not_regular) {
  char link[256], dir[256];
  pt_path(link, sizeof link, "devlink");
  pt_path(dir, sizeof dir, "dir");
  unlink(link);
  rmdir(dir);
  ck_assert_int_eq(symlink("/dev/full", link), 0);
  ck_assert_int_eq(mkdir(dir, 0700), 0);
  const char *paths[] = {"/dev/null", "/dev/full", link, dir};
  for (size_t k = 0; k < 4; k++)
    for (int ow = 0; ow < 2; ow++) {
      wjob j = {paths[k], -1, 1, ow, 3, 50};
      wrun w;
      wrun_job(&j, &w);
      wrun_clean(&w, paths[k]);
      ck_assert_msg(w.r.open_st == PROBE_ERR_IO, "%s: %s (%s)", paths[k],
                    probe_status_name(w.r.open_st), w.r.msg);
      ck_assert_msg(strstr(w.r.msg, k == 3 ? "directory" : "not a regular"),
                    "%s: '%s'", paths[k], w.r.msg);
    }
  struct stat sb;
  ck_assert_int_eq(stat("/dev/null", &sb), 0);
  ck_assert(S_ISCHR(sb.st_mode));
  unlink(link);
  rmdir(dir);
}
END_TEST

/* A full file system: a small tmpfs (where this process may mount one;
 * skipped with the reason otherwise), filled before the session to
 * different depths - so full that creating the file fails in HDF5, full
 * enough that the first flush is refused - and filled by the trace itself.
 * Every case ends in PROBE_ERR_NOSPACE and a clean exit. */
START_TEST(test_wfail_full_fs) {
  char mnt[256];
  const char *tmp = getenv("TMPDIR");
  snprintf(mnt, sizeof mnt, "%s/ampprobe-fullfs-%d", tmp ? tmp : "/tmp",
           (int)getpid());
  mkdir(mnt, 0700);
  /* In a mount namespace of this test's own, so that the tmpfs goes away
   * with the process even when an assertion ends it early or it is killed
   * (a mount in the shared namespace outlived such runs). */
  if (unshare(CLONE_NEWNS) != 0 ||
      mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0 ||
      mount("tmpfs", mnt, "tmpfs", 0, "size=640k") != 0) {
    printf("wfail full_fs: skipped: cannot mount a private tmpfs here (%s)\n",
           strerror(errno));
    rmdir(mnt);
    return;
  }
  static const int fill_kib[] = {640, 636, 630, 600, 560, 0}; /* 640: all */
  for (size_t k = 0; k < sizeof fill_kib / sizeof fill_kib[0]; k++) {
    char path[300], fill[300], what[64];
    snprintf(path, sizeof path, "%s/t.h5", mnt);
    snprintf(fill, sizeof fill, "%s/fill", mnt);
    snprintf(what, sizeof what, "full fs, %d KiB filled", fill_kib[k]);
    unlink(path);
    unlink(fill);
    if (fill_kib[k]) {
      int fd = open(fill, O_WRONLY | O_CREAT, 0600);
      ck_assert_int_ge(fd, 0);
      static char buf[4096];
      for (int i = 0; i < fill_kib[k] / 4; i++)
        if (write(fd, buf, sizeof buf) != (ssize_t)sizeof buf) break;
      close(fd);
    }
    wjob j = {path, -1, 1, 0, 3, 1000000};
    wrun w;
    wrun_job(&j, &w);
    wrun_clean(&w, what);
    probe_status st = w.r.open_st ? (probe_status)w.r.open_st
                                  : (probe_status)w.r.loop_st;
    ck_assert_msg(st == PROBE_ERR_NOSPACE, "%s: %s (%s)", what,
                  probe_status_name(st), w.r.msg);
    if (w.r.open_st == PROBE_OK) ck_assert_int_eq(w.r.close_st, st);
    if (fill_kib[k] == 0) ck_assert_int_gt(w.r.last_flushed, 10);
    trace_holds(path, w.r.last_flushed);
  }
  /* no flush asked for and none timed (flush_seconds 1e9): the disk fills
   * with every row since the start unflushed. What was written is
   * committed at the refusal, as at the file-size limit; it was all lost
   * (the trace read back empty, even its layers: hunt, 2026-12-04) */
  char path[300], fill[300];
  snprintf(path, sizeof path, "%s/t.h5", mnt);
  snprintf(fill, sizeof fill, "%s/fill", mnt);
  unlink(path);
  unlink(fill);
  wjob j = {path, -1, 1, 0, 0, 1000000};
  wrun w;
  wrun_job(&j, &w);
  wrun_clean(&w, "full fs, no flush");
  ck_assert_int_eq(w.r.loop_st, PROBE_ERR_NOSPACE);
  probe_trace *t = NULL;
  char err[512];
  probe_status ost = probe_trace_open_isolated(&t, path, err, sizeof err);
  ck_assert_msg(ost == PROBE_OK, "full fs, no flush: %s", err);
  const probe_trace_info *in = probe_trace_get_info(t);
  ck_assert_int_eq(in->n_layers, LAYERS);
  /* (the step whose end returned the error may be in: its row was handed
   * over before the writer refused) */
  ck_assert_msg(in->n_steps > 0 && in->n_records > 0 &&
                    in->n_steps <= w.r.last_ended + 2,
                "full fs, no flush: %lld steps, %lld records kept of %lld "
                "steps ended", (long long)in->n_steps,
                (long long)in->n_records, (long long)w.r.last_ended + 1);
  printf("wfail full_fs, no flush: %lld of %lld steps kept, %lld records\n",
         (long long)in->n_steps, (long long)w.r.last_ended + 1,
         (long long)in->n_records);
  probe_trace_close(t);
  umount(mnt);
  rmdir(mnt);
}
END_TEST

/* ---- claim: exclusive creation and the writer lock ---------------------- */

static void write_bytes(const char *path, const char *bytes) {
  FILE *f = fopen(path, "wb");
  ck_assert_ptr_nonnull(f);
  fputs(bytes, f);
  fclose(f);
}

static int same_bytes(const char *path, const char *bytes) {
  char buf[256] = "";
  FILE *f = fopen(path, "rb");
  if (f == NULL) return 0;
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = '\0';
  return strcmp(buf, bytes) == 0;
}

static void small_trace(probe_session *s, int steps) {
  int32_t id;
  PT_CHECK(probe_layer_register(s, "l", PROBE_KIND_LINEAR, PROBE_DTYPE_F16,
                                &id));
  float x[32];
  for (int step = 0; step < steps; step++) {
    PT_CHECK(probe_step_begin(s, step));
    pt_tensor(x, 32, step, 0);
    PT_CHECK(probe_tensor_record(s, id, PROBE_SITE_FWD_OUT, PROBE_DTYPE_F32,
                                 x, 32));
    probe_step_scalars sc = {.loss = 1.0, .loss_scale = 1.0};
    PT_CHECK(probe_step_set_scalars(s, &sc));
    PT_CHECK(probe_step_end(s));
  }
}

/* An existing file - a text file, an empty file, a trace - is refused
 * unless overwrite, and left as it was. */
START_TEST(test_claim_exists) {
  char path[256];
  pt_path(path, sizeof path, "exists");
  static const char *const contents[] = {"precious results\n", ""};
  for (int k = 0; k < 2; k++) {
    write_bytes(path, contents[k]);
    probe_session *s = (probe_session *)1;
    ck_assert_int_eq(probe_session_open(&s, path, NULL), PROBE_ERR_EXISTS);
    ck_assert_ptr_null(s);
    ck_assert_ptr_nonnull(strstr(probe_session_last_error(NULL), "exists"));
    ck_assert(same_bytes(path, contents[k]));
  }
  /* overwrite: replaced by a trace */
  probe_options o;
  probe_options_init(&o);
  o.overwrite = 1;
  probe_session *s;
  PT_CHECK(probe_session_open(&s, path, &o));
  small_trace(s, 3);
  PT_CHECK(probe_session_close(s));
  probe_trace *t;
  PT_CHECK(probe_trace_open(&t, path));
  ck_assert_int_eq(probe_trace_get_info(t)->n_steps, 3);
  probe_trace_close(t);
  /* a trace is an existing file too */
  ck_assert_int_eq(probe_session_open(&s, path, NULL), PROBE_ERR_EXISTS);
  PT_CHECK(probe_trace_open(&t, path));
  ck_assert_int_eq(probe_trace_get_info(t)->n_steps, 3);
  probe_trace_close(t);
  unlink(path);
}
END_TEST

/* Two sessions of one process on one path: the second is refused at once
 * (overwrite or not), the first goes on unharmed; after it closes the
 * path can be overwritten again. */
START_TEST(test_claim_lock_same_process) {
  char path[256];
  pt_path(path, sizeof path, "lock1");
  unlink(path);
  probe_session *a, *b = NULL;
  PT_CHECK(probe_session_open(&a, path, NULL));
  small_trace(a, 2);
  probe_options o;
  probe_options_init(&o);
  for (int ow = 0; ow < 2; ow++) {
    o.overwrite = ow;
    ck_assert_int_eq(probe_session_open(&b, path, &o), PROBE_ERR_LOCKED);
    ck_assert_ptr_null(b);
    ck_assert_ptr_nonnull(
        strstr(probe_session_last_error(NULL), "another writer"));
  }
  PT_CHECK(probe_session_flush(a));
  PT_CHECK(probe_session_close(a));
  probe_trace *t;
  PT_CHECK(probe_trace_open(&t, path));
  ck_assert_int_eq(probe_trace_get_info(t)->n_steps, 2);
  ck_assert_int_eq(probe_trace_get_info(t)->complete, 1);
  probe_trace_close(t);
  o.overwrite = 1;
  PT_CHECK(probe_session_open(&b, path, &o)); /* released at close */
  PT_CHECK(probe_session_close(b));
  unlink(path);
}
END_TEST

static double mono(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* A writer in another process: a second writer fails at once; a reader
 * opens the live trace; once the writer is killed (SIGKILL) the lock is
 * gone and the trace can be overwritten. */
START_TEST(test_claim_lock_other_process) {
  char path[256];
  pt_path(path, sizeof path, "lock2");
  unlink(path);
  int fds[2];
  ck_assert_int_eq(pipe(fds), 0);
  pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    probe_session *s;
    if (probe_session_open(&s, path, NULL) != PROBE_OK) _exit(2);
    small_trace(s, 4);
    if (probe_session_flush(s) != PROBE_OK) _exit(3);
    char c = 1;
    if (write(fds[1], &c, 1) != 1) _exit(4);
    for (;;) pause();
  }
  close(fds[1]);
  char c = 0;
  ck_assert_int_eq(read(fds[0], &c, 1), 1);
  close(fds[0]);
  probe_options o;
  probe_options_init(&o);
  for (int ow = 0; ow < 2; ow++) {
    o.overwrite = ow;
    probe_session *b = NULL;
    double t0 = mono();
    ck_assert_int_eq(probe_session_open(&b, path, &o), PROBE_ERR_LOCKED);
    ck_assert_double_lt(mono() - t0, 1.0);
    ck_assert_msg(strstr(probe_session_last_error(NULL), "another writer"),
                  "'%s'", probe_session_last_error(NULL));
  }
  probe_trace *t;
  PT_CHECK(probe_trace_open(&t, path)); /* readers are not locked out */
  ck_assert_int_eq(probe_trace_get_info(t)->n_steps, 4);
  probe_trace_close(t);
  kill(pid, SIGKILL);
  waitpid(pid, NULL, 0);
  o.overwrite = 1;
  probe_session *b;
  PT_CHECK(probe_session_open(&b, path, &o));
  small_trace(b, 1);
  PT_CHECK(probe_session_close(b));
  PT_CHECK(probe_trace_open(&t, path));
  ck_assert_int_eq(probe_trace_get_info(t)->n_steps, 1);
  probe_trace_close(t);
  unlink(path);
}
END_TEST

/* Many writers racing for one new path: exactly one wins. */
START_TEST(test_claim_race) {
  char path[256];
  pt_path(path, sizeof path, "race");
  for (int round = 0; round < 5; round++) {
    unlink(path);
    enum { W = 6 };
    pid_t pids[W];
    int go[2];
    ck_assert_int_eq(pipe(go), 0);
    for (int i = 0; i < W; i++) {
      pids[i] = fork();
      if (pids[i] == 0) {
        close(go[1]);
        char c;
        if (read(go[0], &c, 1) < 0) _exit(9);
        probe_options o;
        probe_options_init(&o);
        o.overwrite = i % 2; /* with and without overwrite */
        probe_session *s;
        probe_status st = probe_session_open(&s, path, &o);
        if (st == PROBE_OK) {
          small_trace(s, 2);
          struct timespec ts = {0, 50000000L};
          nanosleep(&ts, NULL); /* hold the lock while the others try */
          _exit(probe_session_close(s) == PROBE_OK ? 0 : 8);
        }
        _exit(st == PROBE_ERR_LOCKED || st == PROBE_ERR_EXISTS ? 1 : 7);
      }
    }
    close(go[0]);
    close(go[1]); /* all start at once */
    int winners = 0;
    for (int i = 0; i < W; i++) {
      int wst;
      waitpid(pids[i], &wst, 0);
      ck_assert(WIFEXITED(wst));
      ck_assert_int_le(WEXITSTATUS(wst), 1);
      winners += WEXITSTATUS(wst) == 0;
    }
    /* overwriting writers may win one after another, never together */
    ck_assert_int_ge(winners, 1);
    probe_trace *t;
    PT_CHECK(probe_trace_open(&t, path));
    ck_assert_int_eq(probe_trace_get_info(t)->n_steps, 2);
    ck_assert_int_eq(probe_trace_get_info(t)->complete, 1);
    probe_trace_close(t);
  }
  unlink(path);
}
END_TEST

static Suite *make_wfail_suite(void) {
  Suite *s = suite_create("wfail");
  TCase *tc = tcase_create("wfail");
  tcase_set_timeout(tc, 300); /* children under ASan on a loaded machine */
  tcase_add_test(tc, test_wfail_fsize);
  tcase_add_test(tc, test_wfail_fsize_sigdfl);
  tcase_add_test(tc, test_wfail_not_regular);
  tcase_add_test(tc, test_wfail_full_fs);
  suite_add_tcase(s, tc);
  /* A check that depends on speed, run alone (tests/probe/CMakeLists.txt):
   * its bound on the steps lost holds when the writer thread keeps up with
   * the caller; under ctest -j16 on two cores it fell behind by 1,500
   * steps (2,228 committed of 3,728 ended), rows handed over and not yet
   * taken when the limit hit. */
  TCase *tt = tcase_create("wfail_timing");
  tcase_set_tags(tt, "timing"); /* CK_EXCLUDE_TAGS, tests/probe/CMakeLists.txt */
  tcase_set_timeout(tt, 300);
  tcase_add_test(tt, test_wfail_fsize_commit_at_limit);
  suite_add_tcase(s, tt);
  TCase *tl = tcase_create("claim");
  tcase_set_timeout(tl, 60);
  tcase_add_test(tl, test_claim_exists);
  tcase_add_test(tl, test_claim_lock_same_process);
  tcase_add_test(tl, test_claim_lock_other_process);
  tcase_add_test(tl, test_claim_race);
  suite_add_tcase(s, tl);
  return s;
}

int main(void) {
  SRunner *sr = srunner_create(make_wfail_suite());
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? 0 : 1;
}
