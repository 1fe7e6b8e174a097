"""Common jnp programs on XLA CPU and on polyblocks, side by side in one process.

bench/ops.py measures the issue's kernels; this measures breadth: reductions along each
axis, scans, softmax variants, masks, transcendental functions, pooling, gathers and
scatters, convolutions of several kinds, sorts and selections, loops, a training step's
gradients, at a few MB each, so that a program far slower than XLA's shows up. Prints a
table and writes programs-<machine>.json with a chart of the ratios (``--save``: into
bench/results/).

    python bench/programs.py
    python bench/programs.py --programs tanh,cumsum_last --repeat 30
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Callable

if __package__ in (None, ""):  # run as a script: make `bench` importable from the repo root
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402

from bench import chart, ops, results_files, runner  # noqa: E402

_NHWC = ("NHWC", "HWIO", "NHWC")


def _normal(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _conv(w: np.ndarray, strides=(1, 1), groups: int = 1, numbers=_NHWC) -> Callable:
    return lambda x: lax.conv_general_dilated(x, w, strides, "SAME", dimension_numbers=numbers,
                                              feature_group_count=groups)


def _pool(op, init: float, window: tuple, strides: tuple, padding: str) -> Callable:
    return lambda x: lax.reduce_window(x, init, op, window, strides, padding)


def programs() -> dict[str, tuple[Callable, list]]:
    """name -> (function, arguments)."""
    x, m, img, seq = _normal(64, 128, 256), _normal(1024, 1024), _normal(8, 56, 56, 64), _normal(8, 512, 384)
    causal = jnp.tril(jnp.ones((256, 256), bool))
    labels = (np.arange(1024) % 1000).astype(np.int32)
    return {
        "var_last": (lambda a: a.var(-1), [x]),
        "std_first": (lambda a: a.std(0), [x]),
        "mean_outer_two": (lambda a: a.mean((0, 1)), [x]),
        "max_first": (lambda a: a.max(0), [x]),
        "argmax_last": (lambda a: jnp.argmax(a, -1), [x]),
        "softmax_first": (lambda a: jax.nn.softmax(a, axis=0), [x]),
        "softmax_middle": (lambda a: jax.nn.softmax(a, axis=1), [x]),
        "log_softmax": (lambda a: jax.nn.log_softmax(a, -1), [x]),
        "logsumexp": (lambda a: jax.scipy.special.logsumexp(a, -1), [x]),
        "causal_softmax": (lambda a: jax.nn.softmax(jnp.where(causal, a, -1e9), -1), [_normal(16, 256, 256)]),
        "cumsum_last": (lambda a: jnp.cumsum(a, -1), [x]),
        "cumsum_first": (lambda a: jnp.cumsum(a, 0), [x]),
        "sort_last": (lambda a: jnp.sort(a, -1), [_normal(256, 1024)]),
        "transpose_021": (lambda a: jnp.transpose(a, (0, 2, 1)), [x]),
        "transpose_201": (lambda a: jnp.transpose(a, (2, 0, 1)), [x]),
        "where_leaky": (lambda a: jnp.where(a > 0, a, 0.1 * a), [x]),
        "clip": (lambda a: jnp.clip(a, -0.5, 0.5), [x]),
        "sigmoid": (jax.nn.sigmoid, [x]),
        "tanh": (jnp.tanh, [x]),
        "gelu_tanh": (jax.nn.gelu, [x]),
        "gelu_erf": (lambda a: jax.nn.gelu(a, approximate=False), [x]),
        "silu": (jax.nn.silu, [x]),
        "softplus": (jax.nn.softplus, [x]),
        "log1p_abs": (lambda a: jnp.log1p(jnp.abs(a)), [x]),
        "concat": (lambda a: jnp.concatenate([a, a * 2], -1), [x]),
        "pad": (lambda a: jnp.pad(a, ((0, 0), (1, 1), (2, 2))), [x]),
        "strided_slice": (lambda a: a[:, ::2, 1::2], [x]),
        "reverse": (lambda a: a[:, ::-1], [x]),
        "outer_sum": (lambda a: a[:, None, :] + a[None, :, :], [_normal(256, 256)]),
        "matmul_tn": (lambda a: a.T @ a, [m]),
        "matmul_nt": (lambda a: a @ a.T, [m]),
        "matvec": (lambda a: a @ a[0], [m]),
        "batched_einsum": (lambda a: jnp.einsum("bij,bkj->bik", a, a), [_normal(32, 128, 64)]),
        "dense_bias_relu": (lambda a, w: jax.nn.relu(a @ w + 1.0), [seq, _normal(384, 512, seed=1)]),
        "bf16_matmul": (lambda a: (a.astype(jnp.bfloat16) @ a.astype(jnp.bfloat16)).astype(jnp.float32), [m]),
        "max_pool_3x3_2": (_pool(lax.max, -jnp.inf, (1, 3, 3, 1), (1, 2, 2, 1), "SAME"), [img]),
        "avg_pool_2x2": (lambda a: _pool(lax.add, 0.0, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")(a) / 4, [img]),
        "global_avg_pool": (lambda a: a.mean((1, 2)), [img]),
        "depthwise_3x3": (lambda a, w: _conv(w, groups=64)(a), [img, _normal(3, 3, 1, 64, seed=1)]),
        "conv_3x3_stride_2": (lambda a, w: _conv(w, (2, 2))(a), [img, _normal(3, 3, 64, 128, seed=1)]),
        "conv_5x5": (lambda a, w: _conv(w)(a), [img, _normal(5, 5, 64, 64, seed=1)]),
        "conv_3x3_to_rgb": (lambda a, w: _conv(w)(a), [img, _normal(3, 3, 64, 3, seed=1) / 24]),
        "conv_1d_3": (lambda a, w: _conv(w, (1,), numbers=("NWC", "WIO", "NWC"))(a),
                      [seq, _normal(3, 384, 384, seed=1)]),
        "conv_nchw": (lambda a, w: _conv(w, numbers=("NCHW", "OIHW", "NCHW"))(a),
                      [_normal(8, 64, 56, 56), _normal(64, 64, 3, 3, seed=1)]),
        "rgb_normalize": (lambda a: (a - np.float32([0.485, 0.456, 0.406])) / np.float32([0.229, 0.224, 0.225]),
                          [_normal(8, 224, 224, 3)]),
        "box_areas": (lambda b: (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1]), [_normal(65536, 4)]),
        "uint8_to_float": (lambda a: a.astype(jnp.float32) / 255,
                           [np.random.default_rng(3).integers(0, 256, (8, 224, 224, 3)).astype(np.uint8)]),
        "batchnorm_train": (lambda a: (a - a.mean((0, 1, 2))) / jnp.sqrt(a.var((0, 1, 2)) + 1e-5), [img]),
        "take_rows": (lambda a: jnp.take(a, jnp.arange(0, 1024, 3), axis=0), [m]),
        "embedding": (lambda table, i: jnp.take(table, i, axis=0),
                      [m, np.random.default_rng(2).integers(0, 1024, (64, 128)).astype(np.int32)]),
        "scatter_add": (lambda a, i: jnp.zeros_like(a).at[i].add(a), [m, (np.arange(1024) * 7 % 1024).astype(np.int32)]),
        "cross_entropy": (lambda a, y: -jnp.take_along_axis(jax.nn.log_softmax(a, -1), y[:, None], 1).mean(),
                          [m, labels]),
        "one_hot_cross_entropy": (lambda a, y: -(jax.nn.log_softmax(a, -1) * jax.nn.one_hot(y, 1024)).sum(-1).mean(),
                                  [m, labels]),
        "l2_normalize": (lambda a: a / jnp.linalg.norm(a, axis=-1, keepdims=True), [x]),
        "rms_norm": (lambda a: a * lax.rsqrt((a * a).mean(-1, keepdims=True) + 1e-6), [seq]),
        "bf16_gelu": (lambda a: jax.nn.gelu(a.astype(jnp.bfloat16)), [x]),
        "bf16_softmax": (lambda a: jax.nn.softmax(a.astype(jnp.bfloat16), -1), [x]),
        "f16_scale": (lambda a: (a.astype(jnp.float16) * 2).astype(jnp.float32), [x]),
        "int_ops": (lambda a: ((a * 100).astype(jnp.int32) >> 2) % 7, [x]),
        "top_k": (lambda a: lax.top_k(a, 8), [m]),
        "argsort": (lambda a: jnp.argsort(a, -1), [_normal(256, 1024)]),
        "fori_loop": (lambda a: lax.fori_loop(0, 100, lambda i, c: c * 0.99 + 0.01, a), [_normal(8, 256, 256)]),
        "scan_rnn": (lambda h, xs, w: lax.scan(lambda c, v: (jnp.tanh(c @ w + v), None), h, xs)[0],
                     [_normal(32, 256), _normal(64, 32, 256), _normal(256, 256, seed=1) / 16]),
        **_loops(),
        "rfft_last": (lambda a: jnp.fft.rfft(a, axis=-1), [x]),
        "fft2_complex": (lambda a: jnp.fft.fft2(lax.complex(a, a * 0.5)), [_normal(16, 256, 256)]),
        "irfft_spectral_filter": (lambda a: jnp.fft.irfft(jnp.fft.rfft(a, axis=1) * 0.5, n=128, axis=1), [x]),
        "fft_convolution": (lambda a, b: jnp.fft.irfft(jnp.fft.rfft(a) * jnp.fft.rfft(b), n=4096),
                            [_normal(8, 4096), _normal(8, 4096, seed=1)]),
        "fft_prime_length": (lambda a: jnp.fft.fft(a.astype(jnp.complex64), axis=-1), [_normal(256, 1031)]),
        **_training(),
    }


def _loops() -> dict[str, tuple[Callable, list]]:
    """While loops of small bodies (issue #47): binary searches (searchsorted, interp,
    histogram: ~10 steps over the queries), an n-body fori_loop, expm's squarings, a GRU
    under scan, a Newton iteration to convergence, a recurrence written row by row."""
    def nbody_step(i, state):
        p, v = state
        d = p[None] - p[:, None]
        v = v + 0.001 * jnp.sum(d / ((jnp.sum(d * d, -1) + 0.01) ** 1.5)[..., None], 1)
        return p + 0.001 * v, v

    def gru(xs, wi, wh):
        def cell(h, x):
            gi, gh = x @ wi, h @ wh
            r = jax.nn.sigmoid(gi[:, :128] + gh[:, :128])
            z = jax.nn.sigmoid(gi[:, 128:256] + gh[:, 128:256])
            h = (1 - z) * jnp.tanh(gi[:, 256:] + r * gh[:, 256:]) + z * h
            return h, h
        return lax.scan(cell, jnp.zeros((8, 128), jnp.float32), xs)

    def newton_sqrt(a):
        def cond(s):
            return (s[1] < 100) & (jnp.max(jnp.abs(s[0] * s[0] - a)) > 1e-5)
        return lax.while_loop(cond, lambda s: (0.5 * (s[0] + a / s[0]), s[1] + 1), (a, 0))

    def recurrence_rows(x):
        def row(i, s):
            acc, out = s
            acc = acc * 0.9 + x[i]
            return acc, lax.dynamic_update_slice(out, acc[None], (i, 0))
        return lax.fori_loop(0, 256, row, (jnp.zeros(64, jnp.float32), jnp.zeros((256, 64), jnp.float32)))

    knots = np.sort(_normal(1000))
    return {
        "searchsorted_interp": (lambda xp, q: (jnp.searchsorted(xp, q), jnp.interp(q, xp, jnp.sin(xp))),
                                [knots, _normal(5000, seed=1)]),
        "histogram": (lambda a: jnp.histogram(a, bins=50, range=(-3, 3))[0], [_normal(100000)]),
        "nbody_fori": (lambda p, v: lax.fori_loop(0, 50, nbody_step, (p, v)), [_normal(128, 3), _normal(128, 3, seed=1)]),
        "expm": (jax.scipy.linalg.expm, [_normal(32, 32) * 0.1]),
        "gru_scan": (gru, [_normal(128, 8, 64), _normal(64, 384, seed=1) / 8, _normal(128, 384, seed=2) / 11]),
        "newton_while": (newton_sqrt, [np.abs(_normal(4096)) + 0.5]),
        "recurrence_rows": (recurrence_rows, [_normal(256, 64)]),
    }


def _training() -> dict[str, tuple[Callable, list]]:
    """Gradients and an optimizer step, as a training step computes them."""
    img, w = _normal(8, 28, 28, 64), _normal(3, 3, 64, 64, seed=1) / 24
    seq, dense = _normal(8, 256, 256), _normal(256, 256, seed=1) / 16
    qkv = [_normal(8, 128, 64, seed=s) for s in range(3)]

    def attention(q, k, v):
        return (jax.nn.softmax(jnp.einsum("bqd,bkd->bqk", q, k) / 8, -1) @ v).sum()
    return {
        "grad_conv_weights": (jax.grad(lambda w, a: (_conv(w)(a) ** 2).sum()), [w, img]),
        "grad_conv_input": (jax.grad(lambda a, w: (_conv(w)(a) ** 2).sum()), [img, w]),
        # A strided convolution's input gradient: a transposed convolution (lhs dilation 2).
        "grad_conv_input_stride_2": (jax.grad(lambda a, w: (_conv(w, (2, 2))(a) ** 2).sum()), [img, w]),
        "grad_dense_tanh": (jax.grad(lambda w, a: jnp.tanh(a @ w).sum()), [dense, seq]),
        "grad_softmax_cross_entropy": (jax.grad(lambda a: -jax.nn.log_softmax(a, -1)[..., 0].sum()), [seq]),
        "grad_max_pool": (jax.grad(lambda a: _pool(lax.max, -jnp.inf, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")(a).sum()),
                          [img]),
        "grad_max_pool_3x3_2": (jax.grad(lambda a: _pool(lax.max, -jnp.inf, (1, 3, 3, 1), (1, 2, 2, 1), "SAME")(a).sum()),
                                [img]),
        "grad_gelu": (jax.grad(lambda a: jax.nn.gelu(a).sum()), [seq]),
        "grad_attention": (jax.grad(attention, argnums=(0, 1, 2)), qkv),
        "adam_update": (lambda p, g, m, v: p - 1e-3 * (0.9 * m + 0.1 * g) / (jnp.sqrt(0.999 * v + 0.001 * g * g) + 1e-8),
                        [seq, seq, seq, jnp.abs(seq)]),
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--programs", default="", help="comma-separated subset (default: all)")
    parser.add_argument("--repeat", type=int, default=20, help="timed calls per measurement")
    results_files.add_save_argument(parser)
    args = parser.parse_args(argv)
    known = programs()
    args.programs = [p for p in args.programs.split(",") if p] or list(known)
    unknown = set(args.programs) - set(known)
    if unknown:
        parser.error(f"unknown programs: {', '.join(sorted(unknown))}")
    args.quick, args.tag = False, ""  # (the results file's name, as ops.py's)
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    known = programs()
    rows = []
    for name in args.programs:
        fn, arguments = known[name]
        rows.append(ops.measure_call(name, fn, arguments, args.repeat))
        print(ops.format_table(rows[-1:]).splitlines()[-1], flush=True)
    ratios = [r.ratio for r in rows if r.ratio]
    print(f"\n{results_files.machine_slug()} ({results_files.cpu_name()}, {results_files.cores()} cores), best of {runner.ROUNDS} medians of {args.repeat}: "
          f"{len(ratios)}/{len(rows)} ran, geomean {np.exp(np.mean(np.log(ratios))):.2f}x, "
          f"{sum(r < 1 for r in ratios)} below 1")
    print(ops.format_table(rows))
    print(f"wrote {ops.write_results(rows, args, 'programs', chart.plot_ratios)}")


if __name__ == "__main__":
    main()
