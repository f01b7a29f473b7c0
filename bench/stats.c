/*
 * bench/stats.c - throughput of the fused statistics kernel
 * (probe_stats_compute) against a naive multi-pass implementation (one loop
 * per statistic) and a plain read-bandwidth baseline (sum of the buffer's
 * 64-bit words), on the same buffers in the same run.
 *
 *   bench_stats [--max-mib N] [--min-kib N] [--threads T] [--markdown]
 *               [--cpu-time] [--cold] [--path portable|avx2|avx512] [--dist D]
 *   bench_stats --short [--markdown] [--cpu-time] [--path P] [--dist D]
 *
 * Sizes go from 16 KiB to 64 MiB by factors of 4, then by 2 up to 512 MiB
 * (past the 32 MiB L3). Data: N(0,1) values stored in the dtype, or with
 * --dist another distribution (stats_data.h: grad, relu, wide, underflow,
 * spread), to see how the time per element holds on data far from N(0,1),
 * such as an underflowing FP16 run's gradients. Each
 * time is the best of several runs (batches of runs for small buffers, so a
 * timed interval is >= ~2 ms). With --threads T every one of the three
 * contenders splits the buffer into T slices run on T threads (fused and
 * naive merge their T records), so ratios compare like with like. GB/s are
 * 10^9 bytes of tensor data per second. --cpu-time (one thread only) times
 * with the thread's CPU clock instead of the wall clock, for machines shared
 * with other jobs; say so wherever such numbers are quoted. --path times one
 * CPU path of the fused kernel instead of the one probe_stats_compute picks.
 *
 * --cold: before every timed run of a buffer larger than the last-level
 * cache, every contender alike, read a separate buffer of eight times that
 * cache (at least 256 MiB) first, so that the run reads its data from DRAM.
 * Without it, a buffer a few times the L3 read over and over still finds
 * part of itself there: on the project machine the read baseline got 42-50
 * GB/s at 64 MiB warm against 34-43 cold (bench/results/stats.md), which is
 * L3 bandwidth the fused kernel, bound by its arithmetic, cannot use.
 *
 * --short times what a trainer's tensors cost instead: nanoseconds per call
 * of every path this CPU has and of probe_stats_compute (which picks one by
 * length) for 32 .. 8192 elements, in cache, best of 400 short batches of
 * 250 calls, the batches of all lengths and paths taken in turn (on a
 * shared vCPU whose speed switches between regimes from one second to the
 * next, a long batch, or all of one cell's batches in a row, can fall in
 * the slow one; the best of short batches spread over the whole run is the
 * fast one); that is where kernels/stats.c's length thresholds come from.
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "ampprobe/numerics.h"
#include "stats_data.h"
#include "stats_impl.h" /* probe__stats_compute_path, for --short */

/* Wall clock, or with --cpu-time this thread's CPU time (for a machine
 * shared with other work: time spent descheduled is not counted). */
static clockid_t g_clock = CLOCK_MONOTONIC;

static double now_s(void) {
  struct timespec t;
  clock_gettime(g_clock, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* ---- naive multi-pass: one loop per statistic ------------------------------------- */

static float elem(probe_dtype dt, const void *data, size_t i) {
  if (dt == PROBE_DTYPE_F32) return ((const float *)data)[i];
  uint16_t h = ((const uint16_t *)data)[i];
  return dt == PROBE_DTYPE_F16 ? probe_f16_to_f32(h) : probe_bf16_to_f32(h);
}

static void naive_stats(probe_stats *s, probe_dtype dt, const void *d, size_t n) {
  probe_stats_init(s);
  s->count = n;
  for (size_t i = 0; i < n; i++) s->nan_count += isnan(elem(dt, d, i)) != 0;
  for (size_t i = 0; i < n; i++) s->posinf_count += elem(dt, d, i) == INFINITY;
  for (size_t i = 0; i < n; i++) s->neginf_count += elem(dt, d, i) == -INFINITY;
  for (size_t i = 0; i < n; i++) s->zero_count += elem(dt, d, i) == 0.0f;
  for (size_t i = 0; i < n; i++) {
    float a = fabsf(elem(dt, d, i));
    s->f16_subnormal += a > 0 && a < PROBE_F16_MIN_NORMAL;
  }
  for (size_t i = 0; i < n; i++) {
    float a = fabsf(elem(dt, d, i));
    s->f16_flush += a > 0 && a <= PROBE_F16_FLUSH;
  }
  for (size_t i = 0; i < n; i++) {
    float a = fabsf(elem(dt, d, i));
    s->f16_overflow += isfinite(a) && a >= PROBE_F16_OVERFLOW;
  }
  float mn = INFINITY, mx = -INFINITY, amax = -1, amin = INFINITY;
  for (size_t i = 0; i < n; i++) {
    float x = elem(dt, d, i);
    if (isfinite(x) && x < mn) mn = x;
  }
  for (size_t i = 0; i < n; i++) {
    float x = elem(dt, d, i);
    if (isfinite(x) && x > mx) mx = x;
  }
  for (size_t i = 0; i < n; i++) {
    float a = fabsf(elem(dt, d, i));
    if (isfinite(a) && a > amax) amax = a;
  }
  for (size_t i = 0; i < n; i++) {
    float a = fabsf(elem(dt, d, i));
    if (isfinite(a) && a > 0 && a < amin) amin = a;
  }
  s->min = mn;
  s->max = mx;
  s->absmax = amax;
  s->absmin_nonzero = amin;
  for (size_t i = 0; i < n; i++) {
    float x = elem(dt, d, i);
    if (isfinite(x)) s->sum += x;
  }
  for (size_t i = 0; i < n; i++) {
    double x = elem(dt, d, i);
    if (isfinite(x)) s->sumsq += x * x;
  }
  for (size_t i = 0; i < n; i++) {
    float x = elem(dt, d, i);
    if (!isfinite(x) || x == 0) continue;
    int e = ilogbf(x);
    int b = e < PROBE_HIST_MIN_EXP ? 0
            : e > PROBE_HIST_MAX_EXP ? PROBE_HIST_BINS - 1
                                     : e - PROBE_HIST_MIN_EXP + 1;
    s->hist[b]++;
  }
}

/* ---- running one contender on T threads -------------------------------------------- */

enum { FUSED, NAIVE, READ };

/* --cold: the eviction buffer (NULL without --cold), and the size past
 * which runs are cold. */
static int g_cold;
static unsigned char *g_evict;
static size_t g_evict_bytes, g_llc_bytes;

/* The L3 the kernel sees: what Linux reports for cpu0 (lscpu's figure; under
 * a VM glibc's sysconf may give the whole host's), else sysconf, else 32 MiB. */
static size_t llc_bytes(void) {
  FILE *f = fopen("/sys/devices/system/cpu/cpu0/cache/index3/size", "r");
  unsigned long kib = 0;
  if (f) {
    if (fscanf(f, "%luK", &kib) != 1) kib = 0;
    fclose(f);
  }
  if (kib) return (size_t)kib << 10;
  long l3 = 0;
#ifdef _SC_LEVEL3_CACHE_SIZE
  l3 = sysconf(_SC_LEVEL3_CACHE_SIZE); /* glibc; 0 or -1 where unknown */
#endif
  return l3 > 0 ? (size_t)l3 : (size_t)32 << 20;
}
typedef struct job {
  int what;
  probe_dtype dt;
  const unsigned char *data;
  size_t n; /* elements */
  probe_stats st;
  uint64_t sink;
} job;

static void job_run(job *j) {
  switch (j->what) {
  case FUSED:
    probe_stats_compute(&j->st, j->dt, j->data, j->n);
    break;
  case NAIVE:
    naive_stats(&j->st, j->dt, j->data, j->n);
    break;
  default:
    j->sink += bench_sum_words(j->data, j->n * probe_dtype_size(j->dt));
  }
}

static void *job_thread(void *arg) {
  job_run(arg);
  return NULL;
}

static uint64_t g_sink;

/* One run of `what` over data(n) on `threads` threads (slices merged). */
static void run_once(int what, probe_dtype dt, const unsigned char *data, size_t n, int threads) {
  job jobs[16];
  pthread_t tid[16];
  size_t es = probe_dtype_size(dt);
  size_t per = (n / (size_t)threads) & ~(size_t)63; /* keep slices 64-element aligned */
  for (int t = 0; t < threads; t++) {
    size_t start = per * (size_t)t;
    size_t cnt = t == threads - 1 ? n - start : per;
    jobs[t] = (job){.what = what, .dt = dt, .data = data + start * es, .n = cnt};
  }
  if (threads == 1) {
    job_run(&jobs[0]);
  } else {
    for (int t = 1; t < threads; t++) pthread_create(&tid[t], NULL, job_thread, &jobs[t]);
    job_run(&jobs[0]);
    for (int t = 1; t < threads; t++) pthread_join(tid[t], NULL);
  }
  probe_stats total;
  probe_stats_init(&total);
  for (int t = 0; t < threads; t++) {
    if (what != READ) probe_stats_merge(&total, &jobs[t].st);
    g_sink += jobs[t].sink;
  }
  g_sink += total.count;
}

/* Best time of one run, in seconds. */
static double best_time(int what, probe_dtype dt, const unsigned char *data, size_t n,
                        int threads, int tries) {
  size_t bytes = n * probe_dtype_size(dt);
  int batch = 1;
  if (what != NAIVE)
    while ((double)bytes * batch < 64e6 && batch < 4096 && !(g_evict && bytes > g_llc_bytes))
      batch *= 2; /* ~2+ ms at 30 GB/s */
  double best = 1e30;
  int cold = g_evict && bytes > g_llc_bytes;
  for (int r = 0; r < tries; r++) {
    if (cold) g_sink += bench_sum_words(g_evict, g_evict_bytes); /* not timed */
    double t0 = now_s();
    for (int b = 0; b < batch; b++) run_once(what, dt, data, n, threads);
    double t = (now_s() - t0) / batch;
    if (t < best) best = t;
  }
  return best;
}


/* --short: ns per call of each path for short tensors (in L1/L2), the best
 * of SHORT_BATCHES batches of SHORT_CALLS calls. */
enum { SHORT_BATCHES = 400, SHORT_CALLS = 250 };
static int bench_short(int markdown) {
  static const size_t ns[] = {32,   64,   128,  256,  512,  1024, 1536,
                             2048, 2560, 3072, 3584, 4096, 8192};
  char cpu[128];
  enum { NMAX = 8192 };
  unsigned char *buf = aligned_alloc(64, NMAX * 4);
  if (!buf) return 1;
  printf("bench_stats --short: ns per call, in cache, best of %d batches of %d calls, %s time; "
         "auto = probe_stats_compute on the %s path family\n",
         SHORT_BATCHES, SHORT_CALLS, g_clock == CLOCK_MONOTONIC ? "wall" : "CPU", probe_stats_path());
  printf("cpu: %s\n", bench_cpu_model(cpu, sizeof cpu));
  printf("auto's short-tensor paths:");
  static const char *dts[] = {"fp32", "fp16", "bf16"};
  for (int d = 0; d < 3; d++) {
    size_t mx;
    int sp = probe__stats_short_path((probe_dtype)d, &mx);
    printf(" %s %s up to %zu%s", dts[d], probe__stats_path_name(sp), mx, d < 2 ? "," : "\n");
  }
  printf("data: %s, %s\n", g_bench_dist->name, g_bench_dist->what);
  /* What a cycle took during this run, by the same clock: on a loaded
   * machine CPU time stretches too, and ns x GHz (cycles) carries over to a
   * quiet one better than ns do. */
  double ghz = 0;
#if defined(__x86_64__)
  for (int r = 0; r < 3; r++) {
    uint64_t x = 1, iters = 50000000ull;
    double t0 = now_s();
    for (uint64_t i = 0; i < iters; i++)
      __asm__ volatile("add $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\tadd $1, %0" : "+r"(x));
    double g = 4.0 * (double)iters / (now_s() - t0) / 1e9;
    if (g > ghz) ghz = g;
  }
#endif
  printf("core clock by the same clock (dependent adds): %.2f GHz; cycles per call = ns x that\n", ghz);
  for (int d = 0; d < 3; d++) {
    probe_dtype dt = (probe_dtype)d;
    bench_fill(buf, dt, NMAX);
    if (markdown) {
      printf("\n| %s elements | auto |", probe_dtype_name(dt));
      for (int p = 0; p < PROBE__PATH_COUNT; p++) printf(" %s |", probe__stats_path_name(p));
      printf("\n|---:|---:|");
      for (int p = 0; p < PROBE__PATH_COUNT; p++) printf("---:|");
      printf("\n");
    } else {
      printf("\n%-5s n %8s", probe_dtype_name(dt), "auto");
      for (int p = 0; p < PROBE__PATH_COUNT; p++) printf(" %9s", probe__stats_path_name(p));
      printf("\n");
    }
    /* every (length, path) cell once per round, so that each cell's best
     * is taken over the whole run, not over one stretch of it */
    enum { NLEN = sizeof ns / sizeof ns[0] };
    double best[NLEN][PROBE__PATH_COUNT + 1];
    int have[NLEN][PROBE__PATH_COUNT + 1]; /* a path may refuse a length */
    for (size_t k = 0; k < NLEN; k++)
      for (int p = -1; p < PROBE__PATH_COUNT; p++) {
        probe_stats st;
        have[k][p + 1] = p < 0 || probe__stats_compute_path(&st, dt, buf, ns[k], p) == PROBE_OK;
        best[k][p + 1] = 1e30;
      }
    for (int r = 0; r < SHORT_BATCHES; r++)
      for (size_t k = 0; k < NLEN; k++)
        for (int p = -1; p < PROBE__PATH_COUNT; p++) {
          if (!have[k][p + 1]) continue;
          probe_stats st;
          double t0 = now_s();
          for (int j = 0; j < SHORT_CALLS; j++) {
            if (p < 0)
              probe_stats_compute(&st, dt, buf, ns[k]);
            else
              probe__stats_compute_path(&st, dt, buf, ns[k], p);
            g_sink += st.count;
          }
          double t = (now_s() - t0) / SHORT_CALLS;
          if (t < best[k][p + 1]) best[k][p + 1] = t;
        }
    for (size_t k = 0; k < NLEN; k++) {
      printf(markdown ? "| %zu |" : "%-7zu", ns[k]);
      for (int p = -1; p < PROBE__PATH_COUNT; p++) {
        if (!have[k][p + 1])
          printf(markdown ? " - |" : " %9s", "-");
        else
          printf(markdown ? " %.0f |" : " %9.0f", best[k][p + 1] * 1e9);
      }
      printf("\n");
    }
  }
  free(buf);
  return g_sink == 42 ? 3 : 0;
}

int main(int argc, char **argv) {
  size_t max_mib = 512, min_kib = 16;
  int threads = 1, markdown = 0, short_mode = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--max-mib") && i + 1 < argc)
      max_mib = (size_t)atol(argv[++i]);
    else if (!strcmp(argv[i], "--min-kib") && i + 1 < argc)
      min_kib = (size_t)atol(argv[++i]);
    else if (!strcmp(argv[i], "--threads") && i + 1 < argc)
      threads = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--markdown"))
      markdown = 1;
    else if (!strcmp(argv[i], "--short"))
      short_mode = 1;
    else if (!strcmp(argv[i], "--cpu-time"))
      g_clock = CLOCK_THREAD_CPUTIME_ID;
    else if (!strcmp(argv[i], "--cold"))
      g_cold = 1;
    else if (!strcmp(argv[i], "--dist") && i + 1 < argc) {
      g_bench_dist = bench_find_dist(argv[++i]);
      if (!g_bench_dist) {
        fprintf(stderr, "--dist %s: unknown; one of", argv[i]);
        for (int k = 0; k < BENCH_NDISTS; k++) fprintf(stderr, " %s", bench_dists[k].name);
        fprintf(stderr, "\n");
        return 2;
      }
    }
    else if (!strcmp(argv[i], "--path") && i + 1 < argc) {
      /* the whole process, as AMPPROBE_STATS_PATH does (read at the first
       * statistics call, which is below) */
      const char *pn = argv[++i];
      setenv("AMPPROBE_STATS_PATH", pn, 1);
      if (strcmp(probe_stats_path(), pn)) {
        fprintf(stderr, "--path %s: unknown or not supported on this CPU (it has %s)\n", pn,
                probe_stats_path());
        return 2;
      }
    }
    else {
      fprintf(stderr,
              "usage: %s [--max-mib N] [--min-kib N] [--threads T] [--markdown] [--cpu-time]\n"
              "       [--cold] [--path portable|avx2|avx512] [--dist D]\n"
              "  --cold: buffers past the last-level cache are evicted before every timed run\n"
              "  --dist: normal (default), grad, relu, wide, underflow, spread (stats_data.h)\n"
              "   or: %s --short [--markdown] [--cpu-time] [--path P] [--dist D]   (ns per call, 32..8192 elements)\n",
              argv[0], argv[0]);
      return 2;
    }
  }
  if (short_mode) return bench_short(markdown);
  if (threads < 1 || threads > 16) threads = 1;
  if (threads > 1 && g_clock != CLOCK_MONOTONIC) {
    fprintf(stderr, "--cpu-time needs --threads 1\n");
    return 2;
  }
  size_t sizes[32], ns = 0;
  for (size_t kib = min_kib; kib <= max_mib * 1024; kib *= (kib >= 64 * 1024 ? 2 : 4))
    sizes[ns++] = kib * 1024;
  size_t maxb = sizes[ns - 1];
  unsigned char *buf = aligned_alloc(64, maxb);
  if (!buf) {
    fprintf(stderr, "out of memory for %zu bytes\n", maxb);
    return 1;
  }
  g_llc_bytes = llc_bytes();
  if (g_cold) {
    g_evict_bytes = 8 * g_llc_bytes < ((size_t)256 << 20) ? (size_t)256 << 20 : 8 * g_llc_bytes;
    g_evict = aligned_alloc(64, g_evict_bytes);
    if (!g_evict) {
      fprintf(stderr, "out of memory for the %zu-byte eviction buffer\n", g_evict_bytes);
      return 1;
    }
    memset(g_evict, 1, g_evict_bytes);
  }
#if defined(__x86_64__)
  __builtin_cpu_init();
#endif
  char cpu[128];
  printf("bench_stats: fused kernel (%s path) vs naive multi-pass vs read baseline, %d thread%s, "
         "%s time\n",
         probe_stats_path(), threads, threads > 1 ? "s" : "", g_clock == CLOCK_MONOTONIC ? "wall" : "CPU");
  printf("cpu: %s\n", bench_cpu_model(cpu, sizeof cpu));
  printf("data: %s, %s\n", g_bench_dist->name, g_bench_dist->what);
  if (g_evict)
    printf("cold: buffers over %zu MiB (the last-level cache) are evicted before every timed run "
           "(a %zu MiB read)\n",
           g_llc_bytes >> 20, g_evict_bytes >> 20);
  if (markdown) {
    printf("\n| dtype | size | fused GB/s | naive GB/s | read GB/s | fused/read | fused/naive |\n");
    printf("|---|---:|---:|---:|---:|---:|---:|\n");
  } else {
    printf("%-5s %10s %11s %11s %11s %10s %11s\n", "dtype", "size", "fused GB/s", "naive GB/s",
           "read GB/s", "fused/read", "fused/naive");
  }
  for (int d = 0; d < 3; d++) {
    probe_dtype dt = (probe_dtype)d;
    size_t es = probe_dtype_size(dt);
    bench_fill(buf, dt, maxb / es);
    for (size_t k = 0; k < ns; k++) {
      size_t bytes = sizes[k], n = bytes / es;
      int tries = bytes >= (64u << 20) ? 3 : 5;
      /* interleave contenders so drift hits all three alike */
      double tf = 1e30, tr = 1e30;
      for (int rep = 0; rep < 2; rep++) {
        double a = best_time(FUSED, dt, buf, n, threads, tries);
        double b = best_time(READ, dt, buf, n, threads, tries);
        if (a < tf) tf = a;
        if (b < tr) tr = b;
      }
      double tn = best_time(NAIVE, dt, buf, n, threads, bytes >= (64u << 20) ? 1 : 2);
      double gf = (double)bytes / tf / 1e9, gn = (double)bytes / tn / 1e9;
      double gr = (double)bytes / tr / 1e9;
      char sz[32];
      if (bytes >= (1u << 20))
        snprintf(sz, sizeof sz, "%zu MiB", bytes >> 20);
      else
        snprintf(sz, sizeof sz, "%zu KiB", bytes >> 10);
      if (markdown)
        printf("| %s | %s | %.2f | %.2f | %.2f | %.2f | %.1f |\n", probe_dtype_name(dt), sz, gf,
               gn, gr, gf / gr, gf / gn);
      else
        printf("%-5s %10s %11.2f %11.2f %11.2f %10.2f %11.1f\n", probe_dtype_name(dt), sz, gf,
               gn, gr, gf / gr, gf / gn);
      fflush(stdout);
    }
  }
  free(buf);
  free(g_evict);
  return g_sink == 42 ? 3 : 0; /* keeps the sums alive */
}
