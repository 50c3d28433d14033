"""``train.update flow_grpo``: SDE rollouts with recorded log-probabilities, the PPO-clipped
GRPO loss on them, Flow-GRPO-Fast's window, DanceGRPO's shared noise, resume and ranks."""

import dataclasses
import json
import math
import shutil

import pytest
import torch
from gloo_ranks import spawn_ranks
from test_train import SMOKE, _assert_same, _final_weights
from test_trainer_options import _config, _ranked_scores, _record

from wc_fast.infra import checkpoint
from wc_fast.models import TinyWorldDiT
from wc_fast.models.motion_latent import noise_latents
from wc_fast.rl.sampler import sde_step_std, sigma_schedule
from wc_fast.rl.trainer import Trainer
from wc_fast.rl.updates import grpo as grpo_module
from wc_fast.train import main
from wc_kernels import reference, sde_log_prob

pytestmark = pytest.mark.usefixtures("one_thread")

GRPO = {"train__update": "flow_grpo", "model__motion_latent": "true"}


def _trainer(monkeypatch, **overrides: str) -> Trainer:
    """A smoke GRPO trainer with ranked scores and a model whose every weight, the motion
    embedding included, is non-zero (a new model's zero-initialised layers ignore the latents
    and the history)."""
    monkeypatch.setattr(Trainer, "_scores", _ranked_scores)
    cfg = _config(**{**GRPO, **overrides})
    torch.manual_seed(cfg.train.seed)
    model = TinyWorldDiT(cfg.model)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p), alpha=0.05)
    return Trainer(cfg, model, torch.device("cpu"))


@pytest.fixture
def loss_calls(monkeypatch) -> list[dict]:
    """Every ``grpo_sde_loss`` call of the trainer: its arguments and the per-row log-prob."""
    calls = []
    real = grpo_module.grpo_sde_loss

    def spy(model_output, sample, prev_sample, sigma, sigma_next, old_log_prob, advantage,
            **kw):
        stats = kw.pop("return_stats", False)
        loss, log_prob, kl = real(model_output, sample, prev_sample, sigma, sigma_next,
                                  old_log_prob, advantage, return_stats=True, **kw)
        calls.append({"model_output": model_output, "sample": sample, "sigma": sigma,
                      "old_log_prob": old_log_prob, "advantage": advantage,
                      "log_prob": log_prob, "kl": kl, **kw})
        return (loss, log_prob, kl) if stats else loss

    monkeypatch.setattr(grpo_module, "grpo_sde_loss", spy)
    return calls


def _old_log_prob(trainer: Trainer, group, k: int) -> torch.Tensor:
    """The reference log-probability ``[G]`` of recorded step ``k``, recomputed with the old
    model from the stored latents."""
    traj = group.trajectory
    sigma = traj.sigma[k].expand(traj.sample.shape[1])
    with torch.no_grad():
        v = trainer.old.velocity(traj.sample[k], sigma, group.clip_actions, group.caches[0],
                                 motion=group.latents)
    return reference.sde_log_prob(v, traj.sample[k], traj.prev_sample[k], sigma,
                                  traj.sigma_next[k].expand_as(sigma),
                                  noise_level=trainer.cfg.rollout.sde_noise,
                                  sigma_max=trainer.sampler.sigmas[1])


# -- the rollout's record -----------------------------------------------------------------------

def test_recorded_log_prob_is_the_old_models_step_log_prob(monkeypatch):
    trainer = _trainer(monkeypatch)
    (group,) = trainer.rollout(1, 2)  # clip 2: over a generated history
    traj = group.trajectory
    steps = trainer.cfg.rollout.steps
    assert traj.index == list(range(steps - 1))  # every step but the last, to sigma 0
    schedule = sigma_schedule(steps, trainer.cfg.rollout.shift)
    torch.testing.assert_close(traj.sigma, schedule[:-2])
    torch.testing.assert_close(traj.sigma_next, schedule[1:-1])
    torch.testing.assert_close(traj.sample[1:], traj.prev_sample[:-1], rtol=0, atol=0)
    for k in range(len(traj.index)):
        torch.testing.assert_close(traj.log_prob[k], _old_log_prob(trainer, group, k),
                                   rtol=1e-5, atol=1e-5)
    assert traj.log_prob.std() > 0.01  # the steps and candidates are told apart


def test_sampler_noise_std_is_the_kernels():
    """The sampler's SDE std equals the kernel's (first step through ``sigma_max``), so each
    recorded step's residual over the kernel's std is a standard normal draw."""
    schedule = sigma_schedule(10, 5.0)
    sigma = schedule[:-2]
    kernel = reference.sde_std(sigma.double(), 0.7, float(schedule[1]))
    sampler = torch.tensor([sde_step_std(float(s), 0.7, float(schedule[1])) for s in sigma],
                           dtype=torch.float64)
    torch.testing.assert_close(sampler, kernel)


def test_recorded_steps_are_gaussian_under_the_kernels_std(monkeypatch):
    trainer = _trainer(monkeypatch)
    (group,) = trainer.rollout(0, 1)
    traj = group.trajectory
    a, sigma_max = trainer.cfg.rollout.sde_noise, trainer.sampler.sigmas[1]
    for k in range(len(traj.index)):
        sigma = traj.sigma[k].expand(traj.sample.shape[1])
        sigma_next = traj.sigma_next[k].expand_as(sigma)
        with torch.no_grad():
            v = trainer.old.velocity(traj.sample[k], sigma, group.clip_actions,
                                     group.caches[0], motion=group.latents)
        std = reference.sde_std(sigma, a, sigma_max)
        mean = reference.sde_step_mean(v, traj.sample[k], sigma, sigma_next, std)
        z = (traj.prev_sample[k] - mean) / (std * (sigma - sigma_next).sqrt()).view(-1, 1, 1,
                                                                                     1, 1)
        assert abs(float(z.std()) - 1.0) < 0.02 and abs(float(z.mean())) < 0.02, k


# -- the update ---------------------------------------------------------------------------------

def test_first_update_has_ratio_one(monkeypatch, loss_calls):
    """At theta = theta_old the current model's log-probability of every trained step is the
    recorded one, given the candidate's own motion latents and the recomputed history cache."""
    trainer = _trainer(monkeypatch)
    velocity = []
    real = trainer.context.velocity

    def spy(*args, **kw):
        velocity.append(kw["motion"])
        return real(*args, **kw)

    monkeypatch.setattr(trainer, "context", dataclasses.replace(trainer.context, velocity=spy))
    rollouts = _record(monkeypatch, trainer, "rollout")
    trainer.iteration(1)  # clip 2: the current model builds its own history cache
    ((_, (group,)),) = rollouts
    log_prob = torch.cat([c["log_prob"] for c in loss_calls])
    old = torch.cat([c["old_log_prob"] for c in loss_calls])
    g, k = trainer.cfg.rollout.group_size, trainer.cfg.rollout.steps - 1
    assert log_prob.numel() == g * k  # timestep_fraction 1: every step of every candidate
    torch.testing.assert_close(log_prob, old, rtol=0, atol=1e-5)
    motion = torch.cat(velocity)
    assert {tuple(m.tolist()) for m in motion} == {tuple(m.tolist()) for m in group.latents}
    # the latents matter: the next candidate's (rows come k per candidate) change the velocity
    first = loss_calls[0]
    with torch.no_grad():
        v = trainer.model.velocity(first["sample"], first["sigma"], group.clip_actions,
                                   group.caches[0], motion=velocity[0].roll(k, dims=0))
    assert float((v - first["model_output"].detach()).abs().max()) > 1e-3


def test_explored_rollout_is_rescored_under_the_command(monkeypatch, loss_calls):
    """With action exploration the candidates are sampled under offset keys; the update's
    reference log-probability is the sampling model's under the commanded keys, so the first
    update's ratio is 1, and it differs from what the rollout recorded."""
    trainer = _trainer(monkeypatch, rollout__action_exploration="0.5")
    rollouts = _record(monkeypatch, trainer, "rollout")
    trainer.iteration(0)
    ((_, (group,)),) = rollouts
    log_prob = torch.cat([c["log_prob"] for c in loss_calls])
    old = torch.cat([c["old_log_prob"] for c in loss_calls])
    torch.testing.assert_close(log_prob, old, rtol=0, atol=1e-5)
    recorded = group.trajectory.log_prob.transpose(0, 1).flatten()
    assert recorded.shape == old.shape
    assert float((recorded.sort().values - old.sort().values).abs().max()) > 1e-4


def test_advantages_and_constants_reach_the_loss(monkeypatch, loss_calls):
    trainer = _trainer(monkeypatch, grpo__clip_range="0.01", grpo__adv_clip_max="1.5",
                       grpo__timestep_fraction="0.5")
    trainer.iteration(0)
    s_if, s_vq, _ = _ranked_scores(trainer, [None])
    _, adv = trainer.advantages(s_if, s_vq)
    g, k = trainer.cfg.rollout.group_size, math.ceil(0.5 * (trainer.cfg.rollout.steps - 1))
    advantage = torch.cat([c["advantage"] for c in loss_calls])
    assert sorted(advantage.tolist()) == pytest.approx(
        sorted(adv[0].repeat_interleave(k).tolist()))
    for call in loss_calls:
        assert (call["clip_range"], call["adv_clip_max"], call["kl_beta"]) == (0.01, 1.5, 0.0)
        assert call["noise_level"] == trainer.cfg.rollout.sde_noise
        assert call["sigma_max"] == trainer.sampler.sigmas[1] and call["ref_output"] is None
    assert trainer.ref is None and advantage.numel() == g * k


def _candidate_log_probs(trainer: Trainer, group) -> torch.Tensor:
    """The current model's mean log-probability ``[G]`` of each candidate's recorded steps."""
    traj = group.trajectory
    out = []
    for k in range(len(traj.index)):
        sigma = traj.sigma[k].expand(traj.sample.shape[1])
        with torch.no_grad():
            v = trainer.model.velocity(traj.sample[k], sigma, group.clip_actions,
                                       group.caches[0], motion=group.latents)
        out.append(sde_log_prob(v, traj.sample[k], traj.prev_sample[k], sigma,
                                traj.sigma_next[k].expand_as(sigma),
                                noise_level=trainer.cfg.rollout.sde_noise,
                                sigma_max=trainer.sampler.sigmas[1]))
    return torch.stack(out).mean(dim=0)


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_one_step_raises_the_advantage_weighted_log_prob(monkeypatch, sign):
    """One small step moves each candidate's log-probability along its advantage: positives
    up, negatives down, whichever candidates the reward prefers."""
    trainer = _trainer(monkeypatch, optim__optimizer="adamw", optim__lr="1e-4")
    (group,) = trainer.rollout(0, 1)
    s_if, s_vq, _ = _ranked_scores(trainer, [group])
    r, adv = trainer.advantages(sign * s_if, sign * s_vq)
    before = _candidate_log_probs(trainer, group)
    trainer.update(0, [group], r, adv)
    change = _candidate_log_probs(trainer, group) - before
    assert float((adv[0] * change).sum()) > 0
    assert torch.equal(change.sign(), adv[0].sign())


def test_kl_to_the_frozen_initial_model_reaches_the_loss(monkeypatch, loss_calls):
    trainer = _trainer(monkeypatch, grpo__kl_beta="0.04")
    init = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    trainer.iteration(0)
    first = len(loss_calls)
    stats = trainer.iteration(1)
    assert all(c["kl_beta"] == 0.04 and c["ref_output"] is not None for c in loss_calls)
    assert float(loss_calls[-1]["kl"].max()) > 0  # the model moved away from the reference
    kl = torch.cat([c["kl"] for c in loss_calls[first:]])
    assert stats.kl == pytest.approx(float(kl.mean()), rel=1e-6)
    for name, value in trainer.ref.state_dict().items():
        torch.testing.assert_close(value, init[name], rtol=0, atol=0)
    assert any(not torch.equal(v, init[k]) for k, v in trainer.model.state_dict().items())


# -- exploration --------------------------------------------------------------------------------

def _euler(trainer: Trainer, x: torch.Tensor, i: int, cache, actions, motion) -> torch.Tensor:
    """Sampler step ``i`` of ``x`` ``[G, F, C, H, W]`` as a deterministic Euler step."""
    sigmas = trainer.sampler.sigmas
    with torch.no_grad():
        v = trainer.old.velocity(x, torch.full((x.shape[0],), sigmas[i]), actions, cache,
                                 motion=motion)
    return x + (sigmas[i + 1] - sigmas[i]) * v


def test_fast_window_steps_are_the_only_stochastic_ones(monkeypatch):
    """Replayed with Euler steps outside the window and the recorded steps inside it, the
    initial noise gives the sampled clips; inside, noise moved every candidate off its Euler
    step."""
    trainer = _trainer(monkeypatch, grpo__window="2")
    (group,) = trainer.rollout(0, 1)
    cache, actions = group.caches[0], group.clip_actions
    starts = set()
    for seed in range(8):
        sampled = trainer.sampler.sample_sde(cache, actions, num=3, window=2,
                                             generator=torch.Generator().manual_seed(seed))
        traj = sampled.trajectory
        start = traj.index[0]
        starts.add(start)
        assert traj.index == [start, start + 1]
        motion = noise_latents(sampled.noise)
        x = sampled.noise
        for i in range(trainer.cfg.rollout.steps):
            euler = _euler(trainer, x, i, cache, actions, motion)
            if i in traj.index:
                k = i - start
                torch.testing.assert_close(traj.sample[k], x, rtol=0, atol=0)
                assert float((traj.prev_sample[k] - euler).abs().mean()) > 0.05
                euler = traj.prev_sample[k]
            x = euler
        torch.testing.assert_close(x, sampled.clips, rtol=1e-6, atol=1e-6)
    assert starts == {0, 1}  # 4 steps: the window never covers the last


def test_fast_window_steps_are_the_only_trained_ones(monkeypatch, loss_calls):
    trainer = _trainer(monkeypatch, grpo__window="2", grpo__timestep_fraction="0.1")
    rollouts = _record(monkeypatch, trainer, "rollout")
    trainer.iteration(0)
    ((_, (group,)),) = rollouts
    window = group.trajectory.index
    sigma = torch.cat([c["sigma"] for c in loss_calls])
    assert sigma.numel() == 2 * trainer.cfg.rollout.group_size  # both steps of each candidate
    assert set(sigma.tolist()) == {trainer.sampler.sigmas[i] for i in window}


@pytest.mark.parametrize("same", [True, False])
def test_same_noise_shares_each_groups_initial_noise(monkeypatch, same):
    trainer = _trainer(monkeypatch, grpo__same_noise=str(same).lower())
    (group,) = trainer.rollout(0, 1)
    noise = group.trajectory.sample[0]  # the first step starts from the initial noise
    shared = bool((noise == noise[:1]).all())
    assert shared == same
    assert bool((group.latents == group.latents[:1]).all()) == same
    assert not torch.equal(group.candidates[0], group.candidates[1])  # the SDE still explores


# -- runs ---------------------------------------------------------------------------------------

RUN = [*SMOKE, "--train.update", "flow_grpo", "--grpo.kl_beta", "0.04"]


def test_smoke_run_writes_metrics_and_resumes_exactly(tmp_path):
    args = [*RUN, "--steps", "3", "--out", str(tmp_path), "--train.keep_last", "3"]
    assert main(args) == 0
    rows = [json.loads(r) for r in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [1, 2, 3]
    assert all(math.isfinite(row["loss"]) and row["train_s"] > 0 for row in rows)
    assert all(row["kl"] >= 0 for row in rows) and rows[-1]["kl"] > 0
    uninterrupted = _final_weights(tmp_path)
    saved = checkpoint.load(checkpoint.latest(tmp_path), models={}, restore_rng=False)
    assert saved.config["train"]["update"] == "flow_grpo"
    shutil.rmtree(checkpoint.latest(tmp_path))
    assert main([*args, "--resume"]) == 0
    _assert_same(uninterrupted, _final_weights(tmp_path))
    torch.manual_seed(0)
    init = TinyWorldDiT(_config().model).state_dict()
    assert max((uninterrupted[k] - init[k]).abs().max().item() for k in init) > 1e-5


def _rank(rank: int, args: list[str]) -> None:
    assert main(args) == 0


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["ddp", "fsdp2"])
def test_two_gloo_ranks_equal_one_process(tmp_path, mode):
    common = [*RUN, "--steps", "2", "--reward.std", "global", "--grpo.timestep_fraction", "0.5"]
    one, two = tmp_path / "one", tmp_path / "two"
    assert main([*common, "--out", str(one), "--rollout.groups_per_rank", "2"]) == 0
    spawn_ranks(_rank, ([*common, "--out", str(two), "--rollout.groups_per_rank", "1",
                         "--train.distributed", mode],), tmp_path)
    # the ranks' gradient sum rounds differently from one process's accumulation
    _assert_same(_final_weights(one), _final_weights(two), atol=5e-5)


@pytest.mark.parametrize("on_policy", [True, False])
def test_on_policy_samples_with_the_updated_model(monkeypatch, on_policy):
    """On policy, the sampling (old) model equals the current model after each iteration, so
    the next update's ratio starts at 1; off policy it is the EMA of the ``ema`` section."""
    trainer = _trainer(monkeypatch, grpo__on_policy=str(on_policy).lower(),
                       optim__lr="1e-2")
    before = {k: v.clone() for k, v in trainer.old.state_dict().items()}
    stats = trainer.iteration(0)
    current, old = trainer.model.state_dict(), trainer.old.state_dict()
    moved = [k for k in current if not torch.equal(current[k], before[k])]
    assert moved  # the update changed the current model
    if on_policy:
        assert stats.ema_decay == 0.0
        for k in current:
            torch.testing.assert_close(old[k], current[k], rtol=0, atol=0)
    else:
        assert stats.ema_decay == trainer.cfg.ema.start > 0
        assert any(not torch.equal(old[k], current[k]) for k in moved)
