"""Repeated layers computed by one function through the tensor stages, bufferization and the
first loop stages, then inlined.

A transformer's twelve blocks reach the compiler as twelve copies of the same ops, and
each stage (tiling, fusion, tile fusion, vectorization, bufferization and the deallocation
pipeline) would transform every copy. Before them, the longest runs of structurally equal
op sequences in ``main`` (a layer traced n times) become n calls of one private function;
after bufferization, and after the target's stages that work on every function (the host's
loops, parallel loops, boolean buffers), each call gets a copy of the function's buffer-level
body back (its results out-parameters the caller allocates; ``passes.INLINE_LAYERS``), and
the layer's work is done once, not once per copy. The layer writes its result into a buffer of its own rather
than over its input: one layer's output more in the arena.

Two sequences are equal when their ops match position by position (names, attributes,
types, nested regions) and are wired alike: an operand defined in the sequence comes from
the same position in each; one defined outside it is a function argument (the same
argument wherever a sequence uses one value twice); an outside constant or empty tensor
is copied into the function when each sequence's is the same.
"""
from __future__ import annotations

import dataclasses

import numpy as np
from mlir import ir
from mlir.dialects import func

from polyblocks_jax.options import Options
from polyblocks_jax.passes.isolated_functions import clonable, isolate
from polyblocks_jax.passes.templates import inline_call
from polyblocks_jax.passes.transform import blocks, callee, walk

PREFIX = "polyblocks_layer_"
# Smaller repeats save less than the function and its copies cost.
MIN_PERIOD = 8
MIN_SAVED_OPS = 64
# Phases of a run tried for copies wired alike: each try walks every copy's operands.
PHASES_TRIED = 4


@dataclasses.dataclass
class _Sequence:
    """``main``'s top-level ops with a structural key each and the outside values each uses."""
    ops: list[ir.Operation]
    keys: np.ndarray                 # ops[i]'s structure as a small integer
    uses: list[list[ir.Value]]       # values ops[i] (or an op nested in it) uses but does not define
    position: dict[ir.Value, tuple[int, int]]   # op result -> (op index, result number)
    last_reads: list[tuple[int, ...]]  # per result of ops[i], the last op reading it (len(ops): return; -1: none)
    # A shared copy's results read after it -> the results of the call now computing them.
    replaced: dict[ir.Value, ir.Value] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class _Repeat:
    start: int
    period: int
    count: int
    slack: int = 0     # how far the copies can shift right and still repeat


def share_repeated_layers(module: ir.Module, options: Options) -> bool:
    """Replace each run of repeated op sequences in ``main`` by calls of one function;
    whether there was one."""
    main = next((f for f in module.body.operations if isinstance(f, func.FuncOp)
                 and f.name.value == "main" and not f.is_external), None)
    if main is None:
        return False
    seq = _sequence(main.regions[0].blocks[0])
    repeats = _repeats(seq)
    for number, repeat in enumerate(repeats):
        _share(seq, repeat, f"{PREFIX}{number}")
    return bool(repeats)


def inline_shared_layers(module: ir.Module, options: Options) -> bool:
    """Put a copy of its function's body in place of each layer call; the functions go.
    (On tensors or buffers: the body is one block either way.) Whether there was one."""
    functions = {f.name.value: f.operation for f in module.body.operations
                 if isinstance(f, func.FuncOp) and f.name.value.startswith(PREFIX)}
    with ir.InsertionPoint(module.body):
        for call in [op for op in walk(module.operation) if op.name == "func.call"]:
            name = callee(call)
            if name in functions:
                inline_call(call, functions[name].clone())
    for function in functions.values():
        function.erase()
    return bool(functions)


def _sequence(block: ir.Block) -> _Sequence:
    ops = [op.operation for op in block.operations]
    ops, ret = ops[:-1], ops[-1]
    interned: dict[tuple, int] = {}
    keys, uses = [], []
    position: dict[ir.Value, tuple[int, int]] = {}
    last_read: dict[ir.Value, int] = {}
    results = [list(op.results) for op in ops]
    for index, op in enumerate(ops):
        outside: dict[ir.Value, int] = {}
        keys.append(interned.setdefault(_structure(op, outside), len(interned)))
        uses.append(list(outside))
        for value in outside:
            last_read[value] = index
        for number, result in enumerate(results[index]):
            position[result] = (index, number)
    for value in ret.operands:
        last_read[value] = len(ops)
    last_reads = [tuple(last_read.get(r, -1) for r in op_results) for op_results in results]
    return _Sequence(ops, np.array(keys, np.int64), uses, position, last_reads)


def _structure(op: ir.Operation, outside: dict[ir.Value, int]) -> tuple:
    """``op`` without value names, as the ops nested in it in pre-order (each with the
    argument types and op counts of its blocks, which fixes the nesting): operands are
    numbered in order of definition inside ``op`` or of first use from outside (``-n``,
    recorded in ``outside``). Attributes and types are compared as MLIR uniques them (by
    identity). MLIR's walk hands over the nested ops faster than iterating their blocks."""
    local: dict[ir.Value, int] = {}
    number = local.get  # (one lookup per operand: the walk crosses the bindings for every value)
    entries = []
    advance = ir.WalkResult.ADVANCE

    def visit(child: ir.Operation) -> ir.WalkResult:
        operands = tuple(-1 - outside.setdefault(v, len(outside)) if (n := number(v)) is None else n
                         for v in child.operands)
        results = child.results
        for result in results:
            local[result] = len(local)
        nesting = []
        for block in blocks(child):
            arguments = block.arguments
            for argument in arguments:
                local[argument] = len(local)
            nesting.append((tuple(arguments.types), len(block.operations)))
        entries.append((child.name, operands, tuple(child.attributes.items()), tuple(results.types), tuple(nesting)))
        return advance

    op.walk(visit, ir.WalkOrder.PRE_ORDER)
    return tuple(entries)


def _repeats(seq: _Sequence) -> list[_Repeat]:
    """Disjoint repeats whose copies are wired alike, those saving the most ops first; of
    a repeat's phases, one with the fewest values read after a copy (the function's results)."""
    chosen: list[_Repeat] = []
    for run in sorted(_key_repeats(seq.keys), key=lambda r: -(r.count - 1) * r.period):
        if any(_overlap(run, c) for c in chosen):
            continue
        phases = sorted(range(run.start, run.start + run.slack + 1),
                        key=lambda s: len(_outputs(seq, s, run.period)))
        for start in phases[:PHASES_TRIED]:
            repeat = _alike_copies(seq, start, run)
            if repeat is not None:
                chosen.append(repeat)
                break
    return chosen


def _overlap(a: _Repeat, b: _Repeat) -> bool:
    return a.start < b.start + b.count * b.period + b.slack and b.start < a.start + a.count * a.period + a.slack


def _key_repeats(keys: np.ndarray) -> list[_Repeat]:
    """Each maximal stretch of ``keys`` with a period of at least ``MIN_PERIOD``, as its
    copies from its start and the slack left after them."""
    runs = []
    for period in range(MIN_PERIOD, len(keys) // 2 + 1):
        shifted = keys[:-period] == keys[period:]
        # Two copies need ``period`` equalities in a row: fewer in all, none (most periods;
        # the edges below cost four more array passes).
        if np.count_nonzero(shifted) < period:
            continue
        equal = np.concatenate([[False], shifted, [False]])
        edges = np.flatnonzero(np.diff(equal.astype(np.int8)))
        for begin, end in zip(edges[::2].tolist(), edges[1::2].tolist()):
            length = end - begin + period            # keys[begin:begin + length] has this period
            count = length // period
            if count >= 2 and (count - 1) * period >= MIN_SAVED_OPS:
                runs.append(_Repeat(begin, period, count, length - count * period))
    return runs


def _outputs(seq: _Sequence, start: int, period: int) -> list[tuple[int, int]]:
    """(position in the copy, result number) of each value of the copy at ``start`` read after
    it: its last reader is (every reader follows the value's op in the block)."""
    end = start + period
    return [(i - start, n) for i in range(start, end) for n, last in enumerate(seq.last_reads[i]) if last >= end]


def _alike_copies(seq: _Sequence, start: int, run: _Repeat) -> _Repeat | None:
    """The longest stretch of the run's copies from ``start`` that are wired alike."""
    wirings = [_wiring(seq, start + c * run.period, run.period) for c in range(run.count)]
    best = (0, 0)                                   # (copies, first copy)
    first = 0
    for c in range(1, run.count + 1):
        if c == run.count or wirings[c] != wirings[first]:
            best = max(best, (c - first, -first))
            first = c
    count, first = best[0], -best[1]
    if count < 2 or (count - 1) * run.period < MIN_SAVED_OPS:
        return None
    return _Repeat(start + first * run.period, run.period, count)


def _wiring(seq: _Sequence, start: int, period: int) -> list[tuple]:
    """Where each outside value used by the copy at ``start`` comes from, without names."""
    arguments: dict[ir.Value, int] = {}
    wiring = []
    for i in range(start, start + period):
        for value in seq.uses[i]:
            index, number = seq.position.get(value, (-1, 0))
            if start <= index < i:
                wiring.append(("in", index - start, number))
            elif index >= 0 and clonable(value):
                wiring.append(("copied", int(seq.keys[index])))
            else:
                wiring.append(("argument", arguments.setdefault(value, len(arguments))))
    return wiring


def _share(seq: _Sequence, repeat: _Repeat, name: str) -> None:
    """Each copy after the first becomes a call (its arguments taken where the first copy's
    are); then the first copy moves into the function ``name``."""
    starts = [repeat.start + c * repeat.period for c in range(repeat.count)]
    copies = [seq.ops[s:s + repeat.period] for s in starts]
    outputs = sorted({o for s in starts for o in _outputs(seq, s, repeat.period)})
    types = [copies[0][i].results[n].type for i, n in outputs]
    for start, copy in zip(starts[1:], copies[1:]):
        with ir.InsertionPoint(copy[-1]):
            call = func.CallOp(types, name, _arguments(seq, start, repeat.period))
        for (i, n), value in zip(outputs, call.results):
            copy[i].results[n].replace_all_uses_with(value)
            seq.replaced[copy[i].results[n]] = value
        for op in reversed(copy):
            op.erase()
    results = [copies[0][i].results[n] for i, n in outputs]
    call, _ = isolate(copies[0], name, results)
    seq.replaced.update(zip(results, call.results))


def _arguments(seq: _Sequence, start: int, period: int) -> list[ir.Value]:
    """The arguments ``isolate`` would give the copy at ``start``, in its order (by first
    use), from the values its ops use as ``_sequence`` found them, the results of copies
    shared since replaced: the copy is not walked again (ViT-Tiny: 11 copies, 17 ms)."""
    end = start + period
    used = dict.fromkeys(value for i in range(start, end) for value in seq.uses[i]
                         if not start <= seq.position.get(value, (-1, 0))[0] < end)
    return [v for v in (seq.replaced.get(value, value) for value in used) if not clonable(v)]
