/*
 * probe_testutil.h - helpers shared by the libprobe tests: deterministic
 * tensors derived from (step, seq) so a reader can recompute what a writer
 * recorded, temporary paths, and a small trace writer.
 */
#ifndef AMPPROBE_TESTS_PROBE_TESTUTIL_H
#define AMPPROBE_TESTS_PROBE_TESTUTIL_H

#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include "ampprobe/probe.h"

#define PT_CHECK(call)                                                         \
  do {                                                                         \
    probe_status st_ = (call);                                                 \
    ck_assert_msg(st_ == PROBE_OK, "%s -> %s", #call, probe_status_name(st_)); \
  } while (0)

/* Fills x (n floats) with values that depend on step and seq only. */
static inline void pt_tensor(float *x, size_t n, int64_t step, uint32_t seq) {
  uint32_t h = (uint32_t)(step * 2654435761u) ^ (seq * 40503u + 12345u);
  for (size_t i = 0; i < n; i++) {
    h = h * 1664525u + 1013904223u;
    /* exponents spread over about +-20 binades, both signs, some zeros */
    int e = (int)((h >> 8) % 41) - 20;
    float m = 1.0f + (float)((h >> 16) & 0xff) / 256.0f;
    x[i] = (h & 1u) ? ldexpf(m, e) : -ldexpf(m, e);
    if (((h >> 4) & 31u) == 0) x[i] = 0.0f;
  }
}

/* The statistics a reader must find for the tensor of (step, seq). */
static inline void pt_expected(probe_stats *st, size_t n, int64_t step,
                               uint32_t seq) {
  float *x = malloc(n * sizeof *x);
  pt_tensor(x, n, step, seq);
  probe_stats_compute(st, PROBE_DTYPE_F32, x, n);
  free(x);
}

/* The files of one test process live in one folder of their own,
 * TMPDIR (or /tmp)/ampprobe-test-PID-XXXXXX/, made (mkdtemp: a new folder,
 * never one already there, which a pid reused or another user could have
 * left, or planted as a symlink) at the first pt_path of that process and
 * removed with all it holds when the process exits (atexit): the files a
 * test derives from a pt_path (NAME.bad.h5, NAME.own.h5, the writer's
 * temporaries) go with it, whether the test unlinks them or not, and a
 * test run leaves /tmp as it found it. A forked child that makes no
 * pt_path of its own leaves its parent's folder alone at its exit; one
 * that does gets its own folder (Check runs each test in such a child).
 * A TMPDIR too long for a path is a failed check, never a folder made
 * elsewhere; any TMPDIR name works (the removal runs no shell). */
static pid_t pt_dir_owner;
static int pt_dir_registered;
static char pt_dir_path[PATH_MAX];

/* Removes name (relative to folder dfd) and, when it is a folder,
 * everything in it; symbolic links are removed, never followed. 0, or -1
 * when something stayed. */
static inline int pt_remove_at(int dfd, const char *name) {
  if (unlinkat(dfd, name, 0) == 0 || errno == ENOENT) return 0;
  if (errno != EISDIR && errno != EPERM) return -1; /* EPERM: POSIX's */
  int fd = openat(dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return -1;
  DIR *d = fdopendir(fd);
  if (!d) {
    close(fd);
    return -1;
  }
  int rc = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    if (pt_remove_at(dirfd(d), e->d_name) != 0) rc = -1;
  }
  closedir(d);
  if (unlinkat(dfd, name, AT_REMOVEDIR) != 0 && errno != ENOENT) rc = -1;
  return rc;
}

static inline void pt_dir_remove(void) {
  if (getpid() != pt_dir_owner || !pt_dir_path[0]) return;
  if (pt_remove_at(AT_FDCWD, pt_dir_path) != 0)
    fprintf(stderr, "could not remove %s: %s\n", pt_dir_path, strerror(errno));
  pt_dir_path[0] = '\0';
}

static inline const char *pt_dir(void) {
  if (pt_dir_owner != getpid()) {
    const char *dir = getenv("TMPDIR");
    if (!dir || !*dir) dir = "/tmp";
    int n = snprintf(pt_dir_path, sizeof pt_dir_path,
                     "%s/ampprobe-test-%d-XXXXXX", dir, (int)getpid());
    ck_assert_msg(n > 0 && (size_t)n < sizeof pt_dir_path,
                  "TMPDIR too long for a test folder (%d bytes): %s", n, dir);
    ck_assert_msg(mkdtemp(pt_dir_path) != NULL, "mkdtemp %s: %s",
                  pt_dir_path, strerror(errno));
    pt_dir_owner = getpid();
    if (!pt_dir_registered) atexit(pt_dir_remove); /* inherited by forks */
    pt_dir_registered = 1;
  }
  return pt_dir_path;
}

/* A fresh path in the process's test folder (pt_dir), unique per tag; a
 * buffer too short for it is a failed check (never a truncated path). */
static inline void pt_path(char *buf, size_t len, const char *tag) {
  int n = snprintf(buf, len, "%s/%s.h5", pt_dir(), tag);
  ck_assert_msg(n > 0 && (size_t)n < len, "pt_path(%s): %d bytes, buffer %zu",
                tag, n, len);
}

/* Reads the whole file at path into a malloc'd buffer (*data, *size). */
static inline void pt_load(const char *path, char **data, size_t *size) {
  FILE *f = fopen(path, "rb");
  ck_assert_ptr_nonnull(f);
  fseek(f, 0, SEEK_END);
  *size = (size_t)ftell(f);
  fseek(f, 0, SEEK_SET);
  *data = malloc(*size);
  ck_assert_uint_eq(fread(*data, 1, *size, f), *size);
  fclose(f);
}

/* Reads every table of an open trace (records, steps, scaler events,
 * kernels, snapshots and their data) and checks every layer name is
 * terminated; returns the first error status or PROBE_OK. */
static inline probe_status pt_read_all(probe_trace *t) {
  probe_record r[16];
  probe_step_scalars sc[16];
  probe_scaler_event ev[16];
  probe_snapshot_info sn[16];
  probe_kernel_record k[4];
  size_t got;
  probe_status st;
#define SWEEP_(fn, buf, n)                                                     \
  for (int64_t at = 0;; at += (int64_t)got) {                                  \
    if ((st = fn(t, at, n, buf, &got)) != PROBE_OK) return st;                 \
    if (!got) break;                                                           \
  }
  SWEEP_(probe_trace_read_records, r, 16)
  SWEEP_(probe_trace_read_steps, sc, 16)
  SWEEP_(probe_trace_read_scaler_events, ev, 16)
  SWEEP_(probe_trace_read_kernels, k, 4)
#undef SWEEP_
  for (int64_t at = 0;; at += (int64_t)got) {
    if ((st = probe_trace_read_snapshots(t, at, 16, sn, &got)) != PROBE_OK)
      return st;
    for (size_t i = 0; i < got; i++) {
      float *v = malloc((size_t)sn[i].n * sizeof *v + 1);
      st = probe_trace_read_snapshot_data(t, &sn[i], v);
      free(v);
      if (st != PROBE_OK) return st;
    }
    if (!got) break;
  }
  size_t nl = 0;
  const probe_layer_info *l = probe_trace_layers(t, &nl);
  for (size_t i = 0; i < nl; i++) ck_assert(memchr(l[i].name, 0, PROBE_NAME_MAX));
  return PROBE_OK;
}

/* A session writing path (replaced if it exists) in the given mode. */
static inline probe_session *pt_open(const char *path, probe_record_mode mode) {
  probe_options o;
  probe_options_init(&o);
  o.overwrite = 1;
  o.mode = mode;
  probe_session *s = NULL;
  PT_CHECK(probe_session_open(&s, path, &o));
  return s;
}

/* A small complete trace at path: n steps of one fp16 layer. opt may set
 * the rank. */
static inline void pt_small_trace(const char *path, int steps,
                                  const probe_options *opt) {
  probe_options o;
  if (opt) o = *opt;
  else probe_options_init(&o);
  o.overwrite = 1;
  o.mode = PROBE_MODE_FULL;
  probe_session *s = NULL;
  PT_CHECK(probe_session_open(&s, path, &o));
  int32_t id;
  PT_CHECK(probe_layer_register(s, "l", PROBE_KIND_LINEAR, PROBE_DTYPE_F16, &id));
  float x[64];
  for (int step = 0; step < steps; step++) {
    PT_CHECK(probe_step_begin(s, step));
    pt_tensor(x, 64, step, 0);
    PT_CHECK(probe_tensor_record(s, id, PROBE_SITE_FWD_OUT, PROBE_DTYPE_F32, x, 64));
    probe_step_scalars sc = {.loss = 1.0, .loss_scale = 1.0};
    PT_CHECK(probe_step_set_scalars(s, &sc));
    PT_CHECK(probe_step_end(s));
  }
  PT_CHECK(probe_session_close(s));
}

#endif /* AMPPROBE_TESTS_PROBE_TESTUTIL_H */
