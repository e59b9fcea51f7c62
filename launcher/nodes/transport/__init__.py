"""What every channel between launchers speaks: the framing, the typed messages, the job token's proofs and
sealed sessions, and one TCP connection. Knows nothing of who keeps a job."""
