"""Read a Dockerfile's stages and a .dockerignore's rules, for the static checks of
tests/chart/test_dockerfile.py. (The image itself is built and run for real in tests/image.)"""

from __future__ import annotations

import dataclasses
import fnmatch
import pathlib
import re
from collections.abc import Sequence


@dataclasses.dataclass(frozen=True)
class Instruction:
    line: int
    keyword: str
    args: str


@dataclasses.dataclass
class Stage:
    index: int
    base: str
    name: str | None
    instructions: list[Instruction] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class Dockerfile:
    #: ARG instructions before the first FROM (the only ones FROM lines may use).
    global_args: dict[str, str]
    stages: list[Stage]


def parse(text: str) -> Dockerfile:
    """Split a Dockerfile into stages of instructions (continuations joined, comments dropped)."""
    stages: list[Stage] = []
    global_args: dict[str, str] = {}
    logical: list[tuple[int, str]] = []
    buffer = ""
    start = 0
    for number, raw in enumerate(text.splitlines(), start=1):
        stripped = raw.strip()
        if not buffer and (not stripped or stripped.startswith("#")):
            continue
        if buffer and stripped.startswith("#"):
            continue  # comment lines inside a continuation are ignored by Docker too
        if not buffer:
            start = number
        if stripped.endswith("\\"):
            buffer += stripped[:-1] + " "
            continue
        buffer += stripped
        logical.append((start, buffer))
        buffer = ""
    if buffer:
        raise ValueError("Dockerfile ends inside a line continuation")
    for number, line in logical:
        keyword, _, args = line.partition(" ")
        keyword = keyword.upper()
        if keyword == "FROM":
            parts = args.split()
            name = parts[2] if len(parts) == 3 and parts[1].upper() == "AS" else None
            stages.append(Stage(index=len(stages), base=parts[0], name=name))
            continue
        if not stages:
            if keyword != "ARG":
                raise ValueError(f"line {number}: only ARG may come before the first FROM, not {keyword}")
            key, _, value = args.strip().partition("=")
            global_args[key] = value
            continue
        stages[-1].instructions.append(Instruction(line=number, keyword=keyword, args=args.strip()))
    return Dockerfile(global_args=global_args, stages=stages)


def dockerignore_patterns(path: pathlib.Path) -> list[str]:
    if not path.exists():
        return []
    lines = (line.strip() for line in path.read_text().splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def is_ignored(relpath: str, patterns: Sequence[str]) -> bool:
    """Docker's rule: the last matching pattern wins; `!` re-includes; `**/` matches any depth."""
    ignored = False
    parts = relpath.strip("/").split("/")
    candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    for pattern in patterns:
        negate = pattern.startswith("!")
        pat = pattern[1:] if negate else pattern
        pat = pat.strip("/")
        regex = fnmatch.translate(pat).replace(".*.*/", "(.*/)?")
        if any(re.match(regex, c) for c in candidates):
            ignored = not negate
    return ignored
