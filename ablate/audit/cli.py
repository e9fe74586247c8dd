"""``python -m ablate.audit [options] [overrides]``: the command line, its checks and the audit, top to bottom.

``ref=a,b,c`` lists the regimes (default: :func:`default_regimes`); every other ``key=value`` is an ordinary
``python -m ablate`` override (``model=tiny``, ``model=hf model.name_or_path=...``, ``model.precision=fp32``,
``task.n_train=...``, ``algo.beta=...``), composed once per regime and checked as the CLI checks a job. Bad input
(an override, the data file, a tokenizer that cannot serve) is one line on stderr and exit code 2, before any model
loads. Progress goes to stderr; the report to stdout and ``--out``.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import shlex
import sys
import time
from pathlib import Path

from ablate.audit.data import AuditInputError, prompts_of, read_pairs
from ablate.errors import AblateError, ConfigError

DEFAULT_PROMPTS = 16


def default_regimes() -> list[str]:
    """The regimes measured when ``ref=`` lists none: those that declare ``audited`` (:func:`ablate.refs.regime_names`)."""
    from ablate.refs import regime_names

    return regime_names("audit")


class _Parser(argparse.ArgumentParser):
    """argparse whose errors are one line (raised, printed by :func:`main`)."""

    def error(self, message: str):
        raise AuditInputError(f"{message} (see python -m ablate.audit --help)")


def parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="python -m ablate.audit",
        description="Is a stand-in reference good enough for my model and my data? The fidelity of each regime's "
        "reference at step 0, against the exact full reference, side by side.",
    )
    p.add_argument("overrides", nargs="*", help="ref=full,int8,... and ablate overrides (model=..., task....)")
    p.add_argument("--data", help="a file of preference pairs (JSONL, JSON, CSV or Parquet; prompt, chosen, rejected: "
                   "docs/data.md) (default: the task's pairs and train prompts; or task=dataset task.path=...)")  # fmt: skip
    p.add_argument("--out", help="output folder (default: runs/audit/<timestamp>)")
    p.add_argument("--n-prompts", type=int, default=DEFAULT_PROMPTS, help="prompts sampled fresh, one response each")
    p.add_argument("--n-pairs", type=int, default=None, help="pairs measured (default: all)")
    return p


def split_regimes(overrides: list[str]) -> tuple[list[str], list[str]]:
    """(the regimes ``ref=a,b`` lists, in order and once each, else the defaults; the other overrides)."""
    regimes, rest = [], []
    for o in overrides:
        key, sep, value = o.partition("=")
        if sep and key.lstrip("+~") == "ref":
            regimes += [v.strip() for v in value.strip("[]").split(",") if v.strip()]
        else:
            rest.append(o)
    return list(dict.fromkeys(regimes)) or default_regimes(), rest


def _ref_setting(override: str) -> str | None:
    """``k`` for a ``ref.k=...`` override, else None."""
    key = override.partition("=")[0].lstrip("+~")
    return key.split(".")[1] if key.startswith("ref.") and key.count(".") >= 1 else None


def regime_overrides(regime: str, regimes: list[str], overrides: list[str]) -> list[str]:
    """The overrides one regime is composed with: a ``ref.<k>=...`` goes to the regimes whose schema has ``k``
    (``ref=full,topk ref.k=32``), and to every regime when none of them has it (composing then names the
    unknown key); every other override to all."""
    from dataclasses import fields

    from ablate.refs import regime_class

    def has(r: str, k: str) -> bool:
        return k in {f.name for f in fields(regime_class(r).config_cls)}

    keep = []
    for o in overrides:
        k = _ref_setting(o)
        if k is None or has(regime, k) or not any(has(r, k) for r in regimes):
            keep.append(o)
    return keep


def compose_configs(regimes: list[str], overrides: list[str], out: Path) -> dict:
    """The typed run config of each regime (``ref=<regime>`` added to the overrides), validated and checked as the
    CLI checks a job (packages, device, model source); bad input raises one line naming the regime."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from ablate.algos import trl_fence
    from ablate.cli import check_config
    from ablate.compose import compose, hydra_session, register_configs
    from ablate.errors import one_line
    from ablate.refs import regime_class

    register_configs()
    if not any(o.partition("=")[0].lstrip("+~") == "logger" for o in overrides):
        overrides = [*overrides, "logger=none"]  # the audit logs nothing
    for r in regimes:
        regime_class(r)  # an unknown regime: one line listing the choices
    configs = {}
    with hydra_session():
        for r in regimes:
            try:
                configs[r] = compose(*regime_overrides(r, regimes, overrides), f"ref={r}", out_dir=out)
                check_config(configs[r])
            except AblateError as e:
                raise type(e)(f"{e} (ref={r})") from None
            except (HydraException, OmegaConfBaseException, ValueError) as e:
                raise ConfigError(f"{one_line(e)} (ref={r})") from None
    trl_fence.check()
    return configs


def audit_data(cfg, inputs, data: list | None, path: str | None, n_pairs: int | None):
    """(every pair, the pairs measured, the prompts sampled fresh, where they come from): the user's pairs (read
    from ``path``) and their prompts, or the task's pairs (cached; generated on a miss) and train prompts."""
    if data is not None:
        pairs, prompts, where = data, prompts_of(data), str(path)
    else:
        pairs, hit, entry = inputs.pairs(cfg)
        prompts, where = inputs.prompts["train"], f"task {cfg.task.name} pairs ({'cache hit' if hit else 'generated'})"
        if not pairs:
            raise AuditInputError(f"the task gave no preference pairs ({entry.path}): every response tied")
    return pairs, pairs[:n_pairs] if n_pairs else pairs, prompts, where


def settings(cfg, inputs, data_label: str, batches: list, n_fresh: int) -> dict:
    """What the figures were measured with, for the report and ``audit.json``."""
    from ablate.audit.measure import dpo_settings, online_settings

    d, o = dpo_settings(cfg), online_settings(cfg)
    return {
        "model": cfg.model.name_or_path if cfg.model.name == "hf" else cfg.model.name,
        "model_fingerprint": inputs.source.fingerprint,
        "precision": f"model {cfg.model.precision} (training calls), eval {cfg.eval.precision} (samples, KL); "
        f"truth: full reference in fp32",
        "data": f"{data_label}: {sum(len(b.input_ids) // 2 for b in batches)} pairs in {len(batches)} DPO batches "
        f"of up to {d.batch_size}",
        "dpo": f"beta {d.beta}, loss {d.loss_type}, max_length {d.max_length}",
        "online_algo": o.name,
        "online": f"{o.name}: beta {o.beta}, estimator {o.kl_estimator} in the {o.placement()}, batch {o.batch_size}"
        + (f", {o.num_generations} generations" if hasattr(o, "num_generations") else ""),
        "fresh_samples": f"{n_fresh} prompts, 1 response each, up to {cfg.task.max_new_tokens} new tokens "
        f"(task.max_sentences {cfg.task.max_sentences}), eval.sampler {cfg.eval.sampler}",
        "seed": cfg.seed,
    }


def run(args, command: str, report_to=None) -> int:
    """The audit of every regime the command line lists; bad input raises an AblateError (one line)."""
    import torch

    from ablate.audit import checks, measure, table
    from ablate.inputs import RunInputs

    t0 = time.perf_counter()
    if args.n_prompts < 1 or (args.n_pairs is not None and args.n_pairs < 1):
        raise AuditInputError("--n-prompts and --n-pairs must be >= 1")
    data = read_pairs(args.data) if args.data else None  # bad data: one line before anything else happens
    regimes, overrides = split_regimes(args.overrides)
    out = Path(args.out or f"runs/audit/{time.strftime('%Y-%m-%d_%H-%M-%S')}")
    configs = compose_configs(regimes, overrides, out)
    base = next(iter(configs.values()))
    if base.threads:
        torch.set_num_threads(base.threads)
    inputs = RunInputs.build(base)
    checks.check_model_tokenizer(inputs.tokenizer, inputs.source.path, base.model)
    pairs, measured, prompts, label = audit_data(base, inputs, data, args.data, args.n_pairs)
    batches = measure.probe_batches(base, inputs.tokenizer, measured)
    if not batches:
        limit = measure.dpo_settings(base).max_length
        raise AuditInputError(f"no pair fits: every prompt alone fills algo.max_length={limit} tokens")
    bench = measure.build_bench(base, inputs, pairs, batches, prompts, args.n_prompts)
    rows = [measure.measure_regime(cfg, bench) for cfg in configs.values()]
    info = settings(base, inputs, label, batches, min(args.n_prompts, len(prompts)))
    info["elapsed_s"] = round(time.perf_counter() - t0, 1)
    text = table.report(command, info, rows)
    print(text, end="", file=report_to)
    paths = table.write(out, command, info, rows, text)
    print(f"ablate.audit: wrote {', '.join(map(str, paths))}", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run the audit; returns the exit code (2, with one line on stderr, for bad input)."""
    import os

    argv = sys.argv[1:] if argv is None else list(argv)
    logging.basicConfig(level=logging.INFO, format="[%(asctime)s %(name)s] %(message)s", datefmt="%H:%M:%S")
    for noisy in ("bitsandbytes", "httpx", "urllib3"):
        logging.getLogger(noisy).setLevel(logging.ERROR)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    command = " ".join(["python -m ablate.audit", *map(shlex.quote, argv)])
    try:
        report_to = sys.stdout  # the report's alone: what libraries print on import goes to stderr
        with contextlib.redirect_stdout(sys.stderr):
            return run(parser().parse_intermixed_args(argv), command, report_to)
    except AblateError as e:
        print(f"ablate.audit: error: {e}", file=sys.stderr)
        return 2
