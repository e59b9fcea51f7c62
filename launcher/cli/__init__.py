"""The command line: ``python -m launcher`` and its Paddle and torchrun spellings, turned into options."""
