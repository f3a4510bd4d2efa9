"""Terminal table, self-contained HTML and Markdown reports with PNG plots."""

from __future__ import annotations

import base64
import io
import re

import pytest
from PIL import Image

from dflash2.evaluation.report import make_figures, print_summary, write_report
from dflash2.evaluation.stats import summarize
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


def test_optional_plots(run, tmp_path):
    recs, s = run
    figs = make_figures(s)
    assert "predicted_vs_measured_speedup" not in figs  # no cost model given
    ar_only = [r for r in recs if r["arm"] == "ar"]
    s_ar = summarize(ar_only, n_resamples=50)
    assert make_figures(s_ar) == {}
    write_report(tmp_path, ar_only, s_ar)
    assert "<td>ar</td>" in (tmp_path / "report.html").read_text()
