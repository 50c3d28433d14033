"""The WorldCompass study on the embedded world: Table 1 and Table 2 analogs.

    python -m studies.replicate [--seeds 3] [--ablation-seeds 1] [--rows recipe,recipe_sde:3,...]
                              [--jobs 1] [--out runs/replicate] [--doc docs/replication.md]

Each (row, seed) is one ``python -m wc_fast.train`` run of the ``cpu`` preset (in a
subprocess, as a user would run it; one at a time, or ``--jobs`` at a time on one thread
each), then an evaluation of its final model on the held-out sets (``--sequences`` x
``--clips``, evaluation estimator), the mean camera-motion
magnitude of the generated clips, the motion spread of its candidates
(``studies/motion_spread.py``) and its median wall time per iteration (from its
``metrics.jsonl``). The base model is evaluated the same way. A finished run's numbers are
kept in ``--cache`` (``studies/results/study/ROW_sSEED_cfg-*_*.json``, small files meant to
be committed), so an interrupted study resumes where it stopped, on this machine or another.
A file stores the row's resolved training configuration (``"config"``) beside its numbers, and
its name ends with an id of the evaluation's settings and shipped models: a (row, seed) reuses
the file of its evaluation whose stored config matches the row's today (measuring fields
aside), so changing a preset's default, an asset or the evaluation size starts that row afresh
instead of reusing stale numbers. A new file, and its run folder, is named by a hash of the
config (``cfg-*``). A stored config is read as a checkpoint's saved config is, a field added
since at its schema default: a field is added with a default that reproduces the behaviour
before it, so the rows trained without it keep their numbers.
Finally ``--doc`` is rewritten with both tables, the side-by-side timing of the updates in one
process (``--speed``, from ``studies/update_speed.py``) and, row by row, whether the paper's
ordering holds.

Two families of rows. ``recipe`` is the preset's defaults, the recipe that raises action
following here (docs/design.md section 4.3); Table 1 compares it with the base over
``--seeds`` training seeds. Its Table 2 ablations (WorldCompass Table 2): ``recipe_if_only``,
``recipe_vq_only``, ``recipe_sde`` (same-noise SDE exploration, DanceGRPO-style: one initial
noise per group and no exploration in camera motion), and ``recipe_sample`` (sample-level
rollouts) against ``recipe_3clips`` (clip-level), both over clips 1-3 because on clip 1 alone
there is no history to share and the two coincide. Then the GRPO family and World-R1's
recipe as one change each to the recipe (``recipe_flow_grpo``, ``recipe_flow_grpo_same``,
``recipe_flow_grpo_fast``, ``recipe_trajectory``, ``recipe_decoupled``, ``recipe_noise_warp``,
the same changes as the paper family's rows below; the GRPO rows explore by their SDE noise
alone, as exploration in camera motion is the NFT update's), and DanceGRPO at a lower learning
rate (``recipe_flow_grpo_same_lr1e-4``).

The second family is the paper's recipe (``full`` in ``studies/rows.yaml``), under which RL
does not raise action following on this world: ``full`` (clip-level rollouts, IF + VQ), ``sample``,
``if_only``, ``vq_only``, ``sde``; the GRPO family and World-R1's recipe on the same model:
``flow_grpo`` (Flow-GRPO, per-candidate noise), ``flow_grpo_same`` (one initial noise per
group, DanceGRPO), ``flow_grpo_fast`` (SDE in a window of 2 steps), ``trajectory`` (NFT with
World-R1's continuous trajectory reward), ``decoupled`` (NFT with 2 VQ-only iterations on
high-motion prompts in every 10), ``noise_warp`` (NFT from noise warped along the commanded
camera, strength 0.5), ``own_latents`` (each candidate's own motion latents in the update).
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
import yaml

from studies.motion_spread import measure as measure_spread
from wc_fast.cli import parse_run_args
from wc_fast.config import Config, from_dict, preset, to_dict
from wc_fast.eval import KINDS, SEED_SETS, EvalSettings, evaluate
from wc_fast.infra import checkpoint
from wc_fast.models.pretrained import BASE_MODELS, load_checkpoint_model
from wc_fast.rewards import load_estimator
from wc_fast.rewards.motion_spread import camera_motion
from wc_fast.rewards.weights import ASSETS

# the study's rows: each the cpu preset with the changes every row makes (``every_row``) and
# its own (``rows``) from studies/rows.yaml, as the ``--section.field VALUE`` arguments of
# wc_fast.train
ROWS_FILE = Path(__file__).resolve().parent / "rows.yaml"


def _argument(value: object) -> str:
    """A row's value as the command line takes it: floats exactly (repr), booleans as
    true/false, several values comma-separated."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (list, tuple)):
        return ",".join(_argument(v) for v in value)
    return repr(value) if isinstance(value, float) else str(value)


def row_args(changes: dict) -> list[str]:
    """``{section: {field: value}}`` -> ``["--section.field", "VALUE", ...]``."""
    return [arg for section, fields in changes.items() for field, value in fields.items()
            for arg in (f"--{section}.{field}", _argument(value))]


def load_rows(path: Path) -> dict[str, list[str]]:
    """Each row of a rows file as wc_fast.train arguments: ``every_row``'s changes, then the
    row's own (a row's value of a field replaces ``every_row``'s)."""
    study = yaml.safe_load(path.read_text())
    if not isinstance(study, dict) or set(study) != {"every_row", "rows"}:
        raise ValueError(f"{path}: expected the keys every_row and rows")
    rows = {}
    for name, changes in study["rows"].items():
        merged = {section: dict(fields) for section, fields in study["every_row"].items()}
        for section, fields in (changes or {}).items():
            merged.setdefault(section, {}).update(fields)
        rows[name] = row_args(merged)
    return rows


ROWS = load_rows(ROWS_FILE)
# the GRPO family and World-R1's recipe (issue 17): one change each to a family's full row
GRPO_TITLES = {"flow_grpo": "Flow-GRPO (per-candidate noise)",
               "flow_grpo_same": "Flow-GRPO, one noise per group (DanceGRPO)",
               "flow_grpo_fast": "Flow-GRPO-Fast (SDE window of 2 steps)",
               "trajectory": "World-R1 trajectory reward",
               "decoupled": "periodic VQ-only phases",
               "noise_warp": "noise warped along the camera"}
TABLE1_ROW = "recipe"
# the shipped models an evaluation reads (asset names in wc_fast/assets)
SCORED_ASSETS = ("base_model", "camera_eval", "camera_reward", "critic", "critic_eval")
# model-card fields added after the study began, with the value every cached score was made at:
# a base model's card that sets one otherwise gives its scores a new evaluation id
CARD_FIELDS_ADDED_OFF = {"history_window": 0}
# fields that only measure or report (they read the run, never change its weights): ignored
# when a cache file's stored training config is matched with a row's
MEASUREMENT_FIELDS = ("train.reader_gap_every", "train.wandb_project", "train.wandb_entity",
                      "train.wandb_group", "train.wandb_tags", "train.wandb_checkpoints")
# fields that name a file (or model folder) training reads: a cache file stores the sha256 of
# what each named, so a file retrained at the same path trains the row afresh
INPUT_FILE_FIELDS = ("reward.reader_checkpoint", "reward.critic_checkpoint")
# NFT against DanceGRPO with the same exploration in camera motion, per family: (NFT row, GRPO
# row's name in the family, what they share); "{}" is the family's full row
MATCHED_UPDATES = {"recipe": (("recipe_no_exploration", "flow_grpo_same",
                               ", both without exploration in motion"),
                              ("{}", "flow_grpo_same_explored",
                               ", both exploring through the actions"))}
# each family's full row, the prefix of its ablations' names, and its name in the doc (the
# first prefix a row starts with names its family)
FAMILIES = (("recipe_warp", "recipe_warp_", "warp recipe"), ("recipe", "recipe_", "default recipe"),
            ("full", "", "paper recipe"))
TITLES = {"base": "base model", "full": "paper recipe (clip-level, IF + VQ)",
          "sample": "paper recipe, sample-level rollouts",
          "if_only": "paper recipe, IF reward only", "vq_only": "paper recipe, VQ reward only",
          "sde": "paper recipe, same-noise SDE exploration",
          "own_latents": "paper recipe, each candidate's own latents in the update",
          "recipe": "the recipe without a KL (exploration through the actions; the default "
                    "until 2026-12-07)",
          "recipe_no_exploration": "default recipe, no exploration in camera motion",
          "recipe_no_pose_branch": "default recipe without the keys-to-motion branch",
          "recipe_if_only": "default recipe, IF reward only",
          "recipe_all_weights": "default recipe, every weight trained (lr 1e-4)",
          "recipe_if_action": "default recipe, IF credit only for fully right frames",
          "recipe_if_action_120its": "default recipe, IF credit only for fully right frames, "
                                     "120 iterations",
          "recipe_if_action_no_exploration": "default recipe, IF credit only for fully right "
                                             "frames, no exploration in camera motion",
          "recipe_render_reader": "default recipe, IF read by re-rendering the world",
          "recipe_kl": "the default recipe: a KL to the initial model (nft.kl_beta 0.1)",
          "recipe_kl_120its": "the default recipe, 120 iterations",
          "recipe_kl_agreement": "the default recipe, IF credited where the estimator and "
                                 "the camera fit agree",
          "recipe_kl_fit_reader": "the default recipe, IF read by the camera fit",
          "recipe_kl_generated_reader": "the default recipe, IF read by an estimator also "
                                        "trained on generated frames (white-box labels)",
          "recipe_kl_generated_reader_120its": "the default recipe, IF read by an estimator "
                                               "also trained on generated frames, 120 "
                                               "iterations",
          "recipe_kl_generated_ensemble_120its": "the default recipe, IF the mean of the "
                                                 "generated-frames estimator's and the camera "
                                                 "fit's, 120 iterations",
          "recipe_warp": "warp recipe: the default with the warp head's exploration instead "
                         "(the previous default)",
          "recipe_sde": "default recipe without exploration in motion, same-noise SDE "
                        "exploration",
          "recipe_warp_if_only": "warp recipe, IF reward only",
          "recipe_warp_vq_only": "warp recipe, VQ reward only",
          "recipe_warp_3clips": "warp recipe on clips 1-3",
          "recipe_warp_sample": "warp recipe on clips 1-3, sample-level rollouts"} | {
    f"{prefix}{name}": f"{family}, {title}" for _, prefix, family in FAMILIES
    for name, title in GRPO_TITLES.items()} | {
    f"recipe_{name}": f"default recipe without exploration in motion, {title}"
    for name, title in GRPO_TITLES.items() if name.startswith("flow_grpo")} | {
    "recipe_flow_grpo_same_lr1e-4": "default recipe without exploration in motion, DanceGRPO "
                                    "at lr 1e-4",
    "recipe_flow_grpo_same_explored": "default recipe, DanceGRPO with the same exploration "
                                      "through the actions"}


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


def evaluation_id(sequences: int, clips: int, *, seeds: str = "tuning", base: str = "tiny"
                  ) -> str:
    """8 hex digits naming everything a score depends on besides the trained weights: the
    evaluation's settings (on the seed set ``seeds``, a key of ``SEED_SETS``) and every
    shipped model it reads (the base ``base``, estimators, critics), so a new setting or a
    retrained asset never reuses an old score."""
    if seeds not in SEED_SETS:
        raise ValueError(f"seeds must be one of {list(SEED_SETS)}, got {seeds!r}")
    digest = hashlib.sha256(repr(EvalSettings.from_config(
        preset("cpu"), sequences=sequences, clips=clips, seed=SEED_SETS[seeds])).encode())
    for name in SCORED_ASSETS:
        path = BASE_MODELS[base] if name == "base_model" else ASSETS / f"{name}.safetensors"
        digest.update(path.read_bytes())
    digest.update(_card_changes(base))
    return digest.hexdigest()[:8]


def _card_changes(base: str) -> bytes:
    """The base's card fields of ``CARD_FIELDS_ADDED_OFF`` that differ from their value then
    (empty when none does, so the ids made before those fields existed stay)."""
    card = json.loads(BASE_MODELS[base].with_suffix(".json").read_text())["model"]
    changed = {k: card[k] for k, off in CARD_FIELDS_ADDED_OFF.items() if card.get(k, off) != off}
    return json.dumps(changed, sort_keys=True).encode() if changed else b""


def training_args(row: str, seed: int, steps: int | None, base: str = "tiny") -> list[str]:
    """The ``wc_fast.train`` arguments of one (row, seed) on the embedded base world model
    ``base`` (``--base``), without its output folder."""
    extra = ["--steps", str(steps)] if steps is not None else []
    if base != "tiny":
        extra += ["--base", base]
    return ["--train.seed", str(seed), "--train.eval_at_end", "false", *ROWS[row], *extra]


def resolved_config(row: str, seed: int, steps: int | None, base: str = "tiny") -> Config:
    """The training configuration of one (row, seed) on ``base`` as ``wc_fast.train`` resolves
    its arguments (:func:`training_args`)."""
    return parse_run_args("replicate", "", training_args(row, seed, steps, base),
                          with_base=True).config


def config_id(config: Config, base: str = "tiny") -> str:
    """8 hex digits of a resolved training configuration, naming the cache file and run folder
    of a row first trained under it; on a base other than ``tiny`` also of the base's shipped
    weights and card, as RL starts from them (retrained ones train a new run)."""
    digest = hashlib.sha256(json.dumps(to_dict(config), sort_keys=True).encode())
    if inputs := input_digests(config):
        digest.update(json.dumps(inputs, sort_keys=True).encode())
    if base != "tiny":
        digest.update(BASE_MODELS[base].read_bytes())
        digest.update(_card_changes(base))
    return digest.hexdigest()[:8]


def _file_digest(path: Path) -> str:
    """sha256 of a file, or of a folder's files (their relative names and bytes, in sorted
    order); ``"missing"`` for a path that is neither."""
    if path.is_file():
        files = [path]
    elif path.is_dir():
        files = sorted(f for f in path.rglob("*") if f.is_file())
    else:
        return "missing"
    digest = hashlib.sha256()
    for file in files:
        digest.update(str(file.relative_to(path) if file != path else "").encode())
        digest.update(file.read_bytes())
    return digest.hexdigest()


def input_digests(config: Config) -> dict[str, str]:
    """``{field: sha256}`` of each set :data:`INPUT_FILE_FIELDS` path of ``config`` (a file's
    bytes, a sidecar ``NAME.json`` of a ``NAME.safetensors`` included); empty when none is set,
    as for every row that reads only shipped assets."""
    inputs = {}
    for name in INPUT_FILE_FIELDS:
        section, key = name.split(".")
        value = getattr(getattr(config, section), key)
        if value:
            path = Path(value)
            inputs[name] = _file_digest(path)
            sidecar = path.with_suffix(".json")
            if path.suffix == ".safetensors" and path.is_file() and sidecar.is_file():
                inputs[name] += ":" + _file_digest(sidecar)
    return inputs


def _compared(config: Config) -> dict:
    """``config`` as a dict without its :data:`MEASUREMENT_FIELDS`."""
    data = to_dict(config)
    for path in MEASUREMENT_FIELDS:
        section, name = path.split(".")
        data[section].pop(name, None)
    return data


def same_training(stored: Config, current: Config) -> bool:
    """Whether a run trained under ``stored`` is one of ``current``: every field but the
    measuring ones equal."""
    return _compared(stored) == _compared(current)


def _cache_data(path: Path) -> dict:
    """The JSON object of the cache file ``path``; ``ValueError`` naming the file otherwise."""
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"{path}: not a readable cache file ({error})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def _config_of(path: Path, data: dict) -> Config | None:
    """The training configuration in ``data``, the JSON object of the cache file ``path``."""
    if "config" not in data:
        return None
    try:
        return from_dict(data["config"])
    except (ValueError, TypeError, AttributeError) as error:
        raise ValueError(f"{path}: its stored training config cannot be read: {error}") from None


def stored_config(path: Path) -> Config | None:
    """The training configuration stored in the cache file ``path`` (its ``"config"``), read as
    a checkpoint's saved config is (:func:`wc_fast.config.from_dict`: a moved or renamed field
    under its current name, a field added since at its schema default); None for a file that
    stores none (numbers of a configuration no current row has). A file that is not a JSON
    object, or a config this version cannot read, raises ``ValueError`` naming the file."""
    return _config_of(path, _cache_data(path))


def find_cached(cache: Path, name: str, tag: str, config: Config) -> Path | None:
    """The cache file in ``cache`` of ``name`` (``[BASE_]ROW_sSEED``) evaluated under ``tag``
    whose stored training config is ``config`` (:func:`same_training`) and whose stored input
    files (``"inputs"``, :func:`input_digests`; none when absent) are the ones ``config``
    names today; None when none is."""
    pattern = f"{glob.escape(name)}_cfg-*_{glob.escape(tag)}.json"
    inputs = input_digests(config)
    for path in sorted(cache.glob(pattern)):
        data = _cache_data(path)
        stored = _config_of(path, data)
        if (stored is not None and same_training(stored, config)
                and data.get("inputs", {}) == inputs):
            return path
    return None


def cache_file(cache: Path, name: str, tag: str, config: Config, base: str = "tiny") -> Path:
    """Where the numbers of ``name`` (``[BASE_]ROW_sSEED``) trained under ``config`` and
    evaluated under ``tag`` are kept: the cache file that stores that config, else a new one
    named by :func:`config_id`."""
    found = find_cached(cache, name, tag, config)
    return found or cache / f"{name}_cfg-{config_id(config, base)}_{tag}.json"


def run_name(path: Path, tag: str) -> str:
    """The run folder's name of the cache file ``path`` of ``tag``: its name without the tag."""
    return path.name.removesuffix(f"_{tag}.json")


def store_config(path: Path, config: Config) -> dict:
    """The result in ``path`` with ``config`` stored in it as its ``"config"``, and the sha256
    of each input file it names as its ``"inputs"`` (:func:`input_digests`) when it names any."""
    result = json.loads(path.read_text())
    result["config"] = to_dict(config)
    inputs = input_digests(config)
    if inputs:
        result["inputs"] = inputs
    path.write_text(json.dumps(result, indent=2) + "\n")
    return result


def parse_rows(text: str, default_seeds: Callable[[str], int]) -> dict[str, int]:
    """``ROW[:SEEDS],...`` -> {row: seeds}; a row without SEEDS gets ``default_seeds(row)``.
    Unknown rows, bad counts and an empty list raise ``ValueError`` naming ``--rows``."""
    rows = {}
    for entry in filter(None, text.split(",")):
        row, _, count = entry.partition(":")
        if row not in ROWS:
            raise ValueError(f"--rows: unknown row {row!r}; expected some of {list(ROWS)}")
        if count and not (count.isdigit() and int(count) >= 1):
            raise ValueError(f"--rows: {entry!r} should be ROW:SEEDS with SEEDS an integer >= 1")
        rows[row] = int(count) if count else default_seeds(row)
    if not rows:
        raise ValueError("--rows: expected at least one row")
    return rows


def row_steps(row: str, base: str = "tiny") -> int:
    """The number of iterations a row trains for by default."""
    return resolved_config(row, 0, None, base).train.steps


def run(row: str, seed: int, folder: Path, steps: int | None, threads: int | None = None,
        base: str = "tiny") -> Path:
    """Train one (row, seed) on ``base`` into ``folder`` unless its final checkpoint is there,
    with ``threads`` torch threads when given; returns the checkpoint."""
    args = [sys.executable, "-m", "wc_fast.train", "--out", str(folder),
            *training_args(row, seed, steps, base)]
    want = steps or row_steps(row, base)
    found = checkpoint.list_checkpoints(folder) if folder.is_dir() else []
    if not found or int(found[-1].name.split("_")[-1]) < want:
        start = time.perf_counter()
        # a run killed before its first checkpoint leaves rows in metrics.jsonl: start over
        resume = ["--resume"] if found else ["--overwrite"]
        folder.parent.mkdir(parents=True, exist_ok=True)
        with open(folder.with_suffix(".log"), "a") as log:
            env = None if threads is None else {**os.environ, "OMP_NUM_THREADS": str(threads)}
            subprocess.run(args + resume, check=True, stdout=log, stderr=subprocess.STDOUT,
                           env=env)
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


def _mean_sd(values: list[float], *, signed: bool = False) -> str:
    """``mean +/- sd`` of ``values`` (the value alone for one), 3 decimals."""
    fmt = "+.3f" if signed else ".3f"
    if len(values) == 1:
        return f"{values[0]:{fmt}}"
    return f"{statistics.mean(values):{fmt}} +/- {statistics.stdev(values):.3f}"


def _table1(base: dict, trained: list[dict]) -> list[str]:
    """Accuracy per set and horizon, then VQ per set: base, trained and the paired change."""
    seeds = f"{len(trained)} seed{'' if len(trained) == 1 else 's'}"
    lines = [f"## Table 1 analog: base vs trained (`{TABLE1_ROW}`, {seeds})", "",
             "| set | horizon | base | trained | change |", "|---|---|---|---|---|"]

    def cells(f) -> str:
        if not trained:
            return "- | -"
        return (f"{_mean_sd([f(r) for r in trained])} | "
                f"{_mean_sd([f(r) - f(base) for r in trained], signed=True)}")

    for kind in KINDS:
        for horizon in ("short", "medium", "long", "accuracy"):
            if horizon != "accuracy" and horizon not in base["eval"][kind]:
                continue  # too few clips for this horizon
            name = "all" if horizon == "accuracy" else horizon

            def value(r, kind=kind, horizon=horizon):
                block = r["eval"][kind]
                return block[horizon] if horizon == "accuracy" else block[horizon]["accuracy"]

            lines.append(f"| {kind} | {name} | {value(base):.3f} | {cells(value)} |")
    lines += ["", "| VQ (critic) | base | trained | change |", "|---|---|---|---|"]
    for kind in KINDS:
        def vq(r, kind=kind):
            return r["eval"][kind]["vq"]
        lines.append(f"| {kind} | {vq(base):.3f} | {cells(vq)} |")
    return lines


def _table2(results: dict) -> list[str]:
    """One line per row run: accuracies, VQ, motion, motion spread, seconds per iteration."""
    lines = ["| row | seeds | two-key acc | composite acc | basic acc | VQ (basic / two-key) "
             "| motion (steps/frame) | motion spread (basic / two-key) | s / iteration (x full) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for row, runs in results.items():
        nft_seconds = [r["seconds"] for r in results.get(family_full(row), []) if "seconds" in r]
        def col(f, runs=runs):
            return _mean_sd([f(r) for r in runs])
        lines.append(
            f"| {TITLES[row]} | {len(runs)} "
            f"| {col(lambda r: r['eval']['composite_2key']['accuracy'])} "
            f"| {col(lambda r: r['eval']['composite']['accuracy'])} "
            f"| {col(lambda r: r['eval']['basic']['accuracy'])} "
            f"| {col(lambda r: r['eval']['basic']['vq'])} / "
            f"{col(lambda r: r['eval']['composite_2key']['vq'])} | {col(lambda r: r['motion'])} "
            f"| {col(lambda r: r['spread']['basic'])} / "
            f"{col(lambda r: r['spread']['composite_2key'])} | {_speed(runs, nft_seconds)} |")
    return lines


def _speed_table(speed: dict) -> list[str]:
    """The rows of ``studies/update_speed.py``'s JSON, timed side by side in one process."""
    rows = speed["rows"]
    first = TITLES[next(iter(rows))]
    lines = ["## Wall time per iteration, side by side in one process", "",
             f"`{speed['command']}`: each row's trainer from the same base weights, one "
             f"iteration each in turn for {speed['rounds']} rounds ({speed['threads']} threads, "
             "otherwise idle machine); medians over the rounds, and the ratio to "
             f"{first}.", "",
             "| row | s / iteration | rollout | reward | train | x first row |",
             "|---|---|---|---|---|---|"]
    for row, r in rows.items():
        lines.append(f"| {TITLES[row]} | {r['total']:.2f} | {r['rollout']:.2f} "
                     f"| {r['reward']:.2f} | {r['train']:.2f} | {r['ratio']:.2f} |")
    return lines


# Sections of the doc measured by their own commands (each names it), kept on regeneration.
KEPT_SECTIONS = ("## The base model under distance-to-truth measures",
                 "## Reserved evaluation seeds",
                 "## The recipe on a second backbone: the embedded Wan world model",
                 "## The default recipe on the final evaluation seeds",
                 "## Table 2 on the final evaluation seeds")


def kept_sections(doc: Path) -> list[str]:
    """The lines of the sections of ``doc`` headed by one of :data:`KEPT_SECTIONS`."""
    if not doc.is_file():
        return []
    kept, keep = [], False
    for line in doc.read_text().splitlines():
        if line.startswith("## "):
            keep = line.strip() in KEPT_SECTIONS
        if keep:
            kept.append(line)
    return kept


def write_doc(doc: Path, results: dict, command: str, settings: dict,
              speed: dict | None = None) -> None:
    kept = kept_sections(doc)
    lines = ["# Replicating WorldCompass Tables 1 and 2 on the embedded world", "",
             f"Regenerate with `{command}` (each (row, seed) one `wc_fast.train` run and its "
             "evaluation; every number below comes from that command). Evaluation: "
             f"{settings['sequences']} held-out sequences x {settings['clips']} clips per set, "
             "evaluation estimator, accuracy = fraction of frames whose translation and "
             "rotation labels both match the command; VQ = the evaluation critic's mean score "
             "over the generated frames. Mean +/- standard deviation over the training seeds "
             "where a row has several; a change is trained minus base on the same held-out "
             "set.", ""]
    lines += _table1(results["base"][0], results.get(TABLE1_ROW, []))
    lines += ["", "## Table 2 analog: ablations", ""]
    lines += _table2(results)
    lines += ["", "s / iteration: the median over a run's iterations of rollout + reward + train "
              "seconds (its `metrics.jsonl`), and its ratio to its family's full NFT row's "
              "(`recipe`, `recipe_warp` or the paper recipe's `full`); comparable only "
              "between runs made on an otherwise idle machine (runs trained beside another "
              "keep their time as `seconds_parallel` in their cache file, and are left out "
              "of this column).", ""]
    if speed is not None:
        lines += [*_speed_table(speed), ""]
    lines += ["## Does the paper's ordering hold?", ""]
    lines += orderings(results)
    if kept:
        lines += ["", *kept]
    doc.write_text("\n".join(lines).rstrip("\n") + "\n")


def family_full(row: str) -> str | None:
    """The full NFT row of ``row``'s family (``recipe`` or ``full``); None for the base."""
    if row == "base":
        return None
    return next(full for full, prefix, _ in FAMILIES if row == full or row.startswith(prefix))


def _speed(runs: list[dict], nft_seconds: list[float]) -> str:
    """Mean seconds per iteration of a row's runs, and its ratio to its family's full row's."""
    seconds = [r["seconds"] for r in runs if "seconds" in r]
    if not seconds:
        return "-"
    mean = statistics.mean(seconds)
    ratio = f" ({mean / statistics.mean(nft_seconds):.2f}x)" if nft_seconds else ""
    return f"{mean:.2f}{ratio}"


def two_key(r: dict) -> float:
    return r["eval"]["composite_2key"]["accuracy"]


def orderings(results: dict) -> list[str]:
    """The paper's Table 2 claims, checked within each family whose rows were run."""
    def mean(row, f):
        return statistics.mean(f(r) for r in results[row])

    def basic_vq(r):
        return r["eval"]["basic"]["vq"]

    checks = []
    base = mean("base", two_key)
    for full, prefix, family_name in FAMILIES:
        name = f"{prefix}{{}}"
        family = f" ({family_name})"
        sample = name.format("sample")
        if sample in results:
            ok = mean(sample, two_key) <= base + 0.02
            checks.append(("sample-level rollouts are no better than the base (two-key "
                           "accuracy within 0.02)" + family, ok))
        if full not in results:
            continue
        if name.format("if_only") in results:
            ok = mean(name.format("if_only"), basic_vq) < mean(full, basic_vq)
            checks.append(("IF-only training ends with lower VQ than full training" + family, ok))
        if name.format("vq_only") in results:
            ok = mean(name.format("vq_only"), lambda r: r["motion"]) < mean("base",
                                                                             lambda r: r["motion"])
            checks.append(("VQ-only training moves the camera less than the base" + family, ok))
        if name.format("sde") in results:
            ok = mean(name.format("sde"), two_key) - base < mean(full, two_key) - base
            checks.append(("same-noise SDE exploration gains less two-key accuracy than full"
                           + family, ok))
        for nft, grpo, matched in MATCHED_UPDATES.get(full, ((full, "flow_grpo_same", ""),)):
            nft, grpo = nft.format(full), name.format(grpo)
            if nft in results and grpo in results:
                ok = mean(nft, two_key) > mean(grpo, two_key)
                checks.append(("NFT ends with higher two-key accuracy than DanceGRPO-style GRPO"
                               + matched + family, ok))
    return [f"- {text}: **{'yes' if ok else 'no'}**" for text, ok in checks] or [
        "- (no ablation rows run)"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=3,
                        help=f"training seeds of Table 1's row ({TABLE1_ROW})")
    parser.add_argument("--ablation-seeds", type=int, default=1)
    parser.add_argument("--rows", default=",".join(ROWS),
                        help="ROW or ROW:SEEDS, comma-separated; SEEDS overrides --seeds or "
                             "--ablation-seeds for that row")
    parser.add_argument("--steps", type=int, default=None, help="RL iterations per run")
    parser.add_argument("--sequences", type=int, default=64)
    parser.add_argument("--clips", type=int, default=6)
    parser.add_argument("--out", default="runs/replicate", help="training runs (checkpoints)")
    parser.add_argument("--cache", default="studies/results/study",
                        help="each finished (row, seed)'s numbers, small JSON files to commit")
    parser.add_argument("--jobs", type=int, default=1,
                        help="training runs at a time, one torch thread each when above 1 (on "
                             "the cpu preset two such runs train 1.25-1.5x as many iterations "
                             "per hour on 2 cores as one run on both); their times are kept as "
                             "seconds_parallel")
    parser.add_argument("--doc", default="docs/replication.md")
    parser.add_argument("--speed", default="studies/results/update_speed.json",
                        help="studies/update_speed.py's JSON, tabulated in --doc when present")
    args = parser.parse_args(argv)
    try:
        rows = parse_rows(args.rows, lambda row: args.seeds if row == TABLE1_ROW
                          else args.ablation_seeds)
    except ValueError as error:
        parser.error(str(error))
    if args.jobs < 1:
        parser.error(f"--jobs: expected an integer >= 1, got {args.jobs}")
    out, cache = Path(args.out), Path(args.cache)
    tag = f"{args.sequences}x{args.clips}_eval-{evaluation_id(args.sequences, args.clips)}"
    results = {"base": [cached(cache / f"base_{tag}.json",
                               lambda: score(None, args.sequences, args.clips))]}

    runs = []
    for row, seeds in rows.items():
        for seed in range(seeds):
            config = resolved_config(row, seed, args.steps)
            runs.append((row, seed, config, cache_file(cache, f"{row}_s{seed}", tag, config)))
    parallel = set()
    if args.jobs > 1:
        # train every uncached run first, ``--jobs`` at a time; scoring then runs one by one
        parallel = {path for *_, path in runs if not path.is_file()}
        with ThreadPoolExecutor(args.jobs) as pool:
            list(pool.map(lambda r: run(r[0], r[1], out / run_name(r[3], tag), args.steps,
                                        threads=1),
                          [r for r in runs if r[3] in parallel]))

    def train_and_score(row: str, seed: int, config: Config, path: Path) -> dict:
        folder = out / run_name(path, tag)
        result = score(str(run(row, seed, folder, args.steps)), args.sequences, args.clips)
        key = "seconds_parallel" if path in parallel else "seconds"
        return dict(result, **{key: iteration_seconds(folder)}, config=to_dict(config))

    for row in rows:
        results[row] = []
    for row, seed, config, path in runs:
        results[row].append(cached(path, lambda row=row, seed=seed, config=config, path=path:
                                   train_and_score(row, seed, config, path)))
    command = "python -m studies.replicate " + " ".join(argv if argv is not None else sys.argv[1:])
    speed = Path(args.speed)
    write_doc(Path(args.doc), results, command.strip(),
              {"sequences": args.sequences, "clips": args.clips},
              json.loads(speed.read_text()) if speed.is_file() else None)
    print(f"wrote {args.doc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
