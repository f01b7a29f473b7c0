"""Where the post-mortem places the cause on small PyTorch jobs (hunt
/tmp/hunt_diag2, 2026-12-04): a NaN the optimizer step writes into the
weights (Adam eps=0, a custom loss Function's NaN gradient applied by the
update) was said to come "from the initialisation or the checkpoint"; two
optimizers with one loss scaler marked every step skipped when one of
them stepped; raw input data beyond 65504 was "made between modules".
Each test failed before its fix."""
import pytest

torch = pytest.importorskip("torch")
import torch.nn as nn  # noqa: E402

import ampprobe  # noqa: E402
import ampprobe.torch as at  # noqa: E402

torch.set_num_threads(1)


def findings(pm):
    return pm.get("diagnosis") or []


def texts(pm):
    out = []
    for f in findings(pm):
        out += [f.get("title", ""), f.get("next_step", "")] + f.get("evidence", [])
    return " | ".join(out)


def run(model, path, steps, make, opt, precision, loss_fn=None, scaler=None):
    kw = dict(precision="fp32") if precision == "fp32" else dict(emulate_fp16=True)
    tr = at.Tracer(model, path, env=False, **kw)
    sc = scaler if scaler is not None else at.LossScaler(
        enabled=precision != "fp32")
    tr.attach_scaler(sc)
    lf = loss_fn or nn.CrossEntropyLoss()
    for s in range(steps):
        x, y = make(s)
        opt.zero_grad()
        with tr.autocast():
            loss = lf(model(x), y)
        sc.scale(loss).backward()
        sc.step(opt)
        sc.update()
        tr.end_step(loss=loss, optimizer=opt)
    tr.close()
    return ampprobe.postmortem(path)


# ---- a NaN born in the optimizer step -----------------------------------------

class Bag(nn.Module):
    def __init__(self, vocab=30):
        super().__init__()
        self.emb = nn.Embedding(vocab, 8)
        self.fc = nn.Linear(8, 3)

    def forward(self, x):
        return self.fc(self.emb(x).mean(1))


def tokens(hi, late=None):
    def make(s):
        g = torch.Generator().manual_seed(s)
        top = hi if late is None or s < late else 30
        return (torch.randint(0, top, (4, 5), generator=g),
                torch.randint(0, 3, (4,), generator=g))
    return make


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("opt_name", ["Adam", "AdamW", "RMSprop"])
def test_eps0_nan_is_born_in_the_update(tmp_path, precision, opt_name):
    """An optimizer with eps=0 divides 0 by 0 for the embedding rows the
    batch does not use (a dense zero gradient): the update of step 0 writes
    NaN into finite weights. Not 'before any update ... checkpoint'."""
    torch.manual_seed(0)
    m = Bag()
    opt = getattr(torch.optim, opt_name)(m.parameters(), lr=1e-3, eps=0.0)
    pm = run(m, str(tmp_path / "t.h5"), 4, tokens(10, late=2), opt, precision)
    ev = pm["event"]
    assert (ev["kind"], ev["step"], ev["origin_layer"], ev["origin_site"]) == \
        ("weight-nonfinite", 0, "emb", "master_weight"), ev
    f = findings(pm)[0]
    assert f["id"] == "check-weights"
    assert "optimizer step of step 0 made the weights of 'emb'" in f["title"], f
    assert "eps of 0" in f["next_step"]
    assert "checkpoint or initialisation" not in texts(pm)
    assert "before any update" not in texts(pm)


def test_eps0_nan_at_a_later_step(tmp_path):
    """The same at step 2 (the rows the batch skips appear only then): the
    step number does not decide it."""
    torch.manual_seed(0)
    m = Bag()
    with torch.no_grad():
        pass
    opt = torch.optim.Adam(m.parameters(), lr=1e-3, eps=1e-8)
    make = tokens(10, late=4)
    p = str(tmp_path / "late.h5")
    tr = at.Tracer(m, p, precision="fp32", env=False)
    for s in range(5):
        if s == 2:
            opt.param_groups[0]["eps"] = 0.0
        x, y = make(s)
        opt.zero_grad()
        loss = nn.functional.cross_entropy(m(x), y)
        loss.backward()
        opt.step()
        tr.end_step(loss=loss, optimizer=opt)
    tr.close()
    pm = ampprobe.postmortem(p)
    ev = pm["event"]
    assert (ev["kind"], ev["step"], ev["origin_site"]) == \
        ("weight-nonfinite", 2, "master_weight"), ev
    assert "optimizer step of step 2" in findings(pm)[0]["title"]


class NanGrad(torch.autograd.Function):
    """A cross-entropy on probabilities whose hand-written backward is
    -1/p_y: NaN where p_y is exactly 0 (0 * inf in the chain)."""

    @staticmethod
    def forward(ctx, p, y):
        ctx.save_for_backward(p, y)
        py = p.gather(1, y[:, None]).clamp_min(1e-30)
        return -py.log().mean()

    @staticmethod
    def backward(ctx, g):
        p, y = ctx.saved_tensors
        grad = torch.zeros_like(p)
        py = p.gather(1, y[:, None])
        grad.scatter_(1, y[:, None], -1.0 / py * 0.0 / py.clamp_max(0.0))
        return g * grad / p.shape[0], None


class Probs(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(6, 8)
        self.head = nn.Linear(8, 3)

    def forward(self, x):
        return torch.softmax(self.head(torch.relu(self.fc1(x))), -1)


@pytest.mark.parametrize("bad_step", [0, 2])
def test_nan_gradient_of_a_loss_function_is_the_origin(tmp_path, bad_step):
    """A custom loss Function whose backward is NaN (FP32, no scaler): the
    first non-finite record is head's grad_out in the backward, which
    on_nonfinite='raise' names; the update then writes it into the
    weights. The post-mortem names that gradient, not the master weights,
    and says no checkpoint."""
    torch.manual_seed(0)
    m = Probs()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    p = str(tmp_path / "g.h5")
    tr = at.Tracer(m, p, precision="fp32", env=False)
    for s in range(bad_step + 3):
        g = torch.Generator().manual_seed(s)
        x, y = torch.randn(4, 6, generator=g), torch.randint(0, 3, (4,), generator=g)
        opt.zero_grad()
        out = m(x)
        loss = (NanGrad.apply(out, y) if s == bad_step
                else nn.functional.nll_loss(out.clamp_min(1e-30).log(), y))
        loss.backward()
        opt.step()
        tr.end_step(loss=loss, optimizer=opt)
    tr.close()
    pm = ampprobe.postmortem(p)
    ev = pm["event"]
    assert (ev["step"], ev["phase"], ev["origin_layer"], ev["origin_site"]) == \
        (bad_step, "backward", "head", "grad_out"), ev
    assert "optimizer update applied it" in ev["evidence"]
    f = findings(pm)[0]
    assert f["id"] == "not-precision", f
    assert "received inf/NaN at its grad_out from code no record covers" in f["title"]
    assert "checkpoint" not in texts(pm)
    assert pm["verdict"] == "diverged"


# ---- two optimizers, one loss scaler --------------------------------------------

class Main(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Linear(8, 8)
        self.head = nn.Linear(8, 3)
        self.aux = nn.Linear(8, 1)

    def forward(self, x):
        h = torch.relu(self.body(x))
        return self.head(h), self.aux(h.detach())


def two_opt_job(path, make_scaler, aux_bad, steps=12, pass_opt=True):
    torch.manual_seed(0)
    m = Main()
    o1 = torch.optim.SGD(list(m.body.parameters()) + list(m.head.parameters()), 0.1)
    o2 = torch.optim.SGD(m.aux.parameters(), 0.1)
    sc = make_scaler()
    tr = at.Tracer(m, path, emulate_fp16=True, env=False)
    tr.attach_scaler(sc)
    losses = []
    w0 = m.body.weight.detach().clone()
    for s in range(steps):
        g = torch.Generator().manual_seed(s % 3)
        x, y = torch.randn(16, 8, generator=g), torch.randint(0, 3, (16,), generator=g)
        o1.zero_grad()
        o2.zero_grad()
        with tr.autocast():
            p1, p2 = m(x)
            main = nn.functional.cross_entropy(p1, y)
            aux = p2.square().mean()
        sc.scale(main + aux).backward()
        if aux_bad(s):
            with torch.no_grad():
                m.aux.weight.grad[0, 0] = float("nan")
        sc.step(o1)
        sc.step(o2)
        sc.update()
        tr.end_step(loss=main, optimizer=o1 if pass_opt else None)
        losses.append(float(main))
    tr.close()
    moved = float((m.body.weight.detach() - w0).abs().sum())
    return losses, moved


def steps_table(path):
    st = ampprobe.read_trace(path)["steps"]
    return [int(v) for v in st["skipped"]], [int(v) for v in st["found_inf"]]


@pytest.mark.parametrize("pass_opt", [True, False])
def test_one_optimizer_skipping_is_not_a_skipped_step(tmp_path, pass_opt):
    """The aux optimizer skips every step (NaN gradients); the main one
    steps: the body's weights change and its loss falls. Steps are
    found_inf but not skipped; the post-mortem never says the weights did
    not change."""
    p = str(tmp_path / "two.h5")
    losses, moved = two_opt_job(p, lambda: at.LossScaler(init_scale=2.0 ** 10),
                                lambda s: True, pass_opt=pass_opt)
    assert moved > 0 and sum(losses[-3:]) < sum(losses[:3]), losses
    skipped, found = steps_table(p)
    assert found == [1] * 12 and skipped == [0] * 12, (skipped, found)
    pm = ampprobe.postmortem(p)
    assert "weights never changed" not in texts(pm)
    assert "no optimizer step was taken" not in texts(pm)


def test_every_optimizer_skipping_is_a_skipped_step(tmp_path):
    """Control: when both optimizers skip (NaN in both), the step is
    skipped; when neither does, it is clean."""
    p = str(tmp_path / "both.h5")
    torch.manual_seed(0)
    m = Main()
    o1 = torch.optim.SGD(list(m.body.parameters()) + list(m.head.parameters()), 0.1)
    o2 = torch.optim.SGD(m.aux.parameters(), 0.1)
    sc = at.LossScaler(init_scale=2.0 ** 10)
    tr = at.Tracer(m, p, emulate_fp16=True, env=False)
    tr.attach_scaler(sc)
    for s in range(4):
        x, y = torch.randn(16, 8), torch.randint(0, 3, (16,))
        o1.zero_grad()
        o2.zero_grad()
        p1, p2 = m(x)
        sc.scale(nn.functional.cross_entropy(p1, y) + p2.square().mean()).backward()
        if s in (1, 2):
            with torch.no_grad():
                m.aux.weight.grad[0, 0] = float("inf")
                if s == 1:
                    m.head.weight.grad[0, 0] = float("nan")
        sc.step(o1)
        sc.step(o2)
        sc.update()
        tr.end_step(loss=1.0)
    tr.close()
    skipped, found = steps_table(p)
    assert skipped == [0, 1, 0, 0] and found == [0, 1, 1, 0], (skipped, found)


def test_gradscaler_skips_are_read(tmp_path):
    """torch's GradScaler keeps found_inf per optimizer until update();
    the tracer reads it there (its update wrapped): the same table as
    at.LossScaler. Where GradScaler cannot run on the CPU (torch 1.13), its
    reading is checked on the states GradScaler keeps."""
    amp = getattr(torch, "amp", None)
    try:
        make = lambda: amp.GradScaler("cpu", init_scale=2.0 ** 10)  # noqa: E731
        make()
    except (AttributeError, TypeError, RuntimeError):
        make = None
    if make is not None:
        p = str(tmp_path / "gs.h5")
        two_opt_job(p, make, lambda s: s % 2 == 0, steps=6)
        assert steps_table(p) == ([0] * 6, [1, 0, 1, 0, 1, 0])
        return
    # torch 1.13: the states as GradScaler.step leaves them
    from torch.cuda.amp.grad_scaler import OptState
    sc = torch.cuda.amp.GradScaler(enabled=False)
    sc._per_optimizer_states = {
        1: {"stage": OptState.STEPPED, "found_inf_per_device": {"cpu": torch.tensor(1.0)}},
        2: {"stage": OptState.STEPPED, "found_inf_per_device": {"cpu": torch.tensor(0.0)}},
        3: {"stage": OptState.READY, "found_inf_per_device": {}},
    }
    assert at._gradscaler_skips(sc) == [True, False]
    at._watch_steps(sc)
    sc.update()  # disabled: returns; the states were read before it
    assert sc._ampprobe_skips == (1, [True, False])


# ---- raw input beyond FP16 --------------------------------------------------------

def test_raw_input_beyond_fp16_is_named_as_the_data(tmp_path):
    """One raw feature ~1e5 (a byte count): the input data holds the values
    beyond 65504, so the advice is to scale the data - not 'code between
    modules'."""
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    opt = torch.optim.SGD(m.parameters(), lr=1e-3)

    def make(s):
        g = torch.Generator().manual_seed(s)
        x = torch.randn(8, 4, generator=g)
        x[:, 0] = 1.0e5 + 100 * torch.rand(8, generator=g)
        return x, torch.randint(0, 3, (8,), generator=g)
    pm = run(m, str(tmp_path / "raw.h5"), 3, make, opt, "fp16")
    ev = pm["event"]
    assert ev["kind"] == "overflow" and ev["origin_layer"] == "0", ev
    assert "input data holds values beyond FP16's range" in ev["evidence"], ev
    assert "between modules" not in ev["evidence"]
    assert "normalise or scale the input data" in findings(pm)[0]["next_step"]


# ---- a module called with several inputs ------------------------------------------

class TwoIn(nn.Module):
    """pre -> a two-input module (GRUCell(x, h), or a cross-attention
    MultiheadAttention(q, mem, mem)) -> out. At step `bad` the tensor in
    argument `big` (0: x / the query, 1: h / the memory) is multiplied by
    1e6 between modules: beyond FP16's range when it arrives."""

    def __init__(self, block, big):
        super().__init__()
        self.block, self.big, self.bad = block, big, False
        self.pre = nn.Linear(8, 16)
        self.mem = nn.Linear(8, 16)
        if block == "gru":
            self.cell = nn.GRUCell(16, 16)
        else:
            self.cell = nn.MultiheadAttention(16, 2, batch_first=True)
        self.out = nn.Linear(16, 3)

    def forward(self, x):
        a = [self.pre(x), torch.tanh(self.mem(x))]
        if self.bad:
            a[self.big] = a[self.big] * 1e6
        if self.block == "gru":
            z = self.cell(a[0], a[1])
        else:
            z = self.cell(a[0], a[1], a[1], need_weights=False)[0]
        return self.out(z).reshape(-1, 3)


def _mha_inf_query_is_nan():
    """Whether this torch's MultiheadAttention (training mode, grad on, as
    the test runs it) makes NaN of a query of inf. torch 1.13's does; 2.15's
    safe softmax makes the attention's output zeros, with no inf or NaN,
    so the emulated FP16 run below holds no non-finite value at all."""
    a = nn.MultiheadAttention(4, 1, batch_first=True)
    q = torch.full((1, 2, 4), float("inf"))
    kv = torch.randn(1, 2, 4)
    return bool(a(q, kv, kv, need_weights=False)[0].isnan().any())


@pytest.mark.parametrize("block,big", [
    ("gru", 0), ("gru", 1), ("mha", 1),
    # the query rounded to inf gives zeros, not NaN, where the safe softmax
    # is: no event, and the post-mortem says healthy although the query's
    # record shows values beyond FP16's range (open: a silent overflow the
    # rules do not flag yet). Strict: it fails loudly once they do.
    pytest.param("mha", 0, marks=pytest.mark.xfail(
        not _mha_inf_query_is_nan(), strict=True,
        reason="this torch's attention turns an inf query into zeros "
               "(safe softmax): no non-finite value, the overflowed "
               "query is not flagged yet")),
])
def test_overflowing_input_of_a_multi_input_module(tmp_path, block, big):
    """GRUCell(big, h) and MHA(big_q, mem, mem) under FP16 emulation: the
    first input arrives beyond FP16's range. The post-mortem read only the
    call's last input and said 'input finite ... its op made the NaN
    itself' (weak force-fp32), or, for the attention, 'not a precision
    problem'. Now, wherever the big input is: an overflow made upstream,
    naming that input. big=1 (the old code was right) is the control."""
    torch.manual_seed(0)
    m = TwoIn(block, big)
    opt = torch.optim.SGD(m.parameters(), lr=1e-3)

    def make(s):
        m.bad = s == 2
        g = torch.Generator().manual_seed(s)
        shape = (4, 8) if block == "gru" else (2, 5, 8)
        n = 4 if block == "gru" else 10
        return torch.randn(*shape, generator=g), torch.randint(0, 3, (n,), generator=g)
    pm = run(m, str(tmp_path / "two.h5"), 4, make, opt, "fp16")
    ev = pm["event"]
    assert ev["origin_layer"] == "cell" and ev["step"] == 2, ev
    assert ev["kind"] == "overflow", ev
    # the call's inputs in argument order: GRUCell(x, h); MHA(q, k, v)
    n_in = 2 if block == "gru" else 3
    assert ev["origin_inputs"] == n_in, ev
    assert ev["origin_input_index"] == big + 1, ev
    assert ev["origin_input"]["absmax"] > 65504, ev
    # made between modules (x 1e6): no module handed it over; the last
    # output before the call fed the other input
    assert ev["fed_by"] is None, ev
    assert ("its input %d of %d was already beyond FP16's range" % (big + 1, n_in)
            in ev["evidence"]), ev
    f = findings(pm)[0]
    assert f["id"] == "force-fp32" and not f.get("weak_evidence"), f
    assert all(g["id"] != "not-precision" for g in findings(pm)), texts(pm)
    assert "its op made the NaN itself" not in texts(pm)
