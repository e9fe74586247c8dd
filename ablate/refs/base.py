"""The one reference interface every algorithm calls and every regime implements."""

from __future__ import annotations

import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cache
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from ablate import registries
from ablate.batch import TokenBatch
from ablate.errors import ConfigError

if TYPE_CHECKING:
    from ablate.config import Config, RefConfig
    from ablate.models.prompt_cache import ChunkPrompts

log = logging.getLogger(__name__)

REGISTRY: dict[str, type[Reference]] = {}
TRAINING, AUDIT = "training", "audit"  # what a call of Reference.logprobs is for
CALLS = (TRAINING, AUDIT)


class MissingReference(NotImplementedError):
    """The regime has no reference term for some of the rows asked for (``ref=cached``, ``miss=error``, on a
    sequence it did not precompute): training stops with it; an audit reports it as the reason for its NaN."""


@dataclass
class RefCost:
    """What a reference costs. Time counts only calls made for training (not the evaluator's audits)."""

    bytes_held: int = 0  # weights, adapters and caches held in memory for the reference
    setup_s: float = 0.0  # one-off: load, quantise, distil, precompute
    cache_bytes: int = 0  # on disk
    forward_s: float = 0.0  # total time in training calls
    forward_calls: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class RefContext:
    """What a regime may need to build itself, by name (never the whole run config). Built by the runner,
    before training (``ablate.inputs.RunInputs.ref_context``)."""

    model_dir: str
    model_fingerprint: str
    tokenizer: Any
    device: torch.device
    algo: str = "dpo"  # the algorithm's name (dpo | ppo | grpo)
    max_length: int | None = None  # the algorithm's prompt + response truncation (DPO's), None where it has none
    precision: str = "fp32"  # the policy's training precision: training-time reference calls use it too
    policy: torch.nn.Module | None = None  # the (possibly peft-wrapped) policy being trained
    load_model: Callable[..., torch.nn.Module] | None = None  # load_model(**overrides) -> frozen eval-mode copy
    train_data: Any = None  # the preference pairs, for regimes built from them (``Reference.needs_pairs``)
    max_sentences: int | None = None  # the task's stop rule (ablate.stop_rule), for regimes that sample it
    cache_root: str | None = None


class Reference(ABC):
    """A stand-in for the frozen reference model.

    Lifecycle, in the order a run drives it:

    1. **build**: ``cls.resolve(cfg)`` then ``cls.check_config(cfg)`` when the config is validated (before
       anything loads), then ``cls(cfg.ref, ctx)``, which loads, quantises, distils or reads a cache.
    2. **prepare**: :meth:`prepare` is called at most once, before training, with the training sequences,
       and only for a regime that declares ``wants_training_data``: the pipeline hands over the preference
       pairs as token batches, as DPO trains on them (:mod:`ablate.tasks.pair_tokens`), for every algorithm.
    3. **use**: :meth:`logprobs` with its purpose (training: timed and counted as cost; audit: neither), and
       :meth:`distribution` where the regime declares one (:attr:`has_distribution`; audits only).
    4. **step**: :meth:`step` after every optimiser step but the last (EMA and snapshot update there).
    5. **account**: :meth:`cost` for the summary; :meth:`state_dict` / :meth:`load_state_dict` for checkpoints.

    Every hook a caller uses is declared here with a neutral default: callers never probe for one.
    Subclasses implement :meth:`_logprobs` (and :meth:`_distribution` where they can); the public
    methods add the timing and counting for the cost accounting, in one place (:meth:`_call`).

    A regime may have no reference term for some rows (``ref=cached`` with ``miss=skip``, for a
    freshly sampled response): :meth:`logprobs` then returns that row as NaN in every position (a
    model-backed regime never does: its non-response positions are 0). Algorithms that accept such
    rows pass the result through :func:`fill_uncovered` before any KL arithmetic, so an uncovered
    row contributes exactly zero penalty, zero KL and zero gradient; the others must not see them
    (``ref=cached`` rejects ``miss=skip`` for DPO).
    """

    name: ClassVar[str]
    config_cls: ClassVar[type]
    #: The algorithms the regime serves. Left at this default: every algorithm, plug-ins included (:meth:`supports`).
    supported_algos: ClassVar[tuple[str, ...]] = ("dpo", "ppo", "grpo")
    #: False for reference-free training: there is no reference term, and no approximate KL.
    has_reference: ClassVar[bool] = True
    #: True when the regime is built from the preference pairs (cached, distilled), whatever the algorithm.
    needs_pairs: ClassVar[bool] = False
    #: True when the regime wants the training sequences through :meth:`prepare` (cached).
    wants_training_data: ClassVar[bool] = False
    #: True when the regime's per-token log-probs are those of its own next-token distribution (:meth:`distribution`):
    #: the evaluator's audit then reads them off that distribution (in float64) instead of running the model again.
    logprobs_match_distribution: bool = False
    #: True when the regime asks for training batches ahead (:meth:`prefetch`): trainers then hand them over.
    prefetches: bool = False
    #: True when the regime has a next-token distribution (:meth:`distribution`: ``_distribution`` implemented).
    has_distribution: ClassVar[bool] = False
    #: Packages the regime needs beyond the base install: import name -> (pip requirement, who needs it).
    required_packages: ClassVar[dict[str, tuple[str, str]]] = {}
    #: What each of the regime's own figures means (its numeric ``cost().extra``, ``ref_<name>`` in the summary).
    EXTRA_DOCS: ClassVar[dict[str, str]] = {}
    # Where the regime is listed (:func:`regime_names`). Read from the registered class itself, never inherited:
    # a subclass registered under another name is another regime, and declares its own.
    #: Place in tables, figures and default lists (lower first); None: after every ranked regime, by name.
    rank: ClassVar[int | None] = None
    #: The regime this one is a preset of (``trdpo_soft``: ``ema``): left out of the ``regimes`` and ``algos`` sweeps.
    variant_of: ClassVar[str | None] = None
    #: True when ``python -m ablate.audit`` measures the regime by default.
    audited: ClassVar[bool] = False

    def __init__(self, cfg: RefConfig, ctx: RefContext):
        self.cfg = cfg
        self.ctx = ctx
        self._cost = RefCost()
        self._purpose: str | None = None  # the purpose of the call under way (None: none)
        self.provenance: dict[str, Any] = {}  # what the summary's provenance records of the regime (a server's engine)

    # --- build: checks and settings resolved when the config is validated ---------------------------------
    @classmethod
    def resolve(cls, cfg: Config) -> None:
        """Settle, in place, the regime's settings that depend on the rest of the config (``ref=cached``:
        ``miss=auto``), when the config is validated. No-op by default."""

    @classmethod
    def data_seed(cls, cfg: RefConfig, seed: int) -> int:
        """The seed of the order the training data comes in (TRL's ``data_seed``, PPO's prompt order): the run's
        seed, but for a placebo (:mod:`ablate.refs.placebo`)."""
        return seed

    @classmethod
    def supports(cls, algo: str) -> bool:
        """Whether the regime serves ``algo``: every algorithm unless it declares its own ``supported_algos``."""
        return cls.supported_algos is Reference.supported_algos or algo in cls.supported_algos

    @classmethod
    def check_config(cls, cfg: Config) -> None:
        """Raise ConfigError (one line) for impossible combinations, before anything loads."""

    # --- prepare ------------------------------------------------------------------------------------------
    def prepare(self, batches: Iterable[TokenBatch]) -> None:
        """Called once, before training, with the training sequences, for a regime that declares
        ``wants_training_data`` (see the class docstring). No-op by default."""

    # --- use ---------------------------------------------------------------------------------------------
    def logprobs(self, batch: TokenBatch, purpose: str = TRAINING, precision: str | None = None) -> torch.Tensor:
        """[B, T-1] reference log-probs of the response tokens (0 elsewhere); a row with no reference term is all
        NaN (see the class docstring). ``purpose``: :data:`TRAINING`, what training receives, timed and counted as
        the regime's cost; :data:`AUDIT`, the same values for an audit (the fidelity audit, the evaluator's),
        neither timed nor counted in the regime's own statistics (:attr:`counting`). ``precision``: the autocast
        precision, by default the policy's training precision (as a stock TRL reference model computes it)."""
        from ablate.models.precision import autocast

        if purpose not in CALLS:
            raise ValueError(f"purpose must be one of {CALLS}, got {purpose!r}")
        with self._call(purpose), autocast(self.ctx.device, precision or self.ctx.precision):
            return self._logprobs(batch)

    def distribution(self, batch: TokenBatch, prompts: ChunkPrompts | None = None) -> torch.Tensor:
        """[B, T-1, V] float32 next-token log-scores at each position (logits, or normalised log-probs; exact or
        as the regime approximates them): ``log_softmax`` of a row is the distribution, and the audit takes it
        in float64 (``ablate.eval.kl.audit_terms``). For audits, in the caller's precision: never timed or
        counted. Only a regime that declares :attr:`has_distribution` has one (NotImplementedError otherwise).
        ``prompts``: the audit's cached prompts of this chunk (:mod:`ablate.models.prompt_cache`), which a regime
        whose distribution is a frozen model's forward runs on (:meth:`_distribution_on`); the others ignore it."""
        with self._call(AUDIT):
            return self._distribution(batch) if prompts is None else self._distribution_on(batch, prompts)

    @property
    def counting(self) -> bool:
        """True inside a training call: what a regime counts of its own (a cache's hits) it counts only then."""
        return self._purpose == TRAINING

    @contextmanager
    def _call(self, purpose: str) -> Iterator[None]:
        """One call for ``purpose``: a training call's wall time and count go to the cost (:class:`RefCost`)."""
        outer, self._purpose = self._purpose, purpose
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self._purpose = outer
            if purpose == TRAINING:
                self._cost.forward_s += time.perf_counter() - t0
                self._cost.forward_calls += 1

    def prefetch(self, batches: Iterable[TokenBatch]) -> None:
        """Training will ask for these batches' log-probs soon, in this order: a regime whose reference is far away
        (``ref=served``) may ask for them in the background, so that its latency hides behind training. What
        training receives never depends on it. No-op by default."""

    def reads(self, model: torch.nn.Module) -> bool:
        """True when the regime's reference *is* ``model`` (the same object, only read): its scores are then
        ``model``'s own, and an audit that already has them need not ask again (``ref=full`` reads the judge's copy)."""
        return False

    # --- step ---------------------------------------------------------------------------------------------
    def step(self, policy: torch.nn.Module, step: int) -> None:
        """Hook after each optimiser step (EMA and snapshot update here)."""

    # --- account ------------------------------------------------------------------------------------------

    def cost(self) -> RefCost:
        """What the regime has cost so far. ``extra["bytes_vs_bf16"]`` (``ref_bytes_vs_bf16`` in the summary): the bytes
        it holds over those of a bf16 full copy of the reference model (:func:`bf16_copy_bytes`)."""
        try:  # counted from the model's config on the meta device; a config transformers cannot build has none
            self._cost.extra["bytes_vs_bf16"] = self._cost.bytes_held / bf16_copy_bytes(self.ctx)
        except Exception as e:  # never let a cost ratio stop a (failed) run's summary from being written
            log.warning("ref_bytes_vs_bf16 is NaN: the reference model's parameters could not be counted (%s)", e)
            self._cost.extra["bytes_vs_bf16"] = float("nan")
        return self._cost

    def close(self) -> None:
        """Release what the regime holds outside this process (a server it started), once the run's summary is
        written. No-op by default."""

    def state_dict(self) -> dict[str, Any]:
        """What a resumed job needs to continue exactly: the training-time cost counters here; regimes
        that change during training (EMA, snapshot) add their weights."""
        return {"forward_s": self._cost.forward_s, "forward_calls": self._cost.forward_calls}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._cost.forward_s = float(state.get("forward_s", 0.0))
        self._cost.forward_calls = int(state.get("forward_calls", 0))

    # --- for subclasses ----------------------------------------------------------------------------------
    @abstractmethod
    def _logprobs(self, batch: TokenBatch) -> torch.Tensor: ...

    def _distribution(self, batch: TokenBatch) -> torch.Tensor:  # regimes that declare has_distribution override
        raise NotImplementedError(f"ref={self.name} provides no next-token distribution")

    def _distribution_on(self, batch: TokenBatch, prompts: ChunkPrompts) -> torch.Tensor:
        """:meth:`_distribution` given the chunk's cached prompts: the regime's own unless it overrides this."""
        return self._distribution(batch)


def uncovered_rows(ref_logps: torch.Tensor) -> torch.Tensor:
    """[B] bool: the rows a regime returned with no reference term (NaN in every position). A row
    that is only partly NaN is a numerical fault, not a skip: it is not counted here."""
    return torch.isnan(ref_logps).flatten(1).all(dim=1)


def fill_uncovered(ref_logps: torch.Tensor, policy_logps: torch.Tensor) -> torch.Tensor:
    """``ref_logps`` with each uncovered row replaced by the policy's own log-probs, detached: both KL
    estimators (k1 = log pi - log ref, k3 = e^(ref - log pi) - (ref - log pi) - 1) are then exactly 0
    there whatever the policy's values, and k3 (the one used inside a loss) has exactly zero gradient
    (the harness's own k1/k2 loss terms and reward penalties mask such rows out explicitly:
    :mod:`ablate.algos.kl_estimators`). Other rows are returned as they are;
    the result has the promoted dtype of the two (so a filled value equals the policy's exactly)."""
    rows = uncovered_rows(ref_logps).view(-1, *([1] * (ref_logps.dim() - 1)))
    return torch.where(rows, policy_logps.detach(), ref_logps)


def register(config_cls: type) -> Callable[[type[Reference]], type[Reference]]:
    """Class decorator: register a regime under its schema's ``name`` default (written once, in the schema)
    and store the schema as ``schema/ref/<name>``."""
    from dataclasses import MISSING, fields

    name = next(f.default for f in fields(config_cls) if f.name == "name")
    if name is MISSING or not isinstance(name, str) or name == "???":  # "???": OmegaConf's MISSING
        raise TypeError(f"{config_cls.__name__} must give its regime's name as the default of its `name` field")

    def deco(cls: type[Reference]) -> type[Reference]:
        cls.name = name
        cls.config_cls = config_cls
        REGISTRY[name] = cls
        registries.store_schema("ref", name, config_cls)
        return cls

    return deco


#: What :func:`regime_names` lists, by purpose.
PURPOSES = {
    "all": "every regime: tables, figures (their order and colours), the bench's default regimes",
    "sweep": "the regimes of the `regimes` and `algos` sweep presets: every regime but the variants (`variant_of`)",
    "audit": "the regimes `python -m ablate.audit` measures by default (`audited`)",
}


def _declared(cls: type[Reference], attr: str, default: Any) -> Any:
    """A listing attribute as the registered class itself declares it (not inherited)."""
    return vars(cls).get(attr, default)


def regime_names(purpose: str = "all") -> list[str]:
    """The registered regimes for one purpose (:data:`PURPOSES`), in the canonical order: by ``rank``, then the
    unranked ones by name. The one list every default, sweep preset and figure reads."""
    if purpose not in PURPOSES:
        raise ConfigError(f"unknown purpose {purpose!r} of a regime list (choose from: {', '.join(PURPOSES)})")
    keep = {
        "all": lambda cls: True,
        "sweep": lambda cls: _declared(cls, "variant_of", None) is None,
        "audit": lambda cls: bool(_declared(cls, "audited", False)),
    }[purpose]

    def order(name: str) -> tuple:
        rank = _declared(REGISTRY[name], "rank", None)
        return (rank is None, rank or 0, name)

    return [name for name in sorted(REGISTRY, key=order) if keep(REGISTRY[name])]


def data_seed(cfg) -> int:
    """The seed of a run's training-data order: ``cfg.seed`` unless its regime says otherwise."""
    return regime_class(cfg.ref.name).data_seed(cfg.ref, cfg.seed)


def regime_class(name: str) -> type[Reference]:
    return registries.lookup(REGISTRY, name, "reference regime", sorted(REGISTRY))


def module_bytes(module: torch.nn.Module) -> int:
    """Bytes a module holds: its state dict (which, unlike ``parameters()``, includes bitsandbytes'
    quantisation constants), each storage counted once (tied weights are one storage)."""
    seen: set[int] = set()
    total = 0
    for t in module.state_dict(keep_vars=True).values():
        if not isinstance(t, torch.Tensor):
            continue
        key = t.untyped_storage().data_ptr() if t.device.type != "meta" else id(t)
        if key in seen:
            continue
        seen.add(key)
        total += t.untyped_storage().nbytes()
    return total


@cache
def model_parameters(model_dir: str, fingerprint: str) -> int:
    """Parameters of the causal LM saved in ``model_dir`` (a tied pair once), counted on the meta device from its
    config: no weights load. ``fingerprint`` (the folder's content hash) keys the cache."""
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir))
    return sum(p.numel() for p in model.parameters())


def bf16_copy_bytes(ctx: RefContext) -> int:
    """Bytes of a bf16 full copy of the reference (SFT) model: 2 per parameter. The fp32 truth (``ref=full``)
    holds twice that."""
    return 2 * model_parameters(ctx.model_dir, ctx.model_fingerprint)
