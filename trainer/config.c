/*
 * trainer/config.c - the JSON run config (docs/config.md): defaults, strict
 * parsing with messages that name the offending key, validation, overrides
 * by key ("scaler.init" = "1024"), serialisation back to JSON, and the
 * precision policy (which layers run in FP32).
 *
 * Parsing is strict: an unknown key is an error, so a typo does not silently
 * fall back to a default.
 */
#define _POSIX_C_SOURCE 200809L
#define _XOPEN_SOURCE 700 /* realpath */
#include <errno.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "trainer-impl.h"

probe_status pt_fail(char *err, size_t errlen, probe_status st,
                     const char *fmt, ...) {
  if (err && errlen) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
  }
  return st;
}

/* ---- input files: regular files only ------------------------------------------ */

FILE *pt_open_regular(const char *path, const char *what, probe_status *st,
                      char *err, size_t errlen) {
  /* O_NONBLOCK: opening a FIFO for reading would otherwise wait for a
   * writer; the check below then refuses it. */
  int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    *st = pt_fail(err, errlen,
                  errno == ENOENT ? PROBE_ERR_NOT_FOUND : PROBE_ERR_IO,
                  "%s%s%s: %s", what, *what ? " " : "", path, strerror(errno));
    return NULL;
  }
  struct stat sb;
  if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
    const char *kind = S_ISFIFO(sb.st_mode)   ? "a FIFO"
                       : S_ISCHR(sb.st_mode)  ? "a character device"
                       : S_ISBLK(sb.st_mode)  ? "a block device"
                       : S_ISDIR(sb.st_mode)  ? "a directory"
                       : S_ISSOCK(sb.st_mode) ? "a socket"
                                              : "not a regular file";
    close(fd);
    *st = pt_fail(err, errlen, PROBE_ERR_IO,
                  "%s%s%s: %s; only regular files are read", what,
                  *what ? " " : "", path, kind);
    return NULL;
  }
  int fl = fcntl(fd, F_GETFL);
  if (fl >= 0) fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
  FILE *f = fdopen(fd, "rb");
  if (!f) {
    *st = pt_fail(err, errlen, PROBE_ERR_NOMEM, "%s: out of memory", path);
    close(fd);
    return NULL;
  }
  *st = PROBE_OK;
  return f;
}

/* ---- name rules ------------------------------------------------------------- */

/* s with every byte outside printable ASCII written as \xHH, for messages
 * that must not carry control characters to a terminal. */
static const char *escaped(const char *s, char *buf, size_t n) {
  size_t o = 0;
  for (; *s && o + 5 < n; s++) {
    unsigned char ch = (unsigned char)*s;
    if (ch >= 0x20 && ch < 0x7f && ch != '\\')
      buf[o++] = (char)ch;
    else
      o += (size_t)snprintf(buf + o, n - o, "\\x%02x", ch);
  }
  buf[o] = '\0';
  return buf;
}

static int name_char(unsigned char ch) {
  return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
         (ch >= '0' && ch <= '9') || ch == '_' || ch == '-' || ch == '.';
}

/* The rules of docs/config.md, "Names": 1-63 characters from [A-Za-z0-9_.-],
 * starting with a letter, digit or '_' (no leading '-' or '.': a name may
 * become a file name); for layer names ('.' separates the parts of a
 * hierarchical name) also no empty part: no trailing '.', no "..". */
static probe_status check_name(const char *key, const char *name, int layer,
                               char *err, size_t errlen) {
  char e[4 * PROBE_NAME_MAX + 8];
  size_t n = strlen(name);
  if (n == 0)
    return pt_fail(err, errlen, PROBE_ERR_CONFIG, "%s: empty name", key);
  for (size_t i = 0; i < n; i++) {
    unsigned char ch = (unsigned char)name[i];
    if (!name_char(ch)) {
      char shown[8];
      if (ch >= 0x20 && ch < 0x7f)
        snprintf(shown, sizeof shown, "'%c'", ch);
      else
        snprintf(shown, sizeof shown, "\\x%02x", ch);
      return pt_fail(err, errlen, PROBE_ERR_CONFIG,
                     "%s: '%s' has %s at position %zu; names use only "
                     "letters, digits, '_', '-' and '.'", key,
                     escaped(name, e, sizeof e), shown, i + 1);
    }
  }
  if (name[0] == '-' || name[0] == '.')
    return pt_fail(err, errlen, PROBE_ERR_CONFIG,
                   "%s: '%s' starts with '%c'; names start with a letter, "
                   "digit or '_'", key, name, name[0]);
  if (layer && (name[n - 1] == '.' || strstr(name, "..")))
    return pt_fail(err, errlen, PROBE_ERR_CONFIG,
                   "%s: '%s' has an empty part ('.' separates the parts of "
                   "a layer name)", key, name);
  return PROBE_OK;
}

/* Free text (description, paths, globs): no control characters. */
static probe_status check_text(const char *key, const char *text, char *err,
                               size_t errlen) {
  for (const unsigned char *p = (const unsigned char *)text; *p; p++)
    if (*p < 0x20 || *p == 0x7f) {
      char e[1100];
      return pt_fail(err, errlen, PROBE_ERR_CONFIG,
                     "%s: '%s' holds the control character \\x%02x", key,
                     escaped(text, e, sizeof e), *p);
    }
  return PROBE_OK;
}

/* Every name and text field of a config. */
static probe_status check_names(const probe_train_config *c, char *err,
                                size_t errlen) {
  probe_status st = check_name("name", c->name, 0, err, errlen);
  if (st == PROBE_OK) st = check_text("description", c->description, err, errlen);
  for (int i = 0; i < c->n_modules && st == PROBE_OK; i++) {
    char key[32];
    snprintf(key, sizeof key, "model[%d].name", i);
    st = check_name(key, c->modules[i].name, 1, err, errlen);
    const size_t n = strlen(c->modules[i].name);
    for (int k = 0; k < c->n_modules && st == PROBE_OK; k++) {
      /* "<revin>.denorm" is the name of a RevIN's denormalisation layer */
      const char *r = c->modules[k].name;
      if (c->modules[k].type == PT_MOD_REVIN && n == strlen(r) + 7 &&
          strncmp(c->modules[i].name, r, strlen(r)) == 0 &&
          strcmp(c->modules[i].name + strlen(r), ".denorm") == 0)
        st = pt_fail(err, errlen, PROBE_ERR_CONFIG,
                     "%s: '%s' is reserved for the RevIN's denormalisation",
                     key, c->modules[i].name);
    }
  }
  for (int i = 0; i < c->n_fp32 && st == PROBE_OK; i++) {
    char key[32];
    snprintf(key, sizeof key, "fp32[%d]", i);
    st = check_text(key, c->fp32[i], err, errlen);
  }
  if (st == PROBE_OK) st = check_text("data.path", c->data.path, err, errlen);
  if (st == PROBE_OK) st = check_text("data.x", c->data.x_dataset, err, errlen);
  if (st == PROBE_OK) st = check_text("data.y", c->data.y_dataset, err, errlen);
  return st;
}

/* ---- names ----------------------------------------------------------------- */

static const char *const module_names[PT_MOD_COUNT] = {
    "linear", "bn", "layernorm", "revin", "relu", "gelu", "softmax",
    "attention"};

const char *pt_module_type_name(pt_module_type t) {
  return (t >= 0 && t < PT_MOD_COUNT) ? module_names[t] : "?";
}

probe_kind pt_module_kind(pt_module_type t) {
  switch (t) {
  case PT_MOD_LINEAR: return PROBE_KIND_LINEAR;
  case PT_MOD_BN: return PROBE_KIND_BN;
  case PT_MOD_LAYERNORM: return PROBE_KIND_LAYERNORM;
  case PT_MOD_REVIN: return PROBE_KIND_REVIN;
  case PT_MOD_RELU:
  case PT_MOD_GELU: return PROBE_KIND_ACTIVATION;
  case PT_MOD_SOFTMAX: return PROBE_KIND_SOFTMAX;
  case PT_MOD_ATTENTION: return PROBE_KIND_ATTENTION;
  default: return PROBE_KIND_OTHER;
  }
}

static const char *const data_names[] = {"timeseries", "clusters",
                                         "regression", "csv", "hdf5"};
static const char *const loss_names[] = {"mse", "cross_entropy"};
static const char *const opt_names[] = {"sgd", "adam", "adamw"};
static const char *const sched_names[] = {"constant", "cosine", "step"};
static const char *const prec_names[] = {"fp32", "fp16", "bf16"};
static const char *const reduce_names[] = {"fp32", "fp16"}; /* pt_reduce_dtype */

static int lookup(const char *const *names, int n, const char *s) {
  for (int i = 0; i < n; i++)
    if (strcmp(names[i], s) == 0) return i;
  return -1;
}

/* ---- defaults -------------------------------------------------------------- */

void pt_config_defaults(probe_train_config *c) {
  memset(c, 0, sizeof *c);
  snprintf(c->name, sizeof c->name, "config");
  c->seed = 1;
  c->steps = 100;
  c->precision = PROBE_DTYPE_F16;
  c->loss_fp32 = 1;
  c->loss_weight = 1.0;
  c->micro_batches = 1;
  c->loss = PT_LOSS_MSE;
  pt_data_spec *d = &c->data;
  d->kind = PT_DATA_REGRESSION;
  d->batch = 32;
  d->nan_step = -1;
  d->nan_rank = 0;
  d->window = 32;
  d->horizon = 8;
  d->level = 0.0;
  d->level_spread = 1.0;
  d->shift_prob = 0.0;
  d->shift_scale = 0.0;
  d->noise = 0.1;
  d->amplitude = 1.0;
  d->features = 8;
  d->classes = 4;
  d->outputs = 1;
  d->separation = 4.0;
  d->spread = 1.0;
  d->feature_scale = 1.0;
  d->target_scale = 1.0;
  d->targets = 1;
  snprintf(d->x_dataset, sizeof d->x_dataset, "x");
  snprintf(d->y_dataset, sizeof d->y_dataset, "y");
  c->opt.type = PT_OPT_ADAM;
  c->opt.lr = 1e-3;
  c->opt.momentum = 0.9;
  c->opt.beta1 = 0.9;
  c->opt.beta2 = 0.999;
  c->opt.eps = 1e-8;
  c->opt.weight_decay = 0.0;
  c->sched.type = PT_SCHED_CONSTANT;
  c->sched.gamma = 0.1;
  c->scaler.enabled = 1;
  c->scaler.init = 65536.0;
  c->scaler.growth = 2.0;
  c->scaler.backoff = 0.5;
  c->scaler.interval = 2000;
  c->scaler.hysteresis = 1;
  c->scaler.min_scale = 0.0;
}

static void module_defaults(pt_module_spec *m) {
  memset(m, 0, sizeof *m);
  m->bias = 1;
  m->eps = 1e-5;
  m->momentum = 0.1;
  m->affine = 1;
  m->denorm = -1; /* decided by the loss: 1 for mse, 0 otherwise */
  m->init_gain = 1.0;
}

/* ---- strict JSON readers --------------------------------------------------- */

typedef struct jctx {
  char *err;
  size_t errlen;
} jctx;

/* Every key of obj must be in allowed (NULL-terminated). */
static probe_status check_keys(jctx *j, json_t *obj, const char *path,
                               const char *const *allowed) {
  const char *key;
  json_t *val;
  json_object_foreach(obj, key, val) {
    int ok = 0;
    for (const char *const *a = allowed; *a; a++)
      if (strcmp(*a, key) == 0) ok = 1;
    if (!ok)
      return pt_fail(j->err, j->errlen, PROBE_ERR_CONFIG, "%s%s%s: unknown key",
                     path, *path ? "." : "", key);
  }
  return PROBE_OK;
}

static probe_status get_num(jctx *j, json_t *obj, const char *path,
                            const char *key, double *dst, double lo,
                            double hi) {
  json_t *v = json_object_get(obj, key);
  if (!v) return PROBE_OK;
  if (!json_is_number(v))
    return pt_fail(j->err, j->errlen, PROBE_ERR_CONFIG,
                   "%s%s%s: expected a number", path, *path ? "." : "", key);
  double x = json_number_value(v);
  if (!(x >= lo && x <= hi))
    return pt_fail(j->err, j->errlen, PROBE_ERR_CONFIG,
                   "%s%s%s: %g is out of range [%g, %g]", path,
                   *path ? "." : "", key, x, lo, hi);
  *dst = x;
  return PROBE_OK;
}

static probe_status get_int(jctx *j, json_t *obj, const char *path,
                            const char *key, int64_t *dst, int64_t lo,
                            int64_t hi) {
  json_t *v = json_object_get(obj, key);
  if (!v) return PROBE_OK;
  if (!json_is_integer(v))
    return pt_fail(j->err, j->errlen, PROBE_ERR_CONFIG,
                   "%s%s%s: expected an integer", path, *path ? "." : "", key);
  int64_t x = json_integer_value(v);
  if (x < lo || x > hi)
    return pt_fail(j->err, j->errlen, PROBE_ERR_CONFIG,
                   "%s%s%s: %lld is out of range [%lld, %lld]", path,
                   *path ? "." : "", key, (long long)x, (long long)lo,
                   (long long)hi);
  *dst = x;
  return PROBE_OK;
}

static probe_status get_bool(jctx *j, json_t *obj, const char *path,
                             const char *key, int *dst) {
  json_t *v = json_object_get(obj, key);
  if (!v) return PROBE_OK;
  if (!json_is_boolean(v))
    return pt_fail(j->err, j->errlen, PROBE_ERR_CONFIG,
                   "%s%s%s: expected true or false", path, *path ? "." : "",
                   key);
  *dst = json_is_true(v);
  return PROBE_OK;
}

static probe_status get_str(jctx *j, json_t *obj, const char *path,
                            const char *key, char *dst, size_t cap) {
  json_t *v = json_object_get(obj, key);
  if (!v) return PROBE_OK;
  if (!json_is_string(v))
    return pt_fail(j->err, j->errlen, PROBE_ERR_CONFIG,
                   "%s%s%s: expected a string", path, *path ? "." : "", key);
  if (strlen(json_string_value(v)) >= cap)
    return pt_fail(j->err, j->errlen, PROBE_ERR_CONFIG,
                   "%s%s%s: longer than %zu characters", path,
                   *path ? "." : "", key, cap - 1);
  snprintf(dst, cap, "%s", json_string_value(v));
  return PROBE_OK;
}

static probe_status get_enum(jctx *j, json_t *obj, const char *path,
                             const char *key, const char *const *names, int n,
                             int *dst) {
  json_t *v = json_object_get(obj, key);
  if (!v) return PROBE_OK;
  if (json_is_string(v)) {
    int k = lookup(names, n, json_string_value(v));
    if (k >= 0) {
      *dst = k;
      return PROBE_OK;
    }
  }
  char opts[160] = "";
  for (int i = 0; i < n; i++) {
    strncat(opts, names[i], sizeof opts - strlen(opts) - 1);
    if (i + 1 < n) strncat(opts, " | ", sizeof opts - strlen(opts) - 1);
  }
  return pt_fail(j->err, j->errlen, PROBE_ERR_CONFIG, "%s%s%s: expected %s",
                 path, *path ? "." : "", key, opts);
}

#define TRY(x)                                                                 \
  do {                                                                         \
    probe_status st_ = (x);                                                    \
    if (st_ != PROBE_OK) return st_;                                           \
  } while (0)

static probe_status set_fp32_list(probe_train_config *c, const char *list,
                                  char *err, size_t errlen) {
  c->n_fp32 = 0;
  const char *p = list;
  while (*p) {
    while (*p == ',' || *p == ' ') p++;
    if (!*p) break;
    const char *e = p;
    while (*e && *e != ',') e++;
    size_t len = (size_t)(e - p);
    while (len && p[len - 1] == ' ') len--;
    if (len >= PROBE_NAME_MAX)
      return pt_fail(err, errlen, PROBE_ERR_CONFIG,
                     "fp32: entry '%.*s' is too long", (int)len, p);
    if (len == 1 && *p == PROBE_POLICY_LITERAL)
      return pt_fail(err, errlen, PROBE_ERR_CONFIG,
                     "fp32: entry '=' names no layer (=NAME is the layer "
                     "named exactly NAME)");
    if (c->n_fp32 >= PT_MAX_FP32)
      return pt_fail(err, errlen, PROBE_ERR_CONFIG,
                     "fp32: more than %d entries", PT_MAX_FP32);
    memcpy(c->fp32[c->n_fp32], p, len);
    c->fp32[c->n_fp32][len] = '\0';
    c->n_fp32++;
    p = e;
  }
  return PROBE_OK;
}

static probe_status parse_module(jctx *j, json_t *m, int i, pt_module_spec *s) {
  char path[32];
  snprintf(path, sizeof path, "model[%d]", i);
  if (!json_is_object(m))
    return pt_fail(j->err, j->errlen, PROBE_ERR_CONFIG,
                   "%s: expected an object", path);
  static const char *const allowed[] = {"type", "name", "out", "bias", "eps",
                                        "momentum", "affine", "denorm", "seq",
                                        "init_gain", NULL};
  TRY(check_keys(j, m, path, allowed));
  module_defaults(s);
  int t = -1;
  if (!json_object_get(m, "type"))
    return pt_fail(j->err, j->errlen, PROBE_ERR_CONFIG, "%s.type: missing",
                   path);
  TRY(get_enum(j, m, path, "type", module_names, PT_MOD_COUNT, &t));
  s->type = (pt_module_type)t;
  snprintf(s->name, sizeof s->name, "%s%d", module_names[t], i);
  TRY(get_str(j, m, path, "name", s->name, sizeof s->name));
  if (!s->name[0] || strcmp(s->name, "input") == 0 ||
      strcmp(s->name, "loss") == 0)
    return pt_fail(j->err, j->errlen, PROBE_ERR_CONFIG,
                   "%s.name: '%s' is empty or reserved", path, s->name);
  TRY(get_int(j, m, path, "out", &s->out, 1, 1 << 20));
  if (s->type == PT_MOD_LINEAR && !json_object_get(m, "out"))
    return pt_fail(j->err, j->errlen, PROBE_ERR_CONFIG,
                   "%s.out: a linear layer needs its output size", path);
  TRY(get_bool(j, m, path, "bias", &s->bias));
  TRY(get_num(j, m, path, "init_gain", &s->init_gain, 0.0, 1e6));
  TRY(get_num(j, m, path, "eps", &s->eps, 0.0, 1.0));
  TRY(get_num(j, m, path, "momentum", &s->momentum, 0.0, 1.0));
  TRY(get_bool(j, m, path, "affine", &s->affine));
  TRY(get_bool(j, m, path, "denorm", &s->denorm));
  s->seq = 1;
  TRY(get_int(j, m, path, "seq", &s->seq, 1, 1 << 16));
  return PROBE_OK;
}

static probe_status parse_root(jctx *j, json_t *root, probe_train_config *c) {
  if (!json_is_object(root))
    return pt_fail(j->err, j->errlen, PROBE_ERR_CONFIG,
                   "config: expected a JSON object at the top level");
  static const char *const allowed[] = {
      "name",  "description", "seed",  "steps",  "precision", "fp32",
      "loss_fp32", "loss_weight", "micro_batches", "model", "loss", "data",
      "optimizer",
      "schedule", "scaler", "clip", "dist", NULL};
  TRY(check_keys(j, root, "", allowed));
  TRY(get_str(j, root, "", "name", c->name, sizeof c->name));
  TRY(get_str(j, root, "", "description", c->description,
              sizeof c->description));
  int64_t seed = (int64_t)c->seed;
  TRY(get_int(j, root, "", "seed", &seed, 0, INT64_MAX));
  c->seed = (uint64_t)seed;
  TRY(get_int(j, root, "", "steps", &c->steps, 1, 100000000));
  int prec = (int)c->precision;
  TRY(get_enum(j, root, "", "precision", prec_names, 3, &prec));
  c->precision = (probe_dtype)prec;
  json_t *fp = json_object_get(root, "fp32");
  if (fp) {
    if (json_is_string(fp)) {
      TRY(set_fp32_list(c, json_string_value(fp), j->err, j->errlen));
    } else if (json_is_array(fp)) {
      size_t k;
      json_t *e;
      c->n_fp32 = 0;
      json_array_foreach(fp, k, e) {
        if (!json_is_string(e) || !json_string_length(e) ||
            json_string_length(e) >= PROBE_NAME_MAX ||
            !strcmp(json_string_value(e), "="))
          return pt_fail(j->err, j->errlen, PROBE_ERR_CONFIG,
                         "fp32[%zu]: expected a kind, a layer-name glob or "
                         "=NAME (one layer, named exactly)", k);
        if (c->n_fp32 >= PT_MAX_FP32)
          return pt_fail(j->err, j->errlen, PROBE_ERR_CONFIG,
                         "fp32: more than %d entries", PT_MAX_FP32);
        snprintf(c->fp32[c->n_fp32++], PROBE_NAME_MAX, "%s",
                 json_string_value(e));
      }
    } else {
      return pt_fail(j->err, j->errlen, PROBE_ERR_CONFIG,
                     "fp32: expected a list of kinds or layer-name globs");
    }
  }
  TRY(get_bool(j, root, "", "loss_fp32", &c->loss_fp32));
  TRY(get_num(j, root, "", "loss_weight", &c->loss_weight, 1e-30, 1e30));
  TRY(get_int(j, root, "", "micro_batches", &c->micro_batches, 1, 1024));
  int loss = (int)c->loss;
  TRY(get_enum(j, root, "", "loss", loss_names, 2, &loss));
  c->loss = (pt_loss_type)loss;

  json_t *model = json_object_get(root, "model");
  if (!model || !json_is_array(model) || json_array_size(model) == 0)
    return pt_fail(j->err, j->errlen, PROBE_ERR_CONFIG,
                   "model: expected a non-empty list of modules");
  if (json_array_size(model) > PT_MAX_MODULES)
    return pt_fail(j->err, j->errlen, PROBE_ERR_CONFIG,
                   "model: more than %d modules", PT_MAX_MODULES);
  c->n_modules = (int)json_array_size(model);
  for (int i = 0; i < c->n_modules; i++)
    TRY(parse_module(j, json_array_get(model, (size_t)i), i, &c->modules[i]));

  json_t *d = json_object_get(root, "data");
  if (d) {
    if (!json_is_object(d))
      return pt_fail(j->err, j->errlen, PROBE_ERR_CONFIG,
                     "data: expected an object");
    static const char *const dkeys[] = {
        "kind", "batch", "nan_step", "nan_rank", "window", "horizon", "task", "level",
        "level_spread", "shift_prob", "shift_scale", "noise", "amplitude",
        "features", "classes", "outputs", "separation", "spread",
        "feature_scale", "target_scale", "path", "x", "y", "targets", NULL};
    TRY(check_keys(j, d, "data", dkeys));
    pt_data_spec *s = &c->data;
    int kind = (int)s->kind;
    TRY(get_enum(j, d, "data", "kind", data_names, 5, &kind));
    s->kind = (pt_data_kind)kind;
    TRY(get_int(j, d, "data", "batch", &s->batch, 2, 1 << 20));
    TRY(get_int(j, d, "data", "nan_step", &s->nan_step, -1, INT64_MAX));
    TRY(get_int(j, d, "data", "nan_rank", &s->nan_rank, 0, 1 << 20));
    TRY(get_int(j, d, "data", "window", &s->window, 2, 1 << 16));
    TRY(get_int(j, d, "data", "horizon", &s->horizon, 1, 1 << 16));
    static const char *const tasks[] = {"forecast", "classify"};
    TRY(get_enum(j, d, "data", "task", tasks, 2, &s->classify));
    TRY(get_num(j, d, "data", "level", &s->level, -1e30, 1e30));
    TRY(get_num(j, d, "data", "level_spread", &s->level_spread, 0, 1e30));
    TRY(get_num(j, d, "data", "shift_prob", &s->shift_prob, 0, 1));
    TRY(get_num(j, d, "data", "shift_scale", &s->shift_scale, 0, 1e30));
    TRY(get_num(j, d, "data", "noise", &s->noise, 0, 1e30));
    TRY(get_num(j, d, "data", "amplitude", &s->amplitude, 0, 1e30));
    TRY(get_int(j, d, "data", "features", &s->features, 1, 1 << 20));
    TRY(get_int(j, d, "data", "classes", &s->classes, 2, 1 << 16));
    TRY(get_int(j, d, "data", "outputs", &s->outputs, 1, 1 << 16));
    TRY(get_num(j, d, "data", "separation", &s->separation, 0, 1e30));
    TRY(get_num(j, d, "data", "spread", &s->spread, 0, 1e30));
    TRY(get_num(j, d, "data", "feature_scale", &s->feature_scale, 0, 1e30));
    TRY(get_num(j, d, "data", "target_scale", &s->target_scale, 0, 1e30));
    TRY(get_str(j, d, "data", "path", s->path, sizeof s->path));
    TRY(get_str(j, d, "data", "x", s->x_dataset, sizeof s->x_dataset));
    TRY(get_str(j, d, "data", "y", s->y_dataset, sizeof s->y_dataset));
    TRY(get_int(j, d, "data", "targets", &s->targets, 1, 1 << 16));
  }

  json_t *o = json_object_get(root, "optimizer");
  if (o) {
    if (!json_is_object(o))
      return pt_fail(j->err, j->errlen, PROBE_ERR_CONFIG,
                     "optimizer: expected an object");
    static const char *const okeys[] = {"type", "lr", "momentum", "beta1",
                                        "beta2", "eps", "weight_decay", NULL};
    TRY(check_keys(j, o, "optimizer", okeys));
    int t = (int)c->opt.type;
    TRY(get_enum(j, o, "optimizer", "type", opt_names, 3, &t));
    c->opt.type = (pt_opt_type)t;
    TRY(get_num(j, o, "optimizer", "lr", &c->opt.lr, 0, 1e6));
    TRY(get_num(j, o, "optimizer", "momentum", &c->opt.momentum, 0, 1));
    TRY(get_num(j, o, "optimizer", "beta1", &c->opt.beta1, 0, 0.999999));
    TRY(get_num(j, o, "optimizer", "beta2", &c->opt.beta2, 0, 0.99999999));
    TRY(get_num(j, o, "optimizer", "eps", &c->opt.eps, 0, 1));
    TRY(get_num(j, o, "optimizer", "weight_decay", &c->opt.weight_decay, 0,
                1e3));
  }
  json_t *sc = json_object_get(root, "schedule");
  if (sc) {
    if (!json_is_object(sc))
      return pt_fail(j->err, j->errlen, PROBE_ERR_CONFIG,
                     "schedule: expected an object");
    static const char *const skeys[] = {"type", "warmup", "min_lr",
                                        "step_size", "gamma", NULL};
    TRY(check_keys(j, sc, "schedule", skeys));
    int t = (int)c->sched.type;
    TRY(get_enum(j, sc, "schedule", "type", sched_names, 3, &t));
    c->sched.type = (pt_sched_type)t;
    TRY(get_int(j, sc, "schedule", "warmup", &c->sched.warmup, 0, INT64_MAX));
    TRY(get_num(j, sc, "schedule", "min_lr", &c->sched.min_lr, 0, 1e6));
    TRY(get_int(j, sc, "schedule", "step_size", &c->sched.step_size, 1,
                INT64_MAX));
    TRY(get_num(j, sc, "schedule", "gamma", &c->sched.gamma, 0, 1e6));
  }
  json_t *ls = json_object_get(root, "scaler");
  if (ls) {
    if (!json_is_object(ls))
      return pt_fail(j->err, j->errlen, PROBE_ERR_CONFIG,
                     "scaler: expected an object");
    static const char *const lkeys[] = {"enabled", "init", "growth",
                                        "backoff", "interval", "hysteresis",
                                        "min_scale", NULL};
    TRY(check_keys(j, ls, "scaler", lkeys));
    TRY(get_bool(j, ls, "scaler", "enabled", &c->scaler.enabled));
    TRY(get_num(j, ls, "scaler", "init", &c->scaler.init, 1e-30, 3e38));
    TRY(get_num(j, ls, "scaler", "growth", &c->scaler.growth, 1.0, 1e6));
    TRY(get_num(j, ls, "scaler", "backoff", &c->scaler.backoff, 1e-6,
                0.999999));
    TRY(get_int(j, ls, "scaler", "interval", &c->scaler.interval, 1,
                INT32_MAX));
    int64_t h = c->scaler.hysteresis;
    TRY(get_int(j, ls, "scaler", "hysteresis", &h, 1, 1 << 20));
    c->scaler.hysteresis = (int)h;
    TRY(get_num(j, ls, "scaler", "min_scale", &c->scaler.min_scale, 0, 3e38));
  }
  json_t *cl = json_object_get(root, "clip");
  if (cl) {
    if (!json_is_object(cl))
      return pt_fail(j->err, j->errlen, PROBE_ERR_CONFIG,
                     "clip: expected an object");
    static const char *const ckeys[] = {"max_norm", "before_unscale", NULL};
    TRY(check_keys(j, cl, "clip", ckeys));
    TRY(get_num(j, cl, "clip", "max_norm", &c->clip_max_norm, 0, 1e30));
    TRY(get_bool(j, cl, "clip", "before_unscale", &c->clip_before_unscale));
  }
  json_t *ds = json_object_get(root, "dist");
  if (ds) {
    if (!json_is_object(ds))
      return pt_fail(j->err, j->errlen, PROBE_ERR_CONFIG,
                     "dist: expected an object");
    static const char *const dkeys2[] = {"allreduce_dtype", "prediv", NULL};
    TRY(check_keys(j, ds, "dist", dkeys2));
    int dt = (int)c->dist.dtype;
    TRY(get_enum(j, ds, "dist", "allreduce_dtype", reduce_names, 2, &dt));
    c->dist.dtype = (pt_reduce_dtype)dt;
    TRY(get_bool(j, ds, "dist", "prediv", &c->dist.prediv));
  }
  for (int i = 0; i < c->n_modules; i++)
    if (c->modules[i].denorm < 0) c->modules[i].denorm = (c->loss == PT_LOSS_MSE);
  return PROBE_OK;
}

/* Shapes: walk the stack with the data's widths. */
probe_status pt_config_validate(const probe_train_config *c, char *err,
                                size_t errlen) {
  probe_status nst = check_names(c, err, errlen);
  if (nst != PROBE_OK) return nst;
  for (int i = 0; i < c->n_modules; i++)
    for (int k = 0; k < i; k++)
      if (strcmp(c->modules[i].name, c->modules[k].name) == 0)
        return pt_fail(err, errlen, PROBE_ERR_CONFIG,
                       "model[%d].name: '%s' is used twice", i,
                       c->modules[i].name);
  const pt_data_spec *d = &c->data;
  if ((d->kind == PT_DATA_CSV || d->kind == PT_DATA_HDF5) && !d->path[0])
    return pt_fail(err, errlen, PROBE_ERR_CONFIG,
                   "data.path: required for data.kind %s",
                   data_names[d->kind]);
  if (c->loss == PT_LOSS_CE &&
      c->modules[c->n_modules - 1].type != PT_MOD_SOFTMAX)
    return pt_fail(err, errlen, PROBE_ERR_CONFIG,
                   "model: with loss cross_entropy the last module must be "
                   "softmax (the loss takes probabilities)");
  int n_revin = 0;
  for (int i = 0; i < c->n_modules; i++) {
    if (c->modules[i].type == PT_MOD_REVIN) {
      n_revin++;
      if (i != 0)
        return pt_fail(err, errlen, PROBE_ERR_CONFIG,
                       "model[%d]: revin must be the first module", i);
      if (d->kind != PT_DATA_TIMESERIES && c->modules[i].denorm)
        return pt_fail(err, errlen, PROBE_ERR_CONFIG,
                       "model[%d]: revin with denorm needs timeseries data", i);
    }
  }
  if (c->clip_before_unscale && c->clip_max_norm <= 0)
    return pt_fail(err, errlen, PROBE_ERR_CONFIG,
                   "clip.before_unscale: needs clip.max_norm > 0");
  if (c->data.nan_step >= c->steps)
    return pt_fail(err, errlen, PROBE_ERR_CONFIG,
                   "data.nan_step: %lld is past the last step %lld",
                   (long long)c->data.nan_step, (long long)(c->steps - 1));
  return PROBE_OK;
}

/* ---- public: load ------------------------------------------------------- */

probe_status probe_config_from_json(probe_train_config **out, const char *text,
                                    char *err, size_t errlen) {
  if (!out || !text)
    return pt_fail(err, errlen, PROBE_ERR_INVALID_ARG, "config: no text");
  *out = NULL;
  json_error_t je;
  json_t *root = json_loads(text, JSON_REJECT_DUPLICATES, &je);
  if (!root)
    return pt_fail(err, errlen, PROBE_ERR_CONFIG,
                   "config: JSON syntax error at line %d column %d: %s",
                   je.line, je.column, je.text);
  probe_train_config *c = malloc(sizeof *c);
  if (!c) {
    json_decref(root);
    return pt_fail(err, errlen, PROBE_ERR_NOMEM, "config: out of memory");
  }
  pt_config_defaults(c);
  jctx j = {err, errlen};
  probe_status st = parse_root(&j, root, c);
  json_decref(root);
  if (st == PROBE_OK) st = pt_config_validate(c, err, errlen);
  if (st != PROBE_OK) {
    free(c);
    return st;
  }
  *out = c;
  return PROBE_OK;
}

/* A relative data.path is taken from the config file's folder (not the
 * working directory): it becomes that folder's absolute path joined with it,
 * which is also what the trace stores. */
static probe_status resolve_data_path(probe_train_config *c, const char *path,
                                      char *err, size_t errlen) {
  char *p = c->data.path;
  if (!p[0] || p[0] == '/') return PROBE_OK;
  char *real = realpath(path, NULL);
  if (!real)
    return pt_fail(err, errlen, PROBE_ERR_IO, "%s: %s", path, strerror(errno));
  char *slash = strrchr(real, '/');
  if (slash) slash[slash == real ? 1 : 0] = '\0';
  char joined[PT_PATH_MAX];
  int n = snprintf(joined, sizeof joined, "%s%s%s", real,
                   real[strlen(real) - 1] == '/' ? "" : "/", p);
  free(real);
  if (n < 0 || (size_t)n >= sizeof joined)
    return pt_fail(err, errlen, PROBE_ERR_CONFIG,
                   "data.path: '%s' joined with the config's folder is longer "
                   "than %d characters", p, PT_PATH_MAX - 1);
  memcpy(p, joined, (size_t)n + 1);
  return PROBE_OK;
}

probe_status probe_config_load_file(probe_train_config **out, const char *path,
                                    char *err, size_t errlen) {
  if (!out || !path)
    return pt_fail(err, errlen, PROBE_ERR_INVALID_ARG, "config: no path");
  *out = NULL;
  probe_status st;
  FILE *f = pt_open_regular(path, "", &st, err, errlen);
  if (!f) return st;
  /* room for the limit, one byte past it (to tell "larger") and the NUL */
  const size_t cap_max = (size_t)PT_CONFIG_MAX_BYTES + 2;
  size_t cap = 4096, len = 0;
  char *buf = malloc(cap);
  while (buf) {
    if (len + 1 == cap) {
      if (cap == cap_max) break;
      size_t ncap = cap * 2 < cap_max ? cap * 2 : cap_max;
      char *nb = realloc(buf, ncap);
      if (!nb) {
        free(buf);
        buf = NULL;
        break;
      }
      buf = nb;
      cap = ncap;
    }
    size_t got = fread(buf + len, 1, cap - len - 1, f);
    len += got;
    if (got == 0) break;
  }
  if (buf && len > (size_t)PT_CONFIG_MAX_BYTES) {
    free(buf);
    fclose(f);
    return pt_fail(err, errlen, PROBE_ERR_CONFIG,
                   "%s: larger than %d MiB; not a config", path,
                   PT_CONFIG_MAX_BYTES >> 20);
  }
  int rerr = ferror(f);
  fclose(f);
  if (!buf) return pt_fail(err, errlen, PROBE_ERR_NOMEM, "%s: out of memory", path);
  if (rerr) {
    free(buf);
    return pt_fail(err, errlen, PROBE_ERR_IO, "%s: read error", path);
  }
  buf[len] = '\0';
  char sub[384];
  const char *nul = memchr(buf, '\0', len);
  if (nul) { /* JSON text has none; the parser would stop there, silently */
    snprintf(sub, sizeof sub, "config: a NUL byte at offset %zu (not JSON text)",
             (size_t)(nul - buf));
    st = PROBE_ERR_CONFIG;
  } else {
    st = probe_config_from_json(out, buf, sub, sizeof sub);
  }
  free(buf);
  if (st == PROBE_OK) {
    st = resolve_data_path(*out, path, sub, sizeof sub);
    if (st != PROBE_OK) {
      probe_config_free(*out);
      *out = NULL;
    }
  }
  if (st != PROBE_OK) pt_fail(err, errlen, st, "%s: %s", path, sub);
  return st;
}

probe_status probe_config_load_scenario(probe_train_config **out,
                                        const char *name, char *err,
                                        size_t errlen) {
  if (!out || !name)
    return pt_fail(err, errlen, PROBE_ERR_INVALID_ARG, "scenario: no name");
  *out = NULL;
  const char *text = probe_scenario_json(name);
  if (!text) {
    char names[512] = "";
    for (size_t i = 0; i < probe_scenario_count(); i++) {
      if (i) strncat(names, ", ", sizeof names - strlen(names) - 1);
      strncat(names, probe_scenario_name(i), sizeof names - strlen(names) - 1);
    }
    return pt_fail(err, errlen, PROBE_ERR_NOT_FOUND,
                   "unknown scenario '%s' (scenarios: %s)", name, names);
  }
  char sub[384];
  probe_status st = probe_config_from_json(out, text, sub, sizeof sub);
  if (st != PROBE_OK)
    return pt_fail(err, errlen, st, "scenario %s: %s", name, sub);
  return PROBE_OK;
}

probe_status probe_config_clone(probe_train_config **out,
                                const probe_train_config *c) {
  if (!out || !c) return PROBE_ERR_INVALID_ARG;
  *out = malloc(sizeof **out);
  if (!*out) return PROBE_ERR_NOMEM;
  memcpy(*out, c, sizeof *c);
  return PROBE_OK;
}

void probe_config_free(probe_train_config *c) { free(c); }

const char *probe_config_name(const probe_train_config *c) {
  return c ? c->name : "";
}

int64_t probe_config_steps(const probe_train_config *c) {
  return c ? c->steps : 0;
}

int64_t probe_config_nan_rank(const probe_train_config *c) {
  return c && c->data.nan_step >= 0 ? c->data.nan_rank : -1;
}

/* ---- overrides ------------------------------------------------------------ */

static probe_status parse_double(const char *key, const char *v, double *out,
                                 double lo, double hi, char *err,
                                 size_t errlen) {
  char *end;
  errno = 0;
  double x = strtod(v, &end);
  if (end == v || *end || errno || !(x >= lo && x <= hi))
    return pt_fail(err, errlen, PROBE_ERR_CONFIG,
                   "%s: '%s' is not a number in [%g, %g]", key, v, lo, hi);
  *out = x;
  return PROBE_OK;
}

static probe_status parse_i64(const char *key, const char *v, int64_t *out,
                              int64_t lo, int64_t hi, char *err,
                              size_t errlen) {
  char *end;
  errno = 0;
  long long x = strtoll(v, &end, 10);
  if (end == v || *end || errno || x < lo || x > hi)
    return pt_fail(err, errlen, PROBE_ERR_CONFIG,
                   "%s: '%s' is not an integer in [%lld, %lld]", key, v,
                   (long long)lo, (long long)hi);
  *out = x;
  return PROBE_OK;
}

static probe_status parse_flag(const char *key, const char *v, int *out,
                               char *err, size_t errlen) {
  if (!strcmp(v, "1") || !strcmp(v, "true") || !strcmp(v, "on")) {
    *out = 1;
  } else if (!strcmp(v, "0") || !strcmp(v, "false") || !strcmp(v, "off")) {
    *out = 0;
  } else {
    return pt_fail(err, errlen, PROBE_ERR_CONFIG,
                   "%s: '%s' is not 0/1/true/false", key, v);
  }
  return PROBE_OK;
}

probe_status probe_config_set(probe_train_config *c, const char *key,
                              const char *value, char *err, size_t errlen) {
  if (!c || !key || !value)
    return pt_fail(err, errlen, PROBE_ERR_INVALID_ARG, "set: missing argument");
  probe_train_config t = *c; /* edit a copy: c unchanged on error */
  probe_status st = PROBE_OK;
  int64_t i64;
  if (!strcmp(key, "precision")) {
    int k = lookup(prec_names, 3, value);
    if (k < 0)
      return pt_fail(err, errlen, PROBE_ERR_CONFIG,
                     "precision: '%s' is not fp16, bf16 or fp32", value);
    t.precision = (probe_dtype)k;
  } else if (!strcmp(key, "fp32")) {
    st = set_fp32_list(&t, value, err, errlen);
  } else if (!strcmp(key, "steps")) {
    st = parse_i64(key, value, &t.steps, 1, 100000000, err, errlen);
  } else if (!strcmp(key, "seed")) {
    st = parse_i64(key, value, &i64, 0, INT64_MAX, err, errlen);
    t.seed = (uint64_t)i64;
  } else if (!strcmp(key, "micro_batches")) {
    st = parse_i64(key, value, &t.micro_batches, 1, 1024, err, errlen);
  } else if (!strcmp(key, "lr")) {
    st = parse_double(key, value, &t.opt.lr, 0, 1e6, err, errlen);
  } else if (!strcmp(key, "scaler.enabled")) {
    st = parse_flag(key, value, &t.scaler.enabled, err, errlen);
  } else if (!strcmp(key, "scaler.init")) {
    st = parse_double(key, value, &t.scaler.init, 1e-30, 3e38, err, errlen);
  } else if (!strcmp(key, "scaler.growth")) {
    st = parse_double(key, value, &t.scaler.growth, 1.0, 1e6, err, errlen);
  } else if (!strcmp(key, "scaler.backoff")) {
    st = parse_double(key, value, &t.scaler.backoff, 1e-6, 0.999999, err,
                      errlen);
  } else if (!strcmp(key, "scaler.interval")) {
    st = parse_i64(key, value, &t.scaler.interval, 1, INT32_MAX, err, errlen);
  } else if (!strcmp(key, "scaler.hysteresis")) {
    st = parse_i64(key, value, &i64, 1, 1 << 20, err, errlen);
    t.scaler.hysteresis = (int)i64;
  } else if (!strcmp(key, "scaler.min_scale")) {
    st = parse_double(key, value, &t.scaler.min_scale, 0, 3e38, err, errlen);
  } else if (!strcmp(key, "clip.max_norm")) {
    st = parse_double(key, value, &t.clip_max_norm, 0, 1e30, err, errlen);
  } else if (!strcmp(key, "clip.before_unscale")) {
    st = parse_flag(key, value, &t.clip_before_unscale, err, errlen);
  } else if (!strcmp(key, "data.nan_step")) {
    st = parse_i64(key, value, &t.data.nan_step, -1, INT64_MAX, err, errlen);
  } else if (!strcmp(key, "data.nan_rank")) {
    st = parse_i64(key, value, &t.data.nan_rank, 0, 1 << 20, err, errlen);
  } else if (!strcmp(key, "dist.allreduce_dtype")) {
    int k = lookup(reduce_names, 2, value);
    if (k < 0)
      return pt_fail(err, errlen, PROBE_ERR_CONFIG,
                     "dist.allreduce_dtype: '%s' is not fp32 or fp16", value);
    t.dist.dtype = (pt_reduce_dtype)k;
  } else if (!strcmp(key, "dist.prediv")) {
    st = parse_flag(key, value, &t.dist.prediv, err, errlen);
  } else {
    return pt_fail(err, errlen, PROBE_ERR_CONFIG, "unknown setting '%s'", key);
  }
  if (st != PROBE_OK) return st;
  st = pt_config_validate(&t, err, errlen);
  if (st != PROBE_OK) return st;
  *c = t;
  return PROBE_OK;
}

/* ---- serialisation -------------------------------------------------------- */

static json_t *jnum(double x) { return json_real(x); }

char *probe_config_to_json(const probe_train_config *c) {
  if (!c) return NULL;
  json_t *r = json_object();
  json_object_set_new(r, "name", json_string(c->name));
  json_object_set_new(r, "description", json_string(c->description));
  json_object_set_new(r, "seed", json_integer((json_int_t)c->seed));
  json_object_set_new(r, "steps", json_integer(c->steps));
  json_object_set_new(r, "precision", json_string(prec_names[c->precision]));
  json_t *fp = json_array();
  for (int i = 0; i < c->n_fp32; i++)
    json_array_append_new(fp, json_string(c->fp32[i]));
  json_object_set_new(r, "fp32", fp);
  json_object_set_new(r, "loss_fp32", json_boolean(c->loss_fp32));
  json_object_set_new(r, "loss_weight", jnum(c->loss_weight));
  json_object_set_new(r, "micro_batches", json_integer(c->micro_batches));
  json_t *model = json_array();
  for (int i = 0; i < c->n_modules; i++) {
    const pt_module_spec *m = &c->modules[i];
    json_t *o = json_object();
    json_object_set_new(o, "type", json_string(module_names[m->type]));
    json_object_set_new(o, "name", json_string(m->name));
    switch (m->type) {
    case PT_MOD_LINEAR:
      json_object_set_new(o, "out", json_integer(m->out));
      json_object_set_new(o, "bias", json_boolean(m->bias));
      json_object_set_new(o, "init_gain", jnum(m->init_gain));
      break;
    case PT_MOD_BN:
      json_object_set_new(o, "eps", jnum(m->eps));
      json_object_set_new(o, "momentum", jnum(m->momentum));
      break;
    case PT_MOD_LAYERNORM: json_object_set_new(o, "eps", jnum(m->eps)); break;
    case PT_MOD_REVIN:
      json_object_set_new(o, "eps", jnum(m->eps));
      json_object_set_new(o, "affine", json_boolean(m->affine));
      json_object_set_new(o, "denorm", json_boolean(m->denorm));
      break;
    case PT_MOD_ATTENTION:
      json_object_set_new(o, "seq", json_integer(m->seq));
      break;
    default: break;
    }
    json_array_append_new(model, o);
  }
  json_object_set_new(r, "model", model);
  json_object_set_new(r, "loss", json_string(loss_names[c->loss]));
  const pt_data_spec *d = &c->data;
  json_t *dj = json_object();
  json_object_set_new(dj, "kind", json_string(data_names[d->kind]));
  json_object_set_new(dj, "batch", json_integer(d->batch));
  json_object_set_new(dj, "nan_step", json_integer(d->nan_step));
  json_object_set_new(dj, "nan_rank", json_integer(d->nan_rank));
  switch (d->kind) {
  case PT_DATA_TIMESERIES:
    json_object_set_new(dj, "task",
                        json_string(d->classify ? "classify" : "forecast"));
    json_object_set_new(dj, "window", json_integer(d->window));
    json_object_set_new(dj, "horizon", json_integer(d->horizon));
    json_object_set_new(dj, "classes", json_integer(d->classes));
    json_object_set_new(dj, "level", jnum(d->level));
    json_object_set_new(dj, "level_spread", jnum(d->level_spread));
    json_object_set_new(dj, "shift_prob", jnum(d->shift_prob));
    json_object_set_new(dj, "shift_scale", jnum(d->shift_scale));
    json_object_set_new(dj, "amplitude", jnum(d->amplitude));
    json_object_set_new(dj, "noise", jnum(d->noise));
    break;
  case PT_DATA_CLUSTERS:
    json_object_set_new(dj, "features", json_integer(d->features));
    json_object_set_new(dj, "classes", json_integer(d->classes));
    json_object_set_new(dj, "separation", jnum(d->separation));
    json_object_set_new(dj, "spread", jnum(d->spread));
    json_object_set_new(dj, "feature_scale", jnum(d->feature_scale));
    break;
  case PT_DATA_REGRESSION:
    json_object_set_new(dj, "features", json_integer(d->features));
    json_object_set_new(dj, "outputs", json_integer(d->outputs));
    json_object_set_new(dj, "feature_scale", jnum(d->feature_scale));
    json_object_set_new(dj, "target_scale", jnum(d->target_scale));
    json_object_set_new(dj, "noise", jnum(d->noise));
    break;
  case PT_DATA_CSV:
    json_object_set_new(dj, "path", json_string(d->path));
    json_object_set_new(dj, "targets", json_integer(d->targets));
    break;
  case PT_DATA_HDF5:
    json_object_set_new(dj, "path", json_string(d->path));
    json_object_set_new(dj, "x", json_string(d->x_dataset));
    json_object_set_new(dj, "y", json_string(d->y_dataset));
    break;
  }
  json_object_set_new(r, "data", dj);
  json_t *o = json_object();
  json_object_set_new(o, "type", json_string(opt_names[c->opt.type]));
  json_object_set_new(o, "lr", jnum(c->opt.lr));
  if (c->opt.type == PT_OPT_SGD) {
    json_object_set_new(o, "momentum", jnum(c->opt.momentum));
  } else {
    json_object_set_new(o, "beta1", jnum(c->opt.beta1));
    json_object_set_new(o, "beta2", jnum(c->opt.beta2));
    json_object_set_new(o, "eps", jnum(c->opt.eps));
  }
  json_object_set_new(o, "weight_decay", jnum(c->opt.weight_decay));
  json_object_set_new(r, "optimizer", o);
  json_t *s = json_object();
  json_object_set_new(s, "type", json_string(sched_names[c->sched.type]));
  json_object_set_new(s, "warmup", json_integer(c->sched.warmup));
  if (c->sched.type == PT_SCHED_COSINE)
    json_object_set_new(s, "min_lr", jnum(c->sched.min_lr));
  if (c->sched.type == PT_SCHED_STEP) {
    json_object_set_new(s, "step_size", json_integer(c->sched.step_size));
    json_object_set_new(s, "gamma", jnum(c->sched.gamma));
  }
  json_object_set_new(r, "schedule", s);
  json_t *l = json_object();
  json_object_set_new(l, "enabled", json_boolean(c->scaler.enabled));
  json_object_set_new(l, "init", jnum(c->scaler.init));
  json_object_set_new(l, "growth", jnum(c->scaler.growth));
  json_object_set_new(l, "backoff", jnum(c->scaler.backoff));
  json_object_set_new(l, "interval", json_integer(c->scaler.interval));
  json_object_set_new(l, "hysteresis", json_integer(c->scaler.hysteresis));
  json_object_set_new(l, "min_scale", jnum(c->scaler.min_scale));
  json_object_set_new(r, "scaler", l);
  json_t *cl = json_object();
  json_object_set_new(cl, "max_norm", jnum(c->clip_max_norm));
  json_object_set_new(cl, "before_unscale", json_boolean(c->clip_before_unscale));
  json_object_set_new(r, "clip", cl);
  json_t *dist = json_object();
  json_object_set_new(dist, "allreduce_dtype",
                      json_string(reduce_names[c->dist.dtype]));
  json_object_set_new(dist, "prediv", json_boolean(c->dist.prediv));
  json_object_set_new(r, "dist", dist);
  char *txt = json_dumps(r, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
  json_decref(r);
  return txt;
}

/* ---- precision policy ---------------------------------------------------- */

int probe_policy_match(const char *entry, const char *layer_name,
                       probe_kind kind) {
  if (!entry || !layer_name) return 0;
  /* =NAME: that one layer, its name as written (never a kind, never a
   * glob: a layer named "bn" or "enc[0]" is itself, bisect's answer) */
  if (entry[0] == PROBE_POLICY_LITERAL) return entry[1] && !strcmp(entry + 1, layer_name);
  probe_kind k;
  if (probe_kind_parse(entry, &k) == PROBE_OK && k == kind) return 1;
  return fnmatch(entry, layer_name, 0) == 0;
}

probe_dtype pt_policy_precision(const probe_train_config *c,
                                    const char *name, probe_kind kind) {
  if (kind == PROBE_KIND_INPUT) return PROBE_DTYPE_F32;
  if (c->precision == PROBE_DTYPE_F32) return PROBE_DTYPE_F32;
  if (kind == PROBE_KIND_LOSS && c->loss_fp32) return PROBE_DTYPE_F32;
  for (int i = 0; i < c->n_fp32; i++)
    if (probe_policy_match(c->fp32[i], name, kind)) return PROBE_DTYPE_F32;
  return c->precision;
}

probe_status probe_config_policy_str(const probe_train_config *c, char *buf,
                                     size_t len) {
  if (!c || !buf || !len) return PROBE_ERR_INVALID_ARG;
  size_t off = (size_t)snprintf(buf, len, "%s", prec_names[c->precision]);
  if (c->precision != PROBE_DTYPE_F32) {
    if (c->n_fp32 && off < len) {
      off += (size_t)snprintf(buf + off, len - off, "; fp32: ");
      for (int i = 0; i < c->n_fp32 && off < len; i++)
        off += (size_t)snprintf(buf + off, len - off, "%s%s", i ? "," : "",
                                c->fp32[i]);
    }
    if (off < len)
      off += (size_t)snprintf(buf + off, len - off, "; loss %s",
                              c->loss_fp32 ? "fp32" : prec_names[c->precision]);
  }
  return off < len ? PROBE_OK : PROBE_ERR_INVALID_ARG;
}
