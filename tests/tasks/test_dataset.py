"""``task=dataset``: the user's data read as the harness reads its own task (ablate.tasks.dataset), without a model."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from ablate.config import DatasetTaskConfig
from ablate.tasks.dataset import DataError, drop_long_prompts, hashed_split, load_task
from ablate.tasks.prompts import as_chat, from_chat


def jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def pair(i: int, split: str | None = None, **extra) -> dict:
    row = {"prompt": f"Review film {i}.", "chosen": f"Film {i} is wonderful.", "rejected": f"Film {i} is dull."}
    if split:
        row["split"] = split
    return {**row, **extra}


def task(path, **kw) -> DatasetTaskConfig:
    return DatasetTaskConfig(path=str(path), **kw)


def test_pairs_with_their_own_split(tmp_path):
    rows = [pair(i, "train") for i in range(5)] + [pair(i, "test") for i in range(5, 8)]
    data = load_task(task(jsonl(tmp_path / "d.jsonl", rows)), n_eval=2)
    assert data.prompts == {
        "train": [f"Review film {i}." for i in range(5)],
        "eval": ["Review film 5.", "Review film 6."],
        "test": ["Review film 7."],
    }
    assert [p.chosen for p in data.pairs] == [f"Film {i} is wonderful." for i in range(5)]
    assert data.sizes() == {"train_prompts": 5, "eval_prompts": 2, "test_prompts": 1, "train_pairs": 5}
    assert data.split_rule == "the data's 'split' column" and data.dropped == {}


def test_a_made_split_is_disjoint_by_prompt_and_stable(tmp_path):
    """Two rows per prompt: the split keeps both on one side; the same seed gives the same split in any order."""
    rows = [pair(i) for i in range(200)] + [pair(i, chosen=f"Film {i} is fine.") for i in range(200)]
    cfg = task(jsonl(tmp_path / "d.jsonl", rows), test_fraction=0.2, split_seed=3)
    data = load_task(cfg, n_eval=1000)
    assert not set(data.prompts["train"]) & set(data.prompts["eval"])
    assert 20 <= len(data.prompts["eval"]) <= 60  # 20% of 200 distinct prompts, by hash
    assert len(data.pairs) == 2 * len(data.prompts["train"])
    shuffled = load_task(task(jsonl(tmp_path / "e.jsonl", rows[::-1]), test_fraction=0.2, split_seed=3), 1000)
    assert set(shuffled.prompts["eval"]) == set(data.prompts["eval"])
    assert all(hashed_split(p, 3, 0.2) == "test" for p in data.prompts["eval"])
    other = load_task(task(tmp_path / "d.jsonl", test_fraction=0.2, split_seed=4), 1000)
    assert set(other.prompts["eval"]) != set(data.prompts["eval"])


def test_separate_files_csv_and_parquet(tmp_path):
    import pandas as pd

    pd.DataFrame([pair(i) for i in range(4)]).to_csv(tmp_path / "train.csv", index=False)
    pd.DataFrame([{"prompt": f"Review song {i}."} for i in range(3)]).to_parquet(tmp_path / "test.parquet")
    data = load_task(task(tmp_path / "train.csv", test_path=str(tmp_path / "test.parquet")), n_eval=8)
    assert len(data.pairs) == 4 and data.prompts["eval"] == [f"Review song {i}." for i in range(3)]
    assert data.split_rule.startswith("files: ")


def test_a_prompts_only_file_has_no_pairs(tmp_path):
    rows = [{"prompt": f"Say something about {i}.", "split": s} for i, s in enumerate(["train"] * 4 + ["test"] * 2)]
    data = load_task(task(jsonl(tmp_path / "p.jsonl", rows)), n_eval=2)
    assert data.pairs is None and len(data.prompts["train"]) == 4


def test_rows_without_a_pair_are_prompts_for_online_training(tmp_path):
    rows = [pair(0, "train"), {"prompt": "Alone.", "chosen": None, "rejected": None, "split": "train"}]
    rows.append(pair(1, "test"))
    data = load_task(task(jsonl(tmp_path / "d.jsonl", rows)), n_eval=1)
    assert data.prompts["train"] == ["Review film 0.", "Alone."] and len(data.pairs) == 1


def test_conversational_fields_render_with_the_chat_template(tmp_path, tokenizer):
    """A one-turn prompt is its text (rendered exactly as a plain prompt); a system turn is kept; a response
    conversation is its last, assistant, message."""
    system = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Review film 1."}]
    rows = [
        {"prompt": [{"role": "user", "content": "Review film 0."}], "chosen": [{"role": "assistant", "content": "Good."}],
         "rejected": [{"role": "assistant", "content": "Bad."}], "split": "train"},
        {"prompt": system, "chosen": "Fine.", "rejected": "Poor.", "split": "train"},
        pair(2, "test"),
    ]  # fmt: skip
    data = load_task(task(jsonl(tmp_path / "c.jsonl", rows)), n_eval=1)
    assert data.prompts["train"][0] == "Review film 0." and data.pairs[0].chosen == "Good."
    assert as_chat(data.prompts["train"][1]) == system and from_chat(system) == data.prompts["train"][1]
    rendered = tokenizer.apply_chat_template(as_chat(data.prompts["train"][1]), tokenize=False)
    assert "Be brief." in rendered and "Review film 1." in rendered


def test_documented_drops_are_counted(tmp_path):
    rows = [pair(0, "train"), pair(0, "train"), pair(1, "train", rejected="Film 1 is wonderful."), pair(2, "train")]
    rows += [pair(0, "test"), pair(3, "test")]  # film 0 is a training prompt: the held-out row is dropped
    data = load_task(task(jsonl(tmp_path / "d.jsonl", rows)), n_eval=4)
    assert data.dropped == {"duplicate_pair": 1, "chosen_equals_rejected": 1, "test_prompt_in_train": 1}
    assert [p.prompt for p in data.pairs] == ["Review film 0.", "Review film 2."]
    assert data.prompts["eval"] == ["Review film 3."]


def test_a_prompt_that_fills_max_length_is_dropped_and_counted(tmp_path, tokenizer):
    rows = [pair(0, "train"), pair(1, "train", prompt="word " * 300), pair(2, "test")]
    data = load_task(task(jsonl(tmp_path / "d.jsonl", rows)), n_eval=1)
    drop_long_prompts(data, tokenizer, max_length=64)
    assert data.dropped == {"prompt_fills_max_length": 1} and len(data.pairs) == 1
    with pytest.raises(DataError, match="every pair's prompt alone fills algo.max_length=4 tokens"):
        drop_long_prompts(data, tokenizer, max_length=4)


def test_heldout_text_choices(tmp_path):
    rows = [pair(0, "train"), pair(1, "test")]
    path = jsonl(tmp_path / "d.jsonl", rows)
    assert load_task(task(path, heldout="chosen"), 1).heldout == ["Film 1 is wonderful."]
    (tmp_path / "h.txt").write_text("one line\n\nanother\n")
    assert load_task(task(path, heldout=str(tmp_path / "h.txt")), 1).heldout == ["one line", "another"]
    assert len(load_task(task(path), 1).heldout) > 10  # builtin


def test_the_fingerprint_follows_the_content(tmp_path):
    a = load_task(task(jsonl(tmp_path / "a.jsonl", [pair(0, "train"), pair(1, "test")])), 1)
    b = load_task(task(jsonl(tmp_path / "b.jsonl", [pair(0, "train"), pair(1, "test")])), 1)
    c = load_task(task(jsonl(tmp_path / "c.jsonl", [pair(0, "train"), pair(2, "test")])), 1)
    assert a.fingerprint == b.fingerprint != c.fingerprint and a.sha256 == b.sha256 != c.sha256


def test_a_folder_of_split_files_loads_through_datasets(tmp_path):
    """A dataset (here a folder whose files ``datasets`` splits by name, as it splits a hub dataset's) keeps its own
    train and test splits."""
    folder = tmp_path / "my_dataset"
    folder.mkdir()
    jsonl(folder / "train.jsonl", [pair(i) for i in range(3)])
    jsonl(folder / "test.jsonl", [{"prompt": "Review a song."}, {"prompt": "Review a poem."}])
    data = load_task(task(folder), n_eval=1)
    assert data.split_rule == "the dataset's train / test splits" and len(data.pairs) == 3
    assert data.prompts["eval"] == ["Review a song."] and data.prompts["test"] == ["Review a poem."]


def test_an_unknown_dataset_id_offline_is_one_line():
    """In a fresh process, as a run meets it: ``datasets`` reads HF_DATASETS_OFFLINE when it is imported, so setting
    it in this process after another test imported ``datasets`` would test the unreachable network instead (and
    wait out its retries)."""
    code = (
        "from ablate.config import DatasetTaskConfig\n"
        "from ablate.errors import AblateError\n"
        "from ablate.tasks.dataset import load_task\n"
        "try:\n"
        "    load_task(DatasetTaskConfig(path='nobody-xyz/no-such-data'), n_eval=1)\n"
        "except AblateError as e:\n"
        "    print(e)\n"
    )
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("\n") == 1 and "task.path=nobody-xyz/no-such-data" in done.stdout
    assert "OfflineModeIsEnabled" in done.stdout, done.stdout
