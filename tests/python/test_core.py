"""The torch-free core: struct layouts against the C compiler, writing and
reading traces (checked against h5py), buffers by pointer, the policy, the
library search and the post-mortem."""
import ctypes
import math
import os
import re
import shutil
import subprocess
import sys
import textwrap

import warnings

import numpy as np
import pytest

from conftest import REPO, run_py

import ampprobe
from ampprobe import _lib, policy

STRUCTS = {
    "probe_stats": _lib.probe_stats,
    "probe_record": _lib.probe_record,
    "probe_step_scalars": _lib.probe_step_scalars,
    "probe_scaler_event": _lib.probe_scaler_event,
    "probe_layer_info": _lib.probe_layer_info,
    "probe_snapshot_info": _lib.probe_snapshot_info,
    "probe_options": _lib.probe_options,
    "probe_trace_info": _lib.probe_trace_info,
}


def test_struct_layout_matches_c(tmp_path):
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    header = open(os.path.join(REPO, "include", "ampprobe", "probe.h")).read()
    # Trailing fields of newer libraries the header may not have yet: their
    # value lands in probe_options_buf's spare room.
    # Fields of newer libraries the header may not have yet: a trailing one
    # lands in probe_options_buf's spare room, unmeasured in the padding
    # after `skipped` (the struct's size is the same).
    newer = {("probe_options", "overwrite"), ("probe_step_scalars", "unmeasured")}
    skipped = set()
    lines = []
    for sname, st in STRUCTS.items():
        fields = [f for f, _ in st._fields_]
        gone = [f for f in fields if (sname, f) in newer
                and not re.search(r"\b%s;" % f, header)]
        for f in gone:
            fields.remove(f)
            skipped.add((sname, f))
        if not (sname == "probe_options" and "overwrite" in gone):
            lines.append('printf("%s sizeof %%zu\\n", sizeof(%s));' % (sname, sname))
        for f in fields:
            lines.append('printf("%s %s %%zu\\n", offsetof(%s, %s));' %
                         (sname, f, sname, f))
    src = tmp_path / "layout.c"
    src.write_text('#include <stdio.h>\n#include <stddef.h>\n'
                   '#include "ampprobe/probe.h"\nint main(void) {\n' +
                   "\n".join(lines) + "\nreturn 0;\n}\n")
    exe = tmp_path / "layout"
    subprocess.run([cc, "-std=c11", "-I", os.path.join(REPO, "include"),
                    str(src), "-o", str(exe)], check=True)
    out = subprocess.run([str(exe)], stdout=subprocess.PIPE, check=True)
    n = 0
    for line in out.stdout.decode().splitlines():
        sname, field, val = line.split()
        st = STRUCTS[sname]
        got = ctypes.sizeof(st) if field == "sizeof" else getattr(st, field).offset
        assert got == int(val), "%s.%s: ctypes %d, C %s" % (sname, field, got, val)
        n += 1
    assert n == len(lines) >= sum(len(s._fields_) for s in STRUCTS.values()) \
        - len(skipped)


def test_numpy_dtypes_match_structs():
    assert ampprobe.RECORD_DTYPE.itemsize == 648
    assert ampprobe.STEP_DTYPE.itemsize == 88
    assert ampprobe.SCALER_EVENT_DTYPE.itemsize == 40
    assert ampprobe.RECORD_DTYPE.fields["hist"][0].shape == (66,)
    assert ampprobe.RECORD_DTYPE.fields["sum"][1] == 24 + 80


def _write_sample(path):
    rng = np.random.default_rng(3)
    with ampprobe.Session(path, mode="full", config_json={"name": "t"},
                          precision_policy="fp16; fp32: b") as s:
        a = s.register("enc.a", "linear", "fp16")
        b = s.register("enc.b", "bn", "fp32")
        bufs, steps = [], []
        for step in range(3):
            s.begin_step(step)
            x = (rng.standard_normal(1000) * 10 ** step).astype(np.float32)
            x[7] = np.nan if step == 2 else x[7]
            h = (rng.standard_normal(300) * 1e-6).astype(np.float16)
            bf = (rng.standard_normal(50).astype(np.float32).view(np.uint32)
                  >> 16).astype(np.uint16)
            s.record(a, "fwd_in", x)
            s.record(a, "fwd_out", h)
            s.record(b, "fwd_saved", bf, dtype="bf16")
            s.record(b, "weight_grad", rng.standard_normal((4, 4))[:, ::2])
            bufs.append((x.copy(), h.copy(), bf.copy()))
            s.set_scalars(loss=1.0 / (step + 1), loss_scale=2.0 ** (16 - step),
                          growth_tracker=step, found_inf=step == 1,
                          skipped=step == 1, lr=1e-3, grad_norm=2.5,
                          clip_threshold=1.0, clip_coef=0.4)
            if step == 1:
                s.scaler_event("backoff", 2.0 ** 15, 2.0 ** 14, 0)
            s.end_step()
            steps.append(s.step_nonfinite())
        first = s.first_nonfinite()
    return bufs, first, steps


def test_roundtrip_against_h5py(tmp_path):
    h5py = pytest.importorskip("h5py")
    p = str(tmp_path / "t.h5")
    bufs, first, steps = _write_sample(p)
    assert first[0] == 2 and first[2] == "fwd_in"
    # Session.step_nonfinite: each step as it ended; step 2's NaN in x
    assert [st[0] for st in steps] == [0, 1, 2]
    assert steps[0][1:] == (None, None, True)
    assert steps[2][1] == steps[2][2] == (0, "fwd_in", (1, 0, 0, 1000))
    t = ampprobe.read_trace(p)
    assert t["info"]["complete"] == 1
    assert t["info"]["precision_policy"] == "fp16; fp32: b"
    assert [n.decode() for n in t["layers"]["name"]] == ["enc.a", "enc.b"]
    assert list(t["layers"]["kind"]) == [1, 2]
    f = h5py.File(p, "r", swmr=True)
    n = f["meta/state"][3]
    ref = f["records"][:n]
    assert len(ref) == len(t["records"]) == 12
    for name in ref.dtype.names:
        a, b = ref[name], t["records"][name]
        assert np.array_equal(a, b, equal_nan=a.dtype.kind == "f"), name
    st = f["steps"][: f["meta/state"][2]]
    for name in st.dtype.names:
        if name == "wall_time":
            continue
        assert np.array_equal(st[name], t["steps"][name]), name
    ev = t["scaler_events"]
    assert len(ev) == 1 and ev["kind"][0] == 0 and ev["new_scale"][0] == 2.0 ** 14
    # values against NumPy for the first step's fp32 buffer
    r0 = t["records"][0]
    x = bufs[0][0]
    assert r0["count"] == x.size and r0["min"] == x.min() and r0["max"] == x.max()
    assert math.isclose(r0["sum"], float(x.astype(np.float64).sum()), rel_tol=1e-9)
    assert t["records"]["dtype"][1] == 1 and t["records"]["dtype"][2] == 2
    r2 = t["records"][t["records"]["step"] == 2][0]
    assert r2["nan_count"] == 1


def test_records_in_slices_and_fields(tmp_path):
    """A long trace need not be read whole (648 bytes a row in memory, 28x
    the file): slices, an iterator of chunks, and a few fields - each equal
    to the same rows of the whole table (h5py's, for the fields)."""
    h5py = pytest.importorskip("h5py")
    p = str(tmp_path / "long.h5")
    x = np.linspace(-2, 2, 64).astype(np.float32)
    with ampprobe.Session(p, mode="full", overwrite=True) as s:
        ids = [s.register("l%d" % i, kind="linear") for i in range(7)]
        for step in range(300):
            s.begin_step(step)
            for i in ids:
                s.record(i, "fwd_out", x * (1 + step + i))
            s.set_scalars(loss=1.0 / (step + 1))
            s.end_step()
    with ampprobe.Trace(p) as t:
        whole = t.records()
        assert len(whole) == 2100
        part = t.records(1000, 333)
        assert np.array_equal(part, whole[1000:1333])
        assert len(t.records(2090, 50)) == 10 and len(t.records(5000)) == 0
        chunks = list(t.iter_records(chunk_rows=500))
        assert [len(c) for c in chunks] == [500, 500, 500, 500, 100]
        assert np.array_equal(np.concatenate(chunks), whole)
        slim = t.records(fields=("step", "layer", "absmax"))
        assert slim.dtype.names == ("step", "layer", "absmax")
        assert slim.dtype.itemsize <= 24 < whole.dtype.itemsize
        f = h5py.File(p, "r")
        for name in slim.dtype.names:
            assert np.array_equal(slim[name], f["records"][name][:2100]), name
        assert np.array_equal(t.steps(10, 5)["loss"], whole_steps_loss(t)[10:15])
        with pytest.raises(ValueError, match="unknown field"):
            t.records(fields=("absmx",))
        with pytest.raises(ValueError, match="start must be"):
            t.records(-1)
        with pytest.raises(ValueError, match="chunk_rows"):
            next(t.iter_records(chunk_rows=0))


def whole_steps_loss(t):
    return t.steps()["loss"]


def test_record_by_pointer_and_copies(tmp_path):
    with ampprobe.Session(str(tmp_path / "c.h5")) as s:
        lid = s.register("l")
        s.begin_step(0)
        for arr, dt, want_copy in [
                (np.ones(10, np.float32), None, False),
                (np.ones(10, np.float16), None, False),
                (np.ones(10, np.uint16), "bf16", False),
                (np.ones(10, np.float64), None, True),
                (np.ones((4, 4), np.float32)[:, 1], None, True)]:
            a, copied = s.record(lid, "fwd_out", arr, dtype=dt)
            assert copied == want_copy
            if not copied:
                assert a.ctypes.data == arr.ctypes.data  # the caller's memory
        s.end_step()


def test_stats_of_buffers():
    x = np.array([0.0, -0.0, 1.0, -3.0, np.inf, -np.inf, np.nan, 7e4, 1e-8],
                 np.float32)
    s = ampprobe.stats(x)
    assert (s["count"], s["nan_count"], s["posinf_count"], s["neginf_count"],
            s["zero_count"]) == (9, 1, 1, 1, 2)
    assert s["f16_overflow"] == 1 and s["f16_flush"] == 1
    assert s["min"] == -3.0 and s["max"] == np.float32(7e4)
    bits = (np.array([1.5, -2.0], np.float32).view(np.uint32) >> 16).astype(np.uint16)
    b = ampprobe.stats(bits, dtype="bf16")
    assert b["min"] == -2.0 and b["max"] == 1.5 and b["count"] == 2
    h = ampprobe.stats(np.array([65504, -1], np.float16))
    assert h["absmax"] == 65504.0


@pytest.mark.parametrize("dtype", [np.float64, np.longdouble])
def test_stats_of_wide_floats_beyond_float32(dtype):
    """Finite float64 values beyond float32's range are finite: saturated
    at +-3.4e38 (they read as inf); inf and NaN stay what they are."""
    x = np.array([2.7e43, -1e300, 1.0, np.inf, -np.inf, np.nan], dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no overflow warning from numpy
        s = ampprobe.stats(x)
    big = float(np.finfo(np.float32).max)
    assert (s["posinf_count"], s["neginf_count"], s["nan_count"]) == (1, 1, 1)
    assert s["max"] == big and s["min"] == -big and s["f16_overflow"] == 2


def test_session_errors(tmp_path):
    with pytest.raises(ampprobe.ProbeError) as e:
        ampprobe.Session(str(tmp_path / "no" / "such" / "dir.h5"))
    assert "dir.h5" in str(e.value) or "No such" in str(e.value)
    with ampprobe.Session(str(tmp_path / "e.h5")) as s:
        s.register("x")
        with pytest.raises(ampprobe.ProbeError):
            s.register("x")  # names are unique
        with pytest.raises(ValueError):
            s.register("y", kind="no-such-kind")
        s.begin_step(0)
        with pytest.raises(ampprobe.ProbeError):
            s.record(99, "fwd_out", np.ones(3, np.float32))
        s.end_step()
    with pytest.raises(ampprobe.ProbeError) as e:
        ampprobe.Trace(str(tmp_path / "missing.h5"))
    assert e.value.name == "ERR_NOT_FOUND"
    bad = tmp_path / "bad.h5"
    bad.write_bytes(b"not a trace at all" * 10)
    with pytest.raises(ampprobe.ProbeError) as e:
        ampprobe.Trace(str(bad))
    assert e.value.name == "ERR_NOT_HDF5"


def test_policy_from_env():
    p = ampprobe.Policy.from_env({"AMPPROBE_FP32": "bn, enc.*",
                                  "AMPPROBE_TRACE": "/x.h5"}, fp32="revin")
    assert p.fp32 == ["revin", "bn", "enc.*"] and p.trace == "/x.h5"
    assert p.forces_fp32("dec.norm", "bn")
    assert p.forces_fp32("enc.fc1", "linear")
    assert p.forces_fp32("r", "revin")
    assert not p.forces_fp32("dec.fc", "linear")
    assert p.describe("fp16") == "fp16; fp32: revin,bn,enc.*"
    q = ampprobe.Policy.from_env({"AMPPROBE_PRECISION": "fp32"}, precision="fp16")
    assert q.precision == "fp32" and q.forces_fp32("anything", "linear")
    with pytest.raises(ValueError):
        ampprobe.Policy.from_env({"AMPPROBE_PRECISION": "fp8"})


@pytest.mark.parametrize("entry,name,kind,want", [
    # =NAME: that module exactly; never a kind, never a glob (bisect
    # --granularity layer names modules so: a module named "bn", "linear"
    # or "l[0]" was read as a kind or a glob and forced others)
    ("=bn", "bn", "bn", True),
    ("=bn", "enc.bn1", "bn", False),
    ("=linear", "linear", "bn", True),
    ("=linear", "enc.fc1", "linear", False),
    ("=l[0]", "l0", "linear", False),
    ("=l[0]", "l[0]", "linear", True),
    ("=*", "enc.fc1", "linear", False),
    ("=*", "*", "linear", True),
    ("=enc.bn?", "enc.bn2", "bn", False),
    ("==x", "=x", "linear", True),
    # kinds and globs as before
    ("bn", "enc.bn1", "bn", True),
    ("l[0]", "l0", "linear", True),
])
def test_policy_literal_names(entry, name, kind, want):
    p = ampprobe.Policy.from_env({"AMPPROBE_FP32": entry})
    assert p.forces_fp32(name, kind) is want
    assert ampprobe.Policy(fp32=[entry]).forces_fp32(name, kind) is want


def test_policy_literal_names_in_a_list():
    p = ampprobe.Policy.from_env({"AMPPROBE_FP32": "=bn, =l[0],=enc.fc1 "})
    assert p.fp32 == ["=bn", "=l[0]", "=enc.fc1"]
    assert [n for n, k in [("bn", "bn"), ("enc.bn1", "bn"), ("l0", "linear"),
                           ("l[0]", "linear"), ("enc.fc1", "linear")]
            if p.forces_fp32(n, k)] == ["bn", "l[0]", "enc.fc1"]
    with pytest.raises(ValueError, match="names no module"):
        ampprobe.Policy.from_env({"AMPPROBE_FP32": "bn,="})


def test_kind_vocabulary_in_step_with_library():
    assert tuple(ampprobe.kind_names()) == policy.KINDS


def test_site_vocabulary_in_step_with_library():
    """_lib.SITES (ids by position) and their phases are the library's
    PROBE_SITE_MAP, the all-reduce sites included."""
    from ampprobe import _lib
    lib = _lib.load()
    names, i = [], 0
    while lib.probe_site_name(i):
        names.append(lib.probe_site_name(i).decode())
        i += 1
    assert tuple(names) == _lib.SITES
    assert set(_lib.SITE_PHASE) == set(names)


def test_library_search_order(tmp_path):
    r = run_py(["-c", "import ampprobe; ampprobe.library_path()"],
               env={"AMPPROBE_LIB": str(tmp_path / "nope.so")})
    assert r.returncode != 0
    err = r.stderr.decode()
    assert "AMPPROBE_LIB" in err and "nope.so (missing)" in err
    # An installation prefix is searched when AMPPROBE_LIB is unset.
    pre = tmp_path / "prefix" / "lib"
    pre.mkdir(parents=True)
    shutil.copy(ampprobe.library_path(), str(pre / "libampprobe.so"))
    env = {"AMPPROBE_LIB": "", "AMPPROBE_PREFIX": str(tmp_path / "prefix")}
    r = run_py(["-c", "import ampprobe; print(ampprobe.library_path())"], env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.decode().strip() == str(pre / "libampprobe.so")


def test_core_without_torch(tmp_path):
    """The core writes a trace, reads it into NumPy structured arrays and
    runs the post-mortem with torch impossible to import."""
    p = str(tmp_path / "nt.h5")
    code = textwrap.dedent("""
        import sys
        class Block:
            def find_spec(self, name, path=None, target=None):
                if name == "torch" or name.startswith("torch."):
                    raise ImportError("torch blocked by the test")
        sys.meta_path.insert(0, Block())
        import numpy as np, ampprobe
        with ampprobe.Session(%r) as s:
            l = s.register("fc", "linear", "fp16")
            for step in range(2):
                s.begin_step(step)
                s.record(l, "fwd_out", np.array([1, 2, np.inf if step else 3], np.float32))
                s.set_scalars(loss=1.0)
                s.end_step()
        t = ampprobe.read_trace(%r)
        r = t["records"]
        assert isinstance(r, np.ndarray) and r.dtype.names[:3] == ("step", "seq", "layer")
        assert list(r["posinf_count"]) == [0, 1], r["posinf_count"]
        assert t["steps"]["loss"].tolist() == [1.0, 1.0]
        pm = ampprobe.postmortem(%r)
        assert pm["event"]["origin_layer"] == "fc" and pm["event"]["step"] == 1
        assert "torch" not in sys.modules
        try:
            import ampprobe.torch
        except ImportError as e:
            print("blocked:", e)
        print("ok")
    """ % (p, p, p))
    r = run_py(["-c", code])
    assert r.returncode == 0, r.stderr.decode()
    out = r.stdout.decode()
    assert "ok" in out and "blocked" in out


def test_postmortem_names_origin(tmp_path):
    p = str(tmp_path / "pm.h5")
    with ampprobe.Session(p) as s:
        a = s.register("a", "linear", "fp16")
        b = s.register("b", "softmax", "fp16")
        s.begin_step(0)
        x = np.array([1.0, 2.0], np.float32)
        y = np.array([np.nan, 2.0], np.float32)
        s.record(a, "fwd_in", x)
        s.record(a, "fwd_out", x)
        s.record(b, "fwd_in", x)
        s.record(b, "fwd_out", y)
        s.set_scalars(loss=float("nan"))
        s.end_step()
    pm = ampprobe.postmortem(p)
    ev = pm["event"]
    assert (ev["step"], ev["phase"], ev["origin_layer"], ev["origin_kind"],
            ev["origin_site"]) == (0, "forward", "b", "softmax", "fwd_out")


def test_version_follows_the_project():
    """One version: the package's is CMake's project(ampprobe VERSION) and
    the library's ampprobe_version()."""
    import re as _re
    cm = open(os.path.join(REPO, "CMakeLists.txt")).read()
    v = _re.search(r"project\(ampprobe VERSION (\d+\.\d+\.\d+)", cm).group(1)
    py = open(os.path.join(REPO, "python", "pyproject.toml")).read()
    assert 'version = "%s"' % v in py
    assert ampprobe.__version__ == v
    major, minor = v.split(".")[:2]
    assert _lib.SOVERSION == (major if major != "0" else "0." + minor)
    lib = _lib.load()
    if hasattr(lib, "ampprobe_version"):
        assert lib.ampprobe_version().decode() == v


def test_installed_package_finds_an_installed_library(tmp_path):
    """pip-installed (no repository around it): the library comes from
    AMPPROBE_PREFIX, and without any hint the error lists where it looked."""
    pip = subprocess.run([sys.executable, "-m", "pip", "--version"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if pip.returncode != 0:
        pytest.skip("no pip")
    site = tmp_path / "site"
    r = subprocess.run([sys.executable, "-m", "pip", "install", "-q",
                        "--no-build-isolation", "--no-deps", "--target",
                        str(site), os.path.join(REPO, "python")],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       cwd=str(tmp_path))
    if r.returncode != 0:
        pytest.skip("pip cannot build here: %s" % r.stderr.decode()[-300:])
    prefix = tmp_path / "prefix"
    (prefix / "lib").mkdir(parents=True)
    shutil.copy(ampprobe.library_path(), str(prefix / "lib" / "libampprobe.so"))
    code = ("import ampprobe, sys; print(ampprobe.__file__); "
            "print(ampprobe.library_path())")
    env = dict(os.environ, PYTHONPATH=str(site), AMPPROBE_LIB="",
               AMPPROBE_PREFIX=str(prefix))
    r = subprocess.run([sys.executable, "-c", code], env=env,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr.decode()
    out = r.stdout.decode().split()
    assert out[0].startswith(str(site)) and out[1] == str(prefix / "lib" / "libampprobe.so")
    env.pop("AMPPROBE_PREFIX")
    r = subprocess.run([sys.executable, "-c", code], env=env,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       cwd=str(tmp_path))
    if r.returncode == 0:  # an installed copy on the loader's path
        assert "build" not in r.stdout.decode().split()[1]
    else:
        assert "cannot load libampprobe" in r.stderr.decode()


def test_unmeasured_scalars(tmp_path):
    """Scalars left None are stored as NaN with their PROBE_SCALAR_* bit
    (libraries with probe_step_scalars.unmeasured); a measured NaN loss
    keeps its bit clear."""
    header = open(os.path.join(REPO, "include", "ampprobe", "probe.h")).read()
    if "unmeasured" not in header:
        pytest.skip("this libprobe has no probe_step_scalars.unmeasured")
    p = str(tmp_path / "u.h5")
    with ampprobe.Session(p) as s:
        s.register("x")
        s.begin_step(0)
        s.set_scalars(loss=float("nan"), lr=0.1)
        s.end_step()
    st = ampprobe.read_trace(p)["steps"][0]
    want = (_lib.SCALAR_LOSS_SCALE | _lib.SCALAR_SCALER | _lib.SCALAR_GRAD_NORM
            | _lib.SCALAR_CLIP)
    # no weight digest given: stored as not measured (docs/trace-format.md)
    want |= getattr(_lib, "SCALAR_WEIGHT_DIGEST", 0)
    assert st["unmeasured"] == want
    assert math.isnan(st["loss"]) and st["lr"] == 0.1
    assert math.isnan(st["grad_norm"]) and st["found_inf"] == 0


@pytest.mark.parametrize("kw,exc", [
    (dict(loss=True), TypeError),            # a bool is no number
    (dict(lr=False), TypeError),
    (dict(loss="1.5"), TypeError),           # nor a string
    (dict(grad_norm=b"1"), TypeError),
    (dict(loss=[1.0]), TypeError),
    (dict(growth_tracker=1.5), ValueError),  # a count is an integer
    (dict(growth_tracker=2 ** 31), ValueError),  # past int32 (it wrapped)
    (dict(growth_tracker=float("inf")), ValueError),
    (dict(found_inf=2), ValueError),         # flags are 0 or 1
    (dict(skipped=-1), ValueError),
    (dict(loss_scale=-1.0), ValueError),     # libprobe's own rule, named
    (dict(clip_threshold=-0.5), ValueError),
    (dict(loss=np.array([0.5, 0.25])), ValueError),  # not one number
    (dict(loss=10 ** 400), ValueError),      # past binary64 (OverflowError)
    (dict(growth_tracker=10 ** 400), ValueError),
])
def test_set_scalars_refuses_what_is_no_scalar(tmp_path, kw, exc):
    """Session.set_scalars checks each scalar as the tracer's end_step does
    (core.check_scalar), naming it, before libprobe sees it: True was a loss
    of 1.0, "1.5" a loss of 1.5, 2**31 a growth tracker of -2**31. The step
    stays open, and a retry with good values records them."""
    p = str(tmp_path / "t.h5")
    with ampprobe.Session(p) as s:
        s.register("x")
        s.begin_step(0)
        with pytest.raises(exc) as e:
            s.set_scalars(**kw)
        assert "set_scalars(%s=" % next(iter(kw)) in str(e.value)
        s.set_scalars(loss=0.5, found_inf=True, skipped=False,
                      growth_tracker=3, loss_scale=float("inf"))
        s.end_step()
    st = ampprobe.read_trace(p)["steps"][0]
    assert (st["loss"], st["found_inf"], st["skipped"],
            st["growth_tracker"]) == (0.5, 1, 0, 3)
    assert math.isinf(st["loss_scale"])


def test_set_scalars_takes_one_element_arrays(tmp_path):
    """A 0-d or one-element array (NumPy here; a tensor or a JAX scalar
    the same way, by .item()) is the number it holds, as before the checks
    came (they refused it: a regression caught in review)."""
    p = str(tmp_path / "t.h5")
    with ampprobe.Session(p) as s:
        s.register("x")
        s.begin_step(0)
        s.set_scalars(loss=np.array(0.5), lr=np.array([0.125]),
                      loss_scale=np.float32(1024.0),
                      growth_tracker=np.array(7), found_inf=np.array(True))
        s.end_step()
    st = ampprobe.read_trace(p)["steps"][0]
    assert (st["loss"], st["lr"], st["loss_scale"], st["growth_tracker"],
            st["found_inf"]) == (0.5, 0.125, 1024.0, 7, 1)


# ---- hostile input (an audit of 2026-12-03: 14 defects, each a class) ---------


def _revin_trace(cli, tmp_path):
    # run in tmp_path with a short name: the command line stored in the
    # trace (and so the file's layout) does not depend on the directory
    subprocess.run([cli, "run", "--scenario", "revin-overflow", "--trace",
                    "-q", "-o", "t.h5"], cwd=str(tmp_path),
                   stdout=subprocess.DEVNULL)  # exit 1: it diverges
    p = str(tmp_path / "t.h5")
    assert os.path.getsize(p) > 0
    return p


# One byte of the root group's object header (offset 2147 of a trace the
# writer makes today): HDF5 1.10 dereferences it and crashes while reading.
CRASH_OFFSET, CRASH_VALUE = 2147, 8


def test_malformed_trace_is_an_error_not_a_crash(cli, tmp_path):
    src = _revin_trace(cli, tmp_path)
    b = bytearray(open(src, "rb").read())
    b[CRASH_OFFSET] = CRASH_VALUE
    bad = str(tmp_path / "bad.h5")
    open(bad, "wb").write(b)
    # the control: this file does crash HDF5 when read in the process
    raw = run_py(["-c", textwrap.dedent("""
        import ctypes, sys, ampprobe
        lib = ampprobe._lib.load()
        h = ctypes.c_void_p()
        if lib.probe_trace_open(ctypes.byref(h), sys.argv[1].encode()) >= 0:
            t = ampprobe.Trace.__new__(ampprobe.Trace)
            t._lib, t._h = lib, h.value
            t.info = {"n_records": 10**6}
            t.records()
        """), bad], timeout=120)
    if raw.returncode >= 0:
        pytest.skip("this byte no longer crashes HDF5 in-process here "
                    "(rc %d): nothing to isolate" % raw.returncode)
    for call in ("ampprobe.read_trace(p)", "ampprobe.postmortem(p)",
                 "ampprobe.verdict(p)", "ampprobe.Trace(p).records()"):
        r = run_py(["-c", textwrap.dedent("""
            import sys, ampprobe
            p = sys.argv[1]
            try:
                %s
                print("no error")
            except ampprobe.ProbeError as e:
                print(e.name)
            """ % call), bad], timeout=120)
        assert r.returncode == 0, (call, r.returncode, r.stderr[-300:])
        assert r.stdout.decode().strip() == "ERR_CORRUPT", (call, r.stdout)


def test_embedded_nul_is_refused(cli, tmp_path):
    victim = _revin_trace(cli, tmp_path)
    before = open(victim, "rb").read()
    trick = victim + "\0.new"
    for fn in (lambda: ampprobe.Trace(trick), lambda: ampprobe.verdict(trick),
               lambda: ampprobe.postmortem(trick),
               lambda: ampprobe.trace_set(trick),
               lambda: ampprobe.rank_trace_path("a\0b.h5", 0),
               lambda: ampprobe.Session(trick, overwrite=True)):
        with pytest.raises(ValueError, match="null byte"):
            fn()
    assert open(victim, "rb").read() == before
    with ampprobe.Session(str(tmp_path / "n.h5")) as s:
        with pytest.raises(ValueError, match="null byte"):
            s.register("x\0hidden")
        with pytest.raises(ValueError, match="null byte"):
            ampprobe.Session(str(tmp_path / "m.h5"), command_line="a\0b")


def test_messages_escape_controls(tmp_path):
    for fn, arg in ((ampprobe.Trace, "/tmp/\x1b[2Jnope\n.h5"),
                    (ampprobe.verdict, "/tmp/\x1b[2Jnope\n.h5"),
                    (ampprobe.trace_set, "/tmp/\x1b]0;t\x07*.h5"),
                    (ampprobe.Session, str(tmp_path / "\x1b[2Jno" / "x.h5"))):
        with pytest.raises(ampprobe.ProbeError) as e:
            fn(arg)
        msg = str(e.value)
        assert not re.search("[\x00-\x1f\x7f]", msg), repr(msg)
        assert "\\e" in msg, msg
        assert "no error" not in msg


def test_argument_checks():
    with pytest.raises(ValueError, match="rank"):
        ampprobe.rank_trace_path("t.h5", 2**32 + 1)
    with pytest.raises(ValueError, match="rank"):
        ampprobe.rank_trace_path("t.h5", -1)
    assert ampprobe.rank_trace_path("t.h5", 3) == "t.rank3.h5"
    for h in (-1, 2**64):
        with pytest.raises(ValueError):
            ampprobe.digest64(b"x", h)
    with pytest.raises(TypeError):
        ampprobe.digest64(b"x", 1.5)
    for bad in (np.array([object()]), None, "text"):
        with pytest.raises(TypeError):
            ampprobe.digest64(bad)
    with pytest.raises(TypeError, match="bf16"):
        ampprobe.stats(np.array([1.0, 2.0], np.float32), dtype="bf16")
    with pytest.raises(TypeError, match="bf16"):
        ampprobe.stats(np.zeros(5, np.uint8), dtype="bf16")
    with pytest.raises(ValueError, match="dtype"):
        ampprobe.stats(np.zeros(4, np.float32), dtype="bogus")
    # fp16 bits given as uint16: the same record as the float16 array
    x = np.array([1.0, -2.0, 65504.0, 0.0], np.float16)
    assert ampprobe.stats(x.view(np.uint16), dtype="fp16")["absmax"] == 65504.0
    with pytest.raises(ValueError, match="one of"):
        ampprobe.Session("/tmp/never.h5", mode="bogus")


def test_enum_errors_name_the_choices(tmp_path):
    with ampprobe.Session(str(tmp_path / "e.h5")) as s:
        with pytest.raises(ValueError, match="unknown precision 'fp8'"):
            s.register("a", precision="fp8")
        L = s.register("b")
        s.begin_step(0)
        with pytest.raises(ValueError, match="unknown site 'nope'"):
            s.record(L, "nope", np.zeros(4, np.float32))
        with pytest.raises(ValueError, match="unknown dtype"):
            s.record(L, "fwd_out", np.zeros(4, np.float32), dtype="bogus")
        with pytest.raises(ValueError, match="unknown scaler event kind"):
            s.scaler_event("bogus", 1.0, 2.0)
        with pytest.raises(ValueError, match="step"):
            s.begin_step(2**63)
        s.end_step()


def test_snapshot_row_checked_before_allocating(cli, tmp_path):
    with ampprobe.Trace(_revin_trace(cli, tmp_path)) as t:
        rows = t.snapshots()
        assert len(rows), "revin-overflow writes snapshots"
        row = rows[0].copy()
        for n in (-1, 2**40):
            row["n"] = n
            with pytest.raises(ampprobe.ProbeError):
                t.snapshot_data(row)


def test_layer_names_not_utf8(tmp_path):
    h5py = pytest.importorskip("h5py")
    p = str(tmp_path / "u.h5")
    with ampprobe.Session(p) as s:
        s.register("input")
        s.register("abc")
        s.begin_step(0)
        s.end_step()
    with h5py.File(p, "r+") as f:
        d = f["layers"][...]
        d["name"][1] = b"\xff\xfebad"
        f["layers"][...] = d
    with ampprobe.Trace(p) as t:
        assert t.layer_names()[1] == "\ufffd\ufffdbad"


def test_overwrite_of_a_trace_open_here_is_refused(cli, tmp_path):
    p = _revin_trace(cli, tmp_path)
    before = open(p, "rb").read()
    with ampprobe.Trace(p) as t:
        with pytest.raises(ampprobe.ProbeError, match="open for reading") as e:
            ampprobe.Session(p, overwrite=True)
        assert e.value.name == "ERR_LOCKED"
        assert len(t.records())
    assert open(p, "rb").read() == before
    ampprobe.Session(p, overwrite=True).close()  # closed: allowed again


def test_record_ptr_arguments_named(tmp_path):
    """record_ptr's layer, dtype and n are checked and named (a negative n
    was wrapped by ctypes to a size_t near 2**64 and read past the
    buffer; a bad layer or dtype was libprobe's 'bad layer / site / dtype')."""
    a = np.zeros(4, np.float32)
    with ampprobe.Session(str(tmp_path / "r.h5")) as s:
        L = s.register("a")
        s.begin_step(0)
        with pytest.raises(ValueError, match="record n -1 out of range"):
            s.record_ptr(L, "fwd_out", "fp32", a.ctypes.data, -1)
        with pytest.raises(ValueError, match="record layer -1 out of range"):
            s.record_ptr(-1, "fwd_out", "fp32", a.ctypes.data, 4)
        with pytest.raises(ValueError, match="unknown dtype 'fp8'"):
            s.record_ptr(L, "fwd_out", "fp8", a.ctypes.data, 4)
        with pytest.raises(TypeError, match="record n"):
            s.record_ptr(L, "fwd_out", "fp32", a.ctypes.data, 4.0)
        # an int dtype is an index of DTYPES: out of range, named
        for dt in (3, 7, -1):
            with pytest.raises(ValueError, match="dtype %d out of range" % dt):
                s.record_ptr(L, "fwd_out", dt, a.ctypes.data, 4)
        with pytest.raises(ValueError, match="site 99 out of range"):
            s.record_ptr(L, 99, "fp32", a.ctypes.data, 4)
        s.record_ptr(L, "fwd_out", "fp32", a.ctypes.data, 4)
        s.record_ptr(L, "fwd_out", 0, a.ctypes.data, 4)
        s.record_ptr(L, "grad_out", np.int64(2), a.ctypes.data, 2)
        s.end_step()
