"""The lists of regimes and algorithms the sweep presets read, as OmegaConf resolvers, so that no preset copies
them: ``ref: ${ablate_regimes:sweep}`` and ``algo: ${ablate_algos:}`` in ``hydra.sweeper.params`` (Hydra's basic
sweeper resolves them when it builds the jobs; :func:`ablate.presets.grid` when the CLI checks them and
when the W&B sweep files are generated).

    ${ablate_regimes:sweep}   every regime but the variants (ablate.refs.regime_names("sweep")), e.g. full,int8,...
    ${ablate_regimes:all}     every regime;  ${ablate_regimes:audit}: the audit's defaults
    ${ablate_algos:}          every algorithm (ablate.algos.registry.algorithm_names), e.g. dpo,ppo,grpo
"""

from __future__ import annotations


def regimes(purpose: str = "sweep") -> str:
    """The registered regimes for ``purpose``, in the canonical order, as a sweep's comma-separated choices."""
    from ablate.refs import regime_names

    return ",".join(regime_names(purpose or "sweep"))


def algos() -> str:
    """Every registered algorithm, in order, as a sweep's comma-separated choices."""
    from ablate.algos.registry import algorithm_names

    return ",".join(algorithm_names())


def register_resolvers() -> None:
    """Register ``ablate_regimes`` and ``ablate_algos`` with OmegaConf (idempotent)."""
    from omegaconf import OmegaConf

    if not OmegaConf.has_resolver("ablate_regimes"):
        OmegaConf.register_new_resolver("ablate_regimes", regimes)
    if not OmegaConf.has_resolver("ablate_algos"):
        OmegaConf.register_new_resolver("ablate_algos", algos)
