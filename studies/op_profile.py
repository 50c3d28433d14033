"""Where a fused op's time goes: device kernels, host synchronisations and host time per call.

    python -m studies.op_profile [--scale 1.0] [--json PATH]

The GPU benchmarks (bench/test_bench_kernels.py) time whole calls; this profiles the same calls
with ``torch.profiler`` to tell a slow kernel from a slow call around it. Per case: wall time
per call (synchronised), device-kernel time per call, host-side time per call, the number of
host synchronisations per call (``cuda*Synchronize`` calls, and ``cudaMemcpyAsync`` calls,
which include the host-to-device copies that do not stall), and the device rows (kernels,
copies) with the most device time. Cases: ``grpo_sde_loss`` + gradient through the public
function (Triton and the reference), ``nft_loss`` + gradient in x0 space and ``flow_noise``
through their Triton ops, at the benchmarks' shapes times ``--scale``. On a CPU it runs the
reference backend only (device columns are then empty), which checks the program.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from wc_kernels import grpo_sde_loss, reference

CALLS = 5
SYNC_EVENTS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize")
GRPO_KW = {"noise_level": 0.7, "clip_range": 0.2, "adv_clip_max": 5.0, "sigma_max": 0.98,
           "kl_beta": 0.04}


def _grpo_case(backend: str, rows: int, d: int, dtype: torch.dtype, device: torch.device
               ) -> Callable[[], None]:
    gen = torch.Generator(device=device).manual_seed(2)
    make = lambda: torch.randn(rows, d, device=device, generator=gen).to(dtype)
    model_output, sample, ref_output = make(), make(), make()
    sigma = torch.linspace(1.0, 0.2, rows, device=device)
    prev_sample = (sample.float() - 0.05 * model_output.float()).to(dtype)
    old = reference.sde_log_prob(model_output, sample, prev_sample, sigma, sigma - 0.05,
                                 noise_level=0.7, sigma_max=0.98)
    advantage = torch.randn(rows, device=device, generator=gen)

    def call() -> None:
        leaf = model_output.detach().requires_grad_()
        loss = grpo_sde_loss(leaf, sample, prev_sample, sigma, sigma - 0.05, old, advantage,
                             ref_output=ref_output, backend=backend, **GRPO_KW)
        torch.autograd.grad(loss, leaf)

    return call


def _nft_x0_case(rows: int, d: int, dtype: torch.dtype, device: torch.device
                 ) -> Callable[[], None]:
    from wc_kernels.ops.nft_loss.library import FUSED, NFT_LOSS

    gen = torch.Generator(device=device).manual_seed(0)
    vt, vo, vs = (torch.randn(rows, d, device=device, generator=gen).to(dtype) for _ in range(3))
    r, sigma = torch.rand(rows, device=device), torch.rand(rows, device=device)
    op = FUSED[NFT_LOSS]
    return lambda: op(vt, vo, vs, r, sigma, 1.0, True)


def _flow_noise_case(s: int, k: int, d: int, dtype: torch.dtype, device: torch.device
                     ) -> Callable[[], None]:
    from wc_kernels.ops.flow_noise.library import FLOW_NOISE, FUSED

    x0 = torch.randn(s, d, device=device).to(dtype)
    sigmas = torch.rand(s, k, device=device)
    noise = torch.randn(s * k, d, device=device).to(dtype)
    op = FUSED[FLOW_NOISE]
    return lambda: op(x0, sigmas, noise)


def cases(device: torch.device, scale: float) -> dict[str, Callable[[], None]]:
    """The profiled calls, at the GPU benchmarks' shapes times ``scale`` (at least 1 element)."""
    n = lambda size: max(1, int(size * scale))
    if device.type != "cuda":
        return {"grpo_sde_loss+grad fp32 reference": _grpo_case(
            "reference", 8, n(1 << 21), torch.float32, device)}
    out = {}
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        for backend in ("triton", "reference"):
            out[f"grpo_sde_loss+grad {name} {backend}"] = _grpo_case(
                backend, 8, n(1 << 21), dtype, device)
    out["nft_loss+grad bf16 x0 triton"] = _nft_x0_case(4, n(1 << 22), torch.bfloat16, device)
    out["flow_noise bf16 triton"] = _flow_noise_case(6, 20, n(1 << 17), torch.bfloat16, device)
    return out


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _profiled(call: Callable[[], None], calls: int, device: torch.device) -> list:
    """The profiler's per-name rows of ``calls`` calls (then a synchronisation)."""
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda"
                                           else [])
    with profile(activities=activities) as prof:
        for _ in range(calls):
            call()
        _sync(device)
    return prof.key_averages()


def _device_rows(events: list) -> list:
    """The device's own rows (kernels, copies), most device time first; an operator's row also
    carries the device time of the kernels it launched, which would count them twice."""
    return sorted((e for e in events if e.device_type == DeviceType.CUDA),
                  key=lambda e: e.self_device_time_total, reverse=True)


def device_seconds_per_call(call: Callable[[], None], calls: int, device: torch.device) -> float:
    """Device time (kernels and copies, without the gaps between them) per call, profiled over
    ``calls`` calls: a kernel's bandwidth apart from the host time of the calls around it."""
    rows = _device_rows(_profiled(call, calls, device))
    return sum(e.self_device_time_total for e in rows) / 1e6 / calls


def profile_call(call: Callable[[], None], device: torch.device) -> dict:
    """Wall, device and host time per call (seconds), host syncs per call, top device rows."""
    for _ in range(3):  # compile, autotune, allocate
        call()
    _sync(device)
    start = time.perf_counter()
    for _ in range(CALLS):
        call()
    _sync(device)
    wall = (time.perf_counter() - start) / CALLS
    events = _profiled(call, CALLS, device)
    kernels = _device_rows(events)
    syncs = sum(e.count for e in events if e.key in SYNC_EVENTS or e.key == "cudaMemcpyAsync")
    host = sum(e.self_cpu_time_total for e in events) / 1e6 / CALLS
    return {"wall_s": wall,
            "device_s": sum(e.self_device_time_total for e in kernels) / 1e6 / CALLS,
            "host_s": host, "syncs_per_call": syncs / CALLS,
            "top_kernels": [{"name": e.key[:90], "calls_per_call": e.count / CALLS,
                             "us_per_call": e.self_device_time_total / CALLS}
                            for e in kernels[:8]]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=1.0,
                        help="multiplies the benchmarks' row lengths (e.g. 0.001 for a dry run)")
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    parser.add_argument("--json", default=None, help="write the results here")
    args = parser.parse_args(argv)
    if args.scale <= 0:
        parser.error(f"--scale must be > 0, got {args.scale}")
    device = torch.device("cuda" if args.device == "cuda" or (
        args.device == "auto" and torch.cuda.is_available()) else "cpu")
    results = {}
    for name, call in cases(device, args.scale).items():
        r = results[name] = profile_call(call, device)
        print(f"{name}: wall {r['wall_s'] * 1e6:.0f} us/call, device kernels "
              f"{r['device_s'] * 1e6:.0f} us, host {r['host_s'] * 1e6:.0f} us, "
              f"{r['syncs_per_call']:.1f} host syncs per call", flush=True)
        for k in r["top_kernels"]:
            print(f"    {k['us_per_call']:9.1f} us  x{k['calls_per_call']:.0f}  {k['name']}")
    if args.json:
        Path(args.json).write_text(json.dumps({"device": str(device), "scale": args.scale,
                                               "cases": results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
