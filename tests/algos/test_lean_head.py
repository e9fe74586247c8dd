"""The lean CPU tiles of TRL's fused LM head: bit for bit TRL's own (every flag, every result, the tile left as TRL
leaves it), through TRL's entry points too, in fewer whole-tile temporaries; the fence puts them in place."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from ablate.algos import trl_fence
from ablate.models import lean_head

N, WIDTH, N_COLS = 37, 333, 301  # a tile is a view of the first N_COLS columns of a WIDTH-wide buffer, as TRL's
VOCAB_START = 1000
SCALES = {"logit_scale": 0.7, "softcap": 3.0, "inv_t": 1 / 0.9}
FORWARD_FLAGS = ("HAS_SOFTCAP", "HAS_ENTROPY", "HAS_LOG_SUM_SQ_PROBS", "HAS_MEAN_LOGITS", "HAS_IS_TOP1")
BACKWARD_FLAGS = ("HAS_SOFTCAP", "HAS_LOGPROB_GRAD", "HAS_ENTROPY_GRAD")


def bits(t: torch.Tensor) -> torch.Tensor:
    """The tensor's raw bits (so -0.0 and 0.0 differ, and NaN equals itself)."""
    ints = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}
    return t.contiguous().view(ints[t.dtype])


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and torch.equal(bits(a), bits(b))


def logits_buffer(g: torch.Generator, dtype: torch.dtype) -> torch.Tensor:
    """Random logits with extremes: probabilities that underflow to 0, one that is nearly 1."""
    buf = torch.randn(N, WIDTH, generator=g) * 4
    buf[::3, ::7] = -300.0
    buf[1, 2] = 80.0
    return buf.to(dtype)


def targets(g: torch.Generator) -> torch.Tensor:
    """Target token ids inside the tile and on both sides of it."""
    return torch.randint(-50, N_COLS + 50, (N,), generator=g) + VOCAB_START


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_forward_tile_is_trls_bit_for_bit_for_every_flag(dtype):
    trl_forward = lean_head.trl_tiles()["_forward_tile"]
    g = torch.Generator().manual_seed(0)
    for flags in itertools.product([False, True], repeat=len(FORWARD_FLAGS)):
        tile = logits_buffer(g, dtype)[:, :N_COLS]
        tile_before = tile.clone()
        tgt = targets(g)
        # running max, sum_exp, x_sum_exp, sq_sum_exp, z_sum, max_before_target, target_logit: mid-fold values
        state = [torch.randn(N, generator=g) for _ in range(7)]
        state[0][:5] = -math.inf  # rows seeing their first tile
        state[5][:7] = -math.inf
        theirs, ours = [s.clone() for s in state], [s.clone() for s in state]
        kw = dict(zip(FORWARD_FLAGS, flags), vocab_start=VOCAB_START, n_cols=N_COLS, BLOCK_SIZE=1024, **SCALES)
        trl_forward(tile, tile.stride(0), tgt, *theirs, **kw)
        lean_head.forward_tile(tile, tile.stride(0), tgt, *ours, **kw)
        assert all(same_bits(a, b) for a, b in zip(theirs, ours)), flags
        assert same_bits(tile, tile_before), flags  # the forward never writes into the tile


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_backward_tile_is_trls_bit_for_bit_for_every_flag(dtype):
    trl_backward = lean_head.trl_tiles()["_backward_tile"]
    g = torch.Generator().manual_seed(1)
    for flags in itertools.product([False, True], repeat=len(BACKWARD_FLAGS)):
        buf = logits_buffer(g, dtype)
        tgt = targets(g)
        log_z, entropy = torch.randn(N, generator=g) + 8, torch.rand(N, generator=g) * 5
        grad_logprobs, grad_entropy = torch.randn(N, generator=g), torch.randn(N, generator=g)
        grad_logprobs[:4], grad_entropy[2:6] = 0.0, -0.0  # rows with no gradient (masked tokens)
        inputs = (tgt, log_z, entropy, grad_logprobs, grad_entropy)
        inputs_before = [t.clone() for t in inputs]
        theirs, ours = buf.clone(), buf.clone()
        kw = dict(zip(BACKWARD_FLAGS, flags), vocab_start=VOCAB_START, n_cols=N_COLS, BLOCK_SIZE=1024, **SCALES)
        trl_backward(theirs[:, :N_COLS], WIDTH, *inputs, **kw)
        lean_head.backward_tile(ours[:, :N_COLS], WIDTH, *inputs, **kw)
        assert same_bits(theirs, ours), flags  # the gradient in the tile, the columns beyond it untouched
        assert all(same_bits(a, b) for a, b in zip(inputs, inputs_before) if a.is_floating_point()), flags


@pytest.fixture
def trl_own_tiles(monkeypatch):
    """A way to run TRL's own tile functions for a while (the lean ones come back after the test)."""
    import trl.kernels.chunked_logprob as ck

    assert trl_fence.use_lean_head()

    def use_trl():
        for name, fn in lean_head.trl_tiles().items():
            monkeypatch.setattr(ck, name, fn)

    return use_trl


def _head_run(hidden, weight, bias, tgt, softcap, autocast):
    """TRL's chunked log-prob function (4 vocabulary chunks, the last one partial) forward and backward: its
    outputs and the gradients of hidden, weight and bias."""
    from trl.kernels import ChunkedLogProbFunction

    leaves = [t.detach().clone().requires_grad_(True) for t in (hidden, weight, bias)]
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        out = ChunkedLogProbFunction.apply(*leaves, tgt, 0.9, 40, softcap, 0.8)
    logprobs, entropy = out[0], out[1]
    (logprobs * torch.linspace(-1, 1, len(tgt))).sum().add(entropy.sum() * 0.3).backward()
    return [o for o in out if o is not None] + [t.grad for t in leaves]


@pytest.mark.parametrize("autocast", [False, True])
@pytest.mark.parametrize("softcap", [None, 5.0])
def test_trls_chunked_logprob_function_is_unchanged(trl_own_tiles, autocast, softcap):
    """Every output (log-probs, entropy, log sum of squared probabilities, mean logit, top-1) and every gradient
    of TRL's fused log-prob function is bit for bit the same with the lean tiles as with TRL's own."""
    g = torch.Generator().manual_seed(2)
    hidden, weight, bias = torch.randn(23, 16, generator=g), torch.randn(150, 16, generator=g), torch.randn(150)
    tgt = torch.randint(0, 150, (23,), generator=g)
    lean = _head_run(hidden, weight, bias, tgt, softcap, autocast)
    trl_own_tiles()
    theirs = _head_run(hidden, weight, bias, tgt, softcap, autocast)
    assert len(lean) == len(theirs) == 8
    assert all(same_bits(a, b) if a.is_floating_point() else torch.equal(a, b) for a, b in zip(lean, theirs))


def test_a_model_with_the_fused_head_trains_the_same(trl_own_tiles, tiny_model, tokenizer):
    """A tiny model's fused-head log-probs and entropy, and the gradients of all its weights, are bit for bit the
    same with the lean tiles (installed by the fence) as with TRL's, under bf16 autocast as the policy trains."""
    from trl.trainer import add_fused_lm_head

    add_fused_lm_head(tiny_model, outputs=("log_probs", "entropy"))  # as TRL's DPO trainer puts it on the policy
    ids = tokenizer(["The film was a quiet delight.", "I would not watch it again, ever."], padding=True)
    ids, mask = torch.tensor(ids["input_ids"]), torch.tensor(ids["attention_mask"])
    labels = ids.masked_fill(mask == 0, -100)

    def run():
        tiny_model.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = tiny_model(input_ids=ids, attention_mask=mask, labels=labels, fused_lm_head=True)
        (out.log_probs.sum() - out.entropy.sum()).backward()
        return [out.log_probs.detach(), out.entropy.detach()] + [p.grad.clone() for p in tiny_model.parameters()]

    lean = run()
    trl_own_tiles()
    theirs = run()
    assert all(same_bits(a, b) for a, b in zip(lean, theirs))


def _peak_bytes(fn) -> int:
    """The most bytes ``fn`` holds allocated at once on CPU (the profiler's allocation events, summed in order)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    held = peak = 0
    for e in sorted(events, key=lambda e: e.start_ns()):
        held += e.nbytes()
        peak = max(peak, held)
    return peak


def test_the_lean_tiles_hold_fewer_whole_tile_temporaries():
    """With the flags TRL's DPO trainer uses on a bf16 tile: the forward holds about 2 float32 tiles at once
    (TRL's: 3.3), the backward 2 (TRL's: 7.25)."""
    tiles = lean_head.trl_tiles()
    g = torch.Generator().manual_seed(3)
    tile = logits_buffer(g, torch.bfloat16)[:, :N_COLS]
    tgt, state = targets(g), [torch.zeros(N) for _ in range(7)]
    fwd = dict(HAS_SOFTCAP=False, HAS_ENTROPY=True, HAS_LOG_SUM_SQ_PROBS=False, HAS_MEAN_LOGITS=True, HAS_IS_TOP1=True)
    bwd = dict(HAS_SOFTCAP=False, HAS_LOGPROB_GRAD=True, HAS_ENTROPY_GRAD=False)
    common = dict(vocab_start=VOCAB_START, n_cols=N_COLS, BLOCK_SIZE=1024, **SCALES)
    fp32_tile = N * N_COLS * 4

    def forward(fn):
        return _peak_bytes(lambda: fn(tile, WIDTH, tgt, *state, **fwd, **common)) / fp32_tile

    def backward(fn):
        grad_tile = tile.clone()
        return _peak_bytes(lambda: fn(grad_tile, WIDTH, tgt, *state[:4], **bwd, **common)) / fp32_tile

    assert forward(lean_head.forward_tile) < 2.35 < 3 < forward(tiles["_forward_tile"])
    assert backward(lean_head.backward_tile) < 2.1 < 7 < backward(tiles["_backward_tile"])


def test_the_fence_puts_the_lean_tiles_in_place(tiny_model):
    import trl.kernels.chunked_logprob as ck

    trl_fence.add_fused_head(tiny_model)
    assert ck._forward_tile is lean_head.forward_tile and ck._backward_tile is lean_head.backward_tile
    assert lean_head.install()  # again: nothing changes
    assert lean_head.trl_tiles()["_forward_tile"] is not lean_head.forward_tile


def test_a_trl_tile_function_other_than_the_one_copied_is_left_in_place(monkeypatch):
    """A TRL whose CPU tile function is not the source the lean one copies keeps its own."""
    import trl.kernels.chunked_logprob as ck

    monkeypatch.setattr(ck, "_backward_tile", ck._torch_transform)  # a real TRL function, not the one copied
    assert not lean_head.install()
    assert ck._backward_tile is ck._torch_transform
