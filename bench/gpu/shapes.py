"""Model shapes and acceptance profiles of the GPU benchmarks (pure data, no vLLM import).

The target is shaped like Llama-3-8B and the draft like a 4-layer, hidden-2048 Llama of the same vocabulary, both
with random weights (``load_format="dummy"``, only a config.json on disk): the step costs are those of the real
shapes while acceptance is set exactly by vLLM's synthetic rejection sampler, per-position unconditional rates
``p_i = beta**(i+1)``. The steady-load benchmark (``steady.py``, model runner V2) drafts with an EAGLE-3 head
instead (role ``eagle3``). ``tiny`` shapes exist only so that the harness can be exercised on a CPU.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

PROMPT_TOKENS = 256
OUTPUT_TOKENS = 128
CONCURRENCY = (1, 4, 16, 64, 256)
#: Synthetic acceptance profiles: per-position unconditional acceptance beta**(i+1).
PROFILES = {"high": 0.85, "low": 0.45}
#: Engine-wide proposal length specctl may use (it picks k <= K_MAX per category and per request).
K_MAX = 7


@dataclass(frozen=True)
class LlamaShape:
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int

    def config(self) -> dict:
        return {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            **asdict(self),
            "max_position_embeddings": 8192,
            "rms_norm_eps": 1e-5,
            "rope_theta": 500000.0,
            "hidden_act": "silu",
            "tie_word_embeddings": False,
            "torch_dtype": "bfloat16",
            "bos_token_id": 1,
            "eos_token_id": 2,
        }


SHAPES = {
    "8b": {
        "target": LlamaShape(4096, 14336, 32, 32, 8, 128256),
        "draft": LlamaShape(2048, 8192, 4, 16, 8, 128256),
        # EAGLE-3 head of the target (model runner V2 benchmarks): one decoder layer of the target's width, heads
        # and vocabulary, fed the target's hidden states.
        "eagle3": LlamaShape(4096, 14336, 1, 32, 8, 128256),
    },
    # CPU smoke test of the harness only: tiny, same structure.
    "tiny": {
        "target": LlamaShape(256, 512, 2, 4, 2, 4096),
        "draft": LlamaShape(128, 256, 1, 2, 1, 4096),
        "eagle3": LlamaShape(256, 512, 1, 4, 2, 4096),
    },
}
#: The other drafters of model runner V2 in vLLM 0.26 (issue 16's smoke rows), read from its sources
#: (``config/speculative.py``, ``model_executor/models/{mimo,mimo_mtp,qwen3_dflash,qwen3_dspark}.py``):
#: * ``mimo``: the target with one native MTP layer. MiMo is the only dense, plain-attention family with MTP heads
#:   0.26 runs (the others need MoE or MLA kernels the carried wheel set leaves out, or are hybrid); its blocks are
#:   Qwen2's (qkv bias), the shape the 8B target's. transformers has no ``mimo`` type, so ``qwen2`` with vLLM's
#:   architecture name. One layer: MiMo's MTP module only ever runs layer 0 (it runs K times for K drafts).
#: * ``dflash`` / ``dspark``: parallel (block) drafters on a Qwen3 backbone of the target's width and vocabulary
#:   (they share its embedding and head), fed the target's hidden states after ``target_layer_ids`` + 1; 5 layers,
#:   as the public Qwen3-8B drafts. DSpark reads its own ``target_layer_ids`` (as many as its layers) and a Markov
#:   head of rank ``markov_rank``. Both need a mask token for the block's placeholders.
#: Gemma-4's MTP assistant is in 0.26 too, but its target config does not load with the carried transformers
#: (5.17: "'head_dim' is a per-layer attribute"), so it is not a role here.
MTP_LAYERS = 1
PARALLEL_DRAFT_LAYERS = {"8b": 5, "tiny": 1}
TARGET_LAYER_IDS = {"8b": [1, 8, 16, 23, 29], "tiny": [0]}
MASK_TOKEN = {"8b": 128255, "tiny": 4095}
MARKOV_RANK = {"8b": 256, "tiny": 16}
#: The proposal method each draft role is started with (vLLM re-detects the method from a folder name holding
#: ``eagle3``, ``dflash`` or ``dspark``: the folders are named after the role, so it finds the same).
ROLE_OF_METHOD = {"eagle3": "eagle3", "draft_model": "draft", "mtp": "mimo", "dflash": "dflash", "dspark": "dspark"}
#: vLLM's architecture name for a Llama EAGLE-3 head (``LlamaForCausalLMEagle3`` -> ``Eagle3LlamaForCausalLM``).
EAGLE3_ARCHITECTURE = "LlamaForCausalLMEagle3"
#: The head reads the target's hidden states after three layers by default, (2, L/2, L-3): a 2-layer tiny target
#: has only one of them to give, so the tiny head is told to read one (the 8B keeps vLLM's default).
EAGLE3_AUX = {"tiny": {"eagle_aux_hidden_state_layer_ids": [1], "num_aux_hidden_states": 1}}


def model_config(shape: str, role: str) -> dict:
    """config.json of one role of a shape; the EAGLE-3 head keeps the full vocabulary (no draft vocab map)."""
    if role in ("mimo", "dflash", "dspark"):
        return _other_drafter_config(shape, role)
    config = SHAPES[shape][role].config()
    if role == "eagle3":
        config["architectures"] = [EAGLE3_ARCHITECTURE]
        config["draft_vocab_size"] = config["vocab_size"]
        config["target_hidden_size"] = SHAPES[shape]["target"].hidden_size
        config.update(EAGLE3_AUX.get(shape, {}))
    return config


def _other_drafter_config(shape: str, role: str) -> dict:
    target = SHAPES[shape]["target"]
    config = target.config()
    if role == "mimo":
        config.update({"architectures": ["MiMoForCausalLM"], "model_type": "qwen2",
                       "num_nextn_predict_layers": MTP_LAYERS, "use_sliding_window": False,
                       "max_window_layers": target.num_hidden_layers})
        return config
    layers = PARALLEL_DRAFT_LAYERS[shape]
    config.update({"model_type": "qwen3", "num_hidden_layers": layers,
                   "head_dim": target.hidden_size // target.num_attention_heads, "attention_bias": False,
                   "target_hidden_size": target.hidden_size})
    ids = TARGET_LAYER_IDS[shape][:layers] if role == "dspark" else TARGET_LAYER_IDS[shape]
    if role == "dflash":
        config["architectures"] = ["DFlashDraftModel"]
        config["dflash_config"] = {"mask_token_id": MASK_TOKEN[shape], "target_layer_ids": ids}
    else:
        config.update({"architectures": ["Qwen3DSparkModel"], "target_layer_ids": ids,
                       "mask_token_id": MASK_TOKEN[shape], "markov_rank": MARKOV_RANK[shape]})
    return config


def write_model(root: Path, shape: str, role: str) -> Path:
    """The config.json folder of one role (weights are dummy: vLLM initialises them)."""
    folder = root / f"{shape}-{role}"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(model_config(shape, role), indent=1))
    return folder


def acceptance_rates(beta: float, k: int) -> list[float]:
    return [round(beta ** (i + 1), 6) for i in range(k)]
