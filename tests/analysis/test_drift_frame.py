"""A class's stored weights around its live weight (memvir.analysis.drift_frame) against sphere geometry written out
here: each at its true angle from the centre, in its true direction within the plane of the stored weights (exact for
two)."""

import numpy as np
import pytest

from memvir.analysis.drift_frame import angles_degrees, drift_offsets


def on_sphere(degrees, direction):
    """The unit vector `degrees` away from e1 towards the unit vector `direction` (orthogonal to e1)."""
    e1 = np.zeros(len(direction))
    e1[0] = 1.0
    angle = np.radians(degrees)
    return np.cos(angle) * e1 + np.sin(angle) * np.asarray(direction, dtype=float)


E = np.eye(5)
LIVE = E[0]


def angle_between(a, b):
    return np.degrees(np.arccos(a @ b / (np.linalg.norm(a) * np.linalg.norm(b))))


def test_angles_are_degrees_on_the_sphere():
    rows = np.stack([on_sphere(10, E[1]), on_sphere(90, E[2]), -LIVE])
    np.testing.assert_allclose(angles_degrees(rows, np.stack([LIVE] * 3)), [10, 90, 180], atol=1e-9)


def test_two_stored_weights_keep_their_angles_from_the_centre_and_the_angle_between_their_directions():
    # 10 degrees towards e2; 20 degrees towards a direction 60 degrees from e2 (in the e2-e3 plane)
    sixty_from_e2 = np.cos(np.radians(60)) * E[1] + np.sin(np.radians(60)) * E[2]
    stored = np.stack([on_sphere(10, E[1]), on_sphere(20, sixty_from_e2)])
    offsets = drift_offsets(LIVE, stored)
    np.testing.assert_allclose(np.linalg.norm(offsets, axis=1), [10, 20], atol=1e-9)
    assert angle_between(*offsets) == pytest.approx(60, abs=1e-6)


def test_one_stored_weight_lies_on_the_first_axis_at_its_angle():
    offsets = drift_offsets(LIVE, on_sphere(7.5, E[3])[None])
    assert offsets.shape == (1, 2)
    assert abs(offsets[0, 0]) == pytest.approx(7.5) and offsets[0, 1] == pytest.approx(0, abs=1e-12)


def test_three_stored_weights_out_of_one_plane_keep_their_true_angles_from_the_centre():
    stored = np.stack([on_sphere(5, E[1]), on_sphere(12, E[2]), on_sphere(30, E[3])])
    np.testing.assert_allclose(np.linalg.norm(drift_offsets(LIVE, stored), axis=1), [5, 12, 30], atol=1e-9)


def test_a_copy_of_the_live_weight_lies_on_it_and_no_stored_weight_is_no_offset():
    np.testing.assert_allclose(drift_offsets(LIVE, np.stack([LIVE, on_sphere(3, E[1])])), [[0, 0], [3, 0]],
                               atol=1e-9)
    assert drift_offsets(LIVE, np.zeros((0, 5))).shape == (0, 2)

