"""The Hopper speed targets ("Done when" of the GPU speed issue), checked on the GPU check's files.

Each target reads one figure from the results: a pytest-benchmark's median time per round or
an ``extra_info`` key (the benchmark found by its test name, e.g.
``test_flow_noise[bf16-triton]``), a key of ``studies/rl_iteration.py``'s or
``studies/wan_iteration.py``'s JSON, or a count of the GPU tests' JUnit report; a ratio target
divides a baseline's figure by ours (how many times ours beats it). ``target_rows`` gives, per
target, the measured value, the threshold and PASS / FAIL / MISSING, where MISSING says what
was not measured: a step that did not finish, a benchmark that does not exist, a figure that
was not recorded, or a run that was not the GPU one (a CPU dry run, a non-Wan shape).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

OURS = "triton"  # the fused kernels' contender name in the benchmarks
DTYPES = ("fp32", "bf16")
WAN_SHAPE = "wan2.1-1.3b"
# studies/wan_iteration.py's VARIANTS: full, LoRA, each with and without checkpointing
WAN_VARIANTS = ("full", "checkpointing", "lora", "lora+checkpointing")
PREFIX_SHAPE = ("B=16", "L=256", "P=1856")  # G = 16 candidates, one clip, a 7-clip history
# bench/test_bench_rl_iteration.py's group at the full Wan shape on a GPU (a CPU run is smaller)
WAN_RL_GROUP = (WAN_SHAPE, "layers=30", "cuda")
SOURCES = ("benchmark", "rl_iteration", "wan_iteration", "gpu_tests")

# how a figure's value is printed, by key (default: the number itself)
FORMATS: dict[str, Callable[[float], str]] = {
    "median": lambda v: f"{v * 1e3:.3f} ms/round",
    "peak_mib": lambda v: f"{v:.1f} MiB",
    "pct_of_copy": lambda v: f"{v:.1f}% of a copy per call",
    "total_s": lambda v: f"{v:.2f} s/iter",
    "failed": lambda v: f"{v:.0f} failed",
    "passed": lambda v: f"{v:.0f} passed",
    "skipped": lambda v: f"{v:.0f} skipped",
}

UNIT_DIGITS = {"%": 1, "x": 2}  # decimals of a target's value, by unit
# bench/test_bench_attention.py's SDPA contenders pinned to one backend on a replicated prefix
PINNED_SDPA = ("replicated_flash", "replicated_cudnn", "replicated_efficient")


class Missing(Exception):
    """A figure a target needs is not in the results; the message says which and why."""


@dataclass(slots=True)
class Results:
    """What the GPU check's files hold: benchmarks by test name, the studies' JSON, test counts.

    ``gpu_tests`` counts ``tests``, ``failed`` (failures and errors), ``skipped`` and ``passed``.
    """

    benchmarks: dict[str, dict] = field(default_factory=dict)
    rl_iteration: dict | None = None
    wan_iteration: dict | None = None
    gpu_tests: dict[str, int] | None = None


@dataclass(frozen=True, slots=True)
class Figure:
    """One number in the results.

    ``source`` is one of ``SOURCES``; ``key`` an ``extra_info`` key or ``median`` (seconds per
    round) for a benchmark, a JSON key, or a count; ``item`` the benchmark's test name or the
    Wan variant; ``group_has`` words the benchmark's group must hold (the shape it measures).
    """

    source: str
    key: str
    item: str = ""
    group_has: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.source not in SOURCES:
            raise ValueError(f"source: expected one of {SOURCES}, got {self.source!r}")

    def read(self, results: Results) -> float:
        """The figure's value; raises Missing when it is not in ``results``."""
        return float(getattr(self, f"_{self.source}")(results))

    def _benchmark(self, results: Results) -> float:
        bench = results.benchmarks.get(self.item)
        if bench is None:
            raise Missing(f"no benchmark {self.item}")
        words = set((bench.get("group") or "").split())
        if not set(self.group_has) <= words:
            raise Missing(f"{self.item} measures {bench.get('group')!r}, "
                          f"not {' '.join(self.group_has)}")
        if self.key == "median":
            return bench["stats"]["median"]
        extra = bench.get("extra_info", {})
        if extra.get(self.key) is None:
            raise Missing(f"{self.item} records no {self.key}")
        return extra[self.key]

    def _rl_iteration(self, results: Results) -> float:
        data = results.rl_iteration
        if data is None:
            raise Missing("no rl_iteration result")
        if not str(data.get("device", "")).startswith("cuda"):
            raise Missing(f"rl_iteration ran on {data.get('device')}, not a GPU")
        if data.get(self.key) is None:
            raise Missing(f"rl_iteration records no {self.key}")
        return data[self.key]

    def _wan_iteration(self, results: Results) -> float:
        data = results.wan_iteration
        if data is None:
            raise Missing("no wan_iteration result")
        if data.get("shape") != WAN_SHAPE:
            raise Missing(f"wan_iteration ran shape {data.get('shape')}, not {WAN_SHAPE}")
        if data.get("layers") is not None:
            raise Missing(f"wan_iteration ran {data['layers']} of {WAN_SHAPE}'s blocks")
        row = next((r for r in data["variants"] if r["variant"] == self.item), None)
        if row is None:
            raise Missing(f"wan_iteration has no variant {self.item}")
        if row.get(self.key) is None:
            raise Missing(f"wan_iteration {self.item} records no {self.key}")
        return row[self.key]

    def _gpu_tests(self, results: Results) -> float:
        counts = results.gpu_tests
        if counts is None:
            raise Missing("no gpu_tests.xml")
        if counts["passed"] + counts["failed"] == 0:  # a CPU run: every GPU test skips
            raise Missing(f"no GPU test ran ({counts['skipped']} skipped)")
        return counts[self.key]

    def format(self, value: float) -> str:
        return FORMATS.get(self.key, lambda v: f"{v:g}")(value)


@dataclass(frozen=True, slots=True)
class Fastest:
    """The smallest of several figures (times): the fastest contender that ran; missing only
    when none of them is recorded."""

    figures: tuple[Figure, ...]

    def read(self, results: Results) -> float:
        values, missing = [], []
        for figure in self.figures:
            try:
                values.append(figure.read(results))
            except Missing as why:
                missing.append(str(why))
        if not values:
            raise Missing("; ".join(missing))
        return min(values)

    def format(self, value: float) -> str:
        return self.figures[0].format(value)


@dataclass(frozen=True, slots=True)
class Target:
    """A named rule on one figure: ``value >= threshold`` (``at_least``) or ``<=``.

    With a ``baseline`` the value is ``baseline / figure`` (for times and memory: how many
    times less ours takes). ``scale`` turns the value into the printed unit (a fraction into
    %); ``shown`` figures are printed beside the value and must be recorded too.
    """

    name: str
    figure: Figure
    threshold: float
    unit: str = ""  # "%", "x" or "" (then printed as the figure's key says)
    at_least: bool = True
    baseline: Figure | Fastest | None = None
    scale: float = 1.0
    shown: tuple[Figure, ...] = ()

    def __post_init__(self) -> None:
        if self.unit and self.unit not in UNIT_DIGITS:
            raise ValueError(f"unit: expected '' or one of {list(UNIT_DIGITS)}, got {self.unit!r}")

    def check(self, results: Results) -> tuple[str, str, str, str]:
        """(name, measured, threshold, PASS / FAIL / MISSING: what is missing)."""
        rule = f"{'>=' if self.at_least else '<='} {self.threshold:g}{self.unit}"
        try:
            ours = self.figure.read(results)
            notes = [f.format(f.read(results)) for f in self.shown]
            value = ours
            if self.baseline is not None:
                base = self.baseline.read(results)
                value = base / ours if ours else math.inf
                notes.append(f"{self.figure.format(ours)} vs {self.baseline.format(base)}")
        except Missing as missing:
            return self.name, "-", rule, f"MISSING: {missing}"
        value *= self.scale
        shown = (f"{value:.{UNIT_DIGITS[self.unit]}f}{self.unit}" if self.unit
                 else self.figure.format(value))
        if notes:
            shown += f" ({', '.join(notes)})"
        passed = value >= self.threshold if self.at_least else value <= self.threshold
        return self.name, shown, rule, "PASS" if passed else "FAIL"


def _name(test: str, *params: str) -> str:
    """pytest's test name: ``test[p1-p2-...]``."""
    return f"{test}[{'-'.join(params)}]"


def _fused(label: str, test: str, params: tuple[str, ...]) -> tuple[Target, ...]:
    """A fused op's targets: its kernels alone (device time, without the host time between
    them) at 80% of a device copy over the bytes they actually move, and each call (the
    per-call % of a copy shown beside it) 1.5x ``torch.compile``."""
    ours = _name(test, *params, OURS)
    return (Target(f"{label}: kernels alone, % of a device copy",
                   Figure("benchmark", "kernel_pct_of_copy", ours), 80.0, "%"),
            Target(f"{label}: speed vs torch.compile", Figure("benchmark", "median", ours), 1.5,
                   "x", baseline=Figure("benchmark", "median", _name(test, *params, "compile")),
                   shown=(Figure("benchmark", "pct_of_copy", ours),)))


def _prefix_attention(d: int) -> tuple[Target, ...]:
    """Forward+backward at head dim ``d``: time against the fastest SDPA backend pinned on a
    replicated prefix (flash, cuDNN, efficient; whichever ran), peak memory against SDPA on a
    replicated prefix, and time against prefix-grouper."""
    shape = (*PREFIX_SHAPE, f"D={d}")

    def figure(key: str, contender: str) -> Figure:
        return Figure("benchmark", key, _name("test_prefix_attention", f"G16-D{d}", "fwd+bwd",
                                              contender), group_has=shape)

    label = f"prefix_attention fwd+bwd D={d} (G=16, L=256, P=1856)"
    pinned = Fastest(tuple(figure("median", c) for c in PINNED_SDPA))
    return (Target(f"{label}: speed vs the fastest pinned SDPA", figure("median", OURS), 1.0,
                   "x", baseline=pinned),
            Target(f"{label}: memory vs replicated SDPA", figure("peak_mib", OURS), 4.0, "x",
                   baseline=figure("peak_mib", "sdpa_replicated")),
            Target(f"{label}: speed vs prefix-grouper", figure("median", OURS), 1.0, "x",
                   baseline=figure("median", "prefix_grouper")))


def _wan(variant: str) -> Target:
    """The Wan-1.3B-shaped iteration's MFU against a measured bf16 matmul; s/iter and peak."""
    return Target(f"Wan-1.3B-shaped iteration, {variant}: MFU of a measured bf16 matmul",
                  Figure("wan_iteration", "mfu_measured", variant), 40.0, "%", scale=100.0,
                  shown=(Figure("wan_iteration", "total_s", variant),
                         Figure("wan_iteration", "peak_mib", variant)))


TARGETS: tuple[Target, ...] = (
    *(t for dt in DTYPES for space in ("velocity", "x0")
      for t in _fused(f"nft_loss+grad {dt} {space}", "test_nft_loss_and_grad", (dt, space))),
    *(t for dt in DTYPES for t in _fused(f"flow_noise {dt}", "test_flow_noise", (dt,))),
    *(t for dt in DTYPES
      for t in _fused(f"grpo_sde_loss+grad {dt}", "test_grpo_sde_loss_and_grad", (dt,))),
    *(t for d in (32, 64, 128) for t in _prefix_attention(d)),
    Target("model forward G=16: shared prefix vs replicated",
           Figure("benchmark", "median", "test_shared", group_has=("prefix-forward-G16-n8",)),
           1.0, "x", baseline=Figure("benchmark", "median", "test_replicated",
                                     group_has=("prefix-forward-G16-n8",))),
    Target("RL iteration vs a batched eager loop", Figure("rl_iteration", "speedup_vs_batched"),
           1.3, "x"),
    Target("RL iteration vs the official-style baseline", Figure("rl_iteration", "speedup"),
           5.0, "x"),
    Target("RL iteration at the Wan2.1-1.3B shape vs a batched eager loop",
           Figure("benchmark", "median", "test_wan_rl_iteration[ours]", group_has=WAN_RL_GROUP),
           1.3, "x", baseline=Figure("benchmark", "median", "test_wan_rl_iteration[batched_eager]",
                                     group_has=WAN_RL_GROUP)),
    *(_wan(variant) for variant in WAN_VARIANTS),
    Target("every GPU test passes", Figure("gpu_tests", "failed"), 0.0, at_least=False,
           shown=(Figure("gpu_tests", "passed"), Figure("gpu_tests", "skipped"))),
)


def target_rows(results: Results, targets: tuple[Target, ...] = TARGETS
                ) -> list[tuple[str, str, str, str]]:
    """(target, measured, threshold, result) for each target, in order."""
    return [target.check(results) for target in targets]
