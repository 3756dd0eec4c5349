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
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import types
import typing
from typing import Any, Callable, Mapping

import dagster as dg

_NO_SCHEMA = object()
log = logging.getLogger(__name__)
_warned: set[tuple[str, str]] = set()  # (section, old key) already warned about in this process
_warned_lock = threading.Lock()


def setting(default: Any = dataclasses.MISSING, description: str | None = None, *,
            default_factory: Callable[[], Any] | Any = dataclasses.MISSING, schema: Any = _NO_SCHEMA,
            show_default: bool = True) -> Any:
    """A dataclass field of a settings class (see the module docstring)."""
    md = {"description": description, "schema": schema, "show_default": show_default}
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
        with _warned_lock:
            first = (section, f.name) not in _warned
            _warned.add((section, f.name))
        if first:
            log.warning("gpu_executor config: %s.%s is deprecated and will be removed; use %s.%s (same meaning, "
                        "value %r taken)", section, f.name, section, new, old_value)


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
    return {f.name: _field(f, hints[f.name]) for f in dataclasses.fields(cls) if f.init}


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


def from_section(cls: type, section: Mapping[str, Any]) -> Any:
    """An instance of settings class ``cls`` from a config section: absent keys (and ``None`` for a field that
    cannot be None) take the class's defaults; unknown keys are ignored. Raises TypeError when a required
    field is missing."""
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
