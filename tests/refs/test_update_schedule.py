"""When ref=ema / ref=snapshot update: ``tau`` is a fraction of the run unless set, a ``tau`` that leaves no update
before the end (the reference would equal full) is refused unless allowed, and the TR-DPO presets compose."""

from __future__ import annotations

import pytest
from transformers import TrainerState

from ablate.compose import compose
from ablate.errors import ConfigError
from ablate.refs import regime_class
from ablate.refs.ema import EmaRefConfig, EmaReference, updates_in
from ablate.refs.snapshot import SnapshotReference
from ablate.validation import validate


def _validated(*overrides: str):
    cfg = compose("model=tiny", *overrides)
    validate(cfg)
    return cfg


@pytest.mark.parametrize(
    "overrides,tau",
    [
        (["ref=ema", "algo.max_steps=40"], 8),  # the default run: 4 updates (steps 8, 16, 24, 32)
        (["ref=snapshot", "algo.max_steps=40"], 8),
        (["ref=ema", "algo.max_steps=10"], 2),  # the committed report's 10 steps: 4 updates too
        (["ref=snapshot", "algo=ppo", "algo.max_steps=3"], 1),  # at least 1
        (["ref=ema", "ref.tau_fraction=0.5", "algo.max_steps=40"], 20),
        (["ref=snapshot", "ref.tau=3", "algo.max_steps=40"], 3),  # an explicit tau is kept
        (["ref=ema", "ref.tau=10", "algo=grpo", "algo.max_steps=40"], 10),
    ],
)
def test_tau_is_a_fraction_of_the_run_unless_set(overrides, tau):
    cfg = _validated(*overrides)
    assert cfg.ref.tau == tau and updates_in(tau, cfg.algo.max_steps) >= 1


@pytest.mark.parametrize(
    "overrides,regime",
    [
        (["ref=snapshot", "ref.tau=20", "algo.max_steps=10"], "snapshot"),  # the old default in the report's run
        (["ref=ema", "ref.tau=10", "algo.max_steps=10"], "ema"),  # no update after the last step
        (["ref=ema", "algo.max_steps=1"], "ema"),  # no step but the last: no fraction helps
        (["ref=trdpo_hard", "algo=ppo", "algo.max_steps=1"], "trdpo_hard"),
    ],
)
def test_a_tau_that_never_updates_is_refused_unless_allowed(overrides, regime):
    with pytest.raises(ConfigError) as e:
        _validated(*overrides)
    msg = str(e.value)
    assert msg.startswith(f"ref={regime} would never update: it equals full (") and "\n" not in msg
    assert "ref.allow_no_update=true" in msg
    cfg = _validated(*overrides, "ref.allow_no_update=true")
    assert updates_in(cfg.ref.tau, cfg.algo.max_steps) == 0


@pytest.mark.parametrize("preset,cls,alpha", [("trdpo_soft", EmaReference, 0.6), ("trdpo_hard", SnapshotReference, 1)])
def test_the_trdpo_presets_compose_with_its_ratio_of_tau_to_the_run(preset, cls, alpha):
    cfg = _validated(f"ref={preset}")  # the default run, 40 steps
    assert cfg.ref.name == preset and issubclass(regime_class(preset), cls)
    assert getattr(cfg.ref, "alpha", 1) == alpha and cfg.ref.tau_fraction == 0.4
    assert cfg.ref.tau == 16 and updates_in(16, 40) == 2  # TR-DPO: tau 512 in an epoch of about 1,250 steps
    assert _validated(f"ref={preset}", "ref.tau=5").ref.tau == 5  # still ema's / snapshot's knobs


@pytest.mark.parametrize("ref", ["ema", "snapshot"])
def test_the_reports_short_run_updates_the_reference(ref, ref_ctx, tiny_model):
    """The report's run (``+sweep=report_dpo``: 20 DPO steps; an older 10-step report left both regimes equal to
    full, tau 10 and 20) updates each, stepped as training steps it (after every optimiser step but the last)."""
    from ablate.callbacks import ReferenceStepCallback
    from ablate.run import JobState

    cfg = _validated("+sweep=report_dpo", f"ref={ref}")
    assert cfg.algo.max_steps == 20 and cfg.ref.tau == 4
    reference = regime_class(ref)(cfg.ref, ref_ctx)
    callback = ReferenceStepCallback(JobState(), tiny_model, reference=reference)
    for step in range(1, cfg.algo.max_steps + 1):
        callback.on_step_end(None, TrainerState(global_step=step, max_steps=cfg.algo.max_steps), None)
    extra = reference.cost().extra
    assert reference.updates == 4 and (extra["updates"], extra["tau"]) == (4, 4)


def test_a_regime_built_without_validation_refuses_to_step(ref_ctx, tiny_model):
    reference = EmaReference(EmaRefConfig(), ref_ctx)  # tau=null: only validation knows the run's length
    with pytest.raises(ConfigError, match=r"^ref.tau=null is settled when the config is validated"):
        reference.step(tiny_model, 1)
