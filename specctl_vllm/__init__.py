"""The import namespace of the ``specctl-vllm`` distribution: ``specctl_vllm.controller`` (the controller
service, CLI and policy) and ``specctl_vllm.engine_patch`` (the vLLM scheduler subclass, middleware and plugin).

In the repository the code lives in the top-level folders ``controller/`` and ``engine_patch/``; the two entries
here are relative symlinks to them, so the repository keeps its shape while the wheel installs one top-level
package instead of two generic names (docs/packaging.md). Import only through this namespace: importing
``controller.x`` beside ``specctl_vllm.controller.x`` would load every module, and every class, twice.

Not named ``specctl``: PyPI's unrelated ``specctl`` distribution installs a top-level ``specctl`` package.
"""
