"""Distilling ``ref=distilled``'s student: forward KL(teacher || student) on full next-token distributions, with a
stopping rule on the held-out KL.

The held-out per-token KL is measured before training and every ``cfg.eval_every`` steps (and at the last one);
training stops at the first measurement at or below ``cfg.target_kl``, or after ``cfg.steps`` optimiser steps
(the cap). What it reached, when, and every measurement (the trace) are reported.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F

from ablate.refs.distill_data import Seq, collate
from ablate.refs.distill_student import set_trainable

CLIP_NORM = 1.0  # gradient-norm clip: the first steps of a layer-dropped student see large gradients


def response_logprobs(model: torch.nn.Module, ids, att, target) -> torch.Tensor:
    """[N, V] float32 next-token log-probs at the N positions of ``target``. The head is applied only there,
    so no [B, T, V] logits are materialised (the student and teacher are causal LMs with a plain linear head)."""
    hidden = model.get_decoder()(input_ids=ids, attention_mask=att, use_cache=False).last_hidden_state
    logits = model.get_output_embeddings()(hidden[:, :-1][target])
    return torch.log_softmax(logits.float(), dim=-1)


def forward_kl_sum(teacher_lp: torch.Tensor, student_lp: torch.Tensor) -> torch.Tensor:
    """Sum over positions of KL(teacher || student) = sum_v p_t (log p_t - log p_s)."""
    return F.kl_div(student_lp, teacher_lp, log_target=True, reduction="sum")


@torch.no_grad()
def heldout_kl(teacher, student, seqs: list[Seq], batch_size: int, pad_id: int, device: torch.device) -> float:
    """Mean per-token forward KL(teacher || student) over every response position of ``seqs``, in fp32."""
    was_training = student.training
    student.eval()
    total, count = 0.0, 0
    with torch.autocast(device.type, enabled=False):
        for i in range(0, len(seqs), batch_size):
            ids, att, target = collate(seqs[i : i + batch_size], pad_id, device)
            total += forward_kl_sum(
                response_logprobs(teacher, ids, att, target), response_logprobs(student, ids, att, target)
            ).item()
            count += int(target.sum())
    student.train(was_training)
    return total / count if count else float("nan")


def batch_order(n: int, batch_size: int, seed: int) -> Iterator[list[int]]:
    """Endless batches of indices into ``n`` sequences: seeded permutations, one after another."""
    g = torch.Generator().manual_seed(seed)
    order: list[int] = []
    while True:
        while len(order) < min(batch_size, n):
            order += torch.randperm(n, generator=g).tolist()
        yield order[:batch_size]
        order = order[batch_size:]


def reached(kl: float, target: float | None) -> bool:
    """Whether a held-out KL meets the target (never, without one; never, for NaN)."""
    return target is not None and kl <= target


def distil_loop(
    teacher,
    student,
    train: list[Seq],
    held: list[Seq],
    cfg,
    *,
    device: torch.device,
    precision: str,
    pad_id: int,
    kl_before: float | None = None,
) -> dict[str, Any]:
    """Train ``student`` toward ``teacher`` on ``train`` until its KL on ``held`` meets ``cfg.target_kl`` or
    ``cfg.steps`` steps are done (see the module docstring). ``kl_before``: the student's held-out KL as it is,
    if already measured. Returns the figures: the held-out KL before and at the end, the last training batch's
    KL, the steps taken, whether the target was reached, and the trace of every measurement."""
    from tqdm.auto import tqdm

    from ablate.models.precision import autocast

    kl = heldout_kl(teacher, student, held, cfg.batch_size, pad_id, device) if kl_before is None else kl_before
    stats: dict[str, Any] = {"distill_kl_heldout_before": kl}
    trace, steps, train_kl = [[0, kl]], 0, float("nan")
    if cfg.steps > 0 and not reached(kl, cfg.target_kl):
        params = set_trainable(student, cfg.train_embeddings)
        student.train()
        opt = torch.optim.AdamW(params, lr=cfg.learning_rate, weight_decay=0.0)
        batches = batch_order(len(train), cfg.batch_size, cfg.seed)
        bar = tqdm(total=cfg.steps, desc="distilling reference", dynamic_ncols=True)
        for steps in range(1, cfg.steps + 1):
            ids, att, target = collate([train[i] for i in next(batches)], pad_id, device)
            with autocast(device, precision):
                with torch.no_grad():
                    t_lp = response_logprobs(teacher, ids, att, target)
                s_lp = response_logprobs(student, ids, att, target)
            loss = forward_kl_sum(t_lp, s_lp) / target.sum()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, CLIP_NORM)
            opt.step()
            train_kl = loss.item()
            bar.update()
            bar.set_postfix(kl=f"{train_kl:.4g}", heldout=f"{kl:.4g}")
            if steps % cfg.eval_every == 0 or steps == cfg.steps:
                kl = heldout_kl(teacher, student, held, cfg.batch_size, pad_id, device)
                trace.append([steps, kl])
                if reached(kl, cfg.target_kl):
                    break
        bar.close()
        del opt
    stats.update(distill_kl_heldout=kl, distill_kl_train_last=train_kl, distill_steps=steps, distill_kl_trace=trace)
    if cfg.target_kl is not None:
        stats["distill_target_reached"] = reached(kl, cfg.target_kl)
    return stats
