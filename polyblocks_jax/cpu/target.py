"""What the host CPU is: features and cache sizes, read once, as data for the cost models.

Matrix units are detected at run time, preferred first: AMX (CPU flags amx_tile with
amx_bf16 and/or amx_int8, and Linux's permission for this process to use tile data, asked
for with ``arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)``: without it the first tile
instruction is an illegal instruction), then AVX-512 BF16 (VDPBF16PS) and AVX-512 VNNI
(VPDPBUSD), then AVX2's VPMADDWD for int8 (the pre-VNNI path; on a CPU with VNNI, usable
when forced, and the time model prefers VPDPBUSD); the matrix-unit stage picks among them and
the vector FMA path per contraction. The first shows in the device kind (AVX2's is the
vector ISA already shown).
"""
from __future__ import annotations

import ctypes
import dataclasses
import functools
import os
import platform
import sys

_SYS_ARCH_PRCTL = 158           # x86-64 syscall number
_ARCH_REQ_XCOMP_PERM = 0x1023
_XFEATURE_XTILEDATA = 18


@dataclasses.dataclass(frozen=True)
class CpuTarget:
    features: frozenset[str]
    cores: int
    l1d_bytes: int
    l2_bytes: int
    tile_data_permitted: bool = False  # Linux let this process use AMX tile data

    @property
    def vector_bits(self) -> int:
        return 512 if "avx512f" in self.features else 256 if "avx2" in self.features else 128

    @property
    def has_amx(self) -> bool:
        return ("amx_tile" in self.features and bool({"amx_bf16", "amx_int8"} & self.features)
                and self.tile_data_permitted)

    @property
    def has_avx512_bf16(self) -> bool:
        return {"avx512f", "avx512_bf16"} <= self.features

    @property
    def has_avx512_vnni(self) -> bool:
        return {"avx512f", "avx512bw", "avx512_vnni"} <= self.features

    @property
    def has_avx2(self) -> bool:
        return "avx2" in self.features

    @property
    def matrix_unit_names(self) -> tuple[str, ...]:
        """The usable matrix units, preferred first (``Options.matrix_unit`` names)."""
        return (("amx",) if self.has_amx else ()) + (("avx512bf16",) if self.has_avx512_bf16 else ()) + (
            ("avx512vnni",) if self.has_avx512_vnni else ()) + (("avx2",) if self.has_avx2 else ())

    def matrix_units(self) -> tuple["MatrixUnit", ...]:  # noqa: F821 (compiler side, like hardware)
        from polyblocks_jax.cpu import amx, avx2_pmaddwd, avx512_bf16, avx512_vnni
        units = {"amx": lambda: amx.amx_unit("amx_bf16" in self.features, "amx_int8" in self.features),
                 "avx512bf16": avx512_bf16.unit, "avx512vnni": avx512_vnni.unit, "avx2": avx2_pmaddwd.unit}
        return tuple(units[name]() for name in self.matrix_unit_names)

    def hardware(self) -> "Hardware":  # noqa: F821 (imported below: the runtime loads no MLIR)
        """The description the shared cost models read."""
        from polyblocks_jax.passes.tiling import Hardware  # the compiler side only: it loads MLIR
        return Hardware(self.vector_bits, 32 if self.vector_bits == 512 else 16,
                        self.l1d_bytes, self.l2_bytes, self.matrix_units(), self.cores)

    @property
    def scales_by_exponent(self) -> bool:
        """y * 2^n on a vector is one instruction (AVX-512 VSCALEFPS)."""
        return self.vector_bits == 512

    @property
    def vector_isa(self) -> str:
        return "avx512" if self.vector_bits == 512 else "avx2" if self.vector_bits == 256 else "sse"

    def description(self) -> str:
        """The device kind shown to JAX users, e.g. ``polyblocks cpu x86-64 avx2``, or
        ``polyblocks cpu x86-64 avx512 amx`` with the matrix unit matmuls use."""
        shown = [name for name in self.matrix_unit_names if name != self.vector_isa]
        return " ".join(["polyblocks cpu x86-64", self.vector_isa, *shown[:1]])


@functools.cache
def host() -> CpuTarget:
    flags = frozenset(_cpu_flags())
    return CpuTarget(flags, os.cpu_count() or 1,
                     _cache_size(1, "Data", 32 << 10), _cache_size(2, "Unified", 1 << 20),
                     tile_data_permitted="amx_tile" in flags and request_tile_data())


def request_tile_data() -> bool:
    """Ask Linux to let this process use AMX tile data (XTILEDATA, Linux 5.16+): once granted
    it holds for every thread. False when refused, or off Linux x86-64."""
    if sys.platform != "linux" or platform.machine() != "x86_64":
        return False
    try:
        syscall = ctypes.CDLL(None, use_errno=True).syscall
    except (OSError, AttributeError):
        return False
    syscall.restype = ctypes.c_long
    return syscall(ctypes.c_long(_SYS_ARCH_PRCTL), ctypes.c_long(_ARCH_REQ_XCOMP_PERM),
                   ctypes.c_ulong(_XFEATURE_XTILEDATA)) == 0


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
