"""Pure routing algorithm: topology model, cost, decentralized state machine, oracle."""
