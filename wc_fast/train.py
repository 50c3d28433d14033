"""``python -m wc_fast.train``: WorldCompass RL post-training (the main job).

On a CPU machine the default preset (``cpu``) post-trains the shipped embedded world model in
minutes; under ``torchrun`` groups are split across ranks (gloo on CPU, NCCL on GPU). Writes
``metrics.jsonl``, ``rewards.png``, checkpoints and, at the end, a base-vs-trained evaluation
table, ``summary.json`` and a rollout grid into ``--out``, which it checks and locks
(:mod:`wc_fast.infra.run_dir`) before any setup.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from rich.console import Console
from tqdm import tqdm

from wc_fast import config as config_lib
from wc_fast.cli import RunArgs, config_yaml, parse_run_args, run_main
from wc_fast.infra import checkpoint, elastic
from wc_fast.infra.distributed import DistInfo, init_from_env, optimizer_state, shutdown
from wc_fast.infra.metrics import (
    MetricsLog,
    TensorBoardLog,
    Tracker,
    WandbLog,
    matmul_flops,
    plot_rewards,
)
from wc_fast.infra.preemption import EXIT_PREEMPTED, StopRequest
from wc_fast.infra.rank_layout import FIELD as GROUPS_PER_RANK
from wc_fast.infra.rank_layout import follow_world_size, global_batch
from wc_fast.infra.run_dir import RunLock, check_writable_dir, claim
from wc_fast.infra.runtime import resolve_device
from wc_fast.infra.sharded_checkpoint import ShardedWriter
from wc_fast.infra.telemetry import GpuTelemetry
from wc_fast.infra.watchdog import Watchdog
from wc_fast.models import WorldModel
from wc_fast.models.pretrained import frame_codec, initial_model
from wc_fast.rl.trainer import NumericalFaultError, Trainer

# fields that may differ between an interrupted run and its resumption (train.steps: a resumed
# run may be extended, see _schedule_steps), and the sections a checkpoint written by an
# earlier version may hold that the RL run never read
RESUMABLE_CHANGES = ("train.out", "train.ckpt_every", "train.keep_last",
                     "train.reader_gap_every", "train.collective_timeout_s",
                     "train.async_checkpoint",
                     "train.eval_at_end", "train.device", "train.eval_sequences",
                     "train.eval_clips", "train.steps", "train.max_bad_updates",
                     "train.max_update_ratio",
                     "train.loggers", "train.wandb_project", "train.wandb_entity",
                     "train.wandb_group", "train.wandb_tags", "train.wandb_checkpoints",
                     "rollout.capture", "update.micro_batch",
                     "model.activation_checkpointing", *config_lib.RETIRED_SECTIONS,
                     # may follow the world size; the global batch is checked instead
                     GROUPS_PER_RANK)


def trainer_spread(row: dict) -> list[float]:
    """The motion spreads of a metrics row (basic, then composite groups, where present)."""
    return [row[k] for k in ("motion_spread_basic", "motion_spread_composite") if k in row]


def _row(stats, peak: float, telemetry: GpuTelemetry) -> dict:
    train_s = stats.times.get("train", 0.0)
    row = {"step": stats.step, "clip": stats.clip_index, "if_mean": stats.if_mean,
           "vq_mean": stats.vq_mean, "r_std": stats.r_std, "loss": stats.loss,
           "skipped_groups": stats.skipped_groups, "skipped_updates": stats.skipped_updates,
           "ema_decay": stats.ema_decay, "decoupled": int(stats.decoupled),
           **{f"{k}_s": v for k, v in stats.times.items()}, "clips_per_s": stats.clips_per_s,
           "train_tflops": stats.train_flops / max(train_s, 1e-9) / 1e12,
           "mfu": stats.train_flops / max(train_s, 1e-9) / peak,
           **{f"motion_spread_{k}": v for k, v in stats.motion_spread.items()}}
    if stats.kl is not None:
        row["kl"] = stats.kl
    if stats.reader_gap is not None:
        row["reader_gap"] = stats.reader_gap
    row.update(telemetry.read())
    return row


def _save(trainer: Trainer, cfg: config_lib.Config, step: int, info: DistInfo,
          tracking: dict, run_id: str | None, writer: ShardedWriter | None) -> Path:
    """Checkpoint ``step`` of run ``run_id`` (its lineage), with the trackers' resume state
    ``tracking``: sharded by every rank through the ``writer`` in a multi-rank run, else one
    file per model. Returns its path (on every rank)."""
    state = {"schedule_steps": trainer.schedule_steps, **tracking}
    common = {"config": config_lib.to_dict(cfg), "keep_last": cfg.train.keep_last,
              "base": trainer.frozen_base, "run_id": run_id, "world_size": info.world_size}
    if writer is not None:
        return writer.save(step, models={"model": trainer.model, "old": trainer.old},
                           optimizers=(trainer.model, trainer.optimizers),
                           keys=trainer.trained if trainer.partial else None, state=state,
                           **common)
    state["optimizers"] = optimizer_state(trainer.model, trainer.optimizers)
    return checkpoint.save(cfg.train.out, step, models=trainer.checkpoint_weights(),
                           state=state, **common)


def _schedule_steps(ckpt: checkpoint.Checkpoint, cfg: config_lib.Config) -> int:
    """The EMA decay schedule's length for a resumed run: the checkpointed run's, also when
    ``--steps`` now asks for more (or fewer) iterations, with a warning saying so."""
    before = int(ckpt.config["train"]["steps"])
    length = int(ckpt.state.get("schedule_steps", before))
    if cfg.train.steps < ckpt.step:
        raise checkpoint.CheckpointError(f"train.steps={cfg.train.steps} is below the step of "
                                         f"checkpoint {ckpt.path} ({ckpt.step})")
    if cfg.train.steps != before:
        how = (f"keeps its original length of {length} iterations (after it the decay stays "
               f"at ema.end={cfg.ema.end})" if cfg.ema.schedule == "linear"
               else "does not depend on the run length")
        warnings.warn(f"train.steps changed from {before} to {cfg.train.steps}: continuing from "
                      f"step {ckpt.step}; the EMA decay schedule ({cfg.ema.schedule}) {how}",
                      stacklevel=2)
    return length


def _resume(trainer: Trainer, cfg: config_lib.Config) -> checkpoint.Checkpoint:
    """Load the newest intact checkpoint of ``train.out`` into ``trainer``; one of another
    config (or another global batch) raises :class:`~wc_fast.infra.checkpoint.ConfigMismatchError`
    naming the fields."""
    ckpt = checkpoint.load_latest_intact(cfg.train.out,
                                         models={"model": trainer.model, "old": trainer.old},
                                         base=trainer.frozen_base,
                                         optimizers=(trainer.model, trainer.optimizers),
                                         config=config_lib.to_dict(cfg),
                                         ignore=RESUMABLE_CHANGES,
                                         read_config=config_lib.read_saved)
    groups = cfg.rollout.groups_per_rank * trainer.world_size
    saved = global_batch(ckpt.config, ckpt.world_size or trainer.world_size)
    if saved != groups:  # a fallback past checkpoints of the layout the run was adapted to
        raise checkpoint.ConfigMismatchError(
            f"checkpoint {ckpt.path} rolls out {saved} groups per iteration, this run "
            f"{groups} ({GROUPS_PER_RANK} x {trainer.world_size} rank(s))")
    trainer.schedule_steps = _schedule_steps(ckpt, cfg)
    return ckpt


def _open_log(cfg: config_lib.Config, resumed: checkpoint.Checkpoint | None) -> MetricsLog:
    """``metrics.jsonl`` and the trackers of ``train.loggers``, continuing the runs of the
    ``resumed`` checkpoint (a W&B run whose id it kept); each logs the resolved config."""
    out = Path(cfg.train.out)
    step = None if resumed is None else resumed.step
    config = config_lib.to_dict(cfg)
    trackers: list[Tracker] = []
    if "tensorboard" in cfg.train.loggers:
        trackers.append(TensorBoardLog(out / "tensorboard", resume_step=step, config=config))
    if "wandb" in cfg.train.loggers:
        run_id = None if resumed is None else resumed.state.get("wandb_run_id")
        tr = cfg.train
        trackers.append(WandbLog(out, config=config, name=str(out), run_id=run_id,
                                 project=tr.wandb_project, entity=tr.wandb_entity,
                                 group=tr.wandb_group, tags=tr.wandb_tags,
                                 checkpoints=tr.wandb_checkpoints))
    return MetricsLog(out / "metrics.jsonl", resume_step=step, trackers=trackers)


@dataclass(slots=True)
class LoopCount:
    """Iterations the loop ran, checkpoints it wrote and the seconds they held it up (for an
    asynchronous write: staging the state, and waiting for the previous write)."""

    iterations: int = 0
    saves: int = 0
    save_seconds: float = 0.0


def _loop(trainer: Trainer, cfg: config_lib.Config, info: DistInfo, start: int,
          log: MetricsLog | None, stop: StopRequest, console: Console,
          run_id: str | None, watch: Watchdog | None, writer: ShardedWriter | None,
          count: LoopCount) -> bool:
    """Iterations ``start .. train.steps`` with their checkpoints (of run ``run_id``, through
    the ``writer`` where there is one; both counted in ``count``), each reported to the
    ``watch``; returns whether a stop signal ended them early. Raises
    :class:`NumericalFaultError` after ``train.max_bad_updates`` consecutive skipped updates,
    once the state is checkpointed."""
    out = Path(cfg.train.out)
    telemetry = GpuTelemetry(trainer.device.index or 0)
    peak = matmul_flops(trainer.device,
                        torch.float32 if trainer.device.type == "cpu" else torch.bfloat16)
    bar = tqdm(range(start, cfg.train.steps), initial=start, total=cfg.train.steps,
               desc="RL", disable=not info.is_main, dynamic_ncols=True)
    for step in bar:
        if watch is not None:
            watch.step = step + 1
        row = _row(trainer.iteration(step), peak, telemetry)
        count.iterations += 1
        bar.set_postfix(clip=row["clip"], IF=f"{row['if_mean']:.3f}",
                        VQ=f"{row['vq_mean']:.3f}", r_std=f"{row['r_std']:.2f}",
                        roll=f"{row['rollout_s']:.1f}s", rew=f"{row['reward_s']:.1f}s",
                        train=f"{row['train_s']:.1f}s", clips_s=f"{row['clips_per_s']:.1f}",
                        spread=" ".join(f"{v:.1f}" for v in trainer_spread(row)),
                        **({"KL": f"{row['kl']:.2e}"} if "kl" in row else {}),
                        **({"gap": f"{row['reader_gap']:+.3f}"} if "reader_gap" in row
                           else {}))
        if log is not None:
            log.append(row)
        faulted = trainer.bad_streak >= cfg.train.max_bad_updates
        stopping = stop.agreed(info.world_size, info.group, trainer.device)
        if (faulted or stopping or (step + 1) % cfg.train.ckpt_every == 0
                or step + 1 == cfg.train.steps):
            t0 = time.perf_counter()
            path = _save(trainer, cfg, step + 1, info, {} if log is None else log.state(),
                         run_id, writer)
            count.saves += 1
            count.save_seconds += time.perf_counter() - t0
            if log is not None:
                if writer is not None and cfg.train.wandb_checkpoints:
                    writer.wait()  # an artifact is made of the committed checkpoint
                log.checkpoint(path, step + 1)
            if log is not None and (plot := plot_rewards(log.rows, out / "rewards.png",
                                                         trainer.rule.loss_title)):
                log.image("plots/rewards", plot, step + 1)
        if (faulted or stopping) and writer is not None:
            writer.wait()  # the checkpoint they point to is committed
        if faulted:
            bar.close()
            raise NumericalFaultError(
                f"{trainer.bad_streak} consecutive updates had a NaN or inf loss or gradient, "
                "or an update too large for the weights (train.max_update_ratio) "
                f"(train.max_bad_updates={cfg.train.max_bad_updates}); stopped after iteration "
                f"{step + 1}. {path} holds the weights of the last good update")
        if stopping:
            bar.close()
            console.print(f"stopped by a signal after iteration {step + 1}: checkpoint {path}; "
                          "continue with --resume", soft_wrap=True)
            return True
    return False


def summary(cfg: config_lib.Config, trained: WorldModel, device: torch.device,
            console: Console, log: MetricsLog | None = None) -> dict:
    """Base vs trained evaluation (the classical camera fit, which no reward reads, first;
    the eval estimator, not the reward one, beside it) and a rollout grid
    (also to ``log``'s trackers)."""
    from wc_fast.eval import EvalSettings, evaluate, print_comparison, save_grid
    from wc_fast.rewards import load_estimator

    settings = EvalSettings.from_config(cfg, sequences=cfg.train.eval_sequences,
                                        clips=cfg.train.eval_clips)
    estimator = load_estimator("eval", device="cpu")
    base = initial_model(cfg, device).eval()
    results = {"base": evaluate(base, settings, estimator=estimator),
               "trained": evaluate(trained.eval(), settings, estimator=estimator,
                                   keep_frames=True)}
    frames = results["trained"].pop("_frames")
    print_comparison(results["base"], results["trained"], console,
                     f"base vs trained ({settings.sequences} sequences x {settings.clips} clips "
                     "per set: classical fit, eval estimator)")
    out = Path(cfg.train.out)
    (out / "summary.json").write_text(json.dumps(results, indent=2))
    grid = save_grid(out / "rollouts.png", frames, estimator)
    if log is not None:
        log.image("plots/rollouts", grid, cfg.train.steps)
    console.print(f"summary: {out / 'summary.json'}, rollout grid: {grid}")
    return results


def main(argv: Sequence[str] | None = None) -> int:
    """The run; errors raise (``python -m wc_fast.train`` reports them in one line)."""
    run = parse_run_args("python -m wc_fast.train", "WorldCompass RL post-training.", argv,
                         with_base=True)
    cfg = run.config
    device = resolve_device(cfg.train.device)
    out = check_writable_dir(cfg.train.out, "train.out")
    info = init_from_env(device.type, timeout_s=cfg.train.collective_timeout_s)
    if device.type == "cuda":
        device = torch.device("cuda", info.local_rank)
    watch = (Watchdog(out, info.rank, info.world_size, cfg.train.collective_timeout_s)
             if info.world_size > 1 else None)
    # rank 0 writes the directory, so it alone holds the lock
    with watch or contextlib.nullcontext(), \
            RunLock(out) if info.is_main else contextlib.nullcontext():
        if info.is_main:
            run.resume, run.overwrite = elastic.start_mode(out, run.resume, run.overwrite)
            claim(out, resume=run.resume, overwrite=run.overwrite)
            elastic.record_job(out)
        if info.world_size > 1:  # rank 0 decided (a restart resumes): every rank follows
            decided = [run.resume]
            dist.broadcast_object_list(decided, src=0, group=info.group)
            run.resume = decided[0]
        if run.resume:  # another config fails now, not after the models are built
            meta = checkpoint.check_resumable(out, config_lib.to_dict(cfg), RESUMABLE_CHANGES,
                                              config_lib.read_saved)
            if meta is not None:
                follow_world_size(cfg, meta["config"], meta.get("world_size"),
                                  info.world_size, str(out))
        return _run(run, device, info, watch)


def _run(run: RunArgs, device: torch.device, info: DistInfo, watch: Watchdog | None) -> int:
    """Set up, resume if asked, train, summarise (under the directory's lock)."""
    cfg = run.config
    console = Console(quiet=not info.is_main)
    console.print(f"wc_fast.train: preset {cfg.preset}, {info.world_size} rank(s) on "
                  f"{device.type}; {GpuTelemetry(device.index or 0).status}")
    trainer = Trainer(cfg, initial_model(cfg, device), device, rank=info.rank,
                      world_size=info.world_size, process_group=info.group,
                      codec=frame_codec(cfg.model, device))
    if trainer.compiled:
        console.print("update.compile: the first iterations compile the train phase "
                      "(minutes on a small CPU, cached for later runs; --update.compile false "
                      "runs it eagerly)")
    resumed = _resume(trainer, cfg) if run.resume else None
    start = 0 if resumed is None else resumed.step
    if resumed is not None:
        console.print(f"resumed from checkpoint {resumed.path.name} (step {resumed.step})")
    run_id = checkpoint.new_run_id() if resumed is None else resumed.run_id
    out = Path(cfg.train.out)
    if info.is_main:  # the resolved config beside the run (python -m wc_fast.train --print-config)
        checkpoint.write_atomic(out / "config.yaml", config_yaml(cfg).encode())
    log = _open_log(cfg, resumed) if info.is_main else None
    writer = (ShardedWriter(out, info.rank, info.group, cfg.train.async_checkpoint)
              if info.world_size > 1 else None)
    count, t0 = LoopCount(), time.perf_counter()
    with StopRequest() as stop:
        preempted = _loop(trainer, cfg, info, start, log, stop, console, run_id, watch, writer,
                          count)
    t1 = time.perf_counter()
    if writer is not None:
        writer.wait()
    count.save_seconds += time.perf_counter() - t1
    console.print(f"loop: {count.iterations} iterations in {time.perf_counter() - t0:.2f} s, "
                  f"{count.save_seconds:.2f} s of it held up by {count.saves} checkpoint(s)")
    if preempted:
        if log is not None:
            log.close()
        shutdown(info)
        return EXIT_PREEMPTED
    if log is not None and log.rows:
        skipped = sum(r["skipped_groups"] for r in log.rows)
        bad = sum(r.get("skipped_updates", 0) for r in log.rows)
        console.print(f"done: {len(log.rows)} iterations, {skipped} all-equal groups skipped, "
                      f"{bad} updates skipped (NaN/inf or too large), reward curves in "
                      f"{out / 'rewards.png'}")
    if cfg.train.eval_at_end:
        trained = trainer.unsharded_model()
        if trained is not None:
            summary(cfg, trained, device, console, log)
    if log is not None:
        log.close()
    shutdown(info)
    return 0


if __name__ == "__main__":
    sys.exit(run_main("python -m wc_fast.train", main))
