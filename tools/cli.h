/*
 * tools/cli.h - what every `ampprobe` subcommand shares: exit codes, the
 * one-line error format, strict number parsing for options, JSON output,
 * the Ctrl-C stop flag, the stderr progress line, and the file rules: inputs
 * that must be regular files, outputs written atomically (temporary file +
 * rename) that may not be an input, write errors reported with their errno.
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
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <jansson.h>

#include "ampprobe/probe.h" /* probe_progress_fn */
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

/* The positional TRACE arguments args[0..n-1] of a command (postmortem,
 * diff, report): an empty one is a usage error ("an empty argument is not a
 * trace", CLI_EXIT_USAGE); 0 otherwise. */
int cli_check_trace_args(const char *sub, char *const *args, int n);

/* Reports a scenario that did not load (probe_config_load_scenario's status
 * st and message err), the name escaped, in one line: "unknown scenario
 * 'NAME' (see ...)" for PROBE_ERR_NOT_FOUND, else "scenario NAME: why". */
void cli_scenario_error(const char *sub, const char *name, probe_status st,
                        const char *err);

/* Exit code for a status returned by the reader or another library. */
int cli_exit_for_status(probe_status st);

/* Opens the trace at path for reading (probe_trace_open_isolated). Returns 0,
 * or prints one line naming the file once ("PATH: why") and returns the
 * exit code: an input that exists but cannot be read (permission, a loop of
 * links, a name too long, an I/O error) is unreadable input, exit 3, as a
 * missing or corrupt one; out of memory is 4. */
struct probe_trace;
int cli_open_trace(const char *sub, struct probe_trace **t, const char *path);
/* The same, fn told of the child's reading (probe_trace_open_isolated_progress). */
int cli_open_trace_progress(const char *sub, struct probe_trace **t,
                            const char *path, probe_progress_fn fn, void *user);

/* probe_trace_last_error(t), "" when it says "no error" (a failure that
 * was not the reader's: out of memory said "out of memory: no error"). */
const char *cli_trace_error(const probe_trace *t);

/* Strict parsing of option values: the whole string must be a decimal
 * number (integers: [+-]digits; reals: [+-]digits[.digits][e[+-]digits]) -
 * no spaces, no hex, no inf/nan - in [lo, hi]. On failure prints through
 * cli_error "invalid value 'x' for --name: expected an integer" (or "a
 * decimal number"), or for a value outside the range (however large)
 * "invalid value 'x' for --name: must be in [lo, hi]", and returns -1 (the
 * caller returns CLI_EXIT_USAGE). */
int cli_parse_i64(const char *sub, const char *opt, const char *s, int64_t lo,
                  int64_t hi, int64_t *out);
int cli_parse_double(const char *sub, const char *opt, const char *s,
                     double lo, double hi, double *out);
/* The same with an open lower bound: (lo, hi], e.g. a threshold in (0, 1]. */
int cli_parse_double_gt(const char *sub, const char *opt, const char *s,
                        double lo, double hi, double *out);

/* A size in bytes: a decimal number with an optional unit B, K, M, G, T
 * (or KiB ... TiB; any case; powers of 1024), e.g. 512M, 1.5GiB, rounded
 * down to whole bytes and in [lo, hi]; errors as above. */
int cli_parse_size(const char *sub, const char *opt, const char *s,
                   uint64_t lo, uint64_t hi, uint64_t *out);

/* Call before getopt_long in a subcommand (resets glibc's state). */
void cli_getopt_reset(void);
/* Reports the option getopt_long rejected ('?' or ':') in the one-line
 * format and returns CLI_EXIT_USAGE. */
int cli_getopt_error(const char *sub, char **argv, int c);

/* Writes a JSON value to stdout (indented, with a final newline) and flushes
 * it. Returns 0, or prints why ("cannot write standard output: <why>") and
 * returns CLI_EXIT_INTERNAL. */
int cli_json_print(const char *sub, json_t *v);
/* json_real that turns NaN/inf (not valid JSON) into null. */
json_t *cli_json_num(double x);
/* A JSON string of text from a user, a file or a trace (a path, a name, a
 * message quoting them), escaped with probe_text_escape: control bytes and
 * bytes that are not UTF-8 as \e, \xHH. json_string() refuses invalid
 * UTF-8 (NULL), and the key then silently went missing. NULL gives null. */
json_t *cli_json_text(const char *s);

/* ---- files: inputs, outputs and write errors ------------------------------
 *
 * The rules every subcommand follows (docs/cli.md, "Files"):
 *  - an input that is not a regular file (FIFO, device, directory, socket)
 *    is refused before it is read, so a FIFO or /dev/zero cannot hang a tool;
 *  - an output that is one of the command's inputs is refused, whatever the
 *    flags (same st_dev/st_ino, or for an output that does not exist yet,
 *    the same real directory and name);
 *  - an output is written to a temporary file in the target's directory
 *    (created O_EXCL, mode 0666 & ~umask), flushed, fsync'ed and renamed over
 *    the target only when everything was written: a failed or interrupted
 *    write leaves the old file (or none), never a truncated one. A target
 *    that exists and is not a regular file (/dev/null, /dev/full, a FIFO) is
 *    written in place (a FIFO only with a reader there: one without is
 *    "a FIFO with no reader", exit 4, never a wait for ever); an existing
 *    symlink is followed, so the file it names
 *    is replaced and the link kept; a symlink to nothing (or a loop) is
 *    refused, exit 4: neither the link nor a file where it points is made;
 *  - an output that exists and is not what the command writes (report -o
 *    and diff -o: a trace, a text file) is refused unless --force
 *    (cli_check_replace); their own earlier output is replaced silently;
 *  - an output that must be new (cli_out_open_new: bisect -o without
 *    --force) is linked into place instead, so a file that appeared while
 *    the command ran is not replaced;
 *  - every write failure (EFBIG under `ulimit -f`, ENOSPC, EIO, EDQUOT,
 *    /dev/full, a FIFO whose reader has gone) is one line, "cannot write
 *    PATH: <strerror text>", exit 4. SIGXFSZ is ignored by main(), so a
 *    file-size limit is an EFBIG error and not a signal; SIGPIPE is held
 *    around each write, so a reader that left is EPIPE, not a signal.
 */

/* Returns 0 when path is a regular file, or when it cannot be opened (the
 * reader then says why in its own words). Otherwise prints "PATH: not a
 * regular file (a FIFO)" and returns CLI_EXIT_INPUT. Opens with O_NONBLOCK,
 * so checking a FIFO never blocks. */
int cli_check_input(const char *sub, const char *path);
/* The same for a path a config names: the message names its key
 * ("data.path /dev/zero: a character device; only regular files are
 * read"). */
int cli_check_input_key(const char *sub, const char *key, const char *path);

/* The data file a config names (data.path of config_json, the config as
 * the trainer stored it), in data ("" when none), and in data2 the same
 * path taken from the config file's folder when it is relative ("" else):
 * the places the trainer may read, which no output may replace. */
void cli_config_data_files(const char *config_json, const char *config,
                           char *data, size_t dl, char *data2, size_t d2l);

/* The folder part of path ("." when none, "/" for the root) in a new
 * string (free it), NULL when out of memory. */
char *cli_dir_part(const char *path);

/* 1 when a and b name the same file (see above), else 0. */
int cli_same_file(const char *a, const char *b);

/* Refuses (CLI_EXIT_USAGE, one line naming both) an output that is one of
 * the n inputs (NULL entries are skipped); 0 otherwise. */
int cli_check_output(const char *sub, const char *out,
                     const char *const *inputs, size_t n);

/* Several TRACE arguments (a set named file by file): one that names
 * nothing (no file, and no glob characters) is "PATH: no such file"
 * (CLI_EXIT_INPUT, one line) before the set is read; else the set's reader
 * spoke of another member ("A.h5 has no rank attribute") and never of the
 * typo. 0 when each names something, or for one argument (its reader says
 * why in its own words). */
int cli_check_trace_files(const char *sub, char *const *args, int n);

/* The value of an output option (opt, "-o") as a name: an empty path
 * names no file, and a path ending in '/' names a directory, never the
 * file to write; either is refused (CLI_EXIT_USAGE, one line). 0 else (a
 * NULL path too). */
int cli_check_out_arg(const char *sub, const char *opt, const char *path);

/* Refuses (CLI_EXIT_USAGE, one line) an output that would join one of the
 * n trace sets args names: a file ending in .h5 directly in a directory
 * argument, or one the glob argument matches ('run/ *.h5'). The next
 * postmortem, diff or report of that set would read it as a member (an
 * unreadable one). Arguments that name a file are no set. 0 otherwise. */
int cli_check_out_joins_set(const char *sub, const char *out,
                            char *const *args, size_t n);

/* 1 when the first n bytes of a file (n <= CLI_OWN_HEAD) are what the
 * command itself writes (its earlier output, which it may replace). */
typedef int (*cli_own_output_fn)(const char *head, size_t n);
#define CLI_OWN_HEAD 4096

/* What report -o and diff -o may replace: nothing (no file), an empty
 * file, something that is no regular file (/dev/null, a FIFO: written in
 * place), or the command's own earlier output (ours(head)), which a
 * re-run replaces silently. Anything else - an HDF5 file (the signature
 * at offset 0, 512, 1024, 2048, ...: a trace), any other file that ours
 * does not recognise (what: "a page that 'ampprobe report' wrote") - is
 * refused, CLI_EXIT_USAGE with one line that names --force; with force
 * it is replaced. Returns 0 when the output may be written. */
int cli_check_replace(const char *sub, const char *path, int force,
                      cli_own_output_fn ours, const char *what);

/* An output being written. f is a stdio stream whose writes go through
 * write(2); the first failure's errno is kept, so the message names the real
 * cause even after stdio has moved on. */
typedef struct cli_out {
  FILE *f;
  char *path;   /* the target as given (for messages) */
  char *target; /* the file that is replaced (a symlink resolved) */
  char *tmp;    /* the temporary file, NULL when written in place */
  int fd;
  int err;      /* errno of the first failed write, 0 when none */
  int excl;     /* 1: linked into place at commit, never replacing */
} cli_out;

/* Opens an output. Returns 0, or prints "cannot write PATH: <why>" and
 * returns CLI_EXIT_INTERNAL. */
int cli_out_open(const char *sub, cli_out *o, const char *path);
/* What cli_out_open refuses whatever the flags, said now (before a long
 * command runs): a symbolic link to nothing or a loop, a directory (or a
 * link to one) prints "cannot write PATH: <why>" and returns
 * CLI_EXIT_INTERNAL; 0 otherwise (nothing there, a file, a device or FIFO,
 * or a link to one of them). Opens nothing. */
int cli_out_check(const char *sub, const char *path);
/* The same for an output that must not exist: refused (EEXIST) when
 * anything is at path, even a symlink; at commit the temporary file is
 * linked to path, and "PATH: it appeared while the command ran" when
 * something took the name meanwhile. */
int cli_out_open_new(const char *sub, cli_out *o, const char *path);
/* Finishes it: flush, fsync, close, rename into place. Returns 0, or
 * prints "cannot write PATH: <why>", removes the temporary file and returns
 * CLI_EXIT_INTERNAL. Closes o in every case. */
int cli_out_commit(const char *sub, cli_out *o);
/* Gives up on an output without a message: the temporary file is removed,
 * the target left as it was. Safe on a zeroed or closed cli_out. */
void cli_out_abort(cli_out *o);
/* Prints "cannot write PATH: <why>" (the recorded errno, else err_fallback's
 * text), aborts o and returns CLI_EXIT_INTERNAL. For a write that failed
 * before commit. */
int cli_out_fail(const char *sub, cli_out *o, int err_fallback);

/* A whole JSON document (indented, final newline) written to path as above.
 * Returns 0 or CLI_EXIT_INTERNAL (message printed). */
int cli_write_json(const char *sub, const char *path, json_t *v);
/* The same through cli_out_open_new. */
int cli_write_json_new(const char *sub, const char *path, json_t *v);
/* The same for a text already rendered (e.g. a library's JSON string). */
int cli_write_text(const char *sub, const char *path, const char *text);

/* At the end of a command: flushes stdout; when anything written to it was
 * lost (a full disk, /dev/full, a closed descriptor), prints "cannot write
 * standard output: <why>" and returns CLI_EXIT_INTERNAL, else 0. main()
 * calls it after every subcommand that did not report an error itself; a
 * command that flushes earlier calls it there (one message, its cause: the
 * errno of the first failed write, kept since cli_stdout_init). */
int cli_stdout_check(const char *sub);
/* Sends stdout through write(2) keeping the first failure's errno (main()
 * calls it first). */
void cli_stdout_init(void);

/* Writes a name read from a file (a layer or scenario name, a path) to f
 * escaped by the analysis library's probe_text_escape, the one escaping of
 * the project: \n \r \t \e \a ..., \xHH, a backslash as \\, the C1
 * controls as \u0080..\u009f, the bidi controls as \u202e ...; so a name
 * cannot move the cursor, clear the screen, ring the bell, start a forged
 * line or show itself (and the rest of the line) reversed. Returns the characters
 * written, or -1. */
int cli_print_name(FILE *f, const char *name);
/* The same into a buffer (always NUL-terminated, truncated to fit). */
void cli_escape_name(char *dst, size_t n, const char *name);
/* s with its controls escaped as cli_escape_name does, its backslashes
 * kept (one backslash stays one). malloc'd, NULL when out of memory. */
char *cli_escape_controls(const char *s);
/* s as one word of a command the user pastes (probe_shell_quote) into
 * dst, controls escaped (cli_escape_controls): a backslash stays one
 * backslash (cli_escape_name doubled it, and the pasted path was
 * another); a word with controls is for the eye only. Returns 0, or -1
 * with dst "" when the whole word does not fit in n bytes (or no memory):
 * never a cut word, and the caller prints no command then. */
int cli_paste_word(char *dst, size_t n, const char *s);
/* A command line to store or paste: lit as it is (NULL: none), then the n
 * words each shell-quoted (probe_shell_quote: safe words stay bare),
 * separated by spaces, the first right after lit. Whole, malloc'd; NULL
 * when out of memory. */
char *cli_join_quoted(const char *lit, const char *const *w, size_t n);

/* Stop flag set by SIGINT/SIGTERM once cli_signals_install() was called. */
extern volatile sig_atomic_t cli_stop_flag;
extern volatile sig_atomic_t cli_stop_signal;
void cli_signals_install(void);
/* For the commands that only read (postmortem, diff, report): SIGINT and
 * SIGTERM remove the output being written, if any, print "ampprobe: <sub>:
 * interrupted" and exit 130 at once (main() installs it before them). */
void cli_signals_exit_install(const char *sub);
/* The same, the line ending in " (note)" (escaped by the caller); a note
 * too long for the line (about 550 bytes) is left out, not cut. */
void cli_signals_exit_install_note(const char *sub, const char *note);
/* The same without the line: a process that does not speak for the
 * command (a rank other than 0 of a job) exits 130 quietly. */
void cli_signals_exit_install_quiet(void);
/* SIGINT and SIGTERM back to their default action (a subcommand's work is
 * done). */
void cli_signals_default(void);

/* A long read (inputs of CLI_BUSY_BYTES or more) says on a terminal what it
 * reads: one line on stderr, "ampprobe: SUB: reading PATH (N MB) ...",
 * cleared by cli_busy_done() before the command prints anything (cli_error
 * clears it too). cli_open_trace shows it; cli_busy_quiet (-q) hides it. */
#define CLI_BUSY_BYTES (16LL << 20)
extern int cli_busy_quiet;
void cli_busy(const char *sub, const char *path, long long bytes);
void cli_busy_done(void);
long long cli_file_bytes(const char *path);

/* One self-overwriting line on stderr ("\r\033[K" and the text), the
 * progress of long work: only when stderr is a terminal and not quiet,
 * nothing before `delay` seconds since cli_line_init (short work shows
 * nothing), redrawn at most 10 times a second. It is the line cli_busy
 * uses: cli_busy_done and cli_error erase it too. */
typedef struct cli_line {
  int enabled;
  double t0, delay, last_draw;
} cli_line;

void cli_line_init(cli_line *l, int quiet, double delay);
/* 1 when the line is to be drawn now (force: whatever the 10 a second),
 * and noted as drawn: then call cli_line_draw. */
int cli_line_due(cli_line *l, int force);
void cli_line_draw(cli_line *l, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
void cli_line_clear(cli_line *l);
/* The delay a command's progress line waits for: 1 s, or
 * AMPPROBE_PROGRESS_DELAY seconds (0: at once; tests). */
double cli_line_delay(void);

/* Progress on stderr, only when stderr is a terminal and not quiet. */
typedef struct cli_progress {
  cli_line line;
  int64_t total;
} cli_progress;

double cli_now(void); /* monotonic seconds */
void cli_progress_init(cli_progress *p, int64_t total, int quiet);
/* Redraws at most 10 times a second; extra is appended ("loss 0.53 ..."). */
void cli_progress_update(cli_progress *p, int64_t done, const char *extra);
void cli_progress_done(cli_progress *p);

/* The progress line of reading traces (postmortem, report), over
 * probe_progress_fn: of one trace "checking t.h5: 42% (3.0M of 7.2M rows)",
 * then "analysing t.h5: ..." (and report's "plotting t.h5: ..."); of a rank
 * set "reading rank files: 37% (380 of 1024 files)" and report's "scanning
 * rank files: ..." (CLI_PHASE_SCANNING, CLI_PHASE_PLOTTING). name is the
 * trace's path (escaped here) or words ("the focus rank"). */
#define CLI_PHASE_SCANNING "scanning"
#define CLI_PHASE_PLOTTING "plotting"
typedef struct cli_read_line {
  cli_line line;
  char name[600];
  char phase[32]; /* the phase drawn last: a new one is drawn at once */
} cli_read_line;
void cli_read_line_init(cli_read_line *p, int quiet, const char *path,
                        const char *words);
/* What the line names from now on: path (escaped), or words as they are
 * when path is NULL. */
void cli_read_line_name(cli_read_line *p, const char *path, const char *words);
/* The callback to hand a probe_*_progress call: NULL when the line is off
 * (so the library does no progress work at all). */
probe_progress_fn cli_read_line_fn(const cli_read_line *p);
/* Draws phase's done of total (at most 10 times a second, a new phase at
 * once); returns 0. */
int cli_read_line_draw(const char *phase, uint64_t done, uint64_t total,
                       void *user);

#endif /* AMPPROBE_TOOLS_CLI_H */
