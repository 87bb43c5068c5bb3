"""The request type every process-side component shares: `Req` and its finish reasons.

Nothing here imports the scheduler, the caches or the PD code; they import it."""
