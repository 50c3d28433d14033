"""GPU telemetry through nvidia-ml-py (utilisation, memory, power), off without a driver."""

from __future__ import annotations


class GpuTelemetry:
    """Reads the device's NVML counters; on a machine without an NVIDIA driver it is off.

    ``status`` is one line that says which, for the log.
    """

    def __init__(self, device_index: int = 0) -> None:
        self.handle = None
        try:
            import pynvml

            pynvml.nvmlInit()
            self.handle = pynvml.nvmlDeviceGetHandleByIndex(device_index)
            self._nvml = pynvml
            self.status = f"telemetry on: {pynvml.nvmlDeviceGetName(self.handle)}"
        except Exception as exc:  # noqa: BLE001 - any NVML failure means "no GPU telemetry"
            self.status = f"telemetry off: no NVIDIA GPU/driver ({type(exc).__name__})"

    @property
    def enabled(self) -> bool:
        return self.handle is not None

    def read(self) -> dict[str, float]:
        """``gpu_util`` (%), ``gpu_mem_gb`` and ``gpu_power_w``; empty when off."""
        if self.handle is None:
            return {}
        nv = self._nvml
        util = nv.nvmlDeviceGetUtilizationRates(self.handle)
        mem = nv.nvmlDeviceGetMemoryInfo(self.handle)
        return {"gpu_util": float(util.gpu), "gpu_mem_gb": mem.used / 2**30,
                "gpu_power_w": nv.nvmlDeviceGetPowerUsage(self.handle) / 1000.0}
