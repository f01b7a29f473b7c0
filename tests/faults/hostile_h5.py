#!/usr/bin/python3
"""tests/faults/hostile_h5.py - hostile edits of a trace with h5py, for
faults.sh (run by /usr/bin/python3, which has h5py and numpy):

  hostile_h5.py SRC DST steps S1 S2      last two /steps rows at steps S1 < S2,
                                         last_step S2 (state check redone)
  hostile_h5.py SRC DST extlink PATH OTHER   PATH an external link to PATH
                                             in the file OTHER
  hostile_h5.py SRC DST efl TARGET [N]   /snapshots/data stored in the file
                                         TARGET (N floats, state recounted)
  hostile_h5.py SRC DST vds PATH OTHER   PATH a virtual dataset mapping PATH
                                         of the file OTHER
  hostile_h5.py SRC DST scaler EDIT      one edit of /scaler_events: step_max,
                                         past_last, reversed, nan, neginf,
                                         negative, tracker
  hostile_h5.py SRC DST attr NAME KIND [VALUE]
                                         root attribute NAME replaced by KIND:
                                         str VALUE, int VALUE, float VALUE,
                                         ints (an array of 2), strs (an array
                                         of 2 strings), big N (a string of N
                                         bytes), none (deleted)
  hostile_h5.py SRC DST filter PATH HOW  the dataset PATH rewritten through a
                                         filter: lzf (h5py's, id 32000, which
                                         HDF5 lacks without its plugin), ID
                                         (a filter id no HDF5 has, applied to
                                         every chunk: raw chunks), skipped:ID
                                         (that id as an optional filter every
                                         chunk skipped: readable)

The /meta/state check value is recomputed (docs/trace-format.md), so each
file is consistent but for the one thing the edit makes hostile.
"""
import shutil
import sys

import h5py
import numpy as np

STATE = {"snapdata_rows": 6, "last_step": 8, "check": 13}


def fnv(st):
    h = 14695981039346656037
    for i, v in enumerate(st):
        if i == STATE["check"]:
            continue
        v = int(v) & (2 ** 64 - 1)
        for b in range(8):
            h ^= (v >> (8 * b)) & 0xFF
            h = (h * 1099511628211) & (2 ** 64 - 1)
    return h - 2 ** 64 if h >= 2 ** 63 else h


def set_state(f, **kw):
    st = [int(x) for x in f["meta/state"][:]]
    for k, v in kw.items():
        st[STATE[k]] = v
    st[STATE["check"]] = fnv(st)
    f["meta/state"][:] = np.array(st, dtype=np.int64)


def steps(f, s1, s2):
    s = f["steps"][:]
    s[-2]["step"], s[-1]["step"] = int(s1), int(s2)
    f["steps"][:] = s
    set_state(f, last_step=int(s2))


def extlink(f, path, other):
    del f[path]
    f[path] = h5py.ExternalLink(other, path)


def efl(f, target, n=None):
    m = int(f["meta/state"][STATE["snapdata_rows"]]) if n is None else int(n)
    del f["snapshots/data"]
    f.create_dataset("snapshots/data", shape=(m,), dtype="<f4",
                     external=[(target, 0, h5py.h5f.UNLIMITED)])
    if n is not None:
        set_state(f, snapdata_rows=m)


def vds(f, path, other):
    with h5py.File(other, "r") as o:
        src = o[path]
        layout = h5py.VirtualLayout(shape=src.shape, dtype=src.dtype,
                                    maxshape=(None,))
        layout[:] = h5py.VirtualSource(other, path, shape=src.shape)
    del f[path]
    f.create_virtual_dataset(path, layout)


def scaler(f, edit):
    e = f["scaler_events"][:]
    assert len(e) >= 2, "the trace has fewer than 2 scaler events"
    last = int(f["meta/state"][STATE["last_step"]])
    if edit == "step_max":
        e["step"][-1] = 2 ** 63 - 1
    elif edit == "past_last":
        e["step"][-1] = last + 1
    elif edit == "reversed":
        e = e[::-1].copy()
    elif edit == "nan":
        e["old_scale"][1] = np.nan
    elif edit == "neginf":
        e["new_scale"][1] = -np.inf
    elif edit == "negative":
        e["new_scale"][1] = -2.0
    elif edit == "tracker":
        e["growth_tracker"][1] = -2 ** 31
    else:
        sys.exit("unknown scaler edit " + edit)
    f["scaler_events"][:] = e


def attr(f, name, kind, value=None):
    if name in f.attrs:
        del f.attrs[name]
    if kind == "str":
        f.attrs.create(name, value, dtype=h5py.string_dtype("utf-8"))
    elif kind == "int":
        f.attrs[name] = np.int32(int(value))
    elif kind == "float":
        f.attrs[name] = np.float64(float(value))
    elif kind == "ints":
        f.attrs[name] = np.array([1, 1], dtype=np.int32)
    elif kind == "strs":
        f.attrs.create(name, ["ampprobe-trace", "x"],
                       dtype=h5py.string_dtype("utf-8"))
    elif kind == "big":
        f.attrs.create(name, "x" * int(value), dtype=h5py.string_dtype("utf-8"))
    elif kind != "none":
        sys.exit("unknown attribute kind " + kind)


def refilter(f, path, how):
    old = f[path]
    data, attrs = old[:], dict(old.attrs)
    del f[path]
    n = len(data)
    chunk = max(1, min(n, 256))
    if how == "lzf":
        d = f.create_dataset(path, data=data, chunks=(chunk,), maxshape=(None,),
                             compression="lzf")
    else:
        skipped = how.startswith("skipped:")
        dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
        dcpl.set_chunk((chunk,))
        dcpl.set_filter(int(how.split(":")[-1]), h5py.h5z.FLAG_OPTIONAL, ())
        sp = h5py.h5s.create_simple((n,), (h5py.h5s.UNLIMITED,))
        tid = h5py.h5t.py_create(data.dtype)
        dsid = h5py.h5d.create(f.id, path.encode(), tid, sp, dcpl=dcpl)
        if skipped:  # HDF5 skips the optional filter it lacks: mask bit set
            dsid.write(h5py.h5s.ALL, h5py.h5s.ALL, data)
        else:  # chunks as if filtered (filter mask 0): never decodable
            for at in range(0, n, chunk):
                raw = np.zeros(chunk, dtype=data.dtype)
                raw[:min(chunk, n - at)] = data[at:at + chunk]
                dsid.write_direct_chunk((at,), raw.tobytes(), filter_mask=0)
        d = f[path]
    for k, v in attrs.items():
        d.attrs[k] = v


def main():
    src, dst, kind, args = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
    shutil.copy(src, dst)
    with h5py.File(dst, "r+") as f:
        {"steps": steps, "extlink": extlink, "efl": efl, "vds": vds,
         "scaler": scaler, "attr": attr, "filter": refilter}[kind](f, *args)


if __name__ == "__main__":
    main()
