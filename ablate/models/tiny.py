"""A random-initialised small Llama with SmolLM2's tokenizer, for tests and smoke runs.

Every dimension is a multiple of 32 (bitsandbytes' 4-bit CPU kernel needs it). Built from a seed,
saved once in the cache keyed by its config and the tokenizer, so every load gives the same weights.
"""

from __future__ import annotations

from pathlib import Path

from ablate.cache import CacheEntry
from ablate.models import smollm2


def tiny_config(hidden_size: int, num_layers: int, num_heads: int, intermediate_size: int, vocab_size: int) -> dict:
    return dict(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
    )


def model_dir(
    cache_root: Path, *, hidden_size: int, num_layers: int, num_heads: int, intermediate_size: int, init_seed: int
) -> Path:
    tok_dir = smollm2.tokenizer_dir(cache_root)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tok_dir)
    cfg = tiny_config(hidden_size, num_layers, num_heads, intermediate_size, len(tokenizer))
    entry = CacheEntry(
        cache_root, "models/tiny", {"config": cfg, "seed": init_seed, "tokenizer_entry": tok_dir.name, "format": 1}
    )
    if not entry.valid():
        import torch
        from transformers import LlamaConfig, LlamaForCausalLM

        with entry.build() as tmp:
            torch.manual_seed(init_seed)
            config = LlamaConfig(
                **cfg,
                bos_token_id=tokenizer.bos_token_id,
                eos_token_id=tokenizer.eos_token_id,
                pad_token_id=tokenizer.pad_token_id,
            )
            model = LlamaForCausalLM(config)
            model.save_pretrained(tmp, safe_serialization=True)
            tokenizer.save_pretrained(tmp)
    return entry.path
