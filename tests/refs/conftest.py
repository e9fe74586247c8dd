"""Fixtures the regime tests share: a small scored batch and the full reference over the tiny model, and the 4-layer
tiny teacher of the distillation tests."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import token_batch

PROMPTS = ["Review the film:", "Continue: I watched it and", "Write a review of Iron Summer."]
RESPONSES = ["It was a wonderful, moving story.", "regretted every minute", "Great acting, lovely score."]


@pytest.fixture
def batch(tokenizer):
    return token_batch(tokenizer, PROMPTS, RESPONSES)


@pytest.fixture
def full(ref_ctx):
    from ablate.refs.full import FullRefConfig, FullReference

    return FullReference(FullRefConfig(), ref_ctx)


@pytest.fixture(scope="module")
def one_thread():
    """The tiny model's matmuls gain nothing from threads, and on a busy shared machine they lose a lot."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def source4(cache_root):
    """A 4-layer tiny SFT model, so a student can take a real subset of layers."""
    from ablate.config import TinyModelConfig
    from ablate.models.loading import resolve_source

    return resolve_source(TinyModelConfig(name="tiny", num_layers=4), cache_root)


def counting_context(source, tokenizer, loads: list, train_data, cache_root):
    """A RefContext over ``source`` whose model loads are appended to ``loads`` (so a test can count them)."""
    from ablate.models.loading import load_model
    from ablate.refs.base import RefContext

    def counting_load(**kw):
        loads.append(kw)
        return load_model(source, torch.device("cpu"), **kw)

    return RefContext(
        model_dir=str(source.path),
        model_fingerprint=source.fingerprint,
        tokenizer=tokenizer,
        device=torch.device("cpu"),
        load_model=counting_load,
        train_data=train_data,
        cache_root=str(cache_root),
    )


@pytest.fixture(scope="module")
def tok(source4):
    from ablate.models.loading import load_tokenizer

    return load_tokenizer(source4)
