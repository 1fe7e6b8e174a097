"""Reading StableHLO with jaxlib's MLIR.

This is the only module that parses programs with jaxlib's bindings; it hands the
importer jaxlib objects plus plain Python values read from them (shapes, dtype
names, integer lists, numpy arrays). No upstream ``mlir`` object is created here.
"""
from __future__ import annotations

import functools
import io
import re

import numpy as np
from jaxlib.mlir import ir as jir
from jaxlib.mlir import passmanager as jpassmanager
from jaxlib.mlir.dialects import chlo, sdy, stablehlo
# JAX's own context factory registers func/arith/... through this registry; the public
# dialect modules only register stablehlo, chlo and sdy, so we use it the same way.
from jaxlib.mlir._mlir_libs import _jax_mlir_ext

from polyblocks_jax import dtypes
from polyblocks_jax.dtypes import TensorSpec
from polyblocks_jax.errors import InvalidProgramError, UnsupportedDtypeError, UnsupportedError
from polyblocks_jax.stablehlo_import import spmd

_BYTECODE_MAGIC = b"ML\xefR"
_ARTIFACT_PRODUCER = b"StableHLO_v"


def new_context() -> jir.Context:
    """A jaxlib MLIR context that knows every dialect JAX emits; the parser loads those a
    program uses, since loading them all costs every compile a few milliseconds."""
    ctx = jir.Context()
    registry = jir.DialectRegistry()
    _jax_mlir_ext.register_dialects(registry)
    ctx.append_dialect_registry(registry)
    stablehlo.register_dialect(ctx)
    chlo.register_dialect(ctx)
    sdy.register_dialect(ctx)
    return ctx


def program_source(program) -> str | bytes:
    """Text or bytes of ``program``: StableHLO text, a VHLO artifact, or a ``jax.stages.Lowered``.

    A Lowered becomes MLIR bytecode (with its locations, for error messages): its text
    does not always parse back (``dynamic_slice`` of a scalar prints ``%x, , sizes = []``).
    """
    if isinstance(program, (str, bytes, bytearray, memoryview)):
        return bytes(program) if not isinstance(program, str) else program
    if hasattr(program, "compiler_ir"):
        out = io.BytesIO()
        program.compiler_ir("stablehlo").operation.write_bytecode(out)
        return out.getvalue()
    raise InvalidProgramError(
        f"cannot compile a {type(program).__name__}: pass StableHLO text, "
        "VHLO portable-artifact bytes or a jax.stages.Lowered")


def parse(source: str | bytes, ctx: jir.Context) -> jir.Module:
    """Parse StableHLO text, MLIR bytecode or a VHLO portable artifact in ``ctx``."""
    with ctx:
        if isinstance(source, bytes) and source.startswith(_BYTECODE_MAGIC):
            producer = _bytecode_producer(source)
            if producer.startswith(_ARTIFACT_PRODUCER):
                try:
                    return stablehlo.deserialize_portable_artifact(ctx, source)
                except Exception as e:
                    raise InvalidProgramError(f"malformed VHLO artifact: {_first_line(e)}") from None
            # The generic bytecode reader is not hardened: on a damaged VHLO artifact it
            # crashes the process. Only MLIR's own bytecode (a Lowered's) goes to it.
            if not producer.startswith(b"MLIR"):
                raise InvalidProgramError(f"MLIR bytecode from an unknown producer {producer[:32]!r}: "
                                          "expected a VHLO portable artifact")
        try:
            module = jir.Module.parse(source)
        except Exception as e:
            raise InvalidProgramError(f"malformed StableHLO module: {_first_line(e)}") from None
        if not module.operation.verify():
            raise InvalidProgramError("StableHLO module does not verify")
        return module


def simplified_bytecode(source: str | bytes) -> bytes:
    """The program after MLIR's canonicalizer (dead ops removed, constants folded), as MLIR
    bytecode: the StableHLO form of what the importer computes, which jaxlib turns into the
    HLO text of a compiled program (``as_text()``). Locations are kept: they name scopes."""
    ctx = new_context()
    module = parse(source, ctx)
    with ctx:
        jpassmanager.PassManager.parse("builtin.module(canonicalize)").run(module.operation)
        if _several_devices(module):
            spmd.as_partitioned(module)
    out = io.BytesIO()
    module.operation.write_bytecode(out)
    return out.getvalue()


def _several_devices(module: jir.Module) -> bool:
    attributes = module.operation.attributes
    return any(name in attributes and jir.IntegerAttr(attributes[name]).value > 1
               for name in ("mhlo.num_replicas", "mhlo.num_partitions"))


def _bytecode_producer(source: bytes) -> bytes:
    """The producer named in an MLIR bytecode header ("StableHLO_v1.9.0" for VHLO, "MLIR..."
    for plain bytecode): after the magic and the version (a prefix varint), up to a NUL."""
    first = source[len(_BYTECODE_MAGIC)] if len(source) > len(_BYTECODE_MAGIC) else 0
    version_bytes = (first & -first).bit_length() if first else 9  # trailing zeros + 1
    start = len(_BYTECODE_MAGIC) + version_bytes
    end = source.find(b"\0", start, start + 64)
    return source[start:end] if end >= 0 else b""


def _first_line(e: Exception) -> str:
    text = str(e).strip()
    return text if len(text) < 2000 else text[:2000] + " ..."


def location(op: jir.Operation) -> str:
    """The most useful part of an op's location: the innermost file:line:col, if any."""
    return _useful_part(str(op.location))


@functools.lru_cache(maxsize=4096)  # ops share locations: ViT-Tiny's 1647 have 684
def _useful_part(text: str) -> str:
    files = re.findall(r'"([^"]+\.\w+)":(\d+):(\d+)', text)
    names = re.findall(r'loc\("([^"]+)"', text)
    where = f"{files[0][0]}:{files[0][1]}:{files[0][2]}" if files else ""
    name = names[0] if names else ""
    return " ".join(p for p in (name, where) if p) or text


# A token orders side effects and holds no data; JAX passes and returns it as bool[0].
_TOKEN_SPEC = TensorSpec((0,), dtypes.dtype("i1"))


def token_results(source: str | bytes) -> list[int]:
    """The positions of ``main``'s results that are tokens (whose bool[0] holds no data)."""
    context = new_context()
    module = parse(source, context)
    with context:
        for op in module.body.operations:
            if op.operation.name == "func.func" and jir.StringAttr(op.attributes["sym_name"]).value == "main":
                results = jir.FunctionType(jir.TypeAttr(op.attributes["function_type"]).value).results
                return [i for i, t in enumerate(results) if stablehlo.TokenType.isinstance(t)]
    return []


def tensor_spec(type_: jir.Type, op_name: str, loc: str) -> TensorSpec:
    """Shape and dtype of a ranked, static tensor type (or a token); UnsupportedError otherwise."""
    if stablehlo.TokenType.isinstance(type_):
        return _TOKEN_SPEC
    if not isinstance(type_, jir.RankedTensorType):
        raise UnsupportedError(op_name, f"type {type_} is not a ranked tensor", loc)
    t = jir.RankedTensorType(type_)
    if not t.has_static_shape:
        raise UnsupportedError(op_name, f"dynamic shape in {type_}", loc)
    dt = dtypes.dtype(str(t.element_type))
    if dt is None:
        raise UnsupportedDtypeError(op_name, str(t.element_type), loc)
    return TensorSpec(tuple(t.shape), dt)


def i64_list(attr: jir.Attribute | None) -> list[int]:
    """An integer list from a dense i64 array or dense elements attribute (None gives [])."""
    if attr is None:
        return []
    if isinstance(attr, jir.DenseI64ArrayAttr):
        return list(jir.DenseI64ArrayAttr(attr))
    if isinstance(attr, jir.DenseBoolArrayAttr):
        return [int(b) for b in jir.DenseBoolArrayAttr(attr)]
    if isinstance(attr, jir.DenseIntElementsAttr):
        return [int(v) for v in np.array(jir.DenseIntElementsAttr(attr)).reshape(-1)]
    return [int(jir.IntegerAttr(a).value) for a in jir.ArrayAttr(attr)]


def i64(attr: jir.Attribute) -> int:
    """The value of an integer attribute (``dimension = 1 : i64``)."""
    return int(jir.IntegerAttr(attr).value)


def enum_name(attr: jir.Attribute) -> str:
    """``#stablehlo<comparison_direction LT>`` -> ``"LT"``."""
    return str(attr).rstrip(">").split()[-1]


def dense_values(attr: jir.Attribute, spec: TensorSpec) -> np.ndarray:
    """The elements of a dense constant as a numpy array of ``spec``'s dtype and shape."""
    dense = jir.DenseElementsAttr(attr)
    try:
        if spec.dtype.is_bool:
            raise TypeError("i1 payloads are bit-packed in the raw buffer")
        flat = np.frombuffer(bytes(memoryview(dense)), dtype=spec.dtype.numpy)
    except (TypeError, BufferError):
        flat = _parse_dense_text(str(attr), spec)  # no buffer view for i1 and bf16
    if dense.is_splat and flat.size:  # a zero-size splat has no payload
        return np.full(spec.shape, flat[0], dtype=spec.dtype.numpy)
    return flat[:spec.size].reshape(spec.shape).copy()


def complex_constant_values(op: jir.Operation, spec: TensorSpec) -> np.ndarray:
    """The elements of a complex stablehlo.constant, read from the op's text: jaxlib's
    bindings cannot wrap a dense attribute of complex elements (the cast raises)."""
    text = op.get_asm(enable_debug_info=False)
    flat = _parse_dense_text(text[text.index("dense<"):], spec)
    if flat.size == 1:
        return np.full(spec.shape, flat[0], dtype=spec.dtype.numpy)
    return flat[:spec.size].reshape(spec.shape).copy()


def _parse_dense_text(text: str, spec: TensorSpec) -> np.ndarray:
    """Elements from the printed ``dense<...>`` form: a hex blob or a nested literal list."""
    body = text[text.index("<") + 1:text.rindex(":")].rstrip().removesuffix(">")
    if body.startswith('"0x'):
        return np.frombuffer(bytes.fromhex(body[3:-1]), dtype=spec.dtype.numpy)
    tokens = re.findall(r"0x[0-9A-Fa-f]+|true|false|[-+]?(?:inf|nan|[\d.]+(?:[eE][-+]?\d+)?)", body)
    item = spec.dtype.component  # a complex element prints as "(real, imaginary)": two tokens
    bits = np.dtype(f"u{item.itemsize}")
    out = np.empty(len(tokens), dtype=item.numpy)
    for i, tok in enumerate(tokens):
        if tok.startswith("0x") and item.is_float:  # a float printed as its bit pattern
            out[i] = np.array(int(tok, 16), dtype=bits).view(item.numpy)
        elif tok in ("true", "false"):
            out[i] = tok == "true"
        else:
            out[i] = float(tok) if item.is_float else int(tok, 0)
    return out.view(spec.dtype.numpy)


def scalar_constant(value: jir.Value) -> np.ndarray | None:
    """The element of a stablehlo.constant holding one value (rank 0, or a splat), seen
    through JAX's scalar broadcast_in_dim; None for anything else."""
    while isinstance(value, jir.OpResult):
        owner = jir.OpResult(value).owner.operation
        if owner.name == "stablehlo.broadcast_in_dim":
            value = owner.operands[0]
        elif owner.name == "stablehlo.constant":
            spec = tensor_spec(value.type, owner.name, location(owner))
            if spec.dtype.is_complex:
                values = complex_constant_values(owner, spec).reshape(-1)
            else:
                values = dense_values(owner.attributes["value"], spec).reshape(-1)
            return values[0] if values.size == 1 or (values.size and (values == values[0]).all()) else None
        else:
            return None
    return None
