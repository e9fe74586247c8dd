"""What a sampled batch records about each response: where it ends, and whether max_new_tokens cut it off."""

from __future__ import annotations

import torch

from ablate.models.sampling import _assemble


def test_a_response_without_an_eos_is_truncated_and_one_with_it_is_not(tokenizer):
    eos, pad, word = tokenizer.eos_token_id, tokenizer.pad_token_id, 5
    enc = {"input_ids": torch.tensor([[word, word], [word, word], [word, word]]), "attention_mask": torch.ones(3, 2)}
    responses = torch.tensor(
        [
            [word, word, word],  # cut off: no EOS in max_new_tokens = 3
            [word, eos, pad],  # ended early
            [word, word, eos],  # ended exactly at the cap: not truncated
        ]
    )
    sb = _assemble(["a", "b", "c"], enc, torch.cat([enc["input_ids"], responses], dim=1), tokenizer, None)
    assert sb.truncated == [True, False, False]
    assert sb.lengths == [3, 2, 3]
    assert [len(c.truncated) for c in sb.chunks(2)] == [2, 1]
