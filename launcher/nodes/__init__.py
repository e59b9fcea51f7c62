"""One job across nodes: the transport (wire, messages, auth), the static channel of a fixed job, and the
elastic membership of a job whose nodes may come and go."""
