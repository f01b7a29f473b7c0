/*
 * tools/cli.c - shared helpers of the `ampprobe` subcommands: the one-line
 * error format, strict option-value parsing, JSON printing, the Ctrl-C stop
 * flag and the progress line (stderr, terminals only). See cli.h.
 */
#define _POSIX_C_SOURCE 200809L
#include "cli.h"

#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

volatile sig_atomic_t cli_stop_flag = 0;
volatile sig_atomic_t cli_stop_signal = 0;

void cli_error(const char *sub, const char *fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  for (char *p = msg; *p; p++)
    if (*p == '\n' || *p == '\r') *p = ' ';
  if (sub)
    fprintf(stderr, "ampprobe: %s: %s\n", sub, msg);
  else
    fprintf(stderr, "ampprobe: %s\n", msg);
}

int cli_exit_for_status(probe_status st) {
  switch (st) {
  case PROBE_OK: return CLI_EXIT_OK;
  case PROBE_ERR_NOT_FOUND:
  case PROBE_ERR_NOT_HDF5:
  case PROBE_ERR_NOT_TRACE:
  case PROBE_ERR_VERSION:
  case PROBE_ERR_CORRUPT: return CLI_EXIT_INPUT;
  case PROBE_ERR_INVALID_ARG:
  case PROBE_ERR_CONFIG: return CLI_EXIT_USAGE;
  case PROBE_ERR_INTERRUPTED: return CLI_EXIT_INTERRUPTED;
  default: return CLI_EXIT_INTERNAL;
  }
}

int cli_parse_i64(const char *sub, const char *opt, const char *s, int64_t lo,
                  int64_t hi, int64_t *out) {
  char *end = NULL;
  errno = 0;
  long long v = s ? strtoll(s, &end, 10) : 0;
  if (!s || !*s || *end || errno == ERANGE) {
    cli_error(sub, "invalid value '%s' for %s: expected an integer",
              s ? s : "", opt);
    return -1;
  }
  if (v < lo || v > hi) {
    cli_error(sub, "invalid value '%s' for %s: must be in [%lld, %lld]", s,
              opt, (long long)lo, (long long)hi);
    return -1;
  }
  *out = v;
  return 0;
}

int cli_parse_double(const char *sub, const char *opt, const char *s,
                     double lo, double hi, double *out) {
  char *end = NULL;
  errno = 0;
  double v = s ? strtod(s, &end) : 0;
  if (!s || !*s || *end || errno == ERANGE || !isfinite(v)) {
    cli_error(sub, "invalid value '%s' for %s: expected a finite number",
              s ? s : "", opt);
    return -1;
  }
  if (v < lo || v > hi) {
    cli_error(sub, "invalid value '%s' for %s: must be in [%g, %g]", s, opt,
              lo, hi);
    return -1;
  }
  *out = v;
  return 0;
}

void cli_getopt_reset(void) {
  optind = 0; /* glibc: 0 re-initialises, including the permutation state */
  opterr = 0;
}

int cli_getopt_error(const char *sub, char **argv, int c) {
  const char *arg = argv[optind - 1];
  if (c == ':') {
    cli_error(sub, "option %s needs a value (see 'ampprobe %s --help')", arg,
              sub);
  } else if (optopt && !(arg && arg[0] == '-' && arg[1] == '-')) {
    cli_error(sub, "unknown option -%c (see 'ampprobe %s --help')", optopt,
              sub);
  } else {
    /* Unknown long option, or a long option given a value it takes none of. */
    char name[128];
    snprintf(name, sizeof name, "%s", arg ? arg : "?");
    char *eq = strchr(name, '=');
    if (eq && optopt) {
      *eq = 0;
      cli_error(sub, "option %s takes no value (see 'ampprobe %s --help')",
                name, sub);
    } else {
      cli_error(sub, "unknown option %s (see 'ampprobe %s --help')", name, sub);
    }
  }
  return CLI_EXIT_USAGE;
}

int cli_json_print(json_t *v) {
  if (json_dumpf(v, stdout, JSON_INDENT(2) | JSON_PRESERVE_ORDER) != 0)
    return -1;
  if (fputc('\n', stdout) == EOF || fflush(stdout) != 0) return -1;
  return 0;
}

json_t *cli_json_num(double x) {
  return isfinite(x) ? json_real(x) : json_null();
}

static void on_signal(int sig) {
  cli_stop_flag = 1;
  cli_stop_signal = sig;
}

void cli_signals_install(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
}

double cli_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void cli_progress_init(cli_progress *p, int64_t total, int quiet) {
  p->enabled = !quiet && isatty(STDERR_FILENO);
  p->total = total;
  p->t0 = cli_now();
  p->last_draw = 0;
}

static void fmt_duration(char *buf, size_t n, double s) {
  if (!isfinite(s) || s < 0) {
    snprintf(buf, n, "?");
  } else if (s < 60) {
    snprintf(buf, n, "%.0fs", s);
  } else if (s < 3600) {
    snprintf(buf, n, "%dm%02ds", (int)(s / 60), (int)s % 60);
  } else {
    snprintf(buf, n, "%dh%02dm", (int)(s / 3600), ((int)s % 3600) / 60);
  }
}

void cli_progress_update(cli_progress *p, int64_t done, const char *extra) {
  if (!p->enabled) return;
  double now = cli_now();
  if (now - p->last_draw < 0.1 && done < p->total) return;
  p->last_draw = now;
  double el = now - p->t0;
  double rate = el > 0 ? (double)done / el : 0;
  char eta[32];
  fmt_duration(eta, sizeof eta,
               rate > 0 ? (double)(p->total - done) / rate : NAN);
  fprintf(stderr, "\r\033[K%lld/%lld steps  %.1f steps/s  ETA %s  %s",
          (long long)done, (long long)p->total, rate, eta, extra ? extra : "");
  fflush(stderr);
}

void cli_progress_done(cli_progress *p) {
  if (!p->enabled) return;
  fprintf(stderr, "\r\033[K");
  fflush(stderr);
}
