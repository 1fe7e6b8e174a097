"""A numpy emulator of the tensor-core kernels' gpu.launch, to check them without a GPU.

Every thread of a block runs in lockstep: a value is an array over the block's threads.
The instructions follow the PTX ISA's definitions, written here independently of the
kernel generator: ldmatrix (each lane's row address, each lane's share of the 8x8
matrices, .trans), mma.sync m16n8k16 (bf16, f16) and m16n8k8 (tf32: operands keep their
top 19 bits) fragment layouts, and cp.async as an asynchronous copy: its destination reads
as NaN until a cp.async.wait_group completes its group, so a wrong wait count or stage
index shows up as NaN or wrong sums in the result. Only what those kernels use is known.
"""
from __future__ import annotations

import math

import ml_dtypes
import numpy as np
from mlir import ir

_NUMPY = {"bf16": ml_dtypes.bfloat16, "f16": np.float16, "f32": np.float32}
_INTEGER_OPS = {"arith.addi": np.add, "arith.muli": np.multiply, "arith.divui": np.floor_divide,
                "arith.remui": np.remainder, "arith.minui": np.minimum, "arith.andi": np.logical_and,
                "arith.xori": np.bitwise_xor, "arith.subi": np.subtract}
# Where the dynamic shared memory starts in the block's shared window: not on a 1 KiB boundary, so
# that a kernel which needs one (wgmma's swizzled tiles) must align its own.
SHARED_BASE = 16
_FLOAT_OPS = {"arith.addf": np.add, "arith.subf": np.subtract, "arith.mulf": np.multiply, "arith.divf": np.divide,
              "arith.maximumf": np.maximum, "arith.minimumf": np.minimum, "arith.maxnumf": np.fmax,
              "arith.minnumf": np.fmin, "arith.negf": np.negative, "arith.truncf": lambda x: x,
              "arith.extf": lambda x: x, "math.absf": np.abs, "math.exp": np.exp, "math.tanh": np.tanh,
              "math.log": np.log, "math.sqrt": np.sqrt, "math.rsqrt": lambda x: 1 / np.sqrt(x),
              "math.erf": np.vectorize(math.erf), "math.fma": lambda a, b, c: a * b + c}
# arith.cmpf predicates by number (ordered: false on NaN; unordered: true), as arith's CmpFPredicate.
_CMPF = {1: np.equal, 2: np.greater, 3: np.greater_equal, 4: np.less, 5: np.less_equal, 6: np.not_equal}


def run_launch(launch: ir.Operation, memrefs: dict) -> None:
    """Run ``launch`` (a gpu.launch) with ``memrefs`` mapping its outer memref values to numpy arrays."""
    grid = [_constant(v) for v in launch.operands[0:3]]
    threads = _constant(launch.operands[3])
    shared_bytes = _constant(launch.operands[6])
    block = launch.regions[0].blocks[0]
    for bz in range(grid[2]):
        for by in range(grid[1]):
            for bx in range(grid[0]):
                env = dict(memrefs)
                ids = [bx, by, bz, np.arange(threads), 0, 0] + [grid[0], grid[1], grid[2], threads, 1, 1]
                for arg, value in zip(block.arguments, ids):
                    env[arg] = np.broadcast_to(np.asarray(value), (threads,)) if np.ndim(value) == 0 else value
                _Block(threads, shared_bytes, env).run(block)


def _constant(value: ir.Value) -> int:
    return ir.IntegerAttr(value.owner.attributes["value"]).value


class _Block:
    def __init__(self, threads: int, shared_bytes: int, env: dict) -> None:
        self.t, self.env = threads, env
        self.shared = np.zeros(SHARED_BASE + shared_bytes, np.uint8)
        self.pending: list = []  # closed groups of (destination view, flat indices, data)
        self.open: list = []
        self.mask = np.ones(threads, bool)

    def run(self, block: ir.Block) -> list:
        for op in block.operations:
            op = op.operation
            if op.name == "scf.yield":
                return [self.env[v] for v in op.operands]
            if op.name == "gpu.terminator":
                return []
            if op.name in _INTEGER_OPS:  # on non-negative indices: unsigned and numpy's agree
                results = _INTEGER_OPS[op.name](self._v(op, 0), self._v(op, 1))
            elif op.name in _FLOAT_OPS:  # in f32 (f64 for f64), rounded to the result's type
                wide = [self._v(op, i).astype(np.float64 if self._v(op, i).dtype == np.float64 else np.float32)
                        for i in range(len(op.operands))]
                results = _FLOAT_OPS[op.name](*wide).astype(_dtype(op.result.type))
            else:
                results = getattr(self, "_" + op.name.replace(".", "_"))(op)
            for r, v in zip(op.results, results if isinstance(results, list) else [results]):
                self.env[r] = v
        return []

    def _v(self, op: ir.Operation, i: int):
        return self.env[op.operands[i]]

    # arith
    def _arith_constant(self, op):
        attr = op.attributes["value"]
        if isinstance(op.result.type, (ir.IndexType, ir.IntegerType)):
            return np.full(self.t, ir.IntegerAttr(attr).value, np.int64)
        return np.full(self.t, ir.FloatAttr(attr).value, _dtype(op.result.type))

    def _arith_cmpi(self, op):
        assert ir.IntegerAttr(op.attributes["predicate"]).value == 6, "only ult (predicate 6) is known"
        return self._v(op, 0) < self._v(op, 1)

    def _arith_cmpf(self, op):
        a, b = self._v(op, 0), self._v(op, 1)
        predicate = ir.IntegerAttr(op.attributes["predicate"]).value
        assert predicate in _CMPF, f"arith.cmpf predicate {predicate} not known"
        return _CMPF[predicate](a.astype(np.float32), b.astype(np.float32))

    def _arith_select(self, op):
        return np.where(self._v(op, 0), self._v(op, 1), self._v(op, 2))

    # memory
    def _gpu_dynamic_shared_memory(self, op):
        return "shared"

    def _memref_view(self, op):
        memref = ir.MemRefType(op.result.type)
        offset = SHARED_BASE + int(self._v(op, 1)[0])
        dtype = _NUMPY[str(memref.element_type)]
        count = int(np.prod(memref.shape))
        return self.shared[offset:offset + count * np.dtype(dtype).itemsize].view(dtype).reshape(memref.shape)

    def _memref_extract_aligned_pointer_as_index(self, op):
        assert self._v(op, 0) == "shared", "only the dynamic shared memory's address is known"
        return np.full(self.t, SHARED_BASE, np.int64)

    def _arith_index_cast(self, op):
        return self._v(op, 0).astype(np.int64)

    def _gpu_barrier(self, op):
        return []

    def _nvgpu_device_async_copy(self, op):
        sizes = list(ir.DenseI32ArrayAttr(op.attributes["operandSegmentSizes"]))  # dst, its indices, src, ...
        dst, dst_idx = self._v(op, 0), [self._v(op, 1 + i) for i in range(sizes[1])]
        at = 1 + sizes[1]
        src, src_idx = self._v(op, at), [self._v(op, at + 1 + i) for i in range(sizes[3])]
        count = ir.IntegerAttr(op.attributes["dstElements"]).value
        valid = self._v(op, at + 1 + sizes[3]) if sizes[4] else np.full(self.t, count)
        cols = np.arange(count)
        src_cols = src_idx[-1][:, None] + cols
        assert (src_cols[valid[:, None] > cols] < src.shape[-1]).all(), "cp.async reads past a row"
        data = src[tuple(i[:, None] for i in src_idx[:-1]) + (np.minimum(src_cols, src.shape[-1] - 1),)]
        data = np.where(cols < valid[:, None], data, 0).astype(dst.dtype)
        flat = np.ravel_multi_index(tuple(i[:, None] for i in dst_idx[:-1]) + (dst_idx[-1][:, None] + cols,), dst.shape)
        dst.reshape(-1)[flat] = np.nan  # undefined until its group completes
        self.open.append((dst, flat, data))
        return np.zeros(self.t)

    def _nvgpu_device_async_create_group(self, op):
        self.pending.append(self.open)
        self.open = []
        return np.zeros(self.t)

    def _nvgpu_device_async_wait(self, op):
        keep = ir.IntegerAttr(op.attributes["numGroups"]).value
        done, self.pending = self.pending[:len(self.pending) - keep], self.pending[len(self.pending) - keep:]
        for group in done:
            for dst, flat, data in group:
                dst.reshape(-1)[flat] = data
        return []

    def _memref_load(self, op):
        """Lanes outside the current scf.if read element 0 (their value is never used)."""
        memref = self._v(op, 0)
        return memref[tuple(np.where(self.mask, self._v(op, 1 + i), 0) for i in range(memref.ndim))]

    def _memref_store(self, op):
        value, memref = self._v(op, 0), self._v(op, 1)
        lanes = np.nonzero(self.mask)[0]
        memref[tuple(self._v(op, 2 + i)[lanes] for i in range(memref.ndim))] = value[lanes]
        return []

    def _vector_load(self, op):
        """Lanes outside the current scf.if read from element 0 (their values are never used)."""
        memref, count = self._v(op, 0), ir.VectorType(op.result.type).shape[0]
        idx = [np.where(self.mask, self._v(op, 1 + i), 0) for i in range(memref.ndim)]
        self._check_alignment(op, memref, idx)
        return memref[tuple(i[:, None] for i in idx[:-1]) + (idx[-1][:, None] + np.arange(count),)]

    def _check_alignment(self, op, memref: np.ndarray, idx: list) -> None:
        """An access with an ``alignment`` starts at a multiple of it (the buffers themselves are aligned)."""
        if "alignment" in op.attributes:
            align = ir.IntegerAttr(op.attributes["alignment"]).value
            flat = np.ravel_multi_index(tuple(i[self.mask] for i in idx), memref.shape) * memref.dtype.itemsize
            assert (flat % align == 0).all(), f"{op.name} not aligned to {align} bytes"

    def _vector_store(self, op):
        value, memref = self._v(op, 0), self._v(op, 1)
        idx = [self._v(op, 2 + i) for i in range(memref.ndim)]
        self._check_alignment(op, memref, idx)
        lanes = np.nonzero(self.mask)[0]
        for j in range(value.shape[1]):
            memref[tuple(i[lanes] for i in idx[:-1]) + (idx[-1][lanes] + j,)] = value[lanes, j]
        return []

    # warp-level instructions
    def _nvgpu_ldmatrix(self, op):
        """numTiles 8x8 b16 matrices; matrix j's row r is at lane 8 j + r's address (16 bytes)."""
        memref, tiles = self._v(op, 0), ir.IntegerAttr(op.attributes["numTiles"]).value
        transpose = ir.BoolAttr(op.attributes["transpose"]).value
        idx = [self._v(op, 1 + i) for i in range(memref.ndim)]
        per_row = 16 // memref.dtype.itemsize
        rows = np.ascontiguousarray(memref[tuple(i[:, None] for i in idx[:-1]) + (idx[-1][:, None] + np.arange(per_row),)])
        rows = rows.view(np.uint16).reshape(self.t, 8)  # each lane's 16-byte row, as b16
        lane = np.arange(self.t) % 32
        warp0 = np.arange(self.t) - lane
        out = np.zeros((self.t, tiles, 2), np.uint16)
        for j in range(tiles):
            matrix = rows[warp0[:, None] + 8 * j + np.arange(8)]  # (threads, 8 rows, 8 cols)
            g, c = lane // 4, 2 * (lane % 4)
            for e in range(2):
                out[:, j, e] = (matrix[np.arange(self.t), c + e, g] if transpose
                                else matrix[np.arange(self.t), g, c + e])
        result = ir.VectorType(op.result.type)
        return out.view(_NUMPY[str(result.element_type)]).reshape(self.t, *result.shape)

    def _vector_extract(self, op):
        position = list(ir.DenseI64ArrayAttr(op.attributes["static_position"]))
        return self._v(op, 0)[(slice(None), *position)]

    def _llvm_bitcast(self, op):
        value = np.ascontiguousarray(self._v(op, 0))
        return value.view(np.uint32).reshape(self.t)

    def _vector_from_elements(self, op):
        return np.stack([self._v(op, i) for i in range(len(op.operands))], 1)

    def _llvm_extractvalue(self, op):
        return self._v(op, 0)[:, list(ir.DenseI64ArrayAttr(op.attributes["position"]))[0]]

    def _nvvm_mma_sync(self, op):
        sizes = list(ir.DenseI32ArrayAttr(op.attributes["operandSegmentSizes"]))
        a = [self._v(op, i) for i in range(sizes[0])]
        b = [self._v(op, sizes[0] + i) for i in range(sizes[1])]
        c = [self._v(op, sizes[0] + sizes[1] + i) for i in range(sizes[2])]
        kind = str(op.attributes["multiplicandAPtxType"]).split("<")[1].rstrip(">")
        lane = np.arange(self.t) % 32
        g, t = lane // 4, lane % 4
        warps = self.t // 32
        k = 8 if kind == "tf32" else 16
        A, B = np.zeros((warps, 16, k)), np.zeros((warps, k, 8))
        w = np.arange(self.t) // 32
        if kind == "tf32":  # a0 (g, t), a1 (g+8, t), a2 (g, t+4), a3 (g+8, t+4); b0 (t, g), b1 (t+4, g)
            for r, (dr, dc) in enumerate([(0, 0), (8, 0), (0, 4), (8, 4)]):
                A[w, g + dr, t + dc] = _tf32(a[r])
            for r in range(2):
                B[w, t + 4 * r, g] = _tf32(b[r])
        else:  # a regs: (g, 2t..), (g+8, 2t..), (g, 2t+8..), (g+8, 2t+8..); b regs: (2t.., g), (2t+8.., g)
            pairs_a, pairs_b = [_pair(x, kind) for x in a], [_pair(x, kind) for x in b]
            for r, (dr, dc) in enumerate([(0, 0), (8, 0), (0, 8), (8, 8)]):
                for e in range(2):
                    A[w, g + dr, 2 * t + dc + e] = pairs_a[r][:, e]
            for r in range(2):
                for e in range(2):
                    B[w, 2 * t + 8 * r + e, g] = pairs_b[r][:, e]
        D = np.einsum("wmk,wkn->wmn", A, B)
        out = np.stack(c, 1).astype(np.float64)  # c0, c1 (g, 2t..), c2, c3 (g+8, 2t..)
        for r in range(4):
            out[:, r] += D[w, g + 8 * (r // 2), 2 * t + r % 2]
        return out.astype(np.float32)

    # warpgroup instructions: executed when issued (the waits then have nothing left to do)
    def _llvm_inline_asm(self, op):
        assert ir.StringAttr(op.attributes["asm_string"]).value == "", "only an empty asm (undefined outputs) is known"
        return np.full((self.t, len(_fields(op.result.type))), np.nan, np.float32)

    def _llvm_insertvalue(self, op):
        struct = self._v(op, 0).copy()  # operands: the struct, then the value
        struct[:, list(ir.DenseI64ArrayAttr(op.attributes["position"]))[0]] = self._v(op, 1)
        return struct

    def _nvvm_fence_proxy(self, op):
        return []

    _nvvm_wgmma_fence_aligned = _nvvm_wgmma_commit_group_sync_aligned = _nvvm_fence_proxy
    _nvvm_wgmma_wait_group_sync_aligned = _nvvm_fence_proxy

    def _nvvm_wgmma_mma_async(self, op):
        """D (m64 x n, f32) += A (m64 x k16) @ B (k16 x n) per warpgroup, both read from shared memory
        through their descriptors: A K-major, B N-major (layoutB row: transposed), 128-byte swizzle."""
        acc, desc_a, desc_b = (self._v(op, i) for i in range(3))
        shape = str(op.attributes["shape"])
        n = int(shape.split("n = ")[1].split(",")[0])
        dtype = _NUMPY[str(op.attributes["typeA"]).split("<")[1].rstrip(">")]
        assert str(op.attributes["layoutA"]).endswith("<row>") and str(op.attributes["layoutB"]).endswith("<row>")
        assert str(op.attributes["scaleD"]).endswith("<one>"), "only D += A B is known"
        out = acc.astype(np.float64)
        for group in range(self.t // 128):
            lanes = slice(128 * group, 128 * group + 128)
            (da,), (db,) = np.unique(desc_a[lanes]), np.unique(desc_b[lanes])  # one matrix a warpgroup
            m_, k_ = np.meshgrid(np.arange(64), np.arange(16), indexing="ij")
            start, _, sbo = _descriptor(da)
            a = self._swizzled_read(start + (m_ // 8) * sbo + (m_ % 8) * 128 + 2 * k_, dtype)
            k_, n_ = np.meshgrid(np.arange(16), np.arange(n), indexing="ij")
            start, lbo, sbo = _descriptor(db)
            b = self._swizzled_read(start + (n_ // 64) * lbo + 2 * (n_ % 64) + (k_ // 8) * sbo + (k_ % 8) * 128, dtype)
            d = a @ b
            # Thread 32 w + l of the warpgroup holds, in register 4 j + r, D at row 16 w + l / 4 + 8 (r / 2),
            # column 8 j + 2 (l % 4) + r % 2.
            thread = np.arange(128)
            w, lane = thread // 32, thread % 32
            for reg in range(n // 2):
                j, r = reg // 4, reg % 4
                out[lanes, reg] += d[16 * w + lane // 4 + 8 * (r // 2), 8 * j + 2 * (lane % 4) + r % 2]
        return out.astype(np.float32)

    def _swizzled_read(self, addresses: np.ndarray, dtype) -> np.ndarray:
        """16-bit elements at shared ``addresses`` under the 128-byte swizzle (address bits 4-6 ^= bits 7-9)."""
        addresses = addresses ^ (((addresses >> 7) & 7) << 4)
        low, high = self.shared[addresses], self.shared[addresses + 1]
        return (low.astype(np.uint16) | high.astype(np.uint16) << 8).view(dtype).astype(np.float64)

    # control flow
    def _scf_for(self, op):
        lower, upper, step = (int(self._v(op, i)[0]) for i in range(3))
        values = [self._v(op, 3 + i) for i in range(len(op.operands) - 3)]
        body = op.regions[0].blocks[0]
        for iv in range(lower, upper, step):
            self.env[body.arguments[0]] = np.full(self.t, iv)
            for arg, v in zip(list(body.arguments)[1:], values):
                self.env[arg] = v
            values = self.run(body)
        return values

    def _scf_if(self, op):
        outer = self.mask
        self.mask = outer & self._v(op, 0)
        self.run(op.regions[0].blocks[0])
        self.mask = outer
        return []


def _descriptor(desc: int) -> tuple[int, int, int]:
    """A wgmma matrix descriptor's start address, leading and stride byte offsets (128-byte swizzle only)."""
    desc = int(desc)
    assert desc >> 62 == 1 and (desc >> 49) & 7 == 0, "only the 128-byte swizzle, with no base offset, is known"
    return ((desc & 0x3FFF) << 4, ((desc >> 16) & 0x3FFF) << 4, ((desc >> 32) & 0x3FFF) << 4)


def _fields(type_: ir.Type) -> list:
    """The fields of an !llvm.struct<(f32, ...)>, from its text."""
    return str(type_).split("(")[1].rstrip(")>").split(", ")


def _dtype(type_: ir.Type):
    return _NUMPY.get(str(type_), np.float64 if str(type_) == "f64" else None)


def _pair(value: np.ndarray, kind: str) -> np.ndarray:
    """A 32-bit register (bf16 pair as i32, or vector<2xf16>) as two floats, the low half first."""
    if kind == "f16":
        return value.astype(np.float64)
    return np.ascontiguousarray(value).view(np.uint16).reshape(-1, 2).view(ml_dtypes.bfloat16).astype(np.float64)


def _tf32(bits: np.ndarray) -> np.ndarray:
    """An f32's bits as the tensor core reads them: the low 13 mantissa bits ignored."""
    return (bits.astype(np.uint32) & np.uint32(0xFFFFE000)).view(np.float32).astype(np.float64)


_HOST_VIEWS = ("memref.collapse_shape", "memref.expand_shape")


def run_function(func: ir.Operation, arrays: list[np.ndarray]) -> list[np.ndarray]:
    """Run a host function made of allocations, views, copies, transposes and gpu.launch ops (what
    remains once the products and their consumers have become kernels); ``arrays`` are its first
    arguments, the others (the outputs) are returned, NaN wherever nothing wrote them."""
    block = func.regions[0].blocks[0]
    env = dict(zip(block.arguments, arrays))
    outputs = [np.full(ir.MemRefType(arg.type).shape, np.nan, _dtype(ir.MemRefType(arg.type).element_type))
               for arg in list(block.arguments)[len(arrays):]]
    env.update(zip(list(block.arguments)[len(arrays):], outputs))
    for op in [op.operation for op in block.operations]:
        if op.name == "memref.alloc":
            type_ = ir.MemRefType(op.result.type)
            env[op.result] = np.full(type_.shape, np.nan, _dtype(type_.element_type))
        elif op.name in _HOST_VIEWS:
            source = env[op.operands[0]]
            env[op.result] = source.reshape(ir.MemRefType(op.result.type).shape)
            assert np.shares_memory(env[op.result], source), "a view that copies"
        elif op.name == "memref.copy":
            np.copyto(env[op.operands[1]], env[op.operands[0]])
        elif op.name == "linalg.transpose":  # not a kernel yet (the mapping stages make it one)
            permutation = list(ir.DenseI64ArrayAttr(op.attributes["permutation"]))
            np.copyto(env[op.operands[1]], np.transpose(env[op.operands[0]], permutation))
        elif op.name == "gpu.launch":
            run_launch(op, env)
        else:
            assert op.name in ("arith.constant", "memref.dealloc", "func.return"), f"{op.name} on the host"
    return outputs
