"""Compiler options: one frozen object, settable from ``POLYBLOCKS_FLAGS`` and, per program,
from ``jax.jit(f, compiler_options={...})`` (``Options.updated``; see pjrt/compile_options.py).

Every optimization is a boolean field that ``no-<name>`` switches off, so each can
be measured on its own. Fields that change generated code are part of the cache key;
``dump_dir`` only changes what is written beside it, ``object_cache`` only whether LLVM's
objects are reused, ``in_process`` only where the compiler runs (see
``polyblocks_jax.compile_workers``): ``POLYBLOCKS_FLAGS=in-process`` compiles in the
calling process, for pdb and profilers, where a crash of MLIR or LLVM ends that process.
"""
from __future__ import annotations

import dataclasses
import hashlib
import os
from typing import Mapping

from polyblocks_jax.errors import PolyblocksError

FLAGS_ENV = "POLYBLOCKS_FLAGS"
DUMP_ENV = "POLYBLOCKS_DUMP"

MATRIX_UNITS = ("auto", "amx", "avx512bf16", "avx512vnni", "avx2", "fma")
PRECISIONS = ("fp32", "tf32", "mixed_bf16_fp32")

# Fields that do not influence generated code, hence stay out of the cache key.
_NOT_IN_KEY = frozenset({"dump_dir", "in_process", "object_cache"})


@dataclasses.dataclass(frozen=True)
class Options:
    fusion: bool = True          # fuse elementwise producers into their consumers
    tiling: bool = True          # cache and register tiling + vectorization of matmuls
    packing: bool = True         # tiled matmuls copy A and B panels into contiguous tiles (with tiling)
    parallel: bool = True        # large loop nests run on all cores (OpenMP); OMP_NUM_THREADS caps
    vectorize: bool = True       # register tiles + vectors for convolutions, elementwise ops, reductions
    prefetch: bool = True        # a tile read in several passes prefetches its successor (cpu/prefetch.py)
    share_layers: bool = True    # a repeated layer's ops go through the tensor stages once (compile time)
    arena: bool = True           # host intermediates share one arena laid out by liveness (cpu/arena.py)
    fast_tier: bool = True       # small programs skip the stages that cannot pay off for them (passes/work.py)
    opt_level: int = 2           # LLVM: 0 unoptimized; else our passes (cpu/codegen.py), codegen at this level
    matrix_unit: str = "auto"    # host matmul path: auto | amx | avx512bf16 | avx512vnni | avx2 | fma
                                 # (forcing an absent one fails)
    precision: str = "fp32"      # f32 matmuls/convs: fp32 (exact) | tf32 (GPU tensor cores; exact on the host)
                                 # | mixed_bf16_fp32 (bf16 operands, f32 sums)
    dump_dir: str | None = None  # write the module after every stage, and stage timings
    in_process: bool = False     # compile in this process, not in a compile worker (debuggers, profilers)
    object_cache: bool = True    # object files by content, in memory and on disk (cpu/object_cache.py)

    def __post_init__(self) -> None:
        if self.opt_level not in (0, 1, 2, 3):
            raise PolyblocksError(f"opt_level must be 0..3, got {self.opt_level}")
        if self.matrix_unit not in MATRIX_UNITS:
            raise PolyblocksError(f"matrix_unit must be one of {', '.join(MATRIX_UNITS)}, got {self.matrix_unit!r}")
        if self.precision not in PRECISIONS:
            raise PolyblocksError(f"precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}")

    @classmethod
    def from_flags(cls, flags: str, **overrides) -> "Options":
        """Parse ``"no-fusion,opt-level=2"``: names with ``-`` or ``_``, commas or spaces."""
        fields = {f.name: f for f in dataclasses.fields(cls)}
        values: dict[str, object] = {}
        for token in flags.replace(",", " ").split():
            name, _, raw = token.partition("=")
            name = name.replace("-", "_")
            if not raw and name.startswith("no_") and name[3:] in fields:
                name, raw = name[3:], "false"
            if name not in fields:
                raise PolyblocksError(f"unknown option {token!r} in {FLAGS_ENV}; known: " + ", ".join(cls.names()))
            values[name] = _parse_value(fields[name], raw or "true", token)
        values.update(overrides)
        return cls(**values)

    @classmethod
    def names(cls) -> list[str]:
        return sorted(f.name for f in dataclasses.fields(cls))

    def updated(self, values: Mapping[str, object]) -> "Options":
        """These options with ``values`` set: each a value of the field's type (an int is no
        bool, a bool no int) or its text as ``POLYBLOCKS_FLAGS`` writes it (``"false"``, ``"2"``)."""
        fields = {f.name: f for f in dataclasses.fields(self)}
        changes = {}
        for name, value in values.items():
            if name not in fields:
                raise PolyblocksError(f"unknown option {name!r}; known: " + ", ".join(self.names()))
            token = f"{name}={value}"
            if isinstance(value, str):
                changes[name] = _parse_value(fields[name], value, token)
            elif type(value) is _kind(fields[name]):
                changes[name] = value
            else:
                raise PolyblocksError(f"option {token!r} takes {_TAKES[_kind(fields[name]).__name__]}")
        return self.replace(**changes)

    @classmethod
    def switches(cls) -> list[str]:
        """The optimizations that can be switched off by name (``no-<name>``): the flags."""
        return [f.name for f in dataclasses.fields(cls) if f.type in (bool, "bool") and f.name not in _NOT_IN_KEY]

    @classmethod
    def from_env(cls) -> "Options":
        return cls.from_flags(os.environ.get(FLAGS_ENV, ""), dump_dir=os.environ.get(DUMP_ENV) or None)

    def replace(self, **changes) -> "Options":
        return dataclasses.replace(self, **changes)

    def flags(self) -> str:
        """The ``POLYBLOCKS_FLAGS`` value giving these options' code generation (defaults left out)."""
        tokens = []
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name in _NOT_IN_KEY or value == f.default:
                continue
            name = f.name.replace("_", "-")
            tokens.append((name if value else f"no-{name}") if isinstance(value, bool) else f"{name}={value}")
        return ",".join(tokens)

    def cache_key(self) -> str:
        items = sorted((k, v) for k, v in dataclasses.asdict(self).items() if k not in _NOT_IN_KEY)
        return hashlib.sha256(repr(items).encode()).hexdigest()[:16]


_TAKES = {"bool": "true or false", "int": "an integer", "str": "a string"}


def _kind(field: dataclasses.Field) -> type:
    """The field's value type: bool, int or str (``str | None`` is a str when set)."""
    name = field.type if isinstance(field.type, str) else field.type.__name__
    return {"bool": bool, "int": int}.get(name, str)


def _parse_value(field: dataclasses.Field, raw: str, token: str) -> object:
    kind = _kind(field)
    if kind is bool:
        if raw.lower() not in ("true", "false", "1", "0"):
            raise PolyblocksError(f"option {token!r} takes {_TAKES['bool']}")
        return raw.lower() in ("true", "1")
    if kind is int:
        try:
            return int(raw)
        except ValueError:
            raise PolyblocksError(f"option {token!r} takes {_TAKES['int']}") from None
    return raw
