"""Typed, validated configuration: one dataclass per config group.

Each option file in ``conf/<group>/<name>.yaml`` starts from a schema defined here and stored by
:func:`ablate.compose.register_configs` under ``schema/<group>/<name>``, its ``name`` default (reference
regimes define and register their own schema next to their code, in ``ablate/refs``), so an unknown key or a
wrong type fails at composition; a YAML file holds only what differs from its schema's defaults. Range checks
and string choices (the Literals below) live in ``__post_init__`` and run when the composed config is turned
into objects (:func:`ablate.compose.compose`); checks that span groups live in :func:`ablate.validation.validate`.
"""

from ablate.config.algo import *  # noqa: F403
from ablate.config.checks import *  # noqa: F403
from ablate.config.model import *  # noqa: F403
from ablate.config.run import *  # noqa: F403
from ablate.config.task import *  # noqa: F403
