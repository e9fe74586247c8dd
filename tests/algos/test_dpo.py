"""DPO through TRL: the regime hook changes nothing but where reference log-probs come from."""

from __future__ import annotations

import math

import pytest
import torch

from ablate.algos.dpo import _dpo_trainer_cls
from ablate.models.loading import load_model
from ablate.refs.full import FullRefConfig, FullReference
from ablate.tasks.pair_tokens import PairCollator, pad_id, tokenized_dataset
from ablate.tasks.pairs import Pair, pairs_dataset

PAIRS = [
    Pair("Review the film Lucky Harbor.", "A wonderful, joyful film.", "A dull and awful mess.", 0.8, -0.7),
    Pair("Continue: I watched it and", "loved every minute of it.", "hated the ending.", 0.6, -0.5),
    Pair("Write a review of Iron Summer.", "Great acting and a lovely score.", "Boring.", 0.7, -0.3),
    Pair("Continue: the plot was", "clever and beautiful.", "a disaster.", 0.7, -0.6),
]


def _args(tmp_path, precompute: bool):
    from trl import DPOConfig

    return DPOConfig(
        output_dir=str(tmp_path),
        per_device_train_batch_size=2,
        max_steps=3,
        learning_rate=1e-3,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        bf16=False,
        gradient_checkpointing=False,
        seed=0,
        data_seed=0,
        precompute_ref_log_probs=precompute,
        lr_scheduler_type="constant",
        disable_tqdm=True,
    )


def _our_data(tokenizer) -> dict:
    """The harness's way in: the pairs' one tokenisation and its collator (DPO's build_trainer passes these)."""
    return {
        "train_dataset": tokenized_dataset(tokenizer, PAIRS, None),
        "data_collator": PairCollator(pad_id(tokenizer), None),
    }


def _losses(trainer):
    return [h["loss"] for h in trainer.state.log_history if "loss" in h]


@pytest.mark.filterwarnings("ignore")
def test_regime_trainer_matches_stock_trl_with_a_reference_model(tmp_path, tiny_source, tokenizer, ref_ctx):
    from trl import DPOTrainer

    cpu = torch.device("cpu")
    stock = DPOTrainer(
        model=load_model(tiny_source, cpu),
        ref_model=load_model(tiny_source, cpu),
        args=_args(tmp_path / "stock", precompute=False),
        train_dataset=pairs_dataset(PAIRS),
        processing_class=tokenizer,
    )
    stock.train()
    reference = FullReference(FullRefConfig(), ref_ctx)
    ours = _dpo_trainer_cls()(
        model=load_model(tiny_source, cpu),
        args=_args(tmp_path / "ours", precompute=True),
        **_our_data(tokenizer),
        processing_class=tokenizer,
        reference=reference,
    )
    ours.train()
    a, b = _losses(stock), _losses(ours)
    assert len(a) == len(b) == 3
    assert math.isclose(a[0], math.log(2), rel_tol=1e-4)  # reference == policy at step 0
    for x, y in zip(a, b):
        assert math.isclose(x, y, rel_tol=1e-4, abs_tol=1e-5)
    assert b[-1] < b[0]  # it learns
    for (n1, p1), (_n2, p2) in zip(stock.model.named_parameters(), ours.model.named_parameters()):
        assert torch.allclose(p1, p2, atol=1e-5), n1
    # the regime was asked once per step, and TRL loaded no reference of its own
    assert reference.cost().forward_calls == 3
    assert ours.ref_model is None


@pytest.mark.filterwarnings("ignore")
def test_cached_regime_trains_like_full_with_zero_reference_forwards(
    tmp_path, tiny_source, tokenizer, ref_ctx, cache_root
):
    from ablate.inputs import prepare_from_pairs
    from ablate.refs.cached import CachedRefConfig, CachedReference

    cpu = torch.device("cpu")
    ref_ctx.cache_root = str(cache_root)
    runs = {}
    for name, reference in (
        ("full", FullReference(FullRefConfig(), ref_ctx)),
        ("cached", CachedReference(CachedRefConfig(miss="error", batch_size=2), ref_ctx)),
    ):
        prepare_from_pairs(reference, tokenizer, PAIRS)  # as the pipeline does, for every algorithm
        trainer = _dpo_trainer_cls()(
            model=load_model(tiny_source, cpu),
            args=_args(tmp_path / name, precompute=True),
            **_our_data(tokenizer),
            processing_class=tokenizer,
            reference=reference,
        )
        trainer.train()
        runs[name] = (_losses(trainer), reference)
    (full_losses, _), (cached_losses, cached) = runs["full"], runs["cached"]
    for x, y in zip(full_losses, cached_losses):
        assert math.isclose(x, y, rel_tol=1e-4, abs_tol=1e-5)
    extra = cached.cost().extra
    assert extra["model_forwards"] == 0 and extra["misses"] == 0 and extra["hits"] == 3 * 2 * 2
    assert cached.cost().bytes_held < 1e6  # log-probs only, no weights


@pytest.mark.filterwarnings("ignore")
def test_none_regime_uses_no_reference_term(tmp_path, tiny_source, tokenizer, ref_ctx):
    from ablate.refs.none import NoneRefConfig, NoReference

    trainer = _dpo_trainer_cls()(
        model=load_model(tiny_source, torch.device("cpu")),
        args=_args(tmp_path, precompute=True),
        train_dataset=pairs_dataset(PAIRS),
        processing_class=tokenizer,
        reference=NoReference(NoneRefConfig(), ref_ctx),
    )
    trainer.train()
    first = trainer.state.log_history[0]
    # with a zero reference the implicit reward is beta * log pi(y): not 0 at step 0, unlike with a reference
    assert first["rewards/chosen"] == pytest.approx(0.1 * first["logps/chosen"], rel=1e-3)


# ------------------------------------------------------------------------------------------------ SimPO
def test_simpo_loss_matches_a_hand_computation():
    from ablate.algos.simpo import SimPOParams, simpo_loss

    chosen, rejected = torch.tensor([-12.0, -30.0]), torch.tensor([-20.0, -9.0])
    len_w, len_l = torch.tensor([4.0, 10.0]), torch.tensor([5.0, 3.0])
    got = simpo_loss(chosen, rejected, len_w, len_l, SimPOParams(beta=2.0, gamma=1.0))
    # pair 0: 2*(-3) - 2*(-4) - 1 = 1;  pair 1: 2*(-3) - 2*(-3) - 1 = -1
    want = [math.log1p(math.exp(-1.0)), math.log1p(math.exp(1.0))]
    assert got.tolist() == pytest.approx(want, rel=1e-6)


def test_simpo_margin_turns_trl_sigmoid_norm_into_simpo():
    """TRL's sigmoid_norm formula with the margin in the reference slot is SimPO's loss."""
    import torch.nn.functional as F

    from ablate.algos.simpo import SimPOParams, completion_lengths, margin_reference, simpo_loss

    p = SimPOParams(beta=2.5, gamma=1.4)
    mask = torch.tensor([[0, 1, 1, 1, 0], [0, 0, 1, 1, 1], [0, 1, 1, 0, 0], [0, 1, 1, 1, 1]])
    lp_w, lp_l = torch.tensor([-7.0, -2.0]), torch.tensor([-5.0, -9.0])
    ref_w, ref_l = margin_reference(mask, p)
    len_w, len_l = completion_lengths(mask)
    assert len_w.tolist() == [3, 3] and len_l.tolist() == [2, 4]
    trl = -F.logsigmoid(p.beta * ((lp_w - ref_w) / len_w - (lp_l - ref_l) / len_l))  # TRL's sigmoid_norm
    assert torch.allclose(trl, simpo_loss(lp_w, lp_l, len_w, len_l, p), atol=1e-6)


def test_simpo_beta_and_gamma_come_from_the_algo_config_not_algo_beta(tmp_path):
    from ablate.algos.dpo import LossOptions, trl_args
    from ablate.algos.simpo import SimPOParams
    from ablate.errors import ConfigError
    from ablate.validation import validate
    from tests.conftest import typed_config

    simpo = ("algo.loss_type=simpo", "algo.simpo_beta=2.5", "algo.simpo_gamma=1.25", "algo.beta=0.1")
    cfg = typed_config(tmp_path, "model=tiny", "ref=none", *simpo)
    assert LossOptions.from_algo(cfg.algo).simpo == SimPOParams(beta=2.5, gamma=1.25)
    args = trl_args(cfg, tmp_path, torch.device("cpu"))
    assert args.beta == 2.5 and args.loss_type == ["sigmoid_norm"] and args.loss_weights is None
    validate(cfg)
    plain = typed_config(tmp_path, "model=tiny", "ref=none", "algo.beta=0.1")
    assert LossOptions.from_algo(plain.algo) == LossOptions()  # the default DPO loss: nothing added
    plain_args = trl_args(plain, tmp_path, torch.device("cpu"))
    assert plain_args.beta == 0.1 and plain_args.loss_type == ["sigmoid"] and plain_args.loss_weights is None
    for bad in ("algo.simpo_beta=0", "algo.simpo_gamma=-1"):
        with pytest.raises(ConfigError, match="simpo"):
            typed_config(tmp_path, "model=tiny", "ref=none", "algo.loss_type=simpo", bad)
    with pytest.raises(ConfigError, match="algo.loss_type=simpo is reference-free .* needs ref=none, got ref=full"):
        validate(typed_config(tmp_path, "model=tiny", "ref=full", *simpo))


def test_sft_replay_and_l2_options_build_trl_losses_with_any_regime(tmp_path):
    from ablate.algos.dpo import LossOptions, trl_args
    from ablate.validation import validate
    from tests.conftest import typed_config

    for ref in ("full", "none"):
        cfg = typed_config(tmp_path, "model=tiny", f"ref={ref}", "algo.sft_weight=0.5", "algo.l2_init=0.01")
        validate(cfg)
        assert LossOptions.from_algo(cfg.algo) == LossOptions(sft_weight=0.5, l2_init=0.01)
        args = trl_args(cfg, tmp_path, torch.device("cpu"))
        assert args.loss_type == ["sigmoid", "sft"] and args.loss_weights == [1.0, 0.5] and args.beta == 0.1
    simpo = typed_config(tmp_path, "model=tiny", "ref=none", "algo.loss_type=simpo", "algo.sft_weight=0.5")
    assert trl_args(simpo, tmp_path, torch.device("cpu")).loss_type == ["sigmoid_norm", "sft"]


def test_l2_to_initial_weights(tiny_source):
    from ablate.algos.l2_init import L2ToInit

    policy = load_model(tiny_source, torch.device("cpu"))
    l2 = L2ToInit(2.0, policy)  # theta_0 is copied here
    assert l2().item() == 0.0
    with torch.no_grad():
        next(policy.parameters()).add_(0.1)
    p = next(policy.parameters())
    assert math.isclose(l2().item(), 2.0 * 0.01 * p.numel(), rel_tol=1e-4)
    assert l2.nbytes == sum(p.numel() * 4 for p in policy.parameters())  # the copy of theta_0 (fp32)


@pytest.mark.filterwarnings("ignore")
def test_simpo_trains_with_simpo_loss_under_ref_none(tmp_path, tiny_source, tokenizer, ref_ctx):
    """A DPO step with ref=none algo.loss_type=simpo (algo.beta=0.1): its loss is SimPO's, with SimPO's beta
    and margin, on the initial model's log-probs."""
    from ablate.algos.dpo import LossOptions
    from ablate.algos.simpo import SimPOParams, completion_lengths, simpo_loss
    from ablate.refs.base import TokenBatch
    from ablate.refs.model_backed import token_logprobs
    from ablate.refs.none import NoReference
    from tests.conftest import typed_config

    cpu = torch.device("cpu")
    cfg = typed_config(
        tmp_path,
        "model=tiny",
        "ref=none",
        "algo.loss_type=simpo",
        "algo.simpo_beta=2.0",
        "algo.simpo_gamma=1.0",
        "algo.beta=0.1",
        "algo.batch_size=4",
        "algo.max_steps=1",
        "algo.learning_rate=1e-3",
        "checkpoint.interval=0",
    )
    ref = NoReference(cfg.ref, ref_ctx)
    trainer = _build(cfg, tmp_path, tiny_source, tokenizer, ref)  # the loss options come from cfg.algo
    b = next(iter(trainer.get_train_dataloader()))  # batch_size 4: the first batch holds every pair
    batch = TokenBatch(b["input_ids"], b["attention_mask"], b["completion_mask"])
    logps = token_logprobs(load_model(tiny_source, cpu), batch).sum(dim=1)
    want = (
        simpo_loss(*logps.chunk(2), *completion_lengths(batch.completion_mask), SimPOParams(beta=2.0, gamma=1.0))
        .mean()
        .item()
    )
    trainer.train()
    losses = _losses(trainer)
    assert len(losses) == 1 and losses[0] == pytest.approx(want, rel=1e-4)
    assert want > 1.0  # about -log sigmoid(-gamma) = 1.31 at the start; DPO's beta and no margin give ~log 2
    with pytest.raises(ValueError, match="simpo"):  # arguments that would train another loss are refused
        _dpo_trainer_cls()(
            model=load_model(tiny_source, cpu),
            args=_args(tmp_path / "stock", precompute=True),
            train_dataset=pairs_dataset(PAIRS),
            processing_class=tokenizer,
            reference=ref,
            loss=LossOptions.from_algo(cfg.algo),
        )


def _tiny_cfg(tmp_path, *overrides: str):
    """A typed one-batch tiny DPO config (batch_size 4: the first batch holds every pair)."""
    from tests.conftest import typed_config

    common = ("model=tiny", "algo.batch_size=4", "algo.learning_rate=1e-3", "checkpoint.interval=0")
    return typed_config(tmp_path, *common, *overrides)


def _build(cfg, tmp_path, tiny_source, tokenizer, reference):
    from ablate.algos.dpo import build_trainer

    cpu = torch.device("cpu")
    policy = load_model(tiny_source, cpu)
    return build_trainer(
        cfg,
        policy=policy,
        tokenizer=tokenizer,
        pairs=PAIRS,
        reference=reference,
        callbacks=[],
        out_dir=tmp_path,
        device=cpu,
    )


@pytest.mark.filterwarnings("ignore")
def test_sft_replay_adds_the_weighted_sft_loss_and_logs_it_with_a_reference(tmp_path, tiny_source, tokenizer, ref_ctx):
    """ref=full algo.sft_weight=0.5, one step: at step 0 (reference = policy) DPO's loss is log 2, and the step's
    loss is log 2 + 0.5 * the mean negative log-prob of the chosen tokens, which is logged as ``sft_loss``."""
    from ablate.refs.base import TokenBatch
    from ablate.refs.model_backed import token_logprobs

    cfg = _tiny_cfg(tmp_path, "ref=full", "algo.sft_weight=0.5", "algo.max_steps=1")
    trainer = _build(cfg, tmp_path, tiny_source, tokenizer, FullReference(cfg.ref, ref_ctx))
    b = next(iter(trainer.get_train_dataloader()))
    batch = TokenBatch(b["input_ids"], b["attention_mask"], b["completion_mask"])
    chosen_tokens = token_logprobs(load_model(tiny_source, torch.device("cpu")), batch).chunk(2)[0]
    sft = -(chosen_tokens.sum() / batch.target_mask.chunk(2)[0].sum()).item()
    trainer.train()
    first = trainer.state.log_history[0]
    assert first["sft_loss"] == pytest.approx(sft, rel=1e-4)
    assert first["loss"] == pytest.approx(math.log(2) + 0.5 * sft, rel=1e-4)
    assert sft > 1.0  # a random tiny model: far from log 2, so a missing SFT term could not pass


@pytest.mark.filterwarnings("ignore")
def test_l2_to_initial_weights_trains_logs_its_loss_and_costs_the_loss_not_the_reference(
    tmp_path, tiny_source, tokenizer, ref_ctx
):
    """ref=none algo.l2_init=1, two steps: the L2 term is 0 at step 1 and positive at step 2, theta_0 is the
    initial policy, and its copy is the loss's cost (``loss_extra_bytes``), not the reference's."""
    from ablate.refs.none import NoReference

    cfg = _tiny_cfg(tmp_path, "ref=none", "algo.l2_init=1.0", "algo.max_steps=2")
    ref = NoReference(cfg.ref, ref_ctx)
    trainer = _build(cfg, tmp_path, tiny_source, tokenizer, ref)
    trainer.train()
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert len(logs) == 2 and logs[0]["l2_init_loss"] == 0.0 and logs[1]["l2_init_loss"] > 0
    initial = load_model(tiny_source, torch.device("cpu"))
    want = sum(((p - p0) ** 2).sum() for p, p0 in zip(trainer.model.parameters(), initial.parameters()))
    assert trainer.l2_init().item() == pytest.approx(want.item(), rel=1e-5)
    n_bytes = sum(p.numel() * p.element_size() for p in initial.parameters())
    assert logs[0]["loss_extra_bytes"] == n_bytes and ref.cost().bytes_held == 0
    assert trainer.loss_extra_bytes == n_bytes  # what the pipeline puts in summary.json
