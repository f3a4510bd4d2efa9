"""`train.cache_target`: the frozen target runs once per training sequence, and training on its
cached outputs follows the uncached run's loss curve (fp32; the only difference is that each
sequence is run alone instead of padded into a batch, which moves losses by float rounding)."""

from __future__ import annotations

import pytest
import torch

from dflash2.training.metrics import read_metrics
from dflash2.training.target_cache import TargetPassCache
from dflash2.training.teacher import target_pass
from tests.training.distill_helpers import run, synthetic_data, tiny_target


def test_cached_outputs_equal_a_pass_over_the_sequence_alone():
    target, data = tiny_target(), synthetic_data(n=3)
    cache = TargetPassCache(lambda b: target_pass(target, b, [0, 2], keep_last=True), "cpu")
    S = max(s["input_ids"].numel() for s in data.train) + 5
    got = cache.outputs([0, 1, 2], data.train, S)
    for i, s in enumerate(data.train):
        alone = target_pass(target, {k: v[None] for k, v in s.items()}, [0, 2], keep_last=True)
        L = s["input_ids"].numel()
        for key, v in alone.items():
            assert torch.equal(got[key][i, :L], v[0]), key
            assert torch.all(got[key][i, L:] == 0), key  # padding: zeros, never attended or trained on
    assert len(cache) == 3


def test_cached_run_follows_the_uncached_loss_curve_and_runs_the_target_once_per_sequence(tmp_path, monkeypatch):
    import dflash2.training.teacher as teacher

    calls = []
    real = teacher.target_pass
    monkeypatch.setattr(teacher, "target_pass", lambda t, b, *a, **k: calls.append(b["input_ids"].shape[0])
                        or real(t, b, *a, **k))
    steps = 8  # 4 per epoch over the 8 synthetic sequences (batch 4): every sequence seen twice
    run(tmp_path / "plain", max_steps=steps, checkpoint_every=100)
    plain_calls = len(calls)
    calls.clear()
    run(tmp_path / "cached", max_steps=steps, checkpoint_every=100, cache_target=True)
    # plain: one batched pass per step + one for the final held-out evaluation (2 sequences);
    # cached: one pass per training sequence and per held-out sequence, each run alone.
    assert plain_calls == steps + 1 and calls == [1] * (8 + 2)
    loss = {name: [r["loss"] for r in read_metrics(tmp_path / name / "metrics.jsonl") if "loss" in r]
            for name in ("plain", "cached")}
    assert len(loss["cached"]) == steps
    assert loss["cached"] == pytest.approx(loss["plain"], rel=1e-4)
