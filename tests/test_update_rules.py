"""The trainer's seams: reward models handed in (here fakes) and a third update rule plugged in
without changing the trainer; the factory that picks a rule from ``train.update``."""

from dataclasses import dataclass

import pytest
import torch
from test_trainer_options import _config

from wc_fast.infra.runtime import generator
from wc_fast.models import ContextCache, TinyWorldDiT
from wc_fast.rewards import RewardModels
from wc_fast.rewards import registry as reward_registry
from wc_fast.rl.rollout import GroupRollout, rollout_clip_level
from wc_fast.rl.trainer import Trainer
from wc_fast.rl.updates import GRPOUpdate, MicroLoss, NFTUpdate, Update, build_update

pytestmark = pytest.mark.usefixtures("one_thread")

FAKE_VQ = 0.25


def _still_camera(frames: torch.Tensor) -> torch.Tensor:
    """A fake IF estimator: every frame ``[n, F+1, C, H, W]`` at the identity pose."""
    return torch.eye(4).expand(*frames.shape[:2], 4, 4).clone()


def _constant_critic(frames: torch.Tensor, prompt: str | None = None) -> torch.Tensor:
    """A fake VQ critic: ``FAKE_VQ`` for every frame ``[n, F', C, H, W]``."""
    return torch.full(frames.shape[:2], FAKE_VQ)


def _brightness_critic(frames: torch.Tensor, prompt: str | None = None) -> torch.Tensor:
    """A fake VQ critic whose score ``[n, F']`` is each frame's mean value (candidates differ)."""
    return frames.mean(dim=(2, 3, 4))


def _no_reward_models(cfg, device):
    raise AssertionError("the trainer built its own reward models")


def _weights(trainer: Trainer) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in trainer.model.state_dict().items()}


def _trainer(monkeypatch, critic, rule: Update | None = None, **overrides: str) -> Trainer:
    monkeypatch.setattr(reward_registry, "build_reward_models", _no_reward_models)
    cfg = _config(**overrides)
    torch.manual_seed(cfg.train.seed)
    rewards = RewardModels(estimator=_still_camera, critic=critic)
    return Trainer(cfg, TinyWorldDiT(cfg.model), torch.device("cpu"), rewards=rewards,
                   rule=rule)


@pytest.mark.parametrize("update", ["nft", "flow_grpo"])
def test_constant_fake_rewards_reach_the_metrics_and_skip_every_group(monkeypatch, update):
    """Constant rewards: the fake critic's value is the logged VQ, and every group is flat,
    so it is skipped and no weight moves."""
    trainer = _trainer(monkeypatch, _constant_critic, train__update=update)
    before = _weights(trainer)
    stats = trainer.iteration(0)
    assert stats.vq_mean == pytest.approx(FAKE_VQ)
    assert stats.skipped_groups == trainer.cfg.rollout.groups_per_rank
    assert stats.loss == 0.0
    for name, value in trainer.model.state_dict().items():
        assert torch.equal(value, before[name]), name


@pytest.mark.parametrize("update", ["nft", "flow_grpo"])
def test_ranked_fake_rewards_train_the_model(monkeypatch, update):
    """A fake critic that tells candidates apart: no group is skipped and the weights move."""
    trainer = _trainer(monkeypatch, _brightness_critic, train__update=update)
    before = _weights(trainer)
    stats = trainer.iteration(0)
    assert stats.skipped_groups == 0 and stats.loss is not None
    assert any(not torch.equal(v, before[k]) for k, v in trainer.model.state_dict().items())


@dataclass(slots=True)
class BestItems:
    """The best candidate of a group noised at one sigma."""

    group: GroupRollout
    x_t: torch.Tensor  # [1, F, C, H, W]
    v_target: torch.Tensor  # [1, F, C, H, W]
    sigma: torch.Tensor  # [1]
    candidate: list[int]  # [1]


class BestOfGroup(Update):
    """A third rule for the test: plain flow matching on each group's best candidate (a
    rejection-sampling fine-tune), a fixed EMA decay; it records what the trainer asks."""

    DECAY = 0.5

    def __init__(self, cfg) -> None:
        super().__init__(cfg)
        self.calls: list[str] = []
        self.losses: list[float] = []

    def rollout_fn(self):
        def run(*args, **kw):
            self.calls.append("rollout")
            return rollout_clip_level(*args, **kw)
        return run

    def kept(self, ctx, step, adv):
        self.calls.append("kept")
        return adv.argmax(dim=1, keepdim=True)

    def items(self, ctx, step, gid, group, r, adv, chosen):
        self.calls.append("items")
        x0 = group.candidates[chosen]
        noise = torch.randn(x0.shape, generator=generator(0, step, gid))
        sigma = torch.full((1,), 0.5)
        return BestItems(group=group, x_t=0.5 * x0 + 0.5 * noise, v_target=noise - x0,
                         sigma=sigma, candidate=chosen.tolist())

    def micro_loss(self, ctx, item, part, actions, cache: ContextCache, frozen, scale):
        self.calls.append("micro_loss")
        v = ctx.velocity(item.x_t[part], item.sigma[part], actions, cache)
        loss = (v - item.v_target[part]).square().mean() * (len(part) * scale)
        self.losses.append(loss.item())
        return MicroLoss(loss, 0.0)

    def ema_decay(self, step, schedule_steps):
        return self.DECAY


def test_a_third_update_rule_plugs_into_the_trainer(monkeypatch):
    """The trainer runs a rule it does not know: its rollout, selection, items and loss are
    used, the logged loss is the rule's, and the old model follows the rule's EMA decay."""
    rule = BestOfGroup(_config())
    trainer = _trainer(monkeypatch, _brightness_critic, rule=rule)
    before = _weights(trainer)
    old_before = {k: v.clone() for k, v in trainer.old.state_dict().items()}
    stats = trainer.iteration(0)
    groups = trainer.cfg.rollout.groups_per_rank
    assert rule.calls == (["rollout"] * groups + ["kept"] + ["items"] * groups
                          + ["micro_loss"] * groups)
    assert stats.loss == pytest.approx(sum(rule.losses))
    assert stats.ema_decay == BestOfGroup.DECAY and trainer.ref is None
    for name, value in trainer.model.state_dict().items():
        if value.is_floating_point() and not torch.equal(value, before[name]):
            torch.testing.assert_close(trainer.old.state_dict()[name],
                                       0.5 * old_before[name] + 0.5 * value)
            break
    else:
        raise AssertionError("no weight moved")


def test_build_update_picks_the_rule_train_update_names():
    assert type(build_update(_config())) is NFTUpdate
    assert type(build_update(_config(train__update="flow_grpo"))) is GRPOUpdate
    cfg = _config()
    cfg.train.update = "ppo"
    with pytest.raises(ValueError, match="train.update"):
        build_update(cfg)
