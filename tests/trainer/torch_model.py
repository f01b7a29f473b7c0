#!/usr/bin/python3
"""tests/trainer/torch_model.py - the trainer's model in PyTorch (CPU, FP32).

Reads IN.json (the trainer's effective config, its initial parameters in the
trainer's layout, the step-0 batch), builds the same module stack with the
same weights, computes the loss (times loss_weight) and its gradients, and
writes OUT.json {"loss": ..., "grads": [...]} with the gradients in the
trainer's parameter layout. Exit 77 when torch is not importable (the test
then reports SKIP).

    /usr/bin/python3 torch_model.py IN.json OUT.json
"""
import json
import math
import sys

try:
    import torch
    import torch.nn.functional as F
except ImportError:
    sys.exit(77)


def main():
    inp = json.load(open(sys.argv[1]))
    cfg = inp["config"]
    B, Fin = inp["batch"], inp["in_dim"]
    P = torch.tensor(inp["params"], dtype=torch.float32)
    x = torch.tensor(inp["x"], dtype=torch.float32).reshape(B, Fin)
    leaves = []
    off = 0

    def take(n, shape=None):
        nonlocal off
        t = P[off:off + n].clone()
        off += n
        if shape is not None:
            t = t.reshape(shape)
        t.requires_grad_(True)
        leaves.append(t)
        return t

    h, w = x, Fin
    revin = None
    for m in cfg["model"]:
        t = m["type"]
        if t == "linear":
            out = m["out"]
            W = take(out * w, (out, w))
            b = take(out) if m["bias"] else None
            h = F.linear(h, W, b)
            w = out
        elif t == "bn":
            g, b = take(w), take(w)
            h = F.batch_norm(h, None, None, g, b, training=True, eps=m["eps"])
        elif t == "layernorm":
            g, b = take(w), take(w)
            h = F.layer_norm(h, (w,), g, b, m["eps"])
        elif t == "revin":
            eps = m["eps"]
            g = take(1) if m["affine"] else None
            b = take(1) if m["affine"] else None
            mean = h.mean(dim=1, keepdim=True).detach()
            std = torch.sqrt(h.var(dim=1, keepdim=True, unbiased=False) + eps).detach()
            h = (h - mean) / std
            if g is not None:
                h = h * g + b
            revin = (mean, std, g, b, eps, m["denorm"])
        elif t == "relu":
            h = torch.relu(h)
        elif t == "gelu":
            h = F.gelu(h, approximate="tanh")
        elif t == "softmax":
            h = torch.softmax(h, dim=-1)
        elif t == "attention":
            T = m["seq"]
            C = w // T
            wqkv = take(3 * C * C, (3 * C, C))
            bqkv = take(3 * C)
            wo = take(C * C, (C, C))
            bo = take(C)
            s = h.reshape(B, T, C).transpose(0, 1)  # (T, B, C)
            o, _ = F.multi_head_attention_forward(
                s, s, s, C, 1, wqkv, bqkv, None, None, False, 0.0, wo, bo,
                training=True, need_weights=False)
            h = o.transpose(0, 1).reshape(B, T * C)
        else:
            raise SystemExit("unknown module type " + t)
    if revin is not None and revin[5]:
        mean, std, g, b, eps, _ = revin
        if g is not None:
            h = (h - b) / (g + eps * eps)
        h = h * std + mean
    if cfg["loss"] == "mse":
        y = torch.tensor(inp["y"], dtype=torch.float32).reshape(h.shape)
        loss = ((h - y) ** 2).mean()
    else:
        lab = torch.tensor(inp["labels"], dtype=torch.long)
        loss = -torch.log(h[torch.arange(B), lab]).mean()
    loss = loss * cfg["loss_weight"]
    loss.backward()
    assert off == P.numel(), (off, P.numel())
    grads = torch.cat([l.grad.reshape(-1) for l in leaves]) if leaves else torch.zeros(0)
    json.dump({"loss": float(loss), "grads": [float(v) for v in grads]},
              open(sys.argv[2], "w"))


if __name__ == "__main__":
    main()
