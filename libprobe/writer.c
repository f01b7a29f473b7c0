/*
 * writer.c - the probe session: turns tensors into statistics records and
 * writes them, with step scalars and scaler events, into a crash-safe HDF5
 * trace (layout: format.c, docs/trace-format.md).
 *
 * Crash safety: every dataset is created when the session opens, then the
 * file enters SWMR mode (H5Fstart_swmr_write) and only appends rows after
 * that. Rows are buffered in memory and written many per H5Dwrite. A flush
 * (every flush_seconds / flush_steps, at each of the first max_events
 * non-finite events, at close)
 * writes every buffered row, H5Fflush-es the file, and only then overwrites
 * the row counts in /meta/state and flushes that dataset: a reader trusts
 * those counts, so whatever a killed writer left, the rows it counts were
 * on disk before the counts were.
 *
 * Flight recorder (PROBE_MODE_SCALARS): the per-layer records of the last
 * ring_steps steps stay in memory; a non-finite event writes them, the
 * step of the event and the ring_steps steps after it.
 *
 * Threads: every session owns one writer thread, and only that thread calls
 * HDF5 for the session, from creating the file to closing it (HDF5 is the
 * serial build; all of libprobe's HDF5 calls also hold the process-wide
 * probe__h5_lock). The caller's thread computes the statistics, keeps the
 * step's records, decides events and snapshots, and hands finished rows
 * over at probe_step_end (one mutex per step; buffers are swapped, not
 * copied). The writer thread batches them into H5Dwrite calls of
 * batch_rows rows, compresses, and flushes on its own timer (flush_seconds
 * after the first unflushed row, even while the caller is busy elsewhere).
 * Flushes asked for by the caller (probe_session_flush, flush_steps, a
 * non-finite event, close) are synchronous: the call returns when the rows
 * are on disk and counted. The writer's I/O errors are sticky and come
 * back to the caller at its next call, and at close. The rows waiting for
 * the writer are bounded (WAIT_BYTES): a caller faster than the disk waits.
 */
#define _POSIX_C_SOURCE 200809L
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
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include <hdf5.h>

#include "ampprobe/probe.h"
#include "ampprobe/version.h"
#include "deflate.h"
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

static int pvec_reserve(pvec *v, size_t want) {
  if (want <= v->cap) return 0;
  size_t cap = v->cap ? v->cap : 64;
  while (cap < want) cap *= 2;
  char *p = realloc(v->data, cap * v->elem);
  if (p == NULL) return -1;
  v->data = p;
  v->cap = cap;
  return 0;
}

static int pvec_push(pvec *v, const void *rows, size_t n) {
  if (pvec_reserve(v, v->n + n) < 0) return -1;
  memcpy(v->data + v->n * v->elem, rows, n * v->elem);
  v->n += n;
  return 0;
}

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
  char *layer_select; /* owned copy of opt.layer_select */
  char *path;         /* owned copy, for the writer thread's H5Fcreate */
  char *own_strings[3]; /* owned copies of opt.command_line, config_json and
                           precision_policy, which the writer thread writes
                           after probe_session_open has returned */

  /* ---- the writer thread's own (the caller never touches these) ---- */
  hid_t file;
  hid_t dset[PROBE__T_COUNT];
  hid_t mtype[PROBE__T_COUNT];
  hid_t state;
  int64_t rows[PROBE__T_COUNT]; /* rows written with H5Dwrite so far */
  pvec pend[PROBE__T_COUNT];    /* rows waiting for their H5Dwrite */
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
  int64_t n_flushes;
  double t_last_flush;
  probe_status w_err; /* sticky I/O error of the writer thread */
  int detached;       /* file descriptor replaced after a failed write */
  char w_msg[512];

  /* ---- shared, under mu ---- */
  pthread_t thread;
  int thread_started;
  pthread_mutex_t mu;
  pthread_cond_t wake; /* to the writer: rows, a request */
  pthread_cond_t done; /* to the caller: flushed, rows taken, failed */
  pvec in[PROBE__T_COUNT]; /* rows handed over, not yet taken */
  size_t in_bytes;
  int64_t sh_last_step, sh_first_nonfinite, sh_n_events;
  uint64_t flush_req, flush_done; /* synchronous flush tickets */
  int close_req, close_flush;
  int w_idle;  /* the writer sleeps with nothing to flush */
  probe_status sh_err;
  char sh_msg[512];
  atomic_int err_flag; /* sh_err is set (read without the lock) */

  /* ---- the caller's ---- */
  pvec stage[PROBE__T_COUNT]; /* scratch (snapshot data as float32) */
  int64_t appended[PROBE__T_COUNT]; /* rows handed over so far */

  probe_layer_info *layers; /* (n_layers) */
  uint8_t *selected;        /* (n_layers) 1 when the layer is recorded */
  int32_t n_layers, cap_layers;

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
  int64_t first_nonfinite;
  /* The first record holding NaN or inf, in execution order (step -1: none
   * yet); see probe_session_first_nonfinite. */
  int64_t nf_rec_step;
  int32_t nf_rec_layer;
  probe_site nf_rec_site;
  int64_t last_step;
  int64_t steps_since_flush;
  double t0;

  probe__cupti *cupti;

  probe_status err; /* sticky error seen by the caller; PROBE_OK if healthy */
  char msg[512];
};

/* The message of the last failed probe_session_open in this thread. */
static _Thread_local char open_msg[512];

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static probe_status set_msg(probe_session *s, probe_status st, const char *fmt,
                            ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(s->msg, sizeof s->msg, fmt, ap);
  va_end(ap);
  return st;
}

/* The writer thread's error message (the caller's is s->msg). */
static probe_status set_wmsg(probe_session *s, probe_status st,
                             const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(s->w_msg, sizeof s->w_msg, fmt, ap);
  va_end(ap);
  return st;
}

/* After a failed write the file must not change any more: HDF5 would go on
 * writing metadata (at close, at the next flush) that may point past what
 * reached the disk. The descriptor under HDF5 is replaced by /dev/null opened
 * read-only, so every later write fails and the file keeps its last flushed
 * state, still marked as an SWMR file that readers open as it is. */
static void file_detach(probe_session *s) {
  void *handle = NULL;
  if (s->file < 0 || s->detached) return;
  if (H5Fget_vfd_handle(s->file, H5P_DEFAULT, &handle) < 0 || handle == NULL) {
    H5Eclear2(H5E_DEFAULT);
    return;
  }
  int fd = *(int *)handle;
  int nul = open("/dev/null", O_RDONLY);
  if (nul >= 0) {
    if (dup2(nul, fd) >= 0) s->detached = 1;
    close(nul);
  }
}

/* Collects from HDF5's error stack the most specific message and an errno
 * if the failing call was a system call. */
typedef struct h5err {
  char desc[256];
  int sys_errno;
  int n;
} h5err;

static herr_t h5err_walk(unsigned n, const H5E_error2_t *e, void *data) {
  h5err *he = data;
  if (he->n++ == 0 && e->desc) snprintf(he->desc, sizeof he->desc, "%s", e->desc);
  const char *p = e->desc ? strstr(e->desc, "errno = ") : NULL;
  if (p && he->sys_errno == 0) he->sys_errno = atoi(p + 8);
  return 0;
}

/* Turns the current HDF5 error into a sticky session error. A failed write
 * because of a full disk or the file-size limit is PROBE_ERR_NOSPACE. */
static probe_status h5_fail(probe_session *s, const char *what) {
  int saved = errno;
  h5err he = {{0}, 0, 0};
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, h5err_walk, &he);
  H5Eclear2(H5E_DEFAULT);
  int e = he.sys_errno ? he.sys_errno : saved;
  probe_status st = PROBE_ERR_HDF5;
  if (e == EFBIG || e == ENOSPC || e == EDQUOT) {
    st = PROBE_ERR_NOSPACE;
    set_wmsg(s, st, "%s failed: %s", what, strerror(e));
  } else if (he.sys_errno) {
    st = PROBE_ERR_IO;
    set_wmsg(s, st, "%s failed: %s", what, strerror(he.sys_errno));
  } else {
    set_wmsg(s, st, "%s failed: %s", what, he.n ? he.desc : "HDF5 error");
  }
  s->w_err = st;
  if (st == PROBE_ERR_NOSPACE || st == PROBE_ERR_IO) file_detach(s);
  return st;
}

/* ---- options and selection ------------------------------------------------ */

void probe_options_init(probe_options *opt) {
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

/* ---- file creation -------------------------------------------------------- */

static int attr_str(hid_t loc, const char *name, const char *value) {
  hid_t t = probe__vlstr_type(), sp = H5Screate(H5S_SCALAR), a = -1;
  int rc = -1;
  if (t < 0 || sp < 0) goto done;
  a = H5Acreate2(loc, name, t, sp, H5P_DEFAULT, H5P_DEFAULT);
  if (a < 0) goto done;
  const char *v = value ? value : "";
  rc = H5Awrite(a, t, &v) < 0 ? -1 : 0;
done:
  if (a >= 0) H5Aclose(a);
  if (sp >= 0) H5Sclose(sp);
  if (t >= 0) H5Tclose(t);
  return rc;
}

static int attr_i32(hid_t loc, const char *name, int32_t value) {
  hid_t sp = H5Screate(H5S_SCALAR), a = -1;
  int rc = -1;
  if (sp < 0) return -1;
  a = H5Acreate2(loc, name, H5T_STD_I32LE, sp, H5P_DEFAULT, H5P_DEFAULT);
  if (a >= 0) rc = H5Awrite(a, H5T_NATIVE_INT32, &value) < 0 ? -1 : 0;
  if (a >= 0) H5Aclose(a);
  H5Sclose(sp);
  return rc;
}

static int write_root_attrs(probe_session *s) {
  char created[32], versions[160];
  time_t t = time(NULL);
  struct tm tm;
  gmtime_r(&t, &tm);
  strftime(created, sizeof created, "%Y-%m-%dT%H:%M:%SZ", &tm);
  unsigned maj = 0, min = 0, rel = 0;
  H5get_libversion(&maj, &min, &rel);
  snprintf(versions, sizeof versions, "ampprobe %s; hdf5 %u.%u.%u; cuda %s",
           ampprobe_version(), maj, min, rel,
#ifdef AMPPROBE_HAVE_CUDA
           "yes"
#else
           "no"
#endif
  );
  hid_t f = s->file;
  if (attr_str(f, "format", PROBE_TRACE_FORMAT) < 0 ||
      attr_i32(f, "version", PROBE_TRACE_VERSION) < 0 ||
      attr_str(f, "created", created) < 0 ||
      attr_str(f, "command_line", s->opt.command_line) < 0 ||
      attr_str(f, "config_json", s->opt.config_json) < 0 ||
      attr_str(f, "precision_policy", s->opt.precision_policy) < 0 ||
      attr_str(f, "library_versions", versions) < 0 ||
      attr_i32(f, "record_mode", (int32_t)s->opt.mode) < 0 ||
      attr_i32(f, "ring_steps", s->opt.ring_steps) < 0 ||
      attr_i32(f, "hist_min_exp", PROBE_HIST_MIN_EXP) < 0 ||
      attr_i32(f, "hist_bins", PROBE_HIST_BINS) < 0)
    return -1;
  return 0;
}

static hid_t create_table(probe_session *s, probe__table t) {
  const probe__tabledef *d = &probe__tables[t];
  hsize_t dims[1] = {0}, maxdims[1] = {H5S_UNLIMITED}, chunk[1] = {d->chunk_rows};
  hid_t sp = H5Screate_simple(1, dims, maxdims);
  hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
  hid_t ft = probe__type_create(t, 1);
  hid_t ds = H5I_INVALID_HID;
  if (sp < 0 || dcpl < 0 || ft < 0) goto done;
  if (H5Pset_chunk(dcpl, 1, chunk) < 0 || H5Pset_shuffle(dcpl) < 0 ||
      H5Pset_deflate(dcpl, 1) < 0)
    goto done;
  ds = H5Dcreate2(s->file, d->path, ft, sp, H5P_DEFAULT, dcpl, H5P_DEFAULT);
done:
  if (ft >= 0) H5Tclose(ft);
  if (dcpl >= 0) H5Pclose(dcpl);
  if (sp >= 0) H5Sclose(sp);
  return ds;
}

static int create_layout(probe_session *s) {
  hid_t g = H5Gcreate2(s->file, "/meta", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  if (g < 0) return -1;
  H5Gclose(g);
  g = H5Gcreate2(s->file, "/snapshots", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  if (g < 0) return -1;
  H5Gclose(g);
  for (int t = 0; t < PROBE__T_COUNT; t++) {
    s->dset[t] = create_table(s, (probe__table)t);
    s->mtype[t] = probe__type_create((probe__table)t, 0);
    if (s->dset[t] < 0 || s->mtype[t] < 0) return -1;
    /* The per-step tables are written chunk by chunk with our encoder
     * when the file type is byte for byte the memory type (a
     * little-endian host): that skips HDF5's conversion, its shuffle and
     * zlib (deflate.c). */
    if (t == PROBE__T_RECORDS || t == PROBE__T_STEPS) {
      hid_t ft = H5Dget_type(s->dset[t]);
      s->direct[t] = ft >= 0 && H5Tequal(ft, s->mtype[t]) > 0;
      if (ft >= 0) H5Tclose(ft);
    }
  }
  /* The state: int64[PROBE__STATE_LEN], one chunk, no filter. */
  hsize_t dims[1] = {PROBE__STATE_LEN};
  hid_t sp = H5Screate_simple(1, dims, NULL);
  hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
  if (sp < 0 || dcpl < 0 || H5Pset_chunk(dcpl, 1, dims) < 0) return -1;
  s->state = H5Dcreate2(s->file, PROBE__STATE_PATH, H5T_STD_I64LE, sp,
                        H5P_DEFAULT, dcpl, H5P_DEFAULT);
  H5Pclose(dcpl);
  H5Sclose(sp);
  if (s->state < 0) return -1;
  return attr_str(s->state, "fields", PROBE__STATE_FIELDS);
}

/* ---- appends and flushes -------------------------------------------------- */

/* Encodes the chunk of table t that starts at row `first` (tail_n[t] rows
 * in tail[t], zeros after them, as HDF5 fills) with the dataset's filters,
 * shuffle then deflate (deflate.c), and writes it with H5Dwrite_chunk. */
static probe_status chunk_write(probe_session *s, probe__table t,
                                int64_t first) {
  const size_t rows = probe__tables[t].chunk_rows;
  const size_t elem = probe__tables[t].mem_size, bytes = rows * elem;
  if (s->scratch_cap < bytes) {
    uint8_t *a = realloc(s->shuf, bytes);
    if (a) s->shuf = a;
    uint8_t *b = a ? realloc(s->zbuf, probe__deflate_bound(bytes)) : NULL;
    if (b) s->zbuf = b;
    if (a == NULL || b == NULL) {
      s->w_err = PROBE_ERR_NOMEM;
      return set_wmsg(s, s->w_err, "out of memory encoding a chunk");
    }
    s->scratch_cap = bytes;
  }
  uint8_t *c = s->tail[t];
  memset(c + s->tail_n[t] * elem, 0, (rows - s->tail_n[t]) * elem);
  probe__shuffle(s->shuf, c, rows, elem);
  size_t len = probe__deflate(s->shuf, bytes, s->zbuf);
  hsize_t off[1] = {(hsize_t)first};
  if (H5Dwrite_chunk(s->dset[t], H5P_DEFAULT, 0, off, len, s->zbuf) < 0)
    return h5_fail(s, "H5Dwrite_chunk");
  return PROBE_OK;
}

/* Direct path of table_write: fills chunks from the pending rows; every
 * chunk that fills is encoded and written once, the last partial one is
 * written too and kept, to be rewritten when more rows come. */
static probe_status table_write_direct(probe_session *s, probe__table t) {
  pvec *v = &s->pend[t];
  const size_t rows = probe__tables[t].chunk_rows, elem = v->elem;
  if (s->tail[t] == NULL && (s->tail[t] = malloc(rows * elem)) == NULL) {
    s->w_err = PROBE_ERR_NOMEM;
    return set_wmsg(s, s->w_err, "out of memory buffering a chunk");
  }
  hsize_t size[1] = {(hsize_t)s->rows[t] + v->n};
  if (H5Dset_extent(s->dset[t], size) < 0) return h5_fail(s, "H5Dset_extent");
  int64_t first = s->rows[t] - (int64_t)s->tail_n[t]; /* the tail's chunk */
  const char *src = v->data;
  size_t left = v->n;
  while (left > 0) {
    size_t k = rows - s->tail_n[t];
    if (k > left) k = left;
    memcpy(s->tail[t] + s->tail_n[t] * elem, src, k * elem);
    s->tail_n[t] += k;
    src += k * elem;
    left -= k;
    probe_status st = chunk_write(s, t, first);
    if (st != PROBE_OK) return st;
    if (s->tail_n[t] == rows) {
      s->tail_n[t] = 0;
      first += (int64_t)rows;
    }
  }
  s->rows[t] += (int64_t)v->n;
  s->unflushed[t] += (int64_t)v->n;
  v->n = 0;
  return PROBE_OK;
}

/* Writes the buffered rows of table t with one H5Dwrite (or, for the
 * tables written chunk by chunk, with H5Dwrite_chunk). */
static probe_status table_write(probe_session *s, probe__table t) {
  pvec *v = &s->pend[t];
  if (v->n == 0) return PROBE_OK;
  if (s->direct[t]) return table_write_direct(s, t);
  hsize_t start[1] = {(hsize_t)s->rows[t]}, count[1] = {v->n};
  hsize_t size[1] = {start[0] + count[0]};
  if (H5Dset_extent(s->dset[t], size) < 0) return h5_fail(s, "H5Dset_extent");
  hid_t fs = H5Dget_space(s->dset[t]);
  hid_t ms = H5Screate_simple(1, count, NULL);
  herr_t e = -1;
  if (fs >= 0 && ms >= 0 &&
      H5Sselect_hyperslab(fs, H5S_SELECT_SET, start, NULL, count, NULL) >= 0)
    e = H5Dwrite(s->dset[t], s->mtype[t], ms, fs, H5P_DEFAULT, v->data);
  if (ms >= 0) H5Sclose(ms);
  if (fs >= 0) H5Sclose(fs);
  if (e < 0) return h5_fail(s, "H5Dwrite");
  s->rows[t] += (int64_t)v->n;
  s->unflushed[t] += (int64_t)v->n;
  v->n = 0;
  return PROBE_OK;
}

static probe_status state_write(probe_session *s, int complete) {
  int64_t st[PROBE__STATE_LEN] = {0};
  st[PROBE__S_COMPLETE] = complete;
  for (int t = 0; t < PROBE__T_COUNT; t++) st[PROBE__S_ROWS + t] = s->rows[t];
  st[PROBE__S_LAST_STEP] = s->w_last_step;
  st[PROBE__S_FIRST_NONFINITE] = s->w_first_nonfinite;
  st[PROBE__S_EVENTS] = s->w_n_events;
  st[PROBE__S_FLUSHES] = s->n_flushes;
  st[PROBE__S_RECORD_MODE] = s->opt.mode;
  if (H5Dwrite(s->state, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, st) <
      0)
    return h5_fail(s, "H5Dwrite(state)");
  return PROBE_OK;
}

/* Bytes the next flush may add to the file, at most: every row not yet
 * flushed, uncompressed, plus one rewritten chunk per table that grew (the
 * last, partly filled one) and room for metadata. */
static uint64_t flush_bound(const probe_session *s) {
  uint64_t b = 128 * 1024;
  for (int t = 0; t < PROBE__T_COUNT; t++) {
    uint64_t rows = s->pend[t].n + (uint64_t)s->unflushed[t];
    if (rows)
      b += (rows + probe__tables[t].chunk_rows) * probe__tables[t].mem_size;
  }
  return b;
}

/* Refuses to write when the file-size limit (RLIMIT_FSIZE) or the free
 * space of the file system could be exceeded, so that a full disk or a
 * limit stops the trace at its last flush instead of in the middle of
 * one. The error is sticky, and the file is detached (file_detach) so that
 * closing writes nothing more: it keeps its last flushed state. */
static probe_status space_check(probe_session *s) {
  uint64_t need = flush_bound(s);
  struct rlimit rl;
  if (getrlimit(RLIMIT_FSIZE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY) {
    hsize_t size = 0;
    haddr_t eoa = 0;
    if (H5Fget_filesize(s->file, &size) < 0 || H5Fget_eoa(s->file, &eoa) < 0)
      return h5_fail(s, "H5Fget_filesize");
    uint64_t end = size > eoa ? size : eoa;
    if (end + need > (uint64_t)rl.rlim_cur) {
      s->w_err = PROBE_ERR_NOSPACE;
      file_detach(s);
      return set_wmsg(s, s->w_err,
                     "file-size limit reached: trace at %llu bytes, limit "
                     "(RLIMIT_FSIZE) %llu bytes",
                     (unsigned long long)end, (unsigned long long)rl.rlim_cur);
    }
  }
  void *handle = NULL;
  struct statvfs vf;
  if (H5Fget_vfd_handle(s->file, H5P_DEFAULT, &handle) >= 0 && handle &&
      fstatvfs(*(int *)handle, &vf) == 0 &&
      (uint64_t)vf.f_bavail * vf.f_frsize < need) {
    s->w_err = PROBE_ERR_NOSPACE;
    file_detach(s);
    return set_wmsg(s, s->w_err, "no space left on the trace's file system");
  }
  H5Eclear2(H5E_DEFAULT);
  return PROBE_OK;
}

/* Everything buffered to disk, then the counts that make it visible. */
static probe_status flush_all(probe_session *s, int complete) {
  if (s->w_err != PROBE_OK) return s->w_err;
  probe_status st;
  if ((st = space_check(s)) != PROBE_OK) return st;
  for (int t = 0; t < PROBE__T_COUNT; t++)
    if ((st = table_write(s, (probe__table)t)) != PROBE_OK) return st;
  if (H5Fflush(s->file, H5F_SCOPE_LOCAL) < 0) return h5_fail(s, "H5Fflush");
  s->n_flushes++;
  if ((st = state_write(s, complete)) != PROBE_OK) return st;
  if (H5Dflush(s->state) < 0) return h5_fail(s, "H5Dflush(state)");
  s->t_last_flush = now_s();
  memset(s->unflushed, 0, sizeof s->unflushed);
  return PROBE_OK;
}

/* Writes the batches that are full: batch_rows rows of a table per H5Dwrite. */
static probe_status write_full_batches(probe_session *s) {
  for (int t = 0; t < PROBE__T_COUNT; t++) {
    if ((int64_t)s->pend[t].n < s->batch[t]) continue;
    probe_status st = space_check(s);
    if (st == PROBE_OK) st = table_write(s, (probe__table)t);
    if (st != PROBE_OK) return st;
  }
  return PROBE_OK;
}

/* Caller: hands rows of table t to the writer thread (appended to the
 * rows it has not taken yet, under the lock: one copy, no wake-up; the
 * counters and the wake-up follow in hand_over). */
static probe_status table_append(probe_session *s, probe__table t,
                                 const void *rows, size_t n) {
  pthread_mutex_lock(&s->mu);
  int rc = pvec_push(&s->in[t], rows, n);
  if (rc == 0) s->in_bytes += n * s->in[t].elem;
  pthread_mutex_unlock(&s->mu);
  if (rc < 0) return set_msg(s, PROBE_ERR_NOMEM, "out of memory buffering rows");
  s->appended[t] += (int64_t)n;
  return PROBE_OK;
}

/* Moves the rows of src behind those of dst; swaps when dst is empty, so
 * that steady-state hand-overs copy nothing. Returns -1 without memory. */
static int pvec_move(pvec *dst, pvec *src) {
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

/* ---- the writer thread ---------------------------------------------------- */

/* The sticky error of the writer thread, as the caller sees it. */
static probe_status writer_error(probe_session *s) {
  if (s->err == PROBE_OK &&
      atomic_load_explicit(&s->err_flag, memory_order_acquire)) {
    pthread_mutex_lock(&s->mu);
    s->err = s->sh_err;
    memcpy(s->msg, s->sh_msg, sizeof s->msg);
    pthread_mutex_unlock(&s->mu);
  }
  return s->err;
}

/* Under mu: publishes the writer thread's error. */
static void writer_error_publish(probe_session *s, probe_status st) {
  if (st == PROBE_OK || atomic_load(&s->err_flag)) return;
  s->sh_err = st;
  memcpy(s->sh_msg, s->w_msg, sizeof s->sh_msg);
  atomic_store_explicit(&s->err_flag, 1, memory_order_release);
}

static void deadline_ts(struct timespec *ts, double at) {
  double sec = floor(at);
  ts->tv_sec = (time_t)sec;
  ts->tv_nsec = (long)((at - sec) * 1e9);
  if (ts->tv_nsec >= 1000000000L) ts->tv_nsec = 999999999L;
}

static int writer_has_data(const probe_session *s) {
  for (int t = 0; t < PROBE__T_COUNT; t++)
    if (s->in[t].n || s->pend[t].n || s->unflushed[t]) return 1;
  return 0;
}

static probe_status file_create(probe_session *s);
static void session_close_handles(probe_session *s);

/* The writer thread: creates the file, then waits for rows and requests,
 * writes full batches, flushes on request and flush_seconds after the
 * first unflushed row, and at close flushes and closes the file. HDF5 is
 * called only here, outside mu, under the process-wide HDF5 lock. */
static void *writer_main(void *arg) {
  probe_session *s = arg;
  probe__h5_lock();
  probe_status st = file_create(s);
  probe__h5_unlock();
  pthread_mutex_lock(&s->mu);
  s->t_last_flush = now_s();
  /* Direct tables (create_layout) are written a few chunks at a time: each
   * chunk is one call anyway, and small hand-overs stay in cache. The
   * caller reads batch[] under mu. */
  for (int t = 0; t < PROBE__T_COUNT; t++) {
    int64_t four = 4 * (int64_t)probe__tables[t].chunk_rows;
    if (s->direct[t] && four < s->opt.batch_rows) s->batch[t] = four;
  }
  /* probe_session_open has returned already (the caller records while the
   * file is created); a failure here is the session's sticky error, which
   * the caller's next call returns, and nothing is written from now on. */
  if (st != PROBE_OK) {
    if (s->w_err == PROBE_OK) s->w_err = st;
    writer_error_publish(s, st);
  }
  pthread_cond_broadcast(&s->done);
  for (;;) {
    int closing = s->close_req;
    int want_flush = closing || s->flush_req > s->flush_done;
    int big = 0;
    for (int t = 0; t < PROBE__T_COUNT; t++)
      if ((int64_t)(s->in[t].n + s->pend[t].n) >= s->batch[t]) big = 1;
    int data = writer_has_data(s);
    double due = s->t_last_flush + s->opt.flush_seconds;
    int timer = data && now_s() >= due;
    if (s->w_err != PROBE_OK) big = timer = 0; /* nothing more is written */
    if (!want_flush && !big && !timer) {
      s->w_idle = !data || s->w_err != PROBE_OK;
      if (s->w_idle || s->opt.flush_seconds > 1e6) {
        pthread_cond_wait(&s->wake, &s->mu);
      } else {
        struct timespec ts;
        deadline_ts(&ts, due);
        pthread_cond_timedwait(&s->wake, &s->mu, &ts);
      }
      s->w_idle = 0;
      continue;
    }
    uint64_t ticket = s->flush_req;
    int oom = 0;
    for (int t = 0; t < PROBE__T_COUNT; t++)
      if (pvec_move(&s->pend[t], &s->in[t]) < 0) oom = 1;
    s->in_bytes = 0;
    s->w_last_step = s->sh_last_step;
    s->w_first_nonfinite = s->sh_first_nonfinite;
    s->w_n_events = s->sh_n_events;
    int final_flush = s->close_flush;
    pthread_cond_broadcast(&s->done); /* room for a waiting caller */
    pthread_mutex_unlock(&s->mu);

    st = s->w_err;
    if (oom && st == PROBE_OK)
      st = s->w_err = set_wmsg(s, PROBE_ERR_NOMEM, "out of memory buffering rows");
    if (st == PROBE_OK && (!closing || final_flush)) {
      probe__h5_lock();
      st = want_flush || timer ? flush_all(s, closing) : write_full_batches(s);
      probe__h5_unlock();
    }
    if (s->w_err != PROBE_OK) /* rows that cannot be written any more */
      for (int t = 0; t < PROBE__T_COUNT; t++) {
        s->pend[t].n = 0;
        s->unflushed[t] = 0;
      }

    pthread_mutex_lock(&s->mu);
    writer_error_publish(s, st);
    if (want_flush) s->flush_done = ticket;
    pthread_cond_broadcast(&s->done);
    if (closing) break;
  }
  pthread_mutex_unlock(&s->mu);
  probe__h5_lock();
  session_close_handles(s);
  probe__h5_unlock();
  return NULL;
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
  int big = 0;
  for (int t = 0; t < PROBE__T_COUNT; t++)
    if ((int64_t)s->in[t].n >= s->batch[t]) big = 1;
  s->sh_last_step = s->last_step;
  s->sh_first_nonfinite = s->first_nonfinite;
  s->sh_n_events = s->n_events;
  uint64_t ticket = 0;
  if (how != HAND_ROWS) ticket = ++s->flush_req;
  if (how != HAND_ROWS || big || s->w_idle) pthread_cond_signal(&s->wake);
  /* Wait for a requested flush, or for room when the writer is behind. */
  while (!atomic_load(&s->err_flag) &&
         ((sync && s->flush_done < ticket) || s->in_bytes > WAIT_BYTES)) {
    pthread_cond_signal(&s->wake);
    pthread_cond_wait(&s->done, &s->mu);
  }
  pthread_mutex_unlock(&s->mu);
  if (how != HAND_ROWS) s->steps_since_flush = 0;
  return writer_error(s);
}

/* ---- session -------------------------------------------------------------- */

static void session_free(probe_session *s) {
  if (s == NULL) return;
  for (int t = 0; t < PROBE__T_COUNT; t++) {
    free(s->pend[t].data);
    free(s->in[t].data);
    free(s->stage[t].data);
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
  free(s->layer_select);
  free(s->path);
  for (int i = 0; i < 3; i++) free(s->own_strings[i]);
  pthread_mutex_destroy(&s->mu);
  pthread_cond_destroy(&s->wake);
  pthread_cond_destroy(&s->done);
  free(s);
}

/* Closes every HDF5 handle; errors are ignored (the file may be unwritable). */
static void session_close_handles(probe_session *s) {
  H5E_BEGIN_TRY {
    for (int t = 0; t < PROBE__T_COUNT; t++) {
      if (s->dset[t] >= 0) H5Dclose(s->dset[t]);
      if (s->mtype[t] >= 0) H5Tclose(s->mtype[t]);
      s->dset[t] = s->mtype[t] = H5I_INVALID_HID;
    }
    if (s->state >= 0) H5Dclose(s->state);
    if (s->file >= 0) H5Fclose(s->file);
  }
  H5E_END_TRY;
  s->state = s->file = H5I_INVALID_HID;
}

/* A file-size limit would kill the host with SIGXFSZ at the first write
 * past it; ignored, the write fails with EFBIG and we report it. Only the
 * default action is replaced: a handler the host installed is kept. */
static void sigxfsz_ignore(void) {
  struct sigaction old;
  if (sigaction(SIGXFSZ, NULL, &old) == 0 && !(old.sa_flags & SA_SIGINFO) &&
      old.sa_handler == SIG_DFL) {
    struct sigaction ign;
    memset(&ign, 0, sizeof ign);
    ign.sa_handler = SIG_IGN;
    sigemptyset(&ign.sa_mask);
    sigaction(SIGXFSZ, &ign, NULL);
  }
}

/* Writer thread, at its start: creates the file, its attributes and
 * tables, and enters SWMR mode. */
static probe_status file_create(probe_session *s) {
  H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
  hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
  if (fapl < 0 ||
      H5Pset_libver_bounds(fapl, H5F_LIBVER_LATEST, H5F_LIBVER_LATEST) < 0) {
    if (fapl >= 0) H5Pclose(fapl);
    return h5_fail(s, "H5Pset_libver_bounds");
  }
  errno = 0;
  s->file = H5Fcreate(s->path, H5F_ACC_TRUNC, H5P_DEFAULT, fapl);
  H5Pclose(fapl);
  if (s->file < 0) {
    int e = errno;
    h5_fail(s, "H5Fcreate");
    if (s->w_err == PROBE_ERR_HDF5 && e != 0) s->w_err = PROBE_ERR_IO;
    return set_wmsg(s, s->w_err, "cannot create trace '%s': %s", s->path,
                    s->w_err == PROBE_ERR_HDF5 ? "HDF5 error" : strerror(e));
  }
  if (write_root_attrs(s) < 0) return h5_fail(s, "writing root attributes");
  if (create_layout(s) < 0) return h5_fail(s, "creating tables");
  probe_status st = state_write(s, 0);
  if (st != PROBE_OK) return st;
  if (H5Fstart_swmr_write(s->file) < 0)
    return h5_fail(s, "H5Fstart_swmr_write");
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

probe_status probe_session_open(probe_session **out, const char *path,
                                const probe_options *opt) {
  if (out == NULL) return PROBE_ERR_INVALID_ARG;
  *out = NULL;
  if (path == NULL || *path == '\0') return PROBE_ERR_INVALID_ARG;
  probe_options o;
  if (opt) o = *opt;
  else probe_options_init(&o);
  if ((o.mode != PROBE_MODE_SCALARS && o.mode != PROBE_MODE_FULL) ||
      o.step_every < 1 || o.step_start < 0 || o.ring_steps < 0 ||
      o.flush_seconds < 0 || o.flush_steps < 0 || o.max_events < 0 ||
      o.batch_rows < 1)
    return PROBE_ERR_CONFIG;

  probe_session *s = calloc(1, sizeof *s);
  if (s == NULL) return PROBE_ERR_NOMEM;
  if (session_sync_init(s) < 0) {
    free(s);
    return PROBE_ERR_NOMEM;
  }
  s->opt = o;
  s->file = s->state = H5I_INVALID_HID;
  for (int t = 0; t < PROBE__T_COUNT; t++) {
    s->dset[t] = s->mtype[t] = H5I_INVALID_HID;
    s->pend[t].elem = s->in[t].elem = s->stage[t].elem =
        probe__tables[t].mem_size;
    s->batch[t] = o.batch_rows; /* the writer may lower it (writer_main) */
  }
  s->last_step = s->w_last_step = -1;
  s->first_nonfinite = s->w_first_nonfinite = -1;
  s->nf_rec_step = -1;
  if (o.layer_select && (s->layer_select = strdup(o.layer_select)) == NULL)
    goto nomem;
  s->opt.layer_select = s->layer_select;
  if ((s->path = strdup(path)) == NULL) goto nomem;
  /* command_line / config_json / precision_policy are written by the writer
   * thread, after this function has returned: it reads copies. */
  const char **strs[3] = {&s->opt.command_line, &s->opt.config_json,
                          &s->opt.precision_policy};
  for (int i = 0; i < 3; i++)
    if (*strs[i] && (*strs[i] = s->own_strings[i] = strdup(*strs[i])) == NULL)
      goto nomem;
  if (o.ring_steps > 0 &&
      (s->ring = calloc((size_t)o.ring_steps, sizeof *s->ring)) == NULL)
    goto nomem;

  /* Creating the HDF5 file and its tables takes milliseconds (2.5 ms on the
   * project machine, as long as 12 steps of the default scenario); the
   * writer thread does it while the caller goes on. What usually goes wrong
   * - a directory that does not exist, no permission, a read-only file
   * system - is found here first, by opening the file for writing (created
   * if missing; not truncated here: truncating a large old trace takes as
   * long again, and H5Fcreate does it), so that open still fails with that
   * error. A later failure of HDF5 itself (a disk that fills while the
   * tables are created, say) is the session's sticky error, returned by the
   * next call. */
  int fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0666);
  if (fd < 0) {
    int e = errno;
    snprintf(open_msg, sizeof open_msg, "cannot create trace '%s': %s", path, strerror(e));
    session_free(s);
    return e == ENOSPC || e == EDQUOT || e == EFBIG ? PROBE_ERR_NOSPACE : PROBE_ERR_IO;
  }
  close(fd);

  sigxfsz_ignore();
  if (pthread_create(&s->thread, NULL, writer_main, s) != 0) {
    snprintf(open_msg, sizeof open_msg, "cannot start the writer thread");
    session_free(s);
    return PROBE_ERR_NOMEM;
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
  return PROBE_ERR_NOMEM;
}

const char *probe_session_last_error(const probe_session *s) {
  if (s == NULL) return open_msg[0] ? open_msg : "no error";
  return s->msg[0] ? s->msg : "no error";
}

probe_status probe_layer_register(probe_session *s, const char *name,
                                  probe_kind kind, probe_precision prec,
                                  int32_t *layer_id) {
  if (s == NULL || name == NULL) return PROBE_ERR_INVALID_ARG;
  if (writer_error(s) != PROBE_OK) return s->err;
  size_t len = strlen(name);
  if (len == 0 || len >= PROBE_NAME_MAX)
    return set_msg(s, PROBE_ERR_INVALID_ARG,
                   "layer name '%.80s' is empty or longer than %d bytes", name,
                   PROBE_NAME_MAX - 1);
  if ((int)kind < 0 || kind >= PROBE_KIND_COUNT || (int)prec < 0 ||
      (int)prec > PROBE_PREC_BF16)
    return set_msg(s, PROBE_ERR_INVALID_ARG, "layer '%s': bad kind/precision",
                   name);
  for (int32_t i = 0; i < s->n_layers; i++)
    if (strcmp(s->layers[i].name, name) == 0)
      return set_msg(s, PROBE_ERR_INVALID_ARG, "layer '%s' registered twice",
                     name);
  if (s->n_layers == INT32_MAX / 2) return PROBE_ERR_INVALID_ARG;
  if (s->n_layers == s->cap_layers) {
    int32_t cap = s->cap_layers ? s->cap_layers * 2 : 32;
    probe_layer_info *l = realloc(s->layers, (size_t)cap * sizeof *l);
    if (l == NULL) return PROBE_ERR_NOMEM;
    s->layers = l;
    uint8_t *sel = realloc(s->selected, (size_t)cap);
    if (sel == NULL) return PROBE_ERR_NOMEM;
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
  if (layer_id) *layer_id = s->n_layers;
  s->n_layers++;
  return PROBE_OK;
}

probe_status probe_step_begin(probe_session *s, int64_t step) {
  if (s == NULL || step < 0) return PROBE_ERR_INVALID_ARG;
  if (writer_error(s) != PROBE_OK) return s->err;
  if (s->in_step)
    return set_msg(s, PROBE_ERR_STATE, "step %lld begun inside step %lld",
                   (long long)step, (long long)s->step);
  if (step <= s->last_step)
    return set_msg(s, PROBE_ERR_STATE, "step %lld after step %lld",
                   (long long)step, (long long)s->last_step);
  s->in_step = 1;
  s->step = step;
  s->n_cur = 0;
  s->have_scalars = 0;
  s->cuda_pending = 0;
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
      return set_msg(s, PROBE_ERR_CUDA, "CUDA statistics failed");
    s->cuda_pending = 0;
  }
  size_t cap = s->cap_cur ? s->cap_cur * 2 : 64;
  probe_record *r = realloc(s->cur, cap * sizeof *r);
  if (r == NULL) return PROBE_ERR_NOMEM;
  s->cur = r;
  tensor_ref *f = realloc(s->ref, cap * sizeof *f);
  if (f == NULL) return PROBE_ERR_NOMEM;
  s->ref = f;
  uint8_t *a = realloc(s->repeat, cap);
  if (a == NULL) return PROBE_ERR_NOMEM;
  s->repeat = a;
  uint8_t *b = realloc(s->repeat_next, cap);
  if (b == NULL) return PROBE_ERR_NOMEM;
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
  if (!s->step_recorded || !s->selected[layer]) return PROBE_OK;
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
      return set_msg(s, PROBE_ERR_CUDA, "cannot create CUDA statistics");
    probe_cuda_tensor ct = {data, n, dtype};
    if (probe_cuda_stats_enqueue(s->cuda, &ct, 1, &r->stats) != PROBE_OK)
      return set_msg(s, PROBE_ERR_CUDA, "CUDA statistics enqueue failed");
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

probe_status probe_step_set_scalars(probe_session *s,
                                    const probe_step_scalars *sc) {
  if (s == NULL || sc == NULL) return PROBE_ERR_INVALID_ARG;
  if (writer_error(s) != PROBE_OK) return s->err;
  if (!s->in_step)
    return set_msg(s, PROBE_ERR_STATE, "probe_step_set_scalars outside a step");
  s->sc = *sc;
  s->sc.step = s->step;
  s->have_scalars = 1;
  return PROBE_OK;
}

probe_status probe_scaler_transition(probe_session *s,
                                     const probe_scaler_event *ev) {
  if (s == NULL || ev == NULL) return PROBE_ERR_INVALID_ARG;
  if (writer_error(s) != PROBE_OK) return s->err;
  if (ev->kind < PROBE_SCALER_BACKOFF || ev->kind > PROBE_SCALER_MIN_CLAMP)
    return set_msg(s, PROBE_ERR_INVALID_ARG, "scaler event kind %d",
                   (int)ev->kind);
  probe_scaler_event e = *ev;
  if (s->in_step) e.step = s->step;
  return table_append(s, PROBE__T_SCALER, &e, 1);
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
      if ((raw = malloc(n * esz)) == NULL) return PROBE_ERR_NOMEM;
      if (probe__gpu_copy_to_host(raw, f->data, n * esz) != PROBE_OK) {
        free(raw);
        return set_msg(s, PROBE_ERR_CUDA, "snapshot copy from the device");
      }
      src = raw;
    }
    pvec *v = &s->stage[PROBE__T_SNAPDATA];
    v->n = 0;
    if (pvec_reserve(v, n) < 0) {
      free(raw);
      return PROBE_ERR_NOMEM;
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

static probe_status ring_push(probe_session *s) {
  if (s->opt.ring_steps == 0) return PROBE_OK;
  ring_slot *slot = &s->ring[s->ring_head];
  if (slot->cap < s->n_cur) {
    probe_record *r = realloc(slot->recs, s->n_cur * sizeof *r);
    if (r == NULL) return PROBE_ERR_NOMEM;
    slot->recs = r;
    slot->cap = s->n_cur;
  }
  if (s->n_cur) memcpy(slot->recs, s->cur, s->n_cur * sizeof *s->cur);
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

/* Ends the current step; allow_snapshot is 0 when the tensors may be gone
 * (a session closed in the middle of a step). */
static probe_status step_finish(probe_session *s, int allow_snapshot) {
  probe_status st;
  s->in_step = 0;
  if (s->cuda_pending) {
    s->cuda_pending = 0;
    if (probe_cuda_stats_wait(s->cuda) != PROBE_OK)
      return set_msg(s, PROBE_ERR_CUDA, "CUDA statistics failed");
  }
  /* The step's first non-finite record, in execution order, and whether
   * any non-finite record is not a gradient. */
  size_t first = s->n_cur;
  int bad_value = 0;
  for (size_t i = 0; i < s->n_cur; i++)
    if (probe_stats_nonfinite(&s->cur[i].stats) > 0) {
      if (first == s->n_cur) first = i;
      if (probe_site_phase((probe_site)s->cur[i].site) != PROBE_PHASE_BACKWARD) {
        bad_value = 1;
        break;
      }
    }
  int loss_bad = s->have_scalars && !isfinite(s->sc.loss);
  bad_value |= loss_bad;
  int nonfinite = first < s->n_cur || loss_bad;
  /* An event: a non-finite step not within ring_steps steps of the last
   * event (acted on or not). */
  int event = nonfinite && s->quiet_remaining == 0;
  int act = event && s->n_events < s->opt.max_events;
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
    if (s->step_recorded && s->n_cur &&
        (st = table_append(s, PROBE__T_RECORDS, s->cur, s->n_cur)) != PROBE_OK)
      return st;
  } else if (act) {
    if ((st = ring_dump(s)) != PROBE_OK) return st;
    if (s->n_cur &&
        (st = table_append(s, PROBE__T_RECORDS, s->cur, s->n_cur)) != PROBE_OK)
      return st;
    s->post_remaining = s->opt.ring_steps;
  } else if (s->post_remaining > 0) {
    if (s->n_cur &&
        (st = table_append(s, PROBE__T_RECORDS, s->cur, s->n_cur)) != PROBE_OK)
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

probe_status probe_session_flush(probe_session *s) {
  if (s == NULL) return PROBE_ERR_INVALID_ARG;
  if (writer_error(s) != PROBE_OK) return s->err;
  return hand_over(s, HAND_FLUSH_SYNC);
}

probe_status probe_session_close(probe_session *s) {
  if (s == NULL) return PROBE_ERR_INVALID_ARG;
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
  s->sh_last_step = s->last_step;
  s->sh_first_nonfinite = s->first_nonfinite;
  s->sh_n_events = s->n_events;
  s->close_req = 1;
  s->close_flush = st == PROBE_OK;
  pthread_cond_signal(&s->wake);
  pthread_mutex_unlock(&s->mu);
  pthread_join(s->thread, NULL);
  s->err = PROBE_OK;
  probe_status wst = writer_error(s);
  if (st == PROBE_OK) st = wst;
  if (s->cuda) probe_cuda_stats_destroy(s->cuda);
  session_free(s);
  return st;
}

void probe_range_push(probe_session *s, int32_t layer, probe_site site) {
  if (s == NULL) return;
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
  if (s == NULL) return;
#ifdef AMPPROBE_HAVE_CUDA
  probe__nvtx_pop();
  if (s->cupti) probe__cupti_pop(s->cupti);
#endif
}
