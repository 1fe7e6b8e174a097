"""Walks a StableHLO module (jaxlib objects) and builds an upstream ``func.func``.

Values cross from one library to the other only through the map kept here: each
jaxlib SSA value is paired with the upstream value its converter produced.
"""
from __future__ import annotations

import collections
import dataclasses
from typing import Sequence

from jaxlib.mlir import ir as jir
from mlir import ir
from mlir.dialects import func

from polyblocks_jax.dtypes import TensorSpec
from polyblocks_jax.errors import InvalidProgramError, UnsupportedDtypeError, UnsupportedError
from polyblocks_jax.runtime.collectives import Collective
from polyblocks_jax.stablehlo_import import complex_values, narrow_ops, reader, spmd
from polyblocks_jax.tensor_ir import builders
from polyblocks_jax.stablehlo_import.complex_values import Pair
from polyblocks_jax.stablehlo_import.registry import COMPLEX_CONVERTERS, CONVERTERS
from polyblocks_jax.tensor_ir.types import element_type, tensor_type

_TERMINATORS = ("func.return", "stablehlo.return", "sdy.return")
# Ops that may do more than compute their results (a host callback, in a custom call or in a
# body they run): converted even when their results hold no elements.
_EFFECTFUL = ("stablehlo.custom_call", "stablehlo.composite", "stablehlo.while", "stablehlo.if",
              "stablehlo.case", "func.call")


@dataclasses.dataclass
class OpView:
    """What a converter sees of one StableHLO op."""
    op: jir.Operation               # jaxlib op, for attributes and regions only
    name: str
    location: str
    operands: list[ir.Value]        # upstream values (a complex one is a complex_values.Pair)
    operand_specs: list[TensorSpec]
    result_specs: list[TensorSpec]
    scalar: bool                    # inside a reduction body: values are scalars, not tensors

    def attr(self, name: str) -> jir.Attribute | None:
        return self.op.attributes[name] if name in self.op.attributes else None

    def unsupported(self, reason: str) -> UnsupportedError:
        return UnsupportedError(self.name, reason, self.location)

    def unsupported_dtype(self, dtype: str, supported: tuple[str, ...] = ()) -> UnsupportedDtypeError:
        return UnsupportedDtypeError(self.name, dtype, self.location, supported)

    def result_type(self, index: int = 0) -> ir.Type:
        spec = self.result_specs[index]
        return element_type(spec.dtype) if self.scalar else tensor_type(spec)


@dataclasses.dataclass
class ImportedProgram:
    module: ir.Module           # upstream module holding func.func @main on tensors
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    replicas: int = 1           # the devices it runs on, replicas x partitions, one instance each
    partitions: int = 1
    collectives: list[Collective] = dataclasses.field(default_factory=list)  # what its calls name


class Importer:
    """Converts one StableHLO module; call sites of private functions are inlined."""

    def __init__(self, jmodule: jir.Module) -> None:
        self.functions = {
            jir.StringAttr(op.attributes["sym_name"]).value: op.operation
            for op in jmodule.body.operations if op.operation.name == "func.func"}
        # The devices the program runs on, replicas x partitions (collectives.py).
        self.replicas, self.partitions = (
            jir.IntegerAttr(jmodule.operation.attributes[name]).value if name in jmodule.operation.attributes else 1
            for name in ("mhlo.num_replicas", "mhlo.num_partitions"))
        self.devices = self.replicas * self.partitions
        self.collectives: list[Collective] = []  # of a program for several devices, in call order
        self._scalar_depth = 0
        # Values visible to the block being imported: nested regions (while, if, case)
        # use values of enclosing blocks without passing them as arguments.
        self._values: collections.ChainMap = collections.ChainMap()

    def import_main(self) -> ImportedProgram:
        main = self.functions.get("main")
        if main is None:
            raise InvalidProgramError("the module has no func.func @main")
        block = main.regions[0].blocks[0]
        # On several devices, each runs the body of main's shard_map on its shards.
        local = spmd.per_device_program(main, self.devices) if self.devices > 1 else None
        if local is not None:
            block = local.body
        inputs = [reader.tensor_spec(t, "func.func @main argument", "main")
                  for t in (local.input_types if local else [a.type for a in block.arguments])]
        ftype = jir.FunctionType(jir.TypeAttr(main.attributes["function_type"]).value)
        outputs = [reader.tensor_spec(t, "func.func @main result", "main")
                   for t in (local.output_types if local else ftype.results)]
        module = ir.Module.create()
        with ir.InsertionPoint(module.body):
            fn = func.FuncOp("main", ir.FunctionType.get(
                [tensor_type(s.real_layout()) for s in inputs], [tensor_type(s.real_layout()) for s in outputs]))
            fn.attributes["llvm.emit_c_interface"] = ir.UnitAttr.get()
            # Inputs are the caller's buffers: bufferization must copy before writing in place.
            fn.arg_attrs = ir.ArrayAttr.get(
                [ir.DictAttr.get({"bufferization.writable": ir.BoolAttr.get(False)})] * len(inputs))
            entry = fn.add_entry_block()
            with ir.InsertionPoint(entry):
                args = [complex_values.split(a, s) if s.dtype.is_complex else a
                        for a, s in zip(entry.arguments, inputs)]
                if local is not None:
                    args = [args[k] for k in local.body_arguments]
                results = self.import_block(block, args)
                if local is not None:
                    results = [results[j] for j in local.results]
                func.ReturnOp([complex_values.interleave(r, s) if s.dtype.is_complex else r
                               for r, s in zip(results, outputs)])
        return ImportedProgram(module, inputs, outputs, self.replicas, self.partitions, self.collectives)

    def inline_call(self, callee: str, args: Sequence[ir.Value]) -> list[ir.Value]:
        fn = self.functions.get(callee)
        if fn is None:
            raise InvalidProgramError(f"call to unknown function @{callee}")
        return self.import_block(fn.regions[0].blocks[0], list(args))

    def import_block(self, block: jir.Block, args: Sequence[ir.Value], scalar: bool = False) -> list[ir.Value]:
        """Convert ``block``'s ops after binding its arguments; returns the terminator's operands.

        ``scalar`` imports a reduction or comparator body: its rank-0 tensors become scalars.
        """
        values = self._values.new_child(dict(zip(block.arguments, args)))
        outer, self._values = self._values, values
        self._scalar_depth += scalar
        try:
            for op in block.operations:
                op = op.operation
                operands = [self._operand(values[v]) for v in op.operands]
                if op.name in _TERMINATORS:
                    return operands
                results = self._convert(op, operands)
                values.update(zip(op.results, results))
        finally:
            self._values = outer
            self._scalar_depth -= scalar
        raise InvalidProgramError("block without terminator")

    def _operand(self, value: complex_values.Value) -> complex_values.Value:
        # A body may capture a rank-0 tensor of the enclosing function: read its element.
        if isinstance(value, Pair):
            return Pair(self._operand(value.re), self._operand(value.im))
        if self.scalar and isinstance(value.type, ir.RankedTensorType):
            return builders.to_scalar(value)
        return value

    @property
    def scalar(self) -> bool:
        return self._scalar_depth > 0

    def _computes_nothing(self, view: OpView) -> bool:
        """Whether every result of ``view`` is a tensor of no elements, of an op with no effects."""
        return (not self.scalar and bool(view.result_specs) and view.name not in _EFFECTFUL
                and all(spec.size == 0 for spec in view.result_specs))

    def _convert(self, op: jir.Operation, operands: list[complex_values.Value]) -> Sequence[complex_values.Value]:
        loc = reader.location(op)
        view = OpView(op, op.name, loc, operands,
                      [reader.tensor_spec(v.type, op.name, loc) for v in op.operands],
                      [reader.tensor_spec(r.type, op.name, loc) for r in op.results],
                      self.scalar)
        if any(s.dtype.is_complex for s in (*view.operand_specs, *view.result_specs)):
            converter = COMPLEX_CONVERTERS.get(op.name)
            if converter is None:
                raise UnsupportedError(op.name, "complex element types are not supported by this op", loc)
        else:
            converter = CONVERTERS.get(op.name)
            if converter is None:
                raise UnsupportedError(op.name, "no converter for this op", loc)
        with ir.Location.name(f"{op.name} {loc}"):
            if self._computes_nothing(view):
                # A tensor of no elements is its type alone; converters then never build
                # slices or loops over a dim of size 0, which the verifier rejects.
                return complex_values.unflatten([builders.empty(spec) for spec in complex_values.flat_specs(
                    view.result_specs)], view.result_specs)
            if narrow_ops.computes_wider(view):
                results = narrow_ops.in_compute_types(self, converter, view)
            else:
                results = list(converter(self, view))
        if len(results) != len(op.results):
            raise AssertionError(f"converter of {op.name} returned {len(results)} values")
        return results

