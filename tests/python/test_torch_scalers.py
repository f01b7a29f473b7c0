"""Several loss scalers (a GAN with one scaler per network: G's and D's)
and several param groups (a head's lr schedule apart from the backbone's).

attach_scaler took one scaler, a second call replaced the first: a step
where only D's scaler backed off (its routine) was recorded skipped with
D's scale while G stepped, or, with only G's attached, on_nonfinite="raise"
killed a healthy job. Now every attached scaler is read: found_inf when
any found inf, skipped only when every one skipped each of its optimizers,
the first attached one's scale in the steps table, every backoff a scaler
event, and a gradient overflow any of them found is the routine. The lr
recorded was param_groups[0]'s only: a x1000 spike in a second group went
unseen and the post-mortem said "lower the learning rate" instead of
naming the schedule at the spike's step. Now it is the largest of every
group (of every optimizer passed)."""
import math
import warnings

import pytest

torch = pytest.importorskip("torch")
import torch.nn as nn  # noqa: E402

import ampprobe  # noqa: E402
import ampprobe.torch as at  # noqa: E402

STEPS = 6
BAD = 3  # the step whose gradients overflow


def _gradscaler_cpu():
    """torch.amp.GradScaler("cpu") (torch >= 2.3), or None."""
    amp = getattr(torch, "amp", None)
    try:
        amp.GradScaler("cpu", init_scale=256.0)
    except (AttributeError, TypeError, RuntimeError):
        return None
    return lambda: amp.GradScaler("cpu", init_scale=256.0)


class GAN(nn.Module):
    def __init__(self):
        super().__init__()
        self.G = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 8))
        self.D = nn.Sequential(nn.Linear(8, 16), nn.LeakyReLU(0.2),
                               nn.Linear(16, 1))


def gan_job(path, attach="GD", d_over=(), g_over=(), onf="raise",
            torch_scaler=False, g_unchecked=(), d_input=(), pass_d=False):
    """A GAN with one scaler per network (at.LossScaler under FP16
    emulation, or torch.amp.GradScaler("cpu") under real FP16 autocast):
    at the steps in d_over D's loss is x1e7 (D's gradients overflow, its
    scaler backs off and skips D's step), at those in g_over G's; in
    g_unchecked G's gradient gets a NaN and G steps by hand past its
    scaler (unscale_ then opt.step: not routine); in d_input D's real
    input is x1e6 (D's forward overflows FP16). attach: the scalers
    attached, in order; pass_d: D's passed as end_step(scaler=) at every
    step instead. Returns (tracer's error or None, steps table,
    scaler events, G stepped per step, D stepped per step, warnings)."""
    torch.manual_seed(0)
    m = GAN()
    G, D = m.G, m.D
    bce = nn.BCEWithLogitsLoss()
    oG = torch.optim.Adam(G.parameters(), 1e-3)
    oD = torch.optim.Adam(D.parameters(), 1e-3)
    if torch_scaler:
        make = _gradscaler_cpu()
        tr = at.Tracer(m, path, loss_fn=bce, overwrite=True, env=False,
                       precision="fp16", on_nonfinite=onf)
    else:
        make = lambda: at.LossScaler(init_scale=256.0)  # noqa: E731
        tr = at.Tracer(m, path, loss_fn=bce, overwrite=True, env=False,
                       emulate_fp16=True, precision="fp16", on_nonfinite=onf)
    sG, sD = make(), make()
    for c in attach:
        tr.attach_scaler({"G": sG, "D": sD}[c])
    g_moved, d_moved, err = [], [], None
    with warnings.catch_warnings(record=True) as W:
        warnings.simplefilter("always")
        try:
            for s in range(STEPS):
                real = torch.randn(8, 8) * (1e6 if s in d_input else 1.0)
                z = torch.randn(8, 4)
                with tr.autocast():
                    fake = G(z)
                oD.zero_grad()
                with tr.autocast():
                    ld = (bce(D(real), torch.ones(8, 1)) +
                          bce(D(fake.detach()), torch.zeros(8, 1)))
                d0 = D[0].weight.detach().clone()
                sD.scale(ld * (1e7 if s in d_over else 1.0)).backward()
                sD.step(oD)
                sD.update()
                d_moved.append(bool((D[0].weight != d0).any()))
                oG.zero_grad()
                with tr.autocast():
                    lg = bce(D(fake), torch.ones(8, 1))
                g0 = G[0].weight.detach().clone()
                sG.scale(lg * (1e7 if s in g_over else 1.0)).backward()
                if s in g_unchecked:
                    with torch.no_grad():
                        G[0].weight.grad[0, 0] = float("nan")
                    sG.unscale_(oG)
                    oG.step()  # past the scaler: steps with the NaN
                else:
                    sG.step(oG)
                sG.update()
                g_moved.append(bool((G[0].weight != g0).any()))
                tr.end_step(loss=lg, optimizer=oG,
                            scaler=sD if pass_d else None)
            tr.close()
        except at.NonFiniteError as e:
            err = e
    t = ampprobe.read_trace(path)
    return err, t["steps"], t["scaler_events"], g_moved, d_moved, W


def col(st, name, kind=int):
    return [kind(v) for v in st[name]]


def nonfinite_warnings(W):
    return [str(w.message) for w in W
            if issubclass(w.category, at.NonFiniteWarning)]


def flags(n, at_steps):
    return [1 if s in at_steps else 0 for s in range(n)]


# ---- two scalers -----------------------------------------------------------

JOBS = [pytest.param(False, id="losscaler-emulated")]
if _gradscaler_cpu() is not None:
    JOBS.append(pytest.param(True, id="gradscaler-cpu"))
else:
    JOBS.append(pytest.param(True, id="gradscaler-cpu", marks=pytest.mark.skip(
        reason="torch.amp.GradScaler('cpu') needs torch >= 2.3 "
               "(torch %s)" % torch.__version__)))


@pytest.mark.parametrize("torch_scaler", JOBS)
def test_only_ds_scaler_backs_off(tmp_path, torch_scaler):
    """D's gradients overflow once: D's scaler backs off and skips D's
    step, G steps. Not a skipped step (G's weights changed), found_inf,
    the scale column is G's (the primary, attached first), D's backoff is
    the one scaler event; raise stays quiet (D's routine). Before: D's
    scaler replaced G's, the step was recorded skipped with D's scale."""
    err, st, ev, g_moved, d_moved, W = gan_job(str(tmp_path / "d.h5"),
                                               d_over={BAD},
                                               torch_scaler=torch_scaler)
    assert err is None, str(err)
    assert g_moved == [True] * STEPS and not d_moved[BAD], (g_moved, d_moved)
    assert col(st, "skipped") == [0] * STEPS
    assert col(st, "found_inf") == flags(STEPS, {BAD})
    assert col(st, "loss_scale", float) == [256.0] * STEPS  # G's
    assert col(ev, "step") == [BAD] and col(ev, "kind") == [0]
    assert (float(ev["old_scale"][0]), float(ev["new_scale"][0])) == (256.0, 128.0)
    pm = ampprobe.postmortem(str(tmp_path / "d.h5"))
    assert pm["verdict"] == "healthy", pm["verdict"]
    assert pm["scaler"]["backoffs"] == 1 and pm["scaler"]["skipped_steps"] == 0


@pytest.mark.parametrize("torch_scaler", JOBS)
def test_only_gs_scaler_backs_off(tmp_path, torch_scaler):
    """G's gradients overflow once, with D's scaler attached too: the
    routine of G's scaler, not an error (before: only D's, attached last,
    was read, and raise killed the job). D stepped: not skipped; G's
    scale (the primary's) halves from the next step."""
    err, st, ev, g_moved, d_moved, W = gan_job(str(tmp_path / "g.h5"),
                                               g_over={BAD},
                                               torch_scaler=torch_scaler)
    assert err is None, str(err)
    assert d_moved == [True] * STEPS and not g_moved[BAD]
    assert col(st, "skipped") == [0] * STEPS
    assert col(st, "found_inf") == flags(STEPS, {BAD})
    assert col(st, "loss_scale", float) == [256.0] * (BAD + 1) + [128.0] * (
        STEPS - BAD - 1)
    assert col(ev, "step") == [BAD] and col(ev, "kind") == [0]


def test_both_scalers_back_off(tmp_path):
    """Both networks' gradients overflow in one step: neither stepped, so
    the step is skipped; both backoffs are scaler events, the primary's
    first."""
    err, st, ev, g_moved, d_moved, W = gan_job(str(tmp_path / "b.h5"),
                                               d_over={BAD}, g_over={BAD},
                                               attach="DG")
    assert err is None, str(err)
    assert not g_moved[BAD] and not d_moved[BAD]
    assert col(st, "skipped") == flags(STEPS, {BAD})
    assert col(st, "found_inf") == flags(STEPS, {BAD})
    assert col(ev, "step") == [BAD, BAD] and col(ev, "kind") == [0, 0]
    pm = ampprobe.postmortem(str(tmp_path / "b.h5"))
    assert pm["verdict"] == "healthy", pm["verdict"]
    assert pm["scaler"]["backoffs"] == 2 and pm["scaler"]["skipped_steps"] == 1


def test_healthy_gan_with_two_scalers(tmp_path):
    """No overflow: nothing found, nothing skipped, no event, healthy."""
    err, st, ev, g_moved, d_moved, W = gan_job(str(tmp_path / "h.h5"))
    assert err is None and not nonfinite_warnings(W)
    assert col(st, "skipped") == [0] * STEPS
    assert col(st, "found_inf") == [0] * STEPS
    assert col(st, "loss_scale", float) == [256.0] * STEPS
    assert len(ev) == 0
    assert ampprobe.postmortem(str(tmp_path / "h.h5"))["verdict"] == "healthy"


def test_attach_order_picks_the_primary(tmp_path):
    """The first attached scaler is the primary: D attached first, the
    scale column follows D's backoff (before: the last attached, G's, was
    the only one read). Attaching a scaler again adds nothing: one
    backoff event, not two."""
    p = str(tmp_path / "o.h5")
    err, st, ev, g_moved, d_moved, W = gan_job(p, attach="DGD", d_over={BAD})
    assert err is None, str(err)
    assert col(st, "loss_scale", float) == [256.0] * (BAD + 1) + [128.0] * (
        STEPS - BAD - 1)
    assert col(st, "skipped") == [0] * STEPS
    assert col(ev, "step") == [BAD]


@pytest.mark.parametrize("first_disabled", [False, True])
def test_a_scaler_no_longer_used_is_passed_over(tmp_path, first_disabled):
    """A job that makes a new scaler (a resume) and attaches it too: the
    first one, attached and no longer updated (or disabled), is not the
    primary: the scale column follows the one in use, whose backoff is
    the step's (found_inf, skipped: its only optimizer skipped)."""
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    opt = torch.optim.SGD(m.parameters(), 0.01)
    p = str(tmp_path / "resume.h5")
    tr = at.Tracer(m, p, overwrite=True, env=False, emulate_fp16=True,
                   on_nonfinite="raise")
    old = at.LossScaler(init_scale=256.0, enabled=not first_disabled)
    tr.attach_scaler(old)
    for s in range(6):
        if s == 3:
            sc = at.LossScaler(init_scale=1024.0)
            tr.attach_scaler(sc)
        elif s == 0:
            sc = old
        loss = m(torch.randn(4, 4)).square().mean()
        opt.zero_grad()
        sc.scale(loss * (1e7 if s == 4 else 1.0)).backward()
        sc.step(opt)
        sc.update()
        tr.end_step(loss=loss, optimizer=opt)
    tr.close()
    st = ampprobe.read_trace(p)["steps"]
    first = 1.0 if first_disabled else 256.0
    assert col(st, "loss_scale", float) == [first] * 3 + [1024.0] * 2 + [512.0]
    assert col(st, "skipped") == flags(6, {4})
    assert col(st, "found_inf") == flags(6, {4})


def test_end_step_scaler_adds_a_scaler(tmp_path):
    """G's attached, D's passed to end_step(scaler=) at every step: D's
    is added once (from the step after the first, whose start scale was
    not known), read as if attached: its backoff is an event, the step
    found_inf and not skipped, no error."""
    err, st, ev, g_moved, d_moved, W = gan_job(str(tmp_path / "e.h5"),
                                               attach="G", d_over={BAD},
                                               pass_d=True)
    assert err is None, str(err)
    assert col(st, "skipped") == [0] * STEPS
    assert col(st, "found_inf") == flags(STEPS, {BAD})
    assert col(st, "loss_scale", float) == [256.0] * STEPS
    assert col(ev, "step") == [BAD]


def test_warn_mode_says_nothing_of_the_routine(tmp_path):
    """warn, G's scaler backing off with both attached, D's last: no
    NonFiniteWarning (before: a false one, from D's scaler, the only one
    read, which had not skipped)."""
    err, st, ev, g_moved, d_moved, W = gan_job(str(tmp_path / "w.h5"),
                                               g_over={BAD}, onf="warn")
    assert err is None and not nonfinite_warnings(W), nonfinite_warnings(W)


def test_an_unattached_scalers_backoff_is_said_with_the_fix(tmp_path):
    """Only G's scaler attached: D's backoff cannot be seen, raise still
    stops (the tracer cannot tell it from a real gradient overflow) but
    its message says to attach every scaler."""
    err, st, ev, g_moved, d_moved, W = gan_job(str(tmp_path / "u.h5"),
                                               attach="G", d_over={BAD})
    assert err is not None and err.step == BAD and err.phase == "backward"
    assert "attach_scaler" in str(err), str(err)


def test_a_weight_made_nonfinite_is_not_routine(tmp_path):
    """D's scaler backs off (routine) in the step where G steps past its
    scaler with a NaN gradient (unscale_ + opt.step: G's weights NaN): an
    error at that step, in the backward phase, not one step late."""
    err, st, ev, g_moved, d_moved, W = gan_job(
        str(tmp_path / "n.h5"), d_over={BAD}, g_unchecked={BAD})
    assert err is not None, "not raised"
    assert err.step == BAD and err.phase == "backward", str(err)


def test_a_forward_overflow_in_d_is_still_reported(tmp_path):
    """D's input beyond FP16 makes D's forward inf: whatever the scalers
    did with the gradients after it, a forward fault is an error at that
    step."""
    err, st, ev, g_moved, d_moved, W = gan_job(str(tmp_path / "f.h5"),
                                               d_input={BAD})
    assert err is not None and err.step == BAD and err.phase == "forward", \
        str(err)


# ---- several param groups ----------------------------------------------------

def lr_job(path, lrs, spike=(), steps=16, optimizer_arg=None):
    """A 3-layer MLP with two param groups (backbone, head) at lrs; the
    head's lr x1000 at the steps in spike (a broken schedule)."""
    torch.manual_seed(3)
    m = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 32),
                      nn.ReLU(), nn.Linear(32, 4))
    crit = nn.MSELoss()
    opt = torch.optim.SGD([
        {"params": m[0].parameters(), "lr": lrs[0]},
        {"params": list(m[2].parameters()) + list(m[4].parameters()),
         "lr": lrs[1]}])
    tr = at.Tracer(m, path, loss_fn=crit, overwrite=True, env=False)
    X, Y = torch.randn(64, 8), torch.randn(64, 4)
    for s in range(steps):
        opt.param_groups[1]["lr"] = lrs[1] * (1000 if s in spike else 1)
        i = (s * 8) % 64
        loss = crit(m(X[i:i + 8]), Y[i:i + 8])
        opt.zero_grad()
        loss.backward()
        opt.step()
        tr.end_step(loss=loss, optimizer=optimizer_arg(opt)
                    if optimizer_arg else opt)
    tr.close()
    return ampprobe.read_trace(path)["steps"], ampprobe.postmortem(path)


def texts(pm):
    return " | ".join(" | ".join([d.get("title", ""), d.get("next_step", "")]
                                 + d.get("evidence", []))
                      for d in pm.get("diagnosis", []))


def test_lr_spike_in_the_second_group_is_the_schedule(tmp_path):
    """The head's group spikes x1000 at steps 8-9 and the loss diverges:
    the lr column shows it, the post-mortem names the schedule at step 8
    (before: a flat 0.01 and 'lower the learning rate')."""
    st, pm = lr_job(str(tmp_path / "spike.h5"), (0.01, 0.01), spike={8, 9})
    assert col(st, "lr", float)[7:11] == pytest.approx([0.01, 10, 10, 0.01])
    t = texts(pm)
    assert "spiked at step 8" in t and "schedule at step 8" in t, t


def test_constant_lrs_over_groups_stay_quiet(tmp_path):
    """Two groups at constant, different rates: the larger is recorded
    every step, no learning-rate finding, healthy."""
    st, pm = lr_job(str(tmp_path / "const.h5"), (0.001, 0.01))
    assert col(st, "lr", float) == pytest.approx([0.01] * 16)
    assert pm["verdict"] == "healthy", texts(pm)
    assert "learning rate" not in texts(pm), texts(pm)


@pytest.mark.parametrize("wrap", [list, tuple])
def test_several_optimizers_give_the_largest_lr(tmp_path, wrap):
    """optimizer= a list or tuple of optimizers: the largest lr of all."""
    other = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=0.5)
    st, pm = lr_job(str(tmp_path / "opts.h5"), (0.001, 0.01), steps=3,
                    optimizer_arg=lambda o: wrap([o, other]))
    assert col(st, "lr", float) == pytest.approx([0.5] * 3)


def test_a_nonfinite_lr_in_any_group_is_recorded(tmp_path):
    """A NaN lr in the second group is what is recorded, not the first
    group's finite one."""
    torch.manual_seed(0)
    m = nn.Linear(4, 1)
    opt = torch.optim.SGD([{"params": [m.weight], "lr": 0.1},
                           {"params": [m.bias], "lr": float("nan")}])
    p = str(tmp_path / "nan.h5")
    tr = at.Tracer(m, p, overwrite=True, env=False)
    m(torch.randn(2, 4)).sum().backward()
    tr.end_step(loss=1.0, optimizer=opt)
    tr.close()
    assert math.isnan(float(ampprobe.read_trace(p)["steps"]["lr"][0]))
