"""AVX2: VPMADDWD as a matrix unit for int8 x int8 -> int32 products, where the CPU has no
VNNI (the pre-VNNI standard; the vector path multiplies each int32 lane with VPMULLD).

VPMADDWD multiplies 16 pairs of int16 and adds each adjacent pair into one of 8 int32 lanes:
with k taken in pairs, one instruction is a (1 x 2) @ (2 x 8) product. ``rows_kernel`` reads
the rhs as stored, (K, N) rows, with ``avx512_bf16.rows_kernel``'s template
(``interleaving.pair_rows_kernel``): two rows of k, 16 columns each, are sign-extended to
int16 (VPMOVSXBW) and interleaved into pairs with VPUNPCKLWD / VPUNPCKHWD; the lhs, packed
as int16 once per call (``UnitOp.lhs_packed``), has each row's pair broadcast to every lane
as one 32-bit value (VPBROADCASTD from memory). A B beyond L2 that several rows read is
copied a (k, columns) panel at a time, interleaved once, into a contiguous buffer in L2
(``interleaving.packed_pair_kernel``), as a GEMM packs its (kc, nc) panels.
Exact: a pair of int8 products is at most 2 x 2^14 in magnitude, and the sums wrap modulo
2^32 with VPADDD, as XLA's do.
"""
from __future__ import annotations

import math

from mlir import ir

from polyblocks_jax.cpu import interleaving, target
from polyblocks_jax.passes.matrix_units import MatrixUnit, TileShape, UnitOp

_LANES = 8
# Per 16 columns and two rows of k: two sign extensions and two interleaving shuffles, then
# per row a broadcast load, two VPMADDWD and two VPADDD. A Zen 3 issues one VPMADDWD a cycle:
# 16 multiply-adds a cycle, what a 4 x 16 block measured (256^3 in 0.30 ms, one core).
PMADDWD_ROWS = UnitOp("i8", "i8", "i32", TileShape(1, 16, 2), pack=2, macs_per_cycle=16, rhs_rows=True,
                      registers=2, lhs_packed="i16")
# AVX2's 16 vector registers, less one for a row's broadcast pair: the block (accumulators,
# the interleaved rhs) takes the others.
_BLOCK_REGISTERS = 15
# Several blocks of rows read each row of B: they take k a chunk at a time, the chunk of B
# (its rows of all columns) at most half a 32 KiB L1d, the accumulators reloaded per chunk;
# where such a chunk would be under 8 pairs of k (over 1024 columns), k at once. On a Zen 3:
# (32, 512) @ (512, 512) 0.22 -> 0.18 ms, 1024^3 32 -> 26-27 ms; (128, 768) @ (768, 3072) in
# chunks of 8 pairs 12.4 ms, at once 9.2.
_B_CHUNK_BYTES = 16 << 10
_MIN_CHUNK_PAIRS = 8
# A B beyond half of L2 read by several blocks of rows is copied a panel at a time into a
# quarter of L2 (``interleaving.packed_pair_kernel``): its rows read in place are as many
# streams a power-of-two stride apart, which share a few cache sets. The accumulators'
# reload (a load, a shuffle and a store each) per panel of this many pairs of k is a few
# percent of its products.
_PANEL_PAIRS = 128
_PANEL_L2_SHARE = 4  # the panel: 1 / this of L2
_MAX_PANEL_BYTES = 512 << 10  # on the stack of a thread of the pool (libomp's: 4 MiB)
_TASKS_PER_CORE = 2  # row panels taken apart where the column panels are too few to share out
# The copy takes about as long per element of B as the products of this many rows of A: B
# read by fewer rows stays in place.
_COPY_ROWS = 2


def unit() -> MatrixUnit:
    return MatrixUnit("avx2", (PMADDWD_ROWS,), _BLOCK_REGISTERS)


def rows_kernel(lhs: ir.MemRefType, rhs: ir.MemRefType, acc: ir.MemRefType, tile: TileShape, pack: int,
                blocking: tuple[int, int], zero_init: bool) -> str:
    """The template computing lhs (.., M', K'/2, 2) int16 (the int8 lhs sign-extended, see
    ``UnitOp.lhs_packed``) @ rhs (.., K'/2, 2, N') int8 into (.., M', N') int32 with VPMADDWD
    (identity-layout buffers)."""
    pm, pn, k2 = lhs.shape[-3], rhs.shape[-1], rhs.shape[-3]
    cpu = target.host()
    chunk = _B_CHUNK_BYTES // (2 * pn)  # pairs of k
    # Copied where B's chunks in place would be short (its rows wide) and the rows reading it
    # outweigh the copy twice over: a B of 512 columns streams in chunks of 16 pairs as fast
    # (2048x2048x512 at two threads: 1.04x XLA in place, 0.70x copied), as does one read by 4
    # rows (0.75x copied).
    if pm > 2 * _COPY_ROWS and 2 * k2 * pn > cpu.l2_bytes // 2 and chunk < 2 * _MIN_CHUNK_PAIRS:
        panel = _panel(lhs.shape[:-3], pm, k2, pn, blocking, tile, cpu.l2_bytes, cpu.cores)
        return interleaving.packed_pair_kernel(lhs, rhs, acc, tile, blocking, zero_init, _PRODUCT, panel)
    if pm == blocking[0] or chunk < _MIN_CHUNK_PAIRS:
        chunk = 0  # B read once; or chunks too short for the accumulators' reload: k at once
    return interleaving.pair_rows_kernel(lhs, rhs, acc, tile, blocking, zero_init, _PRODUCT, chunk)


def _panel(lead: list[int], pm: int, k2: int, pn: int, blocking: tuple[int, int], tile: TileShape,
           l2_bytes: int, cores: int) -> tuple[int, int, int]:
    """The (rows, pairs of k, columns) of one task of ``packed_pair_kernel``: a panel of B of
    interleaved int16 pairs in its share of L2, the rows in as few panels as share the tasks
    out to the cores."""
    mb, nb = blocking
    kc = min(k2, _PANEL_PAIRS)
    columns = nb * tile.n
    panel_bytes = min(l2_bytes // _PANEL_L2_SHARE, _MAX_PANEL_BYTES)
    nc = min(pn, max(columns, panel_bytes // (4 * kc) // columns * columns))  # 4 bytes a pair
    tasks = math.prod(lead) * math.ceil(pn / nc)
    row_panels = min(pm // mb, math.ceil(_TASKS_PER_CORE * cores / tasks))
    return mb * math.ceil(pm // mb / row_panels), kc, nc


def _pmaddwd(out: str, acc: str, a: str, b: str) -> list[str]:
    pairs, vec = f"vector<{2 * _LANES}xi16>", f"vector<{_LANES}xi32>"
    return [f'    {out}_p = llvm.call_intrinsic "llvm.x86.avx2.pmadd.wd"({a}, {b}) : ({pairs}, {pairs}) -> {vec}',
            f"    {out} = arith.addi {acc}, {out}_p : {vec}"]


_PRODUCT = interleaving.PairProduct(_LANES, "i32", "i8", "i16", _pmaddwd)
