"""The TRL fence: what it relies on matches the installed TRL, and an incompatible TRL fails in one line."""

from __future__ import annotations

import pytest
import torch

from ablate.algos import trl_fence
from ablate.errors import MissingAsset


def test_the_installed_trl_is_one_the_fence_was_checked_with():
    import trl

    assert trl.__version__ in trl_fence.CHECKED_WITH, "re-read TRL's source against the fence, then add the version"
    assert trl_fence.problems() == []
    trl_fence.check()


def test_the_contract_names_the_private_methods_the_fence_overrides():
    """Every private TRL method the fence's trainers override is in the contract, with its signature."""
    names = {e.name for e in trl_fence.CONTRACT}
    for cls, base in (("DPOTrainer", trl_fence.dpo_base()), ("GRPOTrainer", trl_fence.grpo_base())):
        overridden = {n for n in vars(base) if n.startswith("_") and not n.startswith("__") and callable(vars(base)[n])}
        assert {f"{cls}.{n}" for n in overridden} <= names, overridden


def _fake_loss(self, model, batch):  # a TRL that renamed an argument and stopped reading the reference
    return None


FAKE = (
    trl_fence.Expect("GRPOTrainer._compute_loss", lambda: _fake_loss, ("self", "model", "inputs"), ("self.beta",)),
    trl_fence.Expect("DPOTrainer._gone", lambda: object._gone, ("self",)),
)


def test_an_incompatible_trl_fails_with_one_line_naming_what_changed():
    found = trl_fence.problems(FAKE)
    assert found == [
        "GRPOTrainer._compute_loss(self, model, batch) is not GRPOTrainer._compute_loss(self, model, inputs)",
        "GRPOTrainer._compute_loss no longer reads self.beta",
        "DPOTrainer._gone is missing (type object 'object' has no attribute '_gone')",
    ]
    with pytest.raises(MissingAsset) as err:
        trl_fence.check(FAKE)
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith("trl 1.16.0 is incompatible with ablate (checked with trl==1.16.0)")
    assert msg.endswith("install trl==1.16.0") and "_compute_loss(self, model, batch)" in msg


def test_the_fused_head_is_recognised_by_its_keyword_and_installed_once(tiny_model):
    from trl.trainer import add_fused_lm_head

    assert not trl_fence.has_fused_head(tiny_model)
    add_fused_lm_head(tiny_model, outputs=("log_probs", "entropy"))  # as a TRL trainer installs it on the policy
    assert trl_fence.has_fused_head(tiny_model)
    trained_with = tiny_model.forward
    trl_fence.add_fused_head(tiny_model)  # keeps the trainer's head (and its extra outputs)
    assert tiny_model.forward is trained_with
    ids = torch.tensor([[1, 2, 3, 4]])
    out = tiny_model(input_ids=ids, labels=ids, fused_lm_head=True)
    assert out.entropy is not None


def test_an_accelerate_that_changed_names_accelerate_not_trl():
    def prepare_model(self, model):  # an Accelerate that no longer keeps the forward it wraps
        return model

    fake = (trl_fence.Expect("Accelerator.prepare_model", lambda: prepare_model, ("self", "model"),
                             ("model._original_forward = model.forward",), library="accelerate"),)  # fmt: skip
    with pytest.raises(MissingAsset) as err:
        trl_fence.check(fake)
    msg = str(err.value)
    assert msg.startswith("accelerate 1.15.0 is incompatible with ablate (checked with accelerate==1.15.0)")
    assert "no longer reads model._original_forward" in msg and msg.endswith("install accelerate==1.15.0")
    assert "trl" not in msg
