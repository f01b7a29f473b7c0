/*
 * tests/trainer/dist_check.c - reads the per-rank traces of a data-parallel
 * run for tests/trainer/mpi_smoke.sh (not a test by itself). Commands:
 *   info T                  "rank R world W run_id ID complete C steps N
 *                           last_step S" (S: the last step with records)
 *   agree T1 T2 ...         every step's loss, loss scale, found_inf,
 *                           skipped and weight digest equal on all traces
 *                           (and a digest measured); exit 1 naming the first
 *                           difference
 *   loss-close A B RELTOL   the step losses of A and B within RELTOL
 *                           (relative to the larger magnitude), same steps;
 *                           prints the largest relative difference
 *   first-nonfinite T       "STEP SITE LAYER" of the first record (by step,
 *                           then execution order) holding inf or NaN, or
 *                           "none"
 *   site T SITE STEP        "finite", "nonfinite" or "absent": the records
 *                           of that site at that step
 * Exit: 0 ok, 1 check failed, 2 usage or unreadable trace.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ampprobe/probe.h"

#define CHUNK 4096

static probe_trace *open_or_die(const char *path) {
  probe_trace *t = NULL;
  if (probe_trace_open(&t, path) != PROBE_OK) {
    fprintf(stderr, "dist_check: %s: %s\n", path, probe_trace_last_error(NULL));
    exit(2);
  }
  return t;
}

/* All step rows of a trace (malloc'd), *n rows. */
static probe_step_scalars *read_steps(probe_trace *t, size_t *n) {
  const probe_trace_info *inf = probe_trace_get_info(t);
  size_t cap = (size_t)(inf->n_steps > 0 ? inf->n_steps : 1);
  probe_step_scalars *s = calloc(cap, sizeof *s);
  size_t got = 0, k = 0;
  while (s && k < cap &&
         probe_trace_read_steps(t, (int64_t)k, cap - k, s + k, &got) ==
             PROBE_OK &&
         got)
    k += got;
  *n = k;
  return s;
}

static int nonfinite(const probe_record *r) {
  return r->stats.nan_count || r->stats.posinf_count || r->stats.neginf_count;
}

static int cmd_info(const char *path) {
  probe_trace *t = open_or_die(path);
  const probe_trace_info *i = probe_trace_get_info(t);
  printf("rank %d world %d run_id %s complete %d steps %lld last_step %lld\n",
         i->rank, i->world_size, i->run_id, i->complete, (long long)i->n_steps,
         (long long)i->last_step);
  probe_trace_close(t);
  return 0;
}

static int same(double a, double b) {
  return (isnan(a) && isnan(b)) || a == b;
}

static int cmd_agree(int n, char **paths) {
  size_t n0 = 0;
  probe_trace *t0 = open_or_die(paths[0]);
  probe_step_scalars *s0 = read_steps(t0, &n0);
  int bad = 0;
  for (size_t i = 0; i < n0; i++)
    if (s0[i].unmeasured & PROBE_SCALAR_WEIGHT_DIGEST) {
      printf("%s: step %lld: no weight digest\n", paths[0],
             (long long)s0[i].step);
      bad = 1;
      break;
    }
  for (int k = 1; k < n && !bad; k++) {
    size_t nk = 0;
    probe_trace *tk = open_or_die(paths[k]);
    probe_step_scalars *sk = read_steps(tk, &nk);
    if (nk != n0) {
      printf("%s has %zu steps, %s %zu\n", paths[k], nk, paths[0], n0);
      bad = 1;
    }
    for (size_t i = 0; i < n0 && i < nk && !bad; i++) {
      const probe_step_scalars *a = &s0[i], *b = &sk[i];
      const char *what = NULL;
      if (a->step != b->step) what = "step";
      else if (!same(a->loss, b->loss)) what = "loss";
      else if (!same(a->loss_scale, b->loss_scale)) what = "loss_scale";
      else if (a->found_inf != b->found_inf) what = "found_inf";
      else if (a->skipped != b->skipped) what = "skipped";
      else if (a->weight_digest != b->weight_digest) what = "weight_digest";
      if (what) {
        printf("step %lld: %s differs between %s and %s\n",
               (long long)a->step, what, paths[0], paths[k]);
        bad = 1;
      }
    }
    free(sk);
    probe_trace_close(tk);
  }
  free(s0);
  probe_trace_close(t0);
  if (!bad) printf("agree: %d traces, %zu steps\n", n, n0);
  return bad;
}

static int cmd_loss_close(const char *pa, const char *pb, double tol) {
  size_t na = 0, nb = 0;
  probe_trace *ta = open_or_die(pa), *tb = open_or_die(pb);
  probe_step_scalars *a = read_steps(ta, &na), *b = read_steps(tb, &nb);
  int bad = na != nb || na == 0;
  double worst = 0;
  for (size_t i = 0; i < na && i < nb; i++) {
    double x = a[i].loss, y = b[i].loss;
    double m = fmax(fabs(x), fabs(y));
    double d = m > 0 ? fabs(x - y) / m : 0;
    if (!isfinite(x) || !isfinite(y) || d > tol) {
      if (!bad)
        printf("step %lld: loss %.9g vs %.9g\n", (long long)a[i].step, x, y);
      bad = 1;
    }
    if (d > worst) worst = d;
  }
  printf("loss-close: %zu/%zu steps, largest relative difference %.3g "
         "(tolerance %.3g)\n", na, nb, worst, tol);
  free(a);
  free(b);
  probe_trace_close(ta);
  probe_trace_close(tb);
  return bad;
}

/* Calls fn on every record in order until it returns nonzero. */
static void each_record(probe_trace *t, int (*fn)(const probe_record *, void *),
                        void *user) {
  probe_record *buf = malloc(CHUNK * sizeof *buf);
  size_t got = 0;
  for (int64_t at = 0;
       buf && probe_trace_read_records(t, at, CHUNK, buf, &got) == PROBE_OK &&
       got;
       at += (int64_t)got)
    for (size_t i = 0; i < got; i++)
      if (fn(&buf[i], user)) {
        free(buf);
        return;
      }
  free(buf);
}

static int first_nf(const probe_record *r, void *user) {
  if (!nonfinite(r)) return 0;
  *(probe_record *)user = *r;
  return 1;
}

static int cmd_first_nonfinite(const char *path) {
  probe_trace *t = open_or_die(path);
  probe_record r;
  memset(&r, 0, sizeof r);
  r.step = -1;
  each_record(t, first_nf, &r);
  if (r.step < 0) {
    printf("none\n");
  } else {
    size_t nl = 0;
    const probe_layer_info *L = probe_trace_layers(t, &nl);
    printf("%lld %s %s\n", (long long)r.step,
           probe_site_name((probe_site)r.site),
           r.layer >= 0 && (size_t)r.layer < nl ? L[r.layer].name : "?");
  }
  probe_trace_close(t);
  return 0;
}

typedef struct site_q {
  int site;
  int64_t step;
  int seen, bad;
} site_q;

static int site_fn(const probe_record *r, void *user) {
  site_q *q = user;
  if (r->step > q->step) return 1;
  if (r->step == q->step && r->site == q->site) {
    q->seen = 1;
    q->bad |= nonfinite(r);
  }
  return 0;
}

static int cmd_site(const char *path, const char *site, const char *step) {
  probe_trace *t = open_or_die(path);
  site_q q = {.site = -1, .step = atoll(step)};
  for (int s = 0; s < PROBE_SITE_COUNT; s++)
    if (!strcmp(probe_site_name((probe_site)s), site)) q.site = s;
  if (q.site < 0) {
    fprintf(stderr, "dist_check: unknown site %s\n", site);
    return 2;
  }
  each_record(t, site_fn, &q);
  printf("%s\n", !q.seen ? "absent" : q.bad ? "nonfinite" : "finite");
  probe_trace_close(t);
  return 0;
}

int main(int argc, char **argv) {
  if (argc >= 3 && !strcmp(argv[1], "info")) return cmd_info(argv[2]);
  if (argc >= 3 && !strcmp(argv[1], "agree"))
    return cmd_agree(argc - 2, argv + 2);
  if (argc == 5 && !strcmp(argv[1], "loss-close"))
    return cmd_loss_close(argv[2], argv[3], atof(argv[4]));
  if (argc == 3 && !strcmp(argv[1], "first-nonfinite"))
    return cmd_first_nonfinite(argv[2]);
  if (argc == 5 && !strcmp(argv[1], "site"))
    return cmd_site(argv[2], argv[3], argv[4]);
  fprintf(stderr, "usage: dist_check info|agree|loss-close|first-nonfinite|"
                  "site ... (see the source)\n");
  return 2;
}
