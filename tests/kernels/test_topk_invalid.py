"""Vocabulary top-k's row validity flags (``with_invalid=True``): the reference equals the engine's
`invalid_rows`; the Triton launches' flags equal the reference's (and hand-written answers) at
chunk boundaries, in the padded last chunk and with NaN past the row in memory; the top-k itself
is bit-identical with and without the flags."""

from __future__ import annotations

import pytest
import torch

from dflash2.engine.sampling import invalid_rows
from dflash2.kernels.topk import _GROUP, _vocab_topk_triton, invalid_rows_reference, topk_config, vocab_topk

NAN, INF = float("nan"), float("inf")


def _rows(v: int, chunk: int, dtype: torch.dtype) -> tuple[torch.Tensor, list[bool], list[str]]:
    """One row per case, ``[cases, v]`` (v spans several chunks, the last one padded), with the
    expected flags and case names."""
    last = (v - 1) // chunk * chunk  # first entry of the padded last chunk
    # Order matters too: a merge that read past its row's chunks into the next row's would
    # flag "finite" (from the NaN next to it) and clear "all_neg_inf" (from the 1e4 after it).
    cases = [  # (name, edit of a row of random finite logits, invalid?)
        ("finite", lambda r: None, False),
        ("nan_first_entry", lambda r: r.__setitem__(0, NAN), True),
        ("nan_late_chunk", lambda r: r.__setitem__(last - 3, NAN), True),
        ("pos_inf", lambda r: r.__setitem__(chunk + 5, INF), True),
        ("one_neg_inf", lambda r: r.__setitem__(chunk - 1, -INF), False),
        ("all_neg_inf", lambda r: r.fill_(-INF), True),
        ("neg_inf_but_first", lambda r: (r.fill_(-INF), r.__setitem__(0, 1e4)), False),
        ("neg_inf_but_last_chunk", lambda r: (r.fill_(-INF), r.__setitem__(v - 2, -3.5)), False),
        ("nan_in_padded_chunk", lambda r: r.__setitem__(v - 1, NAN), True),
        ("pos_inf_in_padded_chunk", lambda r: r.__setitem__(v - 1, INF), True),
        ("neg_inf_and_pos_inf", lambda r: (r.fill_(-INF), r.__setitem__(v - 1, INF)), True),
        ("neg_inf_and_nan", lambda r: (r.fill_(-INF), r.__setitem__(1, NAN)), True),
        ("nan_and_pos_inf", lambda r: (r.__setitem__(3, INF), r.__setitem__(last, NAN)), True),
    ]
    x = torch.randn(len(cases), v) * 4
    for i, (_, edit, _) in enumerate(cases):
        edit(x[i])
    return x.to(dtype), [c[2] for c in cases], [c[0] for c in cases]


def _padded(x: torch.Tensor, pad: int) -> torch.Tensor:
    """``x`` as a view into a wider buffer whose columns past V hold NaN: a kernel that reads (or
    counts) a masked lane past the row flags every row."""
    wide = torch.full((x.shape[0], x.shape[1] + pad), NAN, dtype=x.dtype, device=x.device)
    wide[:, : x.shape[1]] = x
    return wide[:, : x.shape[1]]


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int32) if t.dtype == torch.float32 else t  # NaN values compare by bits


def test_reference_equals_engine_invalid_rows() -> None:
    b, n, v = 6, 5, 700
    logits = torch.randn(b, n, v) * 3
    logits[0, 2, 17] = NAN
    logits[1, 4, 699] = INF
    logits[2, 0] = -INF                              # all -inf in one slot
    logits[3, :, :] = -INF                            # every slot all -inf
    logits[4, 1, :-1] = -INF                          # one finite entry left: valid
    logits[5, 3, :5] = -INF                           # some -inf: valid
    flat = logits.view(b * n, v)
    invalid = invalid_rows_reference(flat)
    assert invalid.dtype == torch.bool and invalid.shape == (b * n,)
    assert torch.equal(invalid.view(b, n).any(-1), invalid_rows(logits))
    assert torch.equal(invalid, invalid_rows(flat[:, None, :]))     # one row at a time
    assert invalid.view(b, n).any(-1).tolist() == [True, True, True, True, False, False]
    for dtype in (torch.bfloat16, torch.float16):
        assert torch.equal(invalid_rows_reference(flat.to(dtype)), invalid)
    _, _, from_topk = vocab_topk(flat, 4, 0.5, 3.0, impl="torch", with_invalid=True)
    assert torch.equal(from_topk, invalid)          # raw logits: multiplier / softcap do not matter


# (V, groups per chunk or None for topk_config's, k, dtype): 4 chunks of 256 in every dtype, the
# default 4096-entry chunks, and 11 chunks of 32 (more chunks than a merge block of 8, fewer than 16)
F32, BF16, F16 = torch.float32, torch.bfloat16, torch.float16
CASES = [(1000, 16, 5, F32), (1000, 16, 5, BF16), (1000, 16, 5, F16), (5000, None, 16, BF16), (333, 2, 2, BF16)]
CASE_IDS = [f"V{v}-groups{g or 'default'}-k{k}-{str(d)[6:]}" for v, g, k, d in CASES]


@pytest.mark.parametrize("v,groups,k,dtype", CASES, ids=CASE_IDS)
def test_triton_invalid_matches_reference(v, groups, k, dtype, triton_device) -> None:
    config = None if groups is None else {"groups": groups, "num_warps": 2}
    kp = max(1 << (k - 1).bit_length(), 2)  # the launcher widens a chunk to at least KP groups
    chunk = _GROUP * max(groups or topk_config(13, v)["groups"], kp)
    x, expect, names = _rows(v, chunk, dtype)
    assert len(names) == 13 and v > chunk and v % chunk  # several chunks, the last one padded
    logits = _padded(x.to(triton_device), pad=7)
    vals, ids, invalid = _vocab_topk_triton(logits, k, 1.0, 0.0, config, with_invalid=True)
    ref_vals, ref_ids, ref_invalid = vocab_topk(logits, k, impl="torch", with_invalid=True)
    assert invalid.dtype == torch.bool and invalid.shape == (len(names),)
    assert dict(zip(names, ref_invalid.tolist())) == dict(zip(names, expect))
    assert dict(zip(names, invalid.tolist())) == dict(zip(names, expect))
    # the flags change nothing else: bit-identical to the call without them, and to the reference
    # on the valid rows (NaN rows rank NaN as +inf in both; their order is not part of the contract)
    plain_vals, plain_ids = _vocab_topk_triton(logits, k, 1.0, 0.0, config)
    assert torch.equal(_bits(vals), _bits(plain_vals)) and torch.equal(ids, plain_ids)
    valid = ~ref_invalid
    assert torch.equal(ids[valid], ref_ids[valid]) and torch.equal(vals[valid], ref_vals[valid])


def test_triton_invalid_with_transform_and_public_api(triton_device) -> None:
    # A negative multiplier turns -inf into +inf and the softcap maps +-inf to +-s: the flags must
    # come from the raw logits, and the public function must pass the flag through.
    x, expect, _ = _rows(1500, 256, torch.bfloat16)
    x = x.to(triton_device)
    for mult, cap in ((-0.5, 0.0), (1.0, 2.0)):
        _, _, invalid = vocab_topk(x, 8, mult, cap, impl="triton", with_invalid=True)
        assert invalid.tolist() == expect
    assert len(vocab_topk(x, 8, impl="triton")) == 2


def test_triton_invalid_fp64_range(triton_device) -> None:
    # fp64 logits are judged in fp64: 1e300 is finite (fp32 would make it +inf), -1e300 is > -inf.
    x = torch.randn(5, 300, dtype=torch.float64)
    x[0, 3], x[1] = 1e300, -1e300
    x[2], x[3, 290], x[4, 0] = -INF, NAN, INF
    x = x.to(triton_device)
    _, _, invalid = _vocab_topk_triton(x, 3, 1.0, 0.0, {"groups": 16, "num_warps": 2}, with_invalid=True)
    assert invalid.tolist() == invalid_rows_reference(x).tolist() == [False, False, True, True, True]


def test_zero_rows(triton_device) -> None:
    x = torch.empty(0, 300, device=triton_device)
    for impl in ("torch", "triton"):
        vals, ids, invalid = vocab_topk(x, 3, impl=impl, with_invalid=True)
        assert vals.shape == (0, 3) and ids.shape == (0, 3) and invalid.shape == (0,) and invalid.dtype == torch.bool


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [16, 128])
def test_gpu_invalid_real_shapes(rows, cuda_device) -> None:
    v = 151936
    logits = (torch.randn(rows, v, device=cuda_device) * 4).bfloat16()
    logits[1, v - 1] = NAN                       # last entry of the last (padded) chunk
    logits[2, 70000] = INF
    logits[3] = -INF
    logits[4] = -INF
    logits[4, v - 3] = 0.25                      # valid: one finite entry in the last chunk
    logits[5, :100000] = -INF                    # valid
    logits[rows - 1, 4095:4097] = NAN            # straddles the first chunk boundary
    expect = [False] * rows
    expect[1] = expect[2] = expect[3] = expect[rows - 1] = True
    ref_vals, ref_ids, ref_invalid = vocab_topk(logits, 16, impl="torch", with_invalid=True)
    plain_vals, plain_ids = vocab_topk(logits, 16, impl="triton")
    vals, ids, invalid = vocab_topk(logits, 16, impl="triton", with_invalid=True)
    assert ref_invalid.tolist() == expect and invalid.tolist() == expect
    assert torch.equal(_bits(vals), _bits(plain_vals)) and torch.equal(ids, plain_ids)
    valid = ~invalid
    assert torch.equal(ids[valid], ref_ids[valid]) and torch.equal(vals[valid], ref_vals[valid])
    # CUDA-graph safe: capture, change the input in place, replay
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = vocab_topk(logits, 16, impl="triton", with_invalid=True)
    logits[0, 5] = NAN
    logits[3, 0] = 1.0
    graph.replay()
    expect[0], expect[3] = True, False
    assert out[2].tolist() == expect
