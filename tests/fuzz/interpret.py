"""Turns a program spec (programs.py) into a JAX function, and draws its arguments."""
from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from jax import lax

import support

LAX_UNARY = {"neg": lax.neg, "abs": lax.abs, "exp": lax.exp, "tanh": lax.tanh, "tan": lax.tan, "floor": lax.floor,
             "sign": lax.sign, "log": lax.log, "sin": lax.sin, "sqrt": lax.sqrt, "rsqrt": lax.rsqrt,
             "ceil": lax.ceil, "round": lax.round, "logistic": lax.logistic, "expm1": lax.expm1,
             "log1p": lax.log1p, "cos": lax.cos, "erf": lax.erf, "not": lax.bitwise_not,
             "population_count": lax.population_count, "clz": lax.clz}
LAX_BINARY = {"add": lax.add, "sub": lax.sub, "mul": lax.mul, "max": lax.max, "min": lax.min,
              "div": lax.div, "rem": lax.rem, "pow": lax.pow, "atan2": lax.atan2, "and": lax.bitwise_and,
              "or": lax.bitwise_or, "xor": lax.bitwise_xor, "shift_left": lax.shift_left,
              "shift_right_logical": lax.shift_right_logical,
              "shift_right_arithmetic": lax.shift_right_arithmetic}
LAX_COMPARE = {"lt": lax.lt, "le": lax.le, "eq": lax.eq, "ne": lax.ne, "gt": lax.gt, "ge": lax.ge}


def numpy_dtype(name: str) -> np.dtype:
    return np.dtype(ml_dtypes.bfloat16) if name == "bfloat16" else np.dtype(name)


def _reduce(x, fn: str, axes, beside_constant: bool = False):
    dtype = x.dtype
    if beside_constant:  # one variadic sum of x and of ones: a splat constant in a reduction of two results
        zero = np.array(0, dtype)
        sums = lax.reduce((x, jnp.ones(x.shape, dtype)), (zero, zero),
                          lambda a, b: (lax.add(a[0], b[0]), lax.add(a[1], b[1])), axes)
        return lax.add(*sums)
    if fn == "sum":
        return lax.reduce(x, np.array(0, dtype), lax.add, axes)
    if fn == "prod":
        return lax.reduce(x, np.array(1, dtype), lax.mul, axes)
    return lax.reduce(x, _extremum_init(dtype, fn), lax.min if fn == "min" else lax.max, axes)


def _extremum_init(dtype: np.dtype, fn: str) -> np.ndarray:
    """The identity of a max or min reduction of ``dtype``."""
    if dtype == np.bool_:
        return np.array(fn == "min")
    if jnp.issubdtype(dtype, jnp.floating):
        return np.array(np.inf if fn == "min" else -np.inf, dtype)
    info = jnp.iinfo(dtype)
    return np.array(info.max if fn == "min" else info.min, dtype)


def _window(x, op: dict, v: list):
    """A pooling (reduce_window), or with ``g`` the gradient of a max or min pooling
    weighted by ``g`` (select_and_scatter)."""
    fn = op["fn"]
    init = np.array(0, x.dtype) if fn == "add" else _extremum_init(x.dtype, fn)
    body = {"add": lax.add, "max": lax.max, "min": lax.min}[fn]

    def pool(a):
        return lax.reduce_window(a, init, body, op["dims"], op["strides"], [tuple(p) for p in op["pad"]])
    if "g" in op:
        return jax.vjp(pool, x)[1](v[op["g"]])[0]
    return pool(x)


def _conv(x, w, op: dict):
    n = len(op["windows"])
    spatial = "HW"[:n] if n == 2 else "H"
    lhs = "NC" + spatial if op["layout"] == "first" else "N" + spatial + "C"
    return lax.conv_general_dilated(
        x, w, window_strides=[s["stride"] for s in op["windows"]],
        padding=[tuple(s["pad"]) for s in op["windows"]],
        lhs_dilation=[s["lhs_dil"] for s in op["windows"]],
        rhs_dilation=[s["rhs_dil"] for s in op["windows"]],
        dimension_numbers=(lhs, "OI" + spatial, lhs), feature_group_count=op["groups"],
        batch_group_count=op.get("batch_groups", 1))


def _scatter(x, idx, upd, fn: str, mode: str):
    ref = x.at[idx]
    return getattr(ref, fn)(upd, mode=mode)


def _cumulative(x, op: dict):
    fn = {"cumsum": lax.cumsum, "cummax": lax.cummax, "cummin": lax.cummin}[op["op"]]
    return fn(x, axis=op["axis"], reverse=op["reverse"])


def _apply(op: dict, v: list, ops: list):
    """The JAX value of one non-input op, given the values ``v`` defined before it by ``ops``."""
    k = op["op"]
    x = v[op["x"]] if "x" in op else None
    if k == "unary":
        return LAX_UNARY[op["fn"]](x)
    if k == "binary" and op["fn"] == "mul":
        return lax.mul(_multiplied(ops, v, op["x"]), _multiplied(ops, v, op["y"]))
    if k == "binary":
        return LAX_BINARY[op["fn"]](x, v[op["y"]])
    if k == "compare":
        return LAX_COMPARE[op["fn"]](x, v[op["y"]])
    if k == "select":
        return lax.select(v[op["p"]], x, v[op["y"]])
    if k == "cast":
        return lax.convert_element_type(x, numpy_dtype(op["dtype"]))
    if k == "broadcast":
        return lax.broadcast_in_dim(x, op["shape"], op["dims"])
    if k == "reduce":
        return _reduce(x, op["fn"], op["axes"], op.get("beside_constant", False))
    if k == "dot":
        preferred = numpy_dtype(op["preferred"]) if "preferred" in op else None
        return lax.dot_general(x, v[op["y"]], (op["contract"], op["batch"]), preferred_element_type=preferred)
    if k == "conv":
        return _conv(x, v[op["w"]], op)
    if k == "window":
        return _window(x, op, v)
    if k == "gather":
        return jnp.take(x, v[op["idx"]], axis=op["axis"], mode=op["mode"])
    if k == "scatter":
        return _scatter(x, v[op["idx"]], v[op["upd"]], op["fn"], op["mode"])
    if k == "dynamic_slice":
        return lax.dynamic_slice(x, [v[s] for s in op["starts"]], op["sizes"])
    if k == "dynamic_update_slice":
        return lax.dynamic_update_slice(x, v[op["upd"]], [v[s] for s in op["starts"]])
    if k == "slice":
        return lax.slice(x, op["start"], op["limit"], op["stride"])
    if k == "reshape":
        return lax.reshape(x, op["shape"])
    if k == "transpose":
        return lax.transpose(x, op["perm"])
    if k == "rev":
        return lax.rev(x, op["dims"])
    if k == "concat":
        return lax.concatenate([v[i] for i in op["xs"]], op["axis"])
    if k == "roll":
        return jnp.roll(x, op["shift"], op["axis"])
    if k == "pad" and op.get("mode", "constant") != "constant":
        return jnp.pad(x, [tuple(w) for w in op["widths"]], mode=op["mode"])
    if k == "pad":
        return lax.pad(x, np.array(0, x.dtype), [tuple(c) for c in op["config"]])
    if k == "cond":
        return _cond(v[op["p"]], x, op["fns"])
    if k == "fori":
        y, fn = v[op["y"]], LAX_BINARY[op["fn"]]
        return lax.fori_loop(0, op["n"], lambda i, acc: fn(acc, y), x)
    if k == "sort" and op.get("indices"):
        positions = lax.broadcasted_iota(np.int32, x.shape, op["axis"])
        return lax.sort((x, positions), dimension=op["axis"], num_keys=1, is_stable=True)[1]
    if k == "sort":
        return lax.sort(x, dimension=op["axis"])
    if k in ("cumsum", "cummax", "cummin"):
        return _cumulative(x, op)
    if k == "argmax":
        return (lax.argmax if op["fn"] == "argmax" else lax.argmin)(x, op["axis"], numpy_dtype(op["dtype"]))
    if k == "bitcast":
        return lax.bitcast_convert_type(x, numpy_dtype(op["dtype"]))
    if k == "reduce_precision":
        return lax.reduce_precision(x, *op["bits"])
    if k == "clamp":
        return lax.clamp(v[op["lo"]], x, v[op["hi"]])
    if k == "iota":
        return lax.broadcasted_iota(numpy_dtype(op["dtype"]), op["shape"], op["dim"])
    if k == "iota_mask":
        return LAX_COMPARE[op["fn"]](lax.broadcasted_iota(np.int32, op["shape"], op["dim"]), np.int32(op["bound"]))
    # top_k orders NaNs by sign, which is unspecified for a computed NaN (XLA's log1p of -2 is
    # -NaN on x86, ours +NaN): the operand's NaNs are made one.
    if k == "top_k":
        one_nan = jnp.where(jnp.isnan(x), np.array(np.nan, x.dtype), x) if jnp.issubdtype(x.dtype, jnp.floating) else x
        return lax.top_k(one_nan, op["k"])
    if k == "scale":
        return x * np.array(op["by"], x.dtype)
    if k == "loop":
        return _loop(op, v)
    if k == "element":
        return x[op["i"]]
    if k == "row":
        return lax.dynamic_index_in_dim(x, v[op["i"]], 0, keepdims=False)
    if k == "put_row":
        return lax.dynamic_update_index_in_dim(x, v[op["upd"]], v[op["i"]], 0)
    raise ValueError(f"unknown op {k!r}")


def _run(ops: list, v: list, params: list) -> list:
    """The values of a program's or a loop body's ops: ``params`` bind its input or param
    ops in order, an outer op reads ``v``, the enclosing program's values."""
    w: list = [None] * len(ops)
    bound = iter(params)
    for i, op in enumerate(ops):
        if op["op"] in ("input", "param"):
            w[i] = next(bound)
        elif op["op"] == "outer":
            w[i] = v[op["x"]]
        else:
            w[i] = _apply(op, w, ops)
    return w


def _multiplied(ops: list, v: list, i: int):
    """Factor ``v[i]`` of a product, behind an optimization barrier where it is a bool cast to a
    number: XLA CPU's simplifier rewrites x * convert(p) as select(p, x, 0), whose 0 differs
    from the IEEE product of the StableHLO spec, numpy and polyblocks (inf * 0 and NaN * 0 are
    NaN, -x * 0 is -0). The barrier keeps the product a product on both sides."""
    op = ops[i]
    if op["op"] == "cast" and v[op["x"]].dtype == np.bool_:
        return lax.optimization_barrier(v[i])
    return v[i]


def _loop(op: dict, v: list) -> tuple:
    """The results of a loop op (loop_programs.py): carries, then stacked ys; under its transform."""
    body, kind, n = op["body"], op["kind"], op["n"]
    nc = len(op["carry"])

    def step(params: list) -> tuple[list, list]:
        w = _run(body["ops"], v, params)
        return [w[i] for i in body["carry"]], [w[i] for i in body["ys"]]

    def loop(*args):
        carries = list(args[:nc])
        if kind == "scan":
            def f(c, row):
                return step([*c, *row])
            c, ys = lax.scan(f, carries, list(args[nc:]), length=n, reverse=op["reverse"], unroll=op["unroll"])
            return (*c, *ys)
        if kind == "fori":  # the counter is int64 under x64: the body takes an int32
            return tuple(lax.fori_loop(op["start"], op["start"] + n,
                                       lambda i, c: step([i.astype(np.int32), *c])[0], carries, unroll=op["unroll"]))
        stop = jnp.minimum(args[nc], n) if "bound" in op else n
        _, c = lax.while_loop(lambda ic: ic[0] < stop, lambda ic: (ic[0] + 1, step([ic[0], *ic[1]])[0]),
                              (np.int32(0), carries))
        return tuple(c)

    args = [v[a] for a in op["carry"] + op["xs"] + ([op["bound"]] if "bound" in op else [])]
    return _transformed(loop, op, args, v)


def _transformed(loop: Callable, op: dict, args: list, v: list) -> tuple:
    """``loop`` applied to ``args`` under the op's transform: vmap over a leading axis of
    the batched arguments, jvp or grad with respect to the f32 and f64 arguments."""
    transform = op["transform"]
    if transform == "vmap":
        return jax.vmap(loop, in_axes=tuple(op["in_axes"]))(*[v[a] for a in op["batched"]])
    if transform == "none":
        return loop(*args)
    wrt = [i for i, a in enumerate(args) if a.dtype in (np.float32, np.float64)]

    def of_wrt(*xs):
        full = list(args)
        for i, x in zip(wrt, xs):
            full[i] = x
        return loop(*full)
    if transform == "jvp":
        outs, tangents = jax.jvp(of_wrt, tuple(args[i] for i in wrt), tuple(v[t] for t in op["tangents"]))
        return (*outs, *[t for o, t in zip(outs, tangents) if jnp.issubdtype(o.dtype, jnp.floating)])

    def weighted(*xs):  # grad: of the outputs' sum weighted by the cotangents
        outs = of_wrt(*xs)
        return sum(jnp.vdot(v[ct], o) for ct, o in zip(op["cotangents"], outs) if ct is not None)
    return jax.grad(weighted, argnums=tuple(range(len(wrt))))(*[args[i] for i in wrt])


def _cond(p, x, fns):
    first = lax.reshape(p, (p.size,))[0]  # the predicate: p's first element is nonzero
    pred = first if first.dtype == np.bool_ else first != 0
    return lax.cond(pred, LAX_UNARY[fns[0]], LAX_UNARY[fns[1]], x)


def build(spec: dict) -> Callable:
    """The JAX function of ``spec``: one argument per input op (then, under jvp, one tangent
    per f32 or f64 input; under grad, one cotangent per f32 or f64 output), a tuple of the
    outputs (under grad, the gradients)."""
    def program(*args):
        v = _run(spec["ops"], [], list(args))
        return tuple(v[i] for i in spec["outputs"])
    transform = spec.get("transform", {"kind": "none"})
    if transform["kind"] == "none":
        return program
    if transform["kind"] == "vmap":
        return jax.vmap(program, in_axes=tuple(transform["axes"]))
    wrt = _differentiable(spec)
    n = sum(op["op"] == "input" for op in spec["ops"])

    def of_wrt(args, xs):
        full = list(args)
        for i, x in zip(wrt, xs):
            full[i] = x
        return program(*full)
    if transform["kind"] == "jvp":
        def jvp(*args):
            outs, tangents = jax.jvp(lambda *xs: of_wrt(args[:n], xs), tuple(args[i] for i in wrt), args[n:])
            return (*outs, *[t for o, t in zip(outs, tangents) if jnp.issubdtype(o.dtype, jnp.floating)])
        return jvp

    def grad(*args):
        def weighted(*xs):
            outs = [o for o in of_wrt(args[:n], xs) if o.dtype in (np.float32, np.float64)]
            return sum(jnp.vdot(ct, o) for ct, o in zip(args[n:], outs))
        return jax.grad(weighted, argnums=tuple(range(len(wrt))))(*[args[i] for i in wrt])
    return grad


def _differentiable(spec: dict) -> list[int]:
    """The positions, among the arguments, of the f32 and f64 inputs."""
    dtypes = [op["dtype"] for op in spec["ops"] if op["op"] == "input"]
    return [i for i, d in enumerate(dtypes) if d in ("float32", "float64")]


def make_inputs(spec: dict) -> list[np.ndarray]:
    """The arguments of build(spec): random values (some NaN, inf, limits; see _dense), with
    a leading axis where vmap batches them, and the tangents or cotangents of jvp or grad."""
    rng = np.random.default_rng(spec["seed"])
    finite = _finite_operands(spec)
    transform = spec.get("transform", {"kind": "none"})
    inputs = []
    for i, op in enumerate(spec["ops"]):
        if op["op"] == "input":
            shape, dtype = op["shape"], numpy_dtype(op["dtype"])
            if transform["kind"] == "vmap" and transform["axes"][len(inputs)] == 0:
                shape = [transform["size"]] + shape
            x = (_dense(rng, shape, dtype) if op["edge"] == "dense" else
                 support.random_array(rng, shape, dtype, edge=op["edge"]))
            inputs.append(np.where(np.isfinite(x), x, np.zeros_like(x)) if i in finite else x)
    if transform["kind"] == "jvp":
        inputs += [support.random_array(rng, inputs[i].shape, inputs[i].dtype, edge=False)
                   for i in _differentiable(spec)]
    if transform["kind"] == "grad":
        outs = jax.eval_shape(build({**spec, "transform": {"kind": "none"}}), *inputs)
        inputs += [support.random_array(rng, o.shape, o.dtype, edge=False)
                   for o in outs if o.dtype in (np.float32, np.float64)]
    return inputs


def _dense(rng: np.random.Generator, shape, dtype: np.dtype) -> np.ndarray:
    """Half of the values special: NaN, infinities, signed zeros, halves (rounding ties), integer
    limits, -1, shift counts around the bit width. Floats stay of the magnitude of the others:
    large ones would only make sums cancel, whose rounding differs with their order; values
    past the integer ranges come from edge_ops' scale."""
    x = support.random_array(rng, shape, dtype, edge=True)
    if dtype.kind == "f" or dtype == np.dtype(ml_dtypes.bfloat16):
        specials = np.array([np.nan, np.inf, -np.inf, -0.0, 0.0, 0.5, -0.5, 2.5, -1.5], np.float64)
    elif dtype.kind in "iu":
        info, bits = np.iinfo(dtype), 8 * dtype.itemsize
        specials = np.array([info.min, info.min + 1, info.max, 0, 1, 2, bits - 1, bits, bits + 1]
                            + ([-1, -2] if dtype.kind == "i" else []), np.int64)
    else:
        return x
    with np.errstate(over="ignore", invalid="ignore"):
        pool = specials.astype(dtype)
    chosen = rng.random(x.shape) < 0.5
    return np.where(chosen, rng.choice(pool, size=x.shape), x).astype(dtype)


def _finite_operands(spec: dict) -> set[int]:
    """Operands of convolutions whose products XLA CPU takes with zeros: these get no inf or NaN.

    - A convolution that pads or dilates its input: a kernel value meets the padded zeros.
      The StableHLO spec (and polyblocks) multiply them (0 * inf is NaN); XLA CPU's answer
      depends on the emitter it picks: Eigen (f32, f16) multiplies too, its loop emitter (f64,
      lhs dilation, some small shapes) skips the taps on padding. No answer matches XLA
      everywhere, so the fuzzer does not ask.
    - A convolution of batch groups: XLA CPU multiplies every group's kernel with every
      group's image, masked by zeros, so an inf in one group's kernel is NaN in the outputs
      of the others (the spec's, and polyblocks', stay finite).
    - An f64 convolution of feature groups: likewise every group's image with every group's
      kernel, so a NaN or inf in one group's image is NaN in the others' outputs (f32 not).
    """
    inputs = {i for i, op in enumerate(spec["ops"]) if op["op"] == "input"}
    finite = set()
    for op in spec["ops"]:
        if op["op"] == "conv" and (pads_or_dilates(op) or op.get("batch_groups", 1) > 1):
            finite.add(op["w"])
        if op["op"] == "conv" and op["groups"] > 1 and op["x"] in inputs \
                and spec["ops"][op["x"]]["dtype"] == "float64":
            finite.add(op["x"])
    return finite


def pads_or_dilates(conv: dict) -> bool:
    """Whether a conv op's input meets zeros: padding, or holes of its lhs dilation."""
    return any(w["pad"] != [0, 0] or w["lhs_dil"] > 1 for w in conv["windows"])
