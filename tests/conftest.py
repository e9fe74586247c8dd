"""Shared fixtures: one content-addressed cache per test session, tiny real models, and the tiny config."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# Under pytest-xdist (`.ci/run` runs two workers on the CI's two cores) each worker, and every job a test starts, gets
# one torch thread: two processes with a thread per core each spin their OpenMP threads against each other and run
# several times slower than one after the other. Set before anything imports torch, which reads it once.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["OMP_NUM_THREADS"] = "1"

# With `--dist loadfile` each test file runs on one worker (a module-scoped fixture is built once), and so does each
# folder here, whose files share a session fixture: the analysis tests' tiny sweep took 100 s a worker.
SHARED_FIXTURE_FOLDERS = ("tests/analysis/",)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """``--dist loadfile``, but a folder in SHARED_FIXTURE_FOLDERS is one unit (pytest-xdist's own ``loadgroup``
    reads groups into test ids the way pytest 9.2 no longer keeps them, and silently schedules test by test)."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class FileOrSharedFolderScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return next((folder for folder in SHARED_FIXTURE_FOLDERS if path.startswith(folder)), path)

    return FileOrSharedFolderScheduling(config, log)


@pytest.fixture(scope="session", autouse=True)
def _session_env(tmp_path_factory):
    """Hermetic cache and W&B for the whole session (the SmolLM2 tokenizer is extracted once)."""
    cache = os.environ.get("ABLATE_TEST_CACHE") or str(tmp_path_factory.mktemp("ablate_cache"))
    os.environ["ABLATE_CACHE"] = cache
    # transformers prints a line when its W&B integration is first imported under WANDB_MODE=offline: import it
    # first, so that no test's captured output depends on whether an earlier test in its worker imported it
    import transformers.integrations.integration_utils  # noqa: F401

    os.environ["WANDB_MODE"] = "offline"
    os.environ["WANDB_SILENT"] = "true"
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    yield


@pytest.fixture(scope="session")
def cache_root(_session_env) -> Path:
    return Path(os.environ["ABLATE_CACHE"])


@pytest.fixture(scope="session")
def tiny_source(cache_root):
    from ablate.config import TinyModelConfig
    from ablate.models.loading import resolve_source

    return resolve_source(TinyModelConfig(), cache_root)


@pytest.fixture(scope="session")
def tokenizer(tiny_source):
    from ablate.models.loading import load_tokenizer

    return load_tokenizer(tiny_source)


@pytest.fixture
def tiny_model(tiny_source):
    import torch

    from ablate.models.loading import load_model

    return load_model(tiny_source, torch.device("cpu"))


def compose(*overrides: str):
    """The composed config before it is typed (as Hydra hands it to ``python -m ablate <overrides>``)."""
    from ablate.compose import compose_raw

    return compose_raw(*overrides)


def typed_config(out_dir, *overrides: str):
    """The typed config objects for ``overrides``, writing to ``out_dir``."""
    from ablate.compose import compose as compose_typed

    return compose_typed(*overrides, out_dir=out_dir)


TINY_FAST = [
    "model=tiny",
    "algo.max_steps=3",
    "eval.interval=2",
    "task.n_train=6",
    "eval.n_prompts=4",
    "eval.samples_per_prompt=1",
    "task.max_new_tokens=16",
    "task.samples_per_prompt=4",
    "algo.batch_size=2",
    "logger=none",
]


def free_port() -> int:
    """A TCP port on localhost that nothing listens on now (for a test's process group)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_cli(*args: str, cwd: Path | str = REPO, timeout: int = 600, env: dict | None = None):
    """``python -m ablate <args>`` in a subprocess; returns CompletedProcess (text)."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "ablate", *args], cwd=cwd, capture_output=True, text=True, timeout=timeout, env=full_env
    )


# logger.tags: 4 tags of 60 characters, harmless to a run, that name a sweep job's folder past a file name's 255 bytes
LONG_NAME_TAGS = "logger.tags=[" + ",".join(c * 60 for c in "abcd") + "]"


def run_sweep(
    *args: str, sweep: Path, cwd: Path | str = REPO, timeout: int = 600
) -> tuple[subprocess.CompletedProcess, list[Path]]:
    """``python -m ablate -m <args>`` into the folder ``sweep``: one process for every job (one set of imports),
    and the jobs' folders in the sweep's order (Hydra's job numbers)."""
    res = run_cli(
        "-m", *args, f"hydra.sweep.dir={sweep}", "hydra.sweep.subdir=${hydra.job.num}", cwd=cwd, timeout=timeout
    )
    folders = [p for p in sweep.iterdir() if p.is_dir() and p.name.isdigit()] if sweep.is_dir() else []
    return res, sorted(folders, key=lambda p: int(p.name))


def popen_cli(*args: str, log: Path, cwd: Path | str = REPO) -> subprocess.Popen:
    """``python -m ablate <args>`` started in a subprocess, its stdout and stderr to the file ``log`` (a pipe nobody
    reads can fill and stall it), for a test that runs something beside it."""
    with open(log, "w") as out:
        return subprocess.Popen([sys.executable, "-m", "ablate", *args], cwd=cwd, stdout=out, stderr=subprocess.STDOUT)


@pytest.fixture
def ref_ctx(tiny_source, tokenizer):
    """A RefContext over the tiny model, on CPU."""
    import torch

    from ablate.models.loading import load_model
    from ablate.refs.base import RefContext

    cpu = torch.device("cpu")
    return RefContext(
        model_dir=str(tiny_source.path),
        model_fingerprint=tiny_source.fingerprint,
        tokenizer=tokenizer,
        device=cpu,
        load_model=lambda **kw: load_model(tiny_source, cpu, **kw),
    )


def tiny_evaluator(tiny_source, tokenizer, *, n_heldout: int = 6, **overrides):
    """An Evaluator on CPU whose judge is a fresh load of the tiny model: 6 evaluation prompts, the first
    ``n_heldout`` held-out texts, the gold reward and the safety judge, eval batches of 4, 12 new tokens, run seed
    0. ``overrides`` replace any of the Evaluator's keyword arguments."""
    import torch

    from ablate.config import EvalConfig, TaskConfig
    from ablate.eval.evaluator import Evaluator
    from ablate.models.loading import load_model
    from ablate.tasks.heldout import heldout_texts
    from ablate.tasks.prompts import make_prompts
    from ablate.tasks.reward import GoldReward
    from ablate.tasks.safety import SafetyJudge

    cpu = torch.device("cpu")
    if "judge" not in overrides:
        overrides["judge"] = load_model(tiny_source, cpu)
    defaults = dict(
        tokenizer=tokenizer,
        prompts=make_prompts(1, 6, 1)["eval"],
        heldout=heldout_texts()[:n_heldout],
        reward=GoldReward(),
        safety=SafetyJudge(),
        eval_cfg=EvalConfig(batch_size=4, samples_per_prompt=1),
        task_cfg=TaskConfig(max_new_tokens=12),
        run_seed=0,
        device=cpu,
    )
    return Evaluator(**{**defaults, **overrides})


def token_batch(tokenizer, prompts, responses):
    """Right-padded prompt+response batch with a completion mask, like TRL's collator builds."""
    import torch

    from ablate.refs.base import TokenBatch

    rows, masks = [], []
    for p, r in zip(prompts, responses):
        p_ids = tokenizer(p, add_special_tokens=False)["input_ids"]
        r_ids = tokenizer(r, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        rows.append(p_ids + r_ids)
        masks.append([0] * len(p_ids) + [1] * len(r_ids))
    width = max(map(len, rows))
    ids = torch.full((len(rows), width), tokenizer.pad_token_id)
    att = torch.zeros((len(rows), width), dtype=torch.long)
    comp = torch.zeros((len(rows), width), dtype=torch.long)
    for i, (row, m) in enumerate(zip(rows, masks)):
        ids[i, : len(row)] = torch.tensor(row)
        att[i, : len(row)] = 1
        comp[i, : len(row)] = torch.tensor(m)
    return TokenBatch(ids, att, comp)
