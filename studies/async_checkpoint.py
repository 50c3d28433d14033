"""Iteration time with sharded checkpoints written synchronously or in the background.

    python -m studies.async_checkpoint [--nproc 2] [--steps 6] [--repeats 2] [--json PATH]

Runs the smoke preset at a model size whose checkpoint (current and old model, AdamW/Muon
state: about 350 MB at 2 ranks) takes over a second to write, under ``torchrun`` with a
checkpoint after every iteration, with ``train.async_checkpoint`` false and true in turn
(``--repeats`` times each, alternating, one CPU thread per rank). Each run prints how long its
loop took and how much of it the checkpoints held it up (``loop: ...`` in
:mod:`wc_fast.train`); reported per iteration and per checkpoint.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from studies.chaos import environment, write_report

SIZE = ("--model.dim", "384", "--model.depth", "8", "--model.heads", "8")
LOOP = re.compile(r"loop: (\d+) iterations in ([\d.]+) s, ([\d.]+) s of it held up by (\d+) "
                  r"checkpoint")


def run(out: Path, nproc: int, steps: int, asynchronous: bool) -> dict:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc-per-node={nproc}", "-m", "wc_fast.train", "--preset", "smoke",
               "--steps", str(steps), "--out", str(out), "--train.ckpt_every", "1",
               "--train.keep_last", "2", "--train.reader_gap_every", "0",
               "--train.async_checkpoint", str(asynchronous).lower(), *SIZE]
    done = subprocess.run(command, env=environment(), capture_output=True, text=True,
                          timeout=1800)
    found = LOOP.search(done.stdout.replace("\n", " "))
    if done.returncode != 0 or found is None:
        raise RuntimeError(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
    iterations, seconds, held, saves = (int(found[1]), float(found[2]), float(found[3]),
                                        int(found[4]))
    size = sum(f.stat().st_size for f in (out / f"step_{steps:08d}").iterdir())
    return {"async": asynchronous, "iteration_s": seconds / iterations,
            "held_per_checkpoint_s": held / saves, "loop_s": seconds, "checkpoints": saves,
            "checkpoint_mb": size / 1e6}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    out = args.out or Path(tempfile.mkdtemp(prefix="wc_fast_async_ckpt_"))
    runs = []
    for repeat in range(args.repeats):
        for asynchronous in (False, True):
            name = f"{'async' if asynchronous else 'sync'}_{repeat}"
            runs.append(run(out / name, args.nproc, args.steps, asynchronous))
            print(json.dumps(runs[-1]), flush=True)
    mean = {}
    for mode in (False, True):
        mine = [r for r in runs if r["async"] is mode]
        mean["async" if mode else "sync"] = {
            key: sum(r[key] for r in mine) / len(mine)
            for key in ("iteration_s", "held_per_checkpoint_s", "checkpoint_mb")}
    report = {"nproc": args.nproc, "steps": args.steps, "size": list(SIZE), "runs": runs,
              "mean": mean}
    write_report(report, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
