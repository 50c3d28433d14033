"""The reward is chosen by name: every name the config accepts has an implementation, the
adapters are chosen from the config with their checkpoints, and the reward the registry
builds scores as the functions it names."""

import typing

import pytest
import torch

from wc_fast import config as C
from wc_fast.actions import split_action
from wc_fast.rewards import registry
from wc_fast.rewards.interaction import interaction_score
from wc_fast.rl.rollout import GroupRollout


@pytest.mark.parametrize(("table", "choices"), [(registry.READERS | registry.JOINT_READERS,
                                                 C.IfReader),
                                                (registry.IF_SCORES, C.IfKind),
                                                (registry.CRITICS, C.CriticKind)])
def test_every_name_the_config_accepts_is_registered(table, choices):
    assert set(table) == set(typing.get_args(choices))


def test_the_config_knows_every_reader_that_reads_with_the_reward_estimator():
    """reward.reader_checkpoint may replace the estimator of exactly these readers (the config
    cannot import the registry, so its list is kept in step here)."""
    from wc_fast.config.validation import ESTIMATOR_READERS

    joint = {name: readers for name, (readers, _) in registry.JOINT_READERS.items()}
    assert set(ESTIMATOR_READERS) == {"estimator"} | {
        name for name, readers in joint.items() if "estimator" in readers}


# (field, adapter, its checkpoint's field, another choice of the field, which takes no file)
@pytest.mark.parametrize(("field", "value", "path", "other_value"), [
    ("reward.if_reader", "depth_anything_3", "reward.reader_checkpoint", "fit"),
    ("reward.critic", "hpsv3", "reward.critic_checkpoint", "reward"),
])
def test_an_adapter_needs_its_checkpoint_and_only_it_takes_one(field, value, path, other_value):
    cfg = C.preset("smoke")
    C.apply_override(cfg, field, value)
    with pytest.raises(ValueError, match=f"{path} must be a local checkpoint path"):
        C.validate(cfg)
    other = C.preset("smoke")
    C.apply_override(other, field, other_value)
    C.apply_override(other, path, "/models/x")
    with pytest.raises(ValueError, match=f"{path} must be empty unless {field} is {value}"):
        C.validate(other)


def test_an_adapter_without_its_package_names_the_install(tmp_path, monkeypatch):
    cfg = C.preset("smoke")
    C.apply_override(cfg, "reward.critic", "hpsv3")
    C.apply_override(cfg, "reward.critic_checkpoint", str(tmp_path / "HPSv3_7B.pth"))
    C.validate(cfg)
    monkeypatch.setitem(__import__("sys").modules, "hpsv3", None)
    with pytest.raises(ImportError, match="pip install hpsv3"):
        registry.build(cfg)


def _group(cfg: C.Config) -> tuple[GroupRollout, torch.Tensor]:
    g, f, r = 3, cfg.model.clip_frames, cfg.model.resolution
    frames = torch.rand(g, f + 1, 3, r, r, generator=torch.Generator().manual_seed(0))
    group = GroupRollout.__new__(GroupRollout)
    group.clip_actions = torch.full((f,), 1)
    group.clip_index, group.prompt_seed = 1, 5
    return group, frames


def test_the_built_reward_scores_by_the_named_reader_score_and_critic():
    cfg = C.preset("smoke")
    reward = registry.build(cfg)
    group, frames = _group(cfg)
    scores = reward(group, frames)
    c2w = registry.camera_poses(reward.models.estimator, frames)
    trans, rot = split_action(group.clip_actions)
    rw = cfg.reward
    torch.testing.assert_close(scores.c2w, c2w, rtol=0, atol=0)
    torch.testing.assert_close(scores.s_if, interaction_score(
        c2w, trans, rot, trans_thresholds=rw.trans_thresholds,
        rot_threshold_deg=rw.rot_threshold_deg), rtol=0, atol=0)
    torch.testing.assert_close(scores.s_vq, registry.vq_scores(
        reward.models.critic, frames, stride=rw.vq_stride, mode=rw.vq_mode), rtol=0, atol=0)
    assert scores.s_if.shape == scores.s_vq.shape == (3,)


def test_the_fit_as_reader_reads_no_network_and_has_no_gap(monkeypatch):
    cfg = C.preset("smoke")
    C.apply_override(cfg, "reward.if_reader", "fit")
    reward = registry.build(cfg)

    def no_network(*args):
        raise AssertionError("the estimator was asked")

    monkeypatch.setattr(registry, "camera_poses", no_network)
    group, frames = _group(cfg)
    scores = reward(group, frames)
    assert scores.c2w.shape == (3, cfg.model.clip_frames + 1, 4, 4)
    assert reward.reader_gap(group, frames, scores) == 0.0


@pytest.mark.parametrize(("reader", "combine"), [
    ("agreement", torch.minimum),
    ("ensemble", lambda a, b: (a + b) / 2),
])
def test_joint_readers_pay_the_combination_of_the_estimators_and_the_fits_if(
        monkeypatch, reader, combine):
    """agreement pays the lower of the two readers' IF, ensemble their mean."""
    cfg = C.preset("smoke")
    C.apply_override(cfg, "reward.if_reader", reader)
    reward = registry.build(cfg)
    group, frames = _group(cfg)
    c2w = registry.camera_poses(reward.models.estimator, frames)
    fitted = registry.fit_path(frames.float())
    trans, rot = split_action(group.clip_actions)
    rw = cfg.reward
    reads = [interaction_score(path.double(), trans, rot, trans_thresholds=rw.trans_thresholds,
                               rot_threshold_deg=rw.rot_threshold_deg) for path in (c2w, fitted)]
    scores = reward(group, frames)
    assert not torch.equal(*reads)  # the readers disagree somewhere: the combination shows
    torch.testing.assert_close(scores.s_if.double(), combine(*reads), rtol=0, atol=1e-6)
    torch.testing.assert_close(scores.c2w, c2w, rtol=0, atol=0)
    # where the fit reads what the estimator reads, the reward is the estimator's own
    monkeypatch.setattr(registry, "fit_path", lambda f: c2w.double())
    torch.testing.assert_close(reward(group, frames).s_if.double(), reads[0], rtol=0,
                               atol=1e-6)
