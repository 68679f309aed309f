"""The GPU host's wheel set: what is carried against the image's package list, a wheel's own requirements, sizes."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from bench.gpu import wheelset


def item(name: str, version: str, *requires: str) -> dict:
    return {"metadata": {"name": name, "version": version, "requires_dist": list(requires)}}


REPORT = {"install": [
    item("torch", "2.14.0", "triton==3.8.0", 'cuda-toolkit[cublas]==13.0.3; platform_system == "Linux"'),
    item("triton", "3.8.0"),
    item("cuda-toolkit", "13.0.3", 'nvidia-cublas==13.1.1.3; extra == "cublas"', 'nvidia-cufft==12.0.0.61; extra == "cufft"'),
    item("nvidia-cublas", "13.1.1.3"),
    item("nvidia-cufft", "12.0.0.61"),
    item("tokenizers", "0.23.3"),
    item("anyio", "4.16.0"),
    item("numba", "0.65.0", "numpy<2.4"),
    item("numpy", "2.3.5"),
    item("transformers", "5.22.2", "tokenizers>=0.23"),
    item("tilelang", "0.1.12"),
]}
IMAGE = {"torch": "2.11.0", "triton": "3.6.0", "nvidia-cublas": "13.1.0.3", "nvidia-cufft": "12.0.0.61",
         "tokenizers": "0.23.2", "anyio": "4.15.1", "numba": "0.68.0", "numpy": "2.5.2", "transformers": "5.17.0"}
ROOT = ["torch==2.14.0", "tokenizers>=0.23.3", "numba==0.65.0", "transformers<5.23,>=5.16.1", "anyio"]


@pytest.mark.parametrize(
    ("name", "carried", "why"),
    [
        ("torch", True, None),  # the image's 2.11.0 is excluded by ==2.14.0
        ("triton", True, None),  # torch's own pin
        ("nvidia-cublas", True, None),  # pinned through the cublas extra torch asks of cuda-toolkit
        ("nvidia-cufft", False, "meets every requirement"),  # the cufft extra is not asked for, and the image matches
        ("tokenizers", True, None),  # vLLM's >=0.23.3 excludes the image's 0.23.2
        ("anyio", False, "meets every requirement"),  # unpinned: the image's older one serves
        ("numba", False, "newer than the pinned"),  # excluded by ==0.65.0, but newer: kept as for 0.26
        ("numpy", False, "newer than the pinned"),
        ("transformers", True, "huggingface-hub<2.0"),  # its own requirements conflict (IMAGE_CONFLICTS)
        ("tilelang", False, None),  # trimmed: never loaded for a Llama model on Hopper
        ("cuda-toolkit", True, None),  # absent from the image
    ],
)
def test_select_against_image(name: str, carried: bool, why: str | None) -> None:
    pins, kept = wheelset.select_against_image(REPORT, IMAGE, ROOT)
    assert any(p.startswith(f"{name}==") for p in pins) is carried
    if why is not None:
        assert any(line.startswith(f"{name}:") and why in line for line in kept)


def test_read_pip_list_canonicalises_names() -> None:
    assert wheelset.read_pip_list("# x\nHuggingFace_Hub==1.33.0\nnumpy==2.5.2\n\n") == {
        "huggingface-hub": "1.33.0", "numpy": "2.5.2"}


METADATA = """Name: vllm
Version: 0.34.0
Requires-Dist: torch==2.14.0
Requires-Dist: flashinfer-python==0.7.3
Requires-Dist: six>=1.16.0; python_version > "3.11"
Requires-Dist: protobuf==7.36.1; platform_machine == "s390x"
Requires-Dist: pandas; extra == "bench"
"""


def test_wheel_requires_evaluates_markers_and_overrides(tmp_path: Path) -> None:
    wheel = tmp_path / "vllm-0.34.0-cp38-abi3-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("vllm-0.34.0.dist-info/METADATA", METADATA)
    assert wheelset.wheel_requires(wheel, {"flashinfer_python": "0.7.4"}) == [
        "torch==2.14.0", "flashinfer-python==0.7.4", "six>=1.16.0"]


def test_sizes_and_parts(tmp_path: Path) -> None:
    (tmp_path / "a-1-py3-none-any.whl").write_bytes(b"x" * (3 << 20))
    (tmp_path / "b-1-py3-none-any.whl").write_bytes(b"x" * (2 << 20))
    wheels, total, parts = wheelset.sizes(tmp_path, part_mib=2)
    assert [name for name, _ in wheels] == ["a-1-py3-none-any.whl", "b-1-py3-none-any.whl"]
    assert total == 5 << 20 and parts == 3  # 5 MiB plus tar headers: three parts of 2 MiB


def test_pack_names_the_parts_and_verify_finds_them(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / "a-1-py3-none-any.whl").write_bytes(b"y" * (3 << 20))
    parts = wheelset.pack(wheels, tmp_path / "parts", part_mib=1, name="vllm034")
    assert [p.name for p in parts][:2] == ["vllm034-wheels.tar.part00", "vllm034-wheels.tar.part01"]
    assert wheelset.verify(tmp_path / "parts") == 0
    parts[1].write_bytes(b"broken")
    assert wheelset.verify(tmp_path / "parts") == 1
