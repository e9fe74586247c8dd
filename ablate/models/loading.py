"""Resolve a model config to a local folder, and load policies and frozen copies from it."""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from ablate.cache import file_sha256
from ablate.errors import ConfigError
from ablate.models import smollm2, tiny

log = logging.getLogger(__name__)


@dataclass
class ModelSource:
    """A model folder and the fingerprint of the bytes in it (what caches built from it are keyed on)."""

    path: Path
    fingerprint: str


def resolve_device(device: str) -> torch.device:
    """``auto``: CUDA when there is one. A bare ``cuda`` under ``accelerate launch`` / torchrun means this
    process's GPU (``LOCAL_RANK``), where the Trainer puts the policy too."""
    import os

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"model.device={device} but no CUDA device is available; use model.device=cpu")
    if device == "cuda" and "LOCAL_RANK" in os.environ:
        return torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    return torch.device(device)


def resolve_source(model_cfg, cache_root: Path) -> ModelSource:
    """The local folder for ``model=smollm2|tiny|hf``, converting or building it once if needed."""
    if model_cfg.name == "smollm2":
        path = smollm2.model_dir(cache_root)
        return ModelSource(path, "smollm2:" + path.name)
    if model_cfg.name == "tiny":
        path = tiny.model_dir(cache_root, hidden_size=model_cfg.hidden_size, num_layers=model_cfg.num_layers,
                              num_heads=model_cfg.num_heads, intermediate_size=model_cfg.intermediate_size,
                              init_seed=model_cfg.init_seed)
        return ModelSource(path, "tiny:" + path.name)
    if model_cfg.name == "hf":
        local = Path(model_cfg.name_or_path).expanduser()
        if local.is_dir():
            return ModelSource(local, "local:" + folder_fingerprint(local, cache_root))
        from huggingface_hub import snapshot_download

        path = Path(snapshot_download(model_cfg.name_or_path))
        return ModelSource(path, f"hub:{model_cfg.name_or_path}@{path.name}")  # snapshot folder = commit hash
    raise ConfigError(f"unknown model {model_cfg.name!r} (choose from: smollm2, tiny, hf)")


def folder_fingerprint(folder: Path, cache_root: Path) -> str:
    """sha256 over the contents of a model folder's files; memoised by (path, size, mtime)."""
    files = sorted(p for p in folder.rglob("*") if p.is_file() and not p.name.startswith("."))
    stamp = [(str(p.relative_to(folder)), p.stat().st_size, p.stat().st_mtime_ns) for p in files]
    memo_path = cache_root / "fingerprints.json"
    memo = json.loads(memo_path.read_text()) if memo_path.is_file() else {}
    key = hashlib.sha256(json.dumps([str(folder.resolve()), stamp]).encode()).hexdigest()
    if key not in memo:
        h = hashlib.sha256()
        for p in files:
            h.update(str(p.relative_to(folder)).encode())
            h.update(file_sha256(p).encode())
        memo[key] = h.hexdigest()
        memo_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = memo_path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(memo))
        os.replace(tmp, memo_path)
    return memo[key]


def tokenizer_fingerprint(tokenizer) -> str:
    """Hash of everything in the tokenizer that changes token ids: vocab, merges, special tokens, template."""
    h = hashlib.sha256()
    h.update(tokenizer.backend_tokenizer.to_str().encode() if hasattr(tokenizer, "backend_tokenizer")
             else json.dumps(tokenizer.get_vocab(), sort_keys=True).encode())
    h.update(json.dumps(tokenizer.special_tokens_map, sort_keys=True, default=str).encode())
    h.update((tokenizer.chat_template or "").encode())
    h.update(str(tokenizer.padding_side).encode())
    return h.hexdigest()


def load_tokenizer(source: ModelSource):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(source.path)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"  # generation needs left padding; TRL requires it too
    return tok


def load_model(source: ModelSource, device: torch.device, dtype: torch.dtype = torch.float32, **kwargs):
    """A causal LM from the source folder, on ``device``. ``kwargs`` go to ``from_pretrained``
    (e.g. ``quantization_config``)."""
    from transformers import AutoModelForCausalLM

    if "quantization_config" in kwargs:
        kwargs.setdefault("device_map", {"": str(device)} if device.type == "cuda" else "cpu")
        model = AutoModelForCausalLM.from_pretrained(source.path, dtype=dtype, **kwargs)
    else:
        model = AutoModelForCausalLM.from_pretrained(source.path, dtype=dtype, **kwargs).to(device)
    return model


def add_adapter(model, adapter_cfg):
    """Wrap the policy in a fresh LoRA adapter (peft)."""
    from peft import LoraConfig, get_peft_model

    lora = LoraConfig(r=adapter_cfg.r, lora_alpha=adapter_cfg.alpha, lora_dropout=adapter_cfg.dropout,
                      target_modules=list(adapter_cfg.target_modules), task_type="CAUSAL_LM")
    return get_peft_model(model, lora)
