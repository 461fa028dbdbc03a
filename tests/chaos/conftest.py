"""The chaos tests drive the same local swarm of real node processes as the integration tests
(tests/integration/cluster.py)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))
