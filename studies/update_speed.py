"""Seconds per RL iteration of several study rows, timed side by side in one process.

    python -m studies.update_speed --rows recipe,recipe_flow_grpo_same,recipe_flow_grpo_fast \
        --json studies/results/update_speed.json

Each row of ``studies/replicate.py`` (its ``wc_fast.train`` arguments on the cpu preset) gets a
trainer from the same base weights. After one untimed warm-up iteration each (compilation,
first-call overheads), the rows take turns, one iteration each per round, at the same step, so
a shared machine's drift in speed lands on every row alike; the rounds walk through the clip
indices. Prints and writes each row's median seconds per iteration (rollout + reward + train,
and each phase) and its ratio to the first row's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch
from tqdm import tqdm

from studies.replicate import ROWS, training_args
from wc_fast.cli import parse_run_args
from wc_fast.models.pretrained import initial_model
from wc_fast.rl.trainer import Trainer

PHASES = ("rollout", "reward", "train")


def time_rows(rows: list[str], rounds: int, seed: int = 0) -> dict[str, dict[str, float]]:
    """Median seconds per phase and in all of each row's ``rounds`` timed iterations."""
    device = torch.device("cpu")
    trainers = {}
    for row in rows:
        cfg = parse_run_args("update_speed", "", training_args(row, seed, None),
                             with_base=True).config
        trainers[row] = Trainer(cfg, initial_model(cfg, device), device)
    for trainer in trainers.values():
        trainer.iteration(0)
    times: dict[str, list[dict[str, float]]] = {row: [] for row in rows}
    for step in tqdm(range(1, rounds + 1), desc="rounds"):
        for row, trainer in trainers.items():
            times[row].append(trainer.iteration(step).times)
    return {row: {"total": statistics.median(sum(t[p] for p in PHASES) for t in runs),
                  **{p: statistics.median(t[p] for t in runs) for p in PHASES}}
            for row, runs in times.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="recipe,recipe_flow_grpo_same,recipe_flow_grpo,"
                                          "recipe_flow_grpo_fast",
                        help="comma-separated rows of studies/replicate.py; the first is the "
                             "baseline of the ratios")
    parser.add_argument("--rounds", type=int, default=6,
                        help="timed iterations per row (6 covers the cpu preset's clip indices)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", default=None, help="write the results here")
    args = parser.parse_args(argv)
    rows = [r for r in args.rows.split(",") if r]
    unknown = [r for r in rows if r not in ROWS]
    if not rows or unknown:
        parser.error(f"--rows: expected some of {list(ROWS)}, got {args.rows!r}")
    if args.rounds < 1:
        parser.error(f"--rounds: expected an integer >= 1, got {args.rounds}")
    torch.set_num_threads(args.threads)
    result = time_rows(rows, args.rounds)
    base = result[rows[0]]["total"]
    print(f"{'row':<32}{'s/it':>8}{'rollout':>9}{'reward':>8}{'train':>8}{'ratio':>7}")
    for row, r in result.items():
        r["ratio"] = r["total"] / base
        print(f"{row:<32}{r['total']:>8.2f}{r['rollout']:>9.2f}{r['reward']:>8.2f}"
              f"{r['train']:>8.2f}{r['ratio']:>7.2f}")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        command = "python -m studies.update_speed " + " ".join(
            argv if argv is not None else sys.argv[1:])
        Path(args.json).write_text(json.dumps({"command": command.strip(), "rounds": args.rounds,
                                               "threads": args.threads, "rows": result},
                                              indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
