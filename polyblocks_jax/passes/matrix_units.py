"""Matrix units: what a target's unit computes, and which contractions map to it.

Target-neutral. A target describes each unit it has as a ``MatrixUnit`` (the host supplies
AMX's and AVX-512 BF16's, a GPU mma.sync's); ``choose_matrix_mapping`` is the cost model,
a pure function of one contraction (a matmul, or a convolution in its matmul form) and a
unit, testable on its own. The stage that applies the choices is ``matrix_forms``.

A mapped contraction runs on padded, packed operands: the lhs as (M, K) rows and the rhs
in the unit's k-packed layout (VNNI: pairs of k for bf16, quads for int8, side by side per
column), both zero-padded to whole tiles, accumulated into a padded accumulator of the
unit's type. The zero padding adds nothing to the sums, so a shape that is not a multiple
of the tile computes exactly the same as one that is.
"""
from __future__ import annotations

import dataclasses
import math

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

    @property
    def operand(self) -> str:
        return self.op.lhs


# A contraction whose padded problem has less than this fraction of useful work stays off
# the unit: AMX does roughly 4-10x the multiply-adds per second of the f32 FMA path, so a
# quarter keeps a margin; a matrix-vector product (one row padded to 16) stays off.
MIN_EFFICIENCY = 0.25
_COPY_BYTES_PER_CYCLE = 16  # a padded copy, read and written once, per core
_BYTES = {"bf16": 2, "f16": 2, "i8": 1}


def unit_operand_types(c: Contraction, precision: str) -> tuple[str, str]:
    """The operand types a unit would be fed: f32 operands become bf16 at mixed precision."""
    if precision == MIXED_BF16_FP32 and (c.lhs, c.rhs, c.accumulate) == ("f32", "f32", "f32"):
        return "bf16", "bf16"
    return c.lhs, c.rhs


def choose_matrix_mapping(c: Contraction, unit: MatrixUnit, precision: str = FP32) -> MatrixMapping | None:
    """Map ``c`` onto ``unit``, or None when the unit does not compute its types or would waste
    most of its work on padding.

    The unit's product must take the (precision-adjusted) operand types and accumulate in the
    contraction's own accumulator type, so the result is what the program asks for. Register
    blocking: a block of mb x nb accumulator tiles reuses each loaded lhs tile nb times and
    each rhs tile mb times; it must fit with its mb + nb operand tiles in the unit's
    registers. The block with the most reuse per loaded tile wins, discounted by the
    padding it adds, in products and in padded copies (AMX's 8 tiles: 2 x 2 accumulators +
    2 lhs + 2 rhs tiles).
    """
    lhs, rhs = unit_operand_types(c, precision)
    op = unit.op_for(lhs, rhs)
    if op is None or op.accumulate != c.accumulate or min(c.m, c.n, c.k) < 1:
        return None
    t = op.tile
    best: tuple[float, tuple[int, int], tuple[int, int]] | None = None
    for mb in range(1, unit.tile_registers):
        for nb in range(1, unit.tile_registers):
            if mb * nb + mb + nb > unit.tile_registers:
                continue
            padded = (_round_up(c.m, mb * t.m), _round_up(c.n, nb * t.n))
            score = (mb * nb / (mb + nb)) * (c.m / padded[0]) * (c.n / padded[1]) * _unpadded_share(c, op, padded)
            if best is None or score > best[0] + 1e-9:
                best = (score, (mb, nb), padded)
    if best is None:
        return None
    _, blocking, (pm, pn) = best
    pk = _round_up(c.k, t.k)
    if c.m * c.n * c.k < MIN_EFFICIENCY * pm * pn * pk:
        return None
    return MatrixMapping(unit.name, op, blocking, (pm, pn, pk))


def _unpadded_share(c: Contraction, op: UnitOp, padded: tuple[int, int]) -> float:
    """The share of the unit's time left to the products when a blocking pads rows or columns
    beyond the unit's tiles: each call then copies that operand into a padded buffer, at
    ``_COPY_BYTES_PER_CYCLE``. Few rows do not amortize a copy of B (16 x 2048 x 2048 bf16:
    padding 2048 columns to 2064 for 1 x 3 blocks copied all of B twice, 4x the products)."""
    if not op.macs_per_cycle:
        return 1.0
    products = padded[0] * padded[1] * _round_up(c.k, op.tile.k) / op.macs_per_cycle
    copied = 0
    if padded[0] != _round_up(c.m, op.tile.m):
        copied += c.m * c.k
    if padded[1] != _round_up(c.n, op.tile.n):
        copied += c.k * c.n
    return products / (products + copied * _BYTES[op.lhs] / _COPY_BYTES_PER_CYCLE)


def _round_up(n: int, step: int) -> int:
    return math.ceil(n / step) * step
