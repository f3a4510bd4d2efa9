"""One evaluation run: config, datasets, runner, scoring, sandbox, sharding, timing, lm-eval, rescoring."""
