"""The critic's training data: degraded renders and the base world model's own generations."""

import json
from pathlib import Path

import pytest
import torch

from wc_fast.eval import KINDS as SETS
from wc_fast.tools import evaluate_reward_models as acceptance
from wc_fast.tools import train_reward_models as trainer


def test_generated_pairs_hold_each_sets_true_and_generated_frames():
    pairs = trainer.generated_pairs(2, 1, seed=11)
    assert list(pairs) == list(SETS)
    for true, made in pairs.values():
        assert true.shape == made.shape == (2 * 4, 3, 32, 32)  # 2 sequences x 4 new frames
        assert torch.isfinite(made).all() and not torch.equal(true, made)
    again = trainer.generated_pairs(2, 1, seed=11)
    for name in SETS:  # deterministic: the same rollout noise, the same frames
        torch.testing.assert_close(again[name][1], pairs[name][1], rtol=0, atol=0)


def test_generated_pairs_come_from_the_given_checkpoint(tmp_path):
    """A checkpoint's generations, not the base's: a random model draws other frames of the
    same true renders."""
    from wc_fast.config import preset
    from wc_fast.models import TinyWorldDiT
    from wc_fast.models.pretrained import export_world_model

    torch.manual_seed(0)
    cfg = preset("cpu").model
    weights = export_world_model(TinyWorldDiT(cfg), tmp_path / "m.safetensors", {"note": "test"})
    base = trainer.generated_pairs(2, 1, seed=11)
    other = trainer.generated_pairs(2, 1, seed=11, checkpoint=weights)
    for name in SETS:
        torch.testing.assert_close(other[name][0], base[name][0], rtol=0, atol=0)
        assert other[name][1].shape == base[name][1].shape
        assert not torch.allclose(other[name][1], base[name][1])
    with pytest.raises(FileNotFoundError):
        trainer.generated_pairs(1, 1, seed=11, checkpoint=tmp_path / "missing.safetensors")


def test_held_out_check_needs_its_checkpoints():
    with pytest.raises(SystemExit):
        acceptance.main(["--only", "held_out"])
    with pytest.raises(SystemExit):
        acceptance.main(["--held-out", "some/checkpoint"])


class _Recorder(torch.nn.Module):
    """Scores a frame by its mean and keeps what it was given."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[torch.Tensor] = []
        self.bias = torch.nn.Parameter(torch.zeros(()))

    def forward(self, x):
        self.seen.append(x)
        return x.mean((2, 3, 4)) + self.bias


def test_critic_loss_ranks_the_true_frames_of_the_pool_above_their_generations():
    true = torch.full((5, 3, 32, 32), 0.5)
    made = torch.full((5, 3, 32, 32), -0.5)
    recipe = {"batch": 10, "data_seed": 3000, "generated": {"batch": 4}, "pool": (true, made)}
    model = _Recorder()
    loss, stats = trainer._critic_loss(model, 0, recipe, torch.Generator().manual_seed(0),
                                       torch.device("cpu"))
    frames = model.seen[0][:, 0]  # clean rows, then their negatives in the same order
    clean, negative = frames.chunk(2)
    assert frames.shape[0] == 2 * (10 + 4)
    torch.testing.assert_close(clean[-4:], true[:4])
    torch.testing.assert_close(negative[-4:], made[:4])
    without = dict(recipe)
    without.pop("pool")
    model = _Recorder()
    trainer._critic_loss(model, 0, without, torch.Generator().manual_seed(0), torch.device("cpu"))
    assert model.seen[0].shape[0] == 2 * 10
    assert torch.isfinite(loss) and 0.0 <= stats["pair_acc"] <= 1.0


def test_critic_training_builds_the_pool_and_records_its_recipe(tmp_path, monkeypatch):
    recipe = dict(trainer.RECIPES["critic_eval"], batch=10,
                  generated={"sequences": 1, "clips": 1, "seed": 7, "batch": 2})
    monkeypatch.setitem(trainer.RECIPES, "critic_eval", recipe)
    meta = trainer.train("critic_eval", steps=2, out=str(tmp_path), log_every=1)
    assert meta["train"]["generated"] == recipe["generated"] and "pool" not in meta["train"]
    written = json.loads((tmp_path / "critic_eval.json").read_text())
    assert written["train"]["steps_run"] == 2
    assert (tmp_path / "critic_eval.safetensors").is_file()
    assert "generated" not in trainer.RECIPES["critic"]  # the reward's critic: degradations only


def test_the_reward_and_the_evaluation_load_different_critics():
    from wc_fast.rewards import load_critic
    frames = torch.rand(2, 3, 3, 32, 32) * 2 - 1
    reward, evaluation = load_critic("reward"), load_critic("eval")
    assert not torch.allclose(reward(frames), evaluation(frames))
    torch.testing.assert_close(load_critic()(frames), reward(frames))  # the default: reward
    with pytest.raises(ValueError, match="which must be one of"):
        load_critic("best")


def test_true_vs_generated_reports_every_set():
    critic = _Recorder()
    report = acceptance.true_vs_generated(critic, sequences=2, clips=2)
    assert list(report) == list(SETS)
    for block in report.values():
        assert 0.0 <= block["true_above_generated"] <= 1.0
        assert len(block["generated_by_clip"]) == 2
        assert all(isinstance(v, float) for v in block["generated_by_clip"])


@pytest.mark.parametrize("which", ["reward", "eval"])
def test_reward_critic_option_picks_the_trainers_critic(which):
    from wc_fast.config import preset
    from wc_fast.models import TinyWorldDiT
    from wc_fast.rewards import load_critic
    from wc_fast.rl.trainer import Trainer
    cfg = preset("smoke")
    cfg.reward.critic = which
    trainer = Trainer(cfg, TinyWorldDiT(cfg.model), torch.device("cpu"))
    frames = torch.rand(2, 3, 3, 32, 32) * 2 - 1
    torch.testing.assert_close(trainer.reward.models.critic(frames), load_critic(which)(frames))


def test_an_estimator_file_is_measured_as_the_shipped_estimators_are():
    """``--estimator-file``: a ``train_reward_models --out`` file gets the shipped estimators'
    acceptance numbers (label agreement, IF of true renders, motion error), alone."""
    path = str(Path(__file__).parents[1] / "studies" / "results" / "readers"
               / "camera_reward_generated.safetensors")
    report = acceptance.evaluate(clips=4, threads=1, only=(), estimator_files=[path])
    measured = report[f"estimator_file:{path}"]
    assert "estimator_reward" not in report and "critic" not in report
    assert set(measured) == {"labels", "if_ground_truth", "motion_error_steps", "seconds"}
    assert 0.0 <= measured["motion_error_steps"] < 1.0
