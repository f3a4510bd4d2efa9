"""Cell formatting shared by the evaluation's reports (`report.py`, `compare.py`, `verify` tables,
the demo): numbers with CIs, p-values with their sample-size floors, percentages, Markdown tables.
Plain strings only (no plotting imports), "-" for a missing value.

Public: `fmt_value`, `fmt_ci`, `fmt_p`, `fmt_mcnemar_p`, `fmt_tost_accuracy_p`, `fmt_pct`, `fmt_number`,
`fmt_share`, `drop_empty`, `md_table`.
"""

from __future__ import annotations

from typing import Any


def fmt_value(v: Any, digits: int = 2) -> str:
    """`v` with `digits` decimals; "-" for None."""
    return "-" if v is None else f"{v:.{digits}f}"


def fmt_ci(v: Any, ci: Any, digits: int = 2) -> str:
    """"v [low, high]"; just v without a CI; "-" for None."""
    if v is None:
        return "-"
    if not ci or ci[0] is None or ci[1] is None:
        return fmt_value(v, digits)
    return f"{v:.{digits}f} [{ci[0]:.{digits}f}, {ci[1]:.{digits}f}]"


def fmt_p(v: Any) -> str:
    """A p-value: 2 significant digits, scientific below 1e-3; "-" for None."""
    if v is None:
        return "-"
    if v == 0:
        return "0"
    return f"{v:.2g}" if v >= 1e-3 else f"{v:.1e}"


def fmt_mcnemar_p(mc: dict | None) -> str:
    """A summary's McNemar result: its p, or "n too small (need >= M discordant)" when the
    discordant pairs are fewer than the test needs to reach p <= 0.05 (`stats.mcnemar_min_discordant`);
    "-" without a result."""
    if not mc:
        return "-"
    floor, d = mc.get("n_min_discordant"), mc.get("b_only_arm_correct", 0) + mc.get("c_only_ar_correct", 0)
    if floor is not None and d < floor:
        return f"n too small (need >= {floor} discordant)"
    return fmt_p(mc.get("p"))


def fmt_tost_accuracy_p(m: dict) -> str:
    """A summary block's accuracy TOST: its p, or "n too small (need >= M)" below the pairs the
    margin needs (`stats.tost_min_pairs`); "-" without a result."""
    floor, n = m.get("tost_accuracy_n_min"), m.get("n_scored_paired")
    if m.get("tost_accuracy_p") is not None and floor is not None and n is not None and n < floor:
        return f"n too small (need >= {floor})"
    return fmt_p(m.get("tost_accuracy_p"))


def fmt_pct(v: Any, ci: Any = None) -> str:
    """A fraction as percent with one decimal (and its CI in brackets); "-" for None."""
    if v is None:
        return "-"
    if ci and ci[0] is not None:
        return f"{100 * v:.1f} [{100 * ci[0]:.1f}, {100 * ci[1]:.1f}]"
    return f"{100 * v:.1f}"


def fmt_number(v: Any, digits: int) -> str:
    """`v` with `digits` decimals; "-" for None and NaN (nothing timed; NaN is null in summary.json)."""
    return "-" if v is None or v != v else f"{v:.{digits}f}"


def fmt_share(f: Any, digits: int = 1) -> str:
    """A fraction as percent; "-" for None and NaN."""
    return "-" if f is None or f != f else f"{100 * f:.{digits}f}"


def drop_empty(header: list[str], rows: list[list[str]]) -> tuple[list[str], list[list[str]]]:
    """Drop columns that are "-" in every row (e.g. no accuracy on MT-Bench, no TOST at T = 0)."""
    keep = [i for i in range(len(header)) if i == 0 or any(r[i] != "-" for r in rows)] if rows else range(len(header))
    return [header[i] for i in keep], [[r[i] for i in keep] for r in rows]


def md_table(header: list[str], rows: list[list[str]]) -> str:
    """A Markdown table; columns that are "-" in every row are dropped."""
    header, rows = drop_empty(header, rows)
    esc = lambda c: str(c).replace("|", "\\|")  # noqa: E731
    return "\n".join(["| " + " | ".join(map(esc, header)) + " |", "|" + "---|" * len(header),
                      *("| " + " | ".join(map(esc, r)) + " |" for r in rows)])
