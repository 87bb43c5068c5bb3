"""Internals of `UnifiedRadixCache`: the tree core and its per-component data (FULL, SWA, MAMBA)."""
