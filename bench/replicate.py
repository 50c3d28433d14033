"""The WorldCompass study on the embedded world: Table 1 and Table 2 analogs.

    python bench/replicate.py [--seeds 3] [--rows full,sample,if_only,vq_only,sde,...]
                              [--out runs/replicate] [--doc docs/replication.md]

Each (row, seed) is one ``python -m wc_fast.train`` run of the ``cpu`` preset with the paper's
recipe (``PAPER_RECIPE``) and that row's change, or of the preset's own defaults for ``recipe``
(one at a time, in a subprocess, as a user would run it), then an evaluation of its
final model on the held-out sets (``--sequences`` x ``--clips``, evaluation estimator), the mean
camera-motion magnitude of the generated clips, the motion spread of its candidates
(``bench/motion_spread.py``) and its median wall time per iteration (from its
``metrics.jsonl``). The base model is evaluated the same way. A finished run's
numbers are kept in ``OUT/ROW_sSEED/study.json``, so an interrupted study resumes where it
stopped. Finally ``--doc`` is rewritten with both tables and, row by row, whether the paper's
ordering holds.

Rows (WorldCompass Table 2): ``full`` (clip-level rollouts, IF + VQ), ``sample`` (sample-level
rollouts), ``if_only``, ``vq_only``, ``sde`` (same-noise SDE exploration, DanceGRPO-style).
The GRPO family and World-R1's recipe on the same model: ``flow_grpo`` (Flow-GRPO,
per-candidate noise), ``flow_grpo_same`` (one initial noise per group, DanceGRPO),
``flow_grpo_fast`` (SDE in a window of 2 steps), ``trajectory`` (NFT with World-R1's continuous
trajectory reward), ``decoupled`` (NFT with 2 VQ-only iterations on high-motion prompts in every
10), ``noise_warp`` (NFT from noise warped along the commanded camera, strength 0.5).
``recipe``: the cpu preset's defaults, the recipe that raises action following here.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from motion_spread import measure as measure_spread  # noqa: E402

from wc_fast import checkpoint  # noqa: E402
from wc_fast.config import preset  # noqa: E402
from wc_fast.eval import KINDS, EvalSettings, evaluate  # noqa: E402
from wc_fast.models.pretrained import load_checkpoint_model  # noqa: E402
from wc_fast.rewards import load_estimator  # noqa: E402
from wc_fast.rewards.exploration import camera_motion  # noqa: E402

# the paper's recipe on the cpu preset (all weights, two groups of 8 per update over 3 clips of
# mixed commands, IF + VQ at lam 2/3, 300 iterations; the preset's defaults until it took the
# recipe of docs/design.md section 4.3): every row but ``recipe`` is this plus its change
PAPER_RECIPE = ["--model.pose_branch", "false", "--rollout.warp_exploration", "0",
                "--optim.trainable", "all", "--optim.lr", "3e-5",
                "--rollout.groups_per_rank", "2", "--rollout.num_clips", "3",
                "--rollout.composite_fraction", "0.5", "--reward.lam", str(2 / 3),
                "--ema.end", "0.8", "--nft.compile", "true", "--train.steps", "300"]
ROWS = {name: [*PAPER_RECIPE, *change] for name, change in {
    "full": [], "sample": ["--rollout.mode", "sample"], "if_only": ["--reward.kind", "if"],
    "vq_only": ["--reward.kind", "vq"], "sde": ["--rollout.exploration", "sde"],
    "own_latents": ["--nft.latent_pairing", "own"],
    "flow_grpo": ["--train.update", "flow_grpo"],
    "flow_grpo_same": ["--train.update", "flow_grpo", "--grpo.same_noise", "true"],
    "flow_grpo_fast": ["--train.update", "flow_grpo", "--grpo.window", "2"],
    "trajectory": ["--reward.if_kind", "trajectory"],
    "decoupled": ["--reward.decouple_every", "10", "--reward.decouple_length", "2"],
    "noise_warp": ["--rollout.noise_warp", "0.5"]}.items()}
ROWS["recipe"] = []  # the cpu preset's defaults
TITLES = {"base": "base model", "full": "full (clip-level, IF + VQ)",
          "sample": "sample-level rollouts", "if_only": "IF reward only",
          "vq_only": "VQ reward only", "sde": "same-noise SDE exploration",
          "own_latents": "full, each candidate's own latents in the update",
          "flow_grpo": "Flow-GRPO (per-candidate noise)",
          "flow_grpo_same": "Flow-GRPO, one noise per group (DanceGRPO)",
          "flow_grpo_fast": "Flow-GRPO-Fast (SDE window of 2 steps)",
          "trajectory": "full, World-R1 trajectory reward",
          "decoupled": "full, periodic VQ-only phases",
          "noise_warp": "full, noise warped along the camera",
          "recipe": "the default recipe (exploration in camera motion)"}


def score(model_path: str | None, sequences: int, clips: int) -> dict:
    """Eval sets, mean camera-motion magnitude of the generated clips, motion spread."""
    cfg = preset("cpu")
    model = load_checkpoint_model(model_path, torch.device("cpu"))
    settings = EvalSettings.from_config(cfg, sequences=sequences, clips=clips)
    estimator = load_estimator("eval")
    result = evaluate(model, settings, estimator=estimator, keep_frames=True)
    frames = result.pop("_frames")
    magnitudes = []
    for generated, _ in frames.values():
        with torch.no_grad():
            magnitudes.append(camera_motion(estimator(generated)).abs().sum(-1).mean())
    spread = measure_spread(model_path, groups=8)
    return {"eval": result, "motion": float(torch.stack(magnitudes).mean()),
            "spread": {k: spread[k]["motion_spread"] for k in ("basic", "composite_2key")}}


def row_steps(row: str) -> int:
    """The number of iterations a row trains for by default."""
    args = ROWS[row]
    if "--train.steps" in args:
        return int(args[args.index("--train.steps") + 1])
    return preset("cpu").train.steps


def run(row: str, seed: int, out: Path, steps: int | None) -> Path:
    """Train one (row, seed) unless its final checkpoint exists; returns the checkpoint."""
    folder = out / f"{row}_s{seed}"
    args = [sys.executable, "-m", "wc_fast.train", "--out", str(folder), "--train.seed",
            str(seed), "--train.eval_at_end", "false", *ROWS[row]]
    if steps is not None:
        args += ["--steps", str(steps)]
    want = steps or row_steps(row)
    found = checkpoint.list_checkpoints(folder) if folder.is_dir() else []
    if not found or int(found[-1].name.split("_")[-1]) < want:
        start = time.perf_counter()
        resume = ["--resume"] if found else []
        with open(folder.with_suffix(".log"), "a") as log:
            subprocess.run(args + resume, check=True, stdout=log, stderr=subprocess.STDOUT)
        print(f"{row} seed {seed}: trained in {(time.perf_counter() - start) / 60:.1f} min")
    return checkpoint.latest(folder)


def iteration_seconds(folder: Path) -> float:
    """Median wall time of one iteration (rollout + reward + train) of a run's metrics."""
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    return statistics.median(r["rollout_s"] + r["reward_s"] + r["train_s"] for r in rows)


def cached(path: Path, compute) -> dict:
    if path.is_file():
        return json.loads(path.read_text())
    value = compute()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value, indent=2) + "\n")
    return value


def _mean_sd(values: list[float]) -> str:
    if len(values) == 1:
        return f"{values[0]:.3f}"
    return f"{statistics.mean(values):.3f} +/- {statistics.stdev(values):.3f}"


def write_doc(doc: Path, results: dict, command: str, settings: dict) -> None:
    base = results["base"][0]
    lines = ["# Replicating WorldCompass Tables 1 and 2 on the embedded world", "",
             f"Regenerate with `{command}` (one run at a time on 2 CPU cores; every number "
             "below comes from that command). Evaluation: "
             f"{settings['sequences']} held-out sequences x {settings['clips']} clips per set, "
             "evaluation estimator, accuracy = fraction of frames whose translation and "
             "rotation labels both match the command. Mean +/- standard deviation over the "
             "training seeds where a row has several.", "",
             "## Table 1 analog: base vs trained (`full`)", "",
             "| set | horizon | base | trained |", "|---|---|---|---|"]
    trained = results.get("full", [])
    for kind in KINDS:
        for horizon in ("short", "medium", "long", "accuracy"):
            if horizon != "accuracy" and horizon not in base["eval"][kind]:
                continue  # too few clips for this horizon
            name = "all" if horizon == "accuracy" else horizon

            def value(r, kind=kind, horizon=horizon):
                block = r["eval"][kind]
                return block[horizon] if horizon == "accuracy" else block[horizon]["accuracy"]

            cells = _mean_sd([value(r) for r in trained]) if trained else "-"
            lines.append(f"| {kind} | {name} | {value(base):.3f} | {cells} |")
    lines += ["", "| VQ (critic) | base | trained |", "|---|---|---|"]
    for kind in KINDS:
        cells = _mean_sd([r["eval"][kind]["vq"] for r in trained]) if trained else "-"
        lines.append(f"| {kind} | {base['eval'][kind]['vq']:.3f} | {cells} |")
    lines += ["", "## Table 2 analog: ablations", "",
              "| row | seeds | two-key acc | composite acc | basic acc | VQ (basic) | motion "
              "(steps/frame) | motion spread (basic / two-key) | s / iteration (x full) |",
              "|---|---|---|---|---|---|---|---|---|"]
    nft_seconds = [r["seconds"] for r in results.get("full", []) if "seconds" in r]
    for row, runs in results.items():
        def col(f, runs=runs):
            return _mean_sd([f(r) for r in runs])
        two_key = col(lambda r: r["eval"]["composite_2key"]["accuracy"])
        lines.append(
            f"| {TITLES[row]} | {len(runs)} | {two_key} "
            f"| {col(lambda r: r['eval']['composite']['accuracy'])} "
            f"| {col(lambda r: r['eval']['basic']['accuracy'])} "
            f"| {col(lambda r: r['eval']['basic']['vq'])} | {col(lambda r: r['motion'])} "
            f"| {col(lambda r: r['spread']['basic'])} / "
            f"{col(lambda r: r['spread']['composite_2key'])} | {_speed(runs, nft_seconds)} |")
    lines += ["", "s / iteration: the median over a run's iterations of rollout + reward + train "
              "seconds (its `metrics.jsonl`), and its ratio to the `full` (NFT) row's; comparable "
              "only between runs made on an otherwise idle machine.",
              "", "## Does the paper's ordering hold?", ""]
    lines += orderings(results)
    doc.write_text("\n".join(lines) + "\n")


def _speed(runs: list[dict], nft_seconds: list[float]) -> str:
    """Mean seconds per iteration of a row's runs, and its ratio to the ``full`` (NFT) row's."""
    seconds = [r["seconds"] for r in runs if "seconds" in r]
    if not seconds:
        return "-"
    mean = statistics.mean(seconds)
    ratio = f" ({mean / statistics.mean(nft_seconds):.2f}x)" if nft_seconds else ""
    return f"{mean:.2f}{ratio}"


def orderings(results: dict) -> list[str]:
    def mean(row, f):
        return statistics.mean(f(r) for r in results[row])

    def two_key(r):
        return r["eval"]["composite_2key"]["accuracy"]

    checks = []
    base = results["base"]
    if "sample" in results:
        ok = mean("sample", two_key) <= mean("base", two_key) + 0.02
        checks.append(("sample-level rollouts are no better than the base (two-key accuracy "
                       "within 0.02)", ok))
    if "if_only" in results and "full" in results:
        ok = mean("if_only", lambda r: r["eval"]["basic"]["vq"]) < mean(
            "full", lambda r: r["eval"]["basic"]["vq"])
        checks.append(("IF-only training ends with lower VQ than full training", ok))
    if "vq_only" in results:
        ok = mean("vq_only", lambda r: r["motion"]) < base[0]["motion"]
        checks.append(("VQ-only training moves the camera less than the base", ok))
    if "sde" in results and "full" in results:
        gain = mean("sde", two_key) - mean("base", two_key)
        ok = gain < mean("full", two_key) - mean("base", two_key)
        checks.append(("same-noise SDE exploration gains less two-key accuracy than full", ok))
    if "flow_grpo_same" in results and "full" in results:
        ok = mean("full", two_key) > mean("flow_grpo_same", two_key)
        checks.append(("NFT ends with higher two-key accuracy than DanceGRPO-style GRPO", ok))
    return [f"- {text}: **{'yes' if ok else 'no'}**" for text, ok in checks] or [
        "- (no ablation rows run)"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=3, help="training seeds of the full row")
    parser.add_argument("--ablation-seeds", type=int, default=1)
    parser.add_argument("--rows", default=",".join(ROWS))
    parser.add_argument("--steps", type=int, default=None, help="RL iterations per run")
    parser.add_argument("--sequences", type=int, default=64)
    parser.add_argument("--clips", type=int, default=6)
    parser.add_argument("--out", default="runs/replicate")
    parser.add_argument("--doc", default="docs/replication.md")
    args = parser.parse_args(argv)
    rows = [r for r in args.rows.split(",") if r]
    unknown = set(rows) - set(ROWS)
    if unknown:
        parser.error(f"unknown rows {sorted(unknown)}; expected some of {list(ROWS)}")
    out = Path(args.out)
    tag = f"{args.sequences}x{args.clips}"
    results = {"base": [cached(out / f"base_{tag}.json",
                               lambda: score(None, args.sequences, args.clips))]}
    for row in rows:
        seeds = args.seeds if row == "full" else args.ablation_seeds
        results[row] = []
        for seed in range(seeds):
            ckpt = run(row, seed, out, args.steps)
            result = cached(out / f"{row}_s{seed}" / f"study_{tag}.json",
                            lambda ckpt=ckpt: score(str(ckpt), args.sequences, args.clips))
            result["seconds"] = iteration_seconds(out / f"{row}_s{seed}")
            results[row].append(result)
    command = "python bench/replicate.py " + " ".join(argv if argv is not None else sys.argv[1:])
    write_doc(Path(args.doc), results, command.strip(),
              {"sequences": args.sequences, "clips": args.clips})
    print(f"wrote {args.doc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
