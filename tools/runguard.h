/*
 * tools/runguard.h - the file-safety rules `run` and `bisect` add to
 * tools/cli.h's (cli_check_input: no FIFO or device as an input;
 * cli_check_output: no input as output), as static functions:
 *   - a new output is created exclusively (O_CREAT|O_EXCL|O_NOFOLLOW), so an
 *     existing file or a planted symlink is never replaced without --force;
 *   - a name taken from a config becomes a file-name component only after
 *     guard_sanitize (no '/', no leading '.', printable ASCII only).
 * JSON results go through cli.h's one output writer (cli_write_json, or
 * cli_write_json_new for a file that must be new).
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

#endif /* AMPPROBE_TOOLS_RUNGUARD_H */
