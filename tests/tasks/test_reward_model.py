"""The learned (proxy) reward: TRL's RewardTrainer on gold-labelled pairs, cached content-addressed."""

from __future__ import annotations

import pytest
import torch

from ablate.config import RewardModelConfig
from ablate.models.loading import tokenizer_fingerprint
from ablate.tasks.pairs import Pair
from ablate.tasks.reward_model import train_or_load

PAIRS = [
    Pair("Review the film Lucky Harbor.", "A wonderful, joyful film.", "A dull and awful mess.", 0.8, -0.7),
    Pair("Continue: I watched it and", "loved every minute of it.", "hated the ending.", 0.6, -0.5),
    Pair("Write a review of Iron Summer.", "Great acting and a lovely score.", "Boring and bad.", 0.7, -0.3),
    Pair("Continue: the plot was", "clever and beautiful.", "a disaster.", 0.7, -0.6),
]


@pytest.mark.filterwarnings("ignore")
def test_reward_model_learns_the_preferences_and_is_cached(tmp_path, tiny_source, tokenizer):
    cfg = RewardModelConfig(epochs=4, learning_rate=1e-3, batch_size=4, seed=0)
    kw = dict(
        source=tiny_source,
        tokenizer=tokenizer,
        pairs=PAIRS,
        cfg=cfg,
        cache_root=tmp_path,
        device=torch.device("cpu"),
        precision="fp32",
        tokenizer_fingerprint=tokenizer_fingerprint(tokenizer),
    )
    rm = train_or_load(**kw)
    prompts = [p.prompt for p in PAIRS]
    chosen = rm([p.chosen for p in PAIRS], prompts)
    rejected = rm([p.rejected for p in PAIRS], prompts)
    assert sum(c > r for c, r in zip(chosen, rejected)) == len(PAIRS)  # it fits its training preferences
    assert rm.meta["n_pairs"] == 4 and rm.meta["final_loss"] is not None
    (entry,) = (tmp_path / "reward_models").iterdir()
    stamp = (entry / "stats.json").stat().st_mtime_ns
    again = train_or_load(**kw)  # a cache hit: no retraining, same scores
    assert (entry / "stats.json").stat().st_mtime_ns == stamp
    assert again([p.chosen for p in PAIRS], prompts) == pytest.approx(chosen, abs=1e-5)
    other = train_or_load(**{**kw, "cfg": RewardModelConfig(epochs=1, learning_rate=1e-3, batch_size=4)})
    assert len(list((tmp_path / "reward_models").iterdir())) == 2 and other is not None
