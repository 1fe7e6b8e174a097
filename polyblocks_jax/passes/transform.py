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


def lower_vectors_and_hoist(*extra_patterns: str) -> str:
    """Script lines run on function ``%f`` after vectorization: contractions to outer products
    (plus ``extra_patterns``), 1-D transfers, CSE, then the accumulator slices hoisted out of
    every scf.for (on tensors, where hoisting works)."""
    patterns = ["vector.lower_contraction lowering_strategy = outerproduct", *extra_patterns,
                "vector.transfer_permutation_patterns", "vector.lower_transfer max_transfer_rank = 1",
                "canonicalization"]
    body = "".join(f"      transform.apply_patterns.{p}\n" for p in patterns)
    return ("    transform.apply_patterns to %f {\n" + body + "    } : !transform.any_op\n"
            "    transform.apply_cse to %f : !transform.any_op\n"
            '    %for_loops = transform.structured.match ops{["scf.for"]} in %f'
            " : (!transform.any_op) -> !transform.any_op\n"
            "    transform.loop.hoist_loop_invariant_subsets %for_loops : !transform.any_op")
