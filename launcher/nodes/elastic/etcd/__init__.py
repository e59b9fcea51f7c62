"""The etcd backend: the membership lives in etcd (any launcher may be lost, the first included): the
client, the keys and values, and every launcher's link."""
