"""``ref=placebo``: the null control that can fail. The full reference, exactly ``ref=full``'s, trained with a nuisance
change that should not matter: the training data comes in another order (``data_seed`` = the run's seed +
``ref.data_seed_offset``; TRL's sampler for DPO and GRPO, the prompt order for PPO). Everything else is the run's
seed's: the same preference pairs, the same evaluation prompts and sampling seed. A report compares it with ``full``
like any stand-in (``--null-control placebo``): its differences are the training noise a stand-in's must clear, and
it can come out *different*, which a control on ``full``'s very code path (a *determinism check*) never can."""

from __future__ import annotations

from dataclasses import dataclass

from ablate.config import RefConfig, require
from ablate.refs.base import register
from ablate.refs.full import FullReference


@dataclass
class PlaceboRefConfig(RefConfig):
    name: str = "placebo"
    data_seed_offset: int = 1  # added to the run's seed for the data order only (not 0: that is ref=full itself)

    def __post_init__(self):
        require(self.data_seed_offset != 0, "ref.data_seed_offset must not be 0 (0 is ref=full itself)")


@register(PlaceboRefConfig)
class PlaceboReference(FullReference):
    """``full``'s reference; only the run's data order differs (:meth:`data_seed`)."""

    rank = 55  # beside cached, the other null control
    audited = False  # the same reference as full: nothing of its own to audit
    variant_of = "full"  # a control, not a sweep point of the regime presets

    @classmethod
    def data_seed(cls, cfg: PlaceboRefConfig, seed: int) -> int:
        return seed + cfg.data_seed_offset
