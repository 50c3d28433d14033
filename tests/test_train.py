"""The RL driver on the smoke preset: outputs, exact resume, ranks, and bad input."""

import json
import math
import shutil

import pytest
import torch
from gloo_ranks import spawn_ranks
from safetensors.torch import load_file

from wc_fast.config import preset
from wc_fast.infra import checkpoint
from wc_fast.infra.telemetry import GpuTelemetry
from wc_fast.models import TinyWorldDiT
from wc_fast.rl.ema import ema_decay
from wc_fast.rl.trainer import RewardNaNError, Trainer
from wc_fast.train import main

SMOKE = ["--preset", "smoke", "--train.ckpt_every", "1"]


def _final_weights(out, name: str = "model") -> dict:
    """Model ``name``'s weights in ``out``'s newest checkpoint (either format)."""
    return checkpoint.read_weights(checkpoint.latest(out), name)


def _assert_same(a: dict, b: dict, atol: float = 0.0) -> None:
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=0 if atol == 0 else 1e-4, atol=atol,
                                   msg=key)


def test_smoke_run_writes_metrics_checkpoints_and_plot(tmp_path):
    """One metrics row per iteration with its values; only the newest ``keep_last``
    checkpoints stay."""
    assert main([*SMOKE, "--steps", "3", "--out", str(tmp_path), "--train.keep_last", "2"]) == 0
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [(row["step"], row["clip"]) for row in rows] == [(1, 1), (2, 2), (3, 1)]
    cfg = preset("smoke")
    assert [row["ema_decay"] for row in rows] == pytest.approx(
        [ema_decay(step, 3, start=cfg.ema.start, end=cfg.ema.end) for step in range(3)])
    for row in rows:
        assert 0.0 <= row["if_mean"] <= 1.0 and math.isfinite(row["vq_mean"])
        assert row["r_std"] >= 0.0 and row["skipped_groups"] in (0, 1)
        assert math.isfinite(row["loss"]) and (row["loss"] == 0.0) == (row["skipped_groups"] == 1)
        assert all(row[f"{phase}_s"] > 0 for phase in ("rollout", "reward", "train"))
        assert row["clips_per_s"] > 0 and row["train_tflops"] >= 0
    assert (tmp_path / "rewards.png").is_file()
    kept = checkpoint.list_checkpoints(tmp_path)
    assert [checkpoint.load(path, models={}, restore_rng=False).step
            for path in kept] == [2, 3]


def test_eval_at_end_writes_the_base_and_trained_evaluations(tmp_path):
    """``summary.json`` holds the evaluation of the initial model and of the final one, each
    equal to evaluating that model directly with the run's settings."""
    from wc_fast.eval import EvalSettings, evaluate
    from wc_fast.models.pretrained import load_checkpoint_model
    from wc_fast.rewards import load_estimator

    assert main([*SMOKE, "--steps", "2", "--out", str(tmp_path), "--train.eval_at_end", "true",
                 "--train.eval_sequences", "1", "--train.eval_clips", "1"]) == 0
    results = json.loads((tmp_path / "summary.json").read_text())
    assert set(results) == {"base", "trained"}
    cfg = preset("smoke")
    settings = EvalSettings.from_config(cfg, sequences=1, clips=1)
    estimator = load_estimator("eval", device="cpu")
    torch.manual_seed(cfg.train.seed)
    base = TinyWorldDiT(cfg.model).eval()
    trained = load_checkpoint_model(checkpoint.latest(tmp_path), torch.device("cpu")).eval()
    for name, model in (("base", base), ("trained", trained)):
        want = json.loads(json.dumps(evaluate(model, settings, estimator=estimator)))
        assert results[name] == want, name
    assert results["base"]["settings"]["sequences"] == 1
    assert results["base"]["basic"] != results["trained"]["basic"]  # the run changed the model
    assert (tmp_path / "rollouts.png").stat().st_size > 0


@pytest.mark.parametrize("extra", [[], ["--nft.kl_beta", "0.5"]], ids=["plain", "kl"])
def test_resume_continues_exactly(tmp_path, extra):
    """Also with a KL, whose reference a resumed run rebuilds from the initial model."""
    args = [*SMOKE, *extra, "--steps", "3", "--out", str(tmp_path), "--train.keep_last", "3"]
    assert main(args) == 0
    uninterrupted = _final_weights(tmp_path)
    damaged = checkpoint.latest(tmp_path) / "state.pt"  # one flipped bit
    data = bytearray(damaged.read_bytes())
    data[len(data) // 2] ^= 1
    damaged.write_bytes(bytes(data))
    with pytest.warns(UserWarning, match="skipping damaged checkpoint step_00000003"):
        assert main([*args, "--resume"]) == 0
    _assert_same(uninterrupted, _final_weights(tmp_path))
    rows = [json.loads(r) for r in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [1, 2, 3]
    # a KL run logs its mean KL per trained row: 0 on the first update, above 0 after it
    kl = [row.get("kl") for row in rows]
    assert kl == [None] * 3 if not extra else (kl[0] == 0.0 and min(kl[1:]) > 0)


def _rank(rank: int, args: list[str]) -> None:
    assert main(args) == 0


@pytest.mark.slow
@pytest.mark.parametrize(("mode", "kl_beta"), [("ddp", "0"), ("fsdp2", "0"), ("fsdp2", "0.1")])
def test_two_gloo_ranks_equal_one_process_over_the_same_groups(tmp_path, mode, kl_beta):
    """Under FSDP2 the old and reference models are built shard by shard from the sharded
    model; the KL case checks the reference's shards hold the initial weights."""
    common = [*SMOKE, "--steps", "2", "--reward.std", "global", "--nft.kl_beta", kl_beta]
    one, two = tmp_path / "one", tmp_path / "two"
    assert main([*common, "--out", str(one), "--rollout.groups_per_rank", "2"]) == 0
    spawn_ranks(_rank, ([*common, "--out", str(two), "--rollout.groups_per_rank", "1",
                         "--train.distributed", mode],), tmp_path)
    # the ranks' gradient sum rounds differently from one process's accumulation (fp32); Muon's
    # bf16 Newton-Schulz can turn that into a bf16 rounding flip of a zero-initialised
    # modulation weight's update: measured up to 1.1e-5 (a logic error is 1e-3 or more)
    _assert_same(_final_weights(one), _final_weights(two), atol=5e-5)
    if mode == "fsdp2":
        _assert_same(_final_weights(one, "old"), _final_weights(two, "old"), atol=5e-5)


@pytest.mark.slow
def test_fsdp2_run_resumes_exactly(tmp_path):
    args = [*SMOKE, "--steps", "3", "--out", str(tmp_path), "--train.keep_last", "3",
            "--train.distributed", "fsdp2"]
    spawn_ranks(_rank, (args,), tmp_path)
    uninterrupted = _final_weights(tmp_path)
    shutil.rmtree(checkpoint.latest(tmp_path))
    spawn_ranks(_rank, ([*args, "--resume"],), tmp_path)
    _assert_same(uninterrupted, _final_weights(tmp_path))


def test_resume_refuses_another_config_and_damaged_checkpoints(tmp_path):
    assert main([*SMOKE, "--steps", "1", "--out", str(tmp_path)]) == 0
    with pytest.raises(checkpoint.CheckpointError, match="nft.beta"):
        main([*SMOKE, "--steps", "2", "--out", str(tmp_path), "--resume", "--nft.beta", "0.5"])
    weights = checkpoint.latest(tmp_path) / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    with pytest.warns(UserWarning, match="skipping damaged checkpoint step_00000001"), \
            pytest.raises(checkpoint.CheckpointError,
                          match="no intact checkpoint.*model.safetensors fails its sha256"):
        main([*SMOKE, "--steps", "2", "--out", str(tmp_path), "--resume"])
    with pytest.raises(checkpoint.CheckpointError, match="no checkpoint found"):
        main([*SMOKE, "--steps", "2", "--out", str(tmp_path / "nothing"), "--resume"])


def test_resumes_a_checkpoint_whose_config_held_the_pretraining_section(tmp_path):
    """Checkpoints written while the RL config held ``pretrain``, which the run never read."""
    assert main([*SMOKE, "--steps", "1", "--out", str(tmp_path)]) == 0
    meta_path = checkpoint.latest(tmp_path) / "meta.json"
    meta = json.loads(meta_path.read_text())
    meta["config"]["pretrain"] = {"steps": 3000, "lr": 5e-4, "out": "runs/pretrain"}
    meta["sha256"] = checkpoint._meta_digest(meta)  # as that version wrote it
    meta_path.write_text(json.dumps(meta))
    assert main([*SMOKE, "--steps", "2", "--out", str(tmp_path), "--resume"]) == 0
    assert checkpoint.latest(tmp_path).name.endswith("00000002")


def test_resumes_a_checkpoint_written_before_fields_were_added(tmp_path):
    """A field added since a checkpoint was written is read at its default (which is what
    the run that wrote it did); another value of it is still a mismatch."""
    assert main([*SMOKE, "--steps", "1", "--out", str(tmp_path)]) == 0
    meta_path = checkpoint.latest(tmp_path) / "meta.json"
    meta = json.loads(meta_path.read_text())
    for section, field in (("reward", "reader_checkpoint"), ("reward", "critic_checkpoint"),
                           ("train", "collective_timeout_s"), ("nft", "kl_beta")):
        del meta["config"][section][field]
    meta["sha256"] = checkpoint._meta_digest(meta)  # as that version wrote it
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(checkpoint.ConfigMismatchError, match="nft.kl_beta: 0.0 -> 0.1"):
        main([*SMOKE, "--steps", "2", "--out", str(tmp_path), "--resume", "--nft.kl_beta",
              "0.1"])
    assert main([*SMOKE, "--steps", "2", "--out", str(tmp_path), "--resume"]) == 0
    assert checkpoint.latest(tmp_path).name.endswith("00000002")


def test_resumes_a_checkpoint_whose_config_held_the_update_settings_in_section_nft(tmp_path):
    """Checkpoints written while ``context_kv``, ``micro_batch`` and ``compile`` were in
    ``nft``: their values compare with section ``update``'s."""
    args = [*SMOKE, "--out", str(tmp_path), "--update.context_kv", "reuse"]
    assert main([*args, "--steps", "1"]) == 0
    meta_path = checkpoint.latest(tmp_path) / "meta.json"
    meta = json.loads(meta_path.read_text())
    meta["config"]["nft"].update(meta["config"].pop("update"))
    meta["sha256"] = checkpoint._meta_digest(meta)  # as that version wrote it
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(checkpoint.ConfigMismatchError,
                       match="update.context_kv: 'reuse' -> 'recompute'"):
        main([*SMOKE, "--out", str(tmp_path), "--steps", "2", "--resume"])
    assert main([*args, "--steps", "2", "--resume"]) == 0
    assert checkpoint.latest(tmp_path).name.endswith("00000002")


def test_unknown_field_is_a_usage_error(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main([*SMOKE, "--rollout.bogus", "1", "--out", str(tmp_path)])
    assert "unknown config field 'rollout.bogus'" in capsys.readouterr().err


def test_nan_reward_is_a_clear_error(tmp_path, monkeypatch):
    def nan_critic(self, groups):
        g = self.cfg.rollout.group_size
        return (torch.rand(len(groups), g), torch.full((len(groups), g), float("nan")),
                [1.0] * len(groups))

    monkeypatch.setattr(Trainer, "_scores", nan_critic)
    with pytest.raises(RewardNaNError, match="VQ reward returned NaN"):
        main([*SMOKE, "--steps", "1", "--out", str(tmp_path)])


def test_all_equal_groups_make_no_update_and_are_counted(tmp_path, monkeypatch):
    def flat(self, groups):
        g = self.cfg.rollout.group_size
        return (torch.full((len(groups), g), 0.5), torch.full((len(groups), g), 0.25),
                [0.0] * len(groups))

    monkeypatch.setattr(Trainer, "_scores", flat)
    assert main([*SMOKE, "--steps", "1", "--out", str(tmp_path),
                 "--train.init", "random"]) == 0
    row = (tmp_path / "metrics.jsonl").read_text()
    assert '"skipped_groups": 1' in row
    trained = load_file(checkpoint.latest(tmp_path) / "model.safetensors")
    torch.manual_seed(preset("smoke").train.seed)
    fresh = TinyWorldDiT(preset("smoke").model).state_dict()
    _assert_same(trained, {k: v.contiguous() for k, v in fresh.items()})


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU behaviour")
def test_telemetry_is_off_without_a_gpu():
    telemetry = GpuTelemetry()
    assert telemetry.status.startswith("telemetry off")
    assert telemetry.read() == {}


@pytest.mark.slow
def test_compiled_train_phase_matches_eager(tmp_path):
    """``update.compile`` changes how the train phase runs, not what it computes."""
    weights = {}
    for flag in ("false", "true"):
        out = tmp_path / flag
        assert main([*SMOKE, "--steps", "1", "--out", str(out), "--update.compile", flag]) == 0
        weights[flag] = _final_weights(out)
    _assert_same(weights["false"], weights["true"], atol=1e-5)
    torch.manual_seed(preset("smoke").train.seed)
    init = TinyWorldDiT(preset("smoke").model).state_dict()
    moved = max((weights["true"][k] - init[k]).abs().max().item() for k in init)
    assert moved > 1e-5  # the step did update the weights, so the comparison can fail


def test_compile_without_a_cpp_compiler_warns_and_trains_eagerly(monkeypatch):
    import torch._inductor.cpp_builder as cpp_builder
    from torch._inductor.exc import InvalidCxxCompiler

    def no_compiler():
        raise InvalidCxxCompiler()

    monkeypatch.setattr(cpp_builder, "get_cpp_compiler", no_compiler)
    cfg = preset("smoke")
    cfg.update.compile = True
    model = TinyWorldDiT(cfg.model)
    with pytest.warns(UserWarning, match="no C.. compiler.*runs eagerly"):
        trainer = Trainer(cfg, model, torch.device("cpu"))
    assert not trainer.compiled
    assert trainer.context.velocity == trainer.model.velocity
    cfg.update.compile = False
    assert not Trainer(cfg, TinyWorldDiT(cfg.model), torch.device("cpu")).compiled


def test_init_weights_must_match_the_model_config_except_its_dtype(tmp_path):
    from wc_fast.models.pretrained import export_world_model
    from wc_fast.train import initial_model

    cfg = preset("smoke")
    weights = export_world_model(TinyWorldDiT(cfg.model), tmp_path / "w.safetensors", {})
    cfg.train.init = str(weights)
    cfg.model.dtype = "bfloat16"  # the autocast dtype is the run's choice
    model = initial_model(cfg, torch.device("cpu"))
    assert model.cfg.dtype == "bfloat16" and model.patch_embed.weight.dtype == torch.float32
    cfg.model.dim = 64
    with pytest.raises(ValueError, match=r"model.dim: weights 32 vs config 64"):
        initial_model(cfg, torch.device("cpu"))


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("kind,sign", [("if", 1.0), ("if", -1.0), ("vq", 1.0), ("both", 1.0)])
def test_training_climbs_a_reward_in_its_direction(kind, sign):
    """With a reward the model can easily change (the candidates' mean brightness, or its
    negative), 60 NFT iterations raise it: the update moves the model towards the
    higher-rewarded candidates, whichever they are. The other channel scores the opposite, so
    the run also falls if ``reward.kind`` reads the wrong channel or, with ``both`` (lam 0.9),
    if lam and 1 - lam are swapped."""
    cfg = preset("smoke")
    cfg.reward.kind = kind
    cfg.reward.lam = 0.9
    cfg.optim.lr = 1e-2
    cfg.train.steps = 60
    rewards = []

    class BrightnessReward(Trainer):
        def _scores(self, groups):
            s = torch.stack([sign * g.candidates.mean(dim=(1, 2, 3, 4)) for g in groups]).float()
            rewards.append(float(s.mean()))
            channels = (-s, s) if kind == "vq" else (s, -s)
            return (*channels, [0.0] * len(groups))

    torch.manual_seed(0)
    trainer = BrightnessReward(cfg, TinyWorldDiT(cfg.model), torch.device("cpu"))
    for step in range(cfg.train.steps):
        trainer.iteration(step)
    first, last = sum(rewards[:10]) / 10, sum(rewards[-10:]) / 10
    assert last - first > 0.01, (first, last)
