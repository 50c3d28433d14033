"""Kill a training run at random moments and resume it; its final weights must not change.

    python bench/chaos.py [--kills 10] [--steps 30] [--seed 0] [--out DIR]

Runs ``python -m wc_fast.train`` on the smoke preset (a checkpoint every iteration, so kills
land inside checkpoint writes as well as inside iterations) once without interruption, then
again under SIGKILL at a random moment after each start, resuming with ``--resume`` until the
run completes and at least ``--kills`` kills have landed. Prints the kills, how many runs had
to fall back past a damaged or partial checkpoint, and whether the final weights equal the
uninterrupted run's bit for bit; exits 1 if they do not.
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import load_file

from wc_fast import checkpoint

ROOT = Path(__file__).resolve().parents[1]


def train_command(out: Path, steps: int, resume: bool) -> list[str]:
    return [sys.executable, "-m", "wc_fast.train", "--preset", "smoke", "--steps", str(steps),
            "--out", str(out), "--train.ckpt_every", "1", "--train.keep_last", "2",
            *(["--resume"] if resume else [])]


def environment() -> dict[str, str]:
    """One CPU thread: a resumed run equals the uninterrupted one only at the same thread
    count (reductions split differently across threads). The caller's PYTHONPATH stays, after
    the repository root: without an install it is what provides wc_kernels."""
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": path}


def final_weights(out: Path) -> dict[str, torch.Tensor]:
    return load_file(checkpoint.latest(out) / "model.safetensors")


def run_with_kills(out: Path, steps: int, kills: int, rng: random.Random,
                   window: tuple[float, float]) -> tuple[int, int]:
    """Start, kill at a random moment in ``window`` seconds, resume; until the run ends and
    ``kills`` kills have landed. Returns (kills landed, damaged checkpoints skipped on resume).
    """
    out.mkdir(parents=True, exist_ok=True)
    landed = skipped = 0
    for attempt in range(kills + 100):
        log = out / f"attempt_{attempt:03d}.log"
        resume = bool(checkpoint.list_checkpoints(out))
        with log.open("w") as stderr:
            proc = subprocess.Popen(train_command(out, steps, resume), env=environment(),
                                    stdout=subprocess.DEVNULL, stderr=stderr)
            wait = rng.uniform(*window) if landed < kills else None
            try:
                proc.wait(timeout=wait)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                landed += 1
                print(f"kill {landed}: after {wait:.1f} s; checkpoints then: "
                      f"{[p.name for p in checkpoint.list_checkpoints(out)]}", flush=True)
        text = log.read_text()
        skipped += text.count("skipping damaged checkpoint")
        if proc.returncode == 0:
            if landed >= kills:
                return landed, skipped
        elif proc.returncode != -9:
            raise RuntimeError(f"run {attempt} failed ({proc.returncode}):\n{text[-3000:]}")
    raise RuntimeError(f"no complete run after {kills} kills")


def timed_reference(out: Path, steps: int) -> tuple[float, float]:
    """Run uninterrupted; returns (seconds until its first checkpoint, seconds per step)."""
    start = time.monotonic()
    proc = subprocess.Popen(train_command(out, steps, False), env=environment(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    first = None
    while proc.poll() is None:
        if first is None and checkpoint.list_checkpoints(out):
            first = time.monotonic() - start
        time.sleep(0.05)
    if proc.returncode != 0:
        raise RuntimeError(f"the uninterrupted run failed ({proc.returncode})")
    total = time.monotonic() - start
    first = first or total
    return first, (total - first) / max(steps - 1, 1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=10)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    out = args.out or Path(tempfile.mkdtemp(prefix="wc_fast_chaos_"))
    reference, chaotic = out / "uninterrupted", out / "killed"
    first, per_step = timed_reference(reference, args.steps)
    print(f"uninterrupted run: first checkpoint after {first:.1f} s, then {per_step:.2f} s "
          "per step", flush=True)
    # from start-up to about two steps past the first checkpoint: kills land in start-up,
    # iterations and checkpoint writes, and each resumed run advances only a few steps
    landed, skipped = run_with_kills(chaotic, args.steps, args.kills,
                                     random.Random(args.seed), (0.5, first + 2 * per_step))
    want, got = final_weights(reference), final_weights(chaotic)
    mismatched = [k for k in want if k not in got or not torch.equal(want[k], got[k])]
    print(f"kills survived: {landed}; damaged checkpoints skipped on resume: {skipped}; "
          f"tensors differing from the uninterrupted run: {len(mismatched)} of {len(want)}")
    return 1 if mismatched or want.keys() != got.keys() else 0


if __name__ == "__main__":
    sys.exit(main())
