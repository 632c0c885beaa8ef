"""lsgd.models: every model builds for its dataset with the right output shapes; GPT causality;
weight tying; compatibility errors; parameter counts."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from lsgd.core.errors import ConfigError
from lsgd.data import DatasetInfo
from lsgd.models import MODELS, build_model, check_compatible

CONF = Path(__file__).resolve().parents[2] / "conf" / "model"
FASHION = DatasetInfo("fashion_mnist", "classification", (1, 28, 28), 10, 60000)
CIFAR10 = DatasetInfo("cifar10", "classification", (3, 32, 32), 10, 50000)
CIFAR100 = DatasetInfo("cifar100", "classification", (3, 32, 32), 100, 50000)
IMAGENET_SMALL = DatasetInfo("imagenet", "classification", (3, 64, 64), 1000, 1281167)
C4 = DatasetInfo("c4", "lm", (16,), 257, None)
# byte tokenizer + BOS 257 + PAD 258; source 10 positions, decoder 7
WMT = DatasetInfo("wmt17", "translation", (17,), 259, None, src_len=10, pad_id=258)


def _n_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())  # parameters() yields a tied tensor once


@pytest.mark.parametrize(
    "name, info",
    [
        ("cnn", FASHION),
        ("cnn", CIFAR10),
        ("logreg", FASHION),
        ("logreg", CIFAR100),
        ("resnet20", CIFAR10),
        ("resnet56", CIFAR100),
        ("resnet20", FASHION),
        ("resnet18", CIFAR100),
        ("resnet18", FASHION),  # 1-channel input: first conv replaced
        ("resnet50", IMAGENET_SMALL),
        ("resnet101", CIFAR10),
        ("vgg16", CIFAR10),
    ],
)
def test_classifiers_output_logits(name, info):
    torch.manual_seed(0)
    model = build_model({"name": name}, info).eval()
    with torch.no_grad():
        out = model(torch.randn(2, *info.input_shape))
    assert out.shape == (2, info.num_classes) and torch.isfinite(out).all()


@pytest.mark.parametrize("cfg", [{"name": "lstm_lm"}, {"name": "gpt"}, {"name": "lstm_lm", "tie_weights": False, "hidden_dim": 64}])
def test_language_models_output_vocab_logits(cfg):
    model = build_model(cfg, C4).eval()
    x = torch.randint(0, 257, (3, 16))
    with torch.no_grad():
        out = model(x)
    assert out.shape == (3, 16, 257) and torch.isfinite(out).all()
    with torch.no_grad():
        assert model(x[:, :5]).shape == (3, 5, 257)  # shorter sequences too


def test_models_train_one_step():
    """Gradients reach every parameter (nothing detached, no unused modules)."""
    for cfg, info, x, y in [
        ({"name": "cnn"}, FASHION, torch.randn(4, 1, 28, 28), torch.randint(0, 10, (4,))),
        ({"name": "logreg"}, FASHION, torch.randn(4, 1, 28, 28), torch.randint(0, 10, (4,))),
        ({"name": "gpt"}, C4, torch.randint(0, 257, (2, 16)), torch.randint(0, 257, (2, 16))),
        ({"name": "lstm_lm"}, C4, torch.randint(0, 257, (2, 16)), torch.randint(0, 257, (2, 16))),
        ({"name": "transformer_mt"}, WMT, torch.randint(0, 257, (2, 17)), torch.randint(0, 257, (2, 7))),
        ({"name": "transformer_mt", "positions": "learned", "share_embeddings": False}, WMT,
         torch.randint(0, 257, (2, 17)), torch.randint(0, 257, (2, 7))),
    ]:
        model = build_model(cfg, info)
        out = model(x)
        torch.nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1)).backward()
        assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters()), cfg


def test_gpt_is_causal():
    torch.manual_seed(0)
    model = build_model({"name": "gpt", "dropout": 0.0}, C4).eval()
    x = torch.randint(0, 257, (2, 16))
    t = 9
    x2 = x.clone()
    x2[:, t] = (x[:, t] + 1) % 257
    with torch.no_grad():
        a, b = model(x), model(x2)
    assert torch.allclose(a[:, :t], b[:, :t], atol=1e-6)
    assert not torch.allclose(a[:, t:], b[:, t:], atol=1e-4)  # later positions do see token t


def test_gpt_rejects_too_long_input():
    model = build_model({"name": "gpt"}, C4)
    with pytest.raises(ValueError, match="block_size"):
        model(torch.zeros(1, 17, dtype=torch.long))


def test_tied_embeddings_share_storage():
    gpt = build_model({"name": "gpt"}, C4)
    assert gpt.lm_head.weight is gpt.wte.weight
    assert gpt.lm_head.weight.data_ptr() == gpt.wte.weight.data_ptr()
    lstm = build_model({"name": "lstm_lm"}, C4)
    assert lstm.decoder.weight.data_ptr() == lstm.embed.weight.data_ptr()
    untied = build_model({"name": "lstm_lm", "tie_weights": False}, C4)
    assert untied.decoder.weight.data_ptr() != untied.embed.weight.data_ptr()
    assert _n_params(untied) == _n_params(lstm) + 257 * 256


def test_cifar_resnet_parameter_counts():
    """He et al. 2016, Table 6: ResNet-20 0.27M, ResNet-56 0.85M parameters."""
    r20 = build_model({"name": "resnet20"}, CIFAR10)
    r56 = build_model({"name": "resnet56"}, CIFAR10)
    assert _n_params(r20) == pytest.approx(0.27e6, rel=0.01)
    assert _n_params(r56) == pytest.approx(0.85e6, rel=0.01)
    r20b = build_model({"name": "resnet20", "shortcut": "B"}, CIFAR10)
    assert _n_params(r20b) > _n_params(r20)  # option B adds 1x1 projection convolutions


@pytest.mark.parametrize("size, nominal", [("20m", 20e6), ("60m", 60e6), ("150m", 150e6)])
def test_gpt_sizes_match_their_names(size, nominal):
    with torch.device("meta"):  # no memory, no init cost
        model = build_model({"name": "gpt", "size": size}, DatasetInfo("c4", "lm", (256,), 257, None))
    assert model.num_params(non_embedding=True) == pytest.approx(nominal, rel=0.06)


def test_gpt_size_overrides():
    model = build_model({"name": "gpt", "n_layer": 3, "n_embd": 32, "n_head": 4}, C4)
    assert len(model.blocks) == 3 and model.wte.weight.shape == (257, 32)


def test_gpt_vocab_multiple_pads_the_embedding_only():
    """vocab_multiple=64: 257 -> 320 embedding rows; the logits keep the vocabulary's 257 columns, and
    with the padding rows copied from an unpadded model the outputs are the same, so the padding
    rows get no gradient and the loss is the unpadded model's."""
    torch.manual_seed(0)
    plain = build_model({"name": "gpt", "n_layer": 1, "n_embd": 32, "n_head": 4}, C4)
    padded = build_model({"name": "gpt", "n_layer": 1, "n_embd": 32, "n_head": 4, "vocab_multiple": 64}, C4)
    assert padded.wte.weight.shape == (320, 32) and padded.lm_head.weight is padded.wte.weight
    with torch.no_grad():
        for (name, p), q in zip(padded.named_parameters(), plain.parameters()):
            p.copy_(torch.cat([q, torch.randn(p.shape[0] - q.shape[0], *q.shape[1:])]) if p.shape != q.shape else q)
    x = torch.randint(0, 257, (2, 16))
    out = padded(x)
    assert out.shape == (2, 16, 257)
    assert torch.allclose(out, plain(x), atol=1e-6)
    torch.nn.functional.cross_entropy(out.reshape(-1, 257), x.reshape(-1)).backward()
    assert padded.wte.weight.grad[257:].abs().max() == 0 and padded.wte.weight.grad[:257].abs().max() > 0
    with pytest.raises(ConfigError, match="model.vocab_multiple"):
        build_model({"name": "gpt", "vocab_multiple": 0}, C4)


@pytest.mark.parametrize("info", [FASHION, CIFAR10, CIFAR100])
def test_logreg_is_one_linear_map_of_the_flattened_image(info):
    """(C*H*W + 1) * classes parameters, no buffers; logits are affine in the input,
    f(a x1 + b x2) = a f(x1) + b f(x2) + (1 - a - b) c, and equal W vec(x) + c; zero init by default."""
    c, h, w = info.input_shape
    k = info.num_classes
    zero = build_model({"name": "logreg"}, info)
    assert _n_params(zero) == (c * h * w + 1) * k and not list(zero.buffers())
    x = torch.randn(5, c, h, w)
    assert torch.equal(zero(x), torch.zeros(5, k))  # W = 0, c = 0: every class equally likely
    torch.manual_seed(0)
    model = build_model({"name": "logreg", "init": "torch"}, info).double()
    (weight, bias) = (model.linear.weight, model.linear.bias)
    assert weight.shape == (k, c * h * w) and bias.shape == (k,) and weight.abs().sum() > 0
    x1, x2 = torch.randn(2, 3, c, h, w, dtype=torch.float64)
    a, b = 0.7, -2.5
    with torch.no_grad():
        assert torch.allclose(model(a * x1 + b * x2), a * model(x1) + b * model(x2) + (1 - a - b) * bias, atol=1e-10)
        assert torch.allclose(model(x1), x1.reshape(3, -1) @ weight.T + bias, atol=1e-12)


def test_logreg_loss_is_convex_in_the_parameters():
    """Cross-entropy of logistic regression along a segment between two parameter vectors lies
    below the chord (convexity, the property the local-vs-minibatch study relies on), and the
    zero-initialized model's loss is log(classes)."""
    torch.manual_seed(0)
    info = DatasetInfo("synthetic", "classification", (1, 4, 4), 5, 64)
    x, y = torch.randn(64, 1, 4, 4, dtype=torch.float64), torch.randint(0, 5, (64,))
    model = build_model({"name": "logreg"}, info).double()
    loss = torch.nn.functional.cross_entropy
    with torch.no_grad():
        assert loss(model(x), y).item() == pytest.approx(math.log(5), rel=1e-12)
    theta0, theta1 = (torch.randn(5 * 17, dtype=torch.float64) * 3 for _ in range(2))

    def loss_at(theta):
        torch.nn.utils.vector_to_parameters(theta, model.parameters())
        with torch.no_grad():
            return loss(model(x), y).item()

    f0, f1 = loss_at(theta0), loss_at(theta1)
    for t in torch.linspace(0, 1, 11).tolist():
        assert loss_at((1 - t) * theta0 + t * theta1) <= (1 - t) * f0 + t * f1 + 1e-12


def test_cnn_has_batchnorm_buffers():
    model = build_model({"name": "cnn"}, FASHION)
    names = [n for n, _ in model.named_buffers()]
    assert any(n.endswith("running_mean") for n in names)


@pytest.mark.parametrize(
    "cfg, info, words",
    [
        ({"name": "cnn"}, C4, ["model.name=cnn", "dataset.name=c4"]),
        ({"name": "resnet18"}, C4, ["model.name=resnet18", "dataset.name=c4"]),
        ({"name": "gpt"}, CIFAR10, ["model.name=gpt", "dataset.name=cifar10"]),
        ({"name": "lstm_lm"}, FASHION, ["model.name=lstm_lm", "dataset.name=fashion_mnist"]),
        ({"name": "vgg16"}, FASHION, ["model.name=vgg16", "dataset.name=fashion_mnist"]),
        ({"name": "cnn"}, DatasetInfo("imagenet", "classification", (3, 224, 224), 1000, 1), ["model.name=cnn", "imagenet"]),
        ({"name": "transformer"}, C4, ["model.name", "gpt", "resnet20", "cnn"]),
        ({"name": "gpt", "size": "huge"}, C4, ["model.size", "tiny", "150m"]),
        ({"name": "gpt", "n_embd": 30, "n_head": 4}, C4, ["model.n_embd", "model.n_head"]),
        ({"name": "lstm_lm", "hidden_dim": 128}, C4, ["model.tie_weights", "model.embed_dim"]),
        ({"name": "resnet20", "shortcut": "C"}, CIFAR10, ["model.shortcut", "A, B"]),
        ({"name": "cnn", "hiden": 3}, FASHION, ["model.hiden", "hidden"]),
        ({"name": "logreg", "init": "ones"}, FASHION, ["model.init", "zeros, torch"]),
        ({"name": "logreg", "hidden": 8}, FASHION, ["model.hidden", "init"]),
        ({"name": "logreg"}, C4, ["model.name=logreg", "dataset.name=c4"]),
        ({"name": "transformer_mt"}, C4, ["model.name=transformer_mt", "dataset.name=c4", "wmt17"]),
        ({"name": "gpt"}, WMT, ["dataset.name=wmt17", "model.name=gpt", "transformer_mt"]),
        ({"name": "cnn"}, WMT, ["dataset.name=wmt17", "model.name=cnn", "transformer_mt"]),
        ({"name": "transformer_mt", "size": "large"}, WMT, ["model.size", "tiny, base, big"]),
        ({"name": "transformer_mt", "d_model": 30, "nhead": 4}, WMT, ["model.d_model", "model.nhead"]),
        ({"name": "transformer_mt", "positions": "rotary"}, WMT, ["model.positions", "sinusoidal, learned"]),
        ({"name": "transformer_mt", "dropout": 1.5}, WMT, ["model.dropout"]),
        ({"name": "transformer_mt", "nhead": 0}, WMT, ["model.nhead", "integer >= 1"]),
    ],
)
def test_check_compatible_raises_config_error(cfg, info, words):
    with pytest.raises(ConfigError) as e:
        check_compatible(cfg, info)
    for w in words:
        assert w in str(e.value)
    with pytest.raises(ConfigError):
        build_model(cfg, info)


def test_yaml_configs_match_code_defaults():
    import omegaconf
    files = sorted(CONF.glob("*.yaml"))
    assert {f.stem for f in files} == set(MODELS)
    for f in files:
        cfg = omegaconf.OmegaConf.to_container(omegaconf.OmegaConf.load(f), resolve=True)
        assert cfg["name"] == f.stem
        defaults = MODELS.entry(f.stem).extra["defaults"]
        assert set(cfg) - {"name"} == set(defaults), f.name
        assert cfg == {"name": f.stem, **defaults}, f.name
        check_compatible(cfg, C4 if f.stem in ("gpt", "lstm_lm") else WMT if f.stem == "transformer_mt" else CIFAR10)


# ------------------------------------------------------------------ transformer_mt
def _packed(batch: int = 3, seed: int = 0, src_real: int = 6) -> torch.Tensor:
    """A packed WMT input: ``src_real`` source tokens (+ padding) | BOS + 6 target tokens (7 positions)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 256, (batch, 17), generator=g)
    x[:, src_real:10] = WMT.pad_id
    x[:, 10] = 257  # BOS
    return x


@pytest.mark.parametrize("positions", ["sinusoidal", "learned"])
def test_transformer_mt_outputs_target_logits(positions):
    torch.manual_seed(0)
    model = build_model({"name": "transformer_mt", "positions": positions}, WMT).eval()
    with torch.no_grad():
        out = model(_packed())
        assert out.shape == (3, 7, 259) and torch.isfinite(out).all()
        assert model(_packed()[:, :14]).shape == (3, 4, 259)  # a shorter decoder input too
    with pytest.raises(ValueError, match="src_len"):
        model(_packed()[:, :10])  # no target positions


@pytest.mark.parametrize("positions", ["sinusoidal", "learned"])
def test_transformer_mt_decoder_is_causal(positions):
    torch.manual_seed(0)
    model = build_model({"name": "transformer_mt", "positions": positions}, WMT).eval()
    x = _packed()
    for t in (0, 3):  # changing decoder input t + 1 changes no logit at positions <= t
        x2 = x.clone()
        x2[:, 10 + t + 1] = (x[:, 10 + t + 1] + 1) % 256
        with torch.no_grad():
            a, b = model(x), model(x2)
        assert torch.allclose(a[:, : t + 1], b[:, : t + 1], atol=1e-6)
        assert not torch.allclose(a[:, t + 1 :], b[:, t + 1 :], atol=1e-4)


def test_transformer_mt_source_padding_changes_nothing():
    """Key padding masks: the same source with 4 padded positions or with none (the split moved),
    and whatever the padding embeds, gives the same logits; a real source token does matter."""
    torch.manual_seed(0)
    model = build_model({"name": "transformer_mt"}, WMT).eval()
    x = _packed(src_real=6)
    with torch.no_grad():
        padded = model(x)
        model.src_len = 6
        unpadded = model(torch.cat([x[:, :6], x[:, 10:]], dim=1))
        model.src_len = 10
        assert torch.allclose(padded, unpadded, atol=1e-5)
        model.src_embed.weight[WMT.pad_id] += 3.0  # what the padded slots carry
        assert torch.allclose(model(x), padded, atol=1e-5)
        x2 = x.clone()
        x2[:, 2] = (x[:, 2] + 1) % 256
        assert not torch.allclose(model(x2), padded, atol=1e-4)


def test_transformer_mt_shares_embeddings_and_sizes_match_the_paper():
    model = build_model({"name": "transformer_mt"}, WMT)
    assert model.out.weight is model.src_embed.weight and model.tgt_embed is model.src_embed
    untied = build_model({"name": "transformer_mt", "share_embeddings": False}, WMT)
    assert _n_params(untied) == _n_params(model) + 2 * 259 * 32
    # Vaswani et al. 2017, Table 3 (shared 37k vocabulary): base 65M, big 213M parameters
    info = DatasetInfo("wmt17", "translation", (256,), 37000, None, src_len=128, pad_id=36999)
    with torch.device("meta"):
        base = build_model({"name": "transformer_mt", "size": "base"}, info)
        big = build_model({"name": "transformer_mt", "size": "big"}, info)
    assert _n_params(base) == pytest.approx(65e6, rel=0.04) and _n_params(big) == pytest.approx(213e6, rel=0.01)
    layer = base.transformer.encoder.layers[0]
    assert (layer.self_attn.embed_dim, layer.self_attn.num_heads, layer.linear1.out_features) == (512, 8, 2048)
    assert len(base.transformer.encoder.layers) == len(base.transformer.decoder.layers) == 6
    assert layer.dropout.p == 0.1 and not layer.norm_first


# ------------------------------------------------------------------ transformer_mt: greedy decoding
EOS_ID, BOS_ID = 256, 257
# 8 source positions, 64 decoder positions: room for source length + 50
WMT_LONG = DatasetInfo("wmt17", "translation", (72,), 259, None, src_len=8, pad_id=258)


def _sources(lengths: list[int], src_len: int = 8, seed: int = 0) -> torch.Tensor:
    """Source rows of ``lengths`` byte tokens, then EOS, then PAD (the packing's first src_len columns)."""
    g = torch.Generator().manual_seed(seed)
    src = torch.full((len(lengths), src_len), WMT.pad_id)
    for i, n in enumerate(lengths):
        src[i, :n] = torch.randint(0, 256, (n,), generator=g)
        src[i, n] = EOS_ID
    return src


def _always(token: int, positions: str = "sinusoidal") -> torch.nn.Module:
    """A transformer_mt whose every logit vector has its argmax at ``token``: the decoder's final
    LayerNorm outputs a constant vector e (weight 0, bias e) and the (untied) output row of
    ``token`` is e, every other row 0 (logit |e|^2 vs 0)."""
    torch.manual_seed(0)
    model = build_model({"name": "transformer_mt", "share_embeddings": False, "positions": positions}, WMT_LONG).eval()
    with torch.no_grad():
        norm = model.transformer.decoder.norm
        norm.weight.zero_()
        norm.bias.copy_(torch.linspace(-1.0, 1.0, norm.bias.numel()))
        model.out.weight.zero_()
        model.out.weight[token] = norm.bias
    return model


@pytest.mark.parametrize("positions", ["sinusoidal", "learned"])
def test_greedy_decode_length_is_source_plus_extra_capped_at_tgt_len(positions):
    """A model that never says EOS: row i gets exactly min(n_i + max_extra, max_len or tgt_len)
    tokens (n_i: its source tokens, EOS and padding not counted), then PAD."""
    model = _always(ord("a"), positions)
    src = _sources([0, 3, 7])
    out = model.greedy_decode(src, BOS_ID, EOS_ID)  # max_extra 50 (Vaswani et al.), tgt_len 64
    expected = [50, 53, 57]
    assert out.shape == (3, 57)
    for row, n in zip(out.tolist(), expected):
        assert row == [ord("a")] * n + [WMT.pad_id] * (57 - n)
    short = model.greedy_decode(src, BOS_ID, EOS_ID, max_extra=2)
    assert [int((r != WMT.pad_id).sum()) for r in short] == [2, 5, 9] and short.shape == (3, 9)
    capped = model.greedy_decode(src, BOS_ID, EOS_ID, max_extra=2, max_len=4)
    assert capped.tolist() == [[97, 97, 258, 258], [97] * 4, [97] * 4]
    for bad in ({"max_len": 65}, {"max_len": 0}, {"max_extra": -1}):
        with pytest.raises(ValueError):
            model.greedy_decode(src, BOS_ID, EOS_ID, **bad)


def test_greedy_decode_stops_at_eos():
    """A model whose argmax is always EOS: every row is [EOS] and decoding stops after one step."""
    model = _always(EOS_ID)
    calls = []
    model.transformer.decoder.register_forward_hook(lambda *a: calls.append(1))
    out = model.greedy_decode(_sources([2, 5]), BOS_ID, EOS_ID)
    assert out.tolist() == [[EOS_ID], [EOS_ID]] and len(calls) == 1


@pytest.mark.parametrize("positions", ["sinusoidal", "learned"])
def test_greedy_decode_picks_forwards_argmax_given_its_own_prefix(positions):
    """An untrained model: feeding the decoded tokens back as the teacher-forced decoder input
    (BOS + tokens, PAD after), :meth:`forward`'s argmax at every decoded position is the decoded
    token (the incremental decoder uses forward's masks and positions). Declaring a token that the
    model emits to be the end token cuts every row right after its first occurrence, PAD after."""
    torch.manual_seed(1)
    model = build_model({"name": "transformer_mt", "positions": positions, "share_embeddings": False}, WMT_LONG).eval()
    src = _sources([1, 4, 6, 7, 2, 5], seed=3)
    dec = model.greedy_decode(src, BOS_ID, EOS_ID, max_extra=6)
    lengths = [min(n + 6, 64) for n in (1, 4, 6, 7, 2, 5)]
    assert dec.shape == (6, max(lengths))
    x = torch.full((6, 8 + 64), WMT_LONG.pad_id)
    x[:, :8], x[:, 8] = src, BOS_ID
    x[:, 9 : 9 + dec.shape[1]] = dec
    with torch.no_grad():
        pred = model(x).argmax(-1)
    rows = []
    for i, row in enumerate(dec.tolist()):
        real = row[: row.index(EOS_ID) + 1] if EOS_ID in row else row[: lengths[i]]
        assert row[len(real) :] == [WMT_LONG.pad_id] * (len(row) - len(real))
        assert pred[i, : len(real)].tolist() == real, (i, real)
        rows.append(real)
    assert len({t for r in rows for t in r}) > 3  # not a degenerate constant output

    # declare as the end token one the model emits in some rows (never first) and not in others
    def rows_with(t):
        return sum(t in r for r in rows) if all(r.index(t) > 0 for r in rows if t in r) else 0

    end = max(sorted({t for r in rows for t in r}), key=lambda t: rows_with(t) if rows_with(t) < len(rows) else 0)
    assert 1 <= rows_with(end) < len(rows)
    cut = model.greedy_decode(src, BOS_ID, end, max_extra=6)
    expected = [r[: r.index(end) + 1] if end in r else r for r in rows]
    assert cut.shape[1] == max(map(len, expected))
    for i, e in enumerate(expected):
        assert cut[i].tolist() == e + [WMT_LONG.pad_id] * (cut.shape[1] - len(e)), i
