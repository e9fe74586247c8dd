"""The report's statistical settings: which metric is primary, the equivalence margins, alpha, the baseline
and null-control regimes, and the bootstrap's size and seed. ``python -m analysis report`` builds one from its
flags (``--margin reward_delta=0.05 --margin kl_true=10%``) and the report prints it resolved."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ablate.config.run import parse_margin_value
from ablate.errors import ConfigError

#: the intervals' model of seeds and prompts (``--design``)
DESIGNS = {
    "crossed": "crossed where the seeds share their prompts: the union of the two-way bootstrap, the two-way "
    "random-effects t and the seed-level t intervals (`analysis/crossed.py`); nested otherwise",
    "nested": "nested: the union of the hierarchical bootstrap (seeds, then prompts within each) and the seed-level t "
    "intervals, even where the seeds share their prompts (the rule this report was first made under)",
}

#: how a report's verdicts of difference are adjusted for their number (``--multiplicity``)
MULTIPLICITY = {
    "holm": "Holm's step-down adjustment of the tests of difference over the verdict table (every regime, metric "
    "and condition): a *different* needs its adjusted p (`p_holm`) below alpha",
    "none": "none: each *different* rests on its own 95% interval (the rule this report was first made under; "
    "`p_holm` is still listed)",
}


#: how a metric with a relative margin is compared (``--relative``)
RELATIVE = {
    "log-ratio": "the mean over seeds of log(regime's mean / baseline's mean) per seed, against ±log(1 + share); "
    "its interval the union of a bootstrap of both runs' means and the seed-level t of the log ratios "
    "(`analysis/log_ratio.py`)",
    "difference": "the difference against share x the baseline's pooled mean (the rule this report was first made "
    "under)",
}

#: the null control when neither the runs' plan nor ``--null-control`` names one
NULL_CONTROL = "cached"


@dataclass(frozen=True)
class Margin:
    """An equivalence margin: ``value`` in the metric's own unit, or, when ``relative``, a fraction of the
    baseline regime's mean (``0.10``: 10% of it)."""

    value: float
    relative: bool = False

    def resolve(self, baseline_mean: float) -> float:
        """The margin in the metric's unit (NaN when relative and the baseline's mean is unknown)."""
        if not self.relative:
            return self.value
        if not math.isfinite(baseline_mean):
            return math.nan
        return self.value * abs(baseline_mean)

    def describe(self) -> str:
        return f"{self.value * 100:g}% of the baseline's mean" if self.relative else f"{self.value:g} absolute"


def default_margins() -> dict[str, Margin]:
    """reward_delta and win_rate: 0.05 absolute; true KL and response length: 10% of the baseline's mean."""
    return {
        "reward_delta": Margin(0.05),
        "win_rate": Margin(0.05),
        "kl_true": Margin(0.10, relative=True),
        "length": Margin(0.10, relative=True),
    }


@dataclass
class ReportConfig:
    """How the report turns numbers into verdicts (see :mod:`analysis.equivalence`)."""

    primary: str = "reward_delta"  # the declared primary metric
    margins: dict[str, Margin] = field(default_factory=default_margins)  # one verdict per metric listed here
    alpha: float = 0.05  # difference: the (1 - alpha) interval; equivalence (TOST): the (1 - 2 alpha) interval
    baseline: str = "full"  # every other regime is compared with this one
    null_control: str = NULL_CONTROL  # a regime that must come out equivalent to the baseline
    n_boot: int = 2000  # bootstrap resamples
    seed: int = 0  # the bootstrap's seed: the same report every time
    reference_condition: str | None = None  # runs varying a setting: the condition the others are compared with
    design: str = "crossed"  # Design: the intervals' model of seeds and prompts (analysis.crossed)
    multiplicity: str = "holm"  # MULTIPLICITY: the adjustment of the verdicts of difference (analysis.pvalues)
    relative: str = "log-ratio"  # RELATIVE: the scale of a metric with a relative margin (analysis.log_ratio)
    origin: tuple[str, ...] = ()  # where the margins came from (analysis.declared), markdown bullets

    def metrics(self) -> list[str]:
        """The metrics that get a verdict, the primary first."""
        return [self.primary] + [m for m in self.margins if m != self.primary]

    def margin(self, metric: str) -> Margin | None:
        return self.margins.get(metric)

    def describe(self) -> list[str]:
        """The resolved settings, one markdown bullet each."""
        margins = ", ".join(f"`{m}` ±{self.margins[m].describe()}" for m in self.metrics() if m in self.margins)
        return [
            f"- primary metric: `{self.primary}`; baseline `{self.baseline}`; null control `{self.null_control}`",
            f"- equivalence margins: {margins or 'none'}",
            *self.origin,
            f"- alpha {self.alpha:g}: a difference needs the {100 * (1 - self.alpha):g}% interval, equivalence "
            f"(two one-sided tests) the {100 * (1 - 2 * self.alpha):g}% interval",
            f"- bootstrap: {self.n_boot} resamples, seed {self.seed} (deterministic: the same numbers every run)",
            f"- design: {DESIGNS[self.design]}",
            f"- multiplicity: {MULTIPLICITY[self.multiplicity]}",
            f"- relative margins: {RELATIVE[self.relative]}",
        ]


def parse_margin(text: str) -> tuple[str, Margin]:
    """``name=0.05`` (absolute) or ``name=10%`` (relative to the baseline's mean) -> (name, Margin)."""
    name, sep, value = text.partition("=")
    name, value = name.strip(), value.strip()
    if not sep or not name or not value:
        raise ValueError(f"a margin is metric=value or metric=value%, not {text!r}")
    try:
        number, relative = parse_margin_value(name, value)
    except ConfigError as e:
        raise ValueError(str(e)) from None
    return name, Margin(number, relative)


def build_config(
    margins: list[str] | None = None,
    primary: str = "reward_delta",
    alpha: float = 0.05,
    baseline: str = "full",
    null_control: str | None = None,
    n_boot: int = 2000,
    seed: int = 0,
    reference_condition: str | None = None,
    design: str = "crossed",
    multiplicity: str = "holm",
    relative: str = "log-ratio",
) -> ReportConfig:
    """A config from CLI-style values: ``margins`` override or add to the defaults."""
    if not 0 < alpha < 0.5:
        raise ValueError(f"alpha must be in (0, 0.5), not {alpha}")
    if n_boot < 100:
        raise ValueError(f"the bootstrap needs at least 100 resamples, not {n_boot}")
    if design not in DESIGNS:
        raise ValueError(f"--design must be one of {', '.join(DESIGNS)}, not {design!r}")
    if multiplicity not in MULTIPLICITY:
        raise ValueError(f"--multiplicity must be one of {', '.join(MULTIPLICITY)}, not {multiplicity!r}")
    if relative not in RELATIVE:
        raise ValueError(f"--relative must be one of {', '.join(RELATIVE)}, not {relative!r}")
    resolved = default_margins()
    resolved.update(parse_margin(m) for m in margins or [])
    return ReportConfig(
        primary,
        resolved,
        alpha,
        baseline,
        null_control or NULL_CONTROL,
        n_boot,
        seed,
        reference_condition,
        design,
        multiplicity,
        relative=relative,
    )
