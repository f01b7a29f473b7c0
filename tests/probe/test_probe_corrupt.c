/*
 * test_probe_corrupt.c - Check suite "corrupt": a valid trace with bytes
 * overwritten at random, for many seeds. Every variant must give PROBE_OK
 * or a clean error with a one-line message through
 * probe_trace_open_isolated; never a crash or a hang of this process. A
 * variant that opens is then read in full in this process, where each read
 * gives rows or PROBE_ERR_CORRUPT.
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <time.h>

#include "probe_testutil.h"

enum { SEEDS = 500 };

static char *g_data;
static size_t g_size;

/* A trace with every table non-empty: 3 layers, 30 steps, scaler events,
 * and a non-finite value at step 20 (one snapshot set); rank 3 of 4 with a
 * run id, the all-reduce sites in layer 0 and a weight digest at odd steps
 * (the reader's multi-rank checks). */
static void make_trace(const char *path) {
  probe_options o;
  probe_options_init(&o);
  o.mode = PROBE_MODE_FULL;
  o.config_json = "{\"model\": \"mlp\"}";
  o.rank = 3;
  o.world_size = 4;
  o.run_id = "corrupt-run";
  probe_session *s;
  PT_CHECK(probe_session_open(&s, path, &o));
  static const char *const names[3] = {"in", "mid", "out"};
  for (int l = 0; l < 3; l++)
    PT_CHECK(probe_layer_register(s, names[l], PROBE_KIND_LINEAR,
                                  PROBE_DTYPE_F16, NULL));
  float x[3][2][40];
  for (int step = 0; step < 30; step++) {
    PT_CHECK(probe_step_begin(s, step));
    for (int l = 0; l < 3; l++)
      for (int k = 0; k < 2; k++) {
        pt_tensor(x[l][k], 40, step, (uint32_t)(2 * l + k));
        if (step == 20 && l == 1 && k == 1) x[l][k][3] = INFINITY;
        probe_site site = l == 0 ? (k ? PROBE_SITE_GRAD_POST_ALLREDUCE
                                      : PROBE_SITE_GRAD_PRE_ALLREDUCE)
                                 : (k ? PROBE_SITE_FWD_OUT : PROBE_SITE_FWD_IN);
        PT_CHECK(probe_tensor_record(s, l, site, PROBE_DTYPE_F32, x[l][k], 40));
      }
    probe_step_scalars sc = {.loss = 1.0, .loss_scale = 4096.0};
    if (step % 2) sc.weight_digest = probe_digest64(x, sizeof x, step);
    PT_CHECK(probe_step_set_scalars(s, &sc));
    if (step % 7 == 0) {
      probe_scaler_event ev = {.kind = PROBE_SCALER_BACKOFF,
                               .old_scale = 8192,
                               .new_scale = 4096};
      PT_CHECK(probe_scaler_transition(s, &ev));
    }
    PT_CHECK(probe_step_end(s));
  }
  PT_CHECK(probe_session_close(s));
}

START_TEST(test_corrupt_random_bytes) {
  char path[256], bad[256];
  pt_path(path, sizeof path, "orig");
  pt_path(bad, sizeof bad, "bad");
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
  /* A new range of seeds every run (PT_SEED_BASE repeats one); said first,
   * so that a run that crashes still tells which range it was. */
  const char *sb = getenv("PT_SEED_BASE");
  unsigned base = sb ? (unsigned)strtoul(sb, NULL, 10) : (unsigned)time(NULL);
  printf("corrupt sweep: seeds %u .. %u\n", base, base + SEEDS - 1);
  fflush(stdout);
  int outcome[32] = {0};
  char *copy = malloc(g_size);
  for (unsigned k = 0; k < SEEDS; k++) {
    unsigned seed = base + k;
    srand(seed);
    memcpy(copy, g_data, g_size);
    int nbytes = 1 + rand() % 16;
    for (int i = 0; i < nbytes; i++) {
      /* Half the hits land in the first 4 KiB, where the superblock and
       * most object headers are. */
      size_t off = (rand() & 1) ? (size_t)rand() % (g_size < 4096 ? g_size : 4096)
                                : (size_t)rand() % g_size;
      copy[off] = (char)(rand() & 0xff);
    }
    FILE *f = fopen(bad, "wb");
    ck_assert_ptr_nonnull(f);
    ck_assert_uint_eq(fwrite(copy, 1, g_size, f), g_size);
    fclose(f);
    probe_trace *t = NULL;
    char err[512] = "";
    if (getenv("PT_VERBOSE")) fprintf(stderr, "seed %u\n", seed);
    probe_status st = probe_trace_open_isolated(&t, bad, err, sizeof err);
    if (getenv("PT_VERBOSE")) fprintf(stderr, "  -> %s %s\n", probe_status_name(st), err);
    ck_assert_msg(st == PROBE_OK || st == PROBE_ERR_CORRUPT ||
                      st == PROBE_ERR_NOT_HDF5 || st == PROBE_ERR_NOT_TRACE ||
                      st == PROBE_ERR_VERSION,
                  "seed %u: status %s (%s)", seed, probe_status_name(st), err);
    outcome[-st]++;
    if (st == PROBE_OK) {
      probe_status rs = pt_read_all(t);
      ck_assert_msg(rs == PROBE_OK || rs == PROBE_ERR_CORRUPT,
                    "seed %u: read %s", seed, probe_status_name(rs));
      probe_trace_close(t);
    } else {
      ck_assert_msg(err[0] && strchr(err, '\n') == NULL, "seed %u: '%s'", seed,
                    err);
    }
  }
  printf("corrupt sweep (%d seeds from %u): ok %d, corrupt %d, not hdf5 %d, "
         "not trace %d, version %d\n",
         SEEDS, base, outcome[0], outcome[-PROBE_ERR_CORRUPT],
         outcome[-PROBE_ERR_NOT_HDF5], outcome[-PROBE_ERR_NOT_TRACE],
         outcome[-PROBE_ERR_VERSION]);
  free(copy);
  free(g_data);
  unlink(path);
  unlink(bad);
}
END_TEST

static Suite *make_corrupt_suite(void) {
  Suite *s = suite_create("corrupt");
  TCase *tc = tcase_create("corrupt");
  tcase_set_timeout(tc, 90);
  tcase_add_test(tc, test_corrupt_random_bytes);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  SRunner *sr = srunner_create(make_corrupt_suite());
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? 0 : 1;
}
