"""One program's options, read from the compile options JAX serializes (CompileOptionsProto).

``jax.jit(f, compiler_options={...})`` and ``Lowered.compile(compiler_options)`` put four
names on ExecutableBuildOptions (``EFFORTS`` and ``LEVELS``, which JAX also sets from its
config) and every other one, with its Python type (str, bool, int or float), in
``env_option_overrides``. XLA applies each override to the DebugOptions field of that name
(``CompileOptions::ApplyOption``): an unknown name is "No such compile option", a value of
the wrong type "... is not a valid <type> value". We check the same way against our
``Options`` fields, which set this program's options over ``POLYBLOCKS_FLAGS``, and against
the XLA names in ``XLA_OVERRIDES``, which are accepted and have no effect on our code.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from polyblocks_jax.errors import PolyblocksError
from polyblocks_jax.options import Options
from polyblocks_jax.pjrt.errors import invalid

if TYPE_CHECKING:
    from jaxlib.xla_client import CompileOptions

# XLA DebugOptions fields that JAX sets or its tests pass, with their proto types ("enums": a
# repeated enum, whose values XLA does not check here; JAX's PGLE pass sets it to "").
XLA_OVERRIDES: dict[str, str] = {
    "xla_backend_optimization_level": "int32",
    "xla_cpu_enable_fast_math": "bool",
    "xla_disable_hlo_passes": "string",
    "xla_dump_hlo_as_proto": "bool",
    "xla_dump_hlo_as_text": "bool",
    "xla_dump_max_hlo_modules": "int32",
    "xla_dump_to": "string",
    "xla_embed_ir_in_executable": "bool",
    "xla_gpu_auto_spmd_partitioning_memory_budget_ratio": "float",
    "xla_gpu_enable_command_buffer": "enums",
    "xla_gpu_enable_latency_hiding_scheduler": "bool",
    "xla_gpu_enable_triton_gemm": "bool",
    "xla_gpu_experimental_dump_fdo_profiles": "bool",
    "xla_gpu_graph_min_graph_size": "int32",
    "xla_llvm_disable_expensive_passes": "bool",
}
# Efforts in [-1, 1], the range JAX documents for jax_exec_time_optimization_effort; no effect.
EFFORTS = ("exec_time_optimization_effort", "memory_fitting_effort")
# Effort levels (jax.config.EffortLevel): optimization_level O0..O3 sets opt_level 0..3,
# UNKNOWN (JAX's default) leaves it; memory_fitting_level has no effect.
LEVELS = ("optimization_level", "memory_fitting_level")
_OPT_LEVEL_OF_EFFORT = {0: None, 9: 0, 19: 1, 29: 2, 39: 3}
_PYTHON_TYPE = {"bool": bool, "int32": int, "float": float, "string": str}


def _known_names() -> str:
    without_effect = sorted((*EFFORTS, "memory_fitting_level", *XLA_OVERRIDES))
    return (f"polyblocks options: {', '.join(Options.names())}; XLA options accepted without effect: "
            f"{', '.join(without_effect)}; optimization_level (O0..O3) sets opt_level")


def program_options(compile_options: CompileOptions, base: Options) -> Options:
    """``base`` with what ``compile_options`` sets."""
    build = compile_options.executable_build_options
    for name in EFFORTS:
        value = getattr(build, name)
        if not -1.0 <= value <= 1.0:  # NaN too
            raise invalid(f"{name} must be in [-1.0, 1.0], got {value}")
    for name in LEVELS:
        if getattr(build, name) not in _OPT_LEVEL_OF_EFFORT:
            raise invalid(f"{name} must be a jax.config.EffortLevel value "
                          f"({', '.join(map(str, _OPT_LEVEL_OF_EFFORT))}), got {getattr(build, name)}")
    ours: dict[str, object] = {}
    for name, value in compile_options.env_option_overrides:
        if name in XLA_OVERRIDES:
            _check_xla_value(name, value, XLA_OVERRIDES[name])
        elif name in Options.names():
            ours[name] = value
        else:
            raise invalid(f"No such compile option: '{name}'; {_known_names()}")
    level = _OPT_LEVEL_OF_EFFORT[build.optimization_level]
    options = base if level is None else base.replace(opt_level=level)
    try:
        return options.updated(ours)
    except PolyblocksError as e:
        raise invalid(str(e)) from None


def _check_xla_value(name: str, value: object, kind: str) -> None:
    """As XLA: a string is parsed as the field's type, any other value must be of that type."""
    if kind == "enums":
        return
    valid = _parses(value, kind) if isinstance(value, str) else type(value) is _PYTHON_TYPE[kind]
    if not valid:
        shown = int(value) if isinstance(value, bool) else value  # XLA prints a bool as 1 or 0
        raise invalid(f"While setting option {name}, '{shown}' is not a valid {kind} value.")


def _parses(text: str, kind: str) -> bool:
    if kind == "string":
        return True
    if kind == "bool":
        return text in ("True", "False")  # XLA takes these two spellings only
    try:
        (int if kind == "int32" else float)(text)
    except ValueError:
        return False
    return True
