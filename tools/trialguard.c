/*
 * tools/trialguard.c - the guard that leads each of bisect's trials
 * (trialguard.h).
 *
 * The guard is a child subreaper (PR_SET_CHILD_SUBREAPER): whatever the
 * trial's command starts stays a descendant of the guard even when a
 * process in between exits, so a walk of /proc from the guard finds all of
 * the trial, inside its process group or not (setsid, a daemon's double
 * fork). A trial ends in one of three ways:
 *  - its command exits: the guard kills what the command left running and
 *    exits as the command did (its exit code, or its signal);
 *  - bisect cancels it: SIGTERM to the group, for the command to handle (the
 *    guard ignores it), then, after the grace time, SIGHUP to the guard
 *    (trial_guard_stop), which kills everything at once;
 *  - bisect dies, even by SIGKILL: the kernel sends the guard SIGHUP
 *    (PR_SET_PDEATHSIG), and the guard kills everything.
 * Before, the guard killed its process group only: a process that had left
 * the group outlived the trial, and bisect.
 */
#define _GNU_SOURCE
#include "trialguard.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* How long the guard goes on killing a trial that keeps starting
 * processes: rounds of GUARD_ROUND_NS. */
#define GUARD_ROUNDS 300
#define GUARD_ROUND_NS (10 * 1000 * 1000)

static volatile sig_atomic_t guard_stop_now;

static void on_stop(int sig) {
  (void)sig;
  guard_stop_now = 1;
}

static void on_term(int sig) { (void)sig; /* the command's to handle */ }

static void on_child(int sig) { (void)sig; /* wakes sigsuspend */ }

/* The living processes of the system, pid and parent, sorted by pid. */
typedef struct {
  pid_t pid, parent;
  int mark;   /* a descendant of the guard */
  int zombie; /* its main thread is gone (other threads may live on) */
  unsigned long long start; /* start time (clock ticks after boot): with
                               the pid, the process itself */
} proc_entry;

typedef struct {
  proc_entry *e;
  size_t n, cap;
} proc_table;

/* A process's parent, whether it is a zombie and its start time, from
 * /proc/PID/stat: 0, or -1 when it is gone. */
static int proc_parent(const char *pid, pid_t *parent, int *zombie,
                       unsigned long long *start) {
  char path[64], buf[512];
  snprintf(path, sizeof path, "/proc/%.20s/stat", pid);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n <= 0) return -1;
  buf[n] = 0;
  const char *r = strrchr(buf, ')'); /* the command name may hold ") " */
  char state;
  long pp;
  /* fields 3 (state), 4 (ppid), 22 (starttime) */
  if (!r || sscanf(r + 1, " %c %ld %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s "
                          "%*s %*s %*s %*s %*s %*s %*s %llu",
                   &state, &pp, start) != 3)
    return -1;
  *parent = (pid_t)pp;
  *zombie = state == 'Z' || state == 'X';
  return 0;
}

/* SIGKILL to the process the table saw, not to whatever took its pid
 * since (the process may have ended and been reaped by its own parent
 * between the walk and the kill): a pidfd pins the process, and its start
 * time must still be the one read. Without pidfds (kernels before 5.3),
 * kill() as before. */
int trial_guard_kill_checked(pid_t pid, unsigned long long start) {
#if defined(SYS_pidfd_open) && defined(SYS_pidfd_send_signal)
  int fd = (int)syscall(SYS_pidfd_open, pid, 0);
  /* no pidfds here: a kernel before 5.3 (ENOSYS), or a seccomp filter
   * that refuses the call (EPERM: older container profiles) */
  if (fd < 0) return errno == ENOSYS || errno == EPERM ? kill(pid, SIGKILL) : -1;
  char name[24];
  snprintf(name, sizeof name, "%ld", (long)pid);
  pid_t parent;
  int zombie, rc = -1;
  unsigned long long now;
  if (proc_parent(name, &parent, &zombie, &now) == 0 && now == start)
    rc = (int)syscall(SYS_pidfd_send_signal, fd, SIGKILL, NULL, 0);
  close(fd);
  return rc;
#else
  (void)start;
  return kill(pid, SIGKILL);
#endif
}

unsigned long long trial_guard_start_time(pid_t pid) {
  char name[24];
  snprintf(name, sizeof name, "%ld", (long)pid);
  pid_t parent;
  int zombie;
  unsigned long long start = 0;
  return proc_parent(name, &parent, &zombie, &start) == 0 ? start : 0;
}

static int by_pid(const void *a, const void *b) {
  pid_t x = ((const proc_entry *)a)->pid, y = ((const proc_entry *)b)->pid;
  return (x > y) - (x < y);
}

/* Reads the living processes into t; -1 when /proc cannot be read. */
static int table_read(proc_table *t) {
  t->n = 0;
  DIR *d = opendir("/proc");
  if (!d) return -1;
  struct dirent *de;
  int rc = 0;
  while (rc == 0 && (de = readdir(d))) {
    pid_t parent;
    int zombie;
    unsigned long long start;
    if (de->d_name[0] < '1' || de->d_name[0] > '9' ||
        proc_parent(de->d_name, &parent, &zombie, &start) != 0)
      continue;
    if (t->n == t->cap) {
      size_t cap = t->cap ? 2 * t->cap : 256;
      proc_entry *e = realloc(t->e, cap * sizeof *e);
      if (!e) {
        rc = -1;
        break;
      }
      t->e = e, t->cap = cap;
    }
    t->e[t->n++] = (proc_entry){(pid_t)atol(de->d_name), parent, 0, zombie, start};
  }
  closedir(d);
  if (rc == 0 && t->n) qsort(t->e, t->n, sizeof *t->e, by_pid);
  return rc;
}

/* Marks the descendants of root in t, a generation a pass; returns how
 * many. */
static size_t table_mark(proc_table *t, pid_t root) {
  size_t found = 0, more = 1;
  while (more) {
    more = 0;
    for (size_t i = 0; i < t->n; i++) {
      if (t->e[i].mark) continue;
      proc_entry key = {t->e[i].parent, 0, 0, 0, 0};
      const proc_entry *p = t->e[i].parent == root ? NULL
                            : bsearch(&key, t->e, t->n, sizeof *t->e, by_pid);
      if (t->e[i].parent == root || (p && p->mark)) {
        t->e[i].mark = 1;
        found++;
        more = 1;
      }
    }
  }
  return found;
}

/* Kills every descendant of the guard and reaps those that become its
 * children, until none lives or GUARD_ROUNDS have passed. A zombie is
 * killed too (a process whose main thread exited while others run shows
 * as one: SIGKILL ends them) and its children are followed, but only
 * living ones keep the rounds going. Without /proc, the guard's own group
 * is killed (the guard with it): what left the group is then out of
 * reach, as before the guard walked /proc. */
static void kill_descendants(pid_t self) {
  proc_table t = {0};
  for (int round = 0; round < GUARD_ROUNDS; round++) {
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
    if (table_read(&t) != 0) {
      if (round == 0) kill(0, SIGKILL);
      break;
    }
    if (table_mark(&t, self) == 0) break;
    size_t living = 0;
    for (size_t i = 0; i < t.n; i++)
      if (t.e[i].mark) {
        trial_guard_kill_checked(t.e[i].pid, t.e[i].start);
        living += !t.e[i].zombie;
      }
    if (living == 0) break;
    struct timespec ts = {0, GUARD_ROUND_NS};
    nanosleep(&ts, NULL);
  }
  while (waitpid(-1, NULL, WNOHANG) > 0) {
  }
  free(t.e);
}

/* Ends the guard as its command ended (st from waitpid). */
static void exit_like(int st) {
  if (WIFEXITED(st)) _exit(WEXITSTATUS(st));
  int sig = WIFSIGNALED(st) ? WTERMSIG(st) : SIGKILL;
  struct rlimit no_core = {0, 0};
  setrlimit(RLIMIT_CORE, &no_core); /* the command's core, if any, is its own */
  signal(sig, SIG_DFL);
  sigset_t m;
  sigemptyset(&m);
  sigaddset(&m, sig);
  sigprocmask(SIG_UNBLOCK, &m, NULL);
  raise(sig);
  _exit(128 + sig);
}

/* Waits for the job, reaping on the way the orphans the guard adopts (a
 * subreaper's zombies would pile up), until it ends or a stop comes. The
 * stop and SIGCHLD are blocked but inside sigsuspend, so a stop that
 * arrives between the check and the wait is not lost (it was: a blocking
 * waitpid then waited for the job). Returns 1 with *st when the job
 * ended. */
static int wait_job(pid_t job, int *st, const sigset_t *during) {
  for (;;) {
    int s, ended = 0;
    pid_t w;
    while ((w = waitpid(-1, &s, WNOHANG)) > 0)
      if (w == job) *st = s, ended = 1;
    if (ended) return 1;
    if (w < 0 && errno == ECHILD) return 0;
    if (guard_stop_now) return 0;
    sigsuspend(during);
  }
}

void trial_guard_enter(pid_t bisect_pid) {
  sigset_t block, orig;
  sigemptyset(&block);
  sigaddset(&block, SIGHUP);
  sigaddset(&block, SIGCHLD);
  sigprocmask(SIG_BLOCK, &block, &orig);
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sigemptyset(&sa.sa_mask);
  sa.sa_handler = on_stop;
  sigaction(SIGHUP, &sa, NULL);
  sa.sa_handler = on_child;
  sigaction(SIGCHLD, &sa, NULL);
  sa.sa_handler = on_term;
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGINT, &sa, NULL);
  prctl(PR_SET_CHILD_SUBREAPER, 1);
  prctl(PR_SET_PDEATHSIG, SIGHUP);
  if (getppid() != bisect_pid) /* bisect died before the prctl */
    guard_stop_now = 1;
  pid_t job = guard_stop_now ? -1 : fork();
  if (job == 0) {
    signal(SIGHUP, SIG_DFL);
    signal(SIGCHLD, SIG_DFL);
    sigprocmask(SIG_SETMASK, &orig, NULL);
    prctl(PR_SET_PDEATHSIG, SIGKILL); /* the guard is gone: so is the job */
    return;
  }
  sigset_t during = orig; /* what sigsuspend lets in */
  sigdelset(&during, SIGHUP);
  sigdelset(&during, SIGCHLD);
  int st = W_EXITCODE(127, 0);
  int ended = job > 0 && wait_job(job, &st, &during);
  kill_descendants(getpid());
  if (!ended && guard_stop_now) st = SIGKILL; /* as if the group were killed */
  exit_like(st);
}

void trial_guard_stop(pid_t guard) { kill(guard, SIGHUP); }
