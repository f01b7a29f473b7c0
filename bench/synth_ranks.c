/*
 * bench/synth_ranks.c - synthetic rank traces of a data-parallel job, for
 * measuring the cross-rank post-mortem at scales this machine cannot train
 * (issue #14.7: 1,024 ranks x 1,000 steps x 30 layers). Every trace goes
 * through the public writer API, one session per rank, exactly as a rank
 * of a real job would write it.
 *
 *   synth_ranks --out DIR [--ranks 1024] [--steps 1000] [--layers 30]
 *               [--mode scalars|full] [--fault-rank R] [--fault-step S]
 *               [--lead K] [--fault-layer L] [--elems N] [--run-id ID]
 *               [--jobs J] [--overwrite] [--verify | --verify-only]
 *               [--quiet]
 *
 * writes DIR/trace.rank<r>.h5 for r = 0..ranks-1 (probe_rank_trace_path of
 * DIR/trace.h5), each with rank, world size and one run id. The job it
 * plays (docs/trace-format.md, "Multi-rank traces"; sites per layer and
 * step: fwd_out in layer order, weight_grad in reverse order, then
 * grad_pre_allreduce and grad_post_allreduce per layer):
 *
 *   - steps < S: every rank healthy. Loss 2.3 exp(-step/300) + 0.2, the same
 *     on every rank (the logged loss is the global mean); a dynamic loss
 *     scale from 2^16 that doubles every 250 clean steps; the weight digest
 *     is probe_digest64 of a synthetic FP32 weight vector that every rank
 *     updates the same way, so equal on every rank at every step.
 *   - steps S .. S+K-1 (K = --lead): the planted first fault - a NaN in
 *     rank R's fwd_out of layer L (rank-local: masked before the loss; the
 *     rank's gradients and every other rank stay finite).
 *   - step S+K: the NaN reaches rank R's loss and gradients: rank R's
 *     fwd_out of layers >= L, weight_grad and grad_pre_allreduce of every
 *     layer are NaN; the all-reduce carries it to every rank
 *     (grad_post_allreduce NaN everywhere), found_inf and skipped on every
 *     rank, the loss (a global mean) NaN, the scale backs off, the weights
 *     (digest) do not change.
 *   - after: healthy again on every rank.
 *
 * Defaults: R = ranks*5/8, S = steps*9/10, K = 3, L = layers/2, 64
 * elements per tensor, mode scalars (the flight recorder: what a 1,024-rank
 * job would run; records only around the non-finite events). Progress goes
 * to stderr; the last line (stdout) gives ranks, time and bytes on disk.
 * --verify reopens every trace and checks the rank attributes, the run id,
 * the first non-finite step (S on rank R, S+K elsewhere) and that digest,
 * loss scale and skipped agree across ranks at every step; exit 1 if not.
 * --verify-only does only that, on a set written before (same options).
 * --jobs J writes with J processes (rank r in process r mod J).
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ampprobe/probe.h"

#define DIGEST_WEIGHTS 256   /* floats of the synthetic weight vector */
#define SCALE_INIT 65536.0   /* the loss scale's start, 2^16 */
#define SCALE_GROWTH_STEPS 250 /* clean steps between doublings */
#define PROGRESS_SECONDS 2.0 /* at most one progress line per this long */

typedef struct synth {
  const char *out;
  int ranks, layers, elems, mode, jobs, overwrite, verify, verify_only, quiet;
  int64_t steps, fault_step, lead;
  int fault_rank, fault_layer;
  char run_id[PROBE_RUN_ID_MAX + 1];
} synth;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void usage(FILE *f) {
  fprintf(f,
          "usage: synth_ranks --out DIR [--ranks 1024] [--steps 1000] "
          "[--layers 30]\n"
          "         [--mode scalars|full] [--fault-rank R] [--fault-step S] "
          "[--lead K]\n"
          "         [--fault-layer L] [--elems N] [--run-id ID] [--jobs J]\n"
          "         [--overwrite] [--verify | --verify-only] [--quiet]\n");
}

/* ---- the synthetic job --------------------------------------------------- */

/* One step of the job as every rank sees it (rank-independent parts). */
typedef struct step_state {
  double loss_scale;
  int growth_tracker;
  uint64_t digest;
  float w[DIGEST_WEIGHTS];
} step_state;

static void state_init(step_state *g) {
  memset(g, 0, sizeof *g);
  g->loss_scale = SCALE_INIT;
  for (int i = 0; i < DIGEST_WEIGHTS; i++)
    g->w[i] = 0.02f * (float)((i * 37) % 101 - 50) / 50.0f;
  g->digest = probe_digest64(g->w, sizeof g->w, PROBE_DIGEST64_INIT);
}

/* The optimizer step every rank takes identically (skipped: none). */
static void state_update(step_state *g, int64_t step) {
  for (int i = 0; i < DIGEST_WEIGHTS; i++)
    g->w[i] -= 1e-4f * sinf((float)(step + 1) * 0.01f * (float)(i + 1));
  g->digest = probe_digest64(g->w, sizeof g->w, PROBE_DIGEST64_INIT);
}

/* Fills x with n values of about `scale` whose statistics vary with the
 * key; a NaN at element 3 when nan. */
static void tensor(float *x, int n, uint32_t key, float scale, int nan) {
  uint32_t h = key * 2654435761u + 0x9e3779b9u;
  for (int i = 0; i < n; i++) {
    h = h * 1664525u + 1013904223u;
    x[i] = scale * ((float)(int32_t)(h >> 8 & 0xffff) - 32768.0f) / 32768.0f;
  }
  if (nan && n > 3) x[3] = NAN;
}

#define CHECK_(x)                                                              \
  do {                                                                         \
    probe_status st_ = (x);                                                    \
    if (st_ != PROBE_OK) {                                                     \
      fprintf(stderr, "synth_ranks: rank %d: %s: %s (%s)\n", w->rank, #x,      \
              probe_status_str(st_), probe_session_last_error(w->s));          \
      return -1;                                                               \
    }                                                                          \
  } while (0)

/* One rank's writer: its session, the job's state, tensor slots. */
typedef struct rank_writer {
  const synth *c;
  int rank, is_r; /* is_r: this rank holds the planted fault */
  probe_session *s;
  step_state g;
  float *x; /* 4 tensors per layer, valid until probe_step_end */
} rank_writer;

static float *slot(const rank_writer *w, int layer, int k) {
  return w->x + (size_t)(4 * layer + k) * (size_t)w->c->elems;
}

/* The step's records: fwd_out in layer order, weight_grad in reverse,
 * then grad_pre/post_allreduce per layer. local_nan: the planted fault's
 * rank-local NaN; burst: the step the all-reduce carries it. */
static int record_step(rank_writer *w, int64_t step, int local_nan,
                       int burst) {
  const synth *c = w->c;
  size_t n = (size_t)c->elems;
  uint32_t r = (uint32_t)w->rank;
  for (int l = 0; l < c->layers; l++) {
    int nan = (local_nan && l == c->fault_layer) ||
              (burst && w->is_r && l >= c->fault_layer);
    tensor(slot(w, l, 0), c->elems, (uint32_t)(step * 131 + l * 7) + r, 2.0f,
           nan);
    CHECK_(probe_tensor_record(w->s, l, PROBE_SITE_FWD_OUT, PROBE_DTYPE_F32,
                               slot(w, l, 0), n));
  }
  float gscale = (float)(w->g.loss_scale * 1e-6);
  for (int l = c->layers - 1; l >= 0; l--) {
    uint32_t key = (uint32_t)(step * 977 + l * 13) + r * 7;
    tensor(slot(w, l, 1), c->elems, key, gscale, burst && w->is_r);
    CHECK_(probe_tensor_record(w->s, l, PROBE_SITE_WEIGHT_GRAD,
                               PROBE_DTYPE_F32, slot(w, l, 1), n));
  }
  for (int l = 0; l < c->layers; l++) {
    uint32_t key = (uint32_t)(step * 977 + l * 13) + r * 7;
    tensor(slot(w, l, 2), c->elems, key, gscale, burst && w->is_r);
    /* the reduced bucket is the same on every rank */
    tensor(slot(w, l, 3), c->elems, (uint32_t)(step * 331 + l * 17), gscale,
           burst);
    CHECK_(probe_tensor_record(w->s, l, PROBE_SITE_GRAD_PRE_ALLREDUCE,
                               PROBE_DTYPE_F32, slot(w, l, 2), n));
    CHECK_(probe_tensor_record(w->s, l, PROBE_SITE_GRAD_POST_ALLREDUCE,
                               PROBE_DTYPE_F32, slot(w, l, 3), n));
  }
  return 0;
}

/* The loss scaler and the optimizer step, the same on every rank: a
 * backoff and no update at the burst, else the update and a growth every
 * SCALE_GROWTH_STEPS clean steps; then the step's scalars. */
static int scalars_step(rank_writer *w, int64_t step, int burst) {
  step_state *g = &w->g;
  probe_step_scalars sc = {
      .loss = burst ? NAN : 2.3 * exp(-(double)step / 300.0) + 0.2,
      .loss_scale = g->loss_scale,
      .found_inf = burst,
      .skipped = burst,
      .lr = 3e-4,
      .unmeasured = PROBE_SCALAR_GRAD_NORM | PROBE_SCALAR_CLIP};
  double factor = 0;
  if (burst) factor = 0.5;
  else {
    state_update(g, step);
    if (++g->growth_tracker == SCALE_GROWTH_STEPS) factor = 2.0;
  }
  if (factor != 0) {
    probe_scaler_event ev = {
        .kind = burst ? PROBE_SCALER_BACKOFF : PROBE_SCALER_GROWTH,
        .old_scale = g->loss_scale,
        .new_scale = g->loss_scale * factor,
        .growth_tracker = 0};
    g->loss_scale *= factor;
    g->growth_tracker = 0;
    CHECK_(probe_scaler_transition(w->s, &ev));
  }
  sc.growth_tracker = g->growth_tracker;
  sc.weight_digest = g->digest; /* after the (possibly skipped) step */
  CHECK_(probe_step_set_scalars(w->s, &sc));
  return 0;
}

static int write_steps(rank_writer *w) {
  const synth *c = w->c;
  for (int l = 0; l < c->layers; l++) {
    char name[PROBE_NAME_MAX];
    snprintf(name, sizeof name, "blocks.%d.linear", l);
    CHECK_(probe_layer_register(w->s, name, PROBE_KIND_LINEAR,
                                PROBE_DTYPE_F16, NULL));
  }
  int64_t carried = c->fault_step + c->lead;
  for (int64_t step = 0; step < c->steps; step++) {
    int local_nan = w->is_r && step >= c->fault_step && step < carried;
    int burst = step == carried; /* the all-reduce carries it */
    CHECK_(probe_step_begin(w->s, step));
    if (record_step(w, step, local_nan, burst) < 0 ||
        scalars_step(w, step, burst) < 0)
      return -1;
    CHECK_(probe_step_end(w->s));
  }
  return 0;
}
#undef CHECK_

/* Writes rank `rank`'s trace. Returns 0, or -1 (message printed). */
static int write_rank(const synth *c, int rank, const char *path) {
  probe_options o;
  probe_options_init(&o);
  o.mode = c->mode;
  o.overwrite = c->overwrite;
  o.rank = rank;
  o.world_size = c->ranks;
  o.run_id = c->run_id;
  o.command_line = "synth_ranks";
  o.config_json = "{\"synthetic\": true}";
  o.precision_policy = "fp16; fp32: master weights";
  rank_writer w = {.c = c, .rank = rank, .is_r = rank == c->fault_rank};
  state_init(&w.g);
  probe_status st = probe_session_open(&w.s, path, &o);
  if (st != PROBE_OK) {
    fprintf(stderr, "synth_ranks: %s: %s (%s)\n", path, probe_status_str(st),
            probe_session_last_error(NULL));
    return -1;
  }
  w.x = malloc((size_t)c->layers * 4 * (size_t)c->elems * sizeof *w.x);
  int rc = w.x ? write_steps(&w) : -1;
  if (w.x == NULL) fprintf(stderr, "synth_ranks: out of memory\n");
  free(w.x);
  st = probe_session_close(w.s);
  if (st != PROBE_OK && rc == 0) {
    fprintf(stderr, "synth_ranks: %s: close: %s\n", path, probe_status_str(st));
    rc = -1;
  }
  return rc;
}

/* ---- driver -------------------------------------------------------------- */

static long long file_bytes(const char *path) {
  struct stat sb;
  return stat(path, &sb) == 0 ? (long long)sb.st_blocks * 512 : 0;
}

/* Writes ranks job, job + jobs, ...; progress from job 0 only (it sees
 * its share; the others keep pace). Returns 0 or -1. */
static int run_share(const synth *c, int job, double t0) {
  double last = t0;
  char base[4096], path[4096];
  snprintf(base, sizeof base, "%s/trace.h5", c->out);
  for (int r = job; r < c->ranks; r += c->jobs) {
    if (probe_rank_trace_path(path, sizeof path, base, r) != PROBE_OK) {
      fprintf(stderr, "synth_ranks: path too long\n");
      return -1;
    }
    if (write_rank(c, r, path) < 0) return -1;
    double t = now_s();
    if (job == 0 && !c->quiet && (t - last >= PROGRESS_SECONDS ||
                                  r + c->jobs >= c->ranks)) {
      int done = r + 1 < c->ranks ? r + 1 : c->ranks;
      fprintf(stderr, "synth_ranks: %d/%d ranks, %.1f s, %.1f ranks/s\n",
              done, c->ranks, t - t0, done / (t - t0));
      last = t;
    }
  }
  return 0;
}

static int generate(const synth *c) {
  double t0 = now_s();
  if (c->jobs <= 1) return run_share(c, 0, t0);
  pid_t *pids = calloc((size_t)c->jobs, sizeof *pids);
  if (pids == NULL) return -1;
  fflush(NULL);
  int started = 0, bad = 0;
  for (; started < c->jobs; started++) {
    pid_t p = fork();
    if (p == 0) _exit(run_share(c, started, t0) == 0 ? 0 : 1);
    if (p < 0) {
      fprintf(stderr, "synth_ranks: fork: %s\n", strerror(errno));
      bad = 1;
      break;
    }
    pids[started] = p;
  }
  for (int j = 0; j < started; j++) {
    int st = 0;
    while (waitpid(pids[j], &st, 0) < 0 && errno == EINTR) {
    }
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) bad = 1;
  }
  free(pids);
  return bad ? -1 : 0;
}

/* ---- --verify ------------------------------------------------------------ */

#define VFAIL_(...)                                                            \
  do {                                                                         \
    fprintf(stderr, "synth_ranks: verify: " __VA_ARGS__);                      \
    fputc('\n', stderr);                                                       \
    goto out;                                                                  \
  } while (0)

/* Checks one rank's trace against the job; ref (steps rows of rank 0,
 * or NULL for rank 0 itself) for the cross-rank agreement. */
static int verify_rank(const synth *c, int rank, const char *path,
                       probe_step_scalars *ref) {
  probe_trace *t = NULL;
  int ok = 0;
  enum { CH = 512 };
  probe_step_scalars buf[CH];
  if (probe_trace_open(&t, path) != PROBE_OK)
    VFAIL_("%s", probe_trace_last_error(NULL));
  const probe_trace_info *in = probe_trace_get_info(t);
  int64_t want_nf = rank == c->fault_rank ? c->fault_step
                                          : c->fault_step + c->lead;
  if (in->rank != rank || in->world_size != c->ranks ||
      strcmp(in->run_id, c->run_id) != 0)
    VFAIL_("%s: rank %d of %d, run id '%s'", path, in->rank, in->world_size,
           in->run_id);
  if (!in->complete || in->n_steps != c->steps)
    VFAIL_("%s: %lld steps, complete %d", path, (long long)in->n_steps,
           in->complete);
  if (in->first_nonfinite_step != want_nf)
    VFAIL_("%s: first non-finite step %lld, want %lld", path,
           (long long)in->first_nonfinite_step, (long long)want_nf);
  size_t got;
  for (int64_t at = 0; at < in->n_steps; at += (int64_t)got) {
    if (probe_trace_read_steps(t, at, CH, buf, &got) != PROBE_OK || got == 0)
      VFAIL_("%s", probe_trace_last_error(t));
    for (size_t i = 0; i < got; i++) {
      probe_step_scalars *r = &ref[at + (int64_t)i];
      if (rank == 0) *r = buf[i];
      else if (buf[i].weight_digest != r->weight_digest ||
               buf[i].loss_scale != r->loss_scale ||
               buf[i].skipped != r->skipped)
        VFAIL_("%s: step %lld disagrees with rank 0", path,
               (long long)buf[i].step);
      if (buf[i].unmeasured & PROBE_SCALAR_WEIGHT_DIGEST)
        VFAIL_("%s: step %lld has no digest", path, (long long)buf[i].step);
    }
  }
  ok = 1;
out:
  probe_trace_close(t);
  return ok ? 0 : -1;
}
#undef VFAIL_

static int verify(const synth *c) {
  probe_step_scalars *ref = malloc((size_t)c->steps * sizeof *ref);
  if (ref == NULL) return -1;
  char base[4096], path[4096];
  snprintf(base, sizeof base, "%s/trace.h5", c->out);
  int bad = 0;
  for (int r = 0; r < c->ranks && !bad; r++) {
    probe_rank_trace_path(path, sizeof path, base, r);
    bad = verify_rank(c, r, path, ref) < 0;
  }
  free(ref);
  return bad ? -1 : 0;
}

/* ---- arguments ----------------------------------------------------------- */

static int parse_int(const char *s, long long lo, long long hi,
                     long long *out) {
  char *end;
  errno = 0;
  long long v = strtoll(s, &end, 10);
  if (errno || end == s || *end || v < lo || v > hi) return -1;
  *out = v;
  return 0;
}

/* One option with a value; fault[3] gets --fault-rank/-step/-layer.
 * Returns 0, 1 for a bad value, -1 for an unknown option. */
static int parse_value(synth *c, const char *a, const char *val,
                       long long fault[3]) {
  long long v;
  if (!strcmp(a, "--out")) c->out = val;
  else if (!strcmp(a, "--ranks"))
    return parse_int(val, 1, 1 << 20, &v) || (c->ranks = (int)v, 0);
  else if (!strcmp(a, "--steps"))
    return parse_int(val, 1, 1LL << 40, &v) || (c->steps = v, 0);
  else if (!strcmp(a, "--layers"))
    return parse_int(val, 1, 100000, &v) || (c->layers = (int)v, 0);
  else if (!strcmp(a, "--elems"))
    return parse_int(val, 4, 1 << 24, &v) || (c->elems = (int)v, 0);
  else if (!strcmp(a, "--jobs"))
    return parse_int(val, 1, 256, &v) || (c->jobs = (int)v, 0);
  else if (!strcmp(a, "--lead"))
    return parse_int(val, 0, 1LL << 40, &v) || (c->lead = v, 0);
  else if (!strcmp(a, "--fault-rank"))
    return parse_int(val, 0, 1 << 20, &fault[0]) != 0;
  else if (!strcmp(a, "--fault-step"))
    return parse_int(val, 0, 1LL << 40, &fault[1]) != 0;
  else if (!strcmp(a, "--fault-layer"))
    return parse_int(val, 0, 100000, &fault[2]) != 0;
  else if (!strcmp(a, "--run-id"))
    return snprintf(c->run_id, sizeof c->run_id, "%s", val) >=
           (int)sizeof c->run_id;
  else if (!strcmp(a, "--mode")) {
    if (!strcmp(val, "scalars")) c->mode = PROBE_MODE_SCALARS;
    else if (!strcmp(val, "full")) c->mode = PROBE_MODE_FULL;
    else return 1;
  } else return -1;
  return 0;
}

/* The defaults that depend on the job's size, and the fault inside it. */
static int finish_args(synth *c, const long long fault[3]) {
  if (c->out == NULL) {
    fprintf(stderr, "synth_ranks: --out DIR is required\n");
    return -1;
  }
  c->fault_rank = fault[0] >= 0 ? (int)fault[0] : c->ranks * 5 / 8;
  c->fault_step = fault[1] >= 0 ? fault[1] : c->steps * 9 / 10;
  c->fault_layer = fault[2] >= 0 ? (int)fault[2] : c->layers / 2;
  if (c->fault_rank >= c->ranks || c->fault_layer >= c->layers ||
      c->fault_step + c->lead >= c->steps) {
    fprintf(stderr,
            "synth_ranks: the fault (rank %d, layer %d, steps %lld..%lld) "
            "must lie inside the job (%d ranks, %d layers, %lld steps)\n",
            c->fault_rank, c->fault_layer, (long long)c->fault_step,
            (long long)(c->fault_step + c->lead), c->ranks, c->layers,
            (long long)c->steps);
    return -1;
  }
  if (c->run_id[0] == '\0')
    snprintf(c->run_id, sizeof c->run_id, "synth-%d-%lld-%d", c->ranks,
             (long long)c->steps, c->layers);
  return 0;
}

static int parse_args(synth *c, int argc, char **argv) {
  long long fault[3] = {-1, -1, -1};
  memset(c, 0, sizeof *c);
  c->ranks = 1024;
  c->steps = 1000;
  c->layers = 30;
  c->elems = 64;
  c->lead = 3;
  c->jobs = 1;
  c->mode = PROBE_MODE_SCALARS;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "--overwrite")) c->overwrite = 1;
    else if (!strcmp(a, "--verify")) c->verify = 1;
    else if (!strcmp(a, "--verify-only")) c->verify = c->verify_only = 1;
    else if (!strcmp(a, "--quiet")) c->quiet = 1;
    else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
      usage(stdout);
      exit(0);
    } else if (i + 1 == argc) {
      fprintf(stderr, "synth_ranks: %s needs a value\n", a);
      return -1;
    } else {
      int rc = parse_value(c, a, argv[++i], fault);
      if (rc != 0) {
        if (rc < 0) fprintf(stderr, "synth_ranks: unknown option %s\n", a);
        else fprintf(stderr, "synth_ranks: bad value for %s: %s\n", a, argv[i]);
        return -1;
      }
    }
  }
  return finish_args(c, fault);
}

int main(int argc, char **argv) {
  synth c;
  if (parse_args(&c, argc, argv) < 0) {
    usage(stderr);
    return 2;
  }
  if (!c.verify_only && mkdir(c.out, 0755) != 0 && errno != EEXIST) {
    fprintf(stderr, "synth_ranks: %s: %s\n", c.out, strerror(errno));
    return 1;
  }
  if (!c.quiet && !c.verify_only)
    fprintf(stderr,
            "synth_ranks: %d ranks x %lld steps x %d layers (%s mode, %d "
            "elements per tensor) into %s; first fault: rank %d, layer %d, "
            "step %lld; carried to every rank at step %lld; run id %s\n",
            c.ranks, (long long)c.steps, c.layers,
            c.mode == PROBE_MODE_FULL ? "full" : "scalars", c.elems, c.out,
            c.fault_rank, c.fault_layer, (long long)c.fault_step,
            (long long)(c.fault_step + c.lead), c.run_id);
  double t0 = now_s();
  if (!c.verify_only && generate(&c) < 0) return 1;
  double t_gen = now_s() - t0;
  long long bytes = 0, biggest = 0;
  char base[4096], path[4096];
  snprintf(base, sizeof base, "%s/trace.h5", c.out);
  for (int r = 0; r < c.ranks; r++) {
    probe_rank_trace_path(path, sizeof path, base, r);
    long long b = file_bytes(path);
    bytes += b;
    if (b > biggest) biggest = b;
  }
  if (!c.verify_only)
    printf("synth_ranks: %d ranks x %lld steps x %d layers, %s mode: %.1f "
           "s, %.1f MiB on disk (%.1f KiB per rank, largest %.1f KiB)\n",
           c.ranks, (long long)c.steps, c.layers,
           c.mode == PROBE_MODE_FULL ? "full" : "scalars", t_gen,
           (double)bytes / 1048576.0, (double)bytes / 1024.0 / c.ranks,
           (double)biggest / 1024.0);
  if (c.verify) {
    double tv = now_s();
    if (verify(&c) < 0) return 1;
    printf("synth_ranks: verified %d traces in %.1f s\n", c.ranks,
           now_s() - tv);
  }
  return 0;
}
