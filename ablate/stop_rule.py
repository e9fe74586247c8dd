"""Where a response ends: the task's stop rule, applied to the tokens a model sampled.

The sentiment task asks for a one-sentence review (``task.max_sentences``, default 1): a response is the model's
text up to the end of its ``n``-th sentence, its EOS, or ``task.max_new_tokens``, whichever comes first. Without the
rule SmolLM2-135M at temperature 1 often runs on into endless text (a third of its responses were still running at
384 tokens), so every length cap censored most responses; with it, a response that hits the cap is the rare
exception the evaluation reports as ``truncation_rate``.

A sentence ends at a run of ``.``, ``!`` or ``?`` (closing quotes and brackets included) followed by whitespace: the
terminator of the last sentence therefore needs the next token (a leading space) to count, and a response that ends
on a terminator at the cap stays truncated. A response whose EOS follows its n-th sentence after nothing but
whitespace ends at that EOS (it is kept whole). Abbreviations ("Dr. Smith") end a sentence too: a simple rule, the
same for every model and regime.

The rule only cuts: tokens after the cut are not part of the response (masked, not decoded, not scored), so the
tokens kept are exactly what the model sampled, and their log-probs are the model's own.
"""

from __future__ import annotations

import re

__all__ = ["SENTENCE_END", "RULE", "sentence_cut", "cut_completion", "settled", "cut_rollouts"]

SENTENCE_END = re.compile(r"[.!?]+[\"'\u201d\u2019)\]]*(?=\s)")
#: what the caches of sampled responses key on besides ``max_sentences``: the rule itself
RULE = f"sentences:{SENTENCE_END.pattern}:eos-after-whitespace-kept"


def sentence_cut(tokenizer, ids: list[int], n: int | None) -> int:
    """How many leading tokens of ``ids`` (a response without its EOS) make up its first ``n`` sentences:
    ``len(ids)`` when it has fewer (or ``n`` is None)."""
    if n is None or not ids:
        return len(ids)
    text = tokenizer.decode(ids, skip_special_tokens=True)
    ends = [m.end() for m in SENTENCE_END.finditer(text)]
    if len(ends) < n:
        return len(ids)
    end = ends[n - 1]
    lo, hi = 1, len(ids)  # the fewest tokens whose text reaches the n-th terminator
    while lo < hi:
        mid = (lo + hi) // 2
        if len(tokenizer.decode(ids[:mid], skip_special_tokens=True)) >= end:
            hi = mid
        else:
            lo = mid + 1
    if tokenizer.decode(ids[:lo], skip_special_tokens=True)[:end] != text[:end]:
        return len(ids)  # a prefix that does not decode to a prefix of the text (a split character): no cut
    return lo


def cut_completion(tokenizer, ids: list[int], eos_ids: set[int], n: int | None) -> list[int]:
    """A completion (token ids, its EOS included if it has one) cut by the rule: unchanged when it ends (EOS)
    before its ``n``-th sentence does, or right after it with only whitespace between."""
    stop = next((i for i, t in enumerate(ids) if t in eos_ids), len(ids))
    cut = sentence_cut(tokenizer, ids[:stop], n)
    if cut >= stop:
        return ids
    if stop < len(ids) and not tokenizer.decode(ids[cut:stop], skip_special_tokens=True).strip():
        return ids  # the model ended its answer there itself: keep its EOS
    return ids[:cut]


def settled(tokenizer, ids: list[int], n: int | None) -> bool:
    """Whether :func:`cut_completion` cuts a response that begins with ``ids`` (no EOS among them) at the same place
    whatever tokens follow: its ``n``-th sentence has ended and text other than whitespace follows the cut, so no
    later EOS can keep it whole. A sampler may stop drawing a settled response. An undecodable byte (a character
    split across tokens) does not count as text: it may complete to whitespace."""
    if n is None:
        return False
    cut = sentence_cut(tokenizer, ids, n)
    return cut < len(ids) and bool(tokenizer.decode(ids[cut:], skip_special_tokens=True).replace("\ufffd", "").strip())


def cut_rollouts(tokenizer, completions: list[list[int]], logprobs, eos_ids: set[int], n: int | None):
    """GRPO's rollouts from TRL's own ``generate`` (token ids, and vLLM's per-token log-probs or None), each cut as
    :func:`cut_completion` cuts it; a cut completion has no EOS, so TRL counts it as clipped (its
    ``completions/clipped_ratio``), and ``mask_truncated_completions`` stays off so it still trains. TRL's tool
    loop, were tools configured, would cut each turn on its own."""
    if n is None:
        return completions, logprobs
    cut = [cut_completion(tokenizer, c, eos_ids, n) for c in completions]
    if logprobs is not None:
        logprobs = [lp[: len(c)] for lp, c in zip(logprobs, cut, strict=True)]
    return cut, logprobs
