"""The coverage zoo: Flax models and jnp programs, each a function with its arguments.

An ``Entry`` builds lazily, so listing the zoo costs nothing. Arguments are numpy
arrays (or pytrees of them); integer arguments hold indices, lengths or keys.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from bench import flax_models, zoo_models
from bench.zoo_jax_models import layernorm
from bench.zoo_workloads import integers, normal


@dataclasses.dataclass(frozen=True)
class Entry:
    name: str
    kind: str                                    # "model" or "program"
    build: Callable[[], tuple[Callable, tuple]]  # -> (fn, args)
    rtol: float = 1e-4  # norm-wise, for float outputs; integer outputs must be equal
    note: str = ""


def _flax(module: nn.Module, x: np.ndarray) -> Callable[[], tuple[Callable, tuple]]:
    def build():
        case = flax_models.build(type(module).__name__, module, x)
        return case.apply, (case.params, case.input)
    return build


def _bench_model(name: str) -> Callable[[], tuple[Callable, tuple]]:
    def build():
        case = flax_models.make(name, batch=2, small=True)
        return case.apply, (case.params, case.input)
    return build


def _train_step() -> tuple[Callable, tuple]:
    """One SGD step of an MLP: the backward pass of dense layers, relu and a mean loss."""
    case = flax_models.build("mlp", zoo_models.MLP(), normal(8, 32))
    labels = normal(8, 10, seed=1)

    def step(params, x, y):
        loss = lambda p: jnp.mean((case.apply(p, x) - y) ** 2)
        grads = jax.grad(loss)(params)
        return jax.tree_util.tree_map(lambda p, g: p - 0.1 * g, params, grads)
    return step, (case.params, case.input, labels)


MODELS = [
    Entry("mlp", "model", _flax(zoo_models.MLP(), normal(8, 32))),
    Entry("mlp_train_step", "model", _train_step),
    Entry("resnet18_small", "model", _bench_model("resnet18")),
    Entry("vit_small", "model", _bench_model("vit_tiny")),
    Entry("unet_small", "model", _bench_model("unet")),
    Entry("mobilenet_v2", "model", _flax(zoo_models.MobileNet(), normal(2, 32, 32, 3))),
    Entry("gpt_decoder", "model", _flax(zoo_models.Decoder(),
                                        integers(97, 2, 16))),
    Entry("lstm", "model", _flax(zoo_models.Recurrent("lstm"), normal(2, 12, 8))),
    Entry("gru", "model", _flax(zoo_models.Recurrent("gru"), normal(2, 12, 8))),
    Entry("mlp_mixer", "model", _flax(zoo_models.Mixer(), normal(2, 32, 32, 3))),
    Entry("tcn_1d", "model", _flax(zoo_models.TCN(), normal(2, 32, 4))),
    Entry("conv3d", "model", _flax(zoo_models.Conv3D(), normal(2, 8, 8, 8, 2))),
]


def _program(name: str, fn: Callable, *args, **kw) -> Entry:
    return Entry(name, "program", lambda: (fn, args), **kw)


def _attention(q, k, v):
    s = jnp.einsum("bhqd,bhkd->bhqk", q, k) / np.sqrt(q.shape[-1])
    return jnp.einsum("bhqk,bhkd->bhqd", jax.nn.softmax(s, axis=-1), v)


def _while_sum(x, n):
    return lax.fori_loop(0, n, lambda i, acc: acc * 0.5 + x[i % x.shape[0]], jnp.zeros_like(x[0]))


_X = normal(16, 32)
_IDX = integers(16, 24, seed=1, low=-16)  # negative: numpy-style wrap-around
_DUP = integers(8, 24, seed=2)  # duplicates: scatter must combine
_QKV = tuple(normal(2, 4, 32, 16, seed=s) for s in range(3))

PROGRAMS = [
    _program("softmax", lambda x: jax.nn.softmax(x, axis=-1), _X),
    _program("layernorm", layernorm, _X, normal(32, seed=1), normal(32, seed=2)),
    _program("logsumexp", lambda x: jax.nn.logsumexp(x, axis=0), _X),
    _program("gelu_erf", lambda x: jax.nn.gelu(x, approximate=False), _X),
    _program("attention", _attention, *_QKV),
    _program("matmul_bf16", lambda a, b: jnp.dot(a.astype(jnp.bfloat16), b.astype(jnp.bfloat16),
                                                  preferred_element_type=jnp.float32),
             _X, normal(32, 8, seed=1), rtol=1e-2, note="bf16 inputs"),
    _program("cumsum", lambda x: jnp.cumsum(x, axis=1), _X),
    _program("cummax", lambda x: lax.cummax(x, axis=0), _X),
    _program("sort", lambda x: jnp.sort(x, axis=-1), _X),
    _program("argsort", lambda x: jnp.argsort(x, axis=0, stable=True), _X),
    _program("top_k", lambda x: lax.top_k(x, 5), _X),
    _program("argmax", lambda x: jnp.argmax(x, axis=-1), _X),
    _program("gather_rows", lambda x, i: x[i], _X, _IDX),
    _program("take_along_axis", lambda x, i: jnp.take_along_axis(x, i, axis=1),
             _X, integers(32, 16, 4, seed=3)),
    _program("scatter_add", lambda v, i: jnp.zeros((8, 32), jnp.float32).at[i].add(v),
             normal(24, 32), _DUP),
    _program("scatter_set_max", lambda x, v, i: (x.at[i].set(v[:, 0]), x.at[i].max(v[:, 1])),
             normal(8, seed=1), normal(24, 2), _DUP),
    _program("one_hot_embed", lambda i, w: jax.nn.one_hot(i, 16) @ w,
             integers(16, 10, seed=4), normal(16, 8)),
    _program("dynamic_slice", lambda x, i: lax.dynamic_update_slice(
        x, lax.dynamic_slice(x, (i, 0), (4, 8)) * 2.0, (i + 1, 3)), _X, np.int32(5)),
    _program("fori_loop_dynamic", _while_sum, _X, np.int32(7)),
    _program("cond", lambda x: lax.cond(x.sum() > 0, jnp.sin, jnp.cos, x), _X),
    _program("switch", lambda x, i: lax.switch(i, [jnp.sin, jnp.cos, jnp.tanh], x), _X, np.int32(2)),
    _program("random_normal", lambda k: jax.random.normal(k, (64,)), np.array([0, 42], np.uint32)),
    _program("max_pool_grad", jax.grad(lambda x: nn.max_pool(x, (2, 2), (2, 2)).sum()),
             normal(2, 8, 8, 3)),
    _program("conv_transpose", lambda x, w: lax.conv_transpose(
        x, w, (2, 2), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")),
        normal(2, 8, 8, 4), normal(3, 3, 4, 6, seed=1)),
    _program("pad_flip_concat", lambda x: jnp.concatenate(
        [jnp.pad(x, ((1, 1), (2, 0)), mode="reflect"), jnp.flip(jnp.pad(x, ((1, 1), (0, 2))), 0)], 1), _X),
    _program("bit_ops", lambda x: (lax.clz(x), lax.population_count(x),
                                   lax.bitcast_convert_type(x, jnp.float32)),
             integers(2**31 - 1, 32, seed=5, low=-2**31)),
    _program("cholesky", lambda a: jnp.linalg.cholesky(a @ a.T + 4.0 * jnp.eye(16)), normal(16, 16),
             note="XLA CPU calls LAPACK through a custom_call"),
]

ENTRIES: list[Entry] = MODELS + PROGRAMS
