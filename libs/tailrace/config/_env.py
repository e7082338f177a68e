"""`${VAR}` / `${VAR:-default}` expansion over a parsed YAML tree, remembering where each hole was."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def expand(tree: Any, env: Mapping[str, str] | None = None) -> tuple[Any, list[tuple[str, str]]]:
    """Return the expanded tree and the (field path, variable) pairs that were unset."""
    env = os.environ if env is None else env
    missing: list[tuple[str, str]] = []

    def walk(node: Any, path: str) -> Any:
        if isinstance(node, dict):
            return {k: walk(v, f"{path}.{k}" if path else str(k)) for k, v in node.items()}
        if isinstance(node, list):
            return [walk(v, f"{path}[{i}]") for i, v in enumerate(node)]
        if isinstance(node, str):
            def sub(m: re.Match[str]) -> str:
                name, default = m.group(1), m.group(2)
                if name in env:
                    return env[name]
                if default is not None:
                    return default
                missing.append((path, name))
                return ""

            return _VAR.sub(sub, node)
        return node

    return walk(tree, ""), missing
