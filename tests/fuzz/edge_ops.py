"""Op kinds at the edges of XLA's semantics for the program generator, and whole-program transforms.

argmax and argmin (a reduction of two operands: ties, NaN), reduce_precision, clamp (bounds
maybe crossed), iota (wrapping or rounding in narrow types), top_k, float to integer casts
of values out of the integer's range (saturating), bitcasts between types of equal or
other widths, and vmap, jvp or grad of a whole program.
"""
from __future__ import annotations

from hypothesis import strategies as st

# (exponent bits, mantissa bits) of each float type: reduce_precision keeps at most these.
FORMATS = {"float16": (5, 10), "bfloat16": (8, 7), "float32": (8, 23), "float64": (11, 52)}
DIFFERENTIABLE = ("float32", "float64")  # jvp and grad: a few ulps of f16 error would grow
# The dtypes of programs drawn to be transformed: mostly differentiable ones.
TRANSFORMED_DTYPES = DIFFERENTIABLE + ("int32", "bool")


def _orderable(dtype: str) -> bool:
    return programs.kind(dtype) in ("float", "int", "uint")


def gen_argmax(p: programs.Program, x: int) -> None:
    shape, dtype = p.values[x]
    if not shape or not _orderable(dtype):
        return programs.GENERATORS["unary"](p, x)
    axis = p.draw(st.integers(0, len(shape) - 1))
    index = p.draw(st.sampled_from(("int32", "int64", "uint8")))
    p.add({"op": "argmax", "fn": p.draw(st.sampled_from(("argmax", "argmin"))), "x": x, "axis": axis,
           "dtype": index}, [n for d, n in enumerate(shape) if d != axis], index)


def gen_reduce_precision(p: programs.Program, x: int) -> None:
    shape, dtype = p.values[x]
    if dtype not in FORMATS:
        return programs.GENERATORS["unary"](p, x)
    exp, mant = FORMATS[dtype]
    known = [f for f in FORMATS.values() if f[0] <= exp and f[1] <= mant] + [(4, 3), (5, 2)]
    bits = p.draw(st.one_of(st.sampled_from(known), st.tuples(st.integers(1, exp), st.integers(0, mant))))
    p.add({"op": "reduce_precision", "x": x, "bits": list(bits)}, shape, dtype)


def gen_clamp(p: programs.Program, x: int) -> None:
    """clamp(lo, x, hi) with bounds of x's shape (JAX's jvp of clamp fails on scalar bounds);
    lo > hi may happen."""
    shape, dtype = p.values[x]
    if not _orderable(dtype):
        return programs.GENERATORS["unary"](p, x)
    lo, hi = p.partner(x), p.partner(x)
    p.add({"op": "clamp", "lo": lo, "x": x, "hi": hi}, shape, dtype)


def gen_iota(p: programs.Program, x: int) -> None:
    """An iota of x's shape and dtype combined with x (iota wraps in narrow integer types),
    or a mask of positions (iota compared with a bound: the same for every row, as padding
    masks are) selecting between x and another value."""
    shape, dtype = p.values[x]
    if not shape or programs.kind(dtype) == "bool":
        return programs.GENERATORS["unary"](p, x)
    dim = p.draw(st.integers(0, len(shape) - 1))
    if p.draw(st.booleans()):
        mask = p.add({"op": "iota_mask", "shape": list(shape), "dim": dim,
                      "fn": p.draw(st.sampled_from(programs.COMPARES)),
                      # often near the end: within the row's last, partial vector
                      "bound": p.draw(st.one_of(st.integers(0, shape[dim]),
                                                st.integers(max(0, shape[dim] - 16), shape[dim])))},
                     shape, "bool")
        p.add({"op": "select", "p": mask, "x": x, "y": p.partner(x)}, shape, dtype)
        return
    iota = p.add({"op": "iota", "shape": list(shape), "dtype": dtype, "dim": dim}, shape, dtype)
    fn = p.draw(st.sampled_from(p.fns(programs.BINARY, dtype)))
    p.add({"op": "binary", "fn": fn, "x": x, "y": iota}, shape, dtype)


def gen_top_k(p: programs.Program, x: int) -> None:
    """The k largest along the last axis: values and int32 indices."""
    shape, dtype = p.values[x]
    if not shape or not _orderable(dtype):
        return programs.GENERATORS["unary"](p, x)
    k = p.draw(st.integers(1, shape[-1]))
    out = list(shape[:-1]) + [k]
    pair = p.add({"op": "top_k", "x": x, "k": k}, (), "tuple")
    p.add({"op": "element", "x": pair, "i": 0}, out, dtype)
    p.add({"op": "element", "x": pair, "i": 1}, out, "int32")


def gen_to_int(p: programs.Program, x: int) -> None:
    """A float scaled past the integer ranges (x * 10**e), then cast to an integer type:
    XLA's conversion saturates, and NaN becomes 0."""
    shape, dtype = p.values[x]
    if programs.kind(dtype) != "float":
        return programs.GENERATORS["cast"](p, x)
    most = 4 if dtype == "float16" else 20  # a scale of f16 stays finite
    scaled = p.add({"op": "scale", "x": x, "by": 10.0 ** p.draw(st.integers(0, most))}, shape, dtype)
    target = p.draw(st.sampled_from(programs.INTS + ("bool",)))
    p.add({"op": "cast", "x": scaled, "dtype": target}, shape, target)


# Types by width, for bitcasts: of the same width, or as several narrower (an added minor dim).
WIDTHS = {8: ("int8", "uint8"), 16: ("float16", "bfloat16", "int16", "uint16"),
          32: ("float32", "int32", "uint32"), 64: ("float64", "int64")}


def gen_bitcast(p: programs.Program, x: int) -> None:
    """x's bits as another type: one of its width, several narrower ones (a minor dim added),
    or, where the minor dim is that count, one wider (scalar bf16 <-> int16 crashed LLVM's
    instruction selection at -O0)."""
    shape, dtype = p.values[x]
    width = next((w for w, names in WIDTHS.items() if dtype in names), None)
    if width is None:
        return programs.GENERATORS["cast"](p, x)
    wider = [w for w in WIDTHS if w > width and shape and shape[-1] == w // width]
    to = p.draw(st.sampled_from([w for w in WIDTHS if w <= width] + wider))
    target = p.draw(st.sampled_from(WIDTHS[to]))
    out = list(shape) + [width // to] if to < width else list(shape[:-1]) if to > width else list(shape)
    p.add({"op": "bitcast", "x": x, "dtype": target}, out, target)


GENERATORS = {"argmax": gen_argmax, "reduce_precision": gen_reduce_precision, "clamp": gen_clamp,
              "iota": gen_iota, "top_k": gen_top_k, "to_int": gen_to_int, "bitcast": gen_bitcast}

# After GENERATORS: importing programs first imports this module and reads them.
from . import interpret, programs  # noqa: E402


def program_transform(p: programs.Program, outputs: list[int]) -> dict:
    """A transform of the whole program: vmap (each input batched or not), or jvp or
    grad with respect to its f32 and f64 inputs (grad: of its f32 and f64 outputs'
    sum weighted by cotangents)."""
    inputs = [i for i, op in enumerate(p.ops) if op["op"] == "input"]
    wrt = [i for i in inputs if p.values[i][1] in DIFFERENTIABLE]
    # Not where a convolution meets zeros: its derivative's convolutions would meet them with a
    # NaN cotangent (0 / 0 downstream), a case of interpret._finite_operands.
    differentiable = wrt and any(p.values[o][1] in DIFFERENTIABLE for o in outputs) and not any(
        op["op"] == "conv" and interpret.pads_or_dilates(op) for op in p.ops)
    kind = p.draw(st.sampled_from(("vmap", "jvp", "grad") if differentiable else ("vmap",)))
    if kind == "vmap":
        size = p.draw(st.integers(1, 3))
        axes = [p.draw(st.sampled_from((0, None))) for _ in inputs]
        axes[0] = 0  # something is batched
        # An f64 kernel taken as given (not batched): XLA CPU computes a grouped f64
        # convolution (vmap's of a batched kernel) with every group's inputs, so a NaN of one
        # group reaches the others' results (f32's keeps to its group, as polyblocks does).
        kernels = {op["w"] for op in p.ops if op["op"] == "conv" and p.values[op["w"]][1] == "float64"}
        axes = [None if i in kernels and k else axis for k, (i, axis) in enumerate(zip(inputs, axes))]
        return {"kind": "vmap", "size": size, "axes": axes}
    return {"kind": kind}
