"""Model judges (ablate.tasks.judges): the reward model's logit in its chat template, the same in any batch, kept by
content; the safety classifier's probability of its label on the response alone."""

from __future__ import annotations

import pytest
import torch

from ablate.config import ClassifierSafetyConfig, RewardModelJudgeConfig
from ablate.tasks.judges import ClassifierSafety, RewardModelJudge
from tests.judges import save_classifier, score

PROMPTS = ["Review a film.", "Review a much longer and wordier film title, please.", "Hi."]
TEXTS = ["A delight.", "It was, on the whole, rather long and somewhat dull.", ""]


@pytest.fixture(scope="module")
def reward_model(tmp_path_factory):
    return save_classifier(tmp_path_factory.mktemp("judge") / "rm")


def test_the_reward_is_the_logit_in_any_batch(reward_model, cache_root):
    want = score(reward_model, PROMPTS, TEXTS)  # one at a time, no padding
    for rows in (1, 2, None):
        judge = RewardModelJudge(
            RewardModelJudgeConfig(path=str(reward_model), batch_size=rows), device=torch.device("cpu"), cache_root=None
        )
        assert judge(TEXTS, PROMPTS) == pytest.approx(want, abs=1e-5)


def test_scores_are_kept_by_content(reward_model, cache_root):
    cfg = RewardModelJudgeConfig(path=str(reward_model))
    first = RewardModelJudge(cfg, device=torch.device("cpu"), cache_root=cache_root)
    scores = first(TEXTS, PROMPTS)
    again = RewardModelJudge(cfg, device=torch.device("cpu"), cache_root=cache_root)
    assert all(again.store.key(p, t) in again.store.memo for p, t in zip(PROMPTS, TEXTS))
    again.model._load = None  # a fresh judge over scored responses computes nothing: it would fail here
    assert again(TEXTS, PROMPTS) == scores
    assert again.ID == first.ID and again.ID.startswith("reward-model:")
    with pytest.raises(ValueError, match="pass each response's prompt"):
        first(TEXTS)


def test_the_safety_classifier_reads_the_response_alone(tmp_path):
    folder = save_classifier(tmp_path / "safety", labels=["ok", "toxic"], seed=3)
    judge = ClassifierSafety(ClassifierSafetyConfig(path=str(folder)), 0.5, device=torch.device("cpu"), cache_root=None)
    probs = judge.probs(TEXTS)
    assert probs[2] == 0.0  # an empty response is safe
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tok, model = AutoTokenizer.from_pretrained(folder), AutoModelForSequenceClassification.from_pretrained(folder)
    with torch.no_grad():
        want = [float(torch.softmax(model(**tok(t, return_tensors="pt")).logits[0], -1)[1]) for t in TEXTS[:2]]
    assert probs[:2] == pytest.approx(want, abs=1e-5)
    assert judge.unsafe(TEXTS) == [p >= 0.5 for p in probs]
