"""The chaos study under ``torchrun`` with several ranks (``python -m studies.chaos --nproc 2``).

Three jobs of the smoke preset (a checkpoint every iteration) on ``--nproc`` gloo ranks:

- uninterrupted: ``torchrun --max-restarts 0``, the reference weights;
- killed: ``torchrun --max-restarts kills+1``; ``--kills`` times a random rank is killed with
  SIGKILL at a random moment of the running attempt, one kill aimed at rank 0 while it writes
  a checkpoint (it landed there when the checkpoint's temporary directory is left behind).
  torchrun restarts the job by itself; every restart must resume from the newest checkpoint
  that was complete when the kill landed;
- stalled: one rank is stopped with SIGSTOP; a peer must name it and exit within
  ``train.collective_timeout_s`` + 30 s, torchrun restarts the job and it finishes.

Every job must end with the uninterrupted job's weights bit for bit (one CPU thread per rank:
the reductions then do not depend on scheduling) and a ``metrics.jsonl`` holding each step
once.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

from studies.chaos import wait_timed
from wc_fast.infra import checkpoint

STALL_TIMEOUT_S = 10


def torchrun_command(out: Path, steps: int, nproc: int, max_restarts: int,
                     extra: tuple[str, ...] = ()) -> list[str]:
    """A smoke job into ``out`` on ``nproc`` ranks (standalone rendezvous on a free port)."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc-per-node={nproc}", f"--max-restarts={max_restarts}",
            "-m", "wc_fast.train", "--preset", "smoke", "--steps", str(steps), "--out", str(out),
            "--train.ckpt_every", "1", "--train.keep_last", "2",
            "--train.collective_timeout_s", str(STALL_TIMEOUT_S), *extra]


def workers(agent: int) -> dict[int, int]:
    """``{rank: pid}`` of the workers the torchrun agent ``agent`` runs now (read from
    ``/proc``: children of the agent and their ``RANK``)."""
    found = {}
    try:
        children = Path(f"/proc/{agent}/task/{agent}/children").read_text().split()
    except OSError:
        return found
    for pid in map(int, children):
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        for item in env:
            if item.startswith(b"RANK="):
                found[int(item[5:])] = pid
    return found


def running_attempt(agent: subprocess.Popen, nproc: int, previous: set[int],
                    deadline_s: float = 300) -> dict[int, int]:
    """Wait for an attempt of ``nproc`` workers none of whose pids is in ``previous``."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if agent.poll() is not None:
            raise RuntimeError(f"torchrun ended ({agent.returncode}) before the next attempt")
        found = workers(agent.pid)
        if len(found) == nproc and not set(found.values()) & previous:
            return found
        time.sleep(0.05)
    raise RuntimeError("no new attempt started")


def newest_complete(out: Path) -> str | None:
    """Name of the most recently written checkpoint of ``out`` that verifies."""
    for path in reversed(checkpoint.by_write_order(checkpoint.list_checkpoints(out))):
        try:
            checkpoint.verify(path)
        except checkpoint.CheckpointError:
            continue
        return path.name
    return None


def temporaries(out: Path) -> list[str]:
    return [p.name for p in out.iterdir() if p.is_dir() and p.name.startswith(".step_")]


def kill_during_save(out: Path, rank0: int, deadline_s: float = 30) -> bool:
    """Kill rank 0 as soon as a checkpoint's temporary directory appears; whether the kill
    landed inside the write (the directory is left behind)."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if temporaries(out):
            os.kill(rank0, signal.SIGKILL)
            time.sleep(0.2)
            return bool(temporaries(out))
        time.sleep(0.0005)
    os.kill(rank0, signal.SIGKILL)
    return False


def resumed_from(log: str) -> list[str | None]:
    """Per attempt of a torchrun job (its log split where the agent reports a failed
    worker), the checkpoint it resumed from (``None``: it started afresh, or was killed
    before it said)."""
    attempts = re.split(r"failed \(exitcode: -?\d+\)", log)
    return [next(iter(re.findall(r"resumed from checkpoint (step_\d{8})", text)), None)
            for text in attempts]


def uninterrupted(out: Path, steps: int, nproc: int, env: dict[str, str]
                  ) -> tuple[float, float]:
    """Run the reference job; returns (seconds until its first checkpoint, seconds in all)."""
    start = time.monotonic()
    with (out.parent / f"{out.name}.log").open("w") as log:
        agent = subprocess.Popen(torchrun_command(out, steps, nproc, 0), env=env, stdout=log,
                                 stderr=subprocess.STDOUT)
        first, total = wait_timed(agent, out, start)
    if agent.returncode != 0:
        raise RuntimeError(f"the uninterrupted job failed ({agent.returncode}), see {log.name}")
    return first, total


def killed(out: Path, steps: int, nproc: int, kills: int, rng: random.Random,
           window: tuple[float, float], env: dict[str, str]) -> dict:
    """The job under ``kills`` SIGKILLs; returns what happened."""
    log_path = out.parent / f"{out.name}.log"
    events, previous, in_save = [], set(), False
    with log_path.open("w") as log:
        agent = subprocess.Popen(torchrun_command(out, steps, nproc, kills + 1), env=env,
                                 stdout=log, stderr=subprocess.STDOUT)
        try:
            ranks = running_attempt(agent, nproc, previous)
            for k in range(kills):
                if not in_save and k >= 1:  # from the second kill on, until one lands there
                    in_save = kill_during_save(out, ranks[0])
                    rank, how = 0, "during a checkpoint write" if in_save else "near a write"
                else:
                    wait = rng.uniform(*window)
                    time.sleep(wait)
                    rank, how = rng.randrange(nproc), f"after {wait:.1f} s"
                    os.kill(ranks[rank], signal.SIGKILL)
                left = temporaries(out) if rank == 0 and "write" in how else None
                previous = set(ranks.values())
                ranks = running_attempt(agent, nproc, previous)
                # every worker of the killed attempt has ended: what the restart must resume
                events.append({"kill": k + 1, "rank": rank, "when": how,
                               "newest_complete": newest_complete(out), "left_temporary": left})
                print(f"kill {k + 1}: rank {rank} {how}; newest complete checkpoint "
                      f"{events[-1]['newest_complete']}", flush=True)
            agent.wait(timeout=1800)
        finally:
            if agent.poll() is None:
                agent.kill()
    text = log_path.read_text()
    return {"returncode": agent.returncode, "events": events, "landed_in_save": in_save,
            "restarts": text.count("failed (exitcode: -9)"), "resumed_from": resumed_from(text),
            "skipped_damaged": text.count("skipping damaged checkpoint")}


def stalled(out: Path, steps: int, nproc: int, env: dict[str, str]) -> dict:
    """The job with one rank stopped (SIGSTOP) after its third iteration."""
    log_path = out.parent / f"{out.name}.log"
    with log_path.open("w") as log:
        agent = subprocess.Popen(torchrun_command(out, steps, nproc, 1), env=env,
                                 stdout=log, stderr=subprocess.STDOUT)
        try:
            ranks = running_attempt(agent, nproc, set())
            victim = nproc - 1
            beat = out / "heartbeat" / f"rank_{victim}.json"
            while json.loads(beat.read_text() if beat.is_file() else '{"step": 0}')["step"] < 3:
                time.sleep(0.05)
            os.kill(ranks[victim], signal.SIGSTOP)
            stopped = time.monotonic()
            named = None
            while agent.poll() is None and named is None:
                if f"watchdog: rank {victim} stalled" in log_path.read_text():
                    named = time.monotonic() - stopped
                time.sleep(0.1)
            running_attempt(agent, nproc, set(ranks.values()))
            restarted = time.monotonic() - stopped
            agent.wait(timeout=1800)
        finally:
            if agent.poll() is None:
                agent.kill()
    text = log_path.read_text()
    line = next(iter(re.findall(r"watchdog: [^\n]*", text)), "")
    return {"returncode": agent.returncode, "stopped_rank": victim, "named_after_s": named,
            "restarted_after_s": restarted, "watchdog_line": line,
            "resumed_from": resumed_from(text)}


def compare(reference: Path, run: Path, steps: int) -> dict:
    want = checkpoint.read_weights(checkpoint.latest(reference), "model")
    got = checkpoint.read_weights(checkpoint.latest(run), "model")
    differing = [k for k in want if k not in got or not torch.equal(want[k], got[k])]
    rows = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    return {"differing_tensors": len(differing), "tensors": len(want),
            "same_keys": want.keys() == got.keys(),
            "each_step_once": rows == list(range(1, steps + 1))}


def cluster_study(out: Path, steps: int, nproc: int, kills: int, seed: int,
                  env: dict[str, str]) -> dict:
    """Run the three jobs; returns the report (``ok``: every check held)."""
    out.mkdir(parents=True, exist_ok=True)
    first, seconds = uninterrupted(out / "uninterrupted", steps, nproc, env)
    per_step = (seconds - first) / max(steps - 1, 1)
    print(f"uninterrupted job: {seconds:.1f} s for {steps} steps at {nproc} ranks, the first "
          f"checkpoint after {first:.1f} s, then {per_step:.2f} s per step", flush=True)
    # from start-up to a few steps past the first checkpoint of an attempt: kills land in
    # start-up, iterations and checkpoint writes, and each attempt advances a few steps
    chaos = killed(out / "killed", steps, nproc, kills, random.Random(seed),
                   (1.0, first + 4 * per_step), env)
    stall = stalled(out / "stalled", steps, nproc, env)
    report = {"nproc": nproc, "steps": steps, "seed": seed, "uninterrupted_s": seconds,
              "first_checkpoint_s": first, "step_s": per_step,
              "killed": {**chaos, **compare(out / "uninterrupted", out / "killed", steps)},
              "stalled": {**stall, **compare(out / "uninterrupted", out / "stalled", steps)},
              "collective_timeout_s": STALL_TIMEOUT_S}
    k, s = report["killed"], report["stalled"]
    # attempt i + 1 follows kill i: it resumes the checkpoint that was newest and complete
    # then (a kill before the first checkpoint: it starts afresh), unless it was itself
    # killed before it said which one it resumed
    restarts = k["resumed_from"][1:]
    report["killed"]["resumed_newest"] = len(restarts) == kills and all(
        got is None or got == e["newest_complete"]
        for got, e in zip(restarts, k["events"], strict=True))
    report["killed"]["restarts_that_resumed"] = sum(got is not None for got in restarts)
    report["ok"] = (k["returncode"] == 0 and s["returncode"] == 0
                    and k["differing_tensors"] == 0 and s["differing_tensors"] == 0
                    and k["same_keys"] and s["same_keys"] and k["each_step_once"]
                    and s["each_step_once"] and k["landed_in_save"] and k["resumed_newest"]
                    and s["named_after_s"] is not None
                    and s["named_after_s"] <= STALL_TIMEOUT_S + 30)
    return report
