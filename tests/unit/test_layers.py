"""The pure cores stay pure: importing flow/, recovery/ and job/ pulls in no I/O, no torch and
none of their drivers (the import arrows point driver -> core, never back)."""

import subprocess
import sys

CODE = """
import sys
import gwtf.flow, gwtf.flow.relax.decentralized, gwtf.recovery, gwtf.job, gwtf.job.iterations
import gwtf.job.nexthop, gwtf.job.snapshots, gwtf.job.quorum
banned = ("torch", "grpc", "asyncio", "uvloop", "gwtf.node", "gwtf.sim", "gwtf.train",
          "gwtf.v1")
loaded = sorted(m for m in sys.modules if any(m == b or m.startswith(b + ".") for b in banned))
assert not loaded, loaded
"""


def test_the_pure_cores_import_no_io_and_no_driver() -> None:
    done = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True,
                          timeout=60, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
