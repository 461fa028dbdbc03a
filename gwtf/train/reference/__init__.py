"""The reference: the job trained in one process with no pipeline, the swarm's yardstick
(`run`: `train_reference`), and `gwtf reference`, its command (`cli`)."""

from gwtf.train.reference.run import ReferenceResult, train_reference

__all__ = ["ReferenceResult", "train_reference"]
