/*
 * libprobe/analysis/ranks-impl.h - what the cross-rank post-mortem's
 * summary pass (ranks_read.c: one file -> one rank summary, in this process
 * or in a child), its merge (ranks.c) and its renderers (ranks_render.c)
 * share. Internal.
 */
#ifndef AMPPROBE_RANKS_IMPL_H
#define AMPPROBE_RANKS_IMPL_H

#include <stdint.h>
#include <string.h>

#include "ampprobe/analysis.h"

/* The per-step values of one rank that every rank must agree on. */
typedef struct probe__rstep {
  int64_t step;
  double scale;
  uint64_t digest;
  uint8_t skipped;
  uint8_t has; /* bits: 1 scale, 2 skipped, 4 digest measured; 8 the
                  loss was measured and not finite */
} probe__rstep;

#define PROBE__RS_SCALE 1u
#define PROBE__RS_SKIPPED 2u
#define PROBE__RS_DIGEST 4u
#define PROBE__RS_LOSS_NF 8u

/* One file's summary: the entry (path and error not set) and its steps. */
typedef struct probe__rsum {
  probe_rank_entry e;
  char run_id[PROBE_NAME_MAX * 2]; /* raw */
  char error[PROBE_RANKS_TEXT_MAX]; /* unreadable: why */
  probe__rstep *steps;              /* e.n_steps rows, growing buffer */
  size_t cap_steps;
  /* set by the caller: -1, the first pass (normal scaler backoffs are not
   * events); else the second pass: the first non-finite record at or after
   * this step, backoffs included (the merge asks it of ranks whose role at
   * the set's first step it needs) */
  int64_t raw_from;
} probe__rsum;

/* Summarises the trace at path into s (in this process; s->steps reused).
 * An unreadable file is s->e.status PROBE_RANK_UNREADABLE, PROBE_OK;
 * only running out of memory is an error. */
probe_status probe__rank_read(probe__rsum *s, const char *path);

/* The same in a forked worker process that summarises paths[i..n) in
 * order (started at the first call, and again after a worker died): a
 * crash or a hang of HDF5 on a malformed file makes that file
 * "unreadable" and the next worker goes on with the file after it. Call
 * with i = 0, 1, ... in order; stop the worker with probe__rworker_stop
 * (status NULL: kill it). */
typedef struct probe__rworker {
  int pid; /* -1: none running */
  int fd;
} probe__rworker;

void probe__rworker_init(probe__rworker *w);
void probe__rworker_stop(probe__rworker *w, int *status);
probe_status probe__rank_read_isolated(probe__rworker *w, probe__rsum *s,
                                       const char *const *paths, size_t n,
                                       size_t i);

/* A rank read whose trace is closed with the join mark: it ran out of
 * inputs and joined the others (uneven inputs), so ending before them is
 * no fault. */
static inline int probe__rank_joined(const probe_rank_entry *e) {
  return e->status == PROBE_RANK_READ && e->complete && e->joined;
}

/* A rank read whose trace carries the abort mark: a signal or an
 * exception ended the job, the tracer closed the trace (complete 0: it
 * counts as not closed); e->aborted says what. */
static inline int probe__rank_aborted(const probe_rank_entry *e) {
  return e->status == PROBE_RANK_READ && !e->complete && e->aborted[0];
}

/* A rank read whose trace is closed, without the join mark, before the
 * furthest rank's last step: an exception or an early exit on it. */
static inline int probe__rank_ended_early(const probe_ranks *r,
                                          const probe_rank_entry *e) {
  return e->status == PROBE_RANK_READ && e->complete && !e->joined &&
         e->last_step < r->max_last_step;
}

/* by_status of probe__rank_list: the ranks that joined
 * (probe__rank_joined). */
#define PROBE__RANKS_BY_JOINED 2
/* by_status of probe__rank_list: the ranks aborted (probe__rank_aborted). */
#define PROBE__RANKS_BY_ABORTED 3

/* "0-3, 5, 9-11": the ranks of entries whose role (or status, when
 * by_status is 1; joined when PROBE__RANKS_BY_JOINED, want unused) is
 * `want`, into buf; the count is returned. */
int64_t probe__rank_list(const probe_ranks *r, int by_status, int32_t want,
                         char *buf, size_t cap);

/* A set of one file (a directory's or a glob's only trace): is the file
 * read a rank of a job of several ranks (it gets the cross-rank document,
 * its missing ranks named), rather than a one-process trace (its focus's
 * post-mortem)? Its missing ranks are entries too: the read one decides.
 * Shared by the library's JSON and the CLI (tools/postmortem.c), so the
 * two cannot disagree on which document a file gets. */
int probe__ranks_read_one_of_many(const probe_ranks *r);

/* msg without a leading "PATH: " (the reader's words name the file first;
 * an entry or a line that names the file already drops it). */
static inline const char *probe__msg_after_path(const char *msg,
                                                const char *path) {
  size_t pl = strlen(path);
  return msg && !strncmp(msg, path, pl) && msg[pl] == ':' && msg[pl + 1] == ' '
             ? msg + pl + 2
             : msg;
}

#endif /* AMPPROBE_RANKS_IMPL_H */
