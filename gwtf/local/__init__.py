"""Swarms of node processes on one machine: `gwtf launch` (`launch`), a churn trace replayed on
it (`churn`), what to start (`plan`), `gwtf demo` (`demo`), and machines with their own network
stacks for the tests and benchmarks that need real links (`netns`). They start `gwtf node`
processes and talk to them as any client does; nothing here runs inside a node."""
