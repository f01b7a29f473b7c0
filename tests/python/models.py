"""Small models and data for the tracer tests: Linear + BatchNorm + a
RevIN-like module + softmax, with overflows planted on request."""
import torch
import torch.nn as nn

import ampprobe.torch as at


class RevINLike(nn.Module):
    """Per-series normalisation; the variance is a saved intermediate."""

    def __init__(self):
        super().__init__()
        self.gamma = nn.Parameter(torch.ones(1))
        self.beta = nn.Parameter(torch.zeros(1))

    def forward(self, x):
        mean = at.materialized(self, x.mean(dim=1, keepdim=True))
        var = at.saved(self, ((x - mean) ** 2).mean(dim=1, keepdim=True))
        return (x - mean) / torch.sqrt(var + 1e-5) * self.gamma + self.beta


class Net(nn.Module):
    def __init__(self, t=16, h=12, c=4):
        super().__init__()
        self.revin = RevINLike()
        self.fc1 = nn.Linear(t, h)
        self.bn = nn.BatchNorm1d(h)
        self.act = nn.ReLU()
        self.head = nn.Linear(h, c)
        self.sm = nn.Softmax(dim=-1)

    def forward(self, x):
        return self.sm(self.head(self.act(self.bn(self.fc1(self.revin(x))))))


class ProbNLL(nn.Module):
    def forward(self, p, y):
        return -torch.log(p.gather(1, y[:, None])).mean()


def data(step, level=0.0, spread=1.0, b=16, t=16, c=4, nan=False):
    g = torch.Generator().manual_seed(1000 + step)
    x = level + spread * torch.randn(b, t, generator=g)
    if nan:
        x[3, 5] = float("nan")
    y = torch.randint(0, c, (b,), generator=g)
    return x, y


def train(tracer, model, loss_fn, steps, scaler=None, make=None, lr=1e-3,
          max_norm=1.0, autocast=True):
    """A GradScaler-style loop; make(step) -> (x, y)."""
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    scaler = scaler or at.LossScaler(init_scale=1.0)
    tracer.attach_scaler(scaler)
    losses = []
    for step in range(steps):
        x, y = make(step)
        ctx = tracer.autocast() if autocast else at.contextlib.nullcontext()
        with ctx:
            loss = loss_fn(model(x), y)
        opt.zero_grad()
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        n = nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        scaler.step(opt)
        scaler.update()
        tracer.end_step(loss=loss, optimizer=opt, grad_norm=n,
                        max_norm=max_norm)
        losses.append(float(loss))
    return losses


def big_weights(model):
    """The Net's first Linear over-scaled: its FP16 output overflows."""
    with torch.no_grad():
        model.fc1.weight.mul_(1e5)


# Planted FP16 overflows of the Net under emulation: case -> (data maker,
# model tweak, expected origin (layer, kind, site, phase))
PLANTED = {
    # large-magnitude series: RevIN's FP16 variance overflows (saved)
    "revin": (lambda s: data(s, level=3000.0, spread=500.0), None,
              ("revin", "revin", "fwd_saved", "forward")),
    # over-scaled first linear layer: its FP16 output overflows
    "linear": (data, big_weights, ("fc1", "linear", "fwd_out", "forward")),
    # a NaN in the input batch of step 0
    "nan-input": (lambda s: data(s, nan=True), None,
                  ("input", "input", "fwd_out", "forward")),
}
