#!/bin/sh
# A worker that is not Python (--no-python): leaves a file named by its global rank in $1.
echo "creating $1/$RANK"
touch "$1/$RANK"
