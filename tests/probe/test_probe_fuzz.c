/*
 * test_probe_fuzz.c - the corrupt-trace fuzz stage: a few hundred mutants
 * of a real trace per run, through the reader. It must never crash, hang,
 * or answer anything but PROBE_OK or a clean error with a one-line
 * message; a mutant that opens is read in full in this process, each read
 * giving rows or PROBE_ERR_CORRUPT.
 *
 * Mutations, each seeded from one number (printed first; PT_FUZZ_SEED
 * repeats a run, PT_FUZZ_N sets the count):
 *   bytes     1-16 random bytes overwritten, half of them in the first 4 KiB
 *   bits      1-8 single-bit flips anywhere
 *   truncate  the file cut at a random length
 *   zero      a 512-byte block zeroed
 *   copy      a 512-byte block copied over another
 *   state     one /meta/state entry set to an edge value (through HDF5, so
 *             the file stays well-formed HDF5), with or without the check
 *             value recomputed
 *   extent    one table's extent shrunk or grown (through HDF5)
 * Byte-level mutants go through probe_trace_open_isolated only (HDF5 can
 * crash on them; that is what the isolated open is for); the well-formed
 * ones (state, extent) also through probe_trace_open in this process.
 * Every open must end within a bound (MAX_OPEN_S). Labelled "fuzz" too, so
 * the sanitizer build runs it.
 */
#define _POSIX_C_SOURCE 200809L
#include <hdf5.h>
#include <math.h>
#include <time.h>

#include "probe_testutil.h"

#define MAX_OPEN_S 15.0 /* the isolated open gives up after 10 s without progress */

static char *g_data;
static size_t g_size;

static double mono(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* A small xorshift generator: the same seed gives the same mutant on
 * every platform. */
static uint64_t rng_state;
static uint64_t rnd(void) {
  uint64_t x = rng_state;
  x ^= x << 13;
  x ^= x >> 7;
  x ^= x << 17;
  return rng_state = x;
}
static size_t rnd_below(size_t n) { return n ? (size_t)(rnd() % n) : 0; }

/* A trace with every table non-empty, as the tools see them: 3 layers,
 * 40 steps in full mode, scaler events, a non-finite value at step 25;
 * rank 1 of 2 with a run id, the all-reduce sites in layer 2 and a weight
 * digest at even steps, so that mutants reach the multi-rank checks too. */
static void make_trace(const char *path) {
  probe_options o;
  probe_options_init(&o);
  o.mode = PROBE_MODE_FULL;
  o.overwrite = 1;
  o.config_json = "{\"model\": \"mlp\"}";
  o.command_line = "ampprobe run --fuzz";
  o.rank = 1;
  o.world_size = 2;
  o.run_id = "fuzz-run.1";
  probe_session *s;
  PT_CHECK(probe_session_open(&s, path, &o));
  static const char *const names[3] = {"in", "mid", "out"};
  for (int l = 0; l < 3; l++)
    PT_CHECK(probe_layer_register(s, names[l], PROBE_KIND_LINEAR,
                                  PROBE_DTYPE_F16, NULL));
  float x[3][2][48];
  for (int step = 0; step < 40; step++) {
    PT_CHECK(probe_step_begin(s, step));
    for (int l = 0; l < 3; l++)
      for (int k = 0; k < 2; k++) {
        pt_tensor(x[l][k], 48, step, (uint32_t)(2 * l + k));
        if (step == 25 && l == 1 && k == 1) x[l][k][5] = NAN;
        probe_site site = l == 2 ? (k ? PROBE_SITE_GRAD_POST_ALLREDUCE
                                      : PROBE_SITE_GRAD_PRE_ALLREDUCE)
                                 : (k ? PROBE_SITE_FWD_OUT : PROBE_SITE_FWD_IN);
        PT_CHECK(probe_tensor_record(s, l, site, PROBE_DTYPE_F32, x[l][k], 48));
      }
    probe_step_scalars sc = {.loss = 1.0 / (step + 1), .loss_scale = 512.0};
    if (step % 2 == 0)
      sc.weight_digest = probe_digest64(x, sizeof x, PROBE_DIGEST64_INIT);
    PT_CHECK(probe_step_set_scalars(s, &sc));
    if (step % 9 == 0) {
      probe_scaler_event ev = {.kind = PROBE_SCALER_GROWTH,
                               .old_scale = 256,
                               .new_scale = 512};
      PT_CHECK(probe_scaler_transition(s, &ev));
    }
    PT_CHECK(probe_step_end(s));
    if (step % 10 == 9) PT_CHECK(probe_session_flush(s));
  }
  PT_CHECK(probe_session_close(s));
}

static void save(const char *path, const char *data, size_t n) {
  FILE *f = fopen(path, "wb");
  ck_assert_ptr_nonnull(f);
  ck_assert_uint_eq(fwrite(data, 1, n, f), n);
  fclose(f);
}

/* ---- well-formed mutants, through HDF5 ----------------------------------- */

static const int64_t edge[] = {-2, -1, 0, 1, 2, 199, 200, 1 << 20,
                               3388997641LL, INT64_MAX, INT64_MIN};

/* Same algorithm as the writer's check value (docs/trace-format.md),
 * written again here as an independent reference. */
static int64_t fnv_state(const int64_t st[16]) {
  uint64_t h = 14695981039346656037ull;
  for (int i = 0; i < 16; i++) {
    if (i == 13) continue;
    for (int b = 0; b < 8; b++) {
      h ^= ((uint64_t)st[i] >> (8 * b)) & 0xff;
      h *= 1099511628211ull;
    }
  }
  return (int64_t)h;
}

static int mutate_state(const char *path, int idx, int64_t v, int fix) {
  hid_t f = H5Fopen(path, H5F_ACC_RDWR, H5P_DEFAULT);
  if (f < 0) return -1;
  hid_t d = H5Dopen2(f, "/meta/state", H5P_DEFAULT);
  int64_t st[16];
  int rc = -1;
  if (d >= 0 &&
      H5Dread(d, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, st) >= 0) {
    st[idx] = v;
    if (fix) st[13] = fnv_state(st);
    rc = H5Dwrite(d, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, st) < 0
             ? -1
             : 0;
  }
  if (d >= 0) H5Dclose(d);
  H5Fclose(f);
  return rc;
}

static const char *const tables[] = {"/layers", "/steps", "/records",
                                     "/scaler_events", "/snapshots/index",
                                     "/snapshots/data", "/kernels"};

static int mutate_extent(const char *path, int table, hsize_t n) {
  hid_t f = H5Fopen(path, H5F_ACC_RDWR, H5P_DEFAULT);
  if (f < 0) return -1;
  hid_t d = H5Dopen2(f, tables[table], H5P_DEFAULT);
  int rc = d >= 0 && H5Dset_extent(d, &n) >= 0 ? 0 : -1;
  if (d >= 0) H5Dclose(d);
  H5Fclose(f);
  return rc;
}

/* ---- the stage ----------------------------------------------------------- */

typedef struct outcome {
  int n, ok, clean_err, by_kind[8];
  double slowest;
  uint64_t slowest_seed;
} outcome;

static void check_one(const char *bad, uint64_t seed, const char *kind,
                      int in_process, outcome *oc) {
  probe_trace *t = NULL;
  char err[512] = "";
  double t0 = mono();
  probe_status st = probe_trace_open_isolated(&t, bad, err, sizeof err);
  double dt = mono() - t0;
  const char *slow = getenv("PT_FUZZ_SLOW"); /* report opens slower than */
  if (slow && dt > atof(slow))
    printf("slow: seed %llu (%s) %.2f s: %s\n", (unsigned long long)seed,
           kind, dt, err);
  if (dt > oc->slowest) {
    oc->slowest = dt;
    oc->slowest_seed = seed;
  }
  ck_assert_msg(dt < MAX_OPEN_S, "seed %llu (%s): open took %.1f s (%s)",
                (unsigned long long)seed, kind, dt, err);
  ck_assert_msg(st == PROBE_OK || st == PROBE_ERR_CORRUPT ||
                    st == PROBE_ERR_NOT_HDF5 || st == PROBE_ERR_NOT_TRACE ||
                    st == PROBE_ERR_VERSION,
                "seed %llu (%s): status %s (%s)", (unsigned long long)seed,
                kind, probe_status_name(st), err);
  oc->n++;
  if (st == PROBE_OK) {
    oc->ok++;
    probe_status rs = pt_read_all(t);
    ck_assert_msg(rs == PROBE_OK || rs == PROBE_ERR_CORRUPT,
                  "seed %llu (%s): read %s", (unsigned long long)seed, kind,
                  probe_status_name(rs));
    probe_trace_close(t);
  } else {
    oc->clean_err++;
    ck_assert_msg(err[0] && strchr(err, '\n') == NULL,
                  "seed %llu (%s): message '%s'", (unsigned long long)seed,
                  kind, err);
  }
  if (in_process) {
    /* the same answer from the plain open */
    /* the same answer from the plain open and a read of every row (the
     * isolated open reads every row too) */
    probe_trace *u = NULL;
    probe_status su = probe_trace_open(&u, bad);
    if (su == PROBE_OK) {
      su = pt_read_all(u);
      probe_trace_close(u);
    }
    ck_assert_msg(su == st, "seed %llu (%s): isolated %s (%s), plain %s",
                  (unsigned long long)seed, kind, probe_status_name(st), err,
                  probe_status_name(su));
  }
}

START_TEST(test_fuzz_stage) {
  char path[256], bad[256];
  pt_path(path, sizeof path, "fuzz-orig");
  pt_path(bad, sizeof bad, "fuzz-bad");
  make_trace(path);
  pt_load(path, &g_data, &g_size);
  {
    probe_trace *t;
    char err[256];
    PT_CHECK(probe_trace_open_isolated(&t, path, err, sizeof err));
    ck_assert_int_gt(probe_trace_get_info(t)->n_snapshots, 0);
    PT_CHECK(pt_read_all(t));
    probe_trace_close(t);
  }
  const char *se = getenv("PT_FUZZ_SEED"), *ne = getenv("PT_FUZZ_N");
  uint64_t base = se ? strtoull(se, NULL, 10) : (uint64_t)time(NULL);
  int n = ne ? atoi(ne) : 300;
  printf("fuzz stage: %d mutants from seed %llu (PT_FUZZ_SEED=%llu repeats "
         "it)\n",
         n, (unsigned long long)base, (unsigned long long)base);
  fflush(stdout);
  static const char *const kinds[] = {"bytes", "bits", "truncate", "zero",
                                      "copy", "state", "extent"};
  outcome oc;
  memset(&oc, 0, sizeof oc);
  char *copy = malloc(g_size);
  H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
  for (int k = 0; k < n; k++) {
    uint64_t seed = base + (uint64_t)k;
    rng_state = seed * 0x9E3779B97F4A7C15ull + 1;
    rnd();
    int kind = (int)rnd_below(7);
    if (getenv("PT_VERBOSE"))
      fprintf(stderr, "seed %llu: %s\n", (unsigned long long)seed,
              kinds[kind]);
    memcpy(copy, g_data, g_size);
    size_t len = g_size;
    switch (kind) {
    case 0: {
      int nb = 1 + (int)rnd_below(16);
      for (int i = 0; i < nb; i++) {
        size_t off = (rnd() & 1) ? rnd_below(g_size < 4096 ? g_size : 4096)
                                 : rnd_below(g_size);
        copy[off] = (char)rnd();
      }
      break;
    }
    case 1: {
      int nb = 1 + (int)rnd_below(8);
      for (int i = 0; i < nb; i++)
        copy[rnd_below(g_size)] ^= (char)(1u << rnd_below(8));
      break;
    }
    case 2:
      len = rnd_below(g_size);
      break;
    case 3: {
      size_t off = rnd_below(g_size / 512) * 512;
      memset(copy + off, 0, off + 512 <= g_size ? 512 : g_size - off);
      break;
    }
    case 4: {
      size_t from = rnd_below(g_size / 512) * 512,
             to = rnd_below(g_size / 512) * 512;
      if (from + 512 <= g_size && to + 512 <= g_size)
        memmove(copy + to, copy + from, 512);
      break;
    }
    default:
      break;
    }
    save(bad, copy, len);
    int in_process = 0;
    if (kind == 5) {
      int idx = (int)rnd_below(16);
      int64_t v = edge[rnd_below(sizeof edge / sizeof edge[0])];
      ck_assert_int_eq(mutate_state(bad, idx, v, (int)(rnd() & 1)), 0);
      in_process = 1;
    } else if (kind == 6) {
      int tb = (int)rnd_below(7);
      hsize_t v = rnd() & 1 ? rnd_below(64) : (hsize_t)1 << rnd_below(40);
      if (mutate_extent(bad, tb, v) == 0) in_process = 1;
    }
    oc.by_kind[kind]++;
    check_one(bad, seed, kinds[kind], in_process, &oc);
  }
  printf("fuzz stage: %d mutants (bytes %d, bits %d, truncate %d, zero %d, "
         "copy %d, state %d, extent %d): %d opened and read, %d clean "
         "errors; slowest open %.2f s (seed %llu)\n",
         oc.n, oc.by_kind[0], oc.by_kind[1], oc.by_kind[2], oc.by_kind[3],
         oc.by_kind[4], oc.by_kind[5], oc.by_kind[6], oc.ok, oc.clean_err,
         oc.slowest, (unsigned long long)oc.slowest_seed);
  free(copy);
  free(g_data);
  unlink(path);
  unlink(bad);
}
END_TEST

static Suite *make_fuzz_suite(void) {
  Suite *s = suite_create("fuzz");
  TCase *tc = tcase_create("fuzz");
  tcase_set_timeout(tc, 600);
  tcase_add_test(tc, test_fuzz_stage);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  SRunner *sr = srunner_create(make_fuzz_suite());
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? 0 : 1;
}
