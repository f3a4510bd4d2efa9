"""Rebuild DIR/summary.json, DIR/report.html and DIR/report.md from an existing DIR/records.jsonl
(no model, no GPU): after changing a statistic, adding a cost model's predictions, or copying
records off a GPU machine.

    python eval/report.py DIR
    python eval/report.py DIR --predictions predicted_speedup.json     # {"dflash2@N=7": 2.9, ...}
    python eval/report.py DIR --n-resamples 10000 --wandb offline       # also (re)log to W&B
    python eval/report.py --compare ROOT/eval/* --sweep ROOT/sweep/* --out ROOT/compare   # across runs
    python eval/report.py --same-tokens RUN_A RUN_B     # e.g. batch 8 vs each prompt alone, exact mode
    python eval/report.py DIR --rescore                 # score the records again here (GSM8K, HumanEval sandbox)

`--compare RUN...` (`DIR` or `NAME=DIR`, one drafter per run) writes the cross-run tables and
figures (tau per drafter with CIs, tau ratios, per-position acceptance, the N sweep, training
curves) to `--out`: `dflash2.evaluation.analysis.compare` (docs/EXPERIMENTS.md, the ablation).

`--same-tokens RUN_A RUN_B` checks that two runs generated the same tokens for every (arm,
sample) (`dflash2.evaluation.running.sharding.compare_runs` on the `tokens` field): it prints the counts and
the first differing keys, writes nothing, and exits with status 1 when they differ.

Keys of an existing summary.json that come from the run rather than the records (`checks`,
`run_id`, `prompt_format`, `end_to_end`: the runner's timing, and `engine`: the settings each arm ran
under, which the records cannot rebuild) are kept.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

KEEP = ("checks", "run_id", "prompt_format", "end_to_end", "engine")


def read_config(run_dir: Path) -> dict | None:
    """The run's config: Hydra's `.hydra/config.yaml` (unresolved), else `run.json`."""
    hydra_cfg = run_dir / ".hydra" / "config.yaml"
    if hydra_cfg.is_file():
        from omegaconf import OmegaConf

        return OmegaConf.to_container(OmegaConf.load(hydra_cfg), resolve=False)
    run_json = run_dir / "run.json"
    return json.loads(run_json.read_text()) if run_json.is_file() else None


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run_dir", type=Path, nargs="?", help="directory holding records.jsonl")
    ap.add_argument("--compare", nargs="+", metavar="RUN", help="compare these eval runs (DIR or NAME=DIR)")
    ap.add_argument("--sweep", nargs="+", default=[], metavar="RUN", help="with --compare: runs for the N sweep only")
    ap.add_argument("--train", nargs="+", default=None, metavar="DIR",
                    help="with --compare: distillation runs (default: those that wrote the compared checkpoints)")
    ap.add_argument("--out", type=Path, default=None, help="with --compare: output directory (required)")
    ap.add_argument("--n", type=int, default=None,
                    help="with --compare: N of the compared arms (default: largest common)")
    ap.add_argument("--same-tokens", nargs=2, type=Path, metavar=("RUN_A", "RUN_B"),
                    help="check that two runs generated the same tokens per (arm, sample); writes nothing")
    ap.add_argument("--n-resamples", type=int, default=2000, help="bootstrap resamples (default 2000)")
    ap.add_argument("--seed", type=int, default=0, help="bootstrap seed")
    ap.add_argument("--accuracy-margin", type=float, default=0.02, help="TOST margin on accuracy (0.02 = 2 points)")
    ap.add_argument("--logprob-margin", type=float, default=0.05, help="TOST margin on mean log-prob (nats/token)")
    ap.add_argument("--predictions", type=Path, default=None, help="JSON {arm: predicted speedup} from a cost model")
    ap.add_argument("--wandb", choices=["disabled", "offline", "online"], default="disabled",
                    help="also log to W&B (default: disabled)")
    ap.add_argument("--rescore", action="store_true",
                    help="score the records again from their text first (GSM8K check, HumanEval sandbox) and "
                         "rewrite records.jsonl: for records scored where the sandbox could not run")
    ap.add_argument("--wandb-project", default="dflash2")
    ap.add_argument("--wandb-entity", default=None)
    args = ap.parse_args(argv)
    if args.same_tokens is not None:
        return same_tokens(ap, args)
    if args.compare is not None:
        return compare(ap, args)
    if args.run_dir is None:
        ap.error("pass a run directory, or --compare RUN... --out DIR")

    from dflash2.evaluation.analysis.report import print_summary, write_report
    from dflash2.evaluation.analysis.cost import add_to_summary
    from dflash2.evaluation.analysis.records import read_run_records
    from dflash2.evaluation.analysis.stats import summarize, to_jsonable

    run_dir = args.run_dir
    records = read_run_records(run_dir)
    if args.rescore:
        from dflash2.evaluation.analysis.records import RECORDS, rewrite_records
        from dflash2.evaluation.running.rescore import rescore

        records, changed = rescore(records)
        rewrite_records(run_dir / RECORDS, records)
        print(f"rescored {len(records)} records: {changed} changed their correct field")
    summary = summarize(records, n_resamples=args.n_resamples, seed=args.seed,
                        accuracy_margin=args.accuracy_margin, logprob_margin=args.logprob_margin)
    old_path = run_dir / "summary.json"
    if old_path.is_file():
        old = json.loads(old_path.read_text())
        summary.update({k: old[k] for k in KEEP if k in old})
    # Cost model calibrated on these records (in-sample), as eval/run.py does; an explicit
    # --predictions file (e.g. an out-of-sample model) replaces its predictions in the plot.
    predictions = add_to_summary(summary, records)
    if args.predictions:
        predictions = json.loads(args.predictions.read_text())
        summary["cost_model"]["plotted_predictions"] = f"from {args.predictions}"
    old_path.write_text(json.dumps(to_jsonable(summary), indent=2))  # NaN as null
    config = read_config(run_dir)
    path = write_report(run_dir, records, summary, config=config, predictions=predictions)
    print_summary(summary)
    if args.wandb != "disabled":
        from dflash2.evaluation.analysis.wandb_log import log_run
        from dflash2.runconfig import LoggerSpec

        logger = LoggerSpec(mode=args.wandb, project=args.wandb_project, entity=args.wandb_entity)
        wandb_dir = log_run(summary, records, logger, config or {}, run_dir, predictions=predictions)
        print(f"W&B run directory: {wandb_dir}")
    print(f"summary: {old_path}\nreport:  {path}\nmarkdown: {run_dir / 'report.md'}")
    return summary


def same_tokens(ap: argparse.ArgumentParser, args: argparse.Namespace) -> dict:
    """`--same-tokens A B`: tokens equal per (arm, sample); exit status 1 when they are not."""
    if args.run_dir is not None or args.compare is not None:
        ap.error("--same-tokens takes exactly its two run directories (no positional run directory, no --compare)")
    from dflash2.evaluation.analysis.records import RECORDS
    from dflash2.evaluation.running.sharding import compare_runs

    for d in args.same_tokens:
        if not (d / RECORDS).is_file():
            ap.exit(2, f"eval/report.py --same-tokens: {d} has no {RECORDS}\n")
    res = compare_runs(*args.same_tokens, fields=("tokens",))
    def count(keys):  # compare_runs lists the first 20
        return f"{len(keys)}{'+' if len(keys) == 20 else ''}"

    print(f"{res['n_equal']} of {res['n_compared']} (arm, sample) pairs generated the same tokens, "
          f"{res['n_differing']} differ; pairs only in {args.same_tokens[0]}: {count(res['only_in_a'])}, "
          f"only in {args.same_tokens[1]}: {count(res['only_in_b'])}")
    for d in res["differing"]:
        print(f"  differs: {d['key']}")
    if not res["equal"]:
        raise SystemExit(1)
    return res


def compare(ap: argparse.ArgumentParser, args: argparse.Namespace) -> dict:
    """`--compare`: the cross-run comparison (dflash2.evaluation.analysis.compare); a bad input is one line."""
    if args.run_dir is not None or args.out is None:
        ap.error("--compare takes its runs after it and needs --out DIR (no positional run directory)")
    if args.n_resamples < 1:
        ap.error(f"--n-resamples {args.n_resamples}: use >= 1")
    from dflash2.evaluation.analysis.compare import compare_runs

    try:
        res = compare_runs(args.compare, args.out, sweeps=args.sweep, train=args.train, n=args.n,
                           n_resamples=args.n_resamples, seed=args.seed)
    except (FileNotFoundError, ValueError) as e:
        ap.exit(2, f"eval/report.py --compare: {e}\n")
    figures = ", ".join(map(str, res["figures"].values()))
    print(f"comparison: {res['markdown']}\nnumbers:    {res['json']}\nfigures:    {figures}")
    return res


if __name__ == "__main__":
    main()
