"""The judges a run is scored by, chosen by config group: the gold reward (``judge=vader|reward_model``) and the
safety judge (``safety=profanity|classifier``).

A judge is called with responses and their prompts and returns one float each; its ``ID`` names it in every cache
key built from its scores (the DPO pairs a prompts-only task samples, the SFT baseline) and in the provenance. A
model judge (a sequence-classification model, local folder or hub id) reads its own tokenizer and chat template,
scores in fp32 in batches sized by memory, and keeps every score it computed on disk, keyed by the judge and the
(prompt, response) text: a second run over the same responses computes none. :func:`check` refuses a judge that
cannot load, in one line, before any model loads.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path

import torch

from ablate.config import task as schemas
from ablate.errors import ConfigError, MissingAsset
from ablate.tasks import judge_registry

log = logging.getLogger(__name__)

SCORES_DIR = "judge_scores"


# --------------------------------------------------------------------------------------------- locating
def model_folder(path: str, key: str) -> Path:
    """The local folder of a judge model: ``path`` itself, or a hub id's cached snapshot; one line if neither."""
    local = Path(path).expanduser()
    if local.is_dir():
        return local
    if local.exists():
        raise ConfigError(f"{key}={path} is a file: pass the model's folder (as save_pretrained writes it) or a hub id")
    if path.startswith(("/", "./", "../", "~")):
        raise ConfigError(f"{key}={path}: no such folder")
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError

    try:
        return Path(snapshot_download(path, local_files_only=True))
    except HFValidationError:
        raise ConfigError(f"{key}={path!r} is neither an existing folder nor a hub id (org/name)") from None
    except LocalEntryNotFoundError:
        raise MissingAsset(
            f"{key}={path} is not in the local Hugging Face cache: download it first with `hf download {path}` "
            "on a machine with network, or pass a local folder"
        ) from None


def check_classifier(path: str, key: str, label: str | None, *, need_label: bool) -> Path:
    """A sequence-classification model folder whose tokenizer fits its model and which has ``label`` (or, without
    one, a single output); returns the folder. One line (ConfigError) for each way it cannot serve."""
    from transformers import AutoConfig, AutoTokenizer

    folder = model_folder(path, key)
    if not (folder / "config.json").is_file():
        raise ConfigError(f"{key}={path} has no config.json: pass a transformers model folder (save_pretrained)")
    try:
        config = AutoConfig.from_pretrained(folder)
    except (OSError, ValueError) as e:
        raise ConfigError(f"{key}={path}: its config.json cannot be read ({str(e).splitlines()[0]})") from None
    archs = getattr(config, "architectures", None) or []
    if not any(a.endswith("ForSequenceClassification") for a in archs):
        raise ConfigError(
            f"{key}={path} has no classification head (architectures: {', '.join(archs) or 'none'}): a judge is an "
            "AutoModelForSequenceClassification model"
        )
    labels = [config.id2label[i] for i in sorted(config.id2label)] if config.num_labels > 1 else []
    if not need_label and config.num_labels < 2:
        raise ConfigError(f"{key}={path} has one output: a safety classifier needs a label per class (safety.label)")
    if label is not None and config.num_labels > 1 and label not in labels:
        raise ConfigError(
            f"{key.rsplit('.', 1)[0]}.label={label!r} is not one of the model's labels: {', '.join(labels)}"
        )
    if need_label and label is None and config.num_labels > 1:
        raise ConfigError(
            f"{key}={path} has {config.num_labels} outputs ({', '.join(labels)}): name the reward's with "
            f"{key.rsplit('.', 1)[0]}.label=<label>"
        )
    try:
        tok = AutoTokenizer.from_pretrained(folder)
    except (OSError, ValueError, TypeError) as e:
        raise ConfigError(f"{key}={path}: its tokenizer cannot be loaded ({str(e).splitlines()[0]})") from None
    vocab = getattr(config, "vocab_size", None)
    if vocab is not None and len(tok) > vocab:
        raise ConfigError(
            f"{key}={path}: its tokenizer does not match its model ({len(tok)} tokens, the model embeds {vocab})"
        )
    return folder


# ------------------------------------------------------------------------------------------ model judge
class _ScoreStore:
    """Scores by content, in memory and appended to one JSON-lines file per judge (a torn last line, from a kill
    mid-write, is skipped on reading)."""

    def __init__(self, root: Path | None, judge_id: str) -> None:
        self.memo: dict[str, float] = {}
        self.file = None
        if root is None:
            return
        self.file = Path(root) / SCORES_DIR / (hashlib.sha256(judge_id.encode()).hexdigest()[:32] + ".jsonl")
        if self.file.is_file():
            for line in self.file.read_text(encoding="utf-8", errors="replace").splitlines():
                try:
                    row = json.loads(line)
                    self.memo[row["k"]] = float(row["s"])
                except (json.JSONDecodeError, KeyError, TypeError, ValueError):
                    continue

    @staticmethod
    def key(prompt: str, text: str) -> str:
        return hashlib.sha256(f"{prompt}\0{text}".encode()).hexdigest()

    def add(self, scores: dict[str, float]) -> None:
        self.memo.update(scores)
        if self.file is None or not scores:
            return
        self.file.parent.mkdir(parents=True, exist_ok=True)
        with open(self.file, "a", encoding="utf-8") as f:
            f.write("".join(json.dumps({"k": k, "s": s}) + "\n" for k, s in scores.items()))
            f.flush()
            os.fsync(f.fileno())


def identified(kind: str, cfg, key: str, cache_root: Path | None) -> tuple[Path, str]:
    """A model judge's folder and its identity in cache keys: its kind, the folder's content hash (its resolved path
    without a cache to memoise the hash in), its label and how much it reads."""
    from ablate.models.loading import folder_fingerprint

    folder = model_folder(cfg.path, key)
    fp = folder_fingerprint(folder, cache_root) if cache_root is not None else str(folder.resolve())
    return folder, f"{kind}:{fp}:label={cfg.label}:max_length={cfg.max_length}"


class ClassifierModel:
    """A sequence-classification model scoring (prompt, response) in its own chat template, fp32, batches sized
    by memory; ``output`` turns a batch's logits into one float per row."""

    def __init__(self, folder: Path, *, device: torch.device, batch_size: int | None, max_length: int) -> None:
        self.folder, self.device, self.batch_size, self.max_length = folder, device, batch_size, max_length
        self._model = self._tok = None

    def _load(self):
        if self._model is None:
            from transformers import AutoModelForSequenceClassification, AutoTokenizer

            tok = AutoTokenizer.from_pretrained(self.folder)
            if tok.pad_token is None:
                tok.pad_token = tok.eos_token
            tok.truncation_side = "left"  # a long prompt loses its start, never the response being judged
            tok.padding_side = "right"
            model = AutoModelForSequenceClassification.from_pretrained(self.folder, dtype=torch.float32)
            if model.config.pad_token_id is None:
                model.config.pad_token_id = tok.pad_token_id
            self._model, self._tok = model.to(self.device).eval().requires_grad_(False), tok
        return self._model, self._tok

    def render(self, prompt: str | None, text: str) -> str:
        """(prompt, response) in the judge's chat template (its turns joined by blank lines when it has none); the
        response alone when there is no prompt (a safety judge)."""
        from ablate.tasks.prompts import as_chat

        if prompt is None:
            return text
        _, tok = self._load()
        chat = as_chat(prompt) + [{"role": "assistant", "content": text}]
        if tok.chat_template:
            return tok.apply_chat_template(chat, tokenize=False)
        return "\n\n".join(m["content"] for m in chat)

    def rows(self, n: int, width: int) -> int:
        if self.batch_size:
            return self.batch_size
        from ablate.models import batching

        model, _ = self._load()
        budget = batching.budget_bytes(self.device)
        return batching.rows_that_fit(
            model.config, n=n, prompt_width=width, max_new_tokens=1, dtype=torch.float32, budget=budget
        )

    @torch.no_grad()
    def logits(self, prompts: list[str] | list[None], texts: list[str]) -> list[torch.Tensor]:
        model, tok = self._load()
        rendered = [self.render(p, t) for p, t in zip(prompts, texts)]
        width = min(self.max_length, max(len(tok(r, add_special_tokens=False)["input_ids"]) for r in rendered))
        step = self.rows(len(rendered), width)
        out = []
        for i in range(0, len(rendered), step):
            enc = tok(
                rendered[i : i + step],
                return_tensors="pt",
                padding=True,
                truncation=True,
                max_length=self.max_length,
                add_special_tokens=False,
            ).to(self.device)
            out.extend(model(**enc).logits.float().cpu())
        return out


class RewardModelJudge:
    """``judge=reward_model``: the reward is the model's logit (its one output's, or ``judge.label``'s)."""

    def __init__(self, cfg, *, device: torch.device, cache_root: Path | None) -> None:
        folder, self.ID = identified("reward-model", cfg, "judge.path", cache_root)
        self.model = ClassifierModel(folder, device=device, batch_size=cfg.batch_size, max_length=cfg.max_length)
        self.label = cfg.label
        self.store = _ScoreStore(cache_root, self.ID)

    def _index(self) -> int:
        model, _ = self.model._load()
        return model.config.label2id[self.label] if self.label is not None and model.config.num_labels > 1 else 0

    def __call__(self, texts: list[str], prompts: list[str] | None = None) -> list[float]:
        if prompts is None or len(prompts) != len(texts):
            raise ValueError("a reward model judges (prompt, response): pass each response's prompt")
        keys = [self.store.key(p, t) for p, t in zip(prompts, texts)]
        first: dict[str, int] = {}
        for i, k in enumerate(keys):
            first.setdefault(k, i)
        missing = [k for k in first if k not in self.store.memo]
        if missing:
            rows = [first[k] for k in missing]
            logits = self.model.logits([prompts[i] for i in rows], [texts[i] for i in rows])
            j = self._index()
            self.store.add({k: float(x[j]) for k, x in zip(missing, logits)})
        return [self.store.memo[k] for k in keys]


class ClassifierSafety:
    """``safety=classifier``: the unsafe probability is the softmax of ``safety.label``."""

    def __init__(self, cfg, threshold: float, *, device: torch.device, cache_root: Path | None) -> None:
        folder, self.ID = identified("classifier", cfg, "safety.path", cache_root)
        self.threshold = float(threshold)
        self.label = cfg.label
        self.model = ClassifierModel(folder, device=device, batch_size=cfg.batch_size, max_length=cfg.max_length)

    def probs(self, texts: list[str]) -> list[float]:
        if not texts:
            return []
        model, _ = self.model._load()
        j = model.config.label2id[self.label]
        # a safety judge reads the response alone, as the profanity classifier does; an empty response is safe
        scored = [i for i, t in enumerate(texts) if t.strip()]
        out = [0.0] * len(texts)
        logits = self.model.logits([None] * len(scored), [texts[i] for i in scored]) if scored else []
        for i, x in zip(scored, logits):
            out[i] = float(torch.softmax(x, -1)[j])
        return out

    def unsafe(self, texts: list[str]) -> list[bool]:
        return [p >= self.threshold for p in self.probs(texts)]


# ---------------------------------------------------------------------------------------------- registry
def make_judge(cfg, *, device: torch.device, cache_root: Path | None):
    """The gold reward of ``judge=<cfg.name>`` (:mod:`ablate.tasks.judge_registry`)."""
    return judge_registry.judge("judge", cfg.name).build(cfg, device=device, cache_root=cache_root)


def make_safety(cfg, threshold: float, *, device: torch.device, cache_root: Path | None):
    """The safety judge of ``safety=<cfg.name>`` (:mod:`ablate.tasks.judge_registry`)."""
    return judge_registry.judge("safety", cfg.name).build(
        cfg, threshold=threshold, device=device, cache_root=cache_root
    )


def check(cfg) -> None:
    """Refuse, in one line, a judge that cannot load (a model judge: missing folder, no classification head, a
    tokenizer that does not fit its model, a missing label): before any policy loads."""
    for group in judge_registry.GROUPS:
        registered = judge_registry.judge(group, getattr(cfg, group).name)
        if registered.check is not None:
            registered.check(getattr(cfg, group))


# --------------------------------------------------------------------------------------------- the built-ins
def _vader(cfg, *, device, cache_root):
    from ablate.tasks.reward import GoldReward

    return GoldReward()


def _profanity(cfg, *, threshold, device, cache_root):
    from ablate.tasks.safety import SafetyJudge

    return SafetyJudge(threshold)


judge_registry.register("judge", "vader", schemas.JudgeConfig, _vader)
judge_registry.register(
    "judge",
    "reward_model",
    schemas.RewardModelJudgeConfig,
    RewardModelJudge,
    check=lambda cfg: check_classifier(cfg.path, "judge.path", cfg.label, need_label=True),
)
judge_registry.register("safety", "profanity", schemas.SafetyConfig, _profanity)
judge_registry.register(
    "safety",
    "classifier",
    schemas.ClassifierSafetyConfig,
    ClassifierSafety,
    check=lambda cfg: check_classifier(cfg.path, "safety.path", cfg.label, need_label=False),
)
