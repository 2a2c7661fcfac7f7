"""The base of every typed config section (pydantic, ``extra="forbid"``) and the one-line messages
of validation errors. Below every other config module: data, models and tasks import only this."""

from __future__ import annotations

import json
import types
import typing
from typing import Any, Union

from pydantic import BaseModel, ConfigDict, ValidationError


class Strict(BaseModel):
    """Base for every config section: unknown keys are errors."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


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
