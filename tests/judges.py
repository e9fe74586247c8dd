"""Judge models the tests build: small classifiers over the tiny model's architecture and SmolLM2's tokenizer."""

from __future__ import annotations

import os
from pathlib import Path


def save_classifier(
    folder: Path, *, labels: list[str] | None = None, vocab_size: int | None = None, causal: bool = False, seed: int = 0
) -> Path:
    """A random-initialised Llama classifier saved with its tokenizer (one output unless ``labels``); ``causal``:
    a language model instead (no classification head); ``vocab_size``: smaller than its tokenizer's."""
    import torch
    from transformers import AutoConfig, AutoTokenizer, LlamaForCausalLM, LlamaForSequenceClassification

    from ablate.config import TinyModelConfig
    from ablate.models.loading import resolve_source

    source = resolve_source(TinyModelConfig(), Path(os.environ["ABLATE_CACHE"])).path
    tok = AutoTokenizer.from_pretrained(source)
    config = AutoConfig.from_pretrained(source)
    config.pad_token_id = tok.pad_token_id
    if labels:
        config.num_labels = len(labels)
        config.id2label = dict(enumerate(labels))
        config.label2id = {name: i for i, name in enumerate(labels)}
    else:
        config.num_labels = 1
    if vocab_size:
        config.vocab_size = vocab_size
    torch.manual_seed(seed)
    model = (LlamaForCausalLM if causal else LlamaForSequenceClassification)(config)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def score(folder: Path, prompts: list[str], texts: list[str]) -> list[float]:
    """Each (prompt, response)'s logit, one at a time (no padding), in the classifier's chat template: the
    reward a ``judge=reward_model`` run must report."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForSequenceClassification.from_pretrained(folder, dtype=torch.float32).eval()
    out = []
    with torch.no_grad():
        for p, t in zip(prompts, texts):
            chat = [{"role": "user", "content": p}, {"role": "assistant", "content": t}]
            ids = tok(tok.apply_chat_template(chat, tokenize=False), return_tensors="pt", add_special_tokens=False)
            out.append(float(model(**ids).logits[0, 0]))
    return out
