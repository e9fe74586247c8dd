"""Quantised frozen copies of the SFT model through bitsandbytes (forward only)."""

from __future__ import annotations

import logging

import torch

from ablate.refs.model_backed import ModelReference

BNB = {"bitsandbytes": ("bitsandbytes==0.50.2", "ref=int8 / ref=nf4")}


def quiet_bitsandbytes() -> None:
    """bnb's 8-bit layers log a float16 cast on every call; its import prints a kernels notice."""
    logging.getLogger("bitsandbytes").setLevel(logging.ERROR)


class QuantizedReference(ModelReference):
    required_packages = BNB

    def quantization_config(self):  # pragma: no cover - abstract
        raise NotImplementedError

    def build_model(self) -> torch.nn.Module:
        quiet_bitsandbytes()
        return self.ctx.load_model(quantization_config=self.quantization_config())
