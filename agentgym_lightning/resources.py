"""Resources: named, versioned texts an agent reads from its episode instead of constants.

A resource is a piece of text the agent is built around but that is not its code: its system
prompt, a few-shot block, a tool's description. An env is given them by name
(``AgentEnv(..., resources={"system_prompt": "..."})``, or ``gym.make(id, resources=...)``: every
bundled env passes its keyword arguments on), an episode may override them
(``env.reset(options={"resources": {...}})``), and the agent reads them for its episode::

    def my_agent(task, ctx):
        system = ctx.resource("system_prompt", default=SYSTEM_PROMPT)   # the constant when none given
        ...

or, from code that sees no ``ctx`` (a framework agent handed only its model client),
:func:`agentgym_lightning.agent.read_resource`. An agent given no resources runs exactly as it did
with its constants.

Each resource has a **version**: the one it was given, or a digest of its text
(``sha256:`` and 12 hex digits), so the same text always has the same version. The trajectory
records the versions its episode was given (``trajectory.resources``: name -> version), so a run
folder says which prompt produced each episode; ``agentgym-lightning optimize-prompt`` writes the
text of every version it tried beside it (``docs/prompt-optimization.md``).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "Resource", "ResourceSpec", "content_version", "as_resources", "resource_versions", "parse_resource_arg",
    "resource_file_name",
]

# A name that becomes a file name: letters, digits, '_', '-' and inner dots. No separator, no
# leading dot, so '..', '.hidden' and '../../victim' can never name a path outside the folder.
_FILE_SAFE_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_.-]{0,127}")


def content_version(text: str) -> str:
    """The version of a text given none: ``sha256:`` and the first 12 hex digits of its digest."""
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()[:12]


@dataclass(frozen=True)
class Resource:
    """One named, versioned text (see the module docstring).

    Args:
        name: What the agent asks for (``"system_prompt"``).
        text: The text itself.
        version: Any label (``"v3"``, a commit); empty: :func:`content_version` of ``text``.
    """

    name: str
    text: str
    version: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            raise ValueError(f"a resource's name must be a non-empty string, got {self.name!r}")
        if not isinstance(self.text, str):
            raise TypeError(f"resource {self.name!r}: its text must be a string, got {type(self.text).__name__}")
        if not isinstance(self.version, str):
            raise TypeError(f"resource {self.name!r}: its version must be a string, got {type(self.version).__name__}")
        if not self.version:
            object.__setattr__(self, "version", content_version(self.text))

    def to_dict(self) -> dict[str, str]:
        """``{"text", "version"}``: what :func:`as_resources` reads back (JSON, a config file)."""
        return {"text": self.text, "version": self.version}


#: What :func:`as_resources` accepts for one resource: a :class:`Resource`, its text alone, or a
#: mapping ``{"text": ..., "version": ...}`` (``version`` optional).
ResourceSpec = Resource | str | Mapping[str, Any]


def as_resources(spec: Mapping[str, ResourceSpec] | None) -> dict[str, Resource]:
    """``{name: Resource}`` from a mapping of names to resources, texts or ``{"text", "version"}``
    mappings (the form a config file or ``--env-kwarg resources='{...}'`` holds). Raises
    ``TypeError`` / ``ValueError`` saying which entry is wrong."""
    if spec is None:
        return {}
    if not isinstance(spec, Mapping):
        raise TypeError(
            f"resources must be a mapping of names to texts (or {{'text': ..., 'version': ...}}), got {type(spec).__name__}"
        )
    out: dict[str, Resource] = {}
    for name, value in spec.items():
        if isinstance(value, Resource):
            if value.name != name:
                raise ValueError(f"resources[{name!r}] is the resource named {value.name!r}: give it under its own name")
            out[name] = value
        elif isinstance(value, str):
            out[name] = Resource(name, value)
        elif isinstance(value, Mapping):
            unknown = set(value) - {"text", "version"}
            if "text" not in value or unknown:
                raise ValueError(
                    f"resources[{name!r}] must be a text or a mapping with 'text' (and optionally 'version'), "
                    f"got keys {sorted(value)}"
                )
            out[name] = Resource(name, value["text"], value.get("version") or "")
        else:
            raise TypeError(f"resources[{name!r}] must be a text, a Resource or {{'text': ...}}, got {type(value).__name__}")
    return out


def resource_versions(resources: Mapping[str, Resource]) -> dict[str, str]:
    """``{name: version}``: what a trajectory records of its episode's resources."""
    return {name: resource.version for name, resource in resources.items()}


def parse_resource_arg(item: str, flag: str = "--resource") -> Resource:
    """A resource from the command line: ``NAME=@FILE`` (the file's text, UTF-8, without its
    trailing newlines) or ``NAME=TEXT``.
    Raises ``ValueError`` saying what is wrong (no ``=``, no such file)."""
    name, sep, value = item.partition("=")
    name = name.strip()
    if not sep or not name:
        raise ValueError(f"{flag} expects NAME=@FILE or NAME=TEXT, got {item!r}")
    if value.startswith("@"):
        path = Path(value[1:])
        if not path.is_file():
            raise ValueError(f"{flag} {name}=@{path}: no such file")
        try:
            # Trailing newlines dropped, as the shell's $(cat FILE) does: an editor's final newline
            # is not part of a prompt (and a file written by optimize-prompt reads back exactly).
            value = path.read_text(encoding="utf-8").rstrip("\n")
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(f"{flag} {name}=@{path}: cannot read it ({exc})") from None
    return Resource(name, value)


def resource_file_name(name: str, suffix: str = ".txt") -> str:
    """The file name a resource's text is written under (``<name><suffix>``), for a name that is
    safe as one: letters, digits, ``_``, ``-`` and inner dots, at most 128 characters. A resource's
    name comes from a user (``--resource``), so one with a path separator or a leading dot would
    write or delete a file outside the output folder. Raises ``ValueError`` naming the resource."""
    if not isinstance(name, str) or not _FILE_SAFE_NAME.fullmatch(name):
        raise ValueError(
            f"resource name {name!r} cannot be a file name: use letters, digits, '_', '-' and '.' "
            "(not first), at most 128 characters"
        )
    return name + suffix
