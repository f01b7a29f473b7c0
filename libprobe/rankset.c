/*
 * rankset.c - multi-rank traces: the weight digest (probe_digest64), the
 * naming rule of one rank's trace (probe_rank_trace_path) and the expansion
 * of what a user names as a set of traces - directory, glob or list - into
 * file paths in natural order (probe_trace_set_expand). The rules are
 * docs/trace-format.md, "Multi-rank traces". No HDF5 here.
 */
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <errno.h>
#include <glob.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "ampprobe/probe.h"
#include "format.h"

#define FNV64_PRIME 1099511628211ull

uint64_t probe_digest64(const void *data, size_t nbytes, uint64_t h) {
  const unsigned char *p = data;
  for (size_t i = 0; i < nbytes; i++) {
    h ^= p[i];
    h *= FNV64_PRIME;
  }
  return h;
}

/* ---- the naming rule ----------------------------------------------------- */

#define RANK_TOKEN "{rank}"

/* Appends n bytes of s at out[*len] if they fit with a NUL; 0 or -1. */
static int put(char *out, size_t cap, size_t *len, const char *s, size_t n) {
  if (n >= cap - *len) return -1;
  memcpy(out + *len, s, n);
  *len += n;
  out[*len] = '\0';
  return 0;
}

probe_status probe_rank_trace_path(char *out, size_t cap, const char *path,
                                   int rank) {
  if (out == NULL || cap == 0) return PROBE_ERR_INVALID_ARG;
  out[0] = '\0';
  if (path == NULL || *path == '\0' || rank < 0) return PROBE_ERR_INVALID_ARG;
  char num[16];
  int nlen = snprintf(num, sizeof num, "%d", rank);
  size_t len = 0;
  int rc = 0;
  const char *tok = strstr(path, RANK_TOKEN);
  if (tok != NULL) {
    const char *p = path;
    for (; tok != NULL && rc == 0; tok = strstr(p, RANK_TOKEN)) {
      rc = put(out, cap, &len, p, (size_t)(tok - p));
      if (rc == 0) rc = put(out, cap, &len, num, (size_t)nlen);
      p = tok + strlen(RANK_TOKEN);
    }
    if (rc == 0) rc = put(out, cap, &len, p, strlen(p));
  } else {
    size_t plen = strlen(path);
    int has_h5 = plen >= 3 && strcmp(path + plen - 3, ".h5") == 0;
    size_t stem = has_h5 ? plen - 3 : plen;
    rc = put(out, cap, &len, path, stem);
    if (rc == 0) rc = put(out, cap, &len, ".rank", 5);
    if (rc == 0) rc = put(out, cap, &len, num, (size_t)nlen);
    if (rc == 0) rc = put(out, cap, &len, ".h5", 3);
  }
  if (rc != 0) {
    out[0] = '\0';
    return PROBE_ERR_INVALID_ARG;
  }
  return PROBE_OK;
}

/* ---- trace sets ---------------------------------------------------------- */

typedef struct pathlist {
  char **v;
  size_t n, cap;
} pathlist;

static int list_add(pathlist *l, const char *a, const char *b) {
  if (l->n == l->cap) {
    size_t cap = l->cap ? l->cap * 2 : 16;
    char **v = realloc(l->v, cap * sizeof *v);
    if (v == NULL) return -1;
    l->v = v;
    l->cap = cap;
  }
  size_t la = strlen(a), lb = b ? strlen(b) : 0;
  int slash = b && la > 0 && a[la - 1] != '/';
  char *s = malloc(la + (size_t)slash + lb + 1);
  if (s == NULL) return -1;
  memcpy(s, a, la);
  if (slash) s[la] = '/';
  if (b) memcpy(s + la + slash, b, lb);
  s[la + slash + lb] = '\0';
  l->v[l->n++] = s;
  return 0;
}

static int is_digit(char c) { return c >= '0' && c <= '9'; }

/* Natural order: runs of digits compare as numbers (leading zeros aside),
 * everything else byte by byte; equal under that, plain strcmp decides,
 * so that the order is total ("rank02" and "rank2" stay two). */
static int natcmp(const char *a, const char *b) {
  const char *p = a, *q = b;
  while (*p && *q) {
    if (is_digit(*p) && is_digit(*q)) {
      while (*p == '0') p++;
      while (*q == '0') q++;
      size_t lp = 0, lq = 0;
      while (is_digit(p[lp])) lp++;
      while (is_digit(q[lq])) lq++;
      if (lp != lq) return lp < lq ? -1 : 1;
      int c = memcmp(p, q, lp);
      if (c != 0) return c < 0 ? -1 : 1;
      p += lp;
      q += lq;
      continue;
    }
    if (*p != *q) return (unsigned char)*p < (unsigned char)*q ? -1 : 1;
    p++;
    q++;
  }
  if (*p || *q) return *p ? 1 : -1;
  return strcmp(a, b);
}

static int natcmp_qsort(const void *x, const void *y) {
  return natcmp(*(char *const *)x, *(char *const *)y);
}

static int has_glob_chars(const char *s) { return strpbrk(s, "*?[") != NULL; }

static int ends_h5(const char *name) {
  size_t n = strlen(name);
  return n > 3 && strcmp(name + n - 3, ".h5") == 0;
}

/* Whether dir's entry (its path) joins the set: a regular file or a
 * symlink to one, and also a FIFO, socket or device, so that opening it
 * says it is not a regular file (left out, the post-mortem called a FIFO
 * t.rank2.h5 "rank 2: no file"). A directory named x.h5 or a dangling
 * link is no file. */
static int dir_entry_joins(const char *path) {
  struct stat sb;
  return stat(path, &sb) == 0 && !S_ISDIR(sb.st_mode);
}

/* The .h5 entries directly in dir that dir_entry_joins; none is
 * PROBE_ERR_NOT_FOUND. */
static probe_status add_dir(pathlist *l, const char *dir) {
  DIR *d = opendir(dir);
  if (d == NULL) {
    probe__trace_open_msg("%s: %s", dir, strerror(errno));
    return PROBE_ERR_IO;
  }
  size_t before = l->n;
  probe_status st = PROBE_OK;
  struct dirent *e;
  while (st == PROBE_OK && (e = readdir(d)) != NULL) {
    if (!ends_h5(e->d_name)) continue;
    if (list_add(l, dir, e->d_name) < 0) {
      st = PROBE_ERR_NOMEM;
      break;
    }
    if (!dir_entry_joins(l->v[l->n - 1])) free(l->v[--l->n]);
  }
  closedir(d);
  if (st == PROBE_ERR_NOMEM) {
    probe__trace_open_msg("out of memory");
    return st;
  }
  if (l->n == before) {
    probe__trace_open_msg("%s: no .h5 files in this directory", dir);
    return PROBE_ERR_NOT_FOUND;
  }
  return PROBE_OK;
}

static probe_status add_glob(pathlist *l, const char *pattern) {
  glob_t g;
  memset(&g, 0, sizeof g);
  int rc = glob(pattern, 0, NULL, &g);
  probe_status st = PROBE_OK;
  if (rc == GLOB_NOMATCH || (rc == 0 && g.gl_pathc == 0)) {
    /* the name may have been meant as a file ("run[1].h5"): say both */
    probe__trace_open_msg("%s: no such file, and no file matches this "
                          "pattern", pattern);
    st = PROBE_ERR_NOT_FOUND;
  } else if (rc == GLOB_NOSPACE) {
    probe__trace_open_msg("out of memory");
    st = PROBE_ERR_NOMEM;
  } else if (rc != 0) {
    probe__trace_open_msg("%s: cannot read a directory of this pattern",
                          pattern);
    st = PROBE_ERR_IO;
  }
  for (size_t i = 0; st == PROBE_OK && i < g.gl_pathc; i++)
    if (list_add(l, g.gl_pathv[i], NULL) < 0) {
      probe__trace_open_msg("out of memory");
      st = PROBE_ERR_NOMEM;
    }
  globfree(&g);
  return st;
}

static probe_status add_arg(pathlist *l, const char *arg) {
  struct stat sb;
  int exists = stat(arg, &sb) == 0;
  if (exists && S_ISDIR(sb.st_mode)) return add_dir(l, arg);
  if (!exists && has_glob_chars(arg)) return add_glob(l, arg);
  if (list_add(l, arg, NULL) < 0) {
    probe__trace_open_msg("out of memory");
    return PROBE_ERR_NOMEM;
  }
  return PROBE_OK;
}

void probe_trace_set_free(char **paths, size_t n) {
  if (paths == NULL) return;
  for (size_t i = 0; i < n; i++) free(paths[i]);
  free(paths);
}

probe_status probe_trace_set_expand(const char *const *args, size_t n_args,
                                    char ***paths_out, size_t *n_out) {
  if (paths_out) *paths_out = NULL;
  if (n_out) *n_out = 0;
  if (paths_out == NULL || n_out == NULL || (args == NULL && n_args > 0)) {
    probe__trace_open_msg("probe_trace_set_expand: NULL argument");
    return PROBE_ERR_INVALID_ARG;
  }
  if (n_args == 0) {
    probe__trace_open_msg("no trace named");
    return PROBE_ERR_NOT_FOUND;
  }
  pathlist l = {NULL, 0, 0};
  probe_status st = PROBE_OK;
  for (size_t i = 0; i < n_args && st == PROBE_OK; i++) {
    if (args[i] == NULL || args[i][0] == '\0') {
      probe__trace_open_msg("probe_trace_set_expand: empty argument %zu", i);
      st = PROBE_ERR_INVALID_ARG;
    } else {
      st = add_arg(&l, args[i]);
    }
  }
  if (st != PROBE_OK) {
    probe_trace_set_free(l.v, l.n);
    return st;
  }
  qsort(l.v, l.n, sizeof *l.v, natcmp_qsort);
  size_t w = 0;
  for (size_t i = 0; i < l.n; i++) {
    if (w > 0 && strcmp(l.v[w - 1], l.v[i]) == 0) free(l.v[i]);
    else l.v[w++] = l.v[i];
  }
  *paths_out = l.v;
  *n_out = w;
  probe__trace_open_msg("%s", "");
  return PROBE_OK;
}
