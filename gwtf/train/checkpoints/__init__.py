"""A trained model out and back in: the weights as safetensors (`checkpoint`), the optimizer state
and stage states to resume a job (`resume`), and `gwtf export` to a Hugging Face folder
(`export_cli`)."""
