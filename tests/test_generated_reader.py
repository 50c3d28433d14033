"""A reward estimator trained on generated clip-1 frames labelled by the white-box reader: the
pool (wc_fast.tools.white_box_pool), the reward_generated recipe and the reward reading the
trained file (reward.reader_checkpoint)."""

import json

import pytest
import torch

from wc_fast import config
from wc_fast.cli import parse_run_args
from wc_fast.eval import KINDS, SEED_SETS
from wc_fast.rewards import build, load_estimator
from wc_fast.rewards.estimators import load_estimator_file
from wc_fast.rewards.flow_reader import read_path, rendered_flow
from wc_fast.tools import train_reward_models as trm
from wc_fast.tools.white_box_pool import POOL_SEED, set_sizes, white_box_pool
from wc_fast.world import sample_sequences, sequence_scenes

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def pool():
    return white_box_pool(2)


@pytest.fixture(scope="module")
def trained(pool, tmp_path_factory):
    """A reward_generated estimator after 2 steps on ``pool`` (the pool builder is the
    fixture's pool, its call recorded): (weights path, metadata, the builder's arguments)."""
    out = tmp_path_factory.mktemp("reader")
    calls = []

    def fake_pool(sequences, **kwargs):
        calls.append({"sequences": sequences, **kwargs})
        return pool

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(trm, "white_box_pool", fake_pool)
        meta = trm.train("reward_generated", steps=2, out=str(out), pool_sequences=2,
                         log_every=1, command="python -m wc_fast.tools.train_reward_models x")
    return out / f"{trm.GENERATED_READER}.safetensors", meta, calls


def test_pool_shapes_labels_and_seeds(pool):
    assert pool.frames.shape == (2, 5, 3, 32, 32)
    assert pool.c2w.shape == (2, 5, 4, 4)
    assert bool(torch.isfinite(pool.c2w).all()) and bool(torch.isfinite(pool.frames).all())
    torch.testing.assert_close(pool.c2w[:, 0], torch.eye(4, dtype=torch.float64).expand(2, 4, 4))
    assert pool.seeds == {"basic": POOL_SEED, "composite": POOL_SEED + 1}
    assert pool.source == "base"
    assert set_sizes(7) == {"basic": 3, "composite": 2, "composite_2key": 2}


def test_pool_seeds_are_apart_from_every_evaluation_seed():
    evaluation = {seed + k for seed in SEED_SETS.values() for k in range(len(KINDS))}
    assert not {POOL_SEED + k for k in range(len(KINDS))} & evaluation


def test_pool_is_deterministic_for_a_seed(pool):
    again = white_box_pool(1)  # the basic set's one sequence, as in the two-sequence pool
    assert torch.equal(again.frames, pool.frames[:1])
    assert torch.equal(again.c2w, pool.c2w[:1])


def test_white_box_labels_of_true_renders_give_the_true_targets():
    """read_path's paths and the rendered clips' c2w are the same convention: on true
    renders, the targets of the one equal those of the other."""
    data = sample_sequences(1, num_clips=1, seed=POOL_SEED, composite_fraction=1.0,
                            clip_frames=4, resolution=32)
    scenes, _ = sequence_scenes(POOL_SEED, 1)
    flow, depth = rendered_flow(scenes, data.c2w, resolution=32)
    read = trm.pose_targets(read_path(flow, depth))
    true = trm.pose_targets(data.c2w)
    assert true[..., [0, 2, 3, 4]].abs().amax() > 0.3  # the clip moves
    torch.testing.assert_close(read, true, atol=0.05, rtol=0.0)


def test_pool_pairs_are_consecutive_frames_with_their_targets(pool):
    frames, target = trm.pool_pairs(pool.frames, pool.c2w, 6, torch.Generator().manual_seed(0))
    assert frames.shape == (6, 2, 3, 32, 32) and target.shape == (6, 1, 6)
    for pair, want in zip(frames, target, strict=True):
        hits = [(i, k) for i in range(2) for k in range(4)
                if torch.equal(pool.frames[i, k:k + 2], pair)]
        i, k = hits[0]
        torch.testing.assert_close(want, trm.pose_targets(pool.c2w[i:i + 1, k:k + 2])[0])


def test_the_recipe_writes_a_loadable_estimator_that_records_its_pool(trained):
    path, meta, calls = trained
    assert calls == [{"sequences": 2, "seed": POOL_SEED, "checkpoint": None}]
    written = json.loads(path.with_suffix(".json").read_text())
    assert written["pool"] == {"sequences": 2, "seeds": {"basic": POOL_SEED,
                                                          "composite": POOL_SEED + 1},
                               "source": "base", "frames_per_clip": 5, "share": 0.5}
    assert written["train"]["steps_run"] == 2
    assert written["train"]["command"].startswith("python -m wc_fast.tools.train_reward_models")
    estimator = load_estimator_file(path)
    assert estimator(torch.zeros(1, 3, 3, 32, 32)).shape == (1, 3, 4, 4)


def test_the_recipe_never_writes_over_the_shipped_estimator():
    with pytest.raises(ValueError, match="--out"):
        trm.train("reward_generated", steps=1)
    with pytest.raises(SystemExit):
        trm.main(["--which", "reward_generated"])


def _cfg(checkpoint: str, reader: str = "estimator") -> config.Config:
    cfg = config.preset("cpu")
    config.apply_override(cfg, "reward.if_reader", reader)
    config.apply_override(cfg, "reward.reader_checkpoint", checkpoint)
    config.validate(cfg)
    return cfg


def test_the_reward_reads_with_the_named_estimator_file(trained):
    path, _, _ = trained
    reward = build(_cfg(str(path)))
    want = load_estimator_file(path).state_dict()
    got = reward.models.estimator.state_dict()
    assert all(torch.equal(got[k], want[k]) for k in want)
    frames = sample_sequences(1, num_clips=1, seed=POOL_SEED, clip_frames=4).frames
    with torch.no_grad():
        assert not torch.allclose(reward.models.estimator(frames), load_estimator("reward")(frames))
    joint = build(_cfg(str(path), "agreement")).models.estimator.state_dict()
    assert all(torch.equal(joint[k], want[k]) for k in want)


def test_a_missing_or_damaged_file_names_the_field(tmp_path):
    with pytest.raises(ValueError, match="reward.reader_checkpoint"):
        build(_cfg(str(tmp_path / "missing.safetensors")))
    damaged = tmp_path / "damaged.safetensors"
    damaged.write_bytes(b"not weights")
    damaged.with_suffix(".json").write_text("{}")
    with pytest.raises(ValueError, match="reward.reader_checkpoint"):
        build(_cfg(str(damaged)))


def test_the_schema_accepts_the_option_and_documents_it(capsys):
    with pytest.raises(ValueError, match="reward.reader_checkpoint"):
        _cfg("reader.pt")
    with pytest.raises(ValueError, match="reward.reader_checkpoint"):
        _cfg("reader.safetensors", "fit")
    assert _cfg("").reward.reader_checkpoint == ""
    with pytest.raises(SystemExit):
        parse_run_args("prog", "d", ["--help"], kind=config.RL_RUN, with_base=True)
    text = " ".join(capsys.readouterr().out.split())
    assert "--reward.reader_checkpoint" in text and "reward_generated" in text
