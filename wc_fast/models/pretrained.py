"""The shipped base world models (``tiny`` and ``wan``): load them, or export a new one (with
its model card); the Wan backbone with its VAE from a local diffusers directory; and WorldPlay
with the HunyuanVideo-1.5 VAE."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from safetensors.torch import load_file, save_file
from torch.optim.swa_utils import AveragedModel

from wc_fast.config import Config, ModelConfig, PretrainRun, from_dict, validate_model
from wc_fast.infra import checkpoint
from wc_fast.infra.extras import require
from wc_fast.models.lora import import_peft
from wc_fast.models.protocol import FrameCodec, PixelFrames, WorldModel
from wc_fast.models.tiny.dit import DTYPES, TinyWorldDiT

if TYPE_CHECKING:
    from wc_fast.models.wan.model import WanWorldModel
    from wc_fast.models.worldplay.model import WorldPlayWorldModel

    # a world model built from a ModelConfig alone (no diffusers directory): what pretraining
    # trains and an exported weights file holds
    EmbeddedModel = TinyWorldDiT | WanWorldModel

ASSETS = Path(__file__).resolve().parent.parent / "assets"
BASE_WEIGHTS = ASSETS / "base_model.safetensors"
BASE_CARD = ASSETS / "base_model.json"
# the shipped base world models by name (``--base NAME``)
BASE_MODELS = {"tiny": BASE_WEIGHTS, "wan": ASSETS / "wan_base_model.safetensors"}


def new_world_model(cfg: ModelConfig, *, seed: int = 0) -> EmbeddedModel:
    """A randomly initialised embedded world model of ``cfg``: :class:`TinyWorldDiT` for
    ``model.backbone tiny``, the embedded :class:`WanWorldModel` for ``wan`` with an empty
    ``model.path`` (its key vectors drawn from ``seed``). A Wan backbone read from a diffusers
    directory raises ``ValueError`` naming ``model.path``."""
    if cfg.backbone == "tiny":
        return TinyWorldDiT(cfg)
    if cfg.path:
        raise ValueError(f"model.path {cfg.path!r} names a pretrained Wan backbone; an embedded "
                         "world model (built and pretrained here) needs an empty model.path")
    require("diffusers", user="model.backbone wan")
    from wc_fast.models.wan.embedded import embedded_wan_model

    return embedded_wan_model(cfg, seed=seed)


def load_world_model(weights: str | Path = BASE_WEIGHTS, *, device: torch.device | str = "cpu"
                     ) -> EmbeddedModel:
    """An embedded world model from ``weights`` (``.safetensors`` with a ``.json`` card beside):
    a :class:`TinyWorldDiT`, or the embedded :class:`WanWorldModel` when the card's
    ``model.backbone`` is ``wan``.

    The card holds the model config, validated before the model is built (``ValueError``
    naming the card and the field). Missing files raise ``FileNotFoundError`` naming the path
    and the command that produces them.
    """
    weights = Path(weights)
    card_path = weights.with_suffix(".json")
    for path in (weights, card_path):
        if not path.is_file():
            raise FileNotFoundError(f"world model file {path} not found; train one with "
                                    "`python -m wc_fast.pretrain [--base tiny|wan]` (it exports "
                                    "<out>/base_model.safetensors and .json)")
    model = new_world_model(_card_model(card_path))
    model.load_state_dict(load_file(weights))
    return model.to(device).eval()


def _card_model(card_path: Path) -> ModelConfig:
    """The model config of a model card: ``ValueError`` naming the card for malformed JSON, a
    missing ``model`` object, an unknown field or an impossible value."""
    try:
        card = json.loads(card_path.read_text())
        if not isinstance(card, dict) or not isinstance(card.get("model"), dict):
            raise ValueError("it holds no 'model' object")
        # JSON gives the config's tuples back as lists
        fields = {k: tuple(v) if isinstance(v, list) else v for k, v in card["model"].items()}
        unknown = sorted(set(fields) - set(ModelConfig.__slots__))
        if unknown:
            raise ValueError(f"unknown model fields {unknown}")
        cfg = ModelConfig(**fields)
        validate_model(cfg)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"model card {card_path} is invalid: {exc}") from exc
    return cfg


def checkpoint_config(path: Path, meta: dict) -> Config | PretrainRun:
    """The run config of checkpoint ``path`` (``meta``: its verified ``meta.json``);
    ``CheckpointError`` when it is invalid."""
    try:
        return from_dict(meta["config"])
    except (ValueError, TypeError, AttributeError) as exc:
        raise checkpoint.CheckpointError(f"checkpoint {path}: the config in meta.json is "
                                         f"invalid: {exc}") from exc


def _checkpoint_model(path: Path, cfg: ModelConfig, meta: dict) -> ModelConfig:
    """The model config ``cfg`` of checkpoint ``path``, refused with ``CheckpointError`` when
    its weights would not fit the files (so a damaged config cannot allocate a model of any
    size)."""
    with torch.device("meta"):
        need = sum(p.numel() * 4 for p in new_world_model(cfg).parameters())
    have = checkpoint.weights_bytes(path, meta)
    if need > have:
        raise checkpoint.CheckpointError(f"checkpoint {path}: meta.json's model config needs "
                                         f"{need:,} bytes of weights, its weights file holds "
                                         f"{have:,}: meta.json is damaged")
    return cfg


def load_base_model(name: str, device: torch.device | str = "cpu") -> EmbeddedModel:
    """The shipped base world model ``name`` (one of :data:`BASE_MODELS`: ``tiny``, ``wan``).

    A base whose weights are not in the package raises ``FileNotFoundError`` naming the
    command that pretrains it (``docs/base_model.md`` says which bases ship)."""
    if name not in BASE_MODELS:
        raise ValueError(f"base model must be one of {sorted(BASE_MODELS)}, got {name!r}")
    if not BASE_MODELS[name].is_file():
        raise FileNotFoundError(f"base model {name!r} is not shipped ({BASE_MODELS[name]} not "
                                f"found): pretrain it with `python -m wc_fast.pretrain --base "
                                f"{name} --out DIR` and pass DIR/base_model.safetensors as "
                                f"--checkpoint (wc_fast.eval) or --train.init (wc_fast.train)")
    return load_world_model(BASE_MODELS[name], device=device)


def export_world_model(model: EmbeddedModel, path: str | Path, card: dict) -> Path:
    """Write ``path`` (``.safetensors``) and its ``.json`` card (``card`` plus the model config)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    weights = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    save_file(weights, path)
    path.with_suffix(".json").write_text(json.dumps({**card, "model": asdict(model.cfg)},
                                                    indent=2))
    return path


def load_checkpoint_model(path: str | Path | None, device: torch.device, *, base: str = "tiny"
                          ) -> EmbeddedModel:
    """The shipped base model ``base`` (``path`` None), an exported ``.safetensors``, or a
    checkpoint directory: of ``wc_fast.train`` (its current model) or of ``wc_fast.pretrain``
    (its EMA weights, which are what pretraining exports); its ``meta.json`` config says which
    embedded model it holds."""
    if path is None:
        return load_base_model(base, device)
    path = Path(path)
    if path.is_dir():
        if not (path / "meta.json").is_file():
            raise FileNotFoundError(f"{path} holds no meta.json: not a wc_fast checkpoint")
        meta = checkpoint.verify(path)  # hashes and meta.json's shape, before anything is built
        if "base" in meta:
            return _partial_checkpoint_model(path, meta, device)
        cfg = checkpoint_config(path, meta)
        if cfg.model.path:  # a backbone read from its model directory, every weight trained
            model = initial_model(cfg, device)
            checkpoint.load(path, models={"model": model}, restore_rng=False)
            return model.eval()
        model = new_world_model(_checkpoint_model(path, cfg.model, meta)).to(device)
        if "ema" in meta["models"]:
            ema = AveragedModel(model, use_buffers=True)
            checkpoint.load(path, models={"ema": ema}, restore_rng=False)
            model = ema.module
        else:
            checkpoint.load(path, models={"model": model}, restore_rng=False)
        return model.eval()
    return load_world_model(path, device=device)


def _partial_checkpoint_model(path: Path, meta: dict, device: torch.device | str
                              ) -> WorldModel:
    """The current model of a training checkpoint that holds only the trained weights: the
    run's initial model (its config's ``train.init`` / ``model.path``), whose other weights
    must hash to the checkpoint's frozen base, with the trained ones loaded over it."""
    model = initial_model(checkpoint_config(path, meta), device)
    trained = set(checkpoint.read_weights(path, "model"))
    frozen = {k: v for k, v in model.state_dict().items() if k not in trained}
    base = checkpoint.FrozenBase(path=meta["base"]["path"],
                                 sha256=checkpoint.weights_sha256(frozen))
    checkpoint.load(path, models={"model": model}, restore_rng=False, base=base)
    return model.eval()


def load_prompt_embeds(path: str) -> torch.Tensor | None:
    """The tensor ``prompt_embeds`` of the ``.safetensors`` file ``path`` (``model.prompt_embeds``),
    or None (a fixed empty prompt) for an empty path; a missing file or tensor raises
    ``FileNotFoundError`` / ``ValueError`` naming it."""
    if not path:
        return None
    if not Path(path).is_file():
        raise FileNotFoundError(f"model.prompt_embeds: {path} not found (a .safetensors file "
                                f"with a tensor 'prompt_embeds' [1, L, text_dim])")
    tensors = load_file(path)
    if "prompt_embeds" not in tensors:
        raise ValueError(f"model.prompt_embeds: {path} holds no tensor 'prompt_embeds' (it has "
                         f"{sorted(tensors)})")
    return tensors["prompt_embeds"].float()


def load_wan_world_model(cfg: ModelConfig, device: torch.device | str = "cpu", *,
                         seed: int = 0) -> WanWorldModel:
    """The :class:`WanWorldModel` of ``cfg.path`` (its ``transformer/``, with fresh action
    layers drawn from ``seed`` whose projection is zero), on the latents of its ``vae/`` for
    ``cfg.resolution`` pixel frames, with LoRA adapters when ``cfg.lora_rank > 0``. Missing
    directories or files raise ``FileNotFoundError`` naming them, a missing ``peft``
    ``ValueError``."""
    require("diffusers", user="model.backbone wan")
    from wc_fast.models.wan.model import WanWorldModel
    from wc_fast.models.wan.vae import spatial_factor

    if cfg.lora_rank:
        import_peft()  # before loading a backbone that could not be adapted
    factor = spatial_factor(cfg.path)
    if cfg.resolution % factor:
        raise ValueError(f"model.resolution must be a multiple of the VAE's spatial factor "
                         f"{factor}, got {cfg.resolution}")
    side = cfg.resolution // factor
    model = WanWorldModel.from_pretrained(cfg.path, clip_frames=cfg.clip_frames,
                                          latent_size=(side, side),
                                          prompt_embeds=load_prompt_embeds(cfg.prompt_embeds),
                                          context_sigma=cfg.context_sigma, seed=seed,
                                          activation_checkpointing=cfg.activation_checkpointing,
                                          autocast_dtype=DTYPES[cfg.dtype],
                                          history_window=cfg.history_window)
    if cfg.lora_rank:
        model.add_lora(cfg.lora_rank, cfg.lora_alpha, cfg.lora_targets, seed=seed)
    return model.to(device)


def load_worldplay_states(path: str) -> dict[str, torch.Tensor]:
    """WorldPlay's fixed conditioning from the ``.safetensors`` file ``path``
    (``model.prompt_embeds``): ``prompt_embeds`` as ``text_states`` and, when present,
    ``vision_states`` (SigLIP tokens) and ``byt5_states`` (glyph tokens); empty for ``""``."""
    text = load_prompt_embeds(path)
    if text is None:
        return {}
    extra = load_file(path)
    return {"text_states": text, **{k: extra[k].float() for k in ("vision_states", "byt5_states")
                                    if k in extra}}


def load_worldplay_world_model(cfg: ModelConfig, device: torch.device | str = "cpu", *,
                               seed: int = 0) -> WorldPlayWorldModel:
    """The :class:`WorldPlayWorldModel` of ``cfg.path`` (its ``transformer/``, official layout)
    on the latents of its ``vae/`` for ``cfg.resolution`` pixel frames, conditioned on
    ``cfg.prompt_embeds``, with LoRA adapters when ``cfg.lora_rank > 0``."""
    require("diffusers", user="model.backbone worldplay")
    from wc_fast.models.worldplay.model import WorldPlayWorldModel
    from wc_fast.models.worldplay.vae import spatial_factor

    if cfg.lora_rank:
        import_peft()
    factor = spatial_factor(cfg.path)
    if cfg.resolution % factor:
        raise ValueError(f"model.resolution must be a multiple of the VAE's spatial factor "
                         f"{factor}, got {cfg.resolution}")
    side = cfg.resolution // factor
    model = WorldPlayWorldModel.from_pretrained(
        cfg.path, clip_frames=cfg.clip_frames, latent_size=(side, side),
        context_sigma=cfg.context_sigma, activation_checkpointing=cfg.activation_checkpointing,
        autocast_dtype=DTYPES[cfg.dtype], **load_worldplay_states(cfg.prompt_embeds))
    if cfg.lora_rank:
        model.add_lora(cfg.lora_rank, cfg.lora_alpha, cfg.lora_targets, seed=seed)
    return model.to(device)


def frame_codec(cfg: ModelConfig, device: torch.device | str = "cpu") -> FrameCodec:
    """The map between the model's frames and pixel frames: the identity for the embedded
    model, the VAE of ``cfg.path`` for a Wan or WorldPlay backbone read from there."""
    if cfg.backbone == "wan" and cfg.path:
        require("diffusers", user="model.backbone wan")
        from wc_fast.models.wan.vae import WanLatentCodec

        return WanLatentCodec.from_pretrained(cfg.path, pixel_size=cfg.resolution, device=device)
    if cfg.backbone == "worldplay":
        require("diffusers", user="model.backbone worldplay")
        from wc_fast.models.worldplay.vae import HunyuanLatentCodec

        return HunyuanLatentCodec.from_pretrained(cfg.path, pixel_size=cfg.resolution,
                                                  device=device)
    return PixelFrames()


# model fields that are choices of a run, not properties of the weights it starts from
RUN_CHOICES = ("dtype", "activation_checkpointing")


def initial_model(cfg: Config, device: torch.device | str) -> WorldModel:
    """The model RL starts from: the shipped base model of ``model.backbone`` (``--base``), a
    weights file, or a random init; for a Wan or WorldPlay backbone with a ``model.path``, the
    one there."""
    m = cfg.model
    if m.backbone == "wan" and m.path:
        return load_wan_world_model(m, device, seed=cfg.train.seed).train()
    if m.backbone == "worldplay":
        return load_worldplay_world_model(m, device, seed=cfg.train.seed).train()
    if cfg.train.init == "random":
        torch.manual_seed(cfg.train.seed)
        return new_world_model(m, seed=cfg.train.seed).to(device)
    if cfg.train.init == "base":
        path, model = BASE_MODELS[m.backbone], load_base_model(m.backbone, device)
    else:
        path = Path(cfg.train.init)
        model = load_world_model(path, device=device)
    if m.pose_branch and not model.cfg.pose_branch:
        model.add_pose_branch()  # zero-initialised: the loaded model is unchanged
    # the weights are fp32 whatever dtype they were trained in: model.dtype (the autocast
    # dtype of the matmuls) and activation checkpointing are choices of this run, every other
    # field must match the weights
    diffs = [f"model.{k}: weights {v!r} vs config {getattr(m, k)!r}"
             for k, v in dataclasses.asdict(model.cfg).items()
             if k not in RUN_CHOICES and getattr(m, k) != v]
    if diffs:
        raise ValueError(f"{path} does not match the configured model ({'; '.join(diffs)}); "
                         "use a matching --model.* or --train.init random")
    model.cfg = dataclasses.replace(model.cfg, **{k: getattr(m, k) for k in RUN_CHOICES})
    return model.train()
