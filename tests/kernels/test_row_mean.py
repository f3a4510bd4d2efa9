"""The row-mean kernel against `torch.mean` in fp64 (interpreter on CPU, compiled on CUDA), its
row invariance, its limits, and the `RowMeanMode` routing (stock transformers RMSNorms, eager
and under `torch.compile`).

Tolerance (STYLE.md item 6): the kernel sums the widened inputs in fp32 in some fixed order,
divides by K in fp32 and rounds once, so each element may differ from the fp64 truth by the
order-free fp32 bound of a K-term sum plus the division, `(K + 1) * 2^-24 * mean(|x|)` (Higham's
gamma_K, first order), plus half a unit in the last place of the output dtype. On CPU only, the
Triton interpreter converts fp32 to bf16 by truncation, so there a bf16 element may be a whole
ulp off; compiled kernels round to nearest even. For 16-bit outputs of positive rows (the
RMSNorm case, a mean of squares) the final rounding dominates both the kernel's and torch's
error, so the kernel's largest error may also be at most twice torch's (`error_within`); for fp32
outputs torch's CPU sum (pairwise) and the kernel's differ in order, not in the bound above.
"""

from __future__ import annotations

import pytest
import torch

import dflash2.kernels.row_mean as rm
from dflash2.kernels.row_mean import DTYPES, RowMeanMode, block_k_for, row_mean, row_mean_reference

FP32_EPS = 2.0**-24  # unit roundoff of fp32 (the accumulator)
HALF_ULP = {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11, torch.float32: 2.0**-24}  # relative, of |y|
DT_IDS = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}
# K: one element, a short row, fp32 rows of 3 chunks (1024 + 1024 + 452), 16-bit rows of 3 (2048 + 2048 + 404).
KS = [1, 37, 2500, 4500]


def _rounding(dtype: torch.dtype, device: str) -> float:
    """Largest relative error of the final rounding: half an ulp, a whole one for the interpreter's bf16."""
    return HALF_ULP[dtype] * (2.0 if device == "cpu" and dtype == torch.bfloat16 else 1.0)


def _check_close(out: torch.Tensor, x: torch.Tensor) -> None:
    """Per element: within the final rounding + the fp32 summation bound of the fp64 truth."""
    xd = x.double().cpu()
    exact = xd.mean(-1)
    k = x.shape[-1]
    bound = _rounding(x.dtype, x.device.type) * exact.abs() + (k + 1) * FP32_EPS * xd.abs().mean(-1) + 1e-30
    err = (out.double().cpu() - exact).abs()
    assert torch.isfinite(out).all(), "non-finite output"
    assert (err <= bound * 1.001).all(), f"worst element error / bound {(err / bound).max().item():.3g}"


def _calls(monkeypatch) -> list[tuple[int, ...]]:
    """Record the `[R, K]` shape of every launch of the Triton path."""
    calls = []
    real = rm._row_mean_triton
    monkeypatch.setattr(rm, "_row_mean_triton", lambda x, *a: calls.append(tuple(x.shape)) or real(x, *a))
    return calls


@pytest.mark.parametrize("positive", [False, True], ids=["signed", "squares"])
@pytest.mark.parametrize("k", KS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS.get)
def test_matches_fp64_truth(dtype, k, positive, triton_device, error_within):
    x = torch.randn(5, k)
    x = (x * x if positive else x).to(dtype).to(triton_device)
    out = row_mean(x, impl="triton")
    assert out.shape == (5,) and out.dtype == dtype
    _check_close(out, x)
    if positive and dtype != torch.float32:
        exact = x.double().cpu().mean(-1)
        floor = _rounding(dtype, x.device.type) * exact.abs().max().item()
        error_within(out.cpu(), x.cpu().mean(-1), exact, floor)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=DT_IDS.get)
def test_row_alone_equals_row_in_a_batch_bitwise(dtype, triton_device):
    """Row invariance: each row's bits depend on neither the number of rows nor the others' values."""
    k = 4500 if dtype == torch.bfloat16 else 2500  # several chunks, the last one partial
    x = torch.randn(17, k, dtype=dtype).to(triton_device)
    full = row_mean(x, impl="triton")
    for lo, hi in [(0, 1), (16, 17), (5, 8), (0, 17)]:  # batches of 1, 3 and 17 rows
        assert torch.equal(row_mean(x[lo:hi], impl="triton"), full[lo:hi]), f"rows {lo}:{hi} changed with the batch"
    for rows in (1, 3, 17):
        noise = torch.randn(rows, k, dtype=dtype).to(triton_device) * 1e4  # other neighbours
        noise[rows // 2] = x[6]
        assert torch.equal(row_mean(noise, impl="triton")[rows // 2], full[6]), f"row 6 among {rows} others"


def test_repeated_calls_are_deterministic(triton_device):
    x = torch.randn(9, 2500).to(triton_device)
    first = row_mean(x, impl="triton")
    for _ in range(2):
        assert torch.equal(row_mean(x, impl="triton"), first)


@pytest.mark.parametrize("keepdim", [False, True])
def test_shapes_keepdim_and_k_one(keepdim, triton_device):
    x = torch.randn(2, 3, 37, dtype=torch.bfloat16).to(triton_device)
    out = row_mean(x, keepdim=keepdim, impl="triton")
    assert out.shape == ((2, 3, 1) if keepdim else (2, 3)) and out.dtype == torch.bfloat16
    _check_close(out.reshape(2, 3), x)
    assert torch.equal(out.reshape(6), row_mean(x.reshape(6, 37), impl="triton"))  # same rows, same bits
    assert row_mean(x, keepdim=keepdim, impl="torch").shape == out.shape
    one = torch.randn(4, 2, 1).to(triton_device)
    assert torch.equal(row_mean(one, keepdim=keepdim, impl="triton"), one if keepdim else one[..., 0])  # mean of one
    empty = row_mean(torch.randn(0, 3, 8).to(triton_device), keepdim=keepdim, impl="triton")
    assert empty.shape == ((0, 3, 1) if keepdim else (0, 3))


def _views(base: torch.Tensor) -> list[torch.Tensor]:
    """Layouts the kernel does not take as they are, from `base [A, B, C]` (C >= 2)."""
    flat = base.reshape(-1)
    return [base[:, :, :-1],                                   # rows strided (stride C)
            base[:, :, ::2],                                   # stride 2 along K
            base.transpose(1, 2),                              # K = B strided by C
            base[::2, 1],                                      # 2-D, strided rows
            flat[1:1 + base[0].numel()].view(base.shape[1:])]  # contiguous, one element off alignment


def test_non_contiguous_inputs_give_the_contiguous_bits(triton_device):
    """Each layout is copied to contiguous, aligned rows first, so the bits are those of the
    same rows laid out contiguously (the compiled kernel's load width, hence its sum tree,
    would otherwise follow the layout)."""
    for view in _views(torch.randn(3, 12, 20).to(triton_device)):
        out = row_mean(view, impl="triton")
        assert torch.equal(out, row_mean(view.contiguous(), impl="triton"))
        _check_close(out, view)


def test_refusals_name_the_fix(triton_device):
    x = torch.randn(4, 16).to(triton_device)
    with pytest.raises(ValueError, match="resolved"):
        row_mean(x, impl="auto")
    with pytest.raises(ValueError, match="K >= 1"):
        row_mean(torch.randn(4, 0).to(triton_device), impl="triton")
    with pytest.raises(ValueError, match="K >= 1"):
        row_mean(torch.tensor(1.0).to(triton_device), impl="triton")
    with pytest.raises(ValueError, match="cast x"):
        row_mean(x.double(), impl="triton")
    with pytest.raises(ValueError, match="inference-only"):
        row_mean(x.clone().requires_grad_(), impl="triton")
    with torch.no_grad():  # needing grad is fine when autograd is off
        assert row_mean(x.clone().requires_grad_(), impl="triton").shape == (4,)
    assert torch.equal(row_mean(x.double(), impl="torch"), row_mean_reference(x.double()))
    with pytest.raises(ValueError, match="resolved"):
        RowMeanMode("auto", triton_device)


def test_block_size_depends_on_k_and_dtype_only():
    """4 KiB chunks, shorter rows in one power-of-two chunk; warps fixed by the chunk."""
    assert [block_k_for(k, torch.float32) for k in (1, 16, 17, 576, 1024, 4096, 5120)] == [
        16, 16, 32, 1024, 1024, 1024, 1024]
    assert [block_k_for(k, torch.bfloat16) for k in (3, 576, 2048, 4096)] == [16, 1024, 2048, 2048]
    assert block_k_for(4096, torch.float16) == 2048
    assert [rm._num_warps(b) for b in (16, 256, 1024, 2048, 4096)] == [1, 1, 4, 8, 8]


def test_mode_routes_only_what_it_should(monkeypatch, triton_device):
    calls = _calls(monkeypatch)
    mode = RowMeanMode("triton", triton_device)
    x = torch.randn(2, 3, 40).to(triton_device)
    routed = []
    with torch.no_grad(), mode:
        routed.append(x.mean(-1))                                  # routed: [6, 40]
        routed.append(x.mean(-1, keepdim=True))                    # routed, keepdim
        routed.append(torch.mean(x, 2))                            # routed: dim = x.dim() - 1
        routed.append(torch.mean(x, dim=[-1], keepdim=True))       # routed: a one-element list
        routed.append(x.mean(dim=(2,), dtype=torch.float32))       # routed: dtype = x's
        routed.append(torch.mean(input=x[0], dim=-1))              # routed: [3, 40], input by name
        x.mean()                                                   # full reduction
        x.mean(1)                                                  # not the last dim
        x.mean((-2, -1))                                           # two dims
        x.mean(-1, dtype=torch.float64)                            # another dtype
        x.double().mean(-1)                                        # dtype outside DTYPES
        torch.mean(x, -1, out=torch.empty(2, 3, device=triton_device))  # out=
        torch.randn(3, 0, device=triton_device).mean(-1)           # K = 0 (torch gives NaN)
        x.sum(-1)                                                  # not a mean
    with mode:
        x.clone().requires_grad_().mean(-1)                        # needs grad
    with torch.no_grad(), RowMeanMode("torch", triton_device):
        x.mean(-1)                                                 # impl torch: routes nothing
    assert calls == [(6, 40)] * 5 + [(3, 40)]
    refs = [x.mean(-1), x.mean(-1, keepdim=True), x.mean(2), x.mean(-1, keepdim=True), x.mean(-1), x[0].mean(-1)]
    for out, ref in zip(routed, refs):
        assert out.shape == ref.shape and (out - ref).abs().max().item() <= 41 * FP32_EPS * x.abs().max().item()
    assert torch.equal(routed[0], row_mean(x, impl="triton"))
    assert mode.routes(torch.Tensor.mean, (x, -1), {"keepdim": True})
    assert not mode.routes(torch.Tensor.mean, (x.to("meta"), -1))  # another device type
    assert not mode.routes(torch.mean, (x, -1, True, None))       # too many positional arguments
    assert not mode.routes(torch.mean, (x, True))                  # a bool is not a dim


OUT_ULPS = 1.0  # the mean differs from torch's in summation order only: at most one output rounding flips
RMS_EPS_FP32 = 1e-5  # fp32 outputs: K * 2^-24 of the mean (K = 48), through rsqrt and the weight, rounded up


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=DT_IDS.get)
@pytest.mark.parametrize("name", ["llama", "qwen3", "qwen2"])
def test_mode_runs_stock_transformers_rmsnorms(name, dtype, monkeypatch, triton_device):
    from transformers.models.llama.modeling_llama import LlamaRMSNorm
    from transformers.models.qwen2.modeling_qwen2 import Qwen2RMSNorm
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm

    cls = {"llama": LlamaRMSNorm, "qwen3": Qwen3RMSNorm, "qwen2": Qwen2RMSNorm}[name]
    norm = cls(48, eps=1e-6).to(dtype).to(triton_device)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(48) + 1.0)
    x = (torch.randn(2, 5, 48) * 3).to(dtype).to(triton_device)
    calls = _calls(monkeypatch)
    with torch.no_grad():
        ref = norm(x)
        assert calls == []
        with RowMeanMode("triton", triton_device):
            out = norm(x)
    assert calls == [(10, 48)] and out.shape == ref.shape and out.dtype == ref.dtype
    if dtype == torch.float32:
        assert (out - ref).abs().max().item() <= RMS_EPS_FP32 * ref.abs().max().item()
    else:  # one bf16 ulp of the element (2^-7 of its magnitude), twice for the interpreter's truncation
        ulps = OUT_ULPS * (2.0 if triton_device == "cpu" else 1.0)
        assert ((out.float() - ref.float()).abs() <= ulps * 2.0**-7 * ref.float().abs() + 1e-30).all()


LOGITS_RTOL = 1e-4  # fp32 RMSNorm means that differ from torch's in summation order only, one layer deep


def test_mode_runs_a_stock_transformers_target(monkeypatch, triton_device):
    """A tiny stock Qwen3 under the mode: every RMSNorm (input, post-attention, the per-head q / k
    norms on 4-D inputs, the final norm) goes through the kernel and the logits match."""
    from tests.conftest import tiny_qwen3

    model = tiny_qwen3(vocab=96, hidden=32, layers=1).to(triton_device)
    ids = torch.randint(0, 96, (1, 5), device=triton_device)
    calls = _calls(monkeypatch)
    with torch.no_grad():
        ref = model(ids).logits
        assert calls == []
        with RowMeanMode("triton", triton_device):
            out = model(ids).logits
    assert sorted(calls) == sorted([(5, 32), (5, 32), (5 * 4, 16), (5 * 2, 16), (5, 32)])
    assert (out - ref).abs().max().item() <= LOGITS_RTOL * ref.abs().max().item()


def test_mode_around_torch_compile_emits_the_custom_op(triton_device):
    """Dynamo traces the mode's routing into the opaque `dflash2::row_mean` operator, which gives
    the eager kernel's bits (`backend="eager"`: the traced graph runs as is)."""
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    norm = LlamaRMSNorm(48).to(triton_device).eval()
    x = torch.randn(2, 5, 48, dtype=torch.bfloat16).to(triton_device)
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    compiled = torch.compile(norm, backend=backend, fullgraph=True)
    with torch.no_grad(), RowMeanMode("triton", triton_device):
        out = compiled(x)
        eager = norm(x)
    targets = [n.target for g in graphs for n in g.graph.nodes if n.op == "call_function"]
    assert torch.ops.dflash2.row_mean.default in targets
    assert torch.equal(out, eager)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=DT_IDS.get)
@pytest.mark.parametrize("k", [4096, 576])
def test_real_widths_on_gpu_row_invariant_and_accurate(k, dtype, cuda_device):
    """At the 8B hidden size and the 135M one: rows 1..128, each prefix of the batch bitwise equal
    to the full batch's rows, and the accuracy bound against fp64."""
    x = torch.randn(128, k, dtype=dtype, device=cuda_device)
    full = row_mean(x, impl="triton")
    for rows in range(1, 129):
        assert torch.equal(row_mean(x[:rows], impl="triton"), full[:rows]), f"{rows} rows"
    assert torch.equal(row_mean(x[77:78], impl="triton"), full[77:78])
    _check_close(full, x)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=DT_IDS.get)
def test_layouts_on_gpu_give_the_contiguous_bits(dtype, cuda_device):
    """Every layout of `_views` (rows of 4095, 2048, 8 and 4096 elements), the misaligned one
    included, gives the bits of the same rows made contiguous."""
    for view in _views(torch.randn(4, 8, 4096, dtype=dtype, device=cuda_device)):
        assert torch.equal(row_mean(view, impl="triton"), row_mean(view.contiguous(), impl="triton"))


@pytest.mark.gpu
def test_rmsnorm_under_the_mode_on_gpu_is_row_invariant(cuda_device):
    """The end to end claim: a stock bf16 LlamaRMSNorm at K = 4096 under the mode gives each row
    the same bits for every batch of 1..128 rows."""
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    norm = LlamaRMSNorm(4096).to(torch.bfloat16).to(cuda_device)
    x = torch.randn(128, 4096, dtype=torch.bfloat16, device=cuda_device)
    with torch.no_grad(), RowMeanMode("triton", cuda_device):
        full = norm(x)
        for rows in range(1, 129):
            assert torch.equal(norm(x[:rows]), full[:rows]), f"{rows} rows"


@pytest.mark.gpu
def test_cuda_graph_replay_matches_eager(cuda_device):
    x = torch.randn(16, 4096, device=cuda_device)
    row_mean(x, impl="triton")  # warm-up: compiles outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = row_mean(x, keepdim=True, impl="triton")
    for _ in range(2):
        x.copy_(torch.randn_like(x))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(y, row_mean(x, keepdim=True, impl="triton"))
