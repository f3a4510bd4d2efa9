"""Every eval experiment composes against the structured schema; typos fail with their name;
the run identity follows the config and the prompt format."""

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from dflash2.evaluation.running.config import register_eval_schema, run_identity, validate

CONFIG_DIR = Path(__file__).resolve().parents[2] / "configs" / "eval"
EXPERIMENTS = sorted(p.stem for p in (CONFIG_DIR / "experiment").glob("*.yaml"))


def _compose(overrides):
    register_eval_schema()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        return compose(config_name="eval", overrides=overrides)


def test_required_experiments_exist():
    assert {"tiny_cpu", "smollm2_cpu", "smollm2_gpu", "qwen3_8b"} <= set(EXPERIMENTS)


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_experiment_composes_and_validates(name):
    cfg = _compose([f"experiment={name}", "output_dir=/tmp/x"])
    validate(cfg)
    assert cfg.experiment_name == name
    assert cfg.target.name and cfg.arms.num_speculative_tokens


def test_tiny_cpu_is_cpu_small_and_checked():
    cfg = _compose(["experiment=tiny_cpu"])
    assert cfg.hardware.device == "cpu" and cfg.target.source == "random" and cfg.target.dtype == "float32"
    assert cfg.data.limit == 3 and cfg.data.source == "local" and sorted(cfg.data.datasets) == [
        "gsm8k", "humaneval", "mt_bench"]
    assert cfg.arms.oracle and cfg.checks.oracle_min_accepted >= 1.0 and cfg.checks.require_identical
    assert cfg.temperature == 0.0


@pytest.mark.parametrize("override", ["arms.num_speculativ_tokens=[1]", "tempreature=0.5", "data.limt=3"])
def test_typo_fails_with_its_name(override):
    with pytest.raises(Exception, match=override.split("=")[0].split(".")[-1]):
        _compose(["experiment=tiny_cpu", override])


@pytest.mark.parametrize("override, match", [
    ("batch_size=0", "batch_size"), ("data.datasets=[mmlu]", "mmlu"),
    ("data.gsm8k_limit=0", "gsm8k_limit"),
    ("arms.num_speculative_tokens=[0]", "arms.ar"), ("arms.oracle_accept_prob=1.5", "oracle_accept_prob"),
    ("compile_level=fast", "compile_level"),
    ("compile_level=light exact=true exact_impl=rows", "with exact_impl='rows'"),
    ("compile_level=full exact=true exact_impl=invariant", "is 'full' with exact=True"),
    ("attention_impl=flash", "attention_impl"), ("exact=true exact_impl=fast", "exact_impl"),
    ("linear_impl=cublas", "linear_impl"), ("linear_impl=triton exact=true", "exact mode picks its own"),
    ("graphs=true hardware.device=cpu", "CUDA graphs need a CUDA device, and this run's is cpu"),
    ("kernel_impl=cuda", "kernel_impl"),
])
def test_inconsistent_settings_fail_with_the_fix(override, match):
    cfg = _compose(["experiment=tiny_cpu", *override.split()])
    with pytest.raises(ValueError, match=match):
        validate(cfg)


def test_invariant_exact_mode_is_refused_before_work_where_its_kernels_cannot_run(monkeypatch):
    import dflash2.kernels.dispatch as dispatch

    cfg = _compose(["experiment=tiny_cpu", "exact=true", "exact_impl=invariant", "hardware.device=cpu"])
    monkeypatch.setattr(dispatch, "triton_interpreter_enabled", lambda: False)
    with pytest.raises(ValueError, match="exact_impl: is .invariant. but it runs its kernels on CUDA"):
        validate(cfg)
    monkeypatch.setattr(dispatch, "triton_interpreter_enabled", lambda: True)  # the interpreter runs them
    validate(cfg)
    monkeypatch.setattr(dispatch, "triton_available", lambda: False)
    with pytest.raises(ValueError, match="needs Triton"):
        validate(cfg)
    validate(_compose(["experiment=tiny_cpu", "exact=true", "exact_impl=rows", "hardware.device=cpu"]))


def test_triton_attention_is_refused_before_work_where_it_cannot_run(monkeypatch):
    import dflash2.kernels.dispatch as dispatch

    cfg = _compose(["experiment=tiny_cpu", "attention_impl=triton", "hardware.device=cpu"])
    monkeypatch.setattr(dispatch, "triton_interpreter_enabled", lambda: False)
    with pytest.raises(ValueError, match="attention_impl=triton: impl='triton' cannot run on device cpu"):
        validate(cfg)
    monkeypatch.setattr(dispatch, "triton_interpreter_enabled", lambda: True)  # the interpreter runs it
    validate(cfg)


@pytest.mark.parametrize("name", ["linear_impl", "kernel_impl"])
def test_triton_linear_and_kernels_are_refused_before_work_where_they_cannot_run(monkeypatch, name):
    import dflash2.kernels.dispatch as dispatch

    cfg = _compose(["experiment=tiny_cpu", f"{name}=triton", "hardware.device=cpu"])
    monkeypatch.setattr(dispatch, "triton_interpreter_enabled", lambda: False)
    with pytest.raises(ValueError, match=f"{name}=triton: impl='triton' cannot run on device cpu"):
        validate(cfg)
    monkeypatch.setattr(dispatch, "triton_interpreter_enabled", lambda: True)
    validate(cfg)


def test_graphs_with_row_by_row_exact_mode_is_refused_before_work(monkeypatch):
    import torch

    import dflash2.runconfig as runconfig

    monkeypatch.setattr(runconfig, "resolve_device", lambda hardware: torch.device("cuda"))  # as on a GPU machine
    cfg = _compose(["experiment=tiny_cpu", "graphs=true", "exact=true", "exact_impl=rows", "hardware.device=auto"])
    with pytest.raises(ValueError, match="graphs=true with exact_impl=rows"):
        validate(cfg)


def test_run_identity_ignores_output_and_logger_but_not_format():
    fmt = {"chat_template_sha": "abc", "enable_thinking": False, "hash": "h1"}
    a, _ = run_identity(_compose(["experiment=tiny_cpu", "output_dir=/a"]), fmt)
    b, _ = run_identity(_compose(["experiment=tiny_cpu", "output_dir=/b", "logger=offline", "resume=true"]), fmt)
    c, _ = run_identity(_compose(["experiment=tiny_cpu", "max_new_tokens=5"]), fmt)
    d, _ = run_identity(_compose(["experiment=tiny_cpu", "output_dir=/a"]), {**fmt, "enable_thinking": True})
    e, _ = run_identity(_compose(["experiment=tiny_cpu", "compile_level=light"]), fmt)  # may change bf16 outputs
    f, _ = run_identity(_compose(["experiment=tiny_cpu", "attention_impl=torch"]), fmt)  # likewise
    g, _ = run_identity(_compose(["experiment=tiny_cpu", "linear_impl=triton"]), fmt)  # likewise
    assert a == b and len({a, c, d, e, f, g}) == 6


def test_per_dataset_limits_override_the_common_limit():
    from dflash2.evaluation.running import datasets as ds
    from dflash2.evaluation.running.runner import dataset_limit

    cfg = _compose(["experiment=tiny_cpu", "data.gsm8k_limit=5", "data.mt_bench_limit=1"])
    validate(cfg)
    d = cfg.data
    counts = {name: len(ds.load_items(name, source=d.source, limit=dataset_limit(d, name)))
              for name in d.datasets}
    assert counts == {"gsm8k": 5, "humaneval": 3, "mt_bench": 1}
