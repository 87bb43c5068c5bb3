"""One `TreeComponent` per kind of per-token/per-request device data a tree node can hold."""
