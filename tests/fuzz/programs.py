"""Random valid JAX programs as plain JSON specs, drawn by hypothesis strategies.

A spec is data, not code, so a failing program can be written to a file and replayed:
``{"seed": int, "ops": [...], "outputs": [...]}``. Op ``k`` defines value ``k``; an
``input`` op adds a function argument; a ``loop`` op holds its body as a nested spec
(loop_programs.py). interpret.py turns a spec into a JAX function and its arguments.
"""
from __future__ import annotations

import math
from typing import Callable

from hypothesis import strategies as st

FLOATS = ("float32", "float16", "bfloat16", "float64")
INTS = ("int32", "int8", "uint8", "uint32", "int64")
DTYPES = FLOATS + INTS + ("bool",)
COMPLEX = ("complex64", "complex128")  # drawn only by programs(dtypes=...) that name them

UNARY = {
    "float": ("neg", "abs", "exp", "tanh", "floor", "sign", "log", "sin", "sqrt", "rsqrt", "ceil",
              "round", "logistic", "expm1", "log1p", "cos", "erf"),
    "int": ("neg", "abs", "not", "sign", "population_count", "clz"),
    "uint": ("neg", "not", "sign", "population_count", "clz"),
    "bool": ("not",),
    # those whose results on infinite and NaN parts are XLA's too (abs changes the dtype)
    "complex": ("neg", "exp", "sign", "log", "sin", "sqrt", "expm1", "log1p", "cos", "tan", "tanh"),
}
BINARY = {
    "float": ("add", "sub", "mul", "max", "min", "div", "rem", "pow", "atan2"),
    "int": ("add", "sub", "mul", "max", "min", "div", "rem", "and", "or", "xor",
            "shift_left", "shift_right_logical", "shift_right_arithmetic"),
    "uint": ("add", "sub", "mul", "max", "min", "div", "rem", "and", "or", "xor",
             "shift_left", "shift_right_logical", "shift_right_arithmetic"),
    "bool": ("and", "or", "xor", "max", "min"),
    "complex": ("add", "sub", "mul", "div"),
}
COMPARES = ("lt", "le", "eq", "ne", "gt", "ge")
# Not in loop bodies: repeated, these grow a few ulps of difference from XLA's approximations
# past any tolerance (exp(exp(x)) multiplies exp's relative error by x).
GROWING = ("exp", "expm1", "pow")
REDUCERS = ("sum", "max", "min", "prod")
# A dot's preferred_element_type wider than its operands: mixed-precision matmuls.
WIDER = {"bfloat16": "float32", "float16": "float32", "int8": "int32", "uint8": "uint32", "float32": "float64"}

# Shapes: small dims by default; LARGE ones (odd sizes, primes, 1) reach the tiled, vectorized,
# parallel and packed paths the cost models take only above some work size. ``cap`` bounds
# the elements of a value drawn so (and of the values chosen to build on).
SMALL = {"dim": st.integers(1, 5), "cap": 256}
LARGE = {"dim": st.one_of(st.integers(1, 5), st.sampled_from((1, 7, 16, 17, 31, 33, 64, 97, 127, 128, 131,
                                                               256, 257, 300)), st.integers(33, 300)),
         "cap": 1 << 16}
# Matrices of hundreds of rows and columns: a contraction's k tiles (one peeled where no divisor
# of k fits) inside loops over blocks of A's rows, beside small dims (matrix-vector products).
BLOCKS = {"dim": st.one_of(st.integers(1, 8), st.integers(250, 1100)), "cap": 1 << 20}
# Matrices of a few hundred rows of odd widths: enough work for the parallel loop over rows,
# and a remainder past the last full vector of each row (a mask hoisted out of that loop).
ROWS = {"dim": st.sampled_from((131, 150, 197, 200, 257, 300)), "cap": 1 << 17}
# Matrices of many short rows, and of few: rows of one against rows of another (pairwise) make
# register tiles whose rows and remainder columns are of one size.
PAIRS = {"dim": st.sampled_from((1, 2, 3, 4, 5, 8, 16, 24, 64, 100, 131, 200)), "cap": 1 << 15}

def kind(dtype: str) -> str:
    if dtype in COMPLEX:
        return "complex"
    if dtype in FLOATS or dtype == "bool":
        return "float" if dtype in FLOATS else "bool"
    return "uint" if dtype.startswith("u") else "int"


# ---------------------------------------------------------------- generation


class Program:
    """The spec under construction and the (shape, dtype) of every value so far; ``depth``
    counts the loop bodies it is nested in."""

    def __init__(self, draw, dtypes: tuple[str, ...] = DTYPES, depth: int = 0, shapes: dict = SMALL) -> None:
        self.draw, self.dtypes, self.depth, self.ops, self.values = draw, dtypes, depth, [], []
        self.shapes = shapes

    def shape(self, min_rank: int = 0, max_rank: int = 3, within: int = 1) -> list[int]:
        """A random shape of this program's dims, of at most ``shapes["cap"] // within`` elements."""
        budget = max(1, self.shapes["cap"] // max(within, 1))
        out = []
        for _ in range(self.draw(st.integers(min_rank, max_rank))):
            out.append(max(1, min(self.draw(self.shapes["dim"]), budget)))
            budget //= out[-1]
        return out

    def fns(self, table: dict[str, tuple[str, ...]], dtype: str) -> tuple[str, ...]:
        """The functions of ``table`` for ``dtype`` this program may use."""
        return tuple(f for f in table[kind(dtype)] if not (self.depth and f in GROWING))

    def add(self, op: dict, shape, dtype: str) -> int:
        self.ops.append(op)
        self.values.append((tuple(shape), dtype))
        return len(self.values) - 1

    def new_input(self, shape, dtype: str, special: bool = True) -> int:
        """A new argument; its values maybe special (interpret.make_inputs says which)."""
        edge = self.draw(st.sampled_from((False, True, "dense"))) if special else False
        return self.add({"op": "input", "shape": list(shape), "dtype": dtype, "edge": edge}, shape, dtype)

    def pick(self, predicate: Callable[[tuple, str], bool] = lambda s, d: True) -> int | None:
        """A value satisfying ``predicate``, preferring recent ones (shrinks toward the last)."""
        found = [i for i in reversed(range(len(self.values)))
                 if self.values[i][1] != "tuple" and predicate(*self.values[i])]  # not a loop's results
        return self.draw(st.sampled_from(found)) if found else None

    def partner(self, x: int) -> int:
        """A value of x's shape and dtype: an existing one, or a new input broadcast to it."""
        shape, dtype = self.values[x]
        same = self.pick(lambda s, d: s == shape and d == dtype)
        if self.draw(st.booleans()):
            return same
        dims = sorted(self.draw(st.sets(st.sampled_from(range(len(shape))))) if shape else [])
        y = self.new_input([shape[d] for d in dims], dtype)
        return self.add({"op": "broadcast", "x": y, "shape": list(shape), "dims": dims}, shape, dtype)


def random_shape(draw, min_rank: int = 0, max_rank: int = 3) -> list[int]:
    return draw(st.lists(SMALL["dim"], min_size=min_rank, max_size=max_rank))


def _gen_unary(p: Program, x: int) -> None:
    shape, dtype = p.values[x]
    p.add({"op": "unary", "fn": p.draw(st.sampled_from(p.fns(UNARY, dtype))), "x": x}, shape, dtype)


def _gen_binary(p: Program, x: int) -> None:
    shape, dtype = p.values[x]
    fn = p.draw(st.sampled_from(p.fns(BINARY, dtype)))
    p.add({"op": "binary", "fn": fn, "x": x, "y": p.partner(x)}, shape, dtype)


def _gen_compare_select(p: Program, x: int) -> None:
    shape, dtype = p.values[x]
    fns = ("eq", "ne") if kind(dtype) == "complex" else COMPARES  # complex numbers have no order
    pred = p.add({"op": "compare", "fn": p.draw(st.sampled_from(fns)), "x": x, "y": p.partner(x)},
                 shape, "bool")
    if p.draw(st.booleans()):
        p.add({"op": "select", "p": pred, "x": x, "y": p.partner(x)}, shape, dtype)


def _gen_cast(p: Program, x: int) -> None:
    shape, _ = p.values[x]
    dtype = p.draw(st.sampled_from(p.dtypes))
    p.add({"op": "cast", "x": x, "dtype": dtype}, shape, dtype)


def _gen_broadcast(p: Program, x: int) -> None:
    shape, dtype = p.values[x]
    if len(shape) >= 4:
        return _gen_unary(p, x)
    at = p.draw(st.integers(0, len(shape)))
    out = list(shape[:at]) + p.shape(1, 1, within=math.prod(shape)) + list(shape[at:])
    dims = [d if d < at else d + 1 for d in range(len(shape))]
    p.add({"op": "broadcast", "x": x, "shape": out, "dims": dims}, out, dtype)


def _gen_pairwise(p: Program, x: int) -> None:
    """Every row of a matrix x against every row of a new matrix y, combined elementwise and
    reduced along the rows' length (squared distances, kernels, k-means): both broadcast to
    (rows of x, rows of y, length), each missing another loop of the vectorized tile."""
    shape, dtype = p.values[x]
    if len(shape) != 2 or dtype == "bool":
        dtype = "float32" if dtype == "bool" else dtype
        x = p.new_input(p.shape(2, 2), dtype)
        shape = p.values[x][0]
    rows, length = shape
    others = p.draw(st.one_of(p.shapes["dim"], st.sampled_from((4, 8, 16, 24, 100, 200))))
    others = max(1, min(others, 4 * p.shapes["cap"] // max(1, rows * length)))
    y = p.new_input([others, length], dtype)
    out = [rows, others, length]
    bx = p.add({"op": "broadcast", "x": x, "shape": out, "dims": [0, 2]}, out, dtype)
    by = p.add({"op": "broadcast", "x": y, "shape": out, "dims": [1, 2]}, out, dtype)
    # XLA's fused max and min drop NaN (a max of a (200, 24) float32 matrix along its rows has
    # no NaN where a row holds one; so has maximum(NaN, y) summed along them): floats are
    # combined otherwise and summed or multiplied here
    integers = kind(dtype) in ("int", "uint")
    fn = p.draw(st.sampled_from([f for f in p.fns(BINARY, dtype) if integers or f not in ("max", "min")]))
    z = p.add({"op": "binary", "fn": fn, "x": bx, "y": by}, out, dtype)
    reducer = p.draw(st.sampled_from(REDUCERS if integers else ("sum", "prod")))
    p.add({"op": "reduce", "fn": reducer, "x": z, "axes": [2]}, out[:2], dtype)


def _gen_reduce(p: Program, x: int) -> None:
    shape, dtype = p.values[x]
    axes = sorted(p.draw(st.sets(st.sampled_from(range(len(shape))), min_size=1))) if shape else []
    fn = p.draw(st.sampled_from(REDUCERS[1:3] if dtype == "bool" else
                                ("sum", "prod") if kind(dtype) == "complex" else REDUCERS))
    out = [n for d, n in enumerate(shape) if d not in axes]
    op = {"op": "reduce", "fn": fn, "x": x, "axes": axes}
    if fn == "sum" and dtype != "bool" and p.draw(st.booleans()):
        op["beside_constant"] = True  # a sum of ones beside x's: a reduction whose summed value reads no input
    p.add(op, out, dtype)


def _gen_dot(p: Program, x: int) -> None:
    """dot_general of x with a new operand: some dims of x batch, some contract, the rest stay
    free; the new operand's dims in any order; narrow operands maybe accumulated wider."""
    shape, dtype = p.values[x]
    if dtype == "bool" or not shape:
        return _gen_binary(p, x)
    roles = p.draw(st.lists(st.sampled_from(("free", "contract", "batch")), min_size=len(shape),
                            max_size=len(shape)))
    batch = [d for d, r in enumerate(roles) if r == "batch"]
    contract = [d for d, r in enumerate(roles) if r == "contract"]
    kept = math.prod(n for n, r in zip(shape, roles) if r != "contract")
    # y (batch, contract and its free dims) and the result (batch and both free dims) within the cap
    shared = math.prod(shape[d] for d in batch + contract)
    free_y = p.shape(0, 2 if len(shape) - len(contract) < 3 else 1, within=max(kept, shared))
    nb, nc = len(batch), len(contract)
    canonical = [shape[d] for d in batch] + [shape[d] for d in contract] + free_y  # y's dims, canonically
    perm = list(p.draw(st.permutations(range(len(canonical)))))  # y's dim i is canonical dim perm[i]
    y = p.new_input([canonical[c] for c in perm], dtype)
    out = ([shape[d] for d in batch] + [shape[d] for d in range(len(shape)) if roles[d] == "free"]
           + [canonical[c] for c in perm if c >= nb + nc])  # y's free dims in y's order
    if len(out) > 4:
        return None
    op = {"op": "dot", "x": x, "y": y, "contract": [contract, [perm.index(nb + j) for j in range(nc)]],
          "batch": [batch, [perm.index(j) for j in range(nb)]]}
    wider = WIDER.get(dtype)
    if wider and p.draw(st.booleans()):
        op["preferred"] = dtype = wider
    p.add(op, out, dtype)


def _conv_window(draw, size: int) -> tuple[dict, int]:
    """One spatial dim's kernel size, stride, padding and dilations with an output of at least 1."""
    lhs_dil, rhs_dil, stride = draw(st.integers(1, 2)), draw(st.integers(1, 2)), draw(st.integers(1, 2))
    lo, hi = draw(st.integers(0, 2)), draw(st.integers(0, 2))
    span = (size - 1) * lhs_dil + 1 + lo + hi
    k = draw(st.integers(1, max(1, min(3, (span - 1) // rhs_dil + 1))))
    if (k - 1) * rhs_dil + 1 > span:
        k, rhs_dil = 1, 1
    out = (span - (k - 1) * rhs_dil - 1) // stride + 1
    return {"k": k, "stride": stride, "pad": [lo, hi], "lhs_dil": lhs_dil, "rhs_dil": rhs_dil}, out


def _gen_conv(p: Program, x: int) -> None:
    """A 1-D or 2-D convolution, channels first or last, maybe grouped; x is the image if it fits."""
    shape, dtype = p.values[x]
    layout = p.draw(st.sampled_from(("first", "last")))
    if kind(dtype) not in ("float", "complex") or len(shape) not in (3, 4):
        dtype = dtype if kind(dtype) == "float" else "float32"
        shape = p.shape(3, 4)
        x = p.new_input(shape, dtype)
    spatial = list(shape[2:]) if layout == "first" else list(shape[1:-1])
    channels = shape[1] if layout == "first" else shape[-1]
    groups = p.draw(st.sampled_from([g for g in (1, 2, 3) if channels % g == 0]))
    # batch_group_count (the weight gradient of a convolution) only where groups is 1
    batch_groups = p.draw(st.sampled_from([b for b in (1, 2, 3) if shape[0] % b == 0 and (b == 1 or groups == 1)]))
    windows, outs = zip(*[_conv_window(p.draw, n) for n in spatial])
    features = groups * batch_groups * p.shape(1, 1, within=math.prod(shape) // channels * 4)[0]
    kernel = [features, channels // groups] + [w["k"] for w in windows]  # OI + spatial
    w = p.new_input(kernel, dtype)
    n = shape[0] // batch_groups
    out = [n, features] + list(outs) if layout == "first" else [n] + list(outs) + [features]
    op = {"op": "conv", "x": x, "w": w, "layout": layout, "groups": groups, "windows": list(windows)}
    if batch_groups > 1:
        op["batch_groups"] = batch_groups
    p.add(op, out, dtype)


def _gen_window(p: Program, x: int) -> None:
    """A max, min or sum pooling (windows of up to 3, strides up to 3, padding less than a
    window), or a max or min pooling's gradient weighted by a new input (select_and_scatter)."""
    shape, dtype = p.values[x]
    if not shape or dtype == "bool":
        return _gen_unary(p, x)
    fn = p.draw(st.sampled_from(("add",) if kind(dtype) == "complex" else ("max", "min", "add")))
    dims, strides, pad, out = [], [], [], []
    for n in shape:
        k = p.draw(st.integers(1, 3))
        lo, hi = p.draw(st.integers(0, k - 1)), p.draw(st.integers(0, k - 1))
        k = min(k, n + lo + hi)
        stride = p.draw(st.integers(1, 3))
        dims.append(k)
        strides.append(stride)
        pad.append([lo, hi])
        out.append((n + lo + hi - k) // stride + 1)
    op = {"op": "window", "fn": fn, "x": x, "dims": dims, "strides": strides, "pad": pad}
    if fn != "add" and kind(dtype) == "float" and p.draw(st.booleans()):
        op["g"] = p.new_input(out, dtype)
        p.add(op, shape, dtype)
    else:
        p.add(op, out, dtype)


def _gen_gather(p: Program, x: int) -> None:
    shape, dtype = p.values[x]
    if not shape:
        return _gen_unary(p, x)
    axis = p.draw(st.integers(0, len(shape) - 1))
    idx_shape = p.shape(0, 2, within=math.prod(shape) // shape[axis])
    out = list(shape[:axis]) + idx_shape + list(shape[axis + 1:])
    if len(out) > 4:
        return None
    # JAX's wrap mode takes the index modulo the axis in the index's type: uint8 holds no 256
    kinds = ("int32", "int64", "uint8") if shape[axis] < 256 else ("int32", "int64")
    idx = p.new_input(idx_shape, p.draw(st.sampled_from(kinds)))
    mode = p.draw(st.sampled_from(("clip", "fill", "wrap")))
    p.add({"op": "gather", "x": x, "idx": idx, "axis": axis, "mode": mode}, out, dtype)


def _gen_scatter(p: Program, x: int) -> None:
    shape, dtype = p.values[x]
    if not shape:
        return _gen_unary(p, x)
    idx = p.new_input(p.shape(1, 1, within=math.prod(shape[1:])), "int32")
    upd = p.new_input(list(p.values[idx][0]) + list(shape[1:]), dtype)
    fn = p.draw(st.sampled_from(("set", "max", "min") if dtype == "bool" else ("set", "add")
                                if kind(dtype) == "complex" else ("set", "add", "max", "min")))
    mode = p.draw(st.sampled_from(("drop", "clip")))
    p.add({"op": "scatter", "fn": fn, "x": x, "idx": idx, "upd": upd, "mode": mode}, shape, dtype)


def _gen_dynamic_slice(p: Program, x: int) -> None:
    shape, dtype = p.values[x]
    starts = [p.new_input([], "int32") for _ in shape]
    sizes = [p.draw(st.integers(1, n)) for n in shape]
    if p.draw(st.booleans()):
        p.add({"op": "dynamic_slice", "x": x, "starts": starts, "sizes": sizes}, sizes, dtype)
    else:
        upd = p.new_input(sizes, dtype)
        p.add({"op": "dynamic_update_slice", "x": x, "upd": upd, "starts": starts}, shape, dtype)


def _gen_slice(p: Program, x: int) -> None:
    shape, dtype = p.values[x]
    start = [p.draw(st.integers(0, n - 1)) for n in shape]
    limit = [p.draw(st.integers(s + 1, n)) for s, n in zip(start, shape)]
    stride = [p.draw(st.integers(1, 2)) for _ in shape]
    out = [(hi - lo + s - 1) // s for lo, hi, s in zip(start, limit, stride)]
    p.add({"op": "slice", "x": x, "start": start, "limit": limit, "stride": stride}, out, dtype)


def _gen_reshape(p: Program, x: int) -> None:
    shape, dtype = p.values[x]
    size, out = math.prod(shape), []
    while size > 1 and len(out) < 3:
        d = p.draw(st.sampled_from([f for f in range(1, size + 1) if size % f == 0]))
        out.append(d)
        size //= d
    if size > 1 or not out:
        out.append(size)
    p.add({"op": "reshape", "x": x, "shape": out}, out, dtype)


def _gen_transpose(p: Program, x: int) -> None:
    shape, dtype = p.values[x]
    perm = p.draw(st.permutations(range(len(shape))))
    p.add({"op": "transpose", "x": x, "perm": list(perm)}, [shape[d] for d in perm], dtype)


def _gen_rev(p: Program, x: int) -> None:
    shape, dtype = p.values[x]
    dims = sorted(p.draw(st.sets(st.sampled_from(range(len(shape))), min_size=1))) if shape else []
    p.add({"op": "rev", "x": x, "dims": dims}, shape, dtype)


def _gen_concat(p: Program, x: int) -> None:
    shape, dtype = p.values[x]
    if not shape:
        return _gen_unary(p, x)
    axis = p.draw(st.integers(0, len(shape) - 1))
    other = list(shape)
    other[axis] = p.draw(st.integers(1, 4))
    y = p.pick(lambda s, d: d == dtype and len(s) == len(shape)
               and all(a == b for i, (a, b) in enumerate(zip(s, shape)) if i != axis))
    y = y if y is not None and p.draw(st.booleans()) else p.new_input(other, dtype)
    out = list(shape)
    out[axis] += p.values[y][0][axis]
    p.add({"op": "concat", "xs": [x, y], "axis": axis}, out, dtype)


def _gen_roll(p: Program, x: int) -> None:
    # jnp.roll: two slices of x concatenated, its shape kept; an elementwise op of rolls
    # along several axes (a stencil) is computed on the boxes of all their parts.
    shape, dtype = p.values[x]
    if not shape:
        return _gen_unary(p, x)
    axis = p.draw(st.integers(0, len(shape) - 1))
    shift = p.draw(st.integers(-shape[axis], shape[axis]))
    p.add({"op": "roll", "x": x, "shift": shift, "axis": axis}, shape, dtype)


def _gen_pad(p: Program, x: int) -> None:
    shape, dtype = p.values[x]
    mode = p.draw(st.sampled_from(("constant", "reflect", "symmetric", "wrap", "edge")))
    if mode != "constant" and shape:
        # jnp.pad's modes that copy the value's own edges: slices of the concatenation built
        # so far, one side after the other (wider than the value: several rounds).
        widths = [[p.draw(st.integers(0, 3)), p.draw(st.integers(0, 3))] for _ in shape]
        out = [n + lo + hi for n, (lo, hi) in zip(shape, widths)]
        p.add({"op": "pad", "x": x, "mode": mode, "widths": widths}, out, dtype)
        return
    config = []
    for n in shape:
        interior = p.draw(st.integers(0, 1))
        full = n + (n - 1) * interior
        lo, hi = p.draw(st.integers(-min(1, full - 1), 2)), p.draw(st.integers(-min(1, full - 1), 2))
        if full + lo + hi < 1:
            lo, hi = 0, 0
        config.append([lo, hi, interior])
    out = [n + (n - 1) * i + lo + hi for n, (lo, hi, i) in zip(shape, config)]
    p.add({"op": "pad", "x": x, "config": config}, out, dtype)


def _gen_cond(p: Program, x: int) -> None:
    shape, dtype = p.values[x]
    fns = [p.draw(st.sampled_from(p.fns(UNARY, dtype))) for _ in range(2)]
    p.add({"op": "cond", "p": p.pick(), "x": x, "fns": fns}, shape, dtype)


def _gen_fori(p: Program, x: int) -> None:
    shape, dtype = p.values[x]
    fn = p.draw(st.sampled_from(p.fns(BINARY, dtype)))
    p.add({"op": "fori", "x": x, "y": p.partner(x), "fn": fn, "n": p.draw(st.integers(0, 4))}, shape, dtype)


def _gen_sort(p: Program, x: int) -> None:
    shape, dtype = p.values[x]
    if not shape:
        return _gen_unary(p, x)
    axis = p.draw(st.integers(0, len(shape) - 1))
    if p.draw(st.booleans()):  # the positions a stable sort moves the elements from: ties decide
        p.add({"op": "sort", "x": x, "axis": axis, "indices": True}, shape, "int32")
    else:
        p.add({"op": "sort", "x": x, "axis": axis}, shape, dtype)


def _gen_cumulative(p: Program, x: int) -> None:
    shape, dtype = p.values[x]
    if not shape or dtype == "bool":
        return _gen_unary(p, x)
    fn = p.draw(st.sampled_from(("cumsum",) if kind(dtype) == "complex" else ("cumsum", "cummax", "cummin")))
    p.add({"op": fn, "x": x, "axis": p.draw(st.integers(0, len(shape) - 1)),
           "reverse": p.draw(st.booleans())}, shape, dtype)


# Simplest first: hypothesis shrinks a sampled choice toward the start of the list.
GENERATORS = {"unary": _gen_unary, "binary": _gen_binary, "compare": _gen_compare_select,
              "cast": _gen_cast, "broadcast": _gen_broadcast, "reduce": _gen_reduce,
              "reshape": _gen_reshape, "transpose": _gen_transpose, "slice": _gen_slice,
              "concat": _gen_concat, "roll": _gen_roll, "pad": _gen_pad, "rev": _gen_rev, "dot": _gen_dot,
              "conv": _gen_conv, "gather": _gen_gather, "scatter": _gen_scatter,
              "dynamic_slice": _gen_dynamic_slice, "cond": _gen_cond, "fori": _gen_fori,
              "sort": _gen_sort, "cumulative": _gen_cumulative, "window": _gen_window,
              "pairwise": _gen_pairwise}


from . import loop_programs  # noqa: E402 (loops build on Program and GENERATORS above)


# Looked up when called: loop_programs may be the module imported first, still incomplete here.
def _gen_loop(p: Program, x: int) -> None:
    loop_programs.gen_loop(p, x)


def _gen_row(p: Program, x: int) -> None:
    loop_programs.gen_row(p, x)


GENERATORS.update(loop=_gen_loop, row=_gen_row)

from . import edge_ops  # noqa: E402 (as loop_programs)

GENERATORS.update(edge_ops.GENERATORS)
KINDS = tuple(k for k in GENERATORS if k != "row")  # a counter's row is for loop bodies only


@st.composite
def programs(draw, max_ops: int = 6, kinds: tuple[str, ...] = KINDS, first: str | None = None,
             dtypes: tuple[str, ...] = DTYPES, shapes: dict = SMALL, transforms: bool = False) -> dict:
    """A random valid program spec of up to ``max_ops`` op steps drawn from ``kinds``, after
    one of kind ``first`` if given; its first input and its casts of ``dtypes``; its shapes
    SMALL or LARGE; with ``transforms`` the whole program under vmap, jvp or grad."""
    p = Program(draw, dtypes, shapes=shapes)
    p.new_input(p.shape(), draw(st.sampled_from(dtypes)))
    more = draw(st.integers(0 if first else 1, max_ops))
    for step in range(more + bool(first)):
        x = p.pick(lambda s, d: math.prod(s) <= shapes["cap"])
        k = first if first and step == 0 else draw(st.sampled_from(kinds))
        GENERATORS[k](p, x if x is not None else len(p.values) - 1)
    computed = [i for i, op in enumerate(p.ops) if op["op"] not in ("input", "loop")]
    extra = draw(st.sets(st.sampled_from(computed), max_size=2))
    outputs = sorted(extra | {computed[-1]}) if computed else [0]
    spec = {"seed": draw(st.integers(0, 2**16)), "ops": p.ops, "outputs": outputs}
    if transforms:
        spec["transform"] = edge_ops.program_transform(p, outputs)
    return spec
