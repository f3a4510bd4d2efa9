"""Evaluation, in three rooms (each imports only the rooms listed after it):

- `running/`: one evaluation run: its config, datasets, the runner and its chunks, scoring and
  the code sandbox, sharding over processes, end-to-end timing, lm-eval's model API, rescoring;
- `analysis/`: what is computed from records afterwards: the `Record` type and its JSONL files,
  statistics, the cost model, cross-run comparison, reports and W&B;
- `arms/`: the arm kinds (a registry: one module per kind) and the proposers they run.

Modules are imported on first use (`dflash2.evaluation.analysis.stats`, ...), so importing a
room stays light: `eval/report.py` needs no torch model code, the sandbox needs no torch.
"""
