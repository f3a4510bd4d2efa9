"""Several arms in one process (`dflash2.training.arms`): each arm's files equal that arm
trained alone (bitwise on CPU), resume works per arm, mismatched arms are refused."""

from __future__ import annotations

import shutil
from dataclasses import replace

import pytest
import torch
from safetensors.torch import load_file

from dflash2.runconfig import prepare_output_dir
from dflash2.training.arms import ArmGroup, arm_configs
from dflash2.training.metrics import read_metrics
from dflash2.training.trainer import Distiller
from tests.training.distill_helpers import synthetic_data, tiny_config, tiny_target

ARMS = ["dflash2", "conv_only", "v1"]


def _group(root, arms=ARMS, resume=False, **train):
    torch.manual_seed(0)
    cfg = replace(tiny_config(root, **train), arms=list(arms), resume=resume)
    configs = arm_configs(cfg)
    target, data = tiny_target(), synthetic_data()
    makers = {}
    for name, c in configs.items():
        prepare_output_dir(c.output_dir, resume)
        makers[name] = lambda c=c: Distiller(c, target, None, data, c.output_dir)
    return ArmGroup.build(makers)


def _alone(out, arm_cfg):
    torch.manual_seed(0)
    target, data = tiny_target(), synthetic_data()
    prepare_output_dir(out, False)
    c = replace(arm_cfg, output_dir=str(out))
    return Distiller(c, target, None, data, out).fit()


def _same_files(a, b):
    wa, wb = load_file(a / "final" / "model.safetensors"), load_file(b / "final" / "model.safetensors")
    assert wa.keys() == wb.keys()
    for k in wa:
        assert torch.equal(wa[k], wb[k]), k
    for step in ("step_3", "step_6"):
        sa = torch.load(a / "checkpoints" / step / "trainer_state.pt", weights_only=False)
        sb = torch.load(b / "checkpoints" / step / "trainer_state.pt", weights_only=False)
        assert sa["step"] == sb["step"]
        assert torch.equal(sa["rng"]["torch"], sb["rng"]["torch"])
        for ka, kb in zip(sa["optimizer"]["state"].values(), sb["optimizer"]["state"].values()):
            for name in ("exp_avg", "exp_avg_sq"):
                assert torch.equal(ka[name], kb[name])
    la = [(r["step"], r.get("loss")) for r in read_metrics(a / "metrics.jsonl")]
    lb = [(r["step"], r.get("loss")) for r in read_metrics(b / "metrics.jsonl")]
    assert la == lb


def test_each_arm_equals_that_arm_trained_alone(tmp_path):
    group = _group(tmp_path / "group")
    assert len({id(d.teacher) for d in group.arms.values()}) == 1  # one target pass (and graph set) for all
    finals = group.fit(progress=False)
    assert sorted(finals) == sorted(ARMS)
    configs = arm_configs(replace(tiny_config(tmp_path / "group"), arms=ARMS))
    assert configs["v1"].draft.architecture == "v1" and configs["conv_only"].train.selector_alpha == 0.0
    for name in ARMS:
        _alone(tmp_path / f"alone_{name}", configs[name])
        _same_files(tmp_path / "group" / name, tmp_path / f"alone_{name}")
    # The arms really differ (the test would pass trivially if they trained one draft).
    w = {n: load_file(tmp_path / "group" / n / "final" / "model.safetensors") for n in ARMS}
    key = next(k for k in w["dflash2"] if k in w["conv_only"] and w["dflash2"][k].is_floating_point()
               and "layers.0" in k)
    assert not torch.equal(w["dflash2"][key], w["conv_only"][key])
    assert set(w["dflash2"]) != set(w["v1"])


def test_resume_per_arm_after_arms_stopped_at_different_steps(tmp_path):
    ref = _group(tmp_path / "ref").fit(progress=False)
    root = tmp_path / "run"
    _group(root).fit(progress=False)
    # As after a kill: conv_only lost its last checkpoint and export, v1 lost everything.
    shutil.rmtree(root / "conv_only" / "checkpoints" / "step_6")
    shutil.rmtree(root / "conv_only" / "final")
    shutil.rmtree(root / "v1")
    metrics = root / "conv_only" / "metrics.jsonl"
    finals = _group(root, resume=True).fit(progress=False)
    assert sorted(finals) == sorted(ARMS)
    for name in ARMS:
        _same_files(root / name, ref[name].parent)
    assert [r["step"] for r in read_metrics(metrics) if "loss" in r] == [1, 2, 3, 4, 5, 6]


def test_arms_that_would_see_different_batches_are_refused(tmp_path):
    torch.manual_seed(0)
    target, data = tiny_target(), synthetic_data()
    a = tiny_config(tmp_path / "a")
    b = replace(tiny_config(tmp_path / "b", num_anchors=5))
    makers = {"a": lambda: Distiller(a, target, None, data, tmp_path / "a"),
              "b": lambda: Distiller(b, target, None, data, tmp_path / "b")}
    with pytest.raises(ValueError, match="different batches"):
        ArmGroup.build(makers)


def test_unknown_or_repeated_arm_is_refused(tmp_path):
    with pytest.raises(ValueError, match="not an ablation_arm preset.*conv_only"):
        arm_configs(replace(tiny_config(tmp_path), arms=["dflash3"]))
    with pytest.raises(ValueError, match="at most once"):
        arm_configs(replace(tiny_config(tmp_path), arms=["v1", "v1"]))
