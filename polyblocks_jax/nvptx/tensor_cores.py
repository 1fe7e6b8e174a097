"""Products and convolutions on tensor cores: mma.sync kernels in place of linalg ops on buffers.

Runs on buffers, before the GPU mapping. An op qualifies (mma_match.py) when it is a
product or an NHWC convolution of types the matrix unit takes (``NvptxTarget.matrix_unit``:
bf16, f16, or f32 as tf32 when ``Options.precision`` is "tf32" allows it) with 16-byte aligned rows,
and its output holds a constant before it: the last op touching the output's memory
fills it, or copies into it a buffer whose last write was a fill (bufferization shares one
zero-filled buffer among products). That initialization and the op become a gpu.launch (mma_kernel.py's
text, tiles from the cost model mma_tiles.py) in the host function, with the elementwise op
after it that consumes C (epilogue.py: computed on the accumulators; the ops between them must
leave the product's operands alone) in that op's place, where the mapping
stages keep it (mapping.HOST_OPS); on sm_90a, bf16/f16 ones become wgmma kernels
(wgmma_kernel.py) instead. Anything else stays on the generic path (one thread per output element).
"""
from __future__ import annotations

import dataclasses
import itertools
import math

from mlir import ir
from mlir.dialects import memref

from polyblocks_jax.nvptx import epilogue, mma_match
from polyblocks_jax.nvptx.host import VIEW_OPS
from polyblocks_jax.nvptx.mapping import inside
from polyblocks_jax.nvptx.mma_kernel import MmaProblem, kernel_function
from polyblocks_jax.nvptx.mma_tiles import choose_mma_tiles, choose_wgmma_tiles
from polyblocks_jax.nvptx.target import NvptxTarget
from polyblocks_jax.nvptx.wgmma_kernel import wgmma_kernel_function
from polyblocks_jax.options import Options
from polyblocks_jax.tensor_ir.layout import reassociation_attr


def use_tensor_cores(module: ir.Module, options: Options, target: NvptxTarget) -> None:
    unit = target.matrix_unit(tf32=options.precision == "tf32")
    names = (f"polyblocks_mma_{i}" for i in itertools.count())
    for func in [op for op in module.body.operations if op.operation.name == "func.func"]:
        if not len(func.regions[0].blocks):
            continue
        before: list[ir.Operation] = []  # the ops so far, kernels included
        ops = [op.operation for op in func.regions[0].blocks[0].operations]
        at = 0
        while at < len(ops):
            op, at = ops[at], at + 1
            form = mma_match.match(op)
            init = _initial_value(before, op.operands[2]) if form else None
            problem = mma_match.problem(op, form, init[0], unit, target) if init else None
            if problem is None:
                before.append(op)
                continue
            consumer = _consumer(ops, at, op, form)
            if consumer is not None:  # the kernel computes it, in its place: the ops before it go first
                where, fused = consumer
                problem, consumer = dataclasses.replace(problem, epilogue=fused), ops[where]
                before += ops[at:where]
                at = where + 1
            before.remove(init[1])
            before.append(_replace(op, form, init[1], problem, next(names), unit, target, consumer))


def _consumer(ops: list[ir.Operation], at: int, product: ir.Operation,
              form: mma_match.Match) -> tuple[int, epilogue.Epilogue] | None:
    """The first of ``ops[at:]`` that consumes ``product``'s C elementwise (epilogue.match), with its
    index, when the ops before it are no products, leave C alone and write neither A nor B: the
    product can then move down to it. None if there is no such op."""
    for where in range(at, len(ops)):
        op = ops[where]
        fused = epilogue.match(op, product, form.reassociations[2])
        if fused is not None:
            return where, fused
        a, b, c = product.operands
        if (mma_match.match(op) or (len(op.regions) and not op.name.startswith("linalg."))
                or _last_touching([op], c, reads=True) or _last_touching([op], a, reads=False)
                or _last_touching([op], b, reads=False)):
            return None
    return None


def _initial_value(before: list[ir.Operation], output: ir.Value) -> tuple[float, ir.Operation] | None:
    """The constant ``output`` holds after ``before`` (the ops so far, in order), and the op that
    put it there: the last op touching ``output`` fills it, or copies into it a buffer whose last
    write was a fill."""
    init = _last_touching(before, output, reads=True)
    if init is None or init.name not in ("linalg.fill", "memref.copy") or init.operands[1] != output:
        return None
    if init.name == "memref.copy":
        source = init.operands[0]
        fill = _last_touching(before[:before.index(init)], source, reads=False)
        if fill is None or fill.name != "linalg.fill" or fill.operands[1] != source:
            return None
        value = _constant_float(fill.operands[0])
    else:
        value = _constant_float(init.operands[0])
    return None if value is None else (value, init)


def _last_touching(ops: list[ir.Operation], buffer: ir.Value, reads: bool) -> ir.Operation | None:
    """The last of ``ops`` that writes ``buffer`` or a view of the same memory (or reads it, when
    ``reads``); None when none does."""
    aliases = _aliases(buffer)
    for op in reversed(ops):
        if op.name == "gpu.launch":  # a kernel: its operands are sizes, buffers are used inside
            if any(inside(use.owner.operation, op) for alias in aliases for use in alias.uses):
                return op
        elif any(v in aliases for v in (op.operands if reads else _written(op))):
            return op
    return None


def _aliases(buffer: ir.Value) -> list[ir.Value]:
    """``buffer``'s root (through views) and every view of it."""
    while isinstance(buffer, ir.OpResult) and buffer.owner.name in VIEW_OPS:
        buffer = buffer.owner.operands[0]
    found, pending = [], [buffer]
    while pending:
        value = pending.pop()
        found.append(value)
        pending += [use.owner.operation.result for use in value.uses if use.owner.operation.name in VIEW_OPS]
    return found


def _written(op: ir.Operation) -> list[ir.Value]:
    """The operands ``op`` may write: a linalg op's outs, a copy's target; all of them for anything else
    (a view of the buffer counts as a write: its uses are not followed)."""
    if op.name == "memref.copy":
        return [op.operands[1]]
    if op.name.startswith("linalg.") and "operandSegmentSizes" in op.attributes:
        ins = list(ir.DenseI32ArrayAttr(op.attributes["operandSegmentSizes"]))[0]
        return list(op.operands)[ins:]
    return list(op.operands)


def _constant_float(value: ir.Value) -> float | None:
    if not isinstance(value, ir.OpResult) or value.owner.name != "arith.constant":
        return None
    return ir.FloatAttr(value.owner.attributes["value"]).value


def _kernel_text(name: str, problem: MmaProblem, unit, target: NvptxTarget) -> str:
    """The wgmma kernel where the chip has the instruction for the operands (sm_90a), else mma.sync's."""
    sizes = (problem.m, problem.n, problem.k, math.prod(problem.batch), problem.operand_bytes)
    row_indices = 3 if problem.conv else 1
    if target.wgmma_shape(problem.operand):
        return wgmma_kernel_function(name, problem, choose_wgmma_tiles(*sizes, target, row_indices))
    fma_rate = target.mma_fma_per_clock // (2 if problem.operand == "tf32" else 1)
    tiles = choose_mma_tiles(*sizes, problem.instruction, unit.tile_registers, target, fma_rate, row_indices)
    return kernel_function(name, problem, tiles)


def _replace(op: ir.Operation, form: mma_match.Match, init: ir.Operation, problem: MmaProblem, name: str,
             unit, target: NvptxTarget, consumer: ir.Operation | None) -> ir.Operation:
    """``init`` (the fill or copy that initializes C), ``op`` and its fused ``consumer`` -> views of the
    operands in the kernel's form, and the launch of an mma kernel (parsed as function ``name``, then
    spliced in), which is returned."""
    kernel = ir.Module.parse(_kernel_text(name, problem, unit, target), op.context)
    body = kernel.body.operations[0].regions[0].blocks[0]
    values, groups = list(op.operands), list(form.reassociations)
    if consumer is not None:
        values += [consumer.operands[i] for i in problem.epilogue.extra]
        groups += [None] * len(problem.epilogue.extra)
    place = consumer or op
    with ir.InsertionPoint(place), op.location:
        for argument, value, group in zip(body.arguments, values, groups):
            if argument.type != value.type and len(list(argument.uses)):
                value = memref.collapse_shape(argument.type, value, reassociation_attr(group))
            argument.replace_all_uses_with(value)
    kernel_ops = [kernel_op.operation for kernel_op in body.operations][:-1]  # all but func.return
    for kernel_op in kernel_ops:
        kernel_op.move_before(place)
    for erased in (consumer, op, init):
        if erased is not None:
            erased.erase()
    return kernel_ops[-1]
