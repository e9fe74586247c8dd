"""A PEFT adapter folder given as the SFT model (``model=hf model.name_or_path=<adapter folder>``): the SFT model is
the base model with the adapter merged in, so that the policy, ``ref=full``, ``ref=shared`` (whose adapter is the
run's own trainable one) and every other regime are built from base + SFT adapter, never from the base alone (the
known QLoRA trap: a DPO reference that was the base model).

Merged once in fp32 and cached, keyed by the base's and the adapter's content.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from ablate.cache import CacheEntry
from ablate.errors import ConfigError

log = logging.getLogger(__name__)

ADAPTER_CONFIG = "adapter_config.json"
_FORMAT = 1


def is_adapter(folder: Path) -> bool:
    return (folder / ADAPTER_CONFIG).is_file() and not (folder / "config.json").is_file()


def base_of(folder: Path) -> str:
    """The base model an adapter folder names (``base_model_name_or_path``); one line when it names none."""
    try:
        base = json.loads((folder / ADAPTER_CONFIG).read_text()).get("base_model_name_or_path")
    except (OSError, json.JSONDecodeError) as e:
        raise ConfigError(f"{folder}/{ADAPTER_CONFIG} cannot be read ({e})") from None
    if not base:
        raise ConfigError(f"{folder}/{ADAPTER_CONFIG} names no base model (base_model_name_or_path)")
    return base


def merged_dir(
    adapter: Path, base_path: Path, base_fingerprint: str, adapter_fingerprint: str, cache_root: Path
) -> Path:
    """The base + adapter model folder (fp32, adapter merged; the adapter's tokenizer when it has one, else the
    base's), built once."""
    entry = CacheEntry(
        cache_root, "models/merged", {"base": base_fingerprint, "adapter": adapter_fingerprint, "format": _FORMAT}
    )
    if not entry.valid():
        import torch
        from peft import PeftModel
        from transformers import AutoModelForCausalLM, AutoTokenizer

        log.info("merging the SFT adapter %s into its base %s (once, cached)", adapter, base_path)
        with entry.build() as tmp:
            base = AutoModelForCausalLM.from_pretrained(base_path, dtype=torch.float32)
            merged = PeftModel.from_pretrained(base, adapter).merge_and_unload()
            merged.save_pretrained(tmp, safe_serialization=True)
            has_tokenizer = any((adapter / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json"))
            AutoTokenizer.from_pretrained(adapter if has_tokenizer else base_path).save_pretrained(tmp)
    return entry.path
