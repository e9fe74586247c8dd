"""Tests for ablate.tasks.prompts."""

import pytest

from ablate.tasks.prompts import as_chat, make_prompts, prompts_fingerprint

SPLITS = ("train", "eval", "test")


def test_deterministic_for_seed():
    assert make_prompts(50, 20, 20, seed=1) == make_prompts(50, 20, 20, seed=1)


def test_sizes_and_keys():
    d = make_prompts(30, 7, 4)
    assert set(d) == set(SPLITS)
    assert [len(d[s]) for s in SPLITS] == [30, 7, 4]


def test_no_duplicates_and_disjoint():
    d = make_prompts(800, 150, 150)
    every = [p for s in SPLITS for p in d[s]]
    assert len(every) == len(set(every))
    for a in SPLITS:
        for b in SPLITS:
            if a != b:
                assert not set(d[a]) & set(d[b])


def test_prefix_property_across_sizes():
    small = make_prompts(10, 5, 5, seed=2)
    big = make_prompts(100, 50, 50, seed=2)
    for s in SPLITS:
        assert big[s][: len(small[s])] == small[s]


def test_split_independent_of_other_counts():
    a = make_prompts(0, 30, 0, seed=4)["eval"]
    b = make_prompts(200, 30, 10, seed=4)["eval"]
    assert a == b


def test_split_assignment_stable_across_seeds():
    d0 = make_prompts(400, 60, 60, seed=0)
    d1 = make_prompts(400, 60, 60, seed=1)
    for a in SPLITS:
        for b in SPLITS:
            if a != b:
                assert not set(d0[a]) & set(d1[b])


def test_different_seeds_differ():
    assert make_prompts(20, 5, 5, seed=0) != make_prompts(20, 5, 5, seed=1)


def test_zero_counts():
    assert make_prompts(0, 0, 0) == {"train": [], "eval": [], "test": []}


@pytest.mark.parametrize("counts", [(-1, 1, 1), (1, -1, 1), (1, 1, -5)])
def test_negative_counts_raise(counts):
    with pytest.raises(ValueError, match="non-negative"):
        make_prompts(*counts)


def test_too_many_raises():
    with pytest.raises(ValueError, match="enough unique prompts"):
        make_prompts(10**12, 0, 0)


def test_supports_five_thousand():
    d = make_prompts(4000, 600, 600, seed=5)
    assert sum(len(v) for v in d.values()) == 5200


def test_both_kinds_appear():
    prompts = make_prompts(200, 0, 0)["train"]
    n_cont = sum(p.startswith("Continue this movie review") for p in prompts)
    assert 0 < n_cont < len(prompts)
    assert any(p.startswith("Write a one-sentence review of the") for p in prompts)


def test_fingerprint():
    p = make_prompts(5, 0, 0)["train"]
    fp = prompts_fingerprint(p)
    assert len(fp) == 64 and int(fp, 16) >= 0
    assert fp == prompts_fingerprint(list(p))
    assert fp != prompts_fingerprint(p[::-1])
    assert prompts_fingerprint(["ab", "c"]) != prompts_fingerprint(["a", "bc"])
    assert prompts_fingerprint([]) != prompts_fingerprint([""])


def test_as_chat():
    assert as_chat("hi there") == [{"role": "user", "content": "hi there"}]
