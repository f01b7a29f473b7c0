/*
 * tests/tools/test_dist_postmortem.c - Check suite for the cross-rank
 * post-mortem (probe_ranks_run, libprobe/analysis/ranks*.c) and for
 * `ampprobe postmortem` / `ampprobe diff` over sets of rank traces. The
 * rank traces are written through the public writer API (rank, world size,
 * run id; GRAD_PRE/POST_ALLREDUCE records; weight digests), without
 * mpirun, so the cases are fast and deterministic: a NaN born on one rank
 * and carried by the all-reduce, a value born in the all-reduce, ties and
 * the (step, phase, seq) order across ranks, disagreeing loss scale /
 * skipped / digest, a killed rank, missing and corrupt rank files, mixed
 * run ids, and the single-file document unchanged.
 */
#define _POSIX_C_SOURCE 200809L
#define _GNU_SOURCE /* memmem */
#include <check.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <hdf5.h>

#include "ampprobe/analysis.h"
#include "ampprobe/probe.h"

#ifndef AMPPROBE_BIN
#error "AMPPROBE_BIN must be defined"
#endif

#define N 16
#define MAX_WORLD 128
enum { L_INPUT, L_FC1, L_FC2, L_LOSS, N_LAYERS };

/* What goes wrong on one rank. -1 = never. */
typedef struct fault {
  int64_t nan_input_step;     /* NaN in this rank's input (forward) */
  int64_t masked_step;        /* NaN in fc1's output only, masked before the
                                 loss (rank-local, gradients finite) */
  int64_t grad_inf_step;      /* fc1's local gradient overflows (backward,
                                 before the all-reduce) */
  int64_t post_inf_step;      /* the all-reduce output of post_layer is
                                 non-finite (on every rank in a real job) */
  int post_layer;             /* L_FC1 or L_FC2 */
  int64_t scale_from;         /* from this step the loss scale is halved */
  int64_t skip_step;          /* this rank alone skips that step */
  int64_t digest_from;        /* from this step its weights differ */
  int no_digest;              /* digest not measured */
  int64_t kill_after;         /* the writer dies after this step (flushed) */
  int killed_at_open;         /* the writer dies before its first step */
  int64_t cast_inf_step;      /* fc2's gradient is finite, its all-reduce
                                 bucket (cast to FP16) is not */
  int grad_inf_layer;         /* the layer of grad_inf_step: L_FC1 (the
                                 default) or L_FC2 (first in the backward) */
  int64_t close_after;        /* the writer closes its trace after this
                                 step (an exception: not killed) */
  int64_t grad_in_inf_step;   /* the loss's gradient to its input overflows
                                 and goes nowhere (not a parameter's: not
                                 found by the scaler, not applied) */
  int joined;                 /* after its last step (close_after or
                                 kill_after) the rank marks that it joined
                                 the others (uneven inputs) */
  const char *abort_reason;   /* before its close the rank marks its trace
                                 aborted with this reason (a signal, an
                                 exception); NULL: no mark */
  int abort_in_step;          /* the mark comes inside step close_after + 1
                                 (begun, closed half done) */
} fault;

static fault no_fault(void) {
  fault f = {-1, -1, -1, -1, L_FC2, -1, -1, -1, 0, -1, 0, -1, L_FC1, -1, -1, 0,
             NULL, 0};
  return f;
}

/* The all-reduce in the fixture: ranks see a post-all-reduce value that is
 * non-finite when any rank's pre value is (set by the caller per step). */
typedef struct job {
  char dir[128];
  char base[160];
  int world;
  int64_t steps;
  const char *run_id;
  int flight; /* scalars mode with the flight recorder instead of full */
  int no_allreduce; /* no GRAD_PRE/POST_ALLREDUCE records */
  int no_scaler;    /* no loss scaler: scale 1, nothing skipped */
  int nan_update;   /* a NaN input's step makes every rank's master
                       weights NaN (the all-reduced gradients applied) */
  int every;        /* records only at steps divisible by it (0, 1: all) */
  int64_t weights_nf_step; /* every rank's weights non-finite after this
                              step's update, its gradients finite (a
                              learning rate too high); 0 = never */
  int local_loss;   /* each rank logs its own loss (the Python tracer), not
                       the job's mean: NaN on the NaN input's rank, and on
                       every rank once the weights are NaN */
  double grad_scale; /* > 0: every step's loss scale, and every gradient
                        record (grad_in, weight_grad, the all-reduce's)
                        holds the gradients scaled by it, as the trainer's
                        (1: an FP32 run; 0: the default 65536, unscaled
                        records) */
  int64_t post_off_from; /* from this step fc2's all-reduce returns twice
                            the sum on every rank (a real divergence of
                            the all-reduce alone); 0 = never */
  fault f[MAX_WORLD];
} job;

static char root[64]; /* this run's directory, removed at the end */

static void job_init(job *j, const char *tag, int world, int64_t steps) {
  memset(j, 0, sizeof *j);
  snprintf(j->dir, sizeof j->dir, "%s/%s", root, tag);
  mkdir(j->dir, 0700);
  snprintf(j->base, sizeof j->base, "%s/t.h5", j->dir);
  j->world = world;
  j->steps = steps;
  j->run_id = "job-42";
  for (int r = 0; r < MAX_WORLD; r++) j->f[r] = no_fault();
}

static void rank_path(const job *j, int r, char *out, size_t cap) {
  ck_assert_int_eq(probe_rank_trace_path(out, cap, j->base, r), PROBE_OK);
}

/* Some rank sends a non-finite bucket of `layer` into the all-reduce. */
static int any_pre_bad(const job *j, int64_t step, int layer) {
  for (int r = 0; r < j->world; r++)
    if (j->f[r].nan_input_step == step ||
        (layer == j->f[r].grad_inf_layer && j->f[r].grad_inf_step == step) ||
        (layer == L_FC2 && j->f[r].cast_inf_step == step))
      return 1;
  return 0;
}

static int any_nan_input(const job *j, int64_t step) {
  for (int r = 0; r < j->world; r++)
    if (j->f[r].nan_input_step == step) return 1;
  return 0;
}

static int any_post_inf(const job *j, int64_t step, int layer) {
  for (int r = 0; r < j->world; r++)
    if (j->f[r].post_inf_step == step && j->f[r].post_layer == layer) return 1;
  return 0;
}

typedef struct wr {
  probe_session *s;
  int32_t id[N_LAYERS];
  float buf[32][N];
  int nb;
} wr;

static void rec(wr *w, int layer, probe_site site, float mag, int bad) {
  ck_assert_int_lt(w->nb, 32);
  float *b = w->buf[w->nb++];
  for (int i = 0; i < N; i++) b[i] = mag * (0.5f + (float)i / N);
  if (bad == 1) b[0] = NAN;
  if (bad == 2) b[1] = INFINITY;
  ck_assert_int_eq(probe_tensor_record(w->s, w->id[layer], site,
                                       PROBE_DTYPE_F32, b, N),
                   PROBE_OK);
}

static int wopen(wr *w, const job *j, int r, const char *run_id) {
  char path[256];
  rank_path(j, r, path, sizeof path);
  probe_options o;
  probe_options_init(&o);
  o.mode = j->flight ? PROBE_MODE_SCALARS : PROBE_MODE_FULL;
  o.overwrite = 1;
  o.rank = r;
  o.world_size = j->world;
  o.run_id = run_id;
  o.command_line = "ampprobe run --scenario unit --trace";
  o.config_json = "{\"name\": \"unit\"}";
  o.precision_policy = "fp16";
  memset(w, 0, sizeof *w);
  if (probe_session_open(&w->s, path, &o) != PROBE_OK) return -1;
  static const char *names[N_LAYERS] = {"input", "fc1", "fc2", "loss"};
  static const probe_kind kinds[N_LAYERS] = {
      PROBE_KIND_INPUT, PROBE_KIND_LINEAR, PROBE_KIND_LINEAR, PROBE_KIND_LOSS};
  for (int i = 0; i < N_LAYERS; i++)
    if (probe_layer_register(w->s, names[i], kinds[i],
                             i == L_FC1 || i == L_FC2 ? PROBE_DTYPE_F16
                                                      : PROBE_DTYPE_F32,
                             &w->id[i]) != PROBE_OK)
      return -1;
  return 0;
}

/* The factor of the gradient records (job.grad_scale). */
static float grad_mul(const job *j) {
  return j->grad_scale > 0 ? (float)j->grad_scale : 1.0f;
}

/* Backward of one parameterised layer: its local gradient, the bucket sent
 * into the all-reduce and the bucket it returned. */
static void backward_layer(wr *w, const job *j, int r, int64_t step, int layer,
                           int fwd_bad) {
  const fault *f = &j->f[r];
  int local = fwd_bad || (layer == f->grad_inf_layer && f->grad_inf_step == step);
  int mine = local ? (fwd_bad ? 1 : 2) : 0;
  float g = 4.0f * grad_mul(j);
  rec(w, layer, PROBE_SITE_WEIGHT_GRAD, g, mine);
  if (j->no_allreduce) return;
  int cast = layer == L_FC2 && f->cast_inf_step == step;
  rec(w, layer, PROBE_SITE_GRAD_PRE_ALLREDUCE, g, mine ? mine : cast ? 2 : 0);
  int post = any_pre_bad(j, step, layer) ? 1 : any_post_inf(j, step, layer) ? 2 : 0;
  float off = layer == L_FC2 && j->post_off_from > 0 && step >= j->post_off_from
                  ? 2.0f : 1.0f;
  rec(w, layer, PROBE_SITE_GRAD_POST_ALLREDUCE, g * (float)j->world * off, post);
}

/* The first step with a NaN input on any rank, -1 none. */
static int64_t first_nan_input(const job *j) {
  int64_t s = -1;
  for (int r = 0; r < j->world; r++)
    if (j->f[r].nan_input_step >= 0 && (s < 0 || j->f[r].nan_input_step < s))
      s = j->f[r].nan_input_step;
  return s;
}

static void write_records(wr *w, const job *j, int r, int64_t step) {
  const fault *f = &j->f[r];
  int bad = f->nan_input_step == step;
  int64_t s0 = first_nan_input(j);
  int poisoned = j->nan_update && s0 >= 0 && step >= s0; /* after the update */
  /* without a scaler the update applies a step's non-finite gradients */
  poisoned |= j->no_scaler &&
              (any_pre_bad(j, step, L_FC1) || any_pre_bad(j, step, L_FC2) ||
               any_post_inf(j, step, L_FC1) || any_post_inf(j, step, L_FC2));
  rec(w, L_INPUT, PROBE_SITE_FWD_OUT, 1.0f, bad);
  rec(w, L_FC1, PROBE_SITE_FWD_IN, 1.0f, bad);
  rec(w, L_FC1, PROBE_SITE_FWD_OUT, 2.0f, bad || f->masked_step == step);
  rec(w, L_FC2, PROBE_SITE_FWD_OUT, 2.0f, bad);
  rec(w, L_LOSS, PROBE_SITE_FWD_OUT, 1.0f, bad);
  rec(w, L_LOSS, PROBE_SITE_GRAD_IN, grad_mul(j),
      bad ? 1 : f->grad_in_inf_step == step ? 2 : 0);
  backward_layer(w, j, r, step, L_FC2, bad);
  backward_layer(w, j, r, step, L_FC1, bad);
  rec(w, L_FC1, PROBE_SITE_MASTER_WEIGHT, 0.5f,
      poisoned || (j->weights_nf_step > 0 && step == j->weights_nf_step));
  rec(w, L_FC2, PROBE_SITE_MASTER_WEIGHT, 0.5f, 0);
}

static void write_step(wr *w, const job *j, int r, int64_t step) {
  const fault *f = &j->f[r];
  w->nb = 0;
  ck_assert_int_eq(probe_step_begin(w->s, step), PROBE_OK);
  if (j->every <= 1 || step % j->every == 0) write_records(w, j, r, step);
  int64_t s0 = first_nan_input(j);
  int found = any_pre_bad(j, step, L_FC1) || any_pre_bad(j, step, L_FC2) ||
              any_post_inf(j, step, L_FC1) || any_post_inf(j, step, L_FC2);
  probe_step_scalars s;
  memset(&s, 0, sizeof s);
  s.loss = any_nan_input(j, step) ? NAN : 1.0 / (double)(step + 1);
  if (j->local_loss)
    s.loss = f->nan_input_step == step || (j->nan_update && s0 >= 0 && step > s0)
                 ? NAN : 1.0 / (double)(step + 1);
  s.loss_scale = 65536.0;
  if (j->grad_scale > 0) s.loss_scale = j->grad_scale;
  if (f->scale_from >= 0 && step >= f->scale_from) s.loss_scale = 32768.0;
  s.found_inf = found;
  s.skipped = found || f->skip_step == step;
  if (j->no_scaler) {
    s.loss_scale = 1.0;
    s.found_inf = s.skipped = 0;
  }
  s.lr = 1e-3;
  s.grad_norm = 0.5;
  s.clip_coef = 1.0;
  s.weight_digest = 0x1234500000ull + (uint64_t)step;
  if (f->digest_from >= 0 && step >= f->digest_from) s.weight_digest ^= 0xff;
  if (f->no_digest) s.unmeasured |= PROBE_SCALAR_WEIGHT_DIGEST;
  ck_assert_int_eq(probe_step_set_scalars(w->s, &s), PROBE_OK);
  ck_assert_int_eq(probe_step_end(w->s), PROBE_OK);
}

/* A rank whose writer dies after kill_after: written in a child that
 * flushes and _exits without closing (the trace stays "not closed"). */
static void write_killed(const job *j, int r, const char *run_id) {
  pid_t pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) {
    wr w;
    if (wopen(&w, j, r, run_id) < 0) _exit(2);
    for (int64_t s = 0; s <= j->f[r].kill_after; s++) write_step(&w, j, r, s);
    if (j->f[r].joined && probe_session_mark_joined(w.s) != PROBE_OK) _exit(4);
    if (probe_session_flush(w.s) != PROBE_OK) _exit(3);
    _exit(0);
  }
  int ws = 0;
  ck_assert_int_eq(waitpid(pid, &ws, 0), pid);
  ck_assert_msg(WIFEXITED(ws) && WEXITSTATUS(ws) == 0, "killed writer failed");
}

static void write_rank_id(const job *j, int r, const char *run_id) {
  if (j->f[r].kill_after >= 0 || j->f[r].killed_at_open) {
    write_killed(j, r, run_id);
    return;
  }
  wr w;
  ck_assert_int_eq(wopen(&w, j, r, run_id), 0);
  for (int64_t s = 0; s < j->steps && (j->f[r].close_after < 0 ||
                                        s <= j->f[r].close_after); s++)
    write_step(&w, j, r, s);
  if (j->f[r].joined) ck_assert_int_eq(probe_session_mark_joined(w.s), PROBE_OK);
  if (j->f[r].abort_reason) {
    if (j->f[r].abort_in_step)
      ck_assert_int_eq(probe_step_begin(w.s, j->f[r].close_after + 1),
                       PROBE_OK);
    ck_assert_int_eq(probe_session_mark_aborted(w.s, j->f[r].abort_reason),
                     PROBE_OK);
  }
  ck_assert_int_eq(probe_session_close(w.s), PROBE_OK);
}

static void write_job(const job *j) {
  for (int r = 0; r < j->world; r++) write_rank_id(j, r, j->run_id);
}

/* Every rank file of the job, in rank order (skip: a rank left out). */
static size_t job_paths(const job *j, char paths[][256], const char **ptrs,
                        int skip) {
  size_t n = 0;
  for (int r = 0; r < j->world; r++) {
    if (r == skip) continue;
    rank_path(j, r, paths[n], 256);
    ptrs[n] = paths[n];
    n++;
  }
  return n;
}

static void run_set(probe_ranks *res, const job *j, int skip, int isolate) {
  char paths[MAX_WORLD][256];
  const char *ptrs[MAX_WORLD];
  size_t n = job_paths(j, paths, ptrs, skip);
  probe_ranks_options o;
  probe_ranks_options_init(&o);
  o.isolate = isolate;
  probe_status st = probe_ranks_run(res, ptrs, n, &o);
  ck_assert_msg(st == PROBE_OK, "probe_ranks_run: %s (%s)",
                probe_status_str(st), res->error);
}

static const probe_rank_entry *entry_of(const probe_ranks *r, int rank) {
  for (size_t i = 0; i < r->n_entries; i++)
    if (r->entries[i].rank == rank) return &r->entries[i];
  ck_abort_msg("rank %d not in the result", rank);
  return NULL;
}

static json_t *ranks_json(const probe_ranks *r) {
  char *txt = NULL;
  ck_assert_int_eq(probe_ranks_render_json(r, &txt), PROBE_OK);
  ck_assert_msg(strncmp(txt, "{\n  \"verdict\": ", 15) == 0,
                "verdict is not the first key: %.40s", txt);
  json_error_t err;
  json_t *doc = json_loads(txt, 0, &err);
  ck_assert_msg(doc != NULL, "not JSON: %s", err.text);
  probe_free(txt);
  return doc;
}

/* The ints of a JSON array as "0,1,3". */
static void int_list(json_t *arr, char *out, size_t cap) {
  size_t len = 0, i;
  json_t *v;
  out[0] = '\0';
  json_array_foreach(arr, i, v) {
    len += (size_t)snprintf(out + len, cap - len, "%s%lld", i ? "," : "",
                            (long long)json_integer_value(v));
  }
}

static void check_origin(const probe_ranks *r, const char *kind,
                         const char *born, const char *carried) {
  json_t *doc = ranks_json(r);
  json_t *o = json_object_get(doc, "origin");
  ck_assert_str_eq(json_string_value(json_object_get(o, "kind")), kind);
  char b[256];
  int_list(json_object_get(o, "born_on"), b, sizeof b);
  ck_assert_str_eq(b, born);
  int_list(json_object_get(o, "carried_to"), b, sizeof b);
  ck_assert_str_eq(b, carried);
  json_decref(doc);
}

static char *ranks_text(const probe_ranks *r) {
  char *t = NULL;
  ck_assert_int_eq(probe_ranks_render_text(r, &t), PROBE_OK);
  return t;
}

/* ---- born on one rank, carried by the all-reduce -------------------------- */

START_TEST(test_nan_carried_by_allreduce) {
  static const struct {
    int world, rank;
    int64_t step;
    int flight;
    const char *born, *carried;
  } cases[] = {
      {4, 2, 5, 0, "2", "0,1,3"},
      {2, 1, 3, 0, "1", "0"},
      {4, 0, 0, 0, "0", "1,2,3"},
      {8, 5, 7, 1, "5", "0,1,2,3,4,6,7"}, /* flight recorder: sparse rows */
  };
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    char tag[32];
    snprintf(tag, sizeof tag, "carried%zu", c);
    job j;
    job_init(&j, tag, cases[c].world, 12);
    j.flight = cases[c].flight;
    j.f[cases[c].rank].nan_input_step = cases[c].step;
    write_job(&j);
    probe_ranks r;
    run_set(&r, &j, -1, (int)(c & 1));
    ck_assert_int_eq(r.origin, PROBE_RANKS_ORIGIN_RANK);
    ck_assert_int_ge(r.first, 0);
    const probe_rank_entry *f = &r.entries[r.first];
    ck_assert_int_eq(f->rank, cases[c].rank);
    ck_assert_int_eq(f->nf_step, cases[c].step);
    ck_assert_int_eq(f->nf_phase, PROBE_PHASE_FORWARD);
    ck_assert_int_eq(f->nf_site, PROBE_SITE_FWD_OUT);
    ck_assert_str_eq(f->nf_layer_name, "input");
    ck_assert_int_eq(r.n_born, 1);
    ck_assert_int_eq(r.n_carried, cases[c].world - 1);
    ck_assert_int_eq(r.focus, r.first);
    ck_assert_ptr_nonnull(r.focus_diag);
    ck_assert_int_eq(r.verdict, PROBE_VERDICT_DIVERGED); /* NaN loss */
    ck_assert_int_eq(r.n_disagreements, 0);
    ck_assert_int_eq(r.n_read, cases[c].world);
    check_origin(&r, "rank", cases[c].born, cases[c].carried);
    char *t = ranks_text(&r);
    char want[128];
    snprintf(want, sizeof want, "first non-finite  rank %d, step %lld",
             cases[c].rank, (long long)cases[c].step);
    ck_assert_msg(strstr(t, want), "no '%s' in:\n%s", want, t);
    ck_assert_msg(strstr(t, "the all-reduce carried it to rank"), "%s", t);
    probe_free(t);
    probe_ranks_free(&r);
  }
}
END_TEST

/* A rank-local NaN a few steps before the gradients carry it (the
 * synthetic 1,024-rank job's shape), and ranks with a later fault of their
 * own. */
START_TEST(test_lead_and_later) {
  job j;
  job_init(&j, "lead", 4, 12);
  j.f[2].masked_step = 5;
  j.f[2].nan_input_step = 8;
  write_job(&j);
  probe_ranks r;
  run_set(&r, &j, -1, 1);
  ck_assert_int_eq(r.entries[r.first].rank, 2);
  ck_assert_int_eq(r.event_step, 5);
  ck_assert_str_eq(r.entries[r.first].nf_layer_name, "fc1");
  ck_assert_int_eq(r.carried_first_step, 8);
  ck_assert_int_eq(r.carried_last_step, 8);
  check_origin(&r, "rank", "2", "0,1,3");
  ck_assert_msg(strstr(r.origin_text, "carried it to ranks 0-1, 3 at step 8"),
                "%s", r.origin_text);
  probe_ranks_free(&r);

  job_init(&j, "later", 4, 12);
  j.f[0].masked_step = 2;
  j.f[3].masked_step = 6;
  write_job(&j);
  run_set(&r, &j, -1, 0);
  ck_assert_int_eq(r.entries[r.first].rank, 0);
  ck_assert_int_eq(r.n_later, 1);
  ck_assert_int_eq(entry_of(&r, 3)->role, PROBE_RANK_ROLE_LATER);
  ck_assert_int_eq(r.n_unreached, 2);
  ck_assert_int_eq(r.n_carried, 0);
  ck_assert_msg(strstr(r.origin_text, "did not carry it"), "%s", r.origin_text);
  ck_assert_int_eq(r.verdict, PROBE_VERDICT_DEGRADED);
  json_t *doc = ranks_json(&r);
  char b[64];
  int_list(json_object_get(json_object_get(doc, "origin"), "later"), b,
           sizeof b);
  ck_assert_str_eq(b, "3");
  int_list(json_object_get(json_object_get(doc, "origin"), "never_nonfinite"),
           b, sizeof b);
  ck_assert_str_eq(b, "1,2");
  json_decref(doc);
  probe_ranks_free(&r);
}
END_TEST

/* Traces without all-reduce records: carrying cannot be seen, and is not
 * claimed either way. */
START_TEST(test_no_allreduce_records) {
  job j;
  job_init(&j, "noar", 3, 8);
  j.no_allreduce = 1;
  j.f[1].nan_input_step = 3;
  write_job(&j);
  probe_ranks r;
  run_set(&r, &j, -1, 0);
  ck_assert_int_eq(r.entries[r.first].rank, 1);
  ck_assert_int_eq(r.n_carried, 0);
  ck_assert_msg(strstr(r.origin_text, "cannot be seen"), "%s", r.origin_text);
  check_origin(&r, "rank", "1", "");
  probe_ranks_free(&r);
}
END_TEST

/* Gradient overflows on steps the scaler skipped are normal backoffs, not
 * the first event (as in the single-trace post-mortem). */
START_TEST(test_backoffs_are_not_events) {
  job j;
  job_init(&j, "backoff", 4, 12);
  for (int k = 0; k < 4; k++) j.f[k].grad_inf_step = 0; /* warm-up */
  j.f[1].grad_inf_step = 2; /* and once more on rank 1 */
  j.f[3].nan_input_step = 7;
  write_job(&j);
  probe_ranks r;
  run_set(&r, &j, -1, 1);
  ck_assert_int_eq(r.entries[r.first].rank, 3);
  ck_assert_int_eq(r.event_step, 7);
  /* rank 0: its own at 0, rank 1's through the all-reduce at 2 (skipped,
   * the loss finite: backoffs); rank 3's NaN at 7 is skipped too, but the
   * job's loss is NaN there: the event, reached through the all-reduce,
   * not a backoff; rank 3 stops at its event */
  ck_assert_int_eq(entry_of(&r, 0)->backoff_nonfinite_steps, 2);
  ck_assert_int_eq(entry_of(&r, 1)->backoff_nonfinite_steps, 2);
  ck_assert_int_eq(entry_of(&r, 3)->backoff_nonfinite_steps, 2);
  ck_assert_int_eq(entry_of(&r, 1)->first_backoff_step, 0);
  ck_assert_int_eq(entry_of(&r, 0)->nf_step, 7);
  ck_assert_int_eq(entry_of(&r, 0)->nf_site, PROBE_SITE_GRAD_POST_ALLREDUCE);
  check_origin(&r, "rank", "3", "0,1,2");
  char *t = ranks_text(&r);
  ck_assert_msg(strstr(t, "scaler backoffs   4 ranks"), "%s", t);
  probe_free(t);
  probe_ranks_free(&r);

  /* backoffs only: no event at all (flight recorder too) */
  for (int flight = 0; flight < 2; flight++) {
    job_init(&j, flight ? "backoff_only_fr" : "backoff_only", 2, 12);
    j.flight = flight;
    j.f[0].grad_inf_step = j.f[1].grad_inf_step = 1;
    write_job(&j);
    run_set(&r, &j, -1, 0);
    ck_assert_int_eq(r.origin, PROBE_RANKS_ORIGIN_NONE);
    ck_assert_int_eq(r.first, -1);
    ck_assert_int_eq(entry_of(&r, 1)->backoff_nonfinite_steps, 1);
    probe_ranks_free(&r);
  }
}
END_TEST

/* Two ranks with bad input at the same step: both born, the lowest first. */
START_TEST(test_born_on_two_ranks) {
  job j;
  job_init(&j, "twoborn", 4, 10);
  j.f[3].nan_input_step = 4;
  j.f[1].nan_input_step = 4;
  write_job(&j);
  probe_ranks r;
  run_set(&r, &j, -1, 0);
  ck_assert_int_eq(r.entries[r.first].rank, 1);
  ck_assert_int_eq(r.n_born, 2);
  check_origin(&r, "rank", "1,3", "0,2");
  probe_ranks_free(&r);
}
END_TEST

/* The order is (step, phase, seq), not the rank. */
START_TEST(test_order_step_phase_seq) {
  /* forward on rank 3 before backward on rank 1 at the same step */
  job j;
  job_init(&j, "order1", 4, 10);
  j.f[1].grad_inf_step = 5;
  j.f[3].nan_input_step = 5;
  write_job(&j);
  probe_ranks r;
  run_set(&r, &j, -1, 0);
  ck_assert_int_eq(r.entries[r.first].rank, 3);
  ck_assert_int_eq(r.entries[r.first].nf_phase, PROBE_PHASE_FORWARD);
  /* rank 1's first is fc2's bucket from the all-reduce (carried); its own
   * fc1 overflow comes later in the step */
  ck_assert_int_eq(entry_of(&r, 1)->nf_site, PROBE_SITE_GRAD_POST_ALLREDUCE);
  check_origin(&r, "rank", "3", "0,1,2");
  probe_ranks_free(&r);

  /* an earlier step wins over an earlier phase */
  job_init(&j, "order2", 4, 10);
  j.no_scaler = 1; /* a gradient overflow is an event only without a scaler */
  j.f[0].grad_inf_step = 3;
  j.f[2].nan_input_step = 4;
  write_job(&j);
  run_set(&r, &j, -1, 0);
  ck_assert_int_eq(r.entries[r.first].rank, 0);
  ck_assert_int_eq(r.event_step, 3);
  ck_assert_int_eq(r.entries[r.first].nf_site, PROBE_SITE_WEIGHT_GRAD);
  check_origin(&r, "rank", "0", "1,2,3");
  probe_ranks_free(&r);

  /* same step and phase: the lower seq wins (fc2's gradient before fc1's) */
  job_init(&j, "order3", 2, 8);
  j.no_scaler = 1;
  j.f[1].grad_inf_step = 2; /* fc1 weight_grad, seq after fc2's buckets */
  j.f[0].post_inf_step = 2; /* fc2's all-reduce output: earlier seq */
  j.f[0].post_layer = L_FC2;
  write_job(&j);
  run_set(&r, &j, -1, 0);
  ck_assert_int_eq(r.entries[r.first].rank, 0);
  ck_assert_int_eq(r.entries[r.first].nf_site, PROBE_SITE_GRAD_POST_ALLREDUCE);
  ck_assert_int_eq(r.origin, PROBE_RANKS_ORIGIN_ALLREDUCE);
  probe_ranks_free(&r);
}
END_TEST

/* ---- born in the all-reduce ------------------------------------------------ */

START_TEST(test_born_in_allreduce) {
  static const struct {
    int world, layer;
    int64_t step;
    int flight;
    const char *layer_name, *carried;
  } cases[] = {
      {4, L_FC2, 12, 0, "fc2", "0,1,2,3"},
      {2, L_FC1, 3, 0, "fc1", "0,1"},
      {8, L_FC2, 0, 1, "fc2", "0,1,2,3,4,5,6,7"},
  };
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    char tag[32];
    snprintf(tag, sizeof tag, "allreduce%zu", c);
    job j;
    job_init(&j, tag, cases[c].world, 16);
    j.flight = cases[c].flight;
    j.no_scaler = 1; /* with a scaler it is a normal backoff (see below) */
    for (int k = 0; k < cases[c].world; k++) {
      j.f[k].post_inf_step = cases[c].step;
      j.f[k].post_layer = cases[c].layer;
    }
    write_job(&j);
    probe_ranks r;
    run_set(&r, &j, -1, 1);
    ck_assert_int_eq(r.origin, PROBE_RANKS_ORIGIN_ALLREDUCE);
    ck_assert_int_eq(r.n_born, 0);
    ck_assert_int_eq(r.n_carried, cases[c].world);
    const probe_rank_entry *f = &r.entries[r.first];
    ck_assert_int_eq(f->rank, 0);
    ck_assert_int_eq(f->nf_step, cases[c].step);
    ck_assert_int_eq(f->nf_site, PROBE_SITE_GRAD_POST_ALLREDUCE);
    ck_assert_str_eq(f->nf_layer_name, cases[c].layer_name);
    ck_assert_ptr_nonnull(strstr(r.fix_text, "FP32"));
    ck_assert_ptr_nonnull(strstr(r.origin_text, "born in the all-reduce"));
    ck_assert_int_ge(r.verdict, PROBE_VERDICT_DEGRADED);
    check_origin(&r, "allreduce", "", cases[c].carried);
    probe_ranks_free(&r);
  }
}
END_TEST

/* All-reduce-born among the ranks read while a rank is missing: the
 * missing rank could be the origin, and the text says so. */
START_TEST(test_allreduce_with_missing_rank) {
  job j;
  job_init(&j, "armissing", 4, 8);
  j.no_scaler = 1;
  for (int k = 0; k < 4; k++) j.f[k].post_inf_step = 3;
  write_job(&j);
  probe_ranks r;
  run_set(&r, &j, 2, 0);
  ck_assert_int_eq(r.origin, PROBE_RANKS_ORIGIN_ALLREDUCE);
  ck_assert_int_eq(r.origin_uncertain, 1);
  /* every rank read was finite before the all-reduce and it brought inf:
   * the rank not read, or an FP16 sum that overflowed; the fix reads that
   * rank first */
  ck_assert_msg(strstr(r.origin_text, "born on rank 2, which could not be "
                                      "read, or in the all-reduce itself"),
                "%s", r.origin_text);
  ck_assert_msg(strstr(r.fix_text, "read the trace of rank 2"), "%s",
                r.fix_text);
  json_t *doc = ranks_json(&r);
  ck_assert(json_is_true(json_object_get(json_object_get(doc, "origin"),
                                         "uncertain")));
  json_decref(doc);
  probe_ranks_free(&r);
  /* all read: certain */
  run_set(&r, &j, -1, 0);
  ck_assert_int_eq(r.origin_uncertain, 0);
  probe_ranks_free(&r);
}
END_TEST

/* One rank's trace alone: a non-finite all-reduce output that the rank
 * sent finite is the event "allreduce-nonfinite" with the finding
 * fix-allreduce (not force-fp32 of the layer); the rank it was born on
 * keeps its own event. */
static void diag_of_rank(const job *j, int r, probe_diag *d) {
  char p[256];
  rank_path(j, r, p, sizeof p);
  probe_trace *t = NULL;
  ck_assert_int_eq(probe_trace_open(&t, p), PROBE_OK);
  ck_assert_int_eq(probe_diag_run(d, t, p, NULL), PROBE_OK);
  probe_trace_close(t);
}

START_TEST(test_single_rank_allreduce_event) {
  job j;
  job_init(&j, "single_ar", 2, 8);
  j.no_scaler = 1; /* with a scaler, an overflow on a skipped step is a
                      normal backoff, not an event */
  for (int k = 0; k < 2; k++) j.f[k].post_inf_step = 4;
  write_job(&j);
  probe_diag d;
  diag_of_rank(&j, 1, &d);
  ck_assert_int_eq(d.event, PROBE_DIAG_EVENT_ALLREDUCE);
  ck_assert_int_eq(d.event_step, 4);
  ck_assert_int_eq(d.origin_site, PROBE_SITE_GRAD_POST_ALLREDUCE);
  ck_assert_str_eq(probe_diag_layer_name(&d, d.origin_layer), "fc2");
  ck_assert_int_ge(d.n_findings, 1);
  ck_assert_int_eq(d.findings[0].id, PROBE_DIAG_FINDING_FIX_ALLREDUCE);
  for (int i = 0; i < d.n_findings; i++)
    ck_assert_int_ne(d.findings[i].id, PROBE_DIAG_FINDING_FORCE_FP32);
  ck_assert_int_ge(d.verdict, PROBE_VERDICT_DEGRADED);
  probe_diag_free(&d);

  job_init(&j, "single_bad", 3, 8);
  j.no_scaler = 1;
  j.f[2].nan_input_step = 3;
  write_job(&j);
  diag_of_rank(&j, 0, &d); /* carried */
  ck_assert_int_eq(d.event, PROBE_DIAG_EVENT_ALLREDUCE);
  ck_assert_int_eq(d.event_step, 3);
  probe_diag_free(&d);
  diag_of_rank(&j, 2, &d); /* born */
  ck_assert_int_eq(d.event, PROBE_DIAG_EVENT_INPUT_NAN);
  ck_assert_int_eq(d.findings[0].id, PROBE_DIAG_FINDING_CLEAN_INPUT);
  probe_diag_free(&d);
}
END_TEST

/* One rank's pre-all-reduce bucket non-finite too: not the all-reduce. */
START_TEST(test_pre_nonfinite_is_not_allreduce) {
  job j;
  job_init(&j, "prebad", 4, 8);
  j.no_scaler = 1;
  for (int k = 0; k < 4; k++) {
    j.f[k].post_inf_step = 5;
    j.f[k].post_layer = L_FC1;
  }
  j.f[2].grad_inf_step = 5; /* fc1 local overflow: its pre bucket is inf */
  write_job(&j);
  probe_ranks r;
  run_set(&r, &j, -1, 0);
  ck_assert_int_eq(r.origin, PROBE_RANKS_ORIGIN_RANK);
  ck_assert_int_eq(entry_of(&r, 2)->role, PROBE_RANK_ROLE_BORN);
  ck_assert_int_eq(entry_of(&r, 2)->pre_nonfinite, 1);
  ck_assert_int_eq(entry_of(&r, 2)->nf_site, PROBE_SITE_WEIGHT_GRAD);
  check_origin(&r, "rank", "2", "0,1,3");
  probe_ranks_free(&r);
}
END_TEST

/* ---- disagreements -------------------------------------------------------- */

START_TEST(test_disagreements) {
  /* loss scale on rank 2 from step 6 */
  job j;
  job_init(&j, "dscale", 4, 10);
  j.f[2].scale_from = 6;
  write_job(&j);
  probe_ranks r;
  run_set(&r, &j, -1, 0);
  const probe_ranks_disagreement *d = &r.disagree[PROBE_RANKS_LOSS_SCALE];
  ck_assert_int_eq(d->found, 1);
  ck_assert_int_eq(d->step, 6);
  ck_assert_int_eq(d->rank_a, 0);
  ck_assert_int_eq(d->rank_b, 2);
  ck_assert(d->value_a == 65536.0 && d->value_b == 32768.0);
  ck_assert_int_eq(d->ranks_differing, 1);
  ck_assert_int_eq(r.n_disagreements, 1);
  ck_assert_int_eq(r.verdict, PROBE_VERDICT_DEGRADED);
  char *t = ranks_text(&r);
  ck_assert_msg(strstr(t, "loss_scale differs at step 6"), "%s", t);
  probe_free(t);
  probe_ranks_free(&r);

  /* skipped on ranks 1 and 3 at step 3 */
  job_init(&j, "dskip", 4, 10);
  j.f[1].skip_step = 3;
  j.f[3].skip_step = 3;
  write_job(&j);
  run_set(&r, &j, -1, 1);
  d = &r.disagree[PROBE_RANKS_SKIPPED];
  ck_assert_int_eq(d->found, 1);
  ck_assert_int_eq(d->step, 3);
  ck_assert_int_eq(d->rank_b, 1);
  ck_assert_int_eq(d->ranks_differing, 2);
  ck_assert_int_eq(r.disagree[PROBE_RANKS_LOSS_SCALE].found, 0);
  json_t *doc = ranks_json(&r);
  json_t *a = json_object_get(doc, "disagreements");
  ck_assert_int_eq(json_array_size(a), 1);
  ck_assert_str_eq(json_string_value(json_object_get(json_array_get(a, 0),
                                                     "field")),
                   "skipped");
  json_decref(doc);
  probe_ranks_free(&r);

  /* weight digest on rank 0 from step 8 (rank 0 is the reference: every
   * other rank differs from it) */
  job_init(&j, "ddigest", 3, 10);
  j.f[0].digest_from = 8;
  write_job(&j);
  run_set(&r, &j, -1, 0);
  d = &r.disagree[PROBE_RANKS_WEIGHT_DIGEST];
  ck_assert_int_eq(d->found, 1);
  ck_assert_int_eq(d->step, 8);
  ck_assert_int_eq(d->rank_a, 0);
  ck_assert_int_eq(d->rank_b, 1);
  ck_assert_int_eq(d->ranks_differing, 2);
  ck_assert(d->digest_a != d->digest_b);
  probe_ranks_free(&r);
}
END_TEST

/* A digest not measured on one rank is not compared; a healthy set. */
START_TEST(test_healthy_set) {
  job j;
  job_init(&j, "healthy", 4, 10);
  j.f[2].no_digest = 1;
  write_job(&j);
  probe_ranks r;
  run_set(&r, &j, -1, 1);
  ck_assert_int_eq(r.n_disagreements, 0);
  ck_assert_int_eq(r.origin, PROBE_RANKS_ORIGIN_NONE);
  ck_assert_int_eq(r.verdict, PROBE_VERDICT_HEALTHY);
  ck_assert_int_eq(r.stopped_first, -1);
  ck_assert_int_eq(r.n_missing + r.n_unreadable + r.n_incomplete, 0);
  ck_assert_int_eq(r.focus, 0);
  ck_assert_str_eq(r.run_id, "job-42");
  ck_assert_int_eq(r.world_size, 4);
  ck_assert_int_eq(r.disagree[PROBE_RANKS_WEIGHT_DIGEST].steps_compared, 30);
  probe_ranks_free(&r);
}
END_TEST

/* ---- faults ----------------------------------------------------------------- */

START_TEST(test_killed_rank) {
  job j;
  job_init(&j, "killed", 4, 12);
  j.f[1].kill_after = 5;
  write_job(&j);
  probe_ranks r;
  run_set(&r, &j, -1, 1);
  ck_assert_int_eq(r.n_incomplete, 1);
  ck_assert_int_ge(r.stopped_first, 0);
  ck_assert_int_eq(r.entries[r.stopped_first].rank, 1);
  ck_assert_int_eq(r.entries[r.stopped_first].last_step, 5);
  ck_assert_int_eq(r.max_last_step, 11);
  ck_assert_int_eq(r.verdict, PROBE_VERDICT_DEGRADED);
  char *t = ranks_text(&r);
  ck_assert_msg(strstr(t, "stopped first     rank 1 at step 5"), "%s", t);
  probe_free(t);
  probe_ranks_free(&r);

  /* two killed ranks: the one with fewer steps stopped first; and the
   * NaN on another rank is still found */
  job_init(&j, "killed2", 4, 12);
  j.f[3].kill_after = 8;
  j.f[2].kill_after = 4;
  j.f[0].nan_input_step = 2;
  write_job(&j);
  run_set(&r, &j, -1, 0);
  ck_assert_int_eq(r.n_incomplete, 2);
  ck_assert_int_eq(r.entries[r.stopped_first].rank, 2);
  ck_assert_int_eq(r.entries[r.first].rank, 0);
  check_origin(&r, "rank", "0", "1,2,3");
  json_t *doc = ranks_json(&r);
  json_t *s = json_object_get(doc, "stopped_first");
  ck_assert_int_eq(json_integer_value(json_object_get(s, "rank")), 2);
  char b[64];
  int_list(json_object_get(s, "not_closed"), b, sizeof b);
  ck_assert_str_eq(b, "2,3");
  json_decref(doc);
  probe_ranks_free(&r);

  /* a rank killed before its first step */
  job_init(&j, "killed0", 3, 6);
  j.f[1].killed_at_open = 1;
  write_job(&j);
  run_set(&r, &j, -1, 0);
  ck_assert_int_eq(r.entries[r.stopped_first].rank, 1);
  ck_assert_int_eq(r.entries[r.stopped_first].last_step, -1);
  t = ranks_text(&r);
  ck_assert_msg(strstr(t, "stopped first     rank 1 before its first step"),
                "%s", t);
  probe_free(t);
  probe_ranks_free(&r);

  /* every rank stopped at the same step: cannot tell */
  job_init(&j, "killedall", 2, 12);
  j.f[0].kill_after = j.f[1].kill_after = 6;
  write_job(&j);
  run_set(&r, &j, -1, 0);
  ck_assert_int_eq(r.n_incomplete, 2);
  t = ranks_text(&r);
  ck_assert_msg(strstr(t, "cannot tell which stopped first"), "%s", t);
  probe_free(t);
  /* and the JSON does not name a rank the text says it cannot tell */
  ck_assert_int_eq(probe_ranks_stopped_tie(&r), 1);
  doc = ranks_json(&r);
  s = json_object_get(doc, "stopped_first");
  ck_assert(json_is_null(json_object_get(s, "rank")));
  ck_assert(json_is_true(json_object_get(s, "tie")));
  ck_assert_int_eq(json_integer_value(json_object_get(s, "last_step")),
                   r.entries[r.stopped_first].last_step);
  json_decref(doc);
  probe_ranks_free(&r);
  /* one rank closed, the others tied: no tie (the closed one went on) */
  job_init(&j, "killedtwo", 3, 12);
  j.f[0].kill_after = j.f[1].kill_after = 6;
  write_job(&j);
  run_set(&r, &j, -1, 0);
  ck_assert_int_eq(probe_ranks_stopped_tie(&r), 0);
  doc = ranks_json(&r);
  s = json_object_get(doc, "stopped_first");
  ck_assert(json_is_false(json_object_get(s, "tie")));
  ck_assert_int_eq(json_integer_value(json_object_get(s, "rank")), 0);
  json_decref(doc);
  probe_ranks_free(&r);
}
END_TEST

START_TEST(test_missing_rank) {
  static const struct {
    int world, skip;
    int64_t nan_rank;
  } cases[] = {{4, 2, 1}, {4, 0, 3}, {8, 7, 0}};
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    char tag[32];
    snprintf(tag, sizeof tag, "missing%zu", c);
    job j;
    job_init(&j, tag, cases[c].world, 10);
    j.f[cases[c].nan_rank].nan_input_step = 6;
    write_job(&j);
    probe_ranks r;
    run_set(&r, &j, cases[c].skip, (int)(c & 1));
    ck_assert_int_eq(r.n_missing, 1);
    ck_assert_int_eq(r.n_read, cases[c].world - 1);
    ck_assert_int_eq(entry_of(&r, cases[c].skip)->status, PROBE_RANK_MISSING);
    ck_assert_int_eq(r.entries[r.first].rank, cases[c].nan_rank);
    json_t *doc = ranks_json(&r);
    char b[64], want[8];
    int_list(json_object_get(doc, "ranks_missing"), b, sizeof b);
    snprintf(want, sizeof want, "%d", cases[c].skip);
    ck_assert_str_eq(b, want);
    json_decref(doc);
    char *t = ranks_text(&r);
    ck_assert_msg(strstr(t, "MISSING"), "%s", t);
    probe_free(t);
    probe_ranks_free(&r);
  }
}
END_TEST

/* Damages a rank file: 0 garbage bytes in place of the file, 1 truncated
 * to half, 2 the HDF5 superblock overwritten. */
static void damage(const char *path, int how) {
  struct stat st;
  ck_assert_int_eq(stat(path, &st), 0);
  if (how == 1) {
    ck_assert_int_eq(truncate(path, st.st_size / 2), 0);
    return;
  }
  int fd = open(path, how == 0 ? O_WRONLY | O_TRUNC : O_WRONLY);
  ck_assert_int_ge(fd, 0);
  char junk[512];
  memset(junk, 0x5a, sizeof junk);
  ck_assert_int_eq(write(fd, junk, sizeof junk), (ssize_t)sizeof junk);
  close(fd);
}

START_TEST(test_corrupt_rank) {
  for (int how = 0; how < 3; how++) {
    char tag[32];
    snprintf(tag, sizeof tag, "corrupt%d", how);
    job j;
    job_init(&j, tag, 4, 10);
    j.f[3].nan_input_step = 4;
    write_job(&j);
    char p[256];
    rank_path(&j, 1, p, sizeof p);
    damage(p, how);
    for (int iso = 0; iso < 2; iso++) {
      probe_ranks r;
      run_set(&r, &j, -1, iso);
      ck_assert_int_eq(r.n_unreadable, 1);
      ck_assert_int_eq(r.n_read, 3);
      /* its rank comes from its name: not missing as well */
      ck_assert_int_eq(r.n_missing, 0);
      ck_assert_int_eq(entry_of(&r, 1)->status, PROBE_RANK_UNREADABLE);
      ck_assert_int_eq(entry_of(&r, 1)->rank_from_name, 1);
      ck_assert_int_eq(r.entries[r.first].rank, 3);
      ck_assert_int_eq(r.origin_uncertain, 1);
      check_origin(&r, "rank", "3", "0,2");
      char *t = ranks_text(&r);
      ck_assert_msg(strstr(t, "UNREADABLE"), "%s", t);
      ck_assert_msg(strstr(t, "(rank 1 by its name)"), "%s", t);
      ck_assert_msg(strstr(t, "among the ranks read"), "%s", t);
      ck_assert_msg(!strstr(t, "MISSING"), "%s", t);
      probe_free(t);
      probe_ranks_free(&r);
    }
  }
}
END_TEST

/* Overwrites 64 bytes in the middle of /records' first stored chunk: the
 * file opens and its steps table reads, its records do not. */
static void damage_records(const char *path) {
  hid_t f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
  ck_assert_int_ge(f, 0);
  hid_t d = H5Dopen2(f, "/records", H5P_DEFAULT);
  ck_assert_int_ge(d, 0);
  hsize_t off[1], size = 0;
  haddr_t addr = 0;
  unsigned mask = 0;
  hid_t sp = H5Dget_space(d);
  ck_assert_int_ge(H5Dget_chunk_info(d, sp, 0, off, &mask, &addr, &size), 0);
  H5Sclose(sp);
  H5Dclose(d);
  H5Fclose(f);
  ck_assert_int_gt(size, 128);
  int fd = open(path, O_WRONLY);
  ck_assert_int_ge(fd, 0);
  char junk[64];
  memset(junk, 0x5a, sizeof junk);
  ck_assert_int_eq(pwrite(fd, junk, sizeof junk, (off_t)(addr + size / 2)),
                   (ssize_t)sizeof junk);
  close(fd);
}

/* What "read" means is said: the focus rank is read whole (isolated: every
 * row), the others in part (steps and the records at their event), in the
 * text and the JSON; a focus whose full read fails (damaged where its
 * summary did not read) is unreadable, not "read" (it was counted read,
 * the set exit 1 where the file alone exits 3). A healthy job: the
 * summaries read no record at all. */
START_TEST(test_read_whole_or_in_part) {
  for (int victim = 0; victim < 2; victim++) {
    char tag[32];
    snprintf(tag, sizeof tag, "inpart%d", victim);
    job j;
    job_init(&j, tag, 2, 300); /* records in several chunks: the first damaged */
    write_job(&j);
    char p[256];
    rank_path(&j, victim, p, sizeof p);
    damage_records(p);
    for (int iso = 0; iso < 2; iso++) {
      probe_ranks r;
      run_set(&r, &j, -1, iso);
      char *t = ranks_text(&r);
      json_t *doc = ranks_json(&r);
      if (victim == 0) { /* the focus of a healthy set: the first rank */
        ck_assert_int_eq(r.n_unreadable, 1);
        ck_assert_int_eq(r.n_read, 1);
        ck_assert_int_eq(entry_of(&r, 0)->status, PROBE_RANK_UNREADABLE);
        ck_assert_msg(strstr(t, "UNREADABLE"), "%s", t);
        ck_assert_int_ne(r.verdict, PROBE_VERDICT_HEALTHY);
      } else if (iso) { /* not the focus: read in part, and said so */
        ck_assert_int_eq(r.n_read, 2);
        ck_assert_int_eq(r.n_read_whole, 1);
        ck_assert_msg(strstr(t, "2 read (rank 0 whole, 1 in part: steps and "
                                "the records at the event)"), "%s", t);
        ck_assert_int_eq(json_integer_value(json_object_get(doc, "ranks_read_whole")), 1);
        json_t *rs = json_object_get(doc, "ranks");
        ck_assert(json_is_true(json_object_get(json_array_get(rs, 0), "read_whole")));
        ck_assert(json_is_false(json_object_get(json_array_get(rs, 1), "read_whole")));
      } else { /* in this process nothing is read whole */
        ck_assert_int_eq(r.n_read_whole, 0);
        ck_assert_msg(strstr(t, "2 read (in part:"), "%s", t);
      }
      json_decref(doc);
      probe_free(t);
      probe_ranks_free(&r);
    }
  }
}
END_TEST

/* ---- refused sets ------------------------------------------------------------ */

START_TEST(test_mixed_run_ids_refused) {
  job j;
  job_init(&j, "mixed", 3, 4);
  write_rank_id(&j, 0, "run-a");
  write_rank_id(&j, 1, "run-a");
  write_rank_id(&j, 2, "run-b");
  char paths[MAX_WORLD][256];
  const char *ptrs[MAX_WORLD];
  size_t n = job_paths(&j, paths, ptrs, -1);
  probe_ranks r;
  ck_assert_int_eq(probe_ranks_run(&r, ptrs, n, NULL), PROBE_ERR_INVALID_ARG);
  ck_assert_msg(strstr(r.error, "mixed run ids"), "%s", r.error);
  ck_assert_msg(strstr(r.error, "run-b"), "%s", r.error);
  probe_ranks_free(&r);
  char *js = NULL;
  ck_assert_int_eq(probe_postmortem_json(ptrs, n, &js), PROBE_ERR_INVALID_ARG);
  ck_assert_ptr_null(js);

  /* no run id on one rank against "run-a" */
  write_rank_id(&j, 2, NULL);
  ck_assert_int_eq(probe_ranks_run(&r, ptrs, n, NULL), PROBE_ERR_INVALID_ARG);
  ck_assert_msg(strstr(r.error, "mixed run ids"), "%s", r.error);
  probe_ranks_free(&r);

  /* the same rank twice */
  write_rank_id(&j, 2, "run-a");
  const char *dup[3] = {ptrs[0], ptrs[1], ptrs[1]};
  char copy[300];
  snprintf(copy, sizeof copy, "%s/copy.h5", j.dir);
  char cmd[700];
  snprintf(cmd, sizeof cmd, "cp '%s' '%s'", ptrs[1], copy);
  ck_assert_int_eq(system(cmd), 0);
  dup[2] = copy;
  ck_assert_int_eq(probe_ranks_run(&r, dup, 3, NULL), PROBE_ERR_INVALID_ARG);
  ck_assert_msg(strstr(r.error, "rank 1 twice"), "%s", r.error);
  probe_ranks_free(&r);
}
END_TEST

/* Files without a rank: refused by probe_ranks_run; probe_postmortem_json
 * keeps its document of independent traces. */
static void write_plain(const char *path) {
  probe_options o;
  probe_options_init(&o);
  o.mode = PROBE_MODE_FULL;
  o.overwrite = 1;
  probe_session *s = NULL;
  ck_assert_int_eq(probe_session_open(&s, path, &o), PROBE_OK);
  int32_t id;
  ck_assert_int_eq(probe_layer_register(s, "input", PROBE_KIND_INPUT,
                                        PROBE_DTYPE_F32, &id),
                   PROBE_OK);
  float b[N];
  for (int i = 0; i < N; i++) b[i] = (float)i;
  for (int64_t st = 0; st < 3; st++) {
    ck_assert_int_eq(probe_step_begin(s, st), PROBE_OK);
    ck_assert_int_eq(probe_tensor_record(s, id, PROBE_SITE_FWD_OUT,
                                         PROBE_DTYPE_F32, b, N),
                     PROBE_OK);
    ck_assert_int_eq(probe_step_end(s), PROBE_OK);
  }
  ck_assert_int_eq(probe_session_close(s), PROBE_OK);
}

START_TEST(test_unranked_and_single) {
  job j;
  job_init(&j, "plain", 1, 1);
  char a[300], b[300];
  snprintf(a, sizeof a, "%s/a.h5", j.dir);
  snprintf(b, sizeof b, "%s/b.h5", j.dir);
  write_plain(a);
  write_plain(b);
  const char *two[2] = {a, b};
  probe_ranks r;
  ck_assert_int_eq(probe_ranks_run(&r, two, 2, NULL), PROBE_ERR_INVALID_ARG);
  ck_assert_int_eq(r.unranked, 1);
  probe_ranks_free(&r);
  char *js = NULL;
  ck_assert_int_eq(probe_postmortem_json(two, 2, &js), PROBE_OK);
  json_t *doc = json_loads(js, 0, NULL);
  ck_assert_ptr_nonnull(doc);
  ck_assert_int_eq(json_array_size(json_object_get(doc, "traces")), 2);
  json_decref(doc);
  probe_free(js);

  /* one file: the single-trace document byte for byte, also for a rank */
  job_init(&j, "single", 2, 6);
  j.f[1].nan_input_step = 2;
  write_job(&j);
  char p[256];
  rank_path(&j, 1, p, sizeof p);
  const char *one[1] = {p};
  ck_assert_int_eq(probe_postmortem_json(one, 1, &js), PROBE_OK);
  probe_trace *t = NULL;
  ck_assert_int_eq(probe_trace_open(&t, p), PROBE_OK);
  probe_diag d;
  ck_assert_int_eq(probe_diag_run(&d, t, p, NULL), PROBE_OK);
  char *js2 = NULL;
  ck_assert_int_eq(probe_diag_render_json(&d, &js2), PROBE_OK);
  ck_assert_str_eq(js, js2);
  probe_free(js);
  probe_free(js2);
  probe_diag_free(&d);
  probe_trace_close(t);

  /* several rank files: the cross-rank document */
  char paths[MAX_WORLD][256];
  const char *ptrs[MAX_WORLD];
  size_t n = job_paths(&j, paths, ptrs, -1);
  ck_assert_int_eq(probe_postmortem_json(ptrs, n, &js), PROBE_OK);
  doc = json_loads(js, 0, NULL);
  ck_assert_ptr_nonnull(doc);
  ck_assert_str_eq(json_string_value(json_object_get(doc, "kind")), "ranks");
  ck_assert_int_eq(json_integer_value(json_object_get(doc, "focus_rank")), 1);
  ck_assert_str_eq(json_string_value(json_object_get(
                       json_object_get(doc, "focus"), "verdict")),
                   "diverged");
  json_decref(doc);
  probe_free(js);
}
END_TEST

/* Names from files are escaped in the text and the JSON. */
START_TEST(test_hostile_path_escaped) {
  job j;
  job_init(&j, "esc", 2, 4);
  snprintf(j.base, sizeof j.base, "%s/t\x1b[2J.h5", j.dir);
  write_job(&j);
  char p[256];
  rank_path(&j, 1, p, sizeof p);
  damage(p, 0);
  probe_ranks r;
  run_set(&r, &j, -1, 0);
  char *t = ranks_text(&r);
  ck_assert_ptr_null(strchr(t, '\x1b'));
  ck_assert_ptr_nonnull(strstr(t, "\\e[2J"));
  probe_free(t);
  json_t *doc = ranks_json(&r);
  json_decref(doc);
  probe_ranks_free(&r);
}
END_TEST

/* ---- the CLI over sets -------------------------------------------------------- */

static int run_cli(const char *args, char *out, size_t cap) {
  char cmd[4096];
  snprintf(cmd, sizeof cmd, "%s %s 2>&1", AMPPROBE_BIN, args);
  FILE *p = popen(cmd, "r");
  ck_assert_ptr_nonnull(p);
  size_t n = fread(out, 1, cap - 1, p);
  out[n] = '\0';
  int ws = pclose(p);
  return WIFEXITED(ws) ? WEXITSTATUS(ws) : -1;
}

START_TEST(test_cli_sets) {
  static char out[1 << 20];
  job j;
  job_init(&j, "cli", 4, 10);
  j.f[2].nan_input_step = 7;
  write_job(&j);
  char args[1200];
  /* a directory */
  snprintf(args, sizeof args, "postmortem '%s'", j.dir);
  ck_assert_int_eq(run_cli(args, out, sizeof out), 1);
  ck_assert_msg(strstr(out, "first non-finite  rank 2, step 7"), "%s", out);
  ck_assert_msg(strstr(out, "born on rank 2 (step 7, input/fwd_out); the "
                            "all-reduce carried it to ranks 0-1, 3 at step 7"),
                "%s", out);
  ck_assert_msg(strstr(out, "==== rank 2: the full post-mortem"), "%s", out);
  /* a glob, JSON */
  snprintf(args, sizeof args, "postmortem --json '%s/t.rank*.h5'", j.dir);
  ck_assert_int_eq(run_cli(args, out, sizeof out), 1);
  json_t *doc = json_loads(out, 0, NULL);
  ck_assert_msg(doc != NULL, "%s", out);
  ck_assert_int_eq(json_integer_value(json_object_get(
                       json_object_get(doc, "first_nonfinite"), "rank")),
                   2);
  json_decref(doc);
  /* a list with a corrupt rank: exit 3, the rest diagnosed */
  char p1[256], p0[256], p2[256], p3[256];
  rank_path(&j, 0, p0, sizeof p0);
  rank_path(&j, 1, p1, sizeof p1);
  rank_path(&j, 2, p2, sizeof p2);
  rank_path(&j, 3, p3, sizeof p3);
  damage(p1, 2);
  snprintf(args, sizeof args, "postmortem '%s' '%s' '%s' '%s'", p0, p1, p2, p3);
  ck_assert_int_eq(run_cli(args, out, sizeof out), 3);
  ck_assert_msg(strstr(out, "UNREADABLE"), "%s", out);
  ck_assert_msg(strstr(out, "first non-finite  rank 2, step 7"), "%s", out);
  /* mixed run ids: exit 2 with the message */
  job k;
  job_init(&k, "cli2", 2, 4);
  k.run_id = "other";
  write_job(&k);
  char q[256];
  rank_path(&k, 1, q, sizeof q);
  snprintf(args, sizeof args, "postmortem '%s' '%s'", p0, q);
  ck_assert_int_eq(run_cli(args, out, sizeof out), 2);
  ck_assert_msg(strstr(out, "mixed run ids"), "%s", out);
  /* one file: exit and output as before */
  snprintf(args, sizeof args, "postmortem '%s'", p2);
  ck_assert_int_eq(run_cli(args, out, sizeof out), 1);
  ck_assert_msg(!strstr(out, "rank file"), "%s", out);
  /* an empty glob */
  snprintf(args, sizeof args, "postmortem '%s/none*.h5'", j.dir);
  ck_assert_int_eq(run_cli(args, out, sizeof out), 3);
}
END_TEST

/* diff of two sets: paired by rank, partners missing reported. */
START_TEST(test_cli_diff_sets) {
  static char out[1 << 20];
  job a, b;
  job_init(&a, "diffa", 3, 10);
  write_job(&a);
  job_init(&b, "diffb", 3, 10);
  b.f[1].masked_step = 4;
  write_job(&b);
  char args[1200];
  snprintf(args, sizeof args, "diff --json '%s' '%s/t.rank*.h5'", a.dir,
           b.dir);
  ck_assert_int_eq(run_cli(args, out, sizeof out), 1);
  json_t *doc = json_loads(out, 0, NULL);
  ck_assert_msg(doc != NULL, "%s", out);
  ck_assert_str_eq(json_string_value(json_object_get(doc, "verdict")),
                   "diverge");
  json_t *pairs = json_object_get(doc, "pairs");
  ck_assert_int_eq(json_array_size(pairs), 3);
  for (size_t i = 0; i < 3; i++) {
    json_t *p = json_array_get(pairs, i);
    ck_assert_int_eq(json_integer_value(json_object_get(p, "rank")), (int)i);
    ck_assert_str_eq(json_string_value(json_object_get(p, "verdict")),
                     i == 1 ? "diverge" : "agree");
    ck_assert_ptr_nonnull(json_object_get(p, "diff"));
  }
  json_decref(doc);
  /* text; then B without rank 2 and A without rank 0 */
  snprintf(args, sizeof args, "diff '%s' '%s'", a.dir, b.dir);
  ck_assert_int_eq(run_cli(args, out, sizeof out), 1);
  ck_assert_msg(strstr(out, "    1  DIVERGE"), "%s", out);
  ck_assert_msg(strstr(out, "    0  AGREE"), "%s", out);
  char p[256];
  rank_path(&b, 2, p, sizeof p);
  ck_assert_int_eq(unlink(p), 0);
  rank_path(&a, 0, p, sizeof p);
  ck_assert_int_eq(unlink(p), 0);
  snprintf(args, sizeof args, "diff --json '%s' '%s'", a.dir, b.dir);
  ck_assert_int_eq(run_cli(args, out, sizeof out), 1);
  doc = json_loads(out, 0, NULL);
  ck_assert_msg(doc != NULL, "%s", out);
  char l[64];
  int_list(json_object_get(doc, "only_a"), l, sizeof l);
  ck_assert_str_eq(l, "2");
  int_list(json_object_get(doc, "only_b"), l, sizeof l);
  ck_assert_str_eq(l, "0");
  ck_assert_int_eq(json_array_size(json_object_get(doc, "pairs")), 1);
  json_decref(doc);
  /* two healthy sets agree: exit 0 */
  job c;
  job_init(&c, "diffc", 2, 6);
  write_job(&c);
  job d;
  job_init(&d, "diffd", 2, 6);
  write_job(&d);
  snprintf(args, sizeof args, "diff '%s' '%s'", c.dir, d.dir);
  ck_assert_int_eq(run_cli(args, out, sizeof out), 0);
  ck_assert_msg(strstr(out, "verdict: AGREE"), "%s", out);
  /* a corrupt file in a set: exit 3 */
  rank_path(&d, 1, p, sizeof p);
  damage(p, 0);
  ck_assert_int_eq(run_cli(args, out, sizeof out), 3);
  ck_assert_msg(strstr(out, "UNREADABLE B"), "%s", out);
}
END_TEST

/* The all-reduce's records hold scaled gradients, as weight_grad does:
 * diff compares them unscaled. An FP32 set (scale 1) against an FP16 one
 * (scale 1024) of the same gradients agrees - as sets, as a pair of rank
 * files and in report's baseline panel - where they read DIVERGE at
 * grad_pre_allreduce with rel 1 - 1/1024 = 0.999 (hunt F3, 2026-12). A
 * real difference of the all-reduce alone (fc2's sum doubled from step 2)
 * still diverges, there and from then. */
START_TEST(test_cli_diff_sets_loss_scale) {
  static char out[1 << 20];
  char args[1200];
  job a, b, c;
  job_init(&a, "scale32", 3, 10);
  a.grad_scale = 1.0;
  write_job(&a);
  job_init(&b, "scale16", 3, 10);
  b.grad_scale = 1024.0;
  write_job(&b);
  job_init(&c, "scale16off", 3, 10);
  c.grad_scale = 1024.0;
  c.post_off_from = 2;
  write_job(&c);
  /* sets */
  snprintf(args, sizeof args, "diff '%s' '%s'", a.dir, b.dir);
  ck_assert_int_eq(run_cli(args, out, sizeof out), 0);
  ck_assert_msg(strstr(out, "verdict: AGREE"), "%s", out);
  ck_assert_msg(!strstr(out, "DIVERGE"), "%s", out);
  /* one pair of rank files: no row differs at all */
  char pa[256], pb[256], pc[256];
  rank_path(&a, 1, pa, sizeof pa);
  rank_path(&b, 1, pb, sizeof pb);
  rank_path(&c, 1, pc, sizeof pc);
  snprintf(args, sizeof args, "diff --json '%s' '%s'", pa, pb);
  ck_assert_int_eq(run_cli(args, out, sizeof out), 0);
  json_t *doc = json_loads(out, 0, NULL);
  ck_assert_msg(doc != NULL, "%s", out);
  ck_assert_str_eq(json_string_value(json_object_get(doc, "verdict")), "agree");
  json_t *rows = json_object_get(doc, "layers");
  int allreduce_rows = 0;
  for (size_t i = 0; i < json_array_size(rows); i++) {
    json_t *e = json_array_get(rows, i);
    allreduce_rows += strstr(json_string_value(json_object_get(e, "site")),
                             "allreduce") != NULL;
    ck_assert_msg(json_number_value(json_object_get(e, "max_rel_rms")) < 1e-6,
                  "%s/%s differs",
                  json_string_value(json_object_get(e, "layer")),
                  json_string_value(json_object_get(e, "site")));
  }
  ck_assert_int_eq(allreduce_rows, 4); /* pre and post of fc1 and fc2 */
  json_decref(doc);
  /* report's baseline panel */
  char page[256];
  snprintf(page, sizeof page, "%s/page.html", b.dir);
  snprintf(args, sizeof args, "report -q '%s' --baseline '%s' -o '%s'", pb, pa,
           page);
  ck_assert_int_eq(run_cli(args, out, sizeof out), 0);
  FILE *f = fopen(page, "r");
  ck_assert_ptr_nonnull(f);
  size_t got = fread(out, 1, sizeof out - 1, f);
  out[got] = '\0';
  fclose(f);
  ck_assert_msg(strstr(out, "A and B agree within tolerance"), "no agreement");
  ck_assert_msg(!strstr(out, "A diverges from B"), "a divergence");
  /* a real divergence in the all-reduce: found where it is */
  snprintf(args, sizeof args, "diff '%s' '%s'", a.dir, c.dir);
  ck_assert_int_eq(run_cli(args, out, sizeof out), 1);
  ck_assert_msg(strstr(out, "verdict: DIVERGE"), "%s", out);
  snprintf(args, sizeof args, "diff --json '%s' '%s'", pa, pc);
  ck_assert_int_eq(run_cli(args, out, sizeof out), 1);
  doc = json_loads(out, 0, NULL);
  ck_assert_msg(doc != NULL, "%s", out);
  ck_assert_str_eq(json_string_value(json_object_get(doc, "verdict")),
                   "diverge");
  json_t *intro = json_object_get(json_object_get(doc, "divergence"),
                                  "introduction_point");
  ck_assert_str_eq(json_string_value(json_object_get(intro, "layer")), "fc2");
  ck_assert_str_eq(json_string_value(json_object_get(intro, "site")),
                   "grad_post_allreduce");
  ck_assert_int_ge(json_integer_value(json_object_get(intro, "step")), 2);
  json_decref(doc);
}
END_TEST

/* A side that is not one job is refused as the post-mortem refuses it
 * (exit 2, the files named): it was compared, one of two files of a rank
 * picked at will, ranks of two jobs or world sizes paired (hunt,
 * 2026-12-04). A trace its writer did not close is marked in its row and
 * the note. */
START_TEST(test_cli_diff_sets_one_job) {
  static char out[1 << 16];
  job a;
  job_init(&a, "djob", 3, 6);
  write_job(&a);
  char args[1400], p[256], q[300], cmd[700];
  /* the same rank twice */
  job b;
  job_init(&b, "djobdup", 3, 6);
  write_job(&b);
  rank_path(&b, 1, p, sizeof p);
  snprintf(q, sizeof q, "%s/copy.h5", b.dir);
  snprintf(cmd, sizeof cmd, "cp '%s' '%s'", p, q);
  ck_assert_int_eq(system(cmd), 0);
  snprintf(args, sizeof args, "diff '%s' '%s'", b.dir, a.dir);
  ck_assert_int_eq(run_cli(args, out, sizeof out), 2);
  ck_assert_msg(strstr(out, "ampprobe: diff: A: rank 1 twice"), "%s", out);
  /* two jobs on side B */
  job c;
  job_init(&c, "djobmix", 3, 6);
  write_rank_id(&c, 0, "run-a");
  write_rank_id(&c, 1, "run-a");
  write_rank_id(&c, 2, "run-b");
  snprintf(args, sizeof args, "diff '%s' '%s'", a.dir, c.dir);
  ck_assert_int_eq(run_cli(args, out, sizeof out), 2);
  ck_assert_msg(strstr(out, "ampprobe: diff: B: mixed run ids"), "%s", out);
  /* a killed rank that ends before the other side: compared as far as it
   * went, and not "in agreement" (review 10: a killed candidate passed a
   * diff gate, exit 0), in the set and as a pair of files */
  job k;
  job_init(&k, "djobkill", 3, 6);
  k.f[2].kill_after = 3;
  write_job(&k);
  snprintf(args, sizeof args, "diff '%s' '%s'", a.dir, k.dir);
  ck_assert_int_eq(run_cli(args, out, sizeof out), 1);
  ck_assert_msg(strstr(out, "    2  NOT ALIGNED  - (B not closed)"), "%s", out);
  ck_assert_msg(strstr(out, "    1  AGREE"), "%s", out);
  ck_assert_msg(strstr(out, "note: 0 traces of A and 1 of B were not closed"),
                "%s", out);
  char ka[256], kb[256];
  rank_path(&a, 2, ka, sizeof ka);
  rank_path(&k, 2, kb, sizeof kb);
  snprintf(args, sizeof args, "diff '%s' '%s'", ka, kb);
  ck_assert_int_eq(run_cli(args, out, sizeof out), 1);
  ck_assert_msg(strstr(out, "B was not closed by its writer (killed?) and ends "
                            "at step 3, A at 5"), "%s", out);
  snprintf(args, sizeof args, "diff '%s' '%s'", kb, kb); /* both alike: agree */
  ck_assert_int_eq(run_cli(args, out, sizeof out), 0);
  /* a side refused as corrupt (a world size leaving more than 65,536 ranks
   * without a file) is refused here too (review 10: it agreed, exit 0) */
  job big;
  job_init(&big, "djobbig", 2, 6);
  for (int r = 0; r < 2; r++) { /* two ranks of a world of 100,000 */
    char bp[300];
    snprintf(bp, sizeof bp, "%s/t.rank%d.h5", big.dir, r);
    probe_options o;
    probe_options_init(&o);
    o.rank = r;
    o.world_size = 100000;
    o.run_id = "job-big";
    probe_session *ss = NULL;
    ck_assert_int_eq(probe_session_open(&ss, bp, &o), PROBE_OK);
    ck_assert_int_eq(probe_step_begin(ss, 0), PROBE_OK);
    probe_step_scalars sc = {.loss = 1.0, .loss_scale = 1.0};
    ck_assert_int_eq(probe_step_set_scalars(ss, &sc), PROBE_OK);
    ck_assert_int_eq(probe_step_end(ss), PROBE_OK);
    ck_assert_int_eq(probe_session_close(ss), PROBE_OK);
  }
  snprintf(args, sizeof args, "diff '%s' '%s'", a.dir, big.dir);
  ck_assert_int_eq(run_cli(args, out, sizeof out), 3);
  ck_assert_msg(strstr(out, "ampprobe: diff: B: ") &&
                    strstr(out, "corrupt trace set: world size 100000"), "%s", out);
}
END_TEST

/* ---- classes from the multi-rank audit ------------------------------------ */

/* The origin rank's file is lost in a job with a loss scaler: the others
 * got its NaN through the all-reduce on a step the scaler skipped. That
 * step's loss (the job's mean) is NaN, so it is no routine backoff: the
 * ranks read were reached, and the rank not read is named (it was "the
 * loss went non-finite first on rank 0; no per-layer record shows
 * where"). */
START_TEST(test_lost_origin_with_scaler) {
  job j;
  job_init(&j, "lostorigin", 4, 10);
  j.f[2].nan_input_step = 5;
  write_job(&j);
  probe_ranks r;
  run_set(&r, &j, 2, 0);
  ck_assert_int_eq(r.origin, PROBE_RANKS_ORIGIN_ALLREDUCE);
  ck_assert_int_eq(r.origin_uncertain, 1);
  ck_assert_int_eq(r.event_step, 5);
  check_origin(&r, "allreduce", "", "0,1,3");
  /* NaN: a sum of finite values is not NaN - the lost rank made it */
  ck_assert_msg(strstr(r.origin_text, "is not NaN, so it was born on rank 2, "
                                      "which could not be read"),
                "%s", r.origin_text);
  ck_assert_msg(!strstr(r.fix_text, "--allreduce-dtype"), "%s", r.fix_text);
  ck_assert_msg(strstr(r.fix_text, "read the trace of rank 2"), "%s",
                r.fix_text);
  for (int k = 0; k < 4; k++)
    if (k != 2) ck_assert_int_eq(entry_of(&r, k)->backoff_nonfinite_steps, 0);
  probe_ranks_free(&r);
}
END_TEST

/* Two rank files lost, the NaN born on one of them (rank 1; rank 3 clean):
 * the evidence says only that it came from at least one of them. It read
 * "born on ranks 1, 3, which could not be read" (hunt F5, 2026-12), as if
 * both; now "one of ranks 1, 3", in the library's text and the CLI's. */
START_TEST(test_lost_origin_two_ranks) {
  static char out[1 << 16];
  job j;
  job_init(&j, "losttwo", 4, 10);
  j.f[1].nan_input_step = 5;
  write_job(&j);
  char paths[2][256], args[400];
  const char *ptrs[2] = {paths[0], paths[1]};
  rank_path(&j, 0, paths[0], sizeof paths[0]);
  rank_path(&j, 2, paths[1], sizeof paths[1]);
  probe_ranks r;
  probe_ranks_options o;
  probe_ranks_options_init(&o);
  ck_assert_int_eq(probe_ranks_run(&r, ptrs, 2, &o), PROBE_OK);
  ck_assert_int_eq(r.origin, PROBE_RANKS_ORIGIN_ALLREDUCE);
  ck_assert_int_eq(r.origin_uncertain, 1);
  check_origin(&r, "allreduce", "", "0,2");
  ck_assert_msg(strstr(r.origin_text, "is not NaN, so it was born on one of "
                                      "ranks 1, 3, which could not be read"),
                "%s", r.origin_text);
  ck_assert_msg(strstr(r.fix_text, "read the trace of ranks 1, 3 (restore or "
                                   "re-record them)"), "%s", r.fix_text);
  probe_ranks_free(&r);
  /* the CLI on the directory with those two files gone */
  char p[256];
  rank_path(&j, 1, p, sizeof p);
  ck_assert_int_eq(unlink(p), 0);
  rank_path(&j, 3, p, sizeof p);
  ck_assert_int_eq(unlink(p), 0);
  snprintf(args, sizeof args, "postmortem '%s'", j.dir);
  ck_assert_int_eq(run_cli(args, out, sizeof out), 1);
  ck_assert_msg(strstr(out, "born on one of ranks 1, 3, which could not be "
                            "read"), "%s", out);
  ck_assert_msg(!strstr(out, "born on ranks 1, 3"), "%s", out);
}
END_TEST

/* A FIFO named like rank 2's file in the set's directory: "rank 2: world
 * size 4, no file" it read (hunt F6, 2026-12), though the file is there.
 * The directory's set holds it: the CLI refuses it as every input that is
 * not a regular file (exit 3, the file named), the library marks rank 2
 * unreadable with the reader's reason. */
START_TEST(test_fifo_rank_file) {
  static char out[1 << 16];
  job j;
  job_init(&j, "fifo", 4, 6);
  write_job(&j);
  char p[256], args[400];
  rank_path(&j, 2, p, sizeof p);
  ck_assert_int_eq(unlink(p), 0);
  ck_assert_int_eq(mkfifo(p, 0600), 0);
  snprintf(args, sizeof args, "postmortem '%s'", j.dir);
  ck_assert_int_eq(run_cli(args, out, sizeof out), 3);
  ck_assert_msg(strstr(out, "t.rank2.h5: not a regular file (a FIFO)"), "%s",
                out);
  ck_assert_msg(!strstr(out, "no file"), "%s", out);
  const char *dir = j.dir;
  char **paths = NULL;
  size_t n = 0;
  ck_assert_int_eq(probe_trace_set_expand(&dir, 1, &paths, &n), PROBE_OK);
  ck_assert_uint_eq(n, 4);
  probe_ranks r;
  probe_ranks_options o;
  probe_ranks_options_init(&o);
  ck_assert_int_eq(probe_ranks_run(&r, (const char *const *)paths, n, &o),
                   PROBE_OK);
  probe_trace_set_free(paths, n);
  ck_assert_int_eq(r.n_missing, 0);
  ck_assert_int_eq(r.n_unreadable, 1);
  const probe_rank_entry *e = entry_of(&r, 2);
  ck_assert_int_eq(e->status, PROBE_RANK_UNREADABLE);
  ck_assert_msg(e->error && strstr(e->error, "not a regular file"), "%s",
                e->error ? e->error : "(none)");
  char *t = ranks_text(&r);
  ck_assert_msg(strstr(t, "not a regular file") && !strstr(t, "no file"), "%s",
                t);
  free(t);
  probe_ranks_free(&r);
}
END_TEST

/* A rank read whose trace ends before the event step (killed before it
 * flushed that step) holds no record of it: "every rank's gradients were
 * finite before the all-reduce" is not seen. It was "born in the
 * all-reduce ... all-reduce the gradients in FP32" (hunt, 2026-12-04), the
 * same error as a missing rank's; now the short rank is named as where a
 * NaN was born, with the missing ones, and an inf keeps the all-reduce as
 * the other cause. A rank that ends after the event changes nothing. */
START_TEST(test_allreduce_origin_on_a_short_rank) {
  static const struct {
    const char *tag;
    int nan_rank, skip;
    int64_t kill[4]; /* kill_after per rank, -1 = not killed */
    int inf;         /* the all-reduce returns inf on every rank at step 5 */
    const char *origin, *fix, *carried;
  } cases[] = {
      {"short1", 1, -1, {-1, 4, -1, -1}, 0,
       "is not NaN, so it was born on rank 1, whose trace ends at step 4",
       "re-record rank 1 past step 5 to see where it was born", "0,2,3"},
      {"short2", 2, -1, {-1, 3, 4, -1}, 0,
       "so it was born on one of ranks 1, 2, whose traces end before step 5",
       "re-record ranks 1, 2 past step 5", "0,3"},
      {"shortmiss", 1, 3, {-1, 4, -1, -1}, 0,
       "born on rank 3, which could not be read, or on rank 1, whose trace "
       "ends at step 4",
       "read the trace of rank 3 (restore or re-record it) and re-record rank "
       "1 past step 5", "0,2"},
      {"shortinf", -1, -1, {-1, -1, 4, -1}, 1,
       "born on rank 2, whose trace ends at step 4, or in the all-reduce "
       "itself", "re-record rank 2 past step 5; if every rank's gradients "
       "were finite, all-reduce the gradients in FP32", "0,1,3"},
  };
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    job j;
    job_init(&j, cases[c].tag, 4, 10);
    j.no_scaler = 1;
    for (int k = 0; k < 4; k++) {
      j.f[k].kill_after = cases[c].kill[k];
      if (cases[c].inf) j.f[k].post_inf_step = 5;
    }
    if (cases[c].nan_rank >= 0) j.f[cases[c].nan_rank].nan_input_step = 5;
    write_job(&j);
    probe_ranks r;
    run_set(&r, &j, cases[c].skip, 0);
    ck_assert_int_eq(r.origin, PROBE_RANKS_ORIGIN_ALLREDUCE);
    ck_assert_int_eq(r.event_step, 5);
    ck_assert_int_eq(r.origin_uncertain, 1);
    ck_assert_msg(strstr(r.origin_text, cases[c].origin), "%s: %s",
                  cases[c].tag, r.origin_text);
    ck_assert_msg(strstr(r.fix_text, cases[c].fix), "%s: %s", cases[c].tag,
                  r.fix_text);
    if (!cases[c].inf)
      ck_assert_msg(!strstr(r.fix_text, "--allreduce-dtype"), "%s: %s",
                    cases[c].tag, r.fix_text);
    check_origin(&r, "allreduce", "", cases[c].carried);
    probe_ranks_free(&r);
  }
  /* killed after the event: every rank was seen at step 5, certain */
  job j;
  job_init(&j, "shortlate", 4, 10);
  j.no_scaler = 1;
  for (int k = 0; k < 4; k++) j.f[k].post_inf_step = 5;
  j.f[1].kill_after = 7;
  write_job(&j);
  probe_ranks r;
  run_set(&r, &j, -1, 0);
  ck_assert_int_eq(r.origin, PROBE_RANKS_ORIGIN_ALLREDUCE);
  ck_assert_int_eq(r.origin_uncertain, 0);
  ck_assert_msg(strstr(r.origin_text, "born in the all-reduce"), "%s", r.origin_text);
  probe_ranks_free(&r);
}
END_TEST

/* A routine overflow of rank 0's own gradients on the very step rank 1's
 * input is NaN: rank 1 is born, rank 0 was reached by the all-reduce (it
 * was "born on ranks 0-1 (step 5, input/fwd_out)"); in both modes. */
START_TEST(test_backoff_coincides_with_nan) {
  for (int flight = 0; flight < 2; flight++) {
    job j;
    job_init(&j, flight ? "coincide_fr" : "coincide", 3, 10);
    j.flight = flight;
    j.f[0].grad_inf_step = 5;
    j.f[0].grad_inf_layer = L_FC2; /* before the all-reduce brings the NaN */
    j.f[1].nan_input_step = 5;
    j.f[2].grad_inf_step = 2; /* a routine backoff before it, too */
    write_job(&j);
    probe_ranks r;
    run_set(&r, &j, -1, flight);
    ck_assert_int_eq(r.origin, PROBE_RANKS_ORIGIN_RANK);
    ck_assert_int_eq(r.entries[r.first].rank, 1);
    check_origin(&r, "rank", "1", "0,2");
    ck_assert_int_eq(entry_of(&r, 0)->role, PROBE_RANK_ROLE_CARRIED);
    ck_assert_msg(strstr(r.origin_text, "born on rank 1 (step 5, input/"),
                  "%s", r.origin_text);
    probe_ranks_free(&r);
  }
}
END_TEST

/* Finite gradients whose all-reduce bucket overflows when cast to FP16 on
 * every rank: born in the all-reduce (its cast), with the all-reduce's fix
 * - in the cross-rank origin and in the rank's own diagnosis (it was "born
 * on ranks 0-1 ... grad_pre_allreduce", and the rank's first finding was
 * "keep fc2 in FP32", which does not change the all-reduce). */
START_TEST(test_allreduce_cast_overflow) {
  job j;
  job_init(&j, "cast", 2, 6);
  j.no_scaler = 1;
  j.f[0].cast_inf_step = j.f[1].cast_inf_step = 0;
  write_job(&j);
  probe_ranks r;
  run_set(&r, &j, -1, 0);
  ck_assert_int_eq(r.origin, PROBE_RANKS_ORIGIN_ALLREDUCE);
  ck_assert_int_eq(r.n_cast, 2);
  ck_assert_int_eq(r.n_born, 0);
  ck_assert_int_eq(entry_of(&r, 0)->role, PROBE_RANK_ROLE_CAST);
  ck_assert_msg(strstr(r.origin_text, "cast to its dtype was not on ranks 0-1"),
                "%s", r.origin_text);
  ck_assert_msg(strstr(r.fix_text, "--allreduce-dtype fp32"), "%s", r.fix_text);
  json_t *doc = ranks_json(&r);
  char b[64];
  int_list(json_object_get(json_object_get(doc, "origin"), "cast_on"), b,
           sizeof b);
  ck_assert_str_eq(b, "0,1");
  json_decref(doc);
  ck_assert_ptr_nonnull(r.focus_diag);
  ck_assert_int_eq(r.focus_diag->event, PROBE_DIAG_EVENT_ALLREDUCE);
  ck_assert_int_ge(r.focus_diag->n_findings, 1);
  ck_assert_int_eq(r.focus_diag->findings[0].id,
                   PROBE_DIAG_FINDING_FIX_ALLREDUCE);
  ck_assert_msg(strstr(r.focus_diag->findings[0].title, "overflowed when cast"),
                "%s", r.focus_diag->findings[0].title);
  probe_ranks_free(&r);
}
END_TEST

/* Two ranks born at one step with different causes: each rank's own layer
 * and site is in the origin (only the first rank's was). */
START_TEST(test_born_sites_listed) {
  job j;
  job_init(&j, "twosites", 3, 8);
  j.f[0].nan_input_step = 3;
  j.f[1].masked_step = 3;
  write_job(&j);
  probe_ranks r;
  run_set(&r, &j, -1, 0);
  check_origin(&r, "rank", "0,1", "2");
  ck_assert_msg(strstr(r.origin_text, "rank 0 input/fwd_out; rank 1 fc1/fwd_out"),
                "%s", r.origin_text);
  probe_ranks_free(&r);
  /* the same site on both: said once */
  job_init(&j, "samesite", 3, 8);
  j.f[0].nan_input_step = j.f[1].nan_input_step = 3;
  write_job(&j);
  run_set(&r, &j, -1, 0);
  ck_assert_msg(strstr(r.origin_text, "born on ranks 0-1 (step 3, input/fwd_out)"),
                "%s", r.origin_text);
  probe_ranks_free(&r);
}
END_TEST

/* Files of one run id whose world sizes differ are not one job: refused
 * (they were read as one job of the larger size, "MISSING ranks 2, 3"). */
START_TEST(test_mixed_world_sizes_refused) {
  job a, b;
  job_init(&a, "ws2", 2, 4);
  job_init(&b, "ws4", 4, 4);
  write_rank_id(&a, 0, "job-42");
  write_rank_id(&b, 1, "job-42");
  char p0[256], p1[256];
  rank_path(&a, 0, p0, sizeof p0);
  rank_path(&b, 1, p1, sizeof p1);
  const char *ptrs[2] = {p0, p1};
  probe_ranks r;
  ck_assert_int_eq(probe_ranks_run(&r, ptrs, 2, NULL), PROBE_ERR_INVALID_ARG);
  ck_assert_msg(strstr(r.error, "mixed world sizes"), "%s", r.error);
  ck_assert_msg(strstr(r.error, "world size 2") && strstr(r.error, "has 4"),
                "%s", r.error);
  probe_ranks_free(&r);
}
END_TEST

/* A directory (or glob) left with one rank file of a two-rank job is a set
 * of one: the missing rank is named; the file named alone is still the
 * one-process post-mortem. */
START_TEST(test_cli_set_of_one) {
  static char out[1 << 20];
  job j;
  job_init(&j, "setofone", 2, 6);
  write_job(&j);
  char p1[256], args[1200];
  rank_path(&j, 1, p1, sizeof p1);
  ck_assert_int_eq(unlink(p1), 0);
  snprintf(args, sizeof args, "postmortem --json '%s'", j.dir);
  ck_assert_int_eq(run_cli(args, out, sizeof out), 1);
  json_t *doc = json_loads(out, 0, NULL);
  ck_assert_msg(doc != NULL, "%s", out);
  ck_assert_str_eq(json_string_value(json_object_get(doc, "kind")), "ranks");
  char b[64];
  int_list(json_object_get(doc, "ranks_missing"), b, sizeof b);
  ck_assert_str_eq(b, "1");
  json_decref(doc);
  snprintf(args, sizeof args, "postmortem '%s/t.rank*.h5'", j.dir);
  ck_assert_int_eq(run_cli(args, out, sizeof out), 1);
  ck_assert_msg(strstr(out, "MISSING           rank 1"), "%s", out);
  char p0[256];
  rank_path(&j, 0, p0, sizeof p0);
  snprintf(args, sizeof args, "postmortem --json '%s'", p0);
  run_cli(args, out, sizeof out);
  doc = json_loads(out, 0, NULL);
  ck_assert_msg(doc != NULL, "%s", out);
  ck_assert_ptr_null(json_object_get(doc, "ranks_missing"));
  json_decref(doc);

  /* a folder holding one rank file whose set is refused (rank 5000 of a
   * world of 100,000: more than 65,536 ranks without a file) is refused by
   * postmortem as by report, exit 3; it got the one-process report with no
   * word of the set (hunt, 2026-12-04). A file that cannot be read keeps
   * its own words (a set of one) */
  job w;
  job_init(&w, "setrefused", 1, 4);
  char wp[300];
  snprintf(wp, sizeof wp, "%s/t.rank5000.h5", w.dir);
  probe_options o;
  probe_options_init(&o);
  o.mode = PROBE_MODE_FULL;
  o.rank = 5000;
  o.world_size = 100000;
  o.run_id = "job-42";
  probe_session *s = NULL;
  ck_assert_int_eq(probe_session_open(&s, wp, &o), PROBE_OK);
  ck_assert_int_eq(probe_step_begin(s, 0), PROBE_OK);
  probe_step_scalars sc = {.loss = 1.0, .loss_scale = 1.0};
  ck_assert_int_eq(probe_step_set_scalars(s, &sc), PROBE_OK);
  ck_assert_int_eq(probe_step_end(s), PROBE_OK);
  ck_assert_int_eq(probe_session_close(s), PROBE_OK);
  static const char *cmds[] = {"postmortem '%s'", "report '%s' -o '%s/r.html'"};
  for (int k = 0; k < 2; k++) {
    snprintf(args, sizeof args, cmds[k], w.dir, w.dir);
    ck_assert_int_eq(run_cli(args, out, sizeof out), 3);
    ck_assert_msg(strstr(out, "corrupt trace set: world size 100000 leaves more than "
                              "65536 ranks without a file"), "%s: %s", args, out);
  }
}
END_TEST

/* The library's entry point for a set (what the Python package calls for
 * a directory or a glob): a set of one rank file of a bigger job is the
 * cross-rank document, plain or isolated; probe_postmortem_json keeps the
 * one-process document of a file named alone. */
START_TEST(test_set_json_of_one) {
  job j;
  job_init(&j, "setjson", 3, 6);
  write_job(&j);
  char p0[256], p2[256];
  rank_path(&j, 0, p0, sizeof p0);
  rank_path(&j, 2, p2, sizeof p2);
  const char *one[1] = {p2};
  for (int iso = 0; iso < 2; iso++) {
    char *out = NULL;
    ck_assert_int_eq(iso ? probe_postmortem_set_json_isolated(one, 1, &out)
                         : probe_postmortem_set_json(one, 1, &out),
                     PROBE_OK);
    json_t *doc = json_loads(out, 0, NULL);
    ck_assert_msg(doc != NULL, "%s", out);
    ck_assert_str_eq(json_string_value(json_object_get(doc, "kind")), "ranks");
    char b[64];
    int_list(json_object_get(doc, "ranks_missing"), b, sizeof b);
    ck_assert_str_eq(b, "0,1");
    json_decref(doc);
    probe_free(out);
  }
  char *out = NULL;
  ck_assert_int_eq(probe_postmortem_json(one, 1, &out), PROBE_OK);
  json_t *doc = json_loads(out, 0, NULL);
  ck_assert_ptr_nonnull(doc);
  ck_assert_ptr_null(json_object_get(doc, "ranks_missing"));
  json_decref(doc);
  probe_free(out);
  /* two files: the same cross-rank document either way */
  const char *two[2] = {p0, p2};
  char *a = NULL, *b2 = NULL;
  ck_assert_int_eq(probe_postmortem_json(two, 2, &a), PROBE_OK);
  ck_assert_int_eq(probe_postmortem_set_json(two, 2, &b2), PROBE_OK);
  ck_assert_str_eq(a, b2);
  probe_free(a);
  probe_free(b2);
  /* a missing file: the open's status, no document */
  const char *none[1] = {"/nonexistent/dir/t.rank0.h5"};
  out = (char *)1;
  ck_assert_int_eq(probe_postmortem_set_json(none, 1, &out), PROBE_ERR_NOT_FOUND);
  ck_assert_ptr_null(out);
  ck_assert_int_eq(probe_postmortem_set_json(NULL, 1, &out), PROBE_ERR_INVALID_ARG);
}
END_TEST

/* A rank that closed its trace steps before the others (an exception on
 * that rank, not a kill) is named; the set was "healthy", exit 0. */
START_TEST(test_ended_early) {
  job j;
  job_init(&j, "early", 3, 8);
  j.f[1].close_after = 4;
  write_job(&j);
  probe_ranks r;
  run_set(&r, &j, -1, 0);
  ck_assert_int_eq(r.n_ended_early, 1);
  ck_assert_int_eq(r.entries[r.ended_early].rank, 1);
  ck_assert_int_ge(r.verdict, PROBE_VERDICT_DEGRADED);
  char *t = ranks_text(&r);
  ck_assert_msg(strstr(t, "ended early       rank 1 closed its trace at step 4; "
                          "the furthest rank reached step 7"), "%s", t);
  probe_free(t);
  json_t *doc = ranks_json(&r);
  char b[64];
  int_list(json_object_get(doc, "ended_early"), b, sizeof b);
  ck_assert_str_eq(b, "1");
  json_decref(doc);
  probe_ranks_free(&r);
  /* every rank closed at the same step (an agreed stop): nothing said */
  job_init(&j, "sameend", 3, 8);
  write_job(&j);
  run_set(&r, &j, -1, 0);
  ck_assert_int_eq(r.n_ended_early, 0);
  ck_assert_int_eq(r.verdict, PROBE_VERDICT_HEALTHY);
  probe_ranks_free(&r);
}
END_TEST

/* A rank that ran out of inputs and joined the others (uneven inputs: DDP's
 * join()) marks its trace so before closing it: it did not end early, and
 * a healthy job stays healthy. Without the mark the same trace is "ended
 * early"; with the mark but not closed (killed after joining) it is still
 * a rank that stopped. */
START_TEST(test_joined_not_ended_early) {
  job j;
  job_init(&j, "joined", 3, 8);
  j.f[1].close_after = 4;
  j.f[1].joined = 1;
  write_job(&j);
  for (int iso = 0; iso < 2; iso++) { /* the worker's pipe carries it too */
    probe_ranks r;
    run_set(&r, &j, -1, iso);
    ck_assert_int_eq(r.n_ended_early, 0);
    ck_assert_int_eq(r.ended_early, -1);
    ck_assert_int_eq(r.n_joined, 1);
    ck_assert_int_eq(r.n_incomplete, 0);
    ck_assert_int_eq(entry_of(&r, 1)->joined, 1);
    ck_assert_int_eq(entry_of(&r, 1)->last_step, 4);
    ck_assert_int_eq(entry_of(&r, 0)->joined, 0);
    ck_assert_int_eq(r.verdict, PROBE_VERDICT_HEALTHY);
    char *t = ranks_text(&r);
    ck_assert_msg(strstr(t, "joined            rank 1 ran out of inputs and "
                            "joined the others after step 4 (uneven inputs: "
                            "DDP's join()), its trace closed; the furthest "
                            "rank reached step 7"),
                  "%s", t);
    ck_assert_msg(!strstr(t, "ended early"), "%s", t);
    probe_free(t);
    json_t *doc = ranks_json(&r);
    char b[64];
    int_list(json_object_get(doc, "joined"), b, sizeof b);
    ck_assert_str_eq(b, "1");
    int_list(json_object_get(doc, "ended_early"), b, sizeof b);
    ck_assert_str_eq(b, "");
    ck_assert_str_eq(json_string_value(json_object_get(doc, "verdict")),
                     "healthy");
    json_t *e1 = NULL, *e;
    size_t k;
    json_array_foreach(json_object_get(doc, "ranks"), k, e) {
      ck_assert(json_is_boolean(json_object_get(e, "joined")));
      if (json_integer_value(json_object_get(e, "rank")) == 1) e1 = e;
    }
    ck_assert(json_is_true(json_object_get(e1, "joined")));
    json_decref(doc);
    probe_ranks_free(&r);
  }
  /* that rank's trace alone: the mark said, in its status and JSON */
  probe_diag d;
  diag_of_rank(&j, 1, &d);
  ck_assert_int_eq(d.joined, 1);
  char *dt = NULL, *dj = NULL;
  ck_assert_int_eq(probe_diag_render_text(&d, &dt), PROBE_OK);
  ck_assert_msg(strstr(dt, "the rank ran out of inputs and joined the other "
                           "ranks after its last step"), "%s", dt);
  ck_assert_int_eq(probe_diag_render_json(&d, &dj), PROBE_OK);
  json_t *dd = json_loads(dj, 0, NULL);
  ck_assert(json_is_true(json_object_get(json_object_get(dd, "trace"),
                                         "joined")));
  json_decref(dd);
  probe_free(dt);
  probe_free(dj);
  probe_diag_free(&d);
  diag_of_rank(&j, 0, &d);
  ck_assert_int_eq(d.joined, 0);
  probe_diag_free(&d);
  /* the CLI: healthy, exit 0 */
  static char out[1 << 20];
  char args[512];
  snprintf(args, sizeof args, "postmortem %s", j.dir);
  ck_assert_int_eq(run_cli(args, out, sizeof out), 0);
  ck_assert_msg(strstr(out, "verdict: healthy"), "%s", out);
  ck_assert_msg(strstr(out, "joined            rank 1"), "%s", out);
}
END_TEST

/* The mark missing: the same early close is "ended early" (an exception
 * on that rank, as far as the trace tells). */
START_TEST(test_joined_mark_missing) {
  job j;
  job_init(&j, "nojoinmark", 3, 8);
  j.f[1].close_after = 4;
  write_job(&j);
  probe_ranks r;
  run_set(&r, &j, -1, 0);
  ck_assert_int_eq(r.n_ended_early, 1);
  ck_assert_int_eq(r.entries[r.ended_early].rank, 1);
  ck_assert_int_eq(r.n_joined, 0);
  ck_assert_int_eq(entry_of(&r, 1)->joined, 0);
  ck_assert_int_eq(r.verdict, PROBE_VERDICT_DEGRADED);
  char *t = ranks_text(&r);
  ck_assert_msg(!strstr(t, "joined   "), "%s", t);
  probe_free(t);
  json_t *doc = ranks_json(&r);
  char b[64];
  int_list(json_object_get(doc, "joined"), b, sizeof b);
  ck_assert_str_eq(b, "");
  int_list(json_object_get(doc, "ended_early"), b, sizeof b);
  ck_assert_str_eq(b, "1");
  json_decref(doc);
  probe_ranks_free(&r);
}
END_TEST

/* Joined, then killed before closing (its trace flushed with the mark):
 * still the rank that stopped, not closed, the verdict degraded; the mark
 * is shown on its entry and in the sentence, and it is not in `joined`. */
START_TEST(test_joined_not_closed) {
  job j;
  job_init(&j, "joinkilled", 3, 8);
  j.f[1].kill_after = 4;
  j.f[1].joined = 1;
  write_job(&j);
  probe_ranks r;
  run_set(&r, &j, -1, 0);
  ck_assert_int_eq(r.n_incomplete, 1);
  ck_assert_int_ge(r.stopped_first, 0);
  ck_assert_int_eq(r.entries[r.stopped_first].rank, 1);
  ck_assert_int_eq(entry_of(&r, 1)->joined, 1);
  ck_assert_int_eq(entry_of(&r, 1)->complete, 0);
  ck_assert_int_eq(r.n_joined, 0);
  ck_assert_int_eq(r.n_ended_early, 0);
  ck_assert_int_ge(r.verdict, PROBE_VERDICT_DEGRADED);
  char *t = ranks_text(&r);
  ck_assert_msg(strstr(t, "stopped first     rank 1 at step 4 (its trace was "
                          "not closed after it joined: killed?)"),
                "%s", t);
  ck_assert_msg(!strstr(t, "joined            "), "%s", t);
  probe_free(t);
  json_t *doc = ranks_json(&r);
  char b[64];
  int_list(json_object_get(doc, "joined"), b, sizeof b);
  ck_assert_str_eq(b, "");
  int_list(json_object_get(json_object_get(doc, "stopped_first"),
                           "not_closed"), b, sizeof b);
  ck_assert_str_eq(b, "1");
  json_decref(doc);
  probe_ranks_free(&r);
}
END_TEST

/* A NaN on a rank that then joins: the join excuses its early end, not
 * its NaN (diverged, born on it); two ranks joining at different steps
 * beside a third that ended early by an exception: only that one is
 * "ended early". */
START_TEST(test_joined_with_nan_and_others) {
  job j;
  job_init(&j, "joinnan", 3, 8);
  j.f[1].nan_input_step = 3;
  j.f[1].close_after = 4;
  j.f[1].joined = 1;
  write_job(&j);
  probe_ranks r;
  run_set(&r, &j, -1, 0);
  ck_assert_int_eq(r.verdict, PROBE_VERDICT_DIVERGED);
  ck_assert_int_eq(r.origin, PROBE_RANKS_ORIGIN_RANK);
  ck_assert_int_eq(r.entries[r.first].rank, 1);
  ck_assert_int_eq(r.entries[r.first].nf_step, 3);
  ck_assert_int_eq(r.n_ended_early, 0);
  ck_assert_int_eq(r.n_joined, 1);
  probe_ranks_free(&r);

  job_init(&j, "jointwo", 4, 8);
  j.f[0].close_after = 2;
  j.f[0].joined = 1;
  j.f[1].close_after = 4;
  j.f[1].joined = 1;
  j.f[2].close_after = 5; /* an exception: no mark */
  write_job(&j);
  run_set(&r, &j, -1, 1);
  ck_assert_int_eq(r.n_joined, 2);
  ck_assert_int_eq(r.n_ended_early, 1);
  ck_assert_int_eq(r.entries[r.ended_early].rank, 2);
  ck_assert_int_eq(r.verdict, PROBE_VERDICT_DEGRADED);
  char *t = ranks_text(&r);
  ck_assert_msg(strstr(t, "ended early       rank 2 closed its trace at step "
                          "5; the furthest rank reached step 7"),
                "%s", t);
  ck_assert_msg(strstr(t, "joined            ranks 0-1 ran out of inputs and "
                          "joined the others (uneven inputs: DDP's join()), "
                          "their traces closed, the first after step 2; the "
                          "furthest rank reached step 7"),
                "%s", t);
  probe_free(t);
  json_t *doc = ranks_json(&r);
  char b[64];
  int_list(json_object_get(doc, "joined"), b, sizeof b);
  ck_assert_str_eq(b, "0,1");
  int_list(json_object_get(doc, "ended_early"), b, sizeof b);
  ck_assert_str_eq(b, "2");
  json_decref(doc);
  probe_ranks_free(&r);
}
END_TEST

/* A long list of missing ranks is cut with "...", in ranges (it stopped
 * at "43," with no mark). */
START_TEST(test_missing_list_cut) {
  job j;
  job_init(&j, "manymissing", 120, 2);
  for (int q = 0; q < 120; q += 2) write_rank_id(&j, q, j.run_id);
  char paths[MAX_WORLD][256];
  const char *ptrs[MAX_WORLD];
  size_t n = 0;
  for (int q = 0; q < 120; q += 2) {
    rank_path(&j, q, paths[n], 256);
    ptrs[n] = paths[n];
    n++;
  }
  probe_ranks r;
  ck_assert_int_eq(probe_ranks_run(&r, ptrs, n, NULL), PROBE_OK);
  ck_assert_int_eq(r.n_missing, 60);
  char *t = ranks_text(&r);
  const char *m = strstr(t, "MISSING");
  ck_assert_ptr_nonnull(m);
  const char *eol = strchr(m, '\n');
  ck_assert_msg(eol && memmem(m, (size_t)(eol - m), "...", 3) &&
                    memmem(m, (size_t)(eol - m), ": world size 120, no file", 25),
                "%.*s", (int)(eol ? eol - m : 80), m);
  probe_free(t);
  probe_ranks_free(&r);
}
END_TEST

/* Rank 0 alone has other weights: every other rank differs from it (the
 * reference, the first read), and the line says rank 0 may be the one;
 * rank 2 alone: "1 rank differs from rank 0", no such suspicion. */
START_TEST(test_digest_outlier_first_rank) {
  job j;
  job_init(&j, "odd0", 4, 6);
  j.f[0].digest_from = 2;
  write_job(&j);
  probe_ranks r;
  run_set(&r, &j, -1, 0);
  char *t = ranks_text(&r);
  ck_assert_msg(strstr(t, "3 ranks differ from rank 0, the first rank read: all "
                          "the others, so rank 0 may be the one that differs"),
                "%s", t);
  probe_free(t);
  probe_ranks_free(&r);
  job_init(&j, "odd2", 4, 6);
  j.f[2].digest_from = 2;
  write_job(&j);
  run_set(&r, &j, -1, 0);
  t = ranks_text(&r);
  ck_assert_msg(strstr(t, "1 rank differs from rank 0, the first rank read)"),
                "%s", t);
  probe_free(t);
  probe_ranks_free(&r);
}
END_TEST

/* DDP without the communication hook (no all-reduce records): rank 1's
 * NaN input; rank 0 sees it only in its weights after the update. Rank 0
 * was reached by the all-reduce, not born (it was "born on ranks 0-1 (step
 * 2: rank 0 fc1/master_weight; rank 1 input/fwd_out ...)"). */
START_TEST(test_reached_through_the_update) {
  job j;
  job_init(&j, "nohook", 2, 6);
  j.no_allreduce = 1;
  j.no_scaler = 1;
  j.nan_update = 1;
  j.f[1].nan_input_step = 2;
  write_job(&j);
  probe_ranks r;
  run_set(&r, &j, -1, 0);
  check_origin(&r, "rank", "1", "0");
  ck_assert_int_eq(entry_of(&r, 0)->nf_phase, PROBE_PHASE_OPTIMIZER);
  probe_ranks_free(&r);
}
END_TEST

/* Records kept every 2 steps, each rank logging its own loss: rank 1's
 * loss is NaN at step 3, unrecorded; the first records (step 4) are both
 * ranks' NaN weights. The loss leads and names rank 1 (it was "born on
 * ranks 0-1 (step 4, ...)", next step "lower the learning rate"); the
 * job's mean loss, NaN on every rank, names none. */
START_TEST(test_loss_before_any_record) {
  job j;
  job_init(&j, "every2", 2, 8);
  j.no_scaler = 1;
  j.nan_update = 1;
  j.every = 2;
  j.local_loss = 1;
  j.f[1].nan_input_step = 3;
  write_job(&j);
  probe_ranks r;
  run_set(&r, &j, -1, 0);
  ck_assert_int_eq(r.origin, PROBE_RANKS_ORIGIN_LOSS_ONLY);
  ck_assert_int_eq(r.event_step, 3);
  ck_assert_msg(strstr(r.origin_text, "first on rank 1 at step 3, before any "
                                      "per-layer record"),
                "%s", r.origin_text);
  ck_assert_msg(strstr(r.fix_text, "record every step"), "%s", r.fix_text);
  ck_assert_int_eq(r.entries[r.focus].rank, 1);
  probe_ranks_free(&r);
  job_init(&j, "every2mean", 2, 8);
  j.no_scaler = 1;
  j.nan_update = 1;
  j.every = 2;
  j.f[1].nan_input_step = 3;
  write_job(&j);
  run_set(&r, &j, -1, 0);
  ck_assert_int_eq(r.origin, PROBE_RANKS_ORIGIN_LOSS_ONLY);
  ck_assert_msg(strstr(r.origin_text, "on every rank at step 3 (the job's mean "
                                      "loss: it names no rank)"),
                "%s", r.origin_text);
  probe_ranks_free(&r);
}
END_TEST

/* The focus rank's next steps rerun the job as it ran: a run or bisect of
 * the built-in trainer with --ranks N (they suggested one process, which
 * may be healthy where the job is not). */
START_TEST(test_next_step_keeps_the_ranks) {
  job j;
  job_init(&j, "nextranks", 4, 12);
  j.f[2].masked_step = 5;
  write_job(&j);
  probe_ranks r;
  run_set(&r, &j, -1, 0);
  ck_assert_ptr_nonnull(r.focus_diag);
  int said = 0, bare = 0;
  for (int i = 0; i < r.focus_diag->n_findings; i++) {
    const char *nx = r.focus_diag->findings[i].next_step;
    if (strstr(nx, "--scenario unit")) {
      said |= strstr(nx, "--scenario unit --ranks 4") != NULL;
      bare |= strstr(nx, "--scenario unit --ranks 4") == NULL;
    }
  }
  ck_assert_msg(said && !bare, "%s", r.focus_diag->n_findings
                                          ? r.focus_diag->findings[0].next_step
                                          : "(no finding)");
  probe_ranks_free(&r);
}
END_TEST

/* A gradient that overflowed and went nowhere (not a parameter's: the
 * scaler did not find it, the update did not apply it) on rank 0 one step
 * before rank 1's NaN input: as in the one-process post-mortem it is not
 * the event; rank 1 is born at its step (it was "born on rank 0" a step
 * early, while rank 0's own post-mortem started at the next step). */
START_TEST(test_gradient_that_went_nowhere) {
  job j;
  job_init(&j, "nowhere", 2, 10);
  j.f[0].grad_in_inf_step = 4;
  j.f[1].nan_input_step = 5;
  write_job(&j);
  probe_ranks r;
  run_set(&r, &j, -1, 0);
  ck_assert_int_eq(r.event_step, 5);
  check_origin(&r, "rank", "1", "0");
  probe_ranks_free(&r);
}
END_TEST

/* Every rank's weights go non-finite in the update with finite gradients
 * (a learning rate too high, FP32): born on every rank in the optimizer,
 * not "born in the all-reduce" (each rank took the others' non-finite
 * weights for a forward NaN the all-reduce had carried). */
START_TEST(test_weights_everywhere_not_allreduce) {
  job j;
  job_init(&j, "lrhigh", 2, 6);
  j.no_scaler = 1;
  j.no_allreduce = 1;
  j.weights_nf_step = 2;
  write_job(&j);
  probe_ranks r;
  run_set(&r, &j, -1, 0);
  ck_assert_int_eq(r.origin, PROBE_RANKS_ORIGIN_RANK);
  check_origin(&r, "rank", "0,1", "");
  ck_assert_msg(!strstr(r.fix_text, "--allreduce-dtype"), "%s", r.fix_text);
  probe_ranks_free(&r);
}
END_TEST

/* ---- probe_ranks_run_progress ------------------------------------------- */

typedef struct set_log {
  int calls, bad;
  char what[200];
  char phases[8][32]; /* in the order they came */
  int n_phases;
  uint64_t done, total;             /* the last call's */
  uint64_t ranks_total, ranks_done; /* phase "ranks": its last call */
  const char *stop_in; /* return 1 at the stop_at-th call of this phase */
  int stop_at, in_phase;
} set_log;

static void set_log_bad(set_log *l, const char *phase, uint64_t done,
                        uint64_t total) {
  if (l->bad) return;
  l->bad = 1;
  snprintf(l->what, sizeof l->what, "%s: %llu of %llu after %llu of %llu",
           phase, (unsigned long long)done, (unsigned long long)total,
           (unsigned long long)l->done, (unsigned long long)l->total);
}

static int set_cb(const char *phase, uint64_t done, uint64_t total,
                  void *user) {
  set_log *l = user;
  l->calls++;
  int same = l->n_phases > 0 && !strcmp(l->phases[l->n_phases - 1], phase);
  if (!same) {
    if (l->n_phases < 8)
      snprintf(l->phases[l->n_phases++], sizeof l->phases[0], "%s", phase);
    l->in_phase = 0;
    if (done != 0) set_log_bad(l, phase, done, total); /* begins at 0 */
  } else if (done < l->done || total != l->total) {
    set_log_bad(l, phase, done, total);
  }
  if (done > total) set_log_bad(l, phase, done, total);
  l->in_phase++;
  l->done = done;
  l->total = total;
  if (!strcmp(phase, PROBE_PROGRESS_RANKS)) {
    l->ranks_done = done;
    l->ranks_total = total;
  }
  return l->stop_in && !strcmp(phase, l->stop_in) && l->in_phase >= l->stop_at;
}

/* The progress of a set: each file read is told (phase "ranks", total
 * the files, done 0 first and the total last), then the focus rank's full
 * read (isolated: "checking") and post-mortem ("analysing"); the findings
 * are those of probe_ranks_run; a stop asked in any phase is
 * PROBE_ERR_INTERRUPTED at once. */
START_TEST(test_progress_of_a_set) {
  job j;
  job_init(&j, "progress", 8, 12);
  j.f[5].nan_input_step = 7;
  write_job(&j);
  char paths[MAX_WORLD][256];
  const char *ptrs[MAX_WORLD];
  size_t n = job_paths(&j, paths, ptrs, -1);
  probe_ranks_options o;
  probe_ranks_options_init(&o);
  static const char *const stops[] = {
      PROBE_PROGRESS_RANKS, PROBE_PROGRESS_CHECKING, PROBE_PROGRESS_ANALYSING};
  for (int isolate = 0; isolate <= 1; isolate++) {
    o.isolate = isolate;
    probe_ranks r0, r;
    ck_assert_int_eq(probe_ranks_run(&r0, ptrs, n, &o), PROBE_OK);
    set_log l = {0};
    ck_assert_int_eq(probe_ranks_run_progress(&r, ptrs, n, &o, set_cb, &l),
                     PROBE_OK);
    ck_assert_msg(!l.bad, "%s", l.what);
    ck_assert_str_eq(l.phases[0], PROBE_PROGRESS_RANKS);
    ck_assert_uint_eq(l.ranks_total, n);
    ck_assert_uint_eq(l.ranks_done, n);
    ck_assert_int_ge(l.calls, (int)n + 1);
    /* the focus rank last: its full read (isolated) and its post-mortem */
    ck_assert_str_eq(l.phases[l.n_phases - 1], PROBE_PROGRESS_ANALYSING);
    if (isolate)
      ck_assert_str_eq(l.phases[l.n_phases - 2], PROBE_PROGRESS_CHECKING);
    ck_assert_uint_eq(l.done, l.total);
    ck_assert_int_eq(r.first, r0.first);
    ck_assert_int_eq(r.entries[r.first].rank, 5);
    ck_assert_int_eq(r.verdict, r0.verdict);
    ck_assert_int_eq(r.focus, r0.focus);
    probe_ranks_free(&r0);
    probe_ranks_free(&r);

    for (int k = 0; k < 3; k++) {
      if (!isolate && k == 1) continue; /* no "checking" unisolated */
      set_log stop = {.stop_in = stops[k], .stop_at = 2};
      ck_assert_int_eq(
          probe_ranks_run_progress(&r, ptrs, n, &o, set_cb, &stop),
          PROBE_ERR_INTERRUPTED);
      ck_assert_str_eq(stop.phases[stop.n_phases - 1], stops[k]);
      ck_assert_int_eq(stop.in_phase, 2);
      probe_ranks_free(&r);
    }
  }
  set_log none = {0};
  ck_assert_int_eq(probe_ranks_run_progress(NULL, ptrs, n, &o, set_cb, &none),
                   PROBE_ERR_INVALID_ARG);
  ck_assert_int_eq(none.calls, 0);
}
END_TEST

/* ---- the abort and join marks in the set's outputs ------------------------ */

/* The set part of a cross-rank text (before the focus rank's post-mortem). */
static void set_part(const char *t, char *out, size_t cap) {
  const char *end = strstr(t, "\n==== rank ");
  size_t n = end ? (size_t)(end - t) : strlen(t);
  if (n >= cap) n = cap - 1;
  memcpy(out, t, n);
  out[n] = '\0';
}

/* The per-rank table's row of rank, "" when none. */
static void table_row(const char *t, int rank, char *out, size_t cap) {
  out[0] = '\0';
  const char *p = strstr(t, "\n rank  steps   last  closed");
  char want[16];
  snprintf(want, sizeof want, "\n%5d ", rank);
  const char *q = p ? strstr(p + 1, want) : NULL;
  if (!q) return;
  q++;
  size_t n = strcspn(q, "\n");
  if (n >= cap) n = cap - 1;
  memcpy(out, q, n);
  out[n] = '\0';
}

static json_t *rank_json(json_t *doc, int rank) {
  json_t *e;
  size_t k;
  json_array_foreach(json_object_get(doc, "ranks"), k, e)
    if (json_integer_value(json_object_get(e, "rank")) == rank) return e;
  ck_abort_msg("rank %d not in the JSON", rank);
  return NULL;
}

/* A job stopped by a signal: the signalled rank's trace names the signal,
 * the others' the stop they agreed on, all closed by the tracer at the
 * same step. The set's text says which rank ended by what (ABORTED lines,
 * the table's `closed` and `ended by` columns), not "killed?"; the JSON's
 * per-rank entries carry the reason; the verdict is degraded, exit 1. */
START_TEST(test_aborted_set) {
  job j;
  job_init(&j, "aborted", 3, 8);
  for (int r = 0; r < 3; r++) {
    j.f[r].close_after = 4;
    j.f[r].abort_reason = r == 1 ? "signal SIGTERM" : "another rank's stop";
  }
  write_job(&j);
  for (int iso = 0; iso < 2; iso++) { /* the worker's pipe carries it too */
    probe_ranks r;
    run_set(&r, &j, -1, iso);
    ck_assert_int_eq(r.verdict, PROBE_VERDICT_DEGRADED);
    char *t = ranks_text(&r);
    static char part[1 << 16];
    char row[512];
    set_part(t, part, sizeof part);
    ck_assert_msg(strstr(part, "ABORTED           ranks 0, 2 ended by another "
                               "rank's stop after step 4 (closed by the "
                               "tracer, marked aborted)\n"
                               "                  rank 1 ended by signal "
                               "SIGTERM after step 4 (closed by the tracer, "
                               "marked aborted)\n"),
                  "%s", part);
    ck_assert_msg(strstr(part, "3 not closed (3 marked aborted)"), "%s", part);
    ck_assert_msg(!strstr(part, "killed?"), "%s", part);
    table_row(part, 1, row, sizeof row);
    ck_assert_msg(strstr(row, " aborted ") && strstr(row, "signal SIGTERM"),
                  "row [%s] of\n%s", row, part);
    table_row(part, 0, row, sizeof row);
    ck_assert_msg(strstr(row, " aborted ") && strstr(row, "another rank's stop"),
                  "row [%s] of\n%s", row, part);
    probe_free(t);
    json_t *doc = ranks_json(&r);
    char b[64];
    int_list(json_object_get(doc, "aborted"), b, sizeof b);
    ck_assert_str_eq(b, "0,1,2");
    ck_assert_str_eq(json_string_value(json_object_get(rank_json(doc, 1),
                                                       "aborted")),
                     "signal SIGTERM");
    ck_assert_str_eq(json_string_value(json_object_get(rank_json(doc, 0),
                                                       "aborted")),
                     "another rank's stop");
    ck_assert(json_is_null(json_object_get(rank_json(doc, 1), "aborted_step")));
    ck_assert_str_eq(json_string_value(json_object_get(doc, "verdict")),
                     "degraded");
    json_decref(doc);
    probe_ranks_free(&r);
  }
  static char out[1 << 20];
  char args[512];
  snprintf(args, sizeof args, "postmortem %s", j.dir);
  ck_assert_int_eq(run_cli(args, out, sizeof out), 1);
  ck_assert_msg(strstr(out, "rank 1 ended by signal SIGTERM after step 4"),
                "%s", out);
  snprintf(args, sizeof args, "postmortem --json %s", j.dir);
  ck_assert_int_eq(run_cli(args, out, sizeof out), 1);
  json_t *doc = json_loads(out, 0, NULL);
  ck_assert_msg(doc != NULL, "%s", out);
  ck_assert_str_eq(json_string_value(json_object_get(rank_json(doc, 1),
                                                     "aborted")),
                   "signal SIGTERM");
  json_decref(doc);
}
END_TEST

/* One rank ended by an exception inside a step while the others finished:
 * it stopped first, and the line says what ended it (the reason is data:
 * escaped in the text and the JSON), with the step it closed half done. */
START_TEST(test_aborted_one_rank_escaped) {
  job j;
  job_init(&j, "abortesc", 3, 8);
  j.f[1].close_after = 2;
  j.f[1].abort_in_step = 1;
  j.f[1].abort_reason = "Boom\n<b>\x1b[2J";
  write_job(&j);
  probe_ranks r;
  run_set(&r, &j, -1, 1);
  char *t = ranks_text(&r);
  static char part[1 << 16];
  char row[512];
  set_part(t, part, sizeof part);
  ck_assert_msg(strstr(part, "stopped first     rank 1 at step 3 (ended by "
                             "Boom\\n<b>\\e[2J; its trace was closed by the "
                             "tracer, marked aborted)"),
                "%s", part);
  ck_assert_msg(strstr(part, "ABORTED           rank 1 ended by Boom\\n<b>"
                             "\\e[2J in step 3 (closed half done by the "
                             "tracer, marked aborted)"),
                "%s", part);
  ck_assert_msg(!strchr(part, '\x1b') && !strstr(part, "killed?"), "%s", part);
  table_row(part, 1, row, sizeof row);
  ck_assert_msg(strstr(row, " aborted ") && strstr(row, "Boom\\n<b>"),
                "row [%s] of\n%s", row, part);
  table_row(part, 0, row, sizeof row);
  ck_assert_msg(strstr(row, " yes ") && strstr(row, " - "), "row [%s] of\n%s",
                row, part);
  probe_free(t);
  json_t *doc = ranks_json(&r);
  json_t *e1 = rank_json(doc, 1);
  ck_assert_str_eq(json_string_value(json_object_get(e1, "aborted")),
                   "Boom\\n<b>\\e[2J");
  ck_assert_int_eq(json_integer_value(json_object_get(e1, "aborted_step")), 3);
  ck_assert(json_is_null(json_object_get(rank_json(doc, 0), "aborted")));
  ck_assert_str_eq(json_string_value(json_object_get(
                       json_object_get(doc, "stopped_first"), "aborted")),
                   "Boom\\n<b>\\e[2J");
  json_decref(doc);
  probe_ranks_free(&r);
}
END_TEST

/* A joined rank reads `joined` in the table's `closed` column (it read
 * "yes", as a rank that finished). */
START_TEST(test_joined_in_table) {
  job j;
  job_init(&j, "joinedtable", 3, 8);
  j.f[1].close_after = 4;
  j.f[1].joined = 1;
  write_job(&j);
  probe_ranks r;
  run_set(&r, &j, -1, 1);
  char *t = ranks_text(&r);
  char row[512];
  table_row(t, 1, row, sizeof row);
  ck_assert_msg(strstr(row, "  joined ") != NULL, "row [%s] of\n%s", row, t);
  table_row(t, 0, row, sizeof row);
  ck_assert_msg(strstr(row, "  yes ") != NULL, "row [%s] of\n%s", row, t);
  ck_assert_msg(!strstr(t, "ended by"), "%s", t); /* no abort column */
  probe_free(t);
  probe_ranks_free(&r);
}
END_TEST

/* diff of an aborted trace (a pair, and two sets) names the recorded
 * reason, not "killed?". */
START_TEST(test_diff_names_abort_reason) {
  job a, b;
  job_init(&a, "abortdiff_full", 2, 8);
  write_job(&a);
  job_init(&b, "abortdiff_cut", 2, 8);
  for (int r = 0; r < 2; r++) {
    b.f[r].close_after = 3;
    b.f[r].abort_reason = r == 1 ? "signal SIGINT" : "another rank's stop";
  }
  write_job(&b);
  static char out[1 << 20];
  char args[1200], pa[256], pb[256];
  rank_path(&a, 1, pa, sizeof pa);
  rank_path(&b, 1, pb, sizeof pb);
  snprintf(args, sizeof args, "diff '%s' '%s'", pb, pa);
  ck_assert_int_eq(run_cli(args, out, sizeof out), 1);
  ck_assert_msg(strstr(out, "A was ended by signal SIGINT (marked aborted; "
                            "the tracer closed it) and ends at step 3, B at 7"),
                "%s", out);
  ck_assert_msg(!strstr(out, "killed?"), "%s", out);
  snprintf(args, sizeof args, "diff '%s' '%s'", b.dir, a.dir);
  ck_assert_int_eq(run_cli(args, out, sizeof out), 1);
  ck_assert_msg(strstr(out, "note: 2 traces of A and 0 of B were marked "
                            "aborted (A rank 0 ended by another rank's stop, "
                            "A rank 1 ended by signal SIGINT)"),
                "%s", out);
  ck_assert_msg(!strstr(out, "killed?"), "%s", out);
}
END_TEST

Suite *dist_suite(void) {
  Suite *s = suite_create("dist_postmortem");
  TCase *tc = tcase_create("ranks");
  tcase_set_timeout(tc, 240); /* ASan on a loaded machine */
  tcase_add_test(tc, test_nan_carried_by_allreduce);
  tcase_add_test(tc, test_born_on_two_ranks);
  tcase_add_test(tc, test_lead_and_later);
  tcase_add_test(tc, test_backoffs_are_not_events);
  tcase_add_test(tc, test_no_allreduce_records);
  tcase_add_test(tc, test_order_step_phase_seq);
  tcase_add_test(tc, test_born_in_allreduce);
  tcase_add_test(tc, test_pre_nonfinite_is_not_allreduce);
  tcase_add_test(tc, test_allreduce_with_missing_rank);
  tcase_add_test(tc, test_single_rank_allreduce_event);
  tcase_add_test(tc, test_disagreements);
  tcase_add_test(tc, test_healthy_set);
  tcase_add_test(tc, test_killed_rank);
  tcase_add_test(tc, test_missing_rank);
  tcase_add_test(tc, test_corrupt_rank);
  tcase_add_test(tc, test_read_whole_or_in_part);
  tcase_add_test(tc, test_mixed_run_ids_refused);
  tcase_add_test(tc, test_unranked_and_single);
  tcase_add_test(tc, test_hostile_path_escaped);
  tcase_add_test(tc, test_cli_sets);
  tcase_add_test(tc, test_cli_diff_sets);
  tcase_add_test(tc, test_cli_diff_sets_one_job);
  tcase_add_test(tc, test_cli_diff_sets_loss_scale);
  tcase_add_test(tc, test_lost_origin_two_ranks);
  tcase_add_test(tc, test_fifo_rank_file);
  tcase_add_test(tc, test_lost_origin_with_scaler);
  tcase_add_test(tc, test_allreduce_origin_on_a_short_rank);
  tcase_add_test(tc, test_backoff_coincides_with_nan);
  tcase_add_test(tc, test_allreduce_cast_overflow);
  tcase_add_test(tc, test_born_sites_listed);
  tcase_add_test(tc, test_mixed_world_sizes_refused);
  tcase_add_test(tc, test_cli_set_of_one);
  tcase_add_test(tc, test_set_json_of_one);
  tcase_add_test(tc, test_ended_early);
  tcase_add_test(tc, test_joined_not_ended_early);
  tcase_add_test(tc, test_joined_mark_missing);
  tcase_add_test(tc, test_joined_not_closed);
  tcase_add_test(tc, test_joined_with_nan_and_others);
  tcase_add_test(tc, test_missing_list_cut);
  tcase_add_test(tc, test_digest_outlier_first_rank);
  tcase_add_test(tc, test_reached_through_the_update);
  tcase_add_test(tc, test_loss_before_any_record);
  tcase_add_test(tc, test_next_step_keeps_the_ranks);
  tcase_add_test(tc, test_gradient_that_went_nowhere);
  tcase_add_test(tc, test_weights_everywhere_not_allreduce);
  tcase_add_test(tc, test_progress_of_a_set);
  tcase_add_test(tc, test_aborted_set);
  tcase_add_test(tc, test_aborted_one_rank_escaped);
  tcase_add_test(tc, test_joined_in_table);
  tcase_add_test(tc, test_diff_names_abort_reason);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  snprintf(root, sizeof root, "/tmp/ampprobe-test-dist-%d", (int)getpid());
  mkdir(root, 0700);
  SRunner *sr = srunner_create(dist_suite());
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", root);
  return failed ? 1 : 0;
}
