"""The decode bounds' arithmetic, and the machine figures they rest on."""

import math

import pytest
import torch

from ablate.bench.decode import decode_bound, memory_bandwidth
from ablate.models.batching import kv_bytes_per_position


def test_small_batches_are_memory_bound_large_ones_compute_bound():
    common = dict(matmul_params=100e6, weight_bytes=200e6, kv_bytes_per_pos=1e4, context=100.0)
    machine = dict(ceiling_flops=400e9, bandwidth=20e9)
    small = decode_bound(batch=1, **common, **machine)
    assert small.bound == "memory" and small.memory_s == pytest.approx((200e6 + 1e6) / 20e9)
    assert small.tokens_per_s == pytest.approx(1 / small.memory_s)
    big = decode_bound(batch=512, **common, **machine)
    assert big.compute_s == pytest.approx(2 * 100e6 * 512 / 400e9)
    assert big.bound == "compute" and big.tokens_per_s == pytest.approx(512 / big.compute_s)
    assert set(big.as_dict("x_")) == {"x_batch", "x_compute_s", "x_memory_s", "x_tokens_per_s", "x_bound"}


def test_kv_bytes_count_keys_and_values_of_every_layer(tiny_model):
    c = tiny_model.config
    heads = c.num_key_value_heads or c.num_attention_heads
    want = 2 * c.num_hidden_layers * heads * (c.hidden_size // c.num_attention_heads) * 2
    assert kv_bytes_per_position(c, torch.bfloat16) == want
    assert kv_bytes_per_position(c, torch.float32) == 2 * want


def test_memory_bandwidth_is_a_plausible_figure():
    bw = memory_bandwidth(nbytes=16 * 2**20, repeats=2)
    assert math.isfinite(bw) and 1e8 < bw < 1e13  # between 0.1 GB/s and 10 TB/s


def test_own_bytes_are_weights_plus_gradient_and_two_moments_per_trainable_parameter():
    from ablate.bench.costs import own_bytes

    layer = torch.nn.Linear(3, 2)  # 6 weights + 2 biases
    layer.bias.requires_grad_(False)
    assert own_bytes(layer, ref_bytes=100) == 8 * 4 + 3 * 6 * 4 + 100
