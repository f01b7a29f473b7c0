/*
 * tests/trainer/test_hardening.c - the trainer's defences against inputs the
 * docs allow or that arrive by accident (issues #15.1, #15.6, #17.4-#17.6):
 *
 *  - names: config and layer names restricted to [A-Za-z0-9_.-] (a config
 *    name becomes a file name), control characters refused everywhere, with
 *    one-line messages that do not echo them raw;
 *  - inputs that are not regular files (FIFO, /dev/zero, a directory) are
 *    refused at once, for config files and data.path;
 *  - data.path is relative to the config file's folder;
 *  - every size the config allows either runs or is refused up front with
 *    the memory it would need (no stack array sized by input), and the
 *    report hook shows progress;
 *  - fwd_saved of a normalisation holds the variance as materialised in the
 *    module's precision: inf where it overflowed, 0 where it lost all
 *    precision;
 *  - the CUDA backend of a build without CUDA says "not supported".
 * Every case here failed (crash, hang, wrong file, wrong record) before.
 */
#define _POSIX_C_SOURCE 200809L
#include <check.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ampprobe/probe.h"
#include "ampprobe/trainer.h"

static char tmpdir[256];

static void tmp_path(char *buf, size_t n, const char *name) {
  snprintf(buf, n, "%s/%s", tmpdir, name);
}

static void write_file(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  ck_assert_ptr_nonnull(f);
  fputs(text, f);
  fclose(f);
}

/* A config from JSON text; returns the status, err filled. */
static probe_status parse(const char *json, char *err, size_t n,
                          probe_train_config **out) {
  probe_train_config *c = NULL;
  probe_status st = probe_config_from_json(&c, json, err, n);
  if (out)
    *out = c;
  else
    probe_config_free(c);
  return st;
}

static void assert_one_printable_line(const char *msg) {
  for (const unsigned char *p = (const unsigned char *)msg; *p; p++)
    ck_assert_msg(*p >= 0x20 && *p != 0x7f,
                  "message holds control character 0x%02x: %s", *p, msg);
}

/* ---- names (#17.5) ---------------------------------------------------------- */

#define MODEL "\"model\": [{\"type\": \"linear\", \"out\": 1}]"

static const char *const bad_config_names[] = {
    "x/../../escaped", "../up", "a/b", "..", ".hidden", "-rf",
    "new\nline",       "cr\rx", "esc\x1b[2J", "bell\a", "tab\tx", "sp ace",
    "", "semi;colon", "star*",
};

START_TEST(config_name_rejected) {
  const char *nm = bad_config_names[_i];
  /* JSON-escape the name */
  char esc[128] = "";
  for (const char *p = nm; *p; p++) {
    size_t l = strlen(esc);
    if ((unsigned char)*p < 0x20)
      snprintf(esc + l, sizeof esc - l, "\\u%04x", (unsigned char)*p);
    else
      snprintf(esc + l, sizeof esc - l, "%c", *p);
  }
  char json[512], err[512] = "";
  snprintf(json, sizeof json, "{\"name\": \"%s\", " MODEL "}", esc);
  ck_assert_int_eq(parse(json, err, sizeof err, NULL), PROBE_ERR_CONFIG);
  ck_assert_msg(strncmp(err, "name:", 5) == 0, "%s", err);
  assert_one_printable_line(err);
}
END_TEST

static const char *const good_names[] = {"healthy", "bn-overflow", "A_b-9.c",
                                         "x1", "_private"};

START_TEST(config_name_accepted) {
  char json[512], err[512] = "";
  snprintf(json, sizeof json, "{\"name\": \"%s\", " MODEL "}", good_names[_i]);
  probe_train_config *c = NULL;
  ck_assert_msg(parse(json, err, sizeof err, &c) == PROBE_OK, "%s", err);
  ck_assert_str_eq(probe_config_name(c), good_names[_i]);
  probe_config_free(c);
}
END_TEST

static const char *const bad_layer_names[] = {
    "enc\\u001b[2J", "enc\\nverdict healthy", "a/b", "enc..bn", "enc.",
    ".enc", "-x", "a b", "bel\\u0007",
};

START_TEST(layer_name_rejected) {
  char json[512], err[512] = "";
  snprintf(json, sizeof json,
           "{\"model\": [{\"type\": \"linear\", \"out\": 1, \"name\": \"%s\"}]}",
           bad_layer_names[_i]);
  ck_assert_int_eq(parse(json, err, sizeof err, NULL), PROBE_ERR_CONFIG);
  ck_assert_msg(strncmp(err, "model[0].name:", 14) == 0, "%s", err);
  assert_one_printable_line(err);
}
END_TEST

START_TEST(layer_names_hierarchy_and_reserved) {
  char err[512] = "";
  probe_train_config *c = NULL;
  ck_assert_msg(parse("{\"model\": [{\"type\": \"linear\", \"out\": 4, \"name\": "
                      "\"enc.block-1.fc_a\"}, {\"type\": \"linear\", \"out\": 1,"
                      " \"name\": \"head\"}]}",
                      err, sizeof err, &c) == PROBE_OK,
                "%s", err);
  probe_config_free(c);
  /* "<revin>.denorm" is the denormalisation layer's name */
  ck_assert_int_eq(
      parse("{\"model\": [{\"type\": \"revin\", \"name\": \"rv\"},"
            " {\"type\": \"linear\", \"out\": 8, \"name\": \"rv.denorm\"}],"
            " \"data\": {\"kind\": \"timeseries\"}}",
            err, sizeof err, NULL),
      PROBE_ERR_CONFIG);
  ck_assert_ptr_nonnull(strstr(err, "reserved"));
}
END_TEST

START_TEST(text_fields_without_control_chars) {
  char err[512] = "";
  ck_assert_int_eq(parse("{\"description\": \"two\\nlines\", " MODEL "}", err,
                         sizeof err, NULL),
                   PROBE_ERR_CONFIG);
  ck_assert_ptr_nonnull(strstr(err, "description"));
  assert_one_printable_line(err);
  ck_assert_int_eq(parse("{\"fp32\": [\"bn\\u001b\"], " MODEL "}", err,
                         sizeof err, NULL),
                   PROBE_ERR_CONFIG);
  assert_one_printable_line(err);
  ck_assert_int_eq(parse("{\"data\": {\"kind\": \"csv\", \"path\": "
                         "\"a\\rb.csv\"}, " MODEL "}",
                         err, sizeof err, NULL),
                   PROBE_ERR_CONFIG);
  ck_assert_ptr_nonnull(strstr(err, "data.path"));
  /* overrides go through the same rules */
  probe_train_config *c = NULL;
  ck_assert_int_eq(parse("{" MODEL "}", err, sizeof err, &c), PROBE_OK);
  ck_assert_int_eq(probe_config_set(c, "fp32", "bn,\x1b[2J", err, sizeof err),
                   PROBE_ERR_CONFIG);
  assert_one_printable_line(err);
  /* UTF-8 text is fine in a description */
  probe_config_free(c);
  ck_assert_int_eq(parse("{\"description\": \"\xc3\xa9t\xc3\xa9\", " MODEL "}",
                         err, sizeof err, NULL),
                   PROBE_OK);
}
END_TEST

/* ---- inputs that are not regular files (#17.6) --------------------------- */

/* A FIFO, /dev/zero, a directory: the config loader refuses each at once.
 * A hang (the old behaviour on a FIFO) is caught by the tcase timeout, not
 * by a wall-clock assertion that a loaded machine could break. */
START_TEST(config_file_not_regular) {
  char fifo[300], err[512] = "";
  tmp_path(fifo, sizeof fifo, "cfg.fifo");
  unlink(fifo);
  ck_assert_int_eq(mkfifo(fifo, 0600), 0);
  const char *paths[3] = {fifo, "/dev/zero", tmpdir};
  const char *kinds[3] = {"a FIFO", "a character device", "a directory"};
  for (int i = 0; i < 3; i++) {
    probe_train_config *c = NULL;
    ck_assert_int_eq(probe_config_load_file(&c, paths[i], err, sizeof err),
                     PROBE_ERR_IO);
    ck_assert_msg(strstr(err, kinds[i]) != NULL, "%s", err);
    ck_assert_ptr_null(c);
  }
  unlink(fifo);
}
END_TEST

/* The size limit is exactly 16 MiB (PT_CONFIG_MAX_BYTES): a config of that
 * size loads, one byte more is refused (it was refused 2 bytes early). */
START_TEST(config_size_limit_exact) {
  char path[300], err[512] = "";
  tmp_path(path, sizeof path, "big.json");
  static const char head[] = "{\"steps\": 2, " MODEL "}";
  for (int extra = 0; extra < 2; extra++) {
    size_t size = ((size_t)16 << 20) + (size_t)extra; /* docs/config.md */
    char *buf = malloc(size);
    ck_assert_ptr_nonnull(buf);
    memset(buf, ' ', size);
    memcpy(buf, head, strlen(head));
    FILE *f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    ck_assert_uint_eq(fwrite(buf, 1, size, f), size);
    fclose(f);
    free(buf);
    probe_train_config *c = NULL;
    probe_status st = probe_config_load_file(&c, path, err, sizeof err);
    if (extra == 0) {
      ck_assert_msg(st == PROBE_OK, "%zu bytes: %s", size, err);
      probe_config_free(c);
    } else {
      ck_assert_int_eq(st, PROBE_ERR_CONFIG);
      ck_assert_ptr_nonnull(strstr(err, "larger than 16 MiB"));
    }
  }
  unlink(path);
}
END_TEST

/* data.path naming a FIFO or a device, for csv and hdf5 data. */
START_TEST(data_path_not_regular) {
  char fifo[300], json[900], err[512] = "";
  tmp_path(fifo, sizeof fifo, "data.fifo");
  unlink(fifo);
  ck_assert_int_eq(mkfifo(fifo, 0600), 0);
  const char *kinds[2] = {"csv", "hdf5"};
  const char *paths[2] = {fifo, "/dev/zero"};
  for (int k = 0; k < 2; k++)
    for (int p = 0; p < 2; p++) {
      snprintf(json, sizeof json,
               "{\"steps\": 2, " MODEL ", \"data\": {\"kind\": \"%s\", "
               "\"path\": \"%s\"}}",
               kinds[k], paths[p]);
      probe_train_config *c = NULL;
      ck_assert_int_eq(parse(json, err, sizeof err, &c), PROBE_OK);
      probe_train_result r;
      ck_assert_int_eq(probe_train(c, NULL, &r, err, sizeof err), PROBE_ERR_IO);
      ck_assert_msg(strstr(err, "only regular files") != NULL, "%s", err);
      ck_assert_ptr_nonnull(strstr(err, "data.path"));
      probe_config_free(c);
    }
  unlink(fifo);
}
END_TEST

/* ---- data.path relative to the config's folder (#15.6) ------------------- */

START_TEST(data_path_relative_to_config) {
  char sub[300], cfg[340], csv[340], csv2[340], err[512] = "";
  tmp_path(sub, sizeof sub, "cfgdir");
  mkdir(sub, 0700);
  snprintf(csv, sizeof csv, "%s/train.csv", sub);
  snprintf(csv2, sizeof csv2, "%s/up.csv", tmpdir);
  write_file(csv, "a,b,y\n1,2,3\n4,5,9\n7,8,15\n");
  write_file(csv2, "1,2,3,4\n5,6,7,8\n");
  const char *rel[2] = {"train.csv", "../up.csv"};
  const int64_t in_dim[2] = {2, 3};
  char cwd[512];
  ck_assert_ptr_nonnull(getcwd(cwd, sizeof cwd));
  ck_assert_int_eq(chdir("/"), 0); /* a working directory with neither file */
  for (int i = 0; i < 2; i++) {
    snprintf(cfg, sizeof cfg, "%s/c%d.json", sub, i);
    char json[600];
    snprintf(json, sizeof json,
             "{\"name\": \"rel\", \"steps\": 2, \"model\": [{\"type\": "
             "\"linear\", \"out\": 1}], \"data\": {\"kind\": \"csv\", "
             "\"batch\": 2, \"path\": \"%s\"}}",
             rel[i]);
    write_file(cfg, json);
    probe_train_config *c = NULL;
    ck_assert_msg(probe_config_load_file(&c, cfg, err, sizeof err) == PROBE_OK,
                  "%s", err);
    probe_train_result r;
    ck_assert_msg(probe_train(c, NULL, &r, err, sizeof err) == PROBE_OK, "%s",
                  err);
    ck_assert_int_eq(r.steps_run, 2);
    /* the stored config names the file absolutely */
    char *js = probe_config_to_json(c);
    ck_assert_ptr_nonnull(strstr(js, i ? "cfgdir/../up.csv" : "cfgdir/train.csv"));
    ck_assert_ptr_nonnull(strstr(js, "\"path\": \"/"));
    free(js);
    probe_layer_desc L[8];
    size_t n;
    ck_assert_int_eq(probe_config_layers(c, L, 8, &n), PROBE_OK);
    probe_config_free(c);
    (void)in_dim;
  }
  /* an absolute path is kept as it is */
  snprintf(cfg, sizeof cfg, "%s/abs.json", sub);
  char json[700];
  snprintf(json, sizeof json,
           "{\"model\": [{\"type\": \"linear\", \"out\": 1}], \"data\": "
           "{\"kind\": \"csv\", \"path\": \"%s\"}}",
           csv2);
  write_file(cfg, json);
  probe_train_config *c = NULL;
  ck_assert_int_eq(probe_config_load_file(&c, cfg, err, sizeof err), PROBE_OK);
  char *js = probe_config_to_json(c);
  ck_assert_ptr_nonnull(strstr(js, csv2));
  free(js);
  probe_config_free(c);
  ck_assert_int_eq(chdir(cwd), 0);
}
END_TEST

/* ---- sizes: run, or refuse up front with the need (#17.4) ---------------- */

/* Configs at documented maxima that must run (two steps). Before: a VLA
 * double z[F] overflowed the stack (features 2^20), float tmp[T+H] too. */
static const char *const big_ok[] = {
    "{\"steps\": 2, \"model\": [{\"type\": \"linear\", \"out\": 1}],"
    " \"data\": {\"kind\": \"regression\", \"batch\": 2, \"features\": 1048576}}",
    "{\"steps\": 2, \"model\": [{\"type\": \"linear\", \"out\": 1}],"
    " \"data\": {\"kind\": \"regression\", \"batch\": 4, \"features\": 600000,"
    " \"outputs\": 1}}",
    "{\"steps\": 2, \"model\": [{\"type\": \"revin\"},"
    " {\"type\": \"relu\"}], \"data\": {\"kind\": "
    "\"timeseries\", \"batch\": 2, \"window\": 65536, \"horizon\": 65536}}",
};

START_TEST(big_configs_run) {
  char err[512] = "";
  probe_train_config *c = NULL;
  ck_assert_msg(parse(big_ok[_i], err, sizeof err, &c) == PROBE_OK, "%s", err);
  probe_train_result r;
  ck_assert_msg(probe_train(c, NULL, &r, err, sizeof err) == PROBE_OK, "%s",
                err);
  ck_assert_int_eq(r.steps_run, 2);
  probe_config_free(c);
}
END_TEST

/* Configs the parser accepts that no machine here can hold: refused before
 * allocating, fast, with the need in the message. */
static const char *const big_refused[] = {
    /* 2^20 x 2^20 linear: 4 TiB of weights */
    "{\"model\": [{\"type\": \"linear\", \"out\": 1048576}],"
    " \"data\": {\"kind\": \"regression\", \"features\": 1048576}}",
    /* batch 2^20 x width 2^20 activations */
    "{\"model\": [{\"type\": \"relu\"}, {\"type\": \"linear\", \"out\": 1}],"
    " \"data\": {\"kind\": \"regression\", \"batch\": 1048576,"
    " \"features\": 1048576}}",
    /* attention scores B*T*T = 2^20 * 2^16 * 2^16 */
    "{\"model\": [{\"type\": \"linear\", \"out\": 65536},"
    " {\"type\": \"attention\", \"seq\": 65536}, {\"type\": \"linear\", "
    "\"out\": 1}], \"data\": {\"kind\": \"regression\", \"batch\": 1048576}}",
    /* cluster centres: 65536 classes x 2^20 features = 256 GiB, before the
     * data source allocates them */
    "{\"loss\": \"cross_entropy\", \"model\": [{\"type\": \"linear\", \"out\":"
    " 65536}, {\"type\": \"softmax\"}], \"data\": {\"kind\": \"clusters\","
    " \"classes\": 65536, \"features\": 1048576}}",
    /* micro-batches multiply the workspaces */
    "{\"micro_batches\": 1024, \"model\": [{\"type\": \"linear\", \"out\":"
    " 65536}, {\"type\": \"linear\", \"out\": 1}], \"data\": {\"kind\": "
    "\"regression\", \"batch\": 1048576, \"features\": 16}}",
};

START_TEST(big_configs_refused_up_front) {
  char err[512] = "";
  probe_train_config *c = NULL;
  ck_assert_msg(parse(big_refused[_i], err, sizeof err, &c) == PROBE_OK, "%s",
                err);
  probe_train_result r;
  probe_train_opts o;
  probe_train_opts_init(&o);
  o.max_memory = 64ull << 30; /* a 64 GiB budget, whatever this machine has */
  ck_assert_int_eq(probe_train(c, &o, &r, err, sizeof err), PROBE_ERR_NOMEM);
  ck_assert_msg(strstr(err, "needs") && strstr(err, "iB") &&
                    strstr(err, "64.00 GiB"),
                "%s", err);
  ck_assert_ptr_null(strchr(err, '\n'));
  ck_assert_int_eq(r.steps_run, 0);
  /* the default limit (a fraction of this machine's memory) refuses too;
   * case 3 (256 GiB) could fit a very large machine */
  if (_i != 3) {
    ck_assert_int_eq(probe_train(c, NULL, &r, err, sizeof err),
                     PROBE_ERR_NOMEM);
    ck_assert_ptr_nonnull(strstr(err, "needs"));
  }
  probe_config_free(c);
}
END_TEST

START_TEST(max_memory_limit_applies) {
  char err[512] = "";
  probe_train_config *c = NULL;
  ck_assert_int_eq(parse("{\"steps\": 3, \"model\": [{\"type\": \"linear\", "
                         "\"out\": 256}, {\"type\": \"linear\", \"out\": 1}],"
                         " \"data\": {\"batch\": 64, \"features\": 256}}",
                         err, sizeof err, &c),
                   PROBE_OK);
  probe_train_opts o;
  probe_train_opts_init(&o);
  probe_train_result r;
  o.max_memory = 64 << 10; /* 64 KiB: far too little */
  ck_assert_int_eq(probe_train(c, &o, &r, err, sizeof err), PROBE_ERR_NOMEM);
  ck_assert_ptr_nonnull(strstr(err, "64.00 KiB (max_memory)"));
  o.max_memory = 64 << 20; /* 64 MiB: enough */
  ck_assert_msg(probe_train(c, &o, &r, err, sizeof err) == PROBE_OK, "%s", err);
  ck_assert_int_eq(r.steps_run, 3);
  probe_config_free(c);
}
END_TEST

/* ---- progress (#17.4) ----------------------------------------------------- */

typedef struct seen {
  int setup, steps, done;
  int64_t last_step;
  uint64_t host_bytes;
  int stop_at;   /* STEP count at which to stop; -1 never; 0 at SETUP */
  int order_ok;
} seen;

static int on_report(const probe_train_progress_info *in, void *user) {
  seen *s = user;
  switch (in->phase) {
  case PROBE_TRAIN_PHASE_SETUP:
    s->order_ok &= s->steps == 0 && s->done == 0 && isnan(in->loss);
    s->setup++;
    s->host_bytes = in->host_bytes;
    return s->stop_at == 0;
  case PROBE_TRAIN_PHASE_STEP:
    s->steps++;
    s->order_ok &= s->setup == 1 && in->step == s->last_step + 1 &&
                   in->steps == 6 && isfinite(in->loss) && in->step_s >= 0;
    s->last_step = in->step;
    return s->stop_at > 0 && s->steps == s->stop_at;
  case PROBE_TRAIN_PHASE_DONE:
    s->done++;
    return 0;
  }
  return 0;
}

START_TEST(report_hook) {
  char err[512] = "";
  probe_train_config *c = NULL;
  ck_assert_int_eq(parse("{\"steps\": 6, \"model\": [{\"type\": \"linear\", "
                         "\"out\": 4}, {\"type\": \"relu\"}, {\"type\": "
                         "\"linear\", \"out\": 1}]}",
                         err, sizeof err, &c),
                   PROBE_OK);
  const int stops[3] = {-1, 3, 0};
  const int64_t runs[3] = {6, 3, 0};
  for (int k = 0; k < 3; k++) {
    seen s = {0, 0, 0, 0, 0, stops[k], 1};
    probe_train_opts o;
    probe_train_opts_init(&o);
    o.report = on_report;
    o.user = &s;
    probe_train_result r;
    ck_assert_msg(probe_train(c, &o, &r, err, sizeof err) == PROBE_OK, "%s",
                  err);
    ck_assert_int_eq(s.setup, 1);
    ck_assert_int_eq(s.steps, (int)runs[k]);
    ck_assert_int_eq(s.done, 1);
    ck_assert(s.order_ok);
    ck_assert_uint_gt(s.host_bytes, 0);
    ck_assert_int_eq(r.steps_run, runs[k]);
    ck_assert_int_eq(r.interrupted, stops[k] >= 0);
  }
  probe_config_free(c);
}
END_TEST

/* ---- fwd_saved: the quantity that overflowed or lost precision (#15.1) --- */

/* A normalisation fed values that make its FP16 variance overflow (loop
 * 0-2: layernorm, batchnorm, revin) or round to exactly 0 (3-5). The
 * layer's fwd_saved record must show it: inf count > 0, or zeros; the FP32
 * run's record must not. Before, layernorm stored rstd (0, finite) and
 * revin the stdev: an overflow of the variance read as a finite record. */
static const char *const norm_cfgs[6] = {
    /* layernorm over 64 features of std ~1000: variance 1e6 > 65504 */
    "{\"steps\": 1, \"model\": [{\"type\": \"layernorm\", \"name\": \"ln\"},"
    " {\"type\": \"linear\", \"out\": 1}], \"data\": {\"kind\": "
    "\"regression\", \"batch\": 8, \"features\": 64, \"feature_scale\": 1000}}",
    "{\"steps\": 1, \"model\": [{\"type\": \"bn\", \"name\": \"ln\"},"
    " {\"type\": \"linear\", \"out\": 1}], \"data\": {\"kind\": "
    "\"regression\", \"batch\": 8, \"features\": 64, \"feature_scale\": 1000}}",
    "{\"steps\": 1, \"model\": [{\"type\": \"revin\", \"name\": \"ln\"},"
    " {\"type\": \"linear\", \"out\": 8}], \"data\": {\"kind\": "
    "\"timeseries\", \"batch\": 8, \"window\": 32, \"horizon\": 8, "
    "\"level\": 1000, \"amplitude\": 900}}",
    /* around 4096 with spread 0.3: every FP16 value is 4096 or a neighbour
     * 4 apart... deviations round away: variance 0 in FP16 */
    "{\"steps\": 1, \"model\": [{\"type\": \"layernorm\", \"name\": \"ln\"},"
    " {\"type\": \"linear\", \"out\": 1}], \"data\": {\"kind\": \"timeseries\","
    " \"batch\": 8, \"window\": 32, \"horizon\": 1, \"level\": 4096, "
    "\"level_spread\": 0, \"amplitude\": 0.3, \"noise\": 0.1}}",
    "{\"steps\": 1, \"model\": [{\"type\": \"bn\", \"name\": \"ln\"},"
    " {\"type\": \"linear\", \"out\": 1}], \"data\": {\"kind\": \"timeseries\","
    " \"batch\": 8, \"window\": 32, \"horizon\": 1, \"level\": 4096, "
    "\"level_spread\": 0, \"amplitude\": 0.3, \"noise\": 0.1}}",
    "{\"steps\": 1, \"model\": [{\"type\": \"revin\", \"name\": \"ln\"},"
    " {\"type\": \"linear\", \"out\": 1}], \"data\": {\"kind\": \"timeseries\","
    " \"batch\": 8, \"window\": 32, \"horizon\": 1, \"level\": 4096, "
    "\"level_spread\": 0, \"amplitude\": 0.3, \"noise\": 0.1}}",
};

/* The fwd_saved record of layer "ln" in step 0 of a FULL trace. */
static probe_stats saved_stats(const char *json, const char *prec) {
  char err[512] = "", path[300];
  tmp_path(path, sizeof path, "saved.h5");
  unlink(path);
  probe_train_config *c = NULL;
  ck_assert_msg(parse(json, err, sizeof err, &c) == PROBE_OK, "%s", err);
  ck_assert_int_eq(probe_config_set(c, "precision", prec, err, sizeof err),
                   PROBE_OK);
  probe_train_opts o;
  probe_train_opts_init(&o);
  o.mode = PROBE_MODE_FULL;
  o.trace_path = path;
  probe_train_result r;
  ck_assert_msg(probe_train(c, &o, &r, err, sizeof err) == PROBE_OK, "%s", err);
  probe_config_free(c);
  probe_trace *t;
  ck_assert_int_eq(probe_trace_open(&t, path), PROBE_OK);
  size_t nl;
  const probe_layer_info *L = probe_trace_layers(t, &nl);
  int32_t id = -1;
  for (size_t i = 0; i < nl; i++)
    if (strcmp(L[i].name, "ln") == 0) id = (int32_t)i;
  ck_assert_int_ge(id, 0);
  probe_record rec[64];
  size_t got;
  ck_assert_int_eq(probe_trace_read_records(t, 0, 64, rec, &got), PROBE_OK);
  probe_stats s;
  int found = 0;
  for (size_t i = 0; i < got; i++)
    if (rec[i].step == 0 && rec[i].layer == id &&
        rec[i].site == PROBE_SITE_FWD_SAVED) {
      s = rec[i].stats;
      found = 1;
    }
  ck_assert_msg(found, "no fwd_saved record");
  probe_trace_close(t);
  unlink(path);
  return s;
}

START_TEST(fwd_saved_holds_the_variance) {
  probe_stats h = saved_stats(norm_cfgs[_i], "fp16");
  probe_stats f = saved_stats(norm_cfgs[_i], "fp32");
  ck_assert_uint_eq(probe_stats_nonfinite(&f), 0);
  if (_i < 3) { /* overflow: inf in the FP16 variance */
    ck_assert_msg(h.posinf_count > 0, "case %d: no inf in fwd_saved", _i);
  } else { /* precision loss: exact zeros in FP16, none in FP32 */
    ck_assert_uint_eq(probe_stats_nonfinite(&h), 0);
    ck_assert_msg(h.zero_count > 0, "case %d: no zero variance", _i);
    ck_assert_uint_eq(f.zero_count, 0);
  }
}
END_TEST

/* ---- backends ------------------------------------------------------------- */

START_TEST(cuda_backend_not_supported_cleanly) {
  char err[512] = "";
  probe_train_config *c = NULL;
  ck_assert_int_eq(parse("{\"steps\": 2, " MODEL "}", err, sizeof err, &c),
                   PROBE_OK);
  probe_train_opts o;
  probe_train_opts_init(&o);
  o.backend = PROBE_BACKEND_CUDA;
  probe_train_result r;
  probe_status st = probe_train(c, &o, &r, err, sizeof err);
  if (!probe_backend_compiled(PROBE_BACKEND_CUDA)) {
    ck_assert_int_eq(st, PROBE_ERR_UNSUPPORTED);
    ck_assert_str_eq(err, "cuda backend: not supported in this build");
    ck_assert_int_eq(probe_train_backend_available(PROBE_BACKEND_CUDA), 0);
  } else if (st != PROBE_OK) {
    ck_assert_int_eq(st, PROBE_ERR_NO_DEVICE);
  }
  ck_assert_int_eq(probe_train_backend_available(PROBE_BACKEND_CPU), 1);
  o.backend = (probe_backend)7;
  ck_assert_int_eq(probe_train(c, &o, &r, err, sizeof err),
                   PROBE_ERR_INVALID_ARG);
  probe_config_free(c);
}
END_TEST

static Suite *make_hardening_suite(void) {
  Suite *s = suite_create("trainer_hardening");
  TCase *tc = tcase_create("names");
  tcase_add_loop_test(tc, config_name_rejected, 0,
                      sizeof bad_config_names / sizeof *bad_config_names);
  tcase_add_loop_test(tc, config_name_accepted, 0,
                      sizeof good_names / sizeof *good_names);
  tcase_add_loop_test(tc, layer_name_rejected, 0,
                      sizeof bad_layer_names / sizeof *bad_layer_names);
  tcase_add_test(tc, layer_names_hierarchy_and_reserved);
  tcase_add_test(tc, text_fields_without_control_chars);
  suite_add_tcase(s, tc);
  tc = tcase_create("inputs");
  tcase_set_timeout(tc, 60); /* a hang on a FIFO fails here */
  tcase_add_test(tc, config_file_not_regular);
  tcase_add_test(tc, config_size_limit_exact);
  tcase_add_test(tc, data_path_not_regular);
  tcase_add_test(tc, data_path_relative_to_config);
  suite_add_tcase(s, tc);
  tc = tcase_create("sizes");
  tcase_set_timeout(tc, 240);
  tcase_add_loop_test(tc, big_configs_run, 0, sizeof big_ok / sizeof *big_ok);
  tcase_add_loop_test(tc, big_configs_refused_up_front, 0,
                      sizeof big_refused / sizeof *big_refused);
  tcase_add_test(tc, max_memory_limit_applies);
  tcase_add_test(tc, report_hook);
  suite_add_tcase(s, tc);
  tc = tcase_create("records");
  tcase_set_timeout(tc, 120);
  tcase_add_loop_test(tc, fwd_saved_holds_the_variance, 0, 6);
  tcase_add_test(tc, cuda_backend_not_supported_cleanly);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  snprintf(tmpdir, sizeof tmpdir, "/tmp/ampprobe_hardening_XXXXXX");
  if (!mkdtemp(tmpdir)) {
    perror("mkdtemp");
    return 1;
  }
  SRunner *sr = srunner_create(make_hardening_suite());
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
  if (system(cmd) != 0)
    fprintf(stderr, "could not remove %s\n", tmpdir);
  return failed == 0 ? 0 : 1;
}
