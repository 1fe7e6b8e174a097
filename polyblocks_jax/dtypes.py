"""The element types polyblocks_jax supports, keyed by their StableHLO spelling.

The spelling (``"f32"``, ``"ui8"``, ...) is the currency between the two MLIR
libraries: the importer reads it from jaxlib's types and builds upstream types from it.
Unsigned integers become signless MLIR integers; converters pick unsigned arithmetic
from ``DType.is_unsigned``.

Narrow types (the float8 family, float4, int4, int2) are stored one element per byte, as
numpy and the PJRT host buffers hold them; as in XLA, ops other than conversions and
data movement compute in a wider type (``DType.compute``) and round back.
Complex numbers have no MLIR element type in our pipeline: the importer carries each
complex tensor as two real ones (stablehlo_import/complex.py), and compiled code sees a
complex argument or result as its real layout, ``TensorSpec.real_layout``.
"""
from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np


@dataclasses.dataclass(frozen=True)
class DType:
    name: str
    numpy_name: str  # numpy's name of the type (bf16's is ml_dtypes')
    bits: int
    kind: str  # "float", "sint", "uint", "bool" or "complex"
    compute: str | None = None  # narrow types: the dtype their arithmetic runs in

    @property
    def is_narrow(self) -> bool:
        return self.compute is not None

    @functools.cached_property
    def numpy(self) -> np.dtype:
        """The numpy dtype. ml_dtypes loads with the first of its types asked for: a compile
        worker, which imports no jax, starts without it (its import is a second of the worker's start)."""
        if self.numpy_name != "bfloat16" and not self.is_narrow:
            return np.dtype(self.numpy_name)
        import ml_dtypes
        return np.dtype(getattr(ml_dtypes, self.numpy_name))

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


def _d(name: str, numpy_type, bits: int, kind: str, compute: str | None = None) -> DType:
    return DType(name, numpy_type if isinstance(numpy_type, str) else np.dtype(numpy_type).name, bits, kind, compute)


DTYPES: dict[str, DType] = {d.name: d for d in (
    _d("f64", np.float64, 64, "float"),
    _d("f32", np.float32, 32, "float"),
    _d("f16", np.float16, 16, "float"),
    _d("bf16", "bfloat16", 16, "float"),
    _d("i1", np.bool_, 1, "bool"),
    _d("i8", np.int8, 8, "sint"),
    _d("i16", np.int16, 16, "sint"),
    _d("i32", np.int32, 32, "sint"),
    _d("i64", np.int64, 64, "sint"),
    _d("ui8", np.uint8, 8, "uint"),
    _d("ui16", np.uint16, 16, "uint"),
    _d("ui32", np.uint32, 32, "uint"),
    _d("ui64", np.uint64, 64, "uint"),
    _d("complex<f32>", "complex64", 64, "complex"),
    _d("complex<f64>", "complex128", 128, "complex"),
    # XLA CPU normalizes the float8 and float4 types to f16, float8_e8m0fnu (exponents
    # beyond f16's) to f32, and 4- and 2-bit integers to 8-bit ones.
    _d("f8E4M3FN", "float8_e4m3fn", 8, "float", "f16"),
    _d("f8E5M2", "float8_e5m2", 8, "float", "f16"),
    _d("f8E4M3FNUZ", "float8_e4m3fnuz", 8, "float", "f16"),
    _d("f8E5M2FNUZ", "float8_e5m2fnuz", 8, "float", "f16"),
    _d("f8E4M3B11FNUZ", "float8_e4m3b11fnuz", 8, "float", "f16"),
    _d("f8E3M4", "float8_e3m4", 8, "float", "f16"),
    _d("f8E4M3", "float8_e4m3", 8, "float", "f16"),
    _d("f8E8M0FNU", "float8_e8m0fnu", 8, "float", "f32"),
    _d("f4E2M1FN", "float4_e2m1fn", 4, "float", "f16"),
    _d("i4", "int4", 4, "sint", "i8"),
    _d("ui4", "uint4", 4, "uint", "ui8"),
    _d("i2", "int2", 2, "sint", "i8"),
    _d("ui2", "uint2", 2, "uint", "ui8"),
)}

_BY_NUMPY_NAME = {d.numpy_name: d for d in DTYPES.values()}


def dtype(name: str) -> DType | None:
    """The DType spelled ``name`` in StableHLO, or None when unsupported."""
    return DTYPES.get(name)


def from_numpy(np_dtype) -> DType | None:
    np_dtype = np.dtype(np_dtype)
    found = _BY_NUMPY_NAME.get(np_dtype.name)
    return found if found is not None and found.numpy == np_dtype else None  # (not a byte-swapped one)


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
        return int(math.prod(self.shape))  # (numpy's prod: ten times the time, for every op imported)

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    def real_layout(self) -> TensorSpec:
        """The real tensor with the same memory: a complex one gains a trailing dimension
        of 2 (real part, imaginary part), as numpy lays complex arrays out."""
        if not self.dtype.is_complex:
            return self
        return TensorSpec((*self.shape, 2), self.dtype.component)

    def __str__(self) -> str:
        return "tensor<" + "".join(f"{d}x" for d in self.shape) + self.dtype.name + ">"
