/*
 * tools/cli.h - what every `ampprobe` subcommand shares: exit codes, the
 * one-line error format, strict number parsing for options, JSON output,
 * the Ctrl-C stop flag and the stderr progress line.
 *
 * Adding a subcommand: write tools/<name>.c with
 *   int cmd_<name>(int argc, char **argv);   (argv[0] is the subcommand name)
 * declare it below, add one row to the table in tools/main.c and the file to
 * tools/CMakeLists.txt. Parse options with getopt_long after cli_getopt_reset(),
 * report problems with cli_error() and return one of the CLI_EXIT_* codes.
 */
#ifndef AMPPROBE_TOOLS_CLI_H
#define AMPPROBE_TOOLS_CLI_H

#include <signal.h>
#include <stdint.h>
#include <stdio.h>

#include <jansson.h>

#include "ampprobe/status.h"

/* Exit codes of every subcommand (docs/cli.md). */
enum {
  CLI_EXIT_OK = 0,          /* healthy / no problem found */
  CLI_EXIT_PROBLEM = 1,     /* the run diverged or a problem was diagnosed */
  CLI_EXIT_USAGE = 2,       /* unknown option, bad value, missing argument */
  CLI_EXIT_INPUT = 3,       /* unreadable or corrupt input */
  CLI_EXIT_INTERNAL = 4,    /* runtime error: cannot write output, ... */
  CLI_EXIT_INTERRUPTED = 130 /* SIGINT/SIGTERM */
};

/* Subcommands. */
int cmd_run(int argc, char **argv);
int cmd_postmortem(int argc, char **argv);
int cmd_diff(int argc, char **argv);
int cmd_bisect(int argc, char **argv);
int cmd_report(int argc, char **argv);

/* Prints "ampprobe: <sub>: <message>\n" on stderr, the message on one line
 * (newlines in it are replaced by spaces). */
void cli_error(const char *sub, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Exit code for a status returned by the reader or another library. */
int cli_exit_for_status(probe_status st);

/* Strict parsing of option values: the whole string must be a number in
 * [lo, hi]. On failure prints "invalid value 'x' for --name: ..." through
 * cli_error and returns -1 (the caller returns CLI_EXIT_USAGE). */
int cli_parse_i64(const char *sub, const char *opt, const char *s, int64_t lo,
                  int64_t hi, int64_t *out);
int cli_parse_double(const char *sub, const char *opt, const char *s,
                     double lo, double hi, double *out);

/* Call before getopt_long in a subcommand (resets glibc's state). */
void cli_getopt_reset(void);
/* Reports the option getopt_long rejected ('?' or ':') in the one-line
 * format and returns CLI_EXIT_USAGE. */
int cli_getopt_error(const char *sub, char **argv, int c);

/* Writes a JSON value to stdout (indented, with a final newline). Returns 0
 * or -1 when stdout cannot be written. */
int cli_json_print(json_t *v);
/* json_real that turns NaN/inf (not valid JSON) into null. */
json_t *cli_json_num(double x);

/* Stop flag set by SIGINT/SIGTERM once cli_signals_install() was called. */
extern volatile sig_atomic_t cli_stop_flag;
extern volatile sig_atomic_t cli_stop_signal;
void cli_signals_install(void);

/* Progress on stderr, only when stderr is a terminal and not quiet. */
typedef struct cli_progress {
  int enabled;
  int64_t total;
  double t0;
  double last_draw;
} cli_progress;

double cli_now(void); /* monotonic seconds */
void cli_progress_init(cli_progress *p, int64_t total, int quiet);
/* Redraws at most 10 times a second; extra is appended ("loss 0.53 ..."). */
void cli_progress_update(cli_progress *p, int64_t done, const char *extra);
void cli_progress_done(cli_progress *p);

#endif /* AMPPROBE_TOOLS_CLI_H */
