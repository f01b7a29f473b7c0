/*
 * bench/trainer.c - steps per second of the CPU trainer on a scenario (the
 * default one unless --scenario), with tracing off, with the flight recorder
 * (step scalars + in-memory ring) and with full per-layer tracing, side by
 * side in one run: the three modes are interleaved repetition by repetition
 * (their order rotating from one repetition to the next) so that machine
 * noise hits them alike. Reports the median of each, the overhead of
 * tracing relative to tracing off, and the same overhead paired: the median
 * (and quartiles) of the per-repetition ratios of each mode to the tracing-
 * off run next to it, which holds where the machine's speed changes between
 * repetitions (a shared vCPU whose sibling thread comes and goes: the
 * medians of the modes may then come from different regimes). By four
 * clocks: the wall time
 * of the whole run (model set-up, opening and closing the trace included),
 * the wall time of the training loop alone (the steps: what "step time"
 * means), the process's CPU time (libprobe's writer thread included) and the
 * training thread's CPU time; --md FILE writes the tables. --calls also
 * times the training thread inside libprobe's per-step calls (the direct
 * cost of tracing, in the same run as the loop it is compared with, so a
 * shared machine's changes of speed between runs do not blur it): the
 * bench is linked with --wrap for those calls (bench/trainer.cmake), and
 * each timed call costs two clock reads more, measured and printed.
 *
 *   bench_trainer [--scenario NAME | --config FILE] [--reps N] [--steps N]
 *                 [--calls] [--md FILE]
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ampprobe/numerics.h"
#include "ampprobe/trainer.h"

static double clock_s(clockid_t id) {
  struct timespec ts;
  clock_gettime(id, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- --calls: wall time inside libprobe's per-step calls ------------------
 * With AMPPROBE_BENCH_WRAP (GNU ld's --wrap, bench/trainer.cmake), the
 * trainer's calls of the functions below reach __wrap_X, which times
 * __real_X when calls_on is set. */
static int calls_on;         /* --calls, during a traced run */
static double calls_s[2];    /* seconds inside the calls in this run:
                                probe_tensor_record, the others */
static long long calls_n[2]; /* calls timed in this run, the same two */

#ifdef AMPPROBE_BENCH_WRAP
/* __wrap_NAME: times __real_NAME into calls_s[k] when calls_on */
#define WRAP(k, name, params, args)                                            \
  probe_status __real_##name params;                                           \
  probe_status __wrap_##name params;                                           \
  probe_status __wrap_##name params {                                          \
    if (!calls_on) return __real_##name args;                                  \
    double t0_ = clock_s(CLOCK_MONOTONIC);                                     \
    probe_status st_ = __real_##name args;                                     \
    calls_s[k] += clock_s(CLOCK_MONOTONIC) - t0_;                              \
    calls_n[k]++;                                                              \
    return st_;                                                                \
  }
WRAP(0, probe_tensor_record,
     (probe_session * s, int32_t layer, probe_site site, probe_dtype dtype, const void *data, size_t n),
     (s, layer, site, dtype, data, n))
WRAP(1, probe_step_begin, (probe_session * s, int64_t step), (s, step))
WRAP(1, probe_step_set_scalars, (probe_session * s, const probe_step_scalars *sc), (s, sc))
WRAP(1, probe_scaler_transition, (probe_session * s, const probe_scaler_event *ev), (s, ev))
WRAP(1, probe_step_end, (probe_session * s), (s))
#undef WRAP
#endif

/* Seconds one clock read takes. A timed call's interval holds about one
 * (the end of the first read, the start of the second), the loop two. */
static double clock_read_cost(void) {
  enum { K = 200000 };
  double t0 = clock_s(CLOCK_MONOTONIC), x = 0;
  for (int i = 0; i < K; i++) x += clock_s(CLOCK_MONOTONIC);
  double t1 = clock_s(CLOCK_MONOTONIC);
  return x > 0 ? (t1 - t0) / K : 0;
}

/* The 1-minute load average, -1 if unknown: wall times on a shared machine
 * mean little when it exceeds the number of cores. */
static double loadavg(void) {
  double l = -1.0;
  FILE *f = fopen("/proc/loadavg", "r");
  if (f) {
    if (fscanf(f, "%lf", &l) != 1) l = -1.0;
    fclose(f);
  }
  return l;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* The q-quantile (0..1) of v[0..n), sorted by median() first. */
static double quantile(const double *v, int n, double q) {
  double x = q * (n - 1);
  int i = (int)x;
  return i + 1 < n ? v[i] + (x - i) * (v[i + 1] - v[i]) : v[n - 1];
}

enum { MODE_OFF, MODE_RING, MODE_FULL, N_MODES };
static const char *mode_name[N_MODES] = {"tracing off", "flight recorder",
                                         "full per-layer trace"};

int main(int argc, char **argv) {
  const char *scn = PROBE_DEFAULT_SCENARIO, *md = NULL, *steps = NULL;
  const char *cfg_file = NULL;
  int reps = 9, want_calls = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--scenario") && i + 1 < argc) scn = argv[++i];
    else if (!strcmp(argv[i], "--config") && i + 1 < argc) cfg_file = argv[++i];
    else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--steps") && i + 1 < argc) steps = argv[++i];
    else if (!strcmp(argv[i], "--md") && i + 1 < argc) md = argv[++i];
    else if (!strcmp(argv[i], "--calls")) want_calls = 1;
    else {
      fprintf(stderr, "usage: %s [--scenario NAME | --config FILE] [--reps N] "
                      "[--steps N] [--calls] [--md FILE]\n", argv[0]);
      return 2;
    }
  }
#ifndef AMPPROBE_BENCH_WRAP
  if (want_calls) {
    fprintf(stderr, "bench_trainer: --calls needs a build linked with --wrap (GNU ld), "
                    "which this one is not\n");
    return 2;
  }
#endif
  if (reps < 1 || reps > 1000) reps = 9;
  char err[512];
  probe_train_config *c;
  probe_status lst = cfg_file
                         ? probe_config_load_file(&c, cfg_file, err, sizeof err)
                         : probe_config_load_scenario(&c, scn, err, sizeof err);
  if (cfg_file) scn = probe_config_name(c);
  if (lst != PROBE_OK ||
      (steps && probe_config_set(c, "steps", steps, err, sizeof err) != PROBE_OK)) {
    fprintf(stderr, "bench_trainer: %s\n", err);
    return 3;
  }
  char trace[64];
  snprintf(trace, sizeof trace, "/tmp/bench_trainer_%ld.h5", (long)getpid());
  /* steps/s by wall time, by process CPU time (all threads: libprobe's
   * writer thread included) and by the CPU time of the training thread */
  double *sps[N_MODES], *cps[N_MODES], *tps[N_MODES], *lps[N_MODES];
  double *ins[N_MODES], *inrec[N_MODES]; /* --calls: seconds per step inside
                                            libprobe's calls, in
                                            probe_tensor_record */
  long long ncalls = 0;
  int64_t records = 0;
  for (int m = 0; m < N_MODES; m++) {
    sps[m] = calloc((size_t)reps, sizeof(double));
    cps[m] = calloc((size_t)reps, sizeof(double));
    tps[m] = calloc((size_t)reps, sizeof(double));
    lps[m] = calloc((size_t)reps, sizeof(double));
    ins[m] = calloc((size_t)reps, sizeof(double));
    inrec[m] = calloc((size_t)reps, sizeof(double));
  }
  const double read_cost = want_calls ? clock_read_cost() : 0;
  double load0 = loadavg();
  /* one warm-up run of each mode, not counted */
  for (int r = -1; r < reps; r++) {
    for (int k = 0; k < N_MODES; k++) {
      const int m = (k + (r < 0 ? 0 : r)) % N_MODES; /* the order rotates */
      probe_train_opts o;
      probe_train_opts_init(&o);
      if (m != MODE_OFF) {
        o.trace_path = trace;
        o.mode = m == MODE_FULL ? PROBE_MODE_FULL : PROBE_MODE_SCALARS;
      }
      probe_train_result res;
      calls_s[0] = calls_s[1] = 0;
      calls_n[0] = calls_n[1] = 0;
      calls_on = want_calls && m != MODE_OFF;
      double c0 = clock_s(CLOCK_PROCESS_CPUTIME_ID);
      double h0 = clock_s(CLOCK_THREAD_CPUTIME_ID);
      if (probe_train(c, &o, &res, err, sizeof err) != PROBE_OK) {
        fprintf(stderr, "bench_trainer: %s\n", err);
        return 1;
      }
      double c1 = clock_s(CLOCK_PROCESS_CPUTIME_ID);
      double h1 = clock_s(CLOCK_THREAD_CPUTIME_ID);
      calls_on = 0;
      /* (the calls outside the loop, the first step_begin's session work
       * aside, are a few against the steps') */
      if (r >= 0 && res.steps_run > 0) {
        const double rec_s = calls_s[0] - read_cost * (double)calls_n[0];
        const double in_s = rec_s + calls_s[1] - read_cost * (double)calls_n[1];
        ins[m][r] = (in_s > 0 ? in_s : 0) / (double)res.steps_run;
        inrec[m][r] = (rec_s > 0 ? rec_s : 0) / (double)res.steps_run;
      }
      if (r >= 0 && m == MODE_FULL) ncalls += calls_n[0] + calls_n[1];
      if (r >= 0) {
        sps[m][r] = (double)res.steps_run / res.wall_seconds;
        cps[m][r] = (double)res.steps_run / (c1 - c0);
        tps[m][r] = (double)res.steps_run / (h1 - h0);
        lps[m][r] = (double)res.steps_run / res.loop_seconds;
      }
    }
  }
  unlink(trace);
  double load1 = loadavg();
  /* paired overheads, per clock and mode, before median() sorts the runs:
   * time per step of the mode / that of tracing off in the same repetition */
  double *pair[4][N_MODES];
  double **const clocks[4] = {lps, sps, cps, tps};
  for (int t = 0; t < 4; t++)
    for (int m = 0; m < N_MODES; m++) {
      pair[t][m] = calloc((size_t)reps, sizeof(double));
      for (int r = 0; r < reps; r++) pair[t][m][r] = 100.0 * (clocks[t][MODE_OFF][r] / clocks[t][m][r] - 1.0);
    }
  /* --calls: the time inside the calls per step as a share of the
   * untraced loop's step in the same repetition */
  double *inpct[N_MODES];
  for (int m = 0; m < N_MODES; m++) {
    inpct[m] = calloc((size_t)reps, sizeof(double));
    if (m != MODE_OFF && want_calls)
      for (int r = 0; r < reps; r++) inpct[m][r] = 100.0 * ins[m][r] * lps[MODE_OFF][r];
  }
  const double calls_per_step = (double)ncalls / ((double)reps * (double)probe_config_steps(c));
  double med[N_MODES], cmed[N_MODES], tmed[N_MODES], lmed[N_MODES];
  for (int m = 0; m < N_MODES; m++) {
    med[m] = median(sps[m], reps);
    cmed[m] = median(cps[m], reps);
    tmed[m] = median(tps[m], reps);
    lmed[m] = median(lps[m], reps);
  }
  (void)records;
  char date[32];
  time_t now = time(NULL);
  strftime(date, sizeof date, "%Y-%m-%d %H:%M UTC", gmtime(&now));
  char cpu[256] = "unknown CPU";
  FILE *ci = fopen("/proc/cpuinfo", "r");
  if (ci) {
    char line[512];
    while (fgets(line, sizeof line, ci))
      if (!strncmp(line, "model name", 10) && strchr(line, ':')) {
        snprintf(cpu, sizeof cpu, "%s", strchr(line, ':') + 2);
        cpu[strcspn(cpu, "\n")] = 0;
        break;
      }
    fclose(ci);
  }
  FILE *outs[2] = {stdout, md ? fopen(md, "w") : NULL};
  if (md && !outs[1]) {
    perror(md);
    return 1;
  }
  for (int k = 0; k < 2; k++) {
    FILE *f = outs[k];
    if (!f) continue;
    if (k == 1)
      fprintf(f, "# Trainer benchmark\n\nWritten by `bench_trainer --md` "
                 "(bench/trainer.c).\n\n");
    fprintf(f, "- statistics path: %s (AMPPROBE_STATS_PATH=%s)\n",
            probe_stats_path(), getenv("AMPPROBE_STATS_PATH") ? getenv("AMPPROBE_STATS_PATH") : "unset");
    fprintf(f, "- date: %s\n- CPU: %s (%ld online), OpenBLAS single-threaded\n"
               "- load average (1 min) before / after: %.2f / %.2f\n"
               "- scenario: %s, %lld steps per run, %d interleaved "
               "repetitions per mode (median; paired: median and quartiles of "
               "the per-repetition ratios to tracing off)\n\n",
            date, cpu, sysconf(_SC_NPROCESSORS_ONLN), load0, load1, scn,
            (long long)probe_config_steps(c), reps);
    static const char *const by[4] = {
        "By wall time of the training loop (the steps; model set-up, opening "
        "and closing the trace excluded):",
        "By wall time of the whole run (set-up, steps, opening and closing "
        "the trace):",
        "By process CPU time of the whole run (every thread of the process, "
        "libprobe's writer thread included):",
        "By CPU time of the training thread, whole run (what the training "
        "loop itself pays; the writer thread's work is not in it):"};
    double *const meds[4] = {lmed, med, cmed, tmed};
    for (int t = 0; t < 4; t++) {
      double *md_ = meds[t];
      double **v = clocks[t];
      fprintf(f, "%s\n\n| mode | steps/s (median) | min | max | overhead vs off | paired overhead (quartiles) |\n"
                 "| --- | ---: | ---: | ---: | ---: | ---: |\n",
              by[t]);
      for (int m = 0; m < N_MODES; m++) {
        double lo = v[m][0], hi = v[m][reps - 1]; /* sorted by median() */
        double pm = median(pair[t][m], reps);
        fprintf(f, "| %s | %.0f | %.0f | %.0f | %+.1f%% | %+.1f%% (%+.1f .. %+.1f) |\n", mode_name[m],
                md_[m], lo, hi, m == MODE_OFF ? 0.0 : 100.0 * (md_[MODE_OFF] / md_[m] - 1.0), pm,
                quantile(pair[t][m], reps, 0.25), quantile(pair[t][m], reps, 0.75));
      }
      fprintf(f, "\n");
    }
    if (want_calls) {
      fprintf(f, "Inside libprobe's per-step calls (--calls: the training thread's wall time "
                 "in probe_step_begin, probe_tensor_record, probe_step_set_scalars, "
                 "probe_scaler_transition and probe_step_end, less the %.0f ns of one clock "
                 "read a call; %.1f calls a step), per step and as a share of the untraced "
                 "step of the same repetition:\n\n"
                 "| mode | us per step (median) | of which probe_tensor_record | "
                 "share of the untraced step (median, quartiles) |\n"
                 "| --- | ---: | ---: | ---: |\n",
              1e9 * read_cost, calls_per_step);
      for (int m = MODE_RING; m < N_MODES; m++) {
        /* (median() sorts each array; they are not used together after) */
        double us = 1e6 * median(ins[m], reps), us_rec = 1e6 * median(inrec[m], reps);
        double pm = median(inpct[m], reps);
        fprintf(f, "| %s | %.1f | %.1f | %.1f%% (%.1f .. %.1f) |\n", mode_name[m], us, us_rec, pm,
                quantile(inpct[m], reps, 0.25), quantile(inpct[m], reps, 0.75));
      }
      fprintf(f, "\nThe traced loops' wall times above include the timing: two clock "
                 "reads a call, %.1f us a step.\n\n",
              1e6 * 2.0 * read_cost * calls_per_step);
    }
    double ov[4];
    for (int t = 0; t < 4; t++) ov[t] = median(pair[t][MODE_FULL], reps);
    fprintf(f, "Overhead = time per step with tracing / time per step without "
               "- 1, paired by repetition (median). Target <= 10%% of step time for the full trace: "
               "training loop (wall) %s (%.1f%%); whole run (wall) %s (%.1f%%); "
               "process CPU %s (%.1f%%); training thread CPU %s (%.1f%%).\n",
            ov[0] <= 10.0 ? "met" : "NOT met", ov[0], ov[1] <= 10.0 ? "met" : "NOT met", ov[1],
            ov[2] <= 10.0 ? "met" : "NOT met", ov[2], ov[3] <= 10.0 ? "met" : "NOT met", ov[3]);
  }
  if (outs[1]) fclose(outs[1]);
  for (int t = 0; t < 4; t++)
    for (int m = 0; m < N_MODES; m++) free(pair[t][m]);
  for (int m = 0; m < N_MODES; m++) {
    free(sps[m]);
    free(cps[m]);
    free(tps[m]);
    free(lps[m]);
    free(ins[m]);
    free(inrec[m]);
    free(inpct[m]);
  }
  probe_config_free(c);
  return 0;
}
