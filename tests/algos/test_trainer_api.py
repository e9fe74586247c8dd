"""What resume and KL control read from every trainer: ``kl_coef``, ``resume_state()`` and ``restore(saved)``."""

from __future__ import annotations

import pytest
import torch

from ablate.models.loading import load_model
from ablate.refs.full import FullRefConfig, FullReference
from ablate.refs.none import NoneRefConfig, NoReference
from ablate.tasks.pairs import Pair
from ablate.tasks.reward import GoldReward
from tests.conftest import typed_config

CPU = torch.device("cpu")
PROMPTS = ["Review the film Lucky Harbor.", "Continue: I watched it and"]


def _build(algo: str, tmp_path, tiny_source, tokenizer, reference):
    online = () if algo == "dpo" else ("algo.kl_control=adaptive",)
    cfg = typed_config(tmp_path, "model=tiny", f"algo={algo}", "algo.max_steps=1", *online)
    common = dict(policy=load_model(tiny_source, CPU), tokenizer=tokenizer, reference=reference, callbacks=[])
    if algo == "dpo":
        from ablate.algos.dpo import build_trainer

        pairs = [Pair(PROMPTS[0], "A wonderful film.", "A dull mess.", 0.8, -0.7)]
        return build_trainer(cfg, pairs=pairs, out_dir=tmp_path, device=CPU, **common)
    if algo == "grpo":
        from ablate.algos.grpo import build_trainer

        return build_trainer(cfg, prompts=PROMPTS, reward=GoldReward(), out_dir=tmp_path, device=CPU, **common)
    from ablate.algos.ppo import build_trainer

    return build_trainer(cfg, prompts=PROMPTS, reward=GoldReward(), device=CPU, **common)


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("algo", ["grpo", "ppo"])
def test_online_trainers_restore_the_kl_coefficient_and_its_controller(algo, tmp_path, tiny_source, tokenizer, ref_ctx):
    trainer = _build(algo, tmp_path, tiny_source, tokenizer, FullReference(FullRefConfig(), ref_ctx))
    assert trainer.kl_coef == trainer.beta > 0
    trainer.restore({"kl_coef": 0.0123, "trl_train_tokens": None})
    assert trainer.kl_coef == trainer.beta == trainer.kl_controller.value == 0.0123
    assert trainer.resume_state()["kl_coef"] == 0.0123


@pytest.mark.filterwarnings("ignore")
def test_dpo_restores_trl_token_counter_and_keeps_beta(tmp_path, tiny_source, tokenizer, ref_ctx):
    trainer = _build("dpo", tmp_path, tiny_source, tokenizer, NoReference(NoneRefConfig(), ref_ctx))
    assert trainer.resume_state() == {"kl_coef": trainer.beta, "trl_train_tokens": 0}
    trainer.restore({"kl_coef": 99.0, "trl_train_tokens": 1234})
    assert trainer.resume_state() == {"kl_coef": trainer.beta, "trl_train_tokens": 1234}
    assert trainer._total_train_tokens == 1234  # TRL's own counter, which its num_tokens log reads
