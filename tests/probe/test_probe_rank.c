/*
 * test_probe_rank.c - libprobe's multi-rank pieces (docs/trace-format.md,
 * "Multi-rank traces"): the naming rule (probe_rank_trace_path), trace-set
 * expansion (directory, glob, list; dedup; natural order), the rank
 * attributes written and read back and their validation on both sides,
 * the weight digest (probe_digest64 against published FNV-1a vectors and
 * an independent implementation; the weight_digest field and its bit,
 * also in traces written before it existed) and the two all-reduce sites.
 */
#define _POSIX_C_SOURCE 200809L
#include <check.h>
#include <errno.h>
#include <hdf5.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ampprobe/probe.h"
#include "probe_testutil.h"

/* ---- the naming rule ----------------------------------------------------- */

static void expect_name(const char *path, int rank, const char *want) {
  char out[256];
  memset(out, 'x', sizeof out);
  PT_CHECK(probe_rank_trace_path(out, sizeof out, path, rank));
  ck_assert_str_eq(out, want);
}

START_TEST(test_name_rule) {
  expect_name("out/trace.h5", 3, "out/trace.rank3.h5");
  expect_name("trace.h5", 0, "trace.rank0.h5");
  expect_name("out/t", 3, "out/t.rank3.h5");
  expect_name("out/t.hdf5", 12, "out/t.hdf5.rank12.h5");
  expect_name("a.h5.d/x", 1, "a.h5.d/x.rank1.h5"); /* .h5 only at the end */
  expect_name(".h5", 7, ".rank7.h5");
  expect_name("out/r{rank}/t.{rank}.h5", 1023, "out/r1023/t.1023.h5");
  expect_name("{rank}", 5, "5");
  expect_name("x{rank", 5, "x{rank.rank5.h5"); /* no whole token: rule 2/3 */
  expect_name("{rank}{rank}.h5", 42, "4242.h5");
  expect_name("run.h5", 2147483647, "run.rank2147483647.h5");
}
END_TEST

START_TEST(test_name_errors) {
  char out[32];
  /* "out/trace.rank3.h5" is 18 characters: 19 bytes fit, 18 do not */
  PT_CHECK(probe_rank_trace_path(out, 19, "out/trace.h5", 3));
  ck_assert_str_eq(out, "out/trace.rank3.h5");
  ck_assert_int_eq(probe_rank_trace_path(out, 18, "out/trace.h5", 3),
                   PROBE_ERR_INVALID_ARG);
  ck_assert_str_eq(out, "");
  ck_assert_int_eq(probe_rank_trace_path(out, 1, "t", 0),
                   PROBE_ERR_INVALID_ARG);
  /* {rank} replacement: "r10.h5" needs 7 bytes */
  PT_CHECK(probe_rank_trace_path(out, 7, "r{rank}.h5", 10));
  ck_assert_str_eq(out, "r10.h5");
  ck_assert_int_eq(probe_rank_trace_path(out, 6, "r{rank}.h5", 10),
                   PROBE_ERR_INVALID_ARG);
  ck_assert_int_eq(probe_rank_trace_path(out, sizeof out, "t.h5", -1),
                   PROBE_ERR_INVALID_ARG);
  ck_assert_int_eq(probe_rank_trace_path(out, sizeof out, "", 0),
                   PROBE_ERR_INVALID_ARG);
  ck_assert_int_eq(probe_rank_trace_path(out, sizeof out, NULL, 0),
                   PROBE_ERR_INVALID_ARG);
  ck_assert_int_eq(probe_rank_trace_path(NULL, 10, "t.h5", 0),
                   PROBE_ERR_INVALID_ARG);
  ck_assert_int_eq(probe_rank_trace_path(out, 0, "t.h5", 0),
                   PROBE_ERR_INVALID_ARG);
}
END_TEST

/* ---- trace sets ---------------------------------------------------------- */

static char g_dir[256];

static void touch(const char *name) {
  char p[512];
  snprintf(p, sizeof p, "%s/%s", g_dir, name);
  FILE *f = fopen(p, "w");
  ck_assert_ptr_nonnull(f);
  fputs("x", f);
  fclose(f);
}

static void set_dir_up(void) {
  const char *tmp = getenv("TMPDIR");
  snprintf(g_dir, sizeof g_dir, "%s/ampprobe-set-%d", tmp ? tmp : "/tmp",
           (int)getpid());
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
  ck_assert_int_eq(system(cmd), 0);
  ck_assert_int_eq(mkdir(g_dir, 0755), 0);
  static const char *const files[] = {
      "trace.rank10.h5", "trace.rank2.h5", "trace.rank0.h5", "trace.rank1.h5",
      "notes.txt",       "trace.h5.bak",   "trace.rank3.h5x", "a.H5"};
  for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) touch(files[i]);
  char sub[512];
  snprintf(sub, sizeof sub, "%s/sub.h5", g_dir); /* a directory named .h5 */
  ck_assert_int_eq(mkdir(sub, 0755), 0);
  snprintf(sub, sizeof sub, "%s/sub.h5/trace.rank4.h5", g_dir);
  FILE *f = fopen(sub, "w"); /* not recursive: never listed */
  ck_assert_ptr_nonnull(f);
  fclose(f);
  snprintf(sub, sizeof sub, "%s/empty", g_dir);
  ck_assert_int_eq(mkdir(sub, 0755), 0);
}

static void set_dir_down(void) {
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_dir);
}

/* Expands args and checks the result is exactly want (names relative to
 * g_dir when rel, as given otherwise). */
static void expect_set(const char *const *args, size_t n_args,
                       const char *const *want, size_t n_want, int rel) {
  char **paths = NULL;
  size_t n = 99;
  PT_CHECK(probe_trace_set_expand(args, n_args, &paths, &n));
  ck_assert_uint_eq(n, n_want);
  for (size_t i = 0; i < n; i++) {
    char w[512];
    if (rel) snprintf(w, sizeof w, "%s/%s", g_dir, want[i]);
    else snprintf(w, sizeof w, "%s", want[i]);
    ck_assert_str_eq(paths[i], w);
  }
  probe_trace_set_free(paths, n);
}

START_TEST(test_set_dir) {
  set_dir_up();
  const char *args[] = {g_dir};
  const char *want[] = {"trace.rank0.h5", "trace.rank1.h5", "trace.rank2.h5",
                        "trace.rank10.h5"};
  expect_set(args, 1, want, 4, 1);
  /* a trailing slash gives the same files */
  char slash[300];
  snprintf(slash, sizeof slash, "%s/", g_dir);
  const char *args2[] = {slash};
  expect_set(args2, 1, want, 4, 1);
  set_dir_down();
}
END_TEST

/* A FIFO named like a rank file joins a directory's set, so that opening
 * it says "not a regular file"; left out, the post-mortem called it "rank
 * 3: no file" (hunt F6, 2026-12). A dangling link is no file and stays
 * out, as a directory named x.h5 does. */
START_TEST(test_set_dir_fifo) {
  set_dir_up();
  char p[512];
  snprintf(p, sizeof p, "%s/trace.rank3.h5", g_dir);
  ck_assert_int_eq(mkfifo(p, 0600), 0);
  snprintf(p, sizeof p, "%s/gone.h5", g_dir);
  ck_assert_int_eq(symlink("nowhere.h5", p), 0);
  const char *args[] = {g_dir};
  const char *want[] = {"trace.rank0.h5", "trace.rank1.h5", "trace.rank2.h5",
                        "trace.rank3.h5", "trace.rank10.h5"};
  expect_set(args, 1, want, 5, 1);
  probe_trace *t = NULL;
  snprintf(p, sizeof p, "%s/trace.rank3.h5", g_dir);
  ck_assert_int_eq(probe_trace_open(&t, p), PROBE_ERR_NOT_HDF5);
  ck_assert_ptr_nonnull(strstr(probe_trace_last_error(NULL),
                               "not a regular file"));
  set_dir_down();
}
END_TEST

START_TEST(test_set_glob_list_dedup) {
  set_dir_up();
  char pat[300], f2[300], f10[300], q[300];
  snprintf(pat, sizeof pat, "%s/trace.rank*.h5", g_dir);
  snprintf(f2, sizeof f2, "%s/trace.rank2.h5", g_dir);
  snprintf(f10, sizeof f10, "%s/trace.rank10.h5", g_dir);
  snprintf(q, sizeof q, "%s/trace.rank?.h5", g_dir);
  const char *want_all[] = {"trace.rank0.h5", "trace.rank1.h5",
                            "trace.rank2.h5", "trace.rank10.h5"};
  const char *a1[] = {pat};
  expect_set(a1, 1, want_all, 4, 1);
  /* a list, out of order, with repeats and overlapping with a glob and
   * the directory itself */
  const char *a2[] = {f10, f2, f10, pat, g_dir, f2};
  expect_set(a2, 6, want_all, 4, 1);
  const char *a3[] = {f10, f2};
  const char *want3[] = {"trace.rank2.h5", "trace.rank10.h5"};
  expect_set(a3, 2, want3, 2, 1);
  const char *a4[] = {q}; /* one character: rank10 does not match */
  const char *want4[] = {"trace.rank0.h5", "trace.rank1.h5", "trace.rank2.h5"};
  expect_set(a4, 1, want4, 3, 1);
  char br[300];
  snprintf(br, sizeof br, "%s/trace.rank[02].h5", g_dir);
  const char *a5[] = {br};
  const char *want5[] = {"trace.rank0.h5", "trace.rank2.h5"};
  expect_set(a5, 1, want5, 2, 1);
  set_dir_down();
}
END_TEST

/* Names that do not exist stay in the set (opening them reports); a file
 * whose name holds glob characters is itself, not a pattern. */
START_TEST(test_set_plain_paths) {
  set_dir_up();
  touch("odd[1].h5");
  char odd[300], missing[300];
  snprintf(odd, sizeof odd, "%s/odd[1].h5", g_dir);
  snprintf(missing, sizeof missing, "%s/trace.rank7.h5", g_dir);
  const char *a[] = {missing, odd};
  const char *want[] = {"odd[1].h5", "trace.rank7.h5"};
  expect_set(a, 2, want, 2, 1);
  set_dir_down();
}
END_TEST

START_TEST(test_set_natural_order) {
  const char *a[] = {"r/t.rank10.h5", "r/t.rank9.h5",   "r/t.rank100.h5",
                     "r/t.rank1.h5",  "r/t.rank010.h5", "q/t.rank2.h5",
                     "r/t.rank2.h5",  "r2/t.rank0.h5",  "r10/t.rank0.h5",
                     "r/t.rank1.h5"};
  const char *want[] = {"q/t.rank2.h5",   "r/t.rank1.h5",  "r/t.rank2.h5",
                        "r/t.rank9.h5",   "r/t.rank010.h5", "r/t.rank10.h5",
                        "r/t.rank100.h5", "r2/t.rank0.h5",  "r10/t.rank0.h5"};
  expect_set(a, 10, want, 9, 0);
}
END_TEST

START_TEST(test_set_errors) {
  set_dir_up();
  char **paths = (char **)1;
  size_t n = 7;
  char pat[300], empty[300];
  snprintf(pat, sizeof pat, "%s/nothing*.h5", g_dir);
  const char *a1[] = {pat};
  ck_assert_int_eq(probe_trace_set_expand(a1, 1, &paths, &n),
                   PROBE_ERR_NOT_FOUND);
  ck_assert_ptr_null(paths);
  ck_assert_uint_eq(n, 0);
  ck_assert_ptr_nonnull(strstr(probe_trace_last_error(NULL), pat));
  ck_assert_ptr_nonnull(
      strstr(probe_trace_last_error(NULL), "no such file, and no file matches"));
  /* one good arg does not excuse a pattern that matches nothing */
  const char *a2[] = {g_dir, pat};
  ck_assert_int_eq(probe_trace_set_expand(a2, 2, &paths, &n),
                   PROBE_ERR_NOT_FOUND);
  snprintf(empty, sizeof empty, "%s/empty", g_dir);
  const char *a3[] = {empty};
  ck_assert_int_eq(probe_trace_set_expand(a3, 1, &paths, &n),
                   PROBE_ERR_NOT_FOUND);
  ck_assert_ptr_nonnull(strstr(probe_trace_last_error(NULL), empty));
  ck_assert_int_eq(probe_trace_set_expand(a3, 0, &paths, &n),
                   PROBE_ERR_NOT_FOUND);
  ck_assert_int_eq(probe_trace_set_expand(NULL, 1, &paths, &n),
                   PROBE_ERR_INVALID_ARG);
  ck_assert_int_eq(probe_trace_set_expand(a3, 1, NULL, &n),
                   PROBE_ERR_INVALID_ARG);
  const char *a4[] = {""};
  ck_assert_int_eq(probe_trace_set_expand(a4, 1, &paths, &n),
                   PROBE_ERR_INVALID_ARG);
  probe_trace_set_free(NULL, 0);
  set_dir_down();
}
END_TEST

/* ---- rank attributes ---------------------------------------------------- */

#define DIGEST_BASE 0xdeadbeef00000000u /* the steps' digests count up */

static void write_small(const char *path, const probe_options *o, int steps) {
  probe_session *s;
  PT_CHECK(probe_session_open(&s, path, o));
  int32_t id;
  PT_CHECK(probe_layer_register(s, "fc", PROBE_KIND_LINEAR, PROBE_DTYPE_F16,
                                &id));
  float x[16];
  for (int step = 0; step < steps; step++) {
    PT_CHECK(probe_step_begin(s, step));
    pt_tensor(x, 16, step, 0);
    PT_CHECK(probe_tensor_record(s, id, PROBE_SITE_GRAD_PRE_ALLREDUCE,
                                 PROBE_DTYPE_F32, x, 16));
    pt_tensor(x, 16, step, 1);
    PT_CHECK(probe_tensor_record(s, id, PROBE_SITE_GRAD_POST_ALLREDUCE,
                                 PROBE_DTYPE_F32, x, 16));
    probe_step_scalars sc = {.loss = 1.0, .loss_scale = 65536, .lr = 1e-3,
                             .weight_digest = DIGEST_BASE + (uint64_t)step,
                             .unmeasured = PROBE_SCALAR_GRAD_NORM |
                                           PROBE_SCALAR_CLIP};
    PT_CHECK(probe_step_set_scalars(s, &sc));
    PT_CHECK(probe_step_end(s));
  }
  PT_CHECK(probe_session_close(s));
}

START_TEST(test_rank_roundtrip) {
  char path[256];
  pt_path(path, sizeof path, "rank-rt");
  unlink(path);
  probe_options o;
  probe_options_init(&o);
  ck_assert_int_eq(o.rank, -1);
  ck_assert_int_eq(o.world_size, 0);
  ck_assert_ptr_null(o.run_id);
  o.mode = PROBE_MODE_FULL;
  o.rank = 3;
  o.world_size = 8;
  char run_id[80];
  snprintf(run_id, sizeof run_id, "job-42.a_B");
  o.run_id = run_id;
  write_small(path, &o, 3);
  for (int iso = 0; iso < 2; iso++) {
    probe_trace *t;
    char err[256];
    if (iso) PT_CHECK(probe_trace_open_isolated(&t, path, err, sizeof err));
    else PT_CHECK(probe_trace_open(&t, path));
    const probe_trace_info *in = probe_trace_get_info(t);
    ck_assert_int_eq(in->rank, 3);
    ck_assert_int_eq(in->world_size, 8);
    ck_assert_str_eq(in->run_id, "job-42.a_B");
    probe_record r[8];
    size_t got;
    PT_CHECK(probe_trace_read_records(t, 0, 8, r, &got));
    ck_assert_uint_eq(got, 6);
    for (int i = 0; i < 6; i++)
      ck_assert_int_eq(r[i].site, i % 2 ? PROBE_SITE_GRAD_POST_ALLREDUCE
                                        : PROBE_SITE_GRAD_PRE_ALLREDUCE);
    probe_step_scalars sc[4];
    PT_CHECK(probe_trace_read_steps(t, 0, 4, sc, &got));
    ck_assert_uint_eq(got, 3);
    for (int i = 0; i < 3; i++) {
      ck_assert_uint_eq(sc[i].weight_digest, DIGEST_BASE + (uint64_t)i);
      ck_assert_uint_eq(sc[i].unmeasured,
                        PROBE_SCALAR_GRAD_NORM | PROBE_SCALAR_CLIP);
    }
    probe_trace_close(t);
  }
  /* the session copied run_id: changing the caller's buffer changes nothing */
  unlink(path);
  snprintf(run_id, sizeof run_id, "r");
  o.rank = 0;
  o.world_size = 1;
  probe_session *s;
  PT_CHECK(probe_session_open(&s, path, &o));
  snprintf(run_id, sizeof run_id, "bad id!");
  PT_CHECK(probe_session_close(s));
  probe_trace *t;
  PT_CHECK(probe_trace_open(&t, path));
  ck_assert_str_eq(probe_trace_get_info(t)->run_id, "r");
  ck_assert_int_eq(probe_trace_get_info(t)->rank, 0);
  ck_assert_int_eq(probe_trace_get_info(t)->world_size, 1);
  probe_trace_close(t);
  /* defaults: -1, 0, "" */
  unlink(path);
  PT_CHECK(probe_session_open(&s, path, NULL));
  PT_CHECK(probe_session_close(s));
  PT_CHECK(probe_trace_open(&t, path));
  ck_assert_int_eq(probe_trace_get_info(t)->rank, -1);
  ck_assert_int_eq(probe_trace_get_info(t)->world_size, 0);
  ck_assert_str_eq(probe_trace_get_info(t)->run_id, "");
  probe_trace_close(t);
  unlink(path);
}
END_TEST

static const struct {
  int rank, world;
  const char *run_id;
  int ok;
} rank_cases[] = {
    {-1, 0, NULL, 1},  {0, 1, NULL, 1},   {1023, 1024, "x", 1},
    {-1, 0, "", 1},    {0, 0, NULL, 0},   {-1, 4, NULL, 0},
    {4, 4, NULL, 0},   {5, 3, NULL, 0},   {-2, 0, NULL, 0},
    {0, -1, NULL, 0},  {-1, 1, NULL, 0},  {0, 2, "has space", 0},
    {0, 2, "a/b", 0},  {0, 2, "é", 0},    {0, 2, "tab\t", 0},
    {0, 2, "{rank}", 0},
    {0, 2, "0123456789012345678901234567890123456789012345678901234567890123",
     1}, /* 64 characters */
    {0, 2, "01234567890123456789012345678901234567890123456789012345678901234",
     0}, /* 65 */
};

START_TEST(test_rank_options_checked) {
  char path[256];
  pt_path(path, sizeof path, "rank-opt");
  unlink(path);
  probe_options o;
  probe_options_init(&o);
  o.rank = rank_cases[_i].rank;
  o.world_size = rank_cases[_i].world;
  o.run_id = rank_cases[_i].run_id;
  probe_session *s = (probe_session *)1;
  probe_status st = probe_session_open(&s, path, &o);
  if (rank_cases[_i].ok) {
    PT_CHECK(st);
    PT_CHECK(probe_session_close(s));
    probe_trace *t;
    PT_CHECK(probe_trace_open(&t, path));
    ck_assert_int_eq(probe_trace_get_info(t)->rank, o.rank);
    ck_assert_int_eq(probe_trace_get_info(t)->world_size, o.world_size);
    ck_assert_str_eq(probe_trace_get_info(t)->run_id, o.run_id ? o.run_id : "");
    probe_trace_close(t);
  } else {
    ck_assert_int_eq(st, PROBE_ERR_INVALID_ARG);
    ck_assert_ptr_null(s);
    const char *msg = probe_session_last_error(NULL);
    ck_assert_msg(strstr(msg, o.run_id && rank_cases[_i].rank == 0 ? "run_id"
                                                                   : "rank"),
                  "message: %s", msg);
    ck_assert_int_eq(access(path, F_OK), -1); /* nothing created */
  }
  unlink(path);
}
END_TEST

/* Attribute edits through HDF5: a trace with rank attributes out of range,
 * half of them, or a bad run id is corrupt, for both opens. */
static void edit_attr_i32(const char *path, const char *name, int32_t v,
                          int del) {
  hid_t f = H5Fopen(path, H5F_ACC_RDWR, H5P_DEFAULT);
  ck_assert_int_ge(f, 0);
  if (H5Aexists(f, name) > 0) ck_assert_int_ge(H5Adelete(f, name), 0);
  if (!del) {
    hid_t sp = H5Screate(H5S_SCALAR);
    hid_t a = H5Acreate2(f, name, H5T_STD_I32LE, sp, H5P_DEFAULT, H5P_DEFAULT);
    ck_assert_int_ge(H5Awrite(a, H5T_NATIVE_INT32, &v), 0);
    H5Aclose(a);
    H5Sclose(sp);
  }
  H5Fclose(f);
}

static void edit_run_id(const char *path, const char *v) {
  hid_t f = H5Fopen(path, H5F_ACC_RDWR, H5P_DEFAULT);
  ck_assert_int_ge(f, 0);
  ck_assert_int_ge(H5Adelete(f, "run_id"), 0);
  hid_t t = H5Tcopy(H5T_C_S1);
  H5Tset_size(t, H5T_VARIABLE);
  hid_t sp = H5Screate(H5S_SCALAR);
  hid_t a = H5Acreate2(f, "run_id", t, sp, H5P_DEFAULT, H5P_DEFAULT);
  ck_assert_int_ge(H5Awrite(a, t, &v), 0);
  H5Aclose(a);
  H5Sclose(sp);
  H5Tclose(t);
  H5Fclose(f);
}

static void expect_open(const char *path, probe_status want, const char *what) {
  probe_trace *t = NULL;
  char err[512];
  probe_status st = probe_trace_open(&t, path);
  ck_assert_msg(st == want, "%s: open -> %s (%s)", what, probe_status_name(st),
                probe_trace_last_error(NULL));
  probe_trace_close(t);
  t = NULL;
  st = probe_trace_open_isolated(&t, path, err, sizeof err);
  ck_assert_msg(st == want, "%s: isolated -> %s (%s)", what,
                probe_status_name(st), err);
  probe_trace_close(t);
}

START_TEST(test_rank_attrs_validated) {
  char path[256];
  pt_path(path, sizeof path, "rank-edit");
  H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
  probe_options o;
  probe_options_init(&o);
  o.rank = 1;
  o.world_size = 4;
  o.run_id = "run7";
  static const struct {
    const char *name;
    int32_t v;
    int del;
    probe_status want;
  } edits[] = {
      {"rank", 4, 0, PROBE_ERR_CORRUPT},
      {"rank", -1, 0, PROBE_ERR_CORRUPT},
      {"rank", 3, 0, PROBE_OK},
      {"world_size", 1, 0, PROBE_ERR_CORRUPT},
      {"world_size", 0, 0, PROBE_ERR_CORRUPT},
      {"world_size", 0, 1, PROBE_ERR_CORRUPT},
      {"rank", 0, 1, PROBE_ERR_CORRUPT},
      {"world_size", 2, 0, PROBE_OK},
  };
  for (size_t i = 0; i < sizeof edits / sizeof edits[0]; i++) {
    unlink(path);
    write_small(path, &o, 2);
    edit_attr_i32(path, edits[i].name, edits[i].v, edits[i].del);
    char what[64];
    snprintf(what, sizeof what, "%s=%d%s", edits[i].name, edits[i].v,
             edits[i].del ? " deleted" : "");
    expect_open(path, edits[i].want, what);
  }
  /* both deleted: an older writer's trace, -1 / 0 */
  unlink(path);
  write_small(path, &o, 2);
  edit_attr_i32(path, "rank", 0, 1);
  edit_attr_i32(path, "world_size", 0, 1);
  expect_open(path, PROBE_OK, "both deleted");
  static const char *const bad_ids[] = {"white space", "a/b", "x;rm"};
  for (size_t i = 0; i < 3; i++) {
    unlink(path);
    write_small(path, &o, 2);
    edit_run_id(path, bad_ids[i]);
    expect_open(path, PROBE_ERR_CORRUPT, bad_ids[i]);
  }
  unlink(path);
}
END_TEST

/* The pieces together, as a job and a tool use them: each rank's path by
 * the naming rule, the set expanded from the directory comes back in rank
 * order (rank 10 after rank 2), each file with its rank and the run id. */
START_TEST(test_rank_set_end_to_end) {
  set_dir_up();
  char base[300], path[400];
  snprintf(base, sizeof base, "%s/empty/run.h5", g_dir);
  static const int ranks[] = {10, 2, 0, 1};
  probe_options o;
  probe_options_init(&o);
  o.world_size = 11;
  o.run_id = "e2e";
  for (int i = 0; i < 4; i++) {
    PT_CHECK(probe_rank_trace_path(path, sizeof path, base, ranks[i]));
    o.rank = ranks[i];
    write_small(path, &o, 2);
  }
  char dir[300];
  snprintf(dir, sizeof dir, "%s/empty", g_dir);
  const char *args[] = {dir};
  char **paths;
  size_t n;
  PT_CHECK(probe_trace_set_expand(args, 1, &paths, &n));
  ck_assert_uint_eq(n, 4);
  static const int want[] = {0, 1, 2, 10};
  for (size_t i = 0; i < n; i++) {
    char w[400];
    snprintf(w, sizeof w, "%s/run.rank%d.h5", dir, want[i]);
    ck_assert_str_eq(paths[i], w);
    probe_trace *t;
    PT_CHECK(probe_trace_open(&t, paths[i]));
    ck_assert_int_eq(probe_trace_get_info(t)->rank, want[i]);
    ck_assert_int_eq(probe_trace_get_info(t)->world_size, 11);
    ck_assert_str_eq(probe_trace_get_info(t)->run_id, "e2e");
    probe_trace_close(t);
  }
  probe_trace_set_free(paths, n);
  set_dir_down();
}
END_TEST

/* ---- the weight digest --------------------------------------------------- */

/* FNV-1a 64 written another way: the prime 2^40 + 2^8 + 0xb3 as shifts. */
static uint64_t ref_fnv1a(const unsigned char *p, size_t n, uint64_t h) {
  for (size_t i = 0; i < n; i++) {
    h ^= p[i];
    h = (h << 40) + (h << 8) + h * 0xb3u;
  }
  return h;
}

START_TEST(test_digest_known_values) {
  /* the FNV-1a 64 test vectors of its authors (also from Python here) */
  ck_assert_uint_eq(PROBE_DIGEST64_INIT, 0xcbf29ce484222325u);
  ck_assert_uint_eq(probe_digest64("", 0, PROBE_DIGEST64_INIT),
                    0xcbf29ce484222325u);
  ck_assert_uint_eq(probe_digest64(NULL, 0, PROBE_DIGEST64_INIT),
                    0xcbf29ce484222325u);
  ck_assert_uint_eq(probe_digest64("a", 1, PROBE_DIGEST64_INIT),
                    0xaf63dc4c8601ec8cu);
  ck_assert_uint_eq(probe_digest64("foobar", 6, PROBE_DIGEST64_INIT),
                    0x85944171f73967e8u);
  /* chained: "foo" then "bar" is "foobar" */
  ck_assert_uint_eq(
      probe_digest64("bar", 3, probe_digest64("foo", 3, PROBE_DIGEST64_INIT)),
      0x85944171f73967e8u);
  /* float32 weights: values computed with Python's struct ("<4f") */
  float w[4] = {1.0f, -2.5f, 0.0f, 3.14159274101257324f};
  ck_assert_uint_eq(probe_digest64(w, sizeof w, PROBE_DIGEST64_INIT),
                    0xad0a80006562ed43u);
  float p1[1] = {1.0f}, p2[2] = {0.5f, 0.25f};
  ck_assert_uint_eq(
      probe_digest64(p2, sizeof p2, probe_digest64(p1, sizeof p1,
                                                   PROBE_DIGEST64_INIT)),
      0x472029b72f92177bu);
  /* a one-bit change (-0.0 for 0.0) changes it */
  w[2] = -0.0f;
  ck_assert_uint_ne(probe_digest64(w, sizeof w, PROBE_DIGEST64_INIT),
                    0xad0a80006562ed43u);
  /* random buffers against the independent implementation */
  unsigned char buf[4096];
  uint32_t h = 12345;
  for (size_t i = 0; i < sizeof buf; i++) {
    h = h * 1664525u + 1013904223u;
    buf[i] = (unsigned char)(h >> 24);
  }
  for (size_t n = 0; n <= sizeof buf; n = n * 3 + 1)
    ck_assert_uint_eq(probe_digest64(buf, n, PROBE_DIGEST64_INIT),
                      ref_fnv1a(buf, n, PROBE_DIGEST64_INIT));
  ck_assert_uint_eq(probe_digest64(buf, 100, 7), ref_fnv1a(buf, 100, 7));
}
END_TEST

/* A digest left at 0 is "not measured" (callers that predate the field). */
START_TEST(test_digest_zero_unmeasured) {
  char path[256];
  pt_path(path, sizeof path, "digest0");
  unlink(path);
  probe_session *s;
  PT_CHECK(probe_session_open(&s, path, NULL));
  for (int i = 0; i < 3; i++) {
    PT_CHECK(probe_step_begin(s, i));
    probe_step_scalars sc = {.loss = 1, .weight_digest = i == 1 ? 77u : 0u};
    PT_CHECK(probe_step_set_scalars(s, &sc));
    PT_CHECK(probe_step_end(s));
  }
  PT_CHECK(probe_session_close(s));
  probe_trace *t;
  PT_CHECK(probe_trace_open(&t, path));
  probe_step_scalars out[3];
  size_t got;
  PT_CHECK(probe_trace_read_steps(t, 0, 3, out, &got));
  ck_assert_uint_eq(got, 3);
  ck_assert_uint_eq(out[0].unmeasured, PROBE_SCALAR_WEIGHT_DIGEST);
  ck_assert_uint_eq(out[1].unmeasured, 0);
  ck_assert_uint_eq(out[1].weight_digest, 77);
  ck_assert_uint_eq(out[2].unmeasured, PROBE_SCALAR_WEIGHT_DIGEST);
  probe_trace_close(t);
  unlink(path);
}
END_TEST

/* The trace of the writer at 7164ce6 (80-byte /steps rows with
 * `unmeasured`, no weight_digest, no rank attributes): every bit it wrote
 * reads back, plus the digest's. */
START_TEST(test_old_trace_2026_12) {
  for (int iso = 0; iso < 2; iso++) {
    probe_trace *t;
    char err[512];
    const char *p = PT_DATA_DIR "/trace-v1-2026-12.h5";
    if (iso) PT_CHECK(probe_trace_open_isolated(&t, p, err, sizeof err));
    else PT_CHECK(probe_trace_open(&t, p));
    const probe_trace_info *in = probe_trace_get_info(t);
    ck_assert_int_eq(in->rank, -1);
    ck_assert_int_eq(in->world_size, 0);
    ck_assert_str_eq(in->run_id, "");
    ck_assert_int_eq(in->n_steps, 5);
    probe_step_scalars out[5];
    memset(out, 0xff, sizeof out); /* the reader must clear the field */
    size_t got;
    PT_CHECK(probe_trace_read_steps(t, 0, 5, out, &got));
    ck_assert_uint_eq(got, 5);
    static const uint32_t want[5] = {
        0, PROBE_SCALAR_GRAD_NORM | PROBE_SCALAR_CLIP, 0, PROBE_SCALAR_LR, 0};
    for (int i = 0; i < 5; i++) {
      ck_assert_uint_eq(out[i].unmeasured,
                        want[i] | PROBE_SCALAR_WEIGHT_DIGEST);
      ck_assert_uint_eq(out[i].weight_digest, 0);
      ck_assert_int_eq(out[i].step, i);
      ck_assert(i == 4 ? isnan(out[i].loss) : out[i].loss == 0.5);
    }
    ck_assert_int_eq(in->first_nonfinite_step, 4);
    /* written before the join mark: its state entry 15 ("reserved") is 0,
     * read as not joined, the trace complete as it was */
    ck_assert_int_eq(in->joined, 0);
    ck_assert_int_eq(in->complete, 1);
    probe_trace_close(t);
  }
}
END_TEST

/* ---- the join mark (probe_session_mark_joined) ---------------------------- */

/* Rank `rank` of 2 ending steps 0..last (-1: none) with scalars. */
static probe_session *join_open(const char *path, int64_t last) {
  probe_options o;
  probe_options_init(&o);
  o.overwrite = 1;
  o.rank = 0;
  o.world_size = 2;
  o.run_id = "join-1";
  probe_session *s;
  PT_CHECK(probe_session_open(&s, path, &o));
  for (int64_t k = 0; k <= last; k++) {
    PT_CHECK(probe_step_begin(s, k));
    probe_step_scalars sc = {.loss = 1.0, .loss_scale = 1.0};
    PT_CHECK(probe_step_set_scalars(s, &sc));
    PT_CHECK(probe_step_end(s));
  }
  return s;
}

/* The trace's (complete, joined, last_step), read both ways. */
static void join_expect(const char *path, int complete, int joined,
                        int64_t last) {
  for (int iso = 0; iso < 2; iso++) {
    probe_trace *t;
    char err[512];
    if (iso) PT_CHECK(probe_trace_open_isolated(&t, path, err, sizeof err));
    else PT_CHECK(probe_trace_open(&t, path));
    const probe_trace_info *in = probe_trace_get_info(t);
    ck_assert_int_eq(in->complete, complete);
    ck_assert_int_eq(in->joined, joined);
    ck_assert_int_eq(in->last_step, last);
    probe_trace_close(t);
  }
}

/* Marked after the last step, then closed: complete and joined; the state's
 * entry 15 is named `joined` (h5py readers find it by name). */
START_TEST(test_join_mark_roundtrip) {
  char path[256];
  pt_path(path, sizeof path, "join-rt");
  probe_session *s = join_open(path, 2);
  PT_CHECK(probe_session_mark_joined(s));
  PT_CHECK(probe_session_mark_joined(s)); /* again: no change */
  PT_CHECK(probe_session_close(s));
  join_expect(path, 1, 1, 2);
  hid_t f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
  ck_assert_int_ge(f, 0);
  hid_t d = H5Dopen2(f, "/meta/state", H5P_DEFAULT);
  int64_t st[16];
  ck_assert_int_ge(H5Dread(d, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL,
                           H5P_DEFAULT, st), 0);
  ck_assert_int_eq(st[15], 1);
  hid_t a = H5Aopen(d, "fields", H5P_DEFAULT);
  hid_t ty = H5Aget_type(a);
  char *fields = NULL;
  ck_assert_int_ge(H5Aread(a, ty, &fields), 0);
  size_t n = strlen(fields);
  ck_assert_msg(n > 7 && !strcmp(fields + n - 7, ",joined"), "%s", fields);
  H5free_memory(fields);
  H5Tclose(ty);
  H5Aclose(a);
  H5Dclose(d);
  H5Fclose(f);
  /* never marked: 0 */
  s = join_open(path, 2);
  PT_CHECK(probe_session_close(s));
  join_expect(path, 1, 0, 2);
  /* a rank with no batch at all joins before its first step */
  s = join_open(path, -1);
  PT_CHECK(probe_session_mark_joined(s));
  PT_CHECK(probe_session_close(s));
  join_expect(path, 1, 1, -1);
  unlink(path);
}
END_TEST

/* A step begun after the mark clears it (the rank is back: the next epoch
 * under join()); inside a step the mark is refused, saying why, and the
 * session goes on. */
START_TEST(test_join_mark_cleared_and_refused) {
  char path[256];
  pt_path(path, sizeof path, "join-clear");
  probe_session *s = join_open(path, 2);
  PT_CHECK(probe_session_mark_joined(s));
  PT_CHECK(probe_session_flush(s)); /* committed once with the mark */
  PT_CHECK(probe_step_begin(s, 5));
  ck_assert_int_eq(probe_session_mark_joined(s), PROBE_ERR_STATE);
  ck_assert_ptr_nonnull(strstr(probe_session_last_error(s), "inside step 5"));
  PT_CHECK(probe_step_end(s));
  PT_CHECK(probe_session_close(s));
  join_expect(path, 1, 0, 5);
  /* marked again after the second epoch's last step: joined */
  s = join_open(path, 2);
  PT_CHECK(probe_session_mark_joined(s));
  PT_CHECK(probe_step_begin(s, 5));
  PT_CHECK(probe_step_end(s));
  PT_CHECK(probe_session_mark_joined(s));
  PT_CHECK(probe_session_close(s));
  join_expect(path, 1, 1, 5);
  ck_assert_int_eq(probe_session_mark_joined(NULL), PROBE_ERR_INVALID_ARG);
  unlink(path);
}
END_TEST

/* Marked, flushed, then the writer dies without closing: the mark is on
 * disk, the trace is not complete (the post-mortem's "not closed"). */
START_TEST(test_join_mark_killed) {
  char path[256];
  pt_path(path, sizeof path, "join-killed");
  pid_t pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) {
    probe_options o;
    probe_options_init(&o);
    o.overwrite = 1;
    o.rank = 1;
    o.world_size = 2;
    probe_session *s;
    if (probe_session_open(&s, path, &o) != PROBE_OK) _exit(2);
    for (int k = 0; k < 3; k++) {
      probe_step_scalars sc = {.loss = 1.0, .loss_scale = 1.0};
      if (probe_step_begin(s, k) || probe_step_set_scalars(s, &sc) ||
          probe_step_end(s))
        _exit(3);
    }
    if (probe_session_mark_joined(s) != PROBE_OK) _exit(4);
    if (probe_session_flush(s) != PROBE_OK) _exit(5);
    _exit(0);
  }
  int ws = 0;
  ck_assert_int_eq(waitpid(pid, &ws, 0), pid);
  ck_assert_msg(WIFEXITED(ws) && WEXITSTATUS(ws) == 0, "child: %d", ws);
  join_expect(path, 0, 1, 2);
  unlink(path);
}
END_TEST

/* ---- the abort mark (probe_session_mark_aborted) -------------------------- */

/* The trace's (complete, aborted, aborted_step, last_step), read both ways. */
static void abort_expect(const char *path, int complete, const char *aborted,
                         int64_t aborted_step, int64_t last) {
  for (int iso = 0; iso < 2; iso++) {
    probe_trace *t;
    char err[512];
    if (iso) PT_CHECK(probe_trace_open_isolated(&t, path, err, sizeof err));
    else PT_CHECK(probe_trace_open(&t, path));
    const probe_trace_info *in = probe_trace_get_info(t);
    ck_assert_int_eq(in->complete, complete);
    ck_assert_ptr_nonnull(in->aborted);
    ck_assert_str_eq(in->aborted, aborted);
    ck_assert_int_eq(in->aborted_step, aborted_step);
    ck_assert_int_eq(in->last_step, last);
    probe_trace_close(t);
  }
}

/* Marked between steps: every row written, complete 0, the reason and
 * step -1; marked inside a step: that step is closed half done and named;
 * a second mark changes nothing; never marked: "" and -1, complete. */
START_TEST(test_abort_mark_roundtrip) {
  char path[256];
  pt_path(path, sizeof path, "abort-rt");
  probe_session *s = join_open(path, 2);
  PT_CHECK(probe_session_mark_aborted(s, "signal SIGTERM"));
  PT_CHECK(probe_session_mark_aborted(s, "KeyboardInterrupt")); /* first wins */
  PT_CHECK(probe_session_close(s));
  abort_expect(path, 0, "signal SIGTERM", -1, 2);
  probe_trace *t;
  PT_CHECK(probe_trace_open(&t, path));
  ck_assert_int_eq(probe_trace_get_info(t)->n_steps, 3);
  probe_trace_close(t);
  /* inside step 3 (its scalars not set yet) */
  s = join_open(path, 2);
  PT_CHECK(probe_step_begin(s, 3));
  PT_CHECK(probe_session_mark_aborted(s, "RuntimeError"));
  PT_CHECK(probe_session_close(s));
  abort_expect(path, 0, "RuntimeError", 3, 3);
  /* the step ended after the mark: the mark still names step 3 */
  s = join_open(path, 2);
  PT_CHECK(probe_step_begin(s, 3));
  PT_CHECK(probe_session_mark_aborted(s, "ValueError"));
  PT_CHECK(probe_step_end(s));
  PT_CHECK(probe_session_mark_aborted(s, "SystemExit")); /* ignored */
  PT_CHECK(probe_session_close(s));
  abort_expect(path, 0, "ValueError", 3, 3);
  /* before the first step */
  s = join_open(path, -1);
  PT_CHECK(probe_session_mark_aborted(s, "OSError"));
  PT_CHECK(probe_session_close(s));
  abort_expect(path, 0, "OSError", -1, -1);
  /* never marked */
  s = join_open(path, 2);
  PT_CHECK(probe_session_close(s));
  abort_expect(path, 1, "", -1, 2);
  /* the attributes exist in every new trace, empty until a mark */
  hid_t f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
  ck_assert_int_ge(f, 0);
  ck_assert_int_gt(H5Aexists(f, "aborted"), 0);
  ck_assert_int_gt(H5Aexists(f, "aborted_step"), 0);
  H5Fclose(f);
  unlink(path);
}
END_TEST

/* NULL session, NULL or empty reason: refused, the session goes on
 * unmarked. */
START_TEST(test_abort_mark_refused) {
  char path[256];
  pt_path(path, sizeof path, "abort-refused");
  probe_session *s = join_open(path, 1);
  ck_assert_int_eq(probe_session_mark_aborted(NULL, "x"), PROBE_ERR_INVALID_ARG);
  ck_assert_int_eq(probe_session_mark_aborted(s, NULL), PROBE_ERR_INVALID_ARG);
  ck_assert_int_eq(probe_session_mark_aborted(s, ""), PROBE_ERR_INVALID_ARG);
  PT_CHECK(probe_session_close(s));
  abort_expect(path, 1, "", -1, 1);
  unlink(path);
}
END_TEST

/* A reason longer than PROBE_ABORT_REASON_MAX - 1 bytes is cut, never in
 * the middle of a UTF-8 character; one that fits is kept whole. */
START_TEST(test_abort_mark_long_reason) {
  char path[256];
  pt_path(path, sizeof path, "abort-long");
  char r[600];
  /* 2-byte characters: the cut at 255 bytes falls inside the 128th */
  size_t n = 0;
  while (n + 2 < sizeof r) {
    r[n++] = (char)0xC3;
    r[n++] = (char)0xA9; /* U+00E9 */
  }
  r[n] = '\0';
  probe_session *s = join_open(path, 0);
  PT_CHECK(probe_session_mark_aborted(s, r));
  PT_CHECK(probe_session_close(s));
  char want[PROBE_ABORT_REASON_MAX];
  ck_assert_uint_eq((unsigned char)r[255], 0xA9); /* a continuation byte */
  memcpy(want, r, 254); /* 127 whole characters */
  want[254] = '\0';
  abort_expect(path, 0, want, -1, 0);
  /* 3-byte characters, cut at 255 falls on a boundary after 'ab' + 84 */
  n = 0;
  r[n++] = 'a';
  r[n++] = 'b';
  while (n + 3 < sizeof r) {
    r[n++] = (char)0xE2;
    r[n++] = (char)0x82;
    r[n++] = (char)0xAC; /* U+20AC */
  }
  r[n] = '\0';
  s = join_open(path, 0);
  PT_CHECK(probe_session_mark_aborted(s, r));
  PT_CHECK(probe_session_close(s));
  memcpy(want, r, 254); /* 2 + 84 * 3 */
  want[254] = '\0';
  abort_expect(path, 0, want, -1, 0);
  /* exactly 255 bytes: kept whole */
  memset(r, 'x', 255);
  r[255] = '\0';
  s = join_open(path, 0);
  PT_CHECK(probe_session_mark_aborted(s, r));
  PT_CHECK(probe_session_close(s));
  abort_expect(path, 0, r, -1, 0);
  unlink(path);
}
END_TEST

/* Rewrites the root attribute `aborted` of a closed trace in place (its
 * fixed-size string type kept). */
static void abort_patch(const char *path, const char *reason, int64_t step) {
  hid_t f = H5Fopen(path, H5F_ACC_RDWR, H5P_DEFAULT);
  ck_assert_int_ge(f, 0);
  hid_t a = H5Aopen(f, "aborted", H5P_DEFAULT);
  ck_assert_int_ge(a, 0);
  hid_t ty = H5Aget_type(a);
  char buf[PROBE_ABORT_REASON_MAX] = {0};
  snprintf(buf, sizeof buf, "%s", reason);
  ck_assert_int_ge(H5Awrite(a, ty, buf), 0);
  H5Tclose(ty);
  H5Aclose(a);
  a = H5Aopen(f, "aborted_step", H5P_DEFAULT);
  ck_assert_int_ge(a, 0);
  ck_assert_int_ge(H5Awrite(a, H5T_NATIVE_INT64, &step), 0);
  H5Aclose(a);
  H5Fclose(f);
}

/* No writer leaves a reason on a complete trace: such a file is corrupt,
 * saying why; a bad aborted_step is corrupt too. */
START_TEST(test_abort_mark_on_complete_is_corrupt) {
  char path[256];
  pt_path(path, sizeof path, "abort-corrupt");
  probe_session *s = join_open(path, 2);
  PT_CHECK(probe_session_close(s));
  abort_patch(path, "signal SIGTERM", -1);
  for (int iso = 0; iso < 2; iso++) {
    probe_trace *t = NULL;
    char err[512] = "";
    probe_status st = iso ? probe_trace_open_isolated(&t, path, err, sizeof err)
                          : probe_trace_open(&t, path);
    ck_assert_int_eq(st, PROBE_ERR_CORRUPT);
    if (iso) ck_assert_msg(strstr(err, "abort mark"), "%s", err);
  }
  /* an aborted trace whose step is below -1 */
  s = join_open(path, 2);
  PT_CHECK(probe_session_mark_aborted(s, "signal SIGINT"));
  PT_CHECK(probe_session_close(s));
  abort_patch(path, "signal SIGINT", -7);
  probe_trace *t = NULL;
  ck_assert_int_eq(probe_trace_open(&t, path), PROBE_ERR_CORRUPT);
  unlink(path);
}
END_TEST

/* Traces written before the mark (2026-11 and 2026-12 fixtures) have no
 * such attributes: not aborted ("" and -1), complete as they were. */
START_TEST(test_abort_mark_old_traces) {
  static const char *const old[] = {PT_DATA_DIR "/trace-v1-2026-11.h5",
                                    PT_DATA_DIR "/trace-v1-2026-12.h5"};
  for (int k = 0; k < 2; k++) {
    hid_t f = H5Fopen(old[k], H5F_ACC_RDONLY, H5P_DEFAULT);
    ck_assert_int_ge(f, 0);
    ck_assert_int_eq(H5Aexists(f, "aborted"), 0);
    H5Fclose(f);
    for (int iso = 0; iso < 2; iso++) {
      probe_trace *t;
      char err[512];
      if (iso) PT_CHECK(probe_trace_open_isolated(&t, old[k], err, sizeof err));
      else PT_CHECK(probe_trace_open(&t, old[k]));
      const probe_trace_info *in = probe_trace_get_info(t);
      ck_assert_ptr_nonnull(in->aborted);
      ck_assert_str_eq(in->aborted, "");
      ck_assert_int_eq(in->aborted_step, -1);
      ck_assert_int_eq(in->complete, 1);
      probe_trace_close(t);
    }
  }
}
END_TEST

/* ---- the two sites ------------------------------------------------------- */

START_TEST(test_allreduce_sites) {
  ck_assert_str_eq(probe_site_name(PROBE_SITE_GRAD_PRE_ALLREDUCE),
                   "grad_pre_allreduce");
  ck_assert_str_eq(probe_site_name(PROBE_SITE_GRAD_POST_ALLREDUCE),
                   "grad_post_allreduce");
  ck_assert_int_eq(PROBE_SITE_GRAD_PRE_ALLREDUCE, 8); /* appended: ids stay */
  ck_assert_int_eq(PROBE_SITE_GRAD_POST_ALLREDUCE, 9);
  ck_assert_int_eq(PROBE_SITE_COUNT, 10);
  probe_site s;
  PT_CHECK(probe_site_parse("grad_post_allreduce", &s));
  ck_assert_int_eq(s, PROBE_SITE_GRAD_POST_ALLREDUCE);
  ck_assert_int_eq(probe_site_phase(PROBE_SITE_GRAD_PRE_ALLREDUCE),
                   PROBE_PHASE_BACKWARD);
  ck_assert_int_eq(probe_site_phase(PROBE_SITE_GRAD_POST_ALLREDUCE),
                   PROBE_PHASE_BACKWARD);
}
END_TEST

static Suite *make_suite(void) {
  Suite *s = suite_create("rank");
  TCase *tn = tcase_create("naming");
  tcase_add_test(tn, test_name_rule);
  tcase_add_test(tn, test_name_errors);
  suite_add_tcase(s, tn);
  TCase *ts = tcase_create("sets");
  tcase_add_test(ts, test_set_dir);
  tcase_add_test(ts, test_set_dir_fifo);
  tcase_add_test(ts, test_set_glob_list_dedup);
  tcase_add_test(ts, test_set_plain_paths);
  tcase_add_test(ts, test_set_natural_order);
  tcase_add_test(ts, test_set_errors);
  suite_add_tcase(s, ts);
  TCase *tr = tcase_create("attributes");
  tcase_set_timeout(tr, 120);
  tcase_add_test(tr, test_rank_roundtrip);
  tcase_add_loop_test(tr, test_rank_options_checked, 0,
                      (int)(sizeof rank_cases / sizeof rank_cases[0]));
  tcase_add_test(tr, test_rank_attrs_validated);
  tcase_add_test(tr, test_allreduce_sites);
  tcase_add_test(tr, test_rank_set_end_to_end);
  suite_add_tcase(s, tr);
  TCase *tj = tcase_create("join");
  tcase_set_timeout(tj, 60);
  tcase_add_test(tj, test_join_mark_roundtrip);
  tcase_add_test(tj, test_join_mark_cleared_and_refused);
  tcase_add_test(tj, test_join_mark_killed);
  suite_add_tcase(s, tj);
  TCase *ta = tcase_create("abort");
  tcase_set_timeout(ta, 60);
  tcase_add_test(ta, test_abort_mark_roundtrip);
  tcase_add_test(ta, test_abort_mark_refused);
  tcase_add_test(ta, test_abort_mark_long_reason);
  tcase_add_test(ta, test_abort_mark_on_complete_is_corrupt);
  tcase_add_test(ta, test_abort_mark_old_traces);
  suite_add_tcase(s, ta);
  TCase *td = tcase_create("digest");
  tcase_add_test(td, test_digest_known_values);
  tcase_add_test(td, test_digest_zero_unmeasured);
  tcase_add_test(td, test_old_trace_2026_12);
  suite_add_tcase(s, td);
  return s;
}

int main(void) {
  SRunner *r = srunner_create(make_suite());
  srunner_run_all(r, CK_NORMAL);
  int failed = srunner_ntests_failed(r);
  srunner_free(r);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
