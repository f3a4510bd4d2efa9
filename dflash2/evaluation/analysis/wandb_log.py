"""Weights & Biases logging of an evaluation run, and a W&B Report built from it.

`log_run` writes one W&B run (mode `online`, `offline` or `disabled`, from `LoggerSpec`):

- **summary**: flat keys `"<arm>/<metric>"` (tau pooled / per-request with CI bounds, speedup
  with CI bounds, accuracy, McNemar p, TOST p, MDE, identity fraction, tokens/s, verify rows
  and forward rows per step, mean verify length) and
  `"<arm>/<dataset>/<metric>"`, plus `n_samples`;
- **series** for line plots over a custom x axis (`wandb.define_metric`): `vs_n/<kind>/<metric>`
  against `n_spec` (tau and speedup vs N), `acceptance/<arm>` against `position`
  (per-position acceptance) and `depth_acceptance/<arm>` against `position` (per-depth
  acceptance within each step's verify length, `analysis/verify.py`);
- **tables**: `records` (one row per record) and `summary_table` (the terminal table);
- **plots**: the report's matplotlib figures as images `plots/<name>`.

`build_report(run, summary)` returns a `wandb_workspaces.reports.v2.Report` whose panels read
those keys (LinePlots over N and position, BarPlots per arm, the plot images, the records
table); it is not saved. `log_run` saves it only in online mode. `read_offline_run` reads an
offline run's `.wandb` file back (summary, history, config), e.g. to check what was logged.
"""

from __future__ import annotations

import json
import os
import struct
import time
import warnings
from pathlib import Path
from typing import Any

from dflash2.engine.stats import tau_pooled
from dflash2.evaluation.analysis.records import FIELDS, Record, as_records, verify_of
from dflash2.runconfig import LoggerSpec

MODES = ("disabled", "offline", "online")
OVERALL_KEYS = ("tau_pooled", "tau_per_request", "speedup", "accuracy", "tokens_per_s", "identical_fraction",
                "tost_accuracy_p", "mde_accuracy", "accuracy_diff", "tost_logprob_p", "logprob_diff", "logprob_mean",
                "steps_total", "tokens_total", "wall_s_total", "n", "verify_rows_per_step", "forward_rows_per_step",
                "verify_length_mean")
CI_KEYS = ("tau_pooled_ci", "tau_per_request_ci", "speedup_ci", "accuracy_ci")
DATASET_KEYS = ("tau_pooled", "tau_per_request", "speedup", "accuracy", "identical_fraction")
# The `records` table: every scalar field of `records.Record` (its sequences and the departure dict
# are summarized by `new_tokens`, `tau` and `verify_rows_per_step`), then those derived columns.
RECORD_FIELD_COLUMNS = [f for f in FIELDS if f not in ("tokens", "accepted", "departure", "verify_lengths",
                                                       "verify_rows")]
RECORD_COLUMNS = RECORD_FIELD_COLUMNS + ["new_tokens", "tau", "verify_rows_per_step"]
TEXT_CHARS = 2000  # of each record's text in the table


def flat_metrics(summary: dict) -> dict[str, Any]:
    """Scalar summary metrics as flat W&B keys (`<arm>/<metric>`, `<arm>/<dataset>/<metric>`)."""
    flat: dict[str, Any] = {"n_samples": summary["n_samples"]}
    for arm in summary["arms"]:
        e = summary["per_arm"][arm]
        o = e["overall"]
        for k in OVERALL_KEYS:
            if o.get(k) is not None:
                flat[f"{arm}/{k}"] = o[k]
        for k in CI_KEYS:
            if o.get(k) and o[k][0] is not None:
                flat[f"{arm}/{k}_low"], flat[f"{arm}/{k}_high"] = o[k]
        if o.get("mcnemar"):
            flat[f"{arm}/mcnemar_p"] = o["mcnemar"]["p"]
        for ds, m in e["by_dataset"].items():
            for k in DATASET_KEYS:
                if m.get(k) is not None:
                    flat[f"{arm}/{ds}/{k}"] = m[k]
    return flat


def _record_rows(records: list[Record | dict]) -> list[list[Any]]:
    """One row per record, in `RECORD_COLUMNS` order (tau and verify rows per step: None for a
    record without steps; the rows as `records.verify_of` reads them)."""
    rows = []
    for r in as_records(records):
        tau = tau_pooled([r.accepted]) if r.accepted else None
        row = [getattr(r, f) for f in RECORD_FIELD_COLUMNS]
        row[RECORD_FIELD_COLUMNS.index("text")] = (r.text or "")[:TEXT_CHARS]
        v_rows = sum(verify_of(r)["rows"]) / r.steps if r.steps else None
        rows.append(row + [len(r.tokens), tau, v_rows])
    return rows


def _entity_project(run_or_path) -> tuple[str | None, str, str, str]:
    """(entity, project, run id, display name) of a wandb Run or an `entity/project/run_id` path."""
    if isinstance(run_or_path, str):
        parts = run_or_path.strip("/").split("/")
        if len(parts) != 3:
            raise ValueError(f"run path {run_or_path!r}: expected 'entity/project/run_id'")
        return parts[0], parts[1], parts[2], parts[2]
    return run_or_path.entity or None, run_or_path.project, run_or_path.id, run_or_path.name or run_or_path.id


def build_report(run_or_path, summary: dict, *, entity: str | None = None, title: str | None = None,
                 plot_names: list[str] | None = None):
    """A W&B Report (`wandb_workspaces.reports.v2`) over one logged eval run; not saved.

    Args:
        run_or_path: the `wandb` Run `log_run` logged to, or `"entity/project/run_id"`.
        summary: the run's summary (`stats.summarize`): arm names and kinds choose the panels.
        entity: overrides the run's entity (offline runs have none; building needs no login,
            saving does).
        title: report title.
        plot_names: names of the logged `plots/<name>` images (default: all `make_figures` names).
    Returns:
        `wandb_workspaces.reports.v2.Report`; call `.save()` to publish it (online only).
    """
    import wandb_workspaces.reports.v2 as wr

    run_entity, project, run_id, name = _entity_project(run_or_path)
    entity = entity or run_entity
    if not entity:
        raise ValueError("build_report: the run has no entity (offline run?); pass entity=<your W&B entity>")
    spec_arms = [a for a in summary["arms"] if summary["per_arm"][a]["num_speculative_tokens"] > 0]
    kinds = list(summary["vs_n"])
    from dflash2.evaluation.analysis.report import has_verify_policies

    policies = has_verify_policies(summary)
    if plot_names is None:
        plot_names = ["tau_vs_n", "speedup_vs_n", "per_position_acceptance", "accepted_length_histogram",
                      "tau_by_dataset"] + (["tau_speedup_vs_verify_rows"] if policies else [])
    temps = ", ".join(f"{t:g}" for t in summary.get("temperatures", []))
    panels = [
        wr.LinePlot(title="tau (pooled, incl. bonus) vs N", x="n_spec",
                    y=[f"vs_n/{k}/tau_pooled" for k in kinds] + [f"vs_n/{k}/tau_per_request" for k in kinds],
                    title_x="num_speculative_tokens N", title_y="tau"),
        wr.LinePlot(title="speedup vs AR vs N", x="n_spec", y=[f"vs_n/{k}/speedup" for k in kinds],
                    title_x="num_speculative_tokens N", title_y="speedup (AR wall / arm wall)"),
        wr.LinePlot(title="per-position acceptance", x="position", y=[f"acceptance/{a}" for a in spec_arms],
                    title_x="draft position i", title_y="fraction of steps accepting >= i"),
        wr.BarPlot(title="speedup per arm", metrics=[f"{a}/speedup" for a in spec_arms], orientation="v"),
        wr.BarPlot(title="tau pooled per arm", metrics=[f"{a}/tau_pooled" for a in spec_arms], orientation="v"),
        wr.MediaBrowser(title="report plots", media_keys=[f"plots/{p}" for p in plot_names], num_columns=2),
        wr.WeavePanelSummaryTable(table_name="summary_table"),
        wr.WeavePanelSummaryTable(table_name="records"),
    ]
    if policies:  # after the per-arm bars: verify rows per step and per-depth acceptance
        panels[5:5] = [
            wr.BarPlot(title="verify rows per step per arm", metrics=[f"{a}/verify_rows_per_step" for a in spec_arms],
                       orientation="v"),
            wr.LinePlot(title="per-depth acceptance (within each step's verify length)", x="position",
                        y=[f"depth_acceptance/{a}" for a in spec_arms], title_x="depth d",
                        title_y="P(depth d accepted | d - 1 accepted, d <= L)")]
    if any(summary["per_arm"][a]["overall"].get("n_scored") for a in summary["arms"]):
        panels.insert(5, wr.BarPlot(title="accuracy per arm", metrics=[f"{a}/accuracy" for a in summary["arms"]],
                                    orientation="v"))
    notes = "\n".join(f"- {n}" for n in summary.get("notes", []))
    conv = "\n".join(f"- **{k}**: {v}" for k, v in summary.get("conventions", {}).items())
    blocks = [
        wr.H1(title or f"DFlash2 evaluation: {name}"),
        wr.P(f"{summary['n_samples']} samples ({', '.join(summary['datasets'])}), temperature {temps}; arms: "
             f"{', '.join(summary['arms'])}. tau includes the bonus token; speedup is paired AR / arm wall time."),
        wr.PanelGrid(runsets=[wr.Runset(entity=entity, project=project, name=name,
                                        filters=f"Metric('ID') in ['{run_id}']")], panels=panels),
        wr.H2("Notes"), wr.MarkdownBlock(notes or "- none"),
        wr.H2("Conventions"), wr.MarkdownBlock(conv),
    ]
    return wr.Report(project=project, entity=entity, title=title or f"DFlash2 eval {name}",
                     description="Speculative decoding evaluation (dflash2)", blocks=blocks)


def log_run(summary: dict, records: list[Record | dict], logger: LoggerSpec, config: dict, out_dir: str | os.PathLike,
            *, predictions: dict[str, float] | None = None) -> str | None:
    """Log an evaluation run to W&B.

    Args:
        summary: `stats.summarize(records)`.
        records: the run's records.
        logger: `LoggerSpec` (mode disabled / offline / online, project, entity, name, group, tags).
        config: the resolved run config (becomes the W&B config).
        out_dir: run directory; W&B files go to `$WANDB_DIR` when set, else `out_dir/wandb/`.
        predictions: optional arm -> predicted speedup (adds that plot).
    Returns:
        the W&B run directory (`.../offline-run-*` or `.../run-*`), None when disabled.
    """
    if logger.mode not in MODES:
        raise ValueError(f"logger.mode={logger.mode!r}: use one of {', '.join(MODES)}")
    if logger.mode == "disabled":
        return None
    import matplotlib.pyplot as plt
    import wandb
    from PIL import Image

    from dflash2.evaluation.analysis.report import COLUMNS, figure_png, make_figures, summary_rows

    wdir = os.environ.get("WANDB_DIR") or str(Path(out_dir))
    Path(wdir).mkdir(parents=True, exist_ok=True)
    run = wandb.init(project=logger.project, entity=logger.entity, name=logger.name, group=logger.group,
                     tags=list(logger.tags or []), config=config, dir=wdir, mode=logger.mode, job_type="eval")
    try:
        run.define_metric("n_spec")
        run.define_metric("vs_n/*", step_metric="n_spec")
        run.define_metric("position")
        run.define_metric("acceptance/*", step_metric="position")
        run.define_metric("depth_acceptance/*", step_metric="position")
        for kind, s in summary["vs_n"].items():
            for i, n in enumerate(s["N"]):
                run.log({"n_spec": n, **{f"vs_n/{kind}/{k}": s[k][i] for k in ("tau_pooled", "tau_per_request",
                                                                                   "speedup") if s[k][i] is not None}})
        for arm in summary["arms"]:
            o = summary["per_arm"][arm]["overall"]
            for i, v in enumerate(o["per_position_acceptance"], start=1):
                if v is not None:
                    run.log({"position": i, f"acceptance/{arm}": v})
            for i, v in enumerate(o.get("depth_acceptance") or [], start=1):
                if v is not None:
                    run.log({"position": i, f"depth_acceptance/{arm}": v})
        figs = make_figures(summary, predictions)
        images = {}
        for name, fig in figs.items():
            import io

            images[f"plots/{name}"] = wandb.Image(Image.open(io.BytesIO(figure_png(fig))), caption=name)
            plt.close(fig)
        run.log({**images, "records": wandb.Table(columns=RECORD_COLUMNS, data=_record_rows(records)),
                 "summary_table": wandb.Table(columns=COLUMNS, data=summary_rows(summary))})
        run.summary.update(flat_metrics(summary))
        run.summary["notes"] = "\n".join(summary.get("notes", []))
        summary_path = Path(out_dir) / "summary.json"
        if summary_path.is_file():
            run.save(str(summary_path), base_path=str(Path(out_dir)), policy="now")
        if logger.mode == "online":
            try:
                report = build_report(run, summary, plot_names=list(figs))
                report.save()
                run.summary["report_url"] = report.url
            except Exception as e:  # a report failure must not lose the logged run
                warnings.warn(f"W&B report was not saved: {e}", stacklevel=2)
        run_dir = str(Path(run.settings.sync_dir))
    finally:
        run.finish()
    if logger.mode == "offline" and not read_offline_run(run_dir)["complete"]:
        warnings.warn(f"W&B offline run {run_dir}: its log has no exit record yet", stacklevel=2)
    return run_dir


# ------------------------------------------------------------------------------ offline reader

_BLOCK = 32768  # LevelDB log format: 32 KiB blocks of 7-byte-headed chunks
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def _records(path: Path):
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    if data[:4] != b":W&B":
        raise ValueError(f"{path} is not a W&B transaction log (no :W&B header)")
    # A 7-byte file header (':W&B', magic, version), then the log; wandb-core's writer counts
    # its 32 KiB blocks from the end of that header.
    data, pos, buf = data[7:], 0, b""
    while pos + 7 <= len(data):
        left = _BLOCK - pos % _BLOCK
        if left < 7:  # block trailer padding
            pos += left
            continue
        _crc, n, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if n == 0 and kind == 0:
            pos += left
            continue
        buf += data[pos + 7:pos + 7 + n]
        pos += 7 + n
        if kind in (_FULL, _LAST):
            rec = pb.Record()
            rec.ParseFromString(buf)
            buf = b""
            yield rec


def _apply(target: dict, item) -> None:
    keys = list(item.nested_key) or [item.key]
    d = target
    for k in keys[:-1]:
        d = d.setdefault(k, {})
    d[keys[-1]] = json.loads(item.value_json)


def read_offline_run(run_dir: str | os.PathLike, *, wait_s: float = 30.0) -> dict[str, Any]:
    """Summary, history and config of a W&B run directory, read from its `run-*.wandb` log.

    wandb >= 0.2x writes no `wandb-summary.json` in offline mode; the transaction log (LevelDB
    log format of `wandb.proto` `Record`s) is the record of what was logged. wandb-core may
    still be writing it after `run.finish()` returns, so this waits (up to `wait_s`) for the
    log's `exit` record.

    Returns:
        `{"summary": {...}, "history": [{...}, ...], "config": {...}, "run_id": str,
        "complete": bool}` (`complete`: the exit record was seen).
    """
    files = sorted(Path(run_dir).glob("run-*.wandb"))
    if not files:
        raise FileNotFoundError(f"no run-*.wandb file in {run_dir}")
    deadline = time.monotonic() + wait_s
    while True:
        try:
            recs = list(_records(files[0]))
        except Exception:  # a chunk being written right now: read again
            recs = []
        complete = any(r.WhichOneof("record_type") == "exit" for r in recs)
        if complete or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    out: dict[str, Any] = {"summary": {}, "history": [], "config": {}, "run_id": None, "complete": complete}
    for rec in recs:
        kind = rec.WhichOneof("record_type")
        if kind == "summary":
            for item in rec.summary.update:
                _apply(out["summary"], item)
        elif kind == "history":
            row: dict = {}
            for item in rec.history.item:
                _apply(row, item)
            out["history"].append(row)
        elif kind == "run":
            out["run_id"] = rec.run.run_id
            for item in rec.run.config.update:
                _apply(out["config"], item)
        elif kind == "config":
            for item in rec.config.update:
                _apply(out["config"], item)
    return out
