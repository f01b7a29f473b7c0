/*
 * reader.c - opening, validating and reading traces (docs/trace-format.md).
 *
 * probe_trace_open checks, in order: the file exists, it is HDF5, it is an
 * ampprobe trace (root attribute "format"), its version is one we read, every
 * table is there with the fields and types we need, and the state and layers
 * hold values in range. Row counts are min(state count, dataset extent): the
 * writer commits the counts only after the rows are on disk, so a killed
 * writer's trace yields exactly its flushed rows. Reads are chunked; every
 * row read is range-checked, and a bad one is PROBE_ERR_CORRUPT. A writer
 * killed while it created the file left an empty file (not HDF5, said so),
 * a bare superblock (read as a trace not closed with 0 steps, info
 * "unwritten") or a file still marked open for write (corrupt, said so).
 *
 * probe_trace_open_isolated does the whole parse (every row of every table)
 * in a forked child first, since HDF5 1.10 can crash, hang or overrun its
 * buffers on malformed files; a child that dies or times out, also while it
 * releases what it read (where glibc notices an overrun), means "corrupt".
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h> /* flock */
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <hdf5.h>
#ifdef __GLIBC__
#include <malloc.h> /* malloc_trim */
#endif

#include "ampprobe/probe.h"
#include "format.h"

/* Metadata read attempts under SWMR (HDF5's default there is 100). */
#define PROBE__READ_ATTEMPTS 2

/* The string attributes of a trace's root, in probe_trace.strs order; the
 * last, run_id, was added later: absent in older traces, read as "". */
#define N_STR_ATTRS 7
#define STR_RUN_ID 5
#define STR_ABORTED 6 /* the abort mark: absent in older traces, read as "" */
static const char *const str_attrs[N_STR_ATTRS] = {
    "created",          "command_line",     "config_json",
    "precision_policy", "library_versions", "run_id", "aborted"};

struct probe_trace {
  hid_t file;
  hid_t dset[PROBE__T_COUNT];
  hid_t mtype[PROBE__T_COUNT];
  int64_t rows[PROBE__T_COUNT]; /* committed rows readable */
  int64_t state[PROBE__STATE_LEN]; /* /meta/state as read */
  uint32_t missing[PROBE__T_COUNT]; /* bit i: the file lacks optional
                                       field i of the table */
  uint32_t miss_unmeasured, miss_digest; /* those bits of /steps' fields */
  probe_trace_info info;
  probe_layer_info *layers; /* (info.n_layers) */
  char *path;
  char h5msg[256]; /* HDF5's message of the last failed read */
  char h5filter[200]; /* "" or, when that read's table uses a filter this
                         HDF5 lacks, what read_failed says instead */
  char *strs[N_STR_ATTRS]; /* str_attrs: created, command_line,
                              config_json, precision_policy,
                              library_versions, run_id */
  char msg[512];
  /* The order of /records (step, seq) and /steps (step) is checked across
   * reads too: the key of row ord_row[i] - 1, as the last read that ended
   * there found it (ord_row[i] -1: none kept; a read starting elsewhere
   * reads that row's key itself). */
  int64_t ord_row[PROBE__T_COUNT];
  int64_t ord_step[PROBE__T_COUNT];
  uint32_t ord_seq[PROBE__T_COUNT];
  /* every row of the tables the analyses do not read (kernels, snapshots)
   * has passed its checks: probe_trace_open_isolated's child read them, or
   * probe__trace_check_unread did */
  int unread_checked;
  /* the file at the open (stat), and the list of the open traces */
  dev_t dev;
  ino_t ino;
  off_t size;
  struct timespec mtime;
  probe_trace *next_open;
  int listed;
};

/* The traces open in this process that hold an HDF5 file (from
 * probe_trace_open to probe_trace_close), under the HDF5 lock; a child of
 * fork() has its parent's, whose HDF5 files it inherited. HDF5 hands an
 * open of a file already open in the process through the same driver (the
 * same device and inode) the state of that open: the metadata it read
 * then, stale once the file has grown (a live writer's flush), mixed with
 * what it reads now ("/meta/state counts 12 rows of /steps, the table has
 * 5": a healthy trace called corrupt). Such an open is refused, saying so
 * (open_shared). */
static probe_trace *open_traces;

static void open_list_add(probe_trace *t) {
  t->next_open = open_traces;
  open_traces = t;
  t->listed = 1;
}

static void open_list_remove(probe_trace *t) {
  if (!t->listed) return;
  for (probe_trace **p = &open_traces; *p; p = &(*p)->next_open)
    if (*p == t) {
      *p = t->next_open;
      break;
    }
  t->listed = 0;
}

/* Another open trace of this file whose HDF5 state may be stale: the file
 * has changed (size or modification time) since that trace's open. */
static const probe_trace *open_shared(const probe_trace *t) {
  for (const probe_trace *o = open_traces; o; o = o->next_open)
    if (o->dev == t->dev && o->ino == t->ino &&
        (o->size != t->size || o->mtime.tv_sec != t->mtime.tv_sec ||
         o->mtime.tv_nsec != t->mtime.tv_nsec))
      return o;
  return NULL;
}

/* The message of the last failed probe_trace_open in this thread. */
static _Thread_local char open_msg[512];

void probe__trace_open_msg(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(open_msg, sizeof open_msg, fmt, ap);
  va_end(ap);
}

/* A path as a message shows it: whole up to MSG_PATH_MAX bytes, else its
 * first MSG_PATH_HEAD bytes and its last MSG_PATH_TAIL around "...", so
 * that the reason after it survives the message's 512 bytes (a 1,236-byte
 * path left the path alone, cut). */
enum { MSG_PATH_MAX = 240, MSG_PATH_HEAD = 80, MSG_PATH_TAIL = 150 };
static const char *msg_path(char *buf, size_t n, const char *p) {
  size_t len = strlen(p);
  if (len <= MSG_PATH_MAX) return p;
  /* both cuts on a character's first byte: no UTF-8 sequence split */
  size_t head = MSG_PATH_HEAD, tail = len - MSG_PATH_TAIL;
  while (head > 0 && ((unsigned char)p[head] & 0xc0) == 0x80) head--;
  while (tail > 0 && ((unsigned char)p[tail] & 0xc0) == 0x80) tail--;
  snprintf(buf, n, "%.*s...%s", (int)head, p, p + tail);
  return buf;
}

/* Sets the one-line message "PATH: what". */
static probe_status vfail(probe_trace *t, probe_status st, const char *fmt,
                          va_list ap) {
  char what[260], pb[MSG_PATH_MAX + 8];
  vsnprintf(what, sizeof what, fmt, ap);
  snprintf(t->msg, sizeof t->msg, "%s: %s",
           t->path ? msg_path(pb, sizeof pb, t->path) : "trace", what);
  if (H5Eget_num(H5E_DEFAULT) > 0) probe__h5_failed_call(); /* format.h */
  H5Eclear2(H5E_DEFAULT);
  return st;
}

static probe_status fail(probe_trace *t, probe_status st, const char *fmt,
                         ...) {
  va_list ap;
  va_start(ap, fmt);
  vfail(t, st, fmt, ap);
  va_end(ap);
  return st;
}

/* PROBE_ERR_CORRUPT for a failed read_rows: the caller's message (which
 * quotes HDF5's, t->h5msg), or, when the table uses a filter this HDF5
 * lacks, the sentence that says so (t->h5filter) instead: HDF5's own
 * message then names the plugin directory it searched ("can't open
 * directory: /usr/lib/x86_64-linux-gnu/hdf5/serial/plugins"). */
static probe_status read_failed(probe_trace *t, const char *fmt, ...) {
  if (t->h5filter[0])
    return fail(t, PROBE_ERR_CORRUPT, "%s", t->h5filter);
  va_list ap;
  va_start(ap, fmt);
  vfail(t, PROBE_ERR_CORRUPT, fmt, ap);
  va_end(ap);
  return PROBE_ERR_CORRUPT;
}

static herr_t first_desc(unsigned n, const H5E_error2_t *e, void *data) {
  char *buf = data;
  if (buf[0] == '\0' && e->desc) snprintf(buf, 200, "%s", e->desc);
  return 0;
}

/* The most specific message on HDF5's error stack. */
static void h5_desc(char *buf) {
  probe__h5_failed_call(); /* called after a failed HDF5 call (format.h) */
  buf[0] = '\0';
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, first_desc, buf);
  if (buf[0] == '\0') snprintf(buf, 200, "HDF5 error");
}

static void probe_trace_close_impl(probe_trace *t) {
  if (t == NULL) return;
  open_list_remove(t);
  H5E_BEGIN_TRY {
    for (int i = 0; i < PROBE__T_COUNT; i++) {
      if (t->dset[i] >= 0) H5Dclose(t->dset[i]);
      if (t->mtype[i] >= 0) H5Tclose(t->mtype[i]);
    }
    if (t->file >= 0) {
      /* anything of this file a failed path left open (H5F_OBJ_LOCAL: the
       * ids opened through this file id, not the host's of the same file) */
      hid_t left[16];
      ssize_t n = H5Fget_obj_ids(t->file, H5F_OBJ_DATASET | H5F_OBJ_GROUP |
                                               H5F_OBJ_DATATYPE | H5F_OBJ_ATTR |
                                               H5F_OBJ_LOCAL,
                                 16, left);
      for (ssize_t i = 0; i < n; i++) probe__h5_close_id(left[i]);
      if (H5Fclose(t->file) < 0) probe__h5_close_failed(); /* format.h */
    }
  }
  H5E_END_TRY;
  for (int i = 0; i < N_STR_ATTRS; i++) free(t->strs[i]);
  free(t->path);
  free(t->layers);
  free(t);
}

const char *probe_trace_last_error(const probe_trace *t) {
  if (t == NULL) return open_msg[0] ? open_msg : "no error";
  return t->msg[0] ? t->msg : "no error";
}

const probe_trace_info *probe_trace_get_info(const probe_trace *t) {
  return t ? &t->info : NULL;
}

const probe_layer_info *probe_trace_layers(const probe_trace *t, size_t *n) {
  if (t == NULL) {
    if (n) *n = 0;
    return NULL;
  }
  if (n) *n = (size_t)t->info.n_layers;
  return t->layers;
}

/* 1 when the HDF5 signature is at offset 0, 512, 1024, 2048, ... */
static int has_hdf5_signature(int fd, off_t size) {
  static const unsigned char sig[8] = {0x89, 'H', 'D', 'F', '\r', '\n', 0x1a,
                                       '\n'};
  unsigned char buf[8];
  for (off_t off = 0; off + 8 <= size; off = off ? off * 2 : 512) {
    if (pread(fd, buf, 8, off) != 8) return 0;
    if (memcmp(buf, sig, 8) == 0) return 1;
  }
  return 0;
}

/* 1 when another open file description holds a write lock on fd's file:
 * a live libprobe writer (session.c's trace_claim locks the whole file
 * until it closes or dies), or HDF5's flock of a writer. 0 when none, or
 * the system cannot tell. */
static int writer_alive(int fd) {
  struct flock fl; /* F_GETLK sees OFD locks too (l_pid -1) */
  memset(&fl, 0, sizeof fl);
  fl.l_type = F_WRLCK;
  fl.l_whence = SEEK_SET;
  if (fcntl(fd, F_GETLK, &fl) == 0 && fl.l_type != F_UNLCK) return 1;
  /* HDF5's own lock: a writer holds flock(LOCK_EX) until SWMR mode */
  if (flock(fd, LOCK_SH | LOCK_NB) != 0) return errno == EWOULDBLOCK;
  flock(fd, LOCK_UN);
  return 0;
}

/* Bytes of a version 2 or 3 superblock (3 is the one libprobe's writer
 * makes, libver "latest") with offsets of size o: signature 8, versions
 * and sizes 4, four addresses, checksum 4. 48 with 8-byte offsets. */
#define SB23_BYTES(o) (12 + 4 * (o) + 4)

/* Reads a little-endian address of n bytes. */
static uint64_t le_addr(const unsigned char *p, int n) {
  uint64_t v = 0;
  for (int i = n - 1; i >= 0; i--) v = (v << 8) | p[i];
  return v;
}

/* 1 when the file is an HDF5 superblock (version 3, at offset 0, marked
 * open for write) and nothing else: it is exactly that long, its stored
 * end of file lies past the end of the file and its root group's header
 * is not in it. H5Fcreate writes this first; a writer killed before its
 * first flush leaves it (hunt F8: 48 bytes, stored EOF 2048). The HDF5
 * library calls it "truncated". */
static int bare_superblock(int fd, off_t size) {
  unsigned char b[SB23_BYTES(8)];
  if (size < SB23_BYTES(2) || size > (off_t)sizeof b) return 0;
  if (pread(fd, b, (size_t)size, 0) != (ssize_t)size) return 0;
  int o = b[9];
  /* version 3 (libver latest), still marked open for write (flag 0x01):
   * a closed trace cut to this length has the flag clear */
  if (b[8] != 3 || !(b[11] & 0x01) || (o != 2 && o != 4 && o != 8) ||
      size != SB23_BYTES(o))
    return 0;
  uint64_t base = le_addr(b + 12, o), eof = le_addr(b + 12 + 2 * o, o);
  uint64_t root = le_addr(b + 12 + 3 * o, o);
  return base == 0 && eof > (uint64_t)size && root >= (uint64_t)size;
}

/* 1 when the file's version 3 superblock still says "open for write"
 * without SWMR (HDF5's file consistency flags: write access 0x01, SWMR
 * write access 0x04) and no writer holds it: its writer was killed before
 * it closed the file or entered SWMR mode. libprobe's writer enters SWMR
 * mode right after it creates the tables, so for a trace that is a kill
 * during its creation, before any step; HDF5 refuses to open such a file
 * ("already open for write") without h5clear, which would write to it. */
static int killed_open_for_write(const char *path) {
  int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return 0;
  unsigned char b[12];
  int hit = pread(fd, b, sizeof b, 0) == (ssize_t)sizeof b &&
            has_hdf5_signature(fd, sizeof b) && b[8] == 3 &&
            (b[11] & 0x01) && !(b[11] & 0x04) && !writer_alive(fd);
  close(fd);
  return hit;
}

/* A trace whose writer was killed before it wrote anything (a bare
 * superblock, see bare_superblock): read as a trace it never closed with
 * 0 steps, which is what it is (the analyses say "not closed, no step
 * recorded"). Nothing of it is known: no config, no layers, mode
 * "flight recorder" (run's default). Strings the isolated child sent
 * (all "") are kept; the others are made "". */
static void open_unwritten(probe_trace *t) {
  for (int i = 0; i < N_STR_ATTRS; i++)
    if (t->strs[i] == NULL) t->strs[i] = strdup("");
  probe_trace_info *in = &t->info;
  in->version = PROBE_TRACE_VERSION;
  in->record_mode = PROBE_MODE_SCALARS;
  in->last_step = in->first_nonfinite_step = -1;
  in->rank = -1;
  in->aborted_step = -1;
  in->unwritten = 1;
  in->created = t->strs[0];
  in->command_line = t->strs[1];
  in->config_json = t->strs[2];
  in->precision_policy = t->strs[3];
  in->library_versions = t->strs[4];
  in->run_id = t->strs[STR_RUN_ID];
  in->aborted = t->strs[STR_ABORTED];
}

/* What reading a root attribute found (attr_read_str, attr_read_i64). */
typedef enum attr_why {
  ATTR_OK,
  ATTR_ABSENT,
  ATTR_OTHER_TYPE, /* another class (an int for a string, a string for an
                      int) or not one value (an array) */
  ATTR_TOO_LONG,   /* a string over ROOT_STRS_MAX */
  ATTR_UNREADABLE, /* HDF5 failed to read it */
} attr_why;

/* The string root attributes hold at most this many bytes together
 * (each one's length, 4 bytes, and its bytes: what the isolated open's
 * child sends its parent), so at most this much each. */
#define ROOT_STRS_MAX ((size_t)64 << 20)
#define ROOT_STRS_MAX_TEXT "64 MiB"

/* Reads a scalar string attribute (variable or fixed length) into a
 * malloc'ed string; NULL, and why in *why, when it is absent, not a
 * string, longer than ROOT_STRS_MAX or unreadable. */
static char *attr_read_str(hid_t loc, const char *name, attr_why *why) {
  char *out = NULL;
  hid_t a = -1, ft = -1, mt = -1, sp = -1;
  htri_t ex = H5Aexists(loc, name);
  *why = ex == 0 ? ATTR_ABSENT : ATTR_UNREADABLE;
  if (ex <= 0) return NULL;
  if ((a = H5Aopen(loc, name, H5P_DEFAULT)) < 0 || (ft = H5Aget_type(a)) < 0 ||
      (sp = H5Aget_space(a)) < 0)
    goto done;
  H5T_class_t cls = H5Tget_class(ft);
  hssize_t npoints = H5Sget_simple_extent_npoints(sp);
  if (cls == H5T_NO_CLASS || npoints < 0) goto done;
  if (cls != H5T_STRING || npoints != 1) {
    *why = ATTR_OTHER_TYPE;
    goto done;
  }
  if (H5Tis_variable_str(ft) > 0) {
    char *v = NULL;
    if ((mt = H5Tcopy(H5T_C_S1)) < 0 || H5Tset_size(mt, H5T_VARIABLE) < 0 ||
        H5Tset_cset(mt, H5Tget_cset(ft)) < 0)
      goto done;
    if (H5Aread(a, mt, &v) < 0) goto done;
    if (v && strlen(v) > ROOT_STRS_MAX) *why = ATTR_TOO_LONG;
    else out = strdup(v ? v : "");
    if (v) H5free_memory(v);
  } else {
    size_t len = H5Tget_size(ft);
    if (len == 0) goto done;
    if (len > ROOT_STRS_MAX) { /* not allocated: it may be a damaged type */
      *why = ATTR_TOO_LONG;
      goto done;
    }
    if ((mt = H5Tcopy(ft)) < 0) goto done;
    char *v = calloc(1, len + 1);
    if (v && H5Aread(a, mt, v) >= 0) out = v;
    else free(v);
  }
  if (out) *why = ATTR_OK;
done:
  if (mt >= 0) H5Tclose(mt);
  if (sp >= 0) H5Sclose(sp);
  if (ft >= 0) H5Tclose(ft);
  if (a >= 0) H5Aclose(a);
  return out;
}

/* Reads a scalar integer attribute into *v: ATTR_OK, or why not. */
static attr_why attr_read_i64(hid_t loc, const char *name, int64_t *v) {
  hid_t a = -1, ft = -1, sp = -1;
  htri_t ex = H5Aexists(loc, name);
  attr_why why = ex == 0 ? ATTR_ABSENT : ATTR_UNREADABLE;
  if (ex <= 0) return why;
  if ((a = H5Aopen(loc, name, H5P_DEFAULT)) < 0 || (ft = H5Aget_type(a)) < 0 ||
      (sp = H5Aget_space(a)) < 0)
    goto done;
  H5T_class_t cls = H5Tget_class(ft);
  hssize_t npoints = H5Sget_simple_extent_npoints(sp);
  if (cls == H5T_NO_CLASS || npoints < 0) goto done;
  if (cls != H5T_INTEGER || npoints != 1) why = ATTR_OTHER_TYPE;
  else if (H5Aread(a, H5T_NATIVE_INT64, v) >= 0) why = ATTR_OK;
done:
  if (sp >= 0) H5Sclose(sp);
  if (ft >= 0) H5Tclose(ft);
  if (a >= 0) H5Aclose(a);
  return why;
}

/* probe_trace_open_isolated's child: its progress, a message on a pipe per
 * chunk it reads (read_rows) and per table it opens, which the parent
 * watches (iso_watch): a sign of life, and the rows read so far of the
 * rows to read (iso_msg; 0 of 0 until the tables are open). Each message
 * is one write of a few bytes (atomic on a pipe); a full pipe drops it
 * (O_NONBLOCK), except the last one, which says done == total. */
typedef struct iso_msg {
  uint64_t done, total;
} iso_msg;

static int iso_beat_fd = -1;
static iso_msg iso_progress;

static void iso_beat(void) {
  if (iso_beat_fd < 0) return;
  if (write(iso_beat_fd, &iso_progress, sizeof iso_progress) < 0) {
    /* full (EAGAIN): progress known */
  }
}

/* The child has read n more rows. */
static void iso_rows(size_t n) {
  if (iso_beat_fd < 0) return;
  iso_progress.done += n;
  if (iso_progress.done > iso_progress.total)
    iso_progress.done = iso_progress.total;
}

/* Extent of a 1-D dataset; -1 when it is not 1-D. */
static int64_t extent_1d(hid_t d) {
  hid_t sp = H5Dget_space(d);
  if (sp < 0) return -1;
  hsize_t dims[1] = {0};
  int64_t n = -1;
  if (H5Sget_simple_extent_ndims(sp) == 1 &&
      H5Sget_simple_extent_dims(sp, dims, NULL) == 1)
    n = (int64_t)dims[0];
  H5Sclose(sp);
  return n;
}

/* When dataset d (at path) uses a filter this HDF5 lacks - neither built
 * in nor found as a plugin: LZF (32000), Blosc, Zstandard, which h5py or
 * other writers can use and libprobe never does - writes "PATH is
 * compressed with a filter this HDF5 does not have (id 32000, lzf)" into
 * buf and returns 1; else 0. The name is the one the file stores with the
 * filter (text from the file: escaped, and cut short); none, the id
 * alone. Called after a read failed: a table whose chunks all skipped an
 * optional filter, or that has no rows, reads without it. */
static int filter_missing(hid_t d, const char *path, char *buf, size_t n) {
  hid_t dcpl = H5Dget_create_plist(d);
  int nf = dcpl >= 0 ? H5Pget_nfilters(dcpl) : -1, found = 0;
  for (int k = 0; k < nf && !found; k++) {
    unsigned flags = 0, conf = 0;
    size_t nvals = 0;
    char name[48] = "", shown[64];
    H5Z_filter_t id = H5Pget_filter2(dcpl, (unsigned)k, &flags, &nvals, NULL,
                                     sizeof name, name, &conf);
    if (id < 0 || H5Zfilter_avail(id) > 0) continue;
    name[sizeof name - 1] = '\0';
    probe__text_escape(shown, sizeof shown, name);
    snprintf(buf, n,
             "%s is compressed with a filter this HDF5 does not have (id "
             "%d%s%s)",
             path, (int)id, shown[0] ? ", " : "", shown);
    found = 1;
  }
  if (dcpl >= 0) H5Pclose(dcpl);
  return found;
}

/* Reads rows [start, start+n) of table i into buf; on failure HDF5's
 * message goes to t->h5msg (taken before later calls clear the stack),
 * and t->h5filter says which filter this HDF5 lacks when that is why
 * (read_failed reports one or the other). */
static int read_rows(probe_trace *t, int i, int64_t start, size_t n,
                     void *buf) {
  hsize_t st[1] = {(hsize_t)start}, cnt[1] = {n};
  hid_t fs = H5Dget_space(t->dset[i]), ms = H5Screate_simple(1, cnt, NULL);
  int rc = -1;
  iso_beat();
  if (fs >= 0 && ms >= 0 &&
      H5Sselect_hyperslab(fs, H5S_SELECT_SET, st, NULL, cnt, NULL) >= 0 &&
      H5Dread(t->dset[i], t->mtype[i], ms, fs, H5P_DEFAULT, buf) >= 0)
    rc = 0;
  if (rc < 0) {
    h5_desc(t->h5msg);
    if (!filter_missing(t->dset[i], probe__tables[i].path, t->h5filter,
                        sizeof t->h5filter))
      t->h5filter[0] = '\0';
  }
  if (ms >= 0) H5Sclose(ms);
  if (fs >= 0) H5Sclose(fs);
  return rc;
}

/* Opens the dataset at the absolute path, as the reader's one way to a
 * dataset of the file, into *d. A trace is one self-contained file: a link
 * to another file (external link), a virtual dataset (its data mapped from
 * other datasets, files anywhere) or external storage (its raw data in
 * files the trace names) is never written by libprobe, and following it
 * read what the file named - /etc/passwd, /dev/zero for a minute, a FIFO
 * until the isolated open's timer - past the reader's "a regular file"
 * check. Each is refused here, before any of its data is read: every link
 * on the path is looked at (H5Lget_info does not follow the last one)
 * before H5Lexists follows it, and the dataset's creation properties
 * before its type and extent. PROBE_ERR_CORRUPT naming the path. */
static probe_status open_dataset(probe_trace *t, const char *path, hid_t *d) {
  char buf[128];
  size_t n = strlen(path);
  *d = H5I_INVALID_HID;
  if (n >= sizeof buf)
    return fail(t, PROBE_ERR_INVALID_ARG, "path %s too long", path);
  for (const char *p = strchr(path + 1, '/');; p = strchr(p + 1, '/')) {
    size_t len = p ? (size_t)(p - path) : n;
    memcpy(buf, path, len);
    buf[len] = '\0';
    if (H5Lexists(t->file, buf, H5P_DEFAULT) <= 0)
      return fail(t, PROBE_ERR_CORRUPT, "corrupt trace: table %s is missing",
                  path);
    H5L_info_t li; /* the type only: the same in HDF5 1.10 and 1.12+ */
    if (H5Lget_info(t->file, buf, &li, H5P_DEFAULT) < 0)
      return fail(t, PROBE_ERR_CORRUPT, "corrupt trace: cannot open %s", path);
    if (li.type != H5L_TYPE_HARD && li.type != H5L_TYPE_SOFT)
      return fail(t, PROBE_ERR_CORRUPT,
                  "corrupt trace: %s is a link to another file (%s); a trace "
                  "is one file",
                  buf, li.type == H5L_TYPE_EXTERNAL ? "an external link"
                                                    : "a user-defined link");
    if (!p) break;
  }
  *d = H5Dopen2(t->file, path, H5P_DEFAULT);
  if (*d < 0)
    return fail(t, PROBE_ERR_CORRUPT, "corrupt trace: cannot open %s", path);
  hid_t dcpl = H5Dget_create_plist(*d);
  H5D_layout_t layout = dcpl >= 0 ? H5Pget_layout(dcpl) : H5D_LAYOUT_ERROR;
  int efl = dcpl >= 0 ? H5Pget_external_count(dcpl) : -1;
  if (dcpl >= 0) H5Pclose(dcpl);
  const char *why = layout == H5D_LAYOUT_ERROR || efl < 0
                        ? "its storage properties are unreadable"
                    : layout == H5D_VIRTUAL
                        ? "is a virtual dataset (its data in other datasets, "
                          "other files)"
                    : efl > 0 ? "stores its data in external files"
                              : NULL;
  if (why) {
    H5Dclose(*d);
    *d = H5I_INVALID_HID;
    return fail(t, PROBE_ERR_CORRUPT, "corrupt trace: %s %s; a trace is one "
                "file", path, why);
  }
  return PROBE_OK;
}

static probe_status open_tables(probe_trace *t) {
  char why[256];
  for (int i = 0; i < PROBE__T_COUNT; i++) {
    const probe__tabledef *d = &probe__tables[i];
    iso_beat();
    probe_status st = open_dataset(t, d->path, &t->dset[i]);
    if (st != PROBE_OK) return st;
    hid_t ft = H5Dget_type(t->dset[i]);
    if (ft < 0)
      return fail(t, PROBE_ERR_CORRUPT, "corrupt trace: type of %s", d->path);
    int bad = probe__type_check((probe__table)i, ft, why, sizeof why);
    if (!bad)
      t->mtype[i] = probe__type_create_read((probe__table)i, ft,
                                            &t->missing[i]);
    size_t row_bytes = H5Tget_size(ft);
    H5Tclose(ft);
    if (bad) return fail(t, PROBE_ERR_CORRUPT, "corrupt trace: %s", why);
    /* What reading a row and a chunk will allocate: a damaged type or
     * layout message can make them gigabytes, which HDF5 allocates and
     * fills before it fails (slowly: that is the isolated open's timer). */
    hid_t dcpl = H5Dget_create_plist(t->dset[i]);
    hsize_t cd[1] = {0};
    int chunked = dcpl >= 0 && H5Pget_layout(dcpl) == H5D_CHUNKED;
    int cdims = chunked ? H5Pget_chunk(dcpl, 1, cd) : 0;
    if (dcpl >= 0) H5Pclose(dcpl);
    if (row_bytes == 0 || row_bytes > ((size_t)64 << 10) ||
        (chunked && (cdims != 1 || cd[0] == 0 ||
                     cd[0] > ((hsize_t)64 << 20) / row_bytes)))
      return fail(t, PROBE_ERR_CORRUPT,
                  "corrupt trace: %s has rows of %zu bytes in chunks of %llu "
                  "rows",
                  d->path, row_bytes, (unsigned long long)cd[0]);
    if (t->mtype[i] < 0) return fail(t, PROBE_ERR_HDF5, "building types");
    int64_t n = extent_1d(t->dset[i]);
    if (n < 0)
      return fail(t, PROBE_ERR_CORRUPT, "corrupt trace: %s is not 1-D",
                  d->path);
    t->rows[i] = n;
  }
  return PROBE_OK;
}

/* Reads /meta/state into t->state and checks each value's own range.
 * Called before the tables are opened: the writer grows a table before it
 * counts its rows, so a state read first never counts more rows than the
 * tables have when they are opened after it, even while the writer runs. */
static probe_status read_state(probe_trace *t) {
  int64_t *st = t->state;
  hid_t d = H5I_INVALID_HID;
  probe_status ost = open_dataset(t, PROBE__STATE_PATH, &d);
  if (ost != PROBE_OK) return ost;
  hid_t ft = H5Dget_type(d);
  int ok = ft >= 0 && H5Tget_class(ft) == H5T_INTEGER &&
           H5Tget_size(ft) == 8 && extent_1d(d) == PROBE__STATE_LEN &&
           H5Dread(d, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, st) >= 0;
  /* A state with a check value that does not match may have been read
   * while a live writer rewrote it: read it again, a few times. */
  for (int again = 0; ok && again < 3 &&
                      (st[PROBE__S_FEATURES] & PROBE__FEAT_CHECK) &&
                      st[PROBE__S_CHECK] != probe__state_check(st);
       again++) {
    struct timespec ts = {0, 5000000L};
    nanosleep(&ts, NULL);
    H5Drefresh(d);
    ok = H5Dread(d, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, st) >= 0;
  }
  char nofilter[200];
  int lacks = !ok && filter_missing(d, PROBE__STATE_PATH, nofilter,
                                    sizeof nofilter);
  if (ft >= 0) H5Tclose(ft);
  H5Dclose(d);
  if (lacks) return fail(t, PROBE_ERR_CORRUPT, "%s", nofilter);
  if (!ok)
    return fail(t, PROBE_ERR_CORRUPT, "corrupt trace: unreadable /meta/state");
  if ((st[PROBE__S_FEATURES] & PROBE__FEAT_CHECK) &&
      st[PROBE__S_CHECK] != probe__state_check(st))
    return fail(t, PROBE_ERR_CORRUPT,
                "corrupt trace: /meta/state fails its check value (edited "
                "or damaged after it was written)");
  if (st[PROBE__S_FEATURES] < 0 ||
      (st[PROBE__S_FEATURES] & ~(int64_t)PROBE__FEAT_CHECK) != 0)
    return fail(t, PROBE_ERR_CORRUPT,
                "corrupt trace: /meta/state has unknown feature bits");
  if (st[PROBE__S_COMPLETE] != 0 && st[PROBE__S_COMPLETE] != 1)
    return fail(t, PROBE_ERR_CORRUPT, "corrupt trace: bad completion flag");
  /* 0 in every trace of a writer before the mark (the entry was
   * "reserved"), so an old trace reads as not joined */
  if (st[PROBE__S_JOINED] != 0 && st[PROBE__S_JOINED] != 1)
    return fail(t, PROBE_ERR_CORRUPT, "corrupt trace: bad joined mark");
  for (int i = 0; i < PROBE__T_COUNT; i++)
    if (st[PROBE__S_ROWS + i] < 0)
      return fail(t, PROBE_ERR_CORRUPT, "corrupt trace: negative row count");
  int64_t mode = st[PROBE__S_RECORD_MODE];
  if (st[PROBE__S_LAST_STEP] < -1 || st[PROBE__S_FIRST_NONFINITE] < -1 ||
      st[PROBE__S_EVENTS] < 0 || st[PROBE__S_FLUSHES] < 0 ||
      (mode != PROBE_MODE_SCALARS && mode != PROBE_MODE_FULL))
    return fail(t, PROBE_ERR_CORRUPT, "corrupt trace: state out of range");
  probe_trace_info *in = &t->info;
  in->complete = (int)st[PROBE__S_COMPLETE];
  in->joined = (int)st[PROBE__S_JOINED];
  in->record_mode = (int)mode;
  in->last_step = st[PROBE__S_LAST_STEP];
  in->first_nonfinite_step = st[PROBE__S_FIRST_NONFINITE];
  in->n_events = st[PROBE__S_EVENTS];
  in->n_flushes = st[PROBE__S_FLUSHES];
  return PROBE_OK;
}

/* Step of row `row` of a table whose rows start with an int64 step (steps,
 * records, snapshot index); -2 when unreadable. */
static int64_t row_step(probe_trace *t, int i, int64_t row) {
  union {
    probe_record r;
    probe_step_scalars s;
    probe_snapshot_info n;
  } u;
  if (read_rows(t, i, row, 1, &u) < 0) return -2;
  return u.r.step; /* step is the first member of all three */
}

/* The state against the tables (after open_tables and read_state): counts
 * no larger than the tables (min() would hide a damaged count), and the
 * steps, events and snapshots it states consistent with the rows. Each
 * failure is PROBE_ERR_CORRUPT naming what disagrees. */
static probe_status check_state(probe_trace *t) {
  const int64_t *st = t->state;
  for (int i = 0; i < PROBE__T_COUNT; i++) {
    int64_t c = st[PROBE__S_ROWS + i];
    if (c > t->rows[i])
      return fail(t, PROBE_ERR_CORRUPT,
                  "corrupt trace: /meta/state counts %lld rows of %s, the "
                  "table has %lld",
                  (long long)c, probe__tables[i].path, (long long)t->rows[i]);
    t->rows[i] = c;
  }
  int64_t last = st[PROBE__S_LAST_STEP], nf = st[PROBE__S_FIRST_NONFINITE];
  int64_t n_steps = t->rows[PROBE__T_STEPS];
  if (nf > last)
    return fail(t, PROBE_ERR_CORRUPT,
                "corrupt trace: first non-finite step %lld after the last "
                "step %lld",
                (long long)nf, (long long)last);
  if ((nf >= 0) != (st[PROBE__S_EVENTS] > 0))
    return fail(t, PROBE_ERR_CORRUPT,
                "corrupt trace: %lld non-finite events but first non-finite "
                "step %lld",
                (long long)st[PROBE__S_EVENTS], (long long)nf);
  if (t->rows[PROBE__T_SNAPIDX] > 0 && nf < 0)
    return fail(t, PROBE_ERR_CORRUPT,
                "corrupt trace: snapshots without a non-finite step");
  /* steps are strictly increasing from 0, one row at most each (written
   * without last + 1, which overflows for a corrupt last step of INT64_MAX) */
  if (n_steps - 1 > last)
    return fail(t, PROBE_ERR_CORRUPT,
                "corrupt trace: %lld rows in /steps but the last step is %lld",
                (long long)n_steps, (long long)last);
  static const int stepped[3] = {PROBE__T_STEPS, PROBE__T_RECORDS,
                                 PROBE__T_SNAPIDX};
  for (int k = 0; k < 3; k++) {
    int i = stepped[k];
    if (t->rows[i] == 0) continue;
    int64_t s = row_step(t, i, t->rows[i] - 1);
    if (s == -2)
      return read_failed(t, "corrupt trace: unreadable %s (%s)",
                         probe__tables[i].path, t->h5msg);
    if (s < 0 || s > last)
      return fail(t, PROBE_ERR_CORRUPT,
                  "corrupt trace: the last row of %s is step %lld, the last "
                  "step is %lld",
                  probe__tables[i].path, (long long)s, (long long)last);
  }
  int64_t mode_attr = -1; /* its type is checked with the others' */
  if (attr_read_i64(t->file, "record_mode", &mode_attr) == ATTR_OK &&
      mode_attr != st[PROBE__S_RECORD_MODE])
    return fail(t, PROBE_ERR_CORRUPT,
                "corrupt trace: record mode %lld in /meta/state, %lld in the "
                "root attribute",
                (long long)st[PROBE__S_RECORD_MODE], (long long)mode_attr);
  return PROBE_OK;
}

/* The abort mark's step: absent in older traces (-1). A reason with a
 * complete trace is one no writer makes (the close that writes it leaves
 * complete 0): refused after read_state. */
static probe_status read_aborted(probe_trace *t) {
  int64_t v = -1;
  attr_why why = attr_read_i64(t->file, "aborted_step", &v);
  if (why == ATTR_ABSENT) v = -1;
  else if (why != ATTR_OK || v < -1)
    return fail(t, PROBE_ERR_CORRUPT, "corrupt trace (attribute aborted_step)");
  t->info.aborted_step = t->info.aborted[0] ? v : -1;
  return PROBE_OK;
}

/* The rank attributes: absent in older traces (rank -1, world size 0),
 * else as probe_session_open accepts them; the run id likewise. */
static probe_status read_rank(probe_trace *t) {
  int64_t rank = -1, world = 0;
  int has_rank = H5Aexists(t->file, "rank") > 0;
  int has_world = H5Aexists(t->file, "world_size") > 0;
  if (has_rank != has_world ||
      (has_rank && (attr_read_i64(t->file, "rank", &rank) != ATTR_OK ||
                    attr_read_i64(t->file, "world_size", &world) != ATTR_OK)))
    return fail(t, PROBE_ERR_CORRUPT,
                "corrupt trace (attributes rank and world_size)");
  int single = rank == -1 && world == 0;
  if (!single && (rank < 0 || world < 1 || world > INT32_MAX || rank >= world))
    return fail(t, PROBE_ERR_CORRUPT,
                "corrupt trace: rank %lld of world size %lld", (long long)rank,
                (long long)world);
  /* The bytes are not echoed: a corrupt run id may hold a newline or a
   * terminal control, and the message is one line of text. */
  if (!probe__run_id_ok(t->info.run_id))
    return fail(t, PROBE_ERR_CORRUPT,
                "corrupt trace: invalid run_id (not 1..%d characters of "
                "[A-Za-z0-9._-])", PROBE_RUN_ID_MAX);
  t->info.rank = (int32_t)rank;
  t->info.world_size = (int32_t)world;
  return PROBE_OK;
}

static int layer_name_cmp(const void *a, const void *b) {
  return strcmp((*(const probe_layer_info *const *)a)->name,
                (*(const probe_layer_info *const *)b)->name);
}

static probe_status read_layers(probe_trace *t) {
  int64_t n = t->rows[PROBE__T_LAYERS];
  if (n > PROBE_LAYERS_MAX)
    return fail(t, PROBE_ERR_CORRUPT, "corrupt trace: %lld layers",
                (long long)n);
  t->layers = calloc((size_t)n + 1, sizeof *t->layers);
  if (t->layers == NULL) return fail(t, PROBE_ERR_NOMEM, "out of memory");
  if (n > 0 && read_rows(t, PROBE__T_LAYERS, 0, (size_t)n, t->layers) < 0)
    return read_failed(t, "corrupt trace: unreadable /layers (%s)", t->h5msg);
  for (int64_t i = 0; i < n; i++) {
    probe_layer_info *l = &t->layers[i];
    if (memchr(l->name, '\0', PROBE_NAME_MAX) == NULL || l->name[0] == '\0' ||
        l->id != i || l->kind < 0 || l->kind >= PROBE_KIND_COUNT ||
        l->precision < 0 || l->precision > PROBE_DTYPE_BF16)
      return fail(t, PROBE_ERR_CORRUPT, "corrupt trace: /layers row %lld",
                  (long long)i);
  }
  /* Names are unique (probe_layer_register refuses a second one; the
   * analyses find layers by name): sorted, equal names are neighbours. */
  if (n < 2) return PROBE_OK;
  const probe_layer_info **by = malloc((size_t)n * sizeof *by);
  if (by == NULL) return fail(t, PROBE_ERR_NOMEM, "out of memory");
  for (int64_t i = 0; i < n; i++) by[i] = &t->layers[i];
  qsort(by, (size_t)n, sizeof *by, layer_name_cmp);
  for (int64_t i = 1; i < n; i++) {
    if (strcmp(by[i - 1]->name, by[i]->name) != 0) continue;
    int32_t a = by[i - 1]->id < by[i]->id ? by[i - 1]->id : by[i]->id;
    int32_t b = by[i - 1]->id ^ by[i]->id ^ a;
    char shown[80];
    probe__text_escape(shown, sizeof shown, by[i]->name);
    free(by);
    return fail(t, PROBE_ERR_CORRUPT,
                "corrupt trace: /layers rows %d and %d have the same name "
                "'%s'", (int)a, (int)b, shown);
  }
  free(by);
  return PROBE_OK;
}

/* given: NULL, or the N_STR_ATTRS string attributes (malloc'ed; taken over,
 * also on failure) as probe_trace_open_isolated's child read them, so that this
 * process reads no variable-length string from the file: a corrupt global
 * heap makes HDF5 1.10 copy past its buffers there without crashing (seen
 * with ASan), which would corrupt this process's heap after a clean check.
 * The child has checked the "format" attribute too. */
static probe_status probe_trace_open_impl(probe_trace **out, const char *path, char **given) {
  if (out == NULL || path == NULL) {
    for (int i = 0; given && i < N_STR_ATTRS; i++) free(given[i]);
    snprintf(open_msg, sizeof open_msg, "probe_trace_open: %s is NULL",
             out == NULL ? "out" : "path");
    return PROBE_ERR_INVALID_ARG;
  }
  *out = NULL;
  probe_trace *t = calloc(1, sizeof *t);
  if (t == NULL) {
    for (int i = 0; given && i < N_STR_ATTRS; i++) free(given[i]);
    snprintf(open_msg, sizeof open_msg, "out of memory");
    return PROBE_ERR_NOMEM;
  }
  for (int i = 0; given && i < N_STR_ATTRS; i++)
    t->strs[i] = given[i]; /* freed with t */
  t->file = H5I_INVALID_HID;
  t->miss_unmeasured = 1u << probe__field_index(PROBE__T_STEPS, "unmeasured");
  t->miss_digest = 1u << probe__field_index(PROBE__T_STEPS, "weight_digest");
  for (int i = 0; i < PROBE__T_COUNT; i++) {
    t->dset[i] = t->mtype[i] = H5I_INVALID_HID;
    t->ord_row[i] = -1;
  }
  if ((t->path = strdup(path)) == NULL) {
    free(t);
    return PROBE_ERR_NOMEM;
  }
  probe_status st = PROBE_OK;
  char desc[256];

  struct stat sb;
  if (stat(path, &sb) != 0) {
    st = errno == ENOENT ? fail(t, PROBE_ERR_NOT_FOUND, "no such file")
                         : fail(t, PROBE_ERR_IO, "%s", strerror(errno));
    goto out;
  }
  if (S_ISDIR(sb.st_mode)) {
    st = fail(t, PROBE_ERR_NOT_HDF5, "is a directory");
    goto out;
  }
  /* A FIFO or a device would block the open (a FIFO without a writer) or
   * never end (/dev/zero): a trace is a regular file. */
  if (!S_ISREG(sb.st_mode)) {
    st = fail(t, PROBE_ERR_NOT_HDF5, "not a regular file");
    goto out;
  }
  t->dev = sb.st_dev;
  t->ino = sb.st_ino;
  t->size = sb.st_size;
  t->mtime = sb.st_mtim;
  if (open_shared(t)) {
    st = fail(t, PROBE_ERR_STATE,
              "open in this process by a reader not closed since it "
              "changed (a trace still written?): HDF5 would read it "
              "through that reader's view, as it was then; close the "
              "other reader first (probe_trace_close, ampprobe.Trace's "
              "close), or read it from another process");
    goto out;
  }
  int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    st = fail(t, PROBE_ERR_IO, "%s", strerror(errno));
    goto out;
  }
  int sig = has_hdf5_signature(fd, sb.st_size);
  int bare = sig && bare_superblock(fd, sb.st_size);
  int alive = (sb.st_size == 0 || bare) && writer_alive(fd);
  close(fd);
  if (sb.st_size == 0) { /* not necessarily ours: said as what it is */
    st = fail(t, PROBE_ERR_NOT_HDF5,
              alive ? "empty file: a writer is creating it now (no step "
                      "yet; look again)"
                    : "empty file: no trace was written (a writer killed "
                      "at its creation leaves this)");
    goto out;
  }
  if (!sig) {
    st = fail(t, PROBE_ERR_NOT_HDF5, "not an HDF5 file");
    goto out;
  }
  if (bare && !alive) {
    open_unwritten(t);
    for (int i = 0; i < N_STR_ATTRS; i++)
      if (t->strs[i] == NULL) {
        st = fail(t, PROBE_ERR_NOMEM, "out of memory");
        goto out;
      }
    goto out;
  }

  /* The file is opened through HDF5's log driver, which logs nothing with
   * flags 0 and reads as the default (sec2) driver does, because HDF5
   * takes a file already open in this process through the same driver
   * (the same device and inode) for the same file: it hands the reader the
   * open file's state instead of reading the file. A trace this process
   * writes is open through sec2 on its writer thread, so a reader here
   * read through the writer's metadata cache and descriptor - and in the
   * isolated open's child, whose copy of that descriptor is pointed at an
   * empty memory file (format.c, h5_fork_child_sinks), it read zeros: a
   * healthy live trace was "corrupt HDF5 file (root attributes: bad object
   * header version number)". Another driver is another file to HDF5: the
   * reader gets its own descriptor and cache and reads what is on disk,
   * as a reader in another process does. */
  hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
  if (fapl >= 0 && H5Pset_fapl_log(fapl, NULL, 0, 0) < 0) {
    H5Pclose(fapl);
    fapl = -1;
  }
  if (fapl < 0) {
    H5Eclear2(H5E_DEFAULT);
    st = fail(t, PROBE_ERR_IO, "HDF5 could not set up a file access "
                               "property list (H5Pset_fapl_log)");
    goto out;
  }
  /* HDF5 retries a metadata read whose checksum fails up to 100 times under
   * SWMR, sleeping in between (a live writer may be mid-write): on a
   * corrupt file that is minutes. A few attempts are enough here. */
  H5Pset_metadata_read_attempts(fapl, PROBE__READ_ATTEMPTS); /* SWMR only */
  /* SWMR read opens the trace of a writer that was killed in SWMR mode
   * without h5clear; files that are not SWMR files need a plain open. */
  t->file = H5Fopen(path, H5F_ACC_RDONLY | H5F_ACC_SWMR_READ, fapl);
  if (t->file < 0) {
    H5Eclear2(H5E_DEFAULT);
    t->file = H5Fopen(path, H5F_ACC_RDONLY, fapl);
  }
  H5Pclose(fapl);
  if (t->file < 0 && killed_open_for_write(path)) {
    H5Eclear2(H5E_DEFAULT);
    st = fail(t, PROBE_ERR_CORRUPT,
              "HDF5 file its writer never closed, still marked open for "
              "write and not in SWMR mode: a trace writer killed while it "
              "created the file leaves this (no step recorded); it cannot "
              "be read");
    goto out;
  }
  if (t->file < 0) {
    h5_desc(desc);
    st = fail(t, PROBE_ERR_CORRUPT, "corrupt or truncated HDF5 file (%s)", desc);
    goto out;
  }
  probe__h5_cloexec(t->file);
  /* A "format" that is absent, not a string or another string is another
   * program's file; one that HDF5 fails to read, a damaged file. */
  attr_why fmt_why = ATTR_OK;
  char *fmt = given ? NULL : attr_read_str(t->file, "format", &fmt_why);
  int is_trace = given || (fmt && strcmp(fmt, PROBE_TRACE_FORMAT) == 0);
  free(fmt);
  if (!given && fmt_why == ATTR_UNREADABLE) {
    h5_desc(desc);
    st = fail(t, PROBE_ERR_CORRUPT, "corrupt HDF5 file (root attributes: %s)",
              desc);
    goto out;
  }
  if (!is_trace) {
    st = fail(t, PROBE_ERR_NOT_TRACE, "HDF5 file but not an ampprobe trace");
    goto out;
  }
  int64_t version = 0;
  if (attr_read_i64(t->file, "version", &version) != ATTR_OK || version < 1) {
    st = fail(t, PROBE_ERR_CORRUPT, "corrupt trace (bad version attribute)");
    goto out;
  }
  if (version > PROBE_TRACE_VERSION) {
    st = fail(t, PROBE_ERR_VERSION,
              "trace format version %lld is newer than this ampprobe "
              "reads (%d)", (long long)version, PROBE_TRACE_VERSION);
    goto out;
  }
  t->info.version = (int)version;
  size_t strs_bytes = 0; /* as the isolated open's child sends them */
  int largest = 0;
  for (int i = 0; i < N_STR_ATTRS && !given; i++) {
    attr_why why = ATTR_OK;
    t->strs[i] = attr_read_str(t->file, str_attrs[i], &why);
    if (t->strs[i] == NULL && (i == STR_RUN_ID || i == STR_ABORTED) &&
        why == ATTR_ABSENT)
      t->strs[i] = strdup(""); /* an older writer */
    if (t->strs[i] == NULL) {
      st = why == ATTR_TOO_LONG
               ? fail(t, PROBE_ERR_CORRUPT,
                      "root attribute %s is larger than " ROOT_STRS_MAX_TEXT,
                      str_attrs[i])
               : fail(t, PROBE_ERR_CORRUPT, "corrupt trace (attribute %s)",
                      str_attrs[i]);
      goto out;
    }
    size_t len = strlen(t->strs[i]);
    strs_bytes += 4 + len;
    if (len > strlen(t->strs[largest])) largest = i;
  }
  if (strs_bytes > ROOT_STRS_MAX) {
    st = fail(t, PROBE_ERR_CORRUPT,
              "root attributes larger than " ROOT_STRS_MAX_TEXT " together "
              "(%s alone %.1f MiB)",
              str_attrs[largest],
              (double)strlen(t->strs[largest]) / (1 << 20));
    goto out;
  }
  /* The integer root attributes: absent in no trace libprobe wrote, but
   * tolerated; of another type or shape (a string, a float, an array),
   * corrupt as the others are. record_mode is checked against the state
   * too (check_state); the others' values are not used. */
  static const char *const int_attrs[] = {"record_mode", "ring_steps",
                                          "hist_min_exp", "hist_bins"};
  for (size_t i = 0; i < sizeof int_attrs / sizeof int_attrs[0]; i++) {
    int64_t v;
    attr_why why = attr_read_i64(t->file, int_attrs[i], &v);
    if (why != ATTR_OK && why != ATTR_ABSENT) {
      st = fail(t, PROBE_ERR_CORRUPT, "corrupt trace (attribute %s)",
                int_attrs[i]);
      goto out;
    }
  }
  t->info.created = t->strs[0];
  t->info.command_line = t->strs[1];
  t->info.config_json = t->strs[2];
  t->info.precision_policy = t->strs[3];
  t->info.library_versions = t->strs[4];
  t->info.run_id = t->strs[STR_RUN_ID];
  t->info.aborted = t->strs[STR_ABORTED];
  t->info.aborted_step = -1;
  if ((st = read_aborted(t)) != PROBE_OK) goto out;
  if ((st = read_rank(t)) != PROBE_OK) goto out;

  if ((st = read_state(t)) != PROBE_OK || (st = open_tables(t)) != PROBE_OK ||
      (st = check_state(t)) != PROBE_OK || (st = read_layers(t)) != PROBE_OK) {
    goto out;
  }
  if (t->info.aborted[0] && t->info.complete) {
    st = fail(t, PROBE_ERR_CORRUPT, "corrupt trace: an abort mark (attribute "
              "aborted) on a trace marked complete");
    goto out;
  }
  probe_trace_info *in = &t->info;
  in->n_layers = t->rows[PROBE__T_LAYERS];
  in->n_steps = t->rows[PROBE__T_STEPS];
  in->n_records = t->rows[PROBE__T_RECORDS];
  in->n_scaler_events = t->rows[PROBE__T_SCALER];
  in->n_snapshots = t->rows[PROBE__T_SNAPIDX];
  in->n_snapshot_elems = t->rows[PROBE__T_SNAPDATA];
  in->n_kernels = t->rows[PROBE__T_KERNELS];

out:
  if (st != PROBE_OK) {
    snprintf(open_msg, sizeof open_msg, "%s", t->msg);
    probe_trace_close(t);
    return st;
  }
  open_msg[0] = '\0';
  if (t->file >= 0) open_list_add(t);
  *out = t;
  return PROBE_OK;
}

/* ---- chunked reads with range checks ------------------------------------- */

static probe_status read_chunk(probe_trace *t, int i, int64_t start, size_t max,
                               void *buf, size_t *got) {
  if (t == NULL) {
    probe__trace_open_msg("reading %s: NULL trace", probe__tables[i].path);
    return PROBE_ERR_INVALID_ARG;
  }
  if (buf == NULL || got == NULL || start < 0)
    return fail(t, PROBE_ERR_INVALID_ARG, "reading %s: %s",
                probe__tables[i].path,
                start < 0 ? "negative start row"
                          : buf == NULL ? "NULL buf" : "NULL got");
  *got = 0;
  if (start >= t->rows[i] || max == 0) return PROBE_OK;
  size_t n = (size_t)(t->rows[i] - start);
  if (n > max) n = max;
  if (read_rows(t, i, start, n, buf) < 0)
    return read_failed(t, "corrupt trace: reading %s rows %lld..: %s",
                       probe__tables[i].path, (long long)start, t->h5msg);
  *got = n;
  return PROBE_OK;
}

/* The key of row start - 1 of /records (step, seq) or /steps (step, seq
 * 0), which the read of rows from start must follow: as the read that ended
 * there found it, else read from the file (one row). *have 0 when start is
 * 0. A row that cannot be read is PROBE_ERR_CORRUPT. */
static probe_status prev_key(probe_trace *t, int i, int64_t start,
                             int64_t *step, uint32_t *seq, int *have) {
  *have = 0;
  if (start == 0) return PROBE_OK;
  if (t->ord_row[i] == start) {
    *step = t->ord_step[i];
    *seq = t->ord_seq[i];
    *have = 1;
    return PROBE_OK;
  }
  union {
    probe_record r;
    probe_step_scalars s;
    probe_scaler_event e;
  } u;
  if (read_rows(t, i, start - 1, 1, &u) < 0)
    return read_failed(t, "corrupt trace: reading %s row %lld: %s",
                       probe__tables[i].path, (long long)(start - 1),
                       t->h5msg);
  *step = i == PROBE__T_RECORDS ? u.r.step
          : i == PROBE__T_SCALER ? u.e.step : u.s.step;
  *seq = i == PROBE__T_RECORDS ? u.r.seq : 0;
  *have = 1;
  return PROBE_OK;
}

/* Keeps the key of the last row checked (row end - 1) for the next read. */
static void ord_keep(probe_trace *t, int i, int64_t end, int64_t step,
                     uint32_t seq) {
  t->ord_row[i] = end;
  t->ord_step[i] = step;
  t->ord_seq[i] = seq;
}

/* Why a record's statistics cannot have come from probe_stats_compute (or
 * the CUDA kernel, or a merge of either: every rule below is kept by
 * probe_stats_merge), NULL when they can. The definitions are those of
 * docs/statistics.md, the same for fp16, bf16 and fp32 tensors: finite =
 * count - NaN - inf, non-zero = finite - zero_count = Σ hist; the extremes
 * are NaN exactly when there is no (non-zero) finite value and are finite
 * otherwise; absmax = max(|min|, |max|); sums of finite values in double
 * cannot overflow. About 70 integer adds and a few compares per row. */
static const char *stats_why(const probe_stats *s, int32_t dtype) {
  uint64_t special = s->nan_count + s->posinf_count;
  if (special < s->nan_count || special + s->neginf_count < special ||
      special + s->neginf_count > s->count)
    return "NaN + inf counts exceed count";
  uint64_t finite = s->count - special - s->neginf_count;
  if (s->zero_count > finite) return "zero_count exceeds the finite values";
  uint64_t nonzero = finite - s->zero_count, sum = 0;
  for (int b = 0; b < PROBE_HIST_BINS; b++) {
    if (s->hist[b] > nonzero - sum)
      return "histogram holds more than the non-zero finite values";
    sum += s->hist[b];
  }
  if (sum != nonzero)
    return "histogram holds fewer than the non-zero finite values";
  if (s->f16_flush > s->f16_subnormal || s->f16_subnormal > nonzero ||
      s->f16_overflow > nonzero - s->f16_subnormal)
    return "f16 range counts exceed the non-zero finite values";
  if (dtype == PROBE_DTYPE_F16 && (s->f16_flush || s->f16_overflow))
    return "an fp16 tensor with values outside fp16";
  if (finite == 0) {
    if (!isnan(s->min) || !isnan(s->max) || !isnan(s->absmax) ||
        s->sum != 0 || s->sumsq != 0)
      return "extremes or sums without a finite value";
  } else {
    if (!isfinite(s->min) || !isfinite(s->max) || !isfinite(s->absmax) ||
        !(s->min <= s->max) ||
        s->absmax != fmaxf(fabsf(s->min), fabsf(s->max)))
      return "min, max and absmax disagree";
    if (!isfinite(s->sum) || !isfinite(s->sumsq) || !(s->sumsq >= 0))
      return "sum or sumsq not a finite sum of squares";
  }
  /* "> 0" on the bits: a process that treats subnormals as zero (DAZ, as
   * torch.set_flush_denormal(True) sets) would take a subnormal
   * absmin_nonzero for 0 and refuse a valid trace; "<= absmax" holds in
   * either mode */
  uint32_t amin_bits;
  memcpy(&amin_bits, &s->absmin_nonzero, sizeof amin_bits);
  int amin_positive = amin_bits != 0 && amin_bits < 0x7f800000u;
  if (nonzero == 0 ? !isnan(s->absmin_nonzero)
                   : !(amin_positive && s->absmin_nonzero <= s->absmax))
    return "absmin_nonzero outside (0, absmax]";
  return NULL;
}

static probe_status probe_trace_read_records_impl(probe_trace *t, int64_t start,
                                      size_t max, probe_record *buf,
                                      size_t *got) {
  probe_status st = read_chunk(t, PROBE__T_RECORDS, start, max, buf, got);
  if (st != PROBE_OK) return st;
  int64_t pstep = -1;
  uint32_t pseq = 0;
  int have_prev = 0;
  if (*got > 0 && (st = prev_key(t, PROBE__T_RECORDS, start, &pstep, &pseq,
                                 &have_prev)) != PROBE_OK) {
    *got = 0;
    return st;
  }
  for (size_t i = 0; i < *got; i++) {
    const probe_record *r = &buf[i];
    int64_t row = start + (int64_t)i;
    if (r->step < 0 || r->step > t->info.last_step || r->layer < 0 ||
        r->layer >= t->info.n_layers ||
        r->site < 0 || r->site >= PROBE_SITE_COUNT || r->dtype < 0 ||
        r->dtype > PROBE_DTYPE_BF16) {
      *got = 0;
      return fail(t, PROBE_ERR_CORRUPT, "corrupt trace: /records row %lld",
                  (long long)row);
    }
    const char *why = stats_why(&r->stats, r->dtype);
    if (why != NULL) {
      *got = 0;
      return fail(t, PROBE_ERR_CORRUPT,
                  "corrupt trace: /records row %lld: %s (impossible "
                  "statistics)", (long long)row, why);
    }
    /* the writer's order, (step, seq) strictly increasing: the analyses
     * take the first non-finite row as the first event, and the cross-rank
     * one binary-searches the steps */
    if (have_prev &&
        (r->step < pstep || (r->step == pstep && r->seq <= pseq))) {
      *got = 0;
      return fail(t, PROBE_ERR_CORRUPT,
                  "corrupt trace: /records row %lld (step %lld, seq %u) is "
                  "not after row %lld (step %lld, seq %u)",
                  (long long)row, (long long)r->step, (unsigned)r->seq,
                  (long long)(row - 1), (long long)pstep, (unsigned)pseq);
    }
    pstep = r->step;
    pseq = r->seq;
    have_prev = 1;
  }
  if (*got > 0) ord_keep(t, PROBE__T_RECORDS, start + (int64_t)*got, pstep, pseq);
  return PROBE_OK;
}

/* Why a /steps row's values cannot have come from any writer, NULL when
 * they can: a scalar marked not measured that is not stored as NaN (0 for
 * the scaler's ints), a wall time that is not the probe's (seconds since
 * the session opened, >= 0). A negative loss_scale, grad_norm or
 * clip_threshold, which the writer now refuses (session.c),
 * is read: writers before 0.3 stored whatever the caller gave. */
static const char *step_why(const probe_step_scalars *s) {
  uint32_t u = s->unmeasured;
  if (((u & PROBE_SCALAR_LOSS) && !isnan(s->loss)) ||
      ((u & PROBE_SCALAR_LOSS_SCALE) && !isnan(s->loss_scale)) ||
      ((u & PROBE_SCALAR_SCALER) &&
       (s->growth_tracker || s->found_inf || s->skipped)) ||
      ((u & PROBE_SCALAR_LR) && !isnan(s->lr)) ||
      ((u & PROBE_SCALAR_GRAD_NORM) && !isnan(s->grad_norm)) ||
      ((u & PROBE_SCALAR_CLIP) &&
       (!isnan(s->clip_threshold) || !isnan(s->clip_coef))))
    return "a scalar marked not measured holds a value";
  if (!(s->wall_time >= 0) || isinf(s->wall_time))
    return "wall_time not seconds since the session opened";
  return NULL;
}

static probe_status probe_trace_read_steps_impl(probe_trace *t, int64_t start, size_t max,
                                    probe_step_scalars *buf, size_t *got) {
  probe_status st = read_chunk(t, PROBE__T_STEPS, start, max, buf, got);
  if (st != PROBE_OK) return st;
  int64_t pstep = -1;
  uint32_t pseq_unused = 0;
  int have_prev = 0;
  if (*got > 0 && (st = prev_key(t, PROBE__T_STEPS, start, &pstep,
                                 &pseq_unused, &have_prev)) != PROBE_OK) {
    *got = 0;
    return st;
  }
  for (size_t i = 0; i < *got; i++) {
    probe_step_scalars *s = &buf[i];
    /* Fields older writers did not write: unmeasured (all measured) and
     * weight_digest (not measured). */
    if (t->missing[PROBE__T_STEPS] & t->miss_unmeasured) s->unmeasured = 0;
    if (t->missing[PROBE__T_STEPS] & t->miss_digest) {
      s->weight_digest = 0;
      s->unmeasured |= PROBE_SCALAR_WEIGHT_DIGEST;
    }
    if (s->step < 0 || s->step > t->info.last_step ||
        !probe__step_flags_ok(s) ||
        (s->unmeasured & ~PROBE_SCALAR_ALL) != 0 ||
        ((s->unmeasured & PROBE_SCALAR_WEIGHT_DIGEST) && s->weight_digest) ||
        (!(s->unmeasured & PROBE_SCALAR_WEIGHT_DIGEST) && !s->weight_digest)) {
      *got = 0;
      return fail(t, PROBE_ERR_CORRUPT, "corrupt trace: /steps row %lld",
                  (long long)(start + (int64_t)i));
    }
    const char *why = step_why(s);
    if (why != NULL) {
      *got = 0;
      return fail(t, PROBE_ERR_CORRUPT, "corrupt trace: /steps row %lld: %s",
                  (long long)(start + (int64_t)i), why);
    }
    /* strictly increasing, also against the row before this read's first
     * (a duplicate at a chunk boundary passed before) */
    if (have_prev && s->step <= pstep) {
      *got = 0;
      return fail(t, PROBE_ERR_CORRUPT,
                  "corrupt trace: /steps row %lld (step %lld) is not after "
                  "row %lld (step %lld)",
                  (long long)(start + (int64_t)i), (long long)s->step,
                  (long long)(start + (int64_t)i - 1), (long long)pstep);
    }
    pstep = s->step;
    have_prev = 1;
  }
  if (*got > 0) ord_keep(t, PROBE__T_STEPS, start + (int64_t)*got, pstep, 0);
  return PROBE_OK;
}

static probe_status probe_trace_read_scaler_events_impl(probe_trace *t, int64_t start,
                                            size_t max,
                                            probe_scaler_event *buf,
                                            size_t *got) {
  probe_status st = read_chunk(t, PROBE__T_SCALER, start, max, buf, got);
  if (st != PROBE_OK || *got == 0) return st;
  /* Each event as a loss scaler makes it (probe__scaler_event_why), at a
   * step of the trace (<= its last step: an event is written in its step)
   * and in step order, also against the row before this read's first. */
  int64_t pstep = -1;
  uint32_t pseq = 0;
  int have_prev = 0;
  st = prev_key(t, PROBE__T_SCALER, start, &pstep, &pseq, &have_prev);
  if (st != PROBE_OK) {
    *got = 0;
    return st;
  }
  for (size_t i = 0; i < *got; i++) {
    const probe_scaler_event *e = &buf[i];
    long long row = (long long)(start + (int64_t)i);
    const char *why = probe__scaler_event_why(e);
    if (why == NULL && e->step > t->info.last_step) {
      *got = 0;
      return fail(t, PROBE_ERR_CORRUPT,
                  "corrupt trace: /scaler_events row %lld is at step %lld, "
                  "after the last step %lld",
                  row, (long long)e->step, (long long)t->info.last_step);
    }
    if (why == NULL && have_prev && e->step < pstep) {
      *got = 0;
      return fail(t, PROBE_ERR_CORRUPT,
                  "corrupt trace: /scaler_events row %lld (step %lld) is "
                  "before row %lld (step %lld)",
                  row, (long long)e->step, row - 1, (long long)pstep);
    }
    if (why) {
      *got = 0;
      return fail(t, PROBE_ERR_CORRUPT,
                  "corrupt trace: /scaler_events row %lld: %s", row, why);
    }
    pstep = e->step;
    have_prev = 1;
  }
  ord_keep(t, PROBE__T_SCALER, start + (int64_t)*got, pstep, 0);
  return PROBE_OK;
}

static int snapshot_ok(const probe_trace *t, const probe_snapshot_info *s) {
  return s->step >= 0 && s->step <= t->info.last_step && s->layer >= 0 &&
         s->layer < t->info.n_layers &&
         s->site >= 0 && s->site < PROBE_SITE_COUNT && s->dtype >= 0 &&
         s->dtype <= PROBE_DTYPE_BF16 && s->n >= 0 && s->n <= s->n_total &&
         s->offset >= 0 && s->offset <= t->rows[PROBE__T_SNAPDATA] - s->n;
}

static probe_status probe_trace_read_snapshots_impl(probe_trace *t, int64_t start,
                                        size_t max, probe_snapshot_info *buf,
                                        size_t *got) {
  probe_status st = read_chunk(t, PROBE__T_SNAPIDX, start, max, buf, got);
  if (st != PROBE_OK) return st;
  for (size_t i = 0; i < *got; i++) {
    if (!snapshot_ok(t, &buf[i])) {
      *got = 0;
      return fail(t, PROBE_ERR_CORRUPT,
                  "corrupt trace: /snapshots/index row %lld",
                  (long long)(start + (int64_t)i));
    }
  }
  return PROBE_OK;
}

static probe_status probe_trace_read_snapshot_data_impl(probe_trace *t,
                                            const probe_snapshot_info *sn,
                                            float *buf) {
  if (t == NULL) {
    probe__trace_open_msg("probe_trace_read_snapshot_data: NULL trace");
    return PROBE_ERR_INVALID_ARG;
  }
  if (sn == NULL || (buf == NULL && sn->n > 0))
    return fail(t, PROBE_ERR_INVALID_ARG,
                "probe_trace_read_snapshot_data: NULL %s",
                sn == NULL ? "snapshot" : "buf");
  if (!snapshot_ok(t, sn))
    return fail(t, PROBE_ERR_INVALID_ARG, "snapshot outside /snapshots/data");
  if (sn->n == 0) return PROBE_OK;
  if (read_rows(t, PROBE__T_SNAPDATA, sn->offset, (size_t)sn->n, buf) < 0)
    return read_failed(t, "corrupt trace: /snapshots/data: %s", t->h5msg);
  return PROBE_OK;
}

static probe_status probe_trace_read_kernels_impl(probe_trace *t, int64_t start,
                                      size_t max, probe_kernel_record *buf,
                                      size_t *got) {
  probe_status st = read_chunk(t, PROBE__T_KERNELS, start, max, buf, got);
  if (st != PROBE_OK) return st;
  for (size_t i = 0; i < *got; i++) {
    probe_kernel_record *k = &buf[i];
    k->name[PROBE_KERNEL_NAME_MAX - 1] = '\0';
    if (k->layer < -1 || k->layer >= t->info.n_layers || k->site < -1 ||
        k->site >= PROBE_SITE_COUNT || k->step < -1) {
      *got = 0;
      return fail(t, PROBE_ERR_CORRUPT, "corrupt trace: /kernels row %lld",
                  (long long)(start + (int64_t)i));
    }
  }
  return PROBE_OK;
}

/* ---- isolated open -------------------------------------------------------- */

/* Reads every row of a table through its checked read fn, cap rows of
 * type at a time into buf, counting them for the child's progress; stops
 * at the first error (st). Used by sweep_unread and read_everything. */
#define SWEEP_(fn, type, cap)                                                  \
  for (int64_t at = 0; st == PROBE_OK; at += (int64_t)got) {                   \
    st = fn(t, at, (cap), (type *)buf, &got);                                  \
    if (got == 0) break;                                                       \
    iso_rows(got);                                                             \
  }

/* Reads every row of /kernels, /snapshots/index and /snapshots/data, the
 * tables the analyses do not read otherwise, in chunks of the caller's
 * buffer (of bytes bytes, at least one row of each): memory bounded by it. */
static probe_status sweep_unread(probe_trace *t, void *buf, size_t bytes) {
  size_t got;
  probe_status st = PROBE_OK;
  SWEEP_(probe_trace_read_kernels, probe_kernel_record, bytes / sizeof(probe_kernel_record))
  SWEEP_(probe_trace_read_snapshots, probe_snapshot_info, bytes / sizeof(probe_snapshot_info))
  /* Snapshot data, in slices of the buffer. */
  size_t slice = bytes / sizeof(float);
  for (int64_t at = 0; st == PROBE_OK && at < t->rows[PROBE__T_SNAPDATA];
       at += (int64_t)slice) {
    size_t n = (size_t)(t->rows[PROBE__T_SNAPDATA] - at);
    if (n > slice) n = slice;
    probe__h5_lock();
    if (read_rows(t, PROBE__T_SNAPDATA, at, n, buf) < 0)
      st = read_failed(t, "corrupt trace: /snapshots/data: %s", t->h5msg);
    probe__h5_unlock();
    if (st == PROBE_OK) iso_rows(n);
  }
  return st;
}

/* Reads every row of every table in chunks (memory bounded by the chunk). */
static probe_status read_everything(probe_trace *t) {
  enum { CH = 2048 };
  size_t got;
  probe_status st = PROBE_OK;
  void *buf = malloc(CH * sizeof(probe_record));
  if (buf == NULL) return PROBE_ERR_NOMEM;
  SWEEP_(probe_trace_read_records, probe_record, CH)
  SWEEP_(probe_trace_read_steps, probe_step_scalars, CH)
  SWEEP_(probe_trace_read_scaler_events, probe_scaler_event, CH)
  if (st == PROBE_OK) st = sweep_unread(t, buf, CH * sizeof(probe_record));
  free(buf);
  return st;
}
#undef SWEEP_

probe_status probe__trace_check_unread(probe_trace *t) {
  if (t->unread_checked) return PROBE_OK;
  enum { BYTES = 1 << 20 };
  void *buf = malloc(BYTES);
  if (buf == NULL) return fail(t, PROBE_ERR_NOMEM, "out of memory");
  probe_status st = sweep_unread(t, buf, BYTES);
  free(buf);
  if (st == PROBE_OK) t->unread_checked = 1;
  return st;
}

/* ---- public entry points: every HDF5 call under the process-wide lock ---- */

void probe_trace_close(probe_trace *t) {
  probe__h5_lock();
  probe_trace_close_impl(t);
  probe__h5_unlock();
}

probe_status probe_trace_open(probe_trace **out, const char *path) {
  probe__h5_lock();
  probe_status st = probe_trace_open_impl(out, path, NULL);
  probe__h5_unlock();
  return st;
}

#define LOCKED_READ_(name, T)                                                  \
  probe_status name(probe_trace *t, int64_t start, size_t max, T *buf,         \
                    size_t *got) {                                             \
    probe__h5_lock();                                                          \
    probe_status st = name##_impl(t, start, max, buf, got);                    \
    probe__h5_unlock();                                                        \
    return st;                                                                 \
  }
LOCKED_READ_(probe_trace_read_records, probe_record)
LOCKED_READ_(probe_trace_read_steps, probe_step_scalars)
LOCKED_READ_(probe_trace_read_scaler_events, probe_scaler_event)
LOCKED_READ_(probe_trace_read_snapshots, probe_snapshot_info)
LOCKED_READ_(probe_trace_read_kernels, probe_kernel_record)
#undef LOCKED_READ_

probe_status probe_trace_read_snapshot_data(probe_trace *t,
                                            const probe_snapshot_info *sn,
                                            float *buf) {
  probe__h5_lock();
  probe_status st = probe_trace_read_snapshot_data_impl(t, sn, buf);
  probe__h5_unlock();
  return st;
}

/* What the child reports through the pipe. */
typedef struct iso_report {
  int32_t status;
  uint32_t strs_bytes; /* then, when status is PROBE_OK, the N_STR_ATTRS
                          string attributes, each a uint32_t length and its
                          bytes */
  char msg[500];
} iso_report;


static double mono_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The parent's watch on the child: a hard deadline (the whole read), and
 * at most ISO_STALL_S without a sign of progress, so that a child stuck in
 * one HDF5 call on a damaged file is given up on after seconds, not after
 * the whole budget of a large trace. */
#define ISO_STALL_S 10.0
#define ISO_BASE_S 60.0
#define ISO_MIN_RATE 256e3 /* bytes a second: 1/17 of the slowest seen */

typedef struct iso_watch {
  int beat_fd;
  double deadline, last_beat;
  int timed_out, stalled;
  /* the caller's progress callback (may be NULL), the part of an iso_msg
   * read so far, the last done it was given; stopped: it asked to stop */
  probe_progress_fn fn;
  void *user;
  unsigned char part[sizeof(iso_msg)];
  size_t part_n;
  uint64_t said;
  int heard, stopped;
} iso_watch;

/* The child's messages in buf: to the callback, done only going up. */
static void iso_heard(iso_watch *w, const unsigned char *buf, size_t n) {
  while (n > 0) {
    size_t k = sizeof w->part - w->part_n;
    if (k > n) k = n;
    memcpy(w->part + w->part_n, buf, k);
    w->part_n += k;
    buf += k;
    n -= k;
    if (w->part_n < sizeof w->part) break;
    w->part_n = 0;
    iso_msg m;
    memcpy(&m, w->part, sizeof m);
    if (w->fn == NULL || w->stopped || m.total == 0 || m.done > m.total ||
        (w->heard && m.done <= w->said))
      continue;
    w->heard = 1;
    w->said = m.done;
    if (w->fn(PROBE_PROGRESS_CHECKING, m.done, m.total, w->user) != 0)
      w->stopped = 1;
  }
}

/* Reads n bytes from fd within the watch; how many it got (short: the
 * child is gone, or timed out / stalled). */
static size_t read_by(int fd, void *buf, size_t n, iso_watch *w) {
  size_t have = 0;
  while (have < n) {
    double now = mono_s();
    if (w->stopped) break;
    if (now >= w->deadline) {
      w->timed_out = 1;
      break;
    }
    if (now - w->last_beat >= ISO_STALL_S) {
      w->stalled = 1;
      break;
    }
    double left = w->deadline - now;
    if (w->last_beat + ISO_STALL_S - now < left)
      left = w->last_beat + ISO_STALL_S - now;
    if (left > 60.0) left = 60.0; /* a poll's int of ms: the loop goes on */
    struct pollfd p[2] = {{fd, POLLIN, 0}, {w->beat_fd, POLLIN, 0}};
    int pr = poll(p, w->beat_fd >= 0 ? 2 : 1, (int)(left * 1000) + 1);
    if (pr < 0 && errno == EINTR) continue;
    if (pr <= 0) continue;
    if (w->beat_fd >= 0 && (p[1].revents & (POLLIN | POLLHUP))) {
      unsigned char msgs[16 * sizeof(iso_msg)];
      ssize_t r = read(w->beat_fd, msgs, sizeof msgs);
      if (r > 0) {
        w->last_beat = mono_s();
        iso_heard(w, msgs, (size_t)r);
      } else if (r == 0) { /* the child closed it: it is writing its report */
        close(w->beat_fd);
        w->beat_fd = -1;
        w->last_beat = 1e300; /* the hard deadline alone from now */
      }
    }
    if (!(p[0].revents & (POLLIN | POLLHUP))) continue;
    ssize_t r = read(fd, (char *)buf + have, n - have);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break; /* child gone */
    have += (size_t)r;
  }
  return have;
}

static probe_status open_isolated_impl(probe_trace **out, const char *path,
                                       char *err, size_t errlen,
                                       probe_progress_fn fn, void *user) {
  char pb_[MSG_PATH_MAX + 8]; /* the path as the messages show it */
  const char *mp = path ? msg_path(pb_, sizeof pb_, path) : "";
  if (out == NULL || path == NULL) {
    snprintf(err, errlen, "probe_trace_open_isolated: NULL argument");
    return PROBE_ERR_INVALID_ARG;
  }
  *out = NULL;
  err[0] = '\0';
  struct stat sb;
  /* ISO_STALL_S without progress is a hang, whatever the size; the hard
   * deadline only bounds a child that beats for ever, so it is far above
   * the slowest valid read: ISO_BASE_S plus 1 s per ISO_MIN_RATE bytes.
   * (It was 30 s + 1 s per 20 MB: a valid 297 MB trace of compressible
   * records, read at ~4.4 MB/s - 2 us a record at 9 bytes - was called
   * corrupt after 45 s.) */
  double timeout = ISO_BASE_S;
  if (stat(path, &sb) == 0) {
    timeout += (double)sb.st_size / ISO_MIN_RATE;
    if (!S_ISREG(sb.st_mode) && !S_ISDIR(sb.st_mode)) {
      /* not even forked for: the open would block (a FIFO) */
      snprintf(err, errlen, "%s: not a regular file", mp);
      return PROBE_ERR_NOT_HDF5;
    }
  }

  int fds[2], beat[2];
  if (probe__pipe(fds) != 0) {
    snprintf(err, errlen, "pipe: %s", strerror(errno));
    return PROBE_ERR_IO;
  }
  if (probe__pipe(beat) != 0) {
    snprintf(err, errlen, "pipe: %s", strerror(errno));
    close(fds[0]);
    close(fds[1]);
    return PROBE_ERR_IO;
  }
  /* No fflush: the child ends with _exit and never touches the host's
   * stdio buffers, so they are neither written twice nor flushed early. */
  /* Forked while holding the HDF5 lock, so that no writer thread of this
   * process is inside HDF5 at that moment: the child's copy is whole. */
  probe__h5_lock();
  pid_t pid = fork();
  if (pid == 0) probe__h5_lock_child_reset();
  else probe__h5_unlock();
  if (pid < 0) {
    close(fds[0]);
    close(fds[1]);
    close(beat[0]);
    close(beat[1]);
    snprintf(err, errlen, "fork: %s", strerror(errno));
    return PROBE_ERR_IO;
  }
  if (pid == 0) {
    close(fds[0]);
    close(beat[0]);
    fcntl(beat[1], F_SETFL, O_NONBLOCK);
    iso_beat_fd = beat[1];
    probe__child_detach();
    iso_report rep;
    memset(&rep, 0, sizeof rep);
    probe_trace *t = NULL;
    probe_status st = probe_trace_open(&t, path);
    if (st == PROBE_OK) {
      const probe_trace_info *in = &t->info;
      iso_progress.total = (uint64_t)(in->n_records + in->n_steps +
                                      in->n_scaler_events + in->n_kernels +
                                      in->n_snapshots + in->n_snapshot_elems);
      st = read_everything(t);
    }
    rep.status = st;
    snprintf(rep.msg, sizeof rep.msg, "%.*s", (int)sizeof rep.msg - 1,
             st == PROBE_OK ? "" : probe_trace_last_error(t));
    char *strs = NULL; /* the string attributes, for the parent */
    size_t nstrs = 0;
    if (st == PROBE_OK) {
      for (int i = 0; i < N_STR_ATTRS; i++) nstrs += 4 + strlen(t->strs[i]);
      if (nstrs > UINT32_MAX || (strs = malloc(nstrs)) == NULL) _exit(1);
      char *w = strs;
      for (int i = 0; i < N_STR_ATTRS; i++) {
        uint32_t len = (uint32_t)strlen(t->strs[i]);
        memcpy(w, &len, 4);
        memcpy(w + 4, t->strs[i], len);
        w += 4 + len;
      }
      rep.strs_bytes = (uint32_t)nstrs;
      /* A malformed file can make HDF5 write past its own buffers without
       * crashing (a global-heap string of the wrong length, say). The
       * parent would then corrupt its heap the same way and crash long
       * after, somewhere else. So release everything the parse allocated,
       * which is where glibc checks the chunks around each buffer, before
       * saying it went well: a crash here is a corrupt file too. */
      probe_trace_close(t);
      probe__h5_lock();
      H5garbage_collect();
      probe__h5_unlock();
#ifdef __GLIBC__
      malloc_trim(0); /* consolidates every free chunk: checks them too */
#endif
    }
    if (st == PROBE_OK && iso_progress.total > 0) {
      /* the last word, done == total: sent whatever the pipe holds */
      iso_progress.done = iso_progress.total;
      fcntl(iso_beat_fd, F_SETFL, 0);
      iso_beat();
    }
    close(iso_beat_fd); /* done: the parent waits for the report alone */
    iso_beat_fd = -1;
    const char *wp = (const char *)&rep;
    size_t left = sizeof rep;
    for (int part = 0; part < 2; part++) {
      while (left > 0) {
        ssize_t w = write(fds[1], wp, left);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) _exit(1);
        wp += w;
        left -= (size_t)w;
      }
      wp = strs;
      left = nstrs;
    }
    _exit(0);
  }
  close(fds[1]);
  close(beat[1]);
  iso_report rep;
  double t0 = mono_s();
  iso_watch w = {beat[0], t0 + timeout, t0, 0, 0, fn, user, {0}, 0, 0, 0, 0};
  size_t have = read_by(fds[0], &rep, sizeof rep, &w);
  char *strs = NULL;
  int strs_ok = 0;
  /* The child refuses more (probe_trace_open_impl): more is a report this
   * process does not take. The child, whose write then fails, is killed
   * first: a SIGPIPE would read as "HDF5 crashed". */
  int strs_too_big = have == sizeof rep && rep.status == PROBE_OK &&
                     rep.strs_bytes > ROOT_STRS_MAX;
  if (strs_too_big) kill(pid, SIGKILL);
  if (have == sizeof rep && rep.status == PROBE_OK && !strs_too_big &&
      (strs = malloc(rep.strs_bytes ? rep.strs_bytes : 1)) != NULL)
    strs_ok = read_by(fds[0], strs, rep.strs_bytes, &w) == rep.strs_bytes;
  close(fds[0]);
  if (w.beat_fd >= 0) {
    /* what the child said before its report and the loop left unread:
     * its last word, done == total, among it */
    fcntl(w.beat_fd, F_SETFL, O_NONBLOCK);
    unsigned char msgs[16 * sizeof(iso_msg)];
    ssize_t r;
    while (!w.stopped && (r = read(w.beat_fd, msgs, sizeof msgs)) > 0)
      iso_heard(&w, msgs, (size_t)r);
    close(w.beat_fd);
  }
  int timed_out = w.timed_out || w.stalled || w.stopped;
  if (timed_out) kill(pid, SIGKILL);
  int wst = 0;
  while (waitpid(pid, &wst, 0) < 0 && errno == EINTR) {
  }
  if (w.stopped) {
    free(strs);
    snprintf(err, errlen, "%s: interrupted (the progress callback asked to stop)",
             mp);
    return PROBE_ERR_INTERRUPTED;
  }
  if (timed_out) {
    free(strs);
    if (w.stalled)
      snprintf(err, errlen,
               "%s: corrupt trace (reading it made no progress for %.0f s)",
               mp, ISO_STALL_S);
    else
      snprintf(err, errlen,
               "%s: corrupt trace (reading it did not finish in %.0f s)",
               mp, timeout);
    return PROBE_ERR_CORRUPT;
  }
  if (strs_too_big) {
    snprintf(err, errlen,
             "%s: root attributes larger than " ROOT_STRS_MAX_TEXT " together",
             mp);
    return PROBE_ERR_CORRUPT;
  }
  if (have < sizeof rep || (rep.status == PROBE_OK && !strs_ok) ||
      !WIFEXITED(wst) || WEXITSTATUS(wst) != 0) {
    free(strs);
    if (WIFSIGNALED(wst))
      snprintf(err, errlen,
               "%s: corrupt trace (HDF5 crashed reading it: signal %d)", mp,
               WTERMSIG(wst));
    else
      snprintf(err, errlen, "%s: corrupt trace (the reader exited early)",
               mp);
    return PROBE_ERR_CORRUPT;
  }
  rep.msg[sizeof rep.msg - 1] = '\0';
  if (rep.status != PROBE_OK) {
    free(strs);
    snprintf(err, errlen, "%s", rep.msg);
    return (probe_status)rep.status;
  }
  /* The strings, as the child read them. */
  char *given[N_STR_ATTRS] = {NULL};
  size_t at = 0;
  probe_status st = PROBE_OK;
  for (int i = 0; i < N_STR_ATTRS && st == PROBE_OK; i++) {
    uint32_t len = 0;
    if (at + 4 > rep.strs_bytes) {
      st = PROBE_ERR_CORRUPT;
      break;
    }
    memcpy(&len, strs + at, 4);
    at += 4;
    if (len > rep.strs_bytes - at) {
      st = PROBE_ERR_CORRUPT;
      break;
    }
    if ((given[i] = malloc((size_t)len + 1)) == NULL) {
      st = PROBE_ERR_NOMEM;
      break;
    }
    memcpy(given[i], strs + at, len);
    given[i][len] = '\0';
    at += len;
  }
  free(strs);
  if (st != PROBE_OK) {
    for (int i = 0; i < N_STR_ATTRS; i++) free(given[i]);
    if (st == PROBE_ERR_NOMEM)
      snprintf(err, errlen, "%s: out of memory", mp);
    else
      snprintf(err, errlen, "%s: corrupt trace (the reader's report was malformed)", mp);
    return st;
  }
  probe__h5_lock();
  st = probe_trace_open_impl(out, path, given);
  probe__h5_unlock();
  if (st != PROBE_OK) snprintf(err, errlen, "%s", probe_trace_last_error(NULL));
  else (*out)->unread_checked = 1; /* the child read them */
  return st;
}

/* The message goes where every failed open's goes (probe_trace_last_error
 * of NULL), and into err when the caller passes a buffer. */
probe_status probe_trace_open_isolated(probe_trace **out, const char *path,
                                       char *err, size_t errlen) {
  return probe_trace_open_isolated_progress(out, path, err, errlen, NULL, NULL);
}

probe_status probe_trace_open_isolated_progress(probe_trace **out,
                                                const char *path, char *err,
                                                size_t errlen,
                                                probe_progress_fn fn,
                                                void *user) {
  char msg[sizeof open_msg];
  probe_status st = open_isolated_impl(out, path, msg, sizeof msg, fn, user);
  if (st != PROBE_OK) snprintf(open_msg, sizeof open_msg, "%s", msg);
  else open_msg[0] = '\0';
  if (err && errlen) snprintf(err, errlen, "%s", st != PROBE_OK ? msg : "");
  return st;
}
