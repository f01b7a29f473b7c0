/*
 * tools/trialguard.h - the process that leads each of bisect's trials: it
 * starts the trial's command, waits for it, and when the trial ends, is
 * stopped, or loses bisect, kills everything the command started, also what
 * left the trial's process group (setsid, a daemon's double fork), and only
 * then ends, as the command did.
 */
#ifndef AMPPROBE_TOOLS_TRIALGUARD_H
#define AMPPROBE_TOOLS_TRIALGUARD_H

#include <sys/types.h>

/* Called in a child of bisect (bisect_pid) that has made itself a process
 * group's leader. That child becomes the guard and never returns; the
 * function returns in the guard's child, which then execs the command. */
void trial_guard_enter(pid_t bisect_pid);

/* Asks the guard of a trial to kill all of the trial now (after a cancel's
 * grace time): the guard then ends, killed by SIGKILL as its command was. */
void trial_guard_stop(pid_t guard);

/* SIGKILL to process pid only if it is still the process that started at
 * `start` (its /proc start time, trial_guard_start_time): a pid reused
 * since the guard's walk of /proc is left alone. 0 when sent, else -1. */
int trial_guard_kill_checked(pid_t pid, unsigned long long start);
/* pid's start time from /proc/PID/stat; 0 when it cannot be read. */
unsigned long long trial_guard_start_time(pid_t pid);
#endif
