"""One settings class per backend section: its defaults are written once, and Dagster's config schema for the
section is generated from it.

A backend declares a frozen dataclass whose fields carry :func:`setting` metadata (a description, and an
explicit Dagster type where the Python type does not say enough). :func:`config_field` turns the class into
the ``dagster.Field`` of its section of gpu_executor's config; :func:`from_section` turns a section (as
Dagster resolved it, or a plain dict) into an instance.

Python type -> Dagster type: ``str`` -> ``StringSource``, ``int``/``float``/``bool`` as is,
``tuple[X, ...]`` -> ``[X]``, ``Mapping`` -> ``Permissive()``, a dataclass -> a dict of its own fields,
``X | None`` -> ``Noneable(X)``. Defaults: a plain default becomes the field's ``default_value``; a
``default_factory`` does too unless the setting says ``show_default=False`` (a default computed at run time,
e.g. from ``$DAGSTER_HOME``); ``None`` makes the field optional.

A key that was renamed stays accepted for a release: :func:`renamed` declares the old key (optional in the
schema, ``None`` by default) and the class's ``__post_init__`` calls :func:`apply_renamed`, which moves its
value to the new key and logs one warning per process naming the new key.

A section may hold sections of its own (a field whose type is a settings class, e.g. ``slurm.ssh``). A field
of such a nested section that replaces an old key of the enclosing one says so with ``setting(..., was=<old
key>)``: the enclosing section's schema still accepts the old key (optional, ``None`` by default) and
:func:`from_section` moves its value into the nested section with a ``DeprecationWarning`` (and one log
line per process) naming the new key; the old key beside a nested value that is not its default is a
ValueError naming both.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import types
import typing
import warnings
from typing import Any, Callable, Mapping

import dagster as dg

_NO_SCHEMA = object()
log = logging.getLogger(__name__)
_warned: set[tuple[str, str]] = set()  # (section, old key) already warned about in this process
_warned_lock = threading.Lock()


def setting(default: Any = dataclasses.MISSING, description: str | None = None, *,
            default_factory: Callable[[], Any] | Any = dataclasses.MISSING, schema: Any = _NO_SCHEMA,
            show_default: bool = True, was: str | None = None) -> Any:
    """A dataclass field of a settings class (see the module docstring). ``was``: in a nested section, the
    old key of the enclosing section this field replaces (still accepted there, with a warning)."""
    md = {"description": description, "schema": schema, "show_default": show_default, "was": was}
    if default_factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=default_factory, metadata=md)
    return dataclasses.field(default=default, metadata=md)


def renamed(new: str) -> Any:
    """A dataclass field for the deprecated old name of setting ``new``: optional in the generated schema
    (``None`` by default, described as deprecated), its value moved to ``new`` by :func:`apply_renamed`.
    Annotate it ``<new's type> | None``."""
    return dataclasses.field(default=None, metadata={
        "description": f"Deprecated: the old name of {new}, still accepted; use {new}.", "schema": _NO_SCHEMA,
        "show_default": True, "renamed_to": new})


def apply_renamed(settings: Any, section: str) -> None:
    """Move each deprecated key set on frozen dataclass ``settings`` (fields made by :func:`renamed`) to its
    new key and set the old one to None, logging one warning per process and key (``section`` names the
    config section in it, e.g. ``slurm``). The new key keeps its own value when the old one is not set.
    Raises ValueError naming both keys when both are set to different values (the new one not at its
    default)."""
    fields = {f.name: f for f in dataclasses.fields(settings)}
    for f in fields.values():
        new = f.metadata.get("renamed_to")
        old_value = getattr(settings, f.name)
        if new is None or old_value is None:
            continue
        nf = fields[new]
        default = nf.default_factory() if nf.default is dataclasses.MISSING else nf.default
        new_value = getattr(settings, new)
        if new_value != default and new_value != old_value:
            raise ValueError(f"gpu_executor config {section}: both {section}.{f.name} ({old_value!r}) and "
                             f"{section}.{new} ({new_value!r}) are set; {f.name} is the deprecated name of {new}: "
                             f"keep {new} only")
        object.__setattr__(settings, new, old_value)
        object.__setattr__(settings, f.name, None)
        _warn_deprecated(section, f.name, new, old_value)


def _warn_deprecated(section: str, old: str, new: str, value: Any) -> None:
    """A DeprecationWarning naming ``<section>.<old>`` and its replacement ``<section>.<new>``, and the same as
    one log line per process and key."""
    warnings.warn(f"gpu_executor config: {section}.{old} is deprecated: use {section}.{new}", DeprecationWarning,
                  stacklevel=4)
    with _warned_lock:
        first = (section, old) not in _warned
        _warned.add((section, old))
    if first:
        log.warning("gpu_executor config: %s.%s is deprecated and will be removed; use %s.%s (same meaning, "
                    "value %r taken)", section, old, section, new, value)


def _sections(cls: type) -> dict[str, type]:
    """{field name: settings class} of the nested sections of settings class ``cls``."""
    hints = typing.get_type_hints(cls)
    return {f.name: t for f in dataclasses.fields(cls) if dataclasses.is_dataclass(t := _split_optional(hints[f.name])[0])}


def moved_keys(cls: type) -> dict[str, tuple[str, dataclasses.Field]]:
    """{old key: (new dotted key, its field)} of settings class ``cls``: each field of a nested section that
    replaces an old key of ``cls`` (``setting(..., was=<old key>)``), e.g. ``{"ssh_host": ("ssh.host", …)}``."""
    return {g.metadata["was"]: (f"{name}.{g.name}", g) for name, sub in _sections(cls).items()
            for g in dataclasses.fields(sub) if g.metadata.get("was")}


def _default(f: dataclasses.Field) -> Any:
    return f.default_factory() if f.default is dataclasses.MISSING else f.default


def _move_old_keys(cls: type, section: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    """``section`` with each old key of :func:`moved_keys` set (not None) moved into its nested section, with
    a deprecation warning. Raises ValueError naming both keys when the nested one is set too (not its
    default)."""
    moved = {old: v for old, v in moved_keys(cls).items() if old in section}
    if not moved:
        return section
    out = dict(section)
    for old, (new, g) in moved.items():
        value = out.pop(old)
        if value is None:
            continue
        sub, key = new.split(".", 1)
        nested = dict(out.get(sub) or {})
        current = nested.get(key)
        if current is not None and _plain(current) != _plain(_default(g)):
            raise ValueError(f"gpu_executor config {name}: both {name}.{old} ({value!r}) and {name}.{new} "
                             f"({current!r}) are set; {old} is the deprecated flat form of {new}: keep {new} only")
        nested[key] = value
        out[sub] = nested
        _warn_deprecated(name, old, new, value)
    return out


def nest_sections(settings: Any) -> None:
    """Turn each nested section of frozen dataclass ``settings`` given as a mapping (a keyword argument
    ``ssh={"host": …}``) into its settings class (:func:`from_section`). For ``__post_init__``."""
    for name, sub in _sections(type(settings)).items():
        value = getattr(settings, name)
        if isinstance(value, Mapping):
            object.__setattr__(settings, name, from_section(sub, value))


def _split_optional(hint: Any) -> tuple[Any, bool]:
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) != len(typing.get_args(hint)):
            return (args[0] if len(args) == 1 else typing.Union[tuple(args)]), True
    return hint, False


def _dagster_type(hint: Any, top: bool = True) -> Any:
    origin = typing.get_origin(hint)
    if hint is str:
        return dg.StringSource if top else str
    if hint in (int, float, bool):
        return hint
    if dataclasses.is_dataclass(hint):
        return _fields(hint)
    if origin in (tuple, list) and typing.get_args(hint):
        return [_dagster_type(typing.get_args(hint)[0], top=False)]
    if origin in (dict, Mapping) or hint in (dict, Mapping) or origin is typing.Mapping or \
            (isinstance(origin, type) and issubclass(origin, Mapping)):
        return dg.Permissive()
    raise TypeError(f"no Dagster config type for settings type {hint!r}")


def _plain(value: Any) -> Any:
    """A default as Dagster's config system holds it (dataclasses -> dicts, tuples -> lists)."""
    if dataclasses.is_dataclass(value):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _field(f: dataclasses.Field, hint: Any) -> dg.Field:
    inner, optional = _split_optional(hint)
    schema = f.metadata.get("schema", _NO_SCHEMA)
    schema = _dagster_type(inner) if schema is _NO_SCHEMA else schema
    if optional:
        schema = dg.Noneable(schema)
    desc = f.metadata.get("description")
    default = f.default
    if default is dataclasses.MISSING and f.default_factory is not dataclasses.MISSING and f.metadata.get("show_default", True):
        default = f.default_factory()
    if default is dataclasses.MISSING or default is None:
        if default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            return dg.Field(schema, is_required=True, description=desc)
        return dg.Field(schema, is_required=False, description=desc)
    return dg.Field(schema, default_value=_plain(default), description=desc)


def _fields(cls: type) -> dict[str, dg.Field]:
    hints = typing.get_type_hints(cls)
    fields = {f.name: _field(f, hints[f.name]) for f in dataclasses.fields(cls) if f.init}
    for old, (new, g) in moved_keys(cls).items():
        inner = _split_optional(typing.get_type_hints(_sections(cls)[new.split(".")[0]])[g.name])[0]
        schema = g.metadata.get("schema", _NO_SCHEMA)
        fields[old] = dg.Field(dg.Noneable(_dagster_type(inner) if schema is _NO_SCHEMA else schema), is_required=False,
                               description=f"Deprecated: the flat form of {new}, still accepted; use {new}.")
    return fields


def config_field(cls: type, description: str) -> dg.Field:
    """The optional ``dagster.Field`` of a config section described by settings class ``cls``."""
    return dg.Field(_fields(cls), is_required=False, description=description)


def _convert(value: Any, hint: Any) -> Any:
    inner, optional = _split_optional(hint)
    if value is None:
        return None
    if dataclasses.is_dataclass(inner) and isinstance(value, Mapping):
        return from_section(inner, value)
    origin = typing.get_origin(inner)
    if origin in (tuple, list) and isinstance(value, (list, tuple)):
        item = typing.get_args(inner)[0]
        return tuple(_convert(v, item) for v in value)
    if isinstance(value, Mapping):
        return dict(value)
    return value


def from_section(cls: type, section: Mapping[str, Any], name: str | None = None) -> Any:
    """An instance of settings class ``cls`` from a config section: absent keys (and ``None`` for a field that
    cannot be None) take the class's defaults; unknown keys are ignored; old keys of nested sections are
    moved into them (:func:`moved_keys`; ``name`` names the section in the warning, default the class's
    name). Raises TypeError when a required field is missing, ValueError when an old key and its new one
    are both set."""
    section = _move_old_keys(cls, section, name or cls.__name__)
    hints = typing.get_type_hints(cls)
    kw = {}
    for f in dataclasses.fields(cls):
        if not f.init or f.name not in section:
            continue
        value = section[f.name]
        if value is None and not _split_optional(hints[f.name])[1]:
            continue
        kw[f.name] = _convert(value, hints[f.name])
    return cls(**kw)
