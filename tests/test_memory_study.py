"""``python -m studies.memory``: the count on fake tensors equals the count on real ones (a
small Wan-shaped run, every phase), and a velocity keeps no layer's keys and values."""

import argparse

import pytest
import torch

from studies import memory

pytest.importorskip("diffusers")


def _args(**kw) -> argparse.Namespace:
    values = dict(model="tiny", variants="full", resolution=64, clip_frames=2, group_size=4,
                  steps=3, micro_batch=4, lora_rank=4, kl=False, whole_copies=False)
    return argparse.Namespace(**{**values, **kw})


@pytest.mark.parametrize("variant", ["full", "lora+checkpointing"])
def test_fake_tensors_count_what_real_ones_hold(variant):
    fake = memory.measure(_args(), variant, fake=True)
    real = memory.measure(_args(), variant, fake=False)
    for key in ("setup_gib", "rollout_peak_gib", "reward_peak_gib", "update_peak_gib"):
        assert fake[key] == real[key] > 0, key


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

    from wc_fast.models.wan import WanWorldModel

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
