"""The guard against the wrong reference: at step 0 the policy *is* the SFT model, so the full reference (the run's
frozen SFT copy, the judge of truth) must give exactly its log-probs, in fp32, on the first training batch. A
reference loaded from another checkpoint than the policy (the base model instead of base + SFT adapter, a stale
folder) stops the run in one line before the first step, instead of training against the wrong anchor."""

from __future__ import annotations

import torch

from ablate.errors import AblateError


class ReferenceMismatch(AblateError):
    """The full reference is not the model the policy starts from."""


def first_batch(tokenizer, *, pairs, prompts: list[str], rows: int, max_length: int | None):
    """The token ids of the first training batch: DPO's first pairs (as DPO collates them), else the first
    prompts in the chat template."""
    from ablate.models.sampling import chat_prompt_texts
    from ablate.tasks.pair_tokens import pair_batches

    if pairs:
        b = pair_batches(tokenizer, pairs[:rows], rows, max_length)[0]
        return b.input_ids, b.attention_mask
    enc = tokenizer(
        chat_prompt_texts(tokenizer, prompts[:rows]), return_tensors="pt", padding=True, add_special_tokens=False
    )
    return enc["input_ids"], enc["attention_mask"]


@torch.no_grad()
def _logprobs(model, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    was = model.training
    model.eval()
    try:
        logits = model(input_ids=ids, attention_mask=mask).logits.float()
    finally:
        model.train(was)
    return torch.log_softmax(logits, -1)[mask.bool()]


def check_reference(policy, reference, ids: torch.Tensor, mask: torch.Tensor) -> float:
    """Raise ReferenceMismatch (one line) unless ``reference``'s fp32 log-probs equal ``policy``'s exactly on the
    batch; returns the largest difference (0.0)."""
    device = next(policy.parameters()).device
    ids, mask = ids.to(device), mask.to(device)
    a, b = _logprobs(policy, ids, mask), _logprobs(reference, ids, mask)
    gap = float((a - b).abs().max()) if a.shape == b.shape else float("inf")
    if gap != 0.0:
        raise ReferenceMismatch(
            f"the full reference is not the SFT model the policy starts from: at step 0 their fp32 log-probs differ "
            f"on the first batch by up to {gap:.3g} nats (the same model gives exactly 0): the reference was loaded "
            "from another checkpoint than the policy"
        )
    return gap
