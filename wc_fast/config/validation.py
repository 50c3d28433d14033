"""Validation of a run config: every impossible value raises ``ValueError`` naming the field
and what was expected, before anything is built."""

from __future__ import annotations

import math
import typing
from typing import Literal

from wc_fast.config.fields import section_types
from wc_fast.config.files import NEEDS_MODEL_PATH, PRESETS
from wc_fast.config.schema import LOGGERS, Config, ModelConfig, PretrainRun, sections

# the reward.if_reader names that read with the reward estimator, which reward.reader_checkpoint
# may replace by an estimator file
ESTIMATOR_READERS = ("estimator", "agreement", "ensemble")


def _require(ok: bool, path: str, expected: str, value: object) -> None:
    if not ok:
        raise ValueError(f"config {path} must be {expected}, got {value!r}")


def _is_item(value: object, kind: object) -> bool:
    """Whether ``value`` fits the item type of the tuple type ``kind`` (str, or a number)."""
    if typing.get_args(kind)[0] is str:
        return isinstance(value, str)
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_types(cfg: Config | PretrainRun) -> None:
    for name in sections(type(cfg)):
        _check_section_types(name, getattr(cfg, name))


def _check_section_types(name: str, section: object) -> None:
    for key, kind in section_types(section).items():
        value = getattr(section, key)
        path = f"{name}.{key}"
        if typing.get_origin(kind) is Literal:
            _choices(path, value, typing.get_args(kind))
            continue
        if typing.get_origin(kind) is tuple:
            ok = isinstance(value, tuple) and all(_is_item(v, kind) for v in value)
        elif kind is float:
            ok = isinstance(value, (int, float)) and not isinstance(value, bool) \
                and math.isfinite(value)
        elif kind is int:
            ok = isinstance(value, int) and not isinstance(value, bool)
        else:
            ok = isinstance(value, kind if isinstance(kind, type) else object)
        _require(ok, path, f"of type {getattr(kind, '__name__', kind)}", value)


def validate_model(m: ModelConfig) -> None:
    """Raise ``ValueError`` naming the field for an impossible model (also one read from a
    model card or a checkpoint, before it is built)."""
    _check_section_types("model", m)
    for path, value in (("model.resolution", m.resolution), ("model.channels", m.channels),
                        ("model.clip_frames", m.clip_frames), ("model.patch", m.patch),
                        ("model.dim", m.dim), ("model.depth", m.depth),
                        ("model.heads", m.heads)):
        _require(value >= 1, path, "an integer >= 1", value)
    _require(m.resolution % m.patch == 0, "model.resolution",
             f"a multiple of model.patch={m.patch}", m.resolution)
    _require(m.dim % m.heads == 0, "model.dim", f"a multiple of model.heads={m.heads}", m.dim)
    _require(0.0 <= m.context_sigma < 1.0, "model.context_sigma", "in [0, 1)", m.context_sigma)
    _require(m.history_window >= 0, "model.history_window", "an integer >= 0 (0 = the whole "
             "history)", m.history_window)
    _require(m.history_window == 0 or m.backbone != "worldplay", "model.history_window",
             "0 with model.backbone 'worldplay' (its cache chooses its own memory frames)",
             m.history_window)


# the memory a config may ask of one rank before validation refuses it as a mistake: more than
# any single machine holds, so a real run is never refused
MAX_GIB_PER_RANK = 1024
# fp32 copies of each trained weight a tiny-backbone run holds: current and old model, the
# gradient and two optimizer moments
_WEIGHT_COPIES = 5


def memory_estimate(cfg: Config) -> dict[str, float]:
    """A lower bound of the GiB one rank holds, by what holds it: ``weights`` (the embedded
    model's ``12 dim^2`` weights per block, in every copy a run keeps; 0 for a Wan backbone,
    sized by its files) and ``rollout`` (the fp32 frames of every candidate of every group of
    the rank, over all clips)."""
    m, ro = cfg.model, cfg.rollout
    weights = 12 * m.dim ** 2 * m.depth * _WEIGHT_COPIES * 4 if m.backbone == "tiny" else 0
    frames = (ro.groups_per_rank * ro.group_size * ro.num_clips * m.clip_frames * m.channels
              * m.resolution ** 2 * 4)
    return {"weights": weights / 2**30, "rollout": frames / 2**30}


def _validate_sizes(cfg: Config) -> None:
    """Refuse sizes no machine could hold (a typo like ``rollout.group_size 1e8``), saying how
    much memory they would need."""
    need = memory_estimate(cfg)
    total = sum(need.values())
    if total > MAX_GIB_PER_RANK:
        raise ValueError(
            f"config sizes need at least {total:,.0f} GiB per rank, over the "
            f"{MAX_GIB_PER_RANK} GiB validation accepts: the rollout's frames "
            f"(rollout.groups_per_rank x rollout.group_size x rollout.num_clips x "
            f"model.clip_frames x model.channels x model.resolution^2 x 4 bytes) "
            f"{need['rollout']:,.1f} GiB, the weights in {_WEIGHT_COPIES} fp32 copies "
            f"(12 x model.dim^2 x model.depth) {need['weights']:,.1f} GiB; lower the "
            "field that is too large")


def _choices(path: str, value: object, options: tuple[str, ...]) -> None:
    _require(value in options, path, f"one of {options}", value)


def _validate_grpo(cfg: Config) -> None:
    """The ``grpo`` section, and what ``train.update flow_grpo`` needs of the rollout."""
    gr, ro = cfg.grpo, cfg.rollout
    _require(0.0 <= gr.clip_range < 1.0, "grpo.clip_range", "in [0, 1)", gr.clip_range)
    _require(gr.adv_clip_max > 0, "grpo.adv_clip_max", "> 0", gr.adv_clip_max)
    _require(gr.kl_beta >= 0, "grpo.kl_beta", ">= 0 (0 = no reference model)", gr.kl_beta)
    _require(0.0 < gr.timestep_fraction <= 1.0, "grpo.timestep_fraction", "in (0, 1]",
             gr.timestep_fraction)
    # the sampler's last step (to sigma 0) is always deterministic
    _require(0 <= gr.window <= ro.steps - 1, "grpo.window",
             f"an integer in [0, rollout.steps - 1 = {ro.steps - 1}] (0 = every step)",
             gr.window)
    if cfg.train.update != "flow_grpo":
        return
    _require(ro.steps >= 2, "rollout.steps (with train.update flow_grpo)",
             "an integer >= 2 (the last step is deterministic, so one step has no noise)",
             ro.steps)
    _require(ro.sde_noise > 0, "rollout.sde_noise (with train.update flow_grpo)",
             "> 0 (the SDE's noise level)", ro.sde_noise)
    _choices("rollout.candidate_noise (with train.update flow_grpo; grpo.same_noise and "
             "grpo.window set how the candidates' noise differs)", ro.candidate_noise,
             ("independent",))
    _choices("rollout.mode (with train.update flow_grpo)", ro.mode, ("clip",))
    _require(ro.candidate_chunk == 0, "rollout.candidate_chunk (with train.update flow_grpo)",
             "0 (the recorded SDE steps sample the whole group at once)", ro.candidate_chunk)


def _validate_decouple(cfg: Config) -> None:
    """The periodic decoupled phase of section ``reward``: its schedule and prompt filter."""
    rw, keys = cfg.reward, cfg.rollout.composite_keys
    _require(rw.decouple_every >= 0, "reward.decouple_every", "an integer >= 0 (0 = off)",
             rw.decouple_every)
    _require(1 <= rw.decouple_min_keys <= 4, "reward.decouple_min_keys",
             "an integer in [1, 4]", rw.decouple_min_keys)
    if rw.decouple_every == 0:
        return
    _require(1 <= rw.decouple_length < rw.decouple_every, "reward.decouple_length",
             f"an integer in [1, reward.decouple_every - 1 = {rw.decouple_every - 1}]",
             rw.decouple_length)
    _require(rw.decouple_min_keys <= max(keys), "reward.decouple_min_keys",
             f"at most the largest rollout.composite_keys ({max(keys)}), so that high-motion "
             "prompts exist", rw.decouple_min_keys)


def _validate_model_backbone(m: ModelConfig) -> None:
    """``model.path`` only for a Wan or WorldPlay backbone, which needs one unless it is the
    embedded Wan model, and such a model uses only what is built for it: no motion latents, no
    pose branch (the tiny model's warp head). The embedded Wan model (empty ``model.path``)
    predicts the velocity of pixel frames, and its head width must suit Wan's 3-D rotary
    embedding."""
    _require(m.lora_rank >= 0, "model.lora_rank", "an integer >= 0 (0 = no LoRA)", m.lora_rank)
    _require(m.lora_alpha >= 0, "model.lora_alpha", ">= 0 (0 = the rank)", m.lora_alpha)
    if m.backbone == "tiny":
        _require(not m.path, "model.path", "empty with model.backbone 'tiny' (it names the "
                 "directory of a Wan backbone)", m.path)
        _require(m.lora_rank == 0, "model.lora_rank", "0 with model.backbone 'tiny' (LoRA "
                 "adapts the linears of a Wan backbone)", m.lora_rank)
        _require(not m.prompt_embeds, "model.prompt_embeds", "empty with model.backbone 'tiny' "
                 "(it is a Wan backbone's text conditioning)", m.prompt_embeds)
        return
    with_backbone = f"(with model.backbone {m.backbone})"
    _require(not m.motion_latent, f"model.motion_latent {with_backbone}", "false",
             m.motion_latent)
    _require(not m.pose_branch, f"model.pose_branch {with_backbone}", "false", m.pose_branch)
    if m.backbone == "wan" and not m.path:
        _validate_embedded_wan(m)
        return
    _require(bool(m.path), "model.path", f"a local model directory (transformer/ and vae/) "
             f"with model.backbone {m.backbone!r}", m.path)


def _validate_backbone(cfg: Config) -> None:
    """The model (:func:`_validate_model_backbone`), and what an RL run of a Wan or WorldPlay
    backbone may ask: no end-of-run evaluation (it evaluates the tiny model); a pretrained
    backbone (``model.path``) starts from its weights, and LoRA adapts only it, where it
    decides what trains."""
    m, tr = cfg.model, cfg.train
    if cfg.preset in NEEDS_MODEL_PATH:
        # these presets size a real backbone; an empty path is not the embedded Wan model
        _require(bool(m.path), "model.path", f"a local model directory with preset "
                 f"{cfg.preset!r} (the embedded Wan model is --base wan)", m.path)
    _validate_model_backbone(m)
    if m.backbone == "tiny":
        return
    with_backbone = f"(with model.backbone {m.backbone})"
    _require(not tr.eval_at_end, f"train.eval_at_end {with_backbone}", "false",
             tr.eval_at_end)
    if m.backbone == "wan" and not m.path:
        return
    _require(tr.init == "base", f"train.init {with_backbone} and a model.path", "'base' (the "
             "backbone in model.path, with zero-initialised action layers)", tr.init)
    if m.lora_rank:
        _require(len(m.lora_targets) >= 1 and all(m.lora_targets), "model.lora_targets",
                 "a non-empty tuple of module names (with model.lora_rank > 0)", m.lora_targets)
        _require(cfg.optim.trainable == "all", "optim.trainable (with model.lora_rank > 0)",
                 "'all' (LoRA trains its adapters and the conditioning parameters)",
                 cfg.optim.trainable)
        # a 2-rank FSDP2 run of a LoRA model (frozen and trained weights in one unit)
        # deadlocked in testing; DDP is tested to equal one process
        _require(tr.distributed == "ddp", "train.distributed (with model.lora_rank > 0)",
                 "'ddp'", tr.distributed)


def _validate_embedded_wan(m: ModelConfig) -> None:
    """The embedded Wan world model (``model.backbone wan``, empty ``model.path``); every error
    names both, since a missing ``model.path`` is the other way to fix it."""
    which = "(with the embedded Wan model: model.backbone wan and no model.path)"
    _require(m.prediction == "velocity", f"model.prediction {which}",
             "'velocity' (it has no warp head)", m.prediction)
    _require(m.lora_rank == 0, f"model.lora_rank {which}", "0 (LoRA adapts a backbone read from "
             "model.path)", m.lora_rank)
    _require(not m.prompt_embeds, f"model.prompt_embeds {which}", "empty (its text conditioning "
             "is one fixed zero token)", m.prompt_embeds)
    # Wan's rotary embedding gives the frame, row and column axes even slices of a head
    _require(m.dim % m.heads == 0 and (m.dim // m.heads) % 2 == 0 and m.dim // m.heads >= 6,
             f"model.dim {which}", f"model.heads={m.heads} times an even head width >= 6", m.dim)


def validate(cfg: Config) -> None:
    """Raise ``ValueError`` naming the field for any impossible value."""
    _choices("preset", cfg.preset, PRESETS)
    _check_types(cfg)
    m, ro, rw, nf, up, op, em, tr = (cfg.model, cfg.rollout, cfg.reward, cfg.nft, cfg.update,
                                     cfg.optim, cfg.ema, cfg.train)
    validate_model(m)
    for path, value in (("rollout.groups_per_rank", ro.groups_per_rank),
                        ("rollout.num_clips", ro.num_clips), ("rollout.steps", ro.steps),
                        ("reward.vq_stride", rw.vq_stride), ("train.steps", tr.steps),
                        ("train.ckpt_every", tr.ckpt_every),
                        ("train.keep_last", tr.keep_last),
                        ("train.max_bad_updates", tr.max_bad_updates),
                        ("optim.updates_per_iteration", op.updates_per_iteration)):
        _require(value >= 1, path, "an integer >= 1", value)
    _validate_backbone(cfg)
    _require(tr.reader_gap_every >= 0, "train.reader_gap_every", "an integer >= 0 (0 = never)",
             tr.reader_gap_every)
    _require(ro.group_size >= 2, "rollout.group_size", "an integer >= 2", ro.group_size)
    _require(ro.candidate_chunk >= 0, "rollout.candidate_chunk",
             "an integer >= 0 (0 = the whole group at once)", ro.candidate_chunk)
    _validate_sizes(cfg)
    _require(ro.shift > 0, "rollout.shift", "> 0", ro.shift)
    _require(0.0 <= ro.sde_noise <= 1.0, "rollout.sde_noise", "in [0, 1]", ro.sde_noise)
    _require(0.0 <= ro.composite_fraction <= 1.0, "rollout.composite_fraction", "in [0, 1]",
             ro.composite_fraction)
    _require(0.0 <= ro.noise_warp <= 1.0, "rollout.noise_warp", "in [0, 1] (0 = off)",
             ro.noise_warp)
    _require(ro.warp_exploration >= 0.0, "rollout.warp_exploration", ">= 0 (0 = off)",
             ro.warp_exploration)
    if ro.warp_exploration > 0:
        _require(m.backbone == "tiny" and m.prediction == "warp",
                 "model.prediction (with rollout.warp_exploration)", "'warp' on the embedded "
                 "model (the offset moves its warp head's affine flow)", m.prediction)
        _require(cfg.train.update == "nft", "train.update (with rollout.warp_exploration)",
                 "'nft'", cfg.train.update)
    _require(ro.action_exploration >= 0.0, "rollout.action_exploration", ">= 0 (0 = off)",
             ro.action_exploration)

    _require(len(ro.composite_keys) >= 1 and set(ro.composite_keys) <= {2, 3, 4}
             and all(isinstance(k, int) for k in ro.composite_keys), "rollout.composite_keys",
             "a non-empty subset of (2, 3, 4)", ro.composite_keys)

    _require(0.0 <= rw.lam <= 1.0, "reward.lam", "in [0, 1]", rw.lam)
    _require(rw.Z > 0, "reward.Z", "> 0", rw.Z)
    _require(len(rw.trajectory_weights) == 2 and all(w >= 0 for w in rw.trajectory_weights),
             "reward.trajectory_weights", "two numbers >= 0 (translation, rotation)",
             rw.trajectory_weights)
    _require(rw.rot_threshold_deg >= 0, "reward.rot_threshold_deg", ">= 0",
             rw.rot_threshold_deg)
    _require(len(rw.trans_thresholds) >= 1 and all(t >= 0 for t in rw.trans_thresholds),
             "reward.trans_thresholds", "a non-empty tuple of numbers >= 0",
             rw.trans_thresholds)
    _validate_decouple(cfg)
    for path, value, needed_by in (("reward.reader_checkpoint", rw.reader_checkpoint,
                                    ("reward.if_reader", rw.if_reader, "depth_anything_3")),
                                   ("reward.critic_checkpoint", rw.critic_checkpoint,
                                    ("reward.critic", rw.critic, "hpsv3"))):
        field, chosen, adapter = needed_by
        if chosen == adapter:
            _require(bool(value), path, f"a local checkpoint path with {field} {adapter}",
                     value)
        elif path == "reward.reader_checkpoint" and chosen in ESTIMATOR_READERS:
            _require(not value or value.endswith(".safetensors"), path,
                     "empty (the shipped reward estimator) or an estimator's .safetensors file "
                     f"with {field} {chosen}", value)
        else:
            _require(not value, path, f"empty unless {field} is {adapter}", value)
    if rw.if_reader == "render":
        _require(ro.num_clips == 1, "rollout.num_clips (with reward.if_reader render)",
                 "1 (the reader starts from the prompt's known pose)", ro.num_clips)
        _require(rw.decouple_every == 0, "reward.decouple_every (with reward.if_reader render)",
                 "0 (the reader redraws each group's scene from its prompt's seed)",
                 rw.decouple_every)
    _require(nf.beta > 0, "nft.beta", "> 0", nf.beta)
    _require(nf.kl_beta >= 0, "nft.kl_beta", ">= 0 (0 = no reference model)", nf.kl_beta)
    _require(nf.keep >= 1 and 2 * nf.keep <= ro.group_size, "nft.keep",
             f"an integer >= 1 with 2*keep <= rollout.group_size={ro.group_size}", nf.keep)
    _require(0.0 < nf.timestep_fraction <= 1.0, "nft.timestep_fraction", "in (0, 1]",
             nf.timestep_fraction)
    _require(up.micro_batch >= 0, "update.micro_batch", ">= 0 (0 = automatic)", up.micro_batch)
    _validate_grpo(cfg)
    _require(op.lr > 0, "optim.lr", "> 0", op.lr)
    _require(op.weight_decay >= 0, "optim.weight_decay", ">= 0", op.weight_decay)
    _require(op.grad_clip >= 0, "optim.grad_clip", ">= 0 (0 = off)", op.grad_clip)
    _require(0.0 <= em.start <= 1.0, "ema.start", "in [0, 1]", em.start)
    _require(0.0 <= em.end <= 1.0, "ema.end", "in [0, 1]", em.end)
    if tr.distributed == "fsdp2":
        _choices("rollout.capture (with train.distributed fsdp2)", ro.capture,
                 ("auto", "eager"))
        # micro-batches backpropagate through one cache graph several times, which FSDP2's
        # per-backward reshard frees
        _choices("update.context_kv (with train.distributed fsdp2)", up.context_kv,
                 ("recompute", "reuse"))
        _require(not up.compile, "update.compile (with train.distributed fsdp2)", "false",
                 up.compile)
    _require(bool(tr.out), "train.out", "a non-empty path", tr.out)
    _require(bool(tr.init), "train.init", "'base', 'random' or a weights path", tr.init)
    # a new model's zero-initialised gates and output head pass the conditioning no gradient
    _require(not (op.trainable == "conditioning" and tr.init == "random"), "optim.trainable",
             "'all' when train.init is 'random' (a new model's zero-initialised output head "
             "passes no gradient to the conditioning)", op.trainable)
    _require(tr.eval_sequences >= 1, "train.eval_sequences", "an integer >= 1",
             tr.eval_sequences)
    _require(tr.eval_clips >= 1, "train.eval_clips", "an integer >= 1", tr.eval_clips)
    _require(tr.max_update_ratio >= 0, "train.max_update_ratio", ">= 0 (0 = off)",
             tr.max_update_ratio)
    _require(math.isfinite(tr.collective_timeout_s) and tr.collective_timeout_s > 0,
             "train.collective_timeout_s", "a finite number of seconds > 0",
             tr.collective_timeout_s)
    _require("jsonl" in tr.loggers and set(tr.loggers) <= set(LOGGERS)
             and len(set(tr.loggers)) == len(tr.loggers), "train.loggers",
             f"distinct names from {LOGGERS} including 'jsonl'", tr.loggers)


def validate_pretrain_run(run: PretrainRun) -> None:
    """Raise ``ValueError`` naming the field for any impossible value of a pretraining run."""
    _choices("preset", run.preset, PRESETS)
    _check_types(run)
    validate_model(run.model)
    _validate_model_backbone(run.model)
    pt = run.pretrain
    for path, value in (("pretrain.steps", pt.steps), ("pretrain.batch_size", pt.batch_size),
                        ("pretrain.num_clips", pt.num_clips), ("pretrain.ckpt_every",
                                                               pt.ckpt_every),
                        ("pretrain.eval_every", pt.eval_every),
                        ("pretrain.keep_last", pt.keep_last)):
        _require(value >= 1, path, "an integer >= 1", value)
    _require(pt.lr > 0, "pretrain.lr", "> 0", pt.lr)
    _require(pt.warmup >= 0, "pretrain.warmup", ">= 0", pt.warmup)
    _require(pt.weight_decay >= 0, "pretrain.weight_decay", ">= 0", pt.weight_decay)
    _require(pt.grad_clip >= 0, "pretrain.grad_clip", ">= 0 (0 = off)", pt.grad_clip)
    _require(0.0 <= pt.ema < 1.0, "pretrain.ema", "in [0, 1)", pt.ema)
    _require(pt.max_minutes >= 0, "pretrain.max_minutes", ">= 0 (0 = no limit)",
             pt.max_minutes)
    _require(0.0 <= pt.composite_fraction <= 1.0, "pretrain.composite_fraction", "in [0, 1]",
             pt.composite_fraction)
    _require(bool(pt.out), "pretrain.out", "a non-empty path", pt.out)
    _require(pt.shift > 0, "pretrain.shift", "> 0", pt.shift)
