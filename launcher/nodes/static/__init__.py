"""The control channel of a job of a fixed set of nodes: node 0's hub, every other node's spoke, the
coordinator that decides a stop, restart or end across them, and the MPI gathering of the node list."""
