"""Loops for the program generator: lax.scan, lax.fori_loop and lax.while_loop specs.

A ``loop`` op holds its body as a nested spec: the body's ``param`` ops are its
parameters (scan: the carries, then one row of each of xs; fori and while: the counter,
then the carries), an ``outer`` op reads a value of the enclosing program (a closed-over
array), and the body names the values it returns as the next carries and, in a scan,
the rows stacked into ys. The loop may run under ``vmap``, ``jvp`` or ``grad``. A loop
op's value is the tuple of its results; ``element`` ops take them out one by one.
"""
from __future__ import annotations

import math

from hypothesis import strategies as st

from . import programs

DIFFERENTIABLE = ("float32", "float64")  # jvp and grad: a few ulps of f16 error grow through a loop
TRANSFORMS = ("none", "vmap", "jvp", "grad")
# The body's op kinds: small ones, so that a loop of six steps compiles fast.
BODY_KINDS = ("unary", "binary", "compare", "cast", "broadcast", "reduce", "reshape", "transpose",
              "slice", "concat", "roll", "pad", "rev", "dot", "gather", "dynamic_slice", "cond", "cumulative",
              "row", "loop")
MAX_DEPTH = 2  # a loop in a loop, no deeper


class Body(programs.Program):
    """A loop body under construction: a new input is an input of the enclosing program
    that the body closes over."""

    def __init__(self, parent: programs.Program) -> None:
        super().__init__(parent.draw, parent.dtypes, parent.depth + 1)
        self.parent = parent
        self.counter: int | None = None  # the fori or while counter's value, if any

    def param(self, shape, dtype: str) -> int:
        return self.add({"op": "param", "shape": list(shape), "dtype": dtype}, shape, dtype)

    def new_input(self, shape, dtype: str, special: bool = True) -> int:
        outer = self.parent.new_input(shape, dtype, special)
        return self.add({"op": "outer", "x": outer}, shape, dtype)


def _small(p: programs.Program, x: int, dtypes: tuple[str, ...]) -> int:
    """x if it is small and of one of ``dtypes``, else a new input of a small shape."""
    shape, dtype = p.values[x]
    if dtype in dtypes and math.prod(shape) <= 16 and len(shape) <= 2:
        return x
    return p.new_input(programs.random_shape(p.draw, 0, 2), p.draw(st.sampled_from(dtypes)))


def fit(p: programs.Program, z: int, shape, dtype: str) -> int:
    """z made into a value of ``shape`` and ``dtype``: reduced to a scalar (always if its
    shape differs, maybe if not), cast, broadcast."""
    zs, zd = p.values[z]
    if zs and (zs != tuple(shape) or p.draw(st.booleans())):
        fn = p.draw(st.sampled_from(("max", "min") if zd == "bool" else ("sum",) if programs.kind(zd) == "complex"
                                    else ("sum", "max")))
        z = p.add({"op": "reduce", "fn": fn, "x": z, "axes": list(range(len(zs)))}, (), zd)
        zs = ()
    if zd != dtype:
        z = p.add({"op": "cast", "x": z, "dtype": dtype}, zs, dtype)
    if zs != tuple(shape):
        z = p.add({"op": "broadcast", "x": z, "shape": list(shape), "dims": []}, shape, dtype)
    return z


def gen_row(p: programs.Program, x: int) -> None:
    """In a fori or while body: the row at the counter of a closed-over array (rows past
    the end clamp, as dynamic_slice does), then maybe a constant slice of it."""
    if not isinstance(p, Body) or p.counter is None:
        return programs.GENERATORS["unary"](p, x)
    shape, dtype = p.values[x]
    full = p.new_input([p.draw(st.integers(1, 6))] + list(shape), dtype)
    p.add({"op": "row", "x": full, "i": p.counter}, shape, dtype)


def _carries(p: programs.Program, x: int, transform: str, loop: str, n: int) -> list[int]:
    """The initial carries: x (or a small stand-in) first, then new inputs of other shapes
    and dtypes; in a fori or while loop maybe a buffer of n rows that the body fills."""
    floats = DIFFERENTIABLE if transform in ("jvp", "grad") else programs.DTYPES
    carries = [_small(p, x, floats)]
    for _ in range(p.draw(st.integers(0, 2))):
        carries.append(p.new_input(programs.random_shape(p.draw, 0, 2), p.draw(st.sampled_from(programs.DTYPES))))
    if loop != "scan" and p.draw(st.booleans()):
        row = programs.random_shape(p.draw, 0, 1)
        carries.append(p.new_input([max(n, 1)] + row, p.draw(st.sampled_from(floats))))
    return carries


def _body(p: programs.Program, loop: dict, carries: list[int], xs: list[int]) -> dict:
    """The body's spec: its parameters, a few ops, the next carries and the rows of ys."""
    b = Body(p)
    if loop["kind"] != "scan":
        b.counter = b.param((), "int32")
    params = [b.param(p.values[c][0], p.values[c][1]) for c in carries]
    params += [b.param(p.values[x][0][1:], p.values[x][1]) for x in xs]
    for _ in range(b.draw(st.integers(1, 4))):
        target = b.pick(lambda s, d: math.prod(s) <= 64)
        programs.GENERATORS[b.draw(st.sampled_from(BODY_KINDS))](b, target)
    nexts = []
    for c, param in zip(carries, params):
        shape, dtype = p.values[c]
        if loop["kind"] != "scan" and shape and shape[0] == loop["n"] and b.draw(st.booleans()):
            row = fit(b, b.pick(), shape[1:], dtype)  # a stacked output, one row per step
            nexts.append(b.add({"op": "put_row", "x": param, "upd": row, "i": b.counter}, shape, dtype))
            continue
        update = fit(b, b.pick(), shape, dtype)
        if b.draw(st.booleans()):  # a loop-carried reduction: the carry folds in the update
            fn = b.draw(st.sampled_from(("add", "max", "mul") if dtype != "bool" else ("or", "and")))
            update = b.add({"op": "binary", "fn": fn, "x": param, "y": update}, shape, dtype)
        nexts.append(update)
    ys = [] if loop["kind"] != "scan" else sorted(b.draw(st.sets(
        st.sampled_from([i for i, (s, d) in enumerate(b.values) if math.prod(s) <= 32]), max_size=2)))
    return {"ops": b.ops, "carry": nexts, "ys": ys, "values": b.values}


def gen_loop(p: programs.Program, x: int) -> None:
    """A scan, fori_loop or while_loop of up to 6 steps over x and other carries, maybe
    partially unrolled, maybe under vmap, jvp or grad; then its results as values."""
    if p.depth >= MAX_DEPTH:
        return programs.GENERATORS["unary"](p, x)
    draw = p.draw
    kind = draw(st.sampled_from(("scan", "fori", "while")))
    transform = draw(st.sampled_from(TRANSFORMS if kind != "while" else TRANSFORMS[:3]))
    n = draw(st.integers(1 if kind == "scan" else 0, 6))
    loop = {"op": "loop", "kind": kind, "n": n, "transform": transform}
    if kind != "while":
        loop["unroll"] = draw(st.sampled_from((1, 2, 3, True)))
    if kind == "scan":
        loop["reverse"] = draw(st.booleans())
    if kind == "fori":
        loop["start"] = draw(st.integers(0, 1))
    carries = _carries(p, x, transform, kind, n)
    xs = []
    if kind == "scan":
        floats = DIFFERENTIABLE if transform in ("jvp", "grad") else programs.DTYPES
        xs = [p.new_input([n] + programs.random_shape(draw, 0, 2), draw(st.sampled_from(floats)))
              for _ in range(draw(st.integers(1, 2)))]
    if kind == "while" and draw(st.booleans()):
        loop["bound"] = p.new_input([], "int32")  # runs min(bound, n) steps
    body = _body(p, loop, carries, xs)
    values = body.pop("values")
    loop.update(carry=carries, xs=xs, body=body)
    args = carries + xs + ([loop["bound"]] if "bound" in loop else [])
    outs = [p.values[c] for c in carries] + [((n,) + values[y][0], values[y][1]) for y in body["ys"]]
    outs = _transform(p, loop, args, outs)
    tuple_id = p.add(loop, (), "tuple")
    for i, (shape, dtype) in enumerate(outs):
        p.add({"op": "element", "x": tuple_id, "i": i}, shape, dtype)


def _transform(p: programs.Program, loop: dict, args: list[int], outs: list) -> list:
    """Fill in the transform's extra inputs; the shapes and dtypes of its results."""
    draw, transform = p.draw, loop["transform"]
    if transform == "vmap":
        batch = draw(st.integers(1, 3))
        axes = [0] + [draw(st.sampled_from((0, None))) for _ in args[1:]]  # the first carry is batched
        loop["in_axes"] = axes
        loop["batched"] = [p.new_input((batch,) + p.values[a][0], p.values[a][1]) if axis == 0 else a
                           for a, axis in zip(args, axes)]
        return [((batch,) + s, d) for s, d in outs]
    if transform == "jvp":
        # Tangents and cotangents are finite: JAX's derivative of a max multiplies them by a 0/1
        # mask, which XLA simplifies to a select (NaN * 0 gives 0 there, NaN here, as IEEE says).
        loop["tangents"] = [p.new_input(*p.values[a], special=False) for a in args if p.values[a][1] in DIFFERENTIABLE]
        return outs + [o for o in outs if o[1] in programs.FLOATS]
    if transform == "grad":
        loop["cotangents"] = [p.new_input(*o, special=False) if o[1] in DIFFERENTIABLE else None for o in outs]
        return [p.values[a] for a in args if p.values[a][1] in DIFFERENTIABLE]
    return outs


def loop_programs(max_ops: int = 4):
    """Programs built around a loop: a loop first, then up to ``max_ops`` more ops of any kind."""
    return programs.programs(max_ops=max_ops, first="loop")
