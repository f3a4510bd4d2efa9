"""The final export is a z-lab checkpoint that loads and generates losslessly; warm starts."""

import json

import torch

from dflash2.engine import speculative_generate
from dflash2.modeling import DFlash2DraftModel
from dflash2.training.export import export_final, training_info, warm_start
from tests.conftest import tiny_draft_config
from tests.training.distill_helpers import run, tiny_target


def test_export_loads_and_generates_losslessly(tmp_path):
    d = run(tmp_path / "run", max_steps=4, checkpoint_every=100, eval_max_new_tokens=0)
    final = d.final
    cfg = json.loads((final / "config.json").read_text())
    assert cfg["architectures"] == ["DFlash2DraftModel"]
    assert training_info(final)["format_hash"] == "synthetic0000000" and training_info(final)["steps"] == 4
    draft = DFlash2DraftModel.from_pretrained(final)
    for name, t in d.draft.state_dict().items():           # the trained weights, unchanged
        assert torch.equal(draft.state_dict()[name], t.to(draft.dtype).cpu()), name
    target = tiny_target()
    prompts = [torch.tensor([5, 17, 42, 7, 99]), torch.tensor([3, 8, 250, 11])]
    spec = speculative_generate(target, draft, prompts, max_new_tokens=24)
    ar = speculative_generate(target, None, prompts, max_new_tokens=24)
    assert all(torch.equal(a, b) for a, b in zip(spec.sequences, ar.sequences))


def test_export_and_checkpoint_files_get_the_umask_mode(tmp_path):
    """Every file of the export and of the training checkpoints is readable as the umask allows
    (0o644 under 0o022), the weights included (safetensors writes them owner-only, 0o600)."""
    import os
    import stat

    old = os.umask(0o022)
    try:
        d = run(tmp_path / "run", max_steps=2, checkpoint_every=1, eval_max_new_tokens=0)
    finally:
        os.umask(old)
    files = [f for root in (d.final, tmp_path / "run" / "checkpoints") for f in root.rglob("*") if f.is_file()]
    assert {f.name for f in files} >= {"model.safetensors", "config.json", "trainer_state.pt"}
    assert {str(f): oct(stat.S_IMODE(f.stat().st_mode)) for f in files} == {str(f): "0o644" for f in files}


def test_v1_checkpoint_warm_starts_a_dflash2_draft(tmp_path):
    v1 = DFlash2DraftModel(tiny_draft_config(v2=False, vocab=300))
    export_final(v1, tmp_path / "v1", {"format_hash": "x"})
    v2 = warm_start(tmp_path / "v1", "dflash2")
    assert v2.config.is_dflash2
    sd = v2.state_dict()
    for name, t in v1.state_dict().items():
        assert torch.equal(sd[name], t)
    # Identity conv + zero successor codebook: the warm-started DFlash2 draft computes what v1 does.
    H = v1.config.hidden_size
    pos, noise, feats = torch.arange(12)[None], torch.randn(1, 8, H), torch.randn(1, 4, 2 * H)
    with torch.no_grad():
        torch.testing.assert_close(v2(pos, noise, feats), v1(pos, noise, feats))
