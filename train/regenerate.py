"""Regenerate training responses with the target (spec 3.1).

    python train/regenerate.py target=qwen3-8b data=gsm8k-train output_dir=DIR
    python train/regenerate.py target=smollm2-135m data=gsm8k-train data.limit=64 output_dir=DIR
    python train/regenerate.py ... output_dir=DIR resume=true        # continue an interrupted run
    python train/regenerate.py data=jsonl data.path=convs.jsonl ...   # any local JSONL of conversations
    python train/regenerate.py data=hub data.path=<hub dataset> data.split=train data.messages_field=messages

Writes `DIR/regenerated.jsonl` (see `dflash2.training.regenerate`); pass it to training as
`data.regenerated=DIR/regenerated.jsonl`.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a fresh clone without install

import hydra  # noqa: E402

from dflash2.training.regenerate import register_regenerate_schema, run_regenerate  # noqa: E402

register_regenerate_schema()


@hydra.main(config_path="../configs/distill", config_name="regenerate", version_base=None)
def main(cfg) -> None:
    run_regenerate(cfg)


if __name__ == "__main__":
    main()
