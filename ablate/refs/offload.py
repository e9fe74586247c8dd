"""``ref=offload``: the full reference (``ref=full``'s frozen SFT model, loaded as a copy of its own) with its weights
kept off the compute device by Accelerate's big-model hooks, and brought in one module at a time on each forward.

``ref.offload=cpu`` (:func:`accelerate.cpu_offload`) keeps one CPU copy of the state dict and copies each module's
weights to the execution device (the run's device) just before its forward, dropping them after. On a GPU box that is
the point: the reference costs host RAM and transfer time instead of GPU memory. On a CPU box the execution device
*is* the CPU: the hooks then hand each module the very CPU tensor they keep (no copy), so the weights are still in the
process's RAM (``ref_bytes`` counts them) and the hooks' bookkeeping is all it costs. ``ref.offload=disk``
(:func:`accelerate.disk_offload`) writes the weights to a folder and memory-maps them back, a module at a time, on
every forward: the process holds no weights between calls (``ref_bytes`` counts only what stays on the model), the
folder's bytes are ``ref_cache_bytes``, and every call reads them again (from the page cache once warm).

The folder is a fresh one made under ``ref.offload_dir`` (default: ``<cache root>/offload``, on the cache's disk:
the system's temporary folder is often RAM) and removed when the reference is garbage-collected or the process exits
(a killed run leaves it behind; it is safe to delete). It is never reused: a folder left by another model would
otherwise be read as this one's weights. It is never inside the run folder's results.

The numbers are ``ref=full``'s to the last bit: the same fp32 weights go through the same operations; the hooks only
move them (and on a CPU box not even that). Two traps, both handled here and pinned by tests:

- **TRL's fused LM head** (:func:`ablate.models.logprobs.token_logprobs`) runs the backbone and then multiplies by
  ``lm_head.weight`` itself, outside the head's own forward, where the hooks have left that weight on the meta device.
  The log-probs do not fall back to the full logits (as ``int8`` and ``nf4`` do with ``quantize_embeddings``): a full
  log-softmax over [B, T, V] is not the fused head's tiled one and differs from it in the last bits (on the tiny
  model, a few tokens of a three-sequence batch, by up to 1e-6). The fused head runs exactly as it does for ``full``,
  inside Accelerate's :func:`accelerate.utils.align_module_device` on the head, which loads its weight through the
  head's own hook for the call and offloads it again after. The next-token distribution goes through the model's
  forward, hooks and all.
- **Tied embeddings** (the tiny model and SmolLM2 tie ``lm_head`` to ``embed_tokens``): the hooks untie the two modules
  (each gets a meta placeholder of its own and loads its weight by its own name), and ``model.state_dict()`` lists
  the matrix under both names, so Accelerate would keep it twice (on disk; in CPU RAM too when the model is on a
  GPU). Here each storage is offloaded once: one CPU copy serves both names (``cpu``), and on disk the second name is
  a hard link to the first one's file (``disk``; a copy where the filesystem has no hard links). On a GPU the two
  modules still load the matrix separately: during the fused head's backbone it is on the device twice (the
  embedding's and the head's), for the call only (read from Accelerate's code: the tests run on CPU only).

The model is loaded on the run's device (as every regime's) before it is offloaded: on a GPU box the weights are there
for the setup only. Bit-for-bit equality with ``full`` is tested on CPU, and on a GPU by
``tests/refs/test_offload_cuda.py`` (skipped without CUDA; run on an H200: docs/measured.md has its figures).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch

from ablate.config import RefConfig, require, require_choice
from ablate.refs.base import RefContext, TokenBatch, register
from ablate.refs.model_backed import ModelReference, freeze

log = logging.getLogger(__name__)

OffloadTarget = Literal["cpu", "disk"]  # where the weights are kept between forwards


@dataclass
class OffloadRefConfig(RefConfig):
    name: str = "offload"
    offload: str = "cpu"  # OffloadTarget: cpu (accelerate.cpu_offload) | disk (accelerate.disk_offload)
    offload_dir: str | None = None  # disk: the folder under which the weights' folder is made; null: <cache>/offload

    def __post_init__(self) -> None:
        require_choice("ref.offload", self.offload, OffloadTarget)
        require(
            self.offload_dir is None or self.offload == "disk",
            f"ref.offload_dir is for ref.offload=disk, got ref.offload={self.offload}",
        )


def storage_key(t: torch.Tensor) -> tuple:
    """What makes two state-dict entries one tensor (a tied pair): the same memory, viewed the same way."""
    return t.data_ptr(), t.dtype, tuple(t.shape), tuple(t.stride())


def tied_names(state: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """``state`` with each tensor once (its first name), and every other name of a tensor -> that first name."""
    first: dict[tuple, str] = {}
    unique, aliases = {}, {}
    for name, t in state.items():
        key = storage_key(t)
        if key in first:
            aliases[name] = first[key]
        else:
            first[key] = name
            unique[name] = t
    return unique, aliases


def cpu_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """``model``'s state dict on the CPU, each tensor copied once (a tied pair shares one copy; on a CPU model these
    are the model's own tensors, not copies): the ``state_dict`` :func:`accelerate.cpu_offload` keeps."""
    unique, aliases = tied_names(model.state_dict())
    out = {name: t.to("cpu") for name, t in unique.items()}
    out.update({name: out[twin] for name, twin in aliases.items()})
    return out


def write_offload_folder(model: torch.nn.Module, folder: Path) -> None:
    """``model``'s weights in ``folder`` as :func:`accelerate.disk_offload` reads them (``<name>.dat`` memory maps and
    ``index.json``), each tensor written once: another name of a tied tensor is a hard link to its file."""
    from accelerate.utils import offload_state_dict
    from accelerate.utils.offload import save_offload_index

    unique, aliases = tied_names(model.state_dict())
    offload_state_dict(str(folder), unique)
    index = json.loads((folder / "index.json").read_text())
    for name, twin in aliases.items():
        src, dst = folder / f"{twin}.dat", folder / f"{name}.dat"
        try:
            os.link(src, dst)
        except OSError:  # a filesystem without hard links: a copy
            shutil.copyfile(src, dst)
    save_offload_index({name: index[twin] for name, twin in aliases.items()}, str(folder))


def folder_bytes(folder: Path) -> int:
    """Bytes of the files in ``folder`` on disk, each file once (hard links are one file)."""
    seen, total = set(), 0
    for f in folder.rglob("*"):
        st = f.stat()
        if f.is_file() and (st.st_dev, st.st_ino) not in seen:
            seen.add((st.st_dev, st.st_ino))
            total += st.st_size
    return total


def tensors_bytes(tensors) -> int:
    """Bytes of the tensors' storages, each storage once, meta tensors (which hold nothing) left out."""
    seen, total = set(), 0
    for t in tensors:
        if not isinstance(t, torch.Tensor) or t.device.type == "meta":
            continue
        ptr = t.untyped_storage().data_ptr()
        if ptr not in seen:
            seen.add(ptr)
            total += t.untyped_storage().nbytes()
    return total


@register(OffloadRefConfig)
class OffloadReference(ModelReference):
    """``ref=full``'s model with its weights kept on the CPU or on disk by Accelerate's hooks (the module docstring)."""

    rank = 15  # full's numbers at another memory cost: next to full
    EXTRA_DOCS = {
        "offload_bytes": "weights the offloaded reference keeps off the compute device: its CPU copy (offload=cpu; "
        "on a CPU-only machine that is the execution device's own RAM) or its folder on disk (offload=disk)",
        "device_bytes": "the offloaded reference's weights and persistent buffers that stay on the execution device "
        "between calls (0 when every one is offloaded: each forward brings one module's weights in for the call)",
    }

    def __init__(self, cfg: OffloadRefConfig, ctx: RefContext):
        self.folder: Path | None = None  # offload=disk: the weights' folder (removed with the reference)
        self._offload_bytes = 0
        super().__init__(cfg, ctx)
        device = tensors_bytes(self.model.state_dict(keep_vars=True).values())  # as module_bytes counts full's
        in_ram = cfg.offload == "cpu"  # a CPU copy is held by the process; a folder on disk is not
        self._cost.bytes_held = device + (self._offload_bytes if in_ram else 0)
        self._cost.cache_bytes = 0 if in_ram else self._offload_bytes
        self._cost.extra.update(offload_bytes=self._offload_bytes, device_bytes=device)

    def build_model(self) -> torch.nn.Module:
        from accelerate import cpu_offload, disk_offload

        model = freeze(super().build_model())  # frozen before the hooks copy its parameters' flags
        if self.cfg.offload == "cpu":
            weights = cpu_weights(model)
            self._offload_bytes = tensors_bytes(weights.values())
            return cpu_offload(model, execution_device=self.ctx.device, state_dict=weights)
        self.folder = self._make_folder()
        write_offload_folder(model, self.folder)
        self._offload_bytes = folder_bytes(self.folder)
        return disk_offload(model, str(self.folder), execution_device=self.ctx.device)

    def _make_folder(self) -> Path:
        """A fresh folder for the weights, removed when the reference is garbage-collected or the process exits."""
        if self.cfg.offload_dir is not None:
            parent = Path(self.cfg.offload_dir).expanduser()
        else:
            from ablate.paths import cache_root

            parent = Path(self.ctx.cache_root if self.ctx.cache_root is not None else cache_root()) / "offload"
        parent.mkdir(parents=True, exist_ok=True)
        folder = Path(tempfile.mkdtemp(prefix="ref-", dir=parent))
        weakref.finalize(self, shutil.rmtree, folder, ignore_errors=True)
        log.info("ref=offload: the reference's weights go to %s (removed at the end)", folder)
        return folder

    def _logprobs(self, batch: TokenBatch) -> torch.Tensor:
        """Through TRL's fused head, as ``full``'s, with the head's weight loaded by its hook for the call."""
        from accelerate.utils import align_module_device

        with align_module_device(self.model.get_output_embeddings()):
            return super()._logprobs(batch)
