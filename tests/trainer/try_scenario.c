/*
 * tests/trainer/try_scenario.c - a developer's driver for the trainer (not a
 * test): runs a scenario or config file with key=value overrides and prints
 * the result, optionally the loss every N steps.
 *
 *   try_scenario NAME|FILE.json [key=value ...] [--trace out.h5] [--every N]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ampprobe/trainer.h"

static int every = 0;

static int progress(int64_t step, double loss, double scale, void *user) {
  (void)user;
  if (every > 0 && step % every == 0)
    printf("  step %5lld loss %.6g scale %g\n", (long long)step, loss, scale);
  return 0;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s NAME|FILE.json [key=value ...] [--trace F] "
                    "[--every N]\n", argv[0]);
    for (size_t i = 0; i < probe_scenario_count(); i++)
      fprintf(stderr, "  %s: %s\n", probe_scenario_name(i),
              probe_scenario_description(probe_scenario_name(i)));
    return 2;
  }
  char err[512];
  probe_train_config *c = NULL;
  probe_status st = strstr(argv[1], ".json")
                        ? probe_config_load_file(&c, argv[1], err, sizeof err)
                        : probe_config_load_scenario(&c, argv[1], err, sizeof err);
  if (st) {
    fprintf(stderr, "%s\n", err);
    return 3;
  }
  probe_train_opts o;
  probe_train_opts_init(&o);
  o.progress = progress;
  for (int i = 2; i < argc; i++) {
    if (!strcmp(argv[i], "--trace") && i + 1 < argc) {
      o.trace_path = argv[++i];
      o.mode = PROBE_MODE_FULL;
      continue;
    }
    if (!strcmp(argv[i], "--every") && i + 1 < argc) {
      every = atoi(argv[++i]);
      continue;
    }
    char kv[256];
    snprintf(kv, sizeof kv, "%s", argv[i]);
    char *eq = strchr(kv, '=');
    if (!eq) {
      fprintf(stderr, "expected key=value: %s\n", argv[i]);
      return 2;
    }
    *eq = 0;
    if (probe_config_set(c, kv, eq + 1, err, sizeof err)) {
      fprintf(stderr, "%s\n", err);
      return 2;
    }
  }
  probe_train_result r;
  st = probe_train(c, &o, &r, err, sizeof err);
  if (st) {
    fprintf(stderr, "error: %s\n", err);
    return 3;
  }
  char pol[256];
  probe_config_policy_str(c, pol, sizeof pol);
  printf("%s [%s]: steps %lld first %.6g final %.6g last %.6g | scale %g..%g "
         "final %g backoffs %lld skipped %lld longest_skip %lld clip_ratio %.3g"
         " | nf_loss_step %lld nf %lld %s %s | diverged %d | %.3f s\n",
         probe_config_name(c), pol, (long long)r.steps_run, r.first_loss,
         r.final_loss, r.last_loss, r.min_scale, r.max_scale, r.final_scale,
         (long long)r.backoffs, (long long)r.skipped_steps,
         (long long)r.longest_skip_run, r.max_clip_ratio,
         (long long)r.first_nonfinite_loss_step, (long long)r.first_nonfinite_step,
         r.first_nonfinite_layer, probe_site_name(r.first_nonfinite_site),
         r.diverged, r.wall_seconds);
  probe_config_free(c);
  return r.diverged;
}
