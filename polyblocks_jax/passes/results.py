"""Make every returned tensor a distinct value before bufferization.

A function may return one value twice (``lambda a: (a + 1, a + 1)`` after CSE) or return
an argument; buffer-results-to-out-params cannot give one buffer two out-parameters (it
crashes), so each repeated or argument result is returned through its own copy.
"""
from __future__ import annotations

from mlir import ir
from mlir.dialects import bufferization, func

from polyblocks_jax.options import Options


def distinct_results(module: ir.Module, options: Options) -> None:
    for op in module.body.operations:
        if isinstance(op, func.FuncOp) and not op.is_external:
            _copy_repeated_results(op.entry_block.operations[len(op.entry_block.operations) - 1])


def _copy_repeated_results(ret: ir.Operation) -> None:
    seen: set[ir.Value] = set()
    for i, value in enumerate(list(ret.operands)):
        if value in seen or isinstance(value.owner, ir.Block):
            with ir.InsertionPoint(ret), ret.location:
                ret.operands[i] = bufferization.AllocTensorOp(value.type, [], copy=value).result
        seen.add(value)
