"""The target's training pass held in CUDA graphs (`dflash2.training.teacher.TeacherPass`).

On the CPU a stand-in for `StepGraphs` keeps each shape's outputs as static tensors that every
"replay" rewrites in place, as a real graph does, so the tests check the plumbing a graph needs:
each batch copied into its shape's static inputs, every caller handed its own copy of the outputs.
On CUDA the real graphs must give the eager pass's bits.
"""

from __future__ import annotations

import pytest
import torch

import dflash2.training.teacher as teacher
from tests.training.distill_helpers import VOCAB, synthetic_data, tiny_config, tiny_target


class StaticReplay:
    """CPU stand-in for `StepGraphs`: the first run of a key is eager and "captures" its outputs;
    each later run executes the body and writes the result into those same tensors."""

    def __init__(self, body, device, what=""):
        self.body, self.outputs, self.replays, self.captures, self.failed = body, {}, 0, 0, None

    def run(self, key):
        out = self.body(key)
        if key not in self.outputs:
            self.outputs[key] = out
            self.captures += 1
            return False, out
        for k, v in out.items():
            self.outputs[key][k].copy_(v)
        self.replays += 1
        return True, self.outputs[key]


def _batch(rows: int, length: int, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    cut = length // 3
    doc = torch.cat([torch.zeros(cut, dtype=torch.long), torch.ones(length - cut, dtype=torch.long)])
    pos = torch.cat([torch.arange(cut), torch.arange(length - cut)])
    return {"input_ids": torch.randint(1, VOCAB - 1, (rows, length), generator=g),
            "position_ids": pos.expand(rows, length).clone(), "doc_ids": doc.expand(rows, length).clone()}


def test_the_graph_held_pass_gives_each_batch_its_own_outputs(monkeypatch):
    monkeypatch.setattr(teacher, "StepGraphs", StaticReplay)
    target = tiny_target()
    held = teacher.TeacherPass(target, [0, 2], keep_last=True, graphs=True)
    batches = [_batch(2, 24, 0), _batch(2, 24, 1), _batch(3, 16, 2), _batch(2, 24, 0), _batch(3, 16, 3)]
    outs = [held(b) for b in batches]               # every output kept while later batches run
    for b, got in zip(batches, outs):
        want = teacher.target_pass(target, b, [0, 2], keep_last=True)
        assert got.keys() == want.keys()
        for k in want:
            assert torch.equal(got[k], want[k]), k
    assert not torch.equal(outs[0]["features"], outs[1]["features"])  # the batches differ
    assert held.graphs.captures == 2 and held.graphs.replays == 3     # two shapes, three replays


def test_without_graphs_the_pass_is_target_pass():
    target = tiny_target()
    plain = teacher.TeacherPass(target, [1], keep_last=False, graphs=False)
    assert plain.graphs is None
    b = _batch(2, 20, 4)
    got, want = plain(b), teacher.target_pass(target, b, [1], keep_last=False)
    assert got.keys() == {"features", "teacher_next"}
    assert all(torch.equal(got[k], want[k]) for k in want)


def test_training_through_the_held_pass_is_bitwise_the_eager_run(tmp_path, monkeypatch):
    """Three steps with the graph-held pass (the CPU stand-in forced on) give the eager run's losses
    and weights bit for bit, over batches of several padded lengths."""
    import dflash2.training.trainer as trainer

    def three_steps(out, forced: bool):
        torch.manual_seed(0)
        d = trainer.Distiller(tiny_config(out), tiny_target(), None, synthetic_data(), out)
        if forced:
            d.teacher = teacher.TeacherPass(d.target, d.layer_ids, keep_last=False, graphs=True)
        parts = [d.train_step(s)[0][:3].clone() for s in range(3)]
        return d, parts, {n: p.detach().clone() for n, p in d.draft.named_parameters()}

    monkeypatch.setattr(teacher, "StepGraphs", StaticReplay)
    plain, p_eager, w_eager = three_steps(tmp_path / "eager", forced=False)
    assert plain.teacher.graphs is None  # CPU: no graphs unless forced
    held, p_held, w_held = three_steps(tmp_path / "held", forced=True)
    assert held.teacher.graphs.replays > 0
    for a, b in zip(p_eager, p_held):
        assert torch.equal(a, b)
    for n, w in w_eager.items():
        assert torch.equal(w_held[n], w), n


@pytest.mark.gpu
def test_cuda_graphs_give_the_eager_bits():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    target = tiny_target().to("cuda").to(torch.bfloat16)
    held = teacher.TeacherPass(target, [0, 2], keep_last=True, graphs=True)
    batches = [{k: v.cuda() for k, v in _batch(4, 256, s).items()} for s in (0, 1, 2, 0)]
    outs = [held(b) for b in batches]
    assert held.graphs.failed is None, held.graphs.failed
    assert held.graphs.captures == 1 and held.graphs.replays == 3
    for b, got in zip(batches, outs):
        want = teacher.target_pass(target, b, [0, 2], keep_last=True)
        for k in want:
            assert torch.equal(got[k], want[k]), k
