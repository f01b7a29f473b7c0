/*
 * tools/run.c - `ampprobe run`: loads a scenario or config, applies the
 * command-line overrides (probe_config_set), trains with libprobe recording
 * (full trace with --trace, else the flight recorder), and prints a summary
 * read at a glance. SIGINT/SIGTERM set the trainer's stop flag: the step
 * ends, the trace is closed, the summary printed, exit 130.
 * Exit 0 healthy, 1 diverged or degraded (the post-mortem's verdict on the
 * trace written).
 *
 * Stages: run_parse (options) -> run_load (config + overrides) ->
 * run_claim_output (trace path; never an input, never an existing file
 * without --force) -> run_train -> run_print.
 *
 * Multi-rank (docs/cli.md, "run under mpirun or srun"): a process started by
 * mpirun or srun (probe_comm_launched) opens the trainer's MPI communicator
 * and trains its shard; each rank writes probe_rank_trace_path(trace, rank)
 * with one run id (AMPPROBE_RUN_ID, or rank 0's, broadcast); set-up errors
 * are agreed by all ranks (every rank exits with the worst code), an error
 * mid-run ends the job (MPI_Abort); rank 0 prints the summary. --ranks N
 * re-execs the command under mpirun -np N.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ampprobe/analysis.h" /* probe_num_format */
#include "ampprobe/trainer.h"
#include "cli.h"
#include "runguard.h"

static const char *SUB = "run";

static void usage(FILE *f) {
  fprintf(f,
"usage: ampprobe run [--scenario NAME | --config FILE] [--trace] [-o PATH]\n"
"                    [--force] [--precision fp16|bf16|fp32] [--fp32 LIST]\n"
"                    [--steps N] [--seed S] [scaler and clipping options]\n"
"                    [--ranks N] [--allreduce-dtype fp32|fp16]\n"
"                    [--allreduce-prediv] [--ring-steps K] [--flush-steps N]\n"
"                    [--flush-seconds S] [--weight-digest] [--json] [-q]\n"
"                    [--progress-every SECONDS]\n"
"\n"
"Trains a scenario of the zoo (or a JSON config) with libprobe recording every\n"
"layer, writes the trace and prints a summary. With no arguments it runs the\n"
"default scenario '%s' to ./ampprobe-%s.h5.\n"
"\n"
"what to run:\n"
"  --scenario NAME          built-in scenario (see --list-scenarios)\n"
"  --config FILE            JSON config file (docs/config.md)\n"
"  --list-scenarios         list the built-in scenarios and exit\n"
"\n"
"recording:\n"
"  --trace                  record every layer at every step (full trace);\n"
"                           default: step scalars + a flight recorder of the\n"
"                           last steps, written at the first non-finite value\n"
"  --ring-steps K           flight-recorder depth in steps (default: libprobe's)\n"
"  --flush-steps N          also flush the trace every N steps\n"
"  --flush-seconds S        flush at most S seconds after data (default 1)\n"
"  -o, --output PATH        trace file (default ./ampprobe-<scenario>.h5); an\n"
"                           existing file is refused, and so is an input\n"
"                           (the config or data file) whatever the flags\n"
"  --force                  replace an existing trace file\n"
"  --weight-digest          store each step's digest of the FP32 master\n"
"                           weights in one process too (data-parallel runs\n"
"                           always do: the post-mortem compares the ranks')\n"
"\n"
"precision:\n"
"  --precision P            fp16 | bf16 | fp32 (global policy)\n"
"  --fp32 LIST              keep these module kinds or layer-name globs in\n"
"                           FP32, e.g. --fp32 bn,softmax or --fp32 'enc.*';\n"
"                           =NAME is one layer named exactly NAME (never a\n"
"                           kind or a glob): --fp32 =bn\n"
"\n"
"training:\n"
"  --steps N                optimizer steps, 1..100000000\n"
"  --seed S                 random seed\n"
"  --lr X                   learning rate\n"
"  --micro-batches N        gradient accumulation over N micro-batches\n"
"  --max-memory SIZE        refuse a run needing more host memory than SIZE\n"
"                           (e.g. 512M, 8G; default 80%% of physical memory,\n"
"                           or what ulimit -v/-d leaves)\n"
"  --stop-on-nonfinite[=K]  end the run K steps (default 0) after the first\n"
"                           non-finite loss\n"
"\n"
"loss scaler (torch.amp.GradScaler rules; Megatron's hysteresis/min scale):\n"
"  --init-scale X           initial scale (default 65536)\n"
"  --growth-interval N      clean steps before growing (default 2000)\n"
"  --growth-factor X        growth multiplier (default 2)\n"
"  --backoff-factor X       backoff multiplier in (0,1) (default 0.5)\n"
"  --hysteresis N           overflows absorbed before a backoff (default 1)\n"
"  --min-scale X            smallest scale (default none)\n"
"  --no-loss-scale          turn loss scaling off\n"
"\n"
"data-parallel (under mpirun or srun: docs/cli.md):\n"
"  --ranks N                re-run this command under mpirun -np N\n"
"  --allreduce-dtype D      fp32 (default) | fp16 (sums in binary16)\n"
"  --allreduce-prediv       divide the gradients by N before the all-reduce\n"
"\n"
"clipping:\n"
"  --clip-norm X            clip by global L2 norm X (0 = off)\n"
"  --clip-before-unscale    clip the still-scaled gradients (the classic bug)\n"
"\n"
"output:\n"
"  --json                   print the summary as JSON on stdout\n"
"  -q, --quiet              no progress line on stderr\n"
"  --progress-every S       a plain progress line on stderr every S seconds,\n"
"                           terminal or not (for job logs under a scheduler)\n"
"  -h, --help               this help\n"
"\n"
"exit: 0 healthy, 1 diverged or degraded, 2 usage or bad config (or -o exists, or is an\n"
"      input), 3 unreadable config (or not a regular file),\n"
"      4 runtime error (e.g. the trace cannot be written), 130 interrupted\n"
"\n"
"examples:\n"
"  ampprobe run --scenario revin-overflow --trace -o fp16.h5\n"
"  ampprobe run --scenario revin-overflow --fp32 revin --trace -o fixed.h5\n"
"  ampprobe run --precision fp32 --trace -o fp32.h5\n",
          PROBE_DEFAULT_SCENARIO, PROBE_DEFAULT_SCENARIO);
}

enum {
  O_SCENARIO = 256, O_CONFIG, O_TRACE, O_PRECISION, O_FP32, O_STEPS, O_SEED,
  O_INIT_SCALE, O_GROWTH_INTERVAL, O_GROWTH_FACTOR, O_BACKOFF_FACTOR,
  O_HYSTERESIS, O_MIN_SCALE, O_NO_LOSS_SCALE, O_CLIP_NORM,
  O_CLIP_BEFORE_UNSCALE, O_MICRO_BATCHES, O_LR, O_STOP_NONFINITE,
  O_LIST, O_JSON, O_RING, O_FORCE, O_PROGRESS_EVERY, O_RANKS,
  O_AR_DTYPE, O_AR_PREDIV, O_FLUSH_STEPS, O_FLUSH_SECONDS, O_DIGEST, O_MAX_MEMORY
};

/* --ranks' range: more processes than this on one machine is a mistake. */
#define RUN_RANKS_MAX 4096

/* --max-memory's range: below 16 MiB no scenario runs; 1 PiB is past any
 * host. */
#define RUN_MEMORY_MIN ((uint64_t)16 << 20)
#define RUN_MEMORY_MAX ((uint64_t)1 << 50)

/* The trainer's range for steps (docs/config.md), checked here so that
 * --steps -5 and --steps 200000000 get the same message. */
#define RUN_STEPS_MAX 100000000

/* One override, validated here and applied with probe_config_set. */
typedef struct override {
  const char *key;
  const char *value;
} override;

static int list_scenarios(int json) {
  size_t n = probe_scenario_count();
  if (json) {
    json_t *a = json_array();
    for (size_t i = 0; i < n; i++) {
      const char *nm = probe_scenario_name(i);
      json_t *o = json_object();
      json_object_set_new(o, "name", cli_json_text(nm));
      json_object_set_new(o, "description",
                          cli_json_text(probe_scenario_description(nm)));
      json_object_set_new(o, "default",
                          json_boolean(!strcmp(nm, PROBE_DEFAULT_SCENARIO)));
      json_array_append_new(a, o);
    }
    int rc = cli_json_print(SUB, a);
    json_decref(a);
    return rc;
  }
  for (size_t i = 0; i < n; i++) {
    const char *nm = probe_scenario_name(i);
    printf("%-22s %s%s\n", nm, probe_scenario_description(nm),
           strcmp(nm, PROBE_DEFAULT_SCENARIO) ? "" : " (default)");
  }
  return CLI_EXIT_OK;
}

/* The command line stored in the trace (command_line): "ampprobe" and
 * argv, each argument shell-quoted (probe_shell_quote), so the post-mortem
 * reads `--config 'my cfg.json'` back as one argument, with the quoting
 * rule the Python package's shlex.join uses too. */
static char *join_args(int argc, char **argv) {
  const char **w = malloc(((size_t)argc + 1) * sizeof *w);
  if (!w) return NULL;
  w[0] = "ampprobe";
  for (int i = 0; i < argc; i++) w[i + 1] = argv[i];
  char *s = cli_join_quoted(NULL, w, (size_t)argc + 1);
  free(w);
  return s;
}

static void fmt_num(char *b, size_t n, double x) { probe_num_format(b, n, x, 6); }

/* Set by run_verdict when the closing check could not read the trace: the
 * verdict is then degraded for want of one, not for anything the trace
 * shows (the summary said "the loss stayed finite; see the post-mortem"). */
static int run_check_failed;

static void print_summary(const probe_train_result *r, const char *name,
                          const char *policy, int64_t steps_planned,
                          const char *path, int full, int interrupted,
                          probe_verdict v, double check_s) {
  char a[32], b[32], c[32];
  /* names from the config print escaped: no control character reaches the
   * terminal (cli_escape_name) */
  char nm[PROBE_NAME_MAX * 8], ly[PROBE_NAME_MAX * 8], pol[2048], pa[4096];
  char qpa[8400]; /* the path as a word to paste (cli_paste_word) */
  cli_escape_name(nm, sizeof nm, name);
  cli_escape_name(ly, sizeof ly, r->first_nonfinite_layer);
  cli_escape_name(pol, sizeof pol, policy);
  cli_escape_name(pa, sizeof pa, path);
  /* the command is printed only whole (the buffer fits any -o path) */
  int have_qpa = cli_paste_word(qpa, sizeof qpa, path) == 0;
  name = nm;
  policy = pol;
  path = pa;
  printf("ampprobe run: %s, %s\n", name, policy);
  printf("  steps run       %lld of %lld%s\n", (long long)r->steps_run,
         (long long)steps_planned,
         interrupted ? " (interrupted)"
                     : (r->interrupted ? " (stopped after non-finite loss)"
                                       : ""));
  fmt_num(a, sizeof a, r->final_loss);
  fmt_num(b, sizeof b, r->first_loss);
  fmt_num(c, sizeof c, r->last_loss);
  printf("  final loss      %s (mean of the last steps; first %s, last %s)\n",
         a, b, c);
  printf("  skipped steps   %lld (longest run %lld)\n",
         (long long)r->skipped_steps, (long long)r->longest_skip_run);
  if (r->scaler_enabled)
    printf("  loss scale      %g..%g, final %g; %lld backoffs, %lld growths\n",
           r->min_scale, r->max_scale, r->final_scale, (long long)r->backoffs,
           (long long)r->growths);
  else
    printf("  loss scale      off\n");
  if (r->clip_max_norm <= 0)
    printf("  largest clip    clipping off\n");
  else if (r->clip_norms_seen == 0)
    printf("  largest clip    clipping on (max_norm %g); no finite gradient "
           "norm seen\n", r->clip_max_norm);
  else
    printf("  largest clip    grad_norm/max_norm = %.4g (max_norm %g)\n",
           r->max_clip_ratio, r->clip_max_norm);
  if (r->first_nonfinite_step >= 0)
    printf("  first non-finite step %lld, layer %s, site %s\n",
           (long long)r->first_nonfinite_step, ly,
           probe_site_name(r->first_nonfinite_site));
  else
    printf("  first non-finite none\n");
  if (r->first_nonfinite_loss_step >= 0)
    printf("  non-finite loss from step %lld\n",
           (long long)r->first_nonfinite_loss_step);
  printf("  verdict         %s\n",
         interrupted                        ? "INTERRUPTED"
         : v == PROBE_VERDICT_DIVERGED      ? "DIVERGED"
         : v == PROBE_VERDICT_DEGRADED && run_check_failed
             ? "DEGRADED (the closing check could not read the trace; "
               "see the error above)"
         : v == PROBE_VERDICT_DEGRADED ? "DEGRADED (the loss stayed "
                                         "finite; see the post-mortem)"
                                       : "healthy");
  printf("  trace           %s (%s)\n", path,
         full ? "full per-layer trace" : "flight recorder");
  printf("  time            %.2f s", r->wall_seconds);
  if (check_s >= 0.05) /* the post-mortem of the trace, after the training */
    printf(" + %.2f s checking the trace", check_s);
  printf("\n");
  int fwd = !r->diverged && r->first_nonfinite_step >= 0 &&
            probe_site_phase(r->first_nonfinite_site) != PROBE_PHASE_BACKWARD;
  const char *next = have_qpa ? qpa : "(the trace above)";
  if (fwd)
    /* Backward inf/NaN with a finite loss is a scaled gradient overflowing,
     * which the scaler handles (skip + backoff); a forward one is not. */
    printf("  note            the loss stayed finite, but a layer produced inf/NaN"
           " (%s at step %lld):\n"
           "                  ampprobe postmortem %s\n",
           ly, (long long)r->first_nonfinite_step, next);
  else if (!interrupted && v != PROBE_VERDICT_HEALTHY)
    printf("  next            ampprobe postmortem %s\n", next);
}

static json_t *summary_json(const probe_train_result *r, const char *name,
                            const char *policy, int64_t steps_planned,
                            const char *path, int full, int interrupted,
                            probe_verdict v, double check_s) {
  json_t *o = json_object();
  json_object_set_new(o, "scenario", cli_json_text(name));
  json_object_set_new(o, "precision_policy", cli_json_text(policy));
  json_object_set_new(o, "trace", cli_json_text(path));
  /* true: the closing check could not read the trace (verdict degraded
   * for want of one) */
  json_object_set_new(o, "check_failed", json_boolean(run_check_failed));
  json_object_set_new(o, "record_mode",
                      json_string(full ? "full" : "flight-recorder"));
  json_object_set_new(o, "steps_planned", json_integer(steps_planned));
  json_object_set_new(o, "steps_run", json_integer(r->steps_run));
  json_object_set_new(o, "final_loss", cli_json_num(r->final_loss));
  json_object_set_new(o, "first_loss", cli_json_num(r->first_loss));
  json_object_set_new(o, "last_loss", cli_json_num(r->last_loss));
  json_object_set_new(o, "skipped_steps", json_integer(r->skipped_steps));
  json_object_set_new(o, "longest_skip_run", json_integer(r->longest_skip_run));
  json_object_set_new(o, "loss_scaling", json_boolean(r->scaler_enabled));
  json_object_set_new(o, "min_scale", cli_json_num(r->min_scale));
  json_object_set_new(o, "max_scale", cli_json_num(r->max_scale));
  json_object_set_new(o, "final_scale", cli_json_num(r->final_scale));
  json_object_set_new(o, "backoffs", json_integer(r->backoffs));
  json_object_set_new(o, "growths", json_integer(r->growths));
  json_object_set_new(o, "clip_max_norm",
                      r->clip_max_norm > 0 ? cli_json_num(r->clip_max_norm)
                                           : json_null());
  json_object_set_new(o, "clip_norms_seen", json_integer(r->clip_norms_seen));
  /* null when there is no ratio: clipping off or no finite norm */
  json_object_set_new(o, "max_clip_ratio",
                      r->clip_norms_seen ? cli_json_num(r->max_clip_ratio)
                                         : json_null());
  json_t *fe = json_null();
  if (r->first_nonfinite_step >= 0) {
    fe = json_object();
    json_object_set_new(fe, "step", json_integer(r->first_nonfinite_step));
    json_object_set_new(fe, "layer", cli_json_text(r->first_nonfinite_layer));
    json_object_set_new(fe, "site",
                        json_string(probe_site_name(r->first_nonfinite_site)));
  }
  json_object_set_new(o, "first_nonfinite", fe);
  json_object_set_new(o, "first_nonfinite_loss_step",
                      r->first_nonfinite_loss_step >= 0
                          ? json_integer(r->first_nonfinite_loss_step)
                          : json_null());
  json_object_set_new(o, "diverged", json_boolean(r->diverged));
  json_object_set_new(o, "verdict", json_string(interrupted
                                                    ? "interrupted"
                                                    : probe_verdict_name(v)));
  json_object_set_new(o, "interrupted", json_boolean(interrupted));
  json_object_set_new(o, "wall_seconds", cli_json_num(r->wall_seconds));
  json_object_set_new(o, "check_seconds", cli_json_num(check_s));
  return o;
}

/* ---- stage 1: options --------------------------------------------------- */

typedef struct run_args {
  const char *scenario, *config, *out_path;
  int full, json, quiet, list, force;
  int digest;            /* --weight-digest: also in one process */
  int64_t ring, stop_k;
  double progress_every; /* seconds between plain progress lines; 0 = off */
  int64_t ranks;         /* --ranks N: re-exec under mpirun; 0 = not given */
  int64_t flush_steps;   /* --flush-steps N; 0 = libprobe's default */
  double flush_seconds;  /* --flush-seconds S; 0 = libprobe's default */
  uint64_t max_memory;   /* --max-memory SIZE; 0 = the trainer's default */
  override ov[32];
  int n_ov;
} run_args;

/* Parses argv into a; returns -1 to go on, or the exit code. */
static int run_parse(int argc, char **argv, run_args *a) {
  static const struct option longs[] = {
      {"scenario", required_argument, NULL, O_SCENARIO},
      {"config", required_argument, NULL, O_CONFIG},
      {"trace", no_argument, NULL, O_TRACE},
      {"output", required_argument, NULL, 'o'},
      {"force", no_argument, NULL, O_FORCE},
      {"ring-steps", required_argument, NULL, O_RING},
      {"precision", required_argument, NULL, O_PRECISION},
      {"fp32", required_argument, NULL, O_FP32},
      {"steps", required_argument, NULL, O_STEPS},
      {"seed", required_argument, NULL, O_SEED},
      {"init-scale", required_argument, NULL, O_INIT_SCALE},
      {"growth-interval", required_argument, NULL, O_GROWTH_INTERVAL},
      {"growth-factor", required_argument, NULL, O_GROWTH_FACTOR},
      {"backoff-factor", required_argument, NULL, O_BACKOFF_FACTOR},
      {"hysteresis", required_argument, NULL, O_HYSTERESIS},
      {"min-scale", required_argument, NULL, O_MIN_SCALE},
      {"no-loss-scale", no_argument, NULL, O_NO_LOSS_SCALE},
      {"clip-norm", required_argument, NULL, O_CLIP_NORM},
      {"clip-before-unscale", no_argument, NULL, O_CLIP_BEFORE_UNSCALE},
      {"micro-batches", required_argument, NULL, O_MICRO_BATCHES},
      {"lr", required_argument, NULL, O_LR},
      {"stop-on-nonfinite", optional_argument, NULL, O_STOP_NONFINITE},
      {"list-scenarios", no_argument, NULL, O_LIST},
      {"json", no_argument, NULL, O_JSON},
      {"progress-every", required_argument, NULL, O_PROGRESS_EVERY},
      {"max-memory", required_argument, NULL, O_MAX_MEMORY},
      {"ranks", required_argument, NULL, O_RANKS},
      {"allreduce-dtype", required_argument, NULL, O_AR_DTYPE},
      {"allreduce-prediv", no_argument, NULL, O_AR_PREDIV},
      {"flush-steps", required_argument, NULL, O_FLUSH_STEPS},
      {"flush-seconds", required_argument, NULL, O_FLUSH_SECONDS},
      {"weight-digest", no_argument, NULL, O_DIGEST},
      {"quiet", no_argument, NULL, 'q'},
      {"help", no_argument, NULL, 'h'},
      {NULL, 0, NULL, 0},
  };
  memset(a, 0, sizeof *a);
  a->stop_k = -1;
  int64_t iv;
  double dv;
  probe_dtype prec;
#define OV(k, v) (a->ov[a->n_ov].key = (k), a->ov[a->n_ov].value = (v), a->n_ov++)
  cli_getopt_reset();
  int c;
  while ((c = getopt_long(argc, argv, ":o:qh", longs, NULL)) != -1) {
    if (a->n_ov >= (int)(sizeof a->ov / sizeof a->ov[0]) - 1) {
      cli_error(SUB, "too many options");
      return CLI_EXIT_USAGE;
    }
    switch (c) {
    case O_SCENARIO: a->scenario = optarg; break;
    case O_CONFIG: a->config = optarg; break;
    case O_TRACE: a->full = 1; break;
    case 'o': a->out_path = optarg; break;
    case O_FORCE: a->force = 1; break;
    case O_RING:
      if (cli_parse_i64(SUB, "--ring-steps", optarg, 1, 1000000, &a->ring))
        return CLI_EXIT_USAGE;
      break;
    case O_PRECISION:
      if (probe_dtype_parse(optarg, &prec) < 0) {
        cli_error(SUB, "invalid value '%s' for --precision: expected fp16, "
                       "bf16 or fp32", optarg);
        return CLI_EXIT_USAGE;
      }
      OV("precision", optarg);
      break;
    case O_FP32: OV("fp32", optarg); break;
    case O_STEPS:
      /* the trainer's own range, so -5 and 200000000 read alike */
      if (cli_parse_i64(SUB, "--steps", optarg, 1, RUN_STEPS_MAX, &iv))
        return CLI_EXIT_USAGE;
      OV("steps", optarg);
      break;
    case O_SEED:
      if (cli_parse_i64(SUB, "--seed", optarg, 0, INT64_MAX, &iv))
        return CLI_EXIT_USAGE;
      OV("seed", optarg);
      break;
    case O_INIT_SCALE:
      if (cli_parse_double(SUB, "--init-scale", optarg, 1e-30, 3e38, &dv))
        return CLI_EXIT_USAGE;
      OV("scaler.init", optarg);
      break;
    case O_GROWTH_INTERVAL:
      if (cli_parse_i64(SUB, "--growth-interval", optarg, 1, INT32_MAX, &iv))
        return CLI_EXIT_USAGE;
      OV("scaler.interval", optarg);
      break;
    case O_GROWTH_FACTOR:
      if (cli_parse_double(SUB, "--growth-factor", optarg, 1.0, 1e6, &dv))
        return CLI_EXIT_USAGE;
      OV("scaler.growth", optarg);
      break;
    case O_BACKOFF_FACTOR:
      if (cli_parse_double(SUB, "--backoff-factor", optarg, 1e-6, 0.999999,
                           &dv))
        return CLI_EXIT_USAGE;
      OV("scaler.backoff", optarg);
      break;
    case O_HYSTERESIS:
      if (cli_parse_i64(SUB, "--hysteresis", optarg, 1, 1 << 20, &iv))
        return CLI_EXIT_USAGE;
      OV("scaler.hysteresis", optarg);
      break;
    case O_MIN_SCALE:
      if (cli_parse_double(SUB, "--min-scale", optarg, 0, 3e38, &dv))
        return CLI_EXIT_USAGE;
      OV("scaler.min_scale", optarg);
      break;
    case O_NO_LOSS_SCALE: OV("scaler.enabled", "0"); break;
    case O_CLIP_NORM:
      if (cli_parse_double(SUB, "--clip-norm", optarg, 0, 1e30, &dv))
        return CLI_EXIT_USAGE;
      OV("clip.max_norm", optarg);
      break;
    case O_CLIP_BEFORE_UNSCALE: OV("clip.before_unscale", "1"); break;
    case O_MICRO_BATCHES:
      if (cli_parse_i64(SUB, "--micro-batches", optarg, 1, 1024, &iv))
        return CLI_EXIT_USAGE;
      OV("micro_batches", optarg);
      break;
    case O_LR:
      if (cli_parse_double(SUB, "--lr", optarg, 0, 1e6, &dv))
        return CLI_EXIT_USAGE;
      OV("lr", optarg);
      break;
    case O_STOP_NONFINITE:
      a->stop_k = 0;
      if (optarg &&
          cli_parse_i64(SUB, "--stop-on-nonfinite", optarg, 0, INT64_MAX / 2,
                        &a->stop_k))
        return CLI_EXIT_USAGE;
      break;
    case O_PROGRESS_EVERY:
      if (cli_parse_double(SUB, "--progress-every", optarg, 0.01, 86400,
                           &a->progress_every))
        return CLI_EXIT_USAGE;
      break;
    case O_RANKS:
      if (cli_parse_i64(SUB, "--ranks", optarg, 1, RUN_RANKS_MAX, &a->ranks))
        return CLI_EXIT_USAGE;
      break;
    case O_AR_DTYPE:
      if (strcmp(optarg, "fp32") && strcmp(optarg, "fp16")) {
        cli_error(SUB, "invalid value '%s' for --allreduce-dtype: expected "
                       "fp32 or fp16", optarg);
        return CLI_EXIT_USAGE;
      }
      OV("dist.allreduce_dtype", optarg);
      break;
    case O_AR_PREDIV: OV("dist.prediv", "1"); break;
    case O_FLUSH_STEPS:
      if (cli_parse_i64(SUB, "--flush-steps", optarg, 1, INT32_MAX,
                        &a->flush_steps))
        return CLI_EXIT_USAGE;
      break;
    case O_FLUSH_SECONDS:
      if (cli_parse_double(SUB, "--flush-seconds", optarg, 0.001, 1e6,
                           &a->flush_seconds))
        return CLI_EXIT_USAGE;
      break;
    case O_MAX_MEMORY:
      if (cli_parse_size(SUB, "--max-memory", optarg, RUN_MEMORY_MIN,
                         RUN_MEMORY_MAX, &a->max_memory))
        return CLI_EXIT_USAGE;
      break;
    case O_DIGEST: a->digest = 1; break;
    case O_LIST: a->list = 1; break;
    case O_JSON: a->json = 1; break;
    case 'q': a->quiet = 1; break;
    case 'h': usage(stdout); return CLI_EXIT_OK;
    default: return cli_getopt_error(SUB, argv, c);
    }
  }
#undef OV
  if (optind < argc) {
    cli_error(SUB, "unexpected argument '%s' (see 'ampprobe run --help')",
              argv[optind]);
    return CLI_EXIT_USAGE;
  }
  if (a->scenario && a->config) {
    cli_error(SUB, "--scenario and --config exclude each other");
    return CLI_EXIT_USAGE;
  }
  return -1;
}

/* ---- multi-rank: the communicator, --ranks ------------------------------- */

typedef struct run_dist {
  probe_comm *comm; /* NULL: a plain single-process run */
  int rank, world;
  char run_id[PROBE_RUN_ID_MAX + 1];
  char set_glob[1100]; /* the job's rank files as a glob; "" if none */
} run_dist;

static int run_id_valid(const char *s) {
  size_t n = strlen(s);
  if (n == 0 || n > PROBE_RUN_ID_MAX)
    return 0;
  for (const char *p = s; *p; p++)
    if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') ||
          (*p >= '0' && *p <= '9') || *p == '.' || *p == '_' || *p == '-'))
      return 0;
  return 1;
}

/* Rank 0's run id: UTC time, pid and 32 random bits ("20261202T014512Z-
 * 1a2b-3c4d5e6f"). */
static void run_id_make(char *buf, size_t len) {
  time_t t = time(NULL);
  struct tm tm;
  gmtime_r(&t, &tm);
  uint32_t rnd = (uint32_t)t ^ ((uint32_t)getpid() << 16);
  FILE *f = fopen("/dev/urandom", "rb");
  if (f) {
    if (fread(&rnd, sizeof rnd, 1, f) != 1)
      rnd ^= (uint32_t)clock();
    fclose(f);
  }
  char ts[32];
  strftime(ts, sizeof ts, "%Y%m%dT%H%M%SZ", &tm);
  snprintf(buf, len, "%s-%x-%08x", ts, (unsigned)getpid() & 0xffffu, rnd);
}

/* Under mpirun or srun: opens the MPI communicator and agrees on the run
 * id. Returns -1 to go on (d filled; d->comm NULL for a plain run), or the
 * exit code. */
static int dist_open(run_dist *d) {
  memset(d, 0, sizeof *d);
  d->world = 1;
  if (!probe_comm_launched())
    return -1;
  if (!probe_comm_mpi_available()) {
    cli_error(SUB, "started by mpirun or srun, but this ampprobe was built "
                   "without MPI: every process would train alone; install "
                   "libopenmpi-dev and rebuild (docs/cli.md)");
    return CLI_EXIT_USAGE;
  }
  char err[256] = "";
  probe_status st = probe_comm_open(&d->comm, PROBE_COMM_MPI, err, sizeof err);
  if (st != PROBE_OK) {
    cli_error(SUB, "%s", err[0] ? err : probe_status_str(st));
    return CLI_EXIT_INTERNAL;
  }
  d->rank = probe_comm_rank(d->comm);
  d->world = probe_comm_size(d->comm);
  const char *env = getenv("AMPPROBE_RUN_ID");
  if (env && *env) {
    if (!run_id_valid(env)) {
      if (d->rank == 0)
        cli_error(SUB, "AMPPROBE_RUN_ID '%.80s' is not 1 to %d characters of "
                       "[A-Za-z0-9._-]", env, PROBE_RUN_ID_MAX);
      probe_comm_close(d->comm);
      d->comm = NULL;
      return CLI_EXIT_USAGE;
    }
    snprintf(d->run_id, sizeof d->run_id, "%s", env);
  } else if (d->rank == 0) {
    run_id_make(d->run_id, sizeof d->run_id);
  }
  /* rank 0's id for all (an env id differing across ranks would too) */
  st = probe_comm_bcast(d->comm, d->run_id, sizeof d->run_id);
  d->run_id[PROBE_RUN_ID_MAX] = 0;
  if (st != PROBE_OK) {
    cli_error(SUB, "rank %d: broadcasting the run id failed", d->rank);
    probe_comm_abort(d->comm, CLI_EXIT_INTERNAL);
  }
  return -1;
}

/* Every rank's set-up outcome agreed: rc (-1 = fine, else an exit code) of
 * this rank in, the worst of all ranks out, so that no rank trains while
 * another has given up. */
static int dist_agree(run_dist *d, int rc) {
  if (!d->comm || d->world == 1)
    return rc;
  double v = rc;
  if (probe_comm_allreduce_f64(d->comm, &v, 1, 1) != PROBE_OK)
    probe_comm_abort(d->comm, CLI_EXIT_INTERNAL);
  return (int)v;
}

/* The ranks train one model on one schedule: every rank's configuration
 * (probe_config_to_json: model, data, steps, optimizer, scaler, policy) must
 * be the same. Ranks started with different ones (mpirun's MPMD form with a
 * different --steps on one rank: the others waited for ever in an
 * all-reduce; a different scenario: buffers of other lengths summed, and
 * "healthy", exit 0) all stop with exit 2 before training. Recording options
 * (--flush-*, --trace, -o) may differ. Returns -1 to go on, or the exit
 * code. */
static int dist_same_config(run_dist *d, const probe_train_config *cfg) {
  if (!d->comm || d->world == 1)
    return -1;
  char *json = probe_config_to_json(cfg);
  uint64_t h = json ? probe_digest64(json, strlen(json), PROBE_DIGEST64_INIT) : 0;
  free(json);
  double steps = (double)probe_config_steps(cfg);
  /* maxima of each 32-bit half and of its negation: min == max everywhere */
  double v[6] = {(double)(h >> 32), (double)(h & 0xffffffffu), steps,
                 -(double)(h >> 32), -(double)(h & 0xffffffffu), -steps};
  if (probe_comm_allreduce_f64(d->comm, v, 6, 1) != PROBE_OK)
    probe_comm_abort(d->comm, CLI_EXIT_INTERNAL);
  if (v[0] == -v[3] && v[1] == -v[4])
    return -1;
  if (d->rank == 0) {
    if (v[2] != -v[5])
      cli_error(SUB, "the ranks were started with different configurations "
                     "(steps %.0f to %.0f): every rank must train the same "
                     "model on the same schedule; no rank trains", -v[5], v[2]);
    else
      cli_error(SUB, "the ranks were started with different configurations "
                     "(scenario, --config or a training option differs between "
                     "them): every rank must train the same model on the same "
                     "schedule; no rank trains");
  }
  return CLI_EXIT_USAGE;
}

static void dist_close(run_dist *d) {
  probe_comm_close(d->comm);
  d->comm = NULL;
}

/* The program to give mpirun: this executable. */
static int self_exe(char *buf, size_t len) {
  ssize_t n = readlink("/proc/self/exe", buf, len - 1);
  if (n <= 0 || (size_t)n >= len - 1)
    return -1;
  buf[n] = 0;
  return 0;
}

/* mpirun on PATH (or $AMPPROBE_MPIRUN): 0 and its path, or -1. */
static int find_mpirun(char *buf, size_t len) {
  const char *env = getenv("AMPPROBE_MPIRUN");
  if (env && *env) {
    snprintf(buf, len, "%s", env);
    return access(buf, X_OK) == 0 ? 0 : -1;
  }
  const char *path = getenv("PATH");
  if (!path)
    path = "/usr/local/bin:/usr/bin:/bin";
  for (const char *p = path; *p;) {
    const char *e = strchr(p, ':');
    size_t k = e ? (size_t)(e - p) : strlen(p);
    if (k > 0 && k + 8 < len) {
      snprintf(buf, len, "%.*s/mpirun", (int)k, p);
      if (access(buf, X_OK) == 0)
        return 0;
    }
    p += k + (e ? 1 : 0);
  }
  return -1;
}

/* 1 when arg is --ranks (or an abbreviation getopt accepted), with its
 * value attached (=N) or not. */
static int is_ranks_opt(const char *arg, int *attached) {
  const char *eq = strchr(arg, '=');
  size_t k = eq ? (size_t)(eq - arg) : strlen(arg);
  *attached = eq != NULL;
  return k >= 4 && k <= 7 && !strncmp(arg, "--ranks", k);
}

/* --ranks N: runs this same command (without --ranks) under
 * mpirun -np N; returns only on error (the exit code). mpirun replaces
 * this process, so its exit code, its signals and its stderr are the
 * user's as with a plain mpirun. */
static int run_exec_mpirun(int argc, char **argv, int64_t ranks) {
  if (probe_comm_launched()) {
    cli_error(SUB, "--ranks starts mpirun itself; under mpirun or srun give "
                   "the number of processes to them (-np N / -n N) instead");
    return CLI_EXIT_USAGE;
  }
  if (!probe_comm_mpi_available()) {
    cli_error(SUB, "--ranks needs a build with MPI (this one has none: "
                   "install libopenmpi-dev and rebuild)");
    return CLI_EXIT_USAGE;
  }
  char mpirun[1024], exe[1024];
  if (find_mpirun(mpirun, sizeof mpirun)) {
    const char *env = getenv("AMPPROBE_MPIRUN");
    if (env && *env) { /* the user's choice: say that one is wrong */
      char esc[600];
      cli_escape_name(esc, sizeof esc, env);
      cli_error(SUB, "--ranks: AMPPROBE_MPIRUN=%s is not an executable file "
                     "(%s)", esc, strerror(errno));
    } else {
      cli_error(SUB, "--ranks needs mpirun, which is not on PATH (Debian: "
                     "apt-get install openmpi-bin; or set AMPPROBE_MPIRUN)");
    }
    return CLI_EXIT_INTERNAL;
  }
  if (self_exe(exe, sizeof exe)) {
    cli_error(SUB, "cannot find this program's path (/proc/self/exe)");
    return CLI_EXIT_INTERNAL;
  }
  char np[32];
  snprintf(np, sizeof np, "%lld", (long long)ranks);
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  int over = cores > 0 && ranks > cores;
  char **nv = calloc((size_t)argc + 8, sizeof *nv);
  if (!nv) {
    cli_error(SUB, "out of memory");
    return CLI_EXIT_INTERNAL;
  }
  int k = 0;
  nv[k++] = mpirun;
  nv[k++] = "-np";
  nv[k++] = np;
  if (over)
    nv[k++] = "--oversubscribe";
  nv[k++] = exe;
  nv[k++] = argv[0]; /* "run" */
  int options = 1; /* before a "--": what follows is copied as it is */
  for (int i = 1; i < argc; i++) {
    int attached;
    if (!strcmp(argv[i], "--"))
      options = 0;
    if (options && is_ranks_opt(argv[i], &attached)) {
      i += attached ? 0 : 1;
      continue;
    }
    nv[k++] = argv[i];
  }
  nv[k] = NULL;
  /* Open MPI refuses to run as root unless told; --ranks tells it (the
   * user asked for the job), and says so */
  const char *root_env = "";
  if (geteuid() == 0 && !getenv("OMPI_ALLOW_RUN_AS_ROOT")) {
    setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
    setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
    root_env = "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 ";
  }
  /* Open MPI 4's mpirun can see a rank's exit before that rank's
   * MPI_Finalize has reached it, and then fails a finished job ("process
   * rank 0 with PID 0 ... exiting improperly", exit 1; open-mpi/ompi#7833).
   * Every rank of ours finalizes before it exits, so an exit 0 is taken
   * as finished; a non-zero exit or a signal is reported as before. Later
   * Open MPIs and other launchers ignore the variable. */
  const char *sync_env = "";
  if (!getenv("OMPI_MCA_orte_allowed_exit_without_sync")) {
    setenv("OMPI_MCA_orte_allowed_exit_without_sync", "1", 1);
    sync_env = "OMPI_MCA_orte_allowed_exit_without_sync=1 ";
  }
  fprintf(stderr, "ampprobe: run: running %s%s", root_env, sync_env);
  for (int i = 0; nv[i]; i++) { /* a command to paste: quoted, then escaped */
    size_t n = probe_shell_quote(NULL, 0, nv[i]) + 1;
    char *q = malloc(n);
    if (q) probe_shell_quote(q, n, nv[i]);
    fputs(i ? " " : "", stderr);
    cli_print_name(stderr, q ? q : "?");
    free(q);
  }
  fprintf(stderr, "\n");
  fflush(stderr);
  fflush(stdout);
  execv(mpirun, nv);
  cli_error(SUB, "cannot run %s: %s", mpirun, strerror(errno));
  free(nv);
  return CLI_EXIT_INTERNAL;
}

/* The fault-injection test aid: AMPPROBE_FAULT_KILL_RANK=r and
 * AMPPROBE_FAULT_KILL_STEP=s make rank r (0 in a plain run) raise SIGKILL
 * at the start of step s. Returns -1 to go on, or the exit code. */
static int fault_from_env(const run_dist *d, probe_train_opts *to) {
  const char *r = getenv("AMPPROBE_FAULT_KILL_RANK");
  const char *s = getenv("AMPPROBE_FAULT_KILL_STEP");
  if ((!r || !*r) && (!s || !*s))
    return -1;
  int64_t rank, step;
  if (!r || !s ||
      cli_parse_i64(SUB, "AMPPROBE_FAULT_KILL_RANK", r, 0, INT32_MAX, &rank) ||
      cli_parse_i64(SUB, "AMPPROBE_FAULT_KILL_STEP", s, 0, INT64_MAX / 2,
                    &step)) {
    if (!r || !s)
      cli_error(SUB, "AMPPROBE_FAULT_KILL_RANK and AMPPROBE_FAULT_KILL_STEP "
                     "go together");
    return CLI_EXIT_USAGE;
  }
  if (rank == d->rank) {
    to->fault_kill = 1;
    to->fault_kill_step = step;
  }
  return -1;
}

/* ---- stage 2: the config ------------------------------------------------ */

/* Loads the scenario or config file and applies the overrides; returns -1
 * to go on (*out set), or the exit code. */
static int run_load(const run_args *a, probe_train_config **out) {
  char err[512] = "";
  probe_train_config *cfg = NULL;
  probe_status st;
  *out = NULL;
  if (a->config) {
    int rc = cli_check_input(SUB, a->config);
    if (rc)
      return rc;
    st = probe_config_load_file(&cfg, a->config, err, sizeof err);
    if (st < 0) {
      /* the trainer's file errors start with the path (trainer.h) */
      if (err[0])
        cli_error(SUB, "%s", err);
      else
        cli_error(SUB, "%s: %s", a->config, probe_status_str(st));
      return st == PROBE_ERR_CONFIG ? CLI_EXIT_USAGE : CLI_EXIT_INPUT;
    }
  } else {
    const char *nm = a->scenario ? a->scenario : PROBE_DEFAULT_SCENARIO;
    st = probe_config_load_scenario(&cfg, nm, err, sizeof err);
    if (st < 0) {
      cli_scenario_error(SUB, nm, st, err);
      return st == PROBE_ERR_NOT_FOUND || st == PROBE_ERR_CONFIG
                 ? CLI_EXIT_USAGE
                 : CLI_EXIT_INTERNAL;
    }
  }
  for (int i = 0; i < a->n_ov; i++) {
    st = probe_config_set(cfg, a->ov[i].key, a->ov[i].value, err, sizeof err);
    if (st < 0) {
      cli_error(SUB, "%s", err[0] ? err : probe_status_str(st));
      probe_config_free(cfg);
      return CLI_EXIT_USAGE;
    }
  }
  *out = cfg;
  return -1;
}

/* A --fp32 entry that selects no layer of the model is most likely a typo
 * (the run trains as if it were not given, and its "fixed" run proves
 * nothing): a warning names each such entry. */
static void warn_unmatched_fp32(const run_args *a, const probe_train_config *cfg) {
  const char *list = NULL;
  for (int i = 0; i < a->n_ov; i++)
    if (!strcmp(a->ov[i].key, "fp32")) list = a->ov[i].value;
  size_t n = 0;
  if (!list || probe_config_layers(cfg, NULL, 0, &n) < 0 || n == 0) return;
  probe_layer_desc *ld = calloc(n, sizeof *ld);
  char *buf = strdup(list);
  if (ld && buf && probe_config_layers(cfg, ld, n, &n) >= 0) {
    char *save = NULL;
    for (char *e = strtok_r(buf, ",", &save); e; e = strtok_r(NULL, ",", &save)) {
      while (*e == ' ') e++;
      size_t k = strlen(e);
      while (k && e[k - 1] == ' ') e[--k] = '\0';
      int hit = 0;
      for (size_t l = 0; l < n && !hit && *e; l++)
        hit = ld[l].kind != PROBE_KIND_INPUT &&
              probe_policy_match(e, ld[l].name, ld[l].kind);
      if (hit || !*e) continue;
      char esc[300];
      cli_escape_name(esc, sizeof esc, e);
      fprintf(stderr, "ampprobe: run: warning: --fp32 %s selects no layer of "
                      "this model (give a kind such as bn or softmax, or a "
                      "glob of layer names such as 'enc.*')\n", esc);
    }
  }
  free(ld);
  free(buf);
}

/* ---- stage 3: the output ------------------------------------------------ */

/* The glob of a job's rank files, from the naming rule itself: the names
 * of ranks 0 and 1 differ in one character (the rank), which becomes '*'
 * (out/t.h5 gives out/t.rank*.h5; a {rank} in a folder name gives a '*'
 * there). "" when they differ in more places (several {rank}) or do not
 * fit. */
static void rank_set_glob(const char *base, char *out, size_t cap) {
  char r0[1100], r1[1100];
  out[0] = '\0';
  if (probe_rank_trace_path(r0, sizeof r0, base, 0) != PROBE_OK ||
      probe_rank_trace_path(r1, sizeof r1, base, 1) != PROBE_OK ||
      strlen(r0) != strlen(r1) || strlen(r0) >= cap)
    return;
  size_t diff = 0, at = 0;
  for (size_t i = 0; r0[i]; i++)
    if (r0[i] != r1[i]) {
      diff++;
      at = i;
    }
  if (diff != 1)
    return;
  memcpy(out, r0, strlen(r0) + 1);
  out[at] = '*';
}

/* Why an existing path can never hold a trace, in libprobe's words
 * (session.c, trace_claim): a directory, a device, a FIFO, a symbolic link
 * to nothing. NULL for a regular file (or a link to one), which --force
 * may replace. */
static const char *trace_target_unusable(const char *path, char *buf,
                                         size_t n) {
  struct stat st;
  if (stat(path, &st) != 0) {
    int e = errno;
    if (e == ENOENT && lstat(path, &st) == 0 && S_ISLNK(st.st_mode))
      return "a symbolic link to nothing";
    snprintf(buf, n, "%s", strerror(e));
    return buf;
  }
  if (S_ISDIR(st.st_mode))
    return strerror(EISDIR);
  if (!S_ISREG(st.st_mode)) {
    snprintf(buf, n, "not a regular file (%s)",
             S_ISFIFO(st.st_mode)   ? "a FIFO"
             : S_ISCHR(st.st_mode)  ? "a character device"
             : S_ISBLK(st.st_mode)  ? "a block device"
             : S_ISSOCK(st.st_mode) ? "a socket"
                                    : "not a plain file");
    return buf;
  }
  return NULL;
}

/* Creates the trace file exclusively, with or without --force, so both say
 * the same of a path that cannot be a trace ("cannot create trace PATH:
 * why", exit 4: --force cannot help there, so it is not offered) and of a
 * missing folder. An existing regular file is refused without --force
 * (exit 2) and left for the session to replace with it. -1 to go on. */
static int claim_trace_file(const char *path, int force, int *created) {
  char q[PATH_MAX + 16], buf[160];
  cli_escape_name(q, sizeof q, path);
  int e = guard_create_excl(path);
  if (!e) {
    *created = 1;
    return -1;
  }
  const char *why = e == EEXIST ? trace_target_unusable(path, buf, sizeof buf)
                                : strerror(e);
  if (why) {
    cli_error(SUB, "cannot create trace %s: %s", q, why);
    return CLI_EXIT_INTERNAL;
  }
  if (force)
    return -1;
  cli_error(SUB, "%s already exists: refusing to overwrite it (use --force "
                 "to replace it, or choose another -o)", q);
  return CLI_EXIT_USAGE;
}

/* Decides the trace path (default from the sanitised config name), refuses
 * an input as output whatever --force says, and creates the file
 * exclusively so an existing one is never replaced without --force.
 * Returns -1 to go on, or the exit code; *created is 1 when the file was
 * created here. */
static int run_claim_output(const run_args *a, const probe_train_config *cfg,
                            run_dist *d, char *path, size_t len,
                            int *created) {
  *created = 0;
  char base[PATH_MAX];
  if (a->out_path) {
    /* the path named or none: a prefix of it is another file (a long -o
     * was cut at 1023 bytes, and --force replaced what that name held) */
    if (strlen(a->out_path) >= sizeof base || strlen(a->out_path) >= len) {
      cli_error(SUB, "-o: the path is too long (%zu bytes; at most %zu)",
                strlen(a->out_path), (len < sizeof base ? len : sizeof base) - 1);
      return CLI_EXIT_USAGE;
    }
    snprintf(base, sizeof base, "%s", a->out_path);
  } else {
    char safe[80];
    guard_sanitize(safe, sizeof safe, probe_config_name(cfg));
    snprintf(base, sizeof base, "./ampprobe-%s.h5", safe);
  }
  /* a rank of a multi-rank job writes its own file (the naming rule) */
  if (!d->comm) {
    snprintf(path, len, "%s", base);
  } else if (probe_rank_trace_path(path, len, base, d->rank) != PROBE_OK) {
    cli_error(SUB, "trace path '%.200s' for rank %d is too long", base,
              d->rank);
    return CLI_EXIT_USAGE;
  } else {
    rank_set_glob(base, d->set_glob, sizeof d->set_glob);
  }
  char data[1024], data2[2048];
  char *cfg_json = probe_config_to_json(cfg);
  cli_config_data_files(cfg_json, a->config, data, sizeof data, data2, sizeof data2);
  free(cfg_json);
  const char *inputs[] = {a->config, data[0] ? data : NULL,
                          data2[0] ? data2 : NULL};
  /* the data file must be a regular file too: a FIFO would hang the
   * trainer's reader (checked wherever the path may resolve) */
  int rc = 0;
  for (int i = 1; i < 3 && !rc; i++)
    if (inputs[i])
      rc = cli_check_input_key(SUB, "data.path", inputs[i]);
  if (!rc)
    rc = cli_check_output(SUB, path, inputs, 3);
  if (rc)
    return rc;
  return claim_trace_file(path, a->force, created);
}

/* ---- stage 4: training -------------------------------------------------- */

typedef struct progress_ctx {
  cli_progress bar;
  double every, t0, last; /* --progress-every: plain lines for job logs */
  int64_t total;
} progress_ctx;

static void fmt_secs(char *b, size_t n, double s) {
  if (s < 60)
    snprintf(b, n, "%.0fs", s);
  else if (s < 3600)
    snprintf(b, n, "%dm%02ds", (int)(s / 60), (int)s % 60);
  else
    snprintf(b, n, "%dh%02dm", (int)(s / 3600), ((int)s % 3600) / 60);
}

static int on_progress(int64_t step, double loss, double scale, void *user) {
  progress_ctx *p = user;
  char extra[96];
  snprintf(extra, sizeof extra, "loss %.4g  scale %g", loss, scale);
  cli_progress_update(&p->bar, step + 1, extra);
  if (p->every > 0) {
    double now = cli_now();
    if (now - p->last >= p->every || step + 1 == p->total) {
      p->last = now;
      double el = now - p->t0, rate = el > 0 ? (double)(step + 1) / el : 0;
      double eta = rate > 0 ? (double)(p->total - step - 1) / rate : NAN;
      char etab[32] = "?";
      if (isfinite(eta))
        fmt_secs(etab, sizeof etab, eta);
      fprintf(stderr, "ampprobe: run: step %lld of %lld (%.0f%%), %.1f "
                      "steps/s, elapsed %.0fs, ETA %s, loss %.4g, scale %g\n",
              (long long)(step + 1), (long long)p->total,
              100.0 * (double)(step + 1) / (double)(p->total ? p->total : 1),
              rate, el, etab, loss, scale);
      fflush(stderr);
    }
  }
  return 0;
}

/* Trains; returns the trainer's status, res filled. */
static probe_status run_train(const run_args *a, const probe_train_config *cfg,
                              const run_dist *d, const probe_train_opts *base,
                              const char *path, char *cmdline,
                              probe_train_result *res, char *err,
                              size_t errlen) {
  progress_ctx pc;
  memset(&pc, 0, sizeof pc);
  pc.total = probe_config_steps(cfg);
  /* one progress line for the job: rank 0's */
  int quiet = a->quiet || d->rank != 0;
  pc.every = quiet ? 0 : a->progress_every;
  pc.t0 = pc.last = cli_now();
  cli_progress_init(&pc.bar, pc.total, quiet || a->progress_every > 0);
  probe_train_opts to = *base; /* the fault hook, from fault_from_env */
  to.comm = d->comm;
  to.flush_steps = a->flush_steps;
  to.flush_seconds = a->flush_seconds;
  to.max_memory = a->max_memory;
  if (a->digest) to.weight_digest = 1; /* else the default: data-parallel */
  to.run_id = d->comm ? d->run_id : NULL;
  to.trace_path = path;
  to.mode = a->full ? PROBE_MODE_FULL : PROBE_MODE_SCALARS;
  to.ring_steps = (int)a->ring;
  to.command_line = cmdline;
  to.progress = on_progress;
  to.user = &pc;
  to.stop_flag = &cli_stop_flag;
  to.stop_signal = &cli_stop_signal;
  to.stop_on_nonfinite = a->stop_k;
  cli_signals_install();
  memset(res, 0, sizeof *res);
  probe_status st = probe_train(cfg, &to, res, err, errlen);
  cli_progress_done(&pc.bar);
  return st;
}

/* The trainer's memory refusal ends "... or raise max_memory", its
 * library field: the command's name for it follows. */
static const char *memory_hint(probe_status st, const char *err) {
  static const char field[] = "max_memory";
  size_t n = strlen(err), k = sizeof field - 1;
  return st == PROBE_ERR_NOMEM && n >= k && strcmp(err + n - k, field) == 0
             ? " (--max-memory SIZE)"
             : "";
}

/* ---- stage 5: the summary ----------------------------------------------- */

/* The run's verdict: diverged from the trainer (a non-finite loss), else
 * the post-mortem's on the trace just written, which also finds what keeps
 * the loss finite: a forward intermediate that held inf/NaN after warm-up,
 * a normalisation whose output collapsed (degraded, exit 1). */
static probe_verdict run_verdict(const probe_train_result *res,
                                 const char *path, int interrupted,
                                 const run_args *a, const run_dist *d) {
  int rank = d->rank;
  if (res->diverged)
    return PROBE_VERDICT_DIVERGED;
  probe_verdict v = PROBE_VERDICT_HEALTHY;
  if (interrupted) return v;
  /* The trace is complete and closed: a signal now only stops a read, so
   * it ends the command at once, saying so (it was ignored, and the run
   * said "healthy", exit 0, seconds later). A long trace's check is said
   * on a terminal (or in --progress-every's plain lines). */
  char esc[480], note[600];
  int set = d->comm && d->set_glob[0]; /* the job's traces: all ranks' */
  /* the command only whole: a path too long for the one-line note (it
   * was cut there, an unclosed quote) leaves the command out */
  if (cli_paste_word(esc, sizeof esc, set ? d->set_glob : path) == 0)
    snprintf(note, sizeof note, "while checking the trace%s; %s complete: "
             "ampprobe postmortem %s", set ? "s" : "",
             set ? "they are" : "it is", esc);
  else
    snprintf(note, sizeof note, "while checking the trace%s; %s complete",
             set ? "s" : "", set ? "they are" : "it is");
  if (rank == 0) /* rank 0 speaks for the job: one line, not one a rank */
    cli_signals_exit_install_note(SUB, note);
  else
    cli_signals_exit_install_quiet();
  int tty = !a->quiet && rank == 0 && isatty(STDERR_FILENO) &&
            a->progress_every <= 0;
  if (tty) {
    fprintf(stderr, "\r\033[Kchecking the trace (post-mortem) ...");
    fflush(stderr);
  } else if (!a->quiet && rank == 0 && a->progress_every > 0) {
    fprintf(stderr, "ampprobe: run: checking the trace (post-mortem)\n");
  }
  probe_status pst = probe_postmortem_verdict(path, &v);
  if (pst != PROBE_OK) {
    /* the check could not read the trace the run just wrote (removed,
     * damaged): no verdict of it, and never "healthy" (it was, exit 0) */
    if (rank == 0) {
      char pe[480];
      if (cli_paste_word(pe, sizeof pe, path) != 0) snprintf(pe, sizeof pe, "(the trace)");
      cli_error(SUB, "the closing check could not read the trace %s: %s",
                pe, probe_status_str(pst));
    }
    v = PROBE_VERDICT_DEGRADED;
    run_check_failed = 1;
  }
  if (tty) {
    fprintf(stderr, "\r\033[K");
    fflush(stderr);
  }
  cli_signals_install(); /* back to the run's flag (the summary is quick) */
  return v;
}

static int run_print(const run_args *a, const probe_train_config *cfg,
                     const run_dist *d, const probe_train_result *res,
                     const char *path) {
  const char *name = probe_config_name(cfg);
  char policy[256] = "";
  probe_config_policy_str(cfg, policy, sizeof policy);
  int64_t steps = probe_config_steps(cfg);
  /* the stop flag stopped the run: this rank's signal or another rank's
   * (agreed at a step boundary); a signal after the last step ended
   * nothing */
  int interrupted = res->stopped_by_flag != 0;
  double t_check = cli_now();
  probe_verdict v = run_verdict(res, path, interrupted, a, d);
  t_check = cli_now() - t_check;
  int rc = interrupted ? CLI_EXIT_INTERRUPTED
                       : (v != PROBE_VERDICT_HEALTHY ? CLI_EXIT_PROBLEM
                                                     : CLI_EXIT_OK);
  if (d->rank != 0) /* rank 0 speaks for the job; the others only exit */
    return rc;
  if (a->json) {
    json_t *j = summary_json(res, name, policy, steps, path, a->full,
                             interrupted, v, t_check);
    if (d->comm) {
      json_object_set_new(j, "world_size", json_integer(d->world));
      json_object_set_new(j, "run_id", cli_json_text(d->run_id));
      json_object_set_new(j, "comm", json_string(probe_comm_name(d->comm)));
      if (d->set_glob[0])
        json_object_set_new(j, "trace_set", cli_json_text(d->set_glob));
    }
    if (cli_json_print(SUB, j) != 0) rc = CLI_EXIT_INTERNAL;
    json_decref(j);
  } else {
    print_summary(res, name, policy, steps, path, a->full, interrupted, v,
                  t_check);
    if (d->comm)
      printf("  ranks           %d (%s; run id %s); this is rank 0's trace,\n"
             "                  the loss the global mean over the ranks\n",
             d->world, probe_comm_name(d->comm), d->run_id);
    if (d->comm && d->set_glob[0]) {
      char e[9300];
      if (cli_paste_word(e, sizeof e, d->set_glob) == 0) /* a glob: quoted */
        printf("  all ranks       ampprobe postmortem %s\n", e);
    }
    if (cli_stdout_check(SUB) != 0) rc = CLI_EXIT_INTERNAL;
  }
  return rc;
}

/* Trains the claimed trace path and prints the summary; the exit code. */
static int run_and_report(const run_args *a, const probe_train_config *cfg,
                          run_dist *d, const probe_train_opts *base,
                          const char *path, int created, int argc,
                          char **argv) {
  char *cmdline = join_args(argc, argv);
  char err[512] = "";
  probe_train_result res;
  probe_status st =
      run_train(a, cfg, d, base, path, cmdline, &res, err, sizeof err);
  free(cmdline);
  if (st < 0 && st != PROBE_ERR_INTERRUPTED) {
    if (d->comm)
      cli_error(SUB, "rank %d: %s%s", d->rank,
                err[0] ? err : probe_status_str(st), memory_hint(st, err));
    else
      cli_error(SUB, "%s%s", err[0] ? err : probe_status_str(st),
                memory_hint(st, err));
    /* the empty file claimed above is no trace: do not leave it behind */
    struct stat sb;
    if (created && stat(path, &sb) == 0 && sb.st_size == 0)
      unlink(path);
    /* a data file missing, not HDF5 or malformed (trainer/data.c) is bad
     * input; a failed read or write, a lack of memory is the run's */
    int rc = st == PROBE_ERR_CONFIG        ? CLI_EXIT_USAGE
             : st == PROBE_ERR_NOT_FOUND || st == PROBE_ERR_NOT_HDF5 ||
                     st == PROBE_ERR_CORRUPT
                 ? CLI_EXIT_INPUT
                 : CLI_EXIT_INTERNAL;
    /* the other ranks wait in the all-reduce: end the job */
    if (d->comm && d->world > 1)
      probe_comm_abort(d->comm, rc);
    return rc;
  }
  return run_print(a, cfg, d, &res, path);
}

int cmd_run(int argc, char **argv) {
  run_args a;
  int rc = run_parse(argc, argv, &a);
  if (rc >= 0)
    return rc;
  if (a.list)
    return list_scenarios(a.json);
  if (a.ranks > 0) {
    /* the config first, in this one process: an unknown scenario or a bad
     * config is one line and exit 2 before mpirun starts (it was each
     * rank's line, then mpirun's "job aborted" banners) */
    probe_train_config *cfg = NULL;
    if (!probe_comm_launched() && (rc = run_load(&a, &cfg)) >= 0)
      return rc;
    probe_config_free(cfg);
    return run_exec_mpirun(argc, argv, a.ranks);
  }
  run_dist d;
  if ((rc = dist_open(&d)) >= 0)
    return rc;
  probe_train_config *cfg = NULL;
  probe_train_opts base;
  probe_train_opts_init(&base);
  rc = run_load(&a, &cfg);
  if (rc < 0 && d.rank == 0 && !a.quiet)
    warn_unmatched_fp32(&a, cfg);
  if (rc < 0)
    rc = fault_from_env(&d, &base);
  char path[PATH_MAX];
  int created = 0;
  if (rc < 0)
    rc = run_claim_output(&a, cfg, &d, path, sizeof path, &created);
  int all = dist_agree(&d, rc); /* every rank set up, or none trains */
  if (all < 0 && (all = dist_same_config(&d, cfg)) >= 0)
    rc = all; /* said once, by rank 0 */
  if (all >= 0) {
    if (rc < 0 && d.rank == 0)
      cli_error(SUB, "another rank failed to set up (its error is above); "
                     "no rank trains");
    if (created)
      unlink(path);
    probe_config_free(cfg);
    dist_close(&d);
    return rc >= 0 ? rc : all;
  }
  if (d.rank == 0 && probe_config_nan_rank(cfg) >= d.world)
    fprintf(stderr, "ampprobe: run: note: data.nan_rank %lld is not a rank "
                    "of this %d-process run: no NaN is injected\n",
            (long long)probe_config_nan_rank(cfg), d.world);
  rc = run_and_report(&a, cfg, &d, &base, path, created, argc, argv);
  probe_config_free(cfg);
  dist_close(&d);
  return rc;
}
