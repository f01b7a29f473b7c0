"""Reading your own trace while you write it: a training loop that checks
the trace its own Tracer writes every few steps - ampprobe.verdict(),
postmortem(), read_trace(), Trace() - and stops early when it diverges.

Every such read raised ProbeError "corrupt or truncated trace ... corrupt
HDF5 file (root attributes: bad object header version number)" while
`ampprobe postmortem --json` in another process read the same file at the
same moment (hunt F5, 2026-12-05): HDF5 gave the reader, in this process
and in the isolated reader's child, the writer's open file instead of the
file. Here each read must give what the CLI gives at that moment, the loop
must stop at the first check after the NaN, and the finished trace must
equal that of the same loop run without the reads. Full trace and flight
recorder, and two Tracers in one process."""
import json
import subprocess

import pytest

torch = pytest.importorskip("torch")
import torch.nn as nn  # noqa: E402

import ampprobe  # noqa: E402
import ampprobe.torch as at  # noqa: E402

STEPS = 12
NAN_STEP = 7   # a NaN in the input data
EVERY = 3      # the loop reads its trace after steps 2, 5, 8, ...
STOP = 8       # the first read after the NaN: the loop stops there


class Job:
    """A small regression job with its own Tracer."""

    def __init__(self, path, mode, seed):
        torch.manual_seed(seed)
        self.model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(),
                                   nn.Linear(16, 4))
        self.crit = nn.MSELoss()
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.01)
        self.gen = torch.Generator().manual_seed(seed)
        self.path = str(path)
        self.tr = at.Tracer(self.model, self.path, mode=mode,
                            loss_fn=self.crit, overwrite=True, flush_steps=1)

    def step(self, s):
        x = torch.randn(4, 8, generator=self.gen)
        y = torch.randn(4, 4, generator=self.gen)
        if s == NAN_STEP:
            x[0, 0] = float("nan")
        loss = self.crit(self.model(x), y)
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
        self.tr.end_step(loss=loss, optimizer=self.opt)


def cli_postmortem(cli, path):
    r = subprocess.run([cli, "postmortem", path, "--json"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode in (0, 1), r.stderr
    return json.loads(r.stdout)


def read_live(cli, job, s):
    """The job's own trace, read in this process after step s, against
    what the CLI reads in another process at the same moment."""
    job.tr.session.flush()
    other = cli_postmortem(cli, job.path)
    pm = ampprobe.postmortem(job.path)
    assert pm == other
    v = ampprobe.verdict(job.path)
    assert v == other["verdict"]
    t = ampprobe.read_trace(job.path)
    assert not t["info"]["complete"]
    assert list(t["steps"]["step"]) == list(range(s + 1))
    with ampprobe.Trace(job.path) as tt:
        assert len(tt.steps()) == s + 1
        assert tt.info["last_step"] == s
    assert other["trace"]["steps"] == s + 1
    return v, pm


def run(cli, jobs, reads):
    """Trains every job until a read says diverged (or STEPS); returns
    the step it stopped after and the verdicts read."""
    seen = []
    for s in range(STEPS):
        for j in jobs:
            j.step(s)
        if reads and s % EVERY == EVERY - 1:
            got = [read_live(cli, j, s) for j in jobs]
            seen.append((s, [v for v, _ in got]))
            if any(v == "diverged" for v, _ in got):
                break
        if not reads and s == STOP:
            break
    for j in jobs:
        j.tr.close()
    return s, seen


def tables(path):
    t = ampprobe.read_trace(path)
    steps = t["steps"].copy()
    steps["wall_time"] = 0  # the only field that depends on the clock
    return t, steps


@pytest.mark.parametrize("modes", [("full",), ("scalars",),
                                   ("full", "scalars")],
                         ids=["full", "flight-recorder", "two-tracers"])
def test_early_stopping_reads_own_trace(tmp_path, cli, modes):
    jobs = [Job(tmp_path / ("live%d.h5" % i), m, seed=i)
            for i, m in enumerate(modes)]
    stopped, seen = run(cli, jobs, reads=True)
    assert stopped == STOP
    # healthy or degraded before the NaN, diverged at the first read after
    assert all("diverged" not in vs for s, vs in seen if s < NAN_STEP)
    assert seen[-1][1][0] == "diverged"

    refs = [Job(tmp_path / ("ref%d.h5" % i), m, seed=i)
            for i, m in enumerate(modes)]
    assert run(cli, refs, reads=False)[0] == STOP
    for j, r in zip(jobs, refs):
        a, sa = tables(j.path)
        b, sb = tables(r.path)
        assert a["info"]["complete"] and b["info"]["complete"]
        assert a["info"]["n_steps"] == STOP + 1
        # bytes: equal NaNs (unmeasured scalars) compare equal
        assert sa.dtype == sb.dtype and sa.tobytes() == sb.tobytes()
        for k in ("records", "scaler_events", "snapshots", "layers"):
            assert a[k].dtype == b[k].dtype, k
            assert a[k].tobytes() == b[k].tobytes(), k
        pm = ampprobe.postmortem(j.path)
        assert pm["verdict"] == "diverged"
        assert pm["event"]["step"] == NAN_STEP
        assert pm == cli_postmortem(cli, j.path)


def test_reader_held_open_is_refused_not_corrupt(tmp_path, cli):
    """A Trace left open pins HDF5's view of its file in this process: a
    later read of the same file, grown since, would share that stale view
    ("corrupt trace: /meta/state counts 6 rows of /steps, the table has
    3"). It is refused, saying why, and reads once the Trace is closed."""
    job = Job(tmp_path / "held.h5", "full", seed=0)
    for s in range(3):
        job.step(s)
    job.tr.session.flush()
    held = ampprobe.Trace(job.path)
    for s in range(3, 6):
        job.step(s)
    job.tr.session.flush()
    for read in (ampprobe.verdict, ampprobe.postmortem, ampprobe.read_trace):
        with pytest.raises(ampprobe.ProbeError) as e:
            read(job.path)
        assert "open in this process by a reader not closed" in str(e.value)
        assert "corrupt" not in str(e.value)
    assert len(held.steps()) == 3  # the held one reads what it opened
    held.close()
    assert read_live(cli, job, 5)[0] != "diverged"
    job.tr.close()
