"""Shipped YAML configs (installed as sparring.configs): the embedded default pipeline, a GPU
pipeline, and trainer/SFT settings."""
