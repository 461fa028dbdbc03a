"""gwtf: flow-based, churn-tolerant routing for decentralized pipeline training."""

__version__ = "0.1.0"
