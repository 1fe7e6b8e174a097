"""Flax models of the coverage zoo beyond the three benchmark models, at small sizes.

Each spans op families the others do not: depthwise convolutions, causal attention
with embedding lookups, recurrences through lax.scan, token-mixing transposes, dilated
1-D and 3-D convolutions.
"""
from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp


class MLP(nn.Module):
    widths: tuple[int, ...] = (64, 64, 10)

    @nn.compact
    def __call__(self, x):
        for width in self.widths[:-1]:
            x = nn.relu(nn.Dense(width)(x))
        return nn.Dense(self.widths[-1])(x)


class InvertedResidual(nn.Module):
    """MobileNet-V2 block: 1x1 expand, 3x3 depthwise, 1x1 project, residual when shapes allow."""
    width: int
    stride: int
    expand: int = 4

    @nn.compact
    def __call__(self, x):
        norm = lambda: nn.BatchNorm(use_running_average=True)
        hidden = x.shape[-1] * self.expand
        y = nn.relu6(norm()(nn.Conv(hidden, (1, 1), use_bias=False)(x)))
        y = nn.Conv(hidden, (3, 3), self.stride, padding=1, feature_group_count=hidden, use_bias=False)(y)
        y = norm()(nn.Conv(self.width, (1, 1), use_bias=False)(nn.relu6(norm()(y))))
        return x + y if x.shape == y.shape else y


class MobileNet(nn.Module):
    @nn.compact
    def __call__(self, x):
        x = nn.relu6(nn.BatchNorm(use_running_average=True)(nn.Conv(8, (3, 3), 2, padding=1)(x)))
        for width, stride in ((8, 1), (16, 2), (16, 1), (32, 2)):
            x = InvertedResidual(width, stride)(x)
        return nn.Dense(10)(jnp.mean(x, axis=(1, 2)))


class DecoderBlock(nn.Module):
    heads: int

    @nn.compact
    def __call__(self, x, mask):
        y = nn.LayerNorm()(x)
        x = x + nn.MultiHeadDotProductAttention(num_heads=self.heads)(y, y, mask=mask)
        y = nn.LayerNorm()(x)
        return x + nn.Dense(x.shape[-1])(nn.gelu(nn.Dense(4 * x.shape[-1])(y)))


class Decoder(nn.Module):
    """GPT-style: token and position embeddings, causal self-attention, tied output."""
    vocab: int = 97
    width: int = 32
    depth: int = 2
    heads: int = 4

    @nn.compact
    def __call__(self, tokens):
        embed = nn.Embed(self.vocab, self.width)
        x = embed(tokens) + self.param("pos", nn.initializers.normal(0.02), (tokens.shape[1], self.width))
        mask = nn.make_causal_mask(tokens)
        for _ in range(self.depth):
            x = DecoderBlock(self.heads)(x, mask)
        return embed.attend(nn.LayerNorm()(x))


class Recurrent(nn.Module):
    """One recurrent layer (an RNN over lax.scan) and a classifier on the last state."""
    cell: str = "lstm"
    hidden: int = 32

    @nn.compact
    def __call__(self, x):
        cell = nn.OptimizedLSTMCell(self.hidden) if self.cell == "lstm" else nn.GRUCell(self.hidden)
        y = nn.RNN(cell)(x)
        return nn.Dense(10)(y[:, -1])


class MixerBlock(nn.Module):
    tokens_hidden: int = 32
    channels_hidden: int = 64

    @nn.compact
    def __call__(self, x):
        y = jnp.swapaxes(nn.LayerNorm()(x), 1, 2)  # mix across tokens
        y = nn.Dense(x.shape[1])(nn.gelu(nn.Dense(self.tokens_hidden)(y)))
        x = x + jnp.swapaxes(y, 1, 2)
        y = nn.LayerNorm()(x)  # mix across channels
        return x + nn.Dense(x.shape[2])(nn.gelu(nn.Dense(self.channels_hidden)(y)))


class Mixer(nn.Module):
    patch: int = 8
    width: int = 32
    depth: int = 2

    @nn.compact
    def __call__(self, x):
        x = nn.Conv(self.width, (self.patch, self.patch), self.patch, padding="VALID")(x)
        x = x.reshape(x.shape[0], -1, self.width)
        for _ in range(self.depth):
            x = MixerBlock()(x)
        return nn.Dense(10)(jnp.mean(nn.LayerNorm()(x), axis=1))


class TCN(nn.Module):
    """Causal dilated 1-D convolutions (WaveNet-style) and average pooling over time."""
    width: int = 16

    @nn.compact
    def __call__(self, x):
        for dilation in (1, 2, 4):
            pad = 2 * dilation  # kernel 3: left padding only keeps it causal
            y = nn.Conv(self.width, (3,), padding=((pad, 0),), kernel_dilation=dilation)(x)
            x = nn.tanh(y) * nn.sigmoid(y) + (x if x.shape == y.shape else 0)
        x = nn.avg_pool(x, (4,), (4,))
        return nn.Dense(10)(x.reshape(x.shape[0], -1))


class Conv3D(nn.Module):
    @nn.compact
    def __call__(self, x):
        x = nn.relu(nn.Conv(8, (3, 3, 3), padding=1)(x))
        x = nn.max_pool(x, (2, 2, 2), (2, 2, 2))
        x = nn.relu(nn.Conv(16, (3, 3, 3), 2, padding=1)(x))
        return nn.Dense(10)(jnp.mean(x, axis=(1, 2, 3)))
