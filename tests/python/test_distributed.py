"""The PyTorch tracer under torch.distributed (gloo, CPU processes).

A two-rank job (tests/python/ddp_worker.py, two processes joined with
MASTER_ADDR=127.0.0.1 and a free port) runs four DDP scenarios in one
process group: a NaN in rank 1's batch at one step under FP16 emulation, a
healthy bf16 run, and an FP16 all-reduce with and without pre-division.
The traces are checked with h5py and with the library's reader: one file
per rank named by the library's rule, rank/world size/run id, the
gradients before and after the all-reduce, where the NaN appears first
and where the all-reduce carried it, the weight digests, and the
post-mortem over the set. In-process tests cover the naming rule with an
explicit rank, the identity's errors, the digest, and the hook in a
one-rank gloo group (its own hook, a job's hook wrapped, a hook already
registered).
"""
import json
import os
import socket
import subprocess
import sys
import time
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402

if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is not available",
                allow_module_level=True)

import ampprobe  # noqa: E402
import ampprobe.torch as at  # noqa: E402
from ampprobe import _lib  # noqa: E402
from ampprobe._lib import SITES  # noqa: E402
from conftest import EXAMPLE, HERE, PKG, run_py  # noqa: E402
from models import Net, ProbNLL, RevINLike, data  # noqa: E402

import ddp_worker as W  # noqa: E402

h5py = pytest.importorskip("h5py")
torch.set_num_threads(1)

WORLD = 2
SCENARIOS = ["bad-input", "healthy", "drift", "overflow", "prediv"]
PRE, POST = SITES.index("grad_pre_allreduce"), SITES.index(
    "grad_post_allreduce")


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(out, scenarios, world=WORLD, timeout=400):
    """Runs the worker as `world` ranks; returns their outputs. Retries
    with another port when the chosen one was taken meanwhile."""
    for attempt in range(3):
        port = _free_port()
        procs = []
        for r in range(world):
            env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(world),
                       LOCAL_RANK=str(r), MASTER_ADDR="127.0.0.1",
                       MASTER_PORT=str(port), OMP_NUM_THREADS="1")
            env["PYTHONPATH"] = PKG + os.pathsep + env.get("PYTHONPATH", "")
            env.pop("AMPPROBE_RUN_ID", None)
            env.pop("AMPPROBE_TRACE", None)
            procs.append(subprocess.Popen(
                [sys.executable, os.path.join(HERE, "ddp_worker.py"), out] +
                scenarios, env=env, stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT))
        outs, t_end = [], time.time() + timeout
        try:
            for p in procs:
                o, _ = p.communicate(timeout=max(t_end - time.time(), 1))
                outs.append(o.decode(errors="replace"))
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        text = "\n".join("--- rank %d (exit %s)\n%s" % (r, p.returncode, o)
                         for r, (p, o) in enumerate(zip(procs, outs)))
        if all(p.returncode == 0 for p in procs):
            return text
        if "Address already in use" not in text:
            break
    raise AssertionError("the DDP job failed:\n" + text[-6000:])


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    out = tmp_path_factory.mktemp("ddp")
    t0 = time.time()
    launch(str(out), SCENARIOS)
    print("2-rank gloo job, %d scenarios: %.1f s" % (len(SCENARIOS),
                                                     time.time() - t0))
    return out


def traces(job, sc):
    return [ampprobe.read_trace(str(job / sc / ("trace.rank%d.h5" % r)))
            for r in range(WORLD)]


def _names(t):
    return [n.decode() for n in t["layers"]["name"]]


def _param_layers(t):
    """Layer ids that have parameters (those with weight_grad records)."""
    r = t["records"]
    return sorted(set(r[r["site"] == SITES.index("weight_grad")]["layer"]))


def _nonfinite(rows):
    return rows["nan_count"] + rows["posinf_count"] + rows["neginf_count"]


# ---- the two-rank job -----------------------------------------------------------

def test_one_file_per_rank_with_identity(job):
    ids = set()
    for sc in SCENARIOS:
        d = job / sc
        assert sorted(os.listdir(d)) == sorted(
            ["trace.rank0.h5", "trace.rank1.h5", "rank0.json", "rank1.json"])
        run_ids = set()
        for r in range(WORLD):
            p = str(d / ("trace.rank%d.h5" % r))
            with h5py.File(p, "r") as f:
                a = f.attrs
                assert int(a["rank"]) == r and int(a["world_size"]) == WORLD
                rid = a["run_id"]
                rid = rid.decode() if isinstance(rid, bytes) else str(rid)
                cfg = json.loads(a["config_json"])
            with ampprobe.Trace(p) as t:
                info = t.info
            assert (info["rank"], info["world_size"], info["run_id"]) == (
                r, WORLD, rid)
            assert (cfg["rank"], cfg["world_size"], cfg["run_id"]) == (
                r, WORLD, rid)
            assert cfg["backend"] == "gloo" and cfg["ddp"] is True
            with open(str(d / ("rank%d.json" % r))) as f:
                seen = json.load(f)
            assert seen["path"] == p and seen["run_id"] == rid
            # several buckets a step in the DDP runs of the Net: one in
            # the first step, then >= 3 (ddp_worker.run_net)
            assert seen["buckets"] >= (
                1 + 3 * (W.STEPS - 1)
                if sc in ("bad-input", "healthy", "drift") else 1)
            run_ids.add(rid)
        assert len(run_ids) == 1, run_ids  # one run id, broadcast by rank 0
        ids |= run_ids
    assert len(ids) == len(SCENARIOS)  # a new id for each tracer
    assert ampprobe.trace_set(str(job / "healthy")) == [
        str(job / "healthy" / "trace.rank0.h5"),
        str(job / "healthy" / "trace.rank1.h5")]


@pytest.mark.parametrize("sc", ["bad-input", "healthy"])
def test_buckets_before_and_after_the_allreduce(job, sc):
    """Every parameterised layer has both records at every step, with the
    parameters' element counts; after the all-reduce both ranks hold the
    same values, the mean of what they sent (pre-divided: the sum)."""
    ts = traces(job, sc)
    for t in ts:
        r = t["records"]
        for step in range(W.STEPS):
            for lid in _param_layers(t):
                rows = r[(r["step"] == step) & (r["layer"] == lid)]
                wg = rows[rows["site"] == SITES.index("weight_grad")]
                pre = rows[rows["site"] == PRE]
                post = rows[rows["site"] == POST]
                assert len(pre) == len(post) == len(wg) > 0, (sc, step, lid)
                assert sorted(pre["count"]) == sorted(wg["count"])
                assert sorted(post["count"]) == sorted(wg["count"])
                assert pre["seq"].max() < post["seq"].max()
    r0, r1 = ts[0]["records"], ts[1]["records"]
    steps0 = ts[0]["steps"]
    for step in range(W.STEPS):
        if steps0["skipped"][step]:
            continue
        for site in (PRE, POST):
            a = r0[(r0["step"] == step) & (r0["site"] == site)]
            b = r1[(r1["step"] == step) & (r1["site"] == site)]
            assert len(a) == len(b) > 0
            same = (a["sum"] == b["sum"]) & (a["absmax"] == b["absmax"])
            if site == POST:
                assert same.all(), (sc, step)  # one all-reduced bucket
                # pre-divided by 2 on each rank, then summed
                np.testing.assert_allclose(
                    a["sum"], a_pre_sum(r0, step) + a_pre_sum(r1, step),
                    rtol=1e-4, atol=1e-6)
            else:
                assert not same.all(), (sc, step)  # different shards


def a_pre_sum(r, step):
    return r[(r["step"] == step) & (r["site"] == PRE)]["sum"]


def test_nan_born_on_rank1_carried_to_rank0(job):
    t0, t1 = traces(job, "bad-input")
    bad = W.BAD_STEP
    for t in (t0, t1):
        assert t["info"]["first_nonfinite_step"] == bad
    # rank 1: the first non-finite record of the step is its input
    r1 = t1["records"]
    rows = r1[(r1["step"] == bad)]
    rows = rows[np.argsort(rows["seq"])]
    first = rows[_nonfinite(rows) > 0][0]
    assert _names(t1)[first["layer"]] == "input"
    assert SITES[first["site"]] == "fwd_out"
    assert first["nan_count"] == 1
    assert (_nonfinite(rows[rows["site"] == PRE]) > 0).any()
    # rank 0: finite through its forward, backward and what it sent;
    # non-finite as the all-reduce returned it
    r0 = t0["records"]
    rows0 = r0[r0["step"] == bad]
    post = rows0[rows0["site"] == POST]
    assert (_nonfinite(rows0[rows0["site"] != POST]) == 0).all()
    assert (_nonfinite(post) > 0).any()
    first0 = rows0[np.argsort(rows0["seq"])]
    first0 = first0[_nonfinite(first0) > 0][0]
    assert SITES[first0["site"]] == "grad_post_allreduce"
    # other steps finite on both ranks
    for r in (r0, r1):
        assert (_nonfinite(r[r["step"] != bad]) == 0).all()
    # both ranks skip the step (the all-reduced gradients are NaN)
    for t in (t0, t1):
        sk = list(t["steps"]["skipped"])
        assert sk == [1 if s == bad else 0 for s in range(W.STEPS)], sk


@pytest.mark.parametrize("sc", ["bad-input", "healthy"])
def test_weight_digests_agree_across_ranks(job, sc):
    t0, t1 = traces(job, sc)
    d0, d1 = t0["steps"]["weight_digest"], t1["steps"]["weight_digest"]
    assert len(d0) == len(d1) == W.STEPS
    assert list(d0) == list(d1)
    for t in (t0, t1):
        bit = ampprobe.core.SCALAR_WEIGHT_DIGEST
        assert not (t["steps"]["unmeasured"] & bit).any()
    if sc == "healthy":
        assert len(set(d0)) == W.STEPS  # the weights move every step
    else:  # the skipped step leaves the weights as they were
        assert d0[W.BAD_STEP] == d0[W.BAD_STEP - 1]
        assert d0[W.BAD_STEP + 1] != d0[W.BAD_STEP]


def test_fp16_allreduce_overflows_without_prediv(job):
    for sc, post_inf in (("overflow", True), ("prediv", False)):
        for t in traces(job, sc):
            r = t["records"]
            pre, post = r[r["site"] == PRE], r[r["site"] == POST]
            assert len(pre) == len(post) == 1
            assert pre["dtype"][0] == post["dtype"][0] == 1  # fp16
            want = W.G_ELEM / (2 if sc == "prediv" else 1)
            assert _nonfinite(pre)[0] == 0 and pre["absmax"][0] == want
            if post_inf:  # 40000 + 40000 in binary16: inf
                assert post["posinf_count"][0] == post["count"][0] == 8
            else:
                assert _nonfinite(post)[0] == 0
                assert post["absmax"][0] == W.G_ELEM


def _seen(job, sc, rank):
    with open(str(job / sc / ("rank%d.json" % rank))) as f:
        return json.load(f)


def test_on_nonfinite_names_the_allreduce(job):
    """on_nonfinite="warn": the rank whose input held the NaN names its
    input; where the all-reduce itself overflowed, every rank names the
    all-reduce; the other runs do not warn."""
    w1 = _seen(job, "bad-input", 1)["warnings"]
    assert len(w1) == 1 and "step %d" % W.BAD_STEP in w1[0], w1
    assert "module 'input'" in w1[0] and "site fwd_out" in w1[0]
    # rank 0 skipped the step like a routine gradient overflow: silent
    assert _seen(job, "bad-input", 0)["warnings"] == []
    for r in range(WORLD):
        w = _seen(job, "overflow", r)["warnings"]
        assert len(w) == 1 and "grad_post_allreduce" in w[0], w
        assert "came back from the gradient all-reduce" in w[0]
        for sc in ("healthy", "drift", "prediv"):
            assert _seen(job, sc, r)["warnings"] == []


def test_drifting_weights_change_the_digest(job):
    t0, t1 = traces(job, "drift")
    d0, d1 = t0["steps"]["weight_digest"], t1["steps"]["weight_digest"]
    assert all(d0[s] == d1[s] for s in range(W.DRIFT_STEP))
    assert all(d0[s] != d1[s] for s in range(W.DRIFT_STEP, W.STEPS))
    for t in (t0, t1):
        assert (_nonfinite(t["records"]) == 0).all()


def _cross_rank(doc):
    if doc.get("kind") != "ranks":
        pytest.skip("this library's post-mortem over several traces is "
                    "not the cross-rank document yet (contract C3)")
    return doc


def test_postmortem_over_the_set(job):
    healthy = _cross_rank(ampprobe.postmortem(str(job / "healthy")))
    assert healthy["verdict"] == "healthy", healthy
    assert healthy["disagreements"] == [] and healthy["ranks_missing"] == []
    assert healthy["first_nonfinite"] is None
    bad = job / "bad-input"
    doc = _cross_rank(ampprobe.postmortem(str(bad)))
    assert doc["verdict"] in ("degraded", "diverged"), doc
    assert doc["world_size"] == WORLD and doc["ranks_read"] == WORLD
    with ampprobe.Trace(str(bad / "trace.rank0.h5")) as t:
        assert doc["run_id"] == t.info["run_id"]
    first = doc["first_nonfinite"]
    assert (first["rank"], first["step"], first["layer"], first["site"]) == (
        W.BAD_RANK, W.BAD_STEP, "input", "fwd_out"), first
    o = doc["origin"]
    assert o["kind"] == "rank" and o["step"] == W.BAD_STEP, o
    assert o["born_on"] == [W.BAD_RANK] and o["carried_to"] == [0], o
    assert doc["disagreements"] == [], doc["disagreements"]
    # verdict() of a set is the cross-rank one (it raised "not an HDF5
    # file: is a directory")
    assert ampprobe.verdict(str(bad)) == doc["verdict"]
    assert ampprobe.verdict(str(bad / "trace.rank*.h5")) == doc["verdict"]
    assert ampprobe.verdict(str(job / "healthy")) == "healthy"
    # the same set given as a glob and as a list in another order
    for arg in (str(bad / "trace.rank*.h5"),
                [str(bad / "trace.rank1.h5"), str(bad / "trace.rank0.h5")]):
        same = ampprobe.postmortem(arg)
        assert (same["first_nonfinite"], same["origin"]) == (first, o)
    # the FP16 sum of finite gradients: born in the all-reduce
    ov = _cross_rank(ampprobe.postmortem(str(job / "overflow")))
    assert ov["origin"]["kind"] == "allreduce", ov["origin"]
    assert ov["first_nonfinite"]["site"] == "grad_post_allreduce"
    assert _cross_rank(ampprobe.postmortem(str(job / "prediv")))[
        "verdict"] == "healthy"
    # weights that part: the digests disagree from that step on
    dr = _cross_rank(ampprobe.postmortem(str(job / "drift")))
    assert dr["verdict"] != "healthy"
    dis = [d for d in dr["disagreements"] if d["field"] == "weight_digest"]
    assert len(dis) == 1 and dis[0]["step"] == W.DRIFT_STEP, dr[
        "disagreements"]
    assert {dis[0]["rank_a"], dis[0]["rank_b"]} == {0, 1}


def test_postmortem_of_a_set_of_one(job, tmp_path):
    # a directory (or glob) left with one rank file of a two-rank job: the
    # cross-rank document names the lost rank, as `ampprobe postmortem DIR`
    # does; the file named alone is the one-process document
    import shutil
    kept = tmp_path / "left"
    kept.mkdir()
    shutil.copy(job / "bad-input" / "trace.rank0.h5", kept)
    for arg in (str(kept), str(kept / "trace.rank*.h5"), [str(kept)]):
        doc = ampprobe.postmortem(arg)
        assert doc.get("kind") == "ranks", doc.keys()
        assert doc["ranks_missing"] == [1], doc["ranks_missing"]
        assert doc["verdict"] != "healthy"
        assert ampprobe.verdict(arg) == doc["verdict"]
    alone = ampprobe.postmortem(str(kept / "trace.rank0.h5"))
    assert alone.get("kind") != "ranks" and "ranks_missing" not in alone
    # a single-process trace in a directory stays the one-process document
    solo = tmp_path / "solo"
    solo.mkdir()
    with ampprobe.Session(str(solo / "t.h5")) as s:
        a = s.register("a")
        s.begin_step(0)
        s.record(a, "fwd_out", np.ones(8, dtype=np.float32))
        s.set_scalars(loss=1.0)
        s.end_step()
    doc = ampprobe.postmortem(str(solo))
    assert doc.get("kind") != "ranks" and "ranks_missing" not in doc, doc


def test_example_ddp_by_spawn(tmp_path):
    """examples/train.py --ddp --ranks 2 (torch.multiprocessing.spawn): a
    NaN in rank 1's slice at step 1, carried to rank 0 by the all-reduce."""
    out = tmp_path / "run.h5"
    r = run_py([EXAMPLE, "--ddp", "--ranks", "2", "--steps", "3",
                "--precision", "bf16", "--nan-rank", "1", "--nan-step", "1",
                "--trace", str(out)], timeout=400,
               env={"OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr.decode()[-4000:]
    files = ampprobe.trace_set(str(tmp_path))
    assert files == [str(tmp_path / "run.rank0.h5"),
                     str(tmp_path / "run.rank1.h5")]
    ts = [ampprobe.read_trace(f) for f in files]
    assert [(t["info"]["rank"], t["info"]["world_size"]) for t in ts] == [
        (0, 2), (1, 2)]
    assert ts[0]["info"]["run_id"] == ts[1]["info"]["run_id"] != ""
    firsts = []
    for t in ts:
        rec = t["records"]
        bad = rec[_nonfinite(rec) > 0]
        bad = bad[np.lexsort((bad["seq"], bad["step"]))][0]
        firsts.append((int(bad["step"]), _names(t)[bad["layer"]],
                       SITES[bad["site"]]))
    assert firsts[1] == (1, "input", "fwd_out")
    assert firsts[0][0] == 1 and firsts[0][2] == "grad_post_allreduce"
    d = [t["steps"]["weight_digest"] for t in ts]
    assert d[0][0] == d[1][0]
    # the job's command (the spawning script), not the spawn stub: the
    # post-mortem's suggested commands start from it
    for t in ts:
        cmd = t["info"]["command_line"]
        assert "train.py" in cmd and "--ddp" in cmd and \
            "spawn_main" not in cmd, cmd
    doc = ampprobe.postmortem(str(tmp_path))
    if doc.get("kind") == "ranks":  # the cross-rank document (C3)
        assert doc["origin"]["born_on"] == [1], doc["origin"]
        assert doc["origin"]["carried_to"] == [0], doc["origin"]


# ---- uneven inputs: DDP's join() (three ranks) ----------------------------------
# A rank out of batches joins: DDP calls the comm hook with zero buckets to
# shadow the others' all-reduces, with no forward of that rank. The tracer
# opened a step there and filed the others' all-reduces under it: the
# post-mortem named the joined rank at the wrong step, "born in the
# all-reduce", and a healthy job "ended early" a step late.

JOIN_WORLD = 3


@pytest.fixture(scope="module")
def join_job(tmp_path_factory):
    out = tmp_path_factory.mktemp("join")
    t0 = time.time()
    launch(str(out), list(W.JOIN), world=JOIN_WORLD)
    print("3-rank gloo join() job, %d scenarios: %.1f s" % (
        len(W.JOIN), time.time() - t0))
    return out


def _join_seen(job, sc):
    out = []
    for r in range(JOIN_WORLD):
        with open(job / sc / ("rank%d.json" % r)) as f:
            out.append(json.load(f))
    return out


def _join_steps(job, sc, rank):
    """(the steps table's steps, the steps of the records) of rank's trace,
    and the count of all-reduce records per step."""
    t = ampprobe.read_trace(str(job / sc / ("trace.rank%d.h5" % rank)))
    r = t["records"]
    ar = r[(r["site"] == PRE) | (r["site"] == POST)]
    per = {int(k): int((ar["step"] == k).sum()) for k in set(ar["step"])}
    return [int(x) for x in t["steps"]["step"]], sorted(
        set(int(x) for x in r["step"])), per, t


def _check_joined(job, sc, rank, steps, shadowed_steps, marked=True):
    """The joined rank's trace: its real steps and no other, each with
    its own all-reduces (as many as a step of a rank that did not join),
    every scalar measured; the tracer counted the backwards it shadowed,
    and the trace carries the join mark when the rank ended joined
    (marked; not when it came back for a later epoch)."""
    got, rec_steps, per, t = _join_steps(job, sc, rank)
    assert got == steps, (sc, rank, got)
    assert rec_steps == steps, (sc, rank, rec_steps)
    _, _, full, tl = _join_steps(job, sc, JOIN_WORLD - 1)  # never joins
    assert set(per) == set(steps) and all(per[k] == full[k] for k in steps), (
        per, full)
    # the scalars the job gave, as on the last rank (the phantom step had
    # none: loss and scale "not measured")
    um = dict(zip(tl["steps"]["step"], tl["steps"]["unmeasured"]))
    assert [int(u) for u in t["steps"]["unmeasured"]] == [
        int(um[k]) for k in steps], (t["steps"]["unmeasured"], um)
    seen = _join_seen(job, sc)[rank]
    assert seen["joined_steps"] == shadowed_steps, seen
    assert seen["shadowed"] > 0 and seen["buckets"] > seen["shadowed"], seen
    assert seen["joined"] is marked, seen
    assert t["info"]["joined"] == int(marked) and t["info"]["complete"], (
        t["info"])
    assert tl["info"]["joined"] == 0  # the last rank never joins


def _ranks_entry(doc, rank):
    return [e for e in doc["ranks"] if e["rank"] == rank][0]


def test_join_nan_names_the_rank_and_step(join_job):
    # rank 0 has 3 batches, ranks 1-2 five; rank 2's batch of step 4 holds
    # a NaN. It was: first non-finite rank 0 step 3 (a step rank 0 never
    # ran), "born in the all-reduce", fix "all-reduce in FP32".
    doc = _cross_rank(ampprobe.postmortem(str(join_job / "join-nan")))
    first = doc["first_nonfinite"]
    assert (first["rank"], first["step"], first["layer"], first["site"]) == (
        2, 4, "input", "fwd_out"), first
    o = doc["origin"]
    assert o["kind"] == "rank" and o["step"] == 4, o
    assert o["born_on"] == [2] and o["carried_to"] == [1], o
    assert "all-reduce in fp32" not in (o["next_step"] or "").lower(), o
    assert doc["verdict"] == "diverged" and doc["disagreements"] == []
    e0 = _ranks_entry(doc, 0)
    assert (e0["steps"], e0["last_step"], e0["first_nonfinite"]) == (
        3, 2, None), e0
    # rank 0 joined, it did not end early (the NaN is rank 2's)
    assert e0["joined"] is True and doc["joined"] == [0], e0
    assert doc["ended_early"] == [], doc["ended_early"]
    _check_joined(join_job, "join-nan", 0, [0, 1, 2], 2)
    # the NaN rank warned for its own batch; rank 0 saw nothing
    seen = _join_seen(join_job, "join-nan")
    assert seen[0]["warnings"] == [] and len(seen[2]["warnings"]) == 1, seen


def test_join_healthy_job(join_job):
    # no NaN: nothing non-finite, no disagreement, and rank 0's trace ends
    # at its last step, 2 (it had a step 3 of NaN loss holding the others'
    # all-reduces, and the post-mortem said "ended early ... at step 3");
    # the tracer marked it joined when DDP shadowed the others' backwards,
    # so it is named as joined, not as ended early
    doc = _cross_rank(ampprobe.postmortem(str(join_job / "join-healthy")))
    assert doc["first_nonfinite"] is None and doc["origin"]["kind"] == "none"
    assert doc["disagreements"] == [] and doc["ranks_not_closed"] == 0
    e0 = _ranks_entry(doc, 0)
    assert (e0["steps"], e0["last_step"], e0["complete"], e0["joined"]) == (
        3, 2, True, True), e0
    for r in (1, 2):
        e = _ranks_entry(doc, r)
        assert (e["last_step"], e["joined"]) == (4, False), e
    _check_joined(join_job, "join-healthy", 0, [0, 1, 2], 2)
    assert doc["ended_early"] == [] and doc["joined"] == [0], doc
    assert doc["verdict"] == "healthy", doc


def test_join_healthy_verdict(join_job):
    # it was "degraded": the C post-mortem could not tell a rank that left
    # by DDP's join() from one that ended by an exception
    doc = _cross_rank(ampprobe.postmortem(str(join_job / "join-healthy")))
    assert doc["verdict"] == "healthy", doc["ended_early"]
    cli = ampprobe.find_cli()
    if cli is not None:  # the text the CLI prints, exit 0 (healthy)
        text = subprocess.run(
            [cli, "postmortem", str(join_job / "join-healthy")],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            universal_newlines=True)
        assert text.returncode == 0, text.stdout
        assert "joined            rank 0 ran out of inputs and joined the " \
            "others after step 2" in text.stdout, text.stdout
        assert "ended early" not in text.stdout, text.stdout


def test_join_two_ranks_join_at_different_steps(join_job):
    # batches 2, 3, 5 (the job's own hook, wrapped): ranks 0 and 1 join
    # after steps 1 and 2; rank 2's batch of step 3 holds a NaN, summed
    # with the zeros of two joined ranks. It was: rank 0 at step 2, "born
    # in the all-reduce".
    doc = _cross_rank(ampprobe.postmortem(str(join_job / "join-two")))
    first = doc["first_nonfinite"]
    assert (first["rank"], first["step"], first["layer"], first["site"]) == (
        2, 3, "input", "fwd_out"), first
    o = doc["origin"]
    assert o["kind"] == "rank" and o["born_on"] == [2], o
    assert o["carried_to"] == [], o
    assert sorted(o["never_nonfinite"]) == [0, 1], o
    for r, last in ((0, 1), (1, 2), (2, 4)):
        assert _ranks_entry(doc, r)["last_step"] == last
    assert doc["joined"] == [0, 1] and doc["ended_early"] == [], doc
    _check_joined(join_job, "join-two", 0, [0, 1], 3)
    _check_joined(join_job, "join-two", 1, [0, 1, 2], 2)


def test_join_the_joining_rank_goes_bad(join_job):
    # rank 0's last batch (step 2) holds the NaN, then it joins: born on
    # rank 0 at step 2, carried to 1-2; rank 0's trace ends at step 2
    doc = _cross_rank(ampprobe.postmortem(str(join_job / "join-last")))
    first = doc["first_nonfinite"]
    assert (first["rank"], first["step"], first["layer"]) == (
        0, 2, "input"), first
    o = doc["origin"]
    assert o["born_on"] == [0] and o["carried_to"] == [1, 2], o
    assert doc["disagreements"] == []
    # joined after its NaN: the join excuses its early end, not the NaN
    assert doc["joined"] == [0] and doc["ended_early"] == [], doc
    assert doc["verdict"] == "diverged", doc["verdict"]
    _check_joined(join_job, "join-last", 0, [0, 1, 2], 2)


def test_join_each_epoch_keeps_the_step_numbers(join_job):
    # two epochs under join(), batches 3, 5, 5 then 3 each: rank 0's second
    # epoch is steps 5-7 as on the other ranks (it was 3-5: its first step
    # of epoch 2 also held the shadowed all-reduces, the digests of steps
    # 3-5 disagreed, and it "ended early" at 5); the job ends together,
    # healthy
    doc = _cross_rank(ampprobe.postmortem(str(join_job / "join-epochs")))
    # joined in epoch 1, back in epoch 2: its trace ends unmarked, with
    # the others
    _check_joined(join_job, "join-epochs", 0, [0, 1, 2, 5, 6, 7], 2,
                  marked=False)
    assert doc["joined"] == [], doc["joined"]
    digests = {}
    for r in range(JOIN_WORLD):
        _, _, _, t = _join_steps(join_job, "join-epochs", r)
        digests[r] = {int(s): int(d) for s, d in
                      zip(t["steps"]["step"], t["steps"]["weight_digest"])}
    for s in (5, 6, 7):  # after DDP's final sync of epoch 1: equal weights
        assert len({digests[r][s] for r in range(JOIN_WORLD)}) == 1, s
    assert doc["disagreements"] == [] and doc["ended_early"] == [], doc
    assert doc["first_nonfinite"] is None
    assert doc["verdict"] == "healthy", doc


# ---- in-process: naming, identity, digest -------------------------------------

def _small(tmp_path, name, **kw):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))
    return model, at.Tracer(model, str(tmp_path / name), precision="fp32",
                            **kw)


def _one_step(model, tr, opt=None):
    x = torch.randn(5, 4)
    loss = model(x).square().mean()
    loss.backward()
    if opt is not None:
        opt.step()
        opt.zero_grad()
    tr.end_step(loss=loss, optimizer=opt)


@pytest.mark.parametrize("path,want", [
    ("t.h5", "t.rank1.h5"), ("t_{rank}.h5", "t_1.h5"),
    ("trace", "trace.rank1.h5")])
def test_explicit_rank_names_the_file(tmp_path, path, want, monkeypatch):
    monkeypatch.delenv("AMPPROBE_RUN_ID", raising=False)
    assert ampprobe.rank_trace_path(str(tmp_path / path), 1) == str(
        tmp_path / want)
    model, tr = _small(tmp_path, path, rank=1, world_size=2, run_id="job-7")
    _one_step(model, tr)
    tr.close()
    assert tr.path == str(tmp_path / want)
    assert not os.path.exists(str(tmp_path / path))
    info = ampprobe.read_trace(tr.path)["info"]
    assert (info["rank"], info["world_size"], info["run_id"]) == (1, 2,
                                                                 "job-7")


def test_run_id_from_environment_without_a_group(tmp_path, monkeypatch):
    monkeypatch.setenv("AMPPROBE_RUN_ID", "nightly.42")
    model, tr = _small(tmp_path, "t.h5", rank=0, world_size=4)
    tr.close()
    assert ampprobe.read_trace(tr.path)["info"]["run_id"] == "nightly.42"


def test_not_distributed_by_default(tmp_path):
    assert not dist.is_initialized()
    model, tr = _small(tmp_path, "t.h5")
    _one_step(model, tr)
    tr.close()
    info = ampprobe.read_trace(str(tmp_path / "t.h5"))["info"]
    assert (info["rank"], info["world_size"], info["run_id"]) == (-1, 0, "")


# ---- the join mark (probe_session_mark_joined) --------------------------------

def _two_ranks(tmp_path, joined_at, last=4, mark=True):
    """Rank 1 trains steps 0..last; rank 0 stops after step joined_at and
    (mark) says it joined. Returns rank 0's tracer, closed."""
    model, t1 = _small(tmp_path, "t.h5", rank=1, world_size=2, run_id="j-1")
    for _ in range(last + 1):
        _one_step(model, t1)
    t1.close()
    model, t0 = _small(tmp_path, "t.h5", rank=0, world_size=2, run_id="j-1")
    for _ in range(joined_at + 1):
        _one_step(model, t0)
    if mark:
        t0.mark_joined()
        assert t0.joined
    t0.close()
    return t0


def test_mark_joined_by_hand(tmp_path):
    """A job whose join the tracer cannot see (no DDP hook) says it: the
    trace carries the mark, the set is healthy, rank 0 is `joined`."""
    t0 = _two_ranks(tmp_path, 2)
    info = ampprobe.read_trace(t0.path)["info"]
    assert (info["joined"], info["complete"], info["last_step"]) == (1, 1, 2)
    doc = _cross_rank(ampprobe.postmortem(str(tmp_path)))
    assert doc["verdict"] == "healthy", doc
    assert doc["joined"] == [0] and doc["ended_early"] == [], doc
    assert _ranks_entry(doc, 0)["joined"] is True


def test_no_mark_is_ended_early(tmp_path):
    """The same early stop without the mark: an exception, as far as the
    traces tell ("ended early", degraded)."""
    t0 = _two_ranks(tmp_path, 2, mark=False)
    assert not t0.joined
    assert ampprobe.read_trace(t0.path)["info"]["joined"] == 0
    doc = _cross_rank(ampprobe.postmortem(str(tmp_path)))
    assert doc["verdict"] == "degraded", doc
    assert doc["ended_early"] == [0] and doc["joined"] == [], doc


def test_mark_joined_inside_a_step_and_cleared(tmp_path):
    model, tr = _small(tmp_path, "t.h5", rank=0, world_size=2)
    _one_step(model, tr)
    tr.begin_step()
    with pytest.raises(RuntimeError, match="inside step 1"):
        tr.mark_joined()
    with pytest.raises(ampprobe.ProbeError) as e:  # libprobe says so too
        tr.session.mark_joined()
    assert e.value.name == "ERR_STATE"
    tr.end_step()
    tr.mark_joined()
    _one_step(model, tr)  # the rank is back (a next epoch): cleared
    assert not tr.joined
    tr.close()
    assert ampprobe.read_trace(tr.path)["info"]["joined"] == 0
    with pytest.raises(RuntimeError, match="after close"):
        tr.mark_joined()


def test_shadow_in_a_step_begun_by_hand_marks_at_its_end(tmp_path):
    """DDP's shadow (the comm hook's _joined_step) while a step begun by
    hand is open: marked when that step ends, not refused inside it; a
    shadow after the mark changes nothing."""
    model, tr = _small(tmp_path, "t.h5", rank=0, world_size=2)
    _one_step(model, tr)
    tr.begin_step()
    tr._joined_step()
    assert not tr.joined and tr.joined_steps == 1
    tr.end_step()
    assert tr.joined
    tr._joined_step()
    assert tr.joined and tr.joined_steps == 2
    tr.close()
    info = ampprobe.read_trace(tr.path)["info"]
    assert (info["joined"], info["last_step"]) == (1, 1)


_KILLED_AFTER_JOIN = r"""
import os, sys, torch, torch.nn as nn
import ampprobe.torch as at
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))
tr = at.Tracer(model, sys.argv[1], precision="fp32", rank=0, world_size=2,
               run_id="j-1")
for _ in range(3):
    model(torch.randn(5, 4)).square().mean().backward()
    tr.end_step()
tr.mark_joined()
tr.session.flush()
os._exit(0)  # killed while shadowing the others: never closed
"""


def test_joined_then_killed_is_not_closed(tmp_path):
    """The mark does not say how the run ended: a rank killed after it
    joined is still "not closed" (degraded), and not in `joined`."""
    model, t1 = _small(tmp_path, "t.h5", rank=1, world_size=2, run_id="j-1")
    for _ in range(5):
        _one_step(model, t1)
    t1.close()
    p = run_py(["-c", _KILLED_AFTER_JOIN, str(tmp_path / "t.h5")])
    assert p.returncode == 0, p.stdout + p.stderr
    info = ampprobe.read_trace(str(tmp_path / "t.rank0.h5"))["info"]
    assert (info["joined"], info["complete"], info["last_step"]) == (1, 0, 2)
    doc = _cross_rank(ampprobe.postmortem(str(tmp_path)))
    assert doc["verdict"] == "degraded", doc
    assert doc["ranks_not_closed"] == 1 and doc["joined"] == [], doc
    assert doc["stopped_first"]["rank"] == 0, doc["stopped_first"]
    assert _ranks_entry(doc, 0)["joined"] is True


@pytest.mark.parametrize("kw,msg", [
    (dict(rank=2, world_size=2), "not in"),
    (dict(rank=-1, world_size=2), "not in"),
    (dict(rank=0, world_size=2, run_id="has space"), "run id"),
    (dict(rank=0, world_size=2, run_id="x" * 65), "run id"),
    (dict(distributed=True), "process group"),
])
def test_identity_errors(tmp_path, kw, msg):
    with pytest.raises(ValueError, match=msg):
        _small(tmp_path, "t.h5", **kw)
    assert os.listdir(str(tmp_path)) == []


def test_library_refuses_a_bad_run_id(tmp_path):
    with pytest.raises(ampprobe.ProbeError) as e:
        ampprobe.Session(str(tmp_path / "t.h5"), rank=0, world_size=1,
                         run_id="a/b")
    assert e.value.name == "ERR_INVALID_ARG"


def _close_one_step(model, tr):
    _one_step(model, tr)
    tr.close()


@pytest.mark.parametrize("files,msg", [
    ((("t.h5", 0, "job-1"), ("u.h5", 1, "job-2")), "mixed run ids"),
    ((("t.h5", 0, "job-1"), ("u.h5", 0, "job-1")), "rank 0 twice"),
])
def test_refused_set_says_why(tmp_path, files, msg):
    """A set the library refuses raises with the set's own reason, not a
    stale or generic message."""
    for name, rank, run_id in files:
        _close_one_step(*_small(tmp_path, name, rank=rank, world_size=2,
                                run_id=run_id))
    with pytest.raises(ampprobe.ProbeError) as e:
        ampprobe.postmortem(str(tmp_path))
    assert msg in str(e.value)


def _fnv1a64(data, h):
    for b in data:
        h = ((h ^ b) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return h


def test_digest64_is_documented_chainable(tmp_path):
    a = np.arange(7, dtype=np.float32) * 0.37
    whole = ampprobe.digest64(a)
    assert whole == ampprobe.digest64(a[4:], ampprobe.digest64(a[:4]))
    assert whole != ampprobe.digest64(a[::-1].copy())
    assert ampprobe.digest64(b"") == ampprobe.DIGEST64_INIT
    assert ampprobe.digest64(a) == _fnv1a64(a.tobytes(),
                                            ampprobe.DIGEST64_INIT)


def test_weight_digest_is_the_parameters_after_the_step(tmp_path):
    model, tr = _small(tmp_path, "t.h5", weight_digest=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    want = []
    for _ in range(3):
        _one_step(model, tr, opt)
        h = None
        for p in model.parameters():
            h = ampprobe.digest64(p.detach().numpy(), h)
        want.append(h)
    tr.close()
    st = ampprobe.read_trace(tr.path)["steps"]
    assert [int(d) for d in st["weight_digest"]] == want
    assert len(set(want)) == 3
    model, tr = _small(tmp_path, "off.h5")
    _one_step(model, tr)
    tr.close()
    st = ampprobe.read_trace(tr.path)["steps"]
    assert st["unmeasured"][0] & ampprobe.core.SCALAR_WEIGHT_DIGEST


# ---- in-process: the hook in a one-rank gloo group (conftest.group) -------------

def _ddp_run(tmp_path, name, steps=2, ddp_kw=None, **kw):
    torch.manual_seed(0)
    model = Net()
    ddp = nn.parallel.DistributedDataParallel(model, **(ddp_kw or {}))
    loss_fn = ProbNLL()
    tr = at.Tracer(ddp, str(tmp_path / name), kinds={RevINLike: "revin"},
                   loss_fn=loss_fn, precision="fp32", **kw)
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-2)
    for s in range(steps):
        x, y = data(s)
        loss = loss_fn(ddp(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        tr.end_step(loss=loss, optimizer=opt)
    tr.close()
    return tr, ampprobe.read_trace(tr.path)


@pytest.mark.parametrize("ddp_kw", [
    {}, dict(gradient_as_bucket_view=True),
    dict(bucket_cap_mb=0.0001)],  # ~100 bytes: several buckets a step
    ids=["default", "bucket-view", "small-buckets"])
def test_one_rank_group_records_the_buckets(tmp_path, group, ddp_kw,
                                           monkeypatch):
    if "bucket_cap_mb" in ddp_kw:  # DDP's first bucket has its own cap
        monkeypatch.setattr(dist, "_DEFAULT_FIRST_BUCKET_BYTES", 256)
    tr, t = _ddp_run(tmp_path, "t.h5", ddp_kw=ddp_kw)
    if "bucket_cap_mb" in ddp_kw:
        # one bucket in the first step, then >= 3 (torch 1.13: 3, 2.x: 4)
        assert tr.comm_recorder.buckets >= 1 + 3
    else:
        assert tr.comm_recorder.buckets == 2
    assert tr.path == str(tmp_path / "t.rank0.h5")
    assert (t["info"]["rank"], t["info"]["world_size"]) == (0, 1)
    assert t["info"]["run_id"]
    r = t["records"]
    names = _names(t)
    assert "module.fc1" not in names and "fc1" in names  # DDP unwrapped
    for lid in _param_layers(t):
        for step in range(2):
            rows = r[(r["layer"] == lid) & (r["step"] == step)]
            wg = rows[rows["site"] == SITES.index("weight_grad")]
            pre, post = rows[rows["site"] == PRE], rows[rows["site"] == POST]
            # one rank: what it sends is what comes back, its gradient
            assert sorted(pre["sum"]) == sorted(post["sum"])
            np.testing.assert_allclose(sorted(pre["sum"]), sorted(wg["sum"]),
                                       rtol=1e-6, atol=1e-9)


def test_hook_for_a_ddp_made_after_the_tracer(tmp_path, group):
    torch.manual_seed(0)
    model = Net()
    tr = at.Tracer(model, str(tmp_path / "t.h5"), precision="fp32")
    ddp = nn.parallel.DistributedDataParallel(model)
    ddp.register_comm_hook(None, tr.comm_hook(allreduce_dtype="fp16"))
    x, y = data(0)
    ProbNLL()(ddp(x), y).backward()
    tr.end_step()
    tr.close()
    r = ampprobe.read_trace(tr.path)["records"]
    wg = r[r["site"] == SITES.index("weight_grad")]
    for site in (PRE, POST):
        rows = r[r["site"] == site]
        assert sorted(rows["count"]) == sorted(wg["count"])
        assert (rows["dtype"] == 1).all()
    assert tr.comm_recorder.buckets == 1


def test_training_goes_on_after_close(tmp_path, group):
    """DDP keeps the hook after tracer.close(): it all-reduces unrecorded,
    and the gradients are those of the untraced model."""
    torch.manual_seed(0)
    model = Net()
    ddp = nn.parallel.DistributedDataParallel(model)
    tr = at.Tracer(ddp, str(tmp_path / "t.h5"), precision="fp32")
    x, y = data(0)
    ProbNLL()(ddp(x), y).backward()
    tr.end_step()
    tr.close()
    n = tr.comm_recorder.buckets
    ddp.zero_grad()
    ProbNLL()(ddp(x), y).backward()
    assert tr.comm_recorder.buckets > n
    torch.manual_seed(0)
    ref = Net()
    ProbNLL()(ref(x), y).backward()
    for a, b in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(a.grad, b.grad)
    assert len(ampprobe.read_trace(tr.path)["steps"]) == 1


def test_fp16_allreduce_records_binary16(tmp_path, group):
    tr, t = _ddp_run(tmp_path, "t.h5", allreduce_dtype="fp16",
                     allreduce_prediv=False)
    r = t["records"]
    for site in (PRE, POST):
        assert (r[r["site"] == site]["dtype"] == 1).all()


def test_a_jobs_own_hook_is_wrapped(tmp_path, group):
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    calls = []

    def mine(state, bucket):
        calls.append(bucket.index())
        return default_hooks.allreduce_hook(state, bucket)

    tr, t = _ddp_run(tmp_path, "t.h5", comm_hook=mine)
    assert calls and tr.comm_recorder.buckets == len(calls)
    r = t["records"]
    assert (r["site"] == PRE).sum() == (r["site"] == POST).sum() > 0
    cfg = json.loads(t["info"]["config_json"])
    assert cfg["allreduce"]["hook"] == "job"


def test_a_registered_hook_is_left_alone(tmp_path, group):
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    torch.manual_seed(0)
    model = Net()
    ddp = nn.parallel.DistributedDataParallel(model)
    ddp.register_comm_hook(None, default_hooks.allreduce_hook)
    with pytest.warns(RuntimeWarning, match="communication hook already"):
        tr = at.Tracer(ddp, str(tmp_path / "t.h5"), precision="fp32")
    x, y = data(0)
    ProbNLL()(ddp(x), y).backward()
    tr.end_step()
    tr.close()
    r = ampprobe.read_trace(tr.path)["records"]
    assert len(r) > 0 and not np.isin(r["site"], [PRE, POST]).any()
    assert tr.comm_recorder is None


# ---- FSDP2 (fully_shard): sharded parameters are DTensors --------------------------

def _has_fully_shard():
    try:
        from torch.distributed.fsdp import fully_shard  # noqa: F401
    except Exception:  # noqa: BLE001 (1.13 under Python 3.11: ValueError)
        return False
    return True


HAVE_FSDP2 = _has_fully_shard()


@pytest.mark.skipif(not HAVE_FSDP2, reason="torch %s has no "
                    "torch.distributed.fsdp.fully_shard (FSDP2)"
                    % torch.__version__)
def test_fsdp2_job_records_each_ranks_gradient_and_shard(tmp_path):
    """A 2-rank FSDP2 job: the tracer raised at the first forward (a
    sharded DTensor's data_ptr is not its elements) and, past that, had no
    weight_grad at all (FSDP2 gives the sharded parameters their gradient
    without autograd hooks). Now each rank records the weights as used
    (gathered: the full fc1), its own gradient before the reduce-scatter
    (the full fc1 gradient of its batch, as a plain model computes it) and
    its shard of the master weights (half of fc1's rows each)."""
    launch(str(tmp_path), ["fsdp"])
    W_, FC1 = 12 * 16, "fc1"
    for r in range(WORLD):
        t = ampprobe.read_trace(str(tmp_path / "fsdp" /
                                    ("trace.rank%d.h5" % r)))
        assert (t["info"]["rank"], t["info"]["world_size"]) == (r, WORLD)
        names = _names(t)
        rec = t["records"]
        mine = rec[rec["layer"] == names.index(FC1)]

        def site(name, step=0):
            rows = mine[(mine["site"] == SITES.index(name)) &
                        (mine["step"] == step)]
            return sorted(rows, key=lambda x: -x["count"])

        assert [x["count"] for x in site("weight")] == [W_, 12]
        assert [x["count"] for x in site("master_weight")] == [W_ // 2, 6]
        wg = site("weight_grad")
        assert [x["count"] for x in wg] == [W_, 12]
        # the same step 0 gradient from a plain model on rank r's batch
        torch.manual_seed(0)
        ref = Net()
        x, y = data(0 * WORLD + r)
        ProbNLL()(ref(x), y).backward()
        np.testing.assert_allclose(wg[0]["sum"],
                                   float(ref.fc1.weight.grad.sum()),
                                   rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(wg[0]["absmax"],
                                   float(ref.fc1.weight.grad.abs().max()),
                                   rtol=1e-6)
        for s in range(W.STEPS):
            assert len(site("weight_grad", s)) == 2, s
        assert (rec["nan_count"] + rec["posinf_count"]).sum() == 0
    doc = ampprobe.postmortem(str(tmp_path / "fsdp"))  # the rank set
    assert doc["kind"] == "ranks" and doc["verdict"] == "healthy", doc
    assert doc["first_nonfinite"] is None and doc["ranks_missing"] == []
    assert doc["disagreements"] == []


@pytest.mark.skipif(not HAVE_FSDP2, reason="torch %s has no "
                    "torch.distributed.fsdp.fully_shard (FSDP2)"
                    % torch.__version__)
@pytest.mark.parametrize("when", ["before", "after"])
def test_fsdp2_refuses_a_weight_digest(tmp_path, group, when):
    """weight_digest=True on sharded parameters: each rank holds other
    shards, so the digests would always differ (the cross-rank post-mortem
    would call every step a disagreement); it hashed a DTensor's
    data_ptr(), not its values. Refused by the Tracer, saying why, when the
    model is sharded already; when it was sharded after, end_step warns
    once and stores the digest as not measured (it raised, leaving a step
    no retry could end)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    torch.manual_seed(0)
    model = Net()
    mesh = init_device_mesh("cpu", (1,))
    if when == "before":
        fully_shard(model, mesh=mesh)
        with pytest.raises(ValueError, match="sharded"):
            at.Tracer(model, str(tmp_path / "t.h5"), weight_digest=True)
        return
    tr = at.Tracer(model, str(tmp_path / "t.h5"), weight_digest=True,
                   precision="fp32")
    fully_shard(model, mesh=mesh)
    for step in range(2):
        x, y = data(step)
        ProbNLL()(model(x), y).backward()
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            tr.end_step()  # the step ends: the next forward opens step 1
        assert [str(x.message) for x in w if "sharded" in str(x.message)
                ] == (["%s (the digest is off from step 0: not measured)"
                       % at._SHARDED_DIGEST] if step == 0 else [])
    tr.close()
    t = ampprobe.read_trace(tr.path)
    assert list(t["steps"]["step"]) == [0, 1]
    assert (t["steps"]["unmeasured"] & _lib.SCALAR_WEIGHT_DIGEST).all()


@pytest.mark.skipif(not HAVE_FSDP2, reason="torch %s has no "
                    "torch.distributed.fsdp.fully_shard (FSDP2)"
                    % torch.__version__)
def test_fsdp2_mixed_precision_records_bf16_use_and_names_the_rank(tmp_path):
    """FSDP2 with MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32),
    the way torch 2 jobs shard and cast: the modules run on bf16 copies of
    the gathered parameters, which the tracer records as used (bf16, whole
    fc1) with their bf16 gradient before the fp32 reduce-scatter, and the
    fp32 master shard; rank BAD_RANK's NaN input at step BAD_STEP reaches
    every rank through the reduce-scatter, and the rank set's post-mortem
    names that rank, step and the input, not rank 0's NaN shard."""
    launch(str(tmp_path), ["fsdp-mp"])
    d = tmp_path / "fsdp-mp"
    W_, BF16, F32 = 12 * 16, 2, 0
    for r in range(WORLD):
        t = ampprobe.read_trace(str(d / ("trace.rank%d.h5" % r)))
        names = _names(t)
        rec = t["records"]
        fc1 = rec[(rec["layer"] == names.index("fc1")) & (rec["step"] == 0)]

        def site(name):
            return [(int(x["count"]), int(x["dtype"])) for x in fc1
                    if x["site"] == SITES.index(name)]
        assert sorted(site("weight")) == [(12, BF16), (W_, BF16)]
        assert sorted(site("weight_grad")) == [(12, BF16), (W_, BF16)]
        assert sorted(site("master_weight")) == [(6, F32), (W_ // 2, F32)]
        inp = rec[(rec["layer"] == names.index("input")) & (rec["step"] == 0)]
        assert [(int(x["count"]), int(x["dtype"])) for x in inp] == [
            (16 * 16, BF16)]  # as FSDP cast it (cast_forward_inputs)
        # rank r's step-0 fc1 gradient: a plain bf16 copy's on its batch
        torch.manual_seed(0)
        ref = W.MLP().to(torch.bfloat16)
        x, y = data(0 * WORLD + r)
        ProbNLL()(ref(x.to(torch.bfloat16)).float(), y).backward()
        wg = max((x for x in fc1 if x["site"] == SITES.index("weight_grad")),
                 key=lambda x: x["count"])
        np.testing.assert_allclose(wg["absmax"], float(
            ref.fc1.weight.grad.float().abs().max()), rtol=1e-2)
        info = json.loads((d / ("rank%d.json" % r)).read_text())
        first = info["warnings"][0]
        assert ("step %d" % W.BAD_STEP) in first, first
        if r == W.BAD_RANK:
            assert "module 'input'" in first, first
        else:  # its shard came back NaN from the reduce-scatter
            assert "optimizer phase" in first and "master_weight" in first
    doc = ampprobe.postmortem(str(d))
    assert doc["kind"] == "ranks" and doc["verdict"] == "diverged", doc
    nf = doc["first_nonfinite"]
    assert (nf["rank"], nf["step"], nf["layer"], nf["site"]) == (
        W.BAD_RANK, W.BAD_STEP, "input", "fwd_out"), nf
