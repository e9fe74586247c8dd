"""Coupled sampling: Gumbel-max with counter-based noise keyed by (seed, prompt id, sample index, position, token).

``argmax_v (logits_v / T + G_v)`` with ``G_v`` i.i.d. Gumbel(0, 1) is an exact sample of ``softmax(logits / T)``.
Here ``G_v`` is not drawn from a stateful generator: it is a function of its key. The token a row draws at a
position therefore depends only on the row's key and the model's logits there, not on the batch size, the other
rows, the left padding or which model samples: two models that agree draw the same response, two that differ a
little draw mostly the same responses. :class:`CoupledGumbel` is a logits processor that makes greedy decoding
(``generate(do_sample=False)``) draw these samples; its :meth:`~CoupledGumbel.choose` draws them for a subset of the
rows, for :func:`ablate.models.decode.decode`, which the evaluation samples with.

The noise of a vocabulary is defined block by block (tokens ``64 b .. 64 b + 63``), in the form i.i.d. Gumbels
decompose into: the block's maximum ``M ~ Gumbel(log 64)``, its position ``I`` uniform in the block, and every other
token ``-log(E + exp(-M))`` with ``E ~ Exp(1)`` (a Gumbel truncated below ``M``). :func:`noise` computes all of it
(the definition, used by the tests); :func:`gumbel_argmax` finds the same argmax while computing token-level noise
only in the blocks whose best possible value ``max logit / T + M`` beats a value already reached, a few per row.

The integer hash is ``lowbias32`` (constants from Wellons' hash-prospector) in int64 tensors: every value stays in
[0, 2**32) and every product below 2**63 (multipliers below 2**31), so torch computes it exactly, with logical right
shifts, on any device. Uniforms are ``(h + 0.5) / 2**32``, exact in float64 and strictly inside (0, 1); the noise is
float64 and finite, and scores are cast to float64 (from float32 or bf16) before it is added.
"""

from __future__ import annotations

import functools
import math

import torch
from transformers import LogitsProcessor

_M32 = 0xFFFFFFFF
_MUL = (0x21F0AAAD, 0x735A2D97)  # both below 2**31: a 32-bit value times either is below 2**63
# a distinct constant per key field, so that equal values in different fields hash differently
_FIELD = {
    "seed": 0x243F6A88,
    "prompt": 0x85A308D3,
    "sample": 0x13198A2E,
    "position": 0x03707344,
    "token": 0xA4093822,
    "block": 0x299F31D0,
    "argmax": 0x082EFA98,
}
BLOCK = 64  # tokens per noise block (a power of two)


# ------------------------------------------------------------------------------------------------- hashing
def _hash32(x: torch.Tensor) -> torch.Tensor:
    """A bijection of [0, 2**32) that mixes every input bit into every output bit (int64, in place on a fresh
    ``x``): ``x ^= x >> 16; x *= 0x21f0aaad; x ^= x >> 15; x *= 0x735a2d97; x ^= x >> 15``, products mod 2**32."""
    x ^= x >> 16
    x.mul_(_MUL[0]).bitwise_and_(_M32)
    x ^= x >> 15
    x.mul_(_MUL[1]).bitwise_and_(_M32)
    x ^= x >> 15
    return x


def _absorb(h: torch.Tensor, value: torch.Tensor, field: str) -> torch.Tensor:
    """The running hash ``h`` with a non-negative int64 ``value`` of one key field folded in (both 32-bit halves)."""
    for half in (value & _M32, value >> 32):
        h = _hash32(h ^ _hash32((half + _FIELD[field]) & _M32))
    return h


def _int_tensor(values, device) -> torch.Tensor:
    t = torch.as_tensor(values, dtype=torch.int64, device=device)
    if bool((t < 0).any()):
        raise ValueError("coupled sampling keys must be non-negative integers")
    return t


def key_hash(seed: int, keys) -> torch.Tensor:
    """[B] 32-bit hashes of (seed, prompt id, sample index) for ``keys`` [B, 2] = (prompt id, sample index)."""
    keys = _int_tensor(keys, None).reshape(-1, 2)
    n = keys.shape[0]
    h = torch.zeros(n, dtype=torch.int64, device=keys.device)
    h = _absorb(h, _int_tensor(seed, keys.device).expand(n), "seed")
    h = _absorb(h, keys[:, 0], "prompt")
    return _absorb(h, keys[:, 1], "sample")


def at_position(key_hashes: torch.Tensor, position: int) -> torch.Tensor:
    """[B] 32-bit hashes of the rows' keys at ``position`` (tokens generated so far)."""
    return _absorb(key_hashes, _int_tensor(position, key_hashes.device).expand_as(key_hashes), "position")


def id_hash(n: int, field: str, device=None) -> torch.Tensor:
    """[n] 32-bit hashes of the ids 0..n-1 of ``field`` ("token" or "block"); computed once per (n, field, device)."""
    return _id_hash(n, field, str(torch.device(device or "cpu")))


@functools.lru_cache(maxsize=16)
def _id_hash(n: int, field: str, device: str) -> torch.Tensor:
    return _absorb(torch.zeros(n, dtype=torch.int64, device=device), torch.arange(n, device=device), field)


def pair_bits(rows: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Uniform 32-bit integers of (row, id) pairs: ``rows`` [..] and ``ids`` [..] broadcast against each other."""
    return _hash32(rows ^ ids)


# --------------------------------------------------------------------------------------------- the noise
def exponential(bits: torch.Tensor) -> torch.Tensor:
    """Exp(1) (float64) from uniform 32-bit integers: ``-log u``, ``u = (bits + 0.5) / 2**32`` in (0, 1)."""
    return bits.double().mul_(2.0**-32).add_(2.0**-33).log_().neg_()


def block_draws(rows: torch.Tensor, n_blocks: int, block_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each block's maximum noise ``M ~ Gumbel(log BLOCK)`` (float64) and its position in the block (uniform),
    both [B, n_blocks], for row hashes [B] and the blocks' id hashes [n_blocks]."""
    bits = pair_bits(rows[:, None], block_ids[None, :n_blocks])
    top = math.log(BLOCK) - exponential(bits).log_()
    where = _hash32(bits ^ _FIELD["argmax"]) & (BLOCK - 1)
    return top, where


def truncated(e: torch.Tensor, top: torch.Tensor) -> torch.Tensor:
    """Gumbel(0, 1) noise truncated below ``top``, from Exp(1) draws ``e``: ``-log(e + exp(-top))``."""
    return (e + torch.exp(-top)).log_().neg_()


def noise(seed: int, keys, position: int, vocab: int, device=None) -> torch.Tensor:
    """[B, V] float64 i.i.d. Gumbel(0, 1) noise for rows keyed (prompt id, sample index) at ``position`` (tokens
    generated so far): a pure function of its arguments, the same for a key in any batch. The definition that
    :func:`gumbel_argmax` evaluates lazily."""
    rows = at_position(key_hash(seed, _int_tensor(keys, device)), position)
    n_blocks = -(-vocab // BLOCK)
    top, where = block_draws(rows, n_blocks, id_hash(n_blocks, "block", rows.device))
    e = exponential(pair_bits(rows[:, None], id_hash(n_blocks * BLOCK, "token", rows.device)[None, :]))
    g = truncated(e.view(len(rows), n_blocks, BLOCK), top[..., None])
    g.scatter_(-1, where[..., None], top[..., None])
    return g.view(len(rows), -1)[:, :vocab]


# ------------------------------------------------------------------------------------------------ sampling
def _scaled(x: torch.Tensor, temperature: float) -> torch.Tensor:
    """Scores in float64 divided by the temperature (monotone: the bounds below hold for the exact values)."""
    return x.double() / temperature


def gumbel_argmax(
    scores: torch.Tensor, rows: torch.Tensor, temperature: float, token_ids: torch.Tensor, block_ids: torch.Tensor
) -> torch.Tensor:
    """[B] tokens ``argmax_v (scores_v / T + noise_v)`` for row hashes ``rows`` [B], with ``noise`` as
    :func:`noise` defines it, computing token-level noise only in blocks that could hold the argmax.
    ``token_ids`` / ``block_ids``: id hashes of at least the padded vocabulary's tokens and blocks."""
    n, vocab = scores.shape
    n_blocks = -(-vocab // BLOCK)
    s = scores if scores.dtype == torch.float64 else scores.float()
    if n_blocks * BLOCK != vocab:
        s = torch.nn.functional.pad(s, (0, n_blocks * BLOCK - vocab), value=float("-inf"))
    blocks = s.view(n, n_blocks, BLOCK)
    top, where = block_draws(rows, n_blocks, block_ids)
    value = _scaled(blocks.gather(-1, where[..., None]).squeeze(-1), temperature) + top  # reached at `where`
    bound = _scaled(blocks.amax(-1), temperature) + top  # no token of the block can exceed it
    token = where.clone()
    r, b = (bound > value.amax(-1, keepdim=True)).nonzero(as_tuple=True)
    if len(r):
        ids = b[:, None] * BLOCK + torch.arange(BLOCK, device=s.device)
        g = truncated(exponential(pair_bits(rows[r][:, None], token_ids[ids])), top[r, b][:, None])
        g.scatter_(-1, where[r, b][:, None], top[r, b][:, None])
        value[r, b], token[r, b] = (_scaled(blocks[r, b], temperature) + g).max(-1)
    best = value.argmax(-1, keepdim=True)
    return (best * BLOCK + token.gather(-1, best)).squeeze(-1)


class CoupledGumbel(LogitsProcessor):
    """Makes greedy decoding draw the keyed Gumbel-max sample of ``softmax(scores / temperature)``.

    ``keys`` [B, 2] are the rows' (prompt id, sample index); ``prompt_width`` is the (left-padded) prompt's width,
    so the position of a step is the number of tokens generated so far, whatever each row's padding. Returns
    scores that are 0 at each row's sampled token and -inf elsewhere (its argmax is the sample)."""

    def __init__(self, seed: int, keys, prompt_width: int, temperature: float):
        if not temperature > 0:
            raise ValueError(f"coupled sampling needs a temperature > 0, got {temperature}")
        self.prompt_width, self.temperature = int(prompt_width), float(temperature)
        self.key_hashes = key_hash(seed, keys)

    def __call__(self, input_ids: torch.LongTensor, scores: torch.Tensor) -> torch.Tensor:
        n = scores.shape[0]
        if n != self.key_hashes.shape[0]:
            raise ValueError(f"CoupledGumbel holds keys for {self.key_hashes.shape[0]} rows, got scores for {n}")
        tokens = self.choose(torch.arange(n), input_ids.shape[1] - self.prompt_width, scores)
        return torch.full_like(scores, float("-inf")).scatter_(-1, tokens[:, None], 0.0)

    def choose(self, rows: torch.Tensor, position: int, scores: torch.Tensor) -> torch.Tensor:
        """The tokens the batch's rows ``rows`` draw at ``position`` (tokens generated so far) from their ``scores``
        [len(rows), V]: what :meth:`__call__` makes greedy decoding pick, for a subset of the rows
        (:func:`ablate.models.decode.decode`)."""
        vocab = scores.shape[-1]
        hashes = at_position(self.key_hashes.to(scores.device)[rows.to(scores.device)], position)
        n_blocks = -(-vocab // BLOCK)
        ids = id_hash(n_blocks * BLOCK, "token", scores.device), id_hash(n_blocks, "block", scores.device)
        return gumbel_argmax(scores, hashes, self.temperature, *ids)
