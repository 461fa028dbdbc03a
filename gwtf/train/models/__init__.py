"""The models a job trains: the built-in GPT-like and LLaMA-like transformers in plain torch
(`builtin`), and Hugging Face folders, read (`hfconfig`) and built and written back (`hf`)."""
