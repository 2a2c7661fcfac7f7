"""The base of every typed config section (pydantic, ``extra="forbid"``, finite floats) and the one-line
messages of validation errors. Below every other config module: data, models and tasks import only this.

Validation at the door (issue 17): every float field of every section is finite (``allow_inf_nan=False``
on :class:`Strict`, inherited by each section, a plugin's too); values a schema types as ``Any`` (sweep
axes, probe options) are checked with :func:`check_finite`."""

from __future__ import annotations

import json
import math
import types
import typing
from typing import Any, Union

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator


class Strict(BaseModel):
    """Base for every config section: unknown keys are errors, and so are non-finite floats (inf, NaN:
    ``.inf`` in YAML, ``Infinity`` in JSON, ``inf`` on the command line) in any float field, and booleans
    where a number belongs (``steps: true``, ``seeds: [true]``: pydantic would read them as 1)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _no_bool_for_numbers(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for name, field in cls.model_fields.items():
                if name in data and _bool_where_number(data[name], field.annotation):
                    raise ValueError(f"@{name} = {json.dumps(data[name])}: a boolean where a number belongs")
        return data


def _bool_where_number(value: Any, annotation: Any) -> bool:
    """Whether ``value`` holds a boolean where ``annotation`` admits numbers but no boolean (lists and
    tuples element-wise)."""
    ann = _strip_optional(annotation)
    origin = typing.get_origin(ann)
    if isinstance(value, bool):
        return _admits(ann, (int, float)) and not _admits(ann, (bool,))
    if isinstance(value, (list, tuple)) and origin in (list, tuple):
        args = [a for a in typing.get_args(ann) if a is not Ellipsis]
        return any(_bool_where_number(v, args[min(i, len(args) - 1)] if origin is tuple and len(args) > 1 else args[0])
                   for i, v in enumerate(value)) if args else False
    return False


def _admits(ann: Any, types_: tuple) -> bool:
    """Whether annotation ``ann`` (a type, a Union, an Annotated or constrained type) admits one of ``types_``."""
    if ann is Any:
        return bool in types_
    origin = typing.get_origin(ann)
    if origin is typing.Annotated:
        return _admits(typing.get_args(ann)[0], types_)
    if origin is typing.Literal:
        return any(isinstance(a, types_) and (bool in types_ or not isinstance(a, bool)) for a in typing.get_args(ann))
    if origin in (Union, types.UnionType):
        return any(_admits(a, types_) for a in typing.get_args(ann))
    return isinstance(ann, type) and issubclass(ann, types_) and (bool in types_ or ann is not bool)


def check_finite(value: Any, key: str) -> None:
    """Raise ``ValueError`` naming the first non-finite float found in ``value`` (nested lists and dicts;
    ``key`` is where ``value`` sits) — for fields typed ``Any``, which pydantic does not check."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{key} = {value}: must be a finite number")
    if isinstance(value, dict):
        for k, v in value.items():
            check_finite(v, f"{key}.{k}")
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            check_finite(v, f"{key}.{i}")


# ---------------------------------------------------------------- errors


def _allowed(cls: type[BaseModel] | None, loc: tuple) -> str:
    """Describe what is allowed at ``loc`` inside ``cls`` (field names for unknown keys)."""
    if cls is None:
        return ""
    parent = _resolve(cls, loc[:-1])
    if isinstance(parent, type) and issubclass(parent, BaseModel):
        return "allowed keys: " + ", ".join(parent.model_fields)
    return ""


def format_validation_error(e: ValidationError, cls: type[BaseModel] | None = None, prefix: str = "") -> str:
    err = e.errors()[0]
    loc = tuple(err["loc"])
    key = ".".join(str(p) for p in ((prefix,) if prefix else ()) + loc) or "<root>"
    value = err.get("input")
    if err["type"] == "extra_forbidden":
        return f"config error: unknown key {key!r}; {_allowed(cls, loc)}"
    if err["type"] == "missing":
        return f"config error: missing required key {key!r}"
    msg = err["msg"]
    if err["type"] == "value_error":   # a validator's own message says what is wrong with the value
        msg = msg.removeprefix("Value error, ")
        if msg.startswith("@"):        # "@field = value: why", a field of the model at ``key``
            return f"config error: {key.removesuffix('<root>') + '.' if key != '<root>' else ''}{msg[1:]}"
        return f"config error: {key}: {msg}"
    shown = json.dumps(value) if isinstance(value, (str, int, float, bool, type(None))) else repr(value)
    return f"config error: {key} = {shown}: {msg}"


def _resolve(cls: Any, path: tuple) -> Any:
    """The annotation found by walking ``path`` through pydantic models, dicts and lists."""
    t = cls
    for p in path:
        t = _strip_optional(t)
        if isinstance(t, type) and issubclass(t, BaseModel):
            if p not in t.model_fields:
                return None
            t = t.model_fields[p].annotation
        elif typing.get_origin(t) is dict:
            t = typing.get_args(t)[1]
        elif typing.get_origin(t) in (list, tuple):
            t = typing.get_args(t)[0]
        else:
            return None
    return _strip_optional(t)


def _strip_optional(t: Any) -> Any:
    if typing.get_origin(t) in (Union, types.UnionType):
        args = [a for a in typing.get_args(t) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return t
