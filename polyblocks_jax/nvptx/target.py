"""What an NVIDIA GPU is, as data for the cost models and the launch checks.

One frozen record per compute capability; the figures are NVIDIA's (CUDA C
Programming Guide, "Technical Specifications per Compute Capability", and the PTX ISA
for the matrix shapes). Nothing here queries a device: PTX is built ahead of time on
machines without one.
"""
from __future__ import annotations

import dataclasses

from polyblocks_jax.errors import PolyblocksError


@dataclasses.dataclass(frozen=True)
class MmaShape:
    """One tensor-core instruction shape (m, n, k) for an operand element type."""
    instruction: str  # "mma.sync" or "wgmma"
    dtype: str        # operand element type: "bf16", "f16", "tf32"
    m: int
    n: int
    k: int


@dataclasses.dataclass(frozen=True)
class NvptxTarget:
    chip: str                        # "sm_80"
    ptx_features: str                # "+ptx80": the PTX ISA version the NVPTX backend emits
    sms: int                         # streaming multiprocessors on the reference part (A100 / H100 SXM)
    warp_size: int
    max_threads_per_block: int
    max_block_dims: tuple[int, int, int]
    max_grid_dims: tuple[int, int, int]
    shared_bytes_per_block: int      # static limit; more needs cuFuncSetAttribute (opt-in)
    shared_bytes_per_block_optin: int
    shared_bytes_per_sm: int
    registers_per_thread: int
    registers_per_sm: int
    max_threads_per_sm: int
    max_blocks_per_sm: int
    l2_bytes: int
    mma_shapes: tuple[MmaShape, ...]
    # Throughputs per SM and clock, for the tensor-core cost model (mma_tiles.py): multiply-adds
    # of mma.sync on 16-bit operands (tf32 runs at half), bytes from L2, bytes from shared memory.
    mma_fma_per_clock: int
    l2_bytes_per_clock: int
    shared_bytes_per_clock: int
    wgmma_fma_per_clock: int = 0     # the warpgroup instruction's rate (sm_90a), 16-bit operands

    @property
    def resident_threads(self) -> int:
        """Threads the whole GPU holds at once: what a kernel needs to hide memory latency."""
        return self.sms * self.max_threads_per_sm

    def wgmma_shape(self, dtype: str) -> MmaShape | None:
        """The warpgroup instruction for ``dtype`` operands, when the chip's PTX has it (sm_90a)."""
        return next((s for s in self.mma_shapes if s.instruction == "wgmma" and s.dtype == dtype), None)

    def hardware(self):
        """The description the shared cost models read: a thread's 128-bit loads, shared memory as L1."""
        from polyblocks_jax.passes.tiling import Hardware  # the compiler side only: it loads MLIR
        return Hardware(128, self.registers_per_thread, self.shared_bytes_per_block, self.l2_bytes)

    def matrix_unit(self, tf32: bool = False):
        """mma.sync as the shared description of matrix units; f32 operands map to it when ``tf32``."""
        from polyblocks_jax.passes.matrix_units import MatrixUnit, TileShape, UnitOp  # the compiler side only
        operands = {"bf16": "bf16", "f16": "f16", **({"tf32": "f32"} if tf32 else {})}
        ops = tuple(UnitOp(operands[s.dtype], operands[s.dtype], "f32", TileShape(s.m, s.n, s.k))
                    for s in self.mma_shapes if s.instruction == "mma.sync" and s.dtype in operands)
        # tile_registers: accumulator fragments (m16n8, 4 registers a thread) one warp may hold,
        # leaving registers for the operand fragments and addresses: a 64x64 warp tile.
        return MatrixUnit("mma.sync", ops, tile_registers=32)

    def description(self) -> str:
        return f"polyblocks nvptx {self.chip}"

    def check_launch(self, grid: tuple[int, int, int], block: tuple[int, int, int], shared_bytes: int) -> None:
        """Raise if a launch configuration exceeds this chip's limits."""
        threads = block[0] * block[1] * block[2]
        problems = []
        if threads > self.max_threads_per_block or any(b > m for b, m in zip(block, self.max_block_dims)):
            problems.append(f"block {block} exceeds {self.max_threads_per_block} threads or {self.max_block_dims}")
        if any(g > m for g, m in zip(grid, self.max_grid_dims)):
            problems.append(f"grid {grid} exceeds {self.max_grid_dims}")
        if min(*grid, *block) < 1:
            problems.append(f"empty launch grid {grid} block {block}")
        if shared_bytes > self.shared_bytes_per_block_optin:
            problems.append(f"{shared_bytes} bytes of shared memory exceed {self.shared_bytes_per_block_optin}")
        if problems:
            raise PolyblocksError(f"launch configuration invalid on {self.chip}: " + "; ".join(problems))


_COMMON = dict(warp_size=32, max_threads_per_block=1024, max_block_dims=(1024, 1024, 64),
               max_grid_dims=(2**31 - 1, 65535, 65535), shared_bytes_per_block=48 << 10,
               registers_per_thread=255, registers_per_sm=64 << 10, max_threads_per_sm=2048,
               max_blocks_per_sm=32, shared_bytes_per_clock=128)

_MMA_SYNC = (MmaShape("mma.sync", "bf16", 16, 8, 16), MmaShape("mma.sync", "f16", 16, 8, 16),
             MmaShape("mma.sync", "tf32", 16, 8, 8))

SM80 = NvptxTarget(chip="sm_80", ptx_features="+ptx80", sms=108, shared_bytes_per_block_optin=163 << 10,
                   shared_bytes_per_sm=164 << 10, l2_bytes=40 << 20, mma_shapes=_MMA_SYNC,
                   mma_fma_per_clock=1024, l2_bytes_per_clock=36, **_COMMON)

SM90 = NvptxTarget(chip="sm_90", ptx_features="+ptx80", sms=132, shared_bytes_per_block_optin=227 << 10,
                   shared_bytes_per_sm=228 << 10, l2_bytes=50 << 20, mma_shapes=_MMA_SYNC,
                   mma_fma_per_clock=1024, l2_bytes_per_clock=40, **_COMMON)

# sm_90a: Hopper's architecture-specific PTX (runs on sm_90 parts only, not later chips), which has
# the warpgroup instructions. Products of 16-bit operands take wgmma there (wgmma_kernel.py).
SM90A = dataclasses.replace(SM90, chip="sm_90a", wgmma_fma_per_clock=2048,
                            mma_shapes=_MMA_SYNC + (MmaShape("wgmma", "bf16", 64, 256, 16),
                                                    MmaShape("wgmma", "f16", 64, 256, 16)))

TARGETS = {t.chip: t for t in (SM80, SM90, SM90A)}


def target(chip: str) -> NvptxTarget:
    try:
        return TARGETS[chip]
    except KeyError:
        raise PolyblocksError(f"unknown NVIDIA chip {chip!r}; known: {', '.join(TARGETS)}") from None
