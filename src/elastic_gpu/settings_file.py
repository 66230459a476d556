"""A component's YAML settings file read into its strict pydantic model (`egpu scheduler
--config`, `egpu controller --config`): one reading, so every component's errors name the
file, then each field's path, the value given and the rule it breaks."""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

Settings = TypeVar("Settings", bound=BaseModel)


def load_settings(path: Path | None, model: type[Settings], error: type[Exception]) -> Settings:
    """The settings in `path` (its defaults without one; an empty file is all defaults);
    anything wrong raises `error` with one message: unreadable, not YAML, not a mapping, or
    every field that breaks a rule."""
    if path is None:
        return model()
    try:
        data: Any = yaml.safe_load(path.read_text())
    except OSError as err:
        raise error(f"{path}: cannot read: {err.strerror}") from None
    except yaml.YAMLError as err:
        raise error(f"{path}: not YAML: {err}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise error(f"{path}: must be a mapping of settings, got {type(data).__name__}")
    try:
        return model.model_validate(data)
    except ValidationError as err:
        details = "; ".join(f"{'.'.join(map(str, e['loc']))}={e.get('input')!r}: {e['msg']}"
                            for e in err.errors())
        raise error(f"{path}: {details}") from None
