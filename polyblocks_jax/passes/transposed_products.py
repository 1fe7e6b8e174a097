"""Transposed matmul results computed transposed: (A B)^T as B^T A^T.

A program often transposes a product it has just computed: JAX's weight gradient of a dense
layer is ``dot_general(dy, x)`` then a transpose into the weight's layout (an RNN's backward
step: a 512 x 128 product of 8 rows each, transposed at every step). Written out, then read
and written again by the transpose, the result costs two extra passes. Swapped, the product
lands in the transposed layout directly, and its operands are transposed instead: the
importer's canonical operands are often transposes already, and a transpose of a transpose
folds away. Done where the result holds more elements than the operands that would newly be
transposed (only then is it a saving).
"""
from __future__ import annotations

import math

from mlir import ir
from mlir.dialects import linalg, tensor

from polyblocks_jax.options import Options
from polyblocks_jax.contexts import pass_manager
from polyblocks_jax.passes.transform import indexing_maps, walk
from polyblocks_jax.tensor_ir import builders


def swap_transposed_products(module: ir.Module, options: Options) -> bool:
    """Rewrite each 2-D ``linalg.matmul`` whose init is a fill and whose every use is a
    transpose of it (JAX may transpose it once per use) as the matmul of the transposed
    operands (with ``options.fusion``: the transposes are fused into their producer).
    Whether there was one (none: the module is not verified again, ViT-Tiny's unshared
    layers 18 ms)."""
    if not options.fusion:
        return False
    swapped = False
    for product in [op for op in walk(module.operation) if op.name == "linalg.matmul"]:
        transposes = [use.owner.operation for use in product.results[0].uses]
        if transposes and all(_transposes(t) for t in transposes) and _plain(product) and _saves(product):
            _swap(transposes, product)
            swapped = True
    if swapped:  # transposes of transposes fold; the old fills go
        pass_manager("builtin.module(canonicalize)", module.context).run(module.operation)
    return swapped


def _transposes(op: ir.Operation) -> bool:
    return op.name == "linalg.transpose" and list(ir.DenseI64ArrayAttr(op.attributes["permutation"])) == [1, 0]


def _plain(product: ir.Operation) -> bool:
    """A product of 2-D operands of its result's type, read in their own layouts (the
    default indexing maps), into a fill."""
    init = product.operands[2]
    filled = not isinstance(init.owner, ir.Block) and init.owner.name == "linalg.fill"
    m, n, k = (ir.AffineDimExpr.get(d) for d in range(3))
    default = [ir.AffineMap.get(3, 0, e) for e in ([m, k], [k, n], [m, n])]
    maps = "indexing_maps" not in product.attributes or indexing_maps(product) == default  # absent: the default
    return filled and maps and "cast" not in product.attributes and \
        all(ir.RankedTensorType(v.type).element_type == ir.RankedTensorType(init.type).element_type
            for v in product.operands)


def _saves(product: ir.Operation) -> bool:
    """Whether the result outweighs the operands that are not transposes already."""
    fresh = sum(_elements(v) for v in list(product.operands)[:2] if not _is_transpose(v))
    return _elements(product.results[0]) > fresh


def _swap(transposes: list[ir.Operation], product: ir.Operation) -> None:
    lhs, rhs, init = product.operands
    fill = init.owner.operation
    element = ir.RankedTensorType(init.type).element_type
    m, n = ir.RankedTensorType(init.type).shape
    with ir.InsertionPoint(product), product.location:
        operands = [_transposed(v) for v in (rhs, lhs)]
        zero = builders.fill(fill.operands[0], tensor.EmptyOp([n, m], element).result)
        swapped = linalg.matmul(*operands, outs=[zero])
    for transpose in transposes:
        transpose.results[0].replace_all_uses_with(swapped)
        transpose.erase()
    product.erase()


def _transposed(value: ir.Value) -> ir.Value:
    rows, cols = ir.RankedTensorType(value.type).shape
    init = tensor.EmptyOp([cols, rows], ir.RankedTensorType(value.type).element_type).result
    return linalg.transpose(value, outs=[init], permutation=[1, 0]).results[0]


def _is_transpose(value: ir.Value) -> bool:
    return not isinstance(value.owner, ir.Block) and value.owner.name == "linalg.transpose"


def _elements(value: ir.Value) -> int:
    return math.prod(ir.RankedTensorType(value.type).shape)
