"""The bench's report of quantisation including the embedding: int8 and nf4 bytes with ``ref.quantize_embeddings=true``
judged against their targets (0.30x and 0.20x the fp32 full reference), and every regime's bytes against a bf16 full
copy as well as against ``full``."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from ablate.bench import report
from ablate.bench.costs import RegimeCost, quantized_embeddings_bytes

NAN = float("nan")
AUDIT = dict.fromkeys(("ref_forward_s", "audit_s", "audit_ratio", "audit_with_policy_ratio", "audit_bf16_ratio"), NAN)
THROUGHPUT = {
    **dict.fromkeys(
        ("ceiling_bf16", "ceiling_fp32", "train_flops", "train_tokens", "train_step_s", "train_flops_per_s"), NAN
    ),
    **dict.fromkeys(("train_fraction_bf16", "train_fraction_fp32"), NAN),
    "matmul_n": 2048,
    "threads": 1,
    "matmul_params": 1e6,
    "sample_memory_bandwidth": NAN,
}


def frame(int8_emb: float, nf4_emb: float) -> pd.DataFrame:
    """A bench's costs frame (a bf16 copy of 200 bytes, so full holds 400): int8 and nf4 with the given bytes when
    their embeddings are quantised."""
    rows = [
        RegimeCost("full", 1.0, 400.0, 0.0, 1600.0, bf16_copy_bytes=200.0, step_s=0.1),
        RegimeCost("int8", 1.0, 160.0, 0.0, 1360.0, bf16_copy_bytes=200.0, bytes_held_quantized_embeddings=int8_emb),
        RegimeCost("nf4", 1.0, 120.0, 0.0, 1320.0, bf16_copy_bytes=200.0, bytes_held_quantized_embeddings=nf4_emb),
        RegimeCost("none", 0.0, 0.0, 0.0, 1200.0, bf16_copy_bytes=200.0, step_s=0.0),
    ]
    out = pd.DataFrame([vars(r) for r in rows])
    out["peak_rss_bytes"] = out["peak_rss_train_bytes"] = NAN
    return out


def target(rows: list[dict], regime: str) -> dict:
    (row,) = [r for r in rows if r["target"].startswith(f"{regime} ") and "embeddings quantised" in r["target"]]
    return row


def test_the_embedding_targets_are_judged_against_full():
    rows = report.targets(frame(110.0, 90.0), AUDIT, {}, {}, {})
    int8, nf4 = target(rows, "int8"), target(rows, "nf4")
    assert (int8["measured"], int8["bound"], int8["result"]) == (110 / 400, "<= 0.3", "met")
    assert (nf4["measured"], nf4["bound"], nf4["result"]) == (90 / 400, "<= 0.2", "missed")
    assert nf4["by"] == "by 12%"
    assert math.isnan(target(report.targets(frame(NAN, NAN), AUDIT, {}, {}, {}), "int8")["measured"])


def test_the_tables_give_bytes_against_full_and_a_bf16_copy(tmp_path):
    md, csv = report.write(tmp_path, "m", [], frame(110.0, 70.0), AUDIT, {}, THROUGHPUT, [])
    c = pd.read_csv(csv).set_index("regime")
    assert c.loc["full", "bytes_held_vs_bf16"] == 2.0 and c.loc["int8", "bytes_held_vs_bf16"] == 0.8
    assert c.loc["nf4", "bytes_held_quantized_embeddings_vs_full"] == 70 / 400
    text = md.read_text()
    assert "| regime | ref. MiB held | x full | x bf16 |" in text
    assert "| `int8` | 0.0 | 0.400 | 0.800 |" in text and "| `none` | 0.0 | 0.000 | 0.000 |" in text
    assert "## Quantisation including the embedding" in text
    assert "| `int8` | quantised | 0.0 | 0.275 | 0.550 |" in text
    assert "| `nf4` | full precision | 0.0 | 0.300 | 0.600 |" in text
    assert "| `full` | quantised" not in text  # no such option: no row


@pytest.mark.filterwarnings("ignore")
def test_the_bench_measures_int8_with_its_embedding_quantised(tmp_path, ref_ctx):
    from ablate.refs.full import FullRefConfig, FullReference
    from ablate.refs.int8 import Int8RefConfig, Int8Reference
    from tests.conftest import typed_config

    cfg = typed_config(tmp_path, "model=tiny", "ref=int8")
    ref = Int8Reference(cfg.ref, ref_ctx)
    quantised = Int8Reference(Int8RefConfig(quantize_embeddings=True), ref_ctx).cost().bytes_held
    assert quantized_embeddings_bytes(cfg, ref) == quantised < ref.cost().bytes_held
    full_cfg = typed_config(tmp_path, "model=tiny", "ref=full")
    assert math.isnan(quantized_embeddings_bytes(full_cfg, FullReference(FullRefConfig(), ref_ctx)))
