"""Models nobody here wrote: Hugging Face transformers' GPT-2 and BERT,
built small from their configs (no download), traced as a user's job runs
them (keyword arguments, AdamW, their own loss). A healthy run has every
hooked module's sites and no event; an FP16 overflow planted in one of
their layers (weights scaled up) is named at that layer, by the post-mortem
and by on_nonfinite="raise", under FP16 emulation and under real FP16
autocast on the CPU (torch 2). Skipped, saying so, without transformers
(scripts/torch2-venv.sh installs it beside torch 2)."""
import os

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip(
    "transformers", reason="no transformers in %s (scripts/torch2-venv.sh "
    "installs it)" % os.path.realpath(__import__("sys").executable))

import ampprobe  # noqa: E402
import ampprobe.torch as at  # noqa: E402
from ampprobe._lib import SITES  # noqa: E402
from conftest import cpu_fp16_autocast  # noqa: E402

torch.set_num_threads(1)
STEPS = 3


def gpt2():
    c = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2,
                                vocab_size=100, n_positions=32)
    return transformers.GPT2LMHeadModel(c)


def bert():
    c = transformers.BertConfig(
        num_hidden_layers=2, hidden_size=32, num_attention_heads=2,
        intermediate_size=64, vocab_size=100, max_position_embeddings=32,
        num_labels=3)
    return transformers.BertForSequenceClassification(c)


# (model, the layer an overflow is planted in, the LayerNorm feeding it)
MODELS = {"gpt2": (gpt2, "transformer.h.1.mlp.c_fc", "transformer.h.1.ln_2"),
          "bert": (bert, "bert.encoder.layer.1.intermediate.dense",
                   "bert.encoder.layer.1.attention.output.LayerNorm")}
# The plant: the LayerNorm's gain x1000 and the layer's weights x200. Every
# value stays within FP16 (the LayerNorm's output up to ~4e3, the weights
# ~20), but the layer's output (std ~2e4 over 32 inputs) overflows it. (The
# weights alone x1e6 do not fit FP16 themselves: under emulation their
# binary16 copy, the `weight` record, is then the origin.)
GAIN, SCALE = 1e3, 200.0


def batch(name, step):
    g = torch.Generator().manual_seed(step)
    ids = torch.randint(0, 100, (4, 16), generator=g)
    mask = torch.ones(4, 16, dtype=torch.long)
    mask[2:, 12:] = 0  # two padded sequences
    labels = ids if name == "gpt2" else torch.randint(0, 3, (4,), generator=g)
    return dict(input_ids=ids, attention_mask=mask, labels=labels)


def run(tmp_path, name, plant=False, **kw):
    make, layer, norm = MODELS[name]
    torch.manual_seed(0)
    model = make()
    if plant:
        with torch.no_grad():
            model.get_submodule(norm).weight.mul_(GAIN)
            model.get_submodule(layer).weight.mul_(SCALE)
    path = str(tmp_path / ("%s.h5" % name))
    tr = at.Tracer(model, path, **kw)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    try:
        for s in range(STEPS):
            with tr.autocast():
                loss = model(**batch(name, s)).loss
            opt.zero_grad()
            loss.backward()
            opt.step()
            tr.end_step(loss=loss, optimizer=opt)
    finally:
        tr.close()
    return path, layer


PRECISIONS = [dict(precision="fp32"), dict(emulate_fp16=True)] + (
    [dict(precision="fp16")] if cpu_fp16_autocast() else [])
IDS = ["fp32", "emulated-fp16", "fp16"][:len(PRECISIONS)]


@pytest.mark.parametrize("name", sorted(MODELS))
def test_healthy_run_records_every_module(tmp_path, name):
    path, _ = run(tmp_path, name, precision="fp32")
    t = ampprobe.read_trace(path)
    names = [n.decode() for n in t["layers"]["name"]]
    r = t["records"]
    fo = set(r[r["site"] == SITES.index("fwd_out")]["layer"])
    wg = set(r[r["site"] == SITES.index("weight_grad")]["layer"])
    linear = [i for i, n in enumerate(names)
              if n.endswith(("c_attn", "c_fc", "c_proj", "dense", "query", "key",
                             "value"))]
    assert len(linear) >= 8
    for i in linear:  # forward and weight gradient of each projection
        assert i in fo and i in wg, names[i]
    assert set(r["step"]) == set(range(STEPS))
    assert (r["nan_count"] + r["posinf_count"] + r["neginf_count"]).sum() == 0
    pm = ampprobe.postmortem(path)
    assert pm["event"]["kind"] == "none"
    assert ampprobe.verdict(path) == "healthy"


@pytest.mark.parametrize("prec", PRECISIONS, ids=IDS[:len(PRECISIONS)])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_planted_overflow_named_at_its_layer(tmp_path, name, prec):
    path, layer = run(tmp_path, name, plant=True, **prec)
    if prec.get("precision") == "fp32":  # the plant is an FP16 problem only
        assert ampprobe.postmortem(path)["event"]["kind"] == "none"
        return
    ev = ampprobe.postmortem(path)["event"]
    assert (ev["origin_layer"], ev["origin_site"], ev["phase"],
            ev["step"]) == (layer, "fwd_out", "forward", 0), ev
    assert ampprobe.verdict(path) in ("degraded", "diverged")


@pytest.mark.parametrize("name", sorted(MODELS))
def test_raise_names_the_layer(tmp_path, name):
    with pytest.raises(at.NonFiniteError) as e:
        run(tmp_path, name, plant=True, emulate_fp16=True,
            on_nonfinite="raise")
    assert (e.value.module, e.value.site, e.value.step) == (
        MODELS[name][1], "fwd_out", 0)
    assert "'%s'" % MODELS[name][1] in str(e.value)
