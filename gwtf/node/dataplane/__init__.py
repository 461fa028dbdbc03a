"""The data plane (docs/design.md 3): a microbatch's tensors to its next hop (`tensors`) and a
replica's gradient sums to its stage peers (`gradsync`), each a chunked stream checked as it
arrives."""
