#!/usr/bin/python3
"""torch_ref.py - PyTorch reference for the layer kernels (tests/layers).

Usage: torch_ref.py IN.bin OUT.bin

IN.bin holds the weights, batches and upstream gradients the C test used
("<case>.<tensor>" names, see test_layers_torch.c); this script rebuilds each
module with torch.nn modules / functional ops in float64 on exactly those
values, runs forward and backward, and writes outputs and gradients to OUT.bin
under the names the C test compares. Exit 77 when torch cannot be imported.

File format (little-endian): magic b"AMPLTEN1", u32 count, then per tensor:
u32 name length, name (UTF-8), u32 dtype (0 f32, 1 i32, 2 f64), u32 ndim,
u64 dims[ndim], data.
"""
import struct
import sys

try:
    import numpy as np
    import torch
    import torch.nn.functional as F
except Exception as e:  # noqa: BLE001 - any import failure means skip
    print(f"SKIP: torch not importable: {e}")
    sys.exit(77)

MAGIC = b"AMPLTEN1"
DTYPES = {0: np.float32, 1: np.int32, 2: np.float64}
CODES = {np.dtype(np.float32): 0, np.dtype(np.int32): 1, np.dtype(np.float64): 2}


def read_archive(path):
    with open(path, "rb") as f:
        buf = f.read()
    if buf[:8] != MAGIC:
        raise SystemExit(f"{path}: not a tensor archive (bad magic)")
    (count,) = struct.unpack_from("<I", buf, 8)
    off, out = 12, {}
    for _ in range(count):
        (nl,) = struct.unpack_from("<I", buf, off)
        off += 4
        name = buf[off:off + nl].decode()
        off += nl
        dt, nd = struct.unpack_from("<II", buf, off)
        off += 8
        dims = struct.unpack_from(f"<{nd}Q", buf, off)
        off += 8 * nd
        dtype = np.dtype(DTYPES[dt])
        n = int(np.prod(dims)) if nd else 1
        out[name] = np.frombuffer(buf, dtype, n, off).reshape(dims).copy()
        off += n * dtype.itemsize
    return out


def write_archive(path, tensors):
    with open(path, "wb") as f:
        f.write(MAGIC + struct.pack("<I", len(tensors)))
        for name, a in tensors.items():
            a = np.ascontiguousarray(a)
            nb = name.encode()
            f.write(struct.pack("<I", len(nb)) + nb)
            f.write(struct.pack("<II", CODES[a.dtype], a.ndim))
            f.write(struct.pack(f"<{a.ndim}Q", *a.shape))
            f.write(a.tobytes())


def T(a, grad=False):
    t = torch.tensor(np.asarray(a, dtype=np.float64), dtype=torch.float64)
    return t.requires_grad_(grad)


def N(t):
    return t.detach().numpy().astype(np.float64)


class RevIN(torch.nn.Module):
    """RevIN as in the authors' reference code (ts-kim/RevIN, revin.py)."""

    def __init__(self, num_features, eps=1e-5, affine=True):
        super().__init__()
        self.num_features, self.eps, self.affine = num_features, eps, affine
        if affine:
            self.affine_weight = torch.nn.Parameter(torch.ones(num_features))
            self.affine_bias = torch.nn.Parameter(torch.zeros(num_features))

    def forward(self, x, mode):
        if mode == "norm":
            self._get_statistics(x)
            return self._normalize(x)
        return self._denormalize(x)

    def _get_statistics(self, x):
        dim2reduce = tuple(range(1, x.ndim - 1))
        self.mean = torch.mean(x, dim=dim2reduce, keepdim=True).detach()
        self.stdev = torch.sqrt(
            torch.var(x, dim=dim2reduce, keepdim=True, unbiased=False)
            + self.eps).detach()

    def _normalize(self, x):
        x = x - self.mean
        x = x / self.stdev
        if self.affine:
            x = x * self.affine_weight
            x = x + self.affine_bias
        return x

    def _denormalize(self, x):
        if self.affine:
            x = x - self.affine_bias
            x = x / (self.affine_weight + self.eps * self.eps)
        x = x * self.stdev
        x = x + self.mean
        return x


def run(a):
    r = {}

    # linear: out = x W^T + b, loss = sum(out * dout)
    lin = torch.nn.Linear(a["linear.w"].shape[1], a["linear.w"].shape[0]).double()
    with torch.no_grad():
        lin.weight.copy_(T(a["linear.w"]))
        lin.bias.copy_(T(a["linear.b"]))
    x = T(a["linear.x"], True)
    out = lin(x)
    (out * T(a["linear.dout"])).sum().backward()
    r.update({"linear.out": N(out), "linear.dx": N(x.grad),
              "linear.dw": N(lin.weight.grad), "linear.db": N(lin.bias.grad)})

    # batchnorm1d, training mode, one step of running statistics
    C = a["bn.gamma"].shape[0]
    bn = torch.nn.BatchNorm1d(C, eps=1e-5, momentum=0.1).double().train()
    with torch.no_grad():
        bn.weight.copy_(T(a["bn.gamma"]))
        bn.bias.copy_(T(a["bn.beta"]))
        bn.running_mean.copy_(T(a["bn.rmean_in"]))
        bn.running_var.copy_(T(a["bn.rvar_in"]))
    x = T(a["bn.x"], True)
    out = bn(x)
    (out * T(a["bn.dout"])).sum().backward()
    bn.eval()  # evaluation with the updated running statistics
    with torch.no_grad():
        r["bn.eval_out"] = N(bn(T(a["bn.x2"])))
    r.update({"bn.out": N(out), "bn.dx": N(x.grad),
              "bn.dgamma": N(bn.weight.grad), "bn.dbeta": N(bn.bias.grad),
              "bn.rmean": N(bn.running_mean), "bn.rvar": N(bn.running_var)})

    # layernorm over the last dim
    C = a["ln.w"].shape[0]
    ln = torch.nn.LayerNorm(C, eps=1e-5).double()
    with torch.no_grad():
        ln.weight.copy_(T(a["ln.w"]))
        ln.bias.copy_(T(a["ln.b"]))
    x = T(a["ln.x"], True)
    out = ln(x)
    (out * T(a["ln.dout"])).sum().backward()
    r.update({"ln.out": N(out), "ln.dx": N(x.grad),
              "ln.dw": N(ln.weight.grad), "ln.db": N(ln.bias.grad)})

    # RevIN: norm on x (B,T,C), denorm on an independent y (B,H,C)
    C = a["revin.gamma"].shape[0]
    rv = RevIN(C, eps=1e-5, affine=True).double()
    with torch.no_grad():
        rv.affine_weight.copy_(T(a["revin.gamma"]))
        rv.affine_bias.copy_(T(a["revin.beta"]))
    x = T(a["revin.x"], True)
    y = T(a["revin.y"], True)
    xn = rv(x, "norm")
    yd = rv(y, "denorm")
    ((xn * T(a["revin.dxn"])).sum() + (yd * T(a["revin.dyd"])).sum()).backward()
    r.update({"revin.xn": N(xn), "revin.yd": N(yd), "revin.dx": N(x.grad),
              "revin.dy": N(y.grad), "revin.dgamma": N(rv.affine_weight.grad),
              "revin.dbeta": N(rv.affine_bias.grad),
              "revin.mean": N(rv.mean).reshape(-1),
              "revin.stdev": N(rv.stdev).reshape(-1)})

    # relu, gelu (tanh approximation)
    for name, fn in (("relu", F.relu),
                     ("gelu", lambda t: F.gelu(t, approximate="tanh"))):
        x = T(a[f"{name}.x"], True)
        out = fn(x)
        (out * T(a[f"{name}.dout"])).sum().backward()
        r.update({f"{name}.out": N(out), f"{name}.dx": N(x.grad)})

    # softmax over the last dim
    x = T(a["softmax.x"], True)
    out = torch.softmax(x, dim=-1)
    (out * T(a["softmax.dout"])).sum().backward()
    r.update({"softmax.out": N(out), "softmax.dx": N(x.grad)})

    # single-head self-attention, non-causal and causal
    for name in ("attn", "attnc"):
        C = a[f"{name}.wo"].shape[0]
        mha = torch.nn.MultiheadAttention(C, 1, batch_first=True).double()
        with torch.no_grad():
            mha.in_proj_weight.copy_(T(a[f"{name}.wqkv"]))
            mha.in_proj_bias.copy_(T(a[f"{name}.bqkv"]))
            mha.out_proj.weight.copy_(T(a[f"{name}.wo"]))
            mha.out_proj.bias.copy_(T(a[f"{name}.bo"]))
        x = T(a[f"{name}.x"], True)
        Tn = x.shape[1]
        mask = None
        if name == "attnc":
            mask = torch.triu(torch.ones(Tn, Tn, dtype=torch.bool), diagonal=1)
        out, probs = mha(x, x, x, need_weights=True, attn_mask=mask,
                         average_attn_weights=False)
        (out * T(a[f"{name}.dout"])).sum().backward()
        r.update({f"{name}.out": N(out), f"{name}.probs": N(probs[:, 0]),
                  f"{name}.dx": N(x.grad),
                  f"{name}.dwqkv": N(mha.in_proj_weight.grad),
                  f"{name}.dbqkv": N(mha.in_proj_bias.grad),
                  f"{name}.dwo": N(mha.out_proj.weight.grad),
                  f"{name}.dbo": N(mha.out_proj.bias.grad)})

    # mse (mean), backward with dloss
    p = T(a["mse.pred"], True)
    loss = F.mse_loss(p, T(a["mse.target"]))
    (loss * float(a["mse.dloss"].reshape(-1)[0])).backward()
    r.update({"mse.loss": N(loss).reshape(1), "mse.dpred": N(p.grad)})

    # cross-entropy on probabilities: nll_loss(log(p), y)
    p = T(a["ce.probs"], True)
    y = torch.tensor(a["ce.targets"].astype(np.int64))
    loss = F.nll_loss(torch.log(p), y)
    (loss * float(a["ce.dloss"].reshape(-1)[0])).backward()
    r.update({"ce.loss": N(loss).reshape(1), "ce.dprobs": N(p.grad)})
    return r


def main():
    if len(sys.argv) != 3:
        raise SystemExit("usage: torch_ref.py IN.bin OUT.bin")
    torch.set_grad_enabled(True)
    a = read_archive(sys.argv[1])
    write_archive(sys.argv[2], run(a))


if __name__ == "__main__":
    main()
