"""The command-line contract of every command of this package (`moe-embed SUBCOMMAND`, `python
convert/<tool>.py`, `python -m moe_embed.training.train`, ...).

- Bad input ends the run with one line on stderr and exit code 2, never a traceback: code raises
  `UsageError` where the user's input (arguments, files, data, configs) is wrong, and the entry point
  `run_cli(main)` also turns an `OSError` (unwritable output, full disk, missing file) into that line.
  Anything else is a bug and keeps its traceback.
- Quiet by default: this package's own progress lines and every library's warnings; the libraries'
  informational logs (and the progress bars sentence-transformers shows at that level) only with
  `--verbose`, which every command's parser (`command_parser`) offers.
"""

from __future__ import annotations

import argparse
import difflib
import logging
import os
import re
import sys
import types
import typing
from collections.abc import Callable
from dataclasses import MISSING, Field, field, fields
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

# the loggers of this package's tools: informational by default, the libraries' only with --verbose
OWN_LOGGERS = ("moe_embed", "experiments", "benchmarks")
# warnings the libraries give on every run, whatever the input, shown only with --verbose: sentence-transformers
# announces the default prompt of a folder that has one (a one-task export) each time it is loaded, and
# onnxruntime's quantiser advises pre-processing on every call
ROUTINE_WARNINGS = ("Default prompt name is set to", "Please consider to run pre-processing before quantization")


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """`--help` of every command: the description as written, and each option's default appended once,
    only where its help text does not already state one and there is a value to state."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if "default" in text or default in (None, False, argparse.SUPPRESS) or not action.option_strings:
            return text
        if isinstance(default, dict):  # NAME=VALUE pairs, as they are typed
            default = [f"{key}={value}" for key, value in default.items()]
        return f"{text} (default: {' '.join(map(str, default)) if isinstance(default, list) else default})"


class UsageError(Exception):
    """Bad input to a command: reported as `error: <message>` on stderr with exit code 2."""


def command_parser(description: str | None, prog: str | None = None, **kwargs) -> argparse.ArgumentParser:
    """An `ArgumentParser` with this package's help format and the `--verbose` option every command has.

    `description` is the module docstring; `prog` names the command as the user typed it
    (`moe-embed upcycle`), default the script's name."""
    parser = argparse.ArgumentParser(prog=prog, description=description, formatter_class=HelpFormatter, **kwargs)
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="also show the libraries' informational logs and progress bars"
    )
    return parser


def option(default=None, *, help: str, required: bool = False, default_factory=MISSING, **argparse_kwargs) -> Field:
    """A field of a command's options dataclass that is also its command-line option: `help` is the option's help
    text, `--field-name` its flag; `required=True` gives the field no default (a positional argument with
    `positional=True`, else a required flag); `group` (an argument group's title), `choices`, `type`, `metavar`
    and `nargs` shape the option where the field's annotation and default do not say enough; `renamed_from`
    is the field's former name, which the command line and mappings refuse naming the new one.
    `options_parser` builds the parser from these fields, so each option is declared once."""
    metadata = {"help": help, **argparse_kwargs}
    if required:
        return field(metadata=metadata)
    if default_factory is not MISSING:
        return field(default_factory=default_factory, metadata=metadata)
    return field(default=default, metadata=metadata)


def _field_default(spec: Field):
    if spec.default is not MISSING:
        return spec.default
    return spec.default_factory() if spec.default_factory is not MISSING else MISSING


def _argument_type(annotation) -> type:
    """int, float, bool or str, from a field's annotation (a string under `from __future__ import annotations`):
    the first of them it names; a list or Path travels as the string the dataclass parses."""
    text = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", str(annotation))
    for kind in ("bool", "int", "float"):
        if re.match(rf"^{kind}\b", text.strip()):
            return {"bool": bool, "int": int, "float": float}[kind]
    return str


def options_parser(options: type, description: str | None, prog: str | None = None) -> argparse.ArgumentParser:
    """The command line of the options dataclass `options`: one argument per field declared with `option()`, in
    field order, with its help, default (the field's), type (from its annotation) and choices; a field without a
    default is required (positional with `positional=True`, else a required `--flag`)."""
    parser = command_parser(description, prog)
    groups: dict[str, argparse._ArgumentGroup] = {}
    every = fields(options)
    for spec in [f for f in every if not f.kw_only] + [f for f in every if f.kw_only]:  # a base's shared ones last
        if "help" not in spec.metadata:
            continue
        meta = spec.metadata
        kwargs = {key: meta[key] for key in ("help", "choices", "metavar", "nargs", "type") if key in meta}
        positional, group = meta.get("positional", False), meta.get("group")
        target = parser if group is None else groups.setdefault(group, parser.add_argument_group(group))
        default = _field_default(spec)
        kind = kwargs.pop("type", None) or _argument_type(spec.type)
        if kind is bool:
            kwargs["action"] = "store_true"
        else:
            kwargs["type"] = kind
        if positional:
            names = [spec.name]
            if default is not MISSING:
                kwargs.update(nargs="?", default=default)
        else:
            names = [f"--{spec.name.replace('_', '-')}"]
            kwargs["dest"] = spec.name
            if default is MISSING:
                kwargs["required"] = True
            elif kind is not bool:
                kwargs["default"] = default
        target.add_argument(*names, **kwargs)
        if "renamed_from" in meta:
            new = names[0]
            parser.add_argument(
                f"--{meta['renamed_from'].replace('_', '-')}",
                nargs="?",
                help=argparse.SUPPRESS,
                default=argparse.SUPPRESS,
                action=_Renamed,
                new=new,
            )
    return parser


def renamed_message(old: str, new: str) -> str:
    """What a former option name says, on the command line and in a mapping alike."""
    return f"{old} is now {new} (the model config's name)"


class _Renamed(argparse.Action):
    """A former flag: an error naming the flag that replaced it."""

    def __init__(self, *args, new: str, **kwargs):
        super().__init__(*args, **kwargs)
        self.new = new

    def __call__(self, parser, namespace, values, option_string=None):
        parser.error(renamed_message(option_string, self.new))


def parse_options(options: type[T], argv: list[str] | None, description: str | None, prog: str | None = None) -> T:
    """`options` from the command line `argv` (`options_parser`), with the logging `--verbose` asks for."""
    values = vars(parse(options_parser(options, description, prog), argv))
    values.pop("verbose")
    return options(**values)


def type_name(kind) -> str:
    if isinstance(kind, type):
        return kind.__name__
    return str(kind).replace("typing.", "")


def _convert(value, kind, where: str):
    """`value` checked against the annotation `kind` (YAML scalars, lists, dicts, nested dataclasses)."""
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        kinds = [a for a in args if a is not type(None)]
        for inner in kinds:  # the first that takes the value
            try:
                return _convert(value, inner, where)
            except UsageError as error:
                if len(kinds) == 1:
                    raise error from None
        raise UsageError(f"{where} must be a {' or a '.join(type_name(k) for k in kinds)}, got {value!r}")
    if isinstance(kind, type) and hasattr(kind, "__dataclass_fields__"):
        return from_mapping(kind, value, where)
    if origin is list:
        if not isinstance(value, list):
            raise UsageError(f"{where} must be a list, got {value!r}")
        return [_convert(item, args[0], f"{where}[{i}]") for i, item in enumerate(value)]
    if origin is dict or kind is dict:
        if not isinstance(value, dict):
            raise UsageError(f"{where} must be a mapping, got {value!r}")
        if not args:
            return dict(value)
        return {_convert(k, args[0], where): _convert(v, args[1], f"{where}.{k}") for k, v in value.items()}
    if kind is bool:
        if not isinstance(value, bool):
            raise UsageError(f"{where} must be true or false, got {value!r}")
        return value
    if kind is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise UsageError(f"{where} must be an integer, got {value!r}")
        return value
    if kind is float:
        # YAML 1.1 reads `2e-5` (no dot) as a string: accept any text that is a number.
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise UsageError(f"{where} must be a number, got {value!r}")
        return float(value)
    if kind is Path:
        if not isinstance(value, (str, os.PathLike)):
            raise UsageError(f"{where} must be a path, got {value!r}")
        return value
    if kind is str:
        if not isinstance(value, str):
            raise UsageError(f"{where} must be a string, got {value!r}")
        return value
    raise TypeError(f"unsupported config annotation {type_name(kind)} at {where}")


def from_mapping(cls, data, where: str = "config"):
    """Build the options dataclass `cls` from a mapping (a YAML file, a section of one): unknown keys, missing
    required keys and values of the wrong type are `UsageError`s naming the key; a key the field was renamed
    from (`option(renamed_from=...)`) names the new one. The one loader of every mapping of options (training's
    YAML and its `upcycle:` / `adapter:` sections, which are `UpcycleOptions`)."""
    if not isinstance(data, dict):
        raise UsageError(f"{where} must be a mapping of {cls.__name__} options, got {data!r}")
    hints = typing.get_type_hints(cls)
    known = {f.name: f for f in fields(cls)}
    renamed = {f.metadata["renamed_from"]: name for name, f in known.items() if "renamed_from" in f.metadata}
    for key in data:
        if key in renamed:
            raise UsageError(f"{where}: {renamed_message(repr(key), repr(renamed[key]))}")
        if key not in known:
            close = difflib.get_close_matches(str(key), known, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise UsageError(f"unknown key {key!r} in {where}{hint} Valid keys: {', '.join(known)}")
    missing = [
        name for name, f in known.items() if name not in data and f.default is MISSING and f.default_factory is MISSING
    ]
    if missing:
        raise UsageError(f"{where} must define {', '.join(f'`{m}`' for m in missing)}")
    values = {
        key: _convert(value, hints[key], f"{where}.{key}" if where != "config" else key) for key, value in data.items()
    }
    return cls(**values)


def shard_size(value: str) -> str:
    """argparse type of `--max-shard-size`: an integer and a unit, as `save_pretrained` reads it (`2GB`,
    `500MB`, `1GiB`; lower-case `b` counts bits)."""
    if not re.fullmatch(r"\d+(?:[KMG]i[Bb]|[KMG][Bb])", value, flags=re.IGNORECASE):
        raise argparse.ArgumentTypeError(f"expected a size such as 2GB, 500MB or 1GiB, got {value!r}")
    return value


def parse(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """`parser.parse_args(argv)`, then the logging `--verbose` asks for."""
    args = parser.parse_args(argv)
    if getattr(args, "verbose", False):
        set_verbosity(verbose=True)
    return args


_BARS_HIDDEN = False  # whether the quiet mode set HF_HUB_DISABLE_PROGRESS_BARS (and may take it back)


class _Stderr(logging.StreamHandler):
    """A handler writing to the `sys.stderr` of each record's time (a caller, a test's capture, may replace the
    stream after logging was set up, and close the old one)."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value):  # logging.StreamHandler.__init__ sets it; the property always answers sys.stderr
        pass


class _Quiet(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(ROUTINE_WARNINGS)


class _NotPrintedYet(logging.Filter):
    """Drops a record that a handler of its own library already printed (huggingface_hub's logger has one and
    also passes its records up to the root): every line once."""

    def filter(self, record: logging.LogRecord) -> bool:
        logger = logging.getLogger(record.name)
        while logger is not None and logger is not logging.root:
            if logger.handlers:
                return False
            logger = logger.parent
        return True


class _Format(logging.Formatter):
    """This package's informational lines as they are; warnings and errors with their level and source."""

    def format(self, record: logging.LogRecord) -> str:
        if record.levelno <= logging.INFO and record.name.split(".")[0] in OWN_LOGGERS:
            return record.getMessage()
        return f"{record.levelname.lower()} ({record.name}): {record.getMessage()}"


def is_verbose() -> bool:
    """Whether `set_verbosity` made the command verbose (`--verbose`: the root logger at INFO)."""
    return logging.getLogger().getEffectiveLevel() <= logging.INFO


def set_verbosity(verbose: bool = False) -> None:
    """Quiet (this package's informational lines, every warning but the routine ones) or verbose (every
    library's informational lines too) logging on stderr. Quiet also hides the progress bars of transformers
    and the Hub (loading and writing a local folder take a second); call it before they are imported. Long steps
    keep theirs: training, calibration, a model fetched from the Hub (`moe_embed.folders.locate`)."""
    root = logging.getLogger()
    handler = next((h for h in root.handlers if getattr(h, "_moe_embed", False)), None)
    if handler is None:
        handler = _Stderr()
        handler._moe_embed = True
        handler.setFormatter(_Format())
        root.addHandler(handler)
    handler.filters = [_NotPrintedYet()] if verbose else [_NotPrintedYet(), _Quiet()]
    root.setLevel(logging.INFO if verbose else logging.WARNING)
    for name in OWN_LOGGERS:
        logging.getLogger(name).setLevel(logging.DEBUG if verbose else logging.INFO)
    global _BARS_HIDDEN
    if not verbose and "HF_HUB_DISABLE_PROGRESS_BARS" not in os.environ:
        os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
        _BARS_HIDDEN = True
    elif verbose and _BARS_HIDDEN:
        os.environ.pop("HF_HUB_DISABLE_PROGRESS_BARS", None)
        _BARS_HIDDEN = False


def offline_without_hub(argv: list[str] | None = None, timeout: float = 2.0) -> bool:
    """Set `HF_HUB_OFFLINE=1` for this process when the Hugging Face Hub (`HF_ENDPOINT`, default huggingface.co)
    cannot be reached, before any Hugging Face library is imported: they would otherwise retry it with backoff
    (about half a minute) before they fall back to local files. One TCP connection, `timeout` seconds at most;
    skipped when `HF_HUB_OFFLINE` is set either way or the command only asks for `--help`. Returns whether it
    switched to offline, which it says in one line."""
    import socket
    from urllib.parse import urlsplit

    argv = sys.argv[1:] if argv is None else argv
    if "HF_HUB_OFFLINE" in os.environ or {"-h", "--help"} & set(argv):
        return False
    endpoint = urlsplit(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    port = endpoint.port or (443 if endpoint.scheme == "https" else 80)
    try:
        socket.create_connection((endpoint.hostname, port), timeout=timeout).close()
        return False
    except OSError:
        os.environ["HF_HUB_OFFLINE"] = "1"
        print(f"{endpoint.hostname} cannot be reached: working offline (local folders and the cache)", file=sys.stderr)
        return True


def run_cli(main: Callable[[list[str] | None], T], argv: list[str] | None = None) -> T:
    """Call `main(argv)` with quiet logging set up, offline at once where the Hub cannot be reached
    (`offline_without_hub`); `UsageError` and `OSError` become one stderr line and exit 2."""
    set_verbosity(verbose=False)
    offline_without_hub(argv)
    try:
        return main(argv)
    except UsageError as error:
        print(f"error: {error}", file=sys.stderr)
        raise SystemExit(2) from None
    except OSError as error:  # the user's environment, not a bug
        print(f"error: {error.strerror or error}: {error.filename or ''}".rstrip(": "), file=sys.stderr)
        raise SystemExit(2) from None


__all__ = [
    "HelpFormatter",
    "UsageError",
    "command_parser",
    "from_mapping",
    "is_verbose",
    "option",
    "options_parser",
    "parse",
    "parse_options",
    "run_cli",
    "set_verbosity",
    "shard_size",
    "type_name",
]
