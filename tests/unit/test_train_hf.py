"""Models from Hugging Face folders (gwtf.train.models.hf): in, cut into stages, trained, and back
out.

transformers is the independent check. Tiny LLaMA (grouped-query attention, a rotary base of its
own) and GPT-2 (tied head, tanh GELU, a position table longer than the job's sequences) models
are made here with random weights and written with `save_pretrained` (safetensors); nothing is
downloaded. Every parameter is redrawn from a seeded generator, norms included, so that a swapped
or misplaced tensor changes the logits.

Tolerance: gwtf's stages and transformers compute the same float32 function with other kernels
(SDPA against transformers' attention, fused qkv against three projections, gwtf's rotary table
made in float64 against transformers' in float32, exact tanh-GELU formula against torch's), so
logits agree to float rounding, not bit for bit: at most `ATOL` = 1e-5 apart (measured: under
1e-6), for logits of size ~2.
Moving tensors between the layouts (copy, transpose, concatenate, split) is exact: compared with
`torch.equal`.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from transformers import (
    AutoModelForCausalLM,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
)

from gwtf.cli import main
from gwtf.train import PRESETS, JobConfig, ModelConfig, train_reference
from gwtf.train.checkpoints.checkpoint import job_toml, merge_stages, save_model
from gwtf.train.data import DataError, job_corpus, job_microbatch
from gwtf.train.job import JobError, load_job
from gwtf.train.models.hf import (
    ExportError,
    PretrainedError,
    export_hf,
    hf_tensors,
    read_model_config,
)
from gwtf.train.stage import StageModule, build_model, build_stage_of

ATOL = 1e-5
VOCAB = 320  # at least 256: the tests' data is byte-level
SEQ = 24

# One torch thread for every test here (tests/conftest.py): small, and the same bits each run.
pytestmark = pytest.mark.usefixtures("one_thread")


def randomise(model: torch.nn.Module, seed: int) -> None:
    """Every parameter from a seeded generator: matrices ~ N(0, 0.1^2), norm weights ~ 1 + N."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=generator) * 0.1
            is_norm_weight = param.dim() == 1 and name.endswith("weight")
            param.copy_(noise + 1.0 if is_norm_weight else noise)


def made(model_class: type[PreTrainedModel], config: Any, seed: int) -> PreTrainedModel:
    with torch.random.fork_rng():  # transformers initialises from the global generator
        torch.manual_seed(seed)
        model = model_class(config)
    randomise(model, seed)
    return model.eval()


def tiny_llama(folder: Path, *, seed: int = 1, **overrides: Any) -> PreTrainedModel:
    settings: dict[str, Any] = dict(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        rms_norm_eps=1e-6, rope_parameters={"rope_type": "default", "rope_theta": 500.0},
        tie_word_embeddings=False, attention_dropout=0.0,
    )  # fmt: skip
    model = made(LlamaForCausalLM, LlamaConfig(**{**settings, **overrides}), seed)
    model.save_pretrained(folder)
    return model


def tiny_gpt2(folder: Path, *, seed: int = 2, **overrides: Any) -> PreTrainedModel:
    settings: dict[str, Any] = dict(
        vocab_size=VOCAB, n_positions=32, n_embd=32, n_layer=4, n_head=4,
        activation_function="gelu_new", resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
        bos_token_id=0, eos_token_id=0,
    )  # fmt: skip
    model = made(GPT2LMHeadModel, GPT2Config(**{**settings, **overrides}), seed)
    model.save_pretrained(folder)
    return model


MAKERS = {"llama": tiny_llama, "gpt2": tiny_gpt2}


def tokens(seed: int = 0, length: int = SEQ) -> torch.Tensor:
    return torch.randint(0, VOCAB, (2, length), generator=torch.Generator().manual_seed(seed))


def job_file(tmp_path: Path, model_lines: str, name: str = "job.toml") -> Path:
    path = tmp_path / name
    path.write_text(
        "iterations = 1\nmicrobatches = 2\nmicrobatch_size = 2\n\n[model]\n" + model_lines
    )
    return path


def pipeline(stages: list[StageModule], ids: torch.Tensor) -> torch.Tensor:
    x = ids
    for stage in stages:
        x = stage(x, None)
    return x


def their_logits(model: PreTrainedModel, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        logits: torch.Tensor = model(ids).logits
    return logits


def gap(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).detach().abs().max())


def three_stages(model: ModelConfig) -> list[StageModule]:
    return [build_stage_of(model, 0, stage, 3) for stage in range(3)]


# -- in ----------------------------------------------------------------------------------------


def test_a_llama_folder_in_three_stages_computes_transformers_logits(tmp_path: Path) -> None:
    theirs = tiny_llama(tmp_path / "llama")
    # A job file names the folder and the sequence length; config.json gives the rest.
    job = load_job(job_file(tmp_path, 'pretrained = "llama"\nseq_len = 24\ndropout = 0.0\n'))
    model = job.model
    assert model == ModelConfig(
        kind="llama", layers=4, width=32, heads=4, kv_heads=2, mlp_hidden=48, vocab=VOCAB,
        norm_eps=1e-6, rope_theta=500.0, positions=64, seq_len=SEQ, dropout=0.0,
        pretrained=str((tmp_path / "llama").resolve()),
    )  # fmt: skip
    stages = three_stages(model)
    assert [list(s.blocks) for s in stages] == [["0", "1"], ["2"], ["3"]]
    ids = tokens()
    ours = pipeline(stages, ids)
    assert ours.shape == (2, SEQ, VOCAB)
    assert gap(ours, their_logits(theirs, ids)) < ATOL
    # Each stage holds its parts only: together exactly the model's tensors, each read once.
    whole = dict(theirs.state_dict())
    names = [n for s in stages for n in s.state_dict()]
    assert len(names) == len(set(names)) == len(dict(build_model(model, 0).state_dict()))
    qkv = stages[0].state_dict()["blocks.1.attn.qkv.weight"]
    assert qkv.shape == ((4 + 2 * 2) * 8, 32)  # 4 query heads, 2 key/value heads of 8
    assert torch.equal(qkv[32:48], whole["model.layers.1.self_attn.k_proj.weight"])


def test_a_gpt2_folder_with_a_tied_head_computes_transformers_logits(tmp_path: Path) -> None:
    theirs = tiny_gpt2(tmp_path / "gpt2")
    model = read_model_config(tmp_path / "gpt2", seq_len=16, dropout=0.0)
    assert (model.kind, model.mlp_activation, model.max_positions, model.mlp_size) == (
        "gpt", "gelu-tanh", 32, 128
    )
    stages = three_stages(model)
    ids = tokens(length=16)
    assert gap(pipeline(stages, ids), their_logits(theirs, ids)) < ATOL
    # The tied head is read from the embedding, into a parameter of its own on the last stage.
    embedding = stages[0].state_dict()["embed.tok.weight"]
    head = stages[2].state_dict()["head.out.weight"]
    assert torch.equal(head, embedding) and head.data_ptr() != embedding.data_ptr()
    assert stages[0].state_dict()["embed.pos.weight"].shape == (32, 32)  # all n_positions


def test_a_sharded_folder_loads_and_a_node_opens_only_its_own_shards(tmp_path: Path) -> None:
    theirs = tiny_llama(tmp_path / "one")
    theirs.save_pretrained(tmp_path / "sharded", max_shard_size="40KB")
    index = json.loads((tmp_path / "sharded" / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 2 and not (tmp_path / "sharded" / "model.safetensors").exists()
    one = read_model_config(tmp_path / "one", seq_len=SEQ)
    sharded = read_model_config(tmp_path / "sharded", seq_len=SEQ)
    for stage in range(3):
        a = build_stage_of(one, 0, stage, 3).state_dict()
        b = build_stage_of(sharded, 0, stage, 3).state_dict()
        assert a.keys() == b.keys() and all(torch.equal(a[n], b[n]) for n in a)
    # Without the shard of the head, stage 0 still builds; the last stage says what is missing.
    head_shard = index["weight_map"]["lm_head.weight"]
    mine = ("model.embed_tokens", "model.layers.0.", "model.layers.1.")
    stage0 = {f for n, f in index["weight_map"].items() if n.startswith(mine)}
    assert head_shard not in stage0
    (tmp_path / "sharded" / head_shard).unlink()
    build_stage_of(sharded, 0, 0, 3)
    with pytest.raises(PretrainedError) as missing:
        build_stage_of(sharded, 0, 2, 3)
    assert str(missing.value) == (
        f"{tmp_path / 'sharded' / head_shard} is missing; the folder's "
        "model.safetensors.index.json names it"
    )


def test_a_half_precision_checkpoint_trains_in_float32(tmp_path: Path) -> None:
    theirs = tiny_llama(tmp_path / "fp32")
    theirs.bfloat16().save_pretrained(tmp_path / "bf16")
    model = read_model_config(tmp_path / "bf16", seq_len=SEQ)
    params = build_model(model, 0).state_dict()
    assert {t.dtype for t in params.values()} == {torch.float32}
    assert torch.equal(params["head.norm.weight"],
                       theirs.state_dict()["model.norm.weight"].float())  # fmt: skip


# -- the job -----------------------------------------------------------------------------------


def test_the_job_file_states_what_config_json_says_or_leaves_it_out(tmp_path: Path) -> None:
    tiny_llama(tmp_path / "llama")
    short = load_job(job_file(tmp_path, 'pretrained = "llama"\nseq_len = 24\n'))
    stated = load_job(job_file(tmp_path, 'pretrained = "llama"\nseq_len = 24\nheads = 4\n'
                               "kv_heads = 2\nnorm_eps = 1e-6\n", "stated.toml"))  # fmt: skip
    assert stated == short and stated.job_id == short.job_id
    with pytest.raises(JobError) as wrong:
        load_job(job_file(tmp_path, 'pretrained = "llama"\nseq_len = 24\nkv_heads = 4\n'))
    where = tmp_path / "llama" / "config.json"
    assert str(wrong.value) == (
        f"job file {tmp_path / 'job.toml'}: model.kv_heads is 4 but {where} gives 2; leave "
        "model.kv_heads out to take the folder's"
    )
    with pytest.raises(JobError, match=r"model.seq_len \(65\) is longer than model.positions"):
        load_job(job_file(tmp_path, 'pretrained = "llama"\nseq_len = 65\n'))


def test_the_job_travels_and_is_saved_stated_in_full_without_the_folder(tmp_path: Path) -> None:
    tiny_llama(tmp_path / "llama")
    job = load_job(job_file(tmp_path, 'pretrained = "llama"\nseq_len = 24\n'))
    table = job.to_dict()["model"]
    assert table["kind"] == "llama" and table["kv_heads"] == 2 and table["rope_theta"] == 500.0
    assert "activation" not in table  # silu is llama's own: left out, as every default
    (tmp_path / "saved.toml").write_text(job_toml(job.pinned()))  # with its weights' digest
    job_id = job.job_id
    (tmp_path / "llama").rename(tmp_path / "elsewhere")  # reading it back needs no folder
    assert load_job(tmp_path / "saved.toml").job_id == job_id


def test_the_job_id_is_the_weights_not_the_folder_s_path(tmp_path: Path) -> None:
    """Changed weights once kept the job's id, and a swarm returned the old job's model."""
    tiny_llama(tmp_path / "a" / "llama")
    first = load_job(job_file(tmp_path / "a", 'pretrained = "llama"\nseq_len = 24\n'))
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    copied = load_job(tmp_path / "b" / "job.toml")
    assert copied.model.pretrained != first.model.pretrained and copied.job_id == first.job_id
    submitted = copied.pinned().model
    tiny_llama(tmp_path / "b" / "llama", seed=7)  # the same model, trained further
    changed = load_job(tmp_path / "b" / "job.toml")
    assert changed.model == dataclasses.replace(first.model, pretrained=changed.model.pretrained)
    assert changed.job_id != first.job_id
    # A node that holds these weights refuses the job pinned to the first ones, before training.
    with pytest.raises(PretrainedError) as refused:
        build_stage_of(submitted, 0, 1, 3)
    assert str(refused.value).startswith(f"the weights in {tmp_path / 'b' / 'llama'} here have ")
    assert str(refused.value).endswith(
        "they are not the ones the job was submitted with; give this machine the same folder, or "
        "submit the job again to train from these"
    )


def test_a_pretrained_folder_named_by_url_is_the_same_model_and_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GWTF_CACHE", str(tmp_path / "cache"))
    tiny_llama(tmp_path / "llama")
    (tmp_path / "llama" / "README.md").write_text("not read, not fetched")
    here = load_job(job_file(tmp_path, 'pretrained = "llama"\nseq_len = 24\n'))
    url = f"file://{tmp_path / 'llama'}"
    by_url = load_job(job_file(tmp_path, f'pretrained = "{url}"\nseq_len = 24\n', "url.toml"))
    assert by_url.model.pretrained == url and by_url.job_id == here.job_id
    (fetched,) = (tmp_path / "cache" / "remote").iterdir()
    assert sorted(p.name for p in (fetched / "llama").iterdir()) == ["config.json",
                                                                     "model.safetensors"]
    stage = build_stage_of(by_url.pinned().model, 0, 1, 3).state_dict()
    local = build_stage_of(here.model, 0, 1, 3).state_dict()
    assert stage.keys() == local.keys()
    assert all(torch.equal(stage[name], local[name]) for name in local)


def test_a_tokenizer_larger_than_the_pretrained_vocabulary_says_what_to_change(
    tmp_path: Path,
) -> None:
    """It said "set model.vocab to at least N", and setting it was refused as disagreeing with
    config.json: the user went in a circle."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel

    tiny_llama(tmp_path / "llama")  # 320 token embeddings
    words = {f"w{i}": i for i in range(400)}
    Tokenizer(WordLevel(words, unk_token="w0")).save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "text.txt").write_text(" ".join(words) * 4)
    job = load_job(job_file(tmp_path, 'pretrained = "llama"\nseq_len = 16\n'))
    job = dataclasses.replace(job, tokenizer=str(tmp_path / "tokenizer.json"),
                              data=str(tmp_path / "text.txt"))  # fmt: skip
    with pytest.raises(DataError) as refused:
        job_corpus(job)
    assert str(refused.value) == (
        f"tokenizer {tmp_path / 'tokenizer.json'} has 400 tokens, more than the 320 token "
        f"embeddings of the pretrained model {tmp_path / 'llama'} (vocab_size in its config.json, "
        "which model.vocab must equal); give a tokenizer of at most that many tokens, such as the "
        "one the model was trained with"
    )


def test_a_node_whose_folder_is_another_model_refuses_to_build(tmp_path: Path) -> None:
    tiny_llama(tmp_path / "llama")
    job = load_job(job_file(tmp_path, 'pretrained = "llama"\nseq_len = 24\n'))
    tiny_llama(tmp_path / "llama", num_key_value_heads=4)  # this node's copy differs
    with pytest.raises(PretrainedError) as refused:
        build_stage_of(job.model, 0, 1, 3)
    assert str(refused.value) == (
        f"{tmp_path / 'llama' / 'config.json'} gives model.kv_heads = 4 but the job's model has "
        f"2; every node must hold the job's model at {tmp_path / 'llama'}"
    )


def test_the_new_model_keys_keep_the_presets_and_their_ids() -> None:
    assert PRESETS["tiny-gpt"].job_id == "job-829bebfa546dad2e"
    assert PRESETS["tiny-llama"].job_id == "job-9b17cf915b66d0fb"
    for job in PRESETS.values():
        assert set(job.to_dict()["model"]) == {
            "kind", "layers", "width", "heads", "seq_len", "vocab", "dropout"
        }
    # Stating a kind's default is leaving it out: the same model, the same id.
    base: dict[str, Any] = dict(layers=2, width=32, heads=4, seq_len=16)
    cases: tuple[tuple[str, dict[str, Any]], ...] = (
        ("gpt", dict(kv_heads=4, mlp_hidden=128, activation="gelu", positions=16)),
        ("llama", dict(kv_heads=4, mlp_hidden=96, activation="silu", positions=16,
                       rope_theta=10000, norm_eps=1e-5)),
    )  # fmt: skip
    for kind, defaults in cases:
        plain = JobConfig(model=ModelConfig(kind, **base), iterations=1, microbatches=1,
                          microbatch_size=1)  # fmt: skip
        stated = JobConfig(model=ModelConfig(kind, **base, **defaults), iterations=1,
                           microbatches=1, microbatch_size=1)  # fmt: skip
        assert stated == plain and stated.job_id == plain.job_id


@pytest.mark.parametrize(
    ("kind", "key", "value", "message"),
    [
        ("llama", "kv_heads", 3, r"model.kv_heads \(3\) must divide model.heads \(4\)"),
        ("llama", "kv_heads", 0, "model.kv_heads must be positive"),
        ("gpt", "mlp_hidden", 2.5, "model.mlp_hidden must be an integer"),
        ("llama", "norm_eps", 0, "model.norm_eps must be positive"),
        ("llama", "rope_theta", "big", "model.rope_theta must be a number"),
        ("gpt", "rope_theta", 500.0, "model.rope_theta applies to llama only"),
        ("gpt", "activation", "relu", "model.activation must be gelu or gelu-tanh for gpt"),
        ("llama", "activation", "gelu", "model.activation must be silu for llama"),
        ("gpt", "positions", 8, r"model.seq_len \(16\) is longer than model.positions \(8\)"),
        ("gpt", "pretrained", "", "model.pretrained must be a non-empty folder path"),
    ],
)
def test_each_new_model_key_is_checked_in_one_sentence(
    kind: str, key: str, value: object, message: str
) -> None:
    with pytest.raises(JobError, match=message) as caught:
        ModelConfig(kind, layers=2, width=32, heads=4, seq_len=16, **{key: value})  # type: ignore[arg-type]
    assert "\n" not in str(caught.value)


# -- refused -----------------------------------------------------------------------------------


def edit_config(folder: Path, **changes: Any) -> Path:
    path = folder / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))
    return path


def drop_tensor(folder: Path, name: str) -> None:
    tensors = load_file(folder / "model.safetensors")
    del tensors[name]
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})


CONFIG_CASES = [
    ("absent", lambda f: None, "{f} does not exist; give a Hugging Face model folder "
     "(config.json and model.safetensors)"),
    ("a file", lambda f: f.write_text("{}"), "{f} is not a folder; give a Hugging Face model "
     "folder (config.json and model.safetensors)"),
    ("no config", lambda f: f.mkdir(), "{f} holds no config.json; give a Hugging Face model "
     "folder (config.json and model.safetensors)"),
    ("mistral", lambda f: (tiny_llama(f), edit_config(f, model_type="mistral")),
     "{f}/config.json describes a 'mistral' model; gwtf trains llama (LlamaForCausalLM) and "
     "gpt2 (GPT2LMHeadModel) models"),
    ("classifier", lambda f: (tiny_llama(f), edit_config(
        f, architectures=["LlamaForSequenceClassification"])),
     "{f}/config.json is a LlamaForSequenceClassification; gwtf trains causal language models: "
     "llama (LlamaForCausalLM) and gpt2 (GPT2LMHeadModel)"),
    ("biases", lambda f: (tiny_llama(f), edit_config(f, attention_bias=True)),
     "{f}/config.json: attention_bias is true; gwtf's LLaMA blocks have no biases"),
    ("rope scaling", lambda f: (tiny_llama(f), edit_config(
        f, rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 500.0})),
     "{f}/config.json: rope_parameters.rope_type is 'linear'; gwtf supports default rotary "
     "positions only"),
    ("relu", lambda f: (tiny_gpt2(f), edit_config(f, activation_function="relu")),
     "{f}/config.json: activation_function is 'relu'; gwtf's GPT MLP supports gelu, gelu_new, "
     "gelu_pytorch_tanh, gelu_fast"),
    ("not json", lambda f: (f.mkdir(), (f / "config.json").write_text("{nope")),
     "{f}/config.json is not valid JSON: Expecting property name enclosed in double quotes: "
     "line 1 column 2 (char 1)"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("case", "make", "message"), CONFIG_CASES, ids=[c[0] for c in CONFIG_CASES]
)
def test_a_folder_gwtf_cannot_read_is_one_sentence_in_the_job_file(
    tmp_path: Path, case: str, make: Any, message: str
) -> None:
    folder = tmp_path / "hf"
    make(folder)
    path = job_file(tmp_path, 'pretrained = "hf"\nseq_len = 16\n')
    with pytest.raises(JobError) as refused:
        load_job(path)
    assert str(refused.value) == f"job file {path}: model.pretrained: " + message.format(f=folder)
    with pytest.raises(PretrainedError) as also:  # and on a node, for a job stated in full
        build_stage_of(ModelConfig("llama", 4, 32, 4, 16, pretrained=str(folder)), 0, 0, 3)
    assert str(also.value) == message.format(f=folder)


WEIGHT_CASES = [
    ("no weights", lambda f: (f / "model.safetensors").unlink(), 0,
     "{f} holds neither model.safetensors nor model.safetensors.index.json; gwtf reads "
     "safetensors checkpoints only (save_pretrained writes them)"),
    ("a tensor short", lambda f: drop_tensor(f, "model.layers.3.mlp.up_proj.weight"), 2,
     "{f} holds no tensor model.layers.3.mlp.up_proj.weight; is the checkpoint complete?"),
    ("shapes", lambda f: edit_config(f, intermediate_size=64), 1,
     "{f}/model.safetensors: model.layers.2.mlp.gate_proj.weight has shape [48, 32] but "
     "config.json implies [64, 32]"),
    ("damaged", lambda f: (f / "model.safetensors").write_bytes(b"\x08" + bytes(7) + b"{}"), 0,
     "{f}/model.safetensors is not a readable safetensors file: "),  # then safetensors' words
]  # fmt: skip


@pytest.mark.parametrize(("case", "damage", "stage", "message"), WEIGHT_CASES,
                         ids=[c[0] for c in WEIGHT_CASES])  # fmt: skip
def test_weights_a_stage_cannot_read_are_one_sentence(
    tmp_path: Path, case: str, damage: Any, stage: int, message: str
) -> None:
    folder = tmp_path / "hf"
    tiny_llama(folder)
    model = read_model_config(folder, seq_len=SEQ)
    damage(folder)
    model = model if case != "shapes" else read_model_config(folder, seq_len=SEQ)
    with pytest.raises(PretrainedError) as refused:
        build_stage_of(model, 0, stage, 3)
    text, expected = str(refused.value), message.format(f=folder)
    assert (text.startswith(expected) if expected.endswith(": ") else text == expected), text
    assert "\n" not in text


# -- out ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_an_unchanged_model_goes_back_out_tensor_for_tensor(kind: str, tmp_path: Path) -> None:
    theirs = MAKERS[kind](tmp_path / "in")
    model = read_model_config(tmp_path / "in", seq_len=16)
    params = merge_stages([dict(s.named_parameters()) for s in three_stages(model)])
    export_hf(params, model, tmp_path / "out")
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["tie_word_embeddings"] is False
    back = AutoModelForCausalLM.from_pretrained(tmp_path / "out")
    original, loaded = theirs.state_dict(), back.state_dict()
    assert set(loaded) == set(original) and "lm_head.weight" in load_file(
        tmp_path / "out" / "model.safetensors"
    )
    assert all(torch.equal(loaded[n], original[n]) for n in original)  # GPT-2's head: wte
    assert type(back) is type(theirs) and back.config.tie_word_embeddings is False


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_a_trained_model_exported_computes_the_same_logits_in_transformers(
    kind: str, tmp_path: Path
) -> None:
    MAKERS[kind](tmp_path / "in")
    model = read_model_config(tmp_path / "in", seq_len=16, dropout=0.0)
    whole = build_model(model, 0)
    randomise(whole, 9)  # as if trained: the head no longer equals the embedding, either
    params = dict(whole.named_parameters())
    assert not torch.equal(params["head.out.weight"], params["embed.tok.weight"])
    export_hf(params, model, tmp_path / "out")
    back = AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
    ids = tokens(length=16)
    with torch.no_grad():
        ours = whole(ids, None)
    assert gap(ours, their_logits(back, ids)) < ATOL
    assert torch.equal(back.state_dict()["lm_head.weight"], params["head.out.weight"])


@pytest.mark.parametrize("kind", ["gpt", "llama"])
def test_a_model_trained_from_scratch_exports_too(kind: str, tmp_path: Path) -> None:
    model = ModelConfig(kind, layers=3, width=32, heads=4, seq_len=16, vocab=VOCAB, dropout=0.0)
    whole = build_model(model, 5)
    export_hf(dict(whole.named_parameters()), model, tmp_path)
    back = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    ids = tokens(length=16)
    with torch.no_grad():
        assert gap(whole(ids, None), their_logits(back, ids)) < ATOL
    # And back in: the folder is a pretrained model like any other.
    again = read_model_config(tmp_path, seq_len=16, dropout=0.0)
    reread = build_model(again, 0).state_dict()
    assert all(torch.equal(reread[n], t) for n, t in whole.state_dict().items())


def test_what_has_no_hugging_face_form_is_refused(tmp_path: Path) -> None:
    grouped = ModelConfig("gpt", layers=2, width=32, heads=4, seq_len=16, kv_heads=2)
    params = dict(build_model(grouped, 0).named_parameters())
    with pytest.raises(ExportError, match="GPT-2 has no grouped-query attention"):
        export_hf(params, grouped, tmp_path)
    model = ModelConfig("llama", layers=2, width=32, heads=4, seq_len=16)
    stage0 = dict(build_stage_of(model, 0, 0, 2).named_parameters())
    with pytest.raises(ExportError) as partial:
        hf_tensors(stage0, model)
    assert str(partial.value) == (
        "the parameters lack blocks.1.norm1.weight (and 8 more): export needs the whole model, "
        "every stage merged"
    )
    assert not (tmp_path / "config.json").exists()


def test_gwtf_export_writes_a_checkpoint_as_a_hugging_face_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tiny_gpt2(tmp_path / "gpt2")
    job = load_job(job_file(tmp_path, 'pretrained = "gpt2"\nseq_len = 16\ndropout = 0.0\n'))
    whole = build_model(job.model, job.seed)
    save_model(tmp_path / "ckpt", dict(whole.named_parameters()), job, 0)
    assert main(["export", str(tmp_path / "ckpt"), "--hf", str(tmp_path / "out")]) == 0
    assert capsys.readouterr().out == (
        f"{tmp_path / 'out'}: config.json and model.safetensors, a gpt of 4 layers after 0 "
        f"iterations of job {job.job_id}\n"
    )
    back = AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
    ids = tokens(length=16)
    with torch.no_grad():
        assert gap(whole(ids, None), their_logits(back, ids)) < ATOL
    capsys.readouterr()  # transformers' progress bars
    assert main(["export", str(tmp_path / "none"), "--hf", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"gwtf export: {tmp_path / 'none'} does not exist; give a checkpoint folder "
        "(model.safetensors and job.toml)\n"
    )


def test_gwtf_export_refuses_to_write_over_what_it_reads_or_anything_else(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`gwtf export CKPT --hf CKPT` and `--hf PRETRAINED` once replaced the weights they read."""
    tiny_llama(tmp_path / "llama")
    job = load_job(job_file(tmp_path, 'pretrained = "llama"\nseq_len = 16\ndropout = 0.0\n'))
    save_model(tmp_path / "ckpt", dict(build_model(job.model, job.seed).named_parameters()), job, 3)
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "todo.txt").write_text("keep me")
    kept = {path: path.read_bytes() for path in tmp_path.rglob("*") if path.is_file()}
    capsys.readouterr()  # transformers' progress bars
    ckpt, llama = tmp_path / "ckpt", tmp_path / "llama"
    refusals = {
        f"gwtf export {ckpt} --hf {ckpt}": f"{ckpt} is the checkpoint being exported: writing "
        "there would replace its model.safetensors and it could no longer be exported or "
        "resumed; give --hf another folder (or add --force)",
        f"gwtf export {ckpt}/ --hf {ckpt}/../ckpt": f"{ckpt}/../ckpt is the checkpoint being "
        "exported: writing there would replace its model.safetensors and it could no longer be "
        "exported or resumed; give --hf another folder (or add --force)",
        f"gwtf export {ckpt} --hf {llama}": f"{llama} is the pretrained folder job {job.job_id} "
        "started from: writing there would replace its weights; give --hf another folder (or "
        "add --force)",
        f"gwtf export {ckpt} --hf {tmp_path / 'notes'}": f"{tmp_path / 'notes'} is not empty (it "
        "holds todo.txt); give --hf a new or empty folder, or add --force to write config.json "
        "and model.safetensors over what is there",
        f"gwtf export {ckpt} --hf {tmp_path / 'job.toml'}": f"{tmp_path / 'job.toml'} is a file; "
        "give --hf a folder to write into",
    }
    for command, sentence in refusals.items():
        assert main(command.split()[1:]) == 2, command
        assert capsys.readouterr() == ("", f"gwtf export: {sentence}\n"), command
    assert {path: path.read_bytes() for path in kept} == kept
    assert sorted(p for p in tmp_path.rglob("*") if p.is_file()) == sorted(kept)
    # An empty folder is fine; --force writes over what is there when the user means it.
    (tmp_path / "empty").mkdir()
    assert main(["export", str(ckpt), "--hf", str(tmp_path / "empty")]) == 0
    assert main(["export", str(ckpt), "--hf", str(tmp_path / "notes"), "--force"]) == 0
    assert (tmp_path / "notes" / "todo.txt").read_text() == "keep me"
    assert (tmp_path / "notes" / "config.json").exists()
    # A checkpoint forced over says so when read again, not that parameters are missing.
    assert main(["export", str(ckpt), "--hf", str(ckpt), "--force"]) == 0
    capsys.readouterr()
    assert main(["export", str(ckpt), "--hf", str(tmp_path / "again")]) == 2
    assert capsys.readouterr().err == (
        f"gwtf export: {ckpt / 'model.safetensors'} is not a gwtf checkpoint's weights but a "
        "'pt' file, as `gwtf export --hf` and transformers write; the checkpoint was "
        "overwritten, export or resume from another copy of it\n"
    )


def test_a_pretrained_job_trains_from_the_folder_s_weights(tmp_path: Path) -> None:
    """Iteration 0's loss is transformers' loss of the folder's model on the same microbatches."""
    theirs = tiny_llama(tmp_path / "llama")
    (tmp_path / "text.txt").write_bytes(bytes(range(256)) * 8)
    job = load_job(job_file(tmp_path, 'pretrained = "llama"\nseq_len = 24\ndropout = 0.0\n'))
    job = JobConfig(model=job.model, iterations=2, microbatches=2, microbatch_size=2,
                    data=str(tmp_path / "text.txt"))  # fmt: skip
    result = train_reference(job)
    corpus = job_corpus(job)
    losses = []
    for m in range(job.microbatches):
        ids, labels = job_microbatch(corpus, job, 0, m)
        logits = their_logits(theirs, ids)
        losses.append(float(F.cross_entropy(logits.flatten(0, 1), labels.flatten())))
    assert abs(result.loss[0] - sum(losses) / len(losses)) < ATOL
    start = build_model(job.model, job.seed).state_dict()
    assert not torch.equal(result.parameters["blocks.0.up.weight"], start["blocks.0.up.weight"])
