"""Settings declared once, as the fields of a frozen dataclass, and everything else generated from them.

Each field says its default, its meaning and which commands take it (``setting(...)``); from those
fields come the command-line flags, the ``GPUEFF_*`` environment fallbacks (a flag overrides its
variable, which overrides the default) and the settings table of docs/cli.md, so none of them can drift
from the others. Text from a flag or a variable is parsed the same way; bad text is a SettingError
that names the flag and the variable, never a silent default.
"""

from __future__ import annotations

import argparse
import json
import typing
from collections.abc import Callable, Mapping
from dataclasses import MISSING, Field, dataclass, field, fields
from typing import Any, Literal, TypeVar

T = TypeVar("T")

#: Which commands take a setting: ``shared`` reaches Prometheus and scopes the work (`run`, `report`
#: and `explain`, so a `kubectl exec` into the operator's container reads what the operator reads).
Scope = Literal["shared", "run", "report"]
COMMANDS: Mapping[Scope, tuple[str, ...]] = {
    "shared": ("run", "report", "explain"),
    "run": ("run",),
    "report": ("report",),
}
Kind = Literal["str", "optional str", "int", "float", "bool", "list"]
_KINDS: tuple[tuple[object, Kind], ...] = (
    (bool, "bool"),
    (int, "int"),
    (float, "float"),
    (str, "str"),
    (str | None, "optional str"),
    (tuple[str, ...], "list"),
)
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off", "")
_METADATA_KEY = "gpu_efficiency.setting"
ENV_PREFIX = "GPUEFF_"


class SettingError(ValueError):
    """A flag or environment variable whose text is not a value of its setting."""


@dataclass(frozen=True, kw_only=True)
class _Declared:
    help: str
    scope: Scope
    flag: str | None
    negation: str | None
    choices: tuple[str, ...]
    minimum: float | None
    default_doc: str | None


@dataclass(frozen=True, kw_only=True)
class Setting:
    """One setting: its field, flag(s), environment variable, default and meaning."""

    name: str
    kind: Kind
    help: str
    scope: Scope
    flag: str
    negation: str | None  # e.g. --no-leader-election, for a setting that is on by default
    env: str
    choices: tuple[str, ...]
    minimum: float | None  # smaller numbers are raised to it
    default: object  # MISSING where a factory computes it at start
    default_doc: str

    @property
    def commands(self) -> tuple[str, ...]:
        return COMMANDS[self.scope]

    def parse(self, text: str) -> object:
        """The value of flag or variable text; SettingError names both where it is not one."""
        if self.kind in ("str", "optional str") and self.choices and text not in self.choices:
            raise self._error(text, f"one of {', '.join(self.choices)}")
        if self.kind == "str":
            return text
        if self.kind == "optional str":
            return text or None
        if self.kind == "list":
            return tuple(part.strip() for part in text.split(",") if part.strip())
        if self.kind == "bool":
            word = text.strip().lower()
            if word not in _TRUE + _FALSE:
                raise self._error(text, f"a boolean ({'/'.join(_TRUE)} or {'/'.join(_FALSE[:-1])})")
            return word in _TRUE
        number: float
        try:
            number = int(text) if self.kind == "int" else float(text)
        except ValueError:
            raise self._error(text, "an integer" if self.kind == "int" else "a number") from None
        return number if self.minimum is None else max(type(number)(self.minimum), number)

    def _error(self, text: str, expected: str) -> SettingError:
        return SettingError(f"{self.flag} / ${self.env}: {text!r} is not {expected}")


def setting(
    default: T,
    help: str,
    *,
    scope: Scope,
    flag: str | None = None,
    negation: str | None = None,
    choices: tuple[str, ...] = (),
    minimum: float | None = None,
    default_doc: str | None = None,
) -> T:
    """Declare a dataclass field as a setting (typed as its default, as ``dataclasses.field`` is).

    The flag defaults to ``--field-name`` and the variable is always ``GPUEFF_FIELD_NAME``.
    """
    declared = _Declared(
        help=help,
        scope=scope,
        flag=flag,
        negation=negation,
        choices=choices,
        minimum=minimum,
        default_doc=default_doc,
    )
    value: T = field(default=default, metadata={_METADATA_KEY: declared})
    return value


def computed_setting(
    factory: Callable[[], T], help: str, *, scope: Scope, default_doc: str, flag: str | None = None
) -> T:
    """A setting whose default is computed when the configuration is built; empty text means it."""
    declared = _Declared(
        help=help, scope=scope, flag=flag, negation=None, choices=(), minimum=None, default_doc=default_doc
    )
    value: T = field(default_factory=factory, metadata={_METADATA_KEY: declared})
    return value


def _kind(name: str, hint: object) -> Kind:
    for known, kind in _KINDS:
        if hint == known:
            return kind
    raise TypeError(f"setting {name}: type {hint!r} has no flag form")


def _default_doc(default: object) -> str:
    """As the policy reference shows defaults: JSON (strings quoted), nothing for "none"."""
    return "" if default is None or default == () else json.dumps(default)


def settings_of(cls: type[Any]) -> tuple[Setting, ...]:
    """The settings a dataclass declares with ``setting``, in field order."""
    hints = typing.get_type_hints(cls)
    found = []
    for f in fields(cls):
        declared = f.metadata.get(_METADATA_KEY)
        if not isinstance(declared, _Declared):
            raise TypeError(f"{cls.__name__}.{f.name} is not declared with setting()")
        found.append(_setting(f, declared, _kind(f.name, hints[f.name])))
    return tuple(found)


def _setting(f: Field[Any], declared: _Declared, kind: Kind) -> Setting:
    default: object = f.default
    if default is MISSING and declared.default_doc is None:
        raise TypeError(f"setting {f.name}: a computed default needs default_doc")
    return Setting(
        name=f.name,
        kind=kind,
        help=declared.help,
        scope=declared.scope,
        flag=declared.flag or "--" + f.name.replace("_", "-"),
        negation=declared.negation,
        env=ENV_PREFIX + f.name.upper(),
        choices=declared.choices,
        minimum=declared.minimum,
        default=default,
        default_doc=declared.default_doc if declared.default_doc is not None else _default_doc(default),
    )


def add_arguments(parser: argparse.ArgumentParser, settings: tuple[Setting, ...], command: str) -> None:
    """The flags of the settings ``command`` takes; each defaults to None: "not given"."""
    for s in settings:
        if command not in s.commands:
            continue
        default = f"default {s.default_doc}" if s.default_doc else "no default"
        text = f"{s.help} (env {s.env}; {default})".replace("%", "%%")
        if s.kind == "bool":
            parser.add_argument(s.flag, dest=s.name, action="store_true", default=None, help=text)
            if s.negation:
                parser.add_argument(s.negation, dest=s.name, action="store_false", default=None)
        else:
            parser.add_argument(s.flag, dest=s.name, default=None, choices=s.choices or None, help=text)


def resolve(
    args: argparse.Namespace, settings: tuple[Setting, ...], environ: Mapping[str, str]
) -> dict[str, Any]:
    """Keyword arguments of the configuration: each setting's flag, else its variable, else (left out)
    its default. A setting the parsed command does not take keeps its default, whatever the environment."""
    values: dict[str, Any] = {}
    for s in settings:
        given = getattr(args, s.name, MISSING)
        if given is MISSING:
            continue
        if isinstance(given, bool):
            values[s.name] = given
            continue
        text = given if given is not None else environ.get(s.env)
        if text is None or (text == "" and s.default is MISSING):
            continue
        values[s.name] = s.parse(text)
    return values


def render_table(settings: tuple[Setting, ...]) -> list[str]:
    """Markdown rows: flag, variable, default, commands, meaning."""
    rows = ["| flag | environment | default | commands | meaning |", "|---|---|---|---|---|"]
    for s in settings:
        flags = f"`{s.flag}`" + (f", `{s.negation}`" if s.negation else "")
        default = f"`{s.default_doc}`".replace("|", "\\|") if s.default_doc else ""
        meaning = s.help.replace("|", "\\|")
        if s.choices:
            meaning += f" ({' or '.join(s.choices)})"
        rows.append(f"| {flags} | `{s.env}` | {default} | {', '.join(s.commands)} | {meaning} |")
    return rows


def replace_section(text: str, start: str, end: str, section: str) -> str:
    """Text with what lies between the markers (both kept) replaced by ``section``."""
    before, found, rest = text.partition(start)
    if not found:
        raise ValueError(f"no marker {start!r}")
    _, found_end, after = rest.partition(end)
    if not found_end:
        raise ValueError(f"no marker {end!r} after {start!r}")
    return before + start + section + end + after
