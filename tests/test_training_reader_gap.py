"""The reader gap during training (``train.reader_gap_every``): on the iterations it measures,
the label IF of the rollout as the reward's reader sees it minus the same IF as the classical
camera fit sees it, logged, plotted, and without any effect on training."""

import json

import pytest
import torch

from wc_fast import config as config_lib
from wc_fast.infra import checkpoint
from wc_fast.models import TinyWorldDiT
from wc_fast.rewards import registry as reward_registry
from wc_fast.rl.trainer import Trainer
from wc_fast.train import main

pytestmark = pytest.mark.usefixtures("one_thread")


def _trainer(every: int) -> Trainer:
    cfg = config_lib.preset("smoke")
    cfg.train.reader_gap_every = every
    torch.manual_seed(cfg.train.seed)
    return Trainer(cfg, TinyWorldDiT(cfg.model), torch.device("cpu"))


def test_logged_on_the_measured_iterations_and_plotted(tmp_path):
    assert main(["--preset", "smoke", "--steps", "3", "--out", str(tmp_path),
                 "--train.reader_gap_every", "2"]) == 0
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert ["reader_gap" in row for row in rows] == [True, False, True]
    assert all(-1.0 <= row["reader_gap"] <= 1.0 for row in rows if "reader_gap" in row)
    assert (tmp_path / "rewards.png").stat().st_size > 0


def test_the_fit_reading_the_rewards_own_paths_gives_zero(monkeypatch):
    """With the fit replaced by the reward's reader itself the gap is 0; with a fit that sees
    no motion it is the reader's IF minus the IF of standing still."""
    trainer = _trainer(1)
    paths = {}
    real_poses = reward_registry.camera_poses

    def reader(estimator, frames):
        paths["reader"] = real_poses(estimator, frames)
        return paths["reader"]

    monkeypatch.setattr(reward_registry, "camera_poses", reader)
    monkeypatch.setattr(reward_registry, "fit_path", lambda frames: paths["reader"].double())
    assert trainer.iteration(0).reader_gap == 0.0
    still = _trainer(1)
    monkeypatch.setattr(reward_registry, "fit_path", lambda frames: torch.eye(4).double().expand(
        frames.shape[0], frames.shape[1], 4, 4))
    gap = still.iteration(0).reader_gap
    assert gap is not None and gap != 0.0


def test_measuring_does_not_change_training():
    measured, plain = _trainer(1), _trainer(0)
    rows = [(measured.iteration(step), plain.iteration(step)) for step in range(2)]
    assert all(a.reader_gap is not None and b.reader_gap is None for a, b in rows)
    assert [a.loss for a, _ in rows] == [b.loss for _, b in rows]
    for (key, x), y in zip(measured.model.state_dict().items(),
                           plain.model.state_dict().values(), strict=True):
        assert torch.equal(x, y), key


def test_a_negative_period_is_refused():
    cfg = config_lib.preset("smoke")
    cfg.train.reader_gap_every = -1
    with pytest.raises(ValueError, match="train.reader_gap_every"):
        config_lib.validate(cfg)


def test_a_run_resumes_with_another_period(tmp_path):
    args = ["--preset", "smoke", "--steps", "2", "--out", str(tmp_path),
            "--train.ckpt_every", "1"]
    assert main([*args, "--train.reader_gap_every", "0"]) == 0
    assert main([*args, "--train.reader_gap_every", "1", "--resume"]) == 0
    assert checkpoint.latest(tmp_path).name.endswith("2")


def test_the_classical_fit_as_the_reward_reader(monkeypatch):
    """``reward.if_reader fit``: every group's IF reward is read by the camera fit (no network
    is asked), so the reader gap is 0."""
    from wc_fast.actions import split_action
    from wc_fast.rewards import interaction_score

    cfg = config_lib.preset("smoke")
    config_lib.apply_override(cfg, "reward.if_reader", "fit")
    config_lib.validate(cfg)
    torch.manual_seed(cfg.train.seed)
    trainer = Trainer(cfg, TinyWorldDiT(cfg.model), torch.device("cpu"))
    read = []
    real_fit = reward_registry.fit_path

    def fit(frames):
        read.append(real_fit(frames))
        return read[-1]

    def no_network(*args):
        raise AssertionError("the reward estimator was asked")

    monkeypatch.setattr(reward_registry, "fit_path", fit)
    monkeypatch.setattr(reward_registry, "camera_poses", no_network)
    groups = trainer.rollout(0, 1)
    s_if, _, _ = trainer.rewards(groups)
    assert len(read) == len(groups)
    for row, group, path in zip(s_if, groups, read, strict=True):
        trans, rot = split_action(group.clip_actions)
        want = interaction_score(path, trans, rot, trans_thresholds=cfg.reward.trans_thresholds,
                                 rot_threshold_deg=cfg.reward.rot_threshold_deg)
        torch.testing.assert_close(row, want.float())
    cfg.train.reader_gap_every = 1
    assert trainer.iteration(0).reader_gap == 0.0


def test_the_plot_draws_each_gap_and_their_running_mean(tmp_path, monkeypatch):
    """rewards.png's last panel: the measured gaps as points and their running mean over a
    third of them as the trend line."""
    import matplotlib.pyplot as plt

    from wc_fast.infra.metrics import plot_rewards

    figures = []
    monkeypatch.setattr(plt, "close", figures.append)
    gaps = [0.0, 0.3, 0.0, 0.3, 0.6, 0.0]
    rows = [{"step": s, "if_mean": 0.5, "vq_mean": 0.1, "loss": 1.0,
             **({"reader_gap": gaps[s // 10]} if s % 10 == 0 else {})} for s in range(60)]
    assert plot_rewards(rows, tmp_path / "rewards.png").stat().st_size > 0
    points, trend = figures[0].axes[4].get_lines()[:2]
    assert list(points.get_xdata()) == [0, 10, 20, 30, 40, 50]
    assert list(points.get_ydata()) == gaps
    assert list(trend.get_ydata()) == pytest.approx([0.0, 0.15, 0.15, 0.15, 0.45, 0.3])
