"""Presets reproduce docs/design.md section 4; impossible values raise naming the field."""

import dataclasses
import json

import pytest
import torch

from wc_fast import config as C
from wc_fast.cli import parse_run_args


def test_paper_preset_values():
    cfg = C.preset("paper")
    assert cfg.rollout.group_size == 16 and cfg.nft.keep == 3
    assert (cfg.rollout.steps, cfg.rollout.shift) == (40, 5.0)
    assert cfg.nft.timestep_fraction == 0.5
    assert (cfg.reward.lam, cfg.reward.Z, cfg.nft.beta) == (2 / 3, 2.0, 1.0)
    assert cfg.reward.rot_threshold_deg == 1.0
    assert cfg.reward.trans_thresholds == (0.01, 0.02, 0.03, 0.04, 0.05)
    assert (cfg.reward.vq_mode, cfg.reward.vq_stride) == ("stride", 4)
    assert (cfg.optim.optimizer, cfg.optim.lr) == ("muon", 1e-5)
    assert (cfg.ema.schedule, cfg.ema.start, cfg.ema.end) == ("linear", 0.4, 0.8)
    assert cfg.nft.loss_space == "velocity" and cfg.reward.std == "group"
    assert cfg.nft.old_prediction == "old_model"


def test_official_preset_values():
    cfg = C.preset("official")
    assert cfg.rollout.group_size == 12 and cfg.nft.keep == 3
    assert (cfg.rollout.steps, cfg.rollout.shift, cfg.nft.timestep_fraction) == (40, 5.0, 0.5)
    assert cfg.reward.rot_threshold_deg == 0.2
    assert cfg.reward.trans_thresholds == (0.002, 0.005, 0.01)
    assert cfg.reward.vq_mode == "drift" and cfg.reward.std == "global"
    assert (cfg.optim.optimizer, cfg.optim.lr, cfg.optim.weight_decay, cfg.optim.grad_clip) == (
        "muon", 1e-5, 1e-4, 2.0)
    assert cfg.ema.schedule == "official" and cfg.nft.loss_space == "x0"
    assert cfg.nft.old_prediction == "old_model"


@pytest.mark.parametrize("name", C.PRESETS)
def test_presets_validate_and_round_trip(name):
    if name in C.NEEDS_MODEL_PATH:
        cfg = C.build_preset(name)
        cfg.model.path = "/models/Wan2.1-T2V-1.3B-Diffusers"
        C.validate(cfg)
    else:
        cfg = C.preset(name)
    assert C.from_dict(json.loads(json.dumps(C.to_dict(cfg)))) == cfg


@pytest.mark.parametrize("name", ["wan", "wan_smoke"])
def test_wan_presets_name_the_missing_model_path(name):
    with pytest.raises(ValueError, match="model.path"):
        C.preset(name)
    cfg = C.build_preset(name)
    assert (cfg.model.backbone, cfg.model.dtype, cfg.train.init) == ("wan", "bfloat16", "base")
    assert cfg.model.activation_checkpointing and cfg.update.micro_batch >= 1
    assert cfg.rollout.capture == "eager"


def test_presets_are_independent_objects():
    a, b = C.preset("cpu"), C.preset("cpu")
    a.rollout.group_size = 10
    assert b.rollout.group_size == 8


def test_slots_reject_unknown_attributes():
    with pytest.raises(AttributeError):
        C.preset("paper").rollout.groupsize = 3


@pytest.mark.parametrize("path,value,match", [
    ("nft.keep", "9", "nft.keep"),
    ("nft.timestep_fraction", "0", "nft.timestep_fraction"),
    ("nft.timestep_fraction", "1.5", "nft.timestep_fraction"),
    ("nft.kl_beta", "-0.1", "nft.kl_beta"),
    ("reward.rot_threshold_deg", "-1", "reward.rot_threshold_deg"),
    ("reward.trans_thresholds", "0.1,-0.2", "reward.trans_thresholds"),
    ("reward.lam", "2", "reward.lam"),
    ("reward.trajectory_weights", "1.0", "reward.trajectory_weights"),
    ("reward.trajectory_weights", "1.0,-1.0", "reward.trajectory_weights"),
    ("reward.std", "batch", "reward.std"),
    ("rollout.group_size", "1", "rollout.group_size"),
    ("rollout.candidate_chunk", "-1", "rollout.candidate_chunk"),
    ("model.dim", "100", "model.dim"),
    ("optim.lr", "0", "optim.lr"),
    ("ema.schedule", "cosine", "ema.schedule"),
    ("nft.old_prediction", "current", "nft.old_prediction"),
    ("train.max_bad_updates", "0", "train.max_bad_updates"),
    ("train.loggers", "tensorboard", "train.loggers"),
    ("train.loggers", "jsonl,mlflow", "train.loggers"),
    ("train.update", "ppo", "train.update"),
    ("grpo.clip_range", "-0.1", "grpo.clip_range"),
    ("grpo.clip_range", "1.0", "grpo.clip_range"),
    ("grpo.adv_clip_max", "0", "grpo.adv_clip_max"),
    ("grpo.kl_beta", "-0.04", "grpo.kl_beta"),
    ("grpo.timestep_fraction", "0", "grpo.timestep_fraction"),
    ("grpo.timestep_fraction", "1.5", "grpo.timestep_fraction"),
    ("grpo.window", "-1", "grpo.window"),
    ("grpo.window", "40", "grpo.window"),  # 40 steps: the last is never stochastic
    ("reward.decouple_every", "-1", "reward.decouple_every"),
    ("reward.decouple_min_keys", "0", "reward.decouple_min_keys"),
    ("reward.decouple_min_keys", "5", "reward.decouple_min_keys"),
    ("rollout.noise_warp", "-0.1", "rollout.noise_warp"),
    ("rollout.noise_warp", "1.5", "rollout.noise_warp"),
])
def test_impossible_values_name_the_field(path, value, match):
    cfg = C.preset("paper")
    C.apply_override(cfg, path, value)
    with pytest.raises(ValueError, match=match):
        C.validate(cfg)


@pytest.mark.parametrize("path,value", [("rollout.capture", "cuda_graph"),
                                        ("update.context_kv", "recompute_grad"),
                                        ("update.compile", "true")])
def test_fsdp2_refuses_what_it_cannot_shard(path, value):
    cfg = C.preset("paper")
    C.apply_override(cfg, "train.distributed", "fsdp2")
    C.validate(cfg)
    C.apply_override(cfg, path, value)
    with pytest.raises(ValueError, match=path):
        C.validate(cfg)


@pytest.mark.parametrize("path,value", [("rollout.sde_noise", "0"),
                                        ("rollout.candidate_noise", "sde"),
                                        ("rollout.mode", "sample"),
                                        ("rollout.steps", "1"),
                                        ("rollout.candidate_chunk", "4")])
def test_flow_grpo_refuses_rollouts_it_cannot_train_on(path, value):
    cfg = C.preset("paper")
    C.apply_override(cfg, path, value)
    C.validate(cfg)  # the NFT update takes them
    C.apply_override(cfg, "train.update", "flow_grpo")
    with pytest.raises(ValueError, match=rf"{path} \(with train.update flow_grpo"):
        C.validate(cfg)


def test_each_update_reads_its_own_kl_weight():
    """The recipe's presets set nft.kl_beta 0.1; a Flow-GRPO run of them reads grpo.kl_beta
    (0: no reference model kept) and the NFT section's weight is not its."""
    from wc_fast.rl.updates import build_update
    cfg = C.preset("cpu")
    assert cfg.nft.kl_beta == 0.1 and build_update(cfg).kl_beta == 0.1
    C.apply_override(cfg, "train.update", "flow_grpo")
    C.apply_override(cfg, "rollout.action_exploration", "0")
    C.validate(cfg)
    rule = build_update(cfg)
    assert rule.kl_beta == 0.0 and rule.reference(torch.nn.Linear(2, 2)) is None
    C.apply_override(cfg, "grpo.kl_beta", "0.04")
    assert build_update(cfg).kl_beta == 0.04


def test_grpo_defaults_are_flow_grpos_and_the_cli_sets_them():
    cfg = C.preset("paper")
    assert cfg.train.update == "nft"
    gr = cfg.grpo
    assert (gr.clip_range, gr.adv_clip_max, gr.kl_beta) == (1e-4, 5.0, 0.0)
    assert (gr.timestep_fraction, gr.window, gr.same_noise) == (1.0, 0, False)
    run = parse_run_args("t", "t", ["--preset", "smoke", "--train.update", "flow_grpo",
                                    "--grpo.window", "2", "--grpo.same_noise", "true",
                                    "--grpo.kl_beta", "0.04"])
    gr = run.config.grpo
    assert run.config.train.update == "flow_grpo"
    assert (gr.window, gr.same_noise, gr.kl_beta) == (2, True, 0.04)
    with pytest.raises(SystemExit):
        parse_run_args("t", "t", ["--preset", "smoke", "--grpo.window", "4"])


@pytest.mark.parametrize("overrides,match", [
    ({"decouple_every": "4", "decouple_length": "0"}, "reward.decouple_length"),
    ({"decouple_every": "4", "decouple_length": "4"}, "reward.decouple_length"),
    ({"decouple_every": "4", "decouple_min_keys": "3"}, "reward.decouple_min_keys"),
])
def test_decoupled_phase_needs_a_schedule_and_prompts_that_exist(overrides, match):
    """A phase shorter than its period, and a key minimum that the rollout's key
    combinations (here pairs only) reach."""
    cfg = C.preset("paper")
    C.apply_override(cfg, "rollout.composite_keys", "2")
    for key, value in {**overrides, "decouple_every": "0"}.items():
        C.apply_override(cfg, f"reward.{key}", value)
    C.validate(cfg)  # checked only when the phase is on
    C.apply_override(cfg, "reward.decouple_every", overrides["decouple_every"])
    with pytest.raises(ValueError, match=match):
        C.validate(cfg)


def test_world_r1_options_are_off_by_default_and_the_cli_sets_them():
    cfg = C.preset("paper")
    assert (cfg.reward.decouple_every, cfg.rollout.noise_warp) == (0, 0.0)
    run = parse_run_args("t", "t", ["--preset", "smoke", "--reward.decouple_every", "10",
                                    "--reward.decouple_length", "2", "--rollout.noise_warp",
                                    "0.5"])
    rw = run.config.reward
    assert (rw.decouple_every, rw.decouple_length, rw.decouple_min_keys) == (10, 2, 2)
    assert run.config.rollout.noise_warp == 0.5


def test_unknown_preset_and_fields():
    with pytest.raises(ValueError, match="unknown preset 'fast'"):
        C.preset("fast")
    with pytest.raises(ValueError, match="unknown config field 'rollout.g'"):
        C.apply_override(C.preset("paper"), "rollout.g", "3")
    with pytest.raises(ValueError, match="unknown config field 'foo'"):
        C.apply_override(C.preset("paper"), "foo", "3")
    with pytest.raises(ValueError, match="cannot parse 'x' as int"):
        C.apply_override(C.preset("paper"), "rollout.steps", "x")
    with pytest.raises(ValueError, match="unknown config field nft.bogus"):
        C.from_dict({"nft": {"bogus": 1}})


def test_override_parsing():
    cfg = C.preset("paper")
    C.apply_override(cfg, "reward.trans_thresholds", "0.1, 0.2")
    C.apply_override(cfg, "train.eval_at_end", "false")
    C.apply_override(cfg, "optim.lr", "3e-4")
    assert cfg.reward.trans_thresholds == (0.1, 0.2)
    assert cfg.train.eval_at_end is False and cfg.optim.lr == 3e-4


def test_cli_flags_and_overrides():
    run = parse_run_args("t", "t", ["--preset", "smoke", "--steps", "5", "--out", "x",
                                    "--rollout.steps=3", "--nft.beta", "0.5", "--resume"])
    cfg = run.config
    assert (cfg.preset, cfg.train.steps, cfg.train.out) == ("smoke", 5, "x")
    assert (cfg.rollout.steps, cfg.nft.beta, run.resume) == (3, 0.5, True)
    with pytest.raises(SystemExit):
        parse_run_args("t", "t", ["--nft.keep", "5"])
    with pytest.raises(SystemExit):
        parse_run_args("t", "t", ["--preset", "huge"])


def test_configs_saved_by_earlier_versions_still_load():
    saved = C.to_dict(C.preset("official"))
    saved["train"]["log_every"] = 5  # a field that never had an effect, since dropped
    saved["optim"]["optimizer"] = "muon_adamw"  # the old name of "muon"
    del saved["rollout"]["candidate_noise"]
    saved["rollout"]["exploration"] = "noise"  # its old name and value
    cfg = C.from_dict(saved)
    assert cfg.optim.optimizer == "muon" and cfg.rollout.candidate_noise == "independent"
    saved["rollout"]["exploration"] = "sde"
    assert C.from_dict(saved).rollout.candidate_noise == "sde"
    saved["rollout"]["exploration"] = "noise"
    assert C.to_dict(cfg) == C.to_dict(C.preset("official"))
    saved["train"]["log_every_n"] = 5
    with pytest.raises(ValueError, match="train.log_every_n"):
        C.from_dict(saved)


def test_a_renamed_field_on_the_command_line_names_its_new_name():
    with pytest.raises(ValueError, match="'rollout.exploration' is now 'rollout.candidate_noise'"):
        C.apply_override(C.preset("cpu"), "rollout.exploration", "sde")


def test_configs_saved_with_the_update_settings_in_section_nft_load_into_section_update():
    """Configs written while ``context_kv``, ``micro_batch`` and ``compile`` were in ``nft``."""
    want = C.preset("cpu")
    want.update = C.UpdateConfig(context_kv="reuse", micro_batch=4, compile=True)
    saved = C.to_dict(want)
    saved["nft"].update(saved.pop("update"))
    saved = json.loads(json.dumps(saved))
    assert C.from_dict(saved) == want
    assert C.read_saved(saved) == C.to_dict(want)  # what a resumed run compares


def test_the_old_spelling_of_a_moved_field_sets_the_new_one_with_a_warning(tmp_path):
    cfg = C.preset("cpu")
    with pytest.warns(FutureWarning, match="'nft.micro_batch' is deprecated: it is "
                                           "'update.micro_batch'"):
        C.apply_override(cfg, "nft.micro_batch", "4")
    assert cfg.update.micro_batch == 4
    with pytest.warns(FutureWarning) as caught:
        run = parse_run_args("t", "t", ["--preset", "smoke", "--nft.context_kv", "reuse",
                                        "--nft.compile=true"])
    assert [str(w.message) for w in caught] == [
        f"config field 'nft.{name}' is deprecated: it is 'update.{name}'"
        for name in ("context_kv", "compile")]
    assert (run.config.update.context_kv, run.config.update.compile) == ("reuse", True)
    assert not hasattr(run.config.nft, "compile")
    (tmp_path / "mine.yaml").write_text("inherits: [smoke]\nnft:\n  micro_batch: 2\n")
    with pytest.warns(FutureWarning, match="'update.micro_batch'"):
        assert C.load(tmp_path / "mine.yaml").update.micro_batch == 2


def test_rl_configs_saved_with_a_pretrain_section_load_without_it():
    """RL configs written while the run config held the pretraining section."""
    saved = C.to_dict(C.preset("cpu"))
    saved["pretrain"] = C.to_dict(C.build_pretrain_run("cpu"))["pretrain"]
    cfg = C.from_dict(json.loads(json.dumps(saved)))
    assert isinstance(cfg, C.Config) and C.to_dict(cfg) == C.to_dict(C.preset("cpu"))


def test_a_pretraining_runs_saved_config_loads_as_one():
    run = C.build_pretrain_run("smoke")
    C.apply_base(run, "wan")
    C.validate_pretrain_run(run)
    assert C.from_dict(json.loads(json.dumps(C.to_dict(run)))) == run


def test_pretraining_presets_keep_the_shipped_base_models_pretraining():
    for name in ("cpu", "gpu"):
        run = C.build_pretrain_run(name)
        assert run.model == C.build_preset(name).model
        assert (run.pretrain.steps, run.pretrain.composite_fraction) == (1500, 0.0)
    assert C.build_pretrain_run("paper").pretrain == C.PretrainConfig()
    C.apply_override(run, "pretrain.lr", "-1")
    with pytest.raises(ValueError, match="pretrain.lr"):
        C.validate_pretrain_run(run)


@pytest.mark.parametrize("config_type", [C.Config, C.PretrainRun])
def test_every_field_has_help(config_type):
    for section in dataclasses.fields(config_type):
        if section.name == "preset":
            continue
        for item in dataclasses.fields(section.default_factory):
            text = item.metadata.get("help", "")
            assert isinstance(text, str) and text.strip(), f"{section.name}.{item.name}"


def _help(kind: C.RunKind, capsys, *args: str) -> str:
    with pytest.raises(SystemExit) as exit_info:
        parse_run_args("prog", "d", ["--help", *args], kind=kind, with_base=True)
    assert exit_info.value.code == 0
    return " ".join(capsys.readouterr().out.split())  # argparse wraps lines


def test_help_lists_every_field_with_its_type_default_and_help(capsys):
    text = _help(C.RL_RUN, capsys, "--preset", "paper")
    for name in C.SECTIONS:
        assert f"{name} section:" in text
        for field_name in C.to_dict(C.Config())[name]:
            assert f"--{name}.{field_name} " in text, f"{name}.{field_name}"
    assert "--rollout.steps INT sampler steps per clip (default: 40)" in text
    assert "--reward.std {group,global}" in text
    assert "--reward.trans_thresholds FLOAT [FLOAT ...] translations per frame" in text
    assert "(default: 0.01,0.02,0.03,0.04,0.05)" in text
    assert "--pretrain." not in text


def test_help_shows_the_chosen_presets_or_files_values(capsys, tmp_path):
    assert "--rollout.steps INT sampler steps per clip (default: 4)" in _help(
        C.RL_RUN, capsys, "--preset", "smoke")
    assert "--model.patch INT" in (text := _help(C.RL_RUN, capsys, "--preset", "cpu"))
    assert "(default: 10)" in text.split("--rollout.steps INT")[1][:60]
    assert "model.heads (default: 128)" in _help(
        C.RL_RUN, capsys, "--preset", "smoke", "--base", "wan")
    file = tmp_path / "mine.yaml"
    file.write_text("inherits: smoke\nrollout:\n  steps: 7\n")
    assert "sampler steps per clip (default: 7)" in _help(C.RL_RUN, capsys, "--config",
                                                          str(file))


def test_pretraining_help_lists_the_model_and_pretraining_fields_only(capsys):
    text = _help(C.PRETRAIN_RUN, capsys)
    assert "--pretrain.max_minutes FLOAT a wall-clock budget (0 = none)" in text
    assert "--model.depth INT" in text
    assert "--rollout." not in text and "--train." not in text


def test_a_pretraining_field_in_an_rl_run_names_where_it_belongs(capsys):
    with pytest.raises(SystemExit):
        parse_run_args("t", "d", ["--pretrain.steps", "5"])
    assert "'pretrain.steps' belongs to python -m wc_fast.pretrain" in capsys.readouterr().err


def test_a_tuple_field_takes_space_or_comma_separated_values():
    for values in (["1", "3"], ["1,3"]):
        run = parse_run_args("t", "d", ["--preset", "smoke", "--reward.if_kind", "trajectory",
                                        "--reward.trajectory_weights", *values])
        assert run.config.reward.trajectory_weights == (1.0, 3.0)
    run = parse_run_args("t", "d", ["--preset", "smoke", "--reward.trans_thresholds", "0.1,0.2",
                                    "0.3"])
    assert run.config.reward.trans_thresholds == (0.1, 0.2, 0.3)
    run = parse_run_args("t", "d", ["--preset", "smoke", "--model.lora_targets", "to_q", "to_k",
                                    "--model.depth", "1"])
    assert run.config.model.lora_targets == ("to_q", "to_k") and run.config.model.depth == 1


def test_pretraining_flags_set_the_pretraining_run():
    run = parse_run_args("p", "d", ["--preset", "smoke", "--steps", "7",
                                    "--pretrain.shift=3", "--model.depth", "1"],
                         kind=C.PRETRAIN_RUN, steps_field="pretrain.steps")
    assert isinstance(run.config, C.PretrainRun)
    assert (run.config.pretrain.steps, run.config.pretrain.shift) == (7, 3.0)
    assert run.config.model.depth == 1


def _differences(a: C.Config, b: C.Config) -> set[str]:
    da, db = C.to_dict(a), C.to_dict(b)
    return {f"{s}.{k}" for s in C.SECTIONS for k in da[s] if da[s][k] != db[s][k]}


def test_cpu_and_gpu_presets_differ_only_in_size():
    diffs = _differences(C.preset("cpu"), C.preset("gpu"))
    assert diffs and diffs <= set(C.SIZE_FIELDS)


@pytest.mark.parametrize("cuda", [False, True])
def test_default_command_line_runs_the_recipe_on_every_machine(monkeypatch, cuda):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    cfg = parse_run_args("test", "", []).config
    assert cfg.preset == ("gpu" if cuda else "cpu")
    assert _differences(cfg, C.preset("cpu")) <= set(C.SIZE_FIELDS)
