/*
 * tests/faults/hostile_trace.c - writes a small trace whose layer names
 * hold terminal control sequences, for the hostile-names fault test:
 *
 *   hostile_trace OUT.h5 fp16   layer 1 overflows to inf from step 5 and
 *                               the loss follows (a problem to explain)
 *   hostile_trace OUT.h5 fp32   the same run, finite throughout (a baseline)
 *   hostile_trace DIR ranks     DIR/t.rank0.h5 and DIR/t.rank1.h5, the fp32
 *                               run as ranks 0 and 1 of one job (plain
 *                               names: a set to diff or to write over)
 *   hostile_trace DIR world     the same, whose world_size attribute then
 *                               says 2^31 - 1 (a set that would list 2^31
 *                               missing ranks)
 *   hostile_trace OUT.h5 bidi16 the fp16 run, its names (and root
 *   hostile_trace OUT.h5 bidi32 attributes) holding Unicode bidi controls
 *                               instead (valid UTF-8 that reorders the
 *                               text shown after it), and its fp32 baseline
 *
 * Layers (ids 0..2, in execution order):
 *   0  "in" ESC "[2Jput"                      clears the screen if printed raw
 *   1  "fc" LF "FORGED verdict healthy"       forges a line if printed raw
 *   2  "loss" BEL BEL CR "OVERWRITTEN"        rings, then rewrites the line
 *
 * The bidi names (bidi16, bidi32):
 *   0  "in" U+2066 "put" U+2069                an isolate around "put"
 *   1  "enc.fc1" U+202E "1cf.daeh"             shows as "enc.fc1head.fc1"
 *   2  "loss" U+200F U+061C U+202A U+200E      RLM, ALM, LRE, LRM
 *
 * The trace is written through libprobe with plain placeholder names (so
 * a writer that refuses such names still lets us build the file), then the
 * names are patched into /layers with the HDF5 C API, and the root
 * attributes created, command_line and precision_policy get terminal
 * controls too: the file is what a crafted or foreign trace would look
 * like. Tools must either refuse it (exit 3, one line) or print the names
 * escaped; never raw.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include <hdf5.h>

#include "ampprobe/probe.h"

#define CHECK(call)                                                            \
  do {                                                                         \
    probe_status st_ = (call);                                                 \
    if (st_ != PROBE_OK) {                                                     \
      fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call,            \
              probe_status_str(st_));                                          \
      return 1;                                                                \
    }                                                                          \
  } while (0)

static const char *const hostile[3] = {
    "in\x1b[2Jput",
    "fc\nFORGED verdict healthy",
    "loss\x07\x07\rOVERWRITTEN",
};

/* Root string attributes rewritten with controls (name, value). */
static const char *const hostile_attrs[3][2] = {
    {"created", "2026-12-03\nampprobe: FORGED line\r"},
    {"command_line", "hostile_trace\x1b[7mREVERSE"},
    {"precision_policy", "fp16\x1b[2J\x07"},
};

/* The bidi set (UTF-8 bytes spelled out: U+2066 is E2 81 A6, ...). */
static const char *const bidi[3] = {
    "in\xe2\x81\xa6put\xe2\x81\xa9",
    "enc.fc1\xe2\x80\xae" "1cf.daeh",
    "loss\xe2\x80\x8f\xd8\x9c\xe2\x80\xaa\xe2\x80\x8e",
};

static const char *const bidi_attrs[3][2] = {
    {"created", "2026-12-03\xe2\x80\xae" "30-21-6202"},
    {"command_line", "hostile_trace\xe2\x81\xa7RTL"},
    {"precision_policy", "fp16\xe2\x80\xab" "23pf"},
};

/* Replaces string attribute `name` of the file's root by value (a
 * variable-length UTF-8 string, as h5py would write it). */
static int patch_attr(hid_t f, const char *name, const char *value) {
  hid_t t = H5Tcopy(H5T_C_S1), sp = H5Screate(H5S_SCALAR), a = H5I_INVALID_HID;
  int rc = -1;
  if (t >= 0 && sp >= 0 && H5Tset_size(t, H5T_VARIABLE) >= 0 &&
      H5Tset_cset(t, H5T_CSET_UTF8) >= 0 &&
      (H5Aexists(f, name) <= 0 || H5Adelete(f, name) >= 0) &&
      (a = H5Acreate2(f, name, t, sp, H5P_DEFAULT, H5P_DEFAULT)) >= 0 &&
      H5Awrite(a, t, &value) >= 0)
    rc = 0;
  H5E_BEGIN_TRY {
    H5Aclose(a);
    H5Sclose(sp);
    H5Tclose(t);
  }
  H5E_END_TRY;
  return rc;
}

/* Sets the root attribute world_size (an int64) to w. */
static int patch_world(const char *path, int64_t w) {
  int rc = -1;
  hid_t f = H5Fopen(path, H5F_ACC_RDWR, H5P_DEFAULT), a = H5I_INVALID_HID;
  if (f >= 0 && (a = H5Aopen(f, "world_size", H5P_DEFAULT)) >= 0 &&
      H5Awrite(a, H5T_NATIVE_INT64, &w) >= 0)
    rc = 0;
  H5E_BEGIN_TRY {
    H5Aclose(a);
    H5Fclose(f);
  }
  H5E_END_TRY;
  if (rc) fprintf(stderr, "hostile_trace: cannot patch world_size of %s\n", path);
  return rc;
}

/* Rewrites the name field of every row of /layers with names[], and the
 * root attributes with attrs[]. */
static int patch_names(const char *path, const char *const names[3],
                       const char *const attrs[3][2]) {
  int rc = 1;
  hid_t f = H5I_INVALID_HID, ds = H5I_INVALID_HID, ft = H5I_INVALID_HID,
        mt = H5I_INVALID_HID;
  unsigned char buf[3 * 512];
  f = H5Fopen(path, H5F_ACC_RDWR, H5P_DEFAULT);
  if (f < 0) goto error;
  ds = H5Dopen2(f, "layers", H5P_DEFAULT);
  if (ds < 0) goto error;
  ft = H5Dget_type(ds);
  mt = H5Tget_native_type(ft, H5T_DIR_DEFAULT);
  if (ft < 0 || mt < 0) goto error;
  size_t row = H5Tget_size(mt);
  int idx = H5Tget_member_index(mt, "name");
  if (row == 0 || row > 512 || idx < 0) goto error;
  size_t off = H5Tget_member_offset(mt, (unsigned)idx);
  hid_t nt = H5Tget_member_type(mt, (unsigned)idx);
  size_t nlen = H5Tget_size(nt);
  H5Tclose(nt);
  if (H5Dread(ds, mt, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf) < 0) goto error;
  for (int i = 0; i < 3; i++) {
    memset(buf + (size_t)i * row + off, 0, nlen);
    memcpy(buf + (size_t)i * row + off, names[i], strlen(names[i]));
  }
  if (H5Dwrite(ds, mt, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf) < 0) goto error;
  for (int i = 0; i < 3; i++)
    if (patch_attr(f, attrs[i][0], attrs[i][1]) < 0) goto error;
  rc = 0;
error:
  H5E_BEGIN_TRY {
    H5Tclose(mt);
    H5Tclose(ft);
    H5Dclose(ds);
    H5Fclose(f);
  }
  H5E_END_TRY;
  if (rc) fprintf(stderr, "hostile_trace: cannot patch /layers of %s\n", path);
  return rc;
}

/* The run, written to path (as rank `rank` of `world` when world > 0). */
static int write_run(const char *path, int blow, int rank, int world) {
  probe_options o;
  probe_options_init(&o);
  if (world > 0) {
    o.rank = rank;
    o.world_size = world;
    o.run_id = "hostile-world";
  }
  o.mode = PROBE_MODE_FULL;
  o.snapshot_on_nonfinite = 0;
  o.command_line = "hostile_trace";
  o.config_json = blow ? "{\"name\": \"hostile\", \"precision\": \"fp16\"}"
                       : "{\"name\": \"hostile\", \"precision\": \"fp32\"}";
  o.precision_policy = blow ? "fp16" : "fp32";
  probe_session *s;
  CHECK(probe_session_open(&s, path, &o));
  int32_t in, fc, loss;
  CHECK(probe_layer_register(s, "L0", PROBE_KIND_INPUT, PROBE_DTYPE_F32, &in));
  CHECK(probe_layer_register(s, "L1", PROBE_KIND_LINEAR,
                             blow ? PROBE_DTYPE_F16 : PROBE_DTYPE_F32, &fc));
  CHECK(probe_layer_register(s, "L2", PROBE_KIND_LOSS, PROBE_DTYPE_F32,
                             &loss));
  for (int step = 0; step < 10; step++) {
    int bad = blow && step >= 5;
    float x[16], y[16], l[1], g[16];
    for (int i = 0; i < 16; i++) {
      x[i] = 1.0f + 0.1f * (float)i;
      y[i] = bad && i % 4 == 0 ? INFINITY : 3.0f * x[i];
      g[i] = 0.01f * (float)(i + 1);
    }
    l[0] = bad ? INFINITY : 1.0f / (float)(step + 1);
    CHECK(probe_step_begin(s, step));
    CHECK(probe_tensor_record(s, in, PROBE_SITE_FWD_OUT, PROBE_DTYPE_F32, x, 16));
    CHECK(probe_tensor_record(s, fc, PROBE_SITE_FWD_IN, PROBE_DTYPE_F32, x, 16));
    CHECK(probe_tensor_record(s, fc, PROBE_SITE_FWD_OUT, PROBE_DTYPE_F32, y, 16));
    CHECK(probe_tensor_record(s, loss, PROBE_SITE_FWD_IN, PROBE_DTYPE_F32, y, 16));
    CHECK(probe_tensor_record(s, loss, PROBE_SITE_FWD_OUT, PROBE_DTYPE_F32, l, 1));
    CHECK(probe_tensor_record(s, fc, PROBE_SITE_GRAD_OUT, PROBE_DTYPE_F32, g, 16));
    CHECK(probe_tensor_record(s, fc, PROBE_SITE_WEIGHT_GRAD, PROBE_DTYPE_F32, g, 16));
    probe_step_scalars sc = {.loss = l[0],
                             .loss_scale = 1.0,
                             .lr = 0.01,
                             .grad_norm = bad ? NAN : 0.5,
                             .found_inf = bad,
                             .skipped = bad,
                             .clip_coef = 1.0};
    CHECK(probe_step_set_scalars(s, &sc));
    CHECK(probe_step_end(s));
  }
  CHECK(probe_session_close(s));
  return 0;
}

int main(int argc, char **argv) {
  if (argc != 3 || (strcmp(argv[2], "fp16") && strcmp(argv[2], "fp32") &&
                    strcmp(argv[2], "bidi16") && strcmp(argv[2], "bidi32") &&
                    strcmp(argv[2], "ranks") && strcmp(argv[2], "world"))) {
    fprintf(stderr, "usage: %s OUT.h5 fp16|fp32|bidi16|bidi32 | %s DIR ranks|world\n",
            argv[0], argv[0]);
    return 2;
  }
  if (strcmp(argv[2], "ranks") == 0 || strcmp(argv[2], "world") == 0) {
    int world = strcmp(argv[2], "world") == 0;
    char p[4096];
    for (int r = 0; r < 2; r++) {
      snprintf(p, sizeof p, "%s/t.rank%d.h5", argv[1], r);
      if (write_run(p, 0, r, 2) || (world && patch_world(p, INT32_MAX))) return 1;
    }
    return 0;
  }
  int is_bidi = strncmp(argv[2], "bidi", 4) == 0;
  int blow = !strcmp(argv[2], "fp16") || !strcmp(argv[2], "bidi16");
  if (write_run(argv[1], blow, -1, 0)) return 1;
  return is_bidi ? patch_names(argv[1], bidi, bidi_attrs)
                 : patch_names(argv[1], hostile, hostile_attrs);
}
