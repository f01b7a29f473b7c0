"""ampprobe.core - the torch-free core: a writing Session over libprobe, a
Trace reader giving NumPy structured arrays, and the post-mortem.

Buffers are handed to libprobe by pointer: a C-contiguous NumPy array of
float32, float16 or uint16 (bfloat16 bits; say dtype="bf16") is not copied.
Anything else (float64, a strided view) is converted to a contiguous float32
copy first, and Session.record says so in its return value.
"""
import ctypes
import json
import math
import numbers
import os
import shutil
import subprocess
import sys
import weakref

import numpy as np

from . import _lib
from ._lib import ProbeError, check

# ---- arguments handed to C --------------------------------------------------


def _cpath(path):
    """A path as the bytes C receives; ValueError for an embedded NUL (C
    would stop there and name another file), as open() does."""
    raw = os.fsencode(path)
    if b"\0" in raw:
        raise ValueError("embedded null byte in path %r" % (path,))
    return raw


def _cstr(s, what="string"):
    """A text argument (a name, an option) as UTF-8 bytes; ValueError for an
    embedded NUL."""
    raw = s.encode()
    if b"\0" in raw:
        raise ValueError("embedded null byte in %s %r" % (what, s))
    return raw


def _same_file(a, b):
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


_open_traces = weakref.WeakSet()  # Trace objects of this process, open
_open_sessions = weakref.WeakSet()  # Session objects of this process


def _locked_by_us(path):
    """The words for a trace libprobe found locked (ERR_LOCKED) when the
    writer holding it is a session of this process still open: a Tracer
    made by a notebook cell that raised before its close(), and kept by
    the cell's variable or the traceback, when the cell runs again. The
    message said "another writer", with no hint that it was the job's
    own; None when no open session here writes that file."""
    for s in list(_open_sessions):
        if not s.closed and _same_file(s.path, path):
            return ("the writer is a %s of this process that was not "
                    "closed (made earlier, still referenced: a notebook "
                    "cell re-run after an exception keeps the first): "
                    "call its close(), or make it with `with`" %
                    getattr(s, "owner", "Session"))
    return None


def _cint(v, lo, hi, what):
    """An integer argument in [lo, hi] (ctypes would wrap a larger one
    silently)."""
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
        raise TypeError("%s must be an integer, not %r" % (what, v))
    v = int(v)
    if not lo <= v <= hi:
        raise ValueError("%s %d out of range [%d, %d]" % (what, v, lo, hi))
    return v


def _choice(v, names, what):
    """The index of name v in names (an int passes when it is an index of
    names), or ValueError naming the argument and the choices (an int out
    of range got libprobe's 'bad layer / site / dtype', naming none)."""
    if isinstance(v, (int, np.integer)) and not isinstance(v, bool):
        if not 0 <= v < len(names):
            raise ValueError("%s %d out of range [0, %d] (one of: %s)" % (
                what, v, len(names) - 1,
                ", ".join(str(n) for n in names)))
        return int(v)
    try:
        return names.index(v)
    except ValueError:
        raise ValueError("unknown %s %r (one of: %s)" % (
            what, v, ", ".join(str(n) for n in names))) from None

_I64 = 2**63 - 1
_CINT = 2**31 - 1
# The numeric probe_options and the ranges probe_session_open accepts
# (probe.h): (kind, lo, hi). A value outside is refused before the open,
# naming the option and its range: libprobe's own message names none of
# them ("option out of range (mode, step_every, step_start, ...)"), and
# ctypes stores a too large int wrapped (ring_steps 2**32 + 8 was 8).
# Kind "int" refuses bools (step_every=True is no count), "flag" takes a
# bool or an int, "real" a number, NaN refused.
OPTION_RANGES = {
    "step_start": ("int", 0, _I64),
    "step_end": ("int", -2**63, _I64),  # negative: no end
    "step_every": ("int", 1, _I64),
    "ring_steps": ("int", 0, _lib.PROBE_RING_STEPS_MAX),
    "flush_seconds": ("real", 0.0, float("inf")),
    "flush_steps": ("int", 0, _I64),
    "snapshot_on_nonfinite": ("flag", -_CINT - 1, _CINT),
    "snapshot_max_elems": ("int", 0, 2**64 - 1),  # size_t
    "cupti": ("flag", -_CINT - 1, _CINT),
    "max_events": ("int", 0, _CINT),
    "batch_rows": ("int", 1, _I64),
    "overwrite": ("flag", -_CINT - 1, _CINT),
    "rank": ("int", -1, _CINT),
    "world_size": ("int", 0, _CINT),
}


def check_option(name, v, who="Session", arg=None):
    """A numeric probe_options value checked against OPTION_RANGES; the
    TypeError/ValueError names it as the caller's argument arg (default:
    the option's name) of who ("Tracer(every=0)")."""
    kind, lo, hi = OPTION_RANGES[name]
    arg = arg or name
    if kind == "real":
        ok = isinstance(v, (numbers.Real, np.floating, np.integer)) and \
            not isinstance(v, (bool, np.bool_))
        what = "a number >= %g" % lo
    else:
        ok = isinstance(v, (int, np.integer)) and (
            kind == "flag" or not isinstance(v, (bool, np.bool_)))
        what = ("a bool or an integer" if kind == "flag" else
                "an integer in [%d, %d]" % (lo, hi))
    if not ok:
        raise TypeError("ampprobe: %s(%s=...) takes %s; got %r" %
                        (who, arg, what, v))
    v = float(v) if kind == "real" else int(v)
    if not lo <= v <= hi:  # NaN fails too
        raise ValueError("ampprobe: %s(%s=%r): out of range; %s takes %s" %
                         (who, arg, v, arg, what))
    return v

def _one_element(name, v, who, what):
    """v itself, or the number a one-element array holds (a NumPy array or
    0-d array, a tensor, a JAX or CuPy scalar: anything with .item() and
    one element); an array of another size is a ValueError."""
    if isinstance(v, (numbers.Number, str, bytes)) or not hasattr(v, "item"):
        return v
    n = getattr(v, "size", None)
    if callable(n):  # torch: size() is the shape
        n = v.numel() if hasattr(v, "numel") else None
    if n != 1:
        shape = getattr(v, "shape", None)
        raise ValueError("ampprobe: %s(%s=...) takes %s; got an array of "
                         "shape %s (reduce it first, e.g. loss.mean())" %
                         (who, name, what, tuple(shape) if shape is not None
                          else "of %s elements" % n))
    return v.item()


def check_scalar(name, v, kind=float, who="set_scalars", lo=None,
                 tensors=False):
    """A step scalar argument `name` of who as a float (kind int: an int;
    "flag": 0 or 1, a bool too), None when None; else TypeError/ValueError
    naming the argument. A bool is no number (True is an int in Python):
    refused but for a flag (found_inf, skipped), where it is what it says;
    so is a string ("1.5" is not a loss). A one-element array (NumPy, a
    tensor, JAX) is its number. lo: a value below it is refused
    (a negative norm or loss scale); NaN and +inf pass (a diverged norm).
    tensors: the message says a tensor is taken too (the torch tracer)."""
    if v is None:
        return None
    what = "the step's scalar loss" if name == "loss" else "a scalar"
    takes = "a tensor or a number" if tensors else "a number"
    v = _one_element(name, v, who, what)
    if kind != "flag" and isinstance(v, (bool, np.bool_)):
        raise TypeError("ampprobe: %s(%s=...) takes %s (%s); got a bool, %r"
                        % (who, name, what, takes, v))
    if isinstance(v, np.bool_):
        v = bool(v)
    if isinstance(v, (str, bytes)) or not isinstance(v, numbers.Real):
        raise TypeError("ampprobe: %s(%s=...) takes %s (%s); got %s" %
                        (who, name, what, takes, type(v).__name__))
    try:
        f = float(v)
    except OverflowError:  # an int past binary64
        raise ValueError("ampprobe: %s(%s=...): %r is past binary64" %
                         (who, name, v)) from None
    if kind is not float and not (math.isfinite(f) and v == int(v) and
                                  -2 ** 31 <= v < 2 ** 31):
        raise ValueError("ampprobe: %s(%s=...) takes an integer (32-bit); "
                         "got %r" % (who, name, v))
    if lo is not None and v < lo:
        raise ValueError("ampprobe: %s(%s=...) takes a number >= %s (NaN "
                         "or inf for a diverged one); got %r" %
                         (who, name, lo, v))
    if kind == "flag" and v not in (0, 1):
        raise ValueError("ampprobe: %s(%s=...) takes 0 or 1 (or a bool); "
                         "got %r" % (who, name, v))
    return float(v) if kind is float else int(v)

# ---- NumPy views of the C structs ------------------------------------------


def _np_type(ct):
    if issubclass(ct, ctypes.Array):
        return (_np_type(ct._type_), (ct._length_,))
    m = {ctypes.c_int64: "<i8", ctypes.c_uint64: "<u8", ctypes.c_int32: "<i4",
         ctypes.c_uint32: "<u4", ctypes.c_float: "<f4", ctypes.c_double: "<f8",
         ctypes.c_int: "<i4"}
    for k, v in m.items():
        if ct is k:
            return np.dtype(v)
    raise TypeError(ct)


def _flat_dtype(struct, base=0, out=None):
    """A NumPy dtype with the C struct's fields at its offsets, nested
    structs flattened (probe_record's stats fields appear at top level, as
    h5py shows /records)."""
    top = out is None
    if top:
        out = {"names": [], "formats": [], "offsets": []}
    for name, ct in struct._fields_:
        off = base + getattr(struct, name).offset
        if isinstance(ct, type) and issubclass(ct, ctypes.Structure):
            _flat_dtype(ct, off, out)
            continue
        if issubclass(ct, ctypes.Array) and ct._type_ is ctypes.c_char:
            fmt = np.dtype("S%d" % ct._length_)
        else:
            fmt = _np_type(ct)
            if isinstance(fmt, tuple):
                fmt = np.dtype(fmt)
        out["names"].append(name)
        out["formats"].append(fmt)
        out["offsets"].append(off)
    if top:
        out["itemsize"] = ctypes.sizeof(struct)
        return np.dtype(out)
    return out


RECORD_DTYPE = _flat_dtype(_lib.probe_record)
STEP_DTYPE = _flat_dtype(_lib.probe_step_scalars)
SCALER_EVENT_DTYPE = _flat_dtype(_lib.probe_scaler_event)
LAYER_DTYPE = _flat_dtype(_lib.probe_layer_info)
SNAPSHOT_DTYPE = _flat_dtype(_lib.probe_snapshot_info)

_NP_DTYPES = {np.dtype(np.float32): 0, np.dtype(np.float16): 1}
_F32_MAX = float(np.finfo(np.float32).max)


def _to_float32(a):
    """a (float64, an integer array, a strided view) as a contiguous
    float32 array: finite values beyond float32's range saturated at
    +-3.4e38, not turned into inf (a healthy float64 array holding 2.7e43
    read as holding inf); inf and NaN kept."""
    a = np.asarray(a)
    if a.dtype.kind == "f" and a.dtype.itemsize > 4:
        a = np.where(np.isinf(a), a, np.clip(a, -_F32_MAX, _F32_MAX))
    return np.ascontiguousarray(a, dtype=np.float32)


_DT_IDS = {"fp32": 0, "fp16": 1, "bf16": 2}


def _site_id(site):
    return _choice(site, list(_lib.SITES), "site")


def _prec_id(p):
    return _choice(p, list(_lib.PRECISIONS), "precision")


def _kind_id(kind):
    if isinstance(kind, int):
        return kind
    k = _lib.kind_id(kind)
    if k is None:
        raise ValueError("unknown module kind %r (this library knows: %s)" %
                         (kind, ", ".join(_lib.kind_names())))
    return k


# ---- writing ------------------------------------------------------------------


def _close_handle(lib, handle_box):
    """Finalizer: closes a session still open when its owner is collected or
    the interpreter exits (atexit runs weakref.finalize callbacks)."""
    h = handle_box[0]
    if h:
        handle_box[0] = None
        lib.probe_session_close(h)


class Session:
    """One trace being written (probe_session). Options are those of
    probe_options (probe.h): mode "full" or "scalars" (the flight recorder),
    layer_select (comma-separated globs), step_start/step_end/step_every,
    ring_steps, flush_seconds, flush_steps, snapshot_on_nonfinite,
    snapshot_max_elems, command_line, config_json, precision_policy,
    max_events. The file is closed by close(), by `with`, when the object is
    collected, or at interpreter exit, whichever comes first."""

    def __init__(self, path, mode="full", **options):
        lib = _lib.load()
        self._lib = lib
        self._hold = []  # buffers recorded this step (valid until end_step)
        buf = _lib.probe_options_buf()
        lib.probe_options_init(ctypes.byref(buf))
        o = buf.opt
        if isinstance(mode, str) and mode not in _lib.MODES:
            raise ValueError("unknown mode %r (one of: %s)" % (
                mode, ", ".join(_lib.MODES)))
        o.mode = _lib.MODES[mode] if isinstance(mode, str) else int(mode)
        self._keep = []  # C strings must outlive the open call
        for k, v in options.items():
            if v is None:
                continue
            if not hasattr(o, k):
                raise TypeError("unknown session option %r" % k)
            if k in ("layer_select", "command_line", "config_json",
                     "precision_policy", "run_id"):
                if not isinstance(v, str):
                    v = json.dumps(v) if k == "config_json" else str(v)
                b = _cstr(v, k)
                self._keep.append(b)
                setattr(o, k, b)
            elif k in OPTION_RANGES:
                setattr(o, k, check_option(k, v))
            else:
                setattr(o, k, v)
        raw = _cpath(path)
        if options.get("overwrite"):
            for t in list(_open_traces):
                if t._h and _same_file(t.path, path):
                    raise ProbeError(-19, "probe_session_open(%s): %s is open "
                                     "for reading in this process (close the "
                                     "Trace first)" % (_lib.escape(os.fsdecode(raw)),
                                                       _lib.escape(t.path)),
                                     "ERR_LOCKED")
        h = ctypes.c_void_p()
        st = lib.probe_session_open(ctypes.byref(h), raw, ctypes.byref(buf))
        if st < 0:
            e = lib.probe_session_last_error(None)
            e = e.decode(errors="replace") if e else None
            if lib.probe_status_name(st) == b"ERR_LOCKED":
                ours = _locked_by_us(path)
                if ours:
                    e = "%s; %s" % (e, ours) if e else ours
            check(st, "probe_session_open(%s)" % path, e)
        self.path = os.fspath(path)
        self.owner = "Session"  # who made it, for _locked_by_us (Tracer)
        self._box = [h.value]
        self._finalizer = weakref.finalize(self, _close_handle, lib, self._box)
        _open_sessions.add(self)
        self.layers = {}  # name -> id
        self.step = None

    @property
    def handle(self):
        if not self._box[0]:
            raise ProbeError(-10, "session is closed", "ERR_STATE")
        return self._box[0]

    @property
    def closed(self):
        return not self._box[0]

    def _check(self, st, what):
        if st < 0:
            e = self._lib.probe_session_last_error(self._box[0])
            check(st, what, e.decode(errors="replace") if e else None)
        return st

    def register(self, name, kind="other", precision="fp32"):
        """Registers a layer; returns its id (0, 1, ...)."""
        lid = ctypes.c_int32(-1)
        self._check(self._lib.probe_layer_register(
            self.handle, _cstr(name, "layer name"), _kind_id(kind), _prec_id(precision),
            ctypes.byref(lid)), "probe_layer_register(%s)" % name)
        self.layers[name] = lid.value
        return lid.value

    def begin_step(self, step):
        step = _cint(step, 0, 2**63 - 1, "step")
        self._check(self._lib.probe_step_begin(self.handle, step),
                    "probe_step_begin(%d)" % step)
        self.step = step

    def record_ptr(self, layer, site, dtype, ptr, n):
        """Records n elements at address ptr (host or CUDA device memory),
        dtype "fp32", "fp16" or "bf16". The memory must stay valid and
        unchanged until end_step (libprobe may snapshot it)."""
        # checked here, each named (libprobe's message is "bad layer / site
        # / dtype", and ctypes would wrap a negative n to a huge size_t)
        layer = _cint(layer, 0, _CINT, "record layer")
        dt = _choice(dtype, list(_lib.DTYPES), "dtype")
        n = _cint(n, 0, _I64, "record n")
        self._check(self._lib.probe_tensor_record(
            self.handle, layer, _site_id(site), dt,
            ctypes.c_void_p(ptr), n), "probe_tensor_record")

    def record(self, layer, site, array, dtype=None):
        """Records a NumPy array (or a host DLPack producer, viewed through
        np.from_dlpack without a copy). float32 and float16 C-contiguous arrays go
        by pointer; uint16 arrays are bfloat16 bits when dtype="bf16" (by
        pointer). Others are copied to float32. Returns the array libprobe
        read (keep it alive and unchanged until end_step: the session does,
        in a list cleared at end_step). Returns (array, copied)."""
        dtype = _dtype_arg(dtype, array)
        array = _host_array(array)  # host DLPack producers: no copy
        a = np.asarray(array)
        copied = False
        if dtype == "bf16":
            if a.dtype != np.uint16:
                raise TypeError("bf16 buffers are uint16 arrays of the bits")
            dt = 2
        elif a.dtype in _NP_DTYPES:
            dt = _NP_DTYPES[a.dtype]
        else:
            a = _to_float32(a)
            dt, copied = 0, True
        if not a.flags.c_contiguous:
            a = np.ascontiguousarray(a)
            copied = True
        self._hold.append(a)
        self.record_ptr(layer, site, dt, a.ctypes.data, a.size)
        return a, copied

    def set_scalars(self, loss=None, loss_scale=None, growth_tracker=None,
                    found_inf=None, skipped=None, lr=None, grad_norm=None,
                    clip_threshold=None, clip_coef=None, weight_digest=None):
        """The step's scalars. A scalar left None was not measured: it is
        stored as NaN (0 for the scaler's ints and the weight digest) with
        its PROBE_SCALAR_* bit in `unmeasured`, so that readers tell it from
        a measured NaN (the scaler's three ints go together, as do
        clip_threshold/clip_coef). weight_digest: a probe_digest64 value
        (digest64(); ampprobe.torch.Tracer(weight_digest=True))."""
        loss = check_scalar("loss", loss)
        loss_scale = check_scalar("loss_scale", loss_scale, lo=0)
        growth_tracker = check_scalar("growth_tracker", growth_tracker, int)
        found_inf = check_scalar("found_inf", found_inf, "flag")
        skipped = check_scalar("skipped", skipped, "flag")
        lr = check_scalar("lr", lr)
        grad_norm = check_scalar("grad_norm", grad_norm, lo=0)
        clip_threshold = check_scalar("clip_threshold", clip_threshold, lo=0)
        clip_coef = check_scalar("clip_coef", clip_coef)
        nan = float("nan")
        bits = 0
        if loss is None:
            bits |= _lib.SCALAR_LOSS
        if loss_scale is None:
            bits |= _lib.SCALAR_LOSS_SCALE
        if growth_tracker is None and found_inf is None and skipped is None:
            bits |= _lib.SCALAR_SCALER
        if lr is None:
            bits |= _lib.SCALAR_LR
        if grad_norm is None:
            bits |= _lib.SCALAR_GRAD_NORM
        if clip_threshold is None and clip_coef is None:
            bits |= _lib.SCALAR_CLIP
        if weight_digest is None:
            if _has_digest_field():
                bits |= SCALAR_WEIGHT_DIGEST  # (older libraries refuse it)
        elif not _has_digest_field():
            raise ProbeError(-14, "set_scalars: this libampprobe's steps "
                             "have no weight_digest", "ERR_UNSUPPORTED")
        f = lambda v, d: float(d if v is None else v)
        sc = _lib.probe_step_scalars(
            0, f(loss, nan), f(loss_scale, nan), int(growth_tracker or 0),
            int(found_inf or 0), int(skipped or 0), bits, f(lr, nan),
            f(grad_norm, nan), f(clip_threshold, nan), f(clip_coef, nan), 0.0)
        if weight_digest is not None:
            sc.weight_digest = int(weight_digest) & 0xFFFFFFFFFFFFFFFF
        self._check(self._lib.probe_step_set_scalars(self.handle,
                                                     ctypes.byref(sc)),
                    "probe_step_set_scalars")

    def scaler_event(self, kind, old_scale, new_scale, growth_tracker=0):
        """kind: "backoff", "growth", "hysteresis" or "min_clamp"."""
        k = _choice(kind, list(_lib.SCALER_KINDS), "scaler event kind")
        ev = _lib.probe_scaler_event(self.step if self.step is not None else 0,
                                     k, float(old_scale), float(new_scale),
                                     int(growth_tracker))
        self._check(self._lib.probe_scaler_transition(self.handle,
                                                      ctypes.byref(ev)),
                    "probe_scaler_transition")

    def end_step(self):
        try:
            self._check(self._lib.probe_step_end(self.handle),
                        "probe_step_end")
        finally:
            self._hold.clear()

    def first_nonfinite(self):
        """(step, layer_id, site_name, covers_all), step -1 when none, over
        the steps ended so far (probe_session_first_nonfinite)."""
        step = ctypes.c_int64(-1)
        layer = ctypes.c_int32(-1)
        site = ctypes.c_int(0)
        cov = ctypes.c_int(0)
        self._check(self._lib.probe_session_first_nonfinite(
            self.handle, ctypes.byref(step), ctypes.byref(layer),
            ctypes.byref(site), ctypes.byref(cov)),
            "probe_session_first_nonfinite")
        return (step.value, layer.value,
                _lib.SITES[site.value] if step.value >= 0 else None,
                bool(cov.value))

    def step_nonfinite(self):
        """(step, first, first_forward, measured) of the step ended last
        (probe_session_step_nonfinite; step -1 before the first): its first
        record holding NaN or inf, and its first at a forward site, each
        None or (layer_id, site_name, (nan, +inf, -inf, count)) as the
        session computed them when recorded; measured is False when the
        session left some of the step's records out (or when the library
        is older than this call: (-1, None, None, False))."""
        if not hasattr(self._lib, "probe_session_step_nonfinite"):
            return -1, None, None, False
        step = ctypes.c_int64(-1)
        rec = (_lib.probe_nonfinite_record(), _lib.probe_nonfinite_record())
        meas = ctypes.c_int(0)
        self._check(self._lib.probe_session_step_nonfinite(
            self.handle, ctypes.byref(step), ctypes.byref(rec[0]),
            ctypes.byref(rec[1]), ctypes.byref(meas)),
            "probe_session_step_nonfinite")
        out = [None, None]
        for i, r in enumerate(rec):
            if r.layer >= 0:
                out[i] = (r.layer, _lib.SITES[r.site],
                          (r.nan_count, r.posinf_count, r.neginf_count,
                           r.count))
        return step.value, out[0], out[1], bool(meas.value)

    def flush(self):
        self._check(self._lib.probe_session_flush(self.handle),
                    "probe_session_flush")

    def mark_joined(self):
        """Marks that this rank left the training loop by joining after
        the last step it ended (uneven inputs: DDP's join()): the rank
        set's post-mortem then does not call its trace, once closed,
        "ended early" (probe_session_mark_joined). Outside a step
        (ERR_STATE inside one); the next begin_step clears it. ProbeError
        ERR_UNSUPPORTED when this libampprobe predates the mark."""
        if not _lib.has_join_mark(self._lib):
            raise ProbeError(-14, "mark_joined: not in this libampprobe (%s)"
                             % _lib.library_path(), "ERR_UNSUPPORTED")
        self._check(self._lib.probe_session_mark_joined(self.handle),
                    "probe_session_mark_joined")

    def mark_aborted(self, reason):
        """Marks that the job is ending abnormally (reason: what ended it,
        "KeyboardInterrupt", "exception RuntimeError"): the close that
        follows writes every row but leaves the trace not complete and
        records the reason (probe_session_mark_aborted), so the post-mortem
        does not call the run finished. The first mark holds. Returns False
        (and marks nothing) when this libampprobe predates the mark."""
        if not _lib.has_abort_mark(self._lib):
            return False
        r = str(reason).encode("utf-8", "backslashreplace") or b"aborted"
        self._check(self._lib.probe_session_mark_aborted(self.handle, r),
                    "probe_session_mark_aborted")
        return True

    def disown(self):
        """Forgets the session without a call to libprobe: in a child of
        fork() the session is the parent's copy, which libprobe refuses
        (PROBE_ERR_STATE) and neither writes nor frees there. Closed from
        here on, as far as this object is concerned."""
        self._box[0] = None
        self._finalizer.detach()

    def close(self):
        h = self._box[0]
        if not h:
            return
        self._box[0] = None
        self._finalizer.detach()
        st = self._lib.probe_session_close(h)
        if st < 0:
            e = self._lib.probe_session_last_error(None)
            check(st, "probe_session_close", e.decode() if e else None)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


# ---- multi-rank jobs: the naming rule, trace sets, the weight digest -----------

# PROBE_SCALAR_WEIGHT_DIGEST: the steps' weight_digest was not measured.
SCALAR_WEIGHT_DIGEST = _lib.SCALAR_WEIGHT_DIGEST


def _has_digest_field():
    """Whether the steps have weight_digest: the mirror has the field and
    the library has probe_digest64 (they came together)."""
    return hasattr(_lib.load(), "probe_digest64") and any(
        n == "weight_digest" for n, _ in _lib.probe_step_scalars._fields_)


def _cfn(name, res, *args):
    """A library function declared on first use; ProbeError
    ERR_UNSUPPORTED when this libampprobe predates it."""
    lib = _lib.load()
    f = getattr(lib, name, None)
    if f is None:
        raise ProbeError(-14, "%s: not in this libampprobe (%s)" % (
            name, _lib.library_path()), "ERR_UNSUPPORTED")
    if getattr(f, "_ampprobe_declared", False) is False:
        f.restype = res
        f.argtypes = list(args)
        f._ampprobe_declared = True
    return f


def rank_trace_path(path, rank):
    """The trace path of one rank (probe_rank_trace_path, the library's
    naming rule): "{rank}" in path -> the rank; else "x.h5" ->
    "x.rank{r}.h5"; else ".rank{r}.h5" appended."""
    fn = _cfn("probe_rank_trace_path", ctypes.c_int, ctypes.c_char_p,
              ctypes.c_size_t, ctypes.c_char_p, ctypes.c_int)
    raw = _cpath(path)
    rank = _cint(rank, 0, 2**31 - 1, "rank")
    cap = 2 * len(raw) + 64 + 16 * raw.count(b"{rank}")
    out = ctypes.create_string_buffer(cap)
    check(fn(out, cap, raw, rank),
          "probe_rank_trace_path(%s, %d)" % (os.fsdecode(raw), rank))
    return os.fsdecode(out.value)


def _flatten_args(args):
    out = []
    for a in args:
        if isinstance(a, (list, tuple)):
            out.extend(_flatten_args(a))
        else:
            out.append(os.fspath(a))
    return out


def trace_set(*args):
    """The trace files of a set (probe_trace_set_expand): each argument a
    directory (its *.h5 files), a glob pattern or a file, or a list of
    them; deduplicated, in natural order (rank2 before rank10)."""
    c = ctypes
    fn = _cfn("probe_trace_set_expand", c.c_int, c.POINTER(c.c_char_p),
              c.c_size_t, c.POINTER(c.POINTER(c.c_char_p)),
              c.POINTER(c.c_size_t))
    free = _cfn("probe_trace_set_free", None, c.POINTER(c.c_char_p),
                c.c_size_t)
    names = _flatten_args(args)
    arr = (c.c_char_p * max(len(names), 1))(*[_cpath(a) for a in names])
    res = c.POINTER(c.c_char_p)()
    n = c.c_size_t(0)
    st = fn(arr, len(names), c.byref(res), c.byref(n))
    if st < 0:
        e = _lib.load().probe_trace_last_error(None)
        check(st, "trace set %s" % " ".join(names),
              e.decode(errors="replace") if e else None)
    try:
        return [os.fsdecode(res[i]) for i in range(n.value)]
    finally:
        if res:
            free(res, n.value)


DIGEST64_INIT = _lib.PROBE_DIGEST64_INIT  # FNV-1a 64's offset basis


def digest64_init():
    return DIGEST64_INIT


def digest64_fn():
    """The library's probe_digest64(ptr, nbytes, h) -> h, declared."""
    return _cfn("probe_digest64", ctypes.c_uint64, ctypes.c_void_p,
                ctypes.c_size_t, ctypes.c_uint64)


def digest64(data, h=None):
    """probe_digest64 of a buffer (bytes, or an array's bytes: a NumPy
    array or a host DLPack producer such as a CPU torch tensor), chained
    from h (PROBE_DIGEST64_INIT when None)."""
    fn = digest64_fn()
    if isinstance(data, (bytes, bytearray, memoryview)):
        a = np.frombuffer(bytes(data), dtype=np.uint8)
    else:
        data = _host_array(data)
        if not isinstance(data, np.ndarray):
            raise TypeError("digest64 takes bytes or an array, not %s" %
                            type(data).__name__)
        if data.dtype.hasobject:
            raise TypeError("digest64: an array of Python objects has no "
                            "bytes to digest")
        a = np.ascontiguousarray(data)
    h = DIGEST64_INIT if h is None else _cint(h, 0, 2**64 - 1, "h")
    return int(fn(a.ctypes.data if a.size else None, a.nbytes, h))


def _is_torch_bf16(x):
    return str(getattr(x, "dtype", "")) == "torch.bfloat16"


def _dtype_arg(dtype, array):
    """The dtype argument of record/stats: None, or one of _DT_IDS ("bf16"
    by default for a torch bfloat16 tensor); ValueError otherwise."""
    if dtype is None and _is_torch_bf16(array):
        return "bf16"
    if dtype is not None and dtype not in _DT_IDS:
        raise ValueError("unknown dtype %r (one of: %s)" % (dtype, ", ".join(_DT_IDS)))
    return dtype


def _host_array(x):
    """A NumPy view of a host array-like: NumPy arrays pass; a DLPack
    producer (a CPU torch tensor) is viewed without a copy, bfloat16 ones
    (which NumPy has no type for) as their uint16 bits. Anything else is
    returned as it is."""
    if isinstance(x, np.ndarray) or not hasattr(x, "__dlpack__"):
        return x
    if _is_torch_bf16(x):
        import torch  # only reached with a torch tensor
        return np.from_dlpack(x.view(torch.int16)).view(np.uint16)
    return np.from_dlpack(x)


def stats(array, dtype=None):
    """The probe_stats of one buffer (probe_stats_compute) as a dict."""
    lib = _lib.load()
    dtype = _dtype_arg(dtype, array)
    array = _host_array(array)
    a = np.ascontiguousarray(array)
    if a.dtype.hasobject:
        raise TypeError("stats: an array of Python objects")
    if dtype is not None:  # the array must hold that format's bits
        want = {"fp32": (np.float32,), "fp16": (np.float16, np.uint16),
                "bf16": (np.uint16, np.int16)}[dtype]
        if a.dtype not in [np.dtype(w) for w in want]:
            raise TypeError("stats(dtype=%r) reads %s; got a %s array" % (
                dtype, " or ".join(np.dtype(w).name for w in want), a.dtype))
        dt = _DT_IDS[dtype]
    elif a.dtype in _NP_DTYPES:
        dt = _NP_DTYPES[a.dtype]
    else:
        a, dt = _to_float32(a), 0
    s = _lib.probe_stats()
    check(lib.probe_stats_compute(ctypes.byref(s), dt,
                                  ctypes.c_void_p(a.ctypes.data), a.size),
          "probe_stats_compute")
    out = {n: getattr(s, n) for n, _ in s._fields_ if n != "hist"}
    out["hist"] = list(s.hist)
    return out


# ---- reading ------------------------------------------------------------------


class Trace:
    """A trace opened with libprobe's validating reader (probe_trace_open).
    Tables come back as NumPy structured arrays with the field names of
    docs/trace-format.md: records(), steps(), scaler_events(), layers(),
    snapshots(); info is a dict of the root attributes and counts."""

    def __init__(self, path):
        lib = _lib.load()
        self._lib = lib
        h = ctypes.c_void_p()
        raw = _cpath(path)
        if hasattr(lib, "probe_trace_open_isolated"):  # a crash is an error
            st = lib.probe_trace_open_isolated(ctypes.byref(h), raw, None, 0)
        else:
            st = lib.probe_trace_open(ctypes.byref(h), raw)
        if st < 0:
            e = lib.probe_trace_last_error(None)
            check(st, "probe_trace_open(%s)" % path,
                  e.decode(errors="replace") if e else None)
        self._h = h.value
        self.path = os.fspath(path)
        _open_traces.add(self)
        p = lib.probe_trace_get_info(self._h).contents
        self.info = {}
        for name, ct in p._fields_:
            if name == "joined" and not _lib.has_join_mark(lib):
                continue  # past the end of an older library's struct
            if name in ("aborted", "aborted_step") and not _lib.has_abort_mark(lib):
                continue  # likewise (a pointer read there could crash)
            if name == "unwritten":
                continue  # likewise, and nothing tells which library has it
            v = getattr(p, name)
            if ct is ctypes.c_char_p:
                v = v.decode(errors="replace") if v else ""
            self.info[name] = v
        n = ctypes.c_size_t(0)
        lp = lib.probe_trace_layers(self._h, ctypes.byref(n))
        arr = np.zeros(n.value, dtype=LAYER_DTYPE)
        if n.value:
            ctypes.memmove(arr.ctypes.data, lp,
                           n.value * ctypes.sizeof(_lib.probe_layer_info))
        self._layers = arr

    def close(self):
        if self._h:
            self._lib.probe_trace_close(self._h)
            self._h = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def _read(self, what, ctype, dtype, total, chunk=4096, start=0,
              count=None, fields=None):
        """Rows [start, start + count) of a table (to its end when count is
        None), in chunks of `chunk` rows; fields: the names to keep (a
        smaller array: a full record is 648 bytes in memory)."""
        fn = getattr(self._lib, "probe_trace_read_" + what)
        total = max(int(total), 0)
        start = int(start)
        if start < 0:
            raise ValueError("start must be >= 0, not %d" % start)
        end = total if count is None else min(total, start + max(int(count), 0))
        n_out = max(end - start, 0)
        if fields is None:
            out, buf = np.zeros(n_out, dtype=dtype), None
        else:
            names = [fields] if isinstance(fields, str) else list(fields)
            bad = [f for f in names if f not in dtype.names]
            if bad or not names:
                raise ValueError("unknown field(s) %r; a %s row has %s" % (
                    bad or names, what, ", ".join(dtype.names)))
            out = np.zeros(n_out, dtype=[(f, dtype.fields[f][0]) for f in names])
            buf = np.zeros(min(chunk, n_out) or 1, dtype=dtype)
        got = ctypes.c_size_t(0)
        done = 0
        while done < n_out:
            n = min(chunk, n_out - done)
            base = (buf.ctypes.data if buf is not None
                    else out.ctypes.data + done * dtype.itemsize)
            st = fn(self._h, start + done, n,
                    ctypes.cast(base, ctypes.POINTER(ctype)), ctypes.byref(got))
            if st < 0:
                e = self._lib.probe_trace_last_error(self._h)
                check(st, "probe_trace_read_" + what,
                      e.decode(errors="replace") if e else None)
            if got.value == 0:
                break
            if buf is not None:
                for f in out.dtype.names:
                    out[f][done:done + got.value] = buf[f][:got.value]
            done += got.value
        return out[:done]

    def layers(self):
        return self._layers.copy()

    def layer_names(self):
        return [n.decode(errors="replace") for n in self._layers["name"]]

    def records(self, start=0, count=None, fields=None):
        """The records table, rows [start, start + count) (all of it by
        default), as a structured array; fields ("step", "layer", "site",
        "absmax", ...) keeps only those columns. A full row takes 648 bytes
        in memory, some 10-30x its size in the file: for a long trace read
        it in slices or with iter_records(), or keep a few fields."""
        return self._read("records", _lib.probe_record, RECORD_DTYPE,
                          self.info["n_records"], start=start, count=count,
                          fields=fields)

    def iter_records(self, chunk_rows=65536, fields=None):
        """The records table in arrays of at most chunk_rows rows, in
        order: memory bounded by one chunk, whatever the trace's length."""
        chunk_rows = int(chunk_rows)
        if chunk_rows < 1:
            raise ValueError("chunk_rows must be >= 1, not %d" % chunk_rows)
        for s in range(0, int(self.info["n_records"]), chunk_rows):
            part = self.records(s, chunk_rows, fields)
            if len(part) == 0:
                return
            yield part

    def steps(self, start=0, count=None, fields=None):
        """The steps table, rows [start, start + count); fields as in
        records()."""
        return self._read("steps", _lib.probe_step_scalars, STEP_DTYPE,
                          self.info["n_steps"], start=start, count=count,
                          fields=fields)

    def scaler_events(self):
        return self._read("scaler_events", _lib.probe_scaler_event,
                          SCALER_EVENT_DTYPE, self.info["n_scaler_events"])

    def snapshots(self):
        return self._read("snapshots", _lib.probe_snapshot_info,
                          SNAPSHOT_DTYPE, self.info["n_snapshots"])

    def snapshot_data(self, row):
        """The float32 values of one snapshot (a row of snapshots())."""
        sn = _lib.probe_snapshot_info(*(int(row[n]) for n, _ in
                                        _lib.probe_snapshot_info._fields_))
        n = int(row["n"])
        if not 0 <= n <= self.info.get("n_snapshot_elems", n):
            raise ProbeError(-1, "snapshot_data: a row of %d values does not "
                             "fit this trace's %d snapshot values" % (
                                 n, self.info.get("n_snapshot_elems", 0)),
                             "ERR_INVALID_ARG")
        out = np.zeros(n, dtype=np.float32)
        st = self._lib.probe_trace_read_snapshot_data(
            self._h, ctypes.byref(sn),
            out.ctypes.data_as(ctypes.POINTER(ctypes.c_float)))
        if st < 0:
            check(st, "probe_trace_read_snapshot_data")
        return out


def read_trace(path):
    """Every table of a trace as NumPy structured arrays:
    {"info", "layers", "records", "steps", "scaler_events", "snapshots"}."""
    with Trace(path) as t:
        return {"info": dict(t.info), "layers": t.layers(),
                "records": t.records(), "steps": t.steps(),
                "scaler_events": t.scaler_events(),
                "snapshots": t.snapshots()}


# ---- the post-mortem ----------------------------------------------------------


def find_cli():
    """The `ampprobe` executable: $AMPPROBE_CLI, beside the library
    (<prefix>/bin for an installed one, <build>/tools for the build tree),
    then PATH. None when there is none."""
    env = os.environ.get("AMPPROBE_CLI")
    if env:
        return env
    try:
        libdir = os.path.dirname(os.path.abspath(_lib.library_path()))
    except OSError:
        libdir = None
    if libdir:
        for rel in ("../bin/ampprobe", "../tools/ampprobe", "ampprobe"):
            p = os.path.normpath(os.path.join(libdir, rel))
            if os.access(p, os.X_OK) and os.path.isfile(p):
                return p
    root = _lib.repo_root()
    if root is not None:
        p = root / "build" / "tools" / "ampprobe"
        if os.access(str(p), os.X_OK):
            return str(p)
    return shutil.which("ampprobe")


def _json_loads(text):
    # ampprobe writes non-finite numbers as strings or bare tokens; accept
    # both NaN/Infinity spellings.
    return json.loads(text)


def postmortem(path, *more_paths):
    """The structured post-mortem of a trace, as a dict: the same document
    `ampprobe postmortem --json` prints ("event": {"step", "phase",
    "origin_layer", "origin_kind", "origin_site", ...}, "diagnosis", ...).

    Several traces (the ranks of one job): arguments are files,
    directories (their *.h5 files), glob patterns or lists of them,
    expanded by trace_set() (the library's probe_trace_set_expand); the
    document is then the cross-rank one when the set has several files, or
    when a directory or glob held one rank file of a job of several ranks
    (its missing ranks are named; the file named alone gets the
    one-process document).

    Uses the C analysis API (probe_postmortem_json) when the library has it,
    otherwise runs the `ampprobe postmortem --json` command (find_cli())."""
    lib = _lib.load()
    paths = _flatten_args((path,) + more_paths)
    # A directory, a glob or several names are a set, in which one rank
    # file of a bigger job is a set of one: its missing ranks are named.
    as_set = len(paths) != 1 or not os.path.isfile(paths[0])
    if hasattr(lib, "probe_trace_set_expand"):
        paths = trace_set(paths)
    if hasattr(lib, "probe_postmortem_json"):
        arr = (ctypes.c_char_p * len(paths))(*[_cpath(p) for p in paths])
        out = ctypes.c_void_p()
        if as_set and hasattr(lib, "probe_postmortem_set_json_isolated"):
            fn = lib.probe_postmortem_set_json_isolated
        else:
            fn = (lib.probe_postmortem_json_isolated  # a crash is an error
                  if hasattr(lib, "probe_postmortem_json_isolated")
                  else lib.probe_postmortem_json)
        st = fn(arr, len(paths), ctypes.byref(out))
        try:
            if st < 0:
                e = lib.probe_trace_last_error(None)
                check(st, "probe_postmortem_json(%s)" % ", ".join(paths),
                      e.decode(errors="replace") if e else None)
            text = ctypes.string_at(out.value).decode()
        finally:
            if out.value:
                lib.probe_free(out)
        return _json_loads(text)
    cli = find_cli()
    if cli is None:
        raise ProbeError(-14, "postmortem: this libampprobe has no analysis "
                         "API and no `ampprobe` command was found (set "
                         "AMPPROBE_CLI)", "ERR_UNSUPPORTED")
    r = subprocess.run([cli, "postmortem", "--json"] + paths,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if r.returncode not in (0, 1):
        raise ProbeError(-3, "ampprobe postmortem exit %d: %s" % (
            r.returncode, r.stderr.decode(errors="replace").strip()),
            "ERR_IO")
    return _json_loads(r.stdout.decode())


def verdict(path, *more_paths):
    """The post-mortem's verdict: "healthy", "degraded" or "diverged". Of
    one trace file (probe_postmortem_verdict; with an older library, from
    the post-mortem document); of a set - a directory, a glob, several
    files, as postmortem() takes them - the cross-rank document's."""
    lib = _lib.load()
    if more_paths or not isinstance(path, (str, bytes, os.PathLike)) or \
            not os.path.isfile(os.fspath(path)):
        return postmortem(path, *more_paths)["verdict"]
    if hasattr(lib, "probe_postmortem_verdict"):
        v = ctypes.c_int(-1)
        fn = (lib.probe_postmortem_verdict_isolated
              if hasattr(lib, "probe_postmortem_verdict_isolated")
              else lib.probe_postmortem_verdict)
        st = fn(_cpath(path), ctypes.byref(v))
        if st < 0:
            e = lib.probe_trace_last_error(None)
            check(st, "probe_postmortem_verdict(%s)" % path,
                  e.decode(errors="replace") if e else None)
        return lib.probe_verdict_name(v.value).decode()
    return postmortem(path)["verdict"]


def _selftest_main():
    # python -m ampprobe.core TRACE: prints the tables' sizes.
    t = read_trace(sys.argv[1])
    print({k: (len(v) if hasattr(v, "__len__") else v)
           for k, v in t.items() if k != "info"})
