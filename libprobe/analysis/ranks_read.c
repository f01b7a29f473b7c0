/*
 * libprobe/analysis/ranks_read.c - the cross-rank post-mortem's per-file
 * pass: one rank's trace -> a small summary (probe__rsum): its rank
 * attributes, its steps' loss scale / skipped / weight digest, and its first
 * non-finite record. Only the steps table and the records of the one step
 * the trace's /meta/state names as the first non-finite
 * (probe_trace_info.first_nonfinite_step) on are read, up to the first
 * non-finite step that is not a normal scaler backoff: the records table is
 * sorted by step, so those rows are found by a binary search on the step
 * column. probe__rank_read_isolated does the same in a forked worker
 * process that reads the files one after the other and sends each summary
 * back through a pipe (one fork for the whole set, not one per file: a
 * new worker is started only after one dies on a malformed file).
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <stdint.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../format.h" /* probe__child_detach */
#include "analysis-impl.h"
#include "ranks-impl.h"

#define STEP_CHUNK 1024  /* steps rows per read */
#define REC_CHUNK 256    /* records rows per read at the event step */
/* A child that has not answered after this long is taken for hung. */
#define ISOLATED_TIMEOUT_MS 30000


static probe_status push_step(probe__rsum *s, const probe__rstep *r) {
  if ((size_t)s->e.n_steps == s->cap_steps) {
    size_t cap = s->cap_steps ? 2 * s->cap_steps : 1024;
    probe__rstep *p = realloc(s->steps, cap * sizeof *p);
    if (!p) return PROBE_ERR_NOMEM;
    s->steps = p;
    s->cap_steps = cap;
  }
  s->steps[s->e.n_steps++] = *r;
  return PROBE_OK;
}

static void take_step(probe__rsum *s, const probe_step_scalars *sc,
                      probe__rstep *r) {
  r->step = sc->step;
  r->scale = sc->loss_scale;
  r->skipped = sc->skipped != 0;
  r->digest = sc->weight_digest;
  r->has = 0;
  if (!PROBE__UNMEASURED(sc, PROBE__SC_SCALE)) r->has |= PROBE__RS_SCALE;
  if (!PROBE__UNMEASURED(sc, PROBE__SC_SCALER)) r->has |= PROBE__RS_SKIPPED;
  if (!PROBE__UNMEASURED(sc, PROBE_SCALAR_WEIGHT_DIGEST))
    r->has |= PROBE__RS_DIGEST;
  if (r->skipped && (r->has & PROBE__RS_SKIPPED)) s->e.skipped_steps++;
  if (!PROBE__UNMEASURED(sc, PROBE__SC_LOSS) && !isfinite(sc->loss)) {
    r->has |= PROBE__RS_LOSS_NF;
    if (s->e.first_nonfinite_loss_step < 0)
      s->e.first_nonfinite_loss_step = sc->step;
  }
}

static probe_status read_steps(probe__rsum *s, probe_trace *t, int64_t n) {
  probe_step_scalars buf[64];
  s->e.n_steps = 0;
  for (int64_t at = 0; at < n;) {
    size_t want = (size_t)(n - at) < 64 ? (size_t)(n - at) : 64, got = 0;
    probe_status st = probe_trace_read_steps(t, at, want, buf, &got);
    if (st < 0) return st;
    if (got == 0) break;
    for (size_t i = 0; i < got; i++) {
      probe__rstep r;
      take_step(s, &buf[i], &r);
      if (push_step(s, &r) < 0) return PROBE_ERR_NOMEM;
    }
    at += (int64_t)got;
  }
  return PROBE_OK;
}

/* First row of the records table whose step is >= step (n when none). */
static probe_status records_lower_bound(probe_trace *t, int64_t n,
                                        int64_t step, int64_t *row) {
  int64_t lo = 0, hi = n;
  while (lo < hi) {
    int64_t mid = lo + (hi - lo) / 2;
    probe_record r;
    size_t got = 0;
    probe_status st = probe_trace_read_records(t, mid, 1, &r, &got);
    if (st < 0) return st;
    if (got == 0) return PROBE_ERR_CORRUPT;
    if (r.step < step)
      lo = mid + 1;
    else
      hi = mid;
  }
  *row = lo;
  return PROBE_OK;
}

/* One step's records as they are read: the first non-finite record by
 * (phase, seq), and what a normal scaler backoff needs to know. */
typedef struct step_acc {
  int64_t step;
  int any_nf, fwd_nf; /* a non-finite record; one outside the backward */
  probe_record first;
  int pre_nf, post_nf, post_records;
} step_acc;

static void acc_reset(step_acc *a, int64_t step) {
  memset(a, 0, sizeof *a);
  a->step = step;
}

/* li/nl: the trace's layers, whose kinds say which records hold inf or
 * NaN as events take them (probe_record_nonfinite: not a softmax's masked
 * logits). */
static void acc_take(step_acc *a, const probe_record *r,
                     const probe_layer_info *li, size_t nl) {
  if (r->site == PROBE_SITE_GRAD_POST_ALLREDUCE) a->post_records++;
  int32_t kind = r->layer >= 0 && (size_t)r->layer < nl
                     ? li[r->layer].kind
                     : (int32_t)PROBE_KIND_OTHER;
  if (!probe_record_nonfinite((probe_kind)kind, (probe_site)r->site, &r->stats))
    return;
  int ph = (int)probe_site_phase((probe_site)r->site);
  if (r->site == PROBE_SITE_GRAD_PRE_ALLREDUCE) a->pre_nf = 1;
  if (r->site == PROBE_SITE_GRAD_POST_ALLREDUCE)
    a->post_nf |= 1 | (r->stats.nan_count ? 2 : 0);
  if (ph != PROBE_PHASE_BACKWARD) a->fwd_nf = 1;
  if (a->any_nf) {
    int pf = (int)probe_site_phase((probe_site)a->first.site);
    if (ph > pf || (ph == pf && r->seq >= a->first.seq)) return;
  }
  a->any_nf = 1;
  a->first = *r;
}

/* The rank's row of a step (its steps are sorted), or NULL. */
static const probe__rstep *step_row(const probe__rsum *s, int64_t step) {
  int64_t lo = 0, hi = s->e.n_steps;
  while (lo < hi) {
    int64_t mid = lo + (hi - lo) / 2;
    if (s->steps[mid].step < step)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo < s->e.n_steps && s->steps[lo].step == step ? &s->steps[lo]
                                                         : NULL;
}

/* The step's first non-finite record as the rank's event. */
static void take_event(probe_rank_entry *e, const step_acc *a) {
  e->nf_step = a->step;
  e->nf_phase = (int32_t)probe_site_phase((probe_site)a->first.site);
  e->nf_seq = a->first.seq;
  e->nf_layer = a->first.layer;
  e->nf_site = a->first.site;
  e->pre_nonfinite = a->pre_nf;
  e->post_records = a->post_records;
  e->nf_forward = a->fwd_nf;
  e->nf_post = a->post_nf;
}

/* A finished step: one whose only non-finite values are gradients, with a
 * finite loss (a non-finite loss - the job's mean, so any rank's - is an
 * event: a rank that got a NaN through the all-reduce was reached by it)
 * and finite weights after it, is not the event, as in the one-process
 * post-mortem: on a step the scaler skipped a normal backoff (counted);
 * else a gradient that went nowhere (the input's own gradient; a gradient
 * the update applied makes the weights non-finite, an event), kept in *fb
 * (*have_fb set) as the event when no other comes - the one-process
 * post-mortem takes a backward-only overflow when nothing else happened (a
 * trace without weight records, an FP16 all-reduce's sum). Anything else
 * non-finite is the event. Returns 1 when the event was found. */
static int acc_finish(probe__rsum *s, const step_acc *a, step_acc *fb,
                      int *have_fb) {
  probe_rank_entry *e = &s->e;
  if (!a->any_nf) return 0;
  const probe__rstep *row = step_row(s, a->step);
  int loss_nf = row && (row->has & PROBE__RS_LOSS_NF);
  int skipped = row && (row->has & PROBE__RS_SKIPPED) && row->skipped;
  if (s->raw_from < 0 && !a->fwd_nf && !loss_nf) { /* gradients only */
    if (!skipped) {
      if (!*have_fb) *fb = *a, *have_fb = 1;
      return 0; /* not applied: not the event (yet) */
    }
    if (e->backoff_nonfinite_steps++ == 0) {
      e->first_backoff_step = a->step;
      e->first_backoff_site = a->first.site;
      e->first_backoff_phase = (int32_t)probe_site_phase((probe_site)a->first.site);
      e->first_backoff_seq = a->first.seq;
      e->first_backoff_layer = a->first.layer;
      e->first_backoff_post = a->post_nf;
    }
    return 0;
  }
  take_event(e, a);
  return 1;
}

/* From the first non-finite step on (the trace's /meta/state knows it),
 * step by step until the first non-finite record that is not a normal
 * scaler backoff. Flight-recorder traces hold records only around their
 * events, so this reads little; a full trace with early backoffs reads
 * on until the event (or its end). */
static probe_status scan_events(probe__rsum *s, probe_trace *t, int64_t n,
                                int64_t step) {
  int64_t row = 0;
  probe_status st = records_lower_bound(t, n, step, &row);
  probe_record *buf = malloc(REC_CHUNK * sizeof *buf);
  if (!buf) return PROBE_ERR_NOMEM;
  size_t nl = 0;
  const probe_layer_info *li = probe_trace_layers(t, &nl);
  step_acc a;
  acc_reset(&a, step);
  step_acc fb;
  int done = 0, have_fb = 0;
  while (st >= 0 && !done && row < n) {
    size_t got = 0;
    st = probe_trace_read_records(t, row, REC_CHUNK, buf, &got);
    if (st < 0 || got == 0) break;
    for (size_t i = 0; i < got && !done; i++) {
      if (buf[i].step != a.step) {
        done = acc_finish(s, &a, &fb, &have_fb);
        acc_reset(&a, buf[i].step);
      }
      if (!done) acc_take(&a, &buf[i], li, nl);
    }
    row += (int64_t)got;
  }
  if (st >= 0 && !done) done = acc_finish(s, &a, &fb, &have_fb);
  if (st >= 0 && !done && have_fb) take_event(&s->e, &fb);
  free(buf);
  return st;
}

static void entry_init(probe_rank_entry *e) {
  memset(e, 0, sizeof *e);
  e->rank = -1;
  e->last_step = -1;
  e->first_nonfinite_loss_step = -1;
  e->nf_step = -1;
  e->nf_layer = -1;
  e->nf_site = -1;
  e->first_backoff_step = -1;
  e->first_backoff_site = e->first_backoff_layer = -1;
  e->error_status = PROBE_OK;
  e->aborted_step = -1;
}

static void set_unreadable(probe__rsum *s, probe_status st, const char *msg) {
  s->e.status = PROBE_RANK_UNREADABLE;
  s->e.error_status = st;
  snprintf(s->error, sizeof s->error, "%s",
           msg && *msg ? msg : probe_status_str(st));
}

static probe_status read_open(probe__rsum *s, probe_trace *t) {
  const probe_trace_info *in = probe_trace_get_info(t);
  s->e.rank = in->rank;
  s->e.world_size = in->world_size;
  s->e.complete = in->complete;
  s->e.joined = in->joined;
  probe_text_escape(s->e.aborted, sizeof s->e.aborted,
                    in->aborted ? in->aborted : "");
  s->e.aborted_step = s->e.aborted[0] ? in->aborted_step : -1;
  s->e.last_step = in->last_step;
  snprintf(s->run_id, sizeof s->run_id, "%s", in->run_id ? in->run_id : "");
  probe_status st = read_steps(s, t, in->n_steps);
  int64_t from = in->first_nonfinite_step;
  if (from >= 0 && s->raw_from > from) from = s->raw_from;
  if (st >= 0 && from >= 0) st = scan_events(s, t, in->n_records, from);
  size_t nl = 0;
  const probe_layer_info *li = probe_trace_layers(t, &nl);
  if (st >= 0 && s->e.nf_layer >= 0)
    probe_text_escape(s->e.nf_layer_name, sizeof s->e.nf_layer_name,
                      (size_t)s->e.nf_layer < nl ? li[s->e.nf_layer].name
                                                 : "?");
  if (st >= 0 && s->e.first_backoff_layer >= 0)
    probe_text_escape(s->e.first_backoff_layer_name,
                      sizeof s->e.first_backoff_layer_name,
                      (size_t)s->e.first_backoff_layer < nl
                          ? li[s->e.first_backoff_layer].name
                          : "?");
  return st;
}

/* The rank a file name gives by the naming rule: the digits after the
 * last "rank" of the base name ("out/t.rank12.h5" -> 12), else -1. */
static int32_t rank_from_name(const char *path) {
  const char *base = strrchr(path, '/');
  base = base ? base + 1 : path;
  const char *hit = NULL;
  for (const char *p = strstr(base, "rank"); p; p = strstr(p + 1, "rank"))
    hit = p;
  if (!hit || hit[4] < '0' || hit[4] > '9') return -1;
  long v = 0;
  for (const char *d = hit + 4; *d >= '0' && *d <= '9'; d++) {
    v = v * 10 + (*d - '0');
    if (v > INT32_MAX) return -1;
  }
  return (int32_t)v;
}

static void mark_unreadable(probe__rsum *s, const char *path, probe_status st,
                            const char *msg) {
  set_unreadable(s, st, probe__msg_after_path(msg, path));
  if (s->e.rank < 0) {
    s->e.rank = rank_from_name(path);
    s->e.rank_from_name = s->e.rank >= 0;
  }
}

probe_status probe__rank_read(probe__rsum *s, const char *path) {
  entry_init(&s->e);
  s->run_id[0] = s->error[0] = '\0';
  probe_trace *t = NULL;
  probe_status st = probe_trace_open(&t, path);
  if (st < 0) {
    mark_unreadable(s, path, st, probe_trace_last_error(NULL));
    return PROBE_OK;
  }
  if (probe_trace_get_info(t)->unwritten) {
    /* no rank attribute to place it by (it would refuse the whole set as
     * "no rank attribute"): an unreadable rank file, named by its name;
     * read alone, it is a trace not closed with 0 steps */
    probe_trace_close(t);
    mark_unreadable(s, path, PROBE_ERR_CORRUPT,
                    "an HDF5 superblock and nothing else: the writer was "
                    "killed before it wrote anything (no step recorded)");
    return PROBE_OK;
  }
  s->e.status = PROBE_RANK_READ;
  st = read_open(s, t);
  if (st == PROBE_ERR_NOMEM) {
    probe_trace_close(t);
    return st;
  }
  if (st < 0) {
    /* the reader's words ("PATH: corrupt trace: reading /records rows
     * 0..: inflate() failed"; mark_unreadable drops the PATH) */
    const char *m = probe_trace_last_error(t);
    char msg[PROBE_RANKS_TEXT_MAX];
    snprintf(msg, sizeof msg, "%s", m && *m ? m : probe_status_str(st));
    mark_unreadable(s, path, st, msg);
  }
  probe_trace_close(t);
  return PROBE_OK;
}

/* ---- isolated: the same pass in a child --------------------------------- */

/* Writes or reads all of n bytes; -1 on error or end of file. The read
 * side waits at most until the deadline (CLOCK_MONOTONIC ms). */
static int write_all(int fd, const void *p, size_t n) {
  const char *c = p;
  while (n) {
    ssize_t k = write(fd, c, n);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return -1;
    c += k;
    n -= (size_t)k;
  }
  return 0;
}

static int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int read_all(int fd, void *p, size_t n, int64_t deadline) {
  char *c = p;
  while (n) {
    int64_t left = deadline - now_ms();
    if (left <= 0) return -1;
    struct pollfd pfd = {fd, POLLIN, 0};
    int r = poll(&pfd, 1, (int)(left > 1000 ? 1000 : left));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) continue;
    ssize_t k = read(fd, c, n);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return -1;
    c += k;
    n -= (size_t)k;
  }
  return 0;
}

/* The worker: summarises paths[from..n) in order, one answer each. */
static void worker(int fd, probe__rsum *s, const char *const *paths, size_t n,
                   size_t from) {
  for (size_t i = from; i < n; i++) {
    probe_status st = probe__rank_read(s, paths[i]);
    int32_t code = st;
    if (write_all(fd, &code, sizeof code) < 0 ||
        write_all(fd, s, sizeof *s) < 0 ||
        write_all(fd, s->steps,
                  (size_t)(st < 0 ? 0 : s->e.n_steps) * sizeof *s->steps) < 0)
      _exit(2);
  }
  _exit(0);
}

/* Reads the child's answer into s; -1 when it did not come. */
static probe_status receive(int fd, probe__rsum *s, int *ok) {
  int64_t deadline = now_ms() + ISOLATED_TIMEOUT_MS;
  int32_t code = 0;
  probe__rstep *keep = s->steps;
  size_t keep_cap = s->cap_steps;
  *ok = read_all(fd, &code, sizeof code, deadline) == 0 &&
        read_all(fd, s, sizeof *s, deadline) == 0;
  s->steps = keep;
  s->cap_steps = keep_cap;
  if (!*ok) return PROBE_OK;
  if (code < 0) return (probe_status)code;
  int64_t n = s->e.n_steps;
  s->e.n_steps = 0;
  if (n > 0 && (size_t)n > s->cap_steps) {
    probe__rstep *p = realloc(s->steps, (size_t)n * sizeof *p);
    if (!p) return PROBE_ERR_NOMEM;
    s->steps = p;
    s->cap_steps = (size_t)n;
  }
  if (n > 0 && read_all(fd, s->steps, (size_t)n * sizeof *s->steps,
                        deadline) < 0) {
    *ok = 0;
    return PROBE_OK;
  }
  s->e.n_steps = n < 0 ? 0 : n;
  return PROBE_OK;
}

void probe__rworker_init(probe__rworker *w) {
  w->pid = -1;
  w->fd = -1;
}

void probe__rworker_stop(probe__rworker *w, int *status) {
  if (w->pid < 0) return;
  if (w->fd >= 0) close(w->fd);
  int ws = 0;
  if (!status) kill(w->pid, SIGKILL);
  while (waitpid(w->pid, &ws, 0) < 0 && errno == EINTR) {
  }
  if (status) *status = ws;
  probe__rworker_init(w);
}

static int start_worker(probe__rworker *w, probe__rsum *s,
                        const char *const *paths, size_t n, size_t from) {
  int fds[2];
  if (probe__pipe(fds) != 0) return -1;
  pid_t pid = fork();
  if (pid < 0) {
    close(fds[0]);
    close(fds[1]);
    return -1;
  }
  if (pid == 0) {
    close(fds[0]);
    probe__child_detach();
    worker(fds[1], s, paths, n, from);
  }
  close(fds[1]);
  w->pid = pid;
  w->fd = fds[0];
  return 0;
}

probe_status probe__rank_read_isolated(probe__rworker *w, probe__rsum *s,
                                       const char *const *paths, size_t n,
                                       size_t i) {
  if (w->pid < 0 && start_worker(w, s, paths, n, i) < 0)
    return probe__rank_read(s, paths[i]); /* no fork: in this process */
  int ok = 0;
  probe_status st = receive(w->fd, s, &ok);
  if (ok) return st;
  /* the worker died (or hung) on file i: kill it, the next file starts a
   * new one */
  kill(w->pid, SIGKILL);
  int ws = 0;
  probe__rworker_stop(w, &ws);
  char msg[PROBE_RANKS_TEXT_MAX];
  if (WIFSIGNALED(ws) && WTERMSIG(ws) != SIGKILL)
    snprintf(msg, sizeof msg,
             "corrupt trace: the reader crashed on it (signal %d)",
             WTERMSIG(ws));
  else
    snprintf(msg, sizeof msg, "corrupt trace: the reader did not answer");
  entry_init(&s->e);
  s->run_id[0] = '\0';
  mark_unreadable(s, paths[i], PROBE_ERR_CORRUPT, msg);
  return PROBE_OK;
}
