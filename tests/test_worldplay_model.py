"""WorldPlayWorldModel against the official HY-WorldPlay transformer (the golden fixture made by
bench/make_worldplay_fixture.py), and its protocol behaviour."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file

from wc_fast.models.worldplay import WorldPlayConfig, WorldPlayWorldModel, key_pattern_weights
from wc_fast.models.worldplay_camera import action_keys, intrinsics

FIXTURE = Path(__file__).parent / "fixtures" / "worldplay_tiny"


def fixture_model() -> tuple[WorldPlayWorldModel, dict]:
    card = json.loads(FIXTURE.with_suffix(".json").read_text())
    tensors = load_file(FIXTURE.with_suffix(".safetensors"))
    data = {k.removeprefix("fixture."): v for k, v in tensors.items() if k.startswith("fixture.")}
    weights = {k: v for k, v in tensors.items() if not k.startswith("fixture.")}
    cfg = card["config"]
    config = WorldPlayConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in cfg.items()
                                if k in WorldPlayConfig.__dataclass_fields__})
    model = WorldPlayWorldModel(config, clip_frames=card["chunk"],
                                latent_size=tuple(card["latent_size"]),
                                text_states=data["text_states"],
                                vision_states=data["vision_states"],
                                context_sigma=card["context_timestep"] / 1000)
    model.load_official(weights)
    return model.eval(), {**data, "card": card}


def test_matches_official_without_history():
    model, d = fixture_model()
    f = d["card"]["chunk"]
    w2c = d["w2c"][None, -f:].expand(2, -1, -1, -1)
    sigma = d["sigma"][:, None].expand(2, f)
    with torch.no_grad():
        v = model._velocity(d["noisy"], sigma, d["chunk_actions"], None, w2c,
                            model.empty_cache())
    torch.testing.assert_close(v, d["velocity_no_history"], atol=2e-5, rtol=1e-4)


def test_matches_official_with_history():
    model, d = fixture_model()
    p, f = d["card"]["context_frames"], d["card"]["chunk"]
    with torch.no_grad():
        sigma_ctx = torch.full((1, p), model.context_sigma)
        cache = model._cache_from(d["context"], d["context_actions"][None], sigma_ctx,
                                  d["w2c"][None, :p])
        v = model._velocity(d["noisy"], d["sigma"][:, None].expand(2, f), d["chunk_actions"],
                            None, d["w2c"][None, p:].expand(2, -1, -1, -1), cache)
    torch.testing.assert_close(v, d["velocity_with_history"], atol=2e-5, rtol=1e-4)
    assert (v - d["velocity_no_history"]).abs().max() > 0.1  # the history matters


def test_key_pattern_weights_one_hot_for_discrete_keys():
    ids = torch.arange(81)
    weights = key_pattern_weights(action_keys(ids))
    torch.testing.assert_close(weights, torch.eye(81))


def test_intrinsics_are_the_pipeline_default():
    _, d = fixture_model()
    torch.testing.assert_close(intrinsics(9).float(), d["intrinsics"])
