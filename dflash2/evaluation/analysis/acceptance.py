"""Acceptance algebra of speculative decoding: the conditional per-position acceptance profile
`a_i = P(slot i accepted | slots 1..i-1 accepted)` and the tokens per step it gives,
`E[tokens/step](N) = 1 + sum_{k=1..N} prod_{i<=k} a_i` (tau including the bonus token). The
eval summaries report the unconditional `u_i = P(at least i drafts accepted)`; `u_i = a_1 * ... *
a_i` (`dflash2.engine.stats.conditional_acceptance`). Used by the cost model
(`dflash2.evaluation.analysis.cost`)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from dflash2.engine.stats import conditional_acceptance, per_position_acceptance


def expected_tokens_per_step(profile: Sequence[float], n: int) -> float:
    """E[tokens per step] for N = `n` from a *conditional* acceptance profile.

    Args:
        profile: `a_i = P(slot i accepted | slots < i accepted)`, i = 1..len(profile).
        n: number of drafted slots (0 = AR: one token per step).
    Returns:
        `1 + sum_{k=1..n} prod_{i<=k} a_i` (tau including the bonus token).
    """
    if n < 0:
        raise ValueError(f"n={n}: must be >= 0")
    if n > len(profile):
        raise ValueError(f"n={n} exceeds the acceptance profile's {len(profile)} positions; measure at a larger N "
                         "or extend the profile (AcceptanceProfile.extended)")
    surv, total = 1.0, 1.0
    for a in profile[:n]:
        if not 0.0 <= a <= 1.0:
            raise ValueError(f"acceptance probability {a} is not in [0, 1]")
        surv *= a
        total += surv
    return total


@dataclass(frozen=True)
class AcceptanceProfile:
    """Conditional per-position acceptance `a_i` (see module docstring) and where it came from."""

    conditional: tuple[float, ...]
    source: str = ""
    extended_from: int | None = None  # set when positions beyond the measured ones were filled in

    @classmethod
    def from_unconditional(cls, unconditional: Sequence[float], source: str = "") -> AcceptanceProfile:
        """From `u_i = P(>= i accepted)` (what `stats.per_position_acceptance` reports):
        `a_i = u_i / u_{i-1}` (`engine.stats.conditional_acceptance`); after a position with
        `u = 0` every `a` is 0. Raises ValueError for a missing `u` or one outside [0, 1]."""
        if any(u is None for u in unconditional):
            raise ValueError(f"unconditional acceptance {list(unconditional)} has unmeasured (None) positions")
        return cls(tuple(conditional_acceptance(unconditional)), source)

    @classmethod
    def from_accepted(cls, accepted: Iterable[Iterable[int]], n: int, source: str = "") -> AcceptanceProfile:
        """Pooled over all steps of per-row accepted counts (each in 0..n)."""
        accepted = [list(row) for row in accepted]
        if not any(accepted):
            raise ValueError(f"no decoding steps to estimate an acceptance profile from ({source or 'records'})")
        return cls.from_unconditional(per_position_acceptance(accepted, n), source)

    @classmethod
    def pooled(cls, accepted_by_n: dict[int, Iterable[Iterable[int]]], source: str = "") -> AcceptanceProfile:
        """Conditional rates pooled over runs at several N: `a_i` = steps accepting >= i / steps
        accepting >= i - 1, over the runs with N >= i (valid when a slot's acceptance does not
        depend on N, as for the oracle proposer; more steps per position than one run gives).

        Args:
            accepted_by_n: N -> per-row, per-step accepted counts of runs at that N.
        """
        steps = {n: np.array([a for row in acc for a in row], dtype=np.int64) for n, acc in accepted_by_n.items()}
        top = max(steps) if steps else 0
        cond = []
        for i in range(1, top + 1):
            reached = sum(int((s >= i - 1).sum()) for n, s in steps.items() if n >= i)
            hits = sum(int((s >= i).sum()) for n, s in steps.items() if n >= i)
            cond.append(hits / reached if reached else 0.0)
        if not any(s.size for s in steps.values()):
            raise ValueError(f"no decoding steps to estimate an acceptance profile from ({source or 'runs'})")
        return cls(tuple(cond), source)

    @property
    def unconditional(self) -> list[float]:
        return list(np.cumprod(self.conditional)) if self.conditional else []

    def extended(self, n: int) -> AcceptanceProfile:
        """Profile with at least `n` positions, repeating the last measured conditional rate (flagged)."""
        if n <= len(self.conditional):
            return self
        if not self.conditional:
            raise ValueError("cannot extend an empty acceptance profile")
        last = self.conditional[-1]
        return AcceptanceProfile(self.conditional + (last,) * (n - len(self.conditional)), self.source,
                                 len(self.conditional))

    def expected_tokens(self, n: int) -> float:
        return expected_tokens_per_step(self.conditional, n)
