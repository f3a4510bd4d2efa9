"""`make demo`'s target: the 135M SmolLM2 on a CPU, the 1.5B Qwen2.5-Coder on CUDA when its parts
are installed; both commands get the same target, and the presets compose with it."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from dflash2 import demo
from dflash2.runconfig import check_shared_specs, check_target_spec, configs_dir


@pytest.mark.parametrize("cuda, installed, want", [
    (False, False, "smollm2-135m"), (False, True, "smollm2-135m"),
    (True, False, "smollm2-135m"), (True, True, "qwen2.5-coder-1.5b"),
])
def test_choose_target(cuda, installed, want):
    assert demo.choose_target(cuda, installed) == want


def test_both_commands_run_on_the_chosen_target(tmp_path):
    distill, evaluate = demo.commands("py", "quickstart_gpu", "qwen2.5-coder-1.5b", tmp_path)
    assert distill[:2] == ["py", "train/distill.py"] and evaluate[:2] == ["py", "eval/run.py"]
    for cmd in (distill, evaluate):
        assert "experiment=quickstart_gpu" in cmd and "target=qwen2.5-coder-1.5b" in cmd
    assert f"draft_path={tmp_path / 'distill' / 'final'}" in evaluate


DISTILL_SCHEMA, EVAL_SCHEMA = ("dflash2.training.config:register_distill_schema",
                               "dflash2.evaluation.running.config:register_eval_schema")


@pytest.mark.parametrize("entry, schema, preset", [
    ("distill", DISTILL_SCHEMA, "quickstart_gpu"), ("eval", EVAL_SCHEMA, "quickstart_gpu"),
    ("distill", DISTILL_SCHEMA, "smollm2_mathcode_gpu"), ("eval", EVAL_SCHEMA, "smollm2_exact_gpu"),
])
def test_the_gpu_preset_composes_with_the_qwen_target(entry, schema, preset):
    """The command-line `target=` wins over the preset's `override /target: smollm2-135m` (the demo's
    presets, and the exact-mode drafters and evaluation run on the Qwen target)."""
    import importlib

    module, fn = schema.split(":")
    getattr(importlib.import_module(module), fn)()
    with initialize_config_dir(config_dir=str(configs_dir() / entry), version_base=None):
        cfg = compose(entry, overrides=[f"experiment={preset}", f"target={demo.QWEN_TARGET}"])
    target = OmegaConf.to_object(cfg).target
    assert (target.name, target.source, target.path) == (
        "qwen2.5-coder-1.5b", "gguf", f"asset:{demo.QWEN_ASSET}")
    assert Path(configs_dir() / "target" / f"{demo.SMALL_TARGET}.yaml").is_file()
    check_shared_specs(OmegaConf.to_object(cfg))  # the entry points' own checks accept it (qwen2)


@pytest.mark.parametrize("name", sorted(p.stem for p in (configs_dir() / "target").glob("*.yaml")))
def test_every_target_config_passes_the_entry_points_checks(name):
    """A target preset that the checks refuse (as `architecture: qwen2` once was) is unusable from
    `train/distill.py`, `eval/run.py` and `make demo`, whatever the loading code supports."""
    from dflash2.training.config import register_distill_schema

    register_distill_schema()
    with initialize_config_dir(config_dir=str(configs_dir() / "distill"), version_base=None):
        cfg = compose("distill", overrides=[f"target={name}"])
    spec = OmegaConf.to_object(cfg).target
    assert spec.name == name
    check_target_spec(spec)


def test_an_unknown_target_is_refused_before_any_work(tmp_path):
    with pytest.raises(SystemExit, match="no configs/target/nope.yaml"):
        demo.main(["--target", "nope", "--output-dir", str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()
