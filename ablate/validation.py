"""Checks of a whole job's config that span config groups and need the regime it names (so they sit above
:mod:`ablate.refs`, which itself builds on :mod:`ablate.config`)."""

from __future__ import annotations

from ablate.config import Config, check_processes, require


def validate(cfg: Config) -> None:
    """Checks that span config groups. Raises ConfigError with one line."""
    from ablate.refs import regime_class, regime_names

    regime = regime_class(cfg.ref.name)
    require(
        cfg.plan.null_control is None or cfg.plan.null_control in regime_names(),
        f"plan.null_control={cfg.plan.null_control}: no such regime (choose from: {', '.join(regime_names())})",
    )
    regime.resolve(cfg)  # settles settings that depend on other groups (ref=cached: miss=auto), in place
    regime.check_config(cfg)
    require(
        regime.supports(cfg.algo.name),
        f"ref={cfg.ref.name} does not support algo={cfg.algo.name} (supported: {', '.join(regime.supported_algos)})",
    )
    require(
        cfg.algo.name != "dpo" or cfg.algo.loss_type != "simpo" or not regime.has_reference,
        "algo.loss_type=simpo is reference-free (SimPO has no reference term): it needs ref=none, "
        f"got ref={cfg.ref.name}",
    )
    if cfg.model.name == "hf":
        require(bool(cfg.model.name_or_path), "model=hf needs model.name_or_path=<hub id or local folder>")
    from ablate.models.loading import check_device, resolve_device
    from ablate.models.precision import resolve

    check_device(cfg.model.device)
    cfg.model.precision = resolve(cfg.model.precision, resolve_device(cfg.model.device))[0]  # auto, settled here
    check_processes(cfg)
