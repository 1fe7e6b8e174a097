"""What the host CPU is: features and cache sizes, read once, as data for the cost models."""
from __future__ import annotations

import dataclasses
import functools
import os

from polyblocks_jax.passes.tiling import Hardware


@dataclasses.dataclass(frozen=True)
class CpuTarget:
    features: frozenset[str]
    cores: int
    l1d_bytes: int
    l2_bytes: int

    @property
    def vector_bits(self) -> int:
        return 512 if "avx512f" in self.features else 256 if "avx2" in self.features else 128

    @property
    def has_amx(self) -> bool:
        return {"amx_tile", "amx_bf16"} <= self.features

    def hardware(self) -> Hardware:
        """The description the shared cost models read."""
        return Hardware(self.vector_bits, 32 if self.vector_bits == 512 else 16,
                        self.l1d_bytes, self.l2_bytes)

    def description(self) -> str:
        """The device kind shown to JAX users, e.g. ``polyblocks cpu x86-64 avx2``."""
        isa = "avx512" if self.vector_bits == 512 else "avx2" if self.vector_bits == 256 else "sse"
        return " ".join(["polyblocks cpu x86-64", isa] + (["amx"] if self.has_amx else []))


@functools.cache
def host() -> CpuTarget:
    return CpuTarget(frozenset(_cpu_flags()), os.cpu_count() or 1,
                     _cache_size(1, "Data", 32 << 10), _cache_size(2, "Unified", 1 << 20))


def _cpu_flags() -> list[str]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return line.split(":", 1)[1].split()
    except OSError:
        pass
    return []


def _cache_size(level: int, kind: str, default: int) -> int:
    base = "/sys/devices/system/cpu/cpu0/cache"
    try:
        for index in sorted(os.listdir(base)):
            path = os.path.join(base, index)
            if _read(path, "level") == str(level) and _read(path, "type") == kind:
                size = _read(path, "size")
                return int(size[:-1]) << 10 if size.endswith("K") else int(size)
    except (OSError, ValueError):
        pass
    return default


def _read(directory: str, name: str) -> str:
    with open(os.path.join(directory, name)) as f:
        return f.read().strip()
