"""Output parsers (upstream `sglang.srt.parser`): `reasoning_parser.ReasoningParser`."""
