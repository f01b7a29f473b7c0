#!/usr/bin/python3
"""One rank of the gloo DDP jobs of tests/python/test_distributed.py: joins
the process group from RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT (set by
the test), then runs the scenarios named on the command line one after
another in the same group, each a few steps of a small DDP model traced by
ampprobe.torch.Tracer into OUT/<scenario>/trace.h5 (so
trace.rank<r>.h5), and writes OUT/<scenario>/rank<r>.json (what the rank
saw: its trace path, run id, losses, buckets hooked, the tracer's
NonFiniteWarning messages: on_nonfinite="warn").

Scenarios:
  bad-input  the tests' Net under FP16 emulation with a LossScaler; rank
             BAD_RANK's batch holds a NaN at step BAD_STEP; weight digest on
  healthy    the same Net under bf16 autocast, no NaN; weight digest on
  drift      healthy, but rank DRIFT_RANK nudges one weight after the
             optimizer step of DRIFT_STEP (the ranks' weights part; the
             digests must say so)
  overflow   a bias-free Linear whose scaled gradient is G_ELEM on every
             rank (finite in FP16), all-reduced in FP16 without
             pre-division: the binary16 sum of two is past 65504 (inf)
  prediv     the same with pre-division: finite
  fsdp       the Net sharded by FSDP2 (fully_shard on fc1, head and the
             root; torch >= 2.6), FP32, plain SGD, no DDP
  fsdp-mp    an MLP (the Net less its BatchNorm, which FSDP2's bf16
             parameters do not run) sharded by FSDP2 with
             MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32);
             rank BAD_RANK's batch holds a NaN at step BAD_STEP

Uneven inputs (DDP's join(); run with 3 ranks): the Net with a
LossScaler and the weight digest, each rank's loop under
`with ddp.join():`, its number of batches per epoch from JOIN (a rank
that runs out joins: DDP shadows the others' all-reduces through the comm
hook); a NaN in (rank, step)'s batch (then FP16 emulation, as bad-input;
without one bf16, as healthy), steps numbered by the longest rank:
  join-nan      batches 3, 5, 5; NaN on rank 2 at step 4 (rank 0 joined)
  join-healthy  batches 3, 5, 5; no NaN
  join-two      batches 2, 3, 5 (ranks 0 and 1 join at different steps);
                NaN on rank 2 at step 3 (all-reduced with two joined
                ranks); the job's own hook (torch's allreduce_hook),
                wrapped
  join-last     batches 3, 5, 5; NaN on rank 0 at step 2, its last batch
  join-epochs   two epochs, batches 3, 5, 5 then 3, 3, 3; no NaN (rank
                0's second epoch is steps 5-7, as the others')

usage: ddp_worker.py OUT SCENARIO...
"""
import json
import os
import sys
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)),
                                "python"))
sys.path.insert(0, HERE)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

import ampprobe.torch as at  # noqa: E402
from models import Net, ProbNLL, RevINLike, data  # noqa: E402

STEPS = 4
BAD_RANK, BAD_STEP = 1, 2
G_ELEM = 40000.0  # the overflow scenario's per-rank gradient element
DRIFT_RANK, DRIFT_STEP = 1, 1
# scenario: (batches of rank 0, 1, 2 in each epoch), (rank, step) of the NaN
JOIN = {
    "join-nan": ([(3, 5, 5)], (2, 4)),
    "join-healthy": ([(3, 5, 5)], None),
    "join-two": ([(2, 3, 5)], (2, 3)),
    "join-last": ([(3, 5, 5)], (0, 2)),
    "join-epochs": ([(3, 5, 5), (3, 3, 3)], None),
}


def run_net(out, scenario, rank, world):
    torch.manual_seed(0)  # same initial weights on every rank (DDP checks)
    model = Net()
    # small buckets (~100 bytes): several all-reduces a step. The first
    # step has one bucket whatever the cap (DDP rebuilds them after it, in
    # the order the gradients came); then torch 1.13 makes 3 (its first
    # bucket has its own cap, 256 bytes here) and torch 2.x 4.
    dist._DEFAULT_FIRST_BUCKET_BYTES = 256
    ddp = DDP(model, bucket_cap_mb=0.0001)
    loss_fn = ProbNLL()
    fp16 = scenario == "bad-input"
    tr = at.Tracer(ddp, os.path.join(out, "trace.h5"),
                   kinds={RevINLike: "revin"}, loss_fn=loss_fn,
                   precision="fp16" if fp16 else "bf16", emulate_fp16=fp16,
                   weight_digest=True, on_nonfinite="warn",
                   config={"name": "ddp-" + scenario})
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-2)
    scaler = at.LossScaler(init_scale=1.0, enabled=fp16)
    tr.attach_scaler(scaler)
    losses = []
    for step in range(STEPS):
        # rank r's shard of the global batch: micro-batch step*world + r
        x, y = data(step * world + rank,
                    nan=fp16 and rank == BAD_RANK and step == BAD_STEP)
        loss, n = amp_step(tr, ddp, loss_fn, opt, scaler, x, y)
        if scenario == "drift" and rank == DRIFT_RANK and step == DRIFT_STEP:
            with torch.no_grad():
                model.head.bias[0] += 1e-3
        tr.end_step(loss=loss, optimizer=opt, grad_norm=n, max_norm=1.0)
        losses.append(float(loss))
    return tr, losses


def amp_step(tr, ddp, loss_fn, opt, scaler, x, y):
    """One GradScaler-style step of the DDP model: (loss, grad norm)."""
    with tr.autocast():
        loss = loss_fn(ddp(x), y)
    opt.zero_grad()
    scaler.scale(loss).backward()
    scaler.unscale_(opt)
    n = nn.utils.clip_grad_norm_(ddp.parameters(), 1.0)
    scaler.step(opt)
    scaler.update()
    return loss, n


def run_join(out, scenario, rank, world):
    """Uneven inputs under ddp.join() (JOIN)."""
    epochs, bad = JOIN[scenario]
    torch.manual_seed(0)
    model = Net()
    dist._DEFAULT_FIRST_BUCKET_BYTES = 256
    ddp = DDP(model, bucket_cap_mb=0.0001)  # several buckets, as run_net
    loss_fn = ProbNLL()
    kw = {}
    if scenario == "join-two":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        kw = dict(comm_hook=default_hooks.allreduce_hook, comm_state=None)
    fp16 = bad is not None  # as bad-input; a job with no NaN as healthy
    tr = at.Tracer(ddp, os.path.join(out, "trace.h5"),
                   kinds={RevINLike: "revin"}, loss_fn=loss_fn,
                   precision="fp16" if fp16 else "bf16", emulate_fp16=fp16,
                   weight_digest=True, on_nonfinite="warn",
                   config={"name": "ddp-" + scenario}, **kw)
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-2)
    scaler = at.LossScaler(init_scale=1.0, enabled=fp16)
    tr.attach_scaler(scaler)
    losses, base = [], 0
    for counts in epochs:
        with ddp.join():
            for step in range(base, base + counts[rank]):
                x, y = data(step * world + rank, nan=(rank, step) == bad)
                loss, n = amp_step(tr, ddp, loss_fn, opt, scaler, x, y)
                tr.end_step(loss=loss, optimizer=opt, grad_norm=n,
                            max_norm=1.0)
                losses.append(float(loss))
        base += max(counts)
    return tr, losses


def run_linear(out, scenario, rank, world):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 1, bias=False))
    with torch.no_grad():
        model[0].weight.fill_(0.01)
    ddp = DDP(model)
    tr = at.Tracer(ddp, os.path.join(out, "trace.h5"), precision="fp32",
                   allreduce_dtype="fp16",
                   allreduce_prediv=scenario == "prediv",
                   on_nonfinite="warn", config={"name": "ddp-" + scenario})
    x = torch.ones(4, 8)
    # d(sum(out) * s)/dW = s * sum_batch(x) = 4 s per element: 4 s = G_ELEM
    s = G_ELEM / 4
    loss = ddp(x).sum()
    (loss * s).backward()
    tr.end_step(loss=loss, loss_scale=s, found_inf=0, skipped=0)
    return tr, [float(loss)]


def shard(model, world, **kw):
    """FSDP2: fully_shard on fc1, head and the root, over every rank."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    mesh = init_device_mesh("cpu", (world,))
    for sub in (model.fc1, model.head, model):
        fully_shard(sub, mesh=mesh, **kw)


def sgd_steps(tr, model, loss_fn, rank, world, nan=False):
    """STEPS plain SGD steps on rank's micro-batches (the prediction taken
    to fp32 for the loss); nan: rank BAD_RANK's batch of step BAD_STEP
    holds a NaN. The losses."""
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    losses = []
    for step in range(STEPS):
        x, y = data(step * world + rank,
                    nan=nan and rank == BAD_RANK and step == BAD_STEP)
        loss = loss_fn(model(x).float(), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        tr.end_step(loss=loss, optimizer=opt)
        losses.append(float(loss))
    return losses


def run_fsdp(out, scenario, rank, world):
    torch.manual_seed(0)  # same initial weights on every rank
    model = Net()
    shard(model, world)
    loss_fn = ProbNLL()
    tr = at.Tracer(model, os.path.join(out, "trace.h5"),
                   kinds={RevINLike: "revin"}, loss_fn=loss_fn,
                   precision="fp32", config={"name": "fsdp"})
    return tr, sgd_steps(tr, model, loss_fn, rank, world)


class MLP(nn.Module):
    def __init__(self, t=16, h=12, c=4):
        super().__init__()
        self.fc1 = nn.Linear(t, h)
        self.act = nn.ReLU()
        self.head = nn.Linear(h, c)
        self.sm = nn.Softmax(dim=-1)

    def forward(self, x):
        return self.sm(self.head(self.act(self.fc1(x))))


def run_fsdp_mp(out, scenario, rank, world):
    from torch.distributed.fsdp import MixedPrecisionPolicy
    torch.manual_seed(0)
    model = MLP()
    shard(model, world, mp_policy=MixedPrecisionPolicy(
        param_dtype=torch.bfloat16, reduce_dtype=torch.float32))
    loss_fn = ProbNLL()
    tr = at.Tracer(model, os.path.join(out, "trace.h5"), loss_fn=loss_fn,
                   precision="bf16", on_nonfinite="warn",
                   config={"name": "fsdp-mp"})
    return tr, sgd_steps(tr, model, loss_fn, rank, world, nan=True)


def main():
    out, scenarios = sys.argv[1], sys.argv[2:]
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    for sc in scenarios:
        d = os.path.join(out, sc)
        os.makedirs(d, exist_ok=True)
        run = {"overflow": run_linear, "prediv": run_linear,
               "fsdp": run_fsdp, "fsdp-mp": run_fsdp_mp}.get(
                   sc, run_join if sc in JOIN else run_net)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", at.NonFiniteWarning)
            tr, losses = run(d, sc, rank, world)
        info = {"warnings": [str(w.message) for w in caught
                             if issubclass(w.category, at.NonFiniteWarning)],
                "rank": tr.rank, "world_size": tr.world_size,
                "run_id": tr.run_id, "path": tr.path, "losses": losses,
                "buckets": tr.comm_recorder.buckets
                if tr.comm_recorder else 0,
                "shadowed": getattr(tr.comm_recorder, "shadowed", 0),
                "joined_steps": getattr(tr, "joined_steps", 0),
                "joined": getattr(tr, "joined", None)}
        tr.close()
        with open(os.path.join(d, "rank%d.json" % rank), "w") as f:
            json.dump(info, f)
        dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
