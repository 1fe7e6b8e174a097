"""Epilogue fusion: the elementwise consumer of a tensor-core product, computed on its accumulators.

Fusion leaves the consumers of a product (bias, activation, residual, scale, conversion)
as one linalg.generic reading the product's output C. When that generic comes right after
the product, is elementwise over C's iteration space (C read with the identity map, every
other operand with a projection or broadcast of it: a bias vector, a residual), and its
body is region-free arith/math ops on its arguments and outer constants, the kernel
computes the body on each accumulator before the store (mma_kernel.py) and the generic is
dropped: C then need not be written at all, unless it outlives the two ops.

``Epilogue`` is plain data (strings and indices) so that the kernel generator stays free of
MLIR objects; the body is carried as each op's generic form, remapped to the kernel's names.
"""
from __future__ import annotations

import dataclasses

from mlir import ir

from polyblocks_jax.nvptx.host import VIEW_OPS
from polyblocks_jax.passes.transform import indexing_maps

Ref = tuple[str, int]  # ("arg", generic operand number) or ("op", body op number)
_DIALECTS = ("arith.", "math.")


@dataclasses.dataclass(frozen=True)
class BodyOp:
    """One op of the consumer's body in generic form: ``"name"(operands) {attributes} : (types) -> result``."""
    name: str
    operands: tuple[Ref, ...]
    attributes: str              # the attribute dictionary's text, inherent attributes included
    operand_types: tuple[str, ...]
    result_type: str


@dataclasses.dataclass(frozen=True)
class Epilogue:
    """The consumer generic: C is its operands ``c_operands`` (an input, the output too when in place);
    the others are the kernel's extra memrefs."""
    c_shape: tuple[int, ...]            # C's dimensions before the kernel's collapsed view: the loop ranges
    c_groups: tuple[tuple[int, ...], ...]  # the dimensions of C each dimension of the kernel's view merges
    c_operands: tuple[int, ...]
    operands: tuple[str, ...]           # memref types of the generic's operands, C's included (unused)
    dims: tuple[tuple[int | None, ...], ...]  # per operand, per dimension: the loop it follows, None for 0
    outputs: tuple[int, ...]            # the operands the generic writes (C may be one)
    ops: tuple[BodyOp, ...]
    yields: tuple[Ref, ...]             # per output, the value it gets
    store_c: bool                       # C outlives the consumer, which does not write it: stored too
    element_types: tuple[str, ...]      # per operand
    paired: tuple[bool, ...]            # per operand: C's two elements of a fragment pair (columns 2i,
    #                                     2i + 1 of its last dimension) are side by side in it, aligned
    pair_bytes: tuple[int, ...]         # per operand: the bytes of two elements

    @property
    def extra(self) -> list[int]:
        """The operands other than C: the kernel's arguments after A, B, C."""
        return [i for i in range(len(self.operands)) if i not in self.c_operands]


def match(consumer: ir.Operation, product: ir.Operation, c_groups: list[list[int]] | None) -> Epilogue | None:
    """``consumer`` as the epilogue of ``product`` (whose C the kernel views merging ``c_groups``), or None."""
    if consumer.name != "linalg.generic" or len(consumer.regions[0].blocks[0].arguments) != len(consumer.operands):
        return None
    if any("parallel" not in str(i) for i in ir.ArrayAttr(consumer.attributes["iterator_types"])):
        return None
    c = product.operands[2]
    c_type = ir.MemRefType(c.type)
    operands = list(consumer.operands)
    c_operands = tuple(i for i, v in enumerate(operands) if v == c)
    maps = indexing_maps(consumer)
    if not c_operands or any(maps[i] != ir.AffineMap.get_identity(c_type.rank) for i in c_operands):
        return None
    dims = [_dims(m) for m in maps]
    if None in dims or any(not isinstance(v.type, ir.MemRefType) or not ir.MemRefType(v.type).has_static_shape
                           for v in operands):
        return None  # a scalar operand, or a dynamic shape
    c_root, inputs = _root(c), [_root(v) for v in product.operands[:2]]
    ins = list(ir.DenseI32ArrayAttr(consumer.attributes["operandSegmentSizes"]))[0]
    outputs = list(range(ins, len(operands)))
    for i, v in enumerate(operands):  # no other view of C; no write to the product's operands
        if i not in c_operands and (_root(v) == c_root or (i in outputs and _root(v) in inputs)):
            return None
    body = _body(consumer.regions[0].blocks[0])
    if body is None:
        return None
    ops, yields = body
    groups = c_groups or [[d] for d in range(c_type.rank)]
    groups = tuple(tuple(g) for g in groups)
    types = [ir.MemRefType(v.type) for v in operands]
    last = (c_type.rank - 1,)
    store_c = not set(c_operands) & set(outputs) and _outlives(c, (product, consumer))
    return Epilogue(tuple(c_type.shape), groups, c_operands, tuple(str(t) for t in types), tuple(dims),
                    tuple(outputs), ops, yields, store_c,
                    tuple(str(t.element_type) for t in types),
                    tuple(i not in c_operands and groups[-1] == last and _pairs(t, dims[i], last[0])
                          for i, t in enumerate(types)),
                    tuple(2 * _width(t) // 8 for t in types))


def _pairs(type_: ir.MemRefType, dims: tuple[int | None, ...], last: int) -> bool:
    """Whether elements 2i and 2i + 1 along loop ``last`` are adjacent in ``type_`` and the pair aligned to
    its size: the operand's unit-stride last dimension follows the loop, other strides and offset even."""
    strides, offset = type_.get_strides_and_offset()
    return (bool(dims) and dims[-1] == last and strides[-1] == 1 and _width(type_) % 8 == 0
            and all(s % 2 == 0 for s in (*strides[:-1], offset)))


def _width(type_: ir.MemRefType) -> int:
    element = type_.element_type
    return element.width if hasattr(element, "width") else 0


def _dims(map_: ir.AffineMap) -> tuple[int | None, ...] | None:
    """Per result of ``map_``: the loop dimension it is, None for the constant 0; None if neither."""
    dims = []
    for expr in map_.results:
        if isinstance(expr, ir.AffineDimExpr):
            dims.append(expr.position)
        elif isinstance(expr, ir.AffineConstantExpr) and expr.value == 0:
            dims.append(None)
        else:
            return None
    return tuple(dims)


def _root(value: ir.Value) -> ir.Value:
    while isinstance(value, ir.OpResult) and value.owner.name in VIEW_OPS:
        value = value.owner.operands[0]
    return value


def _outlives(c: ir.Value, users: tuple[ir.Operation, ...]) -> bool:
    """Whether C is read after ``users``: anything but a local allocation used by them, its
    initialization (a fill or a copy into it, before them) and deallocations."""
    if not isinstance(c, ir.OpResult) or c.owner.name != "memref.alloc":
        return True
    for use in c.uses:
        user = use.owner.operation
        if not (any(user == u for u in users) or user.name in ("memref.dealloc", "linalg.fill")
                or (user.name == "memref.copy" and user.operands[1] == c)):
            return True
    return False


def _body(block: ir.Block) -> tuple[tuple[BodyOp, ...], tuple[Ref, ...]] | None:
    """The body's ops (outer constants first) and yielded values, or None if it holds anything else."""
    refs = {arg: ("arg", i) for i, arg in enumerate(block.arguments)}
    ops: list[BodyOp] = []

    def ref(value: ir.Value) -> Ref | None:
        if value in refs:
            return refs[value]
        if isinstance(value, ir.OpResult) and value.owner.name == "arith.constant":  # from outside
            refs[value] = ("op", len(ops))
            ops.append(_body_op(value.owner, ()))
            return refs[value]
        return None

    for op in [op.operation for op in block.operations]:
        operands = [ref(v) for v in op.operands]
        if None in operands:
            return None
        if op.name == "linalg.yield":
            return tuple(ops), tuple(operands)
        if not op.name.startswith(_DIALECTS) or len(op.regions) or len(op.results) != 1:
            return None
        refs[op.result] = ("op", len(ops))
        ops.append(_body_op(op, tuple(operands)))
    return None


def _body_op(op: ir.Operation, operands: tuple[Ref, ...]) -> BodyOp:
    attributes = ", ".join(f"{name} = {op.attributes[name]}" for name in op.attributes)
    return BodyOp(op.name, operands, attributes, tuple(str(v.type) for v in op.operands), str(op.result.type))
