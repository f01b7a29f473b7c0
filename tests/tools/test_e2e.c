/*
 * tests/tools/test_e2e.c - end-to-end tests of the real `ampprobe` binary
 * (path in AMPPROBE_BIN): for every scenario of the zoo, `ampprobe run
 * --trace` then `ampprobe postmortem --json`, asserting the origin layer,
 * the kind of event and the top-ranked diagnosis from the table below; the
 * same on a trace whose writer was SIGKILLed mid-run; Ctrl-C of a run; and
 * bad input (one-line error on stderr, documented exit code).
 *
 * Usage: test_e2e [scenarios|killed|errors|coverage|outputs]  (default: all)
 */
#define _POSIX_C_SOURCE 200809L
#include <check.h>
#include <fcntl.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <hdf5.h>

#ifndef AMPPROBE_BIN
#error "AMPPROBE_BIN must be defined"
#endif

/* ---- expectations, one row per zoo scenario ------------------------------ */

typedef struct expect {
  const char *scenario;
  const char *extra;      /* extra `run` options, space-separated, or NULL */
  const char *origin;     /* origin layer, NULL when no event */
  const char *event;      /* event kind ("none" for healthy) */
  const char *top;        /* top-ranked diagnosis id */
  const char *candidates; /* fp32_candidates expected, or NULL */
  int run_rc;             /* exit code of `ampprobe run` */
  int pm_rc;              /* exit code of `ampprobe postmortem` */
} expect;

/* What the scenarios of trainer/scenarios/ are built to produce. bn-overflow
 * and two-culprits keep a finite loss in FP16 (the overflowed variance makes
 * the normalised features vanish): `run` takes the post-mortem's verdict,
 * degraded, and exits 1 like postmortem (issue 15.1: never "healthy"). */
static const expect table[] = {
    {"healthy", NULL, NULL, "none", "healthy", NULL, 0, 0},
    {"bn-overflow", NULL, "enc.bn1", "reduction-overflow", "force-fp32", "bn",
     1, 1},
    {"revin-overflow", NULL, "revin", "reduction-overflow", "force-fp32",
     "revin", 1, 1},
    {"softmax-underflow", NULL, "loss", "underflow-to-inf", "force-fp32",
     "softmax", 1, 1},
    /* the full trace shows the gradients flushing: the post-mortem's
     * verdict is degraded, and run's with it */
    {"grad-underflow", NULL, NULL, "none", "enable-loss-scaling", NULL, 1, 1},
    {"two-culprits", NULL, "revin", "reduction-overflow", "force-fp32",
     "revin", 1, 1},
    /* the second culprit shows once the first is fixed */
    {"two-culprits", "--fp32 revin", "loss", "underflow-to-inf", "force-fp32",
     "revin,softmax", 1, 1},
    {"two-culprits", "--fp32 revin,softmax", NULL, "none", "healthy", NULL, 0,
     0},
    {"revin-overflow", "--fp32 revin", NULL, "none", "healthy", NULL, 0, 0},
    {"bn-overflow", "--fp32 enc.bn1", NULL, "none", "healthy", NULL, 0, 0},
    /* the clipper's norm is the recorded, still scaled, gradients' norm;
     * the scale fell below 1 and the run diverged */
    {"clip-before-unscale", NULL, "head.fc", "overflow", "fix-clip-order", NULL,
     1, 1},
    {"lr-too-high", NULL, "enc.fc2", "overflow", "lower-lr", NULL, 1, 1},
    /* ... and it diverges in FP32 too */
    {"lr-too-high", "--precision fp32", "loss", "overflow", "lower-lr", NULL, 1,
     1},
    {"nan-input", NULL, "input", "input-nan", "clean-input", NULL, 1, 1},
    /* the multi-rank scenarios run as one process (world 1, no mpirun):
     * nothing is all-reduced, allreduce-overflow's lone gradients fit in
     * FP16 and rank-bad-input has no rank 1 to hold the NaN; their
     * multi-rank behaviour is tests/trainer/mpi_smoke.sh and tests/dist/ */
    {"healthy-dp", NULL, NULL, "none", "healthy", NULL, 0, 0},
    {"allreduce-overflow", NULL, NULL, "none", "healthy", NULL, 0, 0},
    {"rank-bad-input", NULL, NULL, "none", "healthy", NULL, 0, 0},
};
#define N_TABLE (int)(sizeof table / sizeof table[0])

/* ---- running the binary --------------------------------------------------- */

static char workdir[256];

typedef struct result {
  int rc; /* exit code, or 128+signal */
  char *out, *err;
} result;

static char *slurp(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) return strdup("");
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *b = malloc((size_t)n + 1);
  size_t got = fread(b, 1, (size_t)n, f);
  b[got] = 0;
  fclose(f);
  return b;
}

/* Starts `ampprobe args...` with stdout/stderr to files; returns the pid. */
static pid_t spawn(const char *const *args, const char *tag) {
  char o[512], e[512];
  snprintf(o, sizeof o, "%s/%s.out", workdir, tag);
  snprintf(e, sizeof e, "%s/%s.err", workdir, tag);
  pid_t pid = fork();
  if (pid == 0) {
    int fo = open(o, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int fe = open(e, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fo, 1);
    dup2(fe, 2);
    if (chdir(workdir) != 0) _exit(127);
    const char *argv[64];
    int n = 0;
    argv[n++] = AMPPROBE_BIN;
    for (int i = 0; args[i] && n < 63; i++) argv[n++] = args[i];
    argv[n] = NULL;
    execv(AMPPROBE_BIN, (char *const *)argv);
    _exit(127);
  }
  return pid;
}

static result collect(pid_t pid, const char *tag) {
  result r;
  int st = 0;
  waitpid(pid, &st, 0);
  r.rc = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  char o[512], e[512];
  snprintf(o, sizeof o, "%s/%s.out", workdir, tag);
  snprintf(e, sizeof e, "%s/%s.err", workdir, tag);
  r.out = slurp(o);
  r.err = slurp(e);
  return r;
}

static result run(const char *tag, const char *const *args) {
  return collect(spawn(args, tag), tag);
}

static void result_free(result *r) {
  free(r->out);
  free(r->err);
}

static const char *jstr(json_t *o, const char *path) {
  /* "a.b" lookups */
  char buf[128];
  snprintf(buf, sizeof buf, "%s", path);
  json_t *cur = o;
  for (char *tok = strtok(buf, "."); tok && cur; tok = strtok(NULL, "."))
    cur = json_object_get(cur, tok);
  return cur ? json_string_value(cur) : NULL;
}

static json_t *postmortem_json(const char *trace, int *rc) {
  const char *args[] = {"postmortem", trace, "--json", NULL};
  result r = run("pm", args);
  *rc = r.rc;
  json_error_t err;
  json_t *j = json_loads(r.out, 0, &err);
  if (!j)
    fprintf(stderr, "postmortem output is not JSON (rc %d): %s\n%s\n", r.rc,
            err.text, r.err);
  result_free(&r);
  return j;
}

static void check_expect(json_t *j, const expect *e) {
  const char *kind = jstr(j, "event.kind");
  ck_assert_msg(kind && !strcmp(kind, e->event),
                "%s: event kind '%s', expected '%s'", e->scenario,
                kind ? kind : "(null)", e->event);
  if (e->origin) {
    const char *o = jstr(j, "event.origin_layer");
    ck_assert_msg(o && !strcmp(o, e->origin),
                  "%s: origin '%s', expected '%s'", e->scenario,
                  o ? o : "(null)", e->origin);
  }
  json_t *top = json_array_get(json_object_get(j, "diagnosis"), 0);
  const char *id = top ? json_string_value(json_object_get(top, "id")) : NULL;
  ck_assert_msg(id && !strcmp(id, e->top), "%s: top diagnosis '%s', "
                "expected '%s'", e->scenario, id ? id : "(null)", e->top);
  if (e->candidates) {
    const char *c = json_string_value(json_object_get(j, "fp32_candidates"));
    ck_assert_msg(c && !strcmp(c, e->candidates),
                  "%s: candidates '%s', expected '%s'", e->scenario,
                  c ? c : "", e->candidates);
    const char *next = json_string_value(json_object_get(top, "next_step"));
    ck_assert_msg(next && strstr(next, "ampprobe bisect --fp32-candidates"),
                  "%s: next step '%s'", e->scenario, next ? next : "");
  }
}

/* ---- the zoo -------------------------------------------------------------- */

START_TEST(test_scenario) {
  const expect *e = &table[_i];
  char trace[300];
  snprintf(trace, sizeof trace, "%s/%s.h5", workdir, e->scenario);
  char extra[128] = "";
  const char *args[24] = {"run", "--scenario", e->scenario, "--trace", "-q",
                          "-o", trace};
  int na = 7;
  if (e->extra) {
    snprintf(extra, sizeof extra, "%s", e->extra);
    for (char *t = strtok(extra, " "); t && na < 22; t = strtok(NULL, " "))
      args[na++] = t;
    snprintf(trace, sizeof trace, "%s/%s-%d.h5", workdir, e->scenario, _i);
  }
  args[na] = NULL;
  result r = run("run", args);
  ck_assert_msg(r.rc == e->run_rc, "%s: run exit %d, expected %d; stderr: %s",
                e->scenario, r.rc, e->run_rc, r.err);
  ck_assert_ptr_nonnull(strstr(r.out, "steps run"));
  ck_assert_ptr_nonnull(strstr(r.out, trace));
  result_free(&r);
  int rc = -1;
  json_t *j = postmortem_json(trace, &rc);
  ck_assert_ptr_nonnull(j);
  ck_assert_msg(rc == e->pm_rc, "%s: postmortem exit %d, expected %d",
                e->scenario, rc, e->pm_rc);
  check_expect(j, e);
  json_decref(j);
  /* the text report says the same */
  const char *targs[] = {"postmortem", trace, NULL};
  r = run("pmtext", targs);
  ck_assert_int_eq(r.rc, e->pm_rc);
  ck_assert_ptr_nonnull(strstr(r.out, "DIAGNOSIS"));
  if (e->origin) ck_assert_ptr_nonnull(strstr(r.out, e->origin));
  result_free(&r);
  /* flight-recorder trace (no --trace): same origin and kind */
  if (e->origin && !e->extra) {
    snprintf(trace, sizeof trace, "%s/%s-fr.h5", workdir, e->scenario);
    const char *fargs[] = {"run", "--scenario", e->scenario, "-q", "-o",
                           trace, NULL};
    r = run("runfr", fargs);
    ck_assert_int_eq(r.rc, e->run_rc);
    result_free(&r);
    j = postmortem_json(trace, &rc);
    ck_assert_ptr_nonnull(j);
    ck_assert_str_eq(jstr(j, "trace.record_mode"), "flight-recorder");
    check_expect(j, e);
    json_decref(j);
  }
}
END_TEST

/* Every scenario the binary lists has a row in the table. */
START_TEST(test_coverage) {
  const char *args[] = {"run", "--list-scenarios", "--json", NULL};
  result r = run("list", args);
  ck_assert_int_eq(r.rc, 0);
  json_error_t err;
  json_t *a = json_loads(r.out, 0, &err);
  ck_assert_ptr_nonnull(a);
  size_t i;
  json_t *v;
  json_array_foreach(a, i, v) {
    const char *nm = json_string_value(json_object_get(v, "name"));
    int found = 0;
    for (int k = 0; k < N_TABLE; k++)
      if (!strcmp(table[k].scenario, nm)) found = 1;
    ck_assert_msg(found, "scenario '%s' has no expectations in test_e2e.c",
                  nm);
  }
  json_decref(a);
  result_free(&r);
}
END_TEST

/* ---- killed writer, interrupted run --------------------------------------- */

static void sleep_s(double s) {
  struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
  nanosleep(&ts, NULL);
}

/* Waits (up to 30 s) until path exists with at least min_bytes. */
static void wait_for_file(const char *path, off_t min_bytes) {
  struct stat sb;
  for (int i = 0; i < 300; i++) {
    if (stat(path, &sb) == 0 && sb.st_size >= min_bytes) return;
    sleep_s(0.1);
  }
  ck_abort_msg("%s did not appear", path);
}

START_TEST(test_killed_writer) {
  char trace[300];
  snprintf(trace, sizeof trace, "%s/killed.h5", workdir);
  const char *args[] = {"run", "--scenario", "revin-overflow", "--trace",
                        "--steps", "1000000", "-q", "-o", trace, NULL};
  pid_t pid = spawn(args, "killed");
  wait_for_file(trace, 64 * 1024);
  sleep_s(1.5); /* the writer flushes at least once a second */
  kill(pid, SIGKILL);
  result r = collect(pid, "killed");
  ck_assert_int_eq(r.rc, 128 + SIGKILL);
  result_free(&r);
  int rc = -1;
  json_t *j = postmortem_json(trace, &rc);
  ck_assert_ptr_nonnull(j);
  ck_assert_int_eq(rc, 1);
  json_t *tr = json_object_get(j, "trace");
  ck_assert(json_is_false(json_object_get(tr, "complete")));
  ck_assert_int_gt(json_integer_value(json_object_get(tr, "last_step")), 0);
  expect e = {"revin-overflow (killed)", NULL, "revin",
              "reduction-overflow", "force-fp32", "revin", 1, 1};
  check_expect(j, &e);
  json_decref(j);
  /* the text report names the last step recorded */
  const char *targs[] = {"postmortem", trace, NULL};
  r = run("killedpm", targs);
  ck_assert_ptr_nonnull(strstr(r.out, "INCOMPLETE"));
  ck_assert_ptr_nonnull(strstr(r.out, "last step recorded"));
  result_free(&r);
}
END_TEST

START_TEST(test_sigint_run) {
  char trace[300];
  snprintf(trace, sizeof trace, "%s/int.h5", workdir);
  const char *args[] = {"run", "--trace", "--steps", "1000000", "-q", "-o",
                        trace, NULL};
  pid_t pid = spawn(args, "int");
  wait_for_file(trace, 1); /* the handler is installed before the trace */
  sleep_s(0.5);
  kill(pid, SIGINT);
  result r = collect(pid, "int");
  ck_assert_int_eq(r.rc, 130);
  ck_assert_ptr_nonnull(strstr(r.out, "INTERRUPTED"));
  result_free(&r);
  int rc = -1;
  json_t *j = postmortem_json(trace, &rc);
  ck_assert_ptr_nonnull(j);
  /* closed by the writer, marked aborted: not complete, degraded (exit 1);
   * it read complete and healthy, exit 0 (hunt F2) */
  ck_assert_int_eq(rc, 1);
  json_t *tr = json_object_get(j, "trace");
  ck_assert(json_is_false(json_object_get(tr, "complete")));
  ck_assert_str_eq(json_string_value(json_object_get(tr, "aborted")),
                   "signal SIGINT");
  ck_assert_str_eq(json_string_value(json_object_get(j, "verdict")),
                   "degraded");
  json_decref(j);
}
END_TEST

/* ---- bad input ------------------------------------------------------------ */

/* Exactly one line on stderr, starting "ampprobe: <sub>: ". */
static void check_error(const result *r, int rc, const char *sub,
                        const char *what) {
  ck_assert_msg(r->rc == rc, "%s: exit %d, expected %d (stderr: %s)", what,
                r->rc, rc, r->err);
  char prefix[64];
  snprintf(prefix, sizeof prefix, "ampprobe: %s: ", sub);
  ck_assert_msg(!strncmp(r->err, prefix, strlen(prefix)),
                "%s: stderr '%s' lacks '%s'", what, r->err, prefix);
  size_t n = strlen(r->err);
  ck_assert_msg(n > 0 && r->err[n - 1] == '\n' && !memchr(r->err, '\n', n - 1),
                "%s: stderr is not one line: '%s'", what, r->err);
  ck_assert_msg(r->out[0] == 0, "%s: stdout not empty", what);
}

static void write_file(const char *path, const void *data, size_t n) {
  FILE *f = fopen(path, "wb");
  ck_assert_ptr_nonnull(f);
  ck_assert_uint_eq(fwrite(data, 1, n, f), n);
  fclose(f);
}

static void make_good_trace(char *path, size_t len) {
  snprintf(path, len, "%s/good.h5", workdir);
  struct stat sb;
  if (stat(path, &sb) == 0) return;
  const char *args[] = {"run", "--scenario", "healthy", "--trace", "-q", "-o",
                        path, NULL};
  result r = run("good", args);
  ck_assert_int_eq(r.rc, 0);
  result_free(&r);
}

static void pm_expect(const char *path, int rc, const char *what) {
  const char *args[] = {"postmortem", path, NULL};
  result r = run("bad", args);
  check_error(&r, rc, "postmortem", what);
  result_free(&r);
}

START_TEST(test_missing_file) {
  char p[300];
  snprintf(p, sizeof p, "%s/does-not-exist.h5", workdir);
  pm_expect(p, 3, "missing file");
}
END_TEST

START_TEST(test_not_hdf5) {
  char p[300];
  snprintf(p, sizeof p, "%s/text.h5", workdir);
  const char *txt = "this is not an HDF5 file\n";
  write_file(p, txt, strlen(txt));
  pm_expect(p, 3, "not HDF5");
}
END_TEST

START_TEST(test_not_a_trace) {
  char p[300];
  snprintf(p, sizeof p, "%s/other.h5", workdir);
  hid_t f = H5Fcreate(p, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  ck_assert(f >= 0);
  hid_t g = H5Gcreate2(f, "/data", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  H5Gclose(g);
  H5Fclose(f);
  pm_expect(p, 3, "HDF5 but not a trace");
}
END_TEST

START_TEST(test_truncated) {
  char good[300], p[300];
  make_good_trace(good, sizeof good);
  char *data = slurp(good);
  struct stat sb;
  stat(good, &sb);
  snprintf(p, sizeof p, "%s/truncated.h5", workdir);
  write_file(p, data, (size_t)sb.st_size / 2);
  free(data);
  pm_expect(p, 3, "truncated");
}
END_TEST

/* Overwrites [from, to) of a copy of the good trace with random bytes. */
static void corrupt_copy(const char *dst, double from, double to) {
  char good[300];
  make_good_trace(good, sizeof good);
  struct stat sb;
  stat(good, &sb);
  FILE *f = fopen(good, "rb");
  ck_assert_ptr_nonnull(f);
  size_t n = (size_t)sb.st_size;
  unsigned char *data = malloc(n);
  ck_assert_uint_eq(fread(data, 1, n, f), n);
  fclose(f);
  srand(12345);
  size_t a = from < 1 ? (size_t)(from * (double)n) : (size_t)from;
  size_t b = to < 1 ? (size_t)(to * (double)n) : (size_t)to;
  for (size_t i = a; i < b && i < n; i++) data[i] = (unsigned char)rand();
  write_file(dst, data, n);
  free(data);
}

START_TEST(test_corrupt_data) {
  char p[300];
  snprintf(p, sizeof p, "%s/corrupt-data.h5", workdir);
  corrupt_copy(p, 0.5, 0.5 + 4096.0 / 442869.0);
  pm_expect(p, 3, "corrupt data chunks");
}
END_TEST

/* Garbage in the metadata after the superblock (checksums, object headers):
 * libprobe's isolated reader must turn whatever HDF5 does into "corrupt". */
START_TEST(test_corrupt_metadata) {
  char p[300];
  snprintf(p, sizeof p, "%s/corrupt-meta.h5", workdir);
  corrupt_copy(p, 96, 4096);
  pm_expect(p, 3, "corrupt metadata");
}
END_TEST

START_TEST(test_usage_errors) {
  char good[300];
  make_good_trace(good, sizeof good);
  struct {
    const char *args[8];
    const char *sub;
    const char *what;
  } cases[] = {
      {{"postmortem", good, "--bogus", NULL}, "postmortem", "unknown option"},
      {{"postmortem", good, "--layer-history", "abc", NULL}, "postmortem",
       "bad value"},
      {{"postmortem", good, "--layer-history", "0", NULL}, "postmortem",
       "value out of range"},
      {{"postmortem", NULL}, "postmortem", "missing argument"},
      {{"run", "--steps", "-5", NULL}, "run", "negative steps"},
      {{"run", "--precision", "fp8", NULL}, "run", "bad precision"},
      {{"run", "--lr", "fast", NULL}, "run", "bad lr"},
      {{"run", "--scenario", "no-such-scenario", NULL}, "run",
       "unknown scenario"},
      {{"run", "--frobnicate", NULL}, "run", "unknown run option"},
      {{"run", "--json=yes", NULL}, "run", "value for a flag"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    result r = run("usage", cases[i].args);
    check_error(&r, 2, cases[i].sub, cases[i].what);
    result_free(&r);
  }
  /* unknown subcommand: "ampprobe: ..." */
  const char *args[] = {"frobnicate", NULL};
  result r = run("usage", args);
  ck_assert_int_eq(r.rc, 2);
  ck_assert(!strncmp(r.err, "ampprobe: unknown command", 25));
  result_free(&r);
}
END_TEST

START_TEST(test_help_and_version) {
  const char *h[] = {"--help", NULL};
  result r = run("help", h);
  ck_assert_int_eq(r.rc, 0);
  ck_assert_ptr_nonnull(strstr(r.out, "exit codes"));
  ck_assert_ptr_nonnull(strstr(r.out, "postmortem"));
  result_free(&r);
  const char *subs[] = {"run", "postmortem"};
  for (int i = 0; i < 2; i++) {
    const char *a[] = {subs[i], "--help", NULL};
    r = run("help", a);
    ck_assert_int_eq(r.rc, 0);
    ck_assert_ptr_nonnull(strstr(r.out, "example"));
    result_free(&r);
  }
  const char *v[] = {"--version", NULL};
  r = run("version", v);
  ck_assert_int_eq(r.rc, 0);
  ck_assert(!strncmp(r.out, "ampprobe ", 9));
  result_free(&r);
}
END_TEST

START_TEST(test_output_unwritable) {
  const char *args[] = {"run", "-q", "-o", "/nonexistent-dir/x.h5", NULL};
  result r = run("unwritable", args);
  check_error(&r, 4, "run", "unwritable output");
  result_free(&r);
}
END_TEST

/* ---- what the summaries and help say ------------------------------------- */

static int count_of(const char *hay, const char *needle) {
  int n = 0;
  for (const char *p = hay; (p = strstr(p, needle)); p += strlen(needle)) n++;
  return n;
}

static json_t *parse_json(const char *text, const char *what) {
  json_error_t err;
  json_t *j = json_loads(text, 0, &err);
  ck_assert_msg(j != NULL, "%s: not JSON: %s", what, err.text);
  return j;
}

/* A config error names the file once. */
START_TEST(test_config_error_path_once) {
  char p[300];
  snprintf(p, sizeof p, "%s/badkey.json", workdir);
  const char *cfg = "{\"name\": \"x\", \"model\": [{\"type\": "
                    "\"linear\", \"outt\": 3}]}\n";
  write_file(p, cfg, strlen(cfg));
  const char *args[] = {"run", "--config", p, NULL};
  result r = run("badkey", args);
  check_error(&r, 2, "run", "unknown key in a config file");
  ck_assert_msg(count_of(r.err, p) == 1, "path not named once: %s", r.err);
  ck_assert_ptr_nonnull(strstr(r.err, "model[0].outt: unknown key"));
  result_free(&r);
  snprintf(p, sizeof p, "%s/no-such-config.json", workdir);
  const char *args2[] = {"run", "--config", p, NULL};
  r = run("nocfg", args2);
  check_error(&r, 3, "run", "missing config file");
  ck_assert_msg(count_of(r.err, p) == 1, "path not named once: %s", r.err);
  result_free(&r);
}
END_TEST

/* revin-overflow: clipping on (max_norm 5) though no norm was finite; with
 * --fp32 revin the scaler is on and stays at its initial scale 1, and
 * postmortem agrees (it reads the stored config). */
START_TEST(test_run_scaler_and_clip_lines) {
  char t1[300], t2[300], t3[300];
  snprintf(t1, sizeof t1, "%s/sum-ro.h5", workdir);
  snprintf(t2, sizeof t2, "%s/sum-fix.h5", workdir);
  snprintf(t3, sizeof t3, "%s/sum-off.h5", workdir);
  const char *a1[] = {"run", "--scenario", "revin-overflow", "-q", "-o", t1,
                      NULL};
  result r = run("sum1", a1);
  ck_assert_int_eq(r.rc, 1);
  ck_assert_msg(strstr(r.out, "largest clip    clipping on (max_norm 5); no "
                              "finite gradient norm seen"),
                "%s", r.out);
  ck_assert_ptr_null(strstr(r.out, "clipping off"));
  result_free(&r);
  /* the same -o again: replacing a trace takes --force (issue 17.3) */
  const char *a1j[] = {"run", "--scenario", "revin-overflow", "-q", "--json",
                       "--force", "-o", t1, NULL};
  r = run("sum1j", a1j);
  json_t *j = parse_json(r.out, "run --json");
  ck_assert(json_is_true(json_object_get(j, "loss_scaling")));
  ck_assert(json_real_value(json_object_get(j, "clip_max_norm")) == 5.0);
  ck_assert_int_eq(json_integer_value(json_object_get(j, "clip_norms_seen")),
                   0);
  ck_assert(json_is_null(json_object_get(j, "max_clip_ratio")));
  json_decref(j);
  result_free(&r);

  const char *a2[] = {"run", "--scenario", "revin-overflow", "--fp32", "revin",
                      "--trace", "-q", "-o", t2, NULL};
  r = run("sum2", a2);
  ck_assert_int_eq(r.rc, 0);
  ck_assert_msg(strstr(r.out, "loss scale      1..1, final 1; 0 backoffs"),
                "%s", r.out);
  ck_assert_ptr_null(strstr(r.out, "loss scale      off"));
  ck_assert_ptr_nonnull(strstr(r.out, "(max_norm 5)"));
  result_free(&r);
  int rc = -1;
  j = postmortem_json(t2, &rc);
  ck_assert_ptr_nonnull(j);
  json_t *sc = json_object_get(j, "scaler");
  ck_assert(json_is_true(json_object_get(sc, "enabled")));
  ck_assert_str_eq(json_string_value(json_object_get(sc, "enabled_source")),
                   "config");
  json_decref(j);
  const char *pa[] = {"postmortem", t2, NULL};
  r = run("sum2pm", pa);
  ck_assert_ptr_null(strstr(r.out, "loss scaling off"));
  ck_assert_ptr_nonnull(strstr(r.out, "scale       1 -> 1"));
  result_free(&r);

  /* really off: --no-loss-scale */
  const char *a3[] = {"run", "--scenario", "revin-overflow", "--fp32", "revin",
                      "--no-loss-scale", "--clip-norm", "0", "--trace", "-q",
                      "-o", t3, NULL};
  r = run("sum3", a3);
  ck_assert_ptr_nonnull(strstr(r.out, "loss scale      off"));
  ck_assert_ptr_nonnull(strstr(r.out, "largest clip    clipping off"));
  result_free(&r);
  const char *pb[] = {"postmortem", t3, NULL};
  r = run("sum3pm", pb);
  ck_assert_ptr_nonnull(strstr(r.out, "loss scaling off"));
  result_free(&r);
}
END_TEST

/* lr-too-high stops early: no gradient records in the second half -> n/a
 * in the text, null in the JSON, never nan. */
/* run's summary points at postmortem when a layer made inf/NaN in the forward
 * pass although the loss stayed finite (bn-overflow), but not for a scaled
 * gradient overflow the scaler handled (healthy's backoff at step 1). */
START_TEST(test_run_note_on_forward_nonfinite) {
  char t1[300], t2[300];
  snprintf(t1, sizeof t1, "%s/note-bn.h5", workdir);
  snprintf(t2, sizeof t2, "%s/note-healthy.h5", workdir);
  const char *a1[] = {"run", "--scenario", "bn-overflow", "-q", "-o", t1, NULL};
  result r = run("note1", a1);
  ck_assert_int_eq(r.rc, 1); /* degraded: issue 15.1 */
  ck_assert_msg(strstr(r.out, "verdict         DEGRADED"), "%s", r.out);
  ck_assert_msg(strstr(r.out, "note            the loss stayed finite, but a "
                              "layer produced inf/NaN (enc.bn1 at step 0)"),
                "%s", r.out);
  result_free(&r);
  const char *a2[] = {"run", "--scenario", "healthy", "-q", "-o", t2, NULL};
  r = run("note2", a2);
  ck_assert_int_eq(r.rc, 0);
  ck_assert_msg(strstr(r.out, "site weight_grad"), "%s", r.out);
  ck_assert_msg(!strstr(r.out, "note  "), "%s", r.out);
  result_free(&r);
}
END_TEST

START_TEST(test_postmortem_no_nan_percent) {
  char t[300];
  snprintf(t, sizeof t, "%s/lr.h5", workdir);
  const char *a[] = {"run", "--scenario", "lr-too-high", "--trace", "-q", "-o",
                     t, NULL};
  result r = run("lr", a);
  ck_assert_int_eq(r.rc, 1);
  result_free(&r);
  const char *pa[] = {"postmortem", t, NULL};
  r = run("lrpm", pa);
  ck_assert_ptr_null(strstr(r.out, "nan%"));
  ck_assert_ptr_null(strstr(r.out, "-nan"));
  ck_assert_msg(strstr(r.out, "n/a   zeros"), "%s", r.out);
  result_free(&r);
  int rc;
  json_t *j = postmortem_json(t, &rc);
  ck_assert_ptr_nonnull(j);
  json_t *l0 = json_array_get(json_object_get(j, "layers"), 0);
  ck_assert_ptr_nonnull(l0);
  ck_assert(json_is_null(
      json_object_get(l0, "subnormal_or_flush_second_half")));
  json_decref(j);
}
END_TEST

/* two-culprits with revin in FP32: inf appears in the FP32 loss; the FP16
 * softmax that underflowed is the layer to keep in FP32. */
START_TEST(test_underflow_names_fp16_layer) {
  char t[300];
  snprintf(t, sizeof t, "%s/tc.h5", workdir);
  const char *a[] = {"run", "--scenario", "two-culprits", "--fp32", "revin",
                     "--trace", "-q", "-o", t, NULL};
  result r = run("tc", a);
  result_free(&r);
  int rc;
  json_t *j = postmortem_json(t, &rc);
  ck_assert_ptr_nonnull(j);
  json_t *top = json_array_get(json_object_get(j, "diagnosis"), 0);
  const char *title = json_string_value(json_object_get(top, "title"));
  ck_assert_str_eq(json_string_value(json_object_get(top, "id")),
                   "force-fp32");
  ck_assert_msg(title && strstr(title, "keep 'head.softmax' in FP32"),
                "title: %s", title ? title : "");
  ck_assert_ptr_null(strstr(title, "keep it in FP32"));
  json_decref(j);
}
END_TEST

/* Every long option of diff's and report's option list is in its usage
 * line. */
START_TEST(test_usage_lists_options) {
  const char *subs[] = {"diff", "report", "postmortem"};
  for (int i = 0; i < 3; i++) {
    const char *a[] = {subs[i], "--help", NULL};
    result r = run("usagehelp", a);
    ck_assert_int_eq(r.rc, 0);
    const char *blank = strstr(r.out, "\n\n");
    ck_assert_ptr_nonnull(blank);
    size_t ulen = (size_t)(blank - r.out);
    char *usage = strndup(r.out, ulen);
    for (const char *p = blank; (p = strstr(p, "\n  -")); p++) {
      /* "  --name" or "  -x, --name" */
      const char *opt = strstr(p, "--");
      const char *eol = strchr(p + 1, '\n');
      if (!opt || (eol && opt > eol)) continue;
      char name[64];
      size_t k = 0;
      while (k < sizeof name - 1 &&
             (opt[k] == '-' || (opt[k] >= 'a' && opt[k] <= 'z')))
        name[k] = opt[k], k++;
      name[k] = 0;
      if (!strcmp(name, "--help")) continue;
      char shortopt[4] = "";
      if (p[4] != '-' && p[5] == ',') /* "\n  -x, --name" */
        snprintf(shortopt, sizeof shortopt, "-%c", p[4]);
      ck_assert_msg(strstr(usage, name) ||
                        (shortopt[0] && strstr(usage, shortopt)),
                    "%s: %s is missing from the usage line:\n%s", subs[i],
                    name, usage);
    }
    free(usage);
    result_free(&r);
  }
}
END_TEST

/* ---- runner --------------------------------------------------------------- */

int main(int argc, char **argv) {
  const char *only = argc > 1 ? argv[1] : NULL;
  snprintf(workdir, sizeof workdir, "/tmp/ampprobe-e2e-%d", (int)getpid());
  mkdir(workdir, 0755);
  H5Eset_auto2(H5E_DEFAULT, NULL, NULL);

  Suite *s = suite_create("ampprobe-e2e");
  if (!only || !strcmp(only, "scenarios")) {
    TCase *tc = tcase_create("scenarios");
    tcase_set_timeout(tc, 120);
    tcase_add_loop_test(tc, test_scenario, 0, N_TABLE);
    suite_add_tcase(s, tc);
  }
  if (!only || !strcmp(only, "coverage")) {
    TCase *tc = tcase_create("coverage");
    tcase_add_test(tc, test_coverage);
    suite_add_tcase(s, tc);
  }
  if (!only || !strcmp(only, "killed")) {
    TCase *tc = tcase_create("killed");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_killed_writer);
    tcase_add_test(tc, test_sigint_run);
    suite_add_tcase(s, tc);
  }
  if (!only || !strcmp(only, "errors")) {
    TCase *tc = tcase_create("errors");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_missing_file);
    tcase_add_test(tc, test_not_hdf5);
    tcase_add_test(tc, test_not_a_trace);
    tcase_add_test(tc, test_truncated);
    tcase_add_test(tc, test_corrupt_data);
    tcase_add_test(tc, test_corrupt_metadata);
    tcase_add_test(tc, test_usage_errors);
    tcase_add_test(tc, test_help_and_version);
    tcase_add_test(tc, test_output_unwritable);
    suite_add_tcase(s, tc);
  }
  if (!only || !strcmp(only, "outputs")) {
    TCase *tc = tcase_create("outputs");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_config_error_path_once);
    tcase_add_test(tc, test_run_scaler_and_clip_lines);
    tcase_add_test(tc, test_postmortem_no_nan_percent);
    tcase_add_test(tc, test_run_note_on_forward_nonfinite);
    tcase_add_test(tc, test_underflow_names_fp16_layer);
    tcase_add_test(tc, test_usage_lists_options);
    suite_add_tcase(s, tc);
  }
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  if (!failed) {
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", workdir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", workdir);
  }
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
