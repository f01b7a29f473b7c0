"""ampprobe.distributed - the PyTorch tracer under torch.distributed: which
rank of which job a trace belongs to (rank, world size and one run id shared
by every rank), and a DDP communication hook that records each gradient
bucket as this rank sends it into the all-reduce and as the all-reduce
returns it (sites grad_pre_allreduce / grad_post_allreduce), each
parameter's slice under the layer that owns the parameter.

Used by ampprobe.torch.Tracer (docs/python.md, "Distributed jobs"); imports
torch.
"""
import os
import re
import sys
import time
import uuid

import torch
import torch.distributed as dist

RUN_ID_ENV = "AMPPROBE_RUN_ID"
RUN_ID_MAX = 64  # probe_options.run_id: at most 64 of [A-Za-z0-9._-]
_RUN_ID_RE = re.compile(r"[A-Za-z0-9._-]{1,%d}\Z" % RUN_ID_MAX)
PRE, POST = "grad_pre_allreduce", "grad_post_allreduce"


def new_run_id():
    """A fresh run id: UTC time and 12 random hex digits
    ("20261202T021500Z-3f2a9c0d41be")."""
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + \
        uuid.uuid4().hex[:12]


def check_run_id(run_id):
    if run_id is None:
        return None
    run_id = str(run_id)
    if not _RUN_ID_RE.match(run_id):
        raise ValueError("run id %r: 1 to %d characters of [A-Za-z0-9._-]"
                         % (run_id, RUN_ID_MAX))
    return run_id


def initialized():
    return dist.is_available() and dist.is_initialized()


def _group_src(group):
    """The global rank of the group's rank 0 (broadcast's src)."""
    if group is None or group is dist.group.WORLD:
        return 0
    for f in ("get_global_rank", "_get_global_rank"):
        fn = getattr(dist, f, None) or getattr(dist.distributed_c10d, f, None)
        if fn is not None:
            return fn(group, 0)
    raise RuntimeError("cannot map the group's rank 0 to a global rank")


def job_identity(distributed=None, rank=None, world_size=None, run_id=None,
                 group=None):
    """(rank, world_size, run_id) of this process, or (-1, 0, None) when it
    is not part of a multi-rank job.

    distributed None: a job when torch.distributed is initialised or rank=
    is given; True: required; False: not a job. rank/world_size default to
    the process group's. The run id: run_id= (every rank must pass the
    same), else rank 0's $AMPPROBE_RUN_ID or a new one made by rank 0,
    broadcast to the group (a collective: every rank constructs its tracer);
    without a process group, $AMPPROBE_RUN_ID or none."""
    up = initialized()
    if distributed is None:
        distributed = up or rank is not None
    if not distributed:
        return -1, 0, None
    if rank is None or world_size is None:
        if not up:
            raise ValueError("ampprobe: distributed tracing needs an "
                             "initialised torch.distributed process group "
                             "or rank= and world_size=")
        if rank is None:
            rank = dist.get_rank(group)
        if world_size is None:
            world_size = dist.get_world_size(group)
    rank, world_size = int(rank), int(world_size)
    if not 0 <= rank < world_size:
        raise ValueError("ampprobe: rank %d not in [0, world_size %d)" %
                         (rank, world_size))
    if run_id is None:
        if up:
            box = [None]
            if dist.get_rank(group) == 0:
                box[0] = os.environ.get(RUN_ID_ENV) or new_run_id()
            dist.broadcast_object_list(box, src=_group_src(group),
                                       group=group)
            run_id = box[0]
        else:
            run_id = os.environ.get(RUN_ID_ENV) or None
    return rank, world_size, check_run_id(run_id)


def backend(group=None):
    try:
        return str(dist.get_backend(group)) if initialized() else None
    except (RuntimeError, ValueError):
        return None


def _completed(value):
    fut = torch.futures.Future()
    fut.set_result(value)
    return fut


def _result_tensor(v):
    """A comm hook future's value: a tensor or a one-tensor list."""
    if isinstance(v, (list, tuple)):
        return v[0]
    return v


# DistributedDataParallel's method that runs the comm hook on a rank that
# has joined (ddp.join(), torch.distributed.algorithms.Join: uneven
# inputs), once per backward of the ranks still training, with zero-filled
# buckets (torch 1.13 to 2.x). The reducer calls the hook from it directly,
# on the same thread; in a backward the hook's callers are autograd's.
_SHADOW_CALLERS = frozenset(["_match_all_reduce_for_bwd_pass"])


def _join_shadow(depth=6):
    """True when the comm hook runs for DDP's join shadow (its caller,
    a few Python frames up, is _match_all_reduce_for_bwd_pass), not for a
    backward of this rank."""
    try:
        f = sys._getframe(2)
    except ValueError:  # called with no caller's frame
        return False
    while f is not None and depth > 0:
        if f.f_code.co_name in _SHADOW_CALLERS:
            return True
        f = f.f_back
        depth -= 1
    return False


class BucketRecorder:
    """A DDP communication hook (ddp.register_comm_hook(None, rec.hook):
    DDP wants a function or method, not a callable object)
    recording each bucket's parameter slices before and after its
    all-reduce.

    hook None: the all-reduce itself, as torch's default (allreduce_hook:
    divide by the world size, then sum), in `dtype` ("fp32": the bucket's
    own; "fp16": the bucket is cast to binary16 and summed in binary16, as
    torch's fp16_compress_hook, so that finite gradients can overflow) and
    with `prediv` False: sum first, divide after. Pre = what this rank
    sends (after any pre-division, in the all-reduce dtype), post = what
    the all-reduce returned (before a post-division).

    hook a callable (state, bucket) -> Future: the job's own hook, wrapped:
    pre = the bucket as DDP hands it to that hook, post = the tensor its
    future returns.

    On a rank that has joined (ddp.join(): uneven inputs) DDP calls the
    hook with zero buckets to match the other ranks' all-reduces: they are
    all-reduced and not recorded, no step is opened (_join_shadow), and
    the first after the rank's last step marks its trace joined
    (Tracer._joined_step: the post-mortem's "joined", not "ended
    early").

    The hook waits for each bucket's all-reduce before returning (so that
    it records from the backward's own thread): communication does not
    overlap the rest of the backward while traced. A traced step costs two
    copies of each bucket (the recorded tensors must stay unchanged until
    end_step); a step outside the recording window none."""

    def __init__(self, tracer, hook=None, dtype=None, prediv=True,
                 group=None, state=None):
        if dtype not in (None, "fp32", "fp16"):
            raise ValueError("allreduce_dtype: fp32 or fp16")
        self.tracer = tracer
        self.inner = hook  # the job's hook, or None
        self.state = state
        self.dtype = dtype
        self.prediv = bool(prediv)
        self.group = group
        self.buckets = 0  # buckets seen (tests, diagnostics)
        self.shadowed = 0  # of them, a joined rank's shadows (ddp.join())

    def hook(self, state, bucket):
        """The recorder as a plain function, as register_comm_hook wants."""
        return self(state, bucket)

    def _slices(self, bucket, buf):
        """(layer, offset, numel) of each traced parameter in the bucket."""
        out = []
        by_param = self.tracer._by_param
        base, esz = buf.data_ptr(), buf.element_size()
        for p, g in zip(bucket.parameters(), bucket.gradients()):
            L = by_param.get(id(p))
            if L is None or not L.selected:
                continue
            out.append((L, (g.data_ptr() - base) // esz, g.numel()))
        return out

    def _record(self, slices, site, flat):
        rec = self.tracer._record
        for L, off, n in slices:
            rec(L, site, flat[off:off + n])

    def __call__(self, state, bucket):
        self.buckets += 1
        tr = self.tracer
        # DDP cannot unregister a hook: after tracer.close() it all-reduces
        # (or runs the job's hook) without recording.
        recording = not tr._closed
        if _join_shadow():
            # This rank has joined (uneven inputs, ddp.join()): DDP calls
            # the hook with zero buckets to match the all-reduces of ranks
            # still training. No forward of this rank ran: the all-reduce
            # is done, not recorded, and no step is opened (one held the
            # others' gradients under this rank's next step number, after
            # its last real step). Each shadowed backward (its last
            # bucket) takes a step number, so that a later step of this
            # rank (the next epoch) has the number the other ranks give it.
            self.shadowed += 1
            if not tr._closed and bucket.is_last():
                tr._joined_step()
            recording = False
        if recording:
            tr._ensure_step()
            recording = tr._recording
        buf = bucket.buffer()
        slices = self._slices(bucket, buf) if recording else []
        if self.inner is not None:
            return self._wrapped(state, bucket, buf, slices)
        group = self.group if self.group is not None else dist.group.WORLD
        n = dist.get_world_size(group)
        send = buf
        if self.dtype == "fp16" and buf.dtype != torch.float16:
            send = buf.to(torch.float16)
        if self.prediv:
            send.div_(n)
        if not recording:
            dist.all_reduce(send, group=group)
            out = send
        else:
            # The recorded tensors are never written again before end_step
            # (libprobe may snapshot them there): pre is a copy when the
            # bucket itself is sent, the sum goes into another copy.
            pre = send.clone() if send is buf else send
            self._record(slices, PRE, pre)
            out = pre.clone()
            dist.all_reduce(out, group=group)
            self._record(slices, POST, out)
        if not self.prediv:
            out = out / n  # a new tensor: the post records keep the sum
        if out is not buf:
            buf.copy_(out)
        return _completed(buf)

    def _wrapped(self, state, bucket, buf, slices):
        if not slices:
            return self.inner(self.state if state is None else state, bucket)
        pre = buf.clone()  # the job's hook may work in place
        self._record(slices, PRE, pre)
        fut = self.inner(self.state if state is None else state, bucket)
        out = _result_tensor(fut.wait())
        if out.numel() == buf.numel():
            self._record(slices, POST, out.detach().clone())
        return fut


def register(tracer, ddp, hook=None, state=None, dtype=None, prediv=True,
             group=None):
    """Registers a BucketRecorder on a DistributedDataParallel module;
    returns it, or None when DDP refused (a hook registered already)."""
    rec = BucketRecorder(tracer, hook=hook, dtype=dtype, prediv=prediv,
                         group=group if group is not None else
                         getattr(ddp, "process_group", None), state=state)
    try:
        ddp.register_comm_hook(state, rec.hook)
    except RuntimeError:
        return None
    return rec


def is_ddp(model):
    return isinstance(model, torch.nn.parallel.DistributedDataParallel)
