"""Kill a training run at random moments and resume it; its final weights must not change.

    python -m studies.chaos [--kills 10] [--steps 30] [--seed 0] [--out DIR]
    python -m studies.chaos --nproc 2 [--kills 5] [--json PATH]

With ``--nproc N`` > 1 the jobs run under ``torchrun`` at N ranks instead
(:mod:`studies.chaos_cluster`: kills of one rank, one of them inside a checkpoint write,
torchrun restarting the job by itself, and a stalled rank).

Runs ``python -m wc_fast.train`` on the smoke preset (a checkpoint every iteration, so kills
land inside checkpoint writes as well as inside iterations) once without interruption, then
again under SIGKILL at a random moment after each start, resuming with ``--resume`` until the
run completes and at least ``--kills`` kills have landed. After every kill the last line of
``metrics.jsonl`` is torn (half a row appended, as a crash mid-append leaves it). Then a
concurrent writer: a second run started into the directory of a running (paused) one must be
refused (exit status 2, naming the holder) while the first completes untouched. Prints the
kills, how many runs had to fall back past a damaged or partial checkpoint, and whether the
final weights of both runs equal the uninterrupted run's bit for bit and their
``metrics.jsonl`` holds each step once; exits 1 if not.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from wc_fast.infra import checkpoint

ROOT = Path(__file__).resolve().parents[1]


# what a crash in the middle of appending a row leaves at the end of metrics.jsonl
TORN_ROW = '{"step": 99999, "clip": 1, "if_me'


def train_command(out: Path, steps: int, resume: bool) -> list[str]:
    """A smoke run into ``out``: resumed, or fresh (``--overwrite``: a run killed before its
    first checkpoint may have left rows in metrics.jsonl)."""
    return [sys.executable, "-m", "wc_fast.train", "--preset", "smoke", "--steps", str(steps),
            "--out", str(out), "--train.ckpt_every", "1", "--train.keep_last", "2",
            "--resume" if resume else "--overwrite"]


def environment() -> dict[str, str]:
    """One CPU thread: a resumed run equals the uninterrupted one only at the same thread
    count (reductions split differently across threads). The caller's PYTHONPATH stays, after
    the repository root: without an install it is what provides wc_kernels."""
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": path}


def final_weights(out: Path) -> dict[str, torch.Tensor]:
    return checkpoint.read_weights(checkpoint.latest(out), "model")


def logged_steps(out: Path) -> list[int]:
    """The steps of the rows of ``out``'s metrics.jsonl, in file order."""
    return [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]


def tear_log(out: Path) -> None:
    """Append half a row to ``out``'s metrics.jsonl (if the killed run had written one)."""
    metrics = out / "metrics.jsonl"
    if metrics.is_file():
        with metrics.open("a") as f:
            f.write(TORN_ROW)


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
            if wait is not None and proc.returncode == -9:  # not a run that ended before its kill
                landed += 1
                tear_log(out)
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


def concurrent_writer(out: Path, steps: int) -> str:
    """Start a run into ``out``; once it holds the directory's lock, start a second one into
    it (``--overwrite``: unlocked, it would delete the first run's checkpoints). The first is
    paused (SIGSTOP) meanwhile, so that the second finds it running however long its start-up
    takes. Returns the second one's error line; raises unless it was refused with status 2 and
    the first run completed."""
    first = subprocess.Popen(train_command(out, steps, False), env=environment(),
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    lock, deadline = out / "run.lock", time.monotonic() + 300
    while not (lock.is_file() and lock.read_text().strip()):
        if first.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the first run never locked {out}: {first.communicate()[1]}")
        time.sleep(0.05)
    first.send_signal(signal.SIGSTOP)
    try:
        second = subprocess.run(train_command(out, steps, False), env=environment(),
                                capture_output=True, text=True, timeout=300)
    finally:
        first.send_signal(signal.SIGCONT)
    err = first.communicate(timeout=600)[1]
    if first.returncode != 0:
        raise RuntimeError(f"the first run failed ({first.returncode}):\n{err[-3000:]}")
    refusal = second.stderr.strip().splitlines()[-1] if second.stderr.strip() else ""
    if second.returncode != 2 or f"in use by pid {first.pid}" not in refusal:
        raise RuntimeError(f"the second writer was not refused ({second.returncode}): "
                           f"{second.stderr[-3000:]}")
    return refusal


def wait_timed(proc: subprocess.Popen, out: Path, start: float) -> tuple[float, float]:
    """Wait for ``proc`` (started at monotonic time ``start``) while it writes checkpoints into
    ``out``; returns (seconds until the first checkpoint appeared, seconds in all). The first
    is the whole time when none appeared while it ran."""
    first = None
    while proc.poll() is None:
        if first is None and checkpoint.list_checkpoints(out):
            first = time.monotonic() - start
        time.sleep(0.05)
    total = time.monotonic() - start
    return first or total, total


def write_report(report: dict, path: Path | None) -> None:
    """Print ``report`` as JSON and, when ``path`` is given, write it there too."""
    text = json.dumps(report, indent=2)
    print(text)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text + "\n")


def timed_reference(out: Path, steps: int) -> tuple[float, float]:
    """Run uninterrupted; returns (seconds until its first checkpoint, seconds per step)."""
    start = time.monotonic()
    proc = subprocess.Popen(train_command(out, steps, False), env=environment(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    first, total = wait_timed(proc, out, start)
    if proc.returncode != 0:
        raise RuntimeError(f"the uninterrupted run failed ({proc.returncode})")
    return first, (total - first) / max(steps - 1, 1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=10)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--nproc", type=int, default=1,
                        help="ranks per job; above 1, jobs run under torchrun")
    parser.add_argument("--json", type=Path, default=None,
                        help="with --nproc > 1: write the report there")
    args = parser.parse_args(argv)
    out = args.out or Path(tempfile.mkdtemp(prefix="wc_fast_chaos_"))
    if args.nproc > 1:
        from studies.chaos_cluster import cluster_study
        report = cluster_study(out, args.steps, args.nproc, args.kills, args.seed,
                               environment())
        write_report(report, args.json)
        return 0 if report["ok"] else 1
    reference, chaotic = out / "uninterrupted", out / "killed"
    first, per_step = timed_reference(reference, args.steps)
    print(f"uninterrupted run: first checkpoint after {first:.1f} s, then {per_step:.2f} s "
          "per step", flush=True)
    # from start-up to about two steps past the first checkpoint: kills land in start-up,
    # iterations and checkpoint writes, and each resumed run advances only a few steps
    landed, skipped = run_with_kills(chaotic, args.steps, args.kills,
                                     random.Random(args.seed), (0.5, first + 2 * per_step))
    refusal = concurrent_writer(out / "concurrent", args.steps)
    print(f"second writer refused: {refusal}")
    want = final_weights(reference)
    failed = False
    for name, run in (("killed", chaotic), ("concurrent", out / "concurrent")):
        got = final_weights(run)
        mismatched = [k for k in want if k not in got or not torch.equal(want[k], got[k])]
        steps_ok = logged_steps(run) == list(range(1, args.steps + 1))
        print(f"{name} run: tensors differing from the uninterrupted run: {len(mismatched)} "
              f"of {len(want)}; metrics.jsonl holds each step once: {steps_ok}")
        failed |= bool(mismatched) or want.keys() != got.keys() or not steps_ok
    print(f"kills survived: {landed}; damaged checkpoints skipped on resume: {skipped}; "
          f"torn metrics.jsonl lines survived: {landed}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
