"""Tests of rmsweb_jax.processing against transformers' Qwen3-VL processing classes."""
