/*
 * libprobe/analysis/analysis-impl.h - what the analysis library's own files
 * share and nobody else sees (`probe__` prefix, no export macro):
 *
 *   - a JSON writer into a growing buffer (probe__jw): the one place the
 *     post-mortem and diff documents are made, so `ampprobe postmortem
 *     --json` and probe_postmortem_json() cannot differ;
 *   - a tiny JSON reader that flattens a document into (path, value) leaves
 *     ("scaler.enabled" -> true, "fp32[0]" -> "revin"): enough to read the
 *     few keys of the stored run config and to compare two configs key by
 *     key, without a JSON library;
 *
 * JSON numbers: a finite double is written in the shortest %.15g/%.17g form
 * that reads back exactly; +inf, -inf and NaN, which JSON cannot hold, are
 * written as the strings "inf", "-inf" and "nan" (probe__jw_num). A value
 * that is absent ("no data": a fraction of zero values, a statistic of an
 * empty tensor) is null (probe__jw_opt).
 */
#ifndef AMPPROBE_ANALYSIS_IMPL_H
#define AMPPROBE_ANALYSIS_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "ampprobe/analysis.h"

/* A step scalar that was not measured (libprobe's
 * probe_step_scalars.unmeasured bits, where this libprobe has them) is
 * absent: never a non-finite value, never a loss or a scale. */
#ifdef PROBE_SCALAR_LOSS
#define PROBE__UNMEASURED(row, bit) (((row)->unmeasured & (bit)) != 0)

/* The fix of a value born in the gradient all-reduce (one text for the
 * cross-rank origin and a rank's own diagnosis). */
#define PROBE__ALLREDUCE_FIX                                                   \
  "all-reduce the gradients in FP32 (--allreduce-dtype fp32), or pre-divide " \
  "them by the world size before an FP16 sum (--allreduce-prediv)"
#define PROBE__SC_LOSS PROBE_SCALAR_LOSS
#define PROBE__SC_SCALE PROBE_SCALAR_LOSS_SCALE
#define PROBE__SC_SCALER PROBE_SCALAR_SCALER
#define PROBE__SC_LR PROBE_SCALAR_LR
#else
#define PROBE__UNMEASURED(row, bit) ((void)(row), (void)(bit), 0)
#define PROBE__SC_LOSS 1u
#define PROBE__SC_SCALE 2u
#define PROBE__SC_SCALER 4u
#define PROBE__SC_LR 8u
#endif

/* The caller's progress callback over the passes of one analysis (phase
 * one of the PROBE_PROGRESS_* strings): done counts the rows read of total;
 * stopped once it asked to stop. fn NULL: nothing (probe__progress_add). */
typedef struct probe__progress {
  probe_progress_fn fn;
  void *user;
  const char *phase;
  uint64_t done, total;
  int stopped;
} probe__progress;

/* n more rows read: the callback told (done clamped to total);
 * PROBE_ERR_INTERRUPTED once it asks to stop. p or p->fn NULL: PROBE_OK. */
probe_status probe__progress_add(probe__progress *p, size_t n);

#define PROBE__JW_DEPTH 32

typedef struct probe__jw {
  char *buf;
  size_t len, cap;
  int oom;
  int depth;
  int n_items[PROBE__JW_DEPTH]; /* items written at each open level */
} probe__jw;

void probe__jw_init(probe__jw *w);
/* The document (malloc'd, NUL-terminated) or NULL when memory ran out; the
 * writer is reset either way. */
char *probe__jw_finish(probe__jw *w);
void probe__jw_free(probe__jw *w);

/* key is the member name inside an object, NULL inside an array or at the
 * top level. */
void probe__jw_obj(probe__jw *w, const char *key);
void probe__jw_arr(probe__jw *w, const char *key);
void probe__jw_end(probe__jw *w, char close); /* '}' or ']' */
void probe__jw_str(probe__jw *w, const char *key, const char *s); /* NULL: null */
void probe__jw_int(probe__jw *w, const char *key, int64_t v);
void probe__jw_step(probe__jw *w, const char *key, int64_t v); /* <0: null */
void probe__jw_num(probe__jw *w, const char *key, double v); /* inf: "inf" */
void probe__jw_opt(probe__jw *w, const char *key, double v); /* NaN: null */
void probe__jw_bool(probe__jw *w, const char *key, int v);
void probe__jw_null(probe__jw *w, const char *key);
void probe__jw_raw(probe__jw *w, const char *key, const char *json);

/* ---- reading: a flattened document ---------------------------------------- */

typedef enum probe__jv_type {
  PROBE__JV_NULL,
  PROBE__JV_BOOL,
  PROBE__JV_NUM,
  PROBE__JV_STR,
  PROBE__JV_EMPTY /* [] or {} */
} probe__jv_type;

typedef struct probe__jleaf {
  char *path;  /* "a.b[2].c" ("(root)" for a scalar document) */
  char *raw;   /* the value's JSON text as written */
  char *str;   /* decoded string (PROBE__JV_STR), else NULL */
  probe__jv_type type;
  int boolean;
  double num;
} probe__jleaf;

typedef struct probe__jflat {
  probe__jleaf *leaf;
  size_t n, cap;
  const probe__jleaf **by_path; /* (n) leaves by path, then document order */
} probe__jflat;

/* The longest JSON text parsed: a trace's configuration is a few KiB; a
 * hostile 40 MB one took 2.1 GB and 76 s as leaves. */
#define PROBE__JFLAT_MAX_BYTES (4u << 20)

/* PROBE_OK, PROBE_ERR_CONFIG for text that is not JSON (or nested deeper
 * than 32, or longer than PROBE__JFLAT_MAX_BYTES), PROBE_ERR_NOMEM. */
probe_status probe__jflat_parse(probe__jflat *f, const char *text);
void probe__jflat_free(probe__jflat *f);
/* The first leaf (in document order) at path, or NULL: O(log n). */
const probe__jleaf *probe__jflat_get(const probe__jflat *f, const char *path);

/* Rows per chunked read (diag and diff options): 0 is the default, more
 * than PROBE_CHUNK_ROWS_MAX is that. */
#define PROBE__CHUNK_ROWS_DEFAULT 4096
static inline size_t probe__chunk_rows(size_t asked) {
  return asked == 0                     ? PROBE__CHUNK_ROWS_DEFAULT
         : asked > PROBE_CHUNK_ROWS_MAX ? PROBE_CHUNK_ROWS_MAX
                                        : asked;
}

#endif /* AMPPROBE_ANALYSIS_IMPL_H */
