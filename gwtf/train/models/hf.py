"""Models from Hugging Face folders: a LLaMA or GPT-2 checkpoint in, trained as stages, and out.

A practitioner brings a folder that transformers' `save_pretrained` wrote: `config.json` and
`model.safetensors`, or shards `model-0000k-of-0000n.safetensors` with
`model.safetensors.index.json`. Nothing is downloaded and no pickle is read (safetensors only).
What `config.json` may say is in `gwtf.train.models.hfconfig`.

**Starting a job from it.** `[model] pretrained = "FOLDER"` (`gwtf.train.job`). Why in [model] and
not at the top of the job: the starting weights are part of the model, and `build_stage` is given
the model (`job.model`), so every place that builds a stage (a node, the reference, the warm-up)
starts from the folder with no other change. The seed still draws dropout and data. With
`kind` left out of the table, the job file reader fills the architecture in from `config.json`;
`seq_len` (and `dropout`) are the job's choice: `seq_len` at most `max_position_embeddings` /
`n_positions` (`model.positions`, kept so the model goes back out with its full position table).

**Reading a stage.** `stage_tensors(model, expected)` reads the tensors of one stage's parts and
nothing else: it opens the files with safetensors' `safe_open` (the header, then only the tensors
asked for), so a node never loads the whole model, and with shards it opens only the shards that
hold its stage. Each tensor is checked against the shape `config.json` implies and made float32
(a bf16 or fp16 checkpoint trains in float32, as every gwtf job does).

**Names.** gwtf's fused projections and untied head make three differences with the
Hugging Face layout; everything else is a rename:

| gwtf | LLaMA (`model.` prefix) | GPT-2 (`transformer.` prefix) |
|---|---|---|
| `embed.tok.weight` | `embed_tokens.weight` | `wte.weight` |
| `embed.pos.weight` | (rotary) | `wpe.weight` |
| `blocks.i.norm1` / `ln1` | `layers.i.input_layernorm` | `h.i.ln_1` |
| `blocks.i.attn.qkv` | `layers.i.self_attn.{q,k,v}_proj`, rows stacked | `h.i.attn.c_attn`, T |
| `blocks.i.attn.proj` | `layers.i.self_attn.o_proj` | `h.i.attn.c_proj`, T |
| `blocks.i.norm2` / `ln2` | `layers.i.post_attention_layernorm` | `h.i.ln_2` |
| `blocks.i.gate`, `up`, `down` | `layers.i.mlp.{gate,up,down}_proj` | |
| `blocks.i.fc`, `proj` | | `h.i.mlp.c_fc`, `c_proj`, T |
| `head.norm` | `norm` | `ln_f` |
| `head.out.weight` | `lm_head.weight` (no prefix) | `lm_head.weight` (no prefix) |

T: transposed, since GPT-2's `Conv1D` stores `[in, out]`, the transpose of a `Linear`. A tied head
(`tie_word_embeddings`, GPT-2's default, which then stores no `lm_head.weight`) is read from the
token embedding: the embedding lives on stage 0 and the head on the last stage, on other nodes,
so in gwtf they are two parameters that start equal and train apart.

**Nodes with different folders.** Each node reads the folder at the path the job names, on its own
machine, as data holders read `data`. A node whose `config.json` disagrees with the job's [model]
table refuses to build its stage (`PretrainedError`, one sentence; the job is refused at
submission). A node also compares the folder's files with the digest the job pins
(`model.pretrained_sha256`, `gwtf.train.digests`) and refuses a job whose weights it does not
hold, in one sentence, before any training: two volunteers never start one stage from different
weights. The replicas' parameter checksum at every commit still catches what a digest cannot
(replicas that compute differently).

**Going back out.** `export_hf(params, model, folder)` writes a whole gwtf parameter map (a
checkpoint's `model.safetensors`, `gwtf.train.checkpoints.checkpoint`) as `config.json` and one
`model.safetensors` in float32, which transformers' `from_pretrained` loads as
`LlamaForCausalLM` / `GPT2LMHeadModel`. The head is written as `lm_head.weight` with
`tie_word_embeddings = false`, since after training it is no longer the embedding. Any gwtf model
exports, pretrained or not, except a gpt with grouped-query attention (GPT-2 has none). Tokenizer
files are not written: the job's data decides what the token ids mean.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from torch import Tensor

from gwtf.train.data import DataError
from gwtf.train.digests import DigestError, pretrained_digest
from gwtf.train.job import JobError, ModelConfig
from gwtf.train.models.hfconfig import (
    CONFIG_FILE,
    HFConfigError,
    model_keys,
    read_config,
    tied_head,
)
from gwtf.train.remote import pretrained_location

__all__ = [
    "INDEX_FILE",
    "WEIGHTS_FILE",
    "ExportError",
    "PretrainedError",
    "Source",
    "check_folder",
    "export_hf",
    "hf_config",
    "hf_tensors",
    "read_model_config",
    "sources",
    "stage_tensors",
]

WEIGHTS_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
_BODY_PREFIX = {"llama": "model.", "gpt": "transformer."}
_HEAD = "lm_head.weight"


class PretrainedError(DataError):
    """A pretrained folder a node cannot start from (missing, of another model, damaged).

    A `DataError`, like a missing corpus: both are files a node reads for itself, and a node that
    cannot read them refuses the job with the sentence."""


class ExportError(ValueError):
    """Parameters that cannot be written as a Hugging Face folder; one sentence."""


@dataclass(frozen=True)
class Source:
    """Where one gwtf parameter is in a Hugging Face checkpoint.

    `how`: `copy` (the same tensor), `transpose` (GPT-2's Conv1D), or `concat` (the rows of
    `names` one after the other: LLaMA's q, k and v into gwtf's fused qkv).
    """

    names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    how: str


def sources(
    model: ModelConfig, *, tied: bool = False, prefix: str | None = None
) -> dict[str, Source]:
    """gwtf parameter name -> its `Source`, for every parameter of the whole model.

    `tied`: the head is read from the token embedding. `prefix`: of every name but the head's
    (default: what transformers writes, `model.` for llama, `transformer.` for gpt).
    """
    body = _BODY_PREFIX[model.kind] if prefix is None else prefix
    width, vocab, mlp = model.width, model.vocab, model.mlp_size
    out: dict[str, Source] = {}

    def add(name: str, hf: str | tuple[str, ...], shape: Any, how: str = "copy") -> None:
        names = (hf,) if isinstance(hf, str) else hf
        shapes = (shape,) if how != "concat" else tuple(shape)
        out[name] = Source(tuple(body + n for n in names), tuple(map(tuple, shapes)), how)

    if model.kind == "llama":
        q_rows, kv_rows = model.heads * model.head_dim, model.key_value_heads * model.head_dim
        add("embed.tok.weight", "embed_tokens.weight", (vocab, width))
        for i in range(model.layers):
            at, block = f"layers.{i}.", f"blocks.{i}."
            add(block + "norm1.weight", at + "input_layernorm.weight", (width,))
            qkv = tuple(at + f"self_attn.{p}_proj.weight" for p in "qkv")
            add(block + "attn.qkv.weight", qkv,
                ((q_rows, width), (kv_rows, width), (kv_rows, width)), "concat")  # fmt: skip
            add(block + "attn.proj.weight", at + "self_attn.o_proj.weight", (width, q_rows))
            add(block + "norm2.weight", at + "post_attention_layernorm.weight", (width,))
            add(block + "gate.weight", at + "mlp.gate_proj.weight", (mlp, width))
            add(block + "up.weight", at + "mlp.up_proj.weight", (mlp, width))
            add(block + "down.weight", at + "mlp.down_proj.weight", (width, mlp))
        add("head.norm.weight", "norm.weight", (width,))
        embedding = "embed_tokens.weight"
    else:
        qkv_rows = (model.heads + 2 * model.key_value_heads) * model.head_dim
        add("embed.tok.weight", "wte.weight", (vocab, width))
        add("embed.pos.weight", "wpe.weight", (model.max_positions, width))
        for i in range(model.layers):
            at, block = f"h.{i}.", f"blocks.{i}."
            for ours, theirs in (("ln1", "ln_1"), ("ln2", "ln_2")):
                add(block + f"{ours}.weight", at + f"{theirs}.weight", (width,))
                add(block + f"{ours}.bias", at + f"{theirs}.bias", (width,))
            for ours, theirs, size_in, size_out in (
                ("attn.qkv", "attn.c_attn", width, qkv_rows),
                ("attn.proj", "attn.c_proj", width, width),
                ("fc", "mlp.c_fc", width, mlp),
                ("proj", "mlp.c_proj", mlp, width),
            ):
                add(block + f"{ours}.weight", at + f"{theirs}.weight", (size_in, size_out),
                    "transpose")  # fmt: skip
                add(block + f"{ours}.bias", at + f"{theirs}.bias", (size_out,))
        add("head.norm.weight", "ln_f.weight", (width,))
        add("head.norm.bias", "ln_f.bias", (width,))
        embedding = "wte.weight"
    if tied:
        out["head.out.weight"] = Source((body + embedding,), ((vocab, width),), "copy")
    else:
        out["head.out.weight"] = Source((_HEAD,), ((vocab, width),), "copy")
    return out


# -- in --------------------------------------------------------------------------------------


def read_model_config(folder: str | Path, *, seq_len: int, dropout: float = 0.1) -> ModelConfig:
    """The model of a Hugging Face folder, trained on `seq_len` tokens, starting from its weights
    (what a job file with `[model] pretrained = FOLDER` and no `kind` gives)."""
    where = str(Path(folder) / CONFIG_FILE)
    try:
        keys = model_keys(read_config(folder), where)
    except HFConfigError as err:
        raise PretrainedError(str(err)) from None
    try:
        return ModelConfig(**keys, seq_len=seq_len, dropout=dropout, pretrained=str(folder))
    except JobError as err:
        raise PretrainedError(f"{where}: {err}") from None


def check_folder(model: ModelConfig) -> dict[str, Any]:
    """The folder's parsed config.json; PretrainedError if it is not the job's model."""
    folder, fetched = _folder(model)
    where = str(Path(folder) / CONFIG_FILE)
    try:
        config = read_config(folder)
        keys = model_keys(config, where)
    except HFConfigError as err:
        raise PretrainedError(str(err)) from None
    try:
        theirs = ModelConfig(**keys, seq_len=model.seq_len, dropout=model.dropout,
                             pretrained=model.pretrained,
                             pretrained_sha256=model.pretrained_sha256)  # fmt: skip
    except JobError as err:
        raise PretrainedError(f"{where}: {err}") from None
    for item in fields(ModelConfig):
        key = item.name
        if getattr(theirs, key) != getattr(model, key):
            raise PretrainedError(
                f"{where} gives model.{key} = {_shown(theirs, key)!r} but the job's model has "
                f"{_shown(model, key)!r}; every node must hold the job's model at {folder}"
            )
    if model.pretrained_sha256 is not None and not fetched:  # a fetched one was checked
        try:
            here = pretrained_digest(folder)
        except DigestError as err:
            raise PretrainedError(str(err)) from None
        if here != model.pretrained_sha256:
            raise PretrainedError(
                f"the weights in {folder} here have digest {here[:12]}, not the job's "
                f"model.pretrained_sha256 {model.pretrained_sha256[:12]}: they are not the ones "
                "the job was submitted with; give this machine the same folder, or submit the "
                "job again to train from these"
            )
    return config


def _shown(model: ModelConfig, key: str) -> object:
    """A key's effective value (None stands for the kind's default)."""
    resolved = {"kv_heads": "key_value_heads", "mlp_hidden": "mlp_size",
                "activation": "mlp_activation", "positions": "max_positions"}  # fmt: skip
    return getattr(model, resolved.get(key, key))


def _folder(model: ModelConfig) -> tuple[str, bool]:
    """The pretrained folder on this machine, and whether it was fetched from the URL the job
    names (into the cache, checked against its digest: `gwtf.train.remote`)."""
    if model.pretrained is None:
        raise ValueError("the model has no pretrained folder")
    try:
        folder, fetched = pretrained_location(model.pretrained, model.pretrained_sha256)
    except DigestError as err:
        raise PretrainedError(str(err)) from None
    return str(folder), fetched is not None


def stage_tensors(
    model: ModelConfig, expected: Mapping[str, tuple[int, ...] | torch.Size]
) -> dict[str, Tensor]:
    """The float32 tensors of the gwtf parameters `expected` (name -> shape: one stage's), read
    from the model's pretrained folder and nothing more; PretrainedError with one sentence if the
    folder cannot give them."""
    folder = Path(_folder(model)[0])
    config = check_folder(model)
    where = str(folder / CONFIG_FILE)
    try:
        tied = tied_head(config, where)
    except HFConfigError as err:
        raise PretrainedError(str(err)) from None
    files = _tensor_files(folder)
    table = sources(model, tied=tied, prefix=_prefix(model, files))
    out: dict[str, Tensor] = {}
    with contextlib.ExitStack() as stack:
        handles: dict[Path, Any] = {}

        def read(name: str, shape: tuple[int, ...]) -> Tensor:
            path = files.get(name)
            if path is None:
                raise PretrainedError(
                    f"{folder} holds no tensor {name}; is the checkpoint complete?"
                )
            if path not in handles:
                handles[path] = stack.enter_context(_open(path))
            try:
                tensor = handles[path].get_tensor(name)
            except (SafetensorError, OSError, ValueError) as err:
                raise PretrainedError(f"cannot read {name} from {path}: {err}") from None
            if not tensor.dtype.is_floating_point:
                raise PretrainedError(f"{path}: {name} is {tensor.dtype}, not a float tensor")
            if tuple(tensor.shape) != shape:
                raise PretrainedError(
                    f"{path}: {name} has shape {list(tensor.shape)} but {CONFIG_FILE} implies "
                    f"{list(shape)}"
                )
            return tensor.to(torch.float32)

        for name, shape in expected.items():
            source = table.get(name)
            if source is None:
                raise ValueError(f"{name} is not a parameter of a {model.kind} model")
            parts = [read(n, s) for n, s in zip(source.names, source.shapes, strict=True)]
            tensor = _combine(source.how, parts)
            if tuple(tensor.shape) != tuple(shape):
                raise ValueError(f"{name} maps to shape {list(tensor.shape)}, not {list(shape)}")
            out[name] = tensor
    return out


def _combine(how: str, parts: list[Tensor]) -> Tensor:
    if how == "transpose":
        return parts[0].t().contiguous()
    if how == "concat":
        return torch.cat(parts, dim=0)
    return parts[0].contiguous()


@contextlib.contextmanager
def _open(path: Path) -> Any:
    try:
        handle = safe_open(str(path), framework="pt")
    except FileNotFoundError:
        raise PretrainedError(f"{path} is missing; the folder's {INDEX_FILE} names it") from None
    except (SafetensorError, OSError) as err:
        raise PretrainedError(f"{path} is not a readable safetensors file: {err}") from None
    with handle as opened:
        yield opened


def _tensor_files(folder: Path) -> dict[str, Path]:
    """Hugging Face tensor name -> the file that holds it: the header of the one file, or else the
    index of a sharded checkpoint (transformers' order too)."""
    index = folder / INDEX_FILE
    single = folder / WEIGHTS_FILE
    if single.exists():
        with _open(single) as handle:
            return {name: single for name in handle.keys()}
    if index.exists():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            if not isinstance(weight_map, dict):
                raise TypeError
            files = {str(name): str(file) for name, file in weight_map.items()}
        except (OSError, ValueError, KeyError, TypeError):
            raise PretrainedError(
                f"{index} is not a safetensors index (a JSON object with a weight_map)"
            ) from None
        for file in files.values():
            if Path(file).name != file:
                raise PretrainedError(f"{index} names {file!r}, not a file of {folder}")
        return {name: folder / file for name, file in files.items()}
    raise PretrainedError(
        f"{folder} holds neither {WEIGHTS_FILE} nor {INDEX_FILE}; gwtf reads safetensors "
        "checkpoints only (save_pretrained writes them)"
    )


def _prefix(model: ModelConfig, files: Mapping[str, Path]) -> str:
    """`model.` / `transformer.` as transformers' *ForCausalLM / *LMHeadModel save them, or none
    (a bare LlamaModel / GPT2Model, as some older GPT-2 checkpoints are)."""
    body = _BODY_PREFIX[model.kind]
    return body if any(name.startswith(body) for name in files) else ""


# -- out -------------------------------------------------------------------------------------


def hf_config(model: ModelConfig) -> dict[str, Any]:
    """The config.json of `model` as transformers reads it (head untied, float32)."""
    if model.kind == "llama":
        return {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "vocab_size": model.vocab,
            "hidden_size": model.width,
            "intermediate_size": model.mlp_size,
            "num_hidden_layers": model.layers,
            "num_attention_heads": model.heads,
            "num_key_value_heads": model.key_value_heads,
            "head_dim": model.head_dim,
            "hidden_act": "silu",
            "max_position_embeddings": model.max_positions,
            "rms_norm_eps": model.norm_eps,
            "rope_parameters": {"rope_type": "default", "rope_theta": model.rope_theta},
            "rope_theta": model.rope_theta,  # what transformers before 5 reads
            "attention_bias": False,
            "attention_dropout": 0.0,
            "mlp_bias": False,
            "tie_word_embeddings": False,
            "dtype": "float32",
        }
    if model.kv_heads is not None:
        raise ExportError(
            f"a gpt model with model.kv_heads = {model.kv_heads} has no GPT-2 form: GPT-2 has "
            "no grouped-query attention"
        )
    activation = {"gelu": "gelu", "gelu-tanh": "gelu_new"}[model.mlp_activation]
    return {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "vocab_size": model.vocab,
        "n_positions": model.max_positions,
        "n_embd": model.width,
        "n_layer": model.layers,
        "n_head": model.heads,
        "n_inner": model.mlp_size,
        "activation_function": activation,
        "layer_norm_epsilon": model.norm_eps,
        # gwtf's dropout is on the embedding and the residual branches, none on attention.
        "embd_pdrop": model.dropout,
        "resid_pdrop": model.dropout,
        "attn_pdrop": 0.0,
        "scale_attn_weights": True,
        "tie_word_embeddings": False,
        "dtype": "float32",
    }


def hf_tensors(params: Mapping[str, Tensor], model: ModelConfig) -> dict[str, Tensor]:
    """The whole model's gwtf parameters under their Hugging Face names (float32, contiguous,
    on the CPU); ExportError if `params` is not the whole `model`."""
    hf_config(model)  # refuses what has no Hugging Face form
    table = sources(model)
    missing = [name for name in table if name not in params]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise ExportError(
            f"the parameters lack {missing[0]}{more}: export needs the whole model, every stage "
            "merged"
        )
    extra = sorted(set(params) - set(table))
    if extra:
        raise ExportError(f"{extra[0]} is not a parameter of this {model.kind} model")
    out: dict[str, Tensor] = {}
    for name, source in table.items():
        tensor = params[name].detach().to("cpu", torch.float32)
        if source.how == "transpose":
            parts = [tensor.t()]
        elif source.how == "concat":
            parts = list(tensor.split([shape[0] for shape in source.shapes], dim=0))
        else:
            parts = [tensor]
        for hf_name, shape, part in zip(source.names, source.shapes, parts, strict=True):
            if tuple(part.shape) != shape:
                raise ExportError(
                    f"{name} has shape {list(tensor.shape)}, which does not fit the model "
                    f"({hf_name} needs {list(shape)})"
                )
            out[hf_name] = part.contiguous()
    return out


def export_hf(params: Mapping[str, Tensor], model: ModelConfig, folder: str | Path) -> Path:
    """Write `params` (the whole model, gwtf names) into `folder` as config.json and
    model.safetensors, each through a temporary file renamed into place. The folder's path."""
    config = hf_config(model)
    tensors = hf_tensors(params, model)
    out = Path(folder)
    try:
        out.mkdir(parents=True, exist_ok=True)
        tmp = out / f".{WEIGHTS_FILE}.tmp"
        save_file(tensors, str(tmp), metadata={"format": "pt"})
        os.replace(tmp, out / WEIGHTS_FILE)
        tmp_config = out / f".{CONFIG_FILE}.tmp"
        tmp_config.write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
        os.replace(tmp_config, out / CONFIG_FILE)
    except OSError as err:
        raise ExportError(f"cannot write into {out}: {err.strerror or err}") from None
    return out
