"""``python -m studies.memory``: the count on fake tensors equals the count on real ones (a
small Wan-shaped run, every phase), and a velocity keeps no layer's keys and values."""

import argparse
from pathlib import Path

import pytest
import torch

from studies import memory

pytest.importorskip("diffusers")


def _args(**kw) -> argparse.Namespace:
    values = dict(preset=None, model="tiny", variants="full", resolution=64, clip_frames=2,
                  group_size=4, steps=3, micro_batch=4, lora_rank=4, kl=False,
                  whole_copies=False, largest=0, candidate_chunk=None, nproc=1)
    return argparse.Namespace(**{**values, **kw})


@pytest.mark.parametrize("variant", ["full", "lora+checkpointing"])
def test_fake_tensors_count_what_real_ones_hold(variant):
    fake = memory.measure(_args(), variant, fake=True)
    real = memory.measure(_args(), variant, fake=False)
    for key in ("setup_gib", "rollout_peak_gib", "reward_peak_gib", "update_peak_gib"):
        assert fake[key] == real[key] > 0, key


@pytest.mark.parametrize("variant", ["full", "lora+checkpointing"])
def test_the_categories_at_each_peak_sum_to_it_and_name_the_trained_weights(variant):
    row = memory.measure(_args(kl=True, largest=3), variant)
    assert set(row["by_phase"]) == {"setup", *memory.PHASES}
    for phase in row["by_phase"].values():
        assert set(phase["by_category"]) == set(memory.CATEGORIES)
        assert sum(phase["by_category"].values()) == phase["peak_bytes"] > 0
    assert row["peak_bytes"] == max(row["by_phase"][p]["peak_bytes"] for p in memory.PHASES)
    cfg = memory.run_config(_args(kl=True), *memory.VARIANTS[variant])
    model = memory.MODELS["tiny"][1](cfg, "tiny")
    if cfg.model.lora_rank:
        model.add_lora(cfg.model.lora_rank, cfg.model.lora_alpha, cfg.model.lora_targets)
    trained = [p for p in model.parameters() if p.requires_grad]
    if cfg.model.lora_rank:  # the adapters and the conditioning train, nothing else
        lora = {id(p) for p in (*model.lora_parameters(), *model.conditioning_parameters())}
        assert {id(p) for p in trained} == lora
    trained_bytes = sum(p.numel() * 4 for p in trained)  # fp32 masters
    setup, step = row["by_phase"]["setup"]["by_category"], row["after_step"]["by_category"]
    kept = row["kept"]["by_category"]
    assert setup["trained_parameters"] == kept["trained_parameters"] == trained_bytes
    # the old model's own copy of the trained weights (fp32, and its buffers), and the
    # reference's (its block matrices in bf16)
    assert setup["old_reference"] >= trained_bytes + trained_bytes // 2
    # the gradients from the backward until the trainer frees them after the step
    assert setup["gradients"] == kept["gradients"] == 0 and step["gradients"] == trained_bytes
    assert step["optimizer_state"] == kept["optimizer_state"] >= trained_bytes
    assert setup["frozen_parameters"] > 0
    assert 0 < len(row["by_phase"]["update"]["largest"]) <= 3


def test_a_preset_resolves_its_run_and_the_flags_override_it():
    args = _args(preset="worldplay_lora", model=None, variants=None, resolution=None,
                 clip_frames=None, group_size=None, steps=2, micro_batch=None, lora_rank=None,
                 kl=None)
    assert memory.study_model(args) == "worldplay-8b"
    cfg = memory.run_config(args, None, None)
    base = memory.config_lib.build_preset("worldplay_lora")
    assert (cfg.model.resolution, cfg.model.lora_rank, cfg.rollout.group_size,
            cfg.update.micro_batch, cfg.model.activation_checkpointing, cfg.nft.kl_beta) == (
        base.model.resolution, base.model.lora_rank, base.rollout.group_size,
        base.update.micro_batch, base.model.activation_checkpointing, base.nft.kl_beta)
    assert cfg.rollout.steps == 2 != base.rollout.steps
    assert memory.run_config(_args(**{**vars(args), "kl": True}), None, None).nft.kl_beta > 0
    full = memory.run_config(args, False, True)
    assert full.model.lora_rank == 0 and full.model.activation_checkpointing


def test_the_old_models_copy_and_the_kl_reference_cost_what_they_hold():
    shared, whole = (memory.measure(_args(whole_copies=w), "lora") for w in (False, True))
    with_kl = memory.measure(_args(kl=True), "lora")
    assert shared["setup_gib"] < whole["setup_gib"] and shared["setup_gib"] < with_kl["setup_gib"]


def test_live_bytes_counts_a_storage_once_and_frees_it():
    counter = memory.LiveBytes()
    with counter:
        a = torch.zeros(256, 1024)  # 1 MiB
        view = a[:, :512]
        b = a + 1
        del b
    assert counter.peak == 2 * 2**20 and counter.live == 2**20
    del a, view
    assert counter.live == 0


def test_a_velocity_frees_each_layers_keys_and_values_when_the_layer_is_done(monkeypatch):
    """Only the cache builders keep every layer's keys and values; a velocity holding them
    all until its last layer cost 71 GiB of WorldPlay-8B's rollout at 12 candidates."""
    from test_wan_world_model import latents, tiny_model

    from wc_fast.models.wan.model import WanWorldModel

    model = tiny_model()
    with torch.no_grad():
        cache = model.build_cache_parallel(latents(1, 5), torch.zeros(1, 5, dtype=torch.long),
                                           sigma=0.0)
    x_t = latents(8, model.clip_frames)

    def peak() -> int:
        counter = memory.LiveBytes()
        with torch.no_grad(), counter:
            model.velocity(x_t, torch.full((8,), 0.5),
                           torch.zeros(8, model.clip_frames, dtype=torch.long),
                           cache)
        return counter.peak

    lean = peak()
    trunk = WanWorldModel._trunk
    monkeypatch.setattr(WanWorldModel, "_trunk",
                        lambda self, *a, keep_kv=True, **k: trunk(self, *a, keep_kv=True, **k))
    assert lean < peak()


def test_sampling_the_candidates_in_chunks_lowers_the_rollouts_peak():
    whole, chunked = (memory.measure(_args(group_size=8, candidate_chunk=c), "lora")
                      for c in (None, 2))
    assert chunked["rollout_peak_gib"] < whole["rollout_peak_gib"]
    assert chunked["setup_gib"] == whole["setup_gib"]


@pytest.fixture
def fake_group():
    """Leave no process group behind for the tests after."""
    yield
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def test_one_rank_of_two_under_fsdp2_holds_half_the_weights_as_real_tensors_do(fake_group):
    one = memory.measure(_args(kl=True), "full")
    fake = memory.measure(_args(kl=True, nproc=2), "full")
    real = memory.measure(_args(kl=True, nproc=2), "full", fake=False)
    assert fake["by_phase"] == real["by_phase"] and fake["kept"] == real["kept"]
    whole, shard = one["kept"]["by_category"], fake["kept"]["by_category"]
    for category in ("trained_parameters", "optimizer_state"):
        # half, and the padding of rows that do not split evenly
        assert 0.45 * whole[category] < shard[category] < 0.6 * whole[category], category
    # the old model and the reference, whole fp32 copies under FSDP2, sharded alike
    assert shard["old_reference"] >= 2 * shard["trained_parameters"]
    # the setup's peak: the model whole on the rank before it is sharded; the old model and
    # the reference are never whole on it (built shard by shard from the sharded model)
    setup = fake["by_phase"]["setup"]["by_category"]
    assert setup["old_reference"] <= shard["old_reference"]
    assert fake["setup_gib"] < one["setup_gib"]


def test_the_committed_memory_table_is_generated_from_the_committed_results(monkeypatch):
    from studies import memory_table

    monkeypatch.chdir(Path(__file__).resolve().parents[1])
    committed = (memory_table.RESULTS / "table.md").read_text()
    assert committed == memory_table.table()
    assert "| worldplay | 8 | yes |" in committed and committed.count("| yes |\n") >= 4
