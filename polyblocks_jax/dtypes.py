"""The element types polyblocks_jax supports, keyed by their StableHLO spelling.

The spelling (``"f32"``, ``"ui8"``, ...) is the currency between the two MLIR
libraries: the importer reads it from jaxlib's types and builds upstream types from it.
Unsigned integers become signless MLIR integers; converters pick unsigned arithmetic
from ``DType.is_unsigned``. Complex numbers have no MLIR element type in our pipeline: the
importer carries each complex tensor as two real ones (stablehlo_import/complex.py), and
compiled code sees a complex argument or result as its real layout, ``TensorSpec.real_layout``.
"""
from __future__ import annotations

import dataclasses

import ml_dtypes
import numpy as np


@dataclasses.dataclass(frozen=True)
class DType:
    name: str
    numpy: np.dtype
    bits: int
    kind: str  # "float", "sint", "uint", "bool" or "complex"

    @property
    def is_float(self) -> bool:
        return self.kind == "float"

    @property
    def is_integer(self) -> bool:
        return self.kind in ("sint", "uint", "bool")

    @property
    def is_unsigned(self) -> bool:
        return self.kind in ("uint", "bool")

    @property
    def is_bool(self) -> bool:
        return self.kind == "bool"

    @property
    def is_complex(self) -> bool:
        return self.kind == "complex"

    @property
    def component(self) -> DType:
        """The real type of a complex type's parts (f32 for complex<f32>); itself otherwise."""
        return DTYPES["f32" if self.bits == 64 else "f64"] if self.is_complex else self

    @property
    def itemsize(self) -> int:
        return self.numpy.itemsize


def _d(name: str, numpy_type, bits: int, kind: str) -> DType:
    return DType(name, np.dtype(numpy_type), bits, kind)


DTYPES: dict[str, DType] = {d.name: d for d in (
    _d("f64", np.float64, 64, "float"),
    _d("f32", np.float32, 32, "float"),
    _d("f16", np.float16, 16, "float"),
    _d("bf16", ml_dtypes.bfloat16, 16, "float"),
    _d("i1", np.bool_, 1, "bool"),
    _d("i8", np.int8, 8, "sint"),
    _d("i16", np.int16, 16, "sint"),
    _d("i32", np.int32, 32, "sint"),
    _d("i64", np.int64, 64, "sint"),
    _d("ui8", np.uint8, 8, "uint"),
    _d("ui16", np.uint16, 16, "uint"),
    _d("ui32", np.uint32, 32, "uint"),
    _d("ui64", np.uint64, 64, "uint"),
    _d("complex<f32>", np.complex64, 64, "complex"),
    _d("complex<f64>", np.complex128, 128, "complex"),
)}

_BY_NUMPY = {d.numpy: d for d in DTYPES.values()}


def dtype(name: str) -> DType | None:
    """The DType spelled ``name`` in StableHLO, or None when unsupported."""
    return DTYPES.get(name)


def from_numpy(np_dtype) -> DType | None:
    return _BY_NUMPY.get(np.dtype(np_dtype))


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    """A static tensor type: shape and element type."""
    shape: tuple[int, ...]
    dtype: DType

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    def real_layout(self) -> TensorSpec:
        """The real tensor with the same memory: a complex one gains a trailing dimension
        of 2 (real part, imaginary part), as numpy lays complex arrays out."""
        if not self.dtype.is_complex:
            return self
        return TensorSpec((*self.shape, 2), self.dtype.component)

    def __str__(self) -> str:
        return "tensor<" + "".join(f"{d}x" for d in self.shape) + self.dtype.name + ">"
