/*
 * tests/tools/test_json.c - the flat JSON reader the post-mortem and diff
 * use for a trace's configuration (libprobe/analysis/json.c): lookups by
 * path (the first of duplicated keys, none for a missing one), lookups in
 * a configuration of 200,000 keys (a scan per lookup made `diff` of two
 * such traces run for minutes; the test's timeout is the check), and the
 * size limit.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../libprobe/analysis/analysis-impl.h"

START_TEST(paths_and_duplicates) {
  probe__jflat f;
  const char *text = "{\"b\": 2, \"a\": {\"x\": [1, \"s\"], \"y\": {}}, "
                     "\"b\": 3, \"c\": true}";
  ck_assert_int_eq(probe__jflat_parse(&f, text), PROBE_OK);
  const probe__jleaf *l = probe__jflat_get(&f, "b");
  ck_assert_ptr_nonnull(l);
  ck_assert_str_eq(l->raw, "2"); /* the first, in document order */
  ck_assert_str_eq(probe__jflat_get(&f, "a.x[1]")->str, "s");
  ck_assert_int_eq(probe__jflat_get(&f, "a.y")->type, PROBE__JV_EMPTY);
  ck_assert_int_eq(probe__jflat_get(&f, "c")->type, PROBE__JV_BOOL);
  ck_assert_ptr_null(probe__jflat_get(&f, "a"));
  ck_assert_ptr_null(probe__jflat_get(&f, "a.x[2]"));
  ck_assert_ptr_null(probe__jflat_get(&f, ""));
  ck_assert_ptr_null(probe__jflat_get(&f, "zz"));
  probe__jflat_free(&f);
  ck_assert_int_eq(probe__jflat_parse(&f, "{}"), PROBE_OK);
  ck_assert_ptr_null(probe__jflat_get(&f, "a"));
  probe__jflat_free(&f);
  ck_assert_int_eq(probe__jflat_parse(&f, "7"), PROBE_OK);
  ck_assert_str_eq(probe__jflat_get(&f, "(root)")->raw, "7");
  probe__jflat_free(&f);
}
END_TEST

#define MANY 200000

START_TEST(many_keys) {
  size_t cap = (size_t)MANY * 24 + 16, n = 0;
  char *text = malloc(cap);
  ck_assert_ptr_nonnull(text);
  text[n++] = '{';
  for (int i = 0; i < MANY; i++)
    n += (size_t)snprintf(text + n, cap - n, "%s\"k%d\": %d", i ? ", " : "",
                          (i * 7919) % MANY, i);
  snprintf(text + n, cap - n, "}");
  probe__jflat f;
  ck_assert_int_eq(probe__jflat_parse(&f, text), PROBE_OK);
  ck_assert_uint_eq(f.n, MANY);
  for (int i = 0; i < MANY; i++) { /* each key once, at its own value */
    char key[16];
    snprintf(key, sizeof key, "k%d", (i * 7919) % MANY);
    const probe__jleaf *l = probe__jflat_get(&f, key);
    ck_assert_ptr_nonnull(l);
    ck_assert_int_eq((int)l->num, i);
  }
  ck_assert_ptr_null(probe__jflat_get(&f, "k200000"));
  probe__jflat_free(&f);
  free(text);
}
END_TEST

START_TEST(size_limit) {
  size_t n = PROBE__JFLAT_MAX_BYTES;
  char *text = malloc(n + 2);
  ck_assert_ptr_nonnull(text);
  memset(text, ' ', n + 1);
  text[0] = '1';
  text[n] = 0; /* exactly the limit: read */
  probe__jflat f;
  ck_assert_int_eq(probe__jflat_parse(&f, text), PROBE_OK);
  probe__jflat_free(&f);
  text[n] = ' ';
  text[n + 1] = 0; /* one byte more: refused, nothing read */
  ck_assert_int_eq(probe__jflat_parse(&f, text), PROBE_ERR_CONFIG);
  ck_assert_uint_eq(f.n, 0);
  free(text);
}
END_TEST

int main(void) {
  Suite *s = suite_create("json");
  TCase *tc = tcase_create("flat");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, paths_and_duplicates);
  tcase_add_test(tc, many_keys);
  tcase_add_test(tc, size_limit);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? 1 : 0;
}
