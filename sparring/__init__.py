"""Sparring: self-play GRPO for LLM agents on multi-agent language games."""

__version__ = "0.1.0"
