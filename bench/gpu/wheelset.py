"""Select, trim and pack the wheels that bring vLLM 0.26 onto an offline GPU host.

The host's image already holds Python 3.12 with torch 2.11.0+cu130 and its CUDA libraries (vLLM 0.26 pins exactly
that torch), numpy/numba newer than vLLM's pins (they work), transformers/tokenizers/huggingface_hub recent enough for
vLLM 0.26. Everything else vLLM 0.26 resolves to is carried, minus what a Llama model on Hopper never loads.
Sub-commands (stdlib only, so it runs under any Python 3.11+):

  select REPORT        pip's ``install --dry-run --report`` JSON -> pinned ``name==version`` lines on stdout
  trim WHEEL...        drop unused members from wheels in place (idempotent)
  pack WHEELDIR PARTS  tar the wheels (sorted, fixed mtime), split into parts of --part-mib, sha256 manifest
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

PART_PREFIX = "vllm026-wheels.tar.part"
MANIFEST = "MANIFEST.sha256"


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


def pack(wheel_dir: Path, parts_dir: Path, part_mib: int) -> list[Path]:
    """One deterministic tar of the wheels, split into ``parts_dir/NN/`` folders (one per device call).

    Each folder also gets the manifest (sha256 of the whole tar and of every part), so any single folder that
    reaches the host can be checked on its own.
    """
    wheels = sorted(wheel_dir.glob("*.whl"))
    if not wheels:
        raise SystemExit(f"no wheels in {wheel_dir}")
    shutil.rmtree(parts_dir, ignore_errors=True)
    parts_dir.mkdir(parents=True)
    tar_path = parts_dir / "vllm026-wheels.tar"
    with tarfile.open(tar_path, "w", format=tarfile.PAX_FORMAT) as tar:
        for whl in wheels:
            tar.add(whl, arcname=f"wheels/{whl.name}", filter=_reset)
    size = part_mib << 20
    parts: list[Path] = []
    with tar_path.open("rb") as fh:
        for index, block in enumerate(iter(lambda: fh.read(size), b"")):
            folder = parts_dir / f"{index:02d}"
            folder.mkdir()
            part = folder / f"{PART_PREFIX}{index:02d}"
            part.write_bytes(block)
            parts.append(part)
    lines = [f"{sha256(tar_path)}  vllm026-wheels.tar"] + [f"{sha256(p)}  {p.name}" for p in parts]
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
    found = {p.name: p for p in parts_dir.rglob(f"{PART_PREFIX}*")}
    want = sorted(n for n in expected if n.startswith(PART_PREFIX))
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
    p = sub.add_parser("trim")
    p.add_argument("wheels", type=Path, nargs="+")
    p = sub.add_parser("pack")
    p.add_argument("wheel_dir", type=Path)
    p.add_argument("parts_dir", type=Path)
    p.add_argument("--part-mib", type=int, default=44, help=
                   "part size in MiB (a device call carries 64 MiB with the checkout, ~15 MiB with its results)")
    p = sub.add_parser("verify")
    p.add_argument("parts_dir", type=Path)
    args = parser.parse_args(argv)
    if args.cmd == "select":
        print("\n".join(select(json.loads(args.report.read_text()))))
    elif args.cmd == "trim":
        for whl in args.wheels:
            dropped = trim_wheel(whl)
            tops = sorted({"/".join(d.split("/")[:3]) for d in dropped})
            print(f"{whl.name}: dropped {len(dropped)} members under " + ", ".join(tops))
    elif args.cmd == "pack":
        for part in pack(args.wheel_dir, args.parts_dir, args.part_mib):
            print(f"{part}  {part.stat().st_size / 2**20:.1f} MiB")
    elif args.cmd == "verify":
        return verify(args.parts_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
