"""The adaptive KL controller moves beta the right way, by the right amount."""

import math

from ablate.algos.kl_control import AdaptiveKLController, FixedKLController, make_controller


def test_fixed_never_moves():
    c = FixedKLController(0.1)
    assert c.update(100.0) == 0.1 and c.update(0.0) == 0.1


def test_adaptive_direction_and_amount():
    c = AdaptiveKLController(0.2, target=6.0, horizon=10)
    # KL 7.2 is 20% above target: beta grows by 0.2 * 1 / 10 = 2%
    assert math.isclose(c.update(7.2, n_steps=1), 0.2 * 1.02)
    c = AdaptiveKLController(0.2, target=6.0, horizon=10)
    # KL 3 is 50% below target: the error is clipped to -0.2; over 5 steps beta shrinks by 10%
    assert math.isclose(c.update(3.0, n_steps=5), 0.2 * 0.9)
    c = AdaptiveKLController(0.2, target=6.0, horizon=10)
    assert c.update(6.0) == 0.2  # on target: no change
    assert c.update(float("nan")) == 0.2  # nothing measured: no change


def test_make_controller():
    assert isinstance(make_controller("fixed", 0.1, 6, 10), FixedKLController)
    assert isinstance(make_controller("adaptive", 0.1, 6, 10), AdaptiveKLController)
