"""ampprobe._lib - finds and loads libampprobe with ctypes, and mirrors the C
structs of include/ampprobe/probe.h and numerics.h.

Library search order (docs/python.md):
  1. $AMPPROBE_LIB, the path of the shared library itself (when set, the
     only place tried);
  2. $AMPPROBE_PREFIX/lib (and lib64) of an installation, then the loader's
     own search (ctypes.util.find_library("ampprobe"): ldconfig's cache,
     LD_LIBRARY_PATH);
  3. the build tree of the repository this package sits in:
     <repo>/build/libprobe/libampprobe.so.
The struct layouts here are checked against the C compiler's sizeof/offsetof
by tests/python/test_core.py.
"""
import ctypes
import ctypes.util
import os
import pathlib

# ---- vocabulary (names as probe.h; ids are looked up in the library) -------

SITES = ("fwd_in", "fwd_out", "fwd_saved", "grad_out", "grad_in", "weight",
         "weight_grad", "master_weight", "grad_pre_allreduce",
         "grad_post_allreduce")
SITE_PHASE = {"fwd_in": "forward", "fwd_out": "forward", "fwd_saved": "forward",
              "grad_out": "backward", "grad_in": "backward",
              "weight": "forward", "weight_grad": "backward",
              "master_weight": "optimizer", "grad_pre_allreduce": "backward",
              "grad_post_allreduce": "backward"}
PRECISIONS = ("fp32", "fp16", "bf16")
DTYPES = ("fp32", "fp16", "bf16")
SCALER_KINDS = ("backoff", "growth", "hysteresis", "min_clamp")
# probe_step_scalars.unmeasured bits (PROBE_SCALAR_*)
SCALAR_LOSS, SCALAR_LOSS_SCALE, SCALAR_SCALER = 1, 2, 4
SCALAR_LR, SCALAR_GRAD_NORM, SCALAR_CLIP = 8, 16, 32
SCALAR_WEIGHT_DIGEST = 64  # weight_digest; 0 is stored as not measured
PROBE_DIGEST64_INIT = 14695981039346656037  # probe_digest64's start value
PROBE_RUN_ID_MAX = 64
PROBE_RING_STEPS_MAX = 1000000  # probe.h: the deepest flight recorder
MODES = {"scalars": 0, "flight": 0, "flight-recorder": 0, "full": 1}

PROBE_NAME_MAX = 64
PROBE_HIST_BINS = 66
PROBE_KERNEL_NAME_MAX = 128


class ProbeError(RuntimeError):
    """A libprobe call failed: .status is the probe_status code (negative),
    .name its enum name without prefix ("ERR_IO")."""

    def __init__(self, status, message, name=""):
        super().__init__(message)
        self.status = status
        self.name = name


# ---- structs ----------------------------------------------------------------

class probe_stats(ctypes.Structure):
    _fields_ = [
        ("count", ctypes.c_uint64),
        ("nan_count", ctypes.c_uint64),
        ("posinf_count", ctypes.c_uint64),
        ("neginf_count", ctypes.c_uint64),
        ("zero_count", ctypes.c_uint64),
        ("f16_subnormal", ctypes.c_uint64),
        ("f16_flush", ctypes.c_uint64),
        ("f16_overflow", ctypes.c_uint64),
        ("min", ctypes.c_float),
        ("max", ctypes.c_float),
        ("absmax", ctypes.c_float),
        ("absmin_nonzero", ctypes.c_float),
        ("sum", ctypes.c_double),
        ("sumsq", ctypes.c_double),
        ("hist", ctypes.c_uint64 * PROBE_HIST_BINS),
    ]


class probe_record(ctypes.Structure):
    _fields_ = [
        ("step", ctypes.c_int64),
        ("seq", ctypes.c_uint32),
        ("layer", ctypes.c_int32),
        ("site", ctypes.c_int32),
        ("dtype", ctypes.c_int32),
        ("stats", probe_stats),
    ]


class probe_step_scalars(ctypes.Structure):
    _fields_ = [
        ("step", ctypes.c_int64),
        ("loss", ctypes.c_double),
        ("loss_scale", ctypes.c_double),
        ("growth_tracker", ctypes.c_int32),
        ("found_inf", ctypes.c_int32),
        ("skipped", ctypes.c_int32),
        # PROBE_SCALAR_* bits of the scalars not measured (libraries that
        # have it; older ones leave these 4 bytes as padding and ignore it)
        ("unmeasured", ctypes.c_uint32),
        ("lr", ctypes.c_double),
        ("grad_norm", ctypes.c_double),
        ("clip_threshold", ctypes.c_double),
        ("clip_coef", ctypes.c_double),
        ("wall_time", ctypes.c_double),
        # appended (multi-rank): probe_digest64 of the FP32 master weights
        # after the step; 0 = not measured (SCALAR_WEIGHT_DIGEST)
        ("weight_digest", ctypes.c_uint64),
    ]


class probe_scaler_event(ctypes.Structure):
    _fields_ = [
        ("step", ctypes.c_int64),
        ("kind", ctypes.c_int32),
        ("old_scale", ctypes.c_double),
        ("new_scale", ctypes.c_double),
        ("growth_tracker", ctypes.c_int32),
    ]


class probe_nonfinite_record(ctypes.Structure):
    _fields_ = [
        ("layer", ctypes.c_int32),
        ("site", ctypes.c_int),
        ("count", ctypes.c_uint64),
        ("nan_count", ctypes.c_uint64),
        ("posinf_count", ctypes.c_uint64),
        ("neginf_count", ctypes.c_uint64),
    ]


class probe_layer_info(ctypes.Structure):
    _fields_ = [
        ("id", ctypes.c_int32),
        ("name", ctypes.c_char * PROBE_NAME_MAX),
        ("kind", ctypes.c_int32),
        ("precision", ctypes.c_int32),
    ]


class probe_snapshot_info(ctypes.Structure):
    _fields_ = [
        ("step", ctypes.c_int64),
        ("seq", ctypes.c_uint32),
        ("layer", ctypes.c_int32),
        ("site", ctypes.c_int32),
        ("dtype", ctypes.c_int32),
        ("offset", ctypes.c_int64),
        ("n", ctypes.c_int64),
        ("n_total", ctypes.c_int64),
    ]


class probe_options(ctypes.Structure):
    _fields_ = [
        ("mode", ctypes.c_int),
        ("layer_select", ctypes.c_char_p),
        ("step_start", ctypes.c_int64),
        ("step_end", ctypes.c_int64),
        ("step_every", ctypes.c_int64),
        ("ring_steps", ctypes.c_int),
        ("flush_seconds", ctypes.c_double),
        ("flush_steps", ctypes.c_int64),
        ("snapshot_on_nonfinite", ctypes.c_int),
        ("snapshot_max_elems", ctypes.c_size_t),
        ("command_line", ctypes.c_char_p),
        ("config_json", ctypes.c_char_p),
        ("precision_policy", ctypes.c_char_p),
        ("cupti", ctypes.c_int),
        ("max_events", ctypes.c_int),
        ("batch_rows", ctypes.c_int64),
        # Newer libraries: replace an existing trace (0: PROBE_ERR_EXISTS).
        # An older library ignores it (it lands in probe_options_buf's pad).
        ("overwrite", ctypes.c_int),
        # multi-rank jobs: rank -1 / world_size 0 outside one (set by
        # probe_options_init); run_id None or [A-Za-z0-9._-]{1,64}
        ("rank", ctypes.c_int),
        ("world_size", ctypes.c_int),
        ("run_id", ctypes.c_char_p),
    ]


class probe_options_buf(ctypes.Union):
    """probe_options with spare room: probe_options_init writes the C
    library's whole struct, which a newer library may have grown."""
    _fields_ = [("opt", probe_options), ("_pad", ctypes.c_char * 1024)]


class probe_trace_info(ctypes.Structure):
    _fields_ = [
        ("version", ctypes.c_int),
        ("complete", ctypes.c_int),
        ("record_mode", ctypes.c_int),
        ("n_layers", ctypes.c_int64),
        ("n_steps", ctypes.c_int64),
        ("n_records", ctypes.c_int64),
        ("n_scaler_events", ctypes.c_int64),
        ("n_snapshots", ctypes.c_int64),
        ("n_snapshot_elems", ctypes.c_int64),
        ("n_kernels", ctypes.c_int64),
        ("n_events", ctypes.c_int64),
        ("n_flushes", ctypes.c_int64),
        ("last_step", ctypes.c_int64),
        ("first_nonfinite_step", ctypes.c_int64),
        ("created", ctypes.c_char_p),
        ("command_line", ctypes.c_char_p),
        ("config_json", ctypes.c_char_p),
        ("precision_policy", ctypes.c_char_p),
        ("library_versions", ctypes.c_char_p),
        # older traces: -1, 0, ""
        ("rank", ctypes.c_int32),
        ("world_size", ctypes.c_int32),
        ("run_id", ctypes.c_char_p),
        # the rank left the loop by joining (probe_session_mark_joined);
        # libraries before it lack the field (has_join_mark)
        ("joined", ctypes.c_int),
        # the abort mark (probe_session_mark_aborted): read only when
        # has_abort_mark(lib), older libraries lack both fields
        ("aborted", ctypes.c_char_p),
        ("aborted_step", ctypes.c_int64),
        # 1: a bare HDF5 superblock, its writer killed before it wrote
        # anything (read as not closed, 0 steps). Not read by Trace: no
        # symbol tells an older library, which lacks it, from this one
        ("unwritten", ctypes.c_int),
    ]


def has_abort_mark(lib):
    """Whether lib knows the abort mark: probe_session_mark_aborted and
    probe_trace_info.aborted/aborted_step came together."""
    return hasattr(lib, "probe_session_mark_aborted")


def has_join_mark(lib):
    """Whether lib knows the join mark: probe_session_mark_joined and
    probe_trace_info.joined came together."""
    return hasattr(lib, "probe_session_mark_joined")


# ---- finding the library ----------------------------------------------------

# The SONAME's version: libprobe/CMakeLists.txt's SOVERSION (before 1.0 the
# minor version too: 0.x minors may differ in ABI; tests/python/test_core.py)
SOVERSION = "0.3"
_LIBNAMES = ("libampprobe.so", "libampprobe.so." + SOVERSION, "libampprobe.dylib")


def repo_root():
    """The repository this package sits in (python/ampprobe/_lib.py), or
    None when it was installed elsewhere."""
    root = pathlib.Path(__file__).resolve().parents[2]
    if (root / "include" / "ampprobe" / "probe.h").exists():
        return root
    return None


def candidates():
    """(where, path-or-name) in search order; names are for the loader."""
    out = []
    env = os.environ.get("AMPPROBE_LIB")
    if env:  # when set, it is the only candidate: no silent substitute
        return [("AMPPROBE_LIB", env)]
    prefix = os.environ.get("AMPPROBE_PREFIX")
    if prefix:
        for sub in ("lib", "lib64"):
            for n in _LIBNAMES:
                out.append(("AMPPROBE_PREFIX", os.path.join(prefix, sub, n)))
    found = ctypes.util.find_library("ampprobe")
    if found:
        out.append(("loader", found))
    root = repo_root()
    if root is not None:
        for n in _LIBNAMES:
            out.append(("build tree", str(root / "build" / "libprobe" / n)))
    return out


_lib = None
_lib_path = None


def _declare(lib):
    c = ctypes
    P = c.c_void_p
    st = c.c_int

    def fn(name, res, *args):
        f = getattr(lib, name)
        f.restype = res
        f.argtypes = list(args)
        return f

    fn("probe_status_str", c.c_char_p, st)
    fn("probe_status_name", c.c_char_p, st)
    fn("probe_kind_name", c.c_char_p, c.c_int)
    fn("probe_kind_parse", st, c.c_char_p, c.POINTER(c.c_int))
    fn("probe_site_name", c.c_char_p, c.c_int)
    fn("probe_options_init", None, c.POINTER(probe_options_buf))
    fn("probe_session_open", st, c.POINTER(P), c.c_char_p,
       c.POINTER(probe_options_buf))
    fn("probe_session_close", st, P)
    fn("probe_session_flush", st, P)
    fn("probe_session_last_error", c.c_char_p, P)
    fn("probe_session_first_nonfinite", st, P, c.POINTER(c.c_int64),
       c.POINTER(c.c_int32), c.POINTER(c.c_int), c.POINTER(c.c_int))
    fn("probe_layer_register", st, P, c.c_char_p, c.c_int, c.c_int,
       c.POINTER(c.c_int32))
    fn("probe_step_begin", st, P, c.c_int64)
    fn("probe_tensor_record", st, P, c.c_int32, c.c_int, c.c_int, P,
       c.c_size_t)
    fn("probe_step_set_scalars", st, P, c.POINTER(probe_step_scalars))
    fn("probe_scaler_transition", st, P, c.POINTER(probe_scaler_event))
    fn("probe_step_end", st, P)
    fn("probe_stats_compute", st, c.POINTER(probe_stats), c.c_int, P,
       c.c_size_t)
    fn("probe_trace_open", st, c.POINTER(P), c.c_char_p)
    fn("probe_trace_close", None, P)
    fn("probe_trace_last_error", c.c_char_p, P)
    fn("probe_trace_get_info", c.POINTER(probe_trace_info), P)
    fn("probe_trace_layers", c.POINTER(probe_layer_info), P,
       c.POINTER(c.c_size_t))
    for what, T in (("records", probe_record), ("steps", probe_step_scalars),
                    ("scaler_events", probe_scaler_event),
                    ("snapshots", probe_snapshot_info)):
        fn("probe_trace_read_" + what, st, P, c.c_int64, c.c_size_t,
           c.POINTER(T), c.POINTER(c.c_size_t))
    fn("probe_trace_read_snapshot_data", st, P,
       c.POINTER(probe_snapshot_info), c.POINTER(c.c_float))
    # Optional: the analysis API (include/ampprobe/analysis.h) and version.
    if has_join_mark(lib):
        fn("probe_session_mark_joined", st, P)
    if has_abort_mark(lib):
        fn("probe_session_mark_aborted", st, P, c.c_char_p)
    if hasattr(lib, "probe_session_step_nonfinite"):  # 0.3.x after ef00638
        fn("probe_session_step_nonfinite", st, P, c.POINTER(c.c_int64),
           c.POINTER(probe_nonfinite_record),
           c.POINTER(probe_nonfinite_record), c.POINTER(c.c_int))
    if hasattr(lib, "probe_postmortem_json"):
        fn("probe_postmortem_json", st, c.POINTER(c.c_char_p), c.c_size_t,
           c.POINTER(c.c_void_p))
        fn("probe_free", None, c.c_void_p)
    if hasattr(lib, "probe_postmortem_verdict"):
        fn("probe_postmortem_verdict", st, c.c_char_p, c.POINTER(c.c_int))
        fn("probe_verdict_name", c.c_char_p, c.c_int)
    # Isolated reading (a child process reads a file first): libraries
    # that have it; the package prefers it (a malformed file must not kill
    # the interpreter).
    if hasattr(lib, "probe_trace_open_isolated"):
        fn("probe_trace_open_isolated", st, c.POINTER(P), c.c_char_p,
           c.c_char_p, c.c_size_t)
    if hasattr(lib, "probe_postmortem_json_isolated"):
        fn("probe_postmortem_json_isolated", st, c.POINTER(c.c_char_p),
           c.c_size_t, c.POINTER(c.c_void_p))
        fn("probe_postmortem_verdict_isolated", st, c.c_char_p,
           c.POINTER(c.c_int))
    if hasattr(lib, "probe_postmortem_set_json_isolated"):
        fn("probe_postmortem_set_json_isolated", st, c.POINTER(c.c_char_p),
           c.c_size_t, c.POINTER(c.c_void_p))
    if hasattr(lib, "probe_text_escape"):
        fn("probe_text_escape", c.c_size_t, c.c_char_p, c.c_size_t,
           c.c_char_p)
    if hasattr(lib, "ampprobe_version"):
        fn("ampprobe_version", c.c_char_p)
    # Multi-rank traces (libraries that have them).
    if hasattr(lib, "probe_trace_set_expand"):
        fn("probe_digest64", c.c_uint64, c.c_void_p, c.c_size_t, c.c_uint64)
        fn("probe_rank_trace_path", st, c.c_char_p, c.c_size_t, c.c_char_p,
           c.c_int)
        fn("probe_trace_set_expand", st, c.POINTER(c.c_char_p), c.c_size_t,
           c.POINTER(c.POINTER(c.c_char_p)), c.POINTER(c.c_size_t))
        fn("probe_trace_set_free", None, c.POINTER(c.c_char_p), c.c_size_t)


def load():
    """Loads libampprobe (once) and returns the ctypes.CDLL. Raises OSError
    listing every place tried when none loads."""
    global _lib, _lib_path
    if _lib is not None:
        return _lib
    tried = []
    for where, path in candidates():
        if os.sep in path and not os.path.exists(path):
            tried.append("%s: %s (missing)" % (where, path))
            continue
        try:
            lib = ctypes.CDLL(path)
            _declare(lib)
        except (OSError, AttributeError) as e:
            tried.append("%s: %s (%s)" % (where, path, e))
            continue
        _lib, _lib_path = lib, path
        return lib
    raise OSError("ampprobe: cannot load libampprobe; tried:\n  " +
                  "\n  ".join(tried or ["nothing: set AMPPROBE_LIB"]) +
                  "\nSet AMPPROBE_LIB to the library's path or AMPPROBE_PREFIX "
                  "to the installation prefix (docs/python.md).")


def library_path():
    load()
    return _lib_path


def escape(s):
    """s with terminal controls written out as ampprobe writes names (\\n,
    \\e, \\xHH, ...: probe_text_escape), for messages; s unchanged when
    the library has no probe_text_escape."""
    lib = load()
    if not hasattr(lib, "probe_text_escape"):
        return s
    raw = s.encode(errors="surrogateescape") if isinstance(s, str) else bytes(s)
    raw = raw.split(b"\0", 1)[0]
    n = lib.probe_text_escape(None, 0, raw) + 1
    buf = ctypes.create_string_buffer(n)
    lib.probe_text_escape(buf, n, raw)
    return buf.value.decode(errors="replace")


def check(st, what, detail=None):
    """Raises ProbeError for a negative status. `what` and `detail` are
    shown escaped (a path or a name may hold terminal controls); a detail
    of "no error" (a stale last-error message) is left out."""
    if st >= 0:
        return st
    lib = load()
    msg = "%s: %s" % (escape(what), lib.probe_status_str(st).decode())
    if detail and detail != "no error":
        msg += ": " + escape(detail)
    raise ProbeError(st, msg, lib.probe_status_name(st).decode())


def kind_id(name):
    """The probe_kind of a name ("linear"), or None if this library does not
    know it."""
    v = ctypes.c_int(0)
    if load().probe_kind_parse(name.encode(), ctypes.byref(v)) < 0:
        return None
    return v.value


def kind_names():
    lib = load()
    out, k = [], 0
    while True:
        n = lib.probe_kind_name(k)
        if not n:
            return out
        out.append(n.decode())
        k += 1
