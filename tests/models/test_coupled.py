"""The coupled sampler: keyed Gumbel noise, exact samples, the same response for the same key in any batch."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

from ablate.config import EvalConfig
from ablate.errors import ConfigError
from ablate.models import coupled
from ablate.models.coupled import CoupledGumbel, noise
from ablate.models.loading import load_model
from ablate.models.sampling import chat_prompt_texts, sample

# mixed lengths, so a row's left padding depends on the batch it is in
PROMPTS = [
    "Hi",
    "Write a review of a film.",
    "Continue: the movie was",
    "Tell me, in a few words, what you thought of the long and slow documentary about whales.",
    "Describe a comedy.",
    "Was the ending good?",
    "Review the sequel that nobody asked for but everybody watched anyway, twice.",
    "One word for it?",
    "Summarise the plot.",
    "Who was the best actor in it, and why do you think so?",
    "Rate it.",
    "Would you see it again?",
    "What did the critics miss?",
    "Compare the book and the film adaptation in one sentence.",
    "Music?",
    "The soundtrack was",
]
N_PER_PROMPT = 4  # 16 prompts x 4 samples = 64 rows


def _responses(batches) -> list[list[int]]:
    """Each row's response tokens up to and including the first EOS."""
    out = []
    for sb in batches:
        ids, mask = sb.batch.input_ids, sb.batch.completion_mask.bool()
        out += [ids[r][mask[r]].tolist() for r in range(ids.shape[0])]
    return out


def _sample(model, tokenizer, prompts, batch_size, **kw):
    kw = {"max_new_tokens": 6, "temperature": 1.0, "seed": 11, "n_per_prompt": N_PER_PROMPT, **kw}
    return _responses(sample(model, tokenizer, prompts, batch_size=batch_size, **kw))


@pytest.fixture(scope="module")
def model(tiny_source):
    """One tiny model for the tests that only sample from it or read its logits (sampling leaves it as it was)."""
    return load_model(tiny_source, torch.device("cpu"))


# ------------------------------------------------------------------------------------------------ the hash
def _hash32_reference(x: int) -> int:
    """lowbias32 (hash-prospector) on Python integers."""
    x ^= x >> 16
    x = (x * 0x21F0AAAD) & 0xFFFFFFFF
    x ^= x >> 15
    x = (x * 0x735A2D97) & 0xFFFFFFFF
    return x ^ (x >> 15)


def test_the_int64_hash_is_the_32_bit_hash_exactly():
    g = torch.Generator().manual_seed(0)
    edges = torch.tensor([0, 1, 0xFFFF, 0x10000, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF])
    xs = torch.cat([edges, torch.randint(0, 2**32, (1000,), generator=g, dtype=torch.int64)])
    got = coupled._hash32(xs.clone()).tolist()
    assert got == [_hash32_reference(x) for x in xs.tolist()]
    assert len(set(got)) == len(set(xs.tolist()))  # a bijection


def test_the_uniforms_never_reach_0_or_1():
    e = coupled.exponential(torch.tensor([0, 2**31, 2**32 - 1]))
    assert e.dtype == torch.float64 and (e > 0).all() and torch.isfinite(e).all()
    gumbel = -e.log()
    assert gumbel[0] < -3.0 and gumbel[2] > 22.0 and torch.isfinite(gumbel).all()


def test_the_blockwise_noise_is_iid_gumbel():
    """The block construction (maximum, its position, truncated others) gives Gumbel(0, 1) marginals: 102,400
    draws pass a Kolmogorov-Smirnov test, the mean is Euler's constant, the variance pi^2 / 6, neighbours are
    uncorrelated and each block's maximum sits anywhere in it."""
    g = noise(0, [(i, 0) for i in range(400)], 0, 256)
    flat = g.flatten().numpy()
    assert stats.kstest(flat, stats.gumbel_r.cdf).pvalue > 1e-3
    assert abs(flat.mean() - np.euler_gamma) < 0.01 and abs(flat.var() - np.pi**2 / 6) < 0.03
    assert abs(np.corrcoef(g[:, :-1].flatten(), g[:, 1:].flatten())[0, 1]) < 0.01
    where = g.view(400, 4, coupled.BLOCK).argmax(-1).flatten().numpy()
    assert stats.chisquare(np.bincount(where, minlength=coupled.BLOCK)).pvalue > 1e-3


def test_the_lazy_argmax_is_the_argmax_of_the_defined_noise():
    """gumbel_argmax computes noise only in blocks that can win: it picks the token the full noise picks, for flat,
    LM-like and peaked scores, at several temperatures, with a vocabulary that is not a multiple of the block."""
    gen = torch.Generator().manual_seed(0)
    keys, vocab = [(i, i % 3) for i in range(300)], 1000
    rows = coupled.at_position(coupled.key_hash(4, keys), 2)
    token_ids, block_ids = coupled.id_hash(1024, "token"), coupled.id_hash(16, "block")
    full = noise(4, keys, 2, vocab)
    for spread in (0.1, 3.0, 15.0):
        scores = spread * torch.randn(len(keys), vocab, generator=gen)
        for t in (1.0, 0.3):
            want = (scores.double() / t + full).argmax(-1)
            assert torch.equal(coupled.gumbel_argmax(scores, rows, t, token_ids, block_ids), want), (spread, t)


# ------------------------------------------------------------------------------- noise depends on its key alone
def test_noise_is_the_same_in_any_batch_composition():
    keys = [(0, 0), (5, 1), (5, 2), (2**40 + 3, 7)]
    whole = noise(3, keys, 4, 1000)
    for r, key in enumerate(keys):
        assert torch.equal(noise(3, [key], 4, 1000)[0], whole[r])
    shuffled = noise(3, keys[::-1], 4, 1000)
    assert torch.equal(shuffled, whole.flip(0))
    assert torch.equal(noise(3, keys, 4, 300), whole[:, :300])  # a token's noise does not depend on the vocab size


def test_every_key_field_changes_the_noise():
    base = noise(3, [(5, 1)], 4, 1000)
    for seed, key, pos in [(4, (5, 1), 4), (3, (6, 1), 4), (3, (5, 2), 4), (3, (5, 1), 5), (3, (1, 5), 4)]:
        other = noise(seed, [key], pos, 1000)
        assert (other != base).float().mean() > 0.99


def _draw(seed, keys, prompt_width, generated, scores, temperature=1.0):
    """The tokens the processor makes greedy decoding pick, ``generated`` tokens after a prompt of that width."""
    ids = torch.zeros(len(keys), prompt_width + generated, dtype=torch.long)
    out = CoupledGumbel(seed, keys, prompt_width, temperature)(ids, scores)
    assert torch.isinf(out).sum(-1).tolist() == [scores.shape[1] - 1] * len(keys)  # 0 at one token, -inf elsewhere
    return out.argmax(-1)


def test_the_processor_keys_the_position_by_tokens_generated_not_by_padding():
    """Two batches with different prompt widths (padding) draw with the same noise for a row at the same step."""
    keys, vocab = [(i, 0) for i in range(50)], 500
    scores = torch.zeros(len(keys), vocab)
    narrow = _draw(5, keys, 7, 3, scores)
    assert torch.equal(narrow, _draw(5, keys, 20, 3, scores))
    assert torch.equal(narrow, noise(5, keys, 3, vocab).argmax(-1))  # 3 tokens generated: position 3
    assert (narrow != _draw(5, keys, 7, 4, scores)).float().mean() > 0.9


def test_the_processor_divides_by_the_temperature_and_casts_bf16_up():
    logits = (3 * torch.randn(40, 50, generator=torch.Generator().manual_seed(1))).to(torch.bfloat16)
    keys = [(i, 0) for i in range(40)]
    for t in (0.5, 2.0):
        want = (logits.double() / t + noise(2, keys, 0, 50)).argmax(-1)
        assert torch.equal(_draw(2, keys, 4, 0, logits, t), want)
    with pytest.raises(ValueError, match="temperature > 0"):
        CoupledGumbel(2, keys, 4, 0.0)
    with pytest.raises(ValueError, match="non-negative"):
        CoupledGumbel(2, [(-1, 0)], 4, 1.0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_the_noise_is_the_same_on_cuda():
    keys = [(i, j) for i in range(8) for j in range(3)]

    def bits(device):
        rows = coupled.at_position(coupled.key_hash(1, torch.tensor(keys, device=device)), 2)
        return coupled.pair_bits(rows[:, None], coupled.id_hash(4096, "token", device)[None, :]).cpu()

    assert torch.equal(bits("cpu"), bits("cuda"))  # the integer hash is exact on both
    assert torch.allclose(noise(1, keys, 2, 4096), noise(1, keys, 2, 4096, device="cuda").cpu(), rtol=0, atol=1e-12)


# ------------------------------------------------------------------------------------ exact samples
def _pooled_chisquare(counts: np.ndarray, probs: np.ndarray) -> float:
    """Chi-square p-value of ``counts`` against ``probs``, categories with an expected count below 5 pooled."""
    expected = probs * counts.sum()
    small = expected < 5
    obs = np.append(counts[~small], counts[small].sum())
    exp = np.append(expected[~small], expected[small].sum())
    keep = exp > 0
    return float(stats.chisquare(obs[keep], exp[keep]).pvalue)


def test_the_first_token_is_an_exact_sample_at_the_temperature(model, tokenizer):
    """20,000 keys, one batched processor call per temperature, on the tiny model's next-token logits for one
    context restricted to the token ids 0..511 (a token's noise does not depend on the vocabulary's size, so this
    samples the model's distribution conditioned on those ids). The frequencies match softmax(logits / T), and
    the test can fail: it rejects them against the other temperature's distribution."""
    enc = tokenizer(chat_prompt_texts(tokenizer, ["Write a review of a film."]), return_tensors="pt")
    with torch.no_grad():
        logits = model(**enc).logits[0, -1, :512].float()
    n, width = 20_000, enc["input_ids"].shape[1]
    keys = [(i, 0) for i in range(n)]
    counts = {}
    for t in (1.0, 0.25):
        draws = _draw(7, keys, width, 0, logits.expand(n, -1), t)
        counts[t] = np.bincount(draws.numpy(), minlength=512)
    probs = {t: torch.softmax(logits.double() / t, -1).numpy() for t in (1.0, 0.5, 0.25)}
    assert _pooled_chisquare(counts[1.0], probs[1.0]) > 1e-3
    assert _pooled_chisquare(counts[0.25], probs[0.25]) > 1e-3
    assert _pooled_chisquare(counts[1.0], probs[0.5]) < 1e-6  # the wrong temperature is rejected
    assert _pooled_chisquare(counts[0.25], probs[0.5]) < 1e-6


# ---------------------------------------------------------------------------------- generation through sample()
@pytest.fixture(scope="module")
def at_64(model, tokenizer):
    """The 64 responses (PROMPTS x N_PER_PROMPT, in order) drawn in one batch: what any other batching repeats."""
    return _sample(model, tokenizer, PROMPTS, 64)


def _rows(at_64, prompt_ids, n=N_PER_PROMPT) -> list[list[int]]:
    """The responses of ``at_64`` to samples 0..n-1 of each prompt in ``prompt_ids``, in that order."""
    return [at_64[i * N_PER_PROMPT + j] for i in prompt_ids for j in range(n)]


def test_the_same_key_gives_the_same_response_at_batch_sizes_1_22_and_64(model, tokenizer, at_64):
    """In reverse order at 22 rows a call (batches that split a prompt's samples, other neighbours and other
    left padding than at 64) and one row a call, the shortest and the longest prompt keyed by their ids."""
    assert len(at_64) == 64 and len({tuple(r) for r in at_64}) == 64
    backwards = list(range(len(PROMPTS)))[::-1]
    assert _sample(model, tokenizer, [PROMPTS[i] for i in backwards], 22, prompt_ids=backwards) == _rows(
        at_64, backwards
    )
    alone = _sample(model, tokenizer, [PROMPTS[0], PROMPTS[3]], 1, prompt_ids=[0, 3], n_per_prompt=2)
    assert alone == _rows(at_64, [0, 3], n=2)


def test_coupled_sampling_neither_reads_nor_moves_the_global_rng(model, tokenizer):
    torch.manual_seed(0)
    state = torch.random.get_rng_state()
    a = _sample(model, tokenizer, PROMPTS[:2], 8, max_new_tokens=3)
    assert torch.equal(torch.random.get_rng_state(), state)
    torch.manual_seed(123)
    assert _sample(model, tokenizer, PROMPTS[:2], 8, max_new_tokens=3) == a
    assert _sample(model, tokenizer, PROMPTS[:2], 8, max_new_tokens=3, seed=12) != a


def test_the_multinomial_baseline_is_still_selectable(model, tokenizer, at_64):
    a = _sample(model, tokenizer, PROMPTS[:2], 8, sampler="multinomial")
    assert a == _sample(model, tokenizer, PROMPTS[:2], 8, sampler="multinomial")
    assert a != at_64[:8]  # the coupled sampler's responses to the same keys
    with pytest.raises(ValueError, match="sampler must be one of coupled, multinomial"):
        _sample(model, tokenizer, PROMPTS[:2], 8, sampler="nope")
    with pytest.raises(ValueError, match="prompt_ids"):
        _sample(model, tokenizer, PROMPTS[:2], 8, prompt_ids=[0])


def test_models_that_agree_sample_the_same_and_a_perturbed_one_mostly_the_same(tiny_source, tokenizer, at_64):
    """A second load of the same weights gives the same responses (in another batching). A model whose weights
    moved by 10% of each tensor's std keeps most responses (here 60 of 64, 99% of tokens; multinomial sampling
    at the same seed and batching keeps as many, but only while the batching stays the same)."""
    twin = load_model(tiny_source, torch.device("cpu"))
    assert _sample(twin, tokenizer, PROMPTS, 32) == at_64
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in twin.parameters():
            p.add_(0.1 * p.std() * torch.randn(p.shape, generator=g))
    moved = _sample(twin, tokenizer, PROMPTS, 64)
    same = np.mean([a == b for a, b in zip(moved, at_64)])
    same_first = np.mean([a[0] == b[0] for a, b in zip(moved, at_64)])
    assert moved != at_64  # the perturbation does change some draws
    assert same >= 0.8 and same_first >= 0.9, (same, same_first)


# ------------------------------------------------------------------------------------------ the evaluator
def test_step_0_policy_responses_equal_the_sft_baseline_token_for_token(tiny_source, tokenizer, ref_ctx, monkeypatch):
    """The tokens the evaluation itself draws (recorded as it samples) are the SFT baseline's, row for row."""
    from ablate.refs.full import FullRefConfig, FullReference
    from tests.conftest import tiny_evaluator

    ev = tiny_evaluator(tiny_source, tokenizer, n_heldout=2)
    drawn, sample_as_it_does = [], ev._sample

    def recorded(m, desc, k, seed=None, **kw):
        drawn.append((m, list(sample_as_it_does(m, desc, k, seed, **kw))))
        return iter(drawn[-1][1])

    monkeypatch.setattr(ev, "_sample", recorded)
    policy = load_model(tiny_source, torch.device("cpu"))  # the step-0 policy: the SFT model
    res = ev.evaluate(policy, FullReference(FullRefConfig(), ref_ctx), step=0)
    # the baseline and the win rate's opponent: the step-0 policy is the SFT model, so it draws nothing of its own
    assert [m for m, _ in drawn] == [ev.judge, ev.judge]
    sft, independent = (_responses(batches) for _, batches in drawn)
    assert len(sft) == len(ev.prompts) and independent != sft
    assert [s["policy_response"] for s in res.samples] == [s["sft_response"] for s in res.samples]
    m = res.metrics
    assert m["eval/reward_gold"] == m["eval/reward_gold_sft"] and m["eval/reward_delta"] == 0.0
    assert (m["eval/reward_delta"], m["eval/reward_delta_lo"], m["eval/reward_delta_hi"]) == (0.0, 0.0, 0.0)


def test_eval_sampler_is_a_checked_choice():
    assert EvalConfig().sampler == "coupled" and EvalConfig(sampler="multinomial").sampler == "multinomial"
    with pytest.raises(ConfigError, match="eval.sampler must be one of coupled, multinomial, got 'nope'"):
        EvalConfig(sampler="nope")
