"""Options: a command's options are one dataclass whose fields, declared with `option()`, are at once its
command-line options (`options_parser`, `parse_options`) and the keys of a mapping of them (`from_mapping`: the
training YAML and its sections). Each class's annotations are resolved once (`typing.get_type_hints`, `hints`)
and both readers convert by them: an `int` option arrives as an int, a `str | list[int]` one as the list its text
spells (`1,3`) or the word it is (`all`), a `Literal` one is checked against its values (the parser's choices),
a `bool` that defaults to true has its `--no-` form.

Every parser of the package comes from `command_parser`: abbreviations off (`--num-expert` is not taken for
another option), an argument error is one line with exit code 2 (`error: ... (see moe-embed upcycle --help)`),
and `--verbose` on every command.
"""

from __future__ import annotations

import argparse
import difflib
import functools
import os
import re
import types
import typing
from dataclasses import MISSING, Field, field, fields
from pathlib import Path
from typing import Any, Literal, TypeVar

from moe_embed.errors import UsageError
from moe_embed.logs import set_verbosity

T = TypeVar("T")


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """`--help` of every command: the description as written, and each option's default appended once,
    only where its help text does not already state one and there is a value to state (0 is one; a flag's
    `False` and a missing `None` are not)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        nothing = default is None or default is False or default is argparse.SUPPRESS
        if "default" in text or nothing or not action.option_strings:
            return text
        if isinstance(default, dict):  # NAME=VALUE pairs, as they are typed
            default = [f"{key}={value}" for key, value in default.items()]
        if isinstance(default, list):
            default = ",".join(map(str, default)) if action.nargs is None else " ".join(map(str, default))
        return f"{text} (default: {default})"


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser as every command of the package uses it: no abbreviated options, and an argument error
    as one line naming where the help is, with exit code 2 (argparse prints its whole usage first)."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        self.exit(2, f"error: {message}{self._suggestion(message)} (see {self.prog} --help)\n")

    def _suggestion(self, message: str) -> str:
        """`; did you mean --x?` for an unknown option close to one of this parser's (never a former name)."""
        if not message.startswith("unrecognized arguments: "):
            return ""
        unknown = message.split(": ", 1)[1].split()[0].split("=")[0]
        shown = [name for name, action in self._option_string_actions.items() if action.help != argparse.SUPPRESS]
        close = difflib.get_close_matches(unknown, shown, n=1)
        return f"; did you mean {close[0]}?" if close else ""


def command_parser(description: str | None, prog: str | None = None, **kwargs) -> ArgumentParser:
    """An `ArgumentParser` with this package's help format and the `--verbose` option every command has.

    `description` is the module docstring; `prog` names the command as the user typed it
    (`moe-embed upcycle`), default the script's name."""
    parser = ArgumentParser(prog=prog, description=description, **kwargs)
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="also show the libraries' informational logs and progress bars"
    )
    return parser


def option(
    default=None,
    *,
    help: str,
    required: bool = False,
    default_factory=MISSING,
    positional: bool = False,
    group: str | None = None,
    metavar: str | None = None,
    nargs: str | int | None = None,
    type: typing.Callable[[str], Any] | None = None,
    renamed_from: str | None = None,
    renamed_why: str | None = None,
) -> Field:
    """A field of an options dataclass that is also its command-line option: `help` is the option's help text,
    `--field-name` its flag, the annotation its type (a `Literal` gives its choices); `required=True` gives the
    field no default (a positional argument with `positional=True`, else a required flag); `group` is the title of
    the `--help` group it is listed in; `metavar`, `nargs` and `type` (a function reading the text) shape the
    option where the annotation does not say enough; `renamed_from` is the field's former name, which the command
    line, mappings and the class itself refuse naming the new one and why (`renamed_why`, default: the new name is
    the model config's)."""
    shape = {"positional": positional, "group": group, "metavar": metavar, "nargs": nargs, "type": type}
    metadata = {"help": help, **{key: value for key, value in shape.items() if value not in (None, False)}}
    if renamed_from is not None:
        metadata["renamed_from"] = renamed_from
    if renamed_why is not None:
        metadata["renamed_why"] = renamed_why
    if required:
        return field(metadata=metadata)
    if default_factory is not MISSING:
        return field(default_factory=default_factory, metadata=metadata)
    return field(default=default, metadata=metadata)


@functools.cache
def hints(cls: type) -> dict[str, Any]:
    """The resolved annotations of the dataclass `cls`, read once per class."""
    return typing.get_type_hints(cls)


def field_default(spec: Field):
    """The default of a dataclass field (its factory called), or `MISSING`."""
    if spec.default is not MISSING:
        return spec.default
    return spec.default_factory() if spec.default_factory is not MISSING else MISSING


def renamed_fields(cls: type) -> dict[str, str]:
    """Former name -> current name of the fields of `cls` declared with `option(renamed_from=...)`."""
    return {f.metadata["renamed_from"]: f.name for f in fields(cls) if "renamed_from" in f.metadata}


def renamed_message(old: str, new: str, why: str = "the model config's name") -> str:
    """What a former option name says, on the command line, in a mapping and in Python alike."""
    return f"{old} is now {new} ({why})"


def _members(kind) -> tuple[list, bool]:
    """The members of a union annotation but `None`, and whether `None` was one."""
    if typing.get_origin(kind) in (typing.Union, types.UnionType):
        args = typing.get_args(kind)
        return [a for a in args if a is not type(None)], type(None) in args
    return [kind], False


def type_name(kind) -> str:
    if typing.get_origin(kind) is Literal:
        return " or ".join(map(repr, typing.get_args(kind)))
    if isinstance(kind, type):
        return kind.__name__
    return str(kind).replace("typing.", "")


def _from_text(text: str, kind):
    """The command-line `text` as the annotation `kind`: a number, a path, one of a `Literal`'s values, a list
    spelt with commas (`1,3`); a union takes the first member that reads it, a string or path (any text) last."""
    members, _ = _members(kind)
    if len(members) > 1:
        texts = [m for m in members if m in (str, Path)][:1]  # they take any text: the first declared, last
        for member in [m for m in members if m not in (str, Path)] + texts:
            try:
                return _from_text(text, member)
            except ValueError:
                continue
        raise ValueError(text)
    kind = members[0]
    if typing.get_origin(kind) is list:
        items = [item.strip() for item in text.split(",") if item.strip()]
        if not items:
            raise ValueError(text)
        return [_from_text(item, typing.get_args(kind)[0]) for item in items]
    if kind in (int, float, Path, str):
        return kind(text)
    if typing.get_origin(kind) is Literal:
        if text not in typing.get_args(kind):
            raise ValueError(text)
        return text
    raise TypeError(f"no command-line reading of {type_name(kind)}")


def _describe(kind) -> str:
    members, _ = _members(kind)
    names = []
    for member in members:
        inner = typing.get_args(member)[0] if typing.get_origin(member) is list else None
        if inner in (int, float):
            names.append("comma-separated " + ("integers" if inner is int else "numbers"))
        elif inner is not None:
            names.append("comma-separated names")
        else:
            names.append({int: "an integer", float: "a number"}.get(member, type_name(member)))
    return " or ".join(names)


def _text_reader(kind, nargs) -> typing.Callable[[str], Any]:
    """argparse's `type` for a field of annotation `kind`: with `nargs` each word is one item of the list the
    annotation names."""
    if nargs is not None:
        lists = [m for m in _members(kind)[0] if typing.get_origin(m) is list]
        kind = typing.get_args(lists[0])[0] if lists else str

    def read(text: str):
        try:
            return _from_text(text, kind)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {_describe(kind)}, got {text!r}") from None

    read.__name__ = type_name(kind)  # argparse names the type in its message
    return read


def _choices(kind) -> tuple | None:
    members, _ = _members(kind)
    literals = [m for m in members if typing.get_origin(m) is Literal]
    return typing.get_args(literals[0]) if len(members) == 1 and literals else None


def _add_option(parser: argparse.ArgumentParser, target, spec: Field, kind) -> None:
    """The argparse argument of the field `spec` (resolved annotation `kind`) on `target` (the parser or a
    group)."""
    meta = spec.metadata
    kwargs = {key: meta[key] for key in ("help", "metavar", "nargs") if key in meta}
    default = field_default(spec)
    members, _ = _members(kind)
    if members == [bool]:
        kwargs["action"] = argparse.BooleanOptionalAction if default is True else "store_true"
        if default is True:
            kwargs["default"] = True
    else:
        kwargs["choices"] = _choices(kind)  # argparse checks them and lists them in its message
        reader = type(kwargs["choices"][0]) if kwargs["choices"] else _text_reader(kind, meta.get("nargs"))
        kwargs["type"] = meta.get("type") or reader
    if meta.get("positional"):
        names = [spec.name]
        if default is not MISSING:
            kwargs.update(nargs="?", default=default)
    else:
        names = [f"--{spec.name.replace('_', '-')}"]
        kwargs["dest"] = spec.name
        if default is MISSING:
            kwargs["required"] = True
        elif members != [bool]:
            kwargs["default"] = default
    target.add_argument(*names, **{key: value for key, value in kwargs.items() if value is not None})
    if "renamed_from" in meta:
        parser.add_argument(
            f"--{meta['renamed_from'].replace('_', '-')}",
            nargs="?",
            help=argparse.SUPPRESS,
            default=argparse.SUPPRESS,
            action=_Renamed,
            new=names[0],
            why=meta.get("renamed_why"),
        )


def options_parser(options: type, description: str | None, prog: str | None = None) -> ArgumentParser:
    """The command line of the options dataclass `options`: one argument per field declared with `option()`, in
    field order (a keyword-only base's shared ones last), with its help, default (the field's), type and choices
    (its annotation); a field without a default is required (positional with `positional=True`, else a required
    `--flag`)."""
    parser = command_parser(description, prog)
    add_options(parser, options)
    return parser


def add_options(
    parser: ArgumentParser,
    options: type,
    group: str | None = None,
    base: type | None = None,
    only: typing.Container[str] | None = None,
) -> None:
    """Add the `option()` fields of the dataclass `options` to `parser` (those named in `only`, where given), but
    those of its base class `base`; each in the `--help` group its `option(group=...)` names, else in `group`,
    else among the parser's own options."""
    groups = {group.title: group for group in parser._action_groups}
    skip = {f.name for f in fields(base)} if base is not None else set()
    every = [f for f in fields(options) if "help" in f.metadata and f.name not in skip]
    every = [f for f in every if only is None or f.name in only]
    for spec in [f for f in every if not f.kw_only] + [f for f in every if f.kw_only]:
        title = spec.metadata.get("group") or group
        if title is not None and title not in groups:
            groups[title] = parser.add_argument_group(title)
        _add_option(parser, parser if title is None else groups[title], spec, hints(options)[spec.name])


class _Renamed(argparse.Action):
    """A former flag: an error naming the flag that replaced it."""

    def __init__(self, *args, new: str, why: str | None, **kwargs):
        super().__init__(*args, **kwargs)
        self.new, self.why = new, why

    def __call__(self, parser, namespace, values, option_string=None):
        parser.error(renamed_message(option_string, self.new, *[self.why] if self.why else []))


def parse(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """`parser.parse_args(argv)`, then the logging `--verbose` asks for."""
    args = parser.parse_args(argv)
    if getattr(args, "verbose", False):
        set_verbosity(verbose=True)
    return args


def parse_options(options: type[T], argv: list[str] | None, description: str | None, prog: str | None = None) -> T:
    """`options` from the command line `argv` (`options_parser`), with the logging `--verbose` asks for."""
    values = vars(parse(options_parser(options, description, prog), argv))
    values.pop("verbose")
    return options(**values)


def check_choices(options) -> None:
    """A `UsageError` for a field of the dataclass instance `options` whose value is not one its `Literal`
    annotation allows (the command line and mappings check them as they read; this is the check of a value
    given in Python)."""
    for spec in fields(options):
        _, optional = _members(hints(type(options))[spec.name])
        value = getattr(options, spec.name)
        literal = _choices(hints(type(options))[spec.name])
        if literal is None or (optional and value is None):
            continue
        if value not in literal:
            raise UsageError(f"unknown {spec.name} {value!r}; expected one of {', '.join(map(str, literal))}")


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
    if origin is Literal:
        if value not in args:
            raise UsageError(f"unknown {where} {value!r}; expected one of {', '.join(map(str, args))}")
        return value
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
    return _convert_scalar(value, kind, where)


def _convert_scalar(value, kind, where: str):
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
    YAML and its `upcycle:` / `adapter:` sections, which are the upcycle options of their arch)."""
    if not isinstance(data, dict):
        raise UsageError(f"{where} must be a mapping of {cls.__name__} options, got {data!r}")
    known = {f.name: f for f in fields(cls) if f.init}
    renamed = renamed_fields(cls)
    for key in data:
        if key in renamed:
            why = known[renamed[key]].metadata.get("renamed_why")
            raise UsageError(f"{where}: {renamed_message(repr(key), repr(renamed[key]), *[why] if why else [])}")
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
        key: _convert(value, hints(cls)[key], f"{where}.{key}" if where != "config" else key)
        for key, value in data.items()
    }
    return cls(**values)


def shard_size(value: str) -> str:
    """argparse type of `--max-shard-size`: an integer and a unit, as `save_pretrained` reads it (`2GB`,
    `500MB`, `1GiB`; lower-case `b` counts bits)."""
    if not re.fullmatch(r"\d+(?:[KMG]i[Bb]|[KMG][Bb])", value, flags=re.IGNORECASE):
        raise argparse.ArgumentTypeError(f"expected a size such as 2GB, 500MB or 1GiB, got {value!r}")
    return value


__all__ = [
    "ArgumentParser",
    "HelpFormatter",
    "add_options",
    "check_choices",
    "command_parser",
    "field_default",
    "from_mapping",
    "hints",
    "option",
    "options_parser",
    "parse",
    "parse_options",
    "renamed_fields",
    "renamed_message",
    "shard_size",
    "type_name",
]
