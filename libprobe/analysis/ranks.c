/*
 * libprobe/analysis/ranks.c - the cross-rank post-mortem (probe_ranks_run,
 * ampprobe/analysis.h): each rank's file is summarised in turn
 * (ranks_read.c) and merged at once into what the whole set needs - one
 * reference row per step for the disagreement checks, a small entry per
 * rank - so memory does not grow with the number of ranks beyond that
 * entry. Then the first non-finite record over the ranks, the role of each
 * rank at that step (born / carried by the all-reduce / untouched), the
 * rank that stopped first, the missing ranks, and the full single-trace
 * post-mortem of one rank (the focus).
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../format.h" /* probe__trace_open_msg */
#include "analysis-impl.h"
#include "ranks-impl.h"

/* The merge's state besides the result: the reference steps. */
typedef struct merger {
  probe__rstep *ref;   /* union of the steps seen, sorted */
  int32_t *ref_rank;   /* the rank whose value ref holds */
  size_t n_ref, cap_ref;
  probe__rstep *tmp;
  int32_t *tmp_rank;
  size_t cap_tmp;
  int first_meta;      /* the first read file's run id is known */
  char run_id[PROBE_NAME_MAX * 2];
  size_t run_id_file;  /* index of the file that gave it (and its world
                          size: every file of one job has the same) */
  int32_t world_size;
  size_t *rank_entry;  /* rank -> entry index + 1 (0: none yet) */
  size_t n_rank_entry;
  size_t cap_entries;  /* allocated r->entries */
} merger;

const char *probe_ranks_origin_name(probe_ranks_origin o) {
  switch (o) {
  case PROBE_RANKS_ORIGIN_NONE: return "none";
  case PROBE_RANKS_ORIGIN_RANK: return "rank";
  case PROBE_RANKS_ORIGIN_ALLREDUCE: return "allreduce";
  case PROBE_RANKS_ORIGIN_LOSS_ONLY: return "loss-only";
  }
  return "?";
}

const char *probe_ranks_field_name(probe_ranks_field f) {
  switch (f) {
  case PROBE_RANKS_LOSS_SCALE: return "loss_scale";
  case PROBE_RANKS_SKIPPED: return "skipped";
  case PROBE_RANKS_WEIGHT_DIGEST: return "weight_digest";
  default: return "?";
  }
}

void probe_ranks_options_init(probe_ranks_options *o) {
  if (!o) return;
  memset(o, 0, sizeof *o);
  probe_diag_options_init(&o->diag);
  o->focus_diag = 1;
}

/* ---- steps: compare with the reference, then fold into it --------------- */

/* The caller's progress callback (fn NULL: none). */
typedef struct progress {
  probe_progress_fn fn;
  void *user;
} progress;

/* Tells the caller done of total in phase; PROBE_ERR_INTERRUPTED when it
 * asks to stop. */
static probe_status tell(const progress *pg, const char *phase, size_t done,
                         size_t total) {
  if (pg->fn && pg->fn(phase, done, total, pg->user) != 0)
    return PROBE_ERR_INTERRUPTED;
  return PROBE_OK;
}

static int differs(const probe__rstep *a, const probe__rstep *b, int f) {
  switch (f) {
  case PROBE_RANKS_LOSS_SCALE:
    return (a->has & b->has & PROBE__RS_SCALE) &&
           memcmp(&a->scale, &b->scale, sizeof a->scale) != 0 &&
           !(isnan(a->scale) && isnan(b->scale));
  case PROBE_RANKS_SKIPPED:
    return (a->has & b->has & PROBE__RS_SKIPPED) && a->skipped != b->skipped;
  default:
    return (a->has & b->has & PROBE__RS_DIGEST) && a->digest != b->digest;
  }
}

static void note_disagreement(probe_ranks *r, int f, const probe__rstep *ref,
                              int32_t ref_rank, const probe__rstep *mine,
                              int32_t rank) {
  probe_ranks_disagreement *d = &r->disagree[f];
  if (d->found && (d->step < mine->step ||
                   (d->step == mine->step && d->rank_b <= rank)))
    return;
  d->found = 1;
  d->step = mine->step;
  d->rank_a = ref_rank;
  d->rank_b = rank;
  d->value_a = f == PROBE_RANKS_SKIPPED ? ref->skipped : ref->scale;
  d->value_b = f == PROBE_RANKS_SKIPPED ? mine->skipped : mine->scale;
  d->digest_a = ref->digest;
  d->digest_b = mine->digest;
}

static void compare_step(probe_ranks *r, const probe__rstep *ref,
                         int32_t ref_rank, const probe__rstep *mine,
                         int32_t rank, int *seen) {
  for (int f = 0; f < PROBE_RANKS_FIELD_COUNT; f++) {
    r->disagree[f].steps_compared++;
    if (!differs(ref, mine, f)) continue;
    note_disagreement(r, f, ref, ref_rank, mine, rank);
    if (!seen[f]) r->disagree[f].ranks_differing++;
    seen[f] = 1;
  }
}

static probe_status grow_tmp(merger *m, size_t need) {
  if (need <= m->cap_tmp) return PROBE_OK;
  probe__rstep *a = realloc(m->tmp, need * sizeof *a);
  if (!a) return PROBE_ERR_NOMEM;
  m->tmp = a;
  int32_t *b = realloc(m->tmp_rank, need * sizeof *b);
  if (!b) return PROBE_ERR_NOMEM;
  m->tmp_rank = b;
  m->cap_tmp = need;
  return PROBE_OK;
}

/* Walks the reference and the rank's steps (both sorted) together. */
static probe_status merge_steps(probe_ranks *r, merger *m,
                                const probe__rsum *s) {
  size_t n = (size_t)s->e.n_steps;
  if (grow_tmp(m, m->n_ref + n) < 0) return PROBE_ERR_NOMEM;
  size_t i = 0, j = 0, k = 0;
  int seen[PROBE_RANKS_FIELD_COUNT] = {0};
  while (i < m->n_ref || j < n) {
    if (j >= n || (i < m->n_ref && m->ref[i].step < s->steps[j].step)) {
      m->tmp[k] = m->ref[i];
      m->tmp_rank[k++] = m->ref_rank[i++];
    } else if (i >= m->n_ref || s->steps[j].step < m->ref[i].step) {
      m->tmp[k] = s->steps[j++];
      m->tmp_rank[k++] = s->e.rank;
    } else {
      compare_step(r, &m->ref[i], m->ref_rank[i], &s->steps[j], s->e.rank,
                   seen);
      m->tmp[k] = m->ref[i];
      m->tmp_rank[k++] = m->ref_rank[i++];
      j++;
    }
  }
  /* swap: the merged union becomes the reference */
  probe__rstep *a = m->ref;
  int32_t *b = m->ref_rank;
  size_t c = m->cap_ref;
  m->ref = m->tmp;
  m->ref_rank = m->tmp_rank;
  m->cap_ref = m->cap_tmp;
  m->n_ref = k;
  m->tmp = a;
  m->tmp_rank = b;
  m->cap_tmp = c;
  return PROBE_OK;
}

/* ---- one file ------------------------------------------------------------ */

static void refuse(probe_ranks *r, const char *fmt, const char *a,
                   const char *b, const char *c, const char *d) {
  char ea[256], eb[256], ec[256], ed[256];
  probe_text_escape(ea, sizeof ea, a ? a : "");
  probe_text_escape(eb, sizeof eb, b ? b : "");
  probe_text_escape(ec, sizeof ec, c ? c : "");
  probe_text_escape(ed, sizeof ed, d ? d : "");
  snprintf(r->error, sizeof r->error, fmt, ea, eb, ec, ed);
}

/* The checks that make a set one job. */
static probe_status check_member(probe_ranks *r, merger *m,
                                 const probe__rsum *s, const char *const *paths,
                                 size_t n_paths, size_t i) {
  const char *path = paths[i];
  if (s->e.rank < 0 && n_paths > 1) {
    refuse(r, "%s has no rank attribute: a set must be the rank files of "
              "one job (written with a rank and a world size)%s%s%s",
           path, "", "", "");
    r->unranked = 1;
    return PROBE_ERR_INVALID_ARG;
  }
  if (!m->first_meta) {
    m->first_meta = 1;
    snprintf(m->run_id, sizeof m->run_id, "%s", s->run_id);
    m->run_id_file = i;
    m->world_size = s->e.world_size;
    return PROBE_OK;
  }
  if (strcmp(m->run_id, s->run_id) != 0) {
    refuse(r, "mixed run ids: %s has run id '%s', %s has '%s'; these files "
              "are not one job",
           paths[m->run_id_file], m->run_id, path, s->run_id);
    return PROBE_ERR_INVALID_ARG;
  }
  if (s->e.world_size != m->world_size) {
    char wa[24], wb[24];
    snprintf(wa, sizeof wa, "%d", (int)m->world_size);
    snprintf(wb, sizeof wb, "%d", (int)s->e.world_size);
    refuse(r, "mixed world sizes: %s has world size %s, %s has %s; these "
              "files are not one job",
           paths[m->run_id_file], wa, path, wb);
    return PROBE_ERR_INVALID_ARG;
  }
  size_t rk = (size_t)s->e.rank;
  if (rk < m->n_rank_entry && m->rank_entry[rk]) {
    char num[24];
    snprintf(num, sizeof num, "%d", (int)s->e.rank);
    refuse(r, "rank %s twice: %s and %s%s", num,
           r->entries[m->rank_entry[rk] - 1].path, path, "");
    return PROBE_ERR_INVALID_ARG;
  }
  return PROBE_OK;
}

/* A set lists every rank its world size implies that no file holds; more
 * than MISSING_MAX of them is taken for a corrupt world_size (one entry
 * each: a file claiming 2^31 ranks would otherwise fill the memory), not
 * for a job that lost that many files. So is a rank number that far past
 * the files of the set (checked before note_rank sizes its table by it). */
enum { MISSING_MAX = 65536 };

/* Notes that entry `index` holds rank `rank` (for check_member). */
static probe_status note_rank(merger *m, int32_t rank, size_t index) {
  if (rank < 0) return PROBE_OK; /* a set of one unranked trace */
  size_t rk = (size_t)rank;
  if (rk >= m->n_rank_entry) {
    size_t n = m->n_rank_entry ? m->n_rank_entry : 64;
    while (n <= rk) n *= 2;
    size_t *p = realloc(m->rank_entry, n * sizeof *p);
    if (!p) return PROBE_ERR_NOMEM;
    memset(p + m->n_rank_entry, 0, (n - m->n_rank_entry) * sizeof *p);
    m->rank_entry = p;
    m->n_rank_entry = n;
  }
  m->rank_entry[rk] = index + 1;
  return PROBE_OK;
}

static probe_status add_entry(probe_ranks *r, size_t *cap,
                              const probe_rank_entry *e, const char *path,
                              const char *error) {
  if (r->n_entries == *cap) {
    size_t c = *cap ? 2 * *cap : 16;
    probe_rank_entry *p = realloc(r->entries, c * sizeof *p);
    if (!p) return PROBE_ERR_NOMEM;
    r->entries = p;
    *cap = c;
  }
  probe_rank_entry *n = &r->entries[r->n_entries++];
  *n = *e;
  n->path = path ? strdup(path) : NULL;
  n->error = error && *error ? strdup(error) : NULL;
  if ((path && !n->path) || (error && *error && !n->error))
    return PROBE_ERR_NOMEM;
  return PROBE_OK;
}

static probe_status take_file(probe_ranks *r, merger *m, probe__rsum *s,
                              const char *const *paths, size_t n_paths,
                              size_t i, probe__rworker *w) {
  probe_status st = w ? probe__rank_read_isolated(w, s, paths, n_paths, i)
                      : probe__rank_read(s, paths[i]);
  if (st < 0) return st;
  if (s->e.status == PROBE_RANK_READ) {
    st = check_member(r, m, s, paths, n_paths, i);
    if (st < 0) return st;
    if (s->e.rank >= 0 && (size_t)s->e.rank > n_paths + MISSING_MAX) {
      char rs[32], ms[32];
      snprintf(rs, sizeof rs, "%d", (int)s->e.rank);
      snprintf(ms, sizeof ms, "%d", (int)MISSING_MAX);
      refuse(r, "%s: corrupt trace set: rank %s leaves more than %s ranks "
                "without a file%s", paths[i], rs, ms, "");
      return PROBE_ERR_CORRUPT;
    }
    st = merge_steps(r, m, s);
    if (st >= 0) st = note_rank(m, s->e.rank, r->n_entries);
    if (st < 0) return st;
  }
  return add_entry(r, &m->cap_entries, &s->e, paths[i],
                   s->e.status == PROBE_RANK_UNREADABLE ? s->error : NULL);
}

/* ---- after the files: missing ranks, order, the first event ------------- */

static int cmp_entry(const void *pa, const void *pb) {
  const probe_rank_entry *a = pa, *b = pb;
  int ua = a->rank < 0, ub = b->rank < 0;
  if (ua != ub) return ua - ub;
  return (a->rank > b->rank) - (a->rank < b->rank);
}

static probe_status add_missing(probe_ranks *r, size_t *cap) {
  int32_t w = 0;
  size_t have_n = 0, wi = 0; /* ranks present (duplicates counted) */
  for (size_t i = 0; i < r->n_entries; i++) {
    if (r->entries[i].rank >= 0) have_n++;
    if (r->entries[i].status == PROBE_RANK_READ &&
        r->entries[i].world_size > w) {
      w = r->entries[i].world_size;
      wi = i;
    }
  }
  r->world_size = w;
  if (w <= 0) return PROBE_OK;
  if ((size_t)w > have_n + MISSING_MAX) {
    char ws[32], ms[32];
    snprintf(ws, sizeof ws, "%d", (int)w);
    snprintf(ms, sizeof ms, "%d", (int)MISSING_MAX);
    refuse(r, "%s: corrupt trace set: world size %s leaves more than %s ranks "
              "without a file%s", r->entries[wi].path, ws, ms, "");
    return PROBE_ERR_CORRUPT;
  }
  char *have = calloc((size_t)w, 1);
  if (!have) return PROBE_ERR_NOMEM;
  for (size_t i = 0; i < r->n_entries; i++)
    if (r->entries[i].rank >= 0 && r->entries[i].rank < w)
      have[r->entries[i].rank] = 1;
  probe_status st = PROBE_OK;
  for (int32_t k = 0; k < w && st >= 0; k++) {
    if (have[k]) continue;
    probe_rank_entry e;
    memset(&e, 0, sizeof e);
    e.rank = k;
    e.status = PROBE_RANK_MISSING;
    e.last_step = e.nf_step = e.first_nonfinite_loss_step = -1;
    e.nf_layer = e.nf_site = -1;
    e.aborted_step = -1;
    st = add_entry(r, cap, &e, NULL, NULL);
  }
  free(have);
  return st;
}

/* a's first non-finite record is before b's by (step, phase, seq, rank). */
static int nf_before(const probe_rank_entry *a, const probe_rank_entry *b) {
  if (a->nf_step != b->nf_step) return a->nf_step < b->nf_step;
  if (a->nf_phase != b->nf_phase) return a->nf_phase < b->nf_phase;
  if (a->nf_seq != b->nf_seq) return a->nf_seq < b->nf_seq;
  return a->rank < b->rank;
}

/* Closed traces that end before the furthest rank's last step, but those
 * of ranks that joined (uneven inputs: they ran out of inputs, the trace
 * says so). */
static void find_ended_early(probe_ranks *r) {
  r->ended_early = -1;
  for (size_t i = 0; i < r->n_entries; i++) {
    const probe_rank_entry *e = &r->entries[i];
    if (probe__rank_joined(e)) r->n_joined++;
    if (!probe__rank_ended_early(r, e)) continue;
    r->n_ended_early++;
    if (r->ended_early < 0 || e->last_step < r->entries[r->ended_early].last_step)
      r->ended_early = (int32_t)i;
  }
}

static void find_first(probe_ranks *r) {
  r->first = r->first_loss = r->stopped_first = -1;
  r->event_step = r->max_last_step = -1;
  for (size_t i = 0; i < r->n_entries; i++) {
    const probe_rank_entry *e = &r->entries[i];
    if (e->status == PROBE_RANK_MISSING) r->n_missing++;
    if (e->status == PROBE_RANK_UNREADABLE) r->n_unreadable++;
    if (e->status != PROBE_RANK_READ) continue;
    r->n_read++;
    if (e->last_step > r->max_last_step) r->max_last_step = e->last_step;
    if (!e->complete) {
      r->n_incomplete++;
      r->n_aborted += e->aborted[0] != '\0';
      if (r->stopped_first < 0 ||
          e->last_step < r->entries[r->stopped_first].last_step)
        r->stopped_first = (int32_t)i;
    }
    if (e->nf_step >= 0 && (r->first < 0 || nf_before(e, &r->entries[r->first])))
      r->first = (int32_t)i;
    if (e->first_nonfinite_loss_step >= 0 &&
        (r->first_loss < 0 || e->first_nonfinite_loss_step <
                                  r->entries[r->first_loss]
                                      .first_nonfinite_loss_step))
      r->first_loss = (int32_t)i;
  }
  find_ended_early(r);
}

/* The rank's first backoff as its first non-finite record, when it comes
 * before its first event. */
static void take_backoff(probe_rank_entry *e) {
  if (e->nf_step >= 0 &&
      (e->nf_step < e->first_backoff_step ||
       (e->nf_step == e->first_backoff_step &&
        (e->nf_phase < e->first_backoff_phase ||
         (e->nf_phase == e->first_backoff_phase &&
          e->nf_seq < e->first_backoff_seq)))))
    return;
  e->nf_step = e->first_backoff_step;
  e->nf_phase = e->first_backoff_phase;
  e->nf_seq = e->first_backoff_seq;
  e->nf_layer = e->first_backoff_layer;
  e->nf_site = e->first_backoff_site;
  e->pre_nonfinite = 0; /* not known for a backoff; unused by the roles */
  e->nf_forward = 0;    /* a backoff has only gradients non-finite */
  e->nf_post = e->first_backoff_post;
  memcpy(e->nf_layer_name, e->first_backoff_layer_name,
         sizeof e->nf_layer_name);
}

/* The second pass: ranks whose first event is not at the set's first step
 * but that had normal scaler backoffs may have received the value through
 * the all-reduce on a step their scaler skipped (a backoff on that rank):
 * their first non-finite record at or after that step, backoffs included,
 * decides: their first backoff when it is at or after that step, else
 * (backoffs before it, e.g. in the scaler's warm-up) their file is read
 * again from that step. */
static probe_status second_pass(probe_ranks *r, const probe_ranks_options *opt,
                                const progress *pg) {
  if (r->first < 0) return PROBE_OK;
  int64_t s0 = r->entries[r->first].nf_step;
  size_t n = 0;
  const char **paths = malloc(r->n_entries * sizeof *paths + 1);
  size_t *which = malloc(r->n_entries * sizeof *which + 1);
  probe__rsum *s = calloc(1, sizeof *s);
  probe_status st = paths && which && s ? PROBE_OK : PROBE_ERR_NOMEM;
  for (size_t i = 0; st >= 0 && i < r->n_entries; i++) {
    probe_rank_entry *e = &r->entries[i];
    if (e->status != PROBE_RANK_READ || e->nf_step == s0 ||
        e->backoff_nonfinite_steps == 0)
      continue;
    if (e->first_backoff_step >= s0) {
      take_backoff(e); /* its first backoff is the first at or after s0 */
      continue;
    }
    which[n] = i; /* backoffs before s0: which is the first after? */
    paths[n++] = e->path;
  }
  probe__rworker w;
  probe__rworker_init(&w);
  if (s) s->raw_from = s0;
  if (st >= 0 && n > 0) st = tell(pg, PROBE_PROGRESS_RANKS_AGAIN, 0, n);
  for (size_t k = 0; st >= 0 && k < n; k++) {
    st = opt->isolate ? probe__rank_read_isolated(&w, s, paths, n, k)
                      : probe__rank_read(s, paths[k]);
    if (st >= 0) st = tell(pg, PROBE_PROGRESS_RANKS_AGAIN, k + 1, n);
    probe_rank_entry *e = &r->entries[which[k]];
    if (st < 0 || s->e.status != PROBE_RANK_READ || s->e.nf_step < 0 ||
        (e->nf_step >= 0 && s->e.nf_step >= e->nf_step))
      continue;
    e->nf_step = s->e.nf_step;
    e->nf_phase = s->e.nf_phase;
    e->nf_seq = s->e.nf_seq;
    e->nf_layer = s->e.nf_layer;
    e->nf_site = s->e.nf_site;
    e->pre_nonfinite = s->e.pre_nonfinite;
    e->post_records = s->e.post_records;
    e->nf_forward = s->e.nf_forward;
    e->nf_post = s->e.nf_post;
    memcpy(e->nf_layer_name, s->e.nf_layer_name, sizeof e->nf_layer_name);
  }
  probe__rworker_stop(&w, NULL);
  if (s) free(s->steps);
  free(s);
  free(paths);
  free(which);
  return st;
}

/* Whether a rank's first non-finite record at the set's first step s is
 * the value another rank was born with, brought by the all-reduce: its
 * own non-finite values there are gradients only (its forward finite)
 * while another rank's forward was not, and the all-reduce brought it a
 * non-finite one. Its own gradients' overflow on that step is then the
 * scaler's routine, which the job's skip of that step took care of; it
 * did not make the NaN the others hold. */
static int reached_by_allreduce(const probe_ranks *r, const probe_rank_entry *e,
                                int64_t s) {
  if (e->nf_step != s) return 0;
  /* its forward and backward finite, its weights not after the update:
   * the all-reduced gradients brought it (seen so even without all-reduce
   * records, e.g. DDP without ampprobe's communication hook) */
  int by_update = e->nf_phase == PROBE_PHASE_OPTIMIZER;
  if (!by_update && (e->nf_forward || !(e->nf_post & 1))) return 0;
  for (size_t i = 0; i < r->n_entries; i++) {
    const probe_rank_entry *o = &r->entries[i];
    /* another rank born in its forward (its first record there; weights
     * non-finite after the update on every rank is no rank's forward: the
     * optimizer's, e.g. a learning rate too high) */
    if (o != e && o->status == PROBE_RANK_READ && o->nf_step == s &&
        o->nf_phase == PROBE_PHASE_FORWARD)
      return 1;
  }
  return 0;
}

/* Each rank's role, and the origin. */
static void assign_roles(probe_ranks *r) {
  r->carried_first_step = r->carried_last_step = -1;
  if (r->first < 0) {
    r->origin = r->first_loss >= 0 ? PROBE_RANKS_ORIGIN_LOSS_ONLY
                                   : PROBE_RANKS_ORIGIN_NONE;
    if (r->first_loss >= 0)
      r->event_step = r->entries[r->first_loss].first_nonfinite_loss_step;
    return;
  }
  int64_t s = r->entries[r->first].nf_step;
  r->event_step = s;
  for (size_t i = 0; i < r->n_entries; i++) {
    probe_rank_entry *e = &r->entries[i];
    if (e->status != PROBE_RANK_READ) continue;
    if (e->nf_step < 0) {
      e->role = PROBE_RANK_ROLE_NONE;
      r->n_unreached++;
    } else if (e->nf_site == PROBE_SITE_GRAD_PRE_ALLREDUCE && e->nf_step == s) {
      /* its gradients were finite; their all-reduce bucket, cast to the
       * all-reduce's dtype, was not */
      e->role = PROBE_RANK_ROLE_CAST;
      r->n_cast++;
    } else if (e->nf_site == PROBE_SITE_GRAD_POST_ALLREDUCE ||
               reached_by_allreduce(r, e, s)) {
      /* its own bucket of that layer, sent earlier in the step, was finite
       * (a non-finite one would have come first); or another rank's
       * forward NaN reached it on a step its own gradients overflowed */
      e->role = PROBE_RANK_ROLE_CARRIED;
      r->n_carried++;
      if (r->carried_first_step < 0 || e->nf_step < r->carried_first_step)
        r->carried_first_step = e->nf_step;
      if (e->nf_step > r->carried_last_step) r->carried_last_step = e->nf_step;
    } else if (e->nf_step == s) {
      e->role = PROBE_RANK_ROLE_BORN;
      r->n_born++;
    } else {
      e->role = PROBE_RANK_ROLE_LATER;
      r->n_later++;
    }
  }
  r->origin = r->n_born ? PROBE_RANKS_ORIGIN_RANK : PROBE_RANKS_ORIGIN_ALLREDUCE;
  /* a loss that went non-finite at an earlier step than any record (the
   * records kept every few steps): the loss leads */
  if (r->first_loss >= 0 &&
      r->entries[r->first_loss].first_nonfinite_loss_step < s) {
    r->origin = PROBE_RANKS_ORIGIN_LOSS_ONLY;
    r->event_step = r->entries[r->first_loss].first_nonfinite_loss_step;
  }
}

int probe_ranks_stopped_tie(const probe_ranks *r) {
  if (!r || r->stopped_first < 0 || r->n_read < 2) return 0;
  int64_t at = r->entries[r->stopped_first].last_step;
  for (size_t i = 0; i < r->n_entries; i++) {
    const probe_rank_entry *e = &r->entries[i];
    if (e->status == PROBE_RANK_READ && (e->complete || e->last_step != at)) return 0;
  }
  return 1;
}

/* ---- the focus rank's full post-mortem ----------------------------------- */

static int32_t pick_focus(const probe_ranks *r) {
  if (r->origin == PROBE_RANKS_ORIGIN_LOSS_ONLY && r->first_loss >= 0)
    return r->first_loss;
  if (r->first >= 0) return r->first;
  if (r->first_loss >= 0) return r->first_loss;
  if (r->stopped_first >= 0) return r->stopped_first;
  for (size_t i = 0; i < r->n_entries; i++)
    if (r->entries[i].status == PROBE_RANK_READ) return (int32_t)i;
  return -1;
}

/* err (cap bytes) gets why the focus could not be read or diagnosed. */
static void run_focus(probe_ranks *r, const probe_ranks_options *opt,
                      const progress *pg, char *err, size_t cap) {
  err[0] = '\0';
  r->focus = pick_focus(r);
  if (r->focus < 0 || !opt->focus_diag) return;
  const char *path = r->entries[r->focus].path;
  probe_trace *t = NULL;
  r->focus_status = opt->isolate
                        ? probe_trace_open_isolated_progress(
                              &t, path, err, cap, pg->fn, pg->user)
                        : probe_trace_open(&t, path);
  if (r->focus_status < 0) {
    if (!opt->isolate)
      snprintf(err, cap, "%s", probe_trace_last_error(NULL));
    return;
  }
  r->focus_diag = calloc(1, sizeof *r->focus_diag);
  if (!r->focus_diag) {
    r->focus_status = PROBE_ERR_NOMEM;
  } else {
    r->focus_status = probe_diag_run_progress(r->focus_diag, t, path,
                                              &opt->diag, pg->fn, pg->user);
    if (r->focus_status < 0) {
      const char *m = probe_trace_last_error(t);
      snprintf(err, cap, "%s%s%s", probe_status_str(r->focus_status),
               m && *m ? ": " : "", m ? m : "");
      probe_diag_free(r->focus_diag);
      free(r->focus_diag);
      r->focus_diag = NULL;
    }
  }
  probe_trace_close(t);
}

static void set_verdict(probe_ranks *r) {
  probe_verdict v = r->focus_diag ? r->focus_diag->verdict
                                  : PROBE_VERDICT_HEALTHY;
  int degraded = r->n_disagreements > 0 || r->n_missing > 0 ||
                 r->n_unreadable > 0 || r->n_incomplete > 0 ||
                 r->n_ended_early > 0 ||
                 r->origin != PROBE_RANKS_ORIGIN_NONE ||
                 (r->focus >= 0 && !r->focus_diag && r->focus_status < 0);
  if (degraded && v < PROBE_VERDICT_DEGRADED) v = PROBE_VERDICT_DEGRADED;
  if (r->first_loss >= 0) v = PROBE_VERDICT_DIVERGED;
  r->verdict = v;
}

/* ---- sentences ------------------------------------------------------------ */

/* "at step 60" or "at steps 60-61" (the steps the carried ranks got it). */
static void carry_when(const probe_ranks *r, char *buf, size_t cap) {
  if (r->carried_first_step == r->carried_last_step)
    snprintf(buf, cap, "at step %lld", (long long)r->carried_first_step);
  else
    snprintf(buf, cap, "at steps %lld-%lld", (long long)r->carried_first_step,
             (long long)r->carried_last_step);
}

/* The first born rank's entry (the set's first record may be a rank's
 * cast or carried one). */
static const probe_rank_entry *first_born(const probe_ranks *r) {
  for (size_t i = 0; i < r->n_entries; i++)
    if (r->entries[i].role == PROBE_RANK_ROLE_BORN) return &r->entries[i];
  return &r->entries[r->first];
}

/* Whether the born ranks' first records are at different layers or sites. */
static int born_sites_differ(const probe_ranks *r) {
  const probe_rank_entry *f = first_born(r);
  for (size_t i = 0; i < r->n_entries; i++) {
    const probe_rank_entry *e = &r->entries[i];
    if (e->role == PROBE_RANK_ROLE_BORN &&
        (e->nf_site != f->nf_site || e->nf_layer != f->nf_layer))
      return 1;
  }
  return 0;
}

#define BORN_SITES_SHOWN 4 /* ranks whose own sites the origin lists */

/* "born on ranks 0-1 (step 3, input/fwd_out)", or with each born rank's
 * own layer and site when they differ (a NaN input on one rank, an FP16
 * overflow on another: two causes, two fixes). Returns the length. */
static size_t text_born(probe_ranks *r, const char *born) {
  char *o = r->origin_text;
  size_t cap = sizeof r->origin_text, at = 0;
#define APPEND(...)                                                            \
  do {                                                                         \
    if (at < cap) {                                                            \
      int n_ = snprintf(o + at, cap - at, __VA_ARGS__);                        \
      at += n_ > 0 ? (size_t)n_ : 0;                                           \
    }                                                                          \
  } while (0)
  const probe_rank_entry *f = first_born(r);
  APPEND("born on rank%s %s (step %lld", r->n_born > 1 ? "s" : "", born,
         (long long)r->event_step);
  if (!born_sites_differ(r)) {
    APPEND(", %s/%s)", f->nf_layer_name,
           f->nf_site >= 0 ? probe_site_name((probe_site)f->nf_site) : "?");
  } else {
    int shown = 0;
    for (size_t i = 0; i < r->n_entries; i++) {
      const probe_rank_entry *e = &r->entries[i];
      if (e->role != PROBE_RANK_ROLE_BORN) continue;
      if (shown++ == BORN_SITES_SHOWN) {
        APPEND("; ...");
        break;
      }
      APPEND("%s rank %d %s/%s", shown == 1 ? ":" : ";", (int)e->rank,
             e->nf_layer_name,
             e->nf_site >= 0 ? probe_site_name((probe_site)e->nf_site) : "?");
    }
    APPEND("; different sites: each rank's own post-mortem has its cause)");
  }
#undef APPEND
  return at;
}

static void text_rank_origin(probe_ranks *r, const char *born,
                             const char *carried) {
  const probe_rank_entry *f = first_born(r);
  size_t at = text_born(r, born);
  if (at < sizeof r->origin_text && r->n_carried) {
    char when[64];
    carry_when(r, when, sizeof when);
    snprintf(r->origin_text + at, sizeof r->origin_text - at,
             "; the all-reduce carried it to rank%s %s %s",
             r->n_carried > 1 ? "s" : "", carried, when);
  } else if (at < sizeof r->origin_text && f->post_records == 0) {
    snprintf(r->origin_text + at, sizeof r->origin_text - at,
             "; no other rank held a non-finite value (the traces have no "
             "grad_post_allreduce records at that step: whether the "
             "all-reduce carried it cannot be seen)");
  } else if (at < sizeof r->origin_text) {
    snprintf(r->origin_text + at, sizeof r->origin_text - at,
             "; the all-reduce did not carry it to any other rank");
  }
  if (r->focus_diag && r->focus_diag->n_findings > 0)
    snprintf(r->fix_text, sizeof r->fix_text, "%s",
             r->focus_diag->findings[0].next_step);
}

/* Appended when ranks could not be read: the origin is among the ranks
 * read. */
static void note_uncertain(probe_ranks *r) {
  size_t at = strlen(r->origin_text);
  if (at < sizeof r->origin_text)
    snprintf(r->origin_text + at, sizeof r->origin_text - at,
             " (among the ranks read: %lld could not be read)",
             (long long)(r->n_missing + r->n_unreadable));
}

/* Appends ", rank" (the first without the comma) to the list in buf (cap
 * bytes, *len used), cut with "..." when it does not fit. */
static void list_rank(char *buf, size_t cap, size_t *len, int32_t rank) {
  if (*len >= cap) return;
  int k = snprintf(buf + *len, cap - *len, "%s%d", *len ? ", " : "", (int)rank);
  *len += k > 0 ? (size_t)k : 0;
  if (*len >= cap && cap > 4) memcpy(buf + cap - 4, "...", 4); /* cut */
}

/* The ranks read whose traces end before the event step (killed before
 * they flushed it): they hold no record of it, so that they were finite
 * before the all-reduce is not seen. Their list into buf; returns how
 * many, *last the latest step they reach. */
static int64_t short_ranks(const probe_ranks *r, char *buf, size_t cap,
                           int64_t *last) {
  size_t len = 0;
  int64_t n = 0;
  *last = -1;
  if (cap) buf[0] = '\0';
  for (size_t i = 0; i < r->n_entries; i++) {
    const probe_rank_entry *e = &r->entries[i];
    if (e->status != PROBE_RANK_READ || e->nf_step >= 0 ||
        e->last_step >= r->event_step)
      continue;
    n++;
    if (e->last_step > *last) *last = e->last_step;
    list_rank(buf, cap, &len, e->rank);
  }
  return n;
}

/* No rank read holds it before the all-reduce. With every rank read, the
 * all-reduce made it: a bucket's cast to the all-reduce's dtype (CAST
 * ranks) or the sum. With ranks not read (or not seen at its step), those are where it most likely
 * came from - a sum of finite values is not NaN, and an FP32 sum of
 * finite gradients does not overflow - so the text leads with them and
 * the fix is to read them, not to change the all-reduce. */
static void text_allreduce_origin(probe_ranks *r, const char *carried) {
  char cast[160], lost[160], shrt[64], unseen[360], fixwho[352];
  probe__rank_list(r, 0, PROBE_RANK_ROLE_CAST, cast, sizeof cast);
  int64_t n_lost = r->n_missing + r->n_unreadable;
  int64_t nl = probe__rank_list(r, 1, PROBE_RANK_MISSING, lost, sizeof lost);
  if (nl == 0) /* unreadable files whose rank is unknown */
    snprintf(lost, sizeof lost, "%lld file%s", (long long)r->n_unreadable,
             r->n_unreadable == 1 ? "" : "s");
  int64_t last = -1, ns = short_ranks(r, shrt, sizeof shrt, &last);
  const char *layer = r->entries[r->first].nf_layer_name;
  const char *who = nl == 0 ? "" : nl == 1 ? "rank " : "ranks ";
  const char *them = n_lost == 1 ? "it" : "them";
  /* several not seen: it came from at least one of them, which is all the
   * evidence says (a clean one among them is as likely as not) */
  const char *one_a = nl > 1 || (nl == 0 && n_lost > 1) ? "one of " : "";
  const char *one_b = ns > 1 ? "one of " : "";
  if (n_lost > 0 || ns > 0) {
    /* NaN: a sum of finite values is not NaN - born on a rank not seen at
     * the step; inf: that, or an FP16 sum of finite values that overflowed */
    int nan = (r->entries[r->first].nf_post & 2) != 0;
    char a[208] = "", b[144] = "", fa[216] = "", fb[128] = "";
    if (n_lost > 0) {
      snprintf(a, sizeof a, "%s%s%s, which could not be read", one_a, who,
               lost);
      snprintf(fa, sizeof fa, "read the trace of %s%s (restore or re-record "
               "%s)", who, lost, them);
    }
    if (ns > 0) {
      if (ns == 1)
        snprintf(b, sizeof b, "rank %s, whose trace ends at step %lld", shrt,
                 (long long)last);
      else
        snprintf(b, sizeof b, "%sranks %s, whose traces end before step %lld",
                 one_b, shrt, (long long)r->event_step);
      snprintf(fb, sizeof fb, "re-record rank%s %s past step %lld",
               ns == 1 ? "" : "s", shrt, (long long)r->event_step);
    }
    snprintf(unseen, sizeof unseen, "%s%s%s", a, a[0] && b[0] ? ", or on " : "", b);
    snprintf(fixwho, sizeof fixwho, "%s%s%s", fa, fa[0] && fb[0] ? " and " : "", fb);
    snprintf(r->origin_text, sizeof r->origin_text,
             "the all-reduce brought %s to rank%s %s (step %lld, layer %s): "
             "every rank read was finite before it%s, so it was born on %s%s",
             nan ? "NaN" : "inf", r->n_carried + r->n_cast > 1 ? "s" : "",
             r->n_carried ? carried : cast, (long long)r->event_step, layer,
             nan ? ", and a sum of finite values is not NaN" : "", unseen,
             nan ? "" : ", or in the all-reduce itself (an FP16 sum of finite "
                        "values that overflowed)");
    snprintf(r->fix_text, sizeof r->fix_text, "%s%s%s", fixwho,
             nan ? " to see where it was born; the all-reduce did not make it"
                 : "; if every rank's gradients were finite, ",
             nan ? "" : PROBE__ALLREDUCE_FIX);
    return;
  }
  if (r->n_cast)
    snprintf(r->origin_text, sizeof r->origin_text,
             "born in the all-reduce: every rank's gradients were finite, "
             "their all-reduce bucket cast to its dtype was not on rank%s %s "
             "(step %lld, layer %s)%s%s",
             r->n_cast > 1 ? "s" : "", cast, (long long)r->event_step, layer,
             r->n_carried ? "; the sum carried it to " : "",
             r->n_carried ? carried : "");
  else
    snprintf(r->origin_text, sizeof r->origin_text,
             "born in the all-reduce: every rank's gradients were finite "
             "before it, the sum was not (step %lld, layer %s; non-finite "
             "after it on rank%s %s)",
             (long long)r->event_step, layer, r->n_carried > 1 ? "s" : "",
             carried);
  snprintf(r->fix_text, sizeof r->fix_text, "%s", PROBE__ALLREDUCE_FIX);
}

/* The ranks whose loss went non-finite at the set's first such step. */
static int64_t loss_ranks(const probe_ranks *r, char *buf, size_t cap) {
  size_t len = 0;
  int64_t n = 0;
  buf[0] = '\0';
  for (size_t i = 0; i < r->n_entries; i++) {
    const probe_rank_entry *e = &r->entries[i];
    if (e->status != PROBE_RANK_READ ||
        e->first_nonfinite_loss_step != r->event_step)
      continue;
    n++;
    list_rank(buf, cap, &len, e->rank);
  }
  return n;
}

/* A non-finite loss first: no record at all, or records only from a later
 * step (kept every few steps). Several ranks at that step: the job's mean
 * loss (the C trainer's) names no rank. */
static void text_loss_origin(probe_ranks *r) {
  char who[160], when[400] = "";
  snprintf(r->fix_text, sizeof r->fix_text,
           "record every step (--trace; the Python tracer's every=1) and run "
           "again to see where it was born");
  int64_t n = loss_ranks(r, who, sizeof who);
  if (r->first >= 0)
    snprintf(when, sizeof when, ", before any per-layer record (the first "
             "is at step %lld, rank %d %s/%s: no record was kept at step "
             "%lld; record every step to see where)",
             (long long)r->entries[r->first].nf_step,
             (int)r->entries[r->first].rank, r->entries[r->first].nf_layer_name,
             r->entries[r->first].nf_site >= 0
                 ? probe_site_name((probe_site)r->entries[r->first].nf_site)
                 : "?",
             (long long)r->event_step);
  else
    snprintf(when, sizeof when, "; no per-layer record shows where (record "
             "with --trace)");
  if (n == r->n_read && n > 1 && r->n_missing + r->n_unreadable == 0)
    snprintf(r->origin_text, sizeof r->origin_text,
             "the loss went non-finite on every rank at step %lld (the job's "
             "mean loss: it names no rank)%s", (long long)r->event_step, when);
  else
    snprintf(r->origin_text, sizeof r->origin_text,
             "the loss went non-finite first on rank%s %s at step %lld%s",
             n > 1 ? "s" : "", who, (long long)r->event_step, when);
}

static void write_texts(probe_ranks *r) {
  char born[160], carried[160];
  probe__rank_list(r, 0, PROBE_RANK_ROLE_BORN, born, sizeof born);
  probe__rank_list(r, 0, PROBE_RANK_ROLE_CARRIED, carried, sizeof carried);
  if (r->origin == PROBE_RANKS_ORIGIN_RANK) {
    text_rank_origin(r, born, carried);
  } else if (r->origin == PROBE_RANKS_ORIGIN_ALLREDUCE) {
    text_allreduce_origin(r, carried);
  } else if (r->origin == PROBE_RANKS_ORIGIN_LOSS_ONLY) {
    text_loss_origin(r);
  } else {
    snprintf(r->origin_text, sizeof r->origin_text,
             "no non-finite value on any rank read");
  }
  int64_t last;
  r->origin_uncertain = r->origin != PROBE_RANKS_ORIGIN_NONE &&
                        (r->n_missing + r->n_unreadable > 0 ||
                         (r->origin == PROBE_RANKS_ORIGIN_ALLREDUCE &&
                          short_ranks(r, NULL, 0, &last) > 0));
  /* (an all-reduce origin says itself what the ranks not read mean) */
  if (r->origin_uncertain && r->origin != PROBE_RANKS_ORIGIN_ALLREDUCE)
    note_uncertain(r);
}

/* ---- the entry point ----------------------------------------------------- */

static void merger_free(merger *m) {
  free(m->rank_entry);
  free(m->ref);
  free(m->ref_rank);
  free(m->tmp);
  free(m->tmp_rank);
}

static probe_status read_all_files(probe_ranks *r, const char *const *paths,
                                   size_t n_paths,
                                   const probe_ranks_options *opt,
                                   const progress *pg, size_t *cap_entries) {
  merger m;
  memset(&m, 0, sizeof m);
  probe__rsum *s = calloc(1, sizeof *s);
  probe_status st = s ? PROBE_OK : PROBE_ERR_NOMEM;
  if (s) s->raw_from = -1;
  probe_status first_err = PROBE_OK;
  probe__rworker w;
  probe__rworker_init(&w);
  if (st >= 0) st = tell(pg, PROBE_PROGRESS_RANKS, 0, n_paths);
  for (size_t i = 0; i < n_paths && st >= 0; i++) {
    st = take_file(r, &m, s, paths, n_paths, i, opt->isolate ? &w : NULL);
    if (st >= 0 && s->e.status == PROBE_RANK_UNREADABLE &&
        first_err == PROBE_OK)
      first_err = (probe_status)s->e.error_status;
    if (st >= 0) st = tell(pg, PROBE_PROGRESS_RANKS, i + 1, n_paths);
  }
  probe__rworker_stop(&w, NULL);
  *cap_entries = m.cap_entries;
  if (st >= 0)
    probe_text_escape(r->run_id, sizeof r->run_id, m.run_id);
  if (s) free(s->steps);
  free(s);
  merger_free(&m);
  if (st >= 0 && !m.first_meta) {
    st = first_err < 0 ? first_err : PROBE_ERR_CORRUPT;
    if (r->n_entries && r->entries[0].error)
      refuse(r, "%s: %s%s%s", r->entries[0].path, r->entries[0].error, "",
             "");
  }
  return st;
}

probe_status probe_ranks_run(probe_ranks *r, const char *const *paths,
                             size_t n_paths, const probe_ranks_options *opt) {
  return probe_ranks_run_progress(r, paths, n_paths, opt, NULL, NULL);
}

probe_status probe_ranks_run_progress(probe_ranks *r, const char *const *paths,
                                      size_t n_paths,
                                      const probe_ranks_options *opt,
                                      probe_progress_fn fn, void *user) {
  const progress pg = {fn, user};
  if (!r) {
    probe__trace_open_msg("probe_ranks_run: NULL result");
    return PROBE_ERR_INVALID_ARG;
  }
  memset(r, 0, sizeof *r);
  r->first = r->focus = r->stopped_first = r->first_loss = -1;
  r->ended_early = -1;
  r->event_step = -1;
  if (!paths || n_paths == 0) {
    snprintf(r->error, sizeof r->error, "probe_ranks_run: no paths");
    probe__trace_open_msg("%s", r->error);
    return PROBE_ERR_INVALID_ARG;
  }
  for (size_t i = 0; i < n_paths; i++)
    if (!paths[i]) {
      snprintf(r->error, sizeof r->error, "probe_ranks_run: path %zu is NULL",
               i);
      probe__trace_open_msg("%s", r->error);
      return PROBE_ERR_INVALID_ARG;
    }
  probe_ranks_options defaults;
  if (!opt) {
    probe_ranks_options_init(&defaults);
    opt = &defaults;
  }
  r->n_files = n_paths;
  size_t cap = 0;
  probe_status st = read_all_files(r, paths, n_paths, opt, &pg, &cap);
  if (st >= 0) st = add_missing(r, &cap);
  if (st < 0) return st;
  qsort(r->entries, r->n_entries, sizeof *r->entries, cmp_entry);
  for (int f = 0; f < PROBE_RANKS_FIELD_COUNT; f++)
    r->n_disagreements += r->disagree[f].found;
  find_first(r);
  st = second_pass(r, opt, &pg);
  if (st < 0) return st;
  assign_roles(r);
  char err[PROBE_RANKS_TEXT_MAX];
  run_focus(r, opt, &pg, err, sizeof err);
  if (r->focus_status == PROBE_ERR_NOMEM ||
      r->focus_status == PROBE_ERR_INTERRUPTED)
    return r->focus_status;
  /* the focus is the one rank read whole (isolated: its child reads every
   * row; the others only their steps and the records at their event,
   * docs/multirank.md "What is read") */
  if (r->focus >= 0 && r->focus_diag && opt->isolate) r->n_read_whole = 1;
  if (r->focus_status < 0 && n_paths == 1) {
    /* a set of one whose file fails its full read (the summary reads only
     * part of it): unreadable, and nothing else was read - refused as a
     * set without a readable trace, with the reader's words */
    const char *m = probe__msg_after_path(err, paths[0]);
    refuse(r, "%s: %s%s%s", paths[0],
           m[0] ? m : probe_status_str(r->focus_status), "", "");
    return r->focus_status;
  }
  if (r->focus_status < 0 && !r->focus_diag &&
      r->entries[r->focus].status == PROBE_RANK_READ && err[0]) {
    /* damaged outside the rows its summary read: unreadable, not "read"
     * (what its rows said stays: every row read was checked) */
    probe_rank_entry *e = &r->entries[r->focus];
    e->status = PROBE_RANK_UNREADABLE;
    e->error_status = r->focus_status;
    free(e->error);
    e->error = strdup(probe__msg_after_path(err, e->path));
    if (!e->error) return PROBE_ERR_NOMEM;
    r->n_read--;
    r->n_unreadable++;
    if (!e->complete) r->n_incomplete--;
    if (!e->complete && e->aborted[0]) r->n_aborted--;
    if (e->complete && e->joined) r->n_joined--;
  }
  set_verdict(r);
  write_texts(r);
  return PROBE_OK;
}

void probe_ranks_free(probe_ranks *r) {
  if (!r) return;
  for (size_t i = 0; i < r->n_entries; i++) {
    free(r->entries[i].path);
    free(r->entries[i].error);
  }
  free(r->entries);
  if (r->focus_diag) {
    probe_diag_free(r->focus_diag);
    free(r->focus_diag);
  }
  memset(r, 0, sizeof *r);
  r->first = r->focus = r->stopped_first = r->first_loss = -1;
}

int probe__ranks_read_one_of_many(const probe_ranks *r) {
  int many = 0;
  for (size_t i = 0; i < r->n_entries; i++)
    if (r->entries[i].status == PROBE_RANK_READ)
      many = r->entries[i].rank >= 0 && r->entries[i].world_size > 1;
  return many;
}
