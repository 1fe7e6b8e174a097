"""Matrix units: what a target's unit computes, and which contractions map to it.

Target-neutral. A target describes each unit it has as a ``MatrixUnit`` (the host supplies
AMX's and AVX-512 BF16's, a GPU mma.sync's); ``choose_matrix_mapping`` is the cost model,
a pure function of one contraction (a matmul, or a convolution in its matmul form) and a
unit, testable on its own; ``choose_unit_mapping`` compares the estimated times of every
unit and of the vector FMA path. The stage that applies the choices is ``matrix_forms``.

A mapped contraction runs on padded, packed operands: the lhs as (M, K) rows and the rhs
in the unit's k-packed layout (VNNI: pairs of k for bf16, quads for int8, side by side per
column), both zero-padded to whole tiles, accumulated into a padded accumulator of the
unit's type. The zero padding adds nothing to the sums, so a shape that is not a multiple
of the tile computes exactly the same as one that is.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Sequence

# ``Options.precision``: how f32 matmuls and convolutions are computed.
FP32 = "fp32"                        # exact f32 math
MIXED_BF16_FP32 = "mixed_bf16_fp32"  # operands rounded to bf16, products summed in f32


@dataclasses.dataclass(frozen=True)
class TileShape:
    """One instruction's product: an (m x k) lhs tile @ a (k x n) rhs tile into an (m x n) accumulator."""
    m: int
    n: int
    k: int


@dataclasses.dataclass(frozen=True)
class UnitOp:
    """One kind of product a unit computes: operand types (MLIR names: "bf16", "i8", "f16"),
    the type it accumulates in, its tile, and how many consecutive k elements of a rhs
    column it reads side by side (VNNI: 2 for bf16, 4 for int8; 1: the rhs as it is)."""
    lhs: str
    rhs: str
    accumulate: str
    tile: TileShape
    pack: int = 1
    macs_per_cycle: int = 0  # multiply-adds a core issues per cycle (0: unknown, copies cost nothing)
    # The rhs read as stored, (K, N) rows, its pairs of k interleaved in registers: no packed
    # copy of it per call, which a few rows of lhs do not amortize.
    rhs_rows: bool = False
    # With ``rhs_rows``: the kernel packs each block of columns of the rhs it computes into a
    # buffer of at most this many bytes (in cache, read by every block of rows), instead of
    # reading the rows into registers (0).
    rhs_block_bytes: int = 0
    registers: int = 1  # registers one accumulator (and one rhs) tile takes
    # With ``rhs_rows``: the type the lhs rows are packed in when the unit multiplies wider
    # values than the operands (AVX2's VPMADDWD: int16 pairs), sign-extended once per call
    # rather than per row and k step in the kernel; "" for ``lhs``.
    lhs_packed: str = ""


@dataclasses.dataclass(frozen=True)
class MatrixUnit:
    """A target's matrix unit: the products it computes and how many tiles (or vector
    registers) it holds at once, which bounds the register blocking."""
    name: str
    ops: tuple[UnitOp, ...]
    tile_registers: int

    def op_for(self, lhs: str, rhs: str) -> UnitOp | None:
        return next((op for op in self.ops if (op.lhs, op.rhs) == (lhs, rhs)), None)


@dataclasses.dataclass(frozen=True)
class Contraction:
    """What the cost model reads of a matmul-like op: ``batch`` independent (m x k) @ (k x n)
    products, element types of the operands and of the accumulator (MLIR names). A 2-D
    convolution is one: m = images x output pixels, n = output channels, k = kernel taps x
    input channels."""
    m: int
    n: int
    k: int
    lhs: str
    rhs: str
    accumulate: str
    batch: int = 1


@dataclasses.dataclass(frozen=True)
class MatrixMapping:
    """The choice for one contraction: the unit and its product, the operand type fed to it
    (bf16 for an f32 contraction at mixed precision), the register block of accumulator
    tiles (rows, columns), and the sizes padded to whole register blocks and k tiles."""
    unit: str
    op: UnitOp
    blocking: tuple[int, int]
    padded: tuple[int, int, int]  # (m, n, k)
    cycles: float = 0.0  # the cost model's time per core for the whole contraction

    @property
    def operand(self) -> str:
        return self.op.lhs

    @property
    def lhs_operand(self) -> str:
        """The type the lhs is packed in."""
        return self.op.lhs_packed or self.op.lhs


# A contraction whose padded problem has less than this fraction of useful work stays off
# the unit: AMX does roughly 4-10x the multiply-adds per second of the f32 FMA path, so a
# quarter keeps a margin; a matrix-vector product (one row padded to 16) stays off.
MIN_EFFICIENCY = 0.25
_COPY_BYTES_PER_CYCLE = 16  # a padded copy, read and written once, per core
_STREAM_BYTES_PER_CYCLE = 8  # an operand read again from memory
# A kernel packing the rhs: a load, an interleave and a store share per tile row (16 columns)
# (int8 4 x 1024 x 1024: AMX packing as it went took 1.6x VPDPBUSD's time on B's rows).
_PACK_CYCLES_PER_ROW = 2
_BYTES = {"bf16": 2, "f16": 2, "i8": 1, "i16": 2}
# Integer products on the vector path multiply and add apart, the multiply (x86 VPMULLD) at
# most one a cycle where two FMAs issue: half the FMA rate (int8 (32, 512) @ (512, 512) on
# AVX2 ran at 7 multiply-adds a cycle, VPMADDWD at 16).
_INTEGER_VECTOR_SHARE = 0.5


def unit_operand_types(c: Contraction, precision: str) -> tuple[str, str]:
    """The operand types a unit would be fed: f32 operands become bf16 at mixed precision."""
    if precision == MIXED_BF16_FP32 and (c.lhs, c.rhs, c.accumulate) == ("f32", "f32", "f32"):
        return "bf16", "bf16"
    return c.lhs, c.rhs


def choose_unit_mapping(c: Contraction, units: Sequence[MatrixUnit], fma_macs_per_cycle: int,
                        precision: str = FP32) -> MatrixMapping | None:
    """The fastest of ``units`` for ``c`` by the time model (``MatrixMapping.cycles``), or None
    when the vector FMA path, ``fma_macs_per_cycle`` multiply-adds a cycle on the unpadded
    problem, is estimated faster (a matrix-vector product; an int8 one of few rows)."""
    mappings = [m for unit in units for m in [choose_matrix_mapping(c, unit, precision)] if m is not None]
    best = min(mappings, key=lambda m: m.cycles, default=None)
    rate = fma_macs_per_cycle * (1 if _is_float(c.accumulate) else _INTEGER_VECTOR_SHARE)
    fma_cycles = c.batch * c.m * c.n * c.k / rate
    return best if best is not None and best.cycles < fma_cycles else None


def choose_matrix_mapping(c: Contraction, unit: MatrixUnit, precision: str = FP32) -> MatrixMapping | None:
    """Map ``c`` onto the fastest of ``unit``'s products for its types, or None when the unit
    does not compute them or would waste most of its work on padding.

    The unit's product must take the (precision-adjusted) operand types and accumulate in the
    contraction's own accumulator type, so the result is what the program asks for. Register
    blocking: a block of mb x nb accumulator tiles reuses each loaded lhs tile nb times and
    each rhs tile mb times; it must fit with its mb + nb operand tiles in the unit's
    registers. The block with the most reuse per loaded tile wins, discounted by the
    padding it adds, in products and in padded copies (AMX's 8 tiles: 2 x 2 accumulators +
    2 lhs + 2 rhs tiles).
    """
    lhs, rhs = unit_operand_types(c, precision)
    mappings = [m for op in unit.ops if (op.lhs, op.rhs) == (lhs, rhs) and op.accumulate == c.accumulate
                for m in [_mapping(c, unit, op)] if m is not None]
    return min(mappings, key=lambda m: m.cycles, default=None)


def _mapping(c: Contraction, unit: MatrixUnit, op: UnitOp) -> MatrixMapping | None:
    if min(c.m, c.n, c.k) < 1:
        return None
    t = op.tile
    pk = _round_up(c.k, t.k)
    best: tuple[tuple[float, float], tuple[int, int], tuple[int, int]] | None = None
    for mb in range(1, unit.tile_registers):
        for nb in range(1, unit.tile_registers):
            if ((mb * nb + nb) * op.registers + mb > unit.tile_registers
                    or op.rhs_block_bytes and nb * t.n * pk * _BYTES[op.rhs] > op.rhs_block_bytes):
                continue
            padded = (_round_up(c.m, mb * t.m), _round_up(c.n, nb * t.n))
            reuse = mb * nb / (mb + nb)
            if op.rhs_rows:  # the fastest block (the rhs is streamed once per block of rows), then the most reuse
                score = (-round(_cycles(c, op, (mb, nb), (*padded, pk))), reuse)
            else:
                score = (round(reuse * (c.m / padded[0]) * (c.n / padded[1]) * _unpadded_share(c, op, padded), 9), 0)
            if best is None or score > best[0]:
                best = (score, (mb, nb), padded)
    if best is None:
        return None
    _, blocking, (pm, pn) = best
    if c.m * c.n * c.k < MIN_EFFICIENCY * pm * pn * pk:
        return None
    return MatrixMapping(unit.name, op, blocking, (pm, pn, pk), _cycles(c, op, blocking, (pm, pn, pk)))


def _cycles(c: Contraction, op: UnitOp, blocking: tuple[int, int], padded: tuple[int, int, int]) -> float:
    """The time model: the padded products at the unit's rate, plus the copies made per call
    (the rhs packed into k-panels; an operand padded to whole blocks) at
    ``_COPY_BYTES_PER_CYCLE``, plus operands streamed again at ``_STREAM_BYTES_PER_CYCLE``: a
    packed copy of the rhs read back, a rhs read as rows once more for each further block of
    rows (16 x 1024 x 1024 bf16 in blocks of 2 rows ran 2.5x as long as AMX; int8 4 x 1024 x
    1024 on AMX, B packed then read back, 2.6x as long as on VPDPBUSD reading B once), or,
    where the kernel packs the rhs block by block, the lhs once more for each further block
    of columns. A unit of unknown rate takes 1 multiply-add a cycle."""
    pm, pn, pk = padded
    mb, nb = blocking
    products = pm * pn * pk / (op.macs_per_cycle or 1)
    copied = c.k * c.n if not op.rhs_rows or (pk, pn) != (c.k, c.n) else 0
    copied += c.m * c.k if (pm, pk) != (c.m, c.k) or op.lhs_packed else 0
    packing = 0.0
    if op.rhs_block_bytes:  # each block of B packed in cache as the kernel goes; A read again per block
        packing = c.k * c.n / op.tile.n * _PACK_CYCLES_PER_ROW
        streamed = (pn // (nb * op.tile.n) - 1) * c.m * c.k
    elif op.rhs_rows:  # B's rows read again per block of rows
        streamed = (pm // mb - 1) * c.k * c.n
    else:  # the packed copy of B read back
        streamed = c.k * c.n
    size = _BYTES.get(op.lhs, 4)
    return c.batch * (products + packing + copied * size / _COPY_BYTES_PER_CYCLE
                      + streamed * size / _STREAM_BYTES_PER_CYCLE)


def _unpadded_share(c: Contraction, op: UnitOp, padded: tuple[int, int]) -> float:
    """The share of the unit's time left to the products when a blocking pads rows or columns
    beyond the unit's tiles: each call then copies that operand into a padded buffer, at
    ``_COPY_BYTES_PER_CYCLE``. Few rows do not amortize a copy of B (16 x 2048 x 2048 bf16:
    padding 2048 columns to 2064 for 1 x 3 blocks copied all of B twice, 4x the products)."""
    if not op.macs_per_cycle:
        return 1.0
    products = padded[0] * padded[1] * _round_up(c.k, op.tile.k) / op.macs_per_cycle
    # A packed rhs is copied anyway; one read as rows is copied by any padding of it.
    unpadded_n = c.n if op.rhs_rows else _round_up(c.n, op.tile.n)
    copied = 0
    if padded[0] != _round_up(c.m, op.tile.m):
        copied += c.m * c.k
    if padded[1] != unpadded_n:
        copied += c.k * c.n
    return products / (products + copied * _BYTES[op.lhs] / _COPY_BYTES_PER_CYCLE)


def _is_float(element: str) -> bool:
    return element.startswith(("f", "bf"))


def _round_up(n: int, step: int) -> int:
    return math.ceil(n / step) * step
