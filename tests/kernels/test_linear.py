"""The small-M linear kernel against `F.linear` in fp64 (interpreter on CPU, compiled on CUDA),
its row invariance, its limits, the `SmallMLinearMode` routing, and the benchmark's pure helpers.

Tolerance (STYLE.md item 6): the kernel sums exact products in fp32 and rounds once, so each
element may differ from the fp64 truth by half a unit in the last place of the output dtype plus
the fp32 summation bound `K * 2^-24 * sum_k |x_k w_k|` (Higham's gamma_K); on top of that the
kernel's largest error may be at most twice torch's at the same dtype (the `error_within`
fixture) plus that floor. One exception, on CPU only: the Triton interpreter converts fp32 to
bf16 by truncation (its `_convert_float` ignores the rounding mode), so there a bf16 element may
be a whole ulp off; compiled kernels round to nearest even.
"""

from __future__ import annotations

import dataclasses

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

import dflash2.kernels.linear as lin
from benchmarks.linear import (SHAPES, best_config, calls_for, copies_for, linear_bytes, markdown_table,
                               stack_bytes, sweep_grid)
from dflash2.kernels.linear import (MAX_ROWS, LinearConfig, SmallMLinearMode, default_config, kernel_fits,
                                    linear_reference, small_m_linear, ticket_buffer)

FP32_EPS = 2.0**-24  # unit roundoff of fp32 (the accumulator)
HALF_ULP = {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11, torch.float32: 2.0**-24}  # relative, of |y|


def _rounding(dtype: torch.dtype, device: str) -> float:
    """Largest relative error of the final rounding: half an ulp, a whole one for the interpreter's bf16."""
    return HALF_ULP[dtype] * (2.0 if device == "cpu" and dtype == torch.bfloat16 else 1.0)
# Small tilings so that the interpreter's shapes cross block boundaries, split K unevenly (70 = 64 + 6
# with block_k 16 and 3 splits) and leave a partial column tile (37 = 2 x 16 + 5).
TILINGS = [LinearConfig(16, 16, 1), LinearConfig(16, 16, 3), LinearConfig(32, 32, 2, num_warps=2)]
TILING_IDS = ["bn16-bk16", "bn16-bk16-split3", "bn32-bk32-split2"]


def _operands(m, n, k, dtype, device, bias=True, lead=()):
    x = torch.randn(*lead, m, k, dtype=dtype).to(device)
    w = (torch.randn(n, k) * k ** -0.5).to(dtype).to(device)
    b = torch.randn(n, dtype=dtype).to(device) if bias else None
    return x, w, b


def _check_close(out, x, w, b, error_within):
    """Per element: within half an output ulp + the fp32 summation bound of the fp64 truth; overall:
    STYLE.md item 6 against torch at the same dtype."""
    xd, wd = x.double().cpu(), w.double().cpu()
    bd = None if b is None else b.double().cpu()
    exact = F.linear(xd, wd, bd)
    rounding = _rounding(x.dtype, x.device.type)
    bound = rounding * exact.abs() + x.shape[-1] * FP32_EPS * F.linear(xd.abs(), wd.abs()) + 1e-30
    err = (out.double().cpu() - exact).abs()
    assert (err <= bound * 1.001).all(), f"worst element error / bound {(err / bound).max().item():.3g}"
    floor = rounding * exact.abs().max().item()
    error_within(out.cpu(), F.linear(x.cpu(), w.cpu(), None if b is None else b.cpu()), exact, floor)


@pytest.mark.parametrize("config", TILINGS, ids=TILING_IDS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("m", [1, 5, 32])
def test_matches_fp64_truth_on_odd_shapes(m, dtype, config, triton_device, error_within):
    x, w, b = _operands(m, 37, 70, dtype, triton_device)
    out = small_m_linear(x, w, b, impl="triton", config=config)
    assert out.shape == (m, 37) and out.dtype == dtype
    _check_close(out, x, w, b, error_within)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=["bf16", "fp16", "fp32"])
def test_no_bias_three_d_input_and_default_tiling(dtype, triton_device, error_within):
    x, w, _ = _operands(3, 50, 96, dtype, triton_device, bias=False, lead=(2,))  # [2, 3, 96] -> 6 rows
    out = small_m_linear(x, w, None, impl="triton")  # default_config: 64-wide K blocks or wider
    assert out.shape == (2, 3, 50)
    _check_close(out, x, w, None, error_within)


@pytest.mark.parametrize("config", TILINGS[1:], ids=TILING_IDS[1:])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_row_alone_equals_row_in_a_batch_bitwise(dtype, config, triton_device):
    """Row invariance (issue 22 item 3): each row's bits do not depend on M or on other rows."""
    x, w, b = _operands(MAX_ROWS, 37, 70, dtype, triton_device)
    full = small_m_linear(x, w, b, impl="triton", config=config)
    for lo, hi in [(0, 1), (31, 32), (3, 5), (7, 24)]:
        part = small_m_linear(x[lo:hi], w, b, impl="triton", config=config)
        assert torch.equal(part, full[lo:hi]), f"rows {lo}:{hi} changed with the batch"
    noise = x.clone()
    noise[1:] = torch.randn_like(noise[1:]) * 1e4  # other rows' values must not matter either
    assert torch.equal(small_m_linear(noise, w, b, impl="triton", config=config)[0], full[0])


@pytest.mark.parametrize("config", [TILINGS[1], LinearConfig(16, 16, 3)], ids=[TILING_IDS[1], "split3"])
def test_row_tiles_past_max_rows_keep_each_rows_bits(config, triton_device):
    """With `max_rows=None` the kernel takes any number of rows in tiles of `MAX_ROWS`: a row gives
    the same bits alone, in its first tile and in the third, among any neighbours, and every row
    matches the reference (exact mode routes every row count through it)."""
    rows = 2 * MAX_ROWS + 9  # three row tiles, the last one partial
    x, w, b = _operands(rows, 37, 70, torch.bfloat16, triton_device)
    full = small_m_linear(x, w, b, impl="triton", config=config, max_rows=None)
    assert full.shape == (rows, 37)
    alone = torch.cat([small_m_linear(x[i:i + 1], w, b, impl="triton", config=config) for i in range(rows)])
    assert torch.equal(full, alone), "a row's bits changed with its row tile or its neighbours"
    shifted = small_m_linear(x[5:], w, b, impl="triton", config=config, max_rows=None)  # other tiles
    assert torch.equal(shifted, full[5:])
    ref = linear_reference(x.float(), w.float(), b.float())
    assert (full.float() - ref).abs().max() <= 0.02 * ref.abs().max() + 1e-2
    with pytest.raises(ValueError, match="rows"):
        small_m_linear(x, w, b, impl="triton", config=config)  # the default cap: one row tile


@pytest.mark.parametrize("split", [1, 3], ids=["one-split", "split3"])
def test_row_groups_read_each_weight_tile_once_and_keep_each_rows_bits(split, triton_device):
    """Past one row tile a program serves up to `row_tiles` row tiles from each weight tile: the
    outputs are the same bits for 1, 2, 3 or 4 row tiles per program, for a row alone, and for a
    slice that moves every row to another tile and group (five row tiles: two groups of 4, the
    second partial)."""
    rows = 4 * MAX_ROWS + 9
    x, w, b = _operands(rows, 37, 70, torch.bfloat16, triton_device)
    outs = {g: small_m_linear(x, w, b, impl="triton", config=LinearConfig(16, 16, split, row_tiles=g), max_rows=None)
            for g in (1, 2, 3, 4)}
    for g in (2, 3, 4):
        assert torch.equal(outs[g], outs[1]), f"{g} row tiles per program changed the bits"
    config = LinearConfig(16, 16, split)
    assert config.row_tiles == 4  # the default
    for i in (0, 31, 32, 100, 127, 128, rows - 1):
        assert torch.equal(small_m_linear(x[i:i + 1], w, b, impl="triton", config=config), outs[4][i:i + 1]), i
    shifted = small_m_linear(x[37:], w, b, impl="triton", config=config, max_rows=None)
    assert torch.equal(shifted, outs[4][37:])
    ref = linear_reference(x.float(), w.float(), b.float())
    assert (outs[4].float() - ref).abs().max() <= 0.02 * ref.abs().max() + 1e-2
    with pytest.raises(ValueError, match="row_tiles"):
        LinearConfig(16, 16, row_tiles=5)


def test_repeated_calls_are_deterministic(triton_device):
    x, w, b = _operands(9, 37, 70, torch.bfloat16, triton_device)
    config = LinearConfig(16, 16, 3)
    first = small_m_linear(x, w, b, impl="triton", config=config)
    assert torch.equal(first, small_m_linear(x, w, b, impl="triton", config=config))


def test_refusals_name_the_fix(triton_device):
    x, w, b = _operands(MAX_ROWS + 1, 16, 16, torch.float32, triton_device)
    with pytest.raises(ValueError, match="rows"):
        small_m_linear(x, w, b, impl="triton")
    with pytest.raises(ValueError, match="resolved"):
        small_m_linear(x, w, b, impl="auto")
    with pytest.raises(ValueError, match="do not make a linear"):
        small_m_linear(x[:, :8], w, b, impl="triton")
    with pytest.raises(ValueError, match="bias"):
        small_m_linear(x[:4], w, b[:3], impl="triton")
    with pytest.raises(ValueError, match="share a dtype"):
        small_m_linear(x[:4], w.double(), None, impl="triton")
    with pytest.raises(ValueError, match="unit stride"):
        small_m_linear(x[:4], torch.randn(16, 16, device=triton_device).t(), None, impl="triton")
    with pytest.raises(ValueError, match="inference-only"):
        small_m_linear(x[:4], w.requires_grad_(), None, impl="triton")
    assert torch.equal(small_m_linear(x, w.detach(), b, impl="torch"), linear_reference(x, w.detach(), b))


def test_tiling_is_checked_and_covers_k_without_empty_splits():
    with pytest.raises(ValueError, match="power of two"):
        LinearConfig(48, 64)
    with pytest.raises(ValueError, match=">= 1"):
        LinearConfig(64, 64, split_k=0)
    for k, bk, split in [(70, 16, 3), (4096, 128, 4), (100, 64, 8), (12288, 128, 16)]:
        chunk, splits = lin._split_chunk(k, bk, split)
        assert chunk % bk == 0 and 1 <= splits <= split
        assert (splits - 1) * chunk < k <= splits * chunk  # every split has work, together all of K


@pytest.mark.parametrize("name, n, k, _", SHAPES, ids=[s[0] for s in SHAPES])
def test_default_tiling_fills_an_h200(name, n, k, _):
    """At the 8B shapes the default tiling gives about one program per SM (132 SMs) or, where K
    runs out first, splits of at least four K blocks; it never depends on the row count."""
    c = default_config(n, k, torch.bfloat16, 132)
    chunk, splits = lin._split_chunk(k, c.block_k, c.split_k)
    programs = -(-n // c.block_n) * splits
    assert programs >= 0.9 * 132 or chunk < 8 * c.block_k
    assert chunk >= 4 * c.block_k or splits == 1
    assert kernel_fits(1, n, k, torch.bfloat16) and kernel_fits(MAX_ROWS, n, k, torch.bfloat16)
    assert not kernel_fits(MAX_ROWS + 1, n, k, torch.bfloat16) and not kernel_fits(1, n, k, torch.float64)


def test_split_tickets_are_left_at_zero_and_reused(triton_device):
    """Split K: the counters a call draws are back at zero afterwards, so one buffer serves
    every later call (and every CUDA-graph replay)."""
    x, w, b = _operands(4, 37, 70, torch.bfloat16, triton_device)
    tickets = ticket_buffer(triton_device, 8)
    config = LinearConfig(16, 16, 3)
    first = small_m_linear(x, w, b, impl="triton", config=config, tickets=tickets)
    assert not tickets.any()
    assert torch.equal(small_m_linear(x, w, b, impl="triton", config=config, tickets=tickets), first)
    assert torch.equal(small_m_linear(x, w, b, impl="triton", config=config), first)  # fresh counters


def test_mode_routes_only_what_it_should(monkeypatch, triton_device):
    routed = []
    real = lin._small_m_linear_triton

    def spy(x, weight, bias, config, tickets):
        routed.append((tuple(x.shape), tuple(weight.shape), config))
        assert tickets is mode.tickets  # the mode's own counters, reused
        return real(x, weight, bias, config, tickets)

    monkeypatch.setattr(lin, "_small_m_linear_triton", spy)
    custom = LinearConfig(16, 16, 2)
    mode = SmallMLinearMode("triton", triton_device, configs={(24, 40): custom})
    dt = torch.float32
    layer = torch.nn.Linear(40, 24).to(triton_device)
    w2 = torch.randn(40, 24, device=triton_device)
    x = torch.randn(3, 40, device=triton_device)
    with torch.no_grad(), mode:
        y = layer(x)                                               # routed: 3 rows, custom tiling
        layer(torch.randn(2, 4, 40, device=triton_device))          # routed: 3-D, 8 rows
        F.linear(x, w2.t(), None)                                   # weight strided along K
        layer(torch.randn(MAX_ROWS + 1, 40, device=triton_device))  # too many rows
        layer(torch.randn(2, 2, 2, 40, device=triton_device))       # 4-D
        layer(torch.randn(40, device=triton_device))                # 1-D
        F.linear(x.double(), layer.weight.double())                 # dtype outside DTYPES
        with pytest.raises(RuntimeError):
            F.linear(x, layer.weight, layer.bias.half())            # mixed dtypes: F.linear's own error
        torch.matmul(x, layer.weight.t())                           # not F.linear
    with mode:
        layer(x)                                                    # needs grad
    with torch.no_grad(), SmallMLinearMode("torch", triton_device):
        layer(x)                                                    # impl torch: routes nothing
    assert [r[:2] for r in routed] == [((3, 40), (24, 40)), ((8, 40), (24, 40))]
    assert routed[0][2] == custom and routed[1][2] == custom
    assert torch.equal(y, real(x, layer.weight, layer.bias, custom))
    assert not mode.tickets.any()  # every split call left its counters at zero
    assert mode.routes(x.to(dt), layer.weight.detach(), None)
    assert not mode.routes(x.to("meta"), layer.weight.detach().to("meta"), None)  # other device type
    # max_rows=None (exact mode) routes past one row tile too; a bad cap is refused.
    uncapped = SmallMLinearMode("triton", triton_device, max_rows=None)
    big = torch.randn(MAX_ROWS + 1, 40, device=triton_device)
    assert uncapped.routes(big, layer.weight.detach(), None) and not mode.routes(big, layer.weight.detach(), None)
    with pytest.raises(ValueError, match="max_rows"):
        SmallMLinearMode("triton", triton_device, max_rows=0)


LOGITS_RTOL = 1e-4  # fp32 linears that differ from cuBLAS / CPU in summation order only, one layer deep


def test_mode_runs_a_stock_transformers_target(monkeypatch, triton_device):
    """A tiny stock Qwen3 under the mode: every linear (q/k/v/o, MLP, lm_head) goes through the
    kernel and the logits match the unrouted model's."""
    from tests.conftest import tiny_qwen3

    model = tiny_qwen3(vocab=96, hidden=32, layers=1).to(triton_device)
    ids = torch.randint(0, 96, (1, 5), device=triton_device)
    calls = []
    real = lin._small_m_linear_triton
    monkeypatch.setattr(lin, "_small_m_linear_triton", lambda *a: calls.append(tuple(a[1].shape)) or real(*a))
    with torch.no_grad():
        ref = model(ids).logits
        assert calls == []
        with SmallMLinearMode("triton", triton_device):
            out = model(ids).logits
    assert len(calls) == 8 and calls[-1] == (96, 32)  # 7 per layer, then the lm_head
    assert (out - ref).abs().max().item() <= LOGITS_RTOL * ref.abs().max().item()


def test_bench_helpers():
    assert linear_bytes(1, 4, 8) == 2 * (32 + 8 + 4)
    assert linear_bytes(2, 4, 8, elt=4, bias=True) == 4 * (32 + 16 + 8 + 4)
    assert abs(stack_bytes(1) / 1e9 - 15.1) < 0.1  # the 15.1 GB of 8B target weights
    assert copies_for(100 << 20, 512 << 20) == 6 and copies_for(2 << 30, 512 << 20) == 1
    calls = calls_for(8 << 20, 64, 4 << 30)
    assert calls % 64 == 0 and calls * (8 << 20) <= 4 << 30
    grid = sweep_grid([32, 64], [128, 256], [4], [3], [1, 4, 16], k=4096)
    assert LinearConfig(64, 256, 16, 4, 3) not in grid and LinearConfig(64, 128, 16, 4, 3) in grid
    assert len(sweep_grid([64], [128], [4], [3], [1], k=4096, pdl=(1, 0))) == 2
    assert len(grid) == 2 * 2 * 3 - 2  # split 16 of K = 4096 is one block of 256: dropped for both block_n
    rows = [dict(config="a", pct_copy={1: 90.0, 32: 70.0}), dict(config="b", pct_copy={1: 85.0, 32: 80.0})]
    assert best_config(rows)["config"] == "b"
    assert markdown_table(["a", "b"], [[1, 2.345], [3, 123.4]]).splitlines() == [
        "| a | b |", "| --- | --- |", "| 1 | 2.35 |", "| 3 | 123.4 |"]


@pytest.mark.gpu
@pytest.mark.parametrize("name, n, k, _", SHAPES[:4], ids=[s[0] for s in SHAPES[:4]])
def test_8b_shapes_on_gpu_row_invariant_and_accurate(name, n, k, _, cuda_device, error_within):
    """At the real shapes and default tilings (splits included): bitwise row invariance from 1 to
    32 rows, and the accuracy bound against fp64."""
    x, w, b = _operands(MAX_ROWS, n, k, torch.bfloat16, cuda_device, bias=False)
    full = small_m_linear(x, w, impl="triton")
    for lo, hi in [(0, 1), (5, 7), (0, 16), (31, 32)]:
        assert torch.equal(small_m_linear(x[lo:hi], w, impl="triton"), full[lo:hi]), f"rows {lo}:{hi}"
    _check_close(full, x, w, None, error_within)


@pytest.mark.gpu
@pytest.mark.parametrize("name, n, k, _", SHAPES[:4], ids=[s[0] for s in SHAPES[:4]])
def test_8b_shapes_on_gpu_row_groups_keep_each_rows_bits(name, n, k, _, cuda_device):
    """Past one row tile, at the real shapes and tilings: the default row groups give the bits of
    one row tile per program and of each row alone (the MMAs' instruction is the same)."""
    import dataclasses

    rows = 4 * MAX_ROWS + 9
    x, w, _ = _operands(rows, n, k, torch.bfloat16, cuda_device, bias=False)
    sms = torch.cuda.get_device_properties(cuda_device).multi_processor_count
    config = default_config(n, k, torch.bfloat16, sms)
    full = small_m_linear(x, w, impl="triton", config=config, max_rows=None)
    per_tile = small_m_linear(x, w, impl="triton", config=dataclasses.replace(config, row_tiles=1), max_rows=None)
    assert torch.equal(full, per_tile)
    for i in (0, 33, 127, 130):
        assert torch.equal(small_m_linear(x[i:i + 1], w, impl="triton", config=config), full[i:i + 1]), i


@pytest.mark.gpu
def test_mode_under_cuda_graph_capture(cuda_device):
    """Two routed linears (K split over programs at this shape, so both draw on the mode's
    tickets, back to back) captured in a CUDA graph replay on new input data like eager calls."""
    layers = [torch.nn.Linear(4096, 1024, dtype=torch.bfloat16, device=cuda_device) for _ in range(2)]
    x = torch.randn(8, 4096, dtype=torch.bfloat16, device=cuda_device)
    mode = SmallMLinearMode("triton", cuda_device)
    assert mode.config_for(1024, 4096, torch.bfloat16).split_k > 1
    with torch.no_grad(), mode:
        [layer(x) for layer in layers]  # warm-up: compiles outside the capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            ys = [layer(x) for layer in layers]
        for _ in range(2):  # twice: the split's tickets must be back at zero after a replay
            x.copy_(torch.randn_like(x))
            graph.replay()
            torch.cuda.synchronize()
            for y, layer in zip(ys, layers):
                assert torch.equal(y, layer(x))
        assert not mode.tickets.any()
        assert (ys[0].float() - F.linear(x, layers[0].weight, layers[0].bias).float()).abs().max() < 0.05


@pytest.mark.gpu
def test_pdl_chain_waits_for_its_input(cuda_device):
    """With programmatic dependent launch, a linear that reads the previous linear's output (in
    a CUDA graph, back to back) still sees it whole: the same bits as without PDL."""
    x, w1, _ = _operands(4, 4096, 4096, torch.bfloat16, cuda_device, bias=False)
    w2 = _operands(1, 4096, 4096, torch.bfloat16, cuda_device, bias=False)[1]
    outs = {}
    for pdl in (False, True):
        c1 = dataclasses.replace(default_config(4096, 4096, torch.bfloat16, 132), pdl=pdl)
        c2 = dataclasses.replace(c1, split_k=1)

        def chain(c1=c1, c2=c2):
            return small_m_linear(small_m_linear(x, w1, impl="triton", config=c1), w2, impl="triton", config=c2)

        chain()
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            y = chain()
        graph.replay()
        torch.cuda.synchronize()
        outs[pdl] = y.clone()
    assert torch.equal(outs[True], outs[False])


def test_fused_groups_are_one_launch_with_each_members_output(monkeypatch, triton_device):
    """`fusable_groups` finds each attention's q/k/v and each MLP's gate/up; under the mode the
    first member's call runs one launch over the members' own weights and the others return their
    slices for the same input; another input, or a member called first, runs unfused; outputs
    match the unfused mode's; in-place weight updates reach the fused launch."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from dflash2.kernels.linear import FusedLinears, fusable_groups

    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=80, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=8)
    model = Qwen3ForCausalLM(cfg).to(triton_device).eval()
    groups = fusable_groups(model)
    assert [g.sizes for g in groups] == [[32, 16, 16], [48, 48]] * 2 and (groups[0].n, groups[0].k) == (64, 32)
    assert groups[0].weights[1] is model.model.layers[0].self_attn.k_proj.weight  # read in place, not copied
    launches = []
    real = lin._small_m_linear_triton

    def counting(x, w, b, c, t=None):
        launches.append(sum(m.shape[0] for m in (w if isinstance(w, tuple) else (w,))))
        return real(x, w, b, c, t)

    monkeypatch.setattr(lin, "_small_m_linear_triton", counting)
    ids = torch.tensor([[3, 5, 7]], device=triton_device)
    with torch.no_grad():
        with SmallMLinearMode("triton", triton_device):
            plain = model(ids).logits
        n_plain = len(launches)
        launches.clear()
        fused_mode = SmallMLinearMode("triton", triton_device, fused=groups)
        with fused_mode:
            fused = model(ids).logits
        assert not fused_mode._pending  # every slice was taken, nothing outlives the block
    # per layer q/k/v 3 launches -> 1 and gate/up 2 -> 1
    assert len(launches) == n_plain - 3 * 2 and launches.count(64) == 2 and launches.count(96) == 2
    assert torch.allclose(fused, plain, rtol=1e-4, atol=1e-5)
    attn = model.model.layers[0].self_attn
    x, other = torch.randn(1, 3, 32, device=triton_device), torch.randn(1, 3, 32, device=triton_device)
    with torch.no_grad(), SmallMLinearMode("triton", triton_device, fused=groups):
        q = attn.q_proj(x)
        k_other = attn.k_proj(other)  # another input: its own launch, not x's slice
        v = attn.v_proj(x)
        k_first = model.model.layers[1].self_attn.k_proj(x)  # a member called before its group's first
    ref = lambda m, t: F.linear(t, m.weight, m.bias)  # noqa: E731
    assert torch.allclose(q, ref(attn.q_proj, x), rtol=1e-4, atol=1e-5)
    assert torch.allclose(k_other, ref(attn.k_proj, other), rtol=1e-4, atol=1e-5)
    assert torch.allclose(v, ref(attn.v_proj, x), rtol=1e-4, atol=1e-5)
    assert torch.allclose(k_first, ref(model.model.layers[1].self_attn.k_proj, x), rtol=1e-4, atol=1e-5)
    with torch.no_grad():  # weights updated in place reach the fused launch (no copy to refresh)
        attn.k_proj.weight.mul_(2.0)
        with SmallMLinearMode("triton", triton_device, fused=groups):
            attn.q_proj(x)
            k2 = attn.k_proj(x)
    assert torch.allclose(k2, ref(attn.k_proj, x), rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="two or three"):
        FusedLinears([attn.q_proj])
    with pytest.raises(ValueError, match="in_features"):
        FusedLinears([attn.q_proj, model.model.layers[0].mlp.down_proj])
    strided = SimpleNamespace(weight=torch.randn(32, 64, device=triton_device)[:, ::2], bias=None)
    with pytest.raises(ValueError, match="contiguous"):
        FusedLinears([attn.q_proj, strided])


@pytest.mark.parametrize("sizes, m, split", [((32, 16, 16), 3, 1), ((40, 72), 5, 2), ((64, 16, 80), 70, 3)],
                         ids=["qkv-unaligned", "pair-split2", "three-rowgroups-split3"])
def test_fused_launch_reads_each_member_in_place_with_the_concatenated_bits(sizes, m, split, triton_device):
    """One launch over 2-3 member matrices equals, bit for bit, the same launch over their
    concatenation (same tiling), at member boundaries inside a column tile, with K split and
    past one row tile; the members are read where they lie."""
    k = 96
    ws = tuple(torch.randn(n, k, device=triton_device) for n in sizes)
    bias = torch.randn(sum(sizes), device=triton_device)
    x = torch.randn(m, k, device=triton_device)
    config = LinearConfig(block_n=32, block_k=32, split_k=split)
    fused = lin._small_m_linear_triton(x, ws, bias, config)
    whole = lin._small_m_linear_triton(x, torch.cat(ws), bias, config)
    assert fused.shape == (m, sum(sizes)) and torch.equal(fused, whole)
    exact = x.double() @ torch.cat(ws).double().T + bias.double()
    assert (fused.double() - exact).abs().max() < 1e-3
