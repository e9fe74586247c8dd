"""The metric schema: every fact about a metric in one place.

One :class:`Metric` per figure a run reports: its ``summary.json`` key, the name it is logged under in
``metrics.jsonl`` and W&B (with its section prefix ``eval/``, ``kl/``, ``cost/`` or ``train/``), its unit,
which direction is better, what it means, whether the summary also holds its value at step 0, whether the
report compares regimes on it, and how ``python -m ablate.status`` shows it. The summary
(``ablate.run.build_summary``), its validation (``tracking.run_dir``), ``ablate.status``, ``tracking.resume``
and ``analysis/`` all read it; ``docs/metrics.md`` is generated from it (``ablate.metrics_doc``).

Adding a metric is one entry in :data:`METRICS`. A metric the evaluator does not emit is *derived*: ``derive``
computes it from the logged metrics named in ``inputs`` (:func:`complete` fills it in). Tests add entries
for a while with :func:`registered`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Literal

Direction = Literal["higher", "lower"] | None

#: A job's end states; ``FINAL`` ones are results, not accidents: a rerun of the same config does nothing.
STATUSES: tuple[str, ...] = ("finished", "failed", "diverged")
FINAL: tuple[str, ...] = ("finished", "diverged")
#: Sections of the logged names that the summary takes from an evaluation (``cost/`` comes from the reference).
EVAL_SECTIONS = ("eval/", "kl/")
#: Training logs keep the trainer's own names (TRL's, or PPO's here) under this section; none is in the summary.
TRAIN_SECTION = "train/"
MIB = 2**20


@dataclass(frozen=True)
class Column:
    """How ``ablate.status`` shows a metric: header, width and format (of the value divided by its scale)."""

    header: str
    width: int
    fmt: str


@dataclass(frozen=True)
class Metric:
    """One reported figure. ``key``: its ``summary.json`` key (None: logged only); ``logged``: its name in
    ``metrics.jsonl`` and W&B (None: summary only); ``required``: every summary must hold it."""

    key: str | None
    logged: str | None
    unit: str
    direction: Direction
    meaning: str
    required: bool = False
    step0: bool = False  # the summary also holds ``<key>_step0``, the value at step 0 (the SFT model)
    compared: bool = False  # the report tests each regime against the baseline on it
    status: Column | None = None  # shown by ``python -m ablate.status``
    label: str | None = None  # short name in the report's tables
    scale: float = 1.0  # shown divided by this (bytes as MiB)
    numeric: bool = True
    inputs: tuple[str, ...] = ()  # the logged metrics ``derive`` reads
    derive: Callable[..., float] | None = None  # value from ``inputs`` (a derived metric)


# fmt: off
#: Every metric, in the order the summary lists them (a table: one entry per metric).
METRICS: list[Metric] = [
    Metric("status", None, "", None,
           "finished | failed | diverged",
           required=True, numeric=False),
    Metric("steps", None, "steps", None,
           "optimiser steps completed",
           required=True, status=Column("steps", 7, "{:d}")),
    Metric("win_rate", "eval/win_rate", "share", "higher",
           "share of the evaluation's responses that beat an independent SFT sample of the same prompt by gold "
           "reward (ties count half); at step 0 it is 0.5 up to sampling noise",
           required=True, compared=True, status=Column("win", 6, "{:.3f}"), label="win rate"),
    Metric("win_rate_lo", "eval/win_rate_lo", "share", None,
           "95% Student-t interval over prompts (a prompt's mean score is one observation), lower end",
           required=True),
    Metric("win_rate_hi", "eval/win_rate_hi", "share", None,
           "95% Student-t interval over prompts, upper end",
           required=True),
    Metric("reward_gold", "eval/reward_gold", "VADER compound", "higher",
           "mean gold reward (VADER compound) of the policy's evaluation responses",
           required=True, compared=True, status=Column("reward", 7, "{:.3f}"), label="gold reward"),
    Metric("reward_gold_sft", "eval/reward_gold_sft", "VADER compound", None,
           "mean gold reward of the SFT model's responses to the same prompts"),
    Metric("reward_delta", "eval/reward_delta", "VADER compound", "higher",
           "paired reward difference: mean over prompts of the policy's gold reward minus the SFT model's on coupled "
           "samples (same prompt, same sample index, same noise); exactly 0 when the policy is the SFT model",
           step0=True),
    Metric("reward_delta_lo", "eval/reward_delta_lo", "VADER compound", None,
           "95% Student-t interval of reward_delta over prompts (each prompt's mean difference one observation), "
           "lower end"),
    Metric("reward_delta_hi", "eval/reward_delta_hi", "VADER compound", None,
           "95% Student-t interval of reward_delta over prompts, upper end"),
    Metric("reward_proxy", "eval/reward_proxy", "learned reward", None,
           "mean learned (proxy) reward of the policy's responses; NaN when the run trains on gold"),
    Metric("kl_true", "kl/true", "nats per response", None,
           "true KL: exact KL(policy || full reference) per response token, summed over each sampled response and "
           "averaged (float64 log-softmax); the judge of truth, whatever the regime",
           required=True, step0=True, compared=True, status=Column("kl_true", 9, "{:.4g}"), label="true KL"),
    Metric("kl_true_k1", "kl/true_k1", "nats per response", None,
           "Schulman's k1 estimate of kl_true from the sampled tokens (unbiased, can be negative)"),
    Metric("kl_true_k3", "kl/true_k3", "nats per response", None,
           "Schulman's k3 estimate of kl_true from the sampled tokens (unbiased, >= 0)"),
    Metric("kl_approx", "kl/approx", "nats per response", None,
           "stand-in divergence: exact KL(policy || the regime's reference) on the same fresh evaluation samples. It "
           "is the KL a KL-penalised algorithm (PPO/GRPO) would see; DPO never computes a KL and consumes only "
           "sequence log-probs of its training pairs, so for DPO it describes the stand-in, not what training used. "
           "NaN where the stand-in has no next-token distribution (cached) or there is none (none)",
           required=True, step0=True, status=Column("standin", 9, "{:.4g}"), label="stand-in div."),
    Metric("kl_abs_err", "kl/abs_err", "nats per response", "lower",
           "|kl_approx - kl_true| (nats per response)",
           required=True, step0=True, status=Column("kl_err", 9, "{:.2e}"), label="stand-in error"),
    Metric("logp_mae", "kl/logp_mae", "nats per token", "lower",
           "mean absolute error of the stand-in's per-token log-probs against the full reference's, on the policy's "
           "evaluation samples",
           step0=True),
    Metric("logp_rmse", "kl/logp_rmse", "nats per token", "lower",
           "root-mean-square of the same per-token log-prob error",
           step0=True),
    Metric("logp_max_err", "kl/logp_max_err", "nats per token", "lower",
           "largest absolute per-token log-prob error",
           step0=True),
    # fidelity of what the algorithm consumes (ablate.eval.fidelity): truth = the full reference in fp32
    Metric("margin_err_mean", "kl/margin_err_mean", "nats", None,
           "DPO: mean signed error of the regime's reference margin log ref(y_w) - log ref(y_l), as training receives "
           "it, against the full reference in fp32, over the training pairs",
           step0=True, label="margin err."),
    Metric("margin_err_sd", "kl/margin_err_sd", "nats", "lower",
           "DPO: standard deviation of that margin error over the training pairs",
           step0=True, label="margin err. sd"),
    Metric("margin_err_max", "kl/margin_err_max", "nats", "lower",
           "DPO: largest absolute margin error over the training pairs",
           step0=True, label="margin err. max"),
    Metric("dpo_loss", "kl/dpo_loss", "nats", None,
           "DPO: the trainer's own loss on its first batch of training pairs under the regime (TRL's, as it "
           "logs it at step 1); at step 0 ln 2 = 0.6931 for the sigmoid loss when the regime equals the policy",
           step0=True, label="DPO loss"),
    Metric("kl_penalty_err_mean", "kl/penalty_err_mean", "nats per token", None,
           "GRPO/PPO: mean signed error of the per-token KL penalty with the run's estimator, the regime's against the "
           "full reference's in fp32, on the policy's fresh evaluation samples (a row without a reference term: 0)",
           step0=True, label="penalty err."),
    Metric("kl_penalty_err_sd", "kl/penalty_err_sd", "nats per token", "lower",
           "GRPO/PPO: standard deviation of that per-token penalty error",
           step0=True, label="penalty err. sd"),
    Metric("grad_cos", "kl/grad_cos", "cosine", "higher",
           "cosine between the gradients of the trainer's own loss on its first batch under the regime and under the "
           "full reference in fp32 (same batch, same weights; DPO: the first pairs its loader yields; GRPO/PPO: "
           "rollouts of its first prompts, drawn as it draws them; ablate/algos/loss_probe.py); 1 when exact",
           step0=True, label="grad. cosine"),
    Metric("ppl", "eval/ppl", "perplexity", "lower",
           "perplexity of the policy on held-out plain text",
           required=True, compared=True, label="perplexity"),
    Metric("length", "eval/length", "tokens", None,
           "mean response length in tokens (EOS included; a response ends at its EOS, at the task's stop rule "
           "(task.max_sentences) or at task.max_new_tokens)",
           required=True, compared=True, label="length"),
    Metric("truncation_rate", "eval/truncation_rate", "share", None,
           "share of the policy's evaluation responses that reached task.max_new_tokens before their EOS or the "
           "task's stop rule ended them (their length, reward and KL are of a cut-off response)",
           step0=True),
    Metric("rep_2", "eval/rep_2", "share", "lower",
           "mean share of repeated bigrams within a response",
           required=True, compared=True, label="rep. bigrams"),
    Metric("distinct_2", "eval/distinct_2", "share", "higher",
           "distinct bigrams over all bigrams across the responses",
           required=True),
    Metric("degenerate_rate", "eval/degenerate_rate", "share", "lower",
           "share of responses at least half of whose word bigrams repeat an earlier one of their own, or with fewer "
           "than two words (ablate.eval.metrics.degenerate_share): the collapse an unanchored policy drifts into",
           compared=True, label="degenerate"),
    Metric("ppl_sft", "eval/ppl_sft", "perplexity", "lower",
           "perplexity of the policy's evaluation responses under the SFT model (the full reference): exp of their "
           "summed negative log-likelihood over their tokens (EOS included); each response's sum is the sft_nll "
           "column of samples.jsonl",
           compared=True, label="SFT ppl."),
    Metric("unsafe_rate", "eval/unsafe_rate", "share", "lower",
           "share of responses the safety judge scores at or above task.unsafe_threshold",
           required=True, compared=True, label="unsafe rate"),
    Metric(None, "eval/unsafe_rate_sft", "share", None,
           "share of the SFT model's responses the safety judge scores at or above task.unsafe_threshold"),
    Metric("ref_bytes", "cost/ref_bytes", "bytes", "lower",
           "bytes the reference holds in memory (weights, adapters, caches)",
           required=True, status=Column("ref_MiB", 8, "{:.1f}"), label="ref. MiB", scale=MIB),
    Metric("ref_bytes_vs_bf16", None, "ratio", "lower",  # the regime's cost extra (logged: cost/ref_bytes_vs_bf16)
           "ref_bytes over the bytes of a bf16 full copy of the reference model (2 per parameter): 2 for full (the "
           "fp32 truth), 0 for shared and none (no weights of their own)"),
    Metric("ref_ms_per_step", "cost/ref_ms_per_step", "ms", "lower",
           "reference time per optimiser step (training calls only, not audits)",
           required=True, status=Column("ref_ms", 7, "{:.0f}"), label="ref. ms/step"),
    Metric("ref_setup_s", "cost/ref_setup_s", "s", "lower",
           "one-off reference set-up: load, quantise, distil, precompute"),
    Metric("ref_cache_bytes", "cost/ref_cache_bytes", "bytes", "lower",
           "bytes the reference keeps on disk (caches)"),
    Metric("ref_forward_calls", "cost/ref_forward_calls", "calls", None,
           "reference forward calls while training"),
    Metric("loss_extra_bytes", None, "bytes", "lower",
           "bytes the loss holds beyond the policy and the reference (algo.l2_init's copy of the initial weights; "
           "0 without it), not in ref_bytes"),
    Metric("kl_zero_gradient_ablation", None, "", None,
           "GRPO/PPO: true when the run asked for k1 in the loss (algo.kl_placement=loss, algo.kl_estimator=k1), "
           "whose expected gradient on policy is 0: an ablation of that known mistake, not a KL penalty",
           numeric=False),
    Metric("wall_s", None, "s", "lower",
           "wall time of the job, earlier attempts of a resumed job included",
           required=True),
    Metric("train_s", None, "s", "lower",
           "wall time of training (optimiser steps with their data, rollouts and reference calls), without the "
           "evaluations during it; earlier attempts of a resumed job included"),
    Metric("eval_s", None, "s", "lower",
           "wall time of the evaluations (step 0, interim, final), SFT baselines included; eval_phases_s splits it"),
    Metric("peak_rss_bytes", None, "bytes", "lower",
           "peak resident memory of the job's process (a reused launcher worker carries earlier jobs' peak)"),
    Metric("disk_bytes_written", None, "bytes", "lower",
           "bytes the job's process wrote to storage (Linux /proc/self/io write_bytes): checkpoints, pruned ones "
           "included, caches it built, its run folder; earlier attempts of a resumed job included; not W&B's "
           "own service process"),
]
# fmt: on

#: The summary keys that are not figures of the metric schema: what the job was, how it ran, what it reused. A
#: regime's own figures (``ref_<name>``) are documented on its class (``Reference.EXTRA_DOCS``, ``ablate.refs``).
JOB_KEYS: dict[str, str] = {
    "regime": "the reference regime the run trained with (ref.name)",
    "algo": "the algorithm (algo.name)",
    "model": "the model preset (model.name)",
    "seed": "the run's seed",
    "reason": "why the run stopped early or failed (absent when it finished)",
    "resumed_from_step": "the step a resumed job continued from (absent when it never resumed)",
    "provenance": "the code (git commit, +dirty with uncommitted changes), library versions, hardware, world size, and `bf16`: whether the device computes bf16 natively (what `model.precision=auto` read)",
    "nan_reasons": "summary key -> why its value is NaN (null in JSON), for every figure that could not be computed",
    "data": "task=dataset: the data's path, sha256 and content fingerprint, the split rule, the split sizes (prompts "
    "per split, training pairs) and the rows dropped by rule, with their reasons (ablate.tasks.dataset)",
    "n_pairs": "preference pairs loaded: DPO's training data, what cached and distilled are built from",
    "pairs_cache": "the content-addressed folder the pairs were read from or written to",
    "pairs_cache_hit": "true when the pairs came from the cache (an earlier job: same model, prompts, settings)",
    "sft_baseline_cache_hit": "true when the SFT baseline's evaluation samples came from the cache",
    "eval_phases_s": "eval_s by phase (SFT baseline, sampling, KL audit, perplexity, fidelity, reward and safety "
    "scores, metrics), summed over the job's evaluations",
    "peak_rss_train_bytes": "peak resident memory while training (models loaded, data ready, evaluations inside it)",
    "kl_coef_final": "the KL coefficient at the end of training (PPO/GRPO: the controller's; DPO: its fixed beta)",
    # algo.reward=learned: the proxy reward model's training (ablate.tasks.reward_model; cached, so a cache hit
    # repeats the figures of the job that trained it)
    "reward_model_n_pairs": "algo.reward=learned: the gold-labelled preference pairs the proxy reward model learned from",
    "reward_model_final_loss": "algo.reward=learned: the proxy reward model's training loss at its last logged step",
    "reward_model_final_accuracy": "algo.reward=learned: the proxy reward model's pair accuracy at its last logged "
    "training step (on training pairs: not a held-out figure)",
    "reward_model_train_s": "algo.reward=learned: seconds the proxy reward model took to train (when it was trained)",
}


#: The report's tables: their summary columns in order (``<key>_step0``: the value at step 0).
REPORT_TABLES: dict[str, tuple[str, ...]] = {
    "fidelity": ("kl_abs_err_step0", "kl_abs_err", "kl_true", "kl_approx", "ref_bytes", "ref_ms_per_step"),
    "behaviour": ("win_rate", "reward_gold", "ppl", "ppl_sft", "length", "rep_2", "degenerate_rate", "unsafe_rate"),
    # what the algorithm itself consumed from its reference, against the full reference (ablate.eval.fidelity)
    "consumed": (
        "margin_err_mean",
        "margin_err_sd",
        "margin_err_max",
        "kl_penalty_err_mean",
        "kl_penalty_err_sd",
        "grad_cos",
    ),
}


# ------------------------------------------------------------------------------------------------ queries
def summary_metrics() -> list[Metric]:
    """The metrics with a ``summary.json`` key, in summary order."""
    return [m for m in METRICS if m.key is not None]


def metric(key: str) -> Metric:
    """The metric whose summary key is ``key`` (``<key>_step0`` gives its step-0 copy's metric)."""
    base = key.removesuffix("_step0")
    for m in summary_metrics():
        if m.key == base and (base == key or m.step0):
            return m
    raise KeyError(f"no metric {key!r} in ablate.tracking.schema")


def logged(key: str) -> str:
    """The logged name (``eval/...``, ``kl/...``) of the summary key ``key``."""
    name = metric(key).logged
    if name is None:
        raise KeyError(f"metric {key!r} is not logged")
    return name


def required_keys() -> tuple[str, ...]:
    """The keys every ``summary.json`` holds."""
    return tuple(m.key for m in summary_metrics() if m.required)


def docs() -> dict[str, str]:
    """Summary key -> one-line meaning: the metrics' and the job's own (:data:`JOB_KEYS`)."""
    return {m.key: m.meaning for m in summary_metrics()} | JOB_KEYS


def _from_sections(sections: tuple[str, ...]) -> dict[str, str]:
    return {m.key: m.logged for m in summary_metrics() if m.logged and m.logged.startswith(sections)}


def from_eval() -> dict[str, str]:
    """Summary key <- logged name, for the figures the summary takes from the last evaluation."""
    return _from_sections(EVAL_SECTIONS)


def from_cost() -> dict[str, str]:
    """Summary key <- logged name, for the reference's cost figures."""
    return _from_sections(("cost/",))


def step0_keys() -> tuple[str, ...]:
    """The summary keys that also have a ``<key>_step0`` copy."""
    return tuple(m.key for m in summary_metrics() if m.step0)


def status_columns() -> list[tuple[Metric, Column]]:
    """What ``python -m ablate.status`` shows, in order."""
    return [(m, m.status) for m in summary_metrics() if m.status is not None]


def report_columns() -> list[str]:
    """Every numeric summary column the report aggregates over seeds (step-0 copies included)."""
    keys = [m.key for m in summary_metrics() if m.numeric]
    return keys + [f"{k}_step0" for k in step0_keys()]


def compared_keys() -> list[str]:
    """The summary keys the report compares with the baseline regime."""
    return [m.key for m in summary_metrics() if m.compared]


def header(column: str, table: tuple[str, ...] = ()) -> str:
    """A report table's header for ``column``: its label, with ``step 0`` / ``end`` when both appear."""
    label = metric(column).label or column
    if column.endswith("_step0"):
        return f"{label}, step 0"
    return f"{label}, end" if f"{column}_step0" in table else label


# ------------------------------------------------------------------------------------------- derived ones
def complete(metrics: Mapping[str, float]) -> dict[str, float]:
    """``metrics`` (logged names) with every derived metric added that it does not hold yet (NaN when an
    input is missing or NaN: never a made-up value)."""
    out = dict(metrics)
    for m in METRICS:
        if m.derive is None or m.logged in out:
            continue
        values = [out.get(name, math.nan) for name in m.inputs]
        out[m.logged] = math.nan if any(_is_nan(v) for v in values) else float(m.derive(*values))
    return out


def logged_reasons(reasons: Mapping[str, str], metrics: Mapping[str, float]) -> dict[str, str]:
    """An evaluation's reasons (by summary key) by logged name, for the ``metrics`` (logged names) that are NaN;
    an infinity keeps the run folder's own reason (it was computed, not missing)."""
    out = {}
    for m in summary_metrics():
        v = metrics.get(m.logged) if m.logged else None
        if isinstance(v, float) and math.isnan(v) and m.key in reasons:
            out[m.logged] = reasons[m.key]
    return out


def derived_reasons(reasons: Mapping[str, str], suffix: str = "") -> dict[str, str]:
    """Why each derived summary key is NaN when an input is: the input's own reason, when it has one."""
    by_logged = {m.logged: m.key for m in summary_metrics() if m.logged}
    out = {}
    for m in summary_metrics():
        if m.derive is None:
            continue
        why = [reasons.get(f"{by_logged.get(name)}{suffix}") for name in m.inputs]
        given = [w for w in why if w]
        out[f"{m.key}{suffix}"] = given[0] if given else f"computed from {', '.join(m.inputs)}: an input is NaN"
    return out


def _is_nan(v) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


@contextmanager
def registered(*extra: Metric) -> Iterator[None]:
    """Add metrics to the schema for the duration of a ``with`` block (tests)."""
    METRICS.extend(extra)
    try:
        yield
    finally:
        for m in extra:
            METRICS.remove(m)
