"""Reproducible noise: a pure function of (seed, request id, token position, stream), on the device.

Each decision at a token position draws from its own stream, so decisions are independent; nothing
depends on the batch, the slot, k or the width of a pass, which is what makes seeded sampling
reproducible across batch sizes, orderings, drafters and resumes.
"""

from __future__ import annotations

import hashlib

import torch

STREAM_DRAFT, STREAM_ACCEPT, STREAM_RESAMPLE, STREAM_GUMBEL = 1, 2, 3, 4

_MASK64 = (1 << 64) - 1


def _signed(x: int) -> int:
    x &= _MASK64
    return x - (1 << 64) if x >= 1 << 63 else x


_C1, _C2, _GOLDEN = _signed(0xBF58476D1CE4E5B9), _signed(0x94D049BB133111EB), _signed(0x9E3779B97F4A7C15)


def request_key(seed: int, request_id: str) -> int:
    """A 63-bit key for a request's noise; the same (seed, id) gives the same key on every machine."""
    digest = hashlib.blake2b(f"{seed}\x00{request_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def _shift_right(z: torch.Tensor, s: int) -> torch.Tensor:
    return (z >> s) & ((1 << (64 - s)) - 1)  # logical shift on int64


def _mix64(z: torch.Tensor) -> torch.Tensor:
    """splitmix64's finalizer on int64 tensors (wrap-around multiplication)."""
    z = (z ^ _shift_right(z, 30)) * _C1
    z = (z ^ _shift_right(z, 27)) * _C2
    return z ^ _shift_right(z, 31)


def uniforms(keys: torch.Tensor, positions: torch.Tensor, stream: int) -> torch.Tensor:
    """Counter-based U[0, 1): keys [b] int64, positions [b, ...] int64 -> float64 [b, ...].

    Depends only on (key, position, stream) — never on batch size, slot or neighbours — which is
    what makes seeded sampling reproducible across batch sizes, orderings and resumes.
    """
    return _shift_right(uniforms_bits(keys, positions, stream), 11).double() * (1.0 / (1 << 53))


def _hash32(h: torch.Tensor) -> torch.Tensor:
    """lowbias32 (C. Wellons), a 32-bit integer hash, on int32 tensors (wrap-around multiplication,
    logical shifts by masking): one cheap elementwise pass per step, over a whole [b, T, V] block."""
    h = h ^ ((h >> 16) & 0xFFFF)
    h = h * 0x7FEB352D
    h = h ^ ((h >> 15) & 0x1FFFF)
    h = h * -0x7B935975  # 0x846CA68B as a signed 32-bit constant
    return h ^ ((h >> 16) & 0xFFFF)


def _to_int32(x: torch.Tensor) -> torch.Tensor:
    """The low 32 bits of int64 values, as int32 (two's complement)."""
    low = x & 0xFFFFFFFF
    return torch.where(low >= 1 << 31, low - (1 << 32), low).to(torch.int32)


def gumbel_noise(keys: torch.Tensor, positions: torch.Tensor, vocab: int) -> torch.Tensor:
    """Counter-based Gumbel(0, 1) noise: keys [b] int64, positions [b, T] -> float32 [b, T, vocab].

    G[i, t, x] depends only on (keys[i], positions[i, t], x): a 64-bit mix of (key, position, stream) per
    position, then a 32-bit hash per token id keyed by those 64 bits, all elementwise on the device (no
    host sync, no loop over rows), so a token's noise never depends on the batch, the slot, k or the
    width of the pass. G = -log(E), E = -log(u) with u = (h + 1/2) / 2^32 strictly inside (0, 1); E is
    computed from u below 1/2 and from 1 - u above it, so float32 keeps every one of the 32 bits.
    """
    bits = uniforms_bits(keys, positions, STREAM_GUMBEL)[..., None]  # [b, T, 1] int64
    low, high = _to_int32(bits), _to_int32(_shift_right(bits, 32))
    ids = torch.arange(vocab, device=keys.device, dtype=torch.int32)
    # Distinct token ids give distinct hash inputs within a position (the multiplier is odd).
    h = _hash32((low + ids * -0x61C88647) ^ high)  # 0x9E3779B9 as a signed 32-bit constant
    # u = (h_unsigned + 1/2) / 2^32 = c + (1 if h < 0 else 0), c = h_signed / 2^32 + 2^-33 in (-1/2, 1/2).
    # -log(u) is -log(c) below 1/2 and -log1p(c) above; each element takes one term, the other is 0
    # (never a log of a negative number: that alone made the pass 10x slower on CPU).
    c = h.float() * 2.0 ** -32 + 2.0 ** -33
    negative = h < 0
    exponential = torch.log(c.masked_fill(negative, 1.0)).add_(torch.log1p(c.masked_fill_(~negative, 0.0)))
    return exponential.neg_().log_().neg_()


def uniforms_bits(keys: torch.Tensor, positions: torch.Tensor, stream: int) -> torch.Tensor:
    """The 64 random bits behind `uniforms`, as int64 [b, ...]."""
    keys = keys.reshape(-1, *([1] * (positions.dim() - 1)))
    z = _mix64(keys + _signed(stream * _GOLDEN))
    return _mix64(z + positions * _GOLDEN)


def sample_key(seed: int, request_id: str, sample_index: int) -> int:
    """The noise key of sample i of a request: sample 0's is the request's own (so n = 1 and the first of n
    samples are the same text); sample i's is keyed by the id and i (ids never contain NUL)."""
    return request_key(seed, request_id if sample_index == 0 else f"{request_id}\x00{sample_index}")
