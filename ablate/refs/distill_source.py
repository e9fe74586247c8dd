"""``ref=distilled ref.path=<folder or hub id>``: an existing smaller model as the reference.

The model must score the policy's token ids: its tokenizer must give every token the SFT model's id and have the
same special tokens, and its vocabulary (embedding rows) must be the SFT model's size. Both are checked from the
folder's tokenizer and config.json alone, before any weights load, and refused in one line. (The chat template
and the merges are not compared: the reference never tokenises, it scores the ids the policy's tokenizer made.)
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from ablate.config import require
from ablate.errors import ConfigError


def check_path(value: str | None) -> None:
    """Preflight (no model loads): a local ``ref.path`` must be a transformers model folder. A hub id is
    resolved when the reference is built (where a GPU box downloads it)."""
    from ablate.models.loading import is_path_like

    if value is None or not is_path_like(str(value)):
        return
    path = Path(str(value)).expanduser()
    require(path.is_dir(), f"ref.path={value}: no such folder; pass a model folder (with config.json) or a hub id")
    require(
        (path / "config.json").is_file(),
        f"ref.path={value} has no config.json; pass a transformers model folder (as save_pretrained writes it)",
    )


def path_source(value: str, cache_root):
    """The :class:`~ablate.models.loading.ModelSource` of ``ref.path`` (a local folder, fingerprinted by its
    bytes; or a hub id, downloaded or read from the Hugging Face cache, fingerprinted by its commit)."""
    from ablate.models.loading import resolve_source

    return resolve_source(SimpleNamespace(name="hf", name_or_path=str(value)), Path(cache_root))


def tokenizer_mismatch(ours, theirs) -> str | None:
    """Why ``theirs`` would not give ``ours``'s token ids their meaning (None when it would): the vocabulary
    (tokens and their ids, added tokens included) and the special tokens."""
    a, b = ours.get_vocab(), theirs.get_vocab()
    if len(a) != len(b):
        return f"{len(b)} tokens, the SFT model's {len(a)}"
    moved = sorted(t for t in a.keys() | b.keys() if a.get(t) != b.get(t))
    if moved:
        t = moved[0]
        return f"{len(moved)} tokens differ, e.g. {t!r}: id {b.get(t)} there, {a.get(t)} in the SFT model's"
    sa, sb = ours.special_tokens_map, theirs.special_tokens_map
    for name in sorted(sa.keys() | sb.keys()):
        if sa.get(name) != sb.get(name):
            return f"{name} is {sb.get(name)!r} there, {sa.get(name)!r} in the SFT model's"
    return None


def _vocab_rows(model_dir) -> int | None:
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model_dir)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    return getattr(text, "vocab_size", None)


def check_compatible(value: str, source, tokenizer, model_dir) -> None:
    """Refuse (ConfigError, one line) a ``ref.path`` model that would score other tokens than the SFT model's
    ``tokenizer`` makes (see the module docstring). Reads tokenizer files and config.json only."""
    from ablate.models.loading import load_tokenizer

    why = tokenizer_mismatch(tokenizer, load_tokenizer(source))
    if why:
        raise ConfigError(
            f"ref.path={value}: its tokenizer is not the SFT model's ({why}); the reference must score the "
            f"policy's token ids: use a model of the same family"
        )
    own, run = _vocab_rows(source.path), _vocab_rows(model_dir)
    if own is not None and run is not None and own != run:
        raise ConfigError(
            f"ref.path={value}: its vocabulary has {own} rows, the SFT model's {run}: the two score different "
            f"token sets; use a model of the same family"
        )
