"""Peak memory of an RL iteration's phases at a real model size, measured on fake tensors
(``FakeTensorMode``: shapes and dtypes, no storage), so a CPU with a few GB sizes a GPU run.

    python -m studies.memory [--preset P] [--model wan2.1-1.3b|worldplay-8b|tiny]
                             [--variants full,...] [--resolution 256] [--clip-frames 4]
                             [--group-size 12] [--steps 10] [--micro-batch 8]
                             [--lora-rank 16] [--kl | --no-kl] [--whole-copies]
                             [--largest N] [--nproc N] [--compare WAN_ITERATION_JSON]
                             [--json PATH]

``--preset P`` measures that preset's run: its backbone's model shape, resolution, clip frames,
group size, sampler steps, micro-batch, LoRA rank, checkpointing, trained weights and KL; each
flag given overrides it. Without it, the ``--model``'s preset at the flags' defaults (above)
with every weight, or every adapter and the conditioning, trained.

The trainer's own setup builds the run: the model (random weights in the backbone's real
shape; bf16 autocast over fp32 weights), its frozen weights cast to bf16
(``optim.hold_frozen_matrices_in``), the old model and with ``--kl`` the reference
(``optim.policy_copies``, as the trainer builds them: trained weights copied, frozen ones
shared), and the optimizers
(``--whole-copies``: whole copies and fp32 frozen matrices, the trainer before frozen weights
were shared). Then the phases of an iteration on clip 2 (a history of the prompt frame and one
clip), twice, the second measured (the first makes the gradients and optimizer states, which
stay alive from one update to the next, as in the trainer):

- rollout: the old model's history cache and ``--group-size`` candidates sampled over it by
  the ODE sampler, without gradient;
- decode: the candidates decoded to pixels by the VAE, as the rewards read them;
- update: one micro-batch of ``--micro-batch`` noisy clips: the current model's cache, its
  velocity with gradient, the old (and reference) velocity without, the NFT loss, the
  backward and every optimizer's step (their states are made there).

Every storage a tensor holds is counted from its creation to its release (its last reference
gone), and the peak is kept, by category at that moment (frozen parameters, trained
parameters, the old and reference models' own weights, gradients, optimizer states,
activations and the rest: ``CATEGORIES``, told apart by the storages' identity): what
``torch.cuda.max_memory_allocated`` measures on a device, less what a fake device cannot see
(the attention kernels' workspaces, the allocator's rounding and fragmentation, CUDA graphs)
and less the reward models. ``--compare`` puts
``studies.wan_iteration``'s measured peaks beside (the H200's in ``bench/results/``).

``--nproc N`` measures rank 0 of ``N`` under FSDP2 in this one process: a fake process group
(``torch.testing._internal.distributed.fake_pg``: collectives that move nothing) and the
trainer's own sharding (``wc_fast.infra.distributed.shard_model``) after it has put the model whole
on the device (the setup's peak), the old and reference models filled shard by shard from it
(``shard_frozen_copy``), the sharded parameters, gradients and optimizer states and each
unit's gathered parameters counted as the rank holds them.

``torch.distributed._tools.mem_tracker.MemTracker`` does the same by category, but refuses a
module that runs twice in one iteration, which every block here does (the history cache, then
the velocity); the count below is by storage alone.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import sys
import weakref
from pathlib import Path

import torch
import torch.distributed as dist
from torch._subclasses.fake_tensor import FakeTensorMode, unset_fake_temporarily
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from wc_fast import config as config_lib
from wc_fast.infra.distributed import shard_frozen_copy, shard_model
from wc_fast.infra.runtime import generator
from wc_fast.models.tiny.dit import DTYPES
from wc_fast.rl.optim import (
    build_optimizers,
    freeze_untrained,
    hold_frozen_matrices_in,
    policy_copies,
)
from wc_fast.rl.sampler import ClipSampler
from wc_fast.rl.updates import build_update
from wc_kernels import nft_loss

GIB = 2**30
# variant -> (LoRA adapters, activation checkpointing)
VARIANTS = {"full": (False, False), "checkpointing": (False, True), "lora": (True, False),
            "lora+checkpointing": (True, True)}


# what a live storage holds, by identity at the moment it is counted: the model's frozen
# parameters and buffers (the VAE's too), the trained parameters (their fp32 masters), the old
# and reference models' own copies, the gradients, the optimizers' states, and the rest
# (activations, caches, candidates, temporaries)
CATEGORIES = ("frozen_parameters", "trained_parameters", "old_reference", "gradients",
              "optimizer_state", "activations_other")
OTHER = CATEGORIES[-1]


class LiveBytes(TorchDispatchMode):
    """The bytes of every tensor storage alive under it, and their peak (each storage counted
    once, from the op that made it until it is freed), by category (:data:`CATEGORIES`:
    storages start as ``activations_other`` and :meth:`label` moves them), with each
    category's bytes at the moment of the peak. ``trace``: also keep, at the peak, every live
    storage's creating op, shape and dtype (:meth:`largest`)."""

    def __init__(self, trace: bool = False) -> None:
        super().__init__()
        self.live = self.peak = 0
        self.live_by = dict.fromkeys(CATEGORIES, 0)
        self.peak_by = dict(self.live_by)
        self.trace = trace
        self.at_peak: list[tuple[str, tuple[int, ...], str, int]] = []
        self._records: dict[int, list] = {}
        self._rising = False  # a new peak not yet traced
        self._seen: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def _free(self, key: int) -> None:
        if self._rising:  # the live set leaves a new peak: keep what it held
            self._keep_peak()
        nbytes, category = self._records.pop(key)[:2]
        self.live -= nbytes
        self.live_by[category] -= nbytes

    def _keep_peak(self) -> None:
        self.at_peak = [(op, shape, dtype, nbytes)
                        for nbytes, _, op, shape, dtype in self._records.values()]
        self._rising = False

    def _grow(self, record: list, nbytes: int) -> None:
        """Count ``nbytes`` more (or fewer) in ``record``'s storage."""
        if nbytes < 0 and self._rising:
            self._keep_peak()
        record[0] += nbytes
        self.live += nbytes
        self.live_by[record[1]] += nbytes
        if self.live > self.peak:
            self.peak = self.live
            self.peak_by = dict(self.live_by)
            self._rising = self.trace

    def _track(self, t: torch.Tensor, op: str = "") -> list:
        """The record ``[nbytes, category, op, shape, dtype]`` of ``t``'s storage, counted
        from now if it was not yet."""
        if isinstance(t, DTensor):  # its wrapper holds no memory: the rank's shard does
            t = t._local_tensor
        if t.is_meta:  # a structure not yet filled in (a copy before it is sharded)
            return [0, OTHER, op, tuple(t.shape), str(t.dtype)]
        storage = t.untyped_storage()
        key = self._seen.get(storage)
        if key is not None:
            return self._records[key]
        key = id(storage)
        self._seen[storage] = key
        self._records[key] = record = [0, OTHER, op, tuple(t.shape), str(t.dtype)]
        weakref.finalize(storage, self._free, key)
        self._grow(record, storage.nbytes())
        return record

    def resized(self, t: torch.Tensor) -> None:
        """Count ``t``'s storage at its size now: a storage resized in place (FSDP2 frees
        and reallocates a unit's gathered parameters so) runs no op this mode sees."""
        record = self._track(t)
        self._grow(record, t.untyped_storage().nbytes() - record[0])

    def label(self, tensors, category: str) -> None:
        """Count the storages of ``tensors`` (DTensors: their local shards) under
        ``category``, those not labelled yet (a storage two models share keeps its first
        label)."""
        if category not in CATEGORIES:
            raise ValueError(f"category must be one of {CATEGORIES}, got {category!r}")
        for t in tensors:
            if t is None:
                continue
            record = self._track(t)
            if record[1] == OTHER and category != OTHER:
                self.live_by[OTHER] -= record[0]
                self.live_by[category] += record[0]
                record[1] = category

    def reset_peak(self) -> None:
        self.peak = self.live
        self.peak_by = dict(self.live_by)
        if self.trace:
            self._keep_peak()

    def largest(self, count: int) -> list[tuple[int, str, tuple[int, ...], str, int]]:
        """The ``count`` largest groups of storages alive at the peak, by creating op, shape
        and dtype: ``(bytes, op, shape, dtype, storages)``, largest first (needs ``trace``)."""
        groups: dict[tuple, list[int]] = {}
        for op, shape, dtype, nbytes in self.at_peak:
            group = groups.setdefault((op, shape, dtype), [0, 0])
            group[0] += nbytes
            group[1] += 1
        rows = [(total, *key, n) for key, (total, n) in groups.items()]
        return sorted(rows, key=lambda row: -row[0])[:count]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                self._track(t, str(func))
        return out


def _wan_vae(shape: str):
    from diffusers import AutoencoderKLWan

    from studies.wan_iteration import SHAPES

    return AutoencoderKLWan(**SHAPES[shape]["vae"])


def _wan_codec(vae, pixel_size: int):
    from wc_fast.models.wan.vae import WanLatentCodec

    return WanLatentCodec(vae, pixel_size=pixel_size)


def _worldplay_vae(shape: str):
    from diffusers import AutoencoderKLHunyuanVideo15

    return AutoencoderKLHunyuanVideo15()


def _worldplay_codec(vae, pixel_size: int):
    from wc_fast.models.worldplay.vae import HunyuanLatentCodec

    return HunyuanLatentCodec(vae, pixel_size=pixel_size)


def _wan(cfg: config_lib.Config, shape: str):
    from diffusers import WanTransformer3DModel

    from studies.wan_iteration import SHAPES
    from wc_fast.models.wan.model import WanWorldModel

    m = cfg.model
    side = m.resolution // 8  # Wan's VAE: 8x spatial compression
    model = WanWorldModel(WanTransformer3DModel(**SHAPES[shape]["transformer"]),
                          clip_frames=m.clip_frames, latent_size=(side, side),
                          context_sigma=m.context_sigma, seed=cfg.train.seed,
                          activation_checkpointing=m.activation_checkpointing,
                          autocast_dtype=DTYPES[m.dtype])
    return model


def _worldplay(cfg: config_lib.Config, shape: str):
    from wc_fast.models.worldplay.model import WorldPlayConfig, WorldPlayWorldModel

    m = cfg.model
    side = m.resolution // 16  # HunyuanVideo's VAE: 16x spatial compression
    return WorldPlayWorldModel(WorldPlayConfig(), clip_frames=m.clip_frames,
                               latent_size=(side, side), context_sigma=m.context_sigma,
                               activation_checkpointing=m.activation_checkpointing,
                               autocast_dtype=DTYPES[m.dtype])


# --model -> (preset whose settings the run takes, builders of the model and of its VAE in
# that shape, the codec over the VAE)
MODELS = {"wan2.1-1.3b": ("wan", _wan, _wan_vae, _wan_codec),
          "tiny": ("wan", _wan, _wan_vae, _wan_codec),
          "worldplay-8b": ("worldplay_lora", _worldplay, _worldplay_vae, _worldplay_codec)}


def _materialise(modules: list[torch.nn.Module]) -> None:
    """Replace the meta parameters and buffers of ``modules`` by CPU tensors of zeros of the
    same shapes and dtypes (fake ones under ``FakeTensorMode``), one per meta tensor (so
    weights the modules share stay shared)."""
    made: dict[int, torch.Tensor] = {}
    for module in (sub for root in modules for sub in root.modules()):
        for table in (module._parameters, module._buffers):
            for name, t in table.items():
                if t is None:
                    continue
                if id(t) not in made:
                    zeros = torch.zeros_like(t, device="cpu")
                    made[id(t)] = (torch.nn.Parameter(zeros, requires_grad=t.requires_grad)
                                   if isinstance(t, torch.nn.Parameter) else zeros)
                table[name] = made[id(t)]


PHASES = ("rollout", "decode", "update")


class _Iteration:
    """The phases of one iteration on clip 2, as the trainer runs them, each's peak measured
    by ``counter``."""

    def __init__(self, cfg: config_lib.Config, model, copies, optimizers, sampler, codec,
                 history: torch.Tensor, counter: LiveBytes) -> None:
        self.cfg, self.model, self.copies, self.optimizers = cfg, model, copies, optimizers
        self.sampler, self.codec, self.history, self.counter = sampler, codec, history, counter
        frames = history.shape[1]
        self.history_actions = torch.zeros(1, frames, dtype=torch.long)
        self.actions = torch.zeros(cfg.model.clip_frames, dtype=torch.long)

    def _peak(self, count: int) -> dict:
        """The phase just run: its peak bytes, their categories and (``count`` > 0, a tracing
        counter) its largest live storages; the next phase's peak starts from here."""
        counter = self.counter
        phase = {"peak_bytes": counter.peak, "by_category": dict(counter.peak_by)}
        if count:
            phase["largest"] = [{"bytes": b, "op": op, "shape": list(shape), "dtype": dtype,
                                 "storages": n}
                                for b, op, shape, dtype, n in counter.largest(count)]
        counter.reset_peak()
        return phase

    def phases(self, largest: int = 0) -> dict[str, dict]:
        """Each phase's :meth:`_peak`: the rollout, the decoding for the rewards and the
        update."""
        ro, old, history = self.cfg.rollout, self.copies[0], self.history
        self.counter.reset_peak()
        out = {}
        with torch.no_grad():
            cache = old.build_cache_parallel(history, self.history_actions,
                                             sigma=old.context_sigma)
            clips = self.sampler.sample(cache, self.actions, num=ro.group_size,
                                        generator=generator(0, "memory")).clips
        out["rollout"] = self._peak(largest)
        # the rewards read the candidates decoded to pixels, the clip's context frame first
        context = history[:, -1:].expand(ro.group_size, -1, -1, -1, -1)
        frames = self.codec.decode(torch.cat([context, clips], dim=1))
        del frames
        out["decode"] = self._peak(largest)
        self._update(history, cache)
        out["update"] = self._peak(largest)
        return out

    def _update(self, history: torch.Tensor, cache) -> None:
        """One update of one micro-batch as ``Trainer.update`` runs it: the current model's
        history cache (``update.context_kv`` recompute) and the reference's, the velocities, the
        NFT loss and its backward; those caches and activations freed (``_accumulate``
        returns), then the guarded optimizer step, and the gradients freed after it."""
        model, old, refs = self.model, self.copies[0], self.copies[1:]
        rows = self.cfg.update.micro_batch
        for opt in self.optimizers:
            opt.zero_grad(set_to_none=True)
        x_t = torch.randn(rows, *model.clip_shape)
        sigma = torch.rand(rows)
        with torch.no_grad():
            current = model.build_cache_parallel(history, self.history_actions,
                                                 sigma=model.context_sigma)
            ref_caches = [ref.build_cache_parallel(history, self.history_actions,
                                                   sigma=ref.context_sigma) for ref in refs]
        v = model.velocity(x_t, sigma, self.actions, current)
        with torch.no_grad():
            v_old = old.velocity(x_t, sigma, self.actions, cache)
            v_refs = [ref.velocity(x_t, sigma, self.actions, c)
                      for ref, c in zip(refs, ref_caches, strict=True)]
        loss = nft_loss(v, v_old, torch.randn_like(v), torch.rand(rows), beta=1.0,
                        backend="reference")
        loss.backward()
        del current, ref_caches, v, v_old, v_refs, loss
        trained = [p for p in model.parameters() if p.requires_grad]
        self.counter.label([p.grad for p in trained], "gradients")
        # the trainer's step guard holds a copy of the trained weights during the step
        # (Trainer._guarded_step, train.max_update_ratio > 0)
        before = ([p.detach().clone() for p in trained]
                  if self.cfg.train.max_update_ratio > 0 else [])
        for opt in self.optimizers:
            opt.step()
            self.counter.label([t for state in opt.state.values() for t in state.values()
                                if isinstance(t, torch.Tensor)], "optimizer_state")
        self.after_step = {"peak_bytes": self.counter.live,
                           "by_category": dict(self.counter.live_by)}
        del before
        for opt in self.optimizers:
            opt.zero_grad(set_to_none=True)


def _label_setup(counter: LiveBytes, model, copies, vae) -> None:
    """Label what the setup made: the model's trained parameters, its frozen ones, buffers
    and the VAE's weights (frozen), and what the old and reference models hold of their own
    (the frozen weights they share keep the model's label)."""
    trained = [p for p in model.parameters() if p.requires_grad]
    counter.label(trained, "trained_parameters")
    counter.label([*model.parameters(), *model.buffers(), *vae.parameters(), *vae.buffers()],
                  "frozen_parameters")
    for c in copies:
        counter.label([*c.parameters(), *c.buffers()], "old_reference")


# the study's model of each backbone a preset names
BACKBONE_MODELS = {"wan": "wan2.1-1.3b", "worldplay": "worldplay-8b"}
# the values of the overriding flags when no --preset is given
DEFAULTS = {"resolution": 256, "clip_frames": 4, "group_size": 12, "steps": 10,
            "micro_batch": 8, "lora_rank": 16}


@contextlib.contextmanager
def _counting_fsdp_resizes(counter: LiveBytes):
    """FSDP2's storage resizes (``alloc_storage``, ``free_storage``: a unit's gathered
    parameters allocated before its forward and freed after it) told to ``counter``."""
    from torch.distributed.fsdp._fully_shard import _fsdp_param, _fsdp_param_group

    def counted(resize):
        def run(tensor: torch.Tensor) -> None:
            resize(tensor)
            counter.resized(tensor)
        return run

    saved = [(module, name, getattr(module, name)) for module in (_fsdp_param, _fsdp_param_group)
             for name in ("alloc_storage", "free_storage") if hasattr(module, name)]
    for module, name, resize in saved:
        setattr(module, name, counted(resize))
    try:
        yield
    finally:
        for module, name, resize in saved:
            setattr(module, name, resize)


def _join_fake_group(nproc: int) -> None:
    """Make this process rank 0 of ``nproc`` in a fake process group (its collectives move
    nothing), where FSDP2 shards and gathers as on one rank of ``nproc``."""
    if dist.is_initialized():
        if dist.get_world_size() != nproc:
            raise ValueError(f"--nproc {nproc}: this process already belongs to a group of "
                             f"{dist.get_world_size()}")
        return
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=nproc)


def study_model(args: argparse.Namespace) -> str:
    """``--model``, else the study's model of ``--preset``'s backbone, else Wan-1.3B."""
    if args.model:
        return args.model
    if args.preset:
        backbone = config_lib.build_preset(args.preset).model.backbone
        if backbone not in BACKBONE_MODELS:
            raise ValueError(f"--preset {args.preset!r}: backbone {backbone!r} has no model "
                             f"here (one of {sorted(BACKBONE_MODELS)}); give --model")
        return BACKBONE_MODELS[backbone]
    return "wan2.1-1.3b"


def run_config(args: argparse.Namespace, lora: bool | None, checkpointing: bool | None
               ) -> config_lib.Config:
    """The run measured: ``--preset`` as it is (or, without it, the ``--model``'s preset at
    :data:`DEFAULTS` with every weight, or every adapter and the conditioning, trained, as in
    ``studies.wan_iteration``), each flag given overriding it. A variant sets ``lora`` (LoRA
    adapters of ``--lora-rank``, else of the preset's rank) and ``checkpointing``; ``None``
    keeps the preset's."""
    preset = args.preset or MODELS[study_model(args)][0]
    cfg = config_lib.build_preset(preset)
    cfg.model.path = "random weights (studies/memory.py)"
    flags = {name: getattr(args, name) for name in DEFAULTS}
    if not args.preset:
        cfg.optim.trainable = "all"
        if args.nproc > 1:
            cfg.train.distributed = "fsdp2"
    if args.nproc < 1 or (args.nproc > 1 and cfg.train.distributed != "fsdp2"):
        raise ValueError(f"--nproc: 1, or more with train.distributed fsdp2 (the preset's is "
                         f"{cfg.train.distributed}), got {args.nproc}")
        flags = {name: DEFAULTS[name] if value is None else value
                 for name, value in flags.items()}
    m, ro = cfg.model, cfg.rollout
    for section, name in ((m, "resolution"), (m, "clip_frames"), (ro, "group_size"),
                          (ro, "steps"), (cfg.update, "micro_batch"), (m, "lora_rank")):
        if flags[name] is not None:
            setattr(section, name, flags[name])
    if lora is not None:
        m.lora_rank = (flags["lora_rank"] or m.lora_rank or DEFAULTS["lora_rank"]) if lora else 0
    if checkpointing is not None:
        m.activation_checkpointing = checkpointing
    cfg.nft.keep = min(cfg.nft.keep, ro.group_size // 2)
    if args.candidate_chunk is not None:
        ro.candidate_chunk = args.candidate_chunk
    if args.kl is not None:
        cfg.nft.kl_beta = (cfg.nft.kl_beta or 0.1) if args.kl else 0.0
    config_lib.validate(cfg)
    return cfg


def measure(args: argparse.Namespace, name: str | None, *, fake: bool = True) -> dict:
    """GiB and bytes after the setup and at the peak of each phase, by category, of variant
    ``name`` (``None``: the preset's own); ``fake`` False runs it on real CPU tensors (zeros),
    which checks the fake count at a small size."""
    lora, checkpointing = VARIANTS[name] if name else (None, None)
    cfg = run_config(args, lora, checkpointing)
    m, ro = cfg.model, cfg.rollout
    model_name = study_model(args)
    sharded = args.nproc > 1
    if sharded:
        _join_fake_group(args.nproc)
    # built on the meta device as the trainer builds it (LoRA, frozen matrices cast, the old
    # model; under FSDP2 whole copies and fp32 matrices): ``Module.to`` cannot swap fake
    # parameters, meta ones it can
    _, build_model, build_vae, build_codec = MODELS[model_name]
    with torch.device("meta"):
        model = build_model(cfg, model_name)
        vae = build_vae(model_name)
        if m.lora_rank:
            model.add_lora(m.lora_rank, m.lora_alpha, m.lora_targets, seed=cfg.train.seed)
        freeze_untrained(model, cfg.optim.trainable)
        if not (args.whole_copies or sharded):
            hold_frozen_matrices_in(model, DTYPES[m.dtype])
        rule = build_update(cfg)
        kl = rule.kl_beta > 0
        if args.whole_copies:
            copies = [copy.deepcopy(model).eval().requires_grad_(False)
                      for _ in range(2 if kl else 1)]
        else:
            # the trainer's own (under FSDP2 structures on the meta device until sharded,
            # distributed.shard_frozen_copy)
            old, ref = policy_copies(model, DTYPES[m.dtype], rule.reference, on_meta=sharded)
            copies = [old] if ref is None else [old, ref]
    counter = LiveBytes(trace=args.largest > 0)
    mode = FakeTensorMode(allow_non_fake_inputs=True) if fake else contextlib.nullcontext()
    resizes = _counting_fsdp_resizes(counter) if sharded else contextlib.nullcontext()
    with mode, counter, resizes:
        _materialise([model, *([] if sharded else copies), vae])
        _label_setup(counter, model, copies, vae)
        counter.reset_peak()  # the peak so far is what lives now, labelled
        if sharded:
            with unset_fake_temporarily():  # the mesh reads its ranks
                mesh = DeviceMesh.from_group(dist.group.WORLD, "cpu")
            # as the trainer: the model whole on the device, then sharded, then each copy's
            # shards filled from the model's
            shard_model(model, dist.group.WORLD, "cpu", mesh=mesh)
            _label_setup(counter, model, copies, vae)
            for structure in copies:
                shard_frozen_copy(structure, model, dist.group.WORLD, torch.device("cpu"),
                                  mesh=mesh)
                _label_setup(counter, model, copies, vae)
        for p in model.parameters():
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(
                    lambda q: counter.label([q.grad], "gradients"))
        codec = build_codec(vae, m.resolution)
        old = copies[0]
        optimizers = build_optimizers(model, cfg.optim)
        setup = {"peak_bytes": counter.peak, "by_category": dict(counter.peak_by)}
        setup_live = counter.live
        history = torch.randn(1, 1 + m.clip_frames, *model.clip_shape[1:])
        with unset_fake_temporarily():  # the sampler's schedule: plain numbers it reads
            sampler = ClipSampler(old, steps=ro.steps, shift=ro.shift, capture="eager",
                                  candidate_chunk=ro.candidate_chunk)
        run = _Iteration(cfg, model, copies, optimizers, sampler, codec, history, counter)
        run.phases()  # the first iteration makes the gradients and the optimizers' states
        by_phase = {"setup": setup, **run.phases(args.largest)}
        # what stays alive from one iteration to the next
        kept = {"peak_bytes": counter.live, "by_category": dict(counter.live_by)}
        after_step = run.after_step
        trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
        total = sum(p.numel() for p in model.parameters())
    top = max(by_phase, key=lambda phase: by_phase[phase]["peak_bytes"])
    peak = by_phase[top]["peak_bytes"]
    return {"variant": name or args.preset, "lora_rank": m.lora_rank,
            "activation_checkpointing": m.activation_checkpointing, "kl": kl,
            "resolution": m.resolution, "clip_frames": m.clip_frames,
            "group_size": ro.group_size, "candidate_chunk": ro.candidate_chunk,
            "steps": ro.steps, "micro_batch": cfg.update.micro_batch,
            "parameters": total, "trained_parameters": trained,
            "nproc": args.nproc, "setup_gib": setup_live / GIB,
            "rollout_peak_gib": by_phase["rollout"]["peak_bytes"] / GIB,
            "reward_peak_gib": by_phase["decode"]["peak_bytes"] / GIB,
            "update_peak_gib": by_phase["update"]["peak_bytes"] / GIB, "peak_gib": peak / GIB,
            "peak_bytes": peak, "peak_phase": top,
            "by_category": by_phase[top]["by_category"], "by_phase": by_phase,
            "after_step": after_step, "kept": kept}


def _print_categories(row: dict) -> None:
    """Each phase's peak by category, GiB."""
    print(f"{row['variant']}: GiB by category at each phase's peak")
    print(f"{'category':<20}" + "".join(f"{phase:>10}" for phase in row["by_phase"]))
    for category in (*CATEGORIES, "peak_bytes"):
        cells = [(phase["by_category"][category] if category in CATEGORIES
                  else phase["peak_bytes"]) / GIB for phase in row["by_phase"].values()]
        print(f"{'total' if category == 'peak_bytes' else category:<20}"
              + "".join(f"{c:>10.2f}" for c in cells))
    for name, phase in row["by_phase"].items():
        for item in phase.get("largest", []):
            print(f"  {name:<8}{item['bytes'] / 2**20:>10.1f} MiB {item['storages']:>5} x "
                  f"{item['op']} {tuple(item['shape'])} {item['dtype']}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default=None, choices=config_lib.PRESETS,
                        help="measure this preset's run (the flags below override it)")
    parser.add_argument("--model", default=None, choices=list(MODELS),
                        help="the model's shape (default: the preset's backbone's, else "
                             "wan2.1-1.3b)")
    parser.add_argument("--variants", default=None,
                        help=f"some of {list(VARIANTS)} (default: the preset's own setting "
                             f"with --preset, else all)")
    parser.add_argument("--resolution", type=int, help="frame side in pixels")
    parser.add_argument("--clip-frames", type=int, help="latent frames per clip")
    parser.add_argument("--group-size", type=int)
    parser.add_argument("--steps", type=int, help="sampler steps")
    parser.add_argument("--micro-batch", type=int)
    parser.add_argument("--candidate-chunk", type=int,
                        help="candidates the rollout samples at once (rollout.candidate_chunk)")
    parser.add_argument("--lora-rank", type=int)
    parser.add_argument("--kl", action=argparse.BooleanOptionalAction, default=None,
                        help="with (or without) the KL's reference model (default: the "
                             "preset's)")
    parser.add_argument("--whole-copies", action="store_true",
                        help="the trainer as it was before frozen weights were shared (the "
                             "code the H200 measured on 2026-12-04): old (and reference) "
                             "models as whole copies, frozen matrices in fp32")
    parser.add_argument("--largest", type=int, default=0, metavar="N",
                        help="list the N largest groups of storages alive at each phase's "
                             "peak, by creating op, shape and dtype")
    parser.add_argument("--compare", default=None, metavar="JSON",
                        help="a studies.wan_iteration JSON whose measured peaks to show beside")
    parser.add_argument("--nproc", type=int, default=1,
                        help="measure one rank of this many under FSDP2 (the preset's "
                             "train.distributed must be fsdp2)")
    parser.add_argument("--json", default=None, help="write the results here")
    args = parser.parse_args(argv)
    names: list[str | None] = ([None] if args.preset and args.variants is None else
                               [v for v in (args.variants or ",".join(VARIANTS)).split(",")
                                if v])
    if not names or set(names) - set(VARIANTS) - {None}:
        parser.error(f"--variants: expected some of {list(VARIANTS)}, got {args.variants!r}")
    measured = {}
    if args.compare:
        data = json.loads(Path(args.compare).read_text())
        measured = {row["variant"]: row["peak_mib"] / 1024 for row in data["variants"]}
    rows = [measure(args, name) for name in names]
    print(f"{'variant':<20}{'params B':>9}{'trained B':>10}{'setup':>8}{'rollout':>9}"
          f"{'decode':>8}{'update':>8}{'peak GiB':>9}{'peak GB':>8}{'device':>8}")
    for row in rows:
        device = measured.get(row["variant"])
        row["device_peak_gib"] = device
        print(f"{row['variant']:<20}{row['parameters'] / 1e9:>9.3f}"
              f"{row['trained_parameters'] / 1e9:>10.3f}{row['setup_gib']:>8.1f}"
              f"{row['rollout_peak_gib']:>9.1f}{row['reward_peak_gib']:>8.1f}"
              f"{row['update_peak_gib']:>8.1f}{row['peak_gib']:>9.1f}"
              f"{row['peak_bytes'] / 1e9:>8.1f}{'' if device is None else f'{device:.1f}':>8}")
    for row in rows:
        _print_categories(row)
    if args.json:
        first = rows[0]
        result = {"preset": args.preset, "nproc": args.nproc, "model": study_model(args),
                  "resolution": first["resolution"], "clip_frames": first["clip_frames"],
                  "group_size": first["group_size"], "steps": first["steps"],
                  "micro_batch": first["micro_batch"], "candidate_chunk": first["candidate_chunk"],
                  "kl": first["kl"],
                  "whole_copies": args.whole_copies, "compare": args.compare,
                  "peak_bytes": first["peak_bytes"], "by_category": first["by_category"],
                  "by_phase": first["by_phase"], "variants": rows}
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
