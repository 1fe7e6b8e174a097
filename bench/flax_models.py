"""The three benchmark models in Flax (linen), with random weights and configurable sizes.

``make(name, batch, small)`` returns a ``ModelCase``: a pure ``apply(params, x)``, its
parameters as a pytree of numpy arrays, and one random NHWC input. The full configs are
the README's (ResNet-18 at 112x112, ViT-Tiny at 224, UNet at 128x128); the small ones
keep the tests fast.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np


@dataclasses.dataclass(frozen=True)
class ModelCase:
    name: str
    apply: Callable[[Any, Any], Any]  # (params, x) -> output; pure, no state updates
    params: Any                       # pytree of numpy arrays
    input: np.ndarray


# --- ResNet -----------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class ResNetConfig:
    image: int = 112
    stage_blocks: tuple[int, ...] = (2, 2, 2, 2)
    widths: tuple[int, ...] = (64, 128, 256, 512)
    classes: int = 1000
    bottleneck: bool = False  # ResNet-50's blocks: 1x1 reduce, 3x3, 1x1 expand to 4x the width


class ResNetBlock(nn.Module):
    width: int
    stride: int

    @nn.compact
    def __call__(self, x):
        norm = lambda: nn.BatchNorm(use_running_average=True)  # inference mode
        y = nn.Conv(self.width, (3, 3), self.stride, padding=1, use_bias=False)(x)
        y = nn.relu(norm()(y))
        y = norm()(nn.Conv(self.width, (3, 3), padding=1, use_bias=False)(y))
        if x.shape != y.shape:
            x = norm()(nn.Conv(self.width, (1, 1), self.stride, use_bias=False)(x))
        return nn.relu(x + y)


class BottleneckBlock(nn.Module):
    width: int
    stride: int

    @nn.compact
    def __call__(self, x):
        norm = lambda: nn.BatchNorm(use_running_average=True)
        y = nn.relu(norm()(nn.Conv(self.width, (1, 1), use_bias=False)(x)))
        y = nn.relu(norm()(nn.Conv(self.width, (3, 3), self.stride, padding=1, use_bias=False)(y)))
        y = norm()(nn.Conv(4 * self.width, (1, 1), use_bias=False)(y))
        if x.shape != y.shape:
            x = norm()(nn.Conv(4 * self.width, (1, 1), self.stride, use_bias=False)(x))
        return nn.relu(x + y)


class ResNet(nn.Module):
    config: ResNetConfig

    @nn.compact
    def __call__(self, x):
        c = self.config
        x = nn.Conv(c.widths[0], (7, 7), 2, padding=3, use_bias=False)(x)
        x = nn.relu(nn.BatchNorm(use_running_average=True)(x))
        x = nn.max_pool(x, (3, 3), (2, 2), padding=((1, 1), (1, 1)))
        block_cls = BottleneckBlock if c.bottleneck else ResNetBlock
        for stage, (blocks, width) in enumerate(zip(c.stage_blocks, c.widths)):
            for block in range(blocks):
                x = block_cls(width, 2 if stage > 0 and block == 0 else 1)(x)
        return nn.Dense(c.classes)(jnp.mean(x, axis=(1, 2)))


# --- ViT --------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class ViTConfig:
    image: int = 224
    patch: int = 16
    depth: int = 12
    width: int = 192
    heads: int = 3
    mlp: int = 768
    classes: int = 1000


class EncoderBlock(nn.Module):
    config: ViTConfig

    @nn.compact
    def __call__(self, x):
        c = self.config
        y = nn.LayerNorm()(x)
        x = x + nn.MultiHeadDotProductAttention(num_heads=c.heads, qkv_features=c.width)(y, y)
        y = nn.LayerNorm()(x)
        y = nn.Dense(c.width)(nn.gelu(nn.Dense(c.mlp)(y), approximate=False))
        return x + y


class ViT(nn.Module):
    config: ViTConfig

    @nn.compact
    def __call__(self, x):
        c = self.config
        x = nn.Conv(c.width, (c.patch, c.patch), c.patch, padding="VALID")(x)
        b, h, w, d = x.shape
        x = x.reshape(b, h * w, d)
        cls = self.param("cls", nn.initializers.normal(0.02), (1, 1, d))
        x = jnp.concatenate([jnp.broadcast_to(cls, (b, 1, d)), x], axis=1)
        x = x + self.param("pos_embedding", nn.initializers.normal(0.02), x.shape[1:])
        for _ in range(c.depth):
            x = EncoderBlock(c)(x)
        return nn.Dense(c.classes)(nn.LayerNorm()(x)[:, 0])


# --- UNet -------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class UNetConfig:
    image: int = 128
    widths: tuple[int, ...] = (32, 64, 128, 256)
    groups: int = 8
    out_channels: int = 3


class DoubleConv(nn.Module):
    width: int
    groups: int

    @nn.compact
    def __call__(self, x):
        for _ in range(2):
            x = nn.Conv(self.width, (3, 3), padding=1)(x)
            x = nn.silu(nn.GroupNorm(num_groups=self.groups)(x))
        return x


class UNet(nn.Module):
    config: UNetConfig

    @nn.compact
    def __call__(self, x):
        c = self.config
        skips = []
        for width in c.widths[:-1]:
            x = DoubleConv(width, c.groups)(x)
            skips.append(x)
            x = nn.max_pool(x, (2, 2), (2, 2))
        x = DoubleConv(c.widths[-1], c.groups)(x)
        for width, skip in zip(reversed(c.widths[:-1]), reversed(skips)):
            x = nn.ConvTranspose(width, (2, 2), (2, 2))(x)
            x = DoubleConv(width, c.groups)(jnp.concatenate([x, skip], axis=-1))
        return nn.Conv(c.out_channels, (1, 1))(x)


# --- Registry ---------------------------------------------------------------

# name -> (module class, full config, small config for tests and --quick)
CONFIGS: dict[str, tuple[type[nn.Module], Any, Any]] = {
    "resnet18": (ResNet, ResNetConfig(),
                 ResNetConfig(image=32, stage_blocks=(1, 1, 1, 1), widths=(8, 16, 32, 64), classes=10)),
    "vit_tiny": (ViT, ViTConfig(),
                 ViTConfig(image=32, patch=8, depth=2, width=64, heads=2, mlp=128, classes=10)),
    "unet": (UNet, UNetConfig(), UNetConfig(image=32, widths=(8, 16, 32))),
}
MODEL_NAMES = tuple(CONFIGS)


def make(name: str, batch: int = 1, small: bool = False, seed: int = 0, dtype: Any = np.float32) -> ModelCase:
    """Build model ``name`` at ``batch`` with random weights and a random input, both of
    ``dtype`` (bfloat16: the model run in bf16 throughout, as a bf16 checkpoint would be)."""
    module_cls, full, reduced = CONFIGS[name]
    config = reduced if small else full
    x = np.random.default_rng(seed).standard_normal((batch, config.image, config.image, 3))
    case = build(name, module_cls(config), x.astype(np.float32), seed)
    if np.dtype(dtype) == np.float32:
        return case
    params = jax.tree_util.tree_map(lambda a: np.asarray(a).astype(dtype), case.params)
    return ModelCase(name, case.apply, params, case.input.astype(dtype))


def build(name: str, module: nn.Module, x: np.ndarray, seed: int = 0) -> ModelCase:
    """``module`` with random numpy weights: shapes from tracing ``init``, values from numpy.

    Running Flax's initializers would cost a compile or an eager op per parameter, tens
    of seconds on a loaded 2-core host; tracing costs a fraction of a second.
    """
    return ModelCase(name, module.apply, random_params(module, x, seed=seed), x)


def random_params(module: nn.Module, *inputs: Any, seed: int = 0) -> Any:
    """The variables of ``module`` applied to ``inputs``, as numpy arrays from ``random_leaf``."""
    rng = np.random.default_rng(seed + 1)
    shapes = jax.eval_shape(module.init, jax.random.PRNGKey(seed), *inputs)
    return jax.tree_util.tree_map_with_path(lambda path, s: random_leaf(path, s, rng), shapes)


def random_leaf(path, spec: jax.ShapeDtypeStruct, rng: np.random.Generator) -> np.ndarray:
    """A random value for the parameter at ``path``, scaled as Flax would initialize it.

    Biases, norm scales and running statistics are perturbed away from 0 and 1, so a
    wrong bias or scale cannot pass unnoticed.
    """
    key, shape = getattr(path[-1], "key", None), spec.shape
    normal = rng.standard_normal(shape)
    if key == "var":  # running variance: positive
        value = rng.uniform(0.5, 1.5, shape)
    elif key == "scale":
        value = 1.0 + 0.1 * normal
    elif key in ("bias", "mean"):
        value = 0.1 * normal
    elif key in ("cls", "pos_embedding"):
        value = 0.02 * normal
    else:  # kernels and embeddings: LeCun normal, fan-in = all but the last axis
        value = normal / np.sqrt(max(1, int(np.prod(shape[:-1]))))
    return value.astype(spec.dtype)


# --- Training ---------------------------------------------------------------

def loss_and_grads(case: ModelCase) -> Callable[[Any, np.ndarray, np.ndarray], tuple[Any, Any]]:
    """``(variables, x, target) -> (loss, gradients)``: the mean squared error of the
    model's output against ``target``, differentiated with respect to the trainable
    parameters (the "params" collection; running statistics are not trained)."""
    def fn(variables, x, target):
        def loss(params):
            y = case.apply({**variables, "params": params}, x)
            return jnp.mean((y.astype(jnp.float32) - target) ** 2)
        return jax.value_and_grad(loss)(variables["params"])
    return fn


def train_step(case: ModelCase, learning_rate: float = 0.01) -> Callable[[Any, np.ndarray, np.ndarray], tuple[Any, Any]]:
    """``(variables, x, target) -> (loss, updated variables)``: one step of plain SGD."""
    gradients = loss_and_grads(case)

    def fn(variables, x, target):
        value, grads = gradients(variables, x, target)
        params = jax.tree_util.tree_map(lambda p, g: p - learning_rate * g, variables["params"], grads)
        return value, {**variables, "params": params}
    return fn


def training_target(case: ModelCase, seed: int = 0) -> np.ndarray:
    """A random target shaped as the model's output (class scores, or a UNet's mask)."""
    shape = jax.eval_shape(case.apply, case.params, case.input).shape
    return np.random.default_rng(seed + 2).standard_normal(shape).astype(np.float32)
