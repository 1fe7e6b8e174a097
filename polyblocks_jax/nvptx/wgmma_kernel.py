"""The warpgroup matmul kernel (sm_90a), as MLIR text: a gpu.launch of wgmma.mma_async warpgroups.

The mma.sync kernel (mma_kernel.py) with another inner product: a block is 1 or 2
warpgroups (128 threads each) stacked along m, each computing m64 x n (n up to 256) with
``nvvm.wgmma.mma_async``, which reads both operands straight from shared memory through
64-bit matrix descriptors, so there are no ldmatrix fragments. The k tile is one 128-byte
row (64 16-bit elements) and the tiles are stored 128-byte swizzled (16-byte chunk c of row
r at chunk c ^ (r % 8), within 1 KiB atoms aligned to 1 KiB):
- A, K-major ("row"): %As[stage, m, k]; its descriptor: rows 128 bytes apart, 8-row groups
  1 KiB apart (stride byte offset), leading byte offset unused;
- B, N-major ("row", wgmma transposes it): panels of 64 columns, %Bs[stage, panel, k, n % 64];
  8-row (k) groups 1 KiB apart (stride byte offset), panels a k tile apart (leading byte offset).
A k step of 16 advances A's start by 32 bytes (within the swizzled row) and B's by 16 rows.

Loads stay cp.async (no TMA), with the same ring of stages, edges and implicit-GEMM
addressing as mma_kernel.py; the rings start at the first 1 KiB boundary of the dynamic
shared memory. Per k tile: wait for the tile's copies, fence them to the async proxy
(wgmma reads through it), barrier, issue the next copies, then fence, the k steps'
wgmma, commit and wait for them before the stage is reused. The accumulator is an
``!llvm.struct`` of n / 2 f32 a thread, laid out per warp as mma.sync's m16n8 fragments
side by side (PTX ISA, "wgmma register fragment layout"): the store (and any epilogue)
is mma_kernel.py's.
"""
from __future__ import annotations

from polyblocks_jax.nvptx.mma_kernel import MmaProblem, Value, _Kernel
from polyblocks_jax.nvptx.mma_tiles import SWIZZLE_ATOM_BYTES, WgmmaTiles

_SHARED = "#gpu.address_space<workgroup>"
_ROW_BYTES = 128
_SWIZZLE_128B = 1 << 62
_GROUP_STRIDE = (8 * _ROW_BYTES >> 4) << 32  # stride byte offset: 8 rows of 128 bytes


def wgmma_kernel_function(name: str, problem: MmaProblem, tiles: WgmmaTiles) -> str:
    """``func.func private @name(A, B, C[, epilogue operands])`` whose body launches the kernel."""
    return _WgmmaKernel(problem, tiles).function(name)


class _WgmmaKernel(_Kernel):
    def __init__(self, problem: MmaProblem, tiles: WgmmaTiles) -> None:
        if problem.operand not in ("bf16", "f16") or tiles.block[2] * problem.operand_bytes != _ROW_BYTES:
            raise ValueError(f"{tiles}: wgmma takes 16-bit operands in k tiles of one 128-byte row")
        if tiles.block[0] % 64 or tiles.block[1] % 64 or tiles.warp != (16, tiles.block[1]):
            raise ValueError(f"{tiles}: not m64 warpgroups of 64-column panels")
        super().__init__(problem, tiles)
        s, e, panels = tiles.stages, problem.element, self.bn // 64
        self.shared_a = f"memref<{s}x{self.bm}x{self.bk}x{e}, {_SHARED}>"
        self.shared_b = f"memref<{s}x{panels}x{self.bk}x64x{e}, {_SHARED}>"
        self.a_stage_bytes = self.bm * _ROW_BYTES
        self.b_stage_bytes = panels * self.bk * _ROW_BYTES
        self.b_offset = s * self.a_stage_bytes

    def _shared_views(self, base: Value) -> None:
        """The rings from the first 1 KiB boundary: ``base`` is the dynamic shared memory's start."""
        b = self.b
        b.do(f"%smem_at = memref.extract_aligned_pointer_as_index %smem : memref<?xi8, {_SHARED}> -> index")
        self.aligned = b.mul(b.div(b.add("%smem_at", SWIZZLE_ATOM_BYTES - 1), SWIZZLE_ATOM_BYTES),
                             SWIZZLE_ATOM_BYTES)  # the shared address of %As
        super()._shared_views(b.let(f"arith.subi {self.aligned}, %smem_at : index"))

    def _a_slot(self, stage: Value, row: Value, col: Value) -> list[Value]:
        return [stage, row, self._swizzled(row, col)]

    def _b_slot(self, stage: Value, row: Value, col: Value) -> list[Value]:
        b = self.b
        return [stage, b.div(col, 64), row, self._swizzled(row, b.rem(col, 64))]

    def _swizzled(self, row: Value, col: Value) -> Value:
        """Column ``col`` (a chunk's first element) of ``row`` in a 128-byte swizzled row."""
        b, per_chunk = self.b, self.per_copy
        return b.mul(b.xor(b.div(col, per_chunk), b.rem(row, 8)), per_chunk)

    def _main_loop(self, token: str) -> list[str]:
        b, t = self.b, self.t
        count = self.bn // 2
        acc_type = f"!llvm.struct<({', '.join(['f32'] * count)})>"
        init = b.let(f"arith.constant {float(self.p.init)!r} : f32")
        # The struct to fill: an empty asm's outputs, not llvm.mlir.undef, which canonicalization would hoist
        # out of the launch as a constant (and outlining then pass as an argument).
        constraints = ",".join(["=f"] * count)
        acc = b.let(f'llvm.inline_asm "", "{constraints}" : () -> {acc_type}')
        for i in range(count):
            acc = b.let(f"llvm.insertvalue {init}, {acc}[{i}] : {acc_type}")
        b.do(f"%acc = scf.for %kt = {b.index(0)} to {b.index(self.k_tiles)} step {b.index(1)} "
             f"iter_args(%acc0 = {acc}) -> ({acc_type}) {{")
        b.depth += 1
        b.do(f"nvgpu.device_async_wait {token} {{numGroups = {t.stages - 2} : i32}}")
        b.do("nvvm.fence.proxy {kind = #nvvm.proxy_kind<async.shared>, space = #nvvm.shared_space<cta>}")
        b.do("gpu.barrier")  # tile kt landed for every thread; every warpgroup is done with tile kt-1's stage
        ahead = b.add("%kt", t.stages - 1)
        self._copy_tile(ahead, b.rem(ahead, t.stages))
        stage = b.rem("%kt", t.stages)
        a_start = b.add(b.add(self.aligned, b.mul(stage, self.a_stage_bytes)),
                        b.mul(b.div("%tx", 128), 64 * _ROW_BYTES))  # this warpgroup's m64 rows
        b_start = b.add(b.add(self.aligned, self.b_offset), b.mul(stage, self.b_stage_bytes))
        b_panels = ((self.bk * _ROW_BYTES) >> 4) << 16  # leading byte offset: from a panel to the next
        b.do("nvvm.wgmma.fence.aligned")
        acc = "%acc0"
        element = self.p.element
        for ks in range(self.bk // 16):
            a_desc = self._descriptor(b.add(a_start, ks * 32), _SWIZZLE_128B | _GROUP_STRIDE | 1 << 16)
            b_desc = self._descriptor(b.add(b_start, ks * 16 * _ROW_BYTES), _SWIZZLE_128B | _GROUP_STRIDE | b_panels)
            acc = b.let(f"nvvm.wgmma.mma_async {a_desc}, {b_desc}, {acc}, "
                        f"#nvvm.shape<m = 64, n = {self.bn}, k = 16>, "
                        f"D [<f32>, #nvvm.wgmma_scale_out<one>, <wrapped>], "
                        f"A [<{element}>, #nvvm.wgmma_scale_in<one>, <row>], "
                        f"B [<{element}>, #nvvm.wgmma_scale_in<one>, <row>] : {acc_type} -> {acc_type}")
        b.do("nvvm.wgmma.commit.group.sync.aligned")
        b.do("nvvm.wgmma.wait.group.sync.aligned 0")  # the stage is overwritten by the next k tile's copies
        b.do(f"scf.yield {acc} : {acc_type}")
        b.depth -= 1
        b.do("}")
        return [b.let(f"llvm.extractvalue %acc[{i}] : {acc_type}") for i in range(count)]

    def _descriptor(self, address: Value, fields: int) -> str:
        """A shared-memory matrix descriptor: ``fields`` with the start address (in 16 bytes) in bits 0-13."""
        b = self.b
        start = b.let(f"arith.index_cast {b.index(b.div(address, 16))} : index to i64")
        constant = b.let(f"arith.constant {fields} : i64")
        return b.let(f"arith.addi {start}, {constant} : i64")
