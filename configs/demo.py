"""The demo: every stage built so far, on a tiny random model, in minutes on 2 CPU cores.

    python -m rmsweb_jax.main --config=configs/demo.py --workdir=/tmp/rmsweb_demo
"""
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
from common import base_config  # noqa: E402


def get_config(arg=None):
    c = base_config()
    c.stages = ("model",)
    c.model.init = "random:tiny"
    return c
