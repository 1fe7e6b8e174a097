"""What a target is to the driver and the plugin, and the registry that names them.

A target (the host in ``cpu/``, an NVIDIA chip in ``nvptx/``) is one object: its hardware
description (plain data), the options it compiles with, the stages it runs for them, how
it builds an executable from the module those stages leave, and its run-time side (the
executables it builds, read back from their serialized bytes). The driver
(``compiler.py``) and the plugin (``pjrt/``) name a target and ask it; neither branches
on which one it is. The registry finds the targets in the modules ``PROVIDERS`` names (a
target folder's run side), and takes others through ``register``. This module and every
target object load no MLIR: the compile side (``stages``, ``build``) loads it when first
called.
"""
from __future__ import annotations

import dataclasses
import functools
import importlib
from typing import TYPE_CHECKING, Any, Callable, Protocol, Sequence

from polyblocks_jax.errors import PolyblocksError

if TYPE_CHECKING:  # annotations only: the compiler's types among them load MLIR
    from polyblocks_jax.donation import Donation
    from polyblocks_jax.dtypes import TensorSpec
    from polyblocks_jax.dumps import Dump
    from polyblocks_jax.options import Options
    from polyblocks_jax.passes import Stage
    from polyblocks_jax.passes.work import Tier
    from polyblocks_jax.runtime.host_callbacks import HostCallback
    from polyblocks_jax.stablehlo_import import ImportedProgram


class CompiledProgram(Protocol):
    """An executable as the driver caches it and the plugin binds it to a device."""
    fingerprint: str
    timings: dict[str, float]

    @property
    def inputs(self) -> list[TensorSpec]: ...
    @property
    def outputs(self) -> list[TensorSpec]: ...
    @property
    def donated(self) -> frozenset[int]: ...      # inputs the caller gives up
    @property
    def overwritten(self) -> frozenset[int]: ...  # inputs whose memory the code may write
    @property
    def aliases(self) -> Sequence[int | None]: ...  # output -> the input whose memory holds it
    @property
    def arena_bytes(self) -> int: ...             # memory of the intermediates, per call
    @property
    def code_bytes(self) -> int: ...

    def load(self) -> None:
        """Make the code ready to run here, so that what cannot load fails now."""

    def serialize(self) -> bytes:
        """Bytes that the target's ``deserialize`` turns back into this program."""


@dataclasses.dataclass
class LoweredProgram:
    """What a target's ``build`` takes: the module after its stages, with what the driver
    read and decided before them."""
    imported: ImportedProgram          # the module (now lowered), signature, devices, collectives
    key: str                           # the cache key: the executable's fingerprint
    donation: Donation                 # the inputs given up, and those the outputs reuse
    callbacks: Sequence[HostCallback]  # the Python functions the code calls
    tier: Tier                         # the program's estimated work (passes/work.py)
    timings: dict[str, float]          # every step's time so far; the build adds its own
    dump: Dump                         # where the build writes its code (POLYBLOCKS_DUMP)
    on_stage: Callable[[str], None]    # told the name of each step as it starts


class Target(Protocol):
    """One target of the compiler (see the module's docstring)."""
    name: str               # the registry's name, written into serialized executables
    donates: bool           # whether its code may compute outputs in donated inputs' memory
    calls_back: bool        # whether its code can call Python functions of this process
    # The compile workers its compiles run in: "host" (the host's LLVM loaded with our options,
    # cpu/codegen.py), "plain" (MLIR alone), None (in the calling process).
    compile_worker: str | None

    @property
    def hardware(self) -> Any:
        """Its hardware description: plain data, no MLIR (``cpu.target.CpuTarget``,
        ``nvptx.target.NvptxTarget``)."""

    def description(self) -> str:
        """The device kind JAX users see; serialized host executables are pinned to it."""

    def options(self, options: Options) -> Options:
        """The options it compiles with: ``options`` with the switches it has no use for off."""

    def stages(self, options: Options, tier: Tier) -> list[Stage]:
        """Every stage of a compile, the shared ones with its own among them (compiler side)."""

    def build(self, program: LoweredProgram, options: Options) -> CompiledProgram:
        """The executable of the module its stages left (compiler side)."""

    def deserialize(self, data: bytes) -> CompiledProgram:
        """The executable whose ``serialize`` gave ``data`` (run side: no MLIR)."""


# The modules that provide targets, each in its ``PROVIDED``: loaded at the first question
# about a target, so that this module depends on no target folder.
PROVIDERS = ("polyblocks_jax.cpu.backend", "polyblocks_jax.nvptx.backend")
HOST = "cpu"  # the name of this host's target (cpu/backend.py)


@functools.cache
def _registry() -> dict[str, Target]:
    registry = {}
    for provider in PROVIDERS:
        registry.update((target.name, target) for target in importlib.import_module(provider).PROVIDED)
    return registry


def register(target: Target) -> None:
    """Make ``target`` known by its name (a target of another package, a test's)."""
    _registry()[target.name] = target


def get(name: str) -> Target:
    """The target named ``name``."""
    registry = _registry()
    if name not in registry:
        raise PolyblocksError(f"unknown polyblocks target {name!r}; known: {', '.join(registry)}")
    return registry[name]


def names() -> list[str]:
    return list(_registry())


def host() -> Target:
    """The target of this process's CPU."""
    return get(HOST)
