"""ampprobe.torch - the PyTorch tracer: records, per traced module and step,
what the C trainer records (fwd_in, fwd_out, fwd_saved, grad_out, grad_in,
weight, weight_grad, master_weight) into a libprobe trace, applies the
precision policy of the environment (ampprobe.policy), optionally emulates
FP16 on the CPU, and warns or raises at the first non-finite value.

Import cost: this module imports torch; `import ampprobe` does not.

Tensors go to libprobe by pointer (tensor.data_ptr()) when they are
contiguous float32/float16/bfloat16, on the host or a CUDA device; a
non-contiguous tensor is made contiguous and any other floating dtype is
converted to float32 (a copy each). Every tensor recorded in a step is kept
referenced until end_step, because libprobe may snapshot it there.
"""
import collections
import collections.abc
import contextlib
import copy
import ctypes
import dataclasses
import fnmatch
import functools
import inspect
import json
import math
import os
import shlex
import signal
import sys
import threading
import time
import types
import warnings
import weakref

import torch
import torch.autograd.function
import torch.nn as nn
import torch.utils.checkpoint
from torch.nn.utils import parametrize as _parametrize

from . import _lib
from . import distributed as _dist
from .core import (OPTION_RANGES, Session, check_option, check_scalar,
                   digest64_fn, digest64_init, rank_trace_path)
from .policy import KINDS as _POLICY_KINDS
from .policy import Policy

_SITE = {s: i for i, s in enumerate(_lib.SITES)}
_DT = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}

# torch.compile: every hook and saved() run eagerly, as a graph break
# (torch.compiler.disable, torch >= 2.1). Traced by dynamo instead, a hook's
# ctypes call breaks the graph anyway, and its reads of the tracer's state
# (the layers run this step) become guards that fail at every call: each
# hooked module recompiled until dynamo's cache limit, with a warning.
_COMPILER_DISABLE = getattr(getattr(torch, "compiler", None), "disable", None)


# _guard_module_hooks: the Tracers that asked for the guards, and the
# setting they found
_HOOK_GUARDS = {"tracers": 0, "found": None}


def _guard_module_hooks(on):
    """Makes torch.compile guard its code on the hooks of the modules it
    runs (torch._dynamo.config.skip_nnmodule_hook_guards = False, process
    wide; torch >= 2) while a Tracer is open (on: one more, else one
    less; the last to close puts back what the first found). By default
    dynamo does not guard on hooks, and code compiled for one instance of
    a class before it had hooks is reused for another that has them: the
    traced model's forward then ran without the tracer's hooks (a compiled
    untraced copy run first; bench/python_overhead.py --compiled). The
    guards: each module's hook dicts checked per call, in dynamo's C++
    guards; eager code is not affected."""
    if _COMPILER_DISABLE is None:
        return
    try:
        import torch._dynamo.config as dynamo_config
    except Exception:  # noqa: BLE001 (a torch without dynamo)
        return
    if not hasattr(dynamo_config, "skip_nnmodule_hook_guards"):
        return
    g = _HOOK_GUARDS
    if on:
        if g["tracers"] == 0:
            g["found"] = dynamo_config.skip_nnmodule_hook_guards
        g["tracers"] += 1
        dynamo_config.skip_nnmodule_hook_guards = False
    elif g["tracers"] > 0:
        g["tracers"] -= 1
        if g["tracers"] == 0:
            dynamo_config.skip_nnmodule_hook_guards = g["found"]


_NO_FORWARD = (
    "ampprobe: step %d: module '%s'%s got gradients, but its forward ran "
    "without the tracer's hooks: its forward sites are not in the trace. "
    "Either the Tracer was made between a forward and its backward (once, "
    "at its first step), or torch.compile reused code it compiled before "
    "this Tracer was made, for this model or another instance of its "
    "classes (dynamo does not guard on module hooks by default): call "
    "torch._dynamo.reset() once after creating the Tracer "
    "(docs/python.md, torch.compile)")


_WRITE_STOPPED = (
    "ampprobe: the trace %s cannot be written (%s: %s): the tracer stopped "
    "recording at step %d and the job goes on untraced. The trace keeps "
    "the steps written before and reads as not closed (incomplete); "
    "Tracer(on_write_error=\"raise\") raises this from end_step() and "
    "close() instead (docs/python.md, on_write_error)")


_VALIDATION_MERGED = (
    "ampprobe: step %d began with a forward of the model in eval mode "
    "under grad, and a forward in train mode followed with no backward "
    "between: a validation or check run after end_step() without "
    "torch.no_grad() opens a step, and the next iteration's training is "
    "recorded in it too (a NaN of the validation data is then named at "
    "step %d's input). Run it under torch.no_grad() (docs/python.md, "
    "Limits)")


_PHANTOM_STEP = (
    "ampprobe: step %d, ended by close(), ran the model's forward under "
    "grad and no backward: a validation or check run after the last "
    "end_step() without torch.no_grad() opens a step of its own, which "
    "the trace keeps as step %d (loss and lr not measured). Run it under "
    "torch.no_grad() (docs/python.md, Limits)")


_EMPTY_STEP = (
    "ampprobe: step %d ended with nothing traced in it: end_step() was "
    "called with no step open, no forward of the model under grad and no "
    "gradient since the step before. Two end_step() calls for one "
    "iteration (a logging callback's as well as the loop's) number the "
    "trace's steps ahead of the job's iterations, and an evaluation loop "
    "under no_grad records nothing outside begin_step()/end_step(). Call "
    "end_step() once per iteration (docs/python.md, Limits)")


_LATE_BACKWARD = (
    "ampprobe: step %d ended before its backward: its gradients arrived "
    "after end_step() and are recorded in step %d, with the next step's "
    "forward, so the trace puts every gradient one step late. Call "
    "end_step() after loss.backward() and the optimizer step "
    "(docs/python.md, The PyTorch tracer)")


_IN_CHILD = (
    "ampprobe: %s() in process %d, a child of fork(): this Tracer's trace "
    "%s is written by process %d, which made the Tracer. In the child the "
    "tracer records nothing (its hooks only apply the precision policy "
    "and FP16 emulation, so the numerics are the parent's); to trace the "
    "child, make a Tracer of its own there, on another path "
    "(docs/python.md, Limits)")


# The Tracers of this process (weakly), for the fork handler below.
_LIVE_TRACERS = weakref.WeakSet()


def _after_fork_in_child():
    """In a child of os.fork() (a DataLoader worker, multiprocessing's
    fork start method, a helper process): every Tracer the parent had is
    the parent's. Its session is refused in the child (libprobe:
    PROBE_ERR_STATE, "session opened by process X, used in process Y"),
    and a module hook that met that refusal raised ProbeError inside the
    child's model(x) - a DataLoader worker whose dataset runs a traced
    module killed the job. Marked here, once: the hooks then record
    nothing in the child, without a system call per hook (Tracer._in_child)."""
    for tr in list(_LIVE_TRACERS):
        try:
            tr._in_child()
        except Exception:  # noqa: BLE001 (never fail a fork)
            pass


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _uncompiled(model):
    """The module torch.compile(model) wrapped (its OptimizedModule calls
    that module, whose hooks run from the compiled code), else model."""
    inner = getattr(model, "_orig_mod", None)
    if type(model).__name__ == "OptimizedModule" and isinstance(
            inner, nn.Module):
        return inner
    return model


def _pre_hook(module, hook):
    """Registers hook(module, inputs) as module's forward pre-hook, run
    outside torch.compile's graphs (_eager). inputs holds the call's inputs
    alone, its masks left out (_input_positions, _input_kwargs): the
    positional arguments, and where torch passes keyword arguments to hooks
    (>= 2.0) the keyword ones, as an _ArgsKwargs when there are such. What
    hook returns (inputs of the same shape, or None) goes back to torch in
    their places."""
    def positional(module, args):
        keep = _input_positions(module, args)
        if keep is None:
            return hook(module, args)
        r = hook(module, tuple(args[i] for i in keep))
        return None if r is None else _put_back(args, keep, r)

    if not _HOOK_KWARGS:
        return module.register_forward_pre_hook(_eager(positional))

    def with_kwargs(module, args, kwargs):
        named = _input_kwargs(module, kwargs) if kwargs else None
        if not named:
            r = positional(module, args)
            return None if r is None else (r, kwargs)
        keep = _input_positions(module, args)
        ins = args if keep is None else tuple(args[i] for i in keep)
        r = hook(module, _ArgsKwargs((ins, named)))
        if r is None:
            return None
        out = tuple(r[0]) if keep is None else _put_back(args, keep, r[0])
        return out, dict(kwargs, **r[1])
    return module.register_forward_pre_hook(_eager(with_kwargs),
                                            with_kwargs=True)


def _put_back(args, keep, ins):
    """args with args[keep[j]] replaced by ins[j]."""
    out = list(args)
    for j, i in enumerate(keep):
        out[i] = ins[j]
    return tuple(out)


def _mask_name(name):
    """A parameter whose name says it takes an additive mask or bias:
    attn_mask, src_mask, attention_mask, key_padding_mask, mask, attn_bias,
    position_bias. Not mask_features, masks, x_masked."""
    n = name.lower()
    return n.endswith("mask") or n.endswith("bias")


def _is_option(name, v):
    """An argument that is an option, not an input: a tensor filling a
    mask or bias parameter (_mask_name) that needs no gradient. Such a
    mask holds -inf (or finfo.min) by design: traced as an input it was a
    non-finite event of a healthy job ('NaN or inf arrived in the input
    data'), and rounded to binary16 finfo(float32).min became -inf and a
    fully masked row NaN after the softmax. One that needs a gradient (a
    learned bias) is data."""
    return _mask_name(name) and not (torch.is_tensor(v) and v.requires_grad)


_SIGNATURES = {}  # class -> _forward_signature(class)


def _forward_signature(cls):
    """(the positions of cls's forward's positional parameters that take
    a mask or bias (_mask_name), with their names; the names a keyword can
    fill, in order). With no Python signature, neither: every argument is
    then an input."""
    sig = _SIGNATURES.get(cls)
    if sig is not None:
        return sig
    P = inspect.Parameter
    try:
        ps = list(inspect.signature(cls.forward).parameters.values())[1:]
    except (TypeError, ValueError, AttributeError):  # no Python
        # signature (AttributeError: a torch.jit.trace'd module's class)
        sig = ((), ())
    else:
        pos = [q.name for q in ps
               if q.kind in (P.POSITIONAL_ONLY, P.POSITIONAL_OR_KEYWORD)]
        sig = (tuple((i, n) for i, n in enumerate(pos) if _mask_name(n)),
               tuple(q.name for q in ps
                     if q.kind in (P.POSITIONAL_OR_KEYWORD, P.KEYWORD_ONLY)))
    _SIGNATURES[cls] = sig
    return sig


def _input_positions(module, args):
    """The positions of a call's positional arguments that are the
    module's inputs, or None when all are (the common case): all but the
    options (_is_option: `block(x, mask)`, `enc(src, src_mask)`,
    `mha(q, k, v, None, False, attn_mask)`). Arguments past the named
    parameters fill *args and are inputs."""
    masks = _forward_signature(type(module))[0]
    if not masks:
        return None
    opt = [i for i, n in masks if i < len(args) and _is_option(n, args[i])]
    if not opt:
        return None
    return tuple(i for i in range(len(args)) if i not in opt)


def _input_kwargs(module, kwargs):
    """The keyword arguments of a call that are the module's inputs: all
    but the options (_is_option: attn_mask=, attention_mask=), those of
    its forward's parameters in the signature's order (crit(target=y,
    input=p): input first), then any its
    **kwargs took, in the call's order (fc(input=h), model(pixel_values=x),
    layer(h, encoder_hidden_states=e))."""
    names = _forward_signature(type(module))[1]
    out = {n: kwargs[n] for n in names
           if n in kwargs and not _is_option(n, kwargs[n])}
    for n, v in kwargs.items():
        if n not in out and n not in names and not _is_option(n, v):
            out[n] = v
    return out


def _prediction(fin):
    """A loss's recorded input, of its floating inputs in order: the first
    that requires grad (the prediction, whichever place it takes: crit(y,
    p), crit(target=y, pred=p) into **kwargs), else the first (a loss
    under no_grad)."""
    for t in fin:
        if t.requires_grad:
            return [t]
    return fin[:1]


def _is_dtensor(t):
    """A torch.distributed DTensor (FSDP2's sharded parameters and their
    gradients): its data_ptr() is not the memory of its numel() elements;
    to_local() is this rank's part."""
    return type(t).__name__ == "DTensor" and hasattr(t, "to_local")


_SHARDED_DIGEST = (
    "ampprobe: Tracer(weight_digest=True): the model's parameters are "
    "sharded (FSDP2 DTensors): each rank holds other shards, so the ranks' "
    "digests would always differ; trace without weight_digest")


def _params_now(L):
    """The parameters L's module holds now: those it was built with, unless
    the job replaced them since the Tracer hooked it (load_state_dict(
    assign=True), to_empty() after a meta-device init, FSDP2's gathered
    parameters during its forward and sharded ones after). Read from
    _parameters (0.15 us against 1.6 for parameters(recurse=False))."""
    if L.module is None:
        return []
    return _own_params(L.module, L.parametrized, L.whole)


def _parametrized_leaf(m):
    """m has a parametrization (register_parametrization: torch's
    parametrizations.weight_norm, spectral_norm, orthogonal) and no child
    but its `parametrizations`: one unit (_leaf_units), whose parameters
    include the originals the parametrizations hold (_own_params)."""
    return _parametrize.is_parametrized(m) and all(
        n == "parametrizations" for n, _ in m.named_children())


def _own_params(m, parametrized, whole=False):
    """The parameters a module trains itself: its own, and for a
    parametrized leaf (_parametrized_leaf, decided once when it is
    registered: this runs at every forward) the originals its
    parametrizations hold (weight_norm's original0/original1), which its
    forward uses through them; for a TorchScript unit (whole: _jit_kind)
    every parameter under it. A lazy module's parameter not materialised
    yet (nn.LazyLinear before its first forward) is left out: it has no
    values nor a gradient hook (register_hook raised, and the Tracer could
    not be made); its first forward materialises it in place, the same
    object, and _record_forward_in hooks it there."""
    if whole:
        own = list(m.parameters())
    else:
        own = [p for p in m._parameters.values() if p is not None]
        if parametrized:
            own += list(m.parametrizations.parameters())
    return [p for p in own if not _is_lazy(p)]


def _is_lazy(p):
    """p is a lazy module's parameter not materialised yet
    (UninitializedParameter)."""
    return isinstance(p, _UNINITIALIZED)


_UNINITIALIZED = getattr(nn.parameter, "UninitializedTensorMixin", ())


# torch.jit.trace's module: its own forward hooks run (its call goes
# through nn.Module), those of the modules inside it never do
_TOP_TRACED = getattr(getattr(torch.jit, "_trace", None),
                      "TopLevelTracedModule", None)


def _jit_kind(m):
    """How the tracer sees a TorchScript module: None for any other
    module; "traced" for what torch.jit.trace returned, whose hooks run
    (one unit: its inputs and outputs recorded, nothing inside it);
    "script" for a torch.jit.script module (its hook registration raises
    "register_forward_pre_hook is not supported on ScriptModules", which
    made the Tracer fail) or a module inside a traced one (its hooks are
    registered and never called: the records silently missing)."""
    if not isinstance(m, torch.jit.ScriptModule):
        return None
    if _TOP_TRACED is not None and isinstance(m, _TOP_TRACED):
        return "traced"
    return "script"


def _forget_param(by_param, late_hooks, pid):
    """A followed parameter died (Tracer._follow): its id is free again."""
    by_param.pop(pid, None)
    late_hooks.pop(pid, None)


def _eager(fn):
    """fn, run outside torch.compile's graphs (itself where torch has no
    torch.compiler)."""
    return fn if _COMPILER_DISABLE is None else _COMPILER_DISABLE(fn)


class NonFiniteError(FloatingPointError):
    """Raised by Tracer.end_step with on_nonfinite="raise": the first
    non-finite value of a step, where it was produced."""

    def __init__(self, step, phase, module, site, kind, detail=""):
        self.step, self.phase, self.module = step, phase, module
        self.site, self.kind = site, kind
        # module names come from the model: escaped as ampprobe prints names
        msg = ("ampprobe: non-finite value at step %d, %s phase: produced by "
               "module '%s' (%s), site %s%s" %
               (step, phase, _lib.escape(module), kind, site, detail))
        super().__init__(msg)


class NonFiniteWarning(RuntimeWarning):
    pass


class WriteErrorWarning(RuntimeWarning):
    """Warned once by a Tracer with on_write_error="warn" (the default)
    when its trace cannot be written (a full disk, a file-size limit): it
    stopped recording; the job goes on."""


# libprobe's statuses of a trace that cannot be written: the writer's
# sticky I/O error (every later call returns it)
_WRITE_ERRORS = ("ERR_NOSPACE", "ERR_IO", "ERR_HDF5")


# ---- module kinds -------------------------------------------------------------

def _cls(name):
    return getattr(nn, name, None)


def default_kind(m):
    """The probe kind name of a module from its class."""
    n = nn
    if isinstance(m, nn.modules.loss._Loss):
        return "loss"
    if isinstance(m, (n.Linear, n.Bilinear)) or type(m).__name__ in (
            "LazyLinear", "NonDynamicallyQuantizableLinear"):
        return "linear"
    if isinstance(m, nn.modules.conv._ConvNd):
        return "conv"
    if isinstance(m, (n.Embedding, n.EmbeddingBag)):
        return "embedding"
    if isinstance(m, nn.modules.batchnorm._BatchNorm):
        return "bn"
    norms = tuple(c for c in (_cls("LayerNorm"), _cls("GroupNorm"),
                              _cls("RMSNorm"), _cls("LocalResponseNorm"))
                  if c is not None)
    if isinstance(m, norms) or isinstance(
            m, nn.modules.instancenorm._InstanceNorm):
        return "layernorm"
    if isinstance(m, (n.Softmax, n.LogSoftmax, n.Softmin, n.Softmax2d)):
        return "softmax"
    if isinstance(m, n.MultiheadAttention):
        return "attention"
    if type(m).__module__ == "torch.nn.modules.activation":
        return "activation"
    return "other"


def _leaf_units(root, user_kinds):
    """(name, module) of the modules to trace: leaves, plus modules whose
    class the user mapped or that are MultiheadAttention (traced as one
    unit, their children not). A module held by two parents is one unit,
    named by the first path to it (as named_modules does: it was hooked
    under both names, each call recorded twice, a NaN of the second
    parent's call named at the first)."""
    out = []
    seen = set()

    def unit(m):
        return _user_kind(m, user_kinds) is not None or isinstance(
            m, nn.MultiheadAttention)

    def walk(prefix, m):
        if id(m) in seen:
            return
        seen.add(id(m))
        # a parametrized module whose only child is its `parametrizations`
        # (how it computes its weight) is a leaf (it was hooked there, not
        # itself: its output not recorded, nor rounded); one with other
        # children is walked as before, its parametrizations included. A
        # TorchScript module is one unit: what runs inside it calls no
        # Python hook (_jit_kind)
        kids = [] if (_jit_kind(m) is not None or _parametrized_leaf(m)) \
            else list(m.named_children())
        if not kids or unit(m):
            out.append((prefix, m))
            return
        for n, c in kids:
            walk(prefix + "." + n if prefix else n, c)

    walk("", root)
    return out


def _module_ids(root):
    """The ids of root and every module under it, in walk order (through
    the _modules dicts: 0.2 us a module, end_step's cost with
    Tracer._check_new_modules)."""
    out = [id(root)]
    add = out.append

    def walk(m):
        for c in m._modules.values():
            if c is not None:
                add(id(c))
                walk(c)
    walk(root)
    return out


_JIT_SAYS = {
    "script": (
        "%s TorchScript (torch.jit.script, or inside a torch.jit.trace'd "
        "module): the tracer cannot hook it nor look inside it. It is one "
        "layer with no forward or gradient sites, only its parameters' "
        "weight_grad and master_weight; under FP16 emulation it runs as it "
        "is (not rounded), and the precision policy cannot force it to "
        "FP32. A NaN or overflow made inside it is seen at the next traced "
        "module's input (docs/python.md, Limits)"),
    "traced": (
        "%s a torch.jit.trace'd module: traced as one unit (its inputs, "
        "outputs and gradients recorded, and rounded under FP16 "
        "emulation), not the modules inside it, whose hooks never run "
        "(not recorded, not rounded; the precision policy cannot force it "
        "to FP32). A fault inside it is named at the unit "
        "(docs/python.md, Limits)"),
}


def _warn_jit(jit):
    """One RuntimeWarning per kind of TorchScript unit the Tracer found
    (_jit_kind), naming them, at its construction."""
    for how, Ls in sorted(jit.items()):
        if not Ls:
            continue
        names = ", ".join("'%s'" % _lib.escape(L.name) for L in Ls[:3])
        if len(Ls) > 3:
            names += " (and %d more)" % (len(Ls) - 3)
        who = "ampprobe: module%s %s %s" % (
            "s" if len(Ls) > 1 else "", names, "are" if len(Ls) > 1 else "is")
        warnings.warn(_JIT_SAYS[how] % who, RuntimeWarning, stacklevel=5)


def _user_kind(m, user_kinds):
    if not user_kinds:
        return None
    for k, v in user_kinds.items():
        if isinstance(k, str):
            if type(m).__name__ == k:
                return v
        elif isinstance(m, k):
            return v
    return None


# ---- the active tracer of a module (for saved()) ------------------------------

@_eager
def saved(module, tensor):
    """Records a module's saved intermediate (a variance, attention scores,
    probabilities) at site fwd_saved, from inside its forward, and returns
    it: rounded to binary16 when the tracer emulates FP16 for this module
    (so an FP16 variance that overflows is inf, as on a GPU). Without an
    attached tracer it returns the tensor unchanged."""
    ref = getattr(module, "_ampprobe_ref", None)
    tr = ref[0]() if ref else None
    if tr is None:
        return tensor
    return tr._saved(module, ref[1], tensor)


def materialized(module, tensor):
    """An intermediate a module materialises (a mean, a standard deviation)
    without recording it: rounded to binary16 when the tracer emulates FP16
    for this module, unchanged otherwise. Makes the emulation round where an
    FP16 kernel would store a half tensor."""
    ref = getattr(module, "_ampprobe_ref", None)
    tr = ref[0]() if ref else None
    if tr is None or not ref[1].emulate:
        return tensor
    return _round16(tensor)


# ---- a loss scaler for CPU runs ------------------------------------------------

class LossScaler:
    """Dynamic loss scaling with torch.amp.GradScaler's rules, in plain
    torch, for CPU jobs (Debian's torch 1.13 disables GradScaler without
    CUDA) and FP16 emulation: scale starts at init_scale; an optimizer
    whose gradients hold inf or NaN skips its step; update() backs the
    scale off (scale *= backoff, tracker = 0) when any optimizer's did,
    else tracker += 1 and every growth_interval clean steps the scale
    grows (if finite). Same methods as GradScaler: scale, unscale_, step,
    update, get_scale, is_enabled; the tracer reads it like GradScaler.

    As GradScaler, it keeps its state per optimizer (a job with two
    optimizers: each one's gradients unscaled and checked once, by
    unscale_ or by step) until update(); the same misuses raise the same
    errors: unscale_ twice for one optimizer, unscale_ after its step, a
    second step (RuntimeError), update() with no step or unscale_ before
    it (AssertionError). One scaler-wide flag made the second optimizer's
    unscale_ a no-op: it stepped with gradients times the scale, and
    never checked them."""

    def __init__(self, init_scale=65536.0, growth_factor=2.0,
                 backoff_factor=0.5, growth_interval=2000, enabled=True):
        self._scale = float(init_scale)
        self._growth = growth_factor
        self._backoff = backoff_factor
        self._interval = growth_interval
        self._tracker = 0
        self._enabled = enabled
        # id(optimizer) -> [stage, found_inf]: stage "ready", "unscaled"
        # or "stepped" (GradScaler's OptState), found_inf None until its
        # gradients were checked
        self._per_optimizer = {}

    def is_enabled(self):
        return self._enabled

    def get_scale(self):
        return self._scale if self._enabled else 1.0

    def _get_growth_tracker(self):
        return self._tracker

    def scale(self, loss):
        return loss * self._scale if self._enabled else loss

    def _state(self, optimizer):
        return self._per_optimizer.setdefault(id(optimizer), ["ready", None])

    def unscale_(self, optimizer):
        """Divides this optimizer's gradients by the scale and checks them
        for inf/NaN (once per optimizer between update()s)."""
        if not self._enabled:
            return
        st = self._state(optimizer)
        if st[0] == "unscaled":
            raise RuntimeError("unscale_() has already been called on this "
                               "optimizer since the last update().")
        if st[0] == "stepped":
            raise RuntimeError("unscale_() is being called after step().")
        inv = 1.0 / self._scale  # in double, as GradScaler
        found = False
        with torch.no_grad():
            for g in optimizer.param_groups:
                for p in g["params"]:
                    if p.grad is None:
                        continue
                    grad = p.grad
                    if grad.is_sparse:  # as GradScaler: its values
                        grad = grad.coalesce()
                        p.grad = grad
                        grad = grad._values()
                    grad.mul_(inv)
                    if not found and not bool(torch.isfinite(grad).all()):
                        found = True
        st[:] = ["unscaled", found]

    def step(self, optimizer, *args, **kwargs):
        """unscale_(optimizer) unless done, then optimizer.step(*args,
        **kwargs) unless its gradients held inf or NaN; returns what
        optimizer.step returned (None when skipped)."""
        if not self._enabled:
            return optimizer.step(*args, **kwargs)
        if "closure" in kwargs:
            raise RuntimeError("Closure use is not currently supported if "
                               "GradScaler is enabled.")
        st = self._state(optimizer)
        if st[0] == "stepped":
            raise RuntimeError("step() has already been called since the "
                               "last update().")
        if st[0] == "ready":
            self.unscale_(optimizer)
        ret = None if st[1] else optimizer.step(*args, **kwargs)
        st[0] = "stepped"
        return ret

    def update(self, new_scale=None):
        """The scale for the next iteration, after step() of every
        optimizer: backed off when any optimizer's gradients held inf or
        NaN, grown after growth_interval clean steps; new_scale sets it
        instead. Forgets every optimizer's state."""
        if not self._enabled:
            return
        # which optimizers stepped and which skipped, for the tracer's
        # end_step (as it reads a GradScaler's: _watch_steps)
        self._ampprobe_skips = (
            getattr(self, "_ampprobe_skips", (0, None))[0] + 1,
            [bool(st[1]) for st in self._per_optimizer.values()
             if st[0] == "stepped"])
        if new_scale is not None:
            self._scale = float(new_scale)
        else:
            found = [st[1] for st in self._per_optimizer.values()
                     if st[1] is not None]
            if not found:
                raise AssertionError(
                    "No inf checks were recorded prior to update.")
            if any(found):
                self._scale *= self._backoff
                self._tracker = 0
            else:
                self._tracker += 1
                if self._tracker >= self._interval:
                    new = self._scale * self._growth
                    if math.isfinite(new):
                        self._scale = new
                    self._tracker = 0
        self._per_optimizer = {}


# ---- the tracer ----------------------------------------------------------------

_F32_MAX = torch.finfo(torch.float32).max


def _as_float32(t):
    """A float64 tensor as libprobe reads it, float32: finite values beyond
    float32's range saturated at +-3.4e38 (they turned into inf, and a
    healthy float64 job holding 2.7e43 was said to hold inf), inf and NaN
    kept."""
    if t.dtype == torch.float64:
        t = torch.where(torch.isinf(t), t, t.clamp(-_F32_MAX, _F32_MAX))
    return t.float()


def _round16_in_place(tensors):
    """Rounds float32 tensors to binary16 values where they are (the inputs
    of an in-place module under FP16 emulation: its side effect on them is
    the job's). Through .data, which autograd does not version: a tensor
    its producer saved for the backward (a softmax's output) holds the
    binary16 values from here on, as it would in FP16, instead of failing
    the backward as modified in place (a Dropout(inplace=True) that then
    changed nothing, in eval mode or with p=0, failed a job that trains
    untraced)."""
    with torch.no_grad():
        for t in tensors:
            if t.dtype == torch.float32:
                t.data.copy_(t.half())


def _version(t):
    """t's version counter (bumped by each in-place change), or None for
    an inference tensor (made under torch.inference_mode()), which keeps
    none: reading it raised "Inference tensors do not track version
    counter" from the hooks of a forward run under inference_mode inside
    a step (a teacher), and the job died."""
    return None if t.is_inference() else t._version


def _round16(t):
    return t.half().float() if t.dtype == torch.float32 else t


def _once(fn):
    """fn for _map_floats, applied once per distinct tensor: a tensor
    passed twice gets one result, the same object both times, so that the
    module still sees them as one (self-attention's `query is key is
    value`, which MultiheadAttention's fast path and its packed projection
    test; rounded one by one, an eval pass of a TransformerEncoder with a
    padding mask handed it three copies of a NestedTensor, which it refuses
    outside that path)."""
    memo = {}

    def once(t):
        r = memo.get(id(t))  # t is alive while the call's inputs are
        if r is None:
            r = memo[id(t)] = fn(t)
        return r
    return once


def _once_traceable(fn):
    """_once for code torch.compile traces (the FP32 wrapper, a module's
    forward): the results found by `is`, which dynamo follows as it
    follows aliasing; id() keys made it guard on each tensor's id and
    recompile the module at every call, up to its limit."""
    done = []

    def once(t):
        for a, r in done:
            if a is t:
                return r
        r = fn(t)
        done.append((t, r))
        return r
    return once


_NEST_MAX = 4  # how deep inputs/outputs are looked into: (out, (h, c))


def _is_plain_dict(x):
    return type(x) in (dict, collections.OrderedDict)


def _record_fields(x):
    """The (name, value) pairs of a structured output that is neither a
    tuple, a list nor a plain dict: a dataclass instance's fields (HF's
    ModelOutput is one, and an OrderedDict), a Mapping's items; None for
    anything else."""
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return [(f.name, getattr(x, f.name, None))
                for f in dataclasses.fields(x)]
    if isinstance(x, collections.abc.Mapping):
        return list(x.items())
    return None


def _rebuilt_record(x, changed):
    """A shallow copy of x (_record_fields) with the fields in changed
    ({name: value}) replaced; x itself when it cannot be copied so (a
    Mapping that is not a dict)."""
    if dataclasses.is_dataclass(x):
        y = copy.copy(x)
        for k, v in changed.items():
            object.__setattr__(y, k, v)  # frozen ones too
            if isinstance(y, dict) and k in y:  # ModelOutput keeps both
                dict.__setitem__(y, k, v)
        return y
    if isinstance(x, dict):
        y = copy.copy(x)
        for k, v in changed.items():
            y[k] = v
        return y
    return x


class _ArgsKwargs(tuple):
    """A forward's (args, kwargs), as a hook registered with_kwargs gets
    them: _floats and _map_floats look into both at the depth of args
    alone, so a tensor passed by keyword is treated as a positional one."""


# torch >= 2.0: forward pre-hooks can receive the keyword arguments
_HOOK_KWARGS = "with_kwargs" in inspect.signature(
    nn.Module.register_forward_pre_hook).parameters


def _floats(x, depth=0):
    """Floating tensors in a forward input/output, in order: a tensor, or
    tuples (namedtuples), lists, plain dicts, dataclasses and Mappings of
    them, nested up to _NEST_MAX deep (an LSTM's (output, (h, c)), a
    {"out": t}, an HF ModelOutput)."""
    if torch.is_tensor(x):
        return [x] if x.is_floating_point() else []
    if type(x) is _ArgsKwargs:
        return _floats(x[0], depth) + _floats(x[1], depth)
    if depth >= _NEST_MAX:
        return []
    if isinstance(x, (tuple, list)):
        return [t for v in x for t in _floats(v, depth + 1)]
    if _is_plain_dict(x):
        return [t for v in x.values() for t in _floats(v, depth + 1)]
    fields = _record_fields(x)  # a dataclass (ModelOutput), a Mapping:
    # their tensors were not seen, so a NaN its producer made was named at
    # the next module, or in the backward; a field that is an option (an
    # attention_mask, an additive bias: _is_option) is none, as an argument
    # of that name is not
    if fields is not None:
        return [t for k, v in fields
                if not (isinstance(k, str) and _is_option(k, v))
                for t in _floats(v, depth + 1)]
    return []


def _map_floats(x, fn, depth=0, keep=None):
    """x with fn applied to each floating tensor of _floats(x), the
    containers rebuilt as they were (a namedtuple stays one). For a
    forward's arguments, whose lists and dicts the module may fill (a list
    it appends to, a cache dict) and must be the job's own objects, keep
    says what becomes of them: "all" hands them on as they are, their
    tensors left alone; "unchanged" rebuilds one only when fn changed a
    tensor in it (a cast up); "records" rebuilds lists and dicts (a loss's:
    its prediction in one gets its own grad_in) but hands dataclasses and
    other Mappings on as the job's own (a criterion may write into the one
    it gets). Tuples, immutable, are rebuilt, and the keyword arguments of
    an _ArgsKwargs are mapped one by one."""
    if torch.is_tensor(x):
        return fn(x) if x.is_floating_point() else x
    if type(x) is _ArgsKwargs:
        return _ArgsKwargs((_map_floats(x[0], fn, depth, keep),
                            {k: _map_floats(v, fn, depth + 1, keep)
                             for k, v in x[1].items()}))
    if depth >= _NEST_MAX:
        return x
    if isinstance(x, tuple) and hasattr(x, "_fields"):
        return type(x)(*(_map_floats(v, fn, depth + 1, keep) for v in x))
    mutable = isinstance(x, list) or _is_plain_dict(x)
    if mutable and keep == "all":
        return x
    if isinstance(x, (tuple, list)):
        y = type(x)(_map_floats(v, fn, depth + 1, keep) for v in x)
        same = lambda: all(a is b for a, b in zip(x, y))  # noqa: E731
    elif _is_plain_dict(x):
        y = type(x)((k, _map_floats(v, fn, depth + 1, keep))
                    for k, v in x.items())
        same = lambda: all(y[k] is v for k, v in x.items())  # noqa: E731
    else:
        fields = _record_fields(x)
        if fields is None or keep in ("all", "records"):  # the job's own
            return x
        changed = {}
        for k, v in fields:
            if isinstance(k, str) and _is_option(k, v):
                continue
            w = _map_floats(v, fn, depth + 1, keep)
            if w is not v:
                changed[k] = w
        return _rebuilt_record(x, changed) if changed else x
    return x if mutable and keep == "unchanged" and same() else y


def _fp32_forward(self, *args, **kwargs):
    """The forward of a module forced to FP32 (Tracer._wrap_fp32): outside
    autocast, its fp16/bf16 inputs cast up to float32 (float64 kept). Bound
    to the module with MethodType, so copy.deepcopy binds it to the copy
    and torch.save can pickle it."""
    def up(a):
        return a.float() if a.dtype in (torch.float16, torch.bfloat16) else a
    # nested too: an LSTM's (h, c) (its bf16 state made the CPU LSTM fail)
    # a list or dict rebuilt only when it held a half tensor: the module
    # fills the job's own otherwise
    args, kwargs = _map_floats(_ArgsKwargs((args, kwargs)),
                               _once_traceable(up), keep="unchanged")
    inner = self.__dict__.get("_ampprobe_inner")  # a forward of the job's
    # own on the instance (the class's otherwise)
    with torch.autocast(device_type=self._ampprobe_fp32, enabled=False):
        if inner is not None:
            return inner(*args, **kwargs)
        return type(self).forward(self, *args, **kwargs)


def _gone(tracer):
    """True when a hook's weak proxy of its tracer is dead: the tracer was
    dropped without close() (the hooks hold it weakly, so that it can be
    collected and its finalizer close the file)."""
    try:
        tracer._closed
        return False
    except ReferenceError:
        return True


def _grad_hook(tracer, L, site):
    """A tensor hook that records the gradient at site (grad_in, grad_out)
    of layer L, rounded to FP16 first (and passed on so) when L emulates
    FP16; tracer is the hooks' weak proxy."""
    def hook(g):
        if _gone(tracer):
            return None
        if L.emulate:
            g = _round16(g)
        if g.is_floating_point():
            tracer._record(L, site, g)
        return g if L.emulate else None
    return hook


# Is a forward hook running inside a backward pass (activation
# checkpointing's recomputation)? torch >= 2 says so itself: the autograd
# engine's current graph task (torch._C._current_graph_task_id(), -1 outside
# a backward, set on whichever thread - CPU caller or CUDA device thread -
# runs the backward; torch.utils.checkpoint keys its recomputation on it).
# torch 1.13 has no such call: the Python stack is walked for the frames
# that mean it, see _BACKWARD_CODES and _CHECKPOINT_UNPACK; the walk is
# also made under torch >= 2 when the graph task says no (a saved tensor
# unpacked outside a backward, where checkpoint recomputes too).
_GRAPH_TASK_ID = getattr(torch._C, "_current_graph_task_id", None)
# The engine's entry points (a CPU backward runs on the calling thread) and
# a custom Function's backward (reentrant checkpointing,
# CheckpointFunction.backward, recomputes its forward there, on any thread).
_BACKWARD_CODES = frozenset(
    f.__code__ for f in (
        torch.autograd.backward, torch.autograd.grad,
        getattr(getattr(torch.autograd.function, "BackwardCFunction", None),
                "apply", None))
    if hasattr(f, "__code__"))
# The non-reentrant checkpoint's saved-tensor unpack hook, where it
# recomputes: `unpack` in torch 1.13's _checkpoint_without_reentrant,
# `unpack_hook` in torch 2.x's _checkpoint_hook (both in
# torch/utils/checkpoint.py).
_CHECKPOINT_UNPACK = frozenset(("unpack", "unpack_hook"))
_CHECKPOINT_FILE = getattr(torch.utils.checkpoint, "__file__", None)


def _in_backward():
    """True when called (from a forward hook) during a backward pass: a
    forward recomputed there (activation checkpointing) is no forward of
    the step. Only asked for a module's second forward under grad in a
    step."""
    if _GRAPH_TASK_ID is not None and _GRAPH_TASK_ID() != -1:
        return True
    return _backward_frame(sys._getframe(2))


def _backward_frame(f):
    """True when frame f or one it was called from is a backward's (see
    _BACKWARD_CODES, _CHECKPOINT_UNPACK)."""
    while f is not None:
        c = f.f_code
        if c in _BACKWARD_CODES or (c.co_name in _CHECKPOINT_UNPACK and
                                    c.co_filename == _CHECKPOINT_FILE):
            return True
        f = f.f_back
    return False


def _node_hook(tracer, L, out_nr, with_in):
    """The gradient sites of an in-place module, from the autograd node its
    op made (a post hook: the gradient arriving at its output, grad_out,
    and the one it sends to its input, grad_in), rounded to FP16 (grad_in
    passed on so) when L emulates FP16. Tensor hooks cannot serve: in torch
    1.13 a hook registered on a tensor already hooked before the in-place
    op lands on the node of its value before the op."""
    def hook(grad_inputs, grad_outputs):
        if _gone(tracer):
            return None
        g = grad_outputs[out_nr] if out_nr < len(grad_outputs) else None
        if g is not None and g.is_floating_point():
            tracer._record(L, "grad_out", _round16(g) if L.emulate else g)
        g = grad_inputs[0] if with_in and grad_inputs else None
        if g is not None and g.is_floating_point():
            if L.emulate:
                g = _round16(g)
            tracer._record(L, "grad_in", g)
            if L.emulate:
                return (g,) + tuple(grad_inputs[1:])
        return None
    return hook


def _settle(t):
    """Makes the statistics of a CUDA tensor just handed to libprobe read
    before the module changes it in place: libprobe reads it on its own
    blocking stream, ordered with torch's legacy default stream; on another
    stream of the job's, wait for the device."""
    if t.is_cuda and torch.cuda.current_stream(t.device).cuda_stream != 0:
        torch.cuda.synchronize(t.device)


class _Layer:
    __slots__ = ("name", "module", "kind", "precision", "lid", "fp32",
                 "emulate", "params", "parametrized", "selected", "mode",
                 "pending", "jit", "whole")


class Tracer:
    """Traces a model into a libprobe trace.

        tracer = ampprobe.torch.Tracer(model, "run.h5", loss_fn=criterion,
                                       emulate_fp16=True,
                                       kinds={RevIN: "revin"})
        for step, (x, y) in enumerate(loader):
            with tracer.autocast():
                loss = criterion(model(x), y)
            scaler.scale(loss).backward()
            scaler.unscale_(opt)
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scaler.step(opt); scaler.update()
            tracer.end_step(loss=loss, optimizer=opt, scaler=scaler,
                            grad_norm=norm, max_norm=1.0)
        tracer.close()

    Arguments (all keywords but model and path):
      path          the trace file; $AMPPROBE_TRACE overrides it.
      mode          "full" (every selected record) or "scalars" (flight
                    recorder: the last ring_steps steps are written when a
                    non-finite value appears).
      layers        comma-separated globs (or a list) on module names: only
                    those are hooked (all are listed in the trace's layers).
      every, step_start, step_end   record every N-th step of a window.
      ring_steps    flight-recorder depth.
      precision     what the job runs in: "fp16" (default with emulate_fp16),
                    "bf16" or "fp32"; $AMPPROBE_PRECISION overrides it.
      emulate_fp16  round every traced module's inputs, outputs and
                    gradients (and saved() intermediates) to binary16 on
                    the CPU (docs/python.md: what it cannot emulate).
      fp32          modules forced to FP32 (kinds or name globs), added to
                    $AMPPROBE_FP32; they run outside autocast on FP32 inputs.
      kinds         {class or class name: kind name} for custom modules.
      on_nonfinite  "record" (default), "warn" or "raise" (NonFiniteError)
                    at the end of the step whose records first show it.
      on_write_error  the trace cannot be written (a full disk, a
                    file-size limit): "warn" (default) stops recording
                    with one WriteErrorWarning, the job going on; "raise"
                    raises the ProbeError from end_step() and close().
                    Never from inside a module hook (model(x), backward).
      loss_fn       a loss module to trace too (kind loss).
      record_input  record the model's input as layer "input" (True).
      config        a dict stored as the trace's config_json ("name" etc.).
      env           obey the AMPPROBE_* environment variables (True).
    Distributed jobs (docs/python.md, "Distributed jobs"):
      distributed   None: a rank of a job when torch.distributed is
                    initialised (or rank= is given); True: required;
                    False: never. A rank writes
                    rank_trace_path(path, rank) ("t.h5" -> "t.rank1.h5")
                    with its rank, world size and the job's run id.
      rank, world_size, process_group   default: the process group's.
      run_id        default: rank 0's $AMPPROBE_RUN_ID or a new one,
                    broadcast by rank 0 (all ranks construct the tracer).
      comm_hook     with a DistributedDataParallel model: True (default)
                    registers a hook doing the all-reduce and recording
                    each bucket before/after it (grad_pre_allreduce,
                    grad_post_allreduce); a callable (state, bucket) ->
                    Future: the job's own hook, wrapped and recorded
                    (comm_state: its state); False: none.
      allreduce_dtype, allreduce_prediv   the recording hook's all-reduce:
                    "fp32" (the bucket's dtype) or "fp16" (summed in
                    binary16); divide by the world size before (True, as
                    DDP) or after the sum.
      weight_digest the step's weight digest (probe_digest64 over the FP32
                    parameters after the optimizer step, in parameter
                    order): equal on every rank of a healthy job; costs a
                    pass over the weights per step (False).
    Other keywords go to the libprobe session (flush_seconds, max_events,
    snapshot_on_nonfinite, snapshot_max_elems, ...).
    """

    def __init__(self, model, path=None, *, mode="full", layers=None,
                 every=1, step_start=0, step_end=-1, ring_steps=8,
                 precision=None, emulate_fp16=False, fp32=(), kinds=None,
                 on_nonfinite="record", on_write_error="warn",
                 loss_fn=None, record_input=True,
                 config=None, env=True, device_type=None,
                 distributed=None, rank=None, world_size=None, run_id=None,
                 process_group=None, comm_hook=True, comm_state=None,
                 allreduce_dtype=None, allreduce_prediv=True,
                 weight_digest=False, **session_options):
        if not isinstance(model, nn.Module):
            raise TypeError("ampprobe: Tracer(model, ...): model must be a "
                            "torch.nn.Module, got %s" % type(model).__name__)
        if on_nonfinite not in ("record", "warn", "raise"):
            raise ValueError("on_nonfinite: record, warn or raise")
        if on_write_error not in ("warn", "raise"):
            raise ValueError("on_write_error: warn or raise")
        if loss_fn is not None and not isinstance(loss_fn, nn.Module):
            raise TypeError(
                "ampprobe: Tracer(loss_fn=...): the criterion module (e.g. "
                "nn.CrossEntropyLoss()), got %s; a loss written as a "
                "function has no hooks: leave loss_fn out and pass the "
                "step's loss to end_step(loss=)" % type(loss_fn).__name__)
        # Arguments that become libprobe options are checked here, named as
        # the Tracer's ("every" is step_every) with their range: libprobe's
        # message for every=0 named none ("option out of range (mode,
        # step_every, ...)").
        if mode not in ("full", "scalars"):
            raise ValueError("ampprobe: Tracer(mode=%r): \"full\" or "
                             "\"scalars\"" % (mode,))
        every, step_start, step_end, ring_steps = (
            check_option(o, v, "Tracer", n) for o, n, v in (
                ("step_every", "every", every),
                ("step_start", "step_start", step_start),
                ("step_end", "step_end", step_end),
                ("ring_steps", "ring_steps", ring_steps)))
        for k, v in session_options.items():
            if k in OPTION_RANGES and v is not None:
                session_options[k] = check_option(k, v, "Tracer")
        if int(step_end) >= 0 and int(step_start) > int(step_end):
            raise ValueError("ampprobe: Tracer(step_start=%d, step_end=%d): "
                             "step_start is after step_end, nothing would "
                             "be recorded (step_end=-1: no end)" %
                             (int(step_start), int(step_end)))
        layers = _check_layers(layers)
        kinds = _check_kinds(kinds)
        base = precision or ("fp16" if emulate_fp16 else None)
        self.policy = (Policy.from_env(fp32=fp32, precision=base, trace=path)
                       if env else Policy(fp32=fp32, precision=base,
                                          trace=path))
        if self.policy.trace is None:
            raise ValueError("no trace path: pass path or set AMPPROBE_TRACE")
        self.precision = self.policy.precision or "fp32"
        self.emulate = bool(emulate_fp16) and self.precision == "fp16"
        if emulate_fp16 and self.precision not in ("fp16", "fp32"):
            raise ValueError("emulate_fp16 needs precision fp16")
        self.device_type = device_type or (
            "cuda" if any(p.is_cuda for p in model.parameters()) else "cpu")
        self.on_nonfinite = on_nonfinite
        self.on_write_error = on_write_error
        # the ProbeError that stopped the recording (_write_failed)
        self.write_error = None
        # A DDP model: its module is traced (names without "module."), the
        # wrapper gets the recording communication hook. A torch.compile'd
        # one (either way round): the module it compiled (names without
        # "_orig_mod.", as in the same job run eagerly).
        model = _uncompiled(model)
        self.ddp = model if _dist.is_ddp(model) else None
        if self.ddp is not None:
            model = _uncompiled(model.module)
            if process_group is None:
                process_group = getattr(self.ddp, "process_group", None)
        self.model = model
        self.rank, self.world_size, self.run_id = _dist.job_identity(
            distributed, rank, world_size, run_id, process_group)
        self.path = self.policy.trace
        if self.rank >= 0:
            self.path = rank_trace_path(self.path, self.rank)
            session_options.update(rank=self.rank,
                                   world_size=self.world_size,
                                   run_id=self.run_id)
        self._digest = bool(weight_digest)
        if self._digest and any(_is_dtensor(p) for p in model.parameters()):
            raise ValueError(_SHARDED_DIGEST)
        self._globs = _split(layers)
        cfg = {"name": "pytorch", "framework": "pytorch",
               "torch": torch.__version__, "precision": self.precision,
               "fp32": self.policy.fp32, "emulate_fp16": self.emulate,
               "command": _command_line()}
        if self.rank >= 0:
            cfg.update(rank=self.rank, world_size=self.world_size,
                       run_id=self.run_id,
                       backend=_dist.backend(process_group),
                       ddp=self.ddp is not None)
            if self.ddp is not None and comm_hook is not False:
                cfg["allreduce"] = {
                    "hook": "ampprobe" if comm_hook is True else "job",
                    "dtype": allreduce_dtype or "bucket",
                    "prediv": bool(allreduce_prediv)}
        if config:
            cfg.update(config)
        self._every = max(int(every), 1)
        self._start, self._end = int(step_start), int(step_end)
        self._full = mode == "full"
        # the process that made the tracer (its session's); _forked: this
        # is a child of fork() (_in_child)
        self._pid = os.getpid()
        self._forked = False
        self.session = Session(
            self.path, mode=mode,
            # layers= is applied here, by which modules get hooks: libprobe
            # sees only the names cut to 60 bytes, and dropped every record
            # of a module selected by its full path (the glob's match)
            layer_select=None,
            step_start=step_start, step_end=step_end, step_every=every,
            ring_steps=ring_steps, command_line=_command_line(),
            config_json=json.dumps(cfg),
            precision_policy=self.policy.describe(self.precision),
            **session_options)
        self.session.owner = "Tracer"
        # whether end_step must scan the tensors itself (on_nonfinite):
        # libprobe computes no record in scalars mode with neither flight
        # recorder nor snapshots (_step_nonfinite); in full mode it computes
        # every record the tracer gives it
        self._scan = (mode == "scalars" and
                      not self.session.first_nonfinite()[3]) or not hasattr(
                          self.session._lib, "probe_session_step_nonfinite")
        try:  # the file this session made: only that one is removed
            made = os.stat(self.path)
            made = (made.st_dev, made.st_ino)
        except OSError:
            made = None
        try:
            self._setup(model, kinds, loss_fn, record_input, comm_hook,
                        comm_state, allreduce_dtype, allreduce_prediv,
                        process_group)
        except BaseException:
            # nothing left behind: no hooks on the model, no trace file
            # (an empty one made a rerun fail with ERR_EXISTS)
            try:
                self.close()
            except Exception:
                try:
                    self.session.close()
                except Exception:
                    pass
            try:
                now = os.stat(self.path)
                if made is not None and (now.st_dev, now.st_ino) == made:
                    os.remove(self.path)
            except OSError:
                pass
            raise

    def _setup(self, model, kinds, loss_fn, record_input, comm_hook,
               comm_state, allreduce_dtype, allreduce_prediv, process_group):
        self._lib = self.session._lib
        self._rec = self._lib.probe_tensor_record
        # A c_void_p object: ctypes passes it without converting an int.
        self._h = ctypes.c_void_p(self.session.handle)
        self._hooks = []
        self._wrapped = []   # modules forced to FP32 (_wrap_fp32)
        # id(param) -> (param, layer): not trainable when hooked
        # (_hook_param), hooked once it is (_unfrozen)
        self._frozen = {}
        self._layers = []
        self._by_param = {}
        # weight_grad hooks of parameters first seen in a forward (FSDP2's
        # gathered ones, replaced ones), by id; dropped when they die
        self._late_hooks = {}
        self._step = None
        self._next = 0
        self._recording = False
        self._hold = []
        self._ran = set()
        self._grads = set()
        self._bwd = False  # a backward site recorded in this step
        # the step that just ended, when the model's forward ran in it and
        # no gradient came (_check_late_backward)
        self._ended_fwd_only = None
        self._no_forward_said = False
        self._late_backward_said = False
        self._first_eval = None
        self._opened_by = None
        self._merged_said = False  # _root_forward
        self._empty_said = False  # _check_empty_step
        self._phantom_said = False  # _check_phantom_step
        self._refs = []  # (layer, site, tensor) of this step, for scans
        # the attached loss scalers, first attached first (the primary:
        # its scale is the steps table's): [scaler, its scale at the
        # step's start (None: unknown), the serial of its last update()
        # that end_step read]
        self._scalers = []
        self._clip = None
        self._hand_events = []
        self._masters_at = None  # the step whose master weights are recorded
        self._reported = -1
        self.copies = 0  # tensors copied before recording (not contiguous
        #                 or not fp32/fp16/bf16)
        self._closed = False
        _LIVE_TRACERS.add(self)
        self.comm_recorder = None  # the registered BucketRecorder, if any
        # backwards of the other ranks this rank shadowed after it joined
        # (ddp.join(): uneven inputs); not steps of this trace
        self.joined_steps = 0
        # the join mark (probe_session_mark_joined) is set in the trace:
        # this rank left the loop by joining after its last step; pending:
        # a shadow came while a step begun by hand was open (marked when
        # it ends)
        self._joined = False
        self._join_pending = False
        self._attach(model, kinds, loss_fn, record_input)
        if self.ddp is not None and comm_hook is not False:
            self.comm_recorder = _dist.register(
                self, self.ddp, hook=None if comm_hook is True else comm_hook,
                state=comm_state, dtype=allreduce_dtype,
                prediv=allreduce_prediv, group=process_group)
        if self.ddp is not None and comm_hook is not False:
            if self.comm_recorder is None:
                warnings.warn(
                    "ampprobe: this DistributedDataParallel module has a "
                    "communication hook already: gradients before and after "
                    "the all-reduce are not recorded (pass your hook as "
                    "Tracer(comm_hook=...) to have it wrapped)",
                    RuntimeWarning, stacklevel=3)

    # -- attaching ----------------------------------------------------------------

    def _register(self, name, module, kind, selected, full=None):
        """full: the module's own dotted name when `name` (libprobe's, at
        most 60 bytes and unique) had to be cut; policies match either."""
        L = _Layer()
        L.name, L.module, L.kind = name, module, kind
        # Losses run in FP32, as under autocast (the C trainer's loss_fp32).
        L.fp32 = kind == "loss" or self.policy.forces_fp32(name, kind) or (
            full is not None and self.policy.forces_fp32(full, kind))
        L.precision = "fp32" if L.fp32 else self.precision
        L.jit = None if module is None else _jit_kind(module)
        # a torch.jit.script unit runs as it is: nothing rounds its
        # inputs or outputs, so neither are its gradients
        L.emulate = self.emulate and not L.fp32 and L.jit != "script"
        kid = _lib.kind_id(kind)
        if kid is None:  # an older library without this kind
            kid = _lib.kind_id("other")
        L.lid = self.session.register(name, kid, L.precision)
        L.parametrized = (module is not None and L.jit is None and
                          _parametrized_leaf(module))
        # a unit whose children are not layers of their own (TorchScript,
        # MultiheadAttention, a class the user mapped to a kind: _leaf_units)
        # trains every parameter under it: MultiheadAttention's forward uses
        # out_proj's weight and bias without calling out_proj, whose
        # parameters had no weight, weight_grad or master_weight record
        L.whole = module is not None and (L.jit is not None or (
            not L.parametrized and any(True for _ in module.children())))
        L.params = [] if module is None else _own_params(
            module, L.parametrized, L.whole)
        L.selected = selected
        L.mode = None  # this forward's: "record", "replay" or None (_gate)
        L.pending = None  # an in-place forward's inputs and their nodes
        self._layers.append(L)
        return L

    def _attach(self, model, user_kinds, loss_fn, record_input):
        used = set()

        def fit(s, nbytes):  # at most nbytes of UTF-8, whole characters
            b = s.encode()[:nbytes]
            return b.decode(errors="ignore")

        def uniq(name):  # libprobe's names: < PROBE_NAME_MAX bytes, unique
            name = fit(name or type(model).__name__.lower(), 60)
            base, i = name, 1
            while name in used:
                i += 1
                name = "%s~%d" % (fit(base, 56), i)
            used.add(name)
            return name

        self._input_layer = None
        if record_input:  # listed always, hooked when layers= selects it
            in_sel = not self._globs or any(fnmatch.fnmatchcase("input", g)
                                            for g in self._globs)
            L = self._register(uniq("input"), None, "input", in_sel)
            if in_sel:
                self._input_layer = L
        # Always hooked: the model's forward under grad starts the step
        # (so that modules it runs under no_grad first - a teacher - are
        # inside it), and records the input when selected.
        _guard_module_hooks(True)
        self._guard = [True]  # shared with the finalizer: given back once
        if _jit_kind(model) != "script":  # (it takes no hook: _jit_kind)
            self._hooks.append(_pre_hook(
                model, self._make_input_hook(self._input_layer)))
        self._user_kinds = user_kinds
        units = _leaf_units(model, user_kinds)
        jit = {"script": [], "traced": []}  # TorchScript units (_jit_kind)
        if loss_fn is not None:
            # a criterion that is also a child of the model is one layer,
            # `loss` (it was two, each record written twice)
            units = [(n, m) for n, m in units if m is not loss_fn]
            units.append(("loss", loss_fn))
        for name, m in units:
            kind = _user_kind(m, user_kinds) or (
                "loss" if m is loss_fn else default_kind(m))
            full = name
            name = uniq(name)
            sel = not self._globs or any(
                fnmatch.fnmatchcase(name, g) or fnmatch.fnmatchcase(full, g)
                for g in self._globs)
            L = self._register(name, m, kind, sel,
                               full if full != name else None)
            if L.jit is not None:  # TorchScript: no wrapper, no saved()
                jit[L.jit].append(L)
            else:
                if L.fp32:
                    self._wrap_fp32(m)
                m._ampprobe_ref = (weakref.ref(self), L)
            if not sel:
                continue
            if L.jit == "script":  # no forward hook runs: its parameters
                for p in L.params:  # alone (weight_grad, master_weight)
                    if id(p) not in self._by_param:
                        self._follow(p, L)
                        self._hook_param(p, L)
                L.params = ()
                continue
            # No full backward hook: torch wraps a hooked module's outputs
            # in views, which made any in-place op on them (a ResNet's
            # `out += x`) an error and turned namedtuple outputs into
            # tuples. The gradients are taken by tensor hooks instead: on
            # the outputs (grad_out) and on the inputs as this module
            # receives them (grad_in), see _make_pre_hook.
            self._hooks.append(_pre_hook(m, self._make_pre_hook(L)))
            self._hooks.append(m.register_forward_hook(
                self._make_fwd_hook(L)))
            for p in L.params:
                if id(p) not in self._by_param:
                    self._follow(p, L)
                    self._hook_param(p, L)
            L.params = ()  # only their ids are kept: replaced ones can go
        # the modules the walk found, for end_step's check for modules
        # added to the model later (_check_new_modules)
        self._unit_ids = {id(m) for _, m in units}
        self._module_ids = _module_ids(model)
        self._new_modules_said = False
        _warn_jit(jit)
        # Close the file even if the job raises and never calls us again;
        # marked aborted when the interpreter exits by an exception
        _install_excepthook()
        self._finalizer = weakref.finalize(
            self, Tracer._finalize, self.session, self._guard, self._pid,
            (self._hooks, self._late_hooks, self._wrapped, self._layers))

    @staticmethod
    def _finalize(session, guard, pid, model):
        """A tracer dropped without close(), or left open at interpreter
        exit: the model given back (its hooks, its FP32 wrappers: they
        stayed, a module forced to FP32 ran so for good, for the next
        tracer too) and the trace closed - in the process that made it
        only (a child of fork() leaves the parent's trace alone)."""
        Tracer._give_back_guard(guard)
        try:
            Tracer._release(*model, None)
        except Exception:  # noqa: BLE001 (at exit: modules half torn down)
            pass
        if os.getpid() != pid:
            session.disown()
            return
        why = _uncaught_reason()
        if why:  # the interpreter exits by an uncaught exception
            try:
                session.mark_aborted(why)
            except Exception:
                pass
        _end_open_step(session, snapshot=False)
        try:
            session.close()
        except Exception:
            pass

    @staticmethod
    def _release(hooks, late_hooks, wrapped, layers, owner):
        """Gives the model back as it was before the tracer: its hooks
        removed, its modules' FP32 wrappers undone (torch.save works
        again) and their references to it dropped. By close() (owner: the
        tracer) and by the finalizer of a tracer dropped without close()
        (owner None: the references of a dead tracer go; a second
        tracer's stay)."""
        for h in list(hooks) + list(late_hooks.values()):
            h.remove()
        del hooks[:]
        late_hooks.clear()
        for L in layers:
            ref = getattr(L.module, "_ampprobe_ref", None) if L.module is not None else None
            if ref is not None and ref[0]() is owner:  # not another tracer's
                try:
                    del L.module._ampprobe_ref
                except AttributeError:
                    pass
        for m in wrapped:  # the model as it was (torch.save works again)
            ref = getattr(m, "_ampprobe_ref", None)
            other = ref[0]() if ref is not None else None
            if (other is not None and other is not owner and ref[1].fp32
                    and not other._closed and other._wrapped is not wrapped):
                # (the last: the finalizer at interpreter exit, its tracer
                # still alive, owner None)
                # a second tracer still open forces it too, through this
                # wrapper (_wrap_fp32 wraps once): handed over, not undone
                # (it was undone, and the module ran in half precision
                # under that tracer from then on)
                other._wrapped.append(m)
                continue
            m.__dict__.pop("forward", None)
            m.__dict__.pop("_ampprobe_fp32", None)
            inner = m.__dict__.pop("_ampprobe_inner", None)
            if inner is not None:
                m.forward = inner
        del wrapped[:]

    @staticmethod
    def _give_back_guard(guard):
        """The tracer's share of dynamo's hook guards (_guard_module_hooks),
        given back once, by close() or by the finalizer of a tracer dropped
        without it."""
        if guard and guard[0]:
            guard[0] = False
            _guard_module_hooks(False)

    def _wrap_fp32(self, m):
        """m runs outside autocast, its fp16/bf16 inputs cast to float32
        (close() undoes it)."""
        if getattr(m, "_ampprobe_fp32", None):
            return
        m._ampprobe_fp32 = self.device_type
        if "forward" in m.__dict__:  # the job set one on the instance: it
            # runs inside, and comes back at close() (it was bypassed, then
            # deleted)
            m._ampprobe_inner = m.__dict__["forward"]
        m.forward = types.MethodType(_fp32_forward, m)
        self._wrapped.append(m)

    # -- the hooks ------------------------------------------------------------------

    def _record(self, L, site, t):
        """Hands one tensor to libprobe by pointer (copy if it must)."""
        if self._closed or self.write_error is not None or self._forked:
            return
        backward = _lib.SITE_PHASE[site] == "backward"
        if self._step is None:
            # a gradient with no step open: no forward hook opened one
            # (end_step() before backward(), a penalty's backward before
            # the forward, a forward whose compiled code runs no hook); it
            # opens the step, as the DDP comm hook does, and end_step says
            # when no module of the model ran its forward in it
            # (_check_forwards_seen)
            if backward:
                self._check_late_backward()
            self._ensure_step()
        if backward:
            self._bwd = True
        if site == "weight_grad":
            self._grads.add(L.lid)
        if not self._recording:
            return
        if _is_dtensor(t):  # FSDP2 / tensor parallel: this rank's shard
            t = t.to_local()
        if t.is_meta:  # no values (a model built on the meta device)
            return
        if t.layout != torch.strided:  # a sparse gradient (Embedding sparse=True)
            t = t.detach().coalesce().values() if t.is_sparse else t.detach().to_dense()
        dt = _DT.get(t.dtype)
        if dt is None or not t.is_contiguous():
            t = t.detach()
            if dt is None:
                t, dt = _as_float32(t), 0
            t = t.contiguous()
            self.copies += 1
        # The tensor itself (no detach: one object less per record) is kept
        # until end_step; libprobe reads it now and may snapshot it then.
        # with its version: a tensor changed in place after this (a
        # ReLU(inplace=True) turning -inf to 0) no longer holds what
        # libprobe read (_nonfinite_counts)
        # (None for an inference tensor, which keeps no version: _version)
        self._refs.append([L, site, t, _version(t), None])
        st = self._rec(self._h, L.lid, _SITE[site], dt, t.data_ptr(),
                       t.numel())
        if st < 0:
            try:
                self.session._check(st, "probe_tensor_record(%s, %s)" %
                                    (L.name, site))
            except _lib.ProbeError as e:
                if self._forked_unseen(e):
                    return
                if e.name not in _WRITE_ERRORS:
                    raise
                self._write_failed(e)

    def _in_child(self):
        """This process is a child of fork() (_after_fork_in_child): the
        session is the parent's. From now on the hooks record nothing and
        call libprobe no more (no step begun there, no record, no close),
        and keep applying the precision policy and FP16 emulation, so that
        the child computes what the parent would; begin_step() and
        end_step() raise ProbeError ERR_STATE (_child_refuses); close()
        removes the hooks from the child's copy of the model and leaves
        the parent's trace alone."""
        self._forked = True
        self._recording = False
        self._refs = []

    def _forked_unseen(self, err):
        """libprobe refused the session as used in another process, and
        this is not the process that made the tracer: a fork that
        os.register_at_fork did not see (a fork() made in C). The tracer
        goes the child's way (_in_child) instead of raising into the job.
        Only asked on an error: getpid() is no cost of a record."""
        if err.name == "ERR_STATE" and os.getpid() != self._pid:
            self._in_child()
            return True
        return False

    def _child_refuses(self, who):
        """An explicit call (begin_step, end_step) in a child of fork():
        the parent's session cannot take it, and the child's records would
        be lost without a word; refused, naming both processes."""
        if self._forked:
            raise _lib.ProbeError(-10, _IN_CHILD % (
                who, os.getpid(), _lib.escape(self.path), self._pid),
                "ERR_STATE")

    def _write_failed(self, err):
        """The trace cannot be written (err: libprobe's sticky write
        error, a full disk or a file-size limit, met in a hook, a step's
        begin or end, or close): the tracer stops recording for good and
        calls libprobe no more until close(), so that no module hook can
        raise into the job's forward or backward (it did: the job died
        inside model(x)). The hooks go on applying the precision policy
        and FP16 emulation: the job's numerics do not change in the
        middle of its run. on_write_error "warn": one WriteErrorWarning,
        now; "raise": end_step() and close() raise err (_write_error_at)."""
        if self.write_error is not None:
            return
        self.write_error = err
        self._recording = False
        self._refs = []
        if self.on_write_error == "warn":
            warnings.warn(_WRITE_STOPPED % (
                _lib.escape(self.path), err.name, err,
                self._step if self._step is not None else self._next),
                WriteErrorWarning, stacklevel=3)

    def _write_error_at(self):
        """on_write_error="raise": the write error that stopped the
        recording, raised again (a new exception each call: it is sticky,
        as libprobe's)."""
        e = self.write_error
        if e is not None and self.on_write_error == "raise":
            raise _lib.ProbeError(e.status, str(e), e.name)

    def _ensure_step(self, who=None):
        """Opens the step if none is (a hook: who None; an explicit call of
        the job's: its name, refused in a child of fork())."""
        if who is not None:
            self._child_refuses(who)
        if self._step is None:
            self._begin(self._next)
            self._opened_by = who

    def _joined_step(self):
        """One backward of the other ranks that this rank, joined (DDP's
        join(), uneven inputs), shadowed with no step of its own (the comm
        hook, distributed.BucketRecorder): the step number is taken, so
        that this rank's next step (a next epoch) is numbered as the other
        ranks number it. A step open here (begun by hand) keeps its
        number."""
        self.joined_steps += 1
        if self._step is None:
            self._next += 1
            self._mark_joined_quietly()
        else:
            self._join_pending = True

    def _mark_joined_quietly(self):
        """Sets the trace's join mark once after the rank's last step, from
        the comm hook or close(): nothing with a library that predates it
        (the post-mortem then says "ended early", as it did), and a
        refusal (a sticky write error: a full disk) is left for end_step
        or close to report, not raised inside DDP's join."""
        self._join_pending = False
        if self._joined or not _lib.has_join_mark(self._lib):
            return
        try:
            self.session.mark_joined()
            self._joined = True
        except _lib.ProbeError:
            pass

    def mark_joined(self):
        """Marks that this rank left the training loop by joining the
        others after its last step: its inputs ran out first (uneven
        inputs), and it did not stop by an exception. The post-mortem of
        the rank set then does not call its trace, once closed, "ended
        early" (probe_session_mark_joined; docs/python.md, "Distributed
        jobs"). The tracer does it by itself when DDP shadows the other
        ranks' all-reduces through its comm hook (ddp.join(),
        torch.distributed.algorithms.Join); call it where the tracer
        cannot see the join (comm_hook=False, no DDP, a job's own way of
        stopping a rank that ran out of data). After the last end_step
        (RuntimeError inside a step); a later step clears it. ProbeError
        ERR_UNSUPPORTED with a libampprobe older than the mark."""
        if self._closed:
            raise RuntimeError("ampprobe: mark_joined() after close()")
        if self._step is not None:
            raise RuntimeError("ampprobe: mark_joined() inside step %d: call "
                               "it after the rank's last end_step" %
                               self._step)
        if self.write_error is not None:  # nothing is written any more
            return self._write_error_at()
        self.session.mark_joined()
        self._joined = True

    @property
    def joined(self):
        """Whether the trace carries the join mark now (mark_joined, or
        the tracer saw DDP shadow the others' backwards after this rank's
        last step); a step begun since clears it."""
        return self._joined

    def _gate(self, L):
        """How this forward of L's module is traced: "record" (a forward of
        the step, under grad or under no_grad inside the step: a teacher,
        a checkpointed segment's first pass), "replay" (the same module run
        again during a backward: activation checkpointing's recomputation,
        whose forward was recorded the first time; its gradients are
        recorded) or None (no_grad outside a step: evaluation between
        steps). Only a forward under grad starts a step."""
        grad = torch.is_grad_enabled()
        if grad:
            self._ensure_step()
        elif self._step is None:
            return None
        if L.lid not in self._ran:
            self._ran.add(L.lid)
        elif grad and _in_backward():
            return "replay"
        return "record"

    def _make_input_hook(self, L):
        self = weakref.proxy(self)  # noqa: PLW0642 (the hooks hold it weakly)

        def hook(module, inputs):
            if _gone(self) or self._closed or module is not self.model:
                return  # a copy of the model
            if torch.is_grad_enabled():
                self._ensure_step()
                self._root_forward(module.training)
            if L is None:  # the input not recorded: start the step only
                return
            if self._gate(L) != "record":
                return  # evaluation between steps, or recomputation
            for t in _floats(inputs):
                self._record(L, "fwd_out", t)
        return hook  # registered by _pre_hook

    def _make_pre_hook(self, L):
        loss = L.kind == "loss"
        self = weakref.proxy(self)  # noqa: PLW0642

        grad_in_hook = _grad_hook(self, L, "grad_in")

        def own(t, memo, first):
            """The module's own handle on an input: rounded to FP16 when
            emulated, else an alias (view_as), so that its gradient is this
            module's grad_in alone, not that of every consumer of t. The
            same tensor passed twice gets one handle (attention's
            query is key is value)."""
            if id(t) in memo:
                return memo[id(t)]
            u = _round16(t) if L.emulate else t
            if t.requires_grad and (first or not loss):
                if u is t:
                    u = t.view_as(t)
                u.register_hook(grad_in_hook)
            memo[id(t)] = u
            return u

        def hook(module, inputs):
            if _gone(self):
                return None
            mode = None
            if not self._closed and module is L.module:
                mode = L.mode = self._gate(L)
            inplace = getattr(module, "inplace", False) is True
            if mode is not None and inplace:
                return self._inplace_pre(L, mode, inputs)
            if mode is None or not torch.is_grad_enabled():
                # Evaluation between steps (no_grad, no step open), a copy
                # of the module (copy.deepcopy keeps its hooks: an EMA or
                # teacher model): not recorded. A no_grad forward inside a
                # step is recorded, with no gradient hooks. Both run as the
                # precision says; an in-place module in place (its side
                # effect is the job's).
                if mode == "record":
                    self._record_forward_in(L, inputs)
                if not L.emulate or self._closed:
                    return None
                if inplace:
                    _round16_in_place(_floats(inputs))
                    return None
                # one rounded copy per distinct tensor (_once)
                return _map_floats(inputs, _once(_round16), keep="all")
            fin = _floats(inputs)
            if mode == "record":
                self._record_forward_in(L, inputs)
            memo = {}
            pred = id(_prediction(fin)[0]) if fin else None  # a loss: its
            # prediction's gradient only
            # a loss's containers are rebuilt: its prediction, in a dict
            # or list (a DETR-style criterion), gets its own grad_in
            return _map_floats(inputs, lambda t: own(t, memo, id(t) == pred),
                               keep="records" if loss else "all")
        return hook  # registered by _pre_hook

    def _root_forward(self, training):
        """The model's forward under grad, in a step (training: its mode):
        warns once a tracer when the step's first such forward ran in
        eval mode and one in train mode follows with no backward between
        (_VALIDATION_MERGED): a validation pass run without
        torch.no_grad() after end_step() opened the step, and the next
        iteration's training joined it. Adversarial training (an attack's
        forward and backward in eval mode, then the training forward) has
        a backward between, and a job that trains in eval mode (frozen
        BatchNorm) has no train-mode forward: neither warns."""
        first = self._first_eval
        if first is None:
            self._first_eval = not training
            return
        if (first and training and not self._bwd and
                not self._merged_said and not _in_backward()):
            self._merged_said = True
            warnings.warn(_VALIDATION_MERGED % (self._step, self._step),
                          RuntimeWarning, stacklevel=4)

    def _inplace_pre(self, L, mode, inputs):
        """The pre-hook of a module that works in place (inplace=True): it
        keeps doing so (a job may rely on the side effect: `self.act(h)`
        with its result dropped). fwd_in is recorded before it runs
        (libprobe computes the statistics in the call); the inputs go in
        as they are - rounded to binary16 in place under emulation - and
        the gradient sites are taken from the node its op makes (fwd
        hook)."""
        if mode == "record":
            self._record_forward_in(L, inputs)
            for t in _floats(inputs):
                _settle(t)
        fin = _floats(inputs)
        # The module is about to change tensors recorded in this step: their
        # non-finite counts as recorded are taken now, for the end_step
        # scan (an in-place op of the job's own is not seen: docs). Only
        # when that scan runs (on_nonfinite "warn" or "raise", and libprobe
        # computes no record: self._scan): else it would be a reduction
        # (and on a GPU a sync) per in-place module for nothing.
        if (self._scan and self.on_nonfinite != "record" and self._recording
                and self._refs):
            ids = {id(t): t for t in fin}
            for e in self._refs:
                t = ids.get(id(e[2]))
                # an inference tensor keeps no version (e[3] None): its
                # counts are taken now, before the module changes it
                if t is not None and e[4] is None and (
                        e[3] is None or e[3] == _version(t)):
                    e[4] = _count_nonfinite(t)
        if L.emulate:
            _round16_in_place(fin)
        if torch.is_grad_enabled():
            L.pending = [(t, t.grad_fn) for t in fin if t.requires_grad]
        return None

    def _record_forward_in(self, L, inputs):
        """fwd_in (a loss: the prediction only) and the weights as used:
        the module's parameters as it is about to run with them
        (_params_now: under FSDP2 the unsharded ones it gathered for this
        forward). One it did not hold when hooked gets the weight_grad hook
        here, once: a replaced parameter, or FSDP2's gathered one, into
        which autograd accumulates this rank's gradient (the sharded one
        receives the reduce-scattered result with no hook called)."""
        fin = _floats(inputs)
        # a loss: its prediction only. Its targets are not recorded: a NaN
        # label the loss masks out (missing labels) is no fault, and one it
        # does not makes its output non-finite, which the post-mortem
        # explains with the targets named (recorded as the job's input
        # they made such healthy jobs fail)
        for t in _prediction(fin) if L.kind == "loss" else fin:
            self._record(L, "fwd_in", t)
        if self._frozen:
            self._unfrozen(L)
        if not self._recording:
            return
        now = _params_now(L)
        for p in now:
            if id(p) not in self._by_param and p.requires_grad:
                self._follow(p, L)
                self._late_hooks[id(p)] = p.register_hook(
                    self._make_param_hook(L))
        for p in now:
            w = p.detach()
            if L.emulate:
                w = w.half()  # as autocast would cast it
            self._record(L, "weight", w)

    def _make_fwd_hook(self, L):
        self = weakref.proxy(self)  # noqa: PLW0642

        grad_out_hook = _grad_hook(self, L, "grad_out")

        def hook(module, inputs, output):
            if _gone(self):
                return None
            raw = output
            if L.emulate and not self._closed:
                output = _map_floats(output, _once(_round16))
            mode = pending = None
            if not self._closed and module is L.module:
                mode, L.mode = L.mode, None
                pending, L.pending = L.pending, None
            if mode is None:
                return output if L.emulate and not self._closed else None
            inplace = []
            if pending:  # an in-place module: hook the node its op made
                for o in _floats(raw):
                    node = o.grad_fn
                    if node is None:
                        continue
                    for t, before in pending:
                        if o is t and node is not before:
                            # a view's node gives its base's gradient:
                            # no grad_in then
                            node.register_hook(_node_hook(
                                self, L, o.output_nr, o._base is None))
                            inplace.append(id(o))
                            break
            for t, r in zip(_floats(output), _floats(raw)):
                if mode == "record":
                    self._record(L, "fwd_out", t)
                # not on a leaf (a module that returns its own Parameter):
                # a hook there stays for good, one more each step; its
                # gradient is the weight_grad record already
                if (t.requires_grad and t.grad_fn is not None
                        and id(r) not in inplace):
                    t.register_hook(grad_out_hook)
            return output if L.emulate else None
        return _eager(hook)

    def _follow(self, p, L):
        """p's weight_grad records go to L. Its id is forgotten when p dies
        (a parameter the job replaced, functional_call's per-call weights),
        so that no later tensor given the same id passes for hooked, and
        nothing here keeps p alive."""
        self._by_param[id(p)] = L
        weakref.finalize(p, _forget_param, self._by_param, self._late_hooks,
                         id(p))

    def _hook_param(self, p, L):
        """A weight_grad hook on p, now if it is trainable, else when it
        becomes so: checked at each step's start (fine-tuning unfreezes)
        and at each recorded forward of its module (_unfrozen)."""
        if p.requires_grad:
            self._hooks.append(p.register_hook(self._make_param_hook(L)))
        else:
            self._frozen[id(p)] = (p, L)

    def _unfrozen(self, L):
        """The weight_grad hooks of L's parameters that were frozen when
        hooked and are trainable now, registered at this forward of L,
        before it uses them: a gradient reaches a parameter only from a
        forward run while it required one. Checked at each step's start
        alone, a network frozen there and unfrozen inside the step
        (CycleGAN's set_requires_grad(D, False) for G's update, True for
        D's) never had its gradients recorded, without a word; an inf
        gradient of D was then blamed on the optimizer step."""
        frozen = self._frozen
        for p in _params_now(L):
            f = frozen.get(id(p))
            if f is not None and f[0] is p and p.requires_grad:
                del frozen[id(p)]
                self._hook_param(p, f[1])

    def _make_param_hook(self, L):
        self = weakref.proxy(self)  # noqa: PLW0642

        def hook(g):
            if _gone(self):
                return None
            if L.emulate:
                g = _round16(g)
            self._record(L, "weight_grad", g)
            return g if L.emulate else None
        return hook

    def _saved(self, module, L, t):
        if L.emulate:
            t = _round16(t)
        if self._step is not None and L.selected and L.mode == "record":
            self._record(L, "fwd_saved", t)
        return t

    # -- steps ----------------------------------------------------------------------

    def _in_window(self, step):
        if not self._full:
            return True
        if step < self._start or (self._end >= 0 and step > self._end):
            return False
        return (step - self._start) % self._every == 0

    def begin_step(self, step=None):
        """Starts a step (the first traced forward of a step does it by
        itself, numbering steps 0, 1, ...)."""
        self._child_refuses("begin_step")
        self._begin(step)
        self._opened_by = "begin_step"

    def _begin(self, step=None):
        if self._step is not None:
            raise RuntimeError("ampprobe: step %d not ended (end_step)" %
                               self._step)
        step = self._next if step is None else int(step)
        if self._frozen:  # parameters unfrozen since: hook them now
            frozen, self._frozen = self._frozen, {}
            for p, L in frozen.values():
                self._hook_param(p, L)
        if self.write_error is None and not self._forked:
            try:
                self.session.begin_step(step)
            except _lib.ProbeError as e:
                if self._forked_unseen(e):
                    pass
                elif e.name not in _WRITE_ERRORS:
                    raise
                else:
                    self._write_failed(e)  # (from a hook, as a rule: _gate)
        self._step = step
        self._joined = self._join_pending = False  # (libprobe cleared it)
        self._ran = set()  # layers whose forward ran in this step (_gate)
        self._grads = set()  # layers that got a weight_grad in it
        self._bwd = False
        self._first_eval = None  # the step's first forward of the model
        #                         under grad ran in eval mode (_root_forward)
        self._opened_by = None  # the explicit call that opened it, if any
        self._ended_fwd_only = None  # a step is open: no late gradient
        self._recording = (self.write_error is None and not self._forked
                           and self._in_window(step))
        for w in self._scalers:
            w[1] = float(w[0].get_scale())

    def attach_scaler(self, scaler):
        """A torch.cuda.amp / torch.amp GradScaler or an ampprobe LossScaler:
        its scale at the start of each step is the step's loss scale, and a
        change by end_step a backoff (skipped step) or a growth event.
        Passing scaler= to end_step does the same from the next step on.

        Several scalers (a GAN's, one per network): each call adds one (a
        scaler attached again is not added twice). The first attached
        whose update() ran in the step is the primary: its scale and
        growth tracker are the step's
        loss_scale/growth_tracker; every scaler's backoffs and growths are
        scaler events; a step is found_inf when any scaler found inf in
        it, skipped only when every scaler whose update() ran in it
        skipped each of its optimizers; a gradient overflow is the
        scalers' routine for on_nonfinite when any of them found inf in
        that step (docs/python.md)."""
        self._add_scaler(scaler, known_now=True)

    def _add_scaler(self, scaler, known_now):
        """Watches scaler (attach_scaler; end_step(scaler=), where the
        scale at the open step's start is not known: known_now False)."""
        if any(w[0] is scaler for w in self._scalers):
            return
        _watch_steps(scaler)
        begin = None
        if self._step is not None and known_now:
            begin = float(scaler.get_scale())
        self._scalers.append(
            [scaler, begin, getattr(scaler, "_ampprobe_skips", (0, None))[0]])

    def _read_scalers(self):
        """At end_step: (loss scale at the step's start, growth tracker,
        found_inf, skipped, events) of the attached enabled scalers, each
        None where no scaler says. The primary's scale and tracker: the
        first attached scaler whose update() ran in the step (a scaler
        attached before and no longer used - a job that made a new one at
        a resume - is passed over), else the first attached enabled one;
        found_inf when any scaler found inf (an optimizer of its skipped,
        or it backed off); skipped when every scaler whose update() ran
        (or whose scale changed) in this step skipped all of its
        optimizers; each scaler's backoff or growth an event. Changes
        nothing (an end_step libprobe refused is retried):
        _scalers_step_ended does, once the step ended."""
        scale = tracker = first = None
        found = []  # per scaler active in the step: (found_inf, skipped)
        events = []
        for w in self._scalers:
            sc, begin = w[0], w[1]
            if hasattr(sc, "is_enabled") and not sc.is_enabled():
                continue
            # This step's update() said which optimizers stepped: found_inf
            # when any skipped (the scale backs off), skipped only when none
            # stepped - with two optimizers one may skip while the other
            # steps, and the weights it updates changed
            serial, skips = getattr(sc, "_ampprobe_skips", (0, None))
            updated = serial != w[2]
            new = float(sc.get_scale())
            old = begin if begin is not None else new
            tr = _tracker(sc)
            if first is None:
                first = (old, tr)
            fi = sk = None
            if updated and skips:
                fi, sk = any(skips), all(skips)
            if new < old:
                events.append(("backoff", old, new, tr or 0))
                fi = True if fi is None else fi
                sk = True if sk is None else sk
            elif new > old:
                events.append(("growth", old, new, tr or 0))
            watched = isinstance(sc, LossScaler) or getattr(
                sc, "_ampprobe_watch", False)
            if fi is not None or updated or not watched:
                # (a scaler whose update() cannot be watched: it is taken
                # to have stepped unless it backed off)
                found.append((bool(fi), bool(sk)))
                if scale is None:
                    scale, tracker = old, tr
        if scale is None and first is not None:
            scale, tracker = first
        fi = int(any(f for f, _ in found)) if found else None
        sk = int(all(k for _, k in found)) if found else None
        return scale, tracker, fi, sk, events

    def _scalers_step_ended(self):
        """The step ended: no scale at the next step's start yet
        (begin_step reads it), and each scaler's update() so far read."""
        for w in self._scalers:
            w[1] = None
            w[2] = getattr(w[0], "_ampprobe_skips", (0, None))[0]

    def clip(self, grad_norm, max_norm):
        """The job's clipping of this step: clip_grad_norm_'s return value
        and its max_norm (the coefficient is min(1, max_norm/(norm+1e-6)),
        torch's). Returns grad_norm."""
        self._clip = (_scalar("grad_norm", grad_norm, who="clip", lo=0),
                      _scalar("max_norm", max_norm, who="clip", lo=0))
        return grad_norm

    def scaler_event(self, kind, old_scale, new_scale, growth_tracker=0):
        """A loss-scale change of a job that scales by hand: kind "backoff"
        (the step was skipped), "growth", "hysteresis" or "min_clamp"."""
        if kind not in _lib.SCALER_KINDS:
            raise ValueError("ampprobe: scaler_event(kind=%r): one of %s" %
                             (kind, ", ".join(_lib.SCALER_KINDS)))
        ev = (kind, _scalar("old_scale", old_scale, who="scaler_event"),
              _scalar("new_scale", new_scale, who="scaler_event"),
              _scalar("growth_tracker", growth_tracker, int,
                      who="scaler_event"))
        if None in ev:
            raise TypeError("ampprobe: scaler_event(kind, old_scale, "
                            "new_scale, growth_tracker): numbers, not None")
        # what libprobe refuses (no loss scaler makes it), refused here, at
        # the call: end_step would fail with the step's records written
        for name, v in (("old_scale", ev[1]), ("new_scale", ev[2]),
                        ("growth_tracker", ev[3])):
            if not (math.isfinite(v) and v >= 0):
                raise ValueError("ampprobe: scaler_event(%s=%r): a loss "
                                 "scaler's values are finite and >= 0" %
                                 (name, v))
        self._ensure_step()
        self._hand_events.append(ev)

    def end_step(self, loss=None, optimizer=None, scaler=None, grad_norm=None,
                 max_norm=None, lr=None, loss_scale=None, found_inf=None,
                 skipped=None, growth_tracker=None):
        """Ends the step, after the optimizer step and scaler.update():
        records every traced parameter (the FP32 master after the step),
        the step's scalars (loss, loss scale, scaler events, lr: the
        largest of every param group of optimizer - one or a list - grad
        norm and clip coefficient), then
        checks for a non-finite value (on_nonfinite). Hand-scaled jobs pass
        loss_scale/found_inf/skipped/growth_tracker and call
        scaler_event()."""
        # Every argument is refused before the step is touched (no record
        # written, the step still open): call again with scalars. A bad lr
        # or grad_norm failed after the master weights were recorded, and
        # left libprobe's step open while the tracer had ended it.
        loss = _scalar("loss", loss)
        lr = _scalar("lr", lr) if lr is not None else _largest_lr(optimizer)
        grad_norm = _scalar("grad_norm", grad_norm, lo=0)
        max_norm = _scalar("max_norm", max_norm, lo=0)
        loss_scale = _scalar("loss_scale", loss_scale, lo=0)
        found_inf = _scalar("found_inf", found_inf, "flag")
        skipped = _scalar("skipped", skipped, "flag")
        growth_tracker = _scalar("growth_tracker", growth_tracker, int)
        self._ensure_step(who="end_step")
        step = self._step
        if scaler is not None:
            self._add_scaler(scaler, known_now=False)
        sc = self._scalers or None
        scale, tracker, fi, sk, events = self._read_scalers()
        scale = loss_scale if loss_scale is not None else scale
        tracker = growth_tracker if growth_tracker is not None else tracker
        fi = found_inf if found_inf is not None else fi
        sk = skipped if skipped is not None else sk
        for e in self._hand_events:
            events.append(e)
            if e[0] == "backoff":
                fi = 1 if fi is None else fi
                sk = 1 if sk is None else sk
        if self._recording and self._masters_at != step:
            for L in self._layers:
                if L.selected:
                    for p in _params_now(L):
                        self._record(L, "master_weight", p.detach())
            # once per step: an end_step retried after libprobe refused
            # the scalars or the step's end does not record them again
            self._masters_at = step
        if self.write_error is not None:
            # the recording stopped (in this step or before): the step
            # ends here, libprobe is not called
            self._step = None
            self._next = step + 1
            self._refs = []
            self._clip = None
            self._hand_events = []
            self._ended_fwd_only = None
            self._scalers_step_ended()
            return self._write_error_at()
        if self._digest and any(_is_dtensor(p)
                                for p in self.model.parameters()):
            # sharded after the Tracer (FSDP2): no digest from here on, a
            # warning instead of an error that would leave the step open
            self._digest = False
            warnings.warn(_SHARDED_DIGEST + " (the digest is off from step "
                          "%d: not measured)" % step, RuntimeWarning,
                          stacklevel=2)
        digest = self.weight_digest() if self._digest else None
        if grad_norm is None and self._clip is not None:
            grad_norm, max_norm = self._clip
        gn = float(grad_norm) if grad_norm is not None else None
        mx = coef = None
        if max_norm is not None:  # clipping said: on (> 0) or off (0)
            mx = float(max_norm)
            coef = min(1.0, mx / (gn + 1e-6)) if (
                mx > 0 and gn is not None and math.isfinite(gn)) else 1.0
        have_scaler = sc is not None or bool(self._hand_events) or any(
            v is not None for v in (loss_scale, found_inf, skipped,
                                    growth_tracker))
        lossv = loss if loss is not None else float("nan")
        s = self.session
        ended = False
        try:
            # What the job did not tell is "not measured" (NaN + its bit).
            s.set_scalars(
                loss=lossv if loss is not None else None,
                loss_scale=(scale if scale is not None else 1.0)
                if have_scaler else None,
                growth_tracker=(tracker or 0) if have_scaler else None,
                found_inf=(fi or 0) if have_scaler else None,
                skipped=(sk or 0) if have_scaler else None,
                lr=lr, grad_norm=gn, clip_threshold=mx, clip_coef=coef,
                weight_digest=digest)
            for e in events:
                s.scaler_event(*e)
            try:
                s.end_step()
                ended = True
            except _lib.ProbeError:
                ended = self._libprobe_step_ended()
                raise
        except _lib.ProbeError as e:
            if e.name not in _WRITE_ERRORS:
                raise
            # the trace cannot be written (its sticky error: a full disk):
            # the recording stops and the tracer's step ends here; close()
            # leaves libprobe's step to libprobe
            self._write_failed(e)
            ended = True
        finally:
            # The tracer's step follows libprobe's: it ends only when
            # libprobe's did. A refused set_scalars/scaler_event leaves
            # libprobe's step open: so is the tracer's, and the next call
            # is a retry of end_step or libprobe's own error - the tracer
            # ended its step anyway, and its next forward was refused with
            # 'step 1 begun inside step 0'. A write error stops the
            # recording instead (_write_failed): nothing more goes to
            # libprobe, whose step is left as it is.
            if ended:
                if self._join_pending:  # DDP shadowed others in this step
                    self._mark_joined_quietly()
                self._ended_fwd_only = step if (
                    not self._bwd and self._model_forward_ran()) else None
                refs = self._refs
                self._refs = []
                self._step = None
                self._next = step + 1
                self._clip = None
                self._hand_events = []
                self._scalers_step_ended()
        if self.write_error is not None:
            return self._write_error_at()
        self._check_forwards_seen(step)
        self._check_new_modules(step)
        self._check_empty_step(step)
        if self.on_nonfinite != "record":
            # a loss not given is not measured, not non-finite (0.0 stands
            # for "nothing wrong with it")
            # a step a loss scaler skipped, or in which one found inf
            # (another's optimizer stepped: a GAN's): the scalers' routine
            self._check_nonfinite(step, lossv if loss is not None else 0.0,
                                  bool(sk) or bool(fi), refs)

    def _model_forward_ran(self):
        """A module of the model (input and loss aside) ran its forward
        hook in this step."""
        return any(L.lid in self._ran for L in self._layers
                   if L.kind not in ("input", "loss"))

    def _check_late_backward(self):
        """Warns, once a tracer, when a gradient comes with no step open
        right after a step in which the model ran its forward and nothing
        of a backward was recorded: end_step() was called before
        backward(), and each step's gradients land in the next step
        (_LATE_BACKWARD). A step whose forward had no backward (a check
        under grad) is followed by a forward, not by a gradient, and says
        nothing."""
        if self._late_backward_said or self._ended_fwd_only is None:
            return
        self._late_backward_said = True
        warnings.warn(_LATE_BACKWARD % (self._ended_fwd_only, self._next),
                      RuntimeWarning, stacklevel=4)

    def _check_empty_step(self, step):
        """Warns, once a tracer, when end_step() found no step open and
        ended one of nothing (_EMPTY_STEP): no hook opened it (no forward
        of the model under grad, no gradient) nor begin_step(). end_step()
        called twice per iteration doubled the steps, the extra ones
        empty, and a NaN of iteration 5 was named at step 10, with no
        word. A step the job opened itself (begin_step) is its own."""
        if self._empty_said or self._opened_by != "end_step":
            return
        self._empty_said = True
        warnings.warn(_EMPTY_STEP % step, RuntimeWarning, stacklevel=3)

    def _check_phantom_step(self):
        """At close(), before it ends an open step: warns (once) when the
        model ran its forward under grad in it and no backward came
        (_PHANTOM_STEP): a validation pass without torch.no_grad() after
        the last end_step() opened it. A step the job opened itself
        (begin_step: an inference-only job) says nothing."""
        if (self._phantom_said or self._bwd or self._opened_by == "begin_step"
                or not (self._first_eval is not None or
                        self._model_forward_ran())):
            return
        self._phantom_said = True
        warnings.warn(_PHANTOM_STEP % (self._step, self._step),
                      RuntimeWarning, stacklevel=4)

    def _check_new_modules(self, step):
        """Warns, once a tracer, when the model holds modules it did not
        hold when the Tracer hooked it (`model.extra = nn.Linear(...)`, a
        head replaced for fine-tuning): they have no hooks, so they are
        not recorded nor rounded under emulation, and a fault they make
        is named at the next traced module. A walk of the module tree per
        step (_module_ids: 0.2 us a module); the units are looked for
        only when it changed."""
        if self._new_modules_said:
            return
        now = _module_ids(self.model)
        if now == self._module_ids:
            return
        self._module_ids = now
        new = [n for n, m in _leaf_units(self.model, self._user_kinds)
               if id(m) not in self._unit_ids]
        if not new:  # (a parametrization registered on a traced leaf)
            return
        self._new_modules_said = True
        more = " (and %d more)" % (len(new) - 1) if len(new) > 1 else ""
        warnings.warn(
            "ampprobe: step %d: module '%s'%s is not traced: it was added "
            "to the model after the Tracer was made, so it has no hooks (no "
            "records; not rounded under FP16 emulation, not forced to FP32 "
            "by the precision policy), and a NaN or overflow it makes is "
            "named at the next traced module. Make the Tracer once the "
            "model is complete (docs/python.md, Limits)" % (
                step, _lib.escape(new[0] or type(self.model).__name__),
                more), RuntimeWarning, stacklevel=3)

    def _check_forwards_seen(self, step):
        """Warns, once a tracer, when layers got gradients in the step that
        just ended while no module of the model ran a forward hook in it
        (_NO_FORWARD): the trace then lacks the model's forward, which a
        post-mortem would take for healthy. None, not some: a head a step
        leaves out but whose weights get a zero gradient (DDP's 0 * sum(p)
        trick), a weight the job uses outside its module's forward
        (F.linear(h, self.proj.weight)), are no sign of this. The model's
        input and the loss, which run outside compiled code, do not count."""
        if self._no_forward_said or not self._grads:
            return
        if self._model_forward_ran():
            return
        # (a script unit runs no forward hook: _warn_jit said so)
        missing = [L for L in self._layers
                   if L.lid in self._grads and L.lid not in self._ran
                   and L.jit != "script"]
        if not missing:
            return
        self._no_forward_said = True
        more = " (and %d more)" % (len(missing) - 1) if len(missing) > 1 else ""
        warnings.warn(_NO_FORWARD % (step, _lib.escape(missing[0].name), more),
                      RuntimeWarning, stacklevel=3)

    def _step_nonfinite(self, step, refs):
        """(found, measured): found(forward) -> (layer, site, (NaN, +inf,
        -inf, count)) of the step's first record holding NaN or inf (at a
        forward site when forward is True), or None. From libprobe's
        statistics, computed as each record came
        (probe_session_step_nonfinite), when it computed every one of the
        step's (measured); else from the tensors as they are now
        (_first_bad: a tensor the job changed in place since is seen
        changed, unless an in-place module did it)."""
        sn = self.session.step_nonfinite()
        if sn[0] != step or not sn[3]:
            return (lambda forward: _first_bad(refs, forward)), False

        def found(forward):  # the layer looked up only for an event
            r = sn[2] if forward else sn[1]
            if r is None:
                return None
            return (next(L for L in self._layers if L.lid == r[0]), r[1],
                    r[2])
        return found, True

    def _libprobe_step_ended(self):
        """After probe_step_end failed: did libprobe end its step? It did
        unless it refused at once - for a sticky write error (a full disk,
        a file-size limit: every later call returns it, which a flush
        says) - or the session is closed (no step left either)."""
        if self.session.closed:
            return True
        return self._lib.probe_session_flush(self.session.handle) == 0

    def _check_nonfinite(self, step, lossv, skipped, refs):
        first = self.session.first_nonfinite()
        loss_nf = not math.isfinite(lossv)
        found, measured = self._step_nonfinite(step, refs)
        hit = None
        if (first[0] == step or
                (first[0] >= 0 and (loss_nf or skipped or self._reported < 0))
                or (not measured and first[0] < 0 and self._reported < 0)):
            # The run's first non-finite step (libprobe's, or where it
            # computed nothing, the tensors' until one is found), and every
            # step after it until an event is signalled (that first step
            # may have been the loss scaler's routine overflow, which is
            # not: a later forward inf that a clamp hid from the loss was
            # never said); after an event a step is looked at only when
            # its loss or gradients are bad.
            hit = found(forward=False)
        if loss_nf and (hit is None or
                        _lib.SITE_PHASE.get(hit[1], "forward") != "forward"):
            # The loss is non-finite but the step's first non-finite record
            # comes after a forward (a gradient, a master weight): with
            # several micro-batches per step, an earlier micro-batch's
            # backward (a routine gradient overflow) can come before the
            # forward that made the loss non-finite, so that forward is
            # looked for in every micro-batch. None: the loss was made
            # non-finite by code no module covers (a loss written as a
            # plain function, -log(p) with p underflowed to 0), scaler or
            # not.
            hit = found(forward=True) or (None, "loss", None)
        if hit is None:
            return
        L, site, c = hit
        phase = _lib.SITE_PHASE.get(site, "forward") if L is not None \
            else "forward"
        if phase == "backward" and skipped and not _weights_nonfinite(refs):
            # a loss scaler's routine overflow: it found inf and skipped
            # (with several scalers: any of them). Not when a weight came
            # out of the step non-finite: an optimizer stepped with it
            return
        if step <= self._reported:
            return
        self._reported = step
        name = L.name if L is not None else "loss"
        kind = L.kind if L is not None else "loss"
        detail = "" if c is None else " (%d NaN, %d +inf, %d -inf of %d)" % c
        if L is None and not self._in_window(step):
            detail = (" (the step was not traced: outside step_start/"
                      "step_end/every, so where it began is not known)")
        if (kind == "loss" and site == "fwd_out" and c is not None and c[0]
                and not any(e[0] is L and e[1] == "fwd_in" and
                            sum(_recorded_counts(e)) for e in refs)):
            # from a finite prediction only: masked logits (-inf, no event)
            # make a fully masked row's NaN, not a target (review 9)
            detail += ("; the loss's targets are not recorded: a NaN among "
                       "them (the data) gives this too")
        if phase == "backward" and L is not None:
            if skipped:  # found inf, and a weight came out non-finite
                detail += ("; a loss scaler found inf in this step, yet a "
                           "weight came out of it non-finite: an optimizer "
                           "stepped with it (past its scaler's step?)")
            else:
                detail += ("; no loss scaler the tracer reads found inf in "
                           "this step (a scaler it does not read that "
                           "skipped the step makes this its routine: "
                           "attach_scaler() each one, a GAN's two)")
        if site == _dist.POST:
            detail += ("; it came back from the gradient all-reduce, finite "
                       "as this rank sent it: another rank's gradient or "
                       "the all-reduce's sum (post-mortem over every rank's "
                       "trace)")
        err = NonFiniteError(step, phase, name, site, kind, detail)
        if self.on_nonfinite == "raise":
            # The run stops here: the tracer is closed (hooks removed, the
            # trace complete), so the file is free at once - a new Tracer
            # on the same path in this process (a notebook re-run) would
            # otherwise find it locked until garbage collection.
            try:
                self.close()
            except Exception:
                pass
            raise err
        warnings.warn(str(err), NonFiniteWarning, stacklevel=3)

    # -- distributed jobs -------------------------------------------------------------

    def comm_hook(self, hook=None, state=None, allreduce_dtype=None,
                  prediv=True, process_group=None):
        """A DDP communication hook (a function) recording each bucket
        before and after its all-reduce, for a DDP module the tracer was
        not given: ddp.register_comm_hook(None, tracer.comm_hook()). hook:
        the job's own hook to wrap (it does the all-reduce; pre = the
        bucket handed to it, post = what its future returns); None: the
        all-reduce as torch's default hook does it (allreduce_dtype,
        prediv). The recorder becomes tracer.comm_recorder."""
        self.comm_recorder = _dist.BucketRecorder(
            self, hook=hook, dtype=allreduce_dtype, prediv=prediv,
            group=process_group, state=state)
        return self.comm_recorder.hook

    def weight_digest(self):
        """probe_digest64 of the model's parameters as FP32, in parameter
        order (model.parameters(), each once), chained from
        PROBE_DIGEST64_INIT: the digest end_step stores with
        weight_digest=True. A parameter on a device or not FP32 is copied
        to host FP32 first."""
        fn = digest64_fn()
        h = digest64_init()
        params = [p for p in dict.fromkeys(self.model.parameters())
                  if not _is_lazy(p)]  # held now (a lazy one: no values)
        if any(_is_dtensor(p) for p in params):  # sharded after the Tracer
            raise ValueError(_SHARDED_DIGEST)
        with torch.no_grad():
            for p in params:
                t = p.detach()
                if t.dtype != torch.float32 or t.device.type != "cpu" or \
                        not t.is_contiguous():
                    t = t.to(device="cpu", dtype=torch.float32).contiguous()
                h = fn(t.data_ptr(), t.numel() * 4, h)
        return h

    # -- helpers for the job ----------------------------------------------------------

    def autocast(self, dtype=None):
        """The autocast context the policy asks for: none for fp32 and for
        FP16 emulation, torch.autocast(device, dtype) otherwise."""
        if self.precision == "fp32" or self.emulate:
            return contextlib.nullcontext()
        dt = dtype or (torch.bfloat16 if self.precision == "bf16"
                       else torch.float16)
        return torch.autocast(device_type=self.device_type, dtype=dt)

    def layer_names(self):
        return [L.name for L in self._layers]

    def fp32_modules(self):
        """Modules the policy forces to FP32 (losses, always FP32, left
        out)."""
        return [L.name for L in self._layers if L.fp32 and L.kind != "loss"]

    def close(self, aborted=None):
        """Removes the hooks and closes the trace (idempotent). A step
        still open (a forward under grad after the last end_step, a job
        that raised in the middle of a step) is ended first, its records
        kept and its scalars not measured (_end_open_step).

        aborted: None for a job that finished; else what ended it (a
        string: "KeyboardInterrupt", "CUDA out of memory"): the trace is
        closed with every row but marked as a job that ended abnormally
        (probe_session_mark_aborted; its step in progress, if any, as
        closed half done), and the post-mortem says so (not-closed,
        degraded, exit 1) instead of "healthy". Leaving a `with` block by
        an exception passes its type name."""
        if self._closed:
            return
        self._closed = True
        # a child of fork() (a helper or worker leaving a `with` block, its
        # finally): the trace is the parent's, and libprobe refuses the
        # session here; only the child's copy of the model is given back
        child = getattr(self, "_pid", os.getpid()) != os.getpid()
        if child:
            self._forked = True
            aborted = None
        if aborted:
            # before the open step is ended: the mark names it half done
            try:
                self.session.mark_aborted(aborted)
            except _lib.ProbeError:
                pass  # a sticky write error: close reports it
        if getattr(self, "_step", None) is not None and not child:
            if not aborted and self.write_error is None:
                self._check_phantom_step()
            _end_open_step(self.session)
        if getattr(self, "_join_pending", False) and not child:  # shadows
            self._mark_joined_quietly()                        # in that step
        Tracer._release(self._hooks, self._late_hooks, self._wrapped,
                        self._layers, self)
        self._hooks = []
        self._frozen = {}
        self._wrapped = []
        Tracer._give_back_guard(getattr(self, "_guard", None))
        if getattr(self, "_finalizer", None) is not None:  # set after _attach
            self._finalizer.detach()
        # nothing reaches the freed session any more: a copy of the model
        # (deepcopy) keeps its hooks, and a step may have been open
        self._recording = False
        self._step = None
        self._refs = []
        self._h = ctypes.c_void_p(0)
        if child:
            self.session.disown()
            return
        try:
            self.session.close()
        except _lib.ProbeError as e:
            if e.name not in _WRITE_ERRORS:
                raise
            self._write_failed(e)  # (the last rows: the disk filled since)
        self._write_error_at()

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        self.close(aborted=_exception_reason(exc_type, exc))


def _exception_reason(exc_type, exc):
    """The abort reason for an exception leaving the tracer, None for
    none (or a SystemExit with status 0/None: sys.exit() is a normal end)."""
    if exc_type is None:
        return None
    if isinstance(exc, SignalExit):  # stop_on_signals: the CLI's words
        return _signal_reason(exc.signum)
    if issubclass(exc_type, SystemExit) and getattr(exc, "code", None) in (None, 0):
        return None
    if issubclass(exc_type, KeyboardInterrupt):
        return "KeyboardInterrupt"
    return "exception " + getattr(exc_type, "__name__", "?")


# The exception the interpreter is exiting by, as seen by our sys.excepthook
# wrapper (installed once, chained to the hook it replaced): the finalizer
# runs at exit after the hook, and marks the trace aborted with it.
_UNCAUGHT = [None]
_HOOK_INSTALLED = [False]


def _install_excepthook():
    if _HOOK_INSTALLED[0]:
        return
    _HOOK_INSTALLED[0] = True
    prev = sys.excepthook

    def _ampprobe_excepthook(exc_type, exc, tb):
        try:
            _UNCAUGHT[0] = _exception_reason(exc_type, exc)
        except Exception:
            pass
        prev(exc_type, exc, tb)

    sys.excepthook = _ampprobe_excepthook


def _uncaught_reason():
    """What the interpreter exits by, for the finalizer: our hook's record,
    else sys.last_type (set for an uncaught exception even when a later
    hook replaced ours) outside an interactive session, where it only
    means some earlier line failed."""
    if _UNCAUGHT[0]:
        return "uncaught " + _UNCAUGHT[0]
    if _SIGNALLED[0]:  # a SignalExit (a SystemExit: no excepthook)
        return _SIGNALLED[0]
    lt = getattr(sys, "last_type", None)
    if lt is not None and not hasattr(sys, "ps1"):
        r = _exception_reason(lt, getattr(sys, "last_value", None))
        return "uncaught " + r if r else None
    return None


class SignalExit(SystemExit):
    """Raised in the main thread by the handler stop_on_signals installs:
    the job was told to stop by signal `signum`. A SystemExit (`except
    Exception` lets it through) whose code is 128 + signum, the status a
    shell or Slurm reads as "ended by that signal"; a Tracer it leaves
    is marked aborted "signal SIGTERM" (the name `ampprobe run` writes)."""

    def __init__(self, signum):
        super().__init__(128 + int(signum))
        self.signum = int(signum)

    def __str__(self):
        return _signal_reason(self.signum)


# The first stop signal received ("signal SIGTERM") and when (monotonic
# seconds), set by _on_stop_signal: the finalizer marks a tracer never
# closed with it, since an uncaught SystemExit skips sys.excepthook.
_SIGNALLED = [None]
_SIGNAL_FIRST = [0.0]
# A repeat within this of the first is the same request delivered twice
# (timeout(1) signals the command, then its group; a launcher forwards
# what it got): ignored, as `ampprobe run` does (CLI_SIGNAL_REPEAT_S), so
# that it cannot break the tracer's close. A later one ends the process.
_SIGNAL_REPEAT_S = 1.0


def _signal_reason(signum):
    try:
        return "signal " + signal.Signals(signum).name
    except ValueError:
        return "signal %d" % signum


def _on_stop_signal(signum, frame):
    now = time.monotonic()
    if _SIGNALLED[0] is None:
        _SIGNALLED[0] = _signal_reason(signum)
        _SIGNAL_FIRST[0] = now
        raise SignalExit(signum)
    if now - _SIGNAL_FIRST[0] < _SIGNAL_REPEAT_S:
        return
    # asked again: end now, by the signal's default action (work stuck in
    # a close or a checkpoint cannot make the job deaf to it)
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def stop_on_signals(signals=(signal.SIGTERM,)):
    """Opt-in: makes each of `signals` (default SIGTERM: Slurm's time limit
    and preemption, Kubernetes, `docker stop`) stop the job by raising
    SignalExit in the main thread, instead of Python's default action for
    SIGTERM, which kills the interpreter with no `with` exit and no
    finalizer (the trace read "not closed", its reason lost). A
    `with Tracer(...)` block it leaves, and a tracer never closed that the
    at-exit finalizer closes, are marked aborted "signal SIGTERM" (the
    name `ampprobe run` writes), and the process exits with status
    128 + signum (143 for SIGTERM). A repeat of a stop signal within 1 s
    of the first is ignored (the same request delivered twice: the close
    goes on); a later one ends the process by the signal's default action.

    Call it once, from the main thread (a ValueError otherwise: Python
    runs signal handlers there only). The library never installs a handler
    by itself. Returns {signum: previous handler}; restore with
    `for s, h in prev.items(): signal.signal(s, h)`. SIGKILL and SIGSTOP
    cannot be caught (ValueError); nothing is installed when any signal is
    refused."""
    if threading.current_thread() is not threading.main_thread():
        raise ValueError("stop_on_signals must be called from the main "
                         "thread (Python runs signal handlers there only)")
    if isinstance(signals, int):
        signals = (signals,)
    sigs = []
    for s in signals:
        if isinstance(s, bool) or not isinstance(s, int):
            raise TypeError("stop_on_signals: %r is not a signal number" % (s,))
        if s in (signal.SIGKILL, signal.SIGSTOP):
            raise ValueError("stop_on_signals: %s cannot be caught" %
                             _signal_reason(s))
        if s not in signal.valid_signals():
            raise ValueError("stop_on_signals: %r is no signal here" % (s,))
        if s not in sigs:
            sigs.append(s)
    prev = {}
    try:
        for s in sigs:
            prev[s] = signal.signal(s, _on_stop_signal)
    except BaseException:
        for s, h in prev.items():  # all or nothing
            signal.signal(s, h)
        raise
    return prev


def _end_open_step(session, snapshot=True):
    """Ends the session's step, if one is open, with every scalar not
    measured (NaN and its bit in `unmeasured`), for close() and a tracer
    collected unclosed. libprobe's close ended it too, but without scalars
    it wrote no steps row: the trace held records of a step its steps
    table did not have, and the post-mortem named an event at that step.
    snapshot=False (the finalizer: the step's tensors may be gone) leaves
    the ending to probe_session_close, which takes no snapshot. Errors
    (a full disk) are left for close to report."""
    if session.closed:
        return
    try:
        session.set_scalars()  # ERR_STATE when no step is open
    except _lib.ProbeError:
        return
    if snapshot:
        try:
            session.end_step()
        except _lib.ProbeError:
            pass


def _scalar(name, v, kind=float, who="end_step", lo=None):
    """A scalar argument `name` of who (end_step, clip, scaler_event):
    core.check_scalar (a one-element tensor is its number; a bool, a
    string, a larger tensor, a negative norm refused, naming the
    argument)."""
    return check_scalar(name, v, kind, who, lo, tensors=True)


def _first_bad(refs, forward=False):
    """(layer, site, (NaN, +inf, -inf, count)) of the first of a step's
    recorded tensors (execution order) holding a NaN or inf, of a forward
    site only when forward=True; None when every one is finite. Read from
    the tensors at end_step, for a step whose records libprobe did not all
    compute (Tracer._step_nonfinite). A weight recorded as the parameter
    itself (not emulated: no copy) is left out: it holds the values the
    optimizer wrote after the forward (a non-finite update made it
    non-finite, and it was named as the forward's origin)."""
    for e in refs:
        L, site = e[0], e[1]
        if forward and _lib.SITE_PHASE.get(site, "forward") != "forward":
            continue
        if site == "weight" and not L.emulate:
            continue
        c = _recorded_counts(e)
        if sum(c) and not _masked_logits(L, site, c):
            return (L, site, c + (e[2].numel(),))
    return None


def _largest_lr(optimizer):
    """end_step's lr from optimizer= (an optimizer, or a list or tuple of
    them): the largest lr over every param group of every one (a spike
    in a head's group, with layer-wise decay or a no-decay group, is
    seen; param_groups[0] alone hid it), a NaN or inf one first; None
    when there is none."""
    if optimizer is None:
        return None
    opts = optimizer if isinstance(optimizer, (list, tuple)) else (optimizer,)
    lrs = [_scalar("lr", g["lr"]) for o in opts for g in o.param_groups
           if g.get("lr") is not None]
    bad = [v for v in lrs if not math.isfinite(v)]
    return bad[0] if bad else (max(lrs) if lrs else None)


def _weights_nonfinite(refs):
    """A master weight recorded in this step (after the optimizer step)
    holds NaN or inf."""
    return any(e[1] == "master_weight" and sum(_recorded_counts(e))
               for e in refs)


def _masked_logits(L, site, c):
    """A softmax's or a loss's input holding -inf and nothing else
    non-finite, (NaN, +inf, -inf) counts c: masked logits, no event
    (libprobe's probe_record_nonfinite)."""
    return (L.kind in ("softmax", "loss") and site == "fwd_in" and
            c[0] == 0 and c[1] == 0)


def _count_nonfinite(t):
    """(NaN, +inf, -inf) counts of a tensor; one cheap pass when it is all
    finite (its float64 sum is then finite)."""
    with torch.no_grad():
        if bool(torch.isfinite(t.sum(dtype=torch.float64))):
            return (0, 0, 0)
        return (int(torch.isnan(t).sum()), int((t == math.inf).sum()),
                int((t == -math.inf).sum()))


def _recorded_counts(e):
    """The (NaN, +inf, -inf) counts of a step's record e = [layer, site,
    tensor, version at record, counts taken before an in-place module
    changed it] as libprobe read it: the live tensor when unchanged."""
    if e[4] is not None and (e[3] is None or e[2]._version != e[3]):
        return e[4]  # (e[3] None: an inference tensor, no version kept)
    return _count_nonfinite(e[2])


def _gradscaler_skips(sc):
    """Of a torch GradScaler before its update(): for each optimizer whose
    step() ran since the last update, whether it skipped (its found_inf)."""
    out = []
    for st in getattr(sc, "_per_optimizer_states", {}).values():
        stage = st.get("stage")
        if getattr(stage, "name", stage) != "STEPPED":
            continue
        found = st.get("found_inf_per_device") or {}
        out.append(any(float(v) != 0.0 for v in found.values()))
    return out


def _watch_steps(sc):
    """A torch GradScaler's update() forgets which optimizer skipped its
    step; end_step runs after it. Wraps the scaler's update so that it
    leaves that (sc._ampprobe_skips: a serial and, per optimizer that
    stepped through it, True when it skipped) as at.LossScaler does."""
    if isinstance(sc, LossScaler) or getattr(sc, "_ampprobe_watch", False):
        return
    orig = getattr(sc, "update", None)
    if orig is None or not hasattr(sc, "_per_optimizer_states"):
        return

    def update(*args, **kwargs):
        try:
            skips = _gradscaler_skips(sc)
        except Exception:  # a scaler of another layout: not read
            skips = None
        sc._ampprobe_skips = (getattr(sc, "_ampprobe_skips", (0, None))[0]
                              + 1, skips)
        return orig(*args, **kwargs)
    try:
        sc.update = functools.wraps(orig)(update)
        sc._ampprobe_watch = True
    except (AttributeError, TypeError):
        pass


def _tracker(sc):
    f = getattr(sc, "_get_growth_tracker", None)
    if f is None:
        return 0
    v = f()
    try:
        return int(v)
    except (TypeError, ValueError):
        return 0


def _parent_argv():
    """The parent process's argv (Linux /proc), or None."""
    try:
        with open("/proc/%d/cmdline" % os.getppid(), "rb") as f:
            raw = f.read()
    except OSError:
        return None
    args = [a.decode(errors="replace") for a in raw.split(b"\0") if a]
    return args or None


def _command_line():
    """The job's command as the shell would take it back, interpreter
    included ("/usr/bin/python3 train.py --steps 40"), for the trace's
    command_line (the post-mortem's suggested commands start from it).

    A worker started by multiprocessing's spawn (torch.multiprocessing.spawn)
    has a stub for argv ("python -c 'from multiprocessing.spawn import
    spawn_main; ...' --multiprocessing-fork"), and one started by torchrun
    its script without the launcher: the job's command is then the
    parent's (the script that spawned, the torchrun command line)."""
    argv = getattr(sys, "orig_argv", None) or [sys.executable] + sys.argv
    spawned = argv[-1:] == ["--multiprocessing-fork"] and any(
        a.startswith("from multiprocessing.spawn import spawn_main")
        for a in argv)
    launched = "TORCHELASTIC_RUN_ID" in os.environ
    if spawned or launched:
        parent = _parent_argv() if os.getppid() > 1 else None
        if parent and not any("ipykernel" in a for a in parent):
            return shlex.join(parent)
        return ""  # not known here: the post-mortem says "your command"
    return shlex.join(argv)


def _check_layers(layers):
    """layers=: None, a comma-separated string of globs or an iterable of
    them."""
    if layers is None or isinstance(layers, str):
        return layers
    try:
        items = list(layers)
    except TypeError:
        items = None
    if items is None or not all(isinstance(g, str) for g in items):
        raise TypeError("ampprobe: Tracer(layers=...): a comma-separated "
                        "string of name globs or a list of them; got %r" %
                        (layers,))
    return items


def _check_kinds(kinds):
    """kinds=: {class or class name: kind name}. A kind name neither the
    package nor libprobe knows is recorded as "other" (policies still match
    the name given): warned, since it is most often a typo."""
    if kinds is None:
        return None
    if not isinstance(kinds, collections.abc.Mapping):
        raise TypeError("ampprobe: Tracer(kinds=...): a dict {class or class "
                        "name: kind name}; got %s" % type(kinds).__name__)
    known = None
    for k, v in kinds.items():
        if not (isinstance(k, str) or isinstance(k, type)):
            raise TypeError("ampprobe: Tracer(kinds=...): key %r is not a "
                            "class or a class name" % (k,))
        if not isinstance(v, str):
            raise TypeError("ampprobe: Tracer(kinds=...): the kind of %s "
                            "must be a kind name (a str, e.g. \"revin\"); "
                            "got %r" % (getattr(k, "__name__", k), v))
        if known is None:
            known = set(_lib.kind_names()) | set(_POLICY_KINDS)
        if v not in known:
            warnings.warn(
                "ampprobe: Tracer(kinds=...): kind %r of %s is not a kind "
                "libprobe knows (%s): recorded as \"other\"; the precision "
                "policy still matches %r" % (
                    v, getattr(k, "__name__", k), ", ".join(sorted(known)), v),
                RuntimeWarning, stacklevel=3)
    return kinds


def _split(x):
    if x is None:
        return []
    if isinstance(x, str):
        return [t.strip() for t in x.split(",") if t.strip()]
    return list(x)


def trace(model, path=None, **kw):
    """Tracer(model, path, **kw)."""
    return Tracer(model, path, **kw)
