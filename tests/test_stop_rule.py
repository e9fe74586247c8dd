"""The task's stop rule (ablate.stop_rule): a response ends after its n-th sentence, and only cuts."""

from __future__ import annotations

import torch

from ablate.models.sampling import _assemble
from ablate.stop_rule import cut_completion, sentence_cut


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
