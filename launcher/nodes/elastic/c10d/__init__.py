"""The c10d backend: node 0's launcher keeps the membership (``keeper``) and every other launcher links to
it over one sealed TCP connection (``member``)."""
