/*
 * tools/runguard.h - the file-safety rules `run` and `bisect` add to
 * tools/cli.h's (cli_check_input: no FIFO or device as an input;
 * cli_check_output: no input as output), as static functions:
 *   - a new output is created exclusively (O_CREAT|O_EXCL|O_NOFOLLOW), so an
 *     existing file or a planted symlink is never replaced without --force;
 *   - a name taken from a config becomes a file-name component only after
 *     guard_sanitize (no '/', no leading '.', printable ASCII only);
 *   - JSON results are written to a temporary file in the target's folder
 *     and then linked (or, with replace, renamed) into place.
 */
#ifndef AMPPROBE_TOOLS_RUNGUARD_H
#define AMPPROBE_TOOLS_RUNGUARD_H

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"

/* Creates path exclusively (never through a symlink) and closes it: 0, or
 * the errno (EEXIST when anything, even a dangling symlink, is there). */
static inline int guard_create_excl(const char *path) {
  int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
                0644);
  if (fd < 0)
    return errno;
  close(fd);
  return 0;
}

/* Writes a file-name-safe copy of name: [A-Za-z0-9._+-] kept, anything else
 * (a '/', a control character, a space, non-ASCII) becomes '_', a leading
 * '.' becomes '_' (no "..", no hidden files); empty gives "run". */
static inline void guard_sanitize(char *dst, size_t n, const char *name) {
  size_t o = 0;
  for (const char *p = name ? name : ""; *p && o + 1 < n && o < 64; p++) {
    unsigned char ch = (unsigned char)*p;
    int ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
             (ch >= '0' && ch <= '9') || ch == '.' || ch == '_' ||
             ch == '-' || ch == '+';
    if (o == 0 && ch == '.')
      ok = 0;
    dst[o++] = ok ? (char)ch : '_';
  }
  if (o == 0)
    o = (size_t)snprintf(dst, n, "run");
  dst[o < n ? o : n - 1] = 0;
}

/* Writes data to path through a temporary file in the same folder: with
 * replace the temporary is renamed over path, else linked to it, which
 * fails with EEXIST when path appeared meanwhile. Returns 0 or an errno. */
static inline int guard_write_atomic(const char *path, const char *data,
                                     size_t n, int replace) {
  size_t len = strlen(path) + 16;
  char *tmp = malloc(len);
  if (!tmp)
    return ENOMEM;
  snprintf(tmp, len, "%s.tmpXXXXXX", path);
  int fd = mkstemp(tmp);
  if (fd < 0) {
    int e = errno;
    free(tmp);
    return e;
  }
  int e = 0;
  size_t off = 0;
  while (off < n && !e) {
    ssize_t w = write(fd, data + off, n - off);
    if (w < 0 && errno != EINTR)
      e = errno;
    else if (w > 0)
      off += (size_t)w;
  }
  if (!e && fsync(fd) != 0 && errno != EINVAL)
    e = errno;
  if (close(fd) != 0 && !e)
    e = errno;
  if (!e) {
    if (replace) {
      if (rename(tmp, path) != 0)
        e = errno;
    } else if (link(tmp, path) != 0) {
      e = errno;
    }
  }
  unlink(tmp); /* after rename it is gone already */
  free(tmp);
  return e;
}

#endif /* AMPPROBE_TOOLS_RUNGUARD_H */
