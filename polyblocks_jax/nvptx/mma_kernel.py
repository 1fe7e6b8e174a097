"""The tensor-core matmul kernel, as MLIR text: a gpu.launch of mma.sync warps.

One block computes a (block m x block n) tile of C, one warp a (warp m x warp n) part of
it held in registers as m16n8 accumulator fragments. The k dimension is walked in k
tiles through a ring of ``stages`` shared-memory buffers filled by cp.async
(nvgpu.device_async_copy, 16 bytes a thread, L1 bypassed): while the block multiplies
tile kt, the copies of the next ``stages - 1`` tiles are in flight. Fragments come from
shared memory by ldmatrix (transposed for B, which is k-major); f32 operands (tf32) read
B by plain loads, as ldmatrix cannot transpose 32-bit elements. Shared rows are padded by
16 bytes so that the eight rows one ldmatrix reads fall in distinct banks.

A convolution is the same kernel with A read from the input image (implicit GEMM, no
im2col buffer): each 16-byte chunk of an A row is 8 (bf16) or 4 (f32) channels of one
input pixel, so the channel count must be a multiple of a chunk.

Edges: rows of A beyond m, columns of B beyond n and k beyond k read as zeros (cp.async
with a source size of 0, from a clamped in-bounds address), and C is stored under a
bound check; the caller guarantees 16-byte aligned rows (k and n multiples of a copy).
With an epilogue (epilogue.py), each accumulator goes through C's elementwise consumer
under the same check instead: its other operands loaded, its results stored, C written
only when it outlives the consumer.
Upstream has the pieces (nvgpu, nvvm ops) but no pass that builds this kernel for bf16
with f32 accumulators (nvgpu.mma.sync and rewrite_matmul_as_mma_sync take f16 only).
"""
from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Union

from polyblocks_jax.nvptx.mma_tiles import COPY_BYTES, MmaTiles

if TYPE_CHECKING:
    from polyblocks_jax.nvptx.epilogue import Epilogue

Value = Union[int, str]  # a Python int folds; a str is an SSA name of type index
_SHARED = "#gpu.address_space<workgroup>"
_ACC = "!llvm.struct<(f32, f32, f32, f32)>"


@dataclasses.dataclass(frozen=True)
class ConvWindow:
    """A read from an NHWC input (implicit GEMM): row m = (image, oy, ox), column k = (ky, kx, channel),
    A[m, k] = input[image, oy * stride + ky * dilation, ox * stride + kx * dilation, channel]."""
    output: tuple[int, int]     # (oh, ow)
    kernel: tuple[int, int]     # (kh, kw)
    channels: int
    strides: tuple[int, int]
    dilations: tuple[int, int]


@dataclasses.dataclass(frozen=True)
class MmaProblem:
    """C = init + A @ B with C f32: (batch...) x m x k times (batch...) x k x n, rows of stride 1."""
    m: int
    n: int
    k: int
    batch: tuple[int, ...]        # leading dimensions of all three operands; () for matrices
    operand: str                  # "bf16", "f16", or "tf32" (f32 operands)
    instruction: tuple[int, int, int]  # the mma shape (m, n, k): m16n8k16, or m16n8k8 for tf32
    types: tuple[str, str, str]   # the MLIR memref types of A (the NHWC input for a convolution), B, C
    init: float                   # the accumulators' first value (the fill of C)
    conv: ConvWindow | None = None
    epilogue: Epilogue | None = None  # C's elementwise consumer, computed before the store

    @property
    def element(self) -> str:
        return "f32" if self.operand == "tf32" else self.operand

    @property
    def operand_bytes(self) -> int:
        return 4 if self.operand == "tf32" else 2


def kernel_function(name: str, problem: MmaProblem, tiles: MmaTiles) -> str:
    """``func.func private @name(A, B, C)`` whose body launches the kernel."""
    return _Kernel(problem, tiles).function(name)


class _Body:
    """SSA text under construction: fresh names, folded integer arithmetic, shared index constants."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.constants: dict[int, str] = {}
        self.count = 0
        self.depth = 2

    def let(self, rhs: str) -> str:
        self.count += 1
        name = f"%v{self.count}"
        self.lines.append("  " * self.depth + f"{name} = {rhs}")
        return name

    def do(self, text: str) -> None:
        self.lines.append("  " * self.depth + text)

    def index(self, value: Value) -> str:
        if isinstance(value, str):
            return value
        if value not in self.constants:
            self.constants[value] = f"%c{value}".replace("-", "m")
        return self.constants[value]

    def constant_lines(self) -> list[str]:
        return [f"    {name} = arith.constant {v} : index" for v, name in sorted(self.constants.items())]

    def add(self, a: Value, b: Value) -> Value:
        if isinstance(a, int) and isinstance(b, int):
            return a + b
        if b == 0 or a == 0:
            return a if b == 0 else b
        return self.let(f"arith.addi {self.index(a)}, {self.index(b)} : index")

    def mul(self, a: Value, b: int) -> Value:
        if isinstance(a, int):
            return a * b
        return a if b == 1 else self.let(f"arith.muli {a}, {self.index(b)} : index")

    def div(self, a: Value, b: int) -> Value:
        return a // b if isinstance(a, int) else self.let(f"arith.divui {a}, {self.index(b)} : index")

    def rem(self, a: Value, b: int) -> Value:
        return a % b if isinstance(a, int) else self.let(f"arith.remui {a}, {self.index(b)} : index")

    def min(self, a: Value, b: int) -> Value:
        return min(a, b) if isinstance(a, int) else self.let(f"arith.minui {a}, {self.index(b)} : index")

    def xor(self, a: Value, b: Value) -> Value:
        if isinstance(a, int) and isinstance(b, int):
            return a ^ b
        return self.let(f"arith.xori {self.index(a)}, {self.index(b)} : index")

    def less(self, a: Value, b: int) -> str:
        return self.let(f"arith.cmpi ult, {self.index(a)}, {self.index(b)} : index")

    def both(self, a: str | None, b: str | None) -> str | None:
        return b if a is None else a if b is None else self.let(f"arith.andi {a}, {b} : i1")


class _Kernel:
    def __init__(self, problem: MmaProblem, tiles: MmaTiles) -> None:
        if not tiles.copies_divide(problem.operand_bytes) or tiles.warp[1] % 16:
            raise ValueError(f"{tiles}: tiles whose copies do not divide among threads, or odd n8 fragments")
        self.p, self.t, self.b = problem, tiles, _Body()
        self.bm, self.bn, self.bk = tiles.block
        self.per_copy = COPY_BYTES // problem.operand_bytes
        self.k_tiles = -(-problem.k // self.bk)
        a_row, b_row = tiles.padded_rows(problem.operand_bytes)
        s, e = tiles.stages, problem.element
        self.shared_a = f"memref<{s}x{self.bm}x{a_row}x{e}, {_SHARED}>"
        self.shared_b = f"memref<{s}x{self.bk}x{b_row}x{e}, {_SHARED}>"
        self.b_offset = s * self.bm * a_row * problem.operand_bytes

    def function(self, name: str) -> str:
        p, t, b = self.p, self.t, self.b
        body = self._body()
        grid = (-(-p.n // self.bn), -(-p.m // self.bm), math.prod(p.batch))
        shared = t.shared_bytes(p.operand_bytes)
        extra = "".join(f", %E{i}: {p.epilogue.operands[i]}" for i in p.epilogue.extra) if p.epilogue else ""
        head = [
            f"func.func private @{name}(%A: {p.types[0]}, %B: {p.types[1]}, %C: {p.types[2]}{extra}) {{",
            "  %one = arith.constant 1 : index",
            *[f"  %grid{i} = arith.constant {g} : index" for i, g in enumerate(grid)],
            f"  %threads = arith.constant {t.threads} : index",
            f"  %shared = arith.constant {shared} : i32",
            "  gpu.launch blocks(%bx, %by, %bz) in (%gx = %grid0, %gy = %grid1, %gz = %grid2) "
            "threads(%tx, %ty, %tz) in (%sx = %threads, %sy = %one, %sz = %one) "
            "dynamic_shared_memory_size %shared {",
        ]
        return "\n".join(head + b.constant_lines() + body + ["    gpu.terminator", "  }", "  return", "}"])

    def _body(self) -> list[str]:
        b, t = self.b, self.t
        b.do(f"%smem = gpu.dynamic_shared_memory : memref<?xi8, {_SHARED}>")
        self._shared_views(0)
        warp, lane = b.div("%tx", 32), b.rem("%tx", 32)
        self.warp_m = b.mul(b.div(warp, t.warps[1]), t.warp[0])
        self.warp_n = b.mul(b.rem(warp, t.warps[1]), t.warp[1])
        self.lane = lane
        self.m0, self.n0 = b.mul("%by", self.bm), b.mul("%bx", self.bn)
        self.batch = self._delinearize("%bz", self.p.batch)
        self.a_chunks = self._chunks(self.bm, self.bk)
        self.b_chunks = self._chunks(self.bk, self.bn)
        self.a_rows = [self._a_row(b.add(self.m0, row)) for row, _ in self.a_chunks]
        first = None
        for s in range(t.stages - 1):  # the pipeline's prologue: k tiles 0 .. stages-2
            group = self._copy_tile(s, s)
            first = first or group
        acc = self._main_loop(first)
        b.do(f"nvgpu.device_async_wait {first} {{numGroups = 0 : i32}}")
        self._store(acc)
        return b.lines

    def _shared_views(self, base: Value) -> None:
        """%As and %Bs: the A and B tiles' rings, from byte ``base`` of the dynamic shared memory."""
        b = self.b
        b.do(f"%As = memref.view %smem[{b.index(base)}][] : memref<?xi8, {_SHARED}> to {self.shared_a}")
        b.do(f"%Bs = memref.view %smem[{b.index(b.add(base, self.b_offset))}][] : memref<?xi8, {_SHARED}> "
             f"to {self.shared_b}")

    def _a_slot(self, stage: Value, row: Value, col: Value) -> list[Value]:
        """Where in %As the chunk at (row, col) of an A tile goes."""
        return [stage, row, col]

    def _b_slot(self, stage: Value, row: Value, col: Value) -> list[Value]:
        return [stage, row, col]

    def _chunks(self, rows: int, cols: int) -> list[tuple[Value, Value]]:
        """(row, column) in a rows x cols tile of each 16-byte chunk this thread copies."""
        per_row = cols // self.per_copy
        chunks = []
        for i in range(rows * per_row // self.t.threads):
            c = self.b.add("%tx", i * self.t.threads)
            chunks.append((self.b.div(c, per_row), self.b.mul(self.b.rem(c, per_row), self.per_copy)))
        return chunks

    def _copy_tile(self, kt: Value, stage: Value) -> str:
        """cp.async of k tile ``kt`` of A and B into ``stage``; returns the group's token.

        A ``kt`` past the last k tile (the pipeline's overrun) copies nothing: zero bytes
        from the last tile's address.
        """
        b, p = self.b, self.p
        exists = None if isinstance(kt, int) and kt < self.k_tiles else b.less(kt, self.k_tiles)
        kt = b.min(kt, self.k_tiles - 1)
        k0 = b.mul(kt, self.bk)
        tokens = []
        for (row, col), a_row in zip(self.a_chunks, self.a_rows):
            m, k = b.add(self.m0, row), b.add(k0, col)
            valid = b.both(b.both(exists, self._inside(m, p.m, self.bm)), self._inside(k, p.k, self.bk))
            src = self._a_indices(a_row, b.min(k, p.k - self.per_copy) if p.k % self.bk else k)
            tokens.append(self._async_copy("%A", src, "%As", self._a_slot(stage, row, col), valid, 0))
        for row, col in self.b_chunks:
            k, n = b.add(k0, row), b.add(self.n0, col)
            valid = b.both(b.both(exists, self._inside(k, p.k, self.bk)), self._inside(n, p.n, self.bn))
            src = self._indices(b.min(k, p.k - 1) if p.k % self.bk else k,
                                b.min(n, p.n - self.per_copy) if p.n % self.bn else n)
            tokens.append(self._async_copy("%B", src, "%Bs", self._b_slot(stage, row, col), valid, 1))
        return b.let(f"nvgpu.device_async_create_group {', '.join(tokens)}")

    def _a_row(self, m: Value) -> list[Value]:
        """What locates row ``m`` of A (clamped into A): its index, or a convolution's (image, y, x) origin."""
        b, p = self.b, self.p
        m = b.min(m, p.m - 1) if p.m % self.bm else m
        if p.conv is None:
            return [m]
        image, oy, ox = self._delinearize(m, (p.m, *p.conv.output))
        return [image, b.mul(oy, p.conv.strides[0]), b.mul(ox, p.conv.strides[1])]

    def _a_indices(self, a_row: list[Value], k: Value) -> list[Value]:
        b, conv = self.b, self.p.conv
        if conv is None:
            return self._indices(a_row[0], k)
        ky, kx, channel = self._delinearize(k, (*conv.kernel, conv.channels))
        image, y, x = a_row
        return [image, b.add(y, b.mul(ky, conv.dilations[0])), b.add(x, b.mul(kx, conv.dilations[1])), channel]

    def _inside(self, index: Value, size: int, tile: int) -> str | None:
        """``index < size``, or None where tiles divide ``size`` (always true)."""
        return self.b.less(index, size) if size % tile else None

    def _delinearize(self, linear: Value, sizes: tuple[int, ...]) -> list[Value]:
        """Row-major indices of ``linear`` in a box of ``sizes``."""
        indices: list[Value] = []
        for d in reversed(range(len(sizes))):
            indices.insert(0, self.b.rem(linear, sizes[d]) if d else linear)
            linear = self.b.div(linear, sizes[d]) if d else linear
        return indices

    def _indices(self, row: Value, col: Value) -> list[Value]:
        return self.batch + [row, col]

    def _async_copy(self, src: str, src_idx: list[Value], dst: str, dst_idx: list[Value], valid: str | None,
                    operand: int) -> str:
        b = self.b
        count = ""
        if valid is not None:
            count = ", " + b.let(f"arith.select {valid}, {b.index(self.per_copy)}, {b.index(0)} : index")
        shared = self.shared_a if operand == 0 else self.shared_b
        return b.let(f"nvgpu.device_async_copy {src}[{', '.join(b.index(i) for i in src_idx)}], "
                     f"{dst}[{', '.join(b.index(i) for i in dst_idx)}], {self.per_copy}{count} {{bypassL1}} "
                     f": {self.p.types[operand]} to {shared}")

    def _main_loop(self, token: str) -> list[str]:
        """The k loop; returns the accumulators' final SSA names."""
        b, t = self.b, self.t
        count = (t.warp[0] // 16) * (t.warp[1] // 8) * 4
        init = b.let(f"arith.constant {float(self.p.init)!r} : f32")
        iter_args = ", ".join(f"%acc{i} = {init}" for i in range(count))
        b.do(f"%acc:{count} = scf.for %kt = {b.index(0)} to {b.index(self.k_tiles)} step {b.index(1)} "
             f"iter_args({iter_args}) -> ({', '.join(['f32'] * count)}) {{")
        b.depth += 1
        b.do(f"nvgpu.device_async_wait {token} {{numGroups = {t.stages - 2} : i32}}")
        b.do("gpu.barrier")  # tile kt landed for every thread; every warp is done with tile kt-1's stage
        ahead = b.add("%kt", t.stages - 1)
        self._copy_tile(ahead, b.rem(ahead, t.stages))
        acc = self._multiply(b.rem("%kt", t.stages), [f"%acc{i}" for i in range(count)])
        b.do(f"scf.yield {', '.join(acc)} : {', '.join(['f32'] * count)}")
        b.depth -= 1
        b.do("}")
        return [f"%acc#{i}" for i in range(count)]

    def _multiply(self, stage: Value, acc: list[str]) -> list[str]:
        """One k tile of the warp's product from shared-memory stage ``stage``."""
        b, (fm, fn) = self.b, (self.t.warp[0] // 16, self.t.warp[1] // 8)
        ik = self.p.instruction[2]
        a_row = b.add(self.warp_m, b.rem(self.lane, 16))
        a_col = b.mul(b.div(self.lane, 16), ik // 2)
        for ks in range(self.bk // ik):
            a = [self._ldmatrix("%As", self.shared_a, [stage, b.add(a_row, 16 * i), b.add(a_col, ks * ik)], False)
                 for i in range(fm)]
            bs = self._b_fragments(stage, ks * ik, fn)
            for i in range(fm):
                for j in range(fn):
                    at = 4 * (i * fn + j)
                    acc[at:at + 4] = self._mma(a[i], bs[j], acc[at:at + 4])
        return acc

    def _b_fragments(self, stage: Value, k0: int, fn: int) -> list[list[str]]:
        """Per n8 fragment, its two B registers: ldmatrix.trans by pairs, or tf32 loads."""
        b = self.b
        if self.p.operand != "tf32":
            row = b.add(b.rem(self.lane, 16), k0)
            col = b.add(self.warp_n, b.mul(b.div(self.lane, 16), 8))
            frags = []
            for pair in range(fn // 2):
                regs = self._ldmatrix("%Bs", self.shared_b, [stage, row, b.add(col, 16 * pair)], True)
                frags += [regs[:2], regs[2:]]
            return frags
        row = b.add(b.rem(self.lane, 4), k0)
        col = b.add(self.warp_n, b.div(self.lane, 4))
        return [[self._bits(b.let(f"memref.load %Bs[{b.index(stage)}, {b.index(b.add(row, 4 * h))}, "
                                  f"{b.index(b.add(col, 8 * j))}] : {self.shared_b}"), "f32")
                 for h in range(2)] for j in range(fn)]

    def _ldmatrix(self, memref: str, type_: str, idx: list[Value], transpose: bool) -> list[str]:
        """Four 8x8 b16 matrices -> this lane's four 32-bit registers, as mma operands."""
        b, e = self.b, self.p.element
        lanes = 1 if e == "f32" else 2
        vector = b.let(f"nvgpu.ldmatrix {memref}[{', '.join(b.index(i) for i in idx)}] "
                       f"{{numTiles = 4 : i32, transpose = {str(transpose).lower()}}} : {type_} -> vector<4x{lanes}x{e}>")
        regs = []
        for r in range(4):
            if e == "f32":
                regs.append(self._bits(b.let(f"vector.extract {vector}[{r}, 0] : f32 from vector<4x1xf32>"), "f32"))
                continue
            pair = b.let(f"vector.extract {vector}[{r}] : vector<2x{e}> from vector<4x2x{e}>")
            regs.append(pair if e == "f16" else self._bits(pair, "vector<2xbf16>"))
        return regs

    def _bits(self, value: str, type_: str) -> str:
        return self.b.let(f"llvm.bitcast {value} : {type_} to i32")

    def _mma(self, a: list[str], b_regs: list[str], c: list[str]) -> list[str]:
        p, b = self.p, self.b
        ptx = p.operand
        operand_type = "vector<2xf16>" if ptx == "f16" else "i32"
        m, n, k = p.instruction
        d = b.let(f"nvvm.mma.sync A[{', '.join(a)}] B[{', '.join(b_regs)}] C[{', '.join(c)}] "
                  f"{{layoutA = #nvvm.mma_layout<row>, layoutB = #nvvm.mma_layout<col>, "
                  f"multiplicandAPtxType = #nvvm.mma_type<{ptx}>, multiplicandBPtxType = #nvvm.mma_type<{ptx}>, "
                  f"shape = #nvvm.shape<m = {m}, n = {n}, k = {k}>}} : ({operand_type}, {operand_type}, f32) -> {_ACC}")
        return [b.let(f"llvm.extractvalue {d}[{i}] : {_ACC}") for i in range(4)]

    def _store(self, acc: list[str]) -> None:
        """Each lane's accumulator pairs (rows lane/4 and lane/4 + 8, columns 2 (lane % 4) + 0, 1) to C,
        or through the epilogue."""
        b, p, t = self.b, self.p, self.t
        row0 = b.add(b.add(self.m0, self.warp_m), b.div(self.lane, 4))
        col0 = b.add(b.add(self.n0, self.warp_n), b.mul(b.rem(self.lane, 4), 2))
        fn = t.warp[1] // 8
        for i in range(t.warp[0] // 16):
            for j in range(fn):
                for h in range(2):
                    row, col = b.add(row0, 16 * i + 8 * h), b.add(col0, 8 * j)
                    first = 4 * (i * fn + j) + 2 * h
                    inside = b.both(self._inside(row, p.m, self.bm), self._inside(col, p.n, self.bn))
                    if inside is not None:
                        b.do(f"scf.if {inside} {{")
                        b.depth += 1
                    self._store_pair(row, col, acc[first:first + 2])
                    if inside is not None:
                        b.depth -= 1
                        b.do("}")

    def _store_pair(self, row: Value, col: Value, pair: list[str]) -> None:
        e = self.p.epilogue
        if e is None or e.store_c:
            self._store_c(row, col, pair)
        if e is not None:
            self._epilogue_pair(row, col, pair)

    def _store_c(self, row: Value, col: Value, pair: list[str]) -> None:
        b, p = self.b, self.p
        vector = b.let(f"vector.from_elements {pair[0]}, {pair[1]} : vector<2xf32>")
        b.do(f"vector.store {vector}, %C[{', '.join(b.index(x) for x in self._indices(row, col))}] "
             f": {p.types[2]}, vector<2xf32>")

    def _epilogue_pair(self, row: Value, col: Value, pair: list[str]) -> None:
        """The consumer's body on accumulators ``pair`` at C[row, col and col + 1] (the kernel's view of C):
        its other operands loaded at the same points of the loops, its results stored; as pairs of
        elements where an operand's rows hold them side by side (``Epilogue.paired``)."""
        b, e = self.b, self.p.epilogue
        loops = [self._loops(self._indices(row, b.add(col, j))) for j in range(2)]
        loaded: list[dict[int, str]] = [{i: acc for i in e.c_operands} for acc in pair]
        results: list[list[str]] = [[], []]

        def at(operand: int, j: int) -> str:
            return ", ".join(b.index(0 if d is None else loops[j][d]) for d in e.dims[operand])

        def value(ref: tuple[str, int], j: int) -> str:
            kind, i = ref
            if kind == "op":
                return results[j][i]
            if i not in loaded[j]:
                self._load_pair(i, at, loaded)
            return loaded[j][i]

        for j in range(2):
            for op in e.ops:
                operands = ", ".join(value(r, j) for r in op.operands)
                results[j].append(b.let(f'"{op.name}"({operands}) {{{op.attributes}}} : '
                                        f'({", ".join(op.operand_types)}) -> {op.result_type}'))
        for output, ref in zip(e.outputs, e.yields):
            values = [value(ref, j) for j in range(2)]
            if output in e.c_operands:
                self._store_c(row, col, values)
            elif e.paired[output]:
                element = e.element_types[output]
                vector = b.let(f"vector.from_elements {values[0]}, {values[1]} : vector<2x{element}>")
                b.do(f"vector.store {vector}, %E{output}[{at(output, 0)}] {{alignment = {e.pair_bytes[output]} : i64}} "
                     f": {e.operands[output]}, vector<2x{element}>")
            else:
                for j in range(2):
                    b.do(f"memref.store {values[j]}, %E{output}[{at(output, j)}] : {e.operands[output]}")

    def _load_pair(self, operand: int, at, loaded: list[dict[int, str]]) -> None:
        """Operand ``operand`` at both elements: one load of a pair, or of one element both share, or two."""
        b, e = self.b, self.p.epilogue
        if e.paired[operand]:
            element = e.element_types[operand]
            vector = b.let(f"vector.load %E{operand}[{at(operand, 0)}] {{alignment = {e.pair_bytes[operand]} : i64}} "
                           f": {e.operands[operand]}, vector<2x{element}>")
            for j in range(2):
                loaded[j][operand] = b.let(f"vector.extract {vector}[{j}] : {element} from vector<2x{element}>")
        elif e.c_groups[-1] == (len(e.c_shape) - 1,) and len(e.c_shape) - 1 not in e.dims[operand]:
            # constant along C's last dimension, the one the two elements differ in: both read one element
            loaded[0][operand] = loaded[1][operand] = b.let(f"memref.load %E{operand}[{at(operand, 0)}] "
                                                            f": {e.operands[operand]}")
        else:
            for j in range(2):
                loaded[j][operand] = b.let(f"memref.load %E{operand}[{at(operand, j)}] : {e.operands[operand]}")

    def _loops(self, c_indices: list[Value]) -> list[Value]:
        """The consumer's loop indices at C[c_indices] (the kernel's view of C merges C's dimensions)."""
        e, loops = self.p.epilogue, []
        for index, group in zip(c_indices, e.c_groups):
            loops += self._delinearize(index, tuple(e.c_shape[d] for d in group))
        return loops
