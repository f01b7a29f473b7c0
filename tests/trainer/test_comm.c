/*
 * tests/trainer/test_comm.c - the trainer's communicator (trainer/comm.c)
 * without mpirun: the single-process table, the FP16 sum emulation of the
 * all-reduce (finite halves overflowing, pre-division avoiding it, each
 * partial sum rounded) against two independent references - an exhaustive
 * nearest-half search in double and the CPU's F16C conversion
 * (_cvtss_sh; skipped where the CPU lacks it) - and data-parallel runs of
 * world 1 (the all-reduce stage, its sites and the weight digest).
 * The multi-process runs are tests/trainer/mpi_smoke.sh (label mpi).
 */
#define _POSIX_C_SOURCE 200809L
#include <check.h>
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ampprobe/numerics.h"
#include "ampprobe/probe.h"
#include "ampprobe/trainer.h"
#include "trainer-impl.h"

/* ---- the independent reference: nearest binary16 by search --------------- */

/* Every finite non-negative binary16 value, ascending (bits 0..0x7bff). */
static double halves[0x7c00];

/* The half value of bits h (exact, by the definition of the format). */
static double half_value(uint16_t h) {
  int e = (h >> 10) & 0x1f, m = h & 0x3ff;
  double v = e ? ldexp(1024 + m, e - 25) : ldexp(m, -24);
  return (h & 0x8000) ? -v : v;
}

static void init_halves(void) {
  for (int i = 0; i < 0x7c00; i++) halves[i] = half_value((uint16_t)i);
}

/* Round-to-nearest-even of an exact double to binary16, by search: the
 * largest finite half is 65504, and anything at or above 65520 (the
 * midpoint to 2^16) is inf. */
static double ref_round_half(double x) {
  if (isnan(x)) return x;
  double a = fabs(x);
  if (a >= 65520.0) return copysign(INFINITY, x);
  int lo = 0, hi = 0x7bff;
  while (lo < hi) { /* first half >= a */
    int mid = (lo + hi) / 2;
    if (halves[mid] < a) lo = mid + 1; else hi = mid;
  }
  int k = lo;
  double r = halves[k];
  if (k > 0) {
    double below = halves[k - 1];
    if (a - below < r - a || (a - below == r - a && ((k - 1) & 1) == 0))
      r = below;
  }
  return copysign(r, x);
}

static uint32_t rng_state = 12345u;
static uint32_t xr(void) {
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 17;
  rng_state ^= rng_state << 5;
  return rng_state;
}

/* A random finite half (as a float), spread over all exponents. */
static float rand_half(void) {
  uint16_t h;
  do h = (uint16_t)xr(); while ((h & 0x7c00) == 0x7c00);
  return (float)half_value(h);
}

/* ---- the single-process communicator -------------------------------------- */

START_TEST(test_single_comm) {
  char err[256] = "";
  probe_comm *c = NULL;
  ck_assert_int_eq(probe_comm_open(&c, PROBE_COMM_SINGLE, err, sizeof err),
                   PROBE_OK);
  ck_assert_int_eq(probe_comm_rank(c), 0);
  ck_assert_int_eq(probe_comm_size(c), 1);
  ck_assert_str_eq(probe_comm_name(c), "single");
  ck_assert_int_eq(probe_comm_get_kind(c), PROBE_COMM_SINGLE);
  double v[3] = {1.5, -2.0, NAN};
  ck_assert_int_eq(probe_comm_allreduce_f64(c, v, 3, 0), PROBE_OK);
  ck_assert(v[0] == 1.5 && v[1] == -2.0 && isnan(v[2]));
  ck_assert_int_eq(probe_comm_allreduce_f64(c, v, 2, 1), PROBE_OK);
  ck_assert(v[0] == 1.5 && v[1] == -2.0);
  char id[8] = "abc";
  ck_assert_int_eq(probe_comm_bcast(c, id, sizeof id), PROBE_OK);
  ck_assert_str_eq(id, "abc");
  float g[4] = {40000.f, 1e-3f, -7.f, INFINITY};
  ck_assert_int_eq(pt_comm_allreduce_grads(c, g, 4, PT_REDUCE_F16), PROBE_OK);
  ck_assert(g[0] == 40000.f && g[1] == 1e-3f && g[2] == -7.f && isinf(g[3]));
  ck_assert_int_eq(probe_comm_allreduce_f64(c, NULL, 1, 0),
                   PROBE_ERR_INVALID_ARG);
  probe_comm_abort(c, 3); /* nothing for one process */
  probe_comm_close(c);
  probe_comm_close(NULL);
  ck_assert_int_eq(probe_comm_rank(NULL), 0);
  ck_assert_int_eq(probe_comm_size(NULL), 1);
}
END_TEST

START_TEST(test_mpi_kind_without_launch) {
  /* Asking for MPI in a build without it is refused with a reason; with
   * it, the kind is reported by probe_comm_mpi_available (opening it here
   * would MPI_Init a singleton, which the mpi tests do instead). */
  if (probe_comm_mpi_available()) return;
  char err[256] = "";
  probe_comm *c = NULL;
  ck_assert_int_eq(probe_comm_open(&c, PROBE_COMM_MPI, err, sizeof err),
                   PROBE_ERR_UNSUPPORTED);
  ck_assert_ptr_null(c);
  ck_assert(strstr(err, "MPI") != NULL);
}
END_TEST

START_TEST(test_launch_detection) {
  static const char *const vars[] = {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK",
                                     "PMI_RANK", "PMI_SIZE",
                                     "SLURM_STEP_NUM_TASKS"};
  for (size_t i = 0; i < 5; i++) unsetenv(vars[i]);
  ck_assert_int_eq(probe_comm_launched(), 0);
  setenv("SLURM_PROCID", "0", 1); /* sbatch's batch shell: not a launch */
  ck_assert_int_eq(probe_comm_launched(), 0);
  for (size_t i = 0; i < 5; i++) {
    setenv(vars[i], "2", 1);
    ck_assert_msg(probe_comm_launched(), "%s", vars[i]);
    unsetenv(vars[i]);
  }
  setenv("OMPI_COMM_WORLD_SIZE", "", 1); /* empty: not set */
  ck_assert_int_eq(probe_comm_launched(), 0);
  setenv("OMPI_COMM_WORLD_SIZE", "4", 1);
  setenv("AMPPROBE_DIST", "0", 1); /* forced single process */
  ck_assert_int_eq(probe_comm_launched(), 0);
  unsetenv("AMPPROBE_DIST");
  ck_assert_int_eq(probe_comm_launched(), 1);
  unsetenv("OMPI_COMM_WORLD_SIZE");
  setenv("SLURM_STEP_NUM_TASKS", "1", 1); /* srun -n 1: one process */
  ck_assert_int_eq(probe_comm_launched(), 0);
  unsetenv("SLURM_STEP_NUM_TASKS");
  unsetenv("SLURM_PROCID");
}
END_TEST

/* ---- the FP16 sum ------------------------------------------------------------ */

START_TEST(test_f16_sum_overflows_finite_halves) {
  /* two finite halves whose sum is past 65504 */
  float acc[5] = {40000.f, 65504.f, 65504.f, -40000.f, 32768.f};
  const float x[5] = {40000.f, 16.f, 8.f, -40000.f, 32736.f};
  for (int i = 0; i < 5; i++) {
    ck_assert(isfinite(acc[i]) && probe_round_f16(acc[i]) == acc[i]);
    ck_assert(probe_round_f16(x[i]) == x[i]);
  }
  pt_sum_f16(acc, x, 5);
  ck_assert(isinf(acc[0]) && acc[0] > 0); /* 80000 */
  ck_assert(isinf(acc[1]));               /* 65520: the tie rounds to even = inf */
  ck_assert(acc[2] == 65504.f);           /* 65512 rounds down */
  ck_assert(isinf(acc[3]) && acc[3] < 0);
  ck_assert(acc[4] == 65504.f);           /* 65504 exactly */
  /* the same values pre-divided by 2 (the world) do not overflow */
  float p[2] = {20000.f, 32752.f}, q[2] = {20000.f, 32752.f};
  pt_sum_f16(p, q, 2);
  ck_assert(p[0] == 40000.f && p[1] == 65504.f);
}
END_TEST

START_TEST(test_f16_sum_parts_partial_rounding) {
  /* 4 ranks: each partial sum is rounded, so the order matters as it does
   * in NCCL: 60000 + 10000 overflows before -60000 could bring it back */
  const float parts[4] = {60000.f, 10000.f, -60000.f, 1.f};
  float out;
  pt_sum_parts(&out, parts, 1, 4, PT_REDUCE_F16);
  ck_assert(isinf(out) && out > 0);
  pt_sum_parts(&out, parts, 1, 4, PT_REDUCE_F32);
  ck_assert(out == 10001.f);
  /* +inf from one rank and -inf from another: NaN */
  const float pm[2] = {INFINITY, -INFINITY};
  pt_sum_parts(&out, pm, 1, 2, PT_REDUCE_F16);
  ck_assert(isnan(out));
  /* rounding of small partial sums: 2048 + 1 is not a half (ulp 2), ties
   * to even give 2048; 2048 + 1 + 1 stays 2048 in FP16, 2050 in FP32 */
  const float sm[3] = {2048.f, 1.f, 1.f};
  pt_sum_parts(&out, sm, 1, 3, PT_REDUCE_F16);
  ck_assert(out == 2048.f);
  pt_sum_parts(&out, sm, 1, 3, PT_REDUCE_F32);
  ck_assert(out == 2050.f);
  /* pre-division (what dist.prediv sends) keeps 4 x 40000 finite */
  float big[4], pre[4];
  for (int r = 0; r < 4; r++) {
    big[r] = 40000.f;
    pre[r] = probe_round_f16(40000.f / 4.f);
  }
  pt_sum_parts(&out, big, 1, 4, PT_REDUCE_F16);
  ck_assert(isinf(out));
  pt_sum_parts(&out, pre, 1, 4, PT_REDUCE_F16);
  ck_assert(out == 40000.f);
}
END_TEST

START_TEST(test_f16_sum_vs_search) {
  init_halves();
  enum { N = 200000 };
  float *a = malloc(N * sizeof(float)), *b = malloc(N * sizeof(float));
  ck_assert_ptr_nonnull(a);
  ck_assert_ptr_nonnull(b);
  for (int i = 0; i < N; i++) {
    a[i] = rand_half();
    /* half the pairs close in magnitude (cancellation, ties, overflow) */
    b[i] = (i & 1) ? rand_half()
                   : (float)ref_round_half((double)a[i] *
                                           (0.5 + (xr() % 1000) / 500.0) *
                                           ((xr() & 1) ? 1 : -1));
  }
  float *acc = malloc(N * sizeof(float));
  memcpy(acc, a, N * sizeof(float));
  pt_sum_f16(acc, b, N);
  int overflows = 0;
  for (int i = 0; i < N; i++) {
    /* exact in double: both are halves (exponents 2^-24 .. 2^15) */
    double want = ref_round_half((double)a[i] + (double)b[i]);
    ck_assert_msg(acc[i] == (float)want || (isnan(acc[i]) && isnan(want)),
                  "%a + %a: got %a, want %a", a[i], b[i], acc[i], want);
    overflows += isinf(acc[i]) && isfinite(a[i]) && isfinite(b[i]);
  }
  ck_assert_int_gt(overflows, 0); /* the sample reached the overflow */
  free(a);
  free(b);
  free(acc);
}
END_TEST

__attribute__((target("f16c"))) static float f16c_round(float x) {
  return _cvtsh_ss(_cvtss_sh(x, _MM_FROUND_TO_NEAREST_INT));
}

START_TEST(test_f16_sum_vs_f16c) {
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("f16c")) {
    printf("test_f16_sum_vs_f16c: SKIP: this CPU has no F16C\n");
    return;
  }
  enum { N = 100000 };
  int overflows = 0;
  for (int i = 0; i < N; i++) {
    float a = rand_half(), b = rand_half();
    if (i % 3 == 0) b = f16c_round(a * 0.97f);
    float got = a;
    pt_sum_f16(&got, &b, 1);
    float want = f16c_round(a + b);
    ck_assert_msg(got == want || (isnan(got) && isnan(want)),
                  "%a + %a: got %a, F16C %a", a, b, got, want);
    overflows += isinf(got) != 0;
  }
  ck_assert_int_gt(overflows, 0);
}
END_TEST

/* ---- world-1 runs through the all-reduce stage ----------------------------- */

static probe_train_config *load(const char *name) {
  char err[256] = "";
  probe_train_config *c = NULL;
  ck_assert_msg(probe_config_load_scenario(&c, name, err, sizeof err) ==
                    PROBE_OK, "%s", err);
  return c;
}

/* digest: probe_train_opts.weight_digest (-1: the default) */
static probe_status train(const probe_train_config *c, probe_comm *comm,
                          const char *trace, int digest,
                          probe_train_result *res) {
  probe_train_opts o;
  probe_train_opts_init(&o);
  o.comm = comm;
  o.weight_digest = digest;
  o.trace_path = trace;
  o.mode = PROBE_MODE_FULL;
  o.run_id = comm ? "test-run.1" : NULL;
  char err[256] = "";
  probe_status st = probe_train(c, &o, res, err, sizeof err);
  ck_assert_msg(st == PROBE_OK, "%s", err);
  return st;
}

/* Counts records of a site and how many held inf/NaN; the trace's rank. */
static void site_counts(const char *path, probe_site site, int64_t *n,
                        int64_t *nonfinite, int *rank, int *world) {
  probe_trace *t = NULL;
  ck_assert_int_eq(probe_trace_open(&t, path), PROBE_OK);
  const probe_trace_info *inf = probe_trace_get_info(t);
  *rank = inf->rank;
  *world = inf->world_size;
  probe_record buf[512];
  size_t got = 0;
  *n = *nonfinite = 0;
  for (int64_t at = 0;
       probe_trace_read_records(t, at, 512, buf, &got) == PROBE_OK && got;
       at += (int64_t)got)
    for (size_t i = 0; i < got; i++)
      if (buf[i].site == (int32_t)site) {
        (*n)++;
        *nonfinite += buf[i].stats.nan_count + buf[i].stats.posinf_count +
                      buf[i].stats.neginf_count > 0;
      }
  probe_trace_close(t);
}

START_TEST(test_world1_matches_plain_run) {
  char dir[] = "/tmp/ampprobe-comm-XXXXXX";
  ck_assert_ptr_nonnull(mkdtemp(dir));
  char plain[256], dist[256], nodig[256];
  snprintf(plain, sizeof plain, "%s/plain.h5", dir);
  snprintf(dist, sizeof dist, "%s/dist.h5", dir);
  snprintf(nodig, sizeof nodig, "%s/nodigest.h5", dir);
  probe_train_config *c = load("healthy-dp");
  ck_assert_int_eq(probe_config_set(c, "steps", "20", NULL, 0), PROBE_OK);
  char err[128];
  probe_comm *comm = NULL;
  ck_assert_int_eq(probe_comm_open(&comm, PROBE_COMM_SINGLE, err, sizeof err),
                   PROBE_OK);
  probe_train_result a, b;
  /* one process measures the digest when asked; the world-1 run by
   * default, as any data-parallel run */
  train(c, NULL, plain, 1, &a);
  train(c, comm, dist, -1, &b);
  /* an FP32 all-reduce of one rank is the identity: the same run, bit for
   * bit */
  ck_assert(a.final_loss == b.final_loss && a.last_loss == b.last_loss);
  ck_assert(isfinite(a.final_loss));
  int64_t n, nf;
  int rank, world;
  site_counts(plain, PROBE_SITE_GRAD_PRE_ALLREDUCE, &n, &nf, &rank, &world);
  ck_assert_int_eq(n, 0); /* a plain run has no all-reduce stage */
  ck_assert_int_eq(rank, -1);
  ck_assert_int_eq(world, 0);
  site_counts(dist, PROBE_SITE_GRAD_PRE_ALLREDUCE, &n, &nf, &rank, &world);
  ck_assert_int_eq(n, 20 * 5); /* 5 parameterised layers x 20 steps */
  ck_assert_int_eq(rank, 0);
  ck_assert_int_eq(world, 1);
  site_counts(dist, PROBE_SITE_GRAD_POST_ALLREDUCE, &n, &nf, &rank, &world);
  ck_assert_int_eq(n, 20 * 5);
  /* the weight digests of both runs are the same, step by step, and change */
  probe_trace *ta = NULL, *tb = NULL;
  ck_assert_int_eq(probe_trace_open(&ta, plain), PROBE_OK);
  ck_assert_int_eq(probe_trace_open(&tb, dist), PROBE_OK);
  probe_step_scalars sa[20], sb[20];
  size_t ga = 0, gb = 0;
  ck_assert_int_eq(probe_trace_read_steps(ta, 0, 20, sa, &ga), PROBE_OK);
  ck_assert_int_eq(probe_trace_read_steps(tb, 0, 20, sb, &gb), PROBE_OK);
  ck_assert_int_eq(ga, 20);
  ck_assert_int_eq(gb, 20);
  for (int i = 0; i < 20; i++) {
    ck_assert(!(sa[i].unmeasured & PROBE_SCALAR_WEIGHT_DIGEST));
    ck_assert(sa[i].weight_digest == sb[i].weight_digest);
    if (i && !sa[i].skipped)
      ck_assert(sa[i].weight_digest != sa[i - 1].weight_digest);
    if (sa[i].skipped) ck_assert(sa[i].weight_digest == sa[i - 1].weight_digest);
  }
  ck_assert_str_eq(probe_trace_get_info(tb)->run_id, "test-run.1");
  probe_trace_close(ta);
  probe_trace_close(tb);
  /* one process by default: the same run, the digest not measured */
  probe_train_result d;
  train(c, NULL, nodig, -1, &d);
  ck_assert(d.final_loss == a.final_loss && d.last_loss == a.last_loss);
  ck_assert_int_eq(probe_trace_open(&ta, nodig), PROBE_OK);
  ck_assert_int_eq(probe_trace_read_steps(ta, 0, 20, sa, &ga), PROBE_OK);
  ck_assert_int_eq(ga, 20);
  for (int i = 0; i < 20; i++) {
    ck_assert(sa[i].unmeasured & PROBE_SCALAR_WEIGHT_DIGEST);
    ck_assert(sa[i].weight_digest == 0);
  }
  probe_trace_close(ta);
  probe_comm_close(comm);
  probe_config_free(c);
  unlink(plain);
  unlink(dist);
  unlink(nodig);
  rmdir(dir);
}
END_TEST

START_TEST(test_world1_fp16_allreduce) {
  /* allreduce-overflow in one process: its one rank's gradients fit in
   * FP16, and with nothing to add nothing overflows */
  char dir[] = "/tmp/ampprobe-comm-XXXXXX";
  ck_assert_ptr_nonnull(mkdtemp(dir));
  char path[256];
  snprintf(path, sizeof path, "%s/w1.h5", dir);
  probe_train_config *c = load("allreduce-overflow");
  ck_assert_int_eq(probe_config_set(c, "steps", "5", NULL, 0), PROBE_OK);
  char err[128];
  probe_comm *comm = NULL;
  ck_assert_int_eq(probe_comm_open(&comm, PROBE_COMM_SINGLE, err, sizeof err),
                   PROBE_OK);
  probe_train_result r;
  train(c, comm, path, -1, &r);
  ck_assert_int_eq(r.diverged, 0);
  ck_assert_int_eq(r.first_nonfinite_step, -1);
  int64_t n, nf;
  int rank, world;
  site_counts(path, PROBE_SITE_GRAD_POST_ALLREDUCE, &n, &nf, &rank, &world);
  ck_assert_int_eq(n, 5 * 2); /* enc.fc1, head.fc (revin has no affine) */
  ck_assert_int_eq(nf, 0);
  probe_comm_close(comm);
  probe_config_free(c);
  unlink(path);
  rmdir(dir);
}
END_TEST

START_TEST(test_nan_rank_shard) {
  /* data.nan_rank puts the NaN in that rank's first micro-batch: the
   * global micro-batch nan_rank * micro_batches */
  probe_train_config *c = load("rank-bad-input");
  ck_assert_int_eq(probe_config_nan_rank(c), 1);
  pt_data *d = NULL;
  char err[128];
  ck_assert_int_eq(pt_data_open(&d, &c->data, c->loss, c->seed, err,
                                sizeof err), PROBE_OK);
  int64_t F = pt_data_in_dim(d), B = c->data.batch;
  float *x = malloc((size_t)(B * F) * sizeof(float));
  float *y = malloc((size_t)B * 8 * sizeof(float));
  int32_t *lab = malloc((size_t)B * sizeof(int32_t));
  const int64_t s = c->data.nan_step;
  pt_data_set_nan_micro(d, 2); /* rank 1 of micro_batches 2 */
  for (int64_t g = 0; g < 4; g++) {
    ck_assert_int_eq(pt_data_batch(d, s, g, x, y, lab), PROBE_OK);
    int nan = 0;
    for (int64_t i = 0; i < B * F; i++) nan += isnan(x[i]);
    ck_assert_int_eq(nan, g == 2);
  }
  ck_assert_int_eq(pt_data_batch(d, s + 1, 2, x, y, lab), PROBE_OK);
  for (int64_t i = 0; i < B * F; i++) ck_assert(!isnan(x[i]));
  /* the shard of a micro-batch is the global index: rank 1's first batch of
   * a 2-rank job is micro-batch 1 of one process's global batch */
  float *x2 = malloc((size_t)(B * F) * sizeof(float));
  ck_assert_int_eq(pt_data_batch(d, 3, 1, x, y, lab), PROBE_OK);
  ck_assert_int_eq(pt_data_batch(d, 3, 1, x2, y, lab), PROBE_OK);
  ck_assert_mem_eq(x, x2, (size_t)(B * F) * sizeof(float));
  /* and global micro-batches past 4095 do not alias the next step's */
  ck_assert_int_eq(pt_data_batch(d, 3, 4096, x, y, lab), PROBE_OK);
  ck_assert_int_eq(pt_data_batch(d, 4, 0, x2, y, lab), PROBE_OK);
  ck_assert(memcmp(x, x2, (size_t)(B * F) * sizeof(float)) != 0);
  free(x);
  free(x2);
  free(y);
  free(lab);
  pt_data_close(d);
  probe_config_free(c);
}
END_TEST

START_TEST(test_dist_config) {
  probe_train_config *c = load("healthy");
  char err[256];
  ck_assert_int_eq(probe_config_set(c, "dist.allreduce_dtype", "fp16", err,
                                    sizeof err), PROBE_OK);
  ck_assert_int_eq(probe_config_set(c, "dist.prediv", "on", err, sizeof err),
                   PROBE_OK);
  ck_assert_int_eq(probe_config_set(c, "dist.allreduce_dtype", "bf16", err,
                                    sizeof err), PROBE_ERR_CONFIG);
  ck_assert(strstr(err, "dist.allreduce_dtype") != NULL);
  ck_assert_int_eq(c->dist.dtype, PT_REDUCE_F16);
  ck_assert_int_eq(c->dist.prediv, 1);
  char *js = probe_config_to_json(c);
  ck_assert(strstr(js, "\"allreduce_dtype\": \"fp16\"") != NULL);
  probe_train_config *back = NULL;
  ck_assert_int_eq(probe_config_from_json(&back, js, err, sizeof err),
                   PROBE_OK);
  ck_assert_int_eq(back->dist.dtype, PT_REDUCE_F16);
  ck_assert_int_eq(back->dist.prediv, 1);
  free(js);
  probe_config_free(back);
  static const char *bad[] = {
      "{\"model\": [{\"type\": \"linear\", \"out\": 1}], \"dist\": "
      "{\"allreduce_dtype\": \"fp8\"}}",
      "{\"model\": [{\"type\": \"linear\", \"out\": 1}], \"dist\": "
      "{\"prediv\": 2}}",
      "{\"model\": [{\"type\": \"linear\", \"out\": 1}], \"dist\": "
      "{\"bucket\": 1}}",
      "{\"model\": [{\"type\": \"linear\", \"out\": 1}], \"dist\": 3}",
      "{\"model\": [{\"type\": \"linear\", \"out\": 1}], \"data\": "
      "{\"nan_rank\": -1}}",
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    ck_assert_int_eq(probe_config_from_json(&back, bad[i], err, sizeof err),
                     PROBE_ERR_CONFIG);
    ck_assert_msg(strstr(err, "dist") || strstr(err, "nan_rank"), "%s", err);
  }
  probe_config_free(c);
}
END_TEST

int main(void) {
  Suite *s = suite_create("comm");
  TCase *tc = tcase_create("comm");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_single_comm);
  tcase_add_test(tc, test_mpi_kind_without_launch);
  tcase_add_test(tc, test_launch_detection);
  tcase_add_test(tc, test_f16_sum_overflows_finite_halves);
  tcase_add_test(tc, test_f16_sum_parts_partial_rounding);
  tcase_add_test(tc, test_f16_sum_vs_search);
  tcase_add_test(tc, test_f16_sum_vs_f16c);
  tcase_add_test(tc, test_nan_rank_shard);
  tcase_add_test(tc, test_dist_config);
  tcase_add_test(tc, test_world1_matches_plain_run);
  tcase_add_test(tc, test_world1_fp16_allreduce);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? 1 : 0;
}
