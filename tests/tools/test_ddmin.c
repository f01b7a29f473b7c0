/*
 * tests/tools/test_ddmin.c - Check suite for libprobe/analysis/ddmin.c, the delta
 * debugging core of `ampprobe bisect`, with synthetic oracles: single and
 * multiple culprits, interacting culprits, either-suffices culprits, a
 * non-monotone oracle, memoisation, batches answered out of order, errors.
 * Trial counts are asserted against the bound documented in ddmin.h.
 */
#include <check.h>
#include <math.h>
#include <stdlib.h>

#include "ampprobe/analysis.h"

/* ---- oracles -------------------------------------------------------------- */

typedef struct oracle {
  uint64_t need;     /* monotone: passes iff need is a subset */
  uint64_t any;      /* if nonzero: passes iff it meets `any` */
  int nonmono;       /* passes iff popcount(S & need) is odd-or-full... */
  int answer_all;    /* answer the whole batch (a parallel runner) */
  int fail_after;    /* return PROBE_ERR_INTERRUPTED after this many trials */
  int break_order;   /* violate the contract: UNKNOWN before the pass */
  uint64_t seen[4096];
  size_t n_seen;
  int repeats;       /* sets asked twice (memoisation broken) */
} oracle;

static int oracle_pass(const oracle *o, uint64_t s) {
  if (o->any)
    return (s & o->any) != 0;
  if (o->nonmono) /* passes iff it holds the first need bit and an even
                     number of the others: not monotone */
    return (s & o->need & -o->need) &&
           (probe_set_count(s & o->need) % 2 == 1);
  return (s & o->need) == o->need;
}

static probe_status oracle_fn(void *ctx, const uint64_t *sets, size_t n,
                              int *verdict) {
  oracle *o = ctx;
  for (size_t i = 0; i < n; i++) {
    if (o->fail_after >= 0 && (int)o->n_seen >= o->fail_after)
      return PROBE_ERR_INTERRUPTED;
    for (size_t j = 0; j < o->n_seen; j++)
      o->repeats += o->seen[j] == sets[i];
    if (o->n_seen < 4096)
      o->seen[o->n_seen++] = sets[i];
    if (o->break_order && i == 0 && n > 1)
      continue; /* leave sets[0] unknown and go on */
    verdict[i] = oracle_pass(o, sets[i]) ? PROBE_DDMIN_PASS : PROBE_DDMIN_FAIL;
    if (verdict[i] == PROBE_DDMIN_PASS && !o->answer_all)
      break;
  }
  return PROBE_OK;
}

static void oracle_init(oracle *o) {
  *o = (oracle){0};
  o->fail_after = -1;
}

/* Runs ddmin over n candidates with the premise "empty fails" seeded, as
 * bisect does. Returns the result and the trial count. */
static uint64_t run(oracle *o, int n, size_t *trials) {
  probe_ddmin d;
  ck_assert_int_eq(probe_ddmin_init(&d, n, oracle_fn, o), PROBE_OK);
  ck_assert_int_eq(probe_ddmin_seed(&d, 0, PROBE_DDMIN_FAIL), PROBE_OK);
  uint64_t r = ~(uint64_t)0;
  ck_assert_int_eq(probe_ddmin_minimize(&d, &r), PROBE_OK);
  if (trials)
    *trials = d.trials;
  probe_ddmin_free(&d);
  ck_assert_int_eq(o->repeats, 0);
  return r;
}

static int ceil_log2(int n) {
  int l = 0;
  while ((1 << l) < n)
    l++;
  return l;
}

/* The bound documented in ddmin.h (the +1 is the full-set trial). */
static size_t bound(int k, int n) {
  int l = ceil_log2(n);
  return k == 1 ? (size_t)(1 + 2 * l) : (size_t)(1 + 4 * k * l);
}

/* ---- tests ---------------------------------------------------------------- */

START_TEST(test_single_culprit) {
  oracle o;
  oracle_init(&o);
  o.need = 1u << 5;
  size_t t;
  ck_assert_uint_eq(run(&o, 16, &t), 1u << 5);
  ck_assert_uint_le(t, 9); /* 1 + 2 log2 16 */
}
END_TEST

START_TEST(test_one_candidate) {
  oracle o;
  oracle_init(&o);
  o.need = 1;
  size_t t;
  ck_assert_uint_eq(run(&o, 1, &t), 1);
  ck_assert_uint_eq(t, 1); /* only the full set; empty was seeded */
}
END_TEST

START_TEST(test_two_culprits_three_kinds) {
  /* bisect's common case: bn, softmax, revin with revin and softmax needed */
  oracle o;
  oracle_init(&o);
  o.need = 0x6;
  size_t t;
  ck_assert_uint_eq(run(&o, 3, &t), 0x6);
  ck_assert_uint_le(t, 7);
}
END_TEST

START_TEST(test_interacting_need_both) {
  /* far apart among 16: neither half passes alone, both are needed */
  oracle o;
  oracle_init(&o);
  o.need = (1u << 0) | (1u << 15);
  size_t t;
  ck_assert_uint_eq(run(&o, 16, &t), o.need);
  ck_assert_uint_le(t, bound(2, 16));
}
END_TEST

START_TEST(test_either_suffices) {
  /* either of two candidates alone fixes it: the answer is one of them */
  oracle o;
  oracle_init(&o);
  o.any = (1u << 3) | (1u << 9);
  uint64_t r = run(&o, 12, NULL);
  ck_assert(r == (1u << 3) || r == (1u << 9));
}
END_TEST

/* Every placement of k culprits among n candidates, n = k..16: exact answer,
 * no set tried twice, trials within the bound, far below 2^n. */
START_TEST(test_monotone_exhaustive) {
  int k = _i;
  for (int n = k; n <= 16; n++) {
    size_t worst = 0;
    for (uint64_t m = 0; m < ((uint64_t)1 << n); m++) {
      if (probe_set_count(m) != k)
        continue;
      oracle o;
      oracle_init(&o);
      o.need = m;
      size_t t;
      ck_assert_uint_eq(run(&o, n, &t), m);
      ck_assert_msg(t <= bound(k, n), "k=%d n=%d need=%llx: %zu trials > %zu",
                    k, n, (unsigned long long)m, t, bound(k, n));
      if (t > worst)
        worst = t;
    }
    ck_assert_uint_lt(worst, (size_t)1 << n); /* never exhaustive */
  }
}
END_TEST

/* Culprit sets of every size 1..16 among 16 candidates (spread with a
 * stride), each within the bound. */
START_TEST(test_monotone_sizes) {
  int k = _i;
  uint64_t need = 0;
  for (int j = 0, pos = 0; j < k; j++, pos = (pos + 7) % 16)
    need |= (uint64_t)1 << pos;
  ck_assert_int_eq(probe_set_count(need), k);
  oracle o;
  oracle_init(&o);
  o.need = need;
  size_t t;
  ck_assert_uint_eq(run(&o, 16, &t), need);
  ck_assert_msg(t <= bound(k, 16), "k=%d: %zu trials > %zu", k, t,
                bound(k, 16));
}
END_TEST

START_TEST(test_nonmonotone_is_one_minimal) {
  /* The oracle is not monotone; ddmin still returns a passing set from
   * which no single element can be dropped. */
  for (uint64_t need = 3; need < 256; need += 7) {
    oracle o;
    oracle_init(&o);
    o.nonmono = 1;
    o.need = need;
    int n = 8;
    if (!oracle_pass(&o, probe_set_full(n)))
      continue;
    uint64_t r = run(&o, n, NULL);
    ck_assert(oracle_pass(&o, r));
    for (int i = 0; i < n; i++)
      if (r >> i & 1)
        ck_assert(!oracle_pass(&o, r & ~((uint64_t)1 << i)));
  }
}
END_TEST

START_TEST(test_parallel_batches_same_answer) {
  /* A runner that answers whole batches (speculation) finds the same set. */
  for (uint64_t need = 1; need < 1024; need = need * 3 + 1) {
    oracle a, b;
    oracle_init(&a);
    oracle_init(&b);
    a.need = b.need = need;
    b.answer_all = 1;
    size_t ta, tb;
    uint64_t ra = run(&a, 10, &ta), rb = run(&b, 10, &tb);
    ck_assert_uint_eq(ra, rb);
    ck_assert_uint_ge(tb, ta);
  }
}
END_TEST

START_TEST(test_empty_set_passes) {
  /* If nothing is needed ddmin ends at the empty set (bisect checks this
   * premise first; ddmin stays correct without it). */
  oracle o;
  oracle_init(&o);
  o.need = 0;
  probe_ddmin d;
  ck_assert_int_eq(probe_ddmin_init(&d, 5, oracle_fn, &o), PROBE_OK);
  uint64_t r = 1;
  ck_assert_int_eq(probe_ddmin_minimize(&d, &r), PROBE_OK);
  ck_assert_uint_eq(r, 0);
  probe_ddmin_free(&d);
}
END_TEST

START_TEST(test_full_set_fails) {
  oracle o;
  oracle_init(&o);
  o.need = (uint64_t)1 << 7; /* candidate 7 does not exist among 4 */
  probe_ddmin d;
  ck_assert_int_eq(probe_ddmin_init(&d, 4, oracle_fn, &o), PROBE_OK);
  uint64_t r;
  ck_assert_int_eq(probe_ddmin_minimize(&d, &r), PROBE_ERR_STATE);
  probe_ddmin_free(&d);
}
END_TEST

START_TEST(test_seeded_not_asked) {
  oracle o;
  oracle_init(&o);
  o.need = 0x4;
  probe_ddmin d;
  ck_assert_int_eq(probe_ddmin_init(&d, 3, oracle_fn, &o), PROBE_OK);
  ck_assert_int_eq(probe_ddmin_seed(&d, 0x7, PROBE_DDMIN_PASS), PROBE_OK);
  ck_assert_int_eq(probe_ddmin_seed(&d, 0x0, PROBE_DDMIN_FAIL), PROBE_OK);
  /* contradicting a known verdict is refused */
  ck_assert_int_eq(probe_ddmin_seed(&d, 0x7, PROBE_DDMIN_FAIL),
                   PROBE_ERR_STATE);
  ck_assert_int_eq(probe_ddmin_seed(&d, 0x8, PROBE_DDMIN_FAIL),
                   PROBE_ERR_INVALID_ARG);
  uint64_t r;
  ck_assert_int_eq(probe_ddmin_minimize(&d, &r), PROBE_OK);
  ck_assert_uint_eq(r, 0x4);
  for (size_t i = 0; i < o.n_seen; i++)
    ck_assert(o.seen[i] != 0x7 && o.seen[i] != 0x0);
  ck_assert_int_eq(probe_ddmin_lookup(&d, 0x7), PROBE_DDMIN_PASS);
  probe_ddmin_free(&d);
}
END_TEST

START_TEST(test_oracle_error_stops) {
  oracle o;
  oracle_init(&o);
  o.need = 0x81;
  o.fail_after = 2;
  probe_ddmin d;
  ck_assert_int_eq(probe_ddmin_init(&d, 8, oracle_fn, &o), PROBE_OK);
  uint64_t r;
  ck_assert_int_eq(probe_ddmin_minimize(&d, &r), PROBE_ERR_INTERRUPTED);
  ck_assert_uint_eq(d.trials, 2); /* the answers given are kept */
  probe_ddmin_free(&d);
}
END_TEST

START_TEST(test_contract_violation) {
  oracle o;
  oracle_init(&o);
  o.need = 0x80;
  o.break_order = 1;
  probe_ddmin d;
  ck_assert_int_eq(probe_ddmin_init(&d, 8, oracle_fn, &o), PROBE_OK);
  uint64_t r;
  ck_assert_int_eq(probe_ddmin_minimize(&d, &r), PROBE_ERR_STATE);
  probe_ddmin_free(&d);
}
END_TEST

START_TEST(test_invalid_args) {
  probe_ddmin d;
  ck_assert_int_eq(probe_ddmin_init(&d, 0, oracle_fn, NULL),
                   PROBE_ERR_INVALID_ARG);
  ck_assert_int_eq(probe_ddmin_init(&d, 65, oracle_fn, NULL),
                   PROBE_ERR_INVALID_ARG);
  ck_assert_int_eq(probe_ddmin_init(&d, 4, NULL, NULL), PROBE_ERR_INVALID_ARG);
}
END_TEST

static Suite *make_ddmin_suite(void) {
  Suite *s = suite_create("ddmin");
  TCase *tc = tcase_create("core");
  tcase_add_test(tc, test_single_culprit);
  tcase_add_test(tc, test_one_candidate);
  tcase_add_test(tc, test_two_culprits_three_kinds);
  tcase_add_test(tc, test_interacting_need_both);
  tcase_add_test(tc, test_either_suffices);
  tcase_add_loop_test(tc, test_monotone_exhaustive, 1, 4); /* k = 1..3 */
  tcase_add_loop_test(tc, test_monotone_sizes, 1, 17);  /* k = 1..16 */
  tcase_add_test(tc, test_nonmonotone_is_one_minimal);
  tcase_add_test(tc, test_parallel_batches_same_answer);
  tcase_add_test(tc, test_empty_set_passes);
  tcase_add_test(tc, test_full_set_fails);
  tcase_add_test(tc, test_seeded_not_asked);
  tcase_add_test(tc, test_oracle_error_stops);
  tcase_add_test(tc, test_contract_violation);
  tcase_add_test(tc, test_invalid_args);
  tcase_set_timeout(tc, 60);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  SRunner *sr = srunner_create(make_ddmin_suite());
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
