"""`python -m benchmarks.prompt_lengths` on the CPU at the tiny shape: both modes and arms run,
every (mode, arm) gets lengths no earlier cell used, the table holds each measured median, and
bad arguments are refused before any model is built."""

import pytest

from benchmarks import prompt_lengths as bench


def test_tiny_cpu_run_writes_every_cell(tmp_path):
    out, js = tmp_path / "lengths.md", tmp_path / "lengths.json"
    run = bench.main(["--shape", "tiny", "--device", "cpu", "--lengths", "5-7", "--new-tokens", "4",
                      "--out", str(out), "--json", str(js)])
    rows = run["rows"]
    assert [(r["mode"], r["arm"]) for r in rows] == [(m, a) for m in ("normal", "exact") for a in ("ar", "dflash2@N=3")]
    starts = [r["lengths"][0] for r in rows]
    assert starts == [5 + bench.LENGTH_SHIFT * i for i in range(4)]  # disjoint: each first pass is new
    for r in rows:
        for name in ("new", "seen"):
            assert r[name]["calls"] == 3 and r[name]["prefill_ms"] > 0 and r[name]["wall_ms"] > r[name]["prefill_ms"]
            assert r[name]["compiled"] == 0  # the CPU compiles no Triton binary
        assert f"| {r['mode']} | {r['arm']} | {r['lengths'][0]}-{r['lengths'][1]} | {r['new']['prefill_ms']:.2f} |" \
            in out.read_text()
    assert js.is_file()


@pytest.mark.parametrize("argv", [["--lengths", "9-3"], ["--lengths", "a,b"], ["--modes", "fast"], ["--n", "0"]])
def test_bad_arguments_are_refused(argv, capsys):
    with pytest.raises(SystemExit) as e:
        bench.main(["--device", "cpu", *argv])
    assert e.value.code == 2 and "error:" in capsys.readouterr().err
