"""Every bad argument of `speculative_generate` / `spec_generate` is a clear error raised on
the host before any target or draft forward; the position limit is exact (off-by-one both
ways is caught by running right at the limit)."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
import torch

from dflash2 import DFlash2ConfigError, TargetModel, speculative_generate
from dflash2.engine.inputs import GenerateInputError
from tests.engine.helpers import qwen3_target, random_draft

V = 32  # vocabulary of the tiny target and draft
BLOCK = 6
LIMIT = 40  # max_position_embeddings of the position-limit target


@contextlib.contextmanager
def no_forward(*models):
    """Fail the test if any of `models` runs a forward inside the block: errors must come first."""
    calls = []
    handles = [m.register_forward_pre_hook(lambda *_: calls.append(1)) for m in models]
    try:
        yield
    finally:
        for h in handles:
            h.remove()
    assert not calls, "a model forward ran before the input error was raised"


def run(input_ids=((1, 2, 3),), draft="random", **kw):
    target = qwen3_target(vocab=V, seed=2)
    d = random_draft(vocab=V, block_size=BLOCK) if draft == "random" else draft
    kw.setdefault("max_new_tokens", 4)
    return speculative_generate(target, d, [list(r) for r in input_ids] if isinstance(input_ids, tuple)
                                else input_ids, **kw)


def expect(pattern: str, **kw):
    """Run with `kw` and require a GenerateInputError matching `pattern` with a fix, raised
    before the target or the draft ran a single forward."""
    models = (qwen3_target(vocab=V, seed=2), random_draft(vocab=V, block_size=BLOCK))
    with no_forward(*models), pytest.raises(GenerateInputError, match=pattern) as err:
        run(**kw)
    assert "Fix:" in str(err.value)
    return str(err.value)


# ---------------------------------------------------------------- the table, rows 1-2
@pytest.mark.parametrize("bad, where", [(V, "row 1, position 2"), (-1, "row 1, position 2"),
                                        (10**6, "row 1, position 2")])
def test_out_of_vocabulary_ids_name_row_position_value_and_limit(bad, where):
    msg = expect(rf"input_ids {where}: token id {bad} ", input_ids=((1, 2), (3, 4, bad, 5)))
    assert f"[0, {V})" in msg and "tokenizer" in msg
    if bad < 0:
        assert "negative" in msg


def test_float_prompt_is_refused_not_truncated():
    msg = expect(r"input_ids row 0: has dtype torch.float32 \(first value 1.5\)",
                 input_ids=torch.tensor([[1.5, 2.0]]))
    assert "torch.long" in msg
    expect(r"row 0: has dtype torch.float64", input_ids=[np.array([1.0, 2.0])])
    expect(r"row 1: has dtype torch.bool", input_ids=[torch.tensor([1]), torch.tensor([True])])


# ---------------------------------------------------------------- shapes and containers
@pytest.mark.parametrize("ids, pattern", [
    ([1, 2, 3], "flat list of 3 ints"),
    ("hello", "is text"),
    ([], r"is empty \(no prompts\)"),
    ([[1, 2], []], "row 1: is empty"),
    (torch.zeros(1, 2, 3, dtype=torch.long), r"has shape \(1, 2, 3\)"),
    ([[[1, 2]]], r"row 0: has shape \(1, 2\)"),
    ([["a", "b"]], "row 0: is not a sequence of token ids"),
    (42, "is a int"),
])
def test_malformed_input_ids(ids, pattern):
    expect(f"input_ids.*{pattern}", input_ids=ids)


def test_good_forms_still_run():
    """Tensors, lists, numpy rows and a 1-D tensor all give the same output."""
    target = qwen3_target(vocab=V, seed=2)
    forms = [torch.tensor([[1, 2, 3]]), [[1, 2, 3]], [np.array([1, 2, 3], dtype=np.int32)], torch.tensor([1, 2, 3]),
             [torch.tensor([1, 2, 3], dtype=torch.int16)]]
    outs = [speculative_generate(target, None, f, max_new_tokens=3).sequences[0].tolist() for f in forms]
    assert all(o == outs[0] for o in outs) and outs[0][:3] == [1, 2, 3]


# ---------------------------------------------------------------- scalar arguments
@pytest.mark.parametrize("kw, pattern", [
    (dict(max_new_tokens=-1), r"max_new_tokens: -1 is outside"),
    (dict(max_new_tokens=2.0), r"max_new_tokens: 2.0 \(float\) is not an integer"),
    (dict(max_new_tokens=True), r"max_new_tokens: True \(bool\) is not an integer"),
    (dict(temperature=-0.5), r"temperature: -0.5 is outside \[0, inf\)"),
    (dict(temperature=float("nan")), r"temperature: nan is not finite"),
    (dict(temperature="0.7"), r"temperature: '0.7' \(str\) is not a real number"),
    (dict(top_p=0.0), r"top_p: 0.0 is outside \(0, 1\]"),
    (dict(top_p=1.5), r"top_p: 1.5 is outside"),
    (dict(top_k=-3), r"top_k: -3 is outside"),
    (dict(top_k=2.5), r"top_k: 2.5 \(float\) is not an integer"),
    (dict(seed=-1), r"seed: -1 is outside \[0, 18446744073709551615\]"),
    (dict(seed=2**64), r"seed: 18446744073709551616 is outside"),
    (dict(seed=1.5), r"seed: 1.5 \(float\) is not an integer"),
    (dict(impl="cuda"), r"impl: is 'cuda'"),
    (dict(timing="yes"), r"timing: is 'yes'"),
    (dict(num_speculative_tokens=BLOCK), r"num_speculative_tokens: 6 is outside \[0, 5\].*block_size"),
    (dict(num_speculative_tokens=-1), r"num_speculative_tokens: -1 is outside"),
    (dict(num_speculative_tokens=2.0), r"num_speculative_tokens: 2.0 \(float\) is not an integer"),
    (dict(draft=None, num_speculative_tokens=3), r"num_speculative_tokens: is 3 but draft is None"),
    (dict(draft="path/to/ckpt"), r"draft: is a str, not a draft model.*from_pretrained"),
])
def test_scalar_arguments_typed_and_ranged(kw, pattern):
    expect(pattern, **kw)


def test_numpy_and_tensor_scalars_are_accepted():
    out = run(max_new_tokens=np.int64(3), seed=torch.tensor(7), temperature=np.float32(0.5), top_k=np.int32(4),
              stop_token_ids=np.array([V - 1]), num_speculative_tokens=np.int64(2))
    assert out.num_speculative_tokens == 2 and len(out.generated[0]) <= 3
    # A seed is the same seed whatever its integer type, alone or one per row.
    sampled = [run(((1, 2, 3), (4, 5)), seed=s, temperature=0.9, max_new_tokens=6).generated
               for s in (7, np.int64(7), torch.tensor(7))]
    assert all([g.tolist() for g in x] == [g.tolist() for g in sampled[0]] for x in sampled)
    per_row = [run(((1, 2, 3), (4, 5)), seed=s, temperature=0.9, max_new_tokens=6).generated
               for s in ([7, 8], (np.int64(7), 8), torch.tensor([7, 8]))]
    assert all([g.tolist() for g in x] == [g.tolist() for g in per_row[0]] for x in per_row)


@pytest.mark.parametrize("seed, pattern", [
    ([7], r"seed: has 1 entries for 2 prompt rows"),
    ([7, -1], r"seed\[1\]: -1 is outside"),
    ([7, 2.5], r"seed\[1\]: 2.5 \(float\) is not an integer"),
])
def test_per_row_seeds_checked(seed, pattern):
    expect(pattern, input_ids=((1, 2), (3, 4)), seed=seed)


# ---------------------------------------------------------------- stop ids
@pytest.mark.parametrize("stops, pattern", [
    ([5, V], rf"stop_token_ids, position 1: token id {V} is not in the vocabulary"),
    (-2, r"stop_token_ids, position 0: token id -2 is negative"),
    ([3, 4.0], r"stop_token_ids\[1\]: 4.0 \(float\) is not an integer"),
    ("</s>", r"stop_token_ids: is '</s>'"),
    ([True], r"stop_token_ids\[0\]: True \(bool\)"),
])
def test_stop_ids_in_range(stops, pattern):
    expect(pattern, stop_token_ids=stops)


def test_stop_ids_forms_agree():
    ids = [[1, 2, 3]]
    base = run(ids, draft=None, max_new_tokens=8).generated[0].tolist()
    stop = base[3]
    for form in (stop, [stop], (stop,), {stop}, torch.tensor([stop]), torch.tensor(stop), np.int64(stop)):
        got = run(ids, draft=None, max_new_tokens=8, stop_token_ids=form)
        assert got.generated[0].tolist() == base[: base.index(stop) + 1] and got.finish_reasons == ["stop"]
    assert run(ids, draft=None, max_new_tokens=8, stop_token_ids=[]).generated[0].tolist() == base


# ---------------------------------------------------------------- target, draft fit
def test_target_and_draft_mismatches_are_named_before_any_forward():
    with pytest.raises(GenerateInputError, match="target: is a str.*TargetModel"):
        speculative_generate("Qwen/Qwen3-8B", None, [[1, 2]], max_new_tokens=2)
    target = qwen3_target(vocab=V, seed=2)
    wrong_vocab = random_draft(vocab=V + 1, block_size=BLOCK)
    with no_forward(target, wrong_vocab), pytest.raises(DFlash2ConfigError, match="vocab_size"):
        speculative_generate(target, wrong_vocab, [[1, 2]], max_new_tokens=2)
    fp32 = random_draft(vocab=V, block_size=BLOCK).float()  # the target is fp64
    try:
        with no_forward(target, fp32), pytest.raises(GenerateInputError, match=r"draft: is on cpu in torch.float32.*"
                                                     r"torch.float64.*draft.to\("):
            speculative_generate(target, fp32, [[1, 2]], max_new_tokens=2)
    finally:
        fp32.double()  # the lru-cached draft is shared with other tests


# ---------------------------------------------------------------- position limit
def limited_target(limit: int = LIMIT):
    """A tiny Qwen3 whose config says `max_position_embeddings = limit`, recording the largest
    position id each forward receives."""
    from tests.conftest import tiny_qwen3

    model = tiny_qwen3(vocab=V, seed=4).double()
    model.config.max_position_embeddings = limit
    seen = []
    model.register_forward_pre_hook(lambda _m, _a, kw: seen.append(int(kw["position_ids"].max())), with_kwargs=True)
    return TargetModel(model), seen


@pytest.mark.parametrize("n_spec", [0, 1, 4])
def test_position_limit_is_exact(n_spec):
    """At the largest allowed max_new_tokens the row occupies position LIMIT - 1 exactly; one more
    token is refused with the row, the position, the limit and both ways to fit."""
    target, seen = limited_target()
    draft = random_draft(vocab=V, block_size=BLOCK) if n_spec else None
    prompts = [[1, 2, 3], list(range(1, 8))]  # row 1 (7 tokens) is the longest
    overhang = max(n_spec - 1, 0)
    fits = LIMIT - 7 - overhang
    out = speculative_generate(target, draft, prompts, max_new_tokens=fits, num_speculative_tokens=n_spec)
    # The last token is never fed to the target, so for AR the sequence's own end is the top.
    assert len(out.sequences[1]) == 7 + fits and max(max(seen), 7 + fits - 1) == LIMIT - 1
    seen.clear()
    with pytest.raises(GenerateInputError) as err:
        speculative_generate(target, draft, prompts, max_new_tokens=fits + 1, num_speculative_tokens=n_spec)
    msg = str(err.value)
    assert not seen
    assert msg.startswith(f"input_ids row 1: a prompt of 7 tokens + max_new_tokens={fits + 1}")
    assert f"reaches position {LIMIT}" in msg and f"max_position_embeddings is {LIMIT}" in msg
    assert f"shorten the prompt to 6 tokens or lower max_new_tokens to {fits}" in msg


def test_prompt_alone_beyond_the_limit():
    target, _ = limited_target(limit=8)
    with pytest.raises(GenerateInputError, match=r"row 0: a prompt of 9 tokens .* max_position_embeddings is 8"):
        speculative_generate(target, None, [list(range(9))], max_new_tokens=1)


# ---------------------------------------------------------------- the z-lab-style wrapper
def test_spec_generate_checks_the_same_inputs():
    target = qwen3_target(vocab=V, seed=2)
    draft = random_draft(vocab=V, block_size=BLOCK)
    with no_forward(target, draft):
        with pytest.raises(GenerateInputError, match="input_ids row 0, position 1: token id 99"):
            draft.spec_generate(target=target, input_ids=torch.tensor([[1, 99]]), max_new_tokens=3)
        with pytest.raises(GenerateInputError, match="input_ids row 0: has dtype torch.float32"):
            draft.spec_generate(target=target, input_ids=torch.tensor([[1.0, 2.0]]), max_new_tokens=3)
        with pytest.raises(GenerateInputError, match="temperature: -1.0 is outside"):
            draft.spec_generate(target=target, input_ids=[[1, 2]], max_new_tokens=3, temperature=-1.0)
        with pytest.raises(GenerateInputError, match=rf"stop_token_ids, position 0: token id {V}"):
            draft.spec_generate(target=target, input_ids=[[1, 2]], max_new_tokens=3, stop_token_ids=[V])


def test_config_of_draft_checked_by_the_engine():
    """A draft whose config became invalid after loading is refused by name, not mid-loop."""
    target = qwen3_target(vocab=V, seed=2)
    draft = random_draft(vocab=V, block_size=BLOCK)
    saved = draft.config.dflash_config["mask_token_id"]
    draft.config.dflash_config["mask_token_id"] = V + 5
    try:
        with no_forward(target, draft), pytest.raises(DFlash2ConfigError, match="mask_token_id: 37 is out of range"):
            speculative_generate(target, draft, [[1, 2]], max_new_tokens=2)
    finally:
        draft.config.dflash_config["mask_token_id"] = saved
