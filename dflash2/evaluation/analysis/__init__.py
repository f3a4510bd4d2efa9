"""Computed from records: the Record type and JSONL files, statistics, cost model, comparison, reports, W&B."""
