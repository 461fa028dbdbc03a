"""Job files and presets: valid ones load, every mistake is one clear JobError sentence."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from gwtf.train.job import (
    PRESETS,
    AggregationConfig,
    JobConfig,
    JobError,
    ModelConfig,
    OptimizerConfig,
    job_from_dict,
    load_job,
    preset,
    resolve_job,
)

REPO = Path(__file__).resolve().parents[2]
JOBS = REPO / "simulations" / "jobs"

MINIMAL = """
iterations = 3
microbatches = 4
microbatch_size = 2

[model]
kind = "gpt"
layers = 2
width = 16
heads = 2
seq_len = 8
"""


def write(tmp_path: Path, text: str, name: str = "job.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_minimal_file_gets_the_defaults(tmp_path: Path) -> None:
    job = load_job(write(tmp_path, MINIMAL))
    assert job.model == ModelConfig(kind="gpt", layers=2, width=16, heads=2, seq_len=8)
    assert job.model.vocab == 256 and job.model.dropout == 0.1
    assert job.optimizer == OptimizerConfig()
    assert job.seed == 0 and job.data is None and job.grad_accum == "float64"


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_example_files_are_the_presets(name: str) -> None:
    job = load_job(JOBS / f"{name}.toml")
    assert job == PRESETS[name]
    assert job.job_id == PRESETS[name].job_id


def test_every_example_job_file_loads() -> None:
    files = sorted(JOBS.glob("*.toml"))
    assert len(files) >= 3
    for path in files:
        load_job(path)


def test_job_id_follows_the_content() -> None:
    job = PRESETS["tiny-gpt"]
    assert job.job_id == dataclasses.replace(job).job_id
    assert job.job_id.startswith("job-") and len(job.job_id) == 20
    assert job.job_id != dataclasses.replace(job, seed=1).job_id
    assert job.job_id != PRESETS["tiny-llama"].job_id


def test_aggregation_is_a_word_or_a_table_and_the_mean_keeps_the_job_id(tmp_path: Path) -> None:
    assert load_job(write(tmp_path, MINIMAL)).aggregation == AggregationConfig(rule="mean")
    word = load_job(write(tmp_path, 'aggregation = "centered-clip"\n' + MINIMAL))
    assert word.aggregation == AggregationConfig(rule="centered-clip") and word.aggregation.robust
    table = load_job(write(tmp_path, MINIMAL + '\n[aggregation]\nrule = "trimmed-mean"\n'
                                             "trim = 0.25\nnorm_factor = 5\n"))
    assert table.aggregation == AggregationConfig("trimmed-mean", trim=0.25, norm_factor=5.0)
    # The default is left out of the job's canonical form: jobs that do not choose keep their id.
    plain = load_job(write(tmp_path, 'aggregation = "mean"\n' + MINIMAL))
    assert "aggregation" not in plain.to_dict()
    assert plain.job_id == load_job(write(tmp_path, MINIMAL)).job_id
    assert PRESETS["tiny-gpt"].job_id == "job-829bebfa546dad2e"
    # A choice changes the id and travels whole through the job's canonical form.
    assert table.job_id not in (plain.job_id, word.job_id)
    assert job_from_dict(table.to_dict()) == table
    assert job_from_dict(word.to_dict()) == word


def test_relative_data_path_is_relative_to_the_job_file(tmp_path: Path) -> None:
    job = load_job(write(tmp_path, 'data = "corpus.txt"\n' + MINIMAL))
    assert job.data == str(tmp_path.resolve() / "corpus.txt")


def test_data_keys_resolve_like_data_and_keep_the_job_id_at_their_default(tmp_path: Path) -> None:
    text = 'data = "corpus.jsonl"\ntokenizer = "tok/tokenizer.json"\ndata_field = "body"\n'
    job = load_job(write(tmp_path, text + 'data_order = "sequential"\n' + MINIMAL))
    assert job.tokenizer == str(tmp_path.resolve() / "tok" / "tokenizer.json")
    assert (job.data_field, job.data_order) == ("body", "sequential")
    assert job_from_dict(job.to_dict()) == job
    # At their defaults the keys are left out of the canonical form: ids of older jobs stay.
    plain = load_job(write(tmp_path, 'data_field = "text"\ndata_order = "random"\n' + MINIMAL))
    assert not {"tokenizer", "data_field", "data_order"} & set(plain.to_dict())
    assert plain.job_id == load_job(write(tmp_path, MINIMAL)).job_id
    assert PRESETS["tiny-gpt"].job_id == "job-829bebfa546dad2e"
    (tmp_path / "t.json").write_text("{}")
    changes = ({"tokenizer": str(tmp_path / "t.json")}, {"data_field": "body"},
               {"data_order": "sequential"})  # fmt: skip
    others = {dataclasses.replace(plain, **change).job_id for change in changes}
    assert len(others) == 3 and plain.job_id not in others


def test_catch_up_steps_is_read_and_keeps_the_job_id_at_its_default(tmp_path: Path) -> None:
    job = load_job(write(tmp_path, "catch_up_steps = 0\n" + MINIMAL))
    assert job.catch_up_steps == 0 and job_from_dict(job.to_dict()) == job
    plain = load_job(write(tmp_path, "catch_up_steps = 3\n" + MINIMAL))
    assert plain.catch_up_steps == 3 and "catch_up_steps" not in plain.to_dict()
    assert plain.job_id == load_job(write(tmp_path, MINIMAL)).job_id != job.job_id


def test_replay_bound_is_read_and_keeps_the_job_id_at_its_default(tmp_path: Path) -> None:
    job = load_job(write(tmp_path, "replay_bound = 4\n" + MINIMAL))
    assert job.replay_bound == 4 and job_from_dict(job.to_dict()) == job
    plain = load_job(write(tmp_path, 'replay_bound = "auto"\n' + MINIMAL))
    assert plain.replay_bound == "auto" and "replay_bound" not in plain.to_dict()
    assert plain.job_id == load_job(write(tmp_path, MINIMAL)).job_id != job.job_id


def test_a_vocab_below_256_needs_a_tokenizer(tmp_path: Path) -> None:
    small = MINIMAL + "vocab = 40\n"
    assert load_job(write(tmp_path, 'tokenizer = "tok.json"\n' + small)).model.vocab == 40
    with pytest.raises(JobError, match=r"model.vocab must be at least 256 for byte-level data "
                       r"\(no tokenizer\), got 40"):
        load_job(write(tmp_path, small))


def test_presets_are_a_few_hundred_thousand_parameters_and_cut_into_three() -> None:
    from gwtf.train.stage import build_model

    for job in PRESETS.values():
        count = sum(p.numel() for p in build_model(job.model, job.seed).parameters())
        assert 200_000 < count < 500_000
        assert job.model.layers % 3 == 0


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda t: "widht = 3\n" + t, "unknown key 'widht'; the keys allowed at the top"),
        (lambda t: t.replace("heads = 2", "heads = 2\nwidht = 3"), "unknown key 'model.widht'"),
        (lambda t: t + "\n[optimizer]\nlearning_rate = 1\n", "unknown key 'optimizer.learning"),
        (lambda t: t.replace("iterations = 3", "iterations = 0"), "iterations must be positive"),
        (lambda t: t.replace("iterations = 3", 'iterations = "3"'), "iterations must be an int"),
        (lambda t: t.replace("iterations = 3", "iterations = 3.5"), "iterations must be an int"),
        (lambda t: t.replace("iterations = 3", "iterations = true"), "iterations must be an int"),
        (lambda t: t.replace("microbatches = 4\n", ""), "missing required key 'microbatches'"),
        (lambda t: t.replace("width = 16", "width = -16"), "model.width must be positive"),
        (lambda t: t.replace("heads = 2", "heads = 3"), "model.heads (3) must divide model.width"),
        (lambda t: t.replace('"gpt"', '"bert"'), "model.kind must be one of gpt, llama"),
        (lambda t: t.replace("seq_len = 8\n", ""), "missing required key 'model.seq_len'"),
        (lambda t: t + "vocab = 100\n", "model.vocab must be at least 256"),
        (lambda t: t + "dropout = 1.0\n", "model.dropout must be in [0, 1)"),
        (lambda t: t + "dropout = 'x'\n", "model.dropout must be a number"),
        (lambda t: t + "\n[optimizer]\nlr = 0\n", "optimizer.lr must be positive"),
        (lambda t: t + "\n[optimizer]\nbetas = [0.9]\n", "optimizer.betas must be a list of two"),
        (lambda t: t + "\n[optimizer]\nbetas = [0.9, 1.0]\n", "optimizer.betas must both be"),
        (lambda t: t + "\n[optimizer]\nweight_decay = -1\n", "weight_decay must be zero or"),
        (lambda t: t + "\n[optimizer]\neps = 0\n", "optimizer.eps must be positive"),
        (lambda t: "seed = -1\n" + t, "seed must be at least 0"),
        (lambda t: "catch_up_steps = -1\n" + t, "catch_up_steps must be at least 0"),
        (lambda t: "replay_bound = -1\n" + t, 'replay_bound must be "auto" or an integer'),
        (lambda t: 'replay_bound = "often"\n' + t, "replay_bound must be \"auto\" or an"),
        (lambda t: "replay_bound = 1.5\n" + t, "replay_bound must be \"auto\" or an"),
        (lambda t: 'grad_accum = "float16"\n' + t, "grad_accum must be one of float64, float32"),
        (lambda t: "data = 3\n" + t, "data must be a non-empty path string"),
        (lambda t: "tokenizer = 3\n" + t, "tokenizer must be a non-empty path string, got 3"),
        (lambda t: 'tokenizer = ""\n' + t, "tokenizer must be a non-empty path string"),
        (lambda t: 'data_field = ""\n' + t, "data_field must be a non-empty string"),
        (lambda t: 'data_order = "shuffled"\n' + t,
         "data_order must be one of random, sequential, got 'shuffled'"),
        (lambda t: "model = 3\n" + t.split("[model]")[0], "model must be a [model] table"),
        (lambda t: t.replace('"gpt"', '"llama"').replace("width = 16", "width = 6"), "even"),
        (lambda t: t + "= broken", "is not valid TOML"),
        (lambda t: 'aggregation = "median"\n' + t,
         "aggregation must be one of mean, trimmed-mean, centered-clip, got 'median'"),
        (lambda t: "aggregation = 2\n" + t, "aggregation must be one of mean, trimmed-mean, "
         "centered-clip or an [aggregation] table"),
        (lambda t: t + '\n[aggregation]\nrule = "trimmed-mean"\ntrim = 0.5\n',
         "aggregation.trim must be in [0, 0.5), got 0.5"),
        (lambda t: t + "\n[aggregation]\ntrim = -0.1\n", "aggregation.trim must be in [0, 0.5)"),
        (lambda t: t + "\n[aggregation]\ntrim = 'x'\n", "aggregation.trim must be a number"),
        (lambda t: t + "\n[aggregation]\nnorm_factor = 1\n", "aggregation.norm_factor must be "
         "above 1"),
        (lambda t: t + "\n[aggregation]\nnorm_factor = inf\n", "norm_factor must be a finite"),
        (lambda t: t + "\n[aggregation]\nclip_iterations = 0\n",
         "aggregation.clip_iterations must be positive"),
        (lambda t: t + "\n[aggregation]\ntau = 1\n", "unknown key 'aggregation.tau'; the keys "
         "allowed in [aggregation] are clip_iterations, norm_factor, rule, trim"),
    ],
)
def test_bad_job_file_is_one_clear_sentence(tmp_path: Path, edit: object, message: str) -> None:
    assert callable(edit)
    path = write(tmp_path, edit(MINIMAL))
    with pytest.raises(JobError) as caught:
        load_job(path)
    text = str(caught.value)
    assert message in text
    assert text.startswith(f"job file {path}")
    assert "\n" not in text


def test_missing_job_file_names_the_presets(tmp_path: Path) -> None:
    with pytest.raises(JobError, match="does not exist; give a TOML job file or a preset"):
        resolve_job(tmp_path / "nope.toml")


def test_unknown_preset_names_the_presets() -> None:
    with pytest.raises(JobError, match=r"'tiny-gtp' is neither a preset \(tiny-gpt, tiny-llama\)"):
        resolve_job("tiny-gtp")
    with pytest.raises(JobError, match="unknown preset 'huge'; presets are tiny-gpt, tiny-llama"):
        preset("huge")


def test_resolve_job_takes_presets_and_files() -> None:
    assert resolve_job("tiny-llama") is PRESETS["tiny-llama"]
    assert resolve_job(str(JOBS / "tiny-gpt.toml")) == PRESETS["tiny-gpt"]


def test_values_are_checked_when_built_in_code_too() -> None:
    model = ModelConfig(kind="gpt", layers=1, width=8, heads=2, seq_len=4)
    with pytest.raises(JobError, match="microbatch_size must be positive"):
        JobConfig(model=model, iterations=1, microbatches=1, microbatch_size=0)
    with pytest.raises(JobError, match="model.layers must be an integer"):
        dataclasses.replace(model, layers=2.0)
