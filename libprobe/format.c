/*
 * format.c - the compound types of the trace tables (see format.h and
 * docs/trace-format.md). Memory types follow the C structs of probe.h
 * (the probe_stats of a record is flattened into the record); file types
 * are the same fields at the same offsets, in little-endian byte order.
 */
#define _GNU_SOURCE /* PTHREAD_MUTEX_RECURSIVE */
#include "format.h"

#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define F_(st, fld, kind, len) {#fld, offsetof(st, fld), kind, len, 0}
#define FOPT_(st, fld, kind, len) {#fld, offsetof(st, fld), kind, len, 1}
#define FS_(fld, kind, len)                                                    \
  {#fld, offsetof(probe_record, stats.fld), kind, len, 0}

static const probe__field layer_fields[] = {
    F_(probe_layer_info, id, PROBE__F_I32, 1),
    F_(probe_layer_info, name, PROBE__F_STR, PROBE_NAME_MAX),
    F_(probe_layer_info, kind, PROBE__F_I32, 1),
    F_(probe_layer_info, precision, PROBE__F_I32, 1),
};

static const probe__field record_fields[] = {
    F_(probe_record, step, PROBE__F_I64, 1),
    F_(probe_record, seq, PROBE__F_U32, 1),
    F_(probe_record, layer, PROBE__F_I32, 1),
    F_(probe_record, site, PROBE__F_I32, 1),
    F_(probe_record, dtype, PROBE__F_I32, 1),
    FS_(count, PROBE__F_U64, 1),
    FS_(nan_count, PROBE__F_U64, 1),
    FS_(posinf_count, PROBE__F_U64, 1),
    FS_(neginf_count, PROBE__F_U64, 1),
    FS_(zero_count, PROBE__F_U64, 1),
    FS_(f16_subnormal, PROBE__F_U64, 1),
    FS_(f16_flush, PROBE__F_U64, 1),
    FS_(f16_overflow, PROBE__F_U64, 1),
    FS_(min, PROBE__F_F32, 1),
    FS_(max, PROBE__F_F32, 1),
    FS_(absmax, PROBE__F_F32, 1),
    FS_(absmin_nonzero, PROBE__F_F32, 1),
    FS_(sum, PROBE__F_F64, 1),
    FS_(sumsq, PROBE__F_F64, 1),
    FS_(hist, PROBE__F_U64A, PROBE_HIST_BINS),
};

static const probe__field step_fields[] = {
    F_(probe_step_scalars, step, PROBE__F_I64, 1),
    F_(probe_step_scalars, loss, PROBE__F_F64, 1),
    F_(probe_step_scalars, loss_scale, PROBE__F_F64, 1),
    F_(probe_step_scalars, growth_tracker, PROBE__F_I32, 1),
    F_(probe_step_scalars, found_inf, PROBE__F_I32, 1),
    F_(probe_step_scalars, skipped, PROBE__F_I32, 1),
    FOPT_(probe_step_scalars, unmeasured, PROBE__F_U32, 1), /* in padding */
    F_(probe_step_scalars, lr, PROBE__F_F64, 1),
    F_(probe_step_scalars, grad_norm, PROBE__F_F64, 1),
    F_(probe_step_scalars, clip_threshold, PROBE__F_F64, 1),
    F_(probe_step_scalars, clip_coef, PROBE__F_F64, 1),
    F_(probe_step_scalars, wall_time, PROBE__F_F64, 1),
    FOPT_(probe_step_scalars, weight_digest, PROBE__F_U64, 1), /* appended */
};

static const probe__field scaler_fields[] = {
    F_(probe_scaler_event, step, PROBE__F_I64, 1),
    F_(probe_scaler_event, kind, PROBE__F_I32, 1),
    F_(probe_scaler_event, old_scale, PROBE__F_F64, 1),
    F_(probe_scaler_event, new_scale, PROBE__F_F64, 1),
    F_(probe_scaler_event, growth_tracker, PROBE__F_I32, 1),
};

static const probe__field snapidx_fields[] = {
    F_(probe_snapshot_info, step, PROBE__F_I64, 1),
    F_(probe_snapshot_info, seq, PROBE__F_U32, 1),
    F_(probe_snapshot_info, layer, PROBE__F_I32, 1),
    F_(probe_snapshot_info, site, PROBE__F_I32, 1),
    F_(probe_snapshot_info, dtype, PROBE__F_I32, 1),
    F_(probe_snapshot_info, offset, PROBE__F_I64, 1),
    F_(probe_snapshot_info, n, PROBE__F_I64, 1),
    F_(probe_snapshot_info, n_total, PROBE__F_I64, 1),
};

static const probe__field kernel_fields[] = {
    F_(probe_kernel_record, step, PROBE__F_I64, 1),
    F_(probe_kernel_record, layer, PROBE__F_I32, 1),
    F_(probe_kernel_record, site, PROBE__F_I32, 1),
    F_(probe_kernel_record, name, PROBE__F_STR, PROBE_KERNEL_NAME_MAX),
    F_(probe_kernel_record, start_ns, PROBE__F_U64, 1),
    F_(probe_kernel_record, end_ns, PROBE__F_U64, 1),
    F_(probe_kernel_record, device, PROBE__F_I32, 1),
    F_(probe_kernel_record, stream, PROBE__F_U32, 1),
};

#define N_(a) (sizeof(a) / sizeof((a)[0]))

/* probe__type_create_read reports absent fields as bits of a uint32_t. */
_Static_assert(N_(layer_fields) <= 32 && N_(record_fields) <= 32 &&
                   N_(step_fields) <= 32 && N_(scaler_fields) <= 32 &&
                   N_(snapidx_fields) <= 32 && N_(kernel_fields) <= 32,
               "at most 32 fields per table");

const probe__tabledef probe__tables[PROBE__T_COUNT] = {
    [PROBE__T_LAYERS] = {"/layers", layer_fields, N_(layer_fields),
                         sizeof(probe_layer_info), 256},
    [PROBE__T_STEPS] = {"/steps", step_fields, N_(step_fields),
                        sizeof(probe_step_scalars), 256},
    [PROBE__T_RECORDS] = {"/records", record_fields, N_(record_fields),
                          sizeof(probe_record), 128},
    [PROBE__T_SCALER] = {"/scaler_events", scaler_fields, N_(scaler_fields),
                         sizeof(probe_scaler_event), 256},
    [PROBE__T_SNAPIDX] = {"/snapshots/index", snapidx_fields,
                          N_(snapidx_fields), sizeof(probe_snapshot_info), 256},
    [PROBE__T_SNAPDATA] = {"/snapshots/data", NULL, 0, sizeof(float), 65536},
    [PROBE__T_KERNELS] = {"/kernels", kernel_fields, N_(kernel_fields),
                          sizeof(probe_kernel_record), 512},
};

/* Atomic type of one field; the caller closes it. */
static hid_t field_type(const probe__field *f, int file) {
  hid_t base = H5I_INVALID_HID;
  switch (f->kind) {
  case PROBE__F_I32:
    return H5Tcopy(file ? H5T_STD_I32LE : H5T_NATIVE_INT32);
  case PROBE__F_U32:
    return H5Tcopy(file ? H5T_STD_U32LE : H5T_NATIVE_UINT32);
  case PROBE__F_I64:
    return H5Tcopy(file ? H5T_STD_I64LE : H5T_NATIVE_INT64);
  case PROBE__F_U64:
    return H5Tcopy(file ? H5T_STD_U64LE : H5T_NATIVE_UINT64);
  case PROBE__F_F32:
    return H5Tcopy(file ? H5T_IEEE_F32LE : H5T_NATIVE_FLOAT);
  case PROBE__F_F64:
    return H5Tcopy(file ? H5T_IEEE_F64LE : H5T_NATIVE_DOUBLE);
  case PROBE__F_STR: {
    hid_t t = H5Tcopy(H5T_C_S1);
    if (t < 0) return t;
    if (H5Tset_size(t, f->len) < 0 || H5Tset_strpad(t, H5T_STR_NULLTERM) < 0 ||
        H5Tset_cset(t, H5T_CSET_UTF8) < 0) {
      H5Tclose(t);
      return H5I_INVALID_HID;
    }
    return t;
  }
  case PROBE__F_U64A: {
    hsize_t dims[1] = {f->len};
    base = file ? H5T_STD_U64LE : H5T_NATIVE_UINT64;
    return H5Tarray_create2(base, 1, dims);
  }
  }
  return H5I_INVALID_HID;
}

hid_t probe__type_create(probe__table t, int file) {
  const probe__tabledef *d = &probe__tables[t];
  if (d->fields == NULL)
    return H5Tcopy(file ? H5T_IEEE_F32LE : H5T_NATIVE_FLOAT);
  /* The file type keeps the C struct's offsets and size (padding included,
   * which deflate removes): on a little-endian host the two types are then
   * identical and HDF5 copies rows without a per-field conversion. */
  hid_t ct = H5Tcreate(H5T_COMPOUND, d->mem_size);
  if (ct < 0) return ct;
  for (size_t i = 0; i < d->n_fields; i++) {
    const probe__field *f = &d->fields[i];
    hid_t ft = field_type(f, file);
    if (ft < 0) goto fail;
    herr_t e = H5Tinsert(ct, f->name, f->offset, ft);
    H5Tclose(ft);
    if (e < 0) goto fail;
  }
  return ct;
fail:
  H5Tclose(ct);
  return H5I_INVALID_HID;
}

int probe__field_index(probe__table t, const char *name) {
  const probe__tabledef *d = &probe__tables[t];
  for (size_t i = 0; i < d->n_fields; i++)
    if (strcmp(d->fields[i].name, name) == 0) return (int)i;
  return -1;
}

hid_t probe__type_create_read(probe__table t, hid_t file_type,
                              uint32_t *missing) {
  const probe__tabledef *d = &probe__tables[t];
  *missing = 0;
  if (d->fields == NULL) return probe__type_create(t, 0);
  hid_t ct = H5Tcreate(H5T_COMPOUND, d->mem_size);
  if (ct < 0) return ct;
  for (size_t i = 0; i < d->n_fields; i++) {
    const probe__field *f = &d->fields[i];
    if (f->optional && H5Tget_member_index(file_type, f->name) < 0) {
      *missing |= 1u << i; /* at most 32 fields per table (static check) */
      continue;
    }
    hid_t ft = field_type(f, 0);
    if (ft < 0) goto fail;
    herr_t e = H5Tinsert(ct, f->name, f->offset, ft);
    H5Tclose(ft);
    if (e < 0) goto fail;
  }
  return ct;
fail:
  H5Tclose(ct);
  return H5I_INVALID_HID;
}

int probe__type_check(probe__table t, hid_t file_type, char *why,
                      size_t whylen) {
  const probe__tabledef *d = &probe__tables[t];
  H5T_class_t cls = H5Tget_class(file_type);
  if (d->fields == NULL) {
    if (cls != H5T_FLOAT || H5Tget_size(file_type) != 4) {
      snprintf(why, whylen, "%s is not float32", d->path);
      return -1;
    }
    return 0;
  }
  if (cls != H5T_COMPOUND) {
    snprintf(why, whylen, "%s is not a compound table", d->path);
    return -1;
  }
  for (size_t i = 0; i < d->n_fields; i++) {
    const probe__field *f = &d->fields[i];
    int idx = H5Tget_member_index(file_type, f->name);
    if (idx < 0 && f->optional) continue;
    if (idx < 0) {
      snprintf(why, whylen, "%s lacks field '%s'", d->path, f->name);
      return -1;
    }
    hid_t mt = H5Tget_member_type(file_type, (unsigned)idx);
    if (mt < 0) {
      snprintf(why, whylen, "%s: unreadable type of '%s'", d->path, f->name);
      return -1;
    }
    hid_t want = field_type(f, 1);
    int ok = want >= 0 && H5Tget_class(mt) == H5Tget_class(want) &&
             H5Tget_size(mt) == H5Tget_size(want);
    if (ok && f->kind != PROBE__F_STR && f->kind != PROBE__F_U64A &&
        H5Tget_class(mt) == H5T_INTEGER)
      ok = H5Tget_sign(mt) == H5Tget_sign(want);
    if (want >= 0) H5Tclose(want);
    H5Tclose(mt);
    if (!ok) {
      snprintf(why, whylen, "%s: field '%s' has the wrong type", d->path,
               f->name);
      return -1;
    }
  }
  return 0;
}

int64_t probe__state_check(const int64_t st[PROBE__STATE_LEN]) {
  uint64_t h = 14695981039346656037ull;
  for (int i = 0; i < PROBE__STATE_LEN; i++) {
    if (i == PROBE__S_CHECK) continue;
    uint64_t v = (uint64_t)st[i];
    for (int b = 0; b < 8; b++) {
      h ^= (v >> (8 * b)) & 0xff;
      h *= 1099511628211ull;
    }
  }
  return (int64_t)h;
}

hid_t probe__vlstr_type(void) {
  hid_t t = H5Tcopy(H5T_C_S1);
  if (t < 0) return t;
  if (H5Tset_size(t, H5T_VARIABLE) < 0 || H5Tset_cset(t, H5T_CSET_UTF8) < 0) {
    H5Tclose(t);
    return H5I_INVALID_HID;
  }
  return t;
}

/* ---- the process-wide HDF5 lock ------------------------------------------ */

static pthread_mutex_t h5_mu;
static pthread_once_t h5_once = PTHREAD_ONCE_INIT;

static void h5_mu_create(void) {
  pthread_mutexattr_t a;
  pthread_mutexattr_init(&a);
  pthread_mutexattr_settype(&a, PTHREAD_MUTEX_RECURSIVE);
  pthread_mutex_init(&h5_mu, &a);
  pthread_mutexattr_destroy(&a);
}

/* The descriptors under the traces this process writes (probe__h5_own_fd),
 * under h5_mu; a child of fork() gets them in h5_fork_child. */
static int *h5_own;
static int h5_n_own, h5_cap_own;
static int h5_own_lost; /* a descriptor the table could not hold */
/* fork() calls in this process's ancestry: bumped in each child (sessions
 * compare it with the one they were opened under, session.c) */
static atomic_int fork_gen;
/* 1 in a child of fork() that inherited traces open for writing: its exit
 * leaves HDF5 alone (h5_exit_cleanup) */
static atomic_int h5_inherited;

void probe__h5_own_fd(int fd) {
  if (fd < 0) return;
  if (h5_n_own == h5_cap_own) { /* grown here, never in the fork handler */
    int cap = h5_cap_own ? 2 * h5_cap_own : 16;
    int *p = realloc(h5_own, (size_t)cap * sizeof *p);
    if (!p) {
      h5_own_lost = 1; /* a child then leaves HDF5 alone anyway */
      return;
    }
    h5_own = p;
    h5_cap_own = cap;
  }
  h5_own[h5_n_own++] = fd;
}

void probe__h5_disown_fd(int fd) {
  for (int i = 0; i < h5_n_own; i++)
    if (h5_own[i] == fd) {
      h5_own[i] = h5_own[--h5_n_own];
      return;
    }
}

/* In a child of fork(): the parent's traces are the parent's. HDF5's copy
 * here still holds them open, and a flush of it - H5close at the child's
 * exit() - would write that copy's stale metadata into the parent's live
 * file (a trace the reader then refused as corrupt). Each descriptor is
 * pointed at a sink of its own (an empty memory file: writes taken, reads
 * of zeros; /dev/null without memfd_create), and the child's exit does no
 * HDF5 clean-up. Only system calls: no HDF5, no locks. */
int probe__fd_to_sink(int fd, const char *name) {
  int sink = -1;
#ifdef MFD_CLOEXEC
  sink = memfd_create(name, MFD_CLOEXEC);
#else
  (void)name;
#endif
  if (sink < 0) sink = open("/dev/null", O_RDWR | O_CLOEXEC);
  if (sink < 0) return -1;
  int r = dup3(sink, fd, O_CLOEXEC); /* stays close-on-exec */
  close(sink);
  return r < 0 ? -1 : 0;
}

static void h5_fork_child_sinks(void) {
  for (int i = 0; i < h5_n_own; i++)
    probe__fd_to_sink(h5_own[i], "ampprobe-inherited-trace");
  if (h5_n_own > 0 || h5_own_lost) atomic_store(&h5_inherited, 1);
  h5_n_own = 0;
}

/* fork() while a writer thread is inside HDF5 would leave the child an
 * HDF5 in the middle of a call, and a lock owned by a thread it lacks:
 * fork waits for the lock, and the child re-creates it. */
static void h5_fork_prepare(void) { pthread_mutex_lock(&h5_mu); }
static void h5_fork_parent(void) { pthread_mutex_unlock(&h5_mu); }
static void h5_fork_child(void) {
  atomic_fetch_add(&fork_gen, 1);
  h5_fork_child_sinks();
  h5_mu_create();
}

static void h5_mu_init(void) {
  h5_mu_create();
  pthread_atfork(h5_fork_prepare, h5_fork_parent, h5_fork_child);
}

/* HDF5's automatic error printing is process-wide state, the host's as
 * much as ours: libprobe reports its own errors, so it silences the
 * printer while it holds the lock and gives the host's back (whatever it
 * was: HDF5's default, h5py's, none) when the outermost hold ends. Both
 * under h5_mu. */
static int h5_depth;
static H5E_auto2_t h5_host_func;
static void *h5_host_data;

void probe__h5_lock(void) {
  pthread_once(&h5_once, h5_mu_init);
  pthread_mutex_lock(&h5_mu);
  if (h5_depth++ == 0) {
    if (H5Eget_auto2(H5E_DEFAULT, &h5_host_func, &h5_host_data) < 0) {
      h5_host_func = NULL;
      h5_host_data = NULL;
    }
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
  }
}

void probe__h5_unlock(void) {
  if (--h5_depth == 0) H5Eset_auto2(H5E_DEFAULT, h5_host_func, h5_host_data);
  pthread_mutex_unlock(&h5_mu);
}

int probe__h5_fd(hid_t file) {
  void *handle = NULL;
  if (H5Fget_vfd_handle(file, H5P_DEFAULT, &handle) < 0 || handle == NULL) {
    H5Eclear2(H5E_DEFAULT);
    return -1;
  }
  return *(int *)handle; /* the sec2 driver's handle is its descriptor */
}

void probe__h5_cloexec(hid_t file) {
  int fd = probe__h5_fd(file);
  int fl = fd >= 0 ? fcntl(fd, F_GETFD) : -1;
  if (fl >= 0) fcntl(fd, F_SETFD, fl | FD_CLOEXEC);
}

/* ---- HDF5's clean-up at exit (format.h) ----------------------------------- */

static atomic_int h5_close_failed, h5_failed_call;

void probe__h5_close_failed(void) { atomic_store(&h5_close_failed, 1); }

void probe__h5_failed_call(void) { atomic_store(&h5_failed_call, 1); }

void probe__h5_close_id(hid_t id) {
  switch (H5Iget_type(id)) {
  case H5I_FILE: H5Fclose(id); break;
  case H5I_GROUP: H5Gclose(id); break;
  case H5I_DATASET: H5Dclose(id); break;
  case H5I_DATATYPE: H5Tclose(id); break;
  case H5I_ATTR: H5Aclose(id); break;
  default: break;
  }
}

/* Closes every HDF5 id still open in the process - the host's included -
 * objects first, then the files, which flushes those open for writing, as
 * H5close's first pass would. */
static void h5_close_open_ids(void) {
  ssize_t n = H5Fget_obj_count(H5F_OBJ_ALL, H5F_OBJ_ALL);
  if (n <= 0) return;
  hid_t *ids = malloc((size_t)n * sizeof *ids);
  if (ids == NULL) return;
  n = H5Fget_obj_ids(H5F_OBJ_ALL, H5F_OBJ_ALL, (size_t)n, ids);
  for (int files = 0; files < 2; files++)
    for (ssize_t i = 0; i < n; i++)
      if ((H5Iget_type(ids[i]) == H5I_FILE) == files) probe__h5_close_id(ids[i]);
  free(ids);
}

static void h5_exit_cleanup(void) {
  if (atomic_load(&h5_close_failed) || atomic_load(&h5_inherited)) return;
  if (!atomic_load(&h5_failed_call)) {
    H5close();
    return;
  }
  H5E_BEGIN_TRY { h5_close_open_ids(); }
  H5E_END_TRY;
}

__attribute__((constructor)) static void h5_exit_guard(void) {
  /* Before the host's first HDF5 call, HDF5 has registered nothing yet. If
   * it has (HDF5 initialised by another constructor), its own handler stays
   * and this one's H5close finds the library closed already. */
  if (H5dont_atexit() >= 0) atexit(h5_exit_cleanup);
}

int probe__fork_generation(void) {
  pthread_once(&h5_once, h5_mu_init); /* the fork handlers registered */
  return atomic_load(&fork_gen);
}

int probe__forked_since(int generation) {
  return generation != atomic_load_explicit(&fork_gen, memory_order_relaxed);
}

void probe__h5_lock_child_reset(void) {
  pthread_once(&h5_once, h5_mu_init);
  h5_mu_create(); /* the copy in the child is owned by a thread it lacks */
}

int probe__utf8_len(const unsigned char *p) {
  unsigned c = p[0];
  int n;
  unsigned min;
  if (c >= 0xc2 && c <= 0xdf)
    n = 2, min = 0x80;
  else if (c >= 0xe0 && c <= 0xef)
    n = 3, min = 0x800;
  else if (c >= 0xf0 && c <= 0xf4)
    n = 4, min = 0x10000;
  else
    return 0;
  unsigned cp = c & (0x7f >> n);
  for (int i = 1; i < n; i++) {
    if ((p[i] & 0xc0) != 0x80) return 0;
    cp = (cp << 6) | (p[i] & 0x3f);
  }
  if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return 0;
  return n;
}

int probe__utf8_valid(const char *s) {
  const unsigned char *p = (const unsigned char *)s;
  while (*p) {
    int n = *p < 0x80 ? 1 : probe__utf8_len(p);
    if (n == 0) return 0;
    p += n;
  }
  return 1;
}

/* ---- escaping names for messages (probe_text_escape's rules) ---------- */

/* Appends one unit (a byte, an escape, a UTF-8 sequence) of n bytes: whole,
 * or - once one did not fit - no more at all, so a short buffer holds a
 * prefix of whole units, never half an escape or half a character. */
typedef struct esc_out {
  char *out;
  size_t cap;
  size_t k; /* the length the whole escaped text needs */
  size_t w; /* bytes written: whole units only, always < cap */
} esc_out;

static void esc_put(esc_out *o, const void *unit, size_t n) {
  if (o->w == o->k && o->k + n < o->cap) {
    memcpy(o->out + o->w, unit, n);
    o->w += n;
  }
  o->k += n;
}

/* The escape of byte c, or NULL when c is not one of the named ones. */
static const char *esc_named(unsigned c) {
  switch (c) {
  case '\n': return "\\n";
  case '\r': return "\\r";
  case '\t': return "\\t";
  case 0x1b: return "\\e";
  case 0x07: return "\\a";
  case '\b': return "\\b";
  case '\f': return "\\f";
  case '\v': return "\\v";
  case '\\': return "\\\\";
  default: return NULL;
  }
}

/* The code point of the n-byte UTF-8 sequence at p when it is a
 * bidirectional formatting control, else 0: U+061C (ARABIC LETTER MARK),
 * U+200E/U+200F (LRM, RLM), U+202A..U+202E (the embeddings and overrides)
 * and U+2066..U+2069 (the isolates). Shown, they reorder the text that
 * follows them (a name that displays as another, a line that reads
 * backwards), so they are escaped like the C1 controls. */
unsigned probe__bidi_control(const unsigned char *p, int n) {
  if (n == 2 && p[0] == 0xd8 && p[1] == 0x9c) return 0x061c;
  if (n != 3 || p[0] != 0xe2) return 0;
  if (p[1] == 0x80 && (p[2] == 0x8e || p[2] == 0x8f ||
                       (p[2] >= 0xaa && p[2] <= 0xae)))
    return 0x2000u | (p[2] & 0x3fu);
  if (p[1] == 0x81 && p[2] >= 0xa6 && p[2] <= 0xa9)
    return 0x2040u | (p[2] & 0x3fu);
  return 0;
}

size_t probe__text_escape(char *out, size_t cap, const char *s) {
  esc_out o = {out, cap, 0, 0};
  const unsigned char *p = (const unsigned char *)(s ? s : "");
  char e[16];
  while (*p) {
    unsigned c = *p;
    const char *named = esc_named(c);
    int n = c >= 0x80 ? probe__utf8_len(p) : 0;
    if (named) {
      esc_put(&o, named, strlen(named));
      p++;
    } else if (c >= 0x20 && c < 0x7f) {
      esc_put(&o, p, 1);
      p++;
    } else if (n == 2 && c == 0xc2 && p[1] < 0xa0) { /* C1 U+0080..U+009F */
      snprintf(e, sizeof e, "\\u%04x", (unsigned)p[1]);
      esc_put(&o, e, 6);
      p += 2;
    } else if (n > 0 && probe__bidi_control(p, n)) { /* U+202E as \u202e */
      snprintf(e, sizeof e, "\\u%04x", probe__bidi_control(p, n));
      esc_put(&o, e, 6);
      p += n;
    } else if (n > 0) {
      esc_put(&o, p, (size_t)n);
      p += n;
    } else {
      snprintf(e, sizeof e, "\\x%02x", c);
      esc_put(&o, e, 4);
      p++;
    }
  }
  if (cap) out[o.w] = 0;
  return o.k;
}

int probe__step_flags_ok(const probe_step_scalars *s) {
  return (s->found_inf == 0 || s->found_inf == 1) &&
         (s->skipped == 0 || s->skipped == 1);
}

const char *probe__scaler_event_why(const probe_scaler_event *e) {
  if (e->step < 0) return "a negative step";
  if (e->kind < PROBE_SCALER_BACKOFF || e->kind > PROBE_SCALER_MIN_CLAMP)
    return "an unknown kind";
  /* A loss scaler's scale is finite and >= 0 (PyTorch's refuses an inf
   * growth; a backoff can reach 0): NaN, inf or below 0 is no scale. */
  if (!(isfinite(e->old_scale) && e->old_scale >= 0) ||
      !(isfinite(e->new_scale) && e->new_scale >= 0))
    return "a loss scale that is NaN, infinite or negative";
  if (e->growth_tracker < 0) return "a negative growth tracker";
  return NULL;
}
