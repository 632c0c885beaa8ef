"""Models, built from the ``model`` config group (a plain dict) and the dataset's
:class:`lsgd.data.DatasetInfo`.

==============  ==============  =========================================================
``model.name``  task            implementation
==============  ==============  =========================================================
cnn             classification  :class:`lsgd.models.cnn.SmallCNN` (images <= 64 px)
logreg          classification  :class:`lsgd.models.logreg.LogisticRegression` (convex: one Linear)
resnet20/56     classification  :class:`lsgd.models.resnet_cifar.CifarResNet` (He et al. 2016, CIFAR)
resnet18/50/101 classification  ``torchvision.models.resnet*`` (weights=None)
vgg16           classification  ``torchvision.models.vgg16`` / ``vgg16_bn`` (weights=None; >= 32 px)
lstm_lm         lm              :class:`lsgd.models.lstm.LSTMLM`
gpt             lm              :class:`lsgd.models.gpt.GPT`
transformer_mt  translation     :class:`lsgd.models.transformer_mt.TransformerMT` (``torch.nn.Transformer``)
==============  ==============  =========================================================

The torchvision models are used as they are, also on 32x32 CIFAR input (ImageNet stem: 7x7
stride-2 conv + max-pool for ResNets, so a 32x32 image reaches the last stage at 1x1; VGG's
adaptive pool replicates the 1x1 map to 7x7 before its 25088-4096-4096 classifier, 134M
parameters). Only the first convolution is replaced when the input has C != 3 channels.
Use resnet20/resnet56 for CIFAR results comparable to the literature on small models.

Classification models return logits (B, num_classes); language models (B, T, vocab);
translation models map the packed (B, src_len + tgt_len) int64 input (lsgd.data.translation) to
(B, tgt_len, vocab) logits over the target positions.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from lsgd.core.errors import ConfigError
from lsgd.core.registry import Registry
from lsgd.data import DatasetInfo

#: Every model, by ``model.name`` (:class:`lsgd.core.registry.Registry`). An entry's ``extra``:
#: ``defaults``, every key the model accepts with its default (conf/model/<name>.yaml sets the same
#: values; ``channels_last``, convnets: parameters and input batches in NHWC memory format,
#: lsgd.training.accel), and ``task``: ``classification``, ``lm`` or ``translation``.
MODELS: Registry = Registry("model", "model.name")


def _model(name: str, label: str, task: str, defaults: dict[str, Any], summary: str = ""):
    """Register a builder ``(resolved model cfg, DatasetInfo) -> nn.Module`` as ``model.name=name``
    (``lsgd list models`` shows the first sentence of conf/model/<name>.yaml's header when
    ``summary`` is empty)."""
    return MODELS.register(name, label=label, summary=summary, task=task, defaults=defaults)


LM_MODELS = ("lstm_lm", "gpt")
MT_MODELS = ("transformer_mt",)
CNN_MAX_SIDE = 64


def resolve(model_cfg: dict) -> dict:
    """``model_cfg`` with defaults filled in, after checking the name and keys.

    Raises:
        ConfigError: unknown ``model.name`` or key, or an invalid value.
    """
    from lsgd.models.gpt import SIZES
    from lsgd.models.logreg import INITS
    from lsgd.models.resnet_cifar import SHORTCUTS

    name = model_cfg.get("name")
    defaults = MODELS.entry(name).extra["defaults"]
    unknown = sorted(set(model_cfg) - set(defaults) - {"name"})
    if unknown:
        allowed = ", ".join(sorted(defaults)) or "(no other keys)"
        raise ConfigError(f"unknown key(s) model.{', model.'.join(unknown)} for model.name={name}; allowed: {allowed}")
    cfg = {**defaults, **model_cfg}
    if name == "cnn":
        ch = cfg["channels"]
        if not isinstance(ch, (list, tuple)) or not ch or not all(_is_int(c, 1) for c in ch):
            raise ConfigError(f"model.channels must be a non-empty list of positive integers; got {ch!r}")
        if not _is_int(cfg["hidden"], 1):
            raise ConfigError(f"model.hidden must be an integer >= 1; got {cfg['hidden']!r}")
    elif name == "logreg" and cfg["init"] not in INITS:
        raise ConfigError(f"model.init must be one of {', '.join(INITS)}; got {cfg['init']!r}")
    elif name in ("resnet20", "resnet56") and cfg["shortcut"] not in SHORTCUTS:
        raise ConfigError(f"model.shortcut must be one of {', '.join(SHORTCUTS)}; got {cfg['shortcut']!r}")
    elif name == "lstm_lm":
        for key in ("num_layers", "embed_dim", "hidden_dim"):
            if not _is_int(cfg[key], 1):
                raise ConfigError(f"model.{key} must be an integer >= 1; got {cfg[key]!r}")
        if cfg["tie_weights"] and cfg["embed_dim"] != cfg["hidden_dim"]:
            raise ConfigError(
                f"model.tie_weights=true needs model.embed_dim == model.hidden_dim; got {cfg['embed_dim']} and "
                f"{cfg['hidden_dim']} (set them equal or model.tie_weights=false)"
            )
    elif name == "gpt":
        if cfg["size"] not in SIZES:
            raise ConfigError(f"model.size must be one of {', '.join(SIZES)}; got {cfg['size']!r}")
        n_layer, n_head, n_embd = (
            cfg[k] if cfg[k] is not None else d for k, d in zip(("n_layer", "n_head", "n_embd"), SIZES[cfg["size"]])
        )
        for key, v in (("n_layer", n_layer), ("n_head", n_head), ("n_embd", n_embd)):
            if not _is_int(v, 1):
                raise ConfigError(f"model.{key} must be null (from model.size) or an integer >= 1; got {v!r}")
        if n_embd % n_head:
            raise ConfigError(f"model.n_embd ({n_embd}) must be divisible by model.n_head ({n_head})")
        if not _is_int(cfg.get("vocab_multiple", 1), 1):
            raise ConfigError(f"model.vocab_multiple must be an integer >= 1; got {cfg.get('vocab_multiple')!r}")
    elif name == "transformer_mt":
        transformer_mt_dims(cfg)
    if "channels_last" in cfg and not isinstance(cfg["channels_last"], bool):
        raise ConfigError(f"model.channels_last must be true or false; got {cfg['channels_last']!r}")
    dropout = cfg.get("dropout")
    from_size = name == "transformer_mt" and dropout is None  # null: from model.size
    if "dropout" in cfg and not from_size and not (isinstance(dropout, (int, float)) and 0 <= dropout < 1):
        raise ConfigError(f"model.dropout must be in [0, 1); got {dropout!r}")
    return cfg


def transformer_mt_dims(cfg: dict) -> dict:
    """transformer_mt's ``torch.nn.Transformer`` sizes: ``model.size``'s, each overridden by its
    key when not null.

    Raises:
        ConfigError: unknown ``model.size``, ``model.positions``, a size that is not a positive
            integer, ``d_model`` not divisible by ``nhead`` (or odd with sinusoidal positions).
    """
    from lsgd.models.transformer_mt import DIMS, POSITIONS, SIZES

    if cfg["size"] not in SIZES:
        raise ConfigError(f"model.size must be one of {', '.join(SIZES)}; got {cfg['size']!r}")
    if cfg["positions"] not in POSITIONS:
        raise ConfigError(f"model.positions must be one of {', '.join(POSITIONS)}; got {cfg['positions']!r}")
    for key in ("norm_first", "share_embeddings"):
        if not isinstance(cfg[key], bool):
            raise ConfigError(f"model.{key} must be true or false; got {cfg[key]!r}")
    dims = {k: cfg[k] if cfg[k] is not None else SIZES[cfg["size"]][k] for k in DIMS}
    for key in DIMS[:-1]:
        if not _is_int(dims[key], 1):
            raise ConfigError(f"model.{key} must be null (from model.size) or an integer >= 1; got {dims[key]!r}")
    if dims["d_model"] % dims["nhead"]:
        raise ConfigError(f"model.d_model ({dims['d_model']}) must be divisible by model.nhead ({dims['nhead']})")
    if cfg["positions"] == "sinusoidal" and dims["d_model"] % 2:
        raise ConfigError(f"model.positions=sinusoidal needs an even model.d_model; got {dims['d_model']}")
    return dims


def _is_int(v, lo: int) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= lo


def check_compatible(model_cfg: dict, info: DatasetInfo) -> None:
    """Check that the model fits the dataset.

    Raises:
        ConfigError: invalid model config (see :func:`resolve`); a classification model on a
            language-modeling set or the reverse; cnn on images larger than 64 px; vgg16 on
            images smaller than 32 px. The message names model.name and dataset.name.
    """
    cfg = resolve(model_cfg)
    name = cfg["name"]
    if name in MT_MODELS or info.task == "translation":
        if name not in MT_MODELS:
            raise ConfigError(
                f"dataset.name={info.name} is translation (sentence pairs) but model.name={name} is not an "
                f"encoder-decoder model; use model.name={' or '.join(MT_MODELS)}"
            )
        if info.task != "translation" or info.src_len is None or info.pad_id is None:
            raise ConfigError(
                f"model.name={name} is an encoder-decoder translation model but dataset.name={info.name} is "
                f"{info.task}; use dataset.name=wmt17"
            )
        return
    if name in LM_MODELS:
        if info.task != "lm":
            raise ConfigError(
                f"model.name={name} is a language model but dataset.name={info.name} is {info.task}; "
                f"use a classification model ({', '.join(m for m in MODELS if MODELS.entry(m).extra['task'] == 'classification')}) or dataset.name=c4 or text"
            )
        return
    if info.task != "classification" or len(info.input_shape) != 3:
        raise ConfigError(
            f"model.name={name} is an image classifier but dataset.name={info.name} is {info.task}; "
            f"use model.name={' or '.join(LM_MODELS)}"
        )
    _, h, w = info.input_shape
    if name == "cnn" and max(h, w) > CNN_MAX_SIDE:
        raise ConfigError(
            f"model.name=cnn is for small images (<= {CNN_MAX_SIDE} px) but dataset.name={info.name} has "
            f"{h}x{w}; use model.name=resnet18 or resnet50"
        )
    if name == "cnn" and min(h, w) < 2 ** len(cfg["channels"]):
        raise ConfigError(f"model.name=cnn pools {len(cfg['channels'])} times; dataset.name={info.name} images ({h}x{w}) are too small")
    if name == "vgg16" and min(h, w) < 32:
        raise ConfigError(
            f"model.name=vgg16 halves the image 5 times and needs >= 32x32 input; dataset.name={info.name} has "
            f"{h}x{w}; use model.name=cnn or resnet20"
        )
    if name in ("resnet20", "resnet56") and min(h, w) < 8:
        raise ConfigError(f"model.name={name} needs >= 8x8 input; dataset.name={info.name} has {h}x{w}")


def build_model(model_cfg: dict, info: DatasetInfo) -> nn.Module:
    """Build the configured model for the dataset (randomly initialized, on CPU).

    Returns:
        classification: module mapping (B, C, H, W) float to (B, num_classes) logits;
        lm: module mapping (B, T) int64 (T <= seq_len) to (B, T, vocab) logits;
        translation: module mapping (B, src_len + tgt_len) int64 to (B, tgt_len, vocab) logits.
    Raises:
        ConfigError: see :func:`check_compatible`.
    """
    check_compatible(model_cfg, info)
    cfg = resolve(model_cfg)
    return MODELS[cfg["name"]](cfg, info)


@_model("cnn", "CNN", "classification", {"channels": [16, 32], "hidden": 128, "channels_last": False})
def _cnn(cfg: dict, info: DatasetInfo) -> nn.Module:
    from lsgd.models.cnn import SmallCNN

    return SmallCNN(info.input_shape, info.num_classes, cfg["channels"], cfg["hidden"])


@_model("logreg", "logistic regression", "classification", {"init": "zeros"})
def _logreg(cfg: dict, info: DatasetInfo) -> nn.Module:
    from lsgd.models.logreg import LogisticRegression

    return LogisticRegression(info.input_shape, info.num_classes, cfg["init"])


def _cifar_resnet(cfg: dict, info: DatasetInfo) -> nn.Module:
    from lsgd.models.resnet_cifar import CifarResNet

    return CifarResNet(int(cfg["name"][6:]), info.num_classes, info.input_shape[0], cfg["shortcut"])


for _depth in (20, 56):
    _model(f"resnet{_depth}", f"ResNet-{_depth}", "classification", {"shortcut": "A", "channels_last": False})(_cifar_resnet)


@_model("vgg16", "VGG-16", "classification", {"batch_norm": False, "dropout": 0.5, "channels_last": False})
def _vgg16(cfg: dict, info: DatasetInfo) -> nn.Module:
    return _torchvision_model(cfg, info)


@_model("lstm_lm", "LSTM LM", "lm",
        {"num_layers": 2, "embed_dim": 256, "hidden_dim": 256, "dropout": 0.2, "tie_weights": True})
def _lstm_lm(cfg: dict, info: DatasetInfo) -> nn.Module:
    from lsgd.models.lstm import LSTMLM

    return LSTMLM(info.num_classes, cfg["embed_dim"], cfg["hidden_dim"], cfg["num_layers"], cfg["dropout"], cfg["tie_weights"])


@_model("gpt", "GPT", "lm", {"size": "tiny", "dropout": 0.0, "bias": True, "n_layer": None, "n_head": None, "n_embd": None,
                             "vocab_multiple": 1})
def _gpt(cfg: dict, info: DatasetInfo) -> nn.Module:
    from lsgd.models.gpt import GPT, SIZES

    n_layer, n_head, n_embd = (
        cfg[key] if cfg[key] is not None else d for key, d in zip(("n_layer", "n_head", "n_embd"), SIZES[cfg["size"]])
    )
    return GPT(info.num_classes, info.input_shape[0], n_layer, n_head, n_embd, cfg["dropout"], cfg["bias"],
               int(cfg.get("vocab_multiple") or 1))


@_model("transformer_mt", "Transformer", "translation",
        {"size": "tiny", "d_model": None, "nhead": None, "num_encoder_layers": None, "num_decoder_layers": None,
         "dim_feedforward": None, "dropout": None, "positions": "sinusoidal", "norm_first": False,
         "share_embeddings": True})
def _transformer_mt(cfg: dict, info: DatasetInfo) -> nn.Module:
    from lsgd.models.transformer_mt import TransformerMT

    return TransformerMT(
        info.num_classes, info.src_len, info.input_shape[0] - info.src_len, info.pad_id, **transformer_mt_dims(cfg),
        positions=cfg["positions"], norm_first=cfg["norm_first"], share_embeddings=cfg["share_embeddings"],
    )


def _torchvision_model(cfg: dict, info: DatasetInfo) -> nn.Module:
    import torchvision

    name, c = cfg["name"], info.input_shape[0]
    if name == "vgg16":
        ctor = torchvision.models.vgg16_bn if cfg["batch_norm"] else torchvision.models.vgg16
        model = ctor(weights=None, num_classes=info.num_classes, dropout=cfg["dropout"])
        if c != 3:
            model.features[0] = nn.Conv2d(c, 64, kernel_size=3, padding=1)
        return model
    model = getattr(torchvision.models, name)(weights=None, num_classes=info.num_classes)
    if c != 3:
        model.conv1 = nn.Conv2d(c, 64, kernel_size=7, stride=2, padding=3, bias=False)
    return model


for _name, _label in (("resnet18", "ResNet-18"), ("resnet50", "ResNet-50"), ("resnet101", "ResNet-101")):
    _model(_name, _label, "classification", {"channels_last": False})(_torchvision_model)
