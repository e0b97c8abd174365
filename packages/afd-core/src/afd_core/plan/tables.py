"""Measured times as functions: piecewise linear, never decreasing, extrapolated linearly.

A measurement is noisy; a planner that sees a larger batch run faster than a smaller one
would chase the noise. So each curve is replaced by the closest non-decreasing sequence
(least squares: adjacent points that decrease are pooled into their mean, so one slow
outlier is averaged with its neighbours instead of lifting every later point) before it
is interpolated; beyond the last point it continues with the last segment's slope (never
negative), below the first point it stays at the first value.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Curve:
    """``y(x)`` through the points ``(xs[i], ys[i])``, which never decrease.

    ``xs`` are strictly increasing; with one point the curve is constant.
    """

    xs: tuple[float, ...]
    ys: tuple[float, ...]

    @classmethod
    def through(cls, xs: Sequence[float], ys: Sequence[float]) -> Curve:
        """The non-decreasing curve closest to the points (``xs`` strictly increasing)."""
        pools: list[list[float]] = []  # [sum, count] of pooled neighbours
        for y in ys:
            pools.append([float(y), 1])
            while len(pools) > 1 and pools[-2][0] * pools[-1][1] > pools[-1][0] * pools[-2][1]:
                total, count = pools.pop()
                pools[-1][0] += total
                pools[-1][1] += count
        fitted = [total / count for total, count in pools for _ in range(int(count))]
        return cls(tuple(xs), tuple(fitted))

    def __call__(self, x: float) -> float:
        xs, ys = self.xs, self.ys
        if len(xs) == 1 or x <= xs[0]:
            return ys[0]
        i = min(bisect.bisect_right(xs, x), len(xs) - 1)
        x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
        return y0 + (y1 - y0) * (x - x0) / (x1 - x0)

    @property
    def last_x(self) -> float:
        """The largest measured ``x``: beyond it the curve is extrapolated."""
        return self.xs[-1]


@dataclass(frozen=True)
class Grid:
    """``t(batch, context)`` from times measured on every (batch, context) pair.

    Interpolated along the context first (per measured batch), then along the batch,
    so the result never decreases with the batch.
    """

    batches: tuple[int, ...]
    contexts: tuple[int, ...]
    seconds: tuple[tuple[float, ...], ...]  # seconds[i][j]: batches[i], contexts[j]

    def __call__(self, batch: float, context: float) -> float:
        at_context = [Curve.through(self.contexts, row)(context) for row in self.seconds]
        return Curve.through(self.batches, at_context)(batch)
