"""One job across nodes: the control channel, its messages, the coordination, MPI gathering."""
