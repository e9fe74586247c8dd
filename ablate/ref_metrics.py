"""The reference's cost as logged metrics (``cost/...``): at each evaluation and in the summary."""

from __future__ import annotations

NAN = float("nan")

#: The cost metrics of a job whose reference was never built.
NO_COST = {
    "cost/ref_bytes": NAN,
    "cost/ref_ms_per_step": NAN,
    "cost/ref_setup_s": NAN,
    "cost/ref_cache_bytes": NAN,
    "cost/ref_forward_calls": NAN,
}


def cost_metrics(reference, steps: int, cache_bytes: int = 0) -> dict[str, float]:
    """``reference.cost()`` after ``steps`` optimiser steps, as ``cost/ref_*`` metrics (``NO_COST`` if None)."""
    if reference is None:
        return dict(NO_COST)
    c = reference.cost()
    return {
        "cost/ref_bytes": float(c.bytes_held),
        "cost/ref_ms_per_step": c.forward_s * 1000.0 / steps if steps else NAN,
        "cost/ref_setup_s": c.setup_s,
        "cost/ref_cache_bytes": float(c.cache_bytes + cache_bytes),
        "cost/ref_forward_calls": float(c.forward_calls),
        # regime-specific figures (hit rate, distillation KL, EMA updates, storage per position, ...)
        **{f"cost/ref_{k}": float(v) for k, v in c.extra.items() if isinstance(v, (int, float))},
    }
