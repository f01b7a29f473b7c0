/*
 * trainer/data.c - the data sources of a run: synthetic generators (time
 * series with level shifts and large magnitudes, Gaussian classification
 * clusters, regression y = f(x) + noise) and loaders for the user's own
 * data from a CSV file or HDF5 datasets.
 *
 * Every batch is a pure function of (seed, step, micro-batch): the generator
 * for a batch is seeded from those, so runs are reproducible and a skipped
 * or repeated step does not shift later data. In a data-parallel job the
 * micro-batch index is the global one (rank r's m-th is r*M + m), so rank r
 * trains slice r of one virtual global batch. File data is sampled with
 * replacement, row indices drawn the same way. x is (B, in_dim) row-major;
 * targets are (B, out_dim) floats for regression/forecasting or (B) class
 * labels for classification.
 *
 * Errors in a data file's contents (a CSV cell that is not a number, ragged
 * rows, a dataset of the wrong shape or of no columns, one too large for
 * memory, a label that is not an integer) are PROBE_ERR_CORRUPT; a missing
 * file PROBE_ERR_NOT_FOUND, one that is not HDF5 PROBE_ERR_NOT_HDF5 (the
 * CLI's exit 3 for all three: bad input); PROBE_ERR_IO is left for reads
 * that fail (exit 4) and PROBE_ERR_CONFIG for the config's own mistakes (a
 * task that needs another loss). Data paths must name regular files
 * (pt_open_regular).
 */
#define _POSIX_C_SOURCE 200809L
#include <ctype.h>
#include <errno.h>
#include <hdf5.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "trainer-impl.h"

struct pt_data {
  pt_data_spec spec;
  pt_loss_type loss;
  uint64_t seed;
  int64_t in_dim, out_dim; /* out_dim: targets, or classes for CE */
  int64_t nan_micro; /* global micro-batch that gets nan_step's NaN (0) */
  /* generator parameters */
  float *centers; /* clusters: (classes, features) */
  float *w1, *w2; /* regression: (features, 16), (16, outputs) */
  /* file data */
  int64_t rows;
  float *fx;      /* (rows, in_dim) */
  float *fy;      /* (rows, out_dim) or (rows) labels */
  /* batch scratch, sized at open (no stack array sized by the config) */
  float *series;  /* timeseries: (window + horizon) */
  double *z;      /* regression: (features) */
};

#define PT_REG_HIDDEN 16
#define PT_CSV_MAX_COLS 4096
/* values of one HDF5 dataset at most (2^40: 4 TiB of float32), so that no
 * size computed from a file's declared shape can wrap; the memory check
 * (pt_data_need_bytes) refuses far less on a real machine */
#define PT_DATA_MAX_VALUES (UINT64_C(1) << 40)

int64_t pt_data_in_dim(const pt_data *d) { return d->in_dim; }
void pt_data_set_nan_micro(pt_data *d, int64_t micro) { d->nan_micro = micro; }
int64_t pt_data_out_dim(const pt_data *d) { return d->out_dim; }

void pt_data_close(pt_data *d) {
  if (!d) return;
  free(d->centers);
  free(d->w1);
  free(d->w2);
  free(d->fx);
  free(d->fy);
  free(d->series);
  free(d->z);
  free(d);
}

/* The (rows, columns) an open dataset declares, a 1-D one as one column;
 * 0 when it is not 1-D or 2-D. */
static int h5_shape(hid_t ds, hsize_t dims[2]) {
  hid_t sp = H5Dget_space(ds);
  int nd = sp < 0 ? -1 : H5Sget_simple_extent_ndims(sp);
  dims[0] = 0;
  dims[1] = 1;
  int ok = nd >= 1 && nd <= 2 && H5Sget_simple_extent_dims(sp, dims, NULL) >= 0;
  if (sp >= 0) H5Sclose(sp);
  if (ok && nd == 1) dims[1] = 1;
  return ok;
}

/* The values a dataset of an HDF5 file declares (its shape's product, as
 * a double: no wrap), 0 when it cannot be told (the load says why). */
static double h5_declared_values(hid_t file, const char *name) {
  hid_t ds = H5I_INVALID_HID;
  H5E_BEGIN_TRY { ds = H5Dopen2(file, name, H5P_DEFAULT); }
  H5E_END_TRY;
  if (ds < 0) return 0;
  hsize_t dims[2];
  int ok = h5_shape(ds, dims);
  H5Dclose(ds);
  return ok ? (double)dims[0] * (double)dims[1] : 0;
}

/* The float32 values an HDF5 data file's x and y declare, read from their
 * shapes before anything is allocated for them. */
static double h5_need_bytes(const pt_data_spec *s) {
  probe_status ost;
  char e[8];
  FILE *probe = pt_open_regular(s->path, "data.path", &ost, e, sizeof e);
  if (!probe) return 0;
  fclose(probe);
  hid_t file = H5I_INVALID_HID;
  H5E_BEGIN_TRY { file = H5Fopen(s->path, H5F_ACC_RDONLY, H5P_DEFAULT); }
  H5E_END_TRY;
  if (file < 0) return 0;
  double n = h5_declared_values(file, s->x_dataset) +
             h5_declared_values(file, s->y_dataset);
  H5Fclose(file);
  return n * (double)sizeof(float);
}

double pt_data_need_bytes(const pt_data_spec *s, pt_loss_type loss) {
  (void)loss;
  const double f = (double)sizeof(float);
  switch (s->kind) {
  case PT_DATA_HDF5:
    return h5_need_bytes(s);
  case PT_DATA_TIMESERIES:
    return (double)(s->window + s->horizon) * f;
  case PT_DATA_CLUSTERS:
    return (double)s->classes * (double)s->features * f;
  case PT_DATA_REGRESSION:
    return ((double)s->features * PT_REG_HIDDEN +
            (double)PT_REG_HIDDEN * (double)s->outputs) * f +
           (double)s->features * sizeof(double);
  default:
    return 0.0;
  }
}

size_t pt_data_bytes(const pt_data *d) {
  const pt_data_spec *s = &d->spec;
  size_t b = 0;
  if (d->centers) b += (size_t)(s->classes * s->features) * sizeof(float);
  if (d->w1) b += (size_t)(s->features * PT_REG_HIDDEN) * sizeof(float);
  if (d->w2) b += (size_t)(PT_REG_HIDDEN * s->outputs) * sizeof(float);
  if (d->z) b += (size_t)s->features * sizeof(double);
  if (d->series) b += (size_t)(s->window + s->horizon) * sizeof(float);
  if (d->fx) b += (size_t)(d->rows * d->in_dim) * sizeof(float);
  if (d->fy)
    b += (size_t)(d->rows * (d->loss == PT_LOSS_CE ? 1 : d->out_dim)) *
         sizeof(float);
  return b;
}

/* ---- CSV ------------------------------------------------------------------ */

static int line_is_numeric(const char *s) {
  char *end;
  while (*s == ' ' || *s == '\t') s++;
  strtod(s, &end);
  return end != s;
}

static probe_status load_csv(pt_data *d, char *err, size_t errlen) {
  const char *path = d->spec.path;
  probe_status ost;
  FILE *f = pt_open_regular(path, "data.path", &ost, err, errlen);
  if (!f) return ost;
  const int line_cap = 1 << 16;
  char *line = malloc((size_t)line_cap);
  float row[PT_CSV_MAX_COLS];
  int64_t cols = -1, cap = 0, lineno = 0;
  float *vals = NULL;
  int64_t n = 0;
  probe_status st = PROBE_OK;
  if (!line) {
    fclose(f);
    return pt_fail(err, errlen, PROBE_ERR_NOMEM, "%s: out of memory", path);
  }
  while (fgets(line, line_cap, f)) {
    lineno++;
    size_t L = strlen(line);
    while (L && (line[L - 1] == '\n' || line[L - 1] == '\r')) line[--L] = 0;
    if (L == 0) continue;
    if (cols < 0 && n == 0 && !line_is_numeric(line)) continue; /* header */
    int64_t c = 0;
    char *p = line;
    for (;;) {
      char *end;
      double v = strtod(p, &end);
      if (end == p || c >= PT_CSV_MAX_COLS) {
        st = pt_fail(err, errlen, PROBE_ERR_CORRUPT,
                     "%s:%lld: column %lld is not a number", path,
                     (long long)lineno, (long long)(c + 1));
        goto done;
      }
      row[c++] = (float)v;
      p = end;
      while (*p == ' ' || *p == '\t') p++;
      if (*p == ',') {
        p++;
        continue;
      }
      if (*p == 0) break;
      st = pt_fail(err, errlen, PROBE_ERR_CORRUPT,
                   "%s:%lld: unexpected character '%c'", path,
                   (long long)lineno, *p);
      goto done;
    }
    if (cols >= 0 && c != cols) {
      st = pt_fail(err, errlen, PROBE_ERR_CORRUPT,
                   "%s:%lld: %lld columns, expected %lld", path,
                   (long long)lineno, (long long)c, (long long)cols);
      goto done;
    }
    if ((n + 1) * c > cap) {
      int64_t ncap = cap ? cap * 2 : 4096;
      while (ncap < (n + 1) * c) ncap *= 2;
      float *nv = realloc(vals, (size_t)ncap * sizeof(float));
      if (!nv) {
        st = pt_fail(err, errlen, PROBE_ERR_NOMEM, "%s: out of memory", path);
        goto done;
      }
      vals = nv;
      cap = ncap;
    }
    memcpy(vals + n * c, row, (size_t)c * sizeof(float));
    if (cols < 0) cols = c;
    n++;
  }
  if (ferror(f)) {
    st = pt_fail(err, errlen, PROBE_ERR_IO, "%s: read error", path);
    goto done;
  }
  int64_t nt = d->loss == PT_LOSS_CE ? 1 : d->spec.targets;
  if (n < 1 || cols <= nt) {
    st = pt_fail(err, errlen, PROBE_ERR_CORRUPT,
                 "%s: needs at least one row with more than %lld columns",
                 path, (long long)nt);
    goto done;
  }
  d->rows = n;
  d->in_dim = cols - nt;
  d->fx = malloc((size_t)(n * d->in_dim) * sizeof(float));
  d->fy = malloc((size_t)(n * nt) * sizeof(float));
  if (!d->fx || !d->fy) {
    st = pt_fail(err, errlen, PROBE_ERR_NOMEM, "%s: out of memory", path);
    goto done;
  }
  for (int64_t r = 0; r < n; r++) {
    memcpy(d->fx + r * d->in_dim, vals + r * cols,
           (size_t)d->in_dim * sizeof(float));
    memcpy(d->fy + r * nt, vals + r * cols + d->in_dim,
           (size_t)nt * sizeof(float));
  }
  d->out_dim = nt;
done:
  free(vals);
  free(line);
  fclose(f);
  return st;
}

/* ---- HDF5 ----------------------------------------------------------------- */

static probe_status read_h5(hid_t file, const char *path, const char *name,
                            float **out, int64_t *rows, int64_t *cols,
                            char *err, size_t errlen) {
  hid_t ds = H5I_INVALID_HID;
  probe_status st = PROBE_OK;
  H5E_BEGIN_TRY { ds = H5Dopen2(file, name, H5P_DEFAULT); }
  H5E_END_TRY;
  if (ds < 0)
    return pt_fail(err, errlen, PROBE_ERR_NOT_FOUND,
                   "%s: no dataset '%s'", path, name);
  hsize_t dims[2];
  if (!h5_shape(ds, dims)) {
    st = pt_fail(err, errlen, PROBE_ERR_CORRUPT,
                 "%s: dataset '%s' must be 1-D or 2-D", path, name);
    goto done;
  }
  if (dims[0] < 1 || dims[1] < 1) {
    st = pt_fail(err, errlen, PROBE_ERR_CORRUPT,
                 "%s: dataset '%s' has shape (%llu, %llu): no values", path,
                 name, (unsigned long long)dims[0], (unsigned long long)dims[1]);
    goto done;
  }
  /* its shape is the file's word: a few KiB can declare 2^62 elements */
  if (dims[0] > PT_DATA_MAX_VALUES / dims[1]) {
    st = pt_fail(err, errlen, PROBE_ERR_CORRUPT,
                 "%s: dataset '%s' has shape (%llu, %llu): more than %llu "
                 "values, too large to load", path, name,
                 (unsigned long long)dims[0], (unsigned long long)dims[1],
                 (unsigned long long)PT_DATA_MAX_VALUES);
    goto done;
  }
  *rows = (int64_t)dims[0];
  *cols = (int64_t)dims[1];
  *out = malloc((size_t)(dims[0] * dims[1]) * sizeof(float) + 1);
  if (!*out) {
    st = pt_fail(err, errlen, PROBE_ERR_NOMEM, "%s: out of memory", path);
    goto done;
  }
  herr_t rc;
  H5E_BEGIN_TRY {
    rc = H5Dread(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, *out);
  }
  H5E_END_TRY;
  if (rc < 0)
    st = pt_fail(err, errlen, PROBE_ERR_CORRUPT,
                 "%s: dataset '%s' could not be read as numbers", path, name);
done:
  H5Dclose(ds);
  return st;
}

static probe_status load_hdf5(pt_data *d, char *err, size_t errlen) {
  const char *path = d->spec.path;
  /* A FIFO or device would make HDF5 block or read forever: refused. */
  probe_status ost;
  FILE *probe = pt_open_regular(path, "data.path", &ost, err, errlen);
  if (!probe) return ost;
  fclose(probe);
  hid_t file = H5I_INVALID_HID;
  H5E_BEGIN_TRY { file = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT); }
  H5E_END_TRY;
  if (file < 0)
    return pt_fail(err, errlen, PROBE_ERR_NOT_HDF5, "%s: not an HDF5 file",
                   path);
  int64_t xr, xc, yr, yc;
  probe_status st =
      read_h5(file, path, d->spec.x_dataset, &d->fx, &xr, &xc, err, errlen);
  if (st == PROBE_OK)
    st = read_h5(file, path, d->spec.y_dataset, &d->fy, &yr, &yc, err, errlen);
  H5Fclose(file);
  if (st != PROBE_OK) return st;
  if (xr != yr || xr < 1)
    return pt_fail(err, errlen, PROBE_ERR_CORRUPT,
                   "%s: '%s' has %lld rows but '%s' has %lld", path,
                   d->spec.x_dataset, (long long)xr, d->spec.y_dataset,
                   (long long)yr);
  if (d->loss == PT_LOSS_CE && yc != 1)
    return pt_fail(err, errlen, PROBE_ERR_CORRUPT,
                   "%s: '%s' must hold one class label per row", path,
                   d->spec.y_dataset);
  d->rows = xr;
  d->in_dim = xc;
  d->out_dim = yc;
  return PROBE_OK;
}

/* For classification from files: labels must be integers in [0, classes). */
static probe_status check_labels(pt_data *d, char *err, size_t errlen) {
  float mx = 0;
  for (int64_t r = 0; r < d->rows; r++) {
    float v = d->fy[r];
    if (!(v >= 0) || v != floorf(v) || v > 65535)
      return pt_fail(err, errlen, PROBE_ERR_CORRUPT,
                     "%s: row %lld: class label %g is not an integer >= 0",
                     d->spec.path, (long long)r, v);
    if (v > mx) mx = v;
  }
  d->out_dim = (int64_t)mx + 1;
  if (d->out_dim < 2) d->out_dim = 2;
  return PROBE_OK;
}

/* ---- open ----------------------------------------------------------------- */

probe_status pt_data_open(pt_data **out, const pt_data_spec *spec,
                          pt_loss_type loss, uint64_t seed, char *err,
                          size_t errlen) {
  *out = NULL;
  pt_data *d = calloc(1, sizeof *d);
  if (!d) return pt_fail(err, errlen, PROBE_ERR_NOMEM, "data: out of memory");
  d->spec = *spec;
  d->loss = loss;
  d->seed = seed;
  probe_status st = PROBE_OK;
  pt_rng r;
  pt_rng_seed(&r, pt_seed_mix(seed, 0x5eedda7aULL));
  switch (spec->kind) {
  case PT_DATA_TIMESERIES:
    d->in_dim = spec->window;
    d->out_dim = spec->classify ? spec->classes : spec->horizon;
    if ((loss == PT_LOSS_CE) != (spec->classify != 0)) {
      st = pt_fail(err, errlen, PROBE_ERR_CONFIG,
                   "data.task: %s needs loss %s",
                   spec->classify ? "classify" : "forecast",
                   spec->classify ? "cross_entropy" : "mse");
      break;
    }
    d->series = malloc((size_t)(spec->window + spec->horizon) * sizeof(float));
    if (!d->series)
      st = pt_fail(err, errlen, PROBE_ERR_NOMEM, "data: out of memory");
    break;
  case PT_DATA_CLUSTERS: {
    d->in_dim = spec->features;
    d->out_dim = spec->classes;
    if (loss != PT_LOSS_CE) {
      st = pt_fail(err, errlen, PROBE_ERR_CONFIG,
                   "data.kind clusters needs loss cross_entropy");
      break;
    }
    size_t n = (size_t)(spec->classes * spec->features);
    d->centers = malloc(n * sizeof(float));
    if (!d->centers) {
      st = pt_fail(err, errlen, PROBE_ERR_NOMEM, "data: out of memory");
      break;
    }
    for (size_t i = 0; i < n; i++)
      d->centers[i] = (float)(spec->separation * pt_rng_normal(&r));
    break;
  }
  case PT_DATA_REGRESSION: {
    d->in_dim = spec->features;
    d->out_dim = spec->outputs;
    if (loss != PT_LOSS_MSE) {
      st = pt_fail(err, errlen, PROBE_ERR_CONFIG,
                   "data.kind regression needs loss mse");
      break;
    }
    size_t n1 = (size_t)(spec->features * PT_REG_HIDDEN);
    size_t n2 = (size_t)(PT_REG_HIDDEN * spec->outputs);
    d->w1 = malloc(n1 * sizeof(float));
    d->w2 = malloc(n2 * sizeof(float));
    d->z = malloc((size_t)spec->features * sizeof(double));
    if (!d->w1 || !d->w2 || !d->z) {
      st = pt_fail(err, errlen, PROBE_ERR_NOMEM, "data: out of memory");
      break;
    }
    for (size_t i = 0; i < n1; i++)
      d->w1[i] = (float)(pt_rng_normal(&r) * 1.5 / sqrt((double)spec->features));
    for (size_t i = 0; i < n2; i++)
      d->w2[i] = (float)(pt_rng_normal(&r) / sqrt((double)PT_REG_HIDDEN));
    break;
  }
  case PT_DATA_CSV:
    st = load_csv(d, err, errlen);
    if (st == PROBE_OK && loss == PT_LOSS_CE) st = check_labels(d, err, errlen);
    break;
  case PT_DATA_HDF5:
    st = load_hdf5(d, err, errlen);
    if (st == PROBE_OK && loss == PT_LOSS_CE) st = check_labels(d, err, errlen);
    break;
  }
  if (st != PROBE_OK) {
    pt_data_close(d);
    return st;
  }
  *out = d;
  return PROBE_OK;
}

/* ---- batches -------------------------------------------------------------- */

/* One time series of T + H values: level + sinusoid + level shifts + noise.
 * Classification: the class sets the sinusoid's period. */
static void gen_series(const pt_data_spec *s, pt_rng *r, int cls, float *v,
                       int64_t len) {
  double level = s->level + s->level_spread * pt_rng_normal(r);
  double period = s->classify ? 4.0 + 3.0 * cls : 8.0 + 16.0 * pt_rng_uniform(r);
  double phase = 6.283185307179586 * pt_rng_uniform(r);
  double amp = s->amplitude * (0.75 + 0.5 * pt_rng_uniform(r));
  for (int64_t t = 0; t < len; t++) {
    if (s->shift_prob > 0 && pt_rng_uniform(r) < s->shift_prob)
      level += s->shift_scale * pt_rng_normal(r);
    double x = level + amp * sin(6.283185307179586 * (double)t / period + phase) +
               s->noise * pt_rng_normal(r);
    v[t] = (float)x;
  }
}

probe_status pt_data_batch(pt_data *d, int64_t step, int64_t micro, float *x,
                           float *y, int32_t *labels) {
  const pt_data_spec *s = &d->spec;
  const int64_t B = s->batch, F = d->in_dim;
  pt_rng r;
  /* global micro-batches past 4095 (large jobs) take a hashed stream so
   * that (step, 4096) does not alias (step + 1, 0) */
  uint64_t stream =
      micro < 4096 ? (uint64_t)step * 4096u + (uint64_t)micro + 1u
                   : pt_seed_mix((uint64_t)step, (uint64_t)micro) | (1ull << 63);
  pt_rng_seed(&r, pt_seed_mix(d->seed, stream));
  switch (s->kind) {
  case PT_DATA_TIMESERIES: {
    int64_t len = s->window + s->horizon;
    float *tmp = d->series; /* (len), allocated at open */
    for (int64_t b = 0; b < B; b++) {
      int cls = s->classify ? (int)(pt_rng_u64(&r) % (uint64_t)s->classes) : 0;
      gen_series(s, &r, cls, tmp, len);
      memcpy(x + b * F, tmp, (size_t)s->window * sizeof(float));
      if (s->classify)
        labels[b] = cls;
      else
        memcpy(y + b * s->horizon, tmp + s->window,
               (size_t)s->horizon * sizeof(float));
    }
    break;
  }
  case PT_DATA_CLUSTERS:
    for (int64_t b = 0; b < B; b++) {
      int cls = (int)(pt_rng_u64(&r) % (uint64_t)s->classes);
      labels[b] = cls;
      for (int64_t f = 0; f < F; f++)
        x[b * F + f] = (float)(s->feature_scale *
                               (d->centers[cls * F + f] +
                                s->spread * pt_rng_normal(&r)));
    }
    break;
  case PT_DATA_REGRESSION: {
    const int64_t O = s->outputs;
    for (int64_t b = 0; b < B; b++) {
      double *z = d->z; /* (F), allocated at open */
      for (int64_t f = 0; f < F; f++) z[f] = pt_rng_normal(&r);
      double h[PT_REG_HIDDEN];
      for (int j = 0; j < PT_REG_HIDDEN; j++) {
        double a = 0;
        for (int64_t f = 0; f < F; f++) a += z[f] * d->w1[f * PT_REG_HIDDEN + j];
        h[j] = tanh(a);
      }
      for (int64_t o = 0; o < O; o++) {
        double a = 0;
        for (int j = 0; j < PT_REG_HIDDEN; j++) a += h[j] * d->w2[j * O + o];
        y[b * O + o] =
            (float)(s->target_scale * (a + s->noise * pt_rng_normal(&r)));
      }
      for (int64_t f = 0; f < F; f++) x[b * F + f] = (float)(s->feature_scale * z[f]);
    }
    break;
  }
  case PT_DATA_CSV:
  case PT_DATA_HDF5: {
    int64_t nt = d->loss == PT_LOSS_CE ? 1 : d->out_dim;
    for (int64_t b = 0; b < B; b++) {
      int64_t row = (int64_t)(pt_rng_u64(&r) % (uint64_t)d->rows);
      memcpy(x + b * F, d->fx + row * F, (size_t)F * sizeof(float));
      if (d->loss == PT_LOSS_CE)
        labels[b] = (int32_t)d->fy[row];
      else
        memcpy(y + b * nt, d->fy + row * nt, (size_t)nt * sizeof(float));
    }
    break;
  }
  }
  if (step == s->nan_step && micro == d->nan_micro)
    x[F / 2] = NAN; /* sample 0 */
  return PROBE_OK;
}
