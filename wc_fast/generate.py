"""``python -m wc_fast.generate``: play a world model. It writes the video a checkpoint (or a
shipped base model) generates for a key sequence you type, one entry per clip, with the pressed
keys drawn on every frame.

``--keys "forward+left, yaw_right, none"`` presses ``forward`` and ``left`` together for the
first clip, then turns right, then stands still; ``w a s d`` name the four movement keys. The
world prompt (the first frame) is the embedded world's scene drawn from ``--seed``. The clip
is sampled with the checkpoint's own sampler steps and shift unless ``--sampler-steps`` says
otherwise, and decoded to pixels by the checkpoint's codec (the VAE of a latent backbone).
``.gif`` needs nothing beyond the core install; ``.mp4`` (H.264) needs the ``video`` extra.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageDraw
from torch import Tensor

from wc_fast import config as config_lib
from wc_fast.actions import (
    ROTATION_PRIMITIVES,
    TRANSLATION_PRIMITIVES,
    action_id,
    bits_to_label,
    label_to_bits,
    split_action,
)
from wc_fast.cli import add_debug, run_main
from wc_fast.infra import checkpoint
from wc_fast.infra.extras import require
from wc_fast.infra.run_dir import check_writable_file
from wc_fast.infra.runtime import generator, resolve_device
from wc_fast.models import WorldModel
from wc_fast.models.pretrained import checkpoint_config, frame_codec, load_checkpoint_model
from wc_fast.rl.rollout import generate_history
from wc_fast.rl.sampler import ClipSampler
from wc_fast.world import sample_sequences

# single letters for the movement keys, as a keyboard has them
KEY_ALIASES = {"w": "forward", "s": "backward", "d": "right", "a": "left"}
STILL = ("none", "still")
FORMATS = (".mp4", ".gif")


def parse_keys(text: str) -> list[int]:
    """One action id per clip from ``"forward+left, yaw_right, none"`` (entries separated by
    commas or new lines, keys within an entry by ``+``); ``ValueError`` naming the entry for an
    unknown key or two keys that cannot be pressed together (``forward+backward``)."""
    entries = [e.strip() for e in text.replace("\n", ",").split(",") if e.strip()]
    if not entries:
        raise ValueError("--keys: expected at least one clip's keys, e.g. 'forward+left, "
                         "yaw_right'")
    ids = []
    for entry in entries:
        trans, rot = [False] * 4, [False] * 4
        for key in (k.strip().lower() for k in entry.split("+")):
            key = KEY_ALIASES.get(key, key)
            if key in STILL:
                continue
            if key in TRANSLATION_PRIMITIVES:
                trans[TRANSLATION_PRIMITIVES.index(key)] = True
            elif key in ROTATION_PRIMITIVES:
                rot[ROTATION_PRIMITIVES.index(key)] = True
            else:
                raise ValueError(f"--keys: unknown key {key!r} in {entry!r}; keys are "
                                 f"{TRANSLATION_PRIMITIVES + ROTATION_PRIMITIVES}, w a s d and "
                                 f"{STILL[0]}")
        labels = bits_to_label(torch.tensor([trans, rot]))
        if bool((labels < 0).any()):
            raise ValueError(f"--keys: {entry!r} presses keys that cannot go together (two "
                             "opposite directions, or more than two of one kind)")
        ids.append(int(action_id(labels[0], labels[1])))
    return ids


def key_text(action: int) -> str:
    """The keys an action id presses, as ``--keys`` takes them (``none`` for none)."""
    trans, rot = (label_to_bits(label) for label in split_action(torch.tensor(action)))
    names = [n for n, on in zip(TRANSLATION_PRIMITIVES, trans.tolist(), strict=True) if on]
    names += [n for n, on in zip(ROTATION_PRIMITIVES, rot.tolist(), strict=True) if on]
    return "+".join(names) or "none"


def _load(checkpoint_path: str | None, base: str, device: torch.device
          ) -> tuple[WorldModel, config_lib.ModelConfig, tuple[int, float]]:
    """The model, its config and its sampler's (steps, shift): a checkpoint's own, or the
    shipped base model's with the ``cpu`` preset's sampler."""
    model = load_checkpoint_model(checkpoint_path, device, base=base)
    cfg = None
    if checkpoint_path is not None and Path(checkpoint_path).is_dir():
        path = Path(checkpoint_path)
        cfg = checkpoint_config(path, checkpoint.read_meta(path))
    # a base model, or a pretraining run (no rollout section): the cpu preset's sampler
    rollout = getattr(cfg, "rollout", None) or config_lib.preset("cpu").rollout
    return model, model.cfg if cfg is None else cfg.model, (rollout.steps, rollout.shift)


def generate(model: WorldModel, model_cfg: config_lib.ModelConfig, actions: list[int], *,
             steps: int, shift: float, seed: int, device: torch.device) -> Tensor:
    """Pixel frames ``[1 + N*F, 3, H, W]`` in [-1, 1]: the world prompt drawn from ``seed``,
    then one clip of ``F`` frames per entry of ``actions`` (action ids, each held over its
    clip), sampled with the deterministic ODE sampler."""
    codec = frame_codec(model_cfg, device)
    prompt = sample_sequences(1, num_clips=1, seed=seed, clip_frames=model_cfg.clip_frames,
                              resolution=model_cfg.resolution).frames[:, :1]
    per_frame = torch.tensor(actions, device=device).repeat_interleave(model.clip_frames)
    sampler = ClipSampler(model, steps=steps, shift=shift, capture="eager")
    with torch.no_grad():
        frames, _, _ = generate_history(model, sampler, codec.encode(prompt.to(device)),
                                        per_frame, len(actions),
                                        generator(seed, "generate", device=device))
        pixels = codec.decode(frames)
    return pixels[0].float().cpu().clamp(-1, 1)


def annotate(frames: Tensor, actions: list[int], clip_frames: int, size: int
             ) -> list[Image.Image]:
    """RGB images of ``frames`` ``[T, 3, H, W]``, scaled up (nearest) so the shorter side is at
    least ``size`` pixels, each with its clip's keys written on it (``prompt`` on the first)."""
    height, width = frames.shape[-2:]
    scale = max(1, -(-size // min(height, width)))
    pixels = ((frames + 1) * 127.5).round().to(torch.uint8).permute(0, 2, 3, 1).numpy()
    images = []
    for t, array in enumerate(pixels):
        image = Image.fromarray(np.ascontiguousarray(array)).resize(
            (width * scale, height * scale), Image.Resampling.NEAREST)
        label = "prompt" if t == 0 else key_text(actions[(t - 1) // clip_frames])
        draw = ImageDraw.Draw(image)
        box = draw.textbbox((4, 4), label)
        draw.rectangle((box[0] - 2, box[1] - 2, box[2] + 2, box[3] + 2), fill=(0, 0, 0))
        draw.text((4, 4), label, fill=(255, 255, 255))
        images.append(image)
    return images


def write_video(images: list[Image.Image], path: Path, fps: int) -> Path:
    """``images`` as an H.264 MP4 (``.mp4``, the ``video`` extra) or a looping GIF."""
    if path.suffix == ".gif":
        images[0].save(path, save_all=True, append_images=images[1:], duration=1000 / fps,
                       loop=0)
        return path
    av = require("av", user="python -m wc_fast.generate --out *.mp4")
    with av.open(str(path), "w") as container:
        stream = container.add_stream("libx264", rate=fps)
        # H.264 in yuv420p needs even sides
        stream.width, stream.height = (images[0].width // 2 * 2, images[0].height // 2 * 2)
        stream.pix_fmt = "yuv420p"
        for image in images:
            frame = av.VideoFrame.from_image(image.crop((0, 0, stream.width, stream.height)))
            container.mux(stream.encode(frame))
        container.mux(stream.encode())
    return path


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m wc_fast.generate",
                                     description="Write a world model's video for the keys you "
                                                 "press, one entry per clip.")
    parser.add_argument("--checkpoint", default=None,
                        help="a training checkpoint directory (any backbone) or an exported "
                             ".safetensors; default: the shipped base model of --base")
    parser.add_argument("--base", choices=config_lib.BASES, default="tiny",
                        help="the shipped base world model without --checkpoint (default tiny)")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--keys", help="keys per clip, e.g. 'forward+left, yaw_right, none' "
                                       "(w a s d for the movement keys)")
    source.add_argument("--keys-file", help="a text file of keys, one clip per line")
    parser.add_argument("--out", required=True, help="the video to write: .mp4 or .gif")
    parser.add_argument("--seed", type=int, default=0,
                        help="the world prompt's scene and the sampler's noise (default 0)")
    parser.add_argument("--sampler-steps", type=int, default=None,
                        help="ODE sampler steps (default: the checkpoint's rollout.steps)")
    parser.add_argument("--fps", type=int, default=8, help="frames per second (default 8)")
    parser.add_argument("--size", type=int, default=256,
                        help="frames are scaled up until their shorter side is this many "
                             "pixels (default 256)")
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    add_debug(parser)
    args = parser.parse_args(argv)
    out = Path(args.out)
    if out.suffix not in FORMATS:
        parser.error(f"--out must end in one of {FORMATS}, got {args.out!r}")
    for flag, value in (("--sampler-steps", args.sampler_steps), ("--fps", args.fps),
                        ("--size", args.size)):
        if value is not None and value < 1:
            parser.error(f"{flag} must be >= 1, got {value}")
    text = args.keys if args.keys is not None else Path(args.keys_file).read_text()
    try:
        actions = parse_keys(text)
    except ValueError as exc:
        parser.error(str(exc))
    check_writable_file(out, "--out")
    device = resolve_device(args.device, "--device")
    model, model_cfg, (steps, shift) = _load(args.checkpoint, args.base, device)
    frames = generate(model.eval(), model_cfg, actions, steps=args.sampler_steps or steps,
                      shift=shift, seed=args.seed, device=device)
    images = annotate(frames, actions, model.clip_frames, args.size)
    write_video(images, out, args.fps)
    print(f"wrote {out}: {len(images)} frames ({len(actions)} clips), "
          f"{images[0].width} x {images[0].height}, {args.fps} fps")
    return 0


if __name__ == "__main__":
    sys.exit(run_main("python -m wc_fast.generate", main))
