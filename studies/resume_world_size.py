"""Resume a run at another world size; how far its weights land from the uninterrupted run's.

    python -m studies.resume_world_size [--steps 6] [--at 3] [--groups 4] [--json PATH]

Runs the smoke preset (``--groups`` groups per iteration in all, one CPU thread per rank)
uninterrupted at 1, 2 and 4 ranks under ``torchrun``, then resumes copies of those runs
stopped after step ``--at`` at another world size (2 -> 1, 1 -> 2, 1 -> 4, 4 -> 2). Reports, per
case, the largest absolute difference of any weight from the uninterrupted run at the saved
world size and the number of tensors that differ at all; and the same between the
uninterrupted runs of different world sizes (the part that is floating-point sum order alone).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from studies.chaos import environment, write_report
from wc_fast.infra import checkpoint

WORLDS = (1, 2, 4)
CASES = ((2, 1), (1, 2), (1, 4), (4, 2))


def job(out: Path, world: int, steps: int, groups: int, resume: bool) -> None:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc-per-node={world}", "-m", "wc_fast.train", "--preset", "smoke",
               "--steps", str(steps), "--out", str(out), "--train.ckpt_every", "1",
               "--train.keep_last", str(steps), "--train.reader_gap_every", "0",
               "--rollout.groups_per_rank", str(groups // world),
               *(["--resume"] if resume else [])]
    done = subprocess.run(command, env=environment(), capture_output=True, text=True,
                          timeout=1800)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")


def weights(out: Path) -> dict[str, torch.Tensor]:
    return checkpoint.read_weights(checkpoint.latest(out), "model")


def difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> dict:
    return {"max_abs": max(float((a[k] - b[k]).abs().max()) for k in a),
            "differing_tensors": sum(not torch.equal(a[k], b[k]) for k in a),
            "tensors": len(a)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--at", type=int, default=3)
    parser.add_argument("--groups", type=int, default=4)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    out = args.out or Path(tempfile.mkdtemp(prefix="wc_fast_world_size_"))
    for world in WORLDS:
        job(out / f"world{world}", world, args.steps, args.groups, resume=False)
    report = {"steps": args.steps, "resumed_after": args.at, "groups": args.groups,
              "uninterrupted": {}, "resumed": {}}
    for a, b in ((1, 2), (1, 4), (2, 4)):
        report["uninterrupted"][f"{a} vs {b}"] = difference(weights(out / f"world{a}"),
                                                            weights(out / f"world{b}"))
    for saved, resumed in CASES:
        copy = out / f"world{saved}_to_{resumed}"
        shutil.copytree(out / f"world{saved}", copy)
        for path in checkpoint.list_checkpoints(copy):
            if int(path.name.removeprefix(checkpoint.PREFIX)) > args.at:
                shutil.rmtree(path)
        job(copy, resumed, args.steps, args.groups, resume=True)
        report["resumed"][f"{saved} -> {resumed}"] = difference(
            weights(out / f"world{saved}"), weights(copy))
    write_report(report, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
