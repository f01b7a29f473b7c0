/*
 * bench/postmortem_ranks.c - the cross-rank post-mortem over sets of
 * synthetic rank traces (issue #14.7): wall time, CPU time and peak RSS of
 * `ampprobe postmortem DIR --json` for several numbers of ranks, to show
 * that memory does not grow with the number of ranks and that 1,024 ranks
 * x 1,000 steps x 30 layers take under a minute.
 *
 * For each N it writes (unless DIR/N already holds N rank files) a job of
 * N ranks with bench/synth_ranks (a planted NaN on one rank a few steps
 * before the all-reduce carries it to every rank), runs the real binary
 * with its output to /dev/null, and reads the time and the peak RSS from
 * wait4() (the peak of the process and of the per-file reader children it
 * waits for). It also checks the answer: the first non-finite value on the
 * planted rank and step, carried to every other rank.
 *
 *   bench_postmortem_ranks [--ranks 64,256,1024] [--steps 1000]
 *                          [--layers 30] [--dir /tmp/ampprobe-bench-ranks]
 *                          [--md FILE]
 */
#define _DEFAULT_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef AMPPROBE_BIN
#error "AMPPROBE_BIN must be defined"
#endif
#ifndef SYNTH_BIN
#error "SYNTH_BIN must be defined"
#endif

#define MAX_SIZES 16

typedef struct meas {
  int ranks;
  double gen_s, wall_s, cpu_s;
  long maxrss_kib;
  int rc;
  int answer_ok;
} meas;

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Runs argv with stdout to out_path (NULL: /dev/null); fills the time and
 * the peak RSS of the child tree. Returns the exit status or -1. */
static int run(char *const argv[], const char *out_path, meas *m) {
  double t0 = now();
  pid_t pid = fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    int fd = open(out_path ? out_path : "/dev/null",
                  O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd >= 0) dup2(fd, 1);
    execv(argv[0], argv);
    _exit(127);
  }
  int st = 0;
  struct rusage ru;
  if (wait4(pid, &st, 0, &ru) < 0) return -1;
  if (m) {
    m->wall_s = now() - t0;
    m->cpu_s = (double)ru.ru_utime.tv_sec + 1e-6 * (double)ru.ru_utime.tv_usec +
               (double)ru.ru_stime.tv_sec + 1e-6 * (double)ru.ru_stime.tv_usec;
    m->maxrss_kib = ru.ru_maxrss;
  }
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static int have_set(const char *dir, int ranks) {
  char p[600];
  snprintf(p, sizeof p, "%s/trace.rank%d.h5", dir, ranks - 1);
  struct stat st;
  if (stat(p, &st) != 0) return 0;
  snprintf(p, sizeof p, "%s/trace.rank%d.h5", dir, ranks);
  return stat(p, &st) != 0;
}

static int generate(const char *dir, int ranks, const char *steps,
                    const char *layers, meas *m) {
  char r[16];
  snprintf(r, sizeof r, "%d", ranks);
  char *argv[] = {SYNTH_BIN, "--out", (char *)dir, "--ranks", r, "--steps",
                  (char *)steps, "--layers", (char *)layers, "--jobs", "2",
                  "--overwrite", "--quiet", NULL};
  meas g;
  double t0 = now();
  int rc = run(argv, NULL, &g);
  m->gen_s = now() - t0;
  return rc;
}

/* The planted fault (synth_ranks' defaults): rank ranks*5/8, step
 * steps*9/10; the all-reduce carries it to every other rank. */
static int check_answer(const char *json_path, int ranks, int steps) {
  FILE *f = fopen(json_path, "r");
  if (!f) return 0;
  static char buf[1 << 16];
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = '\0';
  char want[128];
  snprintf(want, sizeof want,
           "\"first_nonfinite\": {\n    \"rank\": %d,\n    \"step\": %d,",
           ranks * 5 / 8, steps * 9 / 10);
  char kind[] = "\"kind\": \"rank\"";
  return strstr(buf, want) != NULL && strstr(buf, kind) != NULL;
}

static void measure(const char *root, int ranks, const char *steps,
                    const char *layers, meas *m) {
  char dir[512], json[600];
  snprintf(dir, sizeof dir, "%s/r%d-s%s-l%s", root, ranks, steps, layers);
  m->ranks = ranks;
  m->gen_s = 0;
  if (!have_set(dir, ranks) && generate(dir, ranks, steps, layers, m) != 0) {
    fprintf(stderr, "bench_postmortem_ranks: synth_ranks failed for %d\n",
            ranks);
    exit(1);
  }
  snprintf(json, sizeof json, "%s.json", dir);
  char *argv[] = {AMPPROBE_BIN, "postmortem", dir, "--json", NULL};
  m->rc = run(argv, json, m);
  m->answer_ok = check_answer(json, ranks, atoi(steps));
}

static int parse_sizes(const char *s, int *out) {
  int n = 0;
  char *copy = strdup(s), *save = NULL;
  for (char *t = strtok_r(copy, ",", &save); t && n < MAX_SIZES;
       t = strtok_r(NULL, ",", &save))
    out[n++] = atoi(t);
  free(copy);
  return n;
}

int main(int argc, char **argv) {
  const char *sizes = "64,256,1024", *steps = "1000", *layers = "30";
  const char *root = "/tmp/ampprobe-bench-ranks", *md = NULL;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--ranks")) sizes = argv[i + 1];
    else if (!strcmp(argv[i], "--steps")) steps = argv[i + 1];
    else if (!strcmp(argv[i], "--layers")) layers = argv[i + 1];
    else if (!strcmp(argv[i], "--dir")) root = argv[i + 1];
    else if (!strcmp(argv[i], "--md")) md = argv[i + 1];
    else {
      fprintf(stderr, "usage: bench_postmortem_ranks [--ranks 64,256,1024] "
                      "[--steps N] [--layers N] [--dir D] [--md FILE]\n");
      return 2;
    }
  }
  mkdir(root, 0700);
  int n[MAX_SIZES];
  int k = parse_sizes(sizes, n);
  meas m[MAX_SIZES];
  FILE *o = md ? fopen(md, "w") : stdout;
  if (!o) return 1;
  fprintf(o, "| ranks | steps | layers | wall s | CPU s | peak RSS MiB | exit | "
             "answer | (generation s) |\n|---|---|---|---|---|---|---|---|---|\n");
  int bad = 0;
  for (int i = 0; i < k; i++) {
    measure(root, n[i], steps, layers, &m[i]);
    fprintf(o, "| %d | %s | %s | %.2f | %.2f | %.1f | %d | %s | %.1f |\n",
            m[i].ranks, steps, layers, m[i].wall_s, m[i].cpu_s,
            (double)m[i].maxrss_kib / 1024.0, m[i].rc,
            m[i].answer_ok ? "right" : "WRONG", m[i].gen_s);
    fflush(o);
    bad |= !m[i].answer_ok || m[i].rc != 1;
  }
  if (md) fclose(o);
  return bad;
}
