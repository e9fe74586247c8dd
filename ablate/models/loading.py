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
from ablate.errors import ConfigError, MissingAsset
from ablate.models import adapter_source, smollm2, tiny

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
    check_device(device)
    if device == "cuda" and "LOCAL_RANK" in os.environ:
        return torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    return torch.device(device)


def check_device(device: str) -> None:
    """Raise ConfigError (one line) unless ``model.device`` names a device this machine has."""
    if not device.startswith("cuda"):
        return
    if not torch.cuda.is_available():
        build = "a CPU-only build of torch" if torch.version.cuda is None else "no GPU is visible"
        raise ConfigError(
            f"model.device={device} but no CUDA device is available ({build}); use model.device=cpu or auto"
        )
    index = device.partition(":")[2]
    count = torch.cuda.device_count()
    if index and int(index) >= count:
        raise ConfigError(
            f"model.device={device} but this machine has {count} CUDA device(s): use cuda:0..cuda:{count - 1}, or cuda"
        )


def resolve_source(model_cfg, cache_root: Path) -> ModelSource:
    """The local folder for ``model=smollm2|tiny|hf``, converting or building it once if needed."""
    if model_cfg.name == "smollm2":
        path = smollm2.model_dir(cache_root)
        return ModelSource(path, "smollm2:" + path.name)
    if model_cfg.name == "tiny":
        path = tiny.model_dir(
            cache_root,
            hidden_size=model_cfg.hidden_size,
            num_layers=model_cfg.num_layers,
            num_heads=model_cfg.num_heads,
            intermediate_size=model_cfg.intermediate_size,
            init_seed=model_cfg.init_seed,
        )
        return ModelSource(path, "tiny:" + path.name)
    if model_cfg.name == "hf":
        source = _hf_source(str(model_cfg.name_or_path), cache_root)
        if adapter_source.is_adapter(source.path):  # an SFT adapter: the SFT model is its base with it merged
            base = _hf_source(adapter_source.base_of(source.path), cache_root)
            path = adapter_source.merged_dir(source.path, base.path, base.fingerprint, source.fingerprint, cache_root)
            return ModelSource(path, f"adapter:{source.fingerprint}+{base.fingerprint}")
        return source
    raise ConfigError(f"unknown model {model_cfg.name!r} (choose from: smollm2, tiny, hf)")


def _hf_source(name_or_path: str, cache_root: Path) -> ModelSource:
    local = Path(name_or_path).expanduser()
    if local.is_dir():
        return ModelSource(local, "local:" + folder_fingerprint(local, cache_root))
    from huggingface_hub import snapshot_download

    path = Path(snapshot_download(name_or_path))
    return ModelSource(path, f"hub:{name_or_path}@{path.name}")  # snapshot folder = commit hash


HUB_TIMEOUT_S = 5.0  # the one hub look-up preflight makes, only for a hub id that is not cached
_TRUE = {"1", "on", "yes", "true"}


def check_source(model_cfg) -> None:
    """Raise an AblateError (one line) when ``model=hf``'s ``name_or_path`` cannot be loaded here, before
    anything loads: a path must be a model folder; a hub id must be in the local Hugging Face cache, or on a
    hub that answers (asked only when the id is not cached, with a short timeout)."""
    if model_cfg.name != "hf":
        return
    value = str(model_cfg.name_or_path)
    if is_path_like(value):
        _check_folder(Path(value).expanduser(), value)
    else:
        _check_hub_id(value)


def is_path_like(value: str) -> bool:
    """Whether ``name_or_path`` means a local path (as :func:`resolve_source` reads it) rather than a hub id."""
    return value.startswith(("/", "./", "../", "~")) or value in (".", "..") or Path(value).expanduser().exists()


def _check_folder(path: Path, value: str) -> None:
    """A local ``name_or_path`` must be a transformers model folder (``from_pretrained`` reads config.json)."""
    if not path.exists():
        raise ConfigError(
            f"model.name_or_path={value}: no such folder; pass a model folder (with config.json) "
            f"or a hub id such as HuggingFaceTB/SmolLM2-360M-Instruct"
        )
    if not path.is_dir():
        raise ConfigError(
            f"model.name_or_path={value} is a file; model=hf takes a model folder holding "
            f"config.json and the weights (a GGUF file is not loaded by model=hf)"
        )
    if adapter_source.is_adapter(path):  # a PEFT adapter: its base must load too
        base = adapter_source.base_of(path)
        if is_path_like(base):
            _check_folder(Path(base).expanduser(), base)
        else:
            _check_hub_id(base)
        return
    if not (path / "config.json").is_file():
        raise ConfigError(
            f"model.name_or_path={value} has no config.json; pass a transformers model folder "
            f"(as save_pretrained writes it), a PEFT adapter folder (adapter_config.json) or a hub id"
        )


def _check_hub_id(repo_id: str) -> None:
    """A hub id must be cached (no network needed), or downloadable now."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HFValidationError, IncompleteSnapshotError, LocalEntryNotFoundError

    try:
        folder = Path(snapshot_download(repo_id, local_files_only=True))
    except HFValidationError:
        raise ConfigError(
            f"model.name_or_path={repo_id!r} is neither an existing folder nor a hub id (org/name)"
        ) from None
    except IncompleteSnapshotError:
        raise MissingAsset(
            f"the cached snapshot of {repo_id} is incomplete (an interrupted download?); complete "
            f"it with `hf download {repo_id}` on a machine with network"
        ) from None
    except LocalEntryNotFoundError:
        _check_uncached_hub_id(repo_id)
        return
    if not (folder / "config.json").is_file():
        raise MissingAsset(
            f"the cached snapshot of {repo_id} ({folder}) has no config.json; download it again "
            f"with `hf download {repo_id}`, or pass a local folder"
        )


def hub_offline() -> bool:
    """HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE) is set, now or when huggingface_hub was imported."""
    from huggingface_hub import constants

    env = (os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or "").strip().lower()
    return env in _TRUE or bool(constants.HF_HUB_OFFLINE)


def _check_uncached_hub_id(repo_id: str) -> None:
    """An id that is not cached loads only if the hub is reachable and has it."""
    from huggingface_hub import constants

    not_cached = f"model.name_or_path={repo_id} is not in the local Hugging Face cache ({constants.HF_HUB_CACHE})"
    todo = (
        f"download it first with `hf download {repo_id}` on a machine with network (into this cache), "
        f"or pass a local folder"
    )
    if hub_offline():
        raise MissingAsset(f"{not_cached} and HF_HUB_OFFLINE is set: {todo}")
    problem = _hub_lookup(repo_id)
    if problem == "missing":
        raise ConfigError(
            f"model.name_or_path={repo_id}: the hub has no such model (a private or gated one needs "
            f"`hf auth login`); check the id, or pass a local folder"
        )
    if problem:
        raise MissingAsset(f"{not_cached} and the hub cannot be reached ({problem}): {todo}")


def _hub_lookup(repo_id: str) -> str | None:
    """None when the hub has ``repo_id``; "missing" when it answers that it has not; else why it could not be
    asked. Bounded by HUB_TIMEOUT_S even where name resolution hangs (the look-up runs in a daemon thread)."""
    import threading

    from huggingface_hub import HfApi, constants
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

    outcome: dict[str, BaseException | None] = {}

    def ask() -> None:
        try:
            HfApi().model_info(repo_id, timeout=HUB_TIMEOUT_S)
            outcome["error"] = None
        except BaseException as e:  # noqa: BLE001  (any failure is reported, none is raised here)
            outcome["error"] = e

    thread = threading.Thread(target=ask, name="ablate-hub-lookup", daemon=True)
    thread.start()
    thread.join(HUB_TIMEOUT_S + 1)
    if "error" not in outcome:
        return f"no answer from {constants.ENDPOINT} within {HUB_TIMEOUT_S:.0f} s"
    error = outcome["error"]
    if error is None:
        return None
    if isinstance(error, (RepositoryNotFoundError, GatedRepoError)):
        return "missing"
    return f"{constants.ENDPOINT}: {type(error).__name__}"


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
    """Hash of everything in the tokenizer that changes token ids: vocab, merges, special tokens, template. Not
    the padding and truncation settings transformers leaves on the backend tokenizer after a call (they change no
    token id): a tokenizer that has padded a batch hashes as the freshly loaded one does."""
    h = hashlib.sha256()
    if hasattr(tokenizer, "backend_tokenizer"):
        state = json.loads(tokenizer.backend_tokenizer.to_str())
        state.pop("padding", None)
        state.pop("truncation", None)
        h.update(json.dumps(state, sort_keys=True).encode())
    else:
        h.update(json.dumps(tokenizer.get_vocab(), sort_keys=True).encode())
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

    lora = LoraConfig(
        r=adapter_cfg.r,
        lora_alpha=adapter_cfg.alpha,
        lora_dropout=adapter_cfg.dropout,
        target_modules=list(adapter_cfg.target_modules),
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, lora)
