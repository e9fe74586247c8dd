"""Instruction prompts for the controlled-sentiment task, generated offline.

Two kinds of prompt are mixed: review *prefixes* to continue (IMDb-like, some
neutral or negative in tone) and direct "write a review" instructions, each asking for one sentence (the
task's stop rule ends a response after its first sentence: ablate.stop_rule). Each
candidate is assigned to a split by a stable hash of its text, so the split a
prompt lands in never depends on the requested sizes or on the seed.
"""

from __future__ import annotations

import hashlib
import math
import random
import string

from ablate.chat import as_chat, from_chat
from ablate.config.task import TaskConfig
from ablate.tasks import task_registry

__all__ = ["make_prompts", "prompts_fingerprint", "as_chat", "from_chat"]

_ADJECTIVES = [
    "Silent",
    "Crimson",
    "Broken",
    "Hidden",
    "Last",
    "Golden",
    "Frozen",
    "Distant",
    "Burning",
    "Forgotten",
    "Midnight",
    "Electric",
    "Hollow",
    "Wild",
    "Paper",
    "Iron",
    "Lonely",
    "Restless",
    "Shattered",
    "Velvet",
    "Secret",
    "Endless",
    "Quiet",
    "Savage",
    "Northern",
    "Little",
    "Bitter",
    "Glass",
    "Final",
    "Lucky",
]
_NOUNS = [
    "Harbor",
    "Kingdom",
    "River",
    "Garden",
    "Signal",
    "Empire",
    "Summer",
    "Mirror",
    "Station",
    "Horizon",
    "Orchard",
    "Lighthouse",
    "Circus",
    "Frontier",
    "Engine",
    "Promise",
    "Voyage",
    "Carnival",
    "Winter",
    "Detective",
    "Symphony",
    "Island",
    "Highway",
    "Compass",
    "Letter",
    "Ghost",
    "Parade",
    "Tide",
    "Mountain",
    "Machine",
]
_GENRES = [
    "horror",
    "comedy",
    "drama",
    "science fiction",
    "romance",
    "thriller",
    "western",
    "animated",
    "documentary",
    "fantasy",
    "crime",
    "war",
    "musical",
    "mystery",
    "action",
]
_ASPECTS = [
    "acting",
    "script",
    "cinematography",
    "soundtrack",
    "pacing",
    "ending",
    "special effects",
    "dialogue",
    "direction",
    "editing",
    "costume design",
    "lead performance",
    "supporting cast",
    "plot twists",
    "humor",
]
_PERSONAS = [
    "a film critic",
    "a teenager",
    "a retired teacher",
    "a busy parent",
    "a horror fan",
    "a film student",
    "a grumpy old man",
    "a college professor",
    "a first-time moviegoer",
    "a screenwriter",
    "a history buff",
    "a nurse",
]
_DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
_COMPANIONS = [
    "my sister",
    "my roommate",
    "a friend",
    "my parents",
    "my kids",
    "my coworkers",
    "my partner",
    "my grandmother",
]

_CONTINUE = 'Continue this movie review in one sentence: "{prefix}"'
_PREFIXES = [
    "I went to see {title} on {day} and",
    "I watched {title} with {companion} last {day}, and honestly",
    "I had heard mixed things about {title}, so",
    "Going into {title}, I expected very little, and",
    "{title} is {a_genre} film that",
    "The {aspect} in {title}",
    "I almost walked out of {title} halfway through because",
    "After the trailer for {title}, I was worried that",
    "Critics have been harsh on {title}, but",
    "The first twenty minutes of {title} were slow, and",
    "My expectations for this {genre} movie were low, since",
    "{title} was not what I expected from {a_genre} film:",
    "I rented {title} on a rainy {day} and",
    "Everyone warned me about the {aspect} in {title}, and",
    "This is my second time watching {title}, and",
    "Halfway through {title}, {companion} turned to me and said",
    "I have mixed feelings about {title}. On one hand,",
    "The plot of {title} is simple:",
    "As someone who rarely enjoys {genre} movies, I found that {title}",
    "I paid full price for {title} and",
]
_DIRECT = [
    'Write a one-sentence review of the {genre} film "{title}", focusing on its {aspect}.',
    'Write a one-sentence movie review of "{title}" as {persona} would, mentioning the {aspect}.',
    'In one sentence, tell a friend what you thought of the {genre} movie "{title}".',
    'Give a one-sentence opinion of "{title}", {a_genre} film, commenting on its {aspect}.',
    'You are {persona}. Write a one-sentence review of the {genre} film "{title}".',
    'Describe in one sentence what you thought of the {aspect} in "{title}".',
    'Write a one-sentence IMDb-style review of "{title}", {a_genre} movie, from the point of view of {persona}.',
]

_SEP = "\x00"
# sha256(text) mod 10: 0-7 train, 8 eval, 9 test.
_SPLIT_OF_BUCKET = ["train"] * 8 + ["eval", "test"]
_MAX_STALL = 200_000


def _split_of(text: str) -> str:
    """Return the split for ``text`` from a stable hash of its contents."""
    digest = hashlib.sha256(text.encode("utf-8")).digest()
    return _SPLIT_OF_BUCKET[int.from_bytes(digest[:8], "big") % 10]


def _title(rng: random.Random) -> str:
    """Compose a movie title from the word lists."""
    adj, noun = rng.choice(_ADJECTIVES), rng.choice(_NOUNS)
    form = rng.randrange(3)
    if form == 0:
        return f"The {adj} {noun}"
    if form == 1:
        return f"{adj} {noun}"
    other = rng.choice([n for n in _NOUNS if n != noun])
    return f"{noun} of the {adj} {other}"


def _article(word: str) -> str:
    """Prefix ``word`` with "a" or "an"."""
    return ("an " if word[0] in "aeiou" else "a ") + word


def _capacity() -> int:
    """Upper bound on the number of distinct prompts the templates can yield."""
    n_titles = len(_ADJECTIVES) * len(_NOUNS) * (2 + len(_NOUNS) - 1)
    sizes = {
        "title": n_titles,
        "genre": len(_GENRES),
        "a_genre": len(_GENRES),
        "aspect": len(_ASPECTS),
        "persona": len(_PERSONAS),
        "day": len(_DAYS),
        "companion": len(_COMPANIONS),
    }
    total = 0
    for template in _PREFIXES + _DIRECT:
        names = {f for _, f, _, _ in string.Formatter().parse(template) if f}
        total += math.prod(sizes[f] for f in names)
    return total


def _candidate(rng: random.Random) -> str:
    """Draw one prompt (either kind) from the stream."""
    genre = rng.choice(_GENRES)
    fields = {
        "title": _title(rng),
        "genre": genre,
        "a_genre": _article(genre),
        "aspect": rng.choice(_ASPECTS),
        "persona": rng.choice(_PERSONAS),
        "day": rng.choice(_DAYS),
        "companion": rng.choice(_COMPANIONS),
    }
    if rng.random() < 0.5:
        prefix = rng.choice(_PREFIXES).format(**fields)
        return _CONTINUE.format(prefix=prefix[0].upper() + prefix[1:])
    return rng.choice(_DIRECT).format(**fields)


def make_prompts(n_train: int, n_eval: int, n_test: int, seed: int = 0) -> dict[str, list[str]]:
    """Return disjoint, duplicate-free train/eval/test prompt lists.

    Candidates come from a ``random.Random(seed)`` stream and each goes to the
    split chosen by its hash, so smaller requests yield prefixes of larger ones.
    """
    want = {"train": n_train, "eval": n_eval, "test": n_test}
    for name, n in want.items():
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            raise ValueError(f"n_{name} must be a non-negative int, got {n!r}")
    if sum(want.values()) > _capacity():
        raise ValueError(
            f"cannot generate enough unique prompts: requested {sum(want.values())}, "
            f"but the word lists support at most {_capacity()}"
        )
    rng = random.Random(seed)
    out: dict[str, list[str]] = {name: [] for name in want}
    seen: set[str] = set()
    stall = 0
    while any(len(out[k]) < want[k] for k in want):
        text = _candidate(rng)
        split = _split_of(text)
        if text in seen or len(out[split]) >= want[split]:
            stall += 1
            if stall > _MAX_STALL:
                have = {k: len(v) for k, v in out.items()}
                raise ValueError(
                    f"cannot generate enough unique prompts: requested {want}, "
                    f"only produced {have} before the generator stalled"
                )
            continue
        seen.add(text)
        out[split].append(text)
        stall = 0
    return out


def prompts_fingerprint(prompts: list[str]) -> str:
    """Return the sha256 hex digest of ``prompts``, each terminated by a NUL separator."""
    for p in prompts:
        if _SEP in p:
            raise ValueError("prompts must not contain NUL characters")
    return hashlib.sha256("".join(p + _SEP for p in prompts).encode("utf-8")).hexdigest()


# -------------------------------------------------------------------------------------------- the task
def _inputs(cfg, tokenizer) -> task_registry.TaskInputs:
    from ablate.tasks.heldout import heldout_texts

    task = cfg.task
    return task_registry.TaskInputs(
        make_prompts(task.n_train, cfg.eval.n_prompts, task.n_test, seed=task.split_seed), heldout_texts()
    )


task_registry.register("sentiment", TaskConfig, _inputs)
