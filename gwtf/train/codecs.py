"""Codecs for what crosses a stage boundary: activations forward, their gradients backward.

A codec maps a float32 tensor to a few smaller tensors (its wire parts) and back. A job's plan
(`CompressionConfig.after`) says after which block which codec applies; a stage boundary there
sends the codec's parts instead of the float32 tensor (docs/design.md 2.15), and the one-process
reference applies the same round trip at the same place (`Boundary`), so that a swarm with
compression still ends equal to `gwtf reference` bit for bit.

Codecs (ratio: float32 bytes over the parts' bytes, for a tensor of whole blocks):

- `none`: the tensor itself (ratio 1).
- `int8`: blockwise absmax quantization, as SWARM sends activations and gradients (hivemind's
  blockwise 8-bit): blocks of 64 consecutive values, each with a float32 scale
  `s = max|x| / 127` and values `q = round(x / s)` in -127..127. Ratio 3.76. Error:
  `|x - decode(encode(x))| <= s / 2` per element of a block (round to nearest), at most
  `max|x| / 254`.
- `int4`: the same with 15 levels (-7..7, `s = max|x| / 7`), two values per byte, blocks of 64.
  Ratio 7.11. Error at most `s / 2 = max|x| / 14` per block.

Why no error feedback (the residual of one send added to the next, as in 1-bit SGD or
TAH-Quant): it is state kept by the sender across microbatches, so what a microbatch's
activation becomes would depend on which node sent it and what that node sent before. A
replacement node recomputing a dead node's work could not reproduce it, and neither could the
reference; every crash rule of docs/design.md 4 rests on that. The codecs here are functions of
the tensor alone. Why not a low-rank or subspace projection: it needs the model to be trained
for it (Pluralis' subspace networks constrain the weights) or a per-tensor SVD, which costs more
compute than the stage on a CPU and is not deterministic across thread counts.

Determinism: every step is elementwise (division, rounding half to even, multiplication) or a
maximum over a block, which is exact in any order; so the same input gives the same bits on any
number of threads and in any process, which `tests/unit/test_train_codecs.py` checks.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from gwtf.flow.compression import CODECS, Codec, codec_info, wire_bytes

__all__ = [
    "CODECS",
    "Boundary",
    "Codec",
    "CodecError",
    "codec",
    "decode",
    "encode",
    "pack",
    "pack_specs",
    "part_specs",
    "roundtrip",
    "side_seconds",
    "unpack",
    "wire_bytes",
]


class CodecError(ValueError):
    """Parts that do not decode to the expected tensor; the message is one line for the peer."""


def codec(name: str) -> Codec:
    """The codec called `name`; CodecError naming the known ones otherwise."""
    try:
        return codec_info(name)
    except ValueError as err:
        raise CodecError(str(err)) from None


def _blocks(c: Codec, numel: int) -> int:
    return -(-numel // c.block)


def encode(name: str, tensor: Tensor) -> dict[str, Tensor]:
    """The wire parts of a float32 CPU tensor: {"value": tensor} for `none`, else
    {"q": int8 (int8) or uint8 (int4, two values a byte), "scale": float32 per block}."""
    c = codec(name)
    if c.lossless:
        return {"value": tensor}
    flat = tensor.detach().reshape(-1).float()
    numel = flat.numel()
    pad = _blocks(c, numel) * c.block - numel
    if pad:
        flat = torch.cat([flat, flat.new_zeros(pad)])
    blocks = flat.view(-1, c.block)
    scale = blocks.abs().amax(dim=1) / c.levels
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = torch.round(blocks / safe[:, None]).clamp_(-c.levels, c.levels).to(torch.int8)
    if c.per_byte == 2:
        pairs = (q.view(-1, 2) + 8).to(torch.uint8)
        return {"q": pairs[:, 0] | (pairs[:, 1] << 4), "scale": scale}
    return {"q": q.reshape(-1), "scale": scale}


def part_specs(name: str, numel: int) -> dict[str, tuple[torch.dtype, tuple[int, ...]]]:
    """What each wire part of a tensor of `numel` values must be: dtype and shape."""
    c = codec(name)
    if c.lossless:
        raise CodecError("the none codec has no parts apart from the tensor")
    blocks = _blocks(c, numel)
    qtype = torch.uint8 if c.per_byte == 2 else torch.int8
    return {"q": (qtype, (blocks * c.block // c.per_byte,)), "scale": (torch.float32, (blocks,))}


def decode(name: str, parts: Mapping[str, Tensor], shape: tuple[int, ...]) -> Tensor:
    """The float32 tensor of `shape` that `encode(name, ...)` sent as `parts`; CodecError if
    the parts are not what such a tensor gives (wrong names, dtypes, sizes, a scale below zero or
    not finite)."""
    c = codec(name)
    if c.lossless:
        value = parts.get("value")
        if value is None or tuple(value.shape) != tuple(shape) or value.dtype != torch.float32:
            raise CodecError(f"an uncompressed tensor must be float32{list(shape)}")
        return value
    numel = 1
    for size in shape:
        numel *= size
    specs = part_specs(name, numel)
    if set(parts) != set(specs):
        raise CodecError(
            f"{name} parts must be {', '.join(sorted(specs))}, got {', '.join(sorted(parts))}"
        )
    for key, (dtype, want) in specs.items():
        got = parts[key]
        if got.dtype != dtype or tuple(got.shape) != want:
            raise CodecError(
                f"{name} part {key!r} must be {str(dtype).removeprefix('torch.')}{list(want)} "
                f"for a tensor of {list(shape)}, got "
                f"{str(got.dtype).removeprefix('torch.')}{list(got.shape)}"
            )
    scale = parts["scale"]
    if not bool(torch.isfinite(scale).all()) or bool((scale < 0).any()):
        raise CodecError(f"{name} scales must be finite and at least 0")
    q = parts["q"]
    if c.per_byte == 2:
        low = (q & 0x0F).to(torch.int8) - 8
        high = (q >> 4).to(torch.int8) - 8
        q = torch.stack([low, high], dim=1).reshape(-1)
    elif bool((q == -128).any()):
        raise CodecError(f"{name} values must lie in -{c.levels}..{c.levels}")
    if c.per_byte == 2 and bool((q.abs() > c.levels).any()):
        raise CodecError(f"{name} values must lie in -{c.levels}..{c.levels}")
    values = q.view(-1, c.block).float() * scale[:, None]
    return values.reshape(-1)[:numel].view(shape)


def pack(name: str, field: str, tensor: Tensor) -> dict[str, Tensor]:
    """What a node sends of `tensor` (a microbatch's `field`, "activation" or "gradient") across
    a boundary of codec `name`: the tensor itself under `field`, or its parts under
    `field.q` and `field.scale`."""
    if codec(name).lossless:
        return {field: tensor}
    return {f"{field}.{part}": value for part, value in encode(name, tensor).items()}


def pack_specs(
    name: str, field: str, shape: tuple[int, ...]
) -> dict[str, tuple[torch.dtype, tuple[int, ...]]]:
    """The names, dtypes and shapes `pack(name, field, t)` sends for a tensor of `shape`."""
    if codec(name).lossless:
        return {field: (torch.float32, shape)}
    numel = 1
    for size in shape:
        numel *= size
    return {f"{field}.{part}": spec for part, spec in part_specs(name, numel).items()}


def unpack(name: str, field: str, tensors: Mapping[str, Tensor], shape: tuple[int, ...]) -> Tensor:
    """The float32 `field` of shape `shape` from what `pack` sent (CodecError if it does not
    decode to it)."""
    if codec(name).lossless:
        return decode(name, {"value": tensors[field]} if field in tensors else {}, shape)
    prefix = f"{field}."
    parts = {k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)}
    return decode(name, parts, shape)


def roundtrip(name: str, tensor: Tensor) -> Tensor:
    """`decode(encode(tensor))`: what the receiver of `tensor` gets."""
    if codec(name).lossless:
        return tensor
    return decode(name, encode(name, tensor), tuple(tensor.shape)).to(tensor.device)


_MEASURE_VALUES = 1 << 22
"""`side_seconds` times a tensor of at most this many values (16 MiB) and scales linearly: the
codecs' passes are elementwise, and a larger tensor would keep a submission waiting."""


@functools.lru_cache(maxsize=64)
def side_seconds(name: str, numel: int) -> float:
    """Seconds this machine takes, per microbatch, on one side of a boundary of codec `name`
    carrying float32 tensors of `numel` values: one encode and one decode (it encodes what it
    sends across and decodes what comes back). Measured here, the best of three (the plan
    weighs it against what the links gain: `gwtf.flow.compression.swarm_plan`); 0 for `none`."""
    if codec(name).lossless or numel <= 0:
        return 0.0
    size = min(numel, _MEASURE_VALUES)
    x = torch.randn(size, generator=torch.Generator().manual_seed(0))
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        decode(name, encode(name, x), (size,))
        best = min(best, time.perf_counter() - start)
    return best * numel / size


class _BoundaryFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: Tensor, name: str) -> Tensor:
        ctx.codec = name
        return roundtrip(name, tensor.cpu()).to(tensor.device)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        return roundtrip(ctx.codec, grad.float().cpu()).to(grad.device), None


class Boundary:
    """A stage boundary inside one module: the activation goes through the codec forward and its
    gradient backward, as if a stage had sent it to the next (the reference's boundaries, and a
    planned boundary that falls inside a stage of a swarm cut another way)."""

    def __init__(self, name: str) -> None:
        self.name = codec(name).name

    def __call__(self, tensor: Tensor) -> Tensor:
        if codec(self.name).lossless:
            return tensor
        out: Tensor = _BoundaryFn.apply(tensor, self.name)
        return out
