"""How much rounding SmolLM2's activations to 8 bits costs in llama.cpp's two block sizes (docs/served.md, "Here the
K-quants are worse than their bits"): the relative error of int8 with one scale per 256 values (Q8_K, what K-quant dot
products quantise their input to) and per 32 (Q8_0, the legacy quants'), at the inputs of each layer's ``down_proj``
and ``q_proj``, over a forward of the first 32 evaluation samples of reports/served/job_default (prompt and response,
fp32). Run: ``.venv/bin/python reports/served/activation_rounding.py``."""

import json
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from ablate.models import smollm2
from ablate.paths import cache_root

HERE = Path(__file__).parent


def rounding_error(x: torch.Tensor, block: int) -> float:
    """||q(x) - x|| / ||x|| for symmetric int8 with one scale per ``block`` values of each row."""
    xb = x[:, : x.shape[-1] // block * block].reshape(x.shape[0], -1, block)
    scale = (xb.abs().amax(-1, keepdim=True) / 127).clamp_min(1e-30)
    return float(((torch.round(xb / scale) * scale - xb).norm() / xb.norm()).item())


def main() -> None:
    path = smollm2.model_dir(cache_root())
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(path)
    rows = [json.loads(line) for line in (HERE / "job_default" / "samples.jsonl").open()][:32]
    seen: dict[tuple[str, int], list[torch.Tensor]] = {}
    for i, layer in enumerate(model.model.layers):
        for kind, module in (("down_proj", layer.mlp.down_proj), ("q_proj", layer.self_attn.q_proj)):
            module.register_forward_pre_hook(
                lambda mod, inp, key=(kind, i): seen.setdefault(key, []).append(inp[0].reshape(-1, inp[0].shape[-1]))
            )
    with torch.no_grad():
        for r in rows:
            model(**tok(r["prompt"] + " " + r["policy_response"], return_tensors="pt"))
    for kind in ("down_proj", "q_proj"):
        errs = {b: [rounding_error(torch.cat(xs), b) for (k, _), xs in seen.items() if k == kind] for b in (256, 32)}
        med = {b: float(torch.tensor(e).median()) for b, e in errs.items()}
        print(
            f"{kind}: relative int8 rounding error, median over layers: per 256 values {med[256]:.4f}, per 32 {med[32]:.4f}"
        )


if __name__ == "__main__":
    main()
