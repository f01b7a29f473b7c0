/*
 * writer.c - the writer thread of a probe session: the HDF5 file, its
 * layout and its flushes (layout: format.c, docs/trace-format.md). The
 * caller's side - statistics, events, the flight recorder, the hand-over
 * of rows - is session.c; session.h is the struct they share.
 *
 * Crash safety: every dataset is created when the session opens, then the
 * file enters SWMR mode (H5Fstart_swmr_write) and only appends rows after
 * that. Rows are buffered in memory and written many per H5Dwrite. A flush
 * (every flush_seconds / flush_steps, at each of the first max_events
 * non-finite events, at close) writes every buffered row, H5Fflush-es the
 * file, and only then overwrites the row counts in /meta/state and flushes
 * that dataset: a reader trusts those counts, so whatever a killed writer
 * left, the rows it counts were on disk before the counts were.
 *
 * Threads: only this thread calls HDF5 for the session, from creating the
 * file to closing it (HDF5 is the serial build; all of libprobe's HDF5
 * calls also hold the process-wide probe__h5_lock). It takes the rows the
 * caller handed over (buffers are swapped, not copied), batches them into
 * H5Dwrite calls of batch_rows rows, compresses the per-step tables itself
 * (deflate.c), and flushes on its own timer (flush_seconds after the first
 * unflushed row, even while the caller is busy elsewhere) and when the
 * caller asks. Its I/O errors are sticky: it publishes them under mu, the
 * caller returns them from its next call, and nothing more is written.
 *
 * Write failures: a failed write (full disk, file-size limit, /dev/full)
 * must not leave HDF5 with a file it will try to finish writing later -
 * at close, or at exit from its atexit handler, where a failing close of
 * a half-written file crashed the host (SIGSEGV in H5F__close_cb). The file
 * is detached (its descriptor pointed at /dev/null) and closed with
 * H5F_CLOSE_STRONG semantics inside the library, and HDF5's automatic
 * error printing is off: the error is one line in the session's message.
 */
#define _GNU_SOURCE /* memfd_create */
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
#include <sys/mman.h>
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
#include "session.h"



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
 * reached the disk. So the descriptor under HDF5 is replaced by a sink and
 * the file keeps its last flushed state, still marked as an SWMR file that
 * readers open as it is.
 *
 * The sink must take every write and truncate that closing the file does:
 * HDF5 1.10 frees a file whose H5Fclose fails but keeps its id, and its
 * atexit handler (H5_term_library -> H5F__close_cb) then crashes on that id
 * (SIGSEGV at exit after a failed write, issue 17.1). /dev/null cannot be
 * truncated (EINVAL, which fails the close), so the sink is an anonymous
 * memory file (memfd): writes and ftruncate succeed, reads of what was not
 * written since return zeros, and what HDF5 writes while closing - a few
 * KiB of metadata - is dropped with it. Without memfd_create, /dev/null
 * opened read-write is the fallback. */
static void file_detach(probe_session *s) {
  if (s->file < 0 || s->detached) return;
  int fd = probe__h5_fd(s->file);
  if (fd < 0) return;
  if (probe__fd_to_sink(fd, "ampprobe-detached-trace") == 0) s->detached = 1;
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
  probe__h5_failed_call(); /* HDF5 may have leaked: no H5close at exit */
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

/* The abort mark's attributes, created with the others (an SWMR writer
 * cannot add attributes later, but may rewrite one in place): `aborted`, a
 * fixed-size string of PROBE_ABORT_REASON_MAX bytes, "" until a close
 * after probe_session_mark_aborted writes the reason; `aborted_step`,
 * 64-bit, -1 until then. */
static int attr_aborted(hid_t f, const char *reason, int64_t step,
                        int create) {
  char buf[PROBE_ABORT_REASON_MAX] = {0};
  snprintf(buf, sizeof buf, "%s", reason);
  hid_t t = H5Tcopy(H5T_C_S1), sp = H5Screate(H5S_SCALAR), a = -1, b = -1;
  int rc = -1;
  if (t < 0 || sp < 0 || H5Tset_size(t, sizeof buf) < 0 ||
      H5Tset_strpad(t, H5T_STR_NULLTERM) < 0 ||
      H5Tset_cset(t, H5T_CSET_UTF8) < 0)
    goto done;
  a = create ? H5Acreate2(f, "aborted", t, sp, H5P_DEFAULT, H5P_DEFAULT)
             : H5Aopen(f, "aborted", H5P_DEFAULT);
  b = create ? H5Acreate2(f, "aborted_step", H5T_STD_I64LE, sp, H5P_DEFAULT,
                          H5P_DEFAULT)
             : H5Aopen(f, "aborted_step", H5P_DEFAULT);
  if (a >= 0 && b >= 0 && H5Awrite(a, t, buf) >= 0 &&
      H5Awrite(b, H5T_NATIVE_INT64, &step) >= 0)
    rc = 0;
done:
  if (a >= 0) H5Aclose(a);
  if (b >= 0) H5Aclose(b);
  if (sp >= 0) H5Sclose(sp);
  if (t >= 0) H5Tclose(t);
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
      attr_i32(f, "hist_bins", PROBE_HIST_BINS) < 0 ||
      attr_i32(f, "rank", s->opt.rank) < 0 ||
      attr_i32(f, "world_size", s->opt.world_size) < 0 ||
      attr_str(f, "run_id", s->opt.run_id) < 0 ||
      attr_aborted(f, "", -1, 1) < 0)
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

/* Room kept for metadata beyond the rows of a flush (and for closing). */
#define FLUSH_MARGIN ((uint64_t)128 << 10)

/* Room kept for the metadata of the commit at the file-size limit
 * (limit_commit), beyond the chunks it writes. */
#define COMMIT_MARGIN ((uint64_t)32 << 10)

/* The smallest file-size limit (RLIMIT_FSIZE) a trace is started under:
 * creating the file and its tables takes about 12 KiB, and the first flush
 * keeps FLUSH_MARGIN free besides its rows. */
#define MIN_FSIZE_LIMIT ((uint64_t)256 << 10)

static probe_status space_check_need(probe_session *s, uint64_t need);

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
  probe_status st = space_check_need(
      s, (uint64_t)len + (s->committing ? COMMIT_MARGIN : FLUSH_MARGIN));
  if (st != PROBE_OK) return st;
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
  /* A write of this table that failed half-way left its tail chunk's
   * buffer ahead of what is counted: it is not written again (the rows
   * counted so far are on disk; the session has stopped anyway). */
  if (s->tail_bad[t]) return PROBE_ERR_NOSPACE;
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
    s->writing = (int)t; /* limit_commit leaves this table alone */
    probe_status st = chunk_write(s, t, first);
    s->writing = -1;
    if (st != PROBE_OK) {
      s->tail_bad[t] = 1;
      return st;
    }
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
  st[PROBE__S_FEATURES] = PROBE__FEAT_CHECK;
  st[PROBE__S_JOINED] = s->w_joined;
  st[PROBE__S_CHECK] = probe__state_check(st);
  if (H5Dwrite(s->state, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, st) <
      0)
    return h5_fail(s, "H5Dwrite(state)");
  return PROBE_OK;
}

/* Bytes the next flush may add to the file, at most: every row not yet
 * flushed, uncompressed, plus one rewritten chunk per table that grew (the
 * last, partly filled one) and room for metadata. The tables written chunk
 * by chunk (direct) are not counted: chunk_write checks each encoded chunk
 * itself, exactly (their rows compress about 13 times, and counting them
 * uncompressed refused a 1 MiB limit before its first flush). */
static uint64_t flush_bound(const probe_session *s) {
  uint64_t b = FLUSH_MARGIN;
  for (int t = 0; t < PROBE__T_COUNT; t++) {
    if (s->direct[t]) continue;
    uint64_t rows = s->pend[t].n + (uint64_t)s->unflushed[t];
    if (rows)
      b += (rows + probe__tables[t].chunk_rows) * probe__tables[t].mem_size;
  }
  return b;
}

/* Refuses to write when the file-size limit (RLIMIT_FSIZE) or the free
 * space of the file system could be exceeded, so that a full disk or a
 * limit stops the trace at its last flush instead of in the middle of
 * one. The error is sticky, and nothing more is written but what closing
 * the file needs. Under the file-size limit that is room the last check
 * left: each check that passed kept need (>= FLUSH_MARGIN of metadata)
 * free beyond the rows it let through, so the file closes normally and
 * with valid metadata. A file system short of space may have none left,
 * so there the file is detached first (file_detach). */
/* H5Fflush, then the counts of the rows written so far: the second half
 * of a flush (flush_all), for rows already written. */
static probe_status flush_commit(probe_session *s, int complete) {
  probe_status st;
  if (H5Fflush(s->file, H5F_SCOPE_LOCAL) < 0) return h5_fail(s, "H5Fflush");
  s->n_flushes++;
  if ((st = state_write(s, complete)) != PROBE_OK) return st;
  if (H5Dflush(s->state) < 0) return h5_fail(s, "H5Dflush(state)");
  return PROBE_OK;
}

static probe_status table_write(probe_session *s, probe__table t);

/* At the file-size limit or on a full disk, what can still be made durable
 * is, in the room the last check kept (FLUSH_MARGIN): the pending layers, step scalars and
 * scaler events (each checked against COMMIT_MARGIN), then the counts of
 * every row written so far - so the trace ends at its last written row, not at
 * its last timed flush (in a fast full-trace run that was the difference
 * between 10 and 300 steps under `ulimit -f 1000`). */
static probe_status limit_commit(probe_session *s) {
  /* The layers first: committed records name them. Then the steps and
   * scaler events; a table that does not fit is left out. */
  static const probe__table small[] = {PROBE__T_LAYERS, PROBE__T_STEPS,
                                       PROBE__T_SCALER};
  s->committing = 1;
  for (size_t i = 0; i < sizeof small / sizeof small[0]; i++) {
    probe__table t = small[i];
    if ((int)t == s->writing) continue; /* its chunk is half written */
    uint64_t bytes = (s->pend[t].n + probe__tables[t].chunk_rows) *
                     probe__tables[t].mem_size;
    if (s->pend[t].n == 0 ||
        (!s->direct[t] &&
         space_check_need(s, bytes + COMMIT_MARGIN) != PROBE_OK))
      continue; /* direct tables check each chunk themselves */
    table_write(s, t); /* a refused chunk leaves its rows out */
  }
  probe_status st = s->w_err == PROBE_OK ? flush_commit(s, 0) : s->w_err;
  s->committing = 0;
  return st;
}

static probe_status space_check_need(probe_session *s, uint64_t need) {
  struct rlimit rl;
  if (getrlimit(RLIMIT_FSIZE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY) {
    hsize_t size = 0;
    haddr_t eoa = 0;
    if (H5Fget_filesize(s->file, &size) < 0 || H5Fget_eoa(s->file, &eoa) < 0)
      return h5_fail(s, "H5Fget_filesize");
    uint64_t end = size > eoa ? size : eoa;
    if (end + need > (uint64_t)rl.rlim_cur) {
      if (s->committing) return PROBE_ERR_NOSPACE; /* see limit_commit */
      if (limit_commit(s) != PROBE_OK) return s->w_err;
      s->w_err = PROBE_ERR_NOSPACE;
      return set_wmsg(s, s->w_err,
                     "%s: file-size limit reached: trace at %llu bytes, "
                     "limit (RLIMIT_FSIZE) %llu bytes",
                     strerror(EFBIG), (unsigned long long)end,
                     (unsigned long long)rl.rlim_cur);
    }
  }
  void *handle = NULL;
  struct statvfs vf;
  if (H5Fget_vfd_handle(s->file, H5P_DEFAULT, &handle) >= 0 && handle &&
      fstatvfs(*(int *)handle, &vf) == 0 &&
      (uint64_t)vf.f_bavail * vf.f_frsize < need) {
    if (s->committing) return PROBE_ERR_NOSPACE; /* see limit_commit */
    /* what fits in the room the check kept is committed first, as at the
     * file-size limit: the rows written so far, the layers, steps and
     * scaler events pending (a full disk lost everything since the last
     * timed flush: within the first second, even the layers) */
    if (limit_commit(s) != PROBE_OK && s->w_err != PROBE_OK) {
      file_detach(s);
      return s->w_err;
    }
    s->w_err = PROBE_ERR_NOSPACE;
    file_detach(s);
    return set_wmsg(s, s->w_err,
                    "%s: %llu bytes free on the trace's file system, the "
                    "next flush may need %llu",
                    strerror(ENOSPC),
                    (unsigned long long)vf.f_bavail * vf.f_frsize,
                    (unsigned long long)need);
  }
  H5Eclear2(H5E_DEFAULT);
  return PROBE_OK;
}

static probe_status space_check(probe_session *s) {
  return space_check_need(s, flush_bound(s));
}

/* Everything buffered to disk, then the counts that make it visible. */
static probe_status flush_all(probe_session *s, int complete) {
  if (s->w_err != PROBE_OK) return s->w_err;
  probe_status st;
  if ((st = space_check(s)) != PROBE_OK) return st;
  for (int t = 0; t < PROBE__T_COUNT; t++)
    if ((st = table_write(s, (probe__table)t)) != PROBE_OK) return st;
  if ((st = flush_commit(s, complete)) != PROBE_OK) return st;
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

/* ---- the writer thread ---------------------------------------------------- */

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
    if (s->in[t].rows || s->pend[t].n || s->unflushed[t]) return 1;
  return 0;
}

static probe_status file_create(probe_session *s);
static void session_close_handles(probe_session *s);


/* The writer thread: creates the file, then waits for rows and requests,
 * writes full batches, flushes on request and flush_seconds after the
 * first unflushed row, and at close flushes and closes the file. HDF5 is
 * called only here, outside mu, under the process-wide HDF5 lock. */
void *probe__writer_main(void *arg) {
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
      if ((int64_t)(s->in[t].rows + s->pend[t].n) >= s->batch[t]) big = 1;
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
    for (int t = 0; t < PROBE__T_COUNT; t++) { /* the buffers, not the rows */
      s->taken[t] = s->in[t];
      s->in[t].n = 0;
      s->in[t].rows = 0;
    }
    s->in_bytes = 0;
    s->w_last_step = s->sh_last_step;
    s->w_first_nonfinite = s->sh_first_nonfinite;
    s->w_n_events = s->sh_n_events;
    s->w_joined = s->sh_joined;
    int final_flush = s->close_flush;
    pthread_cond_broadcast(&s->done); /* room for a waiting caller */
    pthread_mutex_unlock(&s->mu);

    int oom = 0; /* the rows taken behind those still to write */
    for (int t = 0; t < PROBE__T_COUNT; t++)
      for (int i = 0; i < s->taken[t].n; i++)
        if (pvec_move(&s->pend[t], &s->taken[t].v[i]) < 0) oom = 1;
    st = s->w_err;
    if (oom && st == PROBE_OK)
      st = s->w_err = set_wmsg(s, PROBE_ERR_NOMEM, "out of memory buffering rows");
    if (st == PROBE_OK && (!closing || final_flush)) {
      /* An aborted job's close commits every row with complete 0, then
       * the reason: killed in between, the trace reads as not closed */
      int aborted = closing && s->aborted[0];
      probe__h5_lock();
      st = want_flush || timer ? flush_all(s, closing && !aborted)
                               : write_full_batches(s);
      if (st == PROBE_OK && aborted) {
        if (attr_aborted(s->file, s->aborted, s->aborted_step, 0) < 0)
          st = h5_fail(s, "writing the abort mark");
        else if (H5Fflush(s->file, H5F_SCOPE_LOCAL) < 0)
          st = h5_fail(s, "H5Fflush");
      }
      probe__h5_unlock();
    }
    if (s->w_err != PROBE_OK) /* rows that cannot be written any more */
      for (int t = 0; t < PROBE__T_COUNT; t++) {
        s->pend[t].n = 0;
        s->unflushed[t] = 0;
      }

    pthread_mutex_lock(&s->mu);
    for (int t = 0; t < PROBE__T_COUNT; t++)
      pq_give_back(&s->taken[t], s->spare[t], &s->n_spare[t]);
    writer_error_publish(s, st);
    if (want_flush) s->flush_done = ticket;
    pthread_cond_broadcast(&s->done);
    if (closing) break;
  }
  pthread_mutex_unlock(&s->mu);
  probe__h5_lock();
  session_close_handles(s);
  probe__h5_unlock();
  pthread_mutex_lock(&s->mu);
  writer_error_publish(s, s->w_err);
  pthread_mutex_unlock(&s->mu);
  return NULL;
}

/* Closes every HDF5 handle. A close that fails is the session's error if
 * it had none. HDF5 1.10 cannot recover from a failed H5Fclose: it frees
 * the file but keeps its id, and a flush that failed once (a full disk)
 * leaves its metadata cache unable to flush again ("slist already
 * enabled"), so the close of such a file always fails. The checks before
 * every write (space_check, file_create) keep that from happening in the
 * cases we can foresee; when it happens anyway, probe__h5_close_failed
 * keeps HDF5's clean-up at exit away from the freed file (format.c). */
static void session_close_handles(probe_session *s) {
  int bad = 0;
  H5E_BEGIN_TRY {
    for (int t = 0; t < PROBE__T_COUNT; t++) {
      if (s->dset[t] >= 0 && H5Dclose(s->dset[t]) < 0) bad = 1;
      if (s->mtype[t] >= 0) H5Tclose(s->mtype[t]);
      s->dset[t] = s->mtype[t] = H5I_INVALID_HID;
    }
    if (s->state >= 0 && H5Dclose(s->state) < 0) bad = 1;
    if (s->file >= 0) probe__h5_disown_fd(probe__h5_fd(s->file));
    if (s->file >= 0 && H5Fclose(s->file) < 0) {
      bad = 1;
      probe__h5_close_failed();
    }
  }
  H5E_END_TRY;
  H5Eclear2(H5E_DEFAULT);
  s->state = s->file = H5I_INVALID_HID;
  if (bad && s->w_err == PROBE_OK)
    s->w_err = set_wmsg(s, PROBE_ERR_IO, "closing the trace failed");
}

/* Writer thread, at its start: creates the file, its attributes and
 * tables, and enters SWMR mode. */
static probe_status file_create(probe_session *s) {
  hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
  if (fapl < 0 ||
      H5Pset_libver_bounds(fapl, H5F_LIBVER_LATEST, H5F_LIBVER_LATEST) < 0) {
    if (fapl >= 0) H5Pclose(fapl);
    return h5_fail(s, "H5Pset_libver_bounds");
  }
  struct rlimit rl;
  if (getrlimit(RLIMIT_FSIZE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY &&
      (uint64_t)rl.rlim_cur < MIN_FSIZE_LIMIT) {
    H5Pclose(fapl);
    s->w_err = PROBE_ERR_NOSPACE;
    return set_wmsg(s, s->w_err,
                    "%s: file-size limit (RLIMIT_FSIZE) of %llu bytes is "
                    "too small for a trace (at least %llu)",
                    strerror(EFBIG), (unsigned long long)rl.rlim_cur,
                    (unsigned long long)MIN_FSIZE_LIMIT);
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
  probe__h5_cloexec(s->file);
  probe__h5_own_fd(probe__h5_fd(s->file)); /* a forked child leaves it alone */
  if (write_root_attrs(s) < 0) return h5_fail(s, "writing root attributes");
  if (create_layout(s) < 0) return h5_fail(s, "creating tables");
  probe_status st = state_write(s, 0);
  if (st != PROBE_OK) return st;
  if (H5Fstart_swmr_write(s->file) < 0)
    return h5_fail(s, "H5Fstart_swmr_write");
  return PROBE_OK;
}
