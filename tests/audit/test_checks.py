"""Tokenizer checks of the audit (ablate.audit.checks): a model folder whose tokenizer cannot serve the audit, and a
regime whose model has another vocabulary, are one line; the first two before any model loads."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from ablate.audit.checks import check_regime_vocab
from ablate.audit.cli import main
from ablate.audit.data import AuditInputError
from tests.audit.test_data import no_model  # noqa: F401  (fixture)


def _hf_copy(src, dst, drop=(), vocab_size=None):
    """A model=hf folder copied from the tiny model (weights linked), less the files in ``drop``, with
    config.json's vocab_size replaced when given."""
    dst.mkdir()
    for f in src.iterdir():
        if f.name in drop or f.name == "meta.json":
            continue
        if f.suffix == ".safetensors":
            (dst / f.name).symlink_to(f)
        else:
            shutil.copy(f, dst / f.name)
    if vocab_size is not None:
        cfg = json.loads((dst / "config.json").read_text())
        (dst / "config.json").write_text(json.dumps({**cfg, "vocab_size": vocab_size}))
    return dst


def _audit_hf(folder, out) -> int:
    return main(["ref=full", "model=hf", f"model.name_or_path={folder}", "--out", str(out)])


def test_a_tokenizer_without_chat_template_is_one_line(tiny_source, tmp_path, capsys, no_model):  # noqa: F811
    folder = _hf_copy(tiny_source.path, tmp_path / "m", drop=("chat_template.jinja",))
    rc = _audit_hf(folder, tmp_path / "o")
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "its tokenizer has no chat template" in err[0], err


def test_a_tokenizer_larger_than_the_models_vocabulary_is_one_line(tiny_source, tmp_path, capsys, no_model):  # noqa: F811
    folder = _hf_copy(tiny_source.path, tmp_path / "m", vocab_size=1024)
    rc = _audit_hf(folder, tmp_path / "o")
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    assert "its tokenizer has 49152 tokens but the model's vocabulary only 1024" in err[0]


def test_a_regime_whose_model_has_another_vocabulary_is_one_line(ref_ctx):
    import dataclasses

    from transformers import LlamaConfig, LlamaForCausalLM

    from ablate.refs.full import FullRefConfig, FullReference

    torch.manual_seed(0)
    other = LlamaForCausalLM(
        LlamaConfig(vocab_size=512, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2)
    )
    ref = FullReference(FullRefConfig(), dataclasses.replace(ref_ctx, load_model=lambda **kw: other))
    check_regime_vocab(FullReference(FullRefConfig(), ref_ctx), 49152)  # the run's own model passes
    with pytest.raises(AuditInputError, match=r"^ref=full: its model has a vocabulary of 512 tokens") as e:
        check_regime_vocab(ref, 49152)
    assert "\n" not in str(e.value)
