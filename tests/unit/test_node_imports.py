"""A node that is told its compute time starts without torch (start-up stays fast)."""

import subprocess
import sys

CODE = """
import sys
import gwtf.cli, gwtf.client, gwtf.node.cli, gwtf.local.launch, gwtf.node.node
assert "torch" not in sys.modules, "torch was imported"
assert "grpc" in sys.modules
"""


def test_the_node_does_not_import_torch() -> None:
    result = subprocess.run(
        [sys.executable, "-c", CODE], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
