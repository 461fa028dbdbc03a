"""How the simulated policies route: gwtf's local solves (`localrouting`) or its relaxation
(`relaxrouting`) on simulated messages, the control plane alone to time reconvergence
(`control`), and the pure pieces of the baselines, SWARM's estimates and DT-FM's schedule
(`baselines`)."""
