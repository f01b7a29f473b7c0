/*
 * libprobe/child.c - what a child process the library forks (the isolated
 * readers of reader.c and ranks_read.c) lets go of first: every session's
 * writer lock it inherited, and the caller's terminal.
 *
 * A session's lock is an open file description (session.c, trace_claim);
 * a child holding a copy keeps the trace locked after its parent closed
 * it. Only those descriptors are closed: the rest of the parent's, HDF5's
 * open files among them, the child's HDF5 still shares (the same file
 * opened twice). The registry is lock-free, so a child can read it
 * whatever another thread held when it was forked.
 */
#define _GNU_SOURCE /* pipe2 */
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <unistd.h>

#include "format.h"

/* Sessions whose lock a child releases; more at once are not released. */
#define CHILD_LOCKS_MAX 256

static _Atomic int lock_fds[CHILD_LOCKS_MAX]; /* fd + 1; 0: an empty slot */

void probe__lock_fd_register(int fd) {
  for (int i = 0; i < CHILD_LOCKS_MAX; i++) {
    int empty = 0;
    if (atomic_compare_exchange_strong(&lock_fds[i], &empty, fd + 1)) return;
  }
}

void probe__lock_fd_unregister(int fd) {
  for (int i = 0; i < CHILD_LOCKS_MAX; i++) {
    int want = fd + 1;
    if (atomic_compare_exchange_strong(&lock_fds[i], &want, 0)) return;
  }
}

void probe__child_detach(void) {
  int nul = open("/dev/null", O_WRONLY | O_CLOEXEC);
  if (nul >= 0 && nul != 2) { /* 2: stderr was closed, now /dev/null */
    dup2(nul, 2);
    close(nul);
  }
  for (int i = 0; i < CHILD_LOCKS_MAX; i++) {
    int v = atomic_load(&lock_fds[i]);
    if (v > 0) close(v - 1);
  }
}

/* Both ends at 3 or above: in a process started with stdin, stdout or
 * stderr closed, pipe2 hands out those numbers, and the child's dup2 of
 * /dev/null onto 2 (probe__child_detach) then overwrote its own end of
 * the pipe: a good trace read back as "corrupt (the reader exited
 * early)". */
static int fd_above_std(int fd) {
  if (fd > 2) return fd;
  int to = fcntl(fd, F_DUPFD_CLOEXEC, 3);
  close(fd);
  return to;
}

int probe__pipe(int fds[2]) {
  if (pipe2(fds, O_CLOEXEC) != 0) return -1;
  fds[0] = fd_above_std(fds[0]);
  fds[1] = fd_above_std(fds[1]);
  if (fds[0] >= 0 && fds[1] >= 0) return 0;
  int e = errno;
  if (fds[0] >= 0) close(fds[0]);
  if (fds[1] >= 0) close(fds[1]);
  errno = e;
  return -1;
}
