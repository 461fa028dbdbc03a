"""`gwtf export CHECKPOINT_DIR --hf OUT_DIR`: a trained model out as a Hugging Face folder.

Reads what `gwtf submit --checkpoint-dir` and `gwtf reference --checkpoint-dir` write
(`DIR/model.safetensors` in gwtf names, checked against its checksum, and `DIR/job.toml`) and
writes `OUT_DIR/config.json` and `OUT_DIR/model.safetensors` that transformers'
`from_pretrained` loads (`gwtf.train.models.hf`). The job's pretrained folder is not needed: the job
file beside the checkpoint states the whole model.
"""

from __future__ import annotations

import argparse
import sys

from gwtf.train.checkpoints.checkpoint import CheckpointError, load_model
from gwtf.train.job import JobError
from gwtf.train.models.hf import ExportError, export_hf
from gwtf.train.models.hfconfig import CONFIG_FILE

__all__ = ["run_export"]


def run_export(args: argparse.Namespace) -> int:
    try:
        saved = load_model(args.checkpoint)
        folder = export_hf(saved.parameters, saved.job.model, args.hf)
    except (CheckpointError, JobError, ExportError) as exc:
        print(f"gwtf export: {exc}", file=sys.stderr)
        return 2
    model = saved.job.model
    print(
        f"{folder}: {CONFIG_FILE} and model.safetensors, a {model.kind} of {model.layers} layers "
        f"after {saved.iteration} iterations of job {saved.job.job_id}"
    )
    return 0
