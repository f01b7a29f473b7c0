/*
 * bench/postmortem.c - `ampprobe postmortem` on long generated traces: time
 * and peak RSS, for several trace lengths, to show that memory does not
 * grow with the number of steps.
 *
 * For each length N it writes, through the libprobe writer, a full trace of
 * N steps x 30 layers x 6 sites (64-element FP32 tensors, FWD_IN, FWD_OUT,
 * FWD_SAVED, GRAD_OUT, GRAD_IN, WEIGHT_GRAD) with step scalars, a backoff
 * every 500 steps and a reduction overflow in layer 15 at step N-50; then it
 * runs the real binary (`ampprobe postmortem TRACE --json`, output to
 * /dev/null) and reads its wall time and peak RSS from wait4() (the peak of
 * the process and of the isolated-reader child it waits for).
 *
 *   bench_postmortem [--steps 2500,10000,20000] [--md FILE] [--keep]
 */
#define _DEFAULT_SOURCE
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ampprobe/probe.h"

#ifndef AMPPROBE_BIN
#error "AMPPROBE_BIN must be defined"
#endif

#define LAYERS 30
#define ELEMS 64

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#define CHECK(x)                                                               \
  do {                                                                         \
    probe_status st_ = (x);                                                    \
    if (st_ < 0) {                                                             \
      fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x,               \
              probe_status_str(st_));                                          \
      exit(1);                                                                 \
    }                                                                          \
  } while (0)

static void generate(const char *path, int64_t steps) {
  probe_options o;
  probe_options_init(&o);
  o.overwrite = 1; /* reruns write the same path */
  o.mode = PROBE_MODE_FULL;
  o.command_line = "bench_postmortem";
  o.config_json = "{\"name\": \"bench\"}";
  o.precision_policy = "fp16";
  o.snapshot_on_nonfinite = 0;
  probe_session *s = NULL;
  CHECK(probe_session_open(&s, path, &o));
  int32_t id[LAYERS];
  for (int l = 0; l < LAYERS; l++) {
    char name[32];
    snprintf(name, sizeof name, "block%02d.%s", l / 3,
             l % 3 == 0 ? "fc" : (l % 3 == 1 ? "ln" : "act"));
    probe_kind k = l % 3 == 0   ? PROBE_KIND_LINEAR
                   : l % 3 == 1 ? PROBE_KIND_LAYERNORM
                                : PROBE_KIND_ACTIVATION;
    CHECK(probe_layer_register(s, name, k, PROBE_DTYPE_F16, &id[l]));
  }
  static float buf[6][LAYERS][ELEMS];
  double scale = 65536;
  int64_t bad = steps - 50;
  for (int64_t t = 0; t < steps; t++) {
    CHECK(probe_step_begin(s, t));
    int nonfinite = t >= bad;
    for (int l = 0; l < LAYERS; l++) {
      float mag = 1.0f + (float)((t * 7 + l) % 13);
      for (int site = 0; site < 6; site++)
        for (int i = 0; i < ELEMS; i++)
          buf[site][l][i] = mag * (float)(i + 1) / ELEMS *
                            (site >= 3 ? 1e-3f : 1.0f) * ((i & 1) ? -1 : 1);
      if (l == 15 && nonfinite) buf[2][l][0] = INFINITY; /* saved */
      if (l > 15 && nonfinite) buf[0][l][1] = buf[1][l][1] = NAN;
    }
    static const probe_site fwd[3] = {PROBE_SITE_FWD_IN, PROBE_SITE_FWD_SAVED,
                                      PROBE_SITE_FWD_OUT};
    static const int fwd_buf[3] = {0, 2, 1};
    for (int l = 0; l < LAYERS; l++)
      for (int k = 0; k < 3; k++)
        CHECK(probe_tensor_record(s, id[l], fwd[k], PROBE_DTYPE_F32,
                                  buf[fwd_buf[k]][l], ELEMS));
    static const probe_site bwd[3] = {PROBE_SITE_GRAD_OUT, PROBE_SITE_GRAD_IN,
                                      PROBE_SITE_WEIGHT_GRAD};
    for (int l = LAYERS - 1; l >= 0; l--)
      for (int k = 0; k < 3; k++)
        CHECK(probe_tensor_record(s, id[l], bwd[k], PROBE_DTYPE_F32,
                                  buf[3 + k][l], ELEMS));
    probe_step_scalars sc;
    memset(&sc, 0, sizeof sc);
    int backoff = t % 500 == 499;
    sc.loss = nonfinite ? NAN : 1.0 / (1.0 + 0.001 * (double)t);
    sc.loss_scale = scale;
    sc.found_inf = backoff || nonfinite;
    sc.skipped = sc.found_inf;
    sc.lr = 1e-3;
    sc.grad_norm = 0.5 + 0.1 * (double)(t % 7);
    sc.clip_threshold = 1.0;
    sc.clip_coef = sc.grad_norm > 1.0 ? 1.0 / sc.grad_norm : 1.0;
    CHECK(probe_step_set_scalars(s, &sc));
    if (sc.found_inf) {
      probe_scaler_event e = {.step = t, .kind = PROBE_SCALER_BACKOFF,
                              .old_scale = scale, .new_scale = scale / 2};
      CHECK(probe_scaler_transition(s, &e));
      scale /= 2;
    } else if (t % 500 == 250) {
      probe_scaler_event e = {.step = t, .kind = PROBE_SCALER_GROWTH,
                              .old_scale = scale, .new_scale = scale * 2};
      CHECK(probe_scaler_transition(s, &e));
      scale *= 2;
    }
    CHECK(probe_step_end(s));
  }
  CHECK(probe_session_close(s));
}

typedef struct measure {
  double seconds;
  long maxrss_kib;
  int rc;
} measure;

static measure run_postmortem(const char *path) {
  measure m = {0, 0, -1};
  double t0 = now();
  pid_t pid = fork();
  if (pid == 0) {
    int fd = open("/dev/null", O_WRONLY);
    dup2(fd, 1);
    execl(AMPPROBE_BIN, AMPPROBE_BIN, "postmortem", path, "--json",
          (char *)NULL);
    _exit(127);
  }
  int st = 0;
  struct rusage ru;
  wait4(pid, &st, 0, &ru);
  m.seconds = now() - t0;
  m.maxrss_kib = ru.ru_maxrss;
  m.rc = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  return m;
}

int main(int argc, char **argv) {
  const char *steps_arg = "2500,10000,20000";
  const char *md = NULL;
  int keep = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--steps") && i + 1 < argc)
      steps_arg = argv[++i];
    else if (!strcmp(argv[i], "--md") && i + 1 < argc)
      md = argv[++i];
    else if (!strcmp(argv[i], "--keep"))
      keep = 1;
    else {
      fprintf(stderr, "usage: bench_postmortem [--steps N,N,...] [--md FILE] "
                      "[--keep]\n");
      return 2;
    }
  }
  char list[256];
  snprintf(list, sizeof list, "%s", steps_arg);
  FILE *out = md ? fopen(md, "w") : NULL;
  if (md && !out) {
    perror(md);
    return 1;
  }
  char header[512];
  snprintf(header, sizeof header,
           "| steps | records | trace MiB | generate s | postmortem s | "
           "records/s | peak RSS MiB | exit |\n"
           "|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  printf("%s", header);
  if (out) {
    fprintf(out, "# postmortem benchmark\n\n"
                 "`bench_postmortem` (bench/postmortem.c): full traces of N "
                 "steps x %d layers x 6 sites (64-element tensors) written "
                 "through libprobe, then `ampprobe postmortem TRACE --json` "
                 "(the isolated reader's child included in the peak RSS).\n\n",
            LAYERS);
    fprintf(out, "%s", header);
  }
  int fail = 0;
  for (char *tok = strtok(list, ","); tok; tok = strtok(NULL, ",")) {
    int64_t n = atoll(tok);
    if (n < 100) {
      fprintf(stderr, "steps must be >= 100\n");
      return 2;
    }
    char path[256];
    snprintf(path, sizeof path, "/tmp/ampprobe-bench-pm-%d-%lld.h5",
             (int)getpid(), (long long)n);
    double t0 = now();
    generate(path, n);
    double gen = now() - t0;
    struct stat sb;
    stat(path, &sb);
    measure m = run_postmortem(path);
    int64_t recs = n * LAYERS * 6;
    char row[256];
    snprintf(row, sizeof row, "| %lld | %lld | %.1f | %.2f | %.2f | %.3g | "
                              "%.1f | %d |\n",
             (long long)n, (long long)recs, (double)sb.st_size / 1048576.0,
             gen, m.seconds, (double)recs / m.seconds,
             (double)m.maxrss_kib / 1024.0, m.rc);
    printf("%s", row);
    fflush(stdout);
    if (out) fprintf(out, "%s", row);
    if (m.rc != 1) fail = 1; /* the event must be found */
    if (!keep) unlink(path);
  }
  if (out) fclose(out);
  return fail;
}
