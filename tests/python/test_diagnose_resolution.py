"""Data below FP16's resolution (docs/precision.md, "Data below
resolution"): eight raw features at level 3000 carry their signal in a
variation of std 0.3; FP16's spacing at 3000 is 2, so the first Linear's
rounded input is 3000.0 everywhere and the BatchNorm after it normalises
constants. The post-mortem names the data and the first FP16 layer
(data-resolution) above bn's collapse, whose candidates then hold linear
with bn (bisect's minimal set; bn alone changes nothing). The hunt's
/tmp/hunt_diag2 finding 5 (d08), smaller.

FP16 is emulated (emulate_fp16=True) with ampprobe's LossScaler, as in
test_torch.py.
"""
import pytest

torch = pytest.importorskip("torch")
import torch.nn as nn  # noqa: E402

import ampprobe  # noqa: E402
import ampprobe.torch as at  # noqa: E402

torch.set_num_threads(1)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 32)
        self.bn = nn.BatchNorm1d(32)
        self.act = nn.ReLU()
        self.head = nn.Linear(32, 2)

    def forward(self, x):
        return self.head(self.act(self.bn(self.fc1(x))))


def run(tmp_path, level, std, steps=30, **prec):
    torch.manual_seed(0)
    model = Net()
    crit = nn.CrossEntropyLoss()
    path = str(tmp_path / "t.h5")
    tr = at.Tracer(model, path, loss_fn=crit, **prec)
    scaler = at.LossScaler(enabled=bool(prec.get("emulate_fp16")))
    tr.attach_scaler(scaler)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for step in range(steps):
        g = torch.Generator().manual_seed(step)
        z = torch.randn(64, 8, generator=g)
        x, y = level + std * z, (z[:, 0] + z[:, 1] > 0).long()
        opt.zero_grad()
        with tr.autocast():
            loss = crit(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        tr.end_step(loss=loss, optimizer=opt)
    tr.close()
    return ampprobe.postmortem(path)


def ids(pm):
    return [f["id"] for f in pm["diagnosis"]]


def test_input_below_fp16_resolution_names_the_data_and_fc1(tmp_path):
    pm = run(tmp_path, 3000.0, 0.3, emulate_fp16=True)
    first = pm["diagnosis"][0]
    assert first["id"] == "data-resolution", ids(pm)
    assert "input's variation" in first["title"] and "'fc1'" in first["title"]
    assert "spacing there (2)" in first["title"], first["title"]
    assert "keep 'fc1' in FP32" in first["next_step"]
    assert pm["fp32_candidates"] == "linear,bn"
    assert pm["verdict"] == "degraded"
    # bn's collapse is still said, below it, and not with bn alone
    rest = [f for f in pm["diagnosis"][1:] if f["id"] == "force-fp32"]
    assert rest and "'bn'" in rest[0]["title"], ids(pm)
    assert "--fp32-candidates linear,bn" in rest[0]["next_step"]


@pytest.mark.parametrize("level,std,prec", [
    (3000.0, 0.3, {"precision": "fp32"}),    # the same data in FP32
    (3000.0, 30.0, {"emulate_fp16": True}),  # spread far above the spacing
    (0.0, 0.3, {"emulate_fp16": True}),      # centred
])
def test_resolvable_data_is_not_blamed(tmp_path, level, std, prec):
    pm = run(tmp_path, level, std, **prec)
    assert "data-resolution" not in ids(pm), pm["diagnosis"]
