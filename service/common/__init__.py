"""What every layer of the service shares: the error table, per-request timing, the metrics,
readiness across worker processes and the batching defaults per execution provider."""
