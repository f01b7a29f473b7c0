/*
 * libprobe/analysis/postmortem.c - probe_postmortem_json: open, diagnose
 * and render one trace or several (the ranks of one job) in one call; the
 * entry point of the Python package and of `ampprobe postmortem --json`.
 */
#include <stdlib.h>
#include <string.h>

#include "../format.h" /* probe__trace_open_msg */
#include "analysis-impl.h"
#include "diagnose-impl.h"
#include "ranks-impl.h"

/* isolate: the *_isolated entry points (a child process reads each file
 * first, probe_trace_open_isolated; the rank files through one worker). */
static probe_status diagnose_path(const char *path, probe_diag *d, int isolate) {
  probe_trace *t = NULL;
  probe_status st = isolate ? probe_trace_open_isolated(&t, path, NULL, 0)
                            : probe_trace_open(&t, path);
  if (st < 0) return st;
  st = probe_diag_run(d, t, path, NULL);
  /* a read refused during the analysis: its message where a failed open's
   * is, so that both entry points say the same */
  if (st < 0) probe__trace_open_msg("%s", probe_trace_last_error(t));
  probe_trace_close(t);
  return st;
}

/* Several traces none of which is a rank: one document per trace. */
static probe_status independent_json(const char *const *paths, size_t n_paths,
                                     int isolate, char **json_out) {
  probe_diag *d = calloc(n_paths, sizeof *d);
  if (!d) return PROBE_ERR_NOMEM;
  probe_status st = PROBE_OK;
  size_t done = 0;
  for (; done < n_paths && st >= 0; done++) {
    st = diagnose_path(paths[done], &d[done], isolate);
    if (st < 0) probe_diag_free(&d[done]);
  }
  if (st >= 0) {
    probe__jw w;
    probe__jw_init(&w);
    if (n_paths == 1) {
      probe__diag_json(&w, NULL, &d[0]);
    } else {
      probe_verdict worst = PROBE_VERDICT_HEALTHY;
      for (size_t i = 0; i < n_paths; i++)
        if (d[i].verdict > worst) worst = d[i].verdict;
      probe__jw_obj(&w, NULL);
      probe__jw_str(&w, "verdict", probe_verdict_name(worst));
      probe__jw_bool(&w, "problem", worst != PROBE_VERDICT_HEALTHY);
      probe__jw_arr(&w, "traces");
      for (size_t i = 0; i < n_paths; i++) probe__diag_json(&w, NULL, &d[i]);
      probe__jw_end(&w, ']');
      probe__jw_end(&w, '}');
    }
    *json_out = probe__jw_finish(&w);
    if (!*json_out) st = PROBE_ERR_NOMEM;
  }
  for (size_t i = 0; i < done; i++) probe_diag_free(&d[i]);
  free(d);
  return st < 0 ? st : PROBE_OK;
}

/* The rank files of one job: the cross-rank document. */
static probe_status ranks_json(const char *const *paths, size_t n_paths,
                               int isolate, char **json_out) {
  probe_ranks r;
  probe_ranks_options o;
  probe_ranks_options_init(&o);
  o.isolate = isolate;
  probe_status st = probe_ranks_run(&r, paths, n_paths, &o);
  if (st == PROBE_ERR_INVALID_ARG && r.unranked) {
    probe_ranks_free(&r);
    return independent_json(paths, n_paths, isolate, json_out);
  }
  if (st < 0 && r.error[0])
    probe__trace_open_msg("%s", r.error); /* probe_trace_last_error(NULL) */
  if (st >= 0) st = probe_ranks_render_json(&r, json_out);
  probe_ranks_free(&r);
  return st;
}

/* One file that a directory or a glob held: read once as a set of one
 * (the summary's partial read, then the focus post-mortem's full one -
 * isolated: its child reads every row); a rank file of a job of several
 * ranks gets the cross-rank document (its missing ranks named), any other
 * trace its one-process document, the focus's. (It was opened isolated
 * to ask which, then read whole again: two full reads.) */
static probe_status one_of_set_json(const char *path, int isolate,
                                    char **json_out) {
  probe_ranks r;
  probe_ranks_options o;
  probe_ranks_options_init(&o);
  o.isolate = isolate;
  probe_status st = probe_ranks_run(&r, &path, 1, &o);
  if (st < 0) {
    probe_ranks_free(&r);
    if (st == PROBE_ERR_NOMEM) return st;
    /* it cannot be read: the status and words of a file named alone (a
     * second attempt, on this path only) */
    return independent_json(&path, 1, isolate, json_out);
  }
  if (probe__ranks_read_one_of_many(&r)) {
    st = probe_ranks_render_json(&r, json_out);
  } else if (r.focus_diag) {
    probe__jw w;
    probe__jw_init(&w);
    probe__diag_json(&w, NULL, r.focus_diag);
    *json_out = probe__jw_finish(&w);
    if (!*json_out) st = PROBE_ERR_NOMEM;
  } else {
    st = PROBE_ERR_CORRUPT; /* not reached: a failed focus is refused */
  }
  probe_ranks_free(&r);
  return st < 0 ? st : PROBE_OK;
}

/* as_set: the paths are a set (a directory's or a glob's files), in which
 * one rank file of a job of several ranks is a set of one. */
static probe_status postmortem_json(const char *const *paths, size_t n_paths,
                                    int isolate, int as_set, char **json_out) {
  if (!json_out) {
    probe__trace_open_msg("probe_postmortem_json: NULL json_out");
    return PROBE_ERR_INVALID_ARG;
  }
  *json_out = NULL;
  probe__trace_open_msg("%s", ""); /* no stale message of an earlier call */
  if (!paths || n_paths == 0) {
    probe__trace_open_msg("probe_postmortem_json: no paths");
    return PROBE_ERR_INVALID_ARG;
  }
  for (size_t i = 0; i < n_paths; i++)
    if (!paths[i]) {
      probe__trace_open_msg("probe_postmortem_json: path %zu is NULL", i);
      return PROBE_ERR_INVALID_ARG;
    }
  if (n_paths > 1) return ranks_json(paths, n_paths, isolate, json_out);
  if (as_set) return one_of_set_json(paths[0], isolate, json_out);
  return independent_json(paths, n_paths, isolate, json_out);
}

probe_status probe_postmortem_json(const char *const *paths, size_t n_paths,
                                   char **json_out) {
  return postmortem_json(paths, n_paths, 0, 0, json_out);
}

probe_status probe_postmortem_json_isolated(const char *const *paths, size_t n_paths,
                                            char **json_out) {
  return postmortem_json(paths, n_paths, 1, 0, json_out);
}

probe_status probe_postmortem_set_json(const char *const *paths, size_t n_paths,
                                       char **json_out) {
  return postmortem_json(paths, n_paths, 0, 1, json_out);
}

probe_status probe_postmortem_set_json_isolated(const char *const *paths,
                                                size_t n_paths, char **json_out) {
  return postmortem_json(paths, n_paths, 1, 1, json_out);
}

static probe_status postmortem_verdict(const char *path, int isolate, probe_verdict *out) {
  if (!path || !out) {
    probe__trace_open_msg("probe_postmortem_verdict: NULL %s",
                          !path ? "path" : "out");
    return PROBE_ERR_INVALID_ARG;
  }
  probe_diag d;
  memset(&d, 0, sizeof d);
  probe_status st = diagnose_path(path, &d, isolate);
  if (st >= 0) *out = d.verdict;
  probe_diag_free(&d);
  return st < 0 ? st : PROBE_OK;
}

probe_status probe_postmortem_verdict(const char *path, probe_verdict *out) {
  return postmortem_verdict(path, 0, out);
}

probe_status probe_postmortem_verdict_isolated(const char *path, probe_verdict *out) {
  return postmortem_verdict(path, 1, out);
}
