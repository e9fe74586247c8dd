"""The task's stop rule (ablate.stop_rule): a response ends after its n-th sentence, and only cuts."""

from __future__ import annotations

import torch

from ablate.models.sampling import _assemble
from ablate.stop_rule import cut_completion, sentence_cut, settled


def _ids(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def _kept(tokenizer, text: str, n: int | None) -> str:
    ids = _ids(tokenizer, text)
    return tokenizer.decode(ids[: sentence_cut(tokenizer, ids, n)])


def test_a_response_ends_after_its_nth_sentence(tokenizer):
    text = "Great film. Loved it! Was it good? Yes"
    assert _kept(tokenizer, text, 1) == "Great film."
    assert _kept(tokenizer, text, 2) == "Great film. Loved it!"
    assert _kept(tokenizer, text, 3) == "Great film. Loved it! Was it good?"
    assert _kept(tokenizer, text, 4) == text  # fewer sentences than asked: all of it
    assert _kept(tokenizer, text, None) == text


def test_a_terminator_needs_whitespace_after_it_and_keeps_its_closing_quote(tokenizer):
    assert _kept(tokenizer, "It earns 3.5 stars from me", 1) == "It earns 3.5 stars from me"
    assert _kept(tokenizer, "It ends here.", 1) == "It ends here."  # last terminator, nothing after: uncut
    assert _kept(tokenizer, 'He said "wow." Then left.', 1) == 'He said "wow."'
    assert _kept(tokenizer, "Wait... what? No", 1) == "Wait..."


def test_a_completion_that_ends_first_keeps_its_eos_and_a_cut_one_has_none(tokenizer):
    eos = tokenizer.eos_token_id
    short = _ids(tokenizer, "Fine.") + [eos]
    assert cut_completion(tokenizer, short, {eos}, 1) == short
    long = _ids(tokenizer, "Fine. Then more text") + [eos]
    assert cut_completion(tokenizer, long, {eos}, 1) == _ids(tokenizer, "Fine.")
    assert cut_completion(tokenizer, long, {eos}, None) == long
    for ending in ("Fine.\n", "Fine. "):  # the model ended its answer itself, after whitespace: its EOS stays
        whole = _ids(tokenizer, ending) + [eos]
        assert cut_completion(tokenizer, whole, {eos}, 1) == whole


def _byte_ids(tokenizer, text: str) -> list[int]:
    """``text`` as one token per UTF-8 byte: byte-level BPE's base tokens (GPT-2's byte-to-character map)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("\u00a1"), ord("\u00ac") + 1), *range(ord("\u00ae"), 256)]
    rest = [b for b in range(256) if b not in printable]
    char = {**{b: chr(b) for b in printable}, **{b: chr(256 + i) for i, b in enumerate(rest)}}
    return [tokenizer.convert_tokens_to_ids(char[b]) for b in text.encode()]


SETTLING = [
    "Great film. Loved it!",
    "Fine.\n",
    "Fine. ",
    "Fine.\n\nAnd then more",
    'He said "wow." Then left.',
    "Wait... what? No",
    "It costs \u20ac5. \u2603 Then more.",
    "Fine.\u00a0\u00a0",  # a whitespace of two bytes, which the tokenizer may split
    "Fine.\u3000x",
    "No sentence end at all",
]


def test_a_settled_response_is_cut_where_it_will_be_whatever_follows(tokenizer):
    """Where :func:`settled` lets a sampler stop, the cut it would have made is the cut of every longer response,
    EOS or not (the sampler stops computing rows on it); a response that may still end in EOS after whitespace is
    never settled."""
    eos = tokenizer.eos_token_id
    settled_at = 0
    for text in SETTLING:
        ids = _ids(tokenizer, text)
        for k in range(1, len(ids) + 1):
            if not settled(tokenizer, ids[:k], 1):
                continue
            settled_at += 1
            cut = cut_completion(tokenizer, ids[:k], {eos}, 1)
            for longer in (ids[:k], ids, ids + [eos], ids[:k] + [eos], ids[:k] + _ids(tokenizer, "\n") + [eos]):
                assert cut_completion(tokenizer, longer, {eos}, 1) == cut, (text, k)
    assert settled_at > 5
    split = _ids(tokenizer, "Fine.\n") + _byte_ids(tokenizer, "\u3000")  # a 3-byte whitespace, a token a byte
    assert cut_completion(tokenizer, split + [eos], {eos}, 1) == split + [eos]  # whitespace then EOS: kept whole
    assert not any(settled(tokenizer, split[:k], 1) for k in range(len(split) + 1))  # "\ufffd" may be whitespace
    for text in ("Fine.\n", "Fine. ", "Fine.\u00a0\u00a0", "No sentence end at all"):
        ids = _ids(tokenizer, text)
        assert not any(settled(tokenizer, ids[:k], 1) for k in range(len(ids) + 1)), text
    assert settled(tokenizer, _ids(tokenizer, "Fine. More"), 1) and not settled(
        tokenizer, _ids(tokenizer, "Fine. More"), None
    )


def test_the_sampler_masks_after_the_cut_and_a_cut_response_is_not_truncated(tokenizer):
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    first, rest = _ids(tokenizer, "Superb cast."), _ids(tokenizer, " A dull plot that drags")
    width = len(first) + len(rest)
    rows = [first + rest, first + [eos] + [pad] * (len(rest) - 1), _ids(tokenizer, " x") * width]
    prompt = torch.full((3, 2), 5)
    enc = {"input_ids": prompt, "attention_mask": torch.ones(3, 2, dtype=torch.long)}
    seqs = torch.cat([prompt, torch.tensor([r[:width] for r in rows])], dim=1)
    sb = _assemble(["a", "b", "c"], enc, seqs, tokenizer, max_sentences=1)
    assert sb.texts[0] == "Superb cast." and sb.lengths[0] == len(first) and sb.truncated[0] is False
    assert sb.lengths[1] == len(first) + 1 and sb.truncated[1] is False  # ended by its EOS, kept
    assert sb.truncated[2] is True and sb.lengths[2] == width  # no sentence end, no EOS: cut off by the cap
    assert sb.batch.completion_mask[0, 2 + len(first) :].sum() == 0
    unruled = _assemble(["a", "b", "c"], enc, seqs, tokenizer, max_sentences=None)
    assert unruled.truncated == [True, False, True] and unruled.lengths[0] == width


def test_the_stop_rule_is_part_of_the_pairs_cache_key():
    import dataclasses

    from ablate.tasks.pairs import PairSettings, pair_key

    s = PairSettings(samples_per_prompt=2, max_new_tokens=8, temperature=1.0, batch_size=4, seed=0, precision="fp32")
    keys = [
        pair_key(
            model_fingerprint="m",
            tokenizer_fingerprint="t",
            settings=dataclasses.replace(s, max_sentences=n),
            prompts=["p"],
            reward_id="r",
        )  # fmt: skip
        for n in (None, 1, 2)
    ]
    assert len({str(k) for k in keys}) == 3
