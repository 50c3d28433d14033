"""One RL iteration: wc_fast's trainer vs a batched eager loop and vs the official-style
baseline, same model and config.

    python -m studies.rl_iteration --preset cpu --json PATH

The batched eager loop (:mod:`studies.batched_eager`) is what a careful PyTorch user writes
without this project's kernels: all candidates batched, the old model on the device, SDPA over
a replicated history, the loss and noising as plain PyTorch, no CUDA graph; the speedup over it
(``speedup_vs_batched``) is the headline. The official-style baseline
(:mod:`studies.official_style`) is the official code's execution strategy at batch 1
(``speedup``, kept as a second, labelled column).

All start from the same weights at the same iteration (the longest history, clip N) and run
the same numbers of candidates, sigmas and updates; one warm-up iteration each (which also
absorbs compilation, e.g. with ``--set update.compile=true``) is not timed. Writes per-phase
seconds for each, the speedups, and ``flop_fraction``: the trainer's model FLOP/s in its train
phase over a large fp32 matmul's FLOP/s (bf16 on GPU) measured right after that train phase,
the median over the timed iterations; ``mfu`` is the same over a matmul in the model's compute
dtype (``model.dtype``), which differs on CPU only for a bf16/fp16 model.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
from pathlib import Path

import torch

from studies.batched_eager import batched_eager_trainer, plain_pytorch_ops
from studies.official_style import OfficialStyleIteration
from wc_fast import config as config_lib
from wc_fast.infra.metrics import matmul_flops
from wc_fast.infra.runtime import resolve_device
from wc_fast.models.pretrained import initial_model
from wc_fast.rl.trainer import Trainer


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="cpu", choices=config_lib.PRESETS)
    parser.add_argument("--json", default=None, help="write the results here")
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    parser.add_argument("--repeat", type=int, default=1, help="iterations timed per side")
    parser.add_argument("--init", default=None,
                        help="train.init override, e.g. 'random' for a preset whose model size "
                             "differs from the shipped base model")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.FIELD=VALUE",
                        help="config override, e.g. update.compile=true (repeatable)")
    args = parser.parse_args(argv)
    cfg = config_lib.preset(args.preset)
    if args.init is not None:
        cfg.train.init = args.init
    for override in args.set:
        path, sep, value = override.partition("=")
        if not sep:
            parser.error(f"--set takes SECTION.FIELD=VALUE, got {override!r}")
        config_lib.apply_override(cfg, path, value)
    config_lib.validate(cfg)
    device = resolve_device(args.device)
    if device.type == "cpu":
        torch.set_num_threads(min(2, torch.get_num_threads()))
    base = initial_model(cfg, device)
    step = cfg.rollout.num_clips - 1  # clip N: the longest shared history
    ours = Trainer(cfg, copy.deepcopy(base), device)
    theirs = OfficialStyleIteration(cfg, copy.deepcopy(base), device)
    batched = batched_eager_trainer(cfg, copy.deepcopy(base), device)
    ours.iteration(step)  # warm-up (allocator, first-call overheads) on every side
    theirs.run(step)
    with plain_pytorch_ops():
        batched.iteration(step)
    batched_times = []
    reference_dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    compute_dtype = getattr(torch, cfg.model.dtype)
    our_times, their_times, rates, peaks, peaks_compute = [], [], [], [], []
    for i in range(args.repeat):
        stats = ours.iteration(step + i * cfg.rollout.num_clips)
        our_times.append(stats.times)
        rates.append(stats.train_flops / stats.times["train"])
        # the machine's matmul rate right after each train phase: a shared machine's speed
        # drifts by tens of percent within minutes, so each rate is paired with its own peak
        peaks.append(matmul_flops(device, reference_dtype, repeat=3))
        # MFU proper: the same rate at the dtype the model's matmuls run in (autocast); a CPU
        # without bf16/fp16 matrix units runs a 2048^3 product of that dtype at well under 1
        # GFLOP/s (minutes per product), so there a 512^3 one, as compute-bound, measures it
        low_cpu = device.type == "cpu" and compute_dtype != torch.float32
        peaks_compute.append(peaks[-1] if compute_dtype == reference_dtype
                             else matmul_flops(device, compute_dtype, n=512 if low_cpu else 2048,
                                               repeat=3))
        their_times.append(theirs.run(step + i * cfg.rollout.num_clips))
        with plain_pytorch_ops():
            batched_times.append(batched.iteration(step + i * cfg.rollout.num_clips).times)
    peak, peak_compute = statistics.median(peaks), statistics.median(peaks_compute)

    def mean_phases(rows: list[dict]) -> dict:
        return {k: sum(r[k] for r in rows) / len(rows) for k in rows[0]}

    ours_p, theirs_p = mean_phases(our_times), mean_phases(their_times)
    batched_p = mean_phases(batched_times)
    result = {"preset": cfg.preset, "device": str(device), "clip_index": cfg.rollout.num_clips,
              "ours_s": sum(ours_p.values()), "batched_eager_s": sum(batched_p.values()),
              "official_style_s": sum(theirs_p.values()),
              "ours_phases_s": ours_p, "batched_eager_phases_s": batched_p,
              "official_style_phases_s": theirs_p,
              "train_flops_per_s": statistics.median(rates), "matmul_flops_per_s": peak,
              "flop_fraction": statistics.median(r / p for r, p in zip(rates, peaks,
                                                                          strict=True)),
              "compute_dtype": cfg.model.dtype, "compute_dtype_matmul_flops_per_s": peak_compute,
              "mfu": statistics.median(r / p for r, p in zip(rates, peaks_compute,
                                                                strict=True))}
    result["speedup"] = result["official_style_s"] / result["ours_s"]
    result["speedup_vs_batched"] = result["batched_eager_s"] / result["ours_s"]
    result["each"] = {"train_flops_per_s": rates, "matmul_flops_per_s": peaks}
    print(f"{'phase':<10}{'ours (s)':>12}{'batched eager (s)':>19}{'ratio':>8}"
          f"{'official-style (s)':>20}{'ratio':>8}")
    rows = [(phase, ours_p[phase], batched_p[phase], theirs_p[phase]) for phase in ours_p]
    rows.append(("total", result["ours_s"], result["batched_eager_s"],
                 result["official_style_s"]))
    for phase, ours_s, batched_s, theirs_s in rows:
        print(f"{phase:<10}{ours_s:>12.2f}{batched_s:>19.2f}{batched_s / max(ours_s, 1e-9):>8.2f}"
              f"{theirs_s:>20.2f}{theirs_s / max(ours_s, 1e-9):>8.2f}")
    print(f"train-phase model FLOP/s {result['train_flops_per_s'] / 1e9:.1f} G = "
          f"{100 * result['flop_fraction']:.0f}% of a large matmul's "
          f"{peak / 1e9:.1f} GFLOP/s (medians over the timed iterations)")
    if peak_compute != peak:
        print(f"  = {100 * result['mfu']:.0f}% of a large {cfg.model.dtype} matmul's "
              f"{peak_compute / 1e9:.1f} GFLOP/s (the dtype the model's matmuls run in)")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
