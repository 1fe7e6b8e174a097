"""How the importer carries complex tensors: as two real tensors, the real and imaginary parts.

Every later stage then sees real element types only, so fusion, tiling and vectorization
apply to complex programs unchanged. A complex value in the importer's value map is a
``Pair``; converters registered with ``@converts_complex`` build on its parts. Only at the
function boundary does memory hold interleaved pairs: there a complex tensor of shape S is
a real tensor of shape S x 2 (``TensorSpec.real_layout``), split into its parts on entry
and interleaved into the result on return.
"""
from __future__ import annotations

from typing import Callable, NamedTuple, Sequence

from mlir import ir

from polyblocks_jax.dtypes import TensorSpec
from polyblocks_jax.tensor_ir import builders, slices


class Pair(NamedTuple):
    """A complex tensor (or scalar, in a reduction body) as its real and imaginary parts."""
    re: ir.Value
    im: ir.Value


Value = ir.Value | Pair


def part_spec(spec: TensorSpec) -> TensorSpec:
    """The spec of one part of a complex tensor (``spec`` itself for a real one)."""
    return TensorSpec(spec.shape, spec.dtype.component)


def flatten(values: Sequence[Value]) -> list[ir.Value]:
    """``values`` with each Pair replaced by its two parts."""
    return [part for v in values for part in (v if isinstance(v, Pair) else (v,))]


def unflatten(flat: Sequence[ir.Value], specs: Sequence[TensorSpec]) -> list[Value]:
    """The inverse of ``flatten`` for values of ``specs``: complex ones take two parts."""
    out, i = [], 0
    for spec in specs:
        if spec.dtype.is_complex:
            out.append(Pair(flat[i], flat[i + 1]))
            i += 2
        else:
            out.append(flat[i])
            i += 1
    if i != len(flat):
        raise AssertionError(f"{len(flat)} values for {len(specs)} specs")
    return out


def flat_specs(specs: Sequence[TensorSpec]) -> list[TensorSpec]:
    """The specs of ``flatten``'s values: each complex spec twice, as its part spec."""
    return [part_spec(s) for s in specs for _ in range(2 if s.dtype.is_complex else 1)]


def map_parts(fn: Callable[[ir.Value], ir.Value], value: Value) -> Value:
    """``fn`` applied to each part of a Pair, or to a real value."""
    return Pair(fn(value.re), fn(value.im)) if isinstance(value, Pair) else fn(value)


def split(interleaved: ir.Value, spec: TensorSpec) -> Pair:
    """The parts of ``interleaved``, the real layout of the complex tensor ``spec``."""
    sizes = [*spec.shape, 1]
    return Pair(*(slices.extract_slice(interleaved, sizes, [0] * spec.rank + [k],
                                       shape=list(spec.shape)) for k in (0, 1)))


def interleave(value: Pair, spec: TensorSpec) -> ir.Value:
    """The real layout of the complex tensor ``spec`` holding ``value``'s parts."""
    out = builders.empty(spec.real_layout())
    if not spec.size:
        return out  # the verifier rejects offsets into a zero-size dim
    sizes = [*spec.shape, 1]
    for k, part in enumerate(value):
        out = slices.insert_slice(part, out, [0] * spec.rank + [k], sizes=sizes)
    return out
