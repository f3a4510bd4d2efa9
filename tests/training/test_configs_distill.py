"""Every distill experiment composes into the typed schema; typos fail with the key's name."""


import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from dflash2.runconfig import configs_dir
from dflash2.training.config import DistillConfig, register_distill_schema

EXPERIMENTS = sorted(p.stem for p in (configs_dir() / "distill" / "experiment").glob("*.yaml"))


@pytest.fixture(scope="module", autouse=True)
def _schema():
    register_distill_schema()


def _compose(*overrides):
    with initialize_config_dir(config_dir=str(configs_dir() / "distill"), version_base=None):
        return compose("distill", overrides=list(overrides))


def test_required_experiments_exist():
    assert {"tiny_cpu", "smollm2_cpu", "smollm2_gpu", "qwen3_8b"} <= set(EXPERIMENTS)


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_experiment_composes(name, tmp_path):
    cfg = _compose(f"experiment={name}", f"output_dir={tmp_path}")
    obj = OmegaConf.to_object(cfg)
    assert isinstance(obj, DistillConfig) and obj.experiment_name == name
    obj.train.check()
    assert obj.output_dir == str(tmp_path)


def test_qwen3_8b_is_the_published_recipe():
    t = OmegaConf.to_object(_compose("experiment=qwen3_8b")).train
    assert (t.lr, t.warmup_ratio, t.grad_clip, t.epochs, t.num_anchors, t.gamma) == (6e-4, 0.04, 1.0, 6, 512, 7.0)


@pytest.mark.parametrize("override, key", [("train.lrr=1", "lrr"), ("train.loss_type=kl", "loss_type"),
                                           ("draft.block=8", "block")])
def test_typo_fails_with_the_key(override, key):
    with pytest.raises(Exception, match=key):
        _compose("experiment=tiny_cpu", override)


def test_bad_value_is_named():
    cfg = OmegaConf.to_object(_compose("experiment=tiny_cpu", "train.loss=mse"))
    with pytest.raises(ValueError, match="train.loss"):
        cfg.train.check()
