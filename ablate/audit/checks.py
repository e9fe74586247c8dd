"""Tokenizer checks of the audit, each failing in one line (:class:`~ablate.audit.data.AuditInputError`).

Before any model loads, on the model's folder: its tokenizer must have a chat template (prompts and pairs are
rendered with it, as DPO's tokenisation and the sampler render them), and must not hold more tokens than the model
has rows in its vocabulary (a tokenizer from another model). After a regime is built: a model it holds must have
the run model's vocabulary. Every regime today is built from the run's model and tokenizer, so the last check is a
guard for a regime that brings a model of its own.
"""

from __future__ import annotations

from ablate.audit.data import AuditInputError


def model_label(model_cfg) -> str:
    """How the audit names the model in a message: ``model=hf (<name_or_path>)``, ``model=smollm2``."""
    return f"model=hf ({model_cfg.name_or_path})" if model_cfg.name == "hf" else f"model={model_cfg.name}"


def config_vocab(config) -> int | None:
    """The vocabulary size a transformers config declares (its text model's, for a multimodal one)."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    return getattr(text, "vocab_size", None)


def check_model_tokenizer(tokenizer, model_dir, model_cfg) -> None:
    """The model folder's tokenizer can render the audit's data and every id it makes is one the model has.
    Reads the folder's config.json only (no weights)."""
    from transformers import AutoConfig

    what = model_label(model_cfg)
    if not getattr(tokenizer, "chat_template", None):
        raise AuditInputError(
            f"{what}: its tokenizer has no chat template, and the audit renders prompts and pairs with it (as DPO "
            f"and the sampler do): use a chat (instruct) model, or add a chat_template to its tokenizer_config.json"
        )
    vocab = config_vocab(AutoConfig.from_pretrained(model_dir))
    if vocab is not None and len(tokenizer) > vocab:
        raise AuditInputError(
            f"{what}: its tokenizer has {len(tokenizer)} tokens but the model's vocabulary only {vocab} "
            f"(config.json vocab_size): the tokenizer and the weights come from different models"
        )


def check_regime_vocab(reference, vocab: int | None) -> None:
    """A model the regime holds scores the run's tokens: its vocabulary is the run model's ``vocab``."""
    model = getattr(reference, "model", None)
    own = config_vocab(model.config) if model is not None and hasattr(model, "config") else None
    if vocab is not None and own is not None and own != vocab:
        raise AuditInputError(
            f"ref={reference.name}: its model has a vocabulary of {own} tokens but the run's model {vocab}: "
            f"the regime would score other tokens than the model's tokenizer makes"
        )
