"""A program to try `launcher tune` on (docs/tuning.md), with no model: each step sleeps as a model's step would take,
10 ms plus 0.2 ms a sample, so that a bigger batch costs less per sample. It reports its steps and the samples seen so
far, which is all the tuner needs:

    python -m launcher tune --space examples/tune_space.yaml --nproc_per_node 1 examples/tune_demo.py
"""
import argparse
import time

from launcher.runtime import report

parser = argparse.ArgumentParser()
parser.add_argument("--batch-size", type=int, default=16)
parser.add_argument("--steps", type=int, default=200)
args = parser.parse_args()

for step in range(args.steps):
    time.sleep(0.010 + 0.0002 * args.batch_size)  # the step's work
    report(step=step, samples=args.batch_size * (step + 1))
