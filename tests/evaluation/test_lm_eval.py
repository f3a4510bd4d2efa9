"""The lm-eval model `dflash2` on a tiny local task: results come back, and generated text
equals the target's own greedy (AR) text, from Python and from the command line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dflash2.evaluation.running.lm_eval import DFlash2LM, register, target_spec
from tests.engine.helpers import GreedyOracle, hf_greedy, qwen3_target, tokenizer

REPO = Path(__file__).resolve().parents[2]
DOCS = [{"question": "What is 2 + 3?", "answer": "5", "choices": ["4", "5", "6"], "label": 1},
        {"question": "Name a primary colour.", "answer": "red", "choices": ["red", "dog"], "label": 0},
        {"question": "Capital of France?", "answer": "Paris", "choices": ["Rome", "Paris"], "label": 1}]
MAX_GEN = 10


def _tasks(root: Path) -> Path:
    """A generate_until task and a multiple-choice (loglikelihood) task over a local JSONL file."""
    root.mkdir(parents=True, exist_ok=True)
    data = root / "docs.jsonl"
    data.write_text("".join(json.dumps(d) + "\n" for d in DOCS))
    common = f"dataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {data}\ntest_split: test\n"
    (root / "gen.yaml").write_text(
        "task: dflash2_tiny_gen\n" + common + 'doc_to_text: "Q: {{question}}\\nA:"\ndoc_to_target: "{{answer}}"\n'
        "output_type: generate_until\ngeneration_kwargs:\n  until: [\"\\n\\n\", \"Q:\"]\n"
        f"  max_gen_toks: {MAX_GEN}\n  do_sample: false\nmetric_list:\n  - metric: exact_match\n")
    (root / "mc.yaml").write_text(
        "task: dflash2_tiny_mc\n" + common + 'doc_to_text: "Q: {{question}}\\nA:"\ndoc_to_target: label\n'
        'doc_to_choice: "{{choices}}"\noutput_type: multiple_choice\nmetric_list:\n  - metric: acc\n')
    return root


def _args(sample: dict) -> list:
    """The first request's arguments of a logged sample (a list in Python results, a dict of
    `gen_args_0: {arg_0, arg_1}` in the CLI's JSONL)."""
    a = sample["arguments"]
    return list(a[0]) if isinstance(a, list) else list(a["gen_args_0"].values())


def _ar_text(model, tok, context: str, until=("\n\n", "Q:")) -> str:
    ids = torch.tensor(tok.encode(context, add_special_tokens=False))
    gen = hf_greedy(model, ids, MAX_GEN)[ids.numel():].tolist()
    text = tok.decode(gen, skip_special_tokens=True)
    for s in until:
        text = text.split(s)[0]
    return text


def test_simple_evaluate_is_lossless_and_scores(tmp_path):
    import lm_eval
    from lm_eval.tasks import TaskManager

    model, tok = qwen3_target(), tokenizer()
    lm = DFlash2LM(target=model, tokenizer=tok, draft=GreedyOracle(model, block_size=5), batch_size=2)
    out = lm_eval.simple_evaluate(model=lm, tasks=["dflash2_tiny_gen", "dflash2_tiny_mc"], log_samples=True,
                                  task_manager=TaskManager(include_path=str(_tasks(tmp_path / "tasks")),
                                                               include_defaults=False))
    assert "exact_match,none" in out["results"]["dflash2_tiny_gen"] and "acc,none" in out["results"]["dflash2_tiny_mc"]
    samples = out["samples"]["dflash2_tiny_gen"]
    assert len(samples) == len(DOCS)
    for s in samples:
        assert s["resps"][0][0] == _ar_text(model, tok, _args(s)[0])  # greedy speculative == AR
    # The oracle proposes the target's own greedy tokens: speculation really happened.
    steps = sum(len(a) for a in lm.accepted)
    assert steps and sum(sum(a) for a in lm.accepted) > 0
    # Multiple choice: each choice's loglikelihood is the target's own sum of log-probabilities.
    mc = out["samples"]["dflash2_tiny_mc"][0]
    ctx, cont = _args(mc)[:2]
    c_ids, full = tok.encode(ctx), tok.encode(ctx + cont)
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([full])).logits[0].double(), -1)
    want = sum(float(logp[j - 1, full[j]]) for j in range(len(c_ids), len(full)))
    assert mc["resps"][0][0][0] == pytest.approx(want, rel=1e-9, abs=1e-9)


def test_rolling_loglikelihood_matches_direct_sum():
    from lm_eval.api.instance import Instance

    model, tok = qwen3_target(), tokenizer()
    lm = DFlash2LM(target=model, tokenizer=tok, draft=None, max_length=8)  # 8: forces several windows
    text = "The quick brown fox jumps over the lazy dog, then naps in the sun."
    req = Instance(request_type="loglikelihood_rolling", doc={}, arguments=(text,), idx=0)
    ids = [lm.prefix_token_id] + tok.encode(text)
    with torch.no_grad():  # each token scored once, chunks of 8, each with the longest context that fits
        want = 0.0
        for start in range(1, len(ids), 8):
            end = min(start + 8, len(ids))
            lo = max(0, end - 1 - 8)
            logp = torch.log_softmax(model(torch.tensor([ids[lo:end - 1]])).logits[0].double(), -1)
            want += sum(float(logp[j - 1 - lo, ids[j]]) for j in range(start, end))
    assert lm.loglikelihood_rolling([req])[0] == pytest.approx(want, rel=1e-9)


def test_registration_keeps_lm_eval_builtins():
    from lm_eval.api.registry import get_model

    register()  # idempotent (python -m registers from __main__ first)
    assert get_model("dflash2") is DFlash2LM
    assert get_model("hf").__name__ == "HFLM"  # registering ours first must not hide the built-ins


def test_target_spec_resolution(tmp_path):
    assert target_spec("tiny-qwen3").source == "random"
    assert target_spec("tiny-qwen3", dtype="float64").dtype == "float64"
    assert target_spec("Qwen/Qwen3-8B").source == "hub"
    with pytest.raises(FileNotFoundError, match="GGUF"):
        target_spec(str(tmp_path / "missing.gguf"))
    with pytest.raises(FileNotFoundError, match="draft=none"):
        DFlash2LM(target=qwen3_target(), tokenizer=tokenizer(), draft=str(tmp_path / "nope"))


def test_command_line_with_a_saved_draft(tmp_path):
    from dflash2.runconfig import DraftSpec, load_target, new_draft

    spec = target_spec("tiny-qwen3", dtype="float64")
    target, tok = load_target(spec)
    draft = new_draft(DraftSpec(num_hidden_layers=1, block_size=4, selector_rank=8, selector_top_k=4), target, tok)
    draft.save_pretrained(tmp_path / "draft")
    tasks, out = _tasks(tmp_path / "tasks"), tmp_path / "out"
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", HF_DATASETS_OFFLINE="1")
    cmd = [sys.executable, "-m", "dflash2.evaluation.running.lm_eval", "--model", "dflash2", "--model_args",
           f"target=tiny-qwen3,draft={tmp_path / 'draft'},num_speculative_tokens=3,dtype=float64", "--device", "cpu",
           "--tasks", "dflash2_tiny_gen", "--include_path", str(tasks), "--limit", "2", "--log_samples",
           "--output_path", str(out)]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "dflash2_tiny_gen" in proc.stdout  # lm-eval's results table
    files = list(out.rglob("samples_dflash2_tiny_gen_*.jsonl"))
    samples = [json.loads(ln) for f in files for ln in f.read_text().splitlines()]
    assert len(samples) == 2
    for s in samples:
        assert s["resps"][0][0] == _ar_text(target.model, tok, _args(s)[0])
