"""The tensor-core cost model: block tile, warp tile and pipeline depth of an mma.sync matmul.

A pure function of the problem's sizes, the instruction shape and the chip's figures
(target.py); no MLIR. Candidates are warp tiles of m16n8 fragments (at most the unit's
``max_fragments`` accumulators a warp, which bounds registers), 1 to 8 warps a block, a
k tile, and 2 to 4 shared-memory stages. Each is priced by a small throughput model of one
SM: per k tile, the resident blocks' tensor-core work, shared-memory traffic (cp.async
writes and ldmatrix reads), L2 traffic, and the global-load latency that ``stages - 1``
tiles in flight hide; a wave of blocks runs its k tiles plus one latency to fill the
pipeline, and padded tiles count as work. The cheapest (within 2%) wins; ties go to larger
warp tiles (fewer fragment loads per mma), then to deeper pipelines (latency varies more than
the model says), then to less shared memory. wgmma tiles (sm_90a) are priced the same way, with
the operands read from shared memory once a warpgroup and the warpgroup instruction's rate.
"""
from __future__ import annotations

import dataclasses
import itertools
import math

from polyblocks_jax.nvptx.target import NvptxTarget

COPY_BYTES = 16          # one cp.async: 16 bytes a thread
PAD_BYTES = 16           # shared rows padded by 16 bytes: ldmatrix rows then hit distinct banks
GLOBAL_LATENCY = 800     # cycles from a cp.async's issue to its data in shared memory
STATIC_SHARED_BYTES = 16  # the (demoted) declaration of the dynamic shared memory the PTX carries
BARRIER_CYCLES = 64      # a k tile's wait for its copies and the block's barrier
_WARP_TILES = (16, 32, 64)
_WARP_GRIDS = ((1, 1), (1, 2), (2, 1), (2, 2), (1, 4), (4, 1), (2, 4), (4, 2))
_K_TILES = (16, 32, 64)
_STAGES = (2, 3, 4)
SWIZZLE_ATOM_BYTES = 1024  # 8 rows of 128 bytes: the unit of the 128-byte swizzle, aligned to itself
_WGMMA_N = (64, 128, 192, 256)
_WGMMA_STAGES = (2, 3, 4, 5, 6)


@dataclasses.dataclass(frozen=True)
class MmaTiles:
    block: tuple[int, int, int]  # (m, n, k) elements a block computes per k step
    warp: tuple[int, int]        # (m, n) accumulator tile of one warp
    stages: int                  # k tiles of A and B resident in shared memory (cp.async pipeline)

    @property
    def warps(self) -> tuple[int, int]:
        return self.block[0] // self.warp[0], self.block[1] // self.warp[1]

    @property
    def threads(self) -> int:
        return 32 * self.warps[0] * self.warps[1]

    def padded_rows(self, operand_bytes: int) -> tuple[int, int]:
        """Row lengths in shared memory, in elements, of the A tile (k) and the B tile (n)."""
        pad = PAD_BYTES // operand_bytes
        return self.block[2] + pad, self.block[1] + pad

    def shared_bytes(self, operand_bytes: int) -> int:
        a_row, b_row = self.padded_rows(operand_bytes)
        return self.stages * (self.block[0] * a_row + self.block[2] * b_row) * operand_bytes

    def copies(self, operand_bytes: int) -> tuple[int, int]:
        """16-byte chunks of the A and B tiles each thread copies per k tile."""
        per_copy = COPY_BYTES // operand_bytes
        return (self.block[0] * self.block[2] // per_copy // self.threads,
                self.block[2] * self.block[1] // per_copy // self.threads)

    def copies_divide(self, operand_bytes: int) -> bool:
        """Whether every thread copies as many 16-byte chunks of the A and B tiles (at least one)."""
        per_copy = COPY_BYTES // operand_bytes
        chunks = (self.block[0] * self.block[2] // per_copy, self.block[2] * self.block[1] // per_copy)
        return all(c % self.threads == 0 and c >= self.threads for c in chunks)

    def registers(self, instruction: tuple[int, int, int], operand_bytes: int, row_indices: int = 1) -> int:
        """An estimate of a thread's registers: accumulators, one k step's operand fragments (an m16
        A fragment takes 4, an n8 B fragment 2), and the 64-bit indices locating each chunk it copies
        (``row_indices`` of them for an A row: 3 for a convolution's image, y, x), plus a few."""
        fm, fn = self.warp[0] // instruction[0], self.warp[1] // instruction[1]
        a, b = self.copies(operand_bytes)
        return 4 * fm * fn + 4 * fm + 2 * fn + 2 * (a * row_indices + b) + 24

    def shared_traffic(self, operand_bytes: int) -> int:
        """Bytes a k tile moves through shared memory: the copies in, every warp's fragments out."""
        warps = self.threads // 32
        return (warps * (self.warp[0] + self.warp[1]) + self.block[0] + self.block[1]) * self.block[2] * operand_bytes


@dataclasses.dataclass(frozen=True)
class WgmmaTiles(MmaTiles):
    """A wgmma block: ``block[0] / 64`` warpgroups, each an m64 x n (``block[1]``) accumulator (its warps
    16 x n, hence ``warp``), k tiles of one 128-byte swizzle row (64 16-bit elements); shared rows
    unpadded (the swizzle spreads the banks), plus a swizzle atom of slack to align the rings to 1 KiB."""

    @property
    def warpgroups(self) -> int:
        return self.block[0] // 64

    def padded_rows(self, operand_bytes: int) -> tuple[int, int]:
        return self.block[2], self.block[1]

    def shared_bytes(self, operand_bytes: int) -> int:
        return self.stages * (self.block[0] + self.block[1]) * self.block[2] * operand_bytes + SWIZZLE_ATOM_BYTES

    def registers(self, instruction: tuple[int, int, int], operand_bytes: int, row_indices: int = 1) -> int:
        """Accumulators (n / 2 a thread), the copies' indices, descriptors and a few."""
        a, b = self.copies(operand_bytes)
        return self.block[1] // 2 + 2 * (a * row_indices + b) + 40

    def shared_traffic(self, operand_bytes: int) -> int:
        """wgmma reads its operands from shared memory once a warpgroup: A's m64 rows and all of B."""
        return (self.warpgroups * (64 + self.block[1]) + self.block[0] + self.block[1]) * self.block[2] * operand_bytes


def choose_mma_tiles(m: int, n: int, k: int, batch: int, operand_bytes: int, instruction: tuple[int, int, int],
                     max_fragments: int, target: NvptxTarget, fma_per_clock: int | None = None,
                     row_indices: int = 1) -> MmaTiles:
    """The cheapest tiling of a (batch x) (m x k) @ (k x n) product on ``target``.

    ``instruction`` is the mma shape (m, n, k); ``fma_per_clock`` the tensor cores'
    multiply-adds per SM and clock for this operand type (default: the chip's 16-bit rate);
    ``row_indices``: the indices locating a row of A (3 for a convolution's input pixel).
    """
    rate = fma_per_clock or target.mma_fma_per_clock
    best, best_key = None, None
    for tiles in _candidates(instruction, max_fragments, operand_bytes, row_indices, target):
        if tiles.stages > max(2, math.ceil(k / tiles.block[2]) + 1):
            continue  # more stages than k tiles to prefetch
        cycles = _cycles(tiles, m, n, k, batch, operand_bytes, tiles.registers(instruction, operand_bytes, row_indices),
                         rate, target)
        key = (round(math.log(cycles, 1.02)), -tiles.warp[0] * tiles.warp[1], -tiles.stages,
               tiles.shared_bytes(operand_bytes), tiles.block, tiles.warp)
        if best_key is None or key < best_key:
            best, best_key = tiles, key
    return best


def choose_wgmma_tiles(m: int, n: int, k: int, batch: int, operand_bytes: int, target: NvptxTarget,
                       row_indices: int = 1) -> WgmmaTiles:
    """The cheapest wgmma tiling (16-bit operands): 1 or 2 warpgroups of m64nN (N 64 to 256), 2 to 6
    stages, within the chip's shared memory and registers; priced as ``choose_mma_tiles`` does."""
    best, best_key = None, None
    bk = 128 // operand_bytes
    for bm, bn, stages in itertools.product((64, 128), _WGMMA_N, _WGMMA_STAGES):
        tiles = WgmmaTiles((bm, bn, bk), (16, bn), stages)
        registers = tiles.registers((64, bn, 16), operand_bytes, row_indices)
        if (not tiles.copies_divide(operand_bytes) or registers > target.registers_per_thread
                or tiles.shared_bytes(operand_bytes) + STATIC_SHARED_BYTES > target.shared_bytes_per_block_optin
                or stages > max(2, math.ceil(k / bk) + 1)):
            continue
        cycles = _cycles(tiles, m, n, k, batch, operand_bytes, registers, target.wgmma_fma_per_clock, target)
        key = (round(math.log(cycles, 1.02)), -bm * bn, -stages, tiles.shared_bytes(operand_bytes), tiles.block)
        if best_key is None or key < best_key:
            best, best_key = tiles, key
    return best


def _candidates(instruction, max_fragments: int, operand_bytes: int, row_indices: int, target: NvptxTarget):
    for wm, wn, (gm, gn), bk, stages in itertools.product(_WARP_TILES, _WARP_TILES, _WARP_GRIDS, _K_TILES, _STAGES):
        if (wm // instruction[0]) * (wn // instruction[1]) > max_fragments or bk % instruction[2]:
            continue
        tiles = MmaTiles((wm * gm, wn * gn, bk), (wm, wn), stages)
        if not tiles.copies_divide(operand_bytes):
            continue
        if tiles.shared_bytes(operand_bytes) + STATIC_SHARED_BYTES > target.shared_bytes_per_block_optin:
            continue
        if tiles.registers(instruction, operand_bytes, row_indices) > target.registers_per_thread:
            continue
        yield tiles


def _cycles(tiles: MmaTiles, m: int, n: int, k: int, batch: int, operand_bytes: int, registers: int,
            fma_per_clock: int, target: NvptxTarget) -> float:
    bm, bn, bk = tiles.block
    blocks = batch * math.ceil(m / bm) * math.ceil(n / bn)
    resident = min(target.max_blocks_per_sm, target.max_threads_per_sm // tiles.threads,
                   target.shared_bytes_per_sm // tiles.shared_bytes(operand_bytes),
                   target.registers_per_sm // (registers * tiles.threads))
    waves = math.ceil(blocks / (target.sms * resident))
    resident = min(resident, math.ceil(blocks / target.sms))  # the blocks an SM really holds
    warps = tiles.threads // 32
    # Four sub-partitions, one tensor core each: fewer resident warps leave cores idle.
    compute = bm * bn * bk / fma_per_clock / min(1.0, resident * warps / 4)
    shared = tiles.shared_traffic(operand_bytes) / target.shared_bytes_per_clock
    l2 = (bm + bn) * bk * operand_bytes / target.l2_bytes_per_clock
    per_k_tile = max(resident * max(compute, shared, l2), GLOBAL_LATENCY / (tiles.stages - 1)) + BARRIER_CYCLES
    epilogue = resident * bm * bn * 4 / target.l2_bytes_per_clock
    return waves * (math.ceil(k / bk) * per_k_tile + GLOBAL_LATENCY + epilogue)
