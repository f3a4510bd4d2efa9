"""What the entry points (`train/distill.py`, `train/regenerate.py`, `eval/run.py`) share:
the user-error rule, the unknown-key check, and the run directory's recorded config.

The contract a user sees:

    checks first     every config value is checked (schema types by Hydra, unknown keys by
                     `check_known_keys`, ranges by each schema's checks) before any work; the
                     checks run inside `config_checks()`, which turns their `ValueError`s into
                     `ConfigError`s
    refused = clean  a run refused by a check writes nothing anywhere: the primary configs set
                     `hydra.output_subdir: null`, `hydra.run.dir: .` and `hydra/job_logging:
                     stdout`, so Hydra creates no directory and no file; the entry point writes
                     `DIR/.hydra/config.yaml` and `overrides.yaml` itself (`write_run_config`),
                     after the checks pass, and never over the copy of a run that left results;
                     the checks include what configs and checkpoint metadata can tell before
                     any weight loads (`dflash2.preflight`); under
                     `-m`, `preflight_multirun` checks every point of the sweep before Hydra
                     creates the sweep directory
    one line         a user error prints `error: <message>` on stderr and exits with status 2
                     (no Hydra banner, no traceback); `DFLASH2_DEBUG=1` also prints the full
                     traceback. A post-run check that failed (`CheckFailed`, raised after the
                     run's outputs are written) prints one `error:` line too and exits with
                     status 3. Other exceptions (bugs) keep Python's traceback and status 1.

`run_entry(main)` applies the last rule around a `@hydra.main` function, `user_errors` inside it.
"""

from __future__ import annotations

import contextlib
import difflib
import functools
import os
import re
import sys
import traceback
from collections.abc import Callable, Iterator
from dataclasses import fields, is_dataclass
from pathlib import Path

DEBUG_ENV = "DFLASH2_DEBUG"
USER_ERROR_STATUS = 2
CHECK_FAILED_STATUS = 3


class UserError(Exception):
    """A problem the user can fix (a config value, an occupied output_dir, a missing file): the
    entry points print its message as one line and exit with status 2."""


class ConfigError(UserError, ValueError):
    """A config value failed a check; the message names the key, the value and the fix."""


class CheckFailed(Exception):
    """A check on a finished run's results failed (e.g. `eval/run.py`'s `checks.*`). Raised after
    every output is written; the entry points print its message as one line and exit with
    status 3, so a script can tell it from a refused run (2) and a crash (1)."""


@contextlib.contextmanager
def config_checks() -> Iterator[None]:
    """Run config checks: a `ValueError` raised inside becomes a `ConfigError` with the same
    message (the checks of the schemas raise plain `ValueError`s); OmegaConf's own errors pass
    through untouched (`user_message` names their full key)."""
    from omegaconf.errors import OmegaConfBaseException

    try:
        yield
    except (UserError, OmegaConfBaseException):
        raise
    except ValueError as e:
        raise ConfigError(str(e)) from e


def unknown_keys(cfg, prefix: str = "") -> list[tuple[str, list[str]]]:
    """Keys of a composed config that its structured schema does not declare.

    Hydra's `+key=value` adds a key even to a structured (typed) node, and `OmegaConf.to_object`
    then silently carries it as an unused attribute; this walks the DictConfig and reports each
    such key. Returns `[(dotted key, the node's declared field names)]`; nodes typed as plain
    dicts (free-form by design) are not checked.
    """
    from omegaconf import DictConfig, OmegaConf

    found: list[tuple[str, list[str]]] = []
    if not isinstance(cfg, DictConfig):
        return found
    schema = OmegaConf.get_type(cfg)
    declared = [f.name for f in fields(schema)] if schema is not None and is_dataclass(schema) else None
    for key in cfg.keys():
        name = f"{prefix}{key}"
        if declared is not None and key not in declared:
            found.append((name, declared))
            continue
        child = cfg._get_node(key)
        if isinstance(child, DictConfig) and not child._is_none() and not child._is_missing():
            found.extend(unknown_keys(child, f"{name}."))
    return found


def check_known_keys(cfg) -> None:
    """Raise `ConfigError` for the first key the schema does not declare (e.g. `+train.lrr=1`),
    suggesting the closest declared key."""
    bad = unknown_keys(cfg)
    if not bad:
        return
    name, declared = bad[0]
    hint = _did_you_mean(name, name.rsplit(".", 1)[-1], declared)
    more = f" (and {len(bad) - 1} more: {', '.join(k for k, _ in bad[1:4])})" if len(bad) > 1 else ""
    raise ConfigError(f"{name}: unknown key, the schema declares no such field{hint}{more}")


def checked_object(cfg, *checks: Callable[[object], object]):
    """The typed config object of `cfg` (a DictConfig or the dataclass itself) after every check,
    touching no file: the unknown-key check, then each of `checks` on the object, then the
    hardware group's device. Raises `ConfigError` naming the first bad key or value."""
    from omegaconf import DictConfig, OmegaConf

    from dflash2.runconfig import resolve_device

    with config_checks():
        check_known_keys(cfg)
        obj = OmegaConf.to_object(cfg) if isinstance(cfg, DictConfig) else cfg
        for check in checks:
            check(obj)
        resolve_device(obj.hardware)   # e.g. hardware.device=cuda on a machine without CUDA
    return obj


def _did_you_mean(name: str, leaf: str, declared: list[str]) -> str:
    """"; did you mean <name with its last part `leaf` replaced by the closest declared field>?",
    or "" when no declared field is close."""
    close = difflib.get_close_matches(leaf, declared, n=1)
    return f"; did you mean {name[: len(name) - len(leaf)]}{close[0]}?" if close else ""


def write_run_config(out_dir: str | os.PathLike, cfg, *, job_name: str | None = None) -> Path | None:
    """Record the resolved config (`DIR/.hydra/config.yaml`) and the command-line overrides
    (`DIR/.hydra/overrides.yaml`, when launched through Hydra). Call it after every check passed.

    An existing `config.yaml` is kept while the directory holds an earlier run's results (a
    resumed run does not rewrite the record of the run it continues); one beside no results (a run
    that failed before any work, `runconfig.run_results`) is replaced, so a corrected rerun records
    its own config. Each file is written to a temporary name and renamed. Returns the config path,
    or None when the existing one was kept.
    """
    from omegaconf import DictConfig, OmegaConf

    from dflash2.runconfig import run_results

    hydra_dir = Path(out_dir) / ".hydra"
    path = hydra_dir / "config.yaml"
    if path.exists() and run_results(out_dir, job_name=job_name):
        return None
    hydra_dir.mkdir(parents=True, exist_ok=True)
    node = cfg if isinstance(cfg, DictConfig) else OmegaConf.structured(cfg)
    files = {}
    overrides = _hydra_overrides()
    if overrides is not None:
        files["overrides.yaml"] = OmegaConf.to_yaml(OmegaConf.create(overrides))
    files["config.yaml"] = OmegaConf.to_yaml(node, resolve=True)   # last: its presence means "recorded"
    for name, text in files.items():
        tmp = hydra_dir / f".{name}.tmp"
        tmp.write_text(text)
        tmp.replace(hydra_dir / name)
    return path


def _hydra_overrides() -> list[str] | None:
    try:
        from hydra.core.hydra_config import HydraConfig
    except ImportError:
        return None
    if not HydraConfig.initialized():
        return None
    return list(HydraConfig.get().overrides.task)


def is_main_process() -> bool:
    """Whether this is process 0 of a launch (`accelerate launch` / torchrun set RANK)."""
    return int(os.environ.get("RANK", "0")) == 0


# ------------------------------------------------------------------------------ the one line

_HYDRA_NOISE = re.compile(r"^\s*(full_key|reference_type|object_type|object_type=|To append to your config)")


def user_message(exc: BaseException) -> str | None:
    """The one-line message of a user error, or None for any other exception (a bug).

    User errors: `UserError`; Hydra's composition and override errors and OmegaConf's
    validation errors (named by their full key, without Hydra's `+key` hint, which the
    unknown-key check refuses anyway); `FileNotFoundError` / `FileExistsError` /
    `PermissionError` (a training run that diverged raises a `UserError`).
    """
    from omegaconf.errors import OmegaConfBaseException

    try:
        from hydra.errors import HydraException
    except ImportError:   # pragma: no cover - hydra is a dependency
        HydraException = ()  # type: ignore[assignment]
    if isinstance(exc, (UserError, FileNotFoundError, FileExistsError, PermissionError)):
        return _one_line(str(exc))
    if isinstance(exc, OmegaConfBaseException):
        return _omegaconf_line(exc)
    if isinstance(exc, HydraException):
        cause = exc.__cause__ or exc.__context__
        if isinstance(cause, OmegaConfBaseException):
            return _omegaconf_line(cause)
        return _one_line(str(exc))
    return None


def _omegaconf_line(exc) -> str:
    key = getattr(exc, "full_key", None)
    text = _one_line(str(exc))
    m = re.match(r"Key '([^']+)' not in '([^']+)'", text)
    if m:
        schema = getattr(exc, "object_type", None)
        declared = [f.name for f in fields(schema)] if schema is not None and is_dataclass(schema) else []
        text = f"unknown key ({m.group(2)} declares no field {m.group(1)!r})"
        if key:
            text += _did_you_mean(key, m.group(1), declared)
    return f"{key}: {text}" if key else text


def _one_line(text: str) -> str:
    """`text` on one line: Hydra's key details and config search path dropped, a list after a
    line ending in `:` joined with commas."""
    out: list[str] = []
    listing = False
    for ln in text.splitlines():
        ln = ln.strip()
        if ln.startswith("Config search path"):
            break
        if not ln or _HYDRA_NOISE.match(ln):
            continue
        if listing:
            out[-1] += (" " if out[-1].endswith(":") else ", ") + ln
        else:
            out.append(ln)
        listing = ln.endswith(":") or listing
    return "; ".join(out) if out else text.strip()


def _refuse(exc: BaseException) -> None:
    """Exit with the one-line rule if `exc` is a user error or a failed check; return (for the
    caller to re-raise) if not."""
    message = _one_line(str(exc)) if isinstance(exc, CheckFailed) else user_message(exc)
    if message is None:
        return
    if os.environ.get(DEBUG_ENV, "").strip().lower() not in ("", "0", "false", "no"):
        traceback.print_exception(exc)
    sys.stdout.flush()
    sys.stderr.write(f"error: {message}\n")
    sys.stderr.flush()
    raise SystemExit(CHECK_FAILED_STATUS if isinstance(exc, CheckFailed) else USER_ERROR_STATUS) from None


def user_errors(fn: Callable) -> Callable:
    """Decorate an entry point's task function (under `@hydra.main`): a user error raised inside
    exits at once by the one-line rule, before Hydra can print its `Error executing job` banner."""

    @functools.wraps(fn)
    def task(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - a bug is re-raised untouched
            _refuse(exc)
            raise

    return task


def sweep_points(overrides: list[str]) -> list[list[str]]:
    """The override lists of every point of a Hydra sweep (`a=1,2 b=x,y` -> four lists), as
    Hydra's basic sweeper expands them; `hydra.`/`hydra/` overrides are left out (they configure
    the launch, not the job)."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper  # the expansion Hydra runs
    from hydra.core.override_parser.overrides_parser import OverridesParser

    job = [o for o in overrides if not o.lstrip("+~").startswith(("hydra.", "hydra/"))]
    parsed = OverridesParser.create().parse_overrides(job)
    return [point for batch in BasicSweeper.split_arguments(parsed, None) for point in batch]


def preflight_multirun(argv: list[str], config_dir: str | os.PathLike, config_name: str,
                       check: Callable[[object], object]) -> None:
    """Before a `-m` launch: compose every point of the sweep and run `check` on it, and refuse a
    sweep directory (`output_dir`) that already holds a run unless `resume=true`. Hydra creates
    the sweep directory and writes its `multirun.yaml` before any job starts, so without this a
    refused sweep would leave files behind, and a sweep into an existing run's directory would
    write into it. Raises `ConfigError` / `UserError`; touches no file. A no-op without `-m`."""
    if not any(a in ("-m", "--multirun") for a in argv):
        return
    from hydra import compose, initialize_config_dir
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import open_dict

    overrides = [a for a in argv if not a.startswith("-")]
    try:
        points = sweep_points(overrides)
    except Exception as e:  # noqa: BLE001 - Hydra's parser errors name the bad override
        raise ConfigError(f"cannot parse the sweep: {e}") from e
    roots = set()
    with initialize_config_dir(config_dir=str(Path(config_dir).resolve()), version_base=None):
        for point in points:
            # With Hydra's own node set, so `${hydra:runtime.choices...}` interpolations resolve as in
            # the job; the node itself is not part of the job's config.
            cfg = compose(config_name=config_name, overrides=point, return_hydra_config=True)
            HydraConfig.instance().set_config(cfg)
            with open_dict(cfg):
                del cfg["hydra"]
            obj = check(cfg)
            root = Path(obj.output_dir)
            if not getattr(obj, "resume", False) and root not in roots and _holds_an_earlier_run(root):
                raise UserError(f"output_dir={root} is not empty: a sweep there would write into an earlier "
                                "run; choose a new output_dir, or pass resume=true to continue that sweep")
            roots.add(root)


def _holds_an_earlier_run(root: Path) -> bool:
    """Whether `root` holds entries of an earlier run. In a launch of several processes
    (WORLD_SIZE > 1), any process may create this launch's sweep files before another one checks,
    so every process, process 0 included, counts only entries last modified before the launcher
    started (`_launch_started`); a single process counts every entry."""
    if not root.is_dir():
        return False
    entries = list(root.iterdir())
    if not entries or int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return bool(entries)
    started = _launch_started()
    return any(e.stat().st_mtime < started for e in entries)


def _launch_started() -> float:
    """When the launcher of this process (its parent: torchrun's agent, which starts every process
    of an `accelerate launch`) was started, in seconds since the epoch."""
    import psutil  # a dependency of accelerate

    return psutil.Process().parent().create_time()


def run_entry(main: Callable[[], object], *, config_dir: str | os.PathLike | None = None,
              config_name: str | None = None, check: Callable[[object], object] | None = None) -> None:
    """Call a `@hydra.main` function under the user-error rule (see the module docstring); Hydra's
    own composition errors (a misspelt key or group option, a value of the wrong type) are
    caught here, the task's own by `user_errors`. With `config_dir`, `config_name` and `check`
    (the entry point's config checks), a `-m` sweep is checked point by point first
    (`preflight_multirun`).

    A user error prints `error: <one line>` on stderr (the traceback first when
    `DFLASH2_DEBUG=1`) and exits with status 2; `SystemExit` and other exceptions pass through.
    """
    saved = os.environ.get("HYDRA_FULL_ERROR")
    os.environ["HYDRA_FULL_ERROR"] = "1"   # Hydra re-raises instead of printing its own report
    try:
        if check is not None:
            preflight_multirun(sys.argv[1:], config_dir, config_name, check)
        main()
    except Exception as exc:  # noqa: BLE001 - a bug is re-raised untouched
        _refuse(exc)
        raise
    finally:
        if saved is None:
            os.environ.pop("HYDRA_FULL_ERROR", None)
        else:
            os.environ["HYDRA_FULL_ERROR"] = saved


def resume_note(job: str, out_dir: str | os.PathLike, patterns: tuple[str, ...]) -> str:
    """What a `resume=true` run of `job` finds in `out_dir`: the rows already in each JSONL file
    matching `patterns` (kept, not redone), or that there is nothing to resume."""
    import warnings

    from dflash2.jsonl import read_jsonl

    out = Path(out_dir)
    found = []
    for pattern in patterns:
        for path in sorted(out.glob(pattern)):
            with warnings.catch_warnings():   # a torn last line is reported when the run repairs it
                warnings.simplefilter("ignore")
                found.append(f"{len(read_jsonl(path))} rows in {path}")
    if not found:
        return f"[{job}] resume: nothing to resume in {out}: starting from the beginning"
    return f"[{job}] resume: continuing after " + ", ".join(found)
