"""Run a Dockerfile's steps without a container engine, to test the commands it really runs.

No Docker engine runs on these machines, yet an image whose install step or ENTRYPOINT was never
executed is a classic day-one failure. So the Dockerfile is parsed and its instructions are
replayed on the host, each stage in its own directory under a temp root:

- the base image's Python is a fresh virtualenv per stage (its ``bin`` first on PATH, so ``python``
  and console scripts resolve to it, as ``/usr/local/bin`` does in ``python:3.11-slim``);
- WORKDIR, COPY and ``RUN --mount=type=bind`` work on directories under the stage's root;
- RUN executes the instruction's own text with ``sh -c``, with ARG and ENV values in the
  environment; absolute container paths that the Dockerfile itself declares (WORKDIR, COPY
  destinations and ``--from`` sources, bind-mount sources and targets) are rewritten to their
  directories under the temp root. Nothing else in a command is changed.

Only the instructions this project's Dockerfile uses are supported; anything else raises, so a
new instruction cannot be silently skipped.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import json
import os
import pathlib
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence

# Host settings that a `docker build` would also get from its environment (registry mirror,
# proxy, CA bundle); everything else in the host environment stays out of the build.
_PASSTHROUGH = (
    "PIP_INDEX_URL",
    "PIP_EXTRA_INDEX_URL",
    "PIP_CERT",
    "PIP_DEFAULT_TIMEOUT",
    "SSL_CERT_FILE",
    "REQUESTS_CA_BUNDLE",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
    "http_proxy",
    "https_proxy",
    "no_proxy",
)


class EmulationError(RuntimeError):
    """The Dockerfile uses something this emulator cannot replay, or a step failed."""


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


@dataclasses.dataclass(frozen=True)
class Mount:
    source_stage: str
    source: str
    target: str


@dataclasses.dataclass
class StageResult:
    stage: Stage
    root: pathlib.Path
    venv: pathlib.Path
    env: dict[str, str]
    user: str | None = None
    entrypoint: list[str] | None = None
    labels: dict[str, str] = dataclasses.field(default_factory=dict)


def parse(text: str) -> list[Stage]:
    """Split a Dockerfile into stages of instructions (continuations joined, comments dropped)."""
    stages: list[Stage] = []
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
        raise EmulationError("Dockerfile ends inside a line continuation")
    for number, line in logical:
        keyword, _, args = line.partition(" ")
        keyword = keyword.upper()
        if keyword == "FROM":
            parts = args.split()
            name = parts[2] if len(parts) == 3 and parts[1].upper() == "AS" else None
            stages.append(Stage(index=len(stages), base=parts[0], name=name))
            continue
        if not stages:
            raise EmulationError(f"line {number}: {keyword} before the first FROM is not supported")
        stages[-1].instructions.append(Instruction(line=number, keyword=keyword, args=args.strip()))
    return stages


def _flags(args: str) -> tuple[dict[str, list[str]], str]:
    """Leading --flag=value options of an instruction, and the rest."""
    flags: dict[str, list[str]] = {}
    rest = args
    while rest.startswith("--"):
        flag, _, rest = rest.partition(" ")
        key, _, value = flag[2:].partition("=")
        flags.setdefault(key, []).append(value)
        rest = rest.lstrip()
    return flags, rest


def _parse_mount(spec: str) -> Mount:
    fields = dict(item.split("=", 1) for item in spec.split(","))
    if fields.get("type", "bind") != "bind" or "from" not in fields:
        raise EmulationError(f"only --mount=type=bind,from=<stage> is supported, got {spec!r}")
    return Mount(source_stage=fields["from"], source=fields.get("source", "/"), target=fields["target"])


def _expand(value: str, env: Mapping[str, str]) -> str:
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: env.get(m.group(1) or m.group(2), ""), value)


def _key_values(args: str, env: Mapping[str, str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for token in shlex.split(args):
        key, sep, value = token.partition("=")
        if not sep:
            raise EmulationError(f"only KEY=VALUE syntax is supported, got {token!r}")
        out[key] = _expand(value, {**env, **out})
    return out


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


class Emulator:
    """Replays the stages of one Dockerfile under ``workdir``."""

    def __init__(
        self,
        *,
        dockerfile: pathlib.Path,
        context: pathlib.Path,
        workdir: pathlib.Path,
        python: str = sys.executable,
        log: pathlib.Path | None = None,
    ) -> None:
        self.dockerfile = dockerfile
        self.context = context
        self.workdir = workdir
        self.python = python
        self.stages = parse(dockerfile.read_text())
        self.ignore = dockerignore_patterns(context / ".dockerignore")
        self.results: dict[str, StageResult] = {}
        self.log = log or workdir / "build.log"

    # -- paths -------------------------------------------------------------------------
    def _declared_paths(self) -> list[str]:
        """Container paths named by any stage (a --from source names a path of another stage)."""
        paths: set[str] = set()
        for ins in (i for stage in self.stages for i in stage.instructions):
            if ins.keyword == "WORKDIR":
                paths.add(ins.args)
            elif ins.keyword == "COPY":
                flags, rest = _flags(ins.args)
                words = shlex.split(rest)
                if words[-1].startswith("/"):
                    paths.add(words[-1].rstrip("/"))
                if "from" in flags:
                    paths.update(w.rstrip("/") for w in words[:-1] if w.startswith("/"))
            elif ins.keyword == "RUN":
                flags, _ = _flags(ins.args)
                for spec in flags.get("mount", []):
                    m = _parse_mount(spec)
                    paths.update({m.target, m.source})
        return sorted(paths - {"/", ""}, key=len, reverse=True)

    def _rewrite(self, command: str, mapping: Mapping[str, pathlib.Path]) -> str:
        for container_path in sorted(mapping, key=len, reverse=True):
            pattern = re.escape(container_path) + r"(?=$|[/\s\"'=;&|)])"
            command = re.sub(r"(?<![\w./-])" + pattern, str(mapping[container_path]), command)
        return command

    def _stage_root(self, ref: str) -> pathlib.Path:
        if ref in self.results:
            return self.results[ref].root
        raise EmulationError(f"--from={ref} names no earlier stage")

    # -- steps -------------------------------------------------------------------------
    def _run(self, cmd: Sequence[str], *, cwd: pathlib.Path, env: Mapping[str, str], what: str) -> None:
        with self.log.open("a") as log:
            log.write(f"\n$ {what}\n")
            log.flush()
            proc = subprocess.run(
                cmd, cwd=cwd, env=dict(env), stdout=log, stderr=subprocess.STDOUT, check=False
            )
        if proc.returncode != 0:
            tail = "\n".join(self.log.read_text().splitlines()[-40:])
            raise EmulationError(f"{what} failed with exit {proc.returncode}; last lines:\n{tail}")

    def _copy(self, src: pathlib.Path, dest: pathlib.Path, *, from_context: bool) -> None:
        def ignore(directory: str, names: list[str]) -> set[str]:
            if not from_context:
                return set()
            rel = pathlib.Path(directory).relative_to(self.context)
            return {n for n in names if is_ignored(str(rel / n), self.ignore)}

        if src.is_dir():
            shutil.copytree(src, dest, ignore=ignore, dirs_exist_ok=True, symlinks=False)
        else:
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest)

    def build(self) -> StageResult:
        """Replay every stage; return the final stage's result."""
        result: StageResult | None = None
        for stage in self.stages:
            result = self._build_stage(stage)
            self.results[str(stage.index)] = result
            if stage.name:
                self.results[stage.name] = result
        if result is None:
            raise EmulationError("the Dockerfile has no stage")
        return result

    def _build_stage(self, stage: Stage) -> StageResult:
        if not stage.base.startswith("python:3.11"):
            raise EmulationError(f"stage {stage.index}: base {stage.base!r} is not a python:3.11 image")
        root = self.workdir / f"stage{stage.index}"
        venv = root / "usr-local"
        root.mkdir(parents=True)
        self._run(
            [self.python, "-m", "venv", str(venv)],
            cwd=root,
            env=os.environ,
            what=f"stage {stage.index}: base image python (venv)",
        )
        env = {k: os.environ[k] for k in _PASSTHROUGH if k in os.environ}
        env.update(
            {"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "HOME": str(root / "root"), "VIRTUAL_ENV": str(venv)}
        )
        (root / "root").mkdir()
        mapping = {p: root / p.lstrip("/") for p in self._declared_paths()}
        res = StageResult(stage=stage, root=root, venv=venv, env=env)
        cwd_ref = [root]
        for ins in stage.instructions:
            self._apply(ins, res, mapping, cwd_ref)
        return res

    def _apply(
        self,
        ins: Instruction,
        res: StageResult,
        mapping: dict[str, pathlib.Path],
        cwd_ref: list[pathlib.Path],
    ) -> None:
        env = res.env
        where = f"Dockerfile:{ins.line} {ins.keyword}"
        if ins.keyword == "ENV":
            values = _key_values(ins.args, env)
            if values.get("HOME", "").startswith("/"):
                # The container's home directory lives under the stage root like every other path.
                home = res.root / values["HOME"].lstrip("/")
                home.mkdir(parents=True, exist_ok=True)
                values["HOME"] = str(home)
            env.update(values)
        elif ins.keyword == "ARG":
            name, _, default = ins.args.partition("=")
            env.setdefault(name, _expand(default, env))
        elif ins.keyword == "LABEL":
            res.labels.update(_key_values(ins.args, env))
        elif ins.keyword == "WORKDIR":
            cwd_ref[0] = mapping[ins.args]
            cwd_ref[0].mkdir(parents=True, exist_ok=True)
        elif ins.keyword == "COPY":
            flags, rest = _flags(ins.args)
            words = [_expand(w, env) for w in shlex.split(rest)]
            *sources, dest = words
            dest_path = mapping[dest.rstrip("/")] if dest.startswith("/") else cwd_ref[0] / dest
            for src in sources:
                if "from" in flags:
                    src_path = self._stage_root(flags["from"][0]) / src.lstrip("/")
                else:
                    if is_ignored(src, self.ignore):
                        raise EmulationError(f"{where}: {src} is excluded by .dockerignore")
                    src_path = self.context / src
                # Docker copies a directory's contents (not the directory itself) into dest.
                if src_path.is_dir():
                    target = dest_path
                else:
                    target = dest_path / src_path.name if dest.endswith("/") else dest_path
                self._copy(src_path, target, from_context="from" not in flags)
        elif ins.keyword == "RUN":
            flags, command = _flags(ins.args)
            local = dict(mapping)
            for spec in flags.get("mount", []):
                m = _parse_mount(spec)
                local[m.target] = self._stage_root(m.source_stage) / m.source.lstrip("/")
            if set(flags) - {"mount"}:
                raise EmulationError(f"{where}: unsupported RUN flags {sorted(flags)}")
            self._run(["sh", "-c", self._rewrite(command, local)], cwd=cwd_ref[0], env=env, what=where)
        elif ins.keyword == "USER":
            res.user = ins.args
        elif ins.keyword == "ENTRYPOINT":
            res.entrypoint = json.loads(ins.args)
        elif ins.keyword in ("EXPOSE",):
            pass  # metadata only
        else:
            raise EmulationError(f"{where}: instruction not supported by the emulator")
