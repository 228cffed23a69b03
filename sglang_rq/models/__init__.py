"""Model definitions for sglang-rq: Ouro configuration and the plain-PyTorch Ouro reference."""
