/*
 * tools/bisect.c - `ampprobe bisect --fp32-candidates LIST`: finds a minimal
 * set of modules to keep in FP32 so that FP16 training stays healthy.
 *
 * 1. Premises, run in parallel: everything in FP16 (must fail), the FP32
 *    baseline (must pass, else "not a precision problem"), every candidate
 *    in FP32 (must pass, else "candidates are not enough", with the layers
 *    the post-mortem engine implicates in that still-failing run).
 * 2. ddmin (tools/ddmin.c) over the candidates; with --granularity layer a
 *    second ddmin narrows the kinds found down to their layer instances.
 * Each trial is a child process `ampprobe run ... --json -q -o
 * WORKDIR/trial-NN.h5` (fork/exec of /proc/self/exe), at most -j at a time;
 * its JSON summary is judged by the failure criteria (docs/cli.md). Ctrl-C
 * stops the children and prints the table so far (exit 130).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ampprobe/trainer.h"
#include "cli.h"
#include "ddmin.h"
#include "diagnose.h"

static const char *SUB = "bisect";

#define MAX_PASS 32      /* run options passed through after -- */
#define LIST_MAX 4352    /* a comma-separated fp32 list: 64 names of 64 */

static void usage(FILE *f) {
  fprintf(f,
"usage: ampprobe bisect --fp32-candidates LIST [--scenario NAME | --config FILE]\n"
"                       [--granularity kind|layer] [-j N] [--steps N] [--seed S]\n"
"                       [--workdir DIR] [failure criteria] [--json] [-o FILE]\n"
"                       [-q] [-- RUN OPTIONS]\n"
"\n"
"Finds a minimal set of modules to keep in FP32 so that FP16 training stays\n"
"healthy. Candidates are module kinds or layer-name globs, as in 'run --fp32'.\n"
"It first checks its premises: the run with everything in FP16 must fail, the\n"
"FP32 baseline must pass (otherwise it is not a precision problem), and the\n"
"run with every candidate in FP32 must pass (otherwise the candidates are not\n"
"enough). Then delta debugging (ddmin) finds a set from which no candidate\n"
"can be dropped, in about k*log2(n) trials for k culprits among n candidates.\n"
"\n"
"what to run:\n"
"  --fp32-candidates LIST   comma-separated kinds or layer globs (required)\n"
"  --scenario NAME          built-in scenario (default '%s')\n"
"  --config FILE            JSON config file\n"
"  --steps N, --seed S      passed to every trial\n"
"  -- RUN OPTIONS           anything after -- is passed to every 'ampprobe run'\n"
"                           (e.g. -- --lr 0.01 --no-loss-scale)\n"
"  --granularity G          kind (default): answer in the candidates as given;\n"
"                           layer: then narrow them to single layer instances\n"
"\n"
"a trial fails when (criteria, all checked on the trial's run summary):\n"
"  --fail-nonfinite         any non-finite loss (default on; the trial is\n"
"                           stopped at the first one)\n"
"  --no-fail-nonfinite      do not count non-finite losses by themselves\n"
"  --max-consecutive-skips K  more than K consecutive skipped optimizer\n"
"                           steps (default 20; -1 = off)\n"
"  --min-scale S            the loss scale fell below S (default off)\n"
"  --max-loss-regress PCT   final loss worse than the FP32 baseline's by more\n"
"                           than PCT percent (default 10; -1 = off)\n"
"\n"
"execution and output:\n"
"  -j, --jobs N             trials run in parallel (default: number of CPUs)\n"
"  --workdir DIR            where each trial's trace, summary and log are kept\n"
"                           (default ./ampprobe-bisect-<scenario>/)\n"
"  --trace                  trials record full per-layer traces (default: the\n"
"                           flight recorder)\n"
"  --json                   print the result as JSON on stdout\n"
"  -o, --output FILE        also write the JSON result to FILE (read by\n"
"                           'ampprobe report --bisect FILE')\n"
"  -q, --quiet              no progress line on stderr\n"
"  -h, --help               this help\n"
"\n"
"exit: 0 healthy, nothing to bisect; 1 a minimal set was found, or not a\n"
"      precision problem, or the candidates are not enough; 2 usage error;\n"
"      3 unreadable config; 4 a trial could not run; 130 interrupted\n"
"\n"
"examples:\n"
"  ampprobe bisect --scenario two-culprits --fp32-candidates bn,softmax,revin\n"
"  ampprobe bisect --scenario bn-overflow --fp32-candidates bn --granularity layer\n",
          PROBE_DEFAULT_SCENARIO);
}

/* ---- trials ---------------------------------------------------------------- */

typedef enum trial_state {
  T_QUEUED, T_RUNNING, T_DONE, T_CANCELLING, T_CANCELLED, T_ERROR
} trial_state;

typedef enum trial_role {
  R_ALL_FP16, R_BASELINE, R_ALL_CAND, R_DDMIN, R_DDMIN_LAYER
} trial_role;

static const char *role_name[] = {"all-fp16", "fp32-baseline",
                                  "all-candidates", "ddmin", "ddmin-layer"};

typedef struct trial {
  int id;
  trial_role role;
  char fp32[LIST_MAX]; /* --fp32 value; unused for the baseline */
  uint64_t set;
  trial_state state;
  pid_t pid;
  double t0, seconds;
  int exit_code;    /* of the child; -signal when killed */
  int verdict;      /* PROBE_DDMIN_PASS / FAIL / UNKNOWN */
  char why[256];
  const char *cancel_why; /* why it was cancelled (set by kill_running) */
  /* from the run's JSON summary */
  int have_summary;
  int64_t steps_run, steps_planned, longest_skip, first_nonfinite_loss;
  double final_loss, min_scale;
  int diverged;
  char trace[1024];
} trial;

typedef struct bisect {
  /* options */
  const char *scenario, *config;
  const char *steps, *seed;
  char *pass[MAX_PASS];
  int n_pass;
  int jobs, full_trace, quiet;
  int fail_nonfinite;
  int64_t max_skips;
  double min_scale, max_regress;
  char workdir[512];
  char self[1024];
  char warnings[1024]; /* candidates that match no layer */
  /* state */
  trial *trials;
  size_t n_trials, cap_trials;
  int baseline_known;
  double baseline_loss;
  /* the names ddmin works on at the current level */
  char **names;
  int n_names;
  trial_role level_role;
  char error[512];
  int error_exit; /* exit code of the trial that could not run */
  int interrupted;
  double t_start;
  int progress_on;
  double last_draw;
} bisect;

static trial *trial_new(bisect *b, trial_role role, const char *fp32,
                        uint64_t set) {
  if (b->n_trials == b->cap_trials) {
    size_t cap = b->cap_trials ? 2 * b->cap_trials : 32;
    trial *t = realloc(b->trials, cap * sizeof *t);
    if (!t)
      return NULL;
    b->trials = t;
    b->cap_trials = cap;
  }
  trial *t = &b->trials[b->n_trials];
  memset(t, 0, sizeof *t);
  t->id = (int)b->n_trials++;
  t->role = role;
  snprintf(t->fp32, sizeof t->fp32, "%s", fp32 ? fp32 : "");
  t->set = set;
  t->verdict = PROBE_DDMIN_UNKNOWN;
  t->final_loss = t->min_scale = NAN;
  t->first_nonfinite_loss = -1;
  snprintf(t->trace, sizeof t->trace, "%s/trial-%02d.h5", b->workdir, t->id);
  return t;
}

static void trial_path(const bisect *b, const trial *t, const char *ext,
                       char *buf, size_t len) {
  snprintf(buf, len, "%s/trial-%02d.%s", b->workdir, t->id, ext);
}

/* argv of `ampprobe run` for one trial; strings point into b and t. */
static int trial_argv(const bisect *b, const trial *t, char **argv, int max) {
  int n = 0;
#define ARG(s)                                                                 \
  do {                                                                         \
    if (n < max - 1)                                                           \
      argv[n++] = (char *)(s);                                                 \
  } while (0)
  ARG(b->self);
  ARG("run");
  if (b->config) {
    ARG("--config");
    ARG(b->config);
  } else {
    ARG("--scenario");
    ARG(b->scenario);
  }
  if (b->steps) {
    ARG("--steps");
    ARG(b->steps);
  }
  if (b->seed) {
    ARG("--seed");
    ARG(b->seed);
  }
  if (t->role == R_BASELINE) {
    ARG("--precision");
    ARG("fp32");
  } else {
    ARG("--fp32");
    ARG(t->fp32);
  }
  for (int i = 0; i < b->n_pass; i++)
    ARG(b->pass[i]);
  if (b->fail_nonfinite)
    ARG("--stop-on-nonfinite");
  if (b->full_trace)
    ARG("--trace");
  ARG("--json");
  ARG("-q");
  ARG("-o");
  ARG(t->trace);
#undef ARG
  argv[n] = NULL;
  return n;
}

static int trial_launch(bisect *b, trial *t) {
  char *argv[64 + MAX_PASS];
  trial_argv(b, t, argv, (int)(sizeof argv / sizeof argv[0]));
  char out[1100], log[1100];
  trial_path(b, t, "json", out, sizeof out);
  trial_path(b, t, "log", log, sizeof log);
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  if (pid < 0) {
    snprintf(b->error, sizeof b->error, "cannot start a trial: %s",
             strerror(errno));
    return -1;
  }
  if (pid == 0) {
    int fo = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int fe = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int fi = open("/dev/null", O_RDONLY);
    if (fo < 0 || fe < 0 || fi < 0)
      _exit(127);
    dup2(fi, 0);
    dup2(fo, 1);
    dup2(fe, 2);
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    execv(b->self, argv);
    dprintf(2, "ampprobe: bisect: cannot run %s: %s\n", b->self,
            strerror(errno));
    _exit(127);
  }
  t->pid = pid;
  t->state = T_RUNNING;
  t->t0 = cli_now();
  return 0;
}

/* Reads the run's JSON summary (stdout of the child). */
static void trial_read_summary(bisect *b, trial *t) {
  char path[1100];
  trial_path(b, t, "json", path, sizeof path);
  json_t *j = json_load_file(path, 0, NULL);
  if (!json_is_object(j)) {
    json_decref(j);
    return;
  }
  t->have_summary = 1;
  json_t *v;
  t->steps_run = json_integer_value(json_object_get(j, "steps_run"));
  t->steps_planned = json_integer_value(json_object_get(j, "steps_planned"));
  t->longest_skip = json_integer_value(json_object_get(j, "longest_skip_run"));
  v = json_object_get(j, "final_loss");
  t->final_loss = json_is_number(v) ? json_number_value(v) : NAN;
  v = json_object_get(j, "min_scale");
  t->min_scale = json_is_number(v) ? json_number_value(v) : NAN;
  v = json_object_get(j, "first_nonfinite_loss_step");
  t->first_nonfinite_loss = json_is_integer(v) ? json_integer_value(v) : -1;
  t->diverged = json_is_true(json_object_get(j, "diverged"));
  json_decref(j);
}

/* The last line of a trial's stderr, for error messages. */
static void trial_last_log_line(bisect *b, trial *t, char *buf, size_t len) {
  char path[1100];
  trial_path(b, t, "log", path, sizeof path);
  buf[0] = 0;
  FILE *f = fopen(path, "r");
  if (!f)
    return;
  char line[512];
  while (fgets(line, sizeof line, f))
    if (line[0] && line[0] != '\n' && line[0] != '\r')
      snprintf(buf, len, "%.*s", (int)(len > 1 ? len - 1 : 0), line);
  fclose(f);
  size_t n = strlen(buf);
  while (n && (buf[n - 1] == '\n' || buf[n - 1] == '\r'))
    buf[--n] = 0;
}

/* Applies the failure criteria. The baseline is judged without the loss
 * regression criterion. */
static void trial_judge(bisect *b, trial *t) {
  if (t->state != T_DONE)
    return;
  int fail = 0;
  char *w = t->why;
  size_t len = sizeof t->why;
  if (b->fail_nonfinite && (t->diverged || t->first_nonfinite_loss >= 0)) {
    fail = 1;
    if (t->first_nonfinite_loss >= 0)
      snprintf(w, len, "non-finite loss at step %lld",
               (long long)t->first_nonfinite_loss);
    else
      snprintf(w, len, "non-finite final loss");
  } else if (b->max_skips >= 0 && t->longest_skip > b->max_skips) {
    fail = 1;
    snprintf(w, len, "%lld consecutive skipped steps (> %lld)",
             (long long)t->longest_skip, (long long)b->max_skips);
  } else if (b->min_scale > 0 && isfinite(t->min_scale) &&
             t->min_scale < b->min_scale) {
    fail = 1;
    snprintf(w, len, "loss scale fell to %g (< %g)", t->min_scale,
             b->min_scale);
  } else if (t->role != R_BASELINE && b->max_regress >= 0 &&
             b->baseline_known && isfinite(b->baseline_loss) &&
             (!isfinite(t->final_loss) ||
              t->final_loss > b->baseline_loss +
                                  fabs(b->baseline_loss) * b->max_regress /
                                      100.0)) {
    fail = 1;
    if (isfinite(t->final_loss))
      snprintf(w, len, "final loss %.4g is %.0f%% above the FP32 baseline's "
                       "%.4g (> %g%%)",
               t->final_loss,
               100.0 * (t->final_loss - b->baseline_loss) /
                   fabs(b->baseline_loss),
               b->baseline_loss, b->max_regress);
    else
      snprintf(w, len, "final loss is not finite");
  } else if (!fail) {
    if (t->role != R_BASELINE && b->baseline_known &&
        isfinite(b->baseline_loss) && b->baseline_loss != 0 &&
        isfinite(t->final_loss))
      snprintf(w, len, "final loss %.4g (%+.1f%% vs FP32 baseline)",
               t->final_loss,
               100.0 * (t->final_loss - b->baseline_loss) /
                   fabs(b->baseline_loss));
    else
      snprintf(w, len, "final loss %.4g", t->final_loss);
  }
  t->verdict = fail ? PROBE_DDMIN_FAIL : PROBE_DDMIN_PASS;
}

static void trial_finish(bisect *b, trial *t, int status) {
  t->seconds = cli_now() - t->t0;
  t->exit_code = WIFEXITED(status) ? WEXITSTATUS(status)
                                   : -(WIFSIGNALED(status) ? WTERMSIG(status)
                                                           : 0);
  /* Ctrl-C on the terminal reaches the trials too: they stop cleanly with
   * exit 130, perhaps before this process has looked at its own flag */
  if (cli_stop_flag && (t->exit_code == CLI_EXIT_INTERRUPTED || t->exit_code < 0))
    t->state = T_CANCELLING;
  if (t->state == T_CANCELLING) {
    t->state = T_CANCELLED;
    snprintf(t->why, sizeof t->why, "%s",
             b->interrupted || cli_stop_flag
                 ? "interrupted"
                 : (t->cancel_why ? t->cancel_why : "cancelled"));
    return;
  }
  if (t->exit_code == 0 || t->exit_code == 1) {
    trial_read_summary(b, t);
    if (t->have_summary) {
      t->state = T_DONE;
      if (b->baseline_known || t->role == R_BASELINE)
        trial_judge(b, t);
      return;
    }
  }
  t->state = T_ERROR;
  char line[400];
  trial_last_log_line(b, t, line, sizeof line);
  if (t->exit_code < 0)
    snprintf(t->why, sizeof t->why, "killed by signal %d%s%s", -t->exit_code,
             line[0] ? ": " : "", line);
  else
    snprintf(t->why, sizeof t->why, "exit %d%s%s", t->exit_code,
             line[0] ? ": " : "", line);
}

static void progress_draw(bisect *b, int force) {
  if (!b->progress_on)
    return;
  double now = cli_now();
  if (!force && now - b->last_draw < 0.1)
    return;
  b->last_draw = now;
  size_t done = 0, running = 0;
  for (size_t i = 0; i < b->n_trials; i++) {
    trial_state s = b->trials[i].state;
    done += s == T_DONE || s == T_CANCELLED || s == T_ERROR;
    running += s == T_RUNNING || s == T_CANCELLING;
  }
  fprintf(stderr, "\r\033[Kbisect: %zu trials done, %zu running, %.1f s",
          done, running, now - b->t_start);
  fflush(stderr);
}

static void progress_clear(bisect *b) {
  if (b->progress_on) {
    fprintf(stderr, "\r\033[K");
    fflush(stderr);
  }
}

/* Stops the running trials ts[from..n); why is shown for each. */
static void kill_running(trial **ts, size_t n, size_t from, const char *why) {
  for (size_t i = from; i < n; i++)
    if (ts[i]->state == T_RUNNING) {
      kill(ts[i]->pid, SIGTERM);
      ts[i]->state = T_CANCELLING;
      ts[i]->cancel_why = why;
    }
}

/* Runs trials ts[0..n) at most b->jobs at a time. With first_pass, stops
 * launching past the first trial (in order) that passes and cancels the
 * later ones still running. Returns PROBE_OK, PROBE_ERR_INTERRUPTED, or
 * PROBE_ERR_IO when a trial could not run (b->error says why). */
static probe_status run_trials(bisect *b, trial **ts, size_t n,
                               int first_pass) {
  size_t next = 0, running = 0, stop_at = n;
  probe_status result = PROBE_OK;
  /* why the trials after stop_at are not run */
  const char *not_run = "not needed: an earlier trial passed";
  for (;;) {
    if (cli_stop_flag && !b->interrupted) {
      b->interrupted = 1;
      result = PROBE_ERR_INTERRUPTED;
      kill_running(ts, n, 0, "interrupted");
      stop_at = 0;
    }
    while (result == PROBE_OK && running < (size_t)b->jobs && next < stop_at) {
      if (trial_launch(b, ts[next]) != 0) {
        result = PROBE_ERR_IO;
        not_run = "not run: a trial could not be started";
        kill_running(ts, n, 0, "cancelled: a trial could not be started");
        stop_at = 0;
        break;
      }
      next++;
      running++;
    }
    if (running == 0)
      break;
    int status;
    pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid == 0 || (pid < 0 && errno == EINTR)) {
      progress_draw(b, 0);
      struct timespec ts_sleep = {0, 10 * 1000 * 1000};
      nanosleep(&ts_sleep, NULL);
      continue;
    }
    if (pid < 0)
      break; /* no children left: should not happen */
    size_t k = n;
    for (size_t i = 0; i < n; i++)
      if (ts[i]->pid == pid &&
          (ts[i]->state == T_RUNNING || ts[i]->state == T_CANCELLING))
        k = i;
    if (k == n)
      continue; /* not ours */
    running--;
    trial_finish(b, ts[k], status);
    progress_draw(b, 1);
    if (ts[k]->state == T_ERROR && result == PROBE_OK) {
      snprintf(b->error, sizeof b->error, "trial %02d could not run (%s)",
               ts[k]->id, ts[k]->why);
      b->error_exit = ts[k]->exit_code;
      result = PROBE_ERR_IO;
      not_run = "not run: an earlier trial errored";
      kill_running(ts, n, 0, "cancelled: another trial errored");
      stop_at = 0;
    }
    if (first_pass && ts[k]->state == T_DONE &&
        ts[k]->verdict == PROBE_DDMIN_PASS && k < stop_at) {
      stop_at = k + 1;
      kill_running(ts, n, k + 1,
                   "cancelled: an earlier trial of the round passed");
    }
  }
  /* trials never launched */
  for (size_t i = 0; i < n; i++)
    if (ts[i]->state == T_QUEUED) {
      ts[i]->state = T_CANCELLED;
      snprintf(ts[i]->why, sizeof ts[i]->why, "%s",
               b->interrupted ? "not run (interrupted)" : not_run);
    }
  return result;
}

/* ---- ddmin's oracle --------------------------------------------------------- */

static void set_to_list(const bisect *b, uint64_t set, char *buf, size_t len) {
  size_t off = 0;
  buf[0] = 0;
  for (int i = 0; i < b->n_names && off < len; i++)
    if (set >> i & 1)
      off += (size_t)snprintf(buf + off, len - off, "%s%s", off ? "," : "",
                              b->names[i]);
}

static probe_status oracle(void *ctx, const uint64_t *sets, size_t count,
                           int *verdict) {
  bisect *b = ctx;
  trial *ts_buf[2 * PROBE_DDMIN_MAX + 1];
  size_t base = b->n_trials;
  for (size_t i = 0; i < count; i++) {
    char list[LIST_MAX];
    set_to_list(b, sets[i], list, sizeof list);
    if (!trial_new(b, b->level_role, list, sets[i]))
      return PROBE_ERR_NOMEM;
  }
  for (size_t i = 0; i < count; i++) /* after every realloc */
    ts_buf[i] = &b->trials[base + i];
  probe_status st = run_trials(b, ts_buf, count, 1);
  for (size_t i = 0; i < count; i++)
    verdict[i] = ts_buf[i]->state == T_DONE ? ts_buf[i]->verdict
                                            : PROBE_DDMIN_UNKNOWN;
  /* sets never launched (an earlier one passed) are not trials: drop them;
   * launches go in order, so they are the batch's tail */
  size_t keep = count;
  while (keep > 0 && ts_buf[keep - 1]->pid == 0)
    keep--;
  b->n_trials = base + keep;
  return st;
}

/* ---- output ------------------------------------------------------------------ */

typedef enum outcome {
  O_FOUND, O_HEALTHY, O_NOT_PRECISION, O_INSUFFICIENT, O_INTERRUPTED, O_ERROR
} outcome;

static const char *outcome_name[] = {"minimal-set-found", "healthy",
                                     "not-a-precision-problem",
                                     "candidates-insufficient", "interrupted",
                                     "error"};

typedef struct result {
  outcome oc;
  char summary[1024];
  char minimal[LIST_MAX];        /* candidates as given */
  char minimal_layers[LIST_MAX]; /* --granularity layer */
  char reproduce[LIST_MAX + 512];
  char implicated[512];          /* postmortem on the all-candidates run */
  char suggest[512];             /* new candidates it proposes */
  char finding[DIAG_TEXT_MAX];   /* its top-ranked finding */
  size_t ddmin_trials;
} result;

static const char *verdict_str(const trial *t) {
  switch (t->state) {
  case T_DONE: return t->verdict == PROBE_DDMIN_PASS ? "PASS" : "FAIL";
  case T_CANCELLED: return "-";
  case T_ERROR: return "ERROR";
  default: return "?";
  }
}

static void shell_quote(char *buf, size_t len, const char *s) {
  if (*s && strspn(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                      "0123456789,._-/=:+") == strlen(s)) {
    snprintf(buf, len, "%s", s);
    return;
  }
  size_t o = 0;
  if (o < len - 1)
    buf[o++] = '\'';
  for (; *s && o + 5 < len; s++) {
    if (*s == '\'') {
      memcpy(buf + o, "'\\''", 4);
      o += 4;
    } else {
      buf[o++] = *s;
    }
  }
  buf[o++] = '\'';
  buf[o] = 0;
}

static void make_reproduce(const bisect *b, const char *fp32, char *buf,
                           size_t len) {
  char q[LIST_MAX + 8];
  size_t o = 0;
#define PUT(...)                                                               \
  do {                                                                         \
    if (o < len)                                                               \
      o += (size_t)snprintf(buf + o, len - o, __VA_ARGS__);                    \
  } while (0)
  PUT("ampprobe run");
  if (b->config) {
    shell_quote(q, sizeof q, b->config);
    PUT(" --config %s", q);
  } else {
    PUT(" --scenario %s", b->scenario);
  }
  if (b->steps)
    PUT(" --steps %s", b->steps);
  if (b->seed)
    PUT(" --seed %s", b->seed);
  shell_quote(q, sizeof q, fp32);
  PUT(" --fp32 %s", q);
  for (int i = 0; i < b->n_pass; i++) {
    shell_quote(q, sizeof q, b->pass[i]);
    PUT(" %s", q);
  }
#undef PUT
}

static json_t *num_or_null(double x) {
  return isfinite(x) ? json_real(x) : json_null();
}

static json_t *list_json(const char *list) {
  json_t *a = json_array();
  char tmp[LIST_MAX];
  snprintf(tmp, sizeof tmp, "%s", list);
  char *save = NULL;
  for (char *p = strtok_r(tmp, ",", &save); p; p = strtok_r(NULL, ",", &save))
    json_array_append_new(a, json_string(p));
  return a;
}

static json_t *result_json(const bisect *b, const result *r,
                           const char *candidates, const char *granularity,
                           const char *name) {
  json_t *o = json_object();
  json_object_set_new(o, "command", json_string("bisect"));
  json_object_set_new(o, "scenario", json_string(name));
  json_object_set_new(o, "config", b->config ? json_string(b->config) : json_null());
  json_object_set_new(o, "candidates", list_json(candidates));
  json_object_set_new(o, "granularity", json_string(granularity));
  json_object_set_new(o, "unmatched_candidates",
                      b->warnings[0] ? list_json(b->warnings) : json_array());
  json_t *c = json_object();
  json_object_set_new(c, "fail_nonfinite", json_boolean(b->fail_nonfinite));
  json_object_set_new(c, "max_consecutive_skips",
                      b->max_skips >= 0 ? json_integer(b->max_skips) : json_null());
  json_object_set_new(c, "min_scale", b->min_scale > 0 ? json_real(b->min_scale)
                                                       : json_null());
  json_object_set_new(c, "max_loss_regress_pct",
                      b->max_regress >= 0 ? json_real(b->max_regress) : json_null());
  json_object_set_new(o, "criteria", c);
  json_object_set_new(o, "outcome", json_string(outcome_name[r->oc]));
  json_object_set_new(o, "summary", json_string(r->summary));
  json_object_set_new(o, "minimal_set",
                      r->oc == O_FOUND ? list_json(r->minimal) : json_null());
  json_object_set_new(o, "minimal_layers",
                      r->oc == O_FOUND && r->minimal_layers[0]
                          ? list_json(r->minimal_layers)
                          : json_null());
  json_object_set_new(o, "reproduce",
                      r->reproduce[0] ? json_string(r->reproduce) : json_null());
  json_object_set_new(o, "implicated_layers",
                      r->implicated[0] ? list_json(r->implicated) : json_null());
  json_object_set_new(o, "suggested_candidates",
                      r->suggest[0] ? list_json(r->suggest) : json_null());
  json_object_set_new(o, "postmortem_finding",
                      r->finding[0] ? json_string(r->finding) : json_null());
  json_object_set_new(o, "baseline_final_loss",
                      b->baseline_known ? num_or_null(b->baseline_loss)
                                        : json_null());
  size_t ran = 0, cancelled = 0;
  json_t *arr = json_array();
  for (size_t i = 0; i < b->n_trials; i++) {
    const trial *t = &b->trials[i];
    ran += t->state == T_DONE || t->state == T_ERROR;
    cancelled += t->state == T_CANCELLED;
    json_t *x = json_object();
    json_object_set_new(x, "id", json_integer(t->id));
    json_object_set_new(x, "role", json_string(role_name[t->role]));
    json_object_set_new(x, "precision",
                        json_string(t->role == R_BASELINE ? "fp32" : "fp16"));
    json_object_set_new(x, "fp32", t->role == R_BASELINE ? json_null()
                                                         : list_json(t->fp32));
    json_object_set_new(x, "verdict",
                        json_string(t->state == T_DONE
                                        ? (t->verdict == PROBE_DDMIN_PASS
                                               ? "pass"
                                               : "fail")
                                        : t->state == T_ERROR ? "error"
                                                              : "cancelled"));
    json_object_set_new(x, "why", json_string(t->why));
    json_object_set_new(x, "steps_run", json_integer(t->steps_run));
    json_object_set_new(x, "steps_planned", json_integer(t->steps_planned));
    json_object_set_new(x, "final_loss", num_or_null(t->final_loss));
    json_object_set_new(x, "longest_skip_run", json_integer(t->longest_skip));
    json_object_set_new(x, "min_scale", num_or_null(t->min_scale));
    json_object_set_new(x, "seconds", num_or_null(t->seconds));
    json_object_set_new(x, "trace", json_string(t->trace));
    json_array_append_new(arr, x);
  }
  json_object_set_new(o, "trials", arr);
  json_object_set_new(o, "trials_run", json_integer((json_int_t)ran));
  json_object_set_new(o, "trials_cancelled", json_integer((json_int_t)cancelled));
  json_object_set_new(o, "ddmin_trials", json_integer((json_int_t)r->ddmin_trials));
  json_object_set_new(o, "jobs", json_integer(b->jobs));
  json_object_set_new(o, "wall_seconds", json_real(cli_now() - b->t_start));
  json_object_set_new(o, "workdir", json_string(b->workdir));
  return o;
}

static void print_text(const bisect *b, const result *r, const char *candidates,
                       const char *granularity, const char *name) {
  FILE *f = stdout;
  fprintf(f, "ampprobe bisect: %s, candidates %s (granularity %s)\n", name,
          candidates, granularity);
  fprintf(f, "  a trial fails on:");
  int any = 0;
  if (b->fail_nonfinite)
    fprintf(f, "%s non-finite loss", any++ ? ";" : "");
  if (b->max_skips >= 0)
    fprintf(f, "%s > %lld consecutive skipped steps", any++ ? ";" : "",
            (long long)b->max_skips);
  if (b->min_scale > 0)
    fprintf(f, "%s loss scale < %g", any++ ? ";" : "", b->min_scale);
  if (b->max_regress >= 0)
    fprintf(f, "%s final loss > %g%% above the FP32 baseline",
            any++ ? ";" : "", b->max_regress);
  if (!any)
    fprintf(f, " nothing (every criterion is off)");
  fprintf(f, "\n\n");
  int w = 14; /* width of the set column: the longest set, at most 48 */
  for (size_t i = 0; i < b->n_trials; i++) {
    int l = b->trials[i].role == R_BASELINE ? 23 : (int)strlen(b->trials[i].fp32);
    if (l > w)
      w = l < 48 ? l : 48;
  }
  fprintf(f, "  %-3s %-15s %-*s %-7s %-9s %7s  %s\n", "#", "trial", w,
          "forced to FP32", "verdict", "steps", "time", "why");
  size_t ran = 0, cancelled = 0;
  for (size_t i = 0; i < b->n_trials; i++) {
    const trial *t = &b->trials[i];
    ran += t->state == T_DONE || t->state == T_ERROR;
    cancelled += t->state == T_CANCELLED;
    char steps[48] = "-", tm[24] = "-";
    if (t->have_summary)
      snprintf(steps, sizeof steps, "%lld/%lld", (long long)t->steps_run,
               (long long)t->steps_planned);
    if (t->state == T_DONE || t->state == T_ERROR || t->seconds > 0)
      snprintf(tm, sizeof tm, "%.2fs", t->seconds);
    const char *set = t->role == R_BASELINE ? "(all: --precision fp32)"
                      : t->fp32[0]          ? t->fp32
                                            : "(nothing)";
    fprintf(f, "  %02d  %-15s %-*s %-7s %-9s %7s  %s\n", t->id,
            role_name[t->role], w, set, verdict_str(t), steps, tm, t->why);
  }
  fprintf(f, "\n");
  fprintf(f, "result: %s\n", r->summary);
  if (r->oc == O_FOUND) {
    fprintf(f, "  minimal set     %s%s\n", r->minimal,
            strchr(r->minimal, ',')
                ? "  (1-minimal: dropping any one of them fails)"
                : "");
    if (r->minimal_layers[0])
      fprintf(f, "  minimal layers  %s\n", r->minimal_layers);
  }
  if (r->implicated[0])
    fprintf(f, "  implicated      %s (post-mortem of the all-candidates run)\n",
            r->implicated);
  if (r->reproduce[0])
    fprintf(f, "  reproduce       %s\n", r->reproduce);
  fprintf(f, "  trials          %zu run (%zu in ddmin), %zu cancelled, %.2f s "
             "wall with -j %d\n",
          ran, r->ddmin_trials, cancelled, cli_now() - b->t_start, b->jobs);
  fprintf(f, "  workdir         %s (trace, summary and log of every trial)\n",
          b->workdir);
}

/* ---- helpers ------------------------------------------------------------------- */

static int mkdir_p(const char *path) {
  char tmp[1024];
  snprintf(tmp, sizeof tmp, "%s", path);
  for (char *p = tmp + 1; *p; p++) {
    if (*p != '/')
      continue;
    *p = 0;
    if (mkdir(tmp, 0755) != 0 && errno != EEXIST)
      return -1;
    *p = '/';
  }
  if (mkdir(tmp, 0755) != 0 && errno != EEXIST)
    return -1;
  struct stat st;
  return stat(tmp, &st) == 0 && S_ISDIR(st.st_mode) ? 0 : -1;
}

/* Splits a comma list into unique, non-empty entries. */
static int split_list(const char *list, char ***out, int *n) {
  *out = NULL;
  *n = 0;
  char *tmp = strdup(list);
  if (!tmp)
    return -1;
  char **v = calloc(PROBE_DDMIN_MAX + 1, sizeof *v);
  if (!v) {
    free(tmp);
    return -1;
  }
  int k = 0;
  char *save = NULL;
  for (char *p = strtok_r(tmp, ",", &save); p; p = strtok_r(NULL, ",", &save)) {
    while (*p == ' ')
      p++;
    size_t l = strlen(p);
    while (l && p[l - 1] == ' ')
      p[--l] = 0;
    if (!*p)
      continue;
    int dup = 0;
    for (int i = 0; i < k; i++)
      dup |= !strcmp(v[i], p);
    if (dup)
      continue;
    if (k == PROBE_DDMIN_MAX) {
      k = PROBE_DDMIN_MAX + 1;
      break;
    }
    v[k++] = strdup(p);
  }
  free(tmp);
  *out = v;
  *n = k;
  return 0;
}

static void free_list(char **v, int n) {
  if (!v)
    return;
  for (int i = 0; i < n && i <= PROBE_DDMIN_MAX; i++)
    free(v[i]);
  free(v);
}

/* Post-mortem of a failing trial: the origin layer (or the layer whose
 * gradients underflow most), the diagnosis engine's top finding, and the
 * FP32 candidates it proposes that are not candidates already. */
static void implicate(const trial *t, char **cand, int n_cand, char *layers,
                      size_t ll, char *sugg, size_t sl, char *finding,
                      size_t fl) {
  layers[0] = sugg[0] = finding[0] = 0;
  probe_trace *tr = NULL;
  char err[256];
  if (probe_trace_open_isolated(&tr, t->trace, err, sizeof err) != PROBE_OK)
    return;
  probe_diag d;
  diag_options o;
  diag_options_init(&o);
  if (probe_diag_run(&d, tr, t->trace, &o) == PROBE_OK) {
    if (d.origin_layer >= 0)
      snprintf(layers, ll, "%s", diag_layer_name(&d, d.origin_layer));
    else if (d.worst_underflow_layer >= 0 && d.worst_underflow_frac > 0.01)
      snprintf(layers, ll, "%s", diag_layer_name(&d, d.worst_underflow_layer));
    if (d.n_findings > 0 && d.findings[0].id != DIAG_FINDING_HEALTHY)
      snprintf(finding, fl, "%s", d.findings[0].title);
    char tmp[sizeof d.fp32_candidates];
    snprintf(tmp, sizeof tmp, "%s", d.fp32_candidates);
    char *save = NULL;
    size_t off = 0;
    for (char *p = strtok_r(tmp, ",", &save); p && off < sl;
         p = strtok_r(NULL, ",", &save)) {
      int known = 0;
      for (int i = 0; i < n_cand; i++)
        known |= !strcmp(cand[i], p);
      if (!known)
        off += (size_t)snprintf(sugg + off, sl - off, "%s%s", off ? "," : "", p);
    }
    probe_diag_free(&d);
  }
  probe_trace_close(tr);
}

/* ---- the command ------------------------------------------------------------ */

enum {
  O_CAND = 256, O_SCENARIO, O_CONFIG, O_STEPS, O_SEED, O_GRAN, O_WORKDIR,
  O_FAILNF, O_NOFAILNF, O_MAXSKIP, O_MINSCALE, O_REGRESS, O_TRACE, O_JSON
};

int cmd_bisect(int argc, char **argv) {
  static const struct option longs[] = {
      {"fp32-candidates", required_argument, NULL, O_CAND},
      {"scenario", required_argument, NULL, O_SCENARIO},
      {"config", required_argument, NULL, O_CONFIG},
      {"steps", required_argument, NULL, O_STEPS},
      {"seed", required_argument, NULL, O_SEED},
      {"granularity", required_argument, NULL, O_GRAN},
      {"jobs", required_argument, NULL, 'j'},
      {"workdir", required_argument, NULL, O_WORKDIR},
      {"fail-nonfinite", no_argument, NULL, O_FAILNF},
      {"no-fail-nonfinite", no_argument, NULL, O_NOFAILNF},
      {"max-consecutive-skips", required_argument, NULL, O_MAXSKIP},
      {"min-scale", required_argument, NULL, O_MINSCALE},
      {"max-loss-regress", required_argument, NULL, O_REGRESS},
      {"trace", no_argument, NULL, O_TRACE},
      {"json", no_argument, NULL, O_JSON},
      {"output", required_argument, NULL, 'o'},
      {"quiet", no_argument, NULL, 'q'},
      {"help", no_argument, NULL, 'h'},
      {NULL, 0, NULL, 0},
  };
  bisect b;
  memset(&b, 0, sizeof b);
  b.fail_nonfinite = 1;
  b.max_skips = 20;
  b.max_regress = 10.0;
  long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
  b.jobs = ncpu > 0 ? (int)ncpu : 1;
  const char *candidates = NULL, *granularity = "kind", *out = NULL;
  const char *workdir = NULL;
  int json = 0;
  int64_t iv;

  cli_getopt_reset();
  int c;
  while ((c = getopt_long(argc, argv, ":j:o:qh", longs, NULL)) != -1) {
    switch (c) {
    case O_CAND: candidates = optarg; break;
    case O_SCENARIO: b.scenario = optarg; break;
    case O_CONFIG: b.config = optarg; break;
    case O_STEPS:
      if (cli_parse_i64(SUB, "--steps", optarg, 1, 100000000, &iv))
        return CLI_EXIT_USAGE;
      b.steps = optarg;
      break;
    case O_SEED:
      if (cli_parse_i64(SUB, "--seed", optarg, 0, INT64_MAX, &iv))
        return CLI_EXIT_USAGE;
      b.seed = optarg;
      break;
    case O_GRAN:
      if (strcmp(optarg, "kind") && strcmp(optarg, "layer")) {
        cli_error(SUB, "invalid value '%s' for --granularity: expected kind "
                       "or layer", optarg);
        return CLI_EXIT_USAGE;
      }
      granularity = optarg;
      break;
    case 'j':
      if (cli_parse_i64(SUB, "--jobs", optarg, 1, 1024, &iv))
        return CLI_EXIT_USAGE;
      b.jobs = (int)iv;
      break;
    case O_WORKDIR: workdir = optarg; break;
    case O_FAILNF: b.fail_nonfinite = 1; break;
    case O_NOFAILNF: b.fail_nonfinite = 0; break;
    case O_MAXSKIP:
      if (cli_parse_i64(SUB, "--max-consecutive-skips", optarg, -1,
                        INT64_MAX / 2, &b.max_skips))
        return CLI_EXIT_USAGE;
      break;
    case O_MINSCALE:
      if (cli_parse_double(SUB, "--min-scale", optarg, 0, 3e38, &b.min_scale))
        return CLI_EXIT_USAGE;
      break;
    case O_REGRESS:
      if (cli_parse_double(SUB, "--max-loss-regress", optarg, -1, 1e9,
                           &b.max_regress))
        return CLI_EXIT_USAGE;
      if (b.max_regress < 0)
        b.max_regress = -1;
      break;
    case O_TRACE: b.full_trace = 1; break;
    case O_JSON: json = 1; break;
    case 'o': out = optarg; break;
    case 'q': b.quiet = 1; break;
    case 'h': usage(stdout); return CLI_EXIT_OK;
    default: return cli_getopt_error(SUB, argv, c);
    }
  }
  /* after --: options for every `ampprobe run` */
  if (optind < argc && optind > 0 && !strcmp(argv[optind - 1], "--")) {
    for (int i = optind; i < argc; i++) {
      if (b.n_pass == MAX_PASS) {
        cli_error(SUB, "too many run options after -- (at most %d)", MAX_PASS);
        return CLI_EXIT_USAGE;
      }
      b.pass[b.n_pass++] = argv[i];
    }
  } else if (optind < argc) {
    cli_error(SUB, "unexpected argument '%s' (run options go after --; see "
                   "'ampprobe bisect --help')", argv[optind]);
    return CLI_EXIT_USAGE;
  }
  if (!candidates) {
    cli_error(SUB, "--fp32-candidates is required, e.g. --fp32-candidates "
                   "bn,softmax,revin");
    return CLI_EXIT_USAGE;
  }
  if (b.scenario && b.config) {
    cli_error(SUB, "--scenario and --config exclude each other");
    return CLI_EXIT_USAGE;
  }
  if (!b.scenario && !b.config)
    b.scenario = PROBE_DEFAULT_SCENARIO;

  /* the config, for its name and layers */
  char err[512] = "";
  probe_train_config *cfg = NULL;
  probe_status st;
  if (b.config) {
    st = probe_config_load_file(&cfg, b.config, err, sizeof err);
    if (st < 0) {
      if (err[0] && strstr(err, b.config))
        cli_error(SUB, "%s", err);
      else
        cli_error(SUB, "%s: %s", b.config, err[0] ? err : probe_status_str(st));
      return st == PROBE_ERR_CONFIG ? CLI_EXIT_USAGE : CLI_EXIT_INPUT;
    }
  } else {
    st = probe_config_load_scenario(&cfg, b.scenario, err, sizeof err);
    if (st < 0) {
      if (st == PROBE_ERR_NOT_FOUND)
        cli_error(SUB, "unknown scenario '%s' (see 'ampprobe run "
                       "--list-scenarios')", b.scenario);
      else
        cli_error(SUB, "scenario %s: %s", b.scenario,
                  err[0] ? err : probe_status_str(st));
      return CLI_EXIT_USAGE;
    }
  }
  if ((b.steps && probe_config_set(cfg, "steps", b.steps, err, sizeof err) < 0) ||
      (b.seed && probe_config_set(cfg, "seed", b.seed, err, sizeof err) < 0)) {
    cli_error(SUB, "%s", err);
    probe_config_free(cfg);
    return CLI_EXIT_USAGE;
  }
  char name[PROBE_NAME_MAX * 2];
  snprintf(name, sizeof name, "%s",
           probe_config_name(cfg) && *probe_config_name(cfg)
               ? probe_config_name(cfg)
               : "run");
  size_t n_layers = 0;
  probe_config_layers(cfg, NULL, 0, &n_layers);
  probe_layer_desc *layers = calloc(n_layers ? n_layers : 1, sizeof *layers);
  if (!layers) {
    probe_config_free(cfg);
    return CLI_EXIT_INTERNAL;
  }
  probe_config_layers(cfg, layers, n_layers, &n_layers);
  probe_config_free(cfg);

  char **cand = NULL;
  int n_cand = 0;
  int rc = CLI_EXIT_INTERNAL;
  result r;
  memset(&r, 0, sizeof r);
  char **lnames = NULL;
  int n_lnames = 0;
  if (split_list(candidates, &cand, &n_cand) != 0)
    goto out;
  if (n_cand == 0) {
    cli_error(SUB, "--fp32-candidates is empty");
    rc = CLI_EXIT_USAGE;
    goto out;
  }
  if (n_cand > PROBE_DDMIN_MAX) {
    cli_error(SUB, "too many candidates (at most %d)", PROBE_DDMIN_MAX);
    rc = CLI_EXIT_USAGE;
    goto out;
  }
  for (int i = 0; i < n_cand; i++) {
    int hits = 0;
    for (size_t l = 0; l < n_layers; l++)
      hits += layers[l].kind != PROBE_KIND_INPUT &&
              probe_policy_match(cand[i], layers[l].name, layers[l].kind);
    if (!hits) {
      size_t o = strlen(b.warnings);
      snprintf(b.warnings + o, sizeof b.warnings - o, "%s%s", o ? "," : "",
               cand[i]);
    }
  }
  if (b.warnings[0])
    fprintf(stderr, "ampprobe: bisect: warning: %s match%s no layer of %s "
                    "(kept; forcing %s to FP32 changes nothing)\n",
            b.warnings, strchr(b.warnings, ',') ? "" : "es", name,
            strchr(b.warnings, ',') ? "them" : "it");

  /* work directory and our own binary */
  if (workdir)
    snprintf(b.workdir, sizeof b.workdir, "%s", workdir);
  else
    snprintf(b.workdir, sizeof b.workdir, "./ampprobe-bisect-%s", name);
  if (mkdir_p(b.workdir) != 0) {
    cli_error(SUB, "cannot create the work directory %s: %s", b.workdir,
              strerror(errno));
    rc = CLI_EXIT_INTERNAL;
    goto out;
  }
  ssize_t sl = readlink("/proc/self/exe", b.self, sizeof b.self - 1);
  if (sl <= 0) {
    cli_error(SUB, "cannot find the ampprobe binary (/proc/self/exe): %s",
              strerror(errno));
    rc = CLI_EXIT_INTERNAL;
    goto out;
  }
  b.self[sl] = 0;

  cli_signals_install();
  b.t_start = cli_now();
  b.progress_on = !b.quiet && isatty(STDERR_FILENO);

  /* ---- 1. premises, in parallel */
  b.names = cand;
  b.n_names = n_cand;
  uint64_t full = probe_set_full(n_cand);
  char all[LIST_MAX];
  set_to_list(&b, full, all, sizeof all);
  trial_new(&b, R_ALL_FP16, "", 0);
  trial_new(&b, R_BASELINE, NULL, 0);
  trial_new(&b, R_ALL_CAND, all, full);
  trial *prem[3] = {&b.trials[0], &b.trials[1], &b.trials[2]};
  st = run_trials(&b, prem, 3, 0);
  trial *t16 = &b.trials[0], *t32 = &b.trials[1], *tall = &b.trials[2];
  if (st == PROBE_OK) {
    b.baseline_known = 1;
    b.baseline_loss = t32->final_loss;
    trial_judge(&b, t16);
    trial_judge(&b, tall);
  }
  if (st == PROBE_ERR_INTERRUPTED) {
    r.oc = O_INTERRUPTED;
  } else if (st != PROBE_OK) {
    r.oc = O_ERROR;
  } else if (t16->verdict == PROBE_DDMIN_PASS) {
    r.oc = O_HEALTHY;
    snprintf(r.summary, sizeof r.summary,
             "healthy, nothing to bisect: with everything in FP16 the run "
             "passes (%.200s)%s",
             t16->why,
             t32->verdict == PROBE_DDMIN_FAIL
                 ? "; note that the FP32 baseline fails"
                 : "");
  } else if (t32->verdict == PROBE_DDMIN_FAIL) {
    r.oc = O_NOT_PRECISION;
    snprintf(r.summary, sizeof r.summary,
             "not a precision problem: the FP32 baseline fails too (%.200s), so no "
             "set of modules kept in FP32 can fix it; check the learning "
             "rate, the data and the model (ampprobe postmortem %.300s)",
             t32->why, t32->trace);
  } else if (tall->verdict == PROBE_DDMIN_FAIL) {
    r.oc = O_INSUFFICIENT;
    implicate(tall, cand, n_cand, r.implicated, sizeof r.implicated,
              r.suggest, sizeof r.suggest, r.finding, sizeof r.finding);
    size_t o = (size_t)snprintf(
        r.summary, sizeof r.summary,
        "the candidates are not enough: with %.200s in FP32 the run still "
        "fails (%.200s)",
        all, tall->why);
    if (r.implicated[0] && o < sizeof r.summary)
      o += (size_t)snprintf(r.summary + o, sizeof r.summary - o,
                            "; the post-mortem of that run implicates %.100s",
                            r.implicated);
    if (r.finding[0] && o < sizeof r.summary)
      o += (size_t)snprintf(r.summary + o, sizeof r.summary - o,
                            "; its top finding: %.200s", r.finding);
    if (o < sizeof r.summary)
      snprintf(r.summary + o, sizeof r.summary - o, "%s%.200s",
               r.suggest[0] ? "; try adding to --fp32-candidates: " : "",
               r.suggest);
  } else {
    /* ---- 2. ddmin over the candidates */
    probe_ddmin dd;
    probe_ddmin_init(&dd, n_cand, oracle, &b);
    probe_ddmin_seed(&dd, 0, PROBE_DDMIN_FAIL);
    probe_ddmin_seed(&dd, full, PROBE_DDMIN_PASS);
    b.level_role = R_DDMIN;
    uint64_t min_set = 0;
    st = probe_ddmin_minimize(&dd, &min_set);
    r.ddmin_trials += dd.trials;
    probe_ddmin_free(&dd);
    if (st == PROBE_OK) {
      set_to_list(&b, min_set, r.minimal, sizeof r.minimal);
      r.oc = O_FOUND;
    } else {
      r.oc = st == PROBE_ERR_INTERRUPTED ? O_INTERRUPTED : O_ERROR;
    }
    /* ---- 3. --granularity layer: narrow to layer instances */
    if (r.oc == O_FOUND && !strcmp(granularity, "layer")) {
      lnames = calloc(PROBE_DDMIN_MAX + 1, sizeof *lnames);
      for (size_t l = 0; lnames && l < n_layers; l++) {
        if (layers[l].kind == PROBE_KIND_INPUT)
          continue;
        int hit = 0;
        for (int i = 0; i < n_cand; i++)
          hit |= (min_set >> i & 1) &&
                 probe_policy_match(cand[i], layers[l].name, layers[l].kind);
        if (hit && n_lnames < PROBE_DDMIN_MAX)
          lnames[n_lnames++] = strdup(layers[l].name);
      }
      b.names = lnames;
      b.n_names = n_lnames;
      if (n_lnames == 1) {
        snprintf(r.minimal_layers, sizeof r.minimal_layers, "%s", lnames[0]);
      } else if (n_lnames > 1) {
        probe_ddmin dl;
        probe_ddmin_init(&dl, n_lnames, oracle, &b);
        probe_ddmin_seed(&dl, 0, PROBE_DDMIN_FAIL);
        /* all these layers in FP32 is the kind-level answer: it passed */
        probe_ddmin_seed(&dl, probe_set_full(n_lnames), PROBE_DDMIN_PASS);
        b.level_role = R_DDMIN_LAYER;
        uint64_t min_l = 0;
        st = probe_ddmin_minimize(&dl, &min_l);
        r.ddmin_trials += dl.trials;
        probe_ddmin_free(&dl);
        if (st == PROBE_OK)
          set_to_list(&b, min_l, r.minimal_layers, sizeof r.minimal_layers);
        else
          r.oc = st == PROBE_ERR_INTERRUPTED ? O_INTERRUPTED : O_ERROR;
      }
    }
    if (r.oc == O_FOUND) {
      const char *fix = r.minimal_layers[0] ? r.minimal_layers : r.minimal;
      make_reproduce(&b, fix, r.reproduce, sizeof r.reproduce);
      int k = 1;
      for (const char *p = fix; *p; p++)
        k += *p == ',';
      snprintf(r.summary, sizeof r.summary,
               "keep %.400s in FP32: the smallest set found with which training "
               "passes (%d of %d candidate%s%s)",
               fix, k, r.minimal_layers[0] ? n_lnames : n_cand,
               r.minimal_layers[0] ? " layer" : "",
               (r.minimal_layers[0] ? n_lnames : n_cand) > 1 ? "s" : "");
    }
  }
  if (r.oc == O_INTERRUPTED)
    snprintf(r.summary, sizeof r.summary,
             "interrupted: the table shows the trials so far");
  if (r.oc == O_ERROR)
    snprintf(r.summary, sizeof r.summary, "stopped: %s",
             b.error[0] ? b.error : "a trial could not run");
  progress_clear(&b);

  /* ---- output */
  switch (r.oc) {
  case O_HEALTHY: rc = CLI_EXIT_OK; break;
  case O_FOUND:
  case O_NOT_PRECISION:
  case O_INSUFFICIENT: rc = CLI_EXIT_PROBLEM; break;
  case O_INTERRUPTED: rc = CLI_EXIT_INTERRUPTED; break;
  case O_ERROR:
    /* a run option the trial rejected is the user's usage error */
    rc = b.error_exit == CLI_EXIT_USAGE ? CLI_EXIT_USAGE : CLI_EXIT_INTERNAL;
    break;
  }
  json_t *j = NULL;
  if (json || out)
    j = result_json(&b, &r, candidates, granularity, name);
  if (out && json_dump_file(j, out, JSON_INDENT(2)) != 0) {
    cli_error(SUB, "cannot write %s", out);
    rc = CLI_EXIT_INTERNAL;
  }
  if (json) {
    if (cli_json_print(j) != 0)
      rc = CLI_EXIT_INTERNAL;
  } else {
    print_text(&b, &r, candidates, granularity, name);
    fflush(stdout);
  }
  json_decref(j);
  if (r.oc == O_ERROR)
    cli_error(SUB, "%s", r.summary);

out:
  free_list(cand, n_cand);
  free_list(lnames, n_lnames);
  free(layers);
  free(b.trials);
  return rc;
}
