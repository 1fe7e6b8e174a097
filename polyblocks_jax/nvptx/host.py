"""Reading the launch plan off the host function once the NVIDIA stages have run.

The host function then holds only constants, allocations, views and
``gpu.launch_func`` ops; anything else is host-side work the target cannot do yet.
"""
from __future__ import annotations

from typing import Union

from mlir import ir

from polyblocks_jax.errors import UnsupportedError
from polyblocks_jax.nvptx.plan import Buffer, BufferArg, Launch, LaunchPlan, ScalarArg

VIEW_OPS = frozenset({"memref.subview", "memref.expand_shape", "memref.collapse_shape",
                       "memref.reinterpret_cast", "memref.cast"})
_IGNORED_HOST_OPS = frozenset({"arith.constant", "func.return", "memref.get_global"} | VIEW_OPS)


def read_plan(module: ir.Module, num_inputs: int) -> LaunchPlan:
    """The plan of ``module``'s host function ``main``, whose first ``num_inputs`` arguments are inputs."""
    main = next(op for op in module.body.operations
                if op.operation.name == "func.func" and ir.StringAttr(op.attributes["sym_name"]).value == "main")
    body = main.regions[0].blocks[0]
    buffers: dict[ir.Value, int] = {}
    listed: list[Buffer] = []
    for i, arg in enumerate(body.arguments):
        kind, index = ("input", i) if i < num_inputs else ("output", i - num_inputs)
        buffers[arg] = len(listed)
        listed.append(Buffer(kind, index, _nbytes(arg.type)))
    launches = []
    for op in body.operations:
        op = op.operation
        if op.name == "memref.alloc":
            buffers[op.result] = len(listed)
            listed.append(Buffer("temp", sum(b.kind == "temp" for b in listed), _nbytes(op.result.type)))
        elif op.name == "gpu.launch_func":
            launches.append(_launch(op, buffers))
        elif op.name not in _IGNORED_HOST_OPS:
            raise UnsupportedError(op.name, "host-side operation left in a GPU program", str(op.location))
    return LaunchPlan(tuple(listed), tuple(launches))


def _launch(op: ir.Operation, buffers: dict[ir.Value, int]) -> Launch:
    segments = list(ir.DenseI32ArrayAttr(op.attributes["operandSegmentSizes"]))
    # async deps, grid x/y/z, block x/y/z, cluster x/y/z, dynamic shared memory, kernel operands, async object
    groups, start = [], 0
    for size in segments:
        groups.append(list(op.operands[start:start + size]))
        start += size
    grid = tuple(_constant(v[0], op) for v in groups[1:4])
    block = tuple(_constant(v[0], op) for v in groups[4:7])
    shared = _constant(groups[10][0], op) if groups[10] else 0
    kernel = ir.SymbolRefAttr(op.attributes["kernel"]).value
    args = tuple(_argument(v, buffers, op) for v in groups[11])
    return Launch(kernel[0], kernel[-1], grid, block, shared, args)


def _argument(value: ir.Value, buffers: dict[ir.Value, int], launch: ir.Operation) -> Union[BufferArg, ScalarArg]:
    if not isinstance(value.type, ir.MemRefType):
        return ScalarArg("i64" if isinstance(value.type, ir.IndexType) else str(value.type), _constant(value, launch))
    type_ = ir.MemRefType(value.type)
    root = value
    while isinstance(root, ir.OpResult) and root.owner.operation.name in VIEW_OPS:
        root = root.owner.operands[0]
    if root not in buffers:
        raise UnsupportedError("gpu.launch_func", f"kernel argument {value.get_name()} is not a device buffer "
                               "or a static view of one", str(launch.location))
    strides, offset = type_.get_strides_and_offset()
    if any(d < 0 for d in (*type_.shape, *strides, offset)):  # dynamic sizes are the minimum int64
        raise UnsupportedError("gpu.launch_func", f"kernel argument of dynamic layout {type_}", str(launch.location))
    return BufferArg(buffers[root], offset, tuple(type_.shape), tuple(strides))


def _constant(value: ir.Value, launch: ir.Operation) -> int:
    if isinstance(value, ir.OpResult) and value.owner.operation.name == "arith.constant":
        return ir.IntegerAttr(value.owner.attributes["value"]).value
    raise UnsupportedError("gpu.launch_func", "a launch dimension or scalar argument is not a constant",
                           str(launch.location))


def _nbytes(type_: ir.Type) -> int:
    memref = ir.MemRefType(type_)
    if not memref.has_static_shape:
        raise UnsupportedError("memref.alloc", f"dynamic shape {memref}")
    element = memref.element_type
    bits = 64 if isinstance(element, ir.IndexType) else element.width
    count = 1
    for d in memref.shape:
        count *= d
    return count * max(1, bits // 8)
