"""Wire protocol of gwtf, version 1: code generated from protos/gwtf/v1/*.proto by `make proto`."""
