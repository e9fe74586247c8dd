"""ref=placebo: full's reference with the training data in another order, the null control that can fail."""

from __future__ import annotations

import json

import pytest
import torch

from ablate.algos.trl_common import common_args
from ablate.errors import ConfigError
from ablate.refs.base import data_seed, regime_class, regime_names
from ablate.refs.full import FullReference
from tests.conftest import TINY_FAST, run_sweep, typed_config


def test_only_the_data_order_seed_moves(tmp_path):
    placebo = typed_config(tmp_path, "model=tiny", "ref=placebo", "seed=3")
    full = typed_config(tmp_path, "model=tiny", "ref=full", "seed=3")
    assert data_seed(placebo) == 4 and data_seed(full) == 3
    assert data_seed(typed_config(tmp_path, "model=tiny", "ref=placebo", "ref.data_seed_offset=7")) == 7
    args = common_args(placebo, tmp_path, torch.device("cpu"))
    assert (args["seed"], args["data_seed"]) == (3, 4)  # training's other randomness and evaluation: the seed's own
    assert issubclass(regime_class("placebo"), FullReference)
    assert "placebo" in regime_names("all") and "placebo" not in regime_names("sweep")


def test_an_offset_of_zero_is_refused_in_one_line(tmp_path):
    with pytest.raises(ConfigError, match="ref.data_seed_offset must not be 0"):
        typed_config(tmp_path, "model=tiny", "ref=placebo", "ref.data_seed_offset=0")


@pytest.mark.slow
def test_a_placebo_run_trains_otherwise_and_evaluates_the_same_prompts(tmp_path):
    """DPO on the tiny model: the same pairs in another order give another first gradient;
    the evaluation prompts are full's, in full's order. One sweep, `full` on both sides of the placebo: whatever
    differs between jobs of one process other than the pairs' order would show as a difference between the two."""
    res, folders = run_sweep(*TINY_FAST, "threads=1", "ref=full,placebo,full", "seed=0", sweep=tmp_path / "sweep")
    assert res.returncode == 0 and len(folders) == 3, res.stderr[-2000:]
    out = []
    for folder in folders:
        rows = [json.loads(x) for x in (folder / "samples.jsonl").read_text().splitlines()]
        metrics = [json.loads(x) for x in (folder / "metrics.jsonl").read_text().splitlines()]
        out.append(([r["prompt"] for r in rows], [r["policy_response"] for r in rows], metrics))
    full, placebo, full_again = out
    assert full[0] == placebo[0] and full[:2] == full_again[:2]
    # the first step: policy = reference, so the loss is log 2 either way; its batch shows in the gradient
    first = [next(m["train/grad_norm"] for m in run[2] if "train/grad_norm" in m) for run in out]
    assert first[0] == first[2] != first[1]


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("algo", ["grpo", "ppo"])
def test_grpo_and_ppo_draw_their_prompts_in_the_placebos_order(tmp_path, algo, tiny_source, tokenizer, ref_ctx):
    """The prompts' training order follows ``data_seed``: TRL's GRPO sampler seeds itself with ``seed``, so until
    ``replayable_epochs`` took ``data_seed`` a GRPO placebo trained in full's very order (its SmolLM2 runs equalled
    full's to the last digit). The first epoch's order of 12 prompts, full against placebo at seed 0."""
    from ablate.algos.registry import algorithm
    from ablate.models.loading import load_model
    from ablate.tasks.reward import GoldReward

    prompts = [f"Continue: review {i} of the film said" for i in range(12)]

    def order(ref: str) -> list[str]:
        cfg = typed_config(
            tmp_path / ref,
            "model=tiny",
            f"algo={algo}",
            f"ref={ref}",
            "seed=0",
            "algo.batch_size=4",
            *(["algo.num_generations=2"] if algo == "grpo" else ["algo.minibatch_size=4"]),
        )
        trainer = algorithm(algo).build(
            cfg,
            policy=load_model(tiny_source, torch.device("cpu")),
            tokenizer=tokenizer,
            prompts=prompts,
            reward=GoldReward(),
            reference=FullReference(cfg.ref, ref_ctx),
            callbacks=[],
            out_dir=tmp_path / ref,
            device=torch.device("cpu"),
        )
        if algo == "ppo":
            return [p for step in (1, 2, 3) for p in trainer._prompts_for(step)]
        sampler = trainer._get_train_sampler()
        sampler.set_epoch(0)
        return [prompts[i] for i in list(sampler)[:: cfg.algo.num_generations]][:12]

    full, placebo = order("full"), order("placebo")
    assert sorted(full) == sorted(placebo) == sorted(prompts)  # the same prompts, each once an epoch
    assert full != placebo
