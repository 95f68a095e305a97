"""Import Python objects named in config as `package.module:attribute` or `package.module`.

Used for tool modules and hooks. Errors are raised at startup with the spec in the message;
never imported at run time from untrusted input (names come from the operator's config).
"""

from __future__ import annotations

import importlib
from types import ModuleType


def import_object(spec: str) -> object:
    """The attribute `spec` names (`package.module:attr`), or the module (`package.module`)."""
    module_name, _, attribute = spec.partition(":")
    if not module_name:
        raise ValueError(f"{spec!r} is not 'package.module' or 'package.module:attribute'")
    try:
        module: ModuleType = importlib.import_module(module_name)
    except ImportError as error:
        raise ValueError(f"cannot import {module_name!r} (from {spec!r}): {error}") from error
    if not attribute:
        return module
    target: object = module
    for part in attribute.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise ValueError(f"{module_name!r} has no attribute {attribute!r}") from None
    return target
