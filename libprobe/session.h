/*
 * session.h - private: the probe session shared by its two halves.
 *
 * session.c is the caller's side: the public API calls, the statistics,
 * the step's records, events, the flight recorder and snapshots, and the
 * hand-over of finished rows. writer.c is the writer thread's side: the
 * HDF5 file, its layout and its flushes. The struct below is split the
 * same way: fields marked "writer thread's own" are touched only by
 * writer.c, "the caller's" only by session.c, "shared" only under mu.
 * Nothing here is public; the only cross-file function is
 * probe__writer_main.
 */
#ifndef AMPPROBE_LIBPROBE_SESSION_H
#define AMPPROBE_LIBPROBE_SESSION_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <hdf5.h>

#include "ampprobe/probe.h"
#include "format.h"
#include "gpu.h"

/* Largest tensor (bytes) whose copy is kept to recognise it when it is
 * recorded again (probe_tensor_record). */
#define LAST_MAX_BYTES ((size_t)256 << 10)

/* Bytes of rows handed over and not yet taken by the writer thread above
 * which the caller waits (backpressure). */
#define WAIT_BYTES ((size_t)64 << 20)

/* ---- small growable arrays ------------------------------------------------ */

typedef struct pvec {
  char *data;
  size_t n, cap, elem; /* rows, capacity in rows, bytes per row */
} pvec;

/* Moves the first `keep` bytes of the heap block old into a new block of
 * `bytes` (malloc, copy, free) and returns it; NULL without memory, old
 * untouched. Buffers of rows and records change threads (the caller's
 * go to the writer, the writer's come back as spares), and each thread
 * allocates from its own malloc arena: glibc's realloc of a block from
 * another thread's arena allocates and copies in that arena under its
 * lock, and the training thread's own mallocs waited on the writer's
 * reallocs there (strace: ~35 waits per 1,000 steps of a full trace). */
static inline void *probe__regrow(void *old, size_t keep, size_t bytes) {
  void *p = malloc(bytes);
  if (p == NULL) return NULL;
  if (keep) memcpy(p, old, keep);
  free(old);
  return p;
}

static inline int pvec_reserve(pvec *v, size_t want) {
  if (want <= v->cap) return 0;
  size_t cap = v->cap ? v->cap : 64;
  while (cap < want) cap *= 2;
  char *p = probe__regrow(v->data, v->n * v->elem, cap * v->elem);
  if (p == NULL) return -1;
  v->data = p;
  v->cap = cap;
  return 0;
}

static inline int pvec_push(pvec *v, const void *rows, size_t n) {
  if (n == 0) return 0; /* rows may be NULL (an empty snapshot) */
  if (pvec_reserve(v, v->n + n) < 0) return -1;
  memcpy(v->data + v->n * v->elem, rows, n * v->elem);
  v->n += n;
  return 0;
}

/* Rows of one table handed over and not yet taken by the writer: the
 * caller's buffers themselves, oldest first, each moved in whole at
 * hand_over (a swap of pointers: copying a step's records into one growing
 * buffer, cold in the caller's cache, cost it ~5 us a step of 50 records).
 * The writer appends them to pend and gives the emptied buffers back as
 * spares. Past PQ_MAX buffers, rows are copied behind the last one. */
#define PQ_MAX 32
typedef struct pqueue {
  pvec v[PQ_MAX];
  int n;       /* buffers */
  size_t rows; /* rows in them */
} pqueue;

/* Spare buffers larger than this are freed rather than kept (a snapshot's
 * data may have grown one to megabytes). */
#define SPARE_MAX_BYTES ((size_t)1 << 20)

/* One recorded tensor of the current step, kept until probe_step_end for a
 * possible snapshot. */
typedef struct tensor_ref {
  const void *data;
  size_t n;
  int device;
} tensor_ref;

/* One step of per-layer records in the flight recorder. */
typedef struct ring_slot {
  probe_record *recs;
  size_t n, cap;
} ring_slot;

struct probe_session {
  probe_options opt;
  int fork_gen;       /* the process's fork generation at open (session.c) */
  pid_t pid;          /* the process that opened it */
  char *layer_select; /* owned copy of opt.layer_select */
  char *path;         /* owned copy, for the writer thread's H5Fcreate */
  char *own_strings[4]; /* owned copies of opt.command_line, config_json,
                           precision_policy and run_id, which the writer
                           thread writes after probe_session_open has
                           returned */

  /* ---- the writer thread's own (the caller never touches these) ---- */
  hid_t file;
  hid_t dset[PROBE__T_COUNT];
  hid_t mtype[PROBE__T_COUNT];
  hid_t state;
  int64_t rows[PROBE__T_COUNT]; /* rows written with H5Dwrite so far */
  pvec pend[PROBE__T_COUNT];    /* rows waiting for their H5Dwrite */
  pqueue taken[PROBE__T_COUNT]; /* in[], taken under mu, appended to pend
                                   outside it, given back as spares */
  int64_t unflushed[PROBE__T_COUNT]; /* rows written since the last flush */
  /* Tables written chunk by chunk with H5Dwrite_chunk (table_write): the
   * rows of the last, partly filled chunk, rewritten as it grows. */
  int direct[PROBE__T_COUNT];
  int64_t batch[PROBE__T_COUNT]; /* rows per write: batch_rows, or at
                                    most 4 chunks for direct tables (set
                                    by the writer under mu once the file
                                    exists, read by both threads) */
  uint8_t *tail[PROBE__T_COUNT]; /* (chunk_rows rows) */
  size_t tail_n[PROBE__T_COUNT];
  uint8_t *shuf, *zbuf;          /* encoder scratch */
  size_t scratch_cap;
  int64_t w_last_step, w_first_nonfinite, w_n_events; /* as of the rows
                                                         taken */
  int w_joined; /* the join mark as of the rows taken (state entry 15) */
  int64_t n_flushes;
  double t_last_flush;
  probe_status w_err; /* sticky I/O error of the writer thread */
  int detached;       /* file descriptor replaced after a failed write */
  int committing;     /* limit_commit is writing: no second commit */
  int writing;        /* direct table whose chunk is being written, or -1 */
  uint8_t tail_bad[PROBE__T_COUNT]; /* a chunk write of it failed */
  char w_msg[512];

  /* ---- shared, under mu ---- */
  pthread_t thread;
  int thread_started;
  int lock_fd; /* holds the writer lock on the trace (session.c) */
  pthread_mutex_t mu;
  pthread_cond_t wake; /* to the writer: rows, a request */
  pthread_cond_t done; /* to the caller: flushed, rows taken, failed */
  pqueue in[PROBE__T_COUNT]; /* rows handed over, not yet taken */
  pvec spare[PROBE__T_COUNT][PQ_MAX]; /* empty buffers for out[] */
  int n_spare[PROBE__T_COUNT];
  size_t in_bytes;
  int64_t sh_last_step, sh_first_nonfinite, sh_n_events;
  int sh_joined;
  uint64_t flush_req, flush_done; /* synchronous flush tickets */
  int close_req, close_flush;
  int w_idle;  /* the writer sleeps with nothing to flush */
  probe_status sh_err;
  char sh_msg[512];
  atomic_int err_flag; /* sh_err is set (read without the lock) */

  /* ---- the caller's ---- */
  pvec stage[PROBE__T_COUNT]; /* scratch (snapshot data as float32) */
  pvec out[PROBE__T_COUNT];   /* rows queued, handed over at hand_over */
  int64_t appended[PROBE__T_COUNT]; /* rows handed over so far */

  probe_layer_info *layers; /* (n_layers) */
  uint8_t *selected;        /* (n_layers) 1 when the layer is recorded */
  int32_t n_layers, cap_layers;
  /* names -> layer: open addressing, layer id + 1 per slot (0 empty), a
   * power of two with at least twice n_layers slots (session.c) */
  int32_t *name_slots;
  size_t n_name_slots;

  int in_step;
  int64_t step;
  int step_recorded; /* records of this step are computed */
  int have_scalars;
  probe_step_scalars sc;
  probe_record *cur; /* (n_cur) records of the current step, seq order */
  tensor_ref *ref;   /* (n_cur) */
  size_t n_cur, cap_cur;
  int cuda_pending;
  probe_cuda_stats *cuda;
  /* A host tensor recorded twice in a row with the same bytes reuses its
   * statistics. last: a copy of the bytes of record n_cur - 1 (last_ok),
   * kept only where the step before recorded the same pointer next
   * (repeat[seq], learnt in repeat_next), so tensors that never come back
   * are not copied. */
  void *last;
  size_t last_n, last_cap;
  probe_dtype last_dtype;
  int last_ok;
  uint8_t *repeat, *repeat_next; /* (cap_cur) */

  ring_slot *ring; /* (opt.ring_steps) */
  int ring_head, ring_len;

  int64_t post_remaining; /* steps still written in full after an event */
  int64_t quiet_remaining; /* steps in which non-finite is no new event */
  int64_t n_events;
  int bad_event_done; /* an event with a non-finite value other than a
                         gradient was acted on (step_finish) */
  int64_t first_nonfinite;
  /* The first record holding NaN or inf, in execution order (step -1: none
   * yet); see probe_session_first_nonfinite. */
  int64_t nf_rec_step;
  int32_t nf_rec_layer;
  probe_site nf_rec_site;
  /* The step ended last, as probe_session_step_nonfinite gives it; and
   * whether a record given in the current step was left out (not
   * computed). */
  int64_t nf_last_step;
  probe_nonfinite_record nf_last_any, nf_last_fwd;
  int nf_last_measured, cur_left_out;
  int64_t last_step;
  int joined; /* probe_session_mark_joined since the last step began */
  char aborted[PROBE_ABORT_REASON_MAX]; /* probe_session_mark_aborted's
                                           reason, "" when none; read by
                                           the writer at close */
  int64_t aborted_step; /* the step in progress at the mark, -1 */
  int64_t scaler_last_step; /* step of the last scaler event queued, -1 */
  int64_t steps_since_flush;
  double t0;

  probe__cupti *cupti;

  probe_status err; /* sticky error seen by the caller; PROBE_OK if healthy */
  char msg[512];
};

/* Moves the rows of src behind those of dst; swaps when dst is empty, so
 * that steady-state hand-overs copy nothing. Returns -1 without memory. */
static inline int pvec_move(pvec *dst, pvec *src) {
  if (src->n == 0) return 0;
  if (dst->n == 0) {
    pvec t = *dst;
    *dst = *src;
    *src = t;
    src->n = 0;
    return 0;
  }
  if (pvec_push(dst, src->data, src->n) < 0) return -1;
  src->n = 0;
  return 0;
}

/* Caller, under mu: moves src's buffer, rows and all, to the back of q and
 * gives src an empty one (a spare, else none yet); when q is full, copies
 * the rows behind its last buffer. Returns -1 without memory. */
static inline int pq_put(pqueue *q, pvec *src, pvec *spare, int *n_spare) {
  if (src->n == 0) return 0;
  const size_t rows = src->n;
  if (q->n == PQ_MAX) {
    if (pvec_move(&q->v[PQ_MAX - 1], src) < 0) return -1;
  } else {
    q->v[q->n++] = *src;
    if (*n_spare > 0) {
      *src = spare[--*n_spare];
    } else {
      src->data = NULL;
      src->cap = 0;
    }
    src->n = 0;
  }
  q->rows += rows;
  return 0;
}

/* Writer, under mu: empty buffers back to the spares (n_spare of them),
 * or freed when the spares are full or the buffer is large. */
static inline void pq_give_back(pqueue *q, pvec *spare, int *n_spare) {
  for (int i = 0; i < q->n; i++) {
    pvec *v = &q->v[i];
    if (*n_spare < PQ_MAX && v->cap * v->elem <= SPARE_MAX_BYTES) {
      v->n = 0;
      spare[(*n_spare)++] = *v;
    } else {
      free(v->data);
    }
  }
  q->n = 0;
  q->rows = 0;
}

/* Frees every buffer of q. */
static inline void pq_free(pqueue *q) {
  for (int i = 0; i < q->n; i++) free(q->v[i].data);
  q->n = 0;
  q->rows = 0;
}

static inline double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The writer thread (writer.c): creates the file, then writes and flushes
 * what the caller hands over until close_req; closes the file and ends. */
void *probe__writer_main(void *arg);

#endif /* AMPPROBE_LIBPROBE_SESSION_H */
