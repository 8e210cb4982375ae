"""A line fitted to a cost's samples as a job runs, anchored on points measured at start (costs.py's lines)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Line:
    """y ~ a + b x by least squares over decayed samples (each older sample weighs `decay` times less).
    While the x seen are too alike to tell a slope, the cost is read as proportional to x (a = 0): the
    cautious reading, since it charges a token the whole average cost.

    `anchor`: (a, b, spread) of points measured where x varied (the start-up's forwards at a few N): the slope
    leans on it as on samples of that spread (centred sum of squares) that never decay, scaled to the samples'
    level. A job's rounds tell a slope badly (N moves by a token, the time by 10%): SmolLM2 at batch 8 (2 CPU
    cores, 2026-12-03) priced a token 17 ms by round 80, where 16 tokens cost ~2 ms a token more than 8."""

    decay: float = 0.97
    proportional: bool = True  # False: while the x seen are alike, the cost is flat (b = 0), their mean
    anchor: tuple[float, float, float] | None = None
    w: float = 0.0
    n: int = 0  # samples added (undecayed)
    sx: float = 0.0
    sy: float = 0.0
    sxx: float = 0.0
    sxy: float = 0.0

    @classmethod
    def measured(cls, points, **kwargs) -> Line:
        """A line anchored on `points` ((x, y) measured at start), or holding them as samples where their x
        are too alike to tell a slope (one x)."""
        first = cls(decay=1.0)
        for x, y in points:
            first.add(x, y)
        if first.w <= 0 or first.centred()[2] <= 1e-9:
            line = cls(**kwargs)
            for x, y in points:
                line.add(x, y)
            return line
        mx, my, spread, sxy = first.centred()
        b = max(sxy / spread, 0.0)
        return cls(anchor=(max(my - b * mx, 0.0), b, spread), **kwargs)

    @property
    def known(self) -> bool:
        return self.anchor is not None or self.w > 0

    def centred(self) -> tuple[float, float, float, float]:
        """(mean x, mean y, centred sum of squares of x, centred sum of x y), over the weighted samples (w > 0)."""
        mx, my = self.sx / self.w, self.sy / self.w
        return mx, my, max(self.sxx - self.w * mx * mx, 0.0), self.sxy - self.w * mx * my

    def add(self, x: float, y: float, weight: float = 1.0) -> None:
        d, w = self.decay, weight
        self.n += 1
        self.w, self.sx, self.sy = d * self.w + w, d * self.sx + w * x, d * self.sy + w * y
        self.sxx, self.sxy = d * self.sxx + w * x * x, d * self.sxy + w * x * y

    def fit(self) -> tuple[float, float] | None:
        """(a, b), both >= 0, or None before any sample (and without an anchor)."""
        if self.anchor is not None:
            return self._anchored()
        if self.w <= 0:
            return None
        mx, my, sxx, sxy = self.centred()
        if self.n < 3 or sxx / self.w < (0.1 * mx) ** 2 + 1e-12:
            return (0.0, my / max(mx, 1e-9)) if self.proportional else (my, 0.0)
        b = max(sxy / sxx, 0.0)
        return max(my - b * mx, 0.0), b

    def _anchored(self) -> tuple[float, float]:
        """The slope of the samples and the anchor's together (a ridge towards the anchor's, scaled to the
        samples' level), through the samples' mean."""
        a0, b0, spread = self.anchor
        if self.w <= 0:
            return a0, b0
        mx, my, sxx, sxy = self.centred()
        prior = b0 * my / max(a0 + b0 * mx, 1e-12)
        b = max((spread * prior + sxy) / (spread + sxx), 0.0)
        return max(my - b * mx, 0.0), b

    def at(self, x: float) -> float | None:
        line = self.fit()
        return None if line is None else line[0] + line[1] * x
