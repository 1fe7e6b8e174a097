"""Running a named list of stages, with dumps and per-stage timings.

A stage is an upstream pass-pipeline string (or a Python function for the few
rewrites upstream lacks). ``POLYBLOCKS_DUMP=dir`` writes the module after every stage
(``polyblocks_jax.dumps``).

What a stage written in Python changed (IR built by hand) is verified before upstream passes
read it; upstream passes given valid IR leave valid IR, and are not verified after. In this
process each Python stage is verified as it ends, naming the stage that broke the module. A
compile worker (``defer_verification``) verifies a run of Python stages once, before a stage
of upstream passes or one marked ``verify=False``, and after the last stage (the verifier
walks the whole module: ResNet-18's 20 verifications took 0.1 s): an upstream pass that
crashes on IR left invalid there is a CompilationError, not the end of the user's process;
a dump verifies each stage there too. A Python stage that returns False left the module as
it was.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Callable, Sequence

from mlir import ir

from polyblocks_jax.contexts import pass_manager
from polyblocks_jax.dumps import Dump
from polyblocks_jax.errors import CompilationError, PolyblocksError
from polyblocks_jax.options import Options


@dataclasses.dataclass(frozen=True)
class Stage:
    name: str
    # A pipeline on builtin.module, or a rewrite; the rewrite may return False for "unchanged".
    passes: str | Callable[[ir.Module, Options], bool | None]
    # False for a rewrite whose result is valid by construction: one that only runs upstream
    # pipelines (they leave valid IR), or only adds IR it parsed (parsing verified it). No
    # verification after it (ResNet-18: the verification after to-llvm, 13% of all of them);
    # what the stages before it changed is verified before it, as for upstream passes.
    verify: bool = True


_deferred = False


def defer_verification() -> None:
    """Verify a run of Python stages once, before upstream code reads the module, from now
    on in this process (a compile worker's, where a crash is a CompilationError)."""
    global _deferred
    _deferred = True


def run_stages(module: ir.Module, stages: Sequence[Stage], options: Options,
               dump: Dump | None = None, on_stage: Callable[[str], None] | None = None) -> dict[str, float]:
    """Run ``stages`` in order on ``module`` in place; returns seconds per stage (and the
    verifier's, as ``verify``, if it ran).

    ``dump`` gets the module before the first stage and after each. ``on_stage`` is told
    each stage's name as it starts: a compile worker reports it to its parent, which then
    names the stage a crash of MLIR or LLVM ended the worker in."""
    timings: dict[str, float] = {}
    # The verifier's time, last: the stages' own entries stay in their order (a dump's files).
    verifying = {"verify": 0.0}
    dump = dump or Dump(None, "")
    dump.stage("input", module)
    unverified: list[str] = []  # the Python stages that changed the module since it was verified
    for stage in stages:
        if on_stage is not None:
            on_stage(stage.name)
        if not (callable(stage.passes) and stage.verify):
            _verify(module, unverified, verifying)
        start = time.perf_counter()
        if _run_stage(stage, module, options):
            unverified.append(stage.name)
        timings[stage.name] = time.perf_counter() - start
        if dump or not _deferred:
            _verify(module, unverified, verifying)
        dump.stage(stage.name, module)
    _verify(module, unverified, verifying)
    if verifying["verify"]:
        timings.update(verifying)
    return timings


def _run_stage(stage: Stage, module: ir.Module, options: Options) -> bool:
    """Run ``stage``; whether it is a Python stage that changed the module, to be verified."""
    before = None
    try:
        if callable(stage.passes):
            return stage.passes(module, options) is not False and stage.verify
        before = str(module) if options.dump_dir else None
        pass_manager(f"builtin.module({stage.passes})", module.context).run(module.operation)
        return False
    except PolyblocksError:  # ours already: a stage may reject what it cannot do (or afford)
        raise
    except Exception as e:  # MLIRError and friends: report which stage and how to reproduce
        hint = f"\nreproduce: mlir-opt --pass-pipeline='builtin.module({stage.passes})'" \
            if isinstance(stage.passes, str) else ""
        raise CompilationError(stage.name, f"{e}{hint}", before) from None


def _verify(module: ir.Module, unverified: list[str], timings: dict[str, float]) -> None:
    """Verify ``module`` if a stage of ``unverified`` changed it; an invalid module is a
    CompilationError of the last of them, its message naming them all (deferred: several)."""
    if not unverified:
        return
    start = time.perf_counter()
    try:
        module.operation.verify()
    except Exception as e:  # MLIRError: the IR a stage of ours built
        suspects = f" (changed by {', '.join(unverified)} since it was last verified)" if len(unverified) > 1 else ""
        raise CompilationError(unverified[-1], f"{e}{suspects}") from None
    finally:
        timings["verify"] = timings.get("verify", 0.0) + time.perf_counter() - start
    unverified.clear()
