"""`gwtf export CHECKPOINT_DIR --hf OUT_DIR [--force]`: a trained model as a Hugging Face folder.

Reads what `gwtf submit --checkpoint-dir` and `gwtf reference --checkpoint-dir` write
(`DIR/model.safetensors` in gwtf names, checked against its checksum, and `DIR/job.toml`) and
writes `OUT_DIR/config.json` and `OUT_DIR/model.safetensors` that transformers'
`from_pretrained` loads (`gwtf.train.models.hf`). The job's pretrained folder is not needed: the job
file beside the checkpoint states the whole model.

Export replaces files, so it refuses, unless `--force`, an OUT_DIR that already holds anything:
the checkpoint it reads (whose `model.safetensors` it would overwrite with one in Hugging Face
names, leaving nothing to export or resume from), the pretrained folder the job started from
(whose weights it would replace), or any other folder that is not empty.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from gwtf.train.checkpoints.checkpoint import CheckpointError, load_model
from gwtf.train.job import JobConfig, JobError
from gwtf.train.models.hf import ExportError, export_hf
from gwtf.train.models.hfconfig import CONFIG_FILE

__all__ = ["check_export_folder", "run_export"]


def _same(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return a.resolve() == b.resolve()


def check_export_folder(out: Path, checkpoint: Path, job: JobConfig) -> None:
    """ExportError (one sentence) if writing into `out` would replace anything: `out` is the
    checkpoint itself, the job's pretrained folder, or another folder that is not empty."""
    if out.exists() and not out.is_dir():
        raise ExportError(f"{out} is a file; give --hf a folder to write into")
    if _same(out, checkpoint):
        raise ExportError(
            f"{out} is the checkpoint being exported: writing there would replace its "
            "model.safetensors and it could no longer be exported or resumed; give --hf another "
            "folder (or add --force)"
        )
    pretrained = job.model.pretrained
    if pretrained is not None and _same(out, Path(pretrained)):
        raise ExportError(
            f"{out} is the pretrained folder job {job.job_id} started from: writing there would "
            "replace its weights; give --hf another folder (or add --force)"
        )
    if out.is_dir():
        held = sorted(entry.name for entry in out.iterdir())
        if held:
            shown = ", ".join(held[:3]) + (f" and {len(held) - 3} more" if len(held) > 3 else "")
            raise ExportError(
                f"{out} is not empty (it holds {shown}); give --hf a new or empty folder, or add "
                "--force to write config.json and model.safetensors over what is there"
            )


def run_export(args: argparse.Namespace) -> int:
    checkpoint, out = Path(args.checkpoint), Path(args.hf)
    try:
        saved = load_model(checkpoint)
        if not args.force:
            check_export_folder(out, checkpoint, saved.job)
        folder = export_hf(saved.parameters, saved.job.model, out)
    except (CheckpointError, JobError, ExportError) as exc:
        print(f"gwtf export: {exc}", file=sys.stderr)
        return 2
    model = saved.job.model
    print(
        f"{folder}: {CONFIG_FILE} and model.safetensors, a {model.kind} of {model.layers} layers "
        f"after {saved.iteration} iterations of job {saved.job.job_id}"
    )
    return 0
