"""ref=offload on a GPU, where it is the regime users run (skipped without CUDA; run on a lent GPU machine, see
docs/regimes.md): the reference's weights stay in host memory between calls (the device holds none of them), and its
log-probs and next-token distribution are ref=full's on the same GPU bit for bit. ``ABLATE_TEST_TINY_DIR`` names a
tiny model folder (from a cache's ``models/tiny/``) to use instead of building one: a GPU machine without the
SmolLM2 wheel can run it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from ablate.refs.base import AUDIT, TRAINING, RefContext
from ablate.refs.full import FullRefConfig, FullReference
from ablate.refs.offload import OffloadRefConfig, OffloadReference
from tests.conftest import token_batch
from tests.refs.conftest import PROMPTS, RESPONSES
from tests.refs.test_quantized import left_padded

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.fixture
def source(request):
    from ablate.models.loading import ModelSource

    folder = os.environ.get("ABLATE_TEST_TINY_DIR")
    return ModelSource(Path(folder), "tiny:" + Path(folder).name) if folder else request.getfixturevalue("tiny_source")


@pytest.fixture
def cuda_ctx(source):
    from ablate.models.loading import load_model, load_tokenizer

    cuda = torch.device("cuda")
    return RefContext(
        model_dir=str(source.path), model_fingerprint=source.fingerprint, tokenizer=load_tokenizer(source),
        device=cuda, load_model=lambda **kw: load_model(source, cuda, **kw),
    )  # fmt: skip


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_offload_on_a_gpu_holds_no_weights_there_and_is_full_bit_for_bit(cuda_ctx, precision):
    tokenizer = cuda_ctx.tokenizer
    batch = token_batch(tokenizer, PROMPTS, RESPONSES)
    cuda = torch.device("cuda")
    rows = [batch.to(cuda), left_padded(batch, tokenizer.pad_token_id).to(cuda)]
    full = FullReference(FullRefConfig(), cuda_ctx)
    want = [(full.logprobs(r, p, precision), full.distribution(r)) for r in rows for p in (TRAINING, AUDIT)]
    del full
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    before = torch.cuda.memory_allocated()
    offloaded = OffloadReference(OffloadRefConfig(offload="cpu"), cuda_ctx)
    torch.cuda.empty_cache()
    assert torch.cuda.memory_allocated() - before < 2**20  # the weights are in host memory, not on the GPU
    assert {p.device.type for p in offloaded.model.parameters()} == {"meta"}
    got = [(offloaded.logprobs(r, p, precision), offloaded.distribution(r)) for r in rows for p in (TRAINING, AUDIT)]
    for (g_lp, g_d), (w_lp, w_d) in zip(got, want):
        assert g_lp.device.type == "cuda" and torch.equal(g_lp, w_lp) and torch.equal(g_d, w_d)
    del got, g_lp, g_d  # the loop's names hold the last pair too
    torch.cuda.empty_cache()
    assert torch.cuda.memory_allocated() - before < 2**20  # and none left there after the calls
