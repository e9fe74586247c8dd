"""The layer-subset student of ``ref=distilled``: how deep it is, which teacher blocks it takes, and its weights.

Sizes follow the scaling-law convention: a model's *non-embedding* parameters are all of them but the token
embedding and the output head (one matrix when tied), so a 30-block SmolLM2-135M, whose tied 28M-parameter
embedding is a fifth of its weights, gets a student of a quarter of its blocks, not of its bytes.
"""

from __future__ import annotations

import copy
import re

import torch

from ablate.config import require
from ablate.errors import ConfigError

_LAYER_KEY = re.compile(r"^(?P<prefix>(?:.*\.)?layers)\.(?P<idx>\d+)\.(?P<rest>.+)$")


def n_params(model: torch.nn.Module) -> int:
    """Parameters, each shared (tied) tensor counted once."""
    return sum(p.numel() for p in model.parameters())


def embedding_params(model: torch.nn.Module) -> int:
    """Parameters of the token embedding and the output head (once when they are tied)."""
    tensors = {
        id(m.weight): m.weight for m in (model.get_input_embeddings(), model.get_output_embeddings()) if m is not None
    }
    return sum(t.numel() for t in tensors.values())


def nonembedding_params(model: torch.nn.Module) -> int:
    """Parameters less the embedding and the head: the decoder blocks and the final norm."""
    return n_params(model) - embedding_params(model)


def layer_param_counts(model: torch.nn.Module) -> dict[int, int]:
    """Parameters of each decoder block (``*.layers.<i>.*``), by block index."""
    counts: dict[int, int] = {}
    for name, p in model.named_parameters():
        m = _LAYER_KEY.match(name)
        if m:
            counts[int(m["idx"])] = counts.get(int(m["idx"]), 0) + p.numel()
    return counts


def select_layers(n_teacher: int, n_student: int) -> list[int]:
    """Evenly spaced teacher block indices, about every ``n_teacher / n_student``-th, the first and the last
    included when ``n_student >= 2`` (8 of 30: 0, 4, 8, 12, 17, 21, 25, 29)."""
    if not 1 <= n_student <= n_teacher:
        raise ValueError(f"cannot take {n_student} of {n_teacher} layers")
    if n_student == 1:
        return [0]
    return [int(i * (n_teacher - 1) / (n_student - 1) + 0.5) for i in range(n_student)]


def resolve_num_layers(cfg, teacher: torch.nn.Module) -> int:
    """``cfg.num_layers``, or the fewest blocks whose student holds at least ``cfg.param_fraction`` of the
    teacher's non-embedding parameters (SmolLM2-135M, a quarter: 8 of 30)."""
    layers = layer_param_counts(teacher)
    n_teacher = len(layers)
    if n_teacher == 0:
        raise ConfigError("ref=distilled: the SFT model has no recognisable decoder layers (*.layers.<i>.*)")
    if cfg.num_layers is not None:
        require(
            cfg.num_layers <= n_teacher,
            f"ref.num_layers must be <= the SFT model's {n_teacher} layers, got {cfg.num_layers}",
        )
        return cfg.num_layers
    per_layer = sum(layers.values()) / n_teacher
    total = nonembedding_params(teacher)
    rest = total - sum(layers.values())  # the final norm: the student keeps it whatever its depth
    goal = cfg.param_fraction * total * (1 - 1e-9)  # a fraction that is exactly n blocks gives n, not n + 1
    return next((n for n in range(1, n_teacher + 1) if n * per_layer + rest >= goal), n_teacher)


def init_student(teacher: torch.nn.Module, num_layers: int) -> torch.nn.Module:
    """A ``num_layers``-deep copy of the teacher: its config with fewer layers, its embeddings, final norm,
    head and the blocks of :func:`select_layers`, each weight copied exactly."""
    from transformers import AutoModelForCausalLM

    n_teacher = len(layer_param_counts(teacher))
    keep = select_layers(n_teacher, num_layers)
    config = copy.deepcopy(teacher.config)
    config.num_hidden_layers = num_layers
    if isinstance(getattr(config, "layer_types", None), list) and len(config.layer_types) == n_teacher:
        config.layer_types = [config.layer_types[i] for i in keep]
    dtype = next(teacher.parameters()).dtype
    device = next(teacher.parameters()).device
    new_index = {old: new for new, old in enumerate(keep)}
    state = {}
    for name, t in teacher.state_dict().items():
        m = _LAYER_KEY.match(name)
        if m is None:
            state[name] = t
        elif int(m["idx"]) in new_index:
            state[f"{m['prefix']}.{new_index[int(m['idx'])]}.{m['rest']}"] = t
    with torch.random.fork_rng():  # the random init is overwritten; keep it off the global stream
        student = AutoModelForCausalLM.from_config(config, dtype=dtype)
    student.load_state_dict(state, strict=True)  # every student tensor comes from the teacher
    return student.to(device)


def set_trainable(student: torch.nn.Module, train_embeddings: bool) -> list[torch.nn.Parameter]:
    """Make the student trainable, its embedding and head too only if ``train_embeddings``; returns the
    parameters to optimise."""
    for p in student.parameters():
        p.requires_grad_(True)
    if not train_embeddings:
        for m in (student.get_input_embeddings(), student.get_output_embeddings()):
            if m is not None:
                m.weight.requires_grad_(False)
    return [p for p in student.parameters() if p.requires_grad]


def size_stats(teacher: torch.nn.Module, student: torch.nn.Module) -> dict[str, float | int]:
    """Both models' parameter counts (all, and non-embedding) and the student's non-embedding fraction."""
    t, s = nonembedding_params(teacher), nonembedding_params(student)
    return {
        "teacher_params": n_params(teacher),
        "teacher_nonembedding_params": t,
        "teacher_layers": len(layer_param_counts(teacher)),
        "student_params": n_params(student),
        "student_nonembedding_params": s,
        "student_nonembedding_fraction": s / t if t else float("nan"),
        "student_layers": len(layer_param_counts(student)),
    }
