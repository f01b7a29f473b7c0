/*
 * tests/tools/test_trialguard.c - the trial guard's kill (tools/trialguard.c)
 * sends SIGKILL only to the process its walk of /proc saw: a pid whose
 * start time is no longer the one read (the process ended and the pid was
 * taken by another) is left alone.
 */
#include <check.h>
#include <signal.h>
#include <stdlib.h>
#include <time.h>
#include <sys/wait.h>
#include <unistd.h>

#include "trialguard.h"

static pid_t sleeper(void) {
  pid_t p = fork();
  ck_assert_int_ge(p, 0);
  if (p == 0) {
    for (;;) pause();
  }
  return p;
}

/* The right start time: killed. */
START_TEST(test_kill_the_process_seen) {
  pid_t p = sleeper();
  unsigned long long start = 0;
  for (int i = 0; i < 100 && !start; i++) start = trial_guard_start_time(p);
  ck_assert_uint_ne(start, 0);
  ck_assert_int_eq(trial_guard_kill_checked(p, start), 0);
  int st = 0;
  ck_assert_int_eq(waitpid(p, &st, 0), p);
  ck_assert(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
}
END_TEST

/* Another start time (the pid reused by a later process): not killed. */
START_TEST(test_spare_a_reused_pid) {
  pid_t p = sleeper();
  unsigned long long start = 0;
  for (int i = 0; i < 100 && !start; i++) start = trial_guard_start_time(p);
  ck_assert_uint_ne(start, 0);
  ck_assert_int_eq(trial_guard_kill_checked(p, start + 12345), -1);
  struct timespec ts = {0, 100 * 1000 * 1000};
  nanosleep(&ts, NULL); /* a signal sent would have ended it by now */
  ck_assert_int_eq(waitpid(p, NULL, WNOHANG), 0); /* still running */
  kill(p, SIGKILL);
  waitpid(p, NULL, 0);
  /* a pid that is gone: nothing to kill */
  ck_assert_int_eq(trial_guard_kill_checked(p, start), -1);
}
END_TEST

int main(void) {
  Suite *s = suite_create("trialguard");
  TCase *tc = tcase_create("kill");
  tcase_add_test(tc, test_kill_the_process_seen);
  tcase_add_test(tc, test_spare_a_reused_pid);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
