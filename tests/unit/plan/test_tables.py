"""Measured curves never decrease, pass through non-decreasing points, and extrapolate
with the last slope; the attention grid never decreases with the batch."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from afd_core.plan.tables import Curve, Grid

times = st.floats(min_value=1e-7, max_value=1.0, allow_nan=False)
xs = st.lists(st.integers(1, 4096), min_size=2, max_size=8, unique=True).map(sorted)


@settings(max_examples=100, deadline=None)
@given(data=st.data(), points=xs)
def test_a_curve_never_decreases(data, points):
    ys = data.draw(st.lists(times, min_size=len(points), max_size=len(points)))
    curve = Curve.through(points, ys)
    queries = sorted(data.draw(st.lists(st.floats(0, 10_000), min_size=2, max_size=10)))
    values = [curve(q) for q in queries]
    assert all(b >= a - 1e-15 for a, b in itertools.pairwise(values))


def test_a_curve_goes_through_its_points_and_continues_the_last_slope():
    curve = Curve.through([1, 2, 4], [1.0, 2.0, 4.0])
    assert [curve(x) for x in (1, 2, 3, 4, 8)] == [1.0, 2.0, 3.0, 4.0, 8.0]
    assert curve(0.5) == 1.0


@settings(max_examples=50, deadline=None)
@given(data=st.data(), batches=xs, contexts=xs)
def test_the_attention_grid_never_decreases_with_the_batch(data, batches, contexts):
    rows = tuple(
        tuple(data.draw(st.lists(times, min_size=len(contexts), max_size=len(contexts))))
        for _ in batches
    )
    grid = Grid(tuple(batches), tuple(contexts), rows)
    context = data.draw(st.integers(1, 10_000))
    values = [grid(b, context) for b in range(1, 5000, 97)]
    assert all(b >= a - 1e-12 for a, b in itertools.pairwise(values))


def test_a_slow_outlier_is_pooled_with_its_neighbours_not_carried_forward():
    curve = Curve.through([1, 2, 4, 8], [1.0, 9.0, 1.0, 2.0])
    assert curve.ys == (1.0, 4.0, 4.0, 4.0)  # 9, 1 and 2 pooled into their mean
