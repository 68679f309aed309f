"""Select, trim and pack the wheels that bring vLLM 0.26 (or 0.34, ``--image``) onto an offline GPU host.

The host's image already holds Python 3.12 with torch 2.11.0+cu130 and its CUDA libraries (vLLM 0.26 pins exactly
that torch), numpy/numba newer than vLLM's pins (they work), transformers/tokenizers/huggingface_hub recent enough for
vLLM 0.26. Everything else vLLM 0.26 resolves to is carried, minus what a Llama model on Hopper never loads.
Sub-commands (stdlib, plus packaging or the copy pip vendors, so it runs under any Python 3.11+ with pip):

  select REPORT        pip's ``install --dry-run --report`` JSON -> pinned ``name==version`` lines on stdout;
                       with ``--image PIPLIST`` (the host's ``pip list --format=freeze``) the image is read, not
                       assumed: a package is left out where the image's version meets every requirement on it
  requires WHEEL       a wheel's requirements for CPython 3.12 on Linux x86_64, one a line (``--override`` pins)
  trim WHEEL...        drop unused members from wheels in place (idempotent)
  pack WHEELDIR PARTS  tar the wheels (sorted, fixed mtime), split into parts of --part-mib, sha256 manifest
  sizes WHEELDIR       every wheel's MB, the total, and the parts of --part-mib it makes
  verify PARTS         check a joined tar against the manifest (used on the host by install.sh)
"""

from __future__ import annotations

import argparse
import fnmatch
import hashlib
import json
import re
import shutil
import sys
import tarfile
import zipfile
from pathlib import Path

#: Distributions the host image already provides at versions that satisfy vLLM 0.26 (checked by install.sh there).
IMAGE_PROVIDED = {
    # torch 2.11.0+cu130 and the CUDA wheels it was installed with (vLLM 0.26 pins torch==2.11.0)
    "torch", "torchaudio", "torchvision", "triton", "cuda-toolkit",
    "nvidia-cublas", "nvidia-cuda-cupti", "nvidia-cuda-nvrtc", "nvidia-cuda-runtime", "nvidia-cudnn-cu13",
    "nvidia-cufft", "nvidia-cufile", "nvidia-curand", "nvidia-cusolver", "nvidia-cusparse", "nvidia-cusparselt-cu13",
    "nvidia-nccl-cu13", "nvidia-nvjitlink", "nvidia-nvshmem-cu13", "nvidia-nvtx",
    # newer than vLLM's pins and working with it (numba 0.65 / llvmlite pinned by vLLM are older than the image's)
    "numpy", "numba", "llvmlite",
    # transformers 5.17 >= 5.5.3, tokenizers 0.23.2 >= 0.21.1, safetensors 0.8.0 >= 0.6.2 on the image
    "transformers", "tokenizers", "huggingface-hub", "hf-xet", "safetensors", "sentencepiece", "tiktoken",
    # only multimodal (image/video) inputs import it; the image has a build
    "opencv-python-headless",
    # installed with the image's torch (sympy, networkx, mpmath, cuda-bindings>=13.0.3,<14) or its Pillow/uvloop;
    # vLLM 0.26 pins none of them tighter than the image satisfies
    "sympy", "networkx", "mpmath", "cuda-bindings", "cuda-core", "cuda-pathfinder", "pillow", "uvloop",
    # only the OTLP/gRPC trace exporter imports it, and only when tracing is configured
    "grpcio",
}

#: Resolved by vLLM 0.26 but never loaded for a Llama-family model on Hopper (SM90, FA3 attention).
TRIMMED = {
    "tokenspeed-mla", "tokenspeed-triton",  # MLA kernels for DeepSeek-style attention
    "pynvvideocodec", "torchcodec",  # video decoders
    "tilelang", "z3-solver",  # tilelang kernels (sparse MLA) and their solver
    "nvidia-cuda-nvcc", "nvidia-nvvm", "nvidia-cuda-crt",  # compiler toolchain: flashinfer JIT, disabled on the host
    "nvidia-cutlass-dsl-libs-cu12",  # CUDA 12 build of the CUTLASS DSL; the host runs CUDA 13
}

#: Members of the vllm wheel a Llama model on SM90 never loads (FA2 is used below SM90 only, FA3 on Hopper).
VLLM_WHEEL_DROP = (
    "vllm/vllm_flash_attn/_vllm_fa2_C*.so",  # FlashAttention 2: below SM90 only
    "vllm/vllm-rs",  # Rust front-end binary; the offline LLM and the Python server do not use it
    "vllm/third_party/deep_gemm/_C.cpython-31[0134]-*.so",  # builds for other Pythons; the host runs 3.12
    "vllm/_moe_C_stable_libtorch.abi3.so",  # MoE kernels; imported under contextlib.suppress(ImportError)
    "vllm/third_party/fmha_sm100/*",  # Blackwell (SM100) attention sources
)

#: Kept from the image where its version is newer than the one vLLM pins: vLLM 0.26 runs with them on the host
#: (install.sh's check_deps lists the pins it breaks); the same holds them for later releases until measured.
IMAGE_NEWER_KEPT = {"numpy", "numba", "llvmlite"}

#: Carried although the image's version meets the resolved set's requirements: the image package's own
#: requirements exclude what the set carries (read from its wheel; the report holds only the resolved version's).
IMAGE_CONFLICTS = {
    "transformers": "the image's 5.17.0 requires huggingface-hub<2.0; vLLM 0.34 requires huggingface_hub>=2.0.0",
}

PART_PREFIX = "vllm026-wheels.tar.part"
MANIFEST = "MANIFEST.sha256"
#: The environment the host's Python evaluates requirement markers in.
HOST_MARKERS = {"python_version": "3.12", "python_full_version": "3.12.3", "platform_machine": "x86_64",
                "platform_system": "Linux", "sys_platform": "linux", "implementation_name": "cpython",
                "platform_python_implementation": "CPython", "os_name": "posix"}


def _packaging():
    """``packaging``'s requirement and version classes (pip vendors them, so any Python with pip has them)."""
    try:
        from packaging.requirements import Requirement
        from packaging.version import Version
    except ImportError:  # pragma: no cover - only where packaging itself is not installed
        from pip._vendor.packaging.requirements import Requirement
        from pip._vendor.packaging.version import Version
    return Requirement, Version


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def select(report: dict) -> list[str]:
    """Pinned requirement lines for every resolved distribution the host lacks and the model path loads."""
    pins = []
    for item in report["install"]:
        meta = item["metadata"]
        name = canonical(meta["name"])
        if name in IMAGE_PROVIDED or name in TRIMMED:
            continue
        pins.append(f"{name}=={meta['version']}")
    return sorted(pins)


def read_pip_list(text: str) -> dict[str, str]:
    """``name==version`` lines (``pip list --format=freeze``) -> canonical name -> version."""
    out = {}
    for line in text.splitlines():
        if "==" in line and not line.lstrip().startswith("#"):
            name, version = line.strip().split("==", 1)
            out[canonical(name)] = version.strip()
    return out


def requirements_on(report: dict, root: list[str] = ()) -> dict[str, list]:
    """Canonical name -> every requirement the resolved set and the ``root`` requirement lines (what was resolved,
    markers already evaluated) place on it (markers evaluated for the host, each distribution's own extras as
    resolved)."""
    Requirement, _ = _packaging()
    extras: dict[str, set[str]] = {}
    parsed = [("", Requirement(line)) for line in root if line.strip() and not line.lstrip().startswith("#")]
    for _, req in parsed:
        extras.setdefault(canonical(req.name), set()).update(req.extras)
    for item in report["install"]:
        meta = item["metadata"]
        for raw in meta.get("requires_dist") or []:
            req = Requirement(raw)
            parsed.append((canonical(meta["name"]), req))
            if not req.marker or req.marker.evaluate({**HOST_MARKERS, "extra": ""}):
                extras.setdefault(canonical(req.name), set()).update(req.extras)
    out: dict[str, list] = {}
    for owner, req in parsed:
        wanted = {""} | extras.get(owner, set())
        if req.marker and not any(req.marker.evaluate({**HOST_MARKERS, "extra": e}) for e in wanted):
            continue
        out.setdefault(canonical(req.name), []).append(req)
    return out


def select_against_image(report: dict, image: dict[str, str],
                         root: list[str] = ()) -> tuple[list[str], list[str]]:
    """(pins to carry, lines saying why each image package is used instead), for a resolved set and the host's
    packages: carried is what the image lacks, or has at a version one of the set's requirements excludes
    (:data:`IMAGE_NEWER_KEPT` excepted where the image's is newer), minus :data:`TRIMMED`."""
    _, Version = _packaging()
    needs = requirements_on(report, root)
    pins, kept = [], []
    for item in report["install"]:
        meta = item["metadata"]
        name, version = canonical(meta["name"]), meta["version"]
        if name in TRIMMED:
            continue
        have = image.get(name)
        if have is not None and name in IMAGE_CONFLICTS:
            kept.append(f"{name}: carried, not the image's {have}: {IMAGE_CONFLICTS[name]}")
        elif have is not None:
            excluded = [str(r.specifier) for r in needs.get(name, []) if not r.specifier.contains(have, prereleases=True)]
            if not excluded:
                kept.append(f"{name}: image {have} meets every requirement (resolved {version})")
                continue
            if name in IMAGE_NEWER_KEPT and Version(have) > Version(version):
                kept.append(f"{name}: image {have} newer than the pinned {version}, kept")
                continue
        pins.append(f"{name}=={version}")
    return sorted(pins), sorted(kept)


def wheel_requires(path: Path, overrides: dict[str, str] | None = None) -> list[str]:
    """A wheel's requirements for the host (markers evaluated, extras dropped), ``overrides`` replacing a pin by
    ``name==version`` (a pin PyPI cannot satisfy)."""
    Requirement, _ = _packaging()
    overrides = {canonical(k): v for k, v in (overrides or {}).items()}
    with zipfile.ZipFile(path) as archive:
        meta_name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        text = archive.read(meta_name).decode()
    lines = []
    for line in text.splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        req = Requirement(line.split(":", 1)[1].strip())
        if req.marker and not req.marker.evaluate({**HOST_MARKERS, "extra": ""}):
            continue
        name = canonical(req.name)
        if name in overrides:
            lines.append(f"{name}=={overrides[name]}")
            continue
        req.marker = None
        lines.append(str(req))
    return lines


def sizes(wheel_dir: Path, part_mib: int) -> tuple[list[tuple[str, int]], int, int]:
    """(wheel name, bytes) largest first, the total bytes, and the parts of ``part_mib`` MiB the tar of them needs
    (tar headers and padding: 512 bytes a member plus rounding, well under a part)."""
    wheels = sorted(((w.name, w.stat().st_size) for w in wheel_dir.glob("*.whl")), key=lambda x: -x[1])
    total = sum(size for _, size in wheels)
    tar_bytes = sum(512 + -(-size // 512) * 512 for _, size in wheels) + 1024
    return wheels, total, -(-tar_bytes // (part_mib << 20))


def trim_wheel(path: Path, patterns: tuple[str, ...] = VLLM_WHEEL_DROP) -> list[str]:
    """Rewrite ``path`` without members matching ``patterns``; returns the dropped names (empty: untouched)."""
    with zipfile.ZipFile(path) as src:
        infos = src.infolist()
        drop = [i.filename for i in infos if any(fnmatch.fnmatch(i.filename, p) for p in patterns)]
        if not drop:
            return []
        tmp = path.with_suffix(".tmp")
        with zipfile.ZipFile(tmp, "w") as dst:
            for info in infos:
                if info.filename in drop:
                    continue
                if info.filename.endswith(".dist-info/RECORD"):
                    record = src.read(info).decode().splitlines()
                    kept = [r for r in record if r.split(",", 1)[0] not in drop]
                    dst.writestr(info, "\n".join(kept) + "\n", compress_type=info.compress_type)
                    continue
                with src.open(info) as fin, dst.open(info, "w") as fout:
                    shutil.copyfileobj(fin, fout, 1 << 20)
    tmp.replace(path)
    return drop


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def _reset(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
    return info


def pack(wheel_dir: Path, parts_dir: Path, part_mib: int, name: str = "vllm026") -> list[Path]:
    """One deterministic tar of the wheels, split into ``parts_dir/NN/`` folders (one per device call).

    Each folder also gets the manifest (sha256 of the whole tar and of every part), so any single folder that
    reaches the host can be checked on its own.
    """
    wheels = sorted(wheel_dir.glob("*.whl"))
    if not wheels:
        raise SystemExit(f"no wheels in {wheel_dir}")
    shutil.rmtree(parts_dir, ignore_errors=True)
    parts_dir.mkdir(parents=True)
    tar_path = parts_dir / f"{name}-wheels.tar"
    with tarfile.open(tar_path, "w", format=tarfile.PAX_FORMAT) as tar:
        for whl in wheels:
            tar.add(whl, arcname=f"wheels/{whl.name}", filter=_reset)
    size = part_mib << 20
    parts: list[Path] = []
    with tar_path.open("rb") as fh:
        for index, block in enumerate(iter(lambda: fh.read(size), b"")):
            folder = parts_dir / f"{index:02d}"
            folder.mkdir()
            part = folder / f"{name}-wheels.tar.part{index:02d}"
            part.write_bytes(block)
            parts.append(part)
    lines = [f"{sha256(tar_path)}  {tar_path.name}"] + [f"{sha256(p)}  {p.name}" for p in parts]
    for part in parts:
        (part.parent / MANIFEST).write_text("\n".join(lines) + "\n")
    tar_path.unlink()
    return parts


def verify(parts_dir: Path) -> int:
    """Check every part found under ``parts_dir`` and the joined tar against the manifest; 0 when all match."""
    manifests = sorted(parts_dir.rglob(MANIFEST))
    if not manifests:
        print(f"no {MANIFEST} under {parts_dir}", file=sys.stderr)
        return 2
    expected = dict(reversed(line.split("  ", 1)) for line in manifests[0].read_text().splitlines() if line)
    found = {p.name: p for p in parts_dir.rglob("*-wheels.tar.part*")}
    want = sorted(n for n in expected if ".tar.part" in n)
    missing = [n for n in want if n not in found]
    bad = [n for n in want if n in found and sha256(found[n]) != expected[n]]
    for name in missing:
        print(f"missing part {name}", file=sys.stderr)
    for name in bad:
        print(f"sha256 mismatch {name}", file=sys.stderr)
    if missing or bad:
        return 1
    print(f"{len(want)} parts ok")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("select")
    p.add_argument("report", type=Path)
    p.add_argument("--image", type=Path, help="the host's `pip list --format=freeze` (read, not assumed)")
    p.add_argument("--root", type=Path, help="the requirement lines that were resolved (when the report's root, "
                   "such as a vLLM wheel installed with --no-deps, is not in it)")
    p = sub.add_parser("requires")
    p.add_argument("wheel", type=Path)
    p.add_argument("--override", action="append", default=[], metavar="NAME==VERSION",
                   help="replace the wheel's pin of NAME (repeatable)")
    p = sub.add_parser("trim")
    p.add_argument("wheels", type=Path, nargs="+")
    p = sub.add_parser("pack")
    p.add_argument("wheel_dir", type=Path)
    p.add_argument("parts_dir", type=Path)
    p.add_argument("--part-mib", type=int, default=44, help=
                   "part size in MiB (a device call carries 64 MiB with the checkout, ~15 MiB with its results)")
    p.add_argument("--name", default="vllm026", help="tar and part name prefix (vllm026, vllm034)")
    p = sub.add_parser("sizes")
    p.add_argument("wheel_dir", type=Path)
    p.add_argument("--part-mib", type=int, default=36)
    p = sub.add_parser("verify")
    p.add_argument("parts_dir", type=Path)
    args = parser.parse_args(argv)
    if args.cmd == "select" and args.image:
        root = args.root.read_text().splitlines() if args.root else []
        pins, kept = select_against_image(json.loads(args.report.read_text()), read_pip_list(args.image.read_text()),
                                          root)
        print("\n".join(pins))
        print("\n".join(f"image: {line}" for line in kept), file=sys.stderr)
    elif args.cmd == "select":
        print("\n".join(select(json.loads(args.report.read_text()))))
    elif args.cmd == "requires":
        bad = [o for o in args.override if "==" not in o]
        if bad:
            parser.error(f"--override takes NAME==VERSION, got {bad[0]!r}")
        print("\n".join(wheel_requires(args.wheel, dict(o.split("==", 1) for o in args.override))))
    elif args.cmd == "trim":
        for whl in args.wheels:
            dropped = trim_wheel(whl)
            tops = sorted({"/".join(d.split("/")[:3]) for d in dropped})
            print(f"{whl.name}: dropped {len(dropped)} members under " + ", ".join(tops))
    elif args.cmd == "pack":
        for part in pack(args.wheel_dir, args.parts_dir, args.part_mib, args.name):
            print(f"{part}  {part.stat().st_size / 2**20:.1f} MiB")
    elif args.cmd == "sizes":
        wheels, total, parts = sizes(args.wheel_dir, args.part_mib)
        for name, size in wheels:
            print(f"{size / 1e6:9.1f} MB  {name}")
        print(f"{total / 1e6:9.1f} MB  total, {len(wheels)} wheels ({total / 2**20:.0f} MiB): "
              f"{parts} parts of {args.part_mib} MiB")
    elif args.cmd == "verify":
        return verify(args.parts_dir)
    return 0

if __name__ == "__main__":
    sys.exit(main())
