/*
 * session.c - the probe session, caller's side: turns tensors into
 * statistics records and hands them, with step scalars and scaler events,
 * to the session's writer thread (writer.c), which writes the crash-safe
 * HDF5 trace (docs/trace-format.md).
 *
 * Everything here runs on the caller's thread: it computes the statistics
 * (host tensors here, device tensors with the CUDA statistics kernels),
 * keeps the step's records, decides non-finite events and snapshots, and
 * hands finished rows over at probe_step_end (one mutex per step; the
 * buffers themselves go to the writer's queue, no rows are copied:
 * session.h, pqueue). Flushes the caller asks for
 * (probe_session_flush, flush_steps, a non-finite event, close) are
 * synchronous: the call returns when the rows are on disk and counted.
 * The rows waiting for the writer are bounded (WAIT_BYTES): a caller
 * faster than the disk waits. The writer's I/O errors are sticky and come
 * back to the caller at its next call, and at close.
 *
 * Flight recorder (PROBE_MODE_SCALARS): the per-layer records of the last
 * ring_steps steps stay in memory; a non-finite event writes them, the
 * step of the event and the ring_steps steps after it.
 *
 * Errors: every call returns a probe_status, and the session's message
 * (probe_session_last_error) says what failed in one line; a CUDA failure
 * carries the CUDA runtime's own text.
 */
#define _GNU_SOURCE /* F_OFD_SETLK */
#include <errno.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include <hdf5.h>

#include "ampprobe/probe.h"
#include "deflate.h"
#include "format.h"
#include "gpu.h"
#include "session.h"


/* The message of the last failed probe_session_open in this thread. */
static _Thread_local char open_msg[512];

static probe_status set_msg(probe_session *s, probe_status st, const char *fmt,
                            ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(s->msg, sizeof s->msg, fmt, ap);
  va_end(ap);
  return st;
}

/* ---- options and selection ------------------------------------------------ */

void probe_options_init(probe_options *opt) {
  if (!opt) return;
  memset(opt, 0, sizeof *opt);
  opt->mode = PROBE_MODE_SCALARS;
  opt->layer_select = NULL;
  opt->step_start = 0;
  opt->step_end = -1;
  opt->step_every = 1;
  opt->ring_steps = 8;
  opt->flush_seconds = 1.0;
  opt->flush_steps = 0;
  opt->snapshot_on_nonfinite = 1;
  opt->snapshot_max_elems = (size_t)1 << 20;
  opt->cupti = 0;
  opt->max_events = 16;
  opt->batch_rows = 4096;
  opt->rank = -1;
  opt->world_size = 0;
  opt->run_id = NULL;
}

/* 1 when name matches one of the comma-separated globs in sel. */
static int select_match(const char *sel, const char *name) {
  if (sel == NULL || *sel == '\0') return 1;
  const char *p = sel;
  char pat[256];
  while (*p) {
    while (*p == ' ' || *p == ',') p++;
    size_t len = strcspn(p, ",");
    while (len > 0 && p[len - 1] == ' ') len--;
    if (len > 0 && len < sizeof pat) {
      memcpy(pat, p, len);
      pat[len] = '\0';
      if (fnmatch(pat, name, 0) == 0) return 1;
    }
    p += strcspn(p, ",");
  }
  return 0;
}

static int step_in_window(const probe_options *o, int64_t step) {
  if (step < o->step_start) return 0;
  if (o->step_end >= 0 && step > o->step_end) return 0;
  return (step - o->step_start) % o->step_every == 0;
}

/* Caller: queues rows of table t for the writer thread. They stay in the
 * caller's out[] until hand_over moves them to in[] together with the
 * counters that describe them (last_step, events), under one lock: the
 * writer, whose timer may take in[] at any moment, then never commits the
 * rows of a step without that step's counters (a /records row of step
 * N+1 under last_step N, which the reader calls corrupt). */
static probe_status table_append(probe_session *s, probe__table t,
                                 const void *rows, size_t n) {
  if (pvec_push(&s->out[t], rows, n) < 0)
    return set_msg(s, PROBE_ERR_NOMEM, "out of memory buffering rows");
  s->appended[t] += (int64_t)n;
  return PROBE_OK;
}

/* Caller, at the end of a step: gives the step's records (s->cur) to a
 * holder, the queued rows of /records or a flight-recorder slot, whose
 * buffer (*data, *cap records) becomes s->cur in exchange, first given
 * room for cap_cur records when it has less (its contents are not needed
 * any more). Swapping instead of copying: the copy of a step's records
 * (50 in the default scenario, 32 KiB) into a buffer cold in the training
 * thread's cache was ~2.8% of that thread's time in a full trace. Returns
 * -1 without memory, nothing changed. */
static int cur_exchange(probe_session *s, void **data, size_t *cap) {
  if (*cap < s->cap_cur) {
    void *p = malloc(s->cap_cur * sizeof *s->cur);
    if (p == NULL) return -1;
    free(*data);
    *data = p;
    *cap = s->cap_cur;
  }
  void *mine = *data;
  *data = s->cur;
  *cap = s->cap_cur;
  s->cur = mine; /* holds >= cap_cur records */
  return 0;
}

/* Queues the step's records as rows of /records: out[] is nearly always
 * empty here (hand_over moves it every step), and then by cur_exchange. */
static probe_status records_append_cur(probe_session *s) {
  pvec *o = &s->out[PROBE__T_RECORDS];
  if (o->n != 0 || o->elem != sizeof *s->cur)
    return table_append(s, PROBE__T_RECORDS, s->cur, s->n_cur);
  void *d = o->data;
  const size_t n = s->n_cur;
  if (cur_exchange(s, &d, &o->cap) < 0)
    return set_msg(s, PROBE_ERR_NOMEM, "out of memory buffering rows");
  o->data = d;
  o->n = n;
  s->appended[PROBE__T_RECORDS] += (int64_t)n;
  return PROBE_OK;
}

/* Under mu: moves the queued rows to the writer's in[], with the counters
 * that go with them. Returns -1 without memory. */
static int out_move_locked(probe_session *s) {
  int rc = 0;
  for (int t = 0; t < PROBE__T_COUNT; t++) {
    size_t bytes = s->out[t].n * s->out[t].elem;
    if (pq_put(&s->in[t], &s->out[t], s->spare[t], &s->n_spare[t]) < 0)
      rc = -1;
    else s->in_bytes += bytes;
  }
  s->sh_last_step = s->last_step;
  s->sh_first_nonfinite = s->first_nonfinite;
  s->sh_n_events = s->n_events;
  s->sh_joined = s->joined;
  return rc;
}

/* A session belongs to the process that opened it: a child of fork() has
 * its copy but no writer thread, and a flush there waited for ever, a
 * close joined a thread that is not there (format.c's fork generation: no
 * system call per record). */
static int other_process(const probe_session *s) {
  return probe__forked_since(s->fork_gen);
}

/* The sticky error of a session used in another process; no lock taken
 * (the child's copy of mu may be held by a thread it lacks). */
static probe_status other_process_error(probe_session *s) {
  s->err = PROBE_ERR_STATE;
  snprintf(s->msg, sizeof s->msg,
           "session opened by process %d, used in process %d (a child of "
           "fork(): open a session of its own)",
           (int)s->pid, (int)getpid());
  return s->err;
}

/* The sticky error of the writer thread, as the caller sees it. */
static probe_status writer_error(probe_session *s) {
  if (other_process(s)) return other_process_error(s);
  if (s->err == PROBE_OK &&
      atomic_load_explicit(&s->err_flag, memory_order_acquire)) {
    pthread_mutex_lock(&s->mu);
    s->err = s->sh_err;
    memcpy(s->msg, s->sh_msg, sizeof s->msg);
    pthread_mutex_unlock(&s->mu);
  }
  return s->err;
}

/* What hand_over asks of the writer thread besides taking the rows. */
enum { HAND_ROWS = 0, HAND_FLUSH_ASYNC = 1, HAND_FLUSH_SYNC = 2 };

/* Caller: publishes the counters that go with the rows handed over (at
 * the end of a step) and wakes the writer thread when it has work; with
 * HAND_FLUSH_ASYNC also asks for a flush now, and with HAND_FLUSH_SYNC
 * waits until it is done. Returns the writer's sticky error if there is
 * one. */
static probe_status hand_over(probe_session *s, int how) {
  const int sync = how == HAND_FLUSH_SYNC;
  pthread_mutex_lock(&s->mu);
  if (out_move_locked(s) < 0) {
    pthread_mutex_unlock(&s->mu);
    return set_msg(s, PROBE_ERR_NOMEM, "out of memory buffering rows");
  }
  int big = 0;
  for (int t = 0; t < PROBE__T_COUNT; t++)
    if ((int64_t)s->in[t].rows >= s->batch[t]) big = 1;
  uint64_t ticket = 0;
  if (how != HAND_ROWS) ticket = ++s->flush_req;
  const int wake = how != HAND_ROWS || big || s->w_idle;
  /* Wait for a requested flush, or for room when the writer is behind. */
  int waited = 0;
  while (!atomic_load(&s->err_flag) &&
         ((sync && s->flush_done < ticket) || s->in_bytes > WAIT_BYTES)) {
    pthread_cond_signal(&s->wake);
    pthread_cond_wait(&s->done, &s->mu);
    waited = 1;
  }
  pthread_mutex_unlock(&s->mu);
  /* Signalled after the unlock: a writer woken while the caller still held
   * mu blocked on it at once and had to be woken a second time (two futex
   * calls a hand-over instead of one). The writer reads its work under mu
   * at the top of its loop, so a signal that finds it busy is not lost. */
  if (wake && !waited) pthread_cond_signal(&s->wake);
  if (how != HAND_ROWS) s->steps_since_flush = 0;
  return writer_error(s);
}

/* ---- session -------------------------------------------------------------- */

static void session_free(probe_session *s) {
  if (s == NULL) return;
  for (int t = 0; t < PROBE__T_COUNT; t++) {
    free(s->pend[t].data);
    pq_free(&s->in[t]);
    pq_free(&s->taken[t]);
    for (int i = 0; i < s->n_spare[t]; i++) free(s->spare[t][i].data);
    free(s->stage[t].data);
    free(s->out[t].data);
    free(s->tail[t]);
  }
  free(s->shuf);
  free(s->zbuf);
  if (s->ring)
    for (int i = 0; i < s->opt.ring_steps; i++) free(s->ring[i].recs);
  free(s->ring);
  free(s->cur);
  free(s->ref);
  free(s->last);
  free(s->repeat);
  free(s->repeat_next);
  free(s->layers);
  free(s->selected);
  free(s->name_slots);
  free(s->layer_select);
  free(s->path);
  for (int i = 0; i < 4; i++) free(s->own_strings[i]);
  if (s->lock_fd >= 0) { /* releases the writer lock */
    probe__lock_fd_unregister(s->lock_fd);
    close(s->lock_fd);
  }
  pthread_mutex_destroy(&s->mu);
  pthread_cond_destroy(&s->wake);
  pthread_cond_destroy(&s->done);
  free(s);
}

/* A CUDA failure: the session's message carries the CUDA runtime's own
 * text (probe_cuda_last_error of the statistics kernels), so that the
 * caller needs no second error channel. */
static probe_status cuda_fail(probe_session *s, const char *what) {
  return set_msg(s, PROBE_ERR_CUDA, "%s: %s", what, probe_cuda_last_error());
}

/* Sets the message of a failed probe_session_open (this thread's). */
static probe_status open_fail(probe_status st, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(open_msg, sizeof open_msg, fmt, ap);
  va_end(ap);
  return st;
}

/* 1 when another open file description holds a lock on fd's file, and
 * the pid (-1 when unknown: OFD locks have none) in *pid. */
static int lock_held(int fd, pid_t *pid) {
  struct flock fl;
  memset(&fl, 0, sizeof fl);
  fl.l_type = F_WRLCK;
  fl.l_whence = SEEK_SET;
  *pid = -1;
  if (fcntl(fd, F_OFD_GETLK, &fl) != 0) return 0;
  if (fl.l_type == F_UNLCK) return 0;
  if (fl.l_pid > 0) *pid = fl.l_pid;
  return 1;
}

/* Claims the trace file at path for this session, before the writer thread
 * creates the HDF5 file in it: creates it exclusively (an existing file is
 * PROBE_ERR_EXISTS unless opt.overwrite; it must then be a regular file),
 * and takes an exclusive open-file-description lock (fcntl F_OFD_SETLK) on
 * it, held until the session closes, so that a second writer of the same
 * trace - in this process or another - fails here at once with
 * PROBE_ERR_LOCKED instead of interleaving its writes. Readers take no
 * lock and are not stopped; HDF5's own flock() locking is independent of
 * this one. The lock goes with the process (SIGKILL included). A file
 * system without OFD locks (EINVAL) is written unlocked.
 *
 * Doing this here, not in the writer thread, also makes what usually goes
 * wrong - a directory that does not exist, no permission, a read-only file
 * system - fail probe_session_open itself with its message. The file is
 * not truncated here (truncating a large old trace takes time; H5Fcreate
 * does it on the writer thread). Returns the descriptor that holds the
 * lock in *lock_fd. */
static probe_status trace_claim(const char *path, int overwrite,
                                int *lock_fd) {
  *lock_fd = -1;
  int created = 1, fd = -1;
  /* EEXIST then ENOENT: removed in between (try once more), or a dangling
   * symbolic link, which O_EXCL refuses and a plain open cannot follow:
   * that stays ENOENT, reported as such */
  for (int tries = 0; tries < 2; tries++) {
    created = 1;
    fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOCTTY, 0666);
    if (fd >= 0 || errno != EEXIST) break;
    created = 0;
    fd = open(path, O_RDWR | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    if (fd >= 0 || errno != ENOENT) break;
  }
  if (fd < 0 && errno == ENOENT && !created) {
    return open_fail(PROBE_ERR_IO,
                     "cannot create trace '%s': a symbolic link to nothing",
                     path);
  }
  if (fd < 0) {
    int e = errno;
    return open_fail(e == ENOSPC || e == EDQUOT || e == EFBIG
                         ? PROBE_ERR_NOSPACE
                         : PROBE_ERR_IO,
                     "cannot create trace '%s': %s", path, strerror(e));
  }
  struct stat sb;
  if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
    close(fd);
    return open_fail(PROBE_ERR_IO,
                     "cannot create trace '%s': not a regular file", path);
  }
  pid_t holder;
  if (!created && lock_held(fd, &holder)) {
    close(fd);
    if (holder > 0)
      return open_fail(PROBE_ERR_LOCKED,
                       "trace '%s' is being written by another writer "
                       "(process %d)",
                       path, (int)holder);
    return open_fail(PROBE_ERR_LOCKED,
                     "trace '%s' is being written by another writer", path);
  }
  if (!created && !overwrite) {
    close(fd);
    return open_fail(PROBE_ERR_EXISTS,
                     "trace '%s' exists; not overwritten (overwrite option "
                     "not set)",
                     path);
  }
  struct flock fl;
  memset(&fl, 0, sizeof fl);
  fl.l_type = F_WRLCK;
  fl.l_whence = SEEK_SET; /* l_start = l_len = 0: the whole file */
  if (fcntl(fd, F_OFD_SETLK, &fl) != 0 && errno != EINVAL) {
    int e = errno;
    close(fd); /* created or not, the file is the lock holder's now */
    if (e == EAGAIN || e == EACCES)
      return open_fail(PROBE_ERR_LOCKED,
                       "trace '%s' is being written by another writer", path);
    return open_fail(PROBE_ERR_IO, "cannot lock trace '%s': %s", path,
                     strerror(e));
  }
  *lock_fd = fd;
  probe__lock_fd_register(fd); /* the library's children let go of it */
  return PROBE_OK;
}

static int session_sync_init(probe_session *s) {
  pthread_condattr_t ca;
  if (pthread_condattr_init(&ca) != 0) return -1;
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC); /* deadlines: now_s() */
  int rc = pthread_mutex_init(&s->mu, NULL) != 0 ||
           pthread_cond_init(&s->wake, &ca) != 0 ||
           pthread_cond_init(&s->done, NULL) != 0;
  pthread_condattr_destroy(&ca);
  return rc ? -1 : 0;
}

/* 1 when run_id is NULL, "" or at most PROBE_RUN_ID_MAX characters of
 * [A-Za-z0-9._-] (shared with the reader's check: probe__run_id_ok). */
int probe__run_id_ok(const char *run_id) {
  if (run_id == NULL) return 1;
  size_t n = 0;
  for (const char *p = run_id; *p; p++, n++) {
    char c = *p;
    int ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
             (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-';
    if (!ok || n >= PROBE_RUN_ID_MAX) return 0;
  }
  return 1;
}

/* The rank options (probe.h): -1/0 outside a multi-rank job, else
 * 0 <= rank < world_size; a run id of the allowed characters. */
static probe_status check_rank_options(const probe_options *o) {
  int single = o->rank == -1 && o->world_size == 0;
  if (!single && (o->rank < 0 || o->world_size < 1 || o->rank >= o->world_size))
    return open_fail(PROBE_ERR_INVALID_ARG,
                     "probe_session_open: rank %d of world size %d (want "
                     "-1 of 0, or 0 <= rank < world_size)",
                     o->rank, o->world_size);
  if (!probe__run_id_ok(o->run_id))
    return open_fail(PROBE_ERR_INVALID_ARG,
                     "probe_session_open: run_id '%.80s' is not at most %d "
                     "characters of [A-Za-z0-9._-]",
                     o->run_id, PROBE_RUN_ID_MAX);
  return PROBE_OK;
}

probe_status probe_session_open(probe_session **out, const char *path,
                                const probe_options *opt) {
  if (out == NULL)
    return open_fail(PROBE_ERR_INVALID_ARG, "probe_session_open: out is NULL");
  *out = NULL;
  if (path == NULL || *path == '\0')
    return open_fail(PROBE_ERR_INVALID_ARG, "probe_session_open: empty path");
  probe_options o;
  if (opt) o = *opt;
  else probe_options_init(&o);
  if (o.ring_steps < 0 || o.ring_steps > PROBE_RING_STEPS_MAX)
    return open_fail(PROBE_ERR_CONFIG,
                     "probe_session_open: ring_steps %d outside 0..%d",
                     o.ring_steps, PROBE_RING_STEPS_MAX);
  if ((o.mode != PROBE_MODE_SCALARS && o.mode != PROBE_MODE_FULL) ||
      o.step_every < 1 || o.step_start < 0 ||
      !(o.flush_seconds >= 0) || o.flush_steps < 0 || o.max_events < 0 ||
      o.batch_rows < 1)
    return open_fail(PROBE_ERR_CONFIG,
                     "probe_session_open: option out of range (mode, "
                     "step_every, step_start, ring_steps, flush_seconds, "
                     "flush_steps, max_events or batch_rows)");
  probe_status rst = check_rank_options(&o);
  if (rst != PROBE_OK) return rst;

  probe_session *s = calloc(1, sizeof *s);
  if (s == NULL) return open_fail(PROBE_ERR_NOMEM, "out of memory");
  s->lock_fd = -1;
  s->fork_gen = probe__fork_generation();
  s->pid = getpid();
  if (session_sync_init(s) < 0) {
    free(s);
    return open_fail(PROBE_ERR_NOMEM, "out of memory");
  }
  s->opt = o;
  s->file = s->state = H5I_INVALID_HID;
  s->writing = -1;
  for (int t = 0; t < PROBE__T_COUNT; t++) {
    s->dset[t] = s->mtype[t] = H5I_INVALID_HID;
    s->pend[t].elem = s->stage[t].elem = s->out[t].elem =
        probe__tables[t].mem_size;
    s->batch[t] = o.batch_rows; /* the writer may lower it (writer_main) */
  }
  s->last_step = s->w_last_step = -1;
  s->scaler_last_step = -1;
  s->aborted_step = -1;
  s->first_nonfinite = s->w_first_nonfinite = -1;
  s->nf_rec_step = -1;
  s->nf_last_step = -1;
  s->nf_last_any.layer = s->nf_last_fwd.layer = -1; /* the rest is 0 */
  if (o.layer_select && (s->layer_select = strdup(o.layer_select)) == NULL)
    goto nomem;
  s->opt.layer_select = s->layer_select;
  if ((s->path = strdup(path)) == NULL) goto nomem;
  /* command_line / config_json / precision_policy / run_id are written by
   * the writer thread, after this function has returned: it reads copies. */
  const char **strs[4] = {&s->opt.command_line, &s->opt.config_json,
                          &s->opt.precision_policy, &s->opt.run_id};
  for (int i = 0; i < 4; i++)
    if (*strs[i] && (*strs[i] = s->own_strings[i] = strdup(*strs[i])) == NULL)
      goto nomem;
  if (o.ring_steps > 0 &&
      (s->ring = calloc((size_t)o.ring_steps, sizeof *s->ring)) == NULL)
    goto nomem;

  /* Creating the HDF5 file and its tables takes milliseconds (2.5 ms on the
   * project machine, as long as 12 steps of the default scenario); the
   * writer thread does it while the caller goes on. The path is claimed
   * here first (trace_claim: exclusive creation, the writer lock, and the
   * usual errors reported by this call). A later failure of HDF5 itself (a
   * disk that fills while the tables are created, say) is the session's
   * sticky error, returned by the next call. */
  probe_status cst = trace_claim(path, o.overwrite, &s->lock_fd);
  if (cst != PROBE_OK) {
    session_free(s);
    return cst;
  }

  if (pthread_create(&s->thread, NULL, probe__writer_main, s) != 0) {
    session_free(s);
    return open_fail(PROBE_ERR_NOMEM, "cannot start the writer thread");
  }
  s->thread_started = 1;
  s->t0 = now_s();
  if (o.cupti) {
    /* Kernels are collected only where a GPU exists; elsewhere the kernels
     * table stays empty. */
    if (probe_cuda_available() && probe__cupti_start(&s->cupti) != PROBE_OK)
      s->cupti = NULL;
  }
  open_msg[0] = '\0';
  *out = s;
  return PROBE_OK;

nomem:
  session_free(s);
  return open_fail(PROBE_ERR_NOMEM, "out of memory");
}

const char *probe_session_last_error(const probe_session *s) {
  if (s == NULL) return open_msg[0] ? open_msg : "no error";
  return s->msg[0] ? s->msg : "no error";
}

/* ---- layer names: a hash set, so registering n layers is O(n) ---------- */

static size_t name_hash(const char *name) {
  uint64_t h = 1469598103934665603ull; /* FNV-1a */
  for (const unsigned char *p = (const unsigned char *)name; *p; p++)
    h = (h ^ *p) * 1099511628211ull;
  return (size_t)h;
}

/* The slot holding name, or the empty slot where it would go. */
static size_t name_slot(const probe_session *s, const char *name) {
  size_t mask = s->n_name_slots - 1, i = name_hash(name) & mask;
  while (s->name_slots[i] != 0 &&
         strcmp(s->layers[s->name_slots[i] - 1].name, name) != 0)
    i = (i + 1) & mask;
  return i;
}

/* Room for one more name: at least twice as many slots as names. */
static int name_slots_grow(probe_session *s) {
  if (s->n_name_slots >= 2 * ((size_t)s->n_layers + 1)) return 0;
  size_t n = s->n_name_slots ? 2 * s->n_name_slots : 64;
  int32_t *old = s->name_slots;
  size_t n_old = s->n_name_slots;
  if ((s->name_slots = calloc(n, sizeof *s->name_slots)) == NULL) {
    s->name_slots = old;
    return -1;
  }
  s->n_name_slots = n;
  for (size_t i = 0; i < n_old; i++)
    if (old[i]) s->name_slots[name_slot(s, s->layers[old[i] - 1].name)] = old[i];
  free(old);
  return 0;
}

/* Why a name cannot be a layer's, or NULL when it can. */
static const char *layer_name_problem(const probe_session *s, const char *name,
                                      size_t len) {
  if (len == 0 || len >= PROBE_NAME_MAX) return "is empty or too long";
  if (!probe__utf8_valid(name)) return "is not valid UTF-8";
  if (s->n_name_slots && s->name_slots[name_slot(s, name)] != 0)
    return "is registered twice";
  return NULL;
}

probe_status probe_layer_register(probe_session *s, const char *name,
                                  probe_kind kind, probe_dtype prec,
                                  int32_t *layer_id) {
  if (s == NULL) return PROBE_ERR_INVALID_ARG;
  if (other_process(s)) return other_process_error(s);
  if (name == NULL)
    return set_msg(s, PROBE_ERR_INVALID_ARG, "probe_layer_register: NULL name");
  if (writer_error(s) != PROBE_OK) return s->err;
  size_t len = strlen(name);
  const char *why = layer_name_problem(s, name, len);
  int bad_kind = (int)kind < 0 || kind >= PROBE_KIND_COUNT || (int)prec < 0 ||
                 (int)prec > PROBE_DTYPE_BF16;
  if (why || bad_kind) {
    char shown[80]; /* the name as data in the message: escaped, cut whole */
    probe__text_escape(shown, sizeof shown, name);
    if (why)
      return set_msg(s, PROBE_ERR_INVALID_ARG,
                     "layer name '%s' %s (1 to %d bytes of UTF-8, unique)",
                     shown, why, PROBE_NAME_MAX - 1);
    return set_msg(s, PROBE_ERR_INVALID_ARG, "layer '%s': bad kind/precision",
                   shown);
  }
  if (s->n_layers >= PROBE_LAYERS_MAX)
    return set_msg(s, PROBE_ERR_INVALID_ARG, "too many layers (at most %d)",
                   PROBE_LAYERS_MAX);
  if (name_slots_grow(s) < 0) return set_msg(s, PROBE_ERR_NOMEM, "out of memory");
  if (s->n_layers == s->cap_layers) {
    int32_t cap = s->cap_layers ? s->cap_layers * 2 : 32;
    probe_layer_info *l = realloc(s->layers, (size_t)cap * sizeof *l);
    if (l == NULL) return set_msg(s, PROBE_ERR_NOMEM, "out of memory");
    s->layers = l;
    uint8_t *sel = realloc(s->selected, (size_t)cap);
    if (sel == NULL) return set_msg(s, PROBE_ERR_NOMEM, "out of memory");
    s->selected = sel;
    s->cap_layers = cap;
  }
  probe_layer_info *l = &s->layers[s->n_layers];
  memset(l, 0, sizeof *l);
  l->id = s->n_layers;
  memcpy(l->name, name, len + 1);
  l->kind = (int32_t)kind;
  l->precision = (int32_t)prec;
  s->selected[s->n_layers] = (uint8_t)select_match(s->layer_select, name);
  probe_status st = table_append(s, PROBE__T_LAYERS, l, 1);
  if (st != PROBE_OK) return st;
  s->name_slots[name_slot(s, name)] = s->n_layers + 1;
  if (layer_id) *layer_id = s->n_layers;
  s->n_layers++;
  return PROBE_OK;
}

probe_status probe_step_begin(probe_session *s, int64_t step) {
  if (s == NULL) return PROBE_ERR_INVALID_ARG;
  if (other_process(s)) return other_process_error(s);
  /* every refusal with a session says why: the last message must not be
   * an earlier, unrelated one */
  if (step < 0)
    return set_msg(s, PROBE_ERR_INVALID_ARG, "step %lld is negative",
                   (long long)step);
  if (writer_error(s) != PROBE_OK) return s->err;
  if (s->in_step)
    return set_msg(s, PROBE_ERR_STATE, "step %lld begun inside step %lld",
                   (long long)step, (long long)s->step);
  if (step <= s->last_step)
    return set_msg(s, PROBE_ERR_STATE, "step %lld after step %lld",
                   (long long)step, (long long)s->last_step);
  if (s->joined) {
    /* the rank is back (the next epoch under join()): the mark no longer
     * holds, and a flush before this step ends must not commit it with
     * the steps that follow */
    s->joined = 0;
    pthread_mutex_lock(&s->mu);
    s->sh_joined = 0;
    pthread_mutex_unlock(&s->mu);
  }
  s->in_step = 1;
  s->step = step;
  s->n_cur = 0;
  s->have_scalars = 0;
  s->cuda_pending = 0;
  s->cur_left_out = 0;
  s->step_recorded = s->opt.mode == PROBE_MODE_SCALARS
                         ? s->opt.ring_steps > 0 || s->opt.snapshot_on_nonfinite
                         : step_in_window(&s->opt, step);
  /* After an event in scalars mode, the next ring_steps steps are full. */
  if (s->opt.mode == PROBE_MODE_SCALARS && s->post_remaining > 0)
    s->step_recorded = 1;
  return PROBE_OK;
}

/* Keeps a copy of a host tensor whose statistics are known. */
static void last_keep(probe_session *s, probe_dtype dtype, const void *data,
                      size_t n, size_t bytes) {
  s->last_ok = 0;
  if (bytes > LAST_MAX_BYTES || (n > 0 && data == NULL)) return;
  if (bytes > s->last_cap) {
    void *p = realloc(s->last, bytes);
    if (p == NULL) return; /* no copy: nothing is reused */
    s->last = p;
    s->last_cap = bytes;
  }
  if (bytes) memcpy(s->last, data, bytes);
  s->last_n = n;
  s->last_dtype = dtype;
  s->last_ok = 1;
}

/* Grows the current step's buffers; pending device results point into
 * them, so those land first. */
static probe_status cur_grow(probe_session *s) {
  if (s->cuda_pending) {
    if (probe_cuda_stats_wait(s->cuda) != PROBE_OK)
      return cuda_fail(s, "CUDA statistics failed");
    s->cuda_pending = 0;
  }
  size_t cap = s->cap_cur ? s->cap_cur * 2 : 64;
  probe_record *r = probe__regrow(s->cur, s->n_cur * sizeof *r, cap * sizeof *r);
  if (r == NULL) return set_msg(s, PROBE_ERR_NOMEM, "out of memory");
  s->cur = r;
  tensor_ref *f = realloc(s->ref, cap * sizeof *f);
  if (f == NULL) return set_msg(s, PROBE_ERR_NOMEM, "out of memory");
  s->ref = f;
  uint8_t *a = realloc(s->repeat, cap);
  if (a == NULL) return set_msg(s, PROBE_ERR_NOMEM, "out of memory");
  s->repeat = a;
  uint8_t *b = realloc(s->repeat_next, cap);
  if (b == NULL) return set_msg(s, PROBE_ERR_NOMEM, "out of memory");
  s->repeat_next = b;
  memset(a + s->cap_cur, 0, cap - s->cap_cur);
  memset(b + s->cap_cur, 0, cap - s->cap_cur);
  s->cap_cur = cap;
  return PROBE_OK;
}

probe_status probe_session_first_nonfinite(const probe_session *s,
                                           int64_t *step, int32_t *layer,
                                           probe_site *site, int *covers_all) {
  if (s == NULL || step == NULL || layer == NULL || site == NULL)
    return PROBE_ERR_INVALID_ARG;
  if (other_process(s)) return PROBE_ERR_STATE; /* the parent's stale copy */
  *step = s->nf_rec_step;
  *layer = s->nf_rec_step >= 0 ? s->nf_rec_layer : -1;
  *site = s->nf_rec_step >= 0 ? s->nf_rec_site : PROBE_SITE_FWD_IN;
  if (covers_all) {
    const probe_options *o = &s->opt;
    int every_step = o->mode == PROBE_MODE_FULL
                         ? o->step_start <= 0 && o->step_end < 0 &&
                               o->step_every <= 1
                         : o->ring_steps > 0 || o->snapshot_on_nonfinite;
    *covers_all = o->layer_select == NULL && every_step;
  }
  return PROBE_OK;
}

probe_status probe_session_step_nonfinite(const probe_session *s,
                                          int64_t *step,
                                          probe_nonfinite_record *any,
                                          probe_nonfinite_record *forward,
                                          int *measured) {
  if (s == NULL || step == NULL || any == NULL || forward == NULL)
    return PROBE_ERR_INVALID_ARG;
  if (other_process(s)) return PROBE_ERR_STATE; /* the parent's stale copy */
  *step = s->nf_last_step;
  *any = s->nf_last_any;
  *forward = s->nf_last_fwd;
  if (measured) *measured = s->nf_last_step >= 0 && s->nf_last_measured;
  return PROBE_OK;
}

probe_status probe_tensor_record(probe_session *s, int32_t layer,
                                 probe_site site, probe_dtype dtype,
                                 const void *data, size_t n) {
  if (s == NULL) return PROBE_ERR_INVALID_ARG;
  if (writer_error(s) != PROBE_OK) return s->err;
  if (!s->in_step)
    return set_msg(s, PROBE_ERR_STATE, "probe_tensor_record outside a step");
  if (layer < 0 || layer >= s->n_layers || (int)site < 0 ||
      site >= PROBE_SITE_COUNT || (int)dtype < 0 || dtype > PROBE_DTYPE_BF16 ||
      (data == NULL && n > 0))
    return set_msg(s, PROBE_ERR_INVALID_ARG,
                   "probe_tensor_record: bad layer %d / site %d / dtype %d",
                   (int)layer, (int)site, (int)dtype);
  if (!s->step_recorded || !s->selected[layer]) {
    s->cur_left_out = 1;
    return PROBE_OK;
  }
  probe_status st;
  if (s->n_cur == s->cap_cur && (st = cur_grow(s)) != PROBE_OK) return st;
  probe_record *r = &s->cur[s->n_cur];
  r->step = s->step;
  r->seq = (uint32_t)s->n_cur;
  r->layer = layer;
  r->site = (int32_t)site;
  r->dtype = (int32_t)dtype;
  int device = n > 0 && probe_cuda_is_device_ptr(data);
  if (device) {
    if (s->cuda == NULL &&
        probe_cuda_stats_create(&s->cuda, NULL, 64) != PROBE_OK)
      return cuda_fail(s, "cannot create CUDA statistics");
    probe_cuda_tensor ct = {data, n, dtype};
    if (probe_cuda_stats_enqueue(s->cuda, &ct, 1, &r->stats) != PROBE_OK)
      return cuda_fail(s, "CUDA statistics enqueue failed");
    s->cuda_pending = 1;
  } else {
    /* One layer's output is often the next one's input (and a gradient
     * leaving one layer the one arriving at the previous): the tensor just
     * recorded, recorded again. When its bytes are still those the
     * statistics were computed from (the copy in s->last; compared, not
     * assumed), the statistics are the same. */
    size_t k = s->n_cur, bytes = n * probe_dtype_size(dtype);
    int again = k > 0 && s->ref[k - 1].data == data && s->ref[k - 1].n == n &&
                !s->ref[k - 1].device && s->cur[k - 1].dtype == (int32_t)dtype;
    if (again) s->repeat_next[k - 1] = 1;
    if (again && s->last_ok && s->last_n == n && s->last_dtype == dtype &&
        memcmp(s->last, data, bytes) == 0) {
      r->stats = s->cur[k - 1].stats; /* s->last holds these bytes still */
    } else {
      if ((st = probe_stats_compute(&r->stats, dtype, data, n)) != PROBE_OK)
        return set_msg(s, st, "probe_stats_compute: %s", probe_status_str(st));
      s->last_ok = 0;
      if (s->repeat[k]) last_keep(s, dtype, data, n, bytes);
    }
  }
  if (device) s->last_ok = 0;
  s->ref[s->n_cur] = (tensor_ref){data, n, device};
  s->n_cur++;
  return PROBE_OK;
}

/* Why no caller can have measured a step's values (a negative loss_scale,
 * grad_norm or clip_threshold: a scale, a norm, a max_norm), NULL when
 * they pass. NaN and inf pass: a diverging run's norm is non-finite, and
 * an unmeasured value is stored as NaN. (The reader accepts them: writers
 * before 0.3 stored any value.) */
static const char *step_values_why(const probe_step_scalars *s) {
  if (s->loss_scale < 0) return "negative loss_scale";
  if (s->grad_norm < 0) return "negative grad_norm";
  if (s->clip_threshold < 0) return "negative clip_threshold";
  return NULL;
}

probe_status probe_step_set_scalars(probe_session *s,
                                    const probe_step_scalars *sc) {
  if (s == NULL) return PROBE_ERR_INVALID_ARG;
  if (sc == NULL)
    return set_msg(s, PROBE_ERR_INVALID_ARG, "probe_step_set_scalars: NULL scalars");
  if (writer_error(s) != PROBE_OK) return s->err;
  if (!s->in_step)
    return set_msg(s, PROBE_ERR_STATE, "probe_step_set_scalars outside a step");
  if (sc->unmeasured & ~PROBE_SCALAR_ALL)
    return set_msg(s, PROBE_ERR_INVALID_ARG,
                   "probe_step_set_scalars: unknown bits 0x%x in unmeasured",
                   (unsigned)(sc->unmeasured & ~PROBE_SCALAR_ALL));
  if (!probe__step_flags_ok(sc)) /* what the reader accepts */
    return set_msg(s, PROBE_ERR_INVALID_ARG,
                   "probe_step_set_scalars: found_inf and skipped are 0 or 1 "
                   "(got %d, %d)", (int)sc->found_inf, (int)sc->skipped);
  probe_step_scalars c = *sc;
  c.step = s->step;
  /* What was not measured is NaN in the file whatever the caller left
   * there, so that a reader that does not know the bits still sees no
   * number, and one that does can tell it from a measured NaN. */
  uint32_t u = sc->unmeasured;
  if (u & PROBE_SCALAR_LOSS) c.loss = NAN;
  if (u & PROBE_SCALAR_LOSS_SCALE) c.loss_scale = NAN;
  if (u & PROBE_SCALAR_SCALER)
    c.growth_tracker = c.found_inf = c.skipped = 0;
  if (u & PROBE_SCALAR_LR) c.lr = NAN;
  if (u & PROBE_SCALAR_GRAD_NORM) c.grad_norm = NAN;
  if (u & PROBE_SCALAR_CLIP) c.clip_threshold = c.clip_coef = NAN;
  /* A digest of 0 is "not measured": callers written before the field
   * existed leave it at 0 in a zero-initialised struct. */
  if ((u & PROBE_SCALAR_WEIGHT_DIGEST) || c.weight_digest == 0) {
    c.unmeasured |= PROBE_SCALAR_WEIGHT_DIGEST;
    c.weight_digest = 0;
  }
  const char *why = step_values_why(&c);
  if (why != NULL)
    return set_msg(s, PROBE_ERR_INVALID_ARG, "probe_step_set_scalars: %s",
                   why);
  s->sc = c;
  s->have_scalars = 1;
  return PROBE_OK;
}

probe_status probe_scaler_transition(probe_session *s,
                                     const probe_scaler_event *ev) {
  if (s == NULL) return PROBE_ERR_INVALID_ARG;
  if (ev == NULL)
    return set_msg(s, PROBE_ERR_INVALID_ARG, "probe_scaler_transition: NULL event");
  if (writer_error(s) != PROBE_OK) return s->err;
  probe_scaler_event e = *ev;
  if (s->in_step) e.step = s->step;
  const char *why = probe__scaler_event_why(&e); /* what the reader accepts */
  if (!why && e.step < s->scaler_last_step)
    why = "before the step of the event before it (the reader takes them in "
          "step order)";
  if (why)
    return set_msg(s, PROBE_ERR_INVALID_ARG,
                   "scaler event kind %d at step %lld: %s", (int)e.kind,
                   (long long)e.step, why);
  probe_status st = table_append(s, PROBE__T_SCALER, &e, 1);
  if (st == PROBE_OK) s->scaler_last_step = e.step;
  return st;
}

/* Stores the tensors of `layer` recorded in this step as float32. */
static probe_status snapshot_layer(probe_session *s, int32_t layer) {
  size_t cap = s->opt.snapshot_max_elems;
  for (size_t i = 0; i < s->n_cur; i++) {
    const probe_record *r = &s->cur[i];
    const tensor_ref *f = &s->ref[i];
    if (r->layer != layer) continue;
    size_t n = f->n < cap ? f->n : cap;
    size_t esz = probe_dtype_size((probe_dtype)r->dtype);
    void *raw = NULL;
    const void *src = f->data;
    if (f->device && n > 0) {
      if ((raw = malloc(n * esz)) == NULL)
        return set_msg(s, PROBE_ERR_NOMEM, "out of memory");
      if (probe__gpu_copy_to_host(raw, f->data, n * esz) != PROBE_OK) {
        free(raw);
        return cuda_fail(s, "snapshot copy from the device");
      }
      src = raw;
    }
    pvec *v = &s->stage[PROBE__T_SNAPDATA];
    v->n = 0;
    if (pvec_reserve(v, n) < 0) {
      free(raw);
      return set_msg(s, PROBE_ERR_NOMEM, "out of memory");
    }
    float *dst = (float *)v->data + v->n;
    if (n > 0) {
      if (r->dtype == PROBE_DTYPE_F32) memcpy(dst, src, n * sizeof(float));
      else if (r->dtype == PROBE_DTYPE_F16)
        probe_f16_to_f32_array(dst, src, n);
      else probe_bf16_to_f32_array(dst, src, n);
    }
    free(raw);
    probe_snapshot_info sn = {
        .step = s->step,
        .seq = r->seq,
        .layer = r->layer,
        .site = r->site,
        .dtype = r->dtype,
        .offset = s->appended[PROBE__T_SNAPDATA],
        .n = (int64_t)n,
        .n_total = (int64_t)f->n,
    };
    /* the data before its index row: a flush in between keeps the index
     * pointing at committed data */
    probe_status st = table_append(s, PROBE__T_SNAPDATA, v->data, n);
    if (st == PROBE_OK) st = table_append(s, PROBE__T_SNAPIDX, &sn, 1);
    if (st != PROBE_OK) return st;
  }
  return PROBE_OK;
}

static probe_status ring_dump(probe_session *s) {
  for (int k = 0; k < s->ring_len; k++) {
    int i = (s->ring_head - s->ring_len + k + s->opt.ring_steps) %
            s->opt.ring_steps;
    ring_slot *slot = &s->ring[i];
    probe_status st = table_append(s, PROBE__T_RECORDS, slot->recs, slot->n);
    if (st != PROBE_OK) return st;
  }
  s->ring_len = 0;
  return PROBE_OK;
}

/* Keeps the step's records in the flight recorder's next slot (by
 * cur_exchange: the slot's oldest records are not needed any more). */
static probe_status ring_push(probe_session *s) {
  if (s->opt.ring_steps == 0) return PROBE_OK;
  ring_slot *slot = &s->ring[s->ring_head];
  void *d = slot->recs;
  if (cur_exchange(s, &d, &slot->cap) < 0) return set_msg(s, PROBE_ERR_NOMEM, "out of memory");
  slot->recs = d;
  slot->n = s->n_cur;
  s->ring_head = (s->ring_head + 1) % s->opt.ring_steps;
  if (s->ring_len < s->opt.ring_steps) s->ring_len++;
  return PROBE_OK;
}

static probe_status kernels_collect(probe_session *s) {
  probe_kernel_record *k = NULL;
  size_t n = 0;
  if (probe__cupti_collect(s->cupti, &k, &n) != PROBE_OK) return PROBE_OK;
  probe_status st = n ? table_append(s, PROBE__T_KERNELS, k, n) : PROBE_OK;
  free(k);
  return st;
}

static probe_nonfinite_record nonfinite_record(const probe_record *r) {
  probe_nonfinite_record o = {r->layer, (probe_site)r->site, r->stats.count,
                              r->stats.nan_count, r->stats.posinf_count,
                              r->stats.neginf_count};
  return o;
}

/* A record of this step holds inf or NaN as events take it
 * (probe_record_nonfinite: not a softmax's masked logits). */
static int cur_nonfinite(const probe_session *s, size_t i) {
  const probe_record *r = &s->cur[i];
  int32_t kind = r->layer >= 0 && r->layer < s->n_layers
                     ? s->layers[r->layer].kind
                     : (int32_t)PROBE_KIND_OTHER;
  return probe_record_nonfinite((probe_kind)kind, (probe_site)r->site, &r->stats);
}

/* Keeps what probe_session_step_nonfinite says of the step ending now;
 * first is its first non-finite record (n_cur: none). */
static void step_nonfinite_keep(probe_session *s, size_t first) {
  static const probe_nonfinite_record none = {-1, PROBE_SITE_FWD_IN, 0, 0, 0,
                                              0};
  s->nf_last_step = s->step;
  s->nf_last_measured = !s->cur_left_out;
  s->nf_last_any = s->nf_last_fwd = none;
  if (first == s->n_cur) return;
  s->nf_last_any = nonfinite_record(&s->cur[first]);
  for (size_t i = first; i < s->n_cur; i++)
    if (probe_site_phase((probe_site)s->cur[i].site) == PROBE_PHASE_FORWARD &&
        cur_nonfinite(s, i)) {
      s->nf_last_fwd = nonfinite_record(&s->cur[i]);
      return;
    }
}

/* Ends the current step; allow_snapshot is 0 when the tensors may be gone
 * (a session closed in the middle of a step). */
static probe_status step_finish(probe_session *s, int allow_snapshot) {
  probe_status st;
  s->in_step = 0;
  if (s->cuda_pending) {
    s->cuda_pending = 0;
    if (probe_cuda_stats_wait(s->cuda) != PROBE_OK)
      return cuda_fail(s, "CUDA statistics failed");
  }
  /* The step's first non-finite record, in execution order, and whether
   * any non-finite record is not a gradient. */
  size_t first = s->n_cur;
  int bad_value = 0;
  for (size_t i = 0; i < s->n_cur; i++)
    if (cur_nonfinite(s, i)) {
      if (first == s->n_cur) first = i;
      if (probe_site_phase((probe_site)s->cur[i].site) != PROBE_PHASE_BACKWARD) {
        bad_value = 1;
        break;
      }
    }
  step_nonfinite_keep(s, first);
  int loss_bad = s->have_scalars && !isfinite(s->sc.loss) &&
                 !(s->sc.unmeasured & PROBE_SCALAR_LOSS);
  bad_value |= loss_bad;
  int nonfinite = first < s->n_cur || loss_bad;
  /* An event: a non-finite step not within ring_steps steps of the last
   * event (acted on or not) - except the first step with a bad value (an
   * activation, a weight, the loss), which is always one and always acted
   * on: after a routine scaler overflow (gradients only) opened the quiet
   * window, the run's first real NaN was otherwise only on disk at the next
   * timer flush, and a crash within a second lost the diagnosis. */
  int first_bad = bad_value && !s->bad_event_done;
  int event = nonfinite && (s->quiet_remaining == 0 || first_bad);
  int act = event && (s->n_events < s->opt.max_events || first_bad);
  if (act && bad_value) s->bad_event_done = 1;
  if (event) {
    s->n_events++;
    s->quiet_remaining = s->opt.ring_steps;
  } else if (s->quiet_remaining > 0) {
    s->quiet_remaining--;
  }
  if (nonfinite && s->first_nonfinite < 0) s->first_nonfinite = s->step;
  if (first < s->n_cur && s->nf_rec_step < 0) {
    s->nf_rec_step = s->step;
    s->nf_rec_layer = s->cur[first].layer;
    s->nf_rec_site = (probe_site)s->cur[first].site;
  }

  if (act && allow_snapshot && s->opt.snapshot_on_nonfinite && first < s->n_cur)
    if ((st = snapshot_layer(s, s->cur[first].layer)) != PROBE_OK) return st;

  if (s->opt.mode == PROBE_MODE_FULL) {
    if (s->step_recorded && s->n_cur && (st = records_append_cur(s)) != PROBE_OK)
      return st;
  } else if (act) {
    if ((st = ring_dump(s)) != PROBE_OK) return st;
    if (s->n_cur && (st = records_append_cur(s)) != PROBE_OK)
      return st;
    s->post_remaining = s->opt.ring_steps;
  } else if (s->post_remaining > 0) {
    if (s->n_cur && (st = records_append_cur(s)) != PROBE_OK)
      return st;
    s->post_remaining--;
  } else if ((st = ring_push(s)) != PROBE_OK) {
    return st;
  }

  if (s->have_scalars) {
    s->sc.wall_time = now_s() - s->t0;
    if ((st = table_append(s, PROBE__T_STEPS, &s->sc, 1)) != PROBE_OK)
      return st;
  }
  if (s->cupti && (st = kernels_collect(s)) != PROBE_OK) return st;
  s->last_step = s->step;
  if (s->n_cur > 0) { /* what repeated in this step is expected next step */
    uint8_t *t = s->repeat;
    s->repeat = s->repeat_next;
    s->repeat_next = t;
    memset(s->repeat_next, 0, s->cap_cur);
  }
  s->last_ok = 0;
  s->n_cur = 0;
  s->steps_since_flush++;

  /* Flushes every flush_steps steps, and at an event where a value other
   * than a gradient is non-finite (an activation, a weight, the loss), are
   * synchronous. An event of non-finite gradients alone - the loss scaler's
   * routine overflow, which nearly every FP16 run with dynamic loss scaling
   * meets in its first steps - asks for the flush at once but does not wait
   * for it (waiting cost 4 ms, 10% of a 200-step run of the default
   * scenario). The writer thread also flushes on its own flush_seconds
   * timer. */
  int how = HAND_ROWS;
  if (act) how = bad_value ? HAND_FLUSH_SYNC : HAND_FLUSH_ASYNC;
  if (s->opt.flush_steps > 0 && s->steps_since_flush >= s->opt.flush_steps)
    how = HAND_FLUSH_SYNC;
  return hand_over(s, how);
}

probe_status probe_step_end(probe_session *s) {
  if (s == NULL) return PROBE_ERR_INVALID_ARG;
  if (writer_error(s) != PROBE_OK) return s->err;
  if (!s->in_step)
    return set_msg(s, PROBE_ERR_STATE, "probe_step_end without a step");
  return step_finish(s, 1);
}

probe_status probe_session_mark_joined(probe_session *s) {
  if (s == NULL) return PROBE_ERR_INVALID_ARG;
  if (writer_error(s) != PROBE_OK) return s->err;
  if (s->in_step)
    return set_msg(s, PROBE_ERR_STATE,
                   "probe_session_mark_joined inside step %lld (the rank "
                   "joins after the last step it ended)",
                   (long long)s->step);
  s->joined = 1;
  /* committed with the state at the next flush: one is asked for now, not
   * waited for (a joined rank is inside the others' all-reduces) */
  return hand_over(s, HAND_FLUSH_ASYNC);
}

probe_status probe_session_mark_aborted(probe_session *s, const char *reason) {
  if (s == NULL || reason == NULL || reason[0] == '\0')
    return PROBE_ERR_INVALID_ARG;
  if (other_process(s)) return PROBE_ERR_STATE;
  if (s->aborted[0]) return PROBE_OK; /* the first cause holds */
  /* cut at a character boundary: the reason is UTF-8 text as a rule */
  size_t n = strlen(reason);
  if (n > PROBE_ABORT_REASON_MAX - 1) {
    n = PROBE_ABORT_REASON_MAX - 1;
    while (n > 0 && ((unsigned char)reason[n] & 0xC0) == 0x80) n--;
  }
  memcpy(s->aborted, reason, n);
  s->aborted[n] = '\0';
  s->aborted_step = s->in_step ? s->step : -1;
  /* the writer reads it at close, after taking close_req under mu */
  return PROBE_OK;
}

probe_status probe_session_flush(probe_session *s) {
  if (s == NULL) return PROBE_ERR_INVALID_ARG;
  if (writer_error(s) != PROBE_OK) return s->err;
  return hand_over(s, HAND_FLUSH_SYNC);
}

probe_status probe_session_close(probe_session *s) {
  if (s == NULL) return PROBE_ERR_INVALID_ARG;
  if (other_process(s)) { /* the parent's copy: nothing joined or freed */
    other_process_error(s);
    return open_fail(PROBE_ERR_STATE, "%s", s->msg);
  }
  probe_status st = writer_error(s);
  if (st == PROBE_OK && s->in_step) st = step_finish(s, 0);
  if (s->cupti) {
    if (st == PROBE_OK) st = kernels_collect(s);
    probe__cupti_stop(s->cupti);
    s->cupti = NULL;
  }
  /* The writer thread flushes (unless something failed), marks the trace
   * complete and closes the file; then it ends. */
  pthread_mutex_lock(&s->mu);
  if (out_move_locked(s) < 0 && st == PROBE_OK)
    st = set_msg(s, PROBE_ERR_NOMEM, "out of memory buffering rows");
  s->close_req = 1;
  s->close_flush = st == PROBE_OK;
  pthread_cond_signal(&s->wake);
  pthread_mutex_unlock(&s->mu);
  pthread_join(s->thread, NULL);
  s->err = PROBE_OK;
  probe_status wst = writer_error(s);
  if (st == PROBE_OK) st = wst;
  if (s->cuda) probe_cuda_stats_destroy(s->cuda);
  /* the handle is gone: its message goes where s NULL finds it */
  if (st != PROBE_OK) open_fail(st, "%s", s->msg[0] ? s->msg : probe_status_str(st));
  session_free(s);
  return st;
}

void probe_range_push(probe_session *s, int32_t layer, probe_site site) {
  if (s == NULL || other_process(s)) return;
#ifdef AMPPROBE_HAVE_CUDA
  char name[PROBE_NAME_MAX + 24];
  const char *ln = layer >= 0 && layer < s->n_layers ? s->layers[layer].name
                                                     : "?";
  const char *sn = probe_site_name(site);
  snprintf(name, sizeof name, "%s/%s", ln, sn ? sn : "?");
  probe__nvtx_push(name);
  if (s->cupti)
    probe__cupti_push(s->cupti, probe__cupti_encode(s->in_step ? s->step : -1,
                                                    layer, (int32_t)site));
#endif
}

void probe_range_pop(probe_session *s) {
  if (s == NULL || other_process(s)) return;
#ifdef AMPPROBE_HAVE_CUDA
  probe__nvtx_pop();
  if (s->cupti) probe__cupti_pop(s->cupti);
#endif
}