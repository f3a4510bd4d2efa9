"""benchmarks.batch_scaling on the CPU: the normal arms are timed; the exact arms are timed under the
Triton interpreter or report the engine's refusal without it; the tables name every row."""

import json

from benchmarks import batch_scaling


def test_rows_and_tables(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("OUT", str(tmp_path))
    assert batch_scaling.main(["--shape", "tiny", "--batch", "2", "--new-tokens", "3", "--prompt-tokens", "8,24",
                               "--device", "cpu"]) == 0
    rows = json.loads((tmp_path / "batch_scaling.json").read_text())
    assert [(r["B"], r["arm"]) for r in rows] == [(b, a[0]) for b in (2,) for a in batch_scaling.ARMS]
    for r in rows:
        if "error" in r:   # only an exact arm may be refused (no CUDA and no interpreter)
            assert r["arm"].endswith("_exact") and "exact_impl" in r["error"] and "ms_step" not in r
        else:   # timed: a whole call's wall over the longest row's steps (3 new tokens: 2 steps)
            assert r["steps"] == 2 and r["wall_s"] > 0 and 0 < r["prefill_s"] <= r["wall_s"]
            assert abs(r["ms_step"] - 1000 * r["wall_s"] / 2) < 1   # wall_s is rounded to 1 ms
            assert abs(r["ms_decode"] - 1000 * (r["wall_s"] - r["prefill_s"]) / 2) < 1
    md = (tmp_path / "batch_scaling.md").read_text()
    assert "prompts of 8-23 tokens" in md.splitlines()[0]
    starts = [line.split(" |")[0] for line in md.splitlines()]
    assert starts.count("| 2") == 5   # 4 arm rows + the ratio row
    timed = {(r["B"], r["arm"]): r for r in rows if "ms_step" in r}
    if (2, "ar_exact") in timed:
        assert f"| 2 | {timed[2, 'ar_exact']['ms_step'] / timed[2, 'ar_t1']['ms_step']:.1f}x |" in md
        alone = timed[2, 'n7_exact']['ms_decode'] / timed[2, 'n7_t1']['ms_decode']
        assert md.splitlines()[-1].endswith(f" | {alone:.1f}x |")


def test_bad_input_one_line(capsys):
    assert batch_scaling.main(["--shape", "tiny", "--new-tokens", "1", "--device", "cpu"]) == 2
    assert capsys.readouterr().err.strip() == "error: --new-tokens must be >= 2"
    assert batch_scaling.main(["--shape", "tiny", "--prompt-tokens", "24,8", "--device", "cpu"]) == 2
    assert capsys.readouterr().err.strip() == "error: --prompt-tokens must be MIN,MAX with MIN < MAX, got [24, 8]"
