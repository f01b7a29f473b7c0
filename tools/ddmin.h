/*
 * tools/ddmin.h - delta debugging (ddmin) over a set of at most 64
 * candidates, minimising a *passing* set: the core of `ampprobe bisect`.
 *
 * Direction. bisect looks for a minimal set S of candidates (module kinds or
 * layers) such that training with S forced to FP32 PASSES. The premises are
 * that the empty set fails (everything in FP16 diverges) and the full set C
 * passes. ddmin (Zeller & Hildebrandt, "Simplifying and Isolating
 * Failure-Inducing Input", TSE 2002) minimises a set while it keeps a
 * property; here the property kept is "passes", so the algorithm is ddmin
 * applied as is, with "pass" in the role ddmin's paper gives to "fail":
 *
 *   S = C, n = 2
 *   while |S| >= 2:
 *     split S (in candidate order) into n near-equal parts D1..Dn
 *     if some Di passes          : S = Di,      n = 2
 *     elif some S\Di passes (n>2): S = S\Di,    n = max(n-1, 2)
 *     elif n < |S|               : n = min(2n, |S|)
 *     else                       : stop
 *   if |S| == 1 and the empty set passes: S = {}
 *
 * The result is 1-minimal: dropping any one element of S makes it fail (the
 * last round tested every S\{i}). Trials are memoised by set, so no set is
 * ever run twice. Trial bound, with the empty set's verdict known (bisect's
 * premise) and counting the full set's trial: for k culprits among n
 * candidates and a monotone oracle (a superset of a passing set passes),
 *   k = 1:  trials <= 1 + 2*ceil(log2 n)
 *   k >= 1: trials <= 1 + 4*k*ceil(log2 n)
 * checked in tests/tools/test_ddmin.c over every placement of k <= 3 culprits
 * among n <= 16 candidates and for every k = 1..16 among 16. Measured worst
 * cases for n = 16: 9 (k=1), 27 (k=2), 47 (k=3), 61 (k=4) trials, against
 * 2^16 subsets. Without monotonicity ddmin's worst case is quadratic,
 * (|C|^2 + 3|C|)/2, never exponential, and the answer is still 1-minimal.
 *
 * Parallelism. Each round's sets are handed to the oracle as one ordered
 * batch [D1..Dn, S\D1..S\Dn] (memoised sets left out). The oracle may run
 * them concurrently; it must answer every set up to and including the first
 * one that passes and may leave the rest PROBE_DDMIN_UNKNOWN. ddmin takes the
 * first passing set in batch order, so the answer does not depend on how many
 * trials ran in parallel (only the count of speculative trials does).
 */
#ifndef AMPPROBE_TOOLS_DDMIN_H
#define AMPPROBE_TOOLS_DDMIN_H

#include <stddef.h>
#include <stdint.h>

#include "ampprobe/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define PROBE_DDMIN_MAX 64 /* candidates; a set is a uint64_t bit mask */

enum {
  PROBE_DDMIN_UNKNOWN = -1,
  PROBE_DDMIN_FAIL = 0,
  PROBE_DDMIN_PASS = 1,
};

/* Batch oracle: fill verdict[i] for sets[i], i < count, in order, at least up
 * to the first PROBE_DDMIN_PASS. Returns PROBE_OK, or an error (for example
 * PROBE_ERR_INTERRUPTED) which stops ddmin and is returned by it. Verdicts it
 * did give before an error are still memoised. */
typedef probe_status (*probe_ddmin_oracle)(void *ctx, const uint64_t *sets,
                                           size_t count, int *verdict);

typedef struct probe_ddmin_trial {
  uint64_t set;
  int verdict; /* PROBE_DDMIN_PASS or PROBE_DDMIN_FAIL */
  int seeded;  /* 1 when given by probe_ddmin_seed, not asked of the oracle */
} probe_ddmin_trial;

typedef struct probe_ddmin {
  int n; /* candidates, 1..64 */
  probe_ddmin_oracle oracle;
  void *ctx;
  probe_ddmin_trial *memo; /* every known verdict, in the order learnt */
  size_t n_memo, cap_memo;
  size_t trials;  /* verdicts the oracle gave (seeded ones not counted) */
  size_t rounds;  /* oracle batches */
} probe_ddmin;

probe_status probe_ddmin_init(probe_ddmin *d, int n, probe_ddmin_oracle oracle,
                              void *ctx);
void probe_ddmin_free(probe_ddmin *d);

/* Records a verdict already known (bisect's premise runs), so ddmin never
 * asks for it again. */
probe_status probe_ddmin_seed(probe_ddmin *d, uint64_t set, int verdict);
/* PROBE_DDMIN_UNKNOWN when the set has not been tried. */
int probe_ddmin_lookup(const probe_ddmin *d, uint64_t set);

/* Runs ddmin from the full set (all n candidates), which must pass: when it
 * is not known yet it is asked of the oracle first, and PROBE_ERR_STATE is
 * returned if it fails. On success *result is a 1-minimal passing set. */
probe_status probe_ddmin_minimize(probe_ddmin *d, uint64_t *result);

/* Helpers. */
static inline int probe_set_count(uint64_t s) { return __builtin_popcountll(s); }
static inline uint64_t probe_set_full(int n) {
  return n >= 64 ? ~(uint64_t)0 : (((uint64_t)1 << n) - 1);
}

#ifdef __cplusplus
}
#endif
#endif /* AMPPROBE_TOOLS_DDMIN_H */
