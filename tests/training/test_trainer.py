"""Short real training runs on CPU: the loss falls, W&B offline records it, bad input is refused
clearly and nothing is lost."""

import json
import struct
import time

import pytest
import torch

from dflash2.config import DFlash2ConfigError
from dflash2.training.metrics import read_metrics
from dflash2.training.trainer import TrainingDivergedError
from tests.training.distill_helpers import run


def test_loss_falls_and_metrics_are_logged(tmp_path):
    d = run(tmp_path / "run", max_steps=12, checkpoint_every=100)
    rows = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if "loss" in r]
    assert [r["step"] for r in rows] == list(range(1, 13))
    first, last = sum(r["loss"] for r in rows[:3]) / 3, sum(r["loss"] for r in rows[-3:]) / 3
    assert last < first - 0.1, (first, last)
    assert rows[-1]["recall_at_k"] > rows[0]["recall_at_k"]
    for key in ("loss_unary", "loss_selector", "acc_pos_1", "tau_proxy", "recall_at_k", "oracle_tau",
                "tf_selector_acc", "path_tau", "tokens_per_s", "samples_per_s", "peak_mem_gb", "eal"):
        assert key in rows[-1]
    evals = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if "eval/tau_real" in r]
    assert evals and 1.0 <= evals[-1]["eval/tau_real"] <= 8.0 and "eval/gap" in evals[-1]
    assert (d.final / "config.json").is_file()


def _wandb_records(path):
    """Records of a W&B run file: a 7-byte `:W&B` header, then the LevelDB log format (32 KiB
    blocks of chunks `crc u32, length u16, type u8`; full=1, first=2, middle=3, last=4)."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, buf, block = 7, b"", 32768
    while pos + 7 <= len(data):
        if block - pos % block < 7:                 # block trailer too short for a header
            pos += block - pos % block
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        buf += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            rec = wandb_internal_pb2.Record()
            rec.ParseFromString(buf)
            buf = b""
            yield rec


def test_wandb_offline_run_directory_holds_the_losses(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_SILENT", "true")
    import wandb

    run(tmp_path / "run", max_steps=3, checkpoint_every=100, eval_max_new_tokens=0, logger="offline")
    wandb.teardown()       # the wandb-core service writes the run file asynchronously: flush it
    files = list((tmp_path / "run" / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(files) == 1
    logged = {}
    for _ in range(100):
        for rec in _wandb_records(files[0]):
            if rec.WhichOneof("record_type") == "history":
                items = {"/".join(i.nested_key) or i.key: json.loads(i.value_json) for i in rec.history.item}
                logged[rec.history.step.num] = items
        if len(logged) >= 3:
            break
        time.sleep(0.2)
    ours = {r["step"]: r["loss"] for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if "loss" in r}
    assert sorted(ours) == [1, 2, 3] and set(ours) <= set(logged)
    for step, loss in ours.items():
        assert logged[step]["loss"] == pytest.approx(loss, rel=1e-12)


def test_nan_stops_with_step_and_part_and_keeps_last_good_checkpoint(tmp_path):
    from tests.training.distill_helpers import tiny_config  # noqa: F401  (same run as `run`)
    from dflash2.runconfig import new_draft
    from tests.training.distill_helpers import tiny_target

    cfg_draft = tiny_config(tmp_path).draft
    draft = new_draft(cfg_draft, tiny_target(), None, seed=0)
    calls = {"n": 0}

    def poison(_module, _inputs, output):   # a real forward hook: the 5th forward returns NaN
        calls["n"] += 1
        return output * float("nan") if calls["n"] >= 5 else output

    draft.fc.register_forward_hook(poison)
    with pytest.raises(TrainingDivergedError, match=r"non-finite unary .* at step 5.*step_4"):
        run(tmp_path / "run", draft=draft, max_steps=8, checkpoint_every=2)
    ckpts = sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir())
    assert ckpts == ["step_2", "step_4"]
    assert not (tmp_path / "run" / "final").exists()
    state = torch.load(tmp_path / "run" / "checkpoints" / "step_4" / "trainer_state.pt", weights_only=True)
    assert state["step"] == 4


def test_draft_for_another_target_is_refused(tmp_path):
    from tests.conftest import tiny_draft_config
    from dflash2.modeling import DFlash2DraftModel

    other = DFlash2DraftModel(tiny_draft_config(vocab=300, hidden=32, num_target_layers=4))
    with pytest.raises(DFlash2ConfigError, match="hidden_size"):
        run(tmp_path / "run", draft=other)
    other = DFlash2DraftModel(tiny_draft_config(vocab=500, hidden=64))
    with pytest.raises(DFlash2ConfigError, match="vocab_size"):
        run(tmp_path / "run2", draft=other)


def test_check_output_dir_counts_no_run_files_and_no_write_probe(tmp_path):
    """Hydra's files, the job log and another process's writability probe are not an earlier run."""
    from dflash2.runconfig import WRITE_PROBE, check_output_dir

    out = tmp_path / "out"
    (out / ".hydra").mkdir(parents=True)
    for name in ("multirun.yaml", "eval.log", WRITE_PROBE):
        (out / name).write_text("")
    assert check_output_dir(out, False, job_name="eval") == out
    (out / "records.jsonl").write_text("")
    with pytest.raises(FileExistsError, match=r"is not empty \(records.jsonl\)"):
        check_output_dir(out, False, job_name="eval")
    assert check_output_dir(out, True, job_name="eval") == out


def test_output_dir_rules(tmp_path):
    from hydra import compose, initialize_config_dir

    from dflash2.runconfig import configs_dir
    from dflash2.training.config import register_distill_schema
    from dflash2.training.run import run_distill

    register_distill_schema()
    out = tmp_path / "out"
    (out / ".hydra").mkdir(parents=True)
    (out / "distill.log").write_text("")
    (out / "metrics.jsonl").write_text("{}\n")
    with initialize_config_dir(config_dir=str(configs_dir() / "distill"), version_base=None):
        cfg = compose("distill", overrides=["experiment=tiny_cpu", f"output_dir={out}"])
        with pytest.raises(FileExistsError, match=r"metrics.jsonl.*resume=true"):
            run_distill(cfg)
        afile = tmp_path / "file"
        afile.write_text("x")
        cfg = compose("distill", overrides=["experiment=tiny_cpu", f"output_dir={afile}/sub"])
        with pytest.raises(PermissionError, match="not writable"):
            run_distill(cfg)
    assert (out / "metrics.jsonl").read_text() == "{}\n"       # nothing overwritten
