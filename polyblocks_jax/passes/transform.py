"""Helpers shared by the stages that drive the transform dialect from Python."""
from __future__ import annotations

from typing import Iterator

from mlir import ir
from mlir.dialects.transform import interpreter


def walk(op: ir.Operation) -> Iterator[ir.Operation]:
    """Every operation nested in ``op``, in pre-order."""
    for region in op.regions:
        for block in region.blocks:
            for child in block.operations:
                yield child.operation
                yield from walk(child.operation)


def apply_script(module: ir.Module, script: str) -> None:
    """Run the ``transform.named_sequence`` of ``script`` (a module's text) on ``module``."""
    transform_module = ir.Module.parse(script, module.context)
    sequence = next(op for op in transform_module.body.operations
                    if op.operation.name == "transform.named_sequence")
    interpreter.apply_named_sequence(module.operation, sequence, transform_module)
