"""The node's wire (docs/design.md 3.2, 3.6, 3.10): the gRPC servicers as tables (`server`), the one
table from a refusal to a status code (`edge`), protobuf to dataclasses with the checks on
everything a peer sends (`codec`), channel and server options and the interceptors (`transport`),
the emulated WAN's delays and cuts (`wan`), the token and mutual TLS (`security`), per-peer rate
limits (`ratelimit`), the one retry and ban policy (`retry`) and chunked streams (`chunks`)."""
