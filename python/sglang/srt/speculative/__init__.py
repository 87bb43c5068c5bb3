"""Speculative decoding: drafters (`ngram_drafter.py`), the chain verification of drafted tokens
against the target's distribution (`verify.py`) and the worker that runs it behind the worker
seam (`spec_worker.py`). The scheduler's side (which requests draft, their KV) is
`managers/spec_decode.py`."""
