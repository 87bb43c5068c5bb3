"""Routers that sit in front of servers: `mini_lb.py`, the in-tree PD load balancer (the
production router is the `sglang-router` package)."""
