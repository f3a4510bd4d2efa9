"""Terminal table, self-contained HTML and Markdown reports with PNG plots."""

from __future__ import annotations

import base64
import io
import math
import re

import pytest
from PIL import Image

from dflash2.evaluation.analysis.report import make_figures, print_summary, write_report
from dflash2.evaluation.analysis.stats import summarize, to_jsonable
from dflash2.evaluation.running.timing import ArmTiming, summarize_end_to_end
from tests.evaluation.synthetic import synthetic_records


@pytest.fixture(scope="module")
def run():
    recs = synthetic_records(n_per_dataset=6, ns=(2, 5), flip={"dflash2@N=5": [0, 3]}, selector_off=True)
    return recs, summarize(recs, n_resamples=200)


def test_terminal_table(run):
    recs, s = run
    buf = io.StringIO()
    print_summary(s, file=buf)
    text = buf.getvalue()
    lines = text.splitlines()
    row = next(ln for ln in lines if ln.startswith("dflash2@N=5 "))
    o = s["per_arm"]["dflash2@N=5"]["overall"]
    assert f"{o['tau_pooled']:.2f} [{o['tau_pooled_ci'][0]:.2f}, {o['tau_pooled_ci'][1]:.2f}]" in row
    assert f"{o['speedup']:.2f}" in row
    assert "[gsm8k]" in text and "[mt_bench]" in text and "tau includes the bonus token" in text
    assert any(ln.startswith("note: dflash2@N=5") for ln in lines)


def test_html_is_self_contained_with_readable_pngs(run, tmp_path):
    recs, s = run
    preds = {"dflash2@N=2": 1.7, "dflash2@N=5": 2.4}
    path = write_report(tmp_path, recs, s, config={"target": {"name": "<tiny>"}}, predictions=preds)
    page = path.read_text()
    assert path == tmp_path / "report.html"
    srcs = re.findall(r'<img alt="([^"]+)" title="[^"]+" src="([^"]+)"', page)
    names = {n for n, _ in srcs}
    assert names == {"tau_vs_n", "speedup_vs_n", "per_position_acceptance", "accepted_length_histogram",
                     "tau_by_dataset", "predicted_vs_measured_speedup"}
    for _, src in srcs:  # every image is inline PNG data
        assert src.startswith("data:image/png;base64,")
        img = Image.open(io.BytesIO(base64.b64decode(src.split(",", 1)[1])))
        assert img.format == "PNG" and img.size[0] >= 400
    assert not re.search(r'(src|href)="(?!data:)', page)  # no external references
    for arm in s["arms"]:
        assert f"<td>{arm}</td>" in page
    assert "&lt;tiny&gt;" in page  # config shown, escaped
    assert "gsm8k/0000" in page  # a flipped sample is listed as discordant / departed
    md = (tmp_path / "report.md").read_text()
    assert "| dflash2@N=5 |" in md and "## Conventions" in md
    for link in re.findall(r"\]\((plots/[^)]+\.png)\)", md):
        assert (tmp_path / link).is_file()


def test_end_to_end_line_per_arm_and_table(run, tmp_path):
    recs, s = run
    ids = {"gsm8k/0000", "gsm8k/0001", "gsm8k/0002"}
    timed = ArmTiming(samples=3, chunks=3, tokens=120, total_s=0.100, generation_s=0.072, score_s=0.009,
                      analysis_s=0.001, sample_ids=set(ids), prefill_s=0.012, steps=120, eager_steps=3,
                      graph_captures=1, prefill_replays=2)
    # The speculative arm timed the same samples: its own 0.045 s of work against the baseline's 0.090
    # (its scoring of a cached result would be cheap; scoring is not part of either figure).
    fast = ArmTiming(samples=3, chunks=3, tokens=120, total_s=0.0456, generation_s=0.036, score_s=0.0003,
                     analysis_s=0.0003, sample_ids=set(ids))
    e2e = summarize_end_to_end({"ar": timed, "dflash2@N=5": fast, "dflash2@N=3": ArmTiming()}, rank=0,
                               world_size=1, baseline="ar")
    e = e2e["per_arm"]["ar"]
    assert e["serve_s"] == pytest.approx(0.090) and e["host_s"] == pytest.approx(0.018)
    assert (e["ms_per_token"], e["generation_ms_per_token"], e["ms_per_sample"]) == pytest.approx((0.75, 0.6, 30.0))
    assert (e["host_fraction"], e["score_ms_per_sample"]) == pytest.approx((0.2, 3.0))
    assert (e["speedup_end_to_end"], e["generation_speedup"]) == pytest.approx((1.0, 1.0))
    # generation = prefill + decode: 12 ms of prefills over 3 calls, the other 60 ms over 120 steps
    assert (e["prefill_ms_per_call"], e["decode_ms_per_step"]) == pytest.approx((4.0, 0.5))
    assert (e["eager_steps_per_call"], e["graph_captures"], e["prefill_replays"]) == pytest.approx((1.0, 1, 2))
    f = e2e["per_arm"]["dflash2@N=5"]
    assert (f["speedup_end_to_end"], f["generation_speedup"]) == pytest.approx((2.0, 2.0))
    untimed = e2e["per_arm"]["dflash2@N=3"]
    assert untimed["samples"] == 0 and untimed["ms_per_token"] != untimed["ms_per_token"]  # NaN: nothing timed
    assert untimed["speedup_end_to_end"] != untimed["speedup_end_to_end"]
    for summary in ({**s, "end_to_end": e2e}, {**s, "end_to_end": to_jsonable(e2e)}):  # in memory; as read back
        buf = io.StringIO()
        print_summary(summary, file=buf)
        lines = buf.getvalue().splitlines()
        ar = next(ln for ln in lines if ln.startswith("  ar "))
        assert ("0.750 ms/token end to end (generation 0.600: prefill 4.0 ms/call, decode 0.500 ms/step; host 20%), "
                "30.00 ms/sample, scoring 3.00 ms/sample apart, 3 samples") in ar
        n5 = next(ln for ln in lines if ln.startswith("  dflash2@N=5 "))
        assert "15.00 ms/sample, speedup 2.000 end to end (2.000 generation), scoring 0.10 ms/sample apart" in n5
        assert any(ln.startswith("  dflash2@N=3 ") and "- ms/token end to end (0 samples timed)" in ln for ln in lines)
        assert any("scoring and the analysis forwards apart" in ln for ln in lines)
        page = write_report(tmp_path, recs, summary).read_text()
        assert "End to end per arm (this process" in page and "6 samples timed" in page
        cells = ["ar", "3", "120", "0.100", "0.750", "0.600", "30.00", "20.0", "1.000", "1.000", "4.00", "0.500",
                 "1.00", "1", "2", "3.00", "1.0"]
        assert "".join(f"<td>{c}</td>" for c in cells) in page
        assert "<td>dflash2@N=5</td><td>3</td><td>120</td><td>0.046</td><td>0.375</td>" in page
        assert "<td>dflash2@N=3</td><td>0</td><td>0</td><td>0.000</td><td>-</td>" in page
    buf = io.StringIO()
    print_summary(s, file=buf)  # a summary rebuilt from records alone has no end_to_end: no lines
    assert "end to end" not in buf.getvalue() and "End to end" not in write_report(tmp_path, recs, s).read_text()
    sharded = summarize_end_to_end({"ar": timed}, rank=0, world_size=2)
    assert "End to end per arm (rank 0 of 2" in write_report(tmp_path, recs, {**s, "end_to_end": sharded}).read_text()


def test_end_to_end_speedups_need_the_same_samples():
    base = ArmTiming(samples=2, chunks=2, tokens=20, total_s=0.5, generation_s=0.4, sample_ids={"a", "b"})
    other = ArmTiming(samples=2, chunks=2, tokens=20, total_s=0.25, generation_s=0.2, sample_ids={"a", "c"})
    got = summarize_end_to_end({"ar": base, "x": other}, baseline="ar")["per_arm"]["x"]
    assert math.isnan(got["speedup_end_to_end"]) and math.isnan(got["generation_speedup"])
    none = summarize_end_to_end({"ar": base, "x": other})["per_arm"]["x"]  # no baseline named
    assert math.isnan(none["speedup_end_to_end"])


def test_optional_plots(run, tmp_path):
    recs, s = run
    figs = make_figures(s)
    assert "predicted_vs_measured_speedup" not in figs  # no cost model given
    ar_only = [r for r in recs if r["arm"] == "ar"]
    s_ar = summarize(ar_only, n_resamples=50)
    assert make_figures(s_ar) == {}
    write_report(tmp_path, ar_only, s_ar)
    assert "<td>ar</td>" in (tmp_path / "report.html").read_text()


def test_eval_report_script_rebuilds_from_records(run, tmp_path, capsys):
    import importlib.util
    import json
    from pathlib import Path

    recs, s = run
    script = Path(__file__).resolve().parents[2] / "eval" / "report.py"
    spec = importlib.util.spec_from_file_location("eval_report_script", script)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    lines = [json.dumps(r) for r in recs]
    (tmp_path / "records.jsonl").write_text("\n".join(lines) + "\n" + lines[0][:40])  # torn last line
    e2e = to_jsonable(summarize_end_to_end({"ar": ArmTiming(samples=2, chunks=2, tokens=20, total_s=0.5,
                                                            generation_s=0.4)}))
    (tmp_path / "summary.json").write_text(json.dumps({"checks": {"identical_to_ar": {"passed": True}},
                                                       "end_to_end": e2e}))
    (tmp_path / "preds.json").write_text(json.dumps({"dflash2@N=5": 2.0}))
    out = mod.main([str(tmp_path), "--n-resamples", "200", "--predictions", str(tmp_path / "preds.json")])
    saved = json.loads((tmp_path / "summary.json").read_text())
    assert saved["checks"] == {"identical_to_ar": {"passed": True}}  # the run's own keys are kept
    assert saved["end_to_end"] == e2e  # the runner's timing cannot be rebuilt from records
    assert saved["per_arm"]["dflash2@N=5"]["overall"]["tau_pooled"] == s["per_arm"]["dflash2@N=5"]["overall"][
        "tau_pooled"] == out["per_arm"]["dflash2@N=5"]["overall"]["tau_pooled"]
    assert (tmp_path / "plots" / "predicted_vs_measured_speedup.png").is_file()
    assert "<h2>Run checks</h2>" in (tmp_path / "report.html").read_text()
    assert "dflash2@N=5" in capsys.readouterr().out
    (tmp_path / "records.jsonl").write_text(lines[0] + "\n{bad\n" + lines[1] + "\n")
    with pytest.raises(ValueError, match=r"records.jsonl:2"):
        mod.main([str(tmp_path)])


def test_same_tokens_compares_two_runs_and_writes_nothing(run, tmp_path, capsys):
    """`eval/report.py --same-tokens A B`: equal tokens per (arm, sample) pass (other fields may
    differ, e.g. the accepted counts of a drafter run in another batch); one changed token exits 1
    naming the pair; a directory without records is one line with status 2."""
    import importlib.util
    import json
    from pathlib import Path

    recs, _ = run
    script = Path(__file__).resolve().parents[2] / "eval" / "report.py"
    spec = importlib.util.spec_from_file_location("eval_report_script", script)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    a, b = tmp_path / "batch8", tmp_path / "alone"
    for d, rows in ((a, recs), (b, [{**r, "accepted": list(r["accepted"])[::-1]} for r in recs])):
        d.mkdir()
        (d / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    res = mod.main(["--same-tokens", str(a), str(b)])
    assert res["equal"] and res["n_equal"] == len(recs)
    assert sorted(p.name for p in a.iterdir()) == ["records.jsonl"]  # nothing written
    changed = [dict(r) for r in recs]
    changed[3]["tokens"] = list(changed[3]["tokens"]) + [7]
    (b / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in changed))
    with pytest.raises(SystemExit) as e:
        mod.main(["--same-tokens", str(a), str(b)])
    assert e.value.code == 1
    out = capsys.readouterr().out
    assert f"{len(recs) - 1} of {len(recs)}" in out
    assert f"differs: ['{changed[3]['arm']}', '{changed[3]['sample_id']}']" in out
    with pytest.raises(SystemExit) as e:
        mod.main(["--same-tokens", str(a), str(tmp_path / "missing")])
    assert e.value.code == 2


def _legend_colours(fig) -> dict[str, tuple]:
    """Legend label -> RGB of its handle (a line, an errorbar's line, or a bar)."""
    from matplotlib.colors import to_rgb

    out = {}
    for handle, label in zip(*fig.axes[0].get_legend_handles_labels()):
        artist = handle.lines[0] if hasattr(handle, "lines") and handle.lines else handle
        artist = artist.patches[0] if hasattr(artist, "patches") else artist
        colour = artist.get_facecolor() if hasattr(artist, "get_facecolor") and not hasattr(artist, "get_xdata") \
            else artist.get_color()
        out[label] = tuple(round(c, 6) for c in to_rgb(colour))
    return out


def test_each_arm_keeps_one_colour_and_its_own_name_in_every_figure(run):
    import matplotlib.pyplot as plt

    from dflash2.evaluation.analysis.report import arm_colours

    recs, s = run
    colours = {k: tuple(round(c, 6) for c in v) for k, v in arm_colours(s["arms"]).items()}
    assert len({colours[a] for a in s["arms"]}) == len(s["arms"])  # arms are told apart
    assert colours["dflash2"] == colours["dflash2@N=5"] != colours["selector_off"]  # a family's hue
    figs = make_figures(s, predictions={"dflash2@N=2": 1.7, "dflash2@N=5": 2.4})
    seen: dict[str, tuple] = {}
    for name, fig in figs.items():
        for label, colour in _legend_colours(fig).items():
            assert "spec" not in label, (name, label)  # the records' names, not the arm kind
            if label == "measured = predicted":  # the diagonal, no arm
                continue
            arm = label.split(" (")[0]  # "dflash2 (tau pooled)" -> the family "dflash2"
            assert arm in colours, (name, label)
            assert colour == colours[arm], (name, label)
            seen.setdefault(arm, colour)
            assert seen[arm] == colour  # the same colour in every figure
        plt.close(fig)
    assert {"dflash2", "selector_off", "dflash2@N=2", "dflash2@N=5", "selector_off@N=5"} <= set(seen)


def test_integer_axes_have_integer_ticks(run):
    import matplotlib.pyplot as plt

    _, s = run
    figs = make_figures(s)
    for name in ("tau_vs_n", "speedup_vs_n", "per_position_acceptance", "accepted_length_histogram"):
        ticks = figs[name].axes[0].get_xticks()
        assert len(ticks) and all(float(t).is_integer() for t in ticks), (name, ticks)
    for fig in figs.values():
        plt.close(fig)


def test_conventions_print_numbers_not_variable_names(run, tmp_path):
    recs, s = run
    write_report(tmp_path, recs, s)
    page, md = (tmp_path / "report.html").read_text(), (tmp_path / "report.md").read_text()
    batches = s["per_arm"]["dflash2@N=5"]["overall"]["speedup_batches"]
    assert f"dflash2@N=5: {batches}" in s["conventions"]["speedup"]
    for text in (page, md):
        conventions = text[text.index("Conventions"):]
        assert "speedup_batches" not in conventions and f"dflash2@N=5: {batches}" in conventions
        assert not re.search(r"\{[a-z_]+\}", conventions)  # no unformatted placeholder either


def test_header_states_whether_outputs_were_identical_to_ar(tmp_path, capsys):
    """The losslessness sentence: greedy counts (all identical, or how many departed, with the
    exact-mode state and width), sampled runs say they are not compared token by token; it heads
    the terminal summary, report.md and report.html; no sentence without a speculative arm."""
    from dflash2.evaluation.analysis.report import identity_line

    base = {"temperatures": [0.0], "exact": True, "exact_block_size": 16, "exact_impl": "rows",
            "checks": {"identical_to_ar": {"records": 48, "n_differing": 0, "differing": []}}}
    assert identity_line(base) == ("Greedy: 48 speculative records, all bit-identical to the AR arm; exact mode on "
                                   "(every forward 16 wide, exact_impl rows).")
    invariant = {**base, "exact_impl": "invariant"}  # each block at its own width: the width is the attention tile
    assert identity_line(invariant).endswith("exact mode on (attention tile 16 queries, exact_impl invariant).")
    departed = {**base, "exact": False, "checks": {"identical_to_ar": {"records": 48, "n_differing": 5}}}
    line = identity_line(departed)
    assert "43 bit-identical to the AR arm, 5 departed" in line and "exact mode off" in line and "near-ties" in line
    sampled = {**base, "temperatures": [1.0]}
    assert identity_line(sampled).startswith("Sampled (T = 1): outputs follow the target's distribution")
    assert identity_line({"checks": {}}) is None
    assert identity_line({"checks": {"identical_to_ar": {"records": 0}}}) is None

    records = synthetic_records()
    summary = summarize(records, n_resamples=100)
    summary["checks"] = {"identical_to_ar": {"records": sum(r["arm_kind"] != "ar" for r in records),
                                             "n_differing": 0}}
    summary.update(exact=False, exact_block_size=None)
    expected = identity_line(summary)
    assert expected
    print_summary(summary)
    assert expected in capsys.readouterr().out
    write_report(tmp_path, records, summary)
    assert expected in (tmp_path / "report.md").read_text()
    assert expected in (tmp_path / "report.html").read_text()


def test_engine_record_names_what_varied_and_keeps_the_first_fallback():
    from dflash2.engine.settings import EngineSettings
    from dflash2.evaluation.analysis.run_sections import engine_lines, engine_rows, note_engine

    engine: dict = {}
    base = EngineSettings(kernel_impl="triton", attention_impl="triton", linear_impl="triton", graphs=True)
    note_engine(engine, "ar", base, None)
    note_engine(engine, "ar", base, "capture failed: x")
    note_engine(engine, "ar", EngineSettings(kernel_impl="triton", attention_impl="triton", graphs=False), "y")
    note_engine(engine, "dflash2@N=3", None, None)  # no settings: nothing recorded
    rec = engine["ar"]
    assert list(engine) == ["ar"] and rec["linear_impl"] == "triton" and rec["graphs"] is True
    assert rec["varied"] == ["linear_impl", "graphs"] and rec["graph_error"] == "capture failed: x"
    assert engine_rows({"engine": engine}) == [["ar", "triton", "triton", "triton", "off", "on", "off", "chain",
                                                "capture failed: x", "linear_impl, graphs"]]
    line, = engine_lines({"engine": engine})
    assert line.startswith("\nengine (every arm): kernels triton, attention triton, linear triton, compile off, "
                           "graphs on, exact off; graph path fell back: capture failed: x; varied between calls: "
                           "linear_impl, graphs")
    exact = EngineSettings(kernel_impl="triton", attention_impl="triton", exact=True, exact_impl="invariant",
                           graphs=True, verify="tree", tree_budget=32)
    note_engine(engine, "tree32@N=7", exact, None)
    lines = engine_lines({"engine": engine})
    assert lines[0] == "\nengine per arm:" and "exact invariant (width 16), verify tree 32 nodes" in lines[2]
    assert "linear exact mode's own" in lines[2]
