/*
 * tools/run.c - `ampprobe run`: loads a scenario or config, applies the
 * command-line overrides (probe_config_set), trains with libprobe recording
 * (full trace with --trace, else the flight recorder), and prints a summary
 * read at a glance. SIGINT/SIGTERM set the trainer's stop flag: the step
 * ends, the trace is closed, the summary printed, exit 130.
 * Exit 0 healthy, 1 diverged.
 */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ampprobe/analysis.h" /* probe_num_format */
#include "ampprobe/trainer.h"
#include "cli.h"

static const char *SUB = "run";

static void usage(FILE *f) {
  fprintf(f,
"usage: ampprobe run [--scenario NAME | --config FILE] [--trace] [-o PATH]\n"
"                    [--precision fp16|bf16|fp32] [--fp32 LIST] [--steps N]\n"
"                    [--seed S] [scaler and clipping options] [--json] [-q]\n"
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
"  -o, --output PATH        trace file (default ./ampprobe-<scenario>.h5)\n"
"\n"
"precision:\n"
"  --precision P            fp16 | bf16 | fp32 (global policy)\n"
"  --fp32 LIST              keep these module kinds or layer-name globs in\n"
"                           FP32, e.g. --fp32 bn,softmax or --fp32 'enc.*'\n"
"\n"
"training:\n"
"  --steps N                optimizer steps\n"
"  --seed S                 random seed\n"
"  --lr X                   learning rate\n"
"  --micro-batches N        gradient accumulation over N micro-batches\n"
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
"clipping:\n"
"  --clip-norm X            clip by global L2 norm X (0 = off)\n"
"  --clip-before-unscale    clip the still-scaled gradients (the classic bug)\n"
"\n"
"output:\n"
"  --json                   print the summary as JSON on stdout\n"
"  -q, --quiet              no progress line on stderr\n"
"  -h, --help               this help\n"
"\n"
"exit: 0 healthy, 1 diverged, 2 usage or bad config, 3 unreadable config,\n"
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
  O_LIST, O_JSON, O_RING
};

/* One override, validated here and applied with probe_config_set. */
typedef struct override {
  const char *key;
  const char *value;
} override;

typedef struct progress_ctx {
  cli_progress bar;
} progress_ctx;

static int on_progress(int64_t step, double loss, double scale, void *user) {
  progress_ctx *p = user;
  char extra[96];
  snprintf(extra, sizeof extra, "loss %.4g  scale %g", loss, scale);
  cli_progress_update(&p->bar, step + 1, extra);
  return 0;
}

static int list_scenarios(int json) {
  size_t n = probe_scenario_count();
  if (json) {
    json_t *a = json_array();
    for (size_t i = 0; i < n; i++) {
      const char *nm = probe_scenario_name(i);
      json_t *o = json_object();
      json_object_set_new(o, "name", json_string(nm));
      json_object_set_new(o, "description",
                          json_string(probe_scenario_description(nm)));
      json_object_set_new(o, "default",
                          json_boolean(!strcmp(nm, PROBE_DEFAULT_SCENARIO)));
      json_array_append_new(a, o);
    }
    int rc = cli_json_print(a);
    json_decref(a);
    return rc ? CLI_EXIT_INTERNAL : CLI_EXIT_OK;
  }
  for (size_t i = 0; i < n; i++) {
    const char *nm = probe_scenario_name(i);
    printf("%-22s %s%s\n", nm, probe_scenario_description(nm),
           strcmp(nm, PROBE_DEFAULT_SCENARIO) ? "" : " (default)");
  }
  return CLI_EXIT_OK;
}

static char *join_args(int argc, char **argv) {
  size_t len = strlen("ampprobe") + 1;
  for (int i = 0; i < argc; i++) len += strlen(argv[i]) + 1;
  char *s = malloc(len);
  if (!s) return NULL;
  strcpy(s, "ampprobe");
  for (int i = 0; i < argc; i++) {
    strcat(s, " ");
    strcat(s, argv[i]);
  }
  return s;
}

static void fmt_num(char *b, size_t n, double x) { probe_num_format(b, n, x, 6); }

static void print_summary(const probe_train_result *r, const char *name,
                          const char *policy, int64_t steps_planned,
                          const char *path, int full, int interrupted) {
  char a[32], b[32], c[32];
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
           (long long)r->first_nonfinite_step, r->first_nonfinite_layer,
           probe_site_name(r->first_nonfinite_site));
  else
    printf("  first non-finite none\n");
  if (r->first_nonfinite_loss_step >= 0)
    printf("  non-finite loss from step %lld\n",
           (long long)r->first_nonfinite_loss_step);
  printf("  verdict         %s\n",
         interrupted ? "INTERRUPTED" : (r->diverged ? "DIVERGED" : "healthy"));
  printf("  trace           %s (%s)\n", path,
         full ? "full per-layer trace" : "flight recorder");
  printf("  time            %.2f s\n", r->wall_seconds);
  if (r->diverged)
    printf("  next            ampprobe postmortem %s\n", path);
  else if (r->first_nonfinite_step >= 0 &&
           probe_site_phase(r->first_nonfinite_site) != PROBE_PHASE_BACKWARD)
    /* Backward inf/NaN with a finite loss is a scaled gradient overflowing,
     * which the scaler handles (skip + backoff); a forward one is not. */
    printf("  note            the loss stayed finite, but a layer produced inf/NaN"
           " (%s at step %lld):\n"
           "                  ampprobe postmortem %s\n",
           r->first_nonfinite_layer, (long long)r->first_nonfinite_step, path);
}

static json_t *summary_json(const probe_train_result *r, const char *name,
                            const char *policy, int64_t steps_planned,
                            const char *path, int full, int interrupted) {
  json_t *o = json_object();
  json_object_set_new(o, "scenario", json_string(name));
  json_object_set_new(o, "precision_policy", json_string(policy));
  json_object_set_new(o, "trace", json_string(path));
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
    json_object_set_new(fe, "layer", json_string(r->first_nonfinite_layer));
    json_object_set_new(fe, "site",
                        json_string(probe_site_name(r->first_nonfinite_site)));
  }
  json_object_set_new(o, "first_nonfinite", fe);
  json_object_set_new(o, "first_nonfinite_loss_step",
                      r->first_nonfinite_loss_step >= 0
                          ? json_integer(r->first_nonfinite_loss_step)
                          : json_null());
  json_object_set_new(o, "diverged", json_boolean(r->diverged));
  json_object_set_new(o, "interrupted", json_boolean(interrupted));
  json_object_set_new(o, "wall_seconds", cli_json_num(r->wall_seconds));
  return o;
}

int cmd_run(int argc, char **argv) {
  static const struct option longs[] = {
      {"scenario", required_argument, NULL, O_SCENARIO},
      {"config", required_argument, NULL, O_CONFIG},
      {"trace", no_argument, NULL, O_TRACE},
      {"output", required_argument, NULL, 'o'},
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
      {"quiet", no_argument, NULL, 'q'},
      {"help", no_argument, NULL, 'h'},
      {NULL, 0, NULL, 0},
  };
  const char *scenario = NULL, *config = NULL, *out_path = NULL;
  int full = 0, json = 0, quiet = 0, list = 0;
  int64_t ring = 0, stop_k = -1;
  override ov[32];
  int n_ov = 0;
  int64_t iv;
  double dv;
  probe_precision prec;
#define OV(k, v) (ov[n_ov].key = (k), ov[n_ov].value = (v), n_ov++)

  cli_getopt_reset();
  int c;
  while ((c = getopt_long(argc, argv, ":o:qh", longs, NULL)) != -1) {
    if (n_ov >= (int)(sizeof ov / sizeof ov[0]) - 1) {
      cli_error(SUB, "too many options");
      return CLI_EXIT_USAGE;
    }
    switch (c) {
    case O_SCENARIO: scenario = optarg; break;
    case O_CONFIG: config = optarg; break;
    case O_TRACE: full = 1; break;
    case 'o': out_path = optarg; break;
    case O_RING:
      if (cli_parse_i64(SUB, "--ring-steps", optarg, 1, 1000000, &ring))
        return CLI_EXIT_USAGE;
      break;
    case O_PRECISION:
      if (probe_precision_parse(optarg, &prec) < 0) {
        cli_error(SUB, "invalid value '%s' for --precision: expected fp16, "
                       "bf16 or fp32", optarg);
        return CLI_EXIT_USAGE;
      }
      OV("precision", optarg);
      break;
    case O_FP32: OV("fp32", optarg); break;
    case O_STEPS:
      if (cli_parse_i64(SUB, "--steps", optarg, 1, 100000000, &iv))
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
      stop_k = 0;
      if (optarg &&
          cli_parse_i64(SUB, "--stop-on-nonfinite", optarg, 0, INT64_MAX / 2,
                        &stop_k))
        return CLI_EXIT_USAGE;
      break;
    case O_LIST: list = 1; break;
    case O_JSON: json = 1; break;
    case 'q': quiet = 1; break;
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
  if (list) return list_scenarios(json);
  if (scenario && config) {
    cli_error(SUB, "--scenario and --config exclude each other");
    return CLI_EXIT_USAGE;
  }

  char err[512] = "";
  probe_train_config *cfg = NULL;
  probe_status st;
  if (config) {
    st = probe_config_load_file(&cfg, config, err, sizeof err);
    if (st < 0) {
      /* the trainer's file errors start with the path (trainer.h) */
      if (err[0])
        cli_error(SUB, "%s", err);
      else
        cli_error(SUB, "%s: %s", config, err[0] ? err : probe_status_str(st));
      return st == PROBE_ERR_CONFIG ? CLI_EXIT_USAGE : CLI_EXIT_INPUT;
    }
  } else {
    const char *nm = scenario ? scenario : PROBE_DEFAULT_SCENARIO;
    st = probe_config_load_scenario(&cfg, nm, err, sizeof err);
    if (st < 0) {
      if (st == PROBE_ERR_NOT_FOUND)
        cli_error(SUB, "unknown scenario '%s' (see 'ampprobe run "
                       "--list-scenarios')", nm);
      else
        cli_error(SUB, "scenario %s: %s", nm,
                  err[0] ? err : probe_status_str(st));
      return st == PROBE_ERR_NOT_FOUND || st == PROBE_ERR_CONFIG
                 ? CLI_EXIT_USAGE
                 : CLI_EXIT_INTERNAL;
    }
  }
  for (int i = 0; i < n_ov; i++) {
    st = probe_config_set(cfg, ov[i].key, ov[i].value, err, sizeof err);
    if (st < 0) {
      cli_error(SUB, "%s", err[0] ? err : probe_status_str(st));
      probe_config_free(cfg);
      return CLI_EXIT_USAGE;
    }
  }

  const char *name = probe_config_name(cfg);
  char default_path[256];
  if (!out_path) {
    snprintf(default_path, sizeof default_path, "./ampprobe-%s.h5",
             name && *name ? name : "run");
    out_path = default_path;
  }
  char policy[256] = "";
  probe_config_policy_str(cfg, policy, sizeof policy);
  int64_t steps = probe_config_steps(cfg);
  char *cmdline = join_args(argc, argv);

  progress_ctx pc;
  cli_progress_init(&pc.bar, steps, quiet);
  probe_train_opts to;
  probe_train_opts_init(&to);
  to.trace_path = out_path;
  to.mode = full ? PROBE_MODE_FULL : PROBE_MODE_SCALARS;
  to.ring_steps = (int)ring;
  to.command_line = cmdline;
  to.progress = on_progress;
  to.user = &pc;
  to.stop_flag = &cli_stop_flag;
  to.stop_on_nonfinite = stop_k;
  cli_signals_install();

  probe_train_result res;
  memset(&res, 0, sizeof res);
  st = probe_train(cfg, &to, &res, err, sizeof err);
  cli_progress_done(&pc.bar);
  free(cmdline);
  if (st < 0 && st != PROBE_ERR_INTERRUPTED) {
    cli_error(SUB, "%s", err[0] ? err : probe_status_str(st));
    probe_config_free(cfg);
    return st == PROBE_ERR_CONFIG ? CLI_EXIT_USAGE : CLI_EXIT_INTERNAL;
  }
  int interrupted = cli_stop_flag != 0;
  int rc = interrupted ? CLI_EXIT_INTERRUPTED
                       : (res.diverged ? CLI_EXIT_PROBLEM : CLI_EXIT_OK);
  if (json) {
    json_t *j = summary_json(&res, name, policy, steps, out_path, full,
                             interrupted);
    if (cli_json_print(j) != 0) {
      cli_error(SUB, "cannot write the JSON output");
      rc = CLI_EXIT_INTERNAL;
    }
    json_decref(j);
  } else {
    print_summary(&res, name, policy, steps, out_path, full, interrupted);
    if (fflush(stdout) != 0) {
      cli_error(SUB, "cannot write the output");
      rc = CLI_EXIT_INTERNAL;
    }
  }
  probe_config_free(cfg);
  return rc;
}
