"""Each trainer option takes effect: one smoke iteration with spies on what reaches the loss,
the optimizers, the sampler and the caches."""

import dataclasses
import json

import pytest
import torch
from torch.optim import AdamW

from wc_fast import config as config_lib
from wc_fast.actions import split_action
from wc_fast.models import TinyWorldDiT
from wc_fast.rewards import interaction_score
from wc_fast.rewards import registry as reward_registry
from wc_fast.rl import trainer as trainer_module
from wc_fast.rl.advantages import group_advantages
from wc_fast.rl.ema import ema_decay
from wc_fast.rl.optim import GroupedMuon
from wc_fast.rl.trainer import Trainer
from wc_fast.rl.updates import nft as nft_module
from wc_fast.train import main
from wc_fast.world import sample_sequences

pytestmark = pytest.mark.usefixtures("one_thread")

KEEP = config_lib.preset("smoke").nft.keep
SMOKE_SIGMAS = config_lib.preset("smoke").rollout.steps  # schedule sigmas the loss draws from


def _ranked_scores(self, groups):
    """Distinct IF and VQ scores in every group (no group is skipped), no reward models."""
    g = self.cfg.rollout.group_size
    s_if = torch.arange(g, dtype=torch.float32).repeat(len(groups), 1)
    return s_if, (s_if.flip(1) - 2.0) ** 2, [0.0] * len(groups)


def _config(**overrides: str) -> config_lib.Config:
    """The smoke preset with ``section__field=value`` overrides."""
    cfg = config_lib.preset("smoke")
    for key, value in overrides.items():
        config_lib.apply_override(cfg, key.replace("__", "."), value)
    config_lib.validate(cfg)
    return cfg


def _trainer(monkeypatch, *, reward_models: bool = False, **overrides: str) -> Trainer:
    """A smoke trainer; its scores are :func:`_ranked_scores` unless ``reward_models``."""
    if not reward_models:
        monkeypatch.setattr(Trainer, "_scores", _ranked_scores)
    cfg = _config(**overrides)
    torch.manual_seed(cfg.train.seed)
    return Trainer(cfg, TinyWorldDiT(cfg.model), torch.device("cpu"))


@pytest.fixture
def loss_calls(monkeypatch) -> list[dict]:
    """Every ``nft_loss`` call of the trainer: its tensors and keyword arguments."""
    calls = []
    real = nft_module.nft_loss

    def spy(v_theta, v_old, v_target, r, **kw):
        calls.append({"v_theta": v_theta, "v_old": v_old, "r": r, **kw})
        return real(v_theta, v_old, v_target, r, **kw)

    monkeypatch.setattr(nft_module, "nft_loss", spy)
    return calls


def _count_steps(monkeypatch, trainer: Trainer, on_step=None) -> list[int]:
    """Count each optimizer's steps (``on_step(trainer)`` runs just before each)."""
    counts = [0] * len(trainer.optimizers)
    for i, opt in enumerate(trainer.optimizers):
        def step(*args, _i=i, _real=opt.step, **kw):
            counts[_i] += 1
            if on_step is not None:
                on_step(trainer)
            return _real(*args, **kw)
        monkeypatch.setattr(opt, "step", step)
    return counts


def _grad_norm(model: torch.nn.Module) -> float:
    grads = [p.grad.flatten() for p in model.parameters() if p.grad is not None]
    return float(torch.cat(grads).norm())


# -- what reaches the loss ----------------------------------------------------------------------

@pytest.mark.parametrize("beta,space", [("0.5", "x0"), ("2.0", "velocity")])
def test_configured_beta_and_loss_space_reach_nft_loss(monkeypatch, loss_calls, beta, space):
    trainer = _trainer(monkeypatch, nft__beta=beta, nft__loss_space=space)
    trainer.iteration(0)
    assert loss_calls
    for call in loss_calls:
        assert call["beta"] == float(beta) and call["space"] == space
        assert call["reduction"] == "sum" and call["sigma"] is not None


@pytest.mark.parametrize("fraction,k", [("0.25", 1), ("0.5", 2), ("1.0", 4)])
def test_timestep_fraction_sets_the_distinct_sigmas_per_candidate(monkeypatch, loss_calls,
                                                                  fraction, k):
    trainer = _trainer(monkeypatch, nft__timestep_fraction=fraction)
    assert len(trainer.rule.sigmas) == SMOKE_SIGMAS == 4
    trainer.iteration(0)
    sigma = torch.cat([c["sigma"] for c in loss_calls])
    assert sigma.numel() == 2 * KEEP * k  # kept candidates x sigmas each
    schedule = set(trainer.rule.sigmas.tolist())
    for row in sigma.reshape(2 * KEEP, k).tolist():
        assert len(set(row)) == k and set(row) <= schedule


def test_optimality_reaches_the_loss_as_drawn(monkeypatch, loss_calls):
    """The kept candidates' ``r`` (best three high, worst three low), one per sigma."""
    trainer = _trainer(monkeypatch)
    trainer.iteration(0)
    r = torch.cat([c["r"] for c in loss_calls])
    s_if, s_vq, _ = _ranked_scores(trainer, [None])
    want, _ = trainer.advantages(s_if, s_vq)
    assert sorted(r.tolist()) == pytest.approx(
        sorted(want[0].sort().values[[0, 1, 2, -3, -2, -1]].repeat_interleave(2).tolist()))


@pytest.mark.parametrize("micro,sizes", [("0", [12]), ("5", [5, 5, 2])])
def test_micro_batch_splits_the_loss_calls(monkeypatch, loss_calls, micro, sizes):
    """6 kept candidates x 2 sigmas = 12 rows over one shared cache (0 = 32 on CPU)."""
    trainer = _trainer(monkeypatch, update__micro_batch=micro)
    trainer.iteration(0)
    assert [c["v_theta"].shape[0] for c in loss_calls] == sizes


def _record(monkeypatch, owner, name: str) -> list[tuple]:
    """Wrap ``owner.name`` (for a trainer's velocity role, ``trainer.context.name``); every
    call's (args, result)."""
    calls = []
    in_context = isinstance(owner, Trainer) and name.endswith("velocity")
    real = getattr(owner.context if in_context else owner, name)

    def wrapper(*args, **kw):
        out = real(*args, **kw)
        calls.append((args, out))
        return out

    if in_context:
        monkeypatch.setattr(owner, "context",
                            dataclasses.replace(owner.context, **{name: wrapper}))
    else:
        monkeypatch.setattr(owner, name, wrapper)
    return calls


@pytest.mark.parametrize("mode", ["old_model", "detached_current"])
def test_old_prediction_source(monkeypatch, loss_calls, mode):
    trainer = _trainer(monkeypatch, nft__old_prediction=mode)
    old_calls = _record(monkeypatch, trainer, "old_velocity")
    trainer.iteration(0)
    assert loss_calls
    if mode == "detached_current":
        assert not old_calls
        for call in loss_calls:
            assert not call["v_old"].requires_grad
            assert torch.equal(call["v_old"], call["v_theta"].detach())
    else:
        assert len(old_calls) == len(loss_calls)


@pytest.fixture
def kl_calls(monkeypatch) -> list[torch.Tensor]:
    """Every per-row KL the NFT update adds to its loss."""
    calls = []
    real = nft_module.velocity_kl

    def spy(v_theta, v_ref):
        out = real(v_theta, v_ref)
        calls.append(out.detach())
        return out

    monkeypatch.setattr(nft_module, "velocity_kl", spy)
    return calls


def test_velocity_kl_is_the_rows_mean_squared_velocity_difference():
    g = torch.Generator().manual_seed(0)
    v_theta = torch.randn(3, 2, 3, 5, 7, generator=g).bfloat16().requires_grad_(True)
    v_ref = torch.randn(3, 2, 3, 5, 7, generator=g).bfloat16()
    kl = nft_module.velocity_kl(v_theta, v_ref)
    want = ((v_theta.float() - v_ref.float()) ** 2).reshape(3, -1).mean(dim=1)
    assert kl.dtype == torch.float32 and kl.shape == (3,)
    torch.testing.assert_close(kl, want, rtol=0, atol=0)
    kl.sum().backward()
    grad = 2 * (v_theta.float() - v_ref.float()) / v_theta[0].numel()
    torch.testing.assert_close(v_theta.grad.float(), grad, rtol=1e-2, atol=1e-3)


def test_nft_keeps_no_reference_without_a_kl(monkeypatch, kl_calls):
    trainer = _trainer(monkeypatch)
    stats = trainer.iteration(0)
    assert trainer.ref is None and trainer.context.ref_velocity is None and not kl_calls
    assert stats.kl is None


def test_nft_kl_to_the_frozen_initial_model_reaches_the_loss(monkeypatch, loss_calls, kl_calls):
    """With ``nft.kl_beta`` every micro-batch adds its rows' KL to the frozen initial model:
    0 before the first step (the model is the initial one), above 0 after it; the reference
    stays the initial model."""
    trainer = _trainer(monkeypatch, nft__kl_beta="0.5")
    init = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    ref_calls = _record(monkeypatch, trainer, "ref_velocity")
    trainer.iteration(0)
    first = len(kl_calls)
    assert first == len(loss_calls) == len(ref_calls) > 0
    assert all(float(kl.abs().max()) == 0.0 for kl in kl_calls)
    stats = trainer.iteration(1)
    assert len(kl_calls) == len(loss_calls) > first
    assert float(kl_calls[-1].max()) > 0
    # the iteration reports its rows' mean KL
    assert stats.kl == pytest.approx(float(torch.cat(kl_calls[first:]).mean()), rel=1e-6)
    for name, value in trainer.ref.state_dict().items():
        torch.testing.assert_close(value, init[name], rtol=0, atol=0)


def test_nft_kl_adds_its_weighted_rows_to_the_micro_loss(monkeypatch):
    """A model moved off the reference: the micro-batch loss with the reference's cache is the
    one without it plus ``kl_beta * scale *`` the rows' KL, gradient included."""
    trainer = _trainer(monkeypatch, nft__kl_beta="0.25")
    with torch.no_grad():
        for p in trainer.model.parameters():
            p.add_(torch.randn_like(p), alpha=0.05)
    (group,) = trainer.rollout(0, 1)
    s_if, s_vq, _ = _ranked_scores(trainer, [group])
    r, adv = trainer.advantages(s_if, s_vq)
    chosen = trainer.rule.kept(trainer.context, 0, adv)[0]
    item = trainer.rule.items(trainer.context, 0, 0, group, r[0], adv[0], chosen)
    part = torch.arange(len(item.candidate))
    with torch.no_grad():
        cache = trainer.model.build_cache_parallel(group.history[:1], group.history_actions[:1],
                                                   sigma=trainer.model.context_sigma)
    frozen, _ = trainer._frozen_caches(group, 0, group.caches[0])
    assert set(frozen) == {"old", "ref"}
    scale = 1.0 / len(part)

    def loss_and_grad(caches):
        trainer.model.zero_grad()
        loss = trainer.rule.micro_loss(trainer.context, item, part, group.clip_actions, cache,
                                       caches, scale).loss
        loss.backward()
        return loss.detach(), [p.grad.clone() for p in trainer.model.parameters()
                               if p.grad is not None]

    with_kl, grads_kl = loss_and_grad(frozen)
    without, grads = loss_and_grad({"old": frozen["old"]})
    trainer.model.zero_grad()
    v_theta = trainer.model.velocity(item.x_t, item.sigma, group.clip_actions, cache)
    with torch.no_grad():
        v_ref = trainer.ref.velocity(item.x_t, item.sigma, group.clip_actions, frozen["ref"])
    kl = 0.25 * scale * nft_module.velocity_kl(v_theta, v_ref).sum()
    assert float(kl.detach()) > 0
    torch.testing.assert_close(with_kl, without + kl.detach(), rtol=1e-5, atol=1e-7)
    kl.backward()
    kl_grads = [p.grad for p in trainer.model.parameters() if p.grad is not None]
    for g_kl, g, g_term in zip(grads_kl, grads, kl_grads, strict=True):
        torch.testing.assert_close(g_kl, g + g_term, rtol=1e-4, atol=1e-6)


# -- rollouts -----------------------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["clip", "sample"])
def test_rollout_mode_sets_whose_history_candidates_share(monkeypatch, mode):
    trainer = _trainer(monkeypatch, rollout__mode=mode)
    rollouts = _record(monkeypatch, trainer, "rollout")
    trainer.iteration(1)  # clip 2: one generated history clip
    ((_, (group,)),) = rollouts
    g = trainer.cfg.rollout.group_size
    histories = 1 if mode == "clip" else g
    assert group.history.shape[0] == len(group.caches) == histories
    if mode == "sample":  # each candidate generated its own first clip
        assert not torch.equal(group.history[0, 1:], group.history[1, 1:])


def test_sample_level_training_predicts_over_each_candidates_own_history(monkeypatch):
    trainer = _trainer(monkeypatch, rollout__mode="sample", update__context_kv="reuse")
    velocity = _record(monkeypatch, trainer, "velocity")
    rollouts = _record(monkeypatch, trainer, "rollout")
    trainer.iteration(1)
    ((_, (group,)),) = rollouts
    # all 6 candidates are kept (top 3 and bottom 3), each at 2 sigmas over its own cache
    caches = [args[3] for args, _ in velocity]
    assert sorted(map(id, caches)) == sorted(map(id, group.caches))
    assert [len(args[0]) for args, _ in velocity] == [2] * 6


@pytest.mark.parametrize("candidate_noise", ["independent", "sde"])
def test_candidate_noise_reaches_the_sampler(monkeypatch, candidate_noise):
    """``independent``: one initial noise per candidate; ``sde``: one shared, plus step noise."""
    trainer = _trainer(monkeypatch, rollout__candidate_noise=candidate_noise)
    samples = _record(monkeypatch, trainer.sampler, "sample")
    trainer.iteration(0)
    ((_, rollout),) = samples  # clip 1: the candidates only
    g = trainer.cfg.rollout.group_size
    assert rollout.clips.shape[0] == g
    shared = bool((rollout.noise == rollout.noise[:1]).all())
    if candidate_noise == "sde":
        assert shared and rollout.step_noise is not None
    else:
        assert not shared and rollout.step_noise is None


# -- caches -------------------------------------------------------------------------------------

@pytest.mark.parametrize("mode,builds", [("reuse", 0), ("recompute", 1), ("recompute_grad", 1)])
def test_context_kv_reuses_or_recomputes_the_history_cache(monkeypatch, mode, builds):
    trainer = _trainer(monkeypatch, update__context_kv=mode)
    build_calls = _record(monkeypatch, trainer.model, "build_cache_parallel")
    velocity = _record(monkeypatch, trainer, "velocity")
    rollouts = _record(monkeypatch, trainer, "rollout")
    trainer.iteration(1)
    built = [cache for _, cache in build_calls]
    assert len(built) == builds and velocity
    ((_, (group,)),) = rollouts
    want = group.caches[0] if mode == "reuse" else built[0]
    assert all(args[3] is want for args, _ in velocity)
    if mode != "reuse":
        grad = mode == "recompute_grad"
        assert all(k.requires_grad == grad for k in built[0].keys)


# -- optimizers ---------------------------------------------------------------------------------

@pytest.mark.parametrize("updates", [1, 3])
def test_updates_per_iteration_steps_every_optimizer_that_often(monkeypatch, loss_calls,
                                                                updates):
    trainer = _trainer(monkeypatch, optim__updates_per_iteration=str(updates))
    counts = _count_steps(monkeypatch, trainer)
    trainer.iteration(0)
    assert counts == [updates] * len(trainer.optimizers)
    rows = [c["v_theta"].shape[0] for c in loss_calls]
    assert rows == [2 * KEEP * 2 // updates] * updates


def test_muon_updates_matrices_with_muon_and_the_rest_with_adamw(monkeypatch):
    trainer = _trainer(monkeypatch, optim__optimizer="muon")
    muon, adamw = trainer.optimizers
    assert type(muon) is GroupedMuon and type(adamw) is AdamW
    hidden = {id(p) for p in trainer.model.hidden_matrices()}
    muon_params = [p for group in muon.param_groups for p in group["params"]]
    adamw_params = [p for group in adamw.param_groups for p in group["params"]]
    assert {id(p) for p in muon_params} == hidden
    assert not hidden & {id(p) for p in adamw_params}
    before = [[p.detach().clone() for p in params] for params in (muon_params, adamw_params)]
    for step in range(2):  # the zero-initialised gates leave the matrices' first gradient 0
        trainer.iteration(step)
    for old, params in zip(before, (muon_params, adamw_params), strict=True):
        assert any(not torch.equal(a, p) for a, p in zip(old, params, strict=True))


def _stepped_grad_norm(monkeypatch, grad_clip: str) -> float:
    """The gradient norm the first optimizer step of an iteration sees."""
    trainer = _trainer(monkeypatch, optim__grad_clip=grad_clip)
    seen = []
    _count_steps(monkeypatch, trainer, lambda t: seen.append(_grad_norm(t.model)))
    trainer.iteration(0)
    return seen[0]


def test_grad_clip_bounds_the_stepped_gradient_norm(monkeypatch):
    assert _stepped_grad_norm(monkeypatch, "0") > 0.001
    assert _stepped_grad_norm(monkeypatch, "0.0001") == pytest.approx(1e-4, rel=1e-3)


# -- rewards ------------------------------------------------------------------------------------

def _keywords(monkeypatch, name: str) -> list[dict]:
    """The keyword arguments of every call the run's reward makes to its function ``name``."""
    calls = []
    real = getattr(reward_registry, name)

    def spy(*args, **kw):
        calls.append(kw)
        return real(*args, **kw)

    monkeypatch.setattr(reward_registry, name, spy)
    return calls


def test_reward_settings_reach_the_scores(monkeypatch):
    """Thresholds to the IF score, stride and mode to the VQ score (real reward models)."""
    trainer = _trainer(monkeypatch, reward_models=True, reward__rot_threshold_deg="0.2",
                       reward__trans_thresholds="0.002,0.005,0.01", reward__vq_mode="drift",
                       reward__vq_stride="2")
    if_calls = _keywords(monkeypatch, "interaction_score")
    vq_calls = _keywords(monkeypatch, "vq_scores")
    s_if, s_vq, _ = trainer._scores(trainer.rollout(0, 1))
    assert s_if.shape == s_vq.shape == (1, trainer.cfg.rollout.group_size)
    assert if_calls == [{"trans_thresholds": (0.002, 0.005, 0.01), "rot_threshold_deg": 0.2}]
    assert vq_calls == [{"stride": 2, "mode": "drift"}]


def test_soft_if_reaches_the_scores_at_the_smallest_threshold(monkeypatch):
    trainer = _trainer(monkeypatch, reward_models=True, reward__if_kind="soft",
                       reward__trans_thresholds="0.1,0.05")
    calls = _keywords(monkeypatch, "soft_interaction_score")
    trainer._scores(trainer.rollout(0, 1))
    assert calls == [{"trans_threshold": 0.05, "rot_threshold_deg": 2.0}]


def test_action_if_scores_both_labels_of_each_frame(monkeypatch):
    """``if_kind="action"``: the IF is the action accuracy (translation and rotation label
    both right) at the configured thresholds, never the half-credit label IF."""
    trainer = _trainer(monkeypatch, reward_models=True, reward__if_kind="action",
                       reward__trans_thresholds="0.1,0.05")
    calls, label_calls = _keywords(monkeypatch, "action_accuracy"), _keywords(
        monkeypatch, "interaction_score")
    groups = trainer.rollout(0, 1)
    s_if, _, _ = trainer._scores(groups)
    assert calls == [{"trans_thresholds": (0.1, 0.05), "rot_threshold_deg": 2.0}]
    assert label_calls == []
    c2w = reward_registry.camera_poses(trainer.reward.models.estimator,
                                       groups[0].reward_frames())
    trans, rot = split_action(groups[0].clip_actions)
    half_credit = interaction_score(c2w, trans, rot, trans_thresholds=(0.1, 0.05),
                                    rot_threshold_deg=2.0)
    assert bool((s_if[0] <= half_credit + 1e-6).all())
    frames = trainer.cfg.model.clip_frames
    torch.testing.assert_close(s_if * frames, (s_if * frames).round())


def test_trajectory_if_reaches_the_score_with_its_weights(monkeypatch):
    trainer = _trainer(monkeypatch, reward_models=True, reward__if_kind="trajectory",
                       reward__trajectory_weights="2.0,0.5")
    calls, label_calls = _keywords(monkeypatch, "trajectory_score"), _keywords(
        monkeypatch, "interaction_score")
    s_if, _, _ = trainer._scores(trainer.rollout(0, 1))
    assert calls == [{"translation_weight": 2.0, "rotation_weight": 0.5}]
    assert label_calls == []
    assert bool(((s_if > 0) & (s_if <= 1)).all())


def test_render_reader_reads_the_groups_world(monkeypatch):
    """``if_reader="render"``: the IF comes from re-rendering the group's world, never from
    the estimator; the true renders of the command score high, frames that stay still zero."""
    trainer = _trainer(monkeypatch, reward_models=True, reward__if_reader="render",
                       reward__if_kind="action", rollout__num_clips="1")
    estimator_calls = _keywords(monkeypatch, "camera_poses")
    (group,) = trainer.rollout(0, 1)
    assert group.prompt_seed == trainer_module.prompt_seed(trainer.cfg, 0, 0)
    cfg = trainer.cfg
    truth = sample_sequences(1, num_clips=1, seed=group.prompt_seed,
                             composite_fraction=cfg.rollout.composite_fraction,
                             composite_keys=cfg.rollout.composite_keys,
                             clip_frames=cfg.model.clip_frames, resolution=cfg.model.resolution)
    torch.testing.assert_close(group.history[:, :1], truth.frames[:, :1])
    group.candidates = truth.frames[:, 1:].expand_as(group.candidates).clone()
    s_true, _, _ = trainer._scores([group])
    group.candidates = truth.frames[:, :1].expand_as(group.candidates).clone()
    s_still, _, _ = trainer._scores([group])
    assert estimator_calls == []
    assert bool((s_true >= 0.75).all()) and bool((s_still == 0).all())
    group.prompt_seed = None
    with pytest.raises(ValueError, match="prompt seed"):
        trainer._scores([group])


@pytest.mark.parametrize("override, field", [({"rollout__num_clips": "2"}, "rollout.num_clips"),
                                             ({"rollout__num_clips": "1",
                                               "reward__decouple_every": "4",
                                               "reward__decouple_length": "1"},
                                              "reward.decouple_every")])
def test_render_reader_needs_clip_1_and_known_prompts(override, field):
    with pytest.raises(ValueError, match=field):
        _config(reward__if_reader="render", **override)


# -- advantages ---------------------------------------------------------------------------------

# two candidates, IF prefers the second, VQ the first: a_IF = (-1, 1)/sqrt(2) = -a_VQ
S_IF, S_VQ = torch.tensor([[0.0, 1.0]]), torch.tensor([[1.0, 0.0]])
HALF_SQRT2 = 0.5 ** 0.5


def test_trainable_conditioning_updates_only_the_conditioning_weights(monkeypatch):
    monkeypatch.setattr(Trainer, "_scores", _ranked_scores)
    cfg = _config(optim__trainable="conditioning", train__init="base")
    torch.manual_seed(cfg.train.seed)
    model = TinyWorldDiT(cfg.model)
    with torch.no_grad():  # a trained model: no zero-initialised gate or head blocks the gradient
        for p in model.parameters():
            p.add_(torch.randn_like(p), alpha=0.02)
    trainer = Trainer(cfg, model, torch.device("cpu"))
    conditioning = {id(p) for p in model.conditioning_parameters()}
    assert {id(model.key_embed.weight), id(model.final_modulation.weight),
            id(model.blocks[0].modulation.weight)} <= conditioning
    assert id(model.blocks[0].attn.qkv.weight) not in conditioning
    stepped = {id(p) for opt in trainer.optimizers for g in opt.param_groups for p in g["params"]}
    assert stepped == conditioning
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    trainer.iteration(0)
    changed = {name for name, p in model.named_parameters() if not torch.equal(before[name], p)}
    names = {id(p): name for name, p in model.named_parameters()}
    assert changed and changed <= {names[i] for i in conditioning}
    assert "blocks.0.modulation.weight" in changed and "key_embed.weight" in changed


def test_trainer_refuses_a_model_outside_the_protocol_naming_what_it_lacks(monkeypatch):
    cfg = _config(optim__trainable="conditioning", train__init="base")
    with pytest.raises(TypeError, match="lacks .*conditioning_parameters"):
        Trainer(cfg, torch.nn.Linear(2, 2), torch.device("cpu"))
    with pytest.raises(ValueError, match="optim.trainable"):
        _config(optim__trainable="heads")
    with pytest.raises(ValueError, match="optim.trainable.*train.init"):
        _config(optim__trainable="conditioning")  # the smoke preset starts from a new model


@pytest.mark.parametrize("kind,lam,want_second", [
    pytest.param("both", "0.9", (0.9 - 0.1) * HALF_SQRT2, id="both-0.9"),  # lam on IF
    pytest.param("both", "0.2", (0.2 - 0.8) * HALF_SQRT2, id="both-0.2"),  # 1 - lam on VQ
    pytest.param("if", "0.2", HALF_SQRT2, id="if"),
    pytest.param("vq", "0.9", -HALF_SQRT2, id="vq"),
])
def test_combined_advantage_weights_if_by_lam_and_vq_by_one_minus_lam(monkeypatch, kind, lam,
                                                                       want_second):
    trainer = _trainer(monkeypatch, reward__kind=kind, reward__lam=lam, reward__Z="2.0")
    r, adv = trainer.advantages(S_IF, S_VQ)
    torch.testing.assert_close(adv, torch.tensor([[-want_second, want_second]]))
    torch.testing.assert_close(r, 0.5 + 0.25 * adv)


@pytest.mark.parametrize("std", ["group", "global"])
def test_reward_std_scales_the_advantages(monkeypatch, std):
    trainer = _trainer(monkeypatch, reward__std=std, reward__kind="if")
    s = torch.tensor([[0.0, 2.0], [10.0, 14.0]])
    _, adv = trainer.advantages(s, torch.zeros_like(s))
    torch.testing.assert_close(adv, group_advantages(s, std=std).float())
    ratio = adv[1, 1] / adv[0, 1]  # global: both groups share one std; group: each its own
    assert float(ratio) == pytest.approx(2.0 if std == "global" else 1.0)


# -- the official preset's settings -------------------------------------------------------------

def _official_overrides() -> list[str]:
    """``--section.field value`` for every field the official preset sets differently from
    the paper's, except the model (the smoke model stays)."""
    official = config_lib.to_dict(config_lib.preset("official"))
    paper = config_lib.to_dict(config_lib.preset("paper"))
    args = []
    for section, values in official.items():
        if section in ("preset", "model"):
            continue
        for key, value in values.items():
            if value != paper[section][key]:
                text = ",".join(map(str, value)) if isinstance(value, tuple) else str(value)
                args += [f"--{section}.{key}", text]
    return args


def test_official_settings_take_effect_in_a_smoke_run(monkeypatch, loss_calls, tmp_path):
    args = _official_overrides()
    assert "--nft.loss_space" in args and "--optim.updates_per_iteration" in args
    monkeypatch.setattr(Trainer, "_scores", _ranked_scores)
    trainers, steps, norms = [], [], []
    real_init = Trainer.__init__

    def init(self, *a, **kw):
        real_init(self, *a, **kw)
        trainers.append(self)
        steps.append(_count_steps(monkeypatch, self,
                                  lambda t: norms.append(_grad_norm(t.model))))

    monkeypatch.setattr(Trainer, "__init__", init)
    assert main(["--preset", "smoke", *args, "--steps", "2", "--out", str(tmp_path)]) == 0
    (trainer,) = trainers
    cfg = trainer.cfg
    assert (cfg.reward.std, cfg.nft.loss_space, cfg.optim.optimizer) == ("global", "x0", "muon")
    assert {(c["space"], c["beta"]) for c in loss_calls} == {("x0", 1.0)}
    assert [type(o) for o in trainer.optimizers] == [GroupedMuon, AdamW]
    assert steps == [[2 * 3, 2 * 3]]  # 2 iterations x 3 updates, each optimizer
    assert max(norms) <= 2.0 * (1 + 1e-4)
    rows = [json.loads(r) for r in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    decays = [row["ema_decay"] for row in rows]
    assert decays == pytest.approx([ema_decay(s, 2, schedule="official") for s in (0, 1)])
