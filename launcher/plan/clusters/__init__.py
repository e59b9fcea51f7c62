"""Where the nodes of a job come from: the command line or a scheduler's environment, one module per source (pure).

``registry.SOURCES`` lists them in the order ``--cluster_env auto`` tries them. Each source's
``detect(env, opts)`` says whether this environment comes from that scheduler, ``resolve(request)``
gives the ``Cluster`` (nodes in rank order, this node's index, its ports, the variables read),
``devices(env)`` the option defaults the scheduler sets (its GPUs, its processes per node). No I/O here:
a file a scheduler names (LSF's rank file) is read by preflight into ``HostFacts.env_files``, this
machine's name comes in ``HostFacts.hostname``, and the node list of an MPI or torchrun job, gathered over
the network (launcher.nodes.static.gather, what ``gathering`` asks for), in ``HostFacts.gathered_nodes``.
"""
