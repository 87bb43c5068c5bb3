"""Mooncake transfer backend: engine wrapper (`transfer_engine.py`) and the KV manager/sender/receiver (`conn.py`)."""
