"""Launch tooling: gcloud TPU VM script, xmanager launcher, Colab notebook, multi-host init.

A package only so tests (and `python -m rmsweb_jax.main` run from the repo root) can import
`launch.xm_job`; nothing here is installed by setup.py.
"""
