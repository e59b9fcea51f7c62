"""``launcher tune`` on nodes started on their own: the link between the leading tuner, which chooses each trial and
measures it, and the tuners of the other nodes, which run each trial's part there and send its reports back."""
