#!/usr/bin/python3
"""tests/dist/check.py - the assertions of tests/dist/dist.sh on JSON: the
output of rank_info (the library's reader over rank traces), the rank files
read with h5py, and `ampprobe postmortem --json`. No jq: the standard json
module. Each subcommand prints one line of evidence and exits 0 when the
assertion holds, 1 (with the evidence) when it does not.

  check.py ranks INFO.json N            rank attrs 0..N-1, world N, one run id
  check.py digests INFO.json            weight digests measured, equal across
                                        ranks at every step, not constant
  check.py sites INFO.json              pre/post all-reduce records on every rank
  check.py loss INFO.json SINGLE.json TOL   per-step loss of every rank vs the
                                        single-process run, relative TOL
  check.py born_in_allreduce INFO.json  every rank finite before the all-reduce
                                        at the first bad step, every rank not after
  check.py carried INFO.json R S        rank R's gradient non-finite before the
                                        all-reduce at step S, the others' finite;
                                        every rank's non-finite after it
  check.py h5 FILE...                   h5py opens each file, reads the root
                                        attributes and every row of /steps
  check.py expr FILE PYEXPR [SHOWEXPR]  PYEXPR on d = the JSON of FILE is true
  check.py get FILE PYEXPR              prints PYEXPR on d (for the script)
"""
import json
import math
import sys


def load(path):
    with open(path) as f:
        return json.load(f)


def num(v):
    """rank_info writes non-finite numbers as "nan", "inf", "-inf"."""
    return float(v)


def ok(msg):
    print(msg)
    sys.exit(0)


def fail(msg):
    print(msg)
    sys.exit(1)


def readable(files):
    bad = [f"{f['path']}: {f.get('error')}" for f in files if not f.get("ok")]
    if bad:
        fail("unreadable: " + "; ".join(bad))


def cmd_ranks(path, n):
    files = load(path)
    readable(files)
    n = int(n)
    got = [(f["rank"], f["world_size"]) for f in files]
    ids = {f["run_id"] for f in files}
    want = [(r, n) for r in range(n)]
    if len(files) != n or got != want:
        fail(f"(rank, world_size) per file {got}, want {want}")
    if len(ids) != 1 or "" in ids:
        fail(f"run ids {sorted(ids)}: want one, non-empty")
    ok(f"ranks 0..{n - 1}, world_size {n}, run id {ids.pop()}")


def cmd_digests(path):
    files = load(path)
    readable(files)
    steps = [[(s["step"], s["digest"]) for s in f["steps"]] for f in files]
    if any(d is None for st in steps for _, d in st):
        fail("a step's weight digest is not measured")
    if any(st != steps[0] for st in steps):
        diff = next(
            (a, b) for st in steps for a, b in zip(steps[0], st) if a != b
        ) if all(len(st) == len(steps[0]) for st in steps) else "step counts differ"
        fail(f"digests differ across ranks: first difference {diff}")
    if len({d for _, d in steps[0]}) < 2:
        fail(f"the digest never changes over {len(steps[0])} steps")
    ok(f"{len(steps[0])} steps, digests equal on {len(files)} ranks "
       f"(step 0 {steps[0][0][1]}, last {steps[0][-1][1]})")


def cmd_sites(path):
    files = load(path)
    readable(files)
    counts = []
    for f in files:
        pre = f["sites"].get("grad_pre_allreduce", {}).get("records", 0)
        post = f["sites"].get("grad_post_allreduce", {}).get("records", 0)
        if pre == 0 or pre != post:
            fail(f"rank {f['rank']}: {pre} pre-all-reduce and {post} post records")
        counts.append(pre)
    ok(f"pre/post all-reduce records per rank: {counts}")


def cmd_loss(path, single, tol):
    files = load(path)
    readable(files)
    ref = load(single)[0]
    tol = float(tol)
    worst = (0.0, None, None)
    for f in files:
        if len(f["steps"]) != len(ref["steps"]):
            fail(f"rank {f['rank']}: {len(f['steps'])} steps, single run {len(ref['steps'])}")
        for a, b in zip(f["steps"], ref["steps"]):
            x, y = num(a["loss"]), num(b["loss"])
            if not (math.isfinite(x) and math.isfinite(y)):
                fail(f"rank {f['rank']} step {a['step']}: loss {x} vs {y}")
            rel = abs(x - y) / max(abs(y), 1e-30)
            if rel > worst[0]:
                worst = (rel, f["rank"], a["step"])
    if worst[0] > tol:
        fail(f"rank {worst[1]} step {worst[2]}: relative loss difference "
             f"{worst[0]:.3g} > {tol:g}")
    ok(f"{len(ref['steps'])} steps x {len(files)} ranks: largest relative loss "
       f"difference {worst[0]:.3g} (tolerance {tol:g}); final "
       f"{num(files[0]['steps'][-1]['loss']):.6g} vs {num(ref['steps'][-1]['loss']):.6g}")


def first_bad(f, site):
    s = f["sites"].get(site)
    return None if s is None else s["first_nonfinite_step"]


def cmd_born_in_allreduce(path):
    files = load(path)
    readable(files)
    post = [first_bad(f, "grad_post_allreduce") for f in files]
    pre = [first_bad(f, "grad_pre_allreduce") for f in files]
    if any(p is None or p < 0 for p in post) or len(set(post)) != 1:
        fail(f"first non-finite step after the all-reduce per rank: {post}")
    s = post[0]
    if any(p is None or 0 <= p <= s for p in pre):
        fail(f"first non-finite step before the all-reduce per rank {pre}, "
             f"after it {s}: want every rank finite before it at step {s}")
    ok(f"step {s}: every rank finite before the all-reduce, non-finite after "
       f"(layers {files[0]['sites']['grad_post_allreduce']['nonfinite_layers_at_first']})")


def cmd_carried(path, rank, step):
    files = load(path)
    readable(files)
    rank, step = int(rank), int(step)
    pre = [first_bad(f, "grad_pre_allreduce") for f in files]
    post = [first_bad(f, "grad_post_allreduce") for f in files]
    for f, p, q in zip(files, pre, post):
        if f["rank"] == rank and p != step:
            fail(f"rank {rank}: first non-finite before the all-reduce at {p}, want {step}")
        if f["rank"] != rank and p is not None and 0 <= p <= step:
            fail(f"rank {f['rank']}: non-finite before the all-reduce at {p} <= {step}")
        if q != step:
            fail(f"rank {f['rank']}: first non-finite after the all-reduce at {q}, want {step}")
    ok(f"step {step}: non-finite before the all-reduce on rank {rank} only "
       f"(per rank {pre}); after it on every rank")


def cmd_h5(*paths):
    try:
        import h5py
    except ImportError:
        ok("h5py not importable: skipped (the reader's check stands)")
    out = []
    for p in paths:
        try:
            with h5py.File(p, "r", swmr=True) as h:
                a = dict(h.attrs)
                rows = len(h["steps"][()]) if "steps" in h else -1
        except Exception as e:  # noqa: BLE001 - the message is the evidence
            fail(f"h5py cannot read {p}: {e}")
        rank = int(a.get("rank", -99))
        rid = a.get("run_id", b"")
        rid = rid.decode() if isinstance(rid, bytes) else str(rid)
        out.append(f"rank {rank} ({rows} step rows, run id {rid})")
    ok("h5py: " + ", ".join(out))


def cmd_expr(path, expr, show=None):
    d = load(path)
    env = {"d": d, "math": math, "json": json}
    try:
        val = eval(expr, env)  # noqa: S307 - test expressions, ours
    except Exception as e:  # noqa: BLE001
        fail(f"{expr}: {type(e).__name__}: {e}")
    msg = str(eval(show, env)) if show else "true"  # noqa: S307
    if val:
        ok(msg)
    fail(msg + f" is {val!r}")


def cmd_get(path, expr):
    print(eval(expr, {"d": load(path), "json": json}))  # noqa: S307


CMDS = {
    "ranks": cmd_ranks, "digests": cmd_digests, "sites": cmd_sites,
    "loss": cmd_loss, "born_in_allreduce": cmd_born_in_allreduce,
    "carried": cmd_carried, "h5": cmd_h5, "expr": cmd_expr, "get": cmd_get,
}

if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] not in CMDS:
        print(__doc__)
        sys.exit(2)
    CMDS[sys.argv[1]](*sys.argv[2:])
