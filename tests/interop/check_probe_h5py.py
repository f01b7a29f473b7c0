#!/usr/bin/python3
"""check_probe_h5py.py - h5py reads an ampprobe trace as NumPy structured
arrays, and the values are the ones probe_interop_write wrote.

usage: check_probe_h5py.py WRITER WORKDIR

Runs WRITER twice (a complete trace, and one whose writer SIGKILLed itself
after its last flush) and checks both with h5py; the killed one is opened
with swmr=True, as docs/trace-format.md says.
"""
import math
import os
import subprocess
import sys

import h5py
import numpy as np


def fnv1a64(data, h=14695981039346656037):
    for b in data:
        h = ((h ^ b) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return h


def check(path, complete):
    f = h5py.File(path, "r", swmr=True)
    a = f.attrs
    assert a["format"] == "ampprobe-trace", a["format"]
    assert int(a["version"]) == 1
    assert isinstance(a["config_json"], str)
    assert a["config_json"] == '{"scenario": "interop", "steps": 5}'
    assert a["precision_policy"] == "fp16; fp32: bn"
    assert a["library_versions"].startswith("ampprobe ")
    assert int(a["hist_bins"]) == 66 and int(a["hist_min_exp"]) == -32
    # multi-rank attributes (docs/trace-format.md, "Multi-rank traces")
    assert a["rank"] == 2 and a["world_size"] == 4, (a["rank"], a["world_size"])
    assert a["rank"].dtype == np.dtype("<i4")
    assert a["world_size"].dtype == np.dtype("<i4")
    assert a["run_id"] == "interop-run.1", a["run_id"]

    state = f["meta/state"][:]
    fields = f["meta/state"].attrs["fields"].split(",")
    st = dict(zip(fields, state.tolist()))
    assert st["complete"] == (1 if complete else 0), st
    assert st["n_layers"] == 2 and st["n_steps"] == 5 and st["n_records"] == 10
    assert st["n_scaler_events"] == 1 and st["last_step"] == 4
    assert st["first_nonfinite_step"] == 3, st
    assert st["joined"] == 0, st  # the join mark, by name (entry 15)

    layers = f["layers"][: st["n_layers"]]
    assert layers.dtype.names == ("id", "name", "kind", "precision")
    names = [n.decode("utf-8") for n in layers["name"]]
    assert names == ["encoder.lin1", "encoder.r\u00e9"], names
    assert layers["kind"].tolist() == [1, 2]  # linear, bn
    assert layers["precision"].tolist() == [1, 0]  # fp16, fp32

    r = f["records"][: st["n_records"]]
    assert isinstance(r, np.ndarray) and r.dtype.names[:5] == (
        "step", "seq", "layer", "site", "dtype")
    assert r.dtype["step"] == np.dtype("<i8")
    assert r.dtype["hist"].shape == (66,)
    assert r["step"].tolist() == [s for s in range(5) for _ in (0, 1)]
    assert r["seq"].tolist() == [0, 1] * 5
    assert r["layer"].tolist() == [0, 1] * 5
    assert r["site"].tolist() == [1, 4] * 5  # fwd_out, grad_in
    assert r["dtype"].tolist() == [0, 1] * 5  # f32, f16
    lin = r[r["layer"] == 0]
    assert (lin["count"] == 10).all()
    assert lin["sum"].tolist() == [45.0 + s for s in range(5)]
    assert lin["sumsq"].tolist() == [285.0 + s * s for s in range(5)]
    assert lin["max"].tolist() == [9.0] * 5
    assert lin["zero_count"].tolist() == [1, 0, 0, 0, 0]
    # hist: 1..9 and the step value, by floor(log2|x|): bin = e + 33
    h = lin["hist"][1]  # step 1: values 1,1,2,...,9
    assert h[33] == 2 and h[34] == 2 and h[35] == 4 and h[36] == 2, h[30:40]
    assert h.sum() == 10
    bn = r[r["layer"] == 1]
    assert bn["nan_count"].tolist() == [0, 0, 0, 1, 0]
    assert bn["count"].tolist() == [4] * 5
    assert bn["sum"].tolist() == [0.0, 2.0, 4.0, 4.5, 8.0]

    s = f["steps"][: st["n_steps"]]
    assert s["step"].tolist() == list(range(5))
    assert np.allclose(s["loss"], [1.0 / (i + 1) for i in range(5)], rtol=0)
    assert s["loss_scale"].tolist() == [65536.0 / 2**i for i in range(5)]
    assert s["skipped"].tolist() == [0, 0, 0, 1, 0]
    assert (s["lr"] == 0.01).all()
    assert np.all(np.diff(s["wall_time"]) >= 0)
    # not measured (bit set, value NaN) vs measured: docs/trace-format.md
    assert s["unmeasured"].tolist() == [0, 0, 16 | 32, 0, 64]
    # the weight digest: FNV-1a 64 of layer 0's 10 float32 values, as
    # Python computes it; step 4 not measured (bit 64, value 0)
    assert s.dtype.itemsize == 88 and s.dtype["weight_digest"] == np.dtype("<u8")
    for i in range(4):
        vals = np.array([i] + list(range(1, 10)), dtype="<f4").tobytes()
        assert int(s["weight_digest"][i]) == fnv1a64(vals), i
    assert int(s["weight_digest"][4]) == 0
    assert np.isnan(s["grad_norm"][2]) and np.isnan(s["clip_coef"][2])
    assert s["clip_coef"][[0, 1, 3, 4]].tolist() == [1.0] * 4

    # the state's check value: FNV-1a 64 over the little-endian bytes of
    # every entry but "check" (docs/trace-format.md, /meta/state)
    assert st["features"] & 1
    h = fnv1a64(b"".join(int(v & 0xFFFFFFFFFFFFFFFF).to_bytes(8, "little")
                         for i, v in enumerate(state.tolist())
                         if fields[i] != "check"))
    assert h == st["check"] & 0xFFFFFFFFFFFFFFFF, (h, st["check"])

    e = f["scaler_events"][: st["n_scaler_events"]]
    assert e["step"].tolist() == [3] and e["kind"].tolist() == [0]
    assert e["old_scale"].tolist() == [8192.0] and e["new_scale"].tolist() == [4096.0]

    # The first non-finite step took a snapshot of encoder.ré's tensors.
    idx = f["snapshots/index"][: st["n_snapshots"]]
    assert idx["layer"].tolist() == [1] and idx["step"].tolist() == [3]
    d = f["snapshots/data"][idx["offset"][0]: idx["offset"][0] + idx["n"][0]]
    assert d.dtype == np.float32 and d.shape == (4,)
    assert d[0] == 1.5 and d[1] == 1.5 and math.isnan(d[2]) and d[3] == 1.5

    # The columns a pandas DataFrame is built from (docs/trace-format.md).
    cols = {k: r[k] for k in r.dtype.names if k != "hist"}
    assert all(v.ndim == 1 and len(v) == 10 for v in cols.values())
    f.close()
    check_pandas_lines(path)


def check_pandas_lines(path):
    """Runs the three lines docs/trace-format.md shows, as written there."""
    try:
        import pandas as pd  # noqa: F401  (Debian's python3-pandas)
    except ImportError:
        print("note: pandas not importable, documented pandas lines not run")
        return
    doc = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                       "..", "..", "docs", "trace-format.md")
    text = open(doc, encoding="utf-8").read()
    start = text.index("```python\nimport h5py, pandas as pd")
    code = text[start + len("```python\n"): text.index("```", start + 9)]
    env = {}
    exec(code.replace('"trace.h5"', repr(path)), env)
    df = env["df"]
    assert len(df) == 10, len(df)
    assert "hist" not in df.columns and "nan_count" in df.columns
    assert df["step"].tolist() == [s for s in range(5) for _ in (0, 1)]
    env["f"].close()


def main():
    writer, workdir = sys.argv[1], sys.argv[2]
    os.makedirs(workdir, exist_ok=True)
    done = os.path.join(workdir, "interop-complete.h5")
    killed = os.path.join(workdir, "interop-killed.h5")
    for p in (done, killed):  # a failed run's leftovers: traces are exclusive
        if os.path.exists(p):
            os.remove(p)
    subprocess.run([writer, done, "complete"], check=True)
    rc = subprocess.run([writer, killed, "killed"]).returncode
    assert rc == -9, "writer should have been SIGKILLed, rc %d" % rc
    check(done, True)
    check(killed, False)
    # Without swmr=True, h5py refuses the killed writer's file (HDF5 1.10
    # keeps its "open for writing" mark); the complete one opens either way.
    h5py.File(done, "r").close()
    try:
        h5py.File(killed, "r").close()
        print("note: killed trace opened without swmr=True")
    except OSError:
        pass
    os.remove(done)
    os.remove(killed)
    print("h5py interop: complete and killed traces read back as written")


if __name__ == "__main__":
    main()
