/*
 * tools/cli.c - shared helpers of the `ampprobe` subcommands: the one-line
 * error format, strict option-value parsing, the file rules (regular-file
 * inputs, atomic outputs that are never an input, write errors with their
 * errno text), JSON printing, the Ctrl-C stop flag and the progress line
 * (stderr, terminals only). See cli.h.
 */
#define _GNU_SOURCE /* fopencookie */
#include "cli.h"

#include "ampprobe/analysis.h" /* probe_text_escape */

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <getopt.h>
#include <glob.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

volatile sig_atomic_t cli_stop_flag = 0;
volatile sig_atomic_t cli_stop_signal = 0;

/* ---- a note while a long read runs ---------------------------------------- */

int cli_busy_quiet = 0;
static int busy_shown;

void cli_busy(const char *sub, const char *path, long long bytes) {
  if (cli_busy_quiet || busy_shown || bytes < CLI_BUSY_BYTES ||
      !isatty(STDERR_FILENO))
    return;
  char q[600];
  cli_escape_name(q, sizeof q, path);
  fprintf(stderr, "\r\033[Kampprobe: %s: reading %s (%.0f MB) ...", sub, q,
          (double)bytes / 1e6);
  fflush(stderr);
  busy_shown = 1;
}

void cli_busy_done(void) {
  if (!busy_shown) return;
  fprintf(stderr, "\r\033[K");
  fflush(stderr);
  busy_shown = 0;
}

long long cli_file_bytes(const char *path) {
  struct stat sb;
  return path && stat(path, &sb) == 0 && S_ISREG(sb.st_mode)
             ? (long long)sb.st_size
             : 0;
}

/* A one-line message longer than this keeps its head and its tail, the
 * middle elided: the reason comes last ("PATH: why"), and a long path cut
 * at the end lost it (a 1,236-byte path left the path alone). */
enum { CLI_ERROR_MAX = 2048, CLI_ERROR_KEEP = 1000 };

/* The start of the UTF-8 character at or before s[i] (not a continuation). */
static size_t utf8_start(const char *s, size_t i) {
  while (i > 0 && ((unsigned char)s[i] & 0xc0) == 0x80) i--;
  return i;
}

void cli_error(const char *sub, const char *fmt, ...) {
  char raw[CLI_ERROR_MAX + 16], msg[4 * (CLI_ERROR_MAX + 16)];
  cli_busy_done();
  va_list ap;
  va_start(ap, fmt);
  int len = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  char *full = len > CLI_ERROR_MAX ? malloc((size_t)len + 1) : NULL;
  va_start(ap, fmt);
  if (full) {
    vsnprintf(full, (size_t)len + 1, fmt, ap);
    size_t head = utf8_start(full, CLI_ERROR_KEEP);
    size_t tail = utf8_start(full, (size_t)len - CLI_ERROR_KEEP);
    snprintf(raw, sizeof raw, "%.*s ... %s", (int)head, full, full + tail);
    free(full);
  } else {
    vsnprintf(raw, sizeof raw, fmt, ap);
  }
  va_end(ap);
  /* One line, and no terminal control whatever a caller put in it (a
   * parser's token, a key from a file): a newline or CR becomes a space,
   * another C0 control or DEL \xHH (ESC \e), a UTF-8 C1 control \u00HH,
   * a bidi control (U+202E, which shows the rest of the line reversed)
   * \u202e as probe_text_escape writes it. Names are escaped by their
   * callers already (cli_escape_name); this only catches what was not. */
  size_t o = 0;
  for (const unsigned char *p = (const unsigned char *)raw; *p && o + 8 < sizeof msg; p++) {
    char unit[5] = {0}, e[16];
    size_t n = *p >= 0xc2 && *p <= 0xdf ? 2 : *p >= 0xe0 && *p <= 0xef ? 3 : 0;
    for (size_t i = 0; i < n; i++) /* a sequence cut by the end: none */
      if (!(unit[i] = (char)p[i])) {
        n = 0;
        break;
      }
    if (*p == '\n' || *p == '\r')
      msg[o++] = ' ';
    else if (*p == 0x1b)
      o += (size_t)snprintf(msg + o, sizeof msg - o, "\\e");
    else if (*p < 0x20 || *p == 0x7f)
      o += (size_t)snprintf(msg + o, sizeof msg - o, "\\x%02x", *p);
    else if (n && probe_text_escape(e, sizeof e, unit) == 6 && e[1] == 'u') {
      o += (size_t)snprintf(msg + o, sizeof msg - o, "%s", e); /* C1, bidi */
      p += n - 1;
    } else
      msg[o++] = (char)*p;
  }
  msg[o] = '\0';
  if (sub)
    fprintf(stderr, "ampprobe: %s: %s\n", sub, msg);
  else
    fprintf(stderr, "ampprobe: %s\n", msg);
}

int cli_check_trace_args(const char *sub, char *const *args, int n) {
  for (int i = 0; i < n; i++)
    if (!args[i][0]) {
      cli_error(sub, "an empty argument is not a trace (see 'ampprobe %s --help')", sub);
      return CLI_EXIT_USAGE;
    }
  return 0;
}

void cli_scenario_error(const char *sub, const char *name, probe_status st,
                        const char *err) {
  char q[256];
  cli_escape_name(q, sizeof q, name);
  if (st == PROBE_ERR_NOT_FOUND)
    cli_error(sub, "unknown scenario '%s' (see 'ampprobe run --list-scenarios')", q);
  else
    cli_error(sub, "scenario %s: %s", q, err && err[0] ? err : probe_status_str(st));
}

int cli_open_trace(const char *sub, probe_trace **t, const char *path) {
  return cli_open_trace_progress(sub, t, path, NULL, NULL);
}

int cli_open_trace_progress(const char *sub, probe_trace **t, const char *path,
                            probe_progress_fn fn, void *user) {
  char err[512] = "";
  cli_busy(sub, path, cli_file_bytes(path)); /* cleared before any output */
  probe_status st =
      probe_trace_open_isolated_progress(t, path, err, sizeof err, fn, user);
  if (st >= 0 && probe_trace_get_info(*t)->unwritten) {
    /* read as a trace not closed with 0 steps; the verdict says no more */
    char q[PATH_MAX + 16];
    cli_escape_name(q, sizeof q, path);
    cli_busy_done();
    fprintf(stderr, "ampprobe: %s: note: %s is an HDF5 superblock and "
                    "nothing else: the writer was killed before it wrote "
                    "anything (no step recorded)\n", sub, q);
  }
  if (st >= 0) return CLI_EXIT_OK;
  size_t pl = strlen(path), head = pl < 80 ? pl : 80;
  if (err[0] && (strstr(err, path) || !strncmp(err, path, head))) {
    /* the reader's message names it (a long path by its head and tail) */
    cli_error(sub, "%s", err);
  } else {
    char q[PATH_MAX + 16];
    cli_escape_name(q, sizeof q, path);
    cli_error(sub, "%s: %s", q, err[0] ? err : probe_status_str(st));
  }
  return st == PROBE_ERR_IO ? CLI_EXIT_INPUT : cli_exit_for_status(st);
}

const char *cli_trace_error(const probe_trace *t) {
  const char *e = probe_trace_last_error(t);
  return e && strcmp(e, "no error") ? e : "";
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

/* The whole of s is [+-]digits. */
static int is_decimal_int(const char *s) {
  if (*s == '+' || *s == '-') s++;
  if (!isdigit((unsigned char)*s)) return 0;
  while (isdigit((unsigned char)*s)) s++;
  return *s == '\0';
}

/* The whole of s is [+-](digits[.digits*] | .digits)[(e|E)[+-]digits]: what
 * a person types, not C's hex floats, inf, nan or leading spaces. */
static int is_decimal_real(const char *s) {
  int digits = 0;
  if (*s == '+' || *s == '-') s++;
  while (isdigit((unsigned char)*s)) s++, digits++;
  if (*s == '.') {
    s++;
    while (isdigit((unsigned char)*s)) s++, digits++;
  }
  if (!digits) return 0;
  if (*s == 'e' || *s == 'E') {
    s++;
    if (*s == '+' || *s == '-') s++;
    if (!isdigit((unsigned char)*s)) return 0;
    while (isdigit((unsigned char)*s)) s++;
  }
  return *s == '\0';
}

/* A quoted copy of an option value for a message: control characters
 * escaped, long values shortened. */
static void quote_value(char *dst, size_t n, const char *s) {
  cli_escape_name(dst, n, s ? s : "");
  if (strlen(dst) + 1 >= n && n > 4) memcpy(dst + n - 4, "...", 4);
}

int cli_parse_i64(const char *sub, const char *opt, const char *s, int64_t lo,
                  int64_t hi, int64_t *out) {
  char q[96];
  quote_value(q, sizeof q, s);
  if (!s || !is_decimal_int(s)) {
    cli_error(sub, "invalid value '%s' for %s: expected an integer", q, opt);
    return -1;
  }
  errno = 0;
  long long v = strtoll(s, NULL, 10);
  if (errno == ERANGE || v < lo || v > hi) { /* ERANGE: out of any range */
    cli_error(sub, "invalid value '%s' for %s: must be in [%lld, %lld]", q,
              opt, (long long)lo, (long long)hi);
    return -1;
  }
  *out = v;
  return 0;
}

static int parse_real(const char *sub, const char *opt, const char *s,
                      double lo, int lo_open, double hi, double *out) {
  char q[96];
  quote_value(q, sizeof q, s);
  if (!s || !is_decimal_real(s)) {
    cli_error(sub, "invalid value '%s' for %s: expected a decimal number", q,
              opt);
    return -1;
  }
  /* strtod sets ERANGE on overflow (+-HUGE_VAL, outside every range here)
   * and on underflow (a value at most DBL_MIN, which the range decides) */
  double v = strtod(s, NULL);
  if (!isfinite(v) || (lo_open ? !(v > lo) : !(v >= lo)) || !(v <= hi)) {
    cli_error(sub, "invalid value '%s' for %s: must be in %c%g, %g]", q, opt,
              lo_open ? '(' : '[', lo, hi);
    return -1;
  }
  *out = v;
  return 0;
}

int cli_parse_double(const char *sub, const char *opt, const char *s,
                     double lo, double hi, double *out) {
  return parse_real(sub, opt, s, lo, 0, hi, out);
}

int cli_parse_double_gt(const char *sub, const char *opt, const char *s,
                        double lo, double hi, double *out) {
  return parse_real(sub, opt, s, lo, 1, hi, out);
}

/* The unit at the end of a size: "", B, K/KiB, M/MiB, G/GiB, T/TiB (either
 * case, powers of 1024); 0 when it is none of them. */
static double size_unit(const char *u) {
  static const struct { const char *name; double mult; } units[] = {
      {"", 1.0}, {"b", 1.0}, {"k", 0x1p10}, {"kib", 0x1p10}, {"m", 0x1p20},
      {"mib", 0x1p20}, {"g", 0x1p30}, {"gib", 0x1p30}, {"t", 0x1p40},
      {"tib", 0x1p40}};
  for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
    if (strcasecmp(u, units[i].name) == 0)
      return units[i].mult;
  return 0;
}

int cli_parse_size(const char *sub, const char *opt, const char *s,
                   uint64_t lo, uint64_t hi, uint64_t *out) {
  char q[96], num[64];
  quote_value(q, sizeof q, s);
  size_t n = 0;
  while (s && s[n] && (isdigit((unsigned char)s[n]) || s[n] == '.'))
    n++;
  double mult = s && n > 0 && n < sizeof num ? size_unit(s + n) : 0;
  if (mult > 0) {
    memcpy(num, s, n);
    num[n] = '\0';
  }
  if (mult == 0 || !is_decimal_real(num)) {
    cli_error(sub, "invalid value '%s' for %s: expected a size such as 512M, "
                   "8G or 1.5GiB (units B, K, M, G, T: powers of 1024)", q, opt);
    return -1;
  }
  double v = strtod(num, NULL) * mult;
  if (!(v >= (double)lo && v <= (double)hi)) {
    cli_error(sub, "invalid value '%s' for %s: must be in [%.0f MiB, %.0f TiB]",
              q, opt, (double)lo / 0x1p20, (double)hi / 0x1p40);
    return -1;
  }
  *out = (uint64_t)v;
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

/* ---- files ------------------------------------------------------------------ */

static const char *file_kind(mode_t m) {
  if (S_ISDIR(m)) return "a directory";
  if (S_ISFIFO(m)) return "a FIFO";
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  if (S_ISSOCK(m)) return "a socket";
  return "not a plain file";
}

int cli_check_input(const char *sub, const char *path) {
  return cli_check_input_key(sub, NULL, path);
}

int cli_check_input_key(const char *sub, const char *key, const char *path) {
  struct stat st;
  char q[PATH_MAX + 16];
  int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  if (fd >= 0) {
    int r = fstat(fd, &st);
    close(fd);
    if (r != 0) return 0;
  } else if (stat(path, &st) != 0) {
    return 0; /* missing or unreadable: the reader says so */
  }
  if (S_ISREG(st.st_mode)) return 0;
  cli_escape_name(q, sizeof q, path);
  if (key)
    cli_error(sub, "%s %s: %s; only regular files are read", key, q,
              file_kind(st.st_mode));
  else
    cli_error(sub, "%s: not a regular file (%s)", q, file_kind(st.st_mode));
  return CLI_EXIT_INPUT;
}

char *cli_dir_part(const char *path) {
  const char *slash = strrchr(path, '/');
  if (!slash) return strdup(".");
  if (slash == path) return strdup("/");
  return strndup(path, (size_t)(slash - path));
}

static const char *base_part(const char *path) {
  const char *slash = strrchr(path, '/');
  return slash ? slash + 1 : path;
}

/* realpath of path, or of its directory joined with its last component when
 * path does not exist (yet). NULL when neither resolves. */
static char *canonical(const char *path) {
  char *r = realpath(path, NULL);
  if (r) return r;
  char *dir = cli_dir_part(path);
  char *rd = dir ? realpath(dir, NULL) : NULL;
  free(dir);
  if (!rd) return NULL;
  const char *base = base_part(path);
  size_t n = strlen(rd) + strlen(base) + 2;
  char *out = malloc(n);
  if (out) snprintf(out, n, "%s%s%s", rd, strcmp(rd, "/") ? "/" : "", base);
  free(rd);
  return out;
}

int cli_same_file(const char *a, const char *b) {
  struct stat sa, sb;
  if (!a || !b) return 0;
  if (stat(a, &sa) == 0 && stat(b, &sb) == 0)
    return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
  char *ca = canonical(a), *cb = canonical(b);
  int same = ca && cb && strcmp(ca, cb) == 0;
  free(ca);
  free(cb);
  return same;
}

int cli_check_output(const char *sub, const char *out,
                     const char *const *inputs, size_t n) {
  if (!out) return 0;
  for (size_t i = 0; i < n; i++) {
    if (!inputs[i] || !cli_same_file(out, inputs[i])) continue;
    char qo[PATH_MAX + 16], qi[PATH_MAX + 16];
    cli_escape_name(qo, sizeof qo, out);
    cli_escape_name(qi, sizeof qi, inputs[i]);
    if (strcmp(out, inputs[i]) == 0)
      cli_error(sub, "refusing to write %s: it is also an input of this "
                     "command; choose another output", qo);
    else
      cli_error(sub, "refusing to write %s: it is the same file as the input "
                     "%s; choose another output", qo, qi);
    return CLI_EXIT_USAGE;
  }
  return 0;
}

int cli_check_trace_files(const char *sub, char *const *args, int n) {
  struct stat st;
  for (int i = 0; n > 1 && i < n; i++) {
    if (strpbrk(args[i], "*?[") || stat(args[i], &st) == 0) continue;
    char q[PATH_MAX + 16];
    cli_escape_name(q, sizeof q, args[i]);
    cli_error(sub, "%s: %s", q,
              errno == ENOENT ? "no such file" : strerror(errno));
    return CLI_EXIT_INPUT;
  }
  return 0;
}

int cli_check_out_arg(const char *sub, const char *opt, const char *path) {
  if (!path) return 0;
  char q[PATH_MAX + 16];
  if (!*path) {
    cli_error(sub, "%s '': an empty path names no file (see 'ampprobe %s "
                   "--help')", opt, sub);
    return CLI_EXIT_USAGE;
  }
  if (path[strlen(path) - 1] == '/') {
    cli_escape_name(q, sizeof q, path);
    cli_error(sub, "%s %s: a path ending in '/' names a directory, not the "
                   "file to write", opt, q);
    return CLI_EXIT_USAGE;
  }
  return 0;
}

/* 1 when out would be read again as a member of the set arg names. */
static int joins_set(const char *out, const char *arg) {
  struct stat sb;
  const char *base = base_part(out);
  char *dir = cli_dir_part(out);
  int joins = 0;
  if (!dir) return 0;
  if (stat(arg, &sb) == 0) {
    /* a directory: its regular files ending in .h5 (rankset.c, add_dir) */
    size_t n = strlen(base);
    joins = S_ISDIR(sb.st_mode) && n > 3 && !strcmp(base + n - 3, ".h5") &&
            cli_same_file(dir, arg);
  } else if (strpbrk(arg, "*?[")) {
    /* a glob: the folders its directory part matches (glob(3)), and in
     * them the names its last part matches, as glob(3) matches them */
    const char *slash = strrchr(arg, '/');
    char *pdir = slash ? strndup(arg, slash == arg ? 1 : (size_t)(slash - arg))
                       : strdup(".");
    const char *pbase = slash ? slash + 1 : arg;
    glob_t g;
    memset(&g, 0, sizeof g);
    if (pdir && fnmatch(pbase, base, FNM_PERIOD) == 0 &&
        glob(pdir, GLOB_NOCHECK, NULL, &g) == 0)
      for (size_t i = 0; i < g.gl_pathc && !joins; i++)
        joins = cli_same_file(dir, g.gl_pathv[i]);
    globfree(&g);
    free(pdir);
  }
  free(dir);
  return joins;
}

int cli_check_out_joins_set(const char *sub, const char *out,
                            char *const *args, size_t n) {
  if (!out || !*out) return 0;
  for (size_t i = 0; i < n; i++) {
    if (!args[i] || !joins_set(out, args[i])) continue;
    char qo[PATH_MAX + 16], qa[PATH_MAX + 16];
    cli_escape_name(qo, sizeof qo, out);
    cli_escape_name(qa, sizeof qa, args[i]);
    cli_error(sub, "refusing to write %s: it would join the trace set %s "
                   "(the next command on that set would read it as a rank "
                   "file); choose another name or folder", qo, qa);
    return CLI_EXIT_USAGE;
  }
  return 0;
}

/* 1 when the file open at fd holds the HDF5 signature where a superblock
 * may start: offset 0, 512, 1024, 2048, ... (a user block before it). */
static int holds_hdf5(int fd, off_t size) {
  static const char sig[8] = {'\x89', 'H', 'D', 'F', '\r', '\n', '\x1a', '\n'};
  for (off_t at = 0; at + 8 <= size; at = at ? at * 2 : 512) {
    char b[8];
    if (pread(fd, b, 8, at) == 8 && !memcmp(b, sig, 8)) return 1;
  }
  return 0;
}

int cli_check_replace(const char *sub, const char *path, int force,
                      cli_own_output_fn ours, const char *what) {
  struct stat st;
  if (!path || !*path || force) return 0;
  int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  if (fd < 0 && (errno == ENOENT || errno == ENOTDIR)) return 0;
  if (fd < 0 && errno == ENAMETOOLONG) { /* nothing there to refuse */
    char q[PATH_MAX + 16];
    cli_escape_name(q, sizeof q, path);
    cli_error(sub, "cannot write %s: %s", q, strerror(errno));
    return CLI_EXIT_INTERNAL; /* a write error, as the writer's own (exit 4) */
  }
  if (fd >= 0 && (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size == 0)) {
    close(fd); /* a device or FIFO is written in place; an empty file holds nothing */
    return 0;
  }
  char q[PATH_MAX + 16], head[CLI_OWN_HEAD];
  cli_escape_name(q, sizeof q, path);
  if (fd < 0) {
    if (stat(path, &st) == 0 && !S_ISREG(st.st_mode)) return 0; /* the writer says */
    cli_error(sub, "refusing to replace %s: cannot read it to tell what it "
                   "holds (%s); choose another output, or add --force to "
                   "replace it", q, strerror(errno));
    return CLI_EXIT_USAGE;
  }
  size_t n = 0;
  while (n < sizeof head) {
    ssize_t r = read(fd, head + n, sizeof head - n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    n += (size_t)r;
  }
  int hdf5 = holds_hdf5(fd, st.st_size);
  close(fd);
  if (!hdf5 && ours && ours(head, n)) return 0;
  cli_error(sub, "refusing to replace %s: it is %s%s; choose another "
                 "output, or add --force to replace it", q,
            hdf5 ? "an HDF5 file (a trace?), not " : "not ", what);
  return CLI_EXIT_USAGE;
}

/* The temporary file being written, removed if SIGINT, SIGTERM or SIGHUP
 * ends the process first (only where nobody else handles those signals). */
static char *volatile out_pending_tmp;
static const int out_signals[3] = {SIGINT, SIGTERM, SIGHUP};
static int out_handled[3];

static void out_on_signal(int sig) {
  char *t = out_pending_tmp;
  if (t) unlink(t);
  signal(sig, SIG_DFL);
  raise(sig);
}

/* SIGINT/SIGTERM of a command that only reads: the output being written,
 * if any, is removed and the process exits 130 at once. */
static char exit_msg[600]; /* "ampprobe: <sub>: interrupted[ (note)]\n" */
static size_t exit_msg_len;
static pid_t exit_pid; /* the command's process; its forked readers are quiet */

static void exit_on_signal(int sig) {
  (void)sig;
  if (getpid() != exit_pid) _exit(CLI_EXIT_INTERRUPTED);
  char *t = out_pending_tmp;
  if (t) unlink(t);
  ssize_t w = write(STDERR_FILENO, exit_msg, exit_msg_len);
  (void)w;
  _exit(CLI_EXIT_INTERRUPTED);
}

/* handler for SIGINT and SIGTERM, each blocking both while it runs */
static void on_interrupt(void (*handler)(int)) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = handler;
  sigemptyset(&sa.sa_mask);
  sigaddset(&sa.sa_mask, SIGINT);
  sigaddset(&sa.sa_mask, SIGTERM);
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
}

void cli_signals_exit_install(const char *sub) { cli_signals_exit_install_note(sub, NULL); }

void cli_signals_exit_install_note(const char *sub, const char *note) {
  /* a note that does not fit is left out, never cut (it may end in a
   * command to paste: a cut one is another command) */
  int n = snprintf(exit_msg, sizeof exit_msg, "ampprobe: %s: interrupted%s%s%s\n",
                   sub, note ? " (" : "", note ? note : "", note ? ")" : "");
  if (note && (n < 0 || (size_t)n >= sizeof exit_msg))
    n = snprintf(exit_msg, sizeof exit_msg, "ampprobe: %s: interrupted\n", sub);
  exit_msg_len = n > 0 && (size_t)n < sizeof exit_msg ? (size_t)n : 0;
  exit_pid = getpid();
  on_interrupt(exit_on_signal);
}

void cli_signals_exit_install_quiet(void) {
  exit_msg_len = 0;
  exit_pid = getpid();
  on_interrupt(exit_on_signal);
}

static void out_guard(char *tmp) {
  if (out_pending_tmp) return; /* one guarded output at a time */
  out_pending_tmp = tmp;
  for (int i = 0; i < 3; i++) {
    struct sigaction old, sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = out_on_signal;
    sigemptyset(&sa.sa_mask);
    out_handled[i] = 0;
    if (sigaction(out_signals[i], NULL, &old) == 0 &&
        old.sa_handler == SIG_DFL && !(old.sa_flags & SA_SIGINFO)) {
      sigaction(out_signals[i], &sa, NULL);
      out_handled[i] = 1;
    }
  }
}

static void out_unguard(char *tmp) {
  if (!tmp || out_pending_tmp != tmp) return;
  for (int i = 0; i < 3; i++)
    if (out_handled[i]) signal(out_signals[i], SIG_DFL);
  out_pending_tmp = NULL;
}

/* write(2) without SIGPIPE: a FIFO (or pipe) whose reader has gone is
 * EPIPE, reported and turned into exit 4 like any failed write, never a
 * death by signal (exit 141) that leaves no message. SIGPIPE is sent to the
 * writing thread, so blocking it here and taking the one this write raised
 * (sigtimedwait, no wait) leaves the rest of the process as it was. */
static ssize_t write_no_sigpipe(int fd, const void *buf, size_t n) {
  sigset_t pipe_set, old;
  sigemptyset(&pipe_set);
  sigaddset(&pipe_set, SIGPIPE);
  int blocked = pthread_sigmask(SIG_BLOCK, &pipe_set, &old) == 0;
  ssize_t w = write(fd, buf, n);
  int e = errno;
  if (blocked) {
    if (w < 0 && e == EPIPE && !sigismember(&old, SIGPIPE)) {
      const struct timespec zero = {0, 0};
      while (sigtimedwait(&pipe_set, NULL, &zero) < 0 && errno == EINTR) {}
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
  }
  errno = e;
  return w;
}

static ssize_t out_cookie_write(void *cookie, const char *buf, size_t size) {
  cli_out *o = cookie;
  size_t done = 0;
  if (o->err) return 0; /* a failed output stays failed */
  while (done < size) {
    ssize_t w = write_no_sigpipe(o->fd, buf + done, size - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      o->err = w < 0 ? errno : EIO;
      break;
    }
    done += (size_t)w;
  }
  return (ssize_t)done;
}

static void out_free(cli_out *o) {
  free(o->path);
  if (o->target != o->path) free(o->target);
  free(o->tmp);
  o->path = o->target = o->tmp = NULL;
}

/* "cannot write PATH: why"; returns CLI_EXIT_INTERNAL */
static int out_say(const char *sub, const char *path, const char *why) {
  char q[PATH_MAX + 16];
  cli_escape_name(q, sizeof q, path ? path : "");
  cli_error(sub, "cannot write %s: %s", q, why);
  return CLI_EXIT_INTERNAL;
}

static int out_error_why(const char *sub, cli_out *o, const char *path,
                         const char *why) {
  cli_out_abort(o);
  return out_say(sub, path, why);
}

/* When path is a symbolic link: *target is the file it names (free it),
 * which an output replaces, the link kept. A link to nothing (or a loop)
 * is refused, said and CLI_EXIT_INTERNAL returned: renaming over it
 * replaced the link itself by a regular file, and writing through it would
 * create a file wherever it points (as `run` refuses it for a trace).
 * *target NULL and 0 when path is no link (or nothing). The one test
 * behind out_open and cli_out_check, so their words cannot drift. */
static int out_link_target(const char *sub, const char *path, char **target) {
  *target = NULL;
  struct stat st;
  if (lstat(path, &st) != 0 || !S_ISLNK(st.st_mode)) return 0;
  char *r = realpath(path, NULL);
  if (!r && errno == ENOENT)
    return out_say(sub, path, "a symbolic link to nothing (remove it, or "
                              "name another output)");
  if (!r) return out_say(sub, path, strerror(errno));
  *target = r;
  return 0;
}

int cli_out_check(const char *sub, const char *path) {
  char *r = NULL;
  int rc = out_link_target(sub, path, &r);
  free(r);
  struct stat st;
  if (!rc && stat(path, &st) == 0 && S_ISDIR(st.st_mode))
    rc = out_say(sub, path, strerror(EISDIR)); /* as out_open says it */
  return rc;
}

static int out_error(const char *sub, cli_out *o, const char *path, int e) {
  return out_error_why(sub, o, path, strerror(e ? e : EIO));
}

/* A FIFO target, opened without waiting: with nobody reading it, a plain
 * open blocks until someone does, possibly forever (`report -o ff` hung
 * with no message). ENXIO is that case, said at once and exit 4, as a
 * reader that leaves early is (EPIPE). With a reader there, the writes
 * block again as usual (a slow reader is waited for). */
static int out_open_fifo(const char *sub, cli_out *o, const char *path) {
  o->fd = open(o->target, O_WRONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  if (o->fd < 0 && errno == ENXIO)
    return out_error_why(sub, o, path, "a FIFO with no reader (start the "
                                       "reader first, or name a file)");
  if (o->fd < 0) return out_error(sub, o, path, errno);
  int fl = fcntl(o->fd, F_GETFL);
  if (fl < 0 || fcntl(o->fd, F_SETFL, fl & ~O_NONBLOCK) != 0)
    return out_error(sub, o, path, errno);
  return 0;
}

/* excl: the target must not exist (nothing there, not even a symlink); the
 * temporary file is linked into place at commit, so a file that appeared
 * meanwhile is not replaced (EEXIST). */
static int out_open(const char *sub, cli_out *o, const char *path, int excl) {
  memset(o, 0, sizeof *o);
  o->fd = -1;
  if (!path || !*path) return out_error(sub, o, "''", ENOENT);
  o->path = strdup(path);
  if (!o->path) return out_error(sub, o, path, ENOMEM);
  o->target = o->path;
  o->excl = excl;
  struct stat st;
  int there = lstat(path, &st) == 0;
  if (there && excl) return out_error(sub, o, path, EEXIST);
  if (there && S_ISLNK(st.st_mode)) {
    char *r = NULL;
    int rc = out_link_target(sub, path, &r);
    if (rc) {
      cli_out_abort(o);
      return rc;
    }
    if (r) o->target = r; /* NULL: no longer a link, written as a file */
  }
  int exists = !excl && stat(o->target, &st) == 0;
  /* a file the user made read-only stays protected, as with a plain open */
  if (exists && S_ISREG(st.st_mode) && access(o->target, W_OK) != 0)
    return out_error(sub, o, path, errno);
  if (exists && !S_ISREG(st.st_mode)) {
    if (S_ISDIR(st.st_mode)) return out_error(sub, o, path, EISDIR);
    /* /dev/null, /dev/full, a FIFO, a terminal: written in place (renaming
     * over a device node would replace it) */
    if (S_ISFIFO(st.st_mode)) {
      int rc = out_open_fifo(sub, o, path);
      if (rc) return rc;
    } else {
      o->fd = open(o->target, O_WRONLY | O_CLOEXEC | O_NOCTTY);
      if (o->fd < 0) return out_error(sub, o, path, errno);
    }
  } else {
    const char *base = base_part(o->target);
    if (!*base) return out_error(sub, o, path, EISDIR);
    char *dir = cli_dir_part(o->target);
    size_t n = (dir ? strlen(dir) : 0) + 240;
    o->tmp = dir ? malloc(n) : NULL;
    if (!o->tmp) {
      free(dir);
      return out_error(sub, o, path, ENOMEM);
    }
    /* .NAME.tmp-PID-XXXXXX next to the target: the same file system, so
     * the rename is atomic; the name shortened to stay under NAME_MAX */
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    unsigned long x = (unsigned long)ts.tv_nsec ^ ((unsigned long)getpid() << 16);
    int e = EEXIST;
    for (int tries = 0; tries < 100 && e == EEXIST; tries++) {
      x = x * 6364136223846793005UL + 1442695040888963407UL;
      snprintf(o->tmp, n, "%s/.%.200s.tmp-%ld-%06lx", dir, base,
               (long)getpid(), (x >> 24) & 0xffffff);
      o->fd = open(o->tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC |
                               O_NOFOLLOW | O_NOCTTY, 0666);
      e = o->fd < 0 ? errno : 0;
    }
    free(dir);
    if (o->fd < 0) {
      free(o->tmp);
      o->tmp = NULL;
      return out_error(sub, o, path, e);
    }
    out_guard(o->tmp);
    /* The file it replaces keeps its owner and mode, as with sed -i: a page
     * the user made 0600 did become 0644 on the next run (best effort: an
     * owner this user cannot give is left as it is; the owner first, since
     * chown clears set-id bits). */
    if (exists && S_ISREG(st.st_mode)) {
      if (fchown(o->fd, st.st_uid, st.st_gid) != 0)
        (void)!fchown(o->fd, (uid_t)-1, st.st_gid);
      (void)!fchmod(o->fd, st.st_mode & 07777);
    }
  }
  cookie_io_functions_t io = {NULL, out_cookie_write, NULL, NULL};
  o->f = fopencookie(o, "w", io);
  if (!o->f) return out_error(sub, o, path, errno ? errno : ENOMEM);
  return 0;
}

void cli_out_abort(cli_out *o) {
  if (!o) return;
  if (o->f) {
    int keep = o->err;
    o->err = ECANCELED; /* nothing more reaches the file */
    fclose(o->f);
    o->err = keep;
    o->f = NULL;
  }
  if (o->fd >= 0) close(o->fd);
  o->fd = -1;
  if (o->tmp) {
    unlink(o->tmp);
    out_unguard(o->tmp);
  }
  out_free(o);
}

int cli_out_fail(const char *sub, cli_out *o, int err_fallback) {
  int e = o->err ? o->err : err_fallback;
  char *path = o->path ? strdup(o->path) : NULL;
  int rc = out_error(sub, o, path ? path : "output", e);
  free(path);
  return rc;
}

int cli_out_commit(const char *sub, cli_out *o) {
  int e = 0;
  errno = 0;
  if (fflush(o->f) != 0 || ferror(o->f)) e = o->err ? o->err : EIO;
  if (fclose(o->f) != 0 && !e) e = o->err ? o->err : EIO;
  o->f = NULL;
  if (!e && o->tmp && fsync(o->fd) != 0) e = errno;
  if (close(o->fd) != 0 && !e) e = errno;
  o->fd = -1;
  if (!e && o->tmp && !o->excl && rename(o->tmp, o->target) != 0) e = errno;
  if (!e && o->tmp && o->excl) {
    if (link(o->tmp, o->target) != 0) e = errno;
    else unlink(o->tmp); /* the target is the file now */
  }
  if (e == EEXIST && o->excl) {
    char *path = o->path ? strdup(o->path) : NULL;
    int rc = out_error_why(sub, o, path ? path : "output",
                           "it appeared while the command ran (not replaced)");
    free(path);
    return rc;
  }
  if (e) return cli_out_fail(sub, o, e);
  if (o->tmp) {
    out_unguard(o->tmp);
    /* the rename itself reaches the disk with the directory (best effort) */
    char *dir = cli_dir_part(o->target);
    int dfd = dir ? open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC) : -1;
    if (dfd >= 0) {
      fsync(dfd);
      close(dfd);
    }
    free(dir);
  }
  out_free(o);
  return 0;
}

int cli_out_open(const char *sub, cli_out *o, const char *path) {
  return out_open(sub, o, path, 0);
}

int cli_out_open_new(const char *sub, cli_out *o, const char *path) {
  return out_open(sub, o, path, 1);
}

static int write_json(const char *sub, const char *path, json_t *v, int excl) {
  cli_out o;
  int rc = out_open(sub, &o, path, excl);
  if (rc) return rc;
  if (!v || json_dumpf(v, o.f, JSON_INDENT(2) | JSON_PRESERVE_ORDER) != 0 ||
      fputc('\n', o.f) == EOF)
    return cli_out_fail(sub, &o, v ? EIO : ENOMEM);
  return cli_out_commit(sub, &o);
}

int cli_write_json(const char *sub, const char *path, json_t *v) {
  return write_json(sub, path, v, 0);
}

int cli_write_json_new(const char *sub, const char *path, json_t *v) {
  return write_json(sub, path, v, 1);
}

int cli_write_text(const char *sub, const char *path, const char *text) {
  cli_out o;
  int rc = cli_out_open(sub, &o, path);
  if (rc) return rc;
  size_t n = text ? strlen(text) : 0;
  if (!text || fwrite(text, 1, n, o.f) != n)
    return cli_out_fail(sub, &o, text ? EIO : ENOMEM);
  return cli_out_commit(sub, &o);
}

/* Standard output through the outputs' cookie (fd 1, the first failed
 * write's errno kept), so that a loss found late still has its cause. */
static cli_out stdout_o = {.fd = STDOUT_FILENO};

void cli_stdout_init(void) {
  cookie_io_functions_t io = {.write = out_cookie_write};
  FILE *f = fopencookie(&stdout_o, "w", io);
  if (!f) return; /* then the C library's stdout, and EIO for a loss */
  setvbuf(f, NULL, isatty(STDOUT_FILENO) ? _IOLBF : _IOFBF, BUFSIZ);
  stdout_o.f = f;
  stdout = f; /* glibc: stdout is an ordinary variable */
}

int cli_stdout_check(const char *sub) {
  int e = 0;
  errno = 0;
  if (fflush(stdout) != 0) e = errno ? errno : EIO;
  else if (ferror(stdout)) e = EIO;
  if (!e) return 0;
  if (stdout_o.f == stdout && stdout_o.err) e = stdout_o.err;
  /* a reader that closed the pipe (| head) wanted no more: the exit code
   * says the output is not whole, no message on the terminal */
  if (e != EPIPE) cli_error(sub, "cannot write standard output: %s", strerror(e));
  return CLI_EXIT_INTERNAL;
}

/* ---- names from files -------------------------------------------------------- */

void cli_escape_name(char *dst, size_t n, const char *name) {
  probe_text_escape(dst, n, name ? name : "");
}

/* s with its controls escaped as on the terminal (probe_text_escape) but
 * its backslashes kept: bisect writes names into its JSON escaped already
 * ("cfg\\e.json"), and escaping them twice would show "\\e". Caller frees. */
char *cli_escape_controls(const char *s) {
  size_t cap = strlen(s) * 6 + 1, o = 0; /* an escape is at most 6 bytes */
  char *out = malloc(cap), *seg = strdup(s);
  if (!out || !seg) {
    free(out);
    free(seg);
    return NULL;
  }
  for (char *p = seg;;) {
    char *bs = strchr(p, '\\');
    if (bs) *bs = '\0';
    o += probe_text_escape(out + o, cap - o, p);
    if (!bs) break;
    out[o++] = '\\';
    p = bs + 1;
  }
  out[o] = '\0';
  free(seg);
  return out;
}

char *cli_join_quoted(const char *lit, const char *const *w, size_t n) {
  size_t need = (lit ? strlen(lit) : 0) + 1;
  for (size_t i = 0; i < n; i++) need += probe_shell_quote(NULL, 0, w[i]) + 1;
  char *s = malloc(need);
  if (!s) return NULL;
  size_t o = (size_t)snprintf(s, need, "%s", lit ? lit : "");
  for (size_t i = 0; i < n; i++) {
    if (i) s[o++] = ' ';
    o += probe_shell_quote(s + o, need - o, w[i]);
  }
  s[o] = '\0';
  return s;
}

int cli_paste_word(char *dst, size_t n, const char *s) {
  if (!n) return -1;
  dst[0] = '\0';
  size_t need = probe_shell_quote(NULL, 0, s ? s : "") + 1;
  char *q = malloc(need), *e = NULL;
  if (q && probe_shell_quote(q, need, s ? s : "") < need)
    e = cli_escape_controls(q);
  int ok = e && strlen(e) < n;
  if (ok) memcpy(dst, e, strlen(e) + 1);
  free(q);
  free(e);
  return ok ? 0 : -1;
}

int cli_print_name(FILE *f, const char *name) {
  char small[256];
  size_t need = probe_text_escape(NULL, 0, name ? name : "") + 1;
  char *buf = need <= sizeof small ? small : malloc(need);
  if (!buf) return -1;
  probe_text_escape(buf, need, name ? name : "");
  int r = fputs(buf, f) == EOF ? -1 : (int)strlen(buf);
  if (buf != small) free(buf);
  return r;
}

int cli_json_print(const char *sub, json_t *v) {
  int bad = json_dumpf(v, stdout, JSON_INDENT(2) | JSON_PRESERVE_ORDER) != 0 ||
            fputc('\n', stdout) == EOF;
  int rc = cli_stdout_check(sub);
  if (!rc && bad) {
    cli_error(sub, "cannot print the result: out of memory");
    rc = CLI_EXIT_INTERNAL;
  }
  return rc;
}

json_t *cli_json_num(double x) {
  return isfinite(x) ? json_real(x) : json_null();
}

/* The first SIGINT/SIGTERM asks the work to stop; a later one ends the
 * process by the signal (work stuck in a library call cannot make it deaf
 * to SIGTERM). A repeat within CLI_SIGNAL_REPEAT_S of the first is the same
 * request delivered twice, and only that: timeout(1) sends its signal to
 * the command and then to the command's process group, a terminal's Ctrl-C
 * reaches every process of the foreground group, a launcher forwards what
 * it got. It killed `run` before the trace was marked (one time in a few,
 * as the second kill came before or after the first was handled). */
#define CLI_SIGNAL_REPEAT_S 1.0
static struct timespec sig_first; /* the handler's only (it blocks both) */

static double ts_since(const struct timespec *a, const struct timespec *b) {
  return (double)(b->tv_sec - a->tv_sec) + 1e-9 * (double)(b->tv_nsec - a->tv_nsec);
}

static void on_signal(int sig) {
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now); /* async-signal-safe */
  if (!cli_stop_flag) {
    sig_first = now;
    cli_stop_signal = sig;
    cli_stop_flag = 1;
    return;
  }
  if (ts_since(&sig_first, &now) < CLI_SIGNAL_REPEAT_S) return;
  signal(sig, SIG_DFL);
  raise(sig); /* blocked here: delivered, by the default action, on return */
}

void cli_signals_install(void) { on_interrupt(on_signal); }

void cli_signals_default(void) { on_interrupt(SIG_DFL); }

double cli_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void cli_line_init(cli_line *l, int quiet, double delay) {
  l->enabled = !quiet && isatty(STDERR_FILENO);
  l->t0 = cli_now();
  l->delay = delay;
  l->last_draw = 0;
}

int cli_line_due(cli_line *l, int force) {
  if (!l->enabled) return 0;
  double now = cli_now();
  if (now - l->t0 < l->delay || (!force && now - l->last_draw < 0.1))
    return 0;
  l->last_draw = now;
  return 1;
}

void cli_line_draw(cli_line *l, const char *fmt, ...) {
  if (!l->enabled) return;
  char text[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(text, sizeof text, fmt, ap);
  va_end(ap);
  fprintf(stderr, "\r\033[K%s", text);
  fflush(stderr);
  busy_shown = 1; /* cli_busy_done (before any output) erases it */
}

void cli_line_clear(cli_line *l) {
  if (l->enabled) cli_busy_done();
}

double cli_line_delay(void) {
  const char *e = getenv("AMPPROBE_PROGRESS_DELAY");
  char *end = NULL;
  double v = e && *e ? strtod(e, &end) : 1.0;
  return e && *e && (*end || !(v >= 0) || v > 3600) ? 1.0 : v;
}

/* ---- the progress line of reading traces ---------------------------------- */

void cli_read_line_init(cli_read_line *p, int quiet, const char *path,
                        const char *words) {
  cli_line_init(&p->line, quiet, cli_line_delay());
  cli_read_line_name(p, path, words);
}

void cli_read_line_name(cli_read_line *p, const char *path, const char *words) {
  p->phase[0] = '\0'; /* the new name drawn at once */
  if (path)
    cli_escape_name(p->name, sizeof p->name, path);
  else
    snprintf(p->name, sizeof p->name, "%s", words ? words : "the trace");
}

probe_progress_fn cli_read_line_fn(const cli_read_line *p) {
  return p->line.enabled ? cli_read_line_draw : NULL;
}

static void fmt_rows(char *buf, size_t n, uint64_t v) {
  if (v < 10000)
    snprintf(buf, n, "%llu", (unsigned long long)v);
  else if (v < 1000000)
    snprintf(buf, n, "%.1fk", (double)v / 1e3);
  else if (v < 1000000000)
    snprintf(buf, n, "%.1fM", (double)v / 1e6);
  else
    snprintf(buf, n, "%.1fG", (double)v / 1e9);
}

int cli_read_line_draw(const char *phase, uint64_t done, uint64_t total,
                       void *user) {
  cli_read_line *p = user;
  if (total == 0 || !cli_line_due(&p->line, strcmp(phase, p->phase) != 0))
    return 0;
  snprintf(p->phase, sizeof p->phase, "%s", phase);
  char d[32], t[32];
  fmt_rows(d, sizeof d, done);
  fmt_rows(t, sizeof t, total);
  int pct = (int)((double)done * 100.0 / (double)total);
  if (!strcmp(phase, PROBE_PROGRESS_RANKS))
    cli_line_draw(&p->line, "reading rank files: %d%% (%s of %s files)", pct, d, t);
  else if (!strcmp(phase, PROBE_PROGRESS_RANKS_AGAIN))
    cli_line_draw(&p->line, "reading rank files again: %d%% (%s of %s files)", pct, d, t);
  else if (!strcmp(phase, CLI_PHASE_SCANNING))
    cli_line_draw(&p->line, "scanning rank files: %d%% (%s of %s files)", pct, d, t);
  else
    cli_line_draw(&p->line, "%s %s: %d%% (%s of %s rows)", phase, p->name, pct, d, t);
  return 0;
}

void cli_progress_init(cli_progress *p, int64_t total, int quiet) {
  cli_line_init(&p->line, quiet, 0);
  p->total = total;
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
  if (!cli_line_due(&p->line, done >= p->total)) return;
  double el = cli_now() - p->line.t0;
  double rate = el > 0 ? (double)done / el : 0;
  char eta[32];
  fmt_duration(eta, sizeof eta,
               rate > 0 ? (double)(p->total - done) / rate : NAN);
  cli_line_draw(&p->line, "%lld/%lld steps  %.1f steps/s  ETA %s  %s",
                (long long)done, (long long)p->total, rate, eta,
                extra ? extra : "");
}

void cli_progress_done(cli_progress *p) { cli_line_clear(&p->line); }

void cli_config_data_files(const char *config_json, const char *config,
                           char *data, size_t dl, char *data2, size_t d2l) {
  data[0] = data2[0] = 0;
  json_t *j = config_json ? json_loads(config_json, 0, NULL) : NULL;
  const char *p = json_string_value(json_object_get(json_object_get(j, "data"), "path"));
  if (p) snprintf(data, dl, "%s", p);
  json_decref(j);
  if (data[0] && data[0] != '/' && config && strchr(config, '/'))
    snprintf(data2, d2l, "%.*s/%s", (int)(strrchr(config, '/') - config), config, data);
}

json_t *cli_json_text(const char *s) {
  if (!s) return json_null();
  size_t need = probe_text_escape(NULL, 0, s) + 1;
  char small[512];
  char *buf = need <= sizeof small ? small : malloc(need);
  if (!buf) return NULL;
  probe_text_escape(buf, need, s);
  json_t *v = json_string(buf); /* escaped: always valid UTF-8 */
  if (buf != small) free(buf);
  return v;
}
