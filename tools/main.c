/*
 * tools/main.c - the `ampprobe` command: dispatches to one subcommand per
 * file (tools/<name>.c). To add a subcommand, add a row to `commands`.
 *
 * Before any subcommand runs, SIGXFSZ is ignored: past a file-size limit
 * (`ulimit -f`) a write then fails with EFBIG, which every writer reports as
 * "cannot write PATH: File too large" with exit 4, instead of the process
 * being killed half-way through a file. After it, whatever went to stdout is
 * flushed and checked (a full disk, /dev/full): a lost output is exit 4.
 * Closed standard descriptors are filled first (std_fds_fill).
 */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "ampprobe/version.h"
#include "cli.h"

/* OpenBLAS (the trainer's BLAS) starts its worker threads in its load-time
 * constructor, and each worker allocates a 128 MiB buffer there; under an
 * address-space limit too tight for that (`ulimit -v`) the allocation
 * retries forever and the process can never exit (every command, even
 * --version, hung at exit joining the worker). The trainer runs its GEMMs
 * on one thread anyway (bit-identical runs). So under such a limit, and
 * only then, the CLI runs itself again with OPENBLAS_NUM_THREADS=1, which
 * OpenBLAS reads before it starts any thread (the variable cannot be set
 * earlier from inside: libc's initialiser resets the environment after
 * .preinit_array). If that exec fails, it goes on as it is. */
static void cli_blas_one_thread(char **argv) {
  struct rlimit rl;
  const char *v = getenv("OPENBLAS_NUM_THREADS");
  if ((v && !strcmp(v, "1")) || getrlimit(RLIMIT_AS, &rl) != 0 ||
      rl.rlim_cur == RLIM_INFINITY)
    return;
  if (setenv("OPENBLAS_NUM_THREADS", "1", 1) == 0) execv("/proc/self/exe", argv);
}

/* A signal during start-up: the libraries' load-time constructors
 * (OpenBLAS, the CUDA runtime, Open MPI) take ~0.1 s before main, and a
 * SIGINT/SIGTERM there used to kill the process by the signal with no
 * message. The executable's .preinit_array runs after the libraries are
 * mapped and before any of their constructors, so from there on a signal
 * only sets cli_stop_flag; main then ends with "interrupted" (exit 130)
 * before any work starts. A later signal still kills (cli_signals_install). */
static void cli_preinit_signals(void) { cli_signals_install(); }
__attribute__((section(".preinit_array"), used)) static void (
    *const cli_preinit)(void) = cli_preinit_signals;

typedef struct command {
  const char *name;
  int (*fn)(int argc, char **argv);
  const char *summary;
  int stops_itself; /* closes its work on SIGINT/SIGTERM (cli_signals_install) */
} command;

static const command commands[] = {
    {"run", cmd_run, "train a scenario or config with probes, write a trace", 1},
    {"postmortem", cmd_postmortem,
     "explain a trace: first non-finite event, why, what to do", 0},
    {"bisect", cmd_bisect,
     "find a minimal set of modules to keep in FP32 (delta debugging)", 1},
    {"diff", cmd_diff, "compare a trace with its baseline layer by layer", 0},
    {"report", cmd_report, "write a self-contained HTML report with plots", 0},
};
#define N_COMMANDS (sizeof commands / sizeof commands[0])

static void usage(FILE *f) {
  fprintf(f,
          "usage: ampprobe <command> [options]   (ampprobe <command> --help)\n"
          "\n"
          "Numerical diagnostics and NaN hunting for FP16 mixed-precision "
          "training.\n"
          "\n"
          "commands:\n");
  for (size_t i = 0; i < N_COMMANDS; i++)
    fprintf(f, "  %-12s %s\n", commands[i].name, commands[i].summary);
  fprintf(f,
          "\n"
          "options:\n"
          "  -h, --help     this help\n"
          "  --version      print the version\n"
          "\n"
          "exit codes (every command):\n"
          "  0    healthy / no problem found\n"
          "  1    the run diverged or a problem was diagnosed\n"
          "  2    usage error (unknown option, bad value)\n"
          "  3    unreadable or corrupt input\n"
          "  4    internal or runtime error (e.g. cannot write the output)\n"
          "  5    bisect only: the FP32 baseline does not train\n"
          "  130  interrupted (SIGINT/SIGTERM)\n"
          "errors are one line on stderr: 'ampprobe: <command>: <what>'.\n"
          "\n"
          "example session:\n"
          "  ampprobe run --scenario revin-overflow --trace -o fp16.h5\n"
          "  ampprobe postmortem fp16.h5\n");
}

/* The subcommand's exit code, or 4 when its standard output was lost. An
 * error already reported (2, 3, 4, 130) keeps its code. */
static int finish(const char *sub, int rc) {
  if (rc != CLI_EXIT_OK && rc != CLI_EXIT_PROBLEM) {
    fflush(stdout); /* the error is reported already */
    return rc;
  }
  int out = cli_stdout_check(sub);
  return out ? out : rc;
}

/* Whether a signal came during start-up (see cli_preinit_signals): then
 * nothing has been done yet, and the command ends here, exit 130. */
static int started_interrupted(const char *sub) {
  if (!cli_stop_flag) return 0;
  cli_error(sub, "interrupted");
  return 1;
}

/* Standard descriptors the caller closed (a daemon, cron, a supervisor
 * with `<&- 2>&-`) get /dev/null, opened the wrong way round so that a
 * write to stdout or stderr still fails (EBADF: "cannot write standard
 * output") and a read of stdin too. Otherwise the next file opened takes
 * the number: an output page or a trace on fd 1 or 2 would receive what
 * is printed to stdout or stderr. */
static void std_fds_fill(void) {
  for (int fd = 0; fd <= 2; fd++) {
    if (fcntl(fd, F_GETFD) >= 0 || errno != EBADF) continue;
    int nul = open("/dev/null", fd == 0 ? O_WRONLY : O_RDONLY);
    if (nul >= 0 && nul != fd) {
      dup2(nul, fd);
      close(nul);
    }
  }
}

static const command *find_command(const char *name) {
  for (size_t i = 0; name && i < N_COMMANDS; i++)
    if (!strcmp(name, commands[i].name)) return &commands[i];
  return NULL;
}

int main(int argc, char **argv) {
  std_fds_fill();
  const command *c = find_command(argc >= 2 ? argv[1] : NULL);
  if (started_interrupted(c ? c->name : NULL)) return CLI_EXIT_INTERRUPTED;
  cli_blas_one_thread(argv);
  signal(SIGXFSZ, SIG_IGN); /* inherited by bisect's trials through exec */
  cli_stdout_init();
  if (argc < 2) {
    usage(stderr);
    return CLI_EXIT_USAGE;
  }
  const char *cmd = argv[1];
  if (!strcmp(cmd, "-h") || !strcmp(cmd, "--help") || !strcmp(cmd, "help")) {
    usage(stdout);
    return finish(NULL, CLI_EXIT_OK);
  }
  if (!strcmp(cmd, "--version") || !strcmp(cmd, "version")) {
    printf("ampprobe %s\n", ampprobe_version());
    return finish(NULL, CLI_EXIT_OK);
  }
  if (c) {
    /* the others only read: an interrupt ends them at once, exit 130;
     * those that stop themselves keep the start-up handler, so a signal
     * while they parse and load is a stop request they see. */
    if (!c->stops_itself) cli_signals_exit_install(cmd);
    if (started_interrupted(cmd)) return CLI_EXIT_INTERRUPTED;
    int rc = c->fn(argc - 1, argv + 1);
    /* Its work is closed: from here a signal ends the process, so that
     * nothing that hangs at exit (a library's destructor) can make it
     * deaf to SIGTERM. (The others' handler exits at once already.) */
    if (c->stops_itself) cli_signals_default();
    return finish(cmd, rc);
  }
  if (cmd[0] == '-')
    cli_error(NULL, "unknown option %s (see 'ampprobe --help')", cmd);
  else
    cli_error(NULL, "unknown command '%s' (see 'ampprobe --help')", cmd);
  return CLI_EXIT_USAGE;
}
