"""Regenerate training responses with the target (spec 3.1).

    python train/regenerate.py target=qwen3-8b data=gsm8k-train output_dir=DIR
    python train/regenerate.py target=smollm2-135m data=gsm8k-train data.limit=64 output_dir=DIR
    python train/regenerate.py ... output_dir=DIR resume=true        # continue an interrupted run
    python train/regenerate.py data=jsonl data.path=convs.jsonl ...   # any local JSONL of conversations
    python train/regenerate.py data=hub data.path=<hub dataset> data.split=train data.messages_field=messages

Writes `DIR/regenerated.jsonl` (see `dflash2.training.regenerate`) and DIR/.hydra/config.yaml;
pass the JSONL to training as `data.regenerated=DIR/regenerated.jsonl`. Every config value is
checked first: a refused run writes nothing and exits with status 2 after one `error: ...`
line (`DFLASH2_DEBUG=1` adds the traceback; see `dflash2.entrypoint`).
"""

from pathlib import Path

import hydra

from dflash2.entrypoint import run_entry, user_errors
from dflash2.training.regenerate import register_regenerate_schema

register_regenerate_schema()


def checked(cfg):
    """The `RegenerateConfig` of `cfg` after every check (raises `ConfigError`); touches no file."""
    from dflash2.entrypoint import checked_object
    from dflash2.runconfig import check_shared_specs
    from dflash2.training.config import check_data_spec

    return checked_object(cfg, check_shared_specs, lambda obj: check_data_spec(obj.data))


@hydra.main(config_path="../configs/distill", config_name="regenerate", version_base=None)
@user_errors
def main(cfg) -> None:
    from dflash2.entrypoint import resume_note, write_run_config
    from dflash2.runconfig import prepare_output_dir
    from dflash2.training.regenerate import run_regenerate

    obj = checked(cfg)
    if obj.resume:
        print(resume_note("regenerate", obj.output_dir, ("regenerated.jsonl",)), flush=True)
    write_run_config(prepare_output_dir(obj.output_dir, obj.resume, job_name="regenerate"), cfg, job_name="regenerate")
    run_regenerate(obj)


if __name__ == "__main__":
    run_entry(main, config_dir=Path(__file__).resolve().parent.parent / "configs/distill", config_name="regenerate",
              check=checked)
