"""The summary's sections that come from the runner rather than the records, as table rows and
terminal lines: `end_to_end` (each arm's timed work, `dflash2.evaluation.running.timing`) and
`engine` (the settings each arm's calls resolved to). `report.print_summary` prints the lines and
`report.write_report` shows the rows as tables; a summary rebuilt from records alone has neither.

Public: `E2E_COLUMNS`, `E2E_SCOPE`, `e2e_where`, `end_to_end_rows`, `end_to_end_lines`,
`ENGINE_COLUMNS`, `engine_rows`, `engine_lines`, `note_engine`.
"""

from __future__ import annotations

import dataclasses

from dflash2.evaluation.analysis.formatting import fmt_number as _num
from dflash2.evaluation.analysis.formatting import fmt_share as _pct

E2E_COLUMNS = ["arm", "samples timed", "tokens", "total s", "ms/token end to end", "ms/token generation",
               "ms/sample", "host %", "speedup end to end", "speedup generation", "prefill ms/call", "decode ms/step",
               "eager steps/call", "graph captures", "prefill replays", "score ms/sample", "analysis %"]
# What "end to end" covers, for the terminal and the report's headings (`running.timing`).
E2E_SCOPE = ("each arm's own work: tokenize + generate + decode + write; scoring and the analysis forwards apart; "
             "speedups over the baseline arm on the same timed samples")


def e2e_where(e2e: dict) -> str:
    """Whose chunks `end_to_end` timed: "this process", or "rank r of K" in a sharded run."""
    world = e2e.get("world_size", 1)
    return f"rank {e2e.get('rank', 0)} of {world}" if world > 1 else "this process"


def warmup_note(e2e: dict) -> str:
    """"; untimed warm-up: K calls, S s before" for the end-to-end heading ("" without one)."""
    w = e2e.get("warmup") or {}
    if not w.get("calls"):
        return ""
    return f"; untimed warm-up first: {w['calls']} calls, {float(w.get('seconds') or 0.0):.1f} s"


def end_to_end_rows(summary: dict) -> list[list[str]]:
    """Formatted rows (see `E2E_COLUMNS`) of the summary's `end_to_end`, one per arm; [] without it."""
    per_arm = (summary.get("end_to_end") or {}).get("per_arm") or {}
    return [[arm, str(e.get("samples", 0)), str(e.get("tokens", 0)), _num(e.get("total_s"), 3),
             _num(e.get("ms_per_token"), 3), _num(e.get("generation_ms_per_token"), 3), _num(e.get("ms_per_sample"), 2),
             _pct(e.get("host_fraction")), _num(e.get("speedup_end_to_end"), 3), _num(e.get("generation_speedup"), 3),
             _num(e.get("prefill_ms_per_call"), 2), _num(e.get("decode_ms_per_step"), 3),
             _num(e.get("eager_steps_per_call"), 2), _count(e.get("graph_captures")), _count(e.get("prefill_replays")),
             _num(e.get("score_ms_per_sample"), 2), _pct(e.get("analysis_fraction"))] for arm, e in per_arm.items()]


def _count(v) -> str:
    """An integer count, "-" where a summary written before the field existed has none."""
    return "-" if v is None else str(int(v))


def end_to_end_lines(summary: dict) -> list[str]:
    """The terminal's end-to-end lines: a heading, then one line per arm."""
    e2e = summary.get("end_to_end")
    if not e2e:
        return []
    lines = [f"\nend to end ({e2e_where(e2e)}; {E2E_SCOPE}; resumed records not timed{warmup_note(e2e)}):"]
    width = max((len(a) for a in e2e.get("per_arm", {})), default=0)
    for arm, e in e2e.get("per_arm", {}).items():
        n = e.get("samples", 0)
        if not n:
            lines.append(f"  {arm:<{width}}  - ms/token end to end (0 samples timed)")
            continue
        speedup = "" if arm == e2e.get("baseline") else _speedup_words(e)
        lines.append(f"  {arm:<{width}}  {_num(e.get('ms_per_token'), 3)} ms/token end to end (generation "
                     f"{_num(e.get('generation_ms_per_token'), 3)}: prefill {_num(e.get('prefill_ms_per_call'), 1)} "
                     f"ms/call, decode {_num(e.get('decode_ms_per_step'), 3)} ms/step; host "
                     f"{_pct(e.get('host_fraction'), 0)}%), {_num(e.get('ms_per_sample'), 2)} ms/sample{speedup}, "
                     f"scoring "
                     f"{_num(e.get('score_ms_per_sample'), 2)} ms/sample apart, {n} samples, "
                     f"{e.get('tokens', 0)} tokens timed")
    return lines


def _speedup_words(e: dict) -> str:
    """", speedup x end to end (y generation)" for an arm's end-to-end line; "" without speedups."""
    s_e2e, s_gen = e.get("speedup_end_to_end"), e.get("generation_speedup")
    if s_e2e is None or s_e2e != s_e2e:  # None as read back, NaN in memory: different samples, no baseline
        return ""
    return f", speedup {_num(s_e2e, 3)} end to end ({_num(s_gen, 3)} generation)"


ENGINE_COLUMNS = ["arm", "kernels", "attention", "linear", "compile", "graphs", "exact", "verify", "graph fallback",
                  "varied between calls"]


def _engine_cells(e: dict) -> list[str]:
    """One arm's engine settings (summary.json's `engine[arm]`) as `ENGINE_COLUMNS[1:]` cells."""
    exact = f"{e.get('exact_impl')} (width {e.get('exact_block_size')})" if e.get("exact") else "off"
    verify = e.get("verify", "chain") + (f" {e.get('tree_budget')} nodes" if e.get("verify") == "tree" else "")
    linear = "exact mode's own" if e.get("exact") else str(e.get("linear_impl"))
    return [str(e.get("kernel_impl")), str(e.get("attention_impl")), linear, str(e.get("compile_level") or "off"),
            "on" if e.get("graphs") else "off", exact, verify, str(e.get("graph_error") or "-"),
            ", ".join(e.get("varied") or []) or "-"]


def engine_rows(summary: dict) -> list[list[str]]:
    """Rows (see `ENGINE_COLUMNS`) of the summary's `engine`: per arm, what its calls ran under."""
    return [[arm, *_engine_cells(e)] for arm, e in (summary.get("engine") or {}).items()]


def engine_lines(summary: dict) -> list[str]:
    """The terminal's engine line: the settings every arm shared (verify policies are in their own
    table), or one line per arm where they differ; [] without the runner's `engine`."""
    rows = [dict(zip(ENGINE_COLUMNS, r)) for r in engine_rows(summary)]
    if not rows:
        return []

    def words(c: dict, keys: list[str]) -> str:
        notes = [f"{label}: {c[key]}" for key, label in (("graph fallback", "graph path fell back"),
                                                         ("varied between calls", "varied between calls"))
                 if c[key] != "-"]
        return ", ".join(f"{k} {c[k]}" for k in keys) + "".join(f"; {n}" for n in notes)

    shared = ENGINE_COLUMNS[1:7]  # kernels .. exact
    if len({tuple(v for k, v in c.items() if k not in ("arm", "verify")) for c in rows}) == 1:
        return [f"\nengine (every arm): {words(rows[0], shared)}"]
    width = max(len(c["arm"]) for c in rows)
    return ["\nengine per arm:"] + [f"  {c['arm']:<{width}}  {words(c, [*shared, 'verify'])}" for c in rows]


def note_engine(engine: dict, label: str, settings, graph_error: str | None) -> None:
    """Add one call of arm `label` to `engine` (summary.json's `engine`, arm -> record): the call's
    resolved settings (`SpeculativeOutput.settings`, an `EngineSettings`; None adds nothing) and
    why its graph path fell back to the eager loop, if it did. The arm's first call sets its
    record; a setting a later call resolved otherwise is named in the record's `varied` list, and
    the first fallback reason is kept."""
    if settings is None:
        return
    ran = dataclasses.asdict(settings)
    seen = engine.setdefault(label, {**ran, "graph_error": None, "varied": []})
    seen["varied"] += [k for k, v in ran.items() if seen[k] != v and k not in seen["varied"]]
    seen["graph_error"] = seen["graph_error"] or graph_error
