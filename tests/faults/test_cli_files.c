/*
 * tests/faults/test_cli_files.c - the CLI's file rules and number parsing
 * (tools/cli.h) checked directly, where the shell cases cannot reach: the
 * temporary file removed on failure, on abort and on SIGTERM; a symlinked
 * target replaced through the link; the same-file test on hard links,
 * symlinks and names not created yet; strict numbers at their edges; the
 * name escaping.
 */
#define _GNU_SOURCE
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli.h"

static char dir[256];

static void setup(void) {
  snprintf(dir, sizeof dir, "/tmp/test_cli_files.XXXXXX");
  ck_assert_ptr_nonnull(mkdtemp(dir));
  ck_assert_int_eq(chdir(dir), 0);
}

static void teardown(void) {
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  if (chdir("/") != 0 || system(cmd) != 0) fprintf(stderr, "cleanup failed\n");
}

/* Files in the working directory whose name starts with '.' (temporaries). */
static int hidden_files(void) {
  DIR *d = opendir(".");
  struct dirent *e;
  int n = 0;
  while ((e = readdir(d)))
    if (e->d_name[0] == '.' && strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
      n++;
  closedir(d);
  return n;
}

static void put(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  ck_assert_ptr_nonnull(f);
  fputs(text, f);
  fclose(f);
}

static char *get(const char *path) {
  static char buf[4096];
  FILE *f = fopen(path, "r");
  if (!f) return NULL;
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  buf[n] = '\0';
  fclose(f);
  return buf;
}

START_TEST(test_out_commit_and_abort) {
  put("t.html", "old");
  cli_out o;
  ck_assert_int_eq(cli_out_open("t", &o, "t.html"), 0);
  ck_assert_int_eq(hidden_files(), 1); /* the temporary file */
  fputs("new page", o.f);
  ck_assert_str_eq(get("t.html"), "old"); /* not replaced before commit */
  ck_assert_int_eq(cli_out_commit("t", &o), 0);
  ck_assert_str_eq(get("t.html"), "new page");
  ck_assert_int_eq(hidden_files(), 0);

  ck_assert_int_eq(cli_out_open("t", &o, "t.html"), 0);
  fputs("half", o.f);
  cli_out_abort(&o);
  ck_assert_str_eq(get("t.html"), "new page");
  ck_assert_int_eq(hidden_files(), 0);

  /* a new file gets 0666 & ~umask */
  mode_t old = umask(027);
  ck_assert_int_eq(cli_out_open("t", &o, "n.html"), 0);
  ck_assert_int_eq(cli_out_commit("t", &o), 0);
  umask(old);
  struct stat st;
  ck_assert_int_eq(stat("n.html", &st), 0);
  ck_assert_int_eq(st.st_mode & 0777, 0640);
}
END_TEST

START_TEST(test_out_symlink_and_devices) {
  put("real.html", "old");
  ck_assert_int_eq(symlink("real.html", "link.html"), 0);
  cli_out o;
  ck_assert_int_eq(cli_out_open("t", &o, "link.html"), 0);
  fputs("through the link", o.f);
  ck_assert_int_eq(cli_out_commit("t", &o), 0);
  struct stat st;
  ck_assert_int_eq(lstat("link.html", &st), 0);
  ck_assert(S_ISLNK(st.st_mode)); /* the link is kept */
  ck_assert_str_eq(get("real.html"), "through the link");

  /* /dev/null is written in place, never renamed over */
  ck_assert_int_eq(cli_out_open("t", &o, "/dev/null"), 0);
  ck_assert_ptr_null(o.tmp);
  fputs("gone", o.f);
  ck_assert_int_eq(cli_out_commit("t", &o), 0);
  ck_assert_int_eq(stat("/dev/null", &st), 0);
  ck_assert(S_ISCHR(st.st_mode));

  /* /dev/full: the errno survives stdio */
  ck_assert_int_eq(cli_out_open("t", &o, "/dev/full"), 0);
  for (int i = 0; i < 2000; i++) fputs("0123456789", o.f);
  ck_assert_int_eq(cli_out_commit("t", &o), CLI_EXIT_INTERNAL);

  /* a directory and a missing directory */
  ck_assert_int_eq(mkdir("d", 0755), 0);
  ck_assert_int_eq(cli_out_open("t", &o, "d"), CLI_EXIT_INTERNAL);
  ck_assert_int_eq(cli_out_open("t", &o, "nodir/x.html"), CLI_EXIT_INTERNAL);
  ck_assert_int_eq(hidden_files(), 0);
}
END_TEST

/* A symlink to nothing, or a loop, is refused (exit 4): the link stays a
 * link and no file appears where it points (renaming over it replaced
 * the link by a regular file). */
START_TEST(test_out_dangling_symlink) {
  ck_assert_int_eq(symlink("nowhere/x.html", "dangle.html"), 0);
  ck_assert_int_eq(symlink("gone.html", "dangle2.html"), 0);
  ck_assert_int_eq(symlink("loop1", "loop2"), 0);
  ck_assert_int_eq(symlink("loop2", "loop1"), 0);
  const char *links[] = {"dangle.html", "dangle2.html", "loop1"};
  for (int i = 0; i < 3; i++) {
    cli_out o;
    ck_assert_int_eq(cli_out_open("t", &o, links[i]), CLI_EXIT_INTERNAL);
    struct stat st;
    ck_assert_int_eq(lstat(links[i], &st), 0);
    ck_assert(S_ISLNK(st.st_mode));
    json_t *j = json_object();
    ck_assert_int_eq(cli_write_json("t", links[i], j), CLI_EXIT_INTERNAL);
    json_decref(j);
    ck_assert_int_eq(lstat(links[i], &st), 0);
    ck_assert(S_ISLNK(st.st_mode));
    /* said before a long command runs (bisect -o), by the same test */
    ck_assert_int_eq(cli_out_check("t", links[i]), CLI_EXIT_INTERNAL);
  }
  struct stat st;
  ck_assert_int_ne(lstat("gone.html", &st), 0);
  /* nothing there, a file, a link to a file: fine, nothing opened */
  put("real.html", "x");
  ck_assert_int_eq(symlink("real.html", "good.html"), 0);
  ck_assert_int_eq(cli_out_check("t", "new.html"), 0);
  ck_assert_int_eq(cli_out_check("t", "real.html"), 0);
  ck_assert_int_eq(cli_out_check("t", "good.html"), 0);
  ck_assert_int_ne(lstat("new.html", &st), 0);
  ck_assert_int_eq(hidden_files(), 0);
}
END_TEST

/* An output that must be new: anything at the name (a file, a symlink,
 * one to nothing) is refused at open; one that appears before commit is
 * kept and the result is not written over it. */
START_TEST(test_out_new) {
  put("old.json", "old");
  ck_assert_int_eq(symlink("nowhere", "dangle.json"), 0);
  cli_out o;
  ck_assert_int_eq(cli_out_open_new("t", &o, "old.json"), CLI_EXIT_INTERNAL);
  ck_assert_int_eq(cli_out_open_new("t", &o, "dangle.json"), CLI_EXIT_INTERNAL);
  ck_assert_str_eq(get("old.json"), "old");
  ck_assert_int_eq(cli_out_open_new("t", &o, "n.json"), 0);
  fputs("mine", o.f);
  put("n.json", "theirs"); /* appeared meanwhile */
  ck_assert_int_eq(cli_out_commit("t", &o), CLI_EXIT_INTERNAL);
  ck_assert_str_eq(get("n.json"), "theirs");
  ck_assert_int_eq(hidden_files(), 0);
  mode_t old = umask(027);
  json_t *j = json_pack("{s:i}", "a", 1);
  ck_assert_int_eq(cli_write_json_new("t", "m.json", j), 0);
  json_decref(j);
  umask(old);
  struct stat st;
  ck_assert_int_eq(stat("m.json", &st), 0);
  ck_assert_int_eq(st.st_mode & 0777, 0640); /* as every output: 0666 & ~umask */
  ck_assert_int_eq(hidden_files(), 0);
}
END_TEST

/* A FIFO whose reader has gone: EPIPE, exit 4 with a message, not a death
 * by SIGPIPE (exit 141). */
START_TEST(test_out_fifo_reader_gone) {
  ck_assert_int_eq(mkfifo("p", 0600), 0);
  pid_t reader = fork();
  ck_assert_int_ge(reader, 0);
  if (reader == 0) { /* opens, then leaves before anything is written */
    int fd = open("p", O_RDONLY);
    _exit(fd < 0 ? 1 : 0);
  }
  pid_t pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) {
    cli_out o;
    if (cli_out_open("t", &o, "p")) _exit(10);
    usleep(300000); /* the reader is gone by now */
    for (int i = 0; i < 10000; i++) fputs("0123456789", o.f);
    int rc = cli_out_commit("t", &o);
    _exit(rc == CLI_EXIT_INTERNAL ? 0 : 11);
  }
  int status;
  waitpid(pid, &status, 0);
  waitpid(reader, NULL, 0);
  ck_assert_msg(WIFEXITED(status), "killed by signal %d",
                WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  ck_assert_int_eq(WEXITSTATUS(status), 0);
}
END_TEST

/* Standard output whose reader has gone (`ampprobe postmortem t.h5 | head
 * -3`): exit 4, not a death by SIGPIPE, and no message on stderr - the
 * reader wanted no more. */
START_TEST(test_stdout_reader_gone) {
  int out[2], err[2];
  ck_assert_int_eq(pipe(out), 0);
  ck_assert_int_eq(pipe(err), 0);
  close(out[0]); /* the reader left before anything was written */
  pid_t pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) {
    dup2(out[1], STDOUT_FILENO);
    dup2(err[1], STDERR_FILENO);
    close(err[0]);
    cli_stdout_init();
    for (int i = 0; i < 10000; i++) fputs("0123456789", stdout);
    _exit(cli_stdout_check("t") == CLI_EXIT_INTERNAL ? 0 : 11);
  }
  close(out[1]);
  close(err[1]);
  char buf[256];
  ssize_t n = read(err[0], buf, sizeof buf - 1);
  close(err[0]);
  int status;
  waitpid(pid, &status, 0);
  ck_assert_msg(WIFEXITED(status), "killed by signal %d",
                WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  ck_assert_int_eq(WEXITSTATUS(status), 0);
  buf[n > 0 ? n : 0] = '\0';
  ck_assert_msg(n == 0, "stderr: %s", buf);
}
END_TEST

/* The file-size limit: EFBIG, the temporary file removed, the old kept. */
START_TEST(test_out_file_size_limit) {
  put("big.html", "old");
  pid_t pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) {
    signal(SIGXFSZ, SIG_IGN);
    struct rlimit rl = {1024, 1024};
    setrlimit(RLIMIT_FSIZE, &rl);
    cli_out o;
    if (cli_out_open("t", &o, "big.html")) _exit(10);
    for (int i = 0; i < 1000; i++) fputs("0123456789", o.f);
    int rc = cli_out_commit("t", &o);
    _exit(rc == CLI_EXIT_INTERNAL && o.err == EFBIG ? 0 : 11);
  }
  int status;
  waitpid(pid, &status, 0);
  ck_assert(WIFEXITED(status));
  ck_assert_int_eq(WEXITSTATUS(status), 0);
  ck_assert_str_eq(get("big.html"), "old");
  ck_assert_int_eq(hidden_files(), 0);
}
END_TEST

/* SIGTERM while the temporary file is open: it is removed, the process
 * still dies of the signal. */
START_TEST(test_out_signal_removes_temp) {
  for (int sig = SIGINT; sig <= SIGTERM; sig += SIGTERM - SIGINT) {
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
      /* as in a tool: default dispositions (Check's runner installs
       * handlers of its own that its children inherit) */
      signal(SIGINT, SIG_DFL);
      signal(SIGTERM, SIG_DFL);
      cli_out o;
      if (cli_out_open("t", &o, "sig.html")) _exit(10);
      fputs("partial", o.f);
      fflush(o.f);
      raise(sig);
      _exit(12);
    }
    int status;
    waitpid(pid, &status, 0);
    ck_assert(WIFSIGNALED(status));
    ck_assert_int_eq(WTERMSIG(status), sig);
    ck_assert_int_eq(hidden_files(), 0);
    ck_assert_int_ne(access("sig.html", F_OK), 0);
  }
}
END_TEST

START_TEST(test_same_file) {
  put("a.h5", "a");
  put("b.h5", "b");
  ck_assert_int_eq(link("a.h5", "hard.h5"), 0);
  ck_assert_int_eq(symlink("a.h5", "sym.h5"), 0);
  ck_assert_int_eq(mkdir("sub", 0755), 0);
  ck_assert(cli_same_file("a.h5", "a.h5"));
  ck_assert(cli_same_file("a.h5", "./a.h5"));
  ck_assert(cli_same_file("a.h5", "sub/../a.h5"));
  ck_assert(cli_same_file("a.h5", "hard.h5"));
  ck_assert(cli_same_file("sym.h5", "a.h5"));
  ck_assert(!cli_same_file("a.h5", "b.h5"));
  /* names not created yet: the real directory and the name */
  ck_assert(cli_same_file("new.h5", "sub/../new.h5"));
  ck_assert(!cli_same_file("new.h5", "sub/new.h5"));
  const char *in[3] = {"a.h5", NULL, "b.h5"};
  ck_assert_int_eq(cli_check_output("t", "hard.h5", in, 3), CLI_EXIT_USAGE);
  ck_assert_int_eq(cli_check_output("t", "./b.h5", in, 3), CLI_EXIT_USAGE);
  ck_assert_int_eq(cli_check_output("t", "c.h5", in, 3), 0);
  ck_assert_int_eq(cli_check_output("t", NULL, in, 3), 0);
}
END_TEST

START_TEST(test_check_input) {
  put("a.h5", "a");
  ck_assert_int_eq(mkfifo("p", 0600), 0);
  ck_assert_int_eq(mkdir("d", 0755), 0);
  ck_assert_int_eq(cli_check_input("t", "a.h5"), 0);
  ck_assert_int_eq(cli_check_input("t", "missing.h5"), 0); /* the reader says */
  ck_assert_int_eq(cli_check_input("t", "p"), CLI_EXIT_INPUT); /* no block */
  ck_assert_int_eq(cli_check_input("t", "d"), CLI_EXIT_INPUT);
  ck_assert_int_eq(cli_check_input("t", "/dev/zero"), CLI_EXIT_INPUT);
  ck_assert_int_eq(symlink("p", "lp"), 0);
  ck_assert_int_eq(cli_check_input("t", "lp"), CLI_EXIT_INPUT);
}
END_TEST

START_TEST(test_numbers) {
  int64_t i;
  double d;
  static const char *const bad_int[] = {" 5", "5 ", "+", "-", "", "0x10",
                                        "1e3", "5.0", "٣", "1_000"};
  for (size_t k = 0; k < sizeof bad_int / sizeof *bad_int; k++)
    ck_assert_int_eq(cli_parse_i64("t", "--n", bad_int[k], 0, 100, &i), -1);
  ck_assert_int_eq(cli_parse_i64("t", "--n", "+7", 0, 100, &i), 0);
  ck_assert_int_eq(i, 7);
  ck_assert_int_eq(cli_parse_i64("t", "--n", "-0", 0, 100, &i), 0);
  ck_assert_int_eq(cli_parse_i64("t", "--n", "101", 0, 100, &i), -1);
  ck_assert_int_eq(cli_parse_i64("t", "--n", "9223372036854775808", 0,
                                 INT64_MAX, &i), -1);
  ck_assert_int_eq(cli_parse_i64("t", "--n", "9223372036854775807", 0,
                                 INT64_MAX, &i), 0);
  static const char *const bad_real[] = {" 0.1", "0.1 ", "0x1p3", "inf",
                                         "nan", "-inf", "1e", ".", ".e1",
                                         "1.2.3", "1,5", "e5", "1e+"};
  for (size_t k = 0; k < sizeof bad_real / sizeof *bad_real; k++)
    ck_assert_int_eq(cli_parse_double("t", "--x", bad_real[k], 0, 10, &d), -1);
  static const char *const good_real[] = {"1", "1.", ".5", "-0", "+2.5e-1",
                                          "1E1", "3e-320"};
  for (size_t k = 0; k < sizeof good_real / sizeof *good_real; k++)
    ck_assert_int_eq(cli_parse_double("t", "--x", good_real[k], -1, 10, &d), 0);
  ck_assert_int_eq(cli_parse_double("t", "--x", "1e400", 0, 10, &d), -1);
  /* (0, 1]: 1e-300 and the smallest subnormal are in, 0 and 1e-400 out */
  ck_assert_int_eq(cli_parse_double_gt("t", "--t", "1e-300", 0, 1, &d), 0);
  ck_assert_int_eq(cli_parse_double_gt("t", "--t", "4.9e-324", 0, 1, &d), 0);
  ck_assert_int_eq(cli_parse_double_gt("t", "--t", "1", 0, 1, &d), 0);
  ck_assert_int_eq(cli_parse_double_gt("t", "--t", "0", 0, 1, &d), -1);
  ck_assert_int_eq(cli_parse_double_gt("t", "--t", "1e-400", 0, 1, &d), -1);
  ck_assert_int_eq(cli_parse_double_gt("t", "--t", "1.0000001", 0, 1, &d), -1);
}
END_TEST

/* A file of n bytes of 'x' with the HDF5 signature at offset at (-1:
 * none). */
static void put_sig(const char *path, size_t n, long at) {
  char *b = malloc(n);
  ck_assert_ptr_nonnull(b);
  memset(b, 'x', n);
  if (at >= 0) memcpy(b + at, "\x89HDF\r\n\x1a\n", 8);
  FILE *f = fopen(path, "wb");
  ck_assert_ptr_nonnull(f);
  ck_assert_uint_eq(fwrite(b, 1, n, f), n);
  fclose(f);
  free(b);
}

static int starts_ours(const char *head, size_t n) {
  return n >= 4 && !memcmp(head, "OURS", 4);
}

/* What report -o / diff -o may replace (cli_check_replace): nothing
 * there, an empty file, its own output; not an HDF5 file wherever its
 * superblock may start, nor another file, unless force. */
START_TEST(test_check_replace) {
  ck_assert_int_eq(cli_check_replace("t", "none.html", 0, starts_ours, "ours"), 0);
  put("empty.html", "");
  ck_assert_int_eq(cli_check_replace("t", "empty.html", 0, starts_ours, "ours"), 0);
  put("own.html", "OURS and more");
  ck_assert_int_eq(cli_check_replace("t", "own.html", 0, starts_ours, "ours"), 0);
  put("other.txt", "notes");
  ck_assert_int_eq(cli_check_replace("t", "other.txt", 0, starts_ours, "ours"),
                   CLI_EXIT_USAGE);
  ck_assert_int_eq(cli_check_replace("t", "other.txt", 1, starts_ours, "ours"), 0);
  /* the signature at 0, and after a user block of 512, 1024, 4096 bytes */
  static const long at[] = {0, 512, 1024, 4096};
  for (size_t i = 0; i < sizeof at / sizeof *at; i++) {
    put_sig("t.h5", 8192, at[i]);
    ck_assert_int_eq(cli_check_replace("t", "t.h5", 0, starts_ours, "ours"),
                     CLI_EXIT_USAGE);
  }
  /* a file that starts as ours but holds a superblock is a trace */
  put_sig("t.h5", 8192, 2048);
  FILE *f = fopen("t.h5", "r+b");
  fputs("OURS", f);
  fclose(f);
  ck_assert_int_eq(cli_check_replace("t", "t.h5", 0, starts_ours, "ours"),
                   CLI_EXIT_USAGE);
  /* the signature elsewhere (offset 100, 1500) is no superblock */
  put_sig("t.h5", 8192, 100);
  f = fopen("t.h5", "r+b");
  fputs("OURS", f);
  fclose(f);
  ck_assert_int_eq(cli_check_replace("t", "t.h5", 0, starts_ours, "ours"), 0);
  /* not a regular file: written in place, not read */
  ck_assert_int_eq(cli_check_replace("t", "/dev/null", 0, starts_ours, "ours"), 0);
  /* through a symlink: what it names */
  put_sig("t.h5", 600, 512);
  unlink("l.html");
  ck_assert_int_eq(symlink("t.h5", "l.html"), 0);
  ck_assert_int_eq(cli_check_replace("t", "l.html", 0, starts_ours, "ours"),
                   CLI_EXIT_USAGE);
}
END_TEST

/* -o as a name, and -o joining a set argument. */
START_TEST(test_out_names) {
  ck_assert_int_eq(cli_check_out_arg("t", "-o", NULL), 0);
  ck_assert_int_eq(cli_check_out_arg("t", "-o", "r.html"), 0);
  ck_assert_int_eq(cli_check_out_arg("t", "-o", ""), CLI_EXIT_USAGE);
  ck_assert_int_eq(cli_check_out_arg("t", "-o", "r.html/"), CLI_EXIT_USAGE);
  ck_assert_int_eq(cli_check_out_arg("t", "-o", "/"), CLI_EXIT_USAGE);
  mkdir("set", 0755);
  put("set/t.rank0.h5", "x");
  char *set_dir[] = {"set"}, *glob_all[] = {"set/*.h5"}, *glob_rank[] = {"set/t.rank*.h5"},
       *file[] = {"set/t.rank0.h5"};
  ck_assert_int_eq(cli_check_out_joins_set("t", "set/new.h5", set_dir, 1), CLI_EXIT_USAGE);
  ck_assert_int_eq(cli_check_out_joins_set("t", "./set/../set/new.h5", set_dir, 1),
                   CLI_EXIT_USAGE);
  ck_assert_int_eq(cli_check_out_joins_set("t", "set/new.html", set_dir, 1), 0);
  ck_assert_int_eq(cli_check_out_joins_set("t", "set/.h5", set_dir, 1), 0);
  ck_assert_int_eq(cli_check_out_joins_set("t", "new.h5", set_dir, 1), 0);
  ck_assert_int_eq(cli_check_out_joins_set("t", "set/new.h5", glob_all, 1),
                   CLI_EXIT_USAGE);
  ck_assert_int_eq(cli_check_out_joins_set("t", "set/new.h5", glob_rank, 1), 0);
  ck_assert_int_eq(cli_check_out_joins_set("t", "set/t.rank9.h5", glob_rank, 1),
                   CLI_EXIT_USAGE);
  ck_assert_int_eq(cli_check_out_joins_set("t", "set/new.h5", file, 1), 0);
}
END_TEST

/* What cli_error(sub, "%s", text) prints on stderr (a static buffer). */
static const char *error_line(const char *text) {
  fflush(stderr);
  int saved = dup(STDERR_FILENO);
  int fd = open("stderr.txt", O_WRONLY | O_CREAT | O_TRUNC, 0644);
  ck_assert(saved >= 0 && fd >= 0);
  dup2(fd, STDERR_FILENO);
  close(fd);
  cli_error("t", "%s", text);
  fflush(stderr);
  dup2(saved, STDERR_FILENO);
  close(saved);
  return get("stderr.txt");
}

/* cli_error's own guard for text no caller escaped (a parser's token):
 * C0, C1 and bidi controls never reach the terminal raw. */
START_TEST(test_error_line_controls) {
  ck_assert_str_eq(error_line("a\x1b[2Jb\nc"),
                   "ampprobe: t: a\\e[2Jb c\n");
  ck_assert_str_eq(error_line("x\xc2\x9by"),
                   "ampprobe: t: x\\u009by\n");
  ck_assert_str_eq(error_line("fc1\xe2\x80\xae" "1cf \xe2\x81\xa6i\xe2\x81\xa9 \xe2\x80\x8f\xd8\x9c"),
                   "ampprobe: t: fc1\\u202e1cf \\u2066i\\u2069 \\u200f\\u061c\n");
  ck_assert_str_eq(error_line("caf\xc3\xa9 \xe2\x80\x94 \xe2\x80"), /* kept; a cut tail too */
                   "ampprobe: t: caf\xc3\xa9 \xe2\x80\x94 \xe2\x80\n");
}
END_TEST

START_TEST(test_escape_name) {
  /* the project's one escaping, probe_text_escape (ampprobe/analysis.h) */
  char b[64];
  cli_escape_name(b, sizeof b, "in\x1b[2Jput");
  ck_assert_str_eq(b, "in\\e[2Jput");
  cli_escape_name(b, sizeof b, "fc\nFORGED");
  ck_assert_str_eq(b, "fc\\nFORGED");
  cli_escape_name(b, sizeof b, "bell\x07\r\x7f");
  ck_assert_str_eq(b, "bell\\a\\r\\x7f");
  cli_escape_name(b, sizeof b, "r\xc3\xa9 \xc2\x9b" "x"); /* é kept, CSI C1 not */
  ck_assert_str_eq(b, "r\xc3\xa9 \\u009bx");
  cli_escape_name(b, 5, "\x1b\x1b\x1b");
  ck_assert_str_eq(b, "\\e\\e"); /* truncated, terminated */
  /* bidi controls: a name shown reversed ("enc.fc1" U+202E "1cf.daeh") */
  cli_escape_name(b, sizeof b, "enc.fc1\xe2\x80\xae" "1cf.daeh");
  ck_assert_str_eq(b, "enc.fc1\\u202e1cf.daeh");
  cli_escape_name(b, sizeof b, "\xe2\x81\xa6x\xe2\x81\xa9\xe2\x80\x8e");
  ck_assert_str_eq(b, "\\u2066x\\u2069\\u200e");
  char *c = cli_escape_controls("a\\b\xe2\x80\xab\xd8\x9c"); /* backslash kept */
  ck_assert_str_eq(c, "a\\b\\u202b\\u061c");
  free(c);
  char *mem = NULL;
  size_t n = 0;
  FILE *f = open_memstream(&mem, &n);
  ck_assert_int_eq(cli_print_name(f, "a\nb\x1b"), 6);
  fclose(f);
  ck_assert_str_eq(mem, "a\\nb\\e");
  free(mem);
}
END_TEST

/* A word to paste is whole or not at all: one that does not fit is "" and
 * -1 (it was cut: an unclosed quote, another command when pasted). */
START_TEST(test_paste_word_whole) {
  char w[16];
  ck_assert_int_eq(cli_paste_word(w, sizeof w, "a b\\c"), 0);
  ck_assert_str_eq(w, "'a b\\c'"); /* the backslash kept */
  ck_assert_int_eq(cli_paste_word(w, sizeof w, "out dir/trace.h5"), -1);
  ck_assert_str_eq(w, "");
  ck_assert_int_eq(cli_paste_word(w, 9, "12345678"), 0); /* exactly fits */
  ck_assert_int_eq(cli_paste_word(w, 8, "12345678"), -1);
}
END_TEST

int main(void) {
  Suite *s = suite_create("cli_files");
  TCase *tc = tcase_create("files");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_add_test(tc, test_out_commit_and_abort);
  tcase_add_test(tc, test_out_symlink_and_devices);
  tcase_add_test(tc, test_out_dangling_symlink);
  tcase_add_test(tc, test_out_new);
  tcase_add_test(tc, test_out_fifo_reader_gone);
  tcase_add_test(tc, test_stdout_reader_gone);
  tcase_add_test(tc, test_out_file_size_limit);
  tcase_add_test(tc, test_out_signal_removes_temp);
  tcase_add_test(tc, test_same_file);
  tcase_add_test(tc, test_check_input);
  tcase_add_test(tc, test_numbers);
  tcase_add_test(tc, test_escape_name);
  tcase_add_test(tc, test_error_line_controls);
  tcase_add_test(tc, test_check_replace);
  tcase_add_test(tc, test_out_names);
  tcase_add_test(tc, test_paste_word_whole);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? 1 : 0;
}
