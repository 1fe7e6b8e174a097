"""Running a named list of stages, with dumps and per-stage timings.

A stage is an upstream pass-pipeline string (or a Python function for the few
rewrites upstream lacks). ``POLYBLOCKS_DUMP=dir`` writes the module after every stage
(``polyblocks_jax.dumps``).

The module is verified after each stage written in Python (the IR it builds by hand), not
after every upstream pass: the pass manager's verifier is a large share of a model's compile
time, and upstream passes given valid IR leave valid IR. A Python stage that returns False
left the module as it was, and is not verified again (most stages find nothing to do in
most programs).
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
    # verification after it (ResNet-18: the verification after to-llvm, 13% of all of them).
    verify: bool = True


def run_stages(module: ir.Module, stages: Sequence[Stage], options: Options,
               dump: Dump | None = None, on_stage: Callable[[str], None] | None = None) -> dict[str, float]:
    """Run ``stages`` in order on ``module`` in place; returns seconds per stage.

    ``dump`` gets the module before the first stage and after each. ``on_stage`` is told
    each stage's name as it starts: a compile worker reports it to its parent, which then
    names the stage a crash of MLIR or LLVM ended the worker in."""
    timings: dict[str, float] = {}
    dump = dump or Dump(None, "")
    dump.stage("input", module)
    for stage in stages:
        if on_stage is not None:
            on_stage(stage.name)
        start = time.perf_counter()
        _run_stage(stage, module, options)
        timings[stage.name] = time.perf_counter() - start
        dump.stage(stage.name, module)
    return timings


def _run_stage(stage: Stage, module: ir.Module, options: Options) -> None:
    before = None
    try:
        if callable(stage.passes):
            if stage.passes(module, options) is not False and stage.verify:
                module.operation.verify()
        else:
            before = str(module) if options.dump_dir else None
            pass_manager(f"builtin.module({stage.passes})", module.context).run(module.operation)
    except PolyblocksError:  # ours already: a stage may reject what it cannot do (or afford)
        raise
    except Exception as e:  # MLIRError and friends: report which stage and how to reproduce
        hint = f"\nreproduce: mlir-opt --pass-pipeline='builtin.module({stage.passes})'" \
            if isinstance(stage.passes, str) else ""
        raise CompilationError(stage.name, f"{e}{hint}", before) from None
