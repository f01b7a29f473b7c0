/*
 * libprobe/analysis/json.c - the analysis library's JSON writer and its tiny
 * flattening reader (analysis-impl.h), the text escaping of names that come
 * from files (probe_text_escape), the shell quoting of the commands the
 * tools print (probe_shell_quote) and number formatting (probe_num_format).
 *
 * Escaping (probe_text_escape): a layer name, a config name or a path read
 * from a trace is data, never terminal control. Every byte below 0x20, DEL
 * (0x7f), a backslash, the C1 controls U+0080..U+009F (which some terminals
 * obey: U+009B is CSI), the bidi controls U+061C, U+200E, U+200F,
 * U+202A..U+202E and U+2066..U+2069 (which reorder the text after them: a
 * name shown as another) and any byte that is not part of valid UTF-8 are
 * written as visible escapes: \n \r \t \e \a \b \f \v \\ or \xHH (\u0080 ..
 * \u009f for C1, \u202e for a bidi control). Printable ASCII and other
 * valid UTF-8 pass unchanged, so a name that needs no escaping is shown as
 * it is. A newline in a name can then never start a line of its own
 * ("verdict healthy" forged by a layer name).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../format.h" /* probe__text_escape */
#include "analysis-impl.h"

/* ---- escaping -------------------------------------------------------------- */

size_t probe_text_escape(char *out, size_t cap, const char *s) {
  return probe__text_escape(out, cap, s);
}

int probe_text_needs_escape(const char *s) {
  char tmp[2];
  return s && probe_text_escape(tmp, 0, s) != strlen(s);
}

/* ---- shell quoting ---------------------------------------------------------- */

size_t probe_shell_quote(char *out, size_t cap, const char *s) {
  static const char safe[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                             "0123456789,._/=:+-";
  if (!s) s = "";
  size_t n = strlen(s), need;
  int bare = n > 0 && strspn(s, safe) == n;
  if (bare) {
    need = n;
  } else {
    need = 2;
    for (const char *p = s; *p; p++) need += *p == '\'' ? 5 : 1;
  }
  if (!cap) return need;
  if (need >= cap) {
    out[0] = 0;
    return need;
  }
  size_t o = 0;
  if (bare) {
    memcpy(out, s, n);
    o = n;
  } else {
    out[o++] = '\'';
    for (const char *p = s; *p; p++) {
      if (*p == '\'') {
        memcpy(out + o, "'\"'\"'", 5); /* no backslash: see analysis.h */
        o += 5;
      } else {
        out[o++] = *p;
      }
    }
    out[o++] = '\'';
  }
  out[o] = 0;
  return need;
}

/* ---- numbers --------------------------------------------------------------- */

void probe_num_format(char *b, size_t n, double x, int digits) {
  if (isnan(x))
    snprintf(b, n, "nan");
  else if (isinf(x))
    snprintf(b, n, "%sinf", x < 0 ? "-" : "");
  else
    snprintf(b, n, "%.*g", digits > 0 ? digits : 6, x);
}

/* ---- writer ---------------------------------------------------------------- */

void probe__jw_init(probe__jw *w) { memset(w, 0, sizeof *w); }

void probe__jw_free(probe__jw *w) {
  free(w->buf);
  memset(w, 0, sizeof *w);
}

char *probe__jw_finish(probe__jw *w) {
  char *b = w->oom ? NULL : w->buf;
  if (!b) free(w->buf);
  memset(w, 0, sizeof *w);
  return b;
}

static void put(probe__jw *w, const char *s, size_t n) {
  if (w->oom) return;
  if (w->len + n + 1 > w->cap) {
    size_t nc = w->cap ? w->cap : 1024;
    while (w->len + n + 1 > nc) nc *= 2;
    char *nb = realloc(w->buf, nc);
    if (!nb) {
      w->oom = 1;
      return;
    }
    w->buf = nb;
    w->cap = nc;
  }
  memcpy(w->buf + w->len, s, n);
  w->len += n;
  w->buf[w->len] = 0;
}

static void puts_(probe__jw *w, const char *s) { put(w, s, strlen(s)); }

static void indent(probe__jw *w) {
  put(w, "\n", 1);
  for (int i = 0; i < w->depth; i++) put(w, "  ", 2);
}

/* JSON string: quotes, \" \\ and control characters escaped; bytes that
 * are not valid UTF-8 become \u00XX (their Latin-1 reading) so the
 * document is always valid UTF-8; C1 controls become \u0080..\u009f and
 * bidi controls \u202e (the same character to a parser, but a viewer of
 * the file does not reorder the line). */
static void put_string(probe__jw *w, const char *s) {
  put(w, "\"", 1);
  const unsigned char *p = (const unsigned char *)(s ? s : "");
  while (*p) {
    unsigned c = *p;
    char e[16];
    if (c == '"' || c == '\\') {
      e[0] = '\\', e[1] = (char)c, e[2] = 0;
      puts_(w, e);
      p++;
    } else if (c < 0x20 || c == 0x7f) {
      const char *named = c == '\n'   ? "\\n"
                          : c == '\r' ? "\\r"
                          : c == '\t' ? "\\t"
                                      : NULL;
      if (named)
        puts_(w, named);
      else {
        snprintf(e, sizeof e, "\\u%04x", c);
        puts_(w, e);
      }
      p++;
    } else if (c < 0x80) {
      put(w, (const char *)p, 1);
      p++;
    } else {
      int n = probe__utf8_len(p);
      if (n == 2 && c == 0xc2 && p[1] < 0xa0) {
        snprintf(e, sizeof e, "\\u%04x", (unsigned)p[1]);
        puts_(w, e);
        p += 2;
      } else if (n > 0 && probe__bidi_control(p, n)) {
        snprintf(e, sizeof e, "\\u%04x", probe__bidi_control(p, n));
        puts_(w, e);
        p += n;
      } else if (n > 0) {
        put(w, (const char *)p, (size_t)n);
        p += n;
      } else {
        snprintf(e, sizeof e, "\\u%04x", c);
        puts_(w, e);
        p++;
      }
    }
  }
  put(w, "\"", 1);
}

/* Separator, indentation and "key": before a value. */
static void member(probe__jw *w, const char *key) {
  if (w->depth > 0) {
    if (w->n_items[w->depth - 1]++) put(w, ",", 1);
    indent(w);
  }
  if (key) {
    put_string(w, key);
    put(w, ": ", 2);
  }
}

static void open_(probe__jw *w, const char *key, const char *o) {
  member(w, key);
  puts_(w, o);
  if (w->depth < PROBE__JW_DEPTH) w->n_items[w->depth] = 0;
  w->depth++;
}

void probe__jw_obj(probe__jw *w, const char *key) { open_(w, key, "{"); }
void probe__jw_arr(probe__jw *w, const char *key) { open_(w, key, "["); }

void probe__jw_end(probe__jw *w, char close) {
  if (w->depth <= 0) return;
  int had = w->depth <= PROBE__JW_DEPTH ? w->n_items[w->depth - 1] : 1;
  w->depth--;
  if (had) indent(w);
  put(w, &close, 1);
  if (w->depth == 0) put(w, "\n", 1);
}

void probe__jw_str(probe__jw *w, const char *key, const char *s) {
  member(w, key);
  if (s)
    put_string(w, s);
  else
    puts_(w, "null");
}

void probe__jw_int(probe__jw *w, const char *key, int64_t v) {
  char b[32];
  snprintf(b, sizeof b, "%lld", (long long)v);
  member(w, key);
  puts_(w, b);
}

void probe__jw_step(probe__jw *w, const char *key, int64_t v) {
  if (v < 0)
    probe__jw_null(w, key);
  else
    probe__jw_int(w, key, v);
}

void probe__jw_num(probe__jw *w, const char *key, double v) {
  if (!isfinite(v)) {
    probe__jw_str(w, key, isnan(v) ? "nan" : (v > 0 ? "inf" : "-inf"));
    return;
  }
  char b[40];
  snprintf(b, sizeof b, "%.15g", v);
  if (strtod(b, NULL) != v) snprintf(b, sizeof b, "%.17g", v);
  /* a real, never an integer: keep a '.' or an exponent */
  if (!strpbrk(b, ".eEn")) strcat(b, ".0");
  member(w, key);
  puts_(w, b);
}

void probe__jw_opt(probe__jw *w, const char *key, double v) {
  if (isnan(v))
    probe__jw_null(w, key);
  else
    probe__jw_num(w, key, v);
}

void probe__jw_bool(probe__jw *w, const char *key, int v) {
  member(w, key);
  puts_(w, v ? "true" : "false");
}

void probe__jw_null(probe__jw *w, const char *key) {
  member(w, key);
  puts_(w, "null");
}

void probe__jw_raw(probe__jw *w, const char *key, const char *json) {
  member(w, key);
  puts_(w, json && *json ? json : "null");
}

/* ---- reader ---------------------------------------------------------------- */

typedef struct jp {
  const char *s, *p;
  probe__jflat *f;
  int depth;
  int oom;
} jp;

static void ws(jp *j) {
  while (*j->p == ' ' || *j->p == '\t' || *j->p == '\n' || *j->p == '\r')
    j->p++;
}

static char *dup_n(const char *s, size_t n) {
  char *d = malloc(n + 1);
  if (d) {
    memcpy(d, s, n);
    d[n] = 0;
  }
  return d;
}

static int hex4(const char *p, unsigned *out) {
  unsigned v = 0;
  for (int i = 0; i < 4; i++) {
    char c = p[i];
    v <<= 4;
    if (c >= '0' && c <= '9') v |= (unsigned)(c - '0');
    else if (c >= 'a' && c <= 'f') v |= (unsigned)(c - 'a' + 10);
    else if (c >= 'A' && c <= 'F') v |= (unsigned)(c - 'A' + 10);
    else return -1;
  }
  *out = v;
  return 0;
}

static size_t put_utf8(char *o, unsigned cp) {
  if (cp < 0x80) { o[0] = (char)cp; return 1; }
  if (cp < 0x800) {
    o[0] = (char)(0xc0 | (cp >> 6));
    o[1] = (char)(0x80 | (cp & 0x3f));
    return 2;
  }
  if (cp < 0x10000) {
    o[0] = (char)(0xe0 | (cp >> 12));
    o[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
    o[2] = (char)(0x80 | (cp & 0x3f));
    return 3;
  }
  o[0] = (char)(0xf0 | (cp >> 18));
  o[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
  o[2] = (char)(0x80 | ((cp >> 6) & 0x3f));
  o[3] = (char)(0x80 | (cp & 0x3f));
  return 4;
}

/* A string at j->p ('"'); *out the decoded text (malloc'd). */
static int parse_string(jp *j, char **out) {
  if (*j->p != '"') return -1;
  const char *q = ++j->p;
  size_t n = 0;
  /* first pass: find the end and check */
  while (*q && *q != '"') {
    if ((unsigned char)*q < 0x20) return -1;
    if (*q == '\\') {
      q++;
      if (*q == 'u') {
        unsigned v;
        if (hex4(q + 1, &v)) return -1;
        q += 4;
      } else if (!strchr("\"\\/bfnrt", *q) || !*q) {
        return -1;
      }
    }
    q++;
    n++;
  }
  if (*q != '"') return -1;
  char *d = malloc(4 * n + 1);
  if (!d) {
    j->oom = 1;
    return -1;
  }
  size_t k = 0;
  const char *p = j->p;
  while (p < q) {
    if (*p != '\\') {
      d[k++] = *p++;
      continue;
    }
    p++;
    char c = *p++;
    switch (c) {
    case 'b': d[k++] = '\b'; break;
    case 'f': d[k++] = '\f'; break;
    case 'n': d[k++] = '\n'; break;
    case 'r': d[k++] = '\r'; break;
    case 't': d[k++] = '\t'; break;
    case 'u': {
      unsigned v = 0, lo = 0;
      hex4(p, &v);
      p += 4;
      if (v >= 0xd800 && v < 0xdc00 && p[0] == '\\' && p[1] == 'u' &&
          !hex4(p + 2, &lo) && lo >= 0xdc00 && lo < 0xe000) {
        v = 0x10000 + ((v - 0xd800) << 10) + (lo - 0xdc00);
        p += 6;
      } else if (v >= 0xd800 && v < 0xe000) {
        v = 0xfffd;
      }
      if (v == 0) v = 0xfffd; /* no NUL inside C strings */
      k += put_utf8(d + k, v);
      break;
    }
    default: d[k++] = c; break;
    }
  }
  d[k] = 0;
  j->p = q + 1;
  *out = d;
  return 0;
}

static int add_leaf(jp *j, const char *path, const char *start,
                    probe__jv_type type, char *str) {
  probe__jflat *f = j->f;
  if (f->n == f->cap) {
    size_t nc = f->cap ? 2 * f->cap : 32;
    probe__jleaf *nl = realloc(f->leaf, nc * sizeof *nl);
    if (!nl) {
      j->oom = 1;
      free(str);
      return -1;
    }
    f->leaf = nl;
    f->cap = nc;
  }
  probe__jleaf *l = &f->leaf[f->n];
  memset(l, 0, sizeof *l);
  l->path = dup_n(path[0] ? path : "(root)", strlen(path[0] ? path : "(root)"));
  l->raw = dup_n(start, (size_t)(j->p - start));
  l->type = type;
  l->str = str;
  if (!l->path || !l->raw) {
    free(l->path);
    free(l->raw);
    free(str);
    j->oom = 1;
    return -1;
  }
  if (type == PROBE__JV_BOOL) l->boolean = start[0] == 't';
  if (type == PROBE__JV_NUM) l->num = strtod(start, NULL);
  f->n++;
  return 0;
}

static int parse_value(jp *j, const char *path);

static int join(char *out, size_t n, const char *prefix, const char *key) {
  int k = snprintf(out, n, "%s%s%s", prefix, *prefix ? "." : "", key);
  return k < 0 || (size_t)k >= n ? -1 : 0;
}

static int parse_value(jp *j, const char *path) {
  ws(j);
  const char *start = j->p;
  char sub[512];
  if (*j->p == '{' || *j->p == '[') {
    int obj = *j->p == '{';
    if (++j->depth > 32) return -1;
    j->p++;
    ws(j);
    char close = obj ? '}' : ']';
    if (*j->p == close) {
      j->p++;
      j->depth--;
      return add_leaf(j, path, start, PROBE__JV_EMPTY, NULL);
    }
    for (size_t i = 0;; i++) {
      if (obj) {
        ws(j);
        char *key = NULL;
        if (parse_string(j, &key)) return -1;
        int bad = join(sub, sizeof sub, path, key);
        free(key);
        if (bad) return -1;
        ws(j);
        if (*j->p++ != ':') return -1;
      } else {
        int k = snprintf(sub, sizeof sub, "%s[%zu]", path, i);
        if (k < 0 || (size_t)k >= sizeof sub) return -1;
      }
      if (parse_value(j, sub)) return -1;
      ws(j);
      if (*j->p == ',') {
        j->p++;
        continue;
      }
      if (*j->p == close) {
        j->p++;
        break;
      }
      return -1;
    }
    j->depth--;
    return 0;
  }
  if (*j->p == '"') {
    char *s = NULL;
    if (parse_string(j, &s)) return -1;
    return add_leaf(j, path, start, PROBE__JV_STR, s);
  }
  if (!strncmp(j->p, "true", 4) || !strncmp(j->p, "null", 4)) {
    j->p += 4;
    return add_leaf(j, path, start,
                    start[0] == 't' ? PROBE__JV_BOOL : PROBE__JV_NULL, NULL);
  }
  if (!strncmp(j->p, "false", 5)) {
    j->p += 5;
    return add_leaf(j, path, start, PROBE__JV_BOOL, NULL);
  }
  /* number: -?digits[.digits][e[+-]digits] */
  const char *q = j->p;
  if (*q == '-') q++;
  if (!(*q >= '0' && *q <= '9')) return -1;
  while (*q >= '0' && *q <= '9') q++;
  if (*q == '.') {
    q++;
    if (!(*q >= '0' && *q <= '9')) return -1;
    while (*q >= '0' && *q <= '9') q++;
  }
  if (*q == 'e' || *q == 'E') {
    q++;
    if (*q == '+' || *q == '-') q++;
    if (!(*q >= '0' && *q <= '9')) return -1;
    while (*q >= '0' && *q <= '9') q++;
  }
  j->p = q;
  return add_leaf(j, path, start, PROBE__JV_NUM, NULL);
}

void probe__jflat_free(probe__jflat *f) {
  for (size_t i = 0; i < f->n; i++) {
    free(f->leaf[i].path);
    free(f->leaf[i].raw);
    free(f->leaf[i].str);
  }
  free(f->leaf);
  free(f->by_path);
  memset(f, 0, sizeof *f);
}

/* qsort of leaf pointers: by path, then by address (the leaves are one
 * array in document order: the first of equal paths first). */
static int by_path_cmp(const void *pa, const void *pb) {
  const probe__jleaf *a = *(const probe__jleaf *const *)pa;
  const probe__jleaf *b = *(const probe__jleaf *const *)pb;
  int c = strcmp(a->path, b->path);
  return c ? c : (a > b) - (a < b);
}

/* Sorts the index probe__jflat_get searches: lookups were a scan of every
 * leaf, and a diff of two configurations of 200,000 keys each (one scan per
 * key) ran for minutes. */
static int index_paths(probe__jflat *f) {
  if (f->n == 0) return 0;
  f->by_path = malloc(f->n * sizeof *f->by_path);
  if (!f->by_path) return -1;
  for (size_t i = 0; i < f->n; i++) f->by_path[i] = &f->leaf[i];
  qsort(f->by_path, f->n, sizeof *f->by_path, by_path_cmp);
  return 0;
}

probe_status probe__jflat_parse(probe__jflat *f, const char *text) {
  memset(f, 0, sizeof *f);
  if (!text) return PROBE_ERR_INVALID_ARG;
  if (memchr(text, 0, PROBE__JFLAT_MAX_BYTES + 1) == NULL)
    return PROBE_ERR_CONFIG; /* longer than PROBE__JFLAT_MAX_BYTES */
  jp j = {text, text, f, 0, 0};
  int bad = parse_value(&j, "");
  if (!bad) {
    ws(&j);
    bad = *j.p != 0;
  }
  if (bad) {
    int oom = j.oom;
    probe__jflat_free(f);
    return oom ? PROBE_ERR_NOMEM : PROBE_ERR_CONFIG;
  }
  if (index_paths(f)) {
    probe__jflat_free(f);
    return PROBE_ERR_NOMEM;
  }
  return PROBE_OK;
}

const probe__jleaf *probe__jflat_get(const probe__jflat *f, const char *path) {
  size_t lo = 0, hi = f->n; /* the first index whose path is >= path */
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (strcmp(f->by_path[mid]->path, path) < 0) lo = mid + 1;
    else hi = mid;
  }
  if (lo < f->n && !strcmp(f->by_path[lo]->path, path))
    return f->by_path[lo];
  return NULL;
}
