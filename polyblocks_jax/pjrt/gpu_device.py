"""GPU devices: one per CUDA device, each compiling for its chip's NVIDIA target.

The target is the device's compute capability: sm_90 gets sm_90a (Hopper's warpgroup
instructions), other chips the newest target not above them (plain PTX runs on later
chips).
"""
from __future__ import annotations

import logging

from polyblocks_jax.nvptx import TARGETS, runtime, target_name
from polyblocks_jax.pjrt.device import Device
from polyblocks_jax.pjrt.errors import invalid
from polyblocks_jax.pjrt.gpu_executable import GpuLoadedExecutable

logger = logging.getLogger(__name__)

_ARCH_SPECIFIC = {"sm_90": "sm_90a"}  # capability -> the PTX that has its own instructions


class GpuDevice(Device):
    runs_several = False  # no collectives between GPU devices yet
    host_memory = False

    def __init__(self, device_id: int, gpu, process_index: int = 0) -> None:
        super().__init__(device_id, f"polyblocks gpu {gpu.chip} {gpu.name}", "GPU", process_index)
        self.gpu = gpu  # its nvptx.runtime.Device
        self.target = target_name(chip_for(gpu.chip))

    def bind(self, executable) -> GpuLoadedExecutable:
        return GpuLoadedExecutable(executable, self)


def chip_for(capability: str) -> str:
    """The PTX target for a device of compute capability ``capability`` ("sm_90")."""
    if capability in _ARCH_SPECIFIC:
        return _ARCH_SPECIFIC[capability]
    number = int(capability.removeprefix("sm_"))
    known = [t for t in TARGETS if not t.endswith("a") and int(t.removeprefix("sm_")) <= number]
    if not known:
        raise invalid(f"no PTX target for a {capability} GPU (oldest: {min(TARGETS)})")
    return max(known, key=lambda t: int(t.removeprefix("sm_")))


def gpu_devices(first_id: int, process_index: int = 0) -> list[GpuDevice]:
    """One device per CUDA device, ids from ``first_id``; none without cuda-python or a GPU."""
    gpus = []
    for ordinal in range(runtime.device_count()):
        try:
            gpus.append(runtime.device(ordinal))
        except (runtime.CudaError, RuntimeError) as e:  # e.g. a GPU in exclusive use: the others still serve
            logger.warning("polyblocks: CUDA device %d not exposed: %s", ordinal, e)
    return [GpuDevice(first_id + i, g, process_index) for i, g in enumerate(gpus)]
