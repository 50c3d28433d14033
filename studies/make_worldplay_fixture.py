"""Write tests/fixtures/worldplay_tiny.safetensors (+ .json): HY-WorldPlay's own transformer at a
tiny random configuration, run on CPU in fp32, as the golden reference of
:class:`wc_fast.models.worldplay.model.WorldPlayWorldModel`.

Usage::

    python -m studies.make_worldplay_fixture OFFICIAL_REPO [--out tests/fixtures/worldplay_tiny]

``OFFICIAL_REPO`` is a checkout of https://github.com/Tencent-Hunyuan/HY-WorldPlay at commit
``da2d0c26eb0edb647f56e164ffd966490eb75282`` (its ``hyvideo/`` package is imported from there;
nothing of it is copied into this repository). It needs ``einops`` and ``loguru`` (imports of
the official code, not dependencies of wc_fast). The official attention runs through
``F.scaled_dot_product_attention`` on CPU (its ``torch`` / ``torch_causal`` paths); no GPU-only
module is called.

What is run, as the official AR pipeline runs it (``hyvideo/pipelines/worldplay_video_pipeline.py``,
``_ar_rollout_inner``): the text branch once (``forward_txt``, timestep 0, cache the text keys and
values of every double block); then for each of two candidate chunks of 4 latent frames

* without history: ``forward_vision`` over the text cache alone (RoPE frames 0..3);
* with history: ``forward_vision(cache_vision=True)`` over 5 clean context frames at timestep 14
  (the stabilization level minus one; frame 0 carries the image condition), then the chunk at
  RoPE frames 5..8 over text + context.

``--check-glyph`` instead compares the text stream with ByT5 glyph tokens and the
condition-type embedding on (``check_glyph_text``) and prints the largest difference.

It also runs the official ``pose_to_input`` on a pose string that presses every key
(``POSE_STRING``) and stores its view matrices, intrinsics and action labels.

Weights are the official state dict keys (after ``add_action_parameters``), every tensor drawn at
random (the official init zeroes the action and PRoPE projections, which would test nothing).
Inputs and outputs are stored beside them under the prefix ``fixture.``.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
import types
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file
from scipy.spatial.transform import Rotation

COMMIT = "da2d0c26eb0edb647f56e164ffd966490eb75282"

# a 2-double-block WorldPlay: the official layout of HunyuanVideo-1.5 480p i2v (no single-stream
# blocks, patch 1, concatenated image condition, SigLIP vision tokens), at a tiny width
CONFIG = {
    "patch_size": [1, 1, 1], "in_channels": 4, "concat_condition": True, "out_channels": 4,
    "hidden_size": 64, "heads_num": 2, "mlp_width_ratio": 4.0, "mlp_act_type": "gelu_tanh",
    "mm_double_blocks_depth": 2, "mm_single_blocks_depth": 0, "rope_dim_list": [8, 12, 12],
    "qkv_bias": True, "qk_norm": True, "qk_norm_type": "rms", "guidance_embed": False,
    "use_meanflow": False, "text_projection": "single_refiner", "use_attention_mask": True,
    "text_states_dim": 16, "text_states_dim_2": 8, "text_pool_type": None, "rope_theta": 256,
    "attn_mode": "torch", "glyph_byT5_v2": False, "vision_projection": "linear",
    "vision_states_dim": 12, "is_reshape_temporal_channels": False,
    "use_cond_type_embedding": False,
}
LATENT = (4, 4)  # latent H, W
CONTEXT_FRAMES = 5
CHUNK = 4
CONTEXT_TIMESTEP = 14
TEXT_TOKENS, VISION_TOKENS = 5, 3
# every key of the official pose-string syntax (durations in latent frames)
POSE_STRING = "w-2, right-2, d-1, up-2, s-1, left-3, a-2, down-1"
POSE_FUNCTIONS = ("one_hot_to_one_dimension", "parse_pose_string", "pose_string_to_json",
                  "pose_to_input")


def randomize(model: torch.nn.Module, gen: torch.Generator) -> None:
    """Every parameter random: matrices ~ N(0, 1/fan_in), vectors ~ N(0, 0.1^2) (norm gains
    1 + that), so that no path of the network is silent."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                fan_in = p[0].numel()
                p.copy_(torch.randn(p.shape, generator=gen) / fan_in ** 0.5)
            elif name.endswith("norm.weight") or "_norm." in name:
                p.copy_(1 + 0.1 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))


def camera_path(frames: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Random world-to-camera matrices ``[frames, 4, 4]`` (small rotations and moves) and the
    normalised intrinsics ``[frames, 3, 3]`` the official ``pose_to_input`` writes."""
    angles = 0.1 * torch.randn(frames, 3, generator=gen, dtype=torch.float64)
    w2c = torch.eye(4, dtype=torch.float64).repeat(frames, 1, 1)
    for i in range(frames):
        skew = torch.zeros(3, 3, dtype=torch.float64)
        x, y, z = angles[i]
        skew[0, 1], skew[0, 2], skew[1, 2] = -z, y, -x
        w2c[i, :3, :3] = torch.linalg.matrix_exp(skew - skew.T)
        w2c[i, :3, 3] = 0.3 * torch.randn(3, generator=gen, dtype=torch.float64)
    # the default pixel K of hyvideo/generate.py, normalised as its pose_to_input does
    k = torch.tensor([[969.6969696969696, 0.0, 960.0], [0.0, 969.6969696969696, 540.0],
                      [0.0, 0.0, 1.0]], dtype=torch.float64)
    k[0, 0] /= k[0, 2] * 2
    k[1, 1] /= k[1, 2] * 2
    k[0, 2] = k[1, 2] = 0.5
    ks = k.repeat(frames, 1, 1)
    return w2c.float(), ks.float()


def official_pose_inputs(repo: Path, pose_string: str
                          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The view matrices, intrinsics and action labels ``hyvideo/generate.py``'s
    ``pose_to_input`` makes of ``pose_string``. Its functions and ``mapping`` are executed from
    the file's source alone: importing the module would load the pipeline and select a CUDA
    device."""
    from hyvideo.generate_custom_trajectory import generate_camera_trajectory_local

    source = (repo / "hyvideo" / "generate.py").read_text()
    tree = ast.parse(source)
    keep = [node for node in tree.body
            if (isinstance(node, ast.FunctionDef) and node.name in POSE_FUNCTIONS)
            or (isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "mapping"
                                                     for t in node.targets))]
    namespace = {"np": np, "torch": torch, "R": Rotation, "json": json,
                 "generate_camera_trajectory_local": generate_camera_trajectory_local}
    exec(compile(ast.Module(body=keep, type_ignores=[]), "generate.py", "exec"), namespace)
    latents = sum(int(cmd.split("-")[1]) for cmd in pose_string.split(",")) + 1
    w2c, ks, labels = namespace["pose_to_input"](pose_string, latents)
    return w2c.double(), ks.double(), labels.long()


def check_glyph_text(official, gen: torch.Generator) -> float:
    """Max |difference| between the official text stream's cached keys and values and
    :class:`WorldPlayWorldModel`'s with the ByT5 glyph tokens and the condition-type embedding
    on (left out of the stored fixture: the ByT5 mapper's fixed 1472 -> 2048 -> 2048 layers
    would exceed its size), on padded text and glyph inputs."""
    from wc_fast.models.worldplay.model import WorldPlayConfig, WorldPlayWorldModel

    config = {**CONFIG, "glyph_byT5_v2": True, "use_cond_type_embedding": True}
    model = official.HunyuanVideo_1_5_DiffusionTransformer(**config)
    model.add_action_parameters()
    randomize(model, gen)
    text = torch.randn(1, 7, config["text_states_dim"], generator=gen)
    glyphs = torch.randn(1, 6, 1472, generator=gen)
    vision = torch.randn(1, VISION_TOKENS, config["vision_states_dim"], generator=gen)
    mask = torch.tensor([[1, 1, 1, 1, 1, 0, 0]])
    glyph_mask = torch.tensor([[1, 1, 1, 1, 0, 0]])
    layers = config["mm_double_blocks_depth"]
    with torch.no_grad():
        cache = model(bi_inference=False, ar_txt_inference=True, ar_vision_inference=False,
                      timestep_txt=torch.tensor([0.0]), text_states=text,
                      encoder_attention_mask=mask, vision_states=vision, mask_type="i2v",
                      extra_kwargs={"byt5_text_states": glyphs, "byt5_text_mask": glyph_mask},
                      kv_cache=[{"k_vision": None, "v_vision": None, "k_txt": None,
                                 "v_txt": None} for _ in range(layers)], cache_txt=True)
        ours = WorldPlayWorldModel(
            WorldPlayConfig(**{k: tuple(v) if isinstance(v, list) else v
                               for k, v in config.items()
                               if k in WorldPlayConfig.__dataclass_fields__}),
            clip_frames=CHUNK, latent_size=LATENT, text_states=text[:, :5],
            vision_states=vision, byt5_states=glyphs[:, :4])
        ours.load_official(model.state_dict())
        keys, values = ours._text_cache()
    return max(float((cache[i][name] - mine[i]).abs().max())
               for i in range(layers) for name, mine in (("k_txt", keys), ("v_txt", values)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("official_repo", type=Path)
    parser.add_argument("--out", type=Path, default=Path("tests/fixtures/worldplay_tiny"))
    parser.add_argument("--check-glyph", action="store_true",
                        help="only compare the text stream with ByT5 glyph tokens and the "
                             "condition-type embedding (needs wc_fast importable); no fixture")
    args = parser.parse_args()
    sys.path.insert(0, str(args.official_repo.resolve()))
    import hyvideo.models.transformers.modules.attention as official_attention
    import hyvideo.models.transformers.worldplay_1_5_transformer as official
    from hyvideo.commons.infer_state import InferState

    # one process, no sequence parallelism: the official state builds a CUDA device mesh
    serial = types.SimpleNamespace(sp_enabled=False)
    official.get_parallel_state = official_attention.get_parallel_state = lambda: serial
    # the inference state of run.sh's defaults: no SageAttention, no torch.compile
    state = InferState(enable_sageattn=False, enable_torch_compile=False)
    official_attention.get_infer_state = lambda: state
    if args.check_glyph:
        diff = check_glyph_text(official, torch.Generator().manual_seed(99))
        print(f"text stream with glyphs: max |official - ours| = {diff:.3g}")
        return

    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1234)
    model = official.HunyuanVideo_1_5_DiffusionTransformer(**CONFIG)
    model.add_action_parameters()
    randomize(model, gen)
    model.eval()
    layers = CONFIG["mm_double_blocks_depth"]
    c, (h, w) = CONFIG["in_channels"], LATENT

    text = torch.randn(1, TEXT_TOKENS, CONFIG["text_states_dim"], generator=gen)
    vision_states = torch.randn(1, VISION_TOKENS, CONFIG["vision_states_dim"], generator=gen)
    context = torch.randn(1, c, CONTEXT_FRAMES, h, w, generator=gen)  # official [B, C, T, H, W]
    context_actions = torch.tensor([0, 9, 10, 37, 80])
    w2c, ks = camera_path(CONTEXT_FRAMES + CHUNK, gen)
    # _prepare_cond_latents for i2v: the image latent on frame 0 with mask 1, zeros elsewhere
    cond = torch.zeros(1, c + 1, CONTEXT_FRAMES + CHUNK, h, w)
    cond[:, :c, 0] = context[:, :, 0]
    cond[:, c, 0] = 1.0
    noisy = torch.randn(2, c, CHUNK, h, w, generator=gen)
    timesteps = torch.tensor([873, 402])
    chunk_actions = torch.tensor([[1, 5, 45, 77], [18, 18, 3, 0]])

    def text_cache() -> list[dict]:
        cache = [{"k_vision": None, "v_vision": None, "k_txt": None, "v_txt": None}
                 for _ in range(layers)]
        return model(bi_inference=False, ar_txt_inference=True, ar_vision_inference=False,
                     timestep_txt=torch.tensor([0.0]), text_states=text,
                     encoder_attention_mask=torch.ones(1, TEXT_TOKENS, dtype=torch.int64),
                     vision_states=vision_states, mask_type="i2v", extra_kwargs={},
                     kv_cache=cache, cache_txt=True)

    def run_vision(latents, cond_frames, t, actions, frames, cache, *, store, rope_size, start):
        return model(bi_inference=False, ar_txt_inference=False, ar_vision_inference=True,
                     hidden_states=torch.cat([latents, cond_frames], dim=1), timestep=t,
                     timestep_r=None, mask_type="i2v", return_dict=False,
                     viewmats=w2c[None, frames], Ks=ks[None, frames], action=actions.float(),
                     kv_cache=cache, cache_vision=store, rope_temporal_size=rope_size,
                     start_rope_start_idx=start)

    with torch.no_grad():
        cache = text_cache()
        ctx = slice(0, CONTEXT_FRAMES)
        chunk = slice(CONTEXT_FRAMES, CONTEXT_FRAMES + CHUNK)
        context_t = torch.full((CONTEXT_FRAMES,), CONTEXT_TIMESTEP)
        history = run_vision(context, cond[:, :, ctx], context_t,
                         context_actions, ctx, cache, store=True, rope_size=CONTEXT_FRAMES,
                         start=0)
        no_history, with_history = [], []
        for g in range(2):
            t = torch.full((CHUNK,), int(timesteps[g]))
            # without history: RoPE frames 0..3, the chunk's own cameras and no condition
            no_history.append(run_vision(noisy[g:g + 1], cond[:, :, chunk], t, chunk_actions[g],
                                     chunk, cache, store=False, rope_size=CHUNK, start=0)[0])
            with_history.append(run_vision(noisy[g:g + 1], cond[:, :, chunk], t, chunk_actions[g],
                                       chunk, history, store=False,
                                       rope_size=CONTEXT_FRAMES + CHUNK, start=CONTEXT_FRAMES)[0])

    pose_w2c, pose_ks, pose_actions = official_pose_inputs(args.official_repo, POSE_STRING)
    tensors = {k: v.contiguous() for k, v in model.state_dict().items()}
    # our layout: [B, F, C, H, W]
    fixture = {
        "text_states": text, "vision_states": vision_states,
        "context": context.transpose(1, 2), "context_actions": context_actions,
        "noisy": noisy.transpose(1, 2), "sigma": timesteps.double().div(1000).float(),
        "chunk_actions": chunk_actions, "w2c": w2c, "intrinsics": ks,
        "velocity_no_history": torch.cat(no_history).transpose(1, 2),
        "velocity_with_history": torch.cat(with_history).transpose(1, 2),
        "pose_w2c": pose_w2c, "pose_intrinsics": pose_ks, "pose_actions": pose_actions,
    }
    tensors.update({f"fixture.{k}": v.contiguous() for k, v in fixture.items()})
    args.out.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, args.out.with_suffix(".safetensors"))
    card = {"source": "https://github.com/Tencent-Hunyuan/HY-WorldPlay", "commit": COMMIT,
            "generator": "studies/make_worldplay_fixture.py", "config": CONFIG,
            "latent_size": list(LATENT), "context_frames": CONTEXT_FRAMES, "chunk": CHUNK,
            "context_timestep": CONTEXT_TIMESTEP, "timesteps": timesteps.tolist(),
            "pose_string": POSE_STRING}
    args.out.with_suffix(".json").write_text(json.dumps(card, indent=2) + "\n")
    print(f"wrote {args.out.with_suffix('.safetensors')} "
          f"({args.out.with_suffix('.safetensors').stat().st_size / 1e6:.2f} MB)")


if __name__ == "__main__":
    main()
