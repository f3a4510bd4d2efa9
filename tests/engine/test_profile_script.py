"""benchmarks/step_profile.py's kernel accounting (the profile itself runs on the GPU)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def mod():
    from benchmarks import step_profile

    return step_profile


@pytest.mark.parametrize("name, family", [
    ("nvjet_sm90_tst_128x16_64x11_4x1_v_bz_TNT", "gemm"),
    ("void cublasLt::splitKreduce_kernel<32, 16, int, float>", "gemm"),
    ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16", "attention"),
    ("fmha_cutlassF_bf16_aligned_64x64_rf_sm80", "attention"),  # CUTLASS, but attention
    ("triton_red_fused__to_copy_mean_mul_pow_rsqrt_0", "inductor"),
    ("_topk_chunk_kernel", "dflash2 triton"),
    ("_row_attn_split_kernel", "attention"),
    ("_small_m_linear_kernel", "small-M linear"),
    ("_norm_rope_kernel", "norm-RoPE"),
    ("_row_mean_kernel", "dflash2 triton"),
    ("void at::native::vectorized_elementwise_kernel<4, rsqrt>", "elementwise"),
    ("void at::native::reduce_kernel<512, 1, MeanOps>", "reduce"),
    ("CatArrayBatchedCopy<OpaqueType<2u>>", "copy/cat/fill"),
    ("some_new_kernel", "other"),
])
def test_kernel_families(mod, name, family):
    assert mod.family(name) == family


def test_step_profile_takes_the_difference_of_two_runs(mod, monkeypatch):
    # Prefill kernels appear once in both runs; each decoding step adds 2 GEMMs and 3 norm kernels.
    def fake(steps):
        return {"prefill_gemm_nvjet": (1, 500.0), "nvjet_x": (2 * steps, 10.0 * 2 * steps),
                "triton_per_fused_mean": (3 * steps, 2.0 * 3 * steps)}

    runs = []
    monkeypatch.setattr(mod, "kernels", lambda fn: fn())
    res = mod.step_profile(lambda steps: runs.append(steps) or fake(steps), 4, 12)
    assert runs == [4, 4, 12]  # warm-up, then the two measured runs
    assert res["launches"] == pytest.approx(5) and res["gpu_us"] == pytest.approx(26.0)
    assert res["families"]["gemm"] == {"launches": 2, "us": 20.0}
    assert res["families"]["inductor"] == {"launches": 3, "us": 6.0}
    assert "prefill_gemm_nvjet" not in {t["name"] for t in res["top"]}
    runs.clear()  # the graph loop warms up as long as the longer run, so both profiled runs only replay
    profiled = mod.step_profile(lambda steps: runs.append(steps) or fake(steps), 4, 12, warm=12)
    assert profiled["gpu_us"] == pytest.approx(26.0)
    assert runs == [12, 4, 12]


def test_difference_keeps_what_the_draft_adds(mod):
    """The DFlash2 arm minus the oracle arm, kernel by kernel: the shared verify kernels cancel, the
    draft's own kernels (and the extra launches of a shared one) remain."""
    dflash2 = mod.summarize({"nvjet_verify": (36.0, 500.0), "_topk_chunk_kernel": (1.0, 40.0),
                             "nvjet_draft": (10.0, 90.0), "triton_per_fused_mean": (12.0, 24.0)})
    oracle = mod.summarize({"nvjet_verify": (36.0, 500.2), "triton_per_fused_mean": (8.0, 16.0)})
    d = mod.difference(dflash2, oracle)
    assert set(d["per"]) == {"_topk_chunk_kernel", "nvjet_draft", "triton_per_fused_mean"}
    assert d["gpu_us"] == pytest.approx(40.0 + 90.0 + 8.0) and d["launches"] == pytest.approx(1 + 10 + 4)
    assert d["families"]["dflash2 triton"] == {"launches": 1.0, "us": 40.0}


def test_draft_select_floor_counts_the_draft_and_the_head_at_the_runs_bandwidth(mod, monkeypatch):
    import torch

    class Target:  # the TargetModel surface the floor reads: the HF model's output embedding
        model = torch.nn.Module()

    head = torch.nn.Linear(8, 100, bias=False)
    Target.model.get_output_embeddings = lambda: head
    draft = torch.nn.Sequential(torch.nn.Linear(8, 8, bias=False), torch.nn.LayerNorm(8))
    monkeypatch.setattr(mod, "copy_bandwidth_gbs", lambda device: 2.0)
    f = mod.draft_select_floor(Target(), draft, torch.device("cpu"))
    draft_bytes, head_bytes = (64 + 16) * 4, 800 * 4
    assert f["draft_gb"] * 1e9 == pytest.approx(draft_bytes) and f["head_gb"] * 1e9 == pytest.approx(head_bytes)
    assert f["ms"] == pytest.approx((draft_bytes + head_bytes) / 2e9 * 1e3)
    res = {"meta": "m", "floor": f, "graph": [], "profiles": [
        dict(mod.summarize({"_topk_chunk_kernel": (1.0, 3.0)}), variant="light", batch=1, n=15, loop="eager",
             arm="draft + select (dflash2 - oracle)")]}
    assert f"{3e-3 / f['ms']:.3f} x its bytes floor" in mod.render(res)


def test_variants_map_to_the_engine_settings(mod):
    assert mod.variant_kwargs("base", "auto", "triton") == {"compile_level": None, "attention_impl": "auto",
                                                            "linear_impl": "triton"}
    assert mod.variant_kwargs("light", "torch", "torch")["compile_level"] == "light"
    # exact mode picks its own kernels: none of the normal mode's settings are passed
    assert mod.variant_kwargs("exact", "triton", "triton") == {"exact": True, "exact_block_size": 16}
    assert set(mod.VARIANTS) == {"base", "light", "full", "exact"}
