/*
 * libprobe/analysis/ddmin.c - delta debugging over candidate bit masks, minimising a
 * passing set with memoised, batched trials. The algorithm, its direction
 * and its trial bound are described in ampprobe/analysis.h. Pure: no I/O, no processes;
 * the oracle callback does the work.
 */
#include "ampprobe/analysis.h"
#include "../format.h" /* probe__trace_open_msg */

#include <stdlib.h>
#include <string.h>

probe_status probe_ddmin_init(probe_ddmin *d, int n, probe_ddmin_oracle oracle,
                              void *ctx) {
  if (!d || !oracle || n < 1 || n > PROBE_DDMIN_MAX) {
    probe__trace_open_msg("probe_ddmin_init: %s",
                          !d ? "NULL ddmin" : !oracle ? "NULL oracle"
                                                      : "n outside 1..64");
    return PROBE_ERR_INVALID_ARG;
  }
  memset(d, 0, sizeof *d);
  d->n = n;
  d->oracle = oracle;
  d->ctx = ctx;
  return PROBE_OK;
}

void probe_ddmin_free(probe_ddmin *d) {
  if (!d)
    return;
  free(d->memo);
  d->memo = NULL;
  d->n_memo = d->cap_memo = 0;
}

/* st is one of probe_status's values */
static int status_known(probe_status st) {
  switch (st) {
#define STATUS_CASE_(name, value, desc) case PROBE_##name:
    PROBE_STATUS_MAP(STATUS_CASE_)
#undef STATUS_CASE_
    return 1;
  }
  return 0;
}

int probe_ddmin_lookup(const probe_ddmin *d, uint64_t set) {
  if (!d) return PROBE_DDMIN_UNKNOWN;
  for (size_t i = 0; i < d->n_memo; i++)
    if (d->memo[i].set == set)
      return d->memo[i].verdict;
  return PROBE_DDMIN_UNKNOWN;
}

static probe_status memo_add(probe_ddmin *d, uint64_t set, int verdict,
                             int seeded) {
  if (d->n_memo == d->cap_memo) {
    size_t cap = d->cap_memo ? 2 * d->cap_memo : 32;
    probe_ddmin_trial *m = realloc(d->memo, cap * sizeof *m);
    if (!m)
      return PROBE_ERR_NOMEM;
    d->memo = m;
    d->cap_memo = cap;
  }
  d->memo[d->n_memo++] = (probe_ddmin_trial){set, verdict, seeded};
  return PROBE_OK;
}

probe_status probe_ddmin_seed(probe_ddmin *d, uint64_t set, int verdict) {
  if (!d || (verdict != PROBE_DDMIN_PASS && verdict != PROBE_DDMIN_FAIL) ||
      d->n < 1 || d->n > PROBE_DDMIN_MAX || (set & ~probe_set_full(d->n))) {
    probe__trace_open_msg(
        "probe_ddmin_seed: %s",
        !d ? "NULL ddmin"
        : (verdict != PROBE_DDMIN_PASS && verdict != PROBE_DDMIN_FAIL)
            ? "verdict neither PROBE_DDMIN_PASS nor PROBE_DDMIN_FAIL"
        : (d->n < 1 || d->n > PROBE_DDMIN_MAX)
            ? "ddmin not prepared by probe_ddmin_init"
            : "set has members beyond the n candidates");
    return PROBE_ERR_INVALID_ARG;
  }
  int known = probe_ddmin_lookup(d, set);
  if (known != PROBE_DDMIN_UNKNOWN)
    return known == verdict ? PROBE_OK : PROBE_ERR_STATE;
  return memo_add(d, set, verdict, 1);
}

/* Evaluates the ordered list sets[0..count) and returns in *first the index
 * of the first passing set, or count when none passes. Memoised sets are not
 * asked again; the oracle gets the unknown ones that precede the first
 * memoised pass, in order. */
static probe_status eval_batch(probe_ddmin *d, const uint64_t *sets,
                               size_t count, size_t *first) {
  uint64_t ask[2 * PROBE_DDMIN_MAX + 1];
  int verdict[2 * PROBE_DDMIN_MAX + 1];
  size_t n_ask = 0;
  for (size_t i = 0; i < count; i++) {
    int v = probe_ddmin_lookup(d, sets[i]);
    if (v == PROBE_DDMIN_PASS)
      break;
    if (v == PROBE_DDMIN_UNKNOWN) {
      int dup = 0;
      for (size_t j = 0; j < n_ask; j++)
        dup |= ask[j] == sets[i];
      if (!dup)
        ask[n_ask++] = sets[i];
    }
  }
  if (n_ask > 0) {
    for (size_t i = 0; i < n_ask; i++)
      verdict[i] = PROBE_DDMIN_UNKNOWN;
    d->rounds++;
    probe_status st = d->oracle(d->ctx, ask, n_ask, verdict);
    /* a value outside the status list (a positive one would read as
     * success to a caller's st < 0) breaks the oracle's contract */
    if (!status_known(st)) st = PROBE_ERR_STATE;
    /* Keep what was answered, even on error; check the ordering contract. */
    int passed = 0, gap = 0;
    for (size_t i = 0; i < n_ask; i++) {
      if (verdict[i] == PROBE_DDMIN_UNKNOWN) {
        gap = 1;
        continue;
      }
      if (verdict[i] != PROBE_DDMIN_PASS && verdict[i] != PROBE_DDMIN_FAIL)
        return PROBE_ERR_STATE;
      if (gap && !passed && st == PROBE_OK)
        return PROBE_ERR_STATE; /* an unknown before the first pass */
      probe_status ms = memo_add(d, ask[i], verdict[i], 0);
      if (ms != PROBE_OK)
        return ms;
      d->trials++;
      passed |= verdict[i] == PROBE_DDMIN_PASS;
    }
    if (st != PROBE_OK)
      return st;
    if (!passed && gap)
      return PROBE_ERR_STATE; /* no pass, yet not everything answered */
  }
  *first = count;
  for (size_t i = 0; i < count; i++) {
    if (probe_ddmin_lookup(d, sets[i]) == PROBE_DDMIN_PASS) {
      *first = i;
      break;
    }
  }
  return PROBE_OK;
}

/* The members of s, ascending, into idx; returns how many. */
static int set_members(uint64_t s, int *idx) {
  int m = 0;
  for (int i = 0; i < 64; i++)
    if (s >> i & 1)
      idx[m++] = i;
  return m;
}

probe_status probe_ddmin_minimize(probe_ddmin *d, uint64_t *result) {
  /* a zeroed or foreign struct (no oracle, n out of range) is refused, not
   * called through a NULL pointer */
  if (!d || !result || !d->oracle || d->n < 1 || d->n > PROBE_DDMIN_MAX) {
    probe__trace_open_msg(
        "probe_ddmin_minimize: %s",
        !d ? "NULL ddmin" : !result ? "NULL result"
        : !d->oracle ? "no oracle (ddmin not prepared by probe_ddmin_init)"
                     : "n outside 1..64 (ddmin not prepared by "
                       "probe_ddmin_init)");
    return PROBE_ERR_INVALID_ARG;
  }
  uint64_t s = probe_set_full(d->n);
  size_t first;
  probe_status st = eval_batch(d, &s, 1, &first);
  if (st != PROBE_OK)
    return st;
  if (first != 0)
    return PROBE_ERR_STATE; /* the full set must pass */

  int n = 2;
  int idx[64];
  uint64_t batch[2 * PROBE_DDMIN_MAX];
  while (probe_set_count(s) >= 2) {
    int m = set_members(s, idx);
    if (n > m)
      n = m;
    size_t count = 0;
    for (int j = 0; j < n; j++) { /* the parts D1..Dn */
      uint64_t part = 0;
      for (int k = j * m / n; k < (j + 1) * m / n; k++)
        part |= (uint64_t)1 << idx[k];
      batch[count++] = part;
    }
    if (n > 2) /* complements; for n == 2 they are the parts themselves */
      for (int j = 0; j < n; j++)
        batch[n + j] = s & ~batch[j], count++;
    st = eval_batch(d, batch, count, &first);
    if (st != PROBE_OK)
      return st;
    if (first < (size_t)n) {
      s = batch[first];
      n = 2;
    } else if (first < count) {
      s = batch[first];
      n = n - 1 > 2 ? n - 1 : 2;
    } else if (n < m) {
      n = 2 * n < m ? 2 * n : m;
    } else {
      break; /* every S\{i} fails: 1-minimal */
    }
  }
  if (probe_set_count(s) == 1) {
    uint64_t empty = 0;
    st = eval_batch(d, &empty, 1, &first);
    if (st != PROBE_OK)
      return st;
    if (first == 0)
      s = 0;
  }
  *result = s;
  return PROBE_OK;
}
