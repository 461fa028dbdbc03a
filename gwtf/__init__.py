"""gwtf: flow-based, churn-tolerant routing for decentralized pipeline training.

Pure cores, two thin drivers (docs/design.md, the table of packages): the routing (`flow`), the
crash rules (`recovery`) and the job protocol (`job`) are sans-I/O state machines; the real node
(`node`, over gRPC and wall time) and the simulator (`sim`, over simulated transport and time)
drive the same code. `train` is the torch side a node runs; `local` runs swarms of node
processes on one machine; `client` is what users call; `cli` parses and dispatches.
"""

__version__ = "0.1.0"
