"""Where a response ends: the task's stop rule, applied to the tokens a model sampled.

The sentiment task asks for a one-sentence review (``task.max_sentences``, default 1): a response is the model's
text up to the end of its ``n``-th sentence, its EOS, or ``task.max_new_tokens``, whichever comes first. Without the
rule SmolLM2-135M at temperature 1 often runs on into endless text (a third of its responses were still running at
384 tokens), so every length cap censored most responses; with it, a response that hits the cap is the rare
exception the evaluation reports as ``truncation_rate``.

A sentence ends at a run of ``.``, ``!`` or ``?`` (closing quotes and brackets included) followed by whitespace: the
terminator of the last sentence therefore needs the next token (a leading space) to count, and a response that ends
on a terminator at the cap stays truncated. Abbreviations ("Dr. Smith") end a sentence too: a simple rule, the same
for every model and regime.

The rule only cuts: tokens after the cut are not part of the response (masked, not decoded, not scored), so the
tokens kept are exactly what the model sampled, and their log-probs are the model's own.
"""

from __future__ import annotations

import re

__all__ = ["SENTENCE_END", "sentence_cut", "cut_completion"]

SENTENCE_END = re.compile(r"[.!?]+[\"'\u201d\u2019)\]]*(?=\s)")


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
    return lo


def cut_completion(tokenizer, ids: list[int], eos_ids: set[int], n: int | None) -> list[int]:
    """A completion (token ids, its EOS included if it has one) cut by the rule: unchanged when it ends (EOS)
    before its ``n``-th sentence does."""
    stop = next((i for i, t in enumerate(ids) if t in eos_ids), len(ids))
    cut = sentence_cut(tokenizer, ids[:stop], n)
    return ids[:cut] if cut < stop else ids
