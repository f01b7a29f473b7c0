/*
 * libprobe/analysis/ranks_render.c - the cross-rank post-mortem as text
 * (`ampprobe postmortem DIR`) and as JSON (`--json`, probe_postmortem_json
 * with several paths). Rank lists are written as ranges ("0-3, 5"). Paths
 * and layer names read from files are escaped (probe_text_escape).
 */
#define _POSIX_C_SOURCE 200809L
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../format.h" /* probe__trace_open_msg */
#include "analysis-impl.h"
#include "diagnose-impl.h"
#include "ranks-impl.h"

/* Rows of the per-rank table in the text (all of them are in the JSON). */
#define TEXT_MAX_RANK_ROWS 32

static int entry_matches(const probe_rank_entry *e, int by_status,
                         int32_t want) {
  if (by_status == PROBE__RANKS_BY_JOINED) return probe__rank_joined(e);
  if (by_status == PROBE__RANKS_BY_ABORTED) return probe__rank_aborted(e);
  if (by_status && want == PROBE_RANK_MISSING) /* missing or unreadable */
    return e->status != PROBE_RANK_READ && e->rank >= 0;
  if (by_status) return e->status == want && e->rank >= 0;
  return e->status == PROBE_RANK_READ && e->role == want;
}

/* Ranks in ascending order gathered into "a, b-c, ..." (cut with "..."
 * at cap): ranges_add each, then ranges_end. */
typedef struct rank_ranges {
  char *buf;
  size_t cap, len;
  int32_t a, b; /* the open range; a < 0: none */
} rank_ranges;

static void ranges_init(rank_ranges *g, char *buf, size_t cap) {
  *g = (rank_ranges){buf, cap, 0, -1, -1};
  if (cap) buf[0] = '\0';
}

/* Appends the open range, "a" or "a-b". */
static void ranges_put(rank_ranges *g) {
  if (g->a < 0 || g->len >= g->cap) return;
  const char *sep = g->len == 0 ? "" : ", ";
  int n = g->a == g->b
              ? snprintf(g->buf + g->len, g->cap - g->len, "%s%d", sep, (int)g->a)
              : snprintf(g->buf + g->len, g->cap - g->len, "%s%d-%d", sep,
                         (int)g->a, (int)g->b);
  if (n > 0) g->len += (size_t)n;
  if (g->len >= g->cap && g->cap > 4) memcpy(g->buf + g->cap - 4, "...", 4);
}

static void ranges_add(rank_ranges *g, int32_t rank) {
  if (g->a >= 0 && rank == g->b + 1) {
    g->b = rank;
    return;
  }
  ranges_put(g);
  g->a = g->b = rank;
}

static void ranges_end(rank_ranges *g) { ranges_put(g); }

int64_t probe__rank_list(const probe_ranks *r, int by_status, int32_t want,
                         char *buf, size_t cap) {
  rank_ranges g;
  int64_t count = 0;
  ranges_init(&g, buf, cap);
  for (size_t i = 0; i < r->n_entries; i++) {
    const probe_rank_entry *e = &r->entries[i];
    if (!entry_matches(e, by_status, want)) continue;
    count++;
    ranges_add(&g, e->rank);
  }
  ranges_end(&g);
  return count;
}

static const char *site_name(int32_t s) {
  return s >= 0 && s < PROBE_SITE_COUNT ? probe_site_name((probe_site)s) : "?";
}

static const char *phase_name(int32_t p) {
  return p >= 0 && p <= PROBE_PHASE_OPTIMIZER ? probe_phase_name((probe_phase)p)
                                              : "?";
}

static const char *role_name(int32_t role) {
  return role == PROBE_RANK_ROLE_BORN      ? "born"
         : role == PROBE_RANK_ROLE_CARRIED ? "carried"
         : role == PROBE_RANK_ROLE_LATER   ? "later"
         : role == PROBE_RANK_ROLE_CAST    ? "cast"
                                           : "none";
}

static const char *status_name(int32_t st) {
  return st == PROBE_RANK_READ      ? "read"
         : st == PROBE_RANK_MISSING ? "missing"
                                    : "unreadable";
}

/* ---- text ----------------------------------------------------------------- */

static void text_header(const probe_ranks *r, FILE *f) {
  fprintf(f, "ampprobe postmortem: %zu rank file%s", r->n_files,
          r->n_files == 1 ? "" : "s");
  if (r->run_id[0]) fprintf(f, " of run '%s'", r->run_id);
  fprintf(f, " (world size %d)\n", (int)r->world_size);
  fprintf(f, "verdict: %s\n\n", probe_verdict_name(r->verdict));
  if (r->first >= 0) {
    const probe_rank_entry *e = &r->entries[r->first];
    fprintf(f, "first non-finite  rank %d, step %lld, %s, layer %s/%s (seq %u)\n",
            (int)e->rank, (long long)e->nf_step, phase_name(e->nf_phase),
            e->nf_layer_name, site_name(e->nf_site), (unsigned)e->nf_seq);
  }
  fprintf(f, "origin            %s\n", r->origin_text);
  if (r->fix_text[0]) fprintf(f, "next step         %s\n", r->fix_text);
  char list[160];
  if (r->first >= 0 && r->n_later) {
    probe__rank_list(r, 0, PROBE_RANK_ROLE_LATER, list, sizeof list);
    fprintf(f, "                  later non-finite of their own (not from the "
               "all-reduce): rank%s %s\n",
            r->n_later > 1 ? "s" : "", list);
  }
  if (r->first >= 0 && r->n_unreached) {
    probe__rank_list(r, 0, PROBE_RANK_ROLE_NONE, list, sizeof list);
    fprintf(f, "                  no non-finite value recorded: rank%s %s\n",
            r->n_unreached > 1 ? "s" : "", list);
  }
}

/* Normal scaler backoffs (not events): how many ranks, from when. */
static void text_backoffs(const probe_ranks *r, FILE *f) {
  int64_t ranks = 0, first = -1, from_ar = 0;
  for (size_t i = 0; i < r->n_entries; i++) {
    const probe_rank_entry *e = &r->entries[i];
    if (e->status != PROBE_RANK_READ || e->backoff_nonfinite_steps == 0 ||
        (r->event_step >= 0 && e->first_backoff_step >= r->event_step))
      continue; /* those at or after the event are the event's */
    ranks++;
    from_ar += e->first_backoff_site == PROBE_SITE_GRAD_POST_ALLREDUCE;
    if (first < 0 || e->first_backoff_step < first) first = e->first_backoff_step;
  }
  if (!ranks) return;
  fprintf(f, "scaler backoffs   %lld rank%s had gradients overflow on steps "
             "the loss scaler skipped (normal, not events) before it, first "
             "at step %lld%s\n",
          (long long)ranks, ranks == 1 ? "" : "s", (long long)first,
          from_ar ? "; on some ranks they came out of the all-reduce" : "");
}

static void text_disagreements(const probe_ranks *r, FILE *f) {
  if (!r->n_disagreements) {
    fprintf(f, "disagreements     none: loss scale, skipped steps and weight "
               "digest agree across ranks at every step (%lld rank-steps "
               "compared)\n",
            (long long)r->disagree[0].steps_compared);
    return;
  }
  for (int k = 0; k < PROBE_RANKS_FIELD_COUNT; k++) {
    const probe_ranks_disagreement *d = &r->disagree[k];
    if (!d->found) continue;
    char a[40], b[40];
    if (k == PROBE_RANKS_WEIGHT_DIGEST) {
      snprintf(a, sizeof a, "%016" PRIx64, d->digest_a);
      snprintf(b, sizeof b, "%016" PRIx64, d->digest_b);
    } else {
      probe_num_format(a, sizeof a, d->value_a, 6);
      probe_num_format(b, sizeof b, d->value_b, 6);
    }
    /* every rank is compared with the first read: when all the others
     * differ from it, it may be the odd one out (rank 0 alone with other
     * weights read "3 ranks differ from the first rank read") */
    char odd[80] = "";
    if (r->n_read > 2 && d->ranks_differing == r->n_read - 1)
      snprintf(odd, sizeof odd, ": all the others, so rank %d may be the one "
               "that differs", (int)d->rank_a);
    fprintf(f, "DISAGREEMENT      %s differs at step %lld: %s on rank %d, %s on "
               "rank %d (%lld rank%s differ%s from rank %d, the first rank "
               "read%s)\n",
            probe_ranks_field_name((probe_ranks_field)k), (long long)d->step, a,
            (int)d->rank_a, b, (int)d->rank_b, (long long)d->ranks_differing,
            d->ranks_differing == 1 ? "" : "s",
            d->ranks_differing == 1 ? "s" : "", (int)d->rank_a, odd);
  }
}

/* "ranks 0, 2-3" of the aborted entries whose reason is why (escaped, as
 * stored), into buf; how many; the lowest and highest last step and
 * aborted_step of them into lo/hi and in_lo/in_hi. */
static int64_t aborted_group(const probe_ranks *r, const char *why, char *buf,
                             size_t cap, int64_t *lo, int64_t *hi,
                             int64_t *in_lo, int64_t *in_hi) {
  rank_ranges g;
  int64_t count = 0;
  ranges_init(&g, buf, cap);
  for (size_t i = 0; i < r->n_entries; i++) {
    const probe_rank_entry *e = &r->entries[i];
    if (!probe__rank_aborted(e) || strcmp(e->aborted, why) != 0) continue;
    if (count++ == 0) {
      *lo = *hi = e->last_step;
      *in_lo = *in_hi = e->aborted_step;
    }
    if (e->last_step < *lo) *lo = e->last_step;
    if (e->last_step > *hi) *hi = e->last_step;
    if (e->aborted_step < *in_lo) *in_lo = e->aborted_step;
    if (e->aborted_step > *in_hi) *in_hi = e->aborted_step;
    ranges_add(&g, e->rank);
  }
  ranges_end(&g);
  return count;
}

/* The ranks whose traces carry the abort mark, one line per reason (the
 * first 8 reasons): which rank a signal reached, and what the others
 * recorded ("another rank's stop"). The reasons are data, escaped when
 * read. */
static void text_aborted(const probe_ranks *r, FILE *f) {
  int groups = 0;
  for (size_t i = 0; i < r->n_entries; i++) {
    const probe_rank_entry *e = &r->entries[i];
    if (!probe__rank_aborted(e)) continue;
    int seen = 0;
    for (size_t j = 0; j < i && !seen; j++)
      seen = probe__rank_aborted(&r->entries[j]) &&
             strcmp(r->entries[j].aborted, e->aborted) == 0;
    if (seen) continue;
    if (groups++ == 8) {
      fprintf(f, "                  ... (more reasons: --json lists each "
                 "rank's)\n");
      return;
    }
    char list[160], at[160];
    int64_t lo = 0, hi = 0, in_lo = 0, in_hi = 0;
    int64_t n = aborted_group(r, e->aborted, list, sizeof list, &lo, &hi,
                              &in_lo, &in_hi);
    if (in_lo >= 0 && in_lo == in_hi)
      snprintf(at, sizeof at, "in step %lld (closed half done by the "
               "tracer, marked aborted)", (long long)in_lo);
    else if (in_hi >= 0)
      snprintf(at, sizeof at, "at steps %lld-%lld (some closed half done by "
               "the tracer, marked aborted)",
               (long long)lo, (long long)(in_hi > hi ? in_hi : hi));
    else if (hi < 0)
      snprintf(at, sizeof at, "before %s first step (closed by the tracer, "
               "marked aborted)", n > 1 ? "their" : "its");
    else if (lo == hi)
      snprintf(at, sizeof at, "after step %lld (closed by the tracer, marked "
               "aborted)", (long long)lo);
    else
      snprintf(at, sizeof at, "after steps %lld-%lld (closed by the tracer, "
               "marked aborted)", (long long)lo, (long long)hi);
    fprintf(f, "%s rank%s %s ended by %.300s %s\n",
            groups == 1 ? "ABORTED          " : "                 ",
            n > 1 ? "s" : "", list, e->aborted, at);
  }
}

static void text_faults(const probe_ranks *r, FILE *f) {
  /* what "read" means, said: every row of the focus rank's file (isolated)
   * was read and checked, of the others' only the steps table and the
   * records at their first event (docs/multirank.md, "What is read") */
  char how[160] = "";
  int64_t part = r->n_read - r->n_read_whole;
  if (part > 0 && r->n_read_whole > 0 && r->focus >= 0)
    snprintf(how, sizeof how, " (rank %d whole, %lld in part: steps and the "
                              "records at the event)",
             (int)r->entries[r->focus].rank, (long long)part);
  else if (part > 0)
    snprintf(how, sizeof how, " (in part: steps and the records at the event)");
  char marked[48] = "";
  if (r->n_aborted)
    snprintf(marked, sizeof marked, " (%lld marked aborted)",
             (long long)r->n_aborted);
  fprintf(f, "ranks             %lld read%s, %lld missing, %lld unreadable, "
             "%lld not closed%s\n",
          (long long)r->n_read, how, (long long)r->n_missing,
          (long long)r->n_unreadable, (long long)r->n_incomplete, marked);
  if (r->stopped_first >= 0) {
    const probe_rank_entry *s = &r->entries[r->stopped_first];
    int64_t tied = 0;
    for (size_t i = 0; i < r->n_entries; i++)
      tied += r->entries[i].status == PROBE_RANK_READ &&
              !r->entries[i].complete && r->entries[i].last_step == s->last_step;
    char at[48];
    if (s->last_step < 0)
      snprintf(at, sizeof at, "before its first step");
    else
      snprintf(at, sizeof at, "at step %lld", (long long)s->last_step);
    if (probe_ranks_stopped_tie(r) && r->n_aborted == r->n_incomplete)
      fprintf(f, "stopped           every rank stopped %s, each trace closed "
                 "by its tracer with the abort mark: the ABORTED lines say "
                 "what ended each\n",
              at);
    else if (probe_ranks_stopped_tie(r))
      fprintf(f, "stopped           every rank stopped %s without closing "
                 "its trace: cannot tell which stopped first\n",
              at);
    else if (s->aborted[0]) /* the reason is recorded: no guess */
      fprintf(f, "stopped first     rank %d %s (ended by %s; its trace was "
                 "closed by the tracer, marked aborted)%s; the furthest rank "
                 "reached step %lld\n",
              (int)s->rank, at, s->aborted,
              tied > 1 ? " with others at the same step" : "",
              (long long)r->max_last_step);
    else
      fprintf(f, "stopped first     rank %d %s (its trace was not closed%s: "
                 "killed?)%s; the furthest rank reached step %lld\n",
              (int)s->rank, at, s->joined ? " after it joined" : "",
              tied > 1 ? " with others at the same step" : "",
              (long long)r->max_last_step);
  }
  text_aborted(r, f);
  if (r->n_ended_early) {
    const probe_rank_entry *s = &r->entries[r->ended_early];
    fprintf(f, "ended early       rank %d closed its trace at step %lld%s; the "
               "furthest rank reached step %lld (an exception or an early "
               "exit on that rank?)\n",
            (int)s->rank, (long long)s->last_step,
            r->n_ended_early > 1 ? " (and others before the end)" : "",
            (long long)r->max_last_step);
  }
  if (r->n_joined) {
    /* said, not a fault: the trace says the rank ran out of inputs */
    const probe_rank_entry *s = NULL;
    for (size_t i = 0; i < r->n_entries; i++)
      if (probe__rank_joined(&r->entries[i]) &&
          (!s || r->entries[i].last_step < s->last_step))
        s = &r->entries[i];
    char list[160], after[48];
    probe__rank_list(r, PROBE__RANKS_BY_JOINED, 0, list, sizeof list);
    if (s->last_step < 0)
      snprintf(after, sizeof after, "before its first step");
    else
      snprintf(after, sizeof after, "after step %lld", (long long)s->last_step);
    if (r->n_joined == 1)
      fprintf(f, "joined            rank %s ran out of inputs and joined the "
                 "others %s (uneven inputs: DDP's join()), its trace closed; "
                 "the furthest rank reached step %lld\n",
              list, after, (long long)r->max_last_step);
    else
      fprintf(f, "joined            ranks %s ran out of inputs and joined the "
                 "others (uneven inputs: DDP's join()), their traces closed, "
                 "the first %s; the furthest rank reached step %lld\n",
              list, after, (long long)r->max_last_step);
  }
  if (r->n_missing) {
    char list[160]; /* ranges, cut with "..." */
    probe__rank_list(r, 1, PROBE_RANK_MISSING, list, sizeof list);
    fprintf(f, "MISSING           rank%s %s: world size %d, no file\n",
            r->n_missing > 1 ? "s" : "", list, (int)r->world_size);
  }
  for (size_t i = 0; i < r->n_entries; i++) {
    const probe_rank_entry *e = &r->entries[i];
    if (e->status != PROBE_RANK_UNREADABLE) continue;
    char p[600], m[600], rk[48] = "";
    const char *err = e->error ? e->error : "";
    size_t pl = e->path ? strlen(e->path) : 0;
    /* the reader's message often starts with the path already */
    if (pl && !strncmp(err, e->path, pl) && err[pl] == ':')
      err += pl + 1 + (err[pl + 1] == ' ');
    probe_text_escape(p, sizeof p, e->path ? e->path : "");
    probe_text_escape(m, sizeof m, err);
    if (e->rank >= 0)
      snprintf(rk, sizeof rk, " (rank %d by its name)", (int)e->rank);
    fprintf(f, "UNREADABLE        %s%s: %s\n", p, rk, m);
  }
}

/* The table's `closed` column: yes, joined (closed with the join mark),
 * aborted (closed by the tracer with the abort mark: what ended it is in
 * the `ended by` column) or no (not closed: killed?). */
static const char *closed_name(const probe_rank_entry *e) {
  return e->complete   ? (e->joined ? "joined" : "yes")
         : e->aborted[0] ? "aborted"
                         : "no";
}

/* Width of the `ended by` column (shown when a rank was aborted). */
#define TEXT_REASON_MAX 40

static void text_table(const probe_ranks *r, FILE *f) {
  int wide = 0; /* the `ended by` column's width, 0: no column */
  for (size_t i = 0; r->n_aborted && i < r->n_entries; i++) {
    size_t n = strlen(r->entries[i].aborted);
    if (probe__rank_aborted(&r->entries[i]) && (int)n > wide)
      wide = n > TEXT_REASON_MAX ? TEXT_REASON_MAX : (int)n;
  }
  if (wide && wide < 8) wide = 8;
  fprintf(f, "\n rank  steps   last  closed  skipped  %s%*s%sfirst non-finite\n",
          wide ? "ended by" : "", wide ? wide - 8 : 0, "", wide ? "  " : "");
  size_t rows = 0, more = 0;
  for (size_t i = 0; i < r->n_entries; i++) {
    const probe_rank_entry *e = &r->entries[i];
    if (e->status == PROBE_RANK_UNREADABLE && e->rank < 0) continue;
    if (rows++ >= TEXT_MAX_RANK_ROWS) {
      more++;
      continue;
    }
    if (e->status != PROBE_RANK_READ) {
      fprintf(f, "%5d  (%s)\n", (int)e->rank, status_name(e->status));
      continue;
    }
    fprintf(f, "%5d %6lld %6lld  %-7s%8lld  ", (int)e->rank,
            (long long)e->n_steps, (long long)e->last_step, closed_name(e),
            (long long)e->skipped_steps);
    if (wide) {
      char why[TEXT_REASON_MAX + 1];
      const char *a = probe__rank_aborted(e) ? e->aborted : "-";
      if (strlen(a) > (size_t)wide)
        snprintf(why, sizeof why, "%.*s...", wide - 3, a);
      else
        snprintf(why, sizeof why, "%s", a);
      fprintf(f, "%-*s  ", wide, why);
    }
    if (e->nf_step >= 0)
      fprintf(f, "step %lld %s %s/%s%s%s%s\n", (long long)e->nf_step,
              phase_name(e->nf_phase), e->nf_layer_name, site_name(e->nf_site),
              e->role != PROBE_RANK_ROLE_NONE ? " (" : "",
              e->role != PROBE_RANK_ROLE_NONE ? role_name(e->role) : "",
              e->role != PROBE_RANK_ROLE_NONE ? ")" : "");
    else if (e->first_nonfinite_loss_step >= 0)
      fprintf(f, "loss at step %lld\n", (long long)e->first_nonfinite_loss_step);
    else
      fprintf(f, "-\n");
  }
  if (more)
    fprintf(f, "  ... %zu more rank%s (--json lists every rank)\n", more,
            more == 1 ? "" : "s");
}

static void render_text(const probe_ranks *r, FILE *f) {
  text_header(r, f);
  text_backoffs(r, f);
  text_disagreements(r, f);
  text_faults(r, f);
  text_table(r, f);
  if (r->focus < 0) return;
  const probe_rank_entry *e = &r->entries[r->focus];
  fprintf(f, "\n==== rank %d: the full post-mortem ====\n\n", (int)e->rank);
  if (!r->focus_diag) {
    fprintf(f, "(not run: %s)\n", r->focus_status < 0
                                      ? probe_status_str(r->focus_status)
                                      : "disabled");
    return;
  }
  char *t = NULL;
  if (probe_diag_render_text(r->focus_diag, &t) == PROBE_OK && t)
    fputs(t, f);
  probe_free(t);
}

probe_status probe_ranks_render_text(const probe_ranks *r, char **text_out) {
  if (!r || !text_out) {
    probe__trace_open_msg("probe_ranks_render_text: NULL %s",
                          !r ? "ranks" : "text_out");
    return PROBE_ERR_INVALID_ARG;
  }
  *text_out = NULL;
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  if (!f) return PROBE_ERR_NOMEM;
  render_text(r, f);
  if (fclose(f) != 0 || !buf) {
    free(buf);
    return PROBE_ERR_NOMEM;
  }
  *text_out = buf;
  return PROBE_OK;
}

/* ---- JSON ----------------------------------------------------------------- */

static void json_rank_array(probe__jw *w, const char *key, const probe_ranks *r,
                            int by_status, int32_t want) {
  probe__jw_arr(w, key);
  for (size_t i = 0; i < r->n_entries; i++)
    if (entry_matches(&r->entries[i], by_status, want))
      probe__jw_int(w, NULL, r->entries[i].rank);
  probe__jw_end(w, ']');
}

static void json_point(probe__jw *w, const char *key,
                       const probe_rank_entry *e) {
  if (!e || e->nf_step < 0) {
    probe__jw_null(w, key);
    return;
  }
  probe__jw_obj(w, key);
  probe__jw_int(w, "rank", e->rank);
  probe__jw_int(w, "step", e->nf_step);
  probe__jw_str(w, "phase", phase_name(e->nf_phase));
  probe__jw_int(w, "seq", e->nf_seq);
  probe__jw_str(w, "layer", e->nf_layer_name);
  probe__jw_str(w, "site", site_name(e->nf_site));
  probe__jw_end(w, '}');
}

static void json_origin(probe__jw *w, const probe_ranks *r) {
  probe__jw_obj(w, "origin");
  probe__jw_str(w, "kind", probe_ranks_origin_name(r->origin));
  probe__jw_bool(w, "uncertain", r->origin_uncertain);
  probe__jw_step(w, "step", r->event_step);
  json_rank_array(w, "born_on", r, 0, PROBE_RANK_ROLE_BORN);
  json_rank_array(w, "carried_to", r, 0, PROBE_RANK_ROLE_CARRIED);
  json_rank_array(w, "cast_on", r, 0, PROBE_RANK_ROLE_CAST);
  probe__jw_step(w, "carried_first_step", r->carried_first_step);
  probe__jw_step(w, "carried_last_step", r->carried_last_step);
  json_rank_array(w, "later", r, 0, PROBE_RANK_ROLE_LATER);
  if (r->first >= 0)
    json_rank_array(w, "never_nonfinite", r, 0, PROBE_RANK_ROLE_NONE);
  else
    probe__jw_arr(w, "never_nonfinite"), probe__jw_end(w, ']');
  probe__jw_str(w, "text", r->origin_text);
  probe__jw_str(w, "next_step", r->fix_text[0] ? r->fix_text : NULL);
  probe__jw_end(w, '}');
}

static void json_disagreements(probe__jw *w, const probe_ranks *r) {
  probe__jw_arr(w, "disagreements");
  for (int k = 0; k < PROBE_RANKS_FIELD_COUNT; k++) {
    const probe_ranks_disagreement *d = &r->disagree[k];
    if (!d->found) continue;
    probe__jw_obj(w, NULL);
    probe__jw_str(w, "field", probe_ranks_field_name((probe_ranks_field)k));
    probe__jw_int(w, "step", d->step);
    probe__jw_int(w, "rank_a", d->rank_a);
    probe__jw_int(w, "rank_b", d->rank_b);
    if (k == PROBE_RANKS_WEIGHT_DIGEST) {
      char a[24], b[24];
      snprintf(a, sizeof a, "%016" PRIx64, d->digest_a);
      snprintf(b, sizeof b, "%016" PRIx64, d->digest_b);
      probe__jw_str(w, "value_a", a);
      probe__jw_str(w, "value_b", b);
    } else {
      probe__jw_num(w, "value_a", d->value_a);
      probe__jw_num(w, "value_b", d->value_b);
    }
    probe__jw_int(w, "ranks_differing", d->ranks_differing);
    probe__jw_end(w, '}');
  }
  probe__jw_end(w, ']');
}

static void json_entry(probe__jw *w, const probe_rank_entry *e, int whole) {
  char buf[1200];
  probe__jw_obj(w, NULL);
  probe__jw_int(w, "rank", e->rank);
  probe__jw_str(w, "status", status_name(e->status));
  if (e->status == PROBE_RANK_UNREADABLE)
    probe__jw_bool(w, "rank_from_name", e->rank_from_name);
  if (e->path) probe_text_escape(buf, sizeof buf, e->path);
  probe__jw_str(w, "path", e->path ? buf : NULL);
  if (e->status == PROBE_RANK_UNREADABLE) {
    probe_text_escape(buf, sizeof buf, e->error ? e->error : "");
    probe__jw_str(w, "error", buf);
  }
  if (e->status == PROBE_RANK_READ) {
    probe__jw_bool(w, "complete", e->complete);
    probe__jw_bool(w, "joined", e->joined);
    /* the abort mark: what ended the job (escaped), null when none */
    probe__jw_str(w, "aborted", e->aborted[0] ? e->aborted : NULL);
    probe__jw_step(w, "aborted_step", e->aborted_step);
    probe__jw_int(w, "steps", e->n_steps);
    probe__jw_step(w, "last_step", e->last_step);
    probe__jw_int(w, "skipped_steps", e->skipped_steps);
    probe__jw_int(w, "backoff_nonfinite_steps", e->backoff_nonfinite_steps);
    probe__jw_step(w, "first_backoff_step", e->first_backoff_step);
    probe__jw_step(w, "first_nonfinite_loss_step", e->first_nonfinite_loss_step);
    json_point(w, "first_nonfinite", e);
    probe__jw_str(w, "role", role_name(e->role));
    probe__jw_bool(w, "read_whole", whole);
  }
  probe__jw_end(w, '}');
}

static void json_stopped(probe__jw *w, const probe_ranks *r) {
  if (r->stopped_first < 0) {
    probe__jw_null(w, "stopped_first");
    return;
  }
  const probe_rank_entry *s = &r->entries[r->stopped_first];
  int tie = probe_ranks_stopped_tie(r);
  probe__jw_obj(w, "stopped_first");
  if (tie) /* every rank stopped at that step: which was first is unknown */
    probe__jw_null(w, "rank");
  else
    probe__jw_int(w, "rank", s->rank);
  probe__jw_bool(w, "tie", tie);
  probe__jw_step(w, "last_step", s->last_step);
  /* its abort mark when the tie is not (null: none, or a tie) */
  probe__jw_str(w, "aborted", !tie && s->aborted[0] ? s->aborted : NULL);
  probe__jw_step(w, "furthest_step", r->max_last_step);
  probe__jw_arr(w, "not_closed");
  for (size_t i = 0; i < r->n_entries; i++)
    if (r->entries[i].status == PROBE_RANK_READ && !r->entries[i].complete)
      probe__jw_int(w, NULL, r->entries[i].rank);
  probe__jw_end(w, ']');
  probe__jw_end(w, '}');
}

static void json_body(probe__jw *w, const probe_ranks *r) {
  probe__jw_str(w, "verdict", probe_verdict_name(r->verdict));
  probe__jw_bool(w, "problem", r->verdict != PROBE_VERDICT_HEALTHY);
  probe__jw_str(w, "kind", "ranks");
  probe__jw_str(w, "run_id", r->run_id);
  probe__jw_int(w, "world_size", r->world_size);
  probe__jw_int(w, "files", (int64_t)r->n_files);
  probe__jw_int(w, "ranks_read", r->n_read);
  probe__jw_int(w, "ranks_read_whole", r->n_read_whole);
  probe__jw_arr(w, "ranks_missing");
  for (size_t i = 0; i < r->n_entries; i++)
    if (r->entries[i].status == PROBE_RANK_MISSING)
      probe__jw_int(w, NULL, r->entries[i].rank);
  probe__jw_end(w, ']');
  probe__jw_int(w, "ranks_unreadable", r->n_unreadable);
  probe__jw_int(w, "ranks_not_closed", r->n_incomplete);
  json_point(w, "first_nonfinite", r->first >= 0 ? &r->entries[r->first] : NULL);
  json_origin(w, r);
  json_disagreements(w, r);
  json_stopped(w, r);
  probe__jw_arr(w, "ended_early");
  for (size_t i = 0; i < r->n_entries; i++)
    if (probe__rank_ended_early(r, &r->entries[i]))
      probe__jw_int(w, NULL, r->entries[i].rank);
  probe__jw_end(w, ']');
  probe__jw_arr(w, "joined"); /* closed with the join mark: not ended early */
  for (size_t i = 0; i < r->n_entries; i++)
    if (probe__rank_joined(&r->entries[i]))
      probe__jw_int(w, NULL, r->entries[i].rank);
  probe__jw_end(w, ']');
  probe__jw_arr(w, "aborted"); /* closed by the tracer with the abort mark */
  for (size_t i = 0; i < r->n_entries; i++)
    if (probe__rank_aborted(&r->entries[i]))
      probe__jw_int(w, NULL, r->entries[i].rank);
  probe__jw_end(w, ']');
  probe__jw_arr(w, "ranks");
  for (size_t i = 0; i < r->n_entries; i++)
    json_entry(w, &r->entries[i],
               r->n_read_whole > 0 && (int32_t)i == r->focus);
  probe__jw_end(w, ']');
  if (r->focus >= 0)
    probe__jw_int(w, "focus_rank", r->entries[r->focus].rank);
  else
    probe__jw_null(w, "focus_rank");
  if (r->focus_diag)
    probe__diag_json(w, "focus", r->focus_diag);
  else
    probe__jw_null(w, "focus");
}

probe_status probe_ranks_render_json(const probe_ranks *r, char **json_out) {
  if (!r || !json_out) {
    probe__trace_open_msg("probe_ranks_render_json: NULL %s",
                          !r ? "ranks" : "json_out");
    return PROBE_ERR_INVALID_ARG;
  }
  probe__jw w;
  probe__jw_init(&w);
  probe__jw_obj(&w, NULL);
  json_body(&w, r);
  probe__jw_end(&w, '}');
  *json_out = probe__jw_finish(&w);
  return *json_out ? PROBE_OK : PROBE_ERR_NOMEM;
}
