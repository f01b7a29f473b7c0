/*
 * bench/probe.c - what libprobe costs beyond the statistics kernel.
 *
 * For a few tensor sizes, in one run and interleaved (best of --reps):
 *   kernel   probe_stats_compute on the same tensors, nothing else
 *   full     probe_tensor_record in PROBE_MODE_FULL through close: records
 *            buffered, written in batches, flushed every second
 *   scalars  PROBE_MODE_SCALARS (flight recorder: records kept in the ring,
 *            only step scalars written)
 * and prints per-record CPU times (user + system, best of --reps), the
 * probe's cost beyond the kernel, records appended per CPU second and bytes
 * per record on disk. Process CPU time counts every thread, the session's
 * writer thread included; "full, rec. thread" is the CPU time of the thread
 * that records (what the instrumented program's own thread pays).
 *
 *   bench_probe [--reps N] [--records N] [--dir DIR]
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ampprobe/probe.h"

enum { LAYERS = 32, SITES = 4 }; /* 128 records per step */

/* CPU time of this process (user + system): the machine the benchmark runs
 * on is shared, and wall time there measures the neighbours too. */
static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* CPU time of the calling thread only. */
static double thread_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#define CHECK(call)                                                            \
  do {                                                                         \
    probe_status st_ = (call);                                                 \
    if (st_ != PROBE_OK) {                                                     \
      fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call,            \
              probe_status_str(st_));                                          \
      exit(1);                                                                 \
    }                                                                          \
  } while (0)

/* Tensors (LAYERS*SITES, n) of normal-ish values over many binades. */
static float *make_tensors(size_t n) {
  float *x = malloc((size_t)LAYERS * SITES * n * sizeof *x);
  uint64_t h = 88172645463325252ull;
  for (size_t i = 0; i < (size_t)LAYERS * SITES * n; i++) {
    h ^= h << 13;
    h ^= h >> 7;
    h ^= h << 17;
    float m = 1.0f + (float)(h & 0xffff) / 65536.0f;
    int e = (int)((h >> 16) % 24) - 12;
    x[i] = (h >> 40 & 1 ? m : -m) * (float)(1 << (e + 12)) / 4096.0f;
  }
  return x;
}

/* Seconds for `steps` steps of the bare kernel over every tensor. */
static double run_kernel(const float *x, size_t n, int steps) {
  probe_stats st;
  double t0 = now_s();
  for (int s = 0; s < steps; s++)
    for (int k = 0; k < LAYERS * SITES; k++)
      probe_stats_compute(&st, PROBE_DTYPE_F32, x + (size_t)k * n, n);
  return now_s() - t0;
}

/* Seconds of process CPU for a whole session (open to close) of `steps`
 * steps, and in *caller those of this thread; *bytes is the file size,
 * *records the records in it. */
static double run_probe(const char *path, probe_record_mode mode,
                        const float *x, size_t n, int steps, double *bytes,
                        int64_t *records, double *caller) {
  probe_options o;
  probe_options_init(&o);
  o.overwrite = 1; /* reruns write the same path */
  o.mode = mode;
  probe_session *s;
  double t0 = now_s(), c0 = thread_s();
  CHECK(probe_session_open(&s, path, &o));
  for (int l = 0; l < LAYERS; l++) {
    char name[32];
    snprintf(name, sizeof name, "block%d.linear", l);
    CHECK(probe_layer_register(s, name, PROBE_KIND_LINEAR, PROBE_DTYPE_F16,
                               NULL));
  }
  static const probe_site sites[SITES] = {PROBE_SITE_FWD_IN, PROBE_SITE_FWD_OUT,
                                          PROBE_SITE_GRAD_OUT,
                                          PROBE_SITE_GRAD_IN};
  for (int step = 0; step < steps; step++) {
    CHECK(probe_step_begin(s, step));
    for (int l = 0; l < LAYERS; l++)
      for (int k = 0; k < SITES; k++)
        CHECK(probe_tensor_record(s, l, sites[k], PROBE_DTYPE_F32,
                                  x + (size_t)(l * SITES + k) * n, n));
    probe_step_scalars sc = {.loss = 1.0, .loss_scale = 65536.0, .lr = 1e-3};
    CHECK(probe_step_set_scalars(s, &sc));
    CHECK(probe_step_end(s));
  }
  CHECK(probe_session_close(s));
  double t = now_s() - t0;
  *caller = thread_s() - c0;
  struct stat sb;
  stat(path, &sb);
  *bytes = (double)sb.st_size;
  probe_trace *t_;
  CHECK(probe_trace_open(&t_, path));
  *records = probe_trace_get_info(t_)->n_records;
  probe_trace_close(t_);
  return t;
}

int main(int argc, char **argv) {
  int reps = 5;
  long budget = 400000; /* records per measurement, scaled down for big n */
  const char *dir = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--records") && i + 1 < argc)
      budget = atol(argv[++i]);
    else if (!strcmp(argv[i], "--dir") && i + 1 < argc) dir = argv[++i];
    else {
      fprintf(stderr, "usage: %s [--reps N] [--records N] [--dir DIR]\n",
              argv[0]);
      return 2;
    }
  }
  char path[512];
  snprintf(path, sizeof path, "%s/bench-probe-%d.h5", dir, (int)getpid());
  static const size_t sizes[] = {16, 256, 4096, 65536};
  printf("libprobe CPU time per recorded fp32 tensor (%d layers x %d sites "
         "per step, best of %d, simd %s)\n\n",
         LAYERS, SITES, reps, probe_stats_have_simd() ? "on" : "off");
  printf("| elements | kernel | probe full | full - kernel |"
         " full, rec. thread - kernel | probe scalars |"
         " scalars - kernel | full: records/CPU-s | bytes/record |\n");
  printf("|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
    size_t n = sizes[si];
    long cap = (long)(4e8 / (double)n); /* ~400M elements per measurement */
    long recs = budget < cap ? budget : cap;
    int steps = (int)(recs / (LAYERS * SITES));
    if (steps < 4) steps = 4;
    float *x = make_tensors(n);
    double bk = 1e30, bf = 1e30, bs = 1e30, bc = 1e30, bytes = 0;
    int64_t nrec = 0;
    for (int r = 0; r < reps; r++) {
      double tk = run_kernel(x, n, steps);
      double tc, tc2;
      double tf =
          run_probe(path, PROBE_MODE_FULL, x, n, steps, &bytes, &nrec, &tc);
      double b2;
      int64_t n2;
      double ts =
          run_probe(path, PROBE_MODE_SCALARS, x, n, steps, &b2, &n2, &tc2);
      if (tk < bk) bk = tk;
      if (tf < bf) bf = tf;
      if (tc < bc) bc = tc;
      if (ts < bs) bs = ts;
    }
    double per = 1e9 / ((double)steps * LAYERS * SITES); /* ns per record */
    if (nrec != (int64_t)steps * LAYERS * SITES) {
      fprintf(stderr, "trace holds %lld records, expected %lld\n",
              (long long)nrec, (long long)steps * LAYERS * SITES);
      return 1;
    }
    printf("| %zu | %.0f ns | %.0f ns | %.0f ns | %.0f ns | %.0f ns |"
           " %.0f ns | %.3g | %.1f |\n",
           n, bk * per, bf * per, (bf - bk) * per, (bc - bk) * per, bs * per,
           (bs - bk) * per, (double)nrec / bf, bytes / (double)nrec);
    fflush(stdout);
    free(x);
  }
  unlink(path);
  return 0;
}
