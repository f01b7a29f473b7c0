/*
 * tools/bisect.c - `ampprobe bisect --fp32-candidates LIST`: finds a minimal
 * set of modules to keep in FP32 so that FP16 training stays healthy, for
 * the built-in trainer (a scenario or config) or for an external command
 * (`-- python train.py ARGS`, driven through AMPPROBE_* variables).
 *
 * Stages (cmd_bisect): bisect_parse (options) -> bisect_plan (config,
 * candidates, work directory, output) -> premises (all-FP16, two FP32
 * baselines of different seeds, all candidates in FP32; run in parallel)
 * -> search (ddmin over the candidates, then over layers with
 * --granularity layer) -> bisect_output (table or JSON and -o, unless a
 * trial could not run).
 *
 * Trials. An internal trial is `ampprobe run ... --json -q -o
 * WORKDIR/trial-NN.h5` (fork/exec of /proc/self/exe); an external one is
 * the user's command with AMPPROBE_FP32, AMPPROBE_PRECISION, AMPPROBE_TRACE
 * and AMPPROBE_SEED (yours, or 0 when unset; + 1 for the noise baseline)
 * in its environment. Either way
 * it is judged from the trace it wrote: the loss series of /steps (read
 * through libprobe's reader), skipped steps, loss scale. Each trial runs in
 * its own process group led by a guard (tools/trialguard.c) that kills
 * all the trial started, in its group or not, when the trial ends or when
 * bisect dies; SIGINT/SIGTERM stop the groups and print the table so far (130).
 *
 * Multi-rank trials (docs/cli.md "Multi-rank trials"): with --ranks N an
 * internal trial is `ampprobe run --ranks N ...` (mpirun underneath), and
 * an external command may be `mpirun -np N CMD`; either way each rank
 * writes WORKDIR/trial-NN.rankR.h5 (libprobe's naming rule applied to
 * AMPPROBE_TRACE). The trial's set is trial-NN.h5 when it exists, else its
 * rank files; the loss series is the lowest rank's (the logged loss is the
 * global mean), and the verdict is the post-mortem's over the whole set.
 *
 * Judging (docs/cli.md "What fails"): besides non-finite losses, skips and
 * the scale floor, a trial's mean loss over its last K steps is compared
 * with the FP32 baseline's mean over the same number of optimizer updates,
 * i.e. shifted by the trial's warm-up skips (the first backoffs from the
 * initial scale), with a tolerance of max(--max-loss-regress, the spread
 * between the two baselines of different seeds).
 *
 * Resuming (--resume FILE, docs/cli.md "Resuming"): the document of an
 * earlier bisect records its settings (settings_json) and, per trial, the
 * folder and number of its files. When every setting matches, a trial of
 * the same role and FP32 set that had a verdict is read back from its
 * trace and judged again instead of run (trial_try_reuse, in run_trials'
 * launch order, so ddmin sees the same verdicts as an uninterrupted run);
 * one whose trace is gone runs again, into this bisect's own folder.
 * After every trial the document so far is also written to the work
 * directory (checkpoint), for a bisect killed by SIGKILL.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
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
#include <dirent.h>

#include "ampprobe/analysis.h" /* ddmin, post-mortem, verdicts */
#include "ampprobe/trainer.h"
#include "cli.h"
#include "runguard.h"
#include "trialguard.h"

static const char *SUB = "bisect";

#define MAX_PASS 32      /* run options passed through after -- */
#define MAX_EXT 256      /* words of an external command */
#define LIST_MAX 4352    /* a comma-separated fp32 list: 64 names of 64 */
#define STEPS_MAX 100000000 /* the trainer's range for steps */
#define WINDOW_MIN 10    /* steps in the loss windows, at least */
#define CANCEL_GRACE 5.0 /* seconds from SIGTERM to SIGKILL of a trial */
#define RANKS_MAX 1024   /* --ranks N, at most */
#define SET_MAX 1024     /* rank files of one trial read, at most */
#define RS_DIRS_MAX 64   /* --resume: folders of earlier trials, at most */
#define RESUME_MAX (64L << 20) /* --resume: the document's size, at most */

static void usage(FILE *f) {
  fprintf(f,
"usage: ampprobe bisect --fp32-candidates LIST [--scenario NAME | --config FILE]\n"
"                       [--granularity kind|layer] [-j N] [--steps N] [--seed S]\n"
"                       [--precision fp16|bf16]\n"
"                       [--ranks N] [--trace] [--workdir DIR]\n"
"                       [failure criteria] [--json] [-o FILE [--force]] [-q]\n"
"                       [--progress-every SECONDS] [--trial-timeout SECONDS]\n"
"                       [--resume FILE]\n"
"                       [-- RUN OPTIONS | -- COMMAND ARGS...]\n"
"\n"
"Finds a minimal set of modules to keep in FP32 so that FP16 (or BF16)\n"
"training stays healthy. Candidates are module kinds or layer-name globs, as\n"
"in 'run --fp32'; those that match no layer are dropped with a warning. It\n"
"first checks its premises: the run with everything in FP16 (BF16) must\n"
"fail, the FP32 baseline must\n"
"pass and train (otherwise it is not a precision problem), and the run with\n"
"every candidate in FP32 must pass (otherwise the candidates are not enough).\n"
"Then delta debugging (ddmin) finds a set from which no candidate can be\n"
"dropped, in about k*log2(n) trials for k culprits among n candidates.\n"
"\n"
"what to run:\n"
"  --fp32-candidates LIST   comma-separated kinds or layer globs (required)\n"
"  --scenario NAME          built-in scenario (default '%s')\n"
"  --config FILE            JSON config file\n"
"  --steps N, --seed S      passed to every trial (N in 1..100000000)\n""  --precision fp16|bf16    the reduced precision of every trial but the FP32\n"
"                           baselines (default: the config's, else fp16); as\n"
"                           'run --precision', so a BF16 run can be bisected.\n"
"                           With a command: AMPPROBE_PRECISION in those trials\n"
"  --ranks N                every trial trains data-parallel on N ranks\n"
"                           ('ampprobe run --ranks N', mpirun underneath) and\n"
"                           is judged by the post-mortem over its rank files;\n"
"                           -j defaults to CPUs / N\n"
"  -- RUN OPTIONS           words after -- that start with '-' are passed to\n"
"                           every 'ampprobe run' (e.g. -- --lr 0.01)\n"
"  -- COMMAND ARGS...       otherwise they are an external training command,\n"
"                           run once per trial with AMPPROBE_FP32=<set>,\n"
"                           AMPPROBE_PRECISION=fp32 (the baselines only),\n"
"                           AMPPROBE_TRACE=<trial trace> and AMPPROBE_SEED\n"
"                           (yours or 0; + 1 in the second baseline); judged\n"
"                           from its trace\n"
"                           (e.g. -- python train.py --epochs 1); a job\n"
"                           under 'mpirun -np N' writes one trace per rank\n"
"                           (AMPPROBE_TRACE's rank files), judged as a set\n"
"  --granularity G          kind (default): answer in the candidates as given;\n"
"                           layer: then narrow them to single layer instances,\n"
"                           each named exactly as =NAME in the trials and the\n"
"                           reproduce line (--fp32 =bn is the layer named bn,\n"
"                           never the kind)\n"
"\n"
"a trial fails when (criteria, checked on the trace each trial wrote):\n"
"  --fail-nonfinite         any non-finite loss (default on; internal trials\n"
"                           are stopped at the first one)\n"
"  --no-fail-nonfinite      do not count non-finite losses by themselves\n"
"  --max-consecutive-skips K  more than K consecutive skipped optimizer\n"
"                           steps (default 20; -1 = off)\n"
"  --min-scale S            the loss scale fell below S (default off)\n"
"  --max-loss-regress PCT   the mean loss of the trial's last K steps is more\n"
"                           than T%% above the FP32 baseline's at the same\n"
"                           optimizer update (shifted by the trial's warm-up\n"
"                           skips), T = max(PCT, the seed-to-seed spread of\n"
"                           two baselines) (default PCT 10; -1 = off)\n"
"  --noise-seed S           seed of the second baseline (default: seed + 1);\n"
"  --no-noise-baseline      or none: T = PCT\n"
"  the post-mortem verdict 'degraded' of a trial also counts as a failure\n"
"\n"
"execution and output:\n"
"  -j, --jobs N             trials run in parallel (default: number of CPUs)\n"
"  --workdir DIR            where each trial's trace, summary and log are kept\n"
"                           (default ./ampprobe-bisect-<name>/); a folder with\n"
"                           earlier trials gets a new run-N subfolder\n"
"  --trace                  trials record full per-layer traces (default: the\n"
"                           flight recorder)\n"
"  --json                   print the result as JSON on stdout\n"
"  -o, --output FILE        also write the JSON result to FILE (read by\n"
"                           'ampprobe report --bisect FILE'); an existing FILE\n"
"                           is refused unless --force\n"
"  --force                  replace an existing -o FILE\n"
"  --resume FILE            go on from an earlier bisect's -o FILE (stopped by\n"
"                           Ctrl-C/SIGTERM, or finished) or its\n"
"                           WORKDIR/bisect-checkpoint.json (written after\n"
"                           every trial: after a SIGKILL): its trials with a\n"
"                           pass/fail verdict whose traces are still there are\n"
"                           read back instead of run (marked 'reused'); its\n"
"                           settings must be this bisect's (candidates,\n"
"                           scenario/config, command, steps, seeds, ranks,\n"
"                           run options, granularity, criteria), else exit 2\n"
"                           naming the first that differs; -o FILE may be the\n"
"                           same file only with --force\n"
"  -q, --quiet              no progress line on stderr\n"
"  --trial-timeout S        stop a trial still running after S seconds and\n"
"                           end bisect with exit 4 naming it (default 0: no\n"
"                           limit; for a job that may hang)\n"
"  --progress-every S       a plain progress line (trials done of the\n"
"                           expected total, ETA) every S seconds, terminal or\n"
"                           not (for job logs under a scheduler)\n"
"  -h, --help               this help\n"
"\n"
"exit: 0 healthy, nothing to bisect; 1 a minimal set was found, or not a\n"
"      precision problem (the FP32 baseline fails), or the candidates are not\n"
"      enough; 2 usage error; 3 unreadable config; 4 a trial could not run;\n"
"      5 the FP32 baseline does not train (its loss does not go down);\n"
"      130 interrupted (-o FILE holds the trials so far: --resume FILE)\n"
"\n"
"examples:\n"
"  ampprobe bisect --scenario two-culprits --fp32-candidates bn,softmax,revin\n"
"  ampprobe bisect --scenario two-culprits --fp32-candidates bn,softmax,revin \\\n"
"      -o r.json --resume r.json --force      (goes on after a Ctrl-C)\n"
"  ampprobe bisect --scenario bn-overflow --fp32-candidates bn --granularity layer\n"
"  ampprobe bisect --fp32-candidates bn,softmax,revin -j 2 -- python train.py\n"
"  ampprobe bisect --scenario allreduce-overflow --ranks 2 --fp32-candidates bn\n"
"  ampprobe bisect --fp32-candidates softmax -- mpirun -np 2 python train.py\n",
          PROBE_DEFAULT_SCENARIO);
}

enum { EXIT_NOT_TRAINING = 5 }; /* docs/cli.md, bisect's exit codes */

/* ---- trials ---------------------------------------------------------------- */

typedef enum trial_state {
  T_QUEUED, T_RUNNING, T_DONE, T_CANCELLING, T_CANCELLED, T_ERROR
} trial_state;

typedef enum trial_role {
  R_ALL_FP16, R_BASELINE, R_NOISE, R_ALL_CAND, R_DDMIN, R_DDMIN_LAYER
} trial_role;

/* The JSON's role identifiers. "all-fp16" stays the name of the trial with
 * nothing in FP32 whatever the reduced precision (report --bisect and
 * --resume of older documents read it); its "precision" field and the
 * text (role_text) say fp16 or bf16. */
static const char *role_name[] = {"all-fp16", "fp32-baseline", "fp32-noise",
                                  "all-candidates", "ddmin", "ddmin-layer"};


static int is_baseline(trial_role r) { return r == R_BASELINE || r == R_NOISE; }

/* The longest work directory path taken: the trials' file names (and a
 * run-N subfolder) must fit after it in the 1024-byte path buffers. */
#define WORKDIR_MAX_LEN 900

typedef struct trial {
  int id;
  trial_role role;
  char fp32[LIST_MAX]; /* AMPPROBE_FP32 / --fp32 value; unused for baselines */
  uint64_t set;
  trial_state state;
  pid_t pid;
  double t0, seconds, cancel_t;
  int stop_sent; /* the guard was told to kill the trial (kill_stragglers) */
  int timed_out; /* stopped by --trial-timeout */
  int exit_code;    /* of the child; -signal when killed */
  int verdict;      /* PROBE_DDMIN_PASS / FAIL / UNKNOWN */
  char why[320];
  const char *cancel_why; /* why it was cancelled (set by kill_running) */
  /* internal trials: the run's JSON summary */
  int64_t steps_planned;
  /* the post-mortem of the trace: verdict, and whether it found a silent
   * fault (a forward inf/NaN with a finite loss, a collapsed
   * normalisation) or only other findings (pm_note) */
  char pm_verdict[16]; /* "healthy" / "degraded" / "diverged", "" unknown */
  int pm_silent;
  char pm_note[160];
  /* from the trace's /steps */
  int have_trace;
  int64_t n_steps, skipped, longest_skip, first_nonfinite_loss;
  int64_t warmup_skips, warmup_end; /* the scaler's warm-up (judge_warmup) */
  double min_scale;
  double *loss;        /* n_steps losses; kept for the baselines only */
  double final_loss;   /* mean of the last window */
  double win_loss, win_base; /* judged windows: trial's, baseline's */
  int64_t win_from, win_base_from, win_len;
  char trace[1100];
  /* --resume: a trial of the earlier document, read back from its trace
   * instead of run (reused), its files trial-<fid>.* in folder src of
   * the resume table (bisect.rs_dir); fid is id for a trial run here */
  int reused;
  int fid;
  int src;
  /* a multi-rank trial: its rank files, and what the set says */
  int n_ranks;          /* rank files found; 0: one trace (trace) */
  int world;            /* ranks the job had (--ranks, or the traces say) */
  int64_t rank_min_steps; /* fewest steps of any rank */
  int rank_short;       /* the rank with the fewest steps */
  char missing[160];    /* ranks without a file, "2,3" */
  char set_note[200];   /* the cross-rank post-mortem, when it fails it */
  int ar_origin;        /* that post-mortem: born in the all-reduce (every
                           rank read, none held it before) */
  char set_info[200];   /* ... when it only says more (a note) */
} trial;

/* A layer of the model: from the config (internal) or the all-FP16 trial's
 * trace (external). */
typedef struct layer_ref {
  char name[PROBE_NAME_MAX];
  probe_kind kind;
} layer_ref;

/* --resume: a trial of the earlier document that had a verdict: looked up
 * by role and FP32 set (the set as the comma list trials carry). */
typedef struct prior {
  trial_role role;
  char *fp32;         /* malloc'd, as the trace below: a document of */
  char *trace;        /* 64 MiB holds some 10^5 trials */
  int fid, src;       /* trial-<fid>.* in rs_dir[src] */
  int ranks;          /* its rank files then (0: one trace) */
  int exit_code;
  double seconds;
  int64_t steps_planned;
} prior;

typedef struct bisect {
  /* options */
  const char *scenario, *config;
  const char *steps, *seed;
  const char *candidates, *granularity, *out, *workdir_opt;
  char *pass[MAX_PASS];
  int n_pass;
  char **ext; /* external command (NULL-terminated), NULL for run trials */
  int n_ext;
  int jobs, jobs_given, full_trace, quiet, json, force;
  int ranks;            /* --ranks N for internal trials, 0: one process */
  const char *ranks_arg;
  double progress_every;
  double trial_timeout; /* seconds a trial may run; 0: no limit */
  int fail_nonfinite;
  int64_t max_skips;
  double min_scale, max_regress;
  int noise_on;
  int64_t noise_seed; /* -1: seed + 1 */
  /* plan */
  char name[PROBE_NAME_MAX * 2];
  char workdir[1024]; /* at most WORKDIR_MAX_LEN, + "/run-N" */
  int wd_fd;
  int wd_made; /* 1: this process created b->workdir (mkdir or run-N) */
  /* the folders above it that this process created (mkdir_parents), as
   * lengths of prefixes of wd_asked, outermost first */
  char wd_asked[1024];
  unsigned short wd_parents[128];
  int n_wd_parents;
  char self[1024];
  layer_ref *layers;
  size_t n_layers;
  char **cand_all; /* as given */
  int n_cand_all;
  char **cand;     /* those matching a layer: what ddmin searches */
  int n_cand;
  char warnings[LIST_MAX]; /* candidates that match no layer */
  /* state */
  trial *trials;
  size_t n_trials, cap_trials;
  int baseline_known;
  int base_id, noise_id;
  double tol_pct, noise_pct; /* tolerance used; measured spread (NaN: none) */
  int noise_identical; /* the two baselines' losses were the same, step by step */
  int train_unchecked; /* the baseline ran too few steps to tell if it trains */
  int64_t noise_seed_used, base_seed;
  char data[1024], data2[2048]; /* the config's data file (plan_config) */
  /* the names ddmin works on at the current level */
  char **names;
  int n_names;
  trial_role level_role;
  int est_total; /* expected trials, for progress */
  char error[1024];
  int error_exit; /* exit code of the trial that could not run */
  int ckpt_off;   /* a checkpoint could not be written: no more tried */
  int interrupted;
  double t_start;
  cli_line progress; /* the line on a terminal (cli.h) */
  double last_line;
  /* settings that decide the answer, besides the options above
   * (settings_json: written to the result, checked by --resume) */
  int64_t steps_eff;       /* the trials' steps (internal), -1 unknown */
  /* the reduced precision of the trials that are not baselines: "fp16" or
   * "bf16": --precision, else the config's (scenario's), else fp16;
   * prec_given: from --precision (then passed to every such trial);
   * prec_default: what it would be without --precision (a --resume
   * document written before the setting existed ran that one) */
  const char *prec, *prec_default;
  int prec_given;
  char config_digest[40];  /* of the config file's content, "" none */
  char wd_abs[PATH_MAX];   /* realpath of workdir */
  /* --resume FILE: the earlier document's trials with a verdict (prior),
   * the folders holding their files (rs_dir/rs_fd) */
  const char *resume;
  struct prior *prior;
  size_t n_prior, cap_prior;
  char *rs_dir[RS_DIRS_MAX];
  int rs_fd[RS_DIRS_MAX];
  int n_rs_dir;
  size_t n_reused, n_gone;
} bisect;


/* A role as the text says it: the trial with nothing in FP32 is all-bf16
 * in a BF16 bisect. */
static const char *role_text(const bisect *b, int role);

static trial *T(bisect *b, int id) { return id >= 0 ? &b->trials[id] : NULL; }

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
  t->final_loss = t->min_scale = t->win_loss = t->win_base = NAN;
  t->first_nonfinite_loss = -1;
  t->rank_short = -1;
  t->fid = t->id;
  t->src = -1;
  snprintf(t->trace, sizeof t->trace, "%.1000s/trial-%02d.h5", b->workdir, t->id);
  return t;
}

static void trial_file(const trial *t, const char *ext, char *buf, size_t len) {
  snprintf(buf, len, "trial-%02d.%s", t->fid, ext);
}

/* The folder of a trial's files: this bisect's work directory, or for a
 * reused trial the earlier one's (as a descriptor and as a path). */
static int trial_dir_fd(const bisect *b, const trial *t) {
  return t->reused ? b->rs_fd[t->src] : b->wd_fd;
}
static const char *trial_dir(const bisect *b, const trial *t) {
  return t->reused ? b->rs_dir[t->src] : b->workdir;
}

/* argv of `ampprobe run` for one internal trial; strings point into b and
 * t (seedbuf holds the noise baseline's seed). */
static int trial_argv(const bisect *b, const trial *t, char **argv, int max,
                      char *seedbuf, size_t seedlen) {
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
  if (b->ranks > 0) { /* `run` starts mpirun -np N (docs/cli.md) */
    ARG("--ranks");
    ARG(b->ranks_arg);
  }
  if (t->role == R_NOISE) {
    snprintf(seedbuf, seedlen, "%lld", (long long)b->noise_seed_used);
    ARG("--seed");
    ARG(seedbuf);
  } else if (b->seed) {
    ARG("--seed");
    ARG(b->seed);
  }
  if (is_baseline(t->role)) {
    ARG("--precision");
    ARG("fp32");
  } else {
    if (b->prec_given) { /* else the config's own, which b->prec is */
      ARG("--precision");
      ARG(b->prec);
    }
    ARG("--fp32");
    ARG(t->fp32);
  }
  for (int i = 0; i < b->n_pass; i++)
    ARG(b->pass[i]);
  if (b->fail_nonfinite)
    ARG("--stop-on-nonfinite");
  /* the all-candidates run gets a full trace: when it fails, its
   * post-mortem is what says why (underflow needs per-layer records) */
  if (b->full_trace || t->role == R_ALL_CAND)
    ARG("--trace");
  ARG("--json");
  ARG("-q");
  ARG("-o");
  ARG(t->trace);
#undef ARG
  argv[n] = NULL;
  return n;
}

/* The environment of an external trial (called in the child). */
static void trial_env(const bisect *b, const trial *t, const char *trace_abs) {
  unsetenv("AMPPROBE_FP32");
  unsetenv("AMPPROBE_PRECISION");
  if (is_baseline(t->role))
    setenv("AMPPROBE_PRECISION", "fp32", 1);
  else {
    setenv("AMPPROBE_FP32", t->fp32, 1);
    if (b->prec_given) /* else the job's own */
      setenv("AMPPROBE_PRECISION", b->prec, 1);
  }
  setenv("AMPPROBE_TRACE", trace_abs, 1);
  /* Every trial gets the seed, not only the noise baseline: a job whose own
   * default seed is S + 1 would otherwise run the same seed in both
   * baselines (a spread of 0), and the trials would not all share one. */
  char s[32];
  snprintf(s, sizeof s, "%lld",
           (long long)(t->role == R_NOISE ? b->noise_seed_used : b->base_seed));
  setenv("AMPPROBE_SEED", s, 1);
}

/* Opens WORKDIR/name for a new trial file: exclusively, never through a
 * symlink, relative to the work directory's descriptor. */
static int trial_open(const bisect *b, const trial *t, const char *ext) {
  char name[64];
  trial_file(t, ext, name, sizeof name);
  return openat(b->wd_fd, name,
                O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
}

/* The rank of a trial's rank file name "trial-NN.rankR.h5", or -1. */
static int rank_file_rank(const trial *t, const char *name) {
  char pre[32];
  int n = snprintf(pre, sizeof pre, "trial-%02d.rank", t->fid);
  if (strncmp(name, pre, (size_t)n) != 0) return -1;
  const char *p = name + n;
  if (*p < '0' || *p > '9') return -1;
  char *end;
  long r = strtol(p, &end, 10);
  if (strcmp(end, ".h5") != 0 || r < 0 || r >= RANKS_MAX * 64) return -1;
  return (int)r;
}

static int cmp_int(const void *a, const void *b) {
  int x = *(const int *)a, y = *(const int *)b;
  return (x > y) - (x < y);
}

/* The ranks of the trial's rank files in the work directory, sorted, up to
 * max of them into ranks (may be NULL); returns how many there are. */
static int trial_rank_files(const bisect *b, const trial *t, int *ranks,
                            int max) {
  int dfd = dup(trial_dir_fd(b, t));
  DIR *d = dfd >= 0 ? fdopendir(dfd) : NULL;
  if (!d) {
    if (dfd >= 0) close(dfd);
    return 0;
  }
  rewinddir(d); /* the dup shares its offset with wd_fd: start over */
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d))) {
    int r = rank_file_rank(t, e->d_name);
    if (r < 0) continue;
    struct stat sb; /* an earlier folder's: its own files only, no link */
    if (t->reused && (fstatat(dirfd(d), e->d_name, &sb, AT_SYMLINK_NOFOLLOW) != 0 ||
                      !S_ISREG(sb.st_mode)))
      continue;
    if (ranks && n < max) ranks[n] = r;
    n++;
  }
  closedir(d);
  if (ranks) qsort(ranks, (size_t)(n < max ? n : max), sizeof *ranks, cmp_int);
  return n;
}

static int trial_launch(bisect *b, trial *t) {
  char *argv[64 + MAX_PASS];
  char seedbuf[32];
  if (!b->ext)
    trial_argv(b, t, argv, (int)(sizeof argv / sizeof argv[0]), seedbuf,
               sizeof seedbuf);
  char trace_abs[2048];
  if (t->trace[0] == '/') {
    snprintf(trace_abs, sizeof trace_abs, "%s", t->trace);
  } else {
    char cwd[1024];
    if (!getcwd(cwd, sizeof cwd))
      cwd[0] = 0;
    snprintf(trace_abs, sizeof trace_abs, "%s/%s", cwd, t->trace);
  }
  /* the trace must not exist yet: an earlier file is never replaced */
  char tname[64];
  struct stat sb;
  trial_file(t, "h5", tname, sizeof tname);
  if (fstatat(b->wd_fd, tname, &sb, AT_SYMLINK_NOFOLLOW) == 0 ||
      trial_rank_files(b, t, NULL, 0) > 0) {
    snprintf(b->error, sizeof b->error, "%.300s (or a rank file of it) "
             "already exists: refusing to replace an earlier trial's trace",
             t->trace);
    return -1;
  }
  int fo = b->ext ? -1 : trial_open(b, t, "json");
  int fe = trial_open(b, t, "log");
  if ((!b->ext && fo < 0) || fe < 0) {
    snprintf(b->error, sizeof b->error, "cannot create trial %02d's files in "
             "%.300s: %.100s", t->id, b->workdir, strerror(errno));
    if (fo >= 0)
      close(fo);
    if (fe >= 0)
      close(fe);
    return -1;
  }
  fflush(stdout);
  fflush(stderr);
  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) {
    snprintf(b->error, sizeof b->error, "cannot start a trial: %s",
             strerror(errno));
    if (fo >= 0)
      close(fo);
    close(fe);
    return -1;
  }
  if (pid == 0) {
    /* its own process group, which bisect stops as a whole */
    setpgid(0, 0);
    trial_guard_enter(parent); /* tools/trialguard.c */
    int fi = open("/dev/null", O_RDONLY);
    if (fi < 0)
      _exit(127);
    dup2(fi, 0);
    dup2(fo >= 0 ? fo : fe, 1);
    dup2(fe, 2);
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    if (b->ext) {
      trial_env(b, t, trace_abs);
      execvp(b->ext[0], b->ext);
      dprintf(2, "ampprobe: bisect: cannot run %s: %s\n", b->ext[0],
              strerror(errno));
    } else {
      execv(b->self, argv);
      dprintf(2, "ampprobe: bisect: cannot run %s: %s\n", b->self,
              strerror(errno));
    }
    _exit(127);
  }
  setpgid(pid, pid); /* also here: no window in which a kill misses it */
  if (fo >= 0)
    close(fo);
  close(fe);
  t->pid = pid;
  t->state = T_RUNNING;
  t->t0 = cli_now();
  return 0;
}

/* Reads the run's JSON summary (internal trials): the steps planned. */
static void trial_read_summary(bisect *b, trial *t) {
  char name[64];
  trial_file(t, "json", name, sizeof name);
  int fd = openat(b->wd_fd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  FILE *f = fd >= 0 ? fdopen(fd, "r") : NULL;
  json_t *j = f ? json_loadf(f, 0, NULL) : NULL;
  if (f)
    fclose(f);
  else if (fd >= 0)
    close(fd);
  if (!json_is_object(j)) {
    json_decref(j);
    return;
  }
  t->steps_planned = json_integer_value(json_object_get(j, "steps_planned"));
  json_decref(j);
}

/* The last line of a trial's log, for error messages. */
static void trial_last_log_line(bisect *b, trial *t, char *buf, size_t len) {
  char name[64];
  trial_file(t, "log", name, sizeof name);
  buf[0] = 0;
  int fd = openat(b->wd_fd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  FILE *f = fd >= 0 ? fdopen(fd, "r") : NULL;
  if (!f) {
    if (fd >= 0)
      close(fd);
    return;
  }
  char line[512];
  while (fgets(line, sizeof line, f))
    if (line[0] && line[0] != '\n' && line[0] != '\r')
      snprintf(buf, len, "%.*s", (int)(len > 1 ? len - 1 : 0), line);
  fclose(f);
  size_t n = strlen(buf);
  while (n && (buf[n - 1] == '\n' || buf[n - 1] == '\r'))
    buf[--n] = 0;
}

/* ---- reading a trial's trace -------------------------------------------------- */

/* The scaler's warm-up: the skipped steps at the start of the run, the
 * first backoffs from the initial scale. It starts within the first two
 * steps and goes on while skips are at most one clean step apart; it ends
 * after its last skip. Returns the number of skips; *end is the step after
 * the last (0 when there is no warm-up). */
static int64_t warmup_of(const unsigned char *skipped, int64_t n, int64_t *end) {
  int64_t skips = 0, gap = 0;
  *end = 0;
  for (int64_t i = 0; i < n; i++) {
    if (skipped[i]) {
      skips++;
      *end = i + 1;
      gap = 0;
    } else if (++gap > 1) {
      break;
    }
  }
  return skips;
}

/* The post-mortem of a trial's trace (the analysis library, on the handle
 * the isolated reader validated): its verdict, and what made it degraded.
 * A silent fault fails the trial; a degraded verdict from other findings
 * alone (gradients underflowing without loss scaling, say) is noted and
 * left to the loss criterion: forcing modules to FP32 does not cure it. */
/* 0 healthy, 1 degraded, 2 diverged (unknown names: 0). */
static int verdict_level(const char *v) {
  return !strcmp(v, "diverged") ? 2 : !strcmp(v, "degraded") ? 1 : 0;
}

static void trial_postmortem(trial *t, probe_trace *tr, const char *path,
                             int rank) {
  probe_diag d;
  probe_diag_options o;
  probe_diag_options_init(&o);
  memset(&d, 0, sizeof d);
  if (probe_diag_run(&d, tr, path, &o) != PROBE_OK) {
    probe_diag_free(&d);
    return;
  }
  const char *v = probe_verdict_name(d.verdict);
  int silent = d.verdict != PROBE_VERDICT_HEALTHY &&
               (d.silent_layer >= 0 || d.event != PROBE_DIAG_EVENT_NONE);
  /* over the ranks of a set: the worst rank's (a silent one first) */
  if (t->pm_verdict[0] &&
      (silent < t->pm_silent ||
       (silent == t->pm_silent &&
        verdict_level(v) <= verdict_level(t->pm_verdict)))) {
    probe_diag_free(&d);
    return;
  }
  snprintf(t->pm_verdict, sizeof t->pm_verdict, "%s", v);
  t->pm_silent = silent;
  char who[24] = "";
  if (rank >= 0)
    snprintf(who, sizeof who, "rank %d: ", rank);
  if (silent && d.silent_layer >= 0)
    snprintf(t->pm_note, sizeof t->pm_note, "%ssilent fault in %.63s", who,
             probe_diag_layer_name(&d, d.silent_layer));
  else if (silent)
    snprintf(t->pm_note, sizeof t->pm_note, "%s%s", who,
             probe_diag_event_name(d.event));
  else if (d.verdict != PROBE_VERDICT_HEALTHY && d.n_findings > 0)
    snprintf(t->pm_note, sizeof t->pm_note, "%spost-mortem: %s", who,
             probe_diag_finding_name(d.findings[0].id));
  else
    t->pm_note[0] = 0;
  probe_diag_free(&d);
}

/* The world size a rank trace states (0: not part of a job). */
static int trace_world(probe_trace *tr) {
  return probe_trace_get_info(tr)->world_size;
}

/* The trial's trace: trial-NN.h5 when it exists, else its lowest rank
 * file (primary); the ranks found go to ranks/n. Returns 0, or -1 with
 * why set. */
static int trial_find_set(bisect *b, trial *t, char *primary, size_t cap,
                          int *ranks, int *n) {
  char tname[64];
  struct stat sb;
  *n = 0;
  trial_file(t, "h5", tname, sizeof tname);
  if (fstatat(trial_dir_fd(b, t), tname, &sb, AT_SYMLINK_NOFOLLOW) == 0 &&
      (!t->reused || S_ISREG(sb.st_mode))) {
    snprintf(primary, cap, "%.1000s/%s", trial_dir(b, t), tname);
    return 0;
  }
  int k = trial_rank_files(b, t, ranks, SET_MAX);
  *n = k < SET_MAX ? k : SET_MAX;
  if (k == 0) {
    snprintf(t->why, sizeof t->why, "no trace at %.200s (nor rank files "
             "trial-%02d.rank*.h5)", t->trace, t->fid);
    return -1;
  }
  snprintf(primary, cap, "%.1000s/trial-%02d.rank%d.h5", trial_dir(b, t),
           t->fid, ranks[0]);
  return 0;
}

/* What the post-mortem over the set adds to the ranks' own verdicts: ranks
 * that disagree (loss scale, skipped step, weights: never in a correct
 * DDP job) fail the trial, and so does a verdict "diverged" that no rank
 * had alone; a "degraded" from the origin alone (say a scaled-gradient
 * overflow the loss scaler caught, born on every rank) is a note, as a
 * rank's non-silent findings are. */
static void judge_set_json(trial *t, const char *json) {
  json_t *j = json_loads(json, 0, NULL);
  const char *v = json_string_value(json_object_get(j, "verdict"));
  json_t *dis = json_array_get(json_object_get(j, "disagreements"), 0);
  json_t *oj = json_object_get(j, "origin");
  const char *origin = json_string_value(json_object_get(oj, "text"));
  const char *okind = json_string_value(json_object_get(oj, "kind"));
  t->ar_origin = okind && !strcmp(okind, "allreduce") &&
                 !json_is_true(json_object_get(oj, "uncertain"));
  if (t->set_note[0]) {
    /* a rank file could not be read: that says it */
  } else if (json_is_object(dis)) {
    snprintf(t->set_note, sizeof t->set_note, "ranks %lld and %lld disagree "
             "on %.40s at step %lld (cross-rank post-mortem)",
             (long long)json_integer_value(json_object_get(dis, "rank_a")),
             (long long)json_integer_value(json_object_get(dis, "rank_b")),
             json_string_value(json_object_get(dis, "field")),
             (long long)json_integer_value(json_object_get(dis, "step")));
  } else if (v && verdict_level(v) > verdict_level(t->pm_verdict)) {
    snprintf(verdict_level(v) == 2 ? t->set_note : t->set_info,
             sizeof t->set_note, "cross-rank post-mortem: %s%s%.140s", v,
             origin ? ": " : "", origin ? origin : "");
    if (verdict_level(v) == 2)
      snprintf(t->pm_verdict, sizeof t->pm_verdict, "%s", v);
  }
  json_decref(j);
}

/* A multi-rank trial: every rank file is opened (isolated reader), its
 * steps counted and diagnosed; missing ranks are named; and the
 * post-mortem over the whole set (probe_postmortem_json with the rank
 * files) gives the verdict: when it says worse than every rank alone (a
 * cross-rank finding: ranks that disagree, a missing rank, the all-reduce)
 * the trial fails on it. */
static void trial_read_ranks(bisect *b, trial *t, const int *ranks, int n) {
  char **paths = calloc((size_t)n, sizeof *paths);
  int world = b->ranks > 0 ? b->ranks : 0, ok = 0;
  t->n_ranks = n;
  t->rank_min_steps = t->n_steps;
  t->rank_short = -1;
  for (int i = 0; paths && i < n; i++) {
    char p[1200], err[256] = "";
    snprintf(p, sizeof p, "%.1000s/trial-%02d.rank%d.h5", trial_dir(b, t),
             t->fid, ranks[i]);
    probe_trace *tr = NULL;
    if (probe_trace_open_isolated(&tr, p, err, sizeof err) != PROBE_OK) {
      snprintf(t->set_note, sizeof t->set_note, "rank %d's trace cannot be "
               "read (%.120s)", ranks[i], err);
      continue;
    }
    if (b->ranks <= 0 && trace_world(tr) > world)
      world = trace_world(tr);
    int64_t ns = probe_trace_get_info(tr)->n_steps;
    if (ns < t->rank_min_steps) {
      t->rank_min_steps = ns;
      t->rank_short = ranks[i];
    }
    if (i > 0) /* rank files[0] was diagnosed with the series */
      trial_postmortem(t, tr, p, ranks[i]);
    probe_trace_close(tr);
    paths[ok++] = strdup(p);
  }
  if (world < ranks[n - 1] + 1 && b->ranks <= 0)
    world = ranks[n - 1] + 1;
  t->world = world;
  size_t o = 0;
  for (int r = 0, i = 0; r < world && o + 12 < sizeof t->missing; r++) {
    while (i < n && ranks[i] < r) i++;
    if (i < n && ranks[i] == r) continue;
    o += (size_t)snprintf(t->missing + o, sizeof t->missing - o, "%s%d",
                          o ? "," : "", r);
  }
  char *json = NULL;
  if (ok > 0 && probe_postmortem_json((const char *const *)paths, (size_t)ok,
                                      &json) == PROBE_OK)
    judge_set_json(t, json);
  probe_free(json);
  for (int i = 0; i < ok; i++) free(paths[i]);
  free(paths);
}

/* Reads /steps of the trial's trace: the loss series, skips, scale.
 * Returns 0, or -1 with why set when the trace cannot be read. With
 * layers (the all-FP16 trial of an external command) it also takes the
 * model's layers from the trace. */
static int trial_read_trace(bisect *b, trial *t, int want_layers) {
  probe_trace *tr = NULL;
  char err[256] = "", path[1200];
  static int ranks[SET_MAX];
  int n_ranks = 0;
  if (trial_find_set(b, t, path, sizeof path, ranks, &n_ranks) != 0)
    return -1;
  if (probe_trace_open_isolated(&tr, path, err, sizeof err) != PROBE_OK) {
    snprintf(t->why, sizeof t->why, "no readable trace at %.150s (%.120s)", path,
             err[0] ? err : "cannot open");
    return -1;
  }
  const probe_trace_info *inf = probe_trace_get_info(tr);
  int64_t n = inf->n_steps;
  double *loss = malloc((size_t)(n > 0 ? n : 1) * sizeof *loss);
  unsigned char *skip = malloc((size_t)(n > 0 ? n : 1));
  probe_step_scalars buf[1024];
  int64_t row = 0;
  int ok = loss && skip;
  t->min_scale = INFINITY;
  while (ok && row < n) {
    size_t got = 0;
    if (probe_trace_read_steps(tr, row, 1024, buf, &got) != PROBE_OK) {
      snprintf(t->why, sizeof t->why, "%.150s: %.150s", path,
               *cli_trace_error(tr) ? cli_trace_error(tr) : "its steps cannot be read");
      ok = 0;
      break;
    }
    if (got == 0)
      break;
    for (size_t i = 0; i < got && row < n; i++, row++) {
      loss[row] = buf[i].loss;
      skip[row] = buf[i].skipped != 0;
      if (buf[i].loss_scale < t->min_scale)
        t->min_scale = buf[i].loss_scale;
      if (!isfinite(buf[i].loss) && t->first_nonfinite_loss < 0)
        t->first_nonfinite_loss = buf[i].step;
    }
  }
  if (ok && row == 0)
    snprintf(t->why, sizeof t->why, "the trace %.250s holds no step", path);
  if (ok && row > 0) {
    n = row;
    int64_t run = 0;
    for (int64_t i = 0; i < n; i++) {
      t->skipped += skip[i];
      run = skip[i] ? run + 1 : 0;
      if (run > t->longest_skip)
        t->longest_skip = run;
    }
    t->warmup_skips = warmup_of(skip, n, &t->warmup_end);
    t->n_steps = n;
    int64_t k = n < WINDOW_MIN ? n : WINDOW_MIN;
    double s = 0;
    for (int64_t i = n - k; i < n; i++)
      s += loss[i];
    t->final_loss = s / (double)k;
    t->loss = loss;
    loss = NULL;
    t->have_trace = 1;
    if (!isfinite(t->min_scale))
      t->min_scale = NAN;
  }
  if (ok && row > 0 && want_layers && !b->layers) {
    size_t nl = 0;
    const probe_layer_info *li = probe_trace_layers(tr, &nl);
    b->layers = calloc(nl ? nl : 1, sizeof *b->layers);
    for (size_t i = 0; b->layers && i < nl; i++) {
      snprintf(b->layers[i].name, sizeof b->layers[i].name, "%s", li[i].name);
      b->layers[i].kind = (probe_kind)li[i].kind;
    }
    b->n_layers = b->layers ? nl : 0;
  }
  free(loss);
  free(skip);
  if (t->have_trace)
    trial_postmortem(t, tr, path, n_ranks ? ranks[0] : -1);
  probe_trace_close(tr);
  if (t->have_trace && n_ranks > 0)
    trial_read_ranks(b, t, ranks, n_ranks);
  return t->have_trace ? 0 : -1;
}

/* ---- judging ------------------------------------------------------------------ */

static double mean_of(const double *x, int64_t from, int64_t len) {
  double s = 0;
  for (int64_t i = from; i < from + len; i++)
    s += x[i];
  return len > 0 ? s / (double)len : NAN;
}

/* Steps in the compared windows: a tenth of the run, at least WINDOW_MIN
 * (all of it when shorter). */
static int64_t window_len(int64_t n) {
  int64_t k = n / 10 > WINDOW_MIN ? n / 10 : WINDOW_MIN;
  return k < n ? k : n;
}

/* The loss criterion: the trial's mean loss over its last K steps against
 * the FP32 baseline's over the steps with the same number of optimizer
 * updates behind them (shifted back by the trial's warm-up skips). Returns
 * 1 when it fails; fills the windows and why. */
static int judge_loss(const bisect *b, trial *t, char *w, size_t len) {
  const trial *base = &b->trials[b->base_id];
  int64_t n = t->n_steps < base->n_steps ? t->n_steps : base->n_steps;
  int64_t shift = t->warmup_skips;
  int64_t k = window_len(n);
  if (k > n - t->warmup_end) /* only steps after the warm-up */
    k = n - t->warmup_end;
  if (k > n - shift)
    k = n - shift;
  if (k < 1) { /* a run that is all warm-up: compare its last step */
    k = 1;
    shift = 0;
  }
  t->win_len = k;
  t->win_from = n - k;
  t->win_base_from = n - k - shift;
  t->win_loss = mean_of(t->loss, t->win_from, k);
  t->win_base = mean_of(base->loss, t->win_base_from, k);
  double bl = t->win_base, rel = 100.0 * (t->win_loss - bl) / fabs(bl);
  char span[96];
  snprintf(span, sizeof span, "steps %lld-%lld",
           (long long)t->win_from, (long long)(n - 1));
  char bspan[128] = "";
  if (shift > 0)
    snprintf(bspan, sizeof bspan, " over steps %lld-%lld (%lld warm-up "
             "skip%s)", (long long)t->win_base_from,
             (long long)(t->win_base_from + k - 1), (long long)shift,
             shift == 1 ? "" : "s");
  if (!isfinite(t->win_loss)) {
    snprintf(w, len, "mean loss over %s is not finite", span);
    return 1;
  }
  if (t->win_loss > bl + fabs(bl) * b->tol_pct / 100.0) {
    snprintf(w, len, "mean loss %.4g over %s is %.0f%% above the FP32 "
                     "baseline's %.4g%s (> %.3g%%)",
             t->win_loss, span, rel, bl, bspan, b->tol_pct);
    return 1;
  }
  snprintf(w, len, "mean loss %.4g over %s, %+.1f%% vs FP32 baseline%s "
                   "(<= %.3g%%)",
           t->win_loss, span, rel, bspan, b->tol_pct);
  return 0;
}

/* Applies the failure criteria in order; the first that holds is the
 * reason. The baselines are judged without the loss criterion. */
static void trial_judge(bisect *b, trial *t) {
  if (t->state != T_DONE)
    return;
  int fail = 1;
  char *w = t->why;
  size_t len = sizeof t->why;
  const trial *base = b->baseline_known ? &b->trials[b->base_id] : NULL;
  char ext[48] = "";
  if (b->ext && t->exit_code != 0)
    snprintf(ext, sizeof ext, " (the command exited %d)", t->exit_code);
  if (b->fail_nonfinite && t->first_nonfinite_loss >= 0) {
    snprintf(w, len, "non-finite loss at step %lld%s",
             (long long)t->first_nonfinite_loss, ext);
  } else if (t->pm_silent || (!t->set_note[0] &&
                                !strcmp(t->pm_verdict, "diverged"))) {
    snprintf(w, len, "post-mortem verdict %s%s%s%s", t->pm_verdict,
             t->pm_note[0] ? ": " : "", t->pm_note, ext);
  } else if (t->missing[0]) {
    snprintf(w, len, "rank%s %s of %d wrote no trace%s",
             strchr(t->missing, ',') ? "s" : "", t->missing, t->world, ext);
  } else if (t->n_ranks > 0 && t->rank_short >= 0 &&
             t->rank_min_steps < t->n_steps) {
    snprintf(w, len, "rank %d stopped after %lld of %lld steps%s",
             t->rank_short, (long long)t->rank_min_steps,
             (long long)t->n_steps, ext);
  } else if (t->set_note[0]) {
    snprintf(w, len, "%s%s", t->set_note, ext);
  } else if (b->max_skips >= 0 && t->longest_skip > b->max_skips) {
    snprintf(w, len, "%lld consecutive skipped steps (> %lld)%s",
             (long long)t->longest_skip, (long long)b->max_skips, ext);
  } else if (b->min_scale > 0 && isfinite(t->min_scale) &&
             t->min_scale < b->min_scale) {
    snprintf(w, len, "loss scale fell to %g (< %g)%s", t->min_scale,
             b->min_scale, ext);
  } else if (base && t != base && t->n_steps < base->n_steps) {
    snprintf(w, len, "stopped after %lld of the baseline's %lld steps%s",
             (long long)t->n_steps, (long long)base->n_steps, ext);
  } else if (b->ext && t->exit_code != 0 && !is_baseline(t->role)) {
    snprintf(w, len, "the command exited %d", t->exit_code);
  } else if (!is_baseline(t->role) && b->max_regress >= 0 && base) {
    fail = judge_loss(b, t, w, len);
  } else {
    fail = 0;
    snprintf(w, len, "final loss %.4g (mean of the last %lld steps)",
             t->final_loss, (long long)window_len(t->n_steps));
  }
  if (b->ext && t->exit_code != 0 && is_baseline(t->role) && !fail) {
    fail = 1;
    snprintf(w, len, "the command exited %d", t->exit_code);
  }
  if (!fail && t->pm_note[0]) { /* a finding that is no silent fault */
    size_t o = strlen(w);
    snprintf(w + o, len - o, "; %s", t->pm_note);
  }
  if (!fail && t->set_info[0]) { /* the set's, likewise */
    size_t o = strlen(w);
    snprintf(w + o, len - o, "; %s", t->set_info);
  }
  t->verdict = fail ? PROBE_DDMIN_FAIL : PROBE_DDMIN_PASS;
  if (!is_baseline(t->role)) { /* only the baselines' series are needed */
    free(t->loss);
    t->loss = NULL;
  }
}

static void trial_finish(bisect *b, trial *t, int status) {
  t->seconds = cli_now() - t->t0;
  t->exit_code = WIFEXITED(status) ? WEXITSTATUS(status)
                                   : -(WIFSIGNALED(status) ? WTERMSIG(status)
                                                           : 0);
  if (t->timed_out && !cli_stop_flag) {
    t->state = T_ERROR;
    snprintf(t->why, sizeof t->why, "timed out: still running after %g s "
             "(--trial-timeout), stopped", b->trial_timeout);
    return;
  }
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
  /* internal: run exits 0 healthy, 1 diverged (or degraded); an external
   * command may exit nonzero after writing its trace: its trace decides */
  int judged = b->ext ? t->exit_code >= 0 : (t->exit_code == 0 || t->exit_code == 1);
  if (judged) {
    if (!b->ext)
      trial_read_summary(b, t);
    if (trial_read_trace(b, t, b->ext && t->role == R_ALL_FP16) == 0) {
      t->state = T_DONE;
      if (b->baseline_known || is_baseline(t->role))
        trial_judge(b, t);
      return;
    }
  }
  t->state = T_ERROR;
  char line[400], tw[320];
  snprintf(tw, sizeof tw, "%s", t->why);
  trial_last_log_line(b, t, line, sizeof line);
  if (t->exit_code < 0)
    snprintf(t->why, sizeof t->why, "killed by signal %d%s%.250s",
             -t->exit_code, line[0] ? ": " : "", line);
  else if (t->exit_code != 0 || !tw[0])
    snprintf(t->why, sizeof t->why, "exit %d%s%.250s", t->exit_code,
             line[0] ? ": " : "", line);
  else /* exit 0 without a readable trace */
    snprintf(t->why, sizeof t->why, "%.200s%s", tw,
             b->ext ? "; does the command write AMPPROBE_TRACE (the ampprobe "
                      "Python package)?"
                    : "");
}

/* ---- progress ----------------------------------------------------------------- */

static void fmt_secs(char *buf, size_t n, double s) {
  if (!isfinite(s) || s < 0)
    snprintf(buf, n, "?");
  else if (s < 60)
    snprintf(buf, n, "%.0fs", s);
  else if (s < 3600)
    snprintf(buf, n, "%dm%02ds", (int)(s / 60), (int)s % 60);
  else
    snprintf(buf, n, "%dh%02dm", (int)(s / 3600), ((int)s % 3600) / 60);
}

/* "7 of ~13 trials done, 2 running, elapsed 12s, ETA ~20s": the total is
 * the premises plus ddmin's bound for one culprit (raised when exceeded),
 * the ETA the mean trial time times the trials left over -j. */
static void progress_text(const bisect *b, char *buf, size_t len) {
  size_t done = 0, running = 0;
  double busy = 0;
  for (size_t i = 0; i < b->n_trials; i++) {
    trial_state s = b->trials[i].state;
    if (b->trials[i].reused) {
      done++;
    } else if (s == T_DONE || s == T_ERROR) {
      done++;
      busy += b->trials[i].seconds;
    } else if (s == T_CANCELLED) {
      done++;
    }
    running += s == T_RUNNING || s == T_CANCELLING;
  }
  size_t total = (size_t)b->est_total;
  if (total < done + running)
    total = done + running;
  double el = cli_now() - b->t_start;
  size_t ran = 0;
  for (size_t i = 0; i < b->n_trials; i++)
    ran += !b->trials[i].reused &&
           (b->trials[i].state == T_DONE || b->trials[i].state == T_ERROR);
  double per = ran ? busy / (double)ran : NAN;
  double eta = per * (double)(total - done) / (double)(b->jobs > 0 ? b->jobs : 1);
  char es[32], ts[32];
  fmt_secs(es, sizeof es, el);
  fmt_secs(ts, sizeof ts, eta);
  snprintf(buf, len, "%zu of ~%zu trials done, %zu running, elapsed %s, "
                     "ETA ~%s", done, total, running, es, ts);
}

static void progress_draw(bisect *b, int force) {
  double now = cli_now();
  if (b->progress_every > 0 && !b->quiet &&
      now - b->last_line >= b->progress_every) {
    char line[256];
    progress_text(b, line, sizeof line);
    fprintf(stderr, "ampprobe: bisect: %s\n", line);
    fflush(stderr);
    b->last_line = now;
  }
  if (!cli_line_due(&b->progress, force)) return;
  char line[256];
  progress_text(b, line, sizeof line);
  cli_line_draw(&b->progress, "bisect: %s", line);
}

static void progress_clear(bisect *b) { cli_line_clear(&b->progress); }

/* ceil(log2 n) */
static int clog2(int n) {
  int k = 0;
  while ((1 << k) < n)
    k++;
  return k;
}

/* ---- running trials ------------------------------------------------------------ */

/* Stops the running trials ts[from..n) (their whole process groups); why
 * is shown for each. */
static void kill_running(trial **ts, size_t n, size_t from, const char *why) {
  for (size_t i = from; i < n; i++)
    if (ts[i]->state == T_RUNNING) {
      kill(-ts[i]->pid, SIGTERM);
      ts[i]->state = T_CANCELLING;
      ts[i]->cancel_why = why;
      ts[i]->cancel_t = cli_now();
    }
}

/* A trial that ignores SIGTERM for CANCEL_GRACE seconds is killed by its
 * guard (trial_guard_stop: also what left its process group); a group
 * still there CANCEL_GRACE later (a guard that cannot run) gets SIGKILL. */
static void kill_stragglers(trial **ts, size_t n) {
  double now = cli_now();
  for (size_t i = 0; i < n; i++)
    if (ts[i]->state == T_CANCELLING && ts[i]->cancel_t > 0 &&
        now - ts[i]->cancel_t > CANCEL_GRACE) {
      if (!ts[i]->stop_sent) {
        trial_guard_stop(ts[i]->pid);
        ts[i]->stop_sent = 1;
        ts[i]->cancel_t = now;
      } else {
        kill(-ts[i]->pid, SIGKILL);
        ts[i]->cancel_t = 0;
      }
    }
}

/* --trial-timeout: a trial running longer is stopped like a cancelled one
 * (SIGTERM to its group, SIGKILL CANCEL_GRACE later) and then is an error
 * (trial_finish): a job that hangs no longer keeps bisect waiting. */
static void time_out_trials(const bisect *b, trial **ts, size_t n) {
  if (b->trial_timeout <= 0) return;
  double now = cli_now();
  for (size_t i = 0; i < n; i++)
    if (ts[i]->state == T_RUNNING && now - ts[i]->t0 > b->trial_timeout) {
      ts[i]->timed_out = 1;
      kill(-ts[i]->pid, SIGTERM);
      ts[i]->state = T_CANCELLING;
      ts[i]->cancel_why = "timed out";
      ts[i]->cancel_t = now;
    }
}

/* --resume: the earlier trial of t's role and FP32 set, or NULL. */
static const prior *prior_find(const bisect *b, const trial *t) {
  for (size_t i = 0; i < b->n_prior; i++)
    if (b->prior[i].role == t->role && !strcmp(b->prior[i].fp32, t->fp32))
      return &b->prior[i];
  return NULL;
}

/* --resume: t, when the earlier document ran it (same role and FP32 set)
 * to a pass/fail verdict, is read back from that trial's trace (in the
 * earlier work directory, by its file number: no path of the document is
 * opened but its folders) and judged as a trial run now would be: so a
 * baseline gives its loss series again, and a verdict follows this run's
 * baseline. Returns 1 when reused (t done), 0 when t must run: no such
 * trial, or its trace is gone or unreadable (said on stderr). */
static int trial_try_reuse(bisect *b, trial *t) {
  const prior *p = b->n_prior ? prior_find(b, t) : NULL;
  if (!p)
    return 0;
  trial keep = *t;
  t->reused = 1;
  t->fid = p->fid;
  t->src = p->src;
  snprintf(t->trace, sizeof t->trace, "%s", p->trace);
  t->exit_code = p->exit_code;
  t->seconds = p->seconds;
  t->steps_planned = p->steps_planned;
  int bad = trial_read_trace(b, t, b->ext && t->role == R_ALL_FP16) != 0;
  if (!bad && t->n_ranks < p->ranks) /* a deleted rank file is no rank */
    snprintf(t->why, sizeof t->why, "%d of its %d rank files are gone "
             "(%.200s/trial-%02d.rank*.h5)", p->ranks - t->n_ranks, p->ranks,
             trial_dir(b, t), t->fid);
  if (bad || t->n_ranks < p->ranks) {   /* that would fail the trial */
    char why[sizeof t->why], qw[sizeof why * 4], qs[LIST_MAX * 4];
    snprintf(why, sizeof why, "%s", t->why);
    free(t->loss);
    *t = keep;
    b->n_gone++;
    cli_escape_name(qw, sizeof qw, why);
    cli_escape_name(qs, sizeof qs, t->fp32);
    progress_clear(b);
    fprintf(stderr, "ampprobe: bisect: note: --resume: the earlier %s trial%s%s%s "
                    "is run again: %s%s\n",
            role_text(b, t->role), t->fp32[0] ? " (FP32 " : "", qs,
            t->fp32[0] ? ")" : "", qw,
            t->role == R_BASELINE ? " (the loss criterion needs the FP32 "
                                    "baseline's loss series, read from its "
                                    "trace)"
                                  : "");
    return 0;
  }
  t->state = T_DONE;
  b->n_reused++;
  if (b->baseline_known || is_baseline(t->role))
    trial_judge(b, t);
  return 1;
}

static void checkpoint(bisect *b);

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
      if (trial_try_reuse(b, ts[next])) { /* --resume: done, not run */
        size_t k = next++;
        progress_draw(b, 1);
        if (first_pass && ts[k]->verdict == PROBE_DDMIN_PASS && k < stop_at) {
          stop_at = k + 1;
          kill_running(ts, n, k + 1,
                       "cancelled: an earlier trial of the round passed");
        }
        continue;
      }
      if (trial_launch(b, ts[next]) != 0) {
        result = PROBE_ERR_IO;
        b->error_exit = CLI_EXIT_INTERNAL;
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
      time_out_trials(b, ts, n);
      kill_stragglers(ts, n);
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
    kill(-pid, SIGKILL); /* anything the trial left behind in its group */
    trial_finish(b, ts[k], status);
    if (ts[k]->state == T_DONE)
      checkpoint(b);
    progress_draw(b, 1);
    if (ts[k]->state == T_ERROR && result == PROBE_OK) {
      snprintf(b->error, sizeof b->error, "trial %02d (%s) could not run (%.300s); "
               "its log: %.300s/trial-%02d.log", ts[k]->id, role_name[ts[k]->role],
               ts[k]->why, b->workdir, ts[k]->id);
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

/* The comma list of the names in set, each skip bytes in (1: a layer
 * name without its '=': the layer-level names are =NAME entries). */
static void set_to_list_skip(const bisect *b, uint64_t set, char *buf,
                             size_t len, size_t skip) {
  size_t off = 0;
  buf[0] = 0;
  for (int i = 0; i < b->n_names && off < len; i++)
    if (set >> i & 1)
      off += (size_t)snprintf(buf + off, len - off, "%s%s", off ? "," : "",
                              b->names[i] + skip);
}

static void set_to_list(const bisect *b, uint64_t set, char *buf, size_t len) {
  set_to_list_skip(b, set, buf, len, 0);
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
  while (keep > 0 && ts_buf[keep - 1]->pid == 0 && !ts_buf[keep - 1]->reused)
    keep--;
  b->n_trials = base + keep;
  return st;
}

/* ---- the result ------------------------------------------------------------- */

typedef enum outcome {
  O_FOUND, O_HEALTHY, O_NOT_PRECISION, O_NOT_TRAINING, O_INSUFFICIENT,
  O_INTERRUPTED, O_ERROR, O_ALLREDUCE
} outcome;

static const char *outcome_name[] = {"minimal-set-found", "healthy",
                                     "not-a-precision-problem",
                                     "baseline-does-not-train",
                                     "candidates-insufficient", "interrupted",
                                     "error", "fix-allreduce"};

typedef struct result {
  outcome oc;
  char summary[2048];
  char minimal[LIST_MAX];        /* candidates as given */
  char minimal_layers[LIST_MAX]; /* --granularity layer: the names */
  char minimal_layer_set[LIST_MAX]; /* the same as =NAME entries (--fp32) */
  char *reproduce;               /* the whole command (malloc'd), or NULL */
  char implicated[512];          /* postmortem on the all-candidates run */
  char suggest[512];             /* new candidates it proposes */
  char finding[PROBE_DIAG_TEXT_MAX];   /* its top-ranked finding */
  char hint[768];                /* what to do, from what the trials showed */
  int scaling_off;               /* the all-candidates run had no scaler */
  char underflow_layer[PROBE_NAME_MAX]; /* most gradient values lost */
  double underflow_frac;
  size_t ddmin_trials;
  int n_layers_searched;
} result;

static const char *verdict_str(const trial *t) {
  switch (t->state) {
  case T_DONE: return t->verdict == PROBE_DDMIN_PASS ? "PASS" : "FAIL";
  case T_CANCELLED: return "-";
  case T_ERROR: return "ERROR";
  default: return "?";
  }
}

/* The command that reproduces the fixed run, every word quoted
 * (probe_shell_quote), whole: malloc'd, NULL when out of memory. Never cut
 * and never with a word left out or replaced (a fixed buffer printed ''
 * for a word too long for it, or cut the command: a shorter argv, another
 * command when pasted). */
static char *make_reproduce(const bisect *b, const char *fp32) {
  const char *w[MAX_PASS + 16];
  size_t n = 0;
  char ranks[32];
  if (b->ext) { /* AMPPROBE_FP32='...' then the command's words */
    const char **e = malloc(((size_t)b->n_ext + 1) * sizeof *e);
    if (!e)
      return NULL;
    e[0] = fp32;
    for (int i = 0; i < b->n_ext; i++)
      e[i + 1] = b->ext[i];
    /* with --precision, the trials' AMPPROBE_PRECISION too (prec is one of
     * two bare words) */
    char *s = cli_join_quoted(b->prec_given && !strcmp(b->prec, "bf16")
                                  ? "AMPPROBE_PRECISION=bf16 AMPPROBE_FP32="
                              : b->prec_given
                                  ? "AMPPROBE_PRECISION=fp16 AMPPROBE_FP32="
                                  : "AMPPROBE_FP32=",
                              e, (size_t)b->n_ext + 1);
    free(e);
    return s;
  }
  w[n++] = "ampprobe";
  w[n++] = "run";
  w[n++] = b->config ? "--config" : "--scenario";
  w[n++] = b->config ? b->config : b->scenario;
  if (b->steps) {
    w[n++] = "--steps";
    w[n++] = b->steps;
  }
  if (b->seed) {
    w[n++] = "--seed";
    w[n++] = b->seed;
  }
  if (b->ranks > 0) {
    snprintf(ranks, sizeof ranks, "%d", b->ranks);
    w[n++] = "--ranks";
    w[n++] = ranks;
  }
  if (b->prec_given) {
    w[n++] = "--precision";
    w[n++] = b->prec;
  }
  w[n++] = "--fp32";
  w[n++] = fp32;
  for (int i = 0; i < b->n_pass && n < sizeof w / sizeof *w; i++)
    w[n++] = b->pass[i];
  /* the bare words above are safe as they are: quoting leaves them */
  return cli_join_quoted(NULL, w, n);
}

static json_t *num_or_null(double x) {
  return isfinite(x) ? json_real(x) : json_null();
}

/* A command to paste as a JSON string: controls escaped, backslashes kept
 * (cli_json_text doubles them, and the pasted path was another). */
static json_t *paste_json(const char *cmd) {
  char *e = cli_escape_controls(cmd);
  json_t *v = e ? json_string(e) : NULL;
  free(e);
  return v ? v : json_null();
}

static json_t *list_json(const char *list) {
  json_t *a = json_array();
  char tmp[LIST_MAX];
  snprintf(tmp, sizeof tmp, "%s", list);
  char *save = NULL;
  for (char *p = strtok_r(tmp, ",", &save); p; p = strtok_r(NULL, ",", &save))
    json_array_append_new(a, cli_json_text(p));
  return a;
}

/* One line saying how trials are judged (text and JSON). */
static void criteria_text(const bisect *b, char *buf, size_t len) {
  size_t o = 0;
  buf[0] = 0;
#define PUT(...)                                                               \
  do {                                                                         \
    if (o < len)                                                               \
      o += (size_t)snprintf(buf + o, len - o, __VA_ARGS__);                    \
  } while (0)
  if (b->fail_nonfinite)
    PUT("non-finite loss; ");
  PUT("post-mortem verdict degraded");
  if (b->max_skips >= 0)
    PUT("; > %lld consecutive skipped steps", (long long)b->max_skips);
  if (b->min_scale > 0)
    PUT("; loss scale < %g", b->min_scale);
  if (b->max_regress >= 0) {
    const trial *base = b->baseline_known ? &b->trials[b->base_id] : NULL;
    char k[48] = "max(10, steps/10)";
    if (base && base->have_trace)
      snprintf(k, sizeof k, "%lld", (long long)window_len(base->n_steps));
    PUT("; mean loss of the last %s steps more than %.3g%% above the FP32 "
        "baseline's at the same optimizer update (its window shifted back "
        "by the trial's warm-up skips)",
        k, base ? b->tol_pct : b->max_regress);
    if (base && isfinite(b->noise_pct))
      PUT(", tolerance = max(%g%%, the %.3g%% spread between FP32 baselines "
          "of seeds %lld and %lld)",
          b->max_regress, b->noise_pct, (long long)b->base_seed,
          (long long)b->noise_seed_used);
    else if (base && b->noise_identical)
      PUT(", tolerance %g%% (the two FP32 baselines had the same loss at "
          "every step: the job ignores the seed, AMPPROBE_SEED)",
          b->max_regress);
    else if (base && b->noise_on)
      PUT(", tolerance %g%% (the noise baseline did not pass)",
          b->max_regress);
    else if (b->noise_on)
      PUT(", tolerance %g%% (the FP32 baselines did not finish)", b->max_regress);
    else
      PUT(", tolerance %g%% (no noise baseline)", b->max_regress);
  }
  if (b->train_unchecked)
    PUT("; the FP32 baseline ran too few steps to tell whether it trains (at "
        "least 4), so that check did not run");
#undef PUT
}

static const char *trial_dir_abs(const bisect *b, const trial *t) {
  return t->reused ? b->rs_dir[t->src] : b->wd_abs;
}

/* What decides the answer, as --resume compares it: the trials' training
 * (scenario, or the config's content, or the command; steps, seeds, ranks,
 * run options, --trace), the candidates in their order (ddmin's sets
 * follow it), the granularity and the failure criteria. */
static const char *role_text(const bisect *b, int role) {
  if (role == R_ALL_FP16 && b->prec && !strcmp(b->prec, "bf16"))
    return "all-bf16";
  return role_name[role];
}

/* "FP16" or "BF16": the trials' reduced precision, for the text. */
static const char *prec_upper(const bisect *b) {
  return b->prec && !strcmp(b->prec, "bf16") ? "BF16" : "FP16";
}

static json_t *settings_json(const bisect *b) {
  json_t *s = json_object(), *a;
  json_object_set_new(s, "scenario", b->ext || b->config
                                         ? json_null()
                                         : cli_json_text(b->scenario));
  json_object_set_new(s, "config_digest", b->config_digest[0]
                                              ? json_string(b->config_digest)
                                              : json_null());
  /* the path only where the content could not be read */
  json_object_set_new(s, "config", b->config && !b->config_digest[0]
                                       ? cli_json_text(b->config)
                                       : json_null());
  a = json_null();
  if (b->ext) {
    a = json_array();
    for (int i = 0; i < b->n_ext; i++)
      json_array_append_new(a, cli_json_text(b->ext[i]));
  }
  json_object_set_new(s, "external_command", a);
  a = json_array();
  for (int i = 0; i < b->n_cand_all; i++)
    json_array_append_new(a, cli_json_text(b->cand_all[i]));
  json_object_set_new(s, "candidates", a);
  json_object_set_new(s, "granularity", json_string(b->granularity));
  json_object_set_new(s, "precision", json_string(b->prec));
  json_object_set_new(s, "steps", b->steps_eff >= 0 ? json_integer(b->steps_eff)
                                                    : json_null());
  json_object_set_new(s, "seed", json_integer(b->base_seed));
  json_object_set_new(s, "noise_seed", b->noise_on
                                           ? json_integer(b->noise_seed_used)
                                           : json_null());
  json_object_set_new(s, "ranks", b->ranks > 0 ? json_integer(b->ranks)
                                                : json_null());
  a = json_array();
  for (int i = 0; i < b->n_pass; i++)
    json_array_append_new(a, cli_json_text(b->pass[i]));
  json_object_set_new(s, "run_options", a);
  json_object_set_new(s, "trace", json_boolean(b->full_trace));
  json_object_set_new(s, "fail_nonfinite", json_boolean(b->fail_nonfinite));
  json_object_set_new(s, "max_consecutive_skips",
                      b->max_skips >= 0 ? json_integer(b->max_skips) : json_null());
  json_object_set_new(s, "min_scale", b->min_scale > 0 ? json_real(b->min_scale)
                                                       : json_null());
  json_object_set_new(s, "max_loss_regress_pct",
                      b->max_regress >= 0 ? json_real(b->max_regress) : json_null());
  return s;
}

static json_t *trial_json(const bisect *b, const trial *t) {
  json_t *x = json_object();
  json_object_set_new(x, "id", json_integer(t->id));
  json_object_set_new(x, "reused", json_boolean(t->reused));
  json_object_set_new(x, "role", json_string(role_name[t->role]));
  json_object_set_new(x, "precision",
                      json_string(is_baseline(t->role) ? "fp32" : b->prec));
  json_object_set_new(x, "fp32", is_baseline(t->role) ? json_null()
                                                       : list_json(t->fp32));
  json_object_set_new(
      x, "verdict",
      json_string(t->state == T_DONE
                      ? (t->verdict == PROBE_DDMIN_PASS ? "pass" : "fail")
                      : t->state == T_ERROR ? "error" : "cancelled"));
  json_object_set_new(x, "why", cli_json_text(t->why));
  json_object_set_new(x, "steps_run", json_integer(t->n_steps));
  json_object_set_new(x, "steps_planned", json_integer(t->steps_planned));
  json_object_set_new(x, "final_loss", num_or_null(t->final_loss));
  json_object_set_new(x, "warmup_skips", json_integer(t->warmup_skips));
  json_t *win = json_null();
  if (t->win_len > 0) {
    win = json_object();
    json_object_set_new(win, "steps", json_integer(t->win_len));
    json_object_set_new(win, "from", json_integer(t->win_from));
    json_object_set_new(win, "baseline_from", json_integer(t->win_base_from));
    json_object_set_new(win, "mean_loss", num_or_null(t->win_loss));
    json_object_set_new(win, "baseline_mean_loss", num_or_null(t->win_base));
  }
  json_object_set_new(x, "loss_window", win);
  json_object_set_new(x, "longest_skip_run", json_integer(t->longest_skip));
  json_object_set_new(x, "min_scale", num_or_null(t->min_scale));
  json_object_set_new(x, "exit_code", json_integer(t->exit_code));
  json_object_set_new(x, "seconds", num_or_null(t->seconds));
  json_object_set_new(x, "trace", cli_json_text(t->trace));
  /* where --resume finds its files: trial-<file_id>.* in dir */
  json_object_set_new(x, "dir", cli_json_text(trial_dir_abs(b, t)));
  json_object_set_new(x, "file_id", json_integer(t->fid));
  json_object_set_new(x, "ranks", json_integer(t->n_ranks));
  return x;
}

static json_t *result_json(const bisect *b, const result *r) {
  json_t *o = json_object();
  json_object_set_new(o, "command", json_string("bisect"));
  json_object_set_new(o, "scenario", cli_json_text(b->name));
  json_object_set_new(o, "config", b->config ? cli_json_text(b->config) : json_null());
  json_t *ext = json_null();
  if (b->ext) {
    ext = json_array();
    for (int i = 0; i < b->n_ext; i++)
      json_array_append_new(ext, cli_json_text(b->ext[i]));
  }
  json_object_set_new(o, "external_command", ext);
  json_object_set_new(o, "candidates", list_json(b->candidates));
  json_object_set_new(o, "granularity", json_string(b->granularity));
  json_object_set_new(o, "ranks", b->ranks > 0 ? json_integer(b->ranks)
                                                : json_null());
  json_object_set_new(o, "unmatched_candidates",
                      b->warnings[0] ? list_json(b->warnings) : json_array());
  json_t *c = json_object();
  json_object_set_new(c, "fail_nonfinite", json_boolean(b->fail_nonfinite));
  json_object_set_new(c, "fail_degraded", json_true());
  json_object_set_new(c, "max_consecutive_skips",
                      b->max_skips >= 0 ? json_integer(b->max_skips) : json_null());
  json_object_set_new(c, "min_scale", b->min_scale > 0 ? json_real(b->min_scale)
                                                       : json_null());
  json_object_set_new(c, "max_loss_regress_pct",
                      b->max_regress >= 0 ? json_real(b->max_regress) : json_null());
  json_object_set_new(c, "loss_tolerance_pct",
                      b->max_regress >= 0 && b->baseline_known
                          ? num_or_null(b->tol_pct)
                          : json_null());
  json_object_set_new(c, "baseline_noise_pct", num_or_null(b->noise_pct));
  json_object_set_new(c, "baselines_identical", json_boolean(b->noise_identical));
  json_object_set_new(c, "train_check", json_boolean(!b->train_unchecked));
  json_object_set_new(c, "noise_seed", b->noise_on ? json_integer(b->noise_seed_used)
                                                   : json_null());
  json_object_set_new(c, "loss_window",
                      json_string("mean loss of the trial's last max(10, "
                                  "steps/10) steps after its warm-up, against "
                                  "the FP32 baseline's over as many steps "
                                  "ending warm-up-skips earlier"));
  char ct[1024];
  criteria_text(b, ct, sizeof ct);
  json_object_set_new(c, "text", cli_json_text(ct));
  json_object_set_new(o, "criteria", c);
  json_object_set_new(o, "outcome", json_string(outcome_name[r->oc]));
  json_object_set_new(o, "summary", cli_json_text(r->summary));
  json_object_set_new(o, "minimal_set",
                      r->oc == O_FOUND ? list_json(r->minimal) : json_null());
  json_object_set_new(o, "minimal_layers",
                      r->oc == O_FOUND && r->minimal_layers[0]
                          ? list_json(r->minimal_layers)
                          : json_null());
  json_object_set_new(o, "reproduce",
                      r->reproduce ? paste_json(r->reproduce) : json_null());
  json_object_set_new(o, "implicated_layers",
                      r->implicated[0] ? list_json(r->implicated) : json_null());
  json_object_set_new(o, "suggested_candidates",
                      r->suggest[0] ? list_json(r->suggest) : json_null());
  json_object_set_new(o, "postmortem_finding",
                      r->finding[0] ? cli_json_text(r->finding) : json_null());
  json_object_set_new(o, "hint", r->hint[0] ? cli_json_text(r->hint) : json_null());
  const trial *base = b->base_id >= 0 && (size_t)b->base_id < b->n_trials
                          ? &b->trials[b->base_id]
                          : NULL;
  json_object_set_new(o, "baseline_final_loss",
                      base && base->have_trace ? num_or_null(base->final_loss)
                                               : json_null());
  size_t ran = 0, cancelled = 0, reused = 0;
  json_t *arr = json_array();
  for (size_t i = 0; i < b->n_trials; i++) {
    const trial *t = &b->trials[i];
    ran += !t->reused && (t->state == T_DONE || t->state == T_ERROR);
    reused += (size_t)t->reused;
    cancelled += t->state == T_CANCELLED;
    json_array_append_new(arr, trial_json(b, t));
  }
  json_object_set_new(o, "trials", arr);
  /* run by this bisect; the reused ones (--resume) are counted apart */
  json_object_set_new(o, "trials_run", json_integer((json_int_t)ran));
  json_object_set_new(o, "trials_reused", json_integer((json_int_t)reused));
  json_object_set_new(o, "resumed_from",
                      b->resume ? cli_json_text(b->resume) : json_null());
  json_object_set_new(o, "settings", settings_json(b));
  json_object_set_new(o, "trials_cancelled", json_integer((json_int_t)cancelled));
  json_object_set_new(o, "ddmin_trials", json_integer((json_int_t)r->ddmin_trials));
  json_object_set_new(o, "jobs", json_integer(b->jobs));
  json_object_set_new(o, "wall_seconds", json_real(cli_now() - b->t_start));
  json_object_set_new(o, "workdir", cli_json_text(b->workdir));
  return o;
}

/* The checkpoint: after every trial that ran to a verdict, the document
 * so far (outcome interrupted) goes to WORKDIR/CHECKPOINT, so that a
 * bisect killed by SIGKILL (the OOM killer, a machine that went down),
 * which writes no -o, can still be resumed (--resume WORKDIR/CHECKPOINT).
 * Written to a temporary name, synced and renamed over the last one
 * (relative to the work directory's descriptor: a link planted at either
 * name is replaced, never followed). A write that fails is said once and
 * no more are tried; the bisect goes on. */
#define CHECKPOINT "bisect-checkpoint.json"
static void checkpoint(bisect *b) {
  static const char tmp[] = "." CHECKPOINT ".tmp";
  if (b->ckpt_off || b->wd_fd < 0)
    return;
  result r;
  memset(&r, 0, sizeof r);
  r.oc = O_INTERRUPTED;
  snprintf(r.summary, sizeof r.summary, "in progress: the trials so far "
           "(written after each trial; bisect --resume takes it)");
  json_t *j = result_json(b, &r);
  char *text = j ? json_dumps(j, JSON_INDENT(2)) : NULL;
  json_decref(j);
  int fd = -1, ok = 0, err = ENOMEM;
  if (text) {
    unlinkat(b->wd_fd, tmp, 0);
    fd = openat(b->wd_fd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW |
                                   O_CLOEXEC, 0644);
    size_t len = strlen(text), off = 0;
    ok = fd >= 0;
    while (ok && off < len) {
      ssize_t w = write(fd, text + off, len - off);
      if (w < 0 && errno == EINTR)
        continue;
      ok = w > 0;
      off += ok ? (size_t)w : 0;
    }
    ok = ok && write(fd, "\n", 1) == 1 && fsync(fd) == 0;
    err = errno;
    if (fd >= 0 && close(fd) != 0 && ok) {
      ok = 0;
      err = errno;
    }
    if (ok && renameat(b->wd_fd, tmp, b->wd_fd, CHECKPOINT) != 0) {
      ok = 0;
      err = errno;
    }
    if (!ok && fd >= 0)
      unlinkat(b->wd_fd, tmp, 0);
  }
  free(text);
  if (!ok) {
    char q[2048];
    cli_escape_name(q, sizeof q, b->workdir);
    progress_clear(b);
    fprintf(stderr, "ampprobe: bisect: warning: cannot write the checkpoint "
                    "%s/" CHECKPOINT ": %s (no more are tried; -o is written "
                    "at the end as always)\n", q, strerror(err));
    b->ckpt_off = 1;
  }
}

/* Names come from configs, traces and the command line: printed escaped
 * (cli_escape_name), so a control character cannot forge a line. The
 * JSON keeps them as they are (jansson escapes them). */
#define ESC_LEN (LIST_MAX + 1024)
static const char *esc_next(char (*buf)[ESC_LEN], unsigned *n, const char *s) {
  char *d = buf[(*n)++ % 4];
  cli_escape_name(d, ESC_LEN, s);
  return d;
}
#define ESC(s) esc_next(escbuf, &escn, (s))

static void print_text(const bisect *b, const result *r) {
  FILE *f = stdout;
  static char escbuf[4][ESC_LEN];
  unsigned escn = 0;
  fprintf(f, "ampprobe bisect: %s, ", ESC(b->name));
  fprintf(f, "candidates %s (granularity %s)", ESC(b->candidates),
          b->granularity);
  if (b->ranks > 0)
    fprintf(f, ", %d ranks per trial", b->ranks);
  fprintf(f, "\n");
  char ct[1024];
  criteria_text(b, ct, sizeof ct);
  fprintf(f, "  a trial fails on: %s\n\n", ct);
  int w = 14; /* width of the set column: the longest set, at most 48 */
  for (size_t i = 0; i < b->n_trials; i++) {
    int l = is_baseline(b->trials[i].role) ? 23 : (int)strlen(b->trials[i].fp32);
    if (l > w)
      w = l < 48 ? l : 48;
  }
  fprintf(f, "  %-3s %-15s %-*s %-7s %-9s %7s  %s\n", "#", "trial", w,
          "forced to FP32", "verdict", "steps", "time", "why");
  size_t ran = 0, cancelled = 0, reused = 0;
  for (size_t i = 0; i < b->n_trials; i++) {
    const trial *t = &b->trials[i];
    ran += !t->reused && (t->state == T_DONE || t->state == T_ERROR);
    reused += (size_t)t->reused;
    cancelled += t->state == T_CANCELLED;
    char steps[48] = "-", tm[24] = "-";
    if (t->have_trace) {
      if (t->steps_planned > 0)
        snprintf(steps, sizeof steps, "%lld/%lld", (long long)t->n_steps,
                 (long long)t->steps_planned);
      else
        snprintf(steps, sizeof steps, "%lld", (long long)t->n_steps);
    }
    if (t->reused) /* --resume: read back from an earlier trial's trace */
      snprintf(tm, sizeof tm, "reused");
    else if (t->state == T_DONE || t->state == T_ERROR || t->seconds > 0)
      snprintf(tm, sizeof tm, "%.2fs", t->seconds);
    const char *set = t->role == R_BASELINE ? "(all: fp32 baseline)"
                      : t->role == R_NOISE  ? "(all: fp32, seed 2)"
                      : t->fp32[0]          ? t->fp32
                                            : "(nothing)";
    char setb[64];
    if (t->role == R_NOISE) {
      snprintf(setb, sizeof setb, "(all: fp32, seed %lld)",
               (long long)b->noise_seed_used);
      set = setb;
    }
    fprintf(f, "  %02d  %-15s %-*s %-7s %-9s %7s  %s\n", t->id,
            role_text(b, t->role), w, ESC(set), verdict_str(t), steps, tm, ESC(t->why));
  }
  fprintf(f, "\n");
  fprintf(f, "result: %s\n", ESC(r->summary));
  if (r->oc == O_FOUND) {
    fprintf(f, "  minimal set     %s%s\n", ESC(r->minimal),
            strchr(r->minimal, ',')
                ? "  (1-minimal: dropping any one of them fails)"
                : "");
    if (r->minimal_layers[0])
      fprintf(f, "  minimal layers  %s\n", ESC(r->minimal_layers));
  }
  if (r->implicated[0])
    fprintf(f, "  implicated      %s (post-mortem of the all-candidates run)\n",
            ESC(r->implicated));
  if (r->hint[0])
    fprintf(f, "  hint            %s\n", ESC(r->hint));
  if (r->reproduce) { /* whole, its backslashes kept (ESC doubled them) */
    char *e = cli_escape_controls(r->reproduce);
    fprintf(f, "  reproduce       %s\n", e ? e : "(out of memory)");
    free(e);
  }
  if (b->resume)
    fprintf(f, "  trials          %zu run, %zu reused from %s (%zu in ddmin), "
               "%zu cancelled, %.2f s wall with -j %d\n",
            ran, reused, ESC(b->resume), r->ddmin_trials, cancelled,
            cli_now() - b->t_start, b->jobs);
  else
    fprintf(f, "  trials          %zu run (%zu in ddmin), %zu cancelled, %.2f s "
               "wall with -j %d\n",
            ran, r->ddmin_trials, cancelled, cli_now() - b->t_start, b->jobs);
  fprintf(f, "  workdir         %s (trace, summary and log of every trial)\n",
          ESC(b->workdir));
}

#undef ESC
#undef ESC_LEN

/* ---- helpers ------------------------------------------------------------------- */

/* mkdir -p of the folders above b->wd_asked (not the folder itself); each
 * one made here is remembered, so that workdir_unmake can take it back. */
static int mkdir_parents(bisect *b) {
  char tmp[sizeof b->wd_asked];
  snprintf(tmp, sizeof tmp, "%s", b->wd_asked);
  b->n_wd_parents = 0;
  for (char *p = tmp + 1; *p; p++) {
    if (*p != '/')
      continue;
    *p = 0;
    if (mkdir(tmp, 0755) == 0) {
      if (b->n_wd_parents < (int)(sizeof b->wd_parents / sizeof *b->wd_parents))
        b->wd_parents[b->n_wd_parents++] = (unsigned short)(p - tmp);
    } else if (errno != EEXIST) {
      return -1;
    }
    *p = '/';
  }
  return 0;
}

/* Leaves the file system as it was before this bisect: the work directory
 * if this process made it, then the folders above it that it made,
 * innermost first. rmdir only: a folder that holds anything (a user's file
 * put there meanwhile) stays. */
static void workdir_unmake(bisect *b) {
  int e = errno;
  if (b->wd_made)
    rmdir(b->workdir);
  b->wd_made = 0;
  char tmp[sizeof b->wd_asked];
  for (int i = b->n_wd_parents - 1; i >= 0; i--) {
    snprintf(tmp, sizeof tmp, "%s", b->wd_asked);
    tmp[b->wd_parents[i]] = 0;
    rmdir(tmp);
  }
  b->n_wd_parents = 0;
  errno = e;
}

/* 1 when the open folder holds files of an earlier bisect (trial-*). */
static int holds_trials(int fd) {
  int dfd = dup(fd);
  DIR *d = dfd >= 0 ? fdopendir(dfd) : NULL;
  if (!d) {
    if (dfd >= 0)
      close(dfd);
    return 1; /* cannot tell: do not reuse */
  }
  int found = 0;
  struct dirent *e;
  while (!found && (e = readdir(d)))
    found = !strncmp(e->d_name, "trial-", 6);
  closedir(d);
  return found;
}

/* The work directory, created safely: a new folder is made with mkdir and
 * opened with O_DIRECTORY|O_NOFOLLOW (a symlink planted there is refused);
 * an existing one without trial files is used as is; one that holds an
 * earlier bisect's trials gets a fresh run-N subfolder (mkdirat, exclusive),
 * so no earlier file is ever replaced. b->workdir and b->wd_fd are set, and
 * b->wd_made says whether this process created that folder.
 * Returns 0, or -1 with the error printed. */
static int workdir_open(bisect *b, const char *want) {
  snprintf(b->workdir, sizeof b->workdir, "%s", want);
  size_t l = strlen(b->workdir);
  while (l > 1 && b->workdir[l - 1] == '/')
    b->workdir[--l] = 0;
  b->wd_made = 0;
  snprintf(b->wd_asked, sizeof b->wd_asked, "%s", b->workdir);
  if (mkdir_parents(b) != 0) {
    cli_error(SUB, "cannot create the work directory %s: %s", b->workdir,
              strerror(errno));
    workdir_unmake(b);
    return -1;
  }
  if (mkdir(b->workdir, 0755) == 0) {
    b->wd_made = 1;
  } else if (errno != EEXIST) {
    cli_error(SUB, "cannot create the work directory %s: %s", b->workdir,
              strerror(errno));
    workdir_unmake(b);
    return -1;
  }
  struct stat ls;
  int is_link = lstat(b->workdir, &ls) == 0 && S_ISLNK(ls.st_mode);
  int fd = is_link ? -1
                   : open(b->workdir,
                          O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    cli_error(SUB, "cannot use the work directory %s: %s", b->workdir,
              is_link || errno == ELOOP ? "it is a symbolic link (refused: trial files "
                               "are never written through a symlink)"
                             : strerror(errno));
    workdir_unmake(b);
    return -1;
  }
  if (holds_trials(fd)) {
    int sub = -1;
    char name[32];
    for (int i = 2; i < 10000 && sub < 0; i++) {
      snprintf(name, sizeof name, "run-%d", i);
      if (mkdirat(fd, name, 0755) == 0) {
        sub = openat(fd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        b->wd_made = 1; /* the run-N folder is this bisect's own */
      } else if (errno != EEXIST)
        break;
    }
    if (sub < 0) {
      cli_error(SUB, "cannot create a fresh folder in the work directory "
                     "%s: %s", b->workdir, strerror(errno));
      close(fd);
      workdir_unmake(b);
      return -1;
    }
    size_t o = strlen(b->workdir);
    snprintf(b->workdir + o, sizeof b->workdir - o, "/%s", name);
    fprintf(stderr, "ampprobe: bisect: note: the work directory holds an "
                    "earlier bisect's trials; this one's go to %s\n",
            b->workdir);
    close(fd);
    fd = sub;
  }
  b->wd_fd = fd;
  return 0;
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

static int matches_layer(const bisect *b, const char *cand) {
  for (size_t l = 0; l < b->n_layers; l++)
    if (b->layers[l].kind != PROBE_KIND_INPUT &&
        probe_policy_match(cand, b->layers[l].name, b->layers[l].kind))
      return 1;
  return 0;
}

/* Keeps in b->cand the candidates that match a layer of the model; the
 * others are named in a warning and cost no trial of the search. */
static int select_candidates(bisect *b) {
  b->cand = calloc(PROBE_DDMIN_MAX + 1, sizeof *b->cand);
  if (!b->cand)
    return -1;
  b->n_cand = 0;
  b->warnings[0] = 0;
  for (int i = 0; i < b->n_cand_all; i++) {
    if (matches_layer(b, b->cand_all[i])) {
      b->cand[b->n_cand++] = strdup(b->cand_all[i]);
    } else {
      size_t o = strlen(b->warnings);
      snprintf(b->warnings + o, sizeof b->warnings - o, "%s%s", o ? "," : "",
               b->cand_all[i]);
    }
  }
  if (b->warnings[0]) {
    char w[LIST_MAX + 64], nm[PROBE_NAME_MAX * 8];
    cli_escape_name(w, sizeof w, b->warnings);
    cli_escape_name(nm, sizeof nm, b->name);
    fprintf(stderr, "ampprobe: bisect: warning: %s match%s no layer of %s "
                    "(dropped: forcing %s to FP32 changes nothing)\n",
            w, strchr(b->warnings, ',') ? "" : "es", nm,
            strchr(b->warnings, ',') ? "them" : "it");
  }
  return 0;
}

/* Post-mortem of a failing trial: the origin layer (or the layer whose
 * gradients underflow most), the diagnosis engine's top finding and its
 * id, and the FP32 candidates it proposes that are not candidates
 * already. Returns the top finding's id, or -1. */
static int implicate(const bisect *b, const trial *t, result *r) {
  r->implicated[0] = r->suggest[0] = r->finding[0] = 0;
  probe_trace *tr = NULL;
  char err[256];
  if (probe_trace_open_isolated(&tr, t->trace, err, sizeof err) != PROBE_OK)
    return -1;
  probe_diag d;
  probe_diag_options o;
  probe_diag_options_init(&o);
  int id = -1;
  const probe_trace_info *inf = probe_trace_get_info(tr);
  r->scaling_off = inf && probe_diag_config_scaling(inf->config_json) == 0;
  if (probe_diag_run(&d, tr, t->trace, &o) == PROBE_OK) {
    if (d.worst_underflow_layer >= 0) {
      snprintf(r->underflow_layer, sizeof r->underflow_layer, "%s",
               probe_diag_layer_name(&d, d.worst_underflow_layer));
      r->underflow_frac = d.worst_underflow_frac;
    }
    if (d.origin_layer >= 0)
      snprintf(r->implicated, sizeof r->implicated, "%s",
               probe_diag_layer_name(&d, d.origin_layer));
    else if (d.worst_underflow_layer >= 0 && d.worst_underflow_frac > 0.01)
      snprintf(r->implicated, sizeof r->implicated, "%s",
               probe_diag_layer_name(&d, d.worst_underflow_layer));
    if (d.n_findings > 0 && d.findings[0].id != PROBE_DIAG_FINDING_HEALTHY) {
      snprintf(r->finding, sizeof r->finding, "%s", d.findings[0].title);
      id = (int)d.findings[0].id;
    }
    char tmp[sizeof d.fp32_candidates];
    snprintf(tmp, sizeof tmp, "%s", d.fp32_candidates);
    char *save = NULL;
    size_t off = 0;
    for (char *p = strtok_r(tmp, ",", &save); p && off < sizeof r->suggest;
         p = strtok_r(NULL, ",", &save)) {
      int known = p[0] == '-'; /* not a kind (a stray option word) */
      for (int i = 0; i < b->n_cand_all; i++)
        known |= !strcmp(b->cand_all[i], p);
      if (!known)
        off += (size_t)snprintf(r->suggest + off, sizeof r->suggest - off,
                                "%s%s", off ? "," : "", p);
    }
    probe_diag_free(&d);
  }
  probe_trace_close(tr);
  return id;
}

/* What to do when the candidates are not enough, from what the trials and
 * the post-mortem of the all-candidates run showed. */
static void insufficient_hint(const bisect *b, const trial *tall, int finding,
                              result *r) {
  size_t o = 0;
  char *h = r->hint;
  size_t hl = sizeof r->hint;
#define PUT(...)                                                               \
  do {                                                                         \
    if (o < hl)                                                                \
      o += (size_t)snprintf(h + o, hl - o, __VA_ARGS__);                       \
  } while (0)
  int scaling_off = r->scaling_off;
  for (int i = 0; i < b->n_pass; i++)
    scaling_off |= !strcmp(b->pass[i], "--no-loss-scale");
  if (finding == PROBE_DIAG_FINDING_ENABLE_LOSS_SCALING ||
      (scaling_off && r->underflow_frac > 0.01)) {
    PUT("gradients flush to zero in FP16%s", scaling_off
                                               ? " with loss scaling off"
                                               : "");
    if (r->underflow_layer[0])
      PUT(" (%.0f%% of %s's gradient values subnormal, flushed or zero)",
          100.0 * r->underflow_frac, r->underflow_layer);
    PUT(": enable loss scaling%s rather than forcing modules to FP32",
        scaling_off && !b->ext ? " (drop --no-loss-scale or scaler.enabled "
                                 "false)"
                               : (b->ext ? " (torch.amp.GradScaler)" : ""));
    finding = -1; /* said */
  } else if (scaling_off) {
    PUT("loss scaling is off in this FP16 run: small gradients flush to "
        "zero without it; try enabling loss scaling");
  }
  switch (finding) {
  case PROBE_DIAG_FINDING_FIX_CLIP_ORDER:
    PUT("%sclip after unscaling the gradients: no FP32 set fixes the clip order", o ? "; " : "");
    break;
  case PROBE_DIAG_FINDING_LOWER_LR:
    PUT("%slower the learning rate: the post-mortem blames the step size, not "
        "a module's precision", o ? "; " : "");
    break;
  case PROBE_DIAG_FINDING_CLEAN_INPUT:
    PUT("%sclean the input data: NaN/inf arrive with the batch", o ? "; " : "");
    break;
  case PROBE_DIAG_FINDING_CHECK_WEIGHTS:
    PUT("%scheck the weights: they hold NaN/inf", o ? "; " : "");
    break;
  case PROBE_DIAG_FINDING_SCALE_COLLAPSE:
    PUT("%sthe loss scale collapsed: set a minimum scale or find the layer "
        "whose gradients overflow at any scale", o ? "; " : "");
    break;
  default:
    break;
  }
  if (r->suggest[0])
    PUT("%sadd %s to --fp32-candidates (the post-mortem of that run "
        "proposes %s)",
        o ? "; " : "", r->suggest, strchr(r->suggest, ',') ? "them" : "it");
  else if (r->implicated[0] && finding == PROBE_DIAG_FINDING_FORCE_FP32)
    PUT("%sadd the layer as =%s (that name exactly), or its kind, to "
        "--fp32-candidates", o ? "; " : "", r->implicated);
  if (!o && tall->longest_skip > 0 && b->max_skips >= 0 &&
      tall->longest_skip > b->max_skips)
    PUT("the loss scaler kept skipping steps with every candidate in FP32: "
        "some gradient overflows at every scale; see ampprobe postmortem %.300s",
        tall->trace);
  if (!o)
    PUT("see ampprobe postmortem %.300s", tall->trace);
#undef PUT
}

/* ---- stage 1: options -------------------------------------------------------- */

enum {
  O_CAND = 256, O_SCENARIO, O_CONFIG, O_STEPS, O_SEED, O_GRAN, O_WORKDIR,
  O_FAILNF, O_NOFAILNF, O_MAXSKIP, O_MINSCALE, O_REGRESS, O_TRACE, O_JSON,
  O_FORCE, O_PROGRESS, O_NOISE_SEED, O_NO_NOISE, O_RANKS, O_TRIAL_TIMEOUT,
  O_RESUME, O_PRECISION
};

/* Returns -1 to go on, or the exit code. */
/* The `ampprobe run` options bisect sets in every trial itself: given after
 * -- they would override its choice (e.g. --precision fp32 made the
 * "all-FP16" trial FP32, and the verdict "healthy, nothing to bisect").
 * Returns why the option is refused, or NULL. */
static const char *controlled_run_option(const char *a) {
  static const struct {
    const char *opt, *why;
  } owned[] = {
      {"--precision", "give it to bisect itself (before --): --precision fp16|bf16 is the trials' reduced precision; the baselines run in FP32"},
      {"--fp32", "bisect sets each trial's FP32 set (--fp32-candidates)"},
      {"--scenario", "give it to bisect itself (before --)"},
      {"--config", "give it to bisect itself (before --)"},
      {"--steps", "give it to bisect itself (before --)"},
      {"--seed", "give it to bisect itself (before --); the noise baseline gets seed + 1"},
      {"--ranks", "give it to bisect itself (before --)"},
      {"--output", "bisect writes each trial's trace in its work directory"},
      {"-o", "bisect writes each trial's trace in its work directory"},
      {"--json", "bisect reads each trial's JSON itself; give --json to bisect"},
  };
  for (size_t k = 0; k < sizeof owned / sizeof owned[0]; k++) {
    size_t l = strlen(owned[k].opt);
    if (!strncmp(a, owned[k].opt, l) &&
        (a[l] == '\0' || a[l] == '=' || (l == 2 && a[l] != '-')))
      return owned[k].why;
  }
  return NULL;
}

static int bisect_parse(int argc, char **argv, bisect *b) {
  static const struct option longs[] = {
      {"fp32-candidates", required_argument, NULL, O_CAND},
      {"scenario", required_argument, NULL, O_SCENARIO},
      {"config", required_argument, NULL, O_CONFIG},
      {"steps", required_argument, NULL, O_STEPS},
      {"seed", required_argument, NULL, O_SEED},
      {"ranks", required_argument, NULL, O_RANKS},
      {"granularity", required_argument, NULL, O_GRAN},
      {"jobs", required_argument, NULL, 'j'},
      {"workdir", required_argument, NULL, O_WORKDIR},
      {"fail-nonfinite", no_argument, NULL, O_FAILNF},
      {"no-fail-nonfinite", no_argument, NULL, O_NOFAILNF},
      {"max-consecutive-skips", required_argument, NULL, O_MAXSKIP},
      {"min-scale", required_argument, NULL, O_MINSCALE},
      {"max-loss-regress", required_argument, NULL, O_REGRESS},
      {"noise-seed", required_argument, NULL, O_NOISE_SEED},
      {"no-noise-baseline", no_argument, NULL, O_NO_NOISE},
      {"trace", no_argument, NULL, O_TRACE},
      {"json", no_argument, NULL, O_JSON},
      {"output", required_argument, NULL, 'o'},
      {"force", no_argument, NULL, O_FORCE},
      {"progress-every", required_argument, NULL, O_PROGRESS},
      {"trial-timeout", required_argument, NULL, O_TRIAL_TIMEOUT},
      {"resume", required_argument, NULL, O_RESUME},
      {"precision", required_argument, NULL, O_PRECISION},
      {"quiet", no_argument, NULL, 'q'},
      {"help", no_argument, NULL, 'h'},
      {NULL, 0, NULL, 0},
  };
  b->fail_nonfinite = 1;
  b->max_skips = 20;
  b->max_regress = 10.0;
  b->noise_on = 1;
  b->noise_seed = -1;
  b->noise_pct = NAN;
  b->base_id = b->noise_id = -1;
  b->wd_fd = -1;
  b->steps_eff = -1;
  b->granularity = "kind";
  b->prec = b->prec_default = "fp16";
  long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
  b->jobs = ncpu > 0 ? (int)ncpu : 1;
  int64_t iv;

  cli_getopt_reset();
  /* '+': stop at the first non-option, so that an external command's own
   * options are not taken for ours */
  int c;
  while ((c = getopt_long(argc, argv, "+:j:o:qh", longs, NULL)) != -1) {
    switch (c) {
    case O_CAND: b->candidates = optarg; break;
    case O_SCENARIO: b->scenario = optarg; break;
    case O_CONFIG: b->config = optarg; break;
    case O_STEPS:
      if (cli_parse_i64(SUB, "--steps", optarg, 1, STEPS_MAX, &iv))
        return CLI_EXIT_USAGE;
      b->steps = optarg;
      break;
    case O_SEED:
      if (cli_parse_i64(SUB, "--seed", optarg, 0, INT64_MAX - 1, &iv))
        return CLI_EXIT_USAGE;
      b->seed = optarg;
      break;
    case O_GRAN:
      if (strcmp(optarg, "kind") && strcmp(optarg, "layer")) {
        cli_error(SUB, "invalid value '%s' for --granularity: expected kind "
                       "or layer", optarg);
        return CLI_EXIT_USAGE;
      }
      b->granularity = optarg;
      break;
    case 'j':
      if (cli_parse_i64(SUB, "--jobs", optarg, 1, 1024, &iv))
        return CLI_EXIT_USAGE;
      b->jobs = (int)iv;
      b->jobs_given = 1;
      break;
    case O_RANKS:
      if (cli_parse_i64(SUB, "--ranks", optarg, 1, RANKS_MAX, &iv))
        return CLI_EXIT_USAGE;
      b->ranks = (int)iv;
      b->ranks_arg = optarg;
      break;
    case O_WORKDIR: b->workdir_opt = optarg; break;
    case O_FAILNF: b->fail_nonfinite = 1; break;
    case O_NOFAILNF: b->fail_nonfinite = 0; break;
    case O_MAXSKIP:
      if (cli_parse_i64(SUB, "--max-consecutive-skips", optarg, -1,
                        INT64_MAX / 2, &b->max_skips))
        return CLI_EXIT_USAGE;
      break;
    case O_MINSCALE:
      if (cli_parse_double(SUB, "--min-scale", optarg, 0, 3e38, &b->min_scale))
        return CLI_EXIT_USAGE;
      break;
    case O_REGRESS:
      if (cli_parse_double(SUB, "--max-loss-regress", optarg, -1, 1e9,
                           &b->max_regress))
        return CLI_EXIT_USAGE;
      if (b->max_regress < 0)
        b->max_regress = -1;
      break;
    case O_NOISE_SEED:
      if (cli_parse_i64(SUB, "--noise-seed", optarg, 0, INT64_MAX,
                        &b->noise_seed))
        return CLI_EXIT_USAGE;
      b->noise_on = 1;
      break;
    case O_NO_NOISE: b->noise_on = 0; break;
    case O_TRACE: b->full_trace = 1; break;
    case O_JSON: b->json = 1; break;
    case 'o': b->out = optarg; break;
    case O_FORCE: b->force = 1; break;
    case O_PROGRESS:
      if (cli_parse_double(SUB, "--progress-every", optarg, 0.01, 86400,
                           &b->progress_every))
        return CLI_EXIT_USAGE;
      break;
    case O_TRIAL_TIMEOUT:
      if (cli_parse_double(SUB, "--trial-timeout", optarg, 0, 1e7, &b->trial_timeout))
        return CLI_EXIT_USAGE;
      break;
    case O_RESUME: b->resume = optarg; break;
    case O_PRECISION:
      if (strcmp(optarg, "fp16") && strcmp(optarg, "bf16")) {
        char q[256];
        cli_escape_name(q, sizeof q, optarg);
        cli_error(SUB, "--precision %s: fp16 or bf16 (the trials' reduced "
                       "precision; the baselines always run in FP32)", q);
        return CLI_EXIT_USAGE;
      }
      b->prec = !strcmp(optarg, "bf16") ? "bf16" : "fp16";
      b->prec_given = 1;
      break;
    case 'q': b->quiet = 1; break;
    case 'h': usage(stdout); return CLI_EXIT_OK;
    default: return cli_getopt_error(SUB, argv, c);
    }
  }
  /* after --: options for every `ampprobe run`, or an external command */
  if (optind < argc && optind > 0 && !strcmp(argv[optind - 1], "--")) {
    if (argv[optind][0] == '-') {
      for (int i = optind; i < argc; i++) {
        if (b->n_pass == MAX_PASS) {
          cli_error(SUB, "too many run options after -- (at most %d)",
                    MAX_PASS);
          return CLI_EXIT_USAGE;
        }
        const char *why = controlled_run_option(argv[i]);
        if (why) {
          char q[128];
          cli_escape_name(q, sizeof q, argv[i]);
          cli_error(SUB, "%s after --: %s", q, why);
          return CLI_EXIT_USAGE;
        }
        b->pass[b->n_pass++] = argv[i];
      }
    } else {
      if (argc - optind > MAX_EXT) {
        cli_error(SUB, "the command after -- has too many words (at most %d)",
                  MAX_EXT);
        return CLI_EXIT_USAGE;
      }
      b->ext = &argv[optind]; /* argv is NULL-terminated */
      b->n_ext = argc - optind;
    }
  } else if (optind < argc) {
    cli_error(SUB, "unexpected argument '%s' (run options or a command go "
                   "after --; see 'ampprobe bisect --help')", argv[optind]);
    return CLI_EXIT_USAGE;
  }
  if (!b->candidates) {
    cli_error(SUB, "--fp32-candidates is required, e.g. --fp32-candidates "
                   "bn,softmax,revin");
    return CLI_EXIT_USAGE;
  }
  if (b->scenario && b->config) {
    cli_error(SUB, "--scenario and --config exclude each other");
    return CLI_EXIT_USAGE;
  }
  if (b->ext && b->ranks > 0) {
    cli_error(SUB, "--ranks applies to the built-in trainer; for your own "
                   "job put mpirun in the command: -- mpirun -np %d CMD ...",
              b->ranks);
    return CLI_EXIT_USAGE;
  }
  /* each trial takes N processes: by default as many trials as there are
   * CPUs for them */
  if (b->ranks > 1 && !b->jobs_given)
    b->jobs = b->jobs / b->ranks > 0 ? b->jobs / b->ranks : 1;
  if (b->ext && (b->scenario || b->config || b->steps || b->seed ||
                 b->full_trace)) {
    cli_error(SUB, "%s does not apply to an external command (after --): "
                   "the command decides what it trains",
              b->scenario ? "--scenario" : b->config ? "--config"
              : b->steps  ? "--steps" : b->seed ? "--seed" : "--trace");
    return CLI_EXIT_USAGE;
  }
  if (!b->ext && !b->scenario && !b->config)
    b->scenario = PROBE_DEFAULT_SCENARIO;
  return -1;
}

/* ---- stage 2: the plan ---------------------------------------------------------- */

/* ---- --resume FILE: an earlier bisect's document ------------------------------ */

/* A setting as words for a message: a list joined with sep, none for null. */
static void setting_text(const json_t *v, const char *sep, char *buf,
                         size_t len) {
  if (!v) {
    snprintf(buf, len, "(not recorded)");
  } else if (json_is_null(v)) {
    snprintf(buf, len, "none");
  } else if (json_is_boolean(v)) {
    snprintf(buf, len, "%s", json_is_true(v) ? "on" : "off");
  } else if (json_is_string(v)) {
    snprintf(buf, len, "%s", json_string_value(v));
  } else if (json_is_array(v)) {
    size_t o = 0, i;
    json_t *e;
    buf[0] = 0;
    json_array_foreach(v, i, e) {
      char one[LIST_MAX];
      setting_text(e, sep, one, sizeof one);
      if (o < len)
        o += (size_t)snprintf(buf + o, len - o, "%s%s", i ? sep : "", one);
    }
    if (!json_array_size(v))
      snprintf(buf, len, "none");
  } else {
    char *d = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
    snprintf(buf, len, "%s", d ? d : "?");
    free(d);
  }
}

/* A folder of earlier trials, as the document names it: an absolute path
 * with no "." or ".." part (it is opened, never written). Its index in
 * b->rs_dir, added when new (the descriptor -1 when it cannot be opened:
 * its trials are then run again); -1 when refused or too many. */
static int resume_dir(bisect *b, const char *dir) {
  for (int i = 0; i < b->n_rs_dir; i++)
    if (!strcmp(b->rs_dir[i], dir))
      return i;
  size_t l = strlen(dir);
  if (dir[0] != '/' || l > WORKDIR_MAX_LEN + 16 || strstr(dir, "/./") ||
      strstr(dir, "/../") || (l >= 2 && !strcmp(dir + l - 2, "/.")) ||
      (l >= 3 && !strcmp(dir + l - 3, "/..")) || b->n_rs_dir == RS_DIRS_MAX)
    return -1;
  char *d = strdup(dir);
  if (!d)
    return -1;
  b->rs_dir[b->n_rs_dir] = d;
  b->rs_fd[b->n_rs_dir] = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  return b->n_rs_dir++;
}

/* The trace path a reused trial shows: the one the document showed when
 * it still names that file from here, else the absolute one. */
static void prior_trace(const char *shown, const char *dir, int fid,
                        char *out, size_t cap) {
  char base[32], real[PATH_MAX];
  snprintf(base, sizeof base, "trial-%02d.h5", fid);
  char *d = shown ? cli_dir_part(shown) : NULL;
  const char *slash = shown ? strrchr(shown, '/') : NULL;
  int same = d && slash && !strcmp(slash + 1, base) && realpath(d, real) &&
             !strcmp(real, dir);
  free(d);
  if (same)
    snprintf(out, cap, "%s", shown);
  else
    snprintf(out, cap, "%.1000s/%s", dir, base);
}

/* One trial of the document, when it had a pass/fail verdict: into
 * b->prior. Entries of another shape are skipped (run again). */
static void resume_trial(bisect *b, json_t *x) {
  const char *role = json_string_value(json_object_get(x, "role"));
  const char *verdict = json_string_value(json_object_get(x, "verdict"));
  const char *dir = json_string_value(json_object_get(x, "dir"));
  json_t *fid = json_object_get(x, "file_id"), *fp = json_object_get(x, "fp32");
  if (!role || !verdict || !dir || !json_is_integer(fid) ||
      (strcmp(verdict, "pass") && strcmp(verdict, "fail")) ||
      json_integer_value(fid) < 0 || json_integer_value(fid) > 99999 ||
      !(json_is_null(fp) || json_is_array(fp)))
    return;
  int r = -1;
  for (int i = 0; i < (int)(sizeof role_name / sizeof *role_name); i++)
    if (!strcmp(role, role_name[i]))
      r = i;
  if (r < 0)
    return;
  prior p;
  memset(&p, 0, sizeof p);
  p.role = (trial_role)r;
  char list[LIST_MAX], trace[1100];
  size_t o = 0, i;
  json_t *e;
  list[0] = 0;
  json_array_foreach(fp, i, e) {
    const char *n = json_string_value(e);
    if (!n || o >= sizeof list - 1)
      return;
    o += (size_t)snprintf(list + o, sizeof list - o, "%s%s", i ? "," : "", n);
  }
  if (o >= sizeof list - 1)
    return;
  p.fid = (int)json_integer_value(fid);
  if ((p.src = resume_dir(b, dir)) < 0)
    return;
  prior_trace(json_string_value(json_object_get(x, "trace")), dir, p.fid,
              trace, sizeof trace);
  p.exit_code = (int)json_integer_value(json_object_get(x, "exit_code"));
  p.seconds = json_number_value(json_object_get(x, "seconds"));
  p.steps_planned = json_integer_value(json_object_get(x, "steps_planned"));
  p.ranks = (int)json_integer_value(json_object_get(x, "ranks"));
  if (b->n_prior == b->cap_prior) {
    size_t cap = b->cap_prior ? 2 * b->cap_prior : 64;
    prior *np = realloc(b->prior, cap * sizeof *np);
    if (!np)
      return;
    b->prior = np;
    b->cap_prior = cap;
  }
  p.fp32 = strdup(list);
  p.trace = strdup(trace);
  if (!p.fp32 || !p.trace) {
    free(p.fp32);
    free(p.trace);
    return;
  }
  b->prior[b->n_prior++] = p;
}

/* Reads --resume FILE whole (before anything is written: -o may be the
 * same file, with --force) and checks that it is an earlier bisect of the
 * same question: every setting that decides the answer must be the same
 * (settings_json). Returns -1 to go on, or the exit code: 3 for a file
 * that is no bisect document (or none that can be checked), 2 for one of
 * another bisect, naming the first setting that differs. */
static int resume_load(bisect *b) {
  char q[PATH_MAX + 16];
  cli_escape_name(q, sizeof q, b->resume);
  int fd = open(b->resume, O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  struct stat st;
  if (fd < 0 || fstat(fd, &st) != 0) {
    cli_error(SUB, "--resume %s: %s", q, strerror(errno));
    if (fd >= 0)
      close(fd);
    return CLI_EXIT_INPUT;
  }
  if (!S_ISREG(st.st_mode)) {
    cli_error(SUB, "--resume %s: not a regular file (%s)", q,
              S_ISFIFO(st.st_mode)  ? "a FIFO"
              : S_ISCHR(st.st_mode) ? "a character device"
              : S_ISBLK(st.st_mode) ? "a block device"
              : S_ISDIR(st.st_mode) ? "a directory"
              : S_ISSOCK(st.st_mode) ? "a socket" : "not a file");
    close(fd);
    return CLI_EXIT_INPUT;
  }
  size_t cap = (size_t)RESUME_MAX + 1, n = 0;
  char *buf = st.st_size <= RESUME_MAX ? malloc(cap) : NULL;
  ssize_t got = 1;
  while (buf && n < cap && (got = read(fd, buf + n, cap - n)) != 0) {
    if (got < 0 && errno == EINTR)
      continue;
    if (got < 0)
      break;
    n += (size_t)got;
  }
  int err = errno;
  close(fd);
  if (!buf && st.st_size <= RESUME_MAX) {
    cli_error(SUB, "--resume %s: out of memory", q);
    return CLI_EXIT_INTERNAL;
  }
  if (!buf || n > (size_t)RESUME_MAX) {
    cli_error(SUB, "--resume %s: larger than %ld MiB, more than a bisect "
                   "document holds", q, RESUME_MAX >> 20);
    free(buf);
    return CLI_EXIT_INPUT;
  }
  if (got < 0) {
    cli_error(SUB, "--resume %s: %s", q, strerror(err));
    free(buf);
    return CLI_EXIT_INPUT;
  }
  json_error_t je;
  json_t *j = json_loadb(buf, n, 0, &je);
  free(buf);
  if (!j) { /* the parser's text quotes the file: escaped */
    char qt[sizeof je.text * 4];
    cli_escape_name(qt, sizeof qt, je.text);
    cli_error(SUB, "--resume %s: not a bisect document: not JSON (line %d: "
                   "%s)", q, je.line, qt);
    return CLI_EXIT_INPUT;
  }
  const char *cmd = json_string_value(json_object_get(j, "command"));
  json_t *trials = json_object_get(j, "trials");
  json_t *set = json_object_get(j, "settings");
  if (!cmd || strcmp(cmd, "bisect") || !json_is_array(trials)) {
    cli_error(SUB, "--resume %s: not a bisect document (the JSON of "
                   "'ampprobe bisect -o FILE')", q);
    json_decref(j);
    return CLI_EXIT_INPUT;
  }
  if (!json_is_object(set)) {
    cli_error(SUB, "--resume %s: it records no settings (written by an "
                   "ampprobe without --resume), so it cannot be checked "
                   "against this bisect", q);
    json_decref(j);
    return CLI_EXIT_INPUT;
  }
  static const struct {
    const char *key, *says, *sep;
  } keys[] = {
      {"scenario", "scenario is", ","},
      {"config_digest", "config's content (digest) is", ","},
      {"config", "config is", ","},
      {"external_command", "command is", " "},
      {"candidates", "candidates are", ","},
      {"granularity", "granularity is", ","},
      {"precision", "precision is", ","},
      {"steps", "steps are", ","},
      {"seed", "seed is", ","},
      {"noise_seed", "noise baseline's seed is", ","},
      {"ranks", "ranks are", ","},
      {"run_options", "run options are", " "},
      {"trace", "--trace is", ","},
      {"fail_nonfinite", "--fail-nonfinite is", ","},
      {"max_consecutive_skips", "--max-consecutive-skips is", ","},
      {"min_scale", "--min-scale is", ","},
      {"max_loss_regress_pct", "--max-loss-regress is", ","},
  };
  json_t *cur = settings_json(b);
  for (size_t k = 0; k < sizeof keys / sizeof *keys; k++) {
    json_t *was = json_object_get(set, keys[k].key);
    json_t *now = json_object_get(cur, keys[k].key);
    if (was && now && json_equal(was, now))
      continue;
    /* a document from before the precision setting: its trials ran in
     * the precision this bisect takes without --precision */
    if (!was && !strcmp(keys[k].key, "precision") &&
        !strcmp(b->prec, b->prec_default))
      continue;
    char a[LIST_MAX], c[LIST_MAX], qa[LIST_MAX], qc[LIST_MAX];
    setting_text(was, keys[k].sep, a, sizeof a);
    setting_text(now, keys[k].sep, c, sizeof c);
    cli_escape_name(qa, sizeof qa, a);
    cli_escape_name(qc, sizeof qc, c);
    cli_error(SUB, "--resume %s: its %s %s (this bisect: %s)", q,
              keys[k].says, qa, qc);
    json_decref(cur);
    json_decref(j);
    return CLI_EXIT_USAGE;
  }
  json_decref(cur);
  size_t i;
  json_t *x;
  json_array_foreach(trials, i, x) resume_trial(b, x);
  json_decref(j);
  return -1;
}

/* The noise baseline's seed: --noise-seed, else the trials' seed + 1
 * (which must exist: a seed of INT64_MAX has no + 1). -1 when refused. */
static int plan_noise_seed(bisect *b) {
  if (b->noise_seed >= 0) {
    b->noise_seed_used = b->noise_seed;
    return 0;
  }
  if (b->base_seed == INT64_MAX) {
    cli_error(SUB, "seed %lld has no seed + 1 for the noise baseline: use a "
                   "smaller seed, or --noise-seed",
              (long long)b->base_seed);
    return -1;
  }
  b->noise_seed_used = b->base_seed + 1;
  return 0;
}

/* b->config_digest: FNV-1a (64 bits) of the config file's bytes, so that
 * --resume refuses a config edited since (a moved one is the same); ""
 * when it cannot be read. Not cryptographic: it tells edits apart. */
static void config_digest(bisect *b) {
  FILE *f = b->config ? fopen(b->config, "rb") : NULL;
  b->config_digest[0] = 0;
  if (!f)
    return;
  uint64_t h = 0xcbf29ce484222325ull;
  unsigned char buf[65536];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0)
    for (size_t i = 0; i < n; i++)
      h = (h ^ buf[i]) * 0x100000001b3ull;
  if (!ferror(f))
    snprintf(b->config_digest, sizeof b->config_digest, "fnv1a64:%016llx",
             (unsigned long long)h);
  fclose(f);
}

/* The config's name and layers (internal trials). Returns -1 or the exit
 * code. */
static int plan_config(bisect *b) {
  char err[512] = "";
  probe_train_config *cfg = NULL;
  probe_status st;
  if (b->config) {
    int rc = cli_check_input(SUB, b->config);
    if (rc)
      return rc;
    st = probe_config_load_file(&cfg, b->config, err, sizeof err);
    if (st < 0) {
      if (err[0] && strstr(err, b->config))
        cli_error(SUB, "%s", err);
      else
        cli_error(SUB, "%s: %s", b->config, err[0] ? err : probe_status_str(st));
      return st == PROBE_ERR_CONFIG ? CLI_EXIT_USAGE : CLI_EXIT_INPUT;
    }
    config_digest(b);
  } else {
    st = probe_config_load_scenario(&cfg, b->scenario, err, sizeof err);
    if (st < 0) {
      cli_scenario_error(SUB, b->scenario, st, err);
      return CLI_EXIT_USAGE;
    }
  }
  if ((b->steps && probe_config_set(cfg, "steps", b->steps, err, sizeof err) < 0) ||
      (b->seed && probe_config_set(cfg, "seed", b->seed, err, sizeof err) < 0)) {
    cli_error(SUB, "%s", err);
    probe_config_free(cfg);
    return CLI_EXIT_USAGE;
  }
  snprintf(b->name, sizeof b->name, "%s",
           probe_config_name(cfg) && *probe_config_name(cfg)
               ? probe_config_name(cfg)
               : "run");
  /* the noise baseline's seed: the trials' seed + 1 */
  {
    char *text = probe_config_to_json(cfg);
    json_t *j = text ? json_loads(text, 0, NULL) : NULL;
    b->base_seed = json_integer_value(json_object_get(j, "seed"));
    if (json_is_integer(json_object_get(j, "steps")))
      b->steps_eff = json_integer_value(json_object_get(j, "steps"));
    const char *prec = json_string_value(json_object_get(j, "precision"));
    int all_fp32 = prec && !strcmp(prec, "fp32") && !b->prec_given;
    b->prec_default = prec && !strcmp(prec, "bf16") ? "bf16" : "fp16";
    if (!b->prec_given)
      b->prec = b->prec_default;
    json_decref(j);
    cli_config_data_files(text, b->config, b->data, sizeof b->data, b->data2,
                          sizeof b->data2);
    free(text);
    if (all_fp32) {
      cli_error(SUB, "the config's precision is fp32: nothing runs in FP16 or "
                     "BF16, so there is nothing to bisect (set \"precision\" "
                     "to fp16 or bf16, or give --precision fp16|bf16)");
      probe_config_free(cfg);
      return CLI_EXIT_USAGE;
    }
    if (plan_noise_seed(b) < 0) {
      probe_config_free(cfg);
      return CLI_EXIT_USAGE;
    }
  }
  size_t n = 0;
  probe_config_layers(cfg, NULL, 0, &n);
  probe_layer_desc *ld = calloc(n ? n : 1, sizeof *ld);
  b->layers = calloc(n ? n : 1, sizeof *b->layers);
  if (!ld || !b->layers) {
    free(ld);
    probe_config_free(cfg);
    return CLI_EXIT_INTERNAL;
  }
  probe_config_layers(cfg, ld, n, &n);
  for (size_t i = 0; i < n; i++) {
    snprintf(b->layers[i].name, sizeof b->layers[i].name, "%s", ld[i].name);
    b->layers[i].kind = ld[i].kind;
  }
  b->n_layers = n;
  free(ld);
  probe_config_free(cfg);
  return -1;
}

/* A name for the external command: its script (train.py -> train), else
 * the program. */
/* Names an external command's run; -1 when its AMPPROBE_SEED is refused. */
static int plan_ext_name(bisect *b) {
  const char *pick = b->ext[0];
  for (int i = 1; i < b->n_ext; i++) {
    size_t l = strlen(b->ext[i]);
    if (l > 3 && !strcmp(b->ext[i] + l - 3, ".py")) {
      pick = b->ext[i];
      break;
    }
  }
  const char *slash = strrchr(pick, '/');
  snprintf(b->name, sizeof b->name, "%s", slash ? slash + 1 : pick);
  size_t l = strlen(b->name);
  if (l > 3 && !strcmp(b->name + l - 3, ".py"))
    b->name[l - 3] = 0;
  const char *env = getenv("AMPPROBE_SEED");
  b->base_seed = 0;
  if (env && cli_parse_i64(SUB, "AMPPROBE_SEED", env, 0, INT64_MAX, &b->base_seed) < 0)
    return -1;
  return plan_noise_seed(b);
}

/* -o: never the config, never an existing file without --force (checked
 * now, before any trial runs). */
static int plan_output(bisect *b) {
  if (!b->out)
    return -1;
  /* the config and the data it names: never replaced, whatever the flags */
  const char *inputs[] = {b->config, b->data[0] ? b->data : NULL,
                          b->data2[0] ? b->data2 : NULL};
  int rc = cli_check_output(SUB, b->out, inputs, 3);
  if (rc)
    return rc;
  /* a symlink to nothing (or a loop) and a directory are refused by the
   * writer whatever the flags (docs/cli.md "Files"): said now, in its
   * words, not after every trial ran, nor as "use --force", which cannot
   * help there */
  if ((rc = cli_out_check(SUB, b->out)) != 0)
    return rc;
  char q[PATH_MAX + 16];
  cli_escape_name(q, sizeof q, b->out);
  struct stat sb;
  if (!b->force && lstat(b->out, &sb) == 0) {
    cli_error(SUB, "%s already exists: refusing to overwrite it (use --force "
                   "to replace it, or choose another -o)", q);
    return CLI_EXIT_USAGE;
  }
  /* its folder must take the result: said now, not after every trial ran */
  char *dir = cli_dir_part(b->out);
  if (!dir || access(dir, W_OK | X_OK) != 0) {
    cli_error(SUB, "cannot write %s: %s", q, dir ? strerror(errno) : "out of memory");
    free(dir);
    return CLI_EXIT_INTERNAL;
  }
  free(dir);
  return -1;
}

/* 1 when -o's folder is the work directory or one inside it (where a
 * trial's file could be replaced by the result, or the result appear
 * under a trial's name). */
static int inside_workdir(const bisect *b) {
  char out_dir[PATH_MAX], wd[PATH_MAX];
  char *dir = cli_dir_part(b->out);
  int ok = dir && realpath(dir, out_dir) && realpath(b->workdir, wd);
  free(dir);
  if (!ok)
    return 0;
  size_t l = strlen(wd);
  return !strncmp(out_dir, wd, l) && (out_dir[l] == '\0' || out_dir[l] == '/');
}

/* path made absolute with its longest existing prefix resolved
 * (realpath) and the rest normalised as text ("." and ".." dropped):
 * where a folder that does not exist yet will be. 0, or -1 when it does
 * not fit. */
static int resolve_loose(const char *path, char *out, size_t cap) {
  char tmp[PATH_MAX], rest[PATH_MAX] = "";
  if (snprintf(tmp, sizeof tmp, "%s", path) >= (int)sizeof tmp) return -1;
  for (;;) {
    size_t l = strlen(tmp);
    while (l > 1 && tmp[l - 1] == '/') tmp[--l] = 0;
    char real[PATH_MAX];
    if (realpath(l ? tmp : ".", real)) {
      if (snprintf(out, cap, "%s", real) >= (int)cap) return -1;
      break;
    }
    char *slash = strrchr(tmp, '/');
    char part[PATH_MAX];
    snprintf(part, sizeof part, "/%s%s", slash ? slash + 1 : tmp, rest);
    snprintf(rest, sizeof rest, "%s", part);
    if (!slash) {
      tmp[0] = 0;
    } else if (slash == tmp) {
      tmp[1] = 0;
    } else {
      *slash = 0;
    }
  }
  /* append the parts that do not exist yet */
  char *save = NULL;
  for (char *c = strtok_r(rest, "/", &save); c; c = strtok_r(NULL, "/", &save)) {
    size_t o = strlen(out);
    if (!strcmp(c, ".")) continue;
    if (!strcmp(c, "..")) {
      char *sl = strrchr(out, '/');
      if (sl && sl != out) *sl = 0; else snprintf(out, cap, "/");
      continue;
    }
    if (snprintf(out + o, cap - o, "%s%s", o > 1 ? "/" : "", c) >= (int)(cap - o))
      return -1;
  }
  return 0;
}

/* 1 when -o's folder is at or under the work directory wd that does not
 * exist yet (said before plan_output looks for -o's folder: it was "cannot
 * write ... No such file or directory", exit 4, where the rule is exit 2). */
static int inside_new_workdir(const char *out, const char *wd) {
  struct stat sb;
  if (lstat(wd, &sb) == 0) return 0; /* exists: checked once it is open */
  char od[PATH_MAX], w[PATH_MAX];
  char *dir = cli_dir_part(out);
  int ok = dir && resolve_loose(dir, od, sizeof od) == 0 &&
           resolve_loose(wd, w, sizeof w) == 0;
  free(dir);
  if (!ok) return 0;
  size_t l = strlen(w);
  return !strncmp(od, w, l) && (od[l] == '\0' || od[l] == '/');
}

/* The work directory bisect uses: --workdir, else
 * ./ampprobe-bisect-<name>. */
static void workdir_want(const bisect *b, char *wd, size_t n) {
  if (b->workdir_opt) {
    snprintf(wd, n, "%s", b->workdir_opt);
  } else {
    char safe[80];
    guard_sanitize(safe, sizeof safe, b->name);
    snprintf(wd, n, "./ampprobe-bisect-%s", safe);
  }
}

/* Returns -1 to go on, or the exit code. */
static int bisect_plan(bisect *b) {
  int rc;
  if (b->ext) {
    if (plan_ext_name(b) < 0) return CLI_EXIT_USAGE;
  } else if ((rc = plan_config(b)) >= 0) {
    return rc;
  }
  char wd[1024];
  workdir_want(b, wd, sizeof wd);
  if (b->out && inside_new_workdir(b->out, wd)) {
    cli_error(SUB, "-o %s is inside the work directory %s, where the trials' "
                   "files go: choose another output", b->out, wd);
    return CLI_EXIT_USAGE;
  }
  if ((rc = plan_output(b)) >= 0)
    return rc;
  if (split_list(b->candidates, &b->cand_all, &b->n_cand_all) != 0)
    return CLI_EXIT_INTERNAL;
  if (b->n_cand_all == 0) {
    cli_error(SUB, "--fp32-candidates is empty");
    return CLI_EXIT_USAGE;
  }
  if (b->n_cand_all > PROBE_DDMIN_MAX) {
    cli_error(SUB, "too many candidates (at most %d)", PROBE_DDMIN_MAX);
    return CLI_EXIT_USAGE;
  }
  /* read whole now: -o may replace it (--force), and a refusal comes
   * before any folder is made */
  if (b->resume && (rc = resume_load(b)) >= 0)
    return rc;
  /* internal: the layers are known now; external: from the first trace */
  if (!b->ext && select_candidates(b) != 0)
    return CLI_EXIT_INTERNAL;
  /* room for "/run-NNNN/trial-NN.rankNNNN.h5" after it: a longer path was
   * cut silently (a folder of another name; traces that could not open) */
  if (strlen(wd) > WORKDIR_MAX_LEN) {
    cli_error(SUB, "the work directory path is %zu characters long (at most %d)",
              strlen(wd), WORKDIR_MAX_LEN);
    return CLI_EXIT_USAGE;
  }
  if (workdir_open(b, wd) != 0)
    return CLI_EXIT_INTERNAL;
  if (!realpath(b->workdir, b->wd_abs))
    snprintf(b->wd_abs, sizeof b->wd_abs, "%s", b->workdir);
  if (b->out && (cli_same_file(b->out, b->workdir) || inside_workdir(b))) {
    cli_error(SUB, "-o %s is %sthe work directory %s, where the trials' files "
                   "go: choose another output",
              b->out, cli_same_file(b->out, b->workdir) ? "" : "inside ", b->workdir);
    /* leave the file system as it was: only the folders this bisect made
     * (still empty: the work directory and those above it) go; one that
     * existed before is the user's */
    close(b->wd_fd);
    b->wd_fd = -1;
    workdir_unmake(b);
    return CLI_EXIT_USAGE;
  }
  if (!b->ext) {
    ssize_t sl = readlink("/proc/self/exe", b->self, sizeof b->self - 1);
    if (sl <= 0) {
      cli_error(SUB, "cannot find the ampprobe binary (/proc/self/exe): %s",
                strerror(errno));
      return CLI_EXIT_INTERNAL;
    }
    b->self[sl] = 0;
  }
  return -1;
}

/* ---- stage 3: premises ------------------------------------------------------------ */

/* The loss tolerance: max(--max-loss-regress, the relative spread between
 * the two FP32 baselines' mean losses over their last window). */
static void judge_tolerance(bisect *b) {
  b->tol_pct = b->max_regress;
  trial *b1 = T(b, b->base_id), *b2 = T(b, b->noise_id);
  if (!b2 || b2->state != T_DONE || b2->verdict != PROBE_DDMIN_PASS ||
      !b1->loss || !b2->loss)
    return;
  int64_t n = b1->n_steps < b2->n_steps ? b1->n_steps : b2->n_steps;
  int64_t k = window_len(n);
  double m1 = mean_of(b1->loss, n - k, k), m2 = mean_of(b2->loss, n - k, k);
  /* the same losses at every step: the job did not take the seed (an
   * external job that ignores AMPPROBE_SEED), so there is no spread */
  if (n > 0 && b1->n_steps == b2->n_steps &&
      memcmp(b1->loss, b2->loss, (size_t)n * sizeof *b1->loss) == 0) {
    b->noise_identical = 1;
    return;
  }
  if (isfinite(m1) && isfinite(m2) && m1 != 0) {
    b->noise_pct = 100.0 * fabs(m2 - m1) / fabs(m1);
    if (b->noise_pct > b->tol_pct)
      b->tol_pct = b->noise_pct;
  }
}

static double var_of(const double *x, int64_t from, int64_t len, double m) {
  double s = 0;
  for (int64_t i = from; i < from + len; i++)
    s += (x[i] - m) * (x[i] - m);
  return len > 1 ? s / (double)(len - 1) : 0;
}

/* 1 when the baseline does not train: the mean loss of its last window is
 * not below that of its first by more than twice the standard error of the
 * difference (step-to-step noise of the batches), so a run whose loss only
 * wanders (learning rate 0) or climbs counts as not training. */
static int baseline_does_not_train(const trial *t, double *first,
                                   double *last) {
  int64_t n = t->n_steps, k = window_len(n);
  if (2 * k > n)
    k = n / 2;
  if (k < 2 || !t->loss)
    return -1; /* too few steps to tell (or no losses): not judged */
  *first = mean_of(t->loss, 0, k);
  *last = mean_of(t->loss, n - k, k);
  double se = sqrt((var_of(t->loss, 0, k, *first) +
                    var_of(t->loss, n - k, k, *last)) / (double)k);
  return isfinite(*first) && isfinite(*last) && *first - *last <= 2 * se;
}

/* Runs the premise trials in parallel and judges them; *t16 and *tall get
 * the ids of the all-FP16 and all-candidates trials (-1: not run). Returns
 * 1 when they ran, else 0 with r->oc set (interrupted, error). */
static int premises_run(bisect *b, result *r, int *t16, int *tall) {
  uint64_t full = probe_set_full(b->n_cand);
  char all[LIST_MAX], given[LIST_MAX];
  b->names = b->cand;
  b->n_names = b->n_cand;
  set_to_list(b, full, all, sizeof all);
  b->names = b->cand_all;
  b->n_names = b->n_cand_all;
  set_to_list(b, probe_set_full(b->n_cand_all), given, sizeof given);
  b->names = b->cand;
  b->n_names = b->n_cand;
  trial *t = trial_new(b, R_ALL_FP16, "", 0);
  int ok = t != NULL;
  *t16 = ok ? t->id : -1;
  ok = ok && (t = trial_new(b, R_BASELINE, NULL, 0));
  b->base_id = ok ? t->id : -1;
  if (ok && b->noise_on && (ok = (t = trial_new(b, R_NOISE, NULL, 0)) != NULL))
    b->noise_id = t->id;
  /* external: the layers are unknown until a trace exists, so the whole
   * list is tried; internal: only the candidates that match (none: the
   * all-FP16 trial stands for it) */
  *tall = -1;
  if (ok && (b->ext || b->n_cand > 0) &&
      (ok = (t = trial_new(b, R_ALL_CAND, b->ext ? given : all, full)) != NULL))
    *tall = t->id;
  if (!ok) {
    snprintf(b->error, sizeof b->error, "out of memory");
    r->oc = O_ERROR;
    return 0;
  }
  b->est_total = (int)b->n_trials +
                 (b->n_cand > 1 ? 1 + 2 * clog2(b->n_cand) : 0);
  trial *prem[4];
  size_t np = b->n_trials;
  for (size_t i = 0; i < np; i++)
    prem[i] = &b->trials[i];
  probe_status st = run_trials(b, prem, np, 0);
  if (st != PROBE_OK) {
    r->oc = st == PROBE_ERR_INTERRUPTED ? O_INTERRUPTED : O_ERROR;
    return 0;
  }
  b->baseline_known = 1;
  judge_tolerance(b);
  for (size_t i = 0; i < np; i++)
    if (!is_baseline(prem[i]->role))
      trial_judge(b, prem[i]);
  return 1;
}

/* Runs the premises and decides whether to search. Returns 1 to go on to
 * ddmin, 0 when r->oc is the answer. */
static int run_premises(bisect *b, result *r) {
  int t16, tall;
  if (!premises_run(b, r, &t16, &tall))
    return 0;
  trial *a16 = T(b, t16), *base = T(b, b->base_id), *ac = T(b, tall);
  if (b->ext) {
    /* the all-FP16 trace named the layers: drop what matches none */
    if (select_candidates(b) != 0) {
      r->oc = O_ERROR;
      return 0;
    }
    b->names = b->cand;
    b->n_names = b->n_cand;
    b->est_total = (int)b->n_trials +
                   (b->n_cand > 1 ? 1 + 2 * clog2(b->n_cand) : 0);
  }
  if (!ac)
    ac = a16;
  double first = NAN, last = NAN;
  int no_train = base->verdict == PROBE_DDMIN_PASS
                     ? baseline_does_not_train(base, &first, &last)
                     : 0;
  if (no_train < 0) {
    b->train_unchecked = 1;
    fprintf(stderr, "ampprobe: bisect: warning: the FP32 baseline ran %lld "
                    "step%s: too few to tell whether it trains (at least 4)\n",
            (long long)base->n_steps, base->n_steps == 1 ? "" : "s");
  }
  if (no_train > 0) {
    /* first: every loss comparison, even "healthy", stands on it */
    r->oc = O_NOT_TRAINING;
    snprintf(r->summary, sizeof r->summary,
             "not a precision problem: the FP32 baseline does not train (its "
             "mean loss went from %.4g over the first steps to %.4g over the "
             "last, no drop beyond the batch-to-batch noise), so no %s "
             "trial can be judged against it; fix the training itself first (learning rate, data, model; ampprobe "
             "postmortem %.300s)",
             first, last, prec_upper(b), base->trace);
  } else if (a16->verdict == PROBE_DDMIN_PASS) {
    r->oc = O_HEALTHY;
    snprintf(r->summary, sizeof r->summary,
             "healthy, nothing to bisect: with everything in %s the run "
             "passes (%.300s)%s",
             prec_upper(b), a16->why,
             base->verdict == PROBE_DDMIN_FAIL
                 ? "; note that the FP32 baseline fails"
                 : "");
  } else if (base->verdict == PROBE_DDMIN_FAIL && base->ar_origin) {
    /* every module in FP32 and still failing, born in the all-reduce: its
     * dtype is the precision problem (it was "not a precision problem ...
     * check the learning rate, the data and the model") */
    r->oc = O_ALLREDUCE;
    snprintf(r->summary, sizeof r->summary,
             "the gradient all-reduce: the FP32 baseline fails too (%.200s), "
             "and its cross-rank post-mortem finds the non-finite values born "
             "in the all-reduce (every rank's gradients finite before it), "
             "whose dtype no module kept in FP32 changes; all-reduce the "
             "gradients in FP32 (--allreduce-dtype fp32) or pre-divide them by "
             "the world size (--allreduce-prediv) (ampprobe postmortem %.300s)",
             base->why, base->trace);
  } else if (base->verdict == PROBE_DDMIN_FAIL) {
    r->oc = O_NOT_PRECISION;
    snprintf(r->summary, sizeof r->summary,
             "not a precision problem: the FP32 baseline fails too (%.200s), "
             "so no set of modules kept in FP32 can fix it; check the "
             "learning rate, the data and the model (ampprobe postmortem "
             "%.300s)",
             base->why, base->trace);
  } else if (ac->verdict == PROBE_DDMIN_FAIL || b->n_cand == 0) {
    r->oc = O_INSUFFICIENT;
    int finding = implicate(b, ac, r);
    insufficient_hint(b, ac, finding, r);
    size_t o = (size_t)snprintf(
        r->summary, sizeof r->summary,
        "the candidates are not enough: with %.200s in FP32 the run still "
        "fails (%.300s)",
        ac != a16 && b->n_cand ? ac->fp32
                               : "none of them (no candidate matches a layer)",
        ac->why);
    if (r->implicated[0] && o < sizeof r->summary)
      o += (size_t)snprintf(r->summary + o, sizeof r->summary - o,
                            "; the post-mortem of that run implicates %.100s",
                            r->implicated);
    if (r->finding[0] && o < sizeof r->summary)
      o += (size_t)snprintf(r->summary + o, sizeof r->summary - o,
                            "; its top finding: %.200s", r->finding);
    if (r->suggest[0] && o < sizeof r->summary)
      snprintf(r->summary + o, sizeof r->summary - o,
               "; try adding to --fp32-candidates: %.200s", r->suggest);
  } else {
    return 1;
  }
  return 0;
}

/* ---- stage 4: the search --------------------------------------------------------- */

/* A layer name an --fp32 list (and AMPPROBE_FP32) cannot hold: a ',' would
 * split it, a trailing space is trimmed. */
static int unlistable(const char *name) {
  size_t n = strlen(name);
  return !n || strchr(name, ',') || name[n - 1] == ' ';
}

/* --granularity layer: the layer instances of the kinds found, narrowed by
 * a second ddmin seeded with the kind-level answer. Each layer is the
 * entry =NAME in its trials (PROBE_POLICY_LITERAL: that layer exactly; a
 * bare name is a kind when it is one - a BatchNorm named "bn" forced every
 * BatchNorm and the answer named the wrong layer - and a glob when it holds
 * * ? or [). */
static void search_layers(bisect *b, result *r, uint64_t min_set,
                          char ***lnames, int *n_lnames) {
  char **ln = calloc(PROBE_DDMIN_MAX + 1, sizeof *ln);
  int nl = 0;
  size_t matching = 0;
  const char *bad = NULL; /* a name no list can hold */
  for (size_t l = 0; ln && l < b->n_layers; l++) {
    if (b->layers[l].kind == PROBE_KIND_INPUT)
      continue;
    int hit = 0;
    for (int i = 0; i < b->n_cand; i++)
      hit |= (min_set >> i & 1) &&
             probe_policy_match(b->cand[i], b->layers[l].name,
                                b->layers[l].kind);
    if (hit && unlistable(b->layers[l].name) && !bad)
      bad = b->layers[l].name;
    if (hit && ++matching <= PROBE_DDMIN_MAX) {
      size_t n = strlen(b->layers[l].name) + 2;
      if ((ln[nl] = malloc(n)))
        snprintf(ln[nl++], n, "%c%s", PROBE_POLICY_LITERAL, b->layers[l].name);
    }
  }
  if (bad && matching <= PROBE_DDMIN_MAX) {
    /* a trial set could not name it: the answer stays the kind-level one */
    for (int i = 0; i < nl; i++) free(ln[i]);
    nl = 0;
    char qb[PROBE_NAME_MAX * 8];
    cli_escape_name(qb, sizeof qb, bad);
    snprintf(r->hint, sizeof r->hint,
             "--granularity layer: the layer '%.200s' cannot be written in an "
             "--fp32 list (its name holds a ',' or ends in a space), so the "
             "answer stays at kind level", qb);
    char qh[sizeof r->hint * 2];
    cli_escape_name(qh, sizeof qh, r->hint);
    fprintf(stderr, "ampprobe: bisect: warning: %s\n", qh);
  } else if (matching > PROBE_DDMIN_MAX) {
    /* One ddmin takes at most PROBE_DDMIN_MAX elements; searching the first
     * 64 and seeding "all of them pass" answered with a set that never
     * passed (the culprit was layer 70). The answer stays the kind-level
     * one, which did pass, and the result says why. */
    for (int i = 0; i < nl; i++) free(ln[i]);
    nl = 0;
    snprintf(r->hint, sizeof r->hint,
             "--granularity layer: %zu layers match %.200s, more than the %d one "
             "layer-level search can take, so the answer stays at kind level; "
             "narrow --fp32-candidates with layer-name globs (e.g. 'enc.*') to "
             "search layers",
             matching, r->minimal, PROBE_DDMIN_MAX);
    char qh[sizeof r->hint * 2];
    cli_escape_name(qh, sizeof qh, r->hint); /* it names the candidates */
    fprintf(stderr, "ampprobe: bisect: warning: %s\n", qh);
  }
  *lnames = ln;
  *n_lnames = nl;
  r->n_layers_searched = nl;
  b->names = ln;
  b->n_names = nl;
  if (nl == 1) {
    snprintf(r->minimal_layers, sizeof r->minimal_layers, "%s", ln[0] + 1);
    snprintf(r->minimal_layer_set, sizeof r->minimal_layer_set, "%s", ln[0]);
    return;
  }
  if (nl < 2)
    return;
  probe_ddmin dl;
  probe_ddmin_init(&dl, nl, oracle, b);
  probe_ddmin_seed(&dl, 0, PROBE_DDMIN_FAIL);
  /* all these layers in FP32 is the kind-level answer: it passed */
  probe_ddmin_seed(&dl, probe_set_full(nl), PROBE_DDMIN_PASS);
  b->level_role = R_DDMIN_LAYER;
  b->est_total = (int)b->n_trials + 1 + 2 * clog2(nl);
  uint64_t min_l = 0;
  probe_status st = probe_ddmin_minimize(&dl, &min_l);
  r->ddmin_trials += dl.trials;
  probe_ddmin_free(&dl);
  if (st == PROBE_OK) {
    set_to_list_skip(b, min_l, r->minimal_layers, sizeof r->minimal_layers, 1);
    set_to_list(b, min_l, r->minimal_layer_set, sizeof r->minimal_layer_set);
  } else
    r->oc = st == PROBE_ERR_INTERRUPTED ? O_INTERRUPTED : O_ERROR;
}

static void run_search(bisect *b, result *r, char ***lnames, int *n_lnames) {
  probe_ddmin dd;
  uint64_t full = probe_set_full(b->n_cand);
  probe_ddmin_init(&dd, b->n_cand, oracle, b);
  probe_ddmin_seed(&dd, 0, PROBE_DDMIN_FAIL);
  probe_ddmin_seed(&dd, full, PROBE_DDMIN_PASS);
  b->level_role = R_DDMIN;
  uint64_t min_set = 0;
  probe_status st = probe_ddmin_minimize(&dd, &min_set);
  r->ddmin_trials += dd.trials;
  probe_ddmin_free(&dd);
  if (st != PROBE_OK) {
    r->oc = st == PROBE_ERR_INTERRUPTED ? O_INTERRUPTED : O_ERROR;
    return;
  }
  set_to_list(b, min_set, r->minimal, sizeof r->minimal);
  r->oc = O_FOUND;
  if (!strcmp(b->granularity, "layer"))
    search_layers(b, r, min_set, lnames, n_lnames);
  if (r->oc != O_FOUND)
    return;
  /* the command runs the =NAME entries (each that layer exactly); the
   * summary names the layers */
  const char *fix = r->minimal_layers[0] ? r->minimal_layers : r->minimal;
  free(r->reproduce);
  r->reproduce = make_reproduce(b, r->minimal_layers[0] ? r->minimal_layer_set
                                                        : r->minimal);
  int k = 1;
  for (const char *p = fix; *p; p++)
    k += *p == ',';
  int of = r->minimal_layers[0] ? r->n_layers_searched : b->n_cand;
  snprintf(r->summary, sizeof r->summary,
           "keep %.400s in FP32: the smallest set found with which training "
           "passes (%d of %d candidate%s%s)",
           fix, k, of, r->minimal_layers[0] ? " layer" : "", of > 1 ? "s" : "");
}

/* ---- stage 5: output -------------------------------------------------------------- */

static int exit_code_of(const bisect *b, const result *r) {
  switch (r->oc) {
  case O_HEALTHY: return CLI_EXIT_OK;
  case O_FOUND:
  case O_ALLREDUCE:
  case O_NOT_PRECISION:
  case O_INSUFFICIENT: return CLI_EXIT_PROBLEM;
  case O_NOT_TRAINING: return EXIT_NOT_TRAINING;
  case O_INTERRUPTED: return CLI_EXIT_INTERRUPTED;
  case O_ERROR: break;
  }
  /* a run option the trial rejected is the user's usage error */
  return !b->ext && b->error_exit == CLI_EXIT_USAGE ? CLI_EXIT_USAGE
                                                    : CLI_EXIT_INTERNAL;
}

/* The table (or JSON) and the -o file; on an error only the one-line
 * message, nothing on stdout. An interrupted search writes -o too (outcome
 * "interrupted", the trials done). A -o that cannot be written loses
 * nothing: the result still goes to stdout (a bisect can take hours of
 * trials), then the write's error is the exit code. */
static int bisect_output(bisect *b, result *r) {
  int rc = exit_code_of(b, r);
  if (r->oc == O_ERROR) {
    cli_error(SUB, "stopped: %s", b->error[0] ? b->error : "a trial could not run");
    return rc;
  }
  if (r->oc == O_INTERRUPTED)
    snprintf(r->summary, sizeof r->summary,
             "interrupted: the table shows the trials so far");
  json_t *j = NULL;
  if (b->json || b->out)
    j = result_json(b, r);
  int wrc = 0;
  if (b->out) {
    /* the one output writer of every command (docs/cli.md "Files"): with
     * --force renamed over FILE (a symlink's target replaced, a device
     * written in place); without, linked into place, so a file that
     * appeared since the plan's check is not replaced */
    if (!j) {
      cli_error(SUB, "cannot write %s: out of memory", b->out);
      wrc = CLI_EXIT_INTERNAL;
    } else if (b->force ? cli_write_json(SUB, b->out, j)
                        : cli_write_json_new(SUB, b->out, j)) {
      wrc = CLI_EXIT_INTERNAL;
    }
  }
  if (b->json) {
    if (cli_json_print(SUB, j) != 0) rc = CLI_EXIT_INTERNAL;
  } else {
    print_text(b, r);
    if (cli_stdout_check(SUB) != 0) rc = CLI_EXIT_INTERNAL;
  }
  json_decref(j);
  return wrc ? wrc : rc;
}

static void bisect_free(bisect *b) {
  for (size_t i = 0; i < b->n_trials; i++)
    free(b->trials[i].loss);
  free(b->trials);
  free_list(b->cand_all, b->n_cand_all);
  free_list(b->cand, b->n_cand);
  free(b->layers);
  if (b->wd_fd >= 0)
    close(b->wd_fd);
  for (size_t i = 0; i < b->n_prior; i++) {
    free(b->prior[i].fp32);
    free(b->prior[i].trace);
  }
  free(b->prior);
  for (int i = 0; i < b->n_rs_dir; i++) {
    free(b->rs_dir[i]);
    if (b->rs_fd[i] >= 0)
      close(b->rs_fd[i]);
  }
}

int cmd_bisect(int argc, char **argv) {
  bisect b;
  memset(&b, 0, sizeof b);
  result r;
  memset(&r, 0, sizeof r);
  char **lnames = NULL;
  int n_lnames = 0;
  int rc = bisect_parse(argc, argv, &b);
  if (rc < 0)
    rc = bisect_plan(&b);
  if (rc < 0) {
    cli_signals_install();
    b.t_start = b.last_line = cli_now();
    cli_line_init(&b.progress, b.quiet || b.progress_every > 0, 0);
    if (run_premises(&b, &r))
      run_search(&b, &r, &lnames, &n_lnames);
    progress_clear(&b);
    rc = bisect_output(&b, &r);
  }
  free_list(lnames, n_lnames);
  free(r.reproduce);
  bisect_free(&b);
  return rc;
}
