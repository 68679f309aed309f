"""The GPU benchmark (vLLM on a GPU host); run from the repository root as ``python -m bench gpu.<name>``."""
