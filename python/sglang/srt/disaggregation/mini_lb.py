"""Upstream's module path of the in-tree PD load balancer: `python -m sglang.srt.disaggregation.mini_lb`
keeps working; the code lives in `sglang.srt.router.mini_lb` (a router, not a PD role)."""

from sglang.srt.router.mini_lb import *  # noqa: F401,F403
from sglang.srt.router.mini_lb import main

if __name__ == "__main__":
    main()
