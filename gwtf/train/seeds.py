"""Named seeds: every random draw in gwtf.train comes from a generator seeded by a name.

A seed is derived from a tuple of parts, for example `(job_seed, "dropout", iteration,
microbatch, "block", 3)`, by hashing the tuple with sha256. Two processes that name the same tuple
get the same generator state on any machine and in any order of calls, which is what lets a
replacement node redo a dead node's work and lets one layer be initialised without building the
others. The global torch RNG is never read or advanced.
"""

from __future__ import annotations

import hashlib

import torch

__all__ = ["SeedPart", "derive_seed", "seeded_generator"]

SeedPart = int | str

# Seeds are kept below 2**63 so that they fit torch's signed int64 seed everywhere.
_SEED_MASK = (1 << 63) - 1


def derive_seed(*parts: SeedPart) -> int:
    """Return a 63-bit seed that depends on every part and on their order.

    Parts are rendered with their type so that `1` and `"1"` name different seeds.
    """
    if not parts:
        raise ValueError("derive_seed needs at least one part")
    text = "/".join(f"{type(part).__name__}:{part}" for part in parts)
    digest = hashlib.sha256(text.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "little") & _SEED_MASK


def seeded_generator(*parts: SeedPart) -> torch.Generator:
    """A fresh CPU generator seeded by `derive_seed(*parts)`."""
    generator = torch.Generator(device="cpu")
    generator.manual_seed(derive_seed(*parts))
    return generator
