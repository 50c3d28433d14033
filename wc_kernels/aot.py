"""``python -m wc_kernels.aot``: compile every Triton kernel ahead of time for sm_90 (Hopper).

Each CUDA launch configuration the launchers use (kernel, input dtype, constexprs, warps; see
``aot_configs()`` in :mod:`wc_kernels.ops.nft_loss.triton`, :mod:`wc_kernels.ops.flow_noise.triton`,
:mod:`wc_kernels.ops.grpo_sde_loss.triton` and :mod:`wc_kernels.ops.prefix_attention.triton`) is
compiled with ``triton.compile(ASTSource(...), target=GPUTarget("cuda", 90, 32))``; no GPU is
needed. Registers and spills come from the ptxas bundled with Triton, run with ``-v`` on the
generated PTX with the flags Triton itself uses; shared memory from the kernel metadata.
Prints one table row per configuration and exits with status 1 on a compile error or a spill.
Under ``TRITON_INTERPRET=1`` it re-runs itself in a process without it (Triton cannot compile
kernels that were created for its interpreter).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from wc_kernels._backend import triton_interpreting

ARCH = 90
WARP_SIZE = 32
_PTXAS_PATTERNS = {
    "registers": r"Used (\d+) registers",
    "spill_stores": r"(\d+) bytes spill stores",
    "spill_loads": r"(\d+) bytes spill loads",
}


@dataclass
class Row:
    kernel: str
    dtype: str
    variant: str
    num_warps: int
    registers: int = -1
    spill_stores: int = -1
    spill_loads: int = -1
    shared: int = -1
    seconds: float = 0.0
    error: str = ""

    @property
    def ok(self) -> bool:
        return not self.error and self.spill_stores == 0 and self.spill_loads == 0


def _configs() -> list:
    from wc_kernels.ops.flow_noise import triton as flow_noise
    from wc_kernels.ops.grpo_sde_loss import triton as grpo_sde_loss
    from wc_kernels.ops.nft_loss import triton as nft_loss
    from wc_kernels.ops.prefix_attention import triton as prefix_attention

    return (nft_loss.aot_configs() + flow_noise.aot_configs() + grpo_sde_loss.aot_configs()
            + prefix_attention.aot_configs())


def ptxas_usage(ptx: str, arch: int) -> dict[str, int]:
    """Registers and spill bytes of the single kernel in ``ptx``, from ``ptxas -v``."""
    from triton.backends.nvidia.compiler import get_ptxas

    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "kernel.ptx"
        src.write_text(ptx)
        cmd = [get_ptxas(arch).path, "-v", "--regAllocOptLevel=2", f"--gpu-name=sm_{arch}a",
               str(src), "-o", str(Path(tmp) / "kernel.cubin")]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=True)
    log = proc.stdout + proc.stderr
    usage = {}
    for key, pattern in _PTXAS_PATTERNS.items():
        match = re.search(pattern, log)
        if match is None:
            raise RuntimeError(f"could not read {key} from ptxas output:\n{log}")
        usage[key] = int(match.group(1))
    return usage


def compile_config(config, arch: int = ARCH) -> Row:
    """Compile one configuration for ``sm_<arch>`` and measure its resource usage."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    row = Row(config.kernel.__name__, config.dtype, config.variant, config.num_warps)
    start = time.perf_counter()
    try:
        fn = config.kernel
        attrs = {(fn.arg_names.index(name),): [["tt.divisibility", 16]]
                 for name in config.aligned}
        src = ASTSource(fn, config.signature, config.constexprs, attrs)
        compiled = triton.compile(src, target=GPUTarget("cuda", arch, WARP_SIZE),
                                  options={"num_warps": config.num_warps,
                                           "num_stages": config.num_stages,
                                           "enable_fp_fusion": True})
        usage = ptxas_usage(compiled.asm["ptx"], arch)
    except Exception as exc:  # noqa: BLE001 - every failure becomes a row and a non-zero exit
        lines = str(exc).strip().splitlines() or [""]
        row.error = f"{type(exc).__name__}: {lines[-1][:200]}"
    else:
        row.registers = usage["registers"]
        row.spill_stores = usage["spill_stores"]
        row.spill_loads = usage["spill_loads"]
        row.shared = compiled.metadata.shared
    row.seconds = time.perf_counter() - start
    return row


def format_table(rows: list[Row]) -> str:
    header = ("kernel", "dtype", "variant", "warps", "regs", "spill st", "spill ld", "smem B",
              "s", "status")
    body = [(r.kernel, r.dtype, r.variant, str(r.num_warps), str(r.registers),
             str(r.spill_stores), str(r.spill_loads), str(r.shared), f"{r.seconds:.2f}",
             "ok" if r.ok else (r.error or "SPILLS")) for r in rows]
    widths = [max(len(line[i]) for line in (header, *body)) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip()
             for line in (header, *body)]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _rerun_without_interpreter(argv: list[str]) -> int:
    """Triton's code generator cannot run in a process whose kernels (its own standard library
    included) were created for the interpreter, so compile in a fresh one."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    # The child finds wc_kernels as this process did: through an install (which it inherits),
    # or through the folder on the path that holds it (a checkout's root, a wheel's
    # site-packages), added here too.
    package = Path(__file__).absolute().parent
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(package.parent), env.get("PYTHONPATH")]))
    return subprocess.run([sys.executable, "-m", "wc_kernels.aot", *argv], env=env).returncode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m wc_kernels.aot",
        description="AOT-compile every Triton kernel for sm_90; exit 1 on a compile error or "
                    "a register spill.")
    parser.parse_args(argv)
    if triton_interpreting():
        return _rerun_without_interpreter(argv if argv is not None else sys.argv[1:])
    rows = [compile_config(config) for config in _configs()]
    print(format_table(rows))
    failed = [r for r in rows if not r.ok]
    if failed:
        print(f"{len(failed)} of {len(rows)} configurations failed", file=sys.stderr)
        return 1
    print(f"all {len(rows)} configurations compiled for sm_{ARCH}a without spills")
    return 0


if __name__ == "__main__":
    sys.exit(main())
