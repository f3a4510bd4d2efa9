"""The trainer's speed options: its profiler ranges with `benchmarks.distill.phase_table` (the
`--profile` breakdown), and `train.compile`."""

from types import SimpleNamespace

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks.distill import phase_table
from tests.training.distill_helpers import synthetic_data, tiny_config, tiny_target

PHASES = ("batch", "target_pass", "mask", "forward", "backward", "optimizer")


def test_a_train_step_runs_inside_the_named_ranges(tmp_path):
    from dflash2.training.trainer import Distiller

    torch.manual_seed(0)
    d = Distiller(tiny_config(tmp_path, grad_accum=2), tiny_target(), None, synthetic_data(), tmp_path)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        d.train_step(0)
        d.train_step(1)
    counts = {e.key: e.count for e in prof.key_averages() if e.key.startswith("distill.")}
    # two steps of two micro-batches each: one batch/target/mask/forward/backward per micro-batch
    assert counts == {**{f"distill.{p}": 4 for p in PHASES[:5]}, "distill.optimizer": 2}
    table = phase_table(prof.key_averages(), 2)
    assert [line.split(" |")[0][2:] for line in table.splitlines()[2:2 + len(PHASES)]] == sorted(PHASES)


def test_phase_table_per_step_and_the_remainder():
    from torch.autograd import DeviceType

    def ev(key, count, cpu, gpu, self_gpu, **kind):
        return SimpleNamespace(key=key, count=count, cpu_time_total=cpu, device_time_total=gpu,
                               self_device_time_total=self_gpu, **kind)

    events = [ev("distill.forward", 2, 4000.0, 6000.0, 0.0), ev("distill.target_pass", 2, 1000.0, 2000.0, 0.0),
              ev("aten::mm", 10, 500.0, 8000.0, 8000.0), ev("backward_kernel", 4, 0.0, 4000.0, 4000.0)]
    # On CUDA each range is also a device-side annotation spanning its kernels: not a phase, not kernel time.
    spans = [ev("distill.forward", 2, 0.0, 7000.0, 7000.0, device_type=DeviceType.CUDA, is_user_annotation=True),
             ev("distill.target_pass", 2, 0.0, 2500.0, 2500.0, device_type=DeviceType.CUDA, is_user_annotation=True)]
    for evs in (events, events[:2] + spans + events[2:]):
        lines = phase_table(evs, 2).splitlines()
        assert lines[2] == "| forward | 1 | 2.00 | 3.00 |" and lines[3] == "| target_pass | 1 | 0.50 | 1.00 |"
        assert lines[4].endswith("| 2.00 |")    # (12000 us of kernels - 8000 inside the ranges) / 2 steps
        assert lines[5] == "| all | - | - | 6.00 |"


def _three_steps(out, device="cpu", **train):
    from dflash2.training.trainer import Distiller

    torch.manual_seed(0)
    cfg = tiny_config(out, **train)
    if device != "cpu":
        cfg.hardware.device = device
    d = Distiller(cfg, tiny_target().to(device), None, synthetic_data(), out)
    parts = [d.train_step(s)[0][:3].double().cpu() for s in range(3)]
    return parts, {n: p.detach().float().cpu() for n, p in d.draft.named_parameters()}


def _compiled_matches_eager(tmp_path, device):
    eager, w_eager = _three_steps(tmp_path / "eager", device)
    compiled, w_comp = _three_steps(tmp_path / "compiled", device, compile=True)
    for a, b in zip(eager, compiled):   # loss, unary, selector per step
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)
    assert not torch.equal(eager[0], eager[2])   # the steps trained something
    for name, w in w_eager.items():
        torch.testing.assert_close(w_comp[name], w, rtol=1e-3, atol=1e-4)


@pytest.mark.slow
def test_train_compile_matches_eager_on_cpu(tmp_path):
    """`train.compile=true` (Inductor) gives the eager losses and weights up to rounding (~1 min of
    compilation on a 2-core CPU, hence slow)."""
    _compiled_matches_eager(tmp_path, "cpu")


@pytest.mark.gpu
def test_train_compile_matches_eager_on_cuda(tmp_path):
    _compiled_matches_eager(tmp_path, "cuda")


def test_train_compile_is_refused_with_fsdp_in_one_line(tmp_path):
    from dflash2.entrypoint import UserError
    from dflash2.training import trainer

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(trainer, "distributed_mode", lambda hw, acc: "fsdp")
        mp.setattr(trainer, "shard_objective", lambda objective, device, acc: False)
        with pytest.raises(UserError, match="train.compile=true with FSDP"):
            trainer.Distiller(tiny_config(tmp_path, compile=True), tiny_target(), None, synthetic_data(), tmp_path)
