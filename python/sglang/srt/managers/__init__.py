"""The engine's three processes: the tokenizer manager (with the HTTP server), the scheduler and the
detokenizer. Each module says on its first line which process runs it."""
