"""Bad inputs found by trying the entry points, each refused before any work (`dflash2.preflight`
and the config checks): one `error:` line on stderr, exit status 2, nothing written anywhere.
And a run that failed after it started leaves a directory a corrected rerun or `resume=true`
can use; a resume under a changed config is refused in one line naming the changed keys."""

from __future__ import annotations

import json
import runpy
import shutil

import pytest

from tests.conftest import randomize_, tiny_draft_config
from tests.test_entry_points import DISTILL, EVAL, _refused, _run, _snapshot, workdir  # noqa: F401 - a fixture

FAST = ["data.datasets=[gsm8k]", "data.limit=1", "max_new_tokens=4", "stats.n_resamples=20",
        "checks.oracle_min_accepted=null"]


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    """Draft checkpoints for the `tiny-qwen3` target (4 layers, hidden 64, vocab 151936; block 8):
    a good one and damaged copies."""
    from dflash2 import DFlash2DraftModel

    root = tmp_path_factory.mktemp("ckpts")
    good = root / "good"
    randomize_(DFlash2DraftModel(tiny_draft_config(vocab=151936)), seed=1).save_pretrained(good)

    def copy(name: str):
        shutil.copytree(good, root / name)
        return root / name

    data = (good / "model.safetensors").read_bytes()
    (copy("truncated") / "model.safetensors").write_bytes(data[: len(data) // 2])
    (copy("trailing") / "model.safetensors").write_bytes(data + b"\0" * 64)
    (copy("bad_header") / "model.safetensors").write_bytes((len(data) * 4).to_bytes(8, "little") + data[8:])
    (copy("no_weights") / "model.safetensors").unlink()
    (copy("no_config") / "config.json").unlink()
    (copy("config_not_json") / "config.json").write_text("{not json")
    cfg = json.loads((good / "config.json").read_text())
    (copy("layers_mismatch") / "config.json").write_text(json.dumps({**cfg, "num_hidden_layers": 1,
                                                                  "layer_types": ["full_attention"]}))
    randomize_(DFlash2DraftModel(tiny_draft_config(vocab=300)), seed=1).save_pretrained(root / "vocab300")
    randomize_(DFlash2DraftModel(tiny_draft_config(vocab=151936, hidden=32)), seed=1).save_pretrained(root / "hidden32")
    (root / "a_file").write_text("not a directory")
    return root


EVAL_CASES = [
    # (id, overrides, expected text of the one line); "{c}" is the checkpoint root
    ("N-over-fresh-block", ["arms.num_speculative_tokens=[99]"],
     "arms.num_speculative_tokens=[99]: [99] exceed the draft's block: draft.block_size=16 (a fresh draft) has "
     "block_size 16, so N is at most 15"),
    ("N-16-fresh-block", ["arms.num_speculative_tokens=[3,16]"], "[16] exceed the draft's block"),
    ("adaptive-N-over-fresh-block", ["arms.adaptive=true", "arms.adaptive_num_speculative_tokens=[3,16]"],
     "arms.adaptive_num_speculative_tokens=[3, 16]: [16] exceed the draft's block: draft.block_size=16"),
    ("tree-budget-1", ["arms.tree=true", "arms.tree_budgets=[1,16]"], "arms.tree_budgets=[1, 16]: [1] outside 2..64"),
    ("N-over-checkpoint-block", ["draft_path={c}/good", "arms.num_speculative_tokens=[7,9]"],
     "[9] exceed the draft's block: the draft at draft_path={c}/good has block_size 8, so N is at most 7"),
    ("truncated-weights", ["draft_path={c}/truncated"],
     "{c}/truncated/model.safetensors: not a readable safetensors file, it is truncated or corrupted"),
    ("trailing-bytes", ["draft_path={c}/trailing"], "its header describes"),
    ("bad-header-length", ["draft_path={c}/bad_header"], "its header claims"),
    ("no-weights", ["draft_path={c}/no_weights"], "draft_path={c}/no_weights: no *.safetensors in"),
    ("no-config", ["draft_path={c}/no_config"], "draft_path={c}/no_config: {c}/no_config has no config.json"),
    ("config-not-json", ["draft_path={c}/config_not_json"], "config.json: not valid JSON"),
    ("tensors-vs-config", ["draft_path={c}/layers_mismatch"], "is in the checkpoint but not in a DFlash2 (conv + "
     "selector) draft with this config"),
    ("vocab-mismatch", ["draft_path={c}/vocab300"], "draft_path={c}/vocab300 does not fit target=tiny-qwen3 (4 layers, "
     "hidden 64, vocab 151936): vocab_size: draft 300 != target 151936"),
    ("hidden-mismatch", ["draft_path={c}/hidden32"], "hidden_size: draft 32 != target 64"),
    ("draft-path-a-file", ["draft_path={c}/a_file"], "draft_path={c}/a_file: no such checkpoint directory"),
    ("fresh-draft-layer-ids", ["draft.target_layer_ids=[1,9]"], "draft.target_layer_ids=[1, 9]: target=tiny-qwen3 "
     "has 4 layers (0..3), so [9] do not exist"),
    ("top_p-0", ["top_p=0"], "top_p=0.0: must be in (0, 1]"),
    ("top_p-1.5", ["top_p=1.5"], "top_p=1.5: must be in (0, 1]"),
    ("top_k-negative", ["top_k=-1"], "top_k=-1: must be >= 0"),
    ("few_shot-negative", ["data.few_shot=-1"], "data.few_shot=-1: use >= 0"),
    ("n_resamples-0", ["stats.n_resamples=0"], "stats.n_resamples=0: use >= 1"),
    ("margin-negative", ["stats.accuracy_margin=-0.1"], "stats.accuracy_margin=-0.1: the TOST equivalence margin"),
    ("sandbox-timeout-0", ["sandbox.timeout_s=0"], "sandbox.timeout_s=0.0"),
    ("max_new_tokens-past-positions", ["max_new_tokens=100000"], "max_new_tokens=100000 plus the 2 positions of the "
     "widest arm's last block (N=3) reaches position 100002 even after a one-token prompt, but target=tiny-qwen3 has "
     "max_position_embeddings 40960; use max_new_tokens <= 40957"),
    # Exact mode pads every forward to the widest arm (an oracle N + 1 above the block): 100 wide does not
    # fit the invariant kernels' tile (64 rows) for 2 query heads per K/V head (runs under TRITON_INTERPRET=1).
    ("exact-width-past-the-kernel", ["exact=true", "exact_impl=invariant", "arms.oracle_num_speculative_tokens=[99]"],
     "exact_impl=invariant: every target forward runs 100 tokens wide (the widest arm: block 16, arms without the "
     "drafter up to N 99)"),
    ("oracle-check-without-oracle", ["arms.oracle=false", "checks.oracle_min_accepted=1.0"],
     "checks.oracle_min_accepted=1.0 with arms.oracle=false: there is no oracle arm to check"),
]


@pytest.mark.parametrize("overrides, match", [c[1:] for c in EVAL_CASES], ids=[c[0] for c in EVAL_CASES])
def test_eval_refuses_before_any_work(workdir, tmp_path, ckpts, monkeypatch, capsys, overrides, match):  # noqa: F811
    out = tmp_path / "run"
    line = _refused(EVAL, "experiment=tiny_cpu", f"output_dir={out}", *FAST[:-1],
                    *[o.format(c=ckpts) for o in overrides], monkeypatch=monkeypatch, capsys=capsys,
                    match=match.format(c=ckpts))
    assert "Traceback" not in line
    assert not out.exists() and list(workdir.iterdir()) == []


def test_a_good_checkpoint_passes_the_checks(ckpts):
    """The checks refuse what is wrong only: the good checkpoint at N = 7 (its block's limit) passes."""
    from tests.evaluation.test_eval_configs import _compose

    runpy_ns = runpy.run_path(str(EVAL), run_name="eval_checks")
    cfg = _compose(["experiment=tiny_cpu", f"draft_path={ckpts / 'good'}", "arms.num_speculative_tokens=[1,7]",
                    "arms.oracle_num_speculative_tokens=[30]"])
    obj = runpy_ns["checked"](cfg)
    assert obj.draft_path == str(ckpts / "good")


DISTILL_CASES = [
    ("target-layer-ids", ["draft.target_layer_ids=[99]"], "draft.target_layer_ids=[99]: target=tiny-qwen3 has 4 "
     "layers (0..3), so [99] do not exist"),
    ("mask-token-id", ["draft.mask_token_id=999999"], "draft.mask_token_id=999999: target=tiny-qwen3 has a vocabulary "
     "of 151936"),
    ("heldout-all", ["data.limit=4", "data.heldout=4"], "data.heldout=4 with data.limit=4 leaves no training "
     "conversations"),
    ("init_from-truncated", ["init_from={c}/truncated"], "init_from={c}/truncated: {c}/truncated/model.safetensors: "
     "not a readable safetensors file"),
    ("init_from-vocab", ["init_from={c}/vocab300"], "init_from={c}/vocab300 does not fit target=tiny-qwen3"),
    ("init_from-no-config", ["init_from={c}/no_config"], "has no config.json"),
]


@pytest.mark.parametrize("overrides, match", [c[1:] for c in DISTILL_CASES], ids=[c[0] for c in DISTILL_CASES])
def test_distill_refuses_before_any_work(workdir, tmp_path, ckpts, monkeypatch, capsys, overrides, match):  # noqa: F811
    out = tmp_path / "run"
    _refused(DISTILL, "experiment=tiny_cpu", f"output_dir={out}", *[o.format(c=ckpts) for o in overrides],
             monkeypatch=monkeypatch, capsys=capsys, match=match.format(c=ckpts))
    assert not out.exists() and list(workdir.iterdir()) == []


def test_a_sweep_point_with_a_bad_checkpoint_is_refused_before_the_sweep_starts(workdir, tmp_path, ckpts,  # noqa: F811
                                                                                monkeypatch, capsys):
    out = tmp_path / "sweep"
    _refused(EVAL, "-m", "experiment=tiny_cpu", f"output_dir={out}",
             f"draft_path={ckpts / 'good'},{ckpts / 'truncated'}", monkeypatch=monkeypatch, capsys=capsys,
             match="truncated or corrupted")
    assert not out.exists() and list(workdir.iterdir()) == []


# ------------------------------------------------------------------ after a run started
def test_a_run_that_failed_after_it_started_can_be_rerun_or_resumed(workdir, tmp_path, monkeypatch,  # noqa: F811
                                                                     capsys):
    """A failure in the warm-up (after the target loaded and .hydra/ was written) leaves no
    run.json: a corrected rerun uses the directory without resume=true and records its own config."""
    from dflash2.evaluation.running.warmup import Warmup

    out = tmp_path / "run"

    def broken(self, rows, prompts):
        raise RuntimeError("the device went away")

    with monkeypatch.context() as m, pytest.raises(RuntimeError, match="the device went away"):  # a bug: raised
        m.setattr(Warmup, "phase", broken)
        _run(EVAL, "experiment=tiny_cpu", f"output_dir={out}", *FAST, "max_new_tokens=3", monkeypatch=monkeypatch,
             capsys=capsys)
    assert sorted(p.name for p in out.iterdir()) == [".hydra"]            # no run.json, no records
    assert "max_new_tokens: 3" in (out / ".hydra" / "config.yaml").read_text()
    status, _, err = _run(EVAL, "experiment=tiny_cpu", f"output_dir={out}", *FAST, monkeypatch=monkeypatch,
                          capsys=capsys)
    assert status == 0, err
    assert "max_new_tokens: 4" in (out / ".hydra" / "config.yaml").read_text()   # the rerun's own config
    assert {"run.json", "records.jsonl", "summary.json"} <= {p.name for p in out.iterdir()}


def test_a_resume_under_a_changed_config_is_one_line_naming_the_keys(workdir, tmp_path, monkeypatch,  # noqa: F811
                                                                      capsys):
    out = tmp_path / "run"
    status, _, err = _run(EVAL, "experiment=tiny_cpu", f"output_dir={out}", *FAST, monkeypatch=monkeypatch,
                          capsys=capsys)
    assert status == 0, err
    before = _snapshot(out)
    line = _refused(EVAL, "experiment=tiny_cpu", f"output_dir={out}", *FAST, "max_new_tokens=5", "seed=3",
                    "resume=true", monkeypatch=monkeypatch, capsys=capsys,
                    match="made with another config than this run")
    assert "(changed: max_new_tokens: 4 -> 5; seed: 0 -> 3)" in line
    assert "rerun with its values and resume=true, or choose a new output_dir" in line
    assert _snapshot(out) == before
    status, _, err = _run(EVAL, "experiment=tiny_cpu", f"output_dir={out}", *FAST, "resume=true",
                          monkeypatch=monkeypatch, capsys=capsys)
    assert status == 0, err                                                # the same config resumes
