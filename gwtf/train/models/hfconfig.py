"""What a Hugging Face `config.json` says about a model, as the keys of a job's [model] table.

Pure: standard library only, no torch, no gwtf imports, so the job file reader
(`gwtf.train.job`) can fill a [model] table in from a folder without loading anything else.
`gwtf.train.models.hf` reads and writes the weights.

Supported, each with the numbers gwtf's own blocks compute (`gwtf.train.models.builtin`):

- `model_type = "llama"` (`LlamaForCausalLM`): RMSNorm, SwiGLU with `hidden_act = "silu"`,
  rotary positions of the default kind (`rope_theta`), grouped-query attention
  (`num_key_value_heads`), no biases, head tied to the embedding or not.
- `model_type = "gpt2"` (`GPT2LMHeadModel`): LayerNorm, GELU MLP (`activation_function` `gelu`,
  or the tanh approximation `gelu_new`, `gelu_pytorch_tanh`, `gelu_fast`), learned positions
  (`n_positions`), biases, head tied to the embedding (GPT-2's default) or not.

Refused, each with one sentence: any other `model_type` or architecture, LLaMA attention or MLP
biases, another activation, a `head_dim` other than `hidden_size / num_attention_heads`, rotary
scaling (`rope_scaling`, a `rope_type` other than `default`), GPT-2 attention without the
`1/sqrt(head_dim)` scale or scaled by layer index, cross-attention. A key that `config.json`
leaves out has the value transformers gives it (the defaults of `LlamaConfig`, `GPT2Config`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = [
    "CONFIG_FILE",
    "GPT2_ACTIVATIONS",
    "HFConfigError",
    "SUPPORTED",
    "model_keys",
    "read_config",
    "tied_head",
]

CONFIG_FILE = "config.json"
# model_type -> the causal-LM class gwtf trains, and the [model] kind it becomes.
SUPPORTED: Mapping[str, tuple[str, str]] = {
    "llama": ("LlamaForCausalLM", "llama"),
    "gpt2": ("GPT2LMHeadModel", "gpt"),
}
# GPT-2's activation_function -> gwtf's model.activation.
GPT2_ACTIVATIONS: Mapping[str, str] = {
    "gelu": "gelu",
    "gelu_new": "gelu-tanh",
    "gelu_pytorch_tanh": "gelu-tanh",
    "gelu_fast": "gelu-tanh",
}


class HFConfigError(ValueError):
    """A `config.json` gwtf cannot read or does not support; the message is one sentence."""


def _supported_text() -> str:
    return " and ".join(f"{t} ({cls})" for t, (cls, _) in SUPPORTED.items())


def read_config(folder: str | Path) -> dict[str, Any]:
    """The parsed `config.json` of a Hugging Face model folder."""
    path = Path(folder) / CONFIG_FILE
    if not Path(folder).is_dir():
        what = "is not a folder" if Path(folder).exists() else "does not exist"
        raise HFConfigError(
            f"{folder} {what}; give a Hugging Face model folder (config.json and "
            "model.safetensors)"
        )
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise HFConfigError(
            f"{folder} holds no {CONFIG_FILE}; give a Hugging Face model folder (config.json "
            "and model.safetensors)"
        ) from None
    except (OSError, UnicodeDecodeError) as err:
        reason = getattr(err, "strerror", None) or err
        raise HFConfigError(f"cannot read {path}: {reason}") from None
    try:
        config = json.loads(text)
    except ValueError as err:
        raise HFConfigError(f"{path} is not valid JSON: {err}") from None
    if not isinstance(config, dict):
        raise HFConfigError(f"{path} is not a JSON object")
    return config


def _get(config: Mapping[str, Any], where: str, key: str, kind: type, default: Any) -> Any:
    value = config.get(key, default)
    if value is None:
        return default
    ok = (
        isinstance(value, int) and not isinstance(value, bool)
        if kind is int
        else isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
        if kind is float
        else isinstance(value, kind)
    )
    if not ok:
        raise HFConfigError(f"{where}: {key} must be {_KIND_NAMES[kind]}, got {value!r}")
    return float(value) if kind is float else value


_KIND_NAMES = {int: "an integer", float: "a finite number", bool: "true or false", str: "a string"}


def _model_type(config: Mapping[str, Any], where: str) -> str:
    model_type = config.get("model_type")
    if not isinstance(model_type, str) or model_type not in SUPPORTED:
        what = f"a {model_type!r} model" if isinstance(model_type, str) else "no model_type"
        raise HFConfigError(f"{where} describes {what}; gwtf trains {_supported_text()} models")
    architectures = config.get("architectures")
    wanted = SUPPORTED[model_type][0]
    if isinstance(architectures, list) and architectures and wanted not in architectures:
        raise HFConfigError(
            f"{where} is a {', '.join(map(str, architectures))}; gwtf trains causal language "
            f"models: {_supported_text()}"
        )
    return str(model_type)


def tied_head(config: Mapping[str, Any], where: str = CONFIG_FILE) -> bool:
    """Whether the LM head is the token embedding (`tie_word_embeddings`; GPT-2's default)."""
    default = _model_type(config, where) == "gpt2"
    return bool(_get(config, where, "tie_word_embeddings", bool, default))


def model_keys(config: Mapping[str, Any], where: str = CONFIG_FILE) -> dict[str, Any]:
    """The [model] keys `config` fixes: kind, layers, width, heads, kv_heads, mlp_hidden, vocab,
    norm_eps, rope_theta (llama), activation and positions. The job adds seq_len and dropout.
    `where` names the file in messages."""
    model_type = _model_type(config, where)
    if model_type == "llama":
        return _llama_keys(config, where)
    return _gpt2_keys(config, where)


def _llama_keys(config: Mapping[str, Any], where: str) -> dict[str, Any]:
    width = _get(config, where, "hidden_size", int, 4096)
    heads = _get(config, where, "num_attention_heads", int, 32)
    act = _get(config, where, "hidden_act", str, "silu")
    if act != "silu":
        raise HFConfigError(f"{where}: hidden_act is {act!r}; gwtf's LLaMA MLP is SwiGLU with silu")
    for key in ("attention_bias", "mlp_bias"):
        if _get(config, where, key, bool, False):
            raise HFConfigError(f"{where}: {key} is true; gwtf's LLaMA blocks have no biases")
    head_dim = _get(config, where, "head_dim", int, None)
    if head_dim is not None and heads > 0 and head_dim * heads != width:
        raise HFConfigError(
            f"{where}: head_dim is {head_dim}, not hidden_size / num_attention_heads "
            f"({width} / {heads}); gwtf supports only that head size"
        )
    return {
        "kind": "llama",
        "layers": _get(config, where, "num_hidden_layers", int, 32),
        "width": width,
        "heads": heads,
        "kv_heads": _get(config, where, "num_key_value_heads", int, heads),
        "mlp_hidden": _get(config, where, "intermediate_size", int, 11008),
        "vocab": _get(config, where, "vocab_size", int, 32000),
        "norm_eps": _get(config, where, "rms_norm_eps", float, 1e-6),
        "rope_theta": _rope_theta(config, where),
        "activation": "silu",
        "positions": _get(config, where, "max_position_embeddings", int, 2048),
    }


def _rope_theta(config: Mapping[str, Any], where: str) -> float:
    """`rope_parameters.rope_theta` (transformers 5) or `rope_theta` (before); default rotary
    positions only."""
    scaling = config.get("rope_scaling")
    if scaling is not None and not (
        isinstance(scaling, dict) and scaling.get("rope_type", scaling.get("type")) == "default"
    ):
        raise HFConfigError(
            f"{where}: rope_scaling is set ({scaling!r}); gwtf supports default rotary "
            "positions only"
        )
    theta: float = _get(config, where, "rope_theta", float, 10000.0)
    parameters = config.get("rope_parameters")
    if parameters is not None:
        if not isinstance(parameters, dict):
            raise HFConfigError(f"{where}: rope_parameters must be an object, got {parameters!r}")
        rope_type = parameters.get("rope_type", "default")
        if rope_type != "default":
            raise HFConfigError(
                f"{where}: rope_parameters.rope_type is {rope_type!r}; gwtf supports default "
                "rotary positions only"
            )
        theta = _get(parameters, f"{where} rope_parameters", "rope_theta", float, theta)
    return theta


def _gpt2_keys(config: Mapping[str, Any], where: str) -> dict[str, Any]:
    width = _get(config, where, "n_embd", int, 768)
    act = _get(config, where, "activation_function", str, "gelu_new")
    if act not in GPT2_ACTIVATIONS:
        raise HFConfigError(
            f"{where}: activation_function is {act!r}; gwtf's GPT MLP supports "
            f"{', '.join(GPT2_ACTIVATIONS)}"
        )
    if not _get(config, where, "scale_attn_weights", bool, True):
        raise HFConfigError(
            f"{where}: scale_attn_weights is false; gwtf's attention always scales by "
            "1/sqrt(head size)"
        )
    for key, what in (
        ("scale_attn_by_inverse_layer_idx", "attention scaled by layer index"),
        ("add_cross_attention", "cross-attention"),
    ):
        if _get(config, where, key, bool, False):
            raise HFConfigError(f"{where}: {key} is true; gwtf's GPT blocks have no {what}")
    inner = _get(config, where, "n_inner", int, None)
    return {
        "kind": "gpt",
        "layers": _get(config, where, "n_layer", int, 12),
        "width": width,
        "heads": _get(config, where, "n_head", int, 12),
        "mlp_hidden": inner if inner is not None else 4 * width,
        "vocab": _get(config, where, "vocab_size", int, 50257),
        "norm_eps": _get(config, where, "layer_norm_epsilon", float, 1e-5),
        "activation": GPT2_ACTIVATIONS[act],
        "positions": _get(config, where, "n_positions", int, 1024),
    }
