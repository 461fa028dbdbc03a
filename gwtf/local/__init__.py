"""Swarms of node processes on one machine: `gwtf launch` (`launch`), a churn trace replayed on
it (`churn`), what to start (`plan`) and `gwtf demo` (`demo`). They start `gwtf node` processes
and talk to them as any client does; nothing here runs inside a node."""
