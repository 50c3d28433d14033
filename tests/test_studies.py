"""The study programs (studies/) run end to end on the smoke preset and report sane numbers
(timings are not asserted: speed is measured by running the programs, not in tests)."""

import importlib
import json
import re
import shutil
import warnings
from pathlib import Path

import pytest
import torch

from wc_fast.config import to_dict

ROOT = Path(__file__).resolve().parents[1]


def _load(name: str = "rl_iteration"):
    return importlib.import_module(f"studies.{name}")


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_rl_iteration_writes_every_sides_phase_times_and_flop_rates(tmp_path, dtype):
    out = tmp_path / "rl.json"
    assert _load().main(["--preset", "smoke", "--device", "cpu", "--json", str(out),
                         "--set", f"model.dtype={dtype}"]) == 0
    result = json.loads(out.read_text())
    assert set(result["ours_phases_s"]) == set(result["official_style_phases_s"]) \
        == set(result["batched_eager_phases_s"])
    assert {"rollout", "reward", "train"} <= set(result["ours_phases_s"])
    assert all(v > 0 for v in result["ours_phases_s"].values())
    assert all(v > 0 for v in result["batched_eager_phases_s"].values())
    assert result["speedup"] == pytest.approx(result["official_style_s"] / result["ours_s"])
    assert result["speedup_vs_batched"] == pytest.approx(
        result["batched_eager_s"] / result["ours_s"])
    assert result["compute_dtype"] == dtype
    assert 0 < result["flop_fraction"] and 0 < result["mfu"]
    if dtype == "float32":
        assert result["mfu"] == result["flop_fraction"]


def test_wan_iteration_reports_each_variant_and_what_it_trains(tmp_path):
    out = tmp_path / "wan.json"
    assert _load("wan_iteration").main([
        "--shape", "tiny", "--device", "cpu", "--resolution", "64", "--clip-frames", "2",
        "--group-size", "4", "--steps", "2", "--variants", "full,lora+checkpointing",
        "--layers", "1", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["layers"] == 1
    full, lora = result["variants"]
    assert (full["variant"], lora["variant"]) == ("full", "lora+checkpointing")
    assert (lora["lora_rank"], lora["activation_checkpointing"]) == (16, True)
    for row in (full, lora):
        assert {"rollout", "reward", "train"} <= set(row["phases_s"])
        assert row["total_s"] == pytest.approx(sum(row["phases_s"].values()))
        assert row["mfu_measured"] > 0 and row["mfu_spec"] is None and row["peak_mib"] is None
    # every weight trains without LoRA; with it, the adapters add weights and the backbone's
    # own weights but the conditioning ones are frozen
    assert full["trained_parameters"] == full["parameters"] < lora["parameters"]
    assert 0 < lora["parameters"] - lora["trained_parameters"] < full["parameters"]
    summary = _load("summarize").wan_iteration_summary(out, result)
    assert len(summary) == 3 and "lora+checkpointing" in summary[2]
    assert summary[0].startswith("wan.json: tiny layers=1 on cpu,"), summary[0]


def test_wan_iteration_layers_keep_each_blocks_shape():
    study = _load("wan_iteration")
    wan = study.SHAPES["wan2.1-1.3b"]
    shape = study.with_layers(wan, 2)
    assert shape["transformer"] == {**wan["transformer"], "num_layers": 2}
    assert shape["vae"] is wan["vae"] and wan["transformer"]["num_layers"] == 30
    assert study.with_layers(wan, None) is wan
    for bad in (0, True, 1.5):
        with pytest.raises(ValueError, match="layers"):
            study.with_layers(wan, bad)
    assert study.parse_args(["--variants", "lora,full"]).variants == ["lora", "full"]
    for argv in (["--layers", "0"], ["--variants", "fast"], ["--variants", ","]):
        with pytest.raises(SystemExit):
            study.parse_args(argv)


def test_reward_agreement_reports_a_pair_fraction_and_a_correlation(capsys):
    assert _load("reward_agreement").main(["--preset", "smoke", "--groups", "2",
                                           "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    for reader in ("reward", "mirrored"):
        line = next(row for row in out.splitlines() if row.startswith(f"{reader} IF vs"))
        fraction = float(line.split(" = ")[1].split()[0])
        assert 0.0 <= fraction <= 1.0
        assert -1.0 <= float(line.split("candidates ")[1].split(";")[0]) <= 1.0


def test_reward_agreement_counts_pairs_ordered_alike():
    agreement = _load("reward_agreement").agreement
    a = [torch.tensor([0.0, 1.0, 2.0]), torch.tensor([1.0, 1.0, 0.0])]
    b = [torch.tensor([0.0, 2.0, 1.0]), torch.tensor([0.0, 1.0, 0.5])]
    # group 1: pairs (0,1) (0,2) alike, (1,2) opposite; group 2: (0,1) tied in a (not
    # counted), (0,2) opposite, (1,2) alike
    same, pairs, _, _, _ = agreement(a, b)
    assert (same, pairs) == (3, 5)


def test_mirrored_estimator_reads_a_yaw_right_back_as_yaw_right():
    from wc_fast.world.motion import action_deltas
    motion = action_deltas(torch.tensor([1 * 9 + 1]))[0]  # forward + yaw right
    frames = torch.randn(1, 2, 3, 8, 8)
    seen = []

    def estimator(x):  # reads the mirrored clip as a faithful estimator would: yaw left
        seen.append(x)
        yaw_left = action_deltas(torch.tensor([1 * 9 + 2]))[0]
        return torch.stack([torch.eye(4, dtype=torch.float64), yaw_left])[None]

    c2w = _load("reward_agreement").Mirrored(estimator)(frames)
    torch.testing.assert_close(seen[0], frames.flip(-1))
    torch.testing.assert_close(c2w[0, 1], motion)


def _study_result(two_key: float, vq: float, motion: float) -> dict:
    block = {"accuracy": two_key, "vq": vq, "short": {"accuracy": two_key},
             "medium": {"accuracy": two_key}, "long": {"accuracy": two_key}}
    return {"eval": {k: dict(block) for k in ("basic", "composite", "composite_2key")},
            "motion": motion, "spread": {"basic": 1.0, "composite_2key": 2.0}}


def test_replicate_writes_both_tables_and_checks_the_orderings(tmp_path):
    replicate = _load("replicate")
    results = {"base": [_study_result(0.40, 1.0, 0.8)],
               "recipe": [_study_result(0.50, 1.5, 0.8), _study_result(0.60, 1.7, 0.8)],
               "recipe_sde": [_study_result(0.45, 1.2, 0.8)],
               "recipe_warp": [_study_result(0.52, 1.5, 0.8)],
               "recipe_warp_sample": [_study_result(0.40, 1.0, 0.8)],
               "recipe_warp_if_only": [_study_result(0.55, 0.5, 0.9)],
               "recipe_warp_vq_only": [_study_result(0.30, 2.0, 0.5)],
               "full": [_study_result(0.42, 1.1, 0.8)],
               "if_only": [_study_result(0.43, 1.3, 0.8)]}
    doc = tmp_path / "replication.md"
    replicate.write_doc(doc, results, "python -m studies.replicate", {"sequences": 2, "clips": 3})
    text = doc.read_text()
    assert "base vs trained (`recipe`, 2 seeds)" in text
    # trained mean +/- sd, then the paired change over the base
    assert "| composite_2key | all | 0.400 | 0.550 +/- 0.071 | +0.150 +/- 0.071 |" in text
    assert "| basic | 1.000 | 1.600 +/- 0.141 | +0.600 +/- 0.141 |" in text
    assert ("| default recipe without exploration in motion, same-noise SDE exploration | 1 "
            "| 0.450 |") in text
    assert "| 1.200 / 1.200 |" in text  # VQ on basic and on two-key commands
    # every ordering of the paper holds in the recipe's and the warp recipe's rows
    assert text.count(": **yes**") == 4
    assert "lower VQ than full training (warp recipe): **yes**" in text
    assert "lower VQ than full training (paper recipe): **no**" in text  # 1.3 against 1.1
    results["recipe_sde"] = [_study_result(0.70, 1.2, 0.8)]
    replicate.write_doc(doc, results, "python -m studies.replicate", {"sequences": 2, "clips": 3})
    assert "gains less two-key accuracy than full (default recipe): **no**" in doc.read_text()


def test_replicate_keeps_the_sections_other_commands_measure(tmp_path):
    replicate = _load("replicate")
    doc = tmp_path / "replication.md"
    kept = ["## Reserved evaluation seeds", "", "Seed 7 is kept.", ""]
    doc.write_text("\n".join(["# old", "## Table 1 analog: old", "stale", *kept]))
    results = {"base": [_study_result(0.40, 1.0, 0.8)], "recipe": [_study_result(0.5, 1.5, 0.8)]}
    replicate.write_doc(doc, results, "python -m studies.replicate", {"sequences": 2, "clips": 3})
    text = doc.read_text()
    assert "stale" not in text
    assert text.endswith("## Reserved evaluation seeds\n\nSeed 7 is kept.\n")


def test_replicate_tabulates_the_side_by_side_timing_when_given(tmp_path):
    replicate = _load("replicate")
    results = {"base": [_study_result(0.40, 1.0, 0.8)]}
    speed = {"command": "python -m studies.update_speed --rounds 6", "rounds": 6, "threads": 2,
             "rows": {"recipe": {"total": 10.0, "rollout": 3.0, "reward": 1.0, "train": 6.0,
                                 "ratio": 1.0},
                      "recipe_flow_grpo_fast": {"total": 9.0, "rollout": 3.5, "reward": 1.0,
                                                "train": 4.5, "ratio": 0.9}}}
    doc = tmp_path / "replication.md"
    replicate.write_doc(doc, results, "python -m studies.replicate", {"sequences": 2, "clips": 3})
    assert "side by side in one process" not in doc.read_text()
    replicate.write_doc(doc, results, "python -m studies.replicate", {"sequences": 2, "clips": 3},
                        speed)
    text = doc.read_text()
    assert "`python -m studies.update_speed --rounds 6`" in text
    assert ("| default recipe without exploration in motion, Flow-GRPO-Fast (SDE window of 2 "
            "steps) | 9.00 | 3.50 | 1.00 | 4.50 | 0.90 |") in text
    assert text.index("side by side") < text.index("Does the paper's ordering hold?")


def test_replicate_rows_are_valid_configs():
    from wc_fast import config
    replicate = _load("replicate")
    for row, args in replicate.ROWS.items():
        cfg = config.preset("cpu")
        pairs = [(args[i][2:], args[i + 1]) for i in range(0, len(args), 2)]
        for path, value in pairs:
            config.apply_override(cfg, path, value)
        config.validate(cfg)
        assert row in replicate.TITLES
    # every row runs the recipe as the study began it, without a KL; recipe_kl is the default
    assert replicate.ROWS["recipe"] == ["--nft.kl_beta", "0.0"]
    default = config.preset("cpu")
    config.apply_override(default, "nft.kl_beta", replicate.ROWS["recipe_kl"][1])
    assert config.to_dict(default) == config.to_dict(config.preset("cpu"))


def test_rows_files_merge_every_row_under_each_row(tmp_path):
    replicate = _load("replicate")
    rows = tmp_path / "rows.yaml"
    rows.write_text("every_row: {nft: {kl_beta: 0.0}, optim: {lr: 0.001}}\n"
                    "rows: {a: {}, b: {nft: {kl_beta: 0.1}, rollout: {steps: 4}}}\n")
    assert replicate.load_rows(rows) == {
        "a": ["--nft.kl_beta", "0.0", "--optim.lr", "0.001"],
        "b": ["--nft.kl_beta", "0.1", "--optim.lr", "0.001", "--rollout.steps", "4"]}
    rows.write_text("a: {}\n")
    with pytest.raises(ValueError, match="every_row and rows"):
        replicate.load_rows(rows)


def test_replicate_reports_iteration_time_and_the_grpo_ordering(tmp_path):
    replicate = _load("replicate")
    run = tmp_path / "flow_grpo_same_s0"
    run.mkdir()
    rows = [{"rollout_s": 1.0, "reward_s": 0.5, "train_s": t} for t in (1.5, 9.0, 2.5)]
    (run / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    assert replicate.iteration_seconds(run) == 4.0  # the median iteration, not the slow one
    full = [dict(_study_result(0.50, 1.5, 0.8), seconds=2.0)]
    grpo = [dict(_study_result(0.45, 1.5, 0.8), seconds=replicate.iteration_seconds(run))]
    results = {"base": [_study_result(0.40, 1.0, 0.8)], "full": full, "flow_grpo_same": grpo}
    doc = tmp_path / "replication.md"
    replicate.write_doc(doc, results, "python -m studies.replicate", {"sequences": 2, "clips": 3})
    text = doc.read_text()
    assert "| paper recipe, Flow-GRPO, one noise per group (DanceGRPO) | 1 | 0.450 |" in text
    assert "| 4.00 (2.00x) |" in text and "| 2.00 (1.00x) |" in text
    assert "higher two-key accuracy than DanceGRPO-style GRPO (paper recipe): **yes**" in text
    grpo[0]["eval"]["composite_2key"]["accuracy"] = 0.55
    replicate.write_doc(doc, results, "python -m studies.replicate", {"sequences": 2, "clips": 3})
    text = doc.read_text()
    assert "higher two-key accuracy than DanceGRPO-style GRPO (paper recipe): **no**" in text


def test_replicate_times_and_orders_the_recipe_family_against_the_recipe(tmp_path):
    replicate = _load("replicate")
    results = {"base": [_study_result(0.40, 1.0, 0.8)],
               "recipe": [dict(_study_result(0.55, 1.5, 0.8), seconds=5.0)],
               "recipe_flow_grpo_same": [dict(_study_result(0.41, 1.5, 0.8), seconds=10.0)],
               "full": [dict(_study_result(0.42, 1.1, 0.8), seconds=1.0)]}
    doc = tmp_path / "replication.md"
    replicate.write_doc(doc, results, "python -m studies.replicate", {"sequences": 2, "clips": 3})
    text = doc.read_text()
    # the GRPO row of the recipe is timed against the recipe, not the paper's full row
    assert ("| default recipe without exploration in motion, Flow-GRPO, one noise per group "
            "(DanceGRPO) | 1 | 0.410 |") in text
    assert "| 10.00 (2.00x) |" in text and "| 1.00 (1.00x) |" in text
    # NFT and GRPO are compared only with the same exploration in camera motion
    assert "DanceGRPO-style GRPO" not in text
    results["recipe_no_exploration"] = [_study_result(0.45, 1.5, 0.8)]
    results["recipe_flow_grpo_same_explored"] = [_study_result(0.60, 1.5, 0.8)]
    replicate.write_doc(doc, results, "python -m studies.replicate", {"sequences": 2, "clips": 3})
    text = doc.read_text()
    assert ("DanceGRPO-style GRPO, both without exploration in motion (default recipe): "
            "**yes**") in text
    assert ("DanceGRPO-style GRPO, both exploring through the actions (default recipe): "
            "**no**") in text
    assert "(paper recipe): **" not in text  # no GRPO row of the paper's family was run
    assert replicate.family_full("recipe_flow_grpo") == "recipe"
    assert replicate.family_full("recipe_warp_trajectory") == "recipe_warp"
    assert replicate.family_full("trajectory") == "full"
    assert replicate.family_full("base") is None
    # the recipe's GRPO rows explore in camera motion exactly when their NFT partner does
    assert "--rollout.action_exploration" in replicate.ROWS["recipe_flow_grpo_fast"]
    assert "--rollout.action_exploration" not in replicate.ROWS["recipe_flow_grpo_same_explored"]
    assert replicate.ROWS["recipe_warp_noise_warp"][-2:] == ["--rollout.noise_warp", "0.5"]


def test_replicate_takes_a_seed_count_per_row(tmp_path, monkeypatch):
    replicate = _load("replicate")
    trained = []

    def fake_train(row, seed, folder, steps):
        trained.append((row, seed))
        folder.mkdir(parents=True)
        (folder / "metrics.jsonl").write_text(json.dumps(
            {"rollout_s": 1.0, "reward_s": 0.0, "train_s": 1.0}) + "\n")
        return folder

    monkeypatch.setattr(replicate, "run", fake_train)
    monkeypatch.setattr(replicate, "score", lambda *a: _study_result(0.5, 1.0, 0.8))
    doc = tmp_path / "replication.md"
    common = ["--sequences", "2", "--clips", "3", "--out", str(tmp_path / "runs"),
              "--cache", str(tmp_path / "study"), "--doc", str(doc)]
    assert replicate.main(["--rows", "recipe:1,recipe_sde:2,recipe_warp_trajectory",
                           "--ablation-seeds", "1", *common]) == 0
    assert [r for r in trained if r[0] != "base"] == [
        ("recipe", 0), ("recipe_sde", 0), ("recipe_sde", 1), ("recipe_warp_trajectory", 0)]
    assert ("| default recipe without exploration in motion, same-noise SDE exploration | 2 |"
            in doc.read_text())
    for bad in ("recipe:0", "recipe:x", "nope:2"):
        with pytest.raises(SystemExit):
            replicate.main(["--rows", bad, *common])


def test_replicate_trains_jobs_at_a_time_and_keeps_their_times_apart(tmp_path, monkeypatch):
    replicate = _load("replicate")
    trained = []

    def fake_train(row, seed, folder, steps, threads=None):
        if not folder.is_dir():
            trained.append((row, seed, threads))
            folder.mkdir(parents=True)
            (folder / "metrics.jsonl").write_text(json.dumps(
                {"rollout_s": 1.0, "reward_s": 0.0, "train_s": 1.0}) + "\n")
        return folder

    monkeypatch.setattr(replicate, "run", fake_train)
    monkeypatch.setattr(replicate, "score", lambda *a: _study_result(0.5, 1.0, 0.8))
    common = ["--sequences", "2", "--clips", "3", "--out", str(tmp_path / "runs"),
              "--cache", str(tmp_path / "study"), "--doc", str(tmp_path / "replication.md")]
    assert replicate.main(["--rows", "recipe:1", *common]) == 0  # one at a time: cached
    assert replicate.main(["--rows", "recipe:1,recipe_sde:2", "--jobs", "2", *common]) == 0
    # only the uncached runs train in parallel, each on one thread
    assert sorted(trained) == [("recipe", 0, None), ("recipe_sde", 0, 1), ("recipe_sde", 1, 1)]
    files = {p.name.split("_cfg-")[0]: json.loads(p.read_text())
             for p in (tmp_path / "study").glob("recipe*.json")}
    assert files["recipe_s0"]["seconds"] == 2.0 and "seconds_parallel" not in files["recipe_s0"]
    for name in ("recipe_sde_s0", "recipe_sde_s1"):
        assert files[name]["seconds_parallel"] == 2.0 and "seconds" not in files[name]
    with pytest.raises(SystemExit):
        replicate.main(["--rows", "recipe:1", "--jobs", "0", *common])


def test_motion_spread_measures_each_kind(tmp_path):
    result = _load("motion_spread").measure(None, groups=1, group_size=2)
    for kind in ("basic", "composite_2key"):
        assert result[kind]["groups"] == 1 and 0.0 <= result[kind]["if_mean"] <= 1.0
        assert result[kind]["motion_spread"] >= 0.0
    assert len(result["estimator_error_steps"]) == 4


def test_flow_noise_stores_times_both_ways_and_restores_the_threshold(capsys, monkeypatch):
    native = pytest.importorskip("wc_kernels._native", reason="the native extension is not built")
    stores = _load("flow_noise_stores")
    monkeypatch.setattr(stores, "SHAPES", ((2, 3, 1000),))
    default = native.set_stream_min_bytes(1234)
    try:
        assert stores.main(["--rounds", "2"]) == 0
        assert native.set_stream_min_bytes(default) == 1234
    finally:
        native.set_stream_min_bytes(default)
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| 2 x 3")]
    assert [row.split(" | ")[2] for row in rows] == ["plain", "streaming"]


def test_render_speed_reports_a_frame_rate(capsys):
    assert _load("render_speed").main(["--threads", "1", "--frames", "16", "--repeats", "1"]) == 0
    rate = float(capsys.readouterr().out.split(" frames/s")[0].split()[-1])
    assert rate > 0


@pytest.mark.slow
def test_chaos_run_survives_a_kill_with_the_same_weights(tmp_path, capsys):
    assert _load("chaos").main(["--kills", "1", "--steps", "3", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "kills survived: 1;" in out and "torn metrics.jsonl lines survived: 1" in out
    assert out.count("tensors differing from the uninterrupted run: 0 of") == 2
    assert out.count("metrics.jsonl holds each step once: True") == 2
    assert "second writer refused: python -m wc_fast.train: error: RunDirError:" in out


def test_two_key_errors_reads_exact_poses_as_right_and_reports_each_kind(capsys):
    """Exact world poses of a two-key command: every label right, the commanded translation
    and rotation per frame; the script prints one row per kind it met."""
    from wc_fast.actions import action_id
    from wc_fast.config import preset
    from wc_fast.world.motion import (
        ROTATION_STEP_DEG,
        TRANSLATION_STEP,
        action_components,
        rot_y,
    )

    module = _load("two_key_errors")
    actions = action_id(torch.tensor([1] * 4), torch.tensor([1] * 4))  # forward + yaw right
    trans, rot = action_components(actions)
    c2w = torch.eye(4, dtype=torch.float64).repeat(5, 1, 1)
    for i, (t, (yaw, pitch)) in enumerate(zip(trans, rot, strict=True), start=1):
        delta = torch.eye(4, dtype=torch.float64)
        delta[:3, :3] = rot_y(yaw)
        assert pitch == 0
        delta[:3, 3] = t
        c2w[i] = c2w[i - 1] @ delta
    stats = module.frame_stats(c2w[None], actions, preset("cpu"))
    assert stats["accuracy"].item() == stats["translation_ok"].item() == 1.0
    assert stats["t_norm"].item() == pytest.approx(TRANSLATION_STEP)
    assert stats["rotation_deg"].item() == pytest.approx(ROTATION_STEP_DEG)
    assert module.main(["--n", "3", "--candidates", "2"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line[:4] in
            ("| TR", "| RR", "| TT")]
    assert rows and sum(int(row.split("|")[2]) for row in rows) == 3
    # single keys on the Wan base: one row per kind, T and R
    assert module.main(["--base", "wan", "--keys", "1", "--n", "3", "--candidates", "2"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line[:4] in
            ("| T ", "| R ")]
    assert rows and sum(int(row.split("|")[2]) for row in rows) == 3
    with pytest.raises(SystemExit):  # the probes scale the tiny model's embeddings
        module.main(["--base", "wan", "--latent-scale", "2"])


def test_replicate_names_caches_by_evaluation_assets_and_training_config(monkeypatch, tmp_path):
    replicate = _load("replicate")
    first = replicate.evaluation_id(2, 3)
    assert len(first) == 8 and int(first, 16) >= 0
    assert replicate.evaluation_id(2, 4) != first  # the evaluation size is part of it
    for name in replicate.SCORED_ASSETS:
        shutil.copy(replicate.ASSETS / f"{name}.safetensors", tmp_path)
    monkeypatch.setattr(replicate, "ASSETS", tmp_path)
    (tmp_path / "another_base_model.safetensors").write_bytes(b"a model it does not read")
    assert replicate.evaluation_id(2, 3) == first
    (tmp_path / "critic_eval.safetensors").write_bytes(b"other weights")
    assert replicate.evaluation_id(2, 3) != first  # so is every shipped model it reads
    def config_id(row: str, seed: int) -> str:
        return replicate.config_id(replicate.resolved_config(row, seed, None))

    recipe = config_id("recipe", 0)
    assert config_id("recipe", 1) != recipe
    assert config_id("recipe_no_exploration", 0) != recipe
    monkeypatch.setitem(replicate.ROWS, "recipe", ["--reward.lam", "0.5"])
    assert config_id("recipe", 0) != recipe  # a changed recipe is a new row


RESULTS = ROOT / "studies" / "results"
# a cache file of a trained row: [BASE_]ROW_sSEED_cfg-ID_TAG.json
CACHE_NAME = re.compile(
    r"(?:(?P<base>wan)_)?(?P<row>.+)_s(?P<seed>\d+)_cfg-[0-9a-f]{8}_(?P<tag>.+)\.json")
TAG = "64x6_eval-0000abcd"


def test_committed_cache_files_of_current_rows_are_found_by_their_stored_config():
    """Every committed cache file of a row of rows.yaml that stores a training config stores
    the row's resolved config today, so the study and the final table find that file (and
    its run folder) again instead of training the row afresh."""
    replicate = _load("replicate")
    configs, found = {}, set()
    for path in sorted(RESULTS.glob("*/*_cfg-*.json")):
        match = CACHE_NAME.fullmatch(path.name)
        if match is None or match["row"] not in replicate.ROWS or (
                replicate.stored_config(path) is None):
            continue
        key = (match["row"], int(match["seed"]), match["base"] or "tiny")
        if key not in configs:
            configs[key] = replicate.resolved_config(*key[:2], None, key[2])
        name = path.name.split("_cfg-")[0]
        assert replicate.find_cached(path.parent, name, match["tag"], configs[key]) == path
        found.add(f"{path.parent.name}/{name}")
    assert {"study/recipe_s0", "study/recipe_warp_s2", "validation/recipe_if_action_s0",
            "validation/wan_recipe_if_action_s2", "kl_seeds/recipe_kl_s1", "final/recipe_kl_s2",
            "final/wan_recipe_kl_s0"} <= found


def _cache_with(folder: Path, config: dict, name: str = "recipe_s0") -> Path:
    """A cache file of ``name`` evaluated under ``TAG`` that stores ``config``."""
    path = folder / f"{name}_cfg-0123abcd_{TAG}.json"
    path.write_text(json.dumps({"motion": 1.0, "config": config}))
    return path


def test_a_stored_config_matches_only_the_same_training(tmp_path):
    replicate = _load("replicate")
    current = replicate.resolved_config("recipe", 0, None)
    stored = to_dict(current)
    stored["train"]["wandb_project"] = "elsewhere"  # a field that only measures: ignored
    path = _cache_with(tmp_path, stored)
    assert replicate.find_cached(tmp_path, "recipe_s0", TAG, current) == path
    assert replicate.cache_file(tmp_path, "recipe_s0", TAG, current) == path
    assert replicate.run_name(path, TAG) == "recipe_s0_cfg-0123abcd"
    assert replicate.find_cached(tmp_path, "recipe_s1", TAG, current) is None
    assert replicate.find_cached(tmp_path, "recipe_s0", "64x6_eval-1111abcd", current) is None
    stored["optim"]["lr"] *= 2
    _cache_with(tmp_path, stored)
    assert replicate.find_cached(tmp_path, "recipe_s0", TAG, current) is None
    # no match: a new file named by the config's hash
    assert replicate.cache_file(tmp_path, "recipe_s0", TAG, current).name == (
        f"recipe_s0_cfg-{replicate.config_id(current)}_{TAG}.json")


def test_a_reader_file_retrained_at_the_same_path_trains_the_row_afresh(tmp_path):
    replicate = _load("replicate")
    reader = tmp_path / "reader" / "camera_reward_generated.safetensors"
    reader.parent.mkdir()
    reader.write_bytes(b"first weights")
    reader.with_suffix(".json").write_text('{"epochs": 1}')
    current = replicate.resolved_config("recipe", 0, None)
    current.reward.reader_checkpoint = str(reader)
    cache = tmp_path / "cache"
    cache.mkdir()
    path = _cache_with(cache, to_dict(current))
    assert replicate.find_cached(cache, "recipe_s0", TAG, current) is None  # stores no inputs
    stored = replicate.store_config(path, current)
    assert set(stored["inputs"]) == {"reward.reader_checkpoint"}
    assert replicate.find_cached(cache, "recipe_s0", TAG, current) == path
    first_id = replicate.config_id(current)
    reader.with_suffix(".json").write_text('{"epochs": 2}')  # the sidecar counts too
    assert replicate.find_cached(cache, "recipe_s0", TAG, current) is None
    reader.with_suffix(".json").write_text('{"epochs": 1}')
    reader.write_bytes(b"other weights")
    assert replicate.find_cached(cache, "recipe_s0", TAG, current) is None
    assert replicate.config_id(current) != first_id
    reader.unlink()
    assert replicate.input_digests(current) == {"reward.reader_checkpoint": "missing"}
    current.reward.reader_checkpoint = ""
    assert replicate.input_digests(current) == {}  # rows on shipped assets: ids unchanged


def test_a_stored_config_without_a_field_added_since_reads_it_at_its_default(tmp_path):
    """A field is added with a default that reproduces the runs made before it: a stored
    config that lacks it matches a row that keeps that default, and no row that changes it."""
    replicate = _load("replicate")
    current = replicate.resolved_config("recipe", 0, None)
    default = type(current.rollout)().candidate_chunk
    assert current.rollout.candidate_chunk == default
    stored = to_dict(current)
    del stored["rollout"]["candidate_chunk"]
    path = _cache_with(tmp_path, stored)
    assert replicate.find_cached(tmp_path, "recipe_s0", TAG, current) == path
    current.rollout.candidate_chunk = default + 2
    assert replicate.find_cached(tmp_path, "recipe_s0", TAG, current) is None


def test_a_stored_config_in_an_earlier_spelling_matches_without_a_warning(tmp_path):
    """The update fields under section nft, the candidates' noise under its old name and
    value and the pretraining section RL configs held then: read as a checkpoint's saved
    config is, without the command line's FutureWarning."""
    replicate = _load("replicate")
    current = replicate.resolved_config("full", 0, None)
    assert current.update.compile  # a row that sets a moved field
    stored = to_dict(current)
    for field in ("context_kv", "micro_batch", "compile"):
        stored["nft"][field] = stored["update"].pop(field)
    noise = stored["rollout"].pop("candidate_noise")
    stored["rollout"]["exploration"] = {"independent": "noise"}.get(noise, noise)
    stored["pretrain"] = {"steps": 1500, "lr": 5e-4}
    path = _cache_with(tmp_path, stored, "full_s0")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert replicate.find_cached(tmp_path, "full_s0", TAG, current) == path


@pytest.mark.parametrize("text,message", [
    ("{\"motion\": 1.0,", "not a readable cache file"),
    ("[1.0]", "expected a JSON object"),
    (json.dumps({"config": {"rollout": {"no_such_field": 1}}}),
     "unknown config field rollout.no_such_field")])
def test_a_damaged_cache_file_is_named(tmp_path, text, message):
    replicate = _load("replicate")
    path = tmp_path / f"recipe_s0_cfg-0123abcd_{TAG}.json"
    path.write_text(text)
    with pytest.raises(ValueError, match=re.escape(message)) as error:
        replicate.find_cached(tmp_path, "recipe_s0", TAG,
                              replicate.resolved_config("recipe", 0, None))
    assert str(path) in str(error.value)


def test_replicate_reuses_cached_rows_without_training(tmp_path, monkeypatch):
    replicate = _load("replicate")
    tag = f"2x3_eval-{replicate.evaluation_id(2, 3)}"
    cache = tmp_path / "study"
    cache.mkdir()
    (cache / f"base_{tag}.json").write_text(json.dumps(_study_result(0.40, 1.0, 0.8)))
    # found by its stored config, whatever the id in its name
    config = to_dict(replicate.resolved_config("recipe", 0, None))
    (cache / f"recipe_s0_cfg-0123abcd_{tag}.json").write_text(
        json.dumps(dict(_study_result(0.55, 1.2, 0.8), seconds=3.0, config=config)))

    def no_training(*args, **kwargs):
        raise AssertionError("a cached row was trained again")

    monkeypatch.setattr(replicate, "run", no_training)
    monkeypatch.setattr(replicate, "score", no_training)
    doc = tmp_path / "replication.md"
    assert replicate.main(["--rows", "recipe", "--seeds", "1", "--sequences", "2", "--clips",
                           "3", "--cache", str(cache), "--doc", str(doc)]) == 0
    assert "| composite_2key | all | 0.400 | 0.550 | +0.150 |" in doc.read_text()


def test_update_speed_times_each_row_against_the_first(tmp_path, monkeypatch):
    speed = _load("update_speed")
    rows = {"nft": [], "grpo_fast": ["--train.update", "flow_grpo", "--grpo.window", "1"]}
    monkeypatch.setattr(speed, "ROWS", rows)
    monkeypatch.setattr(speed, "training_args", lambda row, seed, steps: [
        "--preset", "smoke", "--train.init", "random", "--train.seed", str(seed), *rows[row]])
    out = tmp_path / "speed.json"
    assert speed.main(["--rows", "nft,grpo_fast", "--rounds", "2", "--threads", "1",
                       "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert (result["rounds"], list(result["rows"])) == (2, ["nft", "grpo_fast"])
    for row in result["rows"].values():
        assert all(row[p] > 0 for p in ("rollout", "reward", "train"))
        assert row["total"] >= max(row["rollout"], row["reward"], row["train"])
    grpo = result["rows"]["grpo_fast"]
    assert result["rows"]["nft"]["ratio"] == 1.0
    assert grpo["ratio"] == pytest.approx(grpo["total"] / result["rows"]["nft"]["total"])
    with pytest.raises(SystemExit):
        speed.main(["--rows", "nft,missing"])


def _benchmark(name: str, group: str, median_s: float, **extra) -> dict:
    """One benchmark as pytest-benchmark's JSON holds it (the fields the summary reads)."""
    return {"group": group, "name": name, "params": None, "stats": {"median": median_s},
            "extra_info": extra}


def _target_results(out: str) -> dict[str, tuple[str, str]]:
    """target -> (measured, result) from ``studies.summarize``'s targets table."""
    lines = out.split("\ntargets\n", 1)[1].splitlines()[2:]
    cells = [re.split(r"\s{2,}", line) for line in lines]
    return {c[0]: (c[1], c[3]) for c in cells}


def test_summary_checks_each_target_pass_fail_or_missing(tmp_path, capsys):
    kernels = tmp_path / "bench_kernels.json"
    nft, flow = "nft_loss+grad fp32 4x4194304 velocity", "flow_noise bf16 S=6 K=20 D=131072"
    kernels.write_text(json.dumps({"benchmarks": [
        _benchmark("test_nft_loss_and_grad[fp32-velocity-triton]", nft, 1e-3, pct_of_copy=80.0,
                   kernel_pct_of_copy=90.0),
        _benchmark("test_nft_loss_and_grad[fp32-velocity-compile]", nft, 2e-3, pct_of_copy=40.0),
        _benchmark("test_flow_noise[bf16-triton]", flow, 1e-3, pct_of_copy=50.0),
        _benchmark("test_flow_noise[bf16-compile]", flow, 1.2e-3, pct_of_copy=41.7)]}))
    attention = tmp_path / "bench_attention.json"
    d32 = "prefix_attention fwd+bwd bf16 G16-D32 B=16 H=6 L=256 P=1856 D=32"
    d128 = "prefix_attention fwd+bwd bf16 G16-D128 B=16 H=8 L=512 P=1856 D=128"  # not the shape
    attention.write_text(json.dumps({"benchmarks": [
        _benchmark("test_prefix_attention[G16-D32-fwd+bwd-triton]", d32, 1e-3, peak_mib=10.0),
        _benchmark("test_prefix_attention[G16-D32-fwd+bwd-sdpa_replicated]", d32, 2e-3,
                   peak_mib=35.0),
        _benchmark("test_prefix_attention[G16-D32-fwd+bwd-replicated_flash]", d32, 1.2e-3),
        _benchmark("test_prefix_attention[G16-D32-fwd+bwd-replicated_cudnn]", d32, 0.9e-3),
        _benchmark("test_prefix_attention[G16-D32-fwd+bwd-prefix_grouper]", d32, 0.8e-3),
        _benchmark("test_prefix_attention[G16-D128-fwd+bwd-triton]", d128, 1e-3, peak_mib=1.0),
        _benchmark("test_prefix_attention[G16-D128-fwd+bwd-sdpa_replicated]", d128, 9e-3,
                   peak_mib=90.0)]}))
    rl = tmp_path / "rl_iteration.json"
    rl.write_text(json.dumps({
        "preset": "paper", "device": "cuda:0", "ours_s": 1.0, "official_style_s": 6.0,
        "speedup": 6.0, "ours_phases_s": {"train": 1.0}, "official_style_phases_s": {"train": 6.0},
        "train_flops_per_s": 1e14, "matmul_flops_per_s": 5e14, "flop_fraction": 0.2,
        "compute_dtype": "bfloat16", "mfu": 0.2}))
    wan = tmp_path / "wan_iteration.json"

    def variant(name: str, mfu: float, peak_mib: float | None) -> dict:
        return {"variant": name, "phases_s": {"rollout": 1.0, "reward": 0.5, "train": 2.0},
                "total_s": 3.5, "peak_mib": peak_mib, "train_flops_per_s": mfu * 8e14,
                "mfu_measured": mfu, "mfu_spec": None}

    wan.write_text(json.dumps({
        "shape": "wan2.1-1.3b", "device_name": "NVIDIA H200", "resolution": 256,
        "clip_frames": 4, "group_size": 12, "steps": 10, "matmul_dtype": "bfloat16",
        "matmul_flops_per_s": 8e14, "variants": [
            variant("full", 0.45, 2048.0), variant("checkpointing", 0.30, 1024.0),
            variant("lora", 0.50, None)]}))
    tests_xml = tmp_path / "gpu_tests.xml"
    tests_xml.write_text(
        '<testsuites><testsuite tests="3" failures="0" errors="0" skipped="1">'
        '<testcase classname="tests.test_a" name="test_x"/>'
        '<testcase classname="tests.test_a" name="test_y"/>'
        '<testcase classname="tests.test_a" name="test_z"><skipped/></testcase>'
        '</testsuite></testsuites>')
    model = tmp_path / "bench_model.json"
    wan_rl = "rl-iteration wan2.1-1.3b layers=30 cuda 256px F=4 G=12 steps=10"
    model.write_text(json.dumps({"benchmarks": [
        _benchmark("test_wan_rl_iteration[ours]", wan_rl, 4.0),
        _benchmark("test_wan_rl_iteration[batched_eager]", wan_rl, 6.0)]}))
    files = [kernels, attention, tests_xml, rl, wan, model]
    assert _load("summarize").main([str(f) for f in files]) == 0
    rows = _target_results(capsys.readouterr().out)
    assert len(rows) == len(_load("gpu_targets").TARGETS)
    alone, vs_compile = ": kernels alone, % of a device copy", ": speed vs torch.compile"
    attn = "prefix_attention fwd+bwd D={} (G=16, L=256, P=1856): {} vs replicated SDPA"
    pinned = "prefix_attention fwd+bwd D={} (G=16, L=256, P=1856): speed vs the fastest pinned SDPA"
    wan_mfu = "Wan-1.3B-shaped iteration, {}: MFU of a measured bf16 matmul"
    assert rows["nft_loss+grad fp32 velocity" + vs_compile][1] == "PASS"
    per_call = "% of a copy per call"
    assert rows["nft_loss+grad fp32 velocity" + vs_compile][0].startswith(f"2.00x (80.0{per_call}")
    assert rows["nft_loss+grad fp32 velocity" + alone] == ("90.0%", "PASS")
    assert rows["flow_noise bf16" + alone][1] == (
        "MISSING: test_flow_noise[bf16-triton] records no kernel_pct_of_copy")
    assert rows["flow_noise bf16" + vs_compile][0].startswith(f"1.20x (50.0{per_call}")
    assert rows["flow_noise bf16" + vs_compile][1] == "FAIL"
    assert rows["nft_loss+grad bf16 x0" + alone][1] == (
        "MISSING: no benchmark test_nft_loss_and_grad[bf16-x0-triton]")
    assert rows["grpo_sde_loss+grad fp32" + alone][1].startswith("MISSING")
    # the fastest pinned backend that ran (cuDNN, 0.9 ms) is the baseline; efficient is absent
    assert rows[pinned.format(32)] == ("0.90x (1.000 ms/round vs 0.900 ms/round)", "FAIL")
    grouper = "prefix_attention fwd+bwd D={} (G=16, L=256, P=1856): speed vs prefix-grouper"
    assert rows[grouper.format(32)] == ("0.80x (1.000 ms/round vs 0.800 ms/round)", "FAIL")
    assert rows[grouper.format(64)][1] == (
        "MISSING: no benchmark test_prefix_attention[G16-D64-fwd+bwd-triton]")
    assert rows["RL iteration at the Wan2.1-1.3B shape vs a batched eager loop"] == (
        "1.50x (4000.000 ms/round vs 6000.000 ms/round)", "PASS")
    assert rows[attn.format(32, "memory")][0].startswith("3.50x")
    assert rows[attn.format(32, "memory")][1] == "FAIL"
    assert rows[pinned.format(128)][1].startswith("MISSING: ")
    assert "L=512" in rows[pinned.format(128)][1]
    assert rows[attn.format(64, "memory")][1].startswith("MISSING: no benchmark")
    assert rows["model forward G=16: shared prefix vs replicated"][1] == (
        "MISSING: no benchmark test_shared")
    assert rows["RL iteration vs the official-style baseline"] == ("6.00x", "PASS")
    assert rows[wan_mfu.format("full")] == ("45.0% (3.50 s/iter, 2048.0 MiB)", "PASS")
    assert rows[wan_mfu.format("checkpointing")][1] == "FAIL"
    assert rows[wan_mfu.format("lora")][1] == "MISSING: wan_iteration lora records no peak_mib"
    assert rows[wan_mfu.format("lora+checkpointing")][1] == (
        "MISSING: wan_iteration has no variant lora+checkpointing")
    assert rows["every GPU test passes"] == ("0 failed (2 passed, 1 skipped)", "PASS")
    assert rows["RL iteration vs a batched eager loop"][1] == (
        "MISSING: rl_iteration records no speedup_vs_batched")


def test_targets_count_only_gpu_runs_and_fail_on_a_failed_test():
    targets = _load("gpu_targets")
    tests = next(t for t in targets.TARGETS if t.name == "every GPU test passes")
    rl = next(t for t in targets.TARGETS if t.figure.source == "rl_iteration")
    wan = next(t for t in targets.TARGETS if t.figure.source == "wan_iteration")
    dry_run = targets.Results(
        rl_iteration={"device": "cpu", "speedup": 9.0},
        wan_iteration={"shape": "tiny", "variants": []},
        gpu_tests={"tests": 4, "failed": 0, "skipped": 4, "passed": 0})
    assert tests.check(dry_run)[3] == "MISSING: no GPU test ran (4 skipped)"
    assert rl.check(dry_run)[3] == "MISSING: rl_iteration ran on cpu, not a GPU"
    assert wan.check(dry_run)[3] == "MISSING: wan_iteration ran shape tiny, not wan2.1-1.3b"
    fewer = targets.Results(wan_iteration={"shape": "wan2.1-1.3b", "layers": 1, "variants": []})
    assert wan.check(fewer)[3] == "MISSING: wan_iteration ran 1 of wan2.1-1.3b's blocks"
    wan_rl = next(t for t in targets.TARGETS if t.name.startswith("RL iteration at the Wan"))
    cpu_group = "rl-iteration wan2.1-1.3b layers=1 cpu 64px F=2 G=4 steps=2"
    on_cpu = targets.Results(benchmarks={
        f"test_wan_rl_iteration[{c}]": {"group": cpu_group, "stats": {"median": 1.0}}
        for c in ("ours", "batched_eager")})
    assert wan_rl.check(on_cpu)[3] == (
        f"MISSING: test_wan_rl_iteration[ours] measures {cpu_group!r}, "
        "not wan2.1-1.3b layers=30 cuda")
    failed = targets.Results(gpu_tests={"tests": 4, "failed": 1, "skipped": 0, "passed": 3})
    assert tests.check(failed)[1:] == ("1 failed (3 passed, 0 skipped)", "<= 0", "FAIL")
    with pytest.raises(ValueError, match="source"):
        targets.Figure("benchmarks", "median")
    with pytest.raises(ValueError, match="unit"):
        targets.Target("t", targets.Figure("benchmark", "median"), 1.0, unit="ms")
    # the Wan targets name every variant studies/wan_iteration.py measures
    assert targets.WAN_VARIANTS == tuple(_load("wan_iteration").VARIANTS)


def test_targets_read_the_committed_h200_results(capsys):
    """Every target whose benchmarks and keys are in the latest full H200 run's files reads
    them (the names and keys are the benchmarks' real ones), with the ratio the files'
    medians give."""
    targets = _load("gpu_targets")
    runs = ROOT / "bench" / "results"
    files = sorted(runs.glob("2026-12-04-h200/bench_*.json"))
    assert _load("summarize").main([str(f) for f in files]) == 0
    rows = _target_results(capsys.readouterr().out)
    benchmarks = {b["name"]: b for f in files for b in json.loads(f.read_text())["benchmarks"]}
    read = set()
    for target in targets.TARGETS:
        # a Fastest baseline stands for its figures (every one must be in the files here)
        baselines = (() if target.baseline is None
                     else getattr(target.baseline, "figures", (target.baseline,)))
        figures = [target.figure, *baselines]
        if target.figure.source != "benchmark" or any(
                f.item not in benchmarks or (f.key != "median" and f.key not in
                                             benchmarks[f.item]["extra_info"])
                for f in figures):
            continue
        measured, result = rows[target.name]
        assert result in ("PASS", "FAIL"), (target.name, result)
        if target.baseline is not None and target.figure.key == "median":
            ratio = (min(benchmarks[f.item]["stats"]["median"] for f in baselines)
                     / benchmarks[target.figure.item]["stats"]["median"])
            assert measured.startswith(f"{ratio:.2f}x"), (target.name, measured)
        read.add(target.name.split()[0])
    assert read == {"nft_loss+grad", "flow_noise", "grpo_sde_loss+grad", "prefix_attention",
                    "model"}


def test_offset_response_reads_keys_and_correlations():
    study = _load("offset_response")
    # forward + right (translation label 5), yaw right (rotation label 1)
    assert study.pressed_movement_keys(torch.tensor(5 * 9 + 1)).tolist() == [1, 0, 1, 0, 1, 0,
                                                                              0, 0]
    gen = torch.Generator().manual_seed(0)
    groups = []
    pressed = [1.0, 0, 0, 0, 0, 1.0, 0, 0]  # W and yaw left
    for _ in range(6):
        offsets = torch.randn(4 + len(study.BOOSTS), 8, generator=gen)
        # IF rises with the offset on the pressed translation key; the camera moves forward
        # with W minus S
        reward = offsets[:, 0].tolist()
        motion = torch.zeros(offsets.shape[0], 4)
        motion[:, 1] = offsets[:, 0] - offsets[:, 1]
        # the highest-IF offset-free candidate is the second, which followed 3 frames in 4
        groups.append({"pressed": pressed, "offsets": offsets.tolist(), "if": reward,
                       "motion": motion.tolist(), "kind": study.KINDS[2],
                       "push_accuracy": {"rotation key +1": 0.5},
                       "noise_if": [0.1, 0.9, 0.3, 0.2], "noise_accuracy": [0.0, 0.75, 0.25, 0.0],
                       "noise_read": {"translation_right": 0.5, "rotation_right": 0.25,
                                      "yaw_as_step": float("nan")}})
    summary = study.summarize({"groups": groups, "group_size": 4, "sigma": 1.0})
    assert summary["noise_headroom"] == {"mean_accuracy": 0.25, "best_if_accuracy": 0.75}
    assert summary["read_by_kind"] == {study.KINDS[2]: {"translation_right": 0.5,
                                                        "rotation_right": 0.25}}
    assert summary["accuracy_by_push"] == {study.KINDS[2]: {
        "none": {"accuracy": 0.25, "prompts": 6}, "rotation key +1": {"accuracy": 0.5,
                                                                      "prompts": 6}}}
    corr = summary["advantage_correlation"]
    assert corr["pressed translation key"] > 0.6 and summary["candidates"] == 24
    assert abs(corr["other keys"]) < 0.6
    matrix = summary["offset_motion_correlation"]
    assert matrix[1][1] == pytest.approx(1.0) and abs(matrix[0][1]) < 0.6
    assert list(summary["if_by_push"]) == [str(a) for a in study.BOOSTS]


def test_offset_response_pushes_name_the_keys_they_move():
    study = _load("offset_response")
    # W and yaw right: the counter-strafe is A (index 3)
    pushed = study.pushes(torch.tensor([1.0, 0, 0, 0, 1.0, 0, 0, 0]))
    assert pushed["rotation key +1"].tolist() == [0, 0, 0, 0, 1, 0, 0, 0]
    assert pushed["translation key -0.5"].tolist() == [-0.5, 0, 0, 0, 0, 0, 0, 0]
    assert pushed["counter-strafe +1"].tolist() == [0, 0, 0, 1, 0, 0, 0, 0]
    # W and D press no yaw key: no counter-strafe
    assert not any(name.startswith("counter") for name in
                   study.pushes(torch.tensor([1.0, 0, 1.0, 0, 0, 0, 0, 0])))
    # W + yaw right read as W + D without a turn (poses: forward and right, no rotation)
    c2w = torch.eye(4).repeat(1, 3, 1, 1)
    c2w[0, 1:, 2, 3] = torch.tensor([0.1, 0.2])
    c2w[0, 1:, 0, 3] = torch.tensor([0.1, 0.2])
    c2w = c2w.expand(3, -1, -1, -1)  # three candidates: every fraction is over all frames
    read = study.read_halves(c2w, torch.tensor([9 + 1, 9 + 1]),
                             {"trans_thresholds": (0.05,), "rot_threshold_deg": 1.0})
    assert read == {"translation_right": 0.0, "rotation_right": 0.0, "yaw_as_step": 1.0}
    assert study.combination_kind(torch.tensor(5 * 9)) == study.KINDS[0]
    assert study.combination_kind(torch.tensor(5)) == study.KINDS[1]
    assert study.combination_kind(torch.tensor(9 + 2)) == study.KINDS[2]


def test_offset_response_runs_on_the_shipped_base(capsys, tmp_path):
    study = _load("offset_response")
    assert study.main(["--groups", "2", "--json", str(tmp_path / "r.json")]) == 0
    out = capsys.readouterr().out
    assert "pressed translation key" in out and "pitch" in out and "noise alone" in out
    saved = json.loads((tmp_path / "r.json").read_text())
    assert saved["candidates"] <= 16 and len(saved["offset_motion_correlation"]) == 4


def test_batched_eager_baseline_runs_no_custom_op_and_replicates_the_history(monkeypatch):
    """The baseline's iterations reach the references of the loss and noising (never their
    fused ops) and SDPA over a replicated history; afterwards the rules' ops are restored."""
    from wc_fast import config as config_lib
    from wc_fast.models import TinyWorldDiT
    from wc_fast.rl.updates import nft as nft_rule
    from wc_kernels.ops.prefix_attention import _FAST

    batched_eager = _load("batched_eager")
    cfg = config_lib.preset("smoke")
    fused = nft_rule.nft_loss
    calls = []
    real = _FAST["replicated"]
    monkeypatch.setitem(_FAST, "replicated", lambda *a: calls.append("sdpa") or real(*a))
    trainer = batched_eager.batched_eager_trainer(cfg, TinyWorldDiT(cfg.model),
                                                  torch.device("cpu"))
    assert trainer.cfg.rollout.capture == "eager" and trainer.old.attention_backend == \
        "replicated"
    with batched_eager.plain_pytorch_ops():
        assert nft_rule.nft_loss.keywords == {"backend": "reference"}
        assert nft_rule.flow_noise.keywords == {"backend": "reference"}
        trainer.iteration(0)
    assert calls and nft_rule.nft_loss is fused


def test_batched_eager_baseline_runs_a_wan_model_with_its_vae(monkeypatch):
    """At the Wan shape (here the tests' tiny one) the baseline trains through the VAE it is
    given and replicates the history in the Wan model's attention too."""
    from wc_kernels.ops.prefix_attention import _FAST

    pytest.importorskip("diffusers")
    study, batched_eager = _load("wan_iteration"), _load("batched_eager")
    args = study.parse_args(["--shape", "tiny", "--device", "cpu", "--resolution", "64",
                             "--clip-frames", "2", "--group-size", "4", "--steps", "2"])
    cfg = study.run_config(args, *study.VARIANTS["full"])
    model, codec = study.build(study.SHAPES["tiny"], cfg, torch.device("cpu"))
    calls = []
    real = _FAST["replicated"]
    monkeypatch.setitem(_FAST, "replicated", lambda *a: calls.append("sdpa") or real(*a))
    trainer = batched_eager.batched_eager_trainer(cfg, model, torch.device("cpu"), codec=codec)
    assert trainer.codec is codec and model.attention_backend == "replicated"
    with batched_eager.plain_pytorch_ops():
        stats = trainer.iteration(cfg.rollout.num_clips - 1)  # clip N: a shared history
    assert calls and stats.times["train"] > 0


def test_study_rows_are_read_from_their_file_as_wc_fast_train_arguments():
    replicate = _load("replicate")
    assert list(replicate.ROWS)[0] == "recipe" and "full" in replicate.ROWS
    assert replicate.row_args({"optim": {"lr": 3e-5}, "reward": {"lam": 2 / 3},
                               "update": {"compile": True},
                               "model": {"lora_targets": ["a", "b"]}}) \
        == ["--optim.lr", "3e-05", "--reward.lam", "0.6666666666666666", "--update.compile",
            "true", "--model.lora_targets", "a,b"]
