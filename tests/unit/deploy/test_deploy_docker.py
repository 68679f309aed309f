"""How the patch gets into the images, tested as far as a machine without a Docker engine allows:

* the Dockerfiles are parsed: what they COPY exists and passes their .dockerignore, the base image is a
  supported vLLM release;
* the install step is replayed: the files the Dockerfile copies are installed with pip into a scratch
  target, as the image's pip does, and the result must carry the vLLM plugin entry point and every class
  the compose and Kubernetes files name on vLLM's command line.
"""

import ast
import fnmatch
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from deploy_support import DEPLOY, K8S, REPO

from specctl_vllm.engine_patch import versions

DOCKER = DEPLOY / "docker"
DOCKERFILES = {"engine": DOCKER / "engine.Dockerfile", "controller": DOCKER / "controller.Dockerfile"}


def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with line continuations joined and comments dropped."""
    text = re.sub(r"\\\n", " ", path.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            op, _, rest = line.partition(" ")
            out.append((op.upper(), rest.strip()))
    return out


def copied_sources(path: Path) -> list[str]:
    return [src for op, args in instructions(path) if op == "COPY" for src in args.split()[:-1]]


def ignored(path: str, patterns: list[str]) -> bool:
    """Docker's rule: the last matching pattern wins; ``!`` re-includes."""
    result = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        pattern = pattern.lstrip("!").rstrip("/")
        if fnmatch.fnmatch(path, pattern) or path.startswith(pattern + "/"):
            result = not negate
    return result


@pytest.mark.parametrize("name", sorted(DOCKERFILES))
def test_copied_files_exist_and_pass_dockerignore(name):
    path = DOCKERFILES[name]
    patterns = [
        line.strip() for line in Path(str(path) + ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    sources = copied_sources(path)
    assert {"pyproject.toml", "controller", "engine_patch", "specctl_vllm"} <= set(sources)
    for src in sources:
        assert (REPO / src).exists(), src
        assert not ignored(src, patterns), f"{src} is excluded by the .dockerignore"
    assert ignored("tests", patterns) and ignored(".venv", patterns)


def _tag_version(image: str) -> tuple[int, int]:
    parsed = versions.parse_version(image.rsplit(":v", 1)[1])
    assert parsed is not None, image
    return parsed


def test_engine_base_images_are_supported_vllm_releases():
    (arg,) = [a for op, a in instructions(DOCKERFILES["engine"]) if op == "ARG" and a.startswith("VLLM_IMAGE=")]
    images = [arg.split("=", 1)[1]]
    for platform in ("cuda", "rocm"):
        build_args = yaml.safe_load((DEPLOY / "compose" / f"compose.{platform}.yaml").read_text())
        default = build_args["services"]["engine"]["build"]["args"]["VLLM_IMAGE"]
        images.append(re.fullmatch(r"\$\{VLLM_IMAGE:-(.+)\}", default).group(1))
    assert any("rocm" in i for i in images) and any("rocm" not in i for i in images)
    for image in images:
        assert versions.MIN_VERSION <= _tag_version(image) < versions.MAX_VERSION, image


def test_engine_entrypoint_is_the_openai_server():
    (entry,) = [a for op, a in instructions(DOCKERFILES["engine"]) if op == "ENTRYPOINT"]
    assert entry == '["python3", "-m", "vllm.entrypoints.openai.api_server"]'


def test_controller_image_runs_serve_as_non_root():
    ops = instructions(DOCKERFILES["controller"])
    assert ("USER", "10001") in ops
    (cmd,) = [a for op, a in ops if op == "CMD"]
    assert cmd.startswith('["serve"')


def _deploy_dotted_paths() -> set[str]:
    """Every ``--scheduler-cls`` / ``--middleware`` value (and the env variable that feeds one) in deploy/."""
    found = set()
    for path in list((DEPLOY / "compose").glob("*.yaml")) + list(K8S.rglob("*.yaml")):
        text = path.read_text()
        found |= set(re.findall(r"--(?:scheduler-cls|middleware)=([\w.]+)", text))
        found |= set(re.findall(r"name: SPECCTL_SCHEDULER_CLS\s+value: ([\w.]+)", text))
    return found


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The engine Dockerfile's install step, replayed: copy what it COPYs, pip install it (no deps: the vLLM
    image has them) into a scratch target."""
    context = tmp_path_factory.mktemp("context")
    for src in copied_sources(DOCKERFILES["engine"]):
        if (REPO / src).is_dir():
            # symlinks=True: COPY keeps links as links (the package has none: pyproject maps its subpackages)
            shutil.copytree(REPO / src, context / src, symlinks=True,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy(REPO / src, context / src)
    target = tmp_path_factory.mktemp("site")
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation", "--no-compile",
         "--target", str(target), str(context)],
        check=False, capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return target


def _dist_info(installed: Path) -> Path:
    (info,) = installed.glob("specctl_vllm-*.dist-info")
    return info


def _defines(installed: Path, dotted: str, kind: type) -> bool:
    module, _, name = dotted.rpartition(".")
    source = installed / (module.replace(".", "/") + ".py")
    if not source.is_file():
        return False
    return any(isinstance(node, kind) and node.name == name for node in ast.parse(source.read_text()).body)


def test_plugin_entry_point_is_installed(installed):
    entry_points = (_dist_info(installed) / "entry_points.txt").read_text()
    section = entry_points.split("[vllm.general_plugins]", 1)[1].split("[", 1)[0]
    (line,) = [x for x in section.splitlines() if x.strip()]
    name, target = (part.strip() for part in line.split("="))
    assert name == "specctl"
    module, func = target.split(":")
    assert _defines(installed, f"{module}.{func}", ast.FunctionDef)


def test_classes_named_on_the_vllm_command_line_are_installed(installed):
    paths = _deploy_dotted_paths()
    assert {
        "specctl_vllm.engine_patch.scheduler.SpecctlScheduler",
        "specctl_vllm.engine_patch.scheduler.SpecctlAsyncScheduler",
        "specctl_vllm.engine_patch.middleware.CategoryMiddleware",
    } <= paths
    for dotted in paths:
        assert _defines(installed, dotted, ast.ClassDef), dotted


def test_base_install_pulls_neither_vllm_nor_torch(installed):
    """The controller image installs the package with its dependencies: they must stay light."""
    metadata = (_dist_info(installed) / "METADATA").read_text()
    base = [
        line.split(":", 1)[1].strip() for line in metadata.splitlines()
        if line.startswith("Requires-Dist:") and "extra ==" not in line
    ]
    assert base and not [r for r in base if re.match(r"(vllm|torch)\b", r)]


def test_distribution_name_and_commands(installed):
    """PyPI's `specctl` is another project: the wheel is `specctl-vllm`, with both command names."""
    info = _dist_info(installed)
    metadata = (info / "METADATA").read_text()
    assert "\nName: specctl-vllm\n" in metadata
    scripts = (info / "entry_points.txt").read_text().split("[console_scripts]", 1)[1].split("[", 1)[0]
    names = {line.split("=")[0].strip() for line in scripts.splitlines() if "=" in line}
    assert names == {"specctl", "specctl-vllm"}


def test_controller_image_caps_malloc_arenas():
    """The measured RSS bound of docs/reliability.md holds with at most 2 glibc arenas (the image's default)."""
    text = (DOCKER / "controller.Dockerfile").read_text()
    assert re.search(r"^ENV MALLOC_ARENA_MAX=2$", text, re.MULTILINE)
