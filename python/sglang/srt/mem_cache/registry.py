"""Which prefix (tree) cache a scheduler gets: `create_tree_cache(ctx)`.

The model-dependent refusals of host-pool retraction live here, so that the server start and
`python -m sglang.check_server_args` raise the same error from the same code.
"""

from __future__ import annotations

from typing import Optional


def validate_host_pool_retraction(retraction_backup: Optional[str], is_hybrid_ssm: bool, is_pure_swa: bool) -> None:
    """Upstream's `create_unified_radix_cache` checks, in its order."""
    if retraction_backup != "host_pool":
        return
    if is_hybrid_ssm:
        raise ValueError("Host-pool retraction does not support Mamba models.")
    if is_pure_swa:
        raise ValueError("Host-pool retraction does not support pure-SWA models.")
