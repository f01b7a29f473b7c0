/*
 * tests/reports/test_report_set.c - `ampprobe report` over a trace set:
 * rank traces written here with libprobe's public writer (rank, world size,
 * run id: contract C1 of issue #14), then the command is run on them and
 * the page read back.
 *
 *   test_report_set AMPPROBE_BINARY WORKDIR
 *
 * Cases: a healthy 4-rank job (exit 0, four rows, no ring); the loss
 * scaler's warm-up overflow on every rank (skipped cells, not inf/NaN);
 * NaN in rank 2's input at step 17 that the all-reduce carries to every
 * rank (exit 1; the headline and ring on rank 2 at step 17, the others
 * "carried"; rank 2's panels by default); a rank killed
 * mid-run (its trace incomplete; stopped first, its red bar, its panels); a
 * rank stopped by a signal and one that joined (the marks: `closed` aborted /
 * joined, the notes, the reason escaped, the aborted rank's own page); a
 * missing rank and an unreadable rank file (grey and purple rows, the rest
 * drawn); hostile names (a layer "<script>..." and a directory "set<b>&");
 * a set mixing two run ids (exit 2); --rank R (chosen, unknown, with a
 * single trace); the same set as a directory, a glob and a list of files;
 * -o onto a file of the set (exit 2, the file intact); a single rank file
 * still gets the single-trace page; and 64 ranks x 1,000 steps, every rank
 * with a different pattern, within 1 MiB.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ampprobe/probe.h"


#define BIG_HTML_MAX (1024 * 1024)

static const char *amp, *work;
static int failures;

static void check(int ok, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fputs(ok ? "ok   " : "FAIL ", stdout);
  vprintf(fmt, ap);
  putchar('\n');
  va_end(ap);
  if (!ok) failures++;
}

/* What one rank's trace holds. */
typedef struct rank_spec {
  int rank, world;
  const char *run_id;
  int steps;           /* steps written (0..steps-1) */
  int warmup;          /* step 0: scaled gradients overflow, step skipped */
  int nan_input_step;  /* this rank's input holds NaN at this step, -1 none */
  int carried_step;    /* loss NaN, gradients NaN, skipped: -1 none */
  int kill_after;      /* flush after this step and _exit (incomplete), -1 */
  const char *input_name;
  int pattern;         /* big test: rank-specific skips and NaNs */
  int joined;          /* marks that it joined the others (uneven inputs)
                          after its last step, then closes */
  const char *aborted; /* marks its trace aborted with this reason before
                          the close (a signal), NULL: no mark */
} rank_spec;

static rank_spec spec(int rank, int world, int steps) {
  rank_spec s = {rank, world, "job-a", steps, 0, -1, -1, -1, "input", 0, 0,
                 NULL};
  return s;
}

#define TRY(call)                                                              \
  do {                                                                         \
    probe_status st_ = (call);                                                 \
    if (st_ != PROBE_OK) {                                                     \
      fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call,            \
              probe_status_str(st_));                                          \
      return -1;                                                               \
    }                                                                          \
  } while (0)

static int write_steps(probe_session *s, const rank_spec *r) {
  int32_t in, fc, loss;
  TRY(probe_layer_register(s, r->input_name, PROBE_KIND_INPUT,
                           PROBE_DTYPE_F32, &in));
  TRY(probe_layer_register(s, "fc", PROBE_KIND_LINEAR, PROBE_DTYPE_F16, &fc));
  TRY(probe_layer_register(s, "loss", PROBE_KIND_LOSS, PROBE_DTYPE_F32, &loss));
  for (int step = 0; step < r->steps; step++) {
    int nan_in = step == r->nan_input_step;
    int carried = nan_in || step == r->carried_step;
    int overflow = r->warmup && step == 0;
    if (r->pattern) { /* rank-specific: a skip every (rank+2) steps, NaN
                         every (rank+7) */
      overflow = step % (r->rank + 2) == 1;
      carried = step % (r->rank + 7) == 3;
    }
    /* this rank's own values (input, local loss, local gradient) and what
     * the all-reduce returns (NaN on every rank when any sent NaN) */
    float x[8], g[8], post[8], l[1];
    for (int i = 0; i < 8; i++) {
      x[i] = nan_in && i == 3 ? NAN : 0.5f + 0.01f * (float)(i + step);
      g[i] = nan_in ? NAN : overflow ? INFINITY : 0.001f * (float)(i + 1);
      post[i] = carried ? NAN : g[i];
    }
    l[0] = nan_in ? NAN : 1.0f / (float)(step + 1);
    TRY(probe_step_begin(s, step));
    TRY(probe_tensor_record(s, in, PROBE_SITE_FWD_OUT, PROBE_DTYPE_F32, x, 8));
    TRY(probe_tensor_record(s, fc, PROBE_SITE_FWD_IN, PROBE_DTYPE_F32, x, 8));
    TRY(probe_tensor_record(s, loss, PROBE_SITE_FWD_OUT, PROBE_DTYPE_F32, l, 1));
    TRY(probe_tensor_record(s, fc, PROBE_SITE_WEIGHT_GRAD, PROBE_DTYPE_F32, g, 8));
    TRY(probe_tensor_record(s, fc, PROBE_SITE_GRAD_PRE_ALLREDUCE,
                            PROBE_DTYPE_F32, g, 8));
    TRY(probe_tensor_record(s, fc, PROBE_SITE_GRAD_POST_ALLREDUCE,
                            PROBE_DTYPE_F32, post, 8));
    probe_step_scalars sc;
    memset(&sc, 0, sizeof sc);
    sc.loss = carried ? NAN : l[0]; /* the global mean */
    sc.loss_scale = 65536.0;
    sc.found_inf = carried || overflow;
    sc.skipped = carried || overflow;
    sc.lr = 0.01;
    sc.grad_norm = carried || overflow ? NAN : 1.0;
    sc.clip_coef = 1.0;
    sc.unmeasured = PROBE_SCALAR_CLIP | PROBE_SCALAR_WEIGHT_DIGEST;
    TRY(probe_step_set_scalars(s, &sc));
    TRY(probe_step_end(s));
    if (step == r->kill_after) {
      TRY(probe_session_flush(s));
      _exit(0); /* killed: the writer never closes the file */
    }
  }
  return 0;
}

/* Writes DIR/NAME with the spec (in a child when the rank is killed). */
static int write_rank(const char *path, const rank_spec *r) {
  probe_options o;
  probe_options_init(&o);
  o.mode = PROBE_MODE_FULL;
  o.snapshot_on_nonfinite = 0;
  o.command_line = "test_report_set";
  o.config_json = "{\"name\": \"set\", \"precision\": \"fp16\"}";
  o.precision_policy = "fp16";
  o.rank = r->rank;
  o.world_size = r->world;
  o.run_id = r->run_id;
  if (r->kill_after >= 0) {
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid > 0) {
      int status;
      waitpid(pid, &status, 0);
      return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : -1;
    }
  }
  probe_session *s;
  probe_status st = probe_session_open(&s, path, &o);
  if (st != PROBE_OK) {
    fprintf(stderr, "%s: %s\n", path, probe_status_str(st));
    if (r->kill_after >= 0) _exit(1);
    return -1;
  }
  int rc = write_steps(s, r);
  if (r->kill_after >= 0) _exit(1); /* not reached unless it failed */
  if (rc == 0 && r->joined && probe_session_mark_joined(s) != PROBE_OK) rc = -1;
  if (rc == 0 && r->aborted &&
      probe_session_mark_aborted(s, r->aborted) != PROBE_OK)
    rc = -1;
  probe_status cl = probe_session_close(s);
  return rc == 0 && cl == PROBE_OK ? 0 : -1;
}

static void mkdirs(const char *d) {
  char cmd[2048];
  snprintf(cmd, sizeof cmd, "mkdir -p '%s'", d);
  if (system(cmd) != 0) fprintf(stderr, "cannot create %s\n", d);
}

/* Writes a set DIR/t.rankR.h5 from specs; returns 0 when all were made. */
static int write_set(const char *dir, rank_spec *specs, int n) {
  mkdirs(dir);
  for (int i = 0; i < n; i++) {
    char p[1024];
    snprintf(p, sizeof p, "%s/t.rank%d.h5", dir, specs[i].rank);
    if (write_rank(p, &specs[i]) != 0) return -1;
  }
  return 0;
}

/* Runs `ampprobe report ARGS...` (NULL-terminated) with stderr to a file;
 * returns the exit code, -1 when it did not exit. */
static int run_report(char *err, size_t errlen, ...) {
  char *argv[32];
  int n = 0;
  argv[n++] = (char *)amp;
  argv[n++] = "report";
  va_list ap;
  va_start(ap, errlen);
  for (char *a; n < 30 && (a = va_arg(ap, char *));) argv[n++] = a;
  va_end(ap);
  argv[n] = NULL;
  char errpath[1024];
  snprintf(errpath, sizeof errpath, "%s/stderr.txt", work);
  fflush(NULL);
  pid_t pid = fork();
  if (pid == 0) {
    int fd = open(errpath, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) _exit(127);
    dup2(fd, 2);
    execv(amp, argv);
    _exit(127);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  err[0] = '\0';
  FILE *f = fopen(errpath, "r");
  if (f) {
    size_t k = fread(err, 1, errlen - 1, f);
    while (k > 0 && err[k - 1] == '\n') k--; /* one line in messages */
    err[k] = '\0';
    fclose(f);
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

static char *slurp(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *d = malloc((size_t)n + 1);
  if (d && fread(d, 1, (size_t)n, f) != (size_t)n) {
    free(d);
    d = NULL;
  }
  fclose(f);
  if (d) d[n] = '\0';
  if (len) *len = (size_t)n;
  return d;
}

static int has(const char *html, const char *s) {
  return html && strstr(html, s) != NULL;
}

static int count(const char *html, const char *s) {
  int n = 0;
  if (!html) return 0;
  for (const char *p = strstr(html, s); p; p = strstr(p + strlen(s), s)) n++;
  return n;
}

static void path_of(char *buf, size_t n, const char *name) {
  snprintf(buf, n, "%s/%s", work, name);
}

static void case_healthy(void) {
  char dir[1024], out[1024], err[4096];
  path_of(dir, sizeof dir, "healthy");
  path_of(out, sizeof out, "healthy.html");
  rank_spec s[4];
  for (int r = 0; r < 4; r++) s[r] = spec(r, 4, 30);
  check(write_set(dir, s, 4) == 0, "healthy: 4 rank traces written");
  int rc = run_report(err, sizeof err, dir, "-o", out, NULL);
  char *h = slurp(out, NULL);
  check(rc == 0, "healthy: exit %d, want 0 (%s)", rc, err);
  check(has(h, "id=\"rankmap\"") && has(h, "Ranks x steps: 4 ranks"),
        "healthy: the ranks x steps view of 4 ranks");
  check(!has(h, "id=\"first-nonfinite\""), "healthy: no first inf/NaN ring");
  check(has(h, "HEALTHY: 4 ranks, no inf/NaN on any rank"),
        "healthy: the headline");
  check(has(h, "<td>rank 3</td>") && has(h, "<td>rank 0</td>"),
        "healthy: every rank in the table");
  check(has(h, "trace of rank 0 (no rank stands out: the first read)"),
        "healthy: rank 0's panels");
  check(has(h, "healthy (120 rank-steps)"), "healthy: 4 x 30 healthy cells");
  free(h);
}

/* The loss scaler's warm-up: every rank's scaled gradients overflow at
 * step 0 and the step is skipped. The cells say "skipped", not "inf/NaN"
 * (the verdict is the cross-rank post-mortem's: printed, not judged). */
static void case_warmup(void) {
  char dir[1024], out[1024], err[4096];
  path_of(dir, sizeof dir, "warmup");
  path_of(out, sizeof out, "warmup.html");
  rank_spec s[4];
  for (int r = 0; r < 4; r++) {
    s[r] = spec(r, 4, 30);
    s[r].warmup = 1;
  }
  check(write_set(dir, s, 4) == 0, "warm-up: 4 rank traces written");
  int rc = run_report(err, sizeof err, dir, "-o", out, NULL);
  char *h = slurp(out, NULL);
  check(rc == 0 || rc == 1, "warm-up: exit %d (%s)", rc, err);
  check(has(h, "skipped step (4 rank-steps)") &&
            has(h, "inf/NaN on this rank (0 rank-steps)") &&
            has(h, "healthy (116 rank-steps)"),
        "warm-up: the overflows caught by the scaler are skipped steps");
  const char *v = h ? strstr(h, "id=\"verdict\">") : NULL;
  v = v ? v + strlen("id=\"verdict\">") : "?";
  printf("     warm-up: the post-mortem over the set says: %.*s\n",
         (int)strcspn(v, "<"), v);
  free(h);
}

static void case_bad_input(void) {
  char dir[1024], out[1024], err[4096];
  path_of(dir, sizeof dir, "badinput");
  path_of(out, sizeof out, "badinput.html");
  rank_spec s[4];
  for (int r = 0; r < 4; r++) {
    s[r] = spec(r, 4, 30);
    s[r].carried_step = 17;
  }
  s[2].nan_input_step = 17;
  check(write_set(dir, s, 4) == 0, "bad input: 4 rank traces written");
  int rc = run_report(err, sizeof err, dir, "-o", out, NULL);
  char *h = slurp(out, NULL);
  check(rc == 1, "bad input: exit %d, want 1 (%s)", rc, err);
  check(has(h, "PROBLEM: born on rank 2 (step 17, input/fwd_out); the "
               "all-reduce carried it to ranks 0-1, 3 at step 17"),
        "bad input: the headline names rank 2, step 17, the input, the "
        "all-reduce");
  check(count(h, "id=\"first-nonfinite\"") == 1, "bad input: one ring");
  check(has(h, "rank 2: first inf/NaN of the job: step 17, fwd_out of input"),
        "bad input: the note at rank 2's row");
  check(has(h, "<td>step 17, grad_post_allreduce of fc (carried by the "
               "all-reduce)</td>"),
        "bad input: rank 3 got it through the all-reduce (table)");
  check(has(h, "trace of rank 2 (the rank of the job&#39;s first inf/NaN)"),
        "bad input: rank 2's panels by default");
  check(has(h, "inf/NaN on this rank (4 rank-steps)"),
        "bad input: step 17 of 4 ranks counted inf/NaN");
  free(h);
}

static void case_killed(void) {
  char dir[1024], out[1024], err[4096];
  path_of(dir, sizeof dir, "killed");
  path_of(out, sizeof out, "killed.html");
  rank_spec s[3];
  for (int r = 0; r < 3; r++) s[r] = spec(r, 3, 30);
  s[1].kill_after = 12;
  check(write_set(dir, s, 3) == 0, "killed: 3 rank traces written, rank 1 "
                                   "killed after step 12");
  int rc = run_report(err, sizeof err, dir, "-o", out, NULL);
  char *h = slurp(out, NULL);
  check(rc == 1, "killed: exit %d, want 1 (%s)", rc, err);
  check(has(h, "rank 1: incomplete (writer did not close it); stopped first: "
               "last step 12 of 29"),
        "killed: rank 1 incomplete and stopped first");
  check(count(h, "class=\"stop\"") == 1, "killed: one red bar");
  check(has(h, "PROBLEM: rank 1 stopped first, after step 12"),
        "killed: the headline");
  check(has(h, "trace of rank 1 (the rank that stopped first)"),
        "killed: rank 1's panels by default");
  free(h);
}

/* The marks a rank's trace carries: rank 1 stopped by a signal (the abort
 * mark, its reason data: escaped), rank 2 out of inputs (the join mark).
 * The ranks table's `closed` column reads `aborted` and `joined`, the notes
 * say what ended rank 1 and when rank 2 joined; rank 1's own page says
 * what ended it in its trace line and in the grey bar (not "killed"). */
static void case_marks(void) {
  char dir[1024], out[1024], err[4096], one[1100], out1[1024];
  path_of(dir, sizeof dir, "marks");
  path_of(out, sizeof out, "marks.html");
  path_of(out1, sizeof out1, "marks1.html");
  rank_spec s[3];
  for (int r = 0; r < 3; r++) s[r] = spec(r, 3, 30);
  s[1].steps = 13;
  s[1].aborted = "signal SIGTERM <i>&";
  s[2].steps = 20;
  s[2].joined = 1;
  check(write_set(dir, s, 3) == 0, "marks: 3 rank traces written");
  int rc = run_report(err, sizeof err, dir, "-o", out, NULL);
  char *h = slurp(out, NULL);
  check(rc == 1, "marks: exit %d, want 1 (%s)", rc, err);
  check(has(h, "<td>aborted</td>"), "marks: rank 1 closed = aborted");
  check(has(h, "<td>joined</td>"), "marks: rank 2 closed = joined");
  check(has(h, "aborted: ended by signal SIGTERM &lt;i&gt;&amp; after step 12 "
               "(its trace closed by the tracer)"),
        "marks: rank 1's note names the reason, escaped");
  check(has(h, "joined: ran out of inputs and joined the others after step "
               "19 (uneven inputs: DDP&#39;s join())") ||
            has(h, "joined: ran out of inputs and joined the others after "
                   "step 19 (uneven inputs: DDP's join())"),
        "marks: rank 2's note says it joined");
  check(!has(h, "<i>&"), "marks: the reason is not raw HTML");
  check(!has(h, "incomplete (writer did not close it)"),
        "marks: rank 1 is not said to be unclosed");
  free(h);
  snprintf(one, sizeof one, "%s/t.rank1.h5", dir);
  rc = run_report(err, sizeof err, one, "-o", out1, NULL);
  h = slurp(out1, NULL);
  check(rc == 1, "marks: rank 1 alone: exit %d, want 1 (%s)", rc, err);
  check(has(h, "aborted: ended by signal SIGTERM &lt;i&gt;&amp;, closed by "
               "the tracer"),
        "marks: rank 1 alone: its trace line names the reason");
  check(has(h, "HEALTHY SO FAR: the job ended by signal SIGTERM &lt;i&gt;&amp; "
               "(the tracer closed its trace, marked aborted)"),
        "marks: rank 1 alone: the grey bar names the reason");
  check(!has(h, "<i>&"), "marks: rank 1 alone: the reason is not raw HTML");
  free(h);
}

static void case_missing_unreadable(void) {
  char dir[1024], out[1024], err[4096], junk[1100];
  path_of(dir, sizeof dir, "holes");
  path_of(out, sizeof out, "holes.html");
  rank_spec s[3] = {spec(0, 5, 20), spec(1, 5, 20), spec(3, 5, 20)};
  check(write_set(dir, s, 3) == 0, "holes: ranks 0, 1, 3 of 5 written");
  snprintf(junk, sizeof junk, "%s/t.rank4.h5", dir);
  FILE *f = fopen(junk, "w");
  if (f) {
    fputs("not a trace\n", f);
    fclose(f);
  }
  int rc = run_report(err, sizeof err, dir, "-o", out, NULL);
  char *h = slurp(out, NULL);
  check(rc == 1, "holes: exit %d, want 1 (%s)", rc, err);
  check(has(h, "rank 2: missing: no trace file"), "holes: rank 2 missing");
  check(has(h, "rank 4: unreadable:"), "holes: rank 4 unreadable, by name");
  check(has(h, "ranks: 3 read, 1 missing, 1 unreadable, 0 not closed"),
        "holes: the summary");
  check(has(h, "<path fill=\"#bdbdbd\"") && has(h, "<path fill=\"#c5b0d5\""),
        "holes: grey and purple rows");
  check(has(h, "<h2>Training curves</h2>"), "holes: the rest diagnosed");
  free(h);
}

static void case_hostile(void) {
  char dir[1024], out[1024], err[4096];
  path_of(dir, sizeof dir, "set<b>&");
  path_of(out, sizeof out, "hostile.html");
  rank_spec s[2] = {spec(0, 2, 10), spec(1, 2, 10)};
  s[0].input_name = "in<script>alert(1)</script>";
  s[1].input_name = s[0].input_name;
  s[0].nan_input_step = 4;
  check(write_set(dir, s, 2) == 0, "hostile: 2 rank traces written");
  int rc = run_report(err, sizeof err, dir, "-o", out, NULL);
  char *h = slurp(out, NULL);
  check(rc == 1, "hostile: exit %d, want 1 (%s)", rc, err);
  check(h && !has(h, "<script") && !has(h, "<b>&"),
        "hostile: no raw <script> or <b> on the page");
  check(has(h, "in&lt;script&gt;alert(1)&lt;/script&gt;"),
        "hostile: the layer name escaped");
  check(has(h, "set&lt;b&gt;&amp;/t.rank0.h5"), "hostile: the path escaped");
  free(h);
}

static void case_run_ids(void) {
  char dir[1024], out[1024], err[4096];
  path_of(dir, sizeof dir, "twojobs");
  path_of(out, sizeof out, "twojobs.html");
  rank_spec s[2] = {spec(0, 2, 10), spec(1, 2, 10)};
  s[1].run_id = "job-b";
  check(write_set(dir, s, 2) == 0, "two jobs: written");
  int rc = run_report(err, sizeof err, dir, "-o", out, NULL);
  check(rc == 2 && strstr(err, "not one job"),
        "two jobs: exit %d, want 2 (%s)", rc, err);
  check(access(out, F_OK) != 0, "two jobs: no page");
}

static void case_rank_option_and_forms(void) {
  char dir[1024], out[1024], err[4096], glob[1100], f0[1100], f1[1100];
  char f2[1100], f3[1100];
  path_of(dir, sizeof dir, "badinput"); /* written by case_bad_input */
  path_of(out, sizeof out, "rank3.html");
  int rc = run_report(err, sizeof err, dir, "--rank", "3", "-o", out, NULL);
  char *h = slurp(out, NULL);
  check(rc == 1 && has(h, "trace of rank 3 (chosen with --rank)"),
        "--rank 3: exit %d, rank 3's panels (%s)", rc, err);
  free(h);
  rc = run_report(err, sizeof err, dir, "--rank", "9", "-o", out, NULL);
  check(rc == 2 && strstr(err, "--rank 9"), "--rank 9: exit %d, want 2 (%s)",
        rc, err);
  snprintf(f0, sizeof f0, "%s/t.rank0.h5", dir);
  rc = run_report(err, sizeof err, f0, "--rank", "0", "-o", out, NULL);
  check(rc == 2, "--rank with one trace: exit %d, want 2 (%s)", rc, err);
  /* one rank file: the single-trace page */
  path_of(out, sizeof out, "single.html");
  rc = run_report(err, sizeof err, f0, "-o", out, NULL);
  h = slurp(out, NULL);
  check(rc == 1 && h && !has(h, "id=\"rankmap\"") && has(h, "<h2>Trace</h2>"),
        "one rank file: the single-trace page (exit %d)", rc);
  free(h);
  /* the set as a glob and as a list: the same rows */
  snprintf(glob, sizeof glob, "%s/t.rank*.h5", dir);
  path_of(out, sizeof out, "glob.html");
  rc = run_report(err, sizeof err, glob, "-o", out, NULL);
  h = slurp(out, NULL);
  check(rc == 1 && count(h, "<td>rank ") == 4 &&
                has(h, "born on rank 2 (step 17, input/fwd_out)"),
        "a glob: exit %d, 4 ranks, same verdict (%s)", rc, err);
  free(h);
  snprintf(f1, sizeof f1, "%s/t.rank1.h5", dir);
  snprintf(f2, sizeof f2, "%s/t.rank2.h5", dir);
  snprintf(f3, sizeof f3, "%s/t.rank3.h5", dir);
  path_of(out, sizeof out, "list.html");
  rc = run_report(err, sizeof err, f3, f1, f0, f2, "-o", out, NULL);
  h = slurp(out, NULL);
  check(rc == 1 && count(h, "<td>rank ") == 4 &&
            has(h, "born on rank 2 (step 17, input/fwd_out)"),
        "a list of files: exit %d, 4 ranks, same verdict (%s)", rc, err);
  free(h);
  /* a list without rank 1: missing */
  rc = run_report(err, sizeof err, f3, f0, f2, "-o", out, NULL);
  h = slurp(out, NULL);
  check(rc == 1 && has(h, "rank 1: missing: no trace file"),
        "a list without rank 1: it is missing (exit %d)", rc);
  free(h);
  /* -o onto a file of the set */
  size_t before = 0, after = 0;
  free(slurp(f1, &before));
  rc = run_report(err, sizeof err, dir, "-o", f1, NULL);
  free(slurp(f1, &after));
  check(rc == 2 && before == after && strstr(err, "also an input"),
        "-o onto a rank file: exit %d, want 2, the file intact (%s)", rc, err);
  char none[1100];
  snprintf(none, sizeof none, "%s/nothing-*.h5", dir);
  rc = run_report(err, sizeof err, none, "-o", out, NULL);
  check(rc == 3, "a glob matching nothing: exit %d, want 3 (%s)", rc, err);
}

static void case_big(void) {
  enum { RANKS = 64, STEPS = 1000 };
  char dir[1024], out[1024], err[4096];
  path_of(dir, sizeof dir, "big");
  path_of(out, sizeof out, "big.html");
  static rank_spec s[RANKS];
  for (int r = 0; r < RANKS; r++) {
    s[r] = spec(r, RANKS, STEPS);
    s[r].pattern = 1;
  }
  check(write_set(dir, s, RANKS) == 0, "big: %d ranks x %d steps written",
        RANKS, STEPS);
  int rc = run_report(err, sizeof err, dir, "-o", out, NULL);
  size_t len = 0;
  char *h = slurp(out, &len);
  check(rc == 1 && h, "big: exit %d (%s)", rc, err);
  check(len < BIG_HTML_MAX, "big: %zu bytes < %d", len, BIG_HTML_MAX);
  check(count(h, "<td>rank ") == RANKS, "big: every rank in the table");
  printf("     big: %d ranks x %d steps, every rank a different pattern: "
         "%zu bytes\n", RANKS, STEPS, len);
  free(h);
}

int main(int argc, char **argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: test_report_set AMPPROBE WORKDIR\n");
    return 2;
  }
  amp = argv[1];
  work = argv[2];
  char cmd[2048];
  snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s'", work, work);
  if (system(cmd) != 0) return 2;
  case_healthy();
  case_warmup();
  case_bad_input();
  case_killed();
  case_marks();
  case_missing_unreadable();
  case_hostile();
  case_run_ids();
  case_rank_option_and_forms();
  case_big();
  printf("%d failure(s)\n", failures);
  return failures ? 1 : 0;
}
