"""What a volunteer does to set up a machine: install gwtf from a wheel built from a fresh clone,
into a fresh virtual environment, and start nodes that form a swarm and route.

The wheel must carry everything a node needs (the generated protobuf code above all: a package
without it dies at `import gwtf.v1.flow_pb2`). Its dependencies (torch, grpcio, ...) are the ones
this test runs with, made visible to the new environment by a path file, so that nothing is
downloaded; gwtf itself comes from the wheel alone (the path file adds no editable install).
"""

from __future__ import annotations

import site
import subprocess
import sys
from pathlib import Path

import pytest
from cluster import REPO, LocalSwarm, pipeline_arcs, wait_for

pytestmark = pytest.mark.integration


def run(*argv: str | Path, cwd: Path) -> str:
    done = subprocess.run([str(a) for a in argv], cwd=cwd, capture_output=True, text=True,
                          timeout=300, check=False)  # fmt: skip
    assert done.returncode == 0, (argv, done.stdout[-2000:], done.stderr[-2000:])
    return done.stdout


def test_a_wheel_from_a_fresh_clone_installs_and_its_nodes_route(tmp_path: Path) -> None:
    clone = tmp_path / "clone"
    run("git", "clone", "--quiet", REPO, clone, cwd=tmp_path)
    run(sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
        "--wheel-dir", tmp_path / "dist", clone, cwd=tmp_path)  # fmt: skip
    (wheel,) = (tmp_path / "dist").glob("gwtf-*.whl")

    venv = tmp_path / "venv"
    run(sys.executable, "-m", "venv", venv, cwd=tmp_path)
    python = venv / "bin" / "python"
    target = Path(run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])",
                      cwd=tmp_path).strip())  # fmt: skip
    (target / "dependencies.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    run(python, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", wheel, cwd=tmp_path)
    where = run(python, "-c", "import gwtf, gwtf.v1.flow_pb2; print(gwtf.__file__)", cwd=tmp_path)
    assert where.startswith(str(target)), where

    (tmp_path / "logs").mkdir()
    with LocalSwarm(tmp_path / "logs", python=str(python), cwd=tmp_path) as swarm:
        swarm.start([("p0", 0, 0.05), ("p1", 1, 0.05), ("p2", 1, 0.08)], num_stages=2)
        view = wait_for(lambda: swarm.settled({"p0", "p1", "p2"}, pipeline_arcs([1, 2])), 60,
                        "the installed nodes to route")  # fmt: skip
    assert view["flow_value_units"] > 0
