"""Structured output: grammar backends (xgrammar) and the scheduler's grammar queue (upstream `srt/constrained/`)."""
