/*
 * tests/faults/closed_fds.c - the library's isolated readers in a host
 * started with some of stdin, stdout and stderr closed (a daemon, cron, a
 * Python service): the caller closes them (`<&- >&- 2>&-`), this program
 * reads a trace (and a rank set) through the forked readers and writes
 * each status to OUT, opened only at the end so that it takes no fd the
 * readers' pipes would otherwise get.
 *
 *   closed_fds_reader OUT TRACE [RANK_FILE...]
 *
 * Before the fix a pipe end landed on fd 2, the child's dup2 of /dev/null
 * onto 2 overwrote it, and a good trace was PROBE_ERR_CORRUPT.
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ampprobe/analysis.h"

int main(int argc, char **argv) {
  if (argc < 3) return 2;
  char line[2][256] = {"", ""};
  for (int i = 0; i < 2 && (i == 0 || argc > 3); i++) {
    char *json = NULL;
    probe_status st =
        i == 0 ? probe_postmortem_json_isolated((const char *const *)argv + 2, 1, &json)
               : probe_postmortem_set_json_isolated((const char *const *)argv + 3,
                                                    (size_t)(argc - 3), &json);
    snprintf(line[i], sizeof line[i], "%s status=%d json=%s\n",
             i == 0 ? "trace" : "set", (int)st,
             json && strstr(json, "\"verdict\"") ? "yes" : "no");
    free(json);
  }
  int fd = open(argv[1], O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) return 3;
  for (int i = 0; i < 2; i++)
    if (write(fd, line[i], strlen(line[i])) < 0) return 3;
  return close(fd) == 0 ? 0 : 3;
}
