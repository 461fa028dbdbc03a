"""The job coordinator with I/O (docs/design.md 1, 4): the pure bookkeeping is
`gwtf.job.iterations.IterationCoordinator`; this drives it over the wire. `coordinator`
(JobCoordinator: the commit phases, the watchdog, taking over), `recovery` (CrashRecovery: a dead
participant's work by the rules of gwtf.recovery), `entrance` (joiners and a stage that lost
every replica), `quorum` (asking silent voters where they are) and `moves` (a node moved between
stages at a step)."""
