"""An elastic job (``--nnodes MIN:MAX``): the membership's model and pure rules, the link contract every
backend keeps with the event loop, the coordinator of rounds, and one subpackage per backend (``c10d``:
node 0 keeps the membership; ``etcd``: it is kept in etcd). A new backend is a new subpackage and its row in
``launcher.plan.elastic_backends``, which ``backends`` reads; the rules and the coordinator do not change."""
