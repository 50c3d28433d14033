"""How the native ``flow_noise`` kernel writes its outputs: plain against streaming stores.

    python -m studies.flow_noise_stores [--rounds 30]

Calls the bare extension in a loop at the two shapes of ``bench/test_bench_cpu.py``'s
``flow_noise`` groups, once with every output written by plain stores and once with streaming
(non-temporal) stores, and prints the median and fastest call and the page faults per call
(which the output cache of ``wc_kernels._native`` keeps at zero once a shape repeats). The
native kernel chooses streaming stores when its outputs exceed 32 MiB together; this is the
measurement behind that threshold.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
import time

import torch

from wc_kernels import _native

SHAPES = ((6, 20, 16 * 4 * 16 * 16), (6, 5, 4 * 16 * 60 * 104))  # as bench/test_bench_cpu.py
STORES = {"plain": 1 << 62, "streaming": 0}  # the threshold that forces each


def time_calls(args: tuple[torch.Tensor, ...], rounds: int) -> tuple[float, float, float]:
    """Median and fastest call in ms, and page faults per call, after 3 warm-up calls."""
    for _ in range(3):
        _native.flow_noise(*args)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    seconds = []
    for _ in range(rounds):
        start = time.perf_counter()
        _native.flow_noise(*args)
        seconds.append(time.perf_counter() - start)
    faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults) / rounds
    return statistics.median(seconds) * 1e3, min(seconds) * 1e3, faults


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=30)
    rounds = parser.parse_args(argv).rounds
    gen = torch.Generator().manual_seed(0)
    default = _native.set_stream_min_bytes(0)
    print("| S x K x D | outputs (MB) | stores | median ms | min ms | faults / call |")
    print("|---|---|---|---|---|---|")
    try:
        for s, k, d in SHAPES:
            args = (torch.randn(s, d, generator=gen), torch.rand(s, k, generator=gen),
                    torch.randn(s * k, d, generator=gen))
            megabytes = 2 * s * k * d * 4 / 1e6
            for name, threshold in STORES.items():
                _native.set_stream_min_bytes(threshold)
                median, fastest, faults = time_calls(args, rounds)
                print(f"| {s} x {k} x {d} | {megabytes:.0f} | {name} | {median:.3f} "
                      f"| {fastest:.3f} | {faults:.0f} |")
    finally:
        _native.set_stream_min_bytes(default)
    return 0


if __name__ == "__main__":
    sys.exit(main())
