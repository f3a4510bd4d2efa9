"""Synthetic evaluation records (`dflash2.evaluation.analysis.records.Record` dicts) for the stats / report / W&B tests.

A deterministic toy run: an AR arm and speculative arms at several N over GSM8K-, HumanEval-
and MT-Bench-like samples. Acceptance per slot is Bernoulli(alpha) until the first miss, so
the true pooled tau is known in closed form: E[acc + 1] = sum_{i=0..N} alpha^i.
"""

from __future__ import annotations

import numpy as np

CATEGORIES = ["writing", "math", "coding", "reasoning"]


def expected_tau(alpha: float, n: int) -> float:
    """E[accepted + 1] for per-slot acceptance alpha and N slots (truncated geometric)."""
    return sum(alpha ** i for i in range(n + 1))


def synthetic_records(n_per_dataset: int = 12, ns=(3, 7), alpha: float = 0.7, temperature: float = 0.0,
                      seed: int = 0, flip: dict | None = None, selector_off: bool = False) -> list[dict]:
    """Records for arms `ar` and `dflash2@N=k` (k in `ns`), optionally `selector_off@N=max`.

    Args:
        flip: {arm: [sample indices]} whose correctness is flipped relative to AR (to create
            discordant pairs) and whose output departs from AR at position 3.
    """
    rng = np.random.default_rng(seed)
    flip = flip or {}
    samples = []
    for i in range(n_per_dataset):
        samples.append(("gsm8k", f"gsm8k/{i:04d}", None))
        samples.append(("humaneval", f"humaneval/HumanEval-{i}", None))
        samples.append(("mt_bench", f"mt_bench/{81 + i}/turn1", CATEGORIES[i % len(CATEGORIES)]))
    arms = [("ar", "ar", 0)] + [(f"dflash2@N={n}", "spec", n) for n in ns]
    if selector_off:
        arms.append((f"selector_off@N={max(ns)}", "selector_off", max(ns)))
    recs = []
    for j, (ds, sid, cat) in enumerate(samples):
        length = int(rng.integers(20, 80))
        ar_tokens = rng.integers(0, 1000, size=length).tolist()
        ar_correct = None if ds == "mt_bench" else bool(rng.random() < 0.6)
        base_lp = float(-1.5 + 0.3 * rng.standard_normal())
        for arm, kind, n in arms:
            if n == 0:
                accepted = [0] * (length - 1)
            else:
                accepted, made = [], 1
                a_eff = alpha * (0.8 if kind == "selector_off" else 1.0)
                while made < length:
                    a = 0
                    while a < n and rng.random() < a_eff:
                        a += 1
                    accepted.append(a)
                    made += a + 1
            steps = len(accepted)
            # Cost model: a verify step costs 1 ms plus 0.05 ms per drafted slot, plus noise.
            wall = steps * (1e-3 + 5e-5 * n) * float(rng.uniform(0.95, 1.05)) + 2e-3
            flipped = j in flip.get(arm, [])
            tokens = list(ar_tokens)
            if flipped:
                tokens[3] = (tokens[3] + 1) % 1000
            correct = ar_correct if (ar_correct is None or not flipped) else (not ar_correct)
            lp = base_lp + (0.0 if temperature == 0 else 0.01 * float(rng.standard_normal()))
            recs.append({
                "run_id": "synthetic", "arm": arm, "arm_kind": kind, "num_speculative_tokens": n,
                "temperature": temperature, "dataset": ds, "sample_id": sid, "category": cat, "seed": j,
                "prompt_hash": f"{j:016x}", "prompt_tokens": 30, "tokens": tokens, "text": f"text {sid}",
                "wall_s": wall, "steps": steps, "accepted": accepted, "finish_reason": "stop",
                "correct": correct, "logprob_mean": lp,
                "identical_to_ar": None if kind == "ar" else (not flipped),
                "departure": ({"position": 3, "margin": 0.01, "top1": 1, "top2": 2} if flipped else None),
            })
    return recs


def record(arm: str, sample_id: str, **fields) -> dict:
    """A minimal valid record (`dflash2.evaluation.analysis.records.Record`) of an AR-like generation:
    kind "ar", N = 0, T = 0, two tokens in one step; `fields` override or add any field."""
    base = {"arm": arm, "arm_kind": "ar", "num_speculative_tokens": 0, "temperature": 0.0, "dataset": "gsm8k",
            "sample_id": sample_id, "tokens": [1, 2], "steps": 1, "accepted": [0], "finish_reason": "length",
            "wall_s": 0.01}
    return {**base, **fields}
